/*
 * gpu_step.c — Ember's side of issue 20's speed rows (tests/gpu/run.sh bench), on any device:
 *
 *   bench/gpu_step --device DEV [--quick] [--plugin PATH] [WORKLOAD...]
 *
 *   mlp          the training step of the MLP 784-512-256-10 (linear, ReLU, linear, ReLU,
 *                linear), batch 128: forward, cross_entropy (mean), em_backward, Adam step
 *                (registry "Adam", torch.optim.Adam's defaults), zero_grad (to none) —
 *                bench/train_step.c's train_mlp_b128, on DEV
 *   cnn          the training step of bench/train_step.c's train_cnn_b64 (conv 1->32 3x3 pad 1,
 *                ReLU, max_pool 2, conv 32->64 3x3 pad 1, ReLU, max_pool 2, flatten, linear
 *                3136->128, ReLU, linear 128->10; batch 64 of 1x28x28), Adam as above
 *   mlp_sgd, cnn_sgd   the same steps with SGD (lr 0.01, momentum 0.9) instead of Adam, eager
 *   mlp_graph, cnn_graph   the SGD steps captured once into a graph (em_graph_capture_begin,
 *                ember/device.h; CUDA graphs) and replayed: 3 eager steps on a side stream,
 *                one capture, then em_graph_replay per step. SGD, because its scalar
 *                arguments repeat from the second step on, so a replay is the eager step;
 *                plain Adam passes its step count to each step as an argument, which a
 *                replay would repeat (the *_adam_graph rows below use its capturable form). Before timing, the check: from the same initial weights and
 *                data, 3 eager steps + 5 replays against 8 eager steps, the weights compared
 *                bitwise (printed as match=yes|no and the largest difference)
 *   mlp_adam_graph, cnn_adam_graph   the Adam steps (PyTorch's defaults) captured and replayed
 *                the same way, with Adam's option capturable (fused_adam_capturable: the lr
 *                and the step count read from device memory, the count incremented by a
 *                kernel, so a replay is the next step; PyTorch's Adam(capturable=True)); the
 *                check's eager steps are the capturable optimizer's too
 *   conv         em_conv2d (3x3, stride 1, padding 1, no bias) forward and backward
 *                (em_backward_with a fixed grad) at the CNN's two convolutions:
 *                conv1_64x1x28x28 (weight 32x1x3x3; gradient of the weight only, as in the
 *                CNN) and conv2_64x32x14x14 (weight 64x32x3x3; gradients of input and weight):
 *                against bench/gpu_cudnn.c, the same cuDNN calls alone
 *   gemm_bf16    em_matmul of two bf16 (8192, 8192) tensors (1024 with --quick), forward only
 *   linear_MxKxN em_linear of x (M, K) by weight (N, K) plus bias (N), forward and backward
 *                (em_backward_with a fixed grad (M, N); gradients of x, weight and bias):
 *                linear_128x784x512, linear_128x512x256, linear_128x256x10 (the MLP's) and
 *                linear_8192x8192x8192
 *   add          em_add of two contiguous f32 tensors of 256M elements (1 GiB each): bytes
 *                moved 3 GiB (two read, one written)
 * Default: mlp, linear and add (issue 20's rows); name the others. Every number is the median over 7 timed batches (3 with --quick) of
 * N calls each (after warm-up calls), each batch ended by em_device_synchronize; the host
 * clock times the batch. Output, one line per workload, for run.sh's table:
 *   ember WORKLOAD ms=<per call> [GBps=<bytes moved / time>]
 * --quick: a smaller add (16M elements), 8192 replaced by 1024 and a tenth of the calls, for a
 * rehearsal on the CPU. --plugin PATH: load a plugin after em_init (em_plugin_load) before DEV
 * is parsed: the test device with host kernels (tests/plugins/host/testdev_host.so), which
 * captures and replays graphs, rehearses the *graph rows of the MLP without a GPU.
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

/* ---- the training steps (MLP, CNN; Adam or SGD; eager or replayed from a graph) ---- */
typedef struct net {
    bool cnn;
    int np;
    em_tensor *p[8], *x, *y;
    em_optimizer *opt;
} net;

static void net_step(void *arg) {
    net *m = arg;
    em_tensor *const *p = m->p;
    if (em_scope_begin() != EM_OK) die("scope");
    em_tensor *h;
    if (m->cnn) {
        const int64_t pad[2] = {1, 1}, k2[2] = {2, 2};
        em_tensor *a = em_relu(em_conv2d(m->x, p[0], p[1], NULL, pad, NULL, 1));
        if (!a || em_max_pool2d(a, k2, NULL, NULL, NULL, false, &a, NULL) != EM_OK) die("cnn pool1");
        a = em_relu(em_conv2d(a, p[2], p[3], NULL, pad, NULL, 1));
        if (!a || em_max_pool2d(a, k2, NULL, NULL, NULL, false, &a, NULL) != EM_OK) die("cnn pool2");
        h = em_linear(em_relu(em_linear(em_flatten(a, 1, 3), p[4], p[5])), p[6], p[7]);
    } else {
        h = em_linear(em_relu(em_linear(em_relu(em_linear(m->x, p[0], p[1])), p[2], p[3])), p[4], p[5]);
    }
    em_tensor *loss = em_cross_entropy(h, m->y, NULL, EM_REDUCTION_MEAN, -100, 0);
    if (!loss) die("forward");
    if (em_backward(loss) != EM_OK) die("backward");
    if (em_optimizer_step(m->opt) != EM_OK) die("optimizer step");
    em_optimizer_zero_grad(m->opt);
    if (em_scope_end() != EM_OK) die("scope");
}

typedef enum opt_kind { ADAM, SGD, ADAM_CAPTURABLE } opt_kind;

/* The network with its parameters, data and optimizer, from seed 0 (the same numbers each
 * time): Adam with PyTorch's defaults (capturable or not), or SGD lr 0.01 momentum 0.9. */
static net net_new(bool cnn, opt_kind kind) {
    const bool sgd = kind == SGD;
    static const int64_t mlp_sh[6][2] = {{512, 784}, {512, 0}, {256, 512}, {256, 0}, {10, 256}, {10, 0}};
    static const int64_t mlp_fan[6] = {784, 784, 512, 512, 256, 256};
    static const int64_t cnn_sh[8][4] = {{32, 1, 3, 3}, {32}, {64, 32, 3, 3}, {64}, {128, 3136}, {128},
                                         {10, 128}, {10}};
    static const int cnn_nd[8] = {4, 1, 4, 1, 2, 1, 2, 1};
    static const int64_t cnn_fan[8] = {9, 9, 288, 288, 3136, 3136, 128, 128};
    em_seed(0);
    net m = {.cnn = cnn, .np = cnn ? 8 : 6};
    em_dict *params = em_dict_new();
    for (int i = 0; i < m.np; i++) {
        m.p[i] = cnn ? param(cnn_nd[i], cnn_sh[i], cnn_fan[i])
                     : param(mlp_sh[i][1] ? 2 : 1, mlp_sh[i], mlp_fan[i]);
        char name[16]; /* room for any int: -Wformat-truncation at -O1 */
        snprintf(name, sizeof name, "%d", i);
        if (!params || em_dict_set(params, name, m.p[i]) != EM_OK) die("parameters");
    }
    em_options *o = kind != ADAM ? em_options_new() : NULL;
    if (sgd && (!o || em_options_set_float(o, "lr", 0.01) != EM_OK ||
                em_options_set_float(o, "momentum", 0.9) != EM_OK))
        die("SGD options");
    if (kind == ADAM_CAPTURABLE && (!o || em_options_set_bool(o, "capturable", true) != EM_OK))
        die("Adam options");
    m.opt = em_optimizer_new(sgd ? "SGD" : "Adam", params, o);
    em_options_free(o);
    em_dict_free(params);
    if (!m.opt) die("optimizer");
    int64_t batch = cnn ? 64 : 128;
    m.x = cnn ? rand_on(4, (int64_t[]){batch, 1, 28, 28}, 0, 1) : rand_on(2, (int64_t[]){batch, 784}, 0, 1);
    em_tensor *u = rand_on(1, &batch, 0, 10);
    m.y = em_to_dtype(u, EM_I64); /* truncation: labels uniform in 0..9 */
    em_tensor_release(u);
    if (!m.y) die("labels");
    return m;
}

static void net_free(net *m) {
    em_optimizer_free(m->opt);
    for (int i = 0; i < m->np; i++) em_tensor_release(m->p[i]);
    em_tensor_release(m->x);
    em_tensor_release(m->y);
}

static void run_net(const char *name, bool cnn, bool sgd, int reps) {
    net m = net_new(cnn, sgd ? SGD : ADAM);
    double ms = cnn ? time_it(net_step, &m, 5, 20, reps) : time_it(net_step, &m, 20, 100, reps);
    printf("ember %s ms=%.6f\n", name, ms);
    net_free(&m);
}

static void replay_step(void *arg) {
    if (em_graph_replay(arg) != EM_OK) die("graph replay");
}

/* The largest |a - b| over the parameters of two nets, and whether they are bitwise equal. */
static double params_diff(const net *a, const net *b, bool *equal) {
    double worst = 0;
    *equal = true;
    for (int i = 0; i < a->np; i++) {
        size_t n = (size_t)em_tensor_numel(a->p[i]);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        if (!x || !y) die("host buffers");
        if (em_tensor_to_host(a->p[i], x, n * sizeof *x) != EM_OK ||
            em_tensor_to_host(b->p[i], y, n * sizeof *y) != EM_OK)
            die("reading weights");
        if (memcmp(x, y, n * sizeof *x) != 0) *equal = false;
        for (size_t k = 0; k < n; k++) worst = fmax(worst, fabs((double)x[k] - (double)y[k]));
        free(x);
        free(y);
    }
    return worst;
}

static void run_graph(const char *name, bool cnn, opt_kind kind, int reps) {
    if (!em_graph_capture_supported(dev)) {
        char b[48];
        fprintf(stderr, "gpu_step: %s: device %s cannot capture graphs\n", name,
                em_device_str(dev, b, sizeof b));
        exit(1);
    }
    enum { WARM = 3, REPLAYS = 5 };
    em_stream *s;
    if (em_stream_create(dev, &s) != EM_OK) die("stream");
    net eager = net_new(cnn, kind), g = net_new(cnn, kind);
    for (int i = 0; i < WARM + REPLAYS; i++) net_step(&eager);
    if (em_stream_set_current(dev, s) != EM_OK) die("current stream");
    for (int i = 0; i < WARM; i++) net_step(&g);
    if (em_stream_set_current(dev, NULL) != EM_OK) die("current stream");
    if (em_device_synchronize(dev) != EM_OK) die("synchronize");
    em_graph *graph = NULL;
    if (em_graph_capture_begin(dev, s) != EM_OK) die("graph capture begin");
    net_step(&g);
    if (em_graph_capture_end(dev, &graph) != EM_OK) die("graph capture");
    for (int i = 0; i < REPLAYS; i++) replay_step(graph);
    if (em_device_synchronize(dev) != EM_OK) die("synchronize");
    bool equal;
    double diff = params_diff(&eager, &g, &equal);
    double ms = cnn ? time_it(replay_step, graph, 5, 20, reps) : time_it(replay_step, graph, 20, 100, reps);
    printf("ember %s ms=%.6f match=%s maxdiff=%.3g\n", name, ms, equal ? "yes" : "no", diff);
    em_graph_free(graph);
    net_free(&eager);
    net_free(&g);
    em_stream_free(dev, s);
}

/* ---- conv2d forward + backward ---- */
typedef struct cv {
    em_tensor *x, *w, *g;
} cv;

static void conv_step(void *arg) {
    cv *c = arg;
    const int64_t pad[2] = {1, 1};
    if (em_scope_begin() != EM_OK) die("scope");
    em_tensor *y = em_conv2d(c->x, c->w, NULL, NULL, pad, NULL, 1);
    if (!y || em_backward_with(y, c->g, NULL) != EM_OK) die("conv2d forward/backward");
    if (em_tensor_set_grad(c->x, NULL) != EM_OK || em_tensor_set_grad(c->w, NULL) != EM_OK)
        die("clearing grads");
    if (em_scope_end() != EM_OK) die("scope");
}

static void run_conv(const char *name, const int64_t x[4], const int64_t w[4], bool dx, int reps) {
    cv c = {.x = rand_on(4, x, 0, 1), .g = rand_on(4, (int64_t[]){x[0], w[0], x[2], x[3]}, -1, 1)};
    c.w = param(4, w, w[1] * w[2] * w[3]);
    if (dx && em_requires_grad_(c.x, true) != EM_OK) die("requires_grad");
    double ms = time_it(conv_step, &c, 10, 50, reps);
    printf("ember %s ms=%.6f\n", name, ms);
    em_tensor_release(c.x);
    em_tensor_release(c.w);
    em_tensor_release(c.g);
}

/* ---- bf16 GEMM ---- */
typedef struct mm {
    em_tensor *a, *b;
} mm;

static void mm_step(void *arg) {
    mm *g = arg;
    em_tensor *c = em_matmul(g->a, g->b);
    if (!c) die("matmul");
    em_tensor_release(c);
}

static void run_gemm_bf16(int64_t n, int reps) {
    em_tensor *a = rand_on(2, (int64_t[]){n, n}, -1, 1), *b = rand_on(2, (int64_t[]){n, n}, -1, 1);
    mm g = {em_to_dtype(a, EM_BF16), em_to_dtype(b, EM_BF16)};
    em_tensor_release(a);
    em_tensor_release(b);
    if (!g.a || !g.b) die("bf16 inputs");
    double flop = 2.0 * (double)n * (double)n * (double)n;
    double ms = time_it(mm_step, &g, 3, 20, reps);
    printf("ember gemm_bf16_%lld ms=%.6f TFLOPs=%.2f\n", (long long)n, ms, flop / (ms * 1e-3) / 1e12);
    em_tensor_release(g.a);
    em_tensor_release(g.b);
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
    const char *which[16], *plugin = NULL;
    int nw = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) dev_name = argv[++i];
        else if (!strcmp(argv[i], "--plugin") && i + 1 < argc) plugin = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (nw < 16) which[nw++] = argv[i];
    }
    if (!dev_name) {
        fprintf(stderr, "usage: gpu_step --device DEV [--quick] [--plugin PATH] [mlp|cnn|mlp_sgd|cnn_sgd|mlp_graph|"
                "cnn_graph|mlp_adam_graph|cnn_adam_graph|conv|gemm_bf16|linear|add ...]\n");
        return 2;
    }
    if (em_init() != EM_OK) die("em_init");
    if (plugin && em_plugin_load(plugin) != EM_OK) die("--plugin");
    if (em_device_parse(dev_name, &dev) != EM_OK) die("--device");
    em_seed(0);
    int reps = quick ? 3 : 7;
    int64_t big = quick ? 1024 : 8192;
    bool all = nw == 0;
    for (int i = 0; i < (all ? 3 : nw); i++) {
        const char *w = all ? (const char *[]){"mlp", "linear", "add"}[i] : which[i];
        if (!strcmp(w, "mlp")) {
            run_net("mlp", false, false, reps);
        } else if (!strcmp(w, "cnn")) {
            run_net("cnn", true, false, reps);
        } else if (!strcmp(w, "mlp_sgd")) {
            run_net("mlp_sgd", false, true, reps);
        } else if (!strcmp(w, "cnn_sgd")) {
            run_net("cnn_sgd", true, true, reps);
        } else if (!strcmp(w, "mlp_graph")) {
            run_graph("mlp_graph", false, SGD, reps);
        } else if (!strcmp(w, "cnn_graph")) {
            run_graph("cnn_graph", true, SGD, reps);
        } else if (!strcmp(w, "mlp_adam_graph")) {
            run_graph("mlp_adam_graph", false, ADAM_CAPTURABLE, reps);
        } else if (!strcmp(w, "cnn_adam_graph")) {
            run_graph("cnn_adam_graph", true, ADAM_CAPTURABLE, reps);
        } else if (!strcmp(w, "conv")) {
            run_conv("conv1_64x1x28x28", (const int64_t[]){64, 1, 28, 28}, (const int64_t[]){32, 1, 3, 3},
                     false, reps);
            run_conv("conv2_64x32x14x14", (const int64_t[]){64, 32, 14, 14}, (const int64_t[]){64, 32, 3, 3},
                     true, reps);
        } else if (!strcmp(w, "gemm_bf16")) {
            run_gemm_bf16(big, reps);
        } else if (!strcmp(w, "linear")) {
            run_linear(128, 784, 512, reps);
            run_linear(128, 512, 256, reps);
            run_linear(128, 256, 10, reps);
            run_linear(big, big, big, reps);
        } else if (!strcmp(w, "add")) {
            run_add(reps);
        } else {
            fprintf(stderr, "gpu_step: unknown workload '%s' (mlp, cnn, mlp_sgd, cnn_sgd, "
                    "mlp_graph, cnn_graph, mlp_adam_graph, cnn_adam_graph, conv, gemm_bf16, "
                    "linear, add)\n", w);
            em_shutdown();
            return 2;
        }
        fflush(stdout);
    }
    em_shutdown();
    return 0;
}
