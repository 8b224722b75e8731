/*
 * cuda_reduce.cu — reductions on CUDA: sum, prod, amax/amin, max_dim/min_dim (values and
 * indices), argmax/argmin, var/std, logsumexp, norm, all/any, over any set of dims (the kernels
 * see the reduced dims normalised and kept with size 1, core/ops_reduce.c).
 *
 * Semantics are the CPU's (plugins/backend-cpu/cpu_reduce.c): floating inputs accumulate in
 * double, int64 sums and products wrap, max/min propagate NaN, argmax/argmin give the first
 * index of the extreme (a NaN counts as the extreme, its first occurrence wins), var merges
 * (mean, M2, count) parts (Chan et al.), logsumexp shifts by the running max.
 *
 * One engine: each output reduces its elements (C order over the reduced dims, merged where
 * contiguous) with one block of threads, each thread a strided subset, combined in a fixed
 * tree; an output of many elements with few outputs is cut into parts reduced by separate
 * blocks and merged in part order by a second kernel. The combination order depends only on
 * the shapes, so results are the same from run to run (not bitwise the CPU's order: sums
 * agree to rounding in double).
 */
#include "cuda_kernels.cuh"

enum rkind { K_SUM, K_PROD, K_MAX, K_MIN, K_ARGMAX, K_ARGMIN, K_VAR, K_LSE, K_ALL, K_ANY };
enum rmap { M_NONE, M_ABS, M_SQ, M_POW, M_NZ };
enum rfin { F_NONE, F_SQRT, F_ROOT };

struct rstate {
    double a, b, c;
    int64_t i, j;
};

struct rplan {
    int kind, map, fin;
    bool ints;
    double p, correction;
    /* kept dims (the outputs, C order over them) */
    int nk;
    int64_t kshape[EM_MAX_DIMS], kxs[EM_MAX_DIMS], kvs[EM_MAX_DIMS], kis[EM_MAX_DIMS];
    /* reduced dims (merged), element strides in x */
    int nr;
    int64_t rshape[EM_MAX_DIMS], rstride[EM_MAX_DIMS];
    int64_t total, nout, parts, per;
    const void *x;
    void *yv;          /* values (NULL: none) */
    int64_t *yi;       /* indices (NULL: none) */
    em_dtype vdt;      /* the values' dtype */
};

__device__ __forceinline__ rstate st_init(const rplan &P) {
    rstate s = {0, 0, 0, 0, 0};
    switch (P.kind) {
    case K_PROD: s.a = 1, s.i = 1; break;
    case K_MAX: s.a = -INFINITY, s.i = INT64_MIN; break;
    case K_MIN: s.a = INFINITY, s.i = INT64_MAX; break;
    case K_ARGMAX: s.a = -INFINITY, s.i = INT64_MIN, s.j = INT64_MAX; break;
    case K_ARGMIN: s.a = INFINITY, s.i = INT64_MAX, s.j = INT64_MAX; break;
    case K_LSE: s.a = -INFINITY; break;
    case K_ALL: s.i = 1; break;
    default: break;
    }
    return s;
}

/* Whether (v, r) beats the state's (a, j) for argmax (sign 1) / argmin (-1). */
__device__ __forceinline__ bool arg_better_f(double v, int64_t r, double a, int64_t j, int sign) {
    if (a != a) return v != v && r < j;
    if (v != v) return true;
    if (sign > 0 ? v > a : v < a) return true;
    return v == a && r < j;
}
__device__ __forceinline__ bool arg_better_i(int64_t v, int64_t r, int64_t a, int64_t j, int sign) {
    if (sign > 0 ? v > a : v < a) return true;
    return v == a && r < j;
}

__device__ __forceinline__ void lse_merge(rstate &s, double shift, double sum) {
    double m = s.a > shift ? s.a : shift;
    s.b = s.b * exp(s.a - m) + sum * exp(shift - m);
    s.a = m;
}

__device__ __forceinline__ void st_merge(const rplan &P, rstate &s, const rstate &t) {
    switch (P.kind) {
    case K_SUM: s.a += t.a, s.i = (int64_t)((uint64_t)s.i + (uint64_t)t.i); break;
    case K_PROD: s.a *= t.a, s.i = (int64_t)((uint64_t)s.i * (uint64_t)t.i); break;
    case K_MAX:
        if (P.ints) s.i = t.i > s.i ? t.i : s.i;
        else if (s.a == s.a && (t.a != t.a || t.a > s.a)) s.a = t.a;
        break;
    case K_MIN:
        if (P.ints) s.i = t.i < s.i ? t.i : s.i;
        else if (s.a == s.a && (t.a != t.a || t.a < s.a)) s.a = t.a;
        break;
    case K_ARGMAX: case K_ARGMIN: {
        int sign = P.kind == K_ARGMAX ? 1 : -1;
        bool b = P.ints ? arg_better_i(t.i, t.j, s.i, s.j, sign) : arg_better_f(t.a, t.j, s.a, s.j, sign);
        if (b) s = t;
        break;
    }
    case K_VAR:
        if (t.c > 0) {
            double tot = s.c + t.c, d = t.a - s.a;
            s.a += d * (t.c / tot);
            s.b += t.b + d * d * (s.c * t.c / tot);
            s.c = tot;
        }
        break;
    case K_LSE: if (t.a != -INFINITY) lse_merge(s, t.a, t.b); break;
    case K_ALL: s.i = s.i && t.i; break;
    case K_ANY: s.i = s.i || t.i; break;
    }
}

template <class T> __device__ __forceinline__ int64_t as_i64(T) { return 0; }
template <> __device__ __forceinline__ int64_t as_i64<int32_t>(int32_t v) { return v; }
template <> __device__ __forceinline__ int64_t as_i64<int64_t>(int64_t v) { return v; }
template <> __device__ __forceinline__ int64_t as_i64<uint8_t>(uint8_t v) { return v; }
template <> __device__ __forceinline__ int64_t as_i64<bool>(bool v) { return v; }

template <class T>
__device__ __forceinline__ void st_update(const rplan &P, rstate &s, T raw, int64_t r) {
    if (P.ints) {
        int64_t v = as_i64<T>(raw);
        switch (P.kind) {
        case K_SUM: s.i = (int64_t)((uint64_t)s.i + (uint64_t)v); break;
        case K_PROD: s.i = (int64_t)((uint64_t)s.i * (uint64_t)v); break;
        case K_MAX: s.i = v > s.i ? v : s.i; break;
        case K_MIN: s.i = v < s.i ? v : s.i; break;
        case K_ARGMAX: if (arg_better_i(v, r, s.i, s.j, 1)) s.i = v, s.j = r; break;
        case K_ARGMIN: if (arg_better_i(v, r, s.i, s.j, -1)) s.i = v, s.j = r; break;
        case K_ALL: s.i = s.i && v != 0; break;
        case K_ANY: s.i = s.i || v != 0; break;
        default: break;
        }
        return;
    }
    double v = ck_to_double(raw);
    switch (P.map) {
    case M_ABS: v = fabs(v); break;
    case M_SQ: v = v * v; break;
    case M_POW: v = pow(fabs(v), P.p); break;
    case M_NZ: v = v != 0; break;
    default: break;
    }
    switch (P.kind) {
    case K_SUM: s.a += v; break;
    case K_PROD: s.a *= v; break;
    case K_MAX: if (s.a == s.a && (v != v || v > s.a)) s.a = v; break;
    case K_MIN: if (s.a == s.a && (v != v || v < s.a)) s.a = v; break;
    case K_ARGMAX: if (arg_better_f(v, r, s.a, s.j, 1)) s.a = v, s.j = r; break;
    case K_ARGMIN: if (arg_better_f(v, r, s.a, s.j, -1)) s.a = v, s.j = r; break;
    case K_VAR: {
        s.c += 1;
        double d = v - s.a;
        s.a += d / s.c;
        s.b += d * (v - s.a);
        break;
    }
    case K_LSE: {
        double shift = isfinite(v) ? v : 0; /* an infinite element shifts by 0, as the CPU */
        lse_merge(s, shift, exp(v - shift));
        break;
    }
    case K_ALL: s.i = s.i && v != 0; break;
    case K_ANY: s.i = s.i || v != 0; break;
    }
}

/* Element offsets of output o: in x, in the values and in the indices. */
__device__ __forceinline__ void out_offsets(const rplan &P, int64_t o, int64_t *xo, int64_t *vo, int64_t *io) {
    *xo = *vo = *io = 0;
    for (int d = P.nk - 1; d >= 0; d--) {
        int64_t q = o / P.kshape[d], c = o - q * P.kshape[d];
        o = q;
        *xo += c * P.kxs[d];
        *vo += c * P.kvs[d];
        *io += c * P.kis[d];
    }
}

__device__ __forceinline__ int64_t red_offset(const rplan &P, int64_t r) {
    int64_t off = 0;
    for (int d = P.nr - 1; d >= 0; d--) {
        int64_t q = r / P.rshape[d], c = r - q * P.rshape[d];
        r = q;
        off += c * P.rstride[d];
    }
    return off;
}

/* The block's states combined into thread 0's (a fixed tree: lower halves absorb upper). */
__device__ void block_combine(const rplan &P, rstate &s) {
    __shared__ rstate sh[256];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) {
            rstate t = sh[threadIdx.x + w];
            st_merge(P, sh[threadIdx.x], t);
        }
        __syncthreads();
    }
    s = sh[0];
}

template <class T> __device__ __forceinline__ void store_val(void *y, int64_t off, double v) {
    ((T *)y)[off] = ck_from<T>(v);
}

__device__ void st_store(const rplan &P, const rstate &s, int64_t vo, int64_t io) {
    if (P.yi) P.yi[io] = s.j;
    if (!P.yv) return;
    if (P.ints || P.kind == K_ALL || P.kind == K_ANY) {
        switch (P.vdt) {
        case EM_I64: ((int64_t *)P.yv)[vo] = s.i; break;
        case EM_I32: ((int32_t *)P.yv)[vo] = (int32_t)s.i; break;
        case EM_U8: ((uint8_t *)P.yv)[vo] = (uint8_t)s.i; break;
        case EM_BOOL: ((uint8_t *)P.yv)[vo] = s.i != 0; break;
        default: break;
        }
        return;
    }
    double v = s.a;
    if (P.kind == K_VAR) {
        double d = s.c - P.correction;
        v = s.b / (d > 0 ? d : 0);
    } else if (P.kind == K_LSE) {
        v = s.a + log(s.b);
    }
    if (P.fin == F_SQRT) v = sqrt(v);
    else if (P.fin == F_ROOT) v = pow(v, 1.0 / P.p);
    switch (P.vdt) {
    case EM_F32: store_val<float>(P.yv, vo, v); break;
    case EM_F64: store_val<double>(P.yv, vo, v); break;
    case EM_F16: store_val<ck_h>(P.yv, vo, v); break;
    case EM_BF16: store_val<ck_b>(P.yv, vo, v); break;
    default: break;
    }
}

/* Blocks over (output, part): part p of output o reduces r in [p per, (p+1) per). With one
 * part the result is stored; otherwise the state goes to parts[o * P.parts + p]. */
template <class T>
__global__ void reduce_kernel(rplan P, rstate *parts) {
    const T *x = (const T *)P.x;
    for (int64_t b = blockIdx.x; b < P.nout * P.parts; b += gridDim.x) {
        int64_t o = b / P.parts, part = b % P.parts;
        int64_t xo, vo, io;
        out_offsets(P, o, &xo, &vo, &io);
        int64_t lo = part * P.per, hi = lo + P.per < P.total ? lo + P.per : P.total;
        rstate s = st_init(P);
        for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
            st_update<T>(P, s, ck_ld<T>((const char *)x, xo + red_offset(P, r)), r);
        block_combine(P, s);
        if (threadIdx.x == 0) {
            if (P.parts == 1) st_store(P, s, vo, io);
            else parts[b] = s;
        }
        __syncthreads();
    }
}

/* Merge each output's parts in part order (thread 0 walks them) and store. */
__global__ void reduce_parts_kernel(rplan P, const rstate *parts) {
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < P.nout; o += (int64_t)gridDim.x * blockDim.x) {
        rstate s = parts[o * P.parts];
        for (int64_t p = 1; p < P.parts; p++) st_merge(P, s, parts[o * P.parts + p]);
        int64_t xo, vo, io;
        out_offsets(P, o, &xo, &vo, &io);
        st_store(P, s, vo, io);
    }
}

/* ---- the plan ---------------------------------------------------------------------------------- */

static em_status run_plan(const em_kernel_ctx *k, rplan &P, const em_ktensor *x, const bool *red,
                          const em_ktensor *yv, const em_ktensor *yi) {
    const em_ktensor *y = yv ? yv : yi;
    P.x = x->data;
    P.yv = yv ? yv->data : NULL;
    P.yi = yi ? (int64_t *)yi->data : NULL;
    P.vdt = yv ? yv->dtype : EM_I64;
    P.ints = !em_dtype_is_floating(x->dtype);
    P.nk = P.nr = 0;
    P.total = 1;
    P.nout = y->numel;
    for (int d = 0; d < x->ndim; d++) {
        if (red[d]) {
            P.total *= x->shape[d];
            if (x->shape[d] == 1) continue;
            int64_t sb = x->strides[d];
            if (P.nr > 0 && red[d - 1] && P.rstride[P.nr - 1] == sb * x->shape[d]) {
                P.rshape[P.nr - 1] *= x->shape[d];
                P.rstride[P.nr - 1] = sb;
                continue;
            }
            P.rshape[P.nr] = x->shape[d];
            P.rstride[P.nr++] = sb;
        } else {
            P.kshape[P.nk] = y->shape[d];
            P.kxs[P.nk] = x->strides[d];
            P.kvs[P.nk] = yv ? yv->strides[d] : 0;
            P.kis[P.nk] = yi ? yi->strides[d] : 0;
            P.nk++;
        }
    }
    if (P.nr == 0) P.rshape[0] = 1, P.rstride[0] = 1, P.nr = 1;
    if (P.nout == 0) return EM_OK;
    /* Few outputs over many elements: parts of 16384 elements (at most 1024 of them). */
    P.parts = 1;
    if (P.nout < 256 && P.total > 65536) {
        P.parts = (P.total + 16383) / 16384;
        if (P.parts > 1024) P.parts = 1024;
    }
    P.per = (P.total + P.parts - 1) / P.parts;
    rstate *parts = NULL;
    if (P.parts > 1 && !(parts = (rstate *)ck_scratch(k, sizeof(rstate) * (size_t)(P.nout * P.parts))))
        return em_last_status(); /* "<op>: out of memory for ... kernel workspace" */
    int threads = 32;
    while (threads < 256 && threads < P.per) threads *= 2;
    int64_t nb = P.nout * P.parts;
    unsigned blocks = (unsigned)(nb < 65536 ? nb : 65536);
    cudaStream_t s = cuda_stream_of(k);
    const char *what = em_op_name(k->op);
#define GO(T) reduce_kernel<T><<<blocks, threads, 0, s>>>(P, parts)
    CK_SWITCH_ALL(x->dtype, GO, return ck_no_dtype(k, x->dtype))
#undef GO
    em_status st = CK_CHECK(k, what);
    if (st != EM_OK || P.parts == 1) return st;
    reduce_parts_kernel<<<ck_blocks(P.nout, 1), CK_THREADS, 0, s>>>(P, parts);
    return CK_CHECK(k, what);
}

static rplan plan_of(int kind) {
    rplan P;
    memset(&P, 0, sizeof P);
    P.kind = kind;
    return P;
}

/* The reduced dims from attribute 0 (ints). */
static void dims_of(const em_kernel_ctx *k, bool *red) {
    for (int d = 0; d < EM_MAX_DIMS; d++) red[d] = false;
    if (k->attrs[0].type == EM_ATTR_INTS)
        for (int i = 0; i < k->attrs[0].n; i++) red[k->attrs[0].ints[i]] = true;
}

static em_status reduce_simple(const em_kernel_ctx *k, int kind) {
    rplan P = plan_of(kind);
    bool red[EM_MAX_DIMS];
    dims_of(k, red);
    return run_plan(k, P, &k->in[0], red, &k->out[0], NULL);
}
static em_status k_sum(const em_kernel_ctx *k) { return reduce_simple(k, K_SUM); }
static em_status k_prod(const em_kernel_ctx *k) { return reduce_simple(k, K_PROD); }
static em_status k_amax(const em_kernel_ctx *k) { return reduce_simple(k, K_MAX); }
static em_status k_amin(const em_kernel_ctx *k) { return reduce_simple(k, K_MIN); }
static em_status k_all(const em_kernel_ctx *k) { return reduce_simple(k, K_ALL); }
static em_status k_any(const em_kernel_ctx *k) { return reduce_simple(k, K_ANY); }
static em_status k_logsumexp(const em_kernel_ctx *k) { return reduce_simple(k, K_LSE); }

static em_status arg(const em_kernel_ctx *k, int kind) {
    rplan P = plan_of(kind);
    bool red[EM_MAX_DIMS];
    dims_of(k, red);
    return run_plan(k, P, &k->in[0], red, NULL, &k->out[0]);
}
static em_status k_argmax(const em_kernel_ctx *k) { return arg(k, K_ARGMAX); }
static em_status k_argmin(const em_kernel_ctx *k) { return arg(k, K_ARGMIN); }

static em_status extreme_dim(const em_kernel_ctx *k, int kind) {
    rplan P = plan_of(kind);
    bool red[EM_MAX_DIMS] = {false};
    if (k->in[0].ndim > 0) red[k->attrs[0].v.i] = true;
    return run_plan(k, P, &k->in[0], red, &k->out[0], &k->out[1]);
}
static em_status k_max_dim(const em_kernel_ctx *k) { return extreme_dim(k, K_ARGMAX); }
static em_status k_min_dim(const em_kernel_ctx *k) { return extreme_dim(k, K_ARGMIN); }

static em_status var_std(const em_kernel_ctx *k, bool sd) {
    rplan P = plan_of(K_VAR);
    P.correction = k->attrs[1].v.f;
    P.fin = sd ? F_SQRT : F_NONE;
    bool red[EM_MAX_DIMS];
    dims_of(k, red);
    return run_plan(k, P, &k->in[0], red, &k->out[0], NULL);
}
static em_status k_var(const em_kernel_ctx *k) { return var_std(k, false); }
static em_status k_std(const em_kernel_ctx *k) { return var_std(k, true); }

static em_status k_norm(const em_kernel_ctx *k) {
    double p = k->attrs[1].v.f;
    rplan P = plan_of(K_SUM);
    P.p = p;
    if (p == 2) P.map = M_SQ, P.fin = F_SQRT;
    else if (p == 1) P.map = M_ABS;
    else if (p == 0) P.map = M_NZ;
    else if (isinf(p)) P.map = M_ABS, P.kind = p > 0 ? K_MAX : K_MIN;
    else P.map = M_POW, P.fin = F_ROOT;
    bool red[EM_MAX_DIMS];
    dims_of(k, red);
    return run_plan(k, P, &k->in[0], red, &k->out[0], NULL);
}

em_status cuda_register_reduce(em_registry *r) {
    static const em_dtype sum[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64};
    em_status st = EM_OK;
#define REG(op, set, fn) if (st == EM_OK) st = cuda_register_dtypes(r, op, set, CK_N(set), fn, "cuda_" op)
    REG("sum", sum, k_sum);
    REG("prod", sum, k_prod);
    REG("amax", ck_all, k_amax);
    REG("amin", ck_all, k_amin);
    REG("max_dim", ck_all, k_max_dim);
    REG("min_dim", ck_all, k_min_dim);
    REG("argmax", ck_num, k_argmax);
    REG("argmin", ck_num, k_argmin);
    REG("var", ck_flt, k_var);
    REG("std", ck_flt, k_std);
    REG("logsumexp", ck_flt, k_logsumexp);
    REG("norm", ck_flt, k_norm);
    REG("all", ck_all, k_all);
    REG("any", ck_all, k_any);
#undef REG
    return st;
}
