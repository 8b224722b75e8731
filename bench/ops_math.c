/*
 * bench/ops_math.c — ns per element of f32 exp, tanh, sigmoid (and gelu, sqrt, a scalar mul)
 * on a contiguous 16M-element tensor through the public API, into a fresh output each call
 * (the caching allocator reuses the block), at 1 thread and at em_num_threads(). Median of
 * 7 repeats (CLOCK_MONOTONIC). Printed, never asserted.
 *
 *     bench/ops_math            # 16M elements
 *     bench/ops_math 1000000    # another size
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <ember/ember.h>

#define REPEATS 7

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static em_tensor *b_exp(const em_tensor *x) { return em_exp(x); }
static em_tensor *b_tanh(const em_tensor *x) { return em_tanh(x); }
static em_tensor *b_sigmoid(const em_tensor *x) { return em_sigmoid(x); }
static em_tensor *b_gelu(const em_tensor *x) { return em_gelu(x, NULL); }
static em_tensor *b_sqrt(const em_tensor *x) { return em_sqrt(x); }
static em_tensor *b_mul(const em_tensor *x) { return em_mul_scalar(x, 0.5); }

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 16 << 20;
    if (em_init() != EM_OK) {
        fprintf(stderr, "em_init: %s\n", em_last_error());
        return 1;
    }
    em_tensor *x = em_empty(1, &n, EM_F32, em_cpu());
    /* inputs in [0, 4): positive, so sqrt is defined everywhere */
    if (!x || em_uniform_(x, 0, 4, NULL) != EM_OK) {
        fprintf(stderr, "%s\n", em_last_error());
        return 1;
    }
    const struct {
        const char *name;
        em_tensor *(*fn)(const em_tensor *);
    } ops[] = {{"exp", b_exp},   {"tanh", b_tanh}, {"sigmoid", b_sigmoid},
               {"gelu", b_gelu}, {"sqrt", b_sqrt}, {"mul_scalar", b_mul}};
    int nt_all = em_num_threads(), nts[2] = {1, nt_all};
    printf("f32, %lld elements, contiguous; ns per element (median of %d)\n", (long long)n,
           REPEATS);
    printf("%-12s %12s %12s\n", "op", "1 thread", nt_all == 1 ? "(1 thread)" : "all threads");
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        double ns[2];
        for (int t = 0; t < 2; t++) {
            em_set_num_threads(nts[t]);
            double times[REPEATS];
            em_tensor_release(ops[k].fn(x)); /* warm-up: output block cached */
            for (int r = 0; r < REPEATS; r++) {
                double t0 = now_s();
                em_tensor *y = ops[k].fn(x);
                times[r] = now_s() - t0;
                if (!y) {
                    fprintf(stderr, "%s: %s\n", ops[k].name, em_last_error());
                    return 1;
                }
                em_tensor_release(y);
            }
            qsort(times, REPEATS, sizeof times[0], cmp);
            ns[t] = times[REPEATS / 2] * 1e9 / (double)n;
        }
        printf("%-12s %12.3f %12.3f\n", ops[k].name, ns[0], ns[1]);
    }
    em_set_num_threads(nt_all);
    em_tensor_release(x);
    em_shutdown();
    return 0;
}
