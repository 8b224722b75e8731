/*
 * bad_dep.c — a valid test plugin that depends on libember_test_gone.so, which is absent at
 * load time: dlopen() fails ("libember_test_gone.so: cannot open shared object file") and the
 * core must keep that full message as the refusal reason.
 */
#include <ember/ember.h>

/* From libember_test_gone.so (tests/plugins/gone.c). */
int ember_test_gone_answer(void);

static em_status bad_dep_register(em_registry *r) {
    (void)r;
    if (ember_test_gone_answer() != 42)
        return em_set_error(EM_ERR_PLUGIN, "bad_dep: libember_test_gone.so misbehaves");
    return EM_OK;
}

static const em_plugin_descriptor bad_dep_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-test-bad-dep",
    .version = "0.0.1",
    .description = "test plugin whose dependency is missing",
    .register_fn = bad_dep_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &bad_dep_plugin; }
