/*
 * cuda_internal.h — what the CUDA backend's files share (C and CUDA C++ alike): the
 * per-(device, stream) execution context behind em_kernel_ctx.exec->backend, the stream a
 * kernel runs on, checked CUDA calls and launches, the dlopen()ed cuBLAS/cuBLASLt and cuDNN
 * function tables, and the kernel families' registration hook.
 *
 * A kernel file (.cu) looks like
 *
 *     static em_status k_relu_f32(const em_kernel_ctx *k) {
 *         cudaStream_t s = cuda_stream_of(k);          // also makes k's device current
 *         relu<<<blocks, 256, 0, s>>>(...);
 *         return cuda_check_launch(k, "relu");         // names op, device, CUDA's message
 *     }
 *
 * and its register function is listed in cuda_kernels.c (cuda_register_kernels).
 *
 * Never included by the core: CUDA exists only inside this plugin.
 */
#ifndef EMBER_CUDA_INTERNAL_H
#define EMBER_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- streams and execution contexts ------------------------------------------------------- */

/* The backend's em_stream: a CUDA stream of one device. NULL (the core's default stream) is
 * CUDA's legacy default stream (0), which orders itself with every other stream of the
 * device, as em_device_ops requires. */
struct em_stream {
    cudaStream_t s;
    int index; /* the device ordinal it was created on */
};

/* The execution context of one (device, stream): em_kernel_ctx.exec->backend. Made by the
 * device's context_create on the first kernel call on that stream, freed when the stream is
 * freed or the plugin unloads. Kernels of one stream may run on several threads at once: the
 * handles are only used with `stream`, which cuBLAS allows. */
typedef struct cuda_exec {
    int device;                 /* the CUDA ordinal (as the core numbers them: cuda:N) */
    cudaStream_t stream;        /* what the kernels of this context launch on */
    cublasHandle_t blas;        /* bound to `stream`, workspace set, TF32 per the setting */
    cublasLtHandle_t lt;
    void *workspace;            /* device memory for cuBLAS (set on `blas`) and for cuBLASLt
                                   matmuls on this stream (pass it to cublasLtMatmul) */
    size_t workspace_size;      /* bytes (EMBER_CUDA_WORKSPACE_MB, default 32) */
    void *ext;                  /* reserved; NULL */
    struct cuda_dnn_ctx *dnn;   /* the cuDNN handle bound to `stream` and the convolution plans
                                   built with it (cuda_conv.c); made on first use, freed with
                                   the context (cuda_dnn_ctx_free) */
} cuda_exec;

/* The calling thread's current CUDA device, as cuda_set_device left it (-1: not yet set). */
extern __thread int cuda_tls_device;
/* Make `index` the calling thread's current CUDA device (cudaSetDevice, checked). */
em_status cuda_set_device(int index);

static inline const cuda_exec *cuda_exec_of(const em_kernel_ctx *k) {
    return (const cuda_exec *)k->exec->backend;
}

/* The stream kernel k launches on, after making k's device the thread's current one (a
 * failure there shows up in the launch check that follows). */
static inline cudaStream_t cuda_stream_of(const em_kernel_ctx *k) {
    if (cuda_tls_device != k->device.index) (void)cuda_set_device(k->device.index);
    return cuda_exec_of(k)->stream;
}

/* ---- checked calls ------------------------------------------------------------------------ */

/* EMBER_CUDA_SYNC=1 (read at plugin load): every kernel and copy synchronises its stream,
 * so an asynchronous fault is reported by the op that caused it (CUDA_LAUNCH_BLOCKING). */
extern bool cuda_sync_mode;

/* Check a launch (or a run of launches) of kernel k: cudaGetLastError, and under
 * EMBER_CUDA_SYNC=1 the stream's completion. EM_OK, or EM_ERR_DEVICE set with a message
 * naming the op, `what` (the kernel or library call), the device and CUDA's message; a
 * fault from earlier asynchronous work says so and suggests EMBER_CUDA_SYNC=1. */
em_status cuda_check_launch(const em_kernel_ctx *k, const char *what);

/* Check the result of a CUDA runtime call `call` (its name, "cudaMemcpyAsync") made for
 * `who` (the op or device operation, "copy") on cuda:`device` (-1: no device). EM_OK when
 * err is cudaSuccess; otherwise the error is set (EM_ERR_NOMEM for cudaErrorMemoryAllocation,
 * else EM_ERR_DEVICE) naming who, the call, the device and CUDA's message, and returned. */
em_status cuda_check(cudaError_t err, const char *who, const char *call, int device);

/* Check a cuBLAS / cuBLASLt status the same way (the library's status string); k may be NULL
 * outside a kernel (the message then names neither op nor device). */
em_status cuda_check_blas(const em_kernel_ctx *k, cublasStatus_t st, const char *call);

/* ---- cuBLAS and cuBLASLt, dlopen()ed ------------------------------------------------------ */

/* cublasGemmEx and cublasGemmStridedBatchedEx are overloaded in C++ (cublas_api.h adds
 * cudaDataType compute-type forms): their C entry points' types, spelled out. */
typedef cublasStatus_t (*cuda_cublasGemmEx_fn)(cublasHandle_t, cublasOperation_t,
    cublasOperation_t, int, int, int, const void *, const void *, cudaDataType, int,
    const void *, cudaDataType, int, const void *, void *, cudaDataType, int,
    cublasComputeType_t, cublasGemmAlgo_t);
typedef cublasStatus_t (*cuda_cublasGemmStridedBatchedEx_fn)(cublasHandle_t,
    cublasOperation_t, cublasOperation_t, int, int, int, const void *, const void *,
    cudaDataType, int, long long int, const void *, cudaDataType, int, long long int,
    const void *, void *, cudaDataType, int, long long int, int, cublasComputeType_t,
    cublasGemmAlgo_t);
#define CUDA_FN(name) __typeof__(name) *

/* The functions taken from libcublas (L) and libcublasLt (T): X(library, name, pointer type).
 * Grow only at the end. */
#define CUDA_BLAS_FUNCTIONS(X) \
    X(L, cublasCreate_v2, CUDA_FN(cublasCreate_v2)) \
    X(L, cublasDestroy_v2, CUDA_FN(cublasDestroy_v2)) \
    X(L, cublasGetProperty, CUDA_FN(cublasGetProperty)) \
    X(L, cublasSetStream_v2, CUDA_FN(cublasSetStream_v2)) \
    X(L, cublasSetWorkspace_v2, CUDA_FN(cublasSetWorkspace_v2)) \
    X(L, cublasSetMathMode, CUDA_FN(cublasSetMathMode)) \
    X(L, cublasGetMathMode, CUDA_FN(cublasGetMathMode)) \
    X(L, cublasGetStatusString, CUDA_FN(cublasGetStatusString)) \
    X(L, cublasSgemm_v2, CUDA_FN(cublasSgemm_v2)) \
    X(L, cublasDgemm_v2, CUDA_FN(cublasDgemm_v2)) \
    X(L, cublasGemmEx, cuda_cublasGemmEx_fn) \
    X(L, cublasSgemmStridedBatched, CUDA_FN(cublasSgemmStridedBatched)) \
    X(L, cublasDgemmStridedBatched, CUDA_FN(cublasDgemmStridedBatched)) \
    X(L, cublasGemmStridedBatchedEx, cuda_cublasGemmStridedBatchedEx_fn) \
    X(L, cublasSgemv_v2, CUDA_FN(cublasSgemv_v2)) \
    X(L, cublasDgemv_v2, CUDA_FN(cublasDgemv_v2)) \
    X(T, cublasLtCreate, CUDA_FN(cublasLtCreate)) \
    X(T, cublasLtDestroy, CUDA_FN(cublasLtDestroy)) \
    X(T, cublasLtGetVersion, CUDA_FN(cublasLtGetVersion)) \
    X(T, cublasLtGetStatusString, CUDA_FN(cublasLtGetStatusString)) \
    X(T, cublasLtMatmul, CUDA_FN(cublasLtMatmul)) \
    X(T, cublasLtMatmulDescCreate, CUDA_FN(cublasLtMatmulDescCreate)) \
    X(T, cublasLtMatmulDescDestroy, CUDA_FN(cublasLtMatmulDescDestroy)) \
    X(T, cublasLtMatmulDescSetAttribute, CUDA_FN(cublasLtMatmulDescSetAttribute)) \
    X(T, cublasLtMatrixLayoutCreate, CUDA_FN(cublasLtMatrixLayoutCreate)) \
    X(T, cublasLtMatrixLayoutDestroy, CUDA_FN(cublasLtMatrixLayoutDestroy)) \
    X(T, cublasLtMatrixLayoutSetAttribute, CUDA_FN(cublasLtMatrixLayoutSetAttribute)) \
    X(T, cublasLtMatmulPreferenceCreate, CUDA_FN(cublasLtMatmulPreferenceCreate)) \
    X(T, cublasLtMatmulPreferenceDestroy, CUDA_FN(cublasLtMatmulPreferenceDestroy)) \
    X(T, cublasLtMatmulPreferenceSetAttribute, CUDA_FN(cublasLtMatmulPreferenceSetAttribute)) \
    X(T, cublasLtMatmulAlgoGetHeuristic, CUDA_FN(cublasLtMatmulAlgoGetHeuristic))

#define CUDA_BLAS_FIELD(lib, name, type) type name;
typedef struct cuda_blas_table {
    CUDA_BLAS_FUNCTIONS(CUDA_BLAS_FIELD)
    int cublas_version;   /* cublasGetProperty: major * 10000 + minor * 100 + patch */
    size_t cublaslt_version;
} cuda_blas_table;
#undef CUDA_BLAS_FIELD

/* The table, once the libraries are loaded (at registration, when a device is present or
 * EMBER_CUDA_LOAD_LIBRARIES=1); NULL otherwise. */
const cuda_blas_table *cuda_blas(void);

/* Whether kernels may use TF32 for f32 matmuls and convolutions (the one
 * "set_float32_matmul_precision" setting; off by default, as PyTorch's matmul — PyTorch's
 * cuDNN convolutions default to TF32 on, Ember's do not). */
bool cuda_allow_tf32(void);

/* ---- cuDNN, dlopen()ed (cuda_dnn.c) ------------------------------------------------------- */

/* The functions taken from libcudnn.so.<CUDNN_MAJOR>: the handle and the graph (backend) API
 * only — the legacy convolution, pooling and normalisation calls are deprecated in cuDNN 9
 * and not used. X(name). Grow only at the end. */
#define CUDA_DNN_FUNCTIONS(X) \
    X(cudnnGetVersion) \
    X(cudnnGetErrorString) \
    X(cudnnGetLastErrorString) \
    X(cudnnCreate) \
    X(cudnnDestroy) \
    X(cudnnSetStream) \
    X(cudnnBackendCreateDescriptor) \
    X(cudnnBackendDestroyDescriptor) \
    X(cudnnBackendFinalize) \
    X(cudnnBackendSetAttribute) \
    X(cudnnBackendGetAttribute) \
    X(cudnnBackendExecute)

#define CUDA_DNN_FIELD(name) CUDA_FN(name) name;
typedef struct cuda_dnn_table {
    CUDA_DNN_FUNCTIONS(CUDA_DNN_FIELD)
    size_t version; /* cudnnGetVersion: major * 10000 + minor * 100 + patch */
} cuda_dnn_table;
#undef CUDA_DNN_FIELD

/* Load cuDNN now, like cuda_blas_load (`why` starts the refusal message); EM_ERR_PLUGIN with
 * the loader's full message when it cannot be loaded or lacks a function. */
em_status cuda_dnn_load(const char *why);
/* The table once loaded; NULL otherwise (no device and no EMBER_CUDA_LOAD_LIBRARIES=1). */
const cuda_dnn_table *cuda_dnn(void);
/* Check a cuDNN status: EM_OK, or EM_ERR_DEVICE (EM_ERR_NOMEM for an allocation failure)
 * naming k's op and device (k may be NULL), the call and cuDNN's message. */
em_status cuda_check_dnn(const em_kernel_ctx *k, cudnnStatus_t st, const char *call);
/* Free a context's cuDNN state (its plans, then its handle); NULL is a no-op. */
void cuda_dnn_ctx_free(struct cuda_dnn_ctx *d);
/* How many convolution plans were built in this process: on a cuDNN engine, and without one
 * (those calls run the direct kernels). cuda_conv.c. */
void cuda_conv_plan_counts(int *engine /* out */, int *direct /* out */);

/* ---- the device's own files (cuda.c, cuda_mem.c, cuda_stream.c, cuda_blas.c) -------------- */

/* Load cuBLAS and cuBLASLt now (`why` starts the refusal message: "1 CUDA device is
 * present"); EM_ERR_PLUGIN with the loader's full message when either cannot be loaded. */
em_status cuda_blas_load(const char *why);
/* The "cuda" device type's index in the core's registry (set at registration). */
extern int cuda_device_type;
/* The device-ops slots of cuda_mem.c and cuda_stream.c. */
em_status cuda_dev_alloc(int index, size_t nbytes, void **out);
void cuda_dev_free(int index, void *ptr);
em_status cuda_host_alloc(size_t nbytes, void **out);
void cuda_host_free(void *ptr);
em_status cuda_copy(em_device dst_dev, void *dst, em_device src_dev, const void *src,
                    size_t nbytes, em_stream *stream);
em_status cuda_synchronize(int index);
em_status cuda_stream_create(int index, em_stream **out);
void cuda_stream_destroy(int index, em_stream *s);
em_status cuda_stream_synchronize(int index, em_stream *s);
em_status cuda_event_create(int index, em_event **out);
void cuda_event_destroy(int index, em_event *e);
em_status cuda_event_record(int index, em_event *e, em_stream *s);
em_status cuda_event_wait(int index, em_stream *s, em_event *e);
em_status cuda_event_synchronize(int index, em_event *e);
em_status cuda_event_query(int index, em_event *e, bool *done);
em_status cuda_event_create_timed(int index, em_event **out);
em_status cuda_event_elapsed_ns(int index, em_event *start, em_event *end, uint64_t *ns);
/* Graph capture (cuda_stream.c); cuda_captures counts the captures in progress, during which
 * cuda_dev_alloc calls cudaMalloc in the relaxed capture mode. */
extern int cuda_captures; /* read and written with __atomic builtins */
em_status cuda_graph_begin(int index, em_stream *s);
em_status cuda_graph_end(int index, em_stream *s, void **graph);
em_status cuda_graph_replay(int index, void *graph, em_stream *s);
void cuda_graph_destroy(int index, void *graph);

/* ---- kernels ------------------------------------------------------------------------------ */

/* Register every kernel family of the plugin (cuda_kernels.c lists them). */
em_status cuda_register_kernels(em_registry *reg);

/* Register fn for op on "cuda" for each of the n dtypes, named "<name>_<dtype>". */
em_status cuda_register_dtypes(em_registry *reg, const char *op, const em_dtype *dts, int n,
                               em_kernel_fn fn, const char *name);

/* The kernel families (one .cu or .c file each). */
em_status cuda_register_copy(em_registry *reg); /* copy, fill (cuda_copy.cu) */
/* The kernels an MLP trains with (cuda_kernels.cuh is their shared engine). */
em_status cuda_register_elementwise(em_registry *reg); /* arange, add..div, where (cuda_elementwise.cu) */
em_status cuda_register_math(em_registry *reg);        /* unary math, comparisons (cuda_math.cu) */
em_status cuda_register_reduce(em_registry *reg);      /* sum, amax, argmax, var... (cuda_reduce.cu) */
em_status cuda_register_loss(em_registry *reg);        /* cross_entropy, mse... (cuda_loss.cu) */
em_status cuda_register_softmax(em_registry *reg);     /* softmax, log_softmax (cuda_softmax.cu) */
em_status cuda_register_index(em_registry *reg);       /* index_select, gather, embedding (cuda_index.cu) */
em_status cuda_register_optim(em_registry *reg);       /* fused_sgd/adam/adamw (cuda_optim.cu) */
em_status cuda_register_random(em_registry *reg);      /* uniform, normal, bernoulli (cuda_random.cu) */
em_status cuda_register_matmul(em_registry *reg);      /* bmm, addmm (cuda_matmul.cu) */
/* The fused ops (cuda_gemm.cuh is their row-major cuBLAS GEMM). */
em_status cuda_register_layernorm(em_registry *reg);   /* layer_norm + backward (cuda_layernorm.cu) */
em_status cuda_register_attention(em_registry *reg);   /* scaled_dot_product_attention + backward (cuda_attention.cu) */
em_status cuda_register_rnn(em_registry *reg);         /* lstm, gru + backward (cuda_rnn.cu) */
em_status cuda_register_amp(em_registry *reg);         /* amp_unscale_ (cuda_amp.cu) */
/* The CNN ops: conv2d and its backward ops through cuDNN's graph API (cuda_conv.c) over the
 * plugin's own direct kernels; pooling and batch_norm as the plugin's kernels (cuda_nn.cu). */
em_status cuda_register_conv(em_registry *reg);        /* conv2d* on cuDNN (cuda_conv.c) */
em_status cuda_register_nn(em_registry *reg);          /* conv2d* direct, pooling, batch_norm */
/* cuda_nn.cu's direct convolution (each output a double sum in a fixed order), for the op k
 * runs (conv2d, conv2d_backward_data or conv2d_backward_weight, the bias and its grad
 * included): the f64 kernels, and what the cuDNN kernels run for a call no cuDNN engine
 * takes. */
em_status cuda_conv2d_direct(const em_kernel_ctx *k);
/* conv2d: y = out[0] (N, O, OH, OW) += bias in[2] (O), in the output dtype. */
em_status cuda_conv2d_add_bias(const em_kernel_ctx *k);
/* conv2d_backward_weight: gb = out[1] (O) = the sums of gy = in[1] (N, O, OH, OW) over N, OH
 * and OW, in double, combined in a fixed order. */
em_status cuda_conv2d_bias_grad(const em_kernel_ctx *k);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_CUDA_INTERNAL_H */
