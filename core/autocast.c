/*
 * autocast.c — autocast regions (ember/autocast.h): the thread's stack of regions, the casts
 * the dispatcher applies to a classed op's inputs, and the parameter cast cache.
 *
 * The dispatcher's op-call entry points test one thread-local word (em__observed, observe.h);
 * an enabled region sets its EM__OBS_AUTOCAST bit, so a thread outside every region pays
 * nothing more than before. While a classed op runs, and during a backward pass, the bit is
 * cleared (em__autocast_enter / em__autocast_suspend) and restored afterwards.
 */
#include <string.h>

#include "ember/autocast.h"
#include "ember/autograd.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/tensor.h"
#include "internal.h"
#include "observe.h"

#define MAX_REGIONS 64

typedef struct region {
    int devtype;    /* -1: a disabled region (every device type) */
    em_dtype dtype;
} region;

/* One cached cast of a parameter: src's storage version and the grad mode at the cast. */
typedef struct cache_entry {
    em_tensor *src;   /* owned reference */
    em_tensor *cast;  /* owned reference */
    em_dtype dtype;
    uint64_t version;
    bool history;     /* made with grad mode enabled */
} cache_entry;

static _Thread_local struct {
    region stack[MAX_REGIONS];
    int depth;
    /* Per device type, the innermost region's dtype, or -1: none enabled. */
    int cur[EM_MAX_DEVICE_TYPES];
    bool init;
    cache_entry *cache;
    int n_cache, cap_cache;
} A;

static void ensure_init(void) {
    if (A.init) return;
    for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) A.cur[d] = -1;
    A.init = true;
}

/* Recompute A.cur from the stack and the thread's bit from A.cur. */
static void sync_state(void) {
    bool any = false;
    for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) A.cur[d] = -1;
    /* Walk outward from the innermost region: a disabled region hides everything outside. */
    bool seen[EM_MAX_DEVICE_TYPES] = {0};
    for (int i = A.depth - 1; i >= 0; i--) {
        if (A.stack[i].devtype < 0) break;
        int d = A.stack[i].devtype;
        if (seen[d]) continue;
        seen[d] = true;
        A.cur[d] = (int)A.stack[i].dtype;
        any = true;
    }
    /* Atomic: a profiling session begun on another thread writes the same word. */
    if (any) atomic_fetch_or_explicit(&em__observed, EM__OBS_AUTOCAST, memory_order_relaxed);
    else if (em__obs_word() & EM__OBS_AUTOCAST)
        atomic_fetch_and_explicit(&em__observed, ~EM__OBS_AUTOCAST, memory_order_relaxed);
}

static void cache_clear(void) {
    for (int i = 0; i < A.n_cache; i++) {
        em_tensor_release(A.cache[i].src);
        em_tensor_release(A.cache[i].cast);
    }
    em__free(A.cache);
    A.cache = NULL;
    A.n_cache = A.cap_cache = 0;
}

static em_status push(region r) {
    ensure_init();
    if (A.depth == MAX_REGIONS)
        return em_set_error(EM_ERR_RANGE, "autocast_begin: this thread has %d regions open "
                            "already (a begin without its end in a loop?)", MAX_REGIONS);
    A.stack[A.depth++] = r;
    sync_state();
    return EM_OK;
}

em_status em_autocast_begin(const char *device_type, em_dtype dtype) {
    int d = device_type ? em__device_type_find(device_type) : -1;
    if (d < 0)
        return em_set_error(EM_ERR_NOTFOUND, "autocast_begin: no device type '%s' is registered",
                            device_type ? device_type : "(null)");
    if (dtype != EM_BF16 && dtype != EM_F16)
        return em_set_error(EM_ERR_DTYPE, "autocast_begin: the region's dtype must be bfloat16 "
                            "or float16, got %s", em_dtype_is_valid(dtype)
                                                      ? em_dtype_name(dtype) : "an invalid dtype");
    return push((region){.devtype = d, .dtype = dtype});
}

em_status em_autocast_begin_disabled(void) { return push((region){.devtype = -1}); }

em_status em_autocast_end(void) {
    ensure_init();
    if (A.depth == 0)
        return em_set_error(EM_ERR_STATE, "autocast_end: no autocast region is open on this "
                            "thread");
    A.depth--;
    sync_state();
    if (A.depth == 0) cache_clear();
    return EM_OK;
}

bool em_autocast_enabled(const char *device_type, em_dtype *dtype) {
    ensure_init();
    int d = device_type ? em__device_type_find(device_type) : -1;
    if (d < 0 || A.cur[d] < 0 || !(em__obs_word() & EM__OBS_AUTOCAST)) return false;
    if (dtype) *dtype = (em_dtype)A.cur[d];
    return true;
}

int em_autocast_cache_size(void) { return A.n_cache; }

int em__autocast_suspend(void) {
    /* Only this thread writes the bit: no atomic write when it is clear (a backward pass). */
    if (!(em__obs_word() & EM__OBS_AUTOCAST)) return 0;
    atomic_fetch_and_explicit(&em__observed, ~EM__OBS_AUTOCAST, memory_order_relaxed);
    return EM__OBS_AUTOCAST;
}

void em__autocast_resume(int was) {
    if (was) atomic_fetch_or_explicit(&em__observed, was, memory_order_relaxed);
}

/* ---- casting a classed op's inputs --------------------------------------------------------- */

static bool eligible(const em_tensor *t) {
    return t && (t->dtype == EM_F32 || t->dtype == EM_F16 || t->dtype == EM_BF16) &&
           t->storage->device.type >= 0 && t->storage->device.type < EM_MAX_DEVICE_TYPES &&
           A.cur[t->storage->device.type] >= 0;
}

/* The cast of a parameter to dt, from the cache or made and cached. A new reference. */
static em_tensor *cached_cast(const em_tensor *t, em_dtype dt) {
    uint64_t ver = atomic_load_explicit(&t->storage->version, memory_order_acquire);
    bool history = em_grad_mode_get() == EM_GRAD_ENABLED;
    for (int i = 0; i < A.n_cache; i++) {
        cache_entry *e = &A.cache[i];
        if (e->src != t || e->dtype != dt || e->history != history) continue;
        if (e->version == ver) return em_tensor_retain(e->cast);
        /* The parameter changed (an optimizer step): cast it again. */
        em_tensor *c = em__to_dtype(t, dt);
        if (!c) return NULL;
        em_tensor_release(e->cast);
        e->cast = em_tensor_retain(c);
        e->version = ver;
        return c;
    }
    em_tensor *c = em__to_dtype(t, dt);
    if (!c) return NULL;
    if (A.n_cache == A.cap_cache) {
        int cap = A.cap_cache ? 2 * A.cap_cache : 16;
        cache_entry *n = em__realloc(A.cache, (size_t)A.cap_cache * sizeof *n,
                                     (size_t)cap * sizeof *n, "autocast cast cache");
        if (!n) return c; /* no room to cache: the cast is still right */
        A.cache = n;
        A.cap_cache = cap;
    }
    A.cache[A.n_cache++] = (cache_entry){.src = em_tensor_retain((em_tensor *)t),
                                         .cast = em_tensor_retain(c), .dtype = dt,
                                         .version = ver, .history = history};
    return c;
}

int em__autocast_enter(const em_op *op, const em_tensor *const *in, int n_in,
                       em__autocast_args *a) {
    a->args = a->args_stack;
    a->held = a->held_stack;
    a->n = 0;
    a->was = 0;
    const em_op_schema *s = em_op_schema_of(op);
    int cls = s->autocast;
    if (cls == EM_AUTOCAST_NONE || (s->flags & EM_OP_LISTS) || n_in < 0 || (n_in > 0 && !in))
        return 0;
    /* The dtype each eligible input goes to. */
    em_dtype target = EM_F32;
    bool any = false;
    for (int i = 0; i < n_in; i++) {
        if (!eligible(in[i])) continue;
        em_dtype want = cls == EM_AUTOCAST_LOWER ? (em_dtype)A.cur[in[i]->storage->device.type]
                                                 : EM_F32;
        if (cls == EM_AUTOCAST_PROMOTE)
            want = any ? em_dtype_promote(target, in[i]->dtype) : in[i]->dtype;
        target = want;
        any = true;
    }
    if (!any) return 0;
    if (n_in > 8) {
        void **buf = em__calloc(2 * (size_t)n_in, sizeof *buf, "autocast inputs");
        if (!buf) return -1;
        a->args = (const em_tensor **)buf;
        a->held = (em_tensor **)buf + n_in;
    }
    a->n = n_in;
    for (int i = 0; i < n_in; i++) a->held[i] = NULL;
    for (int i = 0; i < n_in; i++) {
        const em_tensor *t = in[i];
        a->args[i] = t;
        if (!eligible(t)) continue;
        em_dtype dt = cls == EM_AUTOCAST_LOWER ? (em_dtype)A.cur[t->storage->device.type]
                                               : target;
        if (t->dtype == dt) continue;
        bool param = t->requires_grad && !t->grad_fn && !t->is_view;
        em_tensor *c = param && cls == EM_AUTOCAST_LOWER ? cached_cast(t, dt)
                                                         : em__to_dtype(t, dt);
        if (!c) {
            a->was = 0;
            em__autocast_finish(a);
            return -1;
        }
        a->held[i] = c;
        a->args[i] = c;
    }
    a->was = em__autocast_suspend();
    return 1;
}

void em__autocast_finish(em__autocast_args *a) {
    em__autocast_resume(a->was);
    for (int i = 0; i < a->n; i++) em_tensor_release(a->held[i]);
    if (a->args != a->args_stack) em__free((void *)a->args);
    a->n = 0;
}

void em__autocast_thread_exit(void) {
    A.depth = 0;
    cache_clear();
    if (A.init) sync_state();
}
