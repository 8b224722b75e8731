/*
 * test_ops.c — every op of ember/ops.h against plain-loop references computed here, per dtype,
 * on contiguous, transposed, sliced (step 2), expanded (stride 0) and zero-size inputs, with
 * broadcasting, PyTorch's type promotion, the error messages of bad input, and deterministic
 * reductions (bitwise-identical sums whatever the thread count).
 *
 * Tolerances: integer and bool results are exact. Floating references are computed in double
 * and rounded once to the result dtype (f16/bf16 through em_f32_to_f16/bf16, the conversion
 * Ember documents); add/sub/mul/div/sum of the small dyadic values used here are then exact
 * in every floating dtype, so they are compared exactly. exp, log (libm may differ by an ulp)
 * and mean (a sum times 1/count) use rtol 1e-6 for f32, 1e-12 for f64 and one ulp of the
 * dtype for f16 (2^-10) and bf16 (2^-7). matmul of integer-valued operands is exact (in f16
 * and bf16 too: |products and sums| <= 100); of random operands, the error is
 * bounded by 1e-5 * sum_k |a_ik b_kj|. Large f32 sums have relative error < 1e-6 against a
 * double-precision loop.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"
#include "tests/layouts.h"

TestSuite(binary, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(unary, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(reduce, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(matmul, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(create, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(deterministic, .init = em_test_setup, .fini = em_test_teardown);


/* ---- references ------------------------------------------------------------------------------ */



/* Relative tolerance of a transcendental result in dtype dt. */
static double ulp_tol(em_dtype dt) {
    switch (dt) {
    case EM_F32: return 1e-6;
    case EM_F64: return 1e-12;
    case EM_F16: return 0x1p-10;
    case EM_BF16: return 0x1p-7;
    default: return 0;
    }
}


/* got (a tensor) equals want (n values in C order) within rtol; NaN matches NaN. */
static void expect_values(const em_tensor *got, const double *want, int64_t n, double rtol,
                          const char *what) {
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_numel(got), n, "%s: %lld elements, want %lld", what,
                 (long long)em_tensor_numel(got), (long long)n);
    double *g = em_test_values(got);
    for (int64_t i = 0; i < n; i++) {
        bool ok = g[i] == want[i] || (isnan(g[i]) && isnan(want[i])) ||
                  fabs(g[i] - want[i]) <= rtol * fabs(want[i]);
        cr_expect(ok, "%s: element %lld is %.9g, want %.9g", what, (long long)i, g[i], want[i]);
    }
    free(g);
}

/* ---- binary ops ------------------------------------------------------------------------------ */

typedef enum binop { ADD, SUB, MUL, DIV } binop;
static const char *const binop_names[] = {"add", "sub", "mul", "div"};

static em_tensor *call_binop(binop op, const em_tensor *a, const em_tensor *b) {
    switch (op) {
    case ADD: return em_add(a, b);
    case SUB: return em_sub(a, b);
    case MUL: return em_mul(a, b);
    default: return em_div(a, b);
    }
}

static em_status call_binop_(binop op, em_tensor *a, const em_tensor *b) {
    switch (op) {
    case ADD: return em_add_(a, b);
    case SUB: return em_sub_(a, b);
    case MUL: return em_mul_(a, b);
    default: return em_div_(a, b);
    }
}

/* x op y computed in double, then rounded to the result dtype rt; bool add is "or", bool mul
 * is "and". */
static double ref_binop(binop op, em_dtype rt, double x, double y) {
    double v;
    switch (op) {
    case ADD: v = rt == EM_BOOL ? (x != 0 || y != 0) : x + y; break;
    case SUB: v = x - y; break;
    case MUL: v = rt == EM_BOOL ? (x != 0 && y != 0) : x * y; break;
    default: v = x / y; break;
    }
    return em_test_round_to(rt, v);
}

/* The dtype of a op b for two tensors of dtype dt: div of integers and bools is float32. */
static em_dtype binop_dtype(binop op, em_dtype dt) {
    return op == DIV && !em_dtype_is_floating(dt) ? EM_F32 : dt;
}

static void check_binop_layouts(binop op, em_dtype dt, layout la, layout lb) {
    enum { R = 3, C = 5 };
    double A[R * C], Bv[R * C], want[R * C];
    for (int i = 0; i < R * C; i++) {
        A[i] = em_test_gen(dt, la == EXPANDED ? i % C : i, 1);
        Bv[i] = em_test_gen(dt, lb == EXPANDED ? i % C : i, 2);
        if (op == DIV && Bv[i] == 0) Bv[i] = 1; /* gen's integers may be 0 */
    }
    em_dtype rt = binop_dtype(op, dt);
    for (int i = 0; i < R * C; i++) want[i] = ref_binop(op, rt, A[i], Bv[i]);
    em_tensor *a = logical(dt, la, R, C, A), *b = logical(dt, lb, R, C, Bv);
    em_tensor *y = call_binop(op, a, b);
    char what[96];
    snprintf(what, sizeof what, "%s %s: %s x %s", binop_names[op], em_dtype_name(dt),
             layout_names[la], layout_names[lb]);
    em_test_expect_shape(y, 2, (const int64_t[]){R, C}, what);
    cr_expect_eq(em_tensor_dtype(y), rt, "%s: result dtype %s", what,
                 em_dtype_name(em_tensor_dtype(y)));
    cr_expect(em_tensor_is_contiguous(y), "%s: results are contiguous", what);
    expect_values(y, want, R * C, 0, what);
    RELEASE(y, b, a);
}

static const layout layout_pairs[][2] = {{CONTIG, CONTIG},     {TRANSPOSED, CONTIG},
                                         {CONTIG, SLICED},     {SLICED, TRANSPOSED},
                                         {EXPANDED, CONTIG},   {CONTIG, EXPANDED},
                                         {TRANSPOSED, TRANSPOSED}};

static void check_binop_all(binop op) {
    for (int k = 0; k < EM_TEST_N_DTYPES; k++) {
        em_dtype dt = em_test_all_dtypes[k];
        if (dt == EM_BOOL && (op == SUB || op == DIV)) continue; /* see bool_sub_is_an_error */
        for (size_t p = 0; p < sizeof layout_pairs / sizeof layout_pairs[0]; p++)
            check_binop_layouts(op, dt, layout_pairs[p][0], layout_pairs[p][1]);
    }
}

Test(binary, add_every_dtype_and_layout) { check_binop_all(ADD); }
Test(binary, sub_every_dtype_and_layout) { check_binop_all(SUB); }
Test(binary, mul_every_dtype_and_layout) { check_binop_all(MUL); }
Test(binary, div_every_dtype_and_layout) { check_binop_all(DIV); }

Test(binary, bool_sub_is_an_error) {
    em_tensor *a = em_ones(1, (const int64_t[]){3}, EM_BOOL, em_cpu());
    cr_expect_null(em_sub(a, a));
    cr_expect_neq(em_last_status(), EM_OK);
    cr_expect(strstr(em_last_error(), "sub"), "%s", em_last_error());
    cr_expect(strstr(em_last_error(), "bool"), "%s", em_last_error());
    em_tensor_release(a);
}

Test(binary, zero_size) {
    for (int k = 0; k < EM_TEST_N_DTYPES; k++) {
        em_dtype dt = em_test_all_dtypes[k];
        em_tensor *a = em_ones(2, (const int64_t[]){0, 5}, dt, em_cpu());
        em_tensor *b = em_ones(1, (const int64_t[]){5}, dt, em_cpu());
        em_tensor *c = em_ones(2, (const int64_t[]){3, 1}, dt, em_cpu());
        em_tensor *d = em_ones(2, (const int64_t[]){3, 0}, dt, em_cpu());
        em_tensor *ab = em_add(a, b), *aa = em_mul(a, a), *cd = em_add(c, d);
        em_test_expect_shape(ab, 2, (const int64_t[]){0, 5}, "[0, 5] + [5]");
        em_test_expect_shape(aa, 2, (const int64_t[]){0, 5}, "[0, 5] * [0, 5]");
        em_test_expect_shape(cd, 2, (const int64_t[]){3, 0}, "[3, 1] + [3, 0]");
        cr_expect_eq(em_tensor_numel(cd), 0);
        cr_expect_eq(em_add_(a, b), EM_OK, "%s", em_last_error());
        RELEASE(cd, aa, ab, d, c, b, a);
    }
}

/* (ra, ca) op (rb, cb) broadcast to (max, max): y(i, j) = a(i % ra, j % ca) op b(...). */
Test(binary, broadcasting_2d) {
    const double A[3] = {1, 2, 3}, Bv[4] = {10, 20, 30, 40};
    em_tensor *a = em_test_tensor(EM_F32, 2, (const int64_t[]){3, 1}, A);
    em_tensor *b = em_test_tensor(EM_F32, 2, (const int64_t[]){1, 4}, Bv);
    em_tensor *y = em_add(a, b), *z = em_sub(b, a);
    double want[12], wz[12];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            want[i * 4 + j] = A[i] + Bv[j];
            wz[i * 4 + j] = Bv[j] - A[i];
        }
    em_test_expect_shape(y, 2, (const int64_t[]){3, 4}, "[3, 1] + [1, 4]");
    expect_values(y, want, 12, 0, "[3, 1] + [1, 4]");
    expect_values(z, wz, 12, 0, "[1, 4] - [3, 1]");
    RELEASE(z, y, b, a);
}

Test(binary, broadcasting_3d_with_1d) {
    double A[24], Bv[4] = {0.5, -1, 2, 4}, want[24], wr[24];
    for (int i = 0; i < 24; i++) A[i] = i;
    em_tensor *a = em_test_tensor(EM_F64, 3, (const int64_t[]){2, 3, 4}, A);
    em_tensor *b = em_test_tensor(EM_F64, 1, (const int64_t[]){4}, Bv);
    em_tensor *y = em_mul(a, b), *r = em_div(b, a);
    for (int i = 0; i < 24; i++) {
        want[i] = A[i] * Bv[i % 4];
        wr[i] = Bv[i % 4] / A[i]; /* 1/0 = inf where A is 0 */
    }
    em_test_expect_shape(y, 3, (const int64_t[]){2, 3, 4}, "[2, 3, 4] * [4]");
    expect_values(y, want, 24, 0, "[2, 3, 4] * [4]");
    em_test_expect_shape(r, 3, (const int64_t[]){2, 3, 4}, "[4] / [2, 3, 4]");
    expect_values(r, wr, 24, 0, "[4] / [2, 3, 4]");
    RELEASE(r, y, b, a);
}

Test(binary, shape_errors_name_both_shapes) {
    em_tensor *a = em_zeros(2, (const int64_t[]){3, 2}, EM_F32, em_cpu());
    em_tensor *b = em_zeros(1, (const int64_t[]){4}, EM_F32, em_cpu());
    cr_expect_null(em_add(a, b));
    em_assert_error(EM_ERR_SHAPE, "[3, 2]");
    cr_expect(strstr(em_last_error(), "[4]"), "%s", em_last_error());
    cr_expect(strstr(em_last_error(), "add"), "%s", em_last_error());
    cr_expect_null(em_div(b, a));
    em_assert_error(EM_ERR_SHAPE, "div");
    cr_expect_eq(em_mul_(b, a), EM_ERR_SHAPE); /* [3, 2] does not fit into [4] */
    em_assert_error(EM_ERR_SHAPE, "[3, 2]");
    cr_expect(strstr(em_last_error(), "[4]"), "%s", em_last_error());
    em_tensor *c = em_zeros(2, (const int64_t[]){2, 3}, EM_F32, em_cpu());
    cr_expect_eq(em_add_(b, c), EM_ERR_SHAPE); /* in place cannot grow the output */
    em_assert_error(EM_ERR_SHAPE, "[2, 3]");
    RELEASE(c, b, a);
}

/* One promotion case: a (3 elements, or 0-dim holding a[0]) op b -> dtype want, values y. */
typedef struct promo_case {
    binop op;
    em_dtype da;
    bool a_dims;
    em_dtype db;
    bool b_dims;
    em_dtype want;
    double a[3], b[3], y[3];
} promo_case;

static const promo_case promo_cases[] = {
    /* i64 + f32 -> f32 */
    {ADD, EM_I64, true, EM_F32, true, EM_F32, {200, 2, -1}, {100, 0.5, 3}, {300, 2.5, 2}},
    /* i32 + 0-dim f64 -> f64: a 0-dim tensor of a higher category decides */
    {ADD, EM_I32, true, EM_F64, false, EM_F64, {200, 2, -1}, {0.5}, {200.5, 2.5, -0.5}},
    /* f32 + 0-dim f64 -> f32: same category, the dimensioned tensor decides */
    {MUL, EM_F32, true, EM_F64, false, EM_F32, {200, 2, -1}, {0.5}, {100, 1, -0.5}},
    /* int32 * 0-dim float16 -> float16 */
    {MUL, EM_I32, true, EM_F16, false, EM_F16, {2, 3, 4}, {0.5}, {1, 1.5, 2}},
    /* u8 + i32 -> i32: 200 + 100 does not wrap */
    {ADD, EM_U8, true, EM_I32, true, EM_I32, {200, 2, 255}, {100, 0, 3}, {300, 2, 258}},
    /* f16 + bf16 -> f32 */
    {ADD, EM_F16, true, EM_BF16, true, EM_F32, {200, 2, -1}, {100, 0.5, 3}, {300, 2.5, 2}},
    /* bool + 0-dim i64 -> i64 */
    {ADD, EM_BOOL, true, EM_I64, false, EM_I64, {1, 0, 1}, {3}, {4, 3, 4}},
    /* i64 - 0-dim i32 -> i64 */
    {SUB, EM_I64, true, EM_I32, false, EM_I64, {200, 2, -1}, {3}, {197, -1, -4}},
    /* bool + bool -> bool (logical or) */
    {ADD, EM_BOOL, true, EM_BOOL, true, EM_BOOL, {1, 1, 0}, {1, 0, 0}, {1, 1, 0}},
    /* 0-dim f32 + 0-dim f64 -> f64 (all 0-dim: ordinary promotion) */
    {ADD, EM_F32, false, EM_F64, false, EM_F64, {2.5}, {0.5}, {3}},
    /* integer division is true division, in float32 */
    {DIV, EM_I32, true, EM_I32, true, EM_F32, {7, -7, 1}, {2, 2, 3}, {3.5, -3.5, 1.0 / 3}},
    {DIV, EM_U8, true, EM_I64, false, EM_F32, {1, 0, 9}, {4}, {0.25, 0, 2.25}},
};

static em_tensor *promo_operand(em_dtype dt, bool dims, const double *v) {
    return dims ? em_test_tensor(dt, 1, (const int64_t[]){3}, v) : em_scalar(v[0], dt);
}

Test(binary, type_promotion_like_pytorch) {
    for (size_t k = 0; k < sizeof promo_cases / sizeof promo_cases[0]; k++) {
        const promo_case *c = &promo_cases[k];
        em_tensor *a = promo_operand(c->da, c->a_dims, c->a);
        em_tensor *b = promo_operand(c->db, c->b_dims, c->b);
        em_tensor *y = call_binop(c->op, a, b);
        char what[96];
        snprintf(what, sizeof what, "%s(%s%s, %s%s)", binop_names[c->op], em_dtype_name(c->da),
                 c->a_dims ? "[3]" : " 0-dim", em_dtype_name(c->db), c->b_dims ? "[3]" : " 0-dim");
        cr_assert(y, "%s: %s", what, em_last_error());
        cr_expect_eq(em_tensor_dtype(y), c->want, "%s is %s, want %s", what,
                     em_dtype_name(em_tensor_dtype(y)), em_dtype_name(c->want));
        double want[3];
        for (int i = 0; i < 3; i++) want[i] = em_test_round_to(c->want, c->y[i]);
        expect_values(y, want, c->a_dims || c->b_dims ? 3 : 1, 0, what);
        RELEASE(y, b, a);
    }
}

Test(binary, bool_add_is_logical_or_in_bytes) {
    const bool a[4] = {true, true, false, false}, b[4] = {true, false, true, false};
    em_tensor *ta = em_from_data(a, 1, (const int64_t[]){4}, EM_BOOL, em_cpu());
    em_tensor *tb = em_from_data(b, 1, (const int64_t[]){4}, EM_BOOL, em_cpu());
    em_tensor *s = em_add(ta, tb), *p = em_mul(ta, tb);
    cr_assert(s && p, "%s", em_last_error());
    uint8_t gs[4], gp[4];
    cr_assert_eq(em_tensor_to_host(s, gs, sizeof gs), EM_OK);
    cr_assert_eq(em_tensor_to_host(p, gp, sizeof gp), EM_OK);
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(gs[i], (uint8_t)(a[i] || b[i]), "or %d: byte %u", i, gs[i]);
        cr_expect_eq(gp[i], (uint8_t)(a[i] && b[i]), "and %d: byte %u", i, gp[i]);
    }
    RELEASE(p, s, tb, ta);
}

/* a op= b for a in each layout that can be written (not expanded), b broadcast from a row. */
static void check_inplace(binop op, em_dtype dt, layout la) {
    enum { R = 3, C = 4 };
    double A[R * C], Bv[C], want[R * C];
    for (int i = 0; i < R * C; i++) A[i] = em_test_gen(dt, i, 3);
    for (int j = 0; j < C; j++) Bv[j] = em_test_gen(dt, j, 4) == 0 ? 1 : em_test_gen(dt, j, 4);
    for (int i = 0; i < R * C; i++) want[i] = ref_binop(op, dt, A[i], Bv[i % C]);
    em_tensor *a = logical(dt, la, R, C, A);
    em_tensor *b = em_test_tensor(dt, 1, (const int64_t[]){C}, Bv);
    uint64_t v = em_tensor_version(a);
    char what[96];
    snprintf(what, sizeof what, "%s_ %s %s", binop_names[op], em_dtype_name(dt),
             layout_names[la]);
    cr_assert_eq(call_binop_(op, a, b), EM_OK, "%s: %s", what, em_last_error());
    cr_expect_gt(em_tensor_version(a), v, "%s bumps the version", what);
    expect_values(a, want, R * C, 0, what);
    RELEASE(b, a);
}

Test(binary, in_place_every_dtype_and_layout) {
    for (int k = 0; k < EM_TEST_N_DTYPES; k++)
        for (int op = ADD; op <= DIV; op++) {
            em_dtype dt = em_test_all_dtypes[k];
            if ((op == DIV && !em_dtype_is_floating(dt)) || (op == SUB && dt == EM_BOOL))
                continue; /* errors: see in_place_dtype_errors */
            for (layout la = CONTIG; la < EXPANDED; la++) check_inplace((binop)op, dt, la);
        }
}

Test(binary, in_place_leaves_the_rest_of_the_base_alone) {
    double P[24];
    for (int i = 0; i < 24; i++) P[i] = i;
    em_tensor *base = em_test_tensor(EM_F32, 2, (const int64_t[]){4, 6}, P);
    em_tensor *s = em_slice(base, 1, 1, 6, 2), *two = em_scalar(2, EM_I32); /* columns 1, 3, 5 */
    cr_assert_eq(em_mul_(s, two), EM_OK, "%s", em_last_error());
    double want[24];
    for (int i = 0; i < 24; i++) want[i] = i % 2 ? 2.0 * i : i;
    expect_values(base, want, 24, 0, "mul_ through a sliced view");
    RELEASE(two, s, base);
}

/* Writing into an expanded view (several elements on one memory location) is an error that
 * names the op, the shape and the dim, and leaves the memory as it was; PyTorch refuses too. */
Test(binary, in_place_into_an_expanded_view_is_refused) {
    double P[3] = {1, 2, 3};
    em_tensor *row = em_test_tensor(EM_F32, 2, (const int64_t[]){1, 3}, P);
    em_tensor *e = em_expand(row, 2, (const int64_t[]){4, 3}), *one = em_scalar(1, EM_F32);
    cr_assert(e, "%s", em_last_error());
    cr_assert_eq(em_add_(e, one), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "add: output 0 (shape [4, 3]) has stride 0 in dim 0");
    em_tensor *src = em_zeros(2, (const int64_t[]){4, 3}, EM_F32, em_cpu());
    cr_assert_eq(em_copy_(e, src), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "same memory location");
    cr_assert_eq(em_fill_(e, 7), EM_ERR_INVALID);
    expect_values(row, P, 3, 0, "the expanded tensor's memory after refused writes");
    /* A size-1 dim with stride 0 is not an overlap: writing is fine. */
    em_tensor *single = em_test_tensor(EM_F32, 1, (const int64_t[]){1}, P);
    em_tensor *one_row = em_expand(single, 2, (const int64_t[]){1, 1});
    cr_assert_eq(em_add_(one_row, one), EM_OK, "%s", em_last_error());
    RELEASE(src, one, e, row, one_row, single);
}

/* An input that overlaps the output without being exactly it is refused (PyTorch's three
 * cases below); the same elements (x += x) are fine. */
Test(binary, in_place_with_a_partly_overlapping_input_is_refused) {
    double P[12];
    for (int i = 0; i < 12; i++) P[i] = i;
    em_tensor *x = em_test_tensor(EM_F32, 2, (const int64_t[]){3, 4}, P);
    em_tensor *row = em_select(x, 0, 0);
    cr_assert_eq(em_add_(x, row), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "add: input 1 and output 0 share memory without being the "
                    "same elements");
    em_tensor *flat = em_reshape(x, 1, (const int64_t[]){12});
    em_tensor *hi = em_narrow(flat, 0, 1, 11), *lo = em_narrow(flat, 0, 0, 11);
    cr_assert_eq(em_add_(hi, lo), EM_ERR_INVALID);
    cr_assert_eq(em_copy_(hi, lo), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "clone() the input first");
    expect_values(x, P, 12, 0, "x after refused overlapping writes");
    /* Disjoint parts of one tensor, and the same elements, are fine. */
    em_tensor *a = em_narrow(flat, 0, 0, 6), *b = em_narrow(flat, 0, 6, 6);
    cr_assert_eq(em_add_(a, b), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_mul_(x, x), EM_OK, "%s", em_last_error());
    double want[12];
    for (int i = 0; i < 12; i++) want[i] = i < 6 ? (2.0 * i + 6) * (2.0 * i + 6) : (double)i * i;
    expect_values(x, want, 12, 0, "a += b on disjoint halves, then x *= x");
    RELEASE(b, a, lo, hi, flat, row, x);
}

Test(binary, in_place_dtype_errors) {
    em_tensor *i = em_zeros(1, (const int64_t[]){3}, EM_I64, em_cpu());
    em_tensor *f = em_ones(1, (const int64_t[]){3}, EM_F32, em_cpu());
    em_tensor *b = em_ones(1, (const int64_t[]){3}, EM_BOOL, em_cpu());
    em_tensor *i32 = em_ones(1, (const int64_t[]){3}, EM_I32, em_cpu());
    cr_expect_eq(em_add_(i, f), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "result type float32 can't be cast to the desired output type "
                                  "int64");
    cr_expect_eq(em_div_(i, i), EM_ERR_DTYPE); /* true division of ints is float32 */
    em_assert_error(EM_ERR_DTYPE, "result type float32 can't be cast to the desired output type "
                                  "int64");
    cr_expect_eq(em_mul_(b, i32), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "result type int32 can't be cast to the desired output type "
                                  "bool");
    /* allowed: a float output takes an int operand, an int output a wider int */
    cr_expect_eq(em_sub_(f, i), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_add_(i32, i), EM_OK, "%s", em_last_error());
    expect_values(f, (const double[]){1, 1, 1}, 3, 0, "f32 -= i64 zeros");
    expect_values(i32, (const double[]){1, 1, 1}, 3, 0, "i32 += i64 zeros");
    RELEASE(i32, b, f, i);
}

/* In place with a wider operand computes in the promoted dtype and rounds once into a, as
 * PyTorch does: converting b to a's dtype first would round twice or overflow. */
Test(binary, in_place_computes_in_the_promoted_dtype) {
    /* f16 += bf16 (computed in f32): -60000 + 70144 = 10144, though 70144 overflows f16 */
    em_tensor *h = em_full(1, (const int64_t[]){2}, -60000, EM_F16, em_cpu());
    em_tensor *bf = em_full(1, (const int64_t[]){2}, 70144, EM_BF16, em_cpu());
    cr_assert_eq(em_add_(h, bf), EM_OK, "%s", em_last_error());
    expect_values(h, (const double[]){em_test_round_to(EM_F16, -60000.0 + 70144), 10144}, 2, 0,
                  "f16 += bf16");
    /* f32 += f64: 1 + (2^-24 + 2^-50) is just above a tie in f32; rounding b to f32 first
     * would land on the tie and round to even (1.0) */
    const double b64 = 0x1p-24 + 0x1p-50;
    em_tensor *f = em_ones(1, (const int64_t[]){1}, EM_F32, em_cpu());
    em_tensor *d = em_test_tensor(EM_F64, 1, (const int64_t[]){1}, &b64);
    cr_assert_eq(em_add_(f, d), EM_OK, "%s", em_last_error());
    expect_values(f, (const double[]){(float)(1.0 + b64)}, 1, 0, "f32 += f64");
    cr_expect_neq((float)(1.0 + b64), 1.0f, "the case must tell the two roundings apart");
    /* the broadcast output still has to fit a */
    em_tensor *wide = em_ones(2, (const int64_t[]){2, 2}, EM_F64, em_cpu());
    cr_expect_eq(em_mul_(h, wide), EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "[2, 2]");
    cr_expect(strstr(em_last_error(), "mul_"), "%s", em_last_error());
    RELEASE(wide, d, f, bf, h);
}

/* Integer arithmetic wraps on overflow, as in PyTorch (and without C's undefined behaviour). */
Test(binary, integer_overflow_wraps) {
    const int32_t a32[2] = {INT32_MAX, INT32_MIN}, b32[2] = {1, 1};
    const int64_t a64[2] = {INT64_MAX, INT64_MIN}, b64[2] = {1, 1};
    em_tensor *x = em_from_data(a32, 1, (const int64_t[]){2}, EM_I32, em_cpu());
    em_tensor *y = em_from_data(b32, 1, (const int64_t[]){2}, EM_I32, em_cpu());
    em_tensor *u = em_from_data(a64, 1, (const int64_t[]){2}, EM_I64, em_cpu());
    em_tensor *v = em_from_data(b64, 1, (const int64_t[]){2}, EM_I64, em_cpu());
    em_tensor *s32 = em_add(x, y), *d32 = em_sub(x, y), *m32 = em_mul(x, x);
    em_tensor *s64 = em_add(u, v), *d64 = em_sub(u, v), *m64 = em_mul(u, u);
    cr_assert(s32 && d32 && m32 && s64 && d64 && m64, "%s", em_last_error());
    int32_t g32[2];
    int64_t g64[2];
    cr_assert_eq(em_tensor_to_host(s32, g32, sizeof g32), EM_OK);
    cr_expect(g32[0] == INT32_MIN && g32[1] == INT32_MIN + 1, "add: %d %d", g32[0], g32[1]);
    cr_assert_eq(em_tensor_to_host(d32, g32, sizeof g32), EM_OK);
    cr_expect(g32[0] == INT32_MAX - 1 && g32[1] == INT32_MAX, "sub: %d %d", g32[0], g32[1]);
    cr_assert_eq(em_tensor_to_host(m32, g32, sizeof g32), EM_OK);
    cr_expect(g32[0] == 1 && g32[1] == 0, "mul: %d %d", g32[0], g32[1]); /* mod 2^32 */
    cr_assert_eq(em_tensor_to_host(s64, g64, sizeof g64), EM_OK);
    cr_expect(g64[0] == INT64_MIN && g64[1] == INT64_MIN + 1);
    cr_assert_eq(em_tensor_to_host(d64, g64, sizeof g64), EM_OK);
    cr_expect(g64[0] == INT64_MAX - 1 && g64[1] == INT64_MAX);
    cr_assert_eq(em_tensor_to_host(m64, g64, sizeof g64), EM_OK);
    cr_expect(g64[0] == 1 && g64[1] == 0);
    RELEASE(m64, d64, s64, m32, d32, s32, v, u, y, x);
}

/* ---- unary ops ------------------------------------------------------------------------------- */

typedef enum unop { NEG, EXP, LOG, RELU } unop;
static const char *const unop_names[] = {"neg", "exp", "log", "relu"};

static em_tensor *call_unop(unop op, const em_tensor *a) {
    switch (op) {
    case NEG: return em_neg(a);
    case EXP: return em_exp(a);
    case LOG: return em_log(a);
    default: return em_relu(a);
    }
}

/* Result dtype: exp and log of integers and bools are float32. */
static em_dtype unop_dtype(unop op, em_dtype dt) {
    return (op == EXP || op == LOG) && !em_dtype_is_floating(dt) ? EM_F32 : dt;
}

static double ref_unop(unop op, em_dtype rt, double x) {
    switch (op) {
    case NEG: return em_test_round_to(rt, -x);
    case EXP: return em_test_round_to(rt, exp(x));
    case LOG: return em_test_round_to(rt, log(x)); /* NaN below 0, -inf at 0 */
    default: return em_test_round_to(rt, x > 0 ? x : 0);
    }
}

static void check_unop(unop op, em_dtype dt, layout la) {
    enum { R = 4, C = 5 };
    double A[R * C], want[R * C];
    em_dtype rt = unop_dtype(op, dt);
    for (int i = 0; i < R * C; i++) {
        A[i] = em_test_gen(dt, la == EXPANDED ? i % C : i, 5);
        want[i] = ref_unop(op, rt, A[i]);
    }
    em_tensor *a = logical(dt, la, R, C, A), *y = call_unop(op, a);
    char what[96];
    snprintf(what, sizeof what, "%s %s %s", unop_names[op], em_dtype_name(dt), layout_names[la]);
    em_test_expect_shape(y, 2, (const int64_t[]){R, C}, what);
    cr_expect_eq(em_tensor_dtype(y), rt, "%s: dtype %s", what, em_dtype_name(em_tensor_dtype(y)));
    expect_values(y, want, R * C, op == EXP || op == LOG ? ulp_tol(rt) : 0, what);
    RELEASE(y, a);
}

static void check_unop_all(unop op) {
    for (int k = 0; k < EM_TEST_N_DTYPES; k++) {
        if (em_test_all_dtypes[k] == EM_BOOL && (op == NEG || op == RELU)) continue;
        for (layout la = CONTIG; la < N_LAYOUTS; la++) check_unop(op, em_test_all_dtypes[k], la);
    }
}

Test(unary, neg_every_dtype_and_layout) { check_unop_all(NEG); }
Test(unary, exp_every_dtype_and_layout) { check_unop_all(EXP); }
Test(unary, log_every_dtype_and_layout) { check_unop_all(LOG); }
Test(unary, relu_every_dtype_and_layout) { check_unop_all(RELU); }

Test(unary, special_values) {
    const double x[6] = {NAN, -1, 0, 2, INFINITY, -INFINITY};
    em_tensor *a = em_test_tensor(EM_F32, 1, (const int64_t[]){6}, x);
    em_tensor *r = em_relu(a), *e = em_exp(a), *l = em_log(a);
    expect_values(r, (const double[]){NAN, 0, 0, 2, INFINITY, 0}, 6, 0, "relu keeps NaN");
    expect_values(e, (const double[]){NAN, (float)exp(-1), 1, (float)exp(2), INFINITY, 0}, 6,
                  1e-6, "exp");
    expect_values(l, (const double[]){NAN, NAN, -INFINITY, (float)log(2), INFINITY, NAN}, 6,
                  1e-6, "log");
    cr_assert_eq(em_relu_(a), EM_OK, "%s", em_last_error());
    expect_values(a, (const double[]){NAN, 0, 0, 2, INFINITY, 0}, 6, 0, "relu_ keeps NaN");
    RELEASE(l, e, r, a);
}

/* The bf16 relu and relu_backward kernels work on the bits: every one of the 65536 patterns
 * (NaN, infinities, -0, subnormals) against widening to f32, the f32 rule, and rounding back
 * (the core's scalar conversions). relu_backward's y runs through all patterns too, in
 * another order (an odd multiplier permutes them), and 4 copies make the call long enough to
 * be split across threads. */
Test(unary, bf16_relu_and_its_backward_match_the_f32_rule_bit_for_bit) {
    enum { N = 65536, REP = 4 };
    uint16_t *x = malloc(sizeof(uint16_t) * N * REP), *y = malloc(sizeof(uint16_t) * N * REP);
    uint16_t *got = malloc(sizeof(uint16_t) * N * REP);
    cr_assert(x && y && got);
    for (int64_t i = 0; i < N * REP; i++) {
        x[i] = (uint16_t)i;
        y[i] = (uint16_t)((uint32_t)i * 40503u);
    }
    const int64_t shape[1] = {N * REP};
    em_tensor *tx = em_from_data(x, 1, shape, EM_BF16, em_cpu());
    em_tensor *ty = em_from_data(y, 1, shape, EM_BF16, em_cpu());
    em_tensor *r = em_relu(tx), *g = NULL;
    cr_assert(r, "%s", em_last_error());
    cr_assert_eq(em_op_call(em_op_find("relu_backward"), (const em_tensor *const[]){tx, ty}, 2,
                            NULL, &g),
                 EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_to_host(r, got, sizeof(uint16_t) * N * REP), EM_OK);
    int bad = 0;
    for (int64_t i = 0; i < N * REP && bad < 5; i++) {
        float f = em_bf16_to_f32(x[i]);
        uint16_t want = em_f32_to_bf16(f <= 0 ? 0 : f);
        if (got[i] != want) {
            bad++;
            cr_expect_eq(got[i], want, "relu(bf16 0x%04x) = 0x%04x, want 0x%04x", x[i], got[i],
                         want);
        }
    }
    cr_assert_eq(em_tensor_to_host(g, got, sizeof(uint16_t) * N * REP), EM_OK);
    for (int64_t i = 0; i < N * REP && bad < 5; i++) {
        uint16_t want = em_f32_to_bf16(em_bf16_to_f32(y[i]) > 0 ? em_bf16_to_f32(x[i]) : 0);
        if (got[i] != want) {
            bad++;
            cr_expect_eq(got[i], want, "relu_backward(0x%04x, y 0x%04x) = 0x%04x, want 0x%04x",
                         x[i], y[i], got[i], want);
        }
    }
    RELEASE(g, r, ty, tx);
    free(got);
    free(y);
    free(x);
}

Test(unary, relu_in_place_on_a_transposed_view) {
    double A[12], want[12];
    for (int i = 0; i < 12; i++) A[i] = i % 3 - 1.5;
    em_tensor *base = em_test_tensor(EM_F64, 2, (const int64_t[]){3, 4}, A);
    em_tensor *t = em_transpose(base, 0, 1);
    uint64_t v = em_tensor_version(base);
    cr_assert_eq(em_relu_(t), EM_OK, "%s", em_last_error());
    cr_expect_gt(em_tensor_version(base), v);
    for (int i = 0; i < 12; i++) want[i] = A[i] > 0 ? A[i] : 0;
    expect_values(base, want, 12, 0, "relu_ through a transpose");
    RELEASE(t, base);
}

Test(unary, zero_size_and_errors) {
    em_tensor *z = em_zeros(2, (const int64_t[]){0, 3}, EM_I32, em_cpu());
    for (unop op = NEG; op <= RELU; op++) {
        em_tensor *y = call_unop(op, z);
        em_test_expect_shape(y, 2, (const int64_t[]){0, 3}, unop_names[op]);
        cr_expect_eq(em_tensor_dtype(y), unop_dtype(op, EM_I32));
        em_tensor_release(y);
    }
    em_tensor *b = em_ones(1, (const int64_t[]){2}, EM_BOOL, em_cpu());
    cr_expect_null(em_neg(b));
    em_assert_error(EM_ERR_DTYPE, "bool");
    RELEASE(b, z);
}

/* ---- reductions ------------------------------------------------------------------------------ */

/* A (3, 4, 5) tensor of dtype dt holding L (C order): contiguous, a permutation of a (5, 3, 4)
 * tensor, or every other element along the last dim of a (3, 4, 10) tensor. */
static em_tensor *logical3(em_dtype dt, layout how, const double *L) {
    double P[120];
    em_tensor *phys, *t;
    if (how == CONTIG) return em_test_tensor(dt, 3, (const int64_t[]){3, 4, 5}, L);
    if (how == TRANSPOSED) {
        for (int i = 0; i < 3; i++) /* P(k, i, j) = L(i, j, k) */
            for (int j = 0; j < 4; j++)
                for (int k = 0; k < 5; k++) P[k * 12 + i * 4 + j] = L[i * 20 + j * 5 + k];
        phys = em_test_tensor(dt, 3, (const int64_t[]){5, 3, 4}, P);
        t = em_permute(phys, 3, (const int[]){1, 2, 0});
    } else {
        for (int i = 0; i < 60; i++) P[2 * i] = L[i], P[2 * i + 1] = 99;
        phys = em_test_tensor(dt, 3, (const int64_t[]){3, 4, 10}, P);
        t = em_slice(phys, 2, 0, 10, 2);
    }
    em_tensor_release(phys);
    cr_assert(t, "%s", em_last_error());
    return t;
}

/* Sum of the (3, 4, 5) values L over the dims marked in red, in double, in the C order of the
 * kept-dims output. Returns the number of outputs. */
static int64_t ref_sum(const double *L, const bool red[3], double *out) {
    const int64_t shape[3] = {3, 4, 5};
    int64_t oshape[3], n = 1;
    for (int d = 0; d < 3; d++) n *= (oshape[d] = red[d] ? 1 : shape[d]);
    for (int64_t o = 0; o < n; o++) out[o] = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 5; k++) {
                int64_t oi = red[0] ? 0 : i, oj = red[1] ? 0 : j, ok = red[2] ? 0 : k;
                out[(oi * oshape[1] + oj) * oshape[2] + ok] += L[i * 20 + j * 5 + k];
            }
    return n;
}

typedef struct sum_case {
    int ndims;
    int dims[3];
    bool red[3];
} sum_case;

static const sum_case sum_cases[] = {
    {0, {0}, {true, true, true}},          {1, {1}, {false, true, false}},
    {2, {0, 2}, {true, false, true}},      {1, {-1}, {false, false, true}},
    {3, {2, 0, 1}, {true, true, true}},    {2, {-3, -2}, {true, true, false}},
};

/* The output shape of a sum case. */
static int sum_shape(const sum_case *c, bool keepdim, int64_t *shape) {
    const int64_t full[3] = {3, 4, 5};
    int n = 0;
    for (int d = 0; d < 3; d++)
        if (!c->red[d]) shape[n++] = full[d];
        else if (keepdim) shape[n++] = 1;
    return n;
}

static void check_sum(em_dtype dt, layout la, const sum_case *c, bool keepdim, bool mean) {
    double L[60], want[60];
    for (int i = 0; i < 60; i++) L[i] = em_test_gen(dt, i, 6);
    int64_t n = ref_sum(L, c->red, want), count = 60 / n;
    em_dtype rt = em_dtype_is_floating(dt) ? dt : EM_I64;
    for (int64_t o = 0; o < n; o++)
        want[o] = em_test_round_to(rt, mean ? want[o] / (double)count : want[o]);
    em_tensor *a = logical3(dt, la, L);
    em_tensor *y = mean ? em_mean(a, c->ndims, c->dims, keepdim)
                        : em_sum(a, c->ndims, c->dims, keepdim);
    char what[128];
    snprintf(what, sizeof what, "%s %s %s over %d dims (%d, %d, %d) keepdim %d",
             mean ? "mean" : "sum", em_dtype_name(dt), layout_names[la], c->ndims, c->dims[0],
             c->dims[1], c->dims[2], keepdim);
    int64_t shape[3];
    int nd = sum_shape(c, keepdim, shape);
    em_test_expect_shape(y, nd, shape, what);
    cr_expect_eq(em_tensor_dtype(y), rt, "%s: dtype %s", what, em_dtype_name(em_tensor_dtype(y)));
    expect_values(y, want, n, mean ? ulp_tol(rt) : (rt == EM_F32 ? 1e-6 : 0), what);
    RELEASE(y, a);
}

Test(reduce, sum_every_dtype_layout_and_dims) {
    for (int k = 0; k < EM_TEST_N_DTYPES; k++)
        for (layout la = CONTIG; la <= SLICED; la++)
            for (size_t c = 0; c < sizeof sum_cases / sizeof sum_cases[0]; c++) {
                check_sum(em_test_all_dtypes[k], la, &sum_cases[c], false, false);
                check_sum(em_test_all_dtypes[k], la, &sum_cases[c], true, false);
            }
}

Test(reduce, mean_floating_dtypes) {
    const em_dtype flt[4] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (int k = 0; k < 4; k++)
        for (layout la = CONTIG; la <= SLICED; la++)
            for (size_t c = 0; c < sizeof sum_cases / sizeof sum_cases[0]; c++) {
                check_sum(flt[k], la, &sum_cases[c], false, true);
                check_sum(flt[k], la, &sum_cases[c], true, true);
            }
}

Test(reduce, sum_of_an_expanded_tensor) {
    const double row[4] = {1, 2, 3, 4.5};
    em_tensor *r = em_test_tensor(EM_F32, 2, (const int64_t[]){1, 4}, row);
    em_tensor *e = em_expand(r, 2, (const int64_t[]){1000, 4});
    em_tensor *all = em_sum(e, 0, NULL, false), *d0 = em_sum(e, 1, (const int[]){0}, false);
    expect_values(all, (const double[]){10.5 * 1000}, 1, 0, "sum of an expanded tensor");
    expect_values(d0, (const double[]){1000, 2000, 3000, 4500}, 4, 0, "sum over the stride-0 dim");
    RELEASE(d0, all, e, r);
}

/* Half-precision means accumulate in float and round once, as in PyTorch: the mean of 1e5
 * ones is 1 although their sum (1e5) overflows float16. */
Test(reduce, half_mean_does_not_overflow) {
    em_tensor *h = em_ones(2, (const int64_t[]){2, 100000}, EM_F16, em_cpu());
    em_tensor *m = em_mean(h, 0, NULL, false), *m1 = em_mean(h, 1, (const int[]){-1}, true);
    cr_assert(m && m1, "%s", em_last_error());
    cr_expect_eq(em_tensor_dtype(m), EM_F16);
    expect_values(m, (const double[]){1}, 1, 0, "mean of 2e5 float16 ones");
    em_test_expect_shape(m1, 2, (const int64_t[]){2, 1}, "mean keepdim");
    expect_values(m1, (const double[]){1, 1}, 2, 0, "row means of float16 ones");
    em_tensor *s = em_sum(h, 0, NULL, false); /* the sum itself is float16: inf, as in PyTorch */
    expect_values(s, (const double[]){INFINITY}, 1, 0, "sum of 2e5 float16 ones");
    em_tensor *b = em_full(1, (const int64_t[]){3}, 3.0, EM_BF16, em_cpu());
    em_tensor *mb = em_mean(b, 0, NULL, false);
    cr_assert(mb, "%s", em_last_error());
    cr_expect_eq(em_tensor_dtype(mb), EM_BF16);
    expect_values(mb, (const double[]){3}, 1, 0, "bfloat16 mean rounds once");
    RELEASE(mb, b, s, m1, m, h);
}

Test(reduce, empty_and_errors) {
    em_tensor *z = em_zeros(2, (const int64_t[]){0, 3}, EM_F32, em_cpu());
    em_tensor *s = em_sum(z, 0, NULL, false), *s0 = em_sum(z, 1, (const int[]){0}, false);
    em_tensor *m = em_mean(z, 0, NULL, false), *m1 = em_mean(z, 1, (const int[]){0}, true);
    em_tensor *s1 = em_sum(z, 1, (const int[]){1}, false);
    em_test_expect_shape(s, 0, NULL, "sum of empty");
    expect_values(s, (const double[]){0}, 1, 0, "sum of empty");
    expect_values(s0, (const double[]){0, 0, 0}, 3, 0, "sum over an empty dim");
    em_test_expect_shape(s1, 1, (const int64_t[]){0}, "sum over a non-empty dim of an empty tensor");
    expect_values(m, (const double[]){NAN}, 1, 0, "mean of empty is NaN");
    em_test_expect_shape(m1, 2, (const int64_t[]){1, 3}, "mean keepdim");
    expect_values(m1, (const double[]){NAN, NAN, NAN}, 3, 0, "mean over an empty dim is NaN");
    em_tensor *i = em_ones(2, (const int64_t[]){2, 3}, EM_I32, em_cpu());
    em_tensor *b = em_ones(1, (const int64_t[]){2}, EM_BOOL, em_cpu());
    cr_expect_null(em_mean(i, 0, NULL, false));
    em_assert_error(EM_ERR_DTYPE, "int32");
    cr_expect_null(em_mean(b, 0, NULL, false));
    em_assert_error(EM_ERR_DTYPE, "bool");
    cr_expect_null(em_sum(i, 1, (const int[]){2}, false));
    em_assert_error(EM_ERR_RANGE, "dim 2");
    cr_expect_null(em_sum(i, 2, (const int[]){1, -1}, false));
    em_assert_error(EM_ERR_INVALID, "more than once");
    RELEASE(b, i, s1, m1, m, s0, s, z);
}

/* A deterministic pseudo-random float in [0, 1) (an LCG, independent of Ember's generator). */
static float lcg_uniform(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(*state >> 40) * 0x1p-24f;
}

static em_tensor *random_f32(int64_t n, uint64_t seed, double *exact_sum) {
    float *x = malloc(sizeof(float) * (size_t)n);
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (x[i] = lcg_uniform(&seed));
    em_tensor *t = em_from_data(x, 1, &n, EM_F32, em_cpu());
    free(x);
    cr_assert(t, "%s", em_last_error());
    if (exact_sum) *exact_sum = s;
    return t;
}

static void expect_rel(double got, double want, double rtol, const char *what) {
    cr_expect(fabs(got - want) <= rtol * fabs(want), "%s: %.9g, want %.9g (relative error %.3g)",
              what, got, want, fabs(got - want) / fabs(want));
}

Test(reduce, f32_sum_of_a_million_is_accurate) {
    double want;
    em_tensor *t = random_f32(1000000, 7, &want);
    em_tensor *s = em_sum(t, 0, NULL, false);
    cr_assert(s, "%s", em_last_error());
    expect_rel(em_item(s), want, 1e-6, "contiguous sum of 1e6");
    /* strided: every other element of 2e6 */
    double want2 = 0;
    em_tensor *u = random_f32(2000000, 8, NULL), *v = em_slice(u, 0, 0, 2000000, 2);
    double *uv = em_test_values(v);
    for (int64_t i = 0; i < 1000000; i++) want2 += uv[i];
    free(uv);
    em_tensor *sv = em_sum(v, 0, NULL, false);
    cr_assert(sv, "%s", em_last_error());
    expect_rel(em_item(sv), want2, 1e-6, "strided sum of 1e6");
    /* along the last dim of (2, 500000), and along the first of (500000, 2) */
    em_tensor *r = em_view(u, 2, (const int64_t[]){2, 1000000});
    em_tensor *c = em_view(u, 2, (const int64_t[]){1000000, 2});
    em_tensor *rs = em_sum(r, 1, (const int[]){1}, false);
    em_tensor *cs = em_sum(c, 1, (const int[]){0}, false);
    cr_assert(rs && cs, "%s", em_last_error());
    double *uu = em_test_values(u), wr[2] = {0, 0}, wc[2] = {0, 0};
    for (int64_t i = 0; i < 2000000; i++) wr[i / 1000000] += uu[i], wc[i % 2] += uu[i];
    free(uu);
    double *gr = em_test_values(rs), *gc = em_test_values(cs);
    for (int k = 0; k < 2; k++) {
        expect_rel(gr[k], wr[k], 1e-6, "row sum of 1e6");
        expect_rel(gc[k], wc[k], 1e-6, "column sum of 1e6");
    }
    free(gr), free(gc);
    RELEASE(cs, c, rs, r, sv, v, u, s, t);
}

/* ---- matmul ---------------------------------------------------------------------------------- */

/* y (M, N) = a (M, K) b (K, N), in double. */
static void ref_mm(const double *a, const double *b, int64_t M, int64_t K, int64_t N, double *y) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += a[i * K + k] * b[k * N + j];
            y[i * N + j] = s;
        }
}

/* Small integers: every product and sum is exact in f32 and f64. */
static void int_values(double *v, int64_t n, int seed) {
    for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 7 + seed * 5) % 11) - 5;
}

static void check_mm_layouts(em_dtype dt, layout la, layout lb) {
    enum { M = 3, K = 4, N = 5 };
    double A[M * K], Bv[K * N], want[M * N];
    int_values(A, M * K, 1);
    int_values(Bv, K * N, 2);
    if (la == EXPANDED) for (int i = 0; i < M * K; i++) A[i] = A[i % K];
    if (lb == EXPANDED) for (int i = 0; i < K * N; i++) Bv[i] = Bv[i % N];
    ref_mm(A, Bv, M, K, N, want);
    em_tensor *a = logical(dt, la, M, K, A), *b = logical(dt, lb, K, N, Bv);
    em_tensor *y = em_matmul(a, b);
    char what[96];
    snprintf(what, sizeof what, "matmul %s %s x %s", em_dtype_name(dt), layout_names[la],
             layout_names[lb]);
    em_test_expect_shape(y, 2, (const int64_t[]){M, N}, what);
    cr_expect_eq(em_tensor_dtype(y), dt);
    expect_values(y, want, M * N, 0, what);
    RELEASE(y, b, a);
}

/* f16 and bf16 too: the small integers, their products and sums (|y| <= 100) are exact in
 * both, so every dtype compares exactly. */
Test(matmul, two_d_every_layout_every_float_dtype) {
    const em_dtype dts[4] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (int d = 0; d < 4; d++)
        for (layout la = CONTIG; la < N_LAYOUTS; la++)
            for (layout lb = CONTIG; lb < N_LAYOUTS; lb++) check_mm_layouts(dts[d], la, lb);
}

Test(matmul, one_d_operands) {
    double a[4], B2[20], A2[12], w[5];
    int_values(a, 4, 3);
    int_values(B2, 20, 4);
    int_values(A2, 12, 5);
    em_tensor *v = em_test_tensor(EM_F32, 1, (const int64_t[]){4}, a);
    em_tensor *m = em_test_tensor(EM_F32, 2, (const int64_t[]){4, 5}, B2);
    em_tensor *ma = em_test_tensor(EM_F32, 2, (const int64_t[]){3, 4}, A2);
    em_tensor *dot = em_matmul(v, v), *vm = em_matmul(v, m), *mv = em_matmul(ma, v);
    double d = 0;
    for (int k = 0; k < 4; k++) d += a[k] * a[k];
    em_test_expect_shape(dot, 0, NULL, "1-D x 1-D");
    expect_values(dot, &d, 1, 0, "1-D x 1-D");
    ref_mm(a, B2, 1, 4, 5, w);
    em_test_expect_shape(vm, 1, (const int64_t[]){5}, "1-D x 2-D");
    expect_values(vm, w, 5, 0, "1-D x 2-D");
    ref_mm(A2, a, 3, 4, 1, w);
    em_test_expect_shape(mv, 1, (const int64_t[]){3}, "2-D x 1-D");
    expect_values(mv, w, 3, 0, "2-D x 1-D");
    RELEASE(mv, vm, dot, ma, m, v);
}

Test(matmul, batched_with_broadcasting) {
    /* (2, 1, 3, 4) x (5, 4, 2) -> (2, 5, 3, 2): y[p][q] = a[p][0] b[q] */
    double A[24], Bv[40], want[60];
    int_values(A, 24, 6);
    int_values(Bv, 40, 7);
    for (int p = 0; p < 2; p++)
        for (int q = 0; q < 5; q++) ref_mm(A + p * 12, Bv + q * 8, 3, 4, 2, want + (p * 5 + q) * 6);
    em_tensor *a = em_test_tensor(EM_F64, 4, (const int64_t[]){2, 1, 3, 4}, A);
    em_tensor *b = em_test_tensor(EM_F64, 3, (const int64_t[]){5, 4, 2}, Bv);
    em_tensor *y = em_matmul(a, b);
    em_test_expect_shape(y, 4, (const int64_t[]){2, 5, 3, 2}, "batched");
    expect_values(y, want, 60, 0, "batched");
    /* a 1-D vector against the batch: (4) x (5, 4, 2) -> (5, 2) */
    em_tensor *v = em_test_tensor(EM_F64, 1, (const int64_t[]){4}, A);
    em_tensor *vy = em_matmul(v, b);
    for (int q = 0; q < 5; q++) ref_mm(A, Bv + q * 8, 1, 4, 2, want + q * 2);
    em_test_expect_shape(vy, 2, (const int64_t[]){5, 2}, "1-D x batch");
    expect_values(vy, want, 10, 0, "1-D x batch");
    RELEASE(vy, v, y, b, a);
}

Test(matmul, random_values_f32) {
    enum { M = 33, K = 300, N = 17 };
    uint64_t seed = 11;
    double *A = malloc(sizeof(double) * M * K), *Bv = malloc(sizeof(double) * K * N);
    double want[M * N], mag[M * N];
    for (int i = 0; i < M * K; i++) A[i] = (float)(lcg_uniform(&seed) * 2 - 1);
    for (int i = 0; i < K * N; i++) Bv[i] = (float)(lcg_uniform(&seed) * 2 - 1);
    ref_mm(A, Bv, M, K, N, want);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            mag[i * N + j] = 0;
            for (int k = 0; k < K; k++) mag[i * N + j] += fabs(A[i * K + k] * Bv[k * N + j]);
        }
    em_tensor *a = logical(EM_F32, TRANSPOSED, M, K, A), *b = logical(EM_F32, SLICED, K, N, Bv);
    em_tensor *y = em_matmul(a, b);
    cr_assert(y, "%s", em_last_error());
    double *g = em_test_values(y);
    for (int i = 0; i < M * N; i++)
        cr_expect(fabs(g[i] - want[i]) <= 1e-5 * mag[i], "element %d: %.9g, want %.9g", i, g[i],
                  want[i]);
    free(g), free(A), free(Bv);
    RELEASE(y, b, a);
}

/* 1-D operands and K == 0 in f16 and bf16 (the f32 cases above and in test_ops_linalg). */
Test(matmul, one_d_and_empty_half_dtypes) {
    const em_dtype dts[2] = {EM_F16, EM_BF16};
    double a[4], B2[20], w[5];
    int_values(a, 4, 3);
    int_values(B2, 20, 4);
    for (int d = 0; d < 2; d++) {
        em_dtype dt = dts[d];
        em_tensor *v = em_test_tensor(dt, 1, (const int64_t[]){4}, a);
        em_tensor *m = logical(dt, TRANSPOSED, 4, 5, B2);
        em_tensor *dot = em_matmul(v, v), *vm = em_matmul(v, m);
        double dd = 0;
        for (int k = 0; k < 4; k++) dd += a[k] * a[k];
        em_test_expect_shape(dot, 0, NULL, em_dtype_name(dt));
        cr_expect_eq(em_tensor_dtype(dot), dt);
        expect_values(dot, &dd, 1, 0, "half 1-D x 1-D");
        ref_mm(a, B2, 1, 4, 5, w);
        em_test_expect_shape(vm, 1, (const int64_t[]){5}, "half 1-D x transposed 2-D");
        expect_values(vm, w, 5, 0, "half 1-D x transposed 2-D");
        em_tensor *e0 = em_ones(2, (const int64_t[]){3, 0}, dt, em_cpu());
        em_tensor *e1 = em_ones(2, (const int64_t[]){0, 5}, dt, em_cpu());
        em_tensor *y = em_matmul(e0, e1);
        double zeros[15] = {0};
        em_test_expect_shape(y, 2, (const int64_t[]){3, 5}, "half K = 0");
        expect_values(y, zeros, 15, 0, "half K = 0");
        em_tensor *ym = em_matmul(e1, m);
        cr_assert_null(ym, "[0, 5] x [4, 5] must not multiply");
        em_assert_error(EM_ERR_SHAPE, "[0, 5] and [4, 5]");
        em_tensor *e1t = em_transpose(e1, 0, 1);
        em_tensor *e2 = em_ones(2, (const int64_t[]){0, 2}, dt, em_cpu());
        em_tensor *m0 = em_matmul(e1t, e2);
        em_test_expect_shape(m0, 2, (const int64_t[]){5, 2}, "half transposed K = 0");
        double z10[10] = {0};
        expect_values(m0, z10, 10, 0, "half transposed K = 0");
        RELEASE(m0, e2, e1t, y, e1, e0, vm, dot, m, v);
    }
}

Test(matmul, empty_inner_dim_gives_zeros) {
    em_tensor *a = em_ones(2, (const int64_t[]){3, 0}, EM_F32, em_cpu());
    em_tensor *b = em_ones(2, (const int64_t[]){0, 5}, EM_F32, em_cpu());
    em_tensor *y = em_matmul(a, b);
    double want[15] = {0};
    em_test_expect_shape(y, 2, (const int64_t[]){3, 5}, "K = 0");
    expect_values(y, want, 15, 0, "K = 0");
    em_tensor *e = em_ones(2, (const int64_t[]){0, 3}, EM_F64, em_cpu());
    em_tensor *f = em_ones(2, (const int64_t[]){3, 2}, EM_F64, em_cpu());
    em_tensor *ef = em_matmul(e, f);
    em_test_expect_shape(ef, 2, (const int64_t[]){0, 2}, "M = 0");
    RELEASE(ef, f, e, y, b, a);
}

Test(matmul, errors) {
    em_tensor *a = em_zeros(2, (const int64_t[]){32, 784}, EM_F32, em_cpu());
    em_tensor *b = em_zeros(2, (const int64_t[]){512, 256}, EM_F32, em_cpu());
    em_tensor *c = em_zeros(2, (const int64_t[]){784, 10}, EM_F64, em_cpu());
    em_tensor *i = em_zeros(2, (const int64_t[]){784, 10}, EM_I32, em_cpu());
    em_tensor *ii = em_zeros(2, (const int64_t[]){32, 784}, EM_I32, em_cpu());
    em_tensor *s = em_scalar(1, EM_F32);
    em_tensor *b3 = em_zeros(3, (const int64_t[]){2, 784, 3}, EM_F32, em_cpu());
    em_tensor *a3 = em_zeros(3, (const int64_t[]){3, 32, 784}, EM_F32, em_cpu());
    cr_expect_null(em_matmul(a, b));
    cr_expect_eq(em_last_status(), EM_ERR_SHAPE);
    cr_expect_str_eq(em_last_error(),
                     "matmul: shapes [32, 784] and [512, 256] cannot be multiplied (784 != 512)");
    cr_expect_null(em_matmul(a, c));
    em_assert_error(EM_ERR_DTYPE, "float32");
    cr_expect(strstr(em_last_error(), "float64"), "%s", em_last_error());
    cr_expect_null(em_matmul(ii, i));
    em_assert_error(EM_ERR_DTYPE, "int32");
    cr_expect_null(em_matmul(s, a));
    em_assert_error(EM_ERR_SHAPE, "[]");
    cr_expect_null(em_matmul(a3, b3));
    em_assert_error(EM_ERR_SHAPE, "[3, 32, 784]");
    cr_expect(strstr(em_last_error(), "[2, 784, 3]"), "%s", em_last_error());
    RELEASE(a3, b3, s, ii, i, c, b, a);
}

/* Host bytes allocated through Ember's injectable host allocator (CPU tensor storage and
 * kernel scratch buffers), to see which matmul operands get copied. */
static size_t host_bytes;
static void *counting_alloc(size_t n, size_t align, void *user) {
    (void)user;
    void *p = NULL;
    if (posix_memalign(&p, align, n) != 0) return NULL;
    __atomic_add_fetch(&host_bytes, n, __ATOMIC_RELAXED);
    return p;
}
static void counting_free(void *p, void *user) {
    (void)user;
    free(p);
}
static void counting_setup(void) {
    em_host_allocator_set(&(em_host_allocator){counting_alloc, counting_free, NULL});
    em_test_setup();
}
static void counting_teardown(void) {
    em_test_teardown();
    em_host_allocator_set(NULL);
}
TestSuite(matmul_copies, .init = counting_setup, .fini = counting_teardown);

/* Host bytes allocated by one matmul of a and b (cache emptied first), checking the values. */
static size_t mm_bytes(const em_tensor *a, const em_tensor *b, const double *want, int64_t n) {
    em_empty_cache();
    size_t before = host_bytes;
    em_tensor *y = em_matmul(a, b);
    size_t used = host_bytes - before;
    expect_values(y, want, n, 0, "matmul");
    em_tensor_release(y);
    return used;
}

Test(matmul_copies, transposed_operands_are_not_copied_sliced_ones_are) {
    enum { M = 64, K = 48, N = 40 };
    double *A = malloc(sizeof(double) * M * K), *Bv = malloc(sizeof(double) * K * N);
    double *want = malloc(sizeof(double) * M * N);
    int_values(A, M * K, 8);
    int_values(Bv, K * N, 9);
    ref_mm(A, Bv, M, K, N, want);
    em_tensor *ac = logical(EM_F32, CONTIG, M, K, A), *bc = logical(EM_F32, CONTIG, K, N, Bv);
    em_tensor *at = logical(EM_F32, TRANSPOSED, M, K, A);
    em_tensor *bt = logical(EM_F32, TRANSPOSED, K, N, Bv);
    em_tensor *as = logical(EM_F32, SLICED, M, K, A);
    mm_bytes(ac, bc, want, M * N); /* warm-up: lazily created state */
    size_t contiguous = mm_bytes(ac, bc, want, M * N);
    size_t transposed = mm_bytes(at, bt, want, M * N);
    size_t sliced = mm_bytes(as, bc, want, M * N);
    cr_expect_eq(transposed, contiguous, "transposed operands: %zu bytes, contiguous: %zu",
                 transposed, contiguous);
    cr_expect_geq(sliced, contiguous + sizeof(float) * M * K,
                  "a sliced operand is copied: %zu bytes, contiguous: %zu", sliced, contiguous);
    free(A), free(Bv), free(want);
    RELEASE(as, bt, at, bc, ac);
}

/* ---- fill_ and arange ------------------------------------------------------------------------ */

Test(create, fill_every_dtype_through_a_strided_view) {
    for (int k = 0; k < EM_TEST_N_DTYPES; k++) {
        em_dtype dt = em_test_all_dtypes[k];
        em_tensor *base = em_zeros(2, (const int64_t[]){3, 8}, dt, em_cpu());
        em_tensor *v = em_slice(base, 1, 1, 8, 3); /* columns 1, 4, 7 */
        uint64_t ver = em_tensor_version(base);
        cr_assert_eq(em_fill_(v, -3.7), EM_OK, "%s", em_last_error());
        cr_expect_gt(em_tensor_version(base), ver);
        double fillv = em_dtype_is_floating(dt) ? em_test_round_to(dt, -3.7)
                       : dt == EM_BOOL        ? 1
                       : dt == EM_U8          ? -1 /* not specified: skipped below */
                                              : -3; /* truncation toward zero */
        double *g = em_test_values(base);
        for (int i = 0; i < 24; i++) {
            bool in = i % 8 % 3 == 1;
            if (in && dt == EM_U8) continue;
            cr_expect_eq(g[i], in ? fillv : 0, "%s element %d: %g", em_dtype_name(dt), i, g[i]);
        }
        free(g);
        cr_assert_eq(em_fill_(base, 2.5), EM_OK);
        g = em_test_values(base);
        for (int i = 0; i < 24; i++)
            cr_expect_eq(g[i], em_dtype_is_floating(dt) ? 2.5 : dt == EM_BOOL ? 1 : 2);
        free(g);
        RELEASE(v, base);
    }
    em_tensor *e = em_empty(2, (const int64_t[]){0, 4}, EM_F32, em_cpu());
    cr_expect_eq(em_fill_(e, 1), EM_OK);
    em_tensor_release(e);
}

static void check_arange(double start, double end, double step, em_dtype dt) {
    em_tensor *t = em_arange(start, end, step, dt, em_cpu());
    char what[96];
    snprintf(what, sizeof what, "arange(%g, %g, %g, %s)", start, end, step, em_dtype_name(dt));
    int64_t n = (int64_t)ceil((end - start) / step);
    double want[64];
    cr_assert_leq(n, 64);
    for (int64_t i = 0; i < n; i++) want[i] = em_test_round_to(dt, start + (double)i * step);
    em_test_expect_shape(t, 1, &n, what);
    cr_expect_eq(em_tensor_dtype(t), dt);
    expect_values(t, want, n, 0, what);
    em_tensor_release(t);
}

Test(create, arange) {
    check_arange(0, 5, 1, EM_F32);
    check_arange(1, 2, 0.25, EM_F64);
    check_arange(0, 1, 0.1, EM_F32); /* 10 elements, the last 0.9 */
    check_arange(5, 0, -1.5, EM_F32);
    check_arange(0, 4, 1, EM_F16);
    check_arange(-2, 2, 0.5, EM_BF16);
    check_arange(10, 0, -3, EM_I64);
    check_arange(-3, 3, 2, EM_I32);
    check_arange(0, 7, 1, EM_U8);
    check_arange(3, 3, 1, EM_I64); /* empty */
    cr_expect_null(em_arange(0, 5, 0, EM_F32, em_cpu()));
    em_assert_error(EM_ERR_INVALID, "step 0");
    cr_expect_null(em_arange(0, 5, -1, EM_F32, em_cpu()));
    em_assert_error(EM_ERR_INVALID, "[0, 5)");
    cr_expect_null(em_arange(5, 0, 1, EM_I64, em_cpu()));
    em_assert_error(EM_ERR_INVALID, "[5, 0)");
    cr_expect_null(em_arange(NAN, 1, 1, EM_F32, em_cpu()));
    em_assert_error(EM_ERR_INVALID, "arange");
}

/* ---- deterministic mode ---------------------------------------------------------------------- */

/* The bits of the f32 sum of t with n threads. */
static uint32_t sum_bits(const em_tensor *t, int threads) {
    em_set_num_threads(threads);
    cr_assert_eq(em_num_threads(), threads);
    em_tensor *s = em_sum(t, 0, NULL, false);
    cr_assert(s, "%s", em_last_error());
    uint32_t bits;
    float f;
    cr_assert_eq(em_tensor_to_host(s, &f, sizeof f), EM_OK);
    memcpy(&bits, &f, sizeof bits);
    em_tensor_release(s);
    return bits;
}

Test(deterministic, f32_sum_is_bitwise_identical_across_thread_counts) {
    int threads0 = em_num_threads();
    bool det0 = em_deterministic();
    double want;
    em_tensor *t = random_f32(3000000, 12345, &want);
    em_set_deterministic(true);
    cr_expect(em_deterministic());
    uint32_t one = sum_bits(t, 1), two = sum_bits(t, 2), two_again = sum_bits(t, 2);
    uint32_t one_again = sum_bits(t, 1), three = sum_bits(t, 3);
    cr_expect(memcmp(&one, &two, sizeof one) == 0, "1 thread: 0x%08x, 2 threads: 0x%08x", one,
              two);
    cr_expect(memcmp(&two, &two_again, sizeof two) == 0, "two runs with 2 threads differ");
    cr_expect(memcmp(&one, &one_again, sizeof one) == 0, "two runs with 1 thread differ");
    cr_expect(memcmp(&one, &three, sizeof one) == 0, "1 thread: 0x%08x, 3 threads: 0x%08x", one,
              three);
    float f;
    memcpy(&f, &one, sizeof f);
    expect_rel(f, want, 1e-6, "deterministic sum of 3e6");
    em_set_deterministic(det0);
    em_set_num_threads(threads0);
    em_tensor_release(t);
}
