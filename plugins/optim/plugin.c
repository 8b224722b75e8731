/*
 * plugin.c — ember-optim.so: the optimizer and scheduler classes (optimizers.c,
 * schedulers.c), registered by name into the core's class registries (ember/optim.h).
 */
#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/plugin.h"
#include "ember/version.h"
#include "optim_plugin.h"

static em_status optim_register(em_registry *reg) {
    em_status st = optim_plugin_register_optimizers(reg);
    return st == EM_OK ? optim_plugin_register_schedulers(reg) : st;
}

static const em_plugin_descriptor optim_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-optim",
    .version = EM_VERSION_STRING,
    .description = "optimizers (SGD, Adam, AdamW, RMSprop, Adagrad) and lr schedulers",
    .register_fn = optim_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &optim_plugin; }
