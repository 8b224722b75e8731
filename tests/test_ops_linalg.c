/*
 * test_ops_linalg.c — addmm, linear, bmm (and em_matmul in bf16/f16) against plain-loop
 * references in double, per dtype, on contiguous, transposed, sliced (ld > cols and step 2),
 * batch-broadcast (stride 0) and zero-size operands; the error messages of bad input; and the
 * two f32 GEMM libraries (oneDNN and OpenBLAS, forced with EMBER_GEMM) against each other.
 *
 * Tolerances. The reference is computed in double from the operands as stored (so bf16/f16
 * inputs are the rounded values, as the kernel sees them). With S_ij = |beta * bias_ij| +
 * |alpha| * sum_k |a_ik b_kj|, an element passes when |got - ref| <= rtol * S_ij + atol:
 *   f64: rtol 1e-12, atol 1e-12    f32: rtol 1e-5, atol 1e-6
 *   f16: rtol 2e-3,  atol 1e-3     bf16: rtol 1e-2, atol 1e-3
 * (f16 and bf16 accumulate in f32 and round the result once: 2^-11 and 2^-8 relative.)
 * The two f32 libraries agree within rtol 1e-5 of S_ij.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common.h"
#include "tests/onednn_isa.h"

TestSuite(addmm, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(linear, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(bmm, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(linalg_errors, .init = em_test_setup, .fini = em_test_teardown);
TestSuite(gemm_paths, .fini = em_test_teardown);

static const em_dtype fdtypes[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
#define N_FDTYPES 4

static void tol_of(em_dtype dt, double *rtol, double *atol) {
    switch (dt) {
    case EM_F64: *rtol = 1e-12, *atol = 1e-12; break;
    case EM_F32: *rtol = 1e-5, *atol = 1e-6; break;
    case EM_F16: *rtol = 2e-3, *atol = 1e-3; break;
    default: *rtol = 1e-2, *atol = 1e-3; break;
    }
}

/* ---- helpers ---------------------------------------------------------------------------------- */

/* A tensor of uniform values in [-1, 1) from a small LCG (the same for every dtype). */
static em_tensor *rnd(em_dtype dt, int ndim, const int64_t *shape, uint32_t seed) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (double)(s >> 8) / (double)(1u << 23) - 1.0;
    }
    em_tensor *t = em_test_tensor(dt, ndim, shape, v);
    free(v);
    return t;
}

/* The values of t in C order (a malloc'd array of numel doubles). */
static double *values(const em_tensor *t) {
    cr_assert(t, "%s", em_last_error());
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *c = em_to_dtype(t, EM_F64);
    cr_assert(c, "to_dtype: %s", em_last_error());
    int64_t n = em_tensor_numel(c);
    double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
    cr_assert_eq(em_tensor_to_host(c, buf, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_scope_end(), EM_OK);
    return buf;
}

/* ref (M, N) = beta * bias + alpha * a @ b and its bound S, from the operand values; bias is
 * given (M, N) already broadcast (NULL: none). */
static void ref_addmm(int64_t M, int64_t K, int64_t N, const double *bias, const double *a,
                      const double *b, double beta, double alpha, double *ref, double *bound) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int64_t k = 0; k < K; k++) {
                s += a[i * K + k] * b[k * N + j];
                sa += fabs(a[i * K + k] * b[k * N + j]);
            }
            double bv = bias && beta != 0 ? beta * bias[i * N + j] : 0;
            ref[i * N + j] = bv + alpha * s;
            bound[i * N + j] = fabs(bv) + fabs(alpha) * sa;
        }
}

static void check_close(const char *what, em_dtype dt, const em_tensor *y, int ndim,
                        const int64_t *shape, const double *ref, const double *bound) {
    cr_assert(y, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_dtype(y), dt, "%s: dtype %s", what, em_dtype_name(em_tensor_dtype(y)));
    cr_assert_eq(em_tensor_ndim(y), ndim, "%s: ndim %d", what, em_tensor_ndim(y));
    for (int i = 0; i < ndim; i++)
        cr_assert_eq(em_tensor_shape(y)[i], shape[i], "%s: dim %d is %lld, expected %lld", what,
                     i, (long long)em_tensor_shape(y)[i], (long long)shape[i]);
    double rtol, atol;
    tol_of(dt, &rtol, &atol);
    double *got = values(y);
    int64_t n = em_tensor_numel(y);
    for (int64_t i = 0; i < n; i++)
        cr_assert(fabs(got[i] - ref[i]) <= rtol * bound[i] + atol,
                  "%s (%s): element %lld is %.9g, expected %.9g (bound %.3g)", what,
                  em_dtype_name(dt), (long long)i, got[i], ref[i], rtol * bound[i] + atol);
    free(got);
}

/* addmm(bias, a, b) for operands already built (any layout); bias_mn is the bias's values
 * broadcast to (M, N). */
static void run_addmm(const char *what, em_dtype dt, const em_tensor *bias, const double *bias_mn,
                      const em_tensor *a, const em_tensor *b, double beta, double alpha) {
    int64_t M = em_tensor_size(a, 0), K = em_tensor_size(a, 1), N = em_tensor_size(b, 1);
    double *av = values(a), *bv = values(b);
    size_t mn = (size_t)(M * N + 1);
    double *ref = malloc(sizeof(double) * mn), *bound = malloc(sizeof(double) * mn);
    ref_addmm(M, K, N, bias_mn, av, bv, beta, alpha, ref, bound);
    em_tensor *y = em_addmm(bias, a, b, beta, alpha);
    int64_t shape[2] = {M, N};
    check_close(what, dt, y, 2, shape, ref, bound);
    free(av), free(bv), free(ref), free(bound);
}

/* The values of a bias of shape (N), (M, 1) or (M, N) broadcast to (M, N). */
static double *broadcast_mn(const em_tensor *bias, int64_t M, int64_t N) {
    double *v = values(bias), *r = malloc(sizeof(double) * (size_t)(M * N + 1));
    int nd = em_tensor_ndim(bias);
    int64_t bm = nd == 2 ? em_tensor_size(bias, 0) : 1, bn = nd >= 1 ? em_tensor_size(bias, nd - 1) : 1;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) r[i * N + j] = v[(bm == 1 ? 0 : i) * bn + (bn == 1 ? 0 : j)];
    free(v);
    return r;
}

/* ---- addmm ------------------------------------------------------------------------------------ */

Test(addmm, contiguous_every_dtype) {
    /* small, odd sizes and one large enough for blocked GEMM kernels */
    static const int64_t sizes[][3] = {{13, 37, 9}, {1, 5, 1}, {70, 130, 96}};
    for (int d = 0; d < N_FDTYPES; d++)
        for (int s = 0; s < 3; s++) {
            em_dtype dt = fdtypes[d];
            int64_t M = sizes[s][0], K = sizes[s][1], N = sizes[s][2];
            cr_assert_eq(em_scope_begin(), EM_OK);
            int64_t as[2] = {M, K}, bs[2] = {K, N}, cs[1] = {N};
            em_tensor *a = rnd(dt, 2, as, 1), *b = rnd(dt, 2, bs, 2), *bias = rnd(dt, 1, cs, 3);
            double *bmn = broadcast_mn(bias, M, N);
            run_addmm("addmm contiguous", dt, bias, bmn, a, b, 0.5, -1.5);
            run_addmm("addmm beta 1 alpha 1", dt, bias, bmn, a, b, 1.0, 1.0);
            free(bmn);
            cr_assert_eq(em_scope_end(), EM_OK);
        }
}

Test(addmm, transposed_and_sliced_operands) {
    /* M K N above 64^3, so f32 goes to the selected library, not the small-GEMM path */
    int64_t M = 41, K = 70, N = 100;
    for (int d = 0; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t km[2] = {K, M}, nk[2] = {N, K}, mk5[2] = {M, K + 5}, k2n[2] = {K, 2 * N},
                nm[2] = {N, M}, m1[2] = {M, 1};
        /* transposed views: a^T stored (K, M), b^T stored (N, K) */
        em_tensor *at = em_transpose(rnd(dt, 2, km, 4), 0, 1);
        em_tensor *bt = em_transpose(rnd(dt, 2, nk, 5), 0, 1);
        /* row-sliced: ld > cols; step-2 columns: a layout GEMM cannot take (copied) */
        em_tensor *an = em_narrow(rnd(dt, 2, mk5, 6), 1, 3, K);
        em_tensor *bs2 = em_slice(rnd(dt, 2, k2n, 7), 1, 0, 2 * N, 2);
        /* biases: (M, 1) broadcast along rows, a transposed (M, N) */
        em_tensor *bias_m1 = rnd(dt, 2, m1, 8);
        em_tensor *bias_t = em_transpose(rnd(dt, 2, nm, 9), 0, 1);
        cr_assert(at && bt && an && bs2 && bias_m1 && bias_t, "%s", em_last_error());
        double *b1 = broadcast_mn(bias_m1, M, N), *b2 = broadcast_mn(bias_t, M, N);
        run_addmm("addmm a^T b^T", dt, bias_m1, b1, at, bt, 1.0, 1.0);
        run_addmm("addmm a^T b", dt, bias_t, b2, at, bs2, 0.25, 2.0);
        run_addmm("addmm narrowed a, step-2-column b", dt, bias_t, b2, an, bs2, 1.0, -1.0);
        run_addmm("addmm narrowed a, b^T", dt, bias_m1, b1, an, bt, 2.0, 0.5);
        free(b1), free(b2);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(addmm, beta_zero_ignores_nan_bias) {
    for (int d = 0; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t as[2] = {4, 3}, bs[2] = {3, 5}, cs[1] = {5};
        em_tensor *a = rnd(dt, 2, as, 10), *b = rnd(dt, 2, bs, 11);
        em_tensor *bias = em_full(1, cs, NAN, dt, em_cpu());
        run_addmm("addmm beta 0", dt, bias, NULL, a, b, 0.0, 1.0);
        /* and with beta != 0 the NaN does propagate */
        em_tensor *y = em_addmm(bias, a, b, 1.0, 1.0);
        double *v = values(y);
        cr_assert(isnan(v[0]), "addmm beta 1 with a NaN bias gave %g", v[0]);
        free(v);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(addmm, empty_dims) {
    for (int d = 0; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        /* K == 0: beta * bias */
        int64_t a0[2] = {3, 0}, b0[2] = {0, 4}, cs[1] = {4};
        em_tensor *a = em_empty(2, a0, dt, em_cpu()), *b = em_empty(2, b0, dt, em_cpu());
        em_tensor *bias = rnd(dt, 1, cs, 12);
        double *bmn = broadcast_mn(bias, 3, 4);
        run_addmm("addmm K=0", dt, bias, bmn, a, b, 0.5, 3.0);
        run_addmm("addmm K=0 beta 0", dt, bias, bmn, a, b, 0.0, 3.0);
        free(bmn);
        /* M == 0 and N == 0 */
        int64_t am[2] = {0, 5}, bm[2] = {5, 4}, an[2] = {3, 5}, bn[2] = {5, 0}, c0[1] = {0};
        em_tensor *y = em_addmm(bias, em_empty(2, am, dt, em_cpu()), rnd(dt, 2, bm, 13), 1, 1);
        cr_assert(y && em_tensor_size(y, 0) == 0 && em_tensor_size(y, 1) == 4, "%s",
                  em_last_error());
        y = em_addmm(em_empty(1, c0, dt, em_cpu()), rnd(dt, 2, an, 14),
                     em_empty(2, bn, dt, em_cpu()), 1, 1);
        cr_assert(y && em_tensor_size(y, 0) == 3 && em_tensor_size(y, 1) == 0, "%s",
                  em_last_error());
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* ---- linear ------------------------------------------------------------------------------------ */

/* y = x @ w^T + bias for x given as values of shape (R, in). */
static void ref_linear(int64_t R, int64_t in, int64_t out, const double *x, const double *w,
                       const double *bias, double *ref, double *bound) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = bias ? bias[o] : 0, sa = bias ? fabs(bias[o]) : 0;
            for (int64_t k = 0; k < in; k++) {
                s += x[r * in + k] * w[o * in + k];
                sa += fabs(x[r * in + k] * w[o * in + k]);
            }
            ref[r * out + o] = s;
            bound[r * out + o] = sa;
        }
}

static void run_linear(const char *what, em_dtype dt, const em_tensor *x, const em_tensor *w,
                       const em_tensor *bias) {
    int nd = em_tensor_ndim(x);
    int64_t in = em_tensor_size(w, 1), out = em_tensor_size(w, 0), R = 1;
    for (int i = 0; i < nd - 1; i++) R *= em_tensor_size(x, i);
    double *xv = values(x), *wv = values(w), *bv = bias ? values(bias) : NULL;
    double *ref = malloc(sizeof(double) * (size_t)(R * out + 1));
    double *bound = malloc(sizeof(double) * (size_t)(R * out + 1));
    ref_linear(R, in, out, xv, wv, bv, ref, bound);
    em_tensor *y = em_linear(x, w, bias);
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, em_tensor_shape(x), sizeof(int64_t) * (size_t)nd);
    shape[nd - 1] = out;
    check_close(what, dt, y, nd, shape, ref, bound);
    free(xv), free(wv), free(bv), free(ref), free(bound);
}

Test(linear, leading_dims_bias_and_none) {
    for (int d = 0; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t xs[3] = {2, 3, 19}, ws[2] = {7, 19}, bs[1] = {7}, x1[1] = {19}, x4[4] = {2, 1, 3, 19};
        em_tensor *x = rnd(dt, 3, xs, 20), *w = rnd(dt, 2, ws, 21), *b = rnd(dt, 1, bs, 22);
        run_linear("linear (2, 3, in) with bias", dt, x, w, b);
        run_linear("linear (2, 3, in) without bias", dt, x, w, NULL);
        run_linear("linear 1-D input", dt, rnd(dt, 1, x1, 23), w, b);
        run_linear("linear 4-D input", dt, rnd(dt, 4, x4, 24), w, NULL);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(linear, strided_input_and_weight) {
    for (int d = 0; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t xs[3] = {3, 2, 16}, ws[2] = {5, 20}, wt[2] = {16, 5}, bs[1] = {5}, b1[1] = {1};
        /* x permuted to (2, 3, 16): not viewable as (6, 16), so linear copies it */
        static const int perm[3] = {1, 0, 2};
        em_tensor *x = em_permute(rnd(dt, 3, xs, 30), 3, perm);
        /* weight narrowed along in (row stride 20 > 16) and a transposed weight */
        em_tensor *wn = em_narrow(rnd(dt, 2, ws, 31), 1, 2, 16);
        em_tensor *wtr = em_transpose(rnd(dt, 2, wt, 32), 0, 1);
        em_tensor *bias = rnd(dt, 1, bs, 33), *bias1 = rnd(dt, 1, b1, 34);
        run_linear("linear permuted x, narrowed weight", dt, x, wn, bias);
        run_linear("linear permuted x, transposed weight", dt, x, wtr, NULL);
        /* a (1,) bias broadcasts over out, as in PyTorch */
        em_tensor *y = em_linear(x, wn, bias1);
        em_tensor *y0 = em_linear(x, wn, NULL);
        double *v = values(y), *v0 = values(y0), *bv = values(bias1);
        double rtol, atol;
        tol_of(dt, &rtol, &atol);
        for (int i = 0; i < 30; i++)
            cr_assert(fabs(v[i] - (v0[i] + bv[0])) <= 4 * rtol * (fabs(v0[i]) + 1),
                      "linear with a (1,) bias (%s): %g vs %g", em_dtype_name(dt), v[i],
                      v0[i] + bv[0]);
        free(v), free(v0), free(bv);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(linear, empty_dims) {
    for (int d = 0; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t x0[2] = {0, 4}, ws[2] = {3, 4}, bs[1] = {3}, xk[2] = {2, 0}, wk[2] = {3, 0};
        em_tensor *bias = rnd(dt, 1, bs, 40);
        em_tensor *y = em_linear(em_empty(2, x0, dt, em_cpu()), rnd(dt, 2, ws, 41), bias);
        cr_assert(y && em_tensor_size(y, 0) == 0 && em_tensor_size(y, 1) == 3, "%s",
                  em_last_error());
        /* in_features == 0: the bias, broadcast */
        run_linear("linear in=0", dt, em_empty(2, xk, dt, em_cpu()), em_empty(2, wk, dt, em_cpu()),
                   bias);
        run_linear("linear in=0 without bias", dt, em_empty(2, xk, dt, em_cpu()),
                   em_empty(2, wk, dt, em_cpu()), NULL);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* ---- bmm and low-precision matmul --------------------------------------------------------------- */

/* y (B, M, N) against per-batch references. */
static void run_bmm(const char *what, em_dtype dt, const em_tensor *a, const em_tensor *b,
                    bool use_matmul) {
    int64_t B = em_tensor_size(a, 0), M = em_tensor_size(a, 1), K = em_tensor_size(a, 2),
            N = em_tensor_size(b, 2);
    double *av = values(a), *bv = values(b);
    size_t n = (size_t)(B * M * N + 1);
    double *ref = malloc(sizeof(double) * n), *bound = malloc(sizeof(double) * n);
    for (int64_t i = 0; i < B; i++)
        ref_addmm(M, K, N, NULL, av + i * M * K, bv + i * K * N, 0, 1, ref + i * M * N,
                  bound + i * M * N);
    em_tensor *y = use_matmul ? em_matmul(a, b) : em_bmm(a, b);
    int64_t shape[3] = {B, M, N};
    check_close(what, dt, y, 3, shape, ref, bound);
    free(av), free(bv), free(ref), free(bound);
}

Test(bmm, layouts_every_dtype) {
    for (int d = 0; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t as[3] = {3, 5, 24}, bs[3] = {3, 24, 7}, bts[3] = {3, 7, 24}, a1[3] = {1, 5, 24},
                ats[3] = {3, 24, 5}, big_a[3] = {2, 64, 128}, big_b[3] = {2, 128, 48};
        em_tensor *a = rnd(dt, 3, as, 50), *b = rnd(dt, 3, bs, 51);
        run_bmm("bmm contiguous", dt, a, b, false);
        run_bmm("bmm b transposed", dt, a, em_transpose(rnd(dt, 3, bts, 52), 1, 2), false);
        run_bmm("bmm a transposed", dt, em_transpose(rnd(dt, 3, ats, 53), 1, 2), b, false);
        /* a batch-broadcast operand (batch stride 0) */
        run_bmm("bmm a expanded over the batch", dt, em_expand(rnd(dt, 3, a1, 54), 3, as), b,
                false);
        run_bmm("bmm large", dt, rnd(dt, 3, big_a, 55), rnd(dt, 3, big_b, 56), false);
        /* em_matmul on bf16/f16 goes through the same kernels */
        run_bmm("matmul 3-D", dt, a, b, true);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(bmm, low_precision_matmul_broadcasts) {
    for (int d = 2; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t as[3] = {2, 5, 9}, bs[2] = {9, 4}, be[3] = {2, 9, 4};
        em_tensor *a = rnd(dt, 3, as, 60), *b = rnd(dt, 2, bs, 61);
        double *av = values(a), *bv = values(b), ref[40], bound[40];
        for (int i = 0; i < 2; i++) ref_addmm(5, 9, 4, NULL, av + i * 45, bv, 0, 1, ref + i * 20, bound + i * 20);
        int64_t ys[3] = {2, 5, 4};
        check_close("matmul (2, 5, 9) x (9, 4)", dt, em_matmul(a, b), 3, ys, ref, bound);
        (void)be;
        free(av), free(bv);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

Test(bmm, empty_dims) {
    for (int d = 0; d < N_FDTYPES; d++) {
        em_dtype dt = fdtypes[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t a0[3] = {0, 2, 3}, b0[3] = {0, 3, 4}, ak[3] = {2, 3, 0}, bk[3] = {2, 0, 4};
        em_tensor *y = em_bmm(em_empty(3, a0, dt, em_cpu()), em_empty(3, b0, dt, em_cpu()));
        cr_assert(y && em_tensor_numel(y) == 0 && em_tensor_size(y, 2) == 4, "%s", em_last_error());
        /* K == 0: zeros, whatever the freshly allocated output held */
        y = em_bmm(em_empty(3, ak, dt, em_cpu()), em_empty(3, bk, dt, em_cpu()));
        double *v = values(y);
        for (int i = 0; i < 24; i++) cr_assert_eq(v[i], 0.0, "bmm K=0 element %d is %g", i, v[i]);
        free(v);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* ---- errors ---------------------------------------------------------------------------------- */

Test(linalg_errors, shapes_named) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t s23[2] = {2, 3}, s45[2] = {4, 5}, s5[1] = {5}, s3[1] = {3}, s234[3] = {2, 3, 4},
            s254[3] = {2, 5, 4}, s345[3] = {3, 4, 5}, s7[1] = {7};
    em_tensor *a = em_zeros(2, s23, EM_F32, em_cpu()), *b = em_zeros(2, s45, EM_F32, em_cpu());
    em_tensor *c5 = em_zeros(1, s5, EM_F32, em_cpu()), *c3 = em_zeros(1, s3, EM_F32, em_cpu());
    cr_assert_null(em_addmm(c5, a, b, 1, 1));
    em_assert_error(EM_ERR_SHAPE, "addmm: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
    em_tensor *bt = em_zeros(2, (int64_t[]){3, 5}, EM_F32, em_cpu());
    cr_assert_null(em_addmm(c3, a, bt, 1, 1));
    em_assert_error(EM_ERR_SHAPE, "addmm: bias of shape [3] does not broadcast to the product's "
                    "shape [2, 5]");
    cr_assert_null(em_addmm(c5, c3, bt, 1, 1));
    em_assert_error(EM_ERR_SHAPE, "addmm: expected 2-D matrices, got shapes [3] and [3, 5]");
    cr_assert_null(em_linear(em_zeros(3, s234, EM_F32, em_cpu()), b, NULL));
    em_assert_error(EM_ERR_SHAPE, "linear: input of shape [2, 3, 4] and weight of shape [4, 5] "
                    "do not fit");
    em_tensor *w = em_zeros(2, (int64_t[]){5, 4}, EM_F32, em_cpu());
    cr_assert_null(em_linear(em_zeros(3, s234, EM_F32, em_cpu()), w, em_zeros(1, s7, EM_F32, em_cpu())));
    em_assert_error(EM_ERR_SHAPE, "linear: bias of shape [7] does not fit weight of shape [5, 4]");
    cr_assert_null(em_linear(em_zeros(3, s234, EM_F32, em_cpu()), c5, NULL));
    em_assert_error(EM_ERR_SHAPE, "weight of shape [5]");
    cr_assert_null(em_bmm(em_zeros(3, s234, EM_F32, em_cpu()), em_zeros(3, s254, EM_F32, em_cpu())));
    em_assert_error(EM_ERR_SHAPE, "bmm: shapes [2, 3, 4] and [2, 5, 4] cannot be multiplied as "
                    "batches (B, M, K) x (B, K, N) (K differs)");
    cr_assert_null(em_bmm(em_zeros(3, s234, EM_F32, em_cpu()), em_zeros(3, s345, EM_F32, em_cpu())));
    em_assert_error(EM_ERR_SHAPE, "(batch sizes differ)");
    cr_assert_null(em_bmm(a, b));
    em_assert_error(EM_ERR_SHAPE, "bmm: expected 3-D operands (B, M, K) and (B, K, N), got "
                    "shapes [2, 3] and [4, 5]");
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(linalg_errors, dtypes_and_null) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t s23[2] = {2, 3}, s35[2] = {3, 5}, s5[1] = {5}, b235[3] = {2, 3, 5}, b253[3] = {2, 5, 3};
    em_tensor *a = em_zeros(2, s23, EM_F32, em_cpu()), *b = em_zeros(2, s35, EM_F64, em_cpu());
    em_tensor *bf = em_zeros(2, s35, EM_F32, em_cpu()), *c = em_zeros(1, s5, EM_F16, em_cpu());
    cr_assert_null(em_addmm(em_zeros(1, s5, EM_F32, em_cpu()), a, b, 1, 1));
    em_assert_error(EM_ERR_DTYPE, "addmm: expected mat1 and mat2 to have the same dtype, got "
                    "float32 and float64");
    cr_assert_null(em_addmm(c, a, bf, 1, 1));
    em_assert_error(EM_ERR_DTYPE, "addmm: expected bias and mat1 to have the same dtype, got "
                    "float16 and float32");
    em_tensor *ia = em_zeros(3, b235, EM_I64, em_cpu()), *ib = em_zeros(3, b253, EM_I64, em_cpu());
    cr_assert_null(em_bmm(ia, ib));
    em_assert_error(EM_ERR_DTYPE, "bmm: expected floating operands (f32, f64, bf16, f16), got int64");
    cr_assert_null(em_linear(a, em_zeros(2, (int64_t[]){4, 3}, EM_BF16, em_cpu()), NULL));
    em_assert_error(EM_ERR_DTYPE, "linear: expected input and weight to have the same dtype, got "
                    "float32 and bfloat16");
    /* NULL inputs keep the pending error */
    em_set_error(EM_ERR_IO, "earlier failure");
    cr_assert_null(em_addmm(NULL, a, bf, 1, 1));
    cr_assert_null(em_linear(NULL, bf, NULL));
    cr_assert_null(em_bmm(ia, NULL));
    em_assert_error(EM_ERR_IO, "earlier failure");
    em_clear_error();
    cr_assert_null(em_bmm(NULL, ib));
    em_assert_error(EM_ERR_INVALID, "bmm: input 0 is NULL");
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* ---- the f32 GEMM libraries -------------------------------------------------------------------- */

static char log_text[2048];
static void capture_log(em_log_level level, const char *msg, void *user) {
    (void)level, (void)user;
    if (strstr(msg, "f32 GEMM")) snprintf(log_text, sizeof log_text, "%s", msg);
}

/* addmm and bmm with transposed operands under EMBER_GEMM=lib; the info log line must name
 * the library. Returns the results (malloc'd), n of them. */
static double *run_with(const char *lib, const char *expect, int64_t *n) {
    setenv("EMBER_GEMM", lib, 1);
    log_text[0] = '\0';
    em_log_set(capture_log, NULL);
    em_log_set_level(EM_LOG_INFO);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert(strstr(log_text, expect), "EMBER_GEMM=%s: log line '%s' lacks '%s'", lib,
              log_text, expect);
    cr_assert_eq(em_scope_begin(), EM_OK);
    /* every product above 64^3 multiply-adds: smaller ones go to OpenBLAS either way */
    int64_t as[2] = {65, 130}, bts[2] = {47, 130}, cs[1] = {47}, ba[3] = {1, 40, 64},
            bas[3] = {3, 40, 64}, bb[3] = {3, 48, 64};
    em_tensor *y1 = em_addmm(rnd(EM_F32, 1, cs, 70), rnd(EM_F32, 2, as, 71),
                             em_transpose(rnd(EM_F32, 2, bts, 72), 0, 1), 0.5, 2.0);
    /* a batch-broadcast a (stride 0) times a transposed b */
    em_tensor *y2 = em_bmm(em_expand(rnd(EM_F32, 3, ba, 73), 3, bas),
                           em_transpose(rnd(EM_F32, 3, bb, 74), 1, 2));
    double *v1 = values(y1), *v2 = values(y2);
    int64_t n1 = em_tensor_numel(y1), n2 = em_tensor_numel(y2);
    double *r = malloc(sizeof(double) * (size_t)(n1 + n2));
    memcpy(r, v1, sizeof(double) * (size_t)n1);
    memcpy(r + n1, v2, sizeof(double) * (size_t)n2);
    free(v1), free(v2);
    *n = n1 + n2;
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
    em_log_set(NULL, NULL);
    unsetenv("EMBER_GEMM");
    return r;
}

Test(gemm_paths, onednn_and_openblas_agree) {
    em_test_needs_onednn();
    int64_t n1, n2;
    double *x = run_with("onednn", "f32 GEMM: oneDNN matmul", &n1);
    double *y = run_with("openblas", "f32 GEMM: OpenBLAS sgemm", &n2);
    cr_assert_eq(n1, n2);
    for (int64_t i = 0; i < n1; i++)
        cr_assert(fabs(x[i] - y[i]) <= 1e-5 * (fabs(x[i]) + 40.0),
                  "element %lld: oneDNN %.9g, OpenBLAS %.9g", (long long)i, x[i], y[i]);
    /* and neither is trivially zero */
    double s = 0;
    for (int64_t i = 0; i < n1; i++) s += fabs(x[i]);
    cr_assert(s > 1.0);
    free(x), free(y);
}

/* ---- per-shape autotuning (cpu_matmul.c) ------------------------------------------------------- */

/* Products of more than 64^3 and at most 512^3 multiply-adds (the ones the CPU backend tunes)
 * in the layouts it takes: linear's (a row-major, b transposed, a bias row: oneDNN's bias
 * argument), a bias row with beta and alpha, biases that are copied ((M, 1), a step-2 view),
 * transposed, row-sliced and step-2 (copied) operands, a row vector times a matrix, a
 * batch-broadcast bmm and linear with leading dims; f32 (tuned) and bf16 (bias argument), each
 * against its plain-loop reference. */
static void tunable_products(void) {
    static const em_dtype dts[2] = {EM_F32, EM_BF16};
    for (int d = 0; d < 2; d++) {
        em_dtype dt = dts[d];
        cr_assert_eq(em_scope_begin(), EM_OK);
        int64_t M = 70, K = 130, N = 96;
        int64_t mk[2] = {M, K}, nk[2] = {N, K}, km[2] = {K, M}, kn[2] = {K, N}, n1[1] = {N},
                m1[2] = {M, 1}, n2[1] = {2 * N}, mk5[2] = {M, K + 5}, k2n[2] = {K, 2 * N},
                row[2] = {1, 600}, big[2] = {600, 500}, b500[1] = {500};
        em_tensor *x = rnd(dt, 2, mk, 80), *wt = em_transpose(rnd(dt, 2, nk, 81), 0, 1);
        em_tensor *bias = rnd(dt, 1, n1, 82), *bias_m1 = rnd(dt, 2, m1, 83);
        em_tensor *bias_s2 = em_slice(rnd(dt, 1, n2, 84), 0, 0, 2 * N, 2);
        em_tensor *at = em_transpose(rnd(dt, 2, km, 85), 0, 1), *b = rnd(dt, 2, kn, 86);
        em_tensor *an = em_narrow(rnd(dt, 2, mk5, 87), 1, 3, K);
        em_tensor *bs2 = em_slice(rnd(dt, 2, k2n, 88), 1, 0, 2 * N, 2);
        cr_assert(x && wt && bias && bias_m1 && bias_s2 && at && b && an && bs2, "%s",
                  em_last_error());
        double *bn = broadcast_mn(bias, M, N), *bm = broadcast_mn(bias_m1, M, N),
               *bs = broadcast_mn(bias_s2, M, N);
        run_addmm("tuned: linear (bias argument)", dt, bias, bn, x, wt, 1.0, 1.0);
        run_addmm("tuned: bias row, beta and alpha", dt, bias, bn, x, wt, 0.5, -1.5);
        run_addmm("tuned: (M, 1) bias", dt, bias_m1, bm, x, wt, 1.0, 1.0);
        run_addmm("tuned: step-2 bias", dt, bias_s2, bs, x, b, 1.0, 1.0);
        run_addmm("tuned: a^T b, beta 0", dt, bias, NULL, at, b, 0.0, 1.0);
        run_addmm("tuned: a^T b^T", dt, bias, bn, at, wt, 1.0, 1.0);
        run_addmm("tuned: narrowed a, step-2-column b", dt, bias, bn, an, bs2, 1.0, 1.0);
        em_tensor *bias500 = rnd(dt, 1, b500, 89);
        double *b5 = broadcast_mn(bias500, 1, 500);
        run_addmm("tuned: one row (M = 1), bias argument", dt, bias500, b5, rnd(dt, 2, row, 90),
                  rnd(dt, 2, big, 91), 1.0, 1.0);
        int64_t ba[3] = {1, 40, 64}, bas[3] = {3, 40, 64}, bb[3] = {3, 48, 64},
                x3[3] = {2, 35, 130};
        run_bmm("tuned: batch-broadcast a, b^T", dt, em_expand(rnd(dt, 3, ba, 92), 3, bas),
                em_transpose(rnd(dt, 3, bb, 93), 1, 2), false);
        run_linear("tuned: linear with leading dims", dt, rnd(dt, 3, x3, 94), rnd(dt, 2, nk, 95),
                   bias);
        free(bn), free(bm), free(bs), free(b5);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

/* The CPU plugin's describe() text. */
static const char *cpu_describe(void) {
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        cr_assert_eq(em_plugin_get(i, &info), EM_OK);
        if (info.name && strcmp(info.name, "ember-cpu") == 0) return em_plugin_describe(i);
    }
    cr_assert_fail("no ember-cpu plugin");
    return NULL;
}

/* describe() names the libraries this build has: with oneDNN, its matmul for f32 (on this
 * CPU with AVX2) and its version; without, OpenBLAS alone and no autotuning. */
Test(gemm_paths, describe_names_the_build) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    const char *d = cpu_describe();
    cr_assert(d && strstr(d, "f64: OpenBLAS"), "describe() says '%s'", d ? d : "(null)");
#ifdef EM_HAVE_DNNL
    cr_assert(strstr(d, "oneDNN ") && !strstr(d, "without oneDNN"), "describe() says '%s'", d);
#else
    cr_assert(strstr(d, "f32 GEMM: OpenBLAS sgemm (built without oneDNN") &&
                  strstr(d, "no per-shape autotuning") && strstr(d, "bf16: through f32") &&
                  !strstr(d, "oneDNN matmul"),
              "describe() says '%s'", d);
#endif
    em_test_assert_clean_shutdown();
}

Test(gemm_paths, every_autotune_path_matches_the_reference) {
    em_test_needs_onednn();
    /* 0: no tuning (oneDNN on all threads); the three paths forced; 1: measured */
    static const char *const modes[] = {"0", "onednn", "onednn-1", "openblas-1", "1"};
    static const char *const said[] = {"autotuning off", "oneDNN on all threads, forced",
                                       "oneDNN on 1 thread, forced",
                                       "OpenBLAS on 1 thread, forced", "measured at its first call"};
    for (int m = 0; m < 5; m++) {
        setenv("EMBER_GEMM_AUTOTUNE", modes[m], 1);
        cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
        const char *d = cpu_describe();
        cr_assert(d && strstr(d, said[m]), "EMBER_GEMM_AUTOTUNE=%s: describe() says '%s'",
                  modes[m], d ? d : "(null)");
        int nt0 = em_num_threads();
        for (int nt = 1; nt <= 2; nt++) {
            em_set_num_threads(nt);
            tunable_products();
        }
        em_set_num_threads(nt0);
        if (m == 4) { /* measured: describe() lists what it chose for linear's shape */
            d = cpu_describe();
            cr_assert(strstr(d, "Autotuned: ") &&
                      strstr(d, "70x96x130 (a row-major, b transposed, bias): "),
                      "describe() after tuning: '%s'", d);
        } else {
            cr_assert_null(strstr(cpu_describe(), "Autotuned: "), "EMBER_GEMM_AUTOTUNE=%s tuned",
                           modes[m]);
        }
        em_test_assert_clean_shutdown();
    }
    unsetenv("EMBER_GEMM_AUTOTUNE");
}

/* The f32 results of linear's product and a^T b with a long K (the libraries block K
 * differently, so their last bits differ), as bits. */
#define TB_M 70
#define TB_N 96
#define TB_K 1000
static void tuned_bits(uint32_t *out, int64_t n) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t mk[2] = {TB_M, TB_K}, nk[2] = {TB_N, TB_K}, n1[1] = {TB_N}, km[2] = {TB_K, TB_M};
    em_tensor *y = em_addmm(rnd(EM_F32, 1, n1, 60), rnd(EM_F32, 2, mk, 61),
                            em_transpose(rnd(EM_F32, 2, nk, 62), 0, 1), 1.0, 1.0);
    em_tensor *z = em_matmul(em_transpose(rnd(EM_F32, 2, km, 63), 0, 1), rnd(EM_F32, 2, km, 64));
    cr_assert(y && z, "%s", em_last_error());
    cr_assert_eq(em_tensor_numel(y) + em_tensor_numel(z), n);
    cr_assert_eq(em_tensor_to_host(y, out, sizeof(float) * TB_M * TB_N), EM_OK);
    cr_assert_eq(em_tensor_to_host(z, out + TB_M * TB_N, sizeof(float) * TB_M * TB_M), EM_OK);
    cr_assert_eq(em_scope_end(), EM_OK);
}

/* The autotuner chooses between oneDNN on all threads and on one by timing, which differs
 * from run to run: the two must give the same bits, or a resumed run would not end
 * bit-identical. Checked on the long-K products above and the MLP's linear products (forward,
 * grad of the input, grad of the weight). */
static void mlp_bits(uint32_t *out, int64_t n) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t xs[2] = {128, 784}, ws[2] = {512, 784}, gs[2] = {128, 512}, b[1] = {512};
    em_tensor *x = rnd(EM_F32, 2, xs, 70), *w = rnd(EM_F32, 2, ws, 71), *g = rnd(EM_F32, 2, gs, 72);
    em_tensor *y = em_linear(x, w, rnd(EM_F32, 1, b, 73));
    em_tensor *dx = em_matmul(g, w), *dw = em_matmul(em_transpose(g, 0, 1), x);
    cr_assert(y && dx && dw, "%s", em_last_error());
    int64_t ny = em_tensor_numel(y), nx = em_tensor_numel(dx), nw = em_tensor_numel(dw);
    cr_assert_eq(ny + nx + nw, n);
    cr_assert_eq(em_tensor_to_host(y, out, sizeof(float) * (size_t)ny), EM_OK);
    cr_assert_eq(em_tensor_to_host(dx, out + ny, sizeof(float) * (size_t)nx), EM_OK);
    cr_assert_eq(em_tensor_to_host(dw, out + ny + nx, sizeof(float) * (size_t)nw), EM_OK);
    cr_assert_eq(em_scope_end(), EM_OK);
}

Test(gemm_paths, one_thread_and_all_threads_give_the_same_bits) {
    em_test_needs_onednn();
    enum { n = TB_M * TB_N + TB_M * TB_M, nm = 128 * 512 + 128 * 784 + 512 * 784 };
    static uint32_t bits[2][n], mbits[2][nm];
    static const char *const modes[2] = {"onednn", "onednn-1"};
    for (int m = 0; m < 2; m++) {
        setenv("EMBER_GEMM_AUTOTUNE", modes[m], 1);
        cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
        int nt0 = em_num_threads();
        em_set_num_threads(2);
        tuned_bits(bits[m], n);
        mlp_bits(mbits[m], nm);
        em_set_num_threads(nt0);
        em_test_assert_clean_shutdown();
    }
    unsetenv("EMBER_GEMM_AUTOTUNE");
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(bits[0][i], bits[1][i], "long-K element %lld: 0x%08x on all threads, "
                     "0x%08x on one", (long long)i, bits[0][i], bits[1][i]);
    for (int64_t i = 0; i < nm; i++)
        cr_assert_eq(mbits[0][i], mbits[1][i], "MLP product element %lld: 0x%08x on all "
                     "threads, 0x%08x on one", (long long)i, mbits[0][i], mbits[1][i]);
}

Test(gemm_paths, deterministic_mode_ignores_the_tuned_choice) {
    em_test_needs_onednn();
    /* The same products without tuning, then with every tunable product forced onto OpenBLAS
     * on 1 thread but deterministic mode on: bitwise the same (oneDNN on all threads). */
    enum { n = TB_M * TB_N + TB_M * TB_M };
    static uint32_t off[n], det[n], forced[n];
    setenv("EMBER_GEMM_AUTOTUNE", "0", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    tuned_bits(off, n);
    em_test_assert_clean_shutdown();
    setenv("EMBER_GEMM_AUTOTUNE", "openblas-1", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    em_set_deterministic(true);
    tuned_bits(det, n);
    em_set_deterministic(false);
    tuned_bits(forced, n);
    em_test_assert_clean_shutdown();
    unsetenv("EMBER_GEMM_AUTOTUNE");
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(det[i], off[i], "element %lld: 0x%08x in deterministic mode, 0x%08x "
                     "without tuning", (long long)i, det[i], off[i]);
    /* and the forced path did run something else (otherwise this test proves nothing) */
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++) differ += forced[i] != off[i];
    cr_assert_gt(differ, 0, "OpenBLAS and oneDNN gave bitwise identical results");
}

/* A transposed f32 A operand of a product above the tuning range with more than 512 rows (a
 * weight gradient g^T x) is copied row-major before oneDNN multiplies (a fixed rule by layout
 * and size, no timing): so a^T b gives the bits of the same product on a contiguous copy of
 * a^T, in every process, and is right against the double reference. */
Test(gemm_paths, transposed_a_of_a_large_product_is_copied_first) {
    em_test_needs_onednn();
    enum { M = 600, N = 256, K = 1024 }; /* 157M multiply-adds > 512^3 */
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t km[2] = {K, M}, kn[2] = {K, N}, mn[2] = {M, N};
    em_tensor *at = em_transpose(rnd(EM_F32, 2, km, 80), 0, 1), *b = rnd(EM_F32, 2, kn, 81);
    em_tensor *y = em_matmul(at, b), *yc = em_matmul(em_contiguous(at), b);
    cr_assert(y && yc, "%s", em_last_error());
    static uint32_t got[M * N], want[M * N];
    cr_assert_eq(em_tensor_to_host(y, got, sizeof got), EM_OK);
    cr_assert_eq(em_tensor_to_host(yc, want, sizeof want), EM_OK);
    /* The copy is made where oneDNN's matmul is gemm:jit (below avx512_core); elsewhere a^T b
     * runs as it is, and only the f64 bound below holds. */
    if (!onednn_has_avx512_core())
        for (int64_t i = 0; i < M * N; i++)
            cr_assert_eq(got[i], want[i], "element %lld: 0x%08x for a^T b, 0x%08x on a copy of a^T",
                         (long long)i, got[i], want[i]);
    double *av = values(at), *bv = values(b);
    double *ref = malloc(sizeof(double) * M * N), *bound = malloc(sizeof(double) * M * N);
    ref_addmm(M, K, N, NULL, av, bv, 0.0, 1.0, ref, bound);
    check_close("a^T b, a transposed, large", EM_F32, y, 2, mn, ref, bound);
    free(av), free(bv), free(ref), free(bound);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

/* A cached oneDNN primitive keeps its memory objects and a call sets their data handles, one
 * call at a time; a call of the same key while another holds them makes its own. Four threads
 * run linear of one tunable shape (70x130 -> 96, bias argument) on operands of their own, each
 * call against that thread's double reference: a handle left pointing at another call's
 * operands or output would show as a wrong element. */
enum { CK_THREADS = 4, CK_ROUNDS = 200, CK_M = 70, CK_K = 130, CK_N = 96 };
typedef struct ck_arg {
    em_tensor *x, *w, *b;
    double *y; /* CK_ROUNDS results of CK_M * CK_N, NaN where a call failed */
} ck_arg;

static void *ck_linear(void *p) {
    ck_arg *a = p;
    for (int r = 0; r < CK_ROUNDS; r++) {
        double *dst = a->y + (size_t)r * CK_M * CK_N;
        em_scope_begin();
        em_tensor *y = em_linear(a->x, a->w, a->b);
        if (!y || em_tensor_to_host(em_to_dtype(y, EM_F64), dst,
                                    sizeof(double) * CK_M * CK_N) != EM_OK)
            dst[0] = NAN;
        em_scope_end();
    }
    return NULL;
}

Test(gemm_paths, concurrent_calls_of_one_key_use_their_own_operands) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_scope_begin(), EM_OK);
    int64_t xs[2] = {CK_M, CK_K}, ws[2] = {CK_N, CK_K}, bs[1] = {CK_N};
    ck_arg a[CK_THREADS];
    double *ref[CK_THREADS], *bound[CK_THREADS];
    for (int t = 0; t < CK_THREADS; t++) {
        a[t] = (ck_arg){.x = rnd(EM_F32, 2, xs, 200 + 3 * t), .w = rnd(EM_F32, 2, ws, 201 + 3 * t),
                        .b = rnd(EM_F32, 1, bs, 202 + 3 * t),
                        .y = malloc(sizeof(double) * CK_ROUNDS * CK_M * CK_N)};
        cr_assert(a[t].x && a[t].w && a[t].b && a[t].y, "%s", em_last_error());
        double *xv = values(a[t].x), *wv = values(a[t].w);
        double *wt = malloc(sizeof(double) * CK_K * CK_N);
        for (int k = 0; k < CK_K; k++)
            for (int n = 0; n < CK_N; n++) wt[k * CK_N + n] = wv[n * CK_K + k];
        double *bn = broadcast_mn(a[t].b, CK_M, CK_N);
        ref[t] = malloc(sizeof(double) * CK_M * CK_N);
        bound[t] = malloc(sizeof(double) * CK_M * CK_N);
        ref_addmm(CK_M, CK_K, CK_N, bn, xv, wt, 1.0, 1.0, ref[t], bound[t]);
        free(xv), free(wv), free(wt), free(bn);
    }
    pthread_t th[CK_THREADS];
    for (int t = 0; t < CK_THREADS; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, ck_linear, &a[t]), 0);
    for (int t = 0; t < CK_THREADS; t++) pthread_join(th[t], NULL);
    double rtol, atol;
    tol_of(EM_F32, &rtol, &atol);
    for (int t = 0; t < CK_THREADS; t++) {
        for (int r = 0; r < CK_ROUNDS; r++)
            for (int i = 0; i < CK_M * CK_N; i++) {
                double got = a[t].y[(size_t)r * CK_M * CK_N + (size_t)i];
                cr_assert(fabs(got - ref[t][i]) <= rtol * bound[t][i] + atol,
                          "thread %d, call %d, element %d: %.9g, expected %.9g", t, r, i, got,
                          ref[t][i]);
            }
        free(a[t].y), free(ref[t]), free(bound[t]);
    }
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}
