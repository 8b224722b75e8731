/*
 * gpu_bench.h — what the CUDA-only baselines bench/gpu_cublas.c and bench/gpu_cudnn.c share:
 * the checked CUDA call, the host clock, the median of timed batches and uniform random
 * device buffers. Define GPU_BENCH_NAME (the program's name, for its messages) before
 * including; the including file supplies cuda_runtime.h's declarations and includes this
 * once (its functions are static).
 */
#ifndef GPU_BENCH_H
#define GPU_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime.h>

/* A CUDA runtime call that must succeed: else the call, its message and line, exit 1. */
#define CK(call)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, GPU_BENCH_NAME ": %s failed: %s (line %d)\n", #call,                 \
                    cudaGetErrorString(e_), __LINE__);                                           \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* Timed batches per row: 7, or 3 with --quick (at most 16). */
static int reps = 7;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Milliseconds per call of fn(arg): warm calls, then the median of `reps` batches of n calls,
 * each batch ended by cudaDeviceSynchronize, on the host clock. */
static double time_it(void (*fn)(void *), void *arg, int warm, int n) {
    for (int i = 0; i < warm; i++) fn(arg);
    CK(cudaDeviceSynchronize());
    double t[16];
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        for (int i = 0; i < n; i++) fn(arg);
        CK(cudaDeviceSynchronize());
        t[r] = (now_ms() - t0) / n;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

/* A device buffer of n floats, uniform on [lo, hi) from a fixed LCG. */
static float *rand_dev(size_t n, float lo, float hi, uint32_t seed) {
    float *hst = malloc(n * sizeof *hst), *d;
    if (!hst) {
        fprintf(stderr, GPU_BENCH_NAME ": out of host memory (%zu floats)\n", n);
        exit(1);
    }
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        hst[i] = lo + (hi - lo) * (float)(s >> 8) * (1.0f / 16777216.0f);
    }
    CK(cudaMalloc((void **)&d, n * sizeof *d));
    CK(cudaMemcpy(d, hst, n * sizeof *d, cudaMemcpyHostToDevice));
    free(hst);
    return d;
}

#endif /* GPU_BENCH_H */
