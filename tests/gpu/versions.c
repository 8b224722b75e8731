/*
 * versions.c — what CUDA the GPU machine has, for tests/gpu/run.sh: the versions of the CUDA
 * driver, runtime (cudart), cuBLAS, cuBLASLt, cuDNN and NCCL that the dynamic linker finds on
 * LD_LIBRARY_PATH, where each was loaded from, and the devices. It dlopen()s each library
 * (so it builds and runs with no CUDA at all, and a missing library is a line of output, not
 * a loader failure) and prints "key=value" lines:
 *
 *   cudart=13.0 cudart_path=... driver_cuda=13.0 devices=1 device0=9.0,132,143771 (cc, SMs,
 *   MiB total) cublas=13.1.0 cublas_path=... cublaslt=13.1.0 nccl=2.28.9 nccl_path=...
 *   cudnn=9.19.0 cudnn_path=...
 *   and NAME_error=... for a library that did not load or a call that failed.
 *
 * Exit status: 0 when cudart and cuBLAS loaded and answered, 1 otherwise.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*int_out_fn)(int *);
typedef int (*attr_fn)(int *, int, int);
typedef int (*meminfo_fn)(size_t *, size_t *);
typedef int (*setdev_fn)(int);
typedef const char *(*errstr_fn)(int);
typedef int (*prop_fn)(int, int *);
typedef size_t (*ver_fn)(void);

/* dlopen the first of names that loads; prints NAME_path or NAME_error. */
static void *load(const char *key, const char *const *names) {
    const char *err = "no candidate";
    for (const char *const *n = names; *n; n++) {
        void *h = dlopen(*n, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        err = dlerror();
    }
    printf("%s_error=%s\n", key, err ? err : "dlopen failed");
    return NULL;
}

static void *sym(void *h, const char *key, const char *name) {
    void *p = dlsym(h, name);
    if (!p) printf("%s_error=no symbol %s\n", key, name);
    return p;
}

static void print_path(const char *key, void *fn) {
    Dl_info info;
    if (fn && dladdr(fn, &info) && info.dli_fname) printf("%s_path=%s\n", key, info.dli_fname);
}

int main(void) {
    int rc = 0;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each line out at once, whatever happens next */
    static const char *const cudart_names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
    void *rt = load("cudart", cudart_names);
    if (rt) {
        int_out_fn rt_ver = (int_out_fn)sym(rt, "cudart", "cudaRuntimeGetVersion");
        int_out_fn drv_ver = (int_out_fn)sym(rt, "cudart", "cudaDriverGetVersion");
        int_out_fn count = (int_out_fn)sym(rt, "cudart", "cudaGetDeviceCount");
        attr_fn attr = (attr_fn)sym(rt, "cudart", "cudaDeviceGetAttribute");
        meminfo_fn mem = (meminfo_fn)sym(rt, "cudart", "cudaMemGetInfo");
        setdev_fn setdev = (setdev_fn)sym(rt, "cudart", "cudaSetDevice");
        errstr_fn errstr = (errstr_fn)sym(rt, "cudart", "cudaGetErrorString");
        int v = 0;
        if (rt_ver && rt_ver(&v) == 0) {
            printf("cudart=%d.%d\n", v / 1000, v % 1000 / 10);
            print_path("cudart", (void *)rt_ver);
        } else {
            rc = 1;
        }
        /* 0 when no driver is installed: CUDA's "no driver" answer. */
        if (drv_ver && drv_ver(&v) == 0) printf("driver_cuda=%d.%d\n", v / 1000, v % 1000 / 10);
        int n = 0, e = count ? count(&n) : -1;
        if (e != 0) {
            printf("devices=0\ndevices_error=%s\n", errstr && e > 0 ? errstr(e) : "cudaGetDeviceCount missing");
        } else {
            printf("devices=%d\n", n);
            for (int i = 0; i < n && attr && setdev; i++) {
                int ma = 0, mi = 0, sms = 0;
                size_t fr = 0, tot = 0;
                attr(&ma, 75, i); /* cudaDevAttrComputeCapabilityMajor */
                attr(&mi, 76, i); /* cudaDevAttrComputeCapabilityMinor */
                attr(&sms, 16, i); /* cudaDevAttrMultiProcessorCount */
                if (setdev(i) == 0 && mem) mem(&fr, &tot);
                printf("device%d=%d.%d,%d,%zu\n", i, ma, mi, sms, tot >> 20);
            }
        }
    } else {
        rc = 1;
    }

    static const char *const cublas_names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so", NULL};
    void *bl = load("cublas", cublas_names);
    prop_fn bprop = bl ? (prop_fn)sym(bl, "cublas", "cublasGetProperty") : NULL;
    int ma = -1, mi = -1, pa = -1;
    if (bprop && bprop(0, &ma) == 0 && bprop(1, &mi) == 0 && bprop(2, &pa) == 0) {
        printf("cublas=%d.%d.%d\n", ma, mi, pa);
        print_path("cublas", (void *)bprop);
    } else {
        rc = 1;
    }
    static const char *const lt_names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so", NULL};
    void *lt = load("cublaslt", lt_names);
    ver_fn ltv = lt ? (ver_fn)sym(lt, "cublaslt", "cublasLtGetVersion") : NULL;
    if (ltv) {
        size_t v = ltv(); /* major * 10000 + minor * 100 + patch */
        printf("cublaslt=%zu.%zu.%zu\n", v / 10000, v / 100 % 100, v % 100);
        print_path("cublaslt", (void *)ltv);
    }
    /* NCCL (ember-nccl.so loads it when a communicator is made): its version code is
     * major * 10000 + minor * 100 + patch since 2.9. A missing NCCL fails the nccl suite only. */
    static const char *const nccl_names[] = {"libnccl.so.2", "libnccl.so", NULL};
    void *nc = load("nccl", nccl_names);
    int_out_fn ncv = nc ? (int_out_fn)sym(nc, "nccl", "ncclGetVersion") : NULL;
    int nv = 0;
    if (ncv && ncv(&nv) == 0) {
        printf("nccl=%d.%d.%d\n", nv / 10000, nv / 100 % 100, nv % 100);
        print_path("nccl", (void *)ncv);
    }
    /* cuDNN 9's libcudnn.so.9 loads its sub-libraries at the first call and abort()s when one
     * is missing ("Invalid handle. Cannot load symbol cudnnGetVersion"): ask in a child. */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        static const char *const dnn_names[] = {"libcudnn.so.9", "libcudnn.so", NULL};
        void *dn = load("cudnn", dnn_names);
        ver_fn dv = dn ? (ver_fn)sym(dn, "cudnn", "cudnnGetVersion") : NULL;
        if (dv) {
            size_t v = dv(); /* 9.x: major * 10000 + minor * 100 + patch */
            printf("cudnn=%zu.%zu.%zu\n", v / 10000, v / 100 % 100, v % 100);
            print_path("cudnn", (void *)dv);
        }
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) printf("cudnn_error=could not run the cuDNN query\n");
    else if (WIFSIGNALED(status))
        printf("cudnn_error=cuDNN's query died of signal %d (a sub-library missing: libcudnn_graph.so.9, ...)\n",
               WTERMSIG(status));
    return rc;
}
