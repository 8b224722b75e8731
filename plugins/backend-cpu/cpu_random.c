/*
 * cpu_random.c — the CPU kernels of the in-place random fills: uniform, normal, bernoulli, and
 * of randperm.
 *
 * Each op has no inputs and one output, the tensor to fill (any strides), and the attributes
 *     uniform:   seed (int), offset (int), lo (float), hi (float)
 *     normal:    seed (int), offset (int), mean (float), std (float)
 *     bernoulli: seed (int), offset (int), p (float)
 * Element i (C order over the output's shape) takes exactly the value that ember/random.h
 * defines for index i of the stream starting at block `offset`. The kernels loop over Philox
 * blocks, computing each block once for the 4 (or 2) elements it feeds, so the split across
 * OpenMP threads cannot change any value.
 *
 * Rounding: values are computed in double and rounded to the output dtype; f16 and bf16 are
 * the f32 result converted with em_f32_to_f16 / em_f32_to_bf16 (as a GPU kernel computing in
 * float would), so an f16 fill holds exactly the f32 fill's values, rounded.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/random.h"
#include "cpu.h"

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

static rng_params read_params(const em_kernel_ctx *ctx, double def_a, double def_b,
                              bool has_b) {
    rng_params p = {
        .seed = (uint64_t)attr_int(ctx, 0, 0),
        .offset = (uint64_t)attr_int(ctx, 1, 0),
        .a = attr_float(ctx, 2, def_a),
        .b = has_b ? attr_float(ctx, 3, def_b) : 0.0,
    };
    return p;
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
    rng_params p = read_params(ctx, 0.0, 1.0, true);
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
    rng_params p = read_params(ctx, 0.0, 1.0, true);
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

/* Every dtype reads the 4-per-block f32 stream: element i is 1 when u_i < p. */
static em_status cpu_bernoulli(const em_kernel_ctx *ctx) {
    const em_ktensor *t = &ctx->out[0];
    rng_params p = read_params(ctx, 0.5, 0.0, false);
    if (!(p.a >= 0.0 && p.a <= 1.0))
        return em_set_error(EM_ERR_INVALID, "bernoulli: expects 0 <= p <= 1, got p=%g", p.a);
    int64_t n = t->numel, nb = (n + 3) / 4;
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
