/*
 * cuda_internal.h — what the CUDA backend's files share (C and CUDA C++ alike): the
 * per-(device, stream) execution context behind em_kernel_ctx.exec->backend, the stream a
 * kernel runs on, checked CUDA calls and launches, the dlopen()ed cuBLAS/cuBLASLt function
 * table, and the kernel families' registration hook.
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

/* Whether kernels may use TF32 for f32 matmuls (the "set_float32_matmul_precision" setting;
 * off by default, as PyTorch's matmul). */
bool cuda_allow_tf32(void);

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

#ifdef __cplusplus
}
#endif
#endif /* EMBER_CUDA_INTERNAL_H */
