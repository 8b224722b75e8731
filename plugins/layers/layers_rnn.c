/*
 * layers_rnn.c — recurrent layers: LSTM, GRU, LSTMCell, GRUCell (torch.nn's), over the fused
 * lstm and gru ops of ember/ops.h (one call per layer and direction; the ops' derivatives
 * give the gradients).
 *
 * Options, parameter names and default initialisation are PyTorch's: weight_ih_l{k},
 * weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k} (with a _reverse suffix for the second
 * direction; the cells' weight_ih, weight_hh, bias_ih, bias_hh), every one drawn from
 * U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), so state dicts move both ways.
 *
 * Forward ABI. A module's forward returns one tensor, so:
 *   inputs   (input), (input, h0) or, for LSTM, (input, h0, c0): input (T, N, input_size)
 *            ((N, T, input_size) with batch_first; (T, input_size) unbatched), h0/c0
 *            (num_layers * directions, N, hidden_size) (unbatched: without N); absent
 *            states are zeros (PyTorch's).
 *   output   the option `output` picks the tensor returned: "sequence" (the default, and what
 *            a Sequential passes on: PyTorch's `output`, (T, N, D * hidden_size), batch_first
 *            as the input), "h_n" or "c_n" (the final states, (num_layers * D, N,
 *            hidden_size), PyTorch's h_n/c_n) or "last" (the last layer's final hidden state
 *            with the directions side by side, (N, D * hidden_size): what a sequence
 *            classifier feeds its Linear head). For several of them, run one module per
 *            tensor over the same parameters, or call em_lstm/em_gru directly.
 *   lengths  variable-length batches through em_module_forward_masked: the mask ((N, T) bool,
 *            true at real positions, the padding at the end of each sequence: the loader's
 *            em_batch_mask) gives each sequence its length, as PyTorch's packed sequences —
 *            padded steps output zeros, the final states are each sequence's own, the reverse
 *            direction starts at each sequence's last real step. LSTM and GRU set takes_mask
 *            and, as MultiheadAttention, tell the mask from their own inputs by
 *            em_module_forward_mask() (the trailing input that is that very tensor), never by
 *            its dtype. A row that is not a prefix (a real step after padding) is an error
 *            naming the layer and the row. The cells take no mask.
 * Dropout (option `dropout`) is applied to the outputs of every layer but the last, in
 * training, as PyTorch's.
 */
#include <stdio.h>
#include <stdlib.h>

#include "layers.h"

enum { OUT_SEQUENCE, OUT_HN, OUT_CN, OUT_LAST };

typedef struct rnn_state {
    bool gru, bias, batch_first, cell;
    int64_t I, H, L, D;
    double dropout;
    int output;
} rnn_state;

static const char *const rnn_outputs[] = {"sequence", "h_n", "last", NULL},
                         *const lstm_outputs[] = {"sequence", "h_n", "c_n", "last", NULL},
                         *const lstmcell_outputs[] = {"h", "c", NULL};

#define RNN_OPTS(outs, what)                                                                   \
    OPT_INT_REQ("input_size", 1, 1e9, "features of each step of the input"),                   \
    OPT_INT_REQ("hidden_size", 1, 1e9, "features of the hidden state"),                        \
    OPT_INT("num_layers", 1, 1, 1e6, "stacked recurrent layers"),                              \
    OPT_BOOL("bias", true, "learn the biases bias_ih and bias_hh"),                            \
    OPT_BOOL("batch_first", false, "input and output are (N, T, features) instead of (T, N, " \
             "features)"),                                                                     \
    OPT_FLOAT("dropout", 0.0, 0.0, 1.0, "dropout on the outputs of each layer but the last " \
              "(training only)"),                                                              \
    OPT_BOOL("bidirectional", false, "a second direction reading the sequence backwards"),     \
    OPT_CHOICE("output", "sequence", outs, what)

static const em_option_spec lstm_opts[] = {
    RNN_OPTS(lstm_outputs, "the tensor forward returns: sequence (T, N, D H), h_n or c_n "
             "(layers D, N, H), last (N, D H)"),
};
static const em_option_spec gru_opts[] = {
    RNN_OPTS(rnn_outputs, "the tensor forward returns: sequence (T, N, D H), h_n (layers D, "
             "N, H), last (N, D H)"),
};
static const em_option_spec lstmcell_opts[] = {
    OPT_INT_REQ("input_size", 1, 1e9, "features of the input"),
    OPT_INT_REQ("hidden_size", 1, 1e9, "features of the hidden state"),
    OPT_BOOL("bias", true, "learn the biases bias_ih and bias_hh"),
    OPT_CHOICE("output", "h", lstmcell_outputs, "the tensor forward returns: h' or c'"),
};
static const em_option_spec grucell_opts[] = {
    OPT_INT_REQ("input_size", 1, 1e9, "features of the input"),
    OPT_INT_REQ("hidden_size", 1, 1e9, "features of the hidden state"),
    OPT_BOOL("bias", true, "learn the biases bias_ih and bias_hh"),
};

static const char *cls_name(const rnn_state *s) {
    return s->cell ? (s->gru ? "GRUCell" : "LSTMCell") : (s->gru ? "GRU" : "LSTM");
}

/* The parameter name of kind ("weight_ih", ...) for layer l, direction d. */
static void pname(const rnn_state *s, char *buf, size_t cap, const char *kind, int64_t l,
                  int64_t d) {
    if (s->cell) snprintf(buf, cap, "%s", kind);
    else snprintf(buf, cap, "%s_l%lld%s", kind, (long long)l, d ? "_reverse" : "");
}

static em_status add_uniform(em_module *m, const char *name, int nd, const int64_t *shape,
                             double k) {
    em_tensor *t = em_empty(nd, shape, EM_F32, em_cpu());
    if (!t || em_module_add_parameter(m, name, t) != EM_OK) return em_last_status();
    return em_init_uniform_(t, -k, k, NULL);
}

static em_status rnn_setup(em_module *m, const em_options *o, bool gru, bool cell) {
    rnn_state *s = em_module_state(m);
    s->gru = gru, s->cell = cell;
    s->I = em_options_int(o, "input_size");
    s->H = em_options_int(o, "hidden_size");
    s->bias = em_options_bool(o, "bias");
    s->L = cell ? 1 : em_options_int(o, "num_layers");
    s->D = !cell && em_options_bool(o, "bidirectional") ? 2 : 1;
    s->batch_first = !cell && em_options_bool(o, "batch_first");
    s->dropout = cell ? 0 : em_options_float(o, "dropout");
    const char *out = !cell || !gru ? em_options_string(o, "output") : "h";
    s->output = strcmp(out, "h_n") == 0 || strcmp(out, "h") == 0 ? OUT_HN
                : strcmp(out, "c_n") == 0 || strcmp(out, "c") == 0 ? OUT_CN
                : strcmp(out, "last") == 0 ? OUT_LAST
                                            : OUT_SEQUENCE;
    if (cell) s->output = s->output == OUT_CN ? OUT_CN : OUT_HN;
    int64_t G = gru ? 3 : 4, H = s->H;
    double k = 1.0 / sqrt((double)H);
    char name[64];
    for (int64_t l = 0; l < s->L; l++)
        for (int64_t d = 0; d < s->D; d++) {
            int64_t in = l == 0 ? s->I : H * s->D;
            em_status st;
            pname(s, name, sizeof name, "weight_ih", l, d);
            if ((st = add_uniform(m, name, 2, (int64_t[]){G * H, in}, k)) != EM_OK) return st;
            pname(s, name, sizeof name, "weight_hh", l, d);
            if ((st = add_uniform(m, name, 2, (int64_t[]){G * H, H}, k)) != EM_OK) return st;
            if (!s->bias) continue;
            pname(s, name, sizeof name, "bias_ih", l, d);
            if ((st = add_uniform(m, name, 1, (int64_t[]){G * H}, k)) != EM_OK) return st;
            pname(s, name, sizeof name, "bias_hh", l, d);
            if ((st = add_uniform(m, name, 1, (int64_t[]){G * H}, k)) != EM_OK) return st;
        }
    return EM_OK;
}

static em_status lstm_init(em_module *m, const em_options *o) { return rnn_setup(m, o, false, false); }
static em_status gru_init(em_module *m, const em_options *o) { return rnn_setup(m, o, true, false); }
static em_status lstmcell_init(em_module *m, const em_options *o) { return rnn_setup(m, o, false, true); }
static em_status grucell_init(em_module *m, const em_options *o) { return rnn_setup(m, o, true, true); }

/* A state input: (L D, N, H) (cells: (N, H)), or its unbatched form without N. */
static em_tensor *state_in(const rnn_state *s, const char *what, const em_tensor *h, int64_t N,
                           bool unbatched, em_dtype dt) {
    char b1[160], b2[160];
    if (em_tensor_dtype(h) != dt) {
        em_set_error(EM_ERR_DTYPE, "%s: %s has dtype %s; expected the input's %s%s", cls_name(s),
                     what, em_dtype_name(em_tensor_dtype(h)), em_dtype_name(dt),
                     em_tensor_dtype(h) == EM_BOOL && !s->cell
                         ? " (a padding mask goes through em_module_forward_masked, not as an "
                           "input)"
                         : "");
        return NULL;
    }
    int64_t want[3] = {s->L * s->D, N, s->H};
    const int64_t *w = s->cell ? want + 1 : want;
    int nd = s->cell ? 2 : 3;
    int64_t u[2] = {w[0], w[nd - 1]};
    const int64_t *exp = unbatched ? (s->cell ? u + 1 : u) : w;
    int end = unbatched ? nd - 1 : nd;
    bool ok = em_tensor_ndim(h) == end;
    for (int i = 0; ok && i < end; i++) ok = em_tensor_shape(h)[i] == exp[i];
    if (!ok) {
        em_set_error(EM_ERR_SHAPE, "%s: %s has shape %s; expected %s", cls_name(s), what,
                     em_shape_str(em_tensor_ndim(h), em_tensor_shape(h), b1, sizeof b1),
                     em_shape_str(end, exp, b2, sizeof b2));
        return NULL;
    }
    return unbatched ? em_unsqueeze(h, s->cell ? 0 : 1) : (em_tensor *)h;
}

/* The padding mask (N, T) must be bool and each row a prefix: true at the sequence's real
 * steps, then false to the end (the padding at the end, as the loader pads), so that its
 * count of true is the sequence's length. An error naming the layer and the row otherwise. */
static em_status prefix_mask_check(const char *who, const em_tensor *mask, int64_t N, int64_t T) {
    if (em_tensor_dtype(mask) != EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "%s: the padding mask has dtype %s; expected bool "
                            "(true at real steps)", who, em_dtype_name(em_tensor_dtype(mask)));
    size_t nb = em_tensor_nbytes(mask);
    unsigned char *v = malloc(nb ? nb : 1);
    if (!v) return em_set_error(EM_ERR_NOMEM, "%s: out of memory", who);
    em_status st = em_tensor_to_host(mask, v, nb);
    for (int64_t b = 0; st == EM_OK && b < N; b++) {
        const unsigned char *r = v + b * T;
        int64_t len = 0, t;
        while (len < T && r[len]) len++;
        for (t = len; t < T && !r[t]; t++) {}
        if (t < T)
            st = em_set_error(EM_ERR_INVALID, "%s: row %lld of the padding mask is not a prefix "
                              "mask: step %lld is real (true) after padding (false) at step "
                              "%lld; the padding must be at the end of each sequence", who,
                              (long long)b, (long long)t, (long long)len);
    }
    free(v);
    return st;
}

static em_tensor *rnn_forward(em_module *m, em_tensor *const *in, int n) {
    rnn_state *s = em_module_state(m);
    const char *who = cls_name(s);
    char b1[160];
    /* The data ABI's padding mask: the class sets takes_mask (the cells do not), so under
     * em_module_forward_masked the core hands it on as one more input, in[n - 1], that very
     * tensor. A tensor passed explicitly is never taken for it, whatever its dtype. */
    const em_tensor *mask = NULL, *dm = em_module_forward_mask();
    if (!s->cell && dm && n > 1 && in[n - 1] == dm) mask = in[--n];
    int most = s->gru ? 2 : 3;
    if (n < 1 || n > most) {
        em_set_error(EM_ERR_INVALID, "%s: forward takes %s; got %d inputs", who,
                     s->gru ? "(input) or (input, h0)" : "(input), (input, h0) or (input, h0, c0)",
                     n);
        return NULL;
    }
    em_tensor *x = in[0];
    const char *w0n = s->cell ? "weight_ih" : "weight_ih_l0";
    if (layers_check_float_input(x, em_module_parameter(m, w0n)) != EM_OK) return NULL;
    int want_nd = s->cell ? 2 : 3, nd = em_tensor_ndim(x);
    bool unbatched = nd == want_nd - 1;
    if (nd != want_nd && !unbatched) {
        em_set_error(EM_ERR_SHAPE, "%s: input has shape %s; expected %s", who,
                     em_shape_str(nd, em_tensor_shape(x), b1, sizeof b1),
                     s->cell ? "(N, input_size) or (input_size)"
                     : s->batch_first ? "(N, T, input_size) or (T, input_size)"
                                      : "(T, N, input_size) or (T, input_size)");
        return NULL;
    }
    if (em_tensor_shape(x)[nd - 1] != s->I) {
        em_set_error(EM_ERR_SHAPE, "%s: input has shape %s: %lld features at each step; "
                     "expected input_size=%lld", who,
                     em_shape_str(nd, em_tensor_shape(x), b1, sizeof b1),
                     (long long)em_tensor_shape(x)[nd - 1], (long long)s->I);
        return NULL;
    }
    /* To the ops' (T, N, I). */
    if (s->cell) x = em_unsqueeze(x, 0);
    if (unbatched) x = em_unsqueeze(x, 1);
    else if (s->batch_first) x = em_transpose(x, 0, 1);
    if (!x) return NULL;
    int64_t T = em_tensor_shape(x)[0], N = em_tensor_shape(x)[1];
    em_tensor *h0 = NULL, *c0 = NULL, *lengths = NULL;
    if (n > 1 && !(h0 = state_in(s, "h0", in[1], N, unbatched, em_tensor_dtype(x)))) return NULL;
    if (n > 2 && !(c0 = state_in(s, "c0", in[2], N, unbatched, em_tensor_dtype(x)))) return NULL;
    if (s->cell) {
        if (h0) h0 = em_unsqueeze(h0, 0);
        if (c0) c0 = em_unsqueeze(c0, 0);
    }
    if (mask) {
        if (em_tensor_ndim(mask) != 2 || em_tensor_shape(mask)[0] != N ||
            em_tensor_shape(mask)[1] != T) {
            em_set_error(EM_ERR_SHAPE, "%s: the padding mask has shape %s; expected (N, T) = "
                         "[%lld, %lld] (true at real steps)", who,
                         em_shape_str(em_tensor_ndim(mask), em_tensor_shape(mask), b1, sizeof b1),
                         (long long)N, (long long)T);
            return NULL;
        }
        if (prefix_mask_check(who, mask, N, T) != EM_OK) return NULL;
        if (!(lengths = em_sum(mask, 1, (const int[]){1}, false))) return NULL;
    }
    const int64_t LD = s->L * s->D;
    em_tensor **hs = calloc((size_t)(2 * LD), sizeof *hs), **cs = hs + LD;
    if (!hs) {
        em_set_error(EM_ERR_NOMEM, "%s: out of memory", who);
        return NULL;
    }
    em_tensor *layer = x, *result = NULL;
    char name[64];
    for (int64_t l = 0; l < s->L; l++) {
        em_tensor *ys[2] = {NULL, NULL};
        for (int64_t d = 0; d < s->D; d++) {
            em_tensor *wih, *whh, *bih = NULL, *bhh = NULL;
            pname(s, name, sizeof name, "weight_ih", l, d);
            wih = em_module_parameter(m, name);
            pname(s, name, sizeof name, "weight_hh", l, d);
            whh = em_module_parameter(m, name);
            if (s->bias) {
                pname(s, name, sizeof name, "bias_ih", l, d);
                bih = em_module_parameter(m, name);
                pname(s, name, sizeof name, "bias_hh", l, d);
                bhh = em_module_parameter(m, name);
            }
            em_tensor *w = em_cat(2, (const em_tensor *const[]){wih, whh}, 1);
            int64_t k = l * s->D + d;
            em_tensor *hx = h0 ? em_select(h0, 0, k) : NULL, *cx = c0 ? em_select(c0, 0, k) : NULL;
            if (!w || (h0 && !hx) || (c0 && !cx)) goto done;
            if (s->gru) {
                ys[d] = em_gru(layer, hx, w, bih, bhh, lengths, d == 1, &hs[k], NULL);
            } else {
                em_tensor *b = s->bias ? em_add(bih, bhh) : NULL;
                if (s->bias && !b) goto done;
                ys[d] = em_lstm(layer, hx, cx, w, b, lengths, d == 1, &hs[k], &cs[k], NULL);
            }
            if (!ys[d]) goto done;
        }
        layer = s->D == 2 ? em_cat(2, (const em_tensor *const[]){ys[0], ys[1]}, 2) : ys[0];
        if (layer && l + 1 < s->L && s->dropout > 0)
            layer = em_dropout(layer, s->dropout, em_module_training(m), NULL, NULL);
        if (!layer) goto done;
    }
    switch (s->output) {
    case OUT_SEQUENCE:
        result = unbatched ? em_squeeze(layer, 1) : s->batch_first ? em_transpose(layer, 0, 1)
                                                                   : layer;
        break;
    case OUT_HN:
    case OUT_CN:
        result = em_stack((int)LD, (const em_tensor *const *)(s->output == OUT_HN ? hs : cs), 0);
        if (result && s->cell) result = em_squeeze(result, 0);
        if (result && unbatched) result = em_squeeze(result, s->cell ? 0 : 1);
        break;
    case OUT_LAST:
        result = s->D == 2 ? em_cat(2, (const em_tensor *const[]){hs[LD - 2], hs[LD - 1]}, 1)
                           : hs[LD - 1];
        if (result && unbatched) result = em_squeeze(result, 0);
        break;
    }
done:
    free(hs);
    return result;
}

static const em_module_class lstm_class = {
    .struct_size = sizeof(em_module_class), .name = "LSTM",
    .description = "multi-layer long short-term memory RNN (torch.nn.LSTM)", .options = lstm_opts,
    .n_options = NOPTS(lstm_opts), .state_size = sizeof(rnn_state), .init = lstm_init,
    .forward = rnn_forward, .n_inputs = 0, .takes_mask = true,
};
static const em_module_class gru_class = {
    .struct_size = sizeof(em_module_class), .name = "GRU",
    .description = "multi-layer gated recurrent unit RNN (torch.nn.GRU)", .options = gru_opts,
    .n_options = NOPTS(gru_opts), .state_size = sizeof(rnn_state), .init = gru_init,
    .forward = rnn_forward, .n_inputs = 0, .takes_mask = true,
};
static const em_module_class lstmcell_class = {
    .struct_size = sizeof(em_module_class), .name = "LSTMCell",
    .description = "one LSTM step (torch.nn.LSTMCell)", .options = lstmcell_opts,
    .n_options = NOPTS(lstmcell_opts), .state_size = sizeof(rnn_state), .init = lstmcell_init,
    .forward = rnn_forward, .n_inputs = 0,
};
static const em_module_class grucell_class = {
    .struct_size = sizeof(em_module_class), .name = "GRUCell",
    .description = "one GRU step (torch.nn.GRUCell)", .options = grucell_opts,
    .n_options = NOPTS(grucell_opts), .state_size = sizeof(rnn_state), .init = grucell_init,
    .forward = rnn_forward, .n_inputs = 0,
};

const em_module_class *const layers_rnn[] = {&lstm_class, &gru_class, &lstmcell_class,
                                             &grucell_class, NULL};
