/*
 * gpu_cublas.c — the baselines of issue 20's speed rows, on CUDA alone (no Ember): the
 * cuBLASLt calls a linear layer's forward and backward need, timed by themselves, and a
 * device-to-device copy's bandwidth. Built by tests/gpu/pack.sh (it needs the CUDA headers
 * and links cuBLASLt and cudart); run by tests/gpu/run.sh bench.
 *
 *   gpu_cublas [--quick] [linear] [gemm_bf16] [copy]
 *
 *   linear_MxKxN  for x (M, K), weight (N, K), bias (N), grad_out (M, N), row-major f32:
 *                 forward  y = x weight^T + bias       one cublasLtMatmul, epilogue BIAS
 *                 backward dx = grad_out weight        one cublasLtMatmul
 *                          dweight = grad_out^T x, dbias = column sums of grad_out
 *                                                      one cublasLtMatmul, epilogue BGRADB
 *                 (when cuBLASLt offers no algorithm with BGRADB the row says so and times
 *                 dweight alone); compute type CUBLAS_COMPUTE_32F (no TF32, PyTorch's float32
 *                 default), 32 MiB workspace, the heuristic's first algorithm. Shapes: the
 *                 MLP's (128x784x512, 128x512x256, 128x256x10) and 8192x8192x8192.
 *   gemm_bf16     C (n, n) = A (n, n) B (n, n), row-major bf16 in and out, n = 8192 (1024 with
 *                 --quick): one cublasLtMatmul, CUDA_R_16BF, CUBLAS_COMPUTE_32F (what Ember's
 *                 bf16 matmul asks of cuBLAS), 32 MiB workspace, the heuristic's first
 *                 algorithm
 *   copy          cudaMemcpyAsync device to device of 1 GiB; GBps counts bytes read plus
 *                 bytes written (2 GiB per copy).
 * Timing as bench/gpu_step.c: the median of 7 batches (3 with --quick) of N calls after
 * warm-up, each batch ended by cudaDeviceSynchronize, on the host clock. Inputs uniform
 * random (a fixed LCG). Output lines: "cublas WORKLOAD ms=... [TFLOPs=...|GBps=...] [note=...]".
 * Every CUDA and cuBLAS call is checked: a failure prints the call and its message, exit 1.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#define GPU_BENCH_NAME "gpu_cublas"
#include "gpu_bench.h"

#define CKB(call)                                                                                \
    do {                                                                                         \
        cublasStatus_t s_ = (call);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
            fprintf(stderr, "gpu_cublas: %s failed: status %d (line %d)\n", #call, (int)s_,    \
                    __LINE__);                                                                   \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static cublasLtHandle_t lt;
static void *ws;
static const size_t ws_size = 32u << 20;

/* One column-major GEMM D (m, n) = op(A) op(B) [+ epilogue], planned once. */
typedef struct gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulHeuristicResult_t heur;
    const void *A, *B;
    void *D;
    bool ok; /* an algorithm was found */
} gemm;

static void gemm_plan_dt(gemm *g, cudaDataType_t dt, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
                         int64_t n, int64_t k, const void *A, int64_t lda, const void *B, int64_t ldb, void *D,
                         int64_t ldd, cublasLtEpilogue_t epi, float *bias) {
    memset(g, 0, sizeof *g);
    g->A = A, g->B = B, g->D = D;
    CKB(cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CKB(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CKB(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    CKB(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) CKB(cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    /* Stored shapes: A is (m, k) or, transposed, (k, m); B likewise (k, n) or (n, k). */
    CKB(cublasLtMatrixLayoutCreate(&g->a, dt, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
    CKB(cublasLtMatrixLayoutCreate(&g->b, dt, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
    CKB(cublasLtMatrixLayoutCreate(&g->d, dt, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wss = ws_size;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wss, sizeof wss));
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, g->desc, g->a, g->b, g->d, g->d, pref, 1, &g->heur, &found);
    CKB(cublasLtMatmulPreferenceDestroy(pref));
    g->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
}

static void gemm_plan(gemm *g, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float *D, int64_t ldd,
                      cublasLtEpilogue_t epi, float *bias) {
    gemm_plan_dt(g, CUDA_R_32F, ta, tb, m, n, k, A, lda, B, ldb, D, ldd, epi, bias);
}

static void gemm_run(const gemm *g) {
    const float one = 1.0f, zero = 0.0f;
    CKB(cublasLtMatmul(lt, g->desc, &one, g->A, g->a, g->B, g->b, &zero, g->D, g->d, g->D, g->d,
                       &g->heur.algo, ws, ws_size, 0));
}

static void gemm_free(gemm *g) {
    cublasLtMatrixLayoutDestroy(g->a);
    cublasLtMatrixLayoutDestroy(g->b);
    cublasLtMatrixLayoutDestroy(g->d);
    cublasLtMatmulDescDestroy(g->desc);
}

typedef struct lin {
    gemm fwd, dx, dw;
} lin;

static void lin_step(void *arg) {
    lin *l = arg;
    gemm_run(&l->fwd);
    gemm_run(&l->dx);
    gemm_run(&l->dw);
}

/* Row-major x (M, K), w (N, K), y/g (M, N) are column-major (K, M), (K, N), (N, M). */
static void run_linear(int64_t M, int64_t K, int64_t N) {
    float *x = rand_dev((size_t)(M * K), 0, 1, 1), *w = rand_dev((size_t)(N * K), -0.03f, 0.03f, 2);
    float *b = rand_dev((size_t)N, -0.03f, 0.03f, 3), *g = rand_dev((size_t)(M * N), -1, 1, 4);
    float *y, *dx, *dw, *db;
    CK(cudaMalloc((void **)&y, (size_t)(M * N) * sizeof(float)));
    CK(cudaMalloc((void **)&dx, (size_t)(M * K) * sizeof(float)));
    CK(cudaMalloc((void **)&dw, (size_t)(N * K) * sizeof(float)));
    CK(cudaMalloc((void **)&db, (size_t)N * sizeof(float)));
    lin l;
    /* y^T (N, M) = w (N, K) x^T (K, M): A = w stored (K, N), transposed. */
    gemm_plan(&l.fwd, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, K, x, K, y, N, CUBLASLT_EPILOGUE_BIAS, b);
    /* dx^T (K, M) = w^T (K, N) g^T (N, M). */
    gemm_plan(&l.dx, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, w, K, g, N, dx, K, CUBLASLT_EPILOGUE_DEFAULT, NULL);
    /* dw^T (K, N) = x^T (K, M) g (M, N), db = sums of g over M (the GEMM's k). */
    gemm_plan(&l.dw, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x, K, g, N, dw, K, CUBLASLT_EPILOGUE_BGRADB, db);
    const char *note = "";
    if (!l.dw.ok) {
        gemm_free(&l.dw);
        gemm_plan(&l.dw, CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x, K, g, N, dw, K, CUBLASLT_EPILOGUE_DEFAULT, NULL);
        note = " note=no_BGRADB_algorithm:dbias_not_timed";
    }
    if (!l.fwd.ok || !l.dx.ok || !l.dw.ok) {
        fprintf(stderr, "gpu_cublas: linear_%lldx%lldx%lld: cuBLASLt found no algorithm (forward %d, dx %d, dw %d)\n",
                (long long)M, (long long)K, (long long)N, l.fwd.ok, l.dx.ok, l.dw.ok);
        exit(1);
    }
    double flop = 3 * 2.0 * (double)M * (double)K * (double)N;
    int n = flop > 1e10 ? 5 : 200;
    double ms = time_it(lin_step, &l, n > 5 ? 20 : 2, n);
    printf("cublas linear_%lldx%lldx%lld ms=%.6f TFLOPs=%.2f%s\n", (long long)M, (long long)K, (long long)N, ms,
           flop / (ms * 1e-3) / 1e12, note);
    gemm_free(&l.fwd);
    gemm_free(&l.dx);
    gemm_free(&l.dw);
    float *bufs[] = {x, w, b, g, y, dx, dw, db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CK(cudaFree(bufs[i]));
}

static void gemm_step(void *arg) { gemm_run(arg); }

/* Row-major C (n, n) = A B is column-major C^T = B^T A^T: D = B (stored (n, n)) times A. */
static void run_gemm_bf16(int64_t n) {
    size_t count = (size_t)(n * n);
    float *fa = rand_dev(count, -1, 1, 6), *fb = rand_dev(count, -1, 1, 7);
    uint16_t *h = malloc(count * sizeof *h), *a, *b, *c;
    float *hf = malloc(count * sizeof *hf);
    if (!h || !hf) {
        fprintf(stderr, "gpu_cublas: out of host memory\n");
        exit(1);
    }
    CK(cudaMalloc((void **)&a, count * sizeof *a));
    CK(cudaMalloc((void **)&b, count * sizeof *b));
    CK(cudaMalloc((void **)&c, count * sizeof *c));
    uint16_t *dst[2] = {a, b};
    float *src[2] = {fa, fb};
    for (int t = 0; t < 2; t++) { /* bf16 = the float's top half, rounded to nearest even */
        CK(cudaMemcpy(hf, src[t], count * sizeof *hf, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; i++) {
            uint32_t u;
            memcpy(&u, &hf[i], sizeof u);
            h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
        CK(cudaMemcpy(dst[t], h, count * sizeof *h, cudaMemcpyHostToDevice));
    }
    free(h);
    free(hf);
    gemm g;
    gemm_plan_dt(&g, CUDA_R_16BF, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, b, n, a, n, c, n, CUBLASLT_EPILOGUE_DEFAULT,
                 NULL);
    if (!g.ok) {
        fprintf(stderr, "gpu_cublas: gemm_bf16_%lld: cuBLASLt found no algorithm\n", (long long)n);
        exit(1);
    }
    double ms = time_it(gemm_step, &g, 3, 20);
    printf("cublas gemm_bf16_%lld ms=%.6f TFLOPs=%.2f\n", (long long)n, ms,
           2.0 * (double)n * (double)n * (double)n / (ms * 1e-3) / 1e12);
    gemm_free(&g);
    void *bufs[] = {fa, fb, a, b, c};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CK(cudaFree(bufs[i]));
}

typedef struct cp {
    void *dst;
    const void *src;
    size_t bytes;
} cp;

static void copy_step(void *arg) {
    cp *c = arg;
    CK(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, 0));
}

static void run_copy(bool quick) {
    size_t n = quick ? (size_t)1 << 24 : (size_t)1 << 28;
    float *src = rand_dev(n, -1, 1, 5), *dst;
    CK(cudaMalloc((void **)&dst, n * sizeof(float)));
    cp c = {dst, src, n * sizeof(float)};
    double ms = time_it(copy_step, &c, 3, 20);
    printf("cublas copy_%zuM ms=%.6f GBps=%.1f\n", n >> 20, ms, 2.0 * (double)c.bytes / (ms * 1e-3) / 1e9);
    CK(cudaFree(src));
    CK(cudaFree(dst));
}

int main(int argc, char **argv) {
    bool quick = false, do_linear = false, do_copy = false, do_gemm = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "linear")) do_linear = true;
        else if (!strcmp(argv[i], "copy")) do_copy = true;
        else if (!strcmp(argv[i], "gemm_bf16")) do_gemm = true;
        else {
            fprintf(stderr, "usage: gpu_cublas [--quick] [linear] [gemm_bf16] [copy]\n");
            return 2;
        }
    }
    if (!do_linear && !do_copy && !do_gemm) do_linear = do_copy = do_gemm = true;
    if (quick) reps = 3;
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    int rt = 0;
    CK(cudaRuntimeGetVersion(&rt));
    printf("cublas device=\"%s\" cc=%d.%d sms=%d cudart=%d cublasLt=%zu\n", p.name, p.major, p.minor,
           p.multiProcessorCount, rt, cublasLtGetVersion());
    CKB(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, ws_size));
    if (do_linear) {
        int64_t big = quick ? 1024 : 8192;
        run_linear(128, 784, 512);
        run_linear(128, 512, 256);
        run_linear(128, 256, 10);
        run_linear(big, big, big);
    }
    if (do_gemm) run_gemm_bf16(quick ? 1024 : 8192);
    if (do_copy) run_copy(quick);
    fflush(stdout);
    CK(cudaFree(ws));
    CKB(cublasLtDestroy(lt));
    return 0;
}
