/*
 * testdev.c — "testdev", a second device type for the test suite (plugin "ember-testdev",
 * built for `make check`, never installed).
 *
 * It behaves like an accelerator with its own address space, backed by host memory, and it
 * is strict, so that the core's device handling is tested for real:
 *   - two devices, testdev:0 and testdev:1, each with a fixed capacity (TD_CAPACITY);
 *   - device memory is malloc'ed with a header (magic, ordinal, size) and a trailing canary,
 *     and handed out as a TAGGED address: the high bits carry a tag and the ordinal, so core
 *     code that dereferences device memory directly crashes instead of silently working, and
 *     memory of testdev:0 passed as testdev:1 memory is caught;
 *   - every copy and every kernel checks that the device bytes it touches lie inside a live
 *     allocation of the right device; freeing a foreign or damaged block aborts (that is an
 *     Ember bug, never user input);
 *   - it is asynchronous for real: every stream (and each device's default stream) is a queue
 *     served by its own worker thread, and a kernel or copy issued on a stream is only queued.
 *     The workers are LAZY: an item runs only once something needs it — a host wait on its
 *     stream, on the device or on an event recorded after it, an item of another stream that
 *     waits for it (event_wait) and is itself needed, or the release of memory it touches
 *     (as cudaFree waits). Polling an event (event_query) never makes work run. So work always runs as late as the ordering rules allow, the same way
 *     every run: core code that reads or reuses memory before the work on it is ordered shows
 *     wrong data or an ASan report deterministically, never by a timing accident;
 *   - the default stream follows CUDA's legacy rules: its work waits for all work queued
 *     before on the device's other streams, and their later work waits for it; a copy on the
 *     default stream is complete when it returns (em_device_ops.copy);
 *   - every stream and event call checks that its handles belong to the device they are used
 *     on; ember_testdev_pending() (tests find it with dlsym) says how many items of a stream
 *     have not run yet, so a test can show that the work it means to overtake is pending;
 *   - page-locked host memory (host_alloc) is plain host memory with a header; the live
 *     pinned blocks and bytes are counted, and ember_testdev_pinned() reports them (tests
 *     find it with dlsym) so pin_memory can be checked;
 *   - kernels exist only for copy and fill (every dtype) and add (float32), so every other op
 *     exercises the fallback policy (the TD_HOST build below adds more);
 *   - graph capture (the graph_* slots, em_graph_capture_begin) as CUDA graphs behave: while
 *     a stream records, the kernels and device-to-device copies queued on it are recorded, not
 *     run, with the addresses and arguments they had; a replay queues copies of them on the
 *     stream. What CUDA refuses during a capture breaks it here too and the capture's end fails
 *     with the first such error: a copy to or from host memory on the recording stream, waiting
 *     for it or the device, events on it, and any work on the device's default stream (CUDA's
 *     legacy stream rule); one capture per device at a time;
 *   - timed events (event_create_timed, event_elapsed_ns) read a device clock that advances
 *     by exactly TD_KERNEL_NS for each kernel a device runs, and by nothing else: the time
 *     between two such events is a known number, which no host clock would give, so a test
 *     can tell a duration measured by the device's events from one measured on the host.
 *
 * Built a second time with TD_MATH defined, as "ember-testdev-math" (tests/plugins/math/
 * testdev_math.so, a directory of its own: the tests that load all of tests/plugins load one
 * testdev), for
 * ember-opcheck's grad mode (tests/test_opcheck.sh): the same device with kernels for mul and
 * sum (float32 and float64) too — the reduction finite differences need — so add (float32),
 * mul and sum are grad-checked on the device itself; and an op "testdev.twice_badgrad"
 * (y = x + x: kernels on testdev and the CPU, case rows) whose backward is deliberately wrong
 * (3 * grad instead of 2 * grad, written with add, so it runs on testdev): the CPU's backward
 * agrees with it, only finite differences catch it.
 *
 * Built a third time with TD_HOST defined, as "ember-testdev-host" (tests/plugins/host/), with
 * host kernels for the ops in td_host_ops (a small MLP's training step and evaluation, the
 * fused Adam steps and the capturable optimizer steps, and the gradient scaler's
 * amp_unscale_): each is queued on the stream like any testdev kernel and run by the worker
 * as the CPU backend's kernel over the host memory behind the device addresses
 * (em_op_call_out / em_op_call_lists on wrapped tensors), so a whole step runs on the device,
 * in stream order, and is recorded in a graph and replayed (ember-train --graph-capture:
 * tests/test_graph_capture.sh). Every build counts its copies to host memory
 * (ember_testdev_host_reads(), found with dlsym): the host reads a real device would sync on.
 */
#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

#define TD_COUNT 2
#define TD_CAPACITY ((size_t)256 << 20) /* bytes per device */
#define TD_HDR 64                       /* header room; keeps the payload 64-byte aligned */
#define TD_MAGIC 0x7465737464657631ull  /* "testdev1" */
#define TD_DEAD 0x646561646465616dull   /* "deaddeam" */
#define TD_CANARY 0xc0ffee00c0ffee00ull
#define TD_STREAM_MAGIC 0x73747265616d3031ull
#define TD_KERNEL_NS 1000000ull         /* the device clock's advance per kernel run: 1 ms */
#define TD_EVENT_MAGIC 0x6576656e74303031ull

/* Device addresses: bits 60..63 hold TD_TAG, bits 52..59 the ordinal + 1, the rest the host
 * address (user-space pointers fit in 52 bits on every 64-bit Linux target). */
#define TD_TAG 0x5ull
#define TD_ADDR_MASK ((1ull << 52) - 1)

/* ---- allocations -------------------------------------------------------------------------- */

typedef struct td_block {
    uint64_t magic; /* TD_MAGIC while live, TD_DEAD once freed */
    int index;
    size_t nbytes;
    int pending; /* queued items that touch the block and have not run (under G.lock) */
    struct td_block *prev, *next;
} td_block;
static_assert(sizeof(td_block) <= TD_HDR, "the header must fit in TD_HDR");

typedef struct td_queue td_queue;

/* One lock for the whole device model and one condition variable, broadcast on every change a
 * waiter may be waiting for (an item done, a demand raised, a queue stopping). */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    td_block *live[TD_COUNT]; /* live allocations, per device */
    size_t used[TD_COUNT];
    td_queue *def[TD_COUNT];    /* each device's default stream, made on first use */
    td_queue *queues[TD_COUNT]; /* the live (non-default) streams of each device */
    int type; /* our device-type index, learned at registration */
    size_t pinned_blocks, pinned_bytes; /* live host_alloc blocks */
    uint64_t clock[TD_COUNT];   /* each device's clock (timed events): TD_KERNEL_NS per kernel */
    struct td_graph *cap[TD_COUNT]; /* the capture in progress on each device, if any */
    uint64_t host_reads[TD_COUNT]; /* copies from the device to host memory */
} G = {.lock = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .type = -1};

static void *td_tag(void *host, int index) {
    return (void *)((uintptr_t)host | (TD_TAG << 60) | ((uint64_t)(index + 1) << 52));
}

/* Host address of a device address of testdev:index; NULL when it is not one. */
static void *td_untag(const void *dev, int index) {
    uintptr_t a = (uintptr_t)dev;
    if ((a >> 60) != TD_TAG || ((a >> 52) & 0xff) != (uintptr_t)(index + 1)) return NULL;
    return (void *)(a & TD_ADDR_MASK);
}

/* Memory corruption or a foreign pointer: an Ember bug, so stop here loudly. */
static void td_fatal(const char *what, const void *ptr, int index) {
    em_log_write(EM_LOG_ERROR, "testdev: %s (pointer %p, testdev:%d)", what, ptr, index);
    abort();
}

static void td_drain_for_free(int index, td_block *b);

static int td_count(void) { return TD_COUNT; }

static bool td_index_ok(int index) { return index >= 0 && index < TD_COUNT; }

static em_status td_properties(int index, em_device_props *p) {
    if (!td_index_ok(index))
        return em_set_error(EM_ERR_DEVICE, "testdev: no device testdev:%d", index);
    snprintf(p->name, sizeof p->name, "Ember test device %d (host memory)", index);
    pthread_mutex_lock(&G.lock);
    p->total_memory = TD_CAPACITY;
    p->free_memory = TD_CAPACITY - G.used[index];
    pthread_mutex_unlock(&G.lock);
    p->compute_units = 1;
    return EM_OK;
}

static em_status td_alloc(int index, size_t nbytes, void **out) {
    *out = NULL;
    if (!td_index_ok(index))
        return em_set_error(EM_ERR_DEVICE, "testdev: alloc on nonexistent testdev:%d", index);
    pthread_mutex_lock(&G.lock);
    bool fits = nbytes <= TD_CAPACITY - G.used[index];
    if (fits) G.used[index] += nbytes;
    pthread_mutex_unlock(&G.lock);
    if (!fits) return EM_ERR_NOMEM; /* the core retries after emptying its cache */
    void *base = NULL;
    if (posix_memalign(&base, 64, TD_HDR + nbytes + sizeof(uint64_t)) != 0) {
        pthread_mutex_lock(&G.lock);
        G.used[index] -= nbytes;
        pthread_mutex_unlock(&G.lock);
        return EM_ERR_NOMEM;
    }
    td_block *b = base;
    *b = (td_block){.magic = TD_MAGIC, .index = index, .nbytes = nbytes};
    uint64_t canary = TD_CANARY;
    memcpy((char *)base + TD_HDR + nbytes, &canary, sizeof canary);
    pthread_mutex_lock(&G.lock);
    b->next = G.live[index];
    if (b->next) b->next->prev = b;
    G.live[index] = b;
    pthread_mutex_unlock(&G.lock);
    *out = td_tag((char *)base + TD_HDR, index);
    return EM_OK;
}

static void td_free(int index, void *ptr) {
    if (!ptr) return;
    char *host = td_index_ok(index) ? td_untag(ptr, index) : NULL;
    if (!host) td_fatal("free of a pointer that is not this device's memory", ptr, index);
    td_block *b = (td_block *)(host - TD_HDR);
    if (b->magic != TD_MAGIC || b->index != index)
        td_fatal(b->magic == TD_DEAD ? "double free" : "free of a damaged or foreign block",
                 ptr, index);
    pthread_mutex_lock(&G.lock);
    if (b->pending) td_drain_for_free(index, b); /* as cudaFree waits for the device */
    uint64_t canary;
    memcpy(&canary, host + b->nbytes, sizeof canary);
    if (canary != TD_CANARY) td_fatal("write past the end of a block", ptr, index);
    if (b->prev) b->prev->next = b->next;
    else G.live[index] = b->next;
    if (b->next) b->next->prev = b->prev;
    G.used[index] -= b->nbytes;
    pthread_mutex_unlock(&G.lock);
    b->magic = TD_DEAD;
    free(b);
}

/* The live allocation of testdev:index that holds [host, host + n), or NULL. */
static td_block *td_block_of(int index, const char *host, size_t n) {
    td_block *found = NULL;
    pthread_mutex_lock(&G.lock);
    for (td_block *b = G.live[index]; b && !found; b = b->next) {
        const char *lo = (const char *)b + TD_HDR;
        if (host >= lo && n <= b->nbytes && host - lo <= (ptrdiff_t)(b->nbytes - n)) found = b;
    }
    pthread_mutex_unlock(&G.lock);
    return found;
}

/* Host address of n device bytes at dev_ptr on testdev:index, checked, and the allocation
 * that holds them (NULL when n is 0). */
static em_status td_resolve(const char *who, int index, const void *dev_ptr, size_t n,
                            char **out, td_block **block) {
    char *host = td_index_ok(index) ? td_untag(dev_ptr, index) : NULL;
    if (!host)
        return em_set_error(EM_ERR_DEVICE, "testdev: %s: %p is not testdev:%d memory", who,
                            dev_ptr, index);
    td_block *b = n ? td_block_of(index, host, n) : NULL;
    if (n && !b)
        return em_set_error(EM_ERR_DEVICE, "testdev: %s: %zu bytes at %p are not inside a "
                            "live testdev:%d allocation", who, n, dev_ptr, index);
    *out = host;
    if (block) *block = b;
    return EM_OK;
}

/* ---- streams, events and the lazy workers ---------------------------------------------- */

/* An item waits, before it runs, until queue q has completed n items. */
typedef struct td_dep {
    td_queue *q;
    uint64_t n;
} td_dep;

typedef enum { TD_NOP, TD_MEMCPY, TD_KCOPY, TD_KFILL, TD_KBINARY, TD_KSUM, TD_STAMP,
               TD_KHOST } td_kind;

/* TD_HOST builds: an op of the list in td_host_ops run by the CPU backend on the host memory
 * behind the device addresses, on the stream's worker (so it is queued, ordered and recorded
 * in graphs like any testdev kernel). Shared, reference-counted, between a graph's recorded
 * item and the copies its replays queue. */
#define TD_HOST_MAX 128 /* operands (of a list op: every tensor of every list: a small
                         * Transformer's 16 parameters in fused_adam_capturable take 96) */
typedef struct td_host {
    int refs; /* atomic */
    const em_op *op;
    int n_in, n_out, n_attrs;
    int count;                  /* a list op's tensors per list; 0: not a list op */
    em_ktensor kt[TD_HOST_MAX]; /* inputs, then outputs; host addresses */
    bool absent[TD_HOST_MAX];   /* a NULL input (or a list's NULL entry) */
    em_attr *attrs;             /* copies, strings and lists owned */
    /* A drawing op recorded in a graph capture (its seed attribute absent, its offset given):
     * the capture's generator state (2) uint64 {seed, base}, read when the item runs, as a GPU
     * kernel reads it; seed_attr: the seed attribute's index (-1: none such call). */
    em_ktensor rng;
    int seed_attr;
} td_host;

/* What a timed event reads: the device clock when its record item ran (under the lock). */
typedef struct td_stamp {
    int refs;  /* the event + record items not yet run */
    bool set;
    uint64_t ns;
} td_stamp;

/* One queued piece of work. Kernel operands are copied in at issue time, their data pointers
 * already turned into host addresses (the dispatcher's em_ktensor array lives on its stack). */
typedef struct td_item {
    struct td_item *next;
    td_kind kind;
    int ndeps;
    td_dep *deps;
    int nblocks;
    td_block *blocks[TD_HOST_MAX]; /* the allocations it touches: freeing one waits for it */
    union {
        struct { char *dst; const char *src; size_t n; } mc;
        struct { em_ktensor x, y; } copy;
        struct { em_ktensor y; double v; } fill;
        struct { em_ktensor a, b, y; char op; } bin; /* op: '+' or '*' */
        struct { em_ktensor x, y; } sum;
        td_host *host;
        td_stamp *stamp;
    } u;
} td_item;

struct td_queue {
    int index;
    bool is_default;
    uint64_t enqueued, done; /* items queued so far; items run so far */
    uint64_t demand;         /* items some waiter needs run: the worker runs up to here */
    td_item *head, *tail;
    pthread_t thread;
    bool stop;
    int refs;                /* its stream (or the device) + events and items that name it */
    td_queue *next;          /* G.queues[index] */
};

/* A recorded graph: the items a capture recorded, in order; broken: the capture's first error
 * (the capture is then invalid, as CUDA's). */
typedef struct td_graph {
    int index;
    td_item *head, *tail;
    size_t n;
    bool broken;
    char why[320];
} td_graph;

struct em_stream {
    uint64_t magic;
    int index;
    td_queue *q;
    td_graph *cap; /* recording into this graph; NULL: not capturing */
};

/* The capture of testdev:index in progress breaks with error `why` (CUDA invalidates it too):
 * its end fails with the first such message. Returns the error for the call that broke it. */
static em_status td_capture_break(int index, const char *why) {
    td_graph *g = G.cap[index];
    if (g && !g->broken) {
        g->broken = true;
        snprintf(g->why, sizeof g->why, "%s", why);
    }
    return em_set_error(EM_ERR_DEVICE, "testdev: %s", why);
}

struct em_event {
    uint64_t magic;
    int index;
    td_queue *q;    /* NULL until recorded */
    uint64_t value; /* done once q has run this many items */
    td_stamp *stamp; /* a timed event's clock reading; NULL: not timed */
};

static void td_run(const td_item *it);

static void td_host_unref(td_host *h) {
    if (!h || __atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    for (int i = 0; i < h->n_attrs; i++) {
        if (h->attrs[i].type == EM_ATTR_STRING) free((char *)h->attrs[i].v.s);
        if (h->attrs[i].type == EM_ATTR_INT_LIST) free((int64_t *)h->attrs[i].v.list);
    }
    free(h->attrs);
    free(h);
}

/* Free an item that will not run (or has run) with what it owns. */
static void td_item_free(td_item *it) {
    if (it->kind == TD_KHOST) td_host_unref(it->u.host);
    free(it->deps);
    free(it);
}

/* ---- queue primitives: all with G.lock held ---- */

static void q_unref(td_queue *q) {
    if (--q->refs == 0) free(q);
}

static void stamp_unref(td_stamp *t) {
    if (t && --t->refs == 0) free(t);
}

/* Ask q's worker to run its first n items and wait until it has. */
static void q_wait(td_queue *q, uint64_t n) {
    if (q->demand < n) {
        q->demand = n;
        pthread_cond_broadcast(&G.cv);
    }
    while (q->done < n) pthread_cond_wait(&G.cv, &G.lock);
}

static void *td_worker(void *arg) {
    td_queue *q = arg;
    pthread_mutex_lock(&G.lock);
    for (;;) {
        while (!q->stop && !(q->head && q->demand > q->done))
            pthread_cond_wait(&G.cv, &G.lock);
        td_item *it = q->head;
        if (!it) break; /* stopping, and drained */
        for (int i = 0; i < it->ndeps; i++) q_wait(it->deps[i].q, it->deps[i].n);
        pthread_mutex_unlock(&G.lock);
        td_run(it);
        pthread_mutex_lock(&G.lock);
        if (it->kind == TD_KCOPY || it->kind == TD_KFILL || it->kind == TD_KBINARY ||
            it->kind == TD_KSUM || it->kind == TD_KHOST)
            G.clock[q->index] += TD_KERNEL_NS;
        if (it->kind == TD_STAMP) {
            it->u.stamp->ns = G.clock[q->index];
            it->u.stamp->set = true;
            stamp_unref(it->u.stamp);
        }
        q->head = it->next;
        if (!q->head) q->tail = NULL;
        q->done++;
        for (int i = 0; i < it->nblocks; i++) it->blocks[i]->pending--;
        for (int i = 0; i < it->ndeps; i++) q_unref(it->deps[i].q);
        pthread_cond_broadcast(&G.cv);
        td_item_free(it);
    }
    pthread_mutex_unlock(&G.lock);
    return NULL;
}

/* A new queue with its worker running, holding one reference (its owner's). */
static em_status q_new(int index, bool is_default, td_queue **out) {
    td_queue *q = calloc(1, sizeof *q);
    if (!q) return em_set_error(EM_ERR_NOMEM, "testdev: out of memory creating a stream");
    *q = (td_queue){.index = index, .is_default = is_default, .refs = 1};
    if (pthread_create(&q->thread, NULL, td_worker, q) != 0) {
        free(q);
        return em_set_error(EM_ERR_NOMEM, "testdev: cannot start a stream's worker thread");
    }
    *out = q;
    return EM_OK;
}

/* Run everything on q, stop its worker and drop the owner's reference. Called WITHOUT the
 * lock. */
static void q_close(td_queue *q) {
    pthread_mutex_lock(&G.lock);
    q_wait(q, q->enqueued);
    q->stop = true;
    pthread_cond_broadcast(&G.cv);
    pthread_mutex_unlock(&G.lock);
    pthread_join(q->thread, NULL);
    pthread_mutex_lock(&G.lock);
    q_unref(q);
    pthread_mutex_unlock(&G.lock);
}

/* The default stream of testdev:index, made on first use. Called with the lock held. */
static em_status q_default(int index, td_queue **out) {
    if (!G.def[index]) {
        em_status st = q_new(index, true, &G.def[index]);
        if (st != EM_OK) return st;
    }
    *out = G.def[index];
    return EM_OK;
}

/* Run everything queued on testdev:index so far. Called with the lock held. */
static void td_drain_device(int index) {
    if (G.def[index]) q_wait(G.def[index], G.def[index]->enqueued);
    for (td_queue *q = G.queues[index]; q; q = q->next) q_wait(q, q->enqueued);
}

/* Before freeing block b: the items that touch it must have run. Called with the lock held. */
static void td_drain_for_free(int index, td_block *b) {
    while (b->pending) {
        td_drain_device(index);
        if (b->pending) pthread_cond_wait(&G.cv, &G.lock);
    }
}

static bool dep_add(td_dep *deps, int *n, td_queue *q, uint64_t upto) {
    if (q->done >= upto) return false;
    deps[(*n)++] = (td_dep){q, upto};
    q->refs++;
    return true;
}

/* Queue `it` (malloc'ed; owned by the queue from here, freed on failure) on stream s of
 * testdev:index (NULL: the default stream), after `extra` when given. *seq: its position. */
static em_status td_enqueue(int index, em_stream *s, td_item *it, const td_dep *extra,
                            uint64_t *seq) {
    pthread_mutex_lock(&G.lock);
    if (s && s->cap) { /* recorded, not run: a replay queues a copy */
        it->next = NULL;
        if (s->cap->tail) s->cap->tail->next = it;
        else s->cap->head = it;
        s->cap->tail = it;
        s->cap->n++;
        if (seq) *seq = 0;
        pthread_mutex_unlock(&G.lock);
        return EM_OK;
    }
    if (!s && G.cap[index]) {
        em_status e = td_capture_break(index, "work queued on the default stream while a "
                                       "stream records a graph (CUDA's legacy default stream "
                                       "rule)");
        pthread_mutex_unlock(&G.lock);
        td_item_free(it);
        return e;
    }
    td_queue *q = s ? s->q : NULL;
    em_status st = q ? EM_OK : q_default(index, &q);
    int cap = 2;
    if (st == EM_OK && q->is_default)
        for (td_queue *o = G.queues[index]; o; o = o->next) cap++;
    it->deps = st == EM_OK ? calloc((size_t)cap, sizeof *it->deps) : NULL;
    if (st == EM_OK && !it->deps)
        st = em_set_error(EM_ERR_NOMEM, "testdev: out of memory queueing work");
    if (st != EM_OK) {
        pthread_mutex_unlock(&G.lock);
        td_item_free(it);
        return st;
    }
    /* CUDA's legacy default stream: it waits for every other stream, and they wait for it. */
    if (q->is_default) {
        for (td_queue *o = G.queues[index]; o; o = o->next)
            dep_add(it->deps, &it->ndeps, o, o->enqueued);
    } else if (G.def[index]) {
        dep_add(it->deps, &it->ndeps, G.def[index], G.def[index]->enqueued);
    }
    if (extra && extra->q != q) dep_add(it->deps, &it->ndeps, extra->q, extra->n);
    for (int i = 0; i < it->nblocks; i++) it->blocks[i]->pending++;
    it->next = NULL;
    if (q->tail) q->tail->next = it;
    else q->head = it;
    q->tail = it;
    if (seq) *seq = q->enqueued + 1;
    q->enqueued++;
    pthread_mutex_unlock(&G.lock);
    return EM_OK;
}

static td_item *td_item_new(td_kind kind) {
    td_item *it = calloc(1, sizeof *it);
    if (!it) em_set_error(EM_ERR_NOMEM, "testdev: out of memory queueing work");
    else it->kind = kind;
    return it;
}

/* Wait until the item at position seq of s's queue (NULL: default) has run. */
static void td_wait_item(int index, em_stream *s, uint64_t seq) {
    pthread_mutex_lock(&G.lock);
    q_wait(s ? s->q : G.def[index], seq);
    pthread_mutex_unlock(&G.lock);
}

static em_status td_check_stream(const char *who, int index, const em_stream *s) {
    if (!s) return EM_OK; /* the default stream */
    if (s->magic != TD_STREAM_MAGIC)
        return em_set_error(EM_ERR_DEVICE, "testdev: %s: %p is not a testdev stream", who,
                            (const void *)s);
    if (s->index != index)
        return em_set_error(EM_ERR_DEVICE, "testdev: %s: the stream belongs to testdev:%d, "
                            "not testdev:%d", who, s->index, index);
    return EM_OK;
}

static em_status td_check_event(const char *who, int index, const em_event *e) {
    if (!e || e->magic != TD_EVENT_MAGIC)
        return em_set_error(EM_ERR_DEVICE, "testdev: %s: %p is not a testdev event", who,
                            (const void *)e);
    if (e->index != index)
        return em_set_error(EM_ERR_DEVICE, "testdev: %s: the event belongs to testdev:%d, "
                            "not testdev:%d", who, e->index, index);
    return EM_OK;
}

static em_status td_stream_create(int index, em_stream **out) {
    *out = NULL;
    if (!td_index_ok(index))
        return em_set_error(EM_ERR_DEVICE, "testdev: stream_create on testdev:%d", index);
    em_stream *s = calloc(1, sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "testdev: stream_create: out of memory");
    td_queue *q;
    em_status st = q_new(index, false, &q);
    if (st != EM_OK) {
        free(s);
        return st;
    }
    *s = (em_stream){.magic = TD_STREAM_MAGIC, .index = index, .q = q};
    pthread_mutex_lock(&G.lock);
    q->next = G.queues[index];
    G.queues[index] = q;
    pthread_mutex_unlock(&G.lock);
    *out = s;
    return EM_OK;
}

/* Runs what is queued first (the work of a destroyed stream still happens, as on CUDA). */
static void td_stream_destroy(int index, em_stream *s) {
    if (td_check_stream("stream_destroy", index, s) != EM_OK)
        td_fatal("stream_destroy of a foreign stream", s, index);
    if (!s) return;
    pthread_mutex_lock(&G.lock);
    for (td_queue **l = &G.queues[index]; *l; l = &(*l)->next)
        if (*l == s->q) {
            *l = s->q->next;
            break;
        }
    pthread_mutex_unlock(&G.lock);
    q_close(s->q);
    s->magic = TD_DEAD;
    free(s);
}

static em_status td_synchronize(int index) {
    if (!td_index_ok(index))
        return em_set_error(EM_ERR_DEVICE, "testdev: synchronize on testdev:%d", index);
    pthread_mutex_lock(&G.lock);
    if (G.cap[index]) {
        em_status st = td_capture_break(index, "device synchronize while a stream records a "
                                        "graph");
        pthread_mutex_unlock(&G.lock);
        return st;
    }
    td_drain_device(index);
    pthread_mutex_unlock(&G.lock);
    return EM_OK;
}

/* The default stream's synchronize waits for the whole device (legacy rules). */
static em_status td_stream_synchronize(int index, em_stream *s) {
    em_status st = td_check_stream("stream_synchronize", index, s);
    if (st != EM_OK || !s) return st != EM_OK ? st : td_synchronize(index);
    pthread_mutex_lock(&G.lock);
    if (s->cap) {
        st = td_capture_break(index, "stream synchronize of a stream that records a graph");
        pthread_mutex_unlock(&G.lock);
        return st;
    }
    q_wait(s->q, s->q->enqueued);
    pthread_mutex_unlock(&G.lock);
    return EM_OK;
}

static em_status td_event_create(int index, em_event **out) {
    *out = NULL;
    if (!td_index_ok(index))
        return em_set_error(EM_ERR_DEVICE, "testdev: event_create on testdev:%d", index);
    em_event *e = calloc(1, sizeof *e);
    if (!e) return em_set_error(EM_ERR_NOMEM, "testdev: event_create: out of memory");
    *e = (em_event){.magic = TD_EVENT_MAGIC, .index = index};
    *out = e;
    return EM_OK;
}

static void td_event_destroy(int index, em_event *e) {
    if (td_check_event("event_destroy", index, e) != EM_OK)
        td_fatal("event_destroy of a foreign event", e, index);
    pthread_mutex_lock(&G.lock);
    if (e->q) q_unref(e->q);
    stamp_unref(e->stamp);
    pthread_mutex_unlock(&G.lock);
    e->magic = TD_DEAD;
    free(e);
}

/* Marks the work queued on s so far. On the default stream the mark is itself an item, so
 * that it covers what the other streams queued before (legacy rules). */
static em_status td_event_record(int index, em_event *e, em_stream *s) {
    em_status st = td_check_event("event_record", index, e);
    if (st == EM_OK) st = td_check_stream("event_record", index, s);
    if (st != EM_OK) return st;
    if (s && s->cap) {
        pthread_mutex_lock(&G.lock);
        st = td_capture_break(index, "event_record on a stream that records a graph (testdev "
                              "records kernels and device copies only)");
        pthread_mutex_unlock(&G.lock);
        return st;
    }
    uint64_t value = 0;
    if (!s || e->stamp) { /* a timed event's mark is an item on any stream: it reads the clock */
        td_item *it = td_item_new(e->stamp ? TD_STAMP : TD_NOP);
        if (!it) return EM_ERR_NOMEM;
        if (e->stamp) {
            pthread_mutex_lock(&G.lock);
            it->u.stamp = e->stamp;
            e->stamp->refs++;
            e->stamp->set = false;
            pthread_mutex_unlock(&G.lock);
        }
        td_stamp *held = e->stamp;
        st = td_enqueue(index, s, it, NULL, &value);
        if (st != EM_OK) {
            pthread_mutex_lock(&G.lock);
            stamp_unref(held);
            pthread_mutex_unlock(&G.lock);
            return st;
        }
    }
    pthread_mutex_lock(&G.lock);
    td_queue *q = s ? s->q : G.def[index];
    if (s && !e->stamp) value = q->enqueued;
    q->refs++;
    if (e->q) q_unref(e->q);
    e->q = q;
    e->value = value;
    pthread_mutex_unlock(&G.lock);
    return EM_OK;
}

static em_status td_event_wait(int index, em_stream *s, em_event *e) {
    em_status st = td_check_event("event_wait", index, e);
    if (st == EM_OK) st = td_check_stream("event_wait", index, s);
    if (st != EM_OK) return st;
    pthread_mutex_lock(&G.lock);
    if (s && s->cap) {
        st = td_capture_break(index, "event_wait on a stream that records a graph (testdev "
                              "records kernels and device copies only)");
        pthread_mutex_unlock(&G.lock);
        return st;
    }
    td_dep dep = {e->q, e->value};
    pthread_mutex_unlock(&G.lock);
    if (!dep.q)
        return em_set_error(EM_ERR_STATE, "testdev: event_wait: the event was never recorded "
                            "(record it on a stream of testdev:%d first)", index);
    /* The wait is itself an item on s: what s queues later runs after the event's work. */
    td_item *it = td_item_new(TD_NOP);
    return it ? td_enqueue(index, s, it, &dep, NULL) : EM_ERR_NOMEM;
}

static em_status td_event_synchronize(int index, em_event *e) {
    em_status st = td_check_event("event_synchronize", index, e);
    if (st != EM_OK) return st;
    pthread_mutex_lock(&G.lock);
    if (e->q) q_wait(e->q, e->value);
    bool recorded = e->q != NULL;
    pthread_mutex_unlock(&G.lock);
    if (!recorded)
        return em_set_error(EM_ERR_STATE, "testdev: event_synchronize: the event was never "
                            "recorded on testdev:%d", index);
    return EM_OK;
}

static em_status td_event_create_timed(int index, em_event **out) {
    em_status st = td_event_create(index, out);
    if (st != EM_OK) return st;
    td_stamp *t = calloc(1, sizeof *t);
    if (!t) {
        td_event_destroy(index, *out);
        *out = NULL;
        return em_set_error(EM_ERR_NOMEM, "testdev: event_create_timed: out of memory");
    }
    t->refs = 1;
    (*out)->stamp = t;
    return EM_OK;
}

/* The device clock between two timed events' marks, once both have run. */
static em_status td_event_elapsed_ns(int index, em_event *a, em_event *b, uint64_t *ns) {
    em_status st = td_check_event("event_elapsed_ns", index, a);
    if (st == EM_OK) st = td_check_event("event_elapsed_ns", index, b);
    if (st != EM_OK) return st;
    if (!a->stamp || !b->stamp)
        return em_set_error(EM_ERR_INVALID, "testdev: event_elapsed_ns: an event made by "
                            "event_create, not event_create_timed");
    pthread_mutex_lock(&G.lock);
    bool recorded = a->q && b->q;
    if (recorded) q_wait(a->q, a->value), q_wait(b->q, b->value);
    bool set = recorded && a->stamp->set && b->stamp->set;
    uint64_t t0 = a->stamp->ns, t1 = b->stamp->ns;
    pthread_mutex_unlock(&G.lock);
    if (!set)
        return em_set_error(EM_ERR_STATE, "testdev: event_elapsed_ns: an event was never "
                            "recorded on testdev:%d", index);
    *ns = t1 >= t0 ? t1 - t0 : 0;
    return EM_OK;
}

/* Polls: never makes the work run (a lazy worker may keep it pending until someone waits). */
static em_status td_event_query(int index, em_event *e, bool *done) {
    em_status st = td_check_event("event_query", index, e);
    if (st != EM_OK) return st;
    pthread_mutex_lock(&G.lock);
    bool recorded = e->q != NULL;
    *done = recorded && e->q->done >= e->value;
    pthread_mutex_unlock(&G.lock);
    if (!recorded)
        return em_set_error(EM_ERR_STATE, "testdev: event_query: the event was never recorded "
                            "on testdev:%d", index);
    return EM_OK;
}

/* For tests (dlsym): the items queued on stream s of testdev:index (NULL: its default
 * stream) that have not run yet. */
EM_PLUGIN_EXPORT size_t ember_testdev_pending(int index, const em_stream *s);
EM_PLUGIN_EXPORT size_t ember_testdev_pending(int index, const em_stream *s) {
    if (!td_index_ok(index) || td_check_stream("pending", index, s) != EM_OK) return 0;
    pthread_mutex_lock(&G.lock);
    const td_queue *q = s ? s->q : G.def[index];
    size_t n = q ? (size_t)(q->enqueued - q->done) : 0;
    pthread_mutex_unlock(&G.lock);
    return n;
}

/* Copies from testdev:index to host memory so far (each a host read of device data, a sync
 * point on a real device): tests find it with dlsym. */
EM_PLUGIN_EXPORT uint64_t ember_testdev_host_reads(int index);
EM_PLUGIN_EXPORT uint64_t ember_testdev_host_reads(int index) {
    return td_index_ok(index) ? __atomic_load_n(&G.host_reads[index], __ATOMIC_RELAXED) : 0;
}

/* ---- page-locked host memory ------------------------------------------------------------ */

#define TD_PINNED_MAGIC 0x70696e6e65643031ull /* "pinned01" */

static em_status td_host_alloc(size_t nbytes, void **out) {
    *out = NULL;
    void *base = NULL;
    if (posix_memalign(&base, 64, TD_HDR + nbytes) != 0)
        return em_set_error(EM_ERR_NOMEM, "testdev: host_alloc of %zu bytes failed", nbytes);
    uint64_t hdr[2] = {TD_PINNED_MAGIC, nbytes};
    memcpy(base, hdr, sizeof hdr);
    pthread_mutex_lock(&G.lock);
    G.pinned_blocks++;
    G.pinned_bytes += nbytes;
    pthread_mutex_unlock(&G.lock);
    *out = (char *)base + TD_HDR;
    return EM_OK;
}

static void td_host_free(void *ptr) {
    if (!ptr) return;
    char *base = (char *)ptr - TD_HDR;
    uint64_t hdr[2];
    memcpy(hdr, base, sizeof hdr);
    if (hdr[0] != TD_PINNED_MAGIC) td_fatal("host_free of memory host_alloc did not make", ptr, -1);
    hdr[0] = TD_DEAD;
    memcpy(base, hdr, sizeof hdr[0]);
    pthread_mutex_lock(&G.lock);
    G.pinned_blocks--;
    G.pinned_bytes -= hdr[1];
    pthread_mutex_unlock(&G.lock);
    free(base);
}

/* For tests (dlsym): the live page-locked blocks and their bytes. */
EM_PLUGIN_EXPORT void ember_testdev_pinned(size_t *blocks, size_t *bytes);
EM_PLUGIN_EXPORT void ember_testdev_pinned(size_t *blocks, size_t *bytes) {
    pthread_mutex_lock(&G.lock);
    *blocks = G.pinned_blocks;
    *bytes = G.pinned_bytes;
    pthread_mutex_unlock(&G.lock);
}

/* ---- copies ------------------------------------------------------------------------------- */

static bool td_is_ours(em_device d) { return d.type == G.type; }
static bool td_is_cpu(em_device d) { return d.type == EM_DEVICE_CPU_TYPE; }

/* Queued on s; on the default stream (NULL) it is complete when this returns. */
static em_status td_copy(em_device dd, void *dst, em_device sd, const void *src, size_t n,
                         em_stream *s) {
    char a[48], b[48];
    if (!(td_is_ours(dd) || td_is_cpu(dd)) || !(td_is_ours(sd) || td_is_cpu(sd)) ||
        (td_is_ours(dd) && td_is_ours(sd) && dd.index != sd.index) ||
        (td_is_cpu(dd) && td_is_cpu(sd)))
        return em_set_error(EM_ERR_DEVICE, "testdev: copy from %s to %s: the backend copies "
                            "between host and one testdev or within one testdev",
                            em_device_str(sd, a, sizeof a), em_device_str(dd, b, sizeof b));
    int index = td_is_ours(dd) ? dd.index : sd.index;
    em_status st = td_check_stream("copy", index, s);
    if (st == EM_OK && s && s->cap && (td_is_cpu(dd) || td_is_cpu(sd))) {
        pthread_mutex_lock(&G.lock);
        st = td_capture_break(index, "a copy to or from host memory on a stream that records "
                              "a graph (nothing runs during a capture)");
        pthread_mutex_unlock(&G.lock);
        return st;
    }
    char *hd = dst, *hs = (char *)src;
    td_block *bd = NULL, *bs = NULL;
    if (st == EM_OK && td_is_ours(dd))
        st = td_resolve("copy destination", dd.index, dst, n, &hd, &bd);
    if (st == EM_OK && td_is_ours(sd))
        st = td_resolve("copy source", sd.index, src, n, &hs, &bs);
    if (st != EM_OK) return st;
    td_item *it = td_item_new(TD_MEMCPY);
    if (!it) return EM_ERR_NOMEM;
    if (td_is_cpu(dd)) __atomic_add_fetch(&G.host_reads[index], 1, __ATOMIC_RELAXED);
    it->u.mc.dst = hd;
    it->u.mc.src = hs;
    it->u.mc.n = n;
    if (bd) it->blocks[it->nblocks++] = bd;
    if (bs && bs != bd) it->blocks[it->nblocks++] = bs;
    uint64_t seq;
    st = td_enqueue(index, s, it, NULL, &seq);
    if (st == EM_OK && !s) td_wait_item(index, NULL, seq);
    return st;
}

/* ---- graph capture ------------------------------------------------------------------------ */

static void td_graph_items_free(td_graph *g) {
    for (td_item *it = g->head, *next; it; it = next) {
        next = it->next;
        td_item_free(it);
    }
    g->head = g->tail = NULL;
    g->n = 0;
}

static em_status td_graph_begin(int index, em_stream *s) {
    em_status st = td_check_stream("graph_begin", index, s);
    if (st != EM_OK) return st;
    if (!s) return em_set_error(EM_ERR_INVALID, "testdev: graph_begin on the default stream");
    td_graph *g = calloc(1, sizeof *g);
    if (!g) return em_set_error(EM_ERR_NOMEM, "testdev: graph_begin: out of memory");
    g->index = index;
    pthread_mutex_lock(&G.lock);
    if (G.cap[index]) {
        pthread_mutex_unlock(&G.lock);
        free(g);
        return em_set_error(EM_ERR_STATE, "testdev: testdev:%d already records a graph on "
                            "another stream (testdev captures one stream at a time)", index);
    }
    G.cap[index] = g;
    s->cap = g;
    pthread_mutex_unlock(&G.lock);
    return EM_OK;
}

static em_status td_graph_end(int index, em_stream *s, void **out) {
    *out = NULL;
    em_status st = td_check_stream("graph_end", index, s);
    if (st != EM_OK) return st;
    pthread_mutex_lock(&G.lock);
    td_graph *g = s ? s->cap : NULL;
    if (!g) {
        pthread_mutex_unlock(&G.lock);
        return em_set_error(EM_ERR_STATE, "testdev: graph_end: the stream is not recording");
    }
    s->cap = NULL;
    G.cap[index] = NULL;
    pthread_mutex_unlock(&G.lock);
    if (g->broken) {
        st = em_set_error(EM_ERR_DEVICE, "testdev: graph_end: the capture was broken by %s",
                          g->why);
        td_graph_items_free(g);
        free(g);
        return st;
    }
    *out = g;
    return EM_OK;
}

/* Queue a copy of every recorded item on s, in order. */
static em_status td_graph_replay(int index, void *graph, em_stream *s) {
    td_graph *g = graph;
    em_status st = td_check_stream("graph_replay", index, s);
    if (st != EM_OK) return st;
    if (!g || g->index != index)
        return em_set_error(EM_ERR_DEVICE, "testdev: graph_replay: not a graph of testdev:%d",
                            index);
    for (const td_item *r = g->head; r && st == EM_OK; r = r->next) {
        td_item *it = td_item_new(r->kind);
        if (!it) return EM_ERR_NOMEM;
        *it = *r;
        if (it->kind == TD_KHOST) __atomic_add_fetch(&it->u.host->refs, 1, __ATOMIC_RELAXED);
        it->next = NULL;
        it->deps = NULL;
        it->ndeps = 0;
        st = td_enqueue(index, s, it, NULL, NULL);
    }
    return st;
}

static void td_graph_destroy(int index, void *graph) {
    td_graph *g = graph;
    if (!g) return;
    if (g->index != index) td_fatal("graph_destroy of a foreign graph", g, index);
    td_graph_items_free(g);
    free(g);
}

static const em_device_ops td_device = {
    .struct_size = sizeof(em_device_ops),
    .name = "testdev",
    .count = td_count,
    .properties = td_properties,
    .alloc = td_alloc,
    .free = td_free,
    .host_alloc = td_host_alloc,
    .host_free = td_host_free,
    .copy = td_copy,
    .synchronize = td_synchronize,
    .stream_create = td_stream_create,
    .stream_destroy = td_stream_destroy,
    .stream_synchronize = td_stream_synchronize,
    .event_create = td_event_create,
    .event_destroy = td_event_destroy,
    .event_record = td_event_record,
    .event_wait = td_event_wait,
    .event_synchronize = td_event_synchronize,
    .event_query = td_event_query,
    .event_create_timed = td_event_create_timed,
    .event_elapsed_ns = td_event_elapsed_ns,
    .graph_begin = td_graph_begin,
    .graph_end = td_graph_end,
    .graph_replay = td_graph_replay,
    .graph_destroy = td_graph_destroy,
};

/* ---- kernels ------------------------------------------------------------------------------ */

/* t with its data pointer turned into the host address of its first element, after checking
 * that every element t can reach (from its shape and strides) lies inside one live
 * allocation of the kernel's device; *block: that allocation (NULL for an empty t). */
static em_status td_kernel_tensor(const em_kernel_ctx *ctx, const em_ktensor *t,
                                  em_ktensor *out, td_block **block) {
    *out = *t;
    *block = NULL;
    if (t->numel == 0) {
        out->data = NULL;
        return EM_OK;
    }
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < t->ndim; d++) {
        int64_t span = (t->shape[d] - 1) * t->strides[d];
        if (span < 0) lo += span;
        else hi += span;
    }
    int64_t es = (int64_t)em_dtype_size(t->dtype);
    char *first;
    em_status st = td_resolve(em_op_name(ctx->op), ctx->device.index,
                              (const char *)t->data + lo * es, (size_t)((hi - lo + 1) * es),
                              &first, block);
    if (st == EM_OK) out->data = first - lo * es;
    return st;
}

/* The stream a kernel runs on: the dispatcher's, else the calling thread's current stream on
 * the device (what the dispatcher passes once it sets ctx->stream; the same stream). */
static em_stream *td_kernel_stream(const em_kernel_ctx *ctx) {
    return ctx->stream ? ctx->stream : em_stream_current(ctx->device);
}

/* Check the kernel's n operands (inputs then outputs), store them in ops[] and queue `it`
 * (freed on failure). */
static em_status td_kernel_queue(const em_kernel_ctx *ctx, td_item *it, em_ktensor *const *ops,
                                 const em_ktensor *const *src, int n) {
    em_stream *s = td_kernel_stream(ctx);
    em_status st = td_check_stream(em_op_name(ctx->op), ctx->device.index, s);
    for (int i = 0; i < n && st == EM_OK; i++) {
        td_block *b;
        st = td_kernel_tensor(ctx, src[i], ops[i], &b);
        bool seen = !b;
        for (int k = 0; k < it->nblocks && !seen; k++) seen = it->blocks[k] == b;
        if (st == EM_OK && !seen) it->blocks[it->nblocks++] = b;
    }
    if (st != EM_OK) {
        td_item_free(it);
        return st;
    }
    return td_enqueue(ctx->device.index, s, it, NULL, NULL);
}

/* Element offset of linear index lin (C order over shape) with the given strides. */
static int64_t td_offset(const em_ktensor *shape_of, const em_ktensor *t, int64_t lin) {
    int64_t off = 0;
    for (int d = shape_of->ndim - 1; d >= 0; d--) {
        off += (lin % shape_of->shape[d]) * t->strides[d];
        lin /= shape_of->shape[d];
    }
    return off;
}

/* copy(x) -> y: any strides, converting x's dtype to y's. Same dtypes move bytes exactly. */
static void td_run_copy(const em_ktensor *x, const em_ktensor *y) {
    char *hx = x->data, *hy = y->data;
    size_t xs = em_dtype_size(x->dtype), ys = em_dtype_size(y->dtype);
    for (int64_t i = 0; i < y->numel; i++) {
        int64_t ox = td_offset(y, x, i), oy = td_offset(y, y, i);
        if (x->dtype == y->dtype)
            memcpy(hy + oy * (int64_t)ys, hx + ox * (int64_t)xs, ys);
        else
            em_dtype_store(y->dtype, hy, oy, em_dtype_load(x->dtype, hx, ox));
    }
}

static void td_run_fill(const em_ktensor *y, double v) {
    for (int64_t i = 0; i < y->numel; i++) em_dtype_store(y->dtype, y->data, td_offset(y, y, i), v);
}

/* a + b or a * b -> y, float32 or float64 (all three one dtype): inputs broadcast to y's
 * shape (stride 0 on broadcast dims); y may alias an input. */
static void td_run_binary(const em_ktensor *a, const em_ktensor *b, const em_ktensor *y,
                          char op) {
    for (int64_t i = 0; i < y->numel; i++) {
        double u = em_dtype_load(a->dtype, a->data, td_offset(y, a, i)),
               v = em_dtype_load(b->dtype, b->data, td_offset(y, b, i));
        if (y->dtype == EM_F32) /* rounded as a float32 kernel rounds */
            ((float *)y->data)[td_offset(y, y, i)] = op == '+' ? (float)u + (float)v
                                                               : (float)u * (float)v;
        else
            em_dtype_store(y->dtype, y->data, td_offset(y, y, i), op == '+' ? u + v : u * v);
    }
}

/* sum over the kernel's dims: y has x's ndim with 1 on each reduced dim (the kernel contract of
 * "sum"), so x's element i adds into y's element at i's index with those dims at 0. */
static void td_run_sum(const em_ktensor *x, const em_ktensor *y) {
    double *acc = calloc((size_t)(y->numel ? y->numel : 1), sizeof(double));
    if (!acc) abort(); /* a test device: a worker has no way to report it */
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t idx[EM_MAX_DIMS], lin = i, j = 0;
        for (int d = x->ndim - 1; d >= 0; d--) idx[d] = lin % x->shape[d], lin /= x->shape[d];
        for (int d = 0; d < x->ndim; d++) j = j * y->shape[d] + (y->shape[d] == 1 ? 0 : idx[d]);
        acc[j] += em_dtype_load(x->dtype, x->data, td_offset(x, x, i));
    }
    for (int64_t j = 0; j < y->numel; j++)
        em_dtype_store(y->dtype, y->data, td_offset(y, y, j), acc[j]);
    free(acc);
}

/* TD_KHOST: the op on the CPU over the host memory, on the worker thread (which has no
 * autograd to record into). A failure cannot be reported from here: a test device stops. */
static void td_run_host(const td_host *h) {
    em_tensor *t[TD_HOST_MAX] = {0};
    em_status st = EM_OK;
    int n = h->n_in + h->n_out;
    em_attr ga[EM_CASE_MAX_ATTRS * 2];
    const em_attr *attrs = h->attrs;
    if (h->seed_attr >= 0) { /* the state now (a replay's), as absolute attributes */
        const uint64_t *rs = h->rng.data;
        memcpy(ga, h->attrs, (size_t)h->n_attrs * sizeof *ga);
        ga[h->seed_attr] = (em_attr){.type = EM_ATTR_INT, .v.i = (int64_t)rs[0]};
        ga[h->seed_attr + 1].v.i = (int64_t)((uint64_t)ga[h->seed_attr + 1].v.i + rs[1]);
        attrs = ga;
    }
    em_grad_mode_push(EM_GRAD_DISABLED);
    for (int i = 0; i < n && st == EM_OK; i++) {
        const em_ktensor *k = &h->kt[i];
        if (h->absent[i]) continue;
        t[i] = k->numel ? em_tensor_wrap(k->data, k->ndim, k->shape, k->strides, k->dtype,
                                         em_cpu(), NULL, NULL)
                        : em_empty(k->ndim, k->shape, k->dtype, em_cpu());
        if (!t[i]) st = em_last_status();
    }
    if (st == EM_OK && h->count)
        st = em_op_call_lists(h->op, h->count, h->n_in ? (const em_tensor *const *)t : NULL,
                              attrs, t + h->n_in);
    else if (st == EM_OK)
        st = em_op_call_out(h->op, (const em_tensor *const *)t, h->n_in, attrs, t + h->n_in,
                            h->n_out);
    if (st != EM_OK) {
        fprintf(stderr, "testdev: the host kernel of %s failed on a worker: %s\n",
                em_op_name(h->op), em_last_error());
        abort();
    }
    for (int i = 0; i < n; i++) em_tensor_release(t[i]);
    em_grad_mode_pop();
}

/* On a worker thread, without the lock. */
static void td_run(const td_item *it) {
    switch (it->kind) {
    case TD_NOP: break;
    case TD_MEMCPY: memmove(it->u.mc.dst, it->u.mc.src, it->u.mc.n); break;
    case TD_KCOPY: td_run_copy(&it->u.copy.x, &it->u.copy.y); break;
    case TD_KFILL: td_run_fill(&it->u.fill.y, it->u.fill.v); break;
    case TD_KBINARY: td_run_binary(&it->u.bin.a, &it->u.bin.b, &it->u.bin.y, it->u.bin.op); break;
    case TD_KSUM: td_run_sum(&it->u.sum.x, &it->u.sum.y); break;
    case TD_STAMP: break; /* the worker reads the clock, under the lock */
    case TD_KHOST: td_run_host(it->u.host); break;
    }
}

static em_status td_k_copy(const em_kernel_ctx *ctx) {
    td_item *it = td_item_new(TD_KCOPY);
    if (!it) return EM_ERR_NOMEM;
    em_ktensor *ops[] = {&it->u.copy.x, &it->u.copy.y};
    const em_ktensor *src[] = {&ctx->in[0], &ctx->out[0]};
    return td_kernel_queue(ctx, it, ops, src, 2);
}

/* fill() -> y: attrs: value (float). */
static em_status td_k_fill(const em_kernel_ctx *ctx) {
    td_item *it = td_item_new(TD_KFILL);
    if (!it) return EM_ERR_NOMEM;
    it->u.fill.v = ctx->attrs[0].type == EM_ATTR_FLOAT ? ctx->attrs[0].v.f : 0.0;
    em_ktensor *ops[] = {&it->u.fill.y};
    const em_ktensor *src[] = {&ctx->out[0]};
    return td_kernel_queue(ctx, it, ops, src, 1);
}

/* a op b -> y; `a2` (testdev.twice_badgrad): b is a, x + x. */
static em_status td_binary(const em_kernel_ctx *ctx, char op, bool a2) {
    td_item *it = td_item_new(TD_KBINARY);
    if (!it) return EM_ERR_NOMEM;
    it->u.bin.op = op;
    em_ktensor *ops[] = {&it->u.bin.a, &it->u.bin.b, &it->u.bin.y};
    const em_ktensor *src[] = {&ctx->in[0], &ctx->in[a2 ? 0 : 1], &ctx->out[0]};
    return td_kernel_queue(ctx, it, ops, src, 3);
}

static em_status td_k_add(const em_kernel_ctx *ctx) { return td_binary(ctx, '+', false); }

#ifdef TD_HOST
/* An op of td_host_ops: its operands and attributes copied into a td_host item that runs
 * the CPU backend's kernel on the worker (td_run_host). */
static em_status td_k_host(const em_kernel_ctx *ctx) {
    int n = ctx->n_in + ctx->n_out;
    const em_op_schema *sc = em_op_schema_of(ctx->op);
    int seed_attr = -1;
    /* (td_run_host rewrites the attributes in an array of EM_CASE_MAX_ATTRS * 2) */
    for (int i = 0; sc->n_attrs <= EM_CASE_MAX_ATTRS * 2 && i + 1 < sc->n_attrs; i++)
        if (!strcmp(sc->attr_names[i], "seed") && !strcmp(sc->attr_names[i + 1], "offset") &&
            ctx->attrs[i].type == EM_ATTR_NONE && ctx->attrs[i + 1].type == EM_ATTR_INT)
            seed_attr = i;
    const uint64_t *rng = NULL;
    if (seed_attr >= 0 && !(rng = em_kernel_generator_state(ctx))) return em_last_status();
    if (n + (rng != NULL) > TD_HOST_MAX)
        return em_set_error(EM_ERR_INVALID, "testdev: %s: %d operands; the host kernels take "
                            "at most %d", em_op_name(ctx->op), n, TD_HOST_MAX);
    td_item *it = td_item_new(TD_KHOST);
    td_host *h = calloc(1, sizeof *h);
    em_attr *attrs = sc->n_attrs ? calloc((size_t)sc->n_attrs, sizeof *attrs) : NULL;
    if (!it || !h || (sc->n_attrs && !attrs)) {
        free(it), free(h), free(attrs);
        return em_set_error(EM_ERR_NOMEM, "testdev: %s: out of memory queueing work",
                            em_op_name(ctx->op));
    }
    bool lists = (sc->flags & EM_OP_LISTS) != 0;
    *h = (td_host){.refs = 1, .op = ctx->op, .n_in = ctx->n_in, .n_out = ctx->n_out,
                   .n_attrs = sc->n_attrs, .attrs = attrs,
                   .count = lists && sc->n_outputs ? ctx->n_out / sc->n_outputs : 0,
                   .seed_attr = seed_attr};
    it->u.host = h;
    bool oom = false;
    for (int i = 0; i < sc->n_attrs; i++) {
        attrs[i] = ctx->attrs[i];
        if (attrs[i].type == EM_ATTR_STRING && attrs[i].v.s) {
            char *c = strdup(attrs[i].v.s);
            attrs[i].v.s = c;
            oom |= !c;
        } else if (attrs[i].type == EM_ATTR_INT_LIST && attrs[i].n > 0) {
            int64_t *c = malloc((size_t)attrs[i].n * sizeof *c);
            if (c) memcpy(c, attrs[i].v.list, (size_t)attrs[i].n * sizeof *c);
            attrs[i].v.list = c;
            oom |= !c;
        } else if (attrs[i].type == EM_ATTR_INT_LIST) {
            attrs[i].v.list = NULL;
        }
    }
    if (oom) {
        td_item_free(it);
        return em_set_error(EM_ERR_NOMEM, "testdev: %s: out of memory queueing work",
                            em_op_name(ctx->op));
    }
    em_ktensor *ops[TD_HOST_MAX];
    const em_ktensor *src[TD_HOST_MAX];
    int m = 0;
    for (int i = 0; i < n; i++) {
        const em_ktensor *k = i < ctx->n_in ? &ctx->in[i] : &ctx->out[i - ctx->n_in];
        /* a missing input: no data, and no storage where the core says so; a list's NULL
         * entry (inputs or outputs): a zeroed view */
        if ((i < ctx->n_in && !k->data && !lists &&
             (!EM_KCTX_HAS_IDS(ctx) || !ctx->storage_ids || ctx->storage_ids[i] == 0)) ||
            (lists && !k->data && k->numel == 0 && k->ndim == 0)) {
            h->absent[i] = true;
            continue;
        }
        ops[m] = &h->kt[i];
        src[m++] = k;
    }
    /* the generator state: an operand like the others (its block resolved, waited for) */
    em_ktensor rk = {.data = (void *)rng, .dtype = EM_I64, .ndim = 1, .shape = {2},
                     .strides = {1}, .numel = 2, .contiguous = true};
    if (rng) {
        ops[m] = &h->rng;
        src[m++] = &rk;
    }
    return td_kernel_queue(ctx, it, ops, src, m);
}

#endif

#ifdef TD_MATH
static em_status td_k_mul(const em_kernel_ctx *ctx) { return td_binary(ctx, '*', false); }
static em_status td_k_twice(const em_kernel_ctx *ctx) { return td_binary(ctx, '+', true); }

static em_status td_k_sum(const em_kernel_ctx *ctx) {
    td_item *it = td_item_new(TD_KSUM);
    if (!it) return EM_ERR_NOMEM;
    em_ktensor *ops[] = {&it->u.sum.x, &it->u.sum.y};
    const em_ktensor *src[] = {&ctx->in[0], &ctx->out[0]};
    return td_kernel_queue(ctx, it, ops, src, 2);
}

/* testdev.twice_badgrad on the CPU: y = x + x, a plain loop. */
static em_status cpu_twice(const em_kernel_ctx *k) {
    const em_ktensor *ts[2] = {&k->out[0], &k->in[0]};
    em_kiter it;
    for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it)) {
        double x = em_dtype_load(ts[1]->dtype, ts[1]->data, it.off[1]);
        em_dtype_store(ts[0]->dtype, ts[0]->data, it.off[0], x + x);
    }
    return EM_OK;
}

/* Deliberately wrong: d(x + x)/dx is 2, this gives 3 * grad. */
static em_status d_twice_bad(const em_backward_ctx *c, em_tensor **gi) {
    if (!c->needs_grad[0] || !c->grad_out[0]) return EM_OK;
    em_tensor *g = c->grad_out[0];
    gi[0] = em_add(g, em_add(g, g));
    return gi[0] ? EM_OK : em_last_status();
}

static const em_op_schema twice_schema = {
    .struct_size = sizeof(em_op_schema), .name = "testdev.twice_badgrad", .n_inputs = 1,
    .n_outputs = 1, .infer = em_infer_same, .backward = d_twice_bad,
};

static const em_op_case twice_cases[] = {
    {.struct_size = sizeof(em_op_case), .op = "testdev.twice_badgrad", .variant = "2-d",
     .n_in = 1, .in = {{.ndim = 2, .shape = {3, 4}, .dtype = -1}},
     .dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64), .differentiable = true},
};
#endif

/* ---- registration ------------------------------------------------------------------------- */

#ifdef TD_HOST
/* The ops a small MLP's training step (linear, relu, cross entropy, SGD) and its evaluation
 * call, given host kernels on testdev (TD_KHOST) so that a whole step runs, and is captured,
 * on the device: tests/test_graph_capture.sh. */
static const char *const td_host_ops[] = {
    "addmm", "argmax", "bernoulli", "bmm", "cross_entropy", "cross_entropy_backward",
    "div_scalar", "dropout", "eq", "linear", "matmul", "mul", "mul_scalar", "mul_scalar_",
    "norm", "relu", "relu_backward", "sum", "to_dtype", "uniform", "normal", "amp_unscale_",
    "fused_adam", "fused_adamw", "fused_sgd_capturable", "fused_adam_capturable",
    "fused_adamw_capturable", "add", "abs", "add_scalar", "clamp", "div", "maximum", "neg",
    "pow", "sqrt", "ne", "lt", "le", "where", "logical_and", "reciprocal",
    "scaled_dot_product_attention", "scaled_dot_product_attention_backward", "embedding",
    "embedding_backward", "layer_norm", "layer_norm_backward"};
/* Not tanh: tests/test_graph_capture.sh needs an op whose CPU fallback breaks a capture. Not
 * fused_sgd: SGD steps op by op there, as on a device without the fused kernel (with
 * --graph-capture it takes fused_sgd_capturable, whose lr is device memory). amp_unscale_
 * (a list op) for the gradient scaler's test of its host reads (tests/test_grad_scaler.c);
 * the fused Adam forms and the capturable ones for --graph-capture's Adam, AdamW and
 * per-step schedules (tests/test_graph_capture.sh, against the plain forms); add (but float32,
 * testdev's own kernel), abs, add_scalar, clamp, div, maximum, neg, pow and sqrt for the
 * gradient clipping's device arithmetic (em_clip_grad_norm_device_: --graph-capture with
 * --clip-grad-norm) and capturable AMSGrad's op-by-op step (plugins/optim/optimizers.c,
 * adam_one_capturable: tests/test_fused_optim.c, tests/test_graph_capture.sh); ne, lt, le,
 * where, logical_and and reciprocal for the capturable gradient scaler's device update and
 * its undoing of a skipped step (core/grad_scaler.c: --graph-capture with --amp fp16);
 * scaled_dot_product_attention and its backward for captured attention dropout (the
 * generator state read when the item runs: td_run_host; tests/test_graph_rng.c); embedding,
 * layer_norm and their backwards for the rest of a small Transformer's step (a char-level
 * TransformerEncoder with attention dropout under --graph-capture: tests/test_graph_capture.sh). */
#endif

static em_status td_kernel(em_registry *r, const char *op, em_dtype dt, em_kernel_fn fn) {
    char name[64];
    snprintf(name, sizeof name, "testdev_%s_%s", op, em_dtype_name(dt));
    em_kernel_def def = {.struct_size = sizeof def, .op = op, .device_type = "testdev",
                         .dtype = dt, .priority = 0, .fn = fn, .name = name};
    return em_kernel_register(r, &def, NULL);
}

static em_status td_register(em_registry *r) {
    em_status st = em_device_type_register(r, &td_device);
    em_device d;
    if (st == EM_OK) st = em_device_parse("testdev:0", &d);
    if (st != EM_OK) return st;
    G.type = d.type;
    for (int t = 0; t < EM_DTYPE_COUNT && st == EM_OK; t++) {
        st = td_kernel(r, "copy", (em_dtype)t, td_k_copy);
        if (st == EM_OK) st = td_kernel(r, "fill", (em_dtype)t, td_k_fill);
    }
    if (st == EM_OK) st = td_kernel(r, "add", EM_F32, td_k_add);
#ifdef TD_MATH
    for (int t = 0; t < 2 && st == EM_OK; t++) {
        em_dtype dt = t ? EM_F64 : EM_F32;
        st = td_kernel(r, "mul", dt, td_k_mul);
        if (st == EM_OK) st = td_kernel(r, "sum", dt, td_k_sum);
    }
    if (st == EM_OK) st = em_op_declare(r, &twice_schema, NULL);
    if (st == EM_OK) st = em_op_cases_register(r, twice_cases, 1);
    for (int t = 0; t < 2 && st == EM_OK; t++) {
        em_dtype dt = t ? EM_F64 : EM_F32;
        st = td_kernel(r, "testdev.twice_badgrad", dt, td_k_twice);
        em_kernel_def def = {.struct_size = sizeof def, .op = "testdev.twice_badgrad",
                             .device_type = "cpu", .dtype = dt, .fn = cpu_twice,
                             .name = t ? "cpu_twice_badgrad_float64" : "cpu_twice_badgrad_float32"};
        if (st == EM_OK) st = em_kernel_register(r, &def, NULL);
    }
#endif
#ifdef TD_HOST
    /* every dtype the CPU backend (loaded first: plugins load in name order, and "ember-cpu"
     * sorts before "ember-testdev-host") has a kernel for */
    for (size_t i = 0; i < sizeof td_host_ops / sizeof *td_host_ops && st == EM_OK; i++) {
        const em_op *op = em_op_find(td_host_ops[i]);
        if (!op) continue; /* not declared by this build (a plugin not loaded) */
        for (int t = 0; t < EM_DTYPE_COUNT && st == EM_OK; t++)
            if (em_op_kernel_count(op, em_cpu(), (em_dtype)t) > 0 &&
                !(t == EM_F32 && !strcmp(td_host_ops[i], "add")))
                st = td_kernel(r, td_host_ops[i], (em_dtype)t, td_k_host);
    }
#endif
    return st;
}

/* After the core removed the device type (and returned its cached blocks): whatever is still
 * allocated was leaked by whoever allocated it. */
static void td_shutdown(void) {
    for (int i = 0; i < TD_COUNT; i++) {
        pthread_mutex_lock(&G.lock);
        td_queue *q = G.def[i];
        G.def[i] = NULL;
        pthread_mutex_unlock(&G.lock);
        if (q) q_close(q);
    }
    pthread_mutex_lock(&G.lock);
    for (int i = 0; i < TD_COUNT; i++) {
        size_t ns = 0;
        for (const td_queue *q = G.queues[i]; q; q = q->next) ns++;
        if (ns)
            em_log_write(EM_LOG_WARN, "testdev: %zu stream%s of testdev:%d never freed", ns,
                         ns == 1 ? "" : "s", i);
        size_t n = 0;
        for (const td_block *b = G.live[i]; b; b = b->next) n++;
        if (n)
            em_log_write(EM_LOG_WARN, "testdev: %zu block%s (%zu bytes) still allocated on "
                         "testdev:%d at shutdown", n, n == 1 ? "" : "s", G.used[i], i);
    }
    if (G.pinned_blocks)
        em_log_write(EM_LOG_WARN, "testdev: %zu page-locked host block%s (%zu bytes) still "
                     "allocated at shutdown", G.pinned_blocks, G.pinned_blocks == 1 ? "" : "s",
                     G.pinned_bytes);
    G.type = -1;
    pthread_mutex_unlock(&G.lock);
}

static const em_plugin_descriptor td_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
#ifdef TD_MATH
    .name = "ember-testdev-math",
#elif defined TD_HOST
    .name = "ember-testdev-host",
#else
    .name = "ember-testdev",
#endif
    .version = EM_VERSION_STRING,
#ifdef TD_MATH
    .description = "test-only device 'testdev' (2 asynchronous devices in host memory; copy, "
                   "fill, add f32, mul and sum f32/f64; testdev.twice_badgrad)",
#elif defined TD_HOST
    .description = "test-only device 'testdev' (2 asynchronous devices in host memory; copy, "
                   "fill, add f32, and the CPU's kernels of a small MLP's training step run "
                   "on the device's queues)",
#else
    .description = "test-only device 'testdev' (2 asynchronous devices in host memory; copy, "
                   "fill, add f32)",
#endif
    .register_fn = td_register,
    .shutdown_fn = td_shutdown,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &td_plugin; }
