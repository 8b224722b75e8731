/*
 * cuda_math.cu — CUDA kernels of the elementwise math family (contracts in core/ops_math.c,
 * the CPU's loops in plugins/backend-cpu/cpu_math.c, whose semantics these follow): unary
 * math and activations, erf/erfinv, clamp, the scalar variants, pow, maximum/minimum, division
 * with a rounding mode, comparisons, logical ops and the activations' backward helpers.
 * f16/bf16 compute in float and round once; integers wrap like the CPU's unsigned loops.
 * Transcendentals are CUDA's (libdevice: within 1-2 ulp of glibc's, not bitwise).
 */
#include "cuda_kernels.cuh"

/* The op's float parameters from its attributes (absent: dflt), and as saturated integers. */
struct mparams {
    double d0, d1;
    int64_t i0, i1;
};
static int64_t sat_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}
static mparams params(const em_kernel_ctx *k, int nattrs, double dflt) {
    mparams c = {0, 0, 0, 0};
    if (nattrs > 0) c.d0 = ck_attr_f(k, 0, dflt);
    if (nattrs > 1) c.d1 = ck_attr_f(k, 1, dflt);
    c.i0 = sat_i64(c.d0);
    c.i1 = sat_i64(c.d1);
    return c;
}

/* Unary over the floating dtypes (compute float / double) with parameters. */
template <class F>
static em_status un_float(const em_kernel_ctx *k, const char *what, const mparams &c) {
    const em_ktensor *y = &k->out[0], *x = &k->in[0];
#define GO(T)                                                                                   \
    {                                                                                           \
        typedef typename ck_tr<T>::F CT;                                                        \
        ck_un<T, CT, F> op;                                                                     \
        op.p0 = (CT)c.d0, op.p1 = (CT)c.d1;                                                     \
        return ck_ew_run(k, what, op, y, x);                                                    \
    }
    CK_SWITCH_FLOAT(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
}
/* Unary over the integer dtypes with compute type CT(T) chosen by the op (signed or
 * unsigned), the parameters as saturated integers cast to it. */
template <class F, bool SIGNED>
static em_status un_int(const em_kernel_ctx *k, const char *what, const mparams &c) {
    const em_ktensor *y = &k->out[0], *x = &k->in[0];
#define GO(T, CT)                                                                               \
    {                                                                                           \
        ck_un<T, CT, F> op;                                                                     \
        op.p0 = (CT)c.i0, op.p1 = (CT)c.i1;                                                     \
        return ck_ew_run(k, what, op, y, x);                                                    \
    }
    switch (x->dtype) {
    case EM_I32: if constexpr (SIGNED) GO(int32_t, int32_t) else GO(int32_t, uint32_t)
    case EM_I64: if constexpr (SIGNED) GO(int64_t, int64_t) else GO(int64_t, uint64_t)
    case EM_U8: GO(uint8_t, uint8_t)
    default: return ck_no_dtype(k, x->dtype);
    }
#undef GO
}
template <class F>
static em_status bin_float(const em_kernel_ctx *k, const char *what, const mparams &c) {
    const em_ktensor *y = &k->out[0];
#define GO(T)                                                                                   \
    {                                                                                           \
        typedef typename ck_tr<T>::F CT;                                                        \
        ck_bin<T, CT, F> op;                                                                    \
        op.p0 = (CT)c.d0, op.p1 = (CT)c.d1;                                                     \
        return ck_ew_run(k, what, op, y, &k->in[0], &k->in[1]);                                 \
    }
    CK_SWITCH_FLOAT(k->in[0].dtype, GO, return ck_no_dtype(k, k->in[0].dtype))
#undef GO
}

#define FLOAT_KERNEL(name, F, nattrs, dflt)                                                     \
    static em_status k_##name(const em_kernel_ctx *k) {                                         \
        return un_float<F>(k, #name, params(k, nattrs, dflt));                                  \
    }

/* ---- unary math ------------------------------------------------------------------------------- */

CK_F1(f_sqrt, sqrt(x))
CK_F1(f_rsqrt, (X)1 / sqrt(x))
CK_F1(f_reciprocal, (X)1 / x)
CK_F1(f_sigmoid, (X)1 / ((X)1 + exp(-x)))
CK_F1(f_tanh, tanh(x))
CK_F1(f_log1p, log1p(x))
CK_F1(f_expm1, expm1(x))
CK_F1(f_erf, erf(x))
CK_F1(f_abs_f, fabs(x))
CK_F1(f_sign, (X)((x > 0) - (x < 0))) /* sign(NaN) = 0, sign(-0) = +0 */
FLOAT_KERNEL(sqrt, f_sqrt, 0, 0)
FLOAT_KERNEL(rsqrt, f_rsqrt, 0, 0)
FLOAT_KERNEL(reciprocal, f_reciprocal, 0, 0)
FLOAT_KERNEL(sigmoid, f_sigmoid, 0, 0)
FLOAT_KERNEL(tanh, f_tanh, 0, 0)
FLOAT_KERNEL(log1p, f_log1p, 0, 0)
FLOAT_KERNEL(expm1, f_expm1, 0, 0)
FLOAT_KERNEL(erf, f_erf, 0, 0)

/* abs of the most negative int32/int64 wraps to itself (unsigned negation). */
struct f_abs_w32 {
    __device__ int32_t operator()(int32_t x, int32_t, int32_t) const {
        return x < 0 ? (int32_t)(0u - (uint32_t)x) : x;
    }
};
struct f_abs_w64 {
    __device__ int64_t operator()(int64_t x, int64_t, int64_t) const {
        return x < 0 ? (int64_t)(0ull - (uint64_t)x) : x;
    }
};
struct f_id {
    template <class X> __device__ X operator()(X x, X, X) const { return x; }
};
static em_status copy_u8(const em_kernel_ctx *k) { /* abs of uint8: the identity */
    return ck_ew_run(k, "abs", ck_un<uint8_t, uint8_t, f_id>(), &k->out[0], &k->in[0]);
}
static em_status k_abs(const em_kernel_ctx *k) {
    mparams c = params(k, 0, 0);
    if (em_dtype_is_floating(k->in[0].dtype)) return un_float<f_abs_f>(k, "abs", c);
    if (k->in[0].dtype == EM_U8) return copy_u8(k);
    const em_ktensor *y = &k->out[0], *x = &k->in[0];
    if (x->dtype == EM_I32) return ck_ew_run(k, "abs", ck_un<int32_t, int32_t, f_abs_w32>(), y, x);
    return ck_ew_run(k, "abs", ck_un<int64_t, int64_t, f_abs_w64>(), y, x);
}

struct f_sign_u {
    __device__ uint8_t operator()(uint8_t x, uint8_t, uint8_t) const { return x > 0; }
};
struct f_sign_b {
    __device__ bool operator()(bool x, bool, bool) const { return x; }
};
static em_status k_sign(const em_kernel_ctx *k) {
    mparams c = params(k, 0, 0);
    em_dtype dt = k->in[0].dtype;
    if (em_dtype_is_floating(dt)) return un_float<f_sign>(k, "sign", c);
    if (dt == EM_BOOL) return ck_ew_run(k, "sign", ck_un<bool, bool, f_sign_b>(), &k->out[0], &k->in[0]);
    if (dt == EM_U8) return ck_ew_run(k, "sign", ck_un<uint8_t, uint8_t, f_sign_u>(), &k->out[0], &k->in[0]);
    if (dt == EM_I32) return ck_ew_run(k, "sign", ck_un<int32_t, int32_t, f_sign>(), &k->out[0], &k->in[0]);
    return ck_ew_run(k, "sign", ck_un<int64_t, int64_t, f_sign>(), &k->out[0], &k->in[0]);
}

/* erfinv: sc_erfinv_d of plugins/common/scalar_math.h, the CPU's definition. */
CK_F1(f_erfinv, sc_erfinv_d((double)x))
FLOAT_KERNEL(erfinv, f_erfinv, 0, 0)

/* ---- activations ------------------------------------------------------------------------------- */

#define SQRT1_2 0.70710678118654752440
#define SQRT_2_PI 0.79788456080286535588
#define INV_SQRT_2PI 0.39894228040143267794
#define GELU_K 0.044715

CK_F1(f_gelu_erf, (X)0.5 * x * ((X)1 + erf(x * (X)SQRT1_2)))
CK_F1(f_gelu_tanh, (X)0.5 * x * ((X)1 + tanh((X)SQRT_2_PI * (x + (X)GELU_K * x * x * x))))
CK_F1(f_silu, x / ((X)1 + exp(-x)))
CK_F1(f_leaky_relu, x > 0 ? x : x * p0)
FLOAT_KERNEL(silu, f_silu, 0, 0)
FLOAT_KERNEL(leaky_relu, f_leaky_relu, 1, 0.01)

/* The approximate attribute: 0 "none" (or absent), 1 "tanh", -1 anything else. */
static int gelu_mode(const em_kernel_ctx *k) {
    const em_attr *a = &k->attrs[0];
    if (a->type == EM_ATTR_NONE) return 0;
    if (a->type != EM_ATTR_STRING || !a->v.s) return -1;
    return strcmp(a->v.s, "none") == 0 ? 0 : strcmp(a->v.s, "tanh") == 0 ? 1 : -1;
}
static em_status bad_mode(const em_kernel_ctx *k) {
    return em_set_error(EM_ERR_INVALID, "%s: approximate must be \"none\" or \"tanh\"",
                        em_op_name(k->op));
}
static em_status k_gelu(const em_kernel_ctx *k) {
    int m = gelu_mode(k);
    if (m < 0) return bad_mode(k);
    mparams c = {0, 0, 0, 0};
    return m ? un_float<f_gelu_tanh>(k, "gelu", c) : un_float<f_gelu_erf>(k, "gelu", c);
}

/* ---- clamp ------------------------------------------------------------------------------------- */

/* lo then hi: min > max gives max; NaN x stays NaN and a NaN bound compares false. */
#define CLAMP(x, lo, hi) (((x) < (lo) ? (lo) : (x)) > (hi) ? (hi) : ((x) < (lo) ? (lo) : (x)))
CK_F1(f_clamp, CLAMP(x, p0, p1))
CK_F1(f_fill_nan, x - x + p0)

static em_status k_clamp(const em_kernel_ctx *k) {
    bool has_lo = k->attrs[0].type == EM_ATTR_FLOAT, has_hi = k->attrs[1].type == EM_ATTR_FLOAT;
    double lo = has_lo ? k->attrs[0].v.f : -INFINITY, hi = has_hi ? k->attrs[1].v.f : INFINITY;
    mparams c = {lo, hi, 0, 0};
    em_dtype dt = k->in[0].dtype;
    if (em_dtype_is_floating(dt)) {
        if (has_lo && has_hi && (isnan(lo) || isnan(hi))) {
            c.d0 = NAN;
            return un_float<f_fill_nan>(k, "clamp", c);
        }
        return un_float<f_clamp>(k, "clamp", c);
    }
    int64_t tmin = dt == EM_I32 ? INT32_MIN : dt == EM_U8 ? 0 : INT64_MIN;
    int64_t tmax = dt == EM_I32 ? INT32_MAX : dt == EM_U8 ? UINT8_MAX : INT64_MAX;
    int64_t l = has_lo ? sat_i64(lo) : tmin, h = has_hi ? sat_i64(hi) : tmax;
    c.i0 = l < tmin ? tmin : l > tmax ? tmax : l;
    c.i1 = h < tmin ? tmin : h > tmax ? tmax : h;
    return un_int<f_clamp, true>(k, "clamp", c);
}

/* ---- scalar arithmetic --------------------------------------------------------------------------- */

CK_F1(f_add_s, x + p0)
CK_F1(f_sub_s, x - p0)
CK_F1(f_mul_s, x *p0)
CK_F1(f_div_s, x / p0)
#define SCALAR_KERNEL(name, F)                                                                  \
    static em_status k_##name(const em_kernel_ctx *k) {                                         \
        mparams c = params(k, 1, 0);                                                            \
        if (em_dtype_is_floating(k->in[0].dtype)) return un_float<F>(k, #name, c);              \
        return un_int<F, false>(k, #name, c);                                                   \
    }
SCALAR_KERNEL(add_scalar, f_add_s)
SCALAR_KERNEL(sub_scalar, f_sub_s)
SCALAR_KERNEL(mul_scalar, f_mul_s)
static em_status k_div_scalar(const em_kernel_ctx *k) {
    return un_float<f_div_s>(k, "div_scalar", params(k, 1, 1));
}

/* Integer power by squaring, wrapping; a negative exponent gives 1/b truncated. */
__device__ __forceinline__ uint64_t ipow(int64_t b, int64_t e) {
    if (e < 0) return b == 1 ? 1u : b == -1 ? ((e & 1) ? (uint64_t)-1 : 1u) : 0u;
    uint64_t r = 1, x = (uint64_t)b;
    while (e) {
        if (e & 1) r *= x;
        x *= x;
        e >>= 1;
    }
    return r;
}
/* Integer pow: computed on int64 values, stored wrapped to the width. */
template <class T> struct ck_ipow_s {
    CK_OP_TYPES(T, T, ck_nil, ck_nil, 1)
    int64_t e;
    __device__ T operator()(T x, ck_nil, ck_nil) const { return (T)ipow((int64_t)x, e); }
};
template <class T> struct ck_ipow {
    CK_OP_TYPES(T, T, T, ck_nil, 2)
    __device__ T operator()(T x, T y, ck_nil) const { return (T)ipow((int64_t)x, (int64_t)y); }
};

CK_F1(f_pow_sq, x *x)
CK_F1(f_pow_cube, x *x *x)
CK_F1(f_pow_recip_sq, (X)1 / (x * x))
CK_F1(f_pow_gen, pow(x, p0))
static em_status k_pow_scalar(const em_kernel_ctx *k) {
    mparams c = params(k, 1, 1);
    em_dtype dt = k->in[0].dtype;
    const em_ktensor *y = &k->out[0], *x = &k->in[0];
    if (em_dtype_is_floating(dt)) {
        double e = c.d0;
        if (e == 2) return un_float<f_pow_sq>(k, "pow_scalar", c);
        if (e == 3) return un_float<f_pow_cube>(k, "pow_scalar", c);
        if (e == 0.5) return un_float<f_sqrt>(k, "pow_scalar", c);
        if (e == -0.5) return un_float<f_rsqrt>(k, "pow_scalar", c);
        if (e == -1) return un_float<f_reciprocal>(k, "pow_scalar", c);
        if (e == -2) return un_float<f_pow_recip_sq>(k, "pow_scalar", c);
        return un_float<f_pow_gen>(k, "pow_scalar", c);
    }
    switch (dt) {
    case EM_I32: return ck_ew_run(k, "pow_scalar", ck_ipow_s<int32_t>{c.i0}, y, x);
    case EM_I64: return ck_ew_run(k, "pow_scalar", ck_ipow_s<int64_t>{c.i0}, y, x);
    case EM_U8: return ck_ew_run(k, "pow_scalar", ck_ipow_s<uint8_t>{c.i0}, y, x);
    default: return ck_no_dtype(k, dt);
    }
}

/* ---- binary: pow, maximum, minimum --------------------------------------------------------------- */

CK_F2(f_pow, pow(x, y))
/* NaN propagates: x is kept when it is NaN, y wins every comparison with NaN x otherwise. */
CK_F2(f_maximum, (x > y || x != x) ? x : y)
CK_F2(f_minimum, (x < y || x != x) ? x : y)

static em_status k_pow(const em_kernel_ctx *k) {
    em_dtype dt = k->in[0].dtype;
    const em_ktensor *y = &k->out[0];
    switch (dt) {
    case EM_I32: return ck_ew_run(k, "pow", ck_ipow<int32_t>(), y, &k->in[0], &k->in[1]);
    case EM_I64: return ck_ew_run(k, "pow", ck_ipow<int64_t>(), y, &k->in[0], &k->in[1]);
    case EM_U8: return ck_ew_run(k, "pow", ck_ipow<uint8_t>(), y, &k->in[0], &k->in[1]);
    default: return bin_float<f_pow>(k, "pow", params(k, 0, 0));
    }
}

template <class F>
static em_status minmax(const em_kernel_ctx *k, const char *what) {
    em_dtype dt = k->in[0].dtype;
    const em_ktensor *y = &k->out[0], *a = &k->in[0], *b = &k->in[1];
    switch (dt) {
    case EM_I32: return ck_ew_run(k, what, ck_bin<int32_t, int32_t, F>(), y, a, b);
    case EM_I64: return ck_ew_run(k, what, ck_bin<int64_t, int64_t, F>(), y, a, b);
    case EM_U8: return ck_ew_run(k, what, ck_bin<uint8_t, uint8_t, F>(), y, a, b);
    case EM_BOOL: return ck_ew_run(k, what, ck_bin<bool, bool, F>(), y, a, b);
    default: return bin_float<F>(k, what, params(k, 0, 0));
    }
}
static em_status k_maximum(const em_kernel_ctx *k) { return minmax<f_maximum>(k, "maximum"); }
static em_status k_minimum(const em_kernel_ctx *k) { return minmax<f_minimum>(k, "minimum"); }

/* ---- comparisons and logical ops (bool output) ---------------------------------------------------- */

template <class F>
static em_status compare(const em_kernel_ctx *k, const char *what) {
    const em_ktensor *y = &k->out[0], *a = &k->in[0], *b = &k->in[1];
#define GO(T) return ck_ew_run(k, what, ck_cmp<T, typename ck_sg<T>::CT, F>(), y, a, b)
    CK_SWITCH_ALL(a->dtype, GO, return ck_no_dtype(k, a->dtype))
#undef GO
}
#define COMPARE(name, EXPR)                                                                     \
    CK_FC(f_##name, EXPR)                                                                       \
    static em_status k_##name(const em_kernel_ctx *k) { return compare<f_##name>(k, #name); }
COMPARE(eq, x == y)
COMPARE(ne, x != y)
COMPARE(lt, x < y)
COMPARE(le, x <= y)
COMPARE(gt, x > y)
COMPARE(ge, x >= y)
/* Truth of an element: non-zero (NaN is true; -0 is false). */
COMPARE(logical_and, x != 0 && y != 0)
COMPARE(logical_or, x != 0 || y != 0)
COMPARE(logical_xor, (x != 0) != (y != 0))

template <class T> struct ck_not {
    CK_OP_TYPES(bool, T, ck_nil, ck_nil, 1)
    __device__ bool operator()(T x, ck_nil, ck_nil) const {
        return ck_cv<T, typename ck_sg<T>::CT>::in(x) == 0;
    }
};
static em_status k_logical_not(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0], *x = &k->in[0];
#define GO(T) return ck_ew_run(k, "logical_not", ck_not<T>(), y, x)
    CK_SWITCH_ALL(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
}

/* ---- division with a rounding mode ----------------------------------------------------------- */

/* PyTorch's (c10) floor division of floats, through fmod (cpu_math.c's div_floor_T). */
template <class X> __device__ __forceinline__ X div_floor(X a, X b) {
    if (b == 0) return a / b;
    X mod = fmod(a, b), div = (a - mod) / b;
    if (mod != 0 && (b < 0) != (mod < 0)) div -= (X)1;
    if (div == 0) return copysign((X)0, a / b);
    X fl = floor(div);
    return div - fl > (X)0.5 ? fl + (X)1 : fl;
}
CK_F2(f_div, x / y)
CK_F2(f_div_trunc, (X)trunc((double)(x / y)))
CK_F2(f_div_floor, div_floor(x, y))

/* Integers: C's division truncates; floor rounds down where the signs differ and a remainder
 * is left; the most negative value divided by -1 wraps to itself. A zero divisor sets *zero. */
template <class T, class UT> struct ck_div_int {
    CK_OP_TYPES(T, T, T, ck_nil, 2)
    int mode;
    int *zero;
    __device__ T operator()(T a, T b, ck_nil) const {
        if (b == 0) {
            *zero = 1;
            return 0;
        }
        if constexpr ((T)-1 < 0) {
            if (a == (T)((UT)1 << (sizeof(T) * 8 - 1)) && b == (T)-1) return (T)(0u - (UT)a);
            T q = (T)(a / b);
            if (mode == 2 && ((a < 0) != (b < 0)) && (T)(a % b) != 0) q = (T)(q - 1);
            return q;
        } else {
            return (T)(a / b); /* unsigned: trunc and floor agree */
        }
    }
};

static em_status k_div_mode(const em_kernel_ctx *k) {
    const em_attr *a = &k->attrs[0];
    int mode = a->type != EM_ATTR_STRING ? 0 : strcmp(a->v.s, "trunc") == 0 ? 1
               : strcmp(a->v.s, "floor") == 0 ? 2 : -1;
    em_dtype dt = k->in[0].dtype;
    if (mode < 0 || (mode == 0 && !em_dtype_is_floating(dt)))
        return em_set_error(EM_ERR_INVALID, "div_mode: the CUDA kernel got rounding mode %s for %s",
                            a->type == EM_ATTR_STRING ? a->v.s : "(true division)",
                            em_dtype_name(dt));
    mparams c = {0, 0, 0, 0};
    if (em_dtype_is_floating(dt))
        return mode == 0 ? bin_float<f_div>(k, "div_mode", c)
               : mode == 1 ? bin_float<f_div_trunc>(k, "div_mode", c)
                           : bin_float<f_div_floor>(k, "div_mode", c);
    int *zero = (int *)ck_scratch(k, sizeof(int));
    if (!zero) return em_last_status();
    em_status st = ck_rt(k, cudaMemsetAsync(zero, 0, sizeof(int), cuda_stream_of(k)), "cudaMemsetAsync");
    const em_ktensor *y = &k->out[0], *x = &k->in[0], *d = &k->in[1];
    if (st == EM_OK) switch (dt) {
    case EM_I32: st = ck_ew_run(k, "div_mode", ck_div_int<int32_t, uint32_t>{mode, zero}, y, x, d); break;
    case EM_I64: st = ck_ew_run(k, "div_mode", ck_div_int<int64_t, uint64_t>{mode, zero}, y, x, d); break;
    case EM_U8: st = ck_ew_run(k, "div_mode", ck_div_int<uint8_t, uint32_t>{mode, zero}, y, x, d); break;
    default: return ck_no_dtype(k, dt);
    }
    int h = 0;
    if (st == EM_OK && !ck_capturing(k)) st = ck_readback(k, &h, zero, sizeof h);
    if (st == EM_OK && h) return em_set_error(EM_ERR_INVALID, "div_mode: integer division by zero");
    return st;
}

/* ---- backward helpers (x = grad = input 0, y = the forward's input or output = input 1) ----- */

CK_F2(f_threshold_bw, y <= p0 ? (X)0 : x)
CK_F2(f_sigmoid_bw, x *((X)1 - y) * y)
CK_F2(f_tanh_bw, x *((X)1 - y * y))
CK_F2(f_silu_bw, x *((X)1 / ((X)1 + exp(-y))) * ((X)1 + y * ((X)1 - (X)1 / ((X)1 + exp(-y)))))
CK_F2(f_leaky_relu_bw, y > 0 ? x : x * p0)
CK_F2(f_gelu_erf_bw, x *((X)0.5 * ((X)1 + erf(y * (X)SQRT1_2)) + y * (X)INV_SQRT_2PI * exp((X)-0.5 * y * y)))
template <class X> __device__ __forceinline__ X gelu_tanh_d(X v) {
    X t = tanh((X)SQRT_2_PI * (v + (X)GELU_K * v * v * v));
    return (X)0.5 * ((X)1 + t) + (X)0.5 * v * ((X)1 - t * t) * (X)SQRT_2_PI * ((X)1 + (X)(3 * GELU_K) * v * v);
}
CK_F2(f_gelu_tanh_bw, x *gelu_tanh_d(y))

#define BW_KERNEL(name, F, nattrs, dflt)                                                        \
    static em_status k_##name(const em_kernel_ctx *k) {                                         \
        return bin_float<F>(k, #name, params(k, nattrs, dflt));                                 \
    }
BW_KERNEL(threshold_backward, f_threshold_bw, 1, 0)
BW_KERNEL(sigmoid_backward, f_sigmoid_bw, 0, 0)
BW_KERNEL(tanh_backward, f_tanh_bw, 0, 0)
BW_KERNEL(silu_backward, f_silu_bw, 0, 0)
BW_KERNEL(leaky_relu_backward, f_leaky_relu_bw, 1, 0.01)
static em_status k_gelu_backward(const em_kernel_ctx *k) {
    int m = gelu_mode(k);
    if (m < 0) return bad_mode(k);
    mparams c = {0, 0, 0, 0};
    return m ? bin_float<f_gelu_tanh_bw>(k, "gelu_backward", c)
             : bin_float<f_gelu_erf_bw>(k, "gelu_backward", c);
}

/* ---- registration --------------------------------------------------------------------------------- */

em_status cuda_register_math(em_registry *r) {
    em_status st = EM_OK;
#define REG(op, set, fn) if (st == EM_OK) st = cuda_register_dtypes(r, op, set, CK_N(set), fn, "cuda_" op)
    REG("abs", ck_num, k_abs);
    REG("sign", ck_all, k_sign);
    REG("erf", ck_flt, k_erf);
    REG("erfinv", ck_flt, k_erfinv);
    REG("div_mode", ck_num, k_div_mode);
    REG("sqrt", ck_flt, k_sqrt);
    REG("rsqrt", ck_flt, k_rsqrt);
    REG("reciprocal", ck_flt, k_reciprocal);
    REG("sigmoid", ck_flt, k_sigmoid);
    REG("tanh", ck_flt, k_tanh);
    REG("log1p", ck_flt, k_log1p);
    REG("expm1", ck_flt, k_expm1);
    REG("gelu", ck_flt, k_gelu);
    REG("silu", ck_flt, k_silu);
    REG("leaky_relu", ck_flt, k_leaky_relu);
    REG("clamp", ck_num, k_clamp);
    REG("add_scalar", ck_num, k_add_scalar);
    REG("sub_scalar", ck_num, k_sub_scalar);
    REG("mul_scalar", ck_num, k_mul_scalar);
    REG("div_scalar", ck_flt, k_div_scalar);
    REG("pow_scalar", ck_num, k_pow_scalar);
    REG("pow", ck_num, k_pow);
    REG("maximum", ck_all, k_maximum);
    REG("minimum", ck_all, k_minimum);
    REG("eq", ck_all, k_eq);
    REG("ne", ck_all, k_ne);
    REG("lt", ck_all, k_lt);
    REG("le", ck_all, k_le);
    REG("gt", ck_all, k_gt);
    REG("ge", ck_all, k_ge);
    REG("logical_and", ck_all, k_logical_and);
    REG("logical_or", ck_all, k_logical_or);
    REG("logical_xor", ck_all, k_logical_xor);
    REG("logical_not", ck_all, k_logical_not);
    REG("threshold_backward", ck_flt, k_threshold_backward);
    REG("sigmoid_backward", ck_flt, k_sigmoid_backward);
    REG("tanh_backward", ck_flt, k_tanh_backward);
    REG("gelu_backward", ck_flt, k_gelu_backward);
    REG("silu_backward", ck_flt, k_silu_backward);
    REG("leaky_relu_backward", ck_flt, k_leaky_relu_backward);
#undef REG
    return st;
}
