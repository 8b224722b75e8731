/*
 * cuda_dnn.c — cuDNN, dlopen()ed like cuBLAS (cuda_blas.c): loaded at registration only when a
 * device is present (or EMBER_CUDA_LOAD_LIBRARIES=1), because loading it costs time every Ember
 * process would pay; the function table (the handle and the graph/backend API only); checked
 * cuDNN statuses; and each execution context's cuDNN state, made on first use.
 *
 * libcudnn.so.<major> is the small front library: it loads its sub-libraries (libcudnn_graph,
 * the engine libraries) itself, when first needed.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_dnn.h"

#define CUDA_STR_(x) #x
#define CUDA_STR(x) CUDA_STR_(x)
/* The soname of the cuDNN the plugin was built against (CUDNN_MAJOR). */
static const char cudnn_soname[] = "libcudnn.so." CUDA_STR(CUDNN_MAJOR);

static struct {
    void *lib; /* kept open for the life of the process, like cuBLAS */
    cuda_dnn_table t;
    bool loaded;
} D;

static pthread_mutex_t dnn_lock = PTHREAD_MUTEX_INITIALIZER; /* making a context's state */

const cuda_dnn_table *cuda_dnn(void) { return D.loaded ? &D.t : NULL; }

em_status cuda_dnn_load(const char *why) {
    if (D.loaded) return EM_OK;
    dlerror();
    if (!D.lib) D.lib = dlopen(cudnn_soname, RTLD_NOW | RTLD_LOCAL);
    if (!D.lib) {
        const char *e = dlerror();
        return em_set_error(EM_ERR_PLUGIN, "ember-cuda: %s, but %s cannot be loaded: %s (install "
                            "cuDNN %d, e.g. pip's nvidia-cudnn-cu13, and put its lib directory "
                            "on LD_LIBRARY_PATH)", why, cudnn_soname, e ? e : "unknown error",
                            CUDNN_MAJOR);
    }
    cuda_dnn_table t;
    memset(&t, 0, sizeof t);
    const char *missing = NULL;
#define CUDA_DNN_SYM(name) \
    if (!missing && !(*(void **)&t.name = dlsym(D.lib, #name))) missing = #name;
    CUDA_DNN_FUNCTIONS(CUDA_DNN_SYM)
#undef CUDA_DNN_SYM
    if (missing)
        return em_set_error(EM_ERR_PLUGIN, "ember-cuda: %s has no function %s (the plugin was "
                            "built against cuDNN %d.%d)", cudnn_soname, missing, CUDNN_MAJOR,
                            CUDNN_MINOR);
    t.version = t.cudnnGetVersion();
    D.t = t;
    D.loaded = true;
    return EM_OK;
}

em_status cuda_check_dnn(const em_kernel_ctx *k, cudnnStatus_t st, const char *call) {
    if (st == CUDNN_STATUS_SUCCESS) return EM_OK;
    char detail[256] = "";
    if (D.loaded) D.t.cudnnGetLastErrorString(detail, sizeof detail);
    char dev[24] = "";
    if (k) snprintf(dev, sizeof dev, " on cuda:%d", k->device.index);
    return em_set_error(st == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                                st == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED
                            ? EM_ERR_NOMEM
                            : EM_ERR_DEVICE,
                        "%s: %s failed%s: %s (cuDNN status %d)%s%s", k ? em_op_name(k->op) : "cuda",
                        call, dev, D.loaded ? D.t.cudnnGetErrorString(st) : "cuDNN is not loaded",
                        (int)st, detail[0] ? ": " : "", detail);
}

em_status cuda_dnn_ctx_of(const em_kernel_ctx *k, cuda_dnn_ctx **out) {
    cuda_exec *x = (cuda_exec *)cuda_exec_of(k); /* the context owns its cuDNN state */
    *out = NULL;
    if (!D.loaded)
        return em_set_error(EM_ERR_DEVICE, "%s: cuDNN is not loaded on cuda:%d",
                            em_op_name(k->op), k->device.index);
    pthread_mutex_lock(&dnn_lock);
    em_status st = EM_OK;
    if (!x->dnn) {
        cuda_dnn_ctx *d = em_host_alloc(sizeof *d, 64);
        if (!d) st = em_set_error(EM_ERR_NOMEM, "%s: out of host memory for cuDNN's state",
                                  em_op_name(k->op));
        if (st == EM_OK) {
            memset(d, 0, sizeof *d);
            pthread_mutex_init(&d->lock, NULL);
            d->device = x->device;
            st = cuda_check_dnn(k, D.t.cudnnCreate(&d->handle), "cudnnCreate");
            if (st == EM_OK)
                st = cuda_check_dnn(k, D.t.cudnnSetStream(d->handle, x->stream), "cudnnSetStream");
            if (st == EM_OK) x->dnn = d;
            else cuda_dnn_ctx_free(d);
        }
    }
    pthread_mutex_unlock(&dnn_lock);
    *out = x->dnn;
    return st;
}

void cuda_dnn_ctx_free(cuda_dnn_ctx *d) {
    if (!d) return;
    cuda_conv_plans_free(d);
    if (d->handle && D.loaded) D.t.cudnnDestroy(d->handle);
    pthread_mutex_destroy(&d->lock);
    em_host_free(d);
}
