/*
 * memory.c — the GPU harness's memory suite (tests/gpu/run.sh memory), device-agnostic:
 *
 *   memory --device DEV [--oom]
 *
 * 1. One training step of the MLP 784-512-256-10 at batch 128 (forward, cross_entropy,
 *    backward, Adam) on DEV, then em_memory_summary(stdout), and checks of the statistics
 *    against sizes counted here: the parameters (535,818 floats = 2,143,272 bytes) held as
 *    parameter memory, as much again as gradients, twice that as Adam's state, at least the
 *    batch's input in the data or activation categories. A category the core rounds up
 *    (block sizes) may hold more, never less.
 * 2. With --oom (never on the CPU: the host would page): a request for 1 TiB, then 8 GiB
 *    blocks until the device refuses one; each refusal must be EM_ERR_NOMEM whose message says
 *    "out of memory", names the device and suggests em_empty_cache(); after freeing them and
 *    em_empty_cache(), a 64 MiB tensor is allocated, filled and summed (the device still
 *    works).
 * Prints each message; exit 0 when every check holds, 1 otherwise.
 */
#include <ember/ember.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

static void check(bool ok, const char *what) {
    printf("  [%s] %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) failures++;
}

static em_tensor *param(int ndim, const int64_t *shape, int64_t fan_in, em_device dev) {
    em_tensor *c = em_empty(ndim, shape, EM_F32, em_cpu());
    double b = 1.0 / sqrt((double)fan_in);
    em_tensor *t = NULL;
    if (c && em_uniform_(c, -b, b, NULL) == EM_OK) t = em_to_device(c, dev);
    em_tensor_release(c);
    if (t && (em_tensor_set_category(t, EM_MEM_PARAMETER) != EM_OK || em_requires_grad_(t, true) != EM_OK)) {
        em_tensor_release(t);
        t = NULL;
    }
    return t;
}

static int mlp_step(em_device dev) {
    static const int64_t shapes[6][2] = {{512, 784}, {512, 0}, {256, 512}, {256, 0}, {10, 256}, {10, 0}};
    static const int64_t fan[6] = {784, 784, 512, 512, 256, 256};
    em_tensor *p[6] = {0};
    int64_t n_param = 0;
    bool ok = true;
    for (int i = 0; i < 6; i++) {
        p[i] = param(shapes[i][1] ? 2 : 1, shapes[i], fan[i], dev);
        ok = ok && p[i];
        n_param += shapes[i][0] * (shapes[i][1] ? shapes[i][1] : 1);
    }
    em_dict *params = em_dict_new();
    static const char *names[6] = {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"};
    for (int i = 0; ok && i < 6; i++) ok = em_dict_set(params, names[i], p[i]) == EM_OK;
    em_optimizer *opt = ok ? em_optimizer_new("Adam", params, NULL) : NULL;
    em_tensor *xc = em_empty(2, (int64_t[]){128, 784}, EM_F32, em_cpu());
    em_tensor *uc = em_empty(1, (int64_t[]){128}, EM_F32, em_cpu());
    em_tensor *yc = NULL, *x = NULL, *y = NULL;
    if (opt && xc && uc && em_uniform_(xc, 0, 1, NULL) == EM_OK && em_uniform_(uc, 0, 10, NULL) == EM_OK) {
        yc = em_to_dtype(uc, EM_I64); /* truncation: labels uniform in 0..9 */
        x = em_to_device(xc, dev);
        y = yc ? em_to_device(yc, dev) : NULL;
    }
    em_status st = x && y ? EM_OK : EM_ERR_INVALID;
    if (st == EM_OK) {
        em_memory_reset_peak();
        em_scope_begin();
        em_tensor *h = em_relu(em_linear(x, p[0], p[1]));
        h = em_relu(em_linear(h, p[2], p[3]));
        em_tensor *loss = em_cross_entropy(em_linear(h, p[4], p[5]), y, NULL, EM_REDUCTION_MEAN, -100, 0.0);
        st = loss ? em_backward(loss) : EM_ERR_INVALID;
        if (st == EM_OK) st = em_optimizer_step(opt);
        if (st == EM_OK) st = em_device_synchronize(dev);
        em_scope_end();
    }
    int rc = 0;
    if (st != EM_OK) {
        printf("  [FAIL] the MLP step on the device: %s\n", em_last_error());
        failures++;
        rc = 1;
    } else {
        char dn[32];
        printf("memory after one MLP 784-512-256-10 batch-128 Adam step on %s:\n",
               em_device_str(dev, dn, sizeof dn));
        em_memory_summary(stdout);
        em_memory_stats s;
        if (em_memory_stats_get(dev, &s) != EM_OK) {
            check(false, em_last_error());
        } else {
            size_t pb = (size_t)n_param * sizeof(float);
            char what[160];
            snprintf(what, sizeof what, "parameters hold >= %zu bytes (%zu)", pb, s.current[EM_MEM_PARAMETER]);
            check(s.current[EM_MEM_PARAMETER] >= pb, what);
            snprintf(what, sizeof what, "gradients hold >= %zu bytes (%zu)", pb, s.current[EM_MEM_GRADIENT]);
            check(s.current[EM_MEM_GRADIENT] >= pb, what);
            snprintf(what, sizeof what, "Adam state holds >= %zu bytes (%zu)", 2 * pb, s.current[EM_MEM_OPTIMIZER]);
            check(s.current[EM_MEM_OPTIMIZER] >= 2 * pb, what);
            size_t xb = 128 * 784 * sizeof(float);
            snprintf(what, sizeof what, "the step's peak activations >= the input batch, %zu bytes (%zu)", xb,
                     s.peak[EM_MEM_ACTIVATION] + s.peak[EM_MEM_DATA]);
            check(s.peak[EM_MEM_ACTIVATION] + s.peak[EM_MEM_DATA] >= xb, what);
            snprintf(what, sizeof what, "reserved >= in use (%zu)", s.reserved);
            size_t used = 0;
            for (int c = 0; c < EM_MEM_CACHED; c++) used += s.current[c];
            check(s.reserved >= used, what);
        }
    }
    em_tensor_release(x);
    em_tensor_release(y);
    em_tensor_release(xc);
    em_tensor_release(yc);
    em_tensor_release(uc);
    em_optimizer_free(opt);
    em_dict_free(params);
    for (int i = 0; i < 6; i++) em_tensor_release(p[i]);
    return rc;
}

/* A refused allocation: NULL, EM_ERR_NOMEM, and a message that helps. */
static void check_oom_message(const char *what, em_device dev) {
    const char *msg = em_last_error();
    char dn[32], d[200];
    em_device_str(dev, dn, sizeof dn);
    printf("  %s -> %s\n", what, msg);
    snprintf(d, sizeof d, "%s: EM_ERR_NOMEM", what);
    check(em_last_status() == EM_ERR_NOMEM, d);
    snprintf(d, sizeof d, "%s: the message says 'out of memory', names %s and suggests em_empty_cache()", what, dn);
    check(strstr(msg, "out of memory") && strstr(msg, dn) && strstr(msg, "em_empty_cache"), d);
}

static void oom(em_device dev) {
    printf("out-of-memory messages:\n");
    int64_t tib = (int64_t)1 << 38; /* f32 elements: 1 TiB */
    em_tensor *t = em_empty(1, &tib, EM_F32, dev);
    if (t) {
        check(false, "a 1 TiB tensor was allocated");
        em_tensor_release(t);
    } else {
        check_oom_message("1 TiB at once", dev);
    }
    enum { MAXB = 64 };
    em_tensor *blocks[MAXB] = {0};
    int nb = 0;
    int64_t n8 = (int64_t)1 << 31; /* f32 elements: 8 GiB */
    for (; nb < MAXB; nb++) {
        blocks[nb] = em_empty(1, &n8, EM_F32, dev);
        if (!blocks[nb]) break;
    }
    if (nb == MAXB) {
        check(false, "64 blocks of 8 GiB (512 GiB) were all allocated");
    } else {
        char what[64];
        snprintf(what, sizeof what, "block %d of 8 GiB (after %d GiB)", nb + 1, 8 * nb);
        check_oom_message(what, dev);
    }
    for (int i = 0; i < nb; i++) em_tensor_release(blocks[i]);
    em_empty_cache();
    int64_t g1 = (int64_t)1 << 24; /* 64 MiB */
    em_tensor *after = em_empty(1, &g1, EM_F32, dev);
    bool ok = after && em_fill_(after, 1.0) == EM_OK;
    em_tensor *s = ok ? em_sum(after, 0, NULL, false) : NULL;
    char what[128];
    snprintf(what, sizeof what, "after freeing and em_empty_cache(), 64 MiB of ones allocate and sum to %.0f", s ? em_item(s) : NAN);
    check(s && em_item(s) == (double)g1, what);
    if (!s) printf("    %s\n", em_last_error());
    em_tensor_release(s);
    em_tensor_release(after);
}

int main(int argc, char **argv) {
    const char *dev_name = NULL;
    bool want_oom = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) dev_name = argv[++i];
        else if (!strcmp(argv[i], "--oom")) want_oom = true;
        else dev_name = NULL, i = argc;
    }
    if (!dev_name) {
        fprintf(stderr, "usage: memory --device DEV [--oom]\n");
        return 2;
    }
    if (em_init() != EM_OK) {
        fprintf(stderr, "memory: em_init: %s\n", em_last_error());
        return 1;
    }
    em_device dev;
    if (em_device_parse(dev_name, &dev) != EM_OK) {
        fprintf(stderr, "memory: --device %s: %s\n", dev_name, em_last_error());
        em_shutdown();
        return 1;
    }
    em_seed(0);
    mlp_step(dev);
    if (want_oom) {
        if (em_device_equal(dev, em_cpu())) {
            fprintf(stderr, "memory: --oom is for a device with its own memory, not the CPU\n");
            failures++;
        } else {
            oom(dev);
        }
    }
    if (em_shutdown_checked() != EM_OK) {
        printf("  [FAIL] shutdown: %s\n", em_last_error());
        failures++;
    }
    printf("memory: %d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
