/*
 * test_ops_coverage.c — the dtype x layout cells of issue 3's coverage matrix that the per-family
 * test files (test_ops*.c) leave open, each against an independent reference written here:
 *
 *   - the op-case table's rows with zero-size inputs (tests/op_cases.h: every elementwise op
 *     has contiguous and transposed empties and a (0, 1) against a broadcast operand) in
 *     every dtype: the result has the broadcast shape and the dtype the same call gives on
 *     the row's non-empty twin, and an op that refuses a dtype refuses it with the same
 *     status whether or not the input is empty; where and in-place ops on empty views;
 *   - reductions of empty tensors for every dtype (their identities: sum 0, prod 1, all true,
 *     any false, mean/var/std NaN, logsumexp -inf, norm 0; amax and friends EM_ERR_SHAPE), on
 *     contiguous and transposed empties, and mean of expanded (stride 0) inputs per float dtype;
 *   - index_select for every dtype on contiguous, transposed, sliced and expanded inputs with
 *     int64 and int32 indices that are themselves contiguous, sliced or expanded, and empty;
 *   - the data ops (pad, tril, triu, flip, gather, scatter, scatter_add, masked_fill,
 *     embedding, index_add, cat, stack) on expanded inputs for every dtype (test_ops_data
 *     covers their contiguous, transposed and sliced inputs);
 *   - em_to_dtype and em_copy_ between every pair of dtypes on transposed, sliced and expanded
 *     sources and into transposed and sliced destinations, and empty;
 *   - the nn ops (conv2d and its two gradients, max/avg/adaptive pooling and their gradients,
 *     batch_norm, layer_norm, softmax, log_softmax and their gradients) in f32, f64, f16 and
 *     bf16 on contiguous, transposed, sliced and expanded inputs, against plain loops in
 *     double, and on empty inputs in every floating dtype;
 *   - shape errors (every row of the op-case table that expects one): the message starts
 *     with the op and names both conflicting shapes.
 *
 * Tolerances (|got - want| <= atol + rtol |want|, NaN matching NaN):
 *   - data movement, conversions and reduction identities: exact;
 *   - nn ops: the reference is computed in double from the inputs as stored (f16/bf16 inputs
 *     are the rounded values the kernel sees); with M = max(1, max |want|) over the result,
 *       f64: rtol 1e-10, atol 1e-10 M     f32: rtol 1e-5, atol 1e-5 M
 *       f16: rtol 2^-10, atol 2^-10 M     bf16: rtol 2^-7, atol 2^-7 M
 *     (f16/bf16 compute in f32 and round the result once — half an ulp, 2^-11 and 2^-8 —
 *     plus the f32 accumulation over at most a few hundred terms; the atol term covers
 *     results that cancel to near 0, e.g. the norms' and softmax's gradients).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"
#include "tests/op_cases.h"

TestSuite(cover_elementwise, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(cover_reduce, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(cover_index, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(cover_convert, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(cover_nn, .init = em_test_setup, .fini = em_test_teardown);

#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define WHAT(...) snprintf(what, sizeof what, __VA_ARGS__)

static const em_dtype float_dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16};

/* ---- helpers ----------------------------------------------------------------------------------- */

static int64_t numel_of(int nd, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    return n;
}


static void expect_exact(const em_tensor *got, const double *want, int64_t n, const char *what) {
    em_test_expect_close(got, want, n, 0, 0, what);
}

/* ---- layouts of an N-D tensor ---------------------------------------------------------------- */

typedef enum layout { CONTIG, TRANSPOSED, SLICED, EXPANDED, N_LAYOUTS } layout;
static const char *const layout_names[] = {"contiguous", "transposed", "sliced", "expanded"};

/* A tensor of `shape` (nd >= 2) and dtype dt holding v (C order), owned by the caller's open
 * scope (as are its intermediates), laid
 * out as: contiguous; the last two dims swapped in memory (a transposed view); every other
 * element of a wider last dim (a step-2 slice); or dim 0 expanded from size 1 (stride 0; v
 * must then repeat its first block along dim 0, which expand_values() arranges). */
static em_tensor *make(em_dtype dt, int nd, const int64_t *shape, const double *v, layout lay) {
    em_tensor *c, *t;
    int64_t ws[EM_MAX_DIMS];
    memcpy(ws, shape, sizeof(int64_t) * (size_t)nd);
    switch (lay) {
    case CONTIG:
        return em_test_tensor(dt, nd, shape, v);
    case TRANSPOSED:
        ws[nd - 2] = shape[nd - 1], ws[nd - 1] = shape[nd - 2];
        t = em_transpose(em_zeros(nd, ws, dt, em_cpu()), nd - 2, nd - 1);
        break;
    case SLICED:
        ws[nd - 1] = 2 * shape[nd - 1] + 1;
        t = em_slice(em_full(nd, ws, 77, dt, em_cpu()), nd - 1, 1, ws[nd - 1], 2);
        break;
    case EXPANDED:
        ws[0] = 1;
        c = em_test_tensor(dt, nd, ws, v);
        t = em_expand(c, nd, shape);
        cr_assert(t, "expand: %s", em_last_error());
        return t;
    default:
        cr_assert_fail("bad layout");
        return NULL;
    }
    cr_assert(t, "layout %s: %s", layout_names[lay], em_last_error());
    c = em_test_tensor(dt, nd, shape, v);
    cr_assert_eq(em_copy_(t, c), EM_OK, "%s", em_last_error());
    if (numel_of(nd, shape) > 1 && shape[nd - 1] > 1 && shape[nd - 2] > 1)
        cr_assert(!em_tensor_is_contiguous(t), "layout %s is contiguous", layout_names[lay]);
    return t;
}

/* Makes v (n values of `shape`) repeat its first block along dim 0, as an expanded tensor
 * must. */
static void expand_values(int nd, const int64_t *shape, double *v) {
    int64_t n = numel_of(nd, shape), block = n / shape[0];
    for (int64_t i = block; i < n; i++) v[i] = v[i % block];
}

/* ======================================================================================= */
/* ---- elementwise ops on zero-size tensors --------------------------------------------------- */

/* ---- rows of the op-case table (tests/op_cases.h) ----------------------------------------- */

static bool row_has_empty_input(const em_op_case *c) {
    for (int i = 0; i < c->n_in; i++)
        if (!c->in[i].absent && numel_of(c->in[i].ndim, c->in[i].shape) == 0) return true;
    return false;
}

static bool attr_equal(const em_attr *a, const em_attr *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case EM_ATTR_FLOAT: return a->v.f == b->v.f || (isnan(a->v.f) && isnan(b->v.f));
    case EM_ATTR_INT: return a->v.i == b->v.i;
    case EM_ATTR_BOOL: return a->v.b == b->v.b;
    case EM_ATTR_STRING: return strcmp(a->v.s, b->v.s) == 0;
    case EM_ATTR_INTS: return a->n == b->n && memcmp(a->ints, b->ints, sizeof a->ints) == 0;
    case EM_ATTR_INT_LIST: return a->n == b->n && a->v.list == b->v.list;
    default: return true;
    }
}

/* The row before r of the same op, inputs and attributes, valid, with no empty input: the
 * non-empty call an empty row's call must agree with. NULL when the table has none. */
static const em_op_case *nonempty_twin(int r) {
    const em_op_case *c = em_op_case_get(r);
    for (int k = r - 1; k >= 0; k--) {
        const em_op_case *f = em_op_case_get(k);
        if (strcmp(f->op, c->op) != 0 || f->n_in != c->n_in || f->expect != EM_OK ||
            row_has_empty_input(f))
            continue;
        bool same = true;
        for (int j = 0; j < EM_CASE_MAX_ATTRS && same; j++)
            same = attr_equal(&f->attrs[j], &c->attrs[j]);
        for (int i = 0; i < c->n_in && same; i++)
            same = f->in[i].absent == c->in[i].absent && f->in[i].dtype == c->in[i].dtype;
        if (same) return f;
    }
    return NULL;
}

/* The broadcast of the row's input shapes into shape (plain loop); false when they do not
 * broadcast. */
static bool broadcast_of(em_tensor *const *in, int n, int *nd, int64_t *shape) {
    *nd = 0;
    for (int i = 0; i < n; i++)
        if (in[i] && em_tensor_ndim(in[i]) > *nd) *nd = em_tensor_ndim(in[i]);
    for (int d = 0; d < *nd; d++) shape[d] = 1;
    for (int i = 0; i < n; i++) {
        if (!in[i]) continue;
        int k = em_tensor_ndim(in[i]);
        for (int d = 0; d < k; d++) {
            int64_t s = em_tensor_shape(in[i])[d], *o = &shape[*nd - k + d];
            if (s != 1 && *o != 1 && s != *o) return false;
            if (s != 1) *o = s;
        }
    }
    return true;
}

static bool same_shape(const em_tensor *t, int nd, const int64_t *shape) {
    if (em_tensor_ndim(t) != nd) return false;
    for (int d = 0; d < nd; d++)
        if (em_tensor_shape(t)[d] != shape[d]) return false;
    return true;
}

/* The call on the empty operands agrees with the same call on non-empty ones of the same
 * dtypes: both fail with one status, or both succeed with one dtype, the empty one with
 * shape `shape`. */
static void agree(const em_tensor *empty_result, const em_tensor *full_result, em_status full_st,
                  int nd, const int64_t *shape, const char *what) {
    if (!full_result) {
        cr_assert_null(empty_result, "%s: the empty call succeeds where the non-empty one failed "
                       "(%s)", what, em_status_name(full_st));
        cr_assert_eq(em_last_status(), full_st, "%s: status %s, the non-empty call's %s (%s)",
                     what, em_status_name(em_last_status()), em_status_name(full_st),
                     em_last_error());
        return;
    }
    cr_assert(empty_result, "%s: %s (the non-empty call succeeds)", what, em_last_error());
    em_test_expect_shape(empty_result, nd, shape, what);
    cr_assert_eq(em_tensor_dtype(empty_result), em_tensor_dtype(full_result),
                 "%s: dtype %s, the non-empty call's %s", what,
                 em_dtype_name(em_tensor_dtype(empty_result)),
                 em_dtype_name(em_tensor_dtype(full_result)));
    cr_assert_eq(em_tensor_numel(empty_result), 0, "%s", what);
}

/* Every valid row of the op-case table with an empty input, in every dtype, against the row
 * before it of the same op and attributes with non-empty inputs (the table's elementwise
 * macros give each op contiguous and transposed empties, and (0, 1) against a broadcast
 * operand): both calls fail with one status, or both succeed with one dtype; where the
 * non-empty call's result has the broadcast shape of its inputs (an elementwise op), the
 * empty call's has its inputs' broadcast shape and no elements. */
Test(cover_elementwise, zero_size_rows_of_the_table_every_dtype) {
    char what[200];
    int checked = 0;
    for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
        const em_op_case *c = em_op_case_get(r), *f;
        if (!c->typed || c->expect != EM_OK || !row_has_empty_input(c) || !(f = nonempty_twin(r)))
            continue;
        for (int d = 0; d < EM_TEST_N_DTYPES; d++) {
            em_dtype dt = em_test_all_dtypes[d];
            cr_assert_eq(em_scope_begin(), EM_OK);
            em_tensor *fin[EM_CASE_MAX_IN] = {0}, *ein[EM_CASE_MAX_IN] = {0}, *fo[16] = {0},
                      *eo[16] = {0};
            int nf = 0, ne = 0;
            cr_assert_eq(em_case_inputs(f, dt, 1, fin), EM_OK, "%s", em_last_error());
            cr_assert_eq(em_case_inputs(c, dt, 1, ein), EM_OK, "%s", em_last_error());
            em_status sf = f->typed((const em_tensor *const *)fin, f->attrs, fo, &nf);
            em_status se = c->typed((const em_tensor *const *)ein, c->attrs, eo, &ne);
            WHAT("row %d, %s (%s) in %s, against row %d (%s)", r, c->op, c->variant,
                 em_dtype_name(dt), (int)(f - em_op_case_get(0)), f->variant);
            cr_assert_eq(se, sf, "%s: status %s, the non-empty call's %s (%s)", what,
                         em_status_name(se), em_status_name(sf), em_last_error());
            if (sf == EM_OK) {
                cr_assert_eq(em_tensor_dtype(eo[0]), em_tensor_dtype(fo[0]),
                             "%s: dtype %s, the non-empty call's %s", what,
                             em_dtype_name(em_tensor_dtype(eo[0])),
                             em_dtype_name(em_tensor_dtype(fo[0])));
                int nd;
                int64_t shape[EM_MAX_DIMS];
                if (broadcast_of(fin, f->n_in, &nd, shape) && same_shape(fo[0], nd, shape)) {
                    cr_assert(broadcast_of(ein, c->n_in, &nd, shape), "%s", what);
                    em_test_expect_shape(eo[0], nd, shape, what);
                    cr_assert_eq(em_tensor_numel(eo[0]), 0, "%s", what);
                }
                checked++;
            }
            em_clear_error();
            cr_assert_eq(em_scope_end(), EM_OK);
        }
    }
    cr_expect_gt(checked, 300, "only %d row-dtype pairs", checked);
}

/* where with an empty condition, and in-place ops on empty views, in every dtype. */
Test(cover_elementwise, zero_size_where_and_in_place_every_dtype) {
    char what[160];
    const int64_t s03[2] = {0, 3}, s30[2] = {3, 0}, s23[2] = {2, 3}, s3[1] = {3};
    for (int d = 0; d < EM_TEST_N_DTYPES; d++) {
        em_dtype dt = em_test_all_dtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *full = em_ones(2, s23, dt, em_cpu());
        em_tensor *empties[2] = {em_zeros(2, s03, dt, em_cpu()),
                                 em_transpose(em_zeros(2, s30, dt, em_cpu()), 0, 1)};
        em_tensor *b3 = em_ones(1, s3, dt, em_cpu());
        em_tensor *c = em_zeros(2, s03, EM_BOOL, em_cpu());
        WHAT("where %s", em_dtype_name(dt));
        agree(em_where(c, empties[1], b3), full, EM_OK, 2, s03, what);
        struct {
            const char *name;
            em_status st;
        } inplace[] = {
            {"add_", em_add_(empties[1], b3)},         {"mul_", em_mul_(empties[1], b3)},
            {"relu_", em_relu_(empties[1])},           {"abs_", em_abs_(empties[1])},
            {"sign_", em_sign_(empties[1])},           {"fill_", em_fill_(empties[1], 2)},
            {"add_scalar_", em_add_scalar_(empties[1], 1)},
            {"clamp_", em_clamp_(empties[1], &(double){0}, NULL)},
        };
        struct {
            em_status st;
        } inplace_full[] = {
            {em_add_(em_clone(full), b3)},   {em_mul_(em_clone(full), b3)},
            {em_relu_(em_clone(full))},      {em_abs_(em_clone(full))},
            {em_sign_(em_clone(full))},      {em_fill_(em_clone(full), 2)},
            {em_add_scalar_(em_clone(full), 1)},
            {em_clamp_(em_clone(full), &(double){0}, NULL)},
        };
        for (int k = 0; k < LEN(inplace); k++)
            cr_assert_eq(inplace[k].st, inplace_full[k].st, "%s of an empty %s view: %s, the "
                         "non-empty call's %s", inplace[k].name, em_dtype_name(dt),
                         em_status_name(inplace[k].st), em_status_name(inplace_full[k].st));
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* ======================================================================================= */
/* ---- reductions of empty tensors, mean of expanded inputs --------------------------------- */

Test(cover_reduce, empty_every_dtype) {
    char what[160];
    const int64_t s03[2] = {0, 3}, s30[2] = {3, 0}, s0[1] = {0}, s13[2] = {1, 3}, s3[1] = {3};
    for (int d = 0; d < EM_TEST_N_DTYPES; d++) {
        em_dtype dt = em_test_all_dtypes[d];
        bool fl = em_dtype_is_floating(dt);
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *zs[2] = {em_zeros(2, s03, dt, em_cpu()),
                            em_transpose(em_zeros(2, s30, dt, em_cpu()), 0, 1)};
        for (int e = 0; e < 2; e++) {
            em_tensor *z = zs[e];
            const char *lay = e ? "transposed" : "contiguous";
            em_dtype acc = fl ? dt : EM_I64;
            /* identities over every dim, over the empty dim (keepdim), the other dim */
            struct {
                const char *name;
                em_tensor *all, *d0, *d1;
                em_dtype dt;
                double v;
            } c[] = {
                {"sum", em_sum(z, 0, NULL, false), em_sum(z, 1, (const int[]){0}, true),
                 em_sum(z, 1, (const int[]){1}, false), acc, 0},
                {"prod", em_prod(z, 0, NULL, false), em_prod(z, 1, (const int[]){0}, true),
                 em_prod(z, 1, (const int[]){-1}, false), acc, 1},
                {"all", em_all(z, 0, NULL, false), em_all(z, 1, (const int[]){0}, true),
                 em_all(z, 1, (const int[]){1}, false), dt == EM_U8 ? EM_U8 : EM_BOOL, 1},
                {"any", em_any(z, 0, NULL, false), em_any(z, 1, (const int[]){0}, true),
                 em_any(z, 1, (const int[]){1}, false), dt == EM_U8 ? EM_U8 : EM_BOOL, 0},
                {"logsumexp", em_logsumexp(z, 0, NULL, false),
                 em_logsumexp(z, 1, (const int[]){0}, true),
                 em_logsumexp(z, 1, (const int[]){1}, false), fl ? dt : EM_F32, -INFINITY},
                {"mean", fl ? em_mean(z, 0, NULL, false) : NULL,
                 fl ? em_mean(z, 1, (const int[]){0}, true) : NULL,
                 fl ? em_mean(z, 1, (const int[]){1}, false) : NULL, dt, NAN},
                {"var", fl ? em_var(z, 0, NULL, 1, false) : NULL,
                 fl ? em_var(z, 1, (const int[]){0}, 0, true) : NULL,
                 fl ? em_var(z, 1, (const int[]){1}, 1, false) : NULL, dt, NAN},
                {"std", fl ? em_std(z, 0, NULL, 1, false) : NULL,
                 fl ? em_std(z, 1, (const int[]){0}, 0, true) : NULL,
                 fl ? em_std(z, 1, (const int[]){1}, 1, false) : NULL, dt, NAN},
                {"norm 2", fl ? em_norm(z, 2, 0, NULL, false) : NULL,
                 fl ? em_norm(z, 2, 1, (const int[]){0}, true) : NULL,
                 fl ? em_norm(z, 2, 1, (const int[]){1}, false) : NULL, dt, 0},
                {"norm 1", fl ? em_norm(z, 1, 0, NULL, false) : NULL,
                 fl ? em_norm(z, 1, 1, (const int[]){0}, true) : NULL,
                 fl ? em_norm(z, 1, 1, (const int[]){1}, false) : NULL, dt, 0},
            };
            for (int k = 0; k < LEN(c); k++) {
                if (!fl && k >= 5) continue; /* floating-only ops */
                WHAT("%s of an empty %s %s", c[k].name, lay, em_dtype_name(dt));
                em_test_expect_shape(c[k].all, 0, NULL, what);
                cr_assert_eq(em_tensor_dtype(c[k].all), c[k].dt, "%s: dtype %s", what,
                             em_dtype_name(em_tensor_dtype(c[k].all)));
                expect_exact(c[k].all, &c[k].v, 1, what);
                double v3[3] = {c[k].v, c[k].v, c[k].v};
                em_test_expect_shape(c[k].d0, 2, s13, what);
                cr_assert_eq(em_tensor_dtype(c[k].d0), c[k].dt, "%s", what);
                expect_exact(c[k].d0, v3, 3, what);
                em_test_expect_shape(c[k].d1, 1, s0, what);
                cr_assert_eq(em_tensor_dtype(c[k].d1), c[k].dt, "%s", what);
            }
            /* no identity: over the empty dim an error, over the other an empty result */
            WHAT("amax/amin/argmax/max_dim of an empty %s %s", lay, em_dtype_name(dt));
            cr_assert_null(em_amax(z, 1, (const int[]){0}, false), "%s", what);
            em_assert_error(EM_ERR_SHAPE, "amax: expected reduction dim 0 to have non-zero size");
            cr_assert_null(em_amin(z, 0, NULL, false), "%s", what);
            em_assert_error(EM_ERR_SHAPE, "amin");
            em_test_expect_shape(em_amin(z, 1, (const int[]){1}, true), 2, (const int64_t[]){0, 1}, what);
            em_tensor *v, *i;
            cr_assert_eq(em_min_dim(z, 1, false, &v, &i), EM_OK, "%s: %s", what, em_last_error());
            em_test_expect_shape(v, 1, s0, what);
            em_test_expect_shape(i, 1, s0, what);
            cr_assert_eq(em_tensor_dtype(i), EM_I64);
            cr_assert_eq(em_max_dim(z, 0, true, &v, &i), EM_ERR_SHAPE, "%s", what);
            if (dt != EM_BOOL) {
                em_test_expect_shape(em_argmax(z, (const int[]){1}, false), 1, s0, what);
                cr_assert_null(em_argmin(z, (const int[]){0}, false), "%s", what);
                em_assert_error(EM_ERR_SHAPE, "argmin");
            }
            if (fl) {
                cr_assert_null(em_norm(z, INFINITY, 0, NULL, false), "%s", what);
                em_assert_error(EM_ERR_SHAPE, "norm");
            }
        }
        /* [3, 0] reduced over its empty dim 1 gives [3] identities */
        em_tensor *z30 = em_zeros(2, s30, dt, em_cpu());
        WHAT("sum over the empty dim of [3, 0] %s", em_dtype_name(dt));
        em_test_expect_shape(em_sum(z30, 1, (const int[]){1}, false), 1, s3, what);
        expect_exact(em_sum(z30, 1, (const int[]){1}, false), (const double[]){0, 0, 0}, 3, what);
        expect_exact(em_prod(z30, 1, (const int[]){-1}, false), (const double[]){1, 1, 1}, 3,
                     what);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(cover_reduce, mean_var_norm_of_expanded_inputs) {
    char what[160];
    enum { R = 6, C = 5 };
    for (int d = 0; d < LEN(float_dtypes); d++) {
        em_dtype dt = float_dtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        double row[C], v[R * C];
        for (int j = 0; j < C; j++) row[j] = em_test_round_to(dt, em_test_gen(dt, j, 3));
        for (int i = 0; i < R * C; i++) v[i] = row[i % C];
        em_tensor *x = make(dt, 2, (const int64_t[]){R, C}, v, EXPANDED);
        /* over dim 0 every column is R copies of one value: mean = it, var = 0, norm
         * = sqrt(R) |it|; over dim 1 every row is `row` */
        double mrow = 0, vrow = 0, nrow = 0;
        for (int j = 0; j < C; j++) mrow += row[j] / C;
        for (int j = 0; j < C; j++) vrow += (row[j] - mrow) * (row[j] - mrow) / (C - 1), nrow += row[j] * row[j];
        double w0[C], wv0[C], wn0[C], w1[R], wv1[R], wn1[R];
        for (int j = 0; j < C; j++)
            w0[j] = row[j], wv0[j] = 0, wn0[j] = em_test_round_to(dt, sqrt((double)R) * fabs(row[j]));
        for (int i = 0; i < R; i++)
            w1[i] = em_test_round_to(dt, mrow), wv1[i] = em_test_round_to(dt, vrow),
            wn1[i] = em_test_round_to(dt, sqrt(nrow));
        double rt = dt == EM_F64 ? 1e-12 : dt == EM_F32 ? 1e-6 : dt == EM_F16 ? 0x1p-9 : 0x1p-6;
        WHAT("mean/var/norm of an expanded %s", em_dtype_name(dt));
        em_test_expect_close(em_mean(x, 1, (const int[]){0}, false), w0, C, rt, 0, what);
        em_test_expect_close(em_var(x, 1, (const int[]){0}, 1, false), wv0, C, rt, 0, what);
        em_test_expect_close(em_norm(x, 2, 1, (const int[]){0}, false), wn0, C, rt, 0, what);
        em_test_expect_close(em_mean(x, 1, (const int[]){1}, false), w1, R, rt, 0, what);
        em_test_expect_close(em_var(x, 1, (const int[]){1}, 1, false), wv1, R, rt, 0, what);
        em_test_expect_close(em_norm(x, 2, 1, (const int[]){-1}, false), wn1, R, rt, 0, what);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* ======================================================================================= */
/* ---- index_select -------------------------------------------------------------------------- */

/* A 1-D index tensor holding iv (n values) as dtype it (int64 or int32): contiguous, every
 * other element of a longer one, or one value expanded (then iv's values must all be iv[0]). */
static em_tensor *make_index(em_dtype it, int64_t n, const int64_t *iv, layout lay) {
    double v[16];
    cr_assert(n <= 8);
    for (int64_t i = 0; i < n; i++) v[i] = (double)iv[i];
    if (lay == EXPANDED) {
        em_tensor *one = em_test_tensor(it, 1, (const int64_t[]){1}, v);
        return em_expand(one, 1, &n);
    }
    if (lay != SLICED) return em_test_tensor(it, 1, &n, v);
    double w[16];
    for (int64_t i = 0; i < n; i++) w[2 * i] = v[i], w[2 * i + 1] = -5;
    em_tensor *wide = em_test_tensor(it, 1, (const int64_t[]){2 * n}, w);
    return em_slice(wide, 0, 0, 2 * n, 2);
}

Test(cover_index, index_select_every_dtype_layout_and_index) {
    char what[160];
    enum { R = 4, C = 5 };
    const int64_t shape[2] = {R, C};
    const int64_t iv[3][4] = {{3, 0, 3, 1}, {2, 2, 2, 2}, {3, 1, 0, 2}};
    const layout ilay[3] = {CONTIG, EXPANDED, SLICED};
    const em_dtype itypes[2] = {EM_I64, EM_I32};
    for (int d = 0; d < EM_TEST_N_DTYPES; d++)
        for (int l = 0; l < N_LAYOUTS; l++) {
            em_dtype dt = em_test_all_dtypes[d];
            cr_assert_eq(em_scope_begin(), EM_OK);
            double v[R * C];
            for (int i = 0; i < R * C; i++) v[i] = em_test_round_to(dt, em_test_gen(dt, i, 9));
            if (l == EXPANDED) expand_values(2, shape, v);
            em_tensor *x = make(dt, 2, shape, v, (layout)l);
            for (int k = 0; k < 3; k++)
                for (int t = 0; t < 2; t++)
                    for (int dim = 0; dim < 2; dim++) {
                        em_tensor *idx = make_index(itypes[t], 4, iv[k], ilay[k]);
                        cr_assert(idx, "%s", em_last_error());
                        em_tensor *y = em_index_select(x, dim - 2 * (k == 2), idx);
                        WHAT("index_select %s %s dim %d, %s index %s", em_dtype_name(dt),
                             layout_names[l], dim, em_dtype_name(itypes[t]),
                             layout_names[ilay[k]]);
                        int64_t ys[2] = {dim ? R : 4, dim ? 4 : C}, n = ys[0] * ys[1];
                        double want[20];
                        for (int64_t o = 0; o < n; o++) {
                            int64_t i = o / ys[1], j = o % ys[1];
                            want[o] = dim ? v[i * C + iv[k][j]] : v[iv[k][i] * C + j];
                        }
                        em_test_expect_shape(y, 2, ys, what);
                        cr_assert_eq(em_tensor_dtype(y), dt, "%s", what);
                        expect_exact(y, want, n, what);
                    }
            /* an empty index, and an empty input along the other dim */
            em_tensor *e = em_zeros(1, (const int64_t[]){0}, EM_I64, em_cpu());
            WHAT("index_select %s %s with an empty index", em_dtype_name(dt), layout_names[l]);
            em_test_expect_shape(em_index_select(x, 1, e), 2, (const int64_t[]){R, 0}, what);
            em_tensor *x0 = em_narrow(x, 1, 2, 0);
            em_test_expect_shape(em_index_select(x0, 0, make_index(EM_I64, 2, (const int64_t[]){3, 1},
                                                           CONTIG)),
                         2, (const int64_t[]){2, 0}, what);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

/* ======================================================================================= */
/* ---- conversions: em_to_dtype and em_copy_ between every pair, every layout ------------------ */

/* Source value i for a conversion from `from` to `to`: representable in `from`, and not
 * negative when either side is uint8 (negative floats to uint8 are not specified). */
static double conv_value(em_dtype from, em_dtype to, int64_t i) {
    double v = em_test_round_to(from, em_test_gen(from, i, 4));
    if (from == EM_U8 || to == EM_U8) v = em_test_round_to(from, fabs(v));
    return v;
}

Test(cover_convert, to_dtype_and_copy_every_pair_and_layout) {
    char what[160];
    enum { R = 3, C = 7 };
    const int64_t shape[2] = {R, C};
    for (int a = 0; a < EM_TEST_N_DTYPES; a++)
        for (int b = 0; b < EM_TEST_N_DTYPES; b++) {
            em_dtype from = em_test_all_dtypes[a], to = em_test_all_dtypes[b];
            cr_assert_eq(em_scope_begin(), EM_OK);
            for (int l = 0; l < N_LAYOUTS; l++) {
                double v[R * C], want[R * C];
                for (int i = 0; i < R * C; i++) v[i] = conv_value(from, to, i);
                if (l == EXPANDED) expand_values(2, shape, v);
                for (int i = 0; i < R * C; i++) want[i] = em_test_round_to(to, v[i]);
                em_tensor *x = make(from, 2, shape, v, (layout)l);
                WHAT("to_dtype %s -> %s, %s source", em_dtype_name(from), em_dtype_name(to),
                     layout_names[l]);
                em_tensor *y = em_to_dtype(x, to);
                em_test_expect_shape(y, 2, shape, what);
                cr_assert_eq(em_tensor_dtype(y), to, "%s", what);
                expect_exact(y, want, R * C, what);
                /* into a transposed and into a sliced destination */
                for (int dl = TRANSPOSED; dl <= SLICED; dl++) {
                    double junk[R * C];
                    for (int i = 0; i < R * C; i++) junk[i] = em_test_round_to(to, 1);
                    em_tensor *dst = make(to, 2, shape, junk, (layout)dl);
                    WHAT("copy_ %s -> %s, %s source into a %s destination", em_dtype_name(from),
                         em_dtype_name(to), layout_names[l], layout_names[dl]);
                    cr_assert_eq(em_copy_(dst, x), EM_OK, "%s: %s", what, em_last_error());
                    expect_exact(dst, want, R * C, what);
                }
            }
            /* a broadcast source row into a transposed destination */
            double row[C], wrow[R * C], junk[R * C];
            for (int j = 0; j < C; j++) row[j] = conv_value(from, to, j + 3);
            for (int i = 0; i < R * C; i++) wrow[i] = em_test_round_to(to, row[i % C]), junk[i] = 0;
            em_tensor *dst = make(to, 2, shape, junk, TRANSPOSED);
            WHAT("copy_ of a [%d] %s row into a transposed [%d, %d] %s", C, em_dtype_name(from),
                 R, C, em_dtype_name(to));
            cr_assert_eq(em_copy_(dst, em_test_tensor(from, 1, (const int64_t[]){C}, row)), EM_OK,
                         "%s: %s", what, em_last_error());
            expect_exact(dst, wrow, R * C, what);
            /* empty */
            em_tensor *e = em_transpose(em_zeros(2, (const int64_t[]){0, 3}, from, em_cpu()), 0, 1);
            WHAT("to_dtype of an empty %s -> %s", em_dtype_name(from), em_dtype_name(to));
            em_tensor *ye = em_to_dtype(e, to);
            em_test_expect_shape(ye, 2, (const int64_t[]){3, 0}, what);
            cr_assert_eq(em_tensor_dtype(ye), to, "%s", what);
            cr_assert_eq(em_copy_(em_zeros(2, (const int64_t[]){3, 0}, to, em_cpu()), e), EM_OK,
                         "%s: %s", what, em_last_error());
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

/* ======================================================================================= */
/* ---- nn ops in every floating dtype and layout, against plain loops in double --------------- */

enum { N_ = 2, C_ = 3, H_ = 5, W_ = 6, X_N = N_ * C_ * H_ * W_ };
static const int64_t xshape[4] = {N_, C_, H_, W_};

static void nn_tol(em_dtype dt, double *rtol, double *atol) {
    switch (dt) {
    case EM_F64: *rtol = 1e-10, *atol = 1e-10; break;
    case EM_F32: *rtol = 1e-5, *atol = 1e-5; break;
    case EM_F16: *rtol = 0x1p-10, *atol = 0x1p-10; break;
    default: *rtol = 0x1p-7, *atol = 0x1p-7; break;
    }
}

/* got against want (n values) with dt's nn tolerance, atol scaled by max(1, max |want|). */
static void expect_nn(const em_tensor *got, em_dtype dt, const double *want, int64_t n,
                      const char *what) {
    double rtol, atol, m = 1;
    nn_tol(dt, &rtol, &atol);
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs(want[i]));
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_dtype(got), dt, "%s: dtype %s", what,
                 em_dtype_name(em_tensor_dtype(got)));
    em_test_expect_close(got, want, n, rtol, atol * m, what);
}

/* n distinct values (a permutation of -n/2 .. n/2 - 1, times `scale`, a power of two so that
 * every value is exact in f16 and bf16 for n <= 512), repeated along dim 0 for EXPANDED. */
static double *distinct_values(int nd, const int64_t *shape, int seed, double scale, layout lay) {
    int64_t n = numel_of(nd, shape);
    double *v = malloc(sizeof(double) * (size_t)n);
    cr_assert(n % 97 != 0 && n <= 512, "distinct_values: %lld values", (long long)n);
    for (int64_t i = 0; i < n; i++) /* 97 is prime and does not divide n: a permutation */
        v[i] = (double)((i * 97 + seed * 31) % n - n / 2) * scale;
    if (lay == EXPANDED) expand_values(nd, shape, v);
    return v;
}

/* Index of (n, c, h, w) in a contiguous (N, C, H, W). */
static int64_t at4(const int64_t *s, int64_t n, int64_t c, int64_t h, int64_t w) {
    return ((n * s[1] + c) * s[2] + h) * s[3] + w;
}

typedef struct conv_cfg {
    int64_t O, kh, kw, stride[2], padding[2], dilation[2], groups;
} conv_cfg;

static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

static void check_conv(em_dtype dt, layout lay, const conv_cfg *cf) {
    char what[160];
    int64_t Cg = C_ / cf->groups, Og = cf->O / cf->groups;
    int64_t ws[4] = {cf->O, Cg, cf->kh, cf->kw};
    int64_t OH = conv_out(H_, cf->kh, cf->stride[0], cf->padding[0], cf->dilation[0]);
    int64_t OW = conv_out(W_, cf->kw, cf->stride[1], cf->padding[1], cf->dilation[1]);
    int64_t ys[4] = {N_, cf->O, OH, OW}, ny = numel_of(4, ys), nw = numel_of(4, ws);
    double *x = distinct_values(4, xshape, 1, 0.125, lay);
    double *w = distinct_values(4, ws, 2, 0.125, lay);
    double *gy = distinct_values(4, ys, 3, 0.125, lay);
    double b[8];
    for (int64_t o = 0; o < cf->O; o++) b[o] = em_test_round_to(dt, 0.25 * (double)o - 0.5);
    double *y = calloc((size_t)ny, sizeof(double)), *gx = calloc(X_N, sizeof(double));
    double *gw = calloc((size_t)nw, sizeof(double)), gb[8] = {0};
    for (int64_t n = 0; n < N_; n++)
        for (int64_t o = 0; o < cf->O; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t yi = at4(ys, n, o, oh, ow);
                    y[yi] += b[o];
                    gb[o] += gy[yi];
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t i = 0; i < cf->kh; i++)
                            for (int64_t j = 0; j < cf->kw; j++) {
                                int64_t ih = oh * cf->stride[0] - cf->padding[0] + i * cf->dilation[0];
                                int64_t iw = ow * cf->stride[1] - cf->padding[1] + j * cf->dilation[1];
                                if (ih < 0 || ih >= H_ || iw < 0 || iw >= W_) continue;
                                int64_t xi = at4(xshape, n, (o / Og) * Cg + c, ih, iw);
                                int64_t wi = at4(ws, o, c, i, j);
                                y[yi] += x[xi] * w[wi];
                                gx[xi] += gy[yi] * w[wi];
                                gw[wi] += gy[yi] * x[xi];
                            }
                }
    em_tensor *tx = make(dt, 4, xshape, x, lay), *tw = make(dt, 4, ws, w, lay);
    em_tensor *tgy = make(dt, 4, ys, gy, lay);
    em_tensor *tb = em_test_tensor(dt, 1, &cf->O, b);
    WHAT("conv2d %s %s groups %lld", em_dtype_name(dt), layout_names[lay], (long long)cf->groups);
    em_tensor *ty = em_conv2d(tx, tw, tb, cf->stride, cf->padding, cf->dilation, cf->groups);
    em_test_expect_shape(ty, 4, ys, what);
    expect_nn(ty, dt, y, ny, what);
    WHAT("conv2d_backward_data %s %s groups %lld", em_dtype_name(dt), layout_names[lay],
         (long long)cf->groups);
    em_tensor *tgx = em_conv2d_backward_data(tgy, tw, (const int64_t[]){H_, W_}, cf->stride,
                                             cf->padding, cf->dilation, cf->groups);
    em_test_expect_shape(tgx, 4, xshape, what);
    expect_nn(tgx, dt, gx, X_N, what);
    WHAT("conv2d_backward_weight %s %s groups %lld", em_dtype_name(dt), layout_names[lay],
         (long long)cf->groups);
    em_tensor *tgw, *tgb;
    cr_assert_eq(em_conv2d_backward_weight(tx, tgy, (const int64_t[]){cf->kh, cf->kw}, cf->stride,
                                           cf->padding, cf->dilation, cf->groups, &tgw, &tgb),
                 EM_OK, "%s: %s", what, em_last_error());
    em_test_expect_shape(tgw, 4, ws, what);
    expect_nn(tgw, dt, gw, nw, what);
    expect_nn(tgb, dt, gb, cf->O, what);
    free(x), free(w), free(gy), free(y), free(gx), free(gw);
}

Test(cover_nn, conv2d_every_dtype_and_layout) {
    const conv_cfg cfgs[2] = {
        {4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1},
        {6, 2, 3, {2, 1}, {1, 2}, {1, 2}, 3},
    };
    for (int d = 0; d < LEN(float_dtypes); d++)
        for (int l = 0; l < N_LAYOUTS; l++)
            for (int c = 0; c < 2; c++) {
                cr_assert_eq(em_scope_begin(), EM_OK);
                check_conv(float_dtypes[d], (layout)l, &cfgs[c]);
                cr_assert_eq(em_scope_end(), EM_OK);
            }
}

/* Output size of a pooling window (PyTorch's rule, ceil_mode's last window starting inside
 * the input or the left padding). */
static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
    int64_t span = in + 2 * p - d * (k - 1) - 1;
    int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
    if (ceil_mode && (o - 1) * s >= in + p) o--;
    return o;
}

typedef struct pool_cfg {
    int64_t k[2], s[2], p[2], d[2];
    bool ceil_mode, count_include_pad;
} pool_cfg;

static void check_max_pool(em_dtype dt, layout lay, const pool_cfg *pc) {
    char what[160];
    int64_t OH = pool_out(H_, pc->k[0], pc->s[0], pc->p[0], pc->d[0], pc->ceil_mode);
    int64_t OW = pool_out(W_, pc->k[1], pc->s[1], pc->p[1], pc->d[1], pc->ceil_mode);
    int64_t ys[4] = {N_, C_, OH, OW}, ny = numel_of(4, ys);
    double *x = distinct_values(4, xshape, 4, 0.125, lay), *gy = distinct_values(4, ys, 5, 0.25, lay);
    double *y = malloc(sizeof(double) * (size_t)ny), *idx = malloc(sizeof(double) * (size_t)ny);
    double *gx = calloc(X_N, sizeof(double));
    for (int64_t n = 0; n < N_; n++)
        for (int64_t c = 0; c < C_; c++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double m = -INFINITY;
                    int64_t mi = -1;
                    for (int64_t i = 0; i < pc->k[0]; i++)
                        for (int64_t j = 0; j < pc->k[1]; j++) {
                            int64_t ih = oh * pc->s[0] - pc->p[0] + i * pc->d[0];
                            int64_t iw = ow * pc->s[1] - pc->p[1] + j * pc->d[1];
                            if (ih < 0 || ih >= H_ || iw < 0 || iw >= W_) continue;
                            double v = x[at4(xshape, n, c, ih, iw)];
                            if (v > m) m = v, mi = ih * W_ + iw;
                        }
                    cr_assert_geq(mi, 0, "a window without an input element");
                    int64_t o = at4(ys, n, c, oh, ow);
                    y[o] = m, idx[o] = (double)mi;
                    gx[(n * C_ + c) * H_ * W_ + mi] += gy[o];
                }
    em_tensor *tx = make(dt, 4, xshape, x, lay), *tgy = make(dt, 4, ys, gy, lay), *ty, *ti;
    WHAT("max_pool2d %s %s k (%lld, %lld) ceil %d", em_dtype_name(dt), layout_names[lay],
         (long long)pc->k[0], (long long)pc->k[1], pc->ceil_mode);
    cr_assert_eq(em_max_pool2d(tx, pc->k, pc->s, pc->p, pc->d, pc->ceil_mode, &ty, &ti), EM_OK,
                 "%s: %s", what, em_last_error());
    em_test_expect_shape(ty, 4, ys, what);
    cr_assert_eq(em_tensor_dtype(ty), dt, "%s", what);
    expect_exact(ty, y, ny, what); /* the maximum is one of the inputs */
    cr_assert_eq(em_tensor_dtype(ti), EM_I64, "%s", what);
    expect_exact(ti, idx, ny, what);
    WHAT("max_pool2d_backward %s %s", em_dtype_name(dt), layout_names[lay]);
    em_tensor *tgx = em_max_pool2d_backward(tgy, ti, (const int64_t[]){H_, W_});
    em_test_expect_shape(tgx, 4, xshape, what);
    expect_nn(tgx, dt, gx, X_N, what);
    free(x), free(gy), free(y), free(idx), free(gx);
}

static void check_avg_pool(em_dtype dt, layout lay, const pool_cfg *pc) {
    char what[160];
    int64_t OH = pool_out(H_, pc->k[0], pc->s[0], pc->p[0], 1, pc->ceil_mode);
    int64_t OW = pool_out(W_, pc->k[1], pc->s[1], pc->p[1], 1, pc->ceil_mode);
    int64_t ys[4] = {N_, C_, OH, OW}, ny = numel_of(4, ys);
    double *x = distinct_values(4, xshape, 6, 0.125, lay), *gy = distinct_values(4, ys, 7, 0.25, lay);
    double *y = calloc((size_t)ny, sizeof(double)), *gx = calloc(X_N, sizeof(double));
    for (int64_t n = 0; n < N_; n++)
        for (int64_t c = 0; c < C_; c++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t h0 = oh * pc->s[0] - pc->p[0], w0 = ow * pc->s[1] - pc->p[1];
                    int64_t h1 = h0 + pc->k[0] < H_ + pc->p[0] ? h0 + pc->k[0] : H_ + pc->p[0];
                    int64_t w1 = w0 + pc->k[1] < W_ + pc->p[1] ? w0 + pc->k[1] : W_ + pc->p[1];
                    int64_t pool = (h1 - h0) * (w1 - w0);
                    h0 = h0 < 0 ? 0 : h0, w0 = w0 < 0 ? 0 : w0;
                    h1 = h1 > H_ ? H_ : h1, w1 = w1 > W_ ? W_ : w1;
                    double div = pc->count_include_pad ? (double)pool : (double)((h1 - h0) * (w1 - w0));
                    int64_t o = at4(ys, n, c, oh, ow);
                    for (int64_t ih = h0; ih < h1; ih++)
                        for (int64_t iw = w0; iw < w1; iw++) {
                            y[o] += x[at4(xshape, n, c, ih, iw)] / div;
                            gx[at4(xshape, n, c, ih, iw)] += gy[o] / div;
                        }
                }
    em_tensor *tx = make(dt, 4, xshape, x, lay), *tgy = make(dt, 4, ys, gy, lay);
    WHAT("avg_pool2d %s %s ceil %d count_include_pad %d", em_dtype_name(dt), layout_names[lay],
         pc->ceil_mode, pc->count_include_pad);
    em_tensor *ty = em_avg_pool2d(tx, pc->k, pc->s, pc->p, pc->ceil_mode, pc->count_include_pad);
    em_test_expect_shape(ty, 4, ys, what);
    expect_nn(ty, dt, y, ny, what);
    WHAT("avg_pool2d_backward %s %s ceil %d count_include_pad %d", em_dtype_name(dt),
         layout_names[lay], pc->ceil_mode, pc->count_include_pad);
    em_tensor *tgx = em_avg_pool2d_backward(tgy, (const int64_t[]){H_, W_}, pc->k, pc->s, pc->p,
                                            pc->ceil_mode, pc->count_include_pad);
    em_test_expect_shape(tgx, 4, xshape, what);
    expect_nn(tgx, dt, gx, X_N, what);
    free(x), free(gy), free(y), free(gx);
}

static void check_adaptive(em_dtype dt, layout lay, int64_t OH, int64_t OW) {
    char what[160];
    int64_t ys[4] = {N_, C_, OH, OW}, ny = numel_of(4, ys);
    double *x = distinct_values(4, xshape, 8, 0.125, lay), *gy = distinct_values(4, ys, 9, 0.25, lay);
    double *y = calloc((size_t)ny, sizeof(double)), *gx = calloc(X_N, sizeof(double));
    for (int64_t n = 0; n < N_; n++)
        for (int64_t c = 0; c < C_; c++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t h0 = oh * H_ / OH, h1 = ((oh + 1) * H_ + OH - 1) / OH;
                    int64_t w0 = ow * W_ / OW, w1 = ((ow + 1) * W_ + OW - 1) / OW;
                    double cnt = (double)((h1 - h0) * (w1 - w0));
                    int64_t o = at4(ys, n, c, oh, ow);
                    for (int64_t ih = h0; ih < h1; ih++)
                        for (int64_t iw = w0; iw < w1; iw++) {
                            y[o] += x[at4(xshape, n, c, ih, iw)] / cnt;
                            gx[at4(xshape, n, c, ih, iw)] += gy[o] / cnt;
                        }
                }
    em_tensor *tx = make(dt, 4, xshape, x, lay), *tgy = make(dt, 4, ys, gy, lay);
    WHAT("adaptive_avg_pool2d %s %s to (%lld, %lld)", em_dtype_name(dt), layout_names[lay],
         (long long)OH, (long long)OW);
    em_tensor *ty = em_adaptive_avg_pool2d(tx, (const int64_t[]){OH, OW});
    em_test_expect_shape(ty, 4, ys, what);
    expect_nn(ty, dt, y, ny, what);
    WHAT("adaptive_avg_pool2d_backward %s %s to (%lld, %lld)", em_dtype_name(dt),
         layout_names[lay], (long long)OH, (long long)OW);
    em_tensor *tgx = em_adaptive_avg_pool2d_backward(tgy, (const int64_t[]){H_, W_});
    em_test_expect_shape(tgx, 4, xshape, what);
    expect_nn(tgx, dt, gx, X_N, what);
    free(x), free(gy), free(y), free(gx);
}

Test(cover_nn, pooling_every_dtype_and_layout) {
    const pool_cfg maxc[2] = {
        {{2, 3}, {2, 1}, {1, 1}, {1, 1}, false, false},
        {{3, 2}, {2, 2}, {1, 1}, {2, 1}, true, false},
    };
    const pool_cfg avgc[3] = {
        {{2, 2}, {2, 2}, {0, 0}, {1, 1}, false, true},
        {{3, 2}, {2, 2}, {1, 1}, {1, 1}, true, true},
        {{3, 2}, {2, 2}, {1, 1}, {1, 1}, true, false},
    };
    for (int d = 0; d < LEN(float_dtypes); d++)
        for (int l = 0; l < N_LAYOUTS; l++) {
            cr_assert_eq(em_scope_begin(), EM_OK);
            for (int c = 0; c < 2; c++) check_max_pool(float_dtypes[d], (layout)l, &maxc[c]);
            for (int c = 0; c < 3; c++) check_avg_pool(float_dtypes[d], (layout)l, &avgc[c]);
            check_adaptive(float_dtypes[d], (layout)l, 2, 4);
            check_adaptive(float_dtypes[d], (layout)l, 3, 3);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

/* The per-channel / per-row statistics of a half input are f32 (ops.h's nn rules). */
static em_dtype stat_dtype(em_dtype dt) { return dt == EM_F16 || dt == EM_BF16 ? EM_F32 : dt; }

static void check_batch_norm(em_dtype dt, layout lay, bool training) {
    char what[160];
    const double eps = 1e-5, mom = 0.1, M = N_ * H_ * W_;
    double *x = distinct_values(4, xshape, 10, 0.125, lay), *gy = distinct_values(4, xshape, 11, 0.25, lay);
    double w[C_], b[C_], rm[C_], rv[C_], mean[C_], invstd[C_], rm2[C_], rv2[C_];
    double gw[C_] = {0}, gb[C_] = {0}, *y = malloc(sizeof(double) * X_N), *gx = malloc(sizeof(double) * X_N);
    for (int c = 0; c < C_; c++) {
        w[c] = 0.75 + 0.25 * c, b[c] = 0.5 * c - 0.25, rm[c] = 0.5 - 0.25 * c, rv[c] = 1.5 + c;
        double s = 0, ss = 0;
        for (int n = 0; n < N_; n++)
            for (int i = 0; i < H_ * W_; i++) s += x[(n * C_ + c) * H_ * W_ + i];
        double mu = s / M;
        for (int n = 0; n < N_; n++)
            for (int i = 0; i < H_ * W_; i++) {
                double dv = x[(n * C_ + c) * H_ * W_ + i] - mu;
                ss += dv * dv;
            }
        double var = ss / M;
        mean[c] = training ? mu : rm[c];
        invstd[c] = 1 / sqrt((training ? var : rv[c]) + eps);
        rm2[c] = em_test_round_to(dt, training ? (1 - mom) * rm[c] + mom * mu : rm[c]);
        rv2[c] = em_test_round_to(dt, training ? (1 - mom) * rv[c] + mom * ss / (M - 1) : rv[c]);
        for (int n = 0; n < N_; n++)
            for (int i = 0; i < H_ * W_; i++) {
                int64_t k = (n * C_ + c) * H_ * W_ + i;
                double xh = (x[k] - mean[c]) * invstd[c];
                y[k] = xh * w[c] + b[c];
                gb[c] += gy[k], gw[c] += gy[k] * xh;
            }
        for (int n = 0; n < N_; n++)
            for (int i = 0; i < H_ * W_; i++) {
                int64_t k = (n * C_ + c) * H_ * W_ + i;
                double xh = (x[k] - mean[c]) * invstd[c];
                gx[k] = training ? w[c] * invstd[c] * (gy[k] - gb[c] / M - xh * gw[c] / M)
                                 : gy[k] * w[c] * invstd[c];
            }
    }
    const int64_t cs[1] = {C_};
    em_tensor *tx = make(dt, 4, xshape, x, lay), *tgy = make(dt, 4, xshape, gy, lay);
    em_tensor *tw = em_test_tensor(dt, 1, cs, w), *tb = em_test_tensor(dt, 1, cs, b);
    em_tensor *trm = em_test_tensor(dt, 1, cs, rm), *trv = em_test_tensor(dt, 1, cs, rv);
    em_tensor *ty, *tsm, *tsi;
    WHAT("batch_norm %s %s training %d", em_dtype_name(dt), layout_names[lay], training);
    cr_assert_eq(em_batch_norm(tx, tw, tb, trm, trv, training, mom, eps, &ty, &tsm, &tsi), EM_OK,
                 "%s: %s", what, em_last_error());
    em_test_expect_shape(ty, 4, xshape, what);
    expect_nn(ty, dt, y, X_N, what);
    expect_nn(tsm, stat_dtype(dt), mean, C_, what);
    expect_nn(tsi, stat_dtype(dt), invstd, C_, what);
    expect_nn(trm, dt, rm2, C_, what);
    expect_nn(trv, dt, rv2, C_, what);
    WHAT("batch_norm_backward %s %s training %d", em_dtype_name(dt), layout_names[lay], training);
    em_tensor *tgx, *tgw, *tgb;
    cr_assert_eq(em_batch_norm_backward(tgy, tx, tw, tsm, tsi, training, &tgx, &tgw, &tgb), EM_OK,
                 "%s: %s", what, em_last_error());
    expect_nn(tgx, dt, gx, X_N, what);
    expect_nn(tgw, dt, gw, C_, what);
    expect_nn(tgb, dt, gb, C_, what);
    free(x), free(gy), free(y), free(gx);
}

static void check_layer_norm(em_dtype dt, layout lay) {
    char what[160];
    const double eps = 1e-5;
    enum { R = N_ * C_, D = H_ * W_ };
    const int64_t ns[2] = {H_, W_}, ms[4] = {N_, C_, 1, 1};
    double *x = distinct_values(4, xshape, 12, 0.125, lay), *gy = distinct_values(4, xshape, 13, 0.25, lay);
    double *w = distinct_values(2, ns, 14, 1.0 / 32, CONTIG), *b = distinct_values(2, ns, 15, 1.0 / 64, CONTIG);
    for (int i = 0; i < D; i++) w[i] += 1; /* exact: 1 + k/32 has at most 7 significant bits */
    /* weight and bias in x's layout (expanded: a (1, W) row along H) */
    if (lay == EXPANDED) expand_values(2, ns, w), expand_values(2, ns, b);
    double mean[R], rstd[R], gw[D] = {0}, gb[D] = {0};
    double *y = malloc(sizeof(double) * X_N), *gx = malloc(sizeof(double) * X_N);
    for (int r = 0; r < R; r++) {
        const double *xr = x + r * D, *gr = gy + r * D;
        double s = 0, ss = 0, a = 0, bb = 0;
        for (int i = 0; i < D; i++) s += xr[i];
        mean[r] = s / D;
        for (int i = 0; i < D; i++) ss += (xr[i] - mean[r]) * (xr[i] - mean[r]);
        rstd[r] = 1 / sqrt(ss / D + eps);
        for (int i = 0; i < D; i++) {
            double xh = (xr[i] - mean[r]) * rstd[r];
            y[r * D + i] = xh * w[i] + b[i];
            gw[i] += gr[i] * xh, gb[i] += gr[i];
            a += gr[i] * w[i] / D, bb += gr[i] * w[i] * xh / D;
        }
        for (int i = 0; i < D; i++) {
            double xh = (xr[i] - mean[r]) * rstd[r];
            gx[r * D + i] = rstd[r] * (gr[i] * w[i] - a - xh * bb);
        }
    }
    em_tensor *tx = make(dt, 4, xshape, x, lay), *tgy = make(dt, 4, xshape, gy, lay);
    em_tensor *tw = make(dt, 2, ns, w, lay), *tb = make(dt, 2, ns, b, lay);
    em_tensor *ty, *tm, *tr;
    WHAT("layer_norm %s %s", em_dtype_name(dt), layout_names[lay]);
    cr_assert_eq(em_layer_norm(tx, 2, ns, tw, tb, eps, &ty, &tm, &tr), EM_OK, "%s: %s", what,
                 em_last_error());
    em_test_expect_shape(ty, 4, xshape, what);
    expect_nn(ty, dt, y, X_N, what);
    em_test_expect_shape(tm, 4, ms, what);
    expect_nn(tm, stat_dtype(dt), mean, R, what);
    expect_nn(tr, stat_dtype(dt), rstd, R, what);
    WHAT("layer_norm_backward %s %s", em_dtype_name(dt), layout_names[lay]);
    em_tensor *tgx, *tgw, *tgb;
    cr_assert_eq(em_layer_norm_backward(tgy, tx, tm, tr, tw, 2, &tgx, &tgw, &tgb), EM_OK,
                 "%s: %s", what, em_last_error());
    expect_nn(tgx, dt, gx, X_N, what);
    em_test_expect_shape(tgw, 2, ns, what);
    expect_nn(tgw, dt, gw, D, what);
    expect_nn(tgb, dt, gb, D, what);
    free(x), free(gy), free(w), free(b), free(y), free(gx);
}

static void check_softmax(em_dtype dt, layout lay, int dim, bool log_) {
    char what[160];
    double *x = distinct_values(4, xshape, 16, 0.0625, lay), *g = distinct_values(4, xshape, 17, 0.25, lay);
    double *y = malloc(sizeof(double) * X_N);
    int64_t len = xshape[dim], stride = 1;
    for (int d = dim + 1; d < 4; d++) stride *= xshape[d];
    /* every row along dim: start index s, elements s + i * stride */
    for (int64_t s = 0; s < X_N; s++) {
        if ((s / stride) % len != 0) continue;
        double m = -INFINITY, z = 0;
        for (int64_t i = 0; i < len; i++) m = fmax(m, x[s + i * stride]);
        for (int64_t i = 0; i < len; i++) z += exp(x[s + i * stride] - m);
        for (int64_t i = 0; i < len; i++) {
            double v = x[s + i * stride] - m;
            y[s + i * stride] = log_ ? v - log(z) : exp(v) / z;
        }
    }
    em_tensor *tx = make(dt, 4, xshape, x, lay), *tg = make(dt, 4, xshape, g, lay);
    int d = dim == 3 ? -1 : dim;
    WHAT("%s %s %s dim %d", log_ ? "log_softmax" : "softmax", em_dtype_name(dt),
         layout_names[lay], d);
    em_tensor *ty = log_ ? em_log_softmax(tx, d) : em_softmax(tx, d);
    em_test_expect_shape(ty, 4, xshape, what);
    expect_nn(ty, dt, y, X_N, what);
    /* the backward from the output as stored */
    double *ys = em_test_values(ty), *gx = malloc(sizeof(double) * X_N);
    for (int64_t s = 0; s < X_N; s++) {
        if ((s / stride) % len != 0) continue;
        double acc = 0;
        for (int64_t i = 0; i < len; i++)
            acc += log_ ? g[s + i * stride] : g[s + i * stride] * ys[s + i * stride];
        for (int64_t i = 0; i < len; i++) {
            int64_t k = s + i * stride;
            gx[k] = log_ ? g[k] - exp(ys[k]) * acc : ys[k] * (g[k] - acc);
        }
    }
    WHAT("%s_backward %s %s dim %d", log_ ? "log_softmax" : "softmax", em_dtype_name(dt),
         layout_names[lay], d);
    em_tensor *tgx = log_ ? em_log_softmax_backward(tg, ty, d) : em_softmax_backward(tg, ty, d);
    em_test_expect_shape(tgx, 4, xshape, what);
    expect_nn(tgx, dt, gx, X_N, what);
    free(x), free(g), free(y), free(ys), free(gx);
}

Test(cover_nn, norms_and_softmax_every_dtype_and_layout) {
    for (int d = 0; d < LEN(float_dtypes); d++)
        for (int l = 0; l < N_LAYOUTS; l++) {
            cr_assert_eq(em_scope_begin(), EM_OK);
            check_batch_norm(float_dtypes[d], (layout)l, true);
            check_batch_norm(float_dtypes[d], (layout)l, false);
            check_layer_norm(float_dtypes[d], (layout)l);
            for (int dim = 1; dim <= 3; dim += 2) {
                check_softmax(float_dtypes[d], (layout)l, dim, false);
                check_softmax(float_dtypes[d], (layout)l, dim, true);
            }
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

/* Every nn op on an empty batch (and softmax/layer_norm on empty rows) in every floating dtype:
 * empty results of the right shape and dtype; the weight gradients of an empty batch are 0. */
Test(cover_nn, empty_batch_every_dtype) {
    char what[160];
    const int64_t xs[4] = {0, 3, 5, 6}, ws[4] = {4, 3, 3, 3}, k2[2] = {2, 2}, pad[2] = {1, 1};
    for (int d = 0; d < LEN(float_dtypes); d++) {
        em_dtype dt = float_dtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        /* a transposed empty, to cover non-contiguous empties as well */
        em_tensor *x = em_transpose(em_zeros(4, (const int64_t[]){0, 3, 6, 5}, dt, em_cpu()), 2, 3);
        em_tensor *w = em_ones(4, ws, dt, em_cpu()), *b = em_ones(1, (const int64_t[]){4}, dt, em_cpu());
        WHAT("conv2d of an empty %s batch", em_dtype_name(dt));
        em_tensor *y = em_conv2d(x, w, b, NULL, pad, NULL, 1);
        em_test_expect_shape(y, 4, (const int64_t[]){0, 4, 5, 6}, what);
        cr_assert_eq(em_tensor_dtype(y), dt, "%s", what);
        em_test_expect_shape(em_conv2d_backward_data(y, w, (const int64_t[]){5, 6}, NULL, pad, NULL, 1), 4,
                     xs, what);
        em_tensor *gw, *gb;
        cr_assert_eq(em_conv2d_backward_weight(x, y, (const int64_t[]){3, 3}, NULL, pad, NULL, 1,
                                               &gw, &gb), EM_OK, "%s: %s", what, em_last_error());
        double z108[108] = {0};
        expect_exact(gw, z108, 108, what);
        expect_exact(gb, z108, 4, what);
        cr_assert_eq(em_tensor_dtype(gw), dt, "%s", what);
        WHAT("pooling of an empty %s batch", em_dtype_name(dt));
        em_tensor *m, *i;
        cr_assert_eq(em_max_pool2d(x, k2, NULL, NULL, NULL, false, &m, &i), EM_OK, "%s: %s", what,
                     em_last_error());
        em_test_expect_shape(m, 4, (const int64_t[]){0, 3, 2, 3}, what);
        cr_assert_eq(em_tensor_dtype(m), dt, "%s", what);
        em_test_expect_shape(em_max_pool2d_backward(m, i, (const int64_t[]){5, 6}), 4, xs, what);
        em_tensor *a = em_avg_pool2d(x, k2, NULL, NULL, true, false);
        em_test_expect_shape(a, 4, (const int64_t[]){0, 3, 3, 3}, what);
        em_test_expect_shape(em_avg_pool2d_backward(a, (const int64_t[]){5, 6}, k2, NULL, NULL, true, false),
                     4, xs, what);
        em_tensor *ad = em_adaptive_avg_pool2d(x, (const int64_t[]){2, 2});
        em_test_expect_shape(ad, 4, (const int64_t[]){0, 3, 2, 2}, what);
        em_test_expect_shape(em_adaptive_avg_pool2d_backward(ad, (const int64_t[]){5, 6}), 4, xs, what);
        WHAT("layer_norm of an empty %s batch", em_dtype_name(dt));
        em_tensor *ly, *lm, *lr, *gx, *lgw, *lgb;
        cr_assert_eq(em_layer_norm(x, 2, (const int64_t[]){5, 6}, NULL, NULL, 1e-5, &ly, &lm, &lr),
                     EM_OK, "%s: %s", what, em_last_error());
        em_test_expect_shape(ly, 4, xs, what);
        em_test_expect_shape(lm, 4, (const int64_t[]){0, 3, 1, 1}, what);
        cr_assert_eq(em_layer_norm_backward(ly, x, lm, lr, NULL, 2, &gx, &lgw, &lgb), EM_OK,
                     "%s: %s", what, em_last_error());
        em_test_expect_shape(gx, 4, xs, what);
        expect_exact(lgw, z108, 30, what);
        WHAT("batch_norm of an empty %s batch", em_dtype_name(dt));
        em_tensor *rm = em_zeros(1, (const int64_t[]){3}, dt, em_cpu());
        em_tensor *rv = em_ones(1, (const int64_t[]){3}, dt, em_cpu()), *by, *bm, *bi;
        cr_assert_eq(em_batch_norm(x, NULL, NULL, rm, rv, false, 0.1, 1e-5, &by, &bm, &bi), EM_OK,
                     "%s: %s", what, em_last_error());
        em_test_expect_shape(by, 4, xs, what);
        cr_assert_eq(em_batch_norm_backward(by, x, NULL, bm, bi, false, &gx, &lgw, &lgb), EM_OK,
                     "%s: %s", what, em_last_error());
        em_test_expect_shape(gx, 4, xs, what);
        expect_exact(lgb, z108, 3, what);
        /* training on an empty batch: an empty result, the running statistics unchanged and
         * zero weight gradients (PyTorch 1.13's behaviour) */
        em_tensor *bw = em_ones(1, (const int64_t[]){3}, dt, em_cpu());
        cr_assert_eq(em_batch_norm(x, bw, NULL, rm, rv, true, 0.1, 1e-5, &by, &bm, &bi), EM_OK,
                     "%s (training): %s", what, em_last_error());
        em_test_expect_shape(by, 4, xs, what);
        expect_exact(rm, (const double[]){0, 0, 0}, 3, "running_mean after an empty batch");
        expect_exact(rv, (const double[]){1, 1, 1}, 3, "running_var after an empty batch");
        cr_assert_eq(em_batch_norm_backward(by, x, bw, bm, bi, true, &gx, &lgw, &lgb), EM_OK,
                     "%s (training): %s", what, em_last_error());
        em_test_expect_shape(gx, 4, xs, what);
        expect_exact(lgw, z108, 3, what);
        expect_exact(lgb, z108, 3, what);
        WHAT("softmax of an empty %s batch", em_dtype_name(dt));
        for (int dim = 0; dim < 4; dim++) {
            em_tensor *s = em_softmax(x, dim), *ls = em_log_softmax(x, dim);
            em_test_expect_shape(s, 4, xs, what);
            em_test_expect_shape(ls, 4, xs, what);
            cr_assert_eq(em_tensor_dtype(ls), dt, "%s", what);
            em_test_expect_shape(em_softmax_backward(s, s, dim), 4, xs, what);
            em_test_expect_shape(em_log_softmax_backward(ls, ls, dim), 4, xs, what);
        }
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* ======================================================================================= */
/* ---- shape errors name both shapes ------------------------------------------------------------- */

/* Every row of the op-case table that expects EM_ERR_SHAPE: the message starts with the op's
 * name, and where the row has two or more inputs of different shapes, none of them 0-dim (a
 * 0-dim input is refused for its rank alone), it names the two shapes that conflict: two
 * inputs', or one input's and one derived from the others (addmm's bias against the
 * product's shape). */
Test(cover_elementwise, shape_errors_name_the_op_and_both_shapes) {
    int checked = 0;
    for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
        const em_op_case *c = em_op_case_get(r);
        if (!c->typed || c->expect != EM_ERR_SHAPE) continue;
        em_dtype dt = (c->dtypes & EM_CASE_DT(EM_F32)) ? EM_F32 : EM_F64;
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *in[EM_CASE_MAX_IN] = {0}, *out[16] = {0};
        int n = 0;
        cr_assert_eq(em_case_inputs(c, dt, 1, in), EM_OK, "%s", em_last_error());
        em_clear_error();
        cr_assert_eq(c->typed((const em_tensor *const *)in, c->attrs, out, &n), EM_ERR_SHAPE,
                     "row %d, %s (%s): %s", r, c->op, c->variant, em_last_error());
        const char *m = em_last_error();
        cr_assert(strncmp(m, c->op, strlen(c->op)) == 0, "row %d, %s (%s): message '%s' does "
                  "not start with the op's name", r, c->op, c->variant, m);
        char shapes[EM_CASE_MAX_IN][96];
        int distinct = 0, named = 0;
        bool scalar = false;
        for (int i = 0; i < c->n_in; i++) {
            if (!in[i]) continue;
            scalar |= em_tensor_ndim(in[i]) == 0;
            em_shape_str(em_tensor_ndim(in[i]), em_tensor_shape(in[i]), shapes[distinct],
                         sizeof shapes[0]);
            bool seen = false;
            for (int k = 0; k < distinct && !seen; k++) seen = !strcmp(shapes[k], shapes[distinct]);
            if (seen) continue;
            named += strstr(m, shapes[distinct]) != NULL;
            distinct++;
        }
        int brackets = 0; /* shapes named in all, derived ones included (a product's) */
        for (const char *q = m; (q = strchr(q, '[')); q++) brackets++;
        if (distinct >= 2 && !scalar)
            cr_assert(named >= 2 || (named == 1 && brackets >= 2), "row %d, %s (%s): message '%s' does not name both shapes", r,
                      c->op, c->variant, m);
        checked++;
        cr_assert_eq(em_scope_end(), EM_OK);
    }
    cr_expect_gt(checked, 40, "only %d rows", checked);
}

/* ======================================================================================= */
/* ---- data movement on expanded (stride 0) inputs --------------------------------------------- */

/* test_ops_data covers contiguous, transposed and sliced inputs of every data op; here the
 * broadcast layout, per dtype, against 2-D plain loops. x is (R, C) = a (1, C) row expanded. */
Test(cover_index, data_ops_on_expanded_inputs_every_dtype) {
    char what[160];
    enum { R = 3, C = 4 };
    const int64_t shape[2] = {R, C};
    for (int d = 0; d < EM_TEST_N_DTYPES; d++) {
        em_dtype dt = em_test_all_dtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        double v[R * C], want[64];
        for (int i = 0; i < R * C; i++) v[i] = em_test_round_to(dt, em_test_gen(dt, i % C, 5));
        em_tensor *x = make(dt, 2, shape, v, EXPANDED);
        /* pad: 1 before and 2 after the last dim, 1 after the first, value 1 */
        WHAT("pad of an expanded %s", em_dtype_name(dt));
        for (int i = 0; i < R + 1; i++)
            for (int j = 0; j < C + 3; j++)
                want[i * (C + 3) + j] = i < R && j >= 1 && j <= C ? v[i * C + j - 1]
                                                                 : em_test_round_to(dt, 1);
        em_tensor *p = em_pad(x, 4, (const int64_t[]){1, 2, 0, 1}, 1);
        em_test_expect_shape(p, 2, (const int64_t[]){R + 1, C + 3}, what);
        expect_exact(p, want, (R + 1) * (C + 3), what);
        /* tril, triu */
        WHAT("tril/triu of an expanded %s", em_dtype_name(dt));
        for (int i = 0; i < R * C; i++) want[i] = i % C - i / C <= 0 ? v[i] : 0;
        expect_exact(em_tril(x, 0), want, R * C, what);
        for (int i = 0; i < R * C; i++) want[i] = i % C - i / C >= 1 ? v[i] : 0;
        expect_exact(em_triu(x, 1), want, R * C, what);
        /* flip both dims */
        WHAT("flip of an expanded %s", em_dtype_name(dt));
        for (int i = 0; i < R * C; i++) want[i] = v[(R - 1 - i / C) * C + (C - 1 - i % C)];
        expect_exact(em_flip(x, 2, (const int[]){0, 1}), want, R * C, what);
        /* gather along dim 1 */
        WHAT("gather of an expanded %s", em_dtype_name(dt));
        double gi[R * 2] = {3, 0, 1, 1, 2, 3};
        em_tensor *idx = em_test_tensor(EM_I64, 2, (const int64_t[]){R, 2}, gi);
        for (int i = 0; i < R * 2; i++) want[i] = v[(i / 2) * C + (int64_t)gi[i]];
        expect_exact(em_gather(x, 1, idx), want, R * 2, what);
        /* scatter and scatter_add of an expanded src into a contiguous tensor, dim 0 */
        WHAT("scatter/scatter_add of an expanded %s source", em_dtype_name(dt));
        double si[2 * C] = {2, 0, 1, 2, 0, 0, 1, 1}, base[R * C];
        for (int i = 0; i < R * C; i++) base[i] = em_test_round_to(dt, em_test_gen(dt, i, 8));
        em_tensor *t = em_test_tensor(dt, 2, shape, base);
        em_tensor *sidx = em_test_tensor(EM_I64, 2, (const int64_t[]){2, C}, si);
        double ws[R * C], wa[R * C];
        memcpy(ws, base, sizeof ws), memcpy(wa, base, sizeof wa);
        for (int i = 0; i < 2 * C; i++) {
            int64_t o = (int64_t)si[i] * C + i % C;
            ws[o] = v[i];
            wa[o] = dt == EM_BOOL ? (wa[o] != 0 || v[i] != 0) : em_test_round_to(dt, wa[o] + v[i]);
        }
        expect_exact(em_scatter(t, 0, sidx, x), ws, R * C, what);
        expect_exact(em_scatter_add(t, 0, sidx, x), wa, R * C, what);
        /* masked_fill with an expanded mask too */
        WHAT("masked_fill of an expanded %s", em_dtype_name(dt));
        double mrow[C] = {1, 0, 0, 1};
        em_tensor *mask = em_expand(em_test_tensor(EM_BOOL, 2, (const int64_t[]){1, C}, mrow), 2,
                                    shape);
        for (int i = 0; i < R * C; i++) want[i] = mrow[i % C] ? em_test_round_to(dt, 2) : v[i];
        expect_exact(em_masked_fill(x, mask, 2), want, R * C, what);
        /* embedding with an expanded weight, index_select-like */
        WHAT("embedding of an expanded %s weight", em_dtype_name(dt));
        double ei[3] = {2, 0, 2};
        em_tensor *eidx = em_test_tensor(EM_I64, 1, (const int64_t[]){3}, ei);
        for (int i = 0; i < 3 * C; i++) want[i] = v[(int64_t)ei[i / C] * C + i % C];
        expect_exact(em_embedding(x, eidx, EM_PADDING_IDX_NONE), want, 3 * C, what);
        /* index_add of an expanded source */
        WHAT("index_add of an expanded %s source", em_dtype_name(dt));
        double ia[R] = {1, 1, 0};
        em_tensor *iidx = em_test_tensor(EM_I64, 1, (const int64_t[]){R}, ia);
        memcpy(wa, base, sizeof wa);
        for (int i = 0; i < R * C; i++) {
            int64_t o = (int64_t)ia[i / C] * C + i % C;
            wa[o] = dt == EM_BOOL ? (wa[o] != 0 || v[i] != 0) : em_test_round_to(dt, wa[o] + v[i]);
        }
        expect_exact(em_index_add(t, 0, iidx, x, 1), wa, R * C, what);
        /* cat and stack of an expanded and a contiguous tensor */
        WHAT("cat/stack of an expanded %s", em_dtype_name(dt));
        em_tensor *c = em_cat(2, (const em_tensor *const[]){x, t}, 0);
        memcpy(want, v, sizeof v), memcpy(want + R * C, base, sizeof base);
        em_test_expect_shape(c, 2, (const int64_t[]){2 * R, C}, what);
        expect_exact(c, want, 2 * R * C, what);
        em_tensor *st = em_stack(2, (const em_tensor *const[]){x, t}, 0);
        em_test_expect_shape(st, 3, (const int64_t[]){2, R, C}, what);
        expect_exact(st, want, 2 * R * C, what);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}
