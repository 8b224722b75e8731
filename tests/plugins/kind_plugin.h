/*
 * kind_plugin.h — the "codec" class kind that tests/plugins/kind_plugin.c declares: the
 * record its classes fill, shared by the plugin and tests/test_plugin.c (which registers a
 * transform of its own into the kind). Not installed.
 */
#ifndef EMBER_TEST_KIND_PLUGIN_H
#define EMBER_TEST_KIND_PLUGIN_H

#include <ember/ember.h>

/* A transform class: em_class_head's three fields, then the kind's own. apply is required
 * (min_record_size ends with it); inverse was "added later" and may be NULL. */
typedef struct test_transform_class {
    size_t struct_size;
    const char *name;
    const char *description;
    /* y = f(x), a new reference (x: any shape; y: x's shape). */
    em_tensor *(*apply)(const em_tensor *x);
    /* (optional) x = f^-1(y); NULL: not invertible. */
    em_tensor *(*inverse)(const em_tensor *y);
    void *ext;
} test_transform_class;

#define TEST_TRANSFORM_KIND "codec"

#endif
