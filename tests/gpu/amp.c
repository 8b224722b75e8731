/*
 * amp.c — the GPU harness's mixed-precision check (tests/gpu/run.sh amp), device-agnostic:
 *
 *   amp --device DEV --data DIR [--steps N]
 *
 * For each lower dtype (bf16, then f16) it trains the digits MLP (DIR: data/digits; Flatten,
 * Linear(64, 64), ReLU, Linear(64, 10), cross_entropy, Adam lr 2e-3, batch 32, N steps,
 * default 60; seed 0, deterministic mode) twice in the same process — once on DEV and once
 * on the CPU, with the same initial weights (made on the CPU from the seed) and the same
 * batches (the loader's CPU-side shuffle) — with the forward and the loss in an autocast
 * region of that dtype on the run's device, and, for f16, the gradient scaler (PyTorch's
 * defaults: init scale 2^16). Step 0's input is multiplied by NaN on purpose, so its loss and
 * gradients are NaN: the scaler must skip that step (the weights bitwise unchanged, the scale
 * halved, one skipped step); bf16 runs without a scaler and take step 0 on a clean batch.
 *
 * Checks, each printed as one row:
 *   - every step's loss finite on both devices (step 0 of f16 excepted: NaN by design), and
 *     within rtol R of the CPU's: R = 3e-2 for bf16 (8 significant bits), 1e-2 for f16;
 *   - f16: step 0 skipped on both devices, weights unchanged by it, scale 2^15 after it, and
 *     the same skipped-step count and final scale on both devices;
 *   - the last 10 steps' mean loss below the first 10 steps' (the run trains).
 * Exit 0 when every check holds, 1 when one does not, 2 on a usage or setup error.
 * With --device cpu (the rehearsal) both runs are on the CPU and must agree exactly.
 */
#include <ember/ember.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STEPS 1000

typedef struct run_result {
    double loss[MAX_STEPS];
    int steps;
    bool stepped0;        /* step 0 taken by the optimizer */
    bool weights_kept0;   /* f16: the weights after step 0 are bitwise those before */
    double scale_after0;  /* f16: the scale after step 0's update */
    double scale_end;
    int64_t skipped;
} run_result;

static int fail(const char *what) {
    fprintf(stderr, "amp: %s: %s\n", what, em_last_error());
    return 2;
}

static em_module *layer(const char *cls, int64_t in, int64_t out) {
    em_options *o = em_options_new();
    if (!o) return NULL;
    if (in) em_options_set_int(o, "in_features", in);
    if (out) em_options_set_int(o, "out_features", out);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    return m;
}

static em_module *mlp(void) {
    em_module *m = em_module_new("Sequential", NULL);
    if (!m) return NULL;
    em_module *parts[4] = {layer("Flatten", 0, 0), layer("Linear", 64, 64), layer("ReLU", 0, 0),
                           layer("Linear", 64, 10)};
    bool ok = true;
    for (int i = 0; i < 4; i++) {
        if (ok && parts[i] && em_module_append_child(m, parts[i]) == EM_OK) continue;
        ok = false;
        em_module_free(parts[i]);
    }
    if (!ok) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* The bytes of every parameter, in order, copied to the host (malloc'ed; *n their size). */
static unsigned char *snapshot(em_dict *params, size_t *n) {
    size_t total = 0;
    for (size_t i = 0; i < em_dict_len(params); i++) total += em_tensor_nbytes(em_dict_value(params, i));
    unsigned char *buf = malloc(total ? total : 1), *p = buf;
    if (!buf) return NULL;
    for (size_t i = 0; i < em_dict_len(params); i++) {
        const em_tensor *t = em_dict_value(params, i);
        if (em_tensor_to_host(t, p, em_tensor_nbytes(t)) != EM_OK) {
            free(buf);
            return NULL;
        }
        p += em_tensor_nbytes(t);
    }
    *n = total;
    return buf;
}

static int train(const char *dev_name, const char *dir, em_dtype lower, int steps, run_result *r) {
    em_device dev;
    if (em_device_parse(dev_name, &dev) != EM_OK) return fail("--device");
    memset(r, 0, sizeof *r);
    em_set_deterministic(true);
    em_seed(0);
    char devtype[32]; /* "cuda" of "cuda:0": the autocast region's device type */
    snprintf(devtype, sizeof devtype, "%.*s", (int)strcspn(dev_name, ":"), dev_name);
    bool f16 = lower == EM_F16;
    int rc = 2;
    em_module *model = mlp(), *loss_fn = em_module_new("CrossEntropyLoss", NULL);
    em_options *ds_o = em_options_new();
    em_dataset *ds = NULL;
    if (ds_o && em_options_set_string(ds_o, "path", dir) == EM_OK &&
        em_options_set_string(ds_o, "split", "train") == EM_OK)
        ds = em_dataset_open("mnist", ds_o);
    em_options_free(ds_o);
    em_loader *ld = NULL;
    em_dict *params = NULL;
    em_optimizer *opt = NULL;
    em_grad_scaler *sc = NULL;
    if (!model || !loss_fn || !ds || em_module_to_device(model, dev) != EM_OK) {
        rc = fail("model or data");
        goto done;
    }
    em_loader_options lo = {.struct_size = sizeof lo, .batch_size = 32, .shuffle = true,
                            .seed = 0, .device = dev, .drop_last = true,
                            .transforms = {.to_float = true, .scale = 0}};
    ld = em_loader_new(ds, &lo);
    params = em_module_named_parameters(model, true);
    em_options *oo = em_options_new();
    if (oo) em_options_set_float(oo, "lr", 2e-3);
    if (ld && params && oo) opt = em_optimizer_new("Adam", params, oo);
    em_options_free(oo);
    em_grad_scaler_options so = EM_GRAD_SCALER_OPTIONS_INIT;
    if (f16) sc = em_grad_scaler_new(&so);
    if (!opt || (f16 && !sc)) {
        rc = fail("loader, optimizer or scaler");
        goto done;
    }
    em_module_train(model, true);
    em_status st = EM_OK;
    while (st == EM_OK && r->steps < steps) {
        em_tensor *x, *y; /* borrowed from the loader */
        st = em_loader_next(ld, &x, &y);
        if (st == EM_OK && !x) continue; /* the epoch is over: the next call starts the next */
        if (st != EM_OK) break;
        em_scope_begin();
        int s = r->steps;
        em_tensor *xin = f16 && s == 0 ? em_mul_scalar(x, NAN) : (em_tensor *)x;
        st = em_autocast_begin(devtype, lower);
        em_tensor *out = st == EM_OK ? em_module_forward(model, xin) : NULL;
        em_tensor *loss = out ? em_module_forward_n(loss_fn, (em_tensor *[]){out, y}, 2) : NULL;
        if (st == EM_OK) st = em_autocast_end();
        size_t nb = 0;
        unsigned char *before = s == 0 && f16 ? snapshot(params, &nb) : NULL;
        if (st == EM_OK && loss) em_optimizer_zero_grad(opt);
        if (st == EM_OK) st = loss ? em_backward(f16 ? em_grad_scaler_scale(sc, loss) : loss) : em_last_status();
        bool stepped = true;
        if (st == EM_OK) st = f16 ? em_grad_scaler_step(sc, opt, &stepped) : em_optimizer_step(opt);
        if (st == EM_OK && f16) st = em_grad_scaler_update(sc);
        if (st == EM_OK) {
            r->loss[s] = em_item(loss);
            if (s == 0) {
                r->stepped0 = stepped;
                if (f16) {
                    size_t na = 0;
                    unsigned char *after = snapshot(params, &na);
                    r->weights_kept0 = before && after && na == nb && memcmp(before, after, na) == 0;
                    free(after);
                    r->scale_after0 = em_grad_scaler_get_scale(sc);
                }
            }
            r->steps++;
        } else if (st == EM_OK) {
            st = em_last_status();
        }
        free(before);
        em_scope_end();
    }
    if (st != EM_OK) {
        rc = fail("training");
        goto done;
    }
    r->scale_end = f16 ? em_grad_scaler_get_scale(sc) : 1;
    r->skipped = f16 ? em_grad_scaler_skipped_steps(sc) : 0;
    rc = 0;
done:
    em_grad_scaler_free(sc);
    em_optimizer_free(opt);
    em_dict_free(params);
    em_loader_free(ld);
    em_dataset_free(ds);
    em_module_free(loss_fn);
    em_module_free(model);
    return rc;
}

static double mean(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s / n;
}

static int check(bool ok, const char *what, int *failed) {
    printf("  %-4s %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) *failed = 1;
    return ok;
}

int main(int argc, char **argv) {
    const char *dev = NULL, *dir = NULL;
    int steps = 60;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) dev = argv[++i];
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc) dir = argv[++i];
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: amp --device DEV --data DIR [--steps N]\n");
            return 2;
        }
    }
    if (!dev || !dir || steps < 20 || steps > MAX_STEPS) {
        fprintf(stderr, "usage: amp --device DEV --data DIR [--steps N (20..%d)]\n", MAX_STEPS);
        return 2;
    }
    if (em_init() != EM_OK) return fail("em_init");
    static run_result on_dev, on_cpu;
    int failed = 0, rc = 0;
    const em_dtype lowers[2] = {EM_BF16, EM_F16};
    for (int li = 0; li < 2 && rc == 0; li++) {
        em_dtype lo = lowers[li];
        bool f16 = lo == EM_F16;
        double rtol = f16 ? 1e-2 : 3e-2;
        if ((rc = train(dev, dir, lo, steps, &on_dev)) != 0) break;
        if ((rc = train("cpu", dir, lo, steps, &on_cpu)) != 0) break;
        printf("amp %s: %d steps on %s against the cpu (autocast %s%s), losses within rtol %g\n",
               em_dtype_name(lo), steps, dev, em_dtype_name(lo), f16 ? ", grad scaler" : "", rtol);
        printf("  %5s %14s %14s %10s\n", "step", dev, "cpu", "rel diff");
        int first = f16 ? 1 : 0, worst = first;
        double worst_d = -1;
        bool finite = true, close = true;
        for (int s = first; s < steps; s++) {
            double a = on_dev.loss[s], b = on_cpu.loss[s], d = fabs(a - b) / fmax(fabs(b), 1e-12);
            if (!isfinite(a) || !isfinite(b)) finite = false;
            if (!(d <= rtol)) close = false;
            if (!(d <= worst_d)) worst = s, worst_d = d; /* NaN counts as the worst */
            if (s < first + 5 || s % 10 == 0 || s == steps - 1)
                printf("  %5d %14.7g %14.7g %10.2e\n", s, a, b, d);
        }
        char what[200];
        check(finite, "every loss finite on both devices", &failed);
        snprintf(what, sizeof what, "every loss within rtol %g of the cpu's (worst: step %d, %.2e)",
                 rtol, worst, worst_d);
        check(close, what, &failed);
        snprintf(what, sizeof what, "it trains: last 10 steps' mean loss %.4f < first 10's %.4f (%s)",
                 mean(on_dev.loss + steps - 10, 10), mean(on_dev.loss + first, 10), dev);
        check(mean(on_dev.loss + steps - 10, 10) < mean(on_dev.loss + first, 10), what, &failed);
        if (f16) {
            check(isnan(on_dev.loss[0]) && !on_dev.stepped0 && !on_cpu.stepped0,
                  "step 0 (NaN input): NaN loss, skipped on both devices", &failed);
            check(on_dev.weights_kept0, "step 0: the weights bitwise unchanged by the skipped step", &failed);
            snprintf(what, sizeof what, "step 0: scale backed off to 32768 (%s: %g, cpu: %g)", dev,
                     on_dev.scale_after0, on_cpu.scale_after0);
            check(on_dev.scale_after0 == 32768 && on_cpu.scale_after0 == 32768, what, &failed);
            snprintf(what, sizeof what, "skipped steps %lld / %lld and final scale %g / %g (%s / cpu) equal",
                     (long long)on_dev.skipped, (long long)on_cpu.skipped, on_dev.scale_end,
                     on_cpu.scale_end, dev);
            check(on_dev.skipped == on_cpu.skipped && on_dev.scale_end == on_cpu.scale_end &&
                      on_dev.skipped >= 1, what, &failed);
        } else {
            check(on_dev.stepped0, "bf16 without a scaler: step 0 taken", &failed);
        }
    }
    em_shutdown();
    if (rc) return rc;
    printf("amp: %s\n", failed ? "FAIL" : "PASS");
    return failed;
}
