/*
 * test_ops_reduce.c — the reductions of ember/ops.h (amax, amin, max, min, max_dim, min_dim,
 * argmax, argmin, var, std, logsumexp, norm, prod, all, any, and sum over the column layout)
 * against plain-loop references computed here in double, for every dtype each op takes, on
 * contiguous, permuted, sliced (step 2) and expanded (stride 0) inputs, over one, several,
 * negative and all dims, with and without keepdim; NaN, ties, empty tensors and the error
 * messages of bad input; large tensors whose results must not depend on the thread count.
 *
 * Tolerances (|got - want| <= atol + rtol |want|, NaN matching NaN, infinities exactly):
 *   - amax, amin, max/min values, every index, integer and bool results, prod of integers
 *     (wrapping int64, compared bit for bit), all, any: exact.
 *   - var, std, logsumexp, norm, prod of floats: the reference is computed in double and
 *     rounded once to the result dtype; rtol = atol = 1e-6 for float32, 1e-12 for float64,
 *     2^-9 for float16 and 2^-6 for bfloat16 (one ulp of the result, which the kernel's
 *     double-then-float rounding may add to the reference's half ulp).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"

TestSuite(reduce_ops, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(reduce_edge, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(reduce_big, .init = em_test_setup, .fini = em_test_teardown, .timeout = 120);


/* ---- helpers --------------------------------------------------------------------------------- */


static double tol(em_dtype dt) {
    switch (dt) {
    case EM_F32: return 1e-6;
    case EM_F64: return 1e-12;
    case EM_F16: return 0x1p-9;
    case EM_BF16: return 0x1p-6;
    default: return 0;
    }
}

/* Test value i of stream seed for dtype dt: small dyadic floats with many ties (23 distinct
 * values), small integers, or bools. */
static double gen(em_dtype dt, int64_t i, int seed) {
    int64_t k = (i * 37 + seed * 11 + 5) % 23;
    if (em_dtype_is_floating(dt)) return (double)(k - 11) * 0.25 + 0.125;
    if (dt == EM_BOOL) return k % 3 != 0;
    if (dt == EM_U8) return (double)(k * 11 % 256);
    return (double)(k - 11);
}


/* The raw int64 elements of an int64 tensor. */
static int64_t *ivalues(const em_tensor *t) {
    int64_t n = em_tensor_numel(t);
    cr_assert_eq(em_tensor_dtype(t), EM_I64);
    int64_t *v = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    em_tensor *c = em_contiguous(t);
    cr_assert(c, "%s", em_last_error());
    cr_assert_eq(em_tensor_to_host(c, v, sizeof(int64_t) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    em_tensor_release(c);
    return v;
}

static bool close_to(double g, double w, double t) {
    if (isnan(w)) return isnan(g);
    if (isinf(w)) return g == w;
    return fabs(g - w) <= t + t * fabs(w);
}

static void expect_values(const em_tensor *got, const double *want, int64_t n, double t,
                          const char *what) {
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_numel(got), n, "%s: %lld elements, want %lld", what,
                 (long long)em_tensor_numel(got), (long long)n);
    double *g = em_test_values(got);
    for (int64_t i = 0; i < n; i++)
        cr_expect(close_to(g[i], want[i], t), "%s: element %lld is %.17g, want %.17g", what,
                  (long long)i, g[i], want[i]);
    free(g);
}

static void expect_ivalues(const em_tensor *got, const int64_t *want, int64_t n,
                           const char *what) {
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_numel(got), n, "%s: numel", what);
    int64_t *g = ivalues(got);
    for (int64_t i = 0; i < n; i++)
        cr_expect_eq(g[i], want[i], "%s: element %lld is %lld, want %lld", what, (long long)i,
                     (long long)g[i], (long long)want[i]);
    free(g);
}

/* ---- the ops and their references ------------------------------------------------------------ */

typedef enum rop {
    AMAX, AMIN, MAX_DIM, MIN_DIM, ARGMAX, ARGMIN, VAR, STD, LSE, NORM, PROD, ALL, ANY, SUM, N_ROPS
} rop;
static const char *const rop_names[] = {"amax", "amin", "max_dim", "min_dim", "argmax",
                                        "argmin", "var", "std", "logsumexp", "norm", "prod",
                                        "all", "any", "sum"};

/* Whether op takes dtype dt. */
static bool takes(rop op, em_dtype dt) {
    switch (op) {
    case ARGMAX: case ARGMIN: return dt != EM_BOOL;
    case VAR: case STD: case NORM: return em_dtype_is_floating(dt);
    default: return true;
    }
}

/* Whether op reduces exactly one dim (max_dim, min_dim, argmax and argmin with a dim). */
static bool one_dim(rop op) { return op >= MAX_DIM && op <= ARGMIN; }

static em_dtype out_dtype(rop op, em_dtype dt) {
    switch (op) {
    case ARGMAX: case ARGMIN: return EM_I64;
    case LSE: return em_dtype_is_floating(dt) ? dt : EM_F32;
    case PROD: case SUM: return em_dtype_is_floating(dt) ? dt : EM_I64;
    case ALL: case ANY: return dt == EM_U8 ? EM_U8 : EM_BOOL;
    default: return dt;
    }
}

/* Parameters: correction (var, std) or p (norm). */
typedef struct rparam {
    double correction, p;
} rparam;

/* The reference of op over n values x (C order of the reduced dims): the value (in double,
 * not yet rounded), the index, and for integer sums and products the wrapped int64. */
static double ref(rop op, em_dtype dt, const double *x, int64_t n, rparam prm, int64_t *index,
                  int64_t *iv) {
    *index = 0;
    *iv = 0;
    bool ints = !em_dtype_is_floating(dt);
    switch (op) {
    case AMAX: case MAX_DIM: case ARGMAX: case AMIN: case MIN_DIM: case ARGMIN: {
        bool mx = op == AMAX || op == MAX_DIM || op == ARGMAX;
        double m = x[0];
        for (int64_t i = 1; i < n; i++) {
            if (isnan(m)) break;
            if (isnan(x[i]) || (mx ? x[i] > m : x[i] < m)) m = x[i], *index = i;
        }
        return m;
    }
    case VAR: case STD: {
        double s = 0, m2 = 0;
        for (int64_t i = 0; i < n; i++) s += x[i];
        double mean = s / (double)n;
        for (int64_t i = 0; i < n; i++) m2 += (x[i] - mean) * (x[i] - mean);
        double d = (double)n - prm.correction;
        double v = m2 / (d > 0 ? d : 0);
        return op == STD ? sqrt(v) : v;
    }
    case LSE: {
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
        double shift = isfinite(m) ? m : 0;
        for (int64_t i = 0; i < n; i++) s += exp(x[i] - shift);
        return shift + log(s);
    }
    case NORM: {
        double p = prm.p, acc = 0;
        if (isinf(p)) {
            acc = fabs(x[0]);
            for (int64_t i = 1; i < n; i++)
                if (isnan(acc) || isnan(x[i])) acc = NAN;
                else acc = (p > 0) == (fabs(x[i]) > acc) ? fabs(x[i]) : acc;
            return acc;
        }
        for (int64_t i = 0; i < n; i++)
            acc += p == 0 ? (x[i] != 0) : p == 2 ? x[i] * x[i] : pow(fabs(x[i]), p);
        return p == 0 || p == 1 ? acc : p == 2 ? sqrt(acc) : pow(acc, 1 / p);
    }
    case PROD: case SUM: {
        double v = op == PROD;
        uint64_t w = op == PROD;
        for (int64_t i = 0; i < n; i++) {
            if (op == PROD) v *= x[i], w *= (uint64_t)(int64_t)x[i];
            else v += x[i], w += (uint64_t)(int64_t)x[i];
        }
        *iv = (int64_t)w;
        return ints ? (double)(int64_t)w : v;
    }
    case ALL: case ANY: {
        bool r = op == ALL;
        for (int64_t i = 0; i < n; i++) r = op == ALL ? (r && x[i] != 0) : (r || x[i] != 0);
        return r;
    }
    default: cr_assert_fail("bad op");
    }
    return 0;
}

/* Call op on a over dims. one_dim ops take dims[0] (argmax/argmin: NULL dims = flattened). The
 * index output of max_dim/min_dim goes to *idx. */
static em_tensor *call(rop op, const em_tensor *a, int ndims, const int *dims, bool keepdim,
                       rparam prm, em_tensor **idx) {
    em_tensor *v = NULL;
    switch (op) {
    case AMAX: return em_amax(a, ndims, dims, keepdim);
    case AMIN: return em_amin(a, ndims, dims, keepdim);
    case MAX_DIM:
        return em_max_dim(a, dims[0], keepdim, &v, idx) == EM_OK ? v : NULL;
    case MIN_DIM:
        return em_min_dim(a, dims[0], keepdim, &v, idx) == EM_OK ? v : NULL;
    case ARGMAX: return em_argmax(a, ndims ? dims : NULL, keepdim);
    case ARGMIN: return em_argmin(a, ndims ? dims : NULL, keepdim);
    case VAR: return em_var(a, ndims, dims, prm.correction, keepdim);
    case STD: return em_std(a, ndims, dims, prm.correction, keepdim);
    case LSE: return em_logsumexp(a, ndims, dims, keepdim);
    case NORM: return em_norm(a, prm.p, ndims, dims, keepdim);
    case PROD: return em_prod(a, ndims, dims, keepdim);
    case ALL: return em_all(a, ndims, dims, keepdim);
    case ANY: return em_any(a, ndims, dims, keepdim);
    case SUM: return em_sum(a, ndims, dims, keepdim);
    default: return NULL;
    }
}

/* ---- a (3, 4, 17) input in four layouts ------------------------------------------------------- */

#define D0 3
#define D1 4
#define D2 17
#define NEL (D0 * D1 * D2)

typedef enum layout { CONTIG, PERMUTED, SLICED, EXPANDED, N_LAYOUTS } layout;
static const char *const layout_names[] = {"contiguous", "permuted", "sliced", "expanded"};

/* Fill L (C order of (3, 4, 17)) for layout how: for EXPANDED, L does not vary along dim 1. */
static void fill_logical(em_dtype dt, layout how, int seed, double *L) {
    for (int i = 0; i < D0; i++)
        for (int j = 0; j < D1; j++)
            for (int k = 0; k < D2; k++)
                L[(i * D1 + j) * D2 + k] =
                    gen(dt, how == EXPANDED ? i * D2 + k : (i * D1 + j) * D2 + k, seed);
}

static em_tensor *logical3(em_dtype dt, layout how, const double *L) {
    static double P[2 * NEL];
    em_tensor *phys = NULL, *t = NULL;
    switch (how) {
    case CONTIG: return em_test_tensor(dt, 3, (const int64_t[]){D0, D1, D2}, L);
    case PERMUTED: /* P(k, i, j) = L(i, j, k), viewed back as (i, j, k) */
        for (int i = 0; i < D0; i++)
            for (int j = 0; j < D1; j++)
                for (int k = 0; k < D2; k++) P[(k * D0 + i) * D1 + j] = L[(i * D1 + j) * D2 + k];
        phys = em_test_tensor(dt, 3, (const int64_t[]){D2, D0, D1}, P);
        t = em_permute(phys, 3, (const int[]){1, 2, 0});
        break;
    case SLICED:
        for (int i = 0; i < NEL; i++) P[2 * i] = L[i], P[2 * i + 1] = 99;
        phys = em_test_tensor(dt, 3, (const int64_t[]){D0, D1, 2 * D2}, P);
        t = em_slice(phys, 2, 0, 2 * D2, 2);
        break;
    case EXPANDED:
        for (int i = 0; i < D0; i++)
            for (int k = 0; k < D2; k++) P[i * D2 + k] = L[i * D1 * D2 + k];
        phys = em_test_tensor(dt, 3, (const int64_t[]){D0, 1, D2}, P);
        t = em_expand(phys, 3, (const int64_t[]){D0, D1, D2});
        break;
    default: cr_assert_fail("bad layout");
    }
    em_tensor_release(phys);
    cr_assert(t, "%s", em_last_error());
    return t;
}

typedef struct dims_case {
    int ndims;
    int dims[3];
    bool red[3];
} dims_case;

static const dims_case cases[] = {
    {1, {0}, {true, false, false}},   /* columns: last dim kept and contiguous */
    {1, {1}, {false, true, false}},   /* columns, several groups */
    {1, {-1}, {false, false, true}},  /* rows */
    {2, {0, 1}, {true, true, false}}, /* merged columns */
    {2, {2, 0}, {true, false, true}}, /* rows, two runs per output */
    {0, {0}, {true, true, true}},     /* every dim */
    {3, {1, -1, 0}, {true, true, true}},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* Check op on dtype dt, layout la, dims case c, keepdim against the reference. */
static void check(rop op, em_dtype dt, layout la, const dims_case *c, bool keepdim, rparam prm) {
    double L[NEL];
    fill_logical(dt, la, 3 + (int)op, L);
    const int64_t full[3] = {D0, D1, D2};
    /* Output shape (kept dims) and, per output, its reduced values in C order. */
    int64_t oshape[3], kshape[3], n_out = 1, n_red = 1;
    int nd = 0;
    for (int d = 0; d < 3; d++) {
        oshape[d] = c->red[d] ? 1 : full[d];
        n_out *= oshape[d];
        n_red *= c->red[d] ? full[d] : 1;
        if (!c->red[d]) kshape[nd++] = full[d];
        else if (keepdim) kshape[nd++] = 1;
    }
    em_dtype rt = out_dtype(op, dt);
    double want[NEL], x[NEL];
    int64_t widx[NEL], wint[NEL];
    for (int64_t o = 0; o < n_out; o++) {
        int64_t oi = o / (oshape[1] * oshape[2]), oj = o / oshape[2] % oshape[1], ok = o % oshape[2];
        int64_t n = 0;
        for (int i = 0; i < D0; i++)
            for (int j = 0; j < D1; j++)
                for (int k = 0; k < D2; k++)
                    if ((c->red[0] || i == oi) && (c->red[1] || j == oj) && (c->red[2] || k == ok))
                        x[n++] = L[(i * D1 + j) * D2 + k];
        cr_assert_eq(n, n_red);
        want[o] = em_test_round_to(rt, ref(op, dt, x, n, prm, &widx[o], &wint[o]));
    }
    em_tensor *a = logical3(dt, la, L), *idx = NULL;
    em_tensor *y = call(op, a, c->ndims, c->dims, keepdim, prm, &idx);
    char what[160];
    snprintf(what, sizeof what, "%s(p/correction %g/%g) %s %s over %d dims (%d, %d, %d) "
             "keepdim %d", rop_names[op], prm.p, prm.correction, em_dtype_name(dt),
             layout_names[la], c->ndims, c->dims[0], c->dims[1], c->dims[2], keepdim);
    em_test_expect_shape(y, nd, kshape, what);
    cr_expect_eq(em_tensor_dtype(y), rt, "%s: dtype %s", what, em_dtype_name(em_tensor_dtype(y)));
    if (rt == EM_I64 && (op == ARGMAX || op == ARGMIN)) expect_ivalues(y, widx, n_out, what);
    else if (rt == EM_I64 && (op == SUM || op == PROD)) expect_ivalues(y, wint, n_out, what);
    else expect_values(y, want, n_out, tol(rt), what);
    if (idx) {
        em_test_expect_shape(idx, nd, kshape, what);
        expect_ivalues(idx, widx, n_out, what);
    }
    RELEASE(idx, y, a);
}

/* Every dims case (single-dim ops: the single-dim cases), layout and keepdim. */
static void check_all(rop op, rparam prm) {
    for (int k = 0; k < EM_TEST_N_DTYPES; k++) {
        if (!takes(op, em_test_all_dtypes[k])) continue;
        for (layout la = CONTIG; la < N_LAYOUTS; la++)
            for (int c = 0; c < N_CASES; c++) {
                if (one_dim(op) && cases[c].ndims != 1 &&
                    !((op == ARGMAX || op == ARGMIN) && cases[c].ndims == 0))
                    continue;
                check(op, em_test_all_dtypes[k], la, &cases[c], false, prm);
                check(op, em_test_all_dtypes[k], la, &cases[c], true, prm);
            }
    }
}

static const rparam none = {0, 0};

Test(reduce_ops, amax_amin) { check_all(AMAX, none), check_all(AMIN, none); }
Test(reduce_ops, max_dim_min_dim) { check_all(MAX_DIM, none), check_all(MIN_DIM, none); }
Test(reduce_ops, argmax_argmin) { check_all(ARGMAX, none), check_all(ARGMIN, none); }
Test(reduce_ops, var_std) {
    const double corr[] = {0, 1, 2.5};
    for (int i = 0; i < 3; i++) {
        check_all(VAR, (rparam){corr[i], 0});
        check_all(STD, (rparam){corr[i], 0});
    }
}
Test(reduce_ops, logsumexp) { check_all(LSE, none); }
Test(reduce_ops, norm) {
    const double ps[] = {2, 1, INFINITY, -INFINITY, 0, 3, 0.5, -1};
    for (int i = 0; i < 8; i++) check_all(NORM, (rparam){0, ps[i]});
}
Test(reduce_ops, prod) { check_all(PROD, none); }
Test(reduce_ops, all_any) { check_all(ALL, none), check_all(ANY, none); }
Test(reduce_ops, sum_in_every_layout) { check_all(SUM, none); }

/* ---- NaN, ties, infinities ------------------------------------------------------------------ */

Test(reduce_edge, nan_propagates_and_first_nan_wins) {
    const double v[8] = {1, NAN, 5, NAN, -2, 5, 0, 3};
    em_dtype flt[2] = {EM_F32, EM_F64};
    for (int k = 0; k < 2; k++) {
        em_tensor *a = em_test_tensor(flt[k], 2, (const int64_t[]){2, 4}, v);
        em_tensor *mx = em_max(a), *mn = em_min(a), *am = em_amax(a, 1, (const int[]){0}, false);
        expect_values(mx, (const double[]){NAN}, 1, 0, "max with NaN");
        expect_values(mn, (const double[]){NAN}, 1, 0, "min with NaN");
        expect_values(am, (const double[]){1, NAN, 5, NAN}, 4, 0, "amax over dim 0");
        em_tensor *vals, *idx;
        cr_assert_eq(em_max_dim(a, 1, false, &vals, &idx), EM_OK, "%s", em_last_error());
        expect_values(vals, (const double[]){NAN, 5}, 2, 0, "max_dim values");
        expect_ivalues(idx, (const int64_t[]){1, 1}, 2, "max_dim: first NaN, first of tied 5s");
        em_tensor *ag = em_argmax(a, NULL, false), *ai = em_argmin(a, NULL, false);
        expect_ivalues(ag, (const int64_t[]){1}, 1, "argmax of the flattened: the first NaN");
        expect_ivalues(ai, (const int64_t[]){1}, 1, "argmin of the flattened: the first NaN");
        em_tensor *n2 = em_norm(a, INFINITY, 1, (const int[]){1}, false);
        expect_values(n2, (const double[]){NAN, 5}, 2, 0, "inf-norm with NaN");
        em_tensor *l = em_logsumexp(a, 1, (const int[]){1}, false);
        em_tensor *va = em_var(a, 1, (const int[]){1}, 1, false);
        double *lv = em_test_values(l), *vv = em_test_values(va);
        cr_expect(isnan(lv[0]) && !isnan(lv[1]), "logsumexp with NaN: %g %g", lv[0], lv[1]);
        cr_expect(isnan(vv[0]) && !isnan(vv[1]), "var with NaN: %g %g", vv[0], vv[1]);
        free(lv);
        free(vv);
        em_tensor *an = em_all(a, 0, NULL, false);
        expect_values(an, (const double[]){0}, 1, 0, "all: 0 is false, NaN true");
        RELEASE(an, va, l, n2, ai, ag, idx, vals, am, mn, mx, a);
    }
}

Test(reduce_edge, logsumexp_infinities_and_empty) {
    const double v[6] = {INFINITY, INFINITY, -INFINITY, -INFINITY, INFINITY, 1000};
    em_tensor *a = em_test_tensor(EM_F32, 2, (const int64_t[]){3, 2}, v);
    em_tensor *l = em_logsumexp(a, 1, (const int[]){1}, false);
    expect_values(l, (const double[]){INFINITY, -INFINITY, INFINITY}, 3, 0, "logsumexp inf");
    /* the same over dim 0 of a (3, 16) tensor (the column layout, updated row by row) */
    double w[48], want[16];
    for (int k = 0; k < 48; k++) w[k] = k % 16 == 0 ? (k < 32 ? INFINITY : 1)
                                       : k % 16 == 1 ? -INFINITY : (double)(k % 5);
    for (int c = 0; c < 16; c++)
        want[c] = c == 0 ? INFINITY : c == 1 ? -INFINITY
                : (float)log(exp(c % 5) + exp((16 + c) % 5) + exp((32 + c) % 5));
    em_tensor *cw = em_test_tensor(EM_F32, 2, (const int64_t[]){3, 16}, w);
    em_tensor *lc = em_logsumexp(cw, 1, (const int[]){0}, false);
    expect_values(lc, want, 16, 1e-6, "logsumexp over dim 0 with infinities");
    em_tensor_release(lc);
    em_tensor_release(cw);
    /* max-shifted: exp(1000) overflows, the result does not */
    const double big[3] = {1000, 1000, 999};
    em_tensor *b = em_test_tensor(EM_F64, 1, (const int64_t[]){3}, big);
    em_tensor *lb = em_logsumexp(b, 0, NULL, false);
    expect_values(lb, (const double[]){1000 + log(2 + exp(-1.0))}, 1, 1e-15, "logsumexp 1000");
    em_tensor *z = em_zeros(2, (const int64_t[]){0, 3}, EM_F32, em_cpu());
    em_tensor *lz = em_logsumexp(z, 1, (const int[]){0}, false);
    expect_values(lz, (const double[]){-INFINITY, -INFINITY, -INFINITY}, 3, 0, "logsumexp empty");
    /* integers compute in float32 */
    em_tensor *i = em_test_tensor(EM_I64, 1, (const int64_t[]){2}, (const double[]){1, 2});
    em_tensor *li = em_logsumexp(i, 0, NULL, false);
    cr_assert(li, "%s", em_last_error());
    cr_expect_eq(em_tensor_dtype(li), EM_F32);
    expect_values(li, (const double[]){(float)(2 + log1p(exp(-1.0)))}, 1, 1e-6, "logsumexp int");
    RELEASE(li, i, lz, z, lb, b, l, a);
}

Test(reduce_edge, var_small_counts) {
    em_tensor *one = em_test_tensor(EM_F32, 1, (const int64_t[]){1}, (const double[]){3});
    em_tensor *v1 = em_var(one, 0, NULL, 1, false), *v0 = em_var(one, 0, NULL, 0, false);
    expect_values(v1, (const double[]){NAN}, 1, 0, "var of one element, correction 1");
    expect_values(v0, (const double[]){0}, 1, 0, "var of one element, correction 0");
    em_tensor *two = em_test_tensor(EM_F64, 1, (const int64_t[]){2}, (const double[]){1, 2});
    em_tensor *v3 = em_var(two, 0, NULL, 3, false), *s3 = em_std(two, 0, NULL, 2, false);
    expect_values(v3, (const double[]){INFINITY}, 1, 0, "var with correction > N");
    expect_values(s3, (const double[]){INFINITY}, 1, 0, "std with correction == N");
    em_tensor *s0 = em_scalar(5, EM_F64), *vs = em_var(s0, 1, (const int[]){0}, 1, false);
    em_test_expect_shape(vs, 0, NULL, "var of a 0-dim tensor");
    expect_values(vs, (const double[]){NAN}, 1, 0, "var of a 0-dim tensor");
    em_tensor *z = em_zeros(1, (const int64_t[]){0}, EM_F32, em_cpu());
    em_tensor *vz = em_var(z, 0, NULL, 1, false);
    expect_values(vz, (const double[]){NAN}, 1, 0, "var of empty");
    /* a large offset does not destroy the variance */
    const double off[4] = {1e9 + 1, 1e9 + 2, 1e9 + 3, 1e9 + 4};
    em_tensor *o = em_test_tensor(EM_F64, 1, (const int64_t[]){4}, off);
    em_tensor *vo = em_var(o, 0, NULL, 1, false);
    expect_values(vo, (const double[]){5.0 / 3.0}, 1, 1e-12, "var with offset 1e9");
    RELEASE(vo, o, vz, z, vs, s0, s3, v3, two, v0, v1, one);
}

Test(reduce_edge, empty_reductions) {
    em_tensor *z = em_zeros(2, (const int64_t[]){0, 3}, EM_F32, em_cpu());
    em_tensor *p = em_prod(z, 0, NULL, false), *al = em_all(z, 0, NULL, false);
    em_tensor *an = em_any(z, 1, (const int[]){0}, true), *n2 = em_norm(z, 2, 0, NULL, false);
    expect_values(p, (const double[]){1}, 1, 0, "prod of empty");
    expect_values(al, (const double[]){1}, 1, 0, "all of empty");
    em_test_expect_shape(an, 2, (const int64_t[]){1, 3}, "any keepdim");
    expect_values(an, (const double[]){0, 0, 0}, 3, 0, "any of empty");
    expect_values(n2, (const double[]){0}, 1, 0, "norm of empty");
    /* reducing a non-empty dim of an empty tensor is fine */
    em_tensor *m1 = em_amax(z, 1, (const int[]){1}, false);
    em_test_expect_shape(m1, 1, (const int64_t[]){0}, "amax over the non-empty dim");
    em_tensor *a1 = em_argmax(z, (const int[]){1}, true);
    em_test_expect_shape(a1, 2, (const int64_t[]){0, 1}, "argmax over the non-empty dim");
    cr_expect_null(em_amax(z, 1, (const int[]){0}, false));
    em_assert_error(EM_ERR_SHAPE, "amax: expected reduction dim 0 to have non-zero size");
    cr_expect_null(em_max(z));
    em_assert_error(EM_ERR_SHAPE, "max: cannot reduce all 0 elements of an empty tensor of "
                                  "shape [0, 3]");
    em_tensor *v = (em_tensor *)1, *i = (em_tensor *)1;
    cr_expect_eq(em_max_dim(z, 0, false, &v, &i), EM_ERR_SHAPE);
    em_assert_error(EM_ERR_SHAPE, "max: expected reduction dim 0 to have non-zero size");
    cr_expect(v == NULL && i == NULL);
    cr_expect_null(em_argmin(z, NULL, false));
    em_assert_error(EM_ERR_SHAPE, "argmin: cannot reduce all 0 elements");
    cr_expect_null(em_norm(z, INFINITY, 1, (const int[]){0}, false));
    em_assert_error(EM_ERR_SHAPE, "norm (p = inf): expected reduction dim 0");
    em_tensor *zi = em_zeros(1, (const int64_t[]){0}, EM_U8, em_cpu());
    em_tensor *pi = em_prod(zi, 0, NULL, false), *ai = em_all(zi, 0, NULL, false);
    cr_expect_eq(em_tensor_dtype(pi), EM_I64);
    expect_ivalues(pi, (const int64_t[]){1}, 1, "prod of empty uint8");
    cr_expect_eq(em_tensor_dtype(ai), EM_U8, "all of uint8 is uint8, as in PyTorch");
    RELEASE(ai, pi, zi, a1, m1, n2, an, al, p, z);
}

Test(reduce_edge, zero_dim_input) {
    em_tensor *s = em_scalar(-2.5, EM_F32), *v, *i;
    cr_assert_eq(em_max_dim(s, -1, false, &v, &i), EM_OK, "%s", em_last_error());
    em_test_expect_shape(v, 0, NULL, "max_dim of 0-dim");
    expect_values(v, (const double[]){-2.5}, 1, 0, "max_dim of 0-dim");
    expect_ivalues(i, (const int64_t[]){0}, 1, "max_dim index of 0-dim");
    em_tensor *n = em_norm(s, 1, 0, NULL, true), *am = em_argmax(s, (const int[]){0}, true);
    expect_values(n, (const double[]){2.5}, 1, 0, "norm of 0-dim");
    em_test_expect_shape(am, 0, NULL, "argmax of 0-dim keepdim");
    cr_expect_null(em_amax(s, 1, (const int[]){1}, false));
    em_assert_error(EM_ERR_RANGE, "dim 1");
    RELEASE(am, n, i, v, s);
}

Test(reduce_edge, argmax_flattened_keepdim_and_ints) {
    const double v[6] = {3, 7, 7, -1, 7, 0};
    em_tensor *a = em_test_tensor(EM_I32, 2, (const int64_t[]){2, 3}, v);
    em_tensor *k = em_argmax(a, NULL, true), *f = em_argmax(a, NULL, false);
    em_test_expect_shape(k, 2, (const int64_t[]){1, 1}, "argmax flattened keepdim");
    expect_ivalues(k, (const int64_t[]){1}, 1, "argmax flattened keepdim: first 7");
    em_test_expect_shape(f, 0, NULL, "argmax flattened");
    em_tensor *am = em_amax(a, 1, (const int[]){1}, false);
    cr_expect_eq(em_tensor_dtype(am), EM_I32);
    expect_values(am, (const double[]){7, 7}, 2, 0, "amax of int32 keeps int32");
    /* int64 extremes beyond 2^53 are exact */
    int64_t big[3] = {INT64_MAX - 1, INT64_MAX, INT64_MAX - 2};
    em_tensor *b = em_from_data(big, 1, (const int64_t[]){3}, EM_I64, em_cpu());
    em_tensor *bm = em_max(b), *bi = em_argmax(b, NULL, false);
    int64_t got;
    cr_assert_eq(em_tensor_to_host(bm, &got, 8), EM_OK);
    cr_expect_eq(got, INT64_MAX);
    expect_ivalues(bi, (const int64_t[]){1}, 1, "argmax int64");
    RELEASE(bi, bm, b, am, f, k, a);
}

Test(reduce_edge, errors) {
    em_tensor *i = em_ones(2, (const int64_t[]){2, 3}, EM_I32, em_cpu());
    em_tensor *b = em_ones(1, (const int64_t[]){2}, EM_BOOL, em_cpu());
    em_tensor *f = em_ones(2, (const int64_t[]){2, 3}, EM_F32, em_cpu());
    cr_expect_null(em_var(i, 0, NULL, 1, false));
    em_assert_error(EM_ERR_DTYPE, "var: expected a floating tensor");
    cr_expect_null(em_std(b, 0, NULL, 1, false));
    em_assert_error(EM_ERR_DTYPE, "bool");
    cr_expect_null(em_norm(i, 2, 0, NULL, false));
    em_assert_error(EM_ERR_DTYPE, "norm: expected a floating tensor (float32, float64, "
                                  "float16 or bfloat16), got int32");
    cr_expect_null(em_argmax(b, NULL, false));
    em_assert_error(EM_ERR_DTYPE, "argmax: bool tensors have no order");
    cr_expect_null(em_amax(f, 1, (const int[]){2}, false));
    em_assert_error(EM_ERR_RANGE, "amax: dim 2 is out of range");
    cr_expect_null(em_prod(f, 2, (const int[]){1, -1}, false));
    em_assert_error(EM_ERR_INVALID, "prod: dim 1 appears more than once");
    cr_expect_null(em_var(f, 0, NULL, -1, false));
    em_assert_error(EM_ERR_INVALID, "var: correction must be finite and >= 0, got -1");
    cr_expect_null(em_norm(f, NAN, 0, NULL, false));
    em_assert_error(EM_ERR_INVALID, "norm: p is NaN");
    em_tensor *v = NULL;
    cr_expect_eq(em_min_dim(f, 2, false, &v, NULL), EM_ERR_RANGE);
    em_assert_error(EM_ERR_RANGE, "min: dim 2 is out of range");
    cr_expect_eq(em_max_dim(f, 0, false, NULL, NULL), EM_ERR_INVALID);
    /* NULL inputs keep the pending error */
    em_set_error(EM_ERR_IO, "earlier failure");
    cr_expect_null(em_amax(NULL, 0, NULL, false));
    cr_expect_null(em_logsumexp(NULL, 0, NULL, false));
    cr_expect_null(em_any(NULL, 0, NULL, false));
    cr_expect_eq(em_max_dim(NULL, 0, false, &v, NULL), EM_ERR_IO);
    em_assert_error(EM_ERR_IO, "earlier failure");
    RELEASE(f, b, i);
}

/* ---- large inputs: the threaded and blocked paths ------------------------------------------- */

/* A deterministic pseudo-random double in [-1, 1) (an LCG, independent of Ember's). */
static double lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) * 0x1p-52 - 1;
}

static em_tensor *random_tensor(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed,
                                double **host) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    double *x = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = em_test_round_to(dt, 4 * lcg(&seed));
    em_tensor *t = em_test_tensor(dt, ndim, shape, x);
    *host = x;
    return t;
}

/* op on x with 1 and 2 threads: bitwise identical, and equal to the reference. (N, C) x,
 * reducing dim `dim` (-1: all). */
static void check_big(rop op, em_dtype dt, int64_t N, int64_t C, int dim, rparam prm) {
    double *h;
    em_tensor *x = random_tensor(dt, 2, (const int64_t[]){N, C}, 11 + (uint64_t)op, &h);
    int nt0 = em_num_threads();
    em_tensor *y[2], *ix[2] = {NULL, NULL};
    for (int t = 0; t < 2; t++) {
        em_set_num_threads(t + 1);
        y[t] = call(op, x, dim >= 0, dim >= 0 ? &dim : NULL, false, prm, &ix[t]);
        cr_assert(y[t], "%s: %s", rop_names[op], em_last_error());
    }
    em_set_num_threads(nt0);
    char what[128];
    snprintf(what, sizeof what, "%s %s (%lld, %lld) dim %d", rop_names[op], em_dtype_name(dt),
             (long long)N, (long long)C, dim);
    int64_t n_out = em_tensor_numel(y[0]), n_red = N * C / n_out;
    double *g1 = em_test_values(y[0]), *g2 = em_test_values(y[1]);
    cr_expect(memcmp(g1, g2, sizeof(double) * (size_t)n_out) == 0 ||
              (isnan(g1[0]) && isnan(g2[0])), "%s: 1 and 2 threads differ", what);
    double *xs = malloc(sizeof(double) * (size_t)n_red);
    em_dtype rt = out_dtype(op, dt);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t r = 0; r < n_red; r++)
            xs[r] = dim == 0 ? h[r * C + o] : dim == 1 ? h[o * C + r] : h[r];
        int64_t wi, wv;
        double w = em_test_round_to(rt, ref(op, dt, xs, n_red, prm, &wi, &wv));
        if (op == ARGMAX || op == ARGMIN) cr_expect_eq((int64_t)g1[o], wi, "%s: output %lld", what, (long long)o);
        else cr_expect(close_to(g1[o], w, tol(rt)), "%s: output %lld is %.17g, want %.17g", what,
                       (long long)o, g1[o], w);
        if (ix[0]) {
            int64_t *i1 = ivalues(ix[0]);
            cr_expect_eq(i1[o], wi, "%s: index %lld", what, (long long)o);
            free(i1);
        }
        if (o > 40) break; /* the first outputs suffice; the rest are checked across threads */
    }
    free(xs);
    free(g1);
    free(g2);
    free(h);
    RELEASE(ix[0], ix[1], y[0], y[1], x);
}

Test(reduce_big, every_op_threads_and_blocks) {
    const rop ops[] = {AMAX, ARGMAX, MAX_DIM, MIN_DIM, VAR, STD, LSE, NORM, PROD, ALL, SUM};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        rparam prm = {1, ops[k] == NORM ? 2 : 0};
        if (ops[k] == PROD) { /* products of 4e4 values in [-4, 4) overflow; use short runs */
            check_big(PROD, EM_F64, 20, 14000, 0, prm); /* columns: above CPU_GRAIN_MEM */
            check_big(PROD, EM_F64, 3000, 20, 1, prm);
            continue;
        }
        /* columns (the column path splits from CPU_GRAIN_MEM = 2^18 elements on) */
        check_big(ops[k], EM_F32, 1100, 257, 0, prm);
        check_big(ops[k], EM_F32, 257, 300, 1, prm);  /* rows */
        check_big(ops[k], EM_F64, 40000, 3, 0, prm);  /* narrow columns: rows path, strided */
        if (!one_dim(ops[k]) || ops[k] == ARGMAX)
            check_big(ops[k], EM_F32, 300, 257, -1, prm); /* blocked full reduction */
    }
    check_big(NORM, EM_BF16, 200, 300, -1, (rparam){0, 1});
    check_big(LSE, EM_F16, 300, 200, 0, none);
}

/* The bias-gradient shape: sum over dim 0 of (4096, 1024) float32 is accurate; so is
 * (1027, 1300): rows past the last group of four, a second block of columns. */
Test(reduce_big, sum_dim0_columns_is_accurate) {
    const int64_t shapes[2][2] = {{4096, 1024}, {1027, 1300}};
    for (int k = 0; k < 2; k++) {
        const int64_t R = shapes[k][0], C = shapes[k][1];
        double *h;
        em_tensor *x = random_tensor(EM_F32, 2, (const int64_t[]){R, C}, 5, &h);
        em_tensor *s = em_sum(x, 1, (const int[]){0}, false);
        cr_assert(s, "%s", em_last_error());
        double *g = em_test_values(s);
        for (int64_t c = 0; c < C; c++) {
            double w = 0;
            for (int64_t r = 0; r < R; r++) w += h[r * C + c];
            cr_expect(fabs(g[c] - w) <= 1e-6 * fabs(w) + 1e-6,
                      "(%lld, %lld) column %lld: %.9g, want %.9g", (long long)R, (long long)C, (long long)c, g[c], w);
        }
        free(g);
        free(h);
        RELEASE(s, x);
    }
}

/* argmax of a long run: ties and the maximum in later blocks (16384-element blocks). */
Test(reduce_big, argmax_across_blocks) {
    int64_t n = 100000;
    double *v = calloc((size_t)n, sizeof(double));
    v[70000] = 3, v[90000] = 3, v[20000] = -1;
    em_tensor *a = em_test_tensor(EM_F32, 1, &n, v);
    em_tensor *am = em_argmax(a, NULL, false), *ai = em_argmin(a, NULL, false);
    em_tensor *mx = em_max(a);
    expect_ivalues(am, (const int64_t[]){70000}, 1, "argmax: first of two maxima");
    expect_ivalues(ai, (const int64_t[]){20000}, 1, "argmin");
    expect_values(mx, (const double[]){3}, 1, 0, "max");
    v[50000] = NAN;
    em_tensor *b = em_test_tensor(EM_F64, 1, &n, v);
    em_tensor *bm = em_argmax(b, NULL, false), *bx = em_max(b);
    expect_ivalues(bm, (const int64_t[]){50000}, 1, "argmax: the NaN");
    expect_values(bx, (const double[]){NAN}, 1, 0, "max: NaN");
    free(v);
    RELEASE(bx, bm, b, mx, ai, am, a);
}

/* A transposed or sliced input reduces to the bits of its contiguous copy: the contract
 * ember-opcheck checks bit for bit on the op-case rows, here at sizes where the order shows
 * (random values whose sums round; float64 sums split in halves past 1024 elements, var,
 * logsumexp and norm in chunks of 256 that cross the strided runs, a full reduction of more
 * than 16384 elements in blocks). Reducing dim 0 of the transposed view is left out: its
 * kept last dim is strided, which takes the rows path where the contiguous copy takes the
 * columns path (cpu_reduce.c: equal to rounding only). */
Test(reduce_big, strided_gives_the_bits_of_contiguous) {
    const rop ops[] = {SUM, VAR, STD, LSE, NORM};
    const em_dtype dts[] = {EM_F64, EM_F32};
    const int64_t shapes[][2] = {{3, 2000}, {7, 5000}, {5, 301}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
            const int64_t A = shapes[si][0], B = shapes[si][1];
            em_dtype dt = dts[di];
            double *h;
            em_tensor *x = random_tensor(dt, 2, (const int64_t[]){A, B}, 40 + si, &h);
            double *tv = malloc(sizeof(double) * (size_t)(A * B));
            double *sv = calloc((size_t)(A * (B + 3)), sizeof(double));
            for (int64_t a = 0; a < A; a++)
                for (int64_t b = 0; b < B; b++)
                    tv[b * A + a] = h[a * B + b], sv[a * (B + 3) + b + 1] = h[a * B + b];
            em_tensor *ts = em_test_tensor(dt, 2, (const int64_t[]){B, A}, tv);
            em_tensor *ss = em_test_tensor(dt, 2, (const int64_t[]){A, B + 3}, sv);
            em_tensor *views[2] = {em_transpose(ts, 0, 1), em_narrow(ss, 1, 1, B)};
            const char *vname[2] = {"transposed", "sliced"};
            for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
                for (int v = 0; v < 2; v++)
                    for (int dim = -1; dim < 2; dim++) {
                        if (v == 0 && dim == 0) continue; /* the columns path, see above */
                        rparam prm = {1, ops[k] == NORM ? 2 : 0};
                        em_tensor *yc = call(ops[k], x, dim >= 0, dim >= 0 ? &dim : NULL, false,
                                             prm, NULL);
                        em_tensor *yv = call(ops[k], views[v], dim >= 0, dim >= 0 ? &dim : NULL,
                                             false, prm, NULL);
                        cr_assert(yc && yv, "%s: %s", rop_names[ops[k]], em_last_error());
                        int64_t n = em_tensor_numel(yc);
                        double *gc = em_test_values(yc), *gv = em_test_values(yv);
                        for (int64_t o = 0; o < n; o++)
                            cr_expect(memcmp(&gc[o], &gv[o], sizeof(double)) == 0,
                                      "%s %s (%lld, %lld) dim %d, %s: output %lld is %.17g, "
                                      "%.17g on the contiguous copy", rop_names[ops[k]],
                                      em_dtype_name(dt), (long long)A, (long long)B, dim,
                                      vname[v], (long long)o, gv[o], gc[o]);
                        free(gc);
                        free(gv);
                        RELEASE(yv, yc);
                    }
            RELEASE(views[1], views[0], ss, ts, x);
            free(sv);
            free(tv);
            free(h);
        }
}
