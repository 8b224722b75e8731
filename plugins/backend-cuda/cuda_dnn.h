/*
 * cuda_dnn.h — what cuda_dnn.c (cuDNN's loading and each context's cuDNN state) and cuda_conv.c
 * (the convolutions on cuDNN's graph API) share. Private to the CUDA plugin.
 */
#ifndef EMBER_CUDA_DNN_H
#define EMBER_CUDA_DNN_H

#include <pthread.h>

#include "cuda_internal.h"

/* One execution context's cuDNN state (cuda_exec.dnn): a handle bound to the context's stream
 * and the convolution plans built with it, one per shape (cuda_conv.c). Kernels of one stream
 * may run on several threads: `lock` guards the plan list and every use of the handle. */
typedef struct cuda_dnn_ctx {
    pthread_mutex_t lock;
    int device;
    cudnnHandle_t handle;
    struct cuda_conv_plan *plans; /* a list, newest first; freed with the context */
} cuda_dnn_ctx;

/* k's context's cuDNN state, made (handle created, bound to the stream) on first use. */
em_status cuda_dnn_ctx_of(const em_kernel_ctx *k, cuda_dnn_ctx **out /* out */);
/* Free the plans of d (cuda_conv.c). */
void cuda_conv_plans_free(cuda_dnn_ctx *d);

#endif /* EMBER_CUDA_DNN_H */
