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
 * pooling (the same maxima and indices as the loops). */
static void max_pool2x2_plane(const float *x, const nn_pool *p, float *y, int64_t *idx) {
    if (cpu_nn_has_avx512())
        cpu_nn_max_pool2x2_f32(x, p->H, p->W, y, idx, p->OH, p->OW);
    else
        cpu_nn_max_pool2x2_f32_avx2(x, p->H, p->W, y, idx, p->OH, p->OW);
}

static void max_pool2x2_planes(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    for (int64_t pl = lo; pl < hi; pl++)
        max_pool2x2_plane((const float *)k->in[0].data + pl * p.H * p.W, &p,
                          (float *)k->out[0].data + pl * p.OH * p.OW,
                          (int64_t *)k->out[1].data + pl * p.OH * p.OW);
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
            max_pool2x2_plane(x, &p, y, idx);
        else
            max_pool_rows_f32(&p, x, y, idx, 0, p.OH);
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

static em_status k_max_pool2d(const em_kernel_ctx *k) {
    if (k->out[0].dtype != EM_BF16 && pool_nhwc(k))
        return k->out[0].dtype == EM_F64 ? max_pool2d_nhwc_f64(k) : max_pool2d_nhwc_f32(k);
    em_status st = cpu_check_dense(k);
    if (st != EM_OK) return st;
    if (k->out[0].dtype == EM_F64) return max_pool2d_f64(k);
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
        nn_parallel(k, p.N * p.C, p.OH * p.OW * 4, max_pool2x2_planes, (void *)k);
        return EM_OK;
    }
    return max_pool2d_f32(k);
}

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

/* ---- registration ------------------------------------------------------------------------------ */

/* cpu_register_kernels with a supports() predicate. */
static em_status register_kernels(em_registry *r, const char *op, const em_dtype *dts, int n,
                                  em_kernel_fn fn, const char *name, em_kernel_supports_fn sup) {
    return cpu_register_kernels_ex(r, op, dts, n, fn, name, sup, 0);
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
        st = register_kernels(r, loops[i].op, dts, 2, loops[i].fn, loops[i].name,
                              pool ? supports_pool : conv ? supports_dense : NULL);
    }
    /* bf16 max pooling: ours (the other bf16 nn kernels are oneDNN's). */
    static const em_dtype bf16[] = {EM_BF16};
    if (st == EM_OK)
        st = register_kernels(r, "max_pool2d", bf16, 1, k_max_pool2d, "cpu_max_pool2d",
                              supports_pool);
    if (st == EM_OK)
        st = register_kernels(r, "max_pool2d_backward", bf16, 1, k_max_pool2d_bwd,
                              "cpu_max_pool2d_backward", supports_pool);
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
