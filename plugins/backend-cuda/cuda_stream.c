/*
 * cuda_stream.c — streams and events of the "cuda" device: CUDA streams that synchronise with
 * the legacy default stream (the core's NULL stream), and timing-free CUDA events.
 */
#include <string.h>

#include "cuda_internal.h"

/* The backend's em_event: a CUDA event and whether it was ever recorded (waiting on an event
 * never recorded is an error here, as on every Ember device, where CUDA would not wait). */
struct em_event {
    cudaEvent_t e;
    int index;
    bool recorded;
    bool timed; /* made by cuda_event_create_timed: cudaEventElapsedTime works on it */
};

static cudaStream_t raw(const em_stream *s) { return s ? s->s : (cudaStream_t)0; }

em_status cuda_stream_create(int index, em_stream **out) {
    *out = NULL;
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    em_stream *s = em_host_alloc(sizeof *s, 16);
    if (!s) return em_set_error(EM_ERR_NOMEM, "cuda: out of host memory creating a stream");
    s->index = index;
    st = cuda_check(cudaStreamCreateWithFlags(&s->s, cudaStreamDefault), "stream_create",
                    "cudaStreamCreateWithFlags", index);
    if (st != EM_OK) {
        em_host_free(s);
        return st;
    }
    *out = s;
    return EM_OK;
}

void cuda_stream_destroy(int index, em_stream *s) {
    if (!s) return;
    if (cuda_set_device(index) == EM_OK)
        (void)cuda_check(cudaStreamDestroy(s->s), "stream_free", "cudaStreamDestroy", index);
    em_host_free(s);
}

em_status cuda_stream_synchronize(int index, em_stream *s) {
    em_status st = cuda_set_device(index);
    return st != EM_OK ? st : cuda_check(cudaStreamSynchronize(raw(s)), "stream_synchronize",
                                         "cudaStreamSynchronize", index);
}

/* An event with or without timing (cudaEventDisableTiming makes recording cheaper: the
 * allocator's and the loader's events need no timestamps). */
static em_status event_new(int index, bool timed, em_event **out) {
    *out = NULL;
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    em_event *e = em_host_alloc(sizeof *e, 16);
    if (!e) return em_set_error(EM_ERR_NOMEM, "cuda: out of host memory creating an event");
    memset(e, 0, sizeof *e);
    e->index = index;
    e->timed = timed;
    st = cuda_check(cudaEventCreateWithFlags(&e->e, timed ? cudaEventDefault
                                                          : cudaEventDisableTiming),
                    "event_create", "cudaEventCreateWithFlags", index);
    if (st != EM_OK) {
        em_host_free(e);
        return st;
    }
    *out = e;
    return EM_OK;
}

em_status cuda_event_create(int index, em_event **out) { return event_new(index, false, out); }
em_status cuda_event_create_timed(int index, em_event **out) {
    return event_new(index, true, out);
}

void cuda_event_destroy(int index, em_event *e) {
    if (!e) return;
    if (cuda_set_device(index) == EM_OK)
        (void)cuda_check(cudaEventDestroy(e->e), "event_free", "cudaEventDestroy", index);
    em_host_free(e);
}

em_status cuda_event_record(int index, em_event *e, em_stream *s) {
    em_status st = cuda_set_device(index);
    if (st == EM_OK)
        st = cuda_check(cudaEventRecord(e->e, raw(s)), "event_record", "cudaEventRecord", index);
    if (st == EM_OK) e->recorded = true;
    return st;
}

static em_status never_recorded(const char *who, int index) {
    return em_set_error(EM_ERR_STATE, "cuda: %s: the event was never recorded (record it on a "
                        "stream of cuda:%d first)", who, index);
}

em_status cuda_event_wait(int index, em_stream *s, em_event *e) {
    if (!e->recorded) return never_recorded("event_wait", index);
    em_status st = cuda_set_device(index);
    return st != EM_OK ? st : cuda_check(cudaStreamWaitEvent(raw(s), e->e, 0), "event_wait",
                                         "cudaStreamWaitEvent", index);
}

em_status cuda_event_synchronize(int index, em_event *e) {
    if (!e->recorded) return never_recorded("event_synchronize", index);
    em_status st = cuda_set_device(index);
    return st != EM_OK ? st : cuda_check(cudaEventSynchronize(e->e), "event_synchronize",
                                         "cudaEventSynchronize", index);
}

em_status cuda_event_query(int index, em_event *e, bool *done) {
    *done = false;
    if (!e->recorded) return never_recorded("event_query", index);
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    cudaError_t r = cudaEventQuery(e->e);
    if (r == cudaErrorNotReady) return EM_OK; /* not an error: the work is still running */
    *done = r == cudaSuccess;
    return cuda_check(r, "event_query", "cudaEventQuery", index);
}

em_status cuda_event_elapsed_ns(int index, em_event *start, em_event *end, uint64_t *ns) {
    *ns = 0;
    if (!start->recorded || !end->recorded) return never_recorded("event_elapsed_ns", index);
    if (!start->timed || !end->timed)
        return em_set_error(EM_ERR_INVALID, "cuda: event_elapsed_ns: an event made without "
                            "timing (event_create, not event_create_timed)");
    em_status st = cuda_set_device(index);
    if (st == EM_OK)
        st = cuda_check(cudaEventSynchronize(end->e), "event_elapsed_ns", "cudaEventSynchronize",
                        index);
    float ms = 0;
    if (st == EM_OK)
        st = cuda_check(cudaEventElapsedTime(&ms, start->e, end->e), "event_elapsed_ns",
                        "cudaEventElapsedTime", index);
    if (st == EM_OK) *ns = ms > 0 ? (uint64_t)((double)ms * 1e6 + 0.5) : 0;
    return st;
}

/* ---- graph capture (em_device_ops.graph_*): CUDA graphs --------------------------------------
 * A capture is cudaStreamBeginCapture in thread-local mode (PyTorch's "thread_local": calls
 * that are unsafe during a capture fail when this thread makes them, other threads go on), and
 * its end instantiates the graph. cudaMalloc is such an unsafe call, yet the core's caching
 * allocator may need a new block while recording: cuda_dev_alloc switches this thread to the
 * relaxed mode around it (what PyTorch's allocator does; a cudaMalloc is not recorded, and the
 * block stays the graph's until the graph is freed). */

int cuda_captures;

em_status cuda_graph_begin(int index, em_stream *s) {
    if (cuda_sync_mode)
        return em_set_error(EM_ERR_STATE, "cuda: graph capture is not possible under "
                            "EMBER_CUDA_SYNC=1 (every op synchronises, which a capture cannot "
                            "record); unset it to capture");
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    st = cuda_check(cudaStreamBeginCapture(raw(s), cudaStreamCaptureModeThreadLocal),
                    "graph_capture_begin", "cudaStreamBeginCapture", index);
    if (st == EM_OK) __atomic_fetch_add(&cuda_captures, 1, __ATOMIC_RELAXED);
    return st;
}

em_status cuda_graph_end(int index, em_stream *s, void **out) {
    *out = NULL;
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(raw(s), &g);
    __atomic_fetch_sub(&cuda_captures, 1, __ATOMIC_RELAXED);
    if (e == cudaErrorStreamCaptureInvalidated)
        return cuda_check(e, "graph_capture_end (a call made during the capture broke it: "
                          "the first error after em_graph_capture_begin names it)",
                          "cudaStreamEndCapture", index);
    if ((st = cuda_check(e, "graph_capture_end", "cudaStreamEndCapture", index)) != EM_OK) {
        if (g) (void)cudaGraphDestroy(g);
        return st;
    }
    cudaGraphExec_t x = NULL;
    st = cuda_check(cudaGraphInstantiate(&x, g, 0), "graph_capture_end",
                    "cudaGraphInstantiate", index);
    (void)cudaGraphDestroy(g); /* the executable graph keeps what it needs */
    if (st == EM_OK) *out = x;
    return st;
}

em_status cuda_graph_replay(int index, void *graph, em_stream *s) {
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    st = cuda_check(cudaGraphLaunch((cudaGraphExec_t)graph, raw(s)), "graph_replay",
                    "cudaGraphLaunch", index);
    if (st == EM_OK && cuda_sync_mode)
        st = cuda_check(cudaStreamSynchronize(raw(s)), "graph_replay", "cudaStreamSynchronize",
                        index);
    return st;
}

void cuda_graph_destroy(int index, void *graph) {
    if (!graph || cuda_set_device(index) != EM_OK) return;
    if (cuda_check(cudaGraphExecDestroy((cudaGraphExec_t)graph), "graph_free",
                   "cudaGraphExecDestroy", index) != EM_OK)
        em_log_write(EM_LOG_ERROR, "%s", em_last_error());
}
