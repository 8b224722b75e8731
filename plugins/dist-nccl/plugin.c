/*
 * plugin.c — ember-nccl.so: the "nccl" communicator class (ember/comm.h) on NVIDIA's NCCL, for
 * tensors on CUDA devices (docs/distributed.md, "NCCL").
 *
 * Cheap where it is not used: registration touches neither NCCL nor the GPU. libnccl.so.2 is
 * dlopen()ed by the first em_comm_new("nccl") (EMBER_NCCL_LIBRARY names another file), which
 * then needs a CUDA device (the ember-cuda plugin's "cuda" type). The plugin links the CUDA
 * runtime statically, as ember-cuda does, for its stream and events.
 *
 * Rank bootstrap. NCCL's ranks meet through a unique id that rank 0 makes and every rank must
 * receive. When an MPI launcher started the process (the variables ember-train looks for:
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK), create makes an "mpi" communicator (ember-mpi),
 * takes rank and size from it and broadcasts the id over it, then frees it; otherwise the
 * process is a world of one. Each rank runs on cuda:L, L its local rank on its host
 * (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID or LOCAL_RANK; else the rank),
 * or EMBER_NCCL_DEVICE.
 *
 * Streams. A collective runs on the communicator's own stream (non-blocking, high priority),
 * ordered after the work queued so far on the calling thread's current stream of the device
 * (em_stream_current: an event recorded there, waited for by the NCCL stream), so it overlaps
 * the work queued after it (the rest of backward). test() queries the event recorded after
 * the collective; wait() polls it (and NCCL's asynchronous error) until it completes or the
 * timeout passes: then the NCCL communicator is aborted and the error names the collective.
 * Once wait has returned, the host has seen the collective complete, so whatever the core
 * queues next (the average's division, the copies back into .grad) on the current stream, and
 * the caching allocator's reuse of the buffers, are ordered after it.
 */
#define _GNU_SOURCE /* dladdr */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember/comm.h"
#include "ember/device.h"
#include "ember/error.h"
#include "ember/plugin.h"
#include "ember/tensor.h"
#include "ember/version.h"

/* ---- NCCL, loaded on first use --------------------------------------------------------------- */

#define NCCL_FUNCS(X)                                                                              \
    X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy) X(ncclCommAbort) \
    X(ncclCommGetAsyncError) X(ncclGetErrorString) X(ncclGetLastError) X(ncclAllReduce)          \
    X(ncclBroadcast) X(ncclAllGather) X(ncclReduceScatter)

static struct {
    bool loaded;
    int version;     /* NCCL_VERSION_CODE of the library loaded (22809 is 2.28.9) */
    char path[512];  /* what was dlopen()ed */
#define X(f) __typeof__(&f) f;
    NCCL_FUNCS(X)
#undef X
    char describe[640];
} N;

/* The oldest NCCL taken: ncclGetLastError and ncclBfloat16 are older; 2.18 is what CUDA 12's
 * wheels shipped first. */
#define EM_NCCL_MIN_VERSION 21800

static void version_text(int v, char *buf, size_t cap) {
    if (v >= 10000) snprintf(buf, cap, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else snprintf(buf, cap, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
}

static void describe_now(void) {
    char v[24];
    if (N.loaded) {
        version_text(N.version, v, sizeof v);
        snprintf(N.describe, sizeof N.describe, "NCCL %s loaded from %s (built against %d.%d.%d)",
                 v, N.path, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    } else {
        snprintf(N.describe, sizeof N.describe, "NCCL not loaded: libnccl.so.2 is loaded by the "
                 "first em_comm_new(\"nccl\") (built against %d.%d.%d)", NCCL_MAJOR, NCCL_MINOR,
                 NCCL_PATCH);
    }
}

static em_status load_nccl(void) {
    if (N.loaded) return EM_OK;
    const char *env = getenv("EMBER_NCCL_LIBRARY");
    const char *lib = env && *env ? env : "libnccl.so.2";
    /* NODELETE: NCCL's proxy threads outlive any communicator; the library is never closed. */
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h)
        return em_set_error(EM_ERR_PLUGIN, "comm_new: nccl: cannot load NCCL (%s%s): %s", lib,
                            env && *env ? ", from EMBER_NCCL_LIBRARY" : "", dlerror());
#define X(f)                                                                                       \
    *(void **)&N.f = dlsym(h, #f);                                                                 \
    if (!N.f)                                                                                      \
        return em_set_error(EM_ERR_PLUGIN, "comm_new: nccl: %s has no %s: not NCCL 2", lib, #f);
    NCCL_FUNCS(X)
#undef X
    int v = 0;
    if (N.ncclGetVersion(&v) != ncclSuccess || v < EM_NCCL_MIN_VERSION) {
        char have[24], need[24];
        version_text(v, have, sizeof have);
        version_text(EM_NCCL_MIN_VERSION, need, sizeof need);
        return em_set_error(EM_ERR_PLUGIN, "comm_new: nccl: %s is NCCL %s; this plugin needs %s "
                            "or newer", lib, have, need);
    }
    N.version = v;
    Dl_info info;
    const char *where = dladdr((void *)N.ncclGetVersion, &info) && info.dli_fname
                            ? info.dli_fname : lib;
    snprintf(N.path, sizeof N.path, "%s", where);
    N.loaded = true;
    describe_now();
    return EM_OK;
}

/* ---- the communicator ------------------------------------------------------------------------ */

typedef struct nccl_state {
    ncclComm_t comm;
    int rank, size, device; /* device: the CUDA ordinal, cuda:device */
    em_device dev;          /* the same as an Ember device */
    cudaStream_t stream;    /* the collectives' stream */
    cudaEvent_t ready;      /* recorded on the caller's stream, waited for by `stream` */
    float *scratch;         /* one float on the device: a barrier is an allreduce of it */
    void *(*stream_handle)(em_stream *); /* ember-cuda's: an em_stream's cudaStream_t */
    bool broken;
} nccl_state;

typedef struct nccl_req {
    cudaEvent_t done; /* recorded on the collectives' stream after the collective */
    em_collective coll;
    uint64_t seq;
    int64_t n;
    em_dtype dt;
} nccl_req;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static em_status cuda_fail(cudaError_t e, const char *what, const char *call, int device) {
    (void)cudaGetLastError();
    return em_set_error(e == cudaErrorMemoryAllocation ? EM_ERR_NOMEM : EM_ERR_DEVICE,
                        "%s: nccl: %s failed on cuda:%d: %s (%s)", what, call, device,
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

/* NCCL's result and its last message ("ncclInvalidUsage: ... Duplicate GPU detected ..."). */
static const char *nccl_msg(ncclComm_t comm, ncclResult_t r, char *buf, size_t cap) {
    const char *last = N.ncclGetLastError(comm);
    snprintf(buf, cap, "%s%s%s", N.ncclGetErrorString(r), last && *last ? ": " : "",
             last ? last : "");
    return buf;
}

/* The first local-rank variable set, or -1. */
static int local_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                       "SLURM_LOCALID", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        long l = v && *v ? strtol(v, &end, 10) : -1;
        if (v && *v && !*end && l >= 0) return (int)l;
    }
    return -1;
}

static const char *launcher(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return vars[i];
    }
    return NULL;
}

/* Rank, size and NCCL's unique id: from the launcher's MPI job (rank 0's id broadcast over an
 * "mpi" communicator), or a world of one. Byte 0 of the broadcast says whether rank 0 made
 * its id, so a failure there fails every rank instead of leaving them waiting. */
static em_status bootstrap(const em_comm_options *o, int *rank, int *size, ncclUniqueId *id) {
    *rank = 0;
    *size = 1;
    const char *var = launcher();
    if (!var) {
        ncclResult_t r = N.ncclGetUniqueId(id);
        char m[512];
        return r == ncclSuccess ? EM_OK
                                : em_set_error(EM_ERR_IO, "comm_new: nccl: ncclGetUniqueId: %s",
                                               nccl_msg(NULL, r, m, sizeof m));
    }
    em_comm *mpi = em_comm_new("mpi", o);
    if (!mpi)
        return em_set_error(em_last_status(), "comm_new: nccl: started by an MPI launcher "
                            "(%s=%s), so NCCL's unique id goes to the ranks over an \"mpi\" "
                            "communicator, which failed: %s", var, getenv(var), em_last_error());
    *rank = em_comm_rank(mpi);
    *size = em_comm_size(mpi);
    int64_t n = 1 + (int64_t)sizeof *id;
    em_tensor *t = em_zeros(1, &n, EM_U8, em_cpu());
    em_status st = t ? EM_OK : em_last_status();
    char why[512] = "";
    if (st == EM_OK && *rank == 0) {
        uint8_t *b = em_tensor_data(t);
        ncclResult_t r = N.ncclGetUniqueId(id);
        if (r == ncclSuccess) {
            b[0] = 1;
            memcpy(b + 1, id, sizeof *id);
        } else {
            nccl_msg(NULL, r, why, sizeof why);
        }
    }
    if (st == EM_OK) st = em_comm_wait(em_comm_broadcast(mpi, t, 0));
    if (st == EM_OK) {
        const uint8_t *b = em_tensor_data(t);
        if (b[0] != 1)
            st = em_set_error(EM_ERR_IO, "comm_new: nccl: rank 0 could not make NCCL's unique "
                              "id%s%s", *why ? ": ncclGetUniqueId: " : " (see rank 0's error)",
                              why);
        else
            memcpy(id, b + 1, sizeof *id);
    } else {
        st = em_set_error(st, "comm_new: nccl: passing NCCL's unique id from rank 0: %s",
                          em_last_error());
    }
    em_tensor_release(t);
    em_comm_free(mpi);
    return st;
}

static em_status nccl_create(const em_comm_options *o, void **state, int *rank, int *size) {
    em_status st = load_nccl();
    if (st != EM_OK) return st;
    char v[24];
    version_text(N.version, v, sizeof v);
    int count = em_device_count("cuda");
    if (count < 1) {
        const char *why = em_device_count_reason("cuda");
        return em_set_error(EM_ERR_DEVICE, "comm_new: nccl (NCCL %s, %s): no CUDA device to run "
                            "on: %s", v, N.path,
                            why ? why : "the cuda device type is not loaded (no ember-cuda "
                                        "plugin)");
    }
    void *(*handle)(em_stream *) = (void *(*)(em_stream *))em_backend_proc("cuda",
                                                                          "stream_handle");
    if (!handle)
        return em_set_error(EM_ERR_PLUGIN, "comm_new: nccl: the cuda backend has no "
                            "\"stream_handle\" function (an older ember-cuda)");
    ncclUniqueId id;
    int r = 0, n = 1;
    if ((st = bootstrap(o, &r, &n, &id)) != EM_OK) return st;
    int dev = local_rank();
    if (dev < 0) dev = n > 1 ? r : 0;
    const char *forced = getenv("EMBER_NCCL_DEVICE");
    if (forced && *forced) {
        char *end;
        long d = strtol(forced, &end, 10);
        if (*end || d < 0)
            return em_set_error(EM_ERR_INVALID, "comm_new: nccl: EMBER_NCCL_DEVICE='%s' is not a "
                                "CUDA device ordinal", forced);
        dev = (int)d;
    }
    if (dev >= count)
        return em_set_error(EM_ERR_DEVICE, "comm_new: nccl: rank %d of %d would run on cuda:%d, "
                            "but only %d CUDA device%s present: start at most %d rank%s per host "
                            "(each needs a GPU of its own: NCCL refuses two ranks on one GPU), "
                            "or set EMBER_NCCL_DEVICE", r, n, dev, count,
                            count == 1 ? " is" : "s are", count, count == 1 ? "" : "s");
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", dev);
    em_device edev;
    if ((st = em_device_parse(name, &edev)) != EM_OK) return st;
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) return cuda_fail(e, "comm_new", "cudaSetDevice", dev);
    nccl_state *s = calloc(1, sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "comm_new: nccl: out of memory");
    s->dev = edev;
    s->rank = r;
    s->size = n;
    s->device = dev;
    s->stream_handle = handle;
    int lo = 0, hi = 0;
    const char *call = "cudaDeviceGetStreamPriorityRange";
    e = cudaDeviceGetStreamPriorityRange(&lo, &hi);
    if (e == cudaSuccess) {
        call = "cudaStreamCreateWithPriority";
        e = cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, hi);
    }
    if (e == cudaSuccess) {
        call = "cudaEventCreateWithFlags";
        e = cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) {
        call = "cudaMalloc";
        e = cudaMalloc((void **)&s->scratch, sizeof(float));
    }
    if (e != cudaSuccess) {
        st = cuda_fail(e, "comm_new", call, dev);
        goto fail;
    }
    ncclResult_t nr = N.ncclCommInitRank(&s->comm, n, id, r);
    if (nr != ncclSuccess) {
        char m[512];
        st = em_set_error(EM_ERR_IO, "comm_new: nccl: ncclCommInitRank (rank %d of %d, cuda:%d) "
                          "failed: %s", r, n, dev, nccl_msg(NULL, nr, m, sizeof m));
        s->comm = NULL;
        goto fail;
    }
    *state = s;
    *rank = r;
    *size = n;
    return EM_OK;
fail:
    if (s->scratch) (void)cudaFree(s->scratch);
    if (s->ready) (void)cudaEventDestroy(s->ready);
    if (s->stream) (void)cudaStreamDestroy(s->stream);
    free(s);
    return st;
}

static void nccl_destroy(void *state) {
    nccl_state *s = state;
    if (!s) return;
    if (cudaSetDevice(s->device) == cudaSuccess) {
        if (s->broken) {
            /* never blocks on a pending collective; after a timeout it is aborted already */
            if (s->comm) (void)N.ncclCommAbort(s->comm);
        } else {
            (void)cudaStreamSynchronize(s->stream);
            (void)N.ncclCommDestroy(s->comm);
        }
        (void)cudaFree(s->scratch);
        (void)cudaEventDestroy(s->ready);
        (void)cudaStreamDestroy(s->stream);
        (void)cudaGetLastError();
    }
    free(s);
}

static bool nccl_type(em_dtype dt, bool reduce, ncclDataType_t *out) {
    switch (dt) {
    case EM_F32: *out = ncclFloat32; return true;
    case EM_F64: *out = ncclFloat64; return true;
    case EM_F16: *out = ncclFloat16; return true;
    case EM_BF16: *out = ncclBfloat16; return true;
    case EM_I32: *out = ncclInt32; return true;
    case EM_I64: *out = ncclInt64; return true;
    case EM_U8: *out = ncclUint8; return true;
    case EM_BOOL: *out = ncclUint8; return !reduce; /* moved, not summed */
    default: return false;
    }
}

/* " on rank R of N", or "" before a communicator exists. */
static const char *where(const nccl_state *s, char *buf, size_t cap) {
    if (s) snprintf(buf, cap, " on rank %d of %d", s->rank, s->size);
    else buf[0] = '\0';
    return buf;
}

/* A buffer the communicator can take: on a CUDA device (first, before anything else is looked
 * at), and on this rank's. */
static em_status check_buf(const nccl_state *s, const char *what, uint64_t seq,
                           const em_comm_buf *b) {
    char dev[48], at[48];
    em_device_str(b->device, dev, sizeof dev);
    where(s, at, sizeof at);
    if (strncmp(dev, "cuda:", 5) != 0)
        return em_set_error(EM_ERR_DEVICE, "%s #%llu%s: the nccl communicator takes tensors on "
                            "CUDA devices only; this one is on %s (move it with em_to_device, "
                            "or use the \"mpi\" communicator for CPU tensors)", what,
                            (unsigned long long)seq, at, dev);
    if (!s)
        return em_set_error(EM_ERR_STATE, "%s #%llu: no nccl communicator", what,
                            (unsigned long long)seq);
    if (b->device.index != s->device)
        return em_set_error(EM_ERR_DEVICE, "%s #%llu%s: this rank's nccl communicator runs on "
                            "cuda:%d; this tensor is on %s", what, (unsigned long long)seq, at,
                            s->device, dev);
    return EM_OK;
}

static em_status nccl_start(void *state, em_collective coll, uint64_t seq, const em_comm_buf *send,
                            const em_comm_buf *recv, int root, void **req) {
    nccl_state *s = state;
    const char *what = em_collective_name(coll);
    char at[48];
    em_status st;
    if (send && (st = check_buf(s, what, seq, send)) != EM_OK) return st;
    if (recv && (st = check_buf(s, what, seq, recv)) != EM_OK) return st;
    if (!s)
        return em_set_error(EM_ERR_STATE, "%s #%llu: no nccl communicator", what,
                            (unsigned long long)seq);
    where(s, at, sizeof at);
    if (s->broken)
        return em_set_error(EM_ERR_STATE, "%s #%llu%s: the nccl communicator is broken", what,
                            (unsigned long long)seq, at);
    bool reduce = coll == EM_COLL_ALLREDUCE || coll == EM_COLL_REDUCE_SCATTER;
    ncclDataType_t dt = ncclFloat32;
    if (recv && !nccl_type(recv->dtype, reduce, &dt))
        return em_set_error(EM_ERR_DTYPE, "%s #%llu%s: the nccl communicator cannot %s %s "
                            "tensors", what, (unsigned long long)seq, at, reduce ? "sum" : "move",
                            em_dtype_name(recv->dtype));
    cudaError_t e = cudaSetDevice(s->device);
    if (e != cudaSuccess) return cuda_fail(e, what, "cudaSetDevice", s->device);
    nccl_req *q = calloc(1, sizeof *q);
    if (!q) return em_set_error(EM_ERR_NOMEM, "%s: out of memory", what);
    q->coll = coll;
    q->seq = seq;
    q->n = recv ? recv->numel : 0;
    q->dt = recv ? recv->dtype : EM_F32;
    /* After what the calling thread queued on the device so far (a barrier too). */
    cudaStream_t caller = cudaStreamLegacy;
    em_stream *cur = em_stream_current(s->dev);
    if (cur) caller = (cudaStream_t)s->stream_handle(cur);
    const char *call = "cudaEventCreateWithFlags";
    e = cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming);
    if (e == cudaSuccess) {
        call = "cudaEventRecord";
        e = cudaEventRecord(s->ready, caller);
    }
    if (e == cudaSuccess) {
        call = "cudaStreamWaitEvent";
        e = cudaStreamWaitEvent(s->stream, s->ready, 0);
    }
    if (e != cudaSuccess) {
        st = cuda_fail(e, what, call, s->device);
        if (q->done) (void)cudaEventDestroy(q->done);
        free(q);
        return st;
    }
    size_t n = recv ? (size_t)recv->numel : 0;
    ncclResult_t r = ncclSuccess;
    switch (coll) {
    case EM_COLL_ALLREDUCE:
        r = N.ncclAllReduce(send->data, recv->data, n, dt, ncclSum, s->comm, s->stream);
        break;
    case EM_COLL_BROADCAST:
        r = N.ncclBroadcast(recv->data, recv->data, n, dt, root, s->comm, s->stream);
        break;
    case EM_COLL_ALLGATHER:
        r = N.ncclAllGather(send->data, recv->data, (size_t)send->numel, dt, s->comm, s->stream);
        break;
    case EM_COLL_REDUCE_SCATTER:
        r = N.ncclReduceScatter(send->data, recv->data, n, dt, ncclSum, s->comm, s->stream);
        break;
    case EM_COLL_BARRIER: /* NCCL has none: an allreduce of one float completes on every rank
                           * only once every rank started it */
        r = N.ncclAllReduce(s->scratch, s->scratch, 1, ncclFloat32, ncclSum, s->comm, s->stream);
        break;
    default:
        (void)cudaEventDestroy(q->done);
        free(q);
        return em_set_error(EM_ERR_INVALID, "nccl: unknown collective %d", (int)coll);
    }
    if (r != ncclSuccess) {
        char m[512];
        st = em_set_error(EM_ERR_IO, "%s #%llu (%lld %s)%s: NCCL: %s", what,
                          (unsigned long long)seq, (long long)q->n, em_dtype_name(q->dt), at,
                          nccl_msg(s->comm, r, m, sizeof m));
        (void)cudaEventDestroy(q->done);
        free(q);
        return st;
    }
    e = cudaEventRecord(q->done, s->stream);
    if (e != cudaSuccess) {
        st = cuda_fail(e, what, "cudaEventRecord", s->device);
        s->broken = true; /* the collective is queued and cannot be waited for */
        (void)cudaEventDestroy(q->done);
        free(q);
        return st;
    }
    *req = q;
    return EM_OK;
}

static void req_free(nccl_req *q) {
    (void)cudaEventDestroy(q->done);
    free(q);
}

/* Whether q completed: EM_OK with *done, or the error (q then freed and the communicator
 * broken). */
static em_status poll_req(nccl_state *s, nccl_req *q, bool *done) {
    char at[48], m[512];
    where(s, at, sizeof at);
    const char *what = em_collective_name(q->coll);
    cudaError_t e = cudaSetDevice(s->device);
    if (e == cudaSuccess) e = cudaEventQuery(q->done);
    if (e == cudaSuccess) {
        *done = true;
        req_free(q);
        return EM_OK;
    }
    em_status st;
    if (e != cudaErrorNotReady) {
        st = em_set_error(EM_ERR_DEVICE, "%s #%llu (%lld %s)%s: cuda:%d: %s (%s)", what,
                          (unsigned long long)q->seq, (long long)q->n, em_dtype_name(q->dt), at,
                          s->device, cudaGetErrorString(e), cudaGetErrorName(e));
    } else {
        ncclResult_t ae = ncclSuccess;
        ncclResult_t r = N.ncclCommGetAsyncError(s->comm, &ae);
        if (r == ncclSuccess && (ae == ncclSuccess || ae == ncclInProgress)) {
            *done = false;
            return EM_OK;
        }
        st = em_set_error(EM_ERR_IO, "%s #%llu (%lld %s)%s: NCCL: %s", what,
                          (unsigned long long)q->seq, (long long)q->n, em_dtype_name(q->dt), at,
                          nccl_msg(s->comm, r != ncclSuccess ? r : ae, m, sizeof m));
    }
    s->broken = true;
    req_free(q);
    return st;
}

static em_status nccl_test(void *state, void *req, bool *done) {
    return poll_req(state, req, done);
}

static em_status nccl_wait(void *state, void *req, double timeout_s) {
    nccl_state *s = state;
    nccl_req *q = req;
    double t0 = now_s();
    for (unsigned spin = 0;; spin++) {
        bool done = false;
        em_status st = poll_req(s, q, &done);
        if (st != EM_OK || done) return st;
        double waited = now_s() - t0;
        if (waited > timeout_s) {
            char at[48];
            st = em_set_error(EM_ERR_IO, "%s #%llu (%lld %s)%s did not complete within %g s on "
                              "cuda:%d (NCCL cannot say which rank did not reach it: one that "
                              "is stopped, hung or dead, or that started other collectives); "
                              "the NCCL communicator was aborted",
                              em_collective_name(q->coll), (unsigned long long)q->seq,
                              (long long)q->n, em_dtype_name(q->dt), where(s, at, sizeof at),
                              timeout_s, s->device);
            s->broken = true;
            (void)N.ncclCommAbort(s->comm);
            s->comm = NULL;
            /* The event stays recorded on an aborted stream; it is left to the process. */
            free(q);
            return st;
        }
        /* Yield for the first millisecond (a collective of a small bucket is done by then),
         * then sleep 20 us between looks. */
        if (waited < 1e-3 && spin < 1000) {
            sched_yield();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

static const em_comm_class nccl_class = {
    .struct_size = sizeof nccl_class, .name = "nccl",
    .description = "NVIDIA NCCL between CUDA devices (CUDA tensors; one GPU per rank; ranks "
                   "from mpirun or a world of one)",
    .create = nccl_create, .destroy = nccl_destroy, .start = nccl_start, .test = nccl_test,
    .wait = nccl_wait,
};

static em_status nccl_register(em_registry *reg) {
    describe_now();
    return em_comm_class_register(reg, &nccl_class);
}

static const char *nccl_describe(void) { return N.describe; }

static const em_plugin_descriptor nccl_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-nccl",
    .version = EM_VERSION_STRING,
    .description = "communicator: NVIDIA NCCL for CUDA tensors (loaded when a communicator is "
                   "created)",
    .register_fn = nccl_register,
    .describe = nccl_describe,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &nccl_plugin; }
