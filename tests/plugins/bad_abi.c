/*
 * bad_abi.c — a test plugin built for a plugin ABI the core does not implement
 * (EM_PLUGIN_ABI_MAJOR + 1). The core must refuse it without calling its register function.
 */
#include <ember/ember.h>

static em_status bad_abi_register(em_registry *r) {
    (void)r;
    return em_set_error(EM_ERR_INTERNAL, "bad_abi: the core called the register function of a "
                        "plugin built for another ABI");
}

static const em_plugin_descriptor bad_abi_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR + 1,
    .name = "ember-test-bad-abi",
    .version = "0.0.1",
    .description = "test plugin built for the next plugin ABI",
    .register_fn = bad_abi_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &bad_abi_plugin; }
