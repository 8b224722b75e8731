/*
 * cuda_nn.cu — the CNN ops' own CUDA kernels (contracts in core/ops_nn.c; the CPU's loops in
 * plugins/backend-cpu/cpu_nn_loops.h, whose arithmetic these follow):
 *   - conv2d, conv2d_backward_data, conv2d_backward_weight, direct: every output one double
 *     sum in a fixed order. The f64 kernels (cuDNN's engines are for f32/f16/bf16), the
 *     kernels under the cuDNN ones (cuda_conv.c) in each stack, which those run for calls no
 *     cuDNN engine takes, and the bias and bias-gradient steps of the cuDNN kernels;
 *   - max_pool2d, avg_pool2d, adaptive_avg_pool2d and their backward ops;
 *   - batch_norm (training with running statistics, eval) and batch_norm_backward.
 * Pooling and batch norm are ours, not cuDNN's: cuDNN 9 deprecates its legacy pooling and
 * normalisation calls, its graph API's resample and norm operations do not give PyTorch's
 * max-pooling indices, ceil_mode or count_include_pad divisors as the CPU defines them, and
 * these are memory-bound loops that a plain kernel runs at bandwidth anyway. They are
 * deterministic (no atomics) and give the CPU's numbers: max pooling and the pooling backward
 * ops add in the CPU's order (bitwise the CPU's for f32 and f64), the sums of avg pooling
 * and batch norm are in double.
 *
 * f16 and bf16 compute in float and round once (what the core's f32 path gives on the CPU);
 * the norms' statistics are f32 for them (S, core/ops_nn.c). Operands must be contiguous (the
 * public functions make them so); strided ones get an error. The index arithmetic is in
 * cuda_nn_index.h, which tests/test_cuda_nn_index.c checks here against brute force and the
 * CPU kernels.
 */
#include "cuda_kernels.cuh"
#include "cuda_nn_index.h" /* the index arithmetic, tested without a GPU */

/* Every operand contiguous, or the error saying which is not. */
static em_status nn_dense(const em_kernel_ctx *k) {
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        if (!t->contiguous)
            return em_set_error(EM_ERR_INVALID, "%s: the CUDA kernel needs contiguous operands; "
                                "%s %d is strided (call the em_ function, which copies)",
                                em_op_name(k->op), i < k->n_in ? "input" : "output",
                                i < k->n_in ? i : i - k->n_in);
    }
    return EM_OK;
}

#define NN_LOOP(i, n)                                                                          \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                     \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- convolution, direct --------------------------------------------------------------------- */

struct cv_geom {
    int64_t N, C, H, W, O, kh, kw, OH, OW, sh, sw, ph, pw, dh, dw, g;
};

/* x (N, C, H, W), w (O, C/g, kH, kW), y (N, O, OH, OW); attrs stride, padding, dilation, groups. */
static cv_geom cv_make(const em_ktensor *x, const em_ktensor *w, const em_ktensor *y,
                       const em_attr *a) {
    cv_geom g;
    g.N = x->shape[0], g.C = x->shape[1], g.H = x->shape[2], g.W = x->shape[3];
    g.O = w->shape[0], g.kh = w->shape[2], g.kw = w->shape[3];
    g.OH = y->shape[2], g.OW = y->shape[3];
    g.sh = a[0].ints[0], g.sw = a[0].ints[1], g.ph = a[1].ints[0], g.pw = a[1].ints[1];
    g.dh = a[2].ints[0], g.dw = a[2].ints[1], g.g = a[3].v.i;
    return g;
}

template <class T>
__global__ void conv_fwd_k(cv_geom g, const T *x, const T *w, const T *b, bool has_b, T *y) {
    typedef typename ck_tr<T>::F CT;
    int64_t Cg = g.C / g.g, Og = g.O / g.g;
    NN_LOOP(i, g.N * g.O * g.OH * g.OW) {
        int64_t ow = i % g.OW, t = i / g.OW, oh = t % g.OH;
        t /= g.OH;
        int64_t o = t % g.O, n = t / g.O, q = o / Og;
        double acc = 0;
        for (int64_t c = 0; c < Cg; c++) {
            const T *xp = x + (n * g.C + q * Cg + c) * g.H * g.W;
            const T *wp = w + (o * Cg + c) * g.kh * g.kw;
            for (int64_t a = 0; a < g.kh; a++) {
                int64_t ih = oh * g.sh - g.ph + a * g.dh;
                if (ih < 0 || ih >= g.H) continue;
                for (int64_t bb = 0; bb < g.kw; bb++) {
                    int64_t iw = ow * g.sw - g.pw + bb * g.dw;
                    if (iw < 0 || iw >= g.W) continue;
                    acc += (double)ck_f(xp[ih * g.W + iw]) * (double)ck_f(wp[a * g.kw + bb]);
                }
            }
        }
        CT r = (CT)acc;
        if (has_b) r = r + (CT)ck_f(b[o]);
        y[i] = ck_from<T>(r);
    }
}

template <class T>
__global__ void conv_bwd_data_k(cv_geom g, const T *gy, const T *w, T *gx) {
    typedef typename ck_tr<T>::F CT;
    int64_t Cg = g.C / g.g, Og = g.O / g.g;
    NN_LOOP(i, g.N * g.C * g.H * g.W) {
        int64_t iw = i % g.W, t = i / g.W, ih = t % g.H;
        t /= g.H;
        int64_t c = t % g.C, n = t / g.C, q = c / Cg, cc = c % Cg;
        double acc = 0;
        for (int64_t o = q * Og; o < (q + 1) * Og; o++) {
            const T *gp = gy + (n * g.O + o) * g.OH * g.OW;
            const T *wp = w + (o * Cg + cc) * g.kh * g.kw;
            for (int64_t a = 0; a < g.kh; a++) {
                int64_t oh = cnn_conv_output_of(ih, a, g.sh, g.ph, g.dh, g.OH);
                if (oh < 0) continue;
                for (int64_t bb = 0; bb < g.kw; bb++) {
                    int64_t ow = cnn_conv_output_of(iw, bb, g.sw, g.pw, g.dw, g.OW);
                    if (ow < 0) continue;
                    acc += (double)ck_f(gp[oh * g.OW + ow]) * (double)ck_f(wp[a * g.kw + bb]);
                }
            }
        }
        gx[i] = ck_from<T>((CT)acc);
    }
}

/* One block per weight element: the sum over (n, oh, ow), in a fixed tree. */
template <class T>
__global__ void conv_bwd_weight_k(cv_geom g, const T *x, const T *gy, T *gw) {
    typedef typename ck_tr<T>::F CT;
    int64_t Cg = g.C / g.g, Og = g.O / g.g, P = g.OH * g.OW, nw = g.O * Cg * g.kh * g.kw;
    for (int64_t e = blockIdx.x; e < nw; e += gridDim.x) {
        int64_t bb = e % g.kw, t = e / g.kw, a = t % g.kh;
        t /= g.kh;
        int64_t cc = t % Cg, o = t / Cg, c = o / Og * Cg + cc;
        double acc = 0;
        for (int64_t j = threadIdx.x; j < g.N * P; j += blockDim.x) {
            int64_t n = j / P, p = j % P, oh = p / g.OW, ow = p % g.OW;
            int64_t ih = oh * g.sh - g.ph + a * g.dh, iw = ow * g.sw - g.pw + bb * g.dw;
            if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
            acc += (double)ck_f(x[((n * g.C + c) * g.H + ih) * g.W + iw]) *
                   (double)ck_f(gy[(n * g.O + o) * P + p]);
        }
        acc = ck_block_sum(acc);
        if (threadIdx.x == 0) gw[e] = ck_from<T>((CT)acc);
    }
}

/* gb[o] = the sum of gy (N, O, P) over n and p, one block per channel. */
template <class T>
__global__ void conv_bias_grad_k(int64_t N, int64_t O, int64_t P, const T *gy, T *gb) {
    typedef typename ck_tr<T>::F CT;
    for (int64_t o = blockIdx.x; o < O; o += gridDim.x) {
        double acc = 0;
        for (int64_t j = threadIdx.x; j < N * P; j += blockDim.x)
            acc += (double)ck_f(gy[(j / P * O + o) * P + j % P]);
        acc = ck_block_sum(acc);
        if (threadIdx.x == 0) gb[o] = ck_from<T>((CT)acc);
    }
}

template <class T>
__global__ void conv_add_bias_k(int64_t n, int64_t O, int64_t P, T *y, const T *b) {
    typedef typename ck_tr<T>::F CT;
    NN_LOOP(i, n) y[i] = ck_from<T>((CT)ck_f(y[i]) + (CT)ck_f(b[i / P % O]));
}

static unsigned nn_blocks_for(int64_t n) { return (unsigned)(n < 1 ? 1 : n > 65535 ? 65535 : n); }

em_status cuda_conv2d_add_bias(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    if (!y->numel) return EM_OK;
    int64_t O = y->shape[1], P = y->shape[2] * y->shape[3];
    cudaStream_t s = cuda_stream_of(k);
#define GO(T) conv_add_bias_k<T><<<ck_blocks(y->numel, 1), CK_THREADS, 0, s>>>( \
        y->numel, O, P, (T *)y->data, (const T *)k->in[2].data)
    CK_SWITCH_FLOAT(y->dtype, GO, return ck_no_dtype(k, y->dtype))
#undef GO
    return CK_CHECK(k, "conv2d_add_bias");
}

em_status cuda_conv2d_bias_grad(const em_kernel_ctx *k) {
    const em_ktensor *gy = &k->in[1], *gb = &k->out[1];
    if (!gb->numel) return EM_OK;
    int64_t N = gy->shape[0], O = gy->shape[1], P = gy->shape[2] * gy->shape[3];
    cudaStream_t s = cuda_stream_of(k);
#define GO(T) conv_bias_grad_k<T><<<nn_blocks_for(O), CK_THREADS, 0, s>>>( \
        N, O, P, (const T *)gy->data, (T *)gb->data)
    CK_SWITCH_FLOAT(gy->dtype, GO, return ck_no_dtype(k, gy->dtype))
#undef GO
    return CK_CHECK(k, "conv2d_bias_grad");
}

em_status cuda_conv2d_direct(const em_kernel_ctx *k) {
    em_status st = nn_dense(k);
    if (st != EM_OK) return st;
    const char *name = em_op_name(k->op);
    cudaStream_t s = cuda_stream_of(k);
    em_dtype dt = k->out[0].dtype;
    if (strcmp(name, "conv2d") == 0) {
        const em_ktensor *y = &k->out[0];
        if (!y->numel) return EM_OK;
        cv_geom g = cv_make(&k->in[0], &k->in[1], y, k->attrs);
        bool has_b = k->in[2].numel > 0;
#define GO(T) conv_fwd_k<T><<<ck_blocks(y->numel, 1), CK_THREADS, 0, s>>>( \
        g, (const T *)k->in[0].data, (const T *)k->in[1].data, (const T *)k->in[2].data, has_b, \
        (T *)y->data)
        CK_SWITCH_FLOAT(dt, GO, return ck_no_dtype(k, dt))
#undef GO
        return CK_CHECK(k, "conv2d_direct");
    }
    if (strcmp(name, "conv2d_backward_data") == 0) {
        const em_ktensor *gx = &k->out[0];
        if (!gx->numel) return EM_OK;
        cv_geom g = cv_make(gx, &k->in[1], &k->in[0], k->attrs);
#define GO(T) conv_bwd_data_k<T><<<ck_blocks(gx->numel, 1), CK_THREADS, 0, s>>>( \
        g, (const T *)k->in[0].data, (const T *)k->in[1].data, (T *)gx->data)
        CK_SWITCH_FLOAT(dt, GO, return ck_no_dtype(k, dt))
#undef GO
        return CK_CHECK(k, "conv2d_backward_data_direct");
    }
    const em_ktensor *gw = &k->out[0];
    if (gw->numel) {
        cv_geom g = cv_make(&k->in[0], gw, &k->in[1], k->attrs);
#define GO(T) conv_bwd_weight_k<T><<<nn_blocks_for(gw->numel), CK_THREADS, 0, s>>>( \
        g, (const T *)k->in[0].data, (const T *)k->in[1].data, (T *)gw->data)
        CK_SWITCH_FLOAT(dt, GO, return ck_no_dtype(k, dt))
#undef GO
        st = CK_CHECK(k, "conv2d_backward_weight_direct");
    }
    return st == EM_OK ? cuda_conv2d_bias_grad(k) : st;
}

static em_status k_conv_direct(const em_kernel_ctx *k) { return cuda_conv2d_direct(k); }

/* ---- pooling --------------------------------------------------------------------------------- */

/* x (planes, H, W) and y (planes, OH, OW); kernel, stride, padding, dilation; count_include_pad. */
struct pl_geom {
    int64_t planes, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw;
    bool cip;
};

static pl_geom pl_make(const em_ktensor *x, const em_ktensor *y, const em_attr *a, bool max) {
    pl_geom p;
    p.planes = x->shape[0] * x->shape[1], p.H = x->shape[2], p.W = x->shape[3];
    p.OH = y->shape[2], p.OW = y->shape[3];
    p.kh = a[0].ints[0], p.kw = a[0].ints[1], p.sh = a[1].ints[0], p.sw = a[1].ints[1];
    p.ph = a[2].ints[0], p.pw = a[2].ints[1];
    p.dh = max ? a[3].ints[0] : 1, p.dw = max ? a[3].ints[1] : 1;
    p.cip = !max && a[4].v.b;
    return p;
}

/* max_pool2d: the CPU's loop per output (NaN wins; the first of equal maxima; the winner's own
 * bits are stored). */
template <class T>
__global__ void max_pool_k(pl_geom p, const T *x, T *y, int64_t *idx) {
    typedef typename ck_tr<T>::F CT;
    NN_LOOP(i, p.planes * p.OH * p.OW) {
        int64_t ow = i % p.OW, oh = i / p.OW % p.OH, pl = i / (p.OW * p.OH);
        const T *xp = x + pl * p.H * p.W;
        int64_t hs, he, ws, we;
        cnn_max_window(oh, p.kh, p.sh, p.ph, p.dh, p.H, &hs, &he);
        cnn_max_window(ow, p.kw, p.sw, p.pw, p.dw, p.W, &ws, &we);
        int64_t best = hs * p.W + ws;
        CT m = (CT)-INFINITY;
        bool any = false;
        for (int64_t h = hs; h < he; h += p.dh)
            for (int64_t w = ws; w < we; w += p.dw) {
                CT v = ck_f(xp[h * p.W + w]);
                bool take = (v > m) | (v != v);
                m = take ? v : m;
                best = take ? h * p.W + w : best;
                any |= take;
            }
        y[i] = any ? xp[best] : ck_from<T>(m);
        idx[i] = best;
    }
}

/* max_pool2d_backward: one thread per plane adds its gy into acc (a gx plane in the compute
 * type) in the CPU's order; indices were checked before. */
template <class T, class A>
__global__ void max_pool_bwd_k(int64_t planes, int64_t P, int64_t HW, const T *gy,
                               const int64_t *idx, A *acc) {
    NN_LOOP(pl, planes) {
        const T *g = gy + pl * P;
        const int64_t *ix = idx + pl * P;
        A *a = acc + pl * HW;
        for (int64_t i = 0; i < P; i++) a[ix[i]] = a[ix[i]] + (A)ck_f(g[i]);
    }
}

template <class T>
__global__ void round_k(int64_t n, const float *src, T *dst) {
    NN_LOOP(i, n) dst[i] = ck_from<T>(src[i]);
}

/* avg_pool2d's window (oh, ow): clipped bounds and PyTorch's divisor; false when empty. */
__device__ __forceinline__ bool avg_window(const pl_geom &p, int64_t oh, int64_t ow, int64_t *hs,
                                           int64_t *he, int64_t *ws, int64_t *we, double *div) {
    int64_t ph, pw;
    if (!cnn_avg_window(oh, p.kh, p.sh, p.ph, p.H, hs, he, &ph) ||
        !cnn_avg_window(ow, p.kw, p.sw, p.pw, p.W, ws, we, &pw))
        return false;
    *div = (double)(p.cip ? ph * pw : (*he - *hs) * (*we - *ws));
    return true;
}

template <class T>
__global__ void avg_pool_k(pl_geom p, const T *x, T *y) {
    typedef typename ck_tr<T>::F CT;
    NN_LOOP(i, p.planes * p.OH * p.OW) {
        int64_t ow = i % p.OW, oh = i / p.OW % p.OH, pl = i / (p.OW * p.OH);
        const T *xp = x + pl * p.H * p.W;
        int64_t hs, he, ws, we;
        double div, s = 0;
        if (!avg_window(p, oh, ow, &hs, &he, &ws, &we, &div)) {
            y[i] = ck_from<T>((CT)0);
            continue;
        }
        for (int64_t h = hs; h < he; h++)
            for (int64_t w = ws; w < we; w++) s += (double)ck_f(xp[h * p.W + w]);
        y[i] = ck_from<T>((CT)(s / div));
    }
}

/* avg_pool2d_backward, gathered: gx(h, w) adds (CT)(gy / div) of every window holding it in
 * (oh, ow) order, the order in which the CPU's scatter adds them. */
template <class T>
__global__ void avg_pool_bwd_k(pl_geom p, const T *gy, T *gx) {
    typedef typename ck_tr<T>::F CT;
    NN_LOOP(i, p.planes * p.H * p.W) {
        int64_t w = i % p.W, h = i / p.W % p.H, pl = i / (p.W * p.H);
        const T *gp = gy + pl * p.OH * p.OW;
        int64_t oh0, oh1, ow0, ow1;
        cnn_pool_outputs_of(h, p.kh, p.sh, p.ph, p.OH, &oh0, &oh1);
        cnn_pool_outputs_of(w, p.kw, p.sw, p.pw, p.OW, &ow0, &ow1);
        CT acc = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++)
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                int64_t hs, he, ws, we;
                double div;
                if (!avg_window(p, oh, ow, &hs, &he, &ws, &we, &div)) continue; /* not reached */
                acc = acc + (CT)((double)ck_f(gp[oh * p.OW + ow]) / div);
            }
        gx[i] = ck_from<T>(acc);
    }
}

/* adaptive_avg_pool2d: window o of n over size s is [floor(o*s/n), ceil((o+1)*s/n)). */
template <class T>
__global__ void adaptive_k(int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                           const T *x, T *y) {
    typedef typename ck_tr<T>::F CT;
    NN_LOOP(i, planes * OH * OW) {
        int64_t ow = i % OW, oh = i / OW % OH, pl = i / (OW * OH);
        const T *xp = x + pl * H * W;
        int64_t hs = cnn_adaptive_start(oh, H, OH), he = cnn_adaptive_end(oh, H, OH);
        int64_t ws = cnn_adaptive_start(ow, W, OW), we = cnn_adaptive_end(ow, W, OW);
        double s = 0;
        for (int64_t h = hs; h < he; h++)
            for (int64_t w = ws; w < we; w++) s += (double)ck_f(xp[h * W + w]);
        y[i] = ck_from<T>((CT)(s / (double)((he - hs) * (we - ws))));
    }
}

template <class T>
__global__ void adaptive_bwd_k(int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW,
                               const T *gy, T *gx) {
    typedef typename ck_tr<T>::F CT;
    NN_LOOP(i, planes * H * W) {
        int64_t w = i % W, h = i / W % H, pl = i / (W * H);
        const T *gp = gy + pl * OH * OW;
        int64_t oh0, oh1, ow0, ow1;
        cnn_adaptive_outputs_of(h, H, OH, &oh0, &oh1);
        cnn_adaptive_outputs_of(w, W, OW, &ow0, &ow1);
        CT acc = 0;
        for (int64_t oh = oh0; oh <= oh1; oh++) {
            int64_t hn = cnn_adaptive_end(oh, H, OH) - cnn_adaptive_start(oh, H, OH);
            for (int64_t ow = ow0; ow <= ow1; ow++) {
                int64_t wn = cnn_adaptive_end(ow, W, OW) - cnn_adaptive_start(ow, W, OW);
                acc = acc + (CT)((double)ck_f(gp[oh * OW + ow]) / (double)(hn * wn));
            }
        }
        gx[i] = ck_from<T>(acc);
    }
}

static em_status k_max_pool2d(const em_kernel_ctx *k) {
    em_status st = nn_dense(k);
    if (st != EM_OK || !k->out[0].numel) return st;
    pl_geom p = pl_make(&k->in[0], &k->out[0], k->attrs, true);
    cudaStream_t s = cuda_stream_of(k);
#define GO(T) max_pool_k<T><<<ck_blocks(k->out[0].numel, 1), CK_THREADS, 0, s>>>( \
        p, (const T *)k->in[0].data, (T *)k->out[0].data, (int64_t *)k->out[1].data)
    CK_SWITCH_FLOAT(k->in[0].dtype, GO, return ck_no_dtype(k, k->in[0].dtype))
#undef GO
    return CK_CHECK(k, "max_pool2d");
}

static em_status k_max_pool2d_bwd(const em_kernel_ctx *k) {
    em_status st = nn_dense(k);
    if (st != EM_OK) return st;
    const em_ktensor *gy = &k->in[0], *idx = &k->in[1], *gx = &k->out[0];
    if (!gx->numel) return EM_OK;
    int64_t HW = gx->shape[2] * gx->shape[3], P = gy->shape[2] * gy->shape[3];
    int64_t planes = gx->shape[0] * gx->shape[1];
    bool ok = true;
    int64_t bad = 0;
    if (idx->numel) st = ck_index_check(k, idx, HW, &ok, &bad);
    if (st != EM_OK) return st;
    if (!ok)
        return em_set_error(EM_ERR_RANGE, "max_pool2d_backward: an index is outside the input "
                            "plane of %lld x %lld (index %lld)", (long long)gx->shape[2],
                            (long long)gx->shape[3], (long long)bad);
    cudaStream_t s = cuda_stream_of(k);
    bool narrow = gx->dtype == EM_F16 || gx->dtype == EM_BF16;
    void *acc = gx->data;
    size_t nbytes = (size_t)gx->numel * (narrow ? sizeof(float) : em_dtype_size(gx->dtype));
    if (narrow && !(acc = ck_scratch(k, nbytes))) return em_last_status();
    st = ck_rt(k, cudaMemsetAsync(acc, 0, nbytes, s), "cudaMemsetAsync");
    if (st != EM_OK) return st;
    unsigned blocks = ck_blocks(planes, 1);
    const int64_t *ix = (const int64_t *)idx->data;
    unsigned eb = ck_blocks(gx->numel, 1);
    const float *fa = (const float *)acc;
#define BWD(T, A) max_pool_bwd_k<T, A><<<blocks, CK_THREADS, 0, s>>>(planes, P, HW, \
        (const T *)gy->data, ix, (A *)acc)
    switch (gx->dtype) {
    case EM_F32: BWD(float, float); break;
    case EM_F64: BWD(double, double); break;
    case EM_F16:
        BWD(ck_h, float);
        round_k<ck_h><<<eb, CK_THREADS, 0, s>>>(gx->numel, fa, (ck_h *)gx->data);
        break;
    case EM_BF16:
        BWD(ck_b, float);
        round_k<ck_b><<<eb, CK_THREADS, 0, s>>>(gx->numel, fa, (ck_b *)gx->data);
        break;
    default: return ck_no_dtype(k, gx->dtype);
    }
#undef BWD
    return CK_CHECK(k, "max_pool2d_backward");
}

/* avg_pool2d and its backward (by op name). */
static em_status k_avg_pool(const em_kernel_ctx *k) {
    em_status st = nn_dense(k);
    if (st != EM_OK || !k->out[0].numel) return st;
    bool bwd = strcmp(em_op_name(k->op), "avg_pool2d_backward") == 0;
    const em_ktensor *x = bwd ? &k->out[0] : &k->in[0], *y = bwd ? &k->in[0] : &k->out[0];
    pl_geom p = pl_make(x, y, k->attrs, false);
    cudaStream_t s = cuda_stream_of(k);
    unsigned blocks = ck_blocks(k->out[0].numel, 1);
#define GO(T)                                                                                      \
    if (bwd) avg_pool_bwd_k<T><<<blocks, CK_THREADS, 0, s>>>(p, (const T *)y->data, (T *)x->data); \
    else avg_pool_k<T><<<blocks, CK_THREADS, 0, s>>>(p, (const T *)x->data, (T *)y->data)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, em_op_name(k->op));
}

static em_status k_adaptive(const em_kernel_ctx *k) {
    em_status st = nn_dense(k);
    if (st != EM_OK || !k->out[0].numel) return st;
    bool bwd = strcmp(em_op_name(k->op), "adaptive_avg_pool2d_backward") == 0;
    const em_ktensor *x = bwd ? &k->out[0] : &k->in[0], *y = bwd ? &k->in[0] : &k->out[0];
    int64_t planes = x->shape[0] * x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t OH = y->shape[2], OW = y->shape[3];
    cudaStream_t s = cuda_stream_of(k);
    if (bwd && (OH == 0 || OW == 0)) /* no window: the gradient is zero */
        return ck_rt(k, cudaMemsetAsync(x->data, 0, (size_t)x->numel * em_dtype_size(x->dtype), s),
                     "cudaMemsetAsync");
    unsigned blocks = ck_blocks(k->out[0].numel, 1);
#define GO(T)                                                                                      \
    if (bwd)                                                                                       \
        adaptive_bwd_k<T><<<blocks, CK_THREADS, 0, s>>>(planes, H, W, OH, OW, (const T *)y->data, \
                                                        (T *)x->data);                            \
    else                                                                                           \
        adaptive_k<T><<<blocks, CK_THREADS, 0, s>>>(planes, H, W, OH, OW, (const T *)x->data,     \
                                                    (T *)y->data)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, em_op_name(k->op));
}

/* ---- batch_norm: one block per channel, sums in double in a fixed tree ----------------------- */

struct bn_job {
    int64_t N, C, HW;
    bool training, has_w, has_b, has_rm, has_rv;
    double mom, eps;
};

/* in: x, w, b, running_mean, running_var (updated in place when training); out: y, save_mean,
 * save_invstd. S is the statistics type (float, or double for f64). */
template <class T>
__global__ void bn_fwd_k(bn_job j, const T *x, const typename ck_tr<T>::F *w,
                         const typename ck_tr<T>::F *b, typename ck_tr<T>::F *rm,
                         typename ck_tr<T>::F *rv, T *y, typename ck_tr<T>::F *sm,
                         typename ck_tr<T>::F *si) {
    typedef typename ck_tr<T>::F S;
    double M = (double)(j.N * j.HW);
    for (int64_t c = blockIdx.x; c < j.C; c += gridDim.x) {
        double mean, invstd;
        if (j.training) {
            double s = 0, q = 0;
            for (int64_t i = threadIdx.x; i < j.N * j.HW; i += blockDim.x)
                s += (double)ck_f(x[(i / j.HW * j.C + c) * j.HW + i % j.HW]);
            s = ck_block_sum(s);
            mean = M > 0 ? s / M : 0;
            for (int64_t i = threadIdx.x; i < j.N * j.HW; i += blockDim.x) {
                double d = (double)ck_f(x[(i / j.HW * j.C + c) * j.HW + i % j.HW]) - mean;
                q += d * d;
            }
            q = ck_block_sum(q);
            double var = M > 0 ? q / M : 0;
            invstd = 1.0 / sqrt(var + j.eps);
            if (threadIdx.x == 0) {
                if (j.has_rm && M > 0) rm[c] = (S)((1 - j.mom) * rm[c] + j.mom * mean);
                if (j.has_rv && M > 1) rv[c] = (S)((1 - j.mom) * rv[c] + j.mom * q / (M - 1));
            }
        } else {
            mean = rm[c];
            invstd = 1.0 / sqrt((double)rv[c] + j.eps);
        }
        if (threadIdx.x == 0) {
            sm[c] = (S)mean;
            si[c] = (S)invstd;
        }
        S a = (S)((j.has_w ? w[c] : 1) * invstd);
        S sh = (S)((j.has_b ? b[c] : 0) - mean * (double)a);
        for (int64_t i = threadIdx.x; i < j.N * j.HW; i += blockDim.x) {
            int64_t e = (i / j.HW * j.C + c) * j.HW + i % j.HW;
            y[e] = ck_from<T>((S)ck_f(x[e]) * a + sh);
        }
    }
}

/* in: gy, x, w, save_mean, save_invstd; out: gx, gw, gb. */
template <class T>
__global__ void bn_bwd_k(bn_job j, const T *gy, const T *x, const typename ck_tr<T>::F *w,
                         const typename ck_tr<T>::F *sm, const typename ck_tr<T>::F *si, T *gx,
                         typename ck_tr<T>::F *gw, typename ck_tr<T>::F *gb) {
    typedef typename ck_tr<T>::F S;
    double M = (double)(j.N * j.HW);
    for (int64_t c = blockIdx.x; c < j.C; c += gridDim.x) {
        double mean = sm[c], invstd = si[c], sdy = 0, sdyx = 0;
        for (int64_t i = threadIdx.x; i < j.N * j.HW; i += blockDim.x) {
            int64_t e = (i / j.HW * j.C + c) * j.HW + i % j.HW;
            double g = (double)ck_f(gy[e]);
            sdy += g;
            sdyx += g * ((double)ck_f(x[e]) - mean);
        }
        sdy = ck_block_sum(sdy);
        sdyx = ck_block_sum(sdyx);
        if (threadIdx.x == 0) {
            gw[c] = (S)(sdyx * invstd);
            gb[c] = (S)sdy;
        }
        double a = (j.has_w ? (double)w[c] : 1.0) * invstd, bx = 0, d = 0;
        if (j.training && M > 0) {
            bx = -a * invstd * invstd * sdyx / M;
            d = -a * sdy / M - bx * mean;
        }
        for (int64_t i = threadIdx.x; i < j.N * j.HW; i += blockDim.x) {
            int64_t e = (i / j.HW * j.C + c) * j.HW + i % j.HW;
            gx[e] = ck_from<T>((S)(a * (double)ck_f(gy[e]) + bx * (double)ck_f(x[e]) + d));
        }
    }
}

static bn_job bn_make(const em_ktensor *x, const em_attr *a, bool fwd) {
    bn_job j;
    memset(&j, 0, sizeof j);
    j.N = x->shape[0];
    j.C = x->ndim > 1 ? x->shape[1] : 1;
    j.HW = j.N * j.C > 0 ? x->numel / (j.N * j.C) : 0;
    j.training = a[0].v.b;
    if (fwd) j.mom = a[1].v.f, j.eps = a[2].v.f;
    return j;
}

static em_status k_batch_norm(const em_kernel_ctx *k) {
    em_status st = nn_dense(k);
    if (st != EM_OK) return st;
    const em_ktensor *x = &k->in[0];
    bn_job j = bn_make(x, k->attrs, true);
    j.has_w = k->in[1].numel > 0, j.has_b = k->in[2].numel > 0;
    j.has_rm = k->in[3].numel > 0, j.has_rv = k->in[4].numel > 0;
    if (!j.C) return EM_OK;
    cudaStream_t s = cuda_stream_of(k);
#define GO(T)                                                                                      \
    do {                                                                                           \
        typedef ck_tr<T>::F S;                                                                     \
        bn_fwd_k<T><<<nn_blocks_for(j.C), CK_THREADS, 0, s>>>(                                     \
            j, (const T *)x->data, (const S *)k->in[1].data, (const S *)k->in[2].data,           \
            (S *)k->in[3].data, (S *)k->in[4].data, (T *)k->out[0].data, (S *)k->out[1].data,    \
            (S *)k->out[2].data);                                                                  \
    } while (0)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, "batch_norm");
}

static em_status k_batch_norm_bwd(const em_kernel_ctx *k) {
    em_status st = nn_dense(k);
    if (st != EM_OK) return st;
    const em_ktensor *x = &k->in[1];
    bn_job j = bn_make(x, k->attrs, false);
    j.has_w = k->in[2].numel > 0;
    if (!j.C) return EM_OK;
    cudaStream_t s = cuda_stream_of(k);
#define GO(T)                                                                                      \
    do {                                                                                           \
        typedef ck_tr<T>::F S;                                                                     \
        bn_bwd_k<T><<<nn_blocks_for(j.C), CK_THREADS, 0, s>>>(                                     \
            j, (const T *)k->in[0].data, (const T *)x->data, (const S *)k->in[2].data,           \
            (const S *)k->in[3].data, (const S *)k->in[4].data, (T *)k->out[0].data,              \
            (S *)k->out[1].data, (S *)k->out[2].data);                                             \
    } while (0)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, "batch_norm_backward");
}

/* ---- registration ---------------------------------------------------------------------------- */

em_status cuda_register_nn(em_registry *r) {
    static const struct {
        const char *op;
        em_kernel_fn fn;
        const char *name;
    } ks[] = {
        {"conv2d", k_conv_direct, "cuda_conv2d_direct"},
        {"conv2d_backward_data", k_conv_direct, "cuda_conv2d_backward_data_direct"},
        {"conv2d_backward_weight", k_conv_direct, "cuda_conv2d_backward_weight_direct"},
        {"max_pool2d", k_max_pool2d, "cuda_max_pool2d"},
        {"max_pool2d_backward", k_max_pool2d_bwd, "cuda_max_pool2d_backward"},
        {"avg_pool2d", k_avg_pool, "cuda_avg_pool2d"},
        {"avg_pool2d_backward", k_avg_pool, "cuda_avg_pool2d_backward"},
        {"adaptive_avg_pool2d", k_adaptive, "cuda_adaptive_avg_pool2d"},
        {"adaptive_avg_pool2d_backward", k_adaptive, "cuda_adaptive_avg_pool2d_backward"},
        {"batch_norm", k_batch_norm, "cuda_batch_norm"},
        {"batch_norm_backward", k_batch_norm_bwd, "cuda_batch_norm_backward"},
    };
    em_status st = EM_OK;
    for (size_t i = 0; i < sizeof ks / sizeof *ks && st == EM_OK; i++)
        st = cuda_register_dtypes(r, ks[i].op, ck_flt, CK_N(ck_flt), ks[i].fn, ks[i].name);
    return st;
}
