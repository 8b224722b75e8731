/*
 * cpu_nn.c — CPU kernels of the neural-network ops (conv2d, pooling, batch_norm, layer_norm,
 * softmax and their backward helpers; contracts in core/ops_nn.c).
 *
 * Two layers: plain loops for f32 and f64 (cpu_nn_loops.h, instantiated here per type; conv
 * is im2col + OpenBLAS GEMM; max_pool2d's f32 2x2 / stride 2 case has an AVX-512 path in
 * cpu_nn_simd.c), registered at priority 0; and oneDNN primitives for f32 (cpu_nn_dnnl.c)
 * at priority 10, which decline (supports()) what oneDNN cannot do exactly as PyTorch,
 * falling through to the loops. EMBER_CPU_DISABLE_DNNL=1 in the environment when
 * the plugin registers (em_init) leaves the loops alone, so tests can compare both paths.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_nn.h"

/* fn(ctx, lo, hi) over [0, n), split into one contiguous range per thread when the total
 * work (n * per_item) is worth it; otherwise called once on this thread. */
typedef void (*nn_range_fn)(void *ctx, int64_t lo, int64_t hi);
static void nn_parallel(int64_t n, int64_t per_item, nn_range_fn fn, void *ctx) {
    int nt = em_num_threads();
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
static em_status nn_check_dense(const em_kernel_ctx *k) {
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
        em_status st = nn_check_dense(k);                                                      \
        if (st != EM_OK) return st;                                                            \
        return k->out[0].dtype == EM_F64 ? name##_f64(k) : name##_f32(k);                      \
    }
NN_KERNEL(conv2d_gemm)
NN_KERNEL(conv2d_bwd_data_gemm)
NN_KERNEL(conv2d_bwd_weight_gemm)
NN_KERNEL(max_pool2d_bwd)
NN_KERNEL(avg_pool2d)
NN_KERNEL(avg_pool2d_bwd)
NN_KERNEL(adaptive_avg_pool2d)
NN_KERNEL(batch_norm)
NN_KERNEL(batch_norm_bwd)
NN_KERNEL(layer_norm)
NN_KERNEL(layer_norm_bwd)
NN_KERNEL(softmax_any)
#undef NN_KERNEL

/* max_pool2d: the AVX-512 path for the common 2x2 / stride 2 / no padding f32 pooling. */
static void max_pool2x2_planes(void *ctx, int64_t lo, int64_t hi) {
    const em_kernel_ctx *k = ctx;
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    for (int64_t pl = lo; pl < hi; pl++)
        cpu_nn_max_pool2x2_f32((const float *)k->in[0].data + pl * p.H * p.W, p.H, p.W,
                               (float *)k->out[0].data + pl * p.OH * p.OW,
                               (int64_t *)k->out[1].data + pl * p.OH * p.OW, p.OH, p.OW);
}

static em_status k_max_pool2d(const em_kernel_ctx *k) {
    em_status st = nn_check_dense(k);
    if (st != EM_OK) return st;
    if (k->out[0].dtype == EM_F64) return max_pool2d_f64(k);
    nn_pool p = nn_pool_geom(&k->in[0], &k->out[0], k->attrs, true);
    if (p.kh == 2 && p.kw == 2 && p.sh == 2 && p.sw == 2 && p.ph == 0 && p.pw == 0 &&
        p.dh == 1 && p.dw == 1 && cpu_nn_has_avx512()) {
        nn_parallel(p.N * p.C, p.OH * p.OW * 4, max_pool2x2_planes, (void *)k);
        return EM_OK;
    }
    return max_pool2d_f32(k);
}

/* ---- registration ------------------------------------------------------------------------------ */

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
    for (size_t i = 0; i < sizeof loops / sizeof loops[0] && st == EM_OK; i++)
        st = cpu_register_kernels(r, loops[i].op, dts, 2, loops[i].fn, loops[i].name);
    const char *off = getenv("EMBER_CPU_DISABLE_DNNL");
    if (st == EM_OK && !(off && strcmp(off, "1") == 0)) st = cpu_nn_dnnl_register(r);
    return st;
}

void cpu_shutdown_nn(void) { cpu_nn_dnnl_shutdown(); }
