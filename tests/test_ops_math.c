/*
 * test_ops_math.c — the elementwise math ops of ember/ops.h against plain-loop references in
 * double precision written here, per dtype, on contiguous, transposed, sliced (step 2) and
 * expanded (stride 0) inputs, long runs (the vectorised and threaded paths), zero-size
 * tensors, broadcasting, PyTorch's type promotion (and its rule for scalars), NaN semantics,
 * error messages; the f32 transcendentals against NumPy's ULP tables
 * (tests/fixtures/umath/); the backward helpers against analytic derivatives and central
 * differences of the forward ops.
 *
 * Tolerances (|got - want| <= atol + rtol |want|, want computed in double and rounded once
 * to the result dtype):
 *   exact ops (abs, sign, clamp, comparisons, logical, where, maximum/minimum, integer
 *   arithmetic, products of the small dyadic values used): 0.
 *   f32: rtol 4e-6, atol 1e-6 (libmvec's vector functions are within 4 ulp; gelu and silu
 *        lose relative accuracy where they cancel to near 0, hence the atol);
 *   f64: rtol 1e-12, atol 1e-14;
 *   f16: rtol 2^-10, atol 1e-3 (f32 computation rounded to f16 can differ by one f16 ulp from
 *        the double reference rounded to f16);
 *   bf16: rtol 2^-7, atol 1e-2.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"
#include "tests/layouts.h"
#include "tests/op_cases.h"

TestSuite(math_unary, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(math_scalar, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(math_binary, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(math_logic, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(math_backward, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(math_ulp, .init = em_test_setup, .fini = em_test_teardown);

static const em_dtype float_dtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- helpers ----------------------------------------------------------------------------------- */


typedef struct tol {
    double rtol, atol;
} tol;
static tol tol_of(em_dtype dt) {
    switch (dt) {
    case EM_F32: return (tol){4e-6, 1e-6};
    case EM_F64: return (tol){1e-12, 1e-14};
    case EM_F16: return (tol){0x1p-10, 1e-3};
    case EM_BF16: return (tol){0x1p-7, 1e-2};
    default: return (tol){0, 0};
    }
}
static const tol exact = {0, 0};


/* got matches want (n values, C order) within tolerance (tests/common.h). */
static void expect_values(const em_tensor *got, const double *want, int64_t n, tol t,
                          const char *what) {
    em_test_expect_close(got, want, n, t.rtol, t.atol, what);
}

static void expect_dtype(const em_tensor *t, em_dtype dt, const char *what) {
    cr_assert(t, "%s: %s", what, em_last_error());
    cr_expect_eq(em_tensor_dtype(t), dt, "%s: dtype %s, want %s", what,
                 em_dtype_name(em_tensor_dtype(t)), em_dtype_name(dt));
}

static em_tensor *vec(em_dtype dt, int64_t n, const double *v) {
    return em_test_tensor(dt, 1, (const int64_t[]){n}, v);
}

/* Value i of a spread over [lo, hi] (101 distinct points, shuffled). */
static double spread(int64_t i, double lo, double hi) {
    return lo + (hi - lo) * (double)((i * 37 + 11) % 101) / 100.0;
}

/* ---- unary floating ops ----------------------------------------------------------------------- */

static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_recip(double x) { return 1 / x; }
static double r_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double r_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double r_silu(double x) { return x / (1 + exp(-x)); }
static double r_leaky(double x) { return x > 0 ? x : 0.2 * x; }
static double r_abs(double x) { return fabs(x); }
static double r_sign(double x) { return (x > 0) - (x < 0); }

static em_tensor *f_gelu(const em_tensor *a) { return em_gelu(a, NULL); }
static em_tensor *f_gelu_tanh(const em_tensor *a) { return em_gelu(a, "tanh"); }
static em_tensor *f_leaky(const em_tensor *a) { return em_leaky_relu(a, 0.2); }

/* The dtypes each op takes and whether integers give float32 are the op-case table's and the
 * schema's (tests/op_cases.h); the references and input domains are this file's. */
typedef struct unary_case {
    const char *name, *op; /* the case; the op it calls, as the table names it */
    em_tensor *(*fn)(const em_tensor *);
    double (*ref)(double);
    double lo, hi; /* input domain */
} unary_case;

static const unary_case unary_cases[] = {
    {"sqrt", "sqrt", em_sqrt, sqrt, 0, 9},
    {"rsqrt", "rsqrt", em_rsqrt, r_rsqrt, 0.01, 9},
    {"reciprocal", "reciprocal", em_reciprocal, r_recip, 0.25, 4},
    {"sigmoid", "sigmoid", em_sigmoid, r_sigmoid, -12, 12},
    {"tanh", "tanh", em_tanh, tanh, -5, 5},
    {"log1p", "log1p", em_log1p, log1p, -0.9, 10},
    {"expm1", "expm1", em_expm1, expm1, -5, 5},
    {"exp", "exp", em_exp, exp, -10, 10},
    {"log", "log", em_log, log, 0.01, 100},
    {"gelu", "gelu", f_gelu, r_gelu, -4, 4},
    {"gelu(tanh)", "gelu", f_gelu_tanh, r_gelu_tanh, -4, 4},
    {"silu", "silu", em_silu, r_silu, -8, 8},
    {"leaky_relu", "leaky_relu", f_leaky, r_leaky, -3, 3},
    {"abs", "abs", em_abs, r_abs, -3, 3},
    {"sign", "sign", em_sign, r_sign, -3, 3},
};

static void check_unary(const unary_case *c, em_dtype dt, layout how) {
    enum { R = 4, C = 9 };
    double in[R * C], want[R * C];
    for (int i = 0; i < R * C; i++)
        in[i] = em_test_round_to(dt, spread(how == EXPANDED ? i % C : i, c->lo, c->hi));
    for (int i = 0; i < R * C; i++) want[i] = em_test_round_to(dt, c->ref(in[i]));
    em_tensor *x = logical(dt, how, R, C, in);
    em_tensor *y = c->fn(x);
    char what[96];
    snprintf(what, sizeof what, "%s %s %s", c->name, em_dtype_name(dt), layout_names[how]);
    em_test_expect_shape(y, 2, (const int64_t[]){R, C}, what);
    expect_dtype(y, dt, what);
    expect_values(y, want, R * C, tol_of(dt), what);
    RELEASE(y, x);
}

Test(math_unary, every_float_dtype_and_layout) {
    for (int k = 0; k < LEN(unary_cases); k++) {
        unsigned dts = em_case_dtypes_of(unary_cases[k].op);
        cr_assert(dts, "%s: no row in the op-case table", unary_cases[k].op);
        for (int d = 0; d < LEN(float_dtypes); d++)
            for (int l = 0; l < N_LAYOUTS && (dts & EM_CASE_DT(float_dtypes[d])); l++)
                check_unary(&unary_cases[k], float_dtypes[d], l);
    }
}

/* 100003 elements: vectorised runs, their scalar tails, and the split across threads. */
Test(math_unary, long_runs_f32) {
    enum { N = 100003 };
    double *in = malloc(sizeof(double) * N), *want = malloc(sizeof(double) * N);
    for (int k = 0; k < LEN(unary_cases); k++) {
        const unary_case *c = &unary_cases[k];
        for (int i = 0; i < N; i++) {
            in[i] = (float)(c->lo + (c->hi - c->lo) * (double)i / N);
            want[i] = (float)c->ref(in[i]);
        }
        em_tensor *x = vec(EM_F32, N, in), *y = c->fn(x);
        expect_values(y, want, N, tol_of(EM_F32), c->name);
        RELEASE(y, x);
    }
    free(in);
    free(want);
}

Test(math_unary, integer_inputs) {
    const double v[] = {1, 2, 3, 4, 9};
    for (int k = 0; k < LEN(unary_cases); k++) {
        const unary_case *c = &unary_cases[k];
        em_tensor *x = vec(EM_I64, 5, v), *y = c->fn(x);
        const em_op_schema *s = em_op_schema_of(em_op_find(c->op));
        cr_assert(s, "%s: no such op", c->op);
        if (em_case_dtypes_of(c->op) & EM_CASE_DT(EM_I64)) {
            em_dtype want_dt = s->flags & EM_OP_FLOAT_RESULT ? EM_F32 : EM_I64;
            double want[5];
            for (int i = 0; i < 5; i++) want[i] = em_test_round_to(want_dt, c->ref(v[i]));
            expect_dtype(y, want_dt, c->name);
            expect_values(y, want, 5, tol_of(want_dt), c->name);
        } else {
            cr_expect_null(y, "%s of int64", c->name);
            em_assert_error(EM_ERR_DTYPE, "expected a floating tensor, got int64");
        }
        RELEASE(y, x);
    }
}

Test(math_unary, abs_and_sign_of_integers) {
    const double v[] = {-7, 0, 5, -1, 2147483647, -2147483648.0};
    const em_dtype dts[] = {EM_I32, EM_I64, EM_U8};
    for (int d = 0; d < LEN(dts); d++) {
        em_dtype dt = dts[d];
        double in[6], wa[6], ws[6];
        for (int i = 0; i < 6; i++) {
            in[i] = em_test_round_to(dt, v[i]);
            /* abs(INT32_MIN) wraps to itself in int32, as in PyTorch */
            wa[i] = em_test_round_to(dt, fabs(in[i]));
            ws[i] = r_sign(in[i]);
        }
        em_tensor *x = vec(dt, 6, in), *a = em_abs(x), *s = em_sign(x);
        expect_dtype(a, dt, "abs");
        expect_values(a, wa, 6, exact, em_dtype_name(dt));
        expect_values(s, ws, 6, exact, em_dtype_name(dt));
        RELEASE(s, a, x);
    }
    const double b[] = {1, 0, 1};
    em_tensor *x = vec(EM_BOOL, 3, b), *s = em_sign(x);
    expect_dtype(s, EM_BOOL, "sign of bool");
    expect_values(s, b, 3, exact, "sign of bool");
    cr_expect_null(em_abs(x));
    em_assert_error(EM_ERR_DTYPE, "abs: not supported for bool");
    RELEASE(s, x);
}

Test(math_unary, special_values) {
    const double in[] = {NAN, INFINITY, -INFINITY, 0.0, -0.0, -1};
    em_tensor *x = vec(EM_F32, 6, in);
    struct {
        em_tensor *y;
        double want[6];
    } c[] = {
        {em_sqrt(x), {NAN, INFINITY, NAN, 0, -0.0, NAN}},
        {em_rsqrt(x), {NAN, 0, NAN, INFINITY, -INFINITY, NAN}},
        {em_sigmoid(x), {NAN, 1, 0, 0.5, 0.5, r_sigmoid(-1)}},
        {em_tanh(x), {NAN, 1, -1, 0, -0.0, tanh(-1)}},
        {em_sign(x), {0, 1, -1, 0, 0, -1}},
        {em_abs(x), {NAN, INFINITY, INFINITY, 0, 0, 1}},
        {em_log1p(x), {NAN, INFINITY, NAN, 0, -0.0, -INFINITY}},
        {em_reciprocal(x), {NAN, 0, -0.0, INFINITY, -INFINITY, -1}},
        {em_silu(x), {NAN, INFINITY, NAN, 0, -0.0, r_silu(-1)}},
    };
    for (int k = 0; k < LEN(c); k++) {
        for (int i = 0; i < 6; i++) c[k].want[i] = (float)c[k].want[i];
        char what[32];
        snprintf(what, sizeof what, "special values #%d", k);
        expect_values(c[k].y, c[k].want, 6, tol_of(EM_F32), what);
        /* signed zeros */
        double *g = em_test_values(c[k].y);
        for (int i = 0; i < 6; i++)
            if (c[k].want[i] == 0)
                cr_expect_eq(signbit(g[i]), signbit(c[k].want[i]), "%s: sign of zero %d",
                             what, i);
        free(g);
        em_tensor_release(c[k].y);
    }
    em_tensor_release(x);
}

Test(math_unary, zero_size) {
    for (int d = 0; d < LEN(float_dtypes); d++) {
        em_tensor *x = em_zeros(2, (const int64_t[]){0, 3}, float_dtypes[d], em_cpu());
        for (int k = 0; k < LEN(unary_cases); k++) {
            em_tensor *y = unary_cases[k].fn(x);
            em_test_expect_shape(y, 2, (const int64_t[]){0, 3}, unary_cases[k].name);
            em_tensor_release(y);
        }
        cr_expect_eq(em_sigmoid_(x), EM_OK, "%s", em_last_error());
        em_tensor_release(x);
    }
}

typedef struct inplace_case {
    const char *name;
    em_status (*fn)(em_tensor *);
    double (*ref)(double);
} inplace_case;
static em_status leaky_(em_tensor *a) { return em_leaky_relu_(a, 0.2); }
static const inplace_case inplace_cases[] = {
    {"sigmoid_", em_sigmoid_, r_sigmoid}, {"tanh_", em_tanh_, tanh},
    {"abs_", em_abs_, r_abs},             {"sign_", em_sign_, r_sign},
    {"silu_", em_silu_, r_silu},          {"leaky_relu_", leaky_, r_leaky},
    {"expm1_", em_expm1_, expm1},         {"reciprocal_", em_reciprocal_, r_recip},
};

/* In place on a contiguous tensor and on a transposed view (writes through the strides and
 * leaves the base's other elements alone). */
Test(math_unary, in_place) {
    enum { R = 3, C = 5 };
    for (int k = 0; k < LEN(inplace_cases); k++)
        for (int d = 0; d < LEN(float_dtypes); d++)
            for (int l = 0; l < 2; l++) {
                em_dtype dt = float_dtypes[d];
                double in[R * C], want[R * C];
                for (int i = 0; i < R * C; i++) {
                    in[i] = em_test_round_to(dt, spread(i, -3, 3));
                    if (in[i] == 0) in[i] = 0.5;
                    want[i] = em_test_round_to(dt, inplace_cases[k].ref(in[i]));
                }
                em_tensor *x = logical(dt, l ? TRANSPOSED : CONTIG, R, C, in);
                uint64_t v0 = em_tensor_version(x);
                char what[64];
                snprintf(what, sizeof what, "%s %s %s", inplace_cases[k].name,
                         em_dtype_name(dt), layout_names[l]);
                cr_expect_eq(inplace_cases[k].fn(x), EM_OK, "%s: %s", what, em_last_error());
                cr_expect_gt(em_tensor_version(x), v0, "%s bumps the version", what);
                expect_values(x, want, R * C, tol_of(dt), what);
                em_tensor_release(x);
            }
    const double v[] = {1, -2};
    em_tensor *i = vec(EM_I64, 2, v);
    cr_expect_eq(em_sigmoid_(i), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "sigmoid_: result type float32 can't be cast to the desired "
                                  "output type int64");
    cr_expect_eq(em_abs_(i), EM_OK, "%s", em_last_error());
    const double wa[] = {1, 2};
    expect_values(i, wa, 2, exact, "abs_ int64");
    em_tensor_release(i);
}

Test(math_unary, gelu_bad_approximate_and_nulls) {
    em_tensor *x = em_zeros(1, (const int64_t[]){2}, EM_F32, em_cpu());
    cr_expect_null(em_gelu(x, "fast"));
    em_assert_error(EM_ERR_INVALID, "gelu: approximate must be \"none\" or \"tanh\", got "
                                    "\"fast\"");
    em_tensor *y = em_gelu(x, "none");
    cr_expect_not_null(y, "%s", em_last_error());
    /* A NULL input keeps the pending error of whatever produced it. */
    cr_expect_null(em_gelu(NULL, "foo"));
    cr_expect_null(em_sigmoid(em_gelu(x, "fast")));
    em_assert_error(EM_ERR_INVALID, "got \"fast\"");
    cr_expect_null(em_where(NULL, x, x));
    em_assert_error(EM_ERR_INVALID, "got \"fast\"");
    RELEASE(y, x);
}

/* ---- clamp -------------------------------------------------------------------------------------- */

Test(math_unary, clamp_values_dtypes_and_layouts) {
    enum { R = 3, C = 7 };
    const double lo = -1.25, hi = 2.5;
    for (int d = 0; d < LEN(em_test_all_dtypes) - 1; d++) {
        em_dtype dt = em_test_all_dtypes[d];
        for (int l = 0; l < N_LAYOUTS; l++) {
            double in[R * C], w[R * C], wlo[R * C], whi[R * C];
            bool fl = em_dtype_is_floating(dt);
            /* integer tensors: integer bounds keep the dtype */
            double blo = fl ? lo : (dt == EM_U8 ? 3 : -2), bhi = fl ? hi : 7;
            for (int i = 0; i < R * C; i++) {
                in[i] = em_test_round_to(dt, spread(l == EXPANDED ? i % C : i, -5, 10));
                double cl = in[i] < em_test_round_to(dt, blo) ? em_test_round_to(dt, blo) : in[i];
                w[i] = cl > em_test_round_to(dt, bhi) ? em_test_round_to(dt, bhi) : cl;
                wlo[i] = in[i] < em_test_round_to(dt, blo) ? em_test_round_to(dt, blo) : in[i];
                whi[i] = in[i] > em_test_round_to(dt, bhi) ? em_test_round_to(dt, bhi) : in[i];
            }
            em_tensor *x = logical(dt, l, R, C, in);
            em_tensor *y = em_clamp(x, &blo, &bhi), *ylo = em_clamp(x, &blo, NULL),
                      *yhi = em_clamp(x, NULL, &bhi);
            char what[64];
            snprintf(what, sizeof what, "clamp %s %s", em_dtype_name(dt), layout_names[l]);
            expect_dtype(y, dt, what);
            expect_values(y, w, R * C, exact, what);
            expect_values(ylo, wlo, R * C, exact, what);
            expect_values(yhi, whi, R * C, exact, what);
            RELEASE(yhi, ylo, y, x);
        }
    }
}

Test(math_unary, clamp_nan_and_promotion) {
    const double in[] = {1, 2, 3, NAN};
    em_tensor *x = vec(EM_F32, 4, in);
    double nan = NAN, one = 1, five = 5, big = 2.5, small = 1.5;
    em_tensor *a = em_clamp(x, &nan, NULL), *b = em_clamp(x, NULL, &nan),
              *c = em_clamp(x, &nan, &five), *d = em_clamp(x, &one, &nan),
              *e = em_clamp(x, &big, &small);
    const double wa[] = {1, 2, 3, NAN}, wc[] = {NAN, NAN, NAN, NAN}, we[] = {1.5, 1.5, 1.5, NAN};
    expect_values(a, wa, 4, exact, "single NaN min is ignored");
    expect_values(b, wa, 4, exact, "single NaN max is ignored");
    expect_values(c, wc, 4, exact, "NaN min with a max");
    expect_values(d, wc, 4, exact, "NaN max with a min");
    expect_values(e, we, 4, exact, "min > max gives max");
    const double iv[] = {1, 2, 3};
    em_tensor *xi = vec(EM_I64, 3, iv), *bo = vec(EM_BOOL, 2, (const double[]){1, 0});
    em_tensor *f = em_clamp(xi, &small, NULL), *g = em_clamp(bo, &one, NULL);
    expect_dtype(f, EM_F32, "int64 clamped to 1.5");
    expect_values(f, (const double[]){1.5, 2, 3}, 3, exact, "int64 clamped to 1.5");
    expect_dtype(g, EM_I64, "bool clamped to 1");
    expect_values(g, (const double[]){1, 1}, 2, exact, "bool clamped to 1");
    cr_expect_eq(em_clamp_(xi, &small, NULL), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "clamp_: result type float32 can't be cast to the desired "
                                  "output type int64");
    cr_expect_eq(em_clamp_(x, NULL, &small), EM_OK, "%s", em_last_error());
    expect_values(x, (const double[]){1, 1.5, 1.5, NAN}, 4, exact, "clamp_");
    cr_expect_null(em_clamp(x, NULL, NULL));
    em_assert_error(EM_ERR_INVALID, "clamp: at least one of min and max must be given");
    RELEASE(g, f, bo, xi, e, d, c, b, a, x);
}

/* ---- scalar arithmetic --------------------------------------------------------------------------- */

typedef enum sop { SADD, SSUB, SMUL, SDIV } sop;
static em_tensor *call_sop(sop op, const em_tensor *a, double v) {
    switch (op) {
    case SADD: return em_add_scalar(a, v);
    case SSUB: return em_sub_scalar(a, v);
    case SMUL: return em_mul_scalar(a, v);
    default: return em_div_scalar(a, v);
    }
}
static double ref_sop(sop op, double x, double v) {
    switch (op) {
    case SADD: return x + v;
    case SSUB: return x - v;
    case SMUL: return x * v;
    default: return x / v;
    }
}

/* The result dtype of tensor(dt) op v, by PyTorch's rule for Python numbers. */
static em_dtype sop_dtype(sop op, em_dtype dt, double v) {
    bool vint = v == trunc(v);
    em_dtype rt = em_dtype_is_floating(dt) ? dt : !vint ? EM_F32 : dt == EM_BOOL ? EM_I64 : dt;
    return op == SDIV && !em_dtype_is_floating(rt) ? EM_F32 : rt;
}

Test(math_scalar, every_dtype_layout_and_kind_of_number) {
    enum { R = 3, C = 6 };
    const double numbers[] = {3, -2, 2.5, 0.1};
    for (int op = SADD; op <= SDIV; op++)
        for (int d = 0; d < LEN(em_test_all_dtypes); d++)
            for (int k = 0; k < LEN(numbers); k++)
                for (int l = 0; l < N_LAYOUTS; l++) {
                    em_dtype dt = em_test_all_dtypes[d];
                    double v = numbers[k], in[R * C], want[R * C];
                    em_dtype rt = sop_dtype(op, dt, v);
                    for (int i = 0; i < R * C; i++) {
                        in[i] = em_test_round_to(dt, spread(l == EXPANDED ? i % C : i, -4, 4));
                        /* f16/bf16 compute in float with the number rounded to float once */
                        double vv = rt == EM_F16 || rt == EM_BF16 || rt == EM_F32 ? (float)v : v;
                        double r = ref_sop(op, in[i], vv);
                        want[i] = em_test_round_to(rt, rt == EM_F16 || rt == EM_BF16 ? (float)r : r);
                    }
                    em_tensor *x = logical(dt, l, R, C, in), *y = call_sop(op, x, v);
                    char what[96];
                    snprintf(what, sizeof what, "op %d %s %s %g", op, em_dtype_name(dt),
                             layout_names[l], v);
                    expect_dtype(y, rt, what);
                    tol t = tol_of(rt);
                    if (rt == EM_F32) t = (tol){1.5e-7, 0}; /* one rounding */
                    expect_values(y, want, R * C, t, what);
                    RELEASE(y, x);
                }
}

Test(math_scalar, pytorch_examples) {
    em_tensor *u = vec(EM_U8, 2, (const double[]){1, 200});
    em_tensor *a = em_mul_scalar(u, -1), *b = em_add_scalar(u, 100);
    expect_values(a, (const double[]){255, 56}, 2, exact, "uint8 * -1 wraps");
    expect_values(b, (const double[]){101, 44}, 2, exact, "uint8 + 100 wraps");
    em_tensor *h = vec(EM_F16, 1, (const double[]){1}), *c = em_mul_scalar(h, 0.1);
    expect_dtype(c, EM_F16, "f16 * 0.1");
    expect_values(c, (const double[]){em_test_round_to(EM_F16, 0.1)}, 1, exact, "f16 * 0.1");
    em_tensor *i = vec(EM_I32, 1, (const double[]){5}), *d = em_mul_scalar(i, 0x1p40);
    expect_dtype(d, EM_I32, "int32 * 2^40");
    expect_values(d, (const double[]){0}, 1, exact, "int32 * 2^40 wraps to 0");
    em_tensor *e = em_div_scalar(i, 2);
    expect_dtype(e, EM_F32, "int32 / 2");
    expect_values(e, (const double[]){2.5}, 1, exact, "int32 / 2");
    RELEASE(e, d, i, c, h, b, a, u);
}

Test(math_scalar, in_place) {
    em_tensor *f = vec(EM_F32, 3, (const double[]){1, 2, 3});
    em_tensor *base = em_test_tensor(EM_F64, 2, (const int64_t[]){2, 2},
                                     (const double[]){1, 2, 3, 4});
    em_tensor *t = em_transpose(base, 0, 1);
    em_tensor_release(base);
    cr_expect_eq(em_add_scalar_(f, 0.5), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_mul_scalar_(f, 2), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_sub_scalar_(f, 1), EM_OK, "%s", em_last_error());
    cr_expect_eq(em_div_scalar_(f, 4), EM_OK, "%s", em_last_error());
    expect_values(f, (const double[]){0.5, 1, 1.5}, 3, exact, "f32 in place");
    cr_expect_eq(em_mul_scalar_(t, -1), EM_OK, "%s", em_last_error());
    expect_values(t, (const double[]){-1, -3, -2, -4}, 4, exact, "transposed f64 in place");
    em_tensor *i = vec(EM_I64, 2, (const double[]){1, 2}), *b = vec(EM_BOOL, 1, (const double[]){1});
    cr_expect_eq(em_add_scalar_(i, 2.5), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "add_scalar_: result type float32 can't be cast to the "
                                  "desired output type int64");
    cr_expect_eq(em_add_scalar_(b, 1), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "result type int64 can't be cast to the desired output type "
                                  "bool");
    cr_expect_eq(em_div_scalar_(i, 1), EM_ERR_DTYPE);
    em_assert_error(EM_ERR_DTYPE, "div_scalar_: result type float32");
    cr_expect_eq(em_mul_scalar_(i, 3), EM_OK, "%s", em_last_error());
    expect_values(i, (const double[]){3, 6}, 2, exact, "int64 *= 3");
    RELEASE(b, i, t, f);
}

Test(math_scalar, pow_scalar) {
    const double exps[] = {2, 3, 0.5, -0.5, -1, -2, 1.7, 0, 1};
    for (int d = 0; d < LEN(float_dtypes); d++)
        for (int k = 0; k < LEN(exps); k++)
            for (int l = 0; l < 2; l++) {
                em_dtype dt = float_dtypes[d];
                double in[12], want[12];
                for (int i = 0; i < 12; i++) {
                    in[i] = em_test_round_to(dt, spread(i, 0.25, 4));
                    want[i] = em_test_round_to(dt, pow(in[i], exps[k]));
                }
                em_tensor *x = logical(dt, l ? TRANSPOSED : CONTIG, 3, 4, in);
                em_tensor *y = em_pow_scalar(x, exps[k]);
                char what[64];
                snprintf(what, sizeof what, "pow_scalar %s %g", em_dtype_name(dt), exps[k]);
                expect_dtype(y, dt, what);
                expect_values(y, want, 12, tol_of(dt), what);
                RELEASE(y, x);
            }
    /* sqrt semantics for 0.5: pow(-0, 0.5) = -0, pow(-inf, 0.5) = NaN */
    em_tensor *s = vec(EM_F32, 2, (const double[]){-0.0, -INFINITY}), *r = em_pow_scalar(s, 0.5);
    double *g = em_test_values(r);
    cr_expect(g[0] == 0 && signbit(g[0]) && isnan(g[1]), "pow(-0, 0.5) = %g, pow(-inf, 0.5) = %g",
              g[0], g[1]);
    free(g);
    em_tensor *i = vec(EM_I32, 4, (const double[]){2, -3, 0, 7});
    em_tensor *i2 = em_pow_scalar(i, 3), *i3 = em_pow_scalar(i, 2.5);
    expect_dtype(i2, EM_I32, "int32 ** 3");
    expect_values(i2, (const double[]){8, -27, 0, 343}, 4, exact, "int32 ** 3");
    expect_dtype(i3, EM_F32, "int32 ** 2.5");
    expect_values(i3, (const double[]){(float)pow(2, 2.5), NAN, 0, (float)pow(7, 2.5)}, 4,
                  tol_of(EM_F32), "int32 ** 2.5");
    cr_expect_null(em_pow_scalar(i, -1));
    em_assert_error(EM_ERR_INVALID, "integers to negative integer powers are not allowed");
    RELEASE(i3, i2, i, r, s);
}

/* ---- binary: pow, maximum, minimum ---------------------------------------------------------------- */

typedef enum bop { BPOW, BMAX, BMIN } bop;
static em_tensor *call_bop(bop op, const em_tensor *a, const em_tensor *b) {
    return op == BPOW ? em_pow(a, b) : op == BMAX ? em_maximum(a, b) : em_minimum(a, b);
}
static double ipow_ref(double b, double e) {
    if (e < 0) return b == 1 ? 1 : b == -1 ? (fmod(e, 2) != 0 ? -1 : 1) : 0;
    return pow(b, e);
}
static double ref_bop(bop op, em_dtype dt, double x, double y) {
    if (op == BMAX) return isnan(x) || isnan(y) ? NAN : fmax(x, y);
    if (op == BMIN) return isnan(x) || isnan(y) ? NAN : fmin(x, y);
    return em_dtype_is_floating(dt) ? pow(x, y) : ipow_ref(x, y);
}

static const layout pairs[][2] = {{CONTIG, CONTIG},   {TRANSPOSED, CONTIG}, {CONTIG, SLICED},
                                  {SLICED, TRANSPOSED}, {EXPANDED, CONTIG}, {CONTIG, EXPANDED}};

Test(math_binary, every_dtype_and_layout) {
    enum { R = 3, C = 5 };
    for (int op = BPOW; op <= BMIN; op++)
        for (int d = 0; d < LEN(em_test_all_dtypes); d++)
            for (int p = 0; p < LEN(pairs); p++) {
                em_dtype dt = em_test_all_dtypes[d];
                if (op == BPOW && dt == EM_BOOL) continue;
                double A[R * C], B[R * C], want[R * C];
                for (int i = 0; i < R * C; i++) {
                    int ia = pairs[p][0] == EXPANDED ? i % C : i;
                    int ib = pairs[p][1] == EXPANDED ? i % C : i;
                    bool fl = em_dtype_is_floating(dt);
                    A[i] = em_test_round_to(dt, op == BPOW ? (fl ? spread(ia, 0.5, 3) : spread(ia, -3, 4))
                                                   : spread(ia, -4, 4));
                    B[i] = em_test_round_to(dt, op == BPOW ? (fl ? spread(ib, -2, 3)
                                                     : dt == EM_U8 ? spread(ib, 0, 3)
                                                                   : spread(ib, -2, 3))
                                                   : spread(ib + 7, -4, 4));
                    want[i] = em_test_round_to(dt, ref_bop(op, dt, A[i], B[i]));
                }
                em_tensor *a = logical(dt, pairs[p][0], R, C, A);
                em_tensor *b = logical(dt, pairs[p][1], R, C, B);
                em_tensor *y = call_bop(op, a, b);
                char what[96];
                snprintf(what, sizeof what, "bop %d %s %s x %s", op, em_dtype_name(dt),
                         layout_names[pairs[p][0]], layout_names[pairs[p][1]]);
                expect_dtype(y, dt, what);
                expect_values(y, want, R * C, op == BPOW ? tol_of(dt) : exact, what);
                RELEASE(y, b, a);
            }
}

Test(math_binary, nan_broadcasting_promotion_and_errors) {
    em_tensor *a = em_test_tensor(EM_F32, 2, (const int64_t[]){3, 1},
                                  (const double[]){1, NAN, -2});
    em_tensor *b = vec(EM_I64, 4, (const double[]){0, 5, -3, 1});
    em_tensor *mx = em_maximum(a, b), *mn = em_minimum(b, a), *pw = em_pow(b, a);
    double wmx[12], wmn[12], wpw[12];
    const double A[3] = {1, NAN, -2}, B[4] = {0, 5, -3, 1};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            wmx[i * 4 + j] = ref_bop(BMAX, EM_F32, A[i], B[j]);
            wmn[i * 4 + j] = ref_bop(BMIN, EM_F32, B[j], A[i]);
            wpw[i * 4 + j] = (float)pow(B[j], A[i]);
        }
    em_test_expect_shape(mx, 2, (const int64_t[]){3, 4}, "maximum [3, 1] [4]");
    expect_dtype(mx, EM_F32, "maximum float32, int64");
    expect_values(mx, wmx, 12, exact, "maximum with NaN and broadcasting");
    expect_values(mn, wmn, 12, exact, "minimum with NaN and broadcasting");
    expect_values(pw, wpw, 12, tol_of(EM_F32), "pow int64 ** float32");
    em_tensor *c = em_zeros(1, (const int64_t[]){3}, EM_F32, em_cpu());
    cr_expect_null(em_maximum(b, c));
    em_assert_error(EM_ERR_SHAPE, "maximum: shapes [4] and [3] cannot be broadcast");
    em_tensor *t = em_ones(1, (const int64_t[]){2}, EM_BOOL, em_cpu());
    cr_expect_null(em_pow(t, t));
    em_assert_error(EM_ERR_DTYPE, "pow: not supported for two bool tensors");
    em_tensor *e = em_zeros(2, (const int64_t[]){0, 4}, EM_F64, em_cpu()), *pe = em_pow(e, b);
    em_test_expect_shape(pe, 2, (const int64_t[]){0, 4}, "pow of [0, 4] and [4]");
    RELEASE(pe, e, t, c, pw, mn, mx, b, a);
}

/* ---- comparisons, logical ops, where ---------------------------------------------------------------- */

typedef enum cop { EQ, NE, LT, LE, GT, GE, LAND, LOR, LXOR } cop;
static em_tensor *call_cop(cop op, const em_tensor *a, const em_tensor *b) {
    switch (op) {
    case EQ: return em_eq(a, b);
    case NE: return em_ne(a, b);
    case LT: return em_lt(a, b);
    case LE: return em_le(a, b);
    case GT: return em_gt(a, b);
    case GE: return em_ge(a, b);
    case LAND: return em_logical_and(a, b);
    case LOR: return em_logical_or(a, b);
    default: return em_logical_xor(a, b);
    }
}
static double ref_cop(cop op, double x, double y) {
    switch (op) {
    case EQ: return x == y;
    case NE: return x != y;
    case LT: return x < y;
    case LE: return x <= y;
    case GT: return x > y;
    case GE: return x >= y;
    case LAND: return x != 0 && y != 0;
    case LOR: return x != 0 || y != 0;
    default: return (x != 0) != (y != 0);
    }
}

Test(math_logic, comparisons_and_logical_every_dtype_and_layout) {
    enum { R = 3, C = 6 };
    for (int op = EQ; op <= LXOR; op++)
        for (int d = 0; d < LEN(em_test_all_dtypes); d++)
            for (int p = 0; p < LEN(pairs); p++) {
                em_dtype dt = em_test_all_dtypes[d];
                double A[R * C], B[R * C], want[R * C];
                for (int i = 0; i < R * C; i++) {
                    int ia = pairs[p][0] == EXPANDED ? i % C : i;
                    int ib = pairs[p][1] == EXPANDED ? i % C : i;
                    /* few distinct values, so equality happens; NaN in floats */
                    A[i] = em_test_round_to(dt, (double)(ia % 4) - 1);
                    B[i] = em_test_round_to(dt, (double)(ib % 3) - 1);
                    if (em_dtype_is_floating(dt) && ia % 7 == 3) A[i] = NAN;
                    want[i] = ref_cop(op, A[i], B[i]);
                }
                em_tensor *a = logical(dt, pairs[p][0], R, C, A);
                em_tensor *b = logical(dt, pairs[p][1], R, C, B);
                em_tensor *y = call_cop(op, a, b);
                char what[96];
                snprintf(what, sizeof what, "cop %d %s %s x %s", op, em_dtype_name(dt),
                         layout_names[pairs[p][0]], layout_names[pairs[p][1]]);
                expect_dtype(y, EM_BOOL, what);
                expect_values(y, want, R * C, exact, what);
                RELEASE(y, b, a);
            }
}

Test(math_logic, promotion_and_mixed_dtypes) {
    em_tensor *i = vec(EM_I64, 3, (const double[]){1, 2, 3});
    em_tensor *f = vec(EM_F32, 3, (const double[]){1, 2.5, 3.5});
    em_tensor *s = em_scalar(1.5, EM_F64);
    em_tensor *eq = em_eq(i, f), *gt = em_gt(i, s);
    expect_values(eq, (const double[]){1, 0, 0}, 3, exact, "int64 == float32");
    expect_values(gt, (const double[]){0, 1, 1}, 3, exact, "int64 > 0-dim 1.5");
    /* logical ops take each element's truth: NaN is true, -0 false, tiny values true even
     * when promotion would flush them */
    em_tensor *x = vec(EM_F32, 4, (const double[]){NAN, -0.0, 1e-30, 0});
    em_tensor *t = em_scalar(1e-300, EM_F64);
    em_tensor *la = em_logical_and(x, t), *ln = em_logical_not(x);
    expect_values(la, (const double[]){1, 0, 1, 0}, 4, exact, "logical_and f32 and 0-dim f64");
    expect_dtype(ln, EM_BOOL, "logical_not");
    expect_values(ln, (const double[]){0, 1, 0, 1}, 4, exact, "logical_not f32");
    em_tensor *u = vec(EM_U8, 3, (const double[]){0, 7, 255}), *lu = em_logical_not(u);
    expect_values(lu, (const double[]){1, 0, 0}, 3, exact, "logical_not uint8");
    em_tensor *w = em_zeros(1, (const int64_t[]){2}, EM_F32, em_cpu());
    cr_expect_null(em_lt(i, w));
    em_assert_error(EM_ERR_SHAPE, "lt: shapes [3] and [2] cannot be broadcast");
    RELEASE(w, lu, u, ln, la, t, x, gt, eq, s, f, i);
}

Test(math_logic, logical_not_layouts) {
    for (int d = 0; d < LEN(em_test_all_dtypes); d++)
        for (int l = 0; l < N_LAYOUTS; l++) {
            em_dtype dt = em_test_all_dtypes[d];
            double in[12], want[12];
            for (int i = 0; i < 12; i++) {
                in[i] = em_test_round_to(dt, (double)((l == EXPANDED ? i % 4 : i) % 3) - 1);
                want[i] = in[i] == 0;
            }
            em_tensor *x = logical(dt, l, 3, 4, in), *y = em_logical_not(x);
            expect_values(y, want, 12, exact, em_dtype_name(dt));
            RELEASE(y, x);
        }
}

Test(math_logic, where_every_dtype_broadcast_and_errors) {
    enum { R = 3, C = 4 };
    for (int d = 0; d < LEN(em_test_all_dtypes); d++)
        for (int p = 0; p < LEN(pairs); p++) {
            em_dtype dt = em_test_all_dtypes[d];
            double cond[R * C], A[R * C], B[C], want[R * C];
            for (int i = 0; i < R * C; i++) {
                int ia = pairs[p][0] == EXPANDED ? i % C : i;
                int ic = pairs[p][1] == EXPANDED ? i % C : i;
                cond[i] = (ic * 5 + 1) % 3 == 0;
                A[i] = em_test_round_to(dt, spread(ia, -4, 4));
            }
            for (int j = 0; j < C; j++) B[j] = em_test_round_to(dt, spread(j + 50, -4, 4));
            for (int i = 0; i < R * C; i++) want[i] = cond[i] ? A[i] : B[i % C];
            em_tensor *c = logical(EM_BOOL, pairs[p][1], R, C, cond);
            em_tensor *a = logical(dt, pairs[p][0], R, C, A);
            em_tensor *b = vec(dt, C, B); /* [4] broadcast against [3, 4] */
            em_tensor *y = em_where(c, a, b);
            char what[96];
            snprintf(what, sizeof what, "where %s %s / %s", em_dtype_name(dt),
                     layout_names[pairs[p][0]], layout_names[pairs[p][1]]);
            em_test_expect_shape(y, 2, (const int64_t[]){R, C}, what);
            expect_dtype(y, dt, what);
            expect_values(y, want, R * C, exact, what);
            RELEASE(y, b, a, c);
        }
    em_tensor *c = em_test_tensor(EM_BOOL, 2, (const int64_t[]){2, 1}, (const double[]){1, 0});
    em_tensor *i = vec(EM_I32, 3, (const double[]){1, 2, 3});
    em_tensor *f = em_scalar(2.5, EM_F64);
    em_tensor *y = em_where(c, i, f);
    expect_dtype(y, EM_F64, "where(int32, 0-dim float64)");
    expect_values(y, (const double[]){1, 2, 3, 2.5, 2.5, 2.5}, 6, exact, "where promoted");
    em_tensor *u = vec(EM_U8, 3, (const double[]){1, 0, 1});
    cr_expect_null(em_where(u, i, i));
    em_assert_error(EM_ERR_DTYPE, "where: the condition must be a bool tensor, got uint8");
    em_tensor *z = em_zeros(1, (const int64_t[]){2}, EM_F32, em_cpu());
    cr_expect_null(em_where(c, i, z));
    em_assert_error(EM_ERR_SHAPE, "where: shapes [2, 1], [3] and [2] cannot be broadcast");
    em_tensor *e = em_zeros(2, (const int64_t[]){0, 3}, EM_I32, em_cpu()), *ye = em_where(c, e, i);
    cr_expect_null(ye);
    em_tensor *c0 = em_zeros(2, (const int64_t[]){0, 1}, EM_BOOL, em_cpu());
    em_tensor *ye0 = em_where(c0, e, i);
    em_test_expect_shape(ye0, 2, (const int64_t[]){0, 3}, "where of zero-size");
    RELEASE(ye0, c0, e, z, u, y, f, i, c);
}

/* ---- backward helpers ----------------------------------------------------------------------------- */

static double d_gelu(double x) {
    return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}
static double d_gelu_tanh(double x) {
    double k = sqrt(2 / M_PI), u = k * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}
static double d_silu(double x) {
    double s = r_sigmoid(x);
    return s * (1 + x * (1 - s));
}

typedef struct bw_case {
    const char *name;
    em_tensor *(*fn)(const em_tensor *g, const em_tensor *x);
    double (*ref)(double g, double x); /* x: the op's second input */
    double lo, hi;
} bw_case;
static em_tensor *f_thr(const em_tensor *g, const em_tensor *x) {
    return em_threshold_backward(g, x, 0.5);
}
static em_tensor *f_gelu_bw(const em_tensor *g, const em_tensor *x) {
    return em_gelu_backward(g, x, "none");
}
static em_tensor *f_gelu_tanh_bw(const em_tensor *g, const em_tensor *x) {
    return em_gelu_backward(g, x, "tanh");
}
static em_tensor *f_leaky_bw(const em_tensor *g, const em_tensor *x) {
    return em_leaky_relu_backward(g, x, 0.2);
}
static double rb_thr(double g, double x) { return x <= 0.5 ? 0 : g; }
static double rb_sig(double g, double y) { return g * (1 - y) * y; }
static double rb_tanh(double g, double y) { return g * (1 - y * y); }
static double rb_gelu(double g, double x) { return g * d_gelu(x); }
static double rb_gelu_tanh(double g, double x) { return g * d_gelu_tanh(x); }
static double rb_silu(double g, double x) { return g * d_silu(x); }
static double rb_leaky(double g, double x) { return x > 0 ? g : 0.2 * g; }
static const bw_case bw_cases[] = {
    {"threshold_backward", f_thr, rb_thr, -2, 2},
    {"sigmoid_backward", em_sigmoid_backward, rb_sig, 0, 1},
    {"tanh_backward", em_tanh_backward, rb_tanh, -1, 1},
    {"gelu_backward", f_gelu_bw, rb_gelu, -4, 4},
    {"gelu_backward(tanh)", f_gelu_tanh_bw, rb_gelu_tanh, -4, 4},
    {"silu_backward", em_silu_backward, rb_silu, -8, 8},
    {"leaky_relu_backward", f_leaky_bw, rb_leaky, -2, 2},
};

Test(math_backward, analytic_every_float_dtype_and_layout) {
    enum { R = 3, C = 7 };
    for (int k = 0; k < LEN(bw_cases); k++)
        for (int d = 0; d < LEN(float_dtypes); d++)
            for (int p = 0; p < LEN(pairs); p++) {
                const bw_case *c = &bw_cases[k];
                em_dtype dt = float_dtypes[d];
                double G[R * C], X[R * C], want[R * C];
                for (int i = 0; i < R * C; i++) {
                    G[i] = em_test_round_to(dt, spread((pairs[p][0] == EXPANDED ? i % C : i) + 3, -2, 2));
                    X[i] = em_test_round_to(dt, spread(pairs[p][1] == EXPANDED ? i % C : i, c->lo, c->hi));
                    want[i] = em_test_round_to(dt, c->ref(G[i], X[i]));
                }
                em_tensor *g = logical(dt, pairs[p][0], R, C, G);
                em_tensor *x = logical(dt, pairs[p][1], R, C, X);
                em_tensor *y = c->fn(g, x);
                char what[96];
                snprintf(what, sizeof what, "%s %s %s x %s", c->name, em_dtype_name(dt),
                         layout_names[pairs[p][0]], layout_names[pairs[p][1]]);
                expect_dtype(y, dt, what);
                tol t = tol_of(dt);
                if (dt == EM_F16) t.atol = 4e-3; /* products of three rounded factors */
                if (dt == EM_BF16) t.atol = 3e-2;
                expect_values(y, want, R * C, t, what);
                RELEASE(y, x, g);
            }
}

/* The backward ops agree with central differences of the forward ops in f64 (an independent
 * check of the analytic formulas above). */
Test(math_backward, central_differences_f64) {
    enum { N = 41 };
    const double h = 1e-6;
    double X[N], XP[N], XM[N], ones[N];
    for (int i = 0; i < N; i++) {
        X[i] = -4 + 0.2 * i + 0.01;
        XP[i] = X[i] + h;
        XM[i] = X[i] - h;
        ones[i] = 1;
    }
    em_tensor *x = vec(EM_F64, N, X), *xp = vec(EM_F64, N, XP), *xm = vec(EM_F64, N, XM);
    em_tensor *g = vec(EM_F64, N, ones), *sx = em_sigmoid(x), *tx = em_tanh(x);
    struct {
        const char *name;
        em_tensor *fp, *fm, *bw;
    } c[] = {
        {"gelu", em_gelu(xp, NULL), em_gelu(xm, NULL), em_gelu_backward(g, x, NULL)},
        {"gelu tanh", em_gelu(xp, "tanh"), em_gelu(xm, "tanh"), em_gelu_backward(g, x, "tanh")},
        {"silu", em_silu(xp), em_silu(xm), em_silu_backward(g, x)},
        {"sigmoid", em_sigmoid(xp), em_sigmoid(xm), em_sigmoid_backward(g, sx)},
        {"tanh", em_tanh(xp), em_tanh(xm), em_tanh_backward(g, tx)},
    };
    for (int k = 0; k < LEN(c); k++) {
        double *p = em_test_values(c[k].fp), *m = em_test_values(c[k].fm), want[N];
        for (int i = 0; i < N; i++) want[i] = (p[i] - m[i]) / (2 * h);
        expect_values(c[k].bw, want, N, (tol){1e-7, 1e-8}, c[k].name);
        free(p);
        free(m);
        RELEASE(c[k].bw, c[k].fm, c[k].fp);
    }
    RELEASE(tx, sx, g, xm, xp, x);
}

Test(math_backward, errors_and_broadcasting) {
    em_tensor *g = em_ones(2, (const int64_t[]){2, 3}, EM_F32, em_cpu());
    em_tensor *x = vec(EM_F64, 3, (const double[]){-1, 0, 2});
    em_tensor *y = em_threshold_backward(g, x, 0);
    expect_dtype(y, EM_F64, "threshold_backward(f32, f64)");
    expect_values(y, (const double[]){0, 0, 1, 0, 0, 1}, 6, exact, "threshold_backward");
    em_tensor *i = em_ones(1, (const int64_t[]){3}, EM_I64, em_cpu());
    cr_expect_null(em_tanh_backward(i, i));
    em_assert_error(EM_ERR_DTYPE, "tanh_backward: expected floating tensors, got int64");
    cr_expect_null(em_gelu_backward(g, g, "exact"));
    em_assert_error(EM_ERR_INVALID, "gelu_backward: approximate must be \"none\" or \"tanh\"");
    em_tensor *w = em_ones(1, (const int64_t[]){2}, EM_F32, em_cpu());
    cr_expect_null(em_silu_backward(g, w));
    em_assert_error(EM_ERR_SHAPE, "silu_backward: shapes [2, 3] and [2] cannot be broadcast");
    RELEASE(w, i, y, x, g);
}

/* ---- NumPy's ULP tables -------------------------------------------------------------------------- */

/* Distance in ulps between two floats (ordered as integers); NaN vs NaN is 0. */
static int64_t ulp_dist(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? 0 : INT64_MAX;
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    int64_t oa = ia < 0 ? (int64_t)INT32_MIN - ia : ia, ob = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return oa > ob ? oa - ob : ob - oa;
}

static void check_ulp_table(const char *func, em_tensor *(*fn)(const em_tensor *)) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/umath/umath-validation-set-%s.csv",
             EM_TEST_SRCDIR, func);
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    float *in = malloc(sizeof(float) * 4096), *want = malloc(sizeof(float) * 4096);
    int n = 0, tolu = 0;
    char line[256];
    while (fgets(line, sizeof line, f) && n < 4096) {
        unsigned xi, yi;
        int t;
        if (sscanf(line, "np.float32,%x,%x,%d", &xi, &yi, &t) != 3) continue;
        memcpy(&in[n], &xi, 4);
        memcpy(&want[n], &yi, 4);
        tolu = t;
        n++;
    }
    fclose(f);
    cr_assert_gt(n, 100, "%s: only %d rows read", path, n);
    em_tensor *x = em_from_data(in, 1, (const int64_t[]){n}, EM_F32, em_cpu());
    cr_assert(x, "%s", em_last_error());
    em_tensor *y = fn(x);
    cr_assert(y, "%s: %s", func, em_last_error());
    const float *g = em_tensor_data(y);
    int bad = 0;
    int64_t worst = 0;
    for (int i = 0; i < n; i++) {
        int64_t d = ulp_dist(g[i], want[i]);
        if (d > worst) worst = d;
        if (d > tolu && bad++ < 5)
            cr_expect(d <= tolu, "%s(%a) = %a, want %a (%lld ulp > %d)", func, in[i], g[i],
                      want[i], (long long)d, tolu);
    }
    cr_expect_eq(bad, 0, "%s: %d of %d outside %d ulp (worst %lld)", func, bad, n, tolu,
                 (long long)worst);
    RELEASE(y, x);
    free(in);
    free(want);
}

Test(math_ulp, exp) { check_ulp_table("exp", em_exp); }
Test(math_ulp, log) { check_ulp_table("log", em_log); }
Test(math_ulp, tanh) { check_ulp_table("tanh", em_tanh); }
Test(math_ulp, log1p) { check_ulp_table("log1p", em_log1p); }
Test(math_ulp, expm1) { check_ulp_table("expm1", em_expm1); }
