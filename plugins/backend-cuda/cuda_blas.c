/*
 * cuda_blas.c — cuBLAS and cuBLASLt, dlopen()ed: loaded at registration only when a device is
 * present (or EMBER_CUDA_LOAD_LIBRARIES=1), because loading them costs seconds cold and every
 * Ember process would pay it; the function table kernels call; checked library statuses.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

#define CUDA_STR_(x) #x
#define CUDA_STR(x) CUDA_STR_(x)
/* The sonames of the cuBLAS the plugin was built against (CUBLAS_VER_MAJOR). */
static const char cublas_soname[] = "libcublas.so." CUDA_STR(CUBLAS_VER_MAJOR);
static const char cublaslt_soname[] = "libcublasLt.so." CUDA_STR(CUBLAS_VER_MAJOR);

static struct {
    void *lt, *blas; /* kept open for the life of the process (never dlclose()d: cuBLAS keeps
                        state that outlives its handles) */
    cuda_blas_table t;
    bool loaded;
} B;

const cuda_blas_table *cuda_blas(void) { return B.loaded ? &B.t : NULL; }

/* dlopen one library, or EM_ERR_PLUGIN with the loader's full message. */
static em_status open_lib(const char *soname, const char *why, void **out) {
    if (*out) return EM_OK;
    dlerror();
    *out = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (*out) return EM_OK;
    const char *e = dlerror();
    return em_set_error(EM_ERR_PLUGIN, "ember-cuda: %s, but %s cannot be loaded: %s (install "
                        "cuBLAS %d, e.g. pip's nvidia-cublas, and put its lib directory on "
                        "LD_LIBRARY_PATH)", why, soname, e ? e : "unknown error",
                        CUBLAS_VER_MAJOR);
}

em_status cuda_blas_load(const char *why) {
    if (B.loaded) return EM_OK;
    em_status st = open_lib(cublaslt_soname, why, &B.lt);
    if (st == EM_OK) st = open_lib(cublas_soname, why, &B.blas);
    if (st != EM_OK) return st;
    cuda_blas_table t;
    memset(&t, 0, sizeof t);
    const char *missing = NULL, *libname = NULL;
    void *handle_L = B.blas, *handle_T = B.lt;
    const char *so_L = cublas_soname, *so_T = cublaslt_soname;
#define CUDA_BLAS_SYM(lib, name, type)                                                         \
    if (!missing && !(*(void **)&t.name = dlsym(handle_##lib, #name))) missing = #name, libname = so_##lib;
    CUDA_BLAS_FUNCTIONS(CUDA_BLAS_SYM)
#undef CUDA_BLAS_SYM
    if (missing)
        return em_set_error(EM_ERR_PLUGIN, "ember-cuda: %s has no function %s (the plugin "
                            "was built against cuBLAS %d.%d)", libname, missing, CUBLAS_VER_MAJOR,
                            CUBLAS_VER_MINOR);
    int ma = 0, mi = 0, pa = 0;
    t.cublasGetProperty(MAJOR_VERSION, &ma);
    t.cublasGetProperty(MINOR_VERSION, &mi);
    t.cublasGetProperty(PATCH_LEVEL, &pa);
    t.cublas_version = ma * 10000 + mi * 100 + pa;
    t.cublaslt_version = t.cublasLtGetVersion();
    B.t = t;
    B.loaded = true;
    return EM_OK;
}

em_status cuda_check_blas(const em_kernel_ctx *k, cublasStatus_t st, const char *call) {
    if (st == CUBLAS_STATUS_SUCCESS) return EM_OK;
    const char *msg = B.loaded ? B.t.cublasGetStatusString(st) : "cuBLAS is not loaded";
    return em_set_error(st == CUBLAS_STATUS_ALLOC_FAILED ? EM_ERR_NOMEM : EM_ERR_DEVICE,
                        "%s: %s failed on cuda:%d: %s (cuBLAS status %d)",
                        k ? em_op_name(k->op) : "cuda", call, k ? k->device.index : -1, msg,
                        (int)st);
}
