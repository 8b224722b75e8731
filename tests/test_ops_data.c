/*
 * test_ops_data.c — the data movement ops (cat, stack, split, split_sizes, chunk, pad, gather,
 * scatter, scatter_add, index_add, embedding, embedding_backward, masked_fill, one_hot, tril,
 * triu, flip, linspace) against plain-loop references written here, for every dtype, on
 * contiguous, transposed (every dim reversed), sliced (step 2) and expanded (stride 0) inputs,
 * zero-size tensors, and every error case (status and message text).
 *
 * Tolerances. Data movement copies elements, so results are compared EXACTLY (rtol = atol =
 * 0) in every dtype. Accumulating ops (scatter_add, index_add, embedding_backward) are
 * compared exactly too: the references add in the same order as the documented sequential
 * one, rounding to the dtype after each addition (f16/bf16: once per addition, as the
 * kernels do); the small dyadic test values make every addition exact anyway. The
 * determinism tests use random f32 values whose sums DO depend on the order: they must be
 * bitwise equal to a float loop in the sequential order, for 1, 2 and 4 threads.
 * linspace: rtol/atol relative to max(|start|, |end|) of 1e-15 (f64), 1e-6 (f32), 2^-10
 * (f16), 2^-7 (bf16), with the end points exact; integer dtypes exact against PyTorch's
 * values (tests/fixtures/gen_data.py prints them).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"

TestSuite(cat, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(stack, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(split, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(pad, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(gather, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(scatter, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(index_add, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(embedding, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(masked_fill, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(one_hot, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(tri, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(flip, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(linspace, .init = em_test_setup, .fini = em_test_teardown);

static const em_dtype all_dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16,
                                      EM_I32, EM_I64, EM_U8,  EM_BOOL};
#define N_DTYPES ((int)(sizeof all_dtypes / sizeof all_dtypes[0]))

/* ---- references and helpers ------------------------------------------------------------------ */

/* v rounded once to dtype dt, as a double (integers wrap like C casts, bool is v != 0). */
static double round_to(em_dtype dt, double v) {
    switch (dt) {
    case EM_F32: return (float)v;
    case EM_F64: return v;
    case EM_F16: return em_f16_to_f32(em_f32_to_f16((float)v));
    case EM_BF16: return em_bf16_to_f32(em_f32_to_bf16((float)v));
    case EM_I32: return (int32_t)(int64_t)v;
    case EM_I64: return (double)(int64_t)v;
    case EM_U8: return (uint8_t)(int64_t)v;
    case EM_BOOL: return v != 0;
    default: cr_assert_fail("bad dtype");
    }
    return 0;
}

/* Test value number i of stream `seed` for dtype dt: small dyadic floats (exact in f16 and
 * bf16, never 0), small integers (negative too), or bools. */
static double gen(em_dtype dt, int64_t i, int seed) {
    int64_t k = (i * 37 + seed * 11 + 5) % 23;
    if (em_dtype_is_floating(dt)) return (double)(k - 11) * 0.25 + 0.125;
    if (dt == EM_BOOL) return k % 3 == 0;
    if (dt == EM_U8) return (double)k;
    return (double)(k - 11);
}

static int64_t numel_of(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    return n;
}

/* C-order coordinates of linear index lin, and back. */
static void coords_of(int nd, const int64_t *shape, int64_t lin, int64_t *c) {
    for (int d = nd - 1; d >= 0; d--) {
        c[d] = shape[d] ? lin % shape[d] : 0;
        lin = shape[d] ? lin / shape[d] : 0;
    }
}
static int64_t lin_of(int nd, const int64_t *shape, const int64_t *c) {
    int64_t lin = 0;
    for (int d = 0; d < nd; d++) lin = lin * shape[d] + c[d];
    return lin;
}

typedef enum layout { CONTIG, TRANSPOSED, SLICED, N_LAYOUTS } layout;
static const char *const layout_name[] = {"contiguous", "transposed", "sliced"};

/* A tensor of `shape` whose elements in C order are gen(dt, i, seed), laid out as `lay`:
 * contiguous, every dim reversed in memory (a permuted view), or every other element of a
 * wider last dim (a step-2 slice). Owned by the caller's scope. */
static em_tensor *make(em_dtype dt, int nd, const int64_t *shape, int seed, layout lay) {
    int64_t n = numel_of(nd, shape);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = gen(dt, i, seed);
    em_tensor *c = em_test_tensor(dt, nd, shape, v);
    free(v);
    if (lay == CONTIG || nd == 0) return c;
    int64_t ws[EM_MAX_DIMS];
    em_tensor *t;
    if (lay == TRANSPOSED && nd >= 2) {
        int perm[EM_MAX_DIMS];
        for (int d = 0; d < nd; d++) ws[d] = shape[nd - 1 - d], perm[d] = nd - 1 - d;
        t = em_permute(em_zeros(nd, ws, dt, em_cpu()), nd, perm);
    } else {
        memcpy(ws, shape, sizeof(int64_t) * (size_t)nd);
        ws[nd - 1] = 2 * shape[nd - 1] + 1;
        t = em_slice(em_zeros(nd, ws, dt, em_cpu()), nd - 1, 1, ws[nd - 1], 2);
    }
    cr_assert(t, "layout: %s", em_last_error());
    cr_assert_eq(em_copy_(t, c), EM_OK, "%s", em_last_error());
    if (n > 1 && shape[nd - 1] > 1) cr_assert(!em_tensor_is_contiguous(t));
    return t;
}

static em_tensor *make_i64(int nd, const int64_t *shape, const int64_t *v) {
    em_tensor *t = em_from_data(v, nd, shape, EM_I64, em_cpu());
    cr_assert(t, "from_data: %s", em_last_error());
    return t;
}

/* All elements of t in C order as doubles; free() it. */
static double *vals(const em_tensor *t) {
    cr_assert(t, "%s", em_last_error());
    int64_t n = em_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_tensor *d = em_to_dtype(t, EM_F64);
    cr_assert(d, "to_dtype: %s", em_last_error());
    cr_assert_eq(em_tensor_to_host(d, v, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    return v;
}

/* got equals want (n values, C order) within |got - want| <= atol + rtol |want|; NaN == NaN. */
static void expect_close(const em_tensor *got, const double *want, int64_t n, double rtol,
                         double atol, const char *what) {
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_numel(got), n, "%s: %lld elements, want %lld", what,
                 (long long)em_tensor_numel(got), (long long)n);
    double *g = vals(got);
    for (int64_t i = 0; i < n; i++) {
        bool ok = g[i] == want[i] || (isnan(g[i]) && isnan(want[i])) ||
                  fabs(g[i] - want[i]) <= atol + rtol * fabs(want[i]);
        cr_assert(ok, "%s: element %lld is %.10g, want %.10g", what, (long long)i, g[i], want[i]);
    }
    free(g);
}
static void expect_vals(const em_tensor *got, const double *want, int64_t n, const char *what) {
    expect_close(got, want, n, 0, 0, what);
}

static void expect_shape(const em_tensor *t, int nd, const int64_t *shape, const char *what) {
    cr_assert(t, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_ndim(t), nd, "%s: %d dims, want %d", what, em_tensor_ndim(t), nd);
    for (int d = 0; d < nd; d++)
        cr_assert_eq(em_tensor_shape(t)[d], shape[d], "%s: dim %d is %lld, want %lld", what, d,
                     (long long)em_tensor_shape(t)[d], (long long)shape[d]);
}

/* The call returned NULL / the status, with this status and message fragment. */
#define EXPECT_FAIL(expr, status, needle)                                                      \
    do {                                                                                       \
        em_clear_error();                                                                      \
        cr_assert_null((void *)(expr), "expected failure: " #expr);                            \
        em_assert_error(status, needle);                                                       \
    } while (0)
#define EXPECT_FAIL_ST(expr, status, needle)                                                   \
    do {                                                                                       \
        em_clear_error();                                                                      \
        em_status st_ = (expr);                                                                \
        cr_assert_eq(st_, (status), "expected %s from " #expr ", got %s: %s",                 \
                     em_status_name(status), em_status_name(st_), em_last_error());           \
        em_assert_error(status, needle);                                                       \
    } while (0)

#define WHAT(...) (snprintf(what, sizeof what, __VA_ARGS__), what)

/* ---- cat ---------------------------------------------------------------------------------------- */

/* Expected cat of n tensors (C-order values gen(dts[i], ., seeds[i])) along dim d. */
static double *cat_ref(int n, int nd, int64_t (*shapes)[EM_MAX_DIMS], const em_dtype *dts,
                       const int *seeds, int d, em_dtype out_dt, int64_t *out_shape) {
    memcpy(out_shape, shapes[0], sizeof(int64_t) * (size_t)nd);
    out_shape[d] = 0;
    for (int i = 0; i < n; i++) out_shape[d] += shapes[i][d];
    int64_t total = numel_of(nd, out_shape);
    double *w = malloc(sizeof(double) * (size_t)(total ? total : 1));
    for (int64_t o = 0; o < total; o++) {
        int64_t c[EM_MAX_DIMS];
        coords_of(nd, out_shape, o, c);
        int i = 0;
        while (c[d] >= shapes[i][d]) c[d] -= shapes[i++][d];
        w[o] = round_to(out_dt, gen(dts[i], lin_of(nd, shapes[i], c), seeds[i]));
    }
    return w;
}

Test(cat, every_dtype_layout_and_dim) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = -1; dim < 3; dim++) {
                em_dtype dt = all_dtypes[di];
                int d = dim < 0 ? dim + 3 : dim;
                int64_t shapes[3][EM_MAX_DIMS] = {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}};
                shapes[0][d] = 2, shapes[1][d] = 1, shapes[2][d] = 3;
                em_dtype dts[3] = {dt, dt, dt};
                int seeds[3] = {1, 2, 3};
                const em_tensor *ts[3] = {make(dt, 3, shapes[0], 1, (layout)lay),
                                          make(dt, 3, shapes[1], 2, CONTIG),
                                          make(dt, 3, shapes[2], 3, (layout)lay)};
                int64_t os[EM_MAX_DIMS];
                double *w = cat_ref(3, 3, shapes, dts, seeds, d, dt, os);
                em_tensor *r = em_cat(3, ts, dim);
                WHAT("cat %s %s dim %d", em_dtype_name(dt), layout_name[lay], dim);
                expect_shape(r, 3, os, what);
                cr_assert_eq(em_tensor_dtype(r), dt);
                cr_assert(em_tensor_is_contiguous(r));
                expect_vals(r, w, numel_of(3, os), what);
                free(w);
            }
    em_scope_end();
}

Test(cat, expanded_input_and_many_tensors) {
    em_scope_begin();
    /* a stride-0 (broadcast) input */
    em_tensor *row = make(EM_F32, 2, (int64_t[]){1, 3}, 4, CONTIG);
    em_tensor *ex = em_expand(row, 2, (int64_t[]){4, 3});
    em_tensor *b = make(EM_F32, 2, (int64_t[]){2, 3}, 5, CONTIG);
    em_tensor *r = em_cat(2, (const em_tensor *[]){ex, b}, 0);
    double w[18];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) w[i * 3 + j] = gen(EM_F32, j, 4);
    for (int i = 0; i < 6; i++) w[12 + i] = gen(EM_F32, i, 5);
    expect_shape(r, 2, (int64_t[]){6, 3}, "cat expanded");
    expect_vals(r, w, 18, "cat expanded");
    /* more tensors than an op schema could take (8) */
    const em_tensor *many[20];
    double wm[20];
    for (int i = 0; i < 20; i++) {
        many[i] = em_full(1, (int64_t[]){1}, i, EM_I64, em_cpu());
        wm[i] = i;
    }
    expect_vals(em_cat(20, many, 0), wm, 20, "cat of 20");
    em_scope_end();
}

Test(cat, type_promotion) {
    static const struct {
        em_dtype a, b, want;
    } cases[] = {{EM_I32, EM_U8, EM_I32},  {EM_BOOL, EM_U8, EM_U8},   {EM_F16, EM_BF16, EM_F32},
                 {EM_I64, EM_F32, EM_F32}, {EM_BOOL, EM_BOOL, EM_BOOL}, {EM_U8, EM_F64, EM_F64},
                 {EM_F16, EM_I64, EM_F16}};
    em_scope_begin();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int64_t shapes[2][EM_MAX_DIMS] = {{2, 3}, {2, 2}};
        em_dtype dts[2] = {cases[k].a, cases[k].b};
        int seeds[2] = {1, 2};
        const em_tensor *ts[2] = {make(dts[0], 2, shapes[0], 1, CONTIG),
                                  make(dts[1], 2, shapes[1], 2, TRANSPOSED)};
        int64_t os[EM_MAX_DIMS];
        double *w = cat_ref(2, 2, shapes, dts, seeds, 1, cases[k].want, os);
        em_tensor *r = em_cat(2, ts, 1);
        cr_assert(r, "%s", em_last_error());
        cr_assert_eq(em_tensor_dtype(r), cases[k].want, "cat %s + %s gave %s",
                     em_dtype_name(dts[0]), em_dtype_name(dts[1]),
                     em_dtype_name(em_tensor_dtype(r)));
        expect_vals(r, w, 10, "cat promotion");
        free(w);
    }
    em_scope_end();
}

Test(cat, legacy_empty_1d_and_zero_size) {
    em_scope_begin();
    em_tensor *e64 = em_empty(1, (int64_t[]){0}, EM_F64, em_cpu());
    em_tensor *x = make(EM_F32, 2, (int64_t[]){2, 3}, 1, CONTIG);
    /* the 1-D empty tensor is skipped by the shape checks but promotes the dtype */
    em_tensor *r = em_cat(3, (const em_tensor *[]){e64, x, e64}, 1);
    expect_shape(r, 2, (int64_t[]){2, 3}, "legacy skip");
    cr_assert_eq(em_tensor_dtype(r), EM_F64);
    double w[6];
    for (int i = 0; i < 6; i++) w[i] = gen(EM_F32, i, 1);
    expect_vals(r, w, 6, "legacy skip");
    /* all skipped: a 1-D empty result */
    em_tensor *ei = em_empty(1, (int64_t[]){0}, EM_I32, em_cpu());
    r = em_cat(2, (const em_tensor *[]){ei, e64}, 0);
    expect_shape(r, 1, (int64_t[]){0}, "all empty");
    cr_assert_eq(em_tensor_dtype(r), EM_F64);
    /* zero-size pieces of other shapes take part normally */
    em_tensor *z03 = em_empty(2, (int64_t[]){0, 3}, EM_F32, em_cpu());
    em_tensor *z20 = em_empty(2, (int64_t[]){2, 0}, EM_F32, em_cpu());
    r = em_cat(2, (const em_tensor *[]){z03, x}, 0);
    expect_shape(r, 2, (int64_t[]){2, 3}, "(0,3)+(2,3)");
    expect_vals(r, w, 6, "(0,3)+(2,3)");
    r = em_cat(3, (const em_tensor *[]){z20, x, z20}, 1);
    expect_shape(r, 2, (int64_t[]){2, 3}, "(2,0)+(2,3)");
    expect_vals(r, w, 6, "(2,0)+(2,3)");
    expect_shape(em_cat(2, (const em_tensor *[]){z03, z03}, 0), 2, (int64_t[]){0, 3}, "0+0");
    expect_shape(em_cat(2, (const em_tensor *[]){z20, z20}, 1), 2, (int64_t[]){2, 0}, "0+0 d1");
    /* but a (2, 0) tensor is not skipped: its dim 0 must match */
    EXPECT_FAIL(em_cat(2, (const em_tensor *[]){z03, x}, 1), EM_ERR_SHAPE,
                "cat: tensor 1 has shape [2, 3] but tensor 0 has [0, 3]; all dims except dim 1 "
                "must match");
    em_scope_end();
}

Test(cat, errors) {
    em_scope_begin();
    em_tensor *a = make(EM_F32, 2, (int64_t[]){3, 4}, 1, CONTIG);
    em_tensor *b = make(EM_F32, 2, (int64_t[]){5, 4}, 1, CONTIG);
    em_tensor *c = make(EM_F32, 3, (int64_t[]){3, 4, 1}, 1, CONTIG);
    em_tensor *s = em_scalar(1, EM_F32);
    em_tensor *e = em_empty(1, (int64_t[]){0}, EM_F32, em_cpu());
    EXPECT_FAIL(em_cat(3, (const em_tensor *[]){a, a, b}, 1), EM_ERR_SHAPE,
                "cat: tensor 2 has shape [5, 4] but tensor 0 has [3, 4]; all dims except dim 1 "
                "must match");
    EXPECT_FAIL(em_cat(3, (const em_tensor *[]){e, a, b}, -1), EM_ERR_SHAPE,
                "cat: tensor 2 has shape [5, 4] but tensor 1 has [3, 4]; all dims except dim 1 "
                "must match");
    EXPECT_FAIL(em_cat(2, (const em_tensor *[]){a, c}, 0), EM_ERR_SHAPE,
                "cat: tensor 1 has shape [3, 4, 1] but tensor 0 has [3, 4]; all tensors must "
                "have the same number of dims");
    EXPECT_FAIL(em_cat(2, (const em_tensor *[]){a, s}, 0), EM_ERR_SHAPE,
                "cat: tensor 1 is 0-dim and cannot be concatenated");
    EXPECT_FAIL(em_cat(0, (const em_tensor *[]){a}, 0), EM_ERR_INVALID,
                "cat: expected a non-empty list of tensors, got 0");
    EXPECT_FAIL(em_cat(1, NULL, 0), EM_ERR_INVALID, "cat: expected a non-empty list");
    EXPECT_FAIL(em_cat(2, (const em_tensor *[]){a, a}, 2), EM_ERR_RANGE,
                "cat: dim 2 is out of range for a tensor with 2 dims");
    EXPECT_FAIL(em_cat(2, (const em_tensor *[]){a, NULL}, 0), EM_ERR_INVALID,
                "cat: input 1 is NULL");
    /* a NULL input keeps the error that produced it */
    em_set_error(EM_ERR_NOMEM, "an earlier failure");
    cr_assert_null(em_cat(2, (const em_tensor *[]){a, NULL}, 0));
    em_assert_error(EM_ERR_NOMEM, "an earlier failure");
    em_scope_end();
}

/* ---- stack ------------------------------------------------------------------------------------ */

Test(stack, every_dtype_layout_and_dim) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = -3; dim < 3; dim++) {
                em_dtype dt = all_dtypes[di];
                int d = dim < 0 ? dim + 3 : dim;
                int64_t in_shape[2] = {2, 3};
                const em_tensor *ts[3];
                for (int i = 0; i < 3; i++) ts[i] = make(dt, 2, in_shape, i + 1, i == 1 ? CONTIG : (layout)lay);
                int64_t os[3];
                for (int k = 0, j = 0; k < 3; k++) os[k] = k == d ? 3 : in_shape[j++];
                double w[18];
                for (int64_t o = 0; o < 18; o++) {
                    int64_t c[3], ic[2];
                    coords_of(3, os, o, c);
                    for (int k = 0, j = 0; k < 3; k++)
                        if (k != d) ic[j++] = c[k];
                    w[o] = gen(dt, lin_of(2, in_shape, ic), (int)c[d] + 1);
                }
                em_tensor *r = em_stack(3, ts, dim);
                WHAT("stack %s %s dim %d", em_dtype_name(dt), layout_name[lay], dim);
                expect_shape(r, 3, os, what);
                expect_vals(r, w, 18, what);
            }
    em_scope_end();
}

Test(stack, scalars_promotion_empty_and_errors) {
    em_scope_begin();
    em_tensor *s1 = em_scalar(1.5, EM_F32), *s2 = em_scalar(-2, EM_I64);
    em_tensor *r = em_stack(2, (const em_tensor *[]){s1, s2}, 0);
    expect_shape(r, 1, (int64_t[]){2}, "stack scalars");
    cr_assert_eq(em_tensor_dtype(r), EM_F32);
    expect_vals(r, (double[]){1.5, -2}, 2, "stack scalars");
    em_tensor *e = em_empty(1, (int64_t[]){0}, EM_F32, em_cpu());
    expect_shape(em_stack(2, (const em_tensor *[]){e, e}, 1), 2, (int64_t[]){0, 2}, "empty");
    em_tensor *a = em_zeros(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    em_tensor *b = em_zeros(2, (int64_t[]){2, 4}, EM_F32, em_cpu());
    EXPECT_FAIL(em_stack(3, (const em_tensor *[]){a, a, b}, 0), EM_ERR_SHAPE,
                "stack: tensor 2 has shape [2, 4] but tensor 0 has [2, 3]; all tensors must "
                "have the same shape");
    EXPECT_FAIL(em_stack(0, (const em_tensor *[]){a}, 0), EM_ERR_INVALID,
                "stack: expected a non-empty list of tensors, got 0");
    EXPECT_FAIL(em_stack(2, (const em_tensor *[]){a, a}, 3), EM_ERR_RANGE,
                "stack: dim 3 is out of range for a tensor with 3 dims");
    EXPECT_FAIL(em_stack(2, (const em_tensor *[]){NULL, a}, 0), EM_ERR_INVALID,
                "stack: input 0 is NULL");
    em_scope_end();
}

/* ---- split, split_sizes, chunk --------------------------------------------------------------- */

/* piece holds rows [start, start + len) of the (R, C) tensor made with `seed` along dim. */
static void expect_piece(const em_tensor *piece, em_dtype dt, int64_t R, int64_t C, int dim,
                         int64_t start, int64_t len, int seed, const char *what) {
    int64_t shape[2] = {dim == 0 ? len : R, dim == 1 ? len : C};
    expect_shape(piece, 2, shape, what);
    double *w = malloc(sizeof(double) * (size_t)(shape[0] * shape[1] + 1));
    for (int64_t i = 0; i < shape[0]; i++)
        for (int64_t j = 0; j < shape[1]; j++)
            w[i * shape[1] + j] = gen(dt, (i + (dim == 0) * start) * C + j + (dim == 1) * start, seed);
    expect_vals(piece, w, shape[0] * shape[1], what);
    free(w);
}

Test(split, views_of_every_dtype_and_layout) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = 0; dim < 2; dim++) {
                em_dtype dt = all_dtypes[di];
                em_tensor *x = make(dt, 2, (int64_t[]){7, 5}, 3, (layout)lay);
                int64_t size = dim ? 5 : 7;
                em_tensor *out[4] = {NULL};
                int n = -1;
                cr_assert_eq(em_split(x, 3, dim, 4, out, &n), EM_OK, "%s", em_last_error());
                cr_assert_eq(n, dim ? 2 : 3);
                for (int i = 0; i < n; i++) {
                    WHAT("split %s %s dim %d piece %d", em_dtype_name(dt), layout_name[lay], dim, i);
                    expect_piece(out[i], dt, 7, 5, dim, 3 * i, i < n - 1 ? 3 : size - 3 * (n - 1),
                                 3, what);
                    cr_assert(em_tensor_shares_storage(out[i], x), "%s: not a view", what);
                }
                cr_assert_null(out[n]);
                /* chunk and split_sizes agree with their definitions */
                em_tensor *ch[3];
                cr_assert_eq(em_chunk(x, 3, dim - 2, 3, ch, &n), EM_OK, "%s", em_last_error());
                int64_t per = (size + 2) / 3;
                cr_assert_eq(n, (int)((size + per - 1) / per));
                for (int i = 0; i < n; i++) {
                    WHAT("chunk %s %s dim %d piece %d", em_dtype_name(dt), layout_name[lay], dim, i);
                    expect_piece(ch[i], dt, 7, 5, dim, per * i, (per < size - per * i ? per : size - per * i), 3, what);
                }
                em_tensor *ss[3];
                int64_t sizes[3] = {1, 0, size - 1};
                cr_assert_eq(em_split_sizes(x, 3, sizes, dim, ss), EM_OK, "%s", em_last_error());
                for (int i = 0, at = 0; i < 3; at += (int)sizes[i], i++) {
                    WHAT("split_sizes %s %s dim %d piece %d", em_dtype_name(dt), layout_name[lay], dim, i);
                    expect_piece(ss[i], dt, 7, 5, dim, at, sizes[i], 3, what);
                }
            }
    em_scope_end();
}

Test(split, writes_go_through_and_counts) {
    em_scope_begin();
    em_tensor *x = em_zeros(2, (int64_t[]){6, 2}, EM_F32, em_cpu());
    em_tensor *out[3];
    int n;
    cr_assert_eq(em_split(x, 2, 0, 3, out, &n), EM_OK);
    cr_assert_eq(em_fill_(out[2], 9), EM_OK);
    expect_vals(x, (double[]){0, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9, 9}, 12, "write through a piece");
    /* the count alone */
    n = 0;
    cr_assert_eq(em_split(x, 4, 0, 0, NULL, &n), EM_OK);
    cr_assert_eq(n, 2);
    cr_assert_eq(em_chunk(x, 4, 0, 0, NULL, &n), EM_OK); /* 6 in 4 chunks: 3 pieces of 2 */
    cr_assert_eq(n, 3);
    cr_assert_eq(em_split(x, 100, 0, 0, NULL, &n), EM_OK); /* larger than the dim: one piece */
    cr_assert_eq(n, 1);
    /* size-0 dims */
    em_tensor *z = em_zeros(2, (int64_t[]){0, 2}, EM_F32, em_cpu());
    cr_assert_eq(em_split(z, 0, 0, 3, out, &n), EM_OK, "%s", em_last_error());
    cr_assert_eq(n, 1);
    expect_shape(out[0], 2, (int64_t[]){0, 2}, "split 0 of 0");
    cr_assert_eq(em_split(z, 3, 0, 3, out, &n), EM_OK);
    cr_assert_eq(n, 1);
    expect_shape(out[0], 2, (int64_t[]){0, 2}, "split 3 of 0");
    cr_assert_eq(em_chunk(z, 3, 0, 3, out, &n), EM_OK);
    cr_assert_eq(n, 3);
    for (int i = 0; i < 3; i++) expect_shape(out[i], 2, (int64_t[]){0, 2}, "chunk of 0");
    em_scope_end();
}

Test(split, errors) {
    em_scope_begin();
    em_tensor *x = em_zeros(2, (int64_t[]){5, 2}, EM_F32, em_cpu());
    em_tensor *out[2] = {NULL, NULL};
    int n = -1;
    EXPECT_FAIL_ST(em_split(x, 2, 0, 2, out, &n), EM_ERR_RANGE,
                   "split: 3 pieces do not fit in an array of 2");
    cr_assert(!out[0] && !out[1], "nothing written on error");
    EXPECT_FAIL_ST(em_split(x, 0, 0, 2, out, &n), EM_ERR_INVALID,
                   "split: split_size must be positive (0 only for a dim of size 0), got 0 for "
                   "dim 0 of size 5");
    EXPECT_FAIL_ST(em_split(x, -1, 0, 2, out, &n), EM_ERR_INVALID, "got -1 for dim 0");
    EXPECT_FAIL_ST(em_split(x, 1, 2, 2, out, &n), EM_ERR_RANGE,
                   "split: dim 2 is out of range for a tensor with 2 dims");
    EXPECT_FAIL_ST(em_split(em_scalar(1, EM_F32), 1, 0, 2, out, &n), EM_ERR_SHAPE,
                   "split: expects a tensor with at least 1 dim, got a 0-dim tensor");
    EXPECT_FAIL_ST(em_split_sizes(x, 2, (int64_t[]){2, 2}, 0, out), EM_ERR_SHAPE,
                   "split_sizes: the sizes [2, 2] sum to 4 but dim 0 has size 5");
    EXPECT_FAIL_ST(em_split_sizes(x, 2, (int64_t[]){6, -1}, 0, out), EM_ERR_INVALID,
                   "split_sizes: size 1 is negative (-1)");
    EXPECT_FAIL_ST(em_split_sizes(x, 0, (int64_t[]){5}, 0, out), EM_ERR_INVALID,
                   "split_sizes: expects at least one size");
    EXPECT_FAIL_ST(em_chunk(x, 0, 0, 2, out, &n), EM_ERR_INVALID,
                   "chunk: chunks must be positive, got 0");
    EXPECT_FAIL_ST(em_chunk(x, 5, 0, 2, out, &n), EM_ERR_RANGE,
                   "chunk: 5 pieces do not fit in an array of 2");
    cr_assert(!out[0] && !out[1], "nothing written on error");
    em_set_error(EM_ERR_NOMEM, "an earlier failure");
    cr_assert_eq(em_split(NULL, 1, 0, 2, out, &n), EM_ERR_NOMEM);
    em_assert_error(EM_ERR_NOMEM, "an earlier failure");
    em_scope_end();
}

/* ---- pad ---------------------------------------------------------------------------------------- */

/* Expected F.pad(x, pad, value) for x of `shape` with values gen(dt, ., seed). */
static double *pad_ref(em_dtype dt, int nd, const int64_t *shape, int seed, int npad,
                       const int64_t *pad, double value, int64_t *os) {
    int64_t lo[EM_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        int p = nd - 1 - d;
        int64_t l = p < npad / 2 ? pad[2 * p] : 0, r = p < npad / 2 ? pad[2 * p + 1] : 0;
        os[d] = shape[d] + l + r;
        lo[d] = l;
    }
    int64_t n = numel_of(nd, os);
    double *w = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t o = 0; o < n; o++) {
        int64_t c[EM_MAX_DIMS];
        coords_of(nd, os, o, c);
        bool inside = true;
        for (int d = 0; d < nd; d++) {
            c[d] -= lo[d];
            inside = inside && c[d] >= 0 && c[d] < shape[d];
        }
        w[o] = inside ? gen(dt, lin_of(nd, shape, c), seed) : round_to(dt, value);
    }
    return w;
}

Test(pad, every_dtype_layout_and_pad_list) {
    static const struct {
        int n;
        int64_t p[6];
    } pads[] = {{2, {1, 2}}, {4, {1, 0, 2, 1}}, {2, {-1, 1}}, {4, {-1, -1, -1, 0}},
                {6, {0, 1, 1, 0, 2, 0}}, {4, {0, 0, 0, 0}}, {2, {-3, -1}}, {2, {3, -4}}};
    char what[200];
    em_scope_begin();
    for (int di = 0; di < N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (size_t k = 0; k < sizeof pads / sizeof pads[0]; k++) {
                em_dtype dt = all_dtypes[di];
                int64_t shape[3] = {2, 3, 4};
                em_tensor *x = make(dt, 3, shape, 2, (layout)lay);
                int64_t os[3];
                double *w = pad_ref(dt, 3, shape, 2, pads[k].n, pads[k].p, 2.75, os);
                em_tensor *r = em_pad(x, pads[k].n, pads[k].p, 2.75);
                WHAT("pad %s %s case %zu", em_dtype_name(dt), layout_name[lay], k);
                expect_shape(r, 3, os, what);
                cr_assert_eq(em_tensor_dtype(r), dt);
                expect_vals(r, w, numel_of(3, os), what);
                free(w);
            }
    em_scope_end();
}

Test(pad, zero_size_copy_and_errors) {
    em_scope_begin();
    em_tensor *x = make(EM_F32, 2, (int64_t[]){2, 3}, 1, CONTIG);
    expect_shape(em_pad(x, 2, (int64_t[]){-2, -1}, 0), 2, (int64_t[]){2, 0}, "crop to 0");
    em_tensor *z = em_zeros(2, (int64_t[]){2, 0}, EM_F32, em_cpu());
    em_tensor *r = em_pad(z, 2, (int64_t[]){1, 1}, 7);
    expect_vals(r, (double[]){7, 7, 7, 7}, 4, "pad an empty dim");
    expect_shape(r, 2, (int64_t[]){2, 2}, "pad an empty dim");
    expect_shape(em_pad(em_zeros(2, (int64_t[]){0, 3}, EM_F32, em_cpu()), 2, (int64_t[]){1, 1}, 7),
                 2, (int64_t[]){0, 5}, "pad (0, 3)");
    r = em_pad(x, 0, NULL, 0); /* no pads: a copy */
    cr_assert(r && !em_tensor_shares_storage(r, x));
    double w[6];
    for (int i = 0; i < 6; i++) w[i] = gen(EM_F32, i, 1);
    expect_vals(r, w, 6, "pad nothing");
    EXPECT_FAIL(em_pad(x, 3, (int64_t[]){1, 1, 1}, 0), EM_ERR_INVALID,
                "pad: the pad list needs (left, right) pairs, last dim first; got 3 entries");
    EXPECT_FAIL(em_pad(x, 6, (int64_t[]){1, 1, 1, 1, 1, 1}, 0), EM_ERR_SHAPE,
                "pad: 3 (left, right) pairs for shape [2, 3], which has only 2 dims");
    EXPECT_FAIL(em_pad(x, 2, (int64_t[]){-2, -2}, 0), EM_ERR_SHAPE,
                "pad: dim 1 of shape [2, 3] padded by (-2, -2) would have size -1");
    EXPECT_FAIL(em_pad(NULL, 2, (int64_t[]){1, 1}, 0), EM_ERR_INVALID, "pad: input 0 is NULL");
    em_scope_end();
}

/* ---- gather ------------------------------------------------------------------------------------- */

/* Deterministic pseudo-random integers in [0, m). */
static int64_t rnd(uint64_t *s, int64_t m) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (int64_t)((*s >> 33) % (uint64_t)m);
}

/* An int64 index of `shape` with values in [0, m), and its values. */
static em_tensor *rand_index(int nd, const int64_t *shape, int64_t m, uint64_t seed,
                             int64_t *v /* out, numel entries */) {
    int64_t n = numel_of(nd, shape);
    for (int64_t i = 0; i < n; i++) v[i] = rnd(&seed, m);
    return make_i64(nd, shape, v);
}

Test(gather, every_dtype_layout_and_dim) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = 0; dim < 3; dim++) {
                em_dtype dt = all_dtypes[di];
                int64_t xs[3] = {3, 4, 5}, is[3] = {2, 3, 4}; /* smaller than x off dim */
                is[dim] = 6;                                   /* longer than x along dim */
                em_tensor *x = make(dt, 3, xs, 4, (layout)lay);
                int64_t iv[72];
                em_tensor *idx = rand_index(3, is, xs[dim], (uint64_t)(di * 10 + dim), iv);
                double w[72];
                for (int64_t o = 0; o < numel_of(3, is); o++) {
                    int64_t c[3];
                    coords_of(3, is, o, c);
                    c[dim] = iv[o];
                    w[o] = gen(dt, lin_of(3, xs, c), 4);
                }
                WHAT("gather %s %s dim %d", em_dtype_name(dt), layout_name[lay], dim);
                em_tensor *r = em_gather(x, dim - 3, idx);
                expect_shape(r, 3, is, what);
                cr_assert_eq(em_tensor_dtype(r), dt);
                expect_vals(r, w, numel_of(3, is), what);
                /* the same index, transposed in memory */
                int perm[3] = {2, 1, 0};
                int64_t ts[3] = {is[2], is[1], is[0]};
                em_tensor *it = em_permute(em_empty(3, ts, EM_I64, em_cpu()), 3, perm);
                cr_assert_eq(em_copy_(it, idx), EM_OK);
                expect_vals(em_gather(x, dim, it), w, numel_of(3, is), what);
            }
    em_scope_end();
}

Test(gather, broadcast_index_scalars_empty) {
    em_scope_begin();
    em_tensor *x = make(EM_F64, 2, (int64_t[]){3, 4}, 1, CONTIG);
    /* a stride-0 index: every row picks columns 3 and 1 */
    em_tensor *row = make_i64(2, (int64_t[]){1, 2}, (int64_t[]){3, 1});
    em_tensor *idx = em_expand(row, 2, (int64_t[]){3, 2});
    double w[6];
    for (int i = 0; i < 3; i++) w[2 * i] = gen(EM_F64, i * 4 + 3, 1), w[2 * i + 1] = gen(EM_F64, i * 4 + 1, 1);
    expect_vals(em_gather(x, 1, idx), w, 6, "gather with a broadcast index");
    /* 0-dim input and index */
    em_tensor *s = em_scalar(3.5, EM_F32);
    em_tensor *r = em_gather(s, 0, make_i64(0, NULL, (int64_t[]){0}));
    expect_shape(r, 0, NULL, "0-dim gather");
    expect_vals(r, (double[]){3.5}, 1, "0-dim gather");
    /* an empty index checks nothing (even its dtype), as in PyTorch */
    em_tensor *e = em_empty(1, (int64_t[]){0}, EM_I32, em_cpu());
    r = em_gather(x, 1, e);
    expect_shape(r, 1, (int64_t[]){0}, "empty index");
    cr_assert_eq(em_tensor_dtype(r), EM_F64);
    /* a large gather (parallel path) */
    int64_t n = 1 << 17;
    em_tensor *big = em_arange(0, 1000, 1, EM_F32, em_cpu());
    int64_t *iv = malloc(sizeof(int64_t) * (size_t)n);
    double *wb = malloc(sizeof(double) * (size_t)n);
    em_tensor *bi = rand_index(1, &n, 1000, 7, iv);
    for (int64_t i = 0; i < n; i++) wb[i] = (double)iv[i];
    expect_vals(em_gather(big, 0, bi), wb, n, "large gather");
    free(iv);
    free(wb);
    em_scope_end();
}

Test(gather, errors) {
    em_scope_begin();
    em_tensor *x = em_zeros(2, (int64_t[]){3, 4}, EM_F32, em_cpu());
    em_tensor *i32 = em_zeros(2, (int64_t[]){3, 1}, EM_I32, em_cpu());
    EXPECT_FAIL(em_gather(x, 1, i32), EM_ERR_DTYPE, "gather: the index must be int64, got int32");
    EXPECT_FAIL(em_gather(x, 1, em_zeros(3, (int64_t[]){3, 1, 1}, EM_I64, em_cpu())), EM_ERR_SHAPE,
                "gather: index shape [3, 1, 1] and input shape [3, 4] must have the same number "
                "of dims");
    EXPECT_FAIL(em_gather(x, 1, em_zeros(2, (int64_t[]){4, 1}, EM_I64, em_cpu())), EM_ERR_SHAPE,
                "gather: index shape [4, 1] must not exceed input shape [3, 4] in any dim "
                "except dim 1 (dim 0: 4 > 3)");
    EXPECT_FAIL(em_gather(x, 1, make_i64(2, (int64_t[]){2, 1}, (int64_t[]){0, 4})), EM_ERR_RANGE,
                "gather: index 4 is out of bounds for dim 1 with size 4 (expected 0..3)");
    EXPECT_FAIL(em_gather(x, 0, make_i64(2, (int64_t[]){1, 2}, (int64_t[]){0, -1})), EM_ERR_RANGE,
                "gather: index -1 is out of bounds for dim 0 with size 3");
    EXPECT_FAIL(em_gather(x, 2, i32), EM_ERR_RANGE,
                "gather: dim 2 is out of range for a tensor with 2 dims");
    EXPECT_FAIL(em_gather(x, 0, NULL), EM_ERR_INVALID, "gather: input 1 is NULL");
    em_scope_end();
}
