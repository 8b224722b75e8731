/*
 * cuda_softmax.cu — softmax, log_softmax and their backward helpers on CUDA (contracts in
 * core/ops_nn.c; the CPU's loops in plugins/backend-cpu/cpu_nn_loops.h, whose arithmetic these
 * follow: the row max propagates NaN, sums of exponentials are in double). f16 and bf16
 * compute in float and round once (what the core's f32 path gives where the CPU has no such
 * kernel). Like the CPU kernels, these take contiguous operands (the public functions make
 * them so) and refuse strided ones with an error.
 *
 * A row is the D elements along `dim` of one (outer, inner) position, stride inner; one warp
 * per row, lanes split the row and combine in a fixed butterfly.
 */
#include "cuda_kernels.cuh"

enum { SM_SOFTMAX, SM_LOG_SOFTMAX, SM_SOFTMAX_BWD, SM_LOG_SOFTMAX_BWD };

struct sm_job {
    int kind;
    int64_t outer, D, inner;
    const void *x, *y2; /* x (or the grad), and the forward's output for the backward ops */
    void *y;
};

__device__ __forceinline__ double sm_sum(double v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* The max of the lanes' maxima; NaN wins (cpu: x > m || isnan(x)). */
template <class CT> __device__ __forceinline__ CT sm_max(CT v) {
    for (int o = 16; o > 0; o /= 2) {
        CT u = __shfl_xor_sync(0xffffffffu, v, o);
        v = (u > v || u != u) ? u : v;
    }
    return v;
}

template <class T>
__global__ void sm_kernel(sm_job j) {
    typedef typename ck_tr<T>::F CT;
    typedef ck_cv<T, CT> cv;
    int lane = threadIdx.x % 32;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t r = warp; r < j.outer * j.inner; r += nwarps) {
        int64_t o = r / j.inner, in = r % j.inner, base = o * j.D * j.inner + in, st = j.inner;
        const T *x = (const T *)j.x + base;
        const T *y2 = j.y2 ? (const T *)j.y2 + base : NULL;
        T *y = (T *)j.y + base;
        if (j.kind == SM_SOFTMAX || j.kind == SM_LOG_SOFTMAX) {
            CT m = (CT)-INFINITY;
            for (int64_t i = lane; i < j.D; i += 32) {
                CT v = cv::in(x[i * st]);
                if (v > m || v != v) m = v;
            }
            m = sm_max(m);
            double s = 0;
            for (int64_t i = lane; i < j.D; i += 32) s += exp((double)(cv::in(x[i * st]) - m));
            s = sm_sum(s);
            if (j.kind == SM_SOFTMAX) {
                double inv = 1.0 / s;
                for (int64_t i = lane; i < j.D; i += 32)
                    y[i * st] = cv::out((CT)(exp((double)(cv::in(x[i * st]) - m)) * inv));
            } else {
                CT ls = (CT)log(s);
                for (int64_t i = lane; i < j.D; i += 32) y[i * st] = cv::out(cv::in(x[i * st]) - m - ls);
            }
        } else if (j.kind == SM_SOFTMAX_BWD) { /* x = grad, y2 = output */
            double s = 0;
            for (int64_t i = lane; i < j.D; i += 32) s += (double)cv::in(x[i * st]) * cv::in(y2[i * st]);
            s = sm_sum(s);
            for (int64_t i = lane; i < j.D; i += 32)
                y[i * st] = cv::out((CT)(cv::in(y2[i * st]) * (cv::in(x[i * st]) - s)));
        } else {
            double s = 0;
            for (int64_t i = lane; i < j.D; i += 32) s += cv::in(x[i * st]);
            s = sm_sum(s);
            for (int64_t i = lane; i < j.D; i += 32)
                y[i * st] = cv::out((CT)(cv::in(x[i * st]) - exp((double)cv::in(y2[i * st])) * s));
        }
    }
}

static em_status k_softmax_any(const em_kernel_ctx *k) {
    for (int i = 0; i < k->n_in + k->n_out; i++) {
        const em_ktensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        if (!t->contiguous)
            return em_set_error(EM_ERR_INVALID, "%s: the CUDA kernel needs contiguous operands; "
                                "%s %d is strided (call the em_ function, which copies)",
                                em_op_name(k->op), i < k->n_in ? "input" : "output",
                                i < k->n_in ? i : i - k->n_in);
    }
    const char *name = em_op_name(k->op);
    sm_job j;
    memset(&j, 0, sizeof j);
    j.kind = strcmp(name, "softmax") == 0 ? SM_SOFTMAX
             : strcmp(name, "log_softmax") == 0 ? SM_LOG_SOFTMAX
             : strcmp(name, "softmax_backward") == 0 ? SM_SOFTMAX_BWD : SM_LOG_SOFTMAX_BWD;
    const em_ktensor *x = &k->in[0];
    int d = (int)k->attrs[0].v.i;
    j.outer = j.D = j.inner = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (i < d) j.outer *= x->shape[i];
        else if (i == d) j.D = x->shape[i];
        else j.inner *= x->shape[i];
    }
    if (x->numel == 0) return EM_OK;
    j.x = x->data;
    j.y2 = k->n_in == 2 ? k->in[1].data : NULL;
    j.y = k->out[0].data;
    int64_t rows = j.outer * j.inner, b = (rows + 7) / 8;
    unsigned blocks = (unsigned)(b > 65536 ? 65536 : b);
    cudaStream_t s = cuda_stream_of(k);
#define GO(T) sm_kernel<T><<<blocks, 256, 0, s>>>(j)
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    return CK_CHECK(k, name);
}

em_status cuda_register_softmax(em_registry *r) {
    em_status st = EM_OK;
    static const char *const ops[] = {"softmax", "log_softmax", "softmax_backward",
                                      "log_softmax_backward"};
    for (int i = 0; i < 4 && st == EM_OK; i++) {
        char name[64];
        snprintf(name, sizeof name, "cuda_%s", ops[i]);
        st = cuda_register_dtypes(r, ops[i], ck_flt, CK_N(ck_flt), k_softmax_any, name);
    }
    return st;
}
