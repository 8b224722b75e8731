/*
 * test_ops_seq.c — the ops of issue 25: scaled_dot_product_attention (its fused CPU kernel
 * and backward), conv1d, conv_transpose2d and group_norm. References: plain f64 loops written
 * here (attention with the whole score matrix materialised and an ordinary softmax; the
 * dropout mask from em_bernoulli_'s stream at the same generator state; direct convolution
 * sums; per-group statistics), derivatives against f64 finite differences (em_gradcheck) at
 * sizes that cross the kernel's row blocks (128 query rows, 64 when causal). The table rows (typed vs by
 * name, dtypes, layouts, ember-opcheck) are in core/op_cases.c.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

TestSuite(seq_ops, .init = em_test_setup, .fini = em_test_teardown);

/* A tensor of n pseudo-random values (em_test_fill_random, scaled) in dt. */
static em_tensor *rnd(em_dtype dt, int nd, const int64_t *shape, uint64_t seed, double scale) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_test_fill_random(v, n, seed);
    for (int64_t i = 0; i < n; i++) v[i] *= scale;
    em_tensor *t = em_test_tensor(dt, nd, shape, v);
    free(v);
    return t;
}

/* ---- attention: the reference ---------------------------------------------------------------- */

typedef struct att_case {
    const char *name;
    int nb;            /* batch dims (0..2) */
    int64_t bd[2];     /* their sizes */
    int64_t L, S, E, Ev;
    int mask;          /* 0 none, 1 bool, 2 float with -inf entries */
    int mnd;           /* the mask's ndim (2: (L, S); nb + 2: per batch element) */
    bool causal;
    double scale;      /* 0: the default */
    double p;          /* dropout */
} att_case;

/* The whole (B, L, S) score matrix, a softmax per row, dropout by keep (B, L, S) or NULL,
 * then the product with v. Fully masked rows give 0 and lse -inf. mask values are expanded
 * to (B, L, S): bool as 0/1, float as added values. */
static void att_ref(const att_case *c, int64_t B, const double *q, const double *k,
                    const double *v, const double *mfull, const double *keep, double *out,
                    double *lse) {
    double scale = c->scale ? c->scale : 1 / sqrt((double)c->E);
    double *s = malloc(sizeof(double) * (size_t)c->S);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < c->L; i++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < c->S; j++) {
                double d = 0;
                for (int64_t e = 0; e < c->E; e++)
                    d += q[(b * c->L + i) * c->E + e] * k[(b * c->S + j) * c->E + e];
                double m = mfull ? mfull[(b * c->L + i) * c->S + j] : 0;
                s[j] = d * scale;
                if (c->mask == 1 && m == 0) s[j] = -INFINITY;
                if (c->mask == 2) s[j] += m;
                if (c->causal && j > i) s[j] = -INFINITY;
                if (s[j] > mx) mx = s[j];
            }
            double sum = 0;
            for (int64_t j = 0; j < c->S; j++) sum += mx == -INFINITY ? 0 : exp(s[j] - mx);
            lse[b * c->L + i] = sum > 0 ? mx + log(sum) : -INFINITY;
            for (int64_t e = 0; e < c->Ev; e++) {
                double acc = 0;
                for (int64_t j = 0; j < c->S && sum > 0; j++) {
                    double pr = exp(s[j] - mx) / sum;
                    if (keep) pr = keep[(b * c->L + i) * c->S + j] ? pr / (1 - c->p) : 0;
                    acc += pr * v[(b * c->S + j) * c->Ev + e];
                }
                out[(b * c->L + i) * c->Ev + e] = acc;
            }
        }
    free(s);
}

/* The case's tensors in dt: q, k, v, the mask (its own shape, NULL when none) and the mask's
 * values expanded to (B, L, S) (malloc'ed, NULL when none). */
static void att_inputs(const att_case *c, em_dtype dt, em_tensor **t, double **mfull,
                       int64_t *B) {
    int64_t qs[4], ks[4], vs[4], ms[4];
    int nd = c->nb + 2;
    *B = 1;
    for (int d = 0; d < c->nb; d++) qs[d] = ks[d] = vs[d] = c->bd[d], *B *= c->bd[d];
    qs[nd - 2] = c->L, qs[nd - 1] = c->E;
    ks[nd - 2] = c->S, ks[nd - 1] = c->E;
    vs[nd - 2] = c->S, vs[nd - 1] = c->Ev;
    t[0] = rnd(dt, nd, qs, 11, 0.5);
    t[1] = rnd(dt, nd, ks, 12, 0.5);
    t[2] = rnd(dt, nd, vs, 13, 1);
    t[3] = NULL;
    *mfull = NULL;
    if (!c->mask) return;
    /* (L, S) or the full (..., L, S) with dim 0 broadcast (size 1) when there are batch dims. */
    int mnd = c->mnd;
    for (int d = 0; d < mnd; d++) ms[d] = d == mnd - 2 ? c->L : d == mnd - 1 ? c->S : (d == 0 ? 1 : c->bd[d]);
    int64_t mn = 1;
    for (int d = 0; d < mnd; d++) mn *= ms[d];
    double *mv = malloc(sizeof(double) * (size_t)mn);
    for (int64_t x = 0; x < mn; x++) {
        uint64_t h = (uint64_t)x * 2654435761u % 97;
        mv[x] = c->mask == 1 ? (h % 4 != 0) : (h % 7 == 0 ? -INFINITY : (double)(h % 11) * 0.1 - 0.5);
    }
    /* A row masked out entirely (row 1 of the mask). */
    for (int64_t j = 0; j < c->S; j++) mv[1 * c->S + j] = c->mask == 1 ? 0 : -INFINITY;
    t[3] = em_test_tensor(c->mask == 1 ? EM_BOOL : dt, mnd, ms, mv);
    *mfull = malloc(sizeof(double) * (size_t)(*B * c->L * c->S));
    int64_t per = c->L * c->S, inner = mnd > 2 ? mn / ms[0] : per; /* the mask's non-broadcast part */
    for (int64_t b = 0; b < *B; b++)
        for (int64_t x = 0; x < per; x++)
            (*mfull)[b * per + x] = mv[(mnd > 2 ? b % (inner / per) * per : 0) + x];
    free(mv);
}

static const att_case att_cases[] = {
    {"plain, 2 batch dims, blocks crossed", 2, {2, 3}, 150, 133, 8, 5, 0, 0, false, 0, 0},
    {"bool mask (L, S), causal, L > S", 1, {2, 0}, 80, 67, 6, 4, 1, 2, true, 0.4, 0},
    {"float mask per head, broadcast over batch", 2, {1, 2}, 33, 65, 4, 7, 2, 4, false, 0, 0},
    {"causal, L < S, dropout 0.25", 1, {3, 0}, 40, 90, 5, 3, 0, 0, true, 0, 0.25},
    {"no batch dims, bool mask, dropout 0.5", 0, {0, 0}, 35, 70, 3, 3, 1, 2, false, 0, 0.5},
};

Test(seq_ops, attention_matches_the_plain_reference) {
    const em_dtype dts[] = {EM_F64, EM_F32};
    for (size_t ci = 0; ci < sizeof att_cases / sizeof att_cases[0]; ci++)
        for (int di = 0; di < 2; di++) {
            const att_case *c = &att_cases[ci];
            cr_assert_eq(em_scope_begin(), EM_OK);
            em_tensor *t[4];
            double *mfull;
            int64_t B;
            att_inputs(c, dts[di], t, &mfull, &B);
            em_generator *g = em_generator_new(1234);
            em_rng_state st0 = em_generator_get_state(g);
            em_tensor *lse = NULL;
            em_tensor *y = em_scaled_dot_product_attention(t[0], t[1], t[2], t[3], c->p, c->causal,
                                                           c->scale ? &c->scale : NULL, g, &lse);
            cr_assert(y, "%s: %s", c->name, em_last_error());
            /* The dropout mask: em_bernoulli_(1 - p) over (B, L, S) from the same state. */
            double *keep = NULL;
            if (c->p > 0) {
                em_generator_set_state(g, st0);
                em_tensor *m = em_empty(1, (int64_t[]){B * c->L * c->S}, EM_F64, em_cpu());
                cr_assert_eq(em_bernoulli_(m, 1 - c->p, g), EM_OK);
                keep = em_test_values(m);
            }
            em_generator_free(g);
            double *q = em_test_values(t[0]), *k = em_test_values(t[1]), *v = em_test_values(t[2]);
            double *out = malloc(sizeof(double) * (size_t)(B * c->L * c->Ev)),
                   *ls = malloc(sizeof(double) * (size_t)(B * c->L));
            att_ref(c, B, q, k, v, mfull, keep, out, ls);
            char what[160];
            double tol = dts[di] == EM_F64 ? 1e-12 : 2e-5;
            snprintf(what, sizeof what, "%s (%s) out", c->name, em_dtype_name(dts[di]));
            em_test_expect_close(y, out, B * c->L * c->Ev, tol, tol, what);
            snprintf(what, sizeof what, "%s (%s) logsumexp", c->name, em_dtype_name(dts[di]));
            em_test_expect_close(lse, ls, B * c->L, tol, tol, what);
            if (c->mask) { /* row 1 is masked out entirely: zeros */
                double *yv = em_test_values(y);
                for (int64_t e = 0; e < c->Ev; e++)
                    cr_expect_eq(yv[c->Ev + e], 0.0, "%s: masked row not zero", c->name);
                free(yv);
            }
            free(q), free(k), free(v), free(out), free(ls), free(keep), free(mfull);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

/* ---- attention: gradients ---------------------------------------------------------------------- */

typedef struct att_gc {
    const att_case *c;
    em_tensor *mask;
    em_rng_state rs;
} att_gc;

static em_tensor *att_fn(em_tensor *const *in, int n, void *user) {
    (void)n;
    att_gc *u = user;
    em_generator *g = em_generator_new(0);
    em_generator_set_state(g, u->rs); /* the same dropout mask at every evaluation */
    em_tensor *y = em_scaled_dot_product_attention(in[0], in[1], in[2], u->mask, u->c->p,
                                                   u->c->causal,
                                                   u->c->scale ? &u->c->scale : NULL, g, NULL);
    em_generator_free(g);
    return y;
}

Test(seq_ops, attention_gradients_match_finite_differences) {
    /* Across row blocks (L 130: 3 causal blocks of 64, 2 of 128), with few features for the
     * element-wise differences. */
    static const att_case gc[] = {
        {"causal, bool mask with a masked row", 1, {1, 0}, 130, 66, 2, 2, 1, 2, true, 0, 0},
        {"float mask, dropout 0.3, scale 0.8", 1, {1, 0}, 130, 66, 2, 2, 2, 3, false, 0.8, 0.3},
        {"2 x 2 heads, no mask", 2, {2, 2}, 5, 7, 3, 2, 0, 0, false, 0, 0},
    };
    for (size_t ci = 0; ci < sizeof gc / sizeof gc[0]; ci++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *t[4];
        double *mfull;
        int64_t B;
        att_inputs(&gc[ci], EM_F64, t, &mfull, &B);
        free(mfull);
        for (int i = 0; i < 3; i++) cr_assert_eq(em_requires_grad_(t[i], true), EM_OK);
        att_gc u = {.c = &gc[ci], .mask = t[3], .rs = {.seed = 99, .offset = 5}};
        cr_assert_eq(em_gradcheck(att_fn, 3, t, &u, 0, 0, 0), EM_OK, "%s: %s", gc[ci].name,
                     em_last_error());
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(seq_ops, attention_masked_rows_get_zero_gradients) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t qs[2] = {3, 2}, ms[2] = {3, 4};
    em_tensor *q = rnd(EM_F64, 2, qs, 1, 1), *k = rnd(EM_F64, 2, (int64_t[]){4, 2}, 2, 1),
              *v = rnd(EM_F64, 2, (int64_t[]){4, 2}, 3, 1);
    const double mv[12] = {1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 1, 1};
    em_tensor *m = em_to_dtype(em_test_tensor(EM_F64, 2, ms, mv), EM_BOOL);
    for (int i = 0; i < 1; i++) cr_assert_eq(em_requires_grad_(q, true), EM_OK);
    em_tensor *y = em_scaled_dot_product_attention(q, k, v, m, 0, false, NULL, NULL, NULL);
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(em_backward(em_sum(y, 0, NULL, false)), EM_OK, "%s", em_last_error());
    double *g = em_test_values(em_tensor_grad(q)), *yv = em_test_values(y);
    for (int e = 0; e < 2; e++) {
        cr_expect_eq(yv[2 + e], 0.0);
        cr_expect_eq(g[2 + e], 0.0);
        cr_expect(isfinite(g[e]) && isfinite(g[4 + e]));
    }
    free(g), free(yv);
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(seq_ops, attention_errors_name_the_problem) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *q = rnd(EM_F32, 3, (int64_t[]){2, 3, 4}, 1, 1),
              *k = rnd(EM_F32, 3, (int64_t[]){2, 5, 4}, 2, 1),
              *v = rnd(EM_F32, 3, (int64_t[]){2, 5, 6}, 3, 1);
    cr_assert_null(em_scaled_dot_product_attention(q, rnd(EM_F32, 3, (int64_t[]){2, 5, 3}, 4, 1),
                                                   v, NULL, 0, false, NULL, NULL, NULL));
    em_assert_error(EM_ERR_SHAPE, "key [2, 5, 3]");
    cr_assert_null(em_scaled_dot_product_attention(q, k, em_to_dtype(v, EM_F64), NULL, 0, false,
                                                   NULL, NULL, NULL));
    em_assert_error(EM_ERR_DTYPE, "value has dtype float64");
    cr_assert_null(em_scaled_dot_product_attention(
        q, k, v, em_zeros(2, (int64_t[]){3, 5}, EM_I64, em_cpu()), 0, false, NULL, NULL, NULL));
    em_assert_error(EM_ERR_DTYPE, "attn_mask has dtype int64");
    cr_assert_null(em_scaled_dot_product_attention(q, k, v, NULL, -0.1, false, NULL, NULL, NULL));
    em_assert_error(EM_ERR_INVALID, "dropout_p must be in [0, 1]");
    /* A floating mask that requires grad gets none: backward says so. */
    em_tensor *m = rnd(EM_F32, 2, (int64_t[]){3, 5}, 5, 1);
    cr_assert_eq(em_requires_grad_(m, true), EM_OK);
    em_tensor *y = em_scaled_dot_product_attention(q, k, v, m, 0, false, NULL, NULL, NULL);
    cr_assert(y);
    cr_assert_neq(em_backward(em_sum(y, 0, NULL, false)), EM_OK);
    em_assert_error(EM_ERR_STATE, "attn_mask requires grad");
    /* By name, dropout needs the stream. */
    const em_tensor *in[4] = {q, k, v, NULL};
    em_attr a[5] = {{.type = EM_ATTR_FLOAT, .v.f = 0.5}};
    em_tensor *out[2];
    cr_assert_neq(em_op_call(em_op_find("scaled_dot_product_attention"), in, 4, a, out), EM_OK);
    em_assert_error(EM_ERR_INVALID, "'seed' and 'offset' are required");
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* ---- convolutions and group_norm ---------------------------------------------------------------- */

Test(seq_ops, conv1d_matches_direct_sums) {
    const int64_t N = 2, C = 4, L = 11, O = 6, K = 3, s = 2, p = 2, d = 2, g = 2;
    const int64_t OL = (L + 2 * p - d * (K - 1) - 1) / s + 1;
    const em_dtype dts[] = {EM_F64, EM_F32};
    for (int di = 0; di < 2; di++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *x = rnd(dts[di], 3, (int64_t[]){N, C, L}, 1, 1),
                  *w = rnd(dts[di], 3, (int64_t[]){O, C / g, K}, 2, 0.5),
                  *b = rnd(dts[di], 1, (int64_t[]){O}, 3, 1);
        em_tensor *y = em_conv1d(x, w, b, s, p, d, g);
        em_test_expect_shape(y, 3, (int64_t[]){N, O, OL}, "conv1d");
        double *xv = em_test_values(x), *wv = em_test_values(w), *bv = em_test_values(b);
        double want[2 * 6 * 6];
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++)
                for (int64_t t = 0; t < OL; t++) {
                    double acc = bv[o];
                    int64_t grp = o / (O / g);
                    for (int64_t c = 0; c < C / g; c++)
                        for (int64_t kk = 0; kk < K; kk++) {
                            int64_t pos = t * s - p + kk * d;
                            if (pos >= 0 && pos < L)
                                acc += xv[(n * C + grp * (C / g) + c) * L + pos] *
                                       wv[(o * (C / g) + c) * K + kk];
                        }
                    want[(n * O + o) * OL + t] = acc;
                }
        double tol = dts[di] == EM_F64 ? 1e-13 : 1e-5;
        em_test_expect_close(y, want, N * O * OL, tol, tol, "conv1d");
        free(xv), free(wv), free(bv);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* y[n, o, h*s - p + i*d, ...] += x[n, c, h, w] w[c, o - group, i, j]: the scatter form. */
static void convt_ref(const double *x, const double *w, const double *b, int64_t N, int64_t C,
                      int64_t H, int64_t W, int64_t Og, int64_t kh, int64_t kw, int64_t g,
                      const int64_t *s, const int64_t *p, const int64_t *d, int64_t OH,
                      int64_t OW, double *y) {
    int64_t O = Og * g, Cg = C / g;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < OH * OW; i++) y[(n * O + o) * OH * OW + i] = b ? b[o] : 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t ww = 0; ww < W; ww++)
                    for (int64_t oo = 0; oo < Og; oo++)
                        for (int64_t i = 0; i < kh; i++)
                            for (int64_t j = 0; j < kw; j++) {
                                int64_t oh = h * s[0] - p[0] + i * d[0], ow = ww * s[1] - p[1] + j * d[1];
                                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                                int64_t o = c / Cg * Og + oo;
                                y[((n * O + o) * OH + oh) * OW + ow] +=
                                    x[((n * C + c) * H + h) * W + ww] * w[((c * Og + oo) * kh + i) * kw + j];
                            }
}

Test(seq_ops, conv_transpose2d_matches_the_scatter_form) {
    const int64_t N = 2, C = 4, H = 3, W = 4, Og = 3, kh = 3, kw = 2, g = 2;
    const int64_t s[2] = {2, 3}, p[2] = {1, 0}, op[2] = {1, 2}, d[2] = {1, 2};
    const int64_t OH = (H - 1) * s[0] - 2 * p[0] + d[0] * (kh - 1) + op[0] + 1,
                  OW = (W - 1) * s[1] - 2 * p[1] + d[1] * (kw - 1) + op[1] + 1;
    const em_dtype dts[] = {EM_F64, EM_F32};
    for (int di = 0; di < 2; di++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *x = rnd(dts[di], 4, (int64_t[]){N, C, H, W}, 1, 1),
                  *w = rnd(dts[di], 4, (int64_t[]){C, Og, kh, kw}, 2, 0.5),
                  *b = rnd(dts[di], 1, (int64_t[]){Og * g}, 3, 1);
        em_tensor *y = em_conv_transpose2d(x, w, b, s, p, op, g, d);
        em_test_expect_shape(y, 4, (int64_t[]){N, Og * g, OH, OW}, "conv_transpose2d");
        double *xv = em_test_values(x), *wv = em_test_values(w), *bv = em_test_values(b);
        double *want = malloc(sizeof(double) * (size_t)(N * Og * g * OH * OW));
        convt_ref(xv, wv, bv, N, C, H, W, Og, kh, kw, g, s, p, d, OH, OW, want);
        double tol = dts[di] == EM_F64 ? 1e-13 : 1e-5;
        em_test_expect_close(y, want, N * Og * g * OH * OW, tol, tol, "conv_transpose2d");
        free(xv), free(wv), free(bv), free(want);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

static em_tensor *convt_fn(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    const int64_t s[2] = {2, 1}, p[2] = {1, 1}, op[2] = {1, 0}, d[2] = {1, 2};
    return em_conv_transpose2d(in[0], in[1], in[2], s, p, op, 2, d);
}
static em_tensor *conv1d_fn(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_conv1d(in[0], in[1], in[2], 2, 1, 2, 2);
}
static em_tensor *gn_fn(em_tensor *const *in, int n, void *user) {
    (void)n, (void)user;
    return em_group_norm(in[0], 2, in[1], in[2], 1e-5);
}

Test(seq_ops, conv_and_group_norm_gradients_match_finite_differences) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *ct[3] = {rnd(EM_F64, 4, (int64_t[]){2, 4, 3, 3}, 1, 1),
                        rnd(EM_F64, 4, (int64_t[]){4, 2, 3, 2}, 2, 0.5),
                        rnd(EM_F64, 1, (int64_t[]){4}, 3, 1)};
    em_tensor *c1[3] = {rnd(EM_F64, 3, (int64_t[]){2, 4, 9}, 4, 1),
                        rnd(EM_F64, 3, (int64_t[]){6, 2, 3}, 5, 0.5),
                        rnd(EM_F64, 1, (int64_t[]){6}, 6, 1)};
    em_tensor *gn[3] = {rnd(EM_F64, 4, (int64_t[]){2, 6, 2, 3}, 7, 1),
                        rnd(EM_F64, 1, (int64_t[]){6}, 8, 1), rnd(EM_F64, 1, (int64_t[]){6}, 9, 1)};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(em_requires_grad_(ct[i], true), EM_OK);
        cr_assert_eq(em_requires_grad_(c1[i], true), EM_OK);
        cr_assert_eq(em_requires_grad_(gn[i], true), EM_OK);
    }
    cr_assert_eq(em_gradcheck(convt_fn, 3, ct, NULL, 0, 0, 0), EM_OK, "conv_transpose2d: %s",
                 em_last_error());
    cr_assert_eq(em_gradcheck(conv1d_fn, 3, c1, NULL, 0, 0, 0), EM_OK, "conv1d: %s",
                 em_last_error());
    cr_assert_eq(em_gradcheck(gn_fn, 3, gn, NULL, 0, 0, 0), EM_OK, "group_norm: %s",
                 em_last_error());
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(seq_ops, group_norm_matches_per_group_statistics) {
    const int64_t N = 3, C = 6, HW = 5, G = 3;
    const em_dtype dts[] = {EM_F64, EM_F32};
    for (int di = 0; di < 2; di++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *x = rnd(dts[di], 3, (int64_t[]){N, C, HW}, 1, 2),
                  *w = rnd(dts[di], 1, (int64_t[]){C}, 2, 1), *b = rnd(dts[di], 1, (int64_t[]){C}, 3, 1);
        em_tensor *y = em_group_norm(x, G, w, b, 1e-5);
        double *xv = em_test_values(x), *wv = em_test_values(w), *bv = em_test_values(b);
        double want[3 * 6 * 5];
        int64_t D = C / G * HW;
        for (int64_t n = 0; n < N; n++)
            for (int64_t gi = 0; gi < G; gi++) {
                const double *xs = xv + (n * C + gi * (C / G)) * HW;
                double mean = 0, var = 0;
                for (int64_t i = 0; i < D; i++) mean += xs[i] / (double)D;
                for (int64_t i = 0; i < D; i++) var += (xs[i] - mean) * (xs[i] - mean) / (double)D;
                for (int64_t i = 0; i < D; i++) {
                    int64_t c = gi * (C / G) + i / HW;
                    want[(n * C + gi * (C / G)) * HW + i] =
                        (xs[i] - mean) / sqrt(var + 1e-5) * wv[c] + bv[c];
                }
            }
        double tol = dts[di] == EM_F64 ? 1e-12 : 2e-5;
        em_test_expect_close(y, want, N * C * HW, tol, tol, "group_norm");
        free(xv), free(wv), free(bv);
        cr_assert_null(em_group_norm(x, 4, w, b, 1e-5));
        em_assert_error(EM_ERR_INVALID, "num_groups 4 must be positive and divide the 6 channels");
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* The backward needs no atomics (one thread owns a batch entry's key and value gradients):
 * the same bits for any thread count (so do the forward's row blocks, each written by one
 * thread). L 70 is two causal row blocks. */
Test(seq_ops, attention_results_do_not_depend_on_the_thread_count) {
    const att_case c = {"float mask, causal, dropout", 2, {2, 3}, 70, 90, 8, 6, 2, 4, true, 0, 0.2};
    int saved = em_num_threads();
    double *res[2][4];
    for (int run = 0; run < 2; run++) {
        em_set_num_threads(run ? 3 : 1);
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *t[4];
        double *mfull;
        int64_t B;
        att_inputs(&c, EM_F32, t, &mfull, &B);
        free(mfull);
        for (int i = 0; i < 3; i++) cr_assert_eq(em_requires_grad_(t[i], true), EM_OK);
        em_generator *g = em_generator_new(77);
        em_tensor *y = em_scaled_dot_product_attention(t[0], t[1], t[2], t[3], c.p, c.causal, NULL,
                                                       g, NULL);
        em_generator_free(g);
        cr_assert(y, "%s", em_last_error());
        cr_assert_eq(em_backward(em_sum(em_mul(y, y), 0, NULL, false)), EM_OK, "%s",
                     em_last_error());
        res[run][0] = em_test_values(y);
        for (int i = 0; i < 3; i++) res[run][i + 1] = em_test_values(em_tensor_grad(t[i]));
        cr_assert_eq(em_scope_end(), EM_OK);
    }
    em_set_num_threads(saved);
    const int64_t n[4] = {6 * 70 * 6, 6 * 70 * 8, 6 * 90 * 8, 6 * 90 * 6};
    static const char *const what[4] = {"out", "grad query", "grad key", "grad value"};
    for (int k = 0; k < 4; k++) {
        cr_expect_eq(memcmp(res[0][k], res[1][k], sizeof(double) * (size_t)n[k]), 0,
                     "%s differs between 1 and 3 threads", what[k]);
        free(res[0][k]), free(res[1][k]);
    }
}
