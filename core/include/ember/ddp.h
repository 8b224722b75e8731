/*
 * ember/ddp.h — data-parallel training (PyTorch's DistributedDataParallel) on a communicator
 * (ember/comm.h): N processes, each with a replica of the model and its own slice of every
 * batch, train the model of one process with an N-times larger batch.
 *
 *     em_comm *c = em_comm_new("mpi", NULL);               // mpirun -np N ./train
 *     em_ddp *d = em_ddp_wrap(model, c, NULL);             // rank 0's weights everywhere
 *     for (int step = 0; step < steps; step++) {
 *         em_scope_begin();
 *         em_tensor *x = ..., *y = ...;                    // this rank's slice of the batch
 *         em_tensor *loss = em_module_forward_n(lossfn, (em_tensor *[]){
 *                                em_ddp_forward(d, x), y}, 2);
 *         em_backward(loss);                               // buckets' allreduces start here
 *         em_ddp_wait(d);                                  // grads: the average over ranks
 *         em_optimizer_step(opt);                          // unchanged
 *         em_optimizer_zero_grad(opt);
 *         em_scope_end();
 *     }
 *     em_ddp_free(d);                                      // before the model and c
 *
 * How. Wrapping checks that every rank has the same parameter and buffer names, shapes and
 * dtypes (a mismatch is an error on every rank naming the first differing entry of each side)
 * and broadcasts parameters and buffers from rank 0. The trainable parameters are put in
 * buckets in reverse registration order (the order backward produces their gradients): the
 * first bucket holds first_bucket_bytes, the others bucket_bytes, as PyTorch's (2.x): 1 MiB
 * and 25 MiB by default, and bucket_bytes for the first too when only bucket_bytes is set
 * (bucket_cap_mb given). A post-accumulation hook (ember/autograd.h) on each parameter copies its finished
 * gradient into its bucket; a full bucket's allreduce starts at once, while backward goes on,
 * in bucket order (a bucket that fills early waits for the ones before it), so every rank
 * starts the same collectives in the same order. em_ddp_wait starts what is left, waits for
 * everything and writes the averaged gradients back into each parameter's .grad. Every
 * forward in training mode broadcasts the buffers (BatchNorm's running statistics) from
 * rank 0 first, so they follow rank 0.
 *
 * Accumulation: between em_ddp_no_sync_begin and _end, backward only accumulates locally;
 * the next synchronised backward reduces the accumulated gradients (PyTorch's no_sync()).
 *
 * Unused parameters: a trainable parameter that got no gradient in a synchronised backward
 * makes em_ddp_wait fail, naming it (on every rank where it is unused), unless
 * find_unused_parameters is set: then its gradient counts as zero (or what it accumulated
 * under no_sync). Every rank must then still start the same buckets; they do.
 *
 * Rules: move the model to its device and dtype before wrapping (the hooks sit on the
 * tensors); the model and the communicator must outlive the wrapper; one backward per
 * em_ddp_wait outside no_sync (a second one is an error naming the parameter). Non-persistent
 * buffers are neither checked nor broadcast.
 *
 * The em_ddp_* functions are new in EMBER_1.1.
 */
#ifndef EMBER_DDP_H
#define EMBER_DDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/comm.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/module.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_ddp em_ddp;

typedef struct em_ddp_options {
    size_t struct_size;          /* sizeof(em_ddp_options) */
    int64_t bucket_bytes;        /* 0: 25 MiB (PyTorch's bucket_cap_mb) */
    int64_t first_bucket_bytes;  /* 0: 1 MiB with the default bucket_bytes, else bucket_bytes;
                                  * larger than bucket_bytes: bucket_bytes */
    bool find_unused_parameters; /* a parameter without a gradient counts as zero */
    void *ext;                   /* reserved; NULL */
} em_ddp_options;

/* Wrap m (borrowed: it and c must outlive the result) for data-parallel training on c.
 * Collective: every rank calls it. NULL with the error on a mismatch between ranks, a
 * communicator failure, or bad options. */
EM_API em_ddp *em_ddp_wrap(em_module *m, em_comm *c, const em_ddp_options *opts);
/* Remove the hooks and free the buckets (waiting for any collective still in flight). NULL
 * is a no-op. */
EM_API void em_ddp_free(em_ddp *d);
EM_API em_module *em_ddp_module(const em_ddp *d);
EM_API em_comm *em_ddp_comm(const em_ddp *d);

/* The module's forward (em_module_forward_n), after broadcasting its buffers from rank 0 in
 * training mode; SyncBatchNorm layers reduce their statistics over c during it. A forward
 * while the previous synchronised backward was not waited for is EM_ERR_STATE. New
 * reference. */
EM_API em_tensor *em_ddp_forward(em_ddp *d, const em_tensor *x);
EM_API em_tensor *em_ddp_forward_n(em_ddp *d, em_tensor *const *in, int n_in);
/* em_ddp_forward_n with a padding mask (em_module_forward_masked, ember/module.h; NULL: none),
 * borrowed for the call. New reference. */
EM_API em_tensor *em_ddp_forward_masked(em_ddp *d, em_tensor *const *in, int n_in,
                                        em_tensor *mask);

/* After backward, before the optimizer step: start the buckets not started yet, wait for all
 * of them and put the average over ranks into every trainable parameter's .grad. EM_OK at
 * once under no_sync or when no backward ran. Errors: an unused parameter (named), the
 * communicator's (a stalled rank is named after its timeout). */
EM_API em_status em_ddp_wait(em_ddp *d);

/* Accumulate locally: backward passes between begin and end start no collective
 * (PyTorch's no_sync()). Regions do not nest: EM_ERR_STATE. */
EM_API em_status em_ddp_no_sync_begin(em_ddp *d);
EM_API em_status em_ddp_no_sync_end(em_ddp *d);

/* Broadcast the module's persistent buffers from rank 0 now (collective), e.g. before
 * evaluating or saving, so every rank holds rank 0's running statistics. */
EM_API em_status em_ddp_broadcast_buffers(em_ddp *d);

/* The communicator of the em_ddp_forward running on this thread, or NULL (SyncBatchNorm
 * reduces over it). */
EM_API em_comm *em_ddp_current_comm(void);

/* Replace every BatchNorm1d and BatchNorm2d module under m (at any depth) by a SyncBatchNorm
 * with the same options, parameters and buffers (torch.nn.SyncBatchNorm.convert_sync_batchnorm).
 * Call it before em_ddp_wrap. *count (may be NULL) receives how many were replaced.
 * SyncBatchNorm (ember-layers) normalises a training batch by the mean and variance of the
 * batches of every rank together, reduced over em_ddp_current_comm() in forward and backward:
 * the same as BatchNorm on the concatenated batch. */
EM_API em_status em_ddp_convert_sync_batchnorm(em_module *m, int *count /* out */);

/* Buckets, for reports and bench/ddp. Times are seconds since the last synchronised forward
 * began; -1 when it did not happen. */
typedef struct em_ddp_bucket_info {
    size_t struct_size;          /* set by the caller: sizeof(em_ddp_bucket_info) */
    int n_params;
    int64_t bytes;
    double launch_s;             /* its allreduce started */
    double done_s;               /* it was seen complete (a test during backward, or the wait) */
    void *ext;
} em_ddp_bucket_info;
EM_API int em_ddp_bucket_count(const em_ddp *d);
/* Bucket i (0: the one holding the last parameters, started first); EM_ERR_RANGE past the
 * end. */
EM_API em_status em_ddp_bucket_get(const em_ddp *d, int i, em_ddp_bucket_info *out /* out */);
/* When the last em_ddp_wait began (the end of backward) and how long it blocked, seconds. */
EM_API em_status em_ddp_last_wait(const em_ddp *d, double *begin_s /* out */,
                                  double *blocked_s /* out */);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_DDP_H */
