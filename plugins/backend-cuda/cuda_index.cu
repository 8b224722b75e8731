/*
 * cuda_index.cu — the indexing kernels on CUDA: index_select, gather, scatter, scatter_add,
 * index_add, embedding, embedding_backward, one_hot, and the layout ops tril, triu, flip and
 * linspace (semantics of the CPU's
 * plugins/backend-cpu/cpu_elementwise.c and cpu_data.c).
 *
 * Indices are checked on the device before anything is written (ck_index_check: a kernel finds
 * the first bad position, the host reads it back — one stream synchronisation per call), so a
 * bad index gives the CPU's EM_ERR_RANGE message instead of a fault. Writes that several
 * indices may share are ordered as the CPU orders them, without atomics: scatter gives each
 * thread one target position scanning its line in order (the last index wins), index_add and
 * embedding_backward give each thread one position of the slice walking the indices in order,
 * so sums are the CPU's, bit for bit, whatever the duplicates.
 */
#include "cuda_kernels.cuh"

/* ---- index validation ----------------------------------------------------------------------- */

struct idx_geom {
    int nd;
    int64_t shape[EM_MAX_DIMS], st[EM_MAX_DIMS];
    int64_t n;
};

static idx_geom geom_of(const em_ktensor *t) {
    idx_geom g;
    memset(&g, 0, sizeof g);
    g.nd = t->ndim;
    g.n = t->numel;
    for (int d = 0; d < t->ndim; d++) g.shape[d] = t->shape[d], g.st[d] = t->strides[d];
    return g;
}

/* Element offset of linear index i (C order over g's shape), skipping dim `skip` (-1: none). */
__host__ __device__ __forceinline__ int64_t goff(const idx_geom &g, int64_t i, int skip = -1) {
    return ck_offset(g.nd, g.shape, g.st, i, skip);
}

__global__ void check_kernel(const int64_t *idx, idx_geom g, int64_t size, unsigned long long *bad) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = idx[goff(g, i)];
        if (v < 0 || v >= size) atomicMin(bad, (unsigned long long)i);
    }
}

em_status ck_index_check(const em_kernel_ctx *k, const em_ktensor *idx, int64_t size, bool *ok,
                         int64_t *bad) {
    *ok = true;
    *bad = 0;
    if (idx->numel == 0 || ck_capturing(k)) return EM_OK;
    unsigned long long *flag = (unsigned long long *)ck_scratch(k, sizeof *flag);
    if (!flag) return em_last_status();
    cudaStream_t s = cuda_stream_of(k);
    em_status st = ck_rt(k, cudaMemsetAsync(flag, 0xff, sizeof *flag, s), "cudaMemsetAsync");
    if (st != EM_OK) return st;
    idx_geom g = geom_of(idx);
    check_kernel<<<ck_blocks(g.n, 1), CK_THREADS, 0, s>>>((const int64_t *)idx->data, g, size, flag);
    if ((st = CK_CHECK(k, em_op_name(k->op))) != EM_OK) return st;
    unsigned long long h;
    if ((st = ck_readback(k, &h, flag, sizeof h)) != EM_OK) return st;
    if (h == ~0ull) return EM_OK;
    *ok = false;
    return ck_readback(k, bad, (const int64_t *)idx->data + goff(g, (int64_t)h), sizeof *bad);
}

static em_status index_error(const em_kernel_ctx *k, int64_t v, int dim, int64_t size) {
    return em_set_error(EM_ERR_RANGE, "%s: index %lld is out of bounds for dim %d with size "
                        "%lld (expected 0..%lld)", em_op_name(k->op), (long long)v, dim,
                        (long long)size, (long long)(size - 1));
}

template <class T> struct ck_copy_bits {
    CK_OP_TYPES(T, T, ck_nil, ck_nil, 1)
    __device__ T operator()(T x, ck_nil, ck_nil) const { return x; }
};
/* y = x elementwise (same dtype, any strides). */
static em_status copy_tensor(const em_kernel_ctx *k, const em_ktensor *y, const em_ktensor *x) {
    const char *w = em_op_name(k->op);
    switch (em_dtype_size(y->dtype)) {
    case 1: return ck_ew_run(k, w, ck_copy_bits<uint8_t>(), y, x);
    case 2: return ck_ew_run(k, w, ck_copy_bits<uint16_t>(), y, x);
    case 4: return ck_ew_run(k, w, ck_copy_bits<uint32_t>(), y, x);
    default: return ck_ew_run(k, w, ck_copy_bits<uint64_t>(), y, x);
    }
}
template <class T> struct ck_zero {
    CK_OP_TYPES(T, ck_nil, ck_nil, ck_nil, 0)
    __device__ T operator()(ck_nil, ck_nil, ck_nil) const { return (T)0; }
};
static em_status zero_tensor(const em_kernel_ctx *k, const em_ktensor *y) {
    const char *w = em_op_name(k->op);
    switch (em_dtype_size(y->dtype)) {
    case 1: return ck_ew_run(k, w, ck_zero<uint8_t>(), y);
    case 2: return ck_ew_run(k, w, ck_zero<uint16_t>(), y);
    case 4: return ck_ew_run(k, w, ck_zero<uint32_t>(), y);
    default: return ck_ew_run(k, w, ck_zero<uint64_t>(), y);
    }
}

/* ---- index_select, gather: y at i reads x with the index substituted at dim ----------------- */

/* index_select: the index is 1-D along dim of y; gather: the index has y's shape. */
template <class T>
__global__ void select_kernel(T *y, idx_geom yg, const T *x, idx_geom xg, const int64_t *idx,
                              idx_geom ig, int dim, bool gather) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < yg.n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i, yo = 0, xo = 0, io = 0;
        for (int d = yg.nd - 1; d >= 0; d--) {
            int64_t q = r / yg.shape[d], c = r - q * yg.shape[d];
            r = q;
            yo += c * yg.st[d];
            if (gather) io += c * ig.st[d];
            if (d != dim) xo += c * xg.st[d];
            else if (!gather) io = c * (ig.nd ? ig.st[0] : 1);
        }
        xo += idx[io] * xg.st[dim];
        y[yo] = x[xo];
    }
}

static em_status run_select(const em_kernel_ctx *k, const em_ktensor *y, const em_ktensor *x,
                            const em_ktensor *idx, int dim, bool gather) {
    if (y->numel == 0) return EM_OK;
    idx_geom yg = geom_of(y), xg = geom_of(x), ig = geom_of(idx);
    cudaStream_t s = cuda_stream_of(k);
    unsigned b = ck_blocks(y->numel, 1);
    const int64_t *ip = (const int64_t *)idx->data;
    switch (em_dtype_size(y->dtype)) {
    case 1: select_kernel<uint8_t><<<b, CK_THREADS, 0, s>>>((uint8_t *)y->data, yg, (const uint8_t *)x->data, xg, ip, ig, dim, gather); break;
    case 2: select_kernel<uint16_t><<<b, CK_THREADS, 0, s>>>((uint16_t *)y->data, yg, (const uint16_t *)x->data, xg, ip, ig, dim, gather); break;
    case 4: select_kernel<uint32_t><<<b, CK_THREADS, 0, s>>>((uint32_t *)y->data, yg, (const uint32_t *)x->data, xg, ip, ig, dim, gather); break;
    default: select_kernel<uint64_t><<<b, CK_THREADS, 0, s>>>((uint64_t *)y->data, yg, (const uint64_t *)x->data, xg, ip, ig, dim, gather); break;
    }
    return CK_CHECK(k, em_op_name(k->op));
}

static em_status k_index_select(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[0], *idx = &k->in[1], *y = &k->out[0];
    int dim = (int)k->attrs[0].v.i;
    int64_t size = x->shape[dim], bad;
    bool ok;
    em_status st = ck_index_check(k, idx, size, &ok, &bad);
    if (st != EM_OK) return st;
    if (!ok) /* PyTorch's index_select takes no negative indices */
        return em_set_error(EM_ERR_RANGE, "index_select: index %lld is out of range for dim %d "
                            "of size %lld", (long long)bad, dim, (long long)size);
    return run_select(k, y, x, idx, dim, false);
}

static em_status k_gather(const em_kernel_ctx *k) {
    em_ktensor x = em_ktensor_at_least_1d(&k->in[0]), idx = em_ktensor_at_least_1d(&k->in[1]), y = em_ktensor_at_least_1d(&k->out[0]);
    int dim = (int)k->attrs[0].v.i;
    if (idx.numel == 0) return EM_OK;
    int64_t size = x.shape[dim], bad;
    bool ok;
    em_status st = ck_index_check(k, &idx, size, &ok, &bad);
    if (st != EM_OK) return st;
    if (!ok) return index_error(k, bad, dim, size);
    return run_select(k, &y, &x, &idx, dim, true);
}

/* ---- scatter, scatter_add: a thread per (line, target position), scanning the line --------- */

template <class T, class CT, bool ADD>
__global__ void scatter_kernel(T *y, idx_geom yg, const T *src, idx_geom sg, const int64_t *idx,
                               idx_geom ig, int dim, int64_t outer, int64_t ysize) {
    int64_t L = ig.shape[dim];
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * ysize; t += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = t / ysize, v = t % ysize;
        /* the line's bases: idx's coordinates except dim, in each tensor's strides */
        int64_t r = o, io = 0, so = 0, yo = 0;
        for (int d = ig.nd - 1; d >= 0; d--) {
            if (d == dim) continue;
            int64_t q = r / ig.shape[d], c = r - q * ig.shape[d];
            r = q;
            io += c * ig.st[d];
            so += c * sg.st[d];
            yo += c * yg.st[d];
        }
        T *dst = y + yo + v * yg.st[dim];
        T cur = *dst;
        bool hit = false;
        for (int64_t j = 0; j < L; j++) {
            if (idx[io + j * ig.st[dim]] != v) continue;
            T s = src[so + j * sg.st[dim]];
            if constexpr (ADD) cur = ck_cv<T, CT>::out((CT)(ck_cv<T, CT>::in(cur) + ck_cv<T, CT>::in(s)));
            else cur = s;
            hit = true;
        }
        if (hit) *dst = cur;
    }
}

/* The accumulation types of the CPU's acc_line (ints in unsigned 32/64 bits, bool via != 0). */
template <class T> struct acc_ct { typedef typename ck_tr<T>::F CT; };
template <> struct acc_ct<int32_t> { typedef uint32_t CT; };
template <> struct acc_ct<int64_t> { typedef uint64_t CT; };
template <> struct acc_ct<uint8_t> { typedef uint32_t CT; };
template <> struct acc_ct<bool> { typedef uint32_t CT; };

static em_status scatter_common(const em_kernel_ctx *k, bool add) {
    em_ktensor self = em_ktensor_at_least_1d(&k->in[0]), idx = em_ktensor_at_least_1d(&k->in[1]), src = em_ktensor_at_least_1d(&k->in[2]),
               y = em_ktensor_at_least_1d(&k->out[0]);
    int dim = (int)k->attrs[0].v.i;
    int64_t size = y.shape[dim], bad;
    bool ok;
    em_status st = ck_index_check(k, &idx, size, &ok, &bad);
    if (st != EM_OK) return st;
    if (!ok) return index_error(k, bad, dim, size);
    if (!em_ktensor_same_memory(&y, &self) && (st = copy_tensor(k, &y, &self)) != EM_OK) return st;
    if (idx.numel == 0) return EM_OK;
    idx_geom yg = geom_of(&y), sg = geom_of(&src), ig = geom_of(&idx);
    int64_t outer = idx.numel / idx.shape[dim];
    cudaStream_t s = cuda_stream_of(k);
    unsigned b = ck_blocks(outer * size, 1);
#define GO(T)                                                                                   \
    if (add) scatter_kernel<T, typename acc_ct<T>::CT, true><<<b, CK_THREADS, 0, s>>>((T *)y.data, yg, (const T *)src.data, sg, (const int64_t *)idx.data, ig, dim, outer, size); \
    else scatter_kernel<T, T, false><<<b, CK_THREADS, 0, s>>>((T *)y.data, yg, (const T *)src.data, sg, (const int64_t *)idx.data, ig, dim, outer, size)
    CK_SWITCH_ALL(y.dtype, GO, return ck_no_dtype(k, y.dtype))
#undef GO
    return CK_CHECK(k, em_op_name(k->op));
}
static em_status k_scatter(const em_kernel_ctx *k) { return scatter_common(k, false); }
static em_status k_scatter_add(const em_kernel_ctx *k) { return scatter_common(k, true); }

/* ---- index_add, embedding_backward: a thread per slice position, the indices in order ---- */

/* The CPU's alpha in a dtype's compute type: floats round, integers truncate then wrap. */
static int64_t trunc_i64(double v) {
    if (!(v == v)) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}
template <class CT> static CT alpha_as(em_dtype dt, double a) {
    switch (dt) {
    case EM_F32: case EM_F16: case EM_BF16: return (CT)(float)a;
    case EM_F64: return (CT)a;
    case EM_I32: return (CT)(uint32_t)(uint64_t)trunc_i64(a);
    case EM_I64: return (CT)(uint64_t)trunc_i64(a);
    case EM_U8: return (CT)(uint32_t)(uint8_t)(uint64_t)trunc_i64(a);
    default: return (CT)(uint32_t)(a != 0);
    }
}

template <class T, class CT>
__global__ void iadd_kernel(T *y, idx_geom yg, const T *x, idx_geom xg, const int64_t *idx,
                            int64_t istride, int64_t n, int dim, int64_t slice, CT alpha, int64_t skip) {
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < slice; p += (int64_t)gridDim.x * blockDim.x) {
        int64_t yo = goff(yg, p, dim), xo = goff(xg, p, dim);
        for (int64_t i = 0; i < n; i++) {
            int64_t v = idx[i * istride];
            if (v == skip) continue;
            T *d = y + yo + v * yg.st[dim];
            *d = ck_cv<T, CT>::out((CT)(ck_cv<T, CT>::in(*d) + alpha * ck_cv<T, CT>::in(x[xo + i * xg.st[dim]])));
        }
    }
}

static em_status index_add_into(const em_kernel_ctx *k, const em_ktensor *y, const em_ktensor *x,
                                const em_ktensor *idx, int dim, double alpha, int64_t skip) {
    idx_geom yg = geom_of(y), xg = geom_of(x);
    /* The slice: every dim but dim, walked over y's shape (x has it there too). */
    int64_t slice = 1;
    for (int d = 0; d < y->ndim; d++)
        if (d != dim) slice *= y->shape[d], xg.shape[d] = y->shape[d];
    if (slice == 0 || idx->numel == 0) return EM_OK;
    cudaStream_t s = cuda_stream_of(k);
    unsigned b = ck_blocks(slice, 1);
    int64_t is = idx->ndim ? idx->strides[0] : 1;
    const int64_t *ip = (const int64_t *)idx->data;
#define GO(T)                                                                                   \
    {                                                                                           \
        typedef typename acc_ct<T>::CT CT;                                                      \
        iadd_kernel<T, CT><<<b, CK_THREADS, 0, s>>>((T *)y->data, yg, (const T *)x->data, xg, ip, is, idx->numel, dim, slice, alpha_as<CT>(y->dtype, alpha), skip); \
    }
    CK_SWITCH_ALL(y->dtype, GO, return ck_no_dtype(k, y->dtype))
#undef GO
    return CK_CHECK(k, em_op_name(k->op));
}

static em_status k_index_add(const em_kernel_ctx *k) {
    em_ktensor x = em_ktensor_at_least_1d(&k->in[0]), idx = k->in[1], src = em_ktensor_at_least_1d(&k->in[2]),
               y = em_ktensor_at_least_1d(&k->out[0]);
    int dim = (int)k->attrs[0].v.i;
    double alpha = k->attrs[1].type == EM_ATTR_NONE ? 1.0 : k->attrs[1].v.f;
    int64_t bad;
    bool ok;
    em_status st = ck_index_check(k, &idx, y.shape[dim], &ok, &bad);
    if (st != EM_OK) return st;
    if (!ok) return index_error(k, bad, dim, y.shape[dim]);
    if (!em_ktensor_same_memory(&y, &x) && (st = copy_tensor(k, &y, &x)) != EM_OK) return st;
    return index_add_into(k, &y, &src, &idx, dim, alpha, -1);
}

static em_status k_embedding_backward(const em_kernel_ctx *k) {
    const em_ktensor *g = &k->in[0], *idx = &k->in[1], *y = &k->out[0];
    int64_t bad, v = y->shape[0];
    bool ok;
    em_status st = ck_index_check(k, idx, v, &ok, &bad);
    if (st != EM_OK) return st;
    if (!ok)
        return em_set_error(EM_ERR_RANGE, "embedding_backward: index %lld is out of range for "
                            "num_weights V = %lld (expected 0..%lld)", (long long)bad,
                            (long long)v, (long long)(v - 1));
    if ((st = zero_tensor(k, y)) != EM_OK) return st;
    int64_t pad = k->attrs[1].type == EM_ATTR_NONE ? -1 : k->attrs[1].v.i;
    return index_add_into(k, y, g, idx, 0, 1.0, pad);
}

/* ---- embedding: y[i, j] = w[idx[i], j] ------------------------------------------------------ */

template <class T>
__global__ void embedding_kernel(T *y, idx_geom yg, const T *w, int64_t ws0, int64_t ws1,
                                 const int64_t *idx, idx_geom ig, int64_t D) {
    int yl = yg.nd - 1;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < ig.n * D; t += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = t / D, j = t % D;
        int64_t v = idx[goff(ig, i)];
        /* y's offset of row i: its coordinates over every dim but the last */
        int64_t r = i, yo = j * yg.st[yl];
        for (int d = yl - 1; d >= 0; d--) {
            int64_t q = r / yg.shape[d], c = r - q * yg.shape[d];
            r = q;
            yo += c * yg.st[d];
        }
        y[yo] = w[v * ws0 + j * ws1];
    }
}

static em_status k_embedding(const em_kernel_ctx *k) {
    const em_ktensor *w = &k->in[0], *idx = &k->in[1], *y = &k->out[0];
    int64_t bad, v = w->shape[0];
    bool ok;
    em_status st = ck_index_check(k, idx, v, &ok, &bad);
    if (st != EM_OK) return st;
    if (!ok)
        return em_set_error(EM_ERR_RANGE, "embedding: index %lld is out of range for a weight "
                            "of V = %lld rows (expected 0..%lld)", (long long)bad, (long long)v,
                            (long long)(v - 1));
    int64_t D = w->shape[1];
    if (idx->numel == 0 || D == 0) return EM_OK;
    idx_geom yg = geom_of(y), ig = geom_of(idx);
    cudaStream_t s = cuda_stream_of(k);
    unsigned b = ck_blocks(idx->numel * D, 1);
    const int64_t *ip = (const int64_t *)idx->data;
    switch (em_dtype_size(y->dtype)) {
    case 1: embedding_kernel<uint8_t><<<b, CK_THREADS, 0, s>>>((uint8_t *)y->data, yg, (const uint8_t *)w->data, w->strides[0], w->strides[1], ip, ig, D); break;
    case 2: embedding_kernel<uint16_t><<<b, CK_THREADS, 0, s>>>((uint16_t *)y->data, yg, (const uint16_t *)w->data, w->strides[0], w->strides[1], ip, ig, D); break;
    case 4: embedding_kernel<uint32_t><<<b, CK_THREADS, 0, s>>>((uint32_t *)y->data, yg, (const uint32_t *)w->data, w->strides[0], w->strides[1], ip, ig, D); break;
    default: embedding_kernel<uint64_t><<<b, CK_THREADS, 0, s>>>((uint64_t *)y->data, yg, (const uint64_t *)w->data, w->strides[0], w->strides[1], ip, ig, D); break;
    }
    return CK_CHECK(k, "embedding");
}

/* ---- one_hot ---------------------------------------------------------------------------------- */

__global__ void one_hot_kernel(int64_t *y, idx_geom yg, const int64_t *x, idx_geom xg) {
    int yl = yg.nd - 1;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < xg.n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t v = x[goff(xg, i)];
        int64_t r = i, yo = v * yg.st[yl];
        for (int d = yl - 1; d >= 0; d--) {
            int64_t q = r / yg.shape[d], c = r - q * yg.shape[d];
            r = q;
            yo += c * yg.st[d];
        }
        y[yo] = 1;
    }
}

static em_status k_one_hot(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[0], *y = &k->out[0];
    int64_t c = k->attrs[0].v.i, bad;
    bool ok;
    em_status st = ck_index_check(k, x, c, &ok, &bad);
    if (st != EM_OK) return st;
    if (!ok)
        return bad < 0 ? em_set_error(EM_ERR_RANGE, "one_hot: class values must be "
                                      "non-negative, got %lld", (long long)bad)
                       : em_set_error(EM_ERR_RANGE, "one_hot: class value %lld is out of range "
                                      "for num_classes %lld", (long long)bad, (long long)c);
    if ((st = zero_tensor(k, y)) != EM_OK || x->numel == 0) return st;
    one_hot_kernel<<<ck_blocks(x->numel, 1), CK_THREADS, 0, cuda_stream_of(k)>>>(
        (int64_t *)y->data, geom_of(y), (const int64_t *)x->data, geom_of(x));
    return CK_CHECK(k, "one_hot");
}

/* ---- tril, triu, flip, linspace ----------------------------------------------------------------- */

/* y = x where the column j of the last two dims is kept (tril: j <= i + diag; triu:
 * j >= i + diag), 0 elsewhere; x may be y itself. */
template <class T>
__global__ void tri_kernel(T *y, idx_geom yg, const T *x, idx_geom xg, int64_t diag, bool upper) {
    int nd = yg.nd;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < yg.n; t += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = t, yo = 0, xo = 0, i = 0, j = 0;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t q = r / yg.shape[d], c = r - q * yg.shape[d];
            r = q;
            yo += c * yg.st[d];
            xo += c * xg.st[d];
            if (d == nd - 1) j = c;
            else if (d == nd - 2) i = c;
        }
        bool keep = upper ? j >= i + diag : j <= i + diag;
        y[yo] = keep ? x[xo] : (T)0;
    }
}

static em_status tri_common(const em_kernel_ctx *k, bool upper) {
    const em_ktensor *x = &k->in[0], *y = &k->out[0];
    if (y->numel == 0) return EM_OK;
    idx_geom yg = geom_of(y), xg = geom_of(x);
    int64_t diag = k->attrs[0].v.i;
    cudaStream_t s = cuda_stream_of(k);
    unsigned b = ck_blocks(y->numel, 1);
    switch (em_dtype_size(y->dtype)) {
    case 1: tri_kernel<uint8_t><<<b, CK_THREADS, 0, s>>>((uint8_t *)y->data, yg, (const uint8_t *)x->data, xg, diag, upper); break;
    case 2: tri_kernel<uint16_t><<<b, CK_THREADS, 0, s>>>((uint16_t *)y->data, yg, (const uint16_t *)x->data, xg, diag, upper); break;
    case 4: tri_kernel<uint32_t><<<b, CK_THREADS, 0, s>>>((uint32_t *)y->data, yg, (const uint32_t *)x->data, xg, diag, upper); break;
    default: tri_kernel<uint64_t><<<b, CK_THREADS, 0, s>>>((uint64_t *)y->data, yg, (const uint64_t *)x->data, xg, diag, upper); break;
    }
    return CK_CHECK(k, em_op_name(k->op));
}
static em_status k_tril(const em_kernel_ctx *k) { return tri_common(k, false); }
static em_status k_triu(const em_kernel_ctx *k) { return tri_common(k, true); }

/* A copy from a view of x starting at the far end of each flipped dim, its stride negated. */
static em_status k_flip(const em_kernel_ctx *k) {
    em_ktensor x = k->in[0];
    if (x.numel == 0) return EM_OK;
    int64_t e = (int64_t)em_dtype_size(x.dtype);
    for (int i = 0; i < k->attrs[0].n; i++) {
        int d = (int)k->attrs[0].ints[i];
        if (d >= x.ndim || x.shape[d] <= 1) continue;
        x.data = (char *)x.data + (x.shape[d] - 1) * x.strides[d] * e;
        x.strides[d] = -x.strides[d];
    }
    x.contiguous = false;
    return copy_tensor(k, &k->out[0], &x);
}

/* cpu_data.c's linspace: floats in the dtype's own precision (float for f32/f16/bf16, rounded
 * once), integers from the ends converted to the dtype with a double step, truncated;
 * symmetric halves keep both ends exact. */
template <class T>
__global__ void linspace_kernel(T *y, int64_t n, int64_t s, int64_t half, double start, double end) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        if constexpr (sizeof(typename ck_tr<T>::F) == 4) { /* f32, f16, bf16 */
            float fs = (float)start, fe = (float)end;
            float step = n > 1 ? (fe - fs) / (float)(n - 1) : 0;
            float v = i < half ? fs + step * (float)i : fe - step * (float)(n - i - 1);
            y[i * s] = ck_from<T>(v);
        } else {
            double step = n > 1 ? (end - start) / (double)(n - 1) : 0;
            double v = i < half ? start + step * (double)i : end - step * (double)(n - i - 1);
            y[i * s] = ck_from_double<T>(v);
        }
    }
}

static em_status k_linspace(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    int64_t n = y->numel, s = y->ndim ? y->strides[0] : 1, half = n == 1 ? 1 : n / 2;
    double start = k->attrs[0].v.f, end = k->attrs[1].v.f;
    em_dtype dt = y->dtype;
    if (n == 0) return EM_OK;
    if (!em_dtype_is_floating(dt)) { /* the ends as the dtype holds them */
        uint64_t buf = 0;
        em_dtype_store(dt, &buf, 0, start);
        start = em_dtype_load(dt, &buf, 0);
        em_dtype_store(dt, &buf, 0, end);
        end = em_dtype_load(dt, &buf, 0);
    }
    cudaStream_t st = cuda_stream_of(k);
#define GO(T) linspace_kernel<T><<<ck_blocks(n, 1), CK_THREADS, 0, st>>>((T *)y->data, n, s, half, start, end)
    CK_SWITCH_ALL(dt, GO, return ck_no_dtype(k, dt))
#undef GO
    return CK_CHECK(k, "linspace");
}

em_status cuda_register_index(em_registry *r) {
    static const em_dtype i64[] = {EM_I64};
    em_status st = EM_OK;
#define REG(op, set, fn) if (st == EM_OK) st = cuda_register_dtypes(r, op, set, CK_N(set), fn, "cuda_" op)
    REG("index_select", ck_all, k_index_select);
    REG("gather", ck_all, k_gather);
    REG("scatter", ck_all, k_scatter);
    REG("scatter_add", ck_all, k_scatter_add);
    REG("index_add", ck_all, k_index_add);
    REG("embedding", ck_all, k_embedding);
    REG("embedding_backward", ck_flt, k_embedding_backward);
    REG("one_hot", i64, k_one_hot);
    REG("tril", ck_all, k_tril);
    REG("triu", ck_all, k_triu);
    REG("flip", ck_all, k_flip);
    REG("linspace", ck_num, k_linspace);
#undef REG
    return st;
}
