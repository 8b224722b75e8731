/*
 * cpu.c — the CPU backend plugin: the "cpu" device (host memory through the core's
 * injectable host allocator, synchronous copies), its settings (the thread count, reached by
 * name through em_backend_proc) and execution contexts, the element-iteration engine shared
 * by the kernels, and the plugin's entry point.
 */
#include "config.h" /* EM_HAVE_DNNL */

#include <omp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/plugin.h"
#include "ember/tensor.h"
#include "ember/version.h"
#include "../../core/cpus.h" /* the default thread count (core/cpus.c is built into the plugin) */
#include "cpu.h"

/* ---- the device ---------------------------------------------------------------------------------- */

static int cpu_count(void) { return 1; }

static em_status cpu_properties(int index, em_device_props *p) {
    (void)index;
    snprintf(p->name, sizeof p->name, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (v) snprintf(p->name, sizeof p->name, "%s", v + 2);
        p->name[strcspn(p->name, "\n")] = '\0';
        break;
    }
    if (f) fclose(f);
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES),
         psize = sysconf(_SC_PAGESIZE);
    p->total_memory = pages > 0 && psize > 0 ? (size_t)pages * (size_t)psize : 0;
    p->free_memory = avail > 0 && psize > 0 ? (size_t)avail * (size_t)psize : 0;
    p->compute_units = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return EM_OK;
}

/* Tensor memory on transparent huge pages. oneDNN's AVX2 sgemm runs the MLP's products (every
 * M, N below ~500) through its no-copy kernels, which read the operands in place, a column
 * panel of B at a time across all K rows: with B's rows 2 KiB apart that is a page per two rows,
 * more pages than the first-level TLB holds, at every panel. On 4 KiB pages the same call then
 * ran 1.45-1.8 ms or 0.93 ms depending only on where the operand's pages sat in the address
 * space (the same physical pages moved with mremap: fast at one address, slow back at the
 * first; docs/performance.md, "fc2's weight gradient"); on a 2 MiB page it ran 0.92-0.99 ms
 * every time. So blocks of at least HP_MIN bytes live on 2 MiB-aligned memory advised
 * MADV_HUGEPAGE: blocks of more than HP_SMALL_MAX bytes each on their own (the caching
 * allocator's large blocks are whole multiples of 2 MiB), smaller ones carved in address order
 * from 2 MiB chunks, each chunk freed when its last block is. Every chunk and block still comes
 * from the injectable host allocator (em_host_alloc), so out-of-memory tests see its failures;
 * a host allocator that does not honour the 2 MiB alignment gets plain blocks. The caching
 * allocator hands blocks back only when its cache is emptied (or to retry after running out),
 * so a chunk kept alive by one block holds at most 2 MiB more than that block until then. Where the kernel has no transparent
 * huge pages for this process (`never`, or no MADV_HUGEPAGE) the advice is ignored and the
 * memory is what it was. EMBER_CPU_HUGEPAGES=0 turns this off (plain 64-byte-aligned blocks). */
#define HP_SIZE ((size_t)2 << 20)
#define HP_MIN ((size_t)64 << 10)
#define HP_SMALL_MAX ((size_t)1 << 20)
#define HP_CHUNKS 1024 /* chunks at once (2 GiB of small blocks); beyond that, plain blocks */

static struct {
    pthread_mutex_t lock;
    bool enabled; /* read once, when the plugin registers (hp_init) */
    int cur;     /* the chunk new small blocks are carved from; -1: none */
    int top;     /* one past the highest slot ever used: what a free scans */
    struct hp_chunk {
        char *base; /* NULL: a free slot */
        size_t used;
        int live;
    } chunk[HP_CHUNKS];
} HP = {PTHREAD_MUTEX_INITIALIZER, false, -1, 0, {{NULL, 0, 0}}};

static void hp_advise(void *p, size_t n) {
#ifdef MADV_HUGEPAGE
    if (n >= HP_SIZE) (void)madvise(p, n & ~(HP_SIZE - 1), MADV_HUGEPAGE);
#else
    (void)p, (void)n;
#endif
}

static void hp_init(void) {
    const char *v = getenv("EMBER_CPU_HUGEPAGES");
    HP.enabled = !(v && strcmp(v, "0") == 0);
}

/* A block of n (HP_MIN..HP_SMALL_MAX) bytes from a chunk, or NULL with nothing changed when no
 * chunk can be had (the caller then takes a plain block, which sets the error if that fails). */
static void *hp_small(size_t n) {
    n = (n + 63) & ~(size_t)63;
    void *p = NULL;
    pthread_mutex_lock(&HP.lock);
    struct hp_chunk *c = HP.cur >= 0 ? &HP.chunk[HP.cur] : NULL;
    if (!c || c->used + n > HP_SIZE) {
        int slot = -1;
        for (int i = 0; i < HP_CHUNKS && slot < 0; i++)
            if (!HP.chunk[i].base) slot = i;
        char *base = slot >= 0 ? em_host_alloc(HP_SIZE, HP_SIZE) : NULL;
        if (base && ((uintptr_t)base & (HP_SIZE - 1)) != 0) {
            em_host_free(base); /* the installed host allocator ignores the alignment */
            base = NULL;
        }
        c = NULL;
        if (base) {
            hp_advise(base, HP_SIZE);
            HP.chunk[slot] = (struct hp_chunk){base, 0, 0};
            HP.cur = slot;
            if (slot >= HP.top) HP.top = slot + 1;
            c = &HP.chunk[slot];
        }
    }
    if (c) {
        p = c->base + c->used;
        c->used += n;
        c->live++;
    }
    pthread_mutex_unlock(&HP.lock);
    return p;
}

/* True when ptr was a chunk's block (and is now given back). */
static bool hp_small_free(void *ptr) {
    char *base = (char *)((uintptr_t)ptr & ~(uintptr_t)(HP_SIZE - 1));
    bool found = false;
    pthread_mutex_lock(&HP.lock);
    for (int i = 0; i < HP.top && !found; i++) {
        struct hp_chunk *c = &HP.chunk[i];
        if (c->base != base) continue;
        found = true;
        if (--c->live == 0) {
            em_host_free(c->base);
            *c = (struct hp_chunk){NULL, 0, 0};
            if (HP.cur == i) HP.cur = -1;
        }
    }
    pthread_mutex_unlock(&HP.lock);
    return found;
}

static em_status cpu_alloc(int index, size_t nbytes, void **out) {
    (void)index;
    *out = NULL;
    if (nbytes >= HP_MIN && HP.enabled) {
        if (nbytes <= HP_SMALL_MAX) {
            *out = hp_small(nbytes);
        } else {
            *out = em_host_alloc(nbytes, HP_SIZE);
            if (!*out) return EM_ERR_NOMEM;
            if (((uintptr_t)*out & (HP_SIZE - 1)) == 0) hp_advise(*out, nbytes);
        }
    }
    if (!*out) *out = em_host_alloc(nbytes, 64);
    return *out ? EM_OK : EM_ERR_NOMEM;
}

static void cpu_free(int index, void *ptr) {
    (void)index;
    if (!ptr) return;
    if (HP.enabled && hp_small_free(ptr)) return;
    em_host_free(ptr);
}

static em_status cpu_copy(em_device dd, void *dst, em_device sd, const void *src, size_t n,
                          em_stream *s) {
    (void)dd, (void)sd, (void)s;
    memmove(dst, src, n);
    return EM_OK;
}

static em_status cpu_synchronize(int index) {
    (void)index;
    return EM_OK;
}

/* ---- settings and execution contexts ----------------------------------------------------------- */

static struct {
    pthread_mutex_t lock; /* guards ctxs and why */
    _Atomic int threads;  /* for contexts made from now on */
    char why[160];
    cpu_ctx *ctxs;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER, .threads = 1};

int cpu_num_threads(void) { return __atomic_load_n(&S.threads, __ATOMIC_RELAXED); }

static void cpu_set_num_threads(int n) {
    if (n < 1) n = 1;
    pthread_mutex_lock(&S.lock);
    __atomic_store_n(&S.threads, n, __ATOMIC_RELAXED);
    snprintf(S.why, sizeof S.why, "em_set_num_threads");
    for (cpu_ctx *c = S.ctxs; c; c = c->next) __atomic_store_n(&c->threads, n, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&S.lock);
}

static const char *cpu_num_threads_reason(void) { return S.why; }

/* EMBER_NUM_THREADS, or the CPUs this process may use (core/cpus.c, built in). */
static void threads_init(void) {
    pthread_mutex_lock(&S.lock);
    int n = em__ncpu_explain(S.why, sizeof S.why);
    const char *nt = getenv("EMBER_NUM_THREADS");
    if (nt && *nt) {
        char *end;
        long v = strtol(nt, &end, 10);
        if (*end || v < 1 || v > 4096)
            em_log_write(EM_LOG_WARN, "EMBER_NUM_THREADS='%s' is not a positive number; using %d "
                         "(%s)", nt, n, S.why);
        else {
            n = (int)v;
            snprintf(S.why, sizeof S.why, "EMBER_NUM_THREADS");
        }
    }
    __atomic_store_n(&S.threads, n, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&S.lock);
    em_log_write(EM_LOG_INFO, "CPU threads: %d (%s)", n, S.why);
}

static em_status cpu_context_create(int index, em_stream *s, void **out) {
    (void)index, (void)s;
    cpu_ctx *c = em_host_alloc(sizeof *c, 64);
    if (!c) return em_set_error(EM_ERR_NOMEM, "cpu: out of memory for an execution context");
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_lock(&S.lock);
    c->threads = cpu_num_threads();
    c->next = S.ctxs;
    S.ctxs = c;
    pthread_mutex_unlock(&S.lock);
    *out = c;
    return EM_OK;
}

static void cpu_context_destroy(int index, em_stream *s, void *ctx) {
    (void)index, (void)s;
    cpu_ctx *c = ctx;
    pthread_mutex_lock(&S.lock);
    for (cpu_ctx **p = &S.ctxs; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&S.lock);
    cpu_ctx_release_handles(c);
    pthread_mutex_destroy(&c->lock);
    em_host_free(c);
}

static const em_backend_fn_def cpu_functions[] = {
    {"num_threads", (em_proc_fn)cpu_num_threads, "int (void)",
     "the number of threads CPU kernels may use"},
    {"set_num_threads", (em_proc_fn)cpu_set_num_threads, "void (int n)",
     "set it (below 1 becomes 1), for every kernel call that starts after this"},
    {"num_threads_reason", (em_proc_fn)cpu_num_threads_reason, "const char *(void)",
     "where the thread count came from, in words"},
    {NULL, NULL, NULL, NULL},
};

static const em_device_ops cpu_device = {
    .struct_size = sizeof(em_device_ops),
    .name = "cpu",
    .count = cpu_count,
    .properties = cpu_properties,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .synchronize = cpu_synchronize,
    .context_create = cpu_context_create,
    .context_destroy = cpu_context_destroy,
    .functions = cpu_functions,
};

/* ---- the iteration engine --------------------------------------------------------------------------- */

#define CPU_MAX_OPS 8

/* Row o of the outer dims: its start in every operand, then one call of fn. */
static inline void foreach_row(int nops, const em_ktensor *const *ts, int nd, const int64_t *shape,
                               int64_t st[][EM_MAX_DIMS], const int64_t *istride, int64_t inner,
                               int64_t o, cpu_loop_fn fn, void *ctx) {
    char *p[CPU_MAX_OPS];
    for (int k = 0; k < nops; k++) p[k] = (char *)ts[k]->data;
    for (int d = nd - 2; d >= 0; d--) {
        int64_t i = o % shape[d];
        o /= shape[d];
        for (int k = 0; k < nops; k++) p[k] += i * st[k][d];
    }
    fn(p, istride, inner, ctx);
}

/* Whether t's elements fill numel consecutive slots from its data in some order of its dims
 * (a dense permutation: channels-last, a transposed matrix; size-1 dims ignored). */
static bool dense_permuted(const em_ktensor *t) {
    int64_t st[EM_MAX_DIMS], sh[EM_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 1) continue;
        int i = n++; /* insertion by decreasing stride */
        while (i > 0 && st[i - 1] < t->strides[d]) st[i] = st[i - 1], sh[i] = sh[i - 1], i--;
        st[i] = t->strides[d], sh[i] = t->shape[d];
    }
    int64_t expect = 1;
    for (int i = n - 1; i >= 0; i--) {
        if (st[i] != expect) return false;
        expect *= sh[i];
    }
    return true;
}

void cpu_foreach(const em_kernel_ctx *kc, int nops, const em_ktensor *const *ts, cpu_loop_fn fn,
                 void *ctx, int64_t grain) {
    const em_ktensor *t0 = ts[0];
    if (t0->numel == 0) return;
    /* Operands that share one dense non-row-major layout (channels-last activations through
     * relu and its backward): element i of each is at the same place, so the loop runs over
     * them as flat arrays. */
    if (!t0->contiguous && dense_permuted(t0)) {
        bool same = true;
        for (int k = 1; k < nops && same; k++) {
            same = ts[k]->ndim == t0->ndim && ts[k]->numel == t0->numel;
            for (int d = 0; d < t0->ndim && same; d++)
                same = ts[k]->shape[d] == t0->shape[d] &&
                       (t0->shape[d] == 1 || ts[k]->strides[d] == t0->strides[d]);
        }
        if (same) {
            em_ktensor flat[CPU_MAX_OPS];
            const em_ktensor *fts[CPU_MAX_OPS];
            for (int k = 0; k < nops; k++) {
                flat[k] = *ts[k];
                flat[k].ndim = 1, flat[k].shape[0] = t0->numel, flat[k].strides[0] = 1;
                flat[k].contiguous = true;
                fts[k] = &flat[k];
            }
            cpu_foreach(kc, nops, fts, fn, ctx, grain);
            return;
        }
    }
    /* Byte strides, size-1 dims dropped, then adjacent dims merged where every operand is
     * contiguous across them. */
    int64_t shape[EM_MAX_DIMS], st[CPU_MAX_OPS][EM_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < t0->ndim; d++) {
        if (t0->shape[d] == 1) continue;
        bool merge = nd > 0;
        for (int k = 0; k < nops && merge; k++) {
            int64_t s = ts[k]->strides[d] * (int64_t)em_dtype_size(ts[k]->dtype);
            merge = st[k][nd - 1] == s * t0->shape[d];
        }
        if (merge) {
            shape[nd - 1] *= t0->shape[d];
            for (int k = 0; k < nops; k++)
                st[k][nd - 1] = ts[k]->strides[d] * (int64_t)em_dtype_size(ts[k]->dtype);
            continue;
        }
        shape[nd] = t0->shape[d];
        for (int k = 0; k < nops; k++)
            st[k][nd] = ts[k]->strides[d] * (int64_t)em_dtype_size(ts[k]->dtype);
        nd++;
    }
    if (nd == 0) {
        shape[0] = 1;
        for (int k = 0; k < nops; k++) st[k][0] = (int64_t)em_dtype_size(ts[k]->dtype);
        nd = 1;
    }
    int64_t inner = shape[nd - 1], outer = t0->numel / inner, istride[CPU_MAX_OPS];
    for (int k = 0; k < nops; k++) istride[k] = st[k][nd - 1];
    int nt = cpu_threads(kc);
    bool par = grain > 0 && t0->numel >= grain && nt > 1;
    if (!par && outer == 1) { /* small work: no OpenMP region (it costs ~0.4 us to enter) */
        char *p[CPU_MAX_OPS];
        for (int k = 0; k < nops; k++) p[k] = (char *)ts[k]->data;
        fn(p, istride, inner, ctx);
        return;
    }
    if (outer == 1) {
        /* One long run: split it into per-thread chunks. */
        int64_t chunks = par ? nt : 1, per = (inner + chunks - 1) / chunks;
#pragma omp parallel for num_threads(nt) if (par) schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            int64_t lo = c * per, len = cpu_min_i64(per, inner - lo);
            if (len <= 0) continue;
            char *p[CPU_MAX_OPS];
            for (int k = 0; k < nops; k++) p[k] = (char *)ts[k]->data + lo * istride[k];
            fn(p, istride, len, ctx);
        }
        return;
    }
    if (!par) {
        for (int64_t o = 0; o < outer; o++) foreach_row(nops, ts, nd, shape, st, istride, inner, o, fn, ctx);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t o = 0; o < outer; o++) foreach_row(nops, ts, nd, shape, st, istride, inner, o, fn, ctx);
}

/* ---- registration ------------------------------------------------------------------------------------ */

em_status cpu_register_kernels_ex(em_registry *r, const char *op, const em_dtype *dts, int n,
                                  em_kernel_fn fn, const char *name, em_kernel_supports_fn sup,
                                  unsigned accepts) {
    for (int i = 0; i < n; i++) {
        char kname[96];
        snprintf(kname, sizeof kname, "%s_%s", name, em_dtype_name(dts[i]));
        em_kernel_def def = {.struct_size = sizeof def, .op = op, .device_type = "cpu",
                             .dtype = dts[i], .fn = fn, .supports = sup, .name = kname,
                             .accepts_layouts = accepts};
        em_status st = em_kernel_register(r, &def, NULL);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

em_status cpu_register_kernels(em_registry *r, const char *op, const em_dtype *dts, int n,
                               em_kernel_fn fn, const char *name) {
    return cpu_register_kernels_ex(r, op, dts, n, fn, name, NULL, 0);
}

bool cpu_same_layouts(const em_kernel_ctx *k) {
    for (int i = 1; i < k->n_in + k->n_out; i++)
        if (EM_KCTX_LAYOUT(k, i) != EM_KCTX_LAYOUT(k, 0)) return false;
    return true;
}

static em_status cpu_register(em_registry *r) {
    threads_init();
    hp_init();
    em_status st = em_device_type_register(r, &cpu_device);
    if (st == EM_OK) st = cpu_register_elementwise(r);
    if (st == EM_OK) st = cpu_register_reduce(r);
    if (st == EM_OK) st = cpu_register_matmul(r);
    if (st == EM_OK) st = cpu_register_random(r);
    if (st == EM_OK) st = cpu_register_math(r);
    if (st == EM_OK) st = cpu_register_nn(r);
    if (st == EM_OK) st = cpu_register_attention(r);
    if (st == EM_OK) st = cpu_register_rnn(r);
    if (st == EM_OK) st = cpu_register_loss(r);
    if (st == EM_OK) st = cpu_register_data(r);
    if (st == EM_OK) st = cpu_register_linalg(r);
    if (st == EM_OK) st = cpu_register_optim(r);

    return st;
}

/* Frees what the op families cached (oneDNN primitives); the plugin may be registered again. */
static void cpu_shutdown(void) {
    cpu_shutdown_nn();
    cpu_gemm_shutdown();
}

static const em_plugin_descriptor cpu_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-cpu",
    .version = EM_VERSION_STRING,
#ifdef EM_HAVE_DNNL
    .description = "CPU device and kernels (OpenBLAS, oneDNN)",
#else
    .description = "CPU device and kernels (OpenBLAS; built without oneDNN)",
#endif
    .register_fn = cpu_register,
    .describe = cpu_gemm_describe,
    .shutdown_fn = cpu_shutdown,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &cpu_plugin; }
