/*
 * cuda_kernels.cuh — what the CUDA kernel files share: storage types and scalar conversions
 * (f16/bf16 bit for bit those of the CPU, cuda_scalar.h), the strided element-iteration engine
 * (a general strided kernel and a vectorised contiguous one), launch checks, index validation
 * and small reductions helpers.
 *
 * The engine. An elementwise op is a functor Op with typedefs O (output storage type), A, B, C
 * (input storage types; ck_nil for absent inputs), a constant NIN (0..3) and
 *     __device__ O operator()(A a, B b, C c) const;
 * ck_ew_run(k, what, op, out, in...) merges the dims that are contiguous for every operand (as
 * the CPU's cpu_foreach does), then launches
 *   - the contiguous kernel when every operand is either dense in C order or a broadcast
 *     scalar (all strides 0): each thread handles 4 neighbouring elements, with vector loads
 *     and stores when the pointers are aligned;
 *   - otherwise the strided kernel: one element per thread (grid-stride), the offset of every
 *     operand computed from the merged shape and element strides.
 * Each element is computed independently, so results never depend on the launch shape.
 * Every launch is checked (cuda_check_launch names the op and the device).
 */
#ifndef EMBER_CUDA_KERNELS_CUH
#define EMBER_CUDA_KERNELS_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/op_helpers.h"
#include "cuda_internal.h" /* cuda_stream_of, cuda_check_launch, cuda_register_dtypes */
#include "cuda_scalar.h"

/* ---- storage types ---------------------------------------------------------------------------- */

struct ck_h { uint16_t x; }; /* float16 bits */
struct ck_b { uint16_t x; }; /* bfloat16 bits */
struct ck_nil {};            /* an absent operand */

template <class T> struct ck_tr;
/* F: the floating compute type (float for f32, f16, bf16; double for f64). */
template <> struct ck_tr<float> { typedef float F; static const em_dtype dt = EM_F32; };
template <> struct ck_tr<double> { typedef double F; static const em_dtype dt = EM_F64; };
template <> struct ck_tr<ck_h> { typedef float F; static const em_dtype dt = EM_F16; };
template <> struct ck_tr<ck_b> { typedef float F; static const em_dtype dt = EM_BF16; };
template <> struct ck_tr<int32_t> { typedef double F; static const em_dtype dt = EM_I32; };
template <> struct ck_tr<int64_t> { typedef double F; static const em_dtype dt = EM_I64; };
template <> struct ck_tr<uint8_t> { typedef double F; static const em_dtype dt = EM_U8; };
template <> struct ck_tr<bool> { typedef double F; static const em_dtype dt = EM_BOOL; };

/* An op functor's typedefs in one line: output O, inputs A, B, C, and NIN. */
#define CK_OP_TYPES(O_, A_, B_, C_, N_)                                                         \
    typedef O_ O;                                                                               \
    typedef A_ A;                                                                               \
    typedef B_ B;                                                                               \
    typedef C_ C;                                                                               \
    static const int NIN = N_;

/* Floating load to the compute type and store from it (f16/bf16 round to nearest even). */
__device__ __forceinline__ float ck_f(float v) { return v; }
__device__ __forceinline__ double ck_f(double v) { return v; }
__device__ __forceinline__ float ck_f(ck_h v) { return ck_f16_to_f32(v.x); }
__device__ __forceinline__ float ck_f(ck_b v) { return ck_bf16_to_f32(v.x); }
template <class T> __device__ __forceinline__ T ck_from(float v);
template <class T> __device__ __forceinline__ T ck_from(double v);
template <> __device__ __forceinline__ float ck_from<float>(float v) { return v; }
template <> __device__ __forceinline__ double ck_from<double>(double v) { return v; }
template <> __device__ __forceinline__ ck_h ck_from<ck_h>(float v) { return ck_h{ck_f32_to_f16(v)}; }
template <> __device__ __forceinline__ ck_b ck_from<ck_b>(float v) { return ck_b{ck_f32_to_bf16(v)}; }
template <> __device__ __forceinline__ float ck_from<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ ck_h ck_from<ck_h>(double v) { return ck_h{ck_f32_to_f16((float)v)}; }
template <> __device__ __forceinline__ ck_b ck_from<ck_b>(double v) { return ck_b{ck_f32_to_bf16((float)v)}; }

/* Conversion between a storage type T and a compute type CT: floats through ck_f / ck_from
 * (f16 and bf16 round once, to nearest even), integers by C casts (wrapping). */
template <class T, class CT> struct ck_cv {
    static __device__ __forceinline__ CT in(T x) { return (CT)x; }
    static __device__ __forceinline__ T out(CT v) { return (T)v; }
};
template <class CT> struct ck_cv<ck_h, CT> {
    static __device__ __forceinline__ CT in(ck_h x) { return (CT)ck_f16_to_f32(x.x); }
    static __device__ __forceinline__ ck_h out(CT v) { return ck_h{ck_f32_to_f16((float)v)}; }
};
template <class CT> struct ck_cv<ck_b, CT> {
    static __device__ __forceinline__ CT in(ck_b x) { return (CT)ck_bf16_to_f32(x.x); }
    static __device__ __forceinline__ ck_b out(CT v) { return ck_b{ck_f32_to_bf16((float)v)}; }
};
/* The CPU's compute types: arithmetic wraps in unsigned integers (ck_ar), sign-aware ops
 * (abs, sign, clamp, comparisons) keep the signed type (ck_sg). */
template <class T> struct ck_ar { typedef typename ck_tr<T>::F CT; };
template <> struct ck_ar<int32_t> { typedef uint32_t CT; };
template <> struct ck_ar<int64_t> { typedef uint64_t CT; };
template <> struct ck_ar<uint8_t> { typedef uint8_t CT; };
template <> struct ck_ar<bool> { typedef bool CT; };
template <class T> struct ck_sg { typedef typename ck_tr<T>::F CT; };
template <> struct ck_sg<int32_t> { typedef int32_t CT; };
template <> struct ck_sg<int64_t> { typedef int64_t CT; };
template <> struct ck_sg<uint8_t> { typedef uint8_t CT; };
template <> struct ck_sg<bool> { typedef bool CT; };

/* Generic functors over a compute type: f(x, y) with parameters p0, p1. */
template <class T, class CT, class F> struct ck_un {
    CK_OP_TYPES(T, T, ck_nil, ck_nil, 1)
    CT p0, p1;
    F f;
    __device__ T operator()(T a, ck_nil, ck_nil) const {
        return ck_cv<T, CT>::out(f(ck_cv<T, CT>::in(a), p0, p1));
    }
};
template <class T, class CT, class F> struct ck_bin {
    CK_OP_TYPES(T, T, T, ck_nil, 2)
    CT p0, p1;
    F f;
    __device__ T operator()(T a, T b, ck_nil) const {
        return ck_cv<T, CT>::out(f(ck_cv<T, CT>::in(a), ck_cv<T, CT>::in(b), p0, p1));
    }
};
/* A comparison or logical op: bool output. */
template <class T, class CT, class F> struct ck_cmp {
    CK_OP_TYPES(bool, T, T, ck_nil, 2)
    F f;
    __device__ bool operator()(T a, T b, ck_nil) const {
        return f(ck_cv<T, CT>::in(a), ck_cv<T, CT>::in(b));
    }
};
/* Functor bodies: CK_F1(name, EXPR in x, p0, p1), CK_F2(name, EXPR in x, y, p0, p1). */
#define CK_F1(name, EXPR)                                                                       \
    struct name {                                                                               \
        template <class X> __device__ __forceinline__ X operator()(X x, X p0, X p1) const {     \
            (void)p0, (void)p1;                                                                 \
            return (X)(EXPR);                                                                   \
        }                                                                                       \
    };
#define CK_F2(name, EXPR)                                                                       \
    struct name {                                                                               \
        template <class X> __device__ __forceinline__ X operator()(X x, X y, X p0, X p1) const { \
            (void)p0, (void)p1;                                                                 \
            return (X)(EXPR);                                                                   \
        }                                                                                       \
    };
#define CK_FC(name, EXPR)                                                                       \
    struct name {                                                                               \
        template <class X> __device__ __forceinline__ bool operator()(X x, X y) const {         \
            return (EXPR);                                                                      \
        }                                                                                       \
    };

/* ---- em_dtype_load / em_dtype_store on the device ------------------------------------------------ */

__device__ __forceinline__ double ck_to_double(float v) { return v; }
__device__ __forceinline__ double ck_to_double(double v) { return v; }
__device__ __forceinline__ double ck_to_double(ck_h v) { return ck_f16_to_f32(v.x); }
__device__ __forceinline__ double ck_to_double(ck_b v) { return ck_bf16_to_f32(v.x); }
__device__ __forceinline__ double ck_to_double(int32_t v) { return v; }
__device__ __forceinline__ double ck_to_double(int64_t v) { return (double)v; }
__device__ __forceinline__ double ck_to_double(uint8_t v) { return v; }
__device__ __forceinline__ double ck_to_double(bool v) { return *(const uint8_t *)&v != 0; }

/* core/dtype.c's f64_to_f32_odd: v rounded to a float by truncation, last bit set when
 * inexact, so the float's rounding to f16/bf16 is the correct rounding of v. */
__device__ __forceinline__ float ck_f64_to_f32_odd(double v) {
    float f = (float)v;
    if (isnan(v) || isinf(f) || (double)f == v) return f;
    if (fabs((double)f) > fabs(v)) f = nextafterf(f, 0.0f);
    return __uint_as_float(__float_as_uint(f) | 1u);
}
/* core/dtype.c's store_i64: truncate toward zero, saturate at int64, NaN 0. */
__device__ __forceinline__ int64_t ck_store_i64(double v) {
    if (isnan(v)) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)trunc(v);
}
template <class T> __device__ __forceinline__ T ck_from_double(double v);
template <> __device__ __forceinline__ float ck_from_double<float>(double v) { return (float)v; }
template <> __device__ __forceinline__ double ck_from_double<double>(double v) { return v; }
template <> __device__ __forceinline__ ck_h ck_from_double<ck_h>(double v) { return ck_h{ck_f32_to_f16(ck_f64_to_f32_odd(v))}; }
template <> __device__ __forceinline__ ck_b ck_from_double<ck_b>(double v) { return ck_b{ck_f32_to_bf16(ck_f64_to_f32_odd(v))}; }
template <> __device__ __forceinline__ int32_t ck_from_double<int32_t>(double v) { return (int32_t)(uint32_t)(uint64_t)ck_store_i64(v); }
template <> __device__ __forceinline__ int64_t ck_from_double<int64_t>(double v) { return ck_store_i64(v); }
template <> __device__ __forceinline__ uint8_t ck_from_double<uint8_t>(double v) { return (uint8_t)(uint64_t)ck_store_i64(v); }
template <> __device__ __forceinline__ bool ck_from_double<bool>(double v) { return v != 0; }

/* Host side: an attribute value as the bytes of one element of dt (em_dtype_store). */
static inline uint64_t ck_scalar_bits(em_dtype dt, double v) {
    uint64_t bits = 0;
    em_dtype_store(dt, &bits, 0, v);
    return bits;
}
template <class T> __device__ __forceinline__ T ck_bits_as(uint64_t bits) {
    T v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* ---- launches -------------------------------------------------------------------------------------- */

#define CK_THREADS 256
#define CK_VEC 4
#define CK_MAXOPS 6

/* Blocks for n work items of `per_thread` elements each (grid-stride loops cover the rest). */
static inline unsigned ck_blocks(int64_t n, int per_thread) {
    int64_t b = (n + (int64_t)CK_THREADS * per_thread - 1) / ((int64_t)CK_THREADS * per_thread);
    if (b < 1) b = 1;
    if (b > 65536) b = 65536;
    return (unsigned)b;
}

/* The launch check after every kernel launch: the op, the device and CUDA's message. */
#define CK_CHECK(k, what) cuda_check_launch((k), (what))

/* A CUDA runtime call made by a kernel function (copies of flags back to the host). */
static inline em_status ck_rt(const em_kernel_ctx *k, cudaError_t e, const char *what) {
    return cuda_check(e, em_op_name(k->op), what, k->device.index);
}

/* Scratch device memory for the call (the core's caching allocator, category workspace). */
static inline void *ck_scratch(const em_kernel_ctx *k, size_t nbytes) {
    void *p;
    return em_kernel_workspace(k, nbytes, &p) == EM_OK ? p : NULL;
}

/* Whether the call's stream is recording a graph (em_graph_capture_begin): nothing runs then,
 * so a flag cannot be read back; the checks that read one are skipped in a capture (what a
 * replay of the graph does with a bad index is CUDA's: docs/cuda.md, graph capture). */
static inline bool ck_capturing(const em_kernel_ctx *k) {
    if (!__atomic_load_n(&cuda_captures, __ATOMIC_RELAXED)) return false;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(cuda_stream_of(k), &cs) == cudaSuccess &&
           cs != cudaStreamCaptureStatusNone;
}

/* Copy n bytes of device memory back to the host and wait for it (a flag a kernel set). */
static inline em_status ck_readback(const em_kernel_ctx *k, void *dst, const void *src, size_t n) {
    cudaStream_t s = cuda_stream_of(k);
    em_status st = ck_rt(k, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    if (st == EM_OK) st = ck_rt(k, cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return st;
}

/* ---- device helpers ------------------------------------------------------------------------------ */

/* Element offset of linear index i (C order over shape[0..nd)) with element strides st,
 * skipping dim `skip` (-1: none): the one strided-offset loop of every kernel. */
__host__ __device__ __forceinline__ int64_t ck_offset(int nd, const int64_t *shape, const int64_t *st,
                                                      int64_t i, int skip = -1) {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        if (d == skip) continue;
        int64_t q = i / shape[d], c = i - q * shape[d];
        i = q;
        off += c * st[d];
    }
    return off;
}

/* The sum of v over the warp's 32 lanes (a fixed butterfly: every lane gets the same value). */
__device__ __forceinline__ double ck_warp_sum(double v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The sum of v over the block (blockDim.x a power of two, at most 256), combined in a fixed
 * tree; the result is thread 0's. Every thread of the block must call it. */
__device__ __forceinline__ double ck_block_sum(double v) {
    __shared__ double sh[256];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    v = sh[0];
    __syncthreads();
    return v;
}

/* ---- the elementwise engine ---------------------------------------------------------------------- */

struct ck_geom {
    int nd;
    int64_t n;
    int64_t shape[EM_MAX_DIMS];
    int64_t st[CK_MAXOPS][EM_MAX_DIMS]; /* element strides per operand */
    char *p[CK_MAXOPS];
};

/* Merge dims (size-1 dropped, neighbours merged where contiguous for every operand). All
 * operands have ts[0]'s shape. Returns whether the contiguous kernel applies: every operand
 * dense (unit stride over one merged dim) or all-zero strides; *bcast gets a bit per operand
 * that is a broadcast scalar. */
static inline bool ck_geom_make(ck_geom *g, int nops, const em_ktensor *const *ts, unsigned *bcast) {
    const em_ktensor *t0 = ts[0];
    memset(g, 0, sizeof *g);
    g->n = t0->numel;
    for (int k = 0; k < nops; k++) g->p[k] = (char *)ts[k]->data;
    int nd = 0;
    for (int d = 0; d < t0->ndim; d++) {
        if (t0->shape[d] == 1) continue;
        bool merge = nd > 0;
        for (int k = 0; k < nops && merge; k++) merge = g->st[k][nd - 1] == ts[k]->strides[d] * t0->shape[d];
        if (merge) {
            g->shape[nd - 1] *= t0->shape[d];
            for (int k = 0; k < nops; k++) g->st[k][nd - 1] = ts[k]->strides[d];
            continue;
        }
        g->shape[nd] = t0->shape[d];
        for (int k = 0; k < nops; k++) g->st[k][nd] = ts[k]->strides[d];
        nd++;
    }
    g->nd = nd;
    *bcast = 0;
    if (nd == 0) { /* one element */
        for (int k = 0; k < nops; k++) *bcast |= k > 0 ? 1u << k : 0;
        return true;
    }
    /* The contiguous kernel: one merged dim, the output dense, each input dense or a scalar
     * (a scalar's zero strides never stop a merge). */
    if (nd != 1 || g->st[0][0] != 1) return false;
    for (int k = 1; k < nops; k++) {
        if (g->st[k][0] == 0) *bcast |= 1u << k;
        else if (g->st[k][0] != 1) return false;
    }
    return true;
}

template <class T> __device__ __forceinline__ T ck_ld(const char *p, int64_t i) { return ((const T *)p)[i]; }
template <> __device__ __forceinline__ ck_nil ck_ld<ck_nil>(const char *, int64_t) { return ck_nil(); }
template <> __device__ __forceinline__ bool ck_ld<bool>(const char *p, int64_t i) { return ((const uint8_t *)p)[i] != 0; }

template <int NOPS, class Op>
__global__ void ck_ew_strided(ck_geom g, Op op) {
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += step) {
        int64_t off[NOPS];
#pragma unroll
        for (int k = 0; k < NOPS; k++) off[k] = 0;
        int64_t r = i;
        for (int d = g.nd - 1; d >= 0; d--) {
            int64_t s = g.shape[d], q = r / s, c = r - q * s;
            r = q;
#pragma unroll
            for (int k = 0; k < NOPS; k++) off[k] += c * g.st[k][d];
        }
        typename Op::A a = ck_ld<typename Op::A>(g.p[1], off[NOPS > 1 ? 1 : 0]);
        typename Op::B b = ck_ld<typename Op::B>(g.p[NOPS > 2 ? 2 : 0], off[NOPS > 2 ? 2 : 0]);
        typename Op::C c = ck_ld<typename Op::C>(g.p[NOPS > 3 ? 3 : 0], off[NOPS > 3 ? 3 : 0]);
        ((typename Op::O *)g.p[0])[off[0]] = op(a, b, c);
    }
}

/* Four neighbouring elements, loaded as one vector when aligned. */
template <class T> struct ck_v4 {
    struct __align__(sizeof(T) * 4 > 16 ? 16 : sizeof(T) * 4) V { T v[4]; };
};
template <> struct ck_v4<ck_nil> { struct V { ck_nil v[4]; }; };

template <class T> __device__ __forceinline__ void ck_ld4(const char *p, int64_t i, bool scalar, bool vec, T r[4]) {
    if (scalar) {
        T v = ck_ld<T>(p, 0);
#pragma unroll
        for (int j = 0; j < 4; j++) r[j] = v;
    } else if (vec) {
        typename ck_v4<T>::V v = *(const typename ck_v4<T>::V *)((const T *)p + i);
#pragma unroll
        for (int j = 0; j < 4; j++) r[j] = v.v[j];
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) r[j] = ck_ld<T>(p, i + j);
    }
}
template <> __device__ __forceinline__ void ck_ld4<ck_nil>(const char *, int64_t, bool, bool, ck_nil r[4]) {}
template <> __device__ __forceinline__ void ck_ld4<bool>(const char *p, int64_t i, bool scalar, bool, bool r[4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) r[j] = ((const uint8_t *)p)[scalar ? 0 : i + j] != 0;
}

template <class Op>
__global__ void ck_ew_contig(ck_geom g, unsigned bcast, bool vec, Op op) {
    typedef typename Op::O O;
    int64_t step = (int64_t)gridDim.x * blockDim.x * 4;
    for (int64_t i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4; i < g.n; i += step) {
        if (i + 4 <= g.n) {
            typename Op::A a[4];
            typename Op::B b[4];
            typename Op::C c[4];
            ck_ld4<typename Op::A>(g.p[1], i, bcast >> 1 & 1, vec, a);
            ck_ld4<typename Op::B>(g.p[2], i, bcast >> 2 & 1, vec, b);
            ck_ld4<typename Op::C>(g.p[3], i, bcast >> 3 & 1, vec, c);
            typename ck_v4<O>::V o;
#pragma unroll
            for (int j = 0; j < 4; j++) o.v[j] = op(a[j], b[j], c[j]);
            if (vec) {
                *(typename ck_v4<O>::V *)((O *)g.p[0] + i) = o;
            } else {
#pragma unroll
                for (int j = 0; j < 4; j++) ((O *)g.p[0])[i + j] = o.v[j];
            }
        } else {
            for (int64_t e = i; e < g.n; e++) {
                typename Op::A a = ck_ld<typename Op::A>(g.p[1], bcast >> 1 & 1 ? 0 : e);
                typename Op::B b = ck_ld<typename Op::B>(g.p[2], bcast >> 2 & 1 ? 0 : e);
                typename Op::C c = ck_ld<typename Op::C>(g.p[3], bcast >> 3 & 1 ? 0 : e);
                ((O *)g.p[0])[e] = op(a, b, c);
            }
        }
    }
}

template <class T> static inline size_t ck_size() { return sizeof(T); }

/* Whether p is aligned for a vector of four T (an absent operand always is). */
template <class T> static inline bool ck_aligned4(const void *p) {
    size_t a = ck_size<T>() * 4 > 16 ? 16 : ck_size<T>() * 4;
    return ((uintptr_t)p % a) == 0;
}
template <> inline bool ck_aligned4<ck_nil>(const void *) { return true; }

/* Run Op over out and its NIN inputs (all of out's shape; broadcast inputs have stride 0). */
template <class Op>
static em_status ck_ew_run(const em_kernel_ctx *k, const char *what, Op op, const em_ktensor *out,
                           const em_ktensor *a = NULL, const em_ktensor *b = NULL,
                           const em_ktensor *c = NULL) {
    if (out->numel == 0) return EM_OK;
    const int nops = 1 + Op::NIN;
    const em_ktensor *ts[4] = {out, a ? a : out, b ? b : out, c ? c : out};
    ck_geom g;
    unsigned bcast;
    bool contig = ck_geom_make(&g, nops, ts, &bcast);
    for (int i = nops; i < 4; i++) g.p[i] = g.p[0]; /* never read: ck_nil */
    cudaStream_t s = cuda_stream_of(k);
    if (contig) {
        bool vec = ck_aligned4<typename Op::O>(g.p[0]) &&
                   ((bcast >> 1 & 1) || ck_aligned4<typename Op::A>(g.p[1])) &&
                   ((bcast >> 2 & 1) || ck_aligned4<typename Op::B>(g.p[2])) &&
                   ((bcast >> 3 & 1) || ck_aligned4<typename Op::C>(g.p[3]));
        ck_ew_contig<Op><<<ck_blocks(g.n, 4), CK_THREADS, 0, s>>>(g, bcast, vec, op);
    } else {
        ck_ew_strided<1 + Op::NIN, Op><<<ck_blocks(g.n, 1), CK_THREADS, 0, s>>>(g, op);
    }
    return CK_CHECK(k, what);
}


/* ---- dtype switches -------------------------------------------------------------------------------- */

/* Call M(T) for the storage type of dt among the floating dtypes / every dtype; `dflt` runs for
 * the others. */
#define CK_SWITCH_FLOAT(dt, M, dflt)                                                            \
    switch (dt) {                                                                               \
    case EM_F32: M(float); break;                                                               \
    case EM_F64: M(double); break;                                                              \
    case EM_F16: M(ck_h); break;                                                                \
    case EM_BF16: M(ck_b); break;                                                               \
    default: dflt; break;                                                                       \
    }
#define CK_SWITCH_ALL(dt, M, dflt)                                                              \
    switch (dt) {                                                                               \
    case EM_F32: M(float); break;                                                               \
    case EM_F64: M(double); break;                                                              \
    case EM_F16: M(ck_h); break;                                                                \
    case EM_BF16: M(ck_b); break;                                                               \
    case EM_I32: M(int32_t); break;                                                             \
    case EM_I64: M(int64_t); break;                                                             \
    case EM_U8: M(uint8_t); break;                                                              \
    case EM_BOOL: M(bool); break;                                                               \
    default: dflt; break;                                                                       \
    }

/* The error for a dtype a kernel function was not instantiated for (registration and the
 * switch agree, so it means a registration bug). */
static inline em_status ck_no_dtype(const em_kernel_ctx *k, em_dtype dt) {
    return em_set_error(EM_ERR_DTYPE, "%s: the CUDA kernel has no loop for %s", em_op_name(k->op),
                        em_dtype_name(dt));
}

static const em_dtype ck_all[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8, EM_BOOL};
static const em_dtype ck_num[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8};
static const em_dtype ck_flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
#define CK_N(a) ((int)(sizeof a / sizeof *a))

/* Attribute i as a float / int / bool with a default when absent. */
static inline double ck_attr_f(const em_kernel_ctx *k, int i, double d) {
    return k->attrs && k->attrs[i].type == EM_ATTR_FLOAT ? k->attrs[i].v.f : d;
}
static inline int64_t ck_attr_i(const em_kernel_ctx *k, int i, int64_t d) {
    return k->attrs && k->attrs[i].type == EM_ATTR_INT ? k->attrs[i].v.i : d;
}
static inline bool ck_attr_b(const em_kernel_ctx *k, int i, bool d) {
    return k->attrs && k->attrs[i].type == EM_ATTR_BOOL ? k->attrs[i].v.b : d;
}

/* A drawing op's Philox origin: the seed and offset attributes (indices is, is + 1), and, when
 * the seed is absent and the offset given (the call recorded in a graph capture), the
 * device address of the capture's generator state {seed, base} (em_kernel_generator_state,
 * ember/dispatch.h), which the kernel reads when it runs: every replay's own state, written
 * ahead of the graph. ck_rng_seed / ck_rng_offset give the origin on the device. */
struct ck_rng {
    uint64_t seed, offset;
    const uint64_t *state; /* NULL: the attributes are absolute */
};
static inline em_status ck_rng_of(const em_kernel_ctx *k, int is, ck_rng *r) {
    r->seed = (uint64_t)ck_attr_i(k, is, 0);
    r->offset = (uint64_t)ck_attr_i(k, is + 1, 0);
    r->state = NULL;
    if (k->attrs && k->attrs[is].type == EM_ATTR_NONE && k->attrs[is + 1].type == EM_ATTR_INT &&
        !(r->state = em_kernel_generator_state(k)))
        return em_last_status();
    return EM_OK;
}
__device__ __forceinline__ uint64_t ck_rng_seed(const ck_rng &r) {
    return r.state ? r.state[0] : r.seed;
}
__device__ __forceinline__ uint64_t ck_rng_offset(const ck_rng &r) {
    return r.state ? r.state[1] + r.offset : r.offset;
}

/* ---- index validation ------------------------------------------------------------------------------ */

/* Every value of the int64 tensor idx in [0, size)? On failure *bad is the first bad value in
 * C order. Synchronises the stream (a kernel finds the first bad position; the host reads it). */
em_status ck_index_check(const em_kernel_ctx *k, const em_ktensor *idx, int64_t size, bool *ok,
                         int64_t *bad);

#endif /* EMBER_CUDA_KERNELS_CUH */
