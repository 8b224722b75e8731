/*
 * gpu_step.c — Ember's side of issue 20's speed rows (tests/gpu/run.sh bench), on any device:
 *
 *   bench/gpu_step --device DEV [--quick] [WORKLOAD...]
 *
 *   mlp          the training step of the MLP 784-512-256-10 (linear, ReLU, linear, ReLU,
 *                linear), batch 128: forward, cross_entropy (mean), em_backward, Adam step
 *                (registry "Adam", torch.optim.Adam's defaults), zero_grad (to none) —
 *                bench/train_step.c's train_mlp_b128, on DEV
 *   linear_MxKxN em_linear of x (M, K) by weight (N, K) plus bias (N), forward and backward
 *                (em_backward_with a fixed grad (M, N); gradients of x, weight and bias):
 *                linear_128x784x512, linear_128x512x256, linear_128x256x10 (the MLP's) and
 *                linear_8192x8192x8192
 *   add          em_add of two contiguous f32 tensors of 256M elements (1 GiB each): bytes
 *                moved 3 GiB (two read, one written)
 * Default: all of them. Every number is the median over 7 timed batches (3 with --quick) of
 * N calls each (after warm-up calls), each batch ended by em_device_synchronize; the host
 * clock times the batch. Output, one line per workload, for run.sh's table:
 *   ember WORKLOAD ms=<per call> [GBps=<bytes moved / time>]
 * --quick: a smaller add (16M elements), 8192 replaced by 1024 and a tenth of the calls, for a
 * rehearsal on the CPU.
 * Inputs are uniform random (never zeros), parameters as PyTorch initialises them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ember/ember.h>

static em_device dev;
static bool quick;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void die(const char *what) {
    fprintf(stderr, "gpu_step: %s: %s\n", what, em_last_error());
    exit(1);
}

/* A uniform tensor on dev (made on the CPU: the same numbers on every device). */
static em_tensor *rand_on(int ndim, const int64_t *shape, double lo, double hi) {
    em_tensor *c = em_empty(ndim, shape, EM_F32, em_cpu());
    if (!c || em_uniform_(c, lo, hi, NULL) != EM_OK) die("random input");
    em_tensor *t = em_to_device(c, dev);
    em_tensor_release(c);
    if (!t) die("to device");
    return t;
}

static em_tensor *param(int ndim, const int64_t *shape, int64_t fan_in) {
    double b = 1.0 / sqrt((double)fan_in);
    em_tensor *t = rand_on(ndim, shape, -b, b);
    if (em_requires_grad_(t, true) != EM_OK) die("requires_grad");
    return t;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over reps batches of n calls of fn, in ms per call. */
static double time_it(void (*fn)(void *), void *arg, int warm, int n, int reps) {
    if (quick) { /* a rehearsal: a tenth of the calls */
        warm = warm > 10 ? warm / 10 : 1;
        n = n > 20 ? n / 10 : 2;
    }
    for (int i = 0; i < warm; i++) fn(arg);
    if (em_device_synchronize(dev) != EM_OK) die("synchronize");
    double t[16];
    for (int r = 0; r < reps; r++) {
        double t0 = now_ms();
        for (int i = 0; i < n; i++) fn(arg);
        if (em_device_synchronize(dev) != EM_OK) die("synchronize");
        t[r] = (now_ms() - t0) / n;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

/* ---- the MLP step ---- */
typedef struct mlp {
    em_tensor *p[6], *x, *y;
    em_optimizer *opt;
} mlp;

static void mlp_step(void *arg) {
    mlp *m = arg;
    em_tensor *const *p = m->p;
    if (em_scope_begin() != EM_OK) die("scope");
    em_tensor *h = em_relu(em_linear(em_relu(em_linear(m->x, p[0], p[1])), p[2], p[3]));
    em_tensor *loss = em_cross_entropy(em_linear(h, p[4], p[5]), m->y, NULL, EM_REDUCTION_MEAN, -100, 0);
    if (!loss) die("mlp forward");
    if (em_backward(loss) != EM_OK) die("mlp backward");
    if (em_optimizer_step(m->opt) != EM_OK) die("mlp optimizer step");
    em_optimizer_zero_grad(m->opt);
    if (em_scope_end() != EM_OK) die("scope");
}

static void run_mlp(int reps) {
    mlp m;
    static const int64_t sh[6][2] = {{512, 784}, {512, 0}, {256, 512}, {256, 0}, {10, 256}, {10, 0}};
    static const int64_t fan[6] = {784, 784, 512, 512, 256, 256};
    em_dict *params = em_dict_new();
    for (int i = 0; i < 6; i++) {
        m.p[i] = param(sh[i][1] ? 2 : 1, sh[i], fan[i]);
        char name[16]; /* room for any int: -Wformat-truncation at -O1 */
        snprintf(name, sizeof name, "%d", i);
        if (!params || em_dict_set(params, name, m.p[i]) != EM_OK) die("parameters");
    }
    m.opt = em_optimizer_new("Adam", params, NULL);
    em_dict_free(params);
    if (!m.opt) die("optimizer");
    m.x = rand_on(2, (int64_t[]){128, 784}, 0, 1);
    em_tensor *u = rand_on(1, (int64_t[]){128}, 0, 10);
    m.y = em_to_dtype(u, EM_I64); /* truncation: labels uniform in 0..9 */
    em_tensor_release(u);
    if (!m.y) die("labels");
    double ms = time_it(mlp_step, &m, 20, 100, reps);
    printf("ember mlp ms=%.6f\n", ms);
    em_optimizer_free(m.opt);
    for (int i = 0; i < 6; i++) em_tensor_release(m.p[i]);
    em_tensor_release(m.x);
    em_tensor_release(m.y);
}

/* ---- linear forward + backward ---- */
typedef struct lin {
    em_tensor *x, *w, *b, *g;
} lin;

static void lin_step(void *arg) {
    lin *l = arg;
    if (em_scope_begin() != EM_OK) die("scope");
    em_tensor *y = em_linear(l->x, l->w, l->b);
    if (!y || em_backward_with(y, l->g, NULL) != EM_OK) die("linear forward/backward");
    /* Gradients accumulate into .grad: drop them so every call computes the same thing. */
    if (em_tensor_set_grad(l->x, NULL) != EM_OK || em_tensor_set_grad(l->w, NULL) != EM_OK ||
        em_tensor_set_grad(l->b, NULL) != EM_OK)
        die("clearing grads");
    if (em_scope_end() != EM_OK) die("scope");
}

static void run_linear(int64_t M, int64_t K, int64_t N, int reps) {
    lin l = {.x = rand_on(2, (int64_t[]){M, K}, 0, 1), .g = rand_on(2, (int64_t[]){M, N}, -1, 1)};
    l.w = param(2, (int64_t[]){N, K}, K);
    l.b = param(1, (int64_t[]){N}, K);
    if (em_requires_grad_(l.x, true) != EM_OK) die("requires_grad");
    double flop = 3 * 2.0 * (double)M * (double)K * (double)N;
    int n = flop > 1e10 ? 5 : 200;
    double ms = time_it(lin_step, &l, n > 5 ? 20 : 2, n, reps);
    printf("ember linear_%lldx%lldx%lld ms=%.6f TFLOPs=%.2f\n", (long long)M, (long long)K, (long long)N, ms,
           flop / (ms * 1e-3) / 1e12);
    em_tensor_release(l.x);
    em_tensor_release(l.w);
    em_tensor_release(l.b);
    em_tensor_release(l.g);
}

/* ---- contiguous add ---- */
typedef struct add {
    em_tensor *a, *b;
} add;

static void add_step(void *arg) {
    add *s = arg;
    em_tensor *c = em_add(s->a, s->b);
    if (!c) die("add");
    em_tensor_release(c); /* its block goes back to the cache: the next add reuses it */
}

static void run_add(int reps) {
    int64_t n = quick ? (int64_t)1 << 24 : (int64_t)1 << 28;
    add s = {.a = rand_on(1, &n, -1, 1), .b = rand_on(1, &n, -1, 1)};
    double ms = time_it(add_step, &s, 3, 20, reps);
    double bytes = 3.0 * (double)n * sizeof(float);
    printf("ember add_%lldM ms=%.6f GBps=%.1f\n", (long long)(n >> 20), ms, bytes / (ms * 1e-3) / 1e9);
    em_tensor_release(s.a);
    em_tensor_release(s.b);
}

int main(int argc, char **argv) {
    const char *dev_name = NULL;
    const char *which[16];
    int nw = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) dev_name = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (nw < 16) which[nw++] = argv[i];
    }
    if (!dev_name) {
        fprintf(stderr, "usage: gpu_step --device DEV [--quick] [mlp|linear|add ...]\n");
        return 2;
    }
    if (em_init() != EM_OK) die("em_init");
    if (em_device_parse(dev_name, &dev) != EM_OK) die("--device");
    em_seed(0);
    int reps = quick ? 3 : 7;
    int64_t big = quick ? 1024 : 8192;
    bool all = nw == 0;
    for (int i = 0; i < (all ? 3 : nw); i++) {
        const char *w = all ? (const char *[]){"mlp", "linear", "add"}[i] : which[i];
        if (!strcmp(w, "mlp")) {
            run_mlp(reps);
        } else if (!strcmp(w, "linear")) {
            run_linear(128, 784, 512, reps);
            run_linear(128, 512, 256, reps);
            run_linear(128, 256, 10, reps);
            run_linear(big, big, big, reps);
        } else if (!strcmp(w, "add")) {
            run_add(reps);
        } else {
            fprintf(stderr, "gpu_step: unknown workload '%s' (mlp, linear, add)\n", w);
            em_shutdown();
            return 2;
        }
        fflush(stdout);
    }
    em_shutdown();
    return 0;
}
