/*
 * cpu_random.c — the CPU kernels of the in-place random fills: uniform, normal, bernoulli, and
 * of randperm.
 *
 * Each op has no inputs and one output, the tensor to fill (any strides), and the attributes
 *     uniform:   seed (int), offset (int), lo (float), hi (float)
 *     normal:    seed (int), offset (int), mean (float), std (float)
 *     bernoulli: seed (int), offset (int), p (float)
 * (seed absent, offset given: the origin comes from a graph capture's generator state,
 * cpu_rng_origin.)
 * Element i (C order over the output's shape) takes exactly the value that ember/random.h
 * defines for index i of the stream starting at block `offset`. The kernels loop over Philox
 * blocks, computing each block once for the 4 (or 2) elements it feeds, so the split across
 * OpenMP threads cannot change any value.
 *
 * Rounding: values are computed in double and rounded to the output dtype; f16 and bf16 are
 * the f32 result converted with em_f32_to_f16 / em_f32_to_bf16 (as a GPU kernel computing in
 * float would), so an f16 fill holds exactly the f32 fill's values, rounded.
 *
 * Bernoulli decisions (a contiguous bool, u8 or f32 bernoulli: the dropout masks; the
 * attention kernel's dropout through cpu_philox_keep) go 16 Philox blocks at a time through
 * AVX-512 where the CPU has it: the 32x32 -> 64-bit products of a round are two
 * _mm512_mul_epu32 (even and odd lanes), the same words as em_philox4x32_10's, 4.7x faster
 * than the scalar rounds on the bench VM (GCC's auto-vectorised form of the scalar code did
 * full 64-bit products and gained only 2x). On AVX2 the same 16 blocks go as two interleaved
 * sets of 8 (_mm256_mul_epu32); before that path the scalar rounds were ~10% of the
 * Transformer step's samples on an AVX2-only EPYC. The decision u < p is taken on the integer word:
 * u = (w >> 8) 2^-24 exactly, so u < p is (w >> 8) < ceil(p 2^24).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/random.h"
#include "cpu.h"
#include "cpu_nn.h"

/* Split the block loop across threads above this many elements. */
#define RANDOM_PAR_MIN 65536

typedef struct rng_params {
    uint64_t seed, offset;
    double a, b; /* lo/hi, mean/std, or p (in a) */
} rng_params;

static int64_t attr_int(const em_kernel_ctx *ctx, int k, int64_t def) {
    return ctx->attrs[k].type == EM_ATTR_INT ? ctx->attrs[k].v.i : def;
}

static double attr_float(const em_kernel_ctx *ctx, int k, double def) {
    return ctx->attrs[k].type == EM_ATTR_FLOAT ? ctx->attrs[k].v.f : def;
}

static em_status read_params(const em_kernel_ctx *ctx, double def_a, double def_b, bool has_b,
                             rng_params *p /* out */) {
    *p = (rng_params){
        .a = attr_float(ctx, 2, def_a),
        .b = has_b ? attr_float(ctx, 3, def_b) : 0.0,
    };
    return cpu_rng_origin(ctx, 0, &p->seed, &p->offset);
}

/* ---- the streams (must match ember/random.h bit for bit) ---------------------------------- */

/* Word w of the 4-per-block stream as u in [0, 1). */
static inline float u24(uint32_t w) {
    return (float)(w >> 8) * 0x1p-24f;
}

/* The f64 uniform from words (w0, w1): 53 random bits in [0, 1). */
static inline double u53(uint32_t w0, uint32_t w1) {
    return ((double)(w0 >> 5) * 67108864.0 + (double)(w1 >> 6)) * 0x1p-53;
}

/* The standard normal from words (w0, w1), written as em_philox_normal writes it. */
static inline double box_muller(uint32_t w0, uint32_t w1) {
    double u1 = ((double)(w0 >> 8) + 1.0) * 0x1p-24;
    double u2 = (double)(w1 >> 8) * 0x1p-24;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/* ---- stores ------------------------------------------------------------------------------- */

/* Write v, rounded once to t's dtype, at linear index i of t. */
static inline void store(const em_ktensor *t, int64_t i, double v) {
    int64_t off = t->contiguous ? i : cpu_offset(t->ndim, t->shape, t->strides, i);
    switch (t->dtype) {
    case EM_F32: ((float *)t->data)[off] = (float)v; break;
    case EM_F64: ((double *)t->data)[off] = v; break;
    case EM_F16: ((uint16_t *)t->data)[off] = em_f32_to_f16((float)v); break;
    case EM_BF16: ((uint16_t *)t->data)[off] = em_f32_to_bf16((float)v); break;
    /* The integer dtypes only ever receive bernoulli's 0 and 1. */
    case EM_I32: ((int32_t *)t->data)[off] = (int32_t)v; break;
    case EM_I64: ((int64_t *)t->data)[off] = (int64_t)v; break;
    case EM_U8: ((uint8_t *)t->data)[off] = (uint8_t)v; break;
    case EM_BOOL: ((uint8_t *)t->data)[off] = v != 0; break;
    default: break;
    }
}

static inline int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

/* ---- uniform ------------------------------------------------------------------------------ */

/* f32, f16, bf16: 4 elements per block. */
static void uniform4(const em_ktensor *t, rng_params p) {
    int64_t n = t->numel, nb = (n + 3) / 4;
    double span = p.b - p.a;
    float *y = t->dtype == EM_F32 && t->contiguous ? (float *)t->data : NULL;
#pragma omp parallel for if (n > RANDOM_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        em_philox_block(p.seed, p.offset + (uint64_t)b, w);
        int64_t i0 = 4 * b, m = min64(4, n - i0);
        for (int64_t j = 0; j < m; j++) {
            double v = p.a + (double)u24(w[j]) * span;
            if (y)
                y[i0 + j] = (float)v;
            else
                store(t, i0 + j, v);
        }
    }
}

/* f64: 2 elements per block. */
static void uniform2(const em_ktensor *t, rng_params p) {
    int64_t n = t->numel, nb = (n + 1) / 2;
    double span = p.b - p.a;
#pragma omp parallel for if (n > RANDOM_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        em_philox_block(p.seed, p.offset + (uint64_t)b, w);
        int64_t i0 = 2 * b, m = min64(2, n - i0);
        for (int64_t j = 0; j < m; j++)
            store(t, i0 + j, p.a + u53(w[2 * j], w[2 * j + 1]) * span);
    }
}

static em_status cpu_uniform(const em_kernel_ctx *ctx) {
    const em_ktensor *t = &ctx->out[0];
    rng_params p;
    if (read_params(ctx, 0.0, 1.0, true, &p) != EM_OK) return em_last_status();
    if (!(p.a <= p.b) || !isfinite(p.a) || !isfinite(p.b))
        return em_set_error(EM_ERR_INVALID,
                            "uniform: expects finite lo <= hi, got lo=%g, hi=%g", p.a, p.b);
    if (t->dtype == EM_F64)
        uniform2(t, p);
    else
        uniform4(t, p);
    return EM_OK;
}

/* ---- normal ------------------------------------------------------------------------------- */

static em_status cpu_normal(const em_kernel_ctx *ctx) {
    const em_ktensor *t = &ctx->out[0];
    rng_params p;
    if (read_params(ctx, 0.0, 1.0, true, &p) != EM_OK) return em_last_status();
    if (!(p.b >= 0.0) || !isfinite(p.a) || !isfinite(p.b))
        return em_set_error(EM_ERR_INVALID,
                            "normal: expects a finite mean and std >= 0, got mean=%g, std=%g",
                            p.a, p.b);
    int64_t n = t->numel, nb = (n + 1) / 2;
    float *y = t->dtype == EM_F32 && t->contiguous ? (float *)t->data : NULL;
#pragma omp parallel for if (n > RANDOM_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        em_philox_block(p.seed, p.offset + (uint64_t)b, w);
        int64_t i0 = 2 * b, m = min64(2, n - i0);
        for (int64_t j = 0; j < m; j++) {
            double v = p.a + p.b * box_muller(w[2 * j], w[2 * j + 1]);
            if (y)
                y[i0 + j] = (float)v;
            else
                store(t, i0 + j, v);
        }
    }
    return EM_OK;
}

/* ---- bernoulli ---------------------------------------------------------------------------- */

/* The hi and lo 32-bit halves of a * m in each 32-bit lane of a (m: a constant in the low
 * half of each 64-bit lane). */
__attribute__((target("avx512f"))) static inline void philox_mul16(__m512i a, __m512i m,
                                                                   __m512i *hi, __m512i *lo) {
    __m512i pe = _mm512_mul_epu32(a, m);                        /* lanes 0, 2, ...: 64 bits */
    __m512i po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m); /* lanes 1, 3, ... */
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);
    *lo = _mm512_mask_blend_epi32(0xAAAA, pe, _mm512_slli_epi64(po, 32));
}

/* keep[0 .. 64): the decisions (w >> 8) < t of the 4 words of each of blocks b0 .. b0 + 15
 * (em_philox_block's words, in order). */
__attribute__((target("avx512f"))) static void philox_keep64(uint64_t seed, uint64_t b0,
                                                             uint32_t t, uint8_t *keep) {
    const __m512i lanes = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32((int)(uint32_t)b0), lanes);
    __m512i hi = _mm512_set1_epi32((int)(uint32_t)(b0 >> 32));
    /* the counter's high word, plus one in the lanes whose low word wrapped */
    __m512i c1 = _mm512_mask_add_epi32(hi, _mm512_cmplt_epu32_mask(c0, lanes), hi,
                                       _mm512_set1_epi32(1));
    __m512i c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    const __m512i m0 = _mm512_set1_epi64(0xD2511F53u), m1 = _mm512_set1_epi64(0xCD9E8D57u);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        __m512i h0, l0, h1, l1;
        philox_mul16(c0, m0, &h0, &l0);
        philox_mul16(c2, m1, &h1, &l1);
        c0 = _mm512_xor_si512(_mm512_xor_si512(h1, c1), _mm512_set1_epi32((int)k0));
        c2 = _mm512_xor_si512(_mm512_xor_si512(h0, c3), _mm512_set1_epi32((int)k1));
        c1 = l1;
        c3 = l0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    /* byte 4 l + i of the result: word i of block l */
    const __m512i tv = _mm512_set1_epi32((int)t), one = _mm512_set1_epi32(1);
    __m512i v = _mm512_maskz_mov_epi32(_mm512_cmplt_epu32_mask(_mm512_srli_epi32(c0, 8), tv), one);
    v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_maskz_mov_epi32(
                               _mm512_cmplt_epu32_mask(_mm512_srli_epi32(c1, 8), tv), one), 8));
    v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_maskz_mov_epi32(
                               _mm512_cmplt_epu32_mask(_mm512_srli_epi32(c2, 8), tv), one), 16));
    v = _mm512_or_si512(v, _mm512_slli_epi32(_mm512_maskz_mov_epi32(
                               _mm512_cmplt_epu32_mask(_mm512_srli_epi32(c3, 8), tv), one), 24));
    _mm512_storeu_si512(keep, v);
}

/* The same on AVX2 (cpu_nn_has_avx2): blocks b0 .. b0 + 15 as two independent sets of 8 (one
 * per 256-bit register, interleaved so that each round's multiplies overlap), the products by
 * _mm256_mul_epu32 as above. The decisions compare signed words: w >> 8 and t are both below
 * 2^31. */
__attribute__((target("avx2"))) static inline void philox_mul8(__m256i a, __m256i m, __m256i *hi,
                                                                __m256i *lo) {
    __m256i pe = _mm256_mul_epu32(a, m);
    __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA);
    *lo = _mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA);
}

/* The 32 decisions (w >> 8) < t of 8 blocks' words c0 .. c3 (one block a lane), as bytes:
 * byte 4 l + i is word i of block l. */
__attribute__((target("avx2"))) static inline __m256i philox_keep_bytes8(__m256i c0, __m256i c1,
                                                                       __m256i c2, __m256i c3,
                                                                       __m256i tv) {
    const __m256i one = _mm256_set1_epi32(1);
    __m256i v = _mm256_and_si256(_mm256_cmpgt_epi32(tv, _mm256_srli_epi32(c0, 8)), one);
    v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(
                               _mm256_cmpgt_epi32(tv, _mm256_srli_epi32(c1, 8)), one), 8));
    v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(
                               _mm256_cmpgt_epi32(tv, _mm256_srli_epi32(c2, 8)), one), 16));
    return _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(
                                  _mm256_cmpgt_epi32(tv, _mm256_srli_epi32(c3, 8)), one), 24));
}

/* The counter words (low, high) of blocks b0 + base .. b0 + base + 7: the high word plus one in
 * the lanes whose low word wrapped (an unsigned compare, through the sign bit). */
__attribute__((target("avx2"))) static inline void philox_ctr8(uint64_t b0, int base,
                                                               __m256i *lo, __m256i *hi) {
    const __m256i lanes = _mm256_setr_epi32(base, base + 1, base + 2, base + 3, base + 4,
                                            base + 5, base + 6, base + 7);
    const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)b0), lanes);
    __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(lanes, sign),
                                         _mm256_xor_si256(c0, sign)); /* c0 < lanes */
    *lo = c0;
    *hi = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(b0 >> 32)), wrapped);
}

__attribute__((target("avx2"))) static void philox_keep64_avx2(uint64_t seed, uint64_t b0,
                                                               uint32_t t, uint8_t *keep) {
    __m256i a0, a1, b0w, b1;
    philox_ctr8(b0, 0, &a0, &a1);
    philox_ctr8(b0, 8, &b0w, &b1);
    __m256i a2 = _mm256_setzero_si256(), a3 = a2, b2 = a2, b3 = a2;
    const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int r = 0; r < 10; r++) {
        __m256i ha0, la0, ha1, la1, hb0, lb0, hb1, lb1;
        const __m256i kv0 = _mm256_set1_epi32((int)k0), kv1 = _mm256_set1_epi32((int)k1);
        philox_mul8(a0, m0, &ha0, &la0);
        philox_mul8(a2, m1, &ha1, &la1);
        philox_mul8(b0w, m0, &hb0, &lb0);
        philox_mul8(b2, m1, &hb1, &lb1);
        a0 = _mm256_xor_si256(_mm256_xor_si256(ha1, a1), kv0);
        a2 = _mm256_xor_si256(_mm256_xor_si256(ha0, a3), kv1);
        a1 = la1;
        a3 = la0;
        b0w = _mm256_xor_si256(_mm256_xor_si256(hb1, b1), kv0);
        b2 = _mm256_xor_si256(_mm256_xor_si256(hb0, b3), kv1);
        b1 = lb1;
        b3 = lb0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    const __m256i tv = _mm256_set1_epi32((int)t);
    _mm256_storeu_si256((__m256i *)keep, philox_keep_bytes8(a0, a1, a2, a3, tv));
    _mm256_storeu_si256((__m256i *)(keep + 32), philox_keep_bytes8(b0w, b1, b2, b3, tv));
}

uint32_t cpu_philox_threshold(double p) {
    return p >= 1 ? 1u << 24 : p > 0 ? (uint32_t)ceil(p * 16777216.0) : 0;
}

void cpu_philox_keep(uint64_t seed, uint64_t offset, uint64_t e0, int64_t n, uint32_t t,
                     uint8_t *keep) {
    int64_t j = 0;
    uint32_t w[4];
    /* scalar up to a block boundary, 64 at a time, then the rest */
    for (; j < n && (e0 + (uint64_t)j) % 4; j++) {
        uint64_t e = e0 + (uint64_t)j;
        em_philox_block(seed, offset + e / 4, w);
        keep[j] = (w[e % 4] >> 8) < t;
    }
    if (cpu_nn_has_avx512())
        for (; j + 64 <= n; j += 64)
            philox_keep64(seed, offset + (e0 + (uint64_t)j) / 4, t, keep + j);
    else if (cpu_nn_has_avx2())
        for (; j + 64 <= n; j += 64)
            philox_keep64_avx2(seed, offset + (e0 + (uint64_t)j) / 4, t, keep + j);
    for (; j < n; j++) {
        uint64_t e = e0 + (uint64_t)j;
        if (j == 0 || e % 4 == 0) em_philox_block(seed, offset + e / 4, w);
        keep[j] = (w[e % 4] >> 8) < t;
    }
}

/* Every dtype reads the 4-per-block f32 stream: element i is 1 when u_i < p. */
static em_status cpu_bernoulli(const em_kernel_ctx *ctx) {
    const em_ktensor *t = &ctx->out[0];
    rng_params p;
    if (read_params(ctx, 0.5, 0.0, false, &p) != EM_OK) return em_last_status();
    if (!(p.a >= 0.0 && p.a <= 1.0))
        return em_set_error(EM_ERR_INVALID, "bernoulli: expects 0 <= p <= 1, got p=%g", p.a);
    int64_t n = t->numel, nb = (n + 3) / 4;
    if (t->contiguous && (t->dtype == EM_BOOL || t->dtype == EM_U8 || t->dtype == EM_F32)) {
        /* chunks of whole blocks, each's decisions from cpu_philox_keep (f32: as bytes on the
         * stack, then 0.0f / 1.0f) */
        enum { CHUNK = 1 << 12 };
        uint32_t thr = cpu_philox_threshold(p.a);
        bool bytes = t->dtype != EM_F32;
#pragma omp parallel for if (n > RANDOM_PAR_MIN)
        for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++) {
            int64_t i0 = c * CHUNK, m = min64(CHUNK, n - i0);
            uint8_t buf[CHUNK], *keep = bytes ? (uint8_t *)t->data + i0 : buf;
            cpu_philox_keep(p.seed, p.offset, (uint64_t)i0, m, thr, keep);
            if (!bytes) {
                float *y = (float *)t->data + i0;
#pragma omp simd
                for (int64_t j = 0; j < m; j++) y[j] = keep[j] ? 1.0f : 0.0f;
            }
        }
        return EM_OK;
    }
#pragma omp parallel for if (n > RANDOM_PAR_MIN)
    for (int64_t b = 0; b < nb; b++) {
        uint32_t w[4];
        em_philox_block(p.seed, p.offset + (uint64_t)b, w);
        int64_t i0 = 4 * b, m = min64(4, n - i0);
        for (int64_t j = 0; j < m; j++)
            store(t, i0 + j, (double)u24(w[j]) < p.a ? 1.0 : 0.0);
    }
    return EM_OK;
}

/* ---- randperm ----------------------------------------------------------------------------- */

/* The Fisher-Yates shuffle of ember/random.h, one draw after the other (each swap depends on
 * the ones before it). A strided output is shuffled in kernel workspace and then stored. */
static em_status cpu_randperm(const em_kernel_ctx *ctx) {
    const em_ktensor *t = &ctx->out[0];
    /* randperm has only the two attributes seed and offset. */
    uint64_t seed = (uint64_t)attr_int(ctx, 0, 0), offset = (uint64_t)attr_int(ctx, 1, 0);
    int64_t n = t->numel;
    bool direct = t->contiguous && t->dtype == EM_I64;
    int64_t *v = direct ? (int64_t *)t->data : cpu_scratch(ctx, (size_t)n * sizeof *v);
    if (!v) return em_last_status(); /* "randperm: out of memory for ... kernel workspace" */
    for (int64_t i = 0; i < n; i++) v[i] = i;
    uint32_t w[4];
    for (int64_t k = 0; k + 1 < n; k++) {
        if (k % 4 == 0) em_philox_block(seed, offset + (uint64_t)(k / 4), w);
        int64_t i = n - 1 - k;
        int64_t j = (int64_t)(((uint64_t)w[k % 4] * (uint64_t)(i + 1)) >> 32);
        int64_t x = v[i];
        v[i] = v[j];
        v[j] = x;
    }
    if (!direct) {
        for (int64_t i = 0; i < n; i++) {
            int64_t off = t->contiguous ? i : cpu_offset(t->ndim, t->shape, t->strides, i);
            if (t->dtype == EM_I64)
                ((int64_t *)t->data)[off] = v[i];
            else
                ((int32_t *)t->data)[off] = (int32_t)v[i];
        }
    }
    return EM_OK;
}

/* ---- registration ------------------------------------------------------------------------- */

em_status cpu_register_random(em_registry *r) {
    static const em_dtype floating[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    static const em_dtype all[] = {EM_F32, EM_F64, EM_F16, EM_BF16,
                                   EM_I32, EM_I64, EM_U8,  EM_BOOL};
    em_status s = cpu_register_kernels(r, "uniform", floating, 4, cpu_uniform, "cpu_uniform");
    if (s == EM_OK)
        s = cpu_register_kernels(r, "normal", floating, 4, cpu_normal, "cpu_normal");
    if (s == EM_OK)
        s = cpu_register_kernels(r, "bernoulli", all, 8, cpu_bernoulli, "cpu_bernoulli");
    if (s == EM_OK)
        s = cpu_register_kernels(r, "randperm", (const em_dtype[]){EM_I64, EM_I32}, 2,
                                 cpu_randperm, "cpu_randperm");
    return s;
}
