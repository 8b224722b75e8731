/*
 * capture.c — the GPU harness's check of the capturable optimizer steps (tests/gpu/run.sh
 * capture), device-agnostic:
 *
 *   capture --device DEV [--steps N]
 *
 * For SGD (momentum 0.9, weight decay 1e-2, Nesterov), Adam (weight decay 1e-2) and AdamW
 * (weight decay 1e-2), in float32 and float64: three parameters (64 x 32, 32, 7 x 5; values
 * and every step's gradients from a fixed LCG), N steps (default 20) with the learning rate
 * changed before every step (lr_k = 1e-2 * 0.9^k, as a per-step schedule sets it:
 * em_optimizer_set_lr). The reference is the plain optimizer on the CPU (the fused_sgd /
 * fused_adam / fused_adamw kernels: the lr and Adam's step count from the host). On DEV the
 * optimizer has the option capturable (fused_*_capturable: the lr and the count read from
 * device memory); step 0 runs eagerly, step 1 is captured in a graph (em_graph_capture_begin)
 * on a stream of its own and every later step is a replay of it, the step's gradients copied
 * into the captured gradients' storages and the lr set between replays. A device that cannot
 * capture (the CPU: --device cpu, the rehearsal) runs every step eagerly.
 *
 * Checks, one row per optimizer and dtype: the parameters and the states (momentum_buffer;
 * exp_avg, exp_avg_sq) after N steps against the CPU's, the step count (Adam: N) and the
 * device's lr tensor (the last lr). float32: bitwise (the scalars are formed in double and
 * rounded to float; CUDA's double pow may differ from glibc's by an ulp, which that rounding
 * almost always hides). float64: within 4 ulp (the bias corrections' pow). SGD's scalars use
 * no pow: bitwise in both. Exit 0 when every check holds, 1 when one does not, 2 on a usage
 * or setup error.
 */
#include <ember/ember.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 3
#define MAXN 2048

static const int64_t shapes[NP][2] = {{64, 32}, {32, 0}, {7, 5}};
static const int ndims[NP] = {2, 1, 2};

static int64_t numel(int i) { return ndims[i] == 1 ? shapes[i][0] : shapes[i][0] * shapes[i][1]; }

/* A value in [-1, 1) from the LCG state. */
static double lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 2 - 1;
}

static em_tensor *make(int i, em_dtype dt, uint64_t seed, em_device dev) {
    static double v[MAXN];
    float f[MAXN];
    uint64_t s = seed;
    for (int64_t k = 0; k < numel(i); k++) v[k] = lcg(&s), f[k] = (float)v[k];
    return em_from_data(dt == EM_F64 ? (const void *)v : (const void *)f, ndims[i], shapes[i], dt,
                        dev);
}

static int fail(const char *what) {
    fprintf(stderr, "capture: %s: %s\n", what, em_last_error());
    return 2;
}

typedef struct opt_run {
    em_optimizer *o;
    em_tensor *p[NP], *g[NP]; /* the params and their grads (the grads' storages are kept) */
} opt_run;

static em_optimizer *make_opt(const char *cls, em_tensor *const *p, bool capturable) {
    em_dict *d = em_dict_new();
    em_options *o = em_options_new();
    char name[16];
    for (int i = 0; d && i < NP; i++) {
        snprintf(name, sizeof name, "p%d", i);
        em_dict_set(d, name, p[i]);
    }
    em_options_set_float(o, "lr", 1e-2);
    em_options_set_float(o, "weight_decay", 1e-2);
    if (!strcmp(cls, "SGD")) {
        em_options_set_float(o, "momentum", 0.9);
        em_options_set_bool(o, "nesterov", true);
    }
    if (capturable) em_options_set_bool(o, "capturable", true);
    em_optimizer *opt = em_optimizer_new(cls, d, o);
    em_options_free(o);
    em_dict_free(d);
    return opt;
}

/* The ulps between a and b (0 when equal). */
static double ulps(double a, double b, em_dtype dt) {
    if (a == b) return 0;
    if (!isfinite(a) || !isfinite(b)) return INFINITY;
    double u = dt == EM_F64 ? nextafter(fabs(a), INFINITY) - fabs(a)
                            : (double)(nextafterf((float)fabs(a), INFINITY) - (float)fabs(a));
    return fabs(a - b) / u;
}

/* The most ulps between two tensors of n elements. */
static double max_ulps(const em_tensor *a, const em_tensor *b, int64_t n, em_dtype dt) {
    static double x[MAXN], y[MAXN];
    em_tensor *a64 = em_to_dtype(em_to_device(a, em_cpu()), EM_F64);
    em_tensor *b64 = em_to_dtype(em_to_device(b, em_cpu()), EM_F64);
    if (!a64 || !b64 || em_tensor_to_host(a64, x, sizeof x) != EM_OK ||
        em_tensor_to_host(b64, y, sizeof y) != EM_OK)
        return INFINITY;
    double m = 0;
    for (int64_t k = 0; k < n; k++) {
        double u = ulps(x[k], y[k], dt);
        if (u > m || u != u) m = u;
    }
    return m;
}

/* One optimizer and dtype: 0 when it holds, 1 when not, 2 on an error. */
static int check(const char *cls, em_dtype dt, em_device dev, int steps) {
    em_scope_begin();
    opt_run ref = {0}, run = {0};
    for (int i = 0; i < NP; i++) {
        ref.p[i] = make(i, dt, 17 + (uint64_t)i, em_cpu());
        run.p[i] = em_clone(em_to_device(ref.p[i], dev)); /* its own, on the CPU too */
        if (!ref.p[i] || !run.p[i]) return fail("params");
        em_requires_grad_(ref.p[i], true);
        em_requires_grad_(run.p[i], true);
    }
    ref.o = make_opt(cls, ref.p, false);
    run.o = make_opt(cls, run.p, true);
    if (!ref.o || !run.o) return fail("optimizer");
    bool can = em_graph_capture_supported(dev);
    em_stream *s = NULL, *prev = em_stream_current(dev);
    em_graph *graph = NULL;
    if (can && (em_stream_create(dev, &s) != EM_OK || em_stream_set_current(dev, s) != EM_OK))
        return fail("stream");
    int rc = 0;
    for (int k = 0; k < steps && rc == 0; k++) {
        double lr = 1e-2 * pow(0.9, k);
        if (em_optimizer_set_lr(ref.o, 0, lr) != EM_OK || em_optimizer_set_lr(run.o, 0, lr) != EM_OK)
            return fail("set_lr");
        for (int i = 0; i < NP; i++) {
            em_tensor *g = make(i, dt, 1000 + (uint64_t)(k * NP + i), em_cpu());
            if (!g || em_tensor_set_grad(ref.p[i], g) != EM_OK) return fail("grad");
            if (!run.g[i]) {
                run.g[i] = em_clone(em_to_device(g, dev));
                if (!run.g[i] || em_tensor_set_grad(run.p[i], run.g[i]) != EM_OK)
                    return fail("grad");
            } else if (em_copy_(run.g[i], g) != EM_OK) { /* into the captured storage */
                return fail("grad copy");
            }
        }
        if (em_optimizer_step(ref.o) != EM_OK) return fail("the CPU's step");
        if (!can || k == 0) {
            if (em_optimizer_step(run.o) != EM_OK) return fail("the eager step");
            continue;
        }
        if (!graph) {
            if (em_graph_capture_begin(dev, s) != EM_OK) return fail("capture begin");
            em_status st = em_optimizer_step(run.o);
            em_status se = em_graph_capture_end(dev, &graph);
            if (st != EM_OK || se != EM_OK) return fail("the captured step");
            em_stream_set_current(dev, s); /* the lr fills and copies in the replays' order */
        }
        if (em_graph_replay(graph) != EM_OK) return fail("replay");
    }
    if (s) em_stream_synchronize(dev, s);
    /* the parameters and the states */
    static const char *const sgd_states[] = {"momentum_buffer", NULL};
    static const char *const adam_states[] = {"exp_avg", "exp_avg_sq", NULL};
    const char *const *names = strcmp(cls, "SGD") ? adam_states : sgd_states;
    double tol = dt == EM_F64 && strcmp(cls, "SGD") ? 4 : 0, worst = 0;
    char what[160] = "";
    for (int i = 0; i < NP; i++) {
        double u = max_ulps(ref.p[i], run.p[i], numel(i), dt);
        if (u > worst) worst = u, snprintf(what, sizeof what, "param %d", i);
        for (int n = 0; names[n]; n++) {
            em_tensor *a = em_optimizer_state(ref.o, i, names[n]);
            em_tensor *b = em_optimizer_state(run.o, i, names[n]);
            u = a && b ? max_ulps(a, b, numel(i), dt) : INFINITY;
            if (u > worst || u != u) worst = u, snprintf(what, sizeof what, "%s %d", names[n], i);
        }
    }
    double stp = NAN, want = steps, lrv = NAN;
    if (strcmp(cls, "SGD")) {
        em_tensor *t = em_optimizer_state(run.o, 0, "step");
        if (!t || em_tensor_item(t, &stp) != EM_OK) stp = NAN;
    }
    em_tensor *lt = em_optimizer_lr_tensor(run.o, 0, dev);
    if (!lt || em_tensor_item(lt, &lrv) != EM_OK) lrv = NAN;
    bool ok = worst <= tol && lrv == em_optimizer_lr(ref.o, 0) &&
              (!strcmp(cls, "SGD") || stp == want);
    printf("capture %-5s %-7s %d steps (%s): params and states %s (most %.0f ulp%s%s; "
           "allowed %.0f), step count %s, lr tensor %s: %s\n", cls, em_dtype_name(dt), steps,
           can ? "1 eager, then replays of 1 capture" : "eager: the device cannot capture",
           worst == 0 ? "bitwise" : "differ", worst, what[0] ? ", at " : "", what, tol,
           strcmp(cls, "SGD") ? (stp == want ? "right" : "WRONG") : "n/a",
           lrv == em_optimizer_lr(ref.o, 0) ? "right" : "WRONG", ok ? "PASS" : "FAIL");
    if (!ok) rc = 1;
    em_graph_free(graph);
    if (s) {
        em_stream_set_current(dev, prev);
        em_stream_free(dev, s);
    }
    em_optimizer_free(ref.o);
    em_optimizer_free(run.o);
    em_scope_end();
    return rc;
}

int main(int argc, char **argv) {
    const char *dev_name = NULL;
    int steps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) dev_name = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: capture --device DEV [--steps N]\n");
            return 2;
        }
    }
    if (!dev_name || steps < 2 || steps > 10000) {
        fprintf(stderr, "usage: capture --device DEV [--steps N (2..10000)]\n");
        return 2;
    }
    if (em_init() != EM_OK) return fail("em_init");
    em_device dev;
    if (em_device_parse(dev_name, &dev) != EM_OK) return fail("--device");
    int rc = 0;
    static const char *const classes[] = {"SGD", "Adam", "AdamW"};
    for (int c = 0; c < 3; c++)
        for (int d = 0; d < 2; d++) {
            int r = check(classes[c], d ? EM_F64 : EM_F32, dev, steps);
            if (r > rc) rc = r;
        }
    em_shutdown();
    return rc;
}
