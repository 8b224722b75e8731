/*
 * test_charlm_parity.c — issue 25's training parity of the character-level models: a tiny
 * LSTM language model (Embedding 20x16, LSTM 16->32, Linear 32->20) and a tiny Transformer
 * one (Embedding 20x32, LearnedPositionalEncoding, a causal post-norm TransformerEncoder of
 * 2 layers, d_model 32, 2 heads, feed-forward 64, dropout 0, Linear 32->20), trained 30 steps
 * with Adam and clip_grad_norm_ on 4 fixed batches of 4 windows of 16 tokens, end within
 * allclose(rtol 1e-4, atol 1e-5) of PyTorch 1.13's float32 run: every parameter after step
 * 30, the loss of every step and the gradient norm clip_grad_norm_ saw at every step.
 *
 * tests/fixtures/gen_charlm.py wrote tests/fixtures/charlm/ (its docstring has the details:
 * the models, the data, and its check that float64 and 1-ulp-off runs stay within a quarter
 * of the tolerance). Everything goes through the public API as a user would write it: the
 * layers are created by class name as children of a Sequential, the initial weights are
 * PyTorch's state dict loaded strictly from safetensors, the loss is the CrossEntropyLoss
 * module over the (B * L, V) logits (ember-train's flattening of (B, L, V) outputs), the
 * optimizer is em_optimizer_new("Adam"), the clipping em_clip_grad_norm_.
 *
 * The hyperparameters are the generator's CONFIG. The Transformer's Adam runs with eps 1e-4:
 * the gradient of the attention's key bias is zero in exact arithmetic (softmax does not see
 * a shift of every score of a row), so both frameworks' gradients there are rounding noise,
 * which Adam's default eps (1e-8) turns into lr-sized steps in random directions — PyTorch's
 * own float64 run then ends over 100 tolerances away from its float32 run. The clipping
 * thresholds (0.25, 0.82) are where half the steps clip, so that clipping is checked.
 */
#include "fixture_bin.h"

#define RTOL 1e-4
#define ATOL 1e-5
#define STEPS 30
#define N_BATCHES 4
#define V 20

TestSuite(charlm_parity, .init = em_test_setup, .fini = em_test_teardown, .timeout = 300);

typedef struct charlm_config {
    const char *net;
    double lr, eps, max_norm; /* gen_charlm.py's CONFIG */
} charlm_config;

static const charlm_config lstm_cfg = {"lstm", 0.01, 1e-8, 0.25};
static const charlm_config transformer_cfg = {"transformer", 0.003, 1e-4, 0.82};

static void append(em_module *seq, const char *cls, em_options *o) {
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    cr_assert(m, "%s: %s", cls, em_last_error());
    cr_assert_eq(em_module_append_child(seq, m), EM_OK, "%s", em_last_error());
}

static em_options *linear_opts(int64_t in, int64_t out) {
    em_options *o = em_options_new();
    em_options_set_int(o, "in_features", in);
    em_options_set_int(o, "out_features", out);
    return o;
}

static em_options *embedding_opts(int64_t dim) {
    em_options *o = em_options_new();
    em_options_set_int(o, "num_embeddings", V);
    em_options_set_int(o, "embedding_dim", dim);
    return o;
}

/* gen_charlm.py's make_<net>(). */
static em_module *build(const char *net) {
    em_module *seq = em_module_new("Sequential", NULL);
    cr_assert(seq, "Sequential: %s", em_last_error());
    em_options *o;
    if (strcmp(net, "lstm") == 0) {
        append(seq, "Embedding", embedding_opts(16));
        o = em_options_new();
        em_options_set_int(o, "input_size", 16);
        em_options_set_int(o, "hidden_size", 32);
        em_options_set_bool(o, "batch_first", true);
        append(seq, "LSTM", o);
        append(seq, "Linear", linear_opts(32, V));
    } else {
        cr_assert_str_eq(net, "transformer");
        append(seq, "Embedding", embedding_opts(32));
        o = em_options_new();
        em_options_set_int(o, "d_model", 32);
        em_options_set_int(o, "max_len", 16);
        em_options_set_bool(o, "batch_first", true);
        append(seq, "LearnedPositionalEncoding", o);
        o = em_options_new();
        em_options_set_int(o, "d_model", 32);
        em_options_set_int(o, "nhead", 2);
        em_options_set_int(o, "dim_feedforward", 64);
        em_options_set_float(o, "dropout", 0.0);
        em_options_set_int(o, "num_layers", 2);
        em_options_set_bool(o, "batch_first", true);
        em_options_set_bool(o, "causal", true);
        em_options_set_bool(o, "norm_first", false);
        append(seq, "TransformerEncoder", o);
        append(seq, "Linear", linear_opts(32, V));
    }
    em_module_train(seq, true);
    return seq;
}

/* ---- training and comparison ---------------------------------------------------------------- */

typedef struct outcome {
    double ratio;     /* the largest |diff| / tolerance over everything compared */
    char where[160];  /* the tensor it was in */
    int failures;
    char msg[2048];   /* the first failures */
} outcome;

static void compare(outcome *r, const char *what, const em_tensor *got, const em_tensor *want) {
    cr_assert_eq(em_tensor_ndim(got), em_tensor_ndim(want), "%s: %d dims, PyTorch %d", what,
                 em_tensor_ndim(got), em_tensor_ndim(want));
    for (int i = 0; i < em_tensor_ndim(want); i++)
        cr_assert_eq(em_tensor_size(got, i), em_tensor_size(want, i), "%s: dim %d", what, i);
    double *g = fx_host_f64(got), *w = fx_host_f64(want), ratio = 0;
    char msg[512];
    if (!fx_close_all(what, g, w, em_tensor_numel(want), RTOL, ATOL, msg, sizeof msg, &ratio)) {
        if (r->failures++ < 4) {
            size_t len = strlen(r->msg);
            snprintf(r->msg + len, sizeof r->msg - len, "\n  %s", msg);
        }
    }
    if (ratio > r->ratio || isnan(ratio)) {
        r->ratio = ratio;
        snprintf(r->where, sizeof r->where, "%s", what);
    }
    free(g), free(w);
}

/* Trains c->net from PyTorch's initial state dict for 30 steps (clipping only when clip) and
 * compares the losses, the gradient norms and the final state dict with "<net>.*". */
static outcome train_and_compare(fixtures *fx, const charlm_config *c, bool clip) {
    outcome r = {.ratio = 0};
    em_module *model = build(c->net);
    char path[512];
    snprintf(path, sizeof path, "%s/charlm/%s.safetensors", EM_TEST_FIXTURES, c->net);
    em_dict *init = NULL;
    cr_assert_eq(em_load(path, NULL, &init, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_module_load_state_dict(model, init, true, NULL), EM_OK, "%s: %s", c->net,
                 em_last_error());
    em_dict_free(init);

    em_module *ce = em_module_new("CrossEntropyLoss", NULL);
    cr_assert(ce, "%s", em_last_error());
    em_dict *params = em_module_named_parameters(model, true);
    cr_assert(params, "%s", em_last_error());
    em_options *o = em_options_new();
    em_options_set_float(o, "lr", c->lr);
    em_options_set_float(o, "eps", c->eps);
    em_optimizer *opt = em_optimizer_new("Adam", params, o);
    em_options_free(o);
    cr_assert(opt, "%s", em_last_error());

    float losses[STEPS], norms[STEPS];
    em_scope_begin();
    em_tensor *xs = fx_tensor(fx, "data.x"), *ys = fx_tensor(fx, "data.y");
    for (int step = 0; step < STEPS; step++) {
        em_scope_begin();
        em_optimizer_zero_grad(opt);
        em_tensor *x = em_select(xs, 0, step % N_BATCHES), *y = em_select(ys, 0, step % N_BATCHES);
        cr_assert(x && y, "%s", em_last_error());
        em_tensor *logits = em_module_forward(model, x); /* (B, L, V) */
        cr_assert(logits, "%s step %d forward: %s", c->net, step + 1, em_last_error());
        int64_t tokens = em_tensor_size(y, 0) * em_tensor_size(y, 1);
        em_tensor *pair[2] = {em_reshape(logits, 2, (int64_t[]){tokens, V}),
                              em_reshape(y, 1, (int64_t[]){tokens})};
        em_tensor *loss = em_module_forward_n(ce, pair, 2);
        cr_assert(loss, "%s step %d loss: %s", c->net, step + 1, em_last_error());
        cr_assert_eq(em_backward(loss), EM_OK, "%s step %d backward: %s", c->net, step + 1,
                     em_last_error());
        double norm = 0;
        cr_assert_eq(em_clip_grad_norm_(params, clip ? c->max_norm : INFINITY, 2.0, false, &norm),
                     EM_OK, "%s step %d clip: %s", c->net, step + 1, em_last_error());
        cr_assert_eq(em_optimizer_step(opt), EM_OK, "%s step %d: %s", c->net, step + 1,
                     em_last_error());
        losses[step] = (float)em_item(loss);
        norms[step] = (float)norm;
        em_scope_end();
    }
    em_scope_end();

    em_scope_begin();
    char name[192];
    snprintf(name, sizeof name, "%s.loss", c->net);
    compare(&r, name, em_from_data(losses, 1, (int64_t[]){STEPS}, EM_F32, em_cpu()),
            fx_tensor(fx, name));
    snprintf(name, sizeof name, "%s.norm", c->net);
    compare(&r, name, em_from_data(norms, 1, (int64_t[]){STEPS}, EM_F32, em_cpu()),
            fx_tensor(fx, name));
    em_dict *sd = em_module_state_dict(model);
    for (size_t i = 0; i < em_dict_len(sd); i++) {
        snprintf(name, sizeof name, "%s.final.%s", c->net, em_dict_key(sd, i));
        compare(&r, name, em_dict_value(sd, i), fx_tensor(fx, name));
    }
    /* The fixture has nothing the model lacks. */
    snprintf(name, sizeof name, "%s.final.", c->net);
    size_t expected = 0;
    for (int i = 0; i < fx->n; i++) expected += strncmp(fx->e[i].name, name, strlen(name)) == 0;
    cr_assert_eq(expected, em_dict_len(sd), "%s*: %zu fixture tensors, the model has %zu "
                 "state-dict entries", name, expected, em_dict_len(sd));
    em_dict_free(sd);
    em_scope_end();

    if (getenv("EMBER_PARITY_REPORT"))
        fprintf(stderr, "charlm parity %-11s clip %d: largest |diff|/tol %.3f (%s); loss %.5f -> "
                "%.5f\n", c->net, clip, r.ratio, r.where, losses[0], losses[STEPS - 1]);
    em_optimizer_free(opt);
    em_dict_free(params);
    em_module_free(ce);
    em_module_free(model);
    return r;
}

static void check(const charlm_config *c) {
    fixtures *fx = fx_open("charlm", "gen_charlm.py");
    outcome r = train_and_compare(fx, c, true);
    fx_close(fx);
    cr_assert_eq(r.failures, 0, "%s: %d tensors differ from PyTorch beyond allclose(rtol %g, "
                 "atol %g):%s", c->net, r.failures, RTOL, ATOL, r.msg);
}

Test(charlm_parity, lstm) { check(&lstm_cfg); }
Test(charlm_parity, transformer) { check(&transformer_cfg); }

/* The comparison can fail: the same runs without clipping (half the steps clip in the
 * reference), or with an lr 1% off, end outside the tolerance, and the message names the
 * tensor and its worst element. */
Test(charlm_parity, a_different_run_fails) {
    fixtures *fx = fx_open("charlm", "gen_charlm.py");
    const charlm_config *cfgs[2] = {&lstm_cfg, &transformer_cfg};
    for (int i = 0; i < 2; i++) {
        outcome r = train_and_compare(fx, cfgs[i], false);
        cr_assert_gt(r.failures, 0, "%s: training without clipping went unnoticed", cfgs[i]->net);
        cr_assert(strstr(r.msg, ".final.") && strstr(r.msg, "element "), "message: %s", r.msg);
        charlm_config off = *cfgs[i];
        off.lr *= 1.01;
        r = train_and_compare(fx, &off, true);
        cr_assert_gt(r.failures, 0, "%s: an lr 1%% off went unnoticed", cfgs[i]->net);
    }
    fx_close(fx);
}
