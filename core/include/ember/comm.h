/*
 * ember/comm.h — communicators: collectives between the processes of a job, the
 * "communicator" kind of the class registry (ember/plugin.h).
 *
 * A communicator class is an existing communication engine behind a small table (the first
 * is "mpi", plugins/dist-mpi, ember-mpi.so, on Open MPI). Ember ships no transport of its
 * own. A program creates one communicator per job and runs collectives on tensors; each
 * collective is asynchronous and returns a handle to wait on, so data-parallel training
 * (ember/ddp.h) overlaps the gradient allreduce with the rest of backward.
 *
 *     em_comm *c = em_comm_new("mpi", NULL);          // MPI starts here (mpirun -np N ...)
 *     if (!c) { fprintf(stderr, "%s\n", em_last_error()); return 1; }
 *     printf("rank %d of %d\n", em_comm_rank(c), em_comm_size(c));
 *     em_comm_work *w = em_comm_allreduce(c, grad, EM_REDUCE_AVG);  // in place, started
 *     ...                                                            // other work meanwhile
 *     if (em_comm_wait(w) != EM_OK) fprintf(stderr, "%s\n", em_last_error());
 *     em_comm_free(c);
 *
 * Every rank must start the same collectives, on tensors of the same shape and dtype, in the
 * same order (as with MPI). Tensors must be contiguous and stay alive until the wait (the
 * handle holds a reference). Collectives run on the tensors' device; a class that cannot
 * reach a device (ember-mpi: CPU tensors only) refuses it with an error naming the device.
 *
 * Errors. A failure of the engine is EM_ERR_IO with a message naming the collective, its
 * sequence number, the rank and the engine's own message ("allreduce #12 (4096 float32) on
 * rank 1 of 2: MPI_ERR_TRUNCATE: message truncated"). A collective that does not complete
 * within the communicator's timeout (em_comm_options.timeout_s, default 300 s) is EM_ERR_IO
 * naming the collective and the ranks that did not reach it ("... rank 1 is stalled: it did
 * not answer within 2 s"); the communicator is then broken (every later call fails at once)
 * and the program should exit non-zero: the engine cannot be shut down cleanly while a
 * collective is pending, so em_shutdown() then leaves it as it is.
 *
 * The em_comm_* functions are new in EMBER_1.1.
 */
#ifndef EMBER_COMM_H
#define EMBER_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The name of the class kind (em_class_find(EM_COMM_KIND, "mpi")). */
#define EM_COMM_KIND "communicator"

typedef struct em_comm em_comm;
typedef struct em_comm_work em_comm_work;

typedef enum em_reduce_op {
    EM_REDUCE_SUM = 0,
    EM_REDUCE_AVG = 1, /* the sum divided by the world size (floating dtypes only) */
} em_reduce_op;

/* The collectives, as a class's start() receives them (values are ABI). */
typedef enum em_collective {
    EM_COLL_ALLREDUCE = 0,      /* recv = sum of every rank's send (recv may be send) */
    EM_COLL_BROADCAST = 1,      /* recv (== send) on every rank = root's */
    EM_COLL_ALLGATHER = 2,      /* recv (size * n) = every rank's send (n), in rank order */
    EM_COLL_REDUCE_SCATTER = 3, /* recv (n) = rank's block of the sum of the sends (size * n) */
    EM_COLL_BARRIER = 4,        /* no buffers */
} em_collective;

/* "allreduce", "broadcast", ...; "?" for an unknown value. */
EM_API const char *em_collective_name(em_collective c);

/* A buffer as a class sees it: contiguous elements in device memory. */
typedef struct em_comm_buf {
    size_t struct_size; /* sizeof(em_comm_buf) */
    void *data;         /* the first element (NULL for a barrier) */
    int64_t numel;
    em_dtype dtype;
    em_device device;
    void *ext;          /* reserved; NULL */
} em_comm_buf;

typedef struct em_comm_options {
    size_t struct_size; /* sizeof(em_comm_options) */
    /* A collective not complete after this many seconds fails, naming the ranks that did not
     * reach it. 0: EMBER_COMM_TIMEOUT from the environment, else 300 (5 minutes). */
    double timeout_s;
    void *ext;          /* reserved; NULL */
} em_comm_options;

/* A communicator class: what a plugin registers into the "communicator" kind. */
typedef struct em_comm_class {
    size_t struct_size;      /* sizeof(em_comm_class) */
    const char *name;        /* "mpi" */
    const char *description; /* one line */
    /* Join the job (this is where an engine starts: never at registration) and say where
     * this process stands in it. *state is the class's, passed to every other slot. */
    em_status (*create)(const em_comm_options *opts, void **state /* out */,
                        int *rank /* out */, int *size /* out */);
    /* Leave the job; pending work was waited for (or the communicator is broken, and the
     * class must not block). */
    void (*destroy)(void *state);
    /* Start a collective (seq counts this communicator's collectives from 0, the same on
     * every rank, for messages). send/recv are NULL for a barrier. *req receives the class's
     * handle. Errors name the collective, seq and the rank (em_set_error). */
    em_status (*start)(void *state, em_collective coll, uint64_t seq, const em_comm_buf *send,
                       const em_comm_buf *recv, int root, void **req /* out */);
    /* Whether req completed; *done true frees req. Drives the engine's progress. */
    em_status (*test)(void *state, void *req, bool *done /* out */);
    /* Block until req completes (req is freed) or timeout_s pass: then fail naming the ranks
     * that did not reach the collective. */
    em_status (*wait)(void *state, void *req, double timeout_s);
    /* Optional (NULL: the time of the test or wait that saw it). When the request that test
     * or wait last reported complete had completed, in CLOCK_MONOTONIC seconds, as the engine
     * first saw it: an engine whose progress thread sees completions before the caller tests
     * says so here, and ember/ddp.h's bucket timings use it. */
    double (*done_at)(void *state);
    void *ext;               /* reserved; NULL */
} em_comm_class;

/* Register a communicator class (from a plugin's register function). The record is copied.
 * EM_ERR_EXISTS for a taken name; EM_ERR_INVALID for a record without create, destroy,
 * start, test or wait. */
EM_API em_status em_comm_class_register(em_registry *reg, const em_comm_class *cls);

/* Create a communicator of a registered class (opts may be NULL). NULL with EM_ERR_NOTFOUND
 * listing the classes, or the class's error (the engine could not start). The caller frees
 * it with em_comm_free, after waiting for its work. */
EM_API em_comm *em_comm_new(const char *class_name, const em_comm_options *opts);
/* Leave the job. NULL is a no-op. */
EM_API void em_comm_free(em_comm *c);
EM_API int em_comm_rank(const em_comm *c);
EM_API int em_comm_size(const em_comm *c);
/* The timeout in seconds collectives wait. */
EM_API double em_comm_timeout(const em_comm *c);
/* The class's name ("mpi"). */
EM_API const char *em_comm_class_name(const em_comm *c);

/* Collectives. Each starts the operation and returns a handle (NULL with the error set, the
 * tensors untouched); em_comm_wait consumes it. Tensors are borrowed by the call and held by
 * the handle until the wait. */
/* t (any shape) becomes the sum (or the average) of every rank's t, in place. */
EM_API em_comm_work *em_comm_allreduce(em_comm *c, em_tensor *t, em_reduce_op op);
/* t becomes root's t on every rank. */
EM_API em_comm_work *em_comm_broadcast(em_comm *c, em_tensor *t, int root);
/* out (size * numel(in) elements, in's dtype) = every rank's in, in rank order. */
EM_API em_comm_work *em_comm_allgather(em_comm *c, em_tensor *out, const em_tensor *in);
/* out (numel(in) / size elements) = this rank's block of the sum (or average) of every
 * rank's in. */
EM_API em_comm_work *em_comm_reduce_scatter(em_comm *c, em_tensor *out, const em_tensor *in,
                                            em_reduce_op op);
/* Completes when every rank started it. */
EM_API em_comm_work *em_comm_barrier(em_comm *c);

/* Wait for w and free it: EM_OK, or the error (engine failure, timeout). NULL: the status
 * of the call that returned NULL (so em_comm_wait(em_comm_allreduce(...)) is checked once). */
EM_API em_status em_comm_wait(em_comm_work *w);
/* Whether w completed (without blocking; drives the engine's progress). A completed w must
 * still be passed to em_comm_wait. */
EM_API em_status em_comm_test(em_comm_work *w, bool *done /* out */);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_COMM_H */
