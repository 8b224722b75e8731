/*
 * cuda_layernorm.cu — layer_norm and layer_norm_backward on CUDA (contracts in core/ops_nn.c),
 * with the arithmetic of the CPU's loops (plugins/backend-cpu/cpu_nn_loops.h): a row's sum
 * and sum of squared deviations in double, mean and rstd = 1 / sqrt(var + eps) stored in the
 * statistics dtype S (f64 for f64, f32 otherwise), y = (x - mean) * rstd * w + b in the
 * compute type (float for f32, f16 and bf16, double for f64; weight and bias are in S);
 * backward's two row sums and the weight and bias column sums in double. f16 and bf16 load
 * to float and round once (the CPU runs them through the core's f32 path or oneDNN).
 *
 * A row is the last normalized_ndim dims (D elements); forward and the backward's gx use one
 * block of 128 threads per row (grid-stride over rows), combined in a fixed tree
 * (ck_block_sum): the same bits on every run, the CPU's to double rounding. grad_weight and
 * grad_bias take one thread per column walking the rows in order, the CPU's order, so they
 * are its bits. Operands must be contiguous (the public functions make them so).
 */
#include "cuda_gemm.cuh" /* cg_check_dense */

#define LN_THREADS 128

template <class T> struct ln_st { typedef float S; };
template <> struct ln_st<double> { typedef double S; };

template <class T>
__global__ void ln_fwd(const T *x, const typename ln_st<T>::S *w, const typename ln_st<T>::S *b,
                       T *y, typename ln_st<T>::S *mean_o, typename ln_st<T>::S *rstd_o,
                       int64_t rows, int64_t D, double eps) {
    typedef typename ck_tr<T>::F CT;
    typedef ck_cv<T, CT> cv;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * D;
        T *yr = y + r * D;
        double s = 0, q = 0;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += (double)cv::in(xr[i]);
        s = ck_block_sum(s);
        double mean = D ? s / (double)D : 0;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            double d = (double)cv::in(xr[i]) - mean;
            q += d * d;
        }
        q = ck_block_sum(q);
        double rstd = 1.0 / sqrt((D ? q / (double)D : 0) + eps);
        if (threadIdx.x == 0) {
            mean_o[r] = (typename ln_st<T>::S)mean;
            rstd_o[r] = (typename ln_st<T>::S)rstd;
        }
        CT tm = (CT)mean, tr = (CT)rstd;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            CT v = (cv::in(xr[i]) - tm) * tr;
            if (w && b) v = v * (CT)w[i] + (CT)b[i];
            else v = v * (w ? (CT)w[i] : (CT)1) + (b ? (CT)b[i] : (CT)0);
            yr[i] = cv::out(v);
        }
    }
}

template <class T>
__global__ void ln_bwd_rows(const T *gy, const T *x, const typename ln_st<T>::S *mean_i,
                            const typename ln_st<T>::S *rstd_i, const typename ln_st<T>::S *w,
                            T *gx, int64_t rows, int64_t D) {
    typedef typename ck_tr<T>::F CT;
    typedef ck_cv<T, CT> cv;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *g = gy + r * D, *xr = x + r * D;
        double mean = mean_i[r], rstd = rstd_i[r], s1 = 0, s2 = 0;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            double gv = (double)cv::in(g[i]) * (w ? (double)w[i] : 1.0);
            s1 += gv;
            s2 += gv * ((double)cv::in(xr[i]) - mean) * rstd;
        }
        s1 = ck_block_sum(s1) / (double)D;
        s2 = ck_block_sum(s2) / (double)D;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            double gv = (double)cv::in(g[i]) * (w ? (double)w[i] : 1.0);
            double xh = ((double)cv::in(xr[i]) - mean) * rstd;
            gx[r * D + i] = ck_from_double<T>(rstd * (gv - s1 - xh * s2));
        }
    }
}

/* grad_weight[i] = sum_r gy x_hat, grad_bias[i] = sum_r gy: one thread per column, rows in
 * order (the CPU's sums). */
template <class T>
__global__ void ln_bwd_cols(const T *gy, const T *x, const typename ln_st<T>::S *mean_i,
                            const typename ln_st<T>::S *rstd_i, typename ln_st<T>::S *gw,
                            typename ln_st<T>::S *gb, int64_t rows, int64_t D) {
    typedef typename ck_tr<T>::F CT;
    typedef ck_cv<T, CT> cv;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < D;
         i += (int64_t)gridDim.x * blockDim.x) {
        double aw = 0, ab = 0;
        for (int64_t r = 0; r < rows; r++) {
            double g = (double)cv::in(gy[r * D + i]);
            aw += g * ((double)cv::in(x[r * D + i]) - (double)mean_i[r]) * (double)rstd_i[r];
            ab += g;
        }
        gw[i] = (typename ln_st<T>::S)aw;
        gb[i] = (typename ln_st<T>::S)ab;
    }
}

static int64_t ln_d(const em_ktensor *x, int nk) {
    int64_t d = 1;
    for (int i = x->ndim - nk; i < x->ndim; i++) d *= x->shape[i];
    return d;
}

static unsigned ln_blocks(int64_t rows) { return (unsigned)(rows < 65536 ? (rows > 0 ? rows : 1) : 65536); }

static em_status k_layer_norm(const em_kernel_ctx *k) {
    em_status st = cg_check_dense(k);
    if (st != EM_OK) return st;
    const em_ktensor *x = &k->in[0];
    int64_t D = ln_d(x, (int)k->attrs[0].v.i), rows = D ? x->numel / D : 0;
    if (rows == 0) return EM_OK;
    double eps = k->attrs[1].v.f;
    const void *w = k->in[1].numel ? k->in[1].data : NULL, *b = k->in[2].numel ? k->in[2].data : NULL;
    cudaStream_t s = cuda_stream_of(k);
#define GO(T)                                                                                     \
    ln_fwd<T><<<ln_blocks(rows), LN_THREADS, 0, s>>>(                                             \
        (const T *)x->data, (const ln_st<T>::S *)w, (const ln_st<T>::S *)b, (T *)k->out[0].data, \
        (ln_st<T>::S *)k->out[1].data, (ln_st<T>::S *)k->out[2].data, rows, D, eps)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, "layer_norm");
}

static em_status k_layer_norm_bwd(const em_kernel_ctx *k) {
    em_status st = cg_check_dense(k);
    if (st != EM_OK) return st;
    const em_ktensor *x = &k->in[1];
    int64_t D = ln_d(x, (int)k->attrs[0].v.i), rows = D ? x->numel / D : 0;
    const void *w = k->in[4].numel ? k->in[4].data : NULL;
    cudaStream_t s = cuda_stream_of(k);
    if (D == 0) return EM_OK;
#define GO(T)                                                                                     \
    do {                                                                                          \
        typedef ln_st<T>::S S_;                                                                   \
        if (rows)                                                                                 \
            ln_bwd_rows<T><<<ln_blocks(rows), LN_THREADS, 0, s>>>(                                \
                (const T *)k->in[0].data, (const T *)x->data, (const S_ *)k->in[2].data,          \
                (const S_ *)k->in[3].data, (const S_ *)w, (T *)k->out[0].data, rows, D);          \
        ln_bwd_cols<T><<<ck_blocks(D, 1), CK_THREADS, 0, s>>>(                                    \
            (const T *)k->in[0].data, (const T *)x->data, (const S_ *)k->in[2].data,              \
            (const S_ *)k->in[3].data, (S_ *)k->out[1].data, (S_ *)k->out[2].data, rows, D);      \
    } while (0)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, "layer_norm_backward");
}

em_status cuda_register_layernorm(em_registry *r) {
    em_status st = cuda_register_dtypes(r, "layer_norm", ck_flt, CK_N(ck_flt), k_layer_norm,
                                        "cuda_layer_norm");
    if (st == EM_OK)
        st = cuda_register_dtypes(r, "layer_norm_backward", ck_flt, CK_N(ck_flt),
                                  k_layer_norm_bwd, "cuda_layer_norm_backward");
    return st;
}
