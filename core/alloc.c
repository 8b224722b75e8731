/*
 * alloc.c — host memory through the injectable host allocator, and the caching device
 * allocator with per-category statistics.
 *
 * Host memory. Every core structure and every CPU tensor's bytes come from the current
 * em_host_allocator (default: posix_memalign/free). Tests swap it between em_shutdown() and
 * em_init() to fail the Nth allocation; em__malloc and friends turn a NULL into EM_ERR_NOMEM
 * with a message naming what was being allocated.
 *
 * The caching device allocator (one per device, over the device type's em_device_ops).
 *   Rounding: a request of n bytes gets a block of
 *       n <= 1 MiB:  n rounded up to a multiple of 512 B, at least 512 B ("small");
 *       n >  1 MiB:  n rounded up to a multiple of 2 MiB ("large").
 *   Reuse: a released block is kept in the cache (it counts as EM_MEM_CACHED). A small
 *       request is served only by a cached block of exactly its rounded size (one bucket per
 *       size, 2048 buckets); a large request by the smallest cached large block whose size is
 *       at least the rounded request and at most twice it. The block keeps its own size.
 *   Statistics count BLOCK sizes (rounded, and for a reused large block its full size), so
 *       current[] adds up with the cache to exactly what was taken from the device:
 *       reserved == sum of current[all categories including EM_MEM_CACHED].
 *   Streams (devices whose table has streams; the CPU has none and pays one test): a block
 *       belongs to the stream it was allocated on — the allocating thread's current stream on
 *       the device (em_stream_current) — and a release puts it back in that stream's own
 *       cache (a pool: the buckets above, per stream), so only that stream, whose later work
 *       is ordered after its earlier work, reuses it at once. A block used on other streams
 *       too (em__allocator_record_stream) instead waits at release for an event recorded then
 *       on each of them; the next allocations poll those events (event_query) and the block
 *       joins its stream's cache once all have completed. A device without event_query gets
 *       such blocks back when the cache is emptied (its events synchronized). A freed
 *       stream's cache goes to the default stream's (its work is done: em_stream_free waits).
 *       Waiting blocks count as EM_MEM_CACHED: the statistics do not depend on streams.
 *   Out of memory: when the device's alloc fails with EM_ERR_NOMEM the cache (every
 *       stream's, and the waiting blocks once their events are synchronized) is handed back
 *       to the device and the alloc retried once; then EM_ERR_NOMEM names the device, the
 *       request and the bytes in use by category.
 *   Graph capture (em_graph_capture_begin, ember/device.h) — the capture-safe path: while a
 *       stream records, allocations whose current stream is that one come from a pool made
 *       for the capture (a graph pool: it belongs to the graph, not to the stream), which
 *       reuses the blocks freed during the capture (a replay runs them in the same order).
 *       After the capture the graph pool only takes blocks back: it never serves another
 *       allocation, and emptying the cache leaves it alone, because the graph's replays
 *       write into its blocks. While any stream of the device records, nothing is handed
 *       back to the device (freeing device memory would break the capture) and the waiting
 *       blocks are not polled (querying events during a capture is not allowed). When the
 *       graph is freed its pool is dead like a freed stream's: its cached blocks go to the
 *       default stream's cache, the rest as they are released.
 *   Locking: one mutex per allocator; the device alloc/free and event calls run under it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/device.h"
#include "ember/error.h"
#include "internal.h"

/* ---- host memory ---------------------------------------------------------------------------- */

#define EM_HOST_MIN_ALIGN 16

static void *default_host_alloc(size_t nbytes, size_t align, void *user) {
    (void)user;
    /* malloc's alignment suffices for most requests (every small core structure) and is
     * cheaper than posix_memalign's path. */
    if (align <= _Alignof(max_align_t))
        return malloc(nbytes);
    void *p = NULL;
    if (posix_memalign(&p, align, nbytes) != 0)
        return NULL;
    return p;
}

static void default_host_free(void *ptr, void *user) {
    (void)user;
    free(ptr);
}

/* A copy of the installed allocator: the caller's struct need not outlive the call. */
static struct {
    em_host_allocator a;
} g_host = {{default_host_alloc, default_host_free, NULL}};

void em_host_allocator_set(const em_host_allocator *a) {
    if (a && a->alloc && a->free)
        g_host.a = *a;
    else
        g_host.a = (em_host_allocator){default_host_alloc, default_host_free, NULL};
}

/* The hook itself: no error set. nbytes 0 asks for 1 so that a non-NULL pointer means success. */
static void *host_alloc_raw(size_t nbytes, size_t align) {
    if (align < sizeof(void *))
        align = sizeof(void *);
    return g_host.a.alloc(nbytes ? nbytes : 1, align, g_host.a.user);
}

void *em_host_alloc(size_t nbytes, size_t align) {
    if (align == 0 || (align & (align - 1)) != 0) {
        em_set_error(EM_ERR_INVALID, "em_host_alloc: alignment %zu is not a power of two", align);
        return NULL;
    }
    void *p = host_alloc_raw(nbytes, align);
    if (!p)
        em_set_error(EM_ERR_NOMEM, "out of memory allocating %zu bytes (host, aligned to %zu)",
                     nbytes, align);
    return p;
}

void em_host_free(void *ptr) {
    if (ptr)
        g_host.a.free(ptr, g_host.a.user);
}

static void *nomem(size_t n, const char *what) {
    em_set_error(EM_ERR_NOMEM, "out of memory allocating %zu bytes for %s", n,
                 what ? what : "(unnamed)");
    return NULL;
}

void *em__malloc(size_t n, const char *what) {
    void *p = host_alloc_raw(n, EM_HOST_MIN_ALIGN);
    return p ? p : nomem(n, what);
}

void *em__calloc(size_t count, size_t size, const char *what) {
    if (size && count > SIZE_MAX / size) {
        em_set_error(EM_ERR_NOMEM, "out of memory allocating %zu x %zu bytes for %s "
                     "(size overflows)", count, size, what ? what : "(unnamed)");
        return NULL;
    }
    void *p = em__malloc(count * size, what);
    if (p)
        memset(p, 0, count * size);
    return p;
}

/* The hook has no realloc: allocate, copy, free. On failure p is left untouched. */
void *em__realloc(void *p, size_t old_n, size_t new_n, const char *what) {
    void *q = em__malloc(new_n, what);
    if (!q)
        return NULL;
    if (p) {
        memcpy(q, p, EM_MIN(old_n, new_n));
        em__free(p);
    }
    return q;
}

char *em__strdup(const char *s, const char *what) {
    if (!s) {
        em_set_error(EM_ERR_INVALID, "NULL string to copy for %s", what ? what : "(unnamed)");
        return NULL;
    }
    size_t n = strlen(s) + 1;
    char *d = em__malloc(n, what);
    if (d)
        memcpy(d, s, n);
    return d;
}

void em__free(void *p) {
    em_host_free(p);
}

/* ---- human-readable sizes ------------------------------------------------------------------ */

/* "512 B", "1.5 KiB", "12.0 MiB" into buf; returns buf. */
static const char *size_str(size_t n, char *buf, size_t cap) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    if (n < 1024) {
        snprintf(buf, cap, "%zu B", n);
        return buf;
    }
    double v = (double)n / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < EM_ARRAY_LEN(units)) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.1f %s", v, units[u]);
    return buf;
}

/* ---- caching device allocator -------------------------------------------------------------- */

#define SMALL_GRAIN ((size_t)512)
#define SMALL_MAX ((size_t)1 << 20)
#define LARGE_GRAIN ((size_t)2 << 20)
#define N_SMALL_BUCKETS (SMALL_MAX / SMALL_GRAIN) /* sizes 512, 1024, ..., 1 MiB */

/* One stream's cache of free blocks. */
typedef struct em__pool {
    em_stream *stream;                 /* NULL: the default stream */
    bool dead;                         /* its stream was freed: nothing allocates here now */
    bool graph;                        /* a graph's pool (see "Graph capture" above) */
    bool capturing;                    /* a graph pool whose stream is recording now */
    size_t refs;                       /* blocks that return here: in use, waiting or cached */
    size_t ncached;
    em__block *small[N_SMALL_BUCKETS]; /* cached blocks of size (i + 1) * 512 */
    em__block *large;                  /* cached large blocks, ascending size */
} em__pool;

/* The other streams a block was used on (em_tensor_record_stream) and, once it is released,
 * the event recorded on each (NULL: that one has completed). */
typedef struct em__uses {
    em__block *block;
    struct em__uses *prev, *next; /* the allocator's list of in-use blocks with uses */
    size_t n, cap;
    struct {
        em_stream *s;
        em_event *e;
    } u[];
} em__uses;

struct em__allocator {
    em_device dev;
    const em_device_ops *ops;
    pthread_mutex_t lock;
    em_memory_stats st;
    bool streams;       /* the device has streams: each allocation picks its stream's pool */
    em__pool def;       /* the default stream's cache */
    em__pool **pools;   /* the other streams' caches (dead ones are recycled) */
    size_t npools;
    em__uses *recorded; /* in-use blocks that other streams used */
    em__block *waiting; /* released blocks whose events have not all completed */
    em_event **spare;   /* completed events, for reuse */
    size_t nspare, spare_cap;
    int capturing;      /* streams of the device recording a graph now */
};

static const char *const g_cat_names[EM_MEM_CATEGORY_COUNT] = {
    [EM_MEM_ACTIVATION] = "activation", [EM_MEM_PARAMETER] = "parameter",
    [EM_MEM_GRADIENT] = "gradient",     [EM_MEM_OPTIMIZER] = "optimizer",
    [EM_MEM_DATA] = "data",             [EM_MEM_WORKSPACE] = "workspace",
    [EM_MEM_CACHED] = "cached",
};

const char *em_mem_category_name(em_mem_category c) {
    if ((int)c < 0 || c >= EM_MEM_CATEGORY_COUNT)
        return "unknown";
    return g_cat_names[c];
}

/* The block size for a request, per the rule above; 0 when it overflows. */
static size_t round_size(size_t n) {
    size_t grain = n <= SMALL_MAX ? SMALL_GRAIN : LARGE_GRAIN;
    if (n == 0)
        return SMALL_GRAIN;
    if (n > SIZE_MAX - (grain - 1))
        return 0;
    return (n + grain - 1) / grain * grain;
}

static void stat_add(em__allocator *a, em_mem_category c, size_t n) {
    a->st.current[c] += n;
    a->st.count[c]++;
    if (a->st.current[c] > a->st.peak[c])
        a->st.peak[c] = a->st.current[c];
}

static void stat_sub(em__allocator *a, em_mem_category c, size_t n) {
    a->st.current[c] -= n;
    a->st.count[c]--;
}

static void reserve_add(em__allocator *a, size_t n) {
    a->st.reserved += n;
    if (a->st.reserved > a->st.peak_reserved)
        a->st.peak_reserved = a->st.reserved;
}

em__allocator *em__allocator_new(em_device dev, const em_device_ops *ops) {
    em__allocator *a = em__calloc(1, sizeof *a, "device allocator");
    if (!a)
        return NULL;
    if (pthread_mutex_init(&a->lock, NULL) != 0) {
        em__free(a);
        em_set_error(EM_ERR_NOMEM, "out of memory creating the device allocator's lock");
        return NULL;
    }
    a->dev = dev;
    a->ops = ops;
    a->streams = ops->stream_create != NULL;
    return a;
}

/* ---- the pools' free lists (all with the lock held; statistics are the callers') ---- */

static void pool_put(em__pool *p, em__block *b) {
    em__block **link;
    if (b->size <= SMALL_MAX) {
        link = &p->small[b->size / SMALL_GRAIN - 1];
    } else {
        link = &p->large;
        while (*link && (*link)->size < b->size)
            link = &(*link)->next;
    }
    b->next = *link;
    *link = b;
    p->ncached++;
}

/* A cached block of p for a request rounded to `size`, or NULL. */
static em__block *pool_take(em__pool *p, size_t size) {
    em__block **link;
    if (size <= SMALL_MAX) {
        link = &p->small[size / SMALL_GRAIN - 1];
    } else {
        link = &p->large;
        while (*link && (*link)->size < size)
            link = &(*link)->next;
        if (*link && (*link)->size / 2 > size) /* larger than twice the request */
            return NULL;
    }
    em__block *b = *link;
    if (b) {
        *link = b->next;
        b->next = NULL;
        p->ncached--;
    }
    return b;
}

/* Every cached block of p, one at a time, or NULL when none is left. */
static em__block *pool_pop_any(em__pool *p) {
    if (!p->ncached)
        return NULL;
    for (size_t i = 0; i < N_SMALL_BUCKETS; i++)
        if (p->small[i])
            return pool_take(p, (i + 1) * SMALL_GRAIN);
    em__block *b = p->large;
    p->large = b->next;
    b->next = NULL;
    p->ncached--;
    return b;
}

/* Hand one cached block back to the device. */
static void drop_cached(em__allocator *a, em__block *b) {
    stat_sub(a, EM_MEM_CACHED, b->size);
    a->st.reserved -= b->size;
    b->pool->refs--;
    a->ops->free(a->dev.index, b->ptr);
    em__free(b);
}

/* The blocks cached in p (a freed stream's) now belong to the default stream's cache. */
static void pool_sweep(em__allocator *a, em__pool *p) {
    em__block *b;
    while ((b = pool_pop_any(p))) {
        p->refs--;
        b->pool = &a->def;
        a->def.refs++;
        pool_put(&a->def, b);
    }
}

/* ---- events: a released block that other streams used waits for them ---- */

static em_status event_get(em__allocator *a, em_event **e) {
    *e = NULL;
    if (a->nspare) {
        *e = a->spare[--a->nspare];
        return EM_OK;
    }
    if (!a->ops->event_create || !a->ops->event_record)
        return EM_ERR_DEVICE;
    return a->ops->event_create(a->dev.index, e);
}

static void event_put(em__allocator *a, em_event *e) {
    if (a->nspare == a->spare_cap) {
        size_t cap = a->spare_cap ? 2 * a->spare_cap : 8;
        em_event **s = em__realloc(a->spare, a->spare_cap * sizeof *s, cap * sizeof *s,
                                   "the allocator's spare events");
        if (!s) {
            if (a->ops->event_destroy)
                a->ops->event_destroy(a->dev.index, e);
            return;
        }
        a->spare = s;
        a->spare_cap = cap;
    }
    a->spare[a->nspare++] = e;
}

static void uses_unlink(em__allocator *a, em__uses *u) {
    if (u->prev)
        u->prev->next = u->next;
    else if (a->recorded == u)
        a->recorded = u->next;
    if (u->next)
        u->next->prev = u->prev;
    u->prev = u->next = NULL;
}

static void uses_link(em__allocator *a, em__uses *u) {
    u->prev = NULL;
    u->next = a->recorded;
    if (u->next)
        u->next->prev = u;
    a->recorded = u;
}

/* b's waits are over: it joins its stream's cache. */
static void block_settled(em__block *b) {
    em__free(b->uses);
    b->uses = NULL;
    pool_put(b->pool, b);
}

/* Release of a block other streams used: record an event on each, then wait in a->waiting.
 * When the device cannot record one, wait for that stream here instead. */
static void block_defer(em__allocator *a, em__block *b) {
    em__uses *u = b->uses;
    uses_unlink(a, u);
    bool pending = false;
    for (size_t i = 0; i < u->n; i++) {
        em_event *e = NULL;
        if (event_get(a, &e) == EM_OK && a->ops->event_record(a->dev.index, e, u->u[i].s) == EM_OK) {
            u->u[i].e = e;
            pending = true;
            continue;
        }
        if (e)
            event_put(a, e);
        u->u[i].e = NULL;
        if (a->ops->stream_synchronize)
            a->ops->stream_synchronize(a->dev.index, u->u[i].s);
    }
    if (!pending) {
        block_settled(b);
        return;
    }
    b->next = a->waiting;
    a->waiting = b;
}

/* Move the waiting blocks whose events have all completed to their caches. `wait`: wait for
 * every event (event_synchronize) instead of polling (event_query, when the device has it). */
static void waiting_settle(em__allocator *a, bool wait) {
    if (!wait && !a->ops->event_query)
        return;
    em__block **link = &a->waiting;
    while (*link) {
        em__block *b = *link;
        em__uses *u = b->uses;
        bool all = true;
        for (size_t i = 0; i < u->n; i++) {
            em_event *e = u->u[i].e;
            if (!e)
                continue;
            bool done = false;
            if (!wait && a->ops->event_query(a->dev.index, e, &done) != EM_OK)
                wait = true; /* a device that cannot say: wait for this one */
            if (wait) {
                if (a->ops->event_synchronize)
                    a->ops->event_synchronize(a->dev.index, e);
                done = true;
            }
            if (done) {
                event_put(a, e);
                u->u[i].e = NULL;
            } else {
                all = false;
            }
        }
        if (all) {
            *link = b->next;
            b->next = NULL;
            block_settled(b);
        } else {
            link = &b->next;
        }
    }
}

/* The pool of stream s (NULL: the default stream's), made on first use. On the way, polls
 * the waiting blocks and hands freed streams' cached blocks to the default pool. */
static em_status pool_of(em__allocator *a, em_stream *s, em__pool **out) {
    if (a->waiting && !a->capturing)
        waiting_settle(a, false);
    em__pool *found = s ? NULL : &a->def, *recycle = NULL, *capture = NULL;
    for (size_t i = 0; i < a->npools; i++) {
        em__pool *p = a->pools[i];
        if (p->dead) {
            if (p->ncached)
                pool_sweep(a, p);
            if (!p->refs && !recycle)
                recycle = p;
        } else if (p->graph) {
            if (p->capturing && p->stream == s)
                capture = p;
        } else if (!found && p->stream == s) {
            found = p;
        }
    }
    if (capture) {
        *out = capture;
        return EM_OK;
    }
    if (!found && recycle) {
        recycle->dead = recycle->graph = recycle->capturing = false;
        recycle->stream = s;
        found = recycle;
    }
    if (!found) {
        em__pool *p = em__calloc(1, sizeof *p, "a stream's block cache");
        em__pool **v = p ? em__realloc(a->pools, a->npools * sizeof *v,
                                       (a->npools + 1) * sizeof *v, "the stream caches") : NULL;
        if (!v) {
            em__free(p);
            return EM_ERR_NOMEM;
        }
        p->stream = s;
        v[a->npools++] = p;
        a->pools = v;
        found = p;
    }
    *out = found;
    return EM_OK;
}

/* Called with the lock held. Nothing while a stream of the device records a graph; never a
 * live graph's pool. */
static void empty_cache_locked(em__allocator *a) {
    if (a->capturing)
        return;
    waiting_settle(a, true);
    em__block *b;
    while ((b = pool_pop_any(&a->def)))
        drop_cached(a, b);
    for (size_t i = 0; i < a->npools; i++)
        if (!a->pools[i]->graph || a->pools[i]->dead)
            while ((b = pool_pop_any(a->pools[i])))
                drop_cached(a, b);
}

void em__allocator_free(em__allocator *a) {
    if (!a)
        return;
    pthread_mutex_lock(&a->lock);
    empty_cache_locked(a);
    for (size_t i = 0; i < a->nspare; i++)
        if (a->ops->event_destroy)
            a->ops->event_destroy(a->dev.index, a->spare[i]);
    while (a->recorded) { /* blocks still in use leak; their records need not */
        em__uses *u = a->recorded;
        uses_unlink(a, u);
        u->block->uses = NULL;
        em__free(u);
    }
    for (size_t i = 0; i < a->npools; i++)
        em__free(a->pools[i]);
    pthread_mutex_unlock(&a->lock);
    em__free(a->spare);
    em__free(a->pools);
    pthread_mutex_destroy(&a->lock);
    em__free(a);
}

/* EM_ERR_NOMEM naming the device, the request, what holds the memory by category, what is
 * reserved from the device and how much of that is fragmented (reserved but in no live block:
 * cached blocks that could not be handed back, every one of them too small or still waiting
 * for another stream), what the device itself says is free, and what to do about it. Called
 * with the lock held, after the cache was emptied. */
static em_status oom_error(em__allocator *a, size_t size, size_t cached_before) {
    char dev[32], req[32], used[32], cached[32], part[32], resv[32], peak[32], frag[32];
    char cats[256] = "", devfree[96] = "";
    size_t in_use = 0, len = 0;
    for (int c = 0; c < EM_MEM_CACHED; c++) {
        if (!a->st.current[c])
            continue;
        in_use += a->st.current[c];
        int w = snprintf(cats + len, sizeof cats - len, "%s%s %s", len ? ", " : "",
                         g_cat_names[c], size_str(a->st.current[c], part, sizeof part));
        if (w > 0)
            len = EM_MIN(len + (size_t)w, sizeof cats - 1);
    }
    size_t fragmented = a->st.reserved > in_use ? a->st.reserved - in_use : 0;
    em_device_props p = {.struct_size = sizeof p};
    if (a->ops->properties && a->ops->properties(a->dev.index, &p) == EM_OK && p.total_memory) {
        char f[32], t[32];
        snprintf(devfree, sizeof devfree, "; the device reports %s free of %s",
                 size_str(p.free_memory, f, sizeof f), size_str(p.total_memory, t, sizeof t));
    }
    return em_set_error(EM_ERR_NOMEM,
                        "out of memory on %s: tried to allocate %s (%zu bytes); %s in use (%s), "
                        "%s cached (returned to the device before retrying); %s reserved from "
                        "the device (peak %s), of which %s is fragmented (cached, but not "
                        "returnable or too small)%s. Free memory with em_empty_cache() (cached "
                        "blocks) or by releasing tensors, or use a smaller batch",
                        em_device_str(a->dev, dev, sizeof dev), size_str(size, req, sizeof req),
                        size, size_str(in_use, used, sizeof used), len ? cats : "nothing",
                        size_str(cached_before, cached, sizeof cached),
                        size_str(a->st.reserved, resv, sizeof resv),
                        size_str(a->st.peak_reserved, peak, sizeof peak),
                        size_str(fragmented, frag, sizeof frag), devfree);
}

/* Ask the device for `size` bytes; on EM_ERR_NOMEM empty the cache (every stream's, after
 * waiting for the events of the blocks that wait) and retry once. Called with the lock
 * held. */
static em_status device_alloc(em__allocator *a, size_t size, void **ptr) {
    em_status st = a->ops->alloc(a->dev.index, size, ptr);
    if (st == EM_OK && !*ptr)
        st = EM_ERR_NOMEM;
    if (st == EM_ERR_NOMEM) {
        size_t cached_before = a->st.current[EM_MEM_CACHED];
        empty_cache_locked(a);
        *ptr = NULL;
        st = a->ops->alloc(a->dev.index, size, ptr);
        if (st == EM_OK && !*ptr)
            st = EM_ERR_NOMEM;
        if (st == EM_ERR_NOMEM && a->capturing) {
            char dev[32], req[32];
            return em_set_error(EM_ERR_NOMEM, "out of memory on %s during graph capture: tried "
                                "to allocate %s (%zu bytes); the cache cannot be handed back "
                                "to the device while a stream records a graph. Capture with "
                                "a smaller batch, or call em_empty_cache() before the capture",
                                em_device_str(a->dev, dev, sizeof dev),
                                size_str(size, req, sizeof req), size);
        }
        if (st == EM_ERR_NOMEM)
            return oom_error(a, size, cached_before);
    }
    if (st != EM_OK && em_last_status() != st) {
        char dev[32];
        em_set_error(st, "allocating %zu bytes on %s failed: %s", size,
                     em_device_str(a->dev, dev, sizeof dev), em_status_str(st));
    }
    if (st == EM_OK)
        a->st.device_allocs++;
    return st;
}

em_status em__allocator_alloc(em__allocator *a, size_t nbytes, em_mem_category cat,
                              em__block **out) {
    *out = NULL;
    if ((int)cat < 0 || cat >= EM_MEM_CACHED)
        return em_set_error(EM_ERR_INVALID, "device allocation: %d is not a memory category "
                            "a block can be allocated in", (int)cat);
    size_t size = round_size(nbytes);
    if (!size) {
        char dev[32];
        return em_set_error(EM_ERR_NOMEM, "out of memory on %s: tried to allocate %zu bytes",
                            em_device_str(a->dev, dev, sizeof dev), nbytes);
    }
    pthread_mutex_lock(&a->lock);
    em__pool *p = &a->def;
    /* The one test the CPU (no streams) pays: a device with streams serves each allocation
     * from the cache of the calling thread's current stream on it. */
    if (a->streams) {
        em_status st = pool_of(a, em_stream_current(a->dev), &p);
        if (st != EM_OK) {
            pthread_mutex_unlock(&a->lock);
            return st;
        }
    }
    em__block *b = pool_take(p, size);
    if (b) {
        stat_sub(a, EM_MEM_CACHED, b->size);
        a->st.cache_hits++;
    } else {
        /* The bookkeeping first: if it fails nothing has been taken from the device. */
        b = em__malloc(sizeof *b, "a device block record");
        void *ptr = NULL;
        em_status st = b ? device_alloc(a, size, &ptr) : EM_ERR_NOMEM;
        if (st != EM_OK) {
            em__free(b);
            pthread_mutex_unlock(&a->lock);
            return st;
        }
        *b = (em__block){.ptr = ptr, .size = size, .pool = p};
        p->refs++;
        reserve_add(a, size);
    }
    b->cat = cat;
    stat_add(a, cat, b->size);
    pthread_mutex_unlock(&a->lock);
    *out = b;
    return EM_OK;
}

void em__allocator_release(em__allocator *a, em__block *b) {
    if (!b)
        return;
    pthread_mutex_lock(&a->lock);
    stat_sub(a, b->cat, b->size);
    stat_add(a, EM_MEM_CACHED, b->size); /* cached from now, whether it waits or not */
    if (b->uses)
        block_defer(a, b);
    else
        pool_put(b->pool, b);
    pthread_mutex_unlock(&a->lock);
}

em_status em__allocator_record_stream(em__allocator *a, em__block *b, em_stream *s) {
    if (!a->streams)
        return EM_OK; /* every stream is the default one */
    pthread_mutex_lock(&a->lock);
    em__uses *u = b->uses;
    bool known = !b->pool->dead && b->pool->stream == s; /* its own stream */
    for (size_t i = 0; u && i < u->n && !known; i++)
        known = u->u[i].s == s;
    if (!known && (!u || u->n == u->cap)) {
        size_t cap = u ? 2 * u->cap : 2;
        em__uses *nu = em__malloc(sizeof *nu + cap * sizeof nu->u[0], "a block's stream record");
        if (!nu) {
            pthread_mutex_unlock(&a->lock);
            return EM_ERR_NOMEM;
        }
        *nu = (em__uses){.block = b, .cap = cap};
        if (u) {
            nu->n = u->n;
            memcpy(nu->u, u->u, u->n * sizeof u->u[0]);
            uses_unlink(a, u);
            em__free(u);
        }
        uses_link(a, nu);
        b->uses = u = nu;
    }
    if (!known)
        u->u[u->n++].s = s;
    pthread_mutex_unlock(&a->lock);
    return EM_OK;
}

void em__allocator_stream_gone(em__allocator *a, em_stream *s) {
    if (!s)
        return;
    pthread_mutex_lock(&a->lock);
    for (size_t i = 0; i < a->npools; i++) {
        em__pool *p = a->pools[i];
        if (!p->dead && !p->graph && p->stream == s) {
            p->dead = true;
            p->stream = NULL;
            pool_sweep(a, p);
        }
    }
    for (em__uses *u = a->recorded, *next; u; u = next) {
        next = u->next;
        for (size_t i = 0; i < u->n;)
            if (u->u[i].s == s)
                u->u[i] = u->u[--u->n];
            else
                i++;
        if (!u->n) {
            uses_unlink(a, u);
            u->block->uses = NULL;
            em__free(u);
        }
    }
    pthread_mutex_unlock(&a->lock);
}

em_status em__allocator_capture_begin(em__allocator *a, em_stream *s, em__pool **out) {
    *out = NULL;
    if (!a->streams || !s)
        return em_set_error(EM_ERR_INVALID, "graph capture needs a stream other than the "
                            "default one");
    pthread_mutex_lock(&a->lock);
    em__pool *p = NULL;
    for (size_t i = 0; i < a->npools && !p; i++)
        if (a->pools[i]->dead && !a->pools[i]->refs && !a->pools[i]->ncached)
            p = a->pools[i];
    if (!p) {
        p = em__calloc(1, sizeof *p, "a graph's block cache");
        em__pool **v = p ? em__realloc(a->pools, a->npools * sizeof *v,
                                       (a->npools + 1) * sizeof *v, "the stream caches") : NULL;
        if (!v) {
            em__free(p);
            pthread_mutex_unlock(&a->lock);
            return EM_ERR_NOMEM;
        }
        v[a->npools++] = p;
        a->pools = v;
    }
    p->dead = false;
    p->graph = p->capturing = true;
    p->stream = s;
    a->capturing++;
    pthread_mutex_unlock(&a->lock);
    *out = p;
    return EM_OK;
}

void em__allocator_capture_end(em__allocator *a, em__pool *p) {
    pthread_mutex_lock(&a->lock);
    if (p->capturing) {
        p->capturing = false;
        a->capturing--;
    }
    pthread_mutex_unlock(&a->lock);
}

void em__allocator_graph_gone(em__allocator *a, em__pool *p) {
    pthread_mutex_lock(&a->lock);
    if (p->capturing) {
        p->capturing = false;
        a->capturing--;
    }
    p->dead = true;
    p->graph = false;
    p->stream = NULL;
    pool_sweep(a, p);
    pthread_mutex_unlock(&a->lock);
}

void em__allocator_set_category(em__allocator *a, em__block *b, em_mem_category cat) {
    if (!b || (int)cat < 0 || cat >= EM_MEM_CACHED)
        return;
    pthread_mutex_lock(&a->lock);
    stat_sub(a, b->cat, b->size);
    b->cat = cat;
    stat_add(a, cat, b->size);
    pthread_mutex_unlock(&a->lock);
}

void em__allocator_stats(em__allocator *a, em_memory_stats *out) {
    pthread_mutex_lock(&a->lock);
    *out = a->st;
    pthread_mutex_unlock(&a->lock);
}

void em__allocator_reset_peak(em__allocator *a) {
    pthread_mutex_lock(&a->lock);
    memcpy(a->st.peak, a->st.current, sizeof a->st.peak);
    a->st.peak_reserved = a->st.reserved;
    pthread_mutex_unlock(&a->lock);
}

void em__allocator_empty_cache(em__allocator *a) {
    pthread_mutex_lock(&a->lock);
    empty_cache_locked(a);
    pthread_mutex_unlock(&a->lock);
}

/* ---- public memory functions ---------------------------------------------------------------- */

em_status em_memory_stats_get(em_device dev, em_memory_stats *out /* out */) {
    if (!out)
        return em_set_error(EM_ERR_INVALID, "em_memory_stats_get: `out` is NULL");
    memset(out, 0, sizeof *out);
    em_status st = em__device_check(dev, "em_memory_stats_get");
    if (st != EM_OK)
        return st;
    /* Read the slot directly: asking for stats must not create an allocator. */
    em__device_type *t = &em__device_types[dev.type];
    pthread_mutex_lock(&t->lock);
    if (t->alloc[dev.index])
        em__allocator_stats(t->alloc[dev.index], out);
    pthread_mutex_unlock(&t->lock);
    return EM_OK;
}

/* Call fn on every allocator of every registered device type, under the type's lock. */
static void for_each_allocator(void (*fn)(em__allocator *a, void *user), void *user) {
    for (int i = 0; i < EM_MAX_DEVICE_TYPES; i++) {
        em__device_type *t = &em__device_types[i];
        if (!t->used)
            continue;
        pthread_mutex_lock(&t->lock);
        for (size_t k = 0; k < EM_ARRAY_LEN(t->alloc); k++)
            if (t->alloc[k])
                fn(t->alloc[k], user);
        pthread_mutex_unlock(&t->lock);
    }
}

static void summary_one(em__allocator *a, void *user) {
    FILE *f = user;
    em_memory_stats s;
    char dev[32], cur[32], peak[32];
    em__allocator_stats(a, &s);
    fprintf(f, "%s: memory by category\n", em_device_str(a->dev, dev, sizeof dev));
    fprintf(f, "  %-12s %12s %12s %8s\n", "category", "current", "peak", "blocks");
    for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++)
        fprintf(f, "  %-12s %12s %12s %8zu\n", g_cat_names[c],
                size_str(s.current[c], cur, sizeof cur), size_str(s.peak[c], peak, sizeof peak),
                s.count[c]);
    fprintf(f, "  reserved %s (peak %s); %" PRIu64 " device allocations, %" PRIu64
               " cache hits\n",
            size_str(s.reserved, cur, sizeof cur), size_str(s.peak_reserved, peak, sizeof peak),
            s.device_allocs, s.cache_hits);
}

void em_memory_summary(FILE *f) {
    if (f)
        for_each_allocator(summary_one, f);
}

static void reset_peak_one(em__allocator *a, void *user) {
    (void)user;
    em__allocator_reset_peak(a);
}

void em_memory_reset_peak(void) {
    for_each_allocator(reset_peak_one, NULL);
}

static void empty_cache_one(em__allocator *a, void *user) {
    (void)user;
    em__allocator_empty_cache(a);
}

void em_empty_cache(void) {
    for_each_allocator(empty_cache_one, NULL);
    em__tensors_quarantine_flush_thread();
}
