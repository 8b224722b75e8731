/*
 * profile.c — the op profiler (ember/trace.h): a process-wide session that counts and times
 * every call every thread makes while it runs, per (op name, device type), with self and total
 * time, the bytes the outputs allocated, the bytes copied between device types and the ops
 * that fell back to the CPU; and its report (ember-train --profile).
 *
 * With options.trace it also keeps every call's start and duration, and the spans the core and
 * the program mark (the loader's waits and batch fills, optimizer steps, em_profiler_range_*),
 * and writes them as Chrome trace-event JSON (jansson), which Perfetto and chrome://tracing
 * open (ember-train --trace), one track per thread.
 *
 * Threads. Each thread records into a buffer of its own (a lane), made and linked into the
 * session (a lock-free push) on its first event: the per-call path takes no lock. A session
 * reaches every thread through the EM__OBS_SESSION bit of its observer word (observe.h), set
 * and cleared on every registered thread by em_profiler_begin / em_profiler_end, whichever
 * thread calls them. A thread marks itself busy (em__self.busy) around each event and then
 * reads the running session; em_profiler_end unpublishes the session, then waits until no
 * thread is busy (em__obs_quiesce), so that no lane is written once it reads them: the two
 * sequentially consistent store-then-load pairs (Dekker) let no thread see the session and
 * escape the wait. Lanes of threads that exit before the end stay in the session. The end
 * merges every lane's rows into the profiler's.
 */
#define _GNU_SOURCE /* pthread_getname_np, program_invocation_short_name */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ember/device.h"
#include "ember/error.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "internal.h"
#include "observe.h"

typedef struct row {
    em_profile_row pub;
    uint64_t hash;
    int devtype;
} row;

typedef struct frame {
    uint64_t id, t0, child_ns;
    const char *name;     /* the call's (borrowed: it is running) */
    bool child_fell_back;
    em_event *ev0;        /* trace, on a device with timed events: recorded as the call began */
    em_device dev;        /* ev0's device */
} frame;

/* One traced call or span (options.trace). */
enum { TEV_SPAN = 0xff };
typedef struct tev {
    uint64_t t0, dur;     /* ns: em__now_ns at its start, and how long it took */
    uint32_t name;        /* a call: its row; a span: its name in names */
    uint32_t cat;         /* a span: its category in names */
    uint32_t key;         /* a span's argument: its name in names (0: none) */
    uint8_t kind;         /* em_op_event_kind, or TEV_SPAN */
    bool str_arg;         /* the span's argument is names[arg], else the integer arg */
    bool device_clock;    /* dur is the device's time between two timed events */
    uint16_t depth;
    int16_t dev_index;
    int64_t arg;
} tev;

/* Traces longer than this, all threads together, stop recording (and say so): 48 bytes each,
 * 192 MiB. */
#define TRACE_MAX_EVENTS ((size_t)4 << 20)

/* One thread's buffers in a session (and, as em_profiler.all, every thread's rows merged). */
typedef struct lane {
    row *rows;
    size_t n, cap;
    size_t *slots;           /* row index + 1, open addressing */
    size_t n_slots;
    frame *stack;
    size_t depth, cap_stack;
    uint64_t copied[EM_MAX_DEVICE_TYPES][EM_MAX_DEVICE_TYPES];
    /* per device type: kernel calls, self time */
    uint64_t dev_ops[EM_MAX_DEVICE_TYPES], dev_ns[EM_MAX_DEVICE_TYPES],
        dev_fallbacks[EM_MAX_DEVICE_TYPES];
    uint64_t calls, self_ns; /* the thread's calls and their self time */
    uint64_t spans;          /* and its spans (options.trace) */
    bool failed, truncated;
    /* options.trace */
    tev *ev;
    size_t n_ev, cap_ev;
    char **names;         /* span names, categories, argument names and values; [0] unused */
    size_t n_names, cap_names;
    long tid;             /* the thread's id (gettid) */
    char name[32];        /* "main", "loader worker 0", ... */
    struct lane *next;    /* the session's lane made before this one */
} lane;

struct em_profiler {
    lane all;               /* every lane's rows, merged when it ends */
    lane *_Atomic lanes;    /* one per thread that recorded, newest first */
    size_t n_lanes;         /* counted when it ended */
    bool running, trace;
    atomic_bool lost;       /* a thread's lane could not be made (out of memory) */
    _Atomic size_t ev_left; /* events the lanes may still take (TRACE_MAX_EVENTS at the start) */
    uint64_t gen;           /* this session's number: a thread's lane is this session's */
    uint64_t t_origin;      /* em__now_ns at the start: the trace's time 0 */
};

/* The running profiler (one per process) and the number of sessions begun: begin, end and free
 * take the lock; the recording threads read running_p only. */
static pthread_mutex_t prof_mu = PTHREAD_MUTEX_INITIALIZER;
static em_profiler *_Atomic running_p;
static uint64_t sessions;
_Atomic int em__spans;

/* The calling thread's name in the trace: em__thread_set_name's, "main" for the process's
 * first thread, a name given with pthread_setname_np, else "thread <tid>". */
static void thread_name(char *buf, size_t cap, long tid) {
    char pn[32] = "";
    if (em__self.name[0]) snprintf(buf, cap, "%s", em__self.name);
    else if (tid == (long)getpid()) snprintf(buf, cap, "main");
    /* a thread's default name is the program's (its first 15 bytes) */
    else if (pthread_getname_np(pthread_self(), pn, sizeof pn) == 0 && pn[0] &&
             strncmp(pn, program_invocation_short_name, 15) != 0)
        snprintf(buf, cap, "%s", pn);
    else snprintf(buf, cap, "thread %ld", tid);
}

/* Mark the thread busy and return its lane of the running session (made on its first event),
 * the session in *pp; NULL, the thread not busy, when none runs (or out of memory). A non-NULL
 * return pairs with leave(). */
static lane *enter(em_profiler **pp) {
    em__thread *t = &em__self;
    if (!t->linked) {
        em__thread_register();
        if (!t->linked) return NULL; /* unlisted: em_profiler_end could not wait for it */
    }
    atomic_store_explicit(&t->busy, 1, memory_order_seq_cst);
    em_profiler *p = atomic_load_explicit(&running_p, memory_order_seq_cst);
    if (!p) goto idle;
    if (t->lane_gen != p->gen) {
        lane *l = em__calloc(1, sizeof *l, "profiler thread buffer");
        if (!l) {
            atomic_store_explicit(&p->lost, true, memory_order_relaxed);
            goto idle;
        }
        l->tid = t->tid;
        thread_name(l->name, sizeof l->name, t->tid);
        l->next = atomic_load_explicit(&p->lanes, memory_order_relaxed);
        while (!atomic_compare_exchange_weak_explicit(&p->lanes, &l->next, l,
                                                      memory_order_release,
                                                      memory_order_relaxed)) {
        }
        t->lane = l;
        t->lane_gen = p->gen;
    }
    *pp = p;
    return t->lane;
idle:
    atomic_store_explicit(&t->busy, 0, memory_order_release);
    return NULL;
}

static void leave(void) { atomic_store_explicit(&em__self.busy, 0, memory_order_release); }

static bool trace_push(em_profiler *p, lane *l, const tev *e) {
    if (l->n_ev == l->cap_ev) {
        /* Grow by what the session's budget still allows (all its threads share it). */
        size_t want = l->cap_ev ? l->cap_ev : 4096, got;
        size_t left = atomic_load_explicit(&p->ev_left, memory_order_relaxed);
        do {
            got = EM_MIN(want, left);
            if (!got) {
                l->truncated = true;
                return false;
            }
        } while (!atomic_compare_exchange_weak_explicit(&p->ev_left, &left, left - got,
                                                        memory_order_relaxed,
                                                        memory_order_relaxed));
        size_t nc = l->cap_ev + got;
        tev *v = em__realloc(l->ev, l->cap_ev * sizeof *v, nc * sizeof *v, "profiler trace");
        if (!v) {
            atomic_fetch_add_explicit(&p->ev_left, got, memory_order_relaxed);
            l->failed = true;
            return false;
        }
        l->ev = v, l->cap_ev = nc;
    }
    l->ev[l->n_ev++] = *e;
    return true;
}

/* The index of s in p->names (added when new); 0 when out of memory or s is NULL. Spans use a
 * handful of strings, so a linear search is enough. */
static uint32_t name_of(lane *p, const char *s) {
    if (!s) return 0;
    for (size_t i = 1; i < p->n_names; i++)
        if (strcmp(p->names[i], s) == 0) return (uint32_t)i;
    if (p->n_names >= UINT32_MAX) return 0;
    if (!p->n_names) p->n_names = 1;
    if (p->n_names >= p->cap_names) {
        size_t nc = p->cap_names ? p->cap_names * 2 : 16;
        char **v = em__realloc(p->names, p->cap_names * sizeof *v, nc * sizeof *v, "profiler");
        if (!v) return 0;
        p->names = v, p->cap_names = nc;
    }
    char *c = em__strdup(s, "profiler");
    if (!c) return 0;
    p->names[p->n_names] = c;
    return (uint32_t)p->n_names++;
}

void em__prof_span(const char *name, const char *cat, const char *key, const char *sval,
                   int64_t ival, uint64_t t0, uint64_t t1) {
    em_profiler *p;
    lane *l = enter(&p);
    if (!l) return;
    if (p->trace) {
        /* A span begun before the session (begun meanwhile on another thread) starts at the
         * trace's time 0. */
        if (t0 < p->t_origin) t0 = EM_MIN(p->t_origin, t1);
        tev e = {.t0 = t0, .dur = t1 > t0 ? t1 - t0 : 0, .name = name_of(l, name),
                 .cat = name_of(l, cat), .key = name_of(l, key), .kind = TEV_SPAN,
                 .str_arg = sval != NULL, .arg = sval ? (int64_t)name_of(l, sval) : ival};
        if (!e.name) l->failed = true;
        else l->spans += trace_push(p, l, &e);
    }
    leave();
}

/* The program's own spans (em_profiler_range_begin/end): a stack per thread. */
#define RANGES_MAX 64
static _Thread_local struct {
    const char *name[RANGES_MAX];
    uint64_t t0[RANGES_MAX];
    int n, lost; /* open ranges; ranges begun past RANGES_MAX (not recorded) */
} R;

void em_profiler_range_begin(const char *name) {
    if (!em__spanning()) return;
    if (R.n == RANGES_MAX) {
        R.lost++;
        return;
    }
    R.name[R.n] = name ? name : "?";
    R.t0[R.n++] = em__now_ns();
}

void em_profiler_range_end(void) {
    if (R.lost) {
        R.lost--;
        return;
    }
    if (!R.n) return;
    R.n--;
    if (em__spanning())
        em__prof_span(R.name[R.n], "range", NULL, NULL, 0, R.t0[R.n], em__now_ns());
}

void em__prof_begin(const em_op_event *ev) {
    em_profiler *prof;
    lane *p = enter(&prof);
    if (!p) return;
    if (p->depth == p->cap_stack) {
        size_t nc = p->cap_stack ? p->cap_stack * 2 : 16;
        frame *s = em__realloc(p->stack, p->cap_stack * sizeof *s, nc * sizeof *s, "profiler");
        if (!s) {
            p->failed = true;
            leave();
            return;
        }
        p->stack = s, p->cap_stack = nc;
    }
    frame *fr = &p->stack[p->depth++];
    *fr = (frame){.id = ev->id, .name = ev->name};
    if (prof->trace) {
        /* On an asynchronous device with timed events the call's time is the device's: an
         * event on the thread's current stream now, another at its end. */
        const em_tensor *t = ev->n_in && ev->in && ev->in[0] ? ev->in[0]
                             : ev->n_out && ev->out && ev->out[0] ? ev->out[0] : NULL;
        em_device d = t ? t->storage->device : em_cpu();
        const em_device_ops *o = d.type != EM_DEVICE_CPU_TYPE ? em__device_ops(d) : NULL;
        if (o && o->event_create_timed && o->event_elapsed_ns && o->event_record &&
            o->event_destroy && o->event_create_timed(d.index, &fr->ev0) == EM_OK) {
            if (o->event_record(d.index, fr->ev0, em_stream_current(d)) == EM_OK) fr->dev = d;
            else o->event_destroy(d.index, fr->ev0), fr->ev0 = NULL;
        }
    }
    fr->t0 = em__now_ns();
    leave();
}

/* The row of (name, devtype), made when new; NULL when out of memory. */
static row *row_of(lane *p, const char *name, int devtype) {
    uint64_t h = em__strhash(name) ^ ((uint64_t)devtype * 0x9e3779b97f4a7c15ull);
    if (p->n_slots) {
        for (size_t i = (size_t)h & (p->n_slots - 1);; i = (i + 1) & (p->n_slots - 1)) {
            size_t s = p->slots[i];
            if (!s) break;
            row *r = &p->rows[s - 1];
            if (r->hash == h && r->devtype == devtype && strcmp(r->pub.op, name) == 0) return r;
        }
    }
    if ((p->n + 1) * 2 > p->n_slots) {
        size_t ns = p->n_slots ? p->n_slots * 2 : 64;
        size_t *sl = em__calloc(ns, sizeof *sl, "profiler");
        if (!sl) return NULL;
        for (size_t k = 0; k < p->n; k++) {
            size_t i = (size_t)p->rows[k].hash & (ns - 1);
            while (sl[i]) i = (i + 1) & (ns - 1);
            sl[i] = k + 1;
        }
        em__free(p->slots);
        p->slots = sl, p->n_slots = ns;
    }
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 32;
        row *r = em__realloc(p->rows, p->cap * sizeof *r, nc * sizeof *r, "profiler");
        if (!r) return NULL;
        /* Rows moved: the strings they own did not. */
        p->rows = r, p->cap = nc;
    }
    char *s = em__strdup(name, "profiler");
    if (!s) return NULL;
    row *r = &p->rows[p->n];
    *r = (row){.pub = {.op = s, .device_type = em__device_types[devtype].name}, .hash = h,
               .devtype = devtype};
    size_t i = (size_t)h & (p->n_slots - 1);
    while (p->slots[i]) i = (i + 1) & (p->n_slots - 1);
    p->slots[i] = ++p->n;
    return r;
}

/* Bytes of the storage output j holds that no input (nor an earlier output) shares: memory
 * the call allocated (a view, an in-place op and a write into given outputs have none). */
static size_t new_bytes(const em_op_event *ev, int j) {
    if (ev->kind == EM_OP_EVENT_OUT || ev->kind == EM_OP_EVENT_INPLACE ||
        ev->kind == EM_OP_EVENT_LIST ||
        (ev->kind == EM_OP_EVENT_COPY && strcmp(ev->name, "copy_") == 0))
        return 0;
    return em__obs_new_bytes(ev, j);
}

static void record_end(em_profiler *prof, lane *p, const em_op_event *ev) {
    if (!p->depth || p->stack[p->depth - 1].id != ev->id) return; /* began before the start */
    frame fr = p->stack[--p->depth];
    uint64_t device_ns = 0;
    bool device_clock = false;
    if (fr.ev0) { /* the device's time from the call's first event to one recorded now */
        const em_device_ops *o = em__device_ops(fr.dev);
        em_event *ev1 = NULL;
        if (o && o->event_create_timed(fr.dev.index, &ev1) == EM_OK) {
            device_clock = o->event_record(fr.dev.index, ev1, em_stream_current(fr.dev)) == EM_OK &&
                           o->event_elapsed_ns(fr.dev.index, fr.ev0, ev1, &device_ns) == EM_OK;
            o->event_destroy(fr.dev.index, ev1);
        }
        if (o) o->event_destroy(fr.dev.index, fr.ev0);
    }
    const em_tensor *where = ev->n_out && ev->out && ev->out[0] ? ev->out[0]
                             : ev->n_in && ev->in && ev->in[0] ? ev->in[0] : NULL;
    em_device dev = where ? where->storage->device : em_cpu();
    /* An asynchronous device's work is done when it says so: time it to there. */
    if (dev.type != EM_DEVICE_CPU_TYPE && ev->status == EM_OK) em_device_synchronize(dev);
    uint64_t total = em__now_ns() - fr.t0, self = total > fr.child_ns ? total - fr.child_ns : 0;
    bool fell_back = ev->fell_back && !fr.child_fell_back; /* the op itself, not one inside it */
    if (p->depth) {
        p->stack[p->depth - 1].child_ns += total;
        p->stack[p->depth - 1].child_fell_back |= ev->fell_back;
    }
    row *r = row_of(p, ev->name ? ev->name : "?", dev.type);
    if (!r) {
        p->failed = true;
        return;
    }
    if (prof->trace) {
        tev e = {.t0 = fr.t0, .dur = device_clock ? device_ns : total,
                 .device_clock = device_clock, .name = (uint32_t)(r - p->rows),
                 .kind = (uint8_t)ev->kind, .depth = (uint16_t)EM_MIN(ev->depth, UINT16_MAX),
                 .dev_index = dev.index};
        trace_push(prof, p, &e);
    }
    /* A call inside a call of the same op (conv2d's composite around its conv2d kernel) is
     * already in the outer one's total: counting it again would double the op's time. */
    bool recursive = false;
    for (size_t d = 0; ev->name && d < p->depth && !recursive; d++)
        recursive = p->stack[d].name && strcmp(p->stack[d].name, ev->name) == 0;
    r->pub.calls++;
    p->calls++;
    p->self_ns += self;
    if (!recursive) r->pub.total_ns += total;
    r->pub.self_ns += self;
    r->pub.fallbacks += fell_back;
    for (int j = 0; ev->status == EM_OK && j < ev->n_out && ev->out; j++)
        if (ev->out[j]) r->pub.bytes += new_bytes(ev, j);
    bool kernel = ev->kind == EM_OP_EVENT_OP || ev->kind == EM_OP_EVENT_OUT ||
                  ev->kind == EM_OP_EVENT_LIST;
    /* A call that fell back ran its kernel on the CPU: that call is counted there. */
    if (kernel && ev->status == EM_OK && !fell_back) p->dev_ops[dev.type]++;
    if (fell_back) p->dev_fallbacks[dev.type]++;
    p->dev_ns[dev.type] += self;
    /* copy_ moves the bytes (to_device and the fallback's copies run it). */
    if (ev->kind == EM_OP_EVENT_COPY && ev->status == EM_OK && strcmp(ev->name, "copy_") == 0 &&
        ev->n_in == 2 && ev->in[0] && ev->in[1]) {
        int to = ev->in[0]->storage->device.type, from = ev->in[1]->storage->device.type;
        if (to != from) p->copied[from][to] += em_tensor_nbytes(ev->in[0]);
    }
}

void em__prof_end(const em_op_event *ev) {
    em_profiler *prof;
    lane *p = enter(&prof);
    if (!p) return;
    record_end(prof, p, ev);
    leave();
}

em_profiler *em_profiler_begin(const em_profiler_options *opt) {
    if (opt && opt->struct_size < offsetof(em_profiler_options, ext)) {
        em_set_error(EM_ERR_INVALID, "profiler_begin: options struct_size %zu too small",
                     opt->struct_size);
        return NULL;
    }
    em_profiler *p = em__calloc(1, sizeof *p, "profiler");
    if (!p) return NULL;
    p->trace = opt && opt->trace;
    atomic_init(&p->ev_left, TRACE_MAX_EVENTS);
    em__thread_register(); /* this thread is listed even before it runs an op */
    pthread_mutex_lock(&prof_mu);
    if (atomic_load_explicit(&running_p, memory_order_relaxed)) {
        pthread_mutex_unlock(&prof_mu);
        em__free(p);
        em_set_error(EM_ERR_STATE, "profiler_begin: a profiler is running already (a session "
                     "profiles every thread of the process: end that one first)");
        return NULL;
    }
    p->gen = ++sessions;
    p->t_origin = em__now_ns();
    p->running = true;
    /* Published before the threads' bits are set: a thread that sees its bit finds it. */
    atomic_store_explicit(&running_p, p, memory_order_seq_cst);
    if (p->trace) atomic_store_explicit(&em__spans, 1, memory_order_relaxed);
    em__obs_session(true);
    pthread_mutex_unlock(&prof_mu);
    return p;
}

em_profiler *em_profiler_start(void) { return em_profiler_begin(NULL); }

/* Every lane's rows and counts into p->all, the lanes put in the order they were made. */
static void merge(em_profiler *p) {
    lane *l = atomic_load_explicit(&p->lanes, memory_order_acquire), *old = NULL;
    while (l) {
        lane *next = l->next;
        l->next = old, old = l, l = next;
    }
    atomic_store_explicit(&p->lanes, old, memory_order_relaxed);
    lane *a = &p->all;
    for (l = old; l; l = l->next) {
        p->n_lanes++;
        for (size_t i = 0; i < l->n; i++) {
            const row *s = &l->rows[i];
            row *r = row_of(a, s->pub.op, s->devtype);
            if (!r) {
                a->failed = true;
                continue;
            }
            r->pub.calls += s->pub.calls;
            r->pub.total_ns += s->pub.total_ns;
            r->pub.self_ns += s->pub.self_ns;
            r->pub.bytes += s->pub.bytes;
            r->pub.fallbacks += s->pub.fallbacks;
        }
        for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) {
            a->dev_ops[d] += l->dev_ops[d];
            a->dev_ns[d] += l->dev_ns[d];
            a->dev_fallbacks[d] += l->dev_fallbacks[d];
            for (int e = 0; e < EM_MAX_DEVICE_TYPES; e++) a->copied[d][e] += l->copied[d][e];
        }
        a->calls += l->calls;
        a->self_ns += l->self_ns;
        a->n_ev += l->n_ev;
        a->failed |= l->failed;
        a->truncated |= l->truncated;
    }
    if (atomic_load_explicit(&p->lost, memory_order_relaxed)) a->failed = true;
}

em_status em_profiler_stop(em_profiler *p) {
    if (!p) return em_set_error(EM_ERR_INVALID, "profiler_stop: NULL profiler");
    pthread_mutex_lock(&prof_mu);
    if (!p->running) {
        pthread_mutex_unlock(&prof_mu);
        return em_set_error(EM_ERR_STATE, "profiler_stop: the profiler is stopped");
    }
    if (atomic_load_explicit(&em__self.busy, memory_order_relaxed)) {
        pthread_mutex_unlock(&prof_mu);
        return em_set_error(EM_ERR_STATE, "profiler_stop: called while this thread records "
                            "into the profiler");
    }
    /* Unpublish, clear every thread's bit, then wait for those recording now (see the top). */
    atomic_store_explicit(&running_p, NULL, memory_order_seq_cst);
    atomic_store_explicit(&em__spans, 0, memory_order_relaxed);
    em__obs_session(false);
    em__obs_quiesce();
    p->running = false;
    merge(p);
    pthread_mutex_unlock(&prof_mu);
    return EM_OK;
}

em_status em_profiler_end(em_profiler *p) {
    if (!p) return em_set_error(EM_ERR_INVALID, "profiler_end: NULL profiler");
    return em_profiler_stop(p);
}

static void lane_clear(lane *l) {
    for (size_t i = 0; i < l->depth; i++) { /* calls still open when it stopped */
        const em_device_ops *o = l->stack[i].ev0 ? em__device_ops(l->stack[i].dev) : NULL;
        if (o) o->event_destroy(l->stack[i].dev.index, l->stack[i].ev0);
    }
    for (size_t i = 0; i < l->n; i++) em__free((char *)l->rows[i].pub.op);
    em__free(l->rows);
    em__free(l->slots);
    em__free(l->stack);
    em__free(l->ev);
    for (size_t i = 1; i < l->n_names; i++) em__free(l->names[i]);
    em__free(l->names);
}

void em_profiler_free(em_profiler *p) {
    if (!p) return;
    pthread_mutex_lock(&prof_mu);
    bool running = p->running;
    pthread_mutex_unlock(&prof_mu);
    if (running && em_profiler_stop(p) != EM_OK) {
        em_log_write(EM_LOG_WARN, "profiler_free: %s (the profiler is not freed)",
                     em_last_error());
        return;
    }
    for (lane *l = atomic_load_explicit(&p->lanes, memory_order_relaxed), *next; l; l = next) {
        next = l->next;
        lane_clear(l);
        em__free(l);
    }
    lane_clear(&p->all);
    em__free(p);
}

size_t em_profiler_row_count(const em_profiler *p) { return p ? p->all.n : 0; }
const em_profile_row *em_profiler_row(const em_profiler *p, size_t i) {
    return p && i < p->all.n ? &p->all.rows[i].pub : NULL;
}

uint64_t em_profiler_bytes_copied(const em_profiler *p, const char *from, const char *to) {
    int a = p && from ? em__device_type_find(from) : -1, b = p && to ? em__device_type_find(to) : -1;
    return a >= 0 && b >= 0 ? p->all.copied[a][b] : 0;
}

static int by_total(const void *a, const void *b) {
    const row *x = *(const row *const *)a, *y = *(const row *const *)b;
    return x->pub.total_ns < y->pub.total_ns ? 1 : x->pub.total_ns > y->pub.total_ns ? -1 : 0;
}

static int by_self(const void *a, const void *b) {
    const row *x = *(const row *const *)a, *y = *(const row *const *)b;
    return x->pub.self_ns < y->pub.self_ns ? 1 : x->pub.self_ns > y->pub.self_ns ? -1 : 0;
}

void em_profiler_report(const em_profiler *pr, FILE *f, int top) {
    if (!pr || !f) return;
    if (pr->running) {
        fprintf(f, "(the profiler is running: its rows are merged from every thread when it "
                "ends)\n");
        return;
    }
    const lane *p = &pr->all;
    /* A session profiles every thread: say which, and what each one did. */
    fprintf(f, "threads: %zu recorded while profiling; every figure below counts all of them "
            "(their times add up)\n", pr->n_lanes);
    fprintf(f, "  %-24s %10s %10s %12s %10s\n", "thread", "tid", "calls", "self ms", "spans");
    for (const lane *l = atomic_load_explicit(&pr->lanes, memory_order_relaxed); l; l = l->next)
        fprintf(f, "  %-24s %10ld %10llu %12.3f %10llu\n", l->name, l->tid,
                (unsigned long long)l->calls, (double)l->self_ns / 1e6,
                (unsigned long long)l->spans);
    fprintf(f, "%-12s %12s %12s %14s %14s %10s\n", "device", "ops", "time ms", "bytes in",
            "bytes out", "fallbacks");
    for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) {
        if (!em__device_types[d].used) continue;
        uint64_t in = 0, out = 0;
        for (int o = 0; o < EM_MAX_DEVICE_TYPES; o++) in += p->copied[o][d], out += p->copied[d][o];
        fprintf(f, "%-12s %12llu %12.3f %14llu %14llu %10llu\n", em__device_types[d].name,
                (unsigned long long)p->dev_ops[d], (double)p->dev_ns[d] / 1e6,
                (unsigned long long)in, (unsigned long long)out,
                (unsigned long long)p->dev_fallbacks[d]);
    }
    const row **sorted = p->n ? em__malloc(p->n * sizeof *sorted, "profile report") : NULL;
    if (p->n && !sorted) {
        fprintf(f, "(out of memory sorting the ops)\n");
        return;
    }
    for (size_t i = 0; i < p->n; i++) sorted[i] = &p->rows[i];
    qsort(sorted, p->n, sizeof *sorted, by_self);
    size_t shown = top > 0 && (size_t)top < p->n ? (size_t)top : p->n;
    fprintf(f, "ops by self time%s, all threads:\n", shown < p->n ? " (the slowest)" : "");
    fprintf(f, "  %-24s %-8s %10s %12s %12s %12s %9s\n", "op", "device", "calls", "self ms",
            "total ms", "MiB out", "fallbacks");
    for (size_t i = 0; i < shown; i++) {
        const em_profile_row *r = &sorted[i]->pub;
        fprintf(f, "  %-24s %-8s %10llu %12.3f %12.3f %12.3f %9llu\n", r->op, r->device_type,
                (unsigned long long)r->calls, (double)r->self_ns / 1e6,
                (double)r->total_ns / 1e6, (double)r->bytes / (1024.0 * 1024.0),
                (unsigned long long)r->fallbacks);
    }
    /* Where the time went, nested calls included: a composite (linear, conv2d) with its
     * sub-ops, the top-level calls of a step first. */
    qsort(sorted, p->n, sizeof *sorted, by_total);
    shown = p->n < 10 ? p->n : 10;
    fprintf(f, "top %zu ops by total time, all threads (the ops nested inside included):\n",
            shown);
    fprintf(f, "  %-24s %-8s %10s %12s %12s\n", "op", "device", "calls", "total ms",
            "self ms");
    for (size_t i = 0; i < shown; i++) {
        const em_profile_row *r = &sorted[i]->pub;
        fprintf(f, "  %-24s %-8s %10llu %12.3f %12.3f\n", r->op, r->device_type,
                (unsigned long long)r->calls, (double)r->total_ns / 1e6,
                (double)r->self_ns / 1e6);
    }
    em__free(sorted);
    if (p->truncated)
        fprintf(f, "(the trace stopped recording after %zu events)\n", p->n_ev);
    if (p->failed) fprintf(f, "(out of memory while profiling: some calls are missing)\n");
}

/* ---- the Chrome trace (em_profiler_write_trace) -------------------------------------------- */

static const char *const kind_names[] = {"op", "composite", "out", "inplace", "list", "view",
                                         "copy"};

/* A string as JSON (quoted, escaped), in a new buffer (free); NULL when out of memory. */
static char *json_quoted(const char *s) {
    json_t *j = json_string(s ? s : "?");
    char *q = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return q;
}

static const char *kind_name(uint8_t k) {
    return k < sizeof kind_names / sizeof *kind_names ? kind_names[k] : "op";
}

/* A metadata event (ph "M") naming the process or a thread, or a thread's sort index. */
static bool meta(FILE *f, long pid, long tid, const char *what, const char *name, int index) {
    json_t *j = name ? json_pack("{s:s, s:s, s:I, s:I, s:{s:s}}", "ph", "M", "name", what, "pid",
                                 (json_int_t)pid, "tid", (json_int_t)tid, "args", "name", name)
                     : json_pack("{s:s, s:s, s:I, s:I, s:{s:i}}", "ph", "M", "name", what, "pid",
                                 (json_int_t)pid, "tid", (json_int_t)tid, "args", "sort_index",
                                 index);
    bool ok = j && fputs(",\n", f) >= 0 && json_dumpf(j, f, JSON_COMPACT) == 0;
    json_decref(j);
    return ok;
}

/* One thread's events, its strings quoted by jansson once per row or name. */
static em_status write_lane(const em_profiler *pr, const lane *p, long pid, FILE *f) {
    char **rq = p->n ? em__calloc(p->n, sizeof *rq, "profiler trace") : NULL;
    char **nq = p->n_names ? em__calloc(p->n_names, sizeof *nq, "profiler trace") : NULL;
    bool ok = (!p->n || rq) && (!p->n_names || nq);
    for (size_t i = 0; ok && i < p->n; i++) ok = (rq[i] = json_quoted(p->rows[i].pub.op)) != NULL;
    for (size_t i = 1; ok && i < p->n_names; i++) ok = (nq[i] = json_quoted(p->names[i])) != NULL;
    em_status st = ok ? EM_OK : em_set_error(EM_ERR_NOMEM, "profiler_write_trace: out of memory");
    for (size_t i = 0; ok && i < p->n_ev; i++) {
        const tev *e = &p->ev[i];
        /* microseconds with the nanoseconds kept (every event starts at or after the origin:
         * spans are clipped to it) */
        uint64_t ts = e->t0 > pr->t_origin ? e->t0 - pr->t_origin : 0;
        if (e->kind == TEV_SPAN) {
            char arg[64] = "";
            if (e->key && !e->str_arg)
                snprintf(arg, sizeof arg, "%" PRId64, e->arg);
            ok = fprintf(f, ",\n{\"name\":%s,\"cat\":%s,\"ph\":\"X\",\"ts\":%" PRIu64 ".%03d,"
                         "\"dur\":%" PRIu64 ".%03d,\"pid\":%ld,\"tid\":%ld,\"args\":{%s%s%s}}",
                         nq[e->name], e->cat ? nq[e->cat] : "\"span\"", ts / 1000,
                         (int)(ts % 1000), e->dur / 1000, (int)(e->dur % 1000), pid, p->tid,
                         e->key ? nq[e->key] : "", e->key ? ":" : "",
                         !e->key ? "" : e->str_arg ? (e->arg ? nq[e->arg] : "\"?\"") : arg) > 0;
        } else {
            const row *r = &p->rows[e->name];
            ok = fprintf(f, ",\n{\"name\":%s,\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%" PRIu64 ".%03d,"
                         "\"dur\":%" PRIu64 ".%03d,\"pid\":%ld,\"tid\":%ld,\"args\":{\"device\":"
                         "\"%s:%d\",\"depth\":%d,\"clock\":\"%s\"}}", rq[e->name],
                         kind_name(e->kind), ts / 1000, (int)(ts % 1000), e->dur / 1000,
                         (int)(e->dur % 1000), pid, p->tid, r->pub.device_type, e->dev_index,
                         e->depth, e->device_clock ? "device" : "host") > 0;
        }
        if (!ok) st = em_set_error(EM_ERR_IO, "profiler_write_trace: writing the trace failed");
    }
    for (size_t i = 0; rq && i < p->n; i++) free(rq[i]);
    for (size_t i = 1; nq && i < p->n_names; i++) free(nq[i]);
    em__free(rq);
    em__free(nq);
    return st;
}

/* One event per line: the metadata (the process, then each thread's name and place), then each
 * thread's calls and spans, the threads in the order they first recorded. */
em_status em_profiler_write_trace(const em_profiler *p, FILE *f) {
    if (!p || !f) return em_set_error(EM_ERR_INVALID, "profiler_write_trace: NULL profiler or file");
    if (!p->trace)
        return em_set_error(EM_ERR_STATE, "profiler_write_trace: the profiler was not begun with "
                            "options.trace");
    if (p->running)
        return em_set_error(EM_ERR_STATE, "profiler_write_trace: the profiler is running (its "
                            "threads' buffers are read once em_profiler_end has stopped them)");
    long pid = (long)getpid();
    const lane *first = atomic_load_explicit(&p->lanes, memory_order_relaxed);
    json_t *proc = json_pack("{s:s, s:s, s:I, s:I, s:{s:s}}", "ph", "M", "name", "process_name",
                             "pid", (json_int_t)pid, "tid", (json_int_t)(first ? first->tid : pid),
                             "args", "name", "ember");
    bool ok = proc && fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f) >= 0 &&
              json_dumpf(proc, f, JSON_COMPACT) == 0;
    json_decref(proc);
    int k = 0;
    for (const lane *l = first; ok && l; l = l->next, k++)
        ok = meta(f, pid, l->tid, "thread_name", l->name, 0) &&
             meta(f, pid, l->tid, "thread_sort_index", NULL, k);
    if (!ok) return em_set_error(EM_ERR_IO, "profiler_write_trace: writing the trace failed");
    for (const lane *l = first; l; l = l->next) {
        em_status st = write_lane(p, l, pid, f);
        if (st != EM_OK) return st;
    }
    if (fputs("\n]}\n", f) < 0 || fflush(f) != 0 || ferror(f))
        return em_set_error(EM_ERR_IO, "profiler_write_trace: writing the trace failed");
    return EM_OK;
}
