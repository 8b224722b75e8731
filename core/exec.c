/*
 * exec.c — execution contexts (one per device and stream, holding the backend's library
 * handles), the workspace kernels ask for, and the backends' named functions (with the thread
 * count conveniences over the CPU backend's).
 *
 * Contexts. The dispatcher hands every kernel call the context of (its device, the calling
 * thread's current stream there). The default stream's context of each ordinal sits in
 * em__device_type.exec_default, published with a release store once built, so the common
 * call costs one load (em__exec_get); every context is also on the type's list `execs`, which
 * em__exec_make searches under the type's lock for the other streams (after a per-thread
 * cache of the last one, so a thread working on a side stream skips the lock too). A context
 * lives until its stream is freed, its device type is removed (plugin unload) or
 * em_shutdown().
 *
 * Workspace. em_kernel_workspace takes a block from the device's caching allocator in
 * category EM_MEM_WORKSPACE and links it into the call's list (em_kernel_ctx.workspace,
 * through the block's `next`, which the allocator uses only while a block is cached); the
 * dispatcher hands the list back after the kernel returns (em__workspace_release), so a
 * kernel never frees it and an error path leaks nothing.
 */
#include <stdio.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/error.h"
#include "internal.h"

/* A context and its link on the device type's list. */
typedef struct em__exec {
    em_exec_ctx pub;
    struct em__exec *next;
} em__exec;

/* Bumped (under a type's lock) whenever a context is freed: a thread's cached context is valid
 * while the count is what it was when the thread cached it. */
static atomic_uint_fast64_t exec_frees;
/* The non-default stream context this thread used last. */
static _Thread_local struct {
    em_device dev;
    em_stream *s;
    em_exec_ctx *x;
    uint_fast64_t frees;
} tls_last;

em_exec_ctx *em__exec_make(em_device dev, em_stream *s) {
    if (s && tls_last.x && tls_last.s == s && em_device_equal(tls_last.dev, dev) &&
        tls_last.frees == atomic_load_explicit(&exec_frees, memory_order_acquire))
        return tls_last.x;
    em__device_type *t = &em__device_types[dev.type];
    pthread_mutex_lock(&t->lock);
    em__exec *x = t->execs;
    while (x && !(x->pub.device.index == dev.index && x->pub.stream == s)) x = x->next;
    if (x) {
        if (s) { /* no context of this type can be freed while the lock is held */
            tls_last.dev = dev;
            tls_last.s = s;
            tls_last.x = &x->pub;
            tls_last.frees = atomic_load_explicit(&exec_frees, memory_order_relaxed);
        }
        pthread_mutex_unlock(&t->lock);
        return &x->pub;
    }
    char name[48];
    em_device_str(dev, name, sizeof name);
    x = em__calloc(1, sizeof *x, "an execution context");
    em_status st = x ? EM_OK : EM_ERR_NOMEM;
    if (st == EM_OK && t->ops.context_create) {
        st = t->ops.context_create(dev.index, s, &x->pub.backend);
        if (st != EM_OK) {
            char why[512]; /* the backend's message, or (none set) the status's */
            snprintf(why, sizeof why, "%s", em__error_pending() && em_last_status() == st
                                                ? em_last_error() : em_status_str(st));
            em_set_error(st, "%s: the backend could not make its execution context for the %s "
                         "stream: %s", name, s ? "current" : "default", why);
            em__free(x);
            x = NULL;
        }
    }
    if (x) {
        x->pub = (em_exec_ctx){.struct_size = sizeof x->pub, .device = dev, .stream = s,
                               .backend = x->pub.backend};
        x->next = t->execs;
        t->execs = x;
        if (!s) __atomic_store_n(&t->exec_default[dev.index], &x->pub, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&t->lock);
    return x ? &x->pub : NULL;
}

void em__exec_free(em__device_type *t, int index, em_stream *s, bool all) {
    pthread_mutex_lock(&t->lock);
    for (em__exec **p = &t->execs; *p;) {
        em__exec *x = *p;
        if (!all && !(x->pub.device.index == index && x->pub.stream == s)) {
            p = &x->next;
            continue;
        }
        *p = x->next;
        atomic_fetch_add_explicit(&exec_frees, 1, memory_order_release);
        if (!x->pub.stream) __atomic_store_n(&t->exec_default[x->pub.device.index], NULL,
                                             __ATOMIC_RELEASE);
        if (t->ops.context_destroy) t->ops.context_destroy(x->pub.device.index, x->pub.stream,
                                                           x->pub.backend);
        em__free(x);
    }
    pthread_mutex_unlock(&t->lock);
}

/* ---- workspace ---------------------------------------------------------------------------- */

em_status em_kernel_workspace(const em_kernel_ctx *k, size_t nbytes, void **out) {
    if (out) *out = NULL;
    if (!k || !out) return em_set_error(EM_ERR_INVALID, "kernel_workspace: NULL argument");
    const char *op = em_op_name(k->op);
    if (!EM_KCTX_HAS_EXEC(k))
        return em_set_error(EM_ERR_INVALID, "%s: kernel_workspace: the kernel context (%zu "
                            "bytes) predates workspace", op, k->struct_size);
    em__allocator *a = em__device_allocator(k->device);
    em__block *b = NULL;
    if (!a || em__allocator_alloc(a, nbytes, EM_MEM_WORKSPACE, &b) != EM_OK) {
        char why[768], dev[48];
        snprintf(why, sizeof why, "%s", em_last_error());
        em_status st = em_last_status();
        return em_set_error(st == EM_OK ? EM_ERR_NOMEM : st, "%s: out of memory for %zu bytes "
                            "of kernel workspace on %s (%s)", op, nbytes,
                            em_device_str(k->device, dev, sizeof dev), why);
    }
    /* The context is the dispatcher's own (on its stack); kernels see it const. */
    em_kernel_ctx *mk = (em_kernel_ctx *)k;
    b->next = mk->workspace;
    mk->workspace = b;
    *out = b->ptr;
    return EM_OK;
}

void em__workspace_release(em_kernel_ctx *k) {
    em__allocator *a = em__device_allocator_existing(k->device);
    for (em__block *b = k->workspace, *n; b; b = n) {
        n = b->next;
        b->next = NULL;
        em__allocator_release(a, b);
    }
    k->workspace = NULL;
}

/* ---- backend functions -------------------------------------------------------------------- */

const em_backend_fn_def *em_backend_functions(const char *device_type, size_t *n) {
    if (n) *n = 0;
    int t = device_type ? em__device_type_find(device_type) : -1;
    const em_backend_fn_def *f = t < 0 ? NULL : em__device_types[t].ops.functions;
    if (f && n)
        while (f[*n].name) (*n)++;
    return f;
}

em_proc_fn em_backend_proc(const char *device_type, const char *name) {
    if (!device_type || !name) {
        em_set_error(EM_ERR_INVALID, "backend_proc: NULL argument");
        return NULL;
    }
    int t = em__device_type_find(device_type);
    if (t < 0) {
        em_set_error(EM_ERR_NOTFOUND, "backend_proc: no backend for device type '%s' is "
                     "loaded; installed plugins: %s", device_type, em__plugin_names());
        return NULL;
    }
    size_t n;
    const em_backend_fn_def *f = em_backend_functions(device_type, &n);
    for (size_t i = 0; i < n; i++)
        if (strcmp(f[i].name, name) == 0 && f[i].fn) return f[i].fn;
    char have[512] = "";
    size_t len = 0;
    for (size_t i = 0; i < n && len < sizeof have; i++) {
        int w = snprintf(have + len, sizeof have - len, "%s%s", i ? ", " : "", f[i].name);
        if (w > 0) len += (size_t)w;
    }
    em_set_error(EM_ERR_NOTFOUND, "backend_proc: the '%s' backend has no function '%s'; it "
                 "has: %s", device_type, name, n ? have : "none");
    return NULL;
}

/* ---- the thread count, the CPU backend's setting -------------------------------------------- */

/* The CPU backend's function by name, or NULL without an error (no backend loaded). The CPU
 * is always registry slot 0: no search by type name. */
static em_proc_fn cpu_fn(const char *name) {
    const em__device_type *t = &em__device_types[EM_DEVICE_CPU_TYPE];
    const em_backend_fn_def *f = t->used ? t->ops.functions : NULL;
    for (; f && f->name; f++)
        if (strcmp(f->name, name) == 0) return f->fn;
    return NULL;
}

int em_num_threads(void) {
    em_proc_fn f = cpu_fn("num_threads");
    return f ? ((int (*)(void))f)() : 1;
}

void em_set_num_threads(int n) {
    em_proc_fn f = cpu_fn("set_num_threads");
    if (f) ((void (*)(int))f)(n);
}

const char *em_num_threads_reason(void) {
    em_proc_fn f = cpu_fn("num_threads_reason");
    return f ? ((const char *(*)(void))f)() : "no CPU backend is loaded";
}
