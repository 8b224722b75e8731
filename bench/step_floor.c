/*
 * step_floor.c — each training step's floor (issue 27): the sum of the step's GEMMs (and, for
 * the CNN, its convolution primitives: forward, backward-data, backward-weights), each timed
 * alone, straight into the libraries (oneDNN, OpenBLAS — no Ember), at the best library choice
 * for its shape. bench/compare-pytorch.py runs it in the same run as the steps and reports each
 * step's median over its floor.
 *
 *   bench/step_floor [--cpu-time] [--cold] [workload...]   default: every workload below;
 *                                                          --list names them
 *
 * --cpu-time times each call in CPU time of the whole process (CLOCK_PROCESS_CPUTIME_ID, every
 * thread's) instead of wall time: on a machine shared with other jobs, what a call costs
 * rather than how long it waited for a core (set beside bench/train_step --calls's CPU
 * column).
 *
 * --cold writes over a 64 MiB buffer before every call, timed or not (the writing is not
 * timed), so each call starts with its operands out of the caches, as in a training step,
 * where the ops between two calls of a convolution stream far more than the last-level
 * cache holds; without it the same buffers are called back to back and a 6.4 MB output
 * (the CNN's conv1) stays in the cache. The step's calls compare with the cold figures
 * (bench/README.md, "conv1's primitive").
 *
 * Workloads are bench/train_step's (and PyTorch's in compare-pytorch.py):
 *   train_mlp_b128        fc1..fc3 forward, fc3/fc2 input grads, fc3/fc2/fc1 weight grads (the
 *                         input needs no grad): 8 GEMMs
 *   train_cnn_b64         conv1 forward + weight grad, conv2 forward + data grad + weight
 *                         grad, fc1/fc2 forward, input and weight grads
 *   train_cnn_b64_bf16    the same in bf16 (autocast runs the forward's convolutions and
 *                         linears, and their backward, in bf16)
 *   train_lstm_h256       the input projection of all 64 steps as one GEMM, the 64 recurrent
 *                         h.W_hh^T products, their 64 backward products, the two weight grads
 *                         over all steps, the head's forward and grads
 *   train_transformer_b32 per layer (x2): in-projection, the 128 (batch x head) score and
 *                         value products, out-projection, feed-forward; their backward (the
 *                         first layer's input needs no grad)
 * A GEMM is written M x N x K (C[M,N] = A[M,K] B[K,N], row-major; "A^T"/"B^T": that operand is
 * stored transposed, as linear's weight is in the forward and the activations are in a weight
 * grad), times its batch and its count in the step. Each is timed with every candidate:
 *   dnnl-Nt   oneDNN's matmul primitive (or convolution primitive, activations and weights in
 *             the layouts it prefers, reorders not counted) on N = omp_get_max_threads()
 *   dnnl-1t   the same primitive made for 1 OpenMP thread
 *   nhwc-Nt   convolutions only: the convolution primitive with its activations (source,
 *             destination and their gradients) fixed to nhwc, the channels-last layout Ember's
 *             CNN activations are stored in and its CPU backend hands oneDNN as they are
 *             (weights still as oneDNN prefers, their reorder not counted), on N threads
 *   nhwc-1t   the same made for 1 OpenMP thread
 *   blas-1t   OpenBLAS cblas_sgemm on 1 thread, a loop over the batch (f32 only: Debian's
 *             OpenBLAS 0.3.21 is built without cblas_sbgemm)
 *   blas-Nt   the same on N OpenBLAS threads (its pthread pool; stopped again afterwards)
 * A candidate's time is the median of at least 5 calls and 25 ms after 2 untimed calls; the
 * best candidate's median times the count is the item's floor (marked *; for a convolution the
 * better of the preferred layouts and nhwc, whichever wins), and the step's floor is the sum.
 * For the CNN the convolutions' sum in either layout is printed too.
 * The OpenMP wait policy is the environment's: compare-pytorch.py gives this program
 * OMP_WAIT_POLICY=passive, like Ember's training worker. Prints a table per workload, then
 *
 *   floor <workload> <ms> <GFLOP>
 *
 * (the GFLOP of the step's GEMMs and convolutions, 2 per multiply-add: what compare-pytorch.py
 * divides by a step's time for its fraction of the measured FMA ceiling). For the CNN it also
 * times, outside the floor, the oneDNN reorders between NCHW and the forward primitives'
 * blocked layouts that convolutions on plain tensors pay (conv1's output and its gradient,
 * conv2's input, output and their gradients), and prints "reorders <workload> <ms>"; and
 * conv2's three products as the GEMMs of an im2col lowering (12544x64x288 and its two grads,
 * the copies not timed), beside its direct primitives.
 */
#include <cblas.h>
#include <dnnl.h>
#include <inttypes.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

int blas_thread_shutdown_(void); /* OpenBLAS: stop the pthread pool (restarted on demand) */

enum { GEMM, CONV_FWD, CONV_BWD_DATA, CONV_BWD_WEIGHTS };

typedef struct {
    const char *what;
    int kind;
    int64_t m, n, k; /* GEMM */
    bool ta, tb;
    int64_t batch;
    int64_t N, C, H, W, O, ks, pad; /* convolution: NCHW input, O filters ks x ks, stride 1 */
    int count;
} item;

typedef struct {
    const char *name;
    bool bf16;
    item it[32];
} workload;

#define G(w, M, N_, K, TA, TB, B, CNT) \
    {.what = w, .kind = GEMM, .m = M, .n = N_, .k = K, .ta = TA, .tb = TB, .batch = B, .count = CNT}
#define CV(w, KIND, N_, C_, H_, O_) \
    {.what = w, .kind = KIND, .N = N_, .C = C_, .H = H_, .W = H_, .O = O_, .ks = 3, .pad = 1, .count = 1}

#define CNN_ITEMS                                                        \
    CV("conv1 forward", CONV_FWD, 64, 1, 28, 32),                        \
    CV("conv1 weight grad", CONV_BWD_WEIGHTS, 64, 1, 28, 32),            \
    CV("conv2 forward", CONV_FWD, 64, 32, 14, 64),                       \
    CV("conv2 data grad", CONV_BWD_DATA, 64, 32, 14, 64),                \
    CV("conv2 weight grad", CONV_BWD_WEIGHTS, 64, 32, 14, 64),           \
    G("fc1 forward", 64, 128, 3136, false, true, 1, 1),                  \
    G("fc1 input grad", 64, 3136, 128, false, false, 1, 1),              \
    G("fc1 weight grad", 128, 3136, 64, true, false, 1, 1),              \
    G("fc2 forward", 64, 10, 128, false, true, 1, 1),                    \
    G("fc2 input grad", 64, 128, 10, false, false, 1, 1),                \
    G("fc2 weight grad", 10, 128, 64, true, false, 1, 1)

/* The reorders a convolution on plain NCHW tensors pays beside its primitive (not in the
 * floor): its input into the layout the forward primitive prefers, its output back to NCHW,
 * and the same for the gradients (same shapes, same layouts). */
typedef struct {
    const char *what;
    int64_t N, C, H, O; /* the convolution (3x3, pad 1) whose src or dst it is */
    bool dst, to_blocked;
} reorder;
static const reorder CNN_REORDERS[] = {
    {"conv1 output -> nchw", 64, 1, 28, 32, true, false},
    {"conv1 output grad -> blocked", 64, 1, 28, 32, true, true},
    {"conv2 input -> blocked", 64, 32, 14, 64, false, true},
    {"conv2 output -> nchw", 64, 32, 14, 64, true, false},
    {"conv2 output grad -> blocked", 64, 32, 14, 64, true, true},
    {"conv2 input grad -> nchw", 64, 32, 14, 64, false, false},
    {0}};

static workload WL[] = {
    {"train_mlp_b128", false,
     {G("fc1 forward", 128, 512, 784, false, true, 1, 1),
      G("fc2 forward", 128, 256, 512, false, true, 1, 1),
      G("fc3 forward", 128, 10, 256, false, true, 1, 1),
      G("fc3 input grad", 128, 256, 10, false, false, 1, 1),
      G("fc3 weight grad", 10, 256, 128, true, false, 1, 1),
      G("fc2 input grad", 128, 512, 256, false, false, 1, 1),
      G("fc2 weight grad", 256, 512, 128, true, false, 1, 1),
      G("fc1 weight grad", 512, 784, 128, true, false, 1, 1)}},
    {"train_cnn_b64", false, {CNN_ITEMS}},
    {"train_cnn_b64_blocked", false, {CNN_ITEMS}}, /* the same convolutions */
    {"train_cnn_b64_bf16", true, {CNN_ITEMS}},
    {"train_lstm_h256", false,
     {G("input projection, 64 steps", 2048, 1024, 256, false, true, 1, 1),
      G("recurrent h.W_hh^T, per step", 32, 1024, 256, false, true, 1, 64),
      G("recurrent grad dG.W_hh, per step", 32, 256, 1024, false, false, 1, 64),
      G("W_ih grad", 1024, 256, 2048, true, false, 1, 1),
      G("W_hh grad", 1024, 256, 2048, true, false, 1, 1),
      G("head forward", 2048, 64, 256, false, true, 1, 1),
      G("head input grad", 2048, 256, 64, false, false, 1, 1),
      G("head weight grad", 64, 256, 2048, true, false, 1, 1)}},
    {"train_transformer_b32", false,
     {G("in-projection", 4096, 768, 256, false, true, 1, 2),
      G("scores Q.K^T", 128, 128, 64, false, true, 128, 2),
      G("P.V", 128, 64, 128, false, false, 128, 2),
      G("out-projection", 4096, 256, 256, false, true, 1, 2),
      G("feed-forward 1", 4096, 1024, 256, false, true, 1, 2),
      G("feed-forward 2", 4096, 256, 1024, false, true, 1, 2),
      G("ff2 input grad", 4096, 1024, 256, false, false, 1, 2),
      G("ff2 weight grad", 256, 1024, 4096, true, false, 1, 2),
      G("ff1 input grad", 4096, 256, 1024, false, false, 1, 2),
      G("ff1 weight grad", 1024, 256, 4096, true, false, 1, 2),
      G("out-proj input grad", 4096, 256, 256, false, false, 1, 2),
      G("out-proj weight grad", 256, 256, 4096, true, false, 1, 2),
      G("dP = dO.V^T", 128, 128, 64, false, true, 128, 2),
      G("dV = P^T.dO", 128, 64, 128, true, false, 128, 2),
      G("dQ = dS.K", 128, 64, 128, false, false, 128, 2),
      G("dK = dS^T.Q", 128, 64, 128, true, false, 128, 2),
      G("in-proj input grad (layer 2)", 4096, 256, 768, false, false, 1, 1),
      G("in-proj weight grad", 768, 256, 4096, true, false, 1, 2)}},
};
#define N_WL ((int)(sizeof WL / sizeof WL[0]))

static dnnl_engine_t engine;
static dnnl_stream_t stream;
static int nt; /* omp_get_max_threads() at start */

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static clockid_t call_clock = CLOCK_MONOTONIC; /* --cpu-time: CLOCK_PROCESS_CPUTIME_ID */

/* --cold: evicts the caches before each call (time_median) */
static volatile unsigned char *cold_buf;
enum { COLD_BYTES = 64 << 20 };
static void evict(void) {
    if (!cold_buf) return;
    for (size_t i = 0; i < COLD_BYTES; i += 64) cold_buf[i] = (unsigned char)(cold_buf[i] + 1);
}

static double call_ms(void) {
    struct timespec t;
    clock_gettime(call_clock, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void fail(const char *what, dnnl_status_t s) {
    fprintf(stderr, "step_floor: %s: oneDNN status %d\n", what, (int)s);
    exit(1);
}
#define CK(call, what)                          \
    do {                                        \
        dnnl_status_t s_ = (call);              \
        if (s_ != dnnl_success) fail(what, s_); \
    } while (0)

/* Operands of 64 KiB and more on 2 MiB transparent huge pages, as the CPU backend places its
 * tensors (plugins/backend-cpu/cpu.c): on 4 KiB pages oneDNN's AVX2 no-copy GEMMs run up to
 * 1.5x slower at some addresses than at others, which would time the placement, not the GEMM. */
static void *xmalloc(size_t n) {
    size_t align = n >= ((size_t)64 << 10) ? (size_t)2 << 20 : 64;
    void *p = aligned_alloc(align, (n + align - 1) / align * align);
#ifdef MADV_HUGEPAGE
    if (p && align > 64) (void)madvise(p, (n + align - 1) / align * align, MADV_HUGEPAGE);
#endif
    if (!p) {
        fprintf(stderr, "step_floor: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static uint32_t rng = 12345;
static float urand(void) { /* uniform on [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static void fill(void *p, size_t elems, bool bf16) {
    for (size_t i = 0; i < elems; i++) {
        if (bf16) ((uint16_t *)p)[i] = to_bf16(urand());
        else ((float *)p)[i] = urand();
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median ms of fn(ctx): 2 untimed calls, then at least 5 calls and 25 ms (at most 400). */
static double time_median(void (*fn)(void *), void *ctx) {
    enum { MAX_CALLS = 400 };
    static double t[MAX_CALLS];
    evict(), fn(ctx), evict(), fn(ctx);
    int n = 0;
    double start = now_ms(), evicting = 0;
    while (n < MAX_CALLS && (n < 5 || now_ms() - start - evicting < 25.0)) {
        double e0 = now_ms();
        evict();
        evicting += now_ms() - e0;
        double t0 = call_ms();
        fn(ctx);
        t[n++] = call_ms() - t0;
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* ---- oneDNN ------------------------------------------------------------------------------ */

typedef struct {
    dnnl_primitive_t prim;
    int nargs;
    dnnl_exec_arg_t args[6];
} dnnl_job;

static void run_dnnl(void *ctx) {
    dnnl_job *j = ctx;
    CK(dnnl_primitive_execute(j->prim, stream, j->nargs, j->args), "execute");
    CK(dnnl_stream_wait(stream), "stream wait");
}

/* A memory object over xmalloc'd bytes (free_job frees them). */
static dnnl_memory_t mem_for(const dnnl_memory_desc_t *md, bool bf16) {
    dnnl_memory_t m;
    size_t bytes = dnnl_memory_desc_get_size(md);
    void *p = xmalloc(bytes ? bytes : 1);
    CK(dnnl_memory_create(&m, md, engine, p), "memory");
    fill(p, bytes / (bf16 ? 2 : 4), bf16);
    return m;
}

static void free_job(dnnl_job *j) {
    for (int i = 0; i < j->nargs; i++) {
        void *p = NULL;
        CK(dnnl_memory_get_data_handle(j->args[i].memory, &p), "data handle");
        dnnl_memory_destroy(j->args[i].memory);
        free(p);
    }
    dnnl_primitive_destroy(j->prim);
}

/* The primitive for `it` made while OpenMP's thread count is `threads` (oneDNN fixes its work
 * split then); returns false where oneDNN has only its reference kernel (not a candidate). */
static bool make_dnnl(const item *it, bool bf16, bool nhwc, int threads, dnnl_job *j,
                      char *impl_out, size_t impl_len) {
    dnnl_data_type_t dt = bf16 ? dnnl_bf16 : dnnl_f32;
    omp_set_num_threads(threads);
    memset(j, 0, sizeof *j);
    dnnl_primitive_desc_t pd = NULL, fpd = NULL;
    if (it->kind == GEMM) {
        int64_t b = it->batch, m = it->m, n = it->n, k = it->k;
        dnnl_dims_t da = {b, m, k}, db = {b, k, n}, dc = {b, m, n};
        dnnl_dims_t sa = {m * k, it->ta ? 1 : k, it->ta ? m : 1};
        dnnl_dims_t sb = {k * n, it->tb ? 1 : n, it->tb ? k : 1};
        dnnl_dims_t sc = {m * n, n, 1};
        dnnl_memory_desc_t ma, mb, mc;
        CK(dnnl_memory_desc_init_by_strides(&ma, 3, da, dt, sa), "md a");
        CK(dnnl_memory_desc_init_by_strides(&mb, 3, db, dt, sb), "md b");
        CK(dnnl_memory_desc_init_by_strides(&mc, 3, dc, dt, sc), "md c");
        dnnl_matmul_desc_t d;
        CK(dnnl_matmul_desc_init(&d, &ma, &mb, NULL, &mc), "matmul desc");
        CK(dnnl_primitive_desc_create(&pd, &d, NULL, engine, NULL), "matmul pd");
        j->args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, mem_for(&ma, bf16)};
        j->args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, mem_for(&mb, bf16)};
        j->args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, mem_for(&mc, bf16)};
        j->nargs = 3;
    } else {
        int64_t OH = it->H + 2 * it->pad - it->ks + 1, OW = it->W + 2 * it->pad - it->ks + 1;
        dnnl_dims_t sd = {it->N, it->C, it->H, it->W}, dd = {it->N, it->O, OH, OW},
                    wd = {it->O, it->C, it->ks, it->ks}, bd = {it->O};
        dnnl_dims_t st = {1, 1}, pl = {it->pad, it->pad}, dil = {0, 0};
        dnnl_memory_desc_t src, dst, w, b;
        /* nhwc: the activations channels-last (Ember's CPU backend passes a channels-last
         * tensor so, plugins/backend-cpu/cpu_nn_dnnl.c), the weights still as preferred */
        dnnl_format_tag_t act = nhwc ? dnnl_nhwc : dnnl_format_tag_any;
        CK(dnnl_memory_desc_init_by_tag(&src, 4, sd, dt, act), "md src");
        CK(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dt, act), "md dst");
        CK(dnnl_memory_desc_init_by_tag(&w, 4, wd, dt, dnnl_format_tag_any), "md w");
        CK(dnnl_memory_desc_init_by_tag(&b, 1, bd, dt, dnnl_x), "md bias");
        dnnl_convolution_desc_t fd, bdsc;
        CK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                      dnnl_convolution_direct, &src, &w, &b,
                                                      &dst, st, dil, pl, pl),
           "conv forward desc");
        CK(dnnl_primitive_desc_create(&fpd, &fd, NULL, engine, NULL), "conv forward pd");
        if (it->kind == CONV_FWD) {
            pd = fpd, fpd = NULL;
            j->args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), bf16)};
            j->args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), bf16)};
            j->args[2] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mem_for(&b, bf16)};
            j->args[3] = (dnnl_exec_arg_t){DNNL_ARG_DST,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0), bf16)};
            j->nargs = 4;
        } else if (it->kind == CONV_BWD_DATA) {
            CK(dnnl_dilated_convolution_backward_data_desc_init(&bdsc, dnnl_convolution_direct,
                                                                &src, &w, &dst, st, dil, pl, pl),
               "conv backward data desc");
            CK(dnnl_primitive_desc_create(&pd, &bdsc, NULL, engine, fpd), "conv bwd data pd");
            j->args[0] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0), bf16)};
            j->args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0), bf16)};
            j->args[2] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_SRC,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_diff_src_md, 0), bf16)};
            j->nargs = 3;
        } else {
            CK(dnnl_dilated_convolution_backward_weights_desc_init(
                   &bdsc, dnnl_convolution_direct, &src, &w, &b, &dst, st, dil, pl, pl),
               "conv backward weights desc");
            CK(dnnl_primitive_desc_create(&pd, &bdsc, NULL, engine, fpd), "conv bwd weights pd");
            j->args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0), bf16)};
            j->args[1] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0), bf16)};
            j->args[2] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_WEIGHTS,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0), bf16)};
            j->args[3] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_BIAS,
                                           mem_for(dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 1), bf16)};
            j->nargs = 4;
        }
    }
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(impl_out, impl_len, "%s", impl ? impl : "?");
    bool ok = !impl || strncmp(impl, "ref", 3) != 0;
    if (ok) CK(dnnl_primitive_create(&j->prim, pd), "primitive");
    dnnl_primitive_desc_destroy(pd);
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    omp_set_num_threads(nt);
    if (!ok) {
        for (int i = 0; i < j->nargs; i++) dnnl_memory_destroy(j->args[i].memory);
        j->nargs = 0;
    }
    return ok;
}

/* ---- OpenBLAS ---------------------------------------------------------------------------- */

typedef struct {
    const item *it;
    float *a, *b, *c;
} blas_job;

static void run_blas(void *ctx) {
    blas_job *j = ctx;
    const item *it = j->it;
    int m = (int)it->m, n = (int)it->n, k = (int)it->k;
    int lda = it->ta ? m : k, ldb = it->tb ? k : n;
    CBLAS_TRANSPOSE ta = it->ta ? CblasTrans : CblasNoTrans, tb = it->tb ? CblasTrans : CblasNoTrans;
    for (int64_t i = 0; i < it->batch; i++) {
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, j->a + i * m * k, lda,
                    j->b + i * k * n, ldb, 0.0f, j->c + i * m * n, n);
    }
}

/* ---- the table --------------------------------------------------------------------------- */

static double item_gflop(const item *it) {
    if (it->kind == GEMM) return 2.0 * (double)(it->m * it->n * it->k * it->batch) * it->count / 1e9;
    int64_t OH = it->H + 2 * it->pad - it->ks + 1, OW = it->W + 2 * it->pad - it->ks + 1;
    return 2.0 * (double)(it->N * it->O * OH * OW * it->C * it->ks * it->ks) * it->count / 1e9;
}

static void shape_text(const item *it, char *s, size_t len) {
    if (it->kind == GEMM)
        snprintf(s, len, "%" PRId64 "x%" PRId64 "x%" PRId64 "%s%s", it->m, it->n, it->k,
                 it->ta ? " A^T" : "", it->tb ? " B^T" : "");
    else
        snprintf(s, len, "%" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64 " -> %" PRId64 " %" PRId64
                 "x%" PRId64, it->N, it->C, it->H, it->W, it->O, it->ks, it->ks);
    if (it->batch > 1) {
        size_t u = strlen(s);
        snprintf(s + u, len - u, " [x%" PRId64 "]", it->batch);
    }
}

/* Time the reorders of CNN_REORDERS (f32 or bf16) on N threads; print them and their sum. */
static void run_reorders(bool bf16) {
    dnnl_data_type_t dt = bf16 ? dnnl_bf16 : dnnl_f32;
    printf("  reorders between NCHW and the forward primitives' layouts (not in the floor: what "
           "plain tensors cost the convolutions; dnnl-Nt):\n");
    double total = 0;
    for (const reorder *r = CNN_REORDERS; r->what; r++) {
        int64_t H = r->H;
        dnnl_dims_t sd = {r->N, r->C, H, H}, dd = {r->N, r->O, H, H}, wd = {r->O, r->C, 3, 3},
                    st = {1, 1}, pl = {1, 1}, dil = {0, 0};
        dnnl_memory_desc_t src, dst, w, plain;
        CK(dnnl_memory_desc_init_by_tag(&src, 4, sd, dt, dnnl_format_tag_any), "md src");
        CK(dnnl_memory_desc_init_by_tag(&dst, 4, dd, dt, dnnl_format_tag_any), "md dst");
        CK(dnnl_memory_desc_init_by_tag(&w, 4, wd, dt, dnnl_format_tag_any), "md w");
        CK(dnnl_memory_desc_init_by_tag(&plain, 4, r->dst ? dd : sd, dt, dnnl_nchw), "md nchw");
        dnnl_convolution_desc_t fd;
        CK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training,
                                                      dnnl_convolution_direct, &src, &w, NULL,
                                                      &dst, st, dil, pl, pl), "conv desc");
        dnnl_primitive_desc_t cpd, rpd;
        CK(dnnl_primitive_desc_create(&cpd, &fd, NULL, engine, NULL), "conv pd");
        const dnnl_memory_desc_t *blk =
            dnnl_primitive_desc_query_md(cpd, r->dst ? dnnl_query_dst_md : dnnl_query_src_md, 0);
        const dnnl_memory_desc_t *from = r->to_blocked ? &plain : blk,
                                 *to = r->to_blocked ? blk : &plain;
        double t = 0;
        if (dnnl_memory_desc_equal(from, to)) {
            printf("  %-32s %-28s  the primitive takes NCHW here: no reorder\n", r->what, "");
        } else {
            CK(dnnl_reorder_primitive_desc_create(&rpd, from, engine, to, engine, NULL),
               "reorder pd");
            dnnl_job j = {.nargs = 2};
            CK(dnnl_primitive_create(&j.prim, rpd), "reorder");
            j.args[0] = (dnnl_exec_arg_t){DNNL_ARG_FROM, mem_for(from, bf16)};
            j.args[1] = (dnnl_exec_arg_t){DNNL_ARG_TO, mem_for(to, bf16)};
            t = time_median(run_dnnl, &j);
            free_job(&j);
            dnnl_primitive_desc_destroy(rpd);
            char shape[64];
            const int64_t *d = r->dst ? dd : sd;
            snprintf(shape, sizeof shape, "%" PRId64 "x%" PRId64 "x%" PRId64 "x%" PRId64 " (%.1f MB)",
                     d[0], d[1], d[2], d[3],
                     (double)(d[0] * d[1] * d[2] * d[3]) * (bf16 ? 2 : 4) / 1e6);
            printf("  %-32s %-28s %9.4f ms\n", r->what, shape, t);
        }
        dnnl_primitive_desc_destroy(cpd);
        total += t;
    }
    printf("  reorders %.4f ms\n", total);
    printf("reorders %s %.6f\n", bf16 ? "train_cnn_b64_bf16" : "train_cnn_b64", total);
}

enum { N_CAND = 6 }; /* dnnl-Nt, dnnl-1t, nhwc-Nt, nhwc-1t, blas-1t, blas-Nt */

/* Time `it` with every candidate and print its row; returns its floor (best x count). For a
 * convolution, *pref and *cl (when not NULL) gain its best time x count with the activations
 * in the layouts oneDNN prefers and in nhwc. */
static double time_item(const char *wname, const item *it, bool bf16, double *pref, double *cl) {
    double t[N_CAND] = {-1, -1, -1, -1, -1, -1};
    char impl[4][128] = {"", "", "", ""};
    for (int c = 0; c < 4; c++) {
        if (c % 2 == 1 && nt == 1) continue;
        if (c >= 2 && it->kind == GEMM) break;
        dnnl_job j;
        if (!make_dnnl(it, bf16, c >= 2, c % 2 == 0 ? nt : 1, &j, impl[c], sizeof impl[c]))
            continue;
        t[c] = time_median(run_dnnl, &j);
        free_job(&j);
    }
    if (it->kind == GEMM && !bf16) { /* Debian's OpenBLAS has no sbgemm */
        blas_job bj = {.it = it};
        size_t na = (size_t)(it->m * it->k * it->batch), nb = (size_t)(it->k * it->n * it->batch),
               nc = (size_t)(it->m * it->n * it->batch);
        bj.a = xmalloc(na * 4), bj.b = xmalloc(nb * 4), bj.c = xmalloc(nc * 4);
        fill(bj.a, na, false), fill(bj.b, nb, false);
        openblas_set_num_threads(1);
        t[4] = time_median(run_blas, &bj);
        if (nt > 1) {
            openblas_set_num_threads(nt);
            t[5] = time_median(run_blas, &bj);
            openblas_set_num_threads(1);
            blas_thread_shutdown_(); /* its workers would spin into the next timing */
        }
        free(bj.a), free(bj.b), free(bj.c);
    }
    int best = -1;
    for (int c = 0; c < N_CAND; c++)
        if (t[c] >= 0 && (best < 0 || t[c] < t[best])) best = c;
    if (best < 0) {
        fprintf(stderr, "step_floor: %s %s: no candidate ran\n", wname, it->what);
        exit(1);
    }
    if (it->kind != GEMM) {
        double p = -1, q = -1;
        for (int c = 0; c < 2; c++)
            if (t[c] >= 0 && (p < 0 || t[c] < p)) p = t[c];
        for (int c = 2; c < 4; c++)
            if (t[c] >= 0 && (q < 0 || t[c] < q)) q = t[c];
        if (pref && p >= 0) *pref += p * it->count;
        if (cl && q >= 0) *cl += q * it->count;
    }
    char shape[96];
    shape_text(it, shape, sizeof shape);
    double f = t[best] * it->count;
    printf("  %-32s %-28s %5d %8.4f", it->what, shape, it->count, item_gflop(it));
    for (int c = 0; c < N_CAND; c++) {
        if (t[c] < 0) printf(" %9s", "-");
        else printf(" %8.4f%c", t[c], c == best ? '*' : ' ');
    }
    printf(" %9.4f  %s\n", f, best < 4 ? impl[best] : "");
    return f;
}

/* conv2 lowered to GEMMs (im2col: 64 x 14 x 14 output pixels by 32 x 3 x 3 taps), for
 * comparison with its direct primitives; the im2col / col2im copies are not timed. */
static const item CNN_LOWERED[] = {
    G("conv2 forward as GEMM", 12544, 64, 288, false, true, 1, 1),
    G("conv2 data grad as GEMM", 12544, 288, 64, false, false, 1, 1),
    G("conv2 weight grad as GEMM", 64, 288, 12544, true, false, 1, 1),
    {0}};

static void run_workload(const workload *w) {
    /* Below AVX-512 oneDNN 2.6 has only reference bf16 primitives, which Ember's CPU plugin
     * declines (its bf16 then runs through f32): there is no bf16 floor to time. */
    unsigned avx512 = (unsigned)dnnl_cpu_isa_avx512_core;
    if (w->bf16 && ((unsigned)dnnl_get_effective_cpu_isa() & avx512) != avx512) {
        printf("\n%s: bf16: no floor on this CPU (oneDNN has no bf16 kernels below AVX-512; "
               "Ember's bf16 runs through f32 here)\n", w->name);
        return;
    }
    printf("\n%s%s (ms per call; best candidate marked *)\n", w->name,
           w->bf16 ? ": bf16" : "");
    printf("  %-32s %-28s %5s %8s %9s %9s %9s %9s %9s %9s %9s\n", "what", "shape", "count",
           "GFLOP", "dnnl-Nt", "dnnl-1t", "nhwc-Nt", "nhwc-1t", "blas-1t", "blas-Nt",
           "floor ms");
    double total = 0, gflop = 0, pref = 0, cl = 0;
    for (const item *it = w->it; it->what; it++) {
        total += time_item(w->name, it, w->bf16, &pref, &cl);
        gflop += item_gflop(it);
    }
    if (pref > 0 || cl > 0)
        printf("  the convolutions: %.4f ms with the activations as oneDNN prefers, %.4f ms in "
               "nhwc (each the better thread count); the floor takes the better per item\n",
               pref, cl);
    if (strncmp(w->name, "train_cnn", 9) == 0) {
        run_reorders(w->bf16);
        printf("  conv2 lowered to GEMMs (the im2col/col2im copies not timed; not in the "
               "floor):\n");
        double lowered = 0;
        for (const item *it = CNN_LOWERED; it->what; it++)
            lowered += time_item(w->name, it, w->bf16, NULL, NULL);
        printf("  conv2 as GEMMs %.4f ms\n", lowered);
    }
    printf("  floor %.4f ms for %.4f GFLOP (%.1f GFLOP/s)\n", total, gflop, gflop / total * 1e3);
    printf("floor %s %.6f %.6f\n", w->name, total, gflop);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < N_WL; i++) printf("%s\n", WL[i].name);
        return 0;
    }
    for (;;) {
        if (argc > 1 && strcmp(argv[1], "--cpu-time") == 0) {
            call_clock = CLOCK_PROCESS_CPUTIME_ID;
        } else if (argc > 1 && strcmp(argv[1], "--cold") == 0) {
            cold_buf = xmalloc(COLD_BYTES);
            memset((void *)cold_buf, 0, COLD_BYTES);
        } else {
            break;
        }
        argv++, argc--;
    }
    for (int a = 1; a < argc; a++) {
        bool known = false;
        for (int i = 0; i < N_WL; i++) known |= strcmp(argv[a], WL[i].name) == 0;
        if (!known) {
            fprintf(stderr, "step_floor: no workload '%s' (bench/step_floor --list)\n", argv[a]);
            return 2;
        }
    }
    nt = omp_get_max_threads();
    openblas_set_num_threads(1);
    blas_thread_shutdown_(); /* its pool started when the library loaded, and spins */
    CK(dnnl_engine_create(&engine, dnnl_cpu, 0), "engine");
    CK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "stream");
    const dnnl_version_t *v = dnnl_version();
    const char *wait = getenv("OMP_WAIT_POLICY");
    printf("step_floor: oneDNN %d.%d.%d, OpenBLAS %s; N = %d OpenMP threads, "
           "OMP_WAIT_POLICY=%s%s%s\n", v->major, v->minor, v->patch, openblas_get_corename(), nt,
           wait ? wait : "(unset)",
           call_clock == CLOCK_MONOTONIC ? "" : "; CPU ms of the process per call",
           cold_buf ? "; cold caches (64 MiB written before each call)" : "");
    for (int i = 0; i < N_WL; i++) {
        bool chosen = argc == 1;
        for (int a = 1; a < argc; a++) chosen |= strcmp(argv[a], WL[i].name) == 0;
        if (chosen) run_workload(&WL[i]);
    }
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(engine);
    return 0;
}
