/*
 * cpu_matmul.c — the CPU backend's GEMM engine (cpu_gemm, shared by bmm, addmm and whatever
 * else multiplies matrices) and the bmm kernels behind em_matmul/em_bmm.
 *
 * Which library runs a GEMM is decided once, when the plugin registers, and logged at info
 * level (cpu_gemm_describe() gives the same text):
 *   - f32: oneDNN's matmul primitive when oneDNN's JIT has at least AVX2 here, else OpenBLAS
 *     (tiny products, up to 64^3 multiply-adds, always go to OpenBLAS: see SMALL_GEMM).
 *     oneDNN picks its kernels from CPUID at run time; Debian's OpenBLAS 0.3.21 picks from a
 *     table of CPUs it knows and falls back to SSE3 kernels on newer ones (the Xeons of
 *     issue 3: ~25 GFLOP/s instead of ~170), and OPENBLAS_CORETYPE is read when libopenblas
 *     loads, too early for a plugin to fix. Measured here (AMD EPYC, Zen 4, 2 cores): oneDNN
 *     f32 ~205 GFLOP/s at 1024^3, OpenBLAS (which picked Cooperlake) ~170-190.
 *     EMBER_GEMM=openblas|onednn overrides the choice (for tests and comparisons).
 *   - f64: OpenBLAS (oneDNN 2.6 has no f64).
 *   - bf16: oneDNN natively (f32 accumulation) when its bf16 matmul has a JIT kernel on this
 *     CPU (AVX512_BF16 or AMX); otherwise through f32.
 *   - f16: through f32 (oneDNN 2.6 has no f16 matmul on CPUs without AVX512_FP16).
 *
 * Per-shape autotuning (f32 on oneDNN, products of more than 64^3 and at most TUNE_MAX_WORK
 * multiply-adds): the first call of a shape/layout/alpha/beta/bias times two ways of running
 * it on the caller's operands (into a scratch output) — oneDNN on the call's threads and
 * oneDNN on the calling thread alone — and every later call of that key runs the faster (like
 * cuDNN's benchmark mode), where all threads must be faster than 1 by 20%, and for products
 * they run in under 40 us by TUNE_WAKE_US (10 us) a call too (a worker's wake-up is not worth
 * less). Both give the same bits where oneDNN splits rows and columns among its threads, not
 * the sum (its AVX-512 kernels; tests/test_ops_linalg.c checks it), so a
 * decision that depends on timing does not make two runs differ: a run resumed in another
 * process still ends bit-identical. Where the two ways give other bits for a key (oneDNN's
 * AVX2 gemm:jit on a CPU without AVX-512 does, for some shapes), checked once on synthetic
 * operands when 1 thread wins (same_bits), the key stays on all threads. OpenBLAS is not a candidate for that reason (its sums round differently; on
 * the MLP's small products it was 1-2 us faster than oneDNN on one thread). What it buys depends on
 * how long a sleeping OpenMP worker takes to wake, which the machine and OMP_WAIT_POLICY /
 * GOMP_SPINCOUNT decide: on this VM with passive workers a parallel region costs ~40-80 us of
 * wake-ups, more than a 128x256x10 product takes on one thread. OpenBLAS with several threads
 * is not a candidate: its own pthread pool would spin next to OpenMP's workers. The decision
 * is made once per key and process; cpu_gemm_describe() lists the decisions and the info log
 * records them. EMBER_GEMM_AUTOTUNE=0 turns it off, and so do EMBER_GEMM and em_deterministic()
 * mode: then every such product runs on oneDNN with all threads.
 *
 * A transposed A of more than 512 rows in a product above TUNE_MAX_WORK is copied row-major
 * before oneDNN runs it (transpose_a(): a fixed rule, oneDNN's TN kernel is slower there).
 *
 * addmm with a bias broadcast along rows (linear's), alpha 1 and beta 1 passes the bias to
 * oneDNN's matmul as its bias argument (added to the accumulator; the output is not read)
 * instead of copying it into the output and accumulating onto it.
 *
 * oneDNN primitives are created once per shape/layout and cached (keyed by dtype, dims,
 * strides, alpha, beta, bias and thread count: oneDNN's matmul fixes its work split for the
 * OpenMP thread count current when the primitive is created, so the count is set then), under
 * a mutex. A call executes on a oneDNN stream of its execution context (cpu_ctx: idle streams
 * are kept there, one per concurrent call, and freed with the context), and passes the
 * primitive's scratchpad from kernel workspace (em_kernel_workspace: the caching allocator,
 * the injectable host allocator, category workspace). Each cached primitive keeps its memory
 * objects too, and a call only sets their data handles (making and destroying them was ~0.7 us
 * of a small product's call); the cache is looked up without the lock once an entry exists.
 * The primitives are freed by cpu_gemm_shutdown() when the plugin unloads. Thread counts ("the
 * call's threads") are the execution context's (cpu_threads). Scratch copies of operands are
 * kernel workspace too.
 *
 * Built with configure --without-onednn (EM_HAVE_DNNL undefined) only OpenBLAS exists: f32
 * and f64 GEMMs run in OpenBLAS (f32 products up to 64^3 on the calling thread, the rest on
 * em_num_threads()), bf16 and f16 through f32, no per-shape autotuning; EMBER_GEMM and
 * EMBER_GEMM_AUTOTUNE have nothing to choose from there (a warning says so).
 *
 * Threads: oneDNN runs on GNU OpenMP, like the rest of the plugin; it is given
 * the call's threads (or 1, where the autotuner chose so). OpenBLAS (its pthread
 * build, Debian's default) runs f64 on the call's threads, and f32 only on the calling
 * thread, so the two pools never both compute at once.
 */
#include "config.h" /* EM_HAVE_DNNL */

#include <cblas.h>
#ifdef EM_HAVE_DNNL
#include <dnnl.h>
#endif
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu.h"

/* OpenBLAS's own: stops its worker threads (the next multithreaded call starts them again). */
int blas_thread_shutdown_(void);

/* ---- the decision ------------------------------------------------------------------------------- */

typedef enum gemm_lib { LIB_OPENBLAS = 0, LIB_ONEDNN = 1 } gemm_lib;

/* How a way of running a GEMM went: done, declined (nothing written: try another), or failed
 * with the error set (kernel workspace ran out). */
typedef enum run_result { RUN_FAILED = -1, RUN_NO = 0, RUN_DONE = 1 } run_result;

/* A (B, R, C) matrix batch as GEMM sees it: byte pointer, element strides. */
typedef struct mat3 {
    char *data;
    int64_t B, R, C;
    int64_t s0, rs, cs;
} mat3;

/* A row of N bias values (column stride cs, elements) added to every row of y. */
typedef struct row_bias {
    const char *data;
    int64_t cs;
} row_bias;

#ifdef EM_HAVE_DNNL
typedef struct mm_key {
    int dt;
    int64_t dims[3][3];    /* a, b, y: (B, R, C) (B is 1 for a batch-broadcast operand) */
    int64_t strides[3][3];
    double alpha, beta;    /* beta is 0 with a bias argument */
    int bias;              /* 1: y = a b + bias (oneDNN's bias argument, a dense row of C) */
    int nt;                /* OpenMP threads the primitive is made for and run on */
} mm_key;

/* How a tuned f32 GEMM runs (mm_entry.choice). */
typedef enum gemm_path {
    PATH_UNDECIDED = 0,
    PATH_DNNL = 1,   /* oneDNN on the key's thread count */
    PATH_DNNL_1 = 2, /* oneDNN on the calling thread (its own primitive, made for 1 thread) */
    PATH_BLAS_1 = 3, /* OpenBLAS on the calling thread */
} gemm_path;

typedef struct mm_entry {
    mm_key key;
    dnnl_primitive_t prim; /* NULL: oneDNN has only a reference kernel here; use the fallback */
    dnnl_memory_desc_t md[4]; /* src, weights, dst, bias */
    dnnl_memory_desc_t md_scratch; /* the scratchpad's, when scratch > 0 */
    size_t scratch;           /* bytes of scratchpad a call passes (kernel workspace) */
    int choice;               /* gemm_path; read and written atomically */
    int tuning;               /* 1 while a thread measures this key */
    struct mm_entry *one;     /* the same key made for 1 thread (PATH_DNNL_1), once looked up */
    /* src, weights, dst, bias, scratchpad memory objects over the last call's pointers, made
     * at the first call and kept (a call sets their data handles: dnnl_exec); mem_busy is 1
     * while a call uses them (a concurrent call of the same key makes its own). */
    dnnl_memory_t mem[5];
    int mem_busy;
    struct mm_entry *next;
} mm_entry;

#endif /* EM_HAVE_DNNL: key, paths, cache entries */

/* Up to this many multiply-adds (B M N K) an f32 GEMM goes to OpenBLAS whatever the choice:
 * oneDNN's fixed cost per call (~2 us when this was measured: memory objects, stream, an OpenMP
 * region; the memory objects are kept with the primitive since) is more than the work, and
 * below this size OpenBLAS 0.3.21 computes on the calling thread alone (its multithreading
 * threshold is 65536 * 4), so its thread pool never wakes. Measured here:
 * 64^3 takes 6.8 us in OpenBLAS, 12 us in oneDNN; 96^3 takes 41 us in oneDNN, 60-85 in
 * OpenBLAS. */
#define SMALL_GEMM (64.0 * 64.0 * 64.0)

#ifdef EM_HAVE_DNNL
/* Autotuning covers f32 products of more than SMALL_GEMM and at most this many multiply-adds
 * (512 x 512 x 512: ~1.3 ms on one core here, so tuning one key costs at most ~30 ms once);
 * bigger ones keep every thread busy long enough that oneDNN on all threads wins. */
#define TUNE_MAX_WORK (512.0 * 512.0 * 512.0)
#define TUNE_ROUNDS 5 /* timed calls per candidate (after one untimed), interleaved */
#define TUNE_WARMUP_US 100000.0 /* see tune() */
#define TUNE_MARGIN 0.8 /* a way on 1 thread is chosen when it takes < 0.8x all threads' time */
/* ... or, for a product all threads run in less than 4x this, when they save less than this
 * per call: each all-thread call wakes the sleeping OpenMP worker (OMP_WAIT_POLICY=passive),
 * which costs the worker's CPU besides the product and, on idle cores here, 40-80 us of wall
 * time the back-to-back timed calls do not all see; and a difference this small is within
 * what one measurement on a loaded machine can tell
 * (the MLP step's fc3, 128x10x256, was once tuned to all threads at 14.2 against 14.9 us).
 * Not for bigger products: a machine busy while this measures can make all threads look no
 * faster than one (measured once here for all eight MLP products, 128x512x784 at 939.6 us
 * both ways, where an idle run has 520 against 940). */
#define TUNE_WAKE_US 10.0

#define MM_BUCKETS 256
#define MM_MAX_ENTRIES 4096

#endif /* EM_HAVE_DNNL: tuning constants */

static struct {
    bool ready;
    gemm_lib f32;
    bool bf16_native;
    char why[4096];    /* the rule, then each tuned key's measurements and decision */
    size_t why_len;
    pthread_mutex_t lock;
    int blas_threads;
#ifdef EM_HAVE_DNNL
    bool autotune;
    bool tn_copy; /* transpose_a() applies: oneDNN's matmul is gemm:jit (no avx512_core) */
    gemm_path forced_path; /* EMBER_GEMM_AUTOTUNE=<path>: run every tunable product that way */
    int n_tuned, n_unlisted;
    dnnl_engine_t engine;
    mm_entry *buckets[MM_BUCKETS];
    int n_entries;
#endif
} G = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void blas_threads(int nt);

#ifdef EM_HAVE_DNNL
static const char *path_name(gemm_path p);
static void entry_free(mm_entry *e);


static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "none";
    }
}

#endif /* EM_HAVE_DNNL: streams, ISA names */

const char *cpu_gemm_describe(void) { return G.ready ? G.why : "GEMM engine not initialised"; }

#ifdef EM_HAVE_DNNL
em_status cpu_gemm_init(void) {
    if (dnnl_engine_create(&G.engine, dnnl_cpu, 0) != dnnl_success)
        return em_set_error(EM_ERR_DEVICE, "ember-cpu: oneDNN could not create a CPU engine");
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const dnnl_version_t *v = dnnl_version();
    const char *core = openblas_get_corename();
    /* The ISA enum values are bit sets: each includes the bits of those it extends. */
    bool dnnl_avx2 = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx2) == (unsigned)dnnl_cpu_isa_avx2;
    G.bf16_native = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
                    (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    G.f32 = dnnl_avx2 ? LIB_ONEDNN : LIB_OPENBLAS;
    G.tn_copy = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core) != (unsigned)dnnl_cpu_isa_avx512_core;
    const char *how = dnnl_avx2 ? "oneDNN's JIT has AVX2 or better here (OpenBLAS's kernels "
                                  "depend on whether it knows this CPU)"
                                : "oneDNN's JIT lacks AVX2 here";
    const char *env = getenv("EMBER_GEMM");
    bool forced = false;
    if (env && strcmp(env, "openblas") == 0)
        G.f32 = LIB_OPENBLAS, how = "EMBER_GEMM=openblas", forced = true;
    if (env && strcmp(env, "onednn") == 0) G.f32 = LIB_ONEDNN, how = "EMBER_GEMM=onednn", forced = true;
    /* EMBER_GEMM_AUTOTUNE: unset or 1: on; 0: off; a path name: that path for every product
     * autotuning covers (to test and compare the paths). */
    const char *tune_env = getenv("EMBER_GEMM_AUTOTUNE");
    static const struct { const char *name; gemm_path path; } forced_paths[] = {
        {"onednn", PATH_DNNL}, {"onednn-1", PATH_DNNL_1}, {"openblas-1", PATH_BLAS_1}};
    bool tune_off = tune_env && strcmp(tune_env, "0") == 0;
    G.forced_path = PATH_UNDECIDED;
    for (size_t i = 0; tune_env && i < sizeof forced_paths / sizeof forced_paths[0]; i++)
        if (strcmp(tune_env, forced_paths[i].name) == 0) G.forced_path = forced_paths[i].path;
    if (tune_env && !tune_off && G.forced_path == PATH_UNDECIDED && strcmp(tune_env, "1") != 0)
        em_log_write(EM_LOG_WARN, "ember-cpu: EMBER_GEMM_AUTOTUNE=%s is not one of 1, 0, onednn, "
                     "onednn-1, openblas-1; autotuning stays on", tune_env);
    G.autotune = G.f32 == LIB_ONEDNN && !forced && !tune_off;
    char forced_text[160];
    snprintf(forced_text, sizeof forced_text, "; per shape from 64^3 to 512^3 multiply-adds: "
             "%s, forced by EMBER_GEMM_AUTOTUNE=%s (not in deterministic mode)",
             path_name(G.forced_path), tune_env ? tune_env : "");
    const char *tune = G.autotune && G.forced_path != PATH_UNDECIDED ? forced_text
        : G.autotune
        ? "; per shape from 64^3 to 512^3 multiply-adds oneDNN on all threads unless oneDNN "
          "on 1 thread (the same bits) is 20% faster (or, where all threads take under 40 us, "
          "less than 10 us slower), measured at its first call "
          "(EMBER_GEMM_AUTOTUNE=0 turns this off; deterministic mode does not use it)"
        : tune_off ? "; per-shape autotuning off (EMBER_GEMM_AUTOTUNE=0)"
        : forced   ? "; no per-shape autotuning (EMBER_GEMM is set)" : "";
    int n = snprintf(G.why, sizeof G.why,
             "f32 GEMM: %s (%s; up to 64^3 OpenBLAS on one thread%s); linear's bias through "
             "oneDNN's bias argument; f64: OpenBLAS; bf16: %s; f16: through f32. oneDNN %d.%d.%d "
             "isa %s, OpenBLAS core %s",
             G.f32 == LIB_ONEDNN ? "oneDNN matmul" : "OpenBLAS sgemm", how, tune,
             G.bf16_native ? "oneDNN matmul, native (f32 accumulation)"
                           : "through f32 (no bf16 instructions for oneDNN here)",
             v->major, v->minor, v->patch, isa_name(isa), core ? core : "?");
    G.why_len = n > 0 ? (size_t)n < sizeof G.why ? (size_t)n : sizeof G.why - 1 : 0;
    G.n_tuned = G.n_unlisted = 0;
    /* OpenBLAS 0.3.21's pthread workers start when the library loads, and again whenever
     * openblas_set_num_threads() finds them stopped, and then spin (sched_yield) ~0.1 s before
     * they sleep: measured 100 ms of CPU right after em_init, competing with OpenMP's workers
     * and skewing the autotuner's first measurements. When f32 goes to oneDNN, OpenBLAS runs
     * f32 on the calling thread only (small products, the autotuner's 1-thread path) and f64,
     * which is on no training path: set it to 1 thread, then stop its workers; an f64 product
     * sets its thread count back, which starts them again. */
    G.blas_threads = 0;
    if (G.f32 == LIB_ONEDNN) {
        blas_threads(1);
        blas_thread_shutdown_();
    }
    G.ready = true;
    em_log_write(EM_LOG_INFO, "ember-cpu: %s", G.why);
    return EM_OK;
}
#else
em_status cpu_gemm_init(void) {
    const char *core = openblas_get_corename();
    const char *env = getenv("EMBER_GEMM"), *tune_env = getenv("EMBER_GEMM_AUTOTUNE");
    if (env && strcmp(env, "openblas") != 0)
        em_log_write(EM_LOG_WARN, "ember-cpu: EMBER_GEMM=%s: this build has no oneDNN "
                     "(configure --without-onednn); GEMM stays on OpenBLAS", env);
    if (tune_env && strcmp(tune_env, "0") != 0)
        em_log_write(EM_LOG_WARN, "ember-cpu: EMBER_GEMM_AUTOTUNE=%s: this build has no oneDNN "
                     "(configure --without-onednn), so no per-shape autotuning", tune_env);
    G.f32 = LIB_OPENBLAS;
    G.bf16_native = false;
    int n = snprintf(G.why, sizeof G.why,
             "f32 GEMM: OpenBLAS sgemm (built without oneDNN; up to 64^3 OpenBLAS on one "
             "thread; no per-shape autotuning); f64: OpenBLAS; bf16: through f32; f16: through "
             "f32. OpenBLAS core %s", core ? core : "?");
    G.why_len = n > 0 ? (size_t)n < sizeof G.why ? (size_t)n : sizeof G.why - 1 : 0;
    G.blas_threads = 0;
    G.ready = true;
    em_log_write(EM_LOG_INFO, "ember-cpu: %s", G.why);
    return EM_OK;
}
#endif

void cpu_gemm_shutdown(void) {
    pthread_mutex_lock(&G.lock);
#ifdef EM_HAVE_DNNL
    for (int i = 0; i < MM_BUCKETS; i++) {
        for (mm_entry *e = G.buckets[i], *nx; e; e = nx) {
            nx = e->next;
            entry_free(e);
        }
        G.buckets[i] = NULL;
    }
    G.n_entries = 0;
    /* The contexts' streams went with the contexts (the core frees them first, with the
     * device type). */
    if (G.engine) dnnl_engine_destroy(G.engine);
    G.engine = NULL;
#endif
    G.ready = false;
    pthread_mutex_unlock(&G.lock);
}

#ifdef EM_HAVE_DNNL
/* ---- oneDNN ----------------------------------------------------------------------------------- */

/* A oneDNN stream of context c for one GEMM: an idle one, or a new one (NULL: none could be
 * made). c NULL (a core without contexts): a stream for this call alone. */
static dnnl_stream_t stream_take(cpu_ctx *c) {
    dnnl_stream_t s = NULL;
    if (c) {
        pthread_mutex_lock(&c->lock);
        if (c->n_idle) s = c->idle[--c->n_idle];
        pthread_mutex_unlock(&c->lock);
    }
    if (!s && dnnl_stream_create(&s, G.engine, dnnl_stream_default_flags) != dnnl_success)
        s = NULL;
    return s;
}

/* Give s back to c's idle streams (destroyed when they are full or c is NULL). */
static void stream_put(cpu_ctx *c, dnnl_stream_t s) {
    if (c) {
        pthread_mutex_lock(&c->lock);
        bool kept = c->n_idle < CPU_CTX_IDLE;
        if (kept) c->idle[c->n_idle++] = s;
        pthread_mutex_unlock(&c->lock);
        if (kept) return;
    }
    dnnl_stream_destroy(s);
}

void *cpu_dnnl_engine(void) { return G.engine; }
void *cpu_dnnl_stream_take(cpu_ctx *c) { return stream_take(c); }
void cpu_dnnl_stream_put(cpu_ctx *c, void *s) { stream_put(c, s); }

void cpu_ctx_release_handles(cpu_ctx *c) {
    for (int i = 0; i < c->n_idle; i++) dnnl_stream_destroy(c->idle[i]);
    c->n_idle = 0;
}

/* FNV-1a over the key's 64-bit words (the key is zero-padded to whole words; a byte at a time
 * took ~0.25 us of every GEMM call), folded so that the high bits reach the bucket index. */
static uint64_t key_hash(const mm_key *k) {
    _Static_assert(sizeof(mm_key) % sizeof(uint64_t) == 0, "mm_key is hashed in whole words");
    uint64_t h = 1469598103934665603ull, w;
    for (size_t i = 0; i < sizeof *k; i += sizeof w) {
        memcpy(&w, (const char *)k + i, sizeof w);
        h = (h ^ w) * 1099511628211ull;
    }
    return h ^ (h >> 29) ^ (h >> 47);
}

static void md_of(const mat3 *m, int64_t *dims, int64_t *strides) {
    dims[0] = m->s0 == 0 ? 1 : m->B, dims[1] = m->R, dims[2] = m->C;
    strides[1] = m->rs, strides[2] = m->cs;
    /* A size-1 batch's stride is arbitrary; give the dense one. */
    strides[0] = dims[0] == 1 ? (m->cs == 1 ? m->R * m->rs : m->C * m->cs) : m->s0;
}

/* Create the primitive for key k; entry->prim stays NULL when only a reference kernel exists
 * (or oneDNN refuses the layout), which sends the call to the fallback. Called with the lock
 * held, on the calling thread, whose OpenMP thread count is set to the key's meanwhile. */
static void entry_create(mm_entry *e, dnnl_data_type_t dt) {
    const mm_key *k = &e->key;
    for (int i = 0; i < 3; i++) {
        dnnl_dims_t d = {0}, st = {0}; /* the API reads whole DNNL_MAX_NDIMS arrays */
        memcpy(d, k->dims[i], sizeof k->dims[i]);
        memcpy(st, k->strides[i], sizeof k->strides[i]);
        if (dnnl_memory_desc_init_by_strides(&e->md[i], 3, d, dt, st) != dnnl_success) return;
    }
    if (k->bias) {
        int64_t n = k->dims[2][2];
        dnnl_dims_t d = {1, 1, n}, st = {n, n, 1};
        if (dnnl_memory_desc_init_by_strides(&e->md[3], 3, d, dt, st) != dnnl_success) return;
    }
    dnnl_matmul_desc_t mmd;
    if (dnnl_matmul_desc_init(&mmd, &e->md[0], &e->md[1], k->bias ? &e->md[3] : NULL,
                              &e->md[2]) != dnnl_success)
        return;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    /* The scratchpad is the caller's: kernel workspace at each call (dnnl_exec). */
    bool ok = dnnl_primitive_attr_create(&attr) == dnnl_success &&
              dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ==
                  dnnl_success;
    if (ok && k->alpha != 1.0) {
        float s = (float)k->alpha;
        ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &s) == dnnl_success;
    }
    if (ok && k->beta != 0.0) {
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_sum(po, (float)k->beta) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    }
    int prev = omp_get_max_threads();
    if (prev != k->nt) omp_set_num_threads(k->nt);
    dnnl_primitive_desc_t pd = NULL;
    if (ok && dnnl_primitive_desc_create(&pd, &mmd, attr, G.engine, NULL) == dnnl_success) {
        const char *impl = NULL;
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        if (impl && strncmp(impl, "ref", 3) != 0 && dnnl_primitive_create(&e->prim, pd) != dnnl_success)
            e->prim = NULL;
        const dnnl_memory_desc_t *smd =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->scratch = smd ? dnnl_memory_desc_get_size(smd) : 0;
        if (e->scratch) e->md_scratch = *smd;
        dnnl_primitive_desc_destroy(pd);
    }
    if (prev != k->nt) omp_set_num_threads(prev);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
}

/* The entry of key k in bucket h's list, or NULL. Entries are pushed at a list's head (with
 * release, under the lock) and freed only at shutdown, so a reader walks without the lock. */
static mm_entry *entry_find(uint64_t h, const mm_key *k) {
    mm_entry *e = __atomic_load_n(&G.buckets[h], __ATOMIC_ACQUIRE);
    while (e && memcmp(&e->key, k, sizeof *k) != 0) e = e->next;
    return e;
}

/* The cache entry of key k, made on first use. *owned: a one-off entry (the cache is full)
 * that the caller frees with entry_free. NULL: out of memory. */
static mm_entry *entry_get(const mm_key *k, bool *owned) {
    uint64_t h = key_hash(k) % MM_BUCKETS;
    *owned = false;
    mm_entry *e = entry_find(h, k);
    if (e) return e;
    pthread_mutex_lock(&G.lock);
    e = entry_find(h, k);
    if (!e && (e = em_host_alloc(sizeof *e, 64)) != NULL) {
        memset(e, 0, sizeof *e);
        e->key = *k;
        entry_create(e, (dnnl_data_type_t)k->dt);
        if (G.n_entries < MM_MAX_ENTRIES) {
            e->next = G.buckets[h];
            __atomic_store_n(&G.buckets[h], e, __ATOMIC_RELEASE);
            G.n_entries++;
        } else {
            *owned = true;
        }
    }
    pthread_mutex_unlock(&G.lock);
    return e;
}

static void entry_free(mm_entry *e) {
    for (int i = 0; i < 5; i++)
        if (e->mem[i]) dnnl_memory_destroy(e->mem[i]);
    if (e->prim) dnnl_primitive_destroy(e->prim);
    em_host_free(e);
}

/* The key of y = alpha a b + beta y (bias: y = a b + bias) on nt threads. */
static mm_key make_key(dnnl_data_type_t dt, const mat3 *a, const mat3 *b, const mat3 *y,
                       double alpha, double beta, bool bias, int nt) {
    mm_key k;
    memset(&k, 0, sizeof k); /* padding too: the key is hashed and compared as bytes */
    k.dt = (int)dt;
    md_of(a, k.dims[0], k.strides[0]);
    md_of(b, k.dims[1], k.strides[1]);
    md_of(y, k.dims[2], k.strides[2]);
    k.alpha = alpha, k.beta = bias ? 0.0 : beta;
    k.bias = bias;
    k.nt = nt;
    return k;
}

/* Run entry e's primitive on these operands (bias: a dense row of y->C values, for a key made
 * with a bias), on a oneDNN stream of kc's context, its scratchpad `pad` (at least e->scratch
 * bytes; NULL: taken from kc's workspace now). RUN_NO when it could not run (nothing was
 * written), RUN_FAILED (error set) when the workspace could not be had. */
static run_result dnnl_exec(const em_kernel_ctx *kc, mm_entry *e, const mat3 *a,
                            const mat3 *b, const mat3 *y, const void *bias, void *pad) {
    if (!e->prim) return RUN_NO;
    if (!e->scratch) pad = NULL;
    else if (!pad && !(pad = cpu_scratch(kc, e->scratch))) return RUN_FAILED;
    cpu_ctx *c = cpu_ctx_of(kc);
    dnnl_stream_t s = stream_take(c);
    if (!s) return RUN_NO;
    /* The entry's memory objects, their handles set to this call's pointers (making and
     * destroying one took ~0.16 us hot, setting a handle 8 ns); while another call of this key
     * holds them, objects of this call's own. */
    bool kept = __atomic_exchange_n(&e->mem_busy, 1, __ATOMIC_ACQUIRE) == 0;
    dnnl_memory_t own[5] = {NULL, NULL, NULL, NULL, NULL}, *m = kept ? e->mem : own;
    void *ptrs[5] = {a->data, b->data, y->data, (void *)bias, pad};
    int n = e->key.bias ? 4 : 3;
    bool ok = true, done = false;
    for (int i = 0; i < 5 && ok; i++) {
        if (i >= n && (i < 4 || !pad)) continue;
        const dnnl_memory_desc_t *md = i == 4 ? &e->md_scratch : &e->md[i];
        dnnl_memory_t made = NULL;
        if (m[i]) ok = dnnl_memory_set_data_handle(m[i], ptrs[i]) == dnnl_success;
        else if ((ok = dnnl_memory_create(&made, md, G.engine, ptrs[i]) == dnnl_success))
            m[i] = made;
    }
    if (ok) {
        int prev = omp_get_max_threads();
        if (prev != e->key.nt) omp_set_num_threads(e->key.nt);
        dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]},
                                   {DNNL_ARG_DST, m[2]}, {DNNL_ARG_BIAS, m[3]}};
        int na = n;
        if (pad) args[na++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[4]};
        done = dnnl_primitive_execute(e->prim, s, na, args) == dnnl_success &&
               dnnl_stream_wait(s) == dnnl_success;
        if (prev != e->key.nt) omp_set_num_threads(prev);
    }
    if (kept) __atomic_store_n(&e->mem_busy, 0, __ATOMIC_RELEASE);
    for (int i = 0; i < 5; i++)
        if (own[i]) dnnl_memory_destroy(own[i]);
    stream_put(c, s);
    return done ? RUN_DONE : RUN_NO;
}

/* Run y = alpha a b + beta y through oneDNN on all threads. Returns false when oneDNN has no
 * fast kernel for this call (nothing was written). */
static run_result onednn_gemm(const em_kernel_ctx *kc, dnnl_data_type_t dt, const mat3 *a,
                              const mat3 *b, const mat3 *y, double alpha, double beta,
                              const void *bias) {
    mm_key k = make_key(dt, a, b, y, alpha, beta, bias != NULL, cpu_threads(kc));
    bool owned;
    mm_entry *e = entry_get(&k, &owned);
    if (!e) return RUN_NO;
    run_result done = dnnl_exec(kc, e, a, b, y, bias, NULL);
    if (owned) entry_free(e);
    return done;
}

#else
void cpu_ctx_release_handles(cpu_ctx *c) { (void)c; } /* no oneDNN: no handles */
#endif /* EM_HAVE_DNNL: primitives */

/* ---- OpenBLAS ---------------------------------------------------------------------------------- */

static void blas_threads(int nt) {
    if (G.blas_threads != nt) {
        openblas_set_num_threads(nt);
        G.blas_threads = nt;
    }
}

void cpu_blas_one_thread(void) { blas_threads(1); }

/* y = alpha a b + beta y on nt OpenBLAS threads. */
static void blas_gemm(em_dtype dt, const mat3 *a, const mat3 *b, const mat3 *y, double alpha,
                      double beta, int nt) {
    blas_threads(nt);
    CBLAS_TRANSPOSE ta = a->cs == 1 ? CblasNoTrans : CblasTrans;
    CBLAS_TRANSPOSE tb = b->cs == 1 ? CblasNoTrans : CblasTrans;
    int lda = (int)(a->cs == 1 ? a->rs : a->cs), ldb = (int)(b->cs == 1 ? b->rs : b->cs);
    size_t e = em_dtype_size(dt);
    for (int64_t i = 0; i < y->B; i++) {
        const char *ap = a->data + i * a->s0 * (int64_t)e, *bp = b->data + i * b->s0 * (int64_t)e;
        char *yp = y->data + i * y->s0 * (int64_t)e;
        if (dt == EM_F32)
            cblas_sgemm(CblasRowMajor, ta, tb, (int)y->R, (int)y->C, (int)a->C, (float)alpha,
                        (const float *)ap, lda, (const float *)bp, ldb, (float)beta,
                        (float *)yp, (int)y->rs);
        else
            cblas_dgemm(CblasRowMajor, ta, tb, (int)y->R, (int)y->C, (int)a->C, alpha,
                        (const double *)ap, lda, (const double *)bp, ldb, beta, (double *)yp,
                        (int)y->rs);
    }
}

/* ---- layouts, conversions --------------------------------------------------------------------- */

static mat3 mat3_of(const em_ktensor *t) {
    mat3 m = {.data = t->data};
    if (t->ndim == 3) {
        m.B = t->shape[0], m.R = t->shape[1], m.C = t->shape[2];
        m.s0 = t->strides[0], m.rs = t->strides[1], m.cs = t->strides[2];
    } else {
        m.B = 1, m.R = t->shape[0], m.C = t->shape[1];
        m.s0 = 0, m.rs = t->strides[0], m.cs = t->strides[1];
    }
    if (m.B == 1) m.s0 = 0;
    /* A size-1 dim's stride is arbitrary: pick the one that makes the layout dense. */
    if (m.C == 1) m.cs = 1;
    if (m.R == 1) m.rs = m.C > 1 ? m.C : 1;
    return m;
}

/* Row-major (unit column stride) or transposed (unit row stride) with room for its rows. */
static bool gemm_layout(const mat3 *m) {
    return (m->cs == 1 && m->rs >= (m->C > 1 ? m->C : 1)) ||
           (m->rs == 1 && m->cs >= (m->R > 1 ? m->R : 1));
}

static inline double load(em_dtype dt, const char *p) {
    switch (dt) {
    case EM_F32: return *(const float *)p;
    case EM_F64: return *(const double *)p;
    case EM_BF16: return cpu_b2f(*(const uint16_t *)p);
    default: return cpu_h2f(*(const uint16_t *)p);
    }
}

static inline void store(em_dtype dt, char *p, double v) {
    switch (dt) {
    case EM_F32: *(float *)p = (float)v; break;
    case EM_F64: *(double *)p = v; break;
    case EM_BF16: *(uint16_t *)p = cpu_f2b((float)v); break;
    default: *(uint16_t *)p = cpu_f2h((float)v); break;
    }
}

/* A dense (B', R, C) copy of m in dtype dt_out (B' = 1 for a batch-broadcast operand), in
 * kc's workspace. */
static em_status dense_copy(const em_kernel_ctx *kc, const mat3 *m, em_dtype dt_in,
                            em_dtype dt_out, mat3 *out) {
    int64_t nb = m->s0 == 0 ? 1 : m->B;
    size_t ei = em_dtype_size(dt_in), eo = em_dtype_size(dt_out);
    char *s = cpu_scratch(kc, (size_t)(nb * m->R * m->C) * eo);
    if (!s) return em_last_status();
    char *d = s;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t i = 0; i < m->R; i++) {
            const char *row = m->data + (b * m->s0 + i * m->rs) * (int64_t)ei;
            if (dt_in == dt_out && m->cs == 1) {
                memcpy(d, row, (size_t)m->C * ei);
                d += (size_t)m->C * eo;
                continue;
            }
            for (int64_t j = 0; j < m->C; j++, d += eo) {
                if (dt_in == dt_out)
                    memcpy(d, row + j * m->cs * (int64_t)ei, ei);
                else
                    store(dt_out, d, load(dt_in, row + j * m->cs * (int64_t)ei));
            }
        }
    *out = (mat3){.data = s, .B = m->B, .R = m->R, .C = m->C, .s0 = nb == 1 ? 0 : m->R * m->C,
                  .rs = m->C > 1 ? m->C : 1, .cs = 1};
    return EM_OK;
}

/* y = beta y, for K == 0 (beta == 0: zeros, whatever y held). */
static void scale_y(em_dtype dt, const mat3 *y, double beta) {
    size_t e = em_dtype_size(dt);
    for (int64_t b = 0; b < y->B; b++)
        for (int64_t i = 0; i < y->R; i++)
            for (int64_t j = 0; j < y->C; j++) {
                char *p = y->data + (b * y->s0 + i * y->rs + j * y->cs) * (int64_t)e;
                store(dt, p, beta == 0 ? 0.0 : beta * load(dt, p));
            }
}

/* Every row of y = the bias row. */
static void fill_rows(em_dtype dt, const mat3 *y, const row_bias *rb) {
    size_t e = em_dtype_size(dt);
    for (int64_t bi = 0; bi < y->B; bi++)
        for (int64_t i = 0; i < y->R; i++) {
            char *dst = y->data + (bi * y->s0 + i * y->rs) * (int64_t)e;
            if (rb->cs == 1 || y->C == 1) {
                memcpy(dst, rb->data, (size_t)y->C * e);
                continue;
            }
            for (int64_t j = 0; j < y->C; j++)
                memcpy(dst + j * (int64_t)e, rb->data + j * rb->cs * (int64_t)e, e);
        }
}

#ifdef EM_HAVE_DNNL
/* ---- autotuning --------------------------------------------------------------------------------- */

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* The 1-thread twin of entry e (same key, nt 1), looked up once. */
static mm_entry *entry_one(mm_entry *e) {
    mm_entry *one = __atomic_load_n(&e->one, __ATOMIC_ACQUIRE);
    if (one) return one;
    mm_key k = e->key;
    k.nt = 1;
    bool owned;
    one = entry_get(&k, &owned);
    if (one && owned) { /* the cache is full: no 1-thread path for this key */
        entry_free(one);
        return NULL;
    }
    if (one) __atomic_store_n(&e->one, one, __ATOMIC_RELEASE);
    return one;
}

/* Run f32 y = alpha a b + beta y (rb: y = a b + bias, alpha 1) the way `path` says; e is the
 * key's entry (made with the bias argument when rb is given); pad: a oneDNN scratchpad big
 * enough for both of the key's primitives, or NULL (see dnnl_exec). False: that way cannot run this
 * call (nothing was written). */
static run_result run_path(const em_kernel_ctx *kc, gemm_path path, mm_entry *e, const mat3 *a,
                           const mat3 *b, const mat3 *y, double alpha, double beta,
                           const row_bias *rb, void *pad) {
    switch (path) {
    case PATH_DNNL: return dnnl_exec(kc, e, a, b, y, rb ? rb->data : NULL, pad);
    case PATH_DNNL_1: {
        mm_entry *one = entry_one(e);
        return one ? dnnl_exec(kc, one, a, b, y, rb ? rb->data : NULL, pad) : RUN_NO;
    }
    case PATH_BLAS_1:
        if (rb) fill_rows(EM_F32, y, rb), beta = 1.0;
        blas_gemm(EM_F32, a, b, y, alpha, beta, 1);
        return RUN_DONE;
    default: return RUN_NO;
    }
}

static const char *path_name(gemm_path p) {
    switch (p) {
    case PATH_DNNL: return "oneDNN on all threads";
    case PATH_DNNL_1: return "oneDNN on 1 thread";
    case PATH_BLAS_1: return "OpenBLAS on 1 thread";
    default: return "?";
    }
}

/* "128x512x784 (a row-major, b transposed, bias)" */
static void key_text(const mm_entry *e, const mat3 *a, const mat3 *b, char *buf, size_t cap) {
    snprintf(buf, cap, "%s%lldx%lldx%lld (a %s, b %s%s%s)",
             e->key.dims[2][0] > 1 ? "batched " : "", (long long)e->key.dims[2][1],
             (long long)e->key.dims[2][2], (long long)a->C,
             a->cs == 1 ? "row-major" : "transposed", b->cs == 1 ? "row-major" : "transposed",
             e->key.bias ? ", bias" : e->key.beta != 0 ? ", beta" : "",
             e->key.alpha != 1 ? ", alpha" : "");
}

/* The elements a strided operand spans, from its first to its last. */
static int64_t span_of(const mat3 *m) {
    return (m->B - 1) * m->s0 + (m->R - 1) * m->rs + (m->C - 1) * m->cs + 1;
}

/* Whether oneDNN on all threads and on 1 thread give the same bits for this key: both run on
 * operands of the key's layouts filled with fixed pseudo-random values in [-1, 1) (not the
 * call's, which may be all zeros), into zeroed outputs. y's data is scratch the caller owns. */
static bool same_bits(const em_kernel_ctx *kc, mm_entry *e, const mat3 *a, const mat3 *b,
                      const mat3 *y, double alpha, double beta, const row_bias *rb, void *pad) {
    int64_t na = span_of(a), nb = span_of(b), ny = span_of(y);
    float *fa = cpu_scratch(kc, (size_t)na * 4), *fb = cpu_scratch(kc, (size_t)nb * 4);
    char *y2 = cpu_scratch(kc, (size_t)ny * 4);
    if (!fa || !fb || !y2) { /* cannot check: keep all threads */
        em_clear_error();
        return false;
    }
    uint32_t r = 12345u; /* a linear congruential stream; 24 bits of each step */
    for (int64_t i = 0; i < na + nb; i++) {
        r = r * 1664525u + 1013904223u;
        (i < na ? fa + i : fb + (i - na))[0] = (float)(r >> 8) * 0x1p-23f - 1;
    }
    mat3 ta = *a, tb = *b, y1 = *y, ty2 = *y;
    ta.data = (char *)fa;
    tb.data = (char *)fb;
    ty2.data = y2;
    memset(y1.data, 0, (size_t)ny * 4);
    memset(y2, 0, (size_t)ny * 4);
    bool ok = run_path(kc, PATH_DNNL, e, &ta, &tb, &y1, alpha, beta, rb, pad) == RUN_DONE &&
              run_path(kc, PATH_DNNL_1, e, &ta, &tb, &ty2, alpha, beta, rb, pad) == RUN_DONE &&
              memcmp(y1.data, y2, (size_t)ny * 4) == 0;
    em_clear_error();
    return ok;
}

/* Time each way of running this key on these operands, into a scratch output, and keep the
 * fastest in e->choice (the median of TUNE_ROUNDS calls each, interleaved; oneDNN on all
 * threads unless a 1-thread way is clearly faster). Returns the choice. */
static gemm_path tune(const em_kernel_ctx *kc, mm_entry *e, const mat3 *a, const mat3 *b,
                      const mat3 *y, double alpha, double beta, const row_bias *rb) {
    gemm_path cand[2];
    int nc = 0;
    cand[nc++] = PATH_DNNL;
    if (e->key.nt > 1) cand[nc++] = PATH_DNNL_1;
    if (nc == 1) { /* one thread: nothing to choose */
        __atomic_store_n(&e->choice, (int)PATH_DNNL, __ATOMIC_RELEASE);
        return PATH_DNNL;
    }
    int64_t span = (y->B - 1) * y->s0 + (y->R - 1) * y->rs + (y->C - 1) * y->cs + 1;
    /* The scratch output, and one oneDNN scratchpad for every timed call (workspace is held
     * until the kernel returns: one per call would pile up). */
    mm_entry *one = entry_one(e);
    size_t one_n = one ? one->scratch : 0, pad_n = e->scratch > one_n ? e->scratch : one_n;
    char *scratch = cpu_scratch(kc, (size_t)span * 4);
    void *pad = scratch && pad_n ? cpu_scratch(kc, pad_n) : NULL;
    if (!scratch || (pad_n && !pad)) { /* decide at a later call */
        em_clear_error();
        return PATH_DNNL;
    }
    memset(scratch, 0, (size_t)span * 4); /* beta != 0 reads it: no NaN, no denormals */
    mat3 ys = *y;
    ys.data = scratch;
    double t[2][TUNE_ROUNDS] = {{0}}, med[2];
    bool failed[2] = {false, false};
    /* Before the process's first measurement, run all threads and 1 thread in turn until all
     * threads win by TUNE_MARGIN, for at most TUNE_WARMUP_US: right after the process was idle
     * the second core here takes tens of ms to pull its weight (measured: after a 300 ms
     * sleep, 2 threads ran 128x512x784 at 1-thread speed in 3 of 3 runs of a 20 ms warm-up,
     * and at full speed after 100 ms). */
    static int warmed;
    if (__atomic_exchange_n(&warmed, 1, __ATOMIC_ACQ_REL) == 0)
        for (double t0 = now_us(); now_us() - t0 < TUNE_WARMUP_US;) {
            double t1 = now_us();
            if (run_path(kc, PATH_DNNL, e, a, b, &ys, alpha, beta, rb, pad) != RUN_DONE) break;
            double t2 = now_us();
            if (run_path(kc, PATH_DNNL_1, e, a, b, &ys, alpha, beta, rb, pad) != RUN_DONE) break;
            if (t2 - t1 < TUNE_MARGIN * (now_us() - t2)) break;
        }
    for (int r = -1; r < TUNE_ROUNDS; r++)
        for (int i = 0; i < nc; i++) {
            int c = (i + (r < 0 ? 0 : r)) % nc; /* rotate the order: none always runs first */
            if (failed[c]) continue;
            double t0 = now_us();
            if (run_path(kc, cand[c], e, a, b, &ys, alpha, beta, rb, pad) != RUN_DONE)
                failed[c] = true;
            if (r >= 0) t[c][r] = now_us() - t0;
        }
    em_clear_error(); /* a way that failed here is only not chosen */
    /* A 1-thread way must beat all threads by TUNE_MARGIN, or, where all threads take under
     * 4 TUNE_WAKE_US, come within TUNE_WAKE_US of them: a machine busy while this measures
     * makes all threads look no better than one, and the choice lasts the whole process, but
     * all threads gaining a few microseconds do not pay for the worker's wake-up. */
    int best = 0;
    for (int c = 0; c < nc; c++) {
        qsort(t[c], TUNE_ROUNDS, sizeof t[c][0], cmp_double);
        med[c] = failed[c] ? 1e300 : t[c][TUNE_ROUNDS / 2];
    }
    for (int c = 1; c < nc; c++)
        if ((med[c] < TUNE_MARGIN * med[0] ||
             (med[0] < 4 * TUNE_WAKE_US && med[c] < med[0] + TUNE_WAKE_US)) &&
            (best == 0 || med[c] < med[best]))
            best = c;
    /* A timing-dependent choice is safe only between ways that give the same bits (see the
     * top). Where oneDNN's matmul splits a product's sum by thread count (its AVX2 gemm:jit
     * on a CPU without AVX-512 did: two runs of one program then predicted different logits),
     * 1 thread is not chosen. */
    bool other_bits = best != 0 && !same_bits(kc, e, a, b, &ys, alpha, beta, rb, pad);
    if (other_bits) best = 0;
    char what[160], line[512];
    key_text(e, a, b, what, sizeof what);
    int n = snprintf(line, sizeof line, "%s: %s%s (", what, path_name(cand[best]),
                     other_bits ? ", as 1 thread gives other bits here" : "");
    for (int c = 0; c < nc && n > 0 && (size_t)n < sizeof line; c++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s%s %.1f us", c ? ", " : "",
                      cand[c] == PATH_DNNL ? "oneDNN" : cand[c] == PATH_DNNL_1 ? "oneDNN 1t"
                                                                                : "OpenBLAS 1t",
                      failed[c] ? -1.0 : med[c]);
    if (n > 0 && (size_t)n < sizeof line) snprintf(line + n, sizeof line - (size_t)n, ")");
    em_log_write(EM_LOG_INFO, "ember-cpu: GEMM autotune, %d threads: %s", e->key.nt, line);
    pthread_mutex_lock(&G.lock);
    size_t len = strlen(line), room = sizeof G.why - 1 - G.why_len;
    const char *sep = G.n_tuned == 0 ? ". Autotuned: " : "; ";
    if (len + strlen(sep) + 32 <= room) { /* appended whole (the text read so far stays valid) */
        memcpy(G.why + G.why_len + strlen(sep), line, len + 1);
        memcpy(G.why + G.why_len, sep, strlen(sep));
        G.why_len += strlen(sep) + len;
    } else {
        G.n_unlisted++;
    }
    G.n_tuned++;
    pthread_mutex_unlock(&G.lock);
    __atomic_store_n(&e->choice, (int)cand[best], __ATOMIC_RELEASE);
    return cand[best];
}

#endif /* EM_HAVE_DNNL: autotuning */

#ifdef EM_HAVE_DNNL
/* A transposed f32 A operand (unit row stride: a weight gradient's g^T) with more than 512
 * rows, of a product of more than TUNE_MAX_WORK multiply-adds, is copied row-major first (a
 * oneDNN reorder): oneDNN 2.6's AVX2 gemm:jit multiplies a transposed A that tall slower than
 * a row-major one, and the copy costs less than it saves (1024x256x4096: ~79 -> ~70 CPU ms,
 * the copy included; with 256 rows there was nothing to gain; bench/README.md, "The
 * Transformer step on an AVX2-only CPU"). A fixed rule by layout and size, not by timing, so
 * every run of a shape takes the same path and gives the same bits; one batch (or a
 * batch-broadcast A) only. Only where oneDNN's ISA is below avx512_core (G.tn_copy): there its
 * matmul is gemm:jit; with AVX-512 it has brgemm kernels, for which the copy is not measured. */
static bool transpose_a(const mat3 *a, double work) {
    return G.tn_copy && work > TUNE_MAX_WORK && a->cs != 1 && a->rs == 1 && (a->B == 1 || a->s0 == 0) &&
           a->R > 512 && a->C > 1;
}

/* at = a (R, C, unit row stride) as a dense row-major (R, C), in kc's workspace, by a oneDNN
 * reorder on the call's threads (oneDNN's primitive cache keeps the primitive per shape).
 * RUN_NO: oneDNN could not do it (the product then takes a as it is). */
static run_result transposed_copy_f32(const em_kernel_ctx *kc, const mat3 *a, mat3 *at) {
    int64_t R = a->R, C = a->C;
    float *d = cpu_scratch(kc, (size_t)(R * C) * sizeof(float));
    if (!d) return RUN_FAILED;
    dnnl_dims_t dims = {R, C}, s_src = {1, a->cs}, s_dst = {C, 1};
    dnnl_memory_desc_t ms, md;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    dnnl_memory_t m_src = NULL, m_dst = NULL;
    cpu_ctx *c = cpu_ctx_of(kc);
    dnnl_stream_t s = stream_take(c);
    bool done = s && dnnl_memory_desc_init_by_strides(&ms, 2, dims, dnnl_f32, s_src) == dnnl_success &&
                dnnl_memory_desc_init_by_strides(&md, 2, dims, dnnl_f32, s_dst) == dnnl_success &&
                dnnl_reorder_primitive_desc_create(&pd, &ms, G.engine, &md, G.engine, NULL) ==
                    dnnl_success &&
                dnnl_primitive_create(&p, pd) == dnnl_success &&
                dnnl_memory_create(&m_src, &ms, G.engine, a->data) == dnnl_success &&
                dnnl_memory_create(&m_dst, &md, G.engine, d) == dnnl_success;
    if (done) {
        int prev = omp_get_max_threads(), nt = cpu_threads(kc);
        if (prev != nt) omp_set_num_threads(nt);
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, m_src}, {DNNL_ARG_TO, m_dst}};
        done = dnnl_primitive_execute(p, s, 2, args) == dnnl_success &&
               dnnl_stream_wait(s) == dnnl_success;
        if (prev != nt) omp_set_num_threads(prev);
    }
    if (m_src) dnnl_memory_destroy(m_src);
    if (m_dst) dnnl_memory_destroy(m_dst);
    if (p) dnnl_primitive_destroy(p);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (s) stream_put(c, s);
    if (!done) return RUN_NO;
    *at = (mat3){.data = (char *)d, .B = a->B, .R = R, .C = C, .s0 = 0, .rs = C, .cs = 1};
    return RUN_DONE;
}
#endif

/* ---- the engine -------------------------------------------------------------------------------- */

static em_status gemm_f32_path(const em_kernel_ctx *kc, em_dtype dt, const mat3 *a,
                               const mat3 *b, const mat3 *y, double alpha, double beta);

#ifdef EM_HAVE_DNNL
/* y = alpha a b + beta y, f32, where oneDNN is the f32 library: tuned per key (see the top). */
static run_result gemm_f32_onednn(const em_kernel_ctx *kc, const mat3 *a, const mat3 *b,
                                  const mat3 *y, double alpha, double beta, const row_bias *rb,
                                  double work) {
    mm_key k = make_key(dnnl_f32, a, b, y, alpha, beta, rb != NULL, cpu_threads(kc));
    bool owned;
    mm_entry *e = entry_get(&k, &owned);
    if (!e) return RUN_NO;
    gemm_path path = PATH_DNNL;
    if (G.autotune && !owned && e->prim && work <= TUNE_MAX_WORK && !em_deterministic()) {
        path = G.forced_path ? G.forced_path
                             : (gemm_path)__atomic_load_n(&e->choice, __ATOMIC_ACQUIRE);
        if (path == PATH_UNDECIDED)
            path = __atomic_exchange_n(&e->tuning, 1, __ATOMIC_ACQ_REL) == 0
                       ? tune(kc, e, a, b, y, alpha, beta, rb)
                       : PATH_DNNL; /* another thread is measuring this key */
    }
    run_result done = run_path(kc, path, e, a, b, y, alpha, beta, rb, NULL);
    if (owned) entry_free(e);
    return done;
}

#endif /* EM_HAVE_DNNL: f32 on oneDNN */

/* y = alpha a b + beta y; with rb (f32 and native bf16 only; alpha 1, beta 1): y = a b + the
 * bias row, y not read. */
static em_status gemm_mat3(const em_kernel_ctx *kc, em_dtype dt, const mat3 *a, const mat3 *b,
                           const mat3 *y, double alpha, double beta, const row_bias *rb) {
    if (dt == EM_F16 || (dt == EM_BF16 && !G.bf16_native)) {
        if (rb) fill_rows(dt, y, rb);
        return gemm_f32_path(kc, dt, a, b, y, alpha, beta);
    }
    double work = (double)y->B * (double)y->R * (double)y->C * (double)a->C;
#ifdef EM_HAVE_DNNL
    if (dt == EM_BF16) {
        run_result r = onednn_gemm(kc, dnnl_bf16, a, b, y, alpha, beta, rb ? rb->data : NULL);
        if (r != RUN_NO) return r == RUN_DONE ? EM_OK : em_last_status();
        if (rb) fill_rows(dt, y, rb);
        return gemm_f32_path(kc, dt, a, b, y, alpha, beta);
    }
    if (dt == EM_F32 && G.f32 == LIB_ONEDNN && work > SMALL_GEMM) {
        mat3 at;
        if (transpose_a(a, work)) {
            run_result t = transposed_copy_f32(kc, a, &at);
            if (t == RUN_FAILED) return em_last_status();
            if (t == RUN_DONE) a = &at;
        }
        run_result r = gemm_f32_onednn(kc, a, b, y, alpha, beta, rb, work);
        if (r != RUN_NO) return r == RUN_DONE ? EM_OK : em_last_status();
    }
#endif
    if (rb) fill_rows(dt, y, rb), beta = 1.0;
    /* Small f32 products run on the calling thread (they are below OpenBLAS's own threading
     * threshold anyway); the rest (f64, f32 where oneDNN declined) on every thread. */
    blas_gemm(dt, a, b, y, alpha, beta, dt == EM_F32 && work <= SMALL_GEMM ? 1 : cpu_threads(kc));
    return EM_OK;
}

/* bf16/f16: convert to f32, multiply, round once into y. */
static em_status gemm_f32_path(const em_kernel_ctx *kc, em_dtype dt, const mat3 *a,
                               const mat3 *b, const mat3 *y, double alpha, double beta) {
    mat3 fa, fb, fy;
    void *sy = NULL;
    em_status st = dense_copy(kc, a, dt, EM_F32, &fa);
    if (st == EM_OK) st = dense_copy(kc, b, dt, EM_F32, &fb);
    if (st == EM_OK) {
        if (beta != 0) {
            st = dense_copy(kc, y, dt, EM_F32, &fy);
            sy = fy.data;
        } else {
            sy = cpu_scratch(kc, (size_t)(y->B * y->R * y->C) * 4);
            if (!sy) st = em_last_status();
            fy = (mat3){.data = sy, .B = y->B, .R = y->R, .C = y->C, .s0 = y->R * y->C,
                        .rs = y->C > 1 ? y->C : 1, .cs = 1};
        }
    }
    if (st == EM_OK) st = gemm_mat3(kc, EM_F32, &fa, &fb, &fy, alpha, beta, NULL);
    if (st == EM_OK) {
        const float *src = (const float *)sy;
        size_t e = em_dtype_size(dt);
        for (int64_t bi = 0; bi < y->B; bi++)
            for (int64_t i = 0; i < y->R; i++)
                for (int64_t j = 0; j < y->C; j++)
                    store(dt, y->data + (bi * y->s0 + i * y->rs + j * y->cs) * (int64_t)e, *src++);
    }
    return st;
}

/* The GEMM of a, b into y, after copying operands GEMM cannot take as they are. */
static em_status gemm_ktensors(const em_kernel_ctx *kc, const em_ktensor *a, const em_ktensor *b,
                               const em_ktensor *y, double alpha, double beta,
                               const row_bias *rb) {
    em_dtype dt = y->dtype;
    mat3 ma = mat3_of(a), mb = mat3_of(b), my = mat3_of(y);
    if (my.B == 0 || my.R == 0 || my.C == 0) return EM_OK;
    if (ma.C == 0) {
        if (rb) fill_rows(dt, &my, rb);
        else scale_y(dt, &my, beta);
        return EM_OK;
    }
    em_status st = EM_OK;
    if (!gemm_layout(&ma)) st = dense_copy(kc, &ma, dt, dt, &ma);
    if (st == EM_OK && !gemm_layout(&mb)) st = dense_copy(kc, &mb, dt, dt, &mb);
    if (st == EM_OK) st = gemm_mat3(kc, dt, &ma, &mb, &my, alpha, beta, rb);
    return st;
}

em_status cpu_gemm(const em_kernel_ctx *kc, const em_ktensor *a, const em_ktensor *b,
                   const em_ktensor *y, double alpha, double beta) {
    return gemm_ktensors(kc, a, b, y, alpha, beta, NULL);
}

/* y (M, N) = bias (M, N, stride 0 on broadcast dims), element by element. */
static void copy_bias(const em_ktensor *bias, const em_ktensor *y) {
    size_t e = em_dtype_size(y->dtype);
    int64_t M = y->shape[0], N = y->shape[1];
    for (int64_t i = 0; i < M; i++) {
        const char *src = (const char *)bias->data + i * bias->strides[0] * (int64_t)e;
        char *dst = (char *)y->data + i * y->strides[0] * (int64_t)e;
        int64_t cs = bias->strides[1];
        if (cs == 1) {
            memcpy(dst, src, (size_t)N * e);
        } else if (e == 4) {
            for (int64_t j = 0; j < N; j++) ((uint32_t *)dst)[j] = *(const uint32_t *)(src + j * cs * 4);
        } else if (e == 8) {
            for (int64_t j = 0; j < N; j++) ((uint64_t *)dst)[j] = *(const uint64_t *)(src + j * cs * 8);
        } else {
            for (int64_t j = 0; j < N; j++) ((uint16_t *)dst)[j] = *(const uint16_t *)(src + j * cs * 2);
        }
    }
}

em_status cpu_gemm_addmm(const em_kernel_ctx *kc, const em_ktensor *bias, const em_ktensor *a,
                         const em_ktensor *b, const em_ktensor *y, double alpha, double beta) {
    if (beta == 0) return cpu_gemm(kc, a, b, y, alpha, 0.0);
    /* linear's bias: one row broadcast down the rows, added once (oneDNN's bias argument). A
     * bias with a column stride other than 1 is copied (rarely: a strided view). */
    int64_t M = y->shape[0], N = y->shape[1];
    bool row = (bias->strides[0] == 0 || M <= 1) && (bias->strides[1] == 1 || N <= 1);
    if (row && alpha == 1.0 && beta == 1.0 && (y->dtype == EM_F32 || y->dtype == EM_BF16)) {
        row_bias rb = {.data = bias->data, .cs = 1};
        return gemm_ktensors(kc, a, b, y, 1.0, 1.0, &rb);
    }
    copy_bias(bias, y);
    return cpu_gemm(kc, a, b, y, alpha, beta);
}

/* ---- bmm ------------------------------------------------------------------------------------------ */

static em_status k_bmm(const em_kernel_ctx *k) {
    return cpu_gemm(k, &k->in[0], &k->in[1], &k->out[0], 1.0, 0.0);
}

em_status cpu_register_matmul(em_registry *r) {
    em_status st = cpu_gemm_init();
    static const em_dtype dts[] = {EM_F32, EM_F64, EM_BF16, EM_F16};
    for (int i = 0; i < 4 && st == EM_OK; i++) {
        char name[32];
        snprintf(name, sizeof name, "cpu_bmm_%s", em_dtype_name(dts[i]));
        em_kernel_def def = {.struct_size = sizeof def, .op = "bmm", .device_type = "cpu",
                             .dtype = dts[i], .fn = k_bmm, .supports = cpu_gemm_supports,
                             .name = name};
        st = em_kernel_register(r, &def, NULL);
    }
    return st;
}

/* GEMM needs its output row-major with unit column stride (what the core allocates). */
bool cpu_gemm_supports(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0];
    int n = y->ndim;
    return (y->strides[n - 1] == 1 || y->shape[n - 1] <= 1) &&
           (y->shape[n - 2] <= 1 || y->strides[n - 2] >= y->shape[n - 1]);
}
