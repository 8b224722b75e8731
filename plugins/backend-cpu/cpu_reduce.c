/*
 * cpu_reduce.c — reductions on the CPU: sum, amax/amin, max_dim/min_dim (values and
 * indices), argmax/argmin, var/std, logsumexp, norm, prod, all/any, over any set of dims.
 *
 * Floating inputs accumulate in double (f32, f16 and bf16 included), with eight independent
 * partial sums per run and pairwise combination for f64, so f32 sums of millions of elements
 * keep full f32 accuracy. int64 sums and products wrap on overflow, as in PyTorch.
 *
 * One engine serves every op. The reduced dims are merged where contiguous into a few
 * (shape, stride) pairs; each output element then reduces its elements in C order, in one
 * of two layouts:
 *   - rows ("scalar" path): each output walks its own runs along the innermost reduced
 *     dim (sum over dim 1 of (N, C), or over (0, 2, 3) of (N, C, H, W)); outputs are split
 *     across threads.
 *   - columns ("vector" path): when x's last dim is kept and contiguous (sum over dim 0 of
 *     (N, C): the bias gradient), a block of up to 256 neighbouring outputs (1024 for the
 *     float32 sum, four rows per pass over its accumulators) is updated row after row from
 *     contiguous memory, instead of striding by C for every element; blocks of columns are
 *     split across threads.
 * A single output over many elements (a full reduction) is cut into fixed 16384-element
 * blocks reduced in parallel and combined in block order. Every output is thus computed in
 * an order fixed by the shapes alone: results never depend on the thread count. (sum over
 * one contiguous run keeps its own path, full_sum, described below.)
 *
 * Layouts: on the rows path the order is that of the logical elements, not of the runs the
 * strides cut them into: a sum's eight lanes and a chunk's boundaries are counted from the
 * output's first element across runs, so a transposed, sliced or expanded input gives the
 * bits of its contiguous copy (ember-opcheck checks this bit for bit). The columns path adds
 * each column's elements one after another, so a layout that moves a call between the two
 * paths (x's kept last dim contiguous in one, strided in the other) agrees to rounding only.
 *
 * sum: a full reduction of one long run is split into blocks summed in parallel and
 * combined in block order. Normally, from 2 * CPU_GRAIN elements on, there is one block per
 * thread; in deterministic mode (em_set_deterministic) and below that size the blocks are
 * the engine's fixed BLOCK, so the result is bitwise identical whatever the thread count and
 * equal to that of a strided input of the same elements.
 */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/tensor.h"
#include "cpu.h"

#define DET_BLOCK 16384

/* One dtype's loop: contiguous elements (byte stride sz) eight at a time from the first
 * element of lane 0 on, so the lanes are plain array indices there (vectorised). */
#define LANES_ADD(T, CONV, sz)                                                                 \
    do {                                                                                       \
        if (s == (sz)) {                                                                       \
            const T *x_ = (const T *)p;                                                        \
            for (; i < n && ((i0 + i) & 7); i++) acc[(i0 + i) & 7] += CONV(x_[i]);             \
            for (; i + 8 <= n; i += 8) /* lane j is element i + j here */                      \
                for (int j = 0; j < 8; j++) acc[j] += CONV(x_[i + j]);                         \
        }                                                                                      \
        for (; i < n; i++) acc[(i0 + i) & 7] += CONV(*(const T *)(p + i * s));                 \
    } while (0)
#define AS_DOUBLE(v) ((double)(v))

/* Add n elements of dtype dt at p (byte stride s) into eight lanes: the element of index
 * i0 + i goes to lane (i0 + i) & 7, so a sum split into pieces (the runs of a strided input)
 * fills the lanes exactly as one contiguous pass over the same elements does. */
static void lanes_add(em_dtype dt, double acc[8], const char *p, int64_t s, int64_t n,
                      int64_t i0) {
    int64_t i = 0;
    switch (dt) {
    case EM_F32: LANES_ADD(float, AS_DOUBLE, 4); break;
    case EM_F64: LANES_ADD(double, AS_DOUBLE, 8); break;
    case EM_F16: LANES_ADD(uint16_t, cpu_h2f, 2); break;
    case EM_BF16: LANES_ADD(uint16_t, cpu_b2f, 2); break;
    default: break;
    }
}
#undef LANES_ADD
#undef AS_DOUBLE

static double lanes_total(const double acc[8]) {
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Pairwise split of a float64 sum of n elements: halves of (n / 2) & ~7 and the rest, until
 * n <= 1024. Whatever the stride, so a strided run sums like its contiguous copy. */
#define PAIRWISE_F64(dt, n) ((dt) == EM_F64 && (n) > 1024)
#define PAIRWISE_HALF(n) (((n) / 2) & ~(int64_t)7)

/* Sum of n elements of dtype dt at p with byte stride s, as double. */
static double run_sum_f(em_dtype dt, const char *p, int64_t s, int64_t n) {
    if (PAIRWISE_F64(dt, n)) {
        int64_t h = PAIRWISE_HALF(n);
        return run_sum_f(dt, p, s, h) + run_sum_f(dt, p + h * s, s, n - h);
    }
    double acc[8] = {0};
    lanes_add(dt, acc, p, s, n, 0);
    return lanes_total(acc);
}

static uint64_t run_sum_i(const char *p, int64_t s, int64_t n) {
    uint64_t acc = 0;
    for (int64_t i = 0; i < n; i++) acc += (uint64_t) * (const int64_t *)(p + i * s);
    return acc;
}

static void store_sum(em_dtype dt, char *dst, double v, uint64_t iv) {
    switch (dt) {
    case EM_F32: *(float *)dst = (float)v; break;
    case EM_F64: *(double *)dst = v; break;
    case EM_F16: *(uint16_t *)dst = cpu_f2h((float)v); break;
    case EM_BF16: *(uint16_t *)dst = cpu_f2b((float)v); break;
    default: *(int64_t *)dst = (int64_t)iv; break;
    }
}

/* One long run reduced to one value, split into blocks summed in parallel and added in block
 * order. The blocks are DET_BLOCK elements (the engine's BLOCK, so a strided input that
 * reduce_full cuts into the same blocks gives the same bits) in deterministic mode and below
 * the parallel size; above it, in the default mode, one block per thread. */
static void full_sum(const em_kernel_ctx *k, em_dtype dt, const char *p, int64_t s, int64_t n,
                     char *dst) {
    int nt = cpu_threads(k);
    int64_t per = em_deterministic() || n < 2 * CPU_GRAIN ? DET_BLOCK : (n + nt - 1) / nt;
    int64_t nblocks = (n + per - 1) / per;
    if (nblocks <= 1) {
        store_sum(dt, dst, dt == EM_I64 ? 0 : run_sum_f(dt, p, s, n),
                  dt == EM_I64 ? run_sum_i(p, s, n) : 0);
        return;
    }
    /* below the parallel size, or without scratch: the same blocks one after another */
    bool serial = n < 2 * CPU_GRAIN;
    double *part = serial ? NULL : cpu_scratch(k, sizeof(double) * (size_t)nblocks);
    uint64_t *ipart = part ? cpu_scratch(k, sizeof(uint64_t) * (size_t)nblocks) : NULL;
    if (!serial && (!part || !ipart)) serial = true, em_clear_error();
    double v = 0;
    uint64_t iv = 0;
#pragma omp parallel for num_threads(nt) if (!serial) schedule(static) /* serial: one thread adds */
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t lo = b * per, len = cpu_min_i64(per, n - lo);
        double pv = len > 0 && dt != EM_I64 ? run_sum_f(dt, p + lo * s, s, len) : 0;
        uint64_t piv = len > 0 && dt == EM_I64 ? run_sum_i(p + lo * s, s, len) : 0;
        if (serial) v += pv, iv += piv;
        else part[b] = pv, ipart[b] = piv;
    }
    if (!serial)
        for (int64_t b = 0; b < nblocks; b++) v += part[b], iv += ipart[b];
    store_sum(dt, dst, v, iv); /* part, ipart: workspace */
}


/* ---- the reduction engine -------------------------------------------------------------------- */

#define CH 256        /* elements loaded (converted to double or int64) at a time */
#define BLOCK DET_BLOCK /* elements per block of a full reduction (full_sum's too) */

typedef enum rkind {
    K_SUM, K_PROD, K_MAX, K_MIN, K_ARGMAX, K_ARGMIN, K_VAR, K_LSE, K_ALL, K_ANY
} rkind;
/* Applied to each element before the reduction (norms). */
typedef enum rmap { M_NONE, M_ABS, M_SQ, M_POW, M_NZ } rmap;
/* Applied to each result (norms, std). */
typedef enum rfin { F_NONE, F_SQRT, F_ROOT } rfin;

typedef struct rplan {
    const em_kernel_ctx *k; /* the call: its threads and workspace */
    rkind kind;
    rmap map;
    rfin fin;
    double p;          /* M_POW / F_ROOT exponent */
    double correction; /* K_VAR */
    bool ints;         /* integer accumulation: x is an integer or bool tensor */
    em_dtype dt;       /* x's dtype */
    const em_ktensor *x;
    const em_ktensor *yv, *yi; /* values and indices outputs (either may be NULL) */
    const em_ktensor *y;       /* the one giving the output shape */
    bool red[EM_MAX_DIMS];
    /* Reduced dims of size > 1, merged where contiguous: (shape, byte stride), C order. */
    int nr;
    int64_t rshape[EM_MAX_DIMS], rstride[EM_MAX_DIMS];
    int64_t run, runs, total; /* innermost reduced length, runs of it per output, product */
} rplan;

/* The state of one output. a: float accumulator (sum, product, extreme, mean, lse shift);
 * b: second moment (var) or exp-sum (lse); c: count (var); i: integer accumulator; j: index. */
typedef struct acc {
    double a, b, c;
    int64_t i, j;
} acc;

static acc acc_init(const rplan *P) {
    acc s = {0, 0, 0, 0, 0};
    switch (P->kind) {
    case K_PROD: s.a = 1, s.i = 1; break;
    case K_MAX: case K_ARGMAX: s.a = -INFINITY, s.i = INT64_MIN; break;
    case K_MIN: case K_ARGMIN: s.a = INFINITY, s.i = INT64_MAX; break;
    case K_LSE: s.a = -INFINITY; break;
    case K_ALL: s.i = 1; break;
    default: break;
    }
    return s;
}

/* n elements at p (byte stride s) as doubles / int64s. */
static void load_d(em_dtype dt, const char *p, int64_t s, int64_t n, double *o) {
    switch (dt) {
    case EM_F32:
        if (s == 4)
            for (int64_t i = 0; i < n; i++) o[i] = ((const float *)p)[i];
        else
            for (int64_t i = 0; i < n; i++) o[i] = *(const float *)(p + i * s);
        break;
    case EM_F64:
        for (int64_t i = 0; i < n; i++) o[i] = *(const double *)(p + i * s);
        break;
    case EM_F16:
        for (int64_t i = 0; i < n; i++) o[i] = cpu_h2f(*(const uint16_t *)(p + i * s));
        break;
    case EM_BF16:
        for (int64_t i = 0; i < n; i++) o[i] = cpu_b2f(*(const uint16_t *)(p + i * s));
        break;
    default:
        break;
    }
}

static void load_i(em_dtype dt, const char *p, int64_t s, int64_t n, int64_t *o) {
    switch (dt) {
    case EM_I64: for (int64_t i = 0; i < n; i++) o[i] = *(const int64_t *)(p + i * s); break;
    case EM_I32: for (int64_t i = 0; i < n; i++) o[i] = *(const int32_t *)(p + i * s); break;
    case EM_U8: for (int64_t i = 0; i < n; i++) o[i] = *(const uint8_t *)(p + i * s); break;
    case EM_BOOL: for (int64_t i = 0; i < n; i++) o[i] = *(const bool *)(p + i * s); break;
    default: break;
    }
}

static void apply_map(const rplan *P, double *x, int64_t n) {
    switch (P->map) {
    case M_ABS: for (int64_t i = 0; i < n; i++) x[i] = fabs(x[i]); break;
    case M_SQ: for (int64_t i = 0; i < n; i++) x[i] = x[i] * x[i]; break;
    case M_POW: for (int64_t i = 0; i < n; i++) x[i] = pow(fabs(x[i]), P->p); break;
    case M_NZ: for (int64_t i = 0; i < n; i++) x[i] = x[i] != 0; break;
    default: break;
    }
}

/* Merge the (mean, M2, count) of two parts (Chan et al.). */
static void var_merge(acc *s, double mean, double m2, double n) {
    if (n == 0) return;
    double tot = s->c + n, d = mean - s->a;
    s->a += d * (n / tot);
    s->b += m2 + d * d * (s->c * n / tot);
    s->c = tot;
}

/* Merge a logsumexp part: result = shift + log(sum). */
static void lse_merge(acc *s, double shift, double sum) {
    double m = s->a > shift ? s->a : shift;
    s->b = s->b * exp(s->a - m) + sum * exp(shift - m);
    s->a = m;
}

/* Combine the state of a later part t into s (block order = element order). */
static void acc_merge(const rplan *P, acc *s, const acc *t) {
    switch (P->kind) {
    case K_SUM: s->a += t->a, s->i = (int64_t)((uint64_t)s->i + (uint64_t)t->i); break;
    case K_PROD: s->a *= t->a, s->i = (int64_t)((uint64_t)s->i * (uint64_t)t->i); break;
    case K_MAX: case K_ARGMAX:
        if (P->ints ? t->i > s->i : (t->a > s->a || (isnan(t->a) && !isnan(s->a)))) *s = *t;
        break;
    case K_MIN: case K_ARGMIN:
        if (P->ints ? t->i < s->i : (t->a < s->a || (isnan(t->a) && !isnan(s->a)))) *s = *t;
        break;
    case K_VAR: var_merge(s, t->a, t->b, t->c); break;
    case K_LSE: if (t->a != -INFINITY) lse_merge(s, t->a, t->b); break;
    case K_ALL: s->i = s->i && t->i; break;
    case K_ANY: s->i = s->i || t->i; break;
    }
}

/* Update state s with n (<= CH) loaded elements; idx0 is the first one's index. */
static void chunk_f(const rplan *P, acc *s, const double *x, int64_t n, int64_t idx0) {
    switch (P->kind) {
    case K_SUM: {
        double t[8] = {0};
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) t[j] += x[i + j];
        for (; i < n; i++) t[i & 7] += x[i];
        s->a += ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
        break;
    }
    case K_PROD: for (int64_t i = 0; i < n; i++) s->a *= x[i]; break;
    case K_MAX: case K_MIN: { /* max ignoring NaN (maxpd) and a NaN flag: both vectorise */
        double m = s->a;
        int nan = 0;
        if (P->kind == K_MAX)
            for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m, nan |= x[i] != x[i];
        else
            for (int64_t i = 0; i < n; i++) m = x[i] < m ? x[i] : m, nan |= x[i] != x[i];
        s->a = nan ? NAN : m;
        break;
    }
    case K_ARGMAX:
        for (int64_t i = 0; i < n; i++)
            if (x[i] > s->a || (x[i] != x[i] && s->a == s->a)) s->a = x[i], s->j = idx0 + i;
        break;
    case K_ARGMIN:
        for (int64_t i = 0; i < n; i++)
            if (x[i] < s->a || (x[i] != x[i] && s->a == s->a)) s->a = x[i], s->j = idx0 + i;
        break;
    case K_VAR: { /* two passes over the chunk, then merged */
        double sum = 0, m2 = 0;
        for (int64_t i = 0; i < n; i++) sum += x[i];
        double mean = sum / (double)n;
        for (int64_t i = 0; i < n; i++) m2 += (x[i] - mean) * (x[i] - mean);
        var_merge(s, mean, m2, (double)n);
        break;
    }
    case K_LSE: {
        double m = -INFINITY, sum = 0;
        for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
        double shift = isfinite(m) ? m : 0; /* an infinite max shifts by 0, as in PyTorch */
        for (int64_t i = 0; i < n; i++) sum += exp(x[i] - shift);
        lse_merge(s, shift, sum);
        break;
    }
    case K_ALL: for (int64_t i = 0; i < n; i++) s->i = s->i && x[i] != 0; break;
    case K_ANY: for (int64_t i = 0; i < n; i++) s->i = s->i || x[i] != 0; break;
    }
}

static void chunk_i(const rplan *P, acc *s, const int64_t *x, int64_t n, int64_t idx0) {
    switch (P->kind) {
    case K_SUM: for (int64_t i = 0; i < n; i++) s->i = (int64_t)((uint64_t)s->i + (uint64_t)x[i]); break;
    case K_PROD: for (int64_t i = 0; i < n; i++) s->i = (int64_t)((uint64_t)s->i * (uint64_t)x[i]); break;
    case K_MAX: for (int64_t i = 0; i < n; i++) s->i = x[i] > s->i ? x[i] : s->i; break;
    case K_MIN: for (int64_t i = 0; i < n; i++) s->i = x[i] < s->i ? x[i] : s->i; break;
    case K_ARGMAX:
        for (int64_t i = 0; i < n; i++)
            if (x[i] > s->i) s->i = x[i], s->j = idx0 + i;
        break;
    case K_ARGMIN:
        for (int64_t i = 0; i < n; i++)
            if (x[i] < s->i) s->i = x[i], s->j = idx0 + i;
        break;
    case K_ALL: for (int64_t i = 0; i < n; i++) s->i = s->i && x[i] != 0; break;
    case K_ANY: for (int64_t i = 0; i < n; i++) s->i = s->i || x[i] != 0; break;
    default: break;
    }
}

/* Byte offset of the reduced-space run number ro (over rshape[0..nr-2]). */
static int64_t run_offset(const rplan *P, int64_t ro) {
    int64_t off = 0;
    for (int i = P->nr - 2; i >= 0; i--) {
        off += (ro % P->rshape[i]) * P->rstride[i];
        ro /= P->rshape[i];
    }
    return off;
}

/* The floating sum of the elements [lo, hi) (C order over the reduced dims) of the output
 * based at x byte address base: run_sum_f's order over those elements as if they were one
 * contiguous run (its lanes counted from lo, its float64 halves), whatever runs the strides
 * cut them into. */
static double range_sum_f(const rplan *P, const char *base, int64_t lo, int64_t hi) {
    if (PAIRWISE_F64(P->dt, hi - lo)) {
        int64_t h = PAIRWISE_HALF(hi - lo);
        return range_sum_f(P, base, lo, lo + h) + range_sum_f(P, base, lo + h, hi);
    }
    double lanes[8] = {0};
    int64_t ro = lo / P->run, e = lo % P->run, st = P->rstride[P->nr - 1];
    for (int64_t i = 0; i < hi - lo;) {
        int64_t n = cpu_min_i64(P->run - e, hi - lo - i);
        lanes_add(P->dt, lanes, base + run_offset(P, ro) + e * st, st, n, i);
        i += n, ro++, e = 0;
    }
    return lanes_total(lanes);
}

/* Update s with the m loaded elements of a chunk; idx0 is the first one's index. */
static void chunk_flush(const rplan *P, acc *s, double *xd, const int64_t *xi, int64_t m,
                        int64_t idx0) {
    if (P->ints) {
        chunk_i(P, s, xi, m, idx0);
    } else {
        apply_map(P, xd, m);
        chunk_f(P, s, xd, m, idx0);
    }
}

/* Reduce the elements [lo, hi) (C order over the reduced dims) of the output based at x
 * byte address base into s. The chunks chunk_f sees (a var's two-pass means, a norm's
 * lanes) are CH elements counted from lo across the runs, so where the strides end a run
 * changes no result: a strided input gives the bits of its contiguous copy. */
static void reduce_range(const rplan *P, acc *s, const char *base, int64_t lo, int64_t hi) {
    if (P->run == 0) return;
    if (P->kind == K_SUM && P->map == M_NONE && !P->ints) { /* sum's own accurate loops */
        s->a += range_sum_f(P, base, lo, hi);
        return;
    }
    int64_t ro = lo / P->run, e = lo % P->run;
    int64_t st = P->rstride[P->nr - 1];
    double xd[CH];
    int64_t xi[CH], m = 0, idx0 = lo;
    while (lo < hi) {
        int64_t n = cpu_min_i64(P->run - e, hi - lo);
        const char *p = base + run_offset(P, ro) + e * st;
        if (P->kind == K_SUM && P->map == M_NONE) { /* integers: wrapping, any order */
            s->i = (int64_t)((uint64_t)s->i + run_sum_i(p, st, n));
        } else {
            for (int64_t o = 0; o < n;) {
                int64_t k = cpu_min_i64(CH - m, n - o);
                if (P->ints) load_i(P->dt, p + o * st, st, k, xi + m);
                else load_d(P->dt, p + o * st, st, k, xd + m);
                m += k, o += k;
                if (m == CH) chunk_flush(P, s, xd, xi, m, idx0), idx0 += m, m = 0;
            }
        }
        lo += n, ro++, e = 0;
    }
    if (m) chunk_flush(P, s, xd, xi, m, idx0);
}

/* The result of a state, for floating outputs. */
static double acc_value(const rplan *P, const acc *s) {
    double v = s->a;
    if (P->kind == K_VAR) {
        double d = s->c - P->correction;
        v = s->b / (d > 0 ? d : 0);
    } else if (P->kind == K_LSE) {
        v = s->a + log(s->b);
    }
    if (P->fin == F_SQRT) v = sqrt(v);
    else if (P->fin == F_ROOT) v = pow(v, 1.0 / P->p);
    return v;
}

static void store_f(em_dtype dt, char *dst, double v) {
    switch (dt) {
    case EM_F32: *(float *)dst = (float)v; break;
    case EM_F64: *(double *)dst = v; break;
    case EM_F16: *(uint16_t *)dst = cpu_f2h((float)v); break;
    case EM_BF16: *(uint16_t *)dst = cpu_f2b((float)v); break;
    default: break;
    }
}

static void store_i(em_dtype dt, char *dst, int64_t v) {
    switch (dt) {
    case EM_I64: *(int64_t *)dst = v; break;
    case EM_I32: *(int32_t *)dst = (int32_t)v; break;
    case EM_U8: *(uint8_t *)dst = (uint8_t)v; break;
    case EM_BOOL: *(bool *)dst = v != 0; break;
    default: break;
    }
}

/* Write a state's value (and index) to its output element(s). */
static void acc_store(const rplan *P, const acc *s, char *dv, char *di) {
    if (di) *(int64_t *)di = s->j;
    if (!dv) return;
    if (P->ints || P->kind == K_ALL || P->kind == K_ANY) store_i(P->yv->dtype, dv, s->i);
    else store_f(P->yv->dtype, dv, acc_value(P, s));
}

/* x's byte offset of output element o (C order over y's shape) and its addresses in the
 * outputs. */
static const char *out_base(const rplan *P, int64_t o, char **dv, char **di) {
    const em_ktensor *x = P->x, *y = P->y;
    const char *base = x->data;
    int64_t ov = 0, oi = 0, e = (int64_t)em_dtype_size(x->dtype);
    for (int d = x->ndim - 1; d >= 0; d--) {
        int64_t i = o % y->shape[d];
        o /= y->shape[d];
        if (!P->red[d]) base += i * x->strides[d] * e;
        if (P->yv) ov += i * P->yv->strides[d];
        if (P->yi) oi += i * P->yi->strides[d];
    }
    *dv = P->yv ? (char *)P->yv->data + ov * (int64_t)em_dtype_size(P->yv->dtype) : NULL;
    *di = P->yi ? (char *)P->yi->data + oi * 8 : NULL;
    return base;
}

/* Fill the geometry of P from x and the reduced-dims mask P->red. */
static void plan_geometry(rplan *P) {
    const em_ktensor *x = P->x;
    int64_t e = (int64_t)em_dtype_size(x->dtype);
    P->nr = 0;
    P->total = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (!P->red[d]) continue;
        P->total *= x->shape[d];
        if (x->shape[d] == 1) continue;
        int64_t sb = x->strides[d] * e;
        if (P->nr > 0 && P->red[d - 1] && P->rstride[P->nr - 1] == sb * x->shape[d]) {
            P->rshape[P->nr - 1] *= x->shape[d];
            P->rstride[P->nr - 1] = sb;
            continue;
        }
        P->rshape[P->nr] = x->shape[d];
        P->rstride[P->nr++] = sb;
    }
    if (P->nr == 0) P->rshape[0] = 1, P->rstride[0] = e, P->nr = 1;
    P->run = P->rshape[P->nr - 1];
    P->runs = 1;
    for (int i = 0; i < P->nr - 1; i++) P->runs *= P->rshape[i];
    if (P->total == 0) P->run = 0;
}

/* One output over many elements: fixed blocks in parallel, merged in block order. */
static em_status reduce_full(const rplan *P) {
    char *dv, *di;
    const char *base = out_base(P, 0, &dv, &di);
    int64_t nb = (P->total + BLOCK - 1) / BLOCK;
    acc *part = nb > 1 ? cpu_scratch(P->k, sizeof(acc) * (size_t)nb) : NULL;
    acc s = acc_init(P);
    if (!part) { /* one block, or no scratch: one pass (the same blocks, merged as we go) */
        if (nb > 1) em_clear_error();
        for (int64_t b = 0; b < nb; b++) {
            acc t = acc_init(P);
            reduce_range(P, &t, base, b * BLOCK, cpu_min_i64(P->total, (b + 1) * BLOCK));
            acc_merge(P, &s, &t);
        }
        acc_store(P, &s, dv, di);
        return EM_OK;
    }
#pragma omp parallel for num_threads(cpu_threads(P->k)) if (P->total >= CPU_GRAIN) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        part[b] = acc_init(P);
        reduce_range(P, &part[b], base, b * BLOCK, cpu_min_i64(P->total, (b + 1) * BLOCK));
    }
    for (int64_t b = 0; b < nb; b++) acc_merge(P, &s, &part[b]);
    acc_store(P, &s, dv, di); /* part: workspace */
    return EM_OK;
}

/* Rows: each output reduces its own elements. */
static void reduce_rows(const rplan *P) {
    int64_t n = P->y->numel;
#pragma omp parallel for num_threads(cpu_threads(P->k)) if (P->x->numel >= CPU_GRAIN && n > 1) \
    schedule(static)
    for (int64_t o = 0; o < n; o++) {
        char *dv, *di;
        const char *base = out_base(P, o, &dv, &di);
        acc s = acc_init(P);
        reduce_range(P, &s, base, 0, P->total);
        acc_store(P, &s, dv, di);
    }
}

/* Columns: K (<= CH) neighbouring outputs along x's contiguous last dim, updated from one
 * reduced position r at a time (p: that position's first column). */
#define CH_SUM 1024 /* ... the float32 sum's (cols_sum_f32) */
typedef struct cols {
    double a[CH_SUM], b[CH_SUM], c[CH_SUM];
    int64_t i[CH_SUM], j[CH_SUM];
} cols;

/* The bias-gradient loop: a row of float32 added into K double accumulators. Cloned for
 * AVX-512 and AVX2 (picked at load time by the CPU's features): -O2 alone gives SSE2. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void cols_sum_f32(double *restrict a, const float *restrict x, int64_t K) {
#pragma omp simd
    for (int64_t k = 0; k < K; k++) a[k] += x[k];
}

/* The same for four rows x, x + st, x + 2 st, x + 3 st (st in elements), added in that order
 * (the sums are those of four cols_sum_f32 calls) with each accumulator loaded and stored
 * once. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void cols_sum4_f32(double *restrict a, const float *restrict x, int64_t st, int64_t K) {
    const float *restrict x1 = x + st, *restrict x2 = x + 2 * st, *restrict x3 = x + 3 * st;
#pragma omp simd
    for (int64_t k = 0; k < K; k++) {
        double v = a[k];
        v += x[k];
        v += x1[k];
        v += x2[k];
        v += x3[k];
        a[k] = v;
    }
}

static void cols_update(const rplan *P, cols *S, const char *p, int64_t K, int64_t r) {
    double x[CH];
    int64_t xi[CH];
    if (P->kind == K_SUM && P->map == M_NONE && P->dt == EM_F32) {
        cols_sum_f32(S->a, (const float *)p, K);
        return;
    }
    if (P->ints) {
        load_i(P->dt, p, (int64_t)em_dtype_size(P->dt), K, xi);
        switch (P->kind) {
        case K_SUM: for (int64_t k = 0; k < K; k++) S->i[k] = (int64_t)((uint64_t)S->i[k] + (uint64_t)xi[k]); break;
        case K_PROD: for (int64_t k = 0; k < K; k++) S->i[k] = (int64_t)((uint64_t)S->i[k] * (uint64_t)xi[k]); break;
        case K_MAX: for (int64_t k = 0; k < K; k++) S->i[k] = xi[k] > S->i[k] ? xi[k] : S->i[k]; break;
        case K_MIN: for (int64_t k = 0; k < K; k++) S->i[k] = xi[k] < S->i[k] ? xi[k] : S->i[k]; break;
        case K_ARGMAX:
            for (int64_t k = 0; k < K; k++)
                if (xi[k] > S->i[k]) S->i[k] = xi[k], S->j[k] = r;
            break;
        case K_ARGMIN:
            for (int64_t k = 0; k < K; k++)
                if (xi[k] < S->i[k]) S->i[k] = xi[k], S->j[k] = r;
            break;
        case K_ALL: for (int64_t k = 0; k < K; k++) S->i[k] = S->i[k] && xi[k] != 0; break;
        case K_ANY: for (int64_t k = 0; k < K; k++) S->i[k] = S->i[k] || xi[k] != 0; break;
        default: break;
        }
        return;
    }
    load_d(P->dt, p, (int64_t)em_dtype_size(P->dt), K, x);
    apply_map(P, x, K);
    switch (P->kind) {
    case K_SUM: for (int64_t k = 0; k < K; k++) S->a[k] += x[k]; break;
    case K_PROD: for (int64_t k = 0; k < K; k++) S->a[k] *= x[k]; break;
    case K_MAX:
        for (int64_t k = 0; k < K; k++) S->a[k] = (x[k] > S->a[k] || x[k] != x[k]) ? x[k] : S->a[k];
        break;
    case K_MIN:
        for (int64_t k = 0; k < K; k++) S->a[k] = (x[k] < S->a[k] || x[k] != x[k]) ? x[k] : S->a[k];
        break;
    case K_ARGMAX:
        for (int64_t k = 0; k < K; k++)
            if (x[k] > S->a[k] || (x[k] != x[k] && S->a[k] == S->a[k])) S->a[k] = x[k], S->j[k] = r;
        break;
    case K_ARGMIN:
        for (int64_t k = 0; k < K; k++)
            if (x[k] < S->a[k] || (x[k] != x[k] && S->a[k] == S->a[k])) S->a[k] = x[k], S->j[k] = r;
        break;
    case K_VAR: { /* Welford; every column has seen r elements */
        double inv = 1.0 / (double)(r + 1);
        for (int64_t k = 0; k < K; k++) {
            double d = x[k] - S->a[k];
            S->a[k] += d * inv;
            S->b[k] += d * (x[k] - S->a[k]);
            S->c[k] = (double)(r + 1);
        }
        break;
    }
    case K_LSE: /* online: (max so far, sum of exp(x - max)) */
        for (int64_t k = 0; k < K; k++) {
            double m = S->a[k];
            if (x[k] > m) S->b[k] = S->b[k] * exp(m - x[k]) + 1, S->a[k] = x[k];
            else S->b[k] += x[k] == m ? 1 : exp(x[k] - m);
        }
        break;
    case K_ALL: for (int64_t k = 0; k < K; k++) S->i[k] = S->i[k] && x[k] != 0; break;
    case K_ANY: for (int64_t k = 0; k < K; k++) S->i[k] = S->i[k] || x[k] != 0; break;
    }
}

static void reduce_cols(const rplan *P) {
    const em_ktensor *x = P->x;
    int last = x->ndim - 1;
    int64_t C = x->shape[last], groups = P->y->numel / C, nt = cpu_threads(P->k);
    /* Column blocks: at most CH wide, enough of them to share among the threads (the split
     * never changes a result: columns are independent). */
    bool f32sum = P->kind == K_SUM && P->map == M_NONE && P->dt == EM_F32;
    int64_t kb = cpu_min_i64(f32sum ? CH_SUM : CH, ((C + nt - 1) / nt + 15) & ~(int64_t)15);
    int64_t nblk = (C + kb - 1) / kb, items = groups * nblk;
    int64_t ysv = P->yv ? P->yv->strides[last] * (int64_t)em_dtype_size(P->yv->dtype) : 0;
    int64_t ysi = P->yi ? P->yi->strides[last] * 8 : 0;
    cols *all = cpu_scratch(P->k, sizeof(cols) * (size_t)nt);
    if (!all) { /* no scratch: the rows path gives the same values */
        em_clear_error();
        reduce_rows(P);
        return;
    }
#pragma omp parallel for num_threads(nt) if (x->numel >= CPU_GRAIN_MEM && items > 1) schedule(static)
    for (int64_t it = 0; it < items; it++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        cols *S = &all[tid];
        int64_t g = it / nblk, c0 = (it % nblk) * kb, K = cpu_min_i64(kb, C - c0);
        char *dv, *di;
        const char *base = out_base(P, g * C + c0, &dv, &di);
        acc s0 = acc_init(P);
        for (int64_t k = 0; k < K; k++) {
            S->a[k] = s0.a, S->b[k] = s0.b, S->c[k] = s0.c, S->i[k] = s0.i, S->j[k] = s0.j;
        }
        int64_t st = P->rstride[P->nr - 1];
        for (int64_t ro = 0, r = 0; ro < P->runs && P->run > 0; ro++) {
            const char *p = base + run_offset(P, ro);
            int64_t q = 0;
            if (f32sum && st % 4 == 0)
                for (; q + 4 <= P->run; q += 4, r += 4)
                    cols_sum4_f32(S->a, (const float *)(p + q * st), st / 4, K);
            for (; q < P->run; q++, r++) cols_update(P, S, p + q * st, K, r);
        }
        for (int64_t k = 0; k < K; k++) {
            acc s = {S->a[k], S->b[k], S->c[k], S->i[k], S->j[k]};
            acc_store(P, &s, dv ? dv + k * ysv : NULL, di ? di + k * ysi : NULL);
        }
    } /* all: workspace */
}

static em_status run_plan(rplan *P) {
    plan_geometry(P);
    const em_ktensor *x = P->x;
    if (P->y->numel == 0) return EM_OK;
    int last = x->ndim - 1;
    if (P->y->numel == 1 && P->total > BLOCK) return reduce_full(P);
    if (x->ndim > 0 && !P->red[last] && x->shape[last] >= 16 && x->strides[last] == 1 &&
        P->total > 1)
        reduce_cols(P);
    else
        reduce_rows(P);
    return EM_OK;
}

/* A plan for kernel call k: kind, reduced dims from attrs[0] (ints) unless dim >= 0. */
static rplan plan_for(const em_kernel_ctx *k, rkind kind) {
    rplan P = {.k = k, .kind = kind, .x = &k->in[0], .dt = k->in[0].dtype,
               .ints = !em_dtype_is_floating(k->in[0].dtype)};
    P.yv = &k->out[0];
    P.y = &k->out[0];
    if (k->attrs[0].type == EM_ATTR_INTS)
        for (int i = 0; i < k->attrs[0].n; i++) P.red[k->attrs[0].ints[i]] = true;
    return P;
}

/* ---- kernels ---------------------------------------------------------------------------------- */

static em_status k_sum(const em_kernel_ctx *k) {
    rplan P = plan_for(k, K_SUM);
    plan_geometry(&P);
    if (P.y->numel == 1 && P.runs == 1) { /* one run: sum's own blocked path */
        full_sum(k, P.dt, P.x->data, P.rstride[P.nr - 1], P.run, P.y->data);
        return EM_OK;
    }
    return run_plan(&P);
}

static em_status k_amax(const em_kernel_ctx *k) { rplan P = plan_for(k, K_MAX); return run_plan(&P); }
static em_status k_amin(const em_kernel_ctx *k) { rplan P = plan_for(k, K_MIN); return run_plan(&P); }
static em_status k_prod(const em_kernel_ctx *k) { rplan P = plan_for(k, K_PROD); return run_plan(&P); }
static em_status k_all(const em_kernel_ctx *k) { rplan P = plan_for(k, K_ALL); return run_plan(&P); }
static em_status k_any(const em_kernel_ctx *k) { rplan P = plan_for(k, K_ANY); return run_plan(&P); }
static em_status k_logsumexp(const em_kernel_ctx *k) {
    rplan P = plan_for(k, K_LSE);
    return run_plan(&P);
}

static em_status arg(const em_kernel_ctx *k, rkind kind) {
    rplan P = plan_for(k, kind);
    P.yv = NULL;
    P.yi = &k->out[0];
    return run_plan(&P);
}
static em_status k_argmax(const em_kernel_ctx *k) { return arg(k, K_ARGMAX); }
static em_status k_argmin(const em_kernel_ctx *k) { return arg(k, K_ARGMIN); }

static em_status extreme_dim(const em_kernel_ctx *k, rkind kind) {
    rplan P = plan_for(k, kind);
    if (P.x->ndim > 0) P.red[k->attrs[0].v.i] = true;
    P.yi = &k->out[1];
    return run_plan(&P);
}
static em_status k_max_dim(const em_kernel_ctx *k) { return extreme_dim(k, K_ARGMAX); }
static em_status k_min_dim(const em_kernel_ctx *k) { return extreme_dim(k, K_ARGMIN); }

static em_status var_std(const em_kernel_ctx *k, bool sd) {
    rplan P = plan_for(k, K_VAR);
    P.correction = k->attrs[1].v.f;
    P.fin = sd ? F_SQRT : F_NONE;
    return run_plan(&P);
}
static em_status k_var(const em_kernel_ctx *k) { return var_std(k, false); }
static em_status k_std(const em_kernel_ctx *k) { return var_std(k, true); }

static em_status k_norm(const em_kernel_ctx *k) {
    double p = k->attrs[1].v.f;
    rplan P = plan_for(k, K_SUM);
    P.p = p;
    if (p == 2) P.map = M_SQ, P.fin = F_SQRT;
    else if (p == 1) P.map = M_ABS;
    else if (p == 0) P.map = M_NZ;
    else if (isinf(p)) P.map = M_ABS, P.kind = p > 0 ? K_MAX : K_MIN;
    else P.map = M_POW, P.fin = F_ROOT;
    return run_plan(&P);
}

em_status cpu_register_reduce(em_registry *r) {
    static const em_dtype sum[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I64};
    static const em_dtype all[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8, EM_BOOL};
    static const em_dtype num[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8};
    static const em_dtype flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    em_status st = EM_OK;
#define REG(op, set, fn) if (st == EM_OK) st = cpu_register_kernels(r, op, set, (int)(sizeof set / sizeof *set), fn, "cpu_" op)
    REG("sum", sum, k_sum);
    REG("prod", sum, k_prod);
    REG("amax", all, k_amax);
    REG("amin", all, k_amin);
    REG("max_dim", all, k_max_dim);
    REG("min_dim", all, k_min_dim);
    REG("argmax", num, k_argmax);
    REG("argmin", num, k_argmin);
    REG("var", flt, k_var);
    REG("std", flt, k_std);
    REG("logsumexp", flt, k_logsumexp);
    REG("norm", flt, k_norm);
    REG("all", all, k_all);
    REG("any", all, k_any);
#undef REG
    return st;
}
