/*
 * scalar_math.h — per-element scalar formulas that the CPU backend (C) and the CUDA backend
 * (nvcc) share, written once: CK_HD is __host__ __device__ __forceinline__ under nvcc and
 * plain static inline C elsewhere (plugins/backend-cuda/cuda_scalar.h takes the macro from
 * here). Only the scalar math lives here; loops, vectorised paths and launches stay in each
 * backend. The CPU's results are those of the code this replaced, bit for bit.
 */
#ifndef EMBER_SCALAR_MATH_H
#define EMBER_SCALAR_MATH_H

#include <math.h>

#ifdef __CUDACC__
#define CK_HD __host__ __device__ __forceinline__
#else
#define CK_HD static inline
#endif

/* erfinv in double: Giles' single-precision approximation ("Approximating the erfinv
 * function", GPU Computing Gems, 2010) refined by two Newton steps on erf (each roughly
 * doubles the correct digits: the result is within a few ulp). erfinv(+-1) = +-inf, NaN
 * outside [-1, 1]. */
CK_HD double sc_erfinv_d(double y) {
    if (!(y >= -1 && y <= 1)) return NAN;
    if (y == 1 || y == -1) return y * INFINITY;
    double w = -log((1.0 - y) * (1.0 + y)), x;
    if (w < 5.0) {
        w -= 2.5;
        x = 2.81022636e-08;
        x = 3.43273939e-07 + x * w;
        x = -3.5233877e-06 + x * w;
        x = -4.39150654e-06 + x * w;
        x = 0.00021858087 + x * w;
        x = -0.00125372503 + x * w;
        x = -0.00417768164 + x * w;
        x = 0.246640727 + x * w;
        x = 1.50140941 + x * w;
    } else {
        w = sqrt(w) - 3.0;
        x = -0.000200214257;
        x = 0.000100950558 + x * w;
        x = 0.00134934322 + x * w;
        x = -0.00367342844 + x * w;
        x = 0.00573950773 + x * w;
        x = -0.0076224613 + x * w;
        x = 0.00943887047 + x * w;
        x = 1.00167406 + x * w;
        x = 2.83297682 + x * w;
    }
    x *= y;
    for (int i = 0; i < 2; i++) /* d erf / dx = 2 / sqrt(pi) exp(-x^2) */
        x -= (erf(x) - y) / (1.12837916709551257390 * exp(-x * x));
    return x;
}

/* smooth_l1 on d = x - y: |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta, written as
 * 0.5 c^2 / beta + |d| - c with c = min(|d|, beta), which has no branch, so the CPU loop
 * vectorises (the compiler does not if-convert arms that may trap, such as a division). The
 * forward needs beta > 0 (the callers run l1 for beta == 0). The gradient follows PyTorch,
 * including its -1 at d == 0 when beta == 0. sfx f: float, d: double. */
#define SC_DEF_SL1(CT, sfx, ABS)                                                               \
    CK_HD CT sc_sl1_fwd_##sfx(CT d, CT beta) {                                                 \
        CT a = ABS(d), c = a < beta ? a : beta;                                                \
        return (CT)0.5 * c * c / beta + (a - c);                                               \
    }                                                                                          \
    CK_HD CT sc_sl1_bwd_##sfx(CT d, CT beta) {                                                 \
        CT r = d / beta;                                                                       \
        r = d >= beta ? (CT)1 : r;                                                             \
        return d <= -beta ? (CT)-1 : r;                                                        \
    }
SC_DEF_SL1(float, f, fabsf)
SC_DEF_SL1(double, d, fabs)
#undef SC_DEF_SL1
#ifdef __cplusplus /* overloads for templates over the compute type */
CK_HD float sc_sl1_fwd(float d, float beta) { return sc_sl1_fwd_f(d, beta); }
CK_HD double sc_sl1_fwd(double d, double beta) { return sc_sl1_fwd_d(d, beta); }
CK_HD float sc_sl1_bwd(float d, float beta) { return sc_sl1_bwd_f(d, beta); }
CK_HD double sc_sl1_bwd(double d, double beta) { return sc_sl1_bwd_d(d, beta); }
#endif

#endif
