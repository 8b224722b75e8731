/*
 * tensor.c — storage, tensor objects, creation, views and copies.
 *
 * A tensor is a small object (dtype, shape, strides, offset) over a reference-counted storage
 * (bytes on one device, a version counter, a memory category). Views are new tensor objects
 * over the same storage. Internal em__X functions return owned references; the public em_X
 * wrappers hand them to the thread's scope (scope.c).
 *
 * Live tensors and the quarantine. Every live tensor object is on the live list of the thread
 * that made it (that thread's heap), so that em_shutdown_checked can name the tensors a
 * program still holds. A freed object is poisoned (its magic says so; shape and dtype stay
 * for the message) and waits in its heap's ring of the last QUARANTINE freed objects before
 * it goes back to the host allocator, so that releasing it again — a stale pointer, most
 * often a tensor its scope already dropped — is caught and explained instead of corrupting
 * the heap. A tensor made and freed on the same thread touches only that thread's heap: no
 * lock and no atomic beyond the two counts that were there before. One freed on another
 * thread is pushed onto its maker's lock-free remote stack, which the maker drains the next
 * time it makes a tensor (em_shutdown_checked drains every heap). Heaps outlive threads: an
 * exiting thread leaves its heap in a pool for the next new thread.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "internal.h"
#include "observe.h"

static atomic_llong live_tensors;
atomic_llong em__live_objects[EM__LIVE_N];

int64_t em__live_tensors(void) { return atomic_load(&live_tensors); }

int64_t em__numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

void em__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}

bool em__is_contiguous(int ndim, const int64_t *shape, const int64_t *strides) {
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] == 0) return true;
        if (shape[i] == 1) continue;
        if (strides[i] != expect) return false;
        expect *= shape[i];
    }
    return true;
}

int em__expanded_dim(const em_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->strides[d] == 0 && t->shape[d] > 1) return d;
    return -1;
}

bool em__is_transposed_dense(const em_tensor *t) {
    int n = t->ndim;
    if (n < 2 || t->shape[n - 1] < 2 || t->shape[n - 2] < 2) return false;
    int64_t shape[EM_MAX_DIMS], strides[EM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)n);
    memcpy(strides, t->strides, sizeof(int64_t) * (size_t)n);
    shape[n - 1] = t->shape[n - 2], shape[n - 2] = t->shape[n - 1];
    strides[n - 1] = t->strides[n - 2], strides[n - 2] = t->strides[n - 1];
    return em__is_contiguous(n, shape, strides);
}

int em__wrap_dim(int dim, int ndim, const char *who) {
    int lo = ndim > 0 ? -ndim : -1, hi = ndim > 0 ? ndim - 1 : 0;
    if (dim < lo || dim > hi) {
        em_set_error(EM_ERR_RANGE, "%s: dim %d is out of range for a tensor with %d dim%s "
                     "(expected %d..%d)", who, dim, ndim, ndim == 1 ? "" : "s", lo, hi);
        return -1;
    }
    return dim < 0 ? dim + (ndim > 0 ? ndim : 1) : dim;
}

const char *em__shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "[");
    for (int i = 0; i < ndim; i++)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%lld", i ? ", " : "",
                              (long long)shape[i]);
    snprintf(buf + n, n < cap ? cap - n : 0, "]");
    return buf;
}

const char *em_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    return em__shape_str(ndim, shape, buf, cap);
}

/* ---- storage ------------------------------------------------------------------------------ */

static void storage_release(em__storage *s) {
    if (!s || atomic_fetch_sub(&s->refcount, 1) != 1) return;
    if (s->block) {
        em__allocator *a = em__device_allocator_existing(s->device);
        if (a) em__allocator_release(a, s->block);
    } else if (s->release) {
        s->release(s->data, s->release_user);
    }
    em__free(s);
}

static em__storage *storage_new(size_t nbytes, em_device dev, em_mem_category cat) {
    em__allocator *a = em__device_allocator(dev);
    if (!a) return NULL;
    em__storage *s = em__calloc(1, sizeof *s, "tensor storage");
    if (!s) return NULL;
    if (em__allocator_alloc(a, nbytes, cat, &s->block) != EM_OK) {
        em__free(s);
        return NULL;
    }
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->data = s->block->ptr;
    s->nbytes = nbytes;
    s->device = dev;
    return s;
}

/* ---- live lists and the quarantine (see the top of the file) ---------------------------------- */

#define QUARANTINE 1024

struct em__theap {
    em_tensor *live;                /* this heap's live tensors, newest first */
    _Atomic(em_tensor *) remote;    /* freed by other threads, still on `live` */
    em_tensor *ring[QUARANTINE];    /* freed, poisoned, not yet returned to the allocator */
    unsigned head;                  /* next ring slot (mod QUARANTINE) */
    em__theap *next_all, *next_free;
};

/* Heaps come from libc's calloc, not the host allocator: they outlive em_shutdown (threads keep
 * them across init cycles), and the host allocator may be replaced between cycles. */
static pthread_mutex_t heaps_lock = PTHREAD_MUTEX_INITIALIZER;
static em__theap *heaps_all, *heaps_free;
static pthread_once_t heap_once = PTHREAD_ONCE_INIT;
static pthread_key_t heap_key;
static bool heap_key_ok;
static __thread em__theap *my_heap __attribute__((tls_model("initial-exec")));

static void heap_link(em__theap *h, em_tensor *t) {
    t->heap = h;
    t->live_prev = NULL;
    t->live_next = h->live;
    if (h->live) h->live->live_prev = t;
    h->live = t;
}

static void heap_unlink(em__theap *h, em_tensor *t) {
    if (t->live_prev) t->live_prev->live_next = t->live_next;
    else h->live = t->live_next;
    if (t->live_next) t->live_next->live_prev = t->live_prev;
}

/* Park the freed t in h's ring; the object it displaces goes back to the allocator. */
static void quarantine(em__theap *h, em_tensor *t) {
    em_tensor **slot = &h->ring[h->head++ % QUARANTINE];
    em_tensor *old = *slot;
    *slot = t;
    if (old) em__free(old);
}

/* Unlink and quarantine what other threads freed. Only h's thread (or shutdown) calls it. */
static void heap_drain(em__theap *h) {
    em_tensor *t = atomic_exchange_explicit(&h->remote, NULL, memory_order_acquire);
    while (t) {
        em_tensor *next = t->remote_next;
        heap_unlink(h, t);
        quarantine(h, t);
        t = next;
    }
}

static void heap_thread_exit(void *p) {
    em__theap *h = p;
    heap_drain(h);
    my_heap = NULL;
    pthread_mutex_lock(&heaps_lock);
    h->next_free = heaps_free;
    heaps_free = h;
    pthread_mutex_unlock(&heaps_lock);
}

static void heap_key_init(void) { heap_key_ok = pthread_key_create(&heap_key, heap_thread_exit) == 0; }

/* The calling thread's heap, taken from the pool or made on its first tensor. */
static em__theap *heap_acquire(void) {
    pthread_once(&heap_once, heap_key_init);
    pthread_mutex_lock(&heaps_lock);
    em__theap *h = heaps_free;
    if (h) {
        heaps_free = h->next_free;
    } else if ((h = calloc(1, sizeof *h))) {
        h->next_all = heaps_all;
        heaps_all = h;
    }
    pthread_mutex_unlock(&heaps_lock);
    if (!h) {
        em_set_error(EM_ERR_NOMEM, "out of memory allocating a thread's tensor list (%zu bytes)",
                     sizeof *h);
        return NULL;
    }
    if (heap_key_ok) pthread_setspecific(heap_key, h);
    my_heap = h;
    return h;
}

const char *em__tensor_brief(const em_tensor *t, char *buf, size_t cap) {
    char shape[160];
    snprintf(buf, cap, "%s %s", em__shape_str(t->ndim, t->shape, shape, sizeof shape),
             em_dtype_is_valid(t->dtype) ? em_dtype_name(t->dtype) : "(bad dtype)");
    return buf;
}

int64_t em__tensors_describe_live(char *buf, size_t cap, int few) {
    size_t n = 0;
    int shown = 0;
    if (cap) buf[0] = '\0';
    pthread_mutex_lock(&heaps_lock);
    for (em__theap *h = heaps_all; h; h = h->next_all) {
        heap_drain(h);
        for (const em_tensor *t = h->live; t && shown < few; t = t->live_next, shown++) {
            char b[200];
            n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", shown ? ", " : "",
                                  em__tensor_brief(t, b, sizeof b));
            if (t->site_file)
                n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0,
                                      " (from the scope opened at %s:%d)", t->site_file,
                                      t->site_line);
        }
    }
    pthread_mutex_unlock(&heaps_lock);
    return em__live_tensors();
}

static void heap_flush(em__theap *h) {
    heap_drain(h);
    for (int i = 0; i < QUARANTINE; i++) {
        em__free(h->ring[i]);
        h->ring[i] = NULL;
    }
    h->head = 0;
}

void em__tensors_quarantine_flush(void) {
    pthread_mutex_lock(&heaps_lock);
    for (em__theap *h = heaps_all; h; h = h->next_all) heap_flush(h);
    pthread_mutex_unlock(&heaps_lock);
}

void em__tensors_quarantine_flush_thread(void) {
    if (my_heap) heap_flush(my_heap);
}

/* ---- tensor objects --------------------------------------------------------------------------- */

static em_status check_shape(const char *who, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > EM_MAX_DIMS)
        return em_set_error(EM_ERR_SHAPE, "%s: %d dims requested; tensors have 0 to %d", who,
                            ndim, EM_MAX_DIMS);
    if (ndim > 0 && !shape) return em_set_error(EM_ERR_INVALID, "%s: NULL shape", who);
    int64_t span = 1; /* the product of the non-zero sizes: strides must fit in int64 */
    for (int i = 0; i < ndim; i++) {
        char buf[160];
        if (shape[i] < 0)
            return em_set_error(EM_ERR_SHAPE, "%s: negative size %lld in shape %s", who,
                                (long long)shape[i], em__shape_str(ndim, shape, buf, sizeof buf));
        if (shape[i] > 0 && __builtin_mul_overflow(span, shape[i], &span))
            return em_set_error(EM_ERR_SHAPE, "%s: shape %s has more than 2^63 elements", who,
                                em__shape_str(ndim, shape, buf, sizeof buf));
    }
    return EM_OK;
}

static em_tensor *tensor_object(em__storage *s, em_dtype dt, int ndim, const int64_t *shape,
                                const int64_t *strides, int64_t offset) {
    em__theap *h = my_heap;
    if (!h && !(h = heap_acquire())) return NULL;
    if (atomic_load_explicit(&h->remote, memory_order_relaxed)) heap_drain(h);
    em_tensor *t = em__malloc(sizeof *t, "tensor");
    if (!t) return NULL;
    t->magic = EM__TENSOR_LIVE;
    atomic_init(&t->refcount, 1);
    atomic_init(&t->scope_refs, 0);
    t->site_file = NULL;
    t->site_line = 0;
    heap_link(h, t);
    t->storage = s;
    t->dtype = dt;
    t->ndim = ndim;
    t->offset = offset;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->strides[i] = strides[i];
    }
    t->numel = em__numel(ndim, shape);
    t->requires_grad = t->retains_grad = t->is_view = t->inference = false;
    t->view_base_requires_grad = false;
    t->output_nr = 0;
    t->grad_fn = NULL;
    t->grad = NULL;
    t->hooks = NULL;
    t->post_hooks = NULL;
    t->post_run = 0;
    t->post_pending = 0;
    t->post_got = false;
    t->view_base = NULL;
    t->view_version = 0;
    atomic_fetch_add(&live_tensors, 1);
    return t;
}

em_tensor *em__tensor_new(int ndim, const int64_t *shape, em_dtype dt, em_device dev,
                          em_mem_category cat) {
    if (check_shape("empty", ndim, shape) != EM_OK) return NULL;
    if (!em_dtype_is_valid(dt)) {
        em_set_error(EM_ERR_DTYPE, "empty: invalid dtype %d", (int)dt);
        return NULL;
    }
    int64_t strides[EM_MAX_DIMS];
    em__contiguous_strides(ndim, shape, strides);
    int64_t numel = em__numel(ndim, shape);
    if (numel > (int64_t)(SIZE_MAX / 16)) {
        em_set_error(EM_ERR_NOMEM, "empty: %lld elements cannot be allocated", (long long)numel);
        return NULL;
    }
    em__storage *s = storage_new((size_t)numel * em__dtype_size(dt), dev, cat);
    if (!s) return NULL;
    em_tensor *t = tensor_object(s, dt, ndim, shape, strides, 0);
    if (!t) storage_release(s);
    return t;
}

em_tensor *em__tensor_view(const em_tensor *t, int ndim, const int64_t *shape,
                           const int64_t *strides, int64_t offset) {
    /* A view of a storage in a kernel-private layout reads it plain, except an alias with the
     * same geometry (detach, autograd's saved copies), which is the same tensor. */
    if (em__layout_of(t) && !(ndim == t->ndim && offset == t->offset &&
                              memcmp(shape, t->shape, sizeof *shape * (size_t)ndim) == 0 &&
                              memcmp(strides, t->strides, sizeof *strides * (size_t)ndim) == 0) &&
        em__to_plain(t) != EM_OK)
        return NULL;
    atomic_fetch_add(&t->storage->refcount, 1);
    em_tensor *v = tensor_object(t->storage, t->dtype, ndim, shape, strides, offset);
    if (!v) storage_release(t->storage);
    return v;
}

em_tensor *em_tensor_retain(em_tensor *t) {
    if (t) atomic_fetch_add(&t->refcount, 1);
    return t;
}

/* The last reference to t is gone: free what it holds, poison it and quarantine it. file:line
 * is the scope that dropped that reference (NULL for an explicit release). */
static void tensor_free(em_tensor *t, const char *file, int line) {
    em__autograd_tensor_free(t);
    storage_release(t->storage);
    atomic_fetch_sub(&live_tensors, 1);
    /* Poisoned: a stale em_tensor_release sees the magic, and a stale data access faults on
     * the NULL storage rather than reading recycled memory. Shape and dtype stay. */
    t->magic = EM__TENSOR_FREED;
    t->storage = NULL;
    t->grad = NULL;
    t->grad_fn = NULL;
    t->hooks = NULL;
    t->post_hooks = NULL;
    t->view_base = NULL;
    t->site_file = file;
    t->site_line = line;
    em__theap *h = t->heap;
    if (h == my_heap) {
        heap_unlink(h, t);
        quarantine(h, t);
        return;
    }
    em_tensor *top = atomic_load_explicit(&h->remote, memory_order_relaxed);
    do t->remote_next = top;
    while (!atomic_compare_exchange_weak_explicit(&h->remote, &top, t, memory_order_release,
                                                  memory_order_relaxed));
}

/* A release of a tensor that is already freed (still in the quarantine). */
static void release_freed(em_tensor *t, const char *who) {
    char b[200];
    if (t->magic != EM__TENSOR_FREED) {
        em_set_error(EM_ERR_STATE, "%s: %p is not a live tensor (freed long ago, or never a "
                     "tensor); ignored", who, (void *)t);
    } else if (t->site_file) {
        em_set_error(EM_ERR_STATE, "%s: tensor %s was already freed: the scope opened at %s:%d "
                     "dropped its last reference when it ended (em_keep a result to use it "
                     "after em_scope_end); ignored", who, em__tensor_brief(t, b, sizeof b),
                     t->site_file, t->site_line);
    } else {
        em_set_error(EM_ERR_STATE, "%s: tensor %s was already freed (its last reference was "
                     "released before); ignored", who, em__tensor_brief(t, b, sizeof b));
    }
    em_log_write(EM_LOG_ERROR, "%s", em_last_error());
}

/* Every reference to t belongs to open scopes, and the user releases one. */
static bool release_owned(em_tensor *t) {
    const char *file = NULL;
    int line = 0;
    char b[200];
    bool mine = em__scope_disown(t, &file, &line);
    if (mine)
        em_set_error(EM_ERR_STATE, "em_tensor_release: tensor %s is owned by the scope opened at "
                     "%s:%d (em_keep it, or em_tensor_retain a reference of your own, before "
                     "releasing it); released now, and that scope will not drop it",
                     em__tensor_brief(t, b, sizeof b), file ? file : "?", line);
    else
        em_set_error(EM_ERR_STATE, "em_tensor_release: tensor %s is owned by a scope of another "
                     "thread (opened at %s:%d); not released: that scope drops it when it ends",
                     em__tensor_brief(t, b, sizeof b), t->site_file ? t->site_file : "?",
                     t->site_line);
    em_log_write(EM_LOG_ERROR, "%s", em_last_error());
    return mine;
}

void em_tensor_release(em_tensor *t) {
    if (!t) return;
    if (__builtin_expect(t->magic != EM__TENSOR_LIVE, 0)) {
        release_freed(t, "em_tensor_release");
        return;
    }
    int owned = atomic_load_explicit(&t->scope_refs, memory_order_relaxed);
    if (__builtin_expect(owned > 0, 0) &&
        atomic_load_explicit(&t->refcount, memory_order_relaxed) <= owned && !release_owned(t))
        return;
    if (atomic_fetch_sub(&t->refcount, 1) != 1) return;
    tensor_free(t, NULL, 0);
}

void em__tensor_release_scoped(em_tensor *t, const char *file, int line) {
    if (t->magic != EM__TENSOR_LIVE) {
        release_freed(t, "em_scope_end");
        return;
    }
    atomic_fetch_sub_explicit(&t->scope_refs, 1, memory_order_relaxed);
    if (atomic_fetch_sub(&t->refcount, 1) != 1) return;
    tensor_free(t, file, line);
}

/* ---- creation ------------------------------------------------------------------------------ */

em_tensor *em__empty(int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
    return em__tensor_new(ndim, shape, dt, dev, EM_MEM_ACTIVATION);
}

em_tensor *em__full(int ndim, const int64_t *shape, double value, em_dtype dt, em_device dev) {
    em_tensor *t = em__empty(ndim, shape, dt, dev);
    if (t && em_fill_(t, value) != EM_OK) {
        em_tensor_release(t);
        return NULL;
    }
    return t;
}

em_tensor *em_empty(int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
    return em__scope_track(em__empty(ndim, shape, dt, dev));
}
em_tensor *em_full(int ndim, const int64_t *shape, double value, em_dtype dt, em_device dev) {
    return em__scope_track(em__full(ndim, shape, value, dt, dev));
}
em_tensor *em_zeros(int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
    return em_full(ndim, shape, 0.0, dt, dev);
}
em_tensor *em_ones(int ndim, const int64_t *shape, em_dtype dt, em_device dev) {
    return em_full(ndim, shape, 1.0, dt, dev);
}
em_tensor *em_scalar(double value, em_dtype dt) { return em_full(0, NULL, value, dt, em_cpu()); }

em_tensor *em_empty_like(const em_tensor *t) {
    if (!em__check_inputs("empty_like", &t, 1)) return NULL;
    return em_empty(t->ndim, t->shape, t->dtype, t->storage->device);
}
em_tensor *em_zeros_like(const em_tensor *t) {
    if (!em__check_inputs("zeros_like", &t, 1)) return NULL;
    return em_zeros(t->ndim, t->shape, t->dtype, t->storage->device);
}

em_tensor *em_from_data(const void *data, int ndim, const int64_t *shape, em_dtype dt,
                        em_device dev) {
    if (!data) {
        em_set_error(EM_ERR_INVALID, "from_data: NULL data");
        return NULL;
    }
    em_tensor *t = em__empty(ndim, shape, dt, dev);
    if (!t) return NULL;
    if (em__device_copy(dev, em_tensor_data(t), em_cpu(), data, em_tensor_nbytes(t)) != EM_OK) {
        em_tensor_release(t);
        return NULL;
    }
    return em__scope_track(t);
}

em_tensor *em_tensor_wrap(void *data, int ndim, const int64_t *shape, const int64_t *strides,
                          em_dtype dt, em_device dev, em_release_fn release, void *user) {
    if (check_shape("tensor_wrap", ndim, shape) != EM_OK) return NULL;
    if (!em_dtype_is_valid(dt)) {
        em_set_error(EM_ERR_DTYPE, "tensor_wrap: invalid dtype %d", (int)dt);
        return NULL;
    }
    if (!data && em__numel(ndim, shape) > 0) {
        em_set_error(EM_ERR_INVALID, "tensor_wrap: NULL data for a non-empty tensor");
        return NULL;
    }
    if (em__device_check(dev, "tensor_wrap") != EM_OK) return NULL;
    if ((uintptr_t)data % em_dtype_size(dt) != 0) {
        em_set_error(EM_ERR_INVALID, "tensor_wrap: data %p is not aligned to the %zu bytes of "
                     "a %s element", data, em_dtype_size(dt), em_dtype_name(dt));
        return NULL;
    }
    int64_t st[EM_MAX_DIMS], span = 1;
    if (strides) {
        for (int i = 0; i < ndim; i++) {
            if (strides[i] < 0) {
                em_set_error(EM_ERR_INVALID, "tensor_wrap: negative stride %lld in dim %d",
                             (long long)strides[i], i);
                return NULL;
            }
            st[i] = strides[i];
            if (shape[i] > 0) span += (shape[i] - 1) * strides[i];
        }
    } else {
        em__contiguous_strides(ndim, shape, st);
        span = em__numel(ndim, shape);
    }
    em__storage *s = em__calloc(1, sizeof *s, "tensor storage");
    if (!s) return NULL;
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->data = data;
    s->nbytes = (size_t)span * em_dtype_size(dt);
    s->device = dev;
    s->release = release;
    s->release_user = user;
    em_tensor *t = tensor_object(s, dt, ndim, shape, st, 0);
    if (!t) {
        em__free(s); /* the caller keeps its memory: release is not called on error */
        return NULL;
    }
    return em__scope_track(t);
}

/* ---- properties ---------------------------------------------------------------------------- */

em_dtype em_tensor_dtype(const em_tensor *t) { return t->dtype; }
em_device em_tensor_device(const em_tensor *t) { return t->storage->device; }
int em_tensor_ndim(const em_tensor *t) { return t->ndim; }
const int64_t *em_tensor_shape(const em_tensor *t) { return t->shape; }
const int64_t *em_tensor_strides(const em_tensor *t) { return t->strides; }
int64_t em_tensor_offset(const em_tensor *t) { return t->offset; }
int64_t em_tensor_numel(const em_tensor *t) { return t->numel; }
size_t em_tensor_nbytes(const em_tensor *t) { return (size_t)t->numel * em__dtype_size(t->dtype); }
bool em_tensor_is_contiguous(const em_tensor *t) {
    return em__is_contiguous(t->ndim, t->shape, t->strides);
}

/* Channels-last (docs/performance.md, design (b)): 4 dims (N, C, H, W), dense in the order
 * N, H, W, C (size-1 dims ignored, as em__is_contiguous does) and C's stride 1. A tensor
 * that is also C-contiguous with C > 1 (H = W = 1) is not: row-major wins the tie. C = 1
 * tensors are row-major unless C's stride says channels-last (what em__empty_channels_last
 * makes), so the layout of a one-channel activation is known. */
bool em__is_channels_last(int ndim, const int64_t *shape, const int64_t *strides) {
    if (ndim != 4 || strides[1] != 1) return false;
    const int64_t sh[4] = {shape[0], shape[2], shape[3], shape[1]},
                  st[4] = {strides[0], strides[2], strides[3], strides[1]};
    if (!em__is_contiguous(4, sh, st)) return false;
    return shape[1] == 1 || !em__is_contiguous(4, shape, strides);
}

bool em_tensor_is_channels_last(const em_tensor *t) {
    return t && em__is_channels_last(t->ndim, t->shape, t->strides);
}

em_tensor *em__empty_channels_last(const int64_t *shape, em_dtype dt, em_device dev) {
    em_tensor *t = em__empty(4, shape, dt, dev);
    if (!t) return NULL;
    const int64_t C = shape[1], W = shape[3], H = shape[2];
    t->strides[0] = H * W * C, t->strides[1] = 1, t->strides[2] = W * C, t->strides[3] = C;
    return t;
}
void *em__tensor_bytes(const em_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)em__dtype_size(t->dtype);
}
void *em_tensor_data(const em_tensor *t) {
    if (em__layout_of(t) && em__to_plain(t) != EM_OK) return NULL;
    return em__tensor_bytes(t);
}
uint64_t em_tensor_version(const em_tensor *t) { return atomic_load(&t->storage->version); }
void em_tensor_bump_version(em_tensor *t) {
    if (t) atomic_fetch_add(&t->storage->version, 1);
}
bool em_tensor_shares_storage(const em_tensor *a, const em_tensor *b) {
    return a && b && a->storage == b->storage;
}

int64_t em_tensor_size(const em_tensor *t, int dim) {
    if (dim < -t->ndim || dim >= t->ndim) return -1;
    return t->shape[dim < 0 ? dim + t->ndim : dim];
}
int64_t em_tensor_stride(const em_tensor *t, int dim) {
    if (dim < -t->ndim || dim >= t->ndim) return -1;
    return t->strides[dim < 0 ? dim + t->ndim : dim];
}

em_mem_category em_tensor_category(const em_tensor *t) {
    return t->storage->block ? t->storage->block->cat : EM_MEM_ACTIVATION;
}

em_status em_tensor_set_category(em_tensor *t, em_mem_category c) {
    if (!t) return em_set_error(EM_ERR_INVALID, "tensor_set_category: NULL tensor");
    if (c < 0 || c >= EM_MEM_CACHED)
        return em_set_error(EM_ERR_INVALID, "tensor_set_category: %d is not a category a "
                            "tensor can have", (int)c);
    if (!t->storage->block)
        return em_set_error(EM_ERR_STATE, "tensor_set_category: the tensor wraps memory the "
                            "caller owns; it is not counted by the allocator");
    /* The allocator that made the block exists: read it without a check that could fail on
     * the hot path (autograd sets the category of every .grad it creates). */
    em__allocator *a = em__device_allocator_existing(t->storage->device);
    if (!a) {
        char d[48];
        return em_set_error(EM_ERR_DEVICE, "tensor_set_category: the tensor's device %s has no "
                            "allocator any more", em_device_str(t->storage->device, d, sizeof d));
    }
    em__allocator_set_category(a, t->storage->block, c);
    return EM_OK;
}

em_status em_tensor_record_stream(em_tensor *t, em_stream *s) {
    if (!t) return em_set_error(EM_ERR_INVALID, "tensor_record_stream: NULL tensor");
    if (!t->storage->block)
        return em_set_error(EM_ERR_STATE, "tensor_record_stream: the tensor wraps memory the "
                            "caller owns; its lifetime is the caller's, not the allocator's");
    em__allocator *a = em__device_allocator_existing(t->storage->device);
    if (!a) {
        char d[48];
        return em_set_error(EM_ERR_DEVICE, "tensor_record_stream: the tensor's device %s has "
                            "no allocator any more",
                            em_device_str(t->storage->device, d, sizeof d));
    }
    return em__allocator_record_stream(a, t->storage->block, s);
}

/* ---- storage layouts (ember/tensor.h, em_layout) ------------------------------------------- */

static pthread_mutex_t layout_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local em_layout layout_pref;

em_layout em__layout_preferred(void) { return layout_pref; }
em_layout em_layout_prefer(em_layout l) {
    em_layout old = layout_pref;
    if ((unsigned)l < EM_LAYOUT_COUNT) layout_pref = l;
    return old;
}

bool em__layout_fits(int ndim, const int64_t *shape, em_device dev, em_layout l) {
    if (l != EM_LAYOUT_NCHW16C) return l == EM_LAYOUT_PLAIN;
    /* Converted by the core's loops below: host memory only. */
    return dev.type == EM_DEVICE_CPU_TYPE && ndim == 4 && shape[1] > 0 && shape[1] % 16 == 0 &&
           shape[0] > 0 && shape[2] > 0 && shape[3] > 0;
}

/* nChw16c <-> NCHW over one dense tensor of element size ES (no padding: C % 16 == 0). The
 * plain side is read or written along H*W, the blocked side 16 elements apart. */
#define DEF_REORDER(ES, T)                                                                     \
    static void reorder_##ES(const void *src, void *dst, const int64_t *sh, bool to_blocked) { \
        const int64_t N = sh[0], CB = sh[1] / 16, HW = sh[2] * sh[3];                           \
        const T *s = src;                                                                       \
        T *d = dst;                                                                             \
        for (int64_t n = 0; n < N; n++)                                                         \
            for (int64_t cb = 0; cb < CB; cb++) {                                               \
                const int64_t blk = (n * CB + cb) * HW * 16;                                    \
                for (int64_t c = 0; c < 16; c++) {                                              \
                    const int64_t pl = (n * CB * 16 + cb * 16 + c) * HW;                        \
                    if (to_blocked)                                                             \
                        for (int64_t i = 0; i < HW; i++) d[blk + i * 16 + c] = s[pl + i];       \
                    else                                                                        \
                        for (int64_t i = 0; i < HW; i++) d[pl + i] = s[blk + i * 16 + c];       \
                }                                                                               \
            }                                                                                   \
    }
DEF_REORDER(1, uint8_t)
DEF_REORDER(2, uint16_t)
DEF_REORDER(4, uint32_t)
DEF_REORDER(8, uint64_t)
#undef DEF_REORDER

/* Reorder t's storage in place (through scratch) between plain and l, under layout_lock. */
static em_status relayout(const em_tensor *t, em_layout to) {
    em__storage *s = t->storage;
    pthread_mutex_lock(&layout_lock);
    int from = atomic_load_explicit(&s->layout, memory_order_relaxed);
    em_status st = EM_OK;
    if (from != (int)to) {
        size_t es = em__dtype_size(t->dtype), n = (size_t)t->numel * es;
        void *tmp = em__malloc(n, "layout conversion");
        if (!tmp) {
            st = em_last_status();
        } else {
            void *data = (char *)s->data + t->offset * (int64_t)es;
            bool to_blocked = to != EM_LAYOUT_PLAIN;
            switch (es) {
            case 1: reorder_1(data, tmp, t->shape, to_blocked); break;
            case 2: reorder_2(data, tmp, t->shape, to_blocked); break;
            case 4: reorder_4(data, tmp, t->shape, to_blocked); break;
            default: reorder_8(data, tmp, t->shape, to_blocked); break;
            }
            memcpy(data, tmp, n);
            em__free(tmp);
            atomic_store_explicit(&s->layout, (int)to, memory_order_release);
        }
    }
    pthread_mutex_unlock(&layout_lock);
    return st;
}

em_status em__to_plain(const em_tensor *t) {
    return em__layout_of(t) ? relayout(t, EM_LAYOUT_PLAIN) : EM_OK;
}

void em__set_layout(em_tensor *t, em_layout l) {
    atomic_store_explicit(&t->storage->layout, (int)l, memory_order_release);
}

em_layout em_tensor_layout(const em_tensor *t) {
    return t && t->magic == EM__TENSOR_LIVE ? (em_layout)em__layout_of(t) : EM_LAYOUT_PLAIN;
}

em_tensor *em__to_layout(const em_tensor *t, em_layout l) {
    if (!em__check_inputs("to_layout", &t, 1)) return NULL;
    if ((unsigned)l >= EM_LAYOUT_COUNT) {
        em_set_error(EM_ERR_INVALID, "to_layout: %d is not a layout", (int)l);
        return NULL;
    }
    if (em__layout_of(t) == (int)l) return em_tensor_retain((em_tensor *)t);
    if (l == EM_LAYOUT_PLAIN) /* the values as they are, in place */
        return em__to_plain(t) == EM_OK ? em_tensor_retain((em_tensor *)t) : NULL;
    if (!em__layout_fits(t->ndim, t->shape, t->storage->device, l)) {
        char b[160], d[48];
        em_set_error(t->storage->device.type != EM_DEVICE_CPU_TYPE ? EM_ERR_DEVICE : EM_ERR_SHAPE,
                     "to_layout: the nChw16c layout holds a CPU tensor of 4 dims (N, C, H, W) "
                     "with C a positive multiple of 16; got %s on %s",
                     em__shape_str(t->ndim, t->shape, b, sizeof b),
                     em_device_str(t->storage->device, d, sizeof d));
        return NULL;
    }
    /* A fresh contiguous copy (recorded by autograd as a clone), then reordered in place: no
     * one else holds its storage yet. */
    em_tensor *c = em__clone(t);
    if (c && relayout(c, l) != EM_OK) {
        em_tensor_release(c);
        return NULL;
    }
    return c;
}
em_tensor *em_to_layout(const em_tensor *t, em_layout l) {
    return em__scope_track(em__to_layout(t, l));
}

void em__ktensor_fill(em_ktensor *k, const em_tensor *t) {
    k->data = em__tensor_bytes(t);
    k->dtype = t->dtype;
    k->ndim = t->ndim;
    k->numel = t->numel;
    for (int i = 0; i < t->ndim; i++) { /* a few dims: a loop, not two memcpy calls */
        k->shape[i] = t->shape[i];
        k->strides[i] = t->strides[i];
    }
    k->contiguous = em__is_contiguous(t->ndim, t->shape, t->strides);
}

uint64_t em__storage_id(const em_tensor *t) {
    /* The id is taken lazily (storages are calloc'ed: 0 means none yet) from this thread's
     * block of a counter that never repeats: no locked instruction per new storage. Threads
     * meeting a new storage at once may each store one: its id then changes, which makes a
     * kernel miss what it kept, never find another storage's. */
    static atomic_uint_fast64_t next_block = 1;
    static _Thread_local uint_fast64_t id_next, id_end;
    uint_fast64_t id = atomic_load_explicit(&t->storage->id, memory_order_relaxed);
    if (!id) {
        if (id_next == id_end) {
            id_next = atomic_fetch_add_explicit(&next_block, 1u << 16, memory_order_relaxed);
            id_end = id_next + (1u << 16);
        }
        id = id_next++;
        atomic_store_explicit(&t->storage->id, id, memory_order_relaxed);
    }
    return id;
}

/* ---- views ---------------------------------------------------------------------------------- */

/* Infer a -1 entry and check the element count. Writes the resolved shape to out. */
static em_status resolve_shape(const char *who, const em_tensor *t, int ndim,
                               const int64_t *shape, int64_t *out) {
    if (ndim < 0 || ndim > EM_MAX_DIMS || (ndim > 0 && !shape))
        return em_set_error(EM_ERR_SHAPE, "%s: %d dims requested; tensors have 0 to %d", who,
                            ndim, EM_MAX_DIMS);
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == -1) {
            if (infer >= 0)
                return em_set_error(EM_ERR_SHAPE, "%s: only one dim can be -1", who);
            infer = i;
        } else if (shape[i] < 0) {
            return em_set_error(EM_ERR_SHAPE, "%s: invalid size %lld in dim %d", who,
                                (long long)shape[i], i);
        } else {
            known *= shape[i];
        }
        out[i] = shape[i];
    }
    char a[160], b[160];
    if (infer >= 0) {
        if (known == 0 || t->numel % known != 0)
            return em_set_error(EM_ERR_SHAPE, "%s: shape %s is invalid for input of size %lld",
                                who, em__shape_str(ndim, shape, a, sizeof a),
                                (long long)t->numel);
        out[infer] = t->numel / known;
    } else if (known != t->numel) {
        return em_set_error(EM_ERR_SHAPE, "%s: shape %s is invalid for input of shape %s "
                            "(%lld elements)", who, em__shape_str(ndim, shape, a, sizeof a),
                            em__shape_str(t->ndim, t->shape, b, sizeof b), (long long)t->numel);
    }
    return EM_OK;
}

/* Strides for viewing (shape, strides) as new_shape without a copy, or false when the layout
 * cannot express it (ATen's computeStride). */
static bool view_strides(int ndim, const int64_t *shape, const int64_t *strides, int new_ndim,
                         const int64_t *new_shape, int64_t *new_strides) {
    if (ndim == 0 || em__numel(ndim, shape) == 0) {
        em__contiguous_strides(new_ndim, new_shape, new_strides);
        return true;
    }
    int view_d = new_ndim - 1;
    int64_t chunk_base = strides[ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        tensor_numel *= shape[d];
        if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base)) {
            while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
                new_strides[view_d] = view_numel * chunk_base;
                view_numel *= new_shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (d > 0) {
                chunk_base = strides[d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

static em_tensor *view_impl(const em_tensor *t, int ndim, const int64_t *shape) {
    if (!em__check_inputs("view", &t, 1)) return NULL;
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    if (resolve_shape("view", t, ndim, shape, ns) != EM_OK) return NULL;
    if (!view_strides(t->ndim, t->shape, t->strides, ndim, ns, nst)) {
        char a[160], b[160], c[160];
        em_set_error(EM_ERR_SHAPE, "view: shape %s with strides %s is not compatible with a "
                     "view of size %s (at least one dim spans across two contiguous "
                     "subspaces); use em_reshape(), which copies when it must",
                     em__shape_str(t->ndim, t->shape, a, sizeof a),
                     em__shape_str(t->ndim, t->strides, b, sizeof b),
                     em__shape_str(ndim, ns, c, sizeof c));
        return NULL;
    }
    return em__autograd_view(em__tensor_view(t, ndim, ns, nst, t->offset), t, &(em__view_info){.kind = EM__VIEW_RESHAPE});
}

static em_tensor *reshape_impl(const em_tensor *t, int ndim, const int64_t *shape) {
    if (!em__check_inputs("reshape", &t, 1)) return NULL;
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    if (resolve_shape("reshape", t, ndim, shape, ns) != EM_OK) return NULL;
    if (view_strides(t->ndim, t->shape, t->strides, ndim, ns, nst))
        return em__autograd_view(em__tensor_view(t, ndim, ns, nst, t->offset), t, &(em__view_info){.kind = EM__VIEW_RESHAPE});
    em_tensor *c = em__clone(t);
    if (!c) return NULL;
    em_tensor *v = em__view(c, ndim, ns);
    em_tensor_release(c);
    return v;
}

static em_tensor *permute_impl(const em_tensor *t, int ndim, const int *dims) {
    if (!em__check_inputs("permute", &t, 1)) return NULL;
    if (ndim != t->ndim || (ndim > 0 && !dims)) {
        em_set_error(EM_ERR_SHAPE, "permute: %d dims given for a tensor with %d", ndim, t->ndim);
        return NULL;
    }
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    bool seen[EM_MAX_DIMS] = {false};
    em__view_info info = {.kind = EM__VIEW_PERMUTE};
    for (int i = 0; i < ndim; i++) {
        int d = em__wrap_dim(dims[i], ndim, "permute");
        if (d < 0) return NULL;
        if (seen[d]) {
            em_set_error(EM_ERR_INVALID, "permute: dim %d appears twice", d);
            return NULL;
        }
        seen[d] = true;
        ns[i] = t->shape[d];
        nst[i] = t->strides[d];
        info.perm[i] = d;
    }
    return em__autograd_view(em__tensor_view(t, ndim, ns, nst, t->offset), t, &info);
}

static em_tensor *transpose_impl(const em_tensor *t, int dim0, int dim1) {
    if (!em__check_inputs("transpose", &t, 1)) return NULL;
    int a = em__wrap_dim(dim0, t->ndim, "transpose"), b = a < 0 ? -1 : em__wrap_dim(dim1, t->ndim, "transpose");
    if (a < 0 || b < 0) return NULL;
    if (t->ndim == 0)
        return em__autograd_view(em__tensor_view(t, 0, t->shape, t->strides, t->offset), t, &(em__view_info){.kind = EM__VIEW_RESHAPE});
    int dims[EM_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) dims[i] = i;
    dims[a] = b;
    dims[b] = a;
    return em__permute(t, t->ndim, dims);
}

static em_tensor *narrow_impl(const em_tensor *t, int dim, int64_t start, int64_t length) {
    if (!em__check_inputs("narrow", &t, 1)) return NULL;
    if (t->ndim == 0) {
        em_set_error(EM_ERR_SHAPE, "narrow: cannot narrow a 0-dim tensor");
        return NULL;
    }
    int d = em__wrap_dim(dim, t->ndim, "narrow");
    if (d < 0) return NULL;
    int64_t size = t->shape[d];
    if (start < 0) start += size;
    if (start < 0 || length < 0 || start > size || start + length > size) {
        em_set_error(EM_ERR_RANGE, "narrow: start %lld and length %lld are out of range for "
                     "dim %d of size %lld", (long long)start, (long long)length, d,
                     (long long)size);
        return NULL;
    }
    int64_t ns[EM_MAX_DIMS];
    memcpy(ns, t->shape, sizeof ns);
    ns[d] = length;
    em__view_info info = {.kind = EM__VIEW_NARROW, .dim = d, .start = start, .step = 1};
    return em__scope_track(em__autograd_view(
        em__tensor_view(t, t->ndim, ns, t->strides, t->offset + start * t->strides[d]), t, &info));
}

static em_tensor *slice_impl(const em_tensor *t, int dim, int64_t start, int64_t end,
                             int64_t step) {
    if (!em__check_inputs("slice", &t, 1)) return NULL;
    if (t->ndim == 0) {
        em_set_error(EM_ERR_SHAPE, "slice: cannot slice a 0-dim tensor");
        return NULL;
    }
    int d = em__wrap_dim(dim, t->ndim, "slice");
    if (d < 0) return NULL;
    if (step < 1) {
        em_set_error(EM_ERR_INVALID, "slice: step must be positive, got %lld", (long long)step);
        return NULL;
    }
    int64_t size = t->shape[d];
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = EM_MIN(EM_MAX(start, 0), size);
    end = EM_MIN(EM_MAX(end, start), size);
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    memcpy(ns, t->shape, sizeof ns);
    memcpy(nst, t->strides, sizeof nst);
    ns[d] = (end - start + step - 1) / step;
    nst[d] = t->strides[d] * step;
    em__view_info info = {.kind = EM__VIEW_NARROW, .dim = d, .start = start, .step = step};
    return em__scope_track(em__autograd_view(
        em__tensor_view(t, t->ndim, ns, nst, t->offset + start * t->strides[d]), t, &info));
}

static em_tensor *select_impl(const em_tensor *t, int dim, int64_t index) {
    if (!em__check_inputs("select", &t, 1)) return NULL;
    if (t->ndim == 0) {
        em_set_error(EM_ERR_SHAPE, "select: cannot select from a 0-dim tensor");
        return NULL;
    }
    int d = em__wrap_dim(dim, t->ndim, "select");
    if (d < 0) return NULL;
    int64_t size = t->shape[d];
    if (index < -size || index >= size) {
        em_set_error(EM_ERR_RANGE, "select: index %lld is out of range for dim %d of size %lld",
                     (long long)index, d, (long long)size);
        return NULL;
    }
    if (index < 0) index += size;
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == d) continue;
        ns[j] = t->shape[i];
        nst[j++] = t->strides[i];
    }
    em__view_info info = {.kind = EM__VIEW_NARROW, .dim = d, .start = index, .step = 1,
                          .squeezed = true};
    return em__autograd_view(em__tensor_view(t, t->ndim - 1, ns, nst,
                                             t->offset + index * t->strides[d]), t, &info);
}

static em_tensor *expand_impl(const em_tensor *t, int ndim, const int64_t *shape) {
    if (!em__check_inputs("expand", &t, 1)) return NULL;
    if (ndim < t->ndim || ndim > EM_MAX_DIMS || (ndim > 0 && !shape)) {
        em_set_error(EM_ERR_SHAPE, "expand: cannot expand a tensor with %d dims to %d dims",
                     t->ndim, ndim);
        return NULL;
    }
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = ndim - 1; i >= 0; i--) {
        int j = i - lead;
        int64_t want = shape[i];
        if (j < 0) {
            if (want < 0) {
                em_set_error(EM_ERR_SHAPE, "expand: -1 is not allowed for a new leading dim "
                             "(dim %d)", i);
                return NULL;
            }
            ns[i] = want;
            nst[i] = 0;
        } else if (want == -1 || want == t->shape[j]) {
            ns[i] = t->shape[j];
            nst[i] = t->strides[j];
        } else if (t->shape[j] == 1 && want >= 0) {
            ns[i] = want;
            nst[i] = 0;
        } else {
            char a[160], b[160];
            em_set_error(EM_ERR_SHAPE, "expand: the size of dim %d (%lld) must match the "
                         "target size %lld or be 1 (shape %s to %s)", j, (long long)t->shape[j],
                         (long long)want, em__shape_str(t->ndim, t->shape, a, sizeof a),
                         em__shape_str(ndim, shape, b, sizeof b));
            return NULL;
        }
    }
    return em__autograd_view(em__tensor_view(t, ndim, ns, nst, t->offset), t,
                             &(em__view_info){.kind = EM__VIEW_EXPAND});
}

static em_tensor *squeeze_impl(const em_tensor *t, int dim) {
    if (!em__check_inputs("squeeze", &t, 1)) return NULL;
    int d = em__wrap_dim(dim, t->ndim, "squeeze");
    if (d < 0) return NULL;
    if (t->ndim == 0 || t->shape[d] != 1)
        return em__autograd_view(em__tensor_view(t, t->ndim, t->shape, t->strides, t->offset), t,
                                 &(em__view_info){.kind = EM__VIEW_RESHAPE});
    return em__select(t, d, 0);
}

static em_tensor *unsqueeze_impl(const em_tensor *t, int dim) {
    if (!em__check_inputs("unsqueeze", &t, 1)) return NULL;
    if (t->ndim >= EM_MAX_DIMS) {
        em_set_error(EM_ERR_SHAPE, "unsqueeze: a tensor with %d dims cannot grow", t->ndim);
        return NULL;
    }
    int d = em__wrap_dim(dim, t->ndim + 1, "unsqueeze");
    if (d < 0) return NULL;
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            ns[i] = 1;
            nst[i] = j < t->ndim ? t->strides[j] * t->shape[j] : 1;
            continue;
        }
        ns[i] = t->shape[j];
        nst[i] = t->strides[j++];
    }
    return em__autograd_view(em__tensor_view(t, t->ndim + 1, ns, nst, t->offset), t, &(em__view_info){.kind = EM__VIEW_RESHAPE});
}

static em_tensor *squeeze_all_impl(const em_tensor *t) {
    if (!em__check_inputs("squeeze_all", &t, 1)) return NULL;
    int64_t ns[EM_MAX_DIMS], nst[EM_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 1) continue;
        ns[n] = t->shape[i];
        nst[n++] = t->strides[i];
    }
    return em__scope_track(em__autograd_view(em__tensor_view(t, n, ns, nst, t->offset), t, &(em__view_info){.kind = EM__VIEW_RESHAPE}));
}

static em_tensor *flatten_impl(const em_tensor *t, int start_dim, int end_dim) {
    if (!em__check_inputs("flatten", &t, 1)) return NULL;
    if (t->ndim == 0) return em_reshape(t, 1, (const int64_t[]){1});
    int s = em__wrap_dim(start_dim, t->ndim, "flatten");
    int e = s < 0 ? -1 : em__wrap_dim(end_dim, t->ndim, "flatten");
    if (s < 0 || e < 0) return NULL;
    if (s > e) {
        em_set_error(EM_ERR_INVALID, "flatten: start_dim %d comes after end_dim %d", s, e);
        return NULL;
    }
    int64_t ns[EM_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < s; i++) ns[n++] = t->shape[i];
    ns[n++] = em__numel(e - s + 1, t->shape + s);
    for (int i = e + 1; i < t->ndim; i++) ns[n++] = t->shape[i];
    return em_reshape(t, n, ns);
}

/* ---- observed entry points of the views ------------------------------------------------------ */

/* Each view is reported to the thread's observers (ember/trace.h) with its arguments as
 * attributes; with none, the cost is one thread-local load and a branch. */

static const char *const a_shape[] = {"shape"}, *const a_dims[] = {"dims"},
                         *const a_dim01[] = {"dim0", "dim1"}, *const a_dim[] = {"dim"},
                         *const a_narrow[] = {"dim", "start", "length"},
                         *const a_slice[] = {"dim", "start", "end", "step"},
                         *const a_select[] = {"dim", "index"},
                         *const a_flatten[] = {"start_dim", "end_dim"};

static em_attr a_int(int64_t v) { return (em_attr){.type = EM_ATTR_INT, .v.i = v}; }

/* Begin a one-input view or copy event with n attributes (set in f->attrs by the caller). */
static void obs_begin1(em__obs_frame *f, em_op_event_kind kind, const char *name,
                       const em_tensor *t, int n, const char *const *names) {
    f->io[0] = (em_tensor *)t;
    em__obs_begin_attrs(f, kind, name, NULL, (const em_tensor *const *)f->io, 1, n, names,
                        f->attrs, NULL, 0);
}

em_tensor *em__view(const em_tensor *t, int ndim, const int64_t *shape) {
    if (!em__observing()) return view_impl(t, ndim, shape);
    em__obs_frame f;
    f.attrs[0] = em__attr_ints64(ndim, shape);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "view", t, 1, a_shape);
    return em__obs_end1(&f, view_impl(t, ndim, shape));
}
em_tensor *em__reshape(const em_tensor *t, int ndim, const int64_t *shape) {
    if (!em__observing()) return reshape_impl(t, ndim, shape);
    em__obs_frame f;
    f.attrs[0] = em__attr_ints64(ndim, shape);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "reshape", t, 1, a_shape);
    return em__obs_end1(&f, reshape_impl(t, ndim, shape));
}
em_tensor *em__permute(const em_tensor *t, int ndim, const int *dims) {
    if (!em__observing()) return permute_impl(t, ndim, dims);
    em__obs_frame f;
    f.attrs[0] = em__attr_ints(ndim, dims);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "permute", t, 1, a_dims);
    return em__obs_end1(&f, permute_impl(t, ndim, dims));
}
em_tensor *em__transpose(const em_tensor *t, int dim0, int dim1) {
    if (!em__observing()) return transpose_impl(t, dim0, dim1);
    em__obs_frame f;
    f.attrs[0] = a_int(dim0), f.attrs[1] = a_int(dim1);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "transpose", t, 2, a_dim01);
    return em__obs_end1(&f, transpose_impl(t, dim0, dim1));
}
em_tensor *em_narrow(const em_tensor *t, int dim, int64_t start, int64_t length) {
    if (!em__observing()) return narrow_impl(t, dim, start, length);
    em__obs_frame f;
    f.attrs[0] = a_int(dim), f.attrs[1] = a_int(start), f.attrs[2] = a_int(length);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "narrow", t, 3, a_narrow);
    return em__obs_end1(&f, narrow_impl(t, dim, start, length));
}
em_tensor *em_slice(const em_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    if (!em__observing()) return slice_impl(t, dim, start, end, step);
    em__obs_frame f;
    f.attrs[0] = a_int(dim), f.attrs[1] = a_int(start), f.attrs[2] = a_int(end);
    f.attrs[3] = a_int(step);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "slice", t, 4, a_slice);
    return em__obs_end1(&f, slice_impl(t, dim, start, end, step));
}
em_tensor *em__select(const em_tensor *t, int dim, int64_t index) {
    if (!em__observing()) return select_impl(t, dim, index);
    em__obs_frame f;
    f.attrs[0] = a_int(dim), f.attrs[1] = a_int(index);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "select", t, 2, a_select);
    return em__obs_end1(&f, select_impl(t, dim, index));
}
em_tensor *em__expand(const em_tensor *t, int ndim, const int64_t *shape) {
    if (!em__observing()) return expand_impl(t, ndim, shape);
    em__obs_frame f;
    f.attrs[0] = em__attr_ints64(ndim, shape);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "expand", t, 1, a_shape);
    return em__obs_end1(&f, expand_impl(t, ndim, shape));
}
em_tensor *em__squeeze(const em_tensor *t, int dim) {
    if (!em__observing()) return squeeze_impl(t, dim);
    em__obs_frame f;
    f.attrs[0] = a_int(dim);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "squeeze", t, 1, a_dim);
    return em__obs_end1(&f, squeeze_impl(t, dim));
}
em_tensor *em__unsqueeze(const em_tensor *t, int dim) {
    if (!em__observing()) return unsqueeze_impl(t, dim);
    em__obs_frame f;
    f.attrs[0] = a_int(dim);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "unsqueeze", t, 1, a_dim);
    return em__obs_end1(&f, unsqueeze_impl(t, dim));
}
em_tensor *em_squeeze_all(const em_tensor *t) {
    if (!em__observing()) return squeeze_all_impl(t);
    em__obs_frame f;
    obs_begin1(&f, EM_OP_EVENT_VIEW, "squeeze_all", t, 0, NULL);
    return em__obs_end1(&f, squeeze_all_impl(t));
}
em_tensor *em_flatten(const em_tensor *t, int start_dim, int end_dim) {
    if (!em__observing()) return flatten_impl(t, start_dim, end_dim);
    em__obs_frame f;
    f.attrs[0] = a_int(start_dim), f.attrs[1] = a_int(end_dim);
    obs_begin1(&f, EM_OP_EVENT_VIEW, "flatten", t, 2, a_flatten);
    return em__obs_end1(&f, flatten_impl(t, start_dim, end_dim));
}

em_tensor *em_view(const em_tensor *t, int ndim, const int64_t *shape) {
    return em__scope_track(em__view(t, ndim, shape));
}
em_tensor *em_reshape(const em_tensor *t, int ndim, const int64_t *shape) {
    return em__scope_track(em__reshape(t, ndim, shape));
}
em_tensor *em_permute(const em_tensor *t, int ndim, const int *dims) {
    return em__scope_track(em__permute(t, ndim, dims));
}
em_tensor *em_transpose(const em_tensor *t, int dim0, int dim1) {
    return em__scope_track(em__transpose(t, dim0, dim1));
}
em_tensor *em_select(const em_tensor *t, int dim, int64_t index) {
    return em__scope_track(em__select(t, dim, index));
}
em_tensor *em_expand(const em_tensor *t, int ndim, const int64_t *shape) {
    return em__scope_track(em__expand(t, ndim, shape));
}
em_tensor *em_squeeze(const em_tensor *t, int dim) {
    return em__scope_track(em__squeeze(t, dim));
}
em_tensor *em_unsqueeze(const em_tensor *t, int dim) {
    return em__scope_track(em__unsqueeze(t, dim));
}

/* ---- copies ---------------------------------------------------------------------------------- */

/* dst (any layout) = src (already dst's shape) on the same device, converting dtype. */
static em_status copy_same_device(em_tensor *dst, const em_tensor *src) {
    const em_tensor *in[1] = {src};
    return em_op_call_out(em__op_copy, in, 1, NULL, &dst, 1);
}

static em_status copy_impl(em_tensor *dst, const em_tensor *src) {
    const em_tensor *args[2] = {dst, src};
    if (!em__check_inputs("copy_", args, 2)) return em_last_status();
    em_tensor *s = em__expand(src, dst->ndim, dst->shape);
    if (!s && em_last_status() == EM_ERR_NOMEM) return EM_ERR_NOMEM;
    if (!s) {
        char a[160], b[160];
        return em_set_error(EM_ERR_SHAPE, "copy_: source shape %s does not broadcast to the "
                            "destination shape %s", em__shape_str(src->ndim, src->shape, a, sizeof a),
                            em__shape_str(dst->ndim, dst->shape, b, sizeof b));
    }
    em_status st;
    em_device dd = dst->storage->device, sd = src->storage->device;
    if (em_device_equal(dd, sd)) {
        st = copy_same_device(dst, s);
    } else {
        /* Across devices: make a contiguous block of dst's dtype on the source device, move the
         * bytes, then lay them out into dst with a same-device copy when dst is strided. */
        em_tensor *c = em__empty(dst->ndim, dst->shape, dst->dtype, sd);
        st = c ? copy_same_device(c, s) : em_last_status();
        if (st == EM_OK && em_tensor_is_contiguous(dst)) {
            st = em__device_copy(dd, em_tensor_data(dst), sd, em_tensor_data(c),
                                 em_tensor_nbytes(dst));
            if (st == EM_OK) em_tensor_bump_version(dst);
        } else if (st == EM_OK) {
            em_tensor *m = em__empty(dst->ndim, dst->shape, dst->dtype, dd);
            st = m ? em__device_copy(dd, em_tensor_data(m), sd, em_tensor_data(c),
                                     em_tensor_nbytes(dst))
                   : em_last_status();
            if (st == EM_OK) st = copy_same_device(dst, m);
            em_tensor_release(m);
        }
        em_tensor_release(c);
    }
    em_tensor_release(s);
    return st;
}

static em_tensor *copy_as(const em_tensor *t, em_dtype dt, em_device dev) {
    em_tensor *c = em__empty(t->ndim, t->shape, dt, dev);
    if (c && em_copy_(c, t) != EM_OK) {
        em_tensor_release(c);
        return NULL;
    }
    return c;
}

static em_tensor *clone_impl(const em_tensor *t) {
    if (!em__check_inputs("clone", &t, 1)) return NULL;
    return copy_as(t, t->dtype, t->storage->device);
}

static em_tensor *channels_last_impl(const em_tensor *t) {
    if (!em__check_inputs("channels_last", &t, 1)) return NULL;
    if (t->ndim != 4) {
        char b[160];
        em_set_error(EM_ERR_SHAPE, "channels_last: expected a 4-dim (N, C, H, W) tensor, got %s",
                     em__shape_str(t->ndim, t->shape, b, sizeof b));
        return NULL;
    }
    if (em__is_channels_last(t->ndim, t->shape, t->strides)) return em_tensor_retain((em_tensor *)t);
    em_tensor *c = em__empty_channels_last(t->shape, t->dtype, t->storage->device);
    if (c && em_copy_(c, t) != EM_OK) {
        em_tensor_release(c);
        return NULL;
    }
    return c;
}

static em_tensor *contiguous_impl(const em_tensor *t) {
    if (!em__check_inputs("contiguous", &t, 1)) return NULL;
    if (em_tensor_is_contiguous(t)) return em_tensor_retain((em_tensor *)t);
    return em__clone(t);
}

static em_tensor *to_device_impl(const em_tensor *t, em_device dev) {
    if (!em__check_inputs("to_device", &t, 1)) return NULL;
    if (em__device_check(dev, "to_device") != EM_OK) return NULL;
    if (em_device_equal(dev, t->storage->device)) return em_tensor_retain((em_tensor *)t);
    em_tensor *c = copy_as(t, t->dtype, dev);
    if (c && em__autograd_to_device(c, t) != EM_OK) {
        em_tensor_release(c);
        return NULL;
    }
    return c;
}

static em_tensor *to_dtype_impl(const em_tensor *t, em_dtype dt) {
    if (!em__check_inputs("to_dtype", &t, 1)) return NULL;
    if (!em_dtype_is_valid(dt)) {
        em_set_error(EM_ERR_DTYPE, "to_dtype: invalid dtype %d", (int)dt);
        return NULL;
    }
    if (dt == t->dtype) return em_tensor_retain((em_tensor *)t);
    return copy_as(t, dt, t->storage->device);
}

/* ---- observed entry points of the copies ----------------------------------------------------- */

static const char *const a_dtype[] = {"dtype"}, *const a_device[] = {"device"};

em_status em_copy_(em_tensor *dst, const em_tensor *src) {
    if (!em__observing()) return copy_impl(dst, src);
    em__obs_frame f;
    f.io[0] = dst, f.io[1] = (em_tensor *)src;
    em__obs_begin_attrs(&f, EM_OP_EVENT_COPY, "copy_", NULL, (const em_tensor *const *)f.io, 2,
                        0, NULL, f.attrs, &f.io[0], dst ? 1 : 0);
    return em__obs_end(&f, copy_impl(dst, src), &dst, 1);
}
em_tensor *em__clone(const em_tensor *t) {
    if (!em__observing()) return clone_impl(t);
    em__obs_frame f;
    obs_begin1(&f, EM_OP_EVENT_COPY, "clone", t, 0, NULL);
    return em__obs_end1(&f, clone_impl(t));
}
em_tensor *em__channels_last(const em_tensor *t) {
    if (!em__observing()) return channels_last_impl(t);
    em__obs_frame f;
    obs_begin1(&f, EM_OP_EVENT_COPY, "channels_last", t, 0, NULL);
    return em__obs_end1(&f, channels_last_impl(t));
}
em_tensor *em__contiguous(const em_tensor *t) {
    if (!em__observing()) return contiguous_impl(t);
    em__obs_frame f;
    obs_begin1(&f, EM_OP_EVENT_COPY, "contiguous", t, 0, NULL);
    return em__obs_end1(&f, contiguous_impl(t));
}
em_tensor *em__to_device(const em_tensor *t, em_device dev) {
    if (!em__observing()) return to_device_impl(t, dev);
    em__obs_frame f;
    char name[48];
    f.attrs[0] = (em_attr){.type = EM_ATTR_STRING, .v.s = em_device_str(dev, name, sizeof name)};
    obs_begin1(&f, EM_OP_EVENT_COPY, "to_device", t, 1, a_device);
    return em__obs_end1(&f, to_device_impl(t, dev));
}
em_tensor *em__to_dtype(const em_tensor *t, em_dtype dt) {
    if (!em__observing()) return to_dtype_impl(t, dt);
    em__obs_frame f;
    f.attrs[0] = (em_attr){.type = EM_ATTR_STRING, .v.s = em_dtype_name(dt)};
    obs_begin1(&f, EM_OP_EVENT_COPY, "to_dtype", t, 1, a_dtype);
    return em__obs_end1(&f, to_dtype_impl(t, dt));
}

em_tensor *em_clone(const em_tensor *t) { return em__scope_track(em__clone(t)); }
em_tensor *em_contiguous(const em_tensor *t) { return em__scope_track(em__contiguous(t)); }
em_tensor *em_channels_last(const em_tensor *t) { return em__scope_track(em__channels_last(t)); }
em_tensor *em_to_device(const em_tensor *t, em_device dev) {
    return em__scope_track(em__to_device(t, dev));
}
em_tensor *em_to_dtype(const em_tensor *t, em_dtype dt) {
    return em__scope_track(em__to_dtype(t, dt));
}

em_status em_tensor_to_host(const em_tensor *t, void *dst, size_t cap) {
    if (!em__check_inputs("to_host", &t, 1)) return em_last_status();
    size_t n = em_tensor_nbytes(t);
    if (!dst && n) return em_set_error(EM_ERR_INVALID, "to_host: NULL destination");
    if (cap < n)
        return em_set_error(EM_ERR_RANGE, "to_host: the tensor has %zu bytes; the buffer "
                            "holds %zu", n, cap);
    em_tensor *c = em__contiguous(t);
    if (!c) return em_last_status();
    em_status st = em__device_copy(em_cpu(), dst, c->storage->device, em_tensor_data(c), n);
    if (st == EM_OK && c->storage->device.type != EM_DEVICE_CPU_TYPE)
        st = em_device_synchronize(c->storage->device);
    em_tensor_release(c);
    return st;
}

em_status em_tensor_item(const em_tensor *t, double *out) {
    if (!em__check_inputs("item", &t, 1)) return em_last_status();
    if (!out) return em_set_error(EM_ERR_INVALID, "item: NULL out");
    if (t->numel != 1) {
        char a[160];
        return em_set_error(EM_ERR_SHAPE, "item: a tensor with %lld elements (shape %s) cannot "
                            "be converted to a scalar; only one-element tensors can",
                            (long long)t->numel, em__shape_str(t->ndim, t->shape, a, sizeof a));
    }
    unsigned char buf[8];
    em_status st = em_tensor_to_host(t, buf, sizeof buf);
    if (st == EM_OK) *out = em_dtype_load(t->dtype, buf, 0);
    return st;
}

double em_item(const em_tensor *t) {
    double v;
    return em_tensor_item(t, &v) == EM_OK ? v : NAN;
}
