/*
 * cpu.h — shared declarations of the CPU backend plugin (ember-cpu.so).
 *
 * The plugin registers the "cpu" device type and the CPU kernels of the standard ops. Each
 * op family lives in its own file and exposes one registration function called from cpu.c.
 * Kernels receive em_ktensor views (ember/dispatch.h): data pointer, shape, strides in
 * elements (0 on broadcast dims), so every kernel handles strided and broadcast inputs; a
 * contiguous fast path is taken when all operands are contiguous.
 */
#ifndef EMBER_CPU_H
#define EMBER_CPU_H

#include <pthread.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/op_helpers.h"

/* Loops the compiler vectorises (`omp simd`) are built for AVX-512, AVX2 and baseline x86-64
 * and picked at load time by the CPU (glibc's ifunc): the default -O2 build targets SSE2. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SIMD_CLONES
#endif

/* ---- settings and execution contexts (cpu.c) ------------------------------------------------- */

/* The backend's thread count, its own setting (named functions "num_threads",
 * "set_num_threads", "num_threads_reason": em_backend_proc). */
int cpu_num_threads(void);

/* Idle oneDNN streams a context keeps (more in use at once are made and destroyed per call). */
#define CPU_CTX_IDLE 64

/* The CPU's execution context (em_exec_ctx.backend), one per (device, stream): the thread
 * count the kernels run on (set_num_threads updates every live context) and the library
 * handles — oneDNN streams, one per concurrent GEMM (a oneDNN stream is not for two threads
 * at once), taken and given back by cpu_matmul.c. */
typedef struct cpu_ctx {
    _Atomic int threads;
    struct cpu_ctx *next;         /* the backend's list of live contexts */
    pthread_mutex_t lock;         /* guards idle */
    void *idle[CPU_CTX_IDLE];     /* dnnl_stream_t, idle */
    int n_idle;
} cpu_ctx;

/* The context of kernel call k (NULL from a core without contexts). */
static inline cpu_ctx *cpu_ctx_of(const em_kernel_ctx *k) {
    return EM_KCTX_HAS_EXEC(k) && k->exec ? (cpu_ctx *)k->exec->backend : NULL;
}
/* The threads kernel call k may use: its context's. */
static inline int cpu_threads(const em_kernel_ctx *k) {
    const cpu_ctx *c = cpu_ctx_of(k);
    return c ? __atomic_load_n(&c->threads, __ATOMIC_RELAXED) : cpu_num_threads();
}
/* Scratch for kernel call k (em_kernel_workspace: the caching allocator, category workspace,
 * handed back when the kernel returns; never freed by the caller). NULL, with the error set
 * naming the op, when out of memory. */
static inline void *cpu_scratch(const em_kernel_ctx *k, size_t nbytes) {
    void *p;
    return em_kernel_workspace(k, nbytes, &p) == EM_OK ? p : NULL;
}
/* Give back a context's idle oneDNN streams (cpu_matmul.c; context destroy). */
void cpu_ctx_release_handles(cpu_ctx *c);
/* With oneDNN (cpu_matmul.c): the plugin's one oneDNN CPU engine (dnnl_engine_t, made at
 * registration, destroyed at plugin shutdown after the nn family's primitives), and a oneDNN
 * stream of context c for one call (dnnl_stream_t; NULL: none could be made), given back with
 * cpu_dnnl_stream_put. c NULL: a stream for that call alone. */
void *cpu_dnnl_engine(void);
void *cpu_dnnl_stream_take(cpu_ctx *c);
void cpu_dnnl_stream_put(cpu_ctx *c, void *s);

/* Registration of each op family (cpu_*.c). */
em_status cpu_register_elementwise(em_registry *r);
em_status cpu_register_reduce(em_registry *r);
em_status cpu_register_matmul(em_registry *r);
em_status cpu_register_random(em_registry *r);
/* Bernoulli decisions from the 4-per-block Philox stream (ember/random.h) at block `offset`:
 * keep[j] = (w >> 8) < t for the word w of stream element e0 + j, j < n; with
 * t = cpu_philox_threshold(p) that is em_philox_uniform_f32(seed, offset, e0 + j) < p.
 * AVX-512 where the CPU has it (cpu_random.c). */
void cpu_philox_keep(uint64_t seed, uint64_t offset, uint64_t e0, int64_t n, uint32_t t,
                     uint8_t *keep);
uint32_t cpu_philox_threshold(double p); /* ceil(p 2^24) for p in [0, 1] */
em_status cpu_register_math(em_registry *r);
em_status cpu_register_nn(em_registry *r);
em_status cpu_register_attention(em_registry *r); /* cpu_attention.c */
em_status cpu_register_rnn(em_registry *r);       /* cpu_rnn.c */
/* The vector f32 cells of one batch row of one RNN step (cpu_rnn_simd.c; with libmvec,
 * EM_HAVE_LIBMVEC from config.h; AVX-512 or AVX2+FMA): call them only when cpu_rnn_simd_ok().
 * Same arguments and results as the scalar loops of cpu_rnn_loops.h (gr the row's workspace,
 * activations out; xr/hr/bias the parts of the LSTM's pre-activations, the GRU's gr its input
 * side and hr its hidden side; c/h/y the row's state and output (H)); the backward takes gy
 * (H) or NULL, updates dh/dc (H) and writes the pre-activation gradients d (4H). */
#if defined(EM_HAVE_LIBMVEC) && defined(__x86_64__)
#define CPU_RNN_SIMD 1
bool cpu_nn_has_avx512(void); /* cpu_nn_simd.c (also in cpu_nn.h) */
bool cpu_nn_has_avx2(void);   /* AVX2 and FMA; cpu_nn_simd.c (also in cpu_nn.h) */
bool cpu_rnn_simd_ok(void);   /* this CPU has AVX-512, or AVX2 and FMA */
void cpu_rnn_lstm_cell_f32(float *gr, const float *xr, const float *hr, const float *bias,
                           float *c, float *h, float *y, int64_t H);
void cpu_rnn_lstm_cell_bwd_f32(const float *gr, const float *gy, float *dh, float *dc,
                               float *d, int64_t H);
void cpu_rnn_gru_cell_f32(float *gr, const float *hr, float *h, float *y, int64_t H);
/* The same cells on the hidden units [j0, j1) of the row alone (j0 a multiple of 16), the
 * forward reading the previous hidden state from hin and writing the new one to hout. */
void cpu_rnn_lstm_cell_part_f32(float *gr, const float *xr, const float *hr, const float *bias,
                                float *c, const float *hin, float *hout, float *y, int64_t H,
                                int64_t j0, int64_t j1);
void cpu_rnn_lstm_cell_bwd_part_f32(const float *gr, const float *gy, float *dh, float *dc,
                                    float *d, int64_t H, int64_t j0, int64_t j1);
/* The one-thread recurrent product of the LSTM's parallel time loop (cpu_rnn_simd.c):
 * cpu_rnn_panel_width is 16 where the CPU has AVX-512 (0: no such kernel). cpu_rnn_pack_f32
 * packs the n columns of b (K, n; element (k, j) at b[k bs0 + j bs1]) into ceil(n / 16)
 * panels of K x 16 floats at p. cpu_rnn_mm_f32: for each of `groups` groups of such panels
 * (one after another at p, each of n columns), c[m, g gstride + j] = (c[...] +) sum over k of
 * a[m lda + k] times column j of the group, m < M, j < n; each element summed in one fixed
 * order (chunks of 512 of k, each an FMA chain), the same bits however the columns are
 * split. */
int cpu_rnn_panel_width(void);
void cpu_rnn_pack_f32(float *p, const float *b, int64_t K, int64_t bs0, int64_t bs1, int64_t n);
void cpu_rnn_mm_f32(const float *a, int64_t lda, int64_t M, int64_t K, const float *p,
                    int64_t groups, int64_t n, int64_t gstride, float *c, int64_t ldc,
                    bool accumulate);
#else
#define CPU_RNN_SIMD 0
#endif
/* Every operand of kernel call k contiguous, or EM_ERR_INVALID naming the strided one (the
 * nn kernels' contract: the public functions make operands contiguous). cpu_nn.c. */
em_status cpu_check_dense(const em_kernel_ctx *k);
em_status cpu_register_loss(em_registry *r);
em_status cpu_register_data(em_registry *r);
em_status cpu_register_linalg(em_registry *r);
em_status cpu_register_optim(em_registry *r);
/* Plugin shutdown of the nn family (cpu_nn.c): frees the oneDNN primitive cache. */
void cpu_shutdown_nn(void);


/* GEMM (cpu_matmul.c), for kernel call k (its threads, oneDNN streams and workspace):
 * y = alpha a b + beta y for a (M, K) / (B, M, K), b (K, N) / (B, K, N)
 * and y (M, N) / (B, M, N), all of y's dtype (f32, f64, bf16, f16; bf16 and f16 accumulate
 * in f32). a and b may have any strides (transposed ones go to GEMM as they are, other
 * layouts are copied); y needs a unit column stride (cpu_gemm_supports checks a kernel's
 * output 0). beta == 0: y is not read. The library that runs it is chosen once, at
 * registration, and per shape at its first call (autotuning, see cpu_matmul.c);
 * cpu_gemm_describe() says which and why. */
em_status cpu_gemm(const em_kernel_ctx *k, const em_ktensor *a, const em_ktensor *b,
                   const em_ktensor *y, double alpha, double beta);
/* addmm: y (M, N) = beta bias + alpha a b, bias broadcast to (M, N) (stride 0 on broadcast
 * dims) and not overlapping y. A bias broadcast down the rows with alpha = beta = 1 (linear's)
 * goes to oneDNN as its bias argument for f32 and bf16; otherwise it is copied into y first. */
em_status cpu_gemm_addmm(const em_kernel_ctx *k, const em_ktensor *bias, const em_ktensor *a,
                         const em_ktensor *b, const em_ktensor *y, double alpha, double beta);
bool cpu_gemm_supports(const em_kernel_ctx *k);
const char *cpu_gemm_describe(void);
/* Set OpenBLAS to run on its calling thread (the thread count the next cpu_gemm sets back
 * as it needs): for kernels that call cblas_*gemm from their own OpenMP threads
 * (cpu_attention.c), each product then runs where it is called, and its bits do not depend on
 * OpenBLAS's thread count. */
void cpu_blas_one_thread(void);
em_status cpu_gemm_init(void);
void cpu_gemm_shutdown(void); /* frees the oneDNN primitive cache (plugin shutdown) */

/* Register `fn` for op on the CPU for each dtype in dts (n of them), named name_<dtype>. */
em_status cpu_register_kernels(em_registry *r, const char *op, const em_dtype *dts, int n,
                               em_kernel_fn fn, const char *name);
/* The same with a supports() (NULL: none) and the storage layouts fn reads and writes
 * (em_kernel_def.accepts_layouts; 0: plain only). */
em_status cpu_register_kernels_ex(em_registry *r, const char *op, const em_dtype *dts, int n,
                                  em_kernel_fn fn, const char *name, em_kernel_supports_fn sup,
                                  unsigned accepts);
/* A supports() for kernels that run one loop over the bytes of every operand (elementwise,
 * equal shapes): every tensor of the call in the same storage layout. */
bool cpu_same_layouts(const em_kernel_ctx *k);
/* The bit of the nChw16c storage layout in accepts_layouts. */
#define CPU_NCHW16C (1u << EM_LAYOUT_NCHW16C)

/* Element offset of linear index `lin` (C order over shape) given strides. */
static inline int64_t cpu_offset(int ndim, const int64_t *shape, const int64_t *strides,
                                 int64_t lin) {
    return em_strided_offset(ndim, shape, strides, lin); /* ember/op_helpers.h */
}

/* The element-iteration engine. fn is called on runs of n elements along the innermost dim
 * (after merging dims that are contiguous for every operand), with one byte pointer and one
 * byte stride per operand. All operands have the shape of ts[0]. Work is split across
 * kernel call k's threads (cpu_threads) when there are at least `grain` elements (0: never
 * split); the split never changes results because each element is computed independently. */
typedef void (*cpu_loop_fn)(char **ptrs, const int64_t *strides, int64_t n, void *ctx);
void cpu_foreach(const em_kernel_ctx *k, int nops, const em_ktensor *const *ts, cpu_loop_fn fn,
                 void *ctx, int64_t grain);

static inline int64_t cpu_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* A drawing op's Philox origin: its attributes seed (index is) and offset (is + 1), or, when
 * the seed is absent and the offset given (the call recorded in a graph capture), the seed
 * and base offset the capture's generator state holds, plus the offset attribute
 * (em_kernel_generator_state, ember/dispatch.h: host memory on a host device; the CPU records
 * no graph, so there it is that function's error). */
static inline em_status cpu_rng_origin(const em_kernel_ctx *k, int is, uint64_t *seed /* out */,
                                       uint64_t *offset /* out */) {
    const em_attr *a = k->attrs;
    *seed = a[is].type == EM_ATTR_INT ? (uint64_t)a[is].v.i : 0;
    *offset = a[is + 1].type == EM_ATTR_INT ? (uint64_t)a[is + 1].v.i : 0;
    if (a[is].type != EM_ATTR_NONE || a[is + 1].type != EM_ATTR_INT) return EM_OK;
    const uint64_t *st = em_kernel_generator_state(k);
    if (!st) return em_last_status();
    *seed = st[0];
    *offset += st[1];
    return EM_OK;
}

/* Elements below which an elementwise op stays on one thread. */
#define CPU_GRAIN 32768
/* The same for the cheapest, memory-bound loops (a load or two and a store per element: add,
 * sub, mul, div, neg, relu and its backward; column sums). A parallel region whose worker
 * sleeps (OMP_WAIT_POLICY=passive, Ember's default) costs the wake-ups, which on the 2-core
 * VM of bench/README.md measured 40-80 us per region, while one thread does relu on 65536
 * floats in 6 us and on 1M in 87 us (2 threads: 20 and 75-113 us), and sums the columns of a
 * (128, 512) f32 matrix in 9 us (2 threads: 31-37 us; at (2048, 512) 133 against 99 us). */
#define CPU_GRAIN_MEM (1 << 18)

/* Scalar conversions used by every kernel that touches f16/bf16. The bf16 pair repeats
 * em_bf16_to_f32 / em_f32_to_bf16 (core/dtype.c: NaN quieted, round to nearest even) inline:
 * a call into libember per element cost ~5 ns and kept the loops from vectorising. */
static inline float cpu_h2f(uint16_t h) { return em_f16_to_f32(h); }
static inline uint16_t cpu_f2h(float f) { return em_f32_to_f16(f); }
static inline float cpu_b2f(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
static inline uint16_t cpu_f2b(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#endif /* EMBER_CPU_H */
