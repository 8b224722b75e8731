/*
 * test_tensor.c — tensor creation, views, copies, dtype conversion, wrapping caller memory,
 * item() and index_select, each checked against a reference computed here with plain loops
 * from the base data (shapes, strides, offsets and values), and the error messages of bad
 * input (each names what is at fault).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"

TestSuite(create, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(view, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(copy, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(wrap, .init = em_test_setup, .fini = em_test_teardown);

static const em_dtype all_dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16,
                                      EM_I32, EM_I64, EM_U8,  EM_BOOL};
#define N_DTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

/* ---- references ------------------------------------------------------------------------------ */

/* Element i of a raw buffer of dtype dt, written the C way (v must be representable: integers
 * in range, already truncated) and with the IEEE helpers for f16/bf16. */
static void raw_store(em_dtype dt, void *buf, int64_t i, double v) {
    switch (dt) {
    case EM_F32: ((float *)buf)[i] = (float)v; break;
    case EM_F64: ((double *)buf)[i] = v; break;
    case EM_F16: ((uint16_t *)buf)[i] = em_f32_to_f16((float)v); break;
    case EM_BF16: ((uint16_t *)buf)[i] = em_f32_to_bf16((float)v); break;
    case EM_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case EM_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case EM_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case EM_BOOL: ((bool *)buf)[i] = v != 0; break;
    default: cr_assert_fail("bad dtype %d", (int)dt);
    }
}

static double raw_load(em_dtype dt, const void *buf, int64_t i) {
    switch (dt) {
    case EM_F32: return ((const float *)buf)[i];
    case EM_F64: return ((const double *)buf)[i];
    case EM_F16: return em_f16_to_f32(((const uint16_t *)buf)[i]);
    case EM_BF16: return em_bf16_to_f32(((const uint16_t *)buf)[i]);
    case EM_I32: return ((const int32_t *)buf)[i];
    case EM_I64: return (double)((const int64_t *)buf)[i];
    case EM_U8: return ((const uint8_t *)buf)[i];
    case EM_BOOL: return ((const bool *)buf)[i];
    default: cr_assert_fail("bad dtype %d", (int)dt);
    }
    return 0;
}

/* All elements of t in C order as doubles, read back through to_dtype + to_host; free it. */
static double *values(const em_tensor *t) {
    int64_t n = em_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_tensor *d = em_to_dtype(t, EM_F64);
    cr_assert(d, "to_dtype: %s", em_last_error());
    cr_assert_eq(em_tensor_to_host(d, v, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    em_tensor_release(d);
    return v;
}

/* The raw bytes of t in C order (numel * element size); free it. */
static void *raw_bytes(const em_tensor *t) {
    size_t n = em_tensor_nbytes(t);
    void *b = malloc(n ? n : 1);
    cr_assert_eq(em_tensor_to_host(t, b, n), EM_OK, "%s", em_last_error());
    return b;
}

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

/* C-order multi-index of linear index lin. */
static void unravel(int64_t lin, int ndim, const int64_t *shape, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? lin % shape[d] : 0;
        lin = shape[d] ? lin / shape[d] : 0;
    }
}

/* The base tensor of the view tests: a (2, 3, 4) float32 with B(i, j, k) = 100i + 10j + k. */
static float base_data[24];
static double B(int64_t i, int64_t j, int64_t k) { return 100.0 * i + 10.0 * j + k; }
static em_tensor *make_base(void) {
    for (int i = 0; i < 24; i++) base_data[i] = (float)B(i / 12, i / 4 % 3, i % 4);
    em_tensor *t = em_from_data(base_data, 3, (const int64_t[]){2, 3, 4}, EM_F32, em_cpu());
    cr_assert(t, "from_data: %s", em_last_error());
    return t;
}

/* A float32 view v of `base`: check its geometry, then its values twice — through the library
 * (to_host) and by reading the storage with its own strides — against want (C order). */
static void check_view(const em_tensor *v, const em_tensor *base, int ndim, const int64_t *shape,
                       const int64_t *strides, int64_t offset, const double *want) {
    cr_assert(v, "view failed: %s", em_last_error());
    cr_assert(em_tensor_shares_storage(v, base), "a view must share storage");
    cr_assert_eq(em_tensor_ndim(v), ndim);
    for (int d = 0; d < ndim; d++) {
        cr_expect_eq(em_tensor_shape(v)[d], shape[d], "shape[%d] %lld != %lld", d,
                     (long long)em_tensor_shape(v)[d], (long long)shape[d]);
        if (strides)
            cr_expect_eq(em_tensor_strides(v)[d], strides[d], "stride[%d] %lld != %lld", d,
                         (long long)em_tensor_strides(v)[d], (long long)strides[d]);
    }
    if (offset >= 0) cr_expect_eq(em_tensor_offset(v), offset);
    int64_t n = em_tensor_numel(v);
    cr_assert_eq(n, numel_of(ndim, shape));
    double *got = values(v);
    const float *p = em_tensor_data(v);
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[EM_MAX_DIMS], off = 0;
        unravel(i, ndim, shape, idx);
        for (int d = 0; d < ndim; d++) off += idx[d] * em_tensor_strides(v)[d];
        cr_expect_eq(got[i], want[i], "element %lld: %g, want %g", (long long)i, got[i], want[i]);
        cr_expect_eq(p[off], (float)want[i], "strided read %lld: %g, want %g", (long long)i,
                     (double)p[off], want[i]);
    }
    free(got);
}

/* ---- creation -------------------------------------------------------------------------------- */

/* Every element of t (any dtype, contiguous) has the raw value of `want` stored as dtype dt. */
static void expect_all(const em_tensor *t, double want) {
    em_dtype dt = em_tensor_dtype(t);
    int64_t n = em_tensor_numel(t);
    void *got = raw_bytes(t);
    for (int64_t i = 0; i < n; i++)
        cr_expect_eq(raw_load(dt, got, i), want, "%s element %lld: %g, want %g",
                     em_dtype_name(dt), (long long)i, raw_load(dt, got, i), want);
    free(got);
}

static void expect_geometry(const em_tensor *t, em_dtype dt, int ndim, const int64_t *shape) {
    cr_assert(t, "creation failed: %s", em_last_error());
    cr_expect_eq(em_tensor_dtype(t), dt);
    cr_assert_eq(em_tensor_ndim(t), ndim);
    int64_t stride = 1, n = 1; /* C-order strides; a size-0 dim counts as 1, as in PyTorch */
    for (int d = ndim - 1; d >= 0; d--) {
        cr_expect_eq(em_tensor_shape(t)[d], shape[d]);
        if (shape[d] != 1)
            cr_expect_eq(em_tensor_strides(t)[d], stride, "dim %d stride %lld, want %lld", d,
                         (long long)em_tensor_strides(t)[d], (long long)stride);
        stride *= shape[d] > 1 ? shape[d] : 1;
        n *= shape[d];
    }
    cr_expect_eq(em_tensor_numel(t), n);
    cr_expect_eq(em_tensor_nbytes(t), (size_t)n * em_dtype_size(dt));
    cr_expect(em_tensor_is_contiguous(t));
    cr_expect_eq(em_tensor_offset(t), 0);
    cr_expect(em_device_equal(em_tensor_device(t), em_cpu()));
}

Test(create, zeros_ones_full_scalar_every_dtype) {
    const int64_t shape[3] = {2, 3, 5};
    for (int k = 0; k < N_DTYPES; k++) {
        em_dtype dt = all_dtypes[k];
        /* full(2.75): floats keep it (exact in every float type), ints truncate, bool is true */
        double full_want = em_dtype_is_floating(dt) ? 2.75 : dt == EM_BOOL ? 1 : 2;
        em_tensor *z = em_zeros(3, shape, dt, em_cpu()), *o = em_ones(3, shape, dt, em_cpu());
        em_tensor *f = em_full(3, shape, 2.75, dt, em_cpu()), *s = em_scalar(2.75, dt);
        em_tensor *e = em_empty(3, shape, dt, em_cpu()), *zl = em_zeros_like(o);
        em_tensor *el = em_empty_like(f);
        expect_geometry(z, dt, 3, shape);
        expect_geometry(o, dt, 3, shape);
        expect_geometry(f, dt, 3, shape);
        expect_geometry(e, dt, 3, shape);
        expect_geometry(zl, dt, 3, shape);
        expect_geometry(el, dt, 3, shape);
        expect_geometry(s, dt, 0, NULL);
        expect_all(z, 0);
        expect_all(zl, 0);
        expect_all(o, 1);
        expect_all(f, full_want);
        expect_all(s, full_want);
        cr_expect_eq(em_tensor_numel(s), 1);
        cr_expect(!em_tensor_shares_storage(zl, o));
        em_tensor *all[] = {z, o, f, s, e, zl, el};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
    }
}

Test(create, from_data_every_dtype) {
    const double src[6] = {0, 1, 2, 3, 100, 5}; /* representable in every dtype but bool */
    const int64_t shape[2] = {2, 3};
    for (int k = 0; k < N_DTYPES; k++) {
        em_dtype dt = all_dtypes[k];
        unsigned char buf[6 * 8];
        for (int i = 0; i < 6; i++) raw_store(dt, buf, i, src[i]);
        em_tensor *t = em_from_data(buf, 2, shape, dt, em_cpu());
        expect_geometry(t, dt, 2, shape);
        memset(buf, 0x5a, sizeof buf); /* from_data copies: the tensor must not see this */
        void *got = raw_bytes(t);
        for (int i = 0; i < 6; i++) {
            double want = dt == EM_BOOL ? src[i] != 0 : src[i];
            cr_expect_eq(raw_load(dt, got, i), want, "%s element %d", em_dtype_name(dt), i);
        }
        free(got);
        em_tensor_release(t);
    }
    cr_expect_null(em_from_data(NULL, 2, shape, EM_F32, em_cpu()));
    em_assert_error(EM_ERR_INVALID, "from_data");
}

Test(create, zero_size_dims) {
    const int64_t shape[3] = {2, 0, 3};
    for (int k = 0; k < N_DTYPES; k++) {
        em_tensor *t = em_ones(3, shape, all_dtypes[k], em_cpu());
        expect_geometry(t, all_dtypes[k], 3, shape);
        cr_expect_eq(em_tensor_numel(t), 0);
        cr_expect_eq(em_tensor_nbytes(t), 0);
        em_tensor *r = em_reshape(t, 2, (const int64_t[]){0, 7});
        cr_assert(r, "reshape: %s", em_last_error());
        cr_expect_eq(em_tensor_shape(r)[1], 7);
        em_tensor *tr = em_transpose(t, 0, 2), *c = em_clone(tr);
        cr_assert(c, "clone: %s", em_last_error());
        cr_expect_eq(em_tensor_shape(c)[0], 3);
        cr_expect_eq(em_tensor_numel(c), 0);
        em_tensor_release(c);
        em_tensor_release(tr);
        em_tensor_release(r);
        em_tensor_release(t);
    }
    em_tensor *t = em_zeros(1, (const int64_t[]){0}, EM_F32, em_cpu());
    float unused; /* an empty tensor copies nothing: a zero-capacity buffer is enough */
    cr_expect_eq(em_tensor_to_host(t, &unused, 0), EM_OK);
    cr_expect_null(em_view(t, 2, (const int64_t[]){-1, 0})); /* -1 is ambiguous with 0 */
    em_assert_error(EM_ERR_SHAPE, "[-1, 0]");
    em_tensor_release(t);
}

Test(create, eight_dims_max) {
    const int64_t s8[8] = {2, 1, 2, 1, 2, 1, 2, 3}, s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    em_tensor *t = em_full(8, s8, 4.0, EM_F32, em_cpu());
    expect_geometry(t, EM_F32, 8, s8);
    expect_all(t, 4.0);
    cr_expect_null(em_unsqueeze(t, 0));
    em_assert_error(EM_ERR_SHAPE, "8 dims");
    em_tensor_release(t);
    cr_expect_null(em_zeros(9, s9, EM_F32, em_cpu()));
    em_assert_error(EM_ERR_SHAPE, "9 dims");
}

Test(create, negative_size_names_the_shape) {
    cr_expect_null(em_zeros(3, (const int64_t[]){3, -2, 4}, EM_F32, em_cpu()));
    em_assert_error(EM_ERR_SHAPE, "[3, -2, 4]");
    cr_expect(strstr(em_last_error(), "-2"));
    cr_expect_null(em_empty(1, (const int64_t[]){-1}, EM_I64, em_cpu()));
    em_assert_error(EM_ERR_SHAPE, "[-1]");
}

/* ---- views ----------------------------------------------------------------------------------- */

Test(view, view_with_inferred_dim) {
    em_tensor *a = make_base();
    double want[24];
    for (int i = 0; i < 24; i++) want[i] = base_data[i]; /* a view keeps C order */
    em_tensor *v = em_view(a, 2, (const int64_t[]){-1, 4});
    check_view(v, a, 2, (const int64_t[]){6, 4}, (const int64_t[]){4, 1}, 0, want);
    em_tensor *w = em_view(a, 3, (const int64_t[]){4, -1, 3});
    check_view(w, a, 3, (const int64_t[]){4, 2, 3}, (const int64_t[]){6, 3, 1}, 0, want);
    cr_expect_null(em_view(a, 2, (const int64_t[]){5, -1}));
    em_assert_error(EM_ERR_SHAPE, "[5, -1]");
    cr_expect(strstr(em_last_error(), "24"), "%s", em_last_error());
    cr_expect_null(em_view(a, 2, (const int64_t[]){5, 5}));
    em_assert_error(EM_ERR_SHAPE, "[5, 5]");
    cr_expect(strstr(em_last_error(), "[2, 3, 4]"), "%s", em_last_error());
    cr_expect_null(em_view(a, 2, (const int64_t[]){-1, -1}));
    em_assert_error(EM_ERR_SHAPE, "-1");
    em_tensor_release(w);
    em_tensor_release(v);
    em_tensor_release(a);
}

Test(view, view_of_transposed_fails_like_pytorch) {
    const float d[6] = {0, 1, 2, 3, 4, 5};
    em_tensor *a = em_from_data(d, 2, (const int64_t[]){2, 3}, EM_F32, em_cpu());
    em_tensor *t = em_transpose(a, 0, 1); /* (3, 2), strides (1, 3) */
    cr_expect_null(em_view(t, 1, (const int64_t[]){6}));
    em_assert_error(EM_ERR_SHAPE, "em_reshape");
    cr_expect(strstr(em_last_error(), "[3, 2]"), "%s", em_last_error());
    cr_expect(strstr(em_last_error(), "[1, 3]"), "%s", em_last_error());
    cr_expect(strstr(em_last_error(), "[6]"), "%s", em_last_error());
    em_tensor_release(t);
    em_tensor_release(a);
}

Test(view, reshape_views_when_it_can_and_copies_otherwise) {
    em_tensor *a = make_base();
    double want[24];
    /* contiguous: a view */
    for (int i = 0; i < 24; i++) want[i] = base_data[i];
    em_tensor *r = em_reshape(a, 2, (const int64_t[]){3, 8});
    check_view(r, a, 2, (const int64_t[]){3, 8}, (const int64_t[]){8, 1}, 0, want);
    /* narrowed along the last dim: (2, 3, 2) with strides (12, 4, 1); splitting dim 0... */
    em_tensor *n = em_narrow(a, 2, 1, 2);
    em_tensor *rv = em_reshape(n, 4, (const int64_t[]){2, 1, 3, 2});
    int m = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) want[m++] = B(i, j, k + 1);
    check_view(rv, a, 4, (const int64_t[]){2, 1, 3, 2}, NULL, 1, want);
    /* ...but merging dims 1 and 2 of it needs a copy */
    em_tensor *rc = em_reshape(n, 2, (const int64_t[]){2, 6});
    cr_assert(rc, "%s", em_last_error());
    cr_expect(!em_tensor_shares_storage(rc, a));
    cr_expect(em_tensor_is_contiguous(rc));
    double *got = values(rc);
    for (int i = 0; i < 12; i++) cr_expect_eq(got[i], want[i], "element %d", i);
    free(got);
    /* transposed: a copy in the transposed order */
    em_tensor *t = em_transpose(a, 0, 2), *tc = em_reshape(t, 1, (const int64_t[]){-1});
    cr_assert(tc, "%s", em_last_error());
    cr_expect(!em_tensor_shares_storage(tc, a));
    got = values(tc);
    m = 0;
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 2; i++, m++) cr_expect_eq(got[m], B(i, j, k), "element %d", m);
    free(got);
    em_tensor *all[] = {tc, t, rc, rv, n, r, a};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

Test(view, permute_and_transpose) {
    em_tensor *a = make_base();
    double want[24];
    int m = 0;
    for (int k = 0; k < 4; k++) /* p(k, i, j) = a(i, j, k) */
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) want[m++] = B(i, j, k);
    em_tensor *p = em_permute(a, 3, (const int[]){2, 0, 1});
    check_view(p, a, 3, (const int64_t[]){4, 2, 3}, (const int64_t[]){1, 12, 4}, 0, want);
    em_tensor *pn = em_permute(a, 3, (const int[]){-1, 0, -2});
    check_view(pn, a, 3, (const int64_t[]){4, 2, 3}, (const int64_t[]){1, 12, 4}, 0, want);
    m = 0;
    for (int k = 0; k < 4; k++) /* t(k, j, i) = a(i, j, k) */
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 2; i++) want[m++] = B(i, j, k);
    em_tensor *t = em_transpose(a, 0, -1);
    check_view(t, a, 3, (const int64_t[]){4, 3, 2}, (const int64_t[]){1, 4, 12}, 0, want);
    cr_expect(!em_tensor_is_contiguous(t));
    cr_expect_null(em_permute(a, 3, (const int[]){0, 0, 1}));
    em_assert_error(EM_ERR_INVALID, "dim 0");
    cr_expect_null(em_permute(a, 2, (const int[]){1, 0}));
    em_assert_error(EM_ERR_SHAPE, "permute");
    em_tensor_release(t);
    em_tensor_release(pn);
    em_tensor_release(p);
    em_tensor_release(a);
}

Test(view, bad_dims_name_the_dim_and_range) {
    em_tensor *a = make_base();
    cr_expect_null(em_transpose(a, 0, 3));
    em_assert_error(EM_ERR_RANGE, "dim 3");
    cr_expect(strstr(em_last_error(), "-3..2"), "%s", em_last_error());
    cr_expect_null(em_select(a, -4, 0));
    em_assert_error(EM_ERR_RANGE, "dim -4");
    cr_expect_null(em_squeeze(a, 5));
    em_assert_error(EM_ERR_RANGE, "dim 5");
    cr_expect_null(em_unsqueeze(a, 4)); /* valid: -4..3 */
    em_assert_error(EM_ERR_RANGE, "-4..3");
    cr_expect_null(em_narrow(a, 7, 0, 1));
    em_assert_error(EM_ERR_RANGE, "dim 7");
    cr_expect_null(em_flatten(a, 2, 1));
    em_assert_error(EM_ERR_INVALID, "start_dim 2");
    cr_expect_eq(em_tensor_size(a, 3), -1);
    cr_expect_eq(em_tensor_size(a, -1), 4);
    cr_expect_eq(em_tensor_stride(a, -3), 12);
    em_tensor_release(a);
}

Test(view, narrow_and_slice) {
    em_tensor *a = make_base();
    double want[24];
    int m = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 4; k++) want[m++] = B(i, j + 1, k);
    em_tensor *n = em_narrow(a, 1, 1, 2);
    check_view(n, a, 3, (const int64_t[]){2, 2, 4}, (const int64_t[]){12, 4, 1}, 4, want);
    em_tensor *nn = em_narrow(a, -2, -2, 2); /* negative start counts from the end */
    check_view(nn, a, 3, (const int64_t[]){2, 2, 4}, (const int64_t[]){12, 4, 1}, 4, want);
    cr_expect_null(em_narrow(a, 1, 2, 2));
    em_assert_error(EM_ERR_RANGE, "size 3");
    cr_expect(strstr(em_last_error(), "start 2"), "%s", em_last_error());
    m = 0;
    for (int i = 0; i < 2; i++) /* a[:, :, -3::2] */
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 2; k++) want[m++] = B(i, j, 1 + 2 * k);
    em_tensor *s = em_slice(a, 2, -3, 100, 2);
    check_view(s, a, 3, (const int64_t[]){2, 3, 2}, (const int64_t[]){12, 4, 2}, 1, want);
    m = 0;
    for (int i = 0; i < 2; i++) /* a[:, -100:-1:2] = a[:, 0:2:2] */
        for (int k = 0; k < 4; k++) want[m++] = B(i, 0, k);
    em_tensor *s2 = em_slice(a, 1, -100, -1, 2);
    check_view(s2, a, 3, (const int64_t[]){2, 1, 4}, NULL, 0, want);
    em_tensor *e = em_slice(a, 0, 2, 1, 1); /* start past end: empty */
    cr_assert(e, "%s", em_last_error());
    cr_expect_eq(em_tensor_shape(e)[0], 0);
    cr_expect_eq(em_tensor_numel(e), 0);
    cr_expect_null(em_slice(a, 0, 0, 2, 0));
    em_assert_error(EM_ERR_INVALID, "step");
    em_tensor *all[] = {e, s2, s, nn, n, a};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

Test(view, slice_of_a_slice_1d) {
    const float d[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    em_tensor *a = em_from_data(d, 1, (const int64_t[]){10}, EM_F32, em_cpu());
    em_tensor *s = em_slice(a, 0, -7, 100, 2); /* [3, 5, 7, 9] */
    check_view(s, a, 1, (const int64_t[]){4}, (const int64_t[]){2}, 3,
               (const double[]){3, 5, 7, 9});
    em_tensor *ss = em_slice(s, 0, 1, 4, 2); /* [5, 9] */
    check_view(ss, a, 1, (const int64_t[]){2}, (const int64_t[]){4}, 5, (const double[]){5, 9});
    em_tensor *t = em_slice(a, 0, -100, -3, 3); /* [0, 3, 6] */
    check_view(t, a, 1, (const int64_t[]){3}, (const int64_t[]){3}, 0, (const double[]){0, 3, 6});
    em_tensor_release(t);
    em_tensor_release(ss);
    em_tensor_release(s);
    em_tensor_release(a);
}

Test(view, select_with_negative_index) {
    em_tensor *a = make_base();
    double want[8];
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) want[i * 4 + k] = B(i, 2, k);
    em_tensor *s = em_select(a, 1, -1);
    check_view(s, a, 2, (const int64_t[]){2, 4}, (const int64_t[]){12, 1}, 8, want);
    em_tensor *s0 = em_select(s, 0, 1), *s00 = em_select(s0, 0, -4); /* down to 0 dims */
    check_view(s00, a, 0, NULL, NULL, 20, (const double[]){B(1, 2, 0)});
    cr_expect_null(em_select(a, 0, 2));
    em_assert_error(EM_ERR_RANGE, "index 2");
    cr_expect(strstr(em_last_error(), "size 2"), "%s", em_last_error());
    cr_expect_null(em_select(a, 2, -5));
    em_assert_error(EM_ERR_RANGE, "index -5");
    em_tensor_release(s00);
    em_tensor_release(s0);
    em_tensor_release(s);
    em_tensor_release(a);
}

Test(view, expand_with_stride_zero) {
    const float d[3] = {1, 2, 3};
    em_tensor *c = em_from_data(d, 2, (const int64_t[]){3, 1}, EM_F32, em_cpu());
    double want[24];
    for (int i = 0; i < 24; i++) want[i] = d[i / 4 % 3];
    em_tensor *e = em_expand(c, 3, (const int64_t[]){2, 3, 4});
    check_view(e, c, 3, (const int64_t[]){2, 3, 4}, (const int64_t[]){0, 1, 0}, 0, want);
    cr_expect(!em_tensor_is_contiguous(e));
    em_tensor *k = em_expand(c, 2, (const int64_t[]){-1, 5});
    for (int i = 0; i < 15; i++) want[i] = d[i / 5];
    check_view(k, c, 2, (const int64_t[]){3, 5}, (const int64_t[]){1, 0}, 0, want);
    em_tensor *x = em_zeros(2, (const int64_t[]){3, 2}, EM_F32, em_cpu());
    cr_expect_null(em_expand(x, 2, (const int64_t[]){3, 4}));
    em_assert_error(EM_ERR_SHAPE, "[3, 2]");
    cr_expect(strstr(em_last_error(), "[3, 4]"), "%s", em_last_error());
    cr_expect_null(em_expand(x, 1, (const int64_t[]){6}));
    em_assert_error(EM_ERR_SHAPE, "expand");
    em_tensor_release(x);
    em_tensor_release(k);
    em_tensor_release(e);
    em_tensor_release(c);
}

Test(view, squeeze_unsqueeze_flatten) {
    const float d[6] = {1, 2, 3, 4, 5, 6};
    double want[6] = {1, 2, 3, 4, 5, 6};
    em_tensor *a = em_from_data(d, 4, (const int64_t[]){1, 3, 1, 2}, EM_F32, em_cpu());
    em_tensor *s0 = em_squeeze(a, 0), *s1 = em_squeeze(a, 1), *s2 = em_squeeze(a, -2);
    em_tensor *sa = em_squeeze_all(a);
    check_view(s0, a, 3, (const int64_t[]){3, 1, 2}, NULL, 0, want);
    check_view(s1, a, 4, (const int64_t[]){1, 3, 1, 2}, NULL, 0, want); /* size 3: no-op */
    check_view(s2, a, 3, (const int64_t[]){1, 3, 2}, NULL, 0, want);
    check_view(sa, a, 2, (const int64_t[]){3, 2}, (const int64_t[]){2, 1}, 0, want);
    em_tensor *u0 = em_unsqueeze(sa, 0), *u1 = em_unsqueeze(sa, -1), *u2 = em_unsqueeze(sa, 1);
    check_view(u0, a, 3, (const int64_t[]){1, 3, 2}, NULL, 0, want);
    check_view(u1, a, 3, (const int64_t[]){3, 2, 1}, NULL, 0, want);
    check_view(u2, a, 3, (const int64_t[]){3, 1, 2}, NULL, 0, want);
    cr_expect(em_tensor_is_contiguous(u2));
    em_tensor *f = em_flatten(a, 1, -1), *fa = em_flatten(a, 0, 3);
    check_view(f, a, 2, (const int64_t[]){1, 6}, NULL, 0, want);
    check_view(fa, a, 1, (const int64_t[]){6}, (const int64_t[]){1}, 0, want);
    /* flatten of a transposed tensor copies, in the transposed order */
    em_tensor *t = em_transpose(sa, 0, 1), *ft = em_flatten(t, 0, 1);
    cr_assert(ft, "%s", em_last_error());
    cr_expect(!em_tensor_shares_storage(ft, a));
    double *got = values(ft);
    const double tw[6] = {1, 3, 5, 2, 4, 6};
    for (int i = 0; i < 6; i++) cr_expect_eq(got[i], tw[i], "element %d", i);
    free(got);
    em_tensor *all[] = {ft, t, fa, f, u2, u1, u0, sa, s2, s1, s0, a};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

Test(view, writes_through_views_reach_the_base_and_bump_the_version) {
    em_tensor *a = make_base();
    em_tensor *row = em_select(a, 0, 1), *t = em_transpose(a, 0, 2);
    uint64_t v0 = em_tensor_version(a);
    cr_expect_eq(em_tensor_version(row), v0);
    cr_assert_eq(em_fill_(row, -7.0), EM_OK, "%s", em_last_error());
    uint64_t v1 = em_tensor_version(a);
    cr_expect_gt(v1, v0);
    cr_expect_eq(em_tensor_version(row), v1);
    cr_expect_eq(em_tensor_version(t), v1);
    em_tensor *one = em_scalar(1.0, EM_F32);
    cr_assert_eq(em_add_(t, one), EM_OK, "%s", em_last_error()); /* through a strided view */
    cr_expect_gt(em_tensor_version(a), v1);
    double *got = values(a);
    for (int i = 0; i < 24; i++)
        cr_expect_eq(got[i], (i >= 12 ? -7.0 : base_data[i]) + 1.0, "element %d", i);
    free(got);
    /* a write outside Ember, recorded by hand */
    uint64_t v2 = em_tensor_version(a);
    ((float *)em_tensor_data(row))[3] = 42.0f; /* a(1, 0, 3) */
    em_tensor_bump_version(row);
    cr_expect_eq(em_tensor_version(a), v2 + 1);
    cr_expect_eq(em_test_at(a, 15), 42.0);
    em_tensor_release(one);
    em_tensor_release(t);
    em_tensor_release(row);
    em_tensor_release(a);
}

Test(view, is_contiguous) {
    em_tensor *a = make_base();
    em_tensor *r0 = em_narrow(a, 0, 1, 1), *r1 = em_narrow(a, 1, 0, 2), *c = em_narrow(a, 2, 0, 2);
    em_tensor *t = em_transpose(a, 1, 2), *s = em_select(a, 2, 0), *u = em_unsqueeze(a, 1);
    em_tensor *x = em_expand(r0, 3, (const int64_t[]){5, 3, 4}), *x1 = em_select(x, 0, 0);
    cr_expect(em_tensor_is_contiguous(a));
    cr_expect(em_tensor_is_contiguous(r0));
    cr_expect(!em_tensor_is_contiguous(r1)); /* a(:, 0:2, :) skips a row per block */
    cr_expect(!em_tensor_is_contiguous(c));
    cr_expect(!em_tensor_is_contiguous(t));
    cr_expect(!em_tensor_is_contiguous(s));
    cr_expect(em_tensor_is_contiguous(u));
    cr_expect(!em_tensor_is_contiguous(x));
    cr_expect(em_tensor_is_contiguous(x1));
    em_tensor *all[] = {x1, x, u, s, t, c, r1, r0, a};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

/* ---- copies ---------------------------------------------------------------------------------- */

Test(copy, contiguous_and_clone) {
    em_tensor *a = make_base();
    em_tensor *c = em_contiguous(a);
    cr_expect_eq(c, a, "contiguous of a contiguous tensor is the tensor itself");
    em_tensor_release(c);
    em_tensor *t = em_transpose(a, 0, 1), *tc = em_contiguous(t), *cl = em_clone(a);
    em_tensor *tcl = em_clone(t);
    cr_assert(tc && cl && tcl, "%s", em_last_error());
    cr_expect(!em_tensor_shares_storage(tc, a));
    cr_expect(!em_tensor_shares_storage(cl, a));
    cr_expect(!em_tensor_shares_storage(tcl, a));
    cr_expect(em_tensor_is_contiguous(tc));
    cr_expect(em_tensor_is_contiguous(tcl));
    double *g1 = values(tc), *g2 = values(tcl), *g3 = values(cl);
    int m = 0;
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 4; k++, m++) {
                cr_expect_eq(g1[m], B(i, j, k), "contiguous element %d", m);
                cr_expect_eq(g2[m], B(i, j, k), "clone element %d", m);
            }
    for (int i = 0; i < 24; i++) cr_expect_eq(g3[i], base_data[i]);
    free(g1), free(g2), free(g3);
    uint64_t v = em_tensor_version(a);
    cr_assert_eq(em_fill_(cl, 0.0), EM_OK);
    cr_expect_eq(em_tensor_version(a), v, "writing a clone leaves the original's version");
    g1 = values(a);
    for (int i = 0; i < 24; i++) cr_expect_eq(g1[i], base_data[i], "the clone is a copy");
    free(g1);
    em_tensor *all[] = {tcl, cl, tc, t, a};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

/* The source values of the conversion test, before storing them in the source dtype. */
static const double conv_src[] = {0, 1, -1, 2.5, -2.5, 1.7, -0.6, 100.3, 127, 0.3333,
                                  -7.75, 3e4};
#define N_CONV ((int)(sizeof conv_src / sizeof conv_src[0]))

/* v as the source dtype holds it: integers truncate (uint8 takes |v|), bool is v != 0. */
static double as_source(em_dtype dt, double v) {
    if (dt == EM_BOOL) return v != 0;
    if (dt == EM_U8) return fmin(trunc(fabs(v)), 255);
    if (em_dtype_is_integral(dt)) return trunc(v);
    return v;
}

/* The raw element of dtype `to` converted from the source value s (already exact in the
 * source dtype), per em_to_dtype's contract. */
static void ref_convert(em_dtype to, void *buf, int64_t i, double s) {
    if (to == EM_BOOL || em_dtype_is_floating(to)) raw_store(to, buf, i, s);
    else raw_store(to, buf, i, trunc(s)); /* toward zero */
}

static void check_conversion(em_dtype from, em_dtype to, const em_tensor *src, const void *sraw,
                             int64_t n) {
    em_tensor *d = em_to_dtype(src, to);
    cr_assert(d, "%s -> %s: %s", em_dtype_name(from), em_dtype_name(to), em_last_error());
    cr_expect_eq(em_tensor_dtype(d), to);
    if (from == to) cr_expect_eq(d, src, "to_dtype to its own dtype is the tensor itself");
    else cr_expect(!em_tensor_shares_storage(d, src));
    unsigned char *got = raw_bytes(d), want[8];
    size_t e = em_dtype_size(to);
    for (int64_t i = 0; i < n; i++) {
        double s = raw_load(from, sraw, i);
        bool out_of_range = to == EM_U8 ? s < 0 || s >= 256
                                         : em_dtype_is_integral(to) && fabs(s) >= 32767;
        if (out_of_range) continue; /* not specified */
        ref_convert(to, want, 0, s);
        cr_expect(memcmp(got + (size_t)i * e, want, e) == 0, "%s %g -> %s: got %g, want %g",
                  em_dtype_name(from), s, em_dtype_name(to), raw_load(to, got, i),
                  raw_load(to, want, 0));
    }
    free(got);
    em_tensor_release(d);
}

Test(copy, to_dtype_between_all_dtypes) {
    for (int a = 0; a < N_DTYPES; a++) {
        em_dtype from = all_dtypes[a];
        unsigned char sraw[N_CONV * 8];
        for (int i = 0; i < N_CONV; i++) raw_store(from, sraw, i, as_source(from, conv_src[i]));
        em_tensor *src = em_from_data(sraw, 1, (const int64_t[]){N_CONV}, from, em_cpu());
        cr_assert(src, "%s", em_last_error());
        for (int b = 0; b < N_DTYPES; b++) check_conversion(from, all_dtypes[b], src, sraw, N_CONV);
        em_tensor_release(src);
    }
}

/* The typed conversion loops (f32 <-> bf16/f16/f64, half -> f64), vectorised, against the
 * core's scalar conversions bit for bit, over 4099 floats from random bit patterns plus NaN,
 * infinities, signed zeros, subnormals and bf16 rounding ties. */
Test(copy, float_conversions_match_the_scalar_ones_bit_for_bit) {
    enum { N = 4099 };
    float *f = malloc(sizeof(float) * N);
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t bits = (uint32_t)(x >> 32);
        memcpy(&f[i], &bits, sizeof bits);
    }
    const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-45f,
                             65504.0f, 65520.0f, 1.0f + 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-23f,
                             1.0f + 0x3p-8f, 3.4e38f};
    memcpy(f, special, sizeof special);
    em_tensor *t = em_from_data(f, 1, (const int64_t[]){N}, EM_F32, em_cpu());
    em_tensor *b = em_to_dtype(t, EM_BF16), *h = em_to_dtype(t, EM_F16),
              *d = em_to_dtype(t, EM_F64);
    cr_assert(b && h && d, "%s", em_last_error());
    em_tensor *bf = em_to_dtype(b, EM_F32), *hf = em_to_dtype(h, EM_F32),
              *df = em_to_dtype(d, EM_F32), *bd = em_to_dtype(b, EM_F64),
              *hd = em_to_dtype(h, EM_F64);
    cr_assert(bf && hf && df && bd && hd, "%s", em_last_error());
    const uint16_t *bv = em_tensor_data(b), *hv = em_tensor_data(h);
    const float *bfv = em_tensor_data(bf), *hfv = em_tensor_data(hf), *dfv = em_tensor_data(df);
    const double *dv = em_tensor_data(d), *bdv = em_tensor_data(bd), *hdv = em_tensor_data(hd);
    for (int i = 0; i < N; i++) {
        uint16_t wb = em_f32_to_bf16(f[i]), wh = em_f32_to_f16(f[i]);
        cr_assert_eq(bv[i], wb, "f32 %a -> bf16: %#x, want %#x", f[i], bv[i], wb);
        cr_assert_eq(hv[i], wh, "f32 %a -> f16: %#x, want %#x", f[i], hv[i], wh);
        float rb = em_bf16_to_f32(wb), rh = em_f16_to_f32(wh);
        cr_assert(memcmp(&bfv[i], &rb, 4) == 0, "bf16 %#x -> f32: %a, want %a", wb, bfv[i], rb);
        cr_assert(memcmp(&hfv[i], &rh, 4) == 0, "f16 %#x -> f32: %a, want %a", wh, hfv[i], rh);
        cr_assert(isnan(f[i]) ? isnan(dv[i]) && isnan(dfv[i])
                              : dv[i] == (double)f[i] && memcmp(&dfv[i], &f[i], 4) == 0,
                  "f32 %a <-> f64", f[i]);
        cr_assert(isnan(rb) ? isnan(bdv[i]) : bdv[i] == (double)rb, "bf16 -> f64 at %d", i);
        cr_assert(isnan(rh) ? isnan(hdv[i]) : hdv[i] == (double)rh, "f16 -> f64 at %d", i);
    }
    em_tensor *all[] = {hd, bd, df, hf, bf, d, h, b, t};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
    free(f);
}

Test(copy, to_dtype_of_a_strided_view) {
    em_tensor *a = make_base();
    em_tensor *t = em_transpose(a, 0, 2), *s = em_slice(t, 0, 1, 4, 2); /* (2, 3, 2) */
    em_tensor *h = em_to_dtype(s, EM_I32), *f = em_to_dtype(s, EM_F16);
    cr_assert(h && f, "%s", em_last_error());
    void *hi = raw_bytes(h), *fh = raw_bytes(f);
    int m = 0;
    for (int k = 1; k < 4; k += 2)
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < 2; i++, m++) {
                cr_expect_eq(((int32_t *)hi)[m], (int32_t)B(i, j, k), "int32 element %d", m);
                cr_expect_eq(((uint16_t *)fh)[m], em_f32_to_f16((float)B(i, j, k)),
                             "float16 element %d", m);
            }
    free(hi), free(fh);
    em_tensor *all[] = {f, h, s, t, a};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

Test(copy, item) {
    for (int k = 0; k < N_DTYPES; k++) {
        em_tensor *s = em_scalar(3.0, all_dtypes[k]);
        double v = 0;
        cr_expect_eq(em_tensor_item(s, &v), EM_OK, "%s", em_last_error());
        cr_expect_eq(v, all_dtypes[k] == EM_BOOL ? 1.0 : 3.0, "%s", em_dtype_name(all_dtypes[k]));
        cr_expect_eq(em_item(s), v);
        em_tensor_release(s);
    }
    em_tensor *a = make_base();
    cr_assert_eq(em_scope_begin(), EM_OK); /* the intermediate views belong to the scope */
    em_tensor *x = em_narrow(em_narrow(em_select(a, 1, 2), 1, 3, 1), 0, 1, 1); /* (1, 1) */
    cr_expect_eq(em_item(x), B(1, 2, 3));
    cr_expect(isnan(em_item(em_select(a, 0, 0))));
    em_assert_error(EM_ERR_SHAPE, "[3, 4]");
    double v = 0;
    cr_expect_eq(em_tensor_item(a, &v), EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "[2, 3, 4]");
    cr_assert_eq(em_scope_end(), EM_OK);
    em_tensor_release(a);
}

Test(copy, copy_broadcasts_and_converts_into_a_strided_destination) {
    em_tensor *base = em_zeros(2, (const int64_t[]){4, 3}, EM_F64, em_cpu());
    em_tensor *dst = em_transpose(base, 0, 1); /* (3, 4), strides (1, 3) */
    const int32_t row[4] = {1, -2, 3, -4};
    em_tensor *src = em_from_data(row, 1, (const int64_t[]){4}, EM_I32, em_cpu());
    uint64_t v = em_tensor_version(base);
    cr_assert_eq(em_copy_(dst, src), EM_OK, "%s", em_last_error());
    cr_expect_gt(em_tensor_version(base), v);
    double *got = values(base); /* base(j, i) = dst(i, j) = row[j] */
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 3; i++) cr_expect_eq(got[j * 3 + i], row[j], "base(%d, %d)", j, i);
    free(got);
    /* a half source into an int destination slice, every other column */
    em_tensor *ib = em_full(2, (const int64_t[]){2, 6}, -1.0, EM_I64, em_cpu());
    em_tensor *is = em_slice(ib, 1, 0, 6, 2);
    em_tensor *h = em_full(2, (const int64_t[]){2, 1}, 2.75, EM_F16, em_cpu());
    cr_assert_eq(em_copy_(is, h), EM_OK, "%s", em_last_error());
    got = values(ib);
    for (int i = 0; i < 12; i++) cr_expect_eq(got[i], i % 2 ? -1.0 : 2.0, "element %d", i);
    free(got);
    cr_expect_eq(em_copy_(dst, h), EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "[2, 1]");
    cr_expect(strstr(em_last_error(), "[3, 4]"), "%s", em_last_error());
    em_tensor *all[] = {h, is, ib, src, dst, base};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

Test(copy, index_select_copies) {
    em_tensor *a = make_base();
    const int64_t idx[3] = {2, 0, 2};
    em_tensor *ix = em_from_data(idx, 1, (const int64_t[]){3}, EM_I64, em_cpu());
    em_tensor *r = em_index_select(a, 1, ix);
    cr_assert(r, "%s", em_last_error());
    cr_expect(!em_tensor_shares_storage(r, a), "index_select returns a copy");
    cr_assert_eq(em_tensor_ndim(r), 3);
    cr_expect_eq(em_tensor_shape(r)[1], 3);
    double *got = values(r);
    int m = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++, m++) cr_expect_eq(got[m], B(i, idx[j], k), "element %d", m);
    free(got);
    cr_assert_eq(em_fill_(r, 0.0), EM_OK);
    cr_expect_eq(em_test_at(a, 8), B(0, 2, 0), "writing the copy leaves the source");
    /* int32 index along the last dim of a transposed view */
    const int32_t idx32[2] = {3, 1};
    em_tensor *ix32 = em_from_data(idx32, 1, (const int64_t[]){2}, EM_I32, em_cpu());
    em_tensor *t = em_transpose(a, 0, 1), *r2 = em_index_select(t, -1, ix32); /* (3, 2, 2) */
    cr_assert(r2, "%s", em_last_error());
    got = values(r2);
    m = 0;
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < 2; i++)
            for (int k = 0; k < 2; k++, m++)
                cr_expect_eq(got[m], B(i, j, idx32[k]), "element %d", m);
    free(got);
    const int64_t bad[2] = {0, 5};
    em_tensor *ixb = em_from_data(bad, 1, (const int64_t[]){2}, EM_I64, em_cpu());
    cr_expect_null(em_index_select(a, 2, ixb));
    em_assert_error(EM_ERR_RANGE, "index 5");
    cr_expect(strstr(em_last_error(), "size 4"), "%s", em_last_error());
    const int64_t neg[1] = {-1}; /* PyTorch refuses negative indices here too */
    em_tensor *ixn = em_from_data(neg, 1, (const int64_t[]){1}, EM_I64, em_cpu());
    cr_expect_null(em_index_select(a, 2, ixn));
    em_assert_error(EM_ERR_RANGE, "index -1 is out of range");
    em_tensor *all[] = {ixn, ixb, r2, t, ix32, r, ix, a};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) em_tensor_release(all[i]);
}

/* Element i (C order) of view v of base, read from base's own bytes through v's strides and
 * offset: the plain-loop reference for copies between layouts. */
static void strided_ref(const em_tensor *v, const unsigned char *base, size_t e, unsigned char *out) {
    int nd = em_tensor_ndim(v);
    const int64_t *sh = em_tensor_shape(v), *st = em_tensor_strides(v);
    int64_t n = em_tensor_numel(v);
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = em_tensor_offset(v);
        for (int d = nd - 1; d >= 0; d--) {
            off += rem % sh[d] * st[d];
            rem /= sh[d];
        }
        memcpy(out + (size_t)i * e, base + (size_t)off * e, e);
    }
}

/* Copies between dense layouts that transpose two dims (a channels-last activation made
 * row-major for a flatten, and back; permuted, transposed and sliced views; a copy into a
 * transposed destination) move every element's bits, against the plain strided loop, for
 * every element size, odd sizes and tails of the CPU kernel's tiles included; random bit
 * patterns (NaN payloads, subnormals) too. */
Test(copy, transposing_copies_move_the_bits) {
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64, EM_U8};
    static const int64_t shapes[][4] = {{2, 64, 7, 7}, {3, 17, 5, 9}, {1, 33, 31, 3},
                                        {2, 16, 16, 16}, {4, 3, 40, 40}, {1, 100, 1, 70},
                                        {2, 1, 9, 9}};
    uint64_t seed = 12345;
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            cr_assert_eq(em_scope_begin(), EM_OK);
            const em_dtype dt = dts[k];
            const int64_t *sh = shapes[s], n = sh[0] * sh[1] * sh[2] * sh[3];
            const size_t e = em_dtype_size(dt), nb = (size_t)n * e;
            unsigned char *bits = malloc(nb), *want = malloc(nb), *got = malloc(nb);
            for (size_t i = 0; i < nb; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                bits[i] = (unsigned char)(seed >> 56);
            }
            em_tensor *x = em_from_data(bits, 4, sh, dt, em_cpu());
            cr_assert(x, "%s", em_last_error());
            const unsigned char *xb = em_tensor_data(x);
            char what[96];
            snprintf(what, sizeof what, "%s [%lld, %lld, %lld, %lld]", em_dtype_name(dt),
                     (long long)sh[0], (long long)sh[1], (long long)sh[2], (long long)sh[3]);
            /* channels-last: its storage holds x's elements in (N, H, W, C) order */
            em_tensor *xl = em_channels_last(x);
            cr_assert(xl, "%s", em_last_error());
            strided_ref(em_permute(x, 4, (const int[]){0, 2, 3, 1}), xb, e, want);
            cr_assert(memcmp(em_tensor_data(xl), want, nb) == 0, "%s: channels-last copy", what);
            /* and back: the flatten's row-major copy */
            em_tensor *back = em_contiguous(xl);
            cr_assert(back && em_tensor_is_contiguous(back), "%s", em_last_error());
            cr_assert(memcmp(em_tensor_data(back), xb, nb) == 0, "%s: row-major copy", what);
            /* views with other dims outside the transposed pair, and strides that skip */
            em_tensor *views[] = {em_transpose(x, 1, 3), em_permute(x, 4, (const int[]){2, 0, 3, 1}),
                                  em_slice(em_transpose(x, 1, 2), 0, 0, sh[0], 1),
                                  em_slice(em_transpose(x, 2, 3), 1, 1, sh[1], 2),
                                  em_transpose(em_reshape(x, 2, (const int64_t[]){sh[0] * sh[1],
                                                                                  sh[2] * sh[3]}), 0, 1)};
            for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) {
                cr_assert(views[v], "%s", em_last_error());
                em_tensor *c = em_contiguous(views[v]);
                cr_assert(c && em_tensor_is_contiguous(c), "%s", em_last_error());
                size_t vb = (size_t)em_tensor_numel(c) * e;
                strided_ref(views[v], xb, e, want);
                cr_assert(memcmp(em_tensor_data(c), want, vb) == 0, "%s: view %zu", what, v);
            }
            /* into a transposed destination: dst^T = x^T (2-D) */
            int64_t r = sh[0] * sh[1], cdim = sh[2] * sh[3];
            em_tensor *dbase = em_empty(2, (const int64_t[]){cdim, r}, dt, em_cpu());
            em_tensor *src = em_reshape(x, 2, (const int64_t[]){r, cdim});
            cr_assert_eq(em_copy_(em_transpose(dbase, 0, 1), src), EM_OK, "%s", em_last_error());
            memcpy(got, em_tensor_data(dbase), nb);
            strided_ref(em_transpose(src, 0, 1), xb, e, want);
            cr_assert(memcmp(got, want, nb) == 0, "%s: copy into a transposed destination", what);
            free(bits), free(want), free(got);
            cr_assert_eq(em_scope_end(), EM_OK); /* drops the tensors made above */
        }
}

Test(copy, null_inputs_chain_and_keep_the_first_error) {
    em_tensor *x = em_ones(2, (const int64_t[]){2, 3}, EM_F32, em_cpu());
    em_tensor *w = em_ones(2, (const int64_t[]){4, 5}, EM_F32, em_cpu());
    em_clear_error();
    em_tensor *y = em_relu(em_add(em_matmul(x, w), x));
    cr_expect_null(y);
    em_assert_error(EM_ERR_SHAPE, "matmul: shapes [2, 3] and [4, 5]");
    em_tensor *z = em_sum(em_exp(em_view(x, 1, (const int64_t[]){7})), 0, NULL, false);
    cr_expect_null(z);
    em_assert_error(EM_ERR_SHAPE, "view");
    cr_expect_eq(em_add_(x, NULL), EM_ERR_SHAPE, "in-place ops report the pending error");
    em_assert_error(EM_ERR_SHAPE, "view");
    em_tensor_release(w);
    em_tensor_release(x);
}

/* ---- wrapping caller memory ------------------------------------------------------------------ */

typedef struct release_log {
    int calls;
    void *data, *user;
} release_log;

static void on_release(void *data, void *user) {
    release_log *l = user;
    l->calls++;
    l->data = data;
    l->user = user;
}

Test(wrap, release_runs_once_after_the_last_view) {
    float buf[6] = {0, 1, 2, 3, 4, 5};
    release_log log = {0};
    em_tensor *t = em_tensor_wrap(buf, 2, (const int64_t[]){2, 3}, NULL, EM_F32, em_cpu(),
                                  on_release, &log);
    cr_assert(t, "%s", em_last_error());
    cr_expect_eq(em_tensor_data(t), (void *)buf, "no copy");
    em_tensor *v = em_transpose(t, 0, 1);
    buf[4] = 42; /* caller -> tensor */
    cr_expect_eq(em_test_at(v, 3), 42.0); /* v(1, 1) = t(1, 1) */
    em_tensor *col = em_select(v, 0, 2); /* t(:, 2) */
    cr_assert_eq(em_fill_(col, -1.0), EM_OK);
    em_tensor_release(col);
    cr_expect_eq(buf[2], -1.0f); /* tensor -> caller */
    cr_expect_eq(buf[5], -1.0f);
    cr_expect_eq(buf[1], 1.0f);
    em_tensor_release(t);
    cr_expect_eq(log.calls, 0, "a view still uses the memory");
    em_tensor_release(v);
    cr_expect_eq(log.calls, 1);
    cr_expect_eq(log.data, (void *)buf);
    cr_expect_eq(log.user, (void *)&log);
}

Test(wrap, with_strides) {
    /* (3, 2) over every other element of rows of 4: t(i, j) = buf[4i + 2j] */
    double buf[12];
    for (int i = 0; i < 12; i++) buf[i] = 10 + i;
    release_log log = {0};
    em_tensor *t = em_tensor_wrap(buf, 2, (const int64_t[]){3, 2}, (const int64_t[]){4, 2},
                                  EM_F64, em_cpu(), on_release, &log);
    cr_assert(t, "%s", em_last_error());
    cr_expect_eq(em_tensor_strides(t)[0], 4);
    cr_expect_eq(em_tensor_strides(t)[1], 2);
    cr_expect(!em_tensor_is_contiguous(t));
    double *got = values(t);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) cr_expect_eq(got[i * 2 + j], buf[4 * i + 2 * j]);
    free(got);
    em_tensor *two = em_scalar(2.0, EM_F64);
    cr_assert_eq(em_mul_(t, two), EM_OK, "%s", em_last_error());
    for (int i = 0; i < 12; i++) {
        bool in_view = i % 2 == 0 && i % 4 <= 2;
        cr_expect_eq(buf[i], in_view ? 2.0 * (10 + i) : 10 + i, "buf[%d]", i);
    }
    em_tensor_release(two);
    em_tensor_release(t);
    cr_expect_eq(log.calls, 1);
}

Test(wrap, errors_do_not_call_release) {
    float buf[4] = {0};
    release_log log = {0};
    cr_expect_null(em_tensor_wrap(buf, 2, (const int64_t[]){2, -2}, NULL, EM_F32, em_cpu(),
                                  on_release, &log));
    em_assert_error(EM_ERR_SHAPE, "[2, -2]");
    cr_expect_null(em_tensor_wrap(NULL, 1, (const int64_t[]){4}, NULL, EM_F32, em_cpu(),
                                  on_release, &log));
    em_assert_error(EM_ERR_INVALID, "NULL data");
    cr_expect_null(em_tensor_wrap(buf, 1, (const int64_t[]){2}, (const int64_t[]){-1}, EM_F32,
                                  em_cpu(), on_release, &log));
    em_assert_error(EM_ERR_INVALID, "stride -1");
    /* Misaligned memory would be undefined behaviour in every kernel: refused up front. */
    cr_expect_null(em_tensor_wrap((char *)buf + 2, 1, (const int64_t[]){1}, NULL, EM_F32,
                                  em_cpu(), on_release, &log));
    em_assert_error(EM_ERR_INVALID, "not aligned to the 4 bytes of a float32 element");
    cr_expect_eq(log.calls, 0);
}

Test(create, shapes_too_large_for_int64_strides_are_refused, .init = em_test_setup,
     .fini = em_test_teardown) {
    /* Zero elements, but the strides of the non-zero dims would overflow int64. */
    int64_t shape[3] = {0, (int64_t)1 << 62, (int64_t)1 << 62};
    cr_assert_null(em_empty(3, shape, EM_F32, em_cpu()));
    em_assert_error(EM_ERR_SHAPE, "more than 2^63 elements");
}
