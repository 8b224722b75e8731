/*
 * profile.c — the op profiler (ember/trace.h): an observer that counts and times every call
 * the thread makes, per (op name, device type), with self and total time, the bytes the
 * outputs allocated, the bytes copied between device types and the ops that fell back to the
 * CPU; and its report (ember-train --profile).
 *
 * With options.trace it also keeps every call's start and duration, and the spans the core and
 * the program mark on the thread (the loader's waits, optimizer steps, em_profiler_range_*),
 * and writes them as Chrome trace-event JSON (jansson), which Perfetto and chrome://tracing
 * open (ember-train --trace). Spans reach the thread's tracing profilers through a
 * thread-local list: with none, marking one costs a thread-local load and a branch.
 */
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

/* Traces longer than this stop recording (and say so): 48 bytes each, 192 MiB. */
#define TRACE_MAX_EVENTS ((size_t)4 << 20)

struct em_profiler {
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
    bool running, failed;
    pthread_t thread;
    em_observer obs;
    /* options.trace */
    bool trace, truncated;
    tev *ev;
    size_t n_ev, cap_ev;
    char **names;         /* span names, categories, argument names and values; [0] unused */
    size_t n_names, cap_names;
    uint64_t t_origin;    /* em__now_ns at the start: the trace's time 0 */
    long tid;             /* the thread's id (gettid) */
    struct em_profiler *next_tracing; /* the thread's other tracing profilers */
};

/* The tracing profilers running on this thread (spans go to each), and their count. */
static _Thread_local em_profiler *T_tracing;
__attribute__((tls_model("initial-exec"))) _Thread_local int em__spans;

static bool trace_push(em_profiler *p, const tev *e) {
    if (p->n_ev == p->cap_ev) {
        if (p->n_ev >= TRACE_MAX_EVENTS) {
            p->truncated = true;
            return false;
        }
        size_t nc = p->cap_ev ? p->cap_ev * 2 : 4096;
        tev *v = em__realloc(p->ev, p->cap_ev * sizeof *v, nc * sizeof *v, "profiler trace");
        if (!v) {
            p->failed = true;
            return false;
        }
        p->ev = v, p->cap_ev = nc;
    }
    p->ev[p->n_ev++] = *e;
    return true;
}

/* The index of s in p->names (added when new); 0 when out of memory or s is NULL. Spans use a
 * handful of strings, so a linear search is enough. */
static uint32_t name_of(em_profiler *p, const char *s) {
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
    for (em_profiler *p = T_tracing; p; p = p->next_tracing) {
        tev e = {.t0 = t0, .dur = t1 > t0 ? t1 - t0 : 0, .name = name_of(p, name),
                 .cat = name_of(p, cat), .key = name_of(p, key), .kind = TEV_SPAN,
                 .str_arg = sval != NULL, .arg = sval ? (int64_t)name_of(p, sval) : ival};
        if (!e.name) p->failed = true;
        else trace_push(p, &e);
    }
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

static void on_begin(void *user, const em_op_event *ev) {
    em_profiler *p = user;
    if (p->depth == p->cap_stack) {
        size_t nc = p->cap_stack ? p->cap_stack * 2 : 16;
        frame *s = em__realloc(p->stack, p->cap_stack * sizeof *s, nc * sizeof *s, "profiler");
        if (!s) {
            p->failed = true;
            return;
        }
        p->stack = s, p->cap_stack = nc;
    }
    frame *fr = &p->stack[p->depth++];
    *fr = (frame){.id = ev->id, .name = ev->name};
    if (p->trace) {
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
}

/* The row of (name, devtype), made when new; NULL when out of memory. */
static row *row_of(em_profiler *p, const char *name, int devtype) {
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

static void on_end(void *user, const em_op_event *ev) {
    em_profiler *p = user;
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
    if (p->trace) {
        tev e = {.t0 = fr.t0, .dur = device_clock ? device_ns : total,
                 .device_clock = device_clock, .name = (uint32_t)(r - p->rows),
                 .kind = (uint8_t)ev->kind, .depth = (uint16_t)EM_MIN(ev->depth, UINT16_MAX),
                 .dev_index = dev.index};
        trace_push(p, &e);
    }
    /* A call inside a call of the same op (conv2d's composite around its conv2d kernel) is
     * already in the outer one's total: counting it again would double the op's time. */
    bool recursive = false;
    for (size_t d = 0; ev->name && d < p->depth && !recursive; d++)
        recursive = p->stack[d].name && strcmp(p->stack[d].name, ev->name) == 0;
    r->pub.calls++;
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

em_profiler *em_profiler_begin(const em_profiler_options *opt) {
    if (opt && opt->struct_size < offsetof(em_profiler_options, ext)) {
        em_set_error(EM_ERR_INVALID, "profiler_begin: options struct_size %zu too small",
                     opt->struct_size);
        return NULL;
    }
    em_profiler *p = em__calloc(1, sizeof *p, "profiler");
    if (!p) return NULL;
    p->obs = (em_observer){.struct_size = sizeof p->obs, .begin = on_begin, .end = on_end,
                           .user = p};
    if (em_observer_push(&p->obs) != EM_OK) {
        em__free(p);
        return NULL;
    }
    p->running = true;
    p->thread = pthread_self();
    p->trace = opt && opt->trace;
    p->t_origin = em__now_ns();
    p->tid = (long)syscall(SYS_gettid);
    if (p->trace) {
        p->next_tracing = T_tracing;
        T_tracing = p;
        em__spans++;
    }
    return p;
}

em_profiler *em_profiler_start(void) { return em_profiler_begin(NULL); }

em_status em_profiler_stop(em_profiler *p) {
    if (!p) return em_set_error(EM_ERR_INVALID, "profiler_stop: NULL profiler");
    if (!p->running) return em_set_error(EM_ERR_STATE, "profiler_stop: the profiler is stopped");
    if (!pthread_equal(p->thread, pthread_self()))
        return em_set_error(EM_ERR_STATE, "profiler_stop: called from another thread than the "
                            "one that started it (its observer belongs to that thread)");
    em_status st = em_observer_pop(&p->obs);
    if (st != EM_OK) return st;
    p->running = false;
    if (p->trace) {
        for (em_profiler **q = &T_tracing; *q; q = &(*q)->next_tracing)
            if (*q == p) {
                *q = p->next_tracing;
                em__spans--;
                break;
            }
    }
    return EM_OK;
}

em_status em_profiler_end(em_profiler *p) {
    if (!p) return em_set_error(EM_ERR_INVALID, "profiler_end: NULL profiler");
    return em_profiler_stop(p);
}

void em_profiler_free(em_profiler *p) {
    if (!p) return;
    if (p->running && !pthread_equal(p->thread, pthread_self())) {
        /* Still the observer of its own thread: freeing it would leave that thread calling
         * into freed memory. */
        em_log_write(EM_LOG_WARN, "profiler_free: the profiler is running on another thread; "
                     "stop it there first (it is not freed)");
        return;
    }
    if (p->running) em_profiler_stop(p);
    for (size_t i = 0; i < p->depth; i++) { /* calls still open when it stopped */
        const em_device_ops *o = p->stack[i].ev0 ? em__device_ops(p->stack[i].dev) : NULL;
        if (o) o->event_destroy(p->stack[i].dev.index, p->stack[i].ev0);
    }
    for (size_t i = 0; i < p->n; i++) em__free((char *)p->rows[i].pub.op);
    em__free(p->rows);
    em__free(p->slots);
    em__free(p->stack);
    em__free(p->ev);
    for (size_t i = 1; i < p->n_names; i++) em__free(p->names[i]);
    em__free(p->names);
    em__free(p);
}

size_t em_profiler_row_count(const em_profiler *p) { return p ? p->n : 0; }
const em_profile_row *em_profiler_row(const em_profiler *p, size_t i) {
    return p && i < p->n ? &p->rows[i].pub : NULL;
}

uint64_t em_profiler_bytes_copied(const em_profiler *p, const char *from, const char *to) {
    int a = p && from ? em__device_type_find(from) : -1, b = p && to ? em__device_type_find(to) : -1;
    return a >= 0 && b >= 0 ? p->copied[a][b] : 0;
}

static int by_total(const void *a, const void *b) {
    const row *x = *(const row *const *)a, *y = *(const row *const *)b;
    return x->pub.total_ns < y->pub.total_ns ? 1 : x->pub.total_ns > y->pub.total_ns ? -1 : 0;
}

static int by_self(const void *a, const void *b) {
    const row *x = *(const row *const *)a, *y = *(const row *const *)b;
    return x->pub.self_ns < y->pub.self_ns ? 1 : x->pub.self_ns > y->pub.self_ns ? -1 : 0;
}

void em_profiler_report(const em_profiler *p, FILE *f, int top) {
    if (!p || !f) return;
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
    fprintf(f, "ops by self time%s:\n", shown < p->n ? " (the slowest)" : "");
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
    fprintf(f, "top %zu ops by total time (the ops nested inside included):\n", shown);
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

/* One event per line. The metadata go through jansson whole; the calls and spans, many, are
 * printed with their strings quoted by jansson once per row or name. */
em_status em_profiler_write_trace(const em_profiler *p, FILE *f) {
    if (!p || !f) return em_set_error(EM_ERR_INVALID, "profiler_write_trace: NULL profiler or file");
    if (!p->trace)
        return em_set_error(EM_ERR_STATE, "profiler_write_trace: the profiler was not begun with "
                            "options.trace");
    if (p->running && !pthread_equal(p->thread, pthread_self()))
        return em_set_error(EM_ERR_STATE, "profiler_write_trace: the profiler is running on "
                            "another thread (stop it there first)");
    long pid = (long)getpid();
    char **rq = p->n ? em__calloc(p->n, sizeof *rq, "profiler trace") : NULL;
    char **nq = p->n_names ? em__calloc(p->n_names, sizeof *nq, "profiler trace") : NULL;
    bool ok = (!p->n || rq) && (!p->n_names || nq);
    for (size_t i = 0; ok && i < p->n; i++) ok = (rq[i] = json_quoted(p->rows[i].pub.op)) != NULL;
    for (size_t i = 1; ok && i < p->n_names; i++) ok = (nq[i] = json_quoted(p->names[i])) != NULL;
    if (!ok) {
        for (size_t i = 0; rq && i < p->n; i++) free(rq[i]);
        for (size_t i = 1; nq && i < p->n_names; i++) free(nq[i]);
        em__free(rq);
        em__free(nq);
        return em_set_error(EM_ERR_NOMEM, "profiler_write_trace: out of memory");
    }
    json_t *meta[2] = {
        json_pack("{s:s, s:s, s:I, s:I, s:{s:s}}", "ph", "M", "name", "process_name", "pid",
                  (json_int_t)pid, "tid", (json_int_t)p->tid, "args", "name", "ember"),
        json_pack("{s:s, s:s, s:I, s:I, s:{s:s}}", "ph", "M", "name", "thread_name", "pid",
                  (json_int_t)pid, "tid", (json_int_t)p->tid, "args", "name",
                  "profiled thread")};
    ok = meta[0] && meta[1] && fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f) >= 0;
    for (int m = 0; m < 2 && ok; m++)
        ok = (m == 0 || fputs(",\n", f) >= 0) && json_dumpf(meta[m], f, JSON_COMPACT) == 0;
    json_decref(meta[0]);
    json_decref(meta[1]);
    for (size_t i = 0; ok && i < p->n_ev; i++) {
        const tev *e = &p->ev[i];
        /* microseconds with the nanoseconds kept */
        int64_t ts = (int64_t)(e->t0 - p->t_origin);
        if (e->kind == TEV_SPAN) {
            char arg[64] = "";
            if (e->key && !e->str_arg)
                snprintf(arg, sizeof arg, "%" PRId64, e->arg);
            ok = fprintf(f, ",\n{\"name\":%s,\"cat\":%s,\"ph\":\"X\",\"ts\":%" PRId64 ".%03d,"
                         "\"dur\":%" PRIu64 ".%03d,\"pid\":%ld,\"tid\":%ld,\"args\":{%s%s%s}}",
                         nq[e->name], e->cat ? nq[e->cat] : "\"span\"", ts / 1000,
                         (int)(ts % 1000), e->dur / 1000, (int)(e->dur % 1000), pid, p->tid,
                         e->key ? nq[e->key] : "", e->key ? ":" : "",
                         !e->key ? "" : e->str_arg ? (e->arg ? nq[e->arg] : "\"?\"") : arg) > 0;
        } else {
            const row *r = &p->rows[e->name];
            ok = fprintf(f, ",\n{\"name\":%s,\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%" PRId64 ".%03d,"
                         "\"dur\":%" PRIu64 ".%03d,\"pid\":%ld,\"tid\":%ld,\"args\":{\"device\":"
                         "\"%s:%d\",\"depth\":%d,\"clock\":\"%s\"}}", rq[e->name],
                         kind_name(e->kind), ts / 1000, (int)(ts % 1000), e->dur / 1000,
                         (int)(e->dur % 1000), pid, p->tid, r->pub.device_type, e->dev_index,
                         e->depth, e->device_clock ? "device" : "host") > 0;
        }
    }
    ok = ok && fputs("\n]}\n", f) >= 0 && fflush(f) == 0 && !ferror(f);
    for (size_t i = 0; i < p->n; i++) free(rq[i]);
    for (size_t i = 1; i < p->n_names; i++) free(nq[i]);
    em__free(rq);
    em__free(nq);
    if (!ok) return em_set_error(EM_ERR_IO, "profiler_write_trace: writing the trace failed");
    return EM_OK;
}
