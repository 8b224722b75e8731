/*
 * bench/nn.c — per-layer timings of the CNN of issue 3 (batch 64: conv 1 -> 32, 3x3, padding
 * 1 on 28x28; max_pool2d 2x2; conv 32 -> 64, 3x3, padding 1 on 14x14; max_pool2d 2x2;
 * log_softmax of the logits), forward and backward, in f32 and in bf16 side by side:
 *
 *   f32          the f32 op (oneDNN for conv and softmax; our AVX-512 loop for max_pool2d)
 *   bf16         the bf16 op as the public API runs it now (oneDNN's bf16 kernels; our bf16
 *                max_pool2d)
 *   bf16 via f32 what a bf16 call cost when the core converted to f32: em_to_dtype of each
 *                input to f32, the f32 op, the result rounded back to bf16
 *
 * then bf16/f32 and (bf16 via f32)/bf16 ratios. Each figure is the median of REPEATS calls
 * (after 2 warm-up calls) of the process's CPU time (all threads; on a loaded machine CPU time
 * is the steadier figure) and of wall time, in milliseconds; ratios are of CPU times. Then the
 * f32 convolutions through the im2col + GEMM loops (EMBER_CPU_DISABLE_DNNL=1 and a re-init).
 * Never asserts.
 *
 *     bench/nn [--repeats N] [--no-im2col]     # EMBER_NUM_THREADS sets the thread count
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ember/ember.h>

static int repeats = 7;

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

static void die(const char *what) {
    fprintf(stderr, "bench/nn: %s: %s\n", what, em_last_error());
    exit(1);
}

/* ---- the workloads ----------------------------------------------------------------------------- */

typedef enum { CONV_FWD, CONV_BWD_DATA, CONV_BWD_WEIGHT, POOL_FWD, POOL_BWD, LOGSM_FWD, LOGSM_BWD } kind;

typedef enum { AS_F32, AS_BF16, VIA_F32 } mode;

/* One layer's tensors in one dtype: x, w, b, the forward's output y (also the grad_output of
 * the backward rows), max_pool2d's indices. */
typedef struct operands {
    em_tensor *x, *w, *b, *y, *idx;
} operands;

typedef struct row {
    const char *layer, *op;
    kind k;
    int64_t x[4], w[4]; /* w unused for pooling and softmax */
} row;

static const row rows[] = {
    {"conv1 1->32 28x28", "forward", CONV_FWD, {64, 1, 28, 28}, {32, 1, 3, 3}},
    {"conv1 1->32 28x28", "backward_data", CONV_BWD_DATA, {64, 1, 28, 28}, {32, 1, 3, 3}},
    {"conv1 1->32 28x28", "backward_weight", CONV_BWD_WEIGHT, {64, 1, 28, 28}, {32, 1, 3, 3}},
    {"pool1 (64,32,28,28)", "forward", POOL_FWD, {64, 32, 28, 28}, {0}},
    {"pool1 (64,32,28,28)", "backward", POOL_BWD, {64, 32, 28, 28}, {0}},
    {"conv2 32->64 14x14", "forward", CONV_FWD, {64, 32, 14, 14}, {64, 32, 3, 3}},
    {"conv2 32->64 14x14", "backward_data", CONV_BWD_DATA, {64, 32, 14, 14}, {64, 32, 3, 3}},
    {"conv2 32->64 14x14", "backward_weight", CONV_BWD_WEIGHT, {64, 32, 14, 14}, {64, 32, 3, 3}},
    {"pool2 (64,64,14,14)", "forward", POOL_FWD, {64, 64, 14, 14}, {0}},
    {"pool2 (64,64,14,14)", "backward", POOL_BWD, {64, 64, 14, 14}, {0}},
    {"log_softmax (64,10)", "forward", LOGSM_FWD, {64, 10, 1, 1}, {0}},
    {"log_softmax (64,10)", "backward", LOGSM_BWD, {64, 10, 1, 1}, {0}},
};

static const int64_t one[2] = {1, 1}, two[2] = {2, 2};

static bool is_conv(kind k) { return k <= CONV_BWD_WEIGHT; }
static bool is_pool(kind k) { return k == POOL_FWD || k == POOL_BWD; }

/* Operands of row r in dtype dt (in the caller's scope). */
static operands make(const row *r, em_dtype dt) {
    operands o = {0};
    int nd = r->k >= LOGSM_FWD ? 2 : 4;
    o.x = em_empty(nd, r->x, dt, em_cpu());
    if (!o.x || em_uniform_(o.x, -1, 1, NULL) != EM_OK) die("input");
    if (is_conv(r->k)) {
        o.w = em_empty(4, r->w, dt, em_cpu());
        o.b = em_empty(1, r->w, dt, em_cpu());
        if (!o.w || !o.b || em_uniform_(o.w, -1, 1, NULL) != EM_OK ||
            em_uniform_(o.b, -1, 1, NULL) != EM_OK)
            die("weight");
        o.y = em_conv2d(o.x, o.w, o.b, one, one, one, 1);
    } else if (is_pool(r->k)) {
        if (em_max_pool2d(o.x, two, NULL, NULL, NULL, false, &o.y, &o.idx) != EM_OK) o.y = NULL;
    } else {
        o.y = em_log_softmax(o.x, 1);
    }
    if (!o.y) die(r->layer);
    return o;
}

static em_tensor *to(const em_tensor *t, em_dtype dt) {
    em_tensor *r = em_to_dtype(t, dt);
    if (!r) die("to_dtype");
    return r;
}

/* One call of row r on operands o: its own dtype, or (VIA_F32) converted to f32 and back. */
static void call(const row *r, const operands *o, mode m) {
    bool via = m == VIA_F32;
    const em_tensor *x = via ? to(o->x, EM_F32) : o->x, *y = via ? to(o->y, EM_F32) : o->y;
    const em_tensor *w = o->w && via ? to(o->w, EM_F32) : o->w;
    const em_tensor *b = o->b && via ? to(o->b, EM_F32) : o->b;
    int64_t hw[2] = {r->x[2], r->x[3]}, k[2] = {r->w[2], r->w[3]};
    em_tensor *res[2] = {NULL, NULL};
    em_status st = EM_OK;
    switch (r->k) {
    case CONV_FWD: res[0] = em_conv2d(x, w, b, one, one, one, 1); break;
    case CONV_BWD_DATA: res[0] = em_conv2d_backward_data(y, w, hw, one, one, one, 1); break;
    case CONV_BWD_WEIGHT:
        st = em_conv2d_backward_weight(x, y, k, one, one, one, 1, &res[0], &res[1]);
        break;
    case POOL_FWD: st = em_max_pool2d(x, two, NULL, NULL, NULL, false, &res[0], &res[1]); break;
    case POOL_BWD: res[0] = em_max_pool2d_backward(y, o->idx, hw); break;
    case LOGSM_FWD: res[0] = em_log_softmax(x, 1); break;
    case LOGSM_BWD: res[0] = em_log_softmax_backward(y, y, 1); break;
    }
    if (st != EM_OK || !res[0]) die(r->op);
    if (via) /* the core rounded the floating results back */
        for (int i = 0; i < 2; i++)
            if (res[i] && em_dtype_is_floating(em_tensor_dtype(res[i]))) to(res[i], EM_BF16);
}

/* Median wall and CPU time of row r in mode m. */
static void time_row(const row *r, mode m, double *wall, double *cpu) {
    double *t = malloc(sizeof(double) * (size_t)repeats), *c = malloc(sizeof(double) * (size_t)repeats);
    em_scope_begin();
    operands o = make(r, m == AS_F32 ? EM_F32 : EM_BF16);
    for (int i = -2; i < repeats; i++) {
        em_scope_begin();
        double t0 = now_ms(), c0 = cpu_ms();
        call(r, &o, m);
        double t1 = now_ms(), c1 = cpu_ms();
        em_scope_end();
        if (i >= 0) t[i] = t1 - t0, c[i] = c1 - c0;
    }
    em_scope_end();
    qsort(t, (size_t)repeats, sizeof t[0], cmp);
    qsort(c, (size_t)repeats, sizeof c[0], cmp);
    *wall = t[repeats / 2];
    *cpu = c[repeats / 2];
    free(t), free(c);
}

static void run_table(void) {
    printf("%-20s %-16s %17s %17s %17s %8s %9s\n", "layer", "op", "f32 cpu/wall ms",
           "bf16 cpu/wall ms", "via-f32 cpu/wall", "bf16/f32", "via/bf16");
    double sum[3] = {0};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double w[3], c[3];
        for (int m = 0; m < 3; m++) {
            time_row(&rows[i], (mode)m, &w[m], &c[m]);
            sum[m] += c[m];
        }
        printf("%-20s %-16s %8.3f/%8.3f %8.3f/%8.3f %8.3f/%8.3f %8.2f %9.2f\n", rows[i].layer,
               rows[i].op, c[0], w[0], c[1], w[1], c[2], w[2], c[1] / c[0], c[2] / c[1]);
    }
    printf("%-37s %8.3f %17.3f %17.3f %17.2f %9.2f\n", "sum of the rows (cpu ms)", sum[0], sum[1],
           sum[2], sum[1] / sum[0], sum[2] / sum[1]);
}

/* The f32 convolutions through the im2col + GEMM loops. */
static void run_im2col(void) {
    printf("\nf32 convolutions through im2col + GEMM (EMBER_CPU_DISABLE_DNNL=1):\n");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (!is_conv(rows[i].k)) continue;
        double w, c;
        time_row(&rows[i], AS_F32, &w, &c);
        printf("%-20s %-16s %8.3f/%8.3f\n", rows[i].layer, rows[i].op, c, w);
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench/nn [--repeats N] [--no-im2col]\n"
               "Per-layer timings of the CNN's conv2d, max_pool2d and log_softmax (batch 64),\n"
               "forward and backward, in f32, in bf16, and in bf16 converted through f32 (the\n"
               "cost before bf16 kernels), with bf16/f32 ratios of CPU time; then the f32\n"
               "convolutions through the im2col loops unless --no-im2col.\n"
               "Each figure: median of N calls (default 7) after 2 warm-ups, CPU and wall ms.\n"
               "EMBER_NUM_THREADS sets the thread count.\n");
}

int main(int argc, char **argv) {
    bool im2col = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--no-im2col") == 0) {
            im2col = false;
        } else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            repeats = atoi(argv[++i]);
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (em_init() != EM_OK) die("em_init");
    printf("threads: %d, median of %d calls\n", em_num_threads(), repeats);
    run_table();
    em_shutdown();
    if (!im2col) return 0;
    setenv("EMBER_CPU_DISABLE_DNNL", "1", 1);
    if (em_init() != EM_OK) die("em_init");
    run_im2col();
    em_shutdown();
    return 0;
}
