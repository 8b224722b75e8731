/*
 * cuda.c — the CUDA backend plugin ("ember-cuda"): the "cuda" device (count, properties,
 * ordinals as the CUDA runtime numbers them, so CUDA_VISIBLE_DEVICES applies), its execution
 * contexts (a cuBLAS and a cuBLASLt handle bound to the stream, with a workspace; a cuDNN handle
 * made on first use), checked CUDA calls, the backend's settings, and the entry point.
 *
 * Cheap where there is no GPU: the plugin links only the CUDA runtime (statically, so it loads
 * without libcudart, libcuda or a driver); at registration it asks cudaGetDeviceCount, and
 * only when that finds a device (or EMBER_CUDA_LOAD_LIBRARIES=1) does it dlopen() cuBLAS,
 * cuBLASLt and cuDNN, refusing the plugin with the loader's message when one is missing. Without a
 * device it registers the device type with 0 devices and the driver's reason.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "ember/version.h"

__thread int cuda_tls_device = -1;
bool cuda_sync_mode;
int cuda_device_type = -1;

static struct {
    int count;           /* devices found at registration */
    char reason[320];    /* why count is 0 */
    int driver, runtime; /* cudaDriverGetVersion (0: no driver), cudaRuntimeGetVersion */
    bool load_libs;      /* EMBER_CUDA_LOAD_LIBRARIES=1 */
    size_t workspace;    /* bytes of cuBLAS workspace per stream */
    _Atomic bool tf32;
    char describe[1024];
} G;

bool cuda_allow_tf32(void) { return __atomic_load_n(&G.tf32, __ATOMIC_RELAXED); }

/* ---- checked calls ------------------------------------------------------------------------ */

/* Errors that come from earlier asynchronous work and leave the CUDA context unusable. */
static bool async_fault(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable: return true;
    default: return false;
    }
}

static em_status report(cudaError_t e, const char *who, const char *call, int device,
                        bool launch) {
    char dev[24] = "";
    if (device >= 0) snprintf(dev, sizeof dev, " on cuda:%d", device);
    em_status st = e == cudaErrorMemoryAllocation ? EM_ERR_NOMEM : EM_ERR_DEVICE;
    if (async_fault(e) && !(launch && cuda_sync_mode))
        return em_set_error(st, "%s: %s%s found a fault of earlier asynchronous work: %s (%s); "
                            "the CUDA context is no longer usable; %s", who, call, dev,
                            cudaGetErrorString(e), cudaGetErrorName(e),
                            cuda_sync_mode ? "EMBER_CUDA_SYNC=1 is set, so no op before it "
                                             "reported it: the fault is in work queued "
                                             "outside Ember's ops"
                                           : "rerun with EMBER_CUDA_SYNC=1 so that every op "
                                             "synchronises and the op that faulted is named");
    if (!async_fault(e)) (void)cudaGetLastError(); /* not sticky: clear it */
    return em_set_error(st, "%s: %s failed%s: %s (%s)", who, call, dev, cudaGetErrorString(e),
                        cudaGetErrorName(e));
}

em_status cuda_check(cudaError_t e, const char *who, const char *call, int device) {
    return e == cudaSuccess ? EM_OK : report(e, who, call, device, false);
}

em_status cuda_check_launch(const em_kernel_ctx *k, const char *what) {
    const char *op = em_op_name(k->op);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return report(e, op, what, k->device.index, false);
    if (!cuda_sync_mode) return EM_OK;
    e = cudaStreamSynchronize(cuda_exec_of(k)->stream);
    return e == cudaSuccess ? EM_OK : report(e, op, what, k->device.index, true);
}

em_status cuda_set_device(int index) {
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess) {
        cuda_tls_device = index;
        return EM_OK;
    }
    return report(e, "cuda", "cudaSetDevice", index, false);
}

/* ---- the device ---------------------------------------------------------------------------- */

static int cuda_count(void) { return G.count; }

static const char *cuda_count_reason(void) { return G.count ? NULL : G.reason; }

static em_status cuda_properties(int index, em_device_props *p) {
    struct cudaDeviceProp dp;
    em_status st = cuda_check(cudaGetDeviceProperties(&dp, index), "device_properties",
                              "cudaGetDeviceProperties", index);
    if (st != EM_OK) return st;
    snprintf(p->name, sizeof p->name, "%.*s", (int)sizeof p->name - 1, dp.name);
    p->total_memory = dp.totalGlobalMem;
    p->compute_units = dp.multiProcessorCount;
    size_t free_b = 0, total_b = 0;
    st = cuda_set_device(index);
    if (st == EM_OK)
        st = cuda_check(cudaMemGetInfo(&free_b, &total_b), "device_properties",
                        "cudaMemGetInfo", index);
    if (st != EM_OK) return st;
    p->free_memory = free_b;
    if (p->struct_size >= offsetof(em_device_props, arch) + sizeof p->arch)
        snprintf(p->arch, sizeof p->arch, "sm_%d%d", dp.major, dp.minor);
    return EM_OK;
}

/* ---- execution contexts ---------------------------------------------------------------------- */

static void exec_free(cuda_exec *x) {
    cuda_dnn_ctx_free(x->dnn);
    const cuda_blas_table *b = cuda_blas();
    if (b && x->lt) b->cublasLtDestroy(x->lt);
    if (b && x->blas) b->cublasDestroy_v2(x->blas);
    if (x->workspace) (void)cudaFree(x->workspace);
    em_host_free(x);
}

static em_status cuda_context_create(int index, em_stream *s, void **out) {
    *out = NULL;
    em_status st = cuda_set_device(index);
    if (st != EM_OK) return st;
    cuda_exec *x = em_host_alloc(sizeof *x, 64);
    if (!x) return em_set_error(EM_ERR_NOMEM, "cuda: out of host memory for an execution context");
    memset(x, 0, sizeof *x);
    x->device = index;
    x->stream = s ? s->s : (cudaStream_t)0;
    const cuda_blas_table *b = cuda_blas();
    if (b) { /* absent only when no device was found: then no context is ever made */
        x->workspace_size = G.workspace;
        st = cuda_check(cudaMalloc(&x->workspace, x->workspace_size), "context_create (cuBLAS "
                        "workspace)", "cudaMalloc", index);
        if (st == EM_OK)
            st = cuda_check_blas(NULL, b->cublasCreate_v2(&x->blas), "cublasCreate");
        if (st == EM_OK)
            st = cuda_check_blas(NULL, b->cublasSetStream_v2(x->blas, x->stream),
                                 "cublasSetStream");
        if (st == EM_OK)
            st = cuda_check_blas(NULL, b->cublasSetWorkspace_v2(x->blas, x->workspace,
                                                                 x->workspace_size),
                                 "cublasSetWorkspace");
        if (st == EM_OK)
            st = cuda_check_blas(NULL, b->cublasLtCreate(&x->lt), "cublasLtCreate");
    }
    if (st != EM_OK) {
        exec_free(x);
        return st;
    }
    *out = x;
    return EM_OK;
}

static void cuda_context_destroy(int index, em_stream *s, void *ctx) {
    (void)s;
    if (cuda_set_device(index) == EM_OK && ctx) exec_free(ctx);
}

/* ---- settings ---------------------------------------------------------------------------------- */

static em_status cuda_set_float32_matmul_precision(const char *p) {
    if (p && strcmp(p, "highest") == 0) __atomic_store_n(&G.tf32, false, __ATOMIC_RELAXED);
    else if (p && strcmp(p, "high") == 0) __atomic_store_n(&G.tf32, true, __ATOMIC_RELAXED);
    else
        return em_set_error(EM_ERR_INVALID, "cuda: set_float32_matmul_precision: '%s' is not "
                            "a precision: 'highest' (f32 matmuls in full f32, the default) or "
                            "'high' (TF32 tensor cores allowed)", p ? p : "(null)");
    return EM_OK;
}

static const char *cuda_float32_matmul_precision(void) {
    return cuda_allow_tf32() ? "high" : "highest";
}

/* "E on cuDNN engines, D on the direct kernels": the convolution plans built so far. */
static const char *cuda_conv_plans(void) {
    static __thread char buf[96];
    int e = 0, d = 0;
    cuda_conv_plan_counts(&e, &d);
    snprintf(buf, sizeof buf, "%d on cuDNN engines, %d on the direct kernels", e, d);
    return buf;
}

static int cuda_driver_version(void) { return G.driver; }
static int cuda_runtime_version(void) { return G.runtime; }

/* The "stream_handle" function: the cudaStream_t behind an Ember stream, for CUDA work queued
 * outside Ember's ops (ember-nccl's collectives). NULL, the core's default stream, is the
 * legacy default stream, named explicitly (cudaStreamLegacy) so that a library built with
 * per-thread default streams orders with it too. */
static void *cuda_stream_handle(em_stream *s) {
    return s ? (void *)s->s : (void *)cudaStreamLegacy;
}

static const em_backend_fn_def cuda_functions[] = {
    {"set_float32_matmul_precision", (em_proc_fn)cuda_set_float32_matmul_precision,
     "em_status (const char *precision)",
     "'highest' (default: f32 matmuls and convolutions in f32) or 'high' (TF32 allowed), "
     "as in PyTorch"},
    {"float32_matmul_precision", (em_proc_fn)cuda_float32_matmul_precision,
     "const char *(void)", "the f32 matmul precision now: 'highest' or 'high'"},
    {"driver_version", (em_proc_fn)cuda_driver_version, "int (void)",
     "the CUDA driver's version (13000 is 13.0; 0: no driver)"},
    {"runtime_version", (em_proc_fn)cuda_runtime_version, "int (void)",
     "the CUDA runtime's version the plugin is linked with (13000 is 13.0)"},
    {"stream_handle", (em_proc_fn)cuda_stream_handle, "void *(em_stream *stream)",
     "the cudaStream_t of a stream of a cuda device (NULL: cudaStreamLegacy), for CUDA work "
     "queued outside Ember"},
    {"conv_plans", (em_proc_fn)cuda_conv_plans, "const char *(void)",
     "the convolution plans built so far: how many on cuDNN engines, how many on the direct "
     "kernels (no engine took the shape); the string is the calling thread's"},
    {NULL, NULL, NULL, NULL},
};

static const em_device_ops cuda_device = {
    .struct_size = sizeof(em_device_ops),
    .name = "cuda",
    .count = cuda_count,
    .properties = cuda_properties,
    .alloc = cuda_dev_alloc,
    .free = cuda_dev_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy = cuda_copy,
    .synchronize = cuda_synchronize,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_synchronize = cuda_event_synchronize,
    .context_create = cuda_context_create,
    .context_destroy = cuda_context_destroy,
    .functions = cuda_functions,
    .event_query = cuda_event_query,
    .event_create_timed = cuda_event_create_timed,
    .event_elapsed_ns = cuda_event_elapsed_ns,
    .count_reason = cuda_count_reason,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_replay = cuda_graph_replay,
    .graph_destroy = cuda_graph_destroy,
};

/* ---- registration -------------------------------------------------------------------------------- */

static bool env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static void version_str(int v, char *buf, size_t cap) {
    if (v > 0) snprintf(buf, cap, "%d.%d", v / 1000, v % 1000 / 10);
    else snprintf(buf, cap, "none");
}

/* What ember-info shows: versions, devices, the libraries and the settings. */
static void describe_build(void) {
    char drv[16], rt[16], libs[160];
    version_str(G.driver, drv, sizeof drv);
    version_str(G.runtime, rt, sizeof rt);
    const cuda_blas_table *b = cuda_blas();
    const cuda_dnn_table *dn = cuda_dnn();
    if (b && dn)
        snprintf(libs, sizeof libs, "cuBLAS %d.%d.%d, cuBLASLt %zu and cuDNN %zu.%zu.%zu loaded",
                 b->cublas_version / 10000, b->cublas_version / 100 % 100,
                 b->cublas_version % 100, b->cublaslt_version, dn->version / 10000,
                 dn->version / 100 % 100, dn->version % 100);
    else
        snprintf(libs, sizeof libs, "cuBLAS/cuBLASLt/cuDNN not loaded (no device; "
                 "EMBER_CUDA_LOAD_LIBRARIES=1 loads them anyway)");
    char devs[400];
    if (G.count) snprintf(devs, sizeof devs, "%d device%s", G.count, G.count == 1 ? "" : "s");
    else snprintf(devs, sizeof devs, "0 devices (%s)", G.reason);
    snprintf(G.describe, sizeof G.describe, "CUDA runtime %s (linked statically), driver %s; "
             "%s; %s; EMBER_CUDA_SYNC=%d; cuBLAS workspace %zu MiB per stream", rt, drv, devs,
             libs, cuda_sync_mode ? 1 : 0, G.workspace >> 20);
}

static const char *cuda_describe(void) { return G.describe; }

/* The device count, or 0 with the driver's reason in G.reason. */
static void probe_devices(void) {
    G.count = 0;
    G.reason[0] = '\0';
    (void)cudaRuntimeGetVersion(&G.runtime);
    if (cudaDriverGetVersion(&G.driver) != cudaSuccess) G.driver = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(G.reason, sizeof G.reason, "cudaGetDeviceCount: %s (%s)%s",
                 cudaGetErrorString(e), cudaGetErrorName(e),
                 G.driver ? "" : "; no NVIDIA driver (libcuda.so.1) was found");
        return;
    }
    if (n == 0) {
        snprintf(G.reason, sizeof G.reason, "cudaGetDeviceCount found none%s",
                 getenv("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES is set)" : "");
        return;
    }
    G.count = n;
}

static em_status read_workspace(void) {
    G.workspace = (size_t)32 << 20;
    const char *v = getenv("EMBER_CUDA_WORKSPACE_MB");
    if (!v || !*v) return EM_OK;
    char *end;
    long mb = strtol(v, &end, 10);
    if (*end || mb < 1 || mb > 4096)
        return em_set_error(EM_ERR_INVALID, "ember-cuda: EMBER_CUDA_WORKSPACE_MB='%s' is not a "
                            "size in MiB from 1 to 4096", v);
    G.workspace = (size_t)mb << 20;
    return EM_OK;
}

static em_status cuda_register(em_registry *r) {
    cuda_sync_mode = env_flag("EMBER_CUDA_SYNC");
    G.load_libs = env_flag("EMBER_CUDA_LOAD_LIBRARIES");
    em_status st = read_workspace();
    if (st != EM_OK) return st;
    probe_devices();
    if (G.count || G.load_libs) {
        char why[96];
        if (G.count)
            snprintf(why, sizeof why, "%d CUDA device%s present", G.count,
                     G.count == 1 ? " is" : "s are");
        else
            snprintf(why, sizeof why, "EMBER_CUDA_LOAD_LIBRARIES=1 is set");
        st = cuda_blas_load(why);
        if (st == EM_OK) st = cuda_dnn_load(why);
        if (st != EM_OK) return st;
    }
    describe_build();
    st = em_device_type_register(r, &cuda_device);
    em_device d = {0, 0};
    if (st == EM_OK) {
        for (int i = 1; i < EM_MAX_DEVICE_TYPES && cuda_device_type < 0; i++) {
            d.type = (int16_t)i;
            char name[48];
            if (strcmp(em_device_str(d, name, sizeof name), "cuda:0") == 0) cuda_device_type = i;
        }
    }
    if (st == EM_OK) st = cuda_register_kernels(r);
    return st;
}

static void cuda_shutdown(void) { cuda_device_type = -1; }

static const em_plugin_descriptor cuda_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-cuda",
    .version = EM_VERSION_STRING,
    .description = "CUDA device and kernels (CUDA runtime; cuBLAS/cuBLASLt and cuDNN loaded "
                   "when a GPU is present)",
    .register_fn = cuda_register,
    .shutdown_fn = cuda_shutdown,
    .describe = cuda_describe,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &cuda_plugin; }
