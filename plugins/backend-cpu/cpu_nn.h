/*
 * cpu_nn.h — private to the CPU backend's nn family (cpu_nn.c, cpu_nn_dnnl.c): the geometry
 * of a convolution, pooling, layer_norm or softmax call read from its kernel context (the
 * contracts are in core/ops_nn.c), shared by the plain loops and the oneDNN kernels.
 */
#ifndef EMBER_CPU_NN_H
#define EMBER_CPU_NN_H

#include <string.h>

#include "cpu.h"

#define EM_CPU_MIN(a, b) ((a) < (b) ? (a) : (b))
#define EM_CPU_MAX(a, b) ((a) > (b) ? (a) : (b))

/* A convolution's geometry, from x (N, C, H, W), w (O, C/g, kH, kW), y (N, O, OH, OW) and the
 * attributes stride, padding, dilation, groups. */
typedef struct nn_conv {
    int64_t N, C, H, W, O, kh, kw, OH, OW, sh, sw, ph, pw, dh, dw, g;
} nn_conv;

static inline nn_conv nn_conv_geom(const em_ktensor *x, const em_ktensor *w, const em_ktensor *y,
                                   const em_attr *a) {
    return (nn_conv){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                     .O = w->shape[0], .kh = w->shape[2], .kw = w->shape[3],
                     .OH = y->shape[2], .OW = y->shape[3], .sh = a[0].ints[0],
                     .sw = a[0].ints[1], .ph = a[1].ints[0], .pw = a[1].ints[1],
                     .dh = a[2].ints[0], .dw = a[2].ints[1], .g = a[3].v.i};
}

/* A pooling's geometry from x (N, C, H, W) and y (N, C, OH, OW); max pooling's attributes
 * are kernel, stride, padding, dilation, ceil_mode; average pooling's kernel, stride,
 * padding, ceil_mode, count_include_pad. */
/* Whether a 4-dim tensor's bytes are dense in the order N, H, W, C (size-1 dims ignored):
 * channels-last (a dnnl_nhwc descriptor reads it). A one-channel row-major tensor is both. */
static inline bool nn_dense_nhwc(const em_ktensor *t) {
    if (t->ndim != 4) return false;
    int64_t expect = 1;
    static const int order[4] = {1, 3, 2, 0}; /* innermost first: C, W, H, N */
    for (int i = 0; i < 4; i++) {
        int d = order[i];
        if (t->shape[d] == 0) return true;
        if (t->shape[d] == 1) continue;
        if (t->strides[d] != expect) return false;
        expect *= t->shape[d];
    }
    return true;
}

typedef struct nn_pool {
    int64_t N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
    bool cip;
} nn_pool;

static inline nn_pool nn_pool_geom(const em_ktensor *x, const em_ktensor *y, const em_attr *a,
                                   bool max) {
    return (nn_pool){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
                     .OH = y->shape[2], .OW = y->shape[3], .kh = a[0].ints[0],
                     .kw = a[0].ints[1], .sh = a[1].ints[0], .sw = a[1].ints[1],
                     .ph = a[2].ints[0], .pw = a[2].ints[1], .dh = max ? a[3].ints[0] : 1,
                     .dw = max ? a[3].ints[1] : 1, .cip = !max && a[4].v.b};
}

/* A max pooling call for the range functions: the kernel's context, and whether the window's
 * values are relu's (x <= 0 ? +0 : x, NaN kept): max_pool2d_relu, max_pool2d(relu(x)). */
typedef struct nn_pool_call {
    const em_kernel_ctx *k;
    bool relu;
} nn_pool_call;

/* Elements per normalised row of layer_norm: the product of the last k dims. */
static inline int64_t nn_ln_d(const em_ktensor *x, int k) {
    int64_t d = 1;
    for (int i = x->ndim - k; i < x->ndim; i++) d *= x->shape[i];
    return d;
}

enum { NN_SOFTMAX, NN_LOG_SOFTMAX, NN_SOFTMAX_BWD, NN_LOG_SOFTMAX_BWD };
typedef struct nn_sm {
    const em_kernel_ctx *k;
    int kind, n_in;
    int64_t outer, D, inner;
} nn_sm;

static inline nn_sm nn_sm_geom(const em_kernel_ctx *k) {
    const char *name = em_op_name(k->op);
    nn_sm c = {.k = k, .n_in = k->n_in, .outer = 1, .D = 1, .inner = 1};
    c.kind = strcmp(name, "softmax") == 0            ? NN_SOFTMAX
             : strcmp(name, "log_softmax") == 0      ? NN_LOG_SOFTMAX
             : strcmp(name, "softmax_backward") == 0 ? NN_SOFTMAX_BWD
                                                     : NN_LOG_SOFTMAX_BWD;
    const em_ktensor *x = &k->in[0];
    int d = (int)k->attrs[0].v.i;
    for (int i = 0; i < x->ndim; i++) {
        if (i < d) c.outer *= x->shape[i];
        else if (i == d) c.D = x->shape[i];
        else c.inner *= x->shape[i];
    }
    if (x->numel == 0) c.outer = 0;
    return c;
}

/* AVX-512 paths (cpu_nn_simd.c); call them only when cpu_nn_has_avx512(). */
bool cpu_nn_has_avx512(void);
/* max_pool2d of one plane x (H, W) -> y, idx (OH, OW) with a 2x2 window, stride 2, no padding,
 * dilation 1 (OH, OW as ceil_mode or not made them). relu (here and in the f32 kernels below):
 * pool relu's values of x instead (max_pool2d_relu), the same comparisons. */
void cpu_nn_max_pool2x2_f32(const float *x, int64_t H, int64_t W, float *y, int64_t *idx,
                            int64_t OH, int64_t OW, bool relu);
/* The same for nChw16c: outputs [0, n_ow) of row oh (all 2x2 windows inside the plane) of one
 * block x (H, W, 16) of a blocked tensor, into that row's y, idx (OW, 16): 16 channels a step,
 * the same maxima and plane indices per channel. */
void cpu_nn_max_pool2x2_nchw16c_f32(const float *x, int64_t W, int64_t oh, int64_t n_ow,
                                    float *y, int64_t *idx, bool relu);
/* Its backward for one block when every index lies in its own 2x2 tile: gx's 2 OH x 2 OW tiles
 * (rows W wide) from the blocked gy, idx (OH, OW, 16), each gx element 0 + gy or 0 (the
 * scatter's bits). false (gx partly written) at the first index outside its tile. */
bool cpu_nn_max_pool2x2_bwd_nchw16c_f32(const float *gy, const int64_t *idx, int64_t W,
                                        int64_t OH, int64_t OW, float *gx);
/* The same on AVX2 (8 windows a step; same maxima and indices); call only when
 * cpu_nn_has_avx2() (AVX2 and FMA). */
bool cpu_nn_has_avx2(void);
/* One channels-last 2x2 window (all four positions inside the input): the C-vectors at p00,
 * p00 + C, p00 + WC, p00 + WC + C; maxima into y[0..C), plane indices (base + 0, 1, W or
 * W + 1) into idx. Call only when cpu_nn_has_avx2(). */
void cpu_nn_max_pool2x2_nhwc_f32_avx2(const float *p00, int64_t WC, int64_t C, int64_t base,
                                      int64_t W, float *y, int64_t *idx, bool relu);
void cpu_nn_max_pool2x2_f32_avx2(const float *x, int64_t H, int64_t W, float *y, int64_t *idx,
                                 int64_t OH, int64_t OW, bool relu);
/* The same for a bf16 plane (maxima stored exactly); call only when cpu_nn_has_avx512bw(). */
bool cpu_nn_has_avx512bw(void);
void cpu_nn_max_pool2x2_bf16(const uint16_t *x, int64_t H, int64_t W, uint16_t *y,
                             int64_t *idx, int64_t OH, int64_t OW);
/* The backward of that pooling for a bf16 plane when H = 2 * OH and W = 2 * OW: gx (H, W) from
 * gy, idx (OH, OW), each gx value rounded as cpu_f2b(0 + gy) rounds it. False (gx partly
 * written) when an index lies outside its window; call only when cpu_nn_has_avx512bw(). */
bool cpu_nn_max_pool2x2_bwd_bf16(const uint16_t *gy, const int64_t *idx, int64_t OH, int64_t OW,
                                 uint16_t *gx);
/* y[i] = x[i] rounded to bf16 as cpu_f2b does, for n elements (AVX-512F). */
void cpu_nn_f32_to_bf16(const float *x, uint16_t *y, int64_t n);

/* The oneDNN kernels of the nn family (cpu_nn_dnnl.c), registered above the loops. */
em_status cpu_nn_dnnl_register(em_registry *r);
void cpu_nn_dnnl_shutdown(void);

#endif /* EMBER_CPU_NN_H */
