/*
 * cuda_copy.cu — copy (any strides, converting between every pair of dtypes with the CPU
 * backend's rules: floating stores round to nearest even, integer stores truncate toward zero
 * saturating at int64's range then wrap, bool is != 0) and fill (every dtype, any strides; the
 * value is converted on the host by em_dtype_store, so its bytes are the CPU's).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "cuda_internal.h"
#include "ember/dtype.h"
#include "ember/tensor.h"

namespace {

/* Up to EM_MAX_DIMS dims: the output's shape and both operands' element strides. */
struct strided2 {
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    int64_t ys[EM_MAX_DIMS], xs[EM_MAX_DIMS];
};

__device__ double load(int dt, const char *p, int64_t i) {
    switch (dt) {
    case EM_F32: return (double)((const float *)p)[i];
    case EM_F64: return ((const double *)p)[i];
    case EM_F16: return (double)__half2float(((const __half *)p)[i]);
    case EM_BF16: return (double)__bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case EM_I32: return (double)((const int32_t *)p)[i];
    case EM_I64: return (double)((const int64_t *)p)[i];
    case EM_U8: return (double)((const uint8_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0 ? 1.0 : 0.0; /* bool */
    }
}

/* v truncated toward zero and saturated to int64 (NaN: 0), as em_dtype_store. */
__device__ int64_t store_i64(double v) {
    if (v != v) return 0;
    if (v >= 0x1p63) return INT64_MAX;
    if (v <= -0x1p63) return INT64_MIN;
    return (int64_t)trunc(v);
}

__device__ void store(int dt, char *p, int64_t i, double v) {
    switch (dt) {
    case EM_F32: ((float *)p)[i] = (float)v; break;
    case EM_F64: ((double *)p)[i] = v; break;
    case EM_F16: ((__half *)p)[i] = __double2half(v); break;
    case EM_BF16: ((__nv_bfloat16 *)p)[i] = __double2bfloat16(v); break;
    case EM_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)store_i64(v); break;
    case EM_I64: ((int64_t *)p)[i] = store_i64(v); break;
    case EM_U8: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)store_i64(v); break;
    default: ((uint8_t *)p)[i] = v != 0; break; /* bool: NaN is true */
    }
}

/* Element offsets of linear index lin (C order over the output's shape) in y and x. */
__device__ void offsets(const strided2 &g, int64_t lin, int64_t *oy, int64_t *ox) {
    int64_t y = 0, x = 0;
    for (int d = g.ndim - 1; d >= 0; d--) {
        int64_t i = lin % g.shape[d];
        lin /= g.shape[d];
        y += i * g.ys[d];
        x += i * g.xs[d];
    }
    *oy = y;
    *ox = x;
}

template <typename T>
__global__ void copy_same(strided2 g, int64_t n, T *y, const T *x) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t oy, ox;
        offsets(g, i, &oy, &ox);
        y[oy] = x[ox];
    }
}

__global__ void copy_convert(strided2 g, int64_t n, int ydt, char *y, int xdt, const char *x) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t oy, ox;
        offsets(g, i, &oy, &ox);
        store(ydt, y, oy, load(xdt, x, ox));
    }
}

template <typename T>
__global__ void fill_kernel(strided2 g, int64_t n, T *y, T v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t oy, ox;
        offsets(g, i, &oy, &ox);
        y[oy] = v;
    }
}

unsigned blocks_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 65536 ? b : 65536);
}

/* Shape of y with y's and x's strides; dims of size 1 dropped (x may be NULL). */
strided2 layout(const em_ktensor *y, const em_ktensor *x) {
    strided2 g;
    memset(&g, 0, sizeof g);
    for (int d = 0; d < y->ndim; d++) {
        if (y->shape[d] == 1) continue;
        g.shape[g.ndim] = y->shape[d];
        g.ys[g.ndim] = y->strides[d];
        g.xs[g.ndim] = x ? x->strides[d] : 0;
        g.ndim++;
    }
    return g;
}

bool dense(const em_ktensor *t) {
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expect) return false;
        expect *= t->shape[d];
    }
    return true;
}

template <typename T>
void launch_copy(const strided2 &g, int64_t n, cudaStream_t s, void *y, const void *x) {
    copy_same<T><<<blocks_for(n), 256, 0, s>>>(g, n, (T *)y, (const T *)x);
}

em_status k_copy(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[0], *y = &k->out[0];
    if (y->numel == 0) return EM_OK;
    cudaStream_t s = cuda_stream_of(k);
    size_t es = em_dtype_size(y->dtype);
    if (x->dtype == y->dtype && dense(x) && dense(y)) {
        cudaError_t e = cudaMemcpyAsync(y->data, x->data, (size_t)y->numel * es,
                                        cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess) return cuda_check(e, em_op_name(k->op), "cudaMemcpyAsync",
                                                k->device.index);
        return cuda_check_launch(k, "cudaMemcpyAsync");
    }
    strided2 g = layout(y, x);
    if (x->dtype != y->dtype) {
        copy_convert<<<blocks_for(y->numel), 256, 0, s>>>(g, y->numel, y->dtype, (char *)y->data,
                                                          x->dtype, (const char *)x->data);
        return cuda_check_launch(k, "copy_convert");
    }
    switch (es) {
    case 1: launch_copy<uint8_t>(g, y->numel, s, y->data, x->data); break;
    case 2: launch_copy<uint16_t>(g, y->numel, s, y->data, x->data); break;
    case 4: launch_copy<uint32_t>(g, y->numel, s, y->data, x->data); break;
    default: launch_copy<uint64_t>(g, y->numel, s, y->data, x->data); break;
    }
    return cuda_check_launch(k, "copy_same");
}

em_status k_fill(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    if (y->numel == 0) return EM_OK;
    cudaStream_t s = cuda_stream_of(k);
    size_t es = em_dtype_size(y->dtype);
    alignas(8) unsigned char v[8] = {0};
    em_dtype_store(y->dtype, v, 0, k->attrs[0].v.f);
    bool zero = true;
    for (size_t i = 0; i < es; i++) zero = zero && v[i] == 0;
    if (zero && dense(y)) {
        cudaError_t e = cudaMemsetAsync(y->data, 0, (size_t)y->numel * es, s);
        if (e != cudaSuccess) return cuda_check(e, em_op_name(k->op), "cudaMemsetAsync",
                                                k->device.index);
        return cuda_check_launch(k, "cudaMemsetAsync");
    }
    strided2 g = layout(y, NULL);
    unsigned b = blocks_for(y->numel);
    switch (es) {
    case 1: fill_kernel<uint8_t><<<b, 256, 0, s>>>(g, y->numel, (uint8_t *)y->data, v[0]); break;
    case 2: {
        uint16_t w;
        memcpy(&w, v, 2);
        fill_kernel<uint16_t><<<b, 256, 0, s>>>(g, y->numel, (uint16_t *)y->data, w);
        break;
    }
    case 4: {
        uint32_t w;
        memcpy(&w, v, 4);
        fill_kernel<uint32_t><<<b, 256, 0, s>>>(g, y->numel, (uint32_t *)y->data, w);
        break;
    }
    default: {
        uint64_t w;
        memcpy(&w, v, 8);
        fill_kernel<uint64_t><<<b, 256, 0, s>>>(g, y->numel, (uint64_t *)y->data, w);
        break;
    }
    }
    return cuda_check_launch(k, "fill");
}

} // namespace

extern "C" em_status cuda_register_copy(em_registry *r) {
    static const em_dtype all[] = {EM_F32, EM_F64, EM_F16, EM_BF16,
                                   EM_I32, EM_I64, EM_U8,  EM_BOOL};
    em_status st = cuda_register_dtypes(r, "copy", all, 8, k_copy, "cuda_copy");
    if (st == EM_OK) st = cuda_register_dtypes(r, "fill", all, 8, k_fill, "cuda_fill");
    return st;
}
