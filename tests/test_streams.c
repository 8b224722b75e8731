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
#include <stdatomic.h>
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

/* ---- 2. em_tensor_record_stream delays reuse until the other stream's work is done ------ */

/* x made on A, read on B after an event; released on A's side. Returns B's result. */
static em_tensor *read_on_b(em_stream *a, em_stream *b, bool record, void **xptr) {
    set_current(D0, a);
    em_tensor *x = full(D0, 5.0);
    em_event *e = NULL;
    cr_assert_eq(em_event_create(D0, &e), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_event_record(D0, e, a), EM_OK, "%s", em_last_error());
    set_current(D0, b);
    cr_assert_eq(em_event_wait(D0, b, e), EM_OK, "%s", em_last_error());
    em_event_free(D0, e);
    em_tensor *zero = full(D0, 0.0);
    em_tensor *y = em_add(x, zero); /* on B: reads x, later */
    cr_assert(y, "%s", em_last_error());
    em_tensor_release(zero);
    if (record) cr_assert_eq(em_tensor_record_stream(x, b), EM_OK, "%s", em_last_error());
    *xptr = em_tensor_data(x);
    set_current(D0, a);
    em_tensor_release(x);
    cr_assert_geq(td_pending(0, b), 1, "B's read of x is pending");
    return y;
}

Test(streams, record_stream_delays_reuse_until_the_other_stream_is_done) {
    em_stream *a = stream_new(D0), *b = stream_new(D0);
    void *xptr;
    em_tensor *y = read_on_b(a, b, true, &xptr);
    em_tensor *z = full(D0, 9.0); /* on A, while B's read of x is pending */
    cr_assert_neq(em_tensor_data(z), xptr, "x's block went back to A while B used it");
    cr_assert_eq(em_stream_synchronize(D0, a), EM_OK);
    set_current(D0, b);
    assert_all(y, 5.0f, "B read x after A reused its block");
    /* B is done: the block is A's again, from the cache. */
    em_memory_stats s0, s1;
    cr_assert_eq(em_memory_stats_get(D0, &s0), EM_OK);
    set_current(D0, a);
    em_tensor *w = full(D0, 1.0);
    cr_assert_eq(em_memory_stats_get(D0, &s1), EM_OK);
    cr_assert_eq(em_tensor_data(w), xptr, "x's block is reused once B's event completed");
    cr_assert_eq(s1.device_allocs, s0.device_allocs);
    set_current(D0, NULL);
    em_tensor_release(w);
    em_tensor_release(z);
    em_tensor_release(y);
    em_stream_free(D0, a);
    em_stream_free(D0, b);
}

/* The same without record_stream: the block goes straight back to A, and A's next tensor
 * overwrites what B had not read yet. This is what record_stream is for (and it shows that
 * the device really runs B's work late). */
Test(streams, without_record_stream_the_other_stream_reads_reused_memory) {
    em_stream *a = stream_new(D0), *b = stream_new(D0);
    void *xptr;
    em_tensor *y = read_on_b(a, b, false, &xptr);
    em_tensor *z = full(D0, 9.0);
    cr_assert_eq(em_tensor_data(z), xptr, "A reuses its own stream's block at once");
    cr_assert_eq(em_stream_synchronize(D0, a), EM_OK);
    set_current(D0, b);
    assert_all(y, 9.0f, "B's late read sees A's reuse");
    set_current(D0, NULL);
    em_tensor_release(z);
    em_tensor_release(y);
    em_stream_free(D0, a);
    em_stream_free(D0, b);
}

/* A block that waits for events counts as cached; emptying the cache waits for its events
 * (so the work on it runs first) and returns it to the device. */
Test(streams, waiting_blocks_are_cached_and_emptied_after_their_events) {
    em_stream *a = stream_new(D0), *b = stream_new(D0);
    em_memory_stats s0, s1, s2;
    cr_assert_eq(em_memory_stats_get(D0, &s0), EM_OK);
    void *xptr;
    em_tensor *y = read_on_b(a, b, true, &xptr);
    cr_assert_eq(em_memory_stats_get(D0, &s1), EM_OK);
    size_t sum = 0;
    for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++) sum += s1.current[c];
    cr_assert_eq(sum, s1.reserved, "reserved == everything in use + cached");
    cr_assert_eq(s1.current[EM_MEM_CACHED], s0.current[EM_MEM_CACHED] + 2 * 1024,
                 "x (waiting for B) and B's zeros are cached");
    em_empty_cache();
    cr_assert_eq(em_memory_stats_get(D0, &s2), EM_OK);
    cr_assert_eq(s2.current[EM_MEM_CACHED], 0);
    cr_assert_eq(s2.reserved, s2.current[EM_MEM_ACTIVATION], "only y is left");
    cr_assert_eq(td_pending(0, b), 0, "freeing x's block waited for B's read of it");
    set_current(D0, b);
    assert_all(y, 5.0f, "B read x before its block went back to the device");
    set_current(D0, NULL);
    em_tensor_release(y);
    em_stream_free(D0, a);
    em_stream_free(D0, b);
}

/* A freed stream's cache serves the default stream (its work is done first). */
Test(streams, freed_streams_cache_goes_to_the_default_stream) {
    em_stream *a = stream_new(D0);
    set_current(D0, a);
    em_tensor *x = full(D0, 1.0);
    void *xptr = em_tensor_data(x);
    em_tensor_release(x); /* A's fill of it is still pending */
    set_current(D0, NULL);
    em_tensor *other = full(D0, 2.0);
    cr_assert_neq(em_tensor_data(other), xptr, "the default stream does not take A's block");
    em_stream_free(D0, a);
    em_memory_stats s0, s1;
    cr_assert_eq(em_memory_stats_get(D0, &s0), EM_OK);
    em_tensor *y = full(D0, 3.0);
    cr_assert_eq(em_memory_stats_get(D0, &s1), EM_OK);
    cr_assert_eq(em_tensor_data(y), xptr);
    cr_assert_eq(s1.cache_hits, s0.cache_hits + 1);
    cr_assert_eq(s1.device_allocs, s0.device_allocs);
    assert_all(y, 3.0f, "A's late fill ran before its block changed hands");
    em_tensor_release(y);
    em_tensor_release(other);
}

Test(streams, record_stream_errors_and_no_ops) {
    cr_assert_eq(em_tensor_record_stream(NULL, NULL), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "NULL tensor"), "%s", em_last_error());
    float host[4] = {0};
    int64_t n = 4;
    em_tensor *w = em_tensor_wrap(host, 1, &n, NULL, EM_F32, em_cpu(), NULL, NULL);
    cr_assert(w, "%s", em_last_error());
    cr_assert_eq(em_tensor_record_stream(w, NULL), EM_ERR_STATE);
    cr_assert(strstr(em_last_error(), "wraps memory the caller owns"), "%s", em_last_error());
    em_tensor_release(w);
    /* The CPU has only its default stream: nothing to record. */
    em_tensor *c = em_zeros(1, &n, EM_F32, em_cpu());
    cr_assert_eq(em_tensor_record_stream(c, NULL), EM_OK, "%s", em_last_error());
    em_tensor_release(c);
    /* The allocation stream itself, or the same stream twice, adds nothing to wait for. */
    em_stream *a = stream_new(D0), *b = stream_new(D0);
    set_current(D0, a);
    em_tensor *x = full(D0, 1.0);
    void *xptr = em_tensor_data(x);
    cr_assert_eq(em_tensor_record_stream(x, a), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_synchronize(D0, a), EM_OK);
    em_tensor_release(x);
    em_tensor *y = full(D0, 2.0);
    cr_assert_eq(em_tensor_data(y), xptr, "recording the allocation stream delays nothing");
    for (int i = 0; i < 5; i++) /* the record grows past its first capacity */
        cr_assert_eq(em_tensor_record_stream(y, i % 2 ? a : b), EM_OK, "%s", em_last_error());
    set_current(D0, NULL);
    em_tensor_release(y);
    em_stream_free(D0, a);
    em_stream_free(D0, b);
}

/* ---- 3. copies between streams are ordered by events ------------------------------------ */

Test(streams, copy_on_another_stream_waits_for_the_event) {
    em_stream *a = stream_new(D0), *b = stream_new(D0);
    for (int with_event = 0; with_event <= 1; with_event++) {
        set_current(D0, a);
        em_tensor *x = full(D0, 1.0);
        cr_assert_eq(em_stream_synchronize(D0, a), EM_OK);
        cr_assert_eq(em_fill_(x, 4.0), EM_OK, "%s", em_last_error()); /* on A, later */
        em_event *e = NULL;
        cr_assert_eq(em_event_create(D0, &e), EM_OK);
        cr_assert_eq(em_event_record(D0, e, a), EM_OK, "%s", em_last_error());
        set_current(D0, b);
        if (with_event) cr_assert_eq(em_event_wait(D0, b, e), EM_OK, "%s", em_last_error());
        em_tensor *y = em_clone(x); /* a copy kernel on B */
        cr_assert(y, "%s", em_last_error());
        cr_assert_eq(em_tensor_record_stream(x, b), EM_OK);
        if (with_event)
            assert_all(y, 4.0f, "the copy on B ran before A's fill it waited for");
        else
            assert_all(y, 1.0f, "without the event B's copy does not wait for A");
        set_current(D0, NULL);
        cr_assert_eq(em_stream_synchronize(D0, a), EM_OK);
        em_event_free(D0, e);
        em_tensor_release(x);
        em_tensor_release(y);
    }
    em_stream_free(D0, a);
    em_stream_free(D0, b);
}

/* ---- em_to_device_async ------------------------------------------------------------------ */

/* A host tensor 0, 1, ..., N-1 (float32). */
static em_tensor *host_iota(void) {
    em_tensor *h = em_arange(0.0, (double)N, 1.0, EM_F32, em_cpu());
    cr_assert(h, "%s", em_last_error());
    return h;
}

/* Host to device on a side stream: queued, not run; the host source may be released at once
 * (the core keeps it until the copy has run: under ASan a freed source would be reported);
 * the values arrive once the stream is waited for. */
Test(streams, to_device_async_host_to_device_is_queued_and_keeps_its_source) {
    em_stream *s = stream_new(D0);
    em_tensor *h = host_iota();
    size_t before = td_pending(0, s);
    em_tensor *d = em_to_device_async(h, D0, s);
    cr_assert(d, "%s", em_last_error());
    cr_assert(em_device_equal(em_tensor_device(d), D0));
    cr_assert_gt(td_pending(0, s), before, "the copy ran before anything waited for it");
    em_tensor_release(h); /* the copy has not run: the core holds the source */
    /* were h's block back in the CPU cache, this would take it and overwrite the source */
    em_tensor *other = em_full(1, (int64_t[]){N}, -1.0, EM_F32, em_cpu());
    cr_assert(other, "%s", em_last_error());
    cr_assert_eq(em_stream_synchronize(D0, s), EM_OK, "%s", em_last_error());
    float buf[N];
    cr_assert_eq(em_tensor_to_host(d, buf, sizeof buf), EM_OK, "%s", em_last_error());
    for (int i = 0; i < N; i++) cr_assert_eq(buf[i], (float)i, "element %d is %g", i, buf[i]);
    cr_assert_eq(em_device_synchronize(D0), EM_OK); /* drops the held source */
    em_tensor_release(other);
    em_tensor_release(d);
    em_stream_free(D0, s);
}

/* Device to host, ordered after the work queued on the stream, and not before. */
Test(streams, to_device_async_device_to_host_runs_after_the_streams_work) {
    em_stream *s = stream_new(D0);
    set_current(D0, s);
    em_tensor *x = full(D0, 5.0); /* pending on s */
    set_current(D0, NULL);
    cr_assert_geq(td_pending(0, s), 1);
    em_tensor *h = em_to_device_async(x, em_cpu(), s);
    cr_assert(h, "%s", em_last_error());
    cr_assert(em_device_equal(em_tensor_device(h), em_cpu()));
    em_tensor_release(x); /* recorded on s: its block waits for the copy */
    cr_assert_geq(td_pending(0, s), 2, "the fill and the copy were not both still queued");
    cr_assert_eq(em_stream_synchronize(D0, s), EM_OK, "%s", em_last_error());
    const float *p = em_tensor_data(h);
    for (int i = 0; i < N; i++) cr_assert_eq(p[i], 5.0f, "element %d is %g", i, p[i]);
    em_tensor_release(h);
    em_stream_free(D0, s);
}

/* On the default stream a copy to or from the host is complete on return; a non-contiguous
 * device source is made contiguous on the stream first. */
Test(streams, to_device_async_default_stream_and_strided_source) {
    em_tensor *h = host_iota();
    em_tensor *d = em_to_device_async(h, D0, NULL);
    cr_assert(d, "%s", em_last_error());
    cr_assert_eq(td_pending(0, NULL), 0, "a default-stream copy from the host is complete");
    em_tensor *m = em_reshape(d, 2, (int64_t[]){16, N / 16});
    em_tensor *t = em_transpose(m, 0, 1); /* (N/16, 16), not contiguous */
    cr_assert(t && !em_tensor_is_contiguous(t), "%s", em_last_error());
    em_stream *s = stream_new(D0);
    em_tensor *back = em_to_device_async(t, em_cpu(), s);
    cr_assert(back, "%s", em_last_error());
    cr_assert_eq(em_stream_synchronize(D0, s), EM_OK, "%s", em_last_error());
    const float *p = em_tensor_data(back);
    for (int i = 0; i < N / 16; i++)
        for (int j = 0; j < 16; j++)
            cr_assert_eq(p[i * 16 + j], (float)(j * (N / 16) + i), "element (%d, %d)", i, j);
    em_tensor *refs[] = {h, d, m, t, back};
    for (size_t i = 0; i < sizeof refs / sizeof *refs; i++) em_tensor_release(refs[i]);
    em_stream_free(D0, s);
}

Test(streams, to_device_async_refuses_two_devices_and_a_host_stream) {
    em_stream *s = stream_new(D0);
    em_tensor *x = full(D0, 1.0);
    em_clear_error();
    cr_assert_null(em_to_device_async(x, D1, s));
    cr_assert_eq(em_last_status(), EM_ERR_DEVICE);
    cr_assert(strstr(em_last_error(), "to_device_async: from testdev:0 to testdev:1"), "%s",
              em_last_error());
    cr_assert(strstr(em_last_error(), "use em_to_device"), "%s", em_last_error());
    em_tensor *h = host_iota();
    cr_assert_null(em_to_device_async(h, em_cpu(), s));
    cr_assert_eq(em_last_status(), EM_ERR_INVALID, "%s", em_last_error());
    em_tensor *same = em_to_device_async(h, em_cpu(), NULL); /* host to host: a copy */
    cr_assert(same && same != h, "%s", em_last_error());
    cr_assert_eq(((const float *)em_tensor_data(same))[N - 1], (float)(N - 1));
    em_tensor_release(same);
    em_tensor_release(h);
    em_tensor_release(x);
    em_stream_free(D0, s);
}

/* testdev:0 -> testdev:1 runs each half on its device's current stream: it sees the work
 * queued there, and does not wait for the devices' other streams. */
Test(streams, cross_device_copy_uses_the_current_streams) {
    em_stream *a = stream_new(D0), *u = stream_new(D0), *c = stream_new(D1);
    set_current(D0, u);
    em_tensor *unrelated = full(D0, 2.0);
    cr_assert_geq(td_pending(0, u), 1);
    set_current(D0, a);
    set_current(D1, c);
    em_tensor *x = full(D0, 6.0); /* pending on A */
    em_tensor *y = em_to_device(x, D1);
    cr_assert(y, "%s", em_last_error());
    cr_assert_geq(td_pending(0, u), 1, "the copy waited for an unrelated stream of testdev:0");
    assert_all(y, 6.0f, "the copy did not see A's fill");
    set_current(D0, NULL);
    set_current(D1, NULL);
    em_tensor_release(x);
    em_tensor_release(y);
    em_tensor_release(unrelated);
    em_stream_free(D0, a);
    em_stream_free(D0, u);
    em_stream_free(D1, c);
}

/* ---- out of memory on the stream paths leaks nothing ------------------------------------ */

/* A host allocator that refuses its Nth call after arming (test_oom.c's, smaller). */
static struct {
    atomic_long calls, live, failures;
    long fail_at;
} g_oom;

static void *oom_alloc(size_t n, size_t align, void *user) {
    (void)user;
    long call = atomic_fetch_add(&g_oom.calls, 1) + 1;
    if (g_oom.fail_at && call == g_oom.fail_at) {
        atomic_fetch_add(&g_oom.failures, 1);
        return NULL;
    }
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : 1) != 0) return NULL;
    atomic_fetch_add(&g_oom.live, 1);
    return p;
}

static void oom_free(void *p, void *user) {
    (void)user;
    if (!p) return;
    atomic_fetch_sub(&g_oom.live, 1);
    free(p);
}

static void oom_arm(long fail_at) {
    atomic_store(&g_oom.calls, 0);
    atomic_store(&g_oom.failures, 0);
    g_oom.fail_at = fail_at;
}

static bool nomem_or(bool ok) {
    if (ok) return true;
    cr_assert_eq(em_last_status(), EM_ERR_NOMEM, "%s", em_last_error());
    cr_assert(strstr(em_last_error(), "out of memory"), "%s", em_last_error());
    return false;
}

/* A new stream's cache, a record_stream, a waiting block and its event's reuse, each with
 * the Nth host allocation refused: a clean EM_ERR_NOMEM, right values when it goes through,
 * and nothing left allocated after em_shutdown. */
static bool stream_sequence(long fail_at) {
    oom_arm(0);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_device_parse("testdev:0", &D0), EM_OK, "%s", em_last_error());
    em_stream *a = stream_new(D0), *b = stream_new(D0);
    set_current(D0, a);
    oom_arm(fail_at);
    int64_t n = N;
    em_tensor *x = em_full(1, &n, 1.0, EM_F32, D0), *y = NULL, *z = NULL;
    bool ok = nomem_or(x != NULL);
    if (ok) ok = nomem_or(em_tensor_record_stream(x, b) == EM_OK);
    em_tensor_release(x);
    if (ok) ok = nomem_or((y = em_full(1, &n, 2.0, EM_F32, D0)) != NULL);
    if (ok) ok = nomem_or(em_stream_synchronize(D0, b) == EM_OK);
    if (ok) ok = nomem_or((z = em_full(1, &n, 3.0, EM_F32, D0)) != NULL);
    float buf[N];
    if (ok) ok = nomem_or(em_tensor_to_host(z, buf, sizeof buf) == EM_OK);
    for (int i = 0; ok && i < N; i++) cr_assert_eq(buf[i], 3.0f);
    bool clean = atomic_load(&g_oom.failures) == 0;
    cr_assert(ok || !clean, "a step failed without a refused allocation");
    oom_arm(0);
    em_tensor_release(y);
    em_tensor_release(z);
    set_current(D0, NULL);
    em_stream_free(D0, a);
    em_stream_free(D0, b);
    em_shutdown();
    cr_assert_eq(atomic_load(&g_oom.live), 0, "refusing allocation %ld leaked %ld blocks",
                 fail_at, atomic_load(&g_oom.live));
    return clean;
}

static void oom_setup(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/testdev.so", getenv("EMBER_TEST_PLUGIN_DIR"));
    setenv("EMBER_PLUGIN_PATH", path, 1);
    atomic_store(&g_oom.live, 0);
    oom_arm(0);
    em_host_allocator_set(&(em_host_allocator){oom_alloc, oom_free, NULL});
}

static void oom_teardown(void) {
    em_host_allocator_set(NULL);
    unsetenv("EMBER_PLUGIN_PATH");
}

Test(streams_oom, every_refused_allocation_is_clean, .init = oom_setup, .fini = oom_teardown) {
    long at = 1;
    while (!stream_sequence(at)) {
        at++;
        cr_assert_lt(at, 400, "the sequence never ran clean");
    }
    cr_assert_gt(at, 5, "the sequence allocates (%ld calls)", at - 1);
    cr_log_info("the stream sequence makes %ld host allocations", at - 1);
}

/* The profiler's trace times an op on an asynchronous device by the device's timed events:
 * testdev's clock advances exactly 1 ms per kernel it runs, so an add there lasts 1000.000 us
 * in the trace (on the host the call takes microseconds, and its work runs on a worker
 * thread only once something waits); an op on the CPU keeps the host's time. */
Test(streams, the_trace_times_device_ops_by_their_events) {
    em_scope_begin();
    em_tensor *x = full(D0, 1.0);
    em_tensor *c = em_ones(1, (int64_t[]){N}, EM_F32, em_cpu());
    cr_assert(c, "%s", em_last_error());
    em_profiler_options po = {.struct_size = sizeof po, .trace = true};
    em_profiler *p = em_profiler_begin(&po);
    cr_assert(p, "%s", em_last_error());
    cr_assert(em_add(x, x), "%s", em_last_error());
    cr_assert(em_add(c, c), "%s", em_last_error());
    cr_assert_eq(em_profiler_end(p), EM_OK);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(em_profiler_write_trace(p, f), EM_OK, "%s", em_last_error());
    fclose(f);
    int on_dev = 0, on_cpu = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, "\"name\":\"add\"")) continue;
        const char *d = strstr(line, "\"dur\":");
        cr_assert(d, "%s", line);
        double dur = strtod(d + 6, NULL);
        if (strstr(line, "\"device\":\"testdev:0\"")) {
            on_dev++;
            cr_assert(strstr(line, "\"clock\":\"device\""), "%s", line);
            cr_assert_float_eq(dur, 1000.0, 1e-9, "one kernel: 1 ms of testdev's clock: %s", line);
        } else if (strstr(line, "\"device\":\"cpu:0\"")) {
            on_cpu++;
            cr_assert(strstr(line, "\"clock\":\"host\""), "%s", line);
            cr_assert_geq(dur, 0.0, "%s", line);
        }
    }
    cr_assert_eq(on_dev, 1, "%s", text);
    cr_assert_eq(on_cpu, 1, "%s", text);
    free(text);
    em_profiler_free(p);
    em_scope_end();
}

/* ---- graph capture (ember/device.h) on testdev, which records and replays as CUDA graphs
 * do; and the devices that cannot capture ------------------------------------------------ */

static em_graph *capture_end_ok(em_device d) {
    em_graph *g = NULL;
    cr_assert_eq(em_graph_capture_end(d, &g), EM_OK, "%s", em_last_error());
    cr_assert(g);
    return g;
}

Test(streams, a_captured_graph_replays_its_work_on_new_inputs) {
    em_stream *s = stream_new(D0);
    em_tensor *x = full(D0, 1.0), *b = full(D0, 2.0), *v10 = full(D0, 10.0),
              *v20 = full(D0, 20.0);
    cr_assert_eq(em_graph_capture_begin(D0, s), EM_OK, "%s", em_last_error());
    cr_assert(em_stream_current(D0) == s, "the capture's stream is the current one");
    em_tensor *t = em_add(x, b); /* a temporary of the capture */
    cr_assert(t, "%s", em_last_error());
    em_tensor *y = em_add(t, b);
    cr_assert(y, "%s", em_last_error());
    void *tp = em_tensor_data(t);
    em_tensor_release(t);
    em_tensor *z = em_add(y, b); /* reuses t's block: the replay runs in the same order */
    cr_assert(z, "%s", em_last_error());
    cr_assert(em_tensor_data(z) == tp, "a block freed in the capture serves the capture");
    cr_assert_eq(td_pending(0, s), 0, "a capture records; nothing was queued");
    em_graph *g = capture_end_ok(D0);
    cr_assert(em_stream_current(D0) == NULL, "the previous current stream is back");
    cr_assert(em_graph_stream(g) == s);
    /* the graph's blocks are its own: an allocation of the same size elsewhere gets another */
    em_tensor_release(y);
    void *yp = em_tensor_data(z); /* still held */
    set_current(D0, s);
    em_tensor *other = full(D0, 0.0);
    cr_assert(em_tensor_data(other) != yp && em_tensor_data(other) != tp,
              "a graph's block was handed out after the capture");
    set_current(D0, NULL);
    em_empty_cache(); /* leaves the graph's cached block alone: its replays write there */
    em_memory_stats m;
    cr_assert_eq(em_memory_stats_get(D0, &m), EM_OK);
    cr_assert_eq(m.current[EM_MEM_CACHED], 1024, "y's block stays cached for the graph");
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(em_copy_(x, round ? v20 : v10), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_graph_replay(g), EM_OK, "%s", em_last_error());
        cr_assert_gt(td_pending(0, s), 0, "the replay is queued on the capture's stream");
        cr_assert_eq(em_stream_synchronize(D0, s), EM_OK);
        assert_all(z, round ? 26.0f : 16.0f, "z = (x + 2) + 2 + 2 after the replay");
    }
    em_graph_free(g);
    em_tensor_release(z);
    em_tensor_release(other);
    em_tensor_release(x);
    em_tensor_release(b);
    em_tensor_release(v10);
    em_tensor_release(v20);
    em_stream_free(D0, s);
    em_empty_cache();
    cr_assert_eq(em_memory_stats_get(D0, &m), EM_OK);
    cr_assert_eq(m.reserved, 0, "the graph's blocks went back to the device once it and its "
                 "tensors were freed (%zu bytes still reserved)", m.reserved);
}

Test(streams, what_a_capture_cannot_record_breaks_it_with_a_clear_error) {
    em_stream *s = stream_new(D0);
    em_tensor *x = full(D0, 1.0);
    cr_assert_eq(em_graph_capture_begin(D0, s), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_graph_capture_begin(D0, s), EM_ERR_STATE, "a second capture on one thread");
    cr_assert(strstr(em_last_error(), "already capturing"), "%s", em_last_error());
    cr_assert_eq(em_graph_replay(NULL), EM_ERR_INVALID);
    float buf[N];
    cr_assert_neq(em_tensor_to_host(x, buf, sizeof buf), EM_OK, "a read on the host in a capture");
    em_graph *g = (em_graph *)&buf; /* must be overwritten with NULL */
    cr_assert_eq(em_graph_capture_end(D0, &g), EM_ERR_DEVICE);
    cr_assert(!g);
    cr_assert(strstr(em_last_error(), "host memory"), "the end names what broke it: %s",
              em_last_error());
    cr_assert(em_stream_current(D0) == NULL, "the current stream is restored after a failure");
    cr_assert_eq(em_graph_capture_end(D0, &g), EM_ERR_STATE, "no capture in progress");
    cr_assert(strstr(em_last_error(), "not capturing"), "%s", em_last_error());
    cr_assert_eq(em_graph_capture_begin(D0, NULL), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "default stream"), "%s", em_last_error());
    /* after a broken capture, capturing again works */
    cr_assert_eq(em_graph_capture_begin(D0, s), EM_OK, "%s", em_last_error());
    em_tensor *y = em_add(x, x);
    cr_assert(y, "%s", em_last_error());
    g = capture_end_ok(D0);
    cr_assert_eq(em_graph_replay(g), EM_OK, "%s", em_last_error());
    assert_all(y, 2.0f, "y = x + x after the replay");
    em_graph_free(g);
    em_tensor_release(x);
    em_tensor_release(y);
    em_stream_free(D0, s);
}

Test(streams, the_cpu_cannot_capture_and_says_so) {
    em_device cpu = em_cpu();
    cr_assert(!em_graph_capture_supported(cpu));
    cr_assert(em_graph_capture_supported(D0));
    cr_assert_eq(em_graph_capture_begin(cpu, NULL), EM_ERR_DEVICE);
    cr_assert(strstr(em_last_error(), "device cpu cannot capture graphs"), "%s",
              em_last_error());
    em_graph *g = NULL;
    cr_assert_eq(em_graph_capture_end(cpu, &g), EM_ERR_DEVICE);
    cr_assert(strstr(em_last_error(), "cannot capture graphs"), "%s", em_last_error());
    cr_assert_eq(em_graph_capture_end(cpu, NULL), EM_ERR_INVALID);
    em_graph_free(NULL);
}
