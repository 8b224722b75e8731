/*
 * test_layers.c — the classes of ember-layers.so, created by name: forward values against
 * the ops they wrap or plain loops, PyTorch's state-dict keys, default initialisation bounds,
 * train/eval behaviour (Dropout, BatchNorm running statistics), option errors, containers,
 * losses, gradients through a model, the summary of an MLP, and a layer from a test plugin
 * (tests/plugins/layer_plugin.c, loaded through EMBER_PLUGIN_PATH) used by name.
 */
#define _GNU_SOURCE /* open_memstream, setenv */
#include <stdio.h>

#include "common.h"

TestSuite(layers, .init = em_test_setup, .fini = em_test_teardown);

/* ---- helpers -------------------------------------------------------------------------------- */

/* A module from "key=value" text pairs (NULL-terminated), as a config file would give them. */
static em_module *make(const char *cls, ...) {
    va_list ap;
    va_start(ap, cls);
    em_options *o = em_options_new();
    for (const char *k; (k = va_arg(ap, const char *));)
        em_options_set_text(o, k, va_arg(ap, const char *), NULL);
    va_end(ap);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    return m;
}
#define MAKE(...) make(__VA_ARGS__, NULL)

static em_module *must(em_module *m) {
    cr_assert(m, "%s", em_last_error());
    return m;
}

static em_tensor *randn(int ndim, const int64_t *shape) {
    em_tensor *t = em_empty(ndim, shape, EM_F32, em_cpu());
    cr_assert_eq(em_normal_(t, 0, 1, NULL), EM_OK);
    return t;
}

static void assert_close(const em_tensor *a, const em_tensor *b, double tol) {
    cr_assert(a && b, "%s", em_last_error());
    cr_assert_eq(em_tensor_ndim(a), em_tensor_ndim(b));
    for (int d = 0; d < em_tensor_ndim(a); d++)
        cr_assert_eq(em_tensor_size(a, d), em_tensor_size(b, d), "dim %d", d);
    for (int64_t i = 0; i < em_tensor_numel(a); i++)
        cr_assert_float_eq(em_test_at(a, i), em_test_at(b, i), tol, "element %lld",
                           (long long)i);
}

/* y = forward of a one-layer module built from text options */
static em_tensor *run(em_module *m, const em_tensor *x) {
    em_tensor *y = em_module_forward(m, x);
    cr_assert(y, "%s", em_last_error());
    return y;
}

/* ---- Linear, Sequential, state-dict keys, init ---------------------------------------------- */

Test(layers, sequential_mlp_keys_and_values) {
    em_scope_begin();
    em_module *seq = must(em_module_new("Sequential", NULL));
    cr_assert_eq(em_module_append_child(seq, must(MAKE("Linear", "in_features", "4",
                                                       "out_features", "8"))), EM_OK);
    cr_assert_eq(em_module_append_child(seq, must(MAKE("ReLU"))), EM_OK);
    cr_assert_eq(em_module_append_child(seq, must(MAKE("Linear", "in_features", "8",
                                                       "out_features", "3", "bias", "false"))),
                 EM_OK);
    em_dict *sd = em_module_state_dict(seq);
    cr_assert_eq(em_dict_len(sd), 3);
    cr_assert_str_eq(em_dict_key(sd, 0), "0.weight");
    cr_assert_str_eq(em_dict_key(sd, 1), "0.bias");
    cr_assert_str_eq(em_dict_key(sd, 2), "2.weight");
    cr_assert_eq(em_tensor_size(em_dict_get(sd, "0.weight"), 0), 8);
    cr_assert_eq(em_tensor_size(em_dict_get(sd, "0.weight"), 1), 4);
    cr_assert_eq(em_module_parameter_count(seq, false), 8 * 4 + 8 + 3 * 8);

    em_tensor *x = randn(2, (int64_t[]){5, 4});
    em_tensor *y = run(seq, x);
    em_tensor *ref = em_linear(em_relu(em_linear(x, em_dict_get(sd, "0.weight"),
                                                 em_dict_get(sd, "0.bias"))),
                               em_dict_get(sd, "2.weight"), NULL);
    assert_close(y, ref, 1e-6);

    /* autograd through the layers: d sum(W2 relu(W1 x + b1)) / d b1 by the reference graph */
    cr_assert_eq(em_backward(em_sum(y, 0, NULL, false)), EM_OK, "%s", em_last_error());
    em_tensor *gb = em_clone(em_tensor_grad(em_dict_get(sd, "0.bias")));
    em_module_zero_grad(seq);
    cr_assert_eq(em_backward(em_sum(ref, 0, NULL, false)), EM_OK, "%s", em_last_error());
    assert_close(gb, em_tensor_grad(em_dict_get(sd, "0.bias")), 1e-6);
    em_dict_free(sd);
    em_module_free(seq);
    em_scope_end();
}

Test(layers, linear_and_conv_default_init_bounds) {
    em_scope_begin();
    em_module *fc = must(MAKE("Linear", "in_features", "400", "out_features", "300"));
    double bound = 1.0 / sqrt(400.0);
    const char *names[2] = {"weight", "bias"};
    for (int k = 0; k < 2; k++) {
        em_tensor *t = em_module_parameter(fc, names[k]);
        em_tensor *d = em_to_dtype(t, EM_F64);
        const double *p = em_tensor_data(d);
        double s2 = 0, mx = 0;
        for (int64_t i = 0; i < em_tensor_numel(d); i++) {
            cr_assert_leq(fabs(p[i]), bound, "%s[%lld] = %g outside +-%g", names[k],
                          (long long)i, p[i], bound);
            s2 += p[i] * p[i];
            mx = fmax(mx, fabs(p[i]));
        }
        if (k == 0) { /* 120000 draws: the variance of U(-b, b) is b^2 / 3 */
            double var = s2 / (double)em_tensor_numel(d);
            cr_assert_lt(fabs(var / (bound * bound / 3.0) - 1.0), 0.03, "variance %g", var);
        }
        cr_assert_gt(mx, 0.9 * bound);
    }
    /* Conv2d: fan_in = in_channels / groups * kH * kW */
    em_module *conv = must(MAKE("Conv2d", "in_channels", "8", "out_channels", "16",
                                "kernel_size", "[3, 5]", "groups", "2"));
    em_tensor *w = em_module_parameter(conv, "weight");
    cr_assert_eq(em_tensor_size(w, 1), 4);
    double cb = 1.0 / sqrt(4.0 * 15.0), mx = 0;
    em_tensor *b = em_module_parameter(conv, "bias");
    for (int64_t i = 0; i < em_tensor_numel(w); i++)
        mx = fmax(mx, fabs(em_test_at(w, i)));
    for (int64_t i = 0; i < em_tensor_numel(b); i++)
        cr_assert_leq(fabs(em_test_at(b, i)), cb);
    cr_assert_leq(mx, cb);
    cr_assert_gt(mx, 0.8 * cb);
    em_module_free(fc);
    em_module_free(conv);
    em_scope_end();
}

Test(layers, option_errors_name_layer_option_and_allowed) {
    cr_assert_null(MAKE("Linear", "in_feature", "4", "out_features", "2"));
    em_assert_error(EM_ERR_INVALID, "Linear: unknown option 'in_feature' (did you mean "
                    "'in_features'?)");
    cr_assert_null(MAKE("Conv2d", "in_channels", "3", "out_channels", "8", "kernel_size", "3",
                        "padding", "full"));
    em_assert_error(EM_ERR_INVALID, "Conv2d: option 'padding' = 'full': not one of the choices; "
                    "expected one of 'same', 'valid', or a list of ints");
    cr_assert_null(MAKE("Conv2d", "in_channels", "3", "out_channels", "8", "kernel_size", "3",
                        "padding", "same", "stride", "2"));
    em_assert_error(EM_ERR_INVALID, "padding='same' is not supported for strided convolutions");
    cr_assert_null(MAKE("Conv2d", "in_channels", "3", "out_channels", "8", "kernel_size", "3",
                        "groups", "2"));
    em_assert_error(EM_ERR_INVALID, "Conv2d: groups=2 must divide in_channels=3");
    cr_assert_null(MAKE("Conv2d", "in_channels", "3", "out_channels", "8",
                        "kernel_size", "[1, 2, 3]"));
    em_assert_error(EM_ERR_INVALID, "Conv2d: option 'kernel_size' takes one int or a list of 2");
    cr_assert_null(MAKE("Dropout", "p", "1.5"));
    em_assert_error(EM_ERR_INVALID, "Dropout: option 'p' = 1.5: out of range; expected a number "
                    "in [0, 1]");
    cr_assert_null(MAKE("BatchNorm2d", "num_features", "8", "affine", "maybe"));
    em_assert_error(EM_ERR_INVALID, "BatchNorm2d: option 'affine' = 'maybe'");
    cr_assert_null(MAKE("CrossEntropyLoss", "reduction", "avg"));
    em_assert_error(EM_ERR_INVALID, "expected one of 'none', 'mean', 'sum'");
    cr_assert_null(MAKE("Linaer"));
    em_assert_error(EM_ERR_NOTFOUND, "did you mean 'Linear'?");
}

/* ---- Conv2d and pooling ------------------------------------------------------------------------ */

Test(layers, conv2d_against_the_op) {
    em_scope_begin();
    em_tensor *x = randn(4, (int64_t[]){2, 4, 9, 8});
    em_module *c = must(MAKE("Conv2d", "in_channels", "4", "out_channels", "6", "kernel_size",
                             "[3, 2]", "stride", "[2, 1]", "padding", "[1, 0]", "dilation",
                             "[1, 2]", "groups", "2"));
    em_tensor *ref = em_conv2d(x, em_module_parameter(c, "weight"),
                               em_module_parameter(c, "bias"), (int64_t[]){2, 1},
                               (int64_t[]){1, 0}, (int64_t[]){1, 2}, 2);
    assert_close(run(c, x), ref, 1e-5);
    em_module_free(c);

    /* 'same' with an even kernel: PyTorch pads (1 before, 2 after) for k = 4, dilation 1 */
    c = must(MAKE("Conv2d", "in_channels", "4", "out_channels", "3", "kernel_size", "4",
                  "padding", "same", "bias", "false"));
    em_tensor *y = run(c, x);
    cr_assert_eq(em_tensor_size(y, 2), 9);
    cr_assert_eq(em_tensor_size(y, 3), 8);
    em_tensor *padded = em_pad(x, 4, (int64_t[]){1, 2, 1, 2}, 0.0);
    ref = em_conv2d(padded, em_module_parameter(c, "weight"), NULL, NULL, NULL, NULL, 1);
    assert_close(y, ref, 1e-5);
    em_module_free(c);

    /* memory_format: channels_last gives the same values with channels-last strides, from a
     * row-major input and from a channels-last one (the previous layer's output) */
    c = must(MAKE("Conv2d", "in_channels", "4", "out_channels", "6", "kernel_size", "3",
                  "padding", "1", "memory_format", "channels_last"));
    ref = em_conv2d(x, em_module_parameter(c, "weight"), em_module_parameter(c, "bias"), NULL,
                    (int64_t[]){1, 1}, NULL, 1);
    y = run(c, x);
    cr_assert(em_tensor_is_channels_last(y) && !em_tensor_is_channels_last(ref));
    assert_close(y, ref, 1e-5);
    y = run(c, em_channels_last(x));
    cr_assert(em_tensor_is_channels_last(y));
    assert_close(y, ref, 1e-5);
    em_module_free(c);
    cr_assert_null(MAKE("Conv2d", "in_channels", "3", "out_channels", "8", "kernel_size", "3",
                        "memory_format", "nhwc"));
    cr_assert(strstr(em_last_error(), "memory_format"), "%s", em_last_error());

    /* a channel mismatch names the layer */
    c = must(MAKE("Conv2d", "in_channels", "3", "out_channels", "3", "kernel_size", "1"));
    cr_assert_null(em_module_forward(c, x));
    cr_assert(strncmp(em_last_error(), "Conv2d: ", 8) == 0, "%s", em_last_error());
    em_module_free(c);
    em_scope_end();
}

/* memory_format: blocked (the nChw16c storage layout, ember/tensor.h em_layout): a Conv2d
 * with out_channels a multiple of 16 gives its output in it, from a one-channel image as from
 * a blocked input; ReLU and max pooling keep it, a Flatten converts; the CNN's output and
 * every parameter grad agree with the contiguous network's within the tolerance of two
 * oneDNN convolution implementations (other summation orders), and the state dicts are the
 * same. Other channel counts give a plain output. */
static em_module *small_cnn(const char *fmt) {
    em_module *net = must(em_module_new("Sequential", NULL));
    em_module_append_child(net, must(MAKE("Conv2d", "in_channels", "1", "out_channels", "16",
                                          "kernel_size", "3", "padding", "1", "memory_format",
                                          fmt, "activation", "relu")));
    em_module_append_child(net, must(MAKE("MaxPool2d", "kernel_size", "2")));
    em_module_append_child(net, must(MAKE("Conv2d", "in_channels", "16", "out_channels", "32",
                                          "kernel_size", "3", "padding", "1", "memory_format",
                                          fmt)));
    em_module_append_child(net, must(MAKE("ReLU")));
    em_module_append_child(net, must(MAKE("MaxPool2d", "kernel_size", "2")));
    em_module_append_child(net, must(MAKE("Flatten")));
    em_module_append_child(net, must(MAKE("Linear", "in_features", "288", "out_features", "10")));
    return net;
}

Test(layers, conv2d_memory_format_blocked) {
    /* oneDNN's f32 convolution declares the layout; the im2col loops of a build without
     * oneDNN do not, and give plain outputs */
    const em_layout conv_out = kernel_registered("cpu_conv2d_dnnl_f32") ? EM_LAYOUT_NCHW16C
                                                                         : EM_LAYOUT_PLAIN;
    em_scope_begin();
    em_tensor *x = randn(4, (int64_t[]){4, 1, 12, 12});
    em_module *c = must(MAKE("Conv2d", "in_channels", "1", "out_channels", "16", "kernel_size",
                             "3", "memory_format", "blocked"));
    em_tensor *y = run(c, x);
    cr_assert_eq(em_tensor_layout(y), conv_out);
    em_tensor *ref = em_conv2d(x, em_module_parameter(c, "weight"), em_module_parameter(c, "bias"),
                               NULL, NULL, NULL, 1);
    cr_assert_eq(em_tensor_layout(ref), EM_LAYOUT_PLAIN, "the preference ends with the layer");
    assert_close(y, ref, 1e-5);
    em_module_free(c);
    c = must(MAKE("Conv2d", "in_channels", "1", "out_channels", "6", "kernel_size", "3",
                  "memory_format", "blocked"));
    cr_assert_eq(em_tensor_layout(run(c, x)), EM_LAYOUT_PLAIN, "6 channels do not fit nChw16c");
    em_module_free(c);

    em_module *nb = small_cnn("blocked"), *np = small_cnn("contiguous");
    em_dict *sp = em_module_state_dict(np), *sb = em_module_state_dict(nb);
    cr_assert_eq(em_dict_len(sp), em_dict_len(sb));
    cr_assert_eq(em_module_load_state_dict(nb, sp, true, NULL), EM_OK, "%s", em_last_error());
    /* the first block's activations stay blocked through ReLU and pooling */
    em_tensor *h = run(em_module_child(nb, "1"), run(em_module_child(nb, "0"), x));
    cr_assert_eq(em_tensor_layout(h), conv_out);
    em_tensor *yb = run(nb, x), *yp = run(np, x);
    cr_assert_eq(em_tensor_layout(yb), EM_LAYOUT_PLAIN);
    assert_close(yb, yp, 1e-4);
    em_tensor *r = randn(2, (int64_t[]){4, 10});
    cr_assert_eq(em_backward(em_sum(em_mul(yb, r), 0, NULL, false)), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_backward(em_sum(em_mul(yp, r), 0, NULL, false)), EM_OK, "%s", em_last_error());
    for (size_t i = 0; i < em_dict_len(sp); i++) {
        const char *k = em_dict_key(sp, i);
        em_tensor *gb = em_tensor_grad(em_dict_get(sb, k)), *gp = em_tensor_grad(em_dict_get(sp, k));
        cr_assert(gb && gp, "%s: no grad", k);
        cr_assert_eq(em_tensor_layout(gb), EM_LAYOUT_PLAIN, "%s: parameters' grads are plain", k);
        double scale = 0;
        for (int64_t j = 0; j < em_tensor_numel(gp); j++) scale = fmax(scale, fabs(em_test_at(gp, j)));
        assert_close(gb, gp, 1e-4 * fmax(scale, 1));
    }
    em_dict_free(sp), em_dict_free(sb);
    em_module_free(nb), em_module_free(np);
    em_scope_end();
}

/* activation: relu (the fused conv2d_relu) is a Conv2d then a ReLU: the same state-dict keys
 * (a Sequential of the two loads into a Sequential of the one, strictly), the same output and
 * grads bit for bit, row-major and channels-last; another activation is refused naming the
 * option. */
static void assert_same(const em_tensor *a, const em_tensor *b, const char *what) {
    cr_assert(a && b, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_numel(a), em_tensor_numel(b), "%s", what);
    for (int64_t i = 0; i < em_tensor_numel(a); i++) {
        double u = em_test_at(a, i), v = em_test_at(b, i);
        cr_assert(u == v, "%s: element %lld: %.9g fused, %.9g unfused", what, (long long)i, u, v);
    }
}

Test(layers, conv2d_activation_relu_is_conv2d_then_relu) {
    static const char *const fmts[] = {"contiguous", "channels_last"};
    for (int f = 0; f < 2; f++) {
        em_scope_begin();
        em_module *fused = must(em_module_new("Sequential", NULL)),
                  *plain = must(em_module_new("Sequential", NULL));
        cr_assert_eq(em_module_append_child(fused, must(MAKE("Conv2d", "in_channels", "4",
                     "out_channels", "16", "kernel_size", "3", "padding", "1", "memory_format",
                     fmts[f], "activation", "relu"))), EM_OK);
        cr_assert_eq(em_module_append_child(plain, must(MAKE("Conv2d", "in_channels", "4",
                     "out_channels", "16", "kernel_size", "3", "padding", "1", "memory_format",
                     fmts[f]))), EM_OK);
        cr_assert_eq(em_module_append_child(plain, must(MAKE("ReLU"))), EM_OK);
        em_dict *sd = em_module_state_dict(plain), *sf = em_module_state_dict(fused);
        cr_assert_eq(em_dict_len(sf), 2);
        cr_assert_str_eq(em_dict_key(sf, 0), "0.weight");
        cr_assert_str_eq(em_dict_key(sf, 1), "0.bias");
        cr_assert_eq(em_module_load_state_dict(fused, sd, true, NULL), EM_OK, "%s", em_last_error());
        em_tensor *x = randn(4, (int64_t[]){3, 4, 9, 8});
        em_tensor *yf = run(fused, x), *yp = run(plain, x);
        cr_assert_eq(em_tensor_is_channels_last(yf), f == 1);
        assert_same(yf, yp, fmts[f]);
        em_tensor *r = randn(4, (int64_t[]){3, 16, 9, 8});
        cr_assert_eq(em_backward(em_sum(em_mul(yf, r), 0, NULL, false)), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_backward(em_sum(em_mul(yp, r), 0, NULL, false)), EM_OK, "%s", em_last_error());
        em_dict *gf = em_module_state_dict(fused);
        for (int i = 0; i < 2; i++)
            assert_same(em_tensor_grad(em_dict_get(gf, em_dict_key(gf, i))),
                        em_tensor_grad(em_dict_get(sd, em_dict_key(gf, i))), em_dict_key(gf, i));
        em_dict_free(gf), em_dict_free(sd), em_dict_free(sf);
        em_module_free(fused), em_module_free(plain);
        em_scope_end();
    }
    cr_assert_null(MAKE("Conv2d", "in_channels", "3", "out_channels", "8", "kernel_size", "3",
                        "activation", "gelu"));
    em_assert_error(EM_ERR_INVALID, "Conv2d: option 'activation' = 'gelu': not one of the choices");
}

/* a and b hold the same bits (same shape and dtype; any layout: read through a plain copy). */
static void assert_bits(const em_tensor *a, const em_tensor *b, const char *what) {
    cr_assert(a && b, "%s: %s", what, em_last_error());
    cr_assert_eq(em_tensor_dtype(a), em_tensor_dtype(b), "%s", what);
    cr_assert_eq(em_tensor_numel(a), em_tensor_numel(b), "%s", what);
    size_t es = em_dtype_size(em_tensor_dtype(a)), bytes = (size_t)em_tensor_numel(a) * es;
    unsigned char *u = malloc(bytes ? bytes : 1), *v = malloc(bytes ? bytes : 1);
    cr_assert_eq(em_tensor_to_host(em_contiguous(a), u, bytes), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_to_host(em_contiguous(b), v, bytes), EM_OK, "%s", em_last_error());
    for (size_t i = 0; i < bytes; i += es)
        cr_assert(memcmp(u + i, v + i, es) == 0, "%s: element %zu: %.9g fused, %.9g unfused",
                  what, i / es, em_test_at(a, (int64_t)(i / es)), em_test_at(b, (int64_t)(i / es)));
    free(u), free(v);
}

/* activation: relu on a MaxPool2d (the fused max_pool2d_relu) is a ReLU then a MaxPool2d:
 * after the same Conv2d (its state dict loads strictly across), the output and the grads of
 * the input and of the convolution's parameters bit for bit, for a 2x2 and an overlapping
 * 3x3 stride 2 padding 1 ceil pooling, on row-major, channels-last and blocked (nChw16c)
 * activations, the output in the same layout; another activation is refused naming the
 * option. */
Test(layers, max_pool2d_activation_relu_is_relu_then_max_pool2d) {
    static const char *const fmts[] = {"contiguous", "channels_last", "blocked"};
    static const char *const pools[][4] = {{"kernel_size", "2", "stride", "2"},
                                           {"kernel_size", "3", "stride", "2"}};
    for (int f = 0; f < 3; f++)
        for (int pi = 0; pi < 2; pi++) {
            char what[64];
            snprintf(what, sizeof what, "%s, pooling %d", fmts[f], pi);
            em_scope_begin();
            em_module *fused = must(em_module_new("Sequential", NULL)),
                      *plain = must(em_module_new("Sequential", NULL));
            for (int k = 0; k < 2; k++)
                cr_assert_eq(em_module_append_child(k ? plain : fused, must(MAKE("Conv2d",
                             "in_channels", "4", "out_channels", "16", "kernel_size", "3",
                             "padding", "1", "memory_format", fmts[f]))), EM_OK);
            em_module *mf = pi ? MAKE("MaxPool2d", pools[pi][0], pools[pi][1], pools[pi][2],
                                      pools[pi][3], "padding", "1", "ceil_mode", "true",
                                      "activation", "relu")
                               : MAKE("MaxPool2d", pools[pi][0], pools[pi][1], pools[pi][2],
                                      pools[pi][3], "activation", "relu");
            em_module *mp = pi ? MAKE("MaxPool2d", pools[pi][0], pools[pi][1], pools[pi][2],
                                      pools[pi][3], "padding", "1", "ceil_mode", "true")
                               : MAKE("MaxPool2d", pools[pi][0], pools[pi][1], pools[pi][2],
                                      pools[pi][3]);
            cr_assert_eq(em_module_append_child(fused, must(mf)), EM_OK);
            cr_assert_eq(em_module_append_child(plain, must(MAKE("ReLU"))), EM_OK);
            cr_assert_eq(em_module_append_child(plain, must(mp)), EM_OK);
            em_dict *sd = em_module_state_dict(plain), *sf = em_module_state_dict(fused);
            cr_assert_eq(em_dict_len(sf), 2);
            cr_assert_eq(em_module_load_state_dict(fused, sd, true, NULL), EM_OK, "%s",
                         em_last_error());
            em_tensor *x = randn(4, (int64_t[]){3, 4, 9, 7}), *xd[2], *y[2];
            for (int k = 0; k < 2; k++) {
                xd[k] = em_detach(x);
                cr_assert_eq(em_requires_grad_(xd[k], true), EM_OK);
                y[k] = run(k ? plain : fused, xd[k]);
            }
            cr_assert_eq(em_tensor_layout(y[0]), em_tensor_layout(y[1]), "%s", what);
            /* blocked where the convolution declares the layout (oneDNN's f32 kernel; the
             * im2col loops of a build without oneDNN give plain outputs) */
            cr_assert_eq(em_tensor_layout(y[0]),
                         f == 2 && kernel_registered("cpu_conv2d_dnnl_f32") ? EM_LAYOUT_NCHW16C
                                                                          : EM_LAYOUT_PLAIN,
                         "%s", what);
            cr_assert_eq(em_tensor_is_channels_last(y[0]), f == 1, "%s", what);
            em_tensor *r = randn(4, em_tensor_shape(y[0]));
            for (int k = 0; k < 2; k++)
                cr_assert_eq(em_backward(em_sum(em_mul(y[k], r), 0, NULL, false)), EM_OK, "%s",
                             em_last_error());
            assert_bits(y[0], y[1], what);
            assert_bits(em_tensor_grad(xd[0]), em_tensor_grad(xd[1]), "input grad");
            em_dict *gf = em_module_state_dict(fused);
            for (int i = 0; i < 2; i++)
                assert_bits(em_tensor_grad(em_dict_get(gf, em_dict_key(gf, i))),
                            em_tensor_grad(em_dict_get(sd, em_dict_key(gf, i))), em_dict_key(gf, i));
            em_dict_free(gf), em_dict_free(sd), em_dict_free(sf);
            em_module_free(fused), em_module_free(plain);
            em_scope_end();
        }
    cr_assert_null(MAKE("MaxPool2d", "kernel_size", "2", "activation", "gelu"));
    em_assert_error(EM_ERR_INVALID, "MaxPool2d: option 'activation' = 'gelu': not one of the choices");
}

Test(layers, pooling_by_plain_loops) {
    em_scope_begin();
    int64_t shape[4] = {1, 2, 4, 6};
    em_tensor *x = randn(4, shape);
    em_tensor *xd = em_to_dtype(x, EM_F64);
    const double *p = em_tensor_data(xd);
    em_module *mp = must(MAKE("MaxPool2d", "kernel_size", "2"));
    em_module *ap = must(MAKE("AvgPool2d", "kernel_size", "[2, 3]"));
    em_module *ad = must(MAKE("AdaptiveAvgPool2d", "output_size", "1"));
    em_tensor *ym = run(mp, x), *ya = run(ap, x), *yd = run(ad, x);
    cr_assert_eq(em_tensor_size(ym, 2), 2);
    cr_assert_eq(em_tensor_size(ym, 3), 3);
    cr_assert_eq(em_tensor_size(ya, 3), 2);
    for (int c = 0; c < 2; c++) {
        double total = 0;
        for (int i = 0; i < 24; i++)
            total += p[c * 24 + i];
        cr_assert_float_eq(em_test_at(yd, c), total / 24.0, 1e-5);
        for (int oh = 0; oh < 2; oh++)
            for (int ow = 0; ow < 3; ow++) {
                double mx = -INFINITY;
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 2; j++)
                        mx = fmax(mx, p[c * 24 + (2 * oh + i) * 6 + 2 * ow + j]);
                cr_assert_float_eq(em_test_at(ym, c * 6 + oh * 3 + ow), mx, 1e-6);
            }
        for (int oh = 0; oh < 2; oh++)
            for (int ow = 0; ow < 2; ow++) {
                double s = 0;
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 3; j++)
                        s += p[c * 24 + (2 * oh + i) * 6 + 3 * ow + j];
                cr_assert_float_eq(em_test_at(ya, c * 4 + oh * 2 + ow), s / 6.0, 1e-5);
            }
    }
    em_module_free(mp);
    em_module_free(ap);
    em_module_free(ad);
    em_scope_end();
}

/* ---- activations, Flatten, Identity, Embedding, LayerNorm --------------------------------------- */

Test(layers, activations_match_their_ops) {
    em_scope_begin();
    em_tensor *x = randn(2, (int64_t[]){3, 5});
    struct { const char *cls, *k, *v; em_tensor *ref; } cases[] = {
        {"ReLU", NULL, NULL, em_relu(x)},
        {"LeakyReLU", "negative_slope", "0.2", em_leaky_relu(x, 0.2)},
        {"GELU", "approximate", "tanh", em_gelu(x, "tanh")},
        {"GELU", NULL, NULL, em_gelu(x, "none")},
        {"SiLU", NULL, NULL, em_silu(x)},
        {"Tanh", NULL, NULL, em_tanh(x)},
        {"Sigmoid", NULL, NULL, em_sigmoid(x)},
        {"Softmax", "dim", "0", em_softmax(x, 0)},
        {"Softmax", NULL, NULL, em_softmax(x, 1)},
        {"LogSoftmax", NULL, NULL, em_log_softmax(x, -1)},
        {"Identity", NULL, NULL, x},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        em_module *m = must(cases[i].k ? MAKE(cases[i].cls, cases[i].k, cases[i].v)
                                       : MAKE(cases[i].cls));
        assert_close(run(m, x), cases[i].ref, 1e-6);
        em_module_free(m);
    }
    /* the values themselves, for two of them */
    em_tensor *r = cases[0].ref, *l = cases[1].ref;
    for (int64_t i = 0; i < 15; i++) {
        double v = em_test_at(x, i);
        cr_assert_float_eq(em_test_at(r, i), v > 0 ? v : 0, 1e-7);
        cr_assert_float_eq(em_test_at(l, i), v > 0 ? v : 0.2 * v, 1e-6);
    }
    em_module *f = must(MAKE("Flatten"));
    em_tensor *y = run(f, randn(4, (int64_t[]){2, 3, 4, 5}));
    cr_assert_eq(em_tensor_ndim(y), 2);
    cr_assert_eq(em_tensor_size(y, 1), 60);
    em_module_free(f);
    em_scope_end();
}

Test(layers, embedding_and_layer_norm) {
    em_scope_begin();
    em_module *e = must(MAKE("Embedding", "num_embeddings", "10", "embedding_dim", "4",
                             "padding_idx", "-1"));
    em_tensor *w = em_module_parameter(e, "weight");
    for (int j = 0; j < 4; j++)
        cr_assert_eq(em_test_at(w, 9 * 4 + j), 0.0, "the padding row is zero");
    int64_t idx[3] = {2, 9, 2};
    em_tensor *ix = em_from_data(idx, 1, (int64_t[]){3}, EM_I64, em_cpu());
    em_tensor *y = run(e, ix);
    for (int j = 0; j < 4; j++) {
        cr_assert_eq(em_test_at(y, j), em_test_at(w, 2 * 4 + j));
        cr_assert_eq(em_test_at(y, 4 + j), 0.0);
    }
    cr_assert_null(MAKE("Embedding", "num_embeddings", "10", "embedding_dim", "4",
                        "padding_idx", "10"));
    em_assert_error(EM_ERR_INVALID, "Embedding: padding_idx 10 must be within num_embeddings");
    em_module_free(e);

    em_module *ln = must(MAKE("LayerNorm", "normalized_shape", "[5]", "eps", "1e-5"));
    em_tensor *x = randn(2, (int64_t[]){3, 5});
    y = run(ln, x);
    for (int r = 0; r < 3; r++) {
        double mean = 0, var = 0;
        for (int j = 0; j < 5; j++)
            mean += em_test_at(x, r * 5 + j) / 5.0;
        for (int j = 0; j < 5; j++)
            var += pow(em_test_at(x, r * 5 + j) - mean, 2) / 5.0;
        for (int j = 0; j < 5; j++)
            cr_assert_float_eq(em_test_at(y, r * 5 + j),
                               (em_test_at(x, r * 5 + j) - mean) / sqrt(var + 1e-5), 1e-5);
    }
    em_dict *sd = em_module_state_dict(ln);
    cr_assert_eq(em_dict_len(sd), 2);
    cr_assert_str_eq(em_dict_key(sd, 1), "bias");
    em_dict_free(sd);
    em_module_free(ln);
    em_scope_end();
}

/* ---- train / eval ------------------------------------------------------------------------------ */

Test(layers, dropout_train_and_eval) {
    em_scope_begin();
    em_module *d = must(MAKE("Dropout", "p", "0.25"));
    em_tensor *x = em_ones(1, (int64_t[]){20000}, EM_F32, em_cpu());
    em_tensor *y = run(d, x);
    em_tensor *yd = em_to_dtype(y, EM_F64);
    const double *p = em_tensor_data(yd);
    int64_t zeros = 0;
    for (int64_t i = 0; i < 20000; i++) {
        if (p[i] == 0.0)
            zeros++;
        else
            cr_assert_float_eq(p[i], 1.0 / 0.75, 1e-6, "survivors are scaled by 1/(1-p)");
    }
    /* 20000 draws of p = 0.25: sd of the fraction 0.003 */
    cr_assert_lt(fabs((double)zeros / 20000.0 - 0.25), 0.015, "%lld zeros", (long long)zeros);
    em_module_train(d, false);
    assert_close(run(d, x), x, 0.0);
    em_module_free(d);
    em_scope_end();
}

Test(layers, batchnorm_running_stats_and_eval) {
    em_scope_begin();
    em_module *bn = must(MAKE("BatchNorm2d", "num_features", "3"));
    em_dict *sd = em_module_state_dict(bn);
    const char *keys[] = {"weight", "bias", "running_mean", "running_var",
                          "num_batches_tracked"};
    cr_assert_eq(em_dict_len(sd), 5);
    for (int i = 0; i < 5; i++)
        cr_assert_str_eq(em_dict_key(sd, i), keys[i]);
    cr_assert_eq(em_tensor_dtype(em_dict_get(sd, "num_batches_tracked")), EM_I64);
    em_dict_free(sd);

    em_tensor *x = randn(4, (int64_t[]){4, 3, 2, 2});
    em_tensor *y = run(bn, x);
    /* per channel: batch mean and biased variance normalise; running stats get momentum 0.1
     * of the mean and of the UNBIASED variance */
    for (int c = 0; c < 3; c++) {
        double mean = 0, var = 0;
        for (int n = 0; n < 4; n++)
            for (int k = 0; k < 4; k++)
                mean += em_test_at(x, n * 12 + c * 4 + k) / 16.0;
        for (int n = 0; n < 4; n++)
            for (int k = 0; k < 4; k++)
                var += pow(em_test_at(x, n * 12 + c * 4 + k) - mean, 2);
        cr_assert_float_eq(em_test_at(y, c * 4), (em_test_at(x, c * 4) - mean) /
                           sqrt(var / 16.0 + 1e-5), 1e-4);
        cr_assert_float_eq(em_test_at(em_module_buffer(bn, "running_mean"), c), 0.1 * mean, 1e-6);
        cr_assert_float_eq(em_test_at(em_module_buffer(bn, "running_var"), c),
                           0.9 + 0.1 * var / 15.0, 1e-5);
    }
    cr_assert_eq(em_test_at(em_module_buffer(bn, "num_batches_tracked"), 0), 1.0);

    /* eval: the running statistics normalise, nothing is updated; a batch of one is fine */
    em_module_train(bn, false);
    em_tensor *one = em_narrow(x, 0, 0, 1);
    em_tensor *ye = run(bn, one);
    double rm = em_test_at(em_module_buffer(bn, "running_mean"), 1);
    double rv = em_test_at(em_module_buffer(bn, "running_var"), 1);
    cr_assert_float_eq(em_test_at(ye, 4), (em_test_at(one, 4) - rm) / sqrt(rv + 1e-5), 1e-5);
    cr_assert_eq(em_test_at(em_module_buffer(bn, "num_batches_tracked"), 0), 1.0);

    /* training on one value per channel: PyTorch's error, pointing at drop_last */
    em_module *bn1 = must(MAKE("BatchNorm1d", "num_features", "3"));
    cr_assert_null(em_module_forward(bn1, randn(2, (int64_t[]){1, 3})));
    em_assert_error(EM_ERR_SHAPE, "BatchNorm1d: expected more than 1 value per channel when "
                    "training, got input size [1, 3]");
    cr_assert(strstr(em_last_error(), "drop_last"), "%s", em_last_error());
    cr_assert_null(em_module_forward(bn1, x));
    em_assert_error(EM_ERR_SHAPE, "BatchNorm1d: expected 2D or 3D input (got 4D input");
    cr_assert_null(em_module_forward(bn1, randn(2, (int64_t[]){4, 5})));
    em_assert_error(EM_ERR_SHAPE, "expected 3 channels (num_features)");

    /* momentum 'none': a cumulative average over the batches seen */
    em_module *cum = must(MAKE("BatchNorm1d", "num_features", "1", "momentum", "none",
                               "affine", "false"));
    em_tensor *b1 = em_test_tensor(EM_F32, 2, (int64_t[]){2, 1}, (double[]){1, 3});
    em_tensor *b2 = em_test_tensor(EM_F32, 2, (int64_t[]){2, 1}, (double[]){5, 7});
    run(cum, b1);
    run(cum, b2);
    cr_assert_float_eq(em_test_at(em_module_buffer(cum, "running_mean"), 0), 4.0, 1e-6);
    cr_assert_eq(em_dict_len(sd = em_module_state_dict(cum)), 3);
    em_dict_free(sd);
    em_module_free(cum);
    em_module_free(bn1);
    em_module_free(bn);
    em_scope_end();
}

/* ---- containers -------------------------------------------------------------------------------- */

Test(layers, residual_and_parallel) {
    em_scope_begin();
    em_tensor *x = randn(2, (int64_t[]){2, 4});
    em_module *res = must(em_module_new("Residual", NULL));
    em_module *fc = must(MAKE("Linear", "in_features", "4", "out_features", "4"));
    em_tensor *w = em_module_parameter(fc, "weight"), *b = em_module_parameter(fc, "bias");
    cr_assert_eq(em_module_add_child(res, "fc", fc), EM_OK);
    assert_close(run(res, x), em_add(x, em_linear(x, w, b)), 1e-6);

    /* a projection: shortcut named 'downsample' */
    em_module *blk = must(MAKE("Residual", "shortcut", "downsample"));
    em_module *f1 = must(MAKE("Linear", "in_features", "4", "out_features", "6"));
    em_module *pr = must(MAKE("Linear", "in_features", "4", "out_features", "6", "bias", "0"));
    em_tensor *w1 = em_module_parameter(f1, "weight"), *b1 = em_module_parameter(f1, "bias");
    em_tensor *wp = em_module_parameter(pr, "weight");
    em_module_add_child(blk, "fc1", f1);
    em_module_add_child(blk, "downsample", pr);
    assert_close(run(blk, x), em_add(em_linear(x, wp, NULL), em_linear(x, w1, b1)), 1e-6);
    em_dict *sd = em_module_state_dict(blk);
    cr_assert_str_eq(em_dict_key(sd, 2), "downsample.weight");
    em_dict_free(sd);
    /* without the projection the shapes do not add: the message says what to do */
    em_module *bad = must(em_module_new("Residual", NULL));
    em_module_add_child(bad, "fc1", must(MAKE("Linear", "in_features", "4", "out_features", "6")));
    cr_assert_null(em_module_forward(bad, x));
    em_assert_error(EM_ERR_SHAPE, "Residual: the shortcut gives [2, 4] but the residual branch "
                    "[2, 6]; add a 'shortcut' child");

    em_module *par = must(em_module_new("Parallel", NULL));
    em_module_append_child(par, must(MAKE("ReLU")));
    em_module_append_child(par, must(MAKE("Tanh")));
    em_tensor *y = run(par, x);
    cr_assert_eq(em_tensor_size(y, 1), 8);
    assert_close(y, em_cat(2, (const em_tensor *[]){em_relu(x), em_tanh(x)}, 1), 1e-6);
    em_module *sum = must(MAKE("Parallel", "mode", "sum"));
    em_module_append_child(sum, must(MAKE("ReLU")));
    em_module_append_child(sum, must(MAKE("Tanh")));
    assert_close(run(sum, x), em_add(em_relu(x), em_tanh(x)), 1e-6);

    /* a failing child is named */
    em_module *seq = must(em_module_new("Sequential", NULL));
    em_module_append_child(seq, must(MAKE("ReLU")));
    em_module_append_child(seq, must(MAKE("Linear", "in_features", "5", "out_features", "2")));
    cr_assert_null(em_module_forward(seq, x));
    cr_assert(strstr(em_last_error(), "Sequential: layer 1 (Linear): Linear: input of shape"),
              "%s", em_last_error());
    /* the class name is not repeated before its op's own "linear:" (issue 13) */
    cr_assert(!strcasestr(em_last_error(), "Linear: linear:"), "%s", em_last_error());
    em_module_free(seq);
    em_module_free(sum);
    em_module_free(par);
    em_module_free(bad);
    em_module_free(blk);
    em_module_free(res);
    em_scope_end();
}

/* An integer batch (uint8 images straight from a dataset) meeting a float layer: the error
 * says so and names the fix, instead of only the op's dtype mismatch (issue 13). */
Test(layers, integer_input_to_a_float_layer_names_to_float) {
    em_scope_begin();
    em_module *lin = must(MAKE("Linear", "in_features", "4", "out_features", "3"));
    em_module *conv = must(MAKE("Conv2d", "in_channels", "1", "out_channels", "2", "kernel_size",
                                "3"));
    em_tensor *x = em_zeros(2, (int64_t[]){2, 4}, EM_U8, em_cpu());
    cr_assert_null(em_module_forward(lin, x));
    em_assert_error(EM_ERR_DTYPE, "Linear: the input is uint8 but the layer's weight is float32");
    em_assert_error(EM_ERR_DTYPE, "to_float");
    em_tensor *img = em_zeros(4, (int64_t[]){1, 1, 5, 5}, EM_I64, em_cpu());
    cr_assert_null(em_module_forward(conv, img));
    em_assert_error(EM_ERR_DTYPE, "Conv2d: the input is int64");
    /* a float input of another dtype is the op's business (same dtype rule as before) */
    cr_assert_not_null(em_module_forward(lin, em_to_dtype(x, EM_F32)), "%s", em_last_error());
    em_module_free(lin);
    em_module_free(conv);
    em_scope_end();
}

/* ---- losses ------------------------------------------------------------------------------------ */

Test(layers, losses_match_their_ops) {
    em_scope_begin();
    em_tensor *logits = randn(2, (int64_t[]){4, 3});
    int64_t t[4] = {0, 2, 1, 2};
    em_tensor *target = em_from_data(t, 1, (int64_t[]){4}, EM_I64, em_cpu());
    em_module *ce = must(MAKE("CrossEntropyLoss", "label_smoothing", "0.1", "weight",
                              "[1, 2, 0.5]"));
    cr_assert(strstr(em_module_class_of(ce)->description, "Softmax"));
    em_tensor *in2[2] = {logits, target};
    em_tensor *l = em_module_forward_n(ce, in2, 2);
    em_tensor *wt = em_test_tensor(EM_F32, 1, (int64_t[]){3}, (double[]){1, 2, 0.5});
    assert_close(l, em_cross_entropy(logits, target, wt, EM_REDUCTION_MEAN, -100, 0.1), 1e-6);
    /* by hand, reduction 'sum', no smoothing or weight */
    em_module *ces = must(MAKE("CrossEntropyLoss", "reduction", "sum"));
    double want = 0;
    for (int i = 0; i < 4; i++) {
        double z = 0;
        for (int c = 0; c < 3; c++)
            z += exp(em_test_at(logits, i * 3 + c));
        want += log(z) - em_test_at(logits, i * 3 + t[i]);
    }
    cr_assert_float_eq(em_item(em_module_forward_n(ces, in2, 2)), want, 1e-5);
    em_dict *sd = em_module_state_dict(ce);
    cr_assert_eq(em_dict_len(sd), 1, "the class weights are a buffer, as in PyTorch");
    em_dict_free(sd);
    /* a batch-size mismatch: PyTorch's message with both sizes */
    em_tensor *short_t = em_narrow(target, 0, 0, 3);
    cr_assert_null(em_module_forward_n(ce, (em_tensor *[]){logits, short_t}, 2));
    cr_assert(strstr(em_last_error(), "CrossEntropyLoss: ") && strstr(em_last_error(), "3") &&
              strstr(em_last_error(), "4"), "%s", em_last_error());
    /* one input is a clear error */
    cr_assert_null(em_module_forward(ce, logits));
    em_assert_error(EM_ERR_INVALID, "CrossEntropyLoss: forward takes 2 inputs (input, target), "
                    "got 1");

    em_module *nll = must(MAKE("NLLLoss"));
    assert_close(em_module_forward_n(nll, (em_tensor *[]){em_log_softmax(logits, 1), target}, 2),
                 em_cross_entropy(logits, target, NULL, EM_REDUCTION_MEAN, -100, 0.0), 1e-6);

    em_tensor *a = randn(2, (int64_t[]){4, 3}), *b = randn(2, (int64_t[]){4, 3});
    em_module *mse = must(MAKE("MSELoss")), *l1 = must(MAKE("L1Loss", "reduction", "sum"));
    em_module *sl1 = must(MAKE("SmoothL1Loss", "beta", "0.5"));
    em_module *bce = must(MAKE("BCEWithLogitsLoss", "pos_weight", "[1, 2, 3]"));
    em_tensor *ab[2] = {a, b};
    double mse_want = 0, l1_want = 0;
    for (int i = 0; i < 12; i++) {
        double d = em_test_at(a, i) - em_test_at(b, i);
        mse_want += d * d / 12.0;
        l1_want += fabs(d);
    }
    cr_assert_float_eq(em_item(em_module_forward_n(mse, ab, 2)), mse_want, 1e-5);
    cr_assert_float_eq(em_item(em_module_forward_n(l1, ab, 2)), l1_want, 1e-5);
    assert_close(em_module_forward_n(sl1, ab, 2),
                 em_smooth_l1_loss(a, b, EM_REDUCTION_MEAN, 0.5), 1e-6);
    em_tensor *probs = em_sigmoid(b);
    em_tensor *pw = em_test_tensor(EM_F32, 1, (int64_t[]){3}, (double[]){1, 2, 3});
    assert_close(em_module_forward_n(bce, (em_tensor *[]){a, probs}, 2),
                 em_binary_cross_entropy_with_logits(a, probs, NULL, pw, EM_REDUCTION_MEAN),
                 1e-6);
    /* a target of another shape is refused rather than broadcast */
    em_tensor *col = randn(2, (int64_t[]){4, 1}), *flat = randn(1, (int64_t[]){4});
    cr_assert_null(em_module_forward_n(mse, (em_tensor *[]){col, flat}, 2));
    em_assert_error(EM_ERR_SHAPE, "MSELoss: using a target size ([4]) that is different to the "
                    "input size ([4, 1])");
    em_module *all[] = {ce, ces, nll, mse, l1, sl1, bce};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        em_module_free(all[i]);
    em_scope_end();
}

/* ---- summary ----------------------------------------------------------------------------------- */

Test(layers, summary_of_a_cnn) {
    em_scope_begin();
    em_module *net = must(em_module_new("Sequential", NULL));
    em_module_append_child(net, must(MAKE("Conv2d", "in_channels", "1", "out_channels", "4",
                                          "kernel_size", "3", "padding", "1")));
    em_module_append_child(net, must(MAKE("BatchNorm2d", "num_features", "4")));
    em_module_append_child(net, must(MAKE("ReLU")));
    em_module_append_child(net, must(MAKE("MaxPool2d", "kernel_size", "2")));
    em_module_append_child(net, must(MAKE("Flatten")));
    em_module_append_child(net, must(MAKE("Dropout", "p", "0.5")));
    em_module_append_child(net, must(MAKE("Linear", "in_features", "64", "out_features", "10")));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(em_module_summary(net, 4, (int64_t[]){2, 1, 8, 8}, f), EM_OK, "%s",
                 em_last_error());
    fclose(f);
    cr_assert(strstr(text, "  0 (Conv2d)                             [2, 4, 8, 8]"), "%s", text);
    cr_assert(strstr(text, "  3 (MaxPool2d)                          [2, 4, 4, 4]"), "%s", text);
    cr_assert(strstr(text, "  6 (Linear)                             [2, 10]                "
                           "            650          650\n"), "%s", text);
    cr_assert(strstr(text, "  2 (ReLU)                               [2, 4, 8, 8]           "
                           "             --           --\n"), "%s", text);
    /* the summary's forward ran in eval mode and changed nothing */
    em_module *bn = em_module_child(net, "1");
    cr_assert(em_module_training(bn));
    cr_assert_eq(em_test_at(em_module_buffer(bn, "num_batches_tracked"), 0), 0.0);
    cr_assert(strstr(text, "Total params: 698\n"), "%s", text); /* 40 + 8 + 650 */
    cr_assert(strstr(text, "Trainable params: 698\n"), "%s", text);
    free(text);
    /* an Embedding model gets int64 zeros */
    em_module *emb = must(MAKE("Embedding", "num_embeddings", "5", "embedding_dim", "2"));
    text = NULL;
    f = open_memstream(&text, &len);
    cr_assert_eq(em_module_summary(emb, 1, (int64_t[]){3}, f), EM_OK, "%s", em_last_error());
    fclose(f);
    cr_assert(strstr(text, "[3, 2]"), "%s", text);
    free(text);
    em_module_free(emb);
    em_module_free(net);
    em_scope_end();
}

/* ---- a layer from a test plugin ----------------------------------------------------------------- */

static void plugin_setup(void) {
    const char *d = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(d && *d, "EMBER_TEST_PLUGIN_DIR is not set (run through `make check`)");
    char path[4096];
    snprintf(path, sizeof path, "%s/layer_plugin.so", d);
    setenv("EMBER_PLUGIN_PATH", path, 1);
    em_test_setup();
}

static void plugin_teardown(void) {
    em_test_teardown();
    unsetenv("EMBER_PLUGIN_PATH");
}

TestSuite(layer_plugin, .init = plugin_setup, .fini = plugin_teardown);

Test(layer_plugin, usable_by_name_in_a_sequential) {
    const em_module_class *c = em_module_class_find("testplug.Affine");
    cr_assert(c, "%s", em_last_error());
    /* attributed to the plugin */
    bool found = false;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        em_plugin_get(i, &info);
        if (info.name && strcmp(info.name, "ember-test-layers") == 0) {
            cr_assert_eq(info.status, EM_PLUGIN_LOADED, "%s", info.reason);
            cr_assert_eq(em_registry_module_class_count(info.registry), 4);
            cr_assert_str_eq(em_registry_module_class_name(info.registry, 0), "testplug.Affine");
            cr_assert_str_eq(em_registry_module_class_name(info.registry, 1),
                             "testplug.GradModeProbe");
            cr_assert_str_eq(em_registry_module_class_name(info.registry, 2),
                             "testplug.NoDerivative");
            cr_assert_str_eq(em_registry_module_class_name(info.registry, 3),
                             "testplug.ReservedDropout");
            found = true;
        }
    }
    cr_assert(found);
    em_scope_begin();
    em_module *seq = must(em_module_new("Sequential", NULL));
    em_module_append_child(seq, must(MAKE("Linear", "in_features", "3", "out_features", "2")));
    em_module_append_child(seq, must(MAKE("testplug.Affine", "features", "2")));
    em_dict *sd = em_module_state_dict(seq);
    cr_assert_str_eq(em_dict_key(sd, 2), "1.scale");
    cr_assert_str_eq(em_dict_key(sd, 3), "1.shift");
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_fill_(em_dict_get(sd, "1.scale"), 3.0);
    em_fill_(em_dict_get(sd, "1.shift"), -1.0);
    em_grad_mode_pop();
    em_tensor *x = randn(2, (int64_t[]){4, 3});
    em_tensor *ref = em_add_scalar(em_mul_scalar(em_linear(x, em_dict_get(sd, "0.weight"),
                                                           em_dict_get(sd, "0.bias")), 3.0), -1.0);
    assert_close(run(seq, x), ref, 1e-5);
    cr_assert_null(MAKE("testplug.Affine", "feature", "2"));
    em_assert_error(EM_ERR_INVALID, "testplug.Affine: unknown option 'feature' (did you mean "
                    "'features'?)");
    em_dict_free(sd);
    em_module_free(seq);
    em_scope_end();
}
