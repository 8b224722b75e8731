/*
 * test_ops_added.c — the ops added by the recipe of ember/ops.h (issue 14): erf, erfinv,
 * div_mode (rounding_mode "trunc" / "floor", floor_divide) and functional dropout with its
 * mask. References: PyTorch 1.13's values (tests/fixtures/added_ops.h, written by
 * tests/fixtures/gen_added_ops.py), plain loops (integer floor division, erf(erfinv(y)) = y,
 * dropout's y = x * mask / (1 - p) and its mask against em_bernoulli_'s stream), and
 * derivatives against finite differences in f64 (em_gradcheck). Typed versus by name and the
 * dtype x layout rows are the op-case table's (core/op_cases.c, test_op_schema).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fixtures/added_ops.h"

TestSuite(added, .init = em_test_setup, .fini = em_test_teardown);

/* got vs want, NaN matching NaN, infinities and zeros exact (with their sign), otherwise
 * within rel * cond[i] (cond NULL: 1) relatively. */
static void expect_values_c(const em_tensor *t, const double *want, int n, double rel,
                            const double *cond, const char *what);
static void expect_values(const em_tensor *t, const double *want, int n, double rel,
                          const char *what) {
    expect_values_c(t, want, n, rel, NULL, what);
}
static void expect_values_c(const em_tensor *t, const double *want, int n, double rel,
                            const double *cond, const char *what) {
    cr_assert_eq(em_tensor_numel(t), n, "%s: %lld elements", what, (long long)em_tensor_numel(t));
    for (int i = 0; i < n; i++) {
        double g = em_test_at(t, i), w = want[i];
        if (isnan(w)) {
            cr_expect(isnan(g), "%s[%d]: %.17g, PyTorch NaN", what, i, g);
        } else if (isinf(w) || w == 0) {
            cr_expect(g == w && signbit(g) == signbit(w), "%s[%d]: %.17g, PyTorch %.17g", what, i,
                      g, w);
        } else {
            double tol = rel * (cond ? cond[i] : 1) * fabs(w);
            cr_expect(fabs(g - w) <= tol, "%s[%d]: %.17g, PyTorch %.17g", what, i, g, w);
        }
    }
}

Test(added, erf_and_erfinv_match_pytorch) {
    em_scope_begin();
    int64_t n = ADDED_N_ERF, m = ADDED_N_ERFINV;
    em_tensor *x64 = em_test_tensor(EM_F64, 1, &n, erf_x), *y64 = em_test_tensor(EM_F64, 1, &m, erfinv_x);
    expect_values(em_erf(x64), erf_f64, (int)n, 4e-16, "erf f64");
    expect_values(em_erf(em_to_dtype(x64, EM_F32)), erf_f32, (int)n, 2.4e-7, "erf f32");
    /* erfinv near +-1 is ill-conditioned: a relative change e of y moves x by
     * e * |y / (x erf'(x))|, so both libraries' roundings are scaled by that. */
    double cond[ADDED_N_ERFINV];
    for (int i = 0; i < (int)m; i++) {
        double x = erfinv_f64[i], y = erfinv_x[i];
        cond[i] = isfinite(x) && x != 0 ? fmax(1, fabs(y / (x * 1.1283791670955126 * exp(-x * x))))
                                        : 1;
    }
    expect_values_c(em_erfinv(y64), erfinv_f64, (int)m, 1e-15, cond, "erfinv f64");
    expect_values_c(em_erfinv(em_to_dtype(y64, EM_F32)), erfinv_f32, (int)m, 4e-7, cond,
                    "erfinv f32");
    /* Integers and bools compute in float32. */
    em_tensor *b = em_test_tensor(EM_BOOL, 1, (int64_t[]){2}, (double[]){0, 1});
    em_tensor *e = em_erf(b);
    cr_assert(e);
    cr_expect_eq(em_tensor_dtype(e), EM_F32);
    cr_expect_eq(em_test_at(e, 1), (double)erff(1.0f));
    em_scope_end();
}

/* Plain loop: erf(erfinv(y)) = y over (-1, 1), in f64, on a transposed view. */
Test(added, erfinv_inverts_erf) {
    em_scope_begin();
    int64_t s[2] = {40, 25};
    double *v = malloc(sizeof(double) * 1000);
    for (int i = 0; i < 1000; i++) v[i] = -0.9995 + 1.999 * i / 999.0;
    em_tensor *y = em_transpose(em_test_tensor(EM_F64, 2, s, v), 0, 1);
    em_tensor *x = em_erfinv(y);
    cr_assert(x, "%s", em_last_error());
    double *yy = em_test_values(y), *xx = em_test_values(x);
    for (int i = 0; i < 1000; i++)
        cr_expect(fabs(erf(xx[i]) - yy[i]) <= 4e-16 + 2e-16 * fabs(yy[i]), "erf(erfinv(%.17g)) = %.17g",
                  yy[i], erf(xx[i]));
    free(v);
    free(yy);
    free(xx);
    em_scope_end();
}

Test(added, div_rounding_modes_match_pytorch) {
    em_scope_begin();
    int64_t n = ADDED_N_DIV, ni = ADDED_N_IDIV;
    em_tensor *a = em_test_tensor(EM_F64, 1, &n, div_a), *b = em_test_tensor(EM_F64, 1, &n, div_b);
    expect_values(em_div_mode(a, b, "trunc"), div_trunc_f64, (int)n, 0, "trunc f64");
    expect_values(em_div_mode(a, b, "floor"), div_floor_f64, (int)n, 0, "floor f64");
    expect_values(em_floor_divide(a, b), floor_divide_f64, (int)n, 0, "floor_divide f64");
    em_tensor *af = em_to_dtype(a, EM_F32), *bf = em_to_dtype(b, EM_F32);
    expect_values(em_div_mode(af, bf, "trunc"), div_trunc_f32, (int)n, 0, "trunc f32");
    expect_values(em_div_mode(af, bf, "floor"), div_floor_f32, (int)n, 0, "floor f32");
    em_tensor *ai = em_test_tensor(EM_I64, 1, &ni, idiv_a), *bi = em_test_tensor(EM_I64, 1, &ni, idiv_b);
    em_tensor *t = em_div_mode(ai, bi, "trunc"), *f = em_div_mode(ai, bi, "floor");
    cr_assert(t && f, "%s", em_last_error());
    cr_expect_eq(em_tensor_dtype(t), EM_I64);
    expect_values(t, idiv_trunc, (int)ni, 0, "trunc i64");
    expect_values(f, idiv_floor, (int)ni, 0, "floor i64");
    /* True division (no mode) of integers gives float32, as em_div. */
    em_tensor *q = em_div_mode(ai, bi, NULL);
    cr_assert(q);
    cr_expect_eq(em_tensor_dtype(q), EM_F32);
    em_scope_end();
}

/* Plain loops over int32 / int64 / uint8 and every sign pair, with broadcasting. */
Test(added, integer_floor_and_trunc_division) {
    em_scope_begin();
    double av[21], bv[6] = {-7, -3, -1, 1, 2, 5};
    for (int i = 0; i < 21; i++) av[i] = i - 10;
    int64_t sa[2] = {21, 1}, sb[1] = {6};
    em_dtype dts[2] = {EM_I32, EM_I64};
    for (int k = 0; k < 2; k++) {
        em_tensor *a = em_test_tensor(dts[k], 2, sa, av), *b = em_test_tensor(dts[k], 1, sb, bv);
        em_tensor *t = em_div_mode(a, b, "trunc"), *f = em_floor_divide(a, b);
        cr_assert(t && f, "%s", em_last_error());
        for (int i = 0; i < 21; i++)
            for (int j = 0; j < 6; j++) {
                double q = av[i] / bv[j];
                cr_expect_eq(em_test_at(t, i * 6 + j), trunc(q), "%g trunc/ %g", av[i], bv[j]);
                cr_expect_eq(em_test_at(f, i * 6 + j), floor(q), "%g // %g", av[i], bv[j]);
            }
    }
    em_tensor *u = em_test_tensor(EM_U8, 1, (int64_t[]){3}, (double[]){200, 7, 9});
    em_tensor *v = em_test_tensor(EM_U8, 1, (int64_t[]){3}, (double[]){7, 7, 2});
    em_tensor *uf = em_floor_divide(u, v);
    cr_assert(uf);
    cr_expect_eq(em_test_at(uf, 0), 28);
    cr_expect_eq(em_test_at(uf, 2), 4);
    /* The most negative int64 over -1 wraps (PyTorch), a zero divisor is an error. */
    em_tensor *mn = em_full(1, (int64_t[]){1}, -9223372036854775808.0, EM_I64, em_cpu());
    em_tensor *m1 = em_full(1, (int64_t[]){1}, -1, EM_I64, em_cpu());
    em_tensor *w = em_floor_divide(mn, m1);
    cr_assert(w);
    int64_t wv;
    cr_assert_eq(em_tensor_to_host(w, &wv, sizeof wv), EM_OK);
    cr_expect_eq(wv, INT64_MIN);
    cr_expect_null(em_div_mode(mn, em_zeros(1, (int64_t[]){1}, EM_I64, em_cpu()), "trunc"));
    em_assert_error(EM_ERR_INVALID, "div_mode: integer division by zero");
    cr_expect_null(em_div_mode(mn, m1, "round"));
    em_assert_error(EM_ERR_INVALID, "div_mode: rounding_mode must be \"trunc\", \"floor\" or "
                    "absent (true division), got \"round\"");
    em_scope_end();
}

static em_tensor *g_erf(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_erf(in[0]);
}
static em_tensor *g_erfinv(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_erfinv(in[0]);
}
static em_tensor *g_div_mode(em_tensor *const *in, int n, void *user) {
    (void)n;
    return em_div_mode(in[0], in[1], user);
}
/* dropout by name with a fixed (seed, offset): the same mask on every evaluation. */
static em_tensor *g_dropout(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    em_attr a[4] = {{.type = EM_ATTR_FLOAT, .v.f = 0.4}, {.type = EM_ATTR_BOOL, .v.b = true},
                    {.type = EM_ATTR_INT, .v.i = 99}, {.type = EM_ATTR_INT, .v.i = 5}};
    em_tensor *out[2] = {NULL, NULL};
    if (em_op_call(em_op_find("dropout"), (const em_tensor *const *)in, 1, a, out) != EM_OK)
        return NULL;
    return out[0];
}

static em_tensor *leaf64(int ndim, const int64_t *shape, double lo, double hi, uint64_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)n);
    em_test_fill_random(v, n, seed);
    for (int64_t i = 0; i < n; i++) v[i] = lo + (tanh(v[i] / 2) + 1) / 2 * (hi - lo); /* (lo, hi) */
    em_tensor *t = em_test_tensor(EM_F64, ndim, shape, v);
    free(v);
    cr_assert_eq(em_requires_grad_(t, true), EM_OK);
    return t;
}

Test(added, derivatives_against_finite_differences) {
    em_scope_begin();
    int64_t s[2] = {3, 4};
    em_tensor *x = leaf64(2, s, -2, 2, 1), *y = leaf64(2, s, -0.9, 0.9, 2);
    cr_assert_eq(em_gradcheck(g_erf, 1, &x, NULL, 0, 0, 0), EM_OK, "erf: %s", em_last_error());
    cr_assert_eq(em_gradcheck(g_erfinv, 1, &y, NULL, 0, 0, 0), EM_OK, "erfinv: %s",
                 em_last_error());
    /* True division through div_mode, with broadcasting. */
    em_tensor *ab[2] = {leaf64(2, s, -2, 2, 3), leaf64(1, (int64_t[]){4}, 0.5, 2, 4)};
    cr_assert_eq(em_gradcheck(g_div_mode, 2, ab, NULL, 0, 0, 0), EM_OK, "div_mode: %s",
                 em_last_error());
    /* Rounded quotients are piecewise constant: zero gradients, and finite differences agree
     * away from the jumps (quotients not within 1e-3 of an integer). */
    em_tensor *pq[2] = {leaf64(2, s, 0.1, 0.4, 5), leaf64(2, s, 1.1, 1.2, 6)};
    cr_assert_eq(em_gradcheck(g_div_mode, 2, pq, "floor", 0, 0, 0), EM_OK, "floor: %s",
                 em_last_error());
    cr_assert_eq(em_gradcheck(g_div_mode, 2, pq, "trunc", 0, 0, 0), EM_OK, "trunc: %s",
                 em_last_error());
    em_tensor *d = leaf64(2, s, -2, 2, 7);
    cr_assert_eq(em_gradcheck(g_dropout, 1, &d, NULL, 0, 0, 0), EM_OK, "dropout: %s",
                 em_last_error());
    em_scope_end();
}

/* Plain loop: y = x * mask / (1 - p), the mask is the bernoulli(1 - p) stream at the
 * generator's state (what em_bernoulli_ fills from the same state), and about 1 - p of it is
 * true. */
Test(added, dropout_returns_its_mask) {
    em_scope_begin();
    int64_t s[2] = {100, 100};
    double *v = malloc(sizeof(double) * 10000);
    em_test_fill_random(v, 10000, 8);
    em_tensor *x = em_test_tensor(EM_F32, 2, s, v);
    free(v);
    em_generator *g = em_generator_new(2024), *h = em_generator_new(2024);
    em_tensor *mask = NULL;
    double p = 0.3;
    em_tensor *y = em_dropout(x, p, true, g, &mask);
    cr_assert(y && mask, "%s", em_last_error());
    cr_expect_eq(em_tensor_dtype(mask), EM_BOOL);
    em_tensor *want_mask = em_empty(2, s, EM_BOOL, em_cpu());
    cr_assert_eq(em_bernoulli_(want_mask, 1 - p, h), EM_OK);
    cr_expect_eq(em_generator_get_state(g).offset, em_generator_get_state(h).offset,
                 "dropout draws what bernoulli_ draws");
    double *xv = em_test_values(x), *yv = em_test_values(y), *mv = em_test_values(mask),
           *wv = em_test_values(want_mask);
    int kept = 0;
    for (int i = 0; i < 10000; i++) {
        cr_expect_eq(mv[i], wv[i], "mask[%d]", i);
        kept += mv[i] != 0;
        float scale = (float)mv[i] / (float)(1 - p); /* in x's dtype, as F.dropout */
        cr_expect_eq(yv[i], (double)((float)xv[i] * scale), "y[%d]", i);
    }
    cr_expect(abs(kept - 7000) < 300, "kept %d of 10000 at p = 0.3", kept);
    /* Eval: y is x; p = 1: zeros. */
    cr_expect_eq(em_dropout(x, p, false, g, NULL), x);
    em_tensor *z = em_dropout(x, 1, true, g, &mask);
    cr_assert(z);
    cr_expect_eq(em_item(em_sum(em_abs(z), 0, NULL, false)), 0);
    cr_expect_eq(em_item(em_sum(mask, 0, NULL, false)), 0);
    cr_expect_null(em_dropout(x, -0.1, true, g, NULL));
    em_assert_error(EM_ERR_INVALID, "dropout: p must be in [0, 1], got -0.1");
    free(xv);
    free(yv);
    free(mv);
    free(wv);
    em_generator_free(g);
    em_generator_free(h);
    em_scope_end();
}
