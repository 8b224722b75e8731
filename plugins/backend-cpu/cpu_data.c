/*
 * cpu_data.c — CPU kernels for the data movement ops: gather, scatter, scatter_add,
 * index_add, embedding and its backward, masked_fill, one_hot, tril/triu, flip, linspace
 * (contracts in core/ops_data.c; cat, stack, split, chunk and pad are views + copy/fill).
 *
 * Pure data movement (gather, scatter, embedding, masked_fill, tril/triu, flip) moves
 * elements by their SIZE (1, 2, 4 or 8 bytes), so one loop serves every dtype. Accumulating
 * kernels (scatter_add, index_add, embedding_backward) have one loop per dtype; f16/bf16 add
 * in float and round once per addition (PyTorch's CPU behaviour), integers wrap, bool is or.
 *
 * Race freedom and determinism of the accumulating kernels: work is split by OUTPUT element,
 * never by source: a thread owns a disjoint set of output elements (a range of the dims
 * other than `dim`, or a range of rows along `dim`) and visits the sources that hit them in
 * ascending order. No atomics, and each output element sees exactly the additions of a
 * sequential loop in the same order — bitwise identical for any thread count, in
 * em_deterministic() mode and out of it.
 *
 * Index values are validated on the calling thread before anything is written (kernels set
 * the error there: the last-error slot is per thread).
 */
#include <math.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/op_helpers.h"
#include "ember/tensor.h"
#include "cpu.h"

/* Run fn(task, ctx) for task in [0, n): across cpu_threads(k) threads when par, else
 * inline (no OpenMP region for small work). */
typedef void (*task_fn)(int64_t task, void *ctx);
static void run_tasks(const em_kernel_ctx *k, int64_t n, bool par, task_fn fn, void *ctx) {
    if (!par || n <= 1) {
        for (int64_t t = 0; t < n; t++) fn(t, ctx);
        return;
    }
#pragma omp parallel for num_threads(cpu_threads(k)) schedule(static)
    for (int64_t t = 0; t < n; t++) fn(t, ctx);
}

/* Element offset of outer position o: the C-order coordinates over every dim of shape except
 * `skip` (-1: none), applied to strides. */
static inline int64_t outer_offset(int ndim, const int64_t *shape, int skip,
                                   const int64_t *strides, int64_t o) {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        if (d == skip) continue;
        off += (o % shape[d]) * strides[d];
        o /= shape[d];
    }
    return off;
}

/* ---- plain copies by element size ------------------------------------------------------------ */

#define SIZE_SWITCH(e, MACRO)                                                                  \
    switch (e) {                                                                               \
    case 1: MACRO(uint8_t); break;                                                             \
    case 2: MACRO(uint16_t); break;                                                            \
    case 4: MACRO(uint32_t); break;                                                            \
    default: MACRO(uint64_t); break;                                                           \
    }

/* p[0] = p[1] elementwise; ctx points at the element size. */
static void copy_loop(char **p, const int64_t *s, int64_t n, void *ctx) {
    int64_t e = *(const int64_t *)ctx;
    if (s[0] == e && s[1] == e) {
        memcpy(p[0], p[1], (size_t)(n * e));
        return;
    }
#define COPY(T)                                                                                \
    for (int64_t i = 0; i < n; i++) *(T *)(p[0] + i * s[0]) = *(const T *)(p[1] + i * s[1]);
    SIZE_SWITCH(e, COPY)
#undef COPY
}

static void zero_loop(char **p, const int64_t *s, int64_t n, void *ctx) {
    int64_t e = *(const int64_t *)ctx;
    if (s[0] == e) {
        memset(p[0], 0, (size_t)(n * e));
        return;
    }
    for (int64_t i = 0; i < n; i++) memset(p[0] + i * s[0], 0, (size_t)e);
}

static void copy_tensor(const em_kernel_ctx *k, const em_ktensor *dst, const em_ktensor *src) {
    int64_t e = (int64_t)em_dtype_size(dst->dtype);
    const em_ktensor *ts[2] = {dst, src};
    cpu_foreach(k, 2, ts, copy_loop, &e, CPU_GRAIN);
}

static void zero_tensor(const em_kernel_ctx *k, const em_ktensor *t) {
    int64_t e = (int64_t)em_dtype_size(t->dtype);
    const em_ktensor *ts[1] = {t};
    cpu_foreach(k, 1, ts, zero_loop, &e, CPU_GRAIN);
}

/* ---- index validation -------------------------------------------------------------------------- */

typedef struct range_ctx {
    int64_t size;
    bool bad;
    int64_t value;
} range_ctx;

static void range_loop(char **p, const int64_t *s, int64_t n, void *vctx) {
    range_ctx *c = vctx;
    if (c->bad) return;
    if (s[0] == 8) { /* vectorised screen; the slow loop below finds the culprit */
        const int64_t *x = (const int64_t *)p[0];
        uint64_t any = 0;
        for (int64_t i = 0; i < n; i++) any |= (uint64_t)x[i] >= (uint64_t)c->size;
        if (!any) return;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t v = *(const int64_t *)(p[0] + i * s[0]);
        if (v < 0 || v >= c->size) {
            c->bad = true;
            c->value = v;
            return;
        }
    }
}

/* True when every value of the int64 tensor idx is in [0, size); else *bad is the first one
 * (C order) that is not. */
static bool index_in_range(const em_kernel_ctx *k, const em_ktensor *idx, int64_t size,
                           int64_t *bad) {
    range_ctx c = {size, false, 0};
    const em_ktensor *ts[1] = {idx};
    cpu_foreach(k, 1, ts, range_loop, &c, 0);
    *bad = c.value;
    return !c.bad;
}

static em_status index_error(const em_kernel_ctx *k, int64_t v, int dim, int64_t size) {
    return em_set_error(EM_ERR_RANGE, "%s: index %lld is out of bounds for dim %d with size "
                        "%lld (expected 0..%lld)", em_op_name(k->op), (long long)v, dim,
                        (long long)size, (long long)(size - 1));
}

/* ---- per-dtype accumulation: y = y + alpha * x ------------------------------------------------ */

/* Per dtype: suffix, storage type, compute type, load, store. int32/int64/u8 compute in
 * unsigned arithmetic so that overflow wraps (as in PyTorch); bool computes in unsigned and
 * stores "!= 0", which makes + a logical or. */
#define LD_ID(x) (x)
#define ST_ID(x) (x)
#define ST_BOOL(x) ((x) != 0)
#define ACC_DTYPES(X)                                                                          \
    X(f32, float, float, LD_ID, ST_ID)                                                         \
    X(f64, double, double, LD_ID, ST_ID)                                                       \
    X(f16, uint16_t, float, cpu_h2f, cpu_f2h)                                                  \
    X(bf16, uint16_t, float, cpu_b2f, cpu_f2b)                                                 \
    X(i32, int32_t, uint32_t, LD_ID, ST_ID)                                                    \
    X(i64, int64_t, uint64_t, LD_ID, ST_ID)                                                    \
    X(u8, uint8_t, uint32_t, LD_ID, ST_ID)                                                     \
    X(bool, bool, uint32_t, LD_ID, ST_BOOL)

/* alpha converted to a dtype's compute type: floats round, integers truncate toward zero
 * (saturating at the int64 range, NaN gives 0), bool is alpha != 0. */
static int64_t trunc_i64(double v) {
    if (!(v == v)) return 0;
    if (v >= 9.2233720368547758e18) return INT64_MAX;
    if (v <= -9.2233720368547758e18) return INT64_MIN;
    return (int64_t)v;
}
#define ALPHA_f32(a) ((float)(a))
#define ALPHA_f64(a) (a)
#define ALPHA_f16(a) ((float)(a))
#define ALPHA_bf16(a) ((float)(a))
#define ALPHA_i32(a) ((uint32_t)(uint64_t)trunc_i64(a))
#define ALPHA_i64(a) ((uint64_t)trunc_i64(a))
#define ALPHA_u8(a) ((uint32_t)(uint8_t)(uint64_t)trunc_i64(a))
#define ALPHA_bool(a) ((uint32_t)((a) != 0))

/* A run of n elements: y[i] = y[i] + alpha * x[i] (byte strides ys, xs). */
typedef void (*acc_run_fn)(char *y, int64_t ys, const char *x, int64_t xs, int64_t n,
                           double alpha);
/* A line along dim for scatter_add: for j in [0, n): v = idx[j]; if lo <= v < hi:
 * y[v] += x[j] (byte strides: ysd for y along dim, is for idx, xs for x). */
typedef void (*acc_line_fn)(char *y, int64_t ysd, const char *idx, int64_t is, const char *x,
                            int64_t xs, int64_t n, int64_t lo, int64_t hi);

#define DEF_ACC(sfx, T, CT, LD, ST)                                                            \
    static void acc_run_##sfx(char *y, int64_t ys, const char *x, int64_t xs, int64_t n,       \
                              double alpha) {                                                  \
        const CT a = (CT)ALPHA_##sfx(alpha);                                                   \
        if (ys == (int64_t)sizeof(T) && xs == (int64_t)sizeof(T)) {                            \
            T *yy = (T *)y;                                                                    \
            const T *xx = (const T *)x;                                                        \
            for (int64_t i = 0; i < n; i++) yy[i] = ST((CT)((CT)LD(yy[i]) + a * (CT)LD(xx[i]))); \
        } else {                                                                               \
            for (int64_t i = 0; i < n; i++) {                                                  \
                T *d = (T *)(y + i * ys);                                                      \
                *d = ST((CT)((CT)LD(*d) + a * (CT)LD(*(const T *)(x + i * xs))));              \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    static void acc_line_##sfx(char *y, int64_t ysd, const char *idx, int64_t is,              \
                               const char *x, int64_t xs, int64_t n, int64_t lo, int64_t hi) { \
        for (int64_t j = 0; j < n; j++) {                                                      \
            int64_t v = *(const int64_t *)(idx + j * is);                                      \
            if (v < lo || v >= hi) continue;                                                   \
            T *d = (T *)(y + v * ysd);                                                         \
            *d = ST((CT)((CT)LD(*d) + (CT)LD(*(const T *)(x + j * xs))));                      \
        }                                                                                      \
    }
ACC_DTYPES(DEF_ACC)
#undef DEF_ACC

static const acc_run_fn acc_run[EM_DTYPE_COUNT] = {
    [EM_F32] = acc_run_f32, [EM_F64] = acc_run_f64, [EM_F16] = acc_run_f16,
    [EM_BF16] = acc_run_bf16, [EM_I32] = acc_run_i32, [EM_I64] = acc_run_i64,
    [EM_U8] = acc_run_u8, [EM_BOOL] = acc_run_bool};
static const acc_line_fn acc_line[EM_DTYPE_COUNT] = {
    [EM_F32] = acc_line_f32, [EM_F64] = acc_line_f64, [EM_F16] = acc_line_f16,
    [EM_BF16] = acc_line_bf16, [EM_I32] = acc_line_i32, [EM_I64] = acc_line_i64,
    [EM_U8] = acc_line_u8, [EM_BOOL] = acc_line_bool};

/* ---- gather, scatter, scatter_add ------------------------------------------------------------- */

/* The index domain as lines along dim: `outer` lines of L elements, each split into `chunks`
 * tasks. For gather a chunk is a range of the line; for scatter a chunk is a range of TARGET
 * positions along dim (every task scans its whole line), so tasks never share an output. */
typedef struct line_ctx {
    em_ktensor self, idx, other; /* other: y (gather) or src (scatter) */
    em_ktensor y;                /* scatter: the output */
    int dim;
    int64_t e, L, chunks, per;
    acc_line_fn acc; /* scatter_add */
} line_ctx;

static void gather_task(int64_t task, void *vctx) {
    const line_ctx *c = vctx;
    int64_t o = task / c->chunks, lo = (task % c->chunks) * c->per;
    int64_t n = cpu_min_i64(c->per, c->L - lo);
    if (n <= 0) return;
    const em_ktensor *x = &c->self, *ix = &c->idx, *y = &c->other;
    int nd = ix->ndim, dim = c->dim;
    int64_t e = c->e;
    const char *xb = (const char *)x->data + outer_offset(nd, ix->shape, dim, x->strides, o) * e;
    const char *ib = (const char *)ix->data +
                     (outer_offset(nd, ix->shape, dim, ix->strides, o) + lo * ix->strides[dim]) * 8;
    char *yb = (char *)y->data +
               (outer_offset(nd, ix->shape, dim, y->strides, o) + lo * y->strides[dim]) * e;
    int64_t xs = x->strides[dim] * e, is = ix->strides[dim] * 8, ys = y->strides[dim] * e;
#define GATHER(T)                                                                              \
    for (int64_t j = 0; j < n; j++)                                                            \
        *(T *)(yb + j * ys) = *(const T *)(xb + *(const int64_t *)(ib + j * is) * xs);
    SIZE_SWITCH(e, GATHER)
#undef GATHER
}

static void scatter_task(int64_t task, void *vctx) {
    const line_ctx *c = vctx;
    int64_t o = task / c->chunks, lo = (task % c->chunks) * c->per;
    int64_t hi = cpu_min_i64(lo + c->per, c->y.shape[c->dim]);
    if (hi <= lo) return;
    const em_ktensor *ix = &c->idx, *s = &c->other, *y = &c->y;
    int nd = ix->ndim, dim = c->dim;
    int64_t e = c->e;
    const char *ib = (const char *)ix->data + outer_offset(nd, ix->shape, dim, ix->strides, o) * 8;
    const char *sb = (const char *)s->data + outer_offset(nd, ix->shape, dim, s->strides, o) * e;
    char *yb = (char *)y->data + outer_offset(nd, ix->shape, dim, y->strides, o) * e;
    int64_t is = ix->strides[dim] * 8, ss = s->strides[dim] * e, ysd = y->strides[dim] * e;
    if (c->acc) {
        c->acc(yb, ysd, ib, is, sb, ss, c->L, lo, hi);
        return;
    }
#define SCATTER(T)                                                                             \
    for (int64_t j = 0; j < c->L; j++) {                                                       \
        int64_t v = *(const int64_t *)(ib + j * is);                                           \
        if (v >= lo && v < hi) *(T *)(yb + v * ysd) = *(const T *)(sb + j * ss);               \
    }
    SIZE_SWITCH(e, SCATTER)
#undef SCATTER
}

/* Split `outer` lines into tasks: whole lines when there are enough of them for the
 * threads, else each line into nt chunks of `extent` (line length or target range). */
static void plan_lines(const em_kernel_ctx *k, line_ctx *c, int64_t outer, int64_t extent,
                       int64_t work, bool *par, int64_t *ntasks) {
    int nt = cpu_threads(k);
    *par = nt > 1 && work >= CPU_GRAIN;
    c->chunks = (*par && outer < nt && extent >= 2 * nt) ? nt : 1;
    c->per = (extent + c->chunks - 1) / c->chunks;
    if (c->per == 0) c->per = 1;
    *ntasks = outer * c->chunks;
}

static em_status k_gather(const em_kernel_ctx *k) {
    line_ctx c = {.self = em_ktensor_at_least_1d(&k->in[0]), .idx = em_ktensor_at_least_1d(&k->in[1]),
                  .other = em_ktensor_at_least_1d(&k->out[0]), .dim = (int)k->attrs[0].v.i};
    if (c.idx.numel == 0) return EM_OK;
    int64_t bad, size = c.self.shape[c.dim];
    if (!index_in_range(k, &c.idx, size, &bad)) return index_error(k, bad, c.dim, size);
    c.e = (int64_t)em_dtype_size(c.self.dtype);
    c.L = c.idx.shape[c.dim];
    bool par;
    int64_t ntasks;
    plan_lines(k, &c, c.idx.numel / c.L, c.L, c.idx.numel, &par, &ntasks);
    run_tasks(k, ntasks, par, gather_task, &c);
    return EM_OK;
}

static em_status scatter_common(const em_kernel_ctx *k, bool add) {
    line_ctx c = {.self = em_ktensor_at_least_1d(&k->in[0]), .idx = em_ktensor_at_least_1d(&k->in[1]),
                  .other = em_ktensor_at_least_1d(&k->in[2]), .y = em_ktensor_at_least_1d(&k->out[0]),
                  .dim = (int)k->attrs[0].v.i};
    int64_t bad, size = c.y.shape[c.dim];
    if (c.idx.numel > 0 && !index_in_range(k, &c.idx, size, &bad))
        return index_error(k, bad, c.dim, size);
    if (!em_ktensor_same_memory(&c.y, &c.self)) copy_tensor(k, &c.y, &c.self);
    if (c.idx.numel == 0) return EM_OK;
    c.e = (int64_t)em_dtype_size(c.y.dtype);
    c.L = c.idx.shape[c.dim];
    c.acc = add ? acc_line[c.y.dtype] : NULL;
    bool par;
    int64_t ntasks;
    plan_lines(k, &c, c.idx.numel / c.L, size, c.idx.numel, &par, &ntasks);
    run_tasks(k, ntasks, par, scatter_task, &c);
    return EM_OK;
}

static em_status k_scatter(const em_kernel_ctx *k) { return scatter_common(k, false); }
static em_status k_scatter_add(const em_kernel_ctx *k) { return scatter_common(k, true); }

/* ---- index_add and embedding_backward ------------------------------------------------------------ */

/* y.select(dim, idx[i]) += alpha * x.select(dim, i) for i in order, skipping idx[i] == skip.
 * The slice (every dim but dim) is walked as `runs` runs of `len` elements after merging
 * dims that are contiguous in both y and x. Tasks own either a range of the flat slice
 * (when the slice is big) or a range of rows of y along dim (when it is small). */
typedef struct iadd_ctx {
    char *y;
    const char *x, *idx;
    int64_t ysd, xsd, is, n, rows, skip; /* byte strides along dim, index count, y rows */
    int nd;                              /* merged slice dims */
    int64_t shape[EM_MAX_DIMS], ys[EM_MAX_DIMS], xs[EM_MAX_DIMS]; /* byte strides */
    int64_t slice, len;
    int64_t chunks, per;
    bool by_rows;
    double alpha;
    acc_run_fn run;
} iadd_ctx;

static void iadd_task(int64_t task, void *vctx) {
    const iadd_ctx *c = vctx;
    int64_t plo = 0, phi = c->slice, rlo = 0, rhi = c->rows;
    if (c->by_rows) {
        rlo = task * c->per;
        rhi = cpu_min_i64(rlo + c->per, c->rows);
    } else {
        plo = task * c->per;
        phi = cpu_min_i64(plo + c->per, c->slice);
    }
    if (plo >= phi || rlo >= rhi) return;
    int last = c->nd - 1;
    for (int64_t i = 0; i < c->n; i++) {
        int64_t v = *(const int64_t *)(c->idx + i * c->is);
        if (v < rlo || v >= rhi || v == c->skip) continue;
        char *yb = c->y + v * c->ysd;
        const char *xb = c->x + i * c->xsd;
        for (int64_t p = plo; p < phi;) {
            int64_t r = p / c->len, j = p % c->len, m = cpu_min_i64(c->len - j, phi - p);
            int64_t yo = j * c->ys[last], xo = j * c->xs[last];
            for (int d = last - 1; d >= 0; d--) {
                int64_t q = r % c->shape[d];
                r /= c->shape[d];
                yo += q * c->ys[d];
                xo += q * c->xs[d];
            }
            c->run(yb + yo, c->ys[last], xb + xo, c->xs[last], m, c->alpha);
            p += m;
        }
    }
}

typedef struct acc_ctx {
    acc_run_fn run;
    double alpha;
} acc_ctx;

static void acc_loop(char **p, const int64_t *s, int64_t n, void *vctx) {
    const acc_ctx *c = vctx;
    c->run(p[0], s[0], p[1], s[1], n, c->alpha);
}

/* idx (n >= 1 entries) is v, v + 1, ..., v + n - 1 (cat's index_add): *v set. */
static bool index_is_run(const em_ktensor *idx, int64_t *v) {
    const int64_t *ip = idx->data;
    int64_t is = idx->ndim ? idx->strides[0] : 1;
    for (int64_t i = 1; i < idx->numel; i++)
        if (ip[i * is] != ip[0] + i) return false;
    *v = ip[0];
    return true;
}

/* y (written in place) += alpha * x rows picked by idx along dim; every tensor non-0-dim. */
static void index_add_into(const em_kernel_ctx *k, const em_ktensor *y, const em_ktensor *x,
                           const em_ktensor *idx, int dim, double alpha, int64_t skip) {
    int64_t e = (int64_t)em_dtype_size(y->dtype), v0;
    if (skip < 0 && idx->numel > 0 && index_is_run(idx, &v0)) {
        /* One block, y.narrow(dim, v0, n) += alpha * x, walked in memory order (each element
         * still gets exactly one addition): cat with history adds its inputs so, and the
         * general walk below goes along the slice, across rows, for an inner dim. */
        em_ktensor yv = *y;
        yv.data = (char *)y->data + v0 * y->strides[dim] * e;
        yv.shape[dim] = idx->numel;
        yv.numel = x->numel;
        yv.contiguous = false;
        acc_ctx ac = {.run = acc_run[y->dtype], .alpha = alpha};
        const em_ktensor *ts[2] = {&yv, x};
        cpu_foreach(k, 2, ts, acc_loop, &ac, CPU_GRAIN);
        return;
    }
    iadd_ctx c = {.y = y->data, .x = x->data, .idx = idx->data, .ysd = y->strides[dim] * e,
                  .xsd = x->strides[dim] * e, .is = (idx->ndim ? idx->strides[0] : 1) * 8,
                  .n = idx->numel, .rows = y->shape[dim], .skip = skip, .alpha = alpha,
                  .run = acc_run[y->dtype]};
    /* The slice: dims other than dim, size-1 dims dropped, mergeable neighbours merged. */
    for (int d = 0; d < y->ndim; d++) {
        if (d == dim || y->shape[d] == 1) continue;
        int64_t yst = y->strides[d] * e, xst = x->strides[d] * e;
        if (c.nd > 0 && c.ys[c.nd - 1] == yst * y->shape[d] &&
            c.xs[c.nd - 1] == xst * y->shape[d]) {
            c.shape[c.nd - 1] *= y->shape[d];
            c.ys[c.nd - 1] = yst;
            c.xs[c.nd - 1] = xst;
            continue;
        }
        c.shape[c.nd] = y->shape[d];
        c.ys[c.nd] = yst;
        c.xs[c.nd++] = xst;
    }
    if (c.nd == 0) {
        c.shape[0] = 1;
        c.ys[0] = c.xs[0] = e;
        c.nd = 1;
    }
    c.len = c.shape[c.nd - 1];
    c.slice = 1;
    for (int d = 0; d < c.nd; d++) c.slice *= c.shape[d];
    if (c.slice == 0 || c.n == 0) return;
    int nt = cpu_threads(k);
    bool par = nt > 1 && c.slice * c.n >= CPU_GRAIN;
    c.chunks = 1;
    if (par && c.slice >= 64 * nt) {
        c.chunks = nt; /* each thread a range of the slice (columns of an embedding) */
    } else if (par && c.rows >= 2 * nt) {
        c.by_rows = true; /* each thread a range of output rows; all scan the index */
        c.chunks = nt;
    }
    c.per = ((c.by_rows ? c.rows : c.slice) + c.chunks - 1) / c.chunks;
    run_tasks(k, c.chunks, par && c.chunks > 1, iadd_task, &c);
}

static em_status k_index_add(const em_kernel_ctx *k) {
    em_ktensor x = em_ktensor_at_least_1d(&k->in[0]), idx = k->in[1], src = em_ktensor_at_least_1d(&k->in[2]),
               y = em_ktensor_at_least_1d(&k->out[0]);
    int dim = (int)k->attrs[0].v.i;
    double alpha = k->attrs[1].type == EM_ATTR_NONE ? 1.0 : k->attrs[1].v.f;
    int64_t bad;
    if (idx.numel > 0 && !index_in_range(k, &idx, y.shape[dim], &bad))
        return index_error(k, bad, dim, y.shape[dim]);
    if (!em_ktensor_same_memory(&y, &x)) copy_tensor(k, &y, &x);
    index_add_into(k, &y, &src, &idx, dim, alpha, -1);
    return EM_OK;
}

static em_status k_embedding_backward(const em_kernel_ctx *k) {
    const em_ktensor *g = &k->in[0], *idx = &k->in[1], *y = &k->out[0];
    int64_t bad, v = y->shape[0];
    if (idx->numel > 0 && !index_in_range(k, idx, v, &bad))
        return em_set_error(EM_ERR_RANGE, "embedding_backward: index %lld is out of range for "
                            "num_weights V = %lld (expected 0..%lld)", (long long)bad,
                            (long long)v, (long long)(v - 1));
    zero_tensor(k, y);
    int64_t pad = k->attrs[1].type == EM_ATTR_NONE ? -1 : k->attrs[1].v.i;
    index_add_into(k, y, g, idx, 0, 1.0, pad);
    return EM_OK;
}

/* ---- embedding ---------------------------------------------------------------------------------- */

typedef struct emb_ctx {
    const em_ktensor *w, *idx, *y;
    int64_t e, d, per, n;
} emb_ctx;

static void emb_task(int64_t task, void *vctx) {
    const emb_ctx *c = vctx;
    const em_ktensor *w = c->w, *ix = c->idx, *y = c->y;
    int64_t lo = task * c->per, hi = cpu_min_i64(lo + c->per, c->n), e = c->e;
    int yl = y->ndim - 1;
    int64_t ws = w->strides[1] * e, ys = y->strides[yl] * e;
    for (int64_t i = lo; i < hi; i++) {
        int64_t io = ix->contiguous ? i : cpu_offset(ix->ndim, ix->shape, ix->strides, i);
        int64_t v = ((const int64_t *)ix->data)[io];
        const char *src = (const char *)w->data + v * w->strides[0] * e;
        char *dst = (char *)y->data +
                    (y->contiguous ? i * c->d : outer_offset(y->ndim, y->shape, yl, y->strides, i)) * e;
        if (ws == e && ys == e) {
            memcpy(dst, src, (size_t)(c->d * e));
            continue;
        }
#define ROW(T) for (int64_t j = 0; j < c->d; j++) *(T *)(dst + j * ys) = *(const T *)(src + j * ws);
        SIZE_SWITCH(e, ROW)
#undef ROW
    }
}

static em_status k_embedding(const em_kernel_ctx *k) {
    const em_ktensor *w = &k->in[0], *idx = &k->in[1], *y = &k->out[0];
    int64_t bad, v = w->shape[0];
    if (idx->numel > 0 && !index_in_range(k, idx, v, &bad))
        return em_set_error(EM_ERR_RANGE, "embedding: index %lld is out of range for a weight "
                            "of V = %lld rows (expected 0..%lld)", (long long)bad, (long long)v,
                            (long long)(v - 1));
    emb_ctx c = {w, idx, y, (int64_t)em_dtype_size(w->dtype), w->shape[1], 0, idx->numel};
    if (c.n == 0 || c.d == 0) return EM_OK;
    int nt = cpu_threads(k);
    bool par = nt > 1 && c.n * c.d >= CPU_GRAIN && c.n >= nt;
    int64_t tasks = par ? nt : 1;
    c.per = (c.n + tasks - 1) / tasks;
    run_tasks(k, tasks, par, emb_task, &c);
    return EM_OK;
}

/* ---- masked_fill ----------------------------------------------------------------------------------- */

typedef struct fill_ctx {
    int64_t e;
    uint64_t value; /* the value's bytes in the output dtype (low e bytes) */
} fill_ctx;

static void masked_fill_loop(char **p, const int64_t *s, int64_t n, void *vctx) {
    const fill_ctx *c = vctx;
    int64_t e = c->e;
#define MFILL(T)                                                                               \
    do {                                                                                       \
        T v;                                                                                   \
        memcpy(&v, &c->value, sizeof v);                                                       \
        if (s[0] == e && s[1] == e && s[2] == 1) {                                             \
            T *y = (T *)p[0];                                                                  \
            const T *x = (const T *)p[1];                                                      \
            const uint8_t *m = (const uint8_t *)p[2];                                          \
            for (int64_t i = 0; i < n; i++) y[i] = m[i] ? v : x[i];                            \
        } else {                                                                               \
            for (int64_t i = 0; i < n; i++)                                                    \
                *(T *)(p[0] + i * s[0]) =                                                      \
                    *(const uint8_t *)(p[2] + i * s[2]) ? v : *(const T *)(p[1] + i * s[1]); \
        }                                                                                      \
    } while (0)
    SIZE_SWITCH(e, MFILL)
#undef MFILL
}

static em_status k_masked_fill(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    fill_ctx c = {(int64_t)em_dtype_size(y->dtype), 0};
    em_dtype_store(y->dtype, &c.value, 0, k->attrs[0].v.f);
    const em_ktensor *ts[3] = {y, &k->in[0], &k->in[1]};
    cpu_foreach(k, 3, ts, masked_fill_loop, &c, CPU_GRAIN);
    return EM_OK;
}

/* ---- one_hot --------------------------------------------------------------------------------------- */

static em_status k_one_hot(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[0], *y = &k->out[0];
    int64_t c = k->attrs[0].v.i, bad;
    if (x->numel > 0 && !index_in_range(k, x, c, &bad))
        return bad < 0 ? em_set_error(EM_ERR_RANGE, "one_hot: class values must be "
                                      "non-negative, got %lld", (long long)bad)
                       : em_set_error(EM_ERR_RANGE, "one_hot: class value %lld is out of range "
                                      "for num_classes %lld", (long long)bad, (long long)c);
    zero_tensor(k, y);
    int yl = y->ndim - 1;
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t v = ((const int64_t *)x->data)[cpu_offset(x->ndim, x->shape, x->strides, i)];
        int64_t o = outer_offset(y->ndim, y->shape, yl, y->strides, i) + v * y->strides[yl];
        ((int64_t *)y->data)[o] = 1;
    }
    return EM_OK;
}

/* ---- tril, triu ------------------------------------------------------------------------------------ */

typedef struct tri_ctx {
    const em_ktensor *x, *y;
    int64_t e, diag, rows, per;
    bool upper, alias;
} tri_ctx;

static inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) {
    return v < lo ? lo : v > hi ? hi : v;
}

/* Copy x[j] for j in [a, b) of a row, zero the rest. */
static void tri_task(int64_t task, void *vctx) {
    const tri_ctx *c = vctx;
    const em_ktensor *x = c->x, *y = c->y;
    int nd = y->ndim;
    int64_t R = y->shape[nd - 2], C = y->shape[nd - 1], e = c->e;
    int64_t xs = x->strides[nd - 1] * e, ys = y->strides[nd - 1] * e;
    int64_t lo = task * c->per, hi = cpu_min_i64(lo + c->per, c->rows);
    for (int64_t row = lo; row < hi; row++) {
        int64_t i = row % R;
        char *yr = (char *)y->data + outer_offset(nd, y->shape, nd - 1, y->strides, row) * e;
        const char *xr = (const char *)x->data + outer_offset(nd, x->shape, nd - 1, x->strides, row) * e;
        /* kept columns: tril j <= i + diag; triu j >= i + diag (clamped to [0, C]) */
        int64_t lim = i + c->diag;
        int64_t a = c->upper ? clamp64(lim, 0, C) : 0;
        int64_t b = c->upper ? C : clamp64(lim + 1, 0, C);
        int64_t zlo[2] = {0, b}, zhi[2] = {a, C};
        for (int z = 0; z < 2; z++) {
            if (ys == e) memset(yr + zlo[z] * e, 0, (size_t)((zhi[z] - zlo[z]) * e));
            else
                for (int64_t j = zlo[z]; j < zhi[z]; j++) memset(yr + j * ys, 0, (size_t)e);
        }
        if (c->alias || a >= b) continue;
        if (xs == e && ys == e) {
            memcpy(yr + a * e, xr + a * e, (size_t)((b - a) * e));
            continue;
        }
#define TRI(T) for (int64_t j = a; j < b; j++) *(T *)(yr + j * ys) = *(const T *)(xr + j * xs);
        SIZE_SWITCH(e, TRI)
#undef TRI
    }
}

static em_status tri_common(const em_kernel_ctx *k, bool upper) {
    const em_ktensor *x = &k->in[0], *y = &k->out[0];
    if (y->numel == 0) return EM_OK;
    tri_ctx c = {x, y, (int64_t)em_dtype_size(y->dtype), k->attrs[0].v.i,
                 y->numel / y->shape[y->ndim - 1], 0, upper, em_ktensor_same_memory(x, y)};
    int nt = cpu_threads(k);
    bool par = nt > 1 && y->numel >= CPU_GRAIN && c.rows >= nt;
    int64_t tasks = par ? nt : 1;
    c.per = (c.rows + tasks - 1) / tasks;
    run_tasks(k, tasks, par, tri_task, &c);
    return EM_OK;
}

static em_status k_tril(const em_kernel_ctx *k) { return tri_common(k, false); }
static em_status k_triu(const em_kernel_ctx *k) { return tri_common(k, true); }

/* ---- flip ------------------------------------------------------------------------------------------- */

/* A copy from a view of x that starts at the far end of each flipped dim with its stride
 * negated (cpu_foreach handles negative strides). */
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
    copy_tensor(k, &k->out[0], &x);
    return EM_OK;
}

/* ---- linspace --------------------------------------------------------------------------------------- */

/* Floating: computed in the dtype's own precision (float for f32, f16 and bf16, rounded once
 * for the latter two); integers: start and end converted to the dtype, the step in double,
 * each value truncated (PyTorch's CPU kernel). Symmetric halves keep both ends exact. */
static em_status k_linspace(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    /* steps == 1 gives [start]: the first half must then hold the only element */
    int64_t n = y->numel, s = y->ndim ? y->strides[0] : 1, half = n == 1 ? 1 : n / 2;
    double start = k->attrs[0].v.f, end = k->attrs[1].v.f;
    em_dtype dt = y->dtype;
    if (n == 0) return EM_OK;
    char *p = y->data;
    int64_t e = (int64_t)em_dtype_size(dt);
    if (dt == EM_F64) {
        double step = n > 1 ? (end - start) / (double)(n - 1) : 0;
        for (int64_t i = 0; i < n; i++)
            *(double *)(p + i * s * e) = i < half ? start + step * (double)i
                                                  : end - step * (double)(n - i - 1);
    } else if (em_dtype_is_floating(dt)) {
        float fs = (float)start, fe = (float)end;
        float step = n > 1 ? (fe - fs) / (float)(n - 1) : 0;
        for (int64_t i = 0; i < n; i++) {
            float v = i < half ? fs + step * (float)i : fe - step * (float)(n - i - 1);
            if (dt == EM_F32) *(float *)(p + i * s * e) = v;
            else *(uint16_t *)(p + i * s * e) = dt == EM_F16 ? cpu_f2h(v) : cpu_f2b(v);
        }
    } else {
        uint64_t buf = 0;
        em_dtype_store(dt, &buf, 0, start);
        double is = em_dtype_load(dt, &buf, 0);
        em_dtype_store(dt, &buf, 0, end);
        double ie = em_dtype_load(dt, &buf, 0);
        double step = n > 1 ? (ie - is) / (double)(n - 1) : 0;
        for (int64_t i = 0; i < n; i++)
            em_dtype_store(dt, p + i * s * e, 0,
                           i < half ? is + step * (double)i : ie - step * (double)(n - i - 1));
    }
    return EM_OK;
}

/* ---- registration --------------------------------------------------------------------------------------- */

em_status cpu_register_data(em_registry *r) {
    static const em_dtype all[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8, EM_BOOL};
    static const em_dtype num[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8};
    static const em_dtype flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    static const em_dtype i64[] = {EM_I64};
    em_status st = EM_OK;
#define REG(op, set, fn)                                                                       \
    if (st == EM_OK)                                                                           \
    st = cpu_register_kernels(r, op, set, (int)(sizeof set / sizeof *set), fn, "cpu_" op)
    REG("gather", all, k_gather);
    REG("scatter", all, k_scatter);
    REG("scatter_add", all, k_scatter_add);
    REG("index_add", all, k_index_add);
    REG("embedding", all, k_embedding);
    REG("embedding_backward", flt, k_embedding_backward);
    REG("masked_fill", all, k_masked_fill);
    REG("one_hot", i64, k_one_hot);
    REG("tril", all, k_tril);
    REG("triu", all, k_triu);
    REG("flip", all, k_flip);
    REG("linspace", num, k_linspace);
#undef REG
    return st;
}
