/*
 * test_ops_nn_bf16.c — the nn ops in bf16 (and f16): that bf16 reaches the CPU backend's own
 * kernels (oneDNN's; max_pool2d's loop), and that the core's f32 path still serves what no
 * bf16 kernel takes (empty operands, a backend without bf16 kernels, f16).
 *
 * Reference: the f32 op on the same values — every bf16 input converted exactly to f32 —
 * so the only differences are the bf16 result's one rounding and the f32 accumulation order.
 * Tolerance for bf16 results (allclose against the f32 result r):
 *     |got - r| <= 2^-7 |r| + 2^-9 max|r|
 * (2^-9 is bf16's unit roundoff: one rounding is at most 2^-9 |r|; twice that plus an
 * absolute term for elements that cancel to near 0). f32 results of bf16 calls (the norms'
 * statistics, the grads of their weight and bias) get |got - r| <= 1e-4 |r| + 1e-5 max|r|.
 * max_pool2d compares exactly (values, indices and the backward's one rounding). f16 goes
 * through f32: |got - r| <= 2^-10 |r| + 2^-11 max|r| (f16's unit roundoff is 2^-11).
 * Autograd through a bf16 conv -> batch_norm -> relu -> max_pool -> layer_norm chain vs the
 * same chain in f32: |g - g32| <= 2^-6 |g32| + 2^-7 max|g32| (every layer rounds its output
 * and its grads to bf16 once; the errors compound over five layers).
 *
 * Whether an op ran natively: em_placement_get() counts kernel runs on the CPU; a native
 * bf16 call on contiguous inputs is one kernel run, the f32 path adds the conversions.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"
#include "tests/onednn_isa.h"

TestSuite(bf16, .init = em_test_setup, .fini = em_test_teardown);

/* ---- helpers ----------------------------------------------------------------------------------- */

/* A random contiguous tensor of dtype dt (values rounded to dt once), in the caller's scope. */
static em_tensor *rnd(em_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    em_test_fill_random(v, n, seed);
    em_tensor *t = em_test_tensor(dt, ndim, shape, v);
    free(v);
    cr_assert(t, "%s", em_last_error());
    return t;
}

/* t's values as doubles (malloc'd; *n gets the count). */
static double *host(const em_tensor *t, int64_t *n) {
    cr_assert(t, "%s", em_last_error());
    *n = em_tensor_numel(t);
    double *v = malloc(sizeof(double) * (size_t)(*n ? *n : 1));
    cr_assert_eq(em_tensor_to_host(em_to_dtype(t, EM_F64), v, sizeof(double) * (size_t)*n), EM_OK,
                 "%s", em_last_error());
    return v;
}

/* got (dtype dt, same shape as want) against want: |got - want| <= rtol |want| + amax max|want|. */
static void check_rel(const em_tensor *got, const em_tensor *want, em_dtype dt, double rtol,
                      double amax, const char *what) {
    cr_assert(got, "%s: %s", what, em_last_error());
    cr_assert(want, "%s (reference): %s", what, em_last_error());
    cr_assert_eq(em_tensor_dtype(got), dt, "%s: dtype %s, want %s", what,
                 em_dtype_name(em_tensor_dtype(got)), em_dtype_name(dt));
    cr_assert_eq(em_tensor_ndim(got), em_tensor_ndim(want), "%s: ndim", what);
    for (int i = 0; i < em_tensor_ndim(got); i++)
        cr_assert_eq(em_tensor_shape(got)[i], em_tensor_shape(want)[i], "%s: dim %d", what, i);
    int64_t n, m;
    double *g = host(got, &n), *w = host(want, &m), big = 0;
    for (int64_t i = 0; i < m; i++) big = fmax(big, fabs(w[i]));
    for (int64_t i = 0; i < n; i++) {
        bool ok = fabs(g[i] - w[i]) <= rtol * fabs(w[i]) + amax * big ||
                  (isnan(g[i]) && isnan(w[i]));
        if (!ok) {
            double gi = g[i], wi = w[i];
            free(g), free(w);
            cr_assert_fail("%s: element %lld is %.9g, want %.9g (rtol %g, atol %g)", what,
                           (long long)i, gi, wi, rtol, amax * big);
        }
    }
    free(g), free(w);
}

#define BF16_RTOL 0x1p-7
#define BF16_AMAX 0x1p-9
static void check_bf16(const em_tensor *got, const em_tensor *want, const char *what) {
    check_rel(got, want, EM_BF16, BF16_RTOL, BF16_AMAX, what);
}
static void check_stat(const em_tensor *got, const em_tensor *want, const char *what) {
    check_rel(got, want, EM_F32, 1e-4, 1e-5, what);
}

/* Bitwise equality of two tensors of the same dtype and shape (NaN payloads included). */
static void check_same(const em_tensor *a, const em_tensor *b, const char *what) {
    cr_assert(a && b, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_dtype(a), em_tensor_dtype(b), "%s: dtypes differ", what);
    cr_assert_eq(em_tensor_numel(a), em_tensor_numel(b), "%s: sizes differ", what);
    size_t nb = em_tensor_nbytes(a);
    char *x = malloc(nb ? nb : 1), *y = malloc(nb ? nb : 1);
    cr_assert_eq(em_tensor_to_host(a, x, nb), EM_OK);
    cr_assert_eq(em_tensor_to_host(b, y, nb), EM_OK);
    bool same = memcmp(x, y, nb) == 0;
    free(x), free(y);
    cr_assert(same, "%s: not bit-identical", what);
}

static em_tensor *f32(const em_tensor *t) { return em_to_dtype(t, EM_F32); }

/* Kernel runs on the CPU since the last em_placement_reset(). */
static uint64_t cpu_ops(void) {
    em_placement_stats s;
    cr_assert_eq(em_placement_get("cpu", &s), EM_OK);
    return s.ops;
}

/* Runs with the counter reset; asserts the call was one kernel run (native) and left no
 * error behind (a declined native attempt must not leave its EM_ERR_NOKERNEL message). */
#define NATIVE(what, expr)                                                                      \
    do {                                                                                        \
        em_clear_error();                                                                       \
        em_placement_reset();                                                                   \
        expr;                                                                                   \
        cr_assert_eq(cpu_ops(), 1, "%s: %llu kernel runs; a native bf16 call is one", what,     \
                     (unsigned long long)cpu_ops());                                            \
        cr_assert_eq(em_last_status(), EM_OK, "%s left an error: %s", what, em_last_error());  \
    } while (0)

/* Whether oneDNN has bf16 kernels (not reference ones) on this CPU: from avx512_core up
 * (tests/onednn_isa.h); below that bf16 takes the core's f32 path, as it does in a build
 * without oneDNN. */
#define onednn_has_bf16 onednn_has_avx512_core

/* A call oneDNN's bf16 kernel runs natively where it has one (onednn_has_bf16); elsewhere (an
 * AVX2 CPU, or a build without oneDNN: no bf16 kernel but max pooling's) it must take the
 * core's f32 path instead: more than one kernel run, no error. */
#define ONEDNN_NATIVE(what, expr)                                                               \
    do {                                                                                        \
        if (onednn_has_bf16()) {                                                                      \
            NATIVE(what, expr);                                                                 \
            break;                                                                              \
        }                                                                                       \
        em_clear_error();                                                                       \
        em_placement_reset();                                                                   \
        expr;                                                                                   \
        cr_assert_gt(cpu_ops(), 1, "%s: %llu kernel run(s) without oneDNN's bf16 kernels; "    \
                     "the f32 path converts", what, (unsigned long long)cpu_ops());             \
        cr_assert_eq(em_last_status(), EM_OK, "%s left an error: %s", what, em_last_error());  \
    } while (0)


/* ---- convolution ------------------------------------------------------------------------------- */

typedef struct conv_case {
    int64_t xs[4], ws[4], s, p, d, g;
} conv_case;

/* The CNN's two layers at a small batch, strided + grouped, dilated + depthwise. */
static const conv_case conv_cases[] = {
    {{2, 1, 28, 28}, {32, 1, 3, 3}, 1, 1, 1, 1},
    {{2, 32, 14, 14}, {64, 32, 3, 3}, 1, 1, 1, 1},
    {{2, 8, 11, 9}, {12, 4, 3, 3}, 2, 1, 1, 2},
    {{3, 6, 10, 12}, {6, 1, 3, 3}, 1, 2, 2, 6},
};

Test(bf16, conv2d_native_vs_f32) {
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
        const conv_case *c = &conv_cases[i];
        em_scope_begin();
        int64_t st[2] = {c->s, c->s}, pd[2] = {c->p, c->p}, dl[2] = {c->d, c->d};
        int64_t hw[2] = {c->xs[2], c->xs[3]}, k[2] = {c->ws[2], c->ws[3]};
        em_tensor *x = rnd(EM_BF16, 4, c->xs, 10 + i), *w = rnd(EM_BF16, 4, c->ws, 20 + i);
        em_tensor *b = rnd(EM_BF16, 1, c->ws, 30 + i), *y = NULL, *gx = NULL, *gw = NULL,
                  *gb = NULL;
        char what[96];
        snprintf(what, sizeof what, "conv case %zu forward", i);
        ONEDNN_NATIVE(what, y = em_conv2d(x, w, b, st, pd, dl, c->g));
        em_tensor *y32 = em_conv2d(f32(x), f32(w), f32(b), st, pd, dl, c->g);
        check_bf16(y, y32, what);
        em_tensor *gy = rnd(EM_BF16, 4, em_tensor_shape(y), 40 + i);
        snprintf(what, sizeof what, "conv case %zu backward_data", i);
        ONEDNN_NATIVE(what, gx = em_conv2d_backward_data(gy, w, hw, st, pd, dl, c->g));
        check_bf16(gx, em_conv2d_backward_data(f32(gy), f32(w), hw, st, pd, dl, c->g), what);
        snprintf(what, sizeof what, "conv case %zu backward_weight", i);
        ONEDNN_NATIVE(what, cr_assert_eq(em_conv2d_backward_weight(x, gy, k, st, pd, dl, c->g, &gw, &gb),
                                  EM_OK, "%s", em_last_error()));
        em_tensor *gw32, *gb32;
        cr_assert_eq(em_conv2d_backward_weight(f32(x), f32(gy), k, st, pd, dl, c->g, &gw32,
                                               &gb32), EM_OK);
        check_bf16(gw, gw32, what);
        check_bf16(gb, gb32, what);
        em_scope_end();
    }
}

/* ---- pooling ----------------------------------------------------------------------------------- */

Test(bf16, avg_pool_native_vs_f32) {
    em_scope_begin();
    int64_t xs[4] = {2, 3, 11, 13}, k[2] = {3, 3}, s[2] = {2, 2}, p[2] = {1, 1}, hw[2] = {11, 13};
    em_tensor *x = rnd(EM_BF16, 4, xs, 1), *y = NULL, *gx = NULL;
    for (int cip = 0; cip < 2; cip++) {
        ONEDNN_NATIVE("avg_pool2d", y = em_avg_pool2d(x, k, s, p, false, cip));
        check_bf16(y, em_avg_pool2d(f32(x), k, s, p, false, cip), "avg_pool2d");
        em_tensor *gy = rnd(EM_BF16, 4, em_tensor_shape(y), 2);
        ONEDNN_NATIVE("avg_pool2d_backward", gx = em_avg_pool2d_backward(gy, hw, k, s, p, false, cip));
        check_bf16(gx, em_avg_pool2d_backward(f32(gy), hw, k, s, p, false, cip),
                   "avg_pool2d_backward");
    }
    /* Adaptive pooling whose windows are a plain pooling (12 -> 4, 9 -> 3): oneDNN's. */
    int64_t as[4] = {2, 3, 12, 9}, os[2] = {4, 3}, ahw[2] = {12, 9};
    em_tensor *xa = rnd(EM_BF16, 4, as, 3), *ga = rnd(EM_BF16, 4, (int64_t[]){2, 3, 4, 3}, 4);
    ONEDNN_NATIVE("adaptive_avg_pool2d", y = em_adaptive_avg_pool2d(xa, os));
    check_bf16(y, em_adaptive_avg_pool2d(f32(xa), os), "adaptive_avg_pool2d");
    ONEDNN_NATIVE("adaptive_avg_pool2d_backward", gx = em_adaptive_avg_pool2d_backward(ga, ahw));
    check_bf16(gx, em_adaptive_avg_pool2d_backward(f32(ga), ahw), "adaptive_avg_pool2d_backward");
    /* 12 -> 5 has overlapping windows oneDNN lacks: declined, the f32 path runs, same answer. */
    em_tensor *y5 = em_adaptive_avg_pool2d(xa, (int64_t[]){5, 4});
    check_bf16(y5, em_adaptive_avg_pool2d(f32(xa), (int64_t[]){5, 4}), "adaptive 12x9 -> 5x4");
    em_scope_end();
}

/* max_pool2d in bf16 equals the f32 op on the same values exactly: same maxima, same
 * indices (NaN wins, ties keep the first), and a backward that rounds each sum once. */
Test(bf16, max_pool2d_exact) {
    static const struct {
        int64_t xs[4], k, s, p, d;
        bool ceil;
    } cs[] = {
        {{2, 3, 28, 28}, 2, 2, 0, 1, false}, /* the AVX-512 2x2 path */
        {{1, 2, 9, 70}, 2, 2, 0, 1, true},  /* masked chunks, a last row cut by ceil_mode */
        {{2, 1, 5, 33}, 2, 2, 0, 1, true},  /* a last column cut by ceil_mode */
        {{2, 2, 11, 13}, 3, 2, 1, 1, false}, /* overlapping windows, padding */
        {{1, 3, 10, 9}, 3, 1, 1, 2, true},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        em_scope_begin();
        int64_t n = cs[i].xs[0] * cs[i].xs[1] * cs[i].xs[2] * cs[i].xs[3];
        double *v = malloc(sizeof(double) * (size_t)n);
        em_test_fill_random(v, n, 60 + i);
        for (int64_t j = 0; j < n; j++) {
            v[j] = floor(v[j] * 2) / 2; /* ties */
            if (j % 37 == 5 || j % 41 == 6) v[j] = NAN;
            if (j % 43 == 7) v[j] = -INFINITY;
        }
        em_tensor *x = em_test_tensor(EM_BF16, 4, cs[i].xs, v);
        free(v);
        int64_t k[2] = {cs[i].k, cs[i].k}, s[2] = {cs[i].s, cs[i].s}, p[2] = {cs[i].p, cs[i].p},
                d[2] = {cs[i].d, cs[i].d};
        em_tensor *y = NULL, *idx = NULL, *y32, *idx32, *gx = NULL;
        char what[64];
        snprintf(what, sizeof what, "max_pool2d case %zu", i);
        NATIVE(what, cr_assert_eq(em_max_pool2d(x, k, s, p, d, cs[i].ceil, &y, &idx), EM_OK, "%s",
                                  em_last_error()));
        cr_assert_eq(em_max_pool2d(f32(x), k, s, p, d, cs[i].ceil, &y32, &idx32), EM_OK);
        cr_assert_eq(em_tensor_dtype(y), EM_BF16);
        check_same(f32(y), y32, what);
        check_same(idx, idx32, what);
        em_tensor *gy = rnd(EM_BF16, 4, em_tensor_shape(y), 70 + i);
        snprintf(what, sizeof what, "max_pool2d_backward case %zu", i);
        NATIVE(what, gx = em_max_pool2d_backward(gy, idx, cs[i].xs + 2));
        cr_assert_eq(em_tensor_dtype(gx), EM_BF16);
        check_same(gx, em_to_dtype(em_max_pool2d_backward(f32(gy), idx, cs[i].xs + 2), EM_BF16),
                   what);
        em_scope_end();
    }
}

/* max_pool2d_backward on indices made by hand over 2H x 2W planes (the AVX-512 bf16 path
 * writes gx directly while every index stays in its own 2x2 / stride 2 window): against the
 * f32 op's plain loop, rounded once, bit for bit. Plane 0 has each index at a random spot of
 * its window and gy with -0, +-inf, a signalling and a quiet NaN and a subnormal (the f32
 * sum 0 + gy makes -0 +0 and quiets the NaN); plane 1 sends two outputs to one element
 * (their sum), plane 2 an index into a neighbour's window, plane 3 its last index outside any
 * window it could have: those planes take the f32 accumulation. 6 x 20 outputs: a full
 * 16-wide step and a masked one of 4. */
Test(bf16, max_pool2d_backward_given_indices) {
    em_scope_begin();
    const int64_t OH = 6, OW = 20, H = 12, W = 40, C = 4, P = OH * OW;
    int64_t gs[4] = {1, C, OH, OW};
    uint16_t *g = malloc(sizeof(uint16_t) * (size_t)(C * P));
    int64_t *ix = malloc(sizeof(int64_t) * (size_t)(C * P));
    uint64_t r = 12345;
    for (int64_t c = 0; c < C; c++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                int64_t i = c * P + oh * OW + ow, d = (int64_t)(r >> 62);
                ix[i] = (2 * oh + d / 2) * W + 2 * ow + d % 2;
                g[i] = (uint16_t)(0x3c00u + ((r >> 20) & 0x3ffu) + ((r >> 40) & 1u) * 0x8000u);
            }
    static const uint16_t special[] = {0x8000, 0x0000, 0x7f80, 0xff80, 0x7f81, 0xffc3, 0x0003};
    for (size_t j = 0; j < sizeof special / sizeof special[0]; j++) g[3 * j + 1] = special[j];
    ix[1 * P + 5] = ix[1 * P + 4];      /* plane 1: two outputs, one element */
    ix[2 * P + 17] = ix[2 * P + 18];    /* plane 2: a neighbour's window */
    ix[3 * P + P - 1] = 0;              /* plane 3: far outside its window */
    em_tensor *gy = em_from_data(g, 4, gs, EM_BF16, em_cpu());
    em_tensor *idx = em_from_data(ix, 4, gs, EM_I64, em_cpu());
    free(g), free(ix);
    cr_assert(gy && idx, "%s", em_last_error());
    int64_t hw[2] = {H, W};
    em_tensor *gx = NULL;
    NATIVE("max_pool2d_backward given indices", gx = em_max_pool2d_backward(gy, idx, hw));
    cr_assert_eq(em_tensor_dtype(gx), EM_BF16);
    check_same(gx, em_to_dtype(em_max_pool2d_backward(f32(gy), idx, hw), EM_BF16),
               "max_pool2d_backward given indices");
    /* The signalling NaN is quieted, -0 made +0 (the f32 path's rounding of 0 + gy). */
    uint16_t *out = malloc(sizeof(uint16_t) * (size_t)(C * H * W));
    cr_assert_eq(em_tensor_to_host(gx, out, sizeof(uint16_t) * (size_t)(C * H * W)), EM_OK);
    int64_t i1 = 1, i13 = 13;
    em_tensor *ih = em_to_dtype(idx, EM_I64);
    int64_t *ib = malloc(sizeof(int64_t) * (size_t)(C * P));
    cr_assert_eq(em_tensor_to_host(ih, ib, sizeof(int64_t) * (size_t)(C * P)), EM_OK);
    cr_assert_eq(out[ib[i1]], 0x0000, "-0 gives 0x%04x", out[ib[i1]]);
    cr_assert_eq(out[ib[i13]], 0x7fc1, "a signalling NaN gives 0x%04x", out[ib[i13]]);
    free(out), free(ib);
    em_scope_end();
}

/* ---- normalisation ----------------------------------------------------------------------------- */

Test(bf16, batch_norm_native_vs_f32) {
    em_scope_begin();
    int64_t xs[4] = {4, 5, 6, 7}, cs[1] = {5};
    em_tensor *x = rnd(EM_BF16, 4, xs, 1), *gy = rnd(EM_BF16, 4, xs, 2);
    em_tensor *w = rnd(EM_F32, 1, cs, 3), *b = rnd(EM_F32, 1, cs, 4);
    for (int mode = 0; mode < 3; mode++) { /* training; training without affine; evaluation */
        bool training = mode < 2;
        const em_tensor *ww = mode == 1 ? NULL : w, *bb = mode == 1 ? NULL : b;
        em_tensor *rm = rnd(EM_F32, 1, cs, 5), *rv = em_abs(rnd(EM_F32, 1, cs, 6));
        em_tensor *rm32 = em_clone(rm), *rv32 = em_clone(rv);
        em_tensor *y, *sm, *si, *y32, *sm32, *si32, *gx, *gw, *gb, *gx32, *gw32, *gb32;
        ONEDNN_NATIVE("batch_norm", cr_assert_eq(em_batch_norm(x, ww, bb, rm, rv, training, 0.1, 1e-5,
                                                        &y, &sm, &si), EM_OK, "%s",
                                          em_last_error()));
        cr_assert_eq(em_batch_norm(f32(x), ww, bb, rm32, rv32, training, 0.1, 1e-5, &y32, &sm32,
                                   &si32), EM_OK);
        check_bf16(y, y32, "batch_norm y");
        check_stat(sm, sm32, "batch_norm save_mean");
        check_stat(si, si32, "batch_norm save_invstd");
        check_stat(rm, rm32, "batch_norm running_mean");
        check_stat(rv, rv32, "batch_norm running_var");
        ONEDNN_NATIVE("batch_norm_backward",
               cr_assert_eq(em_batch_norm_backward(gy, x, ww, sm, si, training, &gx, &gw, &gb),
                            EM_OK, "%s", em_last_error()));
        cr_assert_eq(em_batch_norm_backward(f32(gy), f32(x), ww, sm, si, training, &gx32, &gw32,
                                            &gb32), EM_OK);
        check_bf16(gx, gx32, "batch_norm_backward gx");
        check_stat(gw, gw32, "batch_norm_backward gw");
        check_stat(gb, gb32, "batch_norm_backward gb");
    }
    /* A bf16 weight is converted to f32 (S) for the kernel; its grad comes back in bf16. */
    em_tensor *wb = em_to_dtype(w, EM_BF16), *y, *sm, *si, *gx, *gw, *gb;
    cr_assert_eq(em_batch_norm(x, wb, NULL, NULL, NULL, true, 0.1, 1e-5, &y, &sm, &si), EM_OK,
                 "%s", em_last_error());
    cr_assert_eq(em_tensor_dtype(sm), EM_F32);
    cr_assert_eq(em_batch_norm_backward(gy, x, wb, sm, si, true, &gx, &gw, &gb), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_tensor_dtype(gw), EM_BF16);
    em_scope_end();
}

Test(bf16, layer_norm_native_vs_f32) {
    em_scope_begin();
    int64_t xs[3] = {6, 10, 12};
    em_tensor *x = rnd(EM_BF16, 3, xs, 1), *gy = rnd(EM_BF16, 3, xs, 2);
    for (int k = 1; k <= 2; k++)
        for (int affine = 0; affine < 2; affine++) {
            const int64_t *ns = xs + 3 - k;
            em_tensor *w = affine ? rnd(EM_F32, k, ns, 3) : NULL, *b = affine ? rnd(EM_F32, k, ns, 4) : NULL;
            em_tensor *y, *mean, *rstd, *y32, *mean32, *rstd32, *gx, *gw, *gb, *gx32, *gw32, *gb32;
            ONEDNN_NATIVE("layer_norm", cr_assert_eq(em_layer_norm(x, k, ns, w, b, 1e-5, &y, &mean, &rstd),
                                              EM_OK, "%s", em_last_error()));
            cr_assert_eq(em_layer_norm(f32(x), k, ns, w, b, 1e-5, &y32, &mean32, &rstd32), EM_OK);
            check_bf16(y, y32, "layer_norm y");
            check_stat(mean, mean32, "layer_norm mean");
            check_stat(rstd, rstd32, "layer_norm rstd");
            ONEDNN_NATIVE("layer_norm_backward",
                   cr_assert_eq(em_layer_norm_backward(gy, x, mean, rstd, w, k, &gx, &gw, &gb),
                                EM_OK, "%s", em_last_error()));
            cr_assert_eq(em_layer_norm_backward(f32(gy), f32(x), mean, rstd, w, k, &gx32, &gw32,
                                                &gb32), EM_OK);
            check_bf16(gx, gx32, "layer_norm_backward gx");
            check_stat(gw, gw32, "layer_norm_backward gw");
            check_stat(gb, gb32, "layer_norm_backward gb");
        }
    em_scope_end();
}

/* ---- softmax ----------------------------------------------------------------------------------- */

/* Along the last dim oneDNN has a JIT bf16 softmax; along an inner dim (dim 1 of (4, 50, 3))
 * only its reference loops, which the bf16 kernel declines: that call takes the f32 path. */
#define MAYBE_NATIVE(native, what, expr) \
    do {                                 \
        if (native) ONEDNN_NATIVE(what, expr);  \
        else expr;                       \
    } while (0)

Test(bf16, softmax_native_vs_f32) {
    em_scope_begin();
    int64_t xs[3] = {4, 50, 3};
    em_tensor *x = rnd(EM_BF16, 3, xs, 1), *gy = rnd(EM_BF16, 3, xs, 2);
    em_tensor *x2 = rnd(EM_BF16, 2, (int64_t[]){64, 10}, 3), *gy2 = rnd(EM_BF16, 2, (int64_t[]){64, 10}, 4);
    for (int c = 0; c < 3; c++) {
        em_tensor *in = c < 2 ? x : x2, *g = c < 2 ? gy : gy2, *y = NULL, *ly = NULL, *r = NULL;
        int dim = c == 0 ? 1 : c == 1 ? 2 : 1;
        bool native = c > 0;
        MAYBE_NATIVE(native, "softmax", y = em_softmax(in, dim));
        check_bf16(y, em_softmax(f32(in), dim), "softmax");
        MAYBE_NATIVE(native, "log_softmax", ly = em_log_softmax(in, dim));
        check_bf16(ly, em_log_softmax(f32(in), dim), "log_softmax");
        MAYBE_NATIVE(native, "softmax_backward", r = em_softmax_backward(g, y, dim));
        check_bf16(r, em_softmax_backward(f32(g), f32(y), dim), "softmax_backward");
        MAYBE_NATIVE(native, "log_softmax_backward", r = em_log_softmax_backward(g, ly, dim));
        check_bf16(r, em_log_softmax_backward(f32(g), f32(ly), dim), "log_softmax_backward");
    }
    em_scope_end();
}

/* ---- autograd ---------------------------------------------------------------------------------- */

typedef struct chain_grads {
    em_tensor *loss, *gx, *gw, *gb, *gbn_w, *gbn_b, *gln_w;
} chain_grads;

/* conv (3 -> 8, 3x3, pad 1) -> batch_norm (affine) -> relu -> max_pool 2x2 -> layer_norm over
 * (C, H, W) with a weight -> sum(y * r) for a fixed r: every input and parameter is a leaf
 * of dtype dt (the norms' affine parameters stay f32, as a mixed-precision model keeps them). */
static chain_grads run_chain(em_dtype dt) {
    int64_t xs[4] = {2, 3, 8, 8}, ws[4] = {8, 3, 3, 3}, cs[1] = {8}, ls[3] = {8, 4, 4};
    em_tensor *x = rnd(dt, 4, xs, 1), *w = rnd(dt, 4, ws, 2), *b = rnd(dt, 1, cs, 3);
    em_tensor *bw = rnd(EM_F32, 1, cs, 4), *bb = rnd(EM_F32, 1, cs, 5);
    em_tensor *lw = rnd(EM_F32, 3, ls, 6), *r = rnd(dt, 4, (int64_t[]){2, 8, 4, 4}, 7);
    em_tensor *leaves[6] = {x, w, b, bw, bb, lw};
    for (int i = 0; i < 6; i++) cr_assert_eq(em_requires_grad_(leaves[i], true), EM_OK);
    em_tensor *y = em_conv2d(x, w, b, NULL, (int64_t[]){1, 1}, NULL, 1), *z, *sm, *si, *p, *idx;
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(em_batch_norm(y, bw, bb, NULL, NULL, true, 0.1, 1e-5, &z, &sm, &si), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_max_pool2d(em_relu(z), (int64_t[]){2, 2}, NULL, NULL, NULL, false, &p, &idx),
                 EM_OK, "%s", em_last_error());
    em_tensor *l, *mean, *rstd;
    cr_assert_eq(em_layer_norm(p, 3, ls, lw, NULL, 1e-5, &l, &mean, &rstd), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_tensor_dtype(l), dt);
    em_tensor *loss = em_sum(em_mul(l, r), 0, NULL, false);
    cr_assert(loss, "%s", em_last_error());
    cr_assert_eq(em_backward(loss), EM_OK, "%s", em_last_error());
    return (chain_grads){loss, em_tensor_grad(x), em_tensor_grad(w), em_tensor_grad(b),
                         em_tensor_grad(bw), em_tensor_grad(bb), em_tensor_grad(lw)};
}

Test(bf16, autograd_chain_vs_f32) {
    em_scope_begin();
    chain_grads g = run_chain(EM_BF16), r = run_chain(EM_F32);
    const em_tensor *got[5] = {g.gx, g.gw, g.gbn_w, g.gbn_b, g.gln_w},
                    *want[5] = {r.gx, r.gw, r.gbn_w, r.gbn_b, r.gln_w};
    static const char *const names[5] = {"input", "conv weight", "bn weight", "bn bias",
                                         "ln weight"};
    for (int i = 0; i < 5; i++) {
        char what[64];
        snprintf(what, sizeof what, "grad of the %s", names[i]);
        check_rel(got[i], want[i], i < 2 ? EM_BF16 : EM_F32, 0x1p-6, 0x1p-7, what);
    }
    /* The conv bias's grad is 0 in exact arithmetic (training batch_norm subtracts the
     * channel mean): both are rounding noise, small next to the weight's grad. */
    int64_t n, m;
    double *gb = host(g.gb, &n), *gw = host(r.gw, &m), big = 0;
    for (int64_t i = 0; i < m; i++) big = fmax(big, fabs(gw[i]));
    cr_assert_eq(em_tensor_dtype(g.gb), EM_BF16);
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(gb[i]) <= 0x1p-8 * big, "grad of the conv bias: element %lld is %.9g, "
                  "the weight's grads reach %.9g", (long long)i, gb[i], big);
    free(gb), free(gw);
    em_scope_end();
}

/* ---- what the native kernels decline, and what has none ----------------------------------------- */

/* Empty operands: oneDNN has no zero-size primitives, so the bf16 kernels decline, the
 * dispatcher reports no kernel, and the core reruns the op in f32 — with no error left. */
Test(bf16, empty_inputs_take_the_f32_path) {
    em_scope_begin();
    em_clear_error();
    em_tensor *x = em_zeros(4, (int64_t[]){0, 3, 5, 5}, EM_BF16, em_cpu());
    em_tensor *w = em_ones(4, (int64_t[]){4, 3, 3, 3}, EM_BF16, em_cpu());
    em_tensor *y = em_conv2d(x, w, NULL, NULL, NULL, NULL, 1);
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(em_tensor_dtype(y), EM_BF16);
    cr_assert_eq(em_tensor_shape(y)[1], 4);
    cr_assert_eq(em_tensor_numel(y), 0);
    em_tensor *gw, *gb;
    cr_assert_eq(em_conv2d_backward_weight(x, y, (int64_t[]){3, 3}, NULL, NULL, NULL, 1, &gw,
                                           &gb), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_dtype(gw), EM_BF16);
    check_same(gw, em_zeros(4, (int64_t[]){4, 3, 3, 3}, EM_BF16, em_cpu()), "empty grad_weight");
    em_tensor *p = em_avg_pool2d(x, (int64_t[]){2, 2}, NULL, NULL, false, true);
    cr_assert(p && em_tensor_numel(p) == 0 && em_tensor_dtype(p) == EM_BF16, "%s",
              em_last_error());
    em_tensor *m, *idx;
    cr_assert_eq(em_max_pool2d(x, (int64_t[]){2, 2}, NULL, NULL, NULL, false, &m, &idx), EM_OK,
                 "%s", em_last_error());
    cr_assert_eq(em_tensor_numel(m), 0);
    em_tensor *s = em_softmax(em_zeros(2, (int64_t[]){0, 7}, EM_BF16, em_cpu()), 1);
    cr_assert(s && em_tensor_numel(s) == 0 && em_tensor_dtype(s) == EM_BF16, "%s",
              em_last_error());
    em_tensor *ly, *mean, *rstd;
    cr_assert_eq(em_layer_norm(em_zeros(2, (int64_t[]){0, 6}, EM_BF16, em_cpu()), 1,
                               (int64_t[]){6}, NULL, NULL, 1e-5, &ly, &mean, &rstd), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_tensor_dtype(mean), EM_F32);
    cr_assert_eq(em_last_status(), EM_OK, "a declined native call left: %s", em_last_error());
    em_scope_end();
}

/* Transposed and sliced bf16 inputs are made contiguous and take the same kernels: the
 * results equal the contiguous call's bit for bit. */
Test(bf16, non_contiguous_inputs) {
    em_scope_begin();
    int64_t xs[4] = {2, 4, 9, 9}, ws[4] = {6, 4, 3, 3};
    em_tensor *x = rnd(EM_BF16, 4, xs, 1), *w = rnd(EM_BF16, 4, ws, 2);
    em_tensor *xt = em_transpose(em_contiguous(em_transpose(x, 2, 3)), 2, 3);
    em_tensor *wide = em_zeros(4, (int64_t[]){2, 4, 9, 18}, EM_BF16, em_cpu());
    em_tensor *xsl = em_slice(wide, 3, 0, 18, 2);
    cr_assert_eq(em_copy_(xsl, x), EM_OK);
    cr_assert(!em_tensor_is_contiguous(xt) && !em_tensor_is_contiguous(xsl));
    int64_t pad[2] = {1, 1}, k2[2] = {2, 2};
    em_tensor *y = em_conv2d(x, w, NULL, NULL, pad, NULL, 1);
    check_same(em_conv2d(xt, w, NULL, NULL, pad, NULL, 1), y, "conv2d of a transposed input");
    check_same(em_conv2d(xsl, w, NULL, NULL, pad, NULL, 1), y, "conv2d of a sliced input");
    em_tensor *m, *i, *mt, *it;
    cr_assert_eq(em_max_pool2d(x, k2, NULL, NULL, NULL, true, &m, &i), EM_OK);
    cr_assert_eq(em_max_pool2d(xt, k2, NULL, NULL, NULL, true, &mt, &it), EM_OK);
    check_same(mt, m, "max_pool2d of a transposed input");
    check_same(it, i, "max_pool2d indices of a transposed input");
    check_same(em_softmax(xsl, 3), em_softmax(x, 3), "softmax of a sliced input");
    check_same(em_avg_pool2d(xt, k2, NULL, NULL, false, true),
               em_avg_pool2d(x, k2, NULL, NULL, false, true), "avg_pool2d of a transposed input");
    em_scope_end();
}

/* Without bf16 kernels (EMBER_CPU_DISABLE_DNNL=1 leaves only the loops, which have bf16 only
 * for max_pool2d) the same calls run through f32 and give the same answers. */
Test(bf16, no_bf16_kernel_converts) {
    em_test_assert_clean_shutdown();
    setenv("EMBER_CPU_DISABLE_DNNL", "1", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    unsetenv("EMBER_CPU_DISABLE_DNNL");
    cr_assert(!kernel_registered("cpu_conv2d_dnnl_bf16"));
    em_scope_begin();
    int64_t xs[4] = {2, 4, 9, 9}, ws[4] = {6, 4, 3, 3}, pad[2] = {1, 1};
    em_tensor *x = rnd(EM_BF16, 4, xs, 1), *w = rnd(EM_BF16, 4, ws, 2);
    em_placement_reset();
    em_tensor *y = em_conv2d(x, w, NULL, NULL, pad, NULL, 1);
    cr_assert_gt(cpu_ops(), 1, "conv2d in bf16 without a bf16 kernel ran %llu kernels; the f32 "
                 "path converts", (unsigned long long)cpu_ops());
    check_bf16(y, em_conv2d(f32(x), f32(w), NULL, NULL, pad, NULL, 1), "conv2d via f32");
    em_tensor *y2, *mean, *rstd;
    cr_assert_eq(em_layer_norm(x, 2, xs + 2, NULL, NULL, 1e-5, &y2, &mean, &rstd), EM_OK, "%s",
                 em_last_error());
    em_tensor *y32, *m32, *r32;
    cr_assert_eq(em_layer_norm(f32(x), 2, xs + 2, NULL, NULL, 1e-5, &y32, &m32, &r32), EM_OK);
    check_bf16(y2, y32, "layer_norm via f32");
    em_scope_end();
}

/* f16 has no native kernel on the CPU (oneDNN 2.6 lacks f16 primitives here): computed in
 * f32 and rounded once. */
Test(bf16, f16_through_f32) {
    cr_assert(!kernel_registered("cpu_conv2d_dnnl_f16"));
    em_scope_begin();
    int64_t xs[4] = {2, 4, 9, 9}, ws[4] = {6, 4, 3, 3}, pad[2] = {1, 1};
    em_tensor *x = rnd(EM_F16, 4, xs, 1), *w = rnd(EM_F16, 4, ws, 2);
    em_tensor *y = em_conv2d(x, w, NULL, NULL, pad, NULL, 1);
    check_rel(y, em_conv2d(f32(x), f32(w), NULL, NULL, pad, NULL, 1), EM_F16, 0x1p-10, 0x1p-11,
              "f16 conv2d");
    em_tensor *s = em_log_softmax(x, 1);
    check_rel(s, em_log_softmax(f32(x), 1), EM_F16, 0x1p-10, 0x1p-11, "f16 log_softmax");
    em_tensor *z, *sm, *si;
    cr_assert_eq(em_batch_norm(x, NULL, NULL, NULL, NULL, true, 0.1, 1e-5, &z, &sm, &si), EM_OK,
                 "%s", em_last_error());
    cr_assert_eq(em_tensor_dtype(z), EM_F16);
    cr_assert_eq(em_tensor_dtype(sm), EM_F32);
    em_scope_end();
}

/* The kernel contract through the dispatcher (em_op_call_kernel: the ops' composites, which
 * em_op_call runs, convert for the caller as the typed functions do): the norms'
 * per-channel tensors of a bf16 call must be f32; conv's bias is bf16 like its input. */
Test(bf16, op_contract_errors) {
    em_scope_begin();
    const em_op *bn = em_op_find("batch_norm"), *conv = em_op_find("conv2d");
    cr_assert(bn && conv);
    em_tensor *x = rnd(EM_BF16, 4, (int64_t[]){2, 3, 4, 4}, 1);
    em_tensor *wb = em_ones(1, (int64_t[]){3}, EM_BF16, em_cpu());
    em_tensor *none = em_zeros(1, (int64_t[]){0}, EM_F32, em_cpu());
    em_attr a[3] = {{.type = EM_ATTR_BOOL, .v.b = true}, {.type = EM_ATTR_FLOAT, .v.f = 0.1},
                    {.type = EM_ATTR_FLOAT, .v.f = 1e-5}};
    em_tensor *out[3];
    cr_assert_neq(em_op_call_kernel(bn, (const em_tensor *[]){x, wb, none, none, none}, 5, a, out), EM_OK);
    em_assert_error(EM_ERR_DTYPE, "batch_norm: input 1 (weight) has dtype bfloat16; expected "
                    "float32, the statistics dtype of a bfloat16 input");
    em_tensor *w = rnd(EM_BF16, 4, (int64_t[]){5, 3, 3, 3}, 2);
    em_tensor *b = rnd(EM_BF16, 1, (int64_t[]){5}, 3);
    em_attr ca[4] = {{.type = EM_ATTR_INTS, .n = 2, .ints = {1, 1}},
                     {.type = EM_ATTR_INTS, .n = 2, .ints = {0, 0}},
                     {.type = EM_ATTR_INTS, .n = 2, .ints = {1, 1}},
                     {.type = EM_ATTR_INT, .v.i = 1}};
    em_tensor *y;
    em_placement_reset();
    if (onednn_has_bf16()) {
        cr_assert_eq(em_op_call_kernel(conv, (const em_tensor *[]){x, w, b}, 3, ca, &y), EM_OK,
                     "%s", em_last_error());
        cr_assert_eq(cpu_ops(), 1);
        check_bf16(y, em_conv2d(f32(x), f32(w), f32(b), NULL, NULL, NULL, 1), "conv2d via em_op_call");
    } else {
        /* no bf16 conv kernel takes the call (none without oneDNN; oneDNN's declined below
         * AVX-512): the dispatcher says so (em_conv2d converts) */
        cr_assert_neq(em_op_call_kernel(conv, (const em_tensor *[]){x, w, b}, 3, ca, &y), EM_OK);
        em_assert_error(EM_ERR_NOKERNEL, "conv2d: no kernel for device 'cpu' and dtype bfloat16");
        cr_assert_eq(cpu_ops(), 0);
    }
    em_scope_end();
}
