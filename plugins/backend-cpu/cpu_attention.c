/*
 * cpu_attention.c — CPU kernels of scaled_dot_product_attention and its backward (contracts
 * in core/ops_attention.c), f32 and f64; f16/bf16 calls take the core's f32 path.
 *
 * Forward (FlashAttention's scheme on a CPU): the (batch, block of AT_BR query rows) pairs
 * are split across threads; each walks the keys in blocks of AT_BC, computing one
 * AT_BR x AT_BC tile of scores at a time (the query rows times the key block, transposed so
 * that the products run along contiguous keys), and keeps for every row its running maximum
 * m, running sum l of exp(s - m) and the running output (rescaled by exp(m_old - m) when the
 * maximum grows). The full (L, S) score matrix never exists: each thread holds one tile, its
 * rows' outputs and two numbers a row. Causal calls stop each row block at its last row's
 * key, and masked scores are -inf (exp gives 0 exactly); a row whose keys are all masked
 * keeps l = 0 and gets a zero output and a logsumexp of -inf. Dropout multiplies each kept
 * probability by 1 / (1 - p) after it entered the row sum (the row sums are dropout's
 * input), the keep decision recomputed from the Philox stream wherever it is needed.
 *
 * Backward, from logsumexp (p_ij = exp(s_ij - lse_i), recomputed) in two passes that need no
 * atomics and so give the same bits for any thread count: A, over (batch, query block): the
 * block's p and dropout-masked dp = gy . v against every key (one row block of each, the
 * most a thread holds), D_i = sum_j p_ij dp_ij (which is gy_i . out_i) and gq_i; B, over
 * (batch, key block): gk_j and gv_j from one tile at a time of the query blocks that see
 * the keys. Each pass recomputes the scores it needs.
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

#define AT_BR 32 /* query rows per block */
#define AT_BC 64 /* keys per block */
#define EM_CPU_AT_MIN(a, b) ((a) < (b) ? (a) : (b))
/* The loops' helpers are inlined into each SIMD clone of the per-tile functions (a helper
 * left out of line would be built for the baseline target only). */
#define AT_INLINE inline __attribute__((always_inline))

enum { AT_MASK_NONE, AT_MASK_BOOL, AT_MASK_FLOAT };

/* A call's geometry: q (B, L, E), k (B, S, E), v (B, S, Ev) flattened over the batch dims;
 * the mask's element (b, i, j) at mask_offset(b) + i msl + j mss. */
typedef struct at_geom {
    int64_t B, L, S, E, Ev;
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

/* The last Philox block drawn (4 stream elements): the loops walk j upwards, so one block
 * serves 4 decisions. */
typedef struct at_rng {
    uint64_t block; /* UINT64_MAX: none yet */
    uint32_t w[4];
} at_rng;
#define AT_RNG_INIT {.block = UINT64_MAX}

/* Dropout's decision for score (b, i, j): the bernoulli(1 - p) stream element (b L + i) S + j,
 * as em_philox_uniform_f32 (ember/random.h) gives it. */
static inline bool at_keep(const at_geom *g, at_rng *r, int64_t b, int64_t i, int64_t j) {
    uint64_t idx = ((uint64_t)b * (uint64_t)g->L + (uint64_t)i) * (uint64_t)g->S + (uint64_t)j;
    if (idx / 4 != r->block) {
        r->block = idx / 4;
        em_philox_block(g->seed, g->offset + r->block, r->w);
    }
    return (double)((float)(r->w[idx % 4] >> 8) * 5.9604644775390625e-08f) < g->keep_p;
}

/* The geometry from q, k, v at in[iq..iq+2] and the mask at in[im]. */
static at_geom at_geom_of(const em_kernel_ctx *k, int iq, int im) {
    const em_ktensor *q = &k->in[iq], *kk = &k->in[iq + 1], *v = &k->in[iq + 2],
                     *mk = &k->in[im];
    int nd = q->ndim;
    at_geom g = {.L = q->shape[nd - 2], .E = q->shape[nd - 1], .S = kk->shape[nd - 2],
                 .Ev = v->shape[nd - 1], .nb = nd - 2, .B = 1};
    for (int d = 0; d < nd - 2; d++) g.bshape[d] = q->shape[d], g.B *= q->shape[d];
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
    g.scale = a[2].v.f;
    g.seed = (uint64_t)a[3].v.i, g.offset = (uint64_t)a[4].v.i;
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
#include "cpu_attention_loops.h"
#undef T
#undef S
#undef S_STATS
#undef EXP

#define T double
#define S(name) name##_f64
#define S_STATS double
#define EXP exp
#include "cpu_attention_loops.h"
#undef T
#undef S
#undef S_STATS
#undef EXP

static em_status k_sdpa(const em_kernel_ctx *k) {
    em_status st = cpu_check_dense(k);
    if (st != EM_OK) return st;
    at_geom g = at_geom_of(k, 0, 3);
    return k->out[0].dtype == EM_F64 ? at_forward_f64(k, &g) : at_forward_f32(k, &g);
}

static em_status k_sdpa_bwd(const em_kernel_ctx *k) {
    em_status st = cpu_check_dense(k);
    if (st != EM_OK) return st;
    at_geom g = at_geom_of(k, 1, 4);
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
