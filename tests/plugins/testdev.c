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
 *   - streams count the work queued on them, events record a stream's count, and every
 *     stream and event call checks that its handles belong to the device they are used on;
 *   - page-locked host memory (host_alloc) is plain host memory with a header; the live
 *     pinned blocks and bytes are counted, and ember_testdev_pinned() reports them (tests
 *     find it with dlsym) so pin_memory can be checked;
 *   - kernels exist only for copy and fill (every dtype) and add (float32), so every other op
 *     exercises the fallback policy.
 */
#include <assert.h>
#include <pthread.h>
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
    struct td_block *prev, *next;
} td_block;
static_assert(sizeof(td_block) <= TD_HDR, "the header must fit in TD_HDR");

static struct {
    pthread_mutex_t lock;
    td_block *live[TD_COUNT]; /* live allocations, per device */
    size_t used[TD_COUNT];
    uint64_t default_work[TD_COUNT]; /* work queued on each device's default stream */
    uint64_t next_stream_id;
    int type; /* our device-type index, learned at registration */
    size_t pinned_blocks, pinned_bytes; /* live host_alloc blocks */
} G = {.lock = PTHREAD_MUTEX_INITIALIZER, .type = -1};

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
    uint64_t canary;
    memcpy(&canary, host + b->nbytes, sizeof canary);
    if (canary != TD_CANARY) td_fatal("write past the end of a block", ptr, index);
    pthread_mutex_lock(&G.lock);
    if (b->prev) b->prev->next = b->next;
    else G.live[index] = b->next;
    if (b->next) b->next->prev = b->prev;
    G.used[index] -= b->nbytes;
    pthread_mutex_unlock(&G.lock);
    b->magic = TD_DEAD;
    free(b);
}

/* True when [host, host + n) lies inside one live allocation of testdev:index. */
static bool td_range_live(int index, const char *host, size_t n) {
    bool ok = false;
    pthread_mutex_lock(&G.lock);
    for (const td_block *b = G.live[index]; b && !ok; b = b->next) {
        const char *lo = (const char *)b + TD_HDR;
        ok = host >= lo && n <= b->nbytes && host - lo <= (ptrdiff_t)(b->nbytes - n);
    }
    pthread_mutex_unlock(&G.lock);
    return ok;
}

/* Host address of n device bytes at dev_ptr on testdev:index, checked. */
static em_status td_resolve(const char *who, int index, const void *dev_ptr, size_t n,
                            char **out) {
    char *host = td_index_ok(index) ? td_untag(dev_ptr, index) : NULL;
    if (!host)
        return em_set_error(EM_ERR_DEVICE, "testdev: %s: %p is not testdev:%d memory", who,
                            dev_ptr, index);
    if (n && !td_range_live(index, host, n))
        return em_set_error(EM_ERR_DEVICE, "testdev: %s: %zu bytes at %p are not inside a "
                            "live testdev:%d allocation", who, n, dev_ptr, index);
    *out = host;
    return EM_OK;
}

/* ---- streams and events ------------------------------------------------------------------- */

struct em_stream {
    uint64_t magic;
    int index;
    uint64_t id;
    uint64_t work; /* items queued so far; the device runs them before returning */
};

struct em_event {
    uint64_t magic;
    int index;
    bool recorded;
    uint64_t stream_id; /* 0: the default stream */
    uint64_t value;     /* the stream's work count when recorded */
};

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

/* Count one item of work on s (NULL: the default stream). */
static void td_queue_work(int index, em_stream *s) {
    pthread_mutex_lock(&G.lock);
    if (s) s->work++;
    else G.default_work[index]++;
    pthread_mutex_unlock(&G.lock);
}

static em_status td_stream_create(int index, em_stream **out) {
    *out = NULL;
    if (!td_index_ok(index))
        return em_set_error(EM_ERR_DEVICE, "testdev: stream_create on testdev:%d", index);
    em_stream *s = calloc(1, sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "testdev: stream_create: out of memory");
    pthread_mutex_lock(&G.lock);
    *s = (em_stream){.magic = TD_STREAM_MAGIC, .index = index, .id = ++G.next_stream_id};
    pthread_mutex_unlock(&G.lock);
    *out = s;
    return EM_OK;
}

static void td_stream_destroy(int index, em_stream *s) {
    if (td_check_stream("stream_destroy", index, s) != EM_OK)
        td_fatal("stream_destroy of a foreign stream", s, index);
    if (!s) return;
    s->magic = TD_DEAD;
    free(s);
}

static em_status td_stream_synchronize(int index, em_stream *s) {
    /* Work runs as it is queued, so a valid stream is always idle. */
    return td_check_stream("stream_synchronize", index, s);
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
    e->magic = TD_DEAD;
    free(e);
}

static em_status td_event_record(int index, em_event *e, em_stream *s) {
    em_status st = td_check_event("event_record", index, e);
    if (st == EM_OK) st = td_check_stream("event_record", index, s);
    if (st != EM_OK) return st;
    pthread_mutex_lock(&G.lock);
    e->recorded = true;
    e->stream_id = s ? s->id : 0;
    e->value = s ? s->work : G.default_work[index];
    pthread_mutex_unlock(&G.lock);
    return EM_OK;
}

static em_status td_event_wait(int index, em_stream *s, em_event *e) {
    em_status st = td_check_event("event_wait", index, e);
    if (st == EM_OK) st = td_check_stream("event_wait", index, s);
    if (st != EM_OK) return st;
    if (!e->recorded)
        return em_set_error(EM_ERR_STATE, "testdev: event_wait: the event was never recorded "
                            "(record it on a stream of testdev:%d first)", index);
    /* The wait is itself an item of work on s, ordered after everything the event covers. */
    td_queue_work(index, s);
    return EM_OK;
}

static em_status td_event_synchronize(int index, em_event *e) {
    em_status st = td_check_event("event_synchronize", index, e);
    if (st != EM_OK) return st;
    if (!e->recorded)
        return em_set_error(EM_ERR_STATE, "testdev: event_synchronize: the event was never "
                            "recorded on testdev:%d", index);
    return EM_OK;
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
    char *hd = dst, *hs = (char *)src;
    if (st == EM_OK && td_is_ours(dd)) st = td_resolve("copy destination", dd.index, dst, n, &hd);
    if (st == EM_OK && td_is_ours(sd)) st = td_resolve("copy source", sd.index, src, n, &hs);
    if (st != EM_OK) return st;
    memmove(hd, hs, n);
    td_queue_work(index, s);
    return EM_OK;
}

static em_status td_synchronize(int index) {
    if (!td_index_ok(index))
        return em_set_error(EM_ERR_DEVICE, "testdev: synchronize on testdev:%d", index);
    return EM_OK;
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
};

/* ---- kernels ------------------------------------------------------------------------------ */

/* Host address of t's first element, after checking that every element t can reach (from its
 * shape and strides) lies inside one live allocation of the kernel's device. */
static em_status td_kernel_tensor(const em_kernel_ctx *ctx, const em_ktensor *t, char **out) {
    if (t->numel == 0) {
        *out = NULL;
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
                              &first);
    if (st == EM_OK) *out = first - lo * es;
    return st;
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
static em_status td_k_copy(const em_kernel_ctx *ctx) {
    const em_ktensor *x = &ctx->in[0], *y = &ctx->out[0];
    char *hx, *hy;
    em_status st = td_kernel_tensor(ctx, x, &hx);
    if (st == EM_OK) st = td_kernel_tensor(ctx, y, &hy);
    if (st != EM_OK) return st;
    size_t xs = em_dtype_size(x->dtype), ys = em_dtype_size(y->dtype);
    for (int64_t i = 0; i < y->numel; i++) {
        int64_t ox = td_offset(y, x, i), oy = td_offset(y, y, i);
        if (x->dtype == y->dtype)
            memcpy(hy + oy * (int64_t)ys, hx + ox * (int64_t)xs, ys);
        else
            em_dtype_store(y->dtype, hy, oy, em_dtype_load(x->dtype, hx, ox));
    }
    td_queue_work(ctx->device.index, ctx->stream);
    return EM_OK;
}

/* fill() -> y: attrs: value (float). */
static em_status td_k_fill(const em_kernel_ctx *ctx) {
    const em_ktensor *y = &ctx->out[0];
    char *hy;
    em_status st = td_kernel_tensor(ctx, y, &hy);
    if (st != EM_OK) return st;
    double v = ctx->attrs[0].type == EM_ATTR_FLOAT ? ctx->attrs[0].v.f : 0.0;
    for (int64_t i = 0; i < y->numel; i++) em_dtype_store(y->dtype, hy, td_offset(y, y, i), v);
    td_queue_work(ctx->device.index, ctx->stream);
    return EM_OK;
}

/* add(a, b) -> y, float32: inputs broadcast to y's shape (stride 0 on broadcast dims); y may
 * alias an input. */
static em_status td_k_add_f32(const em_kernel_ctx *ctx) {
    const em_ktensor *a = &ctx->in[0], *b = &ctx->in[1], *y = &ctx->out[0];
    char *ha, *hb, *hy;
    em_status st = td_kernel_tensor(ctx, a, &ha);
    if (st == EM_OK) st = td_kernel_tensor(ctx, b, &hb);
    if (st == EM_OK) st = td_kernel_tensor(ctx, y, &hy);
    if (st != EM_OK) return st;
    const float *pa = (const float *)ha, *pb = (const float *)hb;
    float *py = (float *)hy;
    for (int64_t i = 0; i < y->numel; i++)
        py[td_offset(y, y, i)] = pa[td_offset(y, a, i)] + pb[td_offset(y, b, i)];
    td_queue_work(ctx->device.index, ctx->stream);
    return EM_OK;
}

/* ---- registration ------------------------------------------------------------------------- */

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
    if (st == EM_OK) st = td_kernel(r, "add", EM_F32, td_k_add_f32);
    return st;
}

/* After the core removed the device type (and returned its cached blocks): whatever is still
 * allocated was leaked by whoever allocated it. */
static void td_shutdown(void) {
    pthread_mutex_lock(&G.lock);
    for (int i = 0; i < TD_COUNT; i++) {
        size_t n = 0;
        for (const td_block *b = G.live[i]; b; b = b->next) n++;
        if (n)
            em_log_write(EM_LOG_WARN, "testdev: %zu block%s (%zu bytes) still allocated on "
                         "testdev:%d at shutdown", n, n == 1 ? "" : "s", G.used[i], i);
        G.default_work[i] = 0;
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
    .name = "ember-testdev",
    .version = EM_VERSION_STRING,
    .description = "test-only device 'testdev' (2 devices in host memory; copy, fill, add f32)",
    .register_fn = td_register,
    .shutdown_fn = td_shutdown,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &td_plugin; }
