/*
 * cpu_rnn.c — CPU kernels of the fused lstm and gru ops and their backwards (contracts in
 * core/ops_rnn.c), f32 and f64; f16/bf16 calls take the core's f32 path.
 *
 * The cuDNN-style layout of the work: forward, one GEMM projects the input of every step at
 * once (x (T N, I) times W_ih^T; the LSTM into a dense buffer, the GRU into the gate columns
 * of the workspace through cpu_gemm); then each step computes its hidden product h (N, H)
 * W_hh^T with one GEMM and runs the gate nonlinearities and the state update in one pass per
 * batch row (the cells, which add the parts of the pre-activations; AVX-512 or AVX2 with
 * libmvec's vector exp/tanh for f32, cpu_rnn_simd.c). oneDNN runs its fast brgemm kernels
 * only on dense destinations, hence the LSTM's dense buffers.
 * Backward walks the steps the other way: the cell gives the pre-activation gradients of the
 * step, and one GEMM dG W_hh carries the gradient to the previous hidden state; the weight
 * and input gradients are single GEMMs over all steps, composed by the core's derivative.
 * For f32 with oneDNN the per-step product runs on W_hh packed once per call (rnn_mm: a
 * matmul on its blocked weights, or a 1x1 convolution where the matmul has only its gemm, as
 * below AVX-512); otherwise it is OpenBLAS's. Untaken steps (t >= lengths[b]) leave their rows of the state
 * alone, and write zeros.
 * The f32 LSTM on AVX-512 runs its steps (forward and backward) in one parallel region
 * instead, each thread owning a fixed share of the hidden units, with its own one-thread
 * product (cpu_rnn_mm_f32 on its columns of W_hh packed for it) and its cells, and one
 * barrier a step (lstm_fwd_par and lstm_bwd_par in cpu_rnn_loops.h, rnn_bar_wait below):
 * a fork-join of the OpenMP worker for every step's product and cells was a futex wake-up
 * each, 256 a train_lstm_h256 training step.
 */
#include "config.h" /* EM_HAVE_LIBMVEC */

#include <cblas.h>
#ifdef EM_HAVE_DNNL
#include <dnnl.h>
#endif
#include <math.h>
#include <stdatomic.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu.h"

typedef struct rnn_geom {
    int64_t L, N, Ki, H; /* steps, batch, input size, hidden size */
    const int64_t *len; /* (N) or NULL */
    bool reverse;
} rnn_geom;

/* Threads for a step's elementwise part of `work` element operations. */
static int rnn_threads(const em_kernel_ctx *k, int64_t work) {
    int nt = cpu_threads(k);
    return nt > 1 && work >= CPU_GRAIN ? nt : 1;
}

/* The geometry from the sequence operand (x or a gradient, (T, N, *)), the weight (G H,
 * I + H) and the lengths operand; lengths outside [0, T] are an error naming the entry. */
static em_status rnn_geom_of(const em_kernel_ctx *k, int iseq, int iw, int ilen, int64_t H,
                             rnn_geom *g) {
    const em_ktensor *seq = &k->in[iseq], *w = &k->in[iw], *len = &k->in[ilen];
    g->L = seq->shape[0], g->N = seq->shape[1], g->H = H, g->Ki = w->shape[1] - H;
    g->len = len->numel ? (const int64_t *)len->data : NULL;
    g->reverse = k->attrs[0].v.b;
    for (int64_t b = 0; g->len && b < g->N; b++)
        if (g->len[b] < 0 || g->len[b] > g->L)
            return em_set_error(EM_ERR_INVALID, "%s: lengths[%lld] is %lld; expected 0 to the "
                                "sequence length %lld", em_op_name(k->op), (long long)b,
                                (long long)g->len[b], (long long)g->L);
    return EM_OK;
}

/* A 2-D kernel view of a matrix (r, c) with element strides rs, cs (for cpu_gemm). */
static em_ktensor rnn_kt2(void *data, em_dtype dt, int64_t r, int64_t c, int64_t rs, int64_t cs) {
    em_ktensor t;
    memset(&t, 0, sizeof t);
    t.data = data, t.dtype = dt, t.ndim = 2, t.numel = r * c;
    t.shape[0] = r, t.shape[1] = c, t.strides[0] = rs, t.strides[1] = cs;
    t.contiguous = rs == c && cs == 1;
    return t;
}

/* ---- the recurrent product on prepacked weights (f32, oneDNN) ------------------------------ */

/* c (M, Nc; row stride ldc) = a (M, K; dense) b (or += with accumulate) for a b (K, Nc) that
 * stays the same over all
 * the steps of a call (W_hh^T forward, W_hh backward): reordered once per call into oneDNN's
 * blocked weights layout (the matmul primitive's choice, format "any"), then one matmul per
 * step on it. OpenBLAS packed b again at every step (the per-step product is only M = batch
 * rows, so the packing of the K x Nc weights was a third of its time). Without oneDNN, or when
 * oneDNN has no fast kernel for the shape, the steps call OpenBLAS as before. */
typedef struct rnn_mm {
#ifdef EM_HAVE_DNNL
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst;
    dnnl_stream_t stream;
    cpu_ctx *ctx;
    int nt, prev_nt;
#endif
    bool ready;
} rnn_mm;

#ifdef EM_HAVE_DNNL
static void rnn_mm_free(rnn_mm *r) {
    if (r->prim) dnnl_primitive_destroy(r->prim);
    if (r->src) dnnl_memory_destroy(r->src);
    if (r->wei) dnnl_memory_destroy(r->wei);
    if (r->dst) dnnl_memory_destroy(r->dst);
    if (r->stream) cpu_dnnl_stream_put(r->ctx, r->stream);
    if (r->nt != r->prev_nt) omp_set_num_threads(r->prev_nt);
    memset(r, 0, sizeof *r);
}

/* The product as a 1x1 convolution: one image of M pixels (a: (1, K, 1, M) channels-last, row
 * stride K), weights (Nc, K, 1, 1) (b's element (k, n) is weight (n, k)), c: (1, Nc, 1, M)
 * channels-last (row stride ldc); the sum post-op in *attr accumulates. Returns the primitive
 * descriptor when oneDNN has a JIT kernel for it that takes a and c as they are, else NULL. */
static dnnl_primitive_desc_t rnn_conv_pd(dnnl_engine_t eng, int64_t M, int64_t K, int64_t Nc,
                                         int64_t ldc, const_dnnl_primitive_attr_t attr) {
    dnnl_memory_desc_t smd, wany, dmd;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_memory_desc_init_by_strides(&smd, 4, (dnnl_dims_t){1, K, 1, M}, dnnl_f32,
                                         (dnnl_dims_t){M * K, 1, M * K, K}) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&wany, 4, (dnnl_dims_t){Nc, K, 1, 1}, dnnl_f32,
                                     dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_strides(&dmd, 4, (dnnl_dims_t){1, Nc, 1, M}, dnnl_f32,
                                         (dnnl_dims_t){M * ldc, 1, M * ldc, ldc}) != dnnl_success ||
        dnnl_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct,
                                           &smd, &wany, NULL, &dmd, (dnnl_dims_t){1, 1},
                                           (dnnl_dims_t){0, 0}, (dnnl_dims_t){0, 0}) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, attr, eng, NULL) != dnnl_success)
        return NULL;
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    const dnnl_memory_desc_t *s = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0),
                             *d = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    if (!impl || strncmp(impl, "jit", 3) != 0 || !s || !d || !dnnl_memory_desc_equal(s, &smd) ||
        !dnnl_memory_desc_equal(d, &dmd)) {
        dnnl_primitive_desc_destroy(pd);
        return NULL;
    }
    return pd;
}

/* b is given by its strides (bs0 along K, bs1 along Nc). false: no oneDNN path (r is clean).
 * oneDNN's brgemm kernels want c dense (ldc == Nc); a strided c gets its slower gemm.
 * Where the matmul has only its gemm (gemm:jit: oneDNN 2.6.3 below AVX-512), whose weights
 * stay plain and are packed again at every call, the product runs as a 1x1 convolution
 * instead (rnn_conv_pd: jit_1x1:avx2 on its blocked weights, reordered here once). Measured
 * on an AVX2-only EPYC, one thread, CPU time per call: the LSTM's step product 32 x 1024 x
 * 256 0.44 ms against the matmul's 0.84-0.94, its backward 32 x 256 x 1024 0.45 against 0.49,
 * the input projection 2048 x 1024 x 256 29.0-29.6 against 30.1-32.9. */
static bool rnn_mm_init(rnn_mm *r, const em_kernel_ctx *k, int64_t M, int64_t K, int64_t Nc,
                        const float *b, int64_t bs0, int64_t bs1, int64_t ldc, bool accumulate) {
    memset(r, 0, sizeof *r);
    dnnl_engine_t eng = cpu_dnnl_engine();
    if (!eng || M <= 0 || K <= 0 || Nc <= 0) return false;
    r->ctx = cpu_ctx_of(k);
    r->nt = cpu_threads(k), r->prev_nt = omp_get_max_threads();
    if (r->nt != r->prev_nt) omp_set_num_threads(r->nt); /* oneDNN's kernels pick it up here */
    dnnl_memory_desc_t smd, wany, wplain, dmd;
    dnnl_matmul_desc_t mmd;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL, rpd = NULL;
    dnnl_primitive_t reorder = NULL;
    dnnl_memory_t plain = NULL;
    const char *impl = NULL;
    bool ok = dnnl_memory_desc_init_by_strides(&smd, 2, (dnnl_dims_t){M, K}, dnnl_f32,
                                               (dnnl_dims_t){K, 1}) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&wany, 2, (dnnl_dims_t){K, Nc}, dnnl_f32,
                                           dnnl_format_tag_any) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&wplain, 2, (dnnl_dims_t){K, Nc}, dnnl_f32,
                                               (dnnl_dims_t){bs0, bs1}) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&dmd, 2, (dnnl_dims_t){M, Nc}, dnnl_f32,
                                               (dnnl_dims_t){ldc, 1}) == dnnl_success &&
              dnnl_matmul_desc_init(&mmd, &smd, &wany, NULL, &dmd) == dnnl_success &&
              dnnl_primitive_attr_create(&attr) == dnnl_success &&
              (!accumulate || (dnnl_post_ops_create(&po) == dnnl_success &&
                               dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
                               dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success)) &&
              dnnl_primitive_desc_create(&pd, &mmd, attr, eng, NULL) == dnnl_success;
    if (ok) dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    ok = ok && impl && strncmp(impl, "ref", 3) != 0; /* a reference kernel: OpenBLAS instead */
    const dnnl_memory_desc_t *wmd = NULL, *amd = &smd, *cmd = &dmd;
    if (ok && strncmp(impl, "gemm", 4) == 0) {
        dnnl_primitive_desc_t cpd = rnn_conv_pd(eng, M, K, Nc, ldc, attr);
        if (cpd) {
            dnnl_primitive_desc_destroy(pd);
            pd = cpd;
            /* the convolution's weights (Nc, K, 1, 1): b's element (k, n) is weight (n, k) */
            ok = dnnl_memory_desc_init_by_strides(&wplain, 4, (dnnl_dims_t){Nc, K, 1, 1},
                                                  dnnl_f32, (dnnl_dims_t){bs1, bs0, 1, 1}) ==
                 dnnl_success;
            amd = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
            cmd = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
        }
    }
    wmd = ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0) : NULL;
    ok = ok && wmd && dnnl_primitive_create(&r->prim, pd) == dnnl_success &&
         dnnl_memory_create(&r->wei, wmd, eng, DNNL_MEMORY_ALLOCATE) == dnnl_success &&
         dnnl_memory_create(&r->src, amd, eng, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&r->dst, cmd, eng, DNNL_MEMORY_NONE) == dnnl_success &&
         dnnl_memory_create(&plain, &wplain, eng, (void *)b) == dnnl_success &&
         dnnl_reorder_primitive_desc_create(&rpd, &wplain, eng, wmd, eng, NULL) == dnnl_success &&
         dnnl_primitive_create(&reorder, rpd) == dnnl_success &&
         (r->stream = cpu_dnnl_stream_take(r->ctx)) != NULL;
    if (ok) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, r->wei}};
        ok = dnnl_primitive_execute(reorder, r->stream, 2, args) == dnnl_success &&
             dnnl_stream_wait(r->stream) == dnnl_success;
    }
    if (reorder) dnnl_primitive_destroy(reorder);
    if (rpd) dnnl_primitive_desc_destroy(rpd);
    if (plain) dnnl_memory_destroy(plain);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok) {
        rnn_mm_free(r);
        return false;
    }
    r->ready = true;
    return true;
}

/* One step: c = a b (+= when made with accumulate). false: oneDNN failed (nothing was written: the caller runs OpenBLAS). */
static bool rnn_mm_run(rnn_mm *r, const float *a, float *c) {
    if (dnnl_memory_set_data_handle(r->src, (void *)a) != dnnl_success ||
        dnnl_memory_set_data_handle(r->dst, c) != dnnl_success)
        return false;
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, r->src}, {DNNL_ARG_WEIGHTS, r->wei},
                               {DNNL_ARG_DST, r->dst}};
    return dnnl_primitive_execute(r->prim, r->stream, 3, args) == dnnl_success &&
           dnnl_stream_wait(r->stream) == dnnl_success;
}
#define RNN_MM_F32 1
#else
#define RNN_MM_F32 0
#endif

/* ---- the barrier of the parallel time loop (f32, AVX-512) ---------------------------------
 *
 * One per step among the threads of one parallel region. libgomp's barrier under the passive
 * wait policy (em_init's default) puts an early thread to sleep at once, and waking it costs
 * a vCPU's halt and wake-up (50-70 us on the Zen 4 VM) where the work between two barriers
 * is about 0.1 ms a thread. So a waiter spins, bounded, then sleeps on a condition variable;
 * the last thread in wakes the sleepers: never spins for good, works under any wait policy.
 * The bound adapts per thread (*spin pauses of about 25 ns): halved each time the spin ran
 * out (the other thread was descheduled: on a loaded machine spinning only burns the CPU it
 * waits for), doubled each time it did not, between RNN_SPIN_MIN and RNN_SPIN_MAX. */
#if CPU_RNN_SIMD
#include <immintrin.h>
#include <pthread.h>

#define RNN_SPIN_MIN 32
#define RNN_SPIN_MAX 4096

typedef struct rnn_bar {
    _Atomic int in;        /* threads arrived in this generation */
    _Atomic unsigned gen;  /* generation: bumped by the last one in */
    _Atomic int sleepers;  /* threads on the condition variable */
    pthread_mutex_t lock;
    pthread_cond_t cond;
} rnn_bar;

static void rnn_bar_init(rnn_bar *b) {
    atomic_init(&b->in, 0), atomic_init(&b->gen, 0), atomic_init(&b->sleepers, 0);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
}

static void rnn_bar_destroy(rnn_bar *b) {
    pthread_cond_destroy(&b->cond);
    pthread_mutex_destroy(&b->lock);
}

/* Every one of the n threads calls it once per generation; *spin is the caller's bound (start
 * it at RNN_SPIN_MAX). */
static void rnn_bar_wait(rnn_bar *b, int n, int *spin) {
    if (n <= 1) return;
    unsigned g = atomic_load(&b->gen);
    if (atomic_fetch_add(&b->in, 1) == n - 1) {
        atomic_store(&b->in, 0);
        pthread_mutex_lock(&b->lock);
        atomic_store(&b->gen, g + 1);
        if (atomic_load(&b->sleepers)) pthread_cond_broadcast(&b->cond);
        pthread_mutex_unlock(&b->lock);
        return;
    }
    for (int i = 0; i < *spin; i++) {
        if (atomic_load_explicit(&b->gen, memory_order_acquire) != g) {
            if (*spin < RNN_SPIN_MAX) *spin *= 2;
            return;
        }
        _mm_pause();
    }
    if (*spin > RNN_SPIN_MIN) *spin /= 2;
    pthread_mutex_lock(&b->lock);
    atomic_fetch_add(&b->sleepers, 1);
    while (atomic_load(&b->gen) == g) pthread_cond_wait(&b->cond, &b->lock);
    atomic_fetch_sub(&b->sleepers, 1);
    pthread_mutex_unlock(&b->lock);
}

/* Whether the LSTM's steps take the parallel time loop (cpu_rnn_loops.h): AVX-512 here. */
static bool rnn_par_ok(void) { return cpu_rnn_panel_width() == 16; }
/* A step's product of at least this many multiply-adds (N G H H) runs on the kernel's
 * threads. */
#define RNN_PAR_GRAIN (1 << 20)
#endif

#define T float
#define S(name) name##_f32
#define GEMM cblas_sgemm
#define EXP expf
#define TANH tanhf
#define SIMD_CELLS CPU_RNN_SIMD
#define PACKED_MM RNN_MM_F32
#include "cpu_rnn_loops.h"
#undef T
#undef S
#undef GEMM
#undef EXP
#undef TANH
#undef SIMD_CELLS
#undef PACKED_MM

#define T double
#define S(name) name##_f64
#define GEMM cblas_dgemm
#define EXP exp
#define TANH tanh
#define SIMD_CELLS 0
#define PACKED_MM 0
#include "cpu_rnn_loops.h"
#undef T
#undef S
#undef GEMM
#undef EXP
#undef TANH
#undef SIMD_CELLS
#undef PACKED_MM

static bool f64(const em_kernel_ctx *k) { return k->out[0].dtype == EM_F64; }

static em_status k_lstm(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cpu_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 0, 3, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return f64(k) ? lstm_fwd_f64(k, &g) : lstm_fwd_f32(k, &g);
}

static em_status k_lstm_bwd(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cpu_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 4, 3, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return f64(k) ? lstm_bwd_f64(k, &g) : lstm_bwd_f32(k, &g);
}

static em_status k_gru(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cpu_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 0, 2, 5, k->out[1].shape[1], &g);
    if (st != EM_OK) return st;
    return f64(k) ? gru_fwd_f64(k, &g) : gru_fwd_f32(k, &g);
}

static em_status k_gru_bwd(const em_kernel_ctx *k) {
    rnn_geom g;
    em_status st = cpu_check_dense(k);
    if (st == EM_OK) st = rnn_geom_of(k, 3, 2, 4, k->out[2].shape[1], &g);
    if (st != EM_OK) return st;
    return f64(k) ? gru_bwd_f64(k, &g) : gru_bwd_f32(k, &g);
}

em_status cpu_register_rnn(em_registry *r) {
    static const em_dtype dts[] = {EM_F32, EM_F64};
    em_status st = cpu_register_kernels(r, "lstm", dts, 2, k_lstm, "cpu_lstm_gemm");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "lstm_backward", dts, 2, k_lstm_bwd, "cpu_lstm_backward_gemm");
    if (st == EM_OK) st = cpu_register_kernels(r, "gru", dts, 2, k_gru, "cpu_gru_gemm");
    if (st == EM_OK)
        st = cpu_register_kernels(r, "gru_backward", dts, 2, k_gru_bwd, "cpu_gru_backward_gemm");
    return st;
}
