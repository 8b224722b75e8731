/*
 * test_layers_attn.c — MultiheadAttention, TransformerEncoder(Layer) and the positional
 * encodings against PyTorch (tests/fixtures/gen_attn_layers.py wrote
 * tests/fixtures/attn_layers/; the torch version is in its index.txt). Each layer loads
 * PyTorch's state dict strictly, and its output and the gradients of sum(y * r) for the inputs
 * and every parameter must be within allclose(rtol 1e-5, atol 1e-6) of PyTorch's in float32,
 * with key_padding_mask / attn_mask (bool and float) and causal masks. The data ABI's padding
 * mask (true = real) through em_module_forward_masked must act as the key_padding_mask that is
 * its negation. The other way: a fresh layer's state dict has exactly PyTorch's keys, shapes
 * and dtypes, with PyTorch's default initialisation. f64 gradchecks take every parameter
 * and the inputs through the public forward.
 */
#include <unistd.h>

#include "fixture_bin.h"

#define RTOL 1e-5
#define ATOL 1e-6

TestSuite(attn_layers, .init = em_test_setup, .fini = em_test_teardown);

typedef struct attn_case {
    const char *name, *cls;
    const char *inputs[5]; /* forward's inputs by fixture name; "-": an absent mask */
    const char *grads[3];  /* inputs with gradients */
} attn_case;

static const attn_case cases[] = {
    {"mha_kpm", "MultiheadAttention", {"x", "x", "x", "kpm", "-"}, {"x"}},
    {"mha_am", "MultiheadAttention", {"q", "k", "k", "-", "am"}, {"q", "k"}},
    {"mha_kv", "MultiheadAttention", {"q", "k", "v", "kpm", "am"}, {"q", "k", "v"}},
    {"enc_post", "TransformerEncoder", {"x", "-", "kpm"}, {"x"}},
    {"enc_pre", "TransformerEncoder", {"x", "am", "-"}, {"x"}},
    {"pe", "PositionalEncoding", {"x"}, {"x"}},
    {"lpe", "LearnedPositionalEncoding", {"x"}, {"x"}},
};

/* The options PyTorch's modules had (gen_attn_layers.py). */
static em_options *options_of(const char *name) {
    em_options *o = em_options_new();
    if (!strncmp(name, "mha", 3)) {
        em_options_set_int(o, "embed_dim", 8);
        em_options_set_int(o, "num_heads", strcmp(name, "mha_kv") ? 2 : 4);
        em_options_set_bool(o, "batch_first", strcmp(name, "mha_am") != 0);
        if (!strcmp(name, "mha_kv")) {
            em_options_set_int(o, "kdim", 6);
            em_options_set_int(o, "vdim", 5);
        }
    } else if (!strncmp(name, "enc", 3)) {
        bool pre = !strcmp(name, "enc_pre");
        em_options_set_int(o, "d_model", 8);
        em_options_set_int(o, "nhead", 2);
        em_options_set_int(o, "dim_feedforward", 16);
        em_options_set_float(o, "dropout", 0.0);
        em_options_set_int(o, "num_layers", 2);
        em_options_set_bool(o, "batch_first", !pre);
        em_options_set_bool(o, "causal", !pre);
        em_options_set_bool(o, "norm_first", pre);
        em_options_set_bool(o, "norm", pre);
        if (pre) em_options_set_string(o, "activation", "gelu");
    } else {
        em_options_set_int(o, "d_model", 8);
        em_options_set_float(o, "dropout", 0.0);
        em_options_set_int(o, "max_len", 40);
        em_options_set_bool(o, "batch_first", !strcmp(name, "lpe"));
    }
    return o;
}

static em_module *make(const attn_case *c) {
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
    snprintf(buf, cap, "%s/attn_layers/%s.safetensors", EM_TEST_FIXTURES, name);
}

static void load_torch(em_module *m, const char *name) {
    char path[512];
    state_path(name, path, sizeof path);
    em_dict *sd = NULL;
    cr_assert_eq(em_load(path, NULL, &sd, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_module_load_state_dict(m, sd, true, NULL), EM_OK, "%s: %s", name,
                 em_last_error());
    em_dict_free(sd);
}

/* Fixture input `in` of case c: leaves that require grad for the differentiated inputs
 * (one tensor per name, so self-attention sees q == k == v), bool masks from their 0/1. */
static em_tensor *input_of(fixtures *fx, const attn_case *c, const char *in, em_tensor **seen,
                           const char **seen_names, int *n_seen) {
    if (!strcmp(in, "-")) return em_empty(1, (int64_t[]){0}, EM_F32, em_cpu());
    for (int i = 0; i < *n_seen; i++)
        if (!strcmp(seen_names[i], in)) return seen[i];
    char key[128];
    snprintf(key, sizeof key, "%s.%s", c->name, in);
    em_tensor *t = fx_tensor(fx, key);
    bool grad = false;
    for (int g = 0; g < 3 && c->grads[g]; g++) grad |= !strcmp(c->grads[g], in);
    if (grad) cr_assert_eq(em_requires_grad_(t, true), EM_OK);
    else if (strcmp(in, "am") || strcmp(c->name, "mha_kv")) t = em_to_dtype(t, EM_BOOL);
    seen[*n_seen] = t, seen_names[(*n_seen)++] = in;
    return t;
}

static int n_inputs_of(const attn_case *c) {
    int n = 0;
    while (n < 5 && c->inputs[n]) n++;
    return n;
}

Test(attn_layers, outputs_and_gradients_match_pytorch) {
    fixtures *fx = fx_open("attn_layers", "gen_attn_layers.py");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const attn_case *c = &cases[ci];
        em_scope_begin();
        em_module *m = make(c);
        /* PositionalEncoding's buffer is its own (no parameters to load): the output checks
         * Ember's sinusoids; the state-dict test loads PyTorch's. */
        if (strcmp(c->name, "pe")) load_torch(m, c->name);
        em_tensor *seen[5], *in[5];
        const char *seen_names[5];
        int n_seen = 0, n = n_inputs_of(c);
        for (int i = 0; i < n; i++) in[i] = input_of(fx, c, c->inputs[i], seen, seen_names, &n_seen);
        em_tensor *y = em_module_forward_n(m, in, n);
        char key[160];
        snprintf(key, sizeof key, "%s.y", c->name);
        expect_close(fx, key, y);
        snprintf(key, sizeof key, "%s.r", c->name);
        cr_assert_eq(em_backward(em_sum(em_mul(y, fx_tensor(fx, key)), 0, NULL, false)), EM_OK,
                     "%s", em_last_error());
        for (int i = 0; i < n_seen; i++) {
            snprintf(key, sizeof key, "%s.grad.%s", c->name, seen_names[i]);
            if (fx_lookup(fx, key)) expect_close(fx, key, em_tensor_grad(seen[i]));
        }
        /* Every parameter's gradient, by its state-dict name, and PyTorch has no other. */
        em_dict *ps = em_module_named_parameters(m, false);
        for (size_t i = 0; i < em_dict_len(ps); i++) {
            snprintf(key, sizeof key, "%s.grad.%s", c->name, em_dict_key(ps, i));
            cr_assert(fx_lookup(fx, key), "%s: PyTorch has no parameter %s", c->name,
                      em_dict_key(ps, i));
            expect_close(fx, key, em_tensor_grad(em_dict_value(ps, i)));
        }
        size_t torch_params = 0, prefix = strlen(c->name) + strlen(".grad.");
        for (int i = 0; i < fx->n; i++) {
            const char *e = fx->e[i].name;
            if (!strncmp(e, c->name, strlen(c->name)) && !strncmp(e + strlen(c->name), ".grad.", 6)) {
                bool is_input = false;
                for (int s = 0; s < n_seen; s++) is_input |= !strcmp(e + prefix, seen_names[s]);
                torch_params += !is_input;
            }
        }
        cr_assert_eq(em_dict_len(ps), torch_params, "%s: %zu parameters, PyTorch %zu", c->name,
                     em_dict_len(ps), torch_params);
        em_dict_free(ps);
        em_module_free(m);
        em_scope_end();
    }
    fx_close(fx);
}

/* The batch's padding mask (true = real) through em_module_forward_masked masks the same
 * keys as PyTorch's key_padding_mask (true = ignore), reaching MultiheadAttention inside the
 * encoder too; both given, a key ignored by either is ignored. */
Test(attn_layers, the_data_mask_is_a_negated_key_padding_mask) {
    fixtures *fx = fx_open("attn_layers", "gen_attn_layers.py");
    const attn_case *cs[2] = {&cases[0], &cases[3]};
    for (int ci = 0; ci < 2; ci++) {
        const attn_case *c = cs[ci];
        em_scope_begin();
        em_module *m = make(c);
        load_torch(m, c->name);
        char key[160];
        snprintf(key, sizeof key, "%s.x", c->name);
        em_tensor *x = fx_tensor(fx, key);
        snprintf(key, sizeof key, "%s.kpm", c->name);
        em_tensor *kpm = em_to_dtype(fx_tensor(fx, key), EM_BOOL);
        em_tensor *valid = em_logical_not(kpm);
        snprintf(key, sizeof key, "%s.y", c->name);
        expect_close(fx, key, em_module_forward_masked(m, &x, 1, valid));
        /* with an explicit mask that ignores nothing more */
        em_tensor *none = em_zeros(2, em_tensor_shape(kpm), EM_BOOL, em_cpu());
        em_tensor *in[5] = {x, x, x, none, em_empty(1, (int64_t[]){0}, EM_F32, em_cpu())};
        em_tensor *in_enc[3] = {x, in[4], none};
        expect_close(fx, key, ci == 0 ? em_module_forward_masked(m, in, 5, valid)
                                      : em_module_forward_masked(m, in_enc, 3, valid));
        /* and without any mask the output differs (the test can fail) */
        em_tensor *plain = em_module_forward(m, x);
        cr_assert(plain);
        double *a = fx_host_f64(plain), *b = fx_host_f64(fx_tensor(fx, key)), dmax = 0;
        for (int64_t i = 0; i < em_tensor_numel(plain); i++) dmax = fmax(dmax, fabs(a[i] - b[i]));
        free(a), free(b);
        cr_assert_gt(dmax, 1e-3, "%s: the mask changed nothing", c->name);
        em_module_free(m);
        em_scope_end();
    }
    fx_close(fx);
}

Test(attn_layers, state_dicts_have_pytorchs_keys_and_initialisation) {
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const attn_case *c = &cases[ci];
        em_scope_begin();
        em_module *m = make(c);
        char path[512];
        state_path(c->name, path, sizeof path);
        em_dict *back, *torch;
        fx_state_dicts(m, path, c->name, &back, &torch);
        for (size_t i = 0; i < em_dict_len(torch); i++) {
            const char *k = em_dict_key(torch, i);
            em_tensor *b = em_dict_value(torch, i), *a = fx_state_entry(back, k, b, c->name);
            /* PyTorch's default initialisation: the bound a weight's values reach (uniform:
             * most of it), or exact ones and zeros. */
            double *v = fx_host_f64(a), mx = 0, lo = INFINITY, hi = -INFINITY;
            int64_t n = em_tensor_numel(a);
            for (int64_t j = 0; j < n; j++) mx = fmax(mx, fabs(v[j])), lo = fmin(lo, v[j]),
                                             hi = fmax(hi, v[j]);
            const char *leaf = strrchr(k, '.') ? strrchr(k, '.') + 1 : k;
            double bound = -1; /* -1: exact values checked below */
            int64_t d0 = em_tensor_size(a, 0), d1 = em_tensor_ndim(a) > 1 ? em_tensor_size(a, 1) : 0;
            if (strstr(k, "proj_weight")) bound = sqrt(6.0 / (double)(d0 + d1)); /* xavier */
            else if (!strcmp(leaf, "weight") && em_tensor_ndim(a) == 2 && strcmp(c->name, "lpe"))
                bound = 1 / sqrt((double)d1); /* Linear's kaiming_uniform(a = sqrt 5) */
            else if (!strcmp(leaf, "bias") && !strstr(k, "norm") && !strstr(k, "proj"))
                bound = 1 / sqrt((double)(strstr(k, "linear1") ? 8 : 16)); /* Linear's bias */
            if (!strcmp(c->name, "lpe")) {
                double mean = 0, var = 0; /* N(0, 1) */
                for (int64_t j = 0; j < n; j++) mean += v[j] / n;
                for (int64_t j = 0; j < n; j++) var += (v[j] - mean) * (v[j] - mean) / n;
                cr_expect(fabs(mean) < 0.2 && fabs(var - 1) < 0.25, "lpe: weight mean %g var %g",
                          mean, var);
            } else if (!strcmp(c->name, "pe")) {
                /* the sinusoids against double precision: pe[pos, 0, 2i (+1)] = sin (cos) of
                 * pos / 10000^(2i/8), within float32 rounding of the argument */
                for (int64_t j = 0; j < n; j++) {
                    int64_t pos = j / 8, e = j % 8;
                    double ang = pos * exp(-(double)(e - e % 2) * log(10000.0) / 8);
                    double want = e % 2 ? cos(ang) : sin(ang);
                    cr_expect(fabs(v[j] - want) <= 1e-6 + 4e-7 * ang, "pe[%lld] = %.9g, not %.9g",
                              (long long)j, v[j], want);
                }
            } else if (bound > 0) {
                cr_expect(mx <= bound && mx > 0.5 * bound && lo < 0 && hi > 0,
                          "%s: %s spans [%g, %g]; U(-%g, %g) expected", c->name, k, lo, hi,
                          bound, bound);
            } else {
                double want = strstr(k, "norm") && !strcmp(leaf, "weight") ? 1.0 : 0.0;
                cr_expect(lo == want && hi == want, "%s: %s spans [%g, %g]; all %g expected",
                          c->name, k, lo, hi, want);
            }
            free(v);
        }
        /* ... and PyTorch's file loads strictly into what Ember saved came from. */
        cr_assert_eq(em_module_load_state_dict(m, torch, true, NULL), EM_OK, "%s", em_last_error());
        em_dict_free(back), em_dict_free(torch);
        em_module_free(m);
        em_scope_end();
    }
}

/* ---- f64 gradchecks through the public forward ---------------------------------------------- */

typedef struct gc_ctx {
    em_module *m;
    int n_in;        /* forward's inputs: inputs[0 .. n_in) */
    em_tensor *extra[3]; /* masks appended after them */
    int n_extra;
} gc_ctx;

/* inputs = the forward's differentiated inputs, then every parameter (perturbed in place, so
 * the module sees the change). */
static em_tensor *gc_fn(em_tensor *const *inputs, int n, void *user) {
    (void)n;
    gc_ctx *g = user;
    em_tensor *in[6];
    for (int i = 0; i < g->n_in; i++) in[i] = inputs[i];
    for (int i = 0; i < g->n_extra; i++) in[g->n_in + i] = g->extra[i];
    return em_module_forward_n(g->m, in, g->n_in + g->n_extra);
}

static void gradcheck_module(em_module *m, int n_in, em_tensor **x, int n_extra,
                             em_tensor **extra) {
    cr_assert_eq(em_module_to_dtype(m, EM_F64), EM_OK, "%s", em_last_error());
    em_dict *ps = em_module_named_parameters(m, false);
    int np = (int)em_dict_len(ps);
    em_tensor **all = calloc((size_t)(n_in + np), sizeof *all);
    for (int i = 0; i < n_in; i++) all[i] = x[i];
    for (int i = 0; i < np; i++) all[n_in + i] = em_dict_value(ps, (size_t)i);
    gc_ctx g = {.m = m, .n_in = n_in, .n_extra = n_extra};
    for (int i = 0; i < n_extra; i++) g.extra[i] = extra[i];
    cr_assert_eq(em_gradcheck(gc_fn, n_in + np, all, &g, 1e-6, 1e-5, 1e-3), EM_OK, "%s: %s",
                 em_module_class_of(m)->name, em_last_error());
    free(all);
    em_dict_free(ps);
}

static em_tensor *rand_f64(int nd, const int64_t *shape, bool grad) {
    em_tensor *t = em_empty(nd, shape, EM_F64, em_cpu());
    cr_assert_eq(em_normal_(t, 0, 1, NULL), EM_OK);
    if (grad) cr_assert_eq(em_requires_grad_(t, true), EM_OK);
    return t;
}

Test(attn_layers, gradcheck_multihead_attention) {
    em_seed(7);
    em_scope_begin();
    em_options *o = options_of("mha_kv"); /* kdim 6, vdim 5, 4 heads of 2, batch first */
    em_module *m = em_module_new("MultiheadAttention", o);
    em_options_free(o);
    cr_assert(m, "%s", em_last_error());
    em_tensor *x[3] = {rand_f64(3, (int64_t[]){2, 3, 8}, true),
                       rand_f64(3, (int64_t[]){2, 4, 6}, true),
                       rand_f64(3, (int64_t[]){2, 4, 5}, true)};
    bool pad[8] = {0, 0, 0, 0, 0, 0, 1, 1}; /* the second sequence has 2 keys */
    em_tensor *kpm = em_from_data(pad, 2, (int64_t[]){2, 4}, EM_BOOL, em_cpu());
    em_tensor *extra[2] = {kpm, rand_f64(2, (int64_t[]){3, 4}, false)};
    gradcheck_module(m, 3, x, 2, extra);
    em_module_free(m);
    em_scope_end();
}

Test(attn_layers, gradcheck_transformer_encoder) {
    em_seed(8);
    for (int pre = 0; pre < 2; pre++) {
        em_scope_begin();
        em_options *o = options_of(pre ? "enc_pre" : "enc_post");
        em_options_set_int(o, "dim_feedforward", 6);
        em_module *m = em_module_new("TransformerEncoder", o);
        em_options_free(o);
        cr_assert(m, "%s", em_last_error());
        em_tensor *x = rand_f64(3, (int64_t[]){3, 2, 8}, true); /* (L, B) or (B, L) */
        gradcheck_module(m, 1, &x, 0, NULL);
        em_module_free(m);
        em_scope_end();
    }
}

Test(attn_layers, gradcheck_positional_encodings) {
    em_seed(9);
    const char *names[2] = {"pe", "lpe"}, *cls[2] = {"PositionalEncoding",
                                                     "LearnedPositionalEncoding"};
    for (int i = 0; i < 2; i++) {
        em_scope_begin();
        em_options *o = options_of(names[i]);
        em_module *m = em_module_new(cls[i], o);
        em_options_free(o);
        cr_assert(m, "%s", em_last_error());
        em_tensor *x = rand_f64(3, (int64_t[]){3, 2, 8}, true);
        gradcheck_module(m, 1, &x, 0, NULL);
        em_module_free(m);
        em_scope_end();
    }
}

/* Causal self-attention: an output row depends on no later position. */
Test(attn_layers, causal_outputs_ignore_later_positions) {
    em_seed(10);
    em_scope_begin();
    em_options *o = options_of("enc_post");
    em_module *m = em_module_new("TransformerEncoder", o);
    em_options_free(o);
    cr_assert(m, "%s", em_last_error());
    em_tensor *x = em_empty(3, (int64_t[]){2, 6, 8}, EM_F32, em_cpu());
    em_normal_(x, 0, 1, NULL);
    em_tensor *y = em_module_forward(m, x);
    em_tensor *x2 = em_clone(x);
    em_fill_(em_narrow(x2, 1, 4, 2), 3.0); /* change positions 4 and 5 */
    em_tensor *y2 = em_module_forward(m, x2);
    cr_assert(y && y2, "%s", em_last_error());
    double *a = fx_host_f64(y), *b = fx_host_f64(y2);
    for (int64_t i = 0; i < 2 * 6 * 8; i++) {
        int64_t pos = i / 8 % 6;
        if (pos < 4) cr_expect_eq(a[i], b[i], "position %lld changed", (long long)pos);
        else cr_expect_neq(a[i], b[i], "position %lld did not change", (long long)pos);
    }
    free(a), free(b);
    em_module_free(m);
    em_scope_end();
}

/* An unbatched (L, E) query, as PyTorch's, is batch 1 without its batch dim; bias=false has
 * no in_proj_bias and no out_proj.bias. */
Test(attn_layers, unbatched_inputs_and_no_bias) {
    em_seed(11);
    for (int bias = 0; bias < 2; bias++) {
        em_scope_begin();
        em_options *o = options_of("mha_am"); /* seq first */
        em_options_set_bool(o, "bias", bias);
        em_module *m = em_module_new("MultiheadAttention", o);
        em_options_free(o);
        cr_assert(m, "%s", em_last_error());
        cr_assert_eq(em_module_parameter(m, "in_proj_bias") != NULL, bias);
        cr_assert_eq(em_module_parameter(em_module_child(m, "out_proj"), "bias") != NULL, bias);
        em_tensor *q = em_empty(2, (int64_t[]){4, 8}, EM_F32, em_cpu()),
                  *k = em_empty(2, (int64_t[]){6, 8}, EM_F32, em_cpu());
        em_normal_(q, 0, 1, NULL), em_normal_(k, 0, 1, NULL);
        em_tensor *y = em_module_forward_n(m, (em_tensor *const[]){q, k, k}, 3);
        em_tensor *yb = em_module_forward_n(m, (em_tensor *const[]){em_unsqueeze(q, 1),
                                                                    em_unsqueeze(k, 1),
                                                                    em_unsqueeze(k, 1)}, 3);
        cr_assert(y && yb, "%s", em_last_error());
        cr_assert_eq(em_tensor_ndim(y), 2);
        double *a = fx_host_f64(y), *b = fx_host_f64(yb);
        for (int64_t i = 0; i < 4 * 8; i++) cr_expect_eq(a[i], b[i], "element %lld", (long long)i);
        free(a), free(b);
        em_module_free(m);
        em_scope_end();
    }
}

Test(attn_layers, bad_options_and_inputs_are_named) {
    em_options *o = em_options_new();
    em_options_set_int(o, "embed_dim", 6);
    em_options_set_int(o, "num_heads", 4);
    cr_assert_null(em_module_new("MultiheadAttention", o));
    em_assert_error(EM_ERR_INVALID, "embed_dim=6 must be divisible by num_heads=4");
    em_options_free(o);
    o = options_of("mha_kpm");
    em_module *m = em_module_new("MultiheadAttention", o);
    em_options_free(o);
    cr_assert(m);
    em_scope_begin();
    em_tensor *x = em_zeros(3, (int64_t[]){2, 5, 8}, EM_F32, em_cpu());
    em_tensor *kpm = em_zeros(2, (int64_t[]){2, 4}, EM_BOOL, em_cpu());
    em_tensor *none = em_empty(1, (int64_t[]){0}, EM_F32, em_cpu());
    cr_assert_null(em_module_forward_n(m, (em_tensor *const[]){x, x, x, kpm, none}, 5));
    em_assert_error(EM_ERR_SHAPE, "key_padding_mask [2, 4] must be (B, S) = [2, 5]");
    cr_assert_null(em_module_forward_n(m, (em_tensor *const[]){x, x, x, none, kpm}, 5));
    em_assert_error(EM_ERR_SHAPE, "attn_mask [2, 4] must be (L, S) = [5, 5]");
    cr_assert_null(em_module_forward_masked(m, &x, 1, kpm));
    em_assert_error(EM_ERR_SHAPE, "the batch's padding mask [2, 4]");
    cr_assert_null(em_module_forward_n(m, (em_tensor *const[]){x, x, x, x}, 4));
    em_assert_error(EM_ERR_INVALID, "got 4 inputs");
    cr_assert_null(em_module_forward(m, em_zeros(3, (int64_t[]){2, 5, 7}, EM_F32, em_cpu())));
    em_assert_error(EM_ERR_SHAPE, "expected (B, L, 8)");
    em_scope_end();
    em_module_free(m);
    o = options_of("lpe");
    m = em_module_new("LearnedPositionalEncoding", o);
    em_options_free(o);
    em_scope_begin();
    cr_assert_null(em_module_forward(m, em_zeros(3, (int64_t[]){1, 41, 8}, EM_F32, em_cpu())));
    em_assert_error(EM_ERR_SHAPE, "has 41 positions but max_len is 40");
    em_scope_end();
    em_module_free(m);
}
