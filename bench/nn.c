/*
 * bench/nn.c — conv2d forward, backward-data and backward-weight for the CNN of issue 3
 * (batch 64: conv 1 -> 32, 3x3, padding 1 on 28x28; conv 32 -> 64, 3x3, padding 1 on 14x14),
 * f32, through oneDNN and through the im2col + GEMM loops (EMBER_CPU_DISABLE_DNNL=1 and a
 * re-init), plus max_pool2d 2x2 forward/backward and softmax of the same batch. Prints the
 * median of 7 repeats (after 2 warm-up calls) in milliseconds of wall time and of the
 * process's CPU time (all threads; on a loaded machine CPU time at 1 thread is the steadier
 * figure), never asserts.
 *
 *     bench/nn            # EMBER_NUM_THREADS sets the thread count
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <ember/ember.h>

#define REPEATS 7

static double clock_ms(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}
static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }
static double cpu_ms(void) { return clock_ms(CLOCK_PROCESS_CPUTIME_ID); }

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct layer {
    const char *name;
    int64_t x[4], w[4];
} layer;

static const layer layers[] = {
    {"conv1 1->32 28x28", {64, 1, 28, 28}, {32, 1, 3, 3}},
    {"conv2 32->64 14x14", {64, 32, 14, 14}, {64, 32, 3, 3}},
};

enum { FWD, BWD_DATA, BWD_WEIGHT };

/* Median wall time; *cpu gets the median CPU time. */
static double time_conv(const layer *l, int which, double *cpu) {
    static const int64_t one[2] = {1, 1};
    double t[REPEATS], c[REPEATS];
    em_scope_begin();
    em_tensor *x = em_empty(4, l->x, EM_F32, em_cpu()), *w = em_empty(4, l->w, EM_F32, em_cpu());
    em_tensor *b = em_empty(1, l->w, EM_F32, em_cpu());
    em_uniform_(x, -1, 1, NULL), em_uniform_(w, -1, 1, NULL), em_uniform_(b, -1, 1, NULL);
    em_tensor *y = em_conv2d(x, w, b, one, one, one, 1);
    if (!y) {
        fprintf(stderr, "conv2d: %s\n", em_last_error());
        exit(1);
    }
    int64_t hw[2] = {l->x[2], l->x[3]}, k[2] = {l->w[2], l->w[3]};
    for (int r = -2; r < REPEATS; r++) {
        em_scope_begin();
        double t0 = now_ms(), c0 = cpu_ms();
        em_tensor *gw, *gb;
        if (which == FWD) em_conv2d(x, w, b, one, one, one, 1);
        else if (which == BWD_DATA) em_conv2d_backward_data(y, w, hw, one, one, one, 1);
        else em_conv2d_backward_weight(x, y, k, one, one, one, 1, &gw, &gb);
        double t1 = now_ms(), c1 = cpu_ms();
        if (r >= 0) t[r] = t1 - t0, c[r] = c1 - c0;
        em_scope_end();
    }
    em_scope_end();
    qsort(t, REPEATS, sizeof t[0], cmp);
    qsort(c, REPEATS, sizeof c[0], cmp);
    *cpu = c[REPEATS / 2];
    return t[REPEATS / 2];
}

static void run_convs(const char *path) {
    static const char *const what[] = {"forward", "backward_data", "backward_weight"};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) {
            double cpu, wall = time_conv(&layers[i], k, &cpu);
            printf("conv2d %-20s %-16s %-7s %8.3f ms wall %8.3f ms cpu\n", layers[i].name,
                   what[k], path, wall, cpu);
        }
}

static void run_others(void) {
    double t[3][REPEATS];
    em_scope_begin();
    int64_t xs[4] = {64, 32, 28, 28}, ss[2] = {64, 10}, k2[2] = {2, 2}, hw[2] = {28, 28};
    em_tensor *x = em_empty(4, xs, EM_F32, em_cpu()), *s = em_empty(2, ss, EM_F32, em_cpu());
    em_uniform_(x, -1, 1, NULL), em_uniform_(s, -1, 1, NULL);
    for (int r = -2; r < REPEATS; r++) {
        em_scope_begin();
        em_tensor *y, *idx;
        double t0 = now_ms();
        em_max_pool2d(x, k2, NULL, NULL, NULL, false, &y, &idx);
        double t1 = now_ms();
        em_max_pool2d_backward(y, idx, hw);
        double t2 = now_ms();
        em_log_softmax(s, 1);
        double t3 = now_ms();
        if (r >= 0) t[0][r] = t1 - t0, t[1][r] = t2 - t1, t[2][r] = t3 - t2;
        em_scope_end();
    }
    em_scope_end();
    static const char *const names[] = {"max_pool2d 2x2 (64,32,28,28) forward",
                                        "max_pool2d 2x2 (64,32,28,28) backward",
                                        "log_softmax (64,10)"};
    for (int i = 0; i < 3; i++) {
        qsort(t[i], REPEATS, sizeof t[i][0], cmp);
        printf("%-45s %8.3f ms\n", names[i], t[i][REPEATS / 2]);
    }
}

int main(void) {
    if (em_init() != EM_OK) {
        fprintf(stderr, "em_init: %s\n", em_last_error());
        return 1;
    }
    printf("threads: %d\n", em_num_threads());
    run_convs("oneDNN");
    run_others();
    em_shutdown();
    setenv("EMBER_CPU_DISABLE_DNNL", "1", 1);
    if (em_init() != EM_OK) {
        fprintf(stderr, "em_init: %s\n", em_last_error());
        return 1;
    }
    run_convs("im2col");
    em_shutdown();
    return 0;
}
