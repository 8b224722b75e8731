/*
 * profile.c — the op profiler (ember/trace.h): an observer that counts and times every call
 * the thread makes, per (op name, device type), with self and total time, the bytes the
 * outputs allocated, the bytes copied between device types and the ops that fell back to the
 * CPU; and its report (ember-train --profile).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
    bool child_fell_back;
} frame;

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
};

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
    p->stack[p->depth++] = (frame){.id = ev->id, .t0 = em__now_ns()};
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
    r->pub.calls++;
    r->pub.total_ns += total;
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

em_profiler *em_profiler_start(void) {
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
    return p;
}

em_status em_profiler_stop(em_profiler *p) {
    if (!p) return em_set_error(EM_ERR_INVALID, "profiler_stop: NULL profiler");
    if (!p->running) return em_set_error(EM_ERR_STATE, "profiler_stop: the profiler is stopped");
    if (!pthread_equal(p->thread, pthread_self()))
        return em_set_error(EM_ERR_STATE, "profiler_stop: called from another thread than the "
                            "one that started it (its observer belongs to that thread)");
    em_status st = em_observer_pop(&p->obs);
    if (st == EM_OK) p->running = false;
    return st;
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
    for (size_t i = 0; i < p->n; i++) em__free((char *)p->rows[i].pub.op);
    em__free(p->rows);
    em__free(p->slots);
    em__free(p->stack);
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
    em__free(sorted);
    if (p->failed) fprintf(f, "(out of memory while profiling: some calls are missing)\n");
}
