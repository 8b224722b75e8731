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


/* ---- references and helpers ------------------------------------------------------------------ */



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

/* A tensor of `shape` whose elements in C order are em_test_gen(dt, i, seed), laid out as `lay`:
 * contiguous, every dim reversed in memory (a permuted view), or every other element of a
 * wider last dim (a step-2 slice). Owned by the caller's scope. */
static em_tensor *make(em_dtype dt, int nd, const int64_t *shape, int seed, layout lay) {
    int64_t n = numel_of(nd, shape);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = em_test_gen(dt, i, seed);
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

static void expect_vals(const em_tensor *got, const double *want, int64_t n, const char *what) {
    em_test_expect_close(got, want, n, 0, 0, what);
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

/* Expected cat of n tensors (C-order values em_test_gen(dts[i], ., seeds[i])) along dim d. */
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
        w[o] = em_test_round_to(out_dt, em_test_gen(dts[i], lin_of(nd, shapes[i], c), seeds[i]));
    }
    return w;
}

Test(cat, every_dtype_layout_and_dim) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = -1; dim < 3; dim++) {
                em_dtype dt = em_test_all_dtypes[di];
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
                em_test_expect_shape(r, 3, os, what);
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
        for (int j = 0; j < 3; j++) w[i * 3 + j] = em_test_gen(EM_F32, j, 4);
    for (int i = 0; i < 6; i++) w[12 + i] = em_test_gen(EM_F32, i, 5);
    em_test_expect_shape(r, 2, (int64_t[]){6, 3}, "cat expanded");
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
    em_test_expect_shape(r, 2, (int64_t[]){2, 3}, "legacy skip");
    cr_assert_eq(em_tensor_dtype(r), EM_F64);
    double w[6];
    for (int i = 0; i < 6; i++) w[i] = em_test_gen(EM_F32, i, 1);
    expect_vals(r, w, 6, "legacy skip");
    /* all skipped: a 1-D empty result */
    em_tensor *ei = em_empty(1, (int64_t[]){0}, EM_I32, em_cpu());
    r = em_cat(2, (const em_tensor *[]){ei, e64}, 0);
    em_test_expect_shape(r, 1, (int64_t[]){0}, "all empty");
    cr_assert_eq(em_tensor_dtype(r), EM_F64);
    /* zero-size pieces of other shapes take part normally */
    em_tensor *z03 = em_empty(2, (int64_t[]){0, 3}, EM_F32, em_cpu());
    em_tensor *z20 = em_empty(2, (int64_t[]){2, 0}, EM_F32, em_cpu());
    r = em_cat(2, (const em_tensor *[]){z03, x}, 0);
    em_test_expect_shape(r, 2, (int64_t[]){2, 3}, "(0,3)+(2,3)");
    expect_vals(r, w, 6, "(0,3)+(2,3)");
    r = em_cat(3, (const em_tensor *[]){z20, x, z20}, 1);
    em_test_expect_shape(r, 2, (int64_t[]){2, 3}, "(2,0)+(2,3)");
    expect_vals(r, w, 6, "(2,0)+(2,3)");
    em_test_expect_shape(em_cat(2, (const em_tensor *[]){z03, z03}, 0), 2, (int64_t[]){0, 3}, "0+0");
    em_test_expect_shape(em_cat(2, (const em_tensor *[]){z20, z20}, 1), 2, (int64_t[]){2, 0}, "0+0 d1");
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
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = -3; dim < 3; dim++) {
                em_dtype dt = em_test_all_dtypes[di];
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
                    w[o] = em_test_gen(dt, lin_of(2, in_shape, ic), (int)c[d] + 1);
                }
                em_tensor *r = em_stack(3, ts, dim);
                WHAT("stack %s %s dim %d", em_dtype_name(dt), layout_name[lay], dim);
                em_test_expect_shape(r, 3, os, what);
                expect_vals(r, w, 18, what);
            }
    em_scope_end();
}

Test(stack, scalars_promotion_empty_and_errors) {
    em_scope_begin();
    em_tensor *s1 = em_scalar(1.5, EM_F32), *s2 = em_scalar(-2, EM_I64);
    em_tensor *r = em_stack(2, (const em_tensor *[]){s1, s2}, 0);
    em_test_expect_shape(r, 1, (int64_t[]){2}, "stack scalars");
    cr_assert_eq(em_tensor_dtype(r), EM_F32);
    expect_vals(r, (double[]){1.5, -2}, 2, "stack scalars");
    em_tensor *e = em_empty(1, (int64_t[]){0}, EM_F32, em_cpu());
    em_test_expect_shape(em_stack(2, (const em_tensor *[]){e, e}, 1), 2, (int64_t[]){0, 2}, "empty");
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
    em_test_expect_shape(piece, 2, shape, what);
    double *w = malloc(sizeof(double) * (size_t)(shape[0] * shape[1] + 1));
    for (int64_t i = 0; i < shape[0]; i++)
        for (int64_t j = 0; j < shape[1]; j++)
            w[i * shape[1] + j] = em_test_gen(dt, (i + (dim == 0) * start) * C + j + (dim == 1) * start, seed);
    expect_vals(piece, w, shape[0] * shape[1], what);
    free(w);
}

Test(split, views_of_every_dtype_and_layout) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = 0; dim < 2; dim++) {
                em_dtype dt = em_test_all_dtypes[di];
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
    em_test_expect_shape(out[0], 2, (int64_t[]){0, 2}, "split 0 of 0");
    cr_assert_eq(em_split(z, 3, 0, 3, out, &n), EM_OK);
    cr_assert_eq(n, 1);
    em_test_expect_shape(out[0], 2, (int64_t[]){0, 2}, "split 3 of 0");
    cr_assert_eq(em_chunk(z, 3, 0, 3, out, &n), EM_OK);
    cr_assert_eq(n, 3);
    for (int i = 0; i < 3; i++) em_test_expect_shape(out[i], 2, (int64_t[]){0, 2}, "chunk of 0");
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

/* Expected F.pad(x, pad, value) for x of `shape` with values em_test_gen(dt, ., seed). */
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
        w[o] = inside ? em_test_gen(dt, lin_of(nd, shape, c), seed) : em_test_round_to(dt, value);
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
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (size_t k = 0; k < sizeof pads / sizeof pads[0]; k++) {
                em_dtype dt = em_test_all_dtypes[di];
                int64_t shape[3] = {2, 3, 4};
                em_tensor *x = make(dt, 3, shape, 2, (layout)lay);
                int64_t os[3];
                double *w = pad_ref(dt, 3, shape, 2, pads[k].n, pads[k].p, 2.75, os);
                em_tensor *r = em_pad(x, pads[k].n, pads[k].p, 2.75);
                WHAT("pad %s %s case %zu", em_dtype_name(dt), layout_name[lay], k);
                em_test_expect_shape(r, 3, os, what);
                cr_assert_eq(em_tensor_dtype(r), dt);
                expect_vals(r, w, numel_of(3, os), what);
                free(w);
            }
    em_scope_end();
}

Test(pad, zero_size_copy_and_errors) {
    em_scope_begin();
    em_tensor *x = make(EM_F32, 2, (int64_t[]){2, 3}, 1, CONTIG);
    em_test_expect_shape(em_pad(x, 2, (int64_t[]){-2, -1}, 0), 2, (int64_t[]){2, 0}, "crop to 0");
    em_tensor *z = em_zeros(2, (int64_t[]){2, 0}, EM_F32, em_cpu());
    em_tensor *r = em_pad(z, 2, (int64_t[]){1, 1}, 7);
    expect_vals(r, (double[]){7, 7, 7, 7}, 4, "pad an empty dim");
    em_test_expect_shape(r, 2, (int64_t[]){2, 2}, "pad an empty dim");
    em_test_expect_shape(em_pad(em_zeros(2, (int64_t[]){0, 3}, EM_F32, em_cpu()), 2, (int64_t[]){1, 1}, 7),
                 2, (int64_t[]){0, 5}, "pad (0, 3)");
    r = em_pad(x, 0, NULL, 0); /* no pads: a copy */
    cr_assert(r && !em_tensor_shares_storage(r, x));
    double w[6];
    for (int i = 0; i < 6; i++) w[i] = em_test_gen(EM_F32, i, 1);
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
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = 0; dim < 3; dim++) {
                em_dtype dt = em_test_all_dtypes[di];
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
                    w[o] = em_test_gen(dt, lin_of(3, xs, c), 4);
                }
                WHAT("gather %s %s dim %d", em_dtype_name(dt), layout_name[lay], dim);
                em_tensor *r = em_gather(x, dim - 3, idx);
                em_test_expect_shape(r, 3, is, what);
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
    for (int i = 0; i < 3; i++) w[2 * i] = em_test_gen(EM_F64, i * 4 + 3, 1), w[2 * i + 1] = em_test_gen(EM_F64, i * 4 + 1, 1);
    expect_vals(em_gather(x, 1, idx), w, 6, "gather with a broadcast index");
    /* 0-dim input and index */
    em_tensor *s = em_scalar(3.5, EM_F32);
    em_tensor *r = em_gather(s, 0, make_i64(0, NULL, (int64_t[]){0}));
    em_test_expect_shape(r, 0, NULL, "0-dim gather");
    expect_vals(r, (double[]){3.5}, 1, "0-dim gather");
    /* an empty index checks nothing (even its dtype), as in PyTorch */
    em_tensor *e = em_empty(1, (int64_t[]){0}, EM_I32, em_cpu());
    r = em_gather(x, 1, e);
    em_test_expect_shape(r, 1, (int64_t[]){0}, "empty index");
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

/* ---- scatter, scatter_add ------------------------------------------------------------------------- */

/* Expected scatter (add: scatter_add) of src (gen seed 6, shape ss) into x (gen seed 5, shape
 * xs) at index iv (shape is) along dim, in the sequential order, rounding each addition. */
static double *scatter_ref(em_dtype dt, int nd, const int64_t *xs, const int64_t *is,
                           const int64_t *ss, const int64_t *iv, int dim, bool add) {
    int64_t n = numel_of(nd, xs);
    double *y = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) y[i] = em_test_gen(dt, i, 5);
    for (int64_t p = 0; p < numel_of(nd, is); p++) {
        int64_t c[EM_MAX_DIMS];
        coords_of(nd, is, p, c);
        double s = em_test_gen(dt, lin_of(nd, ss, c), 6);
        c[dim] = iv[p];
        int64_t t = lin_of(nd, xs, c);
        y[t] = add ? em_test_round_to(dt, y[t] + s) : s;
    }
    return y;
}

Test(scatter, every_dtype_layout_dim_with_duplicates) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = 0; dim < 2; dim++)
                for (int add = 0; add < 2; add++) {
                    em_dtype dt = em_test_all_dtypes[di];
                    int64_t xs[2] = {3, 5}, is[2] = {2, 4}, ss[2] = {3, 6};
                    is[dim] = 7; /* more entries than targets: duplicates for sure */
                    ss[dim] = 8;
                    int64_t iv[28];
                    em_tensor *idx = rand_index(2, is, xs[dim], (uint64_t)(di + 3 * dim), iv);
                    em_tensor *x = make(dt, 2, xs, 5, (layout)lay);
                    em_tensor *src = make(dt, 2, ss, 6, (layout)((lay + 1) % N_LAYOUTS));
                    double *w = scatter_ref(dt, 2, xs, is, ss, iv, dim, add);
                    WHAT("%s %s %s dim %d", add ? "scatter_add" : "scatter", em_dtype_name(dt),
                         layout_name[lay], dim);
                    em_tensor *r = add ? em_scatter_add(x, dim, idx, src) : em_scatter(x, dim, idx, src);
                    em_test_expect_shape(r, 2, xs, what);
                    expect_vals(r, w, 15, what);
                    /* x untouched by the out-of-place form; the in-place form writes into x
                     * (a strided view of a larger buffer for the non-contiguous layouts) */
                    double *x0 = scatter_ref(dt, 2, xs, is, ss, iv, dim, add);
                    for (int i = 0; i < 15; i++) x0[i] = em_test_gen(dt, i, 5);
                    expect_vals(x, x0, 15, what);
                    uint64_t v0 = em_tensor_version(x);
                    em_status st = add ? em_scatter_add_(x, dim - 2, idx, src) : em_scatter_(x, dim - 2, idx, src);
                    cr_assert_eq(st, EM_OK, "%s: %s", what, em_last_error());
                    cr_assert_gt(em_tensor_version(x), v0);
                    expect_vals(x, w, 15, what);
                    free(w);
                    free(x0);
                }
    em_scope_end();
}

Test(scatter, scalars_empty_and_bool_or) {
    em_scope_begin();
    em_tensor *s = em_scalar(1, EM_F32);
    cr_assert_eq(em_scatter_add_(s, 0, make_i64(0, NULL, (int64_t[]){0}), em_scalar(2.5, EM_F32)), EM_OK,
                 "%s", em_last_error());
    expect_vals(s, (double[]){3.5}, 1, "0-dim scatter_add");
    /* an empty index changes nothing and checks nothing */
    em_tensor *x = make(EM_F32, 2, (int64_t[]){2, 3}, 1, CONTIG);
    em_tensor *e = em_empty(1, (int64_t[]){0}, EM_I32, em_cpu());
    em_tensor *r = em_scatter(x, 1, e, em_zeros(1, (int64_t[]){1}, EM_F64, em_cpu()));
    double w[6];
    for (int i = 0; i < 6; i++) w[i] = em_test_gen(EM_F32, i, 1);
    expect_vals(r, w, 6, "empty index");
    cr_assert(!em_tensor_shares_storage(r, x));
    /* scatter_add on bool is a logical or */
    em_tensor *b = em_test_tensor(EM_BOOL, 1, (int64_t[]){3}, (double[]){1, 0, 1});
    r = em_scatter_add(b, 0, make_i64(1, (int64_t[]){3}, (int64_t[]){0, 1, 1}),
                       em_test_tensor(EM_BOOL, 1, (int64_t[]){3}, (double[]){1, 0, 1}));
    expect_vals(r, (double[]){1, 1, 1}, 3, "bool scatter_add");
    /* u8 wraps */
    em_tensor *u = em_test_tensor(EM_U8, 1, (int64_t[]){2}, (double[]){250, 1});
    r = em_scatter_add(u, 0, make_i64(1, (int64_t[]){2}, (int64_t[]){0, 0}),
                       em_test_tensor(EM_U8, 1, (int64_t[]){2}, (double[]){5, 3}));
    expect_vals(r, (double[]){2, 1}, 2, "u8 scatter_add wraps");
    em_scope_end();
}

Test(scatter, errors_leave_the_input_unchanged) {
    em_scope_begin();
    em_tensor *x = make(EM_F32, 2, (int64_t[]){3, 4}, 1, CONTIG);
    em_tensor *src = em_ones(2, (int64_t[]){3, 2}, EM_F32, em_cpu());
    em_tensor *idx = em_zeros(2, (int64_t[]){3, 2}, EM_I64, em_cpu());
    double w[12];
    for (int i = 0; i < 12; i++) w[i] = em_test_gen(EM_F32, i, 1);
    EXPECT_FAIL(em_scatter(x, 1, idx, em_ones(2, (int64_t[]){3, 2}, EM_F64, em_cpu())), EM_ERR_DTYPE,
                "scatter: src has dtype float64 but the input has float32; they must match");
    EXPECT_FAIL(em_scatter(x, 1, em_zeros(2, (int64_t[]){3, 2}, EM_I32, em_cpu()), src), EM_ERR_DTYPE,
                "scatter: the index must be int64, got int32");
    EXPECT_FAIL(em_scatter(x, 1, idx, em_ones(2, (int64_t[]){3, 1}, EM_F32, em_cpu())), EM_ERR_SHAPE,
                "scatter: index shape [3, 2] must not exceed the input shape [3, 4] except in dim "
                "1, nor the src shape [3, 1] in any dim (dim 1)");
    EXPECT_FAIL(em_scatter_add(x, 1, em_zeros(2, (int64_t[]){4, 1}, EM_I64, em_cpu()), src), EM_ERR_SHAPE,
                "scatter_add: index shape [4, 1] must not exceed the input shape [3, 4] except in "
                "dim 1, nor the src shape [3, 2] in any dim (dim 0)");
    EXPECT_FAIL(em_scatter(x, 1, idx, em_ones(3, (int64_t[]){3, 2, 4}, EM_F32, em_cpu())), EM_ERR_SHAPE,
                "scatter: input [3, 4], index [3, 2] and src [3, 2, 4] must have the same number "
                "of dims");
    em_tensor *bad = make_i64(2, (int64_t[]){3, 2}, (int64_t[]){0, 1, 2, 3, 1, 4});
    EXPECT_FAIL_ST(em_scatter_add_(x, 1, bad, src), EM_ERR_RANGE,
                   "scatter_add: index 4 is out of bounds for dim 1 with size 4 (expected 0..3)");
    EXPECT_FAIL_ST(em_scatter_(x, -1, make_i64(2, (int64_t[]){1, 1}, (int64_t[]){-2}), src), EM_ERR_RANGE,
                   "scatter: index -2 is out of bounds for dim 1 with size 4");
    expect_vals(x, w, 12, "x unchanged after the failed in-place calls");
    EXPECT_FAIL_ST(em_scatter_(x, 2, idx, src), EM_ERR_RANGE,
                   "scatter_: dim 2 is out of range for a tensor with 2 dims");
    EXPECT_FAIL_ST(em_scatter_add_(x, 1, NULL, src), EM_ERR_INVALID, "scatter_add_: input 1 is NULL");
    em_scope_end();
}

/* A float accumulation in the documented sequential order: out[idx[j]] += src[j]. */
static void seq_add_f32(float *out, const int64_t *iv, const float *src, int64_t n) {
    for (int64_t j = 0; j < n; j++) out[iv[j]] += src[j];
}

static float *rand_f32(int64_t n, uint64_t seed) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(rnd(&seed, 2000001) - 1000000) * 1.37e-3f;
    return v;
}

/* Bitwise comparison of an f32 tensor with a float buffer. */
static void expect_bits_f32(const em_tensor *t, const float *want, int64_t n, const char *what) {
    cr_assert(t, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_numel(t), n);
    float *g = malloc(sizeof(float) * (size_t)n);
    cr_assert_eq(em_tensor_to_host(t, g, sizeof(float) * (size_t)n), EM_OK);
    cr_assert(memcmp(g, want, sizeof(float) * (size_t)n) == 0, "%s: not bitwise identical", what);
    free(g);
}

Test(scatter, scatter_add_is_sequential_for_every_thread_count) {
    char what[160];
    em_scope_begin();
    int64_t n = 300000, m = 1000;
    int64_t *iv = malloc(sizeof(int64_t) * (size_t)n);
    float *sv = rand_f32(n, 11);
    em_tensor *idx = rand_index(1, &n, m, 12, iv);
    em_tensor *src = em_from_data(sv, 1, &n, EM_F32, em_cpu());
    float *want = calloc((size_t)m, sizeof(float));
    seq_add_f32(want, iv, sv, n);
    /* 2-D, dim 0: 16 independent lines of 4096 */
    int64_t is2[2] = {4096, 16}, xs2[2] = {64, 16}, n2 = 4096 * 16;
    int64_t *iv2 = malloc(sizeof(int64_t) * (size_t)n2);
    em_tensor *idx2 = rand_index(2, is2, 64, 13, iv2);
    em_tensor *src2 = em_from_data(sv, 2, is2, EM_F32, em_cpu());
    float *want2 = calloc(64 * 16, sizeof(float));
    for (int64_t j = 0; j < 4096; j++)
        for (int64_t k = 0; k < 16; k++) want2[iv2[j * 16 + k] * 16 + k] += sv[j * 16 + k];
    int threads[] = {1, 2, 4};
    for (int det = 0; det < 2; det++)
        for (int t = 0; t < 3; t++) {
            em_set_num_threads(threads[t]);
            em_set_deterministic(det);
            WHAT("scatter_add 1-D, %d threads, deterministic %d", threads[t], det);
            expect_bits_f32(em_scatter_add(em_zeros(1, &m, EM_F32, em_cpu()), 0, idx, src), want, m, what);
            WHAT("scatter_add 2-D, %d threads, deterministic %d", threads[t], det);
            expect_bits_f32(em_scatter_add(em_zeros(2, xs2, EM_F32, em_cpu()), 0, idx2, src2), want2, 64 * 16, what);
        }
    em_set_deterministic(false);
    free(iv);
    free(iv2);
    free(sv);
    free(want);
    free(want2);
    em_scope_end();
}

/* ---- index_add ------------------------------------------------------------------------------------- */

Test(index_add, every_dtype_layout_dim_alpha) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int dim = 0; dim < 3; dim++) {
                em_dtype dt = em_test_all_dtypes[di];
                double alpha = dt == EM_BOOL ? 1 : em_dtype_is_floating(dt) ? -0.5 : 2.9;
                double a = em_dtype_is_floating(dt) ? alpha : (double)(int64_t)alpha;
                int64_t xs[3] = {3, 4, 2}, ss[3] = {3, 4, 2};
                ss[dim] = 5;
                int64_t iv[5];
                em_tensor *idx = rand_index(1, (int64_t[]){5}, xs[dim], (uint64_t)(dim * 7 + di), iv);
                em_tensor *x = make(dt, 3, xs, 1, (layout)lay);
                em_tensor *src = make(dt, 3, ss, 2, (layout)((lay + 2) % N_LAYOUTS));
                double w[24];
                for (int i = 0; i < 24; i++) w[i] = em_test_gen(dt, i, 1);
                for (int64_t i = 0; i < 5; i++)
                    for (int64_t p = 0; p < numel_of(3, ss); p++) {
                        int64_t c[3];
                        coords_of(3, ss, p, c);
                        if (c[dim] != i) continue;
                        double s = em_test_gen(dt, p, 2);
                        c[dim] = iv[i];
                        int64_t t = lin_of(3, xs, c);
                        w[t] = em_test_round_to(dt, w[t] + a * s);
                    }
                WHAT("index_add %s %s dim %d", em_dtype_name(dt), layout_name[lay], dim);
                expect_vals(em_index_add(x, dim, idx, src, alpha), w, 24, what);
                /* in place, with an int32 index */
                em_tensor *i32 = em_to_dtype(idx, EM_I32);
                cr_assert_eq(em_index_add_(x, dim - 3, i32, src, alpha), EM_OK, "%s", em_last_error());
                expect_vals(x, w, 24, what);
            }
    em_scope_end();
}

Test(index_add, scalars_empty_and_errors) {
    em_scope_begin();
    em_tensor *s = em_scalar(1, EM_I64);
    cr_assert_eq(em_index_add_(s, 0, make_i64(0, NULL, (int64_t[]){0}), em_scalar(3, EM_I64), 2.5), EM_OK,
                 "%s", em_last_error());
    expect_vals(s, (double[]){7}, 1, "0-dim index_add, alpha 2.5 truncated to 2 for int64");
    em_tensor *x = make(EM_F32, 2, (int64_t[]){3, 4}, 1, CONTIG);
    double w[12];
    for (int i = 0; i < 12; i++) w[i] = em_test_gen(EM_F32, i, 1);
    expect_vals(em_index_add(x, 0, em_empty(1, (int64_t[]){0}, EM_I64, em_cpu()),
                             em_zeros(2, (int64_t[]){0, 4}, EM_F32, em_cpu()), 1),
                w, 12, "empty index");
    em_tensor *src = em_ones(2, (int64_t[]){2, 4}, EM_F32, em_cpu());
    EXPECT_FAIL(em_index_add(x, 0, make_i64(2, (int64_t[]){1, 2}, (int64_t[]){0, 1}), src, 1), EM_ERR_INVALID,
                "index_add: the index must be a 1-D int64 (or int32) tensor; got shape [1, 2] of int64");
    EXPECT_FAIL(em_index_add(x, 0, em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu()), src, 1), EM_ERR_DTYPE,
                "index_add: the index must be int64 (or int32), got float32");
    EXPECT_FAIL(em_index_add(x, 0, make_i64(1, (int64_t[]){2}, (int64_t[]){0, 1}),
                             em_ones(2, (int64_t[]){2, 4}, EM_F64, em_cpu()), 1), EM_ERR_DTYPE,
                "index_add: source has dtype float64 but the input has float32; they must match");
    EXPECT_FAIL(em_index_add(x, 0, make_i64(1, (int64_t[]){2}, (int64_t[]){0, 1}),
                             em_ones(2, (int64_t[]){3, 4}, EM_F32, em_cpu()), 1), EM_ERR_SHAPE,
                "index_add: the index has 2 entries but source shape [3, 4] has 3 along dim 0");
    EXPECT_FAIL(em_index_add(x, 0, make_i64(1, (int64_t[]){2}, (int64_t[]){0, 1}),
                             em_ones(2, (int64_t[]){2, 5}, EM_F32, em_cpu()), 1), EM_ERR_SHAPE,
                "index_add: source shape [2, 5] must match input shape [3, 4] in every dim except "
                "dim 0 (dim 1: 5 vs 4)");
    EXPECT_FAIL(em_index_add(x, 0, make_i64(1, (int64_t[]){2}, (int64_t[]){0, 1}),
                             em_ones(1, (int64_t[]){2}, EM_F32, em_cpu()), 1), EM_ERR_SHAPE,
                "index_add: source shape [2] and input shape [3, 4] must have the same number of dims");
    EXPECT_FAIL_ST(em_index_add_(x, 0, make_i64(1, (int64_t[]){2}, (int64_t[]){0, 3}), src, 1), EM_ERR_RANGE,
                   "index_add: index 3 is out of bounds for dim 0 with size 3 (expected 0..2)");
    EXPECT_FAIL_ST(em_index_add_(x, 0, make_i64(1, (int64_t[]){2}, (int64_t[]){-1, 0}), src, 1), EM_ERR_RANGE,
                   "index_add: index -1 is out of bounds for dim 0 with size 3");
    expect_vals(x, w, 12, "x unchanged after the failed in-place calls");
    EXPECT_FAIL(em_index_add(x, 0, NULL, src, 1), EM_ERR_INVALID, "index_add: input 1 is NULL");
    em_scope_end();
}

Test(index_add, sequential_for_every_thread_count) {
    char what[160];
    em_scope_begin();
    /* (a) few wide rows: the slice is split; (b) many narrow rows: the rows are split */
    static const struct {
        int64_t rows, width, n;
    } cases[] = {{50, 4096, 600}, {1000, 8, 100000}};
    int threads[] = {1, 2, 4};
    for (int k = 0; k < 2; k++) {
        int64_t R = cases[k].rows, D = cases[k].width, n = cases[k].n;
        int64_t *iv = malloc(sizeof(int64_t) * (size_t)n);
        float *sv = rand_f32(n * D, 21 + k);
        em_tensor *idx = rand_index(1, &n, R, 22 + k, iv);
        em_tensor *src = em_from_data(sv, 2, (int64_t[]){n, D}, EM_F32, em_cpu());
        float *want = calloc((size_t)(R * D), sizeof(float));
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < D; j++) want[iv[i] * D + j] += 1.5f * sv[i * D + j];
        float *want_bw = calloc((size_t)(R * D), sizeof(float)); /* embedding_backward, padding 0 */
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < D; j++)
                if (iv[i] != 0) want_bw[iv[i] * D + j] += sv[i * D + j];
        for (int det = 0; det < 2; det++)
            for (int t = 0; t < 3; t++) {
                em_set_num_threads(threads[t]);
                em_set_deterministic(det);
                em_tensor *y = em_zeros(2, (int64_t[]){R, D}, EM_F32, em_cpu());
                cr_assert_eq(em_index_add_(y, 0, idx, src, 1.5), EM_OK, "%s", em_last_error());
                WHAT("index_add %lldx%lld, %d threads, deterministic %d", (long long)R,
                     (long long)D, threads[t], det);
                expect_bits_f32(y, want, R * D, what);
                WHAT("embedding_backward %lldx%lld, %d threads, deterministic %d", (long long)R,
                     (long long)D, threads[t], det);
                expect_bits_f32(em_embedding_backward(src, idx, R, 0), want_bw, R * D, what);
            }
        em_set_deterministic(false);
        free(iv);
        free(sv);
        free(want);
        free(want_bw);
    }
    em_scope_end();
}

/* ---- embedding ----------------------------------------------------------------------------------- */

Test(embedding, every_dtype_layout_and_index_type) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++) {
            em_dtype dt = em_test_all_dtypes[di];
            em_tensor *w = make(dt, 2, (int64_t[]){5, 3}, 1, (layout)lay);
            int64_t iv[6] = {4, 0, 2, 2, 1, 4};
            em_tensor *idx = make_i64(2, (int64_t[]){2, 3}, iv);
            double want[18];
            for (int i = 0; i < 6; i++)
                for (int j = 0; j < 3; j++) want[i * 3 + j] = em_test_gen(dt, iv[i] * 3 + j, 1);
            WHAT("embedding %s %s", em_dtype_name(dt), layout_name[lay]);
            em_tensor *r = em_embedding(w, idx, EM_PADDING_IDX_NONE);
            em_test_expect_shape(r, 3, (int64_t[]){2, 3, 3}, what);
            cr_assert_eq(em_tensor_dtype(r), dt);
            expect_vals(r, want, 18, what);
            /* int32 indices, transposed in memory; a padding_idx does not change the forward */
            em_tensor *it = em_transpose(em_to_dtype(em_transpose(idx, 0, 1), EM_I32), 0, 1);
            expect_vals(em_embedding(w, it, -1), want, 18, what);
        }
    em_scope_end();
}

Test(embedding, scalars_empty_large_and_errors) {
    em_scope_begin();
    em_tensor *w = make(EM_F32, 2, (int64_t[]){5, 3}, 1, CONTIG);
    em_tensor *r = em_embedding(w, make_i64(0, NULL, (int64_t[]){2}), EM_PADDING_IDX_NONE);
    em_test_expect_shape(r, 1, (int64_t[]){3}, "0-dim index");
    expect_vals(r, (double[]){em_test_gen(EM_F32, 6, 1), em_test_gen(EM_F32, 7, 1), em_test_gen(EM_F32, 8, 1)}, 3, "0-dim index");
    em_test_expect_shape(em_embedding(w, em_empty(1, (int64_t[]){0}, EM_I64, em_cpu()), 0), 2,
                 (int64_t[]){0, 3}, "empty indices");
    /* large: the parallel path */
    int64_t n = 50000, V = 100, D = 16;
    int64_t *iv = malloc(sizeof(int64_t) * (size_t)n);
    em_tensor *idx = rand_index(1, &n, V, 5, iv);
    em_tensor *wb = make(EM_F32, 2, (int64_t[]){V, D}, 3, CONTIG);
    double *want = malloc(sizeof(double) * (size_t)(n * D));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < D; j++) want[i * D + j] = em_test_gen(EM_F32, iv[i] * D + j, 3);
    expect_vals(em_embedding(wb, idx, EM_PADDING_IDX_NONE), want, n * D, "large embedding");
    free(iv);
    free(want);
    em_tensor *two = make_i64(1, (int64_t[]){2}, (int64_t[]){0, 7});
    EXPECT_FAIL(em_embedding(w, two, EM_PADDING_IDX_NONE), EM_ERR_RANGE,
                "embedding: index 7 is out of range for a weight of V = 5 rows (expected 0..4)");
    EXPECT_FAIL(em_embedding(w, make_i64(1, (int64_t[]){1}, (int64_t[]){-1}), EM_PADDING_IDX_NONE),
                EM_ERR_RANGE, "embedding: index -1 is out of range for a weight of V = 5 rows");
    EXPECT_FAIL(em_embedding(em_zeros(1, (int64_t[]){5}, EM_F32, em_cpu()), two, EM_PADDING_IDX_NONE),
                EM_ERR_SHAPE, "embedding: the weight must be 2-D (num_embeddings, embedding_dim), "
                "got shape [5]");
    EXPECT_FAIL(em_embedding(w, em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu()), EM_PADDING_IDX_NONE),
                EM_ERR_DTYPE, "embedding: the index must be int64 (or int32), got float32");
    EXPECT_FAIL(em_embedding(w, two, 5), EM_ERR_RANGE,
                "embedding: padding_idx 5 is out of range for 5 embeddings (expected -5..4, or "
                "EM_PADDING_IDX_NONE)");
    EXPECT_FAIL(em_embedding(NULL, two, 0), EM_ERR_INVALID, "embedding: input 0 is NULL");
    em_scope_end();
}

Test(embedding, backward_every_float_dtype_and_padding) {
    static const em_dtype flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    char what[160];
    em_scope_begin();
    int64_t iv[6] = {4, 0, 2, 2, 1, 4};
    em_tensor *idx = make_i64(2, (int64_t[]){2, 3}, iv);
    for (int di = 0; di < 4; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (int pk = 0; pk < 3; pk++) {
                em_dtype dt = flt[di];
                int64_t pad_arg = pk == 0 ? EM_PADDING_IDX_NONE : pk == 1 ? 2 : -1; /* -1: row 5 */
                int64_t pad = pk == 0 ? -1 : pk == 1 ? 2 : 5;
                em_tensor *g = make(dt, 3, (int64_t[]){2, 3, 4}, 7, (layout)lay);
                double want[24] = {0};
                for (int i = 0; i < 6; i++)
                    for (int j = 0; j < 4; j++)
                        if (iv[i] != pad)
                            want[iv[i] * 4 + j] = em_test_round_to(dt, want[iv[i] * 4 + j] + em_test_gen(dt, i * 4 + j, 7));
                WHAT("embedding_backward %s %s padding %lld", em_dtype_name(dt), layout_name[lay],
                     (long long)pad);
                em_tensor *r = em_embedding_backward(g, idx, 6, pad_arg);
                em_test_expect_shape(r, 2, (int64_t[]){6, 4}, what);
                cr_assert_eq(em_tensor_dtype(r), dt);
                expect_vals(r, want, 24, what);
            }
    /* empty indices: zeros */
    em_tensor *r = em_embedding_backward(em_zeros(2, (int64_t[]){0, 2}, EM_F32, em_cpu()),
                                         em_empty(1, (int64_t[]){0}, EM_I64, em_cpu()), 2,
                                         EM_PADDING_IDX_NONE);
    expect_vals(r, (double[]){0, 0, 0, 0}, 4, "empty backward");
    em_tensor *g = em_ones(3, (int64_t[]){2, 3, 4}, EM_F32, em_cpu());
    EXPECT_FAIL(em_embedding_backward(em_ones(2, (int64_t[]){6, 4}, EM_F32, em_cpu()), idx, 6, 0),
                EM_ERR_SHAPE, "embedding_backward: grad shape [6, 4] must be the indices' shape "
                "[2, 3] plus the embedding dim");
    EXPECT_FAIL(em_embedding_backward(em_ones(3, (int64_t[]){2, 3, 4}, EM_I32, em_cpu()), idx, 6, 0),
                EM_ERR_DTYPE, "embedding_backward: grad must be floating, got int32");
    EXPECT_FAIL(em_embedding_backward(g, idx, 4, EM_PADDING_IDX_NONE), EM_ERR_RANGE,
                "embedding_backward: index 4 is out of range for num_weights V = 4 (expected 0..3)");
    EXPECT_FAIL(em_embedding_backward(g, idx, -1, EM_PADDING_IDX_NONE), EM_ERR_INVALID,
                "embedding_backward: num_weights must be >= 0, got -1");
    EXPECT_FAIL(em_embedding_backward(g, idx, 6, -7), EM_ERR_RANGE,
                "embedding_backward: padding_idx -7 is out of range for 6 embeddings");
    em_scope_end();
}

/* ---- masked_fill ------------------------------------------------------------------------------------ */

Test(masked_fill, every_dtype_layout_and_broadcast) {
    char what[160];
    em_scope_begin();
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++) {
            em_dtype dt = em_test_all_dtypes[di];
            double value = dt == EM_BOOL ? 0 : 2.75, v = em_test_round_to(dt, value);
            em_tensor *x = make(dt, 2, (int64_t[]){3, 4}, 1, (layout)lay);
            em_tensor *m = make(EM_BOOL, 2, (int64_t[]){3, 4}, 2, (layout)((lay + 1) % N_LAYOUTS));
            em_tensor *mrow = make(EM_BOOL, 1, (int64_t[]){4}, 3, CONTIG);   /* broadcast rows */
            em_tensor *mcol = make(EM_BOOL, 2, (int64_t[]){3, 1}, 4, CONTIG); /* broadcast cols */
            double w[12], wr[12], wc[12];
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 4; j++) {
                    double xv = em_test_gen(dt, i * 4 + j, 1);
                    w[i * 4 + j] = em_test_gen(EM_BOOL, i * 4 + j, 2) ? v : xv;
                    wr[i * 4 + j] = em_test_gen(EM_BOOL, j, 3) ? v : xv;
                    wc[i * 4 + j] = em_test_gen(EM_BOOL, i, 4) ? v : xv;
                }
            WHAT("masked_fill %s %s", em_dtype_name(dt), layout_name[lay]);
            expect_vals(em_masked_fill(x, m, value), w, 12, what);
            expect_vals(em_masked_fill(x, mrow, value), wr, 12, what);
            expect_vals(em_masked_fill(x, mcol, value), wc, 12, what);
            cr_assert_eq(em_masked_fill_(x, mcol, value), EM_OK, "%s", em_last_error());
            expect_vals(x, wc, 12, what);
        }
    /* the input broadcasts too: x (4,) with a (3, 1) mask gives (3, 4) */
    em_tensor *x = make(EM_F32, 1, (int64_t[]){4}, 1, CONTIG);
    em_tensor *m = em_test_tensor(EM_BOOL, 2, (int64_t[]){3, 1}, (double[]){1, 0, 1});
    em_tensor *r = em_masked_fill(x, m, NAN);
    em_test_expect_shape(r, 2, (int64_t[]){3, 4}, "broadcast input");
    double w[12];
    for (int i = 0; i < 12; i++) w[i] = (i / 4) != 1 ? NAN : em_test_gen(EM_F32, i % 4, 1);
    expect_vals(r, w, 12, "NaN fill, broadcast input");
    em_test_expect_shape(em_masked_fill(em_zeros(2, (int64_t[]){0, 4}, EM_F32, em_cpu()),
                                em_zeros(1, (int64_t[]){4}, EM_BOOL, em_cpu()), 1),
                 2, (int64_t[]){0, 4}, "empty");
    /* large: the parallel path */
    int64_t n = 1 << 18;
    em_tensor *big = em_arange(0, (double)n, 1, EM_F32, em_cpu());
    em_tensor *bm = em_expand(em_test_tensor(EM_BOOL, 1, (int64_t[]){1}, (double[]){1}), 1, &n);
    cr_assert_eq(em_masked_fill_(big, bm, -1), EM_OK);
    cr_assert_eq(em_item(em_sum(big, 0, NULL, false)), -(double)n);
    em_scope_end();
}

Test(masked_fill, errors) {
    em_scope_begin();
    em_tensor *x = em_zeros(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    EXPECT_FAIL(em_masked_fill(x, em_zeros(1, (int64_t[]){3}, EM_U8, em_cpu()), 1), EM_ERR_DTYPE,
                "masked_fill: the mask must be bool, got uint8");
    EXPECT_FAIL_ST(em_masked_fill_(x, em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu()), 1), EM_ERR_DTYPE,
                   "masked_fill_: the mask must be bool, got float32");
    EXPECT_FAIL(em_masked_fill(x, em_zeros(1, (int64_t[]){2}, EM_BOOL, em_cpu()), 1), EM_ERR_SHAPE,
                "masked_fill: input shape [2, 3] and mask shape [2] cannot be broadcast (dim -1: "
                "3 vs 2)");
    em_tensor *x3 = em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu());
    EXPECT_FAIL_ST(em_masked_fill_(x3, em_zeros(2, (int64_t[]){2, 3}, EM_BOOL, em_cpu()), 1), EM_ERR_SHAPE,
                   "masked_fill_: mask shape [2, 3] does not broadcast to the input's shape [3]");
    EXPECT_FAIL(em_masked_fill(x, NULL, 1), EM_ERR_INVALID, "masked_fill: input 1 is NULL");
    em_scope_end();
}

/* ---- one_hot ----------------------------------------------------------------------------------------- */

Test(one_hot, values_inference_layouts_and_errors) {
    em_scope_begin();
    int64_t iv[4] = {0, 3, 1, 1};
    em_tensor *x = make_i64(2, (int64_t[]){2, 2}, iv);
    for (int k = 0; k < 2; k++) {
        int64_t C = k ? 5 : -1, c = k ? 5 : 4;
        em_tensor *src = k ? em_transpose(em_contiguous(em_transpose(x, 0, 1)), 0, 1) : x;
        em_tensor *r = em_one_hot(src, C);
        em_test_expect_shape(r, 3, (int64_t[]){2, 2, c}, "one_hot");
        cr_assert_eq(em_tensor_dtype(r), EM_I64);
        double w[20] = {0};
        for (int i = 0; i < 4; i++) w[i * c + iv[i]] = 1;
        expect_vals(r, w, 4 * c, "one_hot");
    }
    em_tensor *r = em_one_hot(make_i64(0, NULL, (int64_t[]){2}), 4);
    em_test_expect_shape(r, 1, (int64_t[]){4}, "0-dim");
    expect_vals(r, (double[]){0, 0, 1, 0}, 4, "0-dim");
    em_tensor *e = em_empty(1, (int64_t[]){0}, EM_I64, em_cpu());
    em_test_expect_shape(em_one_hot(e, 4), 2, (int64_t[]){0, 4}, "empty");
    EXPECT_FAIL(em_one_hot(e, -1), EM_ERR_INVALID,
                "one_hot: cannot infer num_classes from an empty tensor; pass it");
    EXPECT_FAIL(em_one_hot(em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu()), 3), EM_ERR_DTYPE,
                "one_hot: expects an int64 tensor of class indices, got float32");
    EXPECT_FAIL(em_one_hot(x, 3), EM_ERR_RANGE,
                "one_hot: class value 3 is out of range for num_classes 3");
    em_tensor *neg = make_i64(1, (int64_t[]){3}, (int64_t[]){0, -3, 1});
    EXPECT_FAIL(em_one_hot(neg, 5), EM_ERR_RANGE, "one_hot: class values must be non-negative, got -3");
    EXPECT_FAIL(em_one_hot(neg, -1), EM_ERR_RANGE, "one_hot: class values must be non-negative, got -3");
    EXPECT_FAIL(em_one_hot(x, -2), EM_ERR_INVALID,
                "one_hot: num_classes must be -1 (infer it) or >= 0, got -2");
    EXPECT_FAIL(em_one_hot(x, 0), EM_ERR_RANGE, "one_hot: class value 0 is out of range for num_classes 0");
    EXPECT_FAIL(em_one_hot(NULL, 3), EM_ERR_INVALID, "one_hot: input 0 is NULL");
    em_scope_end();
}

/* ---- tril, triu ---------------------------------------------------------------------------------------- */

Test(tri, every_dtype_layout_and_diagonal) {
    static const int64_t diags[] = {-5, -1, 0, 1, 2, 7};
    char what[160];
    em_scope_begin();
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (size_t k = 0; k < sizeof diags / sizeof diags[0]; k++)
                for (int up = 0; up < 2; up++) {
                    em_dtype dt = em_test_all_dtypes[di];
                    int64_t shape[3] = {2, 3, 4}, kd = diags[k];
                    em_tensor *x = make(dt, 3, shape, 1, (layout)lay);
                    double w[24];
                    for (int64_t o = 0; o < 24; o++) {
                        int64_t i = (o / 4) % 3, j = o % 4;
                        bool keep = up ? j - i >= kd : j - i <= kd;
                        w[o] = keep ? em_test_gen(dt, o, 1) : 0;
                    }
                    WHAT("%s %s %s diagonal %lld", up ? "triu" : "tril", em_dtype_name(dt),
                         layout_name[lay], (long long)kd);
                    em_tensor *r = up ? em_triu(x, kd) : em_tril(x, kd);
                    em_test_expect_shape(r, 3, shape, what);
                    expect_vals(r, w, 24, what);
                    cr_assert_eq(up ? em_triu_(x, kd) : em_tril_(x, kd), EM_OK, "%s", em_last_error());
                    expect_vals(x, w, 24, what);
                }
    em_scope_end();
}

Test(tri, large_empty_and_errors) {
    em_scope_begin();
    int64_t shape[2] = {300, 200};
    em_tensor *x = em_ones(2, shape, EM_F32, em_cpu());
    /* tril(k = 0) of ones keeps sum_i min(i + 1, 200) elements */
    double want = 0;
    for (int i = 0; i < 300; i++) want += i + 1 < 200 ? i + 1 : 200;
    cr_assert_eq(em_item(em_sum(em_tril(x, 0), 0, NULL, false)), want);
    cr_assert_eq(em_item(em_sum(em_triu(x, 1), 0, NULL, false)), 60000 - want);
    em_test_expect_shape(em_tril(em_zeros(2, (int64_t[]){0, 3}, EM_F32, em_cpu()), 0), 2, (int64_t[]){0, 3}, "empty");
    em_test_expect_shape(em_triu(em_zeros(3, (int64_t[]){2, 3, 0}, EM_F32, em_cpu()), 0), 3, (int64_t[]){2, 3, 0}, "empty");
    em_tensor *v = em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu());
    EXPECT_FAIL(em_tril(v, 0), EM_ERR_SHAPE, "tril: expects a tensor with at least 2 dims, got shape [3]");
    EXPECT_FAIL(em_triu(em_scalar(1, EM_F32), 0), EM_ERR_SHAPE,
                "triu: expects a tensor with at least 2 dims, got shape []");
    EXPECT_FAIL_ST(em_tril_(v, 0), EM_ERR_SHAPE, "tril: expects a tensor with at least 2 dims");
    EXPECT_FAIL_ST(em_triu_(NULL, 0), EM_ERR_INVALID, "triu_: input 0 is NULL");
    em_scope_end();
}

/* ---- flip ------------------------------------------------------------------------------------------------ */

Test(flip, every_dtype_layout_and_dims) {
    static const struct {
        int n;
        int dims[3];
    } cases[] = {{0, {0}}, {1, {0}}, {1, {2}}, {2, {0, 2}}, {2, {-1, 1}}, {3, {2, 0, 1}}};
    char what[160];
    em_scope_begin();
    for (int di = 0; di < EM_TEST_N_DTYPES; di++)
        for (int lay = 0; lay < N_LAYOUTS; lay++)
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
                em_dtype dt = em_test_all_dtypes[di];
                int64_t shape[3] = {2, 3, 4};
                bool fl[3] = {false, false, false};
                for (int i = 0; i < cases[k].n; i++) fl[(cases[k].dims[i] + 3) % 3] = true;
                em_tensor *x = make(dt, 3, shape, 1, (layout)lay);
                double w[24];
                for (int64_t o = 0; o < 24; o++) {
                    int64_t c[3];
                    coords_of(3, shape, o, c);
                    for (int d = 0; d < 3; d++)
                        if (fl[d]) c[d] = shape[d] - 1 - c[d];
                    w[o] = em_test_gen(dt, lin_of(3, shape, c), 1);
                }
                WHAT("flip %s %s case %zu", em_dtype_name(dt), layout_name[lay], k);
                em_tensor *r = em_flip(x, cases[k].n, cases[k].dims);
                em_test_expect_shape(r, 3, shape, what);
                cr_assert(!em_tensor_shares_storage(r, x));
                expect_vals(r, w, 24, what);
            }
    em_scope_end();
}

Test(flip, scalars_broadcast_large_and_errors) {
    em_scope_begin();
    expect_vals(em_flip(em_scalar(3, EM_I32), 1, (int[]){0}), (double[]){3}, 1, "0-dim");
    em_test_expect_shape(em_flip(em_zeros(2, (int64_t[]){0, 3}, EM_F32, em_cpu()), 1, (int[]){0}), 2,
                 (int64_t[]){0, 3}, "empty");
    /* a broadcast input: rows are equal, flipping dim 1 reverses each */
    em_tensor *row = make(EM_F64, 2, (int64_t[]){1, 3}, 1, CONTIG);
    double w[6];
    for (int i = 0; i < 6; i++) w[i] = em_test_gen(EM_F64, 2 - i % 3, 1);
    expect_vals(em_flip(em_expand(row, 2, (int64_t[]){2, 3}), 2, (int[]){0, 1}), w, 6, "expanded");
    /* large: the parallel path */
    int64_t n = 1 << 18;
    em_tensor *big = em_arange(0, (double)n, 1, EM_F32, em_cpu());
    em_tensor *r = em_flip(em_view(big, 2, (int64_t[]){512, 512}), 2, (int[]){0, 1});
    em_tensor *back = em_sub(em_full(1, &n, (double)(n - 1), EM_F32, em_cpu()), big);
    double *g = em_test_values(r), *b = em_test_values(back);
    cr_assert(memcmp(g, b, sizeof(double) * (size_t)n) == 0, "large flip");
    free(g);
    free(b);
    em_tensor *x = em_zeros(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    EXPECT_FAIL(em_flip(x, 2, (int[]){0, -2}), EM_ERR_INVALID,
                "flip: dim 0 appears more than once in the list of dims");
    EXPECT_FAIL(em_flip(x, 1, (int[]){2}), EM_ERR_RANGE,
                "flip: dim 2 is out of range for a tensor with 2 dims");
    EXPECT_FAIL(em_flip(x, 1, NULL), EM_ERR_INVALID, "flip: 1 dims given");
    em_scope_end();
}

/* ---- linspace ---------------------------------------------------------------------------------------------- */

Test(linspace, floating_dtypes_against_a_double_reference) {
    static const struct {
        double start, end;
        int64_t steps;
    } cases[] = {{-1, 1, 7}, {0, 1, 2}, {3, -2.5, 11}, {0.1, 0.7, 1000}, {5, 5, 4}, {-7, 100, 1}};
    static const em_dtype flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    static const double tol[] = {1e-6, 1e-15, 0x1p-10, 0x1p-7};
    char what[160];
    em_scope_begin();
    for (int di = 0; di < 4; di++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            double a = cases[k].start, b = cases[k].end;
            int64_t n = cases[k].steps;
            double *w = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < n; i++) w[i] = n == 1 ? a : a + (b - a) * (double)i / (double)(n - 1);
            em_tensor *r = em_linspace(a, b, n, flt[di], em_cpu());
            WHAT("linspace(%g, %g, %lld) %s", a, b, (long long)n, em_dtype_name(flt[di]));
            em_test_expect_shape(r, 1, &n, what);
            cr_assert_eq(em_tensor_dtype(r), flt[di]);
            double scale = fmax(fabs(a), fabs(b));
            em_test_expect_close(r, w, n, tol[di], tol[di] * scale, what);
            /* both ends exact (rounded once to the dtype) */
            cr_assert_eq(em_test_at(r, 0), em_test_round_to(flt[di], a), "%s: start", what);
            cr_assert_eq(em_test_at(r, n - 1), em_test_round_to(flt[di], n == 1 ? a : b), "%s: end", what);
            free(w);
        }
    em_scope_end();
}

Test(linspace, integer_dtypes_like_pytorch_and_errors) {
    /* Values printed by tests/fixtures/gen_data.py (torch.linspace, PyTorch 1.13). */
    em_scope_begin();
    expect_vals(em_linspace(0, 10, 4, EM_I64, em_cpu()), (double[]){0, 3, 6, 10}, 4, "i64");
    expect_vals(em_linspace(0, 10, 5, EM_U8, em_cpu()), (double[]){0, 2, 5, 7, 10}, 5, "u8");
    expect_vals(em_linspace(0, -5, 3, EM_U8, em_cpu()), (double[]){0, 125, 251}, 3, "u8 wraps");
    expect_vals(em_linspace(0, 1, 3, EM_I32, em_cpu()), (double[]){0, 0, 1}, 3, "i32");
    expect_vals(em_linspace(-3.7, 3.7, 5, EM_I32, em_cpu()), (double[]){-3, -1, 0, 1, 3}, 5, "i32 trunc");
    em_test_expect_shape(em_linspace(0, 1, 0, EM_F32, em_cpu()), 1, (int64_t[]){0}, "no steps");
    EXPECT_FAIL(em_linspace(0, 1, -1, EM_F32, em_cpu()), EM_ERR_INVALID,
                "linspace: steps must be non-negative, got -1");
    EXPECT_FAIL(em_linspace(0, 1, 3, EM_BOOL, em_cpu()), EM_ERR_DTYPE,
                "linspace: not defined for bool");
    em_scope_end();
}
