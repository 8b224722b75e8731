/*
 * test_abi.c — the plugin ABI across releases (issue 17, item 5):
 *   - tests/abi/abi_v10.so, built against the frozen Ember 1.0 headers (tests/abi/v1.0/), loads
 *     into this core and its op, kernel, backward (through the 1.0 EM_SAVE_INPUT) and layer
 *     class run unchanged, checked against plain loops;
 *     Its dataset class (the 1.0 em_dataset_class_def) opens and batches through the 1.1
 *     field loader (issue 19);
 *   - tests/abi/needs_1_1.so calls em_stream_current (node EMBER_1.1 of core/libember.map): this
 *     core loads it, and a libember whose map stops at EMBER_1.0 (tests/abi/core-1.0/, the same
 *     objects relinked) has it refused by the dynamic linker, with ember-info showing the
 *     linker's message naming the version.
 */
#define _GNU_SOURCE /* setenv */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

#define ABI10_SO EM_TEST_ABI_DIR "/abi_v10.so"
#define NEEDS11_SO EM_TEST_ABI_DIR "/needs_1_1.so"

static void abi_setup(void) {
    setenv("EMBER_PLUGIN_PATH", ABI10_SO, 1); /* the build tree's plugins are found too */
    cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error());
}

static void abi_teardown(void) {
    em_shutdown();
    unsetenv("EMBER_PLUGIN_PATH");
}

TestSuite(abi, .init = abi_setup, .fini = abi_teardown);

static em_plugin_info plugin_named(const char *name) {
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info p;
        cr_assert_eq(em_plugin_get(i, &p), EM_OK);
        if (p.name && strcmp(p.name, name) == 0) return p;
    }
    cr_assert_fail("no plugin named %s", name);
    return (em_plugin_info){0};
}

static void read3(const em_tensor *t, float *v) {
    cr_assert_not_null(t, "%s", em_last_error());
    cr_assert_eq(em_tensor_numel(t), 3);
    cr_assert_eq(em_tensor_to_host(t, v, 3 * sizeof *v), EM_OK, "%s", em_last_error());
}

Test(abi, a_plugin_built_against_the_1_0_headers_runs_unchanged) {
    em_plugin_info p = plugin_named("ember-abi-v1.0");
    cr_assert_eq(p.status, EM_PLUGIN_LOADED, "refused: %s", p.reason ? p.reason : "");

    /* Its structs have the 1.0 sizes; a struct only grows, so none is larger than this core's. */
    void *h = dlopen(ABI10_SO, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(h, "%s", dlerror());
    void (*sizes)(size_t *);
    *(void **)&sizes = dlsym(h, "abi10_struct_sizes");
    cr_assert_not_null(sizes);
    size_t old[8];
    sizes(old);
    const size_t now[6] = {sizeof(em_plugin_descriptor), sizeof(em_op_schema),
                           sizeof(em_kernel_def), sizeof(em_kernel_ctx),
                           sizeof(em_backward_ctx), sizeof(em_module_class)};
    static const char *const what[6] = {"em_plugin_descriptor", "em_op_schema", "em_kernel_def",
                                        "em_kernel_ctx", "em_backward_ctx", "em_module_class"};
    for (int i = 0; i < 6; i++)
        cr_assert_leq(old[i], now[i], "%s: 1.0 size %zu, now %zu", what[i], old[i], now[i]);
    cr_assert_eq(old[6], 1u, "the 1.0 EM_SAVE_INPUT(0)");
    cr_assert_eq(old[7], 1u << 8, "the 1.0 EM_SAVE_OUTPUT(0)");
    dlclose(h);

    /* The op and its kernel: y = x * x. */
    cr_assert_eq(em_registry_kernel_count(p.registry), 1);
    em_kernel_info ki;
    cr_assert_eq(em_registry_kernel_get(p.registry, 0, &ki), EM_OK);
    cr_assert_str_eq(ki.name, "abi10_square_cpu_f32");
    em_scope_begin();
    const float xv[3] = {1.5f, -2, 3};
    int64_t n = 3;
    em_tensor *x = em_from_data(xv, 1, &n, EM_F32, em_cpu());
    cr_assert_eq(em_requires_grad_(x, true), EM_OK);
    const em_op *sq = em_op_find("abi10.square");
    cr_assert_not_null(sq, "%s", em_last_error());
    em_tensor *y = NULL;
    const em_tensor *in = x;
    cr_assert_eq(em_op_call(sq, &in, 1, NULL, &y), EM_OK, "%s", em_last_error());
    float v[3];
    read3(y, v);
    for (int i = 0; i < 3; i++) cr_assert_eq(v[i], xv[i] * xv[i]);

    /* Its backward, through the input EM_SAVE_INPUT(0) saved: d sum(x^2) / dx = 2x. */
    cr_assert_eq(em_backward(em_sum(y, 0, NULL, false)), EM_OK, "%s", em_last_error());
    read3(em_tensor_grad(x), v);
    for (int i = 0; i < 3; i++) cr_assert_eq(v[i], 2 * xv[i]);

    /* Its layer class by name: y = x^2 * scale (scale 0.5); d sum(y) / d scale = x^2, and
     * d sum(y) / dx = x. */
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_int(o, "features", 3), EM_OK);
    em_module *m = em_module_new("abi10.ScaledSquare", o);
    em_options_free(o);
    cr_assert_not_null(m, "%s", em_last_error());
    em_tensor *x2 = em_from_data(xv, 1, &n, EM_F32, em_cpu());
    cr_assert_eq(em_requires_grad_(x2, true), EM_OK);
    em_tensor *out = em_module_forward(m, x2);
    read3(out, v);
    for (int i = 0; i < 3; i++) cr_assert_eq(v[i], 0.5f * xv[i] * xv[i]);
    cr_assert_eq(em_backward(em_sum(out, 0, NULL, false)), EM_OK, "%s", em_last_error());
    read3(em_tensor_grad(em_module_parameter(m, "scale")), v);
    for (int i = 0; i < 3; i++) cr_assert_eq(v[i], xv[i] * xv[i]);
    read3(em_tensor_grad(x2), v);
    for (int i = 0; i < 3; i++) cr_assert_eq(v[i], xv[i]);
    em_scope_end();
    em_module_free(m);
}

/* The 1.0 plugin's dataset class (the 1.0 em_dataset_class_def, smaller than this core's)
 * opens and batches unchanged: its items are the fields "input" and "target", through
 * em_loader_next and em_loader_next_v2 alike, with 0 and 2 workers. */
Test(abi, a_dataset_class_built_against_the_1_0_headers_batches_unchanged) {
    void *h = dlopen(ABI10_SO, RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(h, "%s", dlerror());
    void (*sizes)(size_t *);
    *(void **)&sizes = dlsym(h, "abi10_data_sizes");
    cr_assert_not_null(sizes);
    size_t old[2];
    sizes(old);
    dlclose(h);
    cr_assert_lt(old[0], sizeof(em_dataset_class_def), "the 1.0 record is the shorter one");
    cr_assert_lt(old[1], sizeof(em_loader_options));
    em_dataset *ds = em_dataset_open("abi10-ramp", NULL);
    cr_assert_not_null(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(ds), 7);
    cr_assert_eq(em_dataset_field_count(ds), 2);
    cr_assert_str_eq(em_dataset_field(ds, 0)->name, "input");
    cr_assert_str_eq(em_dataset_field(ds, 1)->name, "target");
    cr_assert_eq(em_dataset_field(ds, 1)->num_classes, 3);
    for (int w = 0; w <= 2; w += 2) {
        em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = 4, .num_workers = w};
        em_loader *l = em_loader_new_v2(ds, &o);
        cr_assert_not_null(l, "%s", em_last_error());
        int64_t at = 0;
        for (int b = 0; b < 2; b++) {
            const em_batch *bt = NULL;
            em_tensor *x = NULL, *y = NULL;
            if (b == 0) {
                cr_assert_eq(em_loader_next_v2(l, &bt), EM_OK, "%s", em_last_error());
                x = em_batch_field(bt, "input");
                y = em_batch_field(bt, "target");
            } else {
                cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
            }
            cr_assert(x && y);
            int64_t n = em_tensor_size(x, 0);
            cr_assert_eq(n, b == 0 ? 4 : 3);
            const float *px = em_tensor_data(x);
            const int64_t *py = em_tensor_data(y);
            for (int64_t j = 0; j < n; j++, at++) {
                cr_assert_eq(px[2 * j], (float)at);
                cr_assert_eq(px[2 * j + 1], (float)(2 * at));
                cr_assert_eq(py[j], at % 3);
            }
        }
        const em_batch *end = (const em_batch *)1;
        cr_assert_eq(em_loader_next_v2(l, &end), EM_OK);
        cr_assert_null(end, "the end-of-epoch mark");
        em_loader_free(l);
    }
    em_dataset_free(ds);
}

/* The real binary behind the libtool wrapper (which would put the build's libember first). */
static const char *ember_info_binary(void) {
    static char path[4096];
    const char *tools = getenv("EMBER_TEST_TOOLS_DIR");
    cr_assert(tools && *tools, "EMBER_TEST_TOOLS_DIR is not set (run through `make check`)");
    static const char *const names[] = {"ember-info", "lt-ember-info"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/.libs/%s", tools, names[i]);
        if (access(path, X_OK) == 0) return path;
    }
    snprintf(path, sizeof path, "%s/ember-info", tools); /* not built with a wrapper */
    return path;
}

/* ember-info's report on needs_1_1.so with the libember in lib_dir (NULL: the build's). */
static char *ember_info_on(const char *lib_dir) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s%s%s EMBER_PLUGIN_PATH='%s' '%s' 2>/dev/null",
             lib_dir ? "LD_LIBRARY_PATH='" : "", lib_dir ? lib_dir : "", lib_dir ? "'" : "",
             NEEDS11_SO, lib_dir ? ember_info_binary() : "");
    if (!lib_dir) /* through the wrapper: the build's own libember */
        snprintf(cmd, sizeof cmd, "EMBER_PLUGIN_PATH='%s' '%s/ember-info' 2>/dev/null",
                 NEEDS11_SO, getenv("EMBER_TEST_TOOLS_DIR"));
    return em_test_run(cmd, NULL);
}

/* The report's entry for needs_1_1.so: its line (status, name, path) and the next two
 * (description, reason). */
static void entry_of(const char *out, char *buf, size_t cap) {
    const char *at = strstr(out, "/needs_1_1.so\n");
    cr_assert_not_null(at, "needs_1_1.so is not in the report:\n%s", out);
    while (at > out && at[-1] != '\n') at--;
    const char *end = at;
    for (int lines = 0; lines < 3 && end && *end; lines++) {
        end = strchr(end, '\n');
        if (end) end++;
    }
    size_t n = end ? (size_t)(end - at) : strlen(at);
    snprintf(buf, cap, "%.*s", (int)n, at);
}

Test(abi, a_plugin_needing_1_1_is_refused_by_a_1_0_core_and_ember_info_says_why) {
    /* This core has EMBER_1.1: the plugin loads. */
    cr_assert_eq(em_plugin_load(NEEDS11_SO), EM_OK, "%s", em_last_error());
    cr_assert_eq(plugin_named("ember-needs-1.1").status, EM_PLUGIN_LOADED);
    char entry[2048];
    char *out = ember_info_on(NULL);
    entry_of(out, entry, sizeof entry);
    cr_assert(strstr(entry, "loaded"), "on this core:\n%s", entry);
    free(out);

    /* A core whose map stops at EMBER_1.0: the dynamic linker refuses it, and says why. */
    out = ember_info_on(EM_TEST_CORE10);
    entry_of(out, entry, sizeof entry);
    cr_assert(strstr(entry, "refused"), "on the 1.0 core:\n%s", entry);
    cr_assert(strstr(entry, "cannot be loaded:"), "%s", entry);
    cr_assert(strstr(entry, "version `EMBER_1.1' not found"), "no linker message naming the "
              "version in:\n%s", entry);
    cr_assert(strstr(entry, "needs_1_1.so)"), "the message names the plugin:\n%s", entry);
    /* and the doctor, run on that older core, still lists its class kinds */
    cr_assert(strstr(out, "class kinds (4), through the 1.0 calls of a libember without "
                     "EMBER_1.1:"), "%s", out);
    cr_assert(strstr(out, "  module       "), "%s", out);
    free(out);
}
