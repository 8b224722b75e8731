/*
 * cuda_elementwise.cu — CUDA kernels of copy (with dtype conversion), fill, arange, the
 * arithmetic binary ops (add, sub, mul, div), neg, exp, log, relu, relu_backward, where and
 * masked_fill (copy and fill are cuda_copy.cu's). Semantics are the CPU backend's (plugins/backend-cpu/cpu_elementwise.c,
 * cpu_math.c, cpu_data.c): integers wrap (unsigned arithmetic), f16 and bf16 compute in float
 * and round once, conversions follow em_dtype_store (ember/dtype.h).
 */
#include "cuda_kernels.cuh"

/* ---- arange ------------------------------------------------------------------------------------ */

/* y[i] = start + i * step (in double), stored as em_dtype_store does; y is 1-D. */
template <class T>
__global__ void ck_arange_kernel(T *y, int64_t n, int64_t stride, double start, double step) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i * stride] = ck_from_double<T>(start + (double)i * step);
}

static em_status k_arange(const em_kernel_ctx *k) {
    const em_ktensor *o = &k->out[0];
    if (o->numel == 0) return EM_OK;
    double start = k->attrs[0].v.f, step = k->attrs[1].v.f;
    int64_t stride = o->ndim ? o->strides[0] : 1;
    cudaStream_t s = cuda_stream_of(k);
#define GO(T) ck_arange_kernel<T><<<ck_blocks(o->numel, 1), CK_THREADS, 0, s>>>((T *)o->data, o->numel, stride, start, step)
    CK_SWITCH_ALL(o->dtype, GO, return ck_no_dtype(k, o->dtype))
#undef GO
    return CK_CHECK(k, "arange");
}

/* ---- binary arithmetic ------------------------------------------------------------------------------ */

CK_F2(f_add, x + y)
CK_F2(f_sub, x - y)
CK_F2(f_mul, x *y)
CK_F2(f_div, x / y)
/* relu_backward(grad, y): grad where y > 0 */
CK_F2(f_relu_bw, y > 0 ? x : (X)0)

template <class F, bool INTS>
static em_status run_bin(const em_kernel_ctx *k, const char *what) {
    const em_ktensor *y = &k->out[0];
#define GO(T) return ck_ew_run(k, what, ck_bin<T, typename ck_ar<T>::CT, F>(), y, &k->in[0], &k->in[1])
    if constexpr (INTS) {
        CK_SWITCH_ALL(y->dtype, GO, return ck_no_dtype(k, y->dtype))
    } else {
        CK_SWITCH_FLOAT(y->dtype, GO, return ck_no_dtype(k, y->dtype))
    }
#undef GO
}

static em_status k_add(const em_kernel_ctx *k) { return run_bin<f_add, true>(k, "add"); }
static em_status k_sub(const em_kernel_ctx *k) { return run_bin<f_sub, true>(k, "sub"); }
static em_status k_mul(const em_kernel_ctx *k) { return run_bin<f_mul, true>(k, "mul"); }
static em_status k_div(const em_kernel_ctx *k) { return run_bin<f_div, false>(k, "div"); }
static em_status k_relu_bw(const em_kernel_ctx *k) { return run_bin<f_relu_bw, false>(k, "relu_backward"); }

/* ---- unary -------------------------------------------------------------------------------------------- */

CK_F1(f_neg, -x) /* -0 for +0; the integers negate unsigned: wraps at the minimum, as the CPU */
CK_F1(f_exp, exp(x))
CK_F1(f_log, log(x))
/* relu keeps NaN (x <= 0 is false for NaN); unsigned u8 has nothing to clamp. */
CK_F1(f_relu, x <= 0 ? (X)0 : x)

template <class F, bool INTS>
static em_status run_un(const em_kernel_ctx *k, const char *what) {
    const em_ktensor *y = &k->out[0];
#define GO(T) return ck_ew_run(k, what, ck_un<T, typename ck_sg<T>::CT, F>(), y, &k->in[0])
    if constexpr (INTS) {
        switch (y->dtype) {
        case EM_I32: return ck_ew_run(k, what, ck_un<int32_t, uint32_t, F>(), y, &k->in[0]);
        case EM_I64: return ck_ew_run(k, what, ck_un<int64_t, uint64_t, F>(), y, &k->in[0]);
        case EM_U8: return ck_ew_run(k, what, ck_un<uint8_t, uint32_t, F>(), y, &k->in[0]);
        default: break;
        }
    }
    CK_SWITCH_FLOAT(y->dtype, GO, return ck_no_dtype(k, y->dtype))
#undef GO
}

static em_status k_neg(const em_kernel_ctx *k) { return run_un<f_neg, true>(k, "neg"); }
static em_status k_exp(const em_kernel_ctx *k) { return run_un<f_exp, false>(k, "exp"); }
static em_status k_log(const em_kernel_ctx *k) { return run_un<f_log, false>(k, "log"); }

/* relu on integers compares signed (u8: the identity). */
template <class T> struct ck_relu_int {
    CK_OP_TYPES(T, T, ck_nil, ck_nil, 1)
    __device__ T operator()(T x, ck_nil, ck_nil) const { return x < 0 ? (T)0 : x; }
};
template <> struct ck_relu_int<uint8_t> {
    CK_OP_TYPES(uint8_t, uint8_t, ck_nil, ck_nil, 1)
    __device__ uint8_t operator()(uint8_t x, ck_nil, ck_nil) const { return x; }
};
static em_status k_relu(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0], *x = &k->in[0];
    switch (y->dtype) {
    case EM_I32: return ck_ew_run(k, "relu", ck_relu_int<int32_t>(), y, x);
    case EM_I64: return ck_ew_run(k, "relu", ck_relu_int<int64_t>(), y, x);
    case EM_U8: return ck_ew_run(k, "relu", ck_relu_int<uint8_t>(), y, x);
    default: return run_un<f_relu, false>(k, "relu");
    }
}

/* ---- where and masked_fill ------------------------------------------------------------------------------ */

template <class T> struct ck_where_op {
    CK_OP_TYPES(T, bool, T, T, 3)
    __device__ T operator()(bool c, T a, T b) const { return c ? a : b; }
};
static em_status k_where(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    switch (em_dtype_size(y->dtype)) {
    case 1: return ck_ew_run(k, "where", ck_where_op<uint8_t>(), y, &k->in[0], &k->in[1], &k->in[2]);
    case 2: return ck_ew_run(k, "where", ck_where_op<uint16_t>(), y, &k->in[0], &k->in[1], &k->in[2]);
    case 4: return ck_ew_run(k, "where", ck_where_op<uint32_t>(), y, &k->in[0], &k->in[1], &k->in[2]);
    default: return ck_ew_run(k, "where", ck_where_op<uint64_t>(), y, &k->in[0], &k->in[1], &k->in[2]);
    }
}

/* y = mask ? value : x (the mask read as bytes, as the CPU does). */
template <class T> struct ck_masked_fill_op {
    CK_OP_TYPES(T, T, uint8_t, ck_nil, 2)
    T v;
    __device__ T operator()(T x, uint8_t m, ck_nil) const { return m ? v : x; }
};
static em_status k_masked_fill(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    uint64_t bits = ck_scalar_bits(y->dtype, k->attrs[0].v.f);
    const em_ktensor *x = &k->in[0], *m = &k->in[1];
    switch (em_dtype_size(y->dtype)) {
    case 1: return ck_ew_run(k, "masked_fill", ck_masked_fill_op<uint8_t>{(uint8_t)bits}, y, x, m);
    case 2: return ck_ew_run(k, "masked_fill", ck_masked_fill_op<uint16_t>{(uint16_t)bits}, y, x, m);
    case 4: return ck_ew_run(k, "masked_fill", ck_masked_fill_op<uint32_t>{(uint32_t)bits}, y, x, m);
    default: return ck_ew_run(k, "masked_fill", ck_masked_fill_op<uint64_t>{bits}, y, x, m);
    }
}

/* ---- registration ---------------------------------------------------------------------------------------- */

em_status cuda_register_elementwise(em_registry *r) {
    em_status st = EM_OK;
#define REG(op, set, fn) if (st == EM_OK) st = cuda_register_dtypes(r, op, set, CK_N(set), fn, "cuda_" op)
    REG("arange", ck_num, k_arange);
    REG("add", ck_all, k_add);
    REG("sub", ck_num, k_sub);
    REG("mul", ck_all, k_mul);
    REG("div", ck_flt, k_div);
    REG("neg", ck_num, k_neg);
    REG("exp", ck_flt, k_exp);
    REG("log", ck_flt, k_log);
    REG("relu", ck_num, k_relu);
    REG("relu_backward", ck_flt, k_relu_bw);
    REG("where", ck_all, k_where);
    REG("masked_fill", ck_all, k_masked_fill);
#undef REG
    return st;
}
