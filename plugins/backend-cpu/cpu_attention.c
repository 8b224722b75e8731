/*
 * cpu_attention.c — CPU kernels of scaled_dot_product_attention and its backward (contracts
 * in core/ops_attention.c), f32 and f64; f16/bf16 calls take the core's f32 path.
 *
 * Both directions work on row blocks of g->br query rows (64, fewer when the key count is so
 * large that a block's scores would pass 2^20 values) and hand the products to OpenBLAS, one
 * GEMM per product on the calling thread (cpu_blas_one_thread; the parallelism is ours):
 *
 * Forward, over (batch, row block) pairs split across threads: the block's scores against
 * every key it sees, S = scale q k^T (nr, S) — one row block of the score matrix, the most a
 * thread holds; the full (L, S) matrix never exists —, the mask, each row's softmax (maximum,
 * exp through libmvec's vector exp, sum), dropout on the normalised probabilities (kept ones
 * times 1 / (1 - p), the row sums taken before: dropout's input), out = P v (one GEMM) and
 * logsumexp. Causal calls stop each row block at its last row's key; masked scores are -inf
 * (exp gives 0 exactly); a row whose keys are all masked gets a zero output and a logsumexp
 * of -inf. The keep decisions come from the Philox stream (at_keep_row).
 *
 * Backward, over batch entries split across threads, each walking its row blocks in order:
 * P = exp(S - lse) recomputed, dP = gy v^T (dropout-masked), D_i = sum_j p_ij dp_ij (which is
 * gy_i . out_i), dS = scale P (dP - D), then gq = dS k for the block and gk += dS^T q,
 * gv += Pd^T gy over the blocks. One thread owns a batch entry's key and value gradients, so
 * no atomics are needed and every sum has one order: the same bits for any thread count
 * (tests/test_ops_seq.c checks 1 and 3 threads). With fewer batch entries than threads the
 * backward uses fewer threads.
 */
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/random.h"
#include "cpu.h"

#include <cblas.h>

#if defined(__x86_64__) && defined(__GLIBC__) && defined(_OPENMP) && !defined(__clang__) &&   \
    !defined(__FAST_MATH__)
#if __GLIBC_PREREQ(2, 35)
/* libmvec's vector exponentials (as cpu_math.c declares them: the scalar functions'
 * semantics, within a few ulp), so that the softmax rows' `omp simd` loops vectorise. */
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
double exp(double);
#endif
#endif

#define AT_BR 128           /* query rows per block ... */
#define AT_BLOCK_MAX (1 << 20) /* ... fewer when a block's scores would pass this many */
#define EM_CPU_AT_MIN(a, b) ((a) < (b) ? (a) : (b))
/* The loops' helpers are inlined into each SIMD clone of the per-tile functions (a helper
 * left out of line would be built for the baseline target only). */
#define AT_INLINE inline __attribute__((always_inline))

enum { AT_MASK_NONE, AT_MASK_BOOL, AT_MASK_FLOAT };

/* A call's geometry: q (B, L, E), k (B, S, E), v (B, S, Ev) flattened over the batch dims;
 * the mask's element (b, i, j) at mask_offset(b) + i msl + j mss. */
typedef struct at_geom {
    int64_t B, L, S, E, Ev;
    int64_t br;                        /* query rows per block */
    int nb;                            /* batch dims */
    int64_t bshape[EM_MAX_DIMS];       /* their sizes */
    int64_t mstride[EM_MAX_DIMS];      /* the mask's stride per batch dim (0: broadcast) */
    int64_t msl, mss;
    int mkind;
    const void *mask;
    bool causal, dropping;
    double scale, keep_p, rinv;        /* keep probability 1 - p, 1 / (1 - p) (0 when p = 1) */
    uint64_t seed, offset;
} at_geom;

static inline int64_t at_mask_offset(const at_geom *g, int64_t b) {
    if (g->mkind == AT_MASK_NONE) return 0;
    int64_t off = 0;
    for (int d = g->nb - 1; d >= 0; d--) {
        off += b % g->bshape[d] * g->mstride[d];
        b /= g->bshape[d];
    }
    return off;
}

/* keep[j] for j < n: dropout's decisions for scores (b, i, 0 .. n): keep (b, i, j) when
 * em_philox_uniform_f32(seed, offset, (b L + i) S + j) < 1 - p (the bernoulli stream), one
 * Philox block per 4 stream elements. u = (w >> 8) 2^-24 is exact, so u < keep_p is
 * (w >> 8) < ceil(keep_p 2^24). */
static void at_keep_row(const at_geom *g, int64_t b, int64_t i, int64_t n, uint8_t *keep) {
    uint64_t idx = ((uint64_t)b * (uint64_t)g->L + (uint64_t)i) * (uint64_t)g->S;
    cpu_philox_keep(g->seed, g->offset, idx, n, cpu_philox_threshold(g->keep_p), keep);
}

/* The geometry from q, k, v at in[iq..iq+2] and the mask at in[im]. */
static at_geom at_geom_of(const em_kernel_ctx *k, int iq, int im) {
    const em_ktensor *q = &k->in[iq], *kk = &k->in[iq + 1], *v = &k->in[iq + 2],
                     *mk = &k->in[im];
    int nd = q->ndim;
    at_geom g = {.L = q->shape[nd - 2], .E = q->shape[nd - 1], .S = kk->shape[nd - 2],
                 .Ev = v->shape[nd - 1], .nb = nd - 2, .B = 1};
    for (int d = 0; d < nd - 2; d++) g.bshape[d] = q->shape[d], g.B *= q->shape[d];
    g.br = AT_BR;
    while (g.br > 1 && g.br * g.S > AT_BLOCK_MAX) g.br /= 2;
    bool none = mk->ndim == 1 && mk->numel == 0;
    g.mkind = none ? AT_MASK_NONE : mk->dtype == EM_BOOL ? AT_MASK_BOOL : AT_MASK_FLOAT;
    g.mask = mk->data;
    if (!none) {
        /* Contiguous strides of the mask's own shape, 0 on its broadcast (size-1) dims. */
        int64_t st = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t s = mk->shape[d] == 1 ? 0 : st;
            if (d == nd - 1) g.mss = s;
            else if (d == nd - 2) g.msl = s;
            else g.mstride[d] = s;
            st *= mk->shape[d];
        }
    }
    const em_attr *a = k->attrs; /* dropout_p, is_causal, scale, seed, offset */
    double p = a[0].v.f;
    g.causal = a[1].v.b;
    /* causal: half the blocks, each stopping at its last row's key, skip more of the scores */
    if (g.causal && g.br > 32) g.br /= 2;
    g.scale = a[2].v.f;
    g.seed = 0, g.offset = 0; /* at_origin */
    g.dropping = p > 0;
    g.keep_p = 1 - p;
    g.rinv = p < 1 ? 1 / (1 - p) : 0;
    return g;
}

/* Threads for a call: one when the work (pairs of rows and keys times the dims) is small. */
static int at_threads(const em_kernel_ctx *k, const at_geom *g) {
    int nt = cpu_threads(k);
    double work = (double)g->B * (double)g->L * (double)g->S * (double)(g->E + g->Ev);
    return nt > 1 && work >= CPU_GRAIN ? nt : 1;
}

typedef void (*at_task_fn)(void *ctx, int64_t t);

/* fn(ctx, t) for t in [0, n) on nt threads (dynamic: causal blocks differ in work). */
static void at_run(int nt, int64_t n, at_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (nt <= 1 || n == 1) {
        for (int64_t t = 0; t < n; t++) fn(ctx, t);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t t = 0; t < n; t++) fn(ctx, t);
}

static em_status at_thread_error(const em_kernel_ctx *k) {
    return em_set_error(EM_ERR_INVALID, "%s: the thread count changed during the call",
                        em_op_name(k->op));
}

#define T float
#define S(name) name##_f32
#define S_STATS float
#define EXP expf
#define GEMM cblas_sgemm
#include "cpu_attention_loops.h"
#undef T
#undef S
#undef S_STATS
#undef EXP
#undef GEMM

#define T double
#define S(name) name##_f64
#define S_STATS double
#define EXP exp
#define GEMM cblas_dgemm
#include "cpu_attention_loops.h"
#undef T
#undef S
#undef S_STATS
#undef EXP
#undef GEMM

/* The dropout stream's origin: the attributes', or a graph capture's (no seed). */
static em_status at_origin(const em_kernel_ctx *k, at_geom *g) {
    return g->dropping ? cpu_rng_origin(k, 3, &g->seed, &g->offset) : EM_OK;
}

static em_status k_sdpa(const em_kernel_ctx *k) {
    em_status st = cpu_check_dense(k);
    if (st != EM_OK) return st;
    at_geom g = at_geom_of(k, 0, 3);
    if ((st = at_origin(k, &g)) != EM_OK) return st;
    return k->out[0].dtype == EM_F64 ? at_forward_f64(k, &g) : at_forward_f32(k, &g);
}

static em_status k_sdpa_bwd(const em_kernel_ctx *k) {
    em_status st = cpu_check_dense(k);
    if (st != EM_OK) return st;
    at_geom g = at_geom_of(k, 1, 4);
    if ((st = at_origin(k, &g)) != EM_OK) return st;
    return k->out[0].dtype == EM_F64 ? at_backward_f64(k, &g) : at_backward_f32(k, &g);
}

em_status cpu_register_attention(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64};
    em_status st = cpu_register_kernels(r, "scaled_dot_product_attention", dts, 2, k_sdpa,
                                        "cpu_sdpa_fused");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "scaled_dot_product_attention_backward", dts, 2,
                                  k_sdpa_bwd, "cpu_sdpa_backward_fused");
    return st;
}
