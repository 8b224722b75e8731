/*
 * device.c — the device-type registry that backend plugins fill, device names, per-device
 * allocators (created on first use), streams and events, and copies between any two devices.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/plugin.h"
#include "internal.h"

em__device_type em__device_types[EM_MAX_DEVICE_TYPES];
static pthread_mutex_t types_lock = PTHREAD_MUTEX_INITIALIZER;

em_device em_cpu(void) { return (em_device){EM_DEVICE_CPU_TYPE, 0}; }

bool em_device_equal(em_device a, em_device b) { return a.type == b.type && a.index == b.index; }

int em__device_type_find(const char *name) {
    for (int i = 0; i < EM_MAX_DEVICE_TYPES; i++)
        if (em__device_types[i].used && strcmp(em__device_types[i].name, name) == 0) return i;
    return -1;
}

static bool valid_type_name(const char *s) {
    if (!s || !(*s >= 'a' && *s <= 'z') || strlen(s) >= 32) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) return false;
    return true;
}

em_status em_device_type_register(em_registry *reg, const em_device_ops *ops_in) {
    if (!reg || !ops_in) return em_set_error(EM_ERR_INVALID, "device_type_register: NULL argument");
    em_device_ops full; /* the backend's table by the prefix rule: missing trailing slots NULL */
    em_status rd = EM__STRUCT_READ(em_device_ops, &full, ops_in,
                                   offsetof(em_device_ops, host_alloc), "device_type_register");
    if (rd != EM_OK) return rd;
    const em_device_ops *ops = &full;
    if (!valid_type_name(ops->name) ||
        !ops->count || !ops->alloc || !ops->free || !ops->copy || !ops->synchronize)
        return em_set_error(EM_ERR_INVALID,
                            "device_type_register: '%s' needs a name ([a-z][a-z0-9_]*) and "
                            "count, alloc, free, copy and synchronize",
                            ops->name ? ops->name : "(null)");
    pthread_mutex_lock(&types_lock);
    em_status st = EM_OK;
    int slot = -1;
    if (em__device_type_find(ops->name) >= 0) {
        st = em_set_error(EM_ERR_EXISTS, "device_type_register: device type '%s' is already "
                          "registered", ops->name);
    } else if (strcmp(ops->name, "cpu") == 0) {
        slot = EM_DEVICE_CPU_TYPE;
    } else {
        for (int i = 1; i < EM_MAX_DEVICE_TYPES && slot < 0; i++)
            if (!em__device_types[i].used) slot = i;
        if (slot < 0)
            st = em_set_error(EM_ERR_RANGE, "device_type_register: all %d device-type slots "
                              "are taken", EM_MAX_DEVICE_TYPES);
    }
    if (st == EM_OK) st = em__registry_add_device_type(reg, slot);
    if (st == EM_OK) {
        em__device_type *t = &em__device_types[slot];
        memset(t, 0, sizeof *t);
        t->ops = full;
        snprintf(t->name, sizeof t->name, "%s", ops->name);
        t->ops.name = t->name;
        t->owner = reg;
        pthread_mutex_init(&t->lock, NULL);
        t->used = true;
    }
    pthread_mutex_unlock(&types_lock);
    return st;
}

static void device_type_clear(em__device_type *t) {
    em__exec_free(t, 0, NULL, true); /* before the backend's code and allocators go */
    for (size_t i = 0; i < EM_ARRAY_LEN(t->alloc); i++) em__allocator_free(t->alloc[i]);
    pthread_mutex_destroy(&t->lock);
    memset(t, 0, sizeof *t);
}

void em__device_types_remove_owner(em_registry *owner) {
    pthread_mutex_lock(&types_lock);
    for (int i = 0; i < EM_MAX_DEVICE_TYPES; i++)
        if (em__device_types[i].used && em__device_types[i].owner == owner)
            device_type_clear(&em__device_types[i]);
    pthread_mutex_unlock(&types_lock);
}

void em__devices_shutdown(void) {
    pthread_mutex_lock(&types_lock);
    for (int i = 0; i < EM_MAX_DEVICE_TYPES; i++)
        if (em__device_types[i].used) device_type_clear(&em__device_types[i]);
    pthread_mutex_unlock(&types_lock);
}

const char *em_device_str(em_device dev, char *buf, size_t cap) {
    const char *name = (dev.type >= 0 && dev.type < EM_MAX_DEVICE_TYPES &&
                        em__device_types[dev.type].used)
                           ? em__device_types[dev.type].name
                           : "unknown";
    if (dev.type == EM_DEVICE_CPU_TYPE && dev.index == 0)
        snprintf(buf, cap, "cpu");
    else
        snprintf(buf, cap, "%s:%d", name, dev.index);
    return buf;
}

em_status em__device_check(em_device dev, const char *who) {
    if (dev.type < 0 || dev.type >= EM_MAX_DEVICE_TYPES || !em__device_types[dev.type].used) {
        if (dev.type == EM_DEVICE_CPU_TYPE)
            return em_set_error(EM_ERR_DEVICE, "%s: the CPU device is not registered (is the "
                                "ember-cpu plugin installed and em_init() called?)", who);
        return em_set_error(EM_ERR_DEVICE, "%s: device type %d is not registered", who,
                            dev.type);
    }
    int count = em__device_types[dev.type].ops.count();
    if (dev.index < 0 || dev.index >= count || dev.index >= 64) {
        char buf[48];
        const char *tn = em__device_types[dev.type].name;
        em_device_str(dev, buf, sizeof buf);
        if (count == 0) {
            const em_device_ops *o = &em__device_types[dev.type].ops;
            const char *why = o->count_reason ? o->count_reason() : NULL;
            return em_set_error(EM_ERR_DEVICE, "%s: device %s does not exist (no %s device is "
                                "present%s%s)", who, buf, tn, why ? ": " : "", why ? why : "");
        }
        if (count == 1)
            return em_set_error(EM_ERR_DEVICE, "%s: device %s does not exist: only 1 %s device "
                                "is present, '%s' or '%s:0'", who, buf, tn, tn, tn);
        return em_set_error(EM_ERR_DEVICE, "%s: device %s does not exist: there are %d %s "
                            "devices, '%s:0' to '%s:%d'", who, buf, count, tn, tn, tn,
                            count - 1);
    }
    return EM_OK;
}

const em_device_ops *em__device_ops(em_device dev) { return &em__device_types[dev.type].ops; }

em__allocator *em__device_allocator(em_device dev) {
    if (em__device_check(dev, "alloc") != EM_OK) return NULL;
    em__device_type *t = &em__device_types[dev.type];
    /* Every tensor allocation and release comes here: once created, the allocator is read
     * without the lock (it lives until its device type is removed, which is set-up time, like
     * registration). The store below publishes a fully built allocator. */
    em__allocator *a = __atomic_load_n(&t->alloc[dev.index], __ATOMIC_ACQUIRE);
    if (a) return a;
    pthread_mutex_lock(&t->lock);
    a = t->alloc[dev.index];
    if (!a) {
        a = em__allocator_new(dev, &t->ops);
        __atomic_store_n(&t->alloc[dev.index], a, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&t->lock);
    return a;
}

em__allocator *em__device_allocator_existing(em_device dev) {
    if (dev.type < 0 || dev.type >= EM_MAX_DEVICE_TYPES || dev.index < 0 || dev.index >= 64)
        return NULL;
    em__device_type *t = &em__device_types[dev.type];
    return t->used ? __atomic_load_n(&t->alloc[dev.index], __ATOMIC_ACQUIRE) : NULL;
}

em_status em_device_parse(const char *s, em_device *out) {
    if (!s || !out) return em_set_error(EM_ERR_INVALID, "device_parse: NULL argument");
    char type[32];
    const char *colon = strchr(s, ':');
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    if (n == 0 || n >= sizeof type)
        return em_set_error(EM_ERR_DEVICE, "invalid device '%s': expected a type such as "
                            "'cpu' or 'cuda', optionally with ':N'", s);
    memcpy(type, s, n);
    type[n] = '\0';
    long index = 0;
    if (colon) {
        char *end;
        index = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || index < 0 || index > 63)
            return em_set_error(EM_ERR_DEVICE, "invalid device '%s': the ordinal after ':' "
                                "must be a number from 0 to 63", s);
    }
    int t = em__device_type_find(type);
    if (t < 0)
        return em_set_error(EM_ERR_DEVICE, "no backend for device type '%s' is loaded; "
                            "installed plugins: %s", type, em__plugin_names());
    em_device dev = {(int16_t)t, (int16_t)index};
    em_status st = em__device_check(dev, "device_parse");
    if (st != EM_OK) return st;
    *out = dev;
    return EM_OK;
}

int em_device_count(const char *type_name) {
    int t = type_name ? em__device_type_find(type_name) : -1;
    return t < 0 ? 0 : em__device_types[t].ops.count();
}

const char *em_device_count_reason(const char *type_name) {
    int t = type_name ? em__device_type_find(type_name) : -1;
    if (t < 0 || em__device_types[t].ops.count() > 0) return NULL;
    const em_device_ops *o = &em__device_types[t].ops;
    return o->count_reason ? o->count_reason() : NULL;
}

/* The backend fills the core's full struct; the caller gets the part its struct_size covers. */
static em_status device_properties(em_device dev, em_device_props *out);
em_status em_device_properties(em_device dev, em_device_props *caller) {
    em_device_props full = {.struct_size = sizeof full};
    const size_t min = EM__SIZE_THROUGH(em_device_props, compute_units);
    em_status st = EM__STRUCT_WRITE(em_device_props, caller, &full, min, "device_properties");
    if (st == EM_OK) st = device_properties(dev, &full);
    if (st == EM_OK) EM__STRUCT_WRITE(em_device_props, caller, &full, min, "device_properties");
    return st;
}

static em_status device_properties(em_device dev, em_device_props *out) {
    em_status st = em__device_check(dev, "device_properties");
    if (st != EM_OK) return st;
    char buf[48];
    snprintf(out->name, sizeof out->name, "%s", em_device_str(dev, buf, sizeof buf));
    const em_device_ops *ops = em__device_ops(dev);
    if (!ops->properties) return EM_OK;
    st = ops->properties(dev.index, out);
    out->struct_size = sizeof *out;
    out->name[sizeof out->name - 1] = '\0';
    if (st != EM_OK && !em__error_pending())
        em_set_error(st, "device_properties: the backend of %s failed: %s", buf,
                     em_status_str(st));
    return st;
}

em_status em_device_synchronize(em_device dev) {
    em_status st = em__device_check(dev, "synchronize");
    if (st == EM_OK) st = em__device_ops(dev)->synchronize(dev.index);
    if (st == EM_OK) em__async_copies_wait(dev); /* their events are done: drop the sources */
    return st;
}

/* A copy to or from host memory returns once the host may read or reuse that memory: on the
 * default stream the backend's copy is complete when it returns (em_device_ops.copy); on
 * another stream wait for the stream. */
static em_status host_copy_wait(em_device dev, em_stream *s) {
    const em_device_ops *o = em__device_ops(dev);
    if (!s || !o->stream_synchronize) return EM_OK;
    return o->stream_synchronize(dev.index, s);
}

em_status em__device_copy(em_device dst_dev, void *dst, em_device src_dev, const void *src,
                          size_t nbytes) {
    if (nbytes == 0) return EM_OK;
    bool dst_cpu = dst_dev.type == EM_DEVICE_CPU_TYPE, src_cpu = src_dev.type == EM_DEVICE_CPU_TYPE;
    if (dst_cpu && src_cpu) {
        memmove(dst, src, nbytes);
        return EM_OK;
    }
    if (!em_device_equal(dst_dev, src_dev)) em__placement_count_copy(dst_dev, src_dev, nbytes);
    if (src_cpu || dst_cpu || em_device_equal(dst_dev, src_dev)) {
        /* One backend can do it: the non-CPU side's, on this thread's current stream there
         * (ordered after the work this thread queued on it). */
        em_device owner = dst_cpu ? src_dev : dst_dev;
        em_stream *s = em_stream_current(owner);
        em_status st = em__device_ops(owner)->copy(dst_dev, dst, src_dev, src, nbytes, s);
        return st == EM_OK && (src_cpu || dst_cpu) ? host_copy_wait(owner, s) : st;
    }
    /* Two different devices (or two ordinals of one type): stage through host memory, each
     * half on its device's current stream; the host waits for the first half's stream before
     * the second half starts, and for the second's before the staging buffer goes, not for
     * the devices' other streams. */
    void *tmp = em__malloc(nbytes, "cross-device copy staging buffer");
    if (!tmp) return EM_ERR_NOMEM;
    em_stream *ss = em_stream_current(src_dev), *ds = em_stream_current(dst_dev);
    em_status st = em__device_ops(src_dev)->copy(em_cpu(), tmp, src_dev, src, nbytes, ss);
    if (st == EM_OK) st = host_copy_wait(src_dev, ss);
    if (st == EM_OK) st = em__device_ops(dst_dev)->copy(dst_dev, dst, em_cpu(), tmp, nbytes, ds);
    if (st == EM_OK) st = host_copy_wait(dst_dev, ds);
    em__free(tmp);
    return st;
}

/* ---- streams and events: forwarded to the backend; no-ops where it has none ----------------- */

#define STREAM_OP(who, slot, call, none)                                                       \
    do {                                                                                       \
        em_status st_ = em__device_check(dev, who);                                            \
        if (st_ != EM_OK) return st_;                                                          \
        const em_device_ops *o_ = em__device_ops(dev);                                         \
        if (!o_->slot) { none; return EM_OK; }                                                 \
        return call;                                                                           \
    } while (0)

em_status em_stream_create(em_device dev, em_stream **out) {
    if (!out) return em_set_error(EM_ERR_INVALID, "stream_create: NULL out");
    STREAM_OP("stream_create", stream_create, o_->stream_create(dev.index, out), *out = NULL);
}
/* The calling thread's current streams: one entry per device it set a non-default stream on
 * (few: a thread rarely drives more than a couple of devices). */
#define CURRENT_MAX 16
static _Thread_local struct { em_device dev; em_stream *s; } tls_current[CURRENT_MAX];
/* Initial-exec: read by every op call (em__stream_current), where the default model costs a
 * __tls_get_addr call in a shared library; 4 bytes fit glibc's static TLS room. */
_Thread_local __attribute__((tls_model("initial-exec"))) int em__streams_set;
#define tls_current_len em__streams_set

static int current_find(em_device dev) {
    for (int i = 0; i < tls_current_len; i++)
        if (tls_current[i].dev.type == dev.type && tls_current[i].dev.index == dev.index) return i;
    return -1;
}

static void current_drop(int i) {
    tls_current[i] = tls_current[--tls_current_len];
}

em_status em_stream_set_current(em_device dev, em_stream *s) {
    em_status st = em__device_check(dev, "stream_set_current");
    if (st != EM_OK) return st;
    if (s && !em__device_ops(dev)->stream_create) {
        char buf[48];
        return em_set_error(EM_ERR_INVALID,
                            "stream_set_current: device %s has no streams, only the default",
                            em_device_str(dev, buf, sizeof buf));
    }
    int i = current_find(dev);
    if (!s) {
        if (i >= 0) current_drop(i);
        return EM_OK;
    }
    if (i < 0) {
        if (tls_current_len == CURRENT_MAX)
            return em_set_error(EM_ERR_INVALID,
                                "stream_set_current: this thread already holds current streams "
                                "on %d devices; set one back to the default (NULL) first",
                                CURRENT_MAX);
        i = tls_current_len++;
        tls_current[i].dev = dev;
    }
    tls_current[i].s = s;
    return EM_OK;
}

em_stream *em__stream_lookup(em_device dev) {
    int i = current_find(dev);
    return i < 0 ? NULL : tls_current[i].s;
}

em_stream *em_stream_current(em_device dev) { return em__stream_current(dev); }

void em_stream_free(em_device dev, em_stream *s) {
    if (!s || em__device_check(dev, "stream_free") != EM_OK) return;
    int i = current_find(dev);
    if (i >= 0 && tls_current[i].s == s) current_drop(i);
    const em_device_ops *o = em__device_ops(dev);
    em__allocator *a = em__device_allocator_existing(dev);
    if (a) {
        /* Its cached blocks are about to serve every stream, and blocks that recorded it stop
         * waiting for it: both need its work done. */
        if (o->stream_synchronize) o->stream_synchronize(dev.index, s);
        em__allocator_stream_gone(a, s);
    }
    em__exec_free(&em__device_types[dev.type], dev.index, s, false);
    if (o->stream_destroy) o->stream_destroy(dev.index, s);
}
em_status em_stream_synchronize(em_device dev, em_stream *s) {
    STREAM_OP("stream_synchronize", stream_synchronize, o_->stream_synchronize(dev.index, s),
              (void)0);
}
em_status em_event_create(em_device dev, em_event **out) {
    if (!out) return em_set_error(EM_ERR_INVALID, "event_create: NULL out");
    STREAM_OP("event_create", event_create, o_->event_create(dev.index, out), *out = NULL);
}
void em_event_free(em_device dev, em_event *e) {
    if (!e || em__device_check(dev, "event_free") != EM_OK) return;
    if (em__device_ops(dev)->event_destroy) em__device_ops(dev)->event_destroy(dev.index, e);
}
em_status em_event_record(em_device dev, em_event *e, em_stream *s) {
    STREAM_OP("event_record", event_record, o_->event_record(dev.index, e, s), (void)0);
}
em_status em_event_wait(em_device dev, em_stream *s, em_event *e) {
    STREAM_OP("event_wait", event_wait, o_->event_wait(dev.index, s, e), (void)0);
}
em_status em_event_synchronize(em_device dev, em_event *e) {
    STREAM_OP("event_synchronize", event_synchronize, o_->event_synchronize(dev.index, e),
              (void)0);
}

/* ---- graph capture (ember/device.h): forwarded to the backend's graph slots; the allocator's
 * capture-safe pool (alloc.c) serves the recording stream ---------------------------------- */

/* A capture's generator state (ember/random.h, "Graph capture"): the generator its drawing
 * ops drew from, the Philox blocks they took (their offsets count from 0), and the device
 * tensor (2) uint64 {seed, base offset} their kernels read, which each replay fills first. */
typedef struct graph_rng {
    em_generator *gen;
    uint64_t blocks;
    em_tensor *state; /* (2) int64 on the graph's device; NULL: nothing drew */
} graph_rng;

struct em_graph {
    em_device dev;
    em_stream *s;
    void *exec;            /* the backend's recorded graph */
    struct em__pool *pool; /* the allocator's pool for the graph's blocks */
    graph_rng rng;
};

/* This thread's capture in progress (one at a time). */
static _Thread_local struct {
    bool active;
    em_device dev;
    em_stream *s, *prev;
    struct em__pool *pool;
    graph_rng rng;
} tls_capture;

/* Captures in progress on every thread: eager draws, while there is none, skip the
 * thread-local lookup (a __tls_get_addr call in a shared library) on their way to the
 * generator. */
static atomic_int captures_active;

em_status em__rng_draw(em_generator *gen, uint64_t blocks, em_device dev, const char *who,
                       bool covered, em_rng_state *out, bool *graph) {
    *graph = false;
    if (atomic_load_explicit(&captures_active, memory_order_relaxed) == 0 ||
        !tls_capture.active || !em_device_equal(tls_capture.dev, dev)) {
        *out = em_generator_reserve(gen, blocks);
        return EM_OK;
    }
    char buf[48];
    if (!covered)
        return em_set_error(EM_ERR_STATE, "%s: draws random numbers while a graph is captured "
                            "on %s, and its kernels take the generator's offset as an argument "
                            "that every replay would repeat; run it outside the capture", who,
                            em_device_str(dev, buf, sizeof buf));
    em_generator *g = gen ? gen : em_default_generator();
    graph_rng *r = &tls_capture.rng;
    if (r->gen && r->gen != g)
        return em_set_error(EM_ERR_STATE, "%s: draws from a second generator in one graph "
                            "capture on %s; a captured graph draws from one generator (the "
                            "first draw's)", who, em_device_str(dev, buf, sizeof buf));
    if (!r->state) {
        /* on the capturing stream: a block of the graph's pool */
        if (!(r->state = em__empty(1, (const int64_t[]){2}, EM_I64, dev))) return em_last_status();
    }
    r->gen = g;
    *out = (em_rng_state){.seed = 0, .offset = r->blocks};
    r->blocks += blocks;
    *graph = true;
    return EM_OK;
}

const uint64_t *em_kernel_generator_state(const em_kernel_ctx *k) {
    char buf[48];
    if (!k) {
        em_set_error(EM_ERR_INVALID, "kernel_generator_state: NULL kernel context");
        return NULL;
    }
    if (!tls_capture.active || !em_device_equal(tls_capture.dev, k->device) ||
        tls_capture.s != k->stream || !tls_capture.rng.state) {
        em_set_error(EM_ERR_STATE, "%s: attribute 'seed' is absent with an 'offset', but no "
                     "graph capture on %s has a generator state for this call's stream (an "
                     "offset without a seed is a capture's relative one; pass both)",
                     em_op_name(k->op), em_device_str(k->device, buf, sizeof buf));
        return NULL;
    }
    return em_tensor_data(tls_capture.rng.state);
}

static bool graph_slots(const em_device_ops *o) {
    return o->graph_begin && o->graph_end && o->graph_replay && o->graph_destroy;
}

bool em_graph_capture_supported(em_device dev) {
    if (dev.type < 0 || dev.type >= EM_MAX_DEVICE_TYPES || !em__device_types[dev.type].used)
        return false;
    return graph_slots(em__device_ops(dev));
}

static em_status no_graphs(em_device dev, const char *who) {
    char buf[48];
    return em_set_error(EM_ERR_DEVICE, "%s: device %s cannot capture graphs (its backend "
                        "registers no graph capture slots); run the work eagerly", who,
                        em_device_str(dev, buf, sizeof buf));
}

em_status em_graph_capture_begin(em_device dev, em_stream *s) {
    em_status st = em__device_check(dev, "graph_capture_begin");
    if (st != EM_OK) return st;
    if (!graph_slots(em__device_ops(dev))) return no_graphs(dev, "graph_capture_begin");
    char buf[48];
    if (!s)
        return em_set_error(EM_ERR_INVALID, "graph_capture_begin: %s: the default stream cannot "
                            "be captured; create a stream (em_stream_create) and capture that",
                            em_device_str(dev, buf, sizeof buf));
    if (tls_capture.active)
        return em_set_error(EM_ERR_STATE, "graph_capture_begin: this thread is already "
                            "capturing on %s; end that capture first",
                            em_device_str(tls_capture.dev, buf, sizeof buf));
    em__allocator *a = em__device_allocator(dev);
    if (!a) return em_last_status();
    /* The stream's execution context (library handles, their workspace) is made now: making
     * it allocates device memory, which a capture cannot record. */
    if (!em__exec_make(dev, s)) return em_last_status();
    em_stream *prev = em__stream_current(dev);
    if ((st = em_stream_set_current(dev, s)) != EM_OK) return st;
    struct em__pool *pool;
    if ((st = em__allocator_capture_begin(a, s, &pool)) != EM_OK) {
        em_stream_set_current(dev, prev);
        return st;
    }
    if ((st = em__device_ops(dev)->graph_begin(dev.index, s)) != EM_OK) {
        em__allocator_graph_gone(a, pool);
        em_stream_set_current(dev, prev);
        return st;
    }
    tls_capture.active = true;
    tls_capture.dev = dev;
    tls_capture.s = s;
    tls_capture.prev = prev;
    tls_capture.pool = pool;
    tls_capture.rng = (graph_rng){0};
    atomic_fetch_add_explicit(&captures_active, 1, memory_order_relaxed);
    return EM_OK;
}

em_status em_graph_capture_end(em_device dev, em_graph **out) {
    if (!out) return em_set_error(EM_ERR_INVALID, "graph_capture_end: NULL out");
    *out = NULL;
    em_status st = em__device_check(dev, "graph_capture_end");
    if (st != EM_OK) return st;
    if (!graph_slots(em__device_ops(dev))) return no_graphs(dev, "graph_capture_end");
    char buf[48];
    if (!tls_capture.active || !em_device_equal(tls_capture.dev, dev))
        return em_set_error(EM_ERR_STATE, "graph_capture_end: this thread is not capturing on "
                            "%s (em_graph_capture_begin first)",
                            em_device_str(dev, buf, sizeof buf));
    tls_capture.active = false;
    atomic_fetch_sub_explicit(&captures_active, 1, memory_order_relaxed);
    em__allocator *a = em__device_allocator(dev);
    em_graph *g = em__calloc(1, sizeof *g, "a captured graph");
    void *exec = NULL;
    /* The backend ends the capture even when g could not be allocated. */
    st = em__device_ops(dev)->graph_end(dev.index, tls_capture.s, &exec);
    em_stream_set_current(dev, tls_capture.prev);
    if (st == EM_OK && !g) {
        em__device_ops(dev)->graph_destroy(dev.index, exec);
        st = EM_ERR_NOMEM;
    }
    if (st != EM_OK) {
        em__free(g);
        em_tensor_release(tls_capture.rng.state);
        tls_capture.rng = (graph_rng){0};
        if (a) em__allocator_graph_gone(a, tls_capture.pool);
        return st;
    }
    if (a) em__allocator_capture_end(a, tls_capture.pool);
    *g = (em_graph){.dev = dev, .s = tls_capture.s, .exec = exec, .pool = tls_capture.pool,
                    .rng = tls_capture.rng};
    tls_capture.rng = (graph_rng){0};
    *out = g;
    return EM_OK;
}

em_status em_graph_replay(em_graph *g) {
    if (!g) return em_set_error(EM_ERR_INVALID, "graph_replay: NULL graph");
    em_status st = em__device_check(g->dev, "graph_replay");
    if (st != EM_OK) return st;
    if (tls_capture.active)
        return em_set_error(EM_ERR_STATE, "graph_replay: this thread is capturing a graph; a "
                            "graph is replayed outside a capture");
    if (g->rng.state) {
        /* PyTorch's replay prologue: the generator's state now goes into the device memory the
         * drawing kernels read, ahead of the graph on its stream, and the generator moves past
         * the blocks the graph takes, as the same ops run eagerly would move it. */
        em_rng_state rs = em_generator_reserve(g->rng.gen, g->rng.blocks);
        uint64_t words[2] = {rs.seed, rs.offset};
        st = em__host_to_device_async(g->rng.state, words, sizeof words, g->s);
        if (st != EM_OK) {
            em_generator_set_state(g->rng.gen, rs);
            return st;
        }
    }
    return em__device_ops(g->dev)->graph_replay(g->dev.index, g->exec, g->s);
}

em_status em_graph_generator(const em_graph *g, em_generator **gen, uint64_t *blocks) {
    if (!g || !gen || !blocks)
        return em_set_error(EM_ERR_INVALID, "graph_generator: NULL argument");
    *gen = g->rng.state ? g->rng.gen : NULL;
    *blocks = g->rng.state ? g->rng.blocks : 0;
    return EM_OK;
}

em_stream *em_graph_stream(const em_graph *g) { return g ? g->s : NULL; }

void em_graph_free(em_graph *g) {
    if (!g) return;
    if (em__device_check(g->dev, "graph_free") == EM_OK) {
        const em_device_ops *o = em__device_ops(g->dev);
        /* its pool's blocks are about to serve the default stream: the replays must be done */
        if (o->stream_synchronize) o->stream_synchronize(g->dev.index, g->s);
        o->graph_destroy(g->dev.index, g->exec);
        em_tensor_release(g->rng.state);
        em__allocator *a = em__device_allocator_existing(g->dev);
        if (a) em__allocator_graph_gone(a, g->pool);
    }
    em__free(g);
}
