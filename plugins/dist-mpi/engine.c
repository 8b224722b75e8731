/*
 * engine.c — the "mpi" communicator on Open MPI: MPI-3 non-blocking collectives
 * (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ibarrier) on a
 * duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so the engine's errors come back as
 * Ember errors naming the collective, its sequence number, the rank and MPI's message.
 *
 * Stalls. MPI cannot say which rank has not entered a collective, so waits poll (MPI_Test,
 * yielding the CPU) and, after the communicator's timeout, hold a roll call on a second
 * duplicate ("side") communicator: the waiting rank asks every other rank how many collectives
 * it has started and waits a grace period (up to 2 s) for the answers. Every rank answers the
 * questions it finds whenever it tests or waits, so a healthy rank answers at once; one that
 * is stopped (SIGSTOP), hung in a computation or dead does not, and the error names it. A
 * rank that answers with a count that shows it never started the collective is named too
 * (it is running, but elsewhere: a different number of steps or of buckets).
 *
 * MPI is started (MPI_Init_thread, MPI_THREAD_MULTIPLE: the thread that runs backward and the
 * progress thread below both call MPI) by the first communicator, unless the program started it, and finalized
 * at em_shutdown() only when this engine started it and nothing was left pending: after a
 * timeout MPI_Finalize would wait for the stalled rank forever.
 */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember/comm.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "engine.h"

enum { TAG_QUERY = 7701, TAG_REPLY = 7702, N_REPLY_SLOTS = 64 };

typedef struct mpi_state {
    MPI_Comm comm, side;
    int rank, size;
    int64_t started;                    /* collectives started on comm */
    bool broken;
    int64_t reply_buf[N_REPLY_SLOTS];   /* the answers in flight (Isend buffers) */
    unsigned reply_next;
    int64_t query_buf;
} mpi_state;

typedef struct mpi_req {
    MPI_Request r;
    em_collective coll;
    uint64_t seq;
    int64_t n;
    em_dtype dt;
    struct mpi_req *prev, *next; /* on g_reqs while nobody has seen it complete */
    bool seen;                   /* complete (or failed: rc) */
    int rc;
    double done_at;              /* CLOCK_MONOTONIC seconds when first seen complete */
} mpi_req;

static bool g_we_started, g_any_broken;

/* The progress thread. Open MPI advances a non-blocking collective only inside MPI calls (a
 * large message moves fragment by fragment), so a bucket started during backward would wait
 * for the next hook. While some request is in flight that nobody has seen complete, this
 * thread tests them (MPI_Test) every 50 us, sleeping between, which runs Open MPI's progress
 * engine and stamps each request's completion time as it happens (mpi_done_at: the time
 * ember/ddp.h reports for a bucket); otherwise it blocks on g_prog_cv and never wakes (a
 * thread that woke every few hundred microseconds to look took ~20% of a CNN step from the
 * backward it shares its rank's core with: bench/ddp.sh). Every MPI_Test of a request, from this thread or the caller's, holds
 * g_req_lock (MPI forbids testing one request from two threads at once), and the first to see
 * it complete records it. Needs MPI_THREAD_MULTIPLE (without it, no thread: collectives then
 * advance at hooks and waits only, and complete when those see them complete). */
static pthread_t g_prog_thread;
static bool g_prog_running;
static bool g_prog_stop; /* (g_req_lock) */
static pthread_mutex_t g_req_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_prog_cv = PTHREAD_COND_INITIALIZER; /* g_reqs became non-empty, or stop */
static mpi_req *g_reqs;       /* the requests nobody has seen complete (g_req_lock) */
static double g_last_done_at; /* of the request test or wait last reported complete */

static double now_s(void);

static void unlink_req(mpi_req *q) {
    if (q->prev) q->prev->next = q->next;
    else if (g_reqs == q) g_reqs = q->next;
    if (q->next) q->next->prev = q->prev;
    q->prev = q->next = NULL;
}

/* MPI_Test of q with g_req_lock held; the first call that finds it complete (or failed)
 * records when, and takes it off the list. */
static int test_locked(mpi_req *q, int *flag) {
    if (q->seen) {
        *flag = 1;
        return q->rc;
    }
    int rc = MPI_Test(&q->r, flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS || *flag) {
        q->seen = true;
        q->rc = rc;
        q->done_at = now_s();
        unlink_req(q);
    }
    return rc;
}

/* The caller's test of q: MPI's return code; on completion (or failure) *flag and the time
 * mpi_done_at reports. */
static int req_test(mpi_req *q, int *flag) {
    pthread_mutex_lock(&g_req_lock);
    int rc = test_locked(q, flag);
    pthread_mutex_unlock(&g_req_lock);
    if (rc != MPI_SUCCESS || *flag) g_last_done_at = q->done_at;
    return rc;
}

static void *progress_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g_req_lock);
    while (!g_prog_stop) {
        if (!g_reqs) {
            pthread_cond_wait(&g_prog_cv, &g_req_lock);
            continue;
        }
        for (mpi_req *q = g_reqs, *nx; q; q = nx) {
            nx = q->next;
            int flag = 0;
            (void)test_locked(q, &flag);
        }
        pthread_mutex_unlock(&g_req_lock);
        /* a short sleep, not a yield: the thread shares its rank's core with backward, and a
         * thread that stays runnable takes a share of it */
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&g_req_lock);
    }
    pthread_mutex_unlock(&g_req_lock);
    return NULL;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char *mpi_msg(int rc, char *buf, int cap) {
    int len = 0;
    if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, (size_t)cap, "error %d", rc);
    return buf;
}

static em_status engine_error(const mpi_state *s, const mpi_req *q, em_collective coll,
                              uint64_t seq, int rc) {
    char m[MPI_MAX_ERROR_STRING];
    mpi_msg(rc, m, sizeof m);
    if (q)
        return em_set_error(EM_ERR_IO, "%s #%llu (%lld %s) on rank %d of %d: MPI: %s",
                            em_collective_name(coll), (unsigned long long)seq, (long long)q->n,
                            em_dtype_name(q->dt), s ? s->rank : -1, s ? s->size : 0, m);
    return em_set_error(EM_ERR_IO, "%s #%llu on rank %d of %d: MPI: %s", em_collective_name(coll),
                        (unsigned long long)seq, s ? s->rank : -1, s ? s->size : 0, m);
}

/* Answer the roll-call questions that arrived (how many collectives this rank started). */
static void serve_queries(mpi_state *s) {
    for (int guard = 0; guard < 4 * s->size; guard++) {
        int flag = 0;
        MPI_Status stt;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, s->side, &flag, &stt) != MPI_SUCCESS || !flag)
            return;
        int64_t q;
        if (MPI_Recv(&q, 1, MPI_INT64_T, stt.MPI_SOURCE, TAG_QUERY, s->side, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS)
            return;
        int64_t *slot = &s->reply_buf[s->reply_next++ % N_REPLY_SLOTS];
        *slot = s->started;
        MPI_Request r;
        if (MPI_Isend(slot, 1, MPI_INT64_T, stt.MPI_SOURCE, TAG_REPLY, s->side, &r) == MPI_SUCCESS)
            MPI_Request_free(&r);
    }
}

static em_status mpi_create(const em_comm_options *opts, void **state, int *rank, int *size) {
    (void)opts;
    int inited = 0, fin = 0, rc;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin)
        return em_set_error(EM_ERR_STATE, "comm_new: mpi: MPI was already finalized in this "
                            "process and cannot start again (create one communicator per "
                            "process, before em_shutdown)");
    if (!inited) {
        int provided = 0;
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            char m[MPI_MAX_ERROR_STRING];
            return em_set_error(EM_ERR_IO, "comm_new: mpi: MPI_Init_thread failed: %s",
                                mpi_msg(rc, m, sizeof m));
        }
        g_we_started = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mpi_state *s = calloc(1, sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "comm_new: mpi: out of memory");
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &s->comm)) != MPI_SUCCESS ||
        (rc = MPI_Comm_dup(MPI_COMM_WORLD, &s->side)) != MPI_SUCCESS) {
        char m[MPI_MAX_ERROR_STRING];
        free(s);
        return em_set_error(EM_ERR_IO, "comm_new: mpi: MPI_Comm_dup failed: %s",
                            mpi_msg(rc, m, sizeof m));
    }
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(s->side, MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->comm, &s->rank);
    MPI_Comm_size(s->comm, &s->size);
    *rank = s->rank;
    *size = s->size;
    *state = s;
    int level = 0;
    MPI_Query_thread(&level);
    if (!g_prog_running && level == MPI_THREAD_MULTIPLE && !getenv("EMBER_MPI_NO_PROGRESS_THREAD")) {
        g_prog_stop = false;
        g_prog_running = pthread_create(&g_prog_thread, NULL, progress_main, NULL) == 0;
    }
    return EM_OK;
}

static void mpi_destroy(void *state) {
    mpi_state *s = state;
    if (!s) return;
    if (!s->broken && !g_any_broken) {
        serve_queries(s);
        MPI_Comm_free(&s->side);
        MPI_Comm_free(&s->comm);
    }
    free(s);
}

static void mpi_finalize(void) {
    if (g_prog_running) {
        pthread_mutex_lock(&g_req_lock);
        g_prog_stop = true;
        pthread_cond_signal(&g_prog_cv);
        pthread_mutex_unlock(&g_req_lock);
        pthread_join(g_prog_thread, NULL);
        g_prog_running = false;
    }
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (g_we_started && inited && !fin && !g_any_broken) MPI_Finalize();
}

static bool mpi_type(em_dtype dt, bool reduce, MPI_Datatype *out) {
    switch (dt) {
    case EM_F32: *out = MPI_FLOAT; return true;
    case EM_F64: *out = MPI_DOUBLE; return true;
    case EM_I32: *out = MPI_INT32_T; return true;
    case EM_I64: *out = MPI_INT64_T; return true;
    case EM_U8: *out = MPI_UINT8_T; return true;
    case EM_F16: case EM_BF16: *out = MPI_UINT16_T; return !reduce; /* moved, not summed */
    case EM_BOOL: *out = MPI_UINT8_T; return !reduce;
    default: return false;
    }
}

static em_status mpi_start(void *state, em_collective coll, uint64_t seq, const em_comm_buf *send,
                           const em_comm_buf *recv, int root, void **req) {
    mpi_state *s = state;
    const char *what = em_collective_name(coll);
    if (s->broken)
        return em_set_error(EM_ERR_STATE, "%s #%llu on rank %d: the mpi communicator is broken",
                            what, (unsigned long long)seq, s->rank);
    MPI_Datatype dt = MPI_BYTE;
    bool reduce = coll == EM_COLL_ALLREDUCE || coll == EM_COLL_REDUCE_SCATTER;
    if (recv) {
        if (recv->device.type != EM_DEVICE_CPU_TYPE || send->device.type != EM_DEVICE_CPU_TYPE)
            return em_set_error(EM_ERR_DEVICE, "%s on rank %d: the mpi communicator handles CPU "
                                "tensors only; this one is on device type %d:%d (copy it to "
                                "the CPU, or use a communicator for that device)", what, s->rank,
                                recv->device.type, recv->device.index);
        if (!mpi_type(recv->dtype, reduce, &dt))
            return em_set_error(EM_ERR_DTYPE, "%s on rank %d: the mpi communicator cannot %s %s "
                                "tensors", what, s->rank, reduce ? "sum" : "move",
                                em_dtype_name(recv->dtype));
        if (send->numel > INT_MAX || recv->numel > INT_MAX)
            return em_set_error(EM_ERR_RANGE, "%s on rank %d: %lld elements are more than one "
                                "MPI call takes (%d); split the tensor", what, s->rank,
                                (long long)(send->numel > recv->numel ? send->numel : recv->numel),
                                INT_MAX);
    }
    mpi_req *q = calloc(1, sizeof *q);
    if (!q) return em_set_error(EM_ERR_NOMEM, "%s: out of memory", what);
    q->coll = coll;
    q->seq = seq;
    q->n = recv ? recv->numel : 0;
    q->dt = recv ? recv->dtype : EM_F32;
    int rc = MPI_SUCCESS;
    switch (coll) {
    case EM_COLL_ALLREDUCE:
        rc = MPI_Iallreduce(send->data == recv->data ? MPI_IN_PLACE : send->data, recv->data,
                            (int)recv->numel, dt, MPI_SUM, s->comm, &q->r);
        break;
    case EM_COLL_BROADCAST:
        rc = MPI_Ibcast(recv->data, (int)recv->numel, dt, root, s->comm, &q->r);
        break;
    case EM_COLL_ALLGATHER:
        rc = MPI_Iallgather(send->data, (int)send->numel, dt, recv->data, (int)send->numel, dt,
                            s->comm, &q->r);
        break;
    case EM_COLL_REDUCE_SCATTER:
        rc = MPI_Ireduce_scatter_block(send->data, recv->data, (int)recv->numel, dt, MPI_SUM,
                                       s->comm, &q->r);
        break;
    case EM_COLL_BARRIER:
        rc = MPI_Ibarrier(s->comm, &q->r);
        break;
    default:
        free(q);
        return em_set_error(EM_ERR_INVALID, "mpi: unknown collective %d", (int)coll);
    }
    if (rc != MPI_SUCCESS) {
        em_status st = engine_error(s, q, coll, seq, rc);
        free(q);
        return st;
    }
    s->started = (int64_t)seq + 1;
    pthread_mutex_lock(&g_req_lock);
    q->next = g_reqs;
    if (g_reqs) g_reqs->prev = q;
    g_reqs = q;
    pthread_cond_signal(&g_prog_cv);
    pthread_mutex_unlock(&g_req_lock);
    *req = q;
    return EM_OK;
}

static em_status mpi_test(void *state, void *req, bool *done) {
    mpi_state *s = state;
    mpi_req *q = req;
    int flag = 0;
    int rc = req_test(q, &flag);
    serve_queries(s);
    if (rc != MPI_SUCCESS) {
        em_status st = engine_error(s, q, q->coll, q->seq, rc);
        s->broken = g_any_broken = true;
        free(q);
        return st;
    }
    *done = flag != 0;
    if (flag) {
        free(q);
    }
    return EM_OK;
}

/* After the timeout: ask every other rank how far it got; name who did not answer or never
 * started the collective. Returns EM_OK when the collective completed meanwhile. */
static em_status roll_call(mpi_state *s, mpi_req *q, double timeout_s) {
    int n = s->size;
    bool *answered = calloc((size_t)n, sizeof *answered);
    int64_t *count = calloc((size_t)n, sizeof *count);
    if (!answered || !count) {
        free(answered);
        free(count);
        return em_set_error(EM_ERR_NOMEM, "%s: out of memory", em_collective_name(q->coll));
    }
    s->query_buf = (int64_t)q->seq;
    for (int r = 0; r < n; r++) {
        if (r == s->rank) continue;
        MPI_Request rq;
        if (MPI_Isend(&s->query_buf, 1, MPI_INT64_T, r, TAG_QUERY, s->side, &rq) == MPI_SUCCESS)
            MPI_Request_free(&rq);
    }
    double grace = timeout_s < 2.0 ? timeout_s : 2.0, t0 = now_s();
    int left = n - 1, flag = 0;
    while (left > 0 && now_s() - t0 < grace) {
        if (req_test(q, &flag) == MPI_SUCCESS && flag) break;
        serve_queries(s);
        MPI_Status stt;
        int got = 0;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_REPLY, s->side, &got, &stt) == MPI_SUCCESS && got) {
            int64_t v;
            if (MPI_Recv(&v, 1, MPI_INT64_T, stt.MPI_SOURCE, TAG_REPLY, s->side,
                         MPI_STATUS_IGNORE) == MPI_SUCCESS &&
                !answered[stt.MPI_SOURCE]) {
                answered[stt.MPI_SOURCE] = true;
                count[stt.MPI_SOURCE] = v;
                left--;
            }
        } else {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
    if (flag) { /* it completed after all */
        free(answered);
        free(count);
        free(q);
        return EM_OK;
    }
    char who[1024] = "";
    size_t len = 0;
    int stalled = 0, behind = 0;
    for (int r = 0; r < n && len < sizeof who - 160; r++) {
        if (r == s->rank) continue;
        if (!answered[r]) {
            len += (size_t)snprintf(who + len, sizeof who - len, "%srank %d is stalled (no answer "
                                    "within %.0f s: stopped, hung or dead)", len ? "; " : "", r,
                                    grace);
            stalled++;
        } else if (count[r] <= (int64_t)q->seq) {
            len += (size_t)snprintf(who + len, sizeof who - len, "%srank %d has not started it "
                                    "(it started %lld collectives: a different number of "
                                    "steps or buckets?)", len ? "; " : "", r, (long long)count[r]);
            behind++;
        }
    }
    if (!stalled && !behind)
        snprintf(who, sizeof who, "every rank answered and started it; MPI did not complete it");
    em_status st = em_set_error(EM_ERR_IO, "%s #%llu (%lld %s) on rank %d of %d did not complete "
                                "within %g s: %s", em_collective_name(q->coll),
                                (unsigned long long)q->seq, (long long)q->n, em_dtype_name(q->dt),
                                s->rank, n, timeout_s, who);
    free(answered);
    free(count);
    /* The request stays pending inside MPI; its memory is left to the process's exit. */
    s->broken = g_any_broken = true;
    return st;
}

static em_status mpi_wait(void *state, void *req, double timeout_s) {
    mpi_state *s = state;
    mpi_req *q = req;
    double t0 = now_s();
    for (unsigned spin = 0;; spin++) {
        int flag = 0;
        int rc = req_test(q, &flag);
        if (rc != MPI_SUCCESS) {
            em_status st = engine_error(s, q, q->coll, q->seq, rc);
            s->broken = g_any_broken = true;
            free(q);
            return st;
        }
        if (flag) {
            free(q);
            return EM_OK;
        }
        serve_queries(s);
        double waited = (spin & 63) == 0 ? now_s() - t0 : 0;
        if (waited > timeout_s) return roll_call(s, q, timeout_s);
        /* MPI progresses only inside its calls (a large message moves fragment by fragment),
         * so poll without sleeping, yielding the core to other ranks that share it; after a
         * second of waiting (a slow rank) poll every millisecond. */
        if (waited < 1.0) {
            sched_yield();
        } else {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
}

static double mpi_done_at(void *state) {
    (void)state;
    return g_last_done_at;
}

static const em_mpi_engine engine = {
    .struct_size = sizeof(em_mpi_engine),
    .cls = {.struct_size = sizeof(em_comm_class), .name = "mpi",
            .description = "Open MPI between processes and hosts (CPU tensors)",
            .create = mpi_create, .destroy = mpi_destroy, .start = mpi_start, .test = mpi_test,
            .wait = mpi_wait, .done_at = mpi_done_at},
    .finalize = mpi_finalize,
};

__attribute__((visibility("default"))) const em_mpi_engine *ember_mpi_engine(void);
const em_mpi_engine *ember_mpi_engine(void) { return &engine; }
