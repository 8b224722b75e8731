/*
 * cuda_scalar.h — the scalar definitions the CUDA kernels share with the CPU backend, written
 * once for host and device (__host__ __device__ under nvcc, plain static inline C elsewhere)
 * so that tests/test_cuda_scalar.c checks them here, without a GPU, against the core's own
 * definitions (core/dtype.c, ember/random.h):
 *   - f16 and bf16 conversions, bit for bit those of em_f32_to_f16 / em_f16_to_f32 /
 *     em_f32_to_bf16 / em_bf16_to_f32 (round to nearest even, NaN quieted keeping its top
 *     payload bits); CUDA's __float2half_rn and __float2bfloat16_rn differ on NaN payloads;
 *   - Philox 4x32-10 and the element streams of ember/random.h: the raw words, the f32 and
 *     f64 uniforms and the bernoulli draw are exact integer and power-of-two arithmetic, so
 *     the device gives the CPU's bits; the normal stream calls log, sqrt and cos in double,
 *     which CUDA's libdevice gives within 1 ulp (sqrt exact), so a normal value differs from
 *     the CPU's by at most 2 ulp of double before it is rounded to the output dtype.
 * The C test includes this header directly (no CUDA headers needed).
 */
#ifndef EMBER_CUDA_SCALAR_H
#define EMBER_CUDA_SCALAR_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../common/scalar_math.h" /* CK_HD, and the shared scalar formulas */

CK_HD uint32_t ck_f32_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

CK_HD float ck_f32_from_bits(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* m >> shift (1..31), rounded to nearest, ties to even (core/dtype.c's shift_rne). */
CK_HD uint32_t ck_shift_rne(uint32_t m, unsigned shift) {
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

/* em_f32_to_f16, bit for bit. */
CK_HD uint16_t ck_f32_to_f16(float f) {
    uint32_t x = ck_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) return (uint16_t)(sign | ck_shift_rne(ax - 0x38000000u, 13));
    unsigned e = ax >> 23;
    unsigned shift = 126u - e;
    if (e == 0 || shift > 24) return sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | ck_shift_rne(m, shift));
}

/* em_f16_to_f32, bit for bit. */
CK_HD float ck_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t ex = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (ex == 0x1f) return ck_f32_from_bits(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0));
    if (ex == 0) {
        float v = (float)mant * 5.9604644775390625e-08f; /* 2^-24 */
        return sign ? -v : v;
    }
    return ck_f32_from_bits(sign | ((ex + 112u) << 23) | (mant << 13));
}

/* em_f32_to_bf16, bit for bit. */
CK_HD uint16_t ck_f32_to_bf16(float f) {
    uint32_t x = ck_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* em_bf16_to_f32, bit for bit. */
CK_HD float ck_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u;
    return ck_f32_from_bits(x);
}

/* ---- Philox 4x32-10 (ember/random.h) ------------------------------------------------------- */

CK_HD void ck_philox_block(uint64_t seed, uint64_t block, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Word w of the 4-per-block stream as u in [0, 1) (exact: 24 bits times 2^-24). */
CK_HD float ck_u24(uint32_t w) { return (float)(w >> 8) * 5.9604644775390625e-08f; }

/* The f64 uniform from words (w0, w1): 53 random bits in [0, 1) (exact). */
CK_HD double ck_u53(uint32_t w0, uint32_t w1) {
    return ((double)(w0 >> 5) * 67108864.0 + (double)(w1 >> 6)) *
           1.1102230246251565404236316680908203125e-16;
}

/* The standard normal from words (w0, w1), as em_philox_normal computes it. */
CK_HD double ck_box_muller(uint32_t w0, uint32_t w1) {
    double u1 = ((double)(w0 >> 8) + 1.0) * 5.9604644775390625e-08;
    double u2 = (double)(w1 >> 8) * 5.9604644775390625e-08;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

#endif /* EMBER_CUDA_SCALAR_H */
