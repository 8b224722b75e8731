/*
 * comm.c — communicators (ember/comm.h): the "communicator" class kind, and the calls that
 * check a collective's tensors, hand raw buffers to the class (an engine such as Open MPI in
 * ember-mpi.so) and finish the reduction (the average) on the tensors' own device.
 *
 * A communicator is broken once a wait failed (a timeout, or the engine's error): a
 * collective left pending cannot be cancelled portably, so every later call fails at once
 * with the first error, and em_comm_free does not ask the engine to leave the job cleanly
 * (the class's destroy is told, and must not block).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember/autograd.h"
#include "ember/comm.h"
#include "ember/ops.h"
#include "ember/plugin.h"
#include "data_internal.h"
#include "internal.h"

struct em_comm {
    const em_comm_class *cls; /* the registry's copy */
    void *state;
    int rank, size;
    double timeout_s;
    uint64_t seq;             /* collectives started */
    bool broken;
    char why[512];            /* the error that broke it */
};

struct em_comm_work {
    em_comm *c;
    void *req;
    em_collective coll;
    em_reduce_op op;
    uint64_t seq;
    em_tensor *a, *b; /* held: the result tensor, and the input when distinct */
    bool done;
    double done_s;    /* CLOCK_MONOTONIC seconds it completed (the class's done_at) */
};

const char *em_collective_name(em_collective c) {
    switch (c) {
    case EM_COLL_ALLREDUCE: return "allreduce";
    case EM_COLL_BROADCAST: return "broadcast";
    case EM_COLL_ALLGATHER: return "allgather";
    case EM_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case EM_COLL_BARRIER: return "barrier";
    }
    return "?";
}

em_status em__comm_class_check(const void *record, const char *who) {
    const em_comm_class *c = record;
    if (!em__class_name_ok(c->name))
        return em_set_error(EM_ERR_INVALID, "%s: communicator class name '%s' is not "
                            "[a-z][a-z0-9_-]*", who, c->name ? c->name : "(null)");
    const char *missing = !c->create ? "create" : !c->destroy ? "destroy" : !c->start ? "start"
                        : !c->test ? "test" : !c->wait ? "wait" : NULL;
    if (missing)
        return em_set_error(EM_ERR_INVALID, "%s: communicator class '%s' lacks a %s function",
                            who, c->name, missing);
    return EM_OK;
}

em_status em_comm_class_register(em_registry *reg, const em_comm_class *cls) {
    return em__class_register(reg, EM_COMM_KIND, cls, "comm_class_register");
}

em_comm *em_comm_new(const char *class_name, const em_comm_options *opts) {
    em_comm_options o = {.struct_size = sizeof o};
    if (opts && EM__STRUCT_READ(em_comm_options, &o, opts, offsetof(em_comm_options, ext),
                                "comm_new") != EM_OK)
        return NULL;
    if (o.timeout_s < 0) {
        em_set_error(EM_ERR_INVALID, "comm_new: timeout_s %g is negative", o.timeout_s);
        return NULL;
    }
    if (o.timeout_s == 0) {
        const char *env = getenv("EMBER_COMM_TIMEOUT");
        char *end = NULL;
        double v = env && *env ? strtod(env, &end) : 0;
        if (env && *env && (!end || *end || v <= 0)) {
            em_set_error(EM_ERR_INVALID, "comm_new: EMBER_COMM_TIMEOUT='%s' is not a positive "
                         "number of seconds", env);
            return NULL;
        }
        o.timeout_s = v > 0 ? v : 300.0;
    }
    const em_comm_class *cls = em__class_find(EM_COMM_KIND, class_name, NULL);
    if (!cls) return NULL;
    em_comm *c = em__calloc(1, sizeof *c, "communicator");
    if (!c) return NULL;
    c->cls = cls;
    c->timeout_s = o.timeout_s;
    em_status st = cls->create(&o, &c->state, &c->rank, &c->size);
    if (st != EM_OK) {
        if (!em__error_pending())
            em_set_error(st, "comm_new: communicator '%s' could not start", cls->name);
        em__free(c);
        return NULL;
    }
    if (c->size < 1 || c->rank < 0 || c->rank >= c->size) {
        cls->destroy(c->state);
        em__free(c);
        em_set_error(EM_ERR_INTERNAL, "comm_new: communicator '%s' reported rank %d of %d",
                     cls->name, c->rank, c->size);
        return NULL;
    }
    return c;
}

void em_comm_free(em_comm *c) {
    if (!c) return;
    c->cls->destroy(c->state);
    em__free(c);
}

int em_comm_rank(const em_comm *c) { return c ? c->rank : -1; }
int em_comm_size(const em_comm *c) { return c ? c->size : 0; }
double em_comm_timeout(const em_comm *c) { return c ? c->timeout_s : 0; }
const char *em_comm_class_name(const em_comm *c) { return c ? c->cls->name : NULL; }

static em_status broken_error(const em_comm *c, const char *what) {
    return em_set_error(EM_ERR_STATE, "%s on rank %d: the communicator is broken by an earlier "
                        "failure: %s", what, c->rank, c->why);
}

static em_status tensor_check(const em_comm *c, const char *what, const em_tensor *t,
                              const char *arg) {
    if (!t)
        return em__error_pending() ? em_last_status()
                                   : em_set_error(EM_ERR_INVALID, "%s: NULL %s", what, arg);
    if (!em_tensor_is_contiguous(t))
        return em_set_error(EM_ERR_INVALID, "%s on rank %d: the %s tensor is not contiguous "
                            "(em_contiguous() it first)", what, c->rank, arg);
    return EM_OK;
}

static em_comm_buf buf_of(const em_tensor *t) {
    em_comm_buf b = {.struct_size = sizeof b};
    if (t) {
        b.data = em_tensor_data(t);
        b.numel = em_tensor_numel(t);
        b.dtype = em_tensor_dtype(t);
        b.device = em_tensor_device(t);
    }
    return b;
}

static em_comm_work *start(em_comm *c, em_collective coll, em_tensor *out, const em_tensor *in,
                           int root, em_reduce_op op) {
    const char *what = em_collective_name(coll);
    if (!c) {
        em_set_error(EM_ERR_INVALID, "%s: NULL communicator", what);
        return NULL;
    }
    if (c->broken) {
        broken_error(c, what);
        return NULL;
    }
    if (coll != EM_COLL_BARRIER) {
        if (tensor_check(c, what, out, in && in != out ? "output" : "") != EM_OK ||
            (in && tensor_check(c, what, in, "input") != EM_OK))
            return NULL;
        if (op == EM_REDUCE_AVG && !em_dtype_is_floating(em_tensor_dtype(out))) {
            em_set_error(EM_ERR_DTYPE, "%s on rank %d: an average needs a floating tensor, not "
                         "%s (use EM_REDUCE_SUM)", what, c->rank,
                         em_dtype_name(em_tensor_dtype(out)));
            return NULL;
        }
        if (op != EM_REDUCE_SUM && op != EM_REDUCE_AVG) {
            em_set_error(EM_ERR_INVALID, "%s: unknown reduce op %d", what, (int)op);
            return NULL;
        }
    }
    if (in && in != out) {
        int64_t ni = em_tensor_numel(in), no = em_tensor_numel(out);
        bool ok = em_tensor_dtype(in) == em_tensor_dtype(out) &&
                  em_tensor_device(in).type == em_tensor_device(out).type &&
                  em_tensor_device(in).index == em_tensor_device(out).index &&
                  (coll == EM_COLL_ALLGATHER ? no == ni * c->size : ni == no * c->size);
        if (!ok) {
            em_set_error(EM_ERR_SHAPE, "%s on rank %d: input of %lld %s and output of %lld %s: "
                         "the output needs %s the input's elements, same dtype and device",
                         what, c->rank, (long long)ni, em_dtype_name(em_tensor_dtype(in)),
                         (long long)no, em_dtype_name(em_tensor_dtype(out)),
                         coll == EM_COLL_ALLGATHER ? "world size times" : "1 / world size of");
            return NULL;
        }
    }
    if (root < 0 || root >= c->size) {
        em_set_error(EM_ERR_RANGE, "%s: root %d is not a rank of %d", what, root, c->size);
        return NULL;
    }
    em_comm_work *w = em__calloc(1, sizeof *w, "communicator work");
    if (!w) return NULL;
    w->c = c;
    w->coll = coll;
    w->op = op;
    w->seq = c->seq++;
    em_comm_buf sb = buf_of(in ? in : out), rb = buf_of(out);
    em_status st = c->cls->start(c->state, coll, w->seq, coll == EM_COLL_BARRIER ? NULL : &sb,
                                 coll == EM_COLL_BARRIER ? NULL : &rb, root, &w->req);
    if (st != EM_OK) {
        if (!em__error_pending())
            em_set_error(st, "%s #%llu on rank %d: the communicator failed to start it", what,
                         (unsigned long long)w->seq, c->rank);
        em__free(w);
        return NULL;
    }
    w->a = out ? em_tensor_retain(out) : NULL;
    w->b = in && in != out ? em_tensor_retain((em_tensor *)in) : NULL;
    return w;
}

em_comm_work *em_comm_allreduce(em_comm *c, em_tensor *t, em_reduce_op op) {
    return start(c, EM_COLL_ALLREDUCE, t, NULL, 0, op);
}

em_comm_work *em_comm_broadcast(em_comm *c, em_tensor *t, int root) {
    return start(c, EM_COLL_BROADCAST, t, NULL, root, EM_REDUCE_SUM);
}

em_comm_work *em_comm_allgather(em_comm *c, em_tensor *out, const em_tensor *in) {
    return start(c, EM_COLL_ALLGATHER, out, in, 0, EM_REDUCE_SUM);
}

em_comm_work *em_comm_reduce_scatter(em_comm *c, em_tensor *out, const em_tensor *in,
                                     em_reduce_op op) {
    return start(c, EM_COLL_REDUCE_SCATTER, out, in, 0, op);
}

em_comm_work *em_comm_barrier(em_comm *c) {
    return start(c, EM_COLL_BARRIER, NULL, NULL, 0, EM_REDUCE_SUM);
}

static void work_free(em_comm_work *w) {
    em_tensor_release(w->a);
    em_tensor_release(w->b);
    em__free(w);
}

static em_status finish(em_comm_work *w) {
    em_status st = EM_OK;
    if (w->a) {
        em_tensor_bump_version(w->a);
        if (w->op == EM_REDUCE_AVG && w->c->size > 1) {
            em_grad_mode_push(EM_GRAD_DISABLED);
            st = em_div_scalar_(w->a, (double)w->c->size);
            em_grad_mode_pop();
        }
    }
    work_free(w);
    return st;
}

static em_status fail(em_comm_work *w, em_status st) {
    em_comm *c = w->c;
    if (!em__error_pending())
        em_set_error(st, "%s #%llu on rank %d of %d failed", em_collective_name(w->coll),
                     (unsigned long long)w->seq, c->rank, c->size);
    c->broken = true;
    snprintf(c->why, sizeof c->why, "%s", em_last_error());
    work_free(w);
    return st;
}

/* When the class saw w's request complete (right after its test or wait said so). */
static double completion_time(const em_comm *c) {
    if (c->cls->done_at) return c->cls->done_at(c->state);
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

em_status em__comm_wait_at(em_comm_work *w, double *done_s) {
    if (done_s) *done_s = -1;
    if (!w) return em__error_pending() ? em_last_status()
                                       : em_set_error(EM_ERR_INVALID, "comm_wait: NULL work");
    if (w->done) {
        if (done_s) *done_s = w->done_s;
        return finish(w);
    }
    if (w->c->broken) { /* the class's request may be gone with the failure */
        em_status st = broken_error(w->c, em_collective_name(w->coll));
        work_free(w);
        return st;
    }
    em_status st = w->c->cls->wait(w->c->state, w->req, w->c->timeout_s);
    if (st == EM_OK && done_s) *done_s = completion_time(w->c);
    return st == EM_OK ? finish(w) : fail(w, st);
}

em_status em_comm_wait(em_comm_work *w) { return em__comm_wait_at(w, NULL); }

double em__comm_work_done_s(const em_comm_work *w) { return w && w->done ? w->done_s : -1; }

em_status em_comm_test(em_comm_work *w, bool *done) {
    if (!w || !done) return em_set_error(EM_ERR_INVALID, "comm_test: NULL work or out");
    if (!w->done) {
        bool d = false;
        em_status st = w->c->cls->test(w->c->state, w->req, &d);
        if (st != EM_OK) {
            /* The request is gone; the wait reports the error again. */
            w->c->broken = true;
            snprintf(w->c->why, sizeof w->c->why, "%s", em_last_error());
            return st;
        }
        w->done = d;
        if (d) w->done_s = completion_time(w->c);
    }
    *done = w->done;
    return EM_OK;
}
