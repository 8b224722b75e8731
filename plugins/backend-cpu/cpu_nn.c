/*
 * cpu_nn.c — CPU kernels of the neural-network ops (conv2d, pooling, batch_norm, layer_norm,
 * softmax and their backward helpers; contracts in core/ops_nn.c).
 *
 * Two layers: plain loops for f32 and f64 (cpu_nn_loops.h, instantiated here per type; conv
 * is im2col + OpenBLAS GEMM; max_pool2d's f32 2x2 / stride 2 case has AVX-512 and AVX2 paths
 * in cpu_nn_simd.c), registered at priority 0; and oneDNN primitives for f32 and bf16
 * (cpu_nn_dnnl.c) at priority 10, which decline (supports()) what oneDNN cannot do exactly as
 * PyTorch, falling through to the loops. EMBER_CPU_DISABLE_DNNL=1 in the environment when
 * the plugin registers (em_init) leaves the loops alone, so tests can compare both paths.
 * Built with configure --without-onednn, only the loops exist (and bf16 max pooling): every
 * other bf16 nn op takes the core's f32 path.
 *
 * bf16: max_pool2d and its backward are ours (oneDNN's max pooling lacks PyTorch's indices),
 * compared in f32: the 2x2 / stride 2 case by the AVX-512 kernel with bf16 loads widened in
 * registers, others by widening the plane to f32 for the f32 code (the AVX2 2x2 kernel or the
 * loop); the maxima are stored
 * exactly (each is an input value). The backward accumulates a plane in f32 and rounds each
 * element once (AVX-512 rounding, same bits as em_f32_to_bf16); a 2x2 / stride 2 plane whose
 * indices stay in their windows needs no sum and is written in bf16 directly (the same bits,
 * cpu_nn_simd.c). Every other bf16 op
 * has only the oneDNN kernel: where it declines, the dispatcher finds no bf16 kernel and the
 * core reruns the op in f32 (core/ops_nn.c).
 *
 * f32 max_pool2d and its backward also read and write oneDNN's nChw16c storage layout
 * (EM_LAYOUT_NCHW16C, accepts_layouts), so a CNN's activations stay blocked from conv through
 * relu and pooling and back: the plane loop with 16 channels a lane, the 2x2 / stride 2 case
 * in AVX-512 (cpu_nn_simd.c), the same bits as the plain call (docs/performance.md, "Design
 * (a)"). f64 and bf16 read plain tensors only.
 *
 * max_pool2d_relu (max_pool2d(relu(x)), the fused op of core/ops_nn.c) runs the same f32 and
 * f64 kernels on every layout with their relu flag (nn_pool_call, the simd kernels' relu
 * argument): each window value is relu's, computed where it is loaded, so the op reads x once
 * and writes only the pooled outputs — the bits of relu then max_pool2d. bf16 has no kernel
 * (its relu quiets NaN): its calls compose relu and max_pool2d in the core.
 */
#include "config.h" /* EM_HAVE_DNNL */

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu_nn.h"

/* fn(ctx, lo, hi) over [0, n), split into one contiguous range per thread when the total
 * work (n * per_item) is worth it; otherwise called once on this thread. */
typedef void (*nn_range_fn)(void *ctx, int64_t lo, int64_t hi);
static void nn_parallel(const em_kernel_ctx *k, int64_t n, int64_t per_item, nn_range_fn fn,
                        void *ctx) {
    int nt = cpu_threads(k);
    if (n <= 0) return;
    if (nt <= 1 || n < 2 || n * per_item < CPU_GRAIN) {
        fn(ctx, 0, n);
        return;
    }
    if (nt > n) nt = (int)n;
#pragma omp parallel num_threads(nt)
    {
        int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
        int64_t lo = n * t / T, hi = n * (t + 1) / T;
        if (lo < hi) fn(ctx, lo, hi);
    }
}

#define T float
#define S(name) name##_f32
#define GEMM cblas_sgemm
#include "cpu_nn_loops.h"
#undef T
#undef S
#undef GEMM

#define T double
#define S(name) name##_f64
#define GEMM cblas_dgemm
#include "cpu_nn_loops.h"
#undef T
#undef S
#undef GEMM

/* Every operand contiguous (the contract: the public functions make them so); an op called
 * directly with strided inputs gets an error instead of wrong numbers. */
em_status cpu_check_dense(const em_kernel_ctx *k) {
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        if (!t->contiguous)
            return em_set_error(EM_ERR_INVALID, "%s: the CPU kernel needs contiguous operands; "
                                "%s %d is strided (call the em_ function, which copies)",
                                em_op_name(k->op), i < k->n_in ? "input" : "output",
                                i < k->n_in ? i : i - k->n_in);
    }
    return EM_OK;
}

#define NN_KERNEL(name)                                                                        \
    static em_status k_##name(const em_kernel_ctx *k) {                                        \
        em_status st = cpu_check_dense(k);                                                     \
        if (st != EM_OK) return st;                                                            \
        return k->out[0].dtype == EM_F64 ? name##_f64(k) : name##_f32(k);                      \
    }
NN_KERNEL(conv2d_gemm)
NN_KERNEL(conv2d_bwd_data_gemm)
NN_KERNEL(conv2d_bwd_weight_gemm)
NN_KERNEL(avg_pool2d)
NN_KERNEL(avg_pool2d_bwd)
NN_KERNEL(adaptive_avg_pool2d)
NN_KERNEL(batch_norm)
NN_KERNEL(batch_norm_bwd)
NN_KERNEL(layer_norm)
NN_KERNEL(layer_norm_bwd)
NN_KERNEL(softmax_any)
#undef NN_KERNEL

/* max_pool2d: the AVX-512 or AVX2 path for the common 2x2 / stride 2 / no padding f32
 * pooling (the same maxima and indices as the loops); over relu's values when relu. */
static void max_pool2x2_plane(const float *x, const nn_pool *p, float *y, int64_t *idx,
                              bool relu) {
    if (cpu_nn_has_avx512())
        cpu_nn_max_pool2x2_f32(x, p->H, p->W, y, idx, p->OH, p->OW, relu);
    else
        cpu_nn_max_pool2x2_f32_avx2(x, p->H, p->W, y, idx, p->OH, p->OW, relu);
}

static void max_pool2x2_planes(void *ctx, int64_t lo, int64_t hi) {
    const nn_pool_call *c = ctx;
    const em_kernel_ctx *k = c->k;
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    for (int64_t pl = lo; pl < hi; pl++)
        max_pool2x2_plane((const float *)k->in[0].data + pl * p.H * p.W, &p,
                          (float *)k->out[0].data + pl * p.OH * p.OW,
                          (int64_t *)k->out[1].data + pl * p.OH * p.OW, c->relu);
}

/* The 2x2 / stride 2 geometry, on a CPU with one of its vector paths. */
static bool is_pool2x2(const nn_pool *p) {
    return p->kh == 2 && p->kw == 2 && p->sh == 2 && p->sw == 2 && p->ph == 0 && p->pw == 0 &&
           p->dh == 1 && p->dw == 1 && p->W < INT32_MAX && (cpu_nn_has_avx512() || cpu_nn_has_avx2());
}

/* bf16 max_pool2d over planes [lo, hi): each plane widened to f32 and pooled by the f32 code;
 * the maxima are input values, so narrowing them back is exact. A failed allocation marks
 * the call (bad). */
typedef struct bf16_pool_ctx {
    const em_kernel_ctx *k;
    float *buf; /* (nt, H*W + OH*OW) f32 planes, kernel workspace: one per thread */
    int nt;
    atomic_int bad;
} bf16_pool_ctx;

static void max_pool_bf16_planes(void *ctx, int64_t lo, int64_t hi) {
    bf16_pool_ctx *c = ctx;
    const em_kernel_ctx *k = c->k;
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    int64_t HW = p.H * p.W, P = p.OH * p.OW;
    if (is_pool2x2(&p) && cpu_nn_has_avx512bw()) {
        for (int64_t pl = lo; pl < hi; pl++)
            cpu_nn_max_pool2x2_bf16((const uint16_t *)k->in[0].data + pl * HW, p.H, p.W,
                                    (uint16_t *)k->out[0].data + pl * P,
                                    (int64_t *)k->out[1].data + pl * P, p.OH, p.OW);
        return;
    }
    int t = omp_get_thread_num();
    if (t >= c->nt) { /* the thread count grew since the planes were made (set_num_threads) */
        atomic_store(&c->bad, 1);
        return;
    }
    float *x = c->buf + (int64_t)t * (HW + P), *y = x + HW;
    for (int64_t pl = lo; pl < hi; pl++) {
        const uint16_t *xb = (const uint16_t *)k->in[0].data + pl * HW;
        uint16_t *yb = (uint16_t *)k->out[0].data + pl * P;
        int64_t *idx = (int64_t *)k->out[1].data + pl * P;
        for (int64_t i = 0; i < HW; i++) x[i] = cpu_b2f(xb[i]);
        if (is_pool2x2(&p))
            max_pool2x2_plane(x, &p, y, idx, false);
        else
            max_pool_rows_f32(&p, x, y, idx, 0, p.OH, false);
        for (int64_t i = 0; i < P; i++) yb[i] = xb[idx[i]]; /* the winner's own bits (NaN too) */
    }
}

/* Every operand channels-last (x, y and idx, or gy, idx and gx) with at least one not
 * also row-major: the f32/f64 channels-last loops. The backward also reads a row-major gy
 * (NCHW, what a flatten's backward gives) beside channels-last idx and gx, in place. */
static bool pool_nhwc(const em_kernel_ctx *k) {
    bool all_plain = true, bwd = k->n_in == 2;
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        if (!nn_dense_nhwc(t) && !(bwd && i == 0 && t->contiguous)) return false;
        all_plain &= t->contiguous;
    }
    return !all_plain;
}

static bool all_contiguous(const em_kernel_ctx *k) {
    for (int i = 0; i < k->n_in + k->n_out; i++)
        if (!(i < k->n_in ? &k->in[i] : &k->out[i - k->n_in])->contiguous) return false;
    return true;
}

/* The loops' supports(): contiguous operands (a channels-last call the kernels above did not
 * take goes back to the core, which repeats it on contiguous copies); max pooling also takes
 * channels-last f32 and f64. */
static bool supports_dense(const em_kernel_ctx *k) { return all_contiguous(k); }
static bool supports_pool(const em_kernel_ctx *k) {
    return all_contiguous(k) || (k->out[0].dtype != EM_BF16 && pool_nhwc(k));
}

/* max_pool2d, or max_pool2d_relu when relu (f32 and f64 only: bf16 is max_pool2d's). */
static em_status max_pool2d_plain(const em_kernel_ctx *k, bool relu) {
    if (k->out[0].dtype != EM_BF16 && pool_nhwc(k))
        return k->out[0].dtype == EM_F64 ? max_pool2d_nhwc_f64(k, relu)
                                         : max_pool2d_nhwc_f32(k, relu);
    em_status st = cpu_check_dense(k);
    if (st != EM_OK) return st;
    if (k->out[0].dtype == EM_F64) return max_pool2d_f64(k, relu);
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    if (k->out[0].dtype == EM_BF16) {
        bf16_pool_ctx c = {.k = k};
        atomic_init(&c.bad, 0);
        c.nt = cpu_threads(k);
        c.buf = cpu_scratch(k, sizeof(float) * (size_t)c.nt * (size_t)(p.H * p.W + p.OH * p.OW));
        if (!c.buf) return em_last_status();
        nn_parallel(k, p.N * p.C, p.H * p.W + p.OH * p.OW * p.kh * p.kw, max_pool_bf16_planes, &c);
        return atomic_load(&c.bad) ? em_set_error(EM_ERR_INVALID, "max_pool2d: the thread count "
                                                  "changed during the call") : EM_OK;
    }
    if (is_pool2x2(&p)) {
        nn_pool_call c = {.k = k, .relu = relu};
        nn_parallel(k, p.N * p.C, p.OH * p.OW * 4, max_pool2x2_planes, &c);
        return EM_OK;
    }
    return max_pool2d_f32(k, relu);
}

static em_status k_max_pool2d(const em_kernel_ctx *k) { return max_pool2d_plain(k, false); }

/* bf16 max_pool2d_backward: each plane of gx accumulated in f32 (windows may overlap) and
 * rounded once. A gx plane of 2OH x 2OW whose indices each lie in their own 2x2 / stride 2
 * window (what that pooling's forward gives) gets at most one gy per element, written directly
 * in bf16 by the AVX-512 kernel (same bits: cpu_nn_max_pool2x2_bwd_bf16); any other index
 * sends the plane to the f32 accumulation. bad: 1 for an index outside the plane, 2 for a
 * thread without a plane. */
typedef struct bf16_scatter_ctx {
    const em_kernel_ctx *k;
    int64_t HW, P, OH, OW;
    bool pool2x2; /* gx is 2OH x 2OW: each plane tried first by cpu_nn_max_pool2x2_bwd_bf16 */
    float *buf; /* (nt, max(HW, 1)) f32 planes, kernel workspace: one per thread */
    int nt;
    atomic_int bad;
} bf16_scatter_ctx;

static void max_pool_bwd_bf16_planes(void *ctx, int64_t lo, int64_t hi) {
    bf16_scatter_ctx *c = ctx;
    int t = omp_get_thread_num();
    if (t >= c->nt) { /* the thread count grew since the planes were made (set_num_threads) */
        atomic_store(&c->bad, 2);
        return;
    }
    float *acc = c->buf + (int64_t)t * (c->HW > 0 ? c->HW : 1);
    for (int64_t pl = lo; pl < hi; pl++) {
        const uint16_t *gy = (const uint16_t *)c->k->in[0].data + pl * c->P;
        const int64_t *idx = (const int64_t *)c->k->in[1].data + pl * c->P;
        uint16_t *gx = (uint16_t *)c->k->out[0].data + pl * c->HW;
        if (c->pool2x2 && cpu_nn_max_pool2x2_bwd_bf16(gy, idx, c->OH, c->OW, gx)) continue;
        memset(acc, 0, sizeof(float) * (size_t)c->HW);
        for (int64_t i = 0; i < c->P; i++) {
            if (idx[i] < 0 || idx[i] >= c->HW) {
                atomic_store(&c->bad, 1);
                continue;
            }
            acc[idx[i]] += cpu_b2f(gy[i]);
        }
        if (cpu_nn_has_avx512()) cpu_nn_f32_to_bf16(acc, gx, c->HW);
        else
            for (int64_t i = 0; i < c->HW; i++) gx[i] = cpu_f2b(acc[i]);
    }
}

static em_status k_max_pool2d_bwd(const em_kernel_ctx *k) {
    if (k->out[0].dtype != EM_BF16 && pool_nhwc(k))
        return k->out[0].dtype == EM_F64 ? max_pool2d_bwd_f64(k) : max_pool2d_bwd_f32(k);
    em_status st = cpu_check_dense(k);
    if (st != EM_OK) return st;
    if (k->out[0].dtype == EM_F64) return max_pool2d_bwd_f64(k);
    if (k->out[0].dtype == EM_F32) return max_pool2d_bwd_f32(k);
    const em_ktensor *gx = &k->out[0], *gy = &k->in[0];
    bf16_scatter_ctx c = {.k = k, .HW = gx->shape[2] * gx->shape[3],
                          .P = gy->shape[2] * gy->shape[3], .OH = gy->shape[2],
                          .OW = gy->shape[3]};
    c.pool2x2 = gx->shape[2] == 2 * c.OH && gx->shape[3] == 2 * c.OW && c.P > 0 &&
                gx->shape[3] < INT32_MAX - 1 && cpu_nn_has_avx512bw();
    atomic_init(&c.bad, 0);
    c.nt = cpu_threads(k);
    c.buf = cpu_scratch(k, sizeof(float) * (size_t)c.nt * (size_t)(c.HW > 0 ? c.HW : 1));
    if (!c.buf) return em_last_status();
    nn_parallel(k, gx->shape[0] * gx->shape[1], c.HW + c.P, max_pool_bwd_bf16_planes, &c);
    int bad = atomic_load(&c.bad);
    if (bad == 2)
        return em_set_error(EM_ERR_INVALID, "max_pool2d_backward: the thread count changed "
                            "during the call");
    if (bad)
        return em_set_error(EM_ERR_RANGE, "max_pool2d_backward: an index is outside the input "
                            "plane of %lld x %lld", (long long)gx->shape[2],
                            (long long)gx->shape[3]);
    return EM_OK;
}

/* ---- f32 max pooling in nChw16c (EM_LAYOUT_NCHW16C) ------------------------------------------- */

/* A blocked tensor (N, C, H, W) is stored as (N, C/16, H, W, 16): each (n, c/16) block holds an
 * (H, W) plane of 16-channel vectors. Pooling a block is the plane loop (S(max_pool_rows))
 * with every scalar replaced by 16 lanes, the same comparisons in the same window order, so
 * each channel gets the plain call's maximum and index; the indices are i64 blocked at the
 * values' positions. The backward sums each gx element's gy values in the plane loop's order
 * (output positions ascending), so its bits are the plain scatter's. */

/* Whether tensor i of the call is blocked. */
static bool blk(const em_kernel_ctx *k, int i) {
    return EM_KCTX_LAYOUT(k, i) == EM_LAYOUT_NCHW16C;
}

/* Outputs [ow0, OW) of row oh of one block: x the block (H, W, 16), y and idx the output row
 * (OW, 16); over relu's values when relu (a constant in each instance below). */
static inline __attribute__((always_inline)) void
max_pool_blk_row_at(const nn_pool *p, const float *restrict x, float *restrict y,
                    int64_t *restrict idx, int64_t oh, int64_t ow0, bool relu) {
    int64_t hs = oh * p->sh - p->ph, he = EM_CPU_MIN(hs + (p->kh - 1) * p->dh + 1, p->H);
    if (hs < 0) hs += (-hs + p->dh - 1) / p->dh * p->dh;
    for (int64_t ow = ow0; ow < p->OW; ow++) {
        int64_t ws = ow * p->sw - p->pw, we = EM_CPU_MIN(ws + (p->kw - 1) * p->dw + 1, p->W);
        if (ws < 0) ws += (-ws + p->dw - 1) / p->dw * p->dw;
        float *restrict m = y + ow * 16;
        int64_t *restrict b = idx + ow * 16;
        for (int l = 0; l < 16; l++) m[l] = -INFINITY, b[l] = hs * p->W + ws;
        for (int64_t h = hs; h < he; h += p->dh)
            for (int64_t w = ws; w < we; w += p->dw) {
                const float *restrict v = x + (h * p->W + w) * 16;
                const int64_t at = h * p->W + w;
#pragma omp simd
                for (int l = 0; l < 16; l++) {
                    const float u = relu && v[l] <= 0 ? 0.0f : v[l];
                    bool take = (u > m[l]) | (u != u);
                    m[l] = take ? u : m[l];
                    b[l] = take ? at : b[l];
                }
            }
    }
}
SIMD_CLONES static void max_pool_blk_row(const nn_pool *p, const float *restrict x,
                                         float *restrict y, int64_t *restrict idx, int64_t oh,
                                         int64_t ow0) {
    max_pool_blk_row_at(p, x, y, idx, oh, ow0, false);
}
SIMD_CLONES static void max_pool_relu_blk_row(const nn_pool *p, const float *restrict x,
                                              float *restrict y, int64_t *restrict idx,
                                              int64_t oh, int64_t ow0) {
    max_pool_blk_row_at(p, x, y, idx, oh, ow0, true);
}

/* Rows [lo, hi) of the N * C/16 * OH output rows (n, cb, oh). The 2x2 / stride 2 windows
 * that lie inside the plane take the AVX-512 path (the same comparisons), the rest the loop. */
static void max_pool_blk_rows(void *ctx, int64_t lo, int64_t hi) {
    const nn_pool_call *c = ctx;
    const em_kernel_ctx *k = c->k;
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    const bool fast = p.kh == 2 && p.kw == 2 && p.sh == 2 && p.sw == 2 && p.ph == 0 &&
                      p.pw == 0 && p.dh == 1 && p.dw == 1 && cpu_nn_has_avx512();
    const int64_t owf = EM_CPU_MIN(p.W / 2, p.OW); /* 2x2 windows with both columns */
    for (int64_t r = lo; r < hi; r++) {
        int64_t blkno = r / p.OH, oh = r % p.OH;
        const float *x = (const float *)k->in[0].data + blkno * p.H * p.W * 16;
        float *y = (float *)k->out[0].data + r * p.OW * 16;
        int64_t *idx = (int64_t *)k->out[1].data + r * p.OW * 16, ow0 = 0;
        if (fast && 2 * oh + 1 < p.H) {
            cpu_nn_max_pool2x2_nchw16c_f32(x, p.W, oh, owf, y, idx, c->relu);
            ow0 = owf;
        }
        (c->relu ? max_pool_relu_blk_row : max_pool_blk_row)(&p, x, y, idx, oh, ow0);
    }
}

static em_status max_pool2d_blk(const em_kernel_ctx *k, bool relu) {
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    nn_pool_call c = {.k = k, .relu = relu};
    nn_parallel(k, p.N * (p.C / 16) * p.OH, p.OW * 16 * p.kh * p.kw, max_pool_blk_rows, &c);
    return EM_OK;
}

/* The backward's geometry: gx blocks of (H, W, 16), idx blocks of (OH, OW, 16); gy's element
 * (lane l, output position i) of block (n, cb) at gy_block + l gc + i gi: blocked (gc 1, gi 16)
 * or row-major (gc OH OW, gi 1: what a flatten's backward gives), read in place. */
typedef struct blk_scatter_ctx {
    const em_kernel_ctx *k;
    int64_t C, H, W, OH, OW;
    bool gy_blk, tiles;
    atomic_int bad; /* an index outside the plane */
} blk_scatter_ctx;

/* The tiles of one block of the backward of a 2x2 / stride 2 pooling without padding (2 OH <=
 * H, 2 OW <= W): when every index lies in its own output's tile (what that pooling's forward
 * gives), each gx element receives at most one gy, written directly — 0 + gy at the winner
 * (the scatter's sum: -0 becomes +0 as there), 0 elsewhere — with no zeroing pass and no
 * scatter. false (gx partly written) when an index lies elsewhere: the caller then runs the
 * scatter, which rewrites the whole block. */
static inline __attribute__((always_inline)) bool
pool2x2_bwd_blk(const float *restrict gy, int64_t gc, int64_t gi, const int64_t *restrict idx,
                int64_t W, int64_t OH, int64_t OW, float *restrict gx) {
    for (int64_t oh = 0; oh < OH; oh++) {
        for (int64_t ow = 0; ow < OW; ow++) {
            const int64_t i = oh * OW + ow, a = 2 * oh * W + 2 * ow;
            const int64_t *restrict id = idx + i * 16;
            const float *restrict g = gy + i * gi;
            float *restrict x00 = gx + a * 16, *restrict x01 = x00 + 16,
                            *restrict x10 = x00 + W * 16, *restrict x11 = x10 + 16;
            int64_t bad = 0;
#pragma omp simd reduction(|:bad)
            for (int l = 0; l < 16; l++) {
                const int64_t at = id[l];
                const float v = 0.0f + g[l * gc], z = 0;
                x00[l] = at == a ? v : z;
                x01[l] = at == a + 1 ? v : z;
                x10[l] = at == a + W ? v : z;
                x11[l] = at == a + W + 1 ? v : z;
                bad |= (at != a) & (at != a + 1) & (at != a + W) & (at != a + W + 1);
            }
            if (bad) return false;
        }
    }
    return true;
}

/* The two grads' instances: gy's 16 channels contiguous (one vector load) or OH OW apart. */
SIMD_CLONES static bool pool2x2_bwd_blk_gy_blk(const float *restrict gy,
                                               const int64_t *restrict idx, int64_t W,
                                               int64_t OH, int64_t OW, float *restrict gx) {
    return pool2x2_bwd_blk(gy, 1, 16, idx, W, OH, OW, gx);
}
SIMD_CLONES static bool pool2x2_bwd_blk_gy_rm(const float *restrict gy,
                                              const int64_t *restrict idx, int64_t W,
                                              int64_t OH, int64_t OW, float *restrict gx) {
    return pool2x2_bwd_blk(gy, OH * OW, 1, idx, W, OH, OW, gx);
}

/* The tiles of one block (a blocked gy in AVX-512 where the CPU has it: the same values), then
 * the last column and row no tile covers (W or H odd) set to 0. */
static bool pool2x2_bwd_blk_tiles(const blk_scatter_ctx *c, const float *gy, const int64_t *idx,
                                  float *gx) {
    const int64_t H = c->H, W = c->W, OH = c->OH, OW = c->OW;
    bool ok = c->gy_blk ? (cpu_nn_has_avx512()
                               ? cpu_nn_max_pool2x2_bwd_nchw16c_f32(gy, idx, W, OH, OW, gx)
                               : pool2x2_bwd_blk_gy_blk(gy, idx, W, OH, OW, gx))
                        : pool2x2_bwd_blk_gy_rm(gy, idx, W, OH, OW, gx);
    if (!ok) return false;
    if (W > 2 * OW)
        for (int64_t h = 0; h < 2 * OH; h++)
            memset(gx + (h * W + 2 * OW) * 16, 0, sizeof(float) * (size_t)((W - 2 * OW) * 16));
    if (H > 2 * OH)
        memset(gx + 2 * OH * W * 16, 0, sizeof(float) * (size_t)((H - 2 * OH) * W * 16));
    return true;
}

/* Blocks [lo, hi) of the N * C/16 blocks of gx. */
static void max_pool_bwd_blk(void *ctx, int64_t lo, int64_t hi) {
    blk_scatter_ctx *c = ctx;
    const int64_t HW = c->H * c->W, P = c->OH * c->OW, CB = c->C / 16;
    const int64_t gc = c->gy_blk ? 1 : P, gi = c->gy_blk ? 16 : 1;
    for (int64_t b = lo; b < hi; b++) {
        const int64_t n = b / CB, cb = b % CB;
        const float *gy = (const float *)c->k->in[0].data +
                          (c->gy_blk ? b * P * 16 : (n * c->C + cb * 16) * P);
        const int64_t *idx = (const int64_t *)c->k->in[1].data + b * P * 16;
        float *gx = (float *)c->k->out[0].data + b * HW * 16;
        if (c->tiles && pool2x2_bwd_blk_tiles(c, gy, idx, gx)) continue;
        memset(gx, 0, sizeof(float) * (size_t)(HW * 16));
        for (int64_t i = 0; i < P; i++)
            for (int l = 0; l < 16; l++) {
                const int64_t at = idx[i * 16 + l];
                if (at < 0 || at >= HW) {
                    atomic_store(&c->bad, 1);
                    continue;
                }
                gx[at * 16 + l] += gy[i * gi + l * gc];
            }
    }
}

static em_status max_pool2d_bwd_blk(const em_kernel_ctx *k) {
    const em_ktensor *gx = &k->out[0], *gy = &k->in[0];
    blk_scatter_ctx c = {.k = k, .C = gx->shape[1], .H = gx->shape[2], .W = gx->shape[3],
                         .OH = gy->shape[2], .OW = gy->shape[3], .gy_blk = blk(k, 0)};
    c.tiles = c.OH > 0 && c.OW > 0 && 2 * c.OH <= c.H && 2 * c.OW <= c.W;
    atomic_init(&c.bad, 0);
    nn_parallel(k, gx->shape[0] * (c.C / 16), (c.H * c.W + c.OH * c.OW) * 16, max_pool_bwd_blk,
                &c);
    if (atomic_load(&c.bad))
        return em_set_error(EM_ERR_RANGE, "max_pool2d_backward: an index is outside the input "
                            "plane of %lld x %lld", (long long)c.H, (long long)c.W);
    return EM_OK;
}

/* The f32 kernels' supports(): the plain and channels-last calls as supports_pool; a call
 * with a blocked tensor only as the blocked loops read it — the forward with x, y and idx
 * blocked; the backward with idx and gx blocked and gy blocked or row-major. Any other mix is
 * declined (the core converts the call to plain and runs it again). */
static bool supports_pool_f32(const em_kernel_ctx *k) {
    bool any = false;
    for (int i = 0; i < k->n_in + k->n_out; i++) any |= blk(k, i);
    if (!any) return supports_pool(k);
    if (k->n_in == 1) return blk(k, 0) && blk(k, 1) && blk(k, 2);
    return blk(k, 1) && blk(k, 2) && (blk(k, 0) || k->in[0].contiguous);
}

static em_status k_max_pool2d_f32(const em_kernel_ctx *k) {
    return blk(k, 0) ? max_pool2d_blk(k, false) : max_pool2d_plain(k, false);
}
/* max_pool2d_relu: max_pool2d's kernels over relu's values, on the same layouts. */
static em_status k_max_pool2d_relu_f32(const em_kernel_ctx *k) {
    return blk(k, 0) ? max_pool2d_blk(k, true) : max_pool2d_plain(k, true);
}
static em_status k_max_pool2d_relu(const em_kernel_ctx *k) { return max_pool2d_plain(k, true); }
static em_status k_max_pool2d_bwd_f32(const em_kernel_ctx *k) {
    return blk(k, 1) ? max_pool2d_bwd_blk(k) : k_max_pool2d_bwd(k);
}

/* ---- registration ------------------------------------------------------------------------------ */

/* cpu_register_kernels with a supports() predicate and the storage layouts fn reads
 * (accepts_layouts). */
static em_status register_kernels(em_registry *r, const char *op, const em_dtype *dts, int n,
                                  em_kernel_fn fn, const char *name, em_kernel_supports_fn sup,
                                  unsigned accepts) {
    return cpu_register_kernels_ex(r, op, dts, n, fn, name, sup, accepts);
}

em_status cpu_register_nn(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64};
    static const struct {
        const char *op;
        em_kernel_fn fn;
        const char *name;
    } loops[] = {
        {"conv2d", k_conv2d_gemm, "cpu_conv2d_im2col"},
        {"conv2d_backward_data", k_conv2d_bwd_data_gemm, "cpu_conv2d_backward_data_col2im"},
        {"conv2d_backward_weight", k_conv2d_bwd_weight_gemm, "cpu_conv2d_backward_weight_im2col"},
        {"max_pool2d", k_max_pool2d, "cpu_max_pool2d"},
        {"max_pool2d_backward", k_max_pool2d_bwd, "cpu_max_pool2d_backward"},
        {"avg_pool2d", k_avg_pool2d, "cpu_avg_pool2d"},
        {"avg_pool2d_backward", k_avg_pool2d_bwd, "cpu_avg_pool2d_backward"},
        {"adaptive_avg_pool2d", k_adaptive_avg_pool2d, "cpu_adaptive_avg_pool2d"},
        {"adaptive_avg_pool2d_backward", k_adaptive_avg_pool2d, "cpu_adaptive_avg_pool2d_backward"},
        {"batch_norm", k_batch_norm, "cpu_batch_norm"},
        {"batch_norm_backward", k_batch_norm_bwd, "cpu_batch_norm_backward"},
        {"layer_norm", k_layer_norm, "cpu_layer_norm"},
        {"layer_norm_backward", k_layer_norm_bwd, "cpu_layer_norm_backward"},
        {"softmax", k_softmax_any, "cpu_softmax"},
        {"log_softmax", k_softmax_any, "cpu_log_softmax"},
        {"softmax_backward", k_softmax_any, "cpu_softmax_backward"},
        {"log_softmax_backward", k_softmax_any, "cpu_log_softmax_backward"},
    };
    em_status st = EM_OK;
    /* The ops that may be called with channels-last operands (EM_OP_CHANNELS_LAST, core/
     * ops_nn.c): their loops say what they take; the others keep the error of
     * cpu_check_dense for a strided call. */
    for (size_t i = 0; i < sizeof loops / sizeof loops[0] && st == EM_OK; i++) {
        bool pool = strncmp(loops[i].op, "max_pool2d", 10) == 0;
        bool conv = strncmp(loops[i].op, "conv2d", 6) == 0;
        if (pool) { /* f64: dts + 1 */
            st = register_kernels(r, loops[i].op, dts + 1, 1, loops[i].fn, loops[i].name,
                                  supports_pool, 0);
            continue;
        }
        st = register_kernels(r, loops[i].op, dts, 2, loops[i].fn, loops[i].name,
                              conv ? supports_dense : NULL, 0);
    }
    /* f32 max pooling also reads and writes nChw16c (the loops above). */
    if (st == EM_OK)
        st = register_kernels(r, "max_pool2d", dts, 1, k_max_pool2d_f32, "cpu_max_pool2d",
                              supports_pool_f32, CPU_NCHW16C);
    if (st == EM_OK)
        st = register_kernels(r, "max_pool2d_backward", dts, 1, k_max_pool2d_bwd_f32,
                              "cpu_max_pool2d_backward", supports_pool_f32, CPU_NCHW16C);
    /* max_pool2d_relu, the fused op: max_pool2d's loops with relu on the fly, with the same
     * supports() and layouts (f32: nChw16c too; f64: plain and channels-last). */
    if (st == EM_OK)
        st = register_kernels(r, "max_pool2d_relu", dts, 1, k_max_pool2d_relu_f32,
                              "cpu_max_pool2d_relu", supports_pool_f32, CPU_NCHW16C);
    if (st == EM_OK)
        st = register_kernels(r, "max_pool2d_relu", dts + 1, 1, k_max_pool2d_relu,
                              "cpu_max_pool2d_relu", supports_pool, 0);
    /* bf16 max pooling: ours (the other bf16 nn kernels are oneDNN's). */
    static const em_dtype bf16[] = {EM_BF16};
    if (st == EM_OK)
        st = register_kernels(r, "max_pool2d", bf16, 1, k_max_pool2d, "cpu_max_pool2d",
                              supports_pool, 0);
    if (st == EM_OK)
        st = register_kernels(r, "max_pool2d_backward", bf16, 1, k_max_pool2d_bwd,
                              "cpu_max_pool2d_backward", supports_pool, 0);
#ifdef EM_HAVE_DNNL
    const char *off = getenv("EMBER_CPU_DISABLE_DNNL");
    if (st == EM_OK && !(off && strcmp(off, "1") == 0)) st = cpu_nn_dnnl_register(r);
#endif
    return st;
}

void cpu_shutdown_nn(void) {
#ifdef EM_HAVE_DNNL
    cpu_nn_dnnl_shutdown();
#endif
}
