/*
 * compare.c — Ember's side of bench/compare-pytorch.py: a worker that reads workload names on
 * stdin, one a line, runs one timed batch of that workload and prints "name ms_per_op" (the
 * driver interleaves these calls with PyTorch's). Each workload's tensors are made on its
 * first request and kept. `bench/compare --list` prints the workloads.
 *
 *   sgemm_1024      em_matmul of two 1024x1024 f32 matrices
 *   bf16_mm_2048    em_matmul of two 2048x2048 bf16 matrices (f32 accumulation)
 *   sgemm_2048      em_matmul of two 2048x2048 f32 matrices (for the bf16/f32 ratio)
 *   add_16M         em_add of two contiguous 16M-element f32 tensors (allocating the result)
 *   memcpy_64MB     memcpy of 64 MiB (16M f32) between preallocated buffers: the bandwidth
 *                   reference for add_16M
 *   add_1elem       em_add of two 1-element f32 tensors, then em_tensor_release
 *   raw_openblas_1024  cblas_sgemm 1024^3 straight into OpenBLAS (run it in a process started
 *                   with OPENBLAS_CORETYPE=... to see OpenBLAS's best kernels)
 *   raw_onednn_1024 oneDNN's f32 matmul primitive 1024^3, created once
 *
 * `bench/compare --describe` prints the CPU backend's GEMM choice (from its info log line).
 */
#include <cblas.h>
#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ember/ember.h>

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void die(const char *what) {
    fprintf(stderr, "compare: %s: %s\n", what, em_last_error());
    exit(1);
}

static em_tensor *filled(int64_t r, int64_t c, em_dtype dt) {
    int64_t shape[2] = {r, c};
    em_tensor *t = em_empty(2, shape, dt, em_cpu());
    if (!t || em_uniform_(t, -1, 1, NULL) != EM_OK) die("uniform_");
    return t;
}

typedef struct workload {
    const char *name;
    int iters; /* per timed batch */
    void (*setup)(struct workload *w);
    void (*run)(struct workload *w);
    void *a, *b, *c;
    int64_t n;
    bool ready;
    bool tensors; /* a and b are em_tensors (released at the end) */
} workload;

static void setup_mm(workload *w) {
    em_dtype dt = strstr(w->name, "bf16") ? EM_BF16 : EM_F32;
    w->a = filled(w->n, w->n, dt);
    w->b = filled(w->n, w->n, dt);
    w->tensors = true;
}
static void run_mm(workload *w) {
    em_tensor *y = em_matmul(w->a, w->b);
    if (!y) die("matmul");
    em_tensor_release(y);
}

static void setup_add(workload *w) {
    w->a = filled(1, w->n, EM_F32);
    w->b = filled(1, w->n, EM_F32);
    w->tensors = true;
}
static void run_add(workload *w) {
    em_tensor *y = em_add(w->a, w->b);
    if (!y) die("add");
    em_tensor_release(y);
}

static void setup_memcpy(workload *w) {
    w->a = aligned_alloc(64, (size_t)w->n * 4);
    w->b = aligned_alloc(64, (size_t)w->n * 4);
    memset(w->a, 1, (size_t)w->n * 4);
    memset(w->b, 2, (size_t)w->n * 4);
}
static void run_memcpy(workload *w) { memcpy(w->b, w->a, (size_t)w->n * 4); }

static void setup_raw_blas(workload *w) {
    size_t n = (size_t)(w->n * w->n);
    float *a = malloc(n * 4), *b = malloc(n * 4), *c = malloc(n * 4);
    for (size_t i = 0; i < n; i++) a[i] = (float)(i % 17) / 8 - 1, b[i] = (float)(i % 13) / 6 - 1;
    w->a = a, w->b = b, w->c = c;
    /* The CPU plugin runs OpenBLAS on one thread (oneDNN does its f32 products); the raw
     * figure is OpenBLAS at its best, on all of Ember's threads. */
    openblas_set_num_threads(em_num_threads());
}
static void run_raw_blas(workload *w) {
    int n = (int)w->n;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, w->a, n, w->b, n, 0, w->c, n);
}

static struct {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    dnnl_primitive_t prim;
    dnnl_exec_arg_t args[3];
} D;
static void setup_raw_dnnl(workload *w) {
    setup_raw_blas(w);
    dnnl_dims_t d = {w->n, w->n}, s = {w->n, 1};
    dnnl_memory_desc_t md;
    dnnl_matmul_desc_t mmd;
    dnnl_primitive_desc_t pd;
    dnnl_memory_t m[3];
    bool ok = dnnl_engine_create(&D.eng, dnnl_cpu, 0) == dnnl_success &&
              dnnl_stream_create(&D.st, D.eng, dnnl_stream_default_flags) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&md, 2, d, dnnl_f32, s) == dnnl_success &&
              dnnl_matmul_desc_init(&mmd, &md, &md, NULL, &md) == dnnl_success &&
              dnnl_primitive_desc_create(&pd, &mmd, NULL, D.eng, NULL) == dnnl_success &&
              dnnl_primitive_create(&D.prim, pd) == dnnl_success &&
              dnnl_memory_create(&m[0], &md, D.eng, w->a) == dnnl_success &&
              dnnl_memory_create(&m[1], &md, D.eng, w->b) == dnnl_success &&
              dnnl_memory_create(&m[2], &md, D.eng, w->c) == dnnl_success;
    if (!ok) {
        fprintf(stderr, "compare: oneDNN set-up failed\n");
        exit(1);
    }
    D.args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, m[0]};
    D.args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, m[1]};
    D.args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, m[2]};
}
static void run_raw_dnnl(workload *w) {
    (void)w;
    dnnl_primitive_execute(D.prim, D.st, 3, D.args);
    dnnl_stream_wait(D.st);
}

static workload W[] = {
    {.name = "sgemm_1024", .iters = 10, .setup = setup_mm, .run = run_mm, .n = 1024},
    {.name = "sgemm_2048", .iters = 2, .setup = setup_mm, .run = run_mm, .n = 2048},
    {.name = "bf16_mm_2048", .iters = 4, .setup = setup_mm, .run = run_mm, .n = 2048},
    {.name = "add_16M", .iters = 10, .setup = setup_add, .run = run_add, .n = 1 << 24},
    {.name = "memcpy_64MB", .iters = 10, .setup = setup_memcpy, .run = run_memcpy, .n = 1 << 24},
    {.name = "add_1elem", .iters = 200000, .setup = setup_add, .run = run_add, .n = 1},
    {.name = "raw_openblas_1024", .iters = 10, .setup = setup_raw_blas, .run = run_raw_blas, .n = 1024},
    {.name = "raw_onednn_1024", .iters = 10, .setup = setup_raw_dnnl, .run = run_raw_dnnl, .n = 1024},
};
#define N_WORKLOADS ((int)(sizeof W / sizeof W[0]))

static char gemm_line[1024];
static void keep_gemm_line(em_log_level level, const char *msg, void *user) {
    (void)level, (void)user;
    if (strstr(msg, "f32 GEMM")) snprintf(gemm_line, sizeof gemm_line, "%s", msg);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < N_WORKLOADS; i++) printf("%s\n", W[i].name);
        return 0;
    }
    em_log_set(keep_gemm_line, NULL);
    em_log_set_level(EM_LOG_INFO);
    if (em_init() != EM_OK) die("em_init");
    em_log_set(NULL, NULL);
    em_log_set_level(EM_LOG_WARN);
    if (argc > 1 && strcmp(argv[1], "--describe") == 0) {
        printf("%s\nember threads: %d\n", gemm_line, em_num_threads());
        em_shutdown();
        return 0;
    }
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        workload *w = NULL;
        for (int i = 0; i < N_WORKLOADS; i++)
            if (strcmp(W[i].name, line) == 0) w = &W[i];
        if (!w) {
            printf("%s unknown\n", line);
            fflush(stdout);
            continue;
        }
        if (!w->ready) {
            w->setup(w);
            w->run(w); /* warm-up: primitive creation, allocator cache, page faults */
            w->ready = true;
        }
        double t0 = now_ms();
        for (int i = 0; i < w->iters; i++) w->run(w);
        printf("%s %.6f\n", w->name, (now_ms() - t0) / w->iters);
        fflush(stdout);
    }
    for (int i = 0; i < N_WORKLOADS; i++)
        if (W[i].tensors) em_tensor_release(W[i].a), em_tensor_release(W[i].b);
    em_shutdown();
    return 0;
}
