/*
 * fma_peak.c — the machine's measured f32 FMA ceiling (issue 27): the figure that
 * bench/compare-pytorch.py divides each training step's GEMM and convolution FLOPs by, measured
 * in the same run instead of taken from a datasheet.
 *
 *   bench/fma_peak [runs [iterations]]      default 40 runs (per width) of 500,000 iterations
 *
 * One thread per CPU of the process's affinity mask, each pinned to its CPU
 * (pthread_setaffinity_np), runs independent chains of vfmadd: on an AVX-512 CPU, runs of 16
 * zmm chains (16 f32 lanes each) and runs of 16 ymm chains (8 lanes, AVX-512VL's 32 registers)
 * alternate, and the ceiling is the better width's best (AMD Zen 4 executes a zmm FMA as two
 * 256-bit halves: either width may reach it; measured there, both ~235 GFLOP/s on 2 cores);
 * with AVX2 + FMA only, 12 ymm chains (16 registers hold 12 accumulators and the 2 constants).
 * Enough independent chains to cover the FMA latency on every FMA port, so the loop runs at
 * the ports' throughput. A run starts all threads at a barrier and lasts from the first
 * thread's start to the last one's end (each thread reads the clock itself); its rate is all
 * threads' FLOPs (2 per lane per FMA) over that time. Prints each
 * run, then the machine-readable line
 *
 *   fma_peak <best GFLOP/s> <median GFLOP/s> <threads> <isa>
 *
 * (isa: avx512-zmm or avx512-ymm, the width whose best run is the ceiling, or avx2; the median
 * is that width's), preceded on AVX-512 by a line with both widths' best and median.
 *
 * The best run is the ceiling: on a shared machine the other runs lose time to other
 * processes, which a ceiling must not count. Runs are short (500,000 iterations: ~2.5 ms at
 * 430 GFLOP/s on 2 cores) so that some fit between the scheduler's preemptions: at load
 * average ~20 on 2 cores the best of 15 runs of 2,000,000 iterations was 61-77 GFLOP/s in
 * three tries and the best of 40 runs of 500,000 was 427-431 each time.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* 16 chains of acc = acc * m + c; m just below 1 keeps the values finite for any length. The
 * sum is returned so the compiler cannot drop the loop. */
__attribute__((target("avx512f"))) static float chains_avx512(long iters) {
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
    __m512 a0 = _mm512_set1_ps(0.0f), a1 = _mm512_set1_ps(0.1f), a2 = _mm512_set1_ps(0.2f),
           a3 = _mm512_set1_ps(0.3f), a4 = _mm512_set1_ps(0.4f), a5 = _mm512_set1_ps(0.5f),
           a6 = _mm512_set1_ps(0.6f), a7 = _mm512_set1_ps(0.7f), a8 = _mm512_set1_ps(0.8f),
           a9 = _mm512_set1_ps(0.9f), a10 = _mm512_set1_ps(1.0f), a11 = _mm512_set1_ps(1.1f),
           a12 = _mm512_set1_ps(1.2f), a13 = _mm512_set1_ps(1.3f), a14 = _mm512_set1_ps(1.4f),
           a15 = _mm512_set1_ps(1.5f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c), a1 = _mm512_fmadd_ps(a1, m, c);
        a2 = _mm512_fmadd_ps(a2, m, c), a3 = _mm512_fmadd_ps(a3, m, c);
        a4 = _mm512_fmadd_ps(a4, m, c), a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c), a7 = _mm512_fmadd_ps(a7, m, c);
        a8 = _mm512_fmadd_ps(a8, m, c), a9 = _mm512_fmadd_ps(a9, m, c);
        a10 = _mm512_fmadd_ps(a10, m, c), a11 = _mm512_fmadd_ps(a11, m, c);
        a12 = _mm512_fmadd_ps(a12, m, c), a13 = _mm512_fmadd_ps(a13, m, c);
        a14 = _mm512_fmadd_ps(a14, m, c), a15 = _mm512_fmadd_ps(a15, m, c);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9),
                                                     _mm512_add_ps(a10, a11)),
                                       _mm512_add_ps(_mm512_add_ps(a12, a13),
                                                     _mm512_add_ps(a14, a15))));
    return _mm512_reduce_add_ps(s);
}

/* 16 chains of ymm FMAs on an AVX-512 CPU (AVX-512VL: 32 vector registers, room for the 16
 * accumulators and the two constants). */
#define YMM_CHAINS(iters)                                                        \
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);            \
    __m256 a[16];                                                                \
    for (int k = 0; k < 16; k++) a[k] = _mm256_set1_ps(0.1f * (float)k);         \
    for (long i = 0; i < (iters); i++) {                                         \
        a[0] = _mm256_fmadd_ps(a[0], m, c), a[1] = _mm256_fmadd_ps(a[1], m, c);     \
        a[2] = _mm256_fmadd_ps(a[2], m, c), a[3] = _mm256_fmadd_ps(a[3], m, c);     \
        a[4] = _mm256_fmadd_ps(a[4], m, c), a[5] = _mm256_fmadd_ps(a[5], m, c);     \
        a[6] = _mm256_fmadd_ps(a[6], m, c), a[7] = _mm256_fmadd_ps(a[7], m, c);     \
        a[8] = _mm256_fmadd_ps(a[8], m, c), a[9] = _mm256_fmadd_ps(a[9], m, c);     \
        a[10] = _mm256_fmadd_ps(a[10], m, c), a[11] = _mm256_fmadd_ps(a[11], m, c); \
        a[12] = _mm256_fmadd_ps(a[12], m, c), a[13] = _mm256_fmadd_ps(a[13], m, c); \
        a[14] = _mm256_fmadd_ps(a[14], m, c), a[15] = _mm256_fmadd_ps(a[15], m, c); \
    }                                                                            \
    float out[8], sum = 0;                                                       \
    __m256 s = a[0];                                                             \
    for (int k = 1; k < 16; k++) s = _mm256_add_ps(s, a[k]);                     \
    _mm256_storeu_ps(out, s);                                                    \
    for (int k = 0; k < 8; k++) sum += out[k];                                   \
    return sum;

__attribute__((target("avx512f,avx512vl,fma"))) static float chains_ymm_avx512(long iters) {
    YMM_CHAINS(iters)
}

/* AVX2 has 16 ymm registers: 16 accumulators and the two constants would not fit (GCC 12 then
 * keeps three accumulators on the stack, whose store-to-load forwarding lengthens their chains
 * past the FMA latency and slows the whole loop), so 12 chains here: enough for 2 FMA ports of
 * latency up to 6. */
__attribute__((target("avx2,fma"))) static float chains_avx2(long iters) {
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
    __m256 a0 = _mm256_set1_ps(0.0f), a1 = _mm256_set1_ps(0.1f), a2 = _mm256_set1_ps(0.2f),
           a3 = _mm256_set1_ps(0.3f), a4 = _mm256_set1_ps(0.4f), a5 = _mm256_set1_ps(0.5f),
           a6 = _mm256_set1_ps(0.6f), a7 = _mm256_set1_ps(0.7f), a8 = _mm256_set1_ps(0.8f),
           a9 = _mm256_set1_ps(0.9f), a10 = _mm256_set1_ps(1.0f), a11 = _mm256_set1_ps(1.1f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm256_fmadd_ps(a0, m, c), a1 = _mm256_fmadd_ps(a1, m, c);
        a2 = _mm256_fmadd_ps(a2, m, c), a3 = _mm256_fmadd_ps(a3, m, c);
        a4 = _mm256_fmadd_ps(a4, m, c), a5 = _mm256_fmadd_ps(a5, m, c);
        a6 = _mm256_fmadd_ps(a6, m, c), a7 = _mm256_fmadd_ps(a7, m, c);
        a8 = _mm256_fmadd_ps(a8, m, c), a9 = _mm256_fmadd_ps(a9, m, c);
        a10 = _mm256_fmadd_ps(a10, m, c), a11 = _mm256_fmadd_ps(a11, m, c);
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float out[8], sum = 0;
    _mm256_storeu_ps(out, s);
    for (int k = 0; k < 8; k++) sum += out[k];
    return sum;
}

enum { ZMM, YMM, AVX2 };
static const char *const KIND_NAME[] = {"zmm", "ymm", "avx2"};

typedef struct {
    int cpu;
    long iters;
    int kind; /* ZMM, YMM (AVX-512VL) or AVX2 */
    pthread_barrier_t *start;
    volatile float sink;
    double start_s, done; /* when this thread started and finished (CLOCK_MONOTONIC, s) */
    int pinned;
} job;

static void *run(void *arg) {
    job *j = arg;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(j->cpu, &one);
    j->pinned = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
    pthread_barrier_wait(j->start);
    j->start_s = now_s();
    j->sink = j->kind == ZMM   ? chains_avx512(j->iters)
              : j->kind == YMM ? chains_ymm_avx512(j->iters)
                               : chains_avx2(j->iters);
    j->done = now_s();
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 40;
    long iters = argc > 2 ? atol(argv[2]) : 500000L;
    if (runs < 1 || runs > 1000 || iters < 1000) {
        fprintf(stderr, "usage: bench/fma_peak [runs (1-1000) [iterations (>= 1000)]]\n");
        return 2;
    }
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f");
    if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
        fprintf(stderr, "fma_peak: this CPU has neither AVX-512F nor AVX2+FMA\n");
        return 1;
    }
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0) {
        perror("fma_peak: sched_getaffinity");
        return 1;
    }
    int n = CPU_COUNT(&mask), cpus[CPU_SETSIZE], k = 0;
    for (int c = 0; c < CPU_SETSIZE && k < n; c++)
        if (CPU_ISSET(c, &mask)) cpus[k++] = c;
    /* On an AVX-512 CPU both widths, alternating run by run: a core that splits a zmm FMA
     * into two 256-bit halves (AMD Zen 4) may reach its ceiling with either, or run ymm at a
     * higher clock; the ceiling is the higher of the two. */
    const int kinds = avx512 ? 2 : 1, total = runs * kinds;
    job *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    double *rate = calloc((size_t)total, sizeof *rate);
    if (!jobs || !th || !rate) return 1;
    printf("fma_peak: %d threads pinned to CPUs", n);
    for (int i = 0; i < n; i++) printf(" %d", cpus[i]);
    printf("; %s, 16 independent FMA chains each, %ld iterations a run\n",
           avx512 ? "AVX-512, zmm (16 lanes) and ymm (8 lanes) runs alternating"
                  : "AVX2 (ymm)",
           iters);
    chains_avx2(iters / 10 + 1); /* wake the core up before the first run */
    for (int r = 0; r < total; r++) {
        int kind = avx512 ? r % 2 : AVX2; /* rate[r]: zmm at even r, ymm at odd */
        /* 2 FLOPs per lane per FMA: zmm 16 lanes x 16 chains, ymm 8 x 16, AVX2 8 x 12 */
        const double flops =
            2.0 * (kind == ZMM ? 16 : 8) * (kind == AVX2 ? 12.0 : 16.0) * (double)iters * n;
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, (unsigned)n + 1);
        for (int i = 0; i < n; i++) {
            jobs[i] = (job){.cpu = cpus[i], .iters = iters, .kind = kind, .start = &start};
            if (pthread_create(&th[i], NULL, run, &jobs[i]) != 0) {
                fprintf(stderr, "fma_peak: pthread_create failed\n");
                return 1;
            }
        }
        pthread_barrier_wait(&start);
        int pinned = 1;
        for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
        /* From the first thread's start to the last one's end, as each thread read the clock
         * (the main thread may be descheduled after the barrier). */
        double t0 = jobs[0].start_s, t1 = jobs[0].done;
        for (int i = 0; i < n; i++) {
            if (jobs[i].start_s < t0) t0 = jobs[i].start_s;
            if (jobs[i].done > t1) t1 = jobs[i].done;
            pinned &= jobs[i].pinned;
        }
        pthread_barrier_destroy(&start);
        rate[r] = flops / (t1 - t0) / 1e9;
        printf("run %d (%s): %.1f GFLOP/s (%.2f ms)%s\n", r / kinds + 1, KIND_NAME[kind],
               rate[r], (t1 - t0) * 1e3, pinned ? "" : " (a thread could not be pinned)");
    }
    /* Per width: its runs gathered, sorted; best and median. */
    double best[2] = {0, 0}, median[2] = {0, 0};
    double *one = calloc((size_t)runs, sizeof *one);
    if (!one) return 1;
    for (int w = 0; w < kinds; w++) {
        for (int r = 0; r < runs; r++) one[r] = rate[r * kinds + w];
        qsort(one, (size_t)runs, sizeof *one, cmp_double);
        best[w] = one[runs - 1];
        median[w] = runs % 2 ? one[runs / 2] : 0.5 * (one[runs / 2 - 1] + one[runs / 2]);
    }
    free(one);
    int win = kinds == 2 && best[1] > best[0] ? 1 : 0;
    if (kinds == 2)
        printf("fma_peak: zmm best %.1f (median %.1f), ymm best %.1f (median %.1f) GFLOP/s: "
               "the ceiling is %s's\n", best[0], median[0], best[1], median[1],
               KIND_NAME[win]);
    printf("fma_peak %.2f %.2f %d %s\n", best[win], median[win], n,
           avx512 ? (win ? "avx512-ymm" : "avx512-zmm") : "avx2");
    free(jobs), free(th), free(rate);
    return 0;
}
