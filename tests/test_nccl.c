/*
 * test_nccl.c — the "nccl" communicator (plugins/dist-nccl, ember-nccl.so) where there is no
 * GPU (this machine, CI): the plugin loads and registers its class without loading NCCL; a
 * communicator loads the real libnccl.so.2 (every function the plugin uses resolved, its
 * version read), then is refused for want of a CUDA device with the cuda type's own reason; a
 * library that cannot be loaded, or is not NCCL, is refused naming it; and the class refuses
 * CPU tensors before it looks at anything else. What needs a GPU (a world-size-1 allreduce
 * through NCCL) is tests/gpu/run.sh's `nccl` suite.
 *
 * The reference for NCCL's version is the library itself, dlopen()ed here (configure's
 * NCCL_LIBDIR) and asked with ncclGetVersion.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "common.h"

#define NCCL_LIB EM_TEST_NCCL_LIBDIR "/libnccl.so.2"

TestSuite(nccl);

static void setup(void) {
    setenv("EMBER_NCCL_LIBRARY", NCCL_LIB, 1);
    em_test_setup();
}

/* Whether this process has mapped a file whose name holds `what`. */
static bool mapped(const char *what) {
    FILE *f = fopen("/proc/self/maps", "r");
    cr_assert(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

static const char *nccl_describe(void) {
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        if (em_plugin_get(i, &info) == EM_OK && info.name && !strcmp(info.name, "ember-nccl")) {
            cr_assert_eq(info.status, EM_PLUGIN_LOADED, "%s", info.reason ? info.reason : "");
            return em_plugin_describe(i);
        }
    }
    cr_assert_fail("plugin ember-nccl was not found (is it built?)");
    return NULL;
}

Test(nccl, registers_its_class_without_loading_nccl, .init = setup,
     .fini = em_test_teardown) {
    const em_comm_class *c = em_class_find(EM_COMM_KIND, "nccl");
    cr_assert(c, "no nccl communicator class: %s", em_last_error());
    cr_assert(c->description && strstr(c->description, "CUDA"), "%s", c->description);
    const char *d = nccl_describe();
    cr_assert(d && strstr(d, "NCCL not loaded"), "describe: %s", d ? d : "(null)");
    cr_assert(!mapped("libnccl"), "em_init mapped libnccl");
}

Test(nccl, refuses_a_missing_device_after_loading_nccl, .init = setup,
     .fini = em_test_teardown) {
    cr_assert_eq(em_device_count("cuda"), 0, "this test is for a machine without a GPU");
    const char *why = em_device_count_reason("cuda");
    cr_assert(why, "the cuda type gives no reason for its 0 devices (is ember-cuda built?)");
    /* the reference: NCCL's own version, from the library */
    void *h = dlopen(NCCL_LIB, RTLD_NOW | RTLD_LOCAL);
    cr_assert(h, "dlopen %s: %s", NCCL_LIB, dlerror());
    int (*get_version)(int *);
    *(void **)&get_version = dlsym(h, "ncclGetVersion");
    int v = 0;
    cr_assert(get_version && get_version(&v) == 0 && v > 0);
    char ver[32];
    snprintf(ver, sizeof ver, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);

    em_comm *c = em_comm_new("nccl", NULL);
    cr_assert_null(c);
    cr_assert_eq(em_last_status(), EM_ERR_DEVICE, "%s", em_last_error());
    const char *m = em_last_error();
    cr_assert(strstr(m, "comm_new: nccl") && strstr(m, "no CUDA device"), "%s", m);
    cr_assert(strstr(m, why), "'%s' lacks the cuda type's reason '%s'", m, why);
    cr_assert(strstr(m, ver), "'%s' does not name %s", m, ver);
    /* every function the plugin uses resolved: it says NCCL is loaded, from that file */
    const char *d = nccl_describe();
    cr_assert(d && strstr(d, ver) && strstr(d, "libnccl.so.2"), "describe: %s", d ? d : "(null)");
    cr_assert(mapped("libnccl"));
    dlclose(h);
}

Test(nccl, refuses_a_library_it_cannot_load_or_that_is_not_nccl) {
    setenv("EMBER_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
    em_test_setup();
    cr_assert_null(em_comm_new("nccl", NULL));
    cr_assert_eq(em_last_status(), EM_ERR_PLUGIN);
    const char *m = em_last_error();
    cr_assert(strstr(m, "cannot load NCCL (/nonexistent/libnccl.so.2, from EMBER_NCCL_LIBRARY)") &&
              strstr(m, "No such file"), "%s", m);
    em_test_assert_clean_shutdown();

    setenv("EMBER_NCCL_LIBRARY", "libm.so.6", 1);
    em_test_setup();
    cr_assert_null(em_comm_new("nccl", NULL));
    m = em_last_error();
    cr_assert(strstr(m, "libm.so.6 has no ncclGetVersion: not NCCL 2"), "%s", m);
    em_test_assert_clean_shutdown();
}

/* No communicator can exist here, so the class's start is called as the core calls it, with
 * no state: a CPU buffer is refused first, before the state is looked at. */
Test(nccl, refuses_cpu_tensors, .init = setup, .fini = em_test_teardown) {
    const em_comm_class *c = em_class_find(EM_COMM_KIND, "nccl");
    cr_assert(c);
    float x[4] = {1, 2, 3, 4};
    em_comm_buf b = {.struct_size = sizeof b, .data = x, .numel = 4, .dtype = EM_F32,
                     .device = em_cpu()};
    const em_collective colls[] = {EM_COLL_ALLREDUCE, EM_COLL_BROADCAST, EM_COLL_ALLGATHER,
                                   EM_COLL_REDUCE_SCATTER};
    for (size_t i = 0; i < sizeof colls / sizeof *colls; i++) {
        void *req = NULL;
        cr_assert_eq(c->start(NULL, colls[i], 7, &b, &b, 0, &req), EM_ERR_DEVICE);
        cr_assert_null(req);
        char want[96];
        snprintf(want, sizeof want, "%s #7: the nccl communicator takes tensors on CUDA devices "
                 "only; this one is on cpu (", em_collective_name(colls[i]));
        cr_assert(strstr(em_last_error(), want), "'%s' lacks '%s'", em_last_error(), want);
    }
}
