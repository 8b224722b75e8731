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
 * oneDNN primitives are created once per shape/layout and cached (keyed by dtype, dims,
 * strides, alpha and beta), under a mutex; each thread executes on its own stream. Everything
 * is freed by cpu_gemm_shutdown() when the plugin unloads.
 *
 * Threads: oneDNN runs on GNU OpenMP, like the rest of the plugin; it is given
 * em_num_threads() threads. OpenBLAS (its pthread build, Debian's default) only runs f64 and
 * is set to em_num_threads() before each call, so the two pools never both compute at once.
 */
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* ---- the decision ------------------------------------------------------------------------------- */

typedef enum gemm_lib { LIB_OPENBLAS = 0, LIB_ONEDNN = 1 } gemm_lib;

/* A (B, R, C) matrix batch as GEMM sees it: byte pointer, element strides. */
typedef struct mat3 {
    char *data;
    int64_t B, R, C;
    int64_t s0, rs, cs;
} mat3;

typedef struct mm_key {
    int dt;
    int64_t dims[3][3];    /* a, b, y: (B, R, C) (B is 1 for a batch-broadcast operand) */
    int64_t strides[3][3];
    double alpha, beta;
} mm_key;

typedef struct mm_entry {
    mm_key key;
    dnnl_primitive_t prim; /* NULL: oneDNN has only a reference kernel here; use the fallback */
    dnnl_memory_desc_t md[3];
    struct mm_entry *next;
} mm_entry;

/* Up to this many multiply-adds (B M N K) an f32 GEMM goes to OpenBLAS whatever the choice:
 * oneDNN's fixed cost per call (~2 us: memory objects, stream, an OpenMP region) is more than
 * the work, and below this size OpenBLAS 0.3.21 computes on the calling thread alone (its
 * multithreading threshold is 65536 * 4), so its thread pool never wakes. Measured here:
 * 64^3 takes 6.8 us in OpenBLAS, 12 us in oneDNN; 96^3 takes 41 us in oneDNN, 60-85 in
 * OpenBLAS. */
#define SMALL_GEMM (64.0 * 64.0 * 64.0)

#define MM_BUCKETS 256
#define MM_MAX_ENTRIES 4096

static struct {
    bool ready;
    gemm_lib f32;
    bool bf16_native;
    char why[640];
    pthread_mutex_t lock;
    dnnl_engine_t engine;
    mm_entry *buckets[MM_BUCKETS];
    int n_entries;
    dnnl_stream_t *streams; /* every thread's stream, to destroy at shutdown */
    int n_streams, cap_streams;
    unsigned generation;    /* bumped at shutdown: threads re-create their streams */
    int blas_threads;
} G = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread dnnl_stream_t tls_stream;
static __thread unsigned tls_generation;

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

const char *cpu_gemm_describe(void) { return G.ready ? G.why : "GEMM engine not initialised"; }

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
    const char *how = dnnl_avx2 ? "oneDNN's JIT has AVX2 or better here (OpenBLAS's kernels "
                                  "depend on whether it knows this CPU)"
                                : "oneDNN's JIT lacks AVX2 here";
    const char *env = getenv("EMBER_GEMM");
    if (env && strcmp(env, "openblas") == 0) G.f32 = LIB_OPENBLAS, how = "EMBER_GEMM=openblas";
    if (env && strcmp(env, "onednn") == 0) G.f32 = LIB_ONEDNN, how = "EMBER_GEMM=onednn";
    snprintf(G.why, sizeof G.why,
             "f32 GEMM: %s (%s; up to 64^3 OpenBLAS on one thread); f64: OpenBLAS; bf16: %s; f16: through f32. oneDNN %d.%d.%d "
             "isa %s, OpenBLAS core %s",
             G.f32 == LIB_ONEDNN ? "oneDNN matmul" : "OpenBLAS sgemm", how,
             G.bf16_native ? "oneDNN matmul, native (f32 accumulation)"
                           : "through f32 (no bf16 instructions for oneDNN here)",
             v->major, v->minor, v->patch, isa_name(isa), core ? core : "?");
    G.blas_threads = 0;
    G.ready = true;
    em_log_write(EM_LOG_INFO, "ember-cpu: %s", G.why);
    return EM_OK;
}

void cpu_gemm_shutdown(void) {
    pthread_mutex_lock(&G.lock);
    for (int i = 0; i < MM_BUCKETS; i++) {
        for (mm_entry *e = G.buckets[i], *nx; e; e = nx) {
            nx = e->next;
            if (e->prim) dnnl_primitive_destroy(e->prim);
            free(e);
        }
        G.buckets[i] = NULL;
    }
    G.n_entries = 0;
    for (int i = 0; i < G.n_streams; i++) dnnl_stream_destroy(G.streams[i]);
    free(G.streams);
    G.streams = NULL;
    G.n_streams = G.cap_streams = 0;
    G.generation++;
    if (G.engine) dnnl_engine_destroy(G.engine);
    G.engine = NULL;
    G.ready = false;
    pthread_mutex_unlock(&G.lock);
}

/* ---- oneDNN ----------------------------------------------------------------------------------- */

static dnnl_stream_t thread_stream(void) {
    if (tls_stream && tls_generation == G.generation) return tls_stream;
    dnnl_stream_t s = NULL;
    pthread_mutex_lock(&G.lock);
    if (G.n_streams == G.cap_streams) {
        int cap = G.cap_streams ? 2 * G.cap_streams : 8;
        dnnl_stream_t *p = realloc(G.streams, sizeof *p * (size_t)cap);
        if (p) G.streams = p, G.cap_streams = cap;
    }
    if (G.n_streams < G.cap_streams &&
        dnnl_stream_create(&s, G.engine, dnnl_stream_default_flags) == dnnl_success)
        G.streams[G.n_streams++] = s;
    else
        s = NULL;
    tls_generation = G.generation;
    pthread_mutex_unlock(&G.lock);
    tls_stream = s;
    return s;
}

static uint64_t key_hash(const mm_key *k) {
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void md_of(const mat3 *m, int64_t *dims, int64_t *strides) {
    dims[0] = m->s0 == 0 ? 1 : m->B, dims[1] = m->R, dims[2] = m->C;
    strides[1] = m->rs, strides[2] = m->cs;
    /* A size-1 batch's stride is arbitrary; give the dense one. */
    strides[0] = dims[0] == 1 ? (m->cs == 1 ? m->R * m->rs : m->C * m->cs) : m->s0;
}

/* Create the primitive for key k; entry->prim stays NULL when only a reference kernel exists
 * (or oneDNN refuses the layout), which sends the call to the fallback. */
static void entry_create(mm_entry *e, dnnl_data_type_t dt) {
    const mm_key *k = &e->key;
    for (int i = 0; i < 3; i++) {
        dnnl_dims_t d = {0}, st = {0}; /* the API reads whole DNNL_MAX_NDIMS arrays */
        memcpy(d, k->dims[i], sizeof k->dims[i]);
        memcpy(st, k->strides[i], sizeof k->strides[i]);
        if (dnnl_memory_desc_init_by_strides(&e->md[i], 3, d, dt, st) != dnnl_success) return;
    }
    dnnl_matmul_desc_t mmd;
    if (dnnl_matmul_desc_init(&mmd, &e->md[0], &e->md[1], NULL, &e->md[2]) != dnnl_success)
        return;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    bool ok = dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && k->alpha != 1.0) {
        float s = (float)k->alpha;
        ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &s) == dnnl_success;
    }
    if (ok && k->beta != 0.0) {
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_sum(po, (float)k->beta) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    }
    dnnl_primitive_desc_t pd = NULL;
    if (ok && dnnl_primitive_desc_create(&pd, &mmd, attr, G.engine, NULL) == dnnl_success) {
        const char *impl = NULL;
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        if (impl && strncmp(impl, "ref", 3) != 0 && dnnl_primitive_create(&e->prim, pd) != dnnl_success)
            e->prim = NULL;
        dnnl_primitive_desc_destroy(pd);
    }
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
}

/* Run y = alpha a b + beta y through oneDNN. Returns false when oneDNN has no fast kernel for
 * this call (nothing was written). */
static bool onednn_gemm(dnnl_data_type_t dt, const mat3 *a, const mat3 *b, const mat3 *y,
                      double alpha, double beta) {
    mm_key k;
    memset(&k, 0, sizeof k); /* padding too: the key is hashed and compared as bytes */
    k.dt = (int)dt;
    md_of(a, k.dims[0], k.strides[0]);
    md_of(b, k.dims[1], k.strides[1]);
    md_of(y, k.dims[2], k.strides[2]);
    k.alpha = alpha, k.beta = beta;
    uint64_t h = key_hash(&k) % MM_BUCKETS;
    pthread_mutex_lock(&G.lock);
    mm_entry *e = G.buckets[h];
    while (e && memcmp(&e->key, &k, sizeof k) != 0) e = e->next;
    bool owned = false; /* a one-off entry when the cache is full */
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e) {
            pthread_mutex_unlock(&G.lock);
            return false;
        }
        e->key = k;
        entry_create(e, dt);
        if (G.n_entries < MM_MAX_ENTRIES) {
            e->next = G.buckets[h];
            G.buckets[h] = e;
            G.n_entries++;
        } else {
            owned = true;
        }
    }
    pthread_mutex_unlock(&G.lock);
    bool done = false;
    dnnl_stream_t s = e->prim ? thread_stream() : NULL;
    dnnl_memory_t m[3] = {NULL, NULL, NULL};
    const mat3 *ops[3] = {a, b, y};
    bool ok = s != NULL;
    for (int i = 0; i < 3 && ok; i++)
        ok = dnnl_memory_create(&m[i], &e->md[i], G.engine, ops[i]->data) == dnnl_success;
    if (ok) {
        int nt = em_num_threads();
        if (omp_get_max_threads() != nt) omp_set_num_threads(nt);
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]},
                                   {DNNL_ARG_DST, m[2]}};
        done = dnnl_primitive_execute(e->prim, s, 3, args) == dnnl_success &&
               dnnl_stream_wait(s) == dnnl_success;
    }
    for (int i = 0; i < 3; i++)
        if (m[i]) dnnl_memory_destroy(m[i]);
    if (owned) {
        if (e->prim) dnnl_primitive_destroy(e->prim);
        free(e);
    }
    return done;
}

/* ---- OpenBLAS ---------------------------------------------------------------------------------- */

static void blas_threads(void) {
    int nt = em_num_threads();
    if (G.blas_threads != nt) {
        openblas_set_num_threads(nt);
        G.blas_threads = nt;
    }
}

static void blas_gemm(em_dtype dt, const mat3 *a, const mat3 *b, const mat3 *y, double alpha,
                      double beta) {
    blas_threads();
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

/* A dense (B', R, C) copy of m in dtype dt_out (B' = 1 for a batch-broadcast operand). */
static em_status dense_copy(const mat3 *m, em_dtype dt_in, em_dtype dt_out, mat3 *out,
                            void **scratch) {
    int64_t nb = m->s0 == 0 ? 1 : m->B;
    size_t ei = em_dtype_size(dt_in), eo = em_dtype_size(dt_out);
    char *s = em_host_alloc((size_t)(nb * m->R * m->C) * eo + 1, 64);
    if (!s) return em_set_error(EM_ERR_NOMEM, "matmul: out of memory for a %lldx%lldx%lld "
                                "scratch copy", (long long)nb, (long long)m->R, (long long)m->C);
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
    *scratch = s;
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

/* ---- the engine -------------------------------------------------------------------------------- */

static em_status gemm_f32_path(em_dtype dt, const mat3 *a, const mat3 *b, const mat3 *y,
                               double alpha, double beta);

static em_status gemm_mat3(em_dtype dt, const mat3 *a, const mat3 *b, const mat3 *y,
                           double alpha, double beta) {
    if (dt == EM_F16 || (dt == EM_BF16 && !G.bf16_native))
        return gemm_f32_path(dt, a, b, y, alpha, beta);
    if (dt == EM_BF16) {
        if (onednn_gemm(dnnl_bf16, a, b, y, alpha, beta)) return EM_OK;
        return gemm_f32_path(dt, a, b, y, alpha, beta);
    }
    double work = (double)y->B * (double)y->R * (double)y->C * (double)a->C;
    if (dt == EM_F32 && G.f32 == LIB_ONEDNN && work > SMALL_GEMM &&
        onednn_gemm(dnnl_f32, a, b, y, alpha, beta))
        return EM_OK;
    blas_gemm(dt, a, b, y, alpha, beta);
    return EM_OK;
}

/* bf16/f16: convert to f32, multiply, round once into y. */
static em_status gemm_f32_path(em_dtype dt, const mat3 *a, const mat3 *b, const mat3 *y,
                               double alpha, double beta) {
    mat3 fa, fb, fy;
    void *sa = NULL, *sb = NULL, *sy = NULL;
    em_status st = dense_copy(a, dt, EM_F32, &fa, &sa);
    if (st == EM_OK) st = dense_copy(b, dt, EM_F32, &fb, &sb);
    if (st == EM_OK) {
        if (beta != 0) {
            st = dense_copy(y, dt, EM_F32, &fy, &sy);
        } else {
            sy = em_host_alloc((size_t)(y->B * y->R * y->C) * 4 + 1, 64);
            if (!sy) st = em_set_error(EM_ERR_NOMEM, "matmul: out of memory for an f32 result");
            fy = (mat3){.data = sy, .B = y->B, .R = y->R, .C = y->C, .s0 = y->R * y->C,
                        .rs = y->C > 1 ? y->C : 1, .cs = 1};
        }
    }
    if (st == EM_OK) st = gemm_mat3(EM_F32, &fa, &fb, &fy, alpha, beta);
    if (st == EM_OK) {
        const float *src = (const float *)sy;
        size_t e = em_dtype_size(dt);
        for (int64_t bi = 0; bi < y->B; bi++)
            for (int64_t i = 0; i < y->R; i++)
                for (int64_t j = 0; j < y->C; j++)
                    store(dt, y->data + (bi * y->s0 + i * y->rs + j * y->cs) * (int64_t)e, *src++);
    }
    em_host_free(sa);
    em_host_free(sb);
    em_host_free(sy);
    return st;
}

em_status cpu_gemm(const em_ktensor *a, const em_ktensor *b, const em_ktensor *y, double alpha,
                   double beta) {
    em_dtype dt = y->dtype;
    mat3 ma = mat3_of(a), mb = mat3_of(b), my = mat3_of(y);
    if (my.B == 0 || my.R == 0 || my.C == 0) return EM_OK;
    if (ma.C == 0) {
        scale_y(dt, &my, beta);
        return EM_OK;
    }
    void *sa = NULL, *sb = NULL;
    em_status st = EM_OK;
    if (!gemm_layout(&ma)) st = dense_copy(&ma, dt, dt, &ma, &sa);
    if (st == EM_OK && !gemm_layout(&mb)) st = dense_copy(&mb, dt, dt, &mb, &sb);
    if (st == EM_OK) st = gemm_mat3(dt, &ma, &mb, &my, alpha, beta);
    em_host_free(sa);
    em_host_free(sb);
    return st;
}

/* ---- bmm ------------------------------------------------------------------------------------------ */

static em_status k_bmm(const em_kernel_ctx *k) {
    return cpu_gemm(&k->in[0], &k->in[1], &k->out[0], 1.0, 0.0);
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
