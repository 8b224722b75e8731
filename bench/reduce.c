/*
 * bench/reduce.c — reductions over a (4096, 1024) float32 tensor, in nanoseconds per input
 * element (median and best of 7 repeats, CLOCK_MONOTONIC, after a warm-up call), at the
 * thread count EMBER_NUM_THREADS gives (default: the core count). On a shared machine the
 * best is the steadier figure.
 *
 * Rows: sum over dim 0 (the bias-gradient shape: a (1024) result), sum over dim 1 (a (4096)
 * result), sum over all, and the other reductions of ember/ops.h over dim 0 and dim 1.
 * The figures are printed, never asserted.
 *
 *     bench/reduce            # defaults
 *     bench/reduce 20         # calls per timed repeat
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <ember/ember.h>

#define REPEATS 7
#define ROWS 4096
#define COLS 1024

typedef enum { SUM, AMAX, ARGMAX, VAR, LSE, NORM2, PROD, ANY, N_OPS } bench_op;
static const char *const names[N_OPS] = {"sum", "amax", "argmax", "var", "logsumexp",
                                         "norm2", "prod", "any"};

static em_tensor *run(bench_op op, const em_tensor *x, int ndims, const int *dims) {
    switch (op) {
    case SUM: return em_sum(x, ndims, dims, false);
    case AMAX: return em_amax(x, ndims, dims, false);
    case ARGMAX: return em_argmax(x, ndims ? dims : NULL, false);
    case VAR: return em_var(x, ndims, dims, 1.0, false);
    case LSE: return em_logsumexp(x, ndims, dims, false);
    case NORM2: return em_norm(x, 2.0, ndims, dims, false);
    case PROD: return em_prod(x, ndims, dims, false);
    case ANY: return em_any(x, ndims, dims, false);
    default: return NULL;
    }
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median ns per input element of `iters` calls; *best gets the fastest repeat. */
static double time_op(bench_op op, const em_tensor *x, int ndims, const int *dims, int iters,
                      double *best) {
    double t[REPEATS];
    em_tensor *w = run(op, x, ndims, dims);
    if (!w) {
        fprintf(stderr, "%s: %s\n", names[op], em_last_error());
        exit(1);
    }
    em_tensor_release(w);
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < iters; i++) em_tensor_release(run(op, x, ndims, dims));
        t[r] = (now_ns() - t0) / iters / ((double)ROWS * COLS);
    }
    qsort(t, REPEATS, sizeof t[0], cmp);
    *best = t[0];
    return t[REPEATS / 2];
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (em_init() != EM_OK) {
        fprintf(stderr, "em_init: %s\n", em_last_error());
        return 1;
    }
    int64_t shape[2] = {ROWS, COLS};
    em_tensor *x = em_empty(2, shape, EM_F32, em_cpu());
    if (!x || em_uniform_(x, 0.5, 1.5, NULL) != EM_OK) {
        fprintf(stderr, "%s\n", em_last_error());
        return 1;
    }
    printf("ember %s — reductions of a (%d, %d) float32 tensor, %d thread%s, median of %d\n",
           EM_VERSION_STRING, ROWS, COLS, em_num_threads(), em_num_threads() == 1 ? "" : "s",
           REPEATS);
    printf("ns per element, median (best)\n%-12s %16s %16s %16s\n", "op", "dim 0", "dim 1",
           "all");
    const int d0[1] = {0}, d1[1] = {1};
    for (bench_op op = SUM; op < N_OPS; op++) {
        double b0, b1, b2;
        double m0 = time_op(op, x, 1, d0, iters, &b0), m1 = time_op(op, x, 1, d1, iters, &b1);
        double m2 = time_op(op, x, 0, NULL, iters, &b2);
        printf("%-12s %7.3f (%6.3f) %7.3f (%6.3f) %7.3f (%6.3f)\n", names[op], m0, b0, m1, b1,
               m2, b2);
    }
    em_tensor_release(x);
    em_shutdown();
    return 0;
}
