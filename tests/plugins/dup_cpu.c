/*
 * dup_cpu.c — a test plugin that claims the name of the real CPU plugin, "ember-cpu". Loaded
 * after the real one it must be refused as a duplicate without its register function being
 * called; if it is called anyway, registration fails loudly.
 */
#include <ember/ember.h>

static em_status dup_cpu_register(em_registry *r) {
    (void)r;
    return em_set_error(EM_ERR_INTERNAL, "dup_cpu: the core registered a second plugin named "
                        "'ember-cpu'");
}

static const em_plugin_descriptor dup_cpu_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-cpu",
    .version = "0.0.1",
    .description = "test plugin that duplicates the CPU plugin's name",
    .register_fn = dup_cpu_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &dup_cpu_plugin; }
