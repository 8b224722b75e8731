/*
 * common.h — helpers shared by the Criterion tests: library set-up per test, tensors from
 * literals, and reading values back.
 */
#ifndef EMBER_TESTS_COMMON_H
#define EMBER_TESTS_COMMON_H

#include "config.h" /* EM_HAVE_DNNL: the CPU backend was built with oneDNN */

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

/* Library start-up and shutdown for a test suite: .init = em_test_setup, .fini = em_test_teardown.
 * The test itself has already ended with an asserted clean shutdown (clean_shutdown.h: a
 * tensor, module, optimizer, ... it left alive fails it); the teardown asserts it again for
 * what a suite's .init made. */
static inline void em_test_setup(void) {
    cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error());
}
#define em_test_assert_clean_shutdown()                                                        \
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error())
static inline void em_test_teardown(void) { em_test_assert_clean_shutdown(); }

/* Run a shell command line (popen): its stdout as a new string (the caller frees it), its
 * exit status in *code (when code is not NULL); asserts that it exited normally. */
static inline char *em_test_run(const char *cmd, int *code) {
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    for (size_t got; (got = fread(out + len, 1, cap - len - 1, p)) > 0;) {
        len += got;
        if (cap - len < 4096) out = realloc(out, cap *= 2);
    }
    out[len] = '\0';
    int st = pclose(p);
    cr_assert(WIFEXITED(st), "%s did not exit normally (status %d): %s", cmd, st, out);
    if (code) *code = WEXITSTATUS(st);
    return out;
}

/* A CPU tensor from a literal array of doubles, converted to dtype dt. */
static inline em_tensor *em_test_tensor(em_dtype dt, int ndim, const int64_t *shape,
                                        const double *values) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    /* Its own scope, so it works whether or not the caller has one open. */
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
    cr_assert(t, "em_empty: %s", em_last_error());
    double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
    memcpy(buf, values, sizeof(double) * (size_t)n);
    em_tensor *d = em_from_data(buf, ndim, shape, EM_F64, em_cpu());
    cr_assert(d, "em_from_data: %s", em_last_error());
    cr_assert_eq(em_copy_(t, d), EM_OK, "copy_: %s", em_last_error());
    free(buf);
    em_keep(t);
    cr_assert_eq(em_scope_end(), EM_OK);
    return t;
}

/* Element i (C order) of t as a double. */
static inline double em_test_at(const em_tensor *t, int64_t i) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *c = em_to_dtype(t, EM_F64);
    cr_assert(c, "to_dtype: %s", em_last_error());
    int64_t n = em_tensor_numel(c);
    double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
    cr_assert_eq(em_tensor_to_host(c, buf, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    double v = buf[i];
    free(buf);
    cr_assert_eq(em_scope_end(), EM_OK);
    return v;
}

/* Every dtype, for tests that loop over them. */
static const em_dtype em_test_all_dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16,
                                              EM_I32, EM_I64, EM_U8,  EM_BOOL};
#define EM_TEST_N_DTYPES ((int)(sizeof em_test_all_dtypes / sizeof em_test_all_dtypes[0]))

/* v rounded once to dtype dt, as a double (integers wrap like C casts, bool is v != 0): the
 * reference for a value stored in dt. */
static inline double em_test_round_to(em_dtype dt, double v) {
    switch (dt) {
    case EM_F32: return (float)v;
    case EM_F64: return v;
    case EM_F16: return em_f16_to_f32(em_f32_to_f16((float)v));
    case EM_BF16: return em_bf16_to_f32(em_f32_to_bf16((float)v));
    case EM_I32: return (int32_t)(uint32_t)(int64_t)v;
    case EM_I64: return (double)(int64_t)v;
    case EM_U8: return (uint8_t)(int64_t)v;
    case EM_BOOL: return v != 0;
    default: cr_assert_fail("bad dtype");
    }
    return 0;
}

/* Test value number i of stream `seed` for dtype dt: small dyadic floats (exact in f16 and
 * bf16, never 0), small integers (negative too), or bools. */
static inline double em_test_gen(em_dtype dt, int64_t i, int seed) {
    int64_t k = (i * 37 + seed * 11 + 5) % 23;
    if (em_dtype_is_floating(dt)) return (double)(k - 11) * 0.25 + 0.125;
    if (dt == EM_BOOL) return k % 3 == 0;
    if (dt == EM_U8) return (double)k;
    return (double)(k - 11);
}

/* n roughly N(0, 1) values (sums of 4 uniforms, scaled) from a fixed LCG seeded by seed:
 * independent of Ember's own generator. */
static inline void em_test_fill_random(double *v, int64_t n, uint64_t seed) {
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (int64_t i = 0; i < n; i++) {
        double acc = 0;
        for (int k = 0; k < 4; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            acc += (double)(s >> 11) / 9007199254740992.0;
        }
        v[i] = (acc - 2.0) * 1.7;
    }
}

/* All of t's elements (C order) as a new malloc'ed array of doubles (free it). Works inside
 * or outside a scope. */
static inline double *em_test_values(const em_tensor *t) {
    int64_t n = em_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *d = em_to_dtype(t, EM_F64);
    cr_assert(d, "to_dtype: %s", em_last_error());
    cr_assert_eq(em_tensor_to_host(d, v, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_scope_end(), EM_OK);
    return v;
}

/* got holds want (n values, C order): |got - want| <= atol + rtol |want|, NaN matching NaN and
 * infinities exactly. The first mismatches are reported one by one, then the test fails. */
static inline void em_test_expect_close(const em_tensor *got, const double *want, int64_t n,
                                        double rtol, double atol, const char *what) {
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_numel(got), n, "%s: %lld elements, want %lld", what,
                 (long long)em_tensor_numel(got), (long long)n);
    double *g = em_test_values(got);
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        bool ok = g[i] == want[i] || (isnan(g[i]) && isnan(want[i])) ||
                  (isfinite(want[i]) && fabs(g[i] - want[i]) <= atol + rtol * fabs(want[i]));
        if (!ok && bad++ < 5)
            cr_expect(ok, "%s: element %lld is %.10g, want %.10g", what, (long long)i, g[i],
                      want[i]);
    }
    free(g);
    cr_assert_eq(bad, 0, "%s: %d mismatches", what, bad);
}

/* t has shape (nd dims). */
static inline void em_test_expect_shape(const em_tensor *t, int nd, const int64_t *shape,
                                        const char *what) {
    cr_assert(t, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_ndim(t), nd, "%s: %d dims, want %d", what, em_tensor_ndim(t), nd);
    for (int d = 0; d < nd; d++)
        cr_assert_eq(em_tensor_shape(t)[d], shape[d], "%s: dim %d is %lld, want %lld", what, d,
                     (long long)em_tensor_shape(t)[d], (long long)shape[d]);
}

/* An infer function for test ops whose one output has input 0's dtype and shape. */
static inline em_status em_test_infer_same(const em_op *op, const em_tensor *const *in,
                                           const em_attr *attrs, em_tensor_meta *out) {
    (void)op, (void)attrs;
    out->dtype = em_tensor_dtype(in[0]);
    out->ndim = em_tensor_ndim(in[0]);
    memcpy(out->shape, em_tensor_shape(in[0]), sizeof(int64_t) * (size_t)out->ndim);
    return EM_OK;
}

/* Release every tensor listed (NULL entries are fine): RELEASE(y, x). */
static inline void em_test_release_n(em_tensor **ts, size_t n) {
    for (size_t i = 0; i < n; i++) em_tensor_release(ts[i]);
}
#define RELEASE(...)                                                                           \
    do {                                                                                       \
        em_tensor *rel_[] = {__VA_ARGS__};                                                     \
        em_test_release_n(rel_, sizeof rel_ / sizeof rel_[0]);                                 \
    } while (0)

/* The last error contains `needle`. */
#define em_assert_error(status, needle)                                                        \
    do {                                                                                       \
        cr_assert_eq(em_last_status(), (status), "status %s, message: %s",                     \
                     em_status_name(em_last_status()), em_last_error());                       \
        cr_assert(strstr(em_last_error(), (needle)), "message '%s' lacks '%s'",                \
                  em_last_error(), (needle));                                                  \
    } while (0)

/* Skips the calling test in a build without oneDNN (configure --without-onednn): for tests of
 * oneDNN's kernels and GEMM paths, which stay strict in the default build. */
#ifdef EM_HAVE_DNNL
#define em_test_needs_onednn() ((void)0)
#else
#define em_test_needs_onednn() cr_skip_test("built without oneDNN (configure --without-onednn)")
#endif

/* Whether a kernel named `name` is registered by any loaded plugin. */
static inline bool kernel_registered(const char *name) {
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        cr_assert_eq(em_plugin_get(i, &info), EM_OK);
        if (!info.registry) continue;
        for (size_t j = 0; j < em_registry_kernel_count(info.registry); j++) {
            em_kernel_info ki;
            cr_assert_eq(em_registry_kernel_get(info.registry, j, &ki), EM_OK);
            if (strcmp(ki.name, name) == 0) return true;
        }
    }
    return false;
}

/* Load the test device with host kernels (tests/plugins/host/testdev_host.so: it records and
 * replays graphs as CUDA does) and return testdev:0, which captures graphs. */
static inline em_device em_test_host_testdev(void) {
    const char *dir = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(dir, "EMBER_TEST_PLUGIN_DIR is not set (run through make check)");
    char path[4096];
    snprintf(path, sizeof path, "%s/../host/.libs/testdev_host.so", dir);
    cr_assert_eq(em_plugin_load(path), EM_OK, "%s", em_last_error());
    em_device td;
    cr_assert_eq(em_device_parse("testdev:0", &td), EM_OK, "%s", em_last_error());
    cr_assert(em_graph_capture_supported(td));
    return td;
}

#endif /* EMBER_TESTS_COMMON_H */
