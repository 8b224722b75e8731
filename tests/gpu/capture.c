/*
 * capture.c — the GPU harness's check of the capturable optimizer steps (tests/gpu/run.sh
 * capture), device-agnostic:
 *
 *   capture --device DEV [--steps N] [--plugin PATH]
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
 * capture (the CPU: --device cpu, the rehearsal) runs every step eagerly. --plugin PATH loads
 * a plugin before DEV is parsed (em_plugin_load): the test device with host kernels
 * (tests/plugins/host/testdev_host.so) captures and replays as CUDA does, without a GPU.
 *
 * Adam+ams (float32, float64): Adam with amsgrad, capturable on DEV (op by op with the step
 * count, the bias corrections and the lr on the device) against the plain fused AMSGrad
 * kernel on the CPU, the max_exp_avg_sq states compared too, within the Adam rows' bounds.
 *
 * Adam+clip (float32, float64): the same Adam steps with the gradients' 2-norm clipped to
 * CLIP_MAX before each (the grads' norm is about 26 at first: every step clips): the
 * reference em_clip_grad_norm_ on the CPU (the norm read on the host); on DEV
 * em_clip_grad_norm_device_ (no host read: the norm and the coefficient stay device tensors)
 * in the eager step and in the captured one, whose norm tensor each replay refills. Checked
 * besides: each step's norm (read after the step) against the CPU's, within 4 float32 ulp
 * (the device's own reduction order); the parameters and states within 64 ulp on a device
 * other than the CPU (the norms' last bits move the coefficient; a first bound, not yet run on
 * a GPU), bitwise on the CPU (the same arithmetic).
 *
 * Dropout (float32): the random draws of a training step (ember/random.h, "Graph capture"):
 * dropout (p 0.3) of a (64, 32) input, bernoulli_ (p 0.6) and uniform_ (-1, 2) fills, captured
 * on DEV after one eager step and replayed N - 1 times; before each replay the same ops run
 * eagerly on the CPU from the generator's state then, and after it the generator stands where
 * the CPU's ops left it. Checked: every replay's mask, output and fills equal the CPU's
 * bitwise (the uniform and bernoulli streams are integer and power-of-two arithmetic on both;
 * the output's scaling is IEEE division and a product), and each replay's mask differs from
 * the previous one's.
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
#define CLIP_MAX 5.0

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

static em_optimizer *make_opt(const char *cls, em_tensor *const *p, bool capturable,
                              bool amsgrad) {
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
    if (amsgrad) em_options_set_bool(o, "amsgrad", true);
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

static em_dict *params_dict(em_tensor *const *p) {
    em_dict *d = em_dict_new();
    char name[16];
    for (int i = 0; d && i < NP; i++) {
        snprintf(name, sizeof name, "p%d", i);
        em_dict_set(d, name, p[i]);
    }
    return d;
}

/* One optimizer and dtype (clip: the grads clipped before each step; ams: Adam's amsgrad): 0
 * when it holds, 1 when not, 2 on an error. */
static int check(const char *cls, em_dtype dt, em_device dev, int steps, bool clip, bool ams) {
    em_scope_begin();
    opt_run ref = {0}, run = {0};
    for (int i = 0; i < NP; i++) {
        ref.p[i] = make(i, dt, 17 + (uint64_t)i, em_cpu());
        run.p[i] = em_clone(em_to_device(ref.p[i], dev)); /* its own, on the CPU too */
        if (!ref.p[i] || !run.p[i]) return fail("params");
        em_requires_grad_(ref.p[i], true);
        em_requires_grad_(run.p[i], true);
    }
    ref.o = make_opt(cls, ref.p, false, ams);
    run.o = make_opt(cls, run.p, true, ams);
    if (!ref.o || !run.o) return fail("optimizer");
    em_dict *ref_d = clip ? params_dict(ref.p) : NULL, *run_d = clip ? params_dict(run.p) : NULL;
    if (clip && (!ref_d || !run_d)) return fail("params dict");
    em_tensor *norm_t = NULL; /* the captured step's norm (clip) */
    double norm_ulps = 0;     /* the most float32 ulps between a step's norms */
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
        double ref_norm = NAN, got_norm = NAN;
        if (clip && em_clip_grad_norm_(ref_d, CLIP_MAX, 2.0, false, &ref_norm) != EM_OK)
            return fail("the CPU's clipping");
        if (em_optimizer_step(ref.o) != EM_OK) return fail("the CPU's step");
        if (!can || k == 0) {
            em_tensor *t = NULL;
            if (clip && em_clip_grad_norm_device_(run_d, CLIP_MAX, 2.0, &t) != EM_OK)
                return fail("the eager clipping");
            if (em_optimizer_step(run.o) != EM_OK) return fail("the eager step");
            if (clip && (!t || em_tensor_item(t, &got_norm) != EM_OK)) return fail("the norm");
            em_tensor_release(t);
        } else {
            if (!graph) {
                if (em_graph_capture_begin(dev, s) != EM_OK) return fail("capture begin");
                em_status st = clip ? em_clip_grad_norm_device_(run_d, CLIP_MAX, 2.0, &norm_t)
                                    : EM_OK;
                if (st == EM_OK) st = em_optimizer_step(run.o);
                em_status se = em_graph_capture_end(dev, &graph);
                if (st != EM_OK || se != EM_OK) return fail("the captured step");
                em_stream_set_current(dev, s); /* the lr fills and copies in the replays' order */
            }
            if (em_graph_replay(graph) != EM_OK) return fail("replay");
            if (clip && (!norm_t || em_tensor_item(norm_t, &got_norm) != EM_OK))
                return fail("the replay's norm");
        }
        if (clip) {
            double u = ulps(ref_norm, got_norm, EM_F32);
            if (u > norm_ulps || u != u) norm_ulps = u;
        }
    }
    if (s) em_stream_synchronize(dev, s);
    /* the parameters and the states */
    static const char *const sgd_states[] = {"momentum_buffer", NULL};
    static const char *const adam_states[] = {"exp_avg", "exp_avg_sq", NULL};
    static const char *const ams_states[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", NULL};
    const char *const *names = ams ? ams_states : strcmp(cls, "SGD") ? adam_states : sgd_states;
    double tol = dt == EM_F64 && strcmp(cls, "SGD") ? 4 : 0, worst = 0;
    if (clip && !em_device_equal(dev, em_cpu())) tol = 64;
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
    double norm_tol = em_device_equal(dev, em_cpu()) ? 0 : 4;
    bool ok = worst <= tol && lrv == em_optimizer_lr(ref.o, 0) &&
              (!strcmp(cls, "SGD") || stp == want) && (!clip || norm_ulps <= norm_tol);
    char norms[96] = "";
    if (clip)
        snprintf(norms, sizeof norms, ", clip norms %s (most %.0f ulp; allowed %.0f)",
                 norm_ulps == 0 ? "bitwise" : "differ", norm_ulps, norm_tol);
    char label[16];
    snprintf(label, sizeof label, "%s%s", cls, clip ? "+clip" : ams ? "+ams" : "");
    printf("capture %-9s %-7s %d steps (%s): params and states %s (most %.0f ulp%s%s; "
           "allowed %.0f)%s, step count %s, lr tensor %s: %s\n", label, em_dtype_name(dt), steps,
           can ? "1 eager, then replays of 1 capture" : "eager: the device cannot capture",
           worst == 0 ? "bitwise" : "differ", worst, what[0] ? ", at " : "", what, tol, norms,
           strcmp(cls, "SGD") ? (stp == want ? "right" : "WRONG") : "n/a",
           lrv == em_optimizer_lr(ref.o, 0) ? "right" : "WRONG", ok ? "PASS" : "FAIL");
    if (!ok) rc = 1;
    em_graph_free(graph);
    em_tensor_release(norm_t);
    em_dict_free(ref_d);
    em_dict_free(run_d);
    if (s) {
        em_stream_set_current(dev, prev);
        em_stream_free(dev, s);
    }
    em_optimizer_free(ref.o);
    em_optimizer_free(run.o);
    em_scope_end();
    return rc;
}

/* The dropout row: see the header. 0 when it holds, 1 when not, 2 on a setup error. */
static int check_dropout(em_device dev, int steps) {
    const int64_t sh[2] = {64, 32};
    const int64_t n = sh[0] * sh[1];
    int rc = 0, bad = 0, same_mask = 0, gen_off = 0;
    em_scope_begin();
    em_tensor *xc = em_keep(make(0, EM_F32, 7, em_cpu()));
    em_tensor *x = em_keep(em_to_device(xc, dev));
    em_tensor *b = em_keep(em_zeros(2, sh, EM_F32, dev)), *u = em_keep(em_zeros(2, sh, EM_F32, dev));
    em_tensor *bc = em_keep(em_zeros(2, sh, EM_F32, em_cpu()));
    em_tensor *uc = em_keep(em_zeros(2, sh, EM_F32, em_cpu()));
    if (!xc || !x || !b || !u || !bc || !uc) rc = fail("dropout inputs");
    bool cap = em_graph_capture_supported(dev);
    em_stream *s = NULL, *prev = em_stream_current(dev);
    if (!rc && cap && (em_stream_create(dev, &s) != EM_OK || em_stream_set_current(dev, s) != EM_OK))
        rc = fail("stream");
    em_graph *g = NULL;
    em_tensor *y = NULL, *mask = NULL;
    float *prev_mask = calloc((size_t)n, sizeof(float)), *got = malloc((size_t)n * sizeof(float)),
          *want = malloc((size_t)n * sizeof(float));
    for (int k = 0; k < steps && !rc; k++) {
        em_rng_state at = em_generator_get_state(NULL);
        /* the CPU's ops from this state: the reference */
        em_tensor *mc = NULL;
        em_tensor *yc = em_dropout(xc, 0.3, true, NULL, &mc);
        if (!yc || em_bernoulli_(bc, 0.6, NULL) != EM_OK || em_uniform_(uc, -1, 2, NULL) != EM_OK) {
            rc = fail("the CPU's draws");
            break;
        }
        em_rng_state cpu_after = em_generator_get_state(NULL);
        em_generator_set_state(NULL, at);
        if (k == 0 || !cap) { /* eager on DEV (every step where DEV cannot capture) */
            em_tensor_release(y), em_tensor_release(mask);
            y = em_tensor_retain(em_dropout(x, 0.3, true, NULL, &mask));
            em_tensor_retain(mask);
            if (!y || em_bernoulli_(b, 0.6, NULL) != EM_OK || em_uniform_(u, -1, 2, NULL) != EM_OK) {
                rc = fail("the eager draws on DEV");
                break;
            }
        } else {
            if (!g) {
                em_tensor_release(y), em_tensor_release(mask);
                y = mask = NULL;
                if (em_graph_capture_begin(dev, s) != EM_OK) { rc = fail("capture begin"); break; }
                y = em_tensor_retain(em_dropout(x, 0.3, true, NULL, &mask));
                em_tensor_retain(mask);
                em_status st = y ? em_bernoulli_(b, 0.6, NULL) : em_last_status();
                if (st == EM_OK) st = em_uniform_(u, -1, 2, NULL);
                if (em_graph_capture_end(dev, &g) != EM_OK || st != EM_OK) {
                    rc = fail("the captured draws");
                    break;
                }
            }
            if (em_graph_replay(g) != EM_OK) { rc = fail("replay"); break; }
        }
        if (em_device_synchronize(dev) != EM_OK) { rc = fail("synchronize"); break; }
        em_rng_state after = em_generator_get_state(NULL);
        gen_off += after.offset != cpu_after.offset || after.seed != cpu_after.seed;
        em_generator_set_state(NULL, cpu_after);
        const em_tensor *pairs[4][2] = {{mask, mc}, {y, yc}, {b, bc}, {u, uc}};
        for (int p = 0; p < 4; p++) {
            em_scope_begin();
            em_tensor *gd = em_to_dtype(em_to_device(pairs[p][0], em_cpu()), EM_F32);
            em_tensor *wd = em_to_dtype(pairs[p][1], EM_F32);
            if (!gd || !wd || em_tensor_to_host(gd, got, (size_t)n * sizeof(float)) != EM_OK ||
                em_tensor_to_host(wd, want, (size_t)n * sizeof(float)) != EM_OK) {
                em_scope_end();
                rc = fail("reading the draws");
                break;
            }
            bad += memcmp(got, want, (size_t)n * sizeof(float)) != 0;
            if (p == 0) {
                if (k > 0 && !memcmp(got, prev_mask, (size_t)n * sizeof(float))) same_mask++;
                memcpy(prev_mask, got, (size_t)n * sizeof(float));
            }
            em_scope_end();
        }
    }
    bool ok = !rc && !bad && !same_mask && !gen_off;
    if (!rc)
        printf("capture %-9s %-7s %d steps (%s): masks, outputs and fills %s, %d replay(s) "
               "repeating the previous mask, generator %s: %s\n", "Dropout", "float32", steps,
               cap ? "1 eager, then replays of 1 capture" : "eager", bad ? "DIFFER" : "bitwise",
               same_mask, gen_off ? "ELSEWHERE" : "where the CPU's ops leave it",
               ok ? "PASS" : "FAIL");
    free(prev_mask), free(got), free(want);
    em_graph_free(g);
    if (s) {
        em_stream_set_current(dev, prev);
        em_stream_free(dev, s);
    }
    em_tensor_release(y), em_tensor_release(mask);
    em_tensor_release(xc), em_tensor_release(x), em_tensor_release(b), em_tensor_release(u);
    em_tensor_release(bc), em_tensor_release(uc);
    em_scope_end();
    return rc ? rc : ok ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *dev_name = NULL, *plugin = NULL;
    int steps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) dev_name = argv[++i];
        else if (!strcmp(argv[i], "--plugin") && i + 1 < argc) plugin = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: capture --device DEV [--steps N] [--plugin PATH]\n");
            return 2;
        }
    }
    if (!dev_name || steps < 2 || steps > 10000) {
        fprintf(stderr, "usage: capture --device DEV [--steps N (2..10000)]\n");
        return 2;
    }
    if (em_init() != EM_OK) return fail("em_init");
    if (plugin && em_plugin_load(plugin) != EM_OK) return fail("--plugin");
    em_device dev;
    if (em_device_parse(dev_name, &dev) != EM_OK) return fail("--device");
    int rc = 0;
    static const char *const classes[] = {"SGD", "Adam", "AdamW"};
    for (int c = 0; c < 5; c++) /* 3: Adam+clip, 4: Adam+ams */
        for (int d = 0; d < 2; d++) {
            int r = check(classes[c < 3 ? c : 1], d ? EM_F64 : EM_F32, dev, steps, c == 3, c == 4);
            if (r > rc) rc = r;
        }
    int r = check_dropout(dev, steps);
    if (r > rc) rc = r;
    em_shutdown();
    return rc;
}
