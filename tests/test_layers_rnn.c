/*
 * test_layers_rnn.c — the recurrent layers of issue 25 (LSTM, GRU, LSTMCell, GRUCell) against
 * PyTorch 1.13 (tests/fixtures/gen_rnn_layers.py wrote tests/fixtures/rnn_layers/): each layer
 * loads PyTorch's state dict strictly, and its output, final states and the gradients of
 * sum(y r) + sum(h_n rh) (+ sum(c_n rc)) for the input, the initial states and every parameter
 * are within allclose(rtol 1e-5, atol 1e-6) of PyTorch's in float32 — 2 layers, bidirectional,
 * batch_first, initial states, variable lengths through em_module_forward_masked (PyTorch's
 * packed sequences). Each output is one module's option (output: sequence, h_n, c_n), so the
 * test runs one module per output over the same state dict and adds up their parameter
 * gradients. The other way: a fresh layer's state dict, saved and read back, has exactly
 * PyTorch's keys, shapes and dtypes, and PyTorch's U(-1/sqrt(hidden), 1/sqrt(hidden)).
 * Then f64 finite differences through the public forward (the cells too), ember-train on
 * examples/digits-lstm.yaml, and the errors.
 */
#include <unistd.h>

#include "fixture_bin.h"

#define RTOL 1e-5
#define ATOL 1e-6

TestSuite(rnn_layers, .init = em_test_setup, .fini = em_test_teardown);

typedef struct rnn_layer_case {
    const char *name, *cls;
    int64_t I, H, L;
    bool bidir, batch_first, bias;
    const int64_t *lengths; /* (N) or NULL */
    int64_t N, T;
} rnn_layer_case;

static const int64_t lstm_len[3] = {5, 2, 4}, gru_len[3] = {4, 1, 3};

static const rnn_layer_case cases[] = {
    {"lstm", "LSTM", 5, 6, 2, true, true, true, NULL, 3, 4},
    {"lstm_len", "LSTM", 5, 6, 2, true, true, true, lstm_len, 3, 5},
    {"gru", "GRU", 4, 5, 2, false, false, true, NULL, 2, 6},
    {"gru_len", "GRU", 4, 3, 1, true, true, false, gru_len, 3, 4},
    {"lstmcell", "LSTMCell", 4, 5, 1, false, false, true, NULL, 3, 1},
    {"grucell", "GRUCell", 4, 5, 1, false, false, true, NULL, 3, 1},
};

static bool is_cell(const rnn_layer_case *c) { return strstr(c->cls, "Cell") != NULL; }
static bool is_lstm(const rnn_layer_case *c) { return c->cls[0] == 'L'; }

static em_module *make(const rnn_layer_case *c, const char *output) {
    em_options *o = em_options_new();
    em_options_set_int(o, "input_size", c->I);
    em_options_set_int(o, "hidden_size", c->H);
    em_options_set_bool(o, "bias", c->bias);
    if (!is_cell(c)) {
        em_options_set_int(o, "num_layers", c->L);
        em_options_set_bool(o, "bidirectional", c->bidir);
        em_options_set_bool(o, "batch_first", c->batch_first);
    }
    if (output) em_options_set_string(o, "output", output);
    em_module *m = em_module_new(c->cls, o);
    em_options_free(o);
    cr_assert(m, "%s: %s", c->name, em_last_error());
    return m;
}

static void expect_close(fixtures *fx, const char *name, const em_tensor *got) {
    fx_expect_close(fx, name, got, RTOL, ATOL);
}

static void state_path(const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/rnn_layers/%s.safetensors", EM_TEST_FIXTURES, name);
}

static void load_torch(const rnn_layer_case *c, em_module *m) {
    char path[512];
    state_path(c->name, path, sizeof path);
    em_dict *sd = NULL;
    cr_assert_eq(em_load(path, NULL, &sd, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_module_load_state_dict(m, sd, true, NULL), EM_OK, "%s: %s", c->name,
                 em_last_error());
    em_dict_free(sd);
}

/* The padding mask (N, T) of the case's lengths, or NULL. */
static em_tensor *mask_of(const rnn_layer_case *c) {
    if (!c->lengths) return NULL;
    double *v = malloc(sizeof(double) * (size_t)(c->N * c->T));
    for (int64_t b = 0; b < c->N; b++)
        for (int64_t t = 0; t < c->T; t++) v[b * c->T + t] = t < c->lengths[b];
    em_tensor *m = em_test_tensor(EM_BOOL, 2, (int64_t[]){c->N, c->T}, v);
    free(v);
    return m;
}

Test(rnn_layers, outputs_states_and_gradients_match_pytorch) {
    fixtures *fx = fx_open("rnn_layers", "gen_rnn_layers.py");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const rnn_layer_case *c = &cases[ci];
        em_scope_begin();
        char key[128];
        /* The outputs in PyTorch's reduction: y, "hn", "cn" (the cells: h' and, for
         * LSTMCell, c' as its "hn"). */
        const char *outs[3], *fx_out[3] = {"y", "hn", "cn"};
        int n_out;
        if (is_cell(c)) {
            outs[0] = is_lstm(c) ? "h" : NULL, outs[1] = "c";
            n_out = is_lstm(c) ? 2 : 1;
        } else {
            outs[0] = "sequence", outs[1] = "h_n", outs[2] = "c_n";
            n_out = is_lstm(c) ? 3 : 2;
        }
        em_module *ms[3];
        for (int k = 0; k < n_out; k++) {
            ms[k] = make(c, outs[k]);
            load_torch(c, ms[k]);
        }
        em_tensor *in[3];
        int n_in = 1;
        snprintf(key, sizeof key, "%s.x", c->name);
        in[0] = fx_tensor(fx, key);
        snprintf(key, sizeof key, "%s.h0", c->name);
        if (fx_lookup(fx, key)) in[n_in++] = fx_tensor(fx, key);
        snprintf(key, sizeof key, "%s.c0", c->name);
        if (fx_lookup(fx, key)) in[n_in++] = fx_tensor(fx, key);
        for (int i = 0; i < n_in; i++) cr_assert_eq(em_requires_grad_(in[i], true), EM_OK);
        em_tensor *mask = mask_of(c), *loss = NULL;
        static const char *const rs[3] = {"r", "rh", "rc"};
        for (int k = 0; k < n_out; k++) {
            em_tensor *y = em_module_forward_masked(ms[k], in, n_in, mask);
            snprintf(key, sizeof key, "%s.%s", c->name, fx_out[k]);
            expect_close(fx, key, y);
            snprintf(key, sizeof key, "%s.%s", c->name, rs[k]);
            em_tensor *l = em_sum(em_mul(y, fx_tensor(fx, key)), 0, NULL, false);
            loss = loss ? em_add(loss, l) : l;
        }
        cr_assert_eq(em_backward(loss), EM_OK, "%s: %s", c->name, em_last_error());
        static const char *const in_names[3] = {"x", "h0", "c0"};
        for (int i = 0; i < n_in; i++) {
            snprintf(key, sizeof key, "%s.grad.%s", c->name, in_names[i]);
            expect_close(fx, key, em_tensor_grad(in[i]));
        }
        em_dict *params = em_module_named_parameters(ms[0], false);
        for (size_t p = 0; p < em_dict_len(params); p++) {
            const char *pn = em_dict_key(params, p);
            em_tensor *g = NULL;
            for (int k = 0; k < n_out; k++) {
                em_tensor *gk = em_tensor_grad(em_module_parameter(ms[k], pn));
                cr_assert(gk, "%s: %s has no gradient (output %s)", c->name, pn, outs[k]);
                g = g ? em_add(g, gk) : gk;
            }
            snprintf(key, sizeof key, "%s.grad.%s", c->name, pn);
            expect_close(fx, key, g);
        }
        em_dict_free(params);
        for (int k = 0; k < n_out; k++) em_module_free(ms[k]);
        em_scope_end();
    }
    fx_close(fx);
}

Test(rnn_layers, state_dicts_have_pytorchs_keys_and_initialisation) {
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const rnn_layer_case *c = &cases[ci];
        em_scope_begin();
        em_module *m = make(c, NULL);
        char path[512];
        state_path(c->name, path, sizeof path);
        em_dict *back, *torch;
        fx_state_dicts(m, path, c->name, &back, &torch);
        double bound = 1 / sqrt((double)c->H);
        for (size_t i = 0; i < em_dict_len(torch); i++) {
            const char *k = em_dict_key(torch, i);
            em_tensor *b = em_dict_value(torch, i), *a = fx_state_entry(back, k, b, c->name);
            double *v = fx_host_f64(a), mx = 0;
            for (int64_t j = 0; j < em_tensor_numel(a); j++) mx = fmax(mx, fabs(v[j]));
            free(v);
            cr_expect(mx <= bound && mx > 0.5 * bound, "%s: %s spans %g; U(-%g, %g) expected",
                      c->name, k, mx, bound, bound);
        }
        cr_assert_eq(em_module_load_state_dict(m, torch, true, NULL), EM_OK, "%s", em_last_error());
        em_dict_free(back), em_dict_free(torch);
        em_module_free(m);
        em_scope_end();
    }
}

/* A GRU or LSTM in f64 (its parameters converted) as a function of x and h0 (and its
 * parameters, through the module): finite differences through the public forward, with
 * dropout off, 2 layers, both directions and lengths. */
typedef struct gc_layer {
    em_module *m;
    const em_tensor *mask;
} gc_layer;

static em_tensor *layer_fn(em_tensor *const *in, int n, void *user) {
    const gc_layer *u = user;
    return em_module_forward_masked(u->m, in, n, u->mask);
}

Test(rnn_layers, gradients_match_finite_differences) {
    static const rnn_layer_case gc[] = {
        {"lstm", "LSTM", 3, 2, 2, true, false, true, lstm_len, 3, 5},
        {"gru", "GRU", 3, 2, 2, true, true, true, gru_len, 3, 4},
    };
    for (size_t ci = 0; ci < 2; ci++) {
        const rnn_layer_case *c = &gc[ci];
        em_scope_begin();
        em_module *m = make(c, "sequence");
        cr_assert_eq(em_module_to_dtype(m, EM_F64), EM_OK, "%s", em_last_error());
        int64_t xs[3] = {c->batch_first ? c->N : c->T, c->batch_first ? c->T : c->N, c->I};
        double xv[64], hv[32];
        em_test_fill_random(xv, xs[0] * xs[1] * xs[2], 3);
        em_test_fill_random(hv, 4 * c->N * c->H, 4);
        em_tensor *t[2] = {em_test_tensor(EM_F64, 3, xs, xv),
                           em_test_tensor(EM_F64, 3, (int64_t[]){4, c->N, c->H}, hv)};
        for (int i = 0; i < 2; i++) cr_assert_eq(em_requires_grad_(t[i], true), EM_OK);
        gc_layer u = {.m = m, .mask = mask_of(c)};
        cr_assert_eq(em_gradcheck(layer_fn, 2, t, &u, 0, 0, 0), EM_OK, "%s: %s", c->name,
                     em_last_error());
        em_module_free(m);
        em_scope_end();
    }
}

Test(rnn_layers, cell_gradients_match_finite_differences) {
    static const rnn_layer_case gc[] = {
        {"lstmcell", "LSTMCell", 3, 4, 1, false, false, true, NULL, 2, 1},
        {"grucell", "GRUCell", 3, 4, 1, false, false, false, NULL, 2, 1},
    };
    for (size_t ci = 0; ci < 2; ci++) {
        const rnn_layer_case *c = &gc[ci];
        for (int out = 0; out < (is_lstm(c) ? 2 : 1); out++) {
            em_scope_begin();
            em_module *m = make(c, is_lstm(c) ? (out ? "c" : "h") : NULL);
            cr_assert_eq(em_module_to_dtype(m, EM_F64), EM_OK, "%s", em_last_error());
            double v[3][8];
            for (int i = 0; i < 3; i++) em_test_fill_random(v[i], 8, 10 + (uint64_t)i);
            em_tensor *t[3] = {em_test_tensor(EM_F64, 2, (int64_t[]){c->N, c->I}, v[0]),
                               em_test_tensor(EM_F64, 2, (int64_t[]){c->N, c->H}, v[1]),
                               em_test_tensor(EM_F64, 2, (int64_t[]){c->N, c->H}, v[2])};
            int n = is_lstm(c) ? 3 : 2;
            for (int i = 0; i < n; i++) cr_assert_eq(em_requires_grad_(t[i], true), EM_OK);
            gc_layer u = {.m = m, .mask = NULL};
            cr_assert_eq(em_gradcheck(layer_fn, n, t, &u, 0, 0, 0), EM_OK, "%s (%d): %s",
                         c->name, out, em_last_error());
            em_module_free(m);
            em_scope_end();
        }
    }
}

/* Dropout between layers: in training the first layer's output is dropped (the result moves
 * off the dropout-free layer's with the same weights), in evaluation it is not (the same bits). */
Test(rnn_layers, dropout_between_layers_in_training_only) {
    em_scope_begin();
    em_options *o = em_options_new();
    em_options_set_int(o, "input_size", 3);
    em_options_set_int(o, "hidden_size", 4);
    em_options_set_int(o, "num_layers", 2);
    em_module *plain = em_module_new("GRU", o);
    em_options_set_float(o, "dropout", 0.5);
    em_module *drop = em_module_new("GRU", o);
    em_options_free(o);
    cr_assert(plain && drop, "%s", em_last_error());
    em_dict *sd = em_module_state_dict(plain);
    cr_assert_eq(em_module_load_state_dict(drop, sd, true, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(sd);
    double xv[30];
    em_test_fill_random(xv, 30, 5);
    em_tensor *x = em_test_tensor(EM_F32, 3, (int64_t[]){5, 2, 3}, xv);
    em_module_train(plain, false), em_module_train(drop, false);
    double *a = em_test_values(em_module_forward(plain, x));
    em_test_expect_close(em_module_forward(drop, x), a, 40, 0, 0, "eval: no dropout");
    em_module_train(drop, true);
    double *b = em_test_values(em_module_forward(drop, x));
    double diff = 0;
    for (int i = 0; i < 40; i++) diff = fmax(diff, fabs(a[i] - b[i]));
    cr_assert(diff > 1e-3, "training with dropout 0.5 changed nothing (%g)", diff);
    free(a), free(b);
    em_module_free(plain), em_module_free(drop);
    em_scope_end();
}

Test(rnn_layers, sequential_heads_and_errors) {
    em_scope_begin();
    /* output "last": the last layer's final hidden states, the directions side by side. */
    const rnn_layer_case *c = &cases[0];
    em_module *last = make(c, "last"), *hn = make(c, "h_n");
    load_torch(c, last);
    load_torch(c, hn);
    em_tensor *x = em_zeros(3, (int64_t[]){3, 4, 5}, EM_F32, em_cpu());
    cr_assert_eq(em_fill_(x, 0.25), EM_OK);
    em_tensor *a = em_module_forward(last, x), *b = em_module_forward(hn, x);
    em_test_expect_shape(a, 2, (int64_t[]){3, 12}, "last");
    em_tensor *want = em_cat(2, (const em_tensor *const[]){em_select(b, 0, 2), em_select(b, 0, 3)}, 1);
    double *w = em_test_values(want);
    em_test_expect_close(a, w, 36, 0, 0, "last is h_n's last layer");
    free(w);
    /* Unbatched input (T, I): the output (T, D H). */
    em_module *seq = make(c, NULL);
    em_tensor *u = em_module_forward(seq, em_select(x, 0, 0));
    em_test_expect_shape(u, 2, (int64_t[]){4, 12}, "unbatched");
    /* Errors name the layer and the shapes. */
    cr_assert_null(em_module_forward(seq, em_zeros(3, (int64_t[]){3, 4, 6}, EM_F32, em_cpu())));
    em_assert_error(EM_ERR_SHAPE, "LSTM: input has shape [3, 4, 6]: 6 features at each step; "
                                  "expected input_size=5");
    em_tensor *args[2] = {x, em_zeros(3, (int64_t[]){2, 3, 6}, EM_F32, em_cpu())};
    cr_assert_null(em_module_forward_n(seq, args, 2));
    em_assert_error(EM_ERR_SHAPE, "LSTM: h0 has shape [2, 3, 6]; expected [4, 3, 6]");
    em_tensor *bad = em_test_tensor(EM_BOOL, 2, (int64_t[]){3, 3}, (double[]){1, 1, 1, 1, 1, 1, 1, 1, 1});
    cr_assert_null(em_module_forward_masked(seq, &x, 1, bad));
    em_assert_error(EM_ERR_SHAPE, "LSTM: the padding mask has shape [3, 3]; expected (N, T)");
    em_options *o = em_options_new();
    em_options_set_int(o, "input_size", 3);
    em_options_set_int(o, "hidden_size", 2);
    em_options_set_string(o, "output", "c_n");
    cr_assert_null(em_module_new("GRU", o));
    em_options_free(o);
    em_module_free(last), em_module_free(hn), em_module_free(seq);
    em_scope_end();
}

/* The padding mask is told from the inputs by em_module_forward_mask() (the trailing input
 * that is the call's mask), never by dtype: a bool tensor passed as an input is an input (a
 * bool h0 is a dtype error), even where its shape would fit a mask. The mask must be bool and
 * a prefix mask (real steps, then padding); otherwise an error names the layer and the row. */
Test(rnn_layers, the_mask_comes_only_through_forward_masked_and_must_be_a_prefix) {
    em_scope_begin();
    /* Unbatched LSTM, 1 layer, hidden_size 4 = T: h0 is (1, 4), the shape of a (N=1, T=4) mask. */
    em_options *o = em_options_new();
    em_options_set_int(o, "input_size", 3);
    em_options_set_int(o, "hidden_size", 4);
    em_module *lstm = em_module_new("LSTM", o);
    cr_assert(lstm, "%s", em_last_error());
    double xv[12];
    em_test_fill_random(xv, 12, 7);
    em_tensor *x = em_test_tensor(EM_F32, 2, (int64_t[]){4, 3}, xv);
    em_tensor *bh = em_test_tensor(EM_BOOL, 2, (int64_t[]){1, 4}, (double[]){1, 1, 0, 0});
    em_tensor *args[2] = {x, bh};
    cr_assert_null(em_module_forward_n(lstm, args, 2), "a bool h0 was taken for a mask");
    em_assert_error(EM_ERR_DTYPE, "LSTM: h0 has dtype bool; expected the input's float32 (a "
                                  "padding mask goes through em_module_forward_masked");
    /* The same tensor as the call's mask (N=1, T=4, batched input (T, N, I)): lengths 2. */
    em_tensor *xb = em_unsqueeze(x, 1);
    em_tensor *ym = em_module_forward_masked(lstm, &xb, 1, bh);
    cr_assert(ym, "%s", em_last_error());
    /* Against the first 2 steps run alone: the same outputs, zeros after. */
    em_tensor *x2 = em_narrow(xb, 0, 0, 2);
    double *want = em_test_values(em_module_forward(lstm, x2)), *got = em_test_values(ym);
    for (int i = 0; i < 16; i++)
        cr_expect(i < 8 ? fabs(got[i] - want[i]) <= 1e-6 : got[i] == 0, "step %d unit %d: %g",
                  i / 4, i % 4, got[i]);
    free(want), free(got);
    /* Both: an explicit (bool) h0 and the mask: h0 is still an input. */
    em_tensor *bh3 = em_unsqueeze(bh, 1); /* (1, 1, 4) = (L D, N, H) */
    em_tensor *args3[2] = {xb, bh3};
    cr_assert_null(em_module_forward_masked(lstm, args3, 2, bh));
    em_assert_error(EM_ERR_DTYPE, "LSTM: h0 has dtype bool");
    em_module_free(lstm);
    /* A GRU over (T 4, N 3): row 1 has a real step after padding. */
    em_options_set_int(o, "hidden_size", 2);
    em_module *gru = em_module_new("GRU", o);
    cr_assert(gru, "%s", em_last_error());
    em_tensor *x3 = em_zeros(3, (int64_t[]){4, 3, 3}, EM_F32, em_cpu());
    em_tensor *holes = em_test_tensor(EM_BOOL, 2, (int64_t[]){3, 4},
                                      (double[]){1, 1, 1, 1, 1, 0, 1, 0, 1, 1, 0, 0});
    cr_assert_null(em_module_forward_masked(gru, &x3, 1, holes));
    em_assert_error(EM_ERR_INVALID, "GRU: row 1 of the padding mask is not a prefix mask: step 2 "
                                    "is real (true) after padding (false) at step 1");
    /* Inside a Sequential the same check runs. */
    em_module *seq = em_module_new("Sequential", NULL);
    cr_assert(seq, "%s", em_last_error());
    cr_assert_eq(em_module_add_child(seq, "0", gru), EM_OK, "%s", em_last_error());
    cr_assert_null(em_module_forward_masked(seq, &x3, 1, holes));
    cr_assert(strstr(em_last_error(), "row 1 of the padding mask is not a prefix mask"), "%s",
              em_last_error());
    /* A float mask is refused, not summed. */
    em_tensor *fm = em_ones(2, (int64_t[]){3, 4}, EM_F32, em_cpu());
    cr_assert_null(em_module_forward_masked(gru, &x3, 1, fm));
    em_assert_error(EM_ERR_DTYPE, "GRU: the padding mask has dtype float32; expected bool");
    /* A cell takes no mask: a bool h is an input there too. */
    em_module_free(seq);
    em_options_free(o);
    o = em_options_new();
    em_options_set_int(o, "input_size", 3);
    em_options_set_int(o, "hidden_size", 4);
    em_module *cell = em_module_new("GRUCell", o);
    cr_assert(cell, "%s", em_last_error());
    em_tensor *xc = em_zeros(2, (int64_t[]){1, 3}, EM_F32, em_cpu());
    em_tensor *argsc[2] = {xc, bh};
    cr_assert_null(em_module_forward_n(cell, argsc, 2));
    em_assert_error(EM_ERR_DTYPE, "GRUCell: h0 has dtype bool; expected the input's float32");
    em_module_free(cell);
    em_options_free(o);
    em_scope_end();
}

/* A config names the layers as any other: examples/digits-lstm.yaml (each 8x8 digit read row
 * by row by a bidirectional LSTM, output: last, then a Linear head) trains with ember-train
 * and classifies the test split far above chance (10%). */
Test(rnn_layers, ember_train_trains_the_digits_lstm_example) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' '%s/examples/digits-lstm.yaml' --epochs 4 2>&1", EM_TRAINER,
             EM_TEST_SRCDIR);
    int code = -1;
    char *out = em_test_run(cmd, &code);
    cr_assert_eq(code, 0, "%s", out);
    const char *t = strstr(out, "test: loss ");
    double loss = 0, acc = 0;
    cr_assert(t && sscanf(t, "test: loss %lf accuracy %lf%%", &loss, &acc) == 2, "%s", out);
    cr_expect(acc >= 70, "test accuracy %.2f%% after 4 epochs:\n%s", acc, out);
    free(out);
}

/* The sequence output and the gradients of x, h0 and c0 for sum(y r), in dtype dt, on nt
 * threads, as doubles one after another (the module's parameter gradients cleared first). */
static double *lstm_layer_run(em_module *m, em_dtype dt, int nt, const rnn_layer_case *c,
                              int64_t *n_out) {
    em_set_num_threads(nt);
    em_scope_begin();
    em_dict *params = em_module_named_parameters(m, false);
    for (size_t p = 0; p < em_dict_len(params); p++)
        cr_assert_eq(em_tensor_set_grad(em_dict_value(params, p), NULL), EM_OK);
    em_dict_free(params);
    int64_t L2 = c->L * (c->bidir ? 2 : 1), xn = c->T * c->N * c->I, hn = L2 * c->N * c->H;
    double *v = malloc(sizeof(double) * (size_t)(xn + 2 * hn + c->T * c->N * 2 * c->H));
    em_test_fill_random(v, xn + 2 * hn + c->T * c->N * 2 * c->H, 11);
    em_tensor *in[3] = {em_test_tensor(dt, 3, (int64_t[]){c->T, c->N, c->I}, v),
                        em_test_tensor(dt, 3, (int64_t[]){L2, c->N, c->H}, v + xn),
                        em_test_tensor(dt, 3, (int64_t[]){L2, c->N, c->H}, v + xn + hn)};
    em_tensor *r = em_test_tensor(dt, 3, (int64_t[]){c->T, c->N, (c->bidir ? 2 : 1) * c->H},
                                  v + xn + 2 * hn);
    free(v);
    for (int i = 0; i < 3; i++) cr_assert_eq(em_requires_grad_(in[i], true), EM_OK);
    em_tensor *y = em_module_forward_masked(m, in, 3, mask_of(c));
    cr_assert(y, "%s: %s", c->name, em_last_error());
    cr_assert_eq(em_backward(em_sum(em_mul(y, r), 0, NULL, false)), EM_OK, "%s: %s", c->name,
                 em_last_error());
    const em_tensor *outs[4] = {y, em_tensor_grad(in[0]), em_tensor_grad(in[1]),
                                em_tensor_grad(in[2])};
    int64_t n = 0;
    for (int i = 0; i < 4; i++) {
        cr_assert(outs[i], "%s: output %d missing", c->name, i);
        n += em_tensor_numel(outs[i]);
    }
    double *all = malloc(sizeof(double) * (size_t)n), *at = all;
    for (int i = 0; i < 4; i++) {
        double *g = em_test_values(outs[i]);
        memcpy(at, g, sizeof(double) * (size_t)em_tensor_numel(outs[i]));
        at += em_tensor_numel(outs[i]);
        free(g);
    }
    em_scope_end();
    *n_out = n;
    return all;
}

/* 2 layers, both directions, initial states, lengths, a hidden size not a multiple of 16 and
 * a step big enough for the f32 LSTM's parallel time loop on AVX-512 (cpu_rnn_loops.h): on 1
 * thread (the loop without a parallel region) and on 2 (each thread its share of the hidden
 * units) the output and the input and state gradients are within 1e-4 of the same module
 * converted to f64 (the op's scalar f64 kernels). (The bits of the kernels alone are compared
 * across thread counts in test_ops_rnn: through the layers they also pass the GEMMs of the
 * input and weight gradients, which may split their sums by the thread count.) */
Test(rnn_layers, lstm_matches_the_f64_module_on_1_and_2_threads) {
    static int64_t len32[32];
    for (int b = 0; b < 32; b++) len32[b] = 5 - (b % 3 == 1 ? 2 : 0) - (b % 7 == 3); /* 2..5 */
    static const rnn_layer_case c0 = {"lstm 2 layers bidirectional H 100", "LSTM", 24, 100, 2,
                                      true, false, true, len32, 32, 5};
    const rnn_layer_case *c = &c0;
    int nt0 = em_num_threads();
    em_module *m = make(c, "sequence");
    int64_t n[2], nr;
    double *got[2] = {lstm_layer_run(m, EM_F32, 1, c, &n[0]), lstm_layer_run(m, EM_F32, 2, c, &n[1])};
    cr_assert_eq(em_module_to_dtype(m, EM_F64), EM_OK, "%s", em_last_error());
    double *ref = lstm_layer_run(m, EM_F64, 2, c, &nr);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(n[i], nr);
        int64_t bad = 0;
        for (int64_t e = 0; e < nr; e++)
            bad += !(fabs(got[i][e] - ref[e]) <= 1e-4 + 1e-4 * fabs(ref[e]));
        cr_expect_eq(bad, 0, "%s, %d thread(s): %lld of %lld values off the f64 module's by "
                     "more than 1e-4", c->name, i + 1, (long long)bad, (long long)nr);
        free(got[i]);
    }
    free(ref);
    em_module_free(m);
    em_set_num_threads(nt0);
}
