/*
 * profiler.c — what the op profiler and its trace cost per op call (issue 23, item 5), and what
 * that makes of a CNN training step.
 *
 *   bench/profiler [iterations]        (default 200,000 calls per timed loop)
 *
 * Rows, in ns per call (median of 7 timed loops after a warm-up loop, the three modes
 * interleaved so that a loaded machine slows each alike):
 *   add_out_off        em_op_call_out("add") on 1-element float32 tensors, nothing observing
 *   add_out_profiled   the same under em_profiler_begin without a trace (--profile)
 *   add_out_traced     the same under a tracing profiler (--trace), its timeline written to
 *                      /dev/null after each loop (the write's cost is in the figure)
 * Then the CNN step of bench/train_step (conv 1->32, conv 32->64, two linears, batch 64 of
 * 1x28x28, cross_entropy, backward, Adam): the calls and spans one step records, the step's
 * time with nothing observing (the minimum of 10 steps: the least disturbed), and the
 * profiler's and the trace's cost per step estimated as calls x (the row's cost - off), as a
 * share of that step. The off row is the op's whole cost with no observer: with none pushed
 * an op pays one thread-local load and a branch for observers, and em_loader_next and
 * em_optimizer_step one more for spans.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ember/ember.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "profiler: %s: %s\n", what, em_last_error());
    exit(1);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One timed loop of `iters` adds in mode 0 (off), 1 (profiled), 2 (traced): ns per call. */
static double add_loop(int mode, long iters, const em_op *add, const em_tensor *const *in,
                       em_tensor *out) {
    em_profiler_options o = {.struct_size = sizeof o, .trace = mode == 2};
    em_profiler *p = mode ? em_profiler_begin(&o) : NULL;
    if (mode && !p) die("profiler_begin");
    double t0 = now_ns();
    for (long i = 0; i < iters; i++)
        if (em_op_call_out(add, in, 2, NULL, &out, 1) != EM_OK) die("add");
    if (p) {
        if (em_profiler_end(p) != EM_OK) die("profiler_end");
        if (mode == 2) {
            FILE *f = fopen("/dev/null", "w");
            if (!f || em_profiler_write_trace(p, f) != EM_OK) die("write_trace");
            fclose(f);
        }
    }
    double t = (now_ns() - t0) / (double)iters;
    em_profiler_free(p);
    return t;
}

static em_tensor *param(int ndim, const int64_t *shape, int64_t fan_in) {
    em_tensor *t = em_empty(ndim, shape, EM_F32, em_cpu());
    double b = 1.0 / sqrt((double)fan_in);
    if (!t || em_uniform_(t, -b, b, NULL) != EM_OK || em_requires_grad_(t, true) != EM_OK)
        die("parameter");
    return t;
}

static void cnn_step(em_tensor *const *p, const em_tensor *x, const em_tensor *y,
                     em_optimizer *opt) {
    if (em_scope_begin() != EM_OK) die("scope");
    const int64_t pad[2] = {1, 1}, k2[2] = {2, 2};
    em_tensor *a = em_relu(em_conv2d(x, p[0], p[1], NULL, pad, NULL, 1));
    if (!a || em_max_pool2d(a, k2, NULL, NULL, NULL, false, &a, NULL) != EM_OK) die("pool1");
    a = em_relu(em_conv2d(a, p[2], p[3], NULL, pad, NULL, 1));
    if (!a || em_max_pool2d(a, k2, NULL, NULL, NULL, false, &a, NULL) != EM_OK) die("pool2");
    em_tensor *h = em_linear(em_relu(em_linear(em_flatten(a, 1, 3), p[4], p[5])), p[6], p[7]);
    em_tensor *loss = em_cross_entropy(h, y, NULL, EM_REDUCTION_MEAN, -100, 0);
    if (!loss || em_backward(loss) != EM_OK) die("forward/backward");
    if (em_optimizer_step(opt) != EM_OK) die("optimizer step");
    em_optimizer_zero_grad(opt);
    if (em_scope_end() != EM_OK) die("scope");
}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 200000;
    if (iters < 1) iters = 200000;
    if (em_init() != EM_OK) die("em_init");
    const em_op *add = em_op_find("add");
    if (!add) die("add");
    em_tensor *a = em_ones(1, (int64_t[]){1}, EM_F32, em_cpu());
    em_tensor *b = em_ones(1, (int64_t[]){1}, EM_F32, em_cpu());
    em_tensor *c = em_zeros(1, (int64_t[]){1}, EM_F32, em_cpu());
    if (!a || !b || !c) die("tensors");
    const em_tensor *in[2] = {a, b};
    enum { REPS = 7 };
    double t[3][REPS];
    for (int m = 0; m < 3; m++) add_loop(m, iters / 4, add, in, c); /* warm-up */
    for (int r = 0; r < REPS; r++)
        for (int m = 0; m < 3; m++) t[m][r] = add_loop(m, iters, add, in, c);
    const char *names[3] = {"add_out_off", "add_out_profiled", "add_out_traced"};
    double med[3];
    for (int m = 0; m < 3; m++) {
        qsort(t[m], REPS, sizeof t[m][0], cmp_double);
        med[m] = t[m][REPS / 2];
        printf("%-18s %8.1f ns/call (min %.1f, max %.1f)\n", names[m], med[m], t[m][0],
               t[m][REPS - 1]);
    }

    /* The CNN step: its calls, and its time with nothing observing. */
    em_tensor *p[8] = {
        param(4, (int64_t[]){32, 1, 3, 3}, 9),     param(1, (int64_t[]){32}, 9),
        param(4, (int64_t[]){64, 32, 3, 3}, 288),  param(1, (int64_t[]){64}, 288),
        param(2, (int64_t[]){128, 3136}, 3136),    param(1, (int64_t[]){128}, 3136),
        param(2, (int64_t[]){10, 128}, 128),       param(1, (int64_t[]){10}, 128)};
    em_tensor *x = em_empty(4, (int64_t[]){64, 1, 28, 28}, EM_F32, em_cpu());
    em_tensor *u = em_empty(1, (int64_t[]){64}, EM_F32, em_cpu());
    if (!x || !u || em_uniform_(x, 0, 1, NULL) != EM_OK || em_uniform_(u, 0, 10, NULL) != EM_OK)
        die("batch");
    em_tensor *y = em_to_dtype(u, EM_I64); /* truncation: uniform in 0..9 */
    em_tensor_release(u);
    if (!y) die("labels");
    em_dict *params = em_dict_new();
    for (int i = 0; i < 8; i++) {
        char k[16]; /* "p" and any int: -O1's format-truncation check */
        snprintf(k, sizeof k, "p%d", i);
        if (em_dict_set(params, k, p[i]) != EM_OK) die("dict");
    }
    em_optimizer *opt = em_optimizer_new("Adam", params, NULL);
    if (!opt) die("Adam");
    cnn_step(p, x, y, opt); /* warm-up */
    em_profiler_options o = {.struct_size = sizeof o, .trace = true};
    em_profiler *prof = em_profiler_begin(&o);
    if (!prof) die("profiler_begin");
    cnn_step(p, x, y, opt);
    em_profiler_end(prof);
    uint64_t calls = 0;
    for (size_t i = 0; i < em_profiler_row_count(prof); i++) calls += em_profiler_row(prof, i)->calls;
    em_profiler_free(prof);
    double best = INFINITY;
    for (int i = 0; i < 10; i++) {
        double t0 = now_ns();
        cnn_step(p, x, y, opt);
        double d = now_ns() - t0;
        if (d < best) best = d;
    }
    double prof_ns = (double)calls * (med[1] - med[0]), trace_ns = (double)calls * (med[2] - med[0]);
    printf("cnn_step: %llu calls per step, %.2f ms per step with nothing observing (min of 10)\n",
           (unsigned long long)calls, best / 1e6);
    printf("  --profile: %.3f ms per step (%.2f%%)\n", prof_ns / 1e6, 100.0 * prof_ns / best);
    printf("  --trace:   %.3f ms per step (%.2f%%)\n", trace_ns / 1e6, 100.0 * trace_ns / best);

    em_optimizer_free(opt);
    em_dict_free(params);
    for (int i = 0; i < 8; i++) em_tensor_release(p[i]);
    em_tensor_release(x), em_tensor_release(y);
    em_tensor_release(a), em_tensor_release(b), em_tensor_release(c);
    em_shutdown();
    return 0;
}
