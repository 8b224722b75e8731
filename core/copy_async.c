/*
 * copy_async.c — em_to_device_async: a copy between the host and a device (or within one
 * device) queued on a stream the caller names, and the host sources it keeps alive until the
 * device has read them.
 *
 * The device half is the allocator's: the result is allocated on `stream` (its block is that
 * stream's), and a device source is recorded on `stream` (em_tensor_record_stream), so its
 * block is reused only after the copy. The host half is kept here: each copy that reads host
 * memory on a non-default stream takes a reference to the host tensor and records an event
 * after the copy; the reference is dropped once the event has completed — polled at the next
 * em_to_device_async, and waited for at em_device_synchronize/em_shutdown (PyTorch's pinned
 * host allocator keeps its blocks the same way).
 */
#include <string.h>

#include "ember/device.h"
#include "ember/tensor.h"
#include "internal.h"

typedef struct pending {
    em_tensor *host; /* the reference held */
    em_device dev;
    em_event *ev;    /* recorded after the copy; NULL when the device has no events (the
                        copy was waited for: nothing is pending) */
    struct pending *next;
} pending;

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static pending *pendings;

/* Drop the references whose copies have completed; with `wait`, wait for every copy of
 * device `only` (every device when only.type < 0) first. */
static void pending_collect(bool wait, em_device only) {
    pending *done = NULL;
    pthread_mutex_lock(&pending_lock);
    for (pending **p = &pendings; *p;) {
        pending *e = *p;
        bool mine = only.type < 0 || em_device_equal(only, e->dev);
        const em_device_ops *o = em__device_ops(e->dev);
        bool fin = false;
        if (mine && wait) {
            (void)o->event_synchronize(e->dev.index, e->ev); /* an error: the device is gone */
            fin = true;
        } else if (o->event_query && o->event_query(e->dev.index, e->ev, &fin) != EM_OK) {
            (void)o->event_synchronize(e->dev.index, e->ev);
            fin = true;
        }
        if (!fin) {
            p = &e->next;
            continue;
        }
        *p = e->next;
        e->next = done;
        done = e;
    }
    pthread_mutex_unlock(&pending_lock);
    for (pending *e = done, *n; e; e = n) {
        n = e->next;
        em__device_ops(e->dev)->event_destroy(e->dev.index, e->ev);
        em_tensor_release(e->host);
        em__free(e);
    }
}

void em__async_copies_wait(em_device dev) { pending_collect(true, dev); }

void em__async_copies_poll(void) { pending_collect(false, (em_device){-1, 0}); }

void em__async_copies_shutdown(void) { pending_collect(true, (em_device){-1, 0}); }

/* Keep host tensor h alive until the copy just queued on s of dev has run. */
static em_status pending_add(em_tensor *h, em_device dev, em_stream *s) {
    const em_device_ops *o = em__device_ops(dev);
    if (!o->event_create || !o->event_record)
        return o->stream_synchronize ? o->stream_synchronize(dev.index, s) : EM_OK;
    pending *e = em__calloc(1, sizeof *e, "an asynchronous copy's record");
    if (!e) return EM_ERR_NOMEM;
    em_status st = o->event_create(dev.index, &e->ev);
    if (st == EM_OK) st = o->event_record(dev.index, e->ev, s);
    if (st != EM_OK) {
        if (e->ev) o->event_destroy(dev.index, e->ev);
        em__free(e);
        /* the copy is queued: wait for it rather than free its source under it */
        if (o->stream_synchronize) (void)o->stream_synchronize(dev.index, s);
        return st;
    }
    e->host = em_tensor_retain(h);
    e->dev = dev;
    pthread_mutex_lock(&pending_lock);
    e->next = pendings;
    pendings = e;
    pthread_mutex_unlock(&pending_lock);
    return EM_OK;
}

/* A tensor allocated on stream s of dev (the thread's current stream set to s meanwhile). */
static em_tensor *empty_on(const em_tensor *t, em_device dev, em_stream *s) {
    if (dev.type == EM_DEVICE_CPU_TYPE) return em__empty(t->ndim, t->shape, t->dtype, dev);
    em_stream *prev = em_stream_current(dev);
    if (prev != s && em_stream_set_current(dev, s) != EM_OK) return NULL;
    em_tensor *c = em__empty(t->ndim, t->shape, t->dtype, dev);
    if (prev != s) (void)em_stream_set_current(dev, prev);
    return c;
}

static em_tensor *to_device_async(const em_tensor *t, em_device dev, em_stream *s) {
    const char *who = "to_device_async";
    if (!em__check_inputs(who, &t, 1) || em__device_check(dev, who) != EM_OK) return NULL;
    em_device src = t->storage->device;
    bool src_cpu = src.type == EM_DEVICE_CPU_TYPE, dst_cpu = dev.type == EM_DEVICE_CPU_TYPE;
    char a[48], b[48];
    if (!src_cpu && !dst_cpu && !em_device_equal(src, dev)) {
        em_set_error(EM_ERR_DEVICE, "%s: from %s to %s: an asynchronous copy runs between the "
                     "host and one device, or within one device; use em_to_device between "
                     "two devices", who, em_device_str(src, a, sizeof a),
                     em_device_str(dev, b, sizeof b));
        return NULL;
    }
    em_device owner = dst_cpu ? src : dev; /* whose stream s is */
    if (src_cpu && dst_cpu) {
        if (s) {
            em_set_error(EM_ERR_INVALID, "%s: a copy from the host to the host has no stream "
                         "(pass NULL)", who);
            return NULL;
        }
        return em__clone(t);
    }
    em__async_copies_poll();
    /* A non-contiguous source is made contiguous first, on its own side: on the device on
     * stream s (so the copy is ordered after it), on the host at once. */
    em_tensor *c = NULL;
    if (em_tensor_is_contiguous(t)) {
        c = em_tensor_retain((em_tensor *)t);
    } else if (src_cpu) {
        c = em__contiguous(t);
    } else {
        em_stream *prev = em_stream_current(src);
        if (prev == s || em_stream_set_current(src, s) == EM_OK) {
            c = em__contiguous(t);
            if (prev != s) (void)em_stream_set_current(src, prev);
        }
    }
    if (!c) return NULL;
    em_tensor *out = empty_on(t, dev, s);
    em_status st = out ? EM_OK : em_last_status();
    size_t n = em_tensor_nbytes(t);
    if (st == EM_OK && !src_cpu && c->storage->block) st = em_tensor_record_stream(c, s);
    if (st == EM_OK && n) {
        em__placement_count_copy(dev, src, n);
        st = em__device_ops(owner)->copy(dev, em_tensor_data(out), src, em_tensor_data(c), n,
                                         s);
    }
    /* Host memory read by a copy still running: keep it until the copy is done. A copy to the
     * host needs nothing here: the result is the caller's to read after synchronising. */
    if (st == EM_OK && n && s && src_cpu) st = pending_add(c, dev, s);
    if (st == EM_OK) st = em__autograd_to_device(out, t);
    em_tensor_release(c);
    if (st != EM_OK) {
        em_tensor_release(out);
        return NULL;
    }
    return out;
}

em_status em__host_to_device_async(em_tensor *dst, const void *src, size_t n, em_stream *s) {
    em_device dev = dst->storage->device;
    em__async_copies_poll();
    int64_t len = (int64_t)n;
    em_tensor *h = em__empty(1, &len, EM_U8, em_cpu());
    if (!h) return em_last_status();
    memcpy(em_tensor_data(h), src, n);
    em_status st = em__device_ops(dev)->copy(dev, em_tensor_data(dst), em_cpu(),
                                             em_tensor_data(h), n, s);
    if (st == EM_OK && s) st = pending_add(h, dev, s);
    em_tensor_release(h);
    return st;
}

em_tensor *em_to_device_async(const em_tensor *t, em_device dev, em_stream *stream) {
    return em__scope_track(to_device_async(t, dev, stream));
}
