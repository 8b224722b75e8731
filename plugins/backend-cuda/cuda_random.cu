/*
 * cuda_random.cu — the in-place random fills (uniform, normal, bernoulli) and randperm on
 * CUDA, element for element the streams of ember/random.h (attributes as the CPU's,
 * plugins/backend-cpu/cpu_random.c: seed, offset, then lo/hi, mean/std or p; without a seed,
 * in a graph capture, the origin is read on the device, ck_rng_of).
 *
 * One thread per Philox block computes the block once and writes the 4 (or 2) elements it
 * feeds, at their C-order positions in the output (any strides). The words, the uniforms and
 * the bernoulli draws are exact integer and power-of-two arithmetic (cuda_scalar.h, shared
 * with the host and checked there against ember/random.h by tests/test_cuda_scalar.c), and
 * this file is compiled without contractions (--fmad=false), so uniform fills and dropout
 * masks are bitwise the CPU's; normal fills call CUDA's double log/cos (within 1 ulp), so
 * they agree within 2 ulp before rounding to the dtype. randperm is the sequential
 * Fisher-Yates of ember/random.h, run by one thread.
 */
#include "cuda_kernels.cuh"

enum { R_UNIFORM4, R_UNIFORM2, R_NORMAL, R_BERNOULLI };

struct rfill {
    int kind;
    ck_rng rng;
    double a, b; /* lo, span / mean, std / p */
    int nd;
    int64_t shape[EM_MAX_DIMS], strides[EM_MAX_DIMS];
    bool contiguous;
    int64_t n;
    void *y;
};

template <class T> __device__ __forceinline__ T rstore(double v);
template <> __device__ __forceinline__ float rstore<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double rstore<double>(double v) { return v; }
template <> __device__ __forceinline__ ck_h rstore<ck_h>(double v) { return ck_h{ck_f32_to_f16((float)v)}; }
template <> __device__ __forceinline__ ck_b rstore<ck_b>(double v) { return ck_b{ck_f32_to_bf16((float)v)}; }
template <> __device__ __forceinline__ int32_t rstore<int32_t>(double v) { return (int32_t)v; }
template <> __device__ __forceinline__ int64_t rstore<int64_t>(double v) { return (int64_t)v; }
template <> __device__ __forceinline__ uint8_t rstore<uint8_t>(double v) { return (uint8_t)v; }
template <> __device__ __forceinline__ bool rstore<bool>(double v) { return v != 0; }

template <class T> __device__ __forceinline__ void put(const rfill &F, int64_t i, double v) {
    int64_t off = F.contiguous ? i : ck_offset(F.nd, F.shape, F.strides, i);
    ((T *)F.y)[off] = rstore<T>(v);
}

template <class T>
__global__ void fill_kernel(rfill F) {
    int per = F.kind == R_UNIFORM4 || F.kind == R_BERNOULLI ? 4 : 2;
    int64_t nb = (F.n + per - 1) / per;
    uint64_t seed = ck_rng_seed(F.rng), offset = ck_rng_offset(F.rng);
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nb; b += (int64_t)gridDim.x * blockDim.x) {
        uint32_t w[4];
        ck_philox_block(seed, offset + (uint64_t)b, w);
        int64_t i0 = b * per, m = F.n - i0 < per ? F.n - i0 : per;
        for (int64_t j = 0; j < m; j++) {
            double v;
            switch (F.kind) {
            case R_UNIFORM4: v = F.a + (double)ck_u24(w[j]) * F.b; break;
            case R_UNIFORM2: v = F.a + ck_u53(w[2 * j], w[2 * j + 1]) * F.b; break;
            case R_NORMAL: v = F.a + F.b * ck_box_muller(w[2 * j], w[2 * j + 1]); break;
            default: v = (double)ck_u24(w[j]) < F.a ? 1.0 : 0.0; break;
            }
            put<T>(F, i0 + j, v);
        }
    }
}

static em_status launch(const em_kernel_ctx *k, rfill &F, const char *what) {
    const em_ktensor *t = &k->out[0];
    F.nd = t->ndim;
    for (int d = 0; d < t->ndim; d++) F.shape[d] = t->shape[d], F.strides[d] = t->strides[d];
    F.contiguous = t->contiguous;
    F.n = t->numel;
    F.y = t->data;
    if (F.n == 0) return EM_OK;
    int per = F.kind == R_UNIFORM4 || F.kind == R_BERNOULLI ? 4 : 2;
    int64_t nb = (F.n + per - 1) / per;
    cudaStream_t s = cuda_stream_of(k);
#define GO(T) fill_kernel<T><<<ck_blocks(nb, 1), CK_THREADS, 0, s>>>(F)
    CK_SWITCH_ALL(t->dtype, GO, return ck_no_dtype(k, t->dtype))
#undef GO
    return CK_CHECK(k, what);
}

static em_status params(const em_kernel_ctx *k, double def_a, double def_b, bool has_b,
                        rfill *F) {
    memset(F, 0, sizeof *F);
    F->a = ck_attr_f(k, 2, def_a);
    F->b = has_b ? ck_attr_f(k, 3, def_b) : 0.0;
    return ck_rng_of(k, 0, &F->rng);
}

static em_status k_uniform(const em_kernel_ctx *k) {
    rfill F;
    if (params(k, 0.0, 1.0, true, &F) != EM_OK) return em_last_status();
    if (!(F.a <= F.b) || !isfinite(F.a) || !isfinite(F.b))
        return em_set_error(EM_ERR_INVALID, "uniform: expects finite lo <= hi, got lo=%g, hi=%g",
                            F.a, F.b);
    F.b = F.b - F.a; /* the span, as the CPU computes it */
    F.kind = k->out[0].dtype == EM_F64 ? R_UNIFORM2 : R_UNIFORM4;
    return launch(k, F, "uniform");
}

static em_status k_normal(const em_kernel_ctx *k) {
    rfill F;
    if (params(k, 0.0, 1.0, true, &F) != EM_OK) return em_last_status();
    if (!(F.b >= 0.0) || !isfinite(F.a) || !isfinite(F.b))
        return em_set_error(EM_ERR_INVALID,
                            "normal: expects a finite mean and std >= 0, got mean=%g, std=%g", F.a, F.b);
    F.kind = R_NORMAL;
    return launch(k, F, "normal");
}

static em_status k_bernoulli(const em_kernel_ctx *k) {
    rfill F;
    if (params(k, 0.5, 0.0, false, &F) != EM_OK) return em_last_status();
    if (!(F.a >= 0.0 && F.a <= 1.0))
        return em_set_error(EM_ERR_INVALID, "bernoulli: expects 0 <= p <= 1, got p=%g", F.a);
    F.kind = R_BERNOULLI;
    return launch(k, F, "bernoulli");
}

/* ---- randperm: one thread, in place in v (int64 scratch), then stored ----------------------- */

__global__ void randperm_kernel(int64_t *v, int64_t n, uint64_t seed, uint64_t offset) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int64_t i = 0; i < n; i++) v[i] = i;
    uint32_t w[4];
    for (int64_t k = 0; k + 1 < n; k++) {
        if (k % 4 == 0) ck_philox_block(seed, offset + (uint64_t)(k / 4), w);
        int64_t i = n - 1 - k;
        int64_t j = (int64_t)(((uint64_t)w[k % 4] * (uint64_t)(i + 1)) >> 32);
        int64_t x = v[i];
        v[i] = v[j];
        v[j] = x;
    }
}

template <class T> struct ck_from_i64 {
    CK_OP_TYPES(T, int64_t, ck_nil, ck_nil, 1)
    __device__ T operator()(int64_t x, ck_nil, ck_nil) const { return (T)x; }
};

static em_status k_randperm(const em_kernel_ctx *k) {
    const em_ktensor *t = &k->out[0];
    uint64_t seed = (uint64_t)ck_attr_i(k, 0, 0), offset = (uint64_t)ck_attr_i(k, 1, 0);
    int64_t n = t->numel;
    if (n == 0) return EM_OK;
    bool direct = t->contiguous && t->dtype == EM_I64;
    int64_t *v = direct ? (int64_t *)t->data : (int64_t *)ck_scratch(k, (size_t)n * sizeof *v);
    if (!v) return em_last_status(); /* "randperm: out of memory for ... kernel workspace" */
    randperm_kernel<<<1, 1, 0, cuda_stream_of(k)>>>(v, n, seed, offset);
    em_status st = CK_CHECK(k, "randperm");
    if (st != EM_OK || direct) return st;
    em_ktensor src = *t;
    src.data = v;
    src.dtype = EM_I64;
    src.contiguous = true;
    int64_t e = 1;
    for (int d = t->ndim - 1; d >= 0; d--) src.strides[d] = e, e *= t->shape[d];
    if (t->dtype == EM_I64) return ck_ew_run(k, "randperm", ck_from_i64<int64_t>(), t, &src);
    return ck_ew_run(k, "randperm", ck_from_i64<int32_t>(), t, &src);
}

em_status cuda_register_random(em_registry *r) {
    static const em_dtype perm[] = {EM_I64, EM_I32};
    em_status st = cuda_register_dtypes(r, "uniform", ck_flt, CK_N(ck_flt), k_uniform, "cuda_uniform");
    if (st == EM_OK) st = cuda_register_dtypes(r, "normal", ck_flt, CK_N(ck_flt), k_normal, "cuda_normal");
    if (st == EM_OK) st = cuda_register_dtypes(r, "bernoulli", ck_all, CK_N(ck_all), k_bernoulli, "cuda_bernoulli");
    if (st == EM_OK) st = cuda_register_dtypes(r, "randperm", perm, CK_N(perm), k_randperm, "cuda_randperm");
    return st;
}
