/*
 * needs_1_1.c — "ember-needs-1.1": a plugin that calls em_stream_current, a symbol of the
 * EMBER_1.1 node of core/libember.map. The linker records that it needs EMBER_1.1, so a
 * libember whose map stops at EMBER_1.0 (tests/abi/core-1.0/, built from the same objects)
 * must be refused by the dynamic linker, which ember-info then shows (tests/test_abi.c).
 */
#include <ember/ember.h>

static em_status reg(em_registry *r) {
    (void)r;
    (void)em_stream_current(em_cpu()); /* the EMBER_1.1 call */
    return EM_OK;
}

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR, .name = "ember-needs-1.1",
    .version = "1.1", .description = "calls em_stream_current (EMBER_1.1)", .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }
