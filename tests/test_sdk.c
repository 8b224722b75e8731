/*
 * test_sdk.c — the SDK's worked example plugin (sdk/example/square.c) loads through
 * EMBER_PLUGIN_PATH and its op "square" computes x * x on contiguous and strided tensors,
 * checked against a plain loop.
 */
#include "common.h"

static void sdk_setup(void) {
    const char *dir = getenv("EMBER_TEST_SDK_DIR");
    cr_assert(dir, "EMBER_TEST_SDK_DIR is not set (run through `make check`)");
    cr_assert_eq(setenv("EMBER_PLUGIN_PATH", dir, 1), 0);
    em_test_setup();
}

static void sdk_teardown(void) {
    em_test_teardown();
    unsetenv("EMBER_PLUGIN_PATH");
}

TestSuite(sdk, .init = sdk_setup, .fini = sdk_teardown);

/* x as f64 values in C order. */
static void host_values(const em_tensor *t, double *buf, int64_t n) {
    em_tensor *d = em_to_dtype(t, EM_F64);
    cr_assert(d, "to_dtype: %s", em_last_error());
    cr_assert_eq(em_tensor_numel(d), n);
    cr_assert_eq(em_tensor_to_host(d, buf, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    em_tensor_release(d);
}

/* Run square on x and compare with the loop y[i] = x[i] * x[i] over x's values in C order. */
static void check_square(const em_tensor *x) {
    const em_op *sq = em_op_find("square");
    cr_assert(sq, "op square not found: %s", em_last_error());
    em_tensor *y = NULL;
    cr_assert_eq(em_op_call(sq, (const em_tensor *const[]){x}, 1, NULL, &y), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_tensor_dtype(y), em_tensor_dtype(x));
    cr_assert_eq(em_tensor_ndim(y), em_tensor_ndim(x));
    for (int d = 0; d < em_tensor_ndim(x); d++)
        cr_assert_eq(em_tensor_size(y, d), em_tensor_size(x, d));
    int64_t n = em_tensor_numel(x);
    double xs[64], ys[64];
    cr_assert(n <= 64);
    host_values(x, xs, n);
    host_values(y, ys, n);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(ys[i], xs[i] * xs[i], "element %lld: %g, expected %g", (long long)i,
                     ys[i], xs[i] * xs[i]);
    em_tensor_release(y);
}

/* A (3, 4) tensor holding -5.5, -4.5, ..., 5.5 (exact in f32 and f64, and so are squares). */
static em_tensor *make_x(em_dtype dt) {
    double v[12];
    for (int i = 0; i < 12; i++) v[i] = i - 5.5;
    return em_test_tensor(dt, 2, (int64_t[]){3, 4}, v);
}

Test(sdk, plugin_is_listed_as_loaded) {
    bool found = false;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info p;
        cr_assert_eq(em_plugin_get(i, &p), EM_OK);
        if (!p.name || strcmp(p.name, "ember-square") != 0) continue;
        found = true;
        cr_assert_eq(p.status, EM_PLUGIN_LOADED, "refused: %s", p.reason ? p.reason : "");
        cr_assert_eq(em_registry_op_count(p.registry), 1);
        cr_assert_str_eq(em_registry_op_name(p.registry, 0), "square");
        cr_assert_eq(em_registry_kernel_count(p.registry), 2);
    }
    cr_assert(found, "ember-square is not among the %zu plugins", em_plugin_count());
}

Test(sdk, contiguous_f32) {
    em_tensor *x = make_x(EM_F32);
    cr_assert(em_tensor_is_contiguous(x));
    check_square(x);
    em_tensor_release(x);
}

Test(sdk, transposed_f64) {
    em_tensor *x = make_x(EM_F64);
    em_tensor *xt = em_transpose(x, 0, 1); /* (4, 3), strides (1, 4) */
    cr_assert(xt, "%s", em_last_error());
    cr_assert(!em_tensor_is_contiguous(xt));
    check_square(xt);
    em_tensor_release(xt);
    em_tensor_release(x);
}

Test(sdk, sliced_f32) {
    em_tensor *x = make_x(EM_F32);
    em_tensor *s = em_slice(x, 1, 1, 4, 2); /* columns 1 and 3: (3, 2), strides (4, 2) */
    cr_assert(s, "%s", em_last_error());
    check_square(s);
    em_tensor_release(s);
    em_tensor_release(x);
}

/* em_op_call_out into a transposed (strided) output: the kernel must follow y's strides. */
Test(sdk, strided_output) {
    const em_op *sq = em_op_find("square");
    cr_assert(sq, "%s", em_last_error());
    em_tensor *x = make_x(EM_F64);
    em_tensor *xt = em_transpose(x, 0, 1);                                     /* (4, 3) */
    em_tensor *base = em_zeros(2, (int64_t[]){3, 4}, EM_F64, em_cpu());        /* (3, 4) */
    em_tensor *yt = em_transpose(base, 0, 1);                                  /* (4, 3) */
    cr_assert(xt && base && yt, "%s", em_last_error());
    cr_assert_eq(em_op_call_out(sq, (const em_tensor *const[]){xt}, 1, NULL,
                                (em_tensor *const[]){yt}, 1), EM_OK, "%s", em_last_error());
    /* base[i][j] = yt[j][i] = xt[j][i]^2 = x[i][j]^2 */
    for (int64_t i = 0; i < 12; i++) {
        double xv = em_test_at(x, i), bv = em_test_at(base, i);
        cr_assert_eq(bv, xv * xv, "element %lld: %g, expected %g", (long long)i, bv, xv * xv);
    }
    em_tensor_release(yt);
    em_tensor_release(base);
    em_tensor_release(xt);
    em_tensor_release(x);
}

Test(sdk, integer_input_is_refused_by_name) {
    const em_op *sq = em_op_find("square");
    cr_assert(sq, "%s", em_last_error());
    em_tensor *x = em_test_tensor(EM_I32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    em_tensor *y = NULL;
    cr_assert_eq(em_op_call(sq, (const em_tensor *const[]){x}, 1, NULL, &y), EM_ERR_DTYPE);
    cr_assert_null(y);
    em_assert_error(EM_ERR_DTYPE, "square");
    em_assert_error(EM_ERR_DTYPE, "int32");
    em_tensor_release(x);
}
