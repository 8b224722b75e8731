/*
 * test_exec.c — execution contexts, kernel workspace and backend named functions
 * (ember/dispatch.h, ember/device.h): a kernel runs on the calling thread's current stream
 * with the context the backend made for that (device, stream), made once and freed with the
 * stream and at em_shutdown; workspace is held for the call and handed back after it; a
 * refused workspace request or context fails the op naming it; em_backend_proc finds a
 * backend's functions (the CPU backend's thread count among them).
 *
 * "ctxdev" is a synchronous device this program registers: host memory, streams that are
 * tokens, and contexts that record what they were made for.
 */
#include <pthread.h>
#include <stdint.h>

#include "common.h"

/* ---- the device --------------------------------------------------------------------------- */

typedef struct ctx_rec {
    int index;
    em_stream *stream;
} ctx_rec;

static struct {
    int creates, destroys;
    em_stream *last_destroyed;
    bool fail_create;
} D;

static int dev_count(void) { return 1; }
/* A device of 64 MiB: a bigger request is out of memory. */
#define DEV_CAPACITY ((size_t)64 << 20)
static em_status dev_alloc(int index, size_t n, void **out) {
    (void)index;
    if (n > DEV_CAPACITY) return EM_ERR_NOMEM;
    return posix_memalign(out, 64, n) == 0 ? EM_OK : EM_ERR_NOMEM;
}
static void dev_free(int index, void *p) {
    (void)index;
    free(p);
}
static em_status dev_copy(em_device dd, void *dst, em_device sd, const void *src, size_t n,
                          em_stream *s) {
    (void)dd, (void)sd, (void)s;
    memmove(dst, src, n);
    return EM_OK;
}
static em_status dev_sync(int index) {
    (void)index;
    return EM_OK;
}
static em_status dev_stream_create(int index, em_stream **out) {
    (void)index;
    *out = malloc(1);
    return *out ? EM_OK : EM_ERR_NOMEM;
}
static void dev_stream_destroy(int index, em_stream *s) {
    (void)index;
    free(s);
}
static em_status dev_stream_sync(int index, em_stream *s) {
    (void)index, (void)s;
    return EM_OK;
}
static em_status dev_context_create(int index, em_stream *s, void **out) {
    if (D.fail_create) return em_set_error(EM_ERR_DEVICE, "ctxdev: no handles left");
    ctx_rec *r = malloc(sizeof *r);
    if (!r) return EM_ERR_NOMEM;
    *r = (ctx_rec){index, s};
    D.creates++;
    *out = r;
    return EM_OK;
}
static void dev_context_destroy(int index, em_stream *s, void *ctx) {
    ctx_rec *r = ctx;
    cr_expect_eq(r->index, index);
    cr_expect_eq(r->stream, s, "destroyed with the stream it was made for");
    D.destroys++;
    D.last_destroyed = s;
    free(r);
}
static int dev_answer(void) { return 42; }
static const em_backend_fn_def dev_functions[] = {
    {"answer", (em_proc_fn)dev_answer, "int (void)", "the answer"},
    {NULL, NULL, NULL, NULL},
};

static em_device register_device(void) {
    static const em_device_ops ops = {
        .struct_size = sizeof ops, .name = "ctxdev", .count = dev_count, .alloc = dev_alloc,
        .free = dev_free, .copy = dev_copy, .synchronize = dev_sync,
        .stream_create = dev_stream_create, .stream_destroy = dev_stream_destroy,
        .stream_synchronize = dev_stream_sync, .context_create = dev_context_create,
        .context_destroy = dev_context_destroy, .functions = dev_functions};
    cr_assert_eq(em_device_type_register(em_registry_program(), &ops), EM_OK, "%s",
                 em_last_error());
    em_device dev;
    cr_assert_eq(em_device_parse("ctxdev", &dev), EM_OK, "%s", em_last_error());
    return dev;
}

/* ---- the probe op: y = x, recording what its kernel saw ------------------------------------ */

typedef struct seen {
    em_stream *stream;
    const em_exec_ctx *exec;
    void *ws;
    size_t ws_held; /* workspace bytes the device's allocator held during the call */
} seen;

static _Thread_local seen S;
static size_t g_ws_bytes;

static em_status probe_kernel(const em_kernel_ctx *k) {
    cr_assert(EM_KCTX_HAS_EXEC(k));
    S.stream = k->stream;
    S.exec = k->exec;
    S.ws = NULL;
    if (g_ws_bytes) {
        em_status st = em_kernel_workspace(k, g_ws_bytes, &S.ws);
        if (st != EM_OK) return st;
        memset(S.ws, 0xab, g_ws_bytes);
        em_memory_stats ms;
        cr_assert_eq(em_memory_stats_get(k->device, &ms), EM_OK);
        S.ws_held = ms.current[EM_MEM_WORKSPACE];
    }
    memcpy(k->out[0].data, k->in[0].data, (size_t)k->out[0].numel * sizeof(float));
    return EM_OK;
}


static const em_op *g_probe;

static void declare_probe(void) {
    em_op_schema s = {.struct_size = sizeof s, .name = "test.probe", .n_inputs = 1,
                      .n_outputs = 1, .dispatch_arg = 0, .infer = em_test_infer_same};
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &g_probe), EM_OK, "%s",
                 em_last_error());
    for (int i = 0; i < 2; i++) {
        em_kernel_def k = {.struct_size = sizeof k, .op = "test.probe",
                           .device_type = i ? "ctxdev" : "cpu", .dtype = EM_F32,
                           .fn = probe_kernel, .name = "test_probe"};
        cr_assert_eq(em_kernel_register(em_registry_program(), &k, NULL), EM_OK, "%s",
                     em_last_error());
    }
}

static em_device g_dev;

static void setup(void) {
    memset(&D, 0, sizeof D);
    g_ws_bytes = 0;
    em_test_setup();
    g_dev = register_device();
    declare_probe();
}

TestSuite(exec, .init = setup, .fini = em_test_teardown);

/* Run the probe on a new tensor of dev; returns the status, the output released. */
static em_status probe(em_device dev) {
    int64_t n = 16;
    em_tensor *x = em_empty(1, &n, EM_F32, dev), *y = NULL; /* contents unused */
    cr_assert_not_null(x, "%s", em_last_error());
    em_status st = em_op_call(g_probe, (const em_tensor *const[]){x}, 1, NULL, &y);
    em_tensor_release(x);
    em_tensor_release(y);
    return st;
}

static void *probe_thread(void *arg) {
    (void)arg;
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    return (void *)&S; /* this thread's record */
}

/* ---- contexts and streams ------------------------------------------------------------------- */

Test(exec, the_kernel_runs_on_the_current_stream_in_its_context) {
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    cr_expect_null(S.stream, "the default stream until one is set current");
    cr_assert_not_null(S.exec);
    cr_expect_null(S.exec->stream);
    cr_expect(em_device_equal(S.exec->device, g_dev));
    const ctx_rec *r = S.exec->backend;
    cr_assert_not_null(r, "the backend's context");
    cr_expect_null(r->stream);
    const em_exec_ctx *dflt = S.exec;
    int made = D.creates;
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    cr_expect_eq(S.exec, dflt, "one context per (device, stream), kept");
    cr_expect_eq(D.creates, made);

    em_stream *s = NULL;
    cr_assert_eq(em_stream_create(g_dev, &s), EM_OK, "%s", em_last_error());
    cr_assert_not_null(s);
    cr_assert_eq(em_stream_set_current(g_dev, s), EM_OK, "%s", em_last_error());
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    cr_expect_eq(S.stream, s, "the kernel's stream is the thread's current one");
    cr_expect_eq(S.exec->stream, s);
    cr_expect_eq(((const ctx_rec *)S.exec->backend)->stream, s, "made for that stream");
    cr_expect_eq(D.creates, made + 1);
    const em_exec_ctx *on_s = S.exec;

    /* Another thread has its own current stream: the default. */
    pthread_t th;
    void *other;
    cr_assert_eq(pthread_create(&th, NULL, probe_thread, NULL), 0);
    cr_assert_eq(pthread_join(th, &other), 0);
    cr_expect_null(((const seen *)other)->stream);
    cr_expect_eq(((const seen *)other)->exec, dflt, "the default stream's context, shared");

    cr_assert_eq(em_stream_set_current(g_dev, NULL), EM_OK);
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    cr_expect_eq(S.exec, dflt);
    cr_assert_eq(em_stream_set_current(g_dev, s), EM_OK);
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    cr_expect_eq(S.exec, on_s, "the stream's context, kept");

    int destroyed = D.destroys;
    em_stream_free(g_dev, s);
    cr_expect_eq(D.destroys, destroyed + 1, "freeing the stream frees its context");
    cr_expect_eq(D.last_destroyed, s);
    cr_expect_null(em_stream_current(g_dev), "and the thread is back on the default stream");
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    cr_expect_eq(S.exec, dflt);

    /* A new stream (malloc may hand it the freed one's address) gets a context of its own. */
    em_stream *s2 = NULL;
    cr_assert_eq(em_stream_create(g_dev, &s2), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_set_current(g_dev, s2), EM_OK, "%s", em_last_error());
    int before = D.creates;
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    cr_expect_eq(S.stream, s2);
    cr_expect_eq(S.exec->stream, s2);
    cr_expect_eq(D.creates, before + 1, "the freed stream's context is not reused");
    cr_assert_eq(em_stream_set_current(g_dev, NULL), EM_OK);
    em_stream_free(g_dev, s2);

    em_shutdown();
    cr_expect_eq(D.destroys, D.creates, "em_shutdown frees every context (%d of %d)",
                 D.destroys, D.creates);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error()); /* for the suite's teardown */
}

Test(exec, a_context_the_backend_cannot_make_fails_the_op_naming_the_device) {
    D.fail_create = true;
    em_clear_error();
    cr_assert_eq(probe(g_dev), EM_ERR_DEVICE);
    cr_expect_str_eq(em_last_error(), "ctxdev:0: the backend could not make its execution "
                                      "context for the default stream: ctxdev: no handles left");
    D.fail_create = false;
    cr_assert_eq(probe(g_dev), EM_OK, "%s", em_last_error());
    cr_expect_not_null(S.exec);
}

Test(exec, the_cpu_backend_makes_contexts) {
    cr_assert_eq(probe(em_cpu()), EM_OK, "%s", em_last_error());
    cr_assert_not_null(S.exec);
    cr_expect_not_null(S.exec->backend, "the CPU backend's context (threads, oneDNN streams)");
    cr_expect(em_device_equal(S.exec->device, em_cpu()));
}

/* ---- workspace ------------------------------------------------------------------------------- */

static void workspace_round_trip(em_device dev) {
    g_ws_bytes = 100000;
    em_memory_stats before, after;
    cr_assert_eq(em_memory_stats_get(dev, &before), EM_OK);
    cr_assert_eq(probe(dev), EM_OK, "%s", em_last_error());
    cr_assert_not_null(S.ws);
    cr_expect_eq((uintptr_t)S.ws % 64, 0, "64-byte aligned");
    cr_expect_geq(S.ws_held, before.current[EM_MEM_WORKSPACE] + 100000,
                  "held as workspace during the call (%zu bytes)", S.ws_held);
    cr_assert_eq(em_memory_stats_get(dev, &after), EM_OK);
    cr_expect_eq(after.current[EM_MEM_WORKSPACE], 0, "handed back when the call ended");
    cr_expect_geq(after.current[EM_MEM_CACHED], 100000, "into the cache");
    uint64_t misses = after.device_allocs;
    cr_assert_eq(probe(dev), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_memory_stats_get(dev, &after), EM_OK);
    cr_expect_eq(after.device_allocs, misses, "the next call reuses the cached block");
}

Test(exec, workspace_is_held_for_the_call_on_the_cpu) { workspace_round_trip(em_cpu()); }
Test(exec, workspace_is_held_for_the_call_on_a_plugin_device) { workspace_round_trip(g_dev); }

Test(exec, a_workspace_request_that_fails_fails_the_op_naming_it) {
    g_ws_bytes = 2 * DEV_CAPACITY;
    em_clear_error();
    cr_assert_eq(probe(g_dev), EM_ERR_NOMEM);
    char want[128];
    snprintf(want, sizeof want, "test.probe: out of memory for %zu bytes of kernel workspace on "
             "ctxdev:0 (out of memory on ctxdev:0", 2 * DEV_CAPACITY);
    cr_expect(strncmp(em_last_error(), want, strlen(want)) == 0, "%s", em_last_error());
    em_memory_stats ms;
    cr_assert_eq(em_memory_stats_get(g_dev, &ms), EM_OK);
    cr_expect_eq(ms.current[EM_MEM_WORKSPACE], 0);
}

Test(exec, workspace_needs_a_kernel_context) {
    void *p = (void *)1;
    cr_expect_eq(em_kernel_workspace(NULL, 8, &p), EM_ERR_INVALID);
    cr_expect_null(p);
    em_kernel_ctx old = {.struct_size = offsetof(em_kernel_ctx, exec), .op = g_probe,
                         .device = em_cpu()};
    cr_expect_eq(em_kernel_workspace(&old, 8, &p), EM_ERR_INVALID);
    cr_expect(strstr(em_last_error(), "predates workspace") != NULL, "%s", em_last_error());
}

/* ---- backend functions ---------------------------------------------------------------------- */

Test(exec, backend_functions_by_name) {
    em_proc_fn f = em_backend_proc("ctxdev", "answer");
    cr_assert_not_null(f, "%s", em_last_error());
    cr_expect_eq(((int (*)(void))f)(), 42);
    cr_expect_null(em_backend_proc("ctxdev", "question"));
    cr_expect_eq(em_last_status(), EM_ERR_NOTFOUND);
    cr_expect_str_eq(em_last_error(), "backend_proc: the 'ctxdev' backend has no function "
                                      "'question'; it has: answer");
    cr_expect_null(em_backend_proc("nosuch", "answer"));
    cr_expect_eq(em_last_status(), EM_ERR_NOTFOUND);
    cr_expect(strstr(em_last_error(), "no backend for device type 'nosuch'") != NULL, "%s",
              em_last_error());
    size_t n = 99;
    cr_expect_null(em_backend_functions("nosuch", &n));
    cr_expect_eq(n, 0);
    const em_backend_fn_def *fs = em_backend_functions("ctxdev", &n);
    cr_assert_eq(n, 1);
    cr_expect_str_eq(fs[0].name, "answer");
    cr_expect_str_eq(fs[0].signature, "int (void)");
}

Test(exec, the_thread_count_is_the_cpu_backends_setting) {
    size_t n = 0;
    const em_backend_fn_def *fs = em_backend_functions("cpu", &n);
    cr_assert_eq(n, 3);
    cr_expect_str_eq(fs[0].name, "num_threads");
    cr_expect_str_eq(fs[1].name, "set_num_threads");
    cr_expect_str_eq(fs[2].name, "num_threads_reason");
    void (*set)(int) = (void (*)(int))em_backend_proc("cpu", "set_num_threads");
    int (*get)(void) = (int (*)(void))em_backend_proc("cpu", "num_threads");
    cr_assert(set && get, "%s", em_last_error());
    set(3);
    cr_expect_eq(em_num_threads(), 3, "em_num_threads reads the backend's setting");
    cr_expect_eq(get(), 3);
    em_set_num_threads(2);
    cr_expect_eq(get(), 2, "em_set_num_threads sets it");
    cr_expect_str_eq(em_num_threads_reason(), "em_set_num_threads");
    em_set_num_threads(0);
    cr_expect_eq(get(), 1, "below 1 becomes 1");
}
