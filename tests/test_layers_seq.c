/*
 * test_layers_seq.c — the layers of issue 25 that wrap one op each: Conv1d, ConvTranspose2d
 * and GroupNorm, against PyTorch 1.13 (tests/fixtures/gen_seq_layers.py wrote
 * tests/fixtures/seq_layers/). Each layer loads PyTorch's state dict strictly (its keys, shapes
 * and dtypes), and its output and the gradients of sum(y * r) for the input and every
 * parameter must be within allclose(rtol 1e-5, atol 1e-6) of PyTorch's in float32. The other
 * way: a freshly made layer's state dict, saved by em_save and read back, has exactly
 * PyTorch's keys, shapes and dtypes (what load_state_dict(strict=True) checks), and its
 * default initialisation is PyTorch's (uniform within 1/sqrt(fan_in); GroupNorm ones and
 * zeros).
 */
#include <unistd.h>

#include "fixture_bin.h"

#define RTOL 1e-5
#define ATOL 1e-6

TestSuite(seq_layers, .init = em_test_setup, .fini = em_test_teardown);

typedef struct layer_case {
    const char *name, *cls;
    const char *params[2]; /* parameter names (NULL-ended) */
    double fan_in;         /* for the default-initialisation bound; 0: ones and zeros */
} layer_case;

/* The options PyTorch's layer had (gen_seq_layers.py). */
static em_options *options_of(const char *name) {
    em_options *o = em_options_new();
    if (!strcmp(name, "conv1d")) {
        em_options_set_int(o, "in_channels", 4);
        em_options_set_int(o, "out_channels", 6);
        em_options_set_int(o, "kernel_size", 3);
        em_options_set_int(o, "stride", 2);
        em_options_set_int(o, "padding", 1);
        em_options_set_int(o, "dilation", 2);
        em_options_set_int(o, "groups", 2);
    } else if (!strcmp(name, "conv1d_same")) {
        em_options_set_int(o, "in_channels", 3);
        em_options_set_int(o, "out_channels", 5);
        em_options_set_int(o, "kernel_size", 4);
        em_options_set_string(o, "padding", "same");
        em_options_set_bool(o, "bias", false);
    } else if (!strcmp(name, "convt")) {
        em_options_set_int(o, "in_channels", 4);
        em_options_set_int(o, "out_channels", 6);
        em_options_set_ints(o, "kernel_size", 2, (int64_t[]){3, 2});
        em_options_set_ints(o, "stride", 2, (int64_t[]){2, 3});
        em_options_set_ints(o, "padding", 2, (int64_t[]){1, 0});
        em_options_set_ints(o, "output_padding", 2, (int64_t[]){1, 2});
        em_options_set_int(o, "groups", 2);
        em_options_set_ints(o, "dilation", 2, (int64_t[]){1, 2});
    } else {
        em_options_set_int(o, "num_groups", 3);
        em_options_set_int(o, "num_channels", 6);
    }
    return o;
}

static const layer_case cases[] = {
    {"conv1d", "Conv1d", {"weight", "bias"}, 2 * 3},
    {"conv1d_same", "Conv1d", {"weight", NULL}, 3 * 4},
    {"convt", "ConvTranspose2d", {"weight", "bias"}, 3 * 3 * 2}, /* out / groups * kH * kW */
    {"gn", "GroupNorm", {"weight", "bias"}, 0},
};

static em_module *make(const layer_case *c) {
    em_options *o = options_of(c->name);
    em_module *m = em_module_new(c->cls, o);
    em_options_free(o);
    cr_assert(m, "%s: %s", c->name, em_last_error());
    return m;
}

static void expect_close(fixtures *fx, const char *name, const em_tensor *got) {
    fx_expect_close(fx, name, got, RTOL, ATOL);
}

static void state_path(const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/seq_layers/%s.safetensors", EM_TEST_FIXTURES, name);
}

Test(seq_layers, outputs_and_gradients_match_pytorch) {
    fixtures *fx = fx_open("seq_layers", "gen_seq_layers.py");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const layer_case *c = &cases[ci];
        em_scope_begin();
        em_module *m = make(c);
        char path[512], key[128];
        state_path(c->name, path, sizeof path);
        em_dict *sd = NULL;
        cr_assert_eq(em_load(path, NULL, &sd, NULL), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_module_load_state_dict(m, sd, true, NULL), EM_OK, "%s: %s", c->name,
                     em_last_error());
        em_dict_free(sd);
        snprintf(key, sizeof key, "%s.x", c->name);
        em_tensor *x = fx_tensor(fx, key);
        cr_assert_eq(em_requires_grad_(x, true), EM_OK);
        em_tensor *y = em_module_forward(m, x);
        snprintf(key, sizeof key, "%s.y", c->name);
        expect_close(fx, key, y);
        snprintf(key, sizeof key, "%s.r", c->name);
        cr_assert_eq(em_backward(em_sum(em_mul(y, fx_tensor(fx, key)), 0, NULL, false)), EM_OK,
                     "%s", em_last_error());
        snprintf(key, sizeof key, "%s.grad.x", c->name);
        expect_close(fx, key, em_tensor_grad(x));
        for (int p = 0; p < 2 && c->params[p]; p++) {
            snprintf(key, sizeof key, "%s.grad.%s", c->name, c->params[p]);
            expect_close(fx, key, em_tensor_grad(em_module_parameter(m, c->params[p])));
        }
        em_module_free(m);
        em_scope_end();
    }
    fx_close(fx);
}

Test(seq_layers, state_dicts_have_pytorchs_keys_and_initialisation) {
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const layer_case *c = &cases[ci];
        em_scope_begin();
        em_module *m = make(c);
        char path[512];
        state_path(c->name, path, sizeof path);
        em_dict *back, *torch;
        fx_state_dicts(m, path, c->name, &back, &torch);
        for (size_t i = 0; i < em_dict_len(torch); i++) {
            const char *k = em_dict_key(torch, i);
            em_tensor *b = em_dict_value(torch, i), *a = fx_state_entry(back, k, b, c->name);
            /* PyTorch's default initialisation. */
            double *v = fx_host_f64(a), mx = 0;
            int64_t n = em_tensor_numel(a);
            bool is_w = !strcmp(k, "weight");
            for (int64_t j = 0; j < n; j++) {
                if (c->fan_in == 0) {
                    cr_expect_eq(v[j], is_w ? 1.0 : 0.0, "%s: %s[%lld] = %g", c->name, k,
                                 (long long)j, v[j]);
                } else {
                    mx = fmax(mx, fabs(v[j]));
                }
            }
            free(v);
            if (c->fan_in > 0) {
                double bound = 1 / sqrt(c->fan_in);
                cr_expect(mx <= bound && mx > 0.5 * bound, "%s: %s spans %g; U(-%g, %g) expected",
                          c->name, k, mx, bound, bound);
            }
        }
        /* ... and PyTorch's file loads strictly into what Ember saved came from. */
        cr_assert_eq(em_module_load_state_dict(m, torch, true, NULL), EM_OK, "%s", em_last_error());
        em_dict_free(back), em_dict_free(torch);
        em_module_free(m);
        em_scope_end();
    }
}

Test(seq_layers, bad_options_and_inputs_are_named) {
    em_options *o = em_options_new();
    em_options_set_int(o, "num_groups", 4);
    em_options_set_int(o, "num_channels", 6);
    cr_assert_null(em_module_new("GroupNorm", o));
    em_assert_error(EM_ERR_INVALID, "num_groups=4 must divide num_channels=6");
    em_options_free(o);
    o = options_of("convt");
    em_options_set_ints(o, "output_padding", 2, (int64_t[]){2, 0});
    cr_assert_null(em_module_new("ConvTranspose2d", o));
    em_assert_error(EM_ERR_INVALID, "output_padding [2, 0] must be smaller than stride");
    em_options_free(o);
    o = options_of("gn");
    em_module *gn = em_module_new("GroupNorm", o);
    em_options_free(o);
    cr_assert(gn);
    em_scope_begin();
    cr_assert_null(em_module_forward(gn, em_zeros(3, (int64_t[]){2, 4, 3}, EM_F32, em_cpu())));
    em_assert_error(EM_ERR_SHAPE, "GroupNorm: expected an input (N, 6, ...), got [2, 4, 3]");
    em_scope_end();
    em_module_free(gn);
}
