/*
 * cpu_loss.c — CPU kernels of the losses and their backward ops (contracts in
 * core/ops_loss.c): cross_entropy, nll_loss, mse_loss, l1_loss, smooth_l1_loss,
 * binary_cross_entropy_with_logits.
 *
 * f32, f16 and bf16 compute in float, f64 in double; sums over elements and over classes
 * accumulate in double. The class losses walk "positions" (the input's elements without the
 * class dim), each one a strided row of C logits; logsumexp subtracts the row's max, so
 * logits of +-1e4 stay finite. Reductions sum per-thread partials in thread order (the same
 * result for the same thread count); in deterministic mode they run on one thread.
 */
#include "config.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/tensor.h"
#include "cpu.h"
#include "../common/scalar_math.h"

enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

#define EXP(v) _Generic((v), float: expf, default: exp)(v)
#define LOG(v) _Generic((v), float: logf, default: log)(v)
#define LOG1P(v) _Generic((v), float: log1pf, default: log1p)(v)
#define ABS(v) _Generic((v), float: fabsf, default: fabs)(v)

/* Per dtype: element type, compute type, load to compute type, store from it. */
#define LD_ID(v) (v)
#define ST_ID(v) (v)
#define LD_H(v) cpu_h2f(v)
#define ST_H(v) cpu_f2h(v)
#define LD_B(v) cpu_b2f(v)
#define ST_B(v) cpu_f2b(v)
#define FOR_EACH_FLOAT(M, ...)                                                                 \
    M(f32, float, float, LD_ID, ST_ID, __VA_ARGS__)                                            \
    M(f64, double, double, LD_ID, ST_ID, __VA_ARGS__)                                          \
    M(f16, uint16_t, float, LD_H, ST_H, __VA_ARGS__)                                           \
    M(bf16, uint16_t, float, LD_B, ST_B, __VA_ARGS__)

static int64_t attr_i(const em_kernel_ctx *k, int i, int64_t def) {
    return k->attrs && k->attrs[i].type == EM_ATTR_INT ? k->attrs[i].v.i : def;
}
static double attr_f(const em_kernel_ctx *k, int i, double def) {
    return k->attrs && k->attrs[i].type == EM_ATTR_FLOAT ? k->attrs[i].v.f : def;
}

static void store_scalar(const em_ktensor *o, double v) {
    switch (o->dtype) {
    case EM_F32: *(float *)o->data = (float)v; break;
    case EM_F64: *(double *)o->data = v; break;
    case EM_F16: *(uint16_t *)o->data = cpu_f2h((float)v); break;
    case EM_BF16: *(uint16_t *)o->data = cpu_f2b((float)v); break;
    default: break;
    }
}

static double load_scalar(const em_ktensor *t) { return em_dtype_load(t->dtype, t->data, 0); }

/* Per-thread partial sums, 8 doubles apart (one cache line each). */
typedef struct partials {
    double *v;
    int n;
} partials;

static em_status partials_init(const em_kernel_ctx *k, partials *p, const char *who) {
    p->n = cpu_threads(k);
    (void)who; /* the workspace's error names the op */
    p->v = cpu_scratch(k, sizeof(double) * 8 * (size_t)p->n);
    if (!p->v) return em_last_status();
    for (int i = 0; i < p->n; i++) p->v[8 * i] = 0;
    return EM_OK;
}

static double partials_sum(partials *p) {
    double s = 0;
    for (int i = 0; i < p->n; i++) s += p->v[8 * i]; /* p->v: workspace, not freed */
    return s;
}

/* ---- class losses: cross_entropy, nll_loss ------------------------------------------------------ */

enum { MODE_CE, MODE_PROBS, MODE_NLL };

/* A position p (C order over the input's shape without the class dim) and where it lives in
 * each operand; strides in elements. */
typedef struct cls_job {
    int nd;
    int64_t shape[EM_MAX_DIMS];
    int64_t xs[EM_MAX_DIMS], ts[EM_MAX_DIMS], os[EM_MAX_DIMS], gs[EM_MAX_DIMS];
    int64_t npos, C, xc, tc, oc, ws;
    int mode;
    int64_t red, ignore;
    double ls, wall;   /* label smoothing; sum of the class weights (C when none) */
    double gscale;     /* backward, reduced: the grad times 1/W, 1/npos or 1 */
    bool has_w;
    int vec;           /* f32 with xc == 1 (and oc == 1 for the backward): cls_simd_level() */
    const void *x, *t, *w, *g;
    void *out;         /* forward: the unreduced loss; backward: grad_x */
} cls_job;

static inline void pos_offsets(const cls_job *j, int64_t p, int64_t *xo, int64_t *to,
                               int64_t *oo, int64_t *go) {
    *xo = *to = *oo = *go = 0;
    for (int d = j->nd - 1; d >= 0; d--) {
        int64_t i = p % j->shape[d];
        p /= j->shape[d];
        *xo += i * j->xs[d];
        *to += i * j->ts[d];
        *oo += i * j->os[d];
        *go += i * j->gs[d];
    }
}

/* logsumexp of the strided row xr[0..C) (stride xc), in CT with a double sum. */
#define ROW_LSE(CT, LD, xr, C, xc, lse)                                                        \
    do {                                                                                       \
        CT m_ = (CT)-INFINITY;                                                                 \
        for (int64_t c_ = 0; c_ < (C); c_++) {                                                 \
            CT v_ = LD((xr)[c_ * (xc)]);                                                       \
            m_ = v_ > m_ ? v_ : m_;                                                            \
        }                                                                                      \
        double s_ = 0;                                                                         \
        for (int64_t c_ = 0; c_ < (C); c_++) s_ += (double)EXP((CT)(LD((xr)[c_ * (xc)]) - m_)); \
        (lse) = (CT)(m_ + (CT)LOG((CT)s_));                                                    \
    } while (0)

/* f32 cross_entropy rows with contiguous classes (xc == 1) through libmvec's vector expf
 * (_ZGVeN16v_expf on AVX-512, _ZGVdN8v_expf on AVX2 with FMA; a few ULP like libm's
 * expf, and the same result on every run of a machine), chosen at run time: the scalar
 * expf, once per logit in the forward and twice in the backward, was most of the loss's
 * time in the LSTM step. The row's sum of exp(x - max) still accumulates in double (each
 * lane converted), in lane order then across lanes; logf and the loss stay scalar. The loops
 * are written once, in cpu_loss_simd_loops.h, and compiled per instruction set below. */
#if defined(EM_HAVE_LIBMVEC) && defined(__x86_64__)
#define CLS_SIMD 1
#include <immintrin.h>
__m512 _ZGVeN16v_expf(__m512 x);
__m256 _ZGVdN8v_expf(__m256 x);

/* AVX2's horizontal max and double sum, in the order the loops always used. */
__attribute__((target("avx2,fma"))) static inline float hmax_256(__m256 v) {
    float l[8];
    _mm256_storeu_ps(l, v);
    float m = l[0];
    for (int i = 1; i < 8; i++) m = l[i] > m ? l[i] : m;
    return m;
}

__attribute__((target("avx2,fma"))) static inline double hsum_256d(__m256d v) {
    double d[4];
    _mm256_storeu_pd(d, v);
    return (d[0] + d[1]) + (d[2] + d[3]);
}

/* ---- AVX-512: row_lse_512, row_exp_scale_512 ---- */
#define V __m512
#define VD __m512d
#define W 16
#define FN(name) name##_512
#define ATTR __attribute__((target("avx512f")))
#define LDU(p) _mm512_loadu_ps(p)
#define STU(p, v) _mm512_storeu_ps((p), (v))
#define SET1 _mm512_set1_ps
#define SUB _mm512_sub_ps
#define MUL _mm512_mul_ps
#define MAX _mm512_max_ps
#define ZEROD _mm512_setzero_pd
#define ADDD _mm512_add_pd
#define CVT_LO(e) _mm512_cvtps_pd(_mm512_castps512_ps256(e))
#define CVT_HI(e) _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)))
#define HMAX _mm512_reduce_max_ps
#define HSUM_D _mm512_reduce_add_pd
#define VEXP _ZGVeN16v_expf
#include "cpu_loss_simd_loops.h"

/* ---- AVX2 with FMA: row_lse_256, row_exp_scale_256 ---- */
#define V __m256
#define VD __m256d
#define W 8
#define FN(name) name##_256
#define ATTR __attribute__((target("avx2,fma")))
#define LDU(p) _mm256_loadu_ps(p)
#define STU(p, v) _mm256_storeu_ps((p), (v))
#define SET1 _mm256_set1_ps
#define SUB _mm256_sub_ps
#define MUL _mm256_mul_ps
#define MAX _mm256_max_ps
#define ZEROD _mm256_setzero_pd
#define ADDD _mm256_add_pd
#define CVT_LO(e) _mm256_cvtps_pd(_mm256_castps256_ps128(e))
#define CVT_HI(e) _mm256_cvtps_pd(_mm256_extractf128_ps((e), 1))
#define HMAX hmax_256
#define HSUM_D hsum_256d
#define VEXP _ZGVdN8v_expf
#include "cpu_loss_simd_loops.h"

/* 2: AVX-512, 1: AVX2 and FMA, 0: neither (the scalar loops). */
static int cls_simd_level(void) {
    return cpu_nn_has_avx512() ? 2 : cpu_nn_has_avx2() ? 1 : 0;
}
#endif

/* ROW_LSE, through the vector row when j->vec (f32 only: the casts are dead otherwise). */
#ifdef CLS_SIMD
#define CLS_LSE(CT, LD, xr, C, xc, lse)                                                        \
    do {                                                                                       \
        if (j->vec == 2) (lse) = (CT)row_lse_512((const float *)(xr), (C));                    \
        else if (j->vec == 1) (lse) = (CT)row_lse_256((const float *)(xr), (C));               \
        else ROW_LSE(CT, LD, xr, C, xc, lse);                                                  \
    } while (0)
/* gr[c] = exp(x[c] - lse) * AB over the row when the vector path applies (then true). */
#define CLS_VEC_BWD(j, gr, xr, C, lse, AB)                                                     \
    ((j)->vec == 2   ? (row_exp_scale_512((float *)(gr), (const float *)(xr), (C), (float)(lse), \
                                          (float)(AB)), true)                                  \
     : (j)->vec == 1 ? (row_exp_scale_256((float *)(gr), (const float *)(xr), (C), (float)(lse), \
                                          (float)(AB)), true)                                  \
                     : false)
#else
#define CLS_LSE ROW_LSE
#define CLS_VEC_BWD(j, gr, xr, C, lse, AB) false
#endif

#define DEF_CLASS(sfx, T, CT, LD, ST, unused)                                                  \
    static void cls_fwd_##sfx(const cls_job *j, int64_t lo, int64_t hi, double *acc) {        \
        const T *x = j->x, *w = j->w;                                                          \
        const int64_t C = j->C, xc = j->xc, ws = j->ws, tc = j->tc;                            \
        const CT ls = (CT)j->ls, lsC = C ? (CT)(j->ls / (double)C) : (CT)0;                    \
        double sum = 0;                                                                        \
        for (int64_t p = lo; p < hi; p++) {                                                    \
            int64_t xo, to, oo, go;                                                            \
            pos_offsets(j, p, &xo, &to, &oo, &go);                                             \
            const T *xr = x + xo;                                                              \
            CT loss = 0, lse;                                                                  \
            if (j->mode == MODE_PROBS) {                                                       \
                const T *tr = (const T *)j->t + to;                                            \
                ROW_LSE(CT, LD, xr, C, xc, lse);                                               \
                double s = 0;                                                                  \
                for (int64_t c = 0; c < C; c++) {                                              \
                    CT y = LD(tr[c * tc]);                                                     \
                    if (ls > 0) y = y * (1 - ls) + lsC;                                        \
                    CT wc = j->has_w ? LD(w[c * ws]) : (CT)1;                                  \
                    s += (double)(wc * y * (LD(xr[c * xc]) - lse));                            \
                }                                                                              \
                loss = (CT)-s;                                                                 \
            } else {                                                                           \
                int64_t t = ((const int64_t *)j->t)[to];                                       \
                if (t != j->ignore) {                                                          \
                    CT wt = j->has_w ? LD(w[t * ws]) : (CT)1;                                  \
                    if (j->mode == MODE_NLL) {                                                 \
                        loss = -wt * LD(xr[t * xc]);                                           \
                    } else {                                                                   \
                        CLS_LSE(CT, LD, xr, C, xc, lse);                                       \
                        loss = -(1 - ls) * wt * (LD(xr[t * xc]) - lse);                        \
                        if (ls > 0) {                                                          \
                            double s = 0;                                                      \
                            for (int64_t c = 0; c < C; c++)                                    \
                                s += (double)((j->has_w ? LD(w[c * ws]) : (CT)1) *             \
                                              (LD(xr[c * xc]) - lse));                         \
                            loss -= lsC * (CT)s;                                               \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            if (j->red == RED_NONE) ((T *)j->out)[oo] = ST(loss);                              \
            else sum += (double)loss;                                                          \
        }                                                                                      \
        *acc += sum;                                                                           \
    }                                                                                          \
    static void cls_bwd_##sfx(const cls_job *j, int64_t lo, int64_t hi, double *acc) {        \
        (void)acc;                                                                             \
        const T *x = j->x, *w = j->w;                                                          \
        T *gx = j->out;                                                                        \
        const int64_t C = j->C, xc = j->xc, ws = j->ws, tc = j->tc, oc = j->oc;                \
        const CT ls = (CT)j->ls, lsC = C ? (CT)(j->ls / (double)C) : (CT)0;                    \
        for (int64_t p = lo; p < hi; p++) {                                                    \
            int64_t xo, to, oo, go;                                                            \
            pos_offsets(j, p, &xo, &to, &oo, &go);                                             \
            const T *xr = x + xo;                                                              \
            T *gr = gx + oo;                                                                   \
            CT g = j->red == RED_NONE ? LD(((const T *)j->g)[go]) : (CT)j->gscale, lse;        \
            if (j->mode == MODE_PROBS) {                                                       \
                const T *tr = (const T *)j->t + to;                                            \
                ROW_LSE(CT, LD, xr, C, xc, lse);                                               \
                double s = 0;                                                                  \
                for (int64_t c = 0; c < C; c++) {                                              \
                    CT y = LD(tr[c * tc]);                                                     \
                    if (ls > 0) y = y * (1 - ls) + lsC;                                        \
                    s += (double)((j->has_w ? LD(w[c * ws]) : (CT)1) * y);                     \
                }                                                                              \
                for (int64_t c = 0; c < C; c++) {                                              \
                    CT y = LD(tr[c * tc]);                                                     \
                    if (ls > 0) y = y * (1 - ls) + lsC;                                        \
                    CT wc = j->has_w ? LD(w[c * ws]) : (CT)1;                                  \
                    CT pc = EXP((CT)(LD(xr[c * xc]) - lse));                                   \
                    gr[c * oc] = ST(g * (pc * (CT)s - wc * y));                                \
                }                                                                              \
                continue;                                                                      \
            }                                                                                  \
            int64_t t = ((const int64_t *)j->t)[to];                                           \
            for (int64_t c = 0; c < C; c++) gr[c * oc] = ST((CT)0);                            \
            if (t == j->ignore) continue;                                                      \
            CT wt = j->has_w ? LD(w[t * ws]) : (CT)1;                                          \
            if (j->mode == MODE_NLL) {                                                         \
                gr[t * oc] = ST(-wt * g);                                                      \
                continue;                                                                      \
            }                                                                                  \
            /* d/dx_c = p_c (A + B W) - B w_c - [c == t] A, A = g (1 - ls) w_t, B = g ls / C */ \
            CLS_LSE(CT, LD, xr, C, xc, lse);                                                   \
            CT A = g * (1 - ls) * wt, B = ls > 0 ? g * lsC : (CT)0;                            \
            CT AB = ls > 0 ? A + B * (CT)j->wall : A;                                          \
            if (CLS_VEC_BWD(j, gr, xr, C, lse, AB)) {                                          \
                if (ls > 0)                                                                    \
                    for (int64_t c = 0; c < C; c++)                                            \
                        gr[c] = ST(LD(gr[c]) - B * (j->has_w ? LD(w[c * ws]) : (CT)1));        \
                gr[t] = ST(LD(gr[t]) - A);                                                     \
                continue;                                                                      \
            }                                                                                  \
            for (int64_t c = 0; c < C; c++) {                                                  \
                CT pc = EXP((CT)(LD(xr[c * xc]) - lse));                                       \
                CT v = pc * AB;                                                                \
                if (ls > 0) v -= B * (j->has_w ? LD(w[c * ws]) : (CT)1);                       \
                if (c == t) v -= A;                                                            \
                gr[c * oc] = ST(v);                                                            \
            }                                                                                  \
        }                                                                                      \
    }

FOR_EACH_FLOAT(DEF_CLASS, 0)

typedef void (*cls_fn)(const cls_job *j, int64_t lo, int64_t hi, double *acc);
static const cls_fn cls_fwd[EM_DTYPE_COUNT] = {[EM_F32] = cls_fwd_f32, [EM_F64] = cls_fwd_f64,
                                               [EM_F16] = cls_fwd_f16, [EM_BF16] = cls_fwd_bf16};
static const cls_fn cls_bwd[EM_DTYPE_COUNT] = {[EM_F32] = cls_bwd_f32, [EM_F64] = cls_bwd_f64,
                                               [EM_F16] = cls_bwd_f16, [EM_BF16] = cls_bwd_bf16};

/* Run fn over positions [0, npos), split across threads when the work is large; returns the
 * sum of what fn accumulated. */
static em_status cls_run(const em_kernel_ctx *k, cls_fn fn, const cls_job *j, double *sum) {
    int nt = cpu_threads(k);
    bool par = nt > 1 && j->npos > 1 && j->npos * (j->C + 1) >= CPU_GRAIN &&
               !(j->red != RED_NONE && em_deterministic());
    *sum = 0;
    if (!par) {
        fn(j, 0, j->npos, sum);
        return EM_OK;
    }
    partials p;
    if (partials_init(k, &p, em_op_name(k->op)) != EM_OK) return em_last_status();
    nt = p.n; /* one slot per thread, whatever a concurrent set_num_threads did since */
#pragma omp parallel num_threads(nt)
    {
        int64_t tid = omp_get_thread_num(), nth = omp_get_num_threads();
        int64_t lo = j->npos * tid / nth, hi = j->npos * (tid + 1) / nth;
        fn(j, lo, hi, &p.v[8 * tid]);
    }
    *sum = partials_sum(&p);
    return EM_OK;
}

/* Geometry of x (N, C, d...) or (C), target, the per-position tensor `pos` (loss or grad of
 * reduction none; NULL otherwise) and grad_x (backward; NULL otherwise). */
static void cls_setup(cls_job *j, const em_kernel_ctx *k, bool nll, const em_ktensor *x,
                      const em_ktensor *t, const em_ktensor *w, const em_ktensor *pos,
                      const em_ktensor *gx) {
    int cdim = x->ndim == 1 ? 0 : 1;
    j->C = x->shape[cdim];
    j->xc = x->strides[cdim];
    j->mode = em_dtype_is_floating(t->dtype) ? MODE_PROBS
              : nll ? MODE_NLL : MODE_CE;
    j->tc = j->mode == MODE_PROBS ? t->strides[cdim] : 0;
    j->oc = gx ? gx->strides[cdim] : 0;
    j->nd = 0;
    j->npos = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == cdim) continue;
        int jd = d < cdim ? d : d - 1; /* the dim in target (class indices) and pos */
        j->shape[j->nd] = x->shape[d];
        j->xs[j->nd] = x->strides[d];
        j->ts[j->nd] = j->mode == MODE_PROBS ? t->strides[d] : t->strides[jd];
        j->os[j->nd] = gx ? gx->strides[d] : pos ? pos->strides[jd] : 0;
        j->gs[j->nd] = gx && pos ? pos->strides[jd] : 0;
        j->npos *= x->shape[d];
        j->nd++;
    }
    j->has_w = w->numel > 0;
    j->ws = j->has_w ? w->strides[0] : 0;
    j->wall = (double)j->C;
    if (j->has_w) {
        j->wall = 0;
        for (int64_t c = 0; c < j->C; c++) j->wall += em_dtype_load(w->dtype, w->data, c * j->ws);
    }
    j->red = attr_i(k, 0, RED_MEAN);
    j->ignore = attr_i(k, 1, -100);
    j->ls = j->mode == MODE_NLL ? 0 : attr_f(k, 2, 0.0);
    j->vec = 0;
#ifdef CLS_SIMD
    if (x->dtype == EM_F32 && j->xc == 1 && (!gx || j->oc == 1)) j->vec = cls_simd_level();
#endif
    j->x = x->data;
    j->t = t->data;
    j->w = w->data;
}

/* Checks every class index (EM_ERR_RANGE naming it and C) and sums the weights of the
 * targets not ignored into *W. */
static em_status cls_targets(const em_kernel_ctx *k, const cls_job *j, const em_ktensor *w,
                             double *W) {
    const int64_t *t = j->t;
    *W = 0;
    for (int64_t p = 0; p < j->npos; p++) {
        int64_t to = 0, q = p;
        for (int d = j->nd - 1; d >= 0; d--) {
            to += (q % j->shape[d]) * j->ts[d];
            q /= j->shape[d];
        }
        int64_t c = t[to];
        if (c == j->ignore) continue;
        if (c < 0 || c >= j->C)
            return em_set_error(EM_ERR_RANGE, "%s: target class index %lld is out of range [0, "
                                "%lld) (target element %lld; ignore_index is %lld)",
                                em_op_name(k->op), (long long)c, (long long)j->C, (long long)p,
                                (long long)j->ignore);
        *W += j->has_w ? em_dtype_load(w->dtype, w->data, c * j->ws) : 1.0;
    }
    return EM_OK;
}

static em_status class_fwd(const em_kernel_ctx *k, bool nll) {
    const em_ktensor *x = &k->in[0], *t = &k->in[1], *w = &k->in[2], *o = &k->out[0];
    cls_job j;
    cls_setup(&j, k, nll, x, t, w, attr_i(k, 0, RED_MEAN) == RED_NONE ? o : NULL, NULL);
    j.out = o->data;
    double W = (double)j.npos, sum;
    if (j.mode != MODE_PROBS && cls_targets(k, &j, w, &W) != EM_OK) return em_last_status();
    if (cls_run(k, cls_fwd[x->dtype], &j, &sum) != EM_OK) return em_last_status();
    if (j.red == RED_MEAN) sum = x->numel == 0 ? NAN : sum / W; /* 0 / 0 when all are ignored */
    if (j.red != RED_NONE) store_scalar(o, sum);
    return EM_OK;
}

static em_status class_bwd(const em_kernel_ctx *k, bool nll) {
    const em_ktensor *g = &k->in[0], *x = &k->in[1], *t = &k->in[2], *w = &k->in[3];
    const em_ktensor *gx = &k->out[0];
    cls_job j;
    cls_setup(&j, k, nll, x, t, w, attr_i(k, 0, RED_MEAN) == RED_NONE ? g : NULL, gx);
    j.out = gx->data;
    j.g = g->data;
    double W = (double)j.npos, unused;
    if (j.mode != MODE_PROBS && cls_targets(k, &j, w, &W) != EM_OK) return em_last_status();
    if (j.red != RED_NONE) j.gscale = load_scalar(g) / (j.red == RED_MEAN ? W : 1.0);
    return cls_run(k, cls_bwd[x->dtype], &j, &unused);
}

static em_status k_ce(const em_kernel_ctx *k) { return class_fwd(k, false); }
static em_status k_ce_bwd(const em_kernel_ctx *k) { return class_bwd(k, false); }
static em_status k_nll(const em_kernel_ctx *k) { return class_fwd(k, true); }
static em_status k_nll_bwd(const em_kernel_ctx *k) { return class_bwd(k, true); }

/* ---- pointwise losses: mse, l1, smooth_l1, bce_with_logits --------------------------------------- */

typedef struct pw_ctx {
    bool red, has_w, has_pw;
    double beta, scale;
} pw_ctx;

/* A reduced pointwise loss sums its elements in an order fixed by their C-order index over
 * the (broadcast) shape alone, never by their strides, so that a sliced or transposed input
 * gives the bits of its contiguous copy: element i adds into lane i % PW_LANES (in index
 * order), the lanes add up pairwise at the end, and threads take runs of indices that start
 * at multiples of PW_LANES. The contiguous loop vectorises over the lanes (no reassociation:
 * each lane's sum is in index order either way). */
#define PW_LANES 8
typedef struct pw_red {
    int nd;
    int64_t shape[EM_MAX_DIMS];
    int64_t st[4][EM_MAX_DIMS]; /* element strides of x, y, w, pw (0 on broadcast dims) */
    const void *p[4];           /* x, y, w, pw (x when w or pw is absent) */
    bool contig;                /* x and y contiguous, no w or pw: the vector loop */
} pw_red;

static double pw_lanes_sum(const double *l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* Forward and backward loops of one loss for one dtype. FWD and BWD are expressions in x, y
 * (target), w, pw (weights, 1 when absent), hp (pos_weight given) and beta, of type CT (a
 * typedef inside each generated function, so that the expressions can name it); the
 * backward value is multiplied by the incoming grad. Operands: forward {out, x, y, w, pw}
 * (unreduced; name##_red_##sfx sums elements [lo, hi) of a reduced one, see pw_red), backward
 * {grad_x, grad, x, y, w, pw}. */
#define DEF_PW(sfx, T, CTY, LD, ST, name, FWD, BWD)                                            \
    static void name##_fwd_##sfx(char **p, const int64_t *s, int64_t n, void *vc) {            \
        typedef CTY CT;                                                                        \
        const pw_ctx *c = vc;                                                                  \
        const int64_t e = (int64_t)sizeof(T);                                                  \
        const CT beta = (CT)c->beta;                                                           \
        const bool hp = c->has_pw;                                                             \
        (void)beta, (void)hp;                                                                  \
        if (!c->has_w && !hp && s[0] == e && s[1] == e && s[2] == e) {                         \
            const T *xa = (const T *)p[1], *ya = (const T *)p[2];                              \
            const CT w = 1, pw = 1;                                                            \
            (void)w, (void)pw;                                                                 \
            T *o = (T *)p[0];                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                  \
                CT x = LD(xa[i]), y = LD(ya[i]);                                               \
                o[i] = ST((CT)(FWD));                                                          \
            }                                                                                  \
        } else {                                                                               \
            for (int64_t i = 0; i < n; i++) {                                                  \
                CT x = LD(*(const T *)(p[1] + i * s[1])), y = LD(*(const T *)(p[2] + i * s[2])); \
                CT w = c->has_w ? LD(*(const T *)(p[3] + i * s[3])) : (CT)1;                  \
                CT pw = hp ? LD(*(const T *)(p[4] + i * s[4])) : (CT)1;                        \
                (void)w, (void)pw;                                                             \
                *(T *)(p[0] + i * s[0]) = ST((CT)(FWD));                                       \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    static double name##_red_##sfx(const pw_ctx *c, const pw_red *r, int64_t lo, int64_t hi) { \
        typedef CTY CT;                                                                        \
        const CT beta = (CT)c->beta;                                                           \
        const bool hp = c->has_pw;                                                             \
        const T *xa = r->p[0], *ya = r->p[1], *wa = r->p[2], *pa = r->p[3];                    \
        double lane[PW_LANES] = {0};                                                           \
        (void)beta, (void)hp, (void)wa, (void)pa;                                              \
        if (r->contig) {                                                                       \
            const CT w = 1, pw = 1;                                                            \
            double acc[PW_LANES] = {0}; /* not lane: its indexing below keeps it in memory */  \
            (void)w, (void)pw;                                                                 \
            int64_t i = lo;                                                                    \
            for (; i + PW_LANES <= hi; i += PW_LANES)                                          \
                _Pragma("GCC unroll 8") for (int j = 0; j < PW_LANES; j++) {                                           \
                    CT x = LD(xa[i + j]), y = LD(ya[i + j]);                                   \
                    acc[j] += (double)(CT)(FWD);                                               \
                }                                                                              \
            if (i < hi) {                                                                      \
                /* the last, partial group adds +0.0 to the lanes it does not reach: exact,    \
                 * as a lane that starts at +0.0 is never -0.0 */                              \
                double v[PW_LANES] = {0};                                                      \
                for (int j = 0; j < hi - i; j++) {                                             \
                    CT x = LD(xa[i + j]), y = LD(ya[i + j]);                                   \
                    v[j] = (double)(CT)(FWD);                                                  \
                }                                                                              \
                for (int j = 0; j < PW_LANES; j++) acc[j] += v[j];                             \
            }                                                                                  \
            return pw_lanes_sum(acc);                                                          \
        }                                                                                      \
        const int in = r->nd - 1;                                                              \
        int64_t idx[EM_MAX_DIMS], off[4] = {0}, rem = lo;                                      \
        for (int d = in; d >= 0; d--) {                                                        \
            idx[d] = rem % r->shape[d];                                                        \
            rem /= r->shape[d];                                                                \
            for (int q = 0; q < 4; q++) off[q] += idx[d] * r->st[q][d];                        \
        }                                                                                      \
        const int64_t s0 = r->st[0][in], s1 = r->st[1][in], s2 = r->st[2][in], s3 = r->st[3][in]; \
        for (int64_t i = lo; i < hi;) { /* a run along the innermost dim */                    \
            int64_t len = cpu_min_i64(r->shape[in] - idx[in], hi - i);                         \
            const T *xp = xa + off[0], *yp = ya + off[1], *wp = wa + off[2], *pp = pa + off[3]; \
            (void)wp, (void)pp, (void)s2, (void)s3;                                            \
            for (int64_t j = 0; j < len; j++, i++) {                                           \
                CT x = LD(xp[j * s0]), y = LD(yp[j * s1]);                                     \
                CT w = c->has_w ? LD(wp[j * s2]) : (CT)1, pw = hp ? LD(pp[j * s3]) : (CT)1;    \
                (void)w, (void)pw;                                                             \
                lane[i & (PW_LANES - 1)] += (double)(CT)(FWD);                                 \
            }                                                                                  \
            for (int q = 0; q < 4; q++) off[q] += len * r->st[q][in];                          \
            idx[in] += len;                                                                    \
            for (int d = in; d > 0 && idx[d] == r->shape[d]; d--) { /* carry, C order */       \
                for (int q = 0; q < 4; q++) off[q] += r->st[q][d - 1] - r->shape[d] * r->st[q][d]; \
                idx[d] = 0;                                                                    \
                idx[d - 1]++;                                                                  \
            }                                                                                  \
        }                                                                                      \
        return pw_lanes_sum(lane);                                                             \
    }                                                                                          \
    static void name##_bwd_##sfx(char **p, const int64_t *s, int64_t n, void *vc) {            \
        typedef CTY CT;                                                                        \
        const pw_ctx *c = vc;                                                                  \
        const int64_t e = (int64_t)sizeof(T);                                                  \
        const CT beta = (CT)c->beta, scale = (CT)c->scale;                                     \
        const bool hp = c->has_pw;                                                             \
        (void)beta, (void)hp;                                                                  \
        if (!c->has_w && !hp && s[0] == e && s[2] == e && s[3] == e && s[1] == 0) {            \
            T *o = (T *)p[0];                                                                  \
            const T *xa = (const T *)p[2], *ya = (const T *)p[3];                              \
            const CT g = LD(*(const T *)p[1]) * scale, w = 1, pw = 1;                          \
            (void)w, (void)pw;                                                                 \
            for (int64_t i = 0; i < n; i++) {                                                  \
                CT x = LD(xa[i]), y = LD(ya[i]);                                               \
                o[i] = ST((CT)((BWD) * g));                                                    \
            }                                                                                  \
        } else {                                                                               \
            for (int64_t i = 0; i < n; i++) {                                                  \
                CT g = LD(*(const T *)(p[1] + i * s[1])) * scale;                              \
                CT x = LD(*(const T *)(p[2] + i * s[2])), y = LD(*(const T *)(p[3] + i * s[3])); \
                CT w = c->has_w ? LD(*(const T *)(p[4] + i * s[4])) : (CT)1;                  \
                CT pw = hp ? LD(*(const T *)(p[5] + i * s[5])) : (CT)1;                        \
                (void)w, (void)pw;                                                             \
                *(T *)(p[0] + i * s[0]) = ST((CT)((BWD) * g));                                 \
            }                                                                                  \
        }                                                                                      \
    }

/* smooth_l1: sc_sl1_fwd_* / sc_sl1_bwd_* of plugins/common/scalar_math.h. beta == 0 runs l1's
 * forward loop. */
#define SL1_FWD _Generic((x), float: sc_sl1_fwd_f, default: sc_sl1_fwd_d)(x - y, beta)
#define SL1_BWD _Generic((x), float: sc_sl1_bwd_f, default: sc_sl1_bwd_d)(x - y, beta)
/* bce_with_logits: w ((1 - y) x + lw (log1p(e^-|x|) + max(-x, 0))), lw = 1 + (pw - 1) y (1
 * without pos_weight) — PyTorch's log(e^-m + e^(-x-m)) + m, m = max(-x, 0), with one exp;
 * gradient w ((pw y + 1 - y) sigmoid(x) - pw y), w (sigmoid(x) - y) without pos_weight. */
#define BCE_FWD                                                                                \
    w * ((1 - y) * x + (hp ? 1 + (pw - 1) * y : (CT)1) *                                       \
                           (LOG1P(EXP(-ABS(x))) + (-x > 0 ? -x : (CT)0)))
#define BCE_SIG ((CT)1 / (1 + EXP((CT)-x)))
#define BCE_BWD w * (hp ? (pw * y + 1 - y) * BCE_SIG - pw * y : BCE_SIG - y)

FOR_EACH_FLOAT(DEF_PW, mse, (x - y) * (x - y), (CT)2 * (x - y))
FOR_EACH_FLOAT(DEF_PW, l1, ABS(x - y), (x - y) > 0 ? (CT)1 : (x - y) < 0 ? (CT)-1 : (CT)0)
FOR_EACH_FLOAT(DEF_PW, sl1, SL1_FWD, SL1_BWD)
FOR_EACH_FLOAT(DEF_PW, bce, BCE_FWD, BCE_BWD)

enum { PW_MSE, PW_L1, PW_SL1, PW_BCE, PW_COUNT };
#define PW_TABLE(dir)                                                                          \
    {                                                                                          \
        {[EM_F32] = mse_##dir##_f32, [EM_F64] = mse_##dir##_f64, [EM_F16] = mse_##dir##_f16,   \
         [EM_BF16] = mse_##dir##_bf16},                                                        \
        {[EM_F32] = l1_##dir##_f32, [EM_F64] = l1_##dir##_f64, [EM_F16] = l1_##dir##_f16,      \
         [EM_BF16] = l1_##dir##_bf16},                                                         \
        {[EM_F32] = sl1_##dir##_f32, [EM_F64] = sl1_##dir##_f64, [EM_F16] = sl1_##dir##_f16,   \
         [EM_BF16] = sl1_##dir##_bf16},                                                        \
        {[EM_F32] = bce_##dir##_f32, [EM_F64] = bce_##dir##_f64, [EM_F16] = bce_##dir##_f16,   \
         [EM_BF16] = bce_##dir##_bf16},                                                        \
    }
typedef double (*pw_red_fn)(const pw_ctx *c, const pw_red *r, int64_t lo, int64_t hi);
static const cpu_loop_fn pw_fwd[PW_COUNT][EM_DTYPE_COUNT] = PW_TABLE(fwd);
static const pw_red_fn pw_red_loop[PW_COUNT][EM_DTYPE_COUNT] = PW_TABLE(red);
static const cpu_loop_fn pw_bwd[PW_COUNT][EM_DTYPE_COUNT] = PW_TABLE(bwd);

static void pw_setup(pw_ctx *c, const em_kernel_ctx *k, int kind, int first_in) {
    int64_t red = attr_i(k, 0, RED_MEAN);
    const em_ktensor *x = &k->in[first_in];
    *c = (pw_ctx){.red = red != RED_NONE,
                  .beta = kind == PW_SL1 ? attr_f(k, 1, 1.0) : 0.0,
                  .scale = red == RED_MEAN && x->numel ? 1.0 / (double)x->numel : 1.0,
                  .has_w = kind == PW_BCE && k->in[first_in + 2].numel > 0,
                  .has_pw = kind == PW_BCE && k->in[first_in + 3].numel > 0};
}

/* The sum of a reduced loss over x's elements (operands ts: x, y, w, pw), see pw_red. */
static em_status pw_reduce(const em_kernel_ctx *k, const pw_ctx *c, pw_red_fn fn,
                           const em_ktensor *const *ts, double *sum /* out */) {
    const em_ktensor *x = ts[0];
    pw_red r = {.nd = x->ndim ? x->ndim : 1, .shape = {1}}; /* 0-dim: one element */
    for (int d = 0; d < x->ndim; d++) {
        r.shape[d] = x->shape[d];
        for (int q = 0; q < 4; q++) r.st[q][d] = ts[q]->strides[d];
    }
    for (int q = 0; q < 4; q++) r.p[q] = ts[q]->data;
    r.contig = !c->has_w && !c->has_pw && ts[0]->contiguous && ts[1]->contiguous;
    int64_t n = x->numel;
    if (n < CPU_GRAIN || em_deterministic() || cpu_threads(k) == 1) {
        *sum = fn(c, &r, 0, n); /* no OpenMP region for small work */
        return EM_OK;
    }
    partials p = {0};
    if (partials_init(k, &p, em_op_name(k->op)) != EM_OK) return em_last_status();
    int nt = p.n;
    int64_t per = ((n + nt - 1) / nt + PW_LANES - 1) / PW_LANES * PW_LANES;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int t = 0; t < nt; t++) {
        int64_t lo = t * per, hi = cpu_min_i64(lo + per, n);
        if (lo < hi) p.v[8 * t] = fn(c, &r, lo, hi);
    }
    *sum = partials_sum(&p);
    return EM_OK;
}

static em_status pw_forward(const em_kernel_ctx *k, int kind) {
    const em_ktensor *x = &k->in[0], *o = &k->out[0];
    pw_ctx c;
    pw_setup(&c, k, kind, 0);
    int loop = kind == PW_SL1 && c.beta == 0 ? PW_L1 : kind;
    if (c.red) {
        const em_ktensor *ts[4] = {x, &k->in[1], c.has_w ? &k->in[2] : x,
                                   c.has_pw ? &k->in[3] : x};
        double s = 0;
        if (x->numel && pw_reduce(k, &c, pw_red_loop[loop][x->dtype], ts, &s) != EM_OK)
            return em_last_status();
        int64_t red = attr_i(k, 0, RED_MEAN);
        store_scalar(o, red == RED_MEAN ? (x->numel ? s / (double)x->numel : NAN) : s);
        return EM_OK;
    }
    const em_ktensor *ts[5] = {o, x, &k->in[1], c.has_w ? &k->in[2] : x,
                               c.has_pw ? &k->in[3] : x};
    cpu_foreach(k, 5, ts, pw_fwd[loop][x->dtype], &c, CPU_GRAIN);
    return EM_OK;
}

static em_status pw_backward(const em_kernel_ctx *k, int kind) {
    const em_ktensor *g = &k->in[0], *x = &k->in[1];
    pw_ctx c;
    pw_setup(&c, k, kind, 1);
    em_ktensor ge = *g; /* a reduced loss's grad, broadcast over x */
    if (c.red) {
        ge.ndim = x->ndim;
        ge.numel = x->numel;
        ge.contiguous = false;
        for (int d = 0; d < x->ndim; d++) ge.shape[d] = x->shape[d], ge.strides[d] = 0;
    }
    const em_ktensor *ts[6] = {&k->out[0], &ge, x, &k->in[2], c.has_w ? &k->in[3] : x,
                               c.has_pw ? &k->in[4] : x};
    cpu_foreach(k, 6, ts, pw_bwd[kind][x->dtype], &c, CPU_GRAIN);
    return EM_OK;
}

static em_status k_mse(const em_kernel_ctx *k) { return pw_forward(k, PW_MSE); }
static em_status k_l1(const em_kernel_ctx *k) { return pw_forward(k, PW_L1); }
static em_status k_sl1(const em_kernel_ctx *k) { return pw_forward(k, PW_SL1); }
static em_status k_bce(const em_kernel_ctx *k) { return pw_forward(k, PW_BCE); }
static em_status k_mse_bwd(const em_kernel_ctx *k) { return pw_backward(k, PW_MSE); }
static em_status k_l1_bwd(const em_kernel_ctx *k) { return pw_backward(k, PW_L1); }
static em_status k_sl1_bwd(const em_kernel_ctx *k) { return pw_backward(k, PW_SL1); }
static em_status k_bce_bwd(const em_kernel_ctx *k) { return pw_backward(k, PW_BCE); }

/* ---- registration --------------------------------------------------------------------------------- */

em_status cpu_register_loss(em_registry *r) {
    static const em_dtype flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    em_status st = EM_OK;
#define REG(op, fn) if (st == EM_OK) st = cpu_register_kernels(r, op, flt, 4, fn, "cpu_" op)
    REG("cross_entropy", k_ce);
    REG("cross_entropy_backward", k_ce_bwd);
    REG("nll_loss", k_nll);
    REG("nll_loss_backward", k_nll_bwd);
    REG("mse_loss", k_mse);
    REG("mse_loss_backward", k_mse_bwd);
    REG("l1_loss", k_l1);
    REG("l1_loss_backward", k_l1_bwd);
    REG("smooth_l1_loss", k_sl1);
    REG("smooth_l1_loss_backward", k_sl1_bwd);
    REG("binary_cross_entropy_with_logits", k_bce);
    REG("binary_cross_entropy_with_logits_backward", k_bce_bwd);
#undef REG
    return st;
}
