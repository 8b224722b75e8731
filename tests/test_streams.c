/*
 * test_streams.c — streams and the stream-aware caching allocator, on the asynchronous test
 * device (tests/plugins/testdev.c: a lazy worker thread per stream, so work runs only when
 * something waits for it, as late as the ordering rules allow, the same way every run).
 *
 * What is proven: a block freed while stream A's work on it is pending is not handed to
 * stream B; em_tensor_record_stream delays reuse until the other stream's work is done;
 * copies between streams are ordered by events; the DataLoader's pinned buffers and
 * side-stream copies give the right batches when every copy really runs later.
 */
#define _GNU_SOURCE /* setenv */
#include <dlfcn.h>
#include <stdio.h>

#include "common.h"

#define N 256 /* float32 elements: 1 KiB, a small block */

static size_t (*td_pending)(int index, const em_stream *s);
static em_device D0, D1;

static void setup(void) {
    const char *dir = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(dir, "EMBER_TEST_PLUGIN_DIR is not set (run through make check)");
    char path[4096];
    snprintf(path, sizeof path, "%s/testdev.so", dir);
    setenv("EMBER_PLUGIN_PATH", path, 1);
    em_test_setup();
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    cr_assert(h, "testdev is not loaded: %s", dlerror());
    td_pending = (size_t (*)(int, const em_stream *))dlsym(h, "ember_testdev_pending");
    cr_assert(td_pending, "ember_testdev_pending: %s", dlerror());
    dlclose(h); /* the library still holds it */
    cr_assert_eq(em_device_parse("testdev:0", &D0), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_device_parse("testdev:1", &D1), EM_OK, "%s", em_last_error());
}

static void teardown(void) {
    em_test_teardown();
    unsetenv("EMBER_PLUGIN_PATH");
}

TestSuite(streams, .init = setup, .fini = teardown);

static em_stream *stream_new(em_device d) {
    em_stream *s = NULL;
    cr_assert_eq(em_stream_create(d, &s), EM_OK, "%s", em_last_error());
    cr_assert(s);
    return s;
}

static void set_current(em_device d, em_stream *s) {
    cr_assert_eq(em_stream_set_current(d, s), EM_OK, "%s", em_last_error());
}

static em_tensor *full(em_device d, double v) {
    int64_t n = N;
    em_tensor *t = em_full(1, &n, v, EM_F32, d);
    cr_assert(t, "%s", em_last_error());
    return t;
}

/* Every element of t (read on the calling thread's current stream) equals v. */
static void assert_all(const em_tensor *t, float v, const char *why) {
    float buf[N];
    cr_assert_eq(em_tensor_to_host(t, buf, sizeof buf), EM_OK, "%s", em_last_error());
    for (int i = 0; i < N; i++)
        cr_assert_eq(buf[i], v, "element %d is %g, not %g: %s", i, buf[i], v, why);
}

/* ---- 1. a block freed while stream A's work is pending is not handed to stream B ------- */

Test(streams, freed_block_not_handed_to_another_stream) {
    em_stream *a = stream_new(D0), *b = stream_new(D0);
    set_current(D0, a);
    em_tensor *x = full(D0, 7.0), *zero = full(D0, 0.0);
    cr_assert_eq(em_stream_synchronize(D0, a), EM_OK);
    em_tensor *y = em_add(x, zero); /* on A: reads x, later */
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(td_pending(0, a), 1, "A's read of x is pending");
    em_tensor_release(x); /* freed while A's read of it is pending */
    set_current(D0, b);
    em_tensor *z = full(D0, 3.0); /* allocated and written on B */
    cr_assert_eq(em_stream_synchronize(D0, b), EM_OK);
    cr_assert_eq(td_pending(0, a), 1, "A's read of x is still pending after B's write ran");
    set_current(D0, a);
    assert_all(y, 7.0f, "the block freed while A read it went to stream B, which overwrote it");
    set_current(D0, NULL);
    em_tensor_release(y);
    em_tensor_release(z);
    em_tensor_release(zero);
    em_stream_free(D0, a);
    em_stream_free(D0, b);
}
