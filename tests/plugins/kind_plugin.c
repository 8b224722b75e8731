/*
 * kind_plugin.c — "ember-testkind" (built for `make check`, never installed): declares a class
 * kind the core does not know, "codec" (record: kind_plugin.h), and registers two classes
 * into it, "negate" (invertible) and "double" — what a transform, communicator or exporter
 * plugin does, with no core edit.
 */
#include <stddef.h>

#include <ember/ember.h>

#include "kind_plugin.h"

static em_tensor *negate(const em_tensor *x) { return em_neg(x); }
static em_tensor *twice(const em_tensor *x) { return em_mul_scalar(x, 2.0); }

/* The kind's own check: every codec applies something. */
static em_status check_transform(const void *record, const char *who) {
    const test_transform_class *c = record;
    if (!c->apply)
        return em_set_error(EM_ERR_INVALID, "%s: codec class '%s' has no apply function",
                            who, c->name);
    return EM_OK;
}

static const test_transform_class negate_class = {
    .struct_size = sizeof negate_class, .name = "negate", .description = "y = -x",
    .apply = negate, .inverse = negate,
};
static const test_transform_class double_class = {
    .struct_size = sizeof double_class, .name = "double", .description = "y = 2x",
    .apply = twice,
};

static em_status reg(em_registry *r) {
    const em_class_kind_def kind = {
        .struct_size = sizeof kind, .name = TEST_TRANSFORM_KIND,
        .description = "test transforms (tests/plugins/kind_plugin.h)",
        .record_size = sizeof(test_transform_class),
        .min_record_size = offsetof(test_transform_class, apply) + sizeof(void (*)(void)),
        .check = check_transform,
    };
    em_status st = em_class_kind_register(r, &kind);
    if (st == EM_OK) st = em_class_register(r, TEST_TRANSFORM_KIND, &negate_class);
    if (st == EM_OK) st = em_class_register(r, TEST_TRANSFORM_KIND, &double_class);
    return st;
}

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR, .name = "ember-testkind",
    .version = "1.0", .description = "declares the class kind 'codec'", .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }
