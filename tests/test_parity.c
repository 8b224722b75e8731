/*
 * test_parity.c — autograd parity with PyTorch on two real networks (issue 4).
 *
 * tests/fixtures/gen_autograd.py ran PyTorch 1.13 in float32 on a 784-128-10 MLP (batch 16)
 * and the CNN of issue 3 (conv 1->32, ReLU, max_pool 2, conv 32->64, ReLU, max_pool 2,
 * flatten, linear 3136->128, ReLU, linear 128->10; batch 4), both ending in cross_entropy
 * (mean), and wrote the weights, the batch, the loss, every parameter's gradient, and the
 * losses and parameters of 3 plain SGD steps into tests/fixtures/autograd/ (raw little-endian
 * f32 / i64 values, index.txt says where each tensor is). These tests build the same
 * networks from Ember's public ops, load the same values with em_from_data, run forward and
 * em_backward, and require the loss and every gradient to be within
 * allclose(rtol = 1e-4, atol = 1e-6) of PyTorch's, elementwise; a failure names the tensor,
 * the worst element and both values. The CNN runs through oneDNN's convolution (the default)
 * and through the im2col loops (EMBER_CPU_DISABLE_DNNL=1).
 */
#include "fixture_bin.h"

#define RTOL 1e-4
#define ATOL 1e-6

static fixtures *open_fixtures(void) { return fx_open("autograd", "gen_autograd.py"); }

static bool close_all(const char *what, const double *got, const double *want, int64_t n,
                      char *msg, size_t cap) {
    return fx_close_all(what, got, want, n, RTOL, ATOL, msg, cap, NULL);
}

/* Compares Ember's tensor got with fixture `name` (same shape), or with every `stride`-th
 * element of got (flattened) when stride > 1. */
static void expect_close(fixtures *fx, const char *name, const em_tensor *got, int64_t stride) {
    cr_assert(got, "%s: no tensor (%s)", name, em_last_error());
    em_scope_begin();
    em_tensor *want = fx_tensor(fx, name);
    int64_t n = em_tensor_numel(want);
    if (stride <= 1) {
        cr_assert_eq(em_tensor_ndim(got), em_tensor_ndim(want), "%s: ndim", name);
        for (int i = 0; i < em_tensor_ndim(got); i++)
            cr_assert_eq(em_tensor_size(got, i), em_tensor_size(want, i), "%s: dim %d", name, i);
    } else {
        cr_assert_eq((em_tensor_numel(got) + stride - 1) / stride, n, "%s: sample size", name);
    }
    double *g = fx_host_f64(got), *w = fx_host_f64(want);
    if (stride > 1)
        for (int64_t i = 0; i < n; i++) g[i] = g[i * stride];
    char msg[512];
    bool ok = close_all(name, g, w, n, msg, sizeof msg);
    free(g), free(w);
    em_scope_end();
    cr_assert(ok, "%s", msg);
}

/* ---- the networks ------------------------------------------------------------------------- */

typedef struct net {
    const char *name; /* "mlp" or "cnn" */
    bool cnn;
    int np;
    const char *pname[8];
    em_tensor *p[8]; /* leaves that require grad, owned */
    em_tensor *x, *y;
} net;

static net net_load(fixtures *fx, const char *name) {
    net n = {.name = name, .cnn = strcmp(name, "cnn") == 0};
    static const char *mlp[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    static const char *cnn[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
    n.np = n.cnn ? 8 : 4;
    char key[128];
    for (int i = 0; i < n.np; i++) {
        n.pname[i] = n.cnn ? cnn[i] : mlp[i];
        snprintf(key, sizeof key, "%s.%s", name, n.pname[i]);
        n.p[i] = fx_tensor(fx, key);
        cr_assert_eq(em_requires_grad_(n.p[i], true), EM_OK, "%s", em_last_error());
    }
    snprintf(key, sizeof key, "%s.input", name);
    n.x = fx_tensor(fx, key);
    snprintf(key, sizeof key, "%s.labels", name);
    n.y = fx_tensor(fx, key);
    return n;
}

static void net_free(net *n) {
    for (int i = 0; i < n->np; i++) em_tensor_release(n->p[i]);
    em_tensor_release(n->x);
    em_tensor_release(n->y);
}

/* The loss of one forward pass (in the open scope). */
static em_tensor *net_loss(const net *n) {
    em_tensor *const *p = n->p;
    em_tensor *h;
    if (n->cnn) {
        const int64_t pad[2] = {1, 1}, k2[2] = {2, 2};
        em_tensor *a = em_relu(em_conv2d(n->x, p[0], p[1], NULL, pad, NULL, 1));
        cr_assert(a, "conv1: %s", em_last_error());
        cr_assert_eq(em_max_pool2d(a, k2, NULL, NULL, NULL, false, &a, NULL), EM_OK, "pool1: %s",
                     em_last_error());
        a = em_relu(em_conv2d(a, p[2], p[3], NULL, pad, NULL, 1));
        cr_assert(a, "conv2: %s", em_last_error());
        cr_assert_eq(em_max_pool2d(a, k2, NULL, NULL, NULL, false, &a, NULL), EM_OK, "pool2: %s",
                     em_last_error());
        h = em_flatten(a, 1, 3);
        h = em_linear(em_relu(em_linear(h, p[4], p[5])), p[6], p[7]);
    } else {
        h = em_linear(em_relu(em_linear(n->x, p[0], p[1])), p[2], p[3]);
    }
    em_tensor *loss = em_cross_entropy(h, n->y, NULL, EM_REDUCTION_MEAN, -100, 0);
    cr_assert(loss, "%s forward: %s", n->name, em_last_error());
    return loss;
}

/* One forward and backward; compares the loss and every parameter's grad with PyTorch's. */
static void check_grads(const char *name) {
    fixtures *fx = open_fixtures();
    net n = net_load(fx, name);
    em_scope_begin();
    em_tensor *loss = net_loss(&n);
    cr_assert_eq(em_backward(loss), EM_OK, "%s backward: %s", name, em_last_error());
    char key[128];
    snprintf(key, sizeof key, "%s.loss", name);
    expect_close(fx, key, loss, 1);
    for (int i = 0; i < n.np; i++) {
        snprintf(key, sizeof key, "%s.grad.%s", name, n.pname[i]);
        expect_close(fx, key, em_tensor_grad(n.p[i]), 1);
    }
    em_scope_end();
    net_free(&n);
    fx_close(fx);
}

/* Three SGD steps (w = w - lr * grad, same batch); compares each step's loss and the
 * parameters after the last step with PyTorch's. */
static void check_sgd(const char *name) {
    fixtures *fx = open_fixtures();
    net n = net_load(fx, name);
    char key[128];
    snprintf(key, sizeof key, "%s.sgd.lr", name);
    em_tensor *lr = fx_tensor(fx, key);
    float lv[3];
    for (int step = 0; step < 3; step++) {
        em_scope_begin();
        em_tensor *loss = net_loss(&n);
        cr_assert_eq(em_backward(loss), EM_OK, "%s step %d: %s", name, step + 1,
                     em_last_error());
        lv[step] = (float)em_item(loss); /* a float32 loss: exact */
        em_grad_mode_push(EM_GRAD_DISABLED);
        for (int i = 0; i < n.np; i++) {
            cr_assert_eq(em_sub_(n.p[i], em_mul(em_tensor_grad(n.p[i]), lr)), EM_OK,
                         "%s step %d update of %s: %s", name, step + 1, n.pname[i],
                         em_last_error());
            cr_assert_eq(em_tensor_set_grad(n.p[i], NULL), EM_OK);
        }
        em_grad_mode_pop();
        em_scope_end();
    }
    em_tensor *losses = em_from_data(lv, 1, (int64_t[]){3}, EM_F32, em_cpu());
    snprintf(key, sizeof key, "%s.sgd.loss", name);
    expect_close(fx, key, losses, 1);
    for (int i = 0; i < n.np; i++) {
        bool sampled = strcmp(n.pname[i], "fc1.weight") == 0;
        snprintf(key, sizeof key, "%s.sgd3.%s%s", name, n.pname[i], sampled ? ".every31" : "");
        expect_close(fx, key, n.p[i], sampled ? 31 : 1);
    }
    em_tensor_release(lr);
    em_tensor_release(losses);
    net_free(&n);
    fx_close(fx);
}

/* Restarts the library with the CPU backend's oneDNN convolution on or off. */
static void use_onednn(bool on) {
    em_test_assert_clean_shutdown();
    if (on) unsetenv("EMBER_CPU_DISABLE_DNNL");
    else setenv("EMBER_CPU_DISABLE_DNNL", "1", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
#ifndef EM_HAVE_DNNL
    on = false; /* built without oneDNN: never registered */
#endif
    cr_assert_eq(kernel_registered("cpu_conv2d_backward_weight_dnnl_f32"), on,
                 "oneDNN convolution expected %s", on ? "on" : "off");
}

/* ---- tests ---------------------------------------------------------------------------------- */

TestSuite(parity, .init = em_test_setup, .fini = em_test_teardown, .timeout = 300);

Test(parity, mlp_loss_and_grads) { check_grads("mlp"); }

Test(parity, cnn_loss_and_grads_onednn) {
    em_test_needs_onednn();
    use_onednn(true);
    check_grads("cnn");
}

Test(parity, cnn_loss_and_grads_im2col) {
    use_onednn(false);
    check_grads("cnn");
    use_onednn(true);
}

Test(parity, mlp_three_sgd_steps) { check_sgd("mlp"); }

Test(parity, cnn_three_sgd_steps_onednn) {
    em_test_needs_onednn();
    use_onednn(true);
    check_sgd("cnn");
}

Test(parity, cnn_three_sgd_steps_im2col) {
    use_onednn(false);
    check_sgd("cnn");
    use_onednn(true);
}

/* The comparison can fail: a grad off by 2e-4 relative in one element, or a NaN, is reported
 * with its index and both values. */
Test(parity, comparison_rejects_a_perturbed_element) {
    fixtures *fx = open_fixtures();
    em_scope_begin();
    em_tensor *g = fx_tensor(fx, "mlp.grad.fc2.weight");
    int64_t n = em_tensor_numel(g);
    double *want = fx_host_f64(g), *got = fx_host_f64(g);
    char msg[512] = "";
    cr_assert(close_all("same", got, want, n, msg, sizeof msg), "%s", msg);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(want[i]) > fabs(want[k])) k = i; /* the largest, so atol does not hide it */
    got[k] = want[k] * (1 + 2e-4);
    cr_assert_not(close_all("perturbed", got, want, n, msg, sizeof msg));
    char idx[32];
    snprintf(idx, sizeof idx, "element %lld of", (long long)k);
    cr_assert(strstr(msg, idx), "message '%s' lacks '%s'", msg, idx);
    got[k] = want[k] * (1 + 5e-5);
    cr_assert(close_all("within rtol", got, want, n, msg, sizeof msg), "%s", msg);
    got[k] = NAN;
    cr_assert_not(close_all("nan", got, want, n, msg, sizeof msg));
    free(want), free(got);
    em_scope_end();
    fx_close(fx);
}
