/*
 * layers_attn.c — attention layers: MultiheadAttention, TransformerEncoderLayer,
 * TransformerEncoder and the positional encodings (PositionalEncoding, sinusoidal as in
 * PyTorch's sequence-modelling tutorial; LearnedPositionalEncoding, a learned table added).
 * Every forward is public ops (linear, scaled_dot_product_attention, layer_norm, ...), so
 * autograd differentiates it.
 *
 * Options, default initialisation and state-dict names follow torch.nn (1.13):
 *   MultiheadAttention  in_proj_weight (3E, E), q;k;v stacked, xavier_uniform; in_proj_bias
 *       (3E) zeros; out_proj.weight (E, E) Linear's default, out_proj.bias zeros. With kdim
 *       or vdim differing from embed_dim: q_proj_weight (E, E), k_proj_weight (E, kdim),
 *       v_proj_weight (E, vdim), each xavier_uniform, instead of in_proj_weight.
 *   TransformerEncoderLayer  self_attn.*, linear1, linear2, norm1, norm2 (and the
 *       parameterless dropout, dropout1, dropout2 children, as PyTorch's tree has them).
 *   TransformerEncoder  layers.0.*, layers.1.*, ... and norm.* (option norm).
 *   PositionalEncoding  buffer pe (max_len, 1, d_model), persistent, as the tutorial
 *       registers it; LearnedPositionalEncoding  parameter weight (max_len, d_model), N(0, 1)
 *       as nn.Embedding's.
 *
 * MASKS. Three conventions meet here:
 *   - MultiheadAttention's key_padding_mask (B, S) and attn_mask (L, S) or (B*H, L, S), as in
 *     PyTorch: bool TRUE MEANS "IGNORE" (the key is not attended to); floating ones are added
 *     to the scores.
 *   - the op scaled_dot_product_attention takes a bool mask where TRUE MEANS "ATTEND": the
 *     masks above are negated before they reach it.
 *   - the data ABI's padding mask (em_module_forward_masked, em_batch_mask: (B, L) bool, TRUE
 *     AT REAL POSITIONS) reaches MultiheadAttention (takes_mask) at any depth; its positions
 *     that are false are ignored as keys, like a key_padding_mask that is its negation. It
 *     combines with an explicit key_padding_mask (a key ignored by either is ignored).
 * A query row whose keys are all masked gets a zero attention output here (PyTorch's gives
 * NaN). The option `causal` masks key j > i for query i (PyTorch passes
 * generate_square_subsequent_mask(L) as attn_mask for the same effect).
 *
 * Only the attention output is returned (need_weights=False in PyTorch's terms).
 */
#include <math.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/tensor.h"
#include "layers.h"

#define SHAPE(t, buf) em_shape_str(em_tensor_ndim(t), em_tensor_shape(t), buf, sizeof buf)

/* A child of class cls made from options set by fill; m takes it as `name`. */
static em_status add_child(em_module *m, const char *name, const char *cls, em_options *o) {
    if (!o) return em_set_error(EM_ERR_NOMEM, "out of memory making child %s", name);
    em_module *c = em_module_new(cls, o);
    em_options_free(o);
    if (!c) return em_last_status();
    return em_module_add_child(m, name, c);
}

static em_options *linear_opts(int64_t in, int64_t out, bool bias) {
    em_options *o = em_options_new();
    if (!o) return NULL;
    em_options_set_int(o, "in_features", in);
    em_options_set_int(o, "out_features", out);
    em_options_set_bool(o, "bias", bias);
    return o;
}

/* True when t is the "none" placeholder of an optional input: a tensor of zero elements. */
static bool absent(const em_tensor *t) { return !t || em_tensor_numel(t) == 0; }

/* ---- MultiheadAttention --------------------------------------------------------------------------- */

static const em_option_spec mha_opts[] = {
    OPT_INT_REQ("embed_dim", 1, 1e9, "E: the model dim (query features and output)"),
    OPT_INT_REQ("num_heads", 1, 1e9, "heads H; E must be divisible by H (head dim E / H)"),
    OPT_FLOAT("dropout", 0.0, 0, 1, "dropout on the attention probabilities (training only)"),
    OPT_BOOL("bias", true, "learn in_proj_bias and out_proj.bias"),
    OPT_BOOL("batch_first", false, "inputs are (B, L, E) instead of (L, B, E)"),
    OPT_INT("kdim", 0, 0, 1e9, "key features (0: embed_dim)"),
    OPT_INT("vdim", 0, 0, 1e9, "value features (0: embed_dim)"),
    OPT_BOOL("causal", false, "query i attends to keys j <= i only"),
};

typedef struct mha_state {
    int64_t E, H, kdim, vdim;
    double dropout;
    bool packed, batch_first, causal;
} mha_state;

static em_status mha_init(em_module *m, const em_options *o) {
    mha_state *s = em_module_state(m);
    s->E = em_options_int(o, "embed_dim");
    s->H = em_options_int(o, "num_heads");
    s->kdim = em_options_int(o, "kdim") ? em_options_int(o, "kdim") : s->E;
    s->vdim = em_options_int(o, "vdim") ? em_options_int(o, "vdim") : s->E;
    s->dropout = em_options_float(o, "dropout");
    s->batch_first = em_options_bool(o, "batch_first");
    s->causal = em_options_bool(o, "causal");
    s->packed = s->kdim == s->E && s->vdim == s->E;
    if (s->E % s->H)
        return em_set_error(EM_ERR_INVALID, "MultiheadAttention: embed_dim=%lld must be "
                            "divisible by num_heads=%lld", (long long)s->E, (long long)s->H);
    int64_t E = s->E;
    em_status st = EM_OK;
    if (s->packed) {
        em_tensor *w = em_empty(2, (int64_t[]){3 * E, E}, EM_F32, em_cpu());
        if ((st = em_module_add_parameter(m, "in_proj_weight", w)) != EM_OK) return st;
        /* xavier_uniform on the stacked (3E, E) weight, as PyTorch: fans 3E and E. */
        if ((st = em_init_xavier_uniform_(w, 1.0, NULL)) != EM_OK) return st;
    } else {
        static const char *const names[3] = {"q_proj_weight", "k_proj_weight", "v_proj_weight"};
        int64_t in[3] = {E, s->kdim, s->vdim};
        for (int i = 0; i < 3; i++) {
            em_tensor *w = em_empty(2, (int64_t[]){E, in[i]}, EM_F32, em_cpu());
            if ((st = em_module_add_parameter(m, names[i], w)) != EM_OK ||
                (st = em_init_xavier_uniform_(w, 1.0, NULL)) != EM_OK)
                return st;
        }
    }
    bool bias = em_options_bool(o, "bias");
    if (bias && (st = em_module_add_parameter(m, "in_proj_bias",
                                              em_zeros(1, (int64_t[]){3 * E}, EM_F32,
                                                       em_cpu()))) != EM_OK)
        return st;
    /* out_proj: PyTorch's NonDynamicallyQuantizableLinear, a Linear (default init) whose bias
     * MultiheadAttention zeroes. */
    if ((st = add_child(m, "out_proj", "Linear", linear_opts(E, E, bias))) != EM_OK) return st;
    if (bias) st = em_init_zeros_(em_module_parameter(em_module_child(m, "out_proj"), "bias"));
    return st;
}

/* x (L, B, F) or (B, L, F) by batch_first, or unbatched (L, F): as (B, L, F) (x itself,
 * borrowed, or a scope-tracked view). */
static em_tensor *to_blf(const mha_state *s, const em_tensor *x, bool unbatched) {
    if (unbatched) return em_unsqueeze(x, 0);
    return s->batch_first ? (em_tensor *)x : em_transpose(x, 0, 1);
}

/* (B, L, E) projected -> (B, H, L, D). */
static em_tensor *split_heads(const mha_state *s, const em_tensor *x) {
    int64_t B = em_tensor_size(x, 0), L = em_tensor_size(x, 1), D = s->E / s->H;
    em_tensor *r = em_reshape(x, 4, (int64_t[]){B, L, s->H, D});
    return em_permute(r, 4, (const int[]){0, 2, 1, 3});
}

/* A mask of the scores (B, H, L, S) from PyTorch-convention masks: bool true = ignore,
 * floating added. `attend` (bool, true = attend) and `add` (floating) accumulate; m is
 * reshaped to 4 dims by the caller. */
static em_status mask_merge(const em_tensor *m, bool true_ignores, em_dtype dt,
                            em_tensor **attend, em_tensor **add) {
    if (em_tensor_dtype(m) == EM_BOOL) {
        em_tensor *a = true_ignores ? em_logical_not(m) : (em_tensor *)m;
        *attend = *attend ? em_logical_and(*attend, a) : a;
        return *attend ? EM_OK : em_last_status();
    }
    if (!em_dtype_is_floating(em_tensor_dtype(m)))
        return em_set_error(EM_ERR_DTYPE, "a mask has dtype %s; expected bool (true = ignore) "
                            "or a floating dtype (added to the scores)",
                            em_dtype_name(em_tensor_dtype(m)));
    em_tensor *f = em_to_dtype(m, dt);
    *add = *add ? em_add(*add, f) : f;
    return *add ? EM_OK : em_last_status();
}

/* The layer's attention on (B, L, E) query, (B, S, kdim) key, (B, S, vdim) value; masks in
 * PyTorch's conventions (NULL: none), `valid` the data ABI's (B, S) mask (true = real) or
 * NULL. Returns (B, L, E) before out_proj. */
static em_tensor *mha_attend(em_module *m, const em_tensor *q, const em_tensor *k,
                             const em_tensor *v, const em_tensor *kpm,
                             const em_tensor *am, const em_tensor *valid) {
    mha_state *s = em_module_state(m);
    int64_t E = s->E, B = em_tensor_size(q, 0), L = em_tensor_size(q, 1),
            S = em_tensor_size(k, 1);
    char b1[128], b2[128];
    if (em_tensor_size(k, 0) != B || em_tensor_size(v, 0) != B || em_tensor_size(v, 1) != S ||
        em_tensor_size(q, 2) != E || em_tensor_size(k, 2) != s->kdim ||
        em_tensor_size(v, 2) != s->vdim) {
        em_set_error(EM_ERR_SHAPE, "query, key and value (batch-first views) %s, %s and %s; "
                     "expected (B, L, %lld), (B, S, %lld), (B, S, %lld)", SHAPE(q, b1),
                     SHAPE(k, b2), em_shape_str(em_tensor_ndim(v), em_tensor_shape(v),
                                                (char[128]){0}, 128),
                     (long long)E, (long long)s->kdim, (long long)s->vdim);
        return NULL;
    }
    em_tensor *bias = em_module_parameter(m, "in_proj_bias");
    em_tensor *Q, *K, *V;
    if (s->packed) {
        /* Self-attention too takes three products over thirds of the stacked weight rather
         * than one over all of it and a chunk of the (B, L, 3E) result: the same sums, but
         * the chunk's backward copied each third's grad into zeros of the whole and added
         * the three (18M floats written per layer of the Transformer step, bench/README.md),
         * where the thirds' grads now meet in q's (B, L, E) grad. */
        em_tensor *w = em_module_parameter(m, "in_proj_weight");
        Q = em_linear(q, em_narrow(w, 0, 0, E), bias ? em_narrow(bias, 0, 0, E) : NULL);
        K = em_linear(k, em_narrow(w, 0, E, E), bias ? em_narrow(bias, 0, E, E) : NULL);
        V = em_linear(v, em_narrow(w, 0, 2 * E, E), bias ? em_narrow(bias, 0, 2 * E, E) : NULL);
    } else {
        Q = em_linear(q, em_module_parameter(m, "q_proj_weight"),
                      bias ? em_narrow(bias, 0, 0, E) : NULL);
        K = em_linear(k, em_module_parameter(m, "k_proj_weight"),
                      bias ? em_narrow(bias, 0, E, E) : NULL);
        V = em_linear(v, em_module_parameter(m, "v_proj_weight"),
                      bias ? em_narrow(bias, 0, 2 * E, E) : NULL);
    }
    if (!Q || !K || !V) return NULL;
    em_dtype dt = em_tensor_dtype(Q);
    em_tensor *attend = NULL, *add = NULL;
    if (kpm) {
        if (em_tensor_ndim(kpm) != 2 || em_tensor_size(kpm, 0) != B || em_tensor_size(kpm, 1) != S) {
            em_set_error(EM_ERR_SHAPE, "key_padding_mask %s must be (B, S) = [%lld, %lld]",
                         SHAPE(kpm, b1), (long long)B, (long long)S);
            return NULL;
        }
        if (mask_merge(em_reshape(kpm, 4, (int64_t[]){B, 1, 1, S}), true, dt, &attend, &add) !=
            EM_OK)
            return NULL;
    }
    if (valid) {
        if (em_tensor_ndim(valid) != 2 || em_tensor_size(valid, 0) != B ||
            em_tensor_size(valid, 1) != S || em_tensor_dtype(valid) != EM_BOOL) {
            em_set_error(EM_ERR_SHAPE, "the batch's padding mask %s %s must be (B, S) = [%lld, "
                         "%lld] bool to mask the keys", SHAPE(valid, b1),
                         em_dtype_name(em_tensor_dtype(valid)), (long long)B, (long long)S);
            return NULL;
        }
        if (mask_merge(em_reshape(valid, 4, (int64_t[]){B, 1, 1, S}), false, dt, &attend,
                       &add) != EM_OK)
            return NULL;
    }
    if (am) {
        em_tensor *a4 = NULL;
        if (em_tensor_ndim(am) == 2 && em_tensor_size(am, 0) == L && em_tensor_size(am, 1) == S)
            a4 = em_reshape(am, 4, (int64_t[]){1, 1, L, S});
        else if (em_tensor_ndim(am) == 3 && em_tensor_size(am, 0) == B * s->H &&
                 em_tensor_size(am, 1) == L && em_tensor_size(am, 2) == S)
            a4 = em_reshape(am, 4, (int64_t[]){B, s->H, L, S});
        if (!a4) {
            em_set_error(EM_ERR_SHAPE, "attn_mask %s must be (L, S) = [%lld, %lld] or (B*H, L, "
                         "S) = [%lld, %lld, %lld]", SHAPE(am, b1), (long long)L, (long long)S,
                         (long long)(B * s->H), (long long)L, (long long)S);
            return NULL;
        }
        if (mask_merge(a4, true, dt, &attend, &add) != EM_OK) return NULL;
    }
    em_tensor *mask = attend;
    if (add && attend) /* both kinds: the ignored keys become -inf in the additive mask */
        mask = em_add(add, em_masked_fill(em_zeros(1, (int64_t[]){1}, dt, em_tensor_device(Q)),
                                          em_logical_not(attend), -INFINITY));
    else if (add)
        mask = add;
    if ((add || attend) && !mask) return NULL;
    double p = em_module_training(m) ? s->dropout : 0.0;
    em_tensor *o = em_scaled_dot_product_attention(split_heads(s, Q), split_heads(s, K),
                                                   split_heads(s, V), mask, p, s->causal, NULL,
                                                   NULL, NULL);
    if (!o) return NULL;
    /* (B, H, L, D) -> (B, L, E) */
    return em_reshape(em_permute(o, 4, (const int[]){0, 2, 1, 3}), 3, (int64_t[]){B, L, E});
}

/* Inputs: (x) self-attention; (query, key, value); (query, key, value, key_padding_mask,
 * attn_mask) where a zero-element tensor stands for an absent mask. Under
 * em_module_forward_masked one more: the batch's padding mask. */
static em_tensor *mha_forward(em_module *m, em_tensor *const *in, int n) {
    mha_state *s = em_module_state(m);
    const em_tensor *valid = NULL;
    const em_tensor *dm = em_module_forward_mask();
    if (dm && n > 1 && in[n - 1] == dm) valid = in[--n];
    if (n != 1 && n != 3 && n != 5) {
        em_set_error(EM_ERR_INVALID, "forward takes (x), (query, key, value) or (query, key, "
                     "value, key_padding_mask, attn_mask), got %d inputs", n);
        return NULL;
    }
    const em_tensor *q = in[0], *k = n > 1 ? in[1] : q, *v = n > 1 ? in[2] : q;
    const em_tensor *kpm = n == 5 && !absent(in[3]) ? in[3] : NULL,
                    *am = n == 5 && !absent(in[4]) ? in[4] : NULL;
    int nd = em_tensor_ndim(q);
    if (nd != 2 && nd != 3) {
        char b[128];
        em_set_error(EM_ERR_SHAPE, "expected a query of 3 dims (%s, E) or 2 (L, E), got %s",
                     s->batch_first ? "B, L" : "L, B", SHAPE(q, b));
        return NULL;
    }
    bool unbatched = nd == 2;
    if (em_tensor_ndim(k) != nd || em_tensor_ndim(v) != nd) {
        em_set_error(EM_ERR_SHAPE, "query, key and value must have the same number of dims "
                     "(%d, %d, %d)", nd, em_tensor_ndim(k), em_tensor_ndim(v));
        return NULL;
    }
    if (layers_check_float_input(q, em_module_parameter(em_module_child(m, "out_proj"),
                                                        "weight")) != EM_OK)
        return NULL;
    if (unbatched && kpm) kpm = em_unsqueeze(kpm, 0);
    if (unbatched && valid && em_tensor_ndim(valid) == 1) valid = em_unsqueeze(valid, 0);
    bool self = n == 1 || (q == k && k == v);
    em_tensor *qb = to_blf(s, q, unbatched);
    em_tensor *kb = self ? qb : to_blf(s, k, unbatched), *vb = self ? qb : to_blf(s, v, unbatched);
    em_tensor *a = mha_attend(m, qb, kb, vb, kpm, am, valid);
    if (!a) return NULL;
    em_tensor *y = em_module_forward(em_module_child(m, "out_proj"), a);
    if (!y) return NULL;
    if (unbatched) return em_squeeze(y, 0);
    return s->batch_first ? y : em_transpose(y, 0, 1);
}

static const em_module_class mha_class = {
    .struct_size = sizeof(em_module_class), .name = "MultiheadAttention",
    .description = "multi-head attention over (query, key, value) "
                   "(torch.nn.MultiheadAttention)",
    .options = mha_opts, .n_options = NOPTS(mha_opts), .state_size = sizeof(mha_state),
    .init = mha_init, .forward = mha_forward, .n_inputs = 0, .takes_mask = true,
};

/* ---- TransformerEncoderLayer, TransformerEncoder ---------------------------------------------------- */

static const char *const activations[] = {"relu", "gelu", NULL};

#define ENC_LAYER_OPTS                                                                         \
    OPT_INT_REQ("d_model", 1, 1e9, "the model dim E"),                                         \
    OPT_INT_REQ("nhead", 1, 1e9, "attention heads (d_model divisible by it)"),                 \
    OPT_INT("dim_feedforward", 2048, 1, 1e9, "the feed-forward block's hidden size"),          \
    OPT_FLOAT("dropout", 0.1, 0, 1, "dropout in attention, the feed-forward block and on "     \
              "both residual branches"),                                                       \
    OPT_CHOICE("activation", "relu", activations, "the feed-forward block's activation"),     \
    OPT_FLOAT("layer_norm_eps", 1e-5, 0, 1, "eps of norm1 and norm2"),                         \
    OPT_BOOL("batch_first", false, "inputs are (B, L, E) instead of (L, B, E)"),               \
    OPT_BOOL("norm_first", false, "pre-norm (LayerNorm before attention and feed-forward) "    \
             "instead of post-norm"),                                                          \
    OPT_BOOL("causal", false, "causal self-attention (position i sees positions <= i)")

static const em_option_spec enc_layer_opts[] = {ENC_LAYER_OPTS};

typedef struct enc_layer_state {
    bool norm_first, gelu;
} enc_layer_state;

static em_options *dropout_opts(double p) {
    em_options *o = em_options_new();
    if (o) em_options_set_float(o, "p", p);
    return o;
}

static em_options *ln_opts(int64_t d, double eps) {
    em_options *o = em_options_new();
    if (!o) return NULL;
    em_options_set_ints(o, "normalized_shape", 1, &d);
    em_options_set_float(o, "eps", eps);
    return o;
}

static em_status enc_layer_init(em_module *m, const em_options *o) {
    enc_layer_state *s = em_module_state(m);
    int64_t d = em_options_int(o, "d_model"), ff = em_options_int(o, "dim_feedforward");
    double p = em_options_float(o, "dropout"), eps = em_options_float(o, "layer_norm_eps");
    s->norm_first = em_options_bool(o, "norm_first");
    s->gelu = !strcmp(em_options_string(o, "activation"), "gelu");
    em_options *a = em_options_new();
    if (a) {
        em_options_set_int(a, "embed_dim", d);
        em_options_set_int(a, "num_heads", em_options_int(o, "nhead"));
        em_options_set_float(a, "dropout", p);
        em_options_set_bool(a, "batch_first", em_options_bool(o, "batch_first"));
        em_options_set_bool(a, "causal", em_options_bool(o, "causal"));
    }
    em_status st = add_child(m, "self_attn", "MultiheadAttention", a);
    if (st == EM_OK) st = add_child(m, "linear1", "Linear", linear_opts(d, ff, true));
    if (st == EM_OK) st = add_child(m, "dropout", "Dropout", dropout_opts(p));
    if (st == EM_OK) st = add_child(m, "linear2", "Linear", linear_opts(ff, d, true));
    if (st == EM_OK) st = add_child(m, "norm1", "LayerNorm", ln_opts(d, eps));
    if (st == EM_OK) st = add_child(m, "norm2", "LayerNorm", ln_opts(d, eps));
    if (st == EM_OK) st = add_child(m, "dropout1", "Dropout", dropout_opts(p));
    if (st == EM_OK) st = add_child(m, "dropout2", "Dropout", dropout_opts(p));
    return st;
}

static em_tensor *child(em_module *m, const char *name, const em_tensor *x) {
    return x ? em_module_forward(em_module_child(m, name), x) : NULL;
}

/* Inputs: (src) or (src, mask, src_key_padding_mask) (PyTorch's forward; a zero-element
 * tensor stands for an absent mask). Under em_module_forward_masked the batch's padding mask
 * reaches self_attn directly. */
static em_tensor *enc_layer_forward(em_module *m, em_tensor *const *in, int n) {
    enc_layer_state *s = em_module_state(m);
    if (n != 1 && n != 3) {
        em_set_error(EM_ERR_INVALID, "forward takes (src) or (src, mask, src_key_padding_mask), "
                     "got %d inputs", n);
        return NULL;
    }
    em_tensor *x = in[0];
    em_module *sa = em_module_child(m, "self_attn");
    /* self_attn(h, h, h, key_padding_mask, attn_mask) */
#define SA(h) (n == 1 ? em_module_forward(sa, h)                                             \
                      : em_module_forward_n(sa, (em_tensor *const[]){h, h, h, in[2], in[1]}, 5))
#define FF(h)                                                                                  \
    child(m, "linear2", child(m, "dropout", s->gelu ? em_gelu(child(m, "linear1", h), NULL)    \
                                                    : em_relu(child(m, "linear1", h))))
    if (s->norm_first) {
        em_tensor *h = child(m, "norm1", x);
        x = h ? em_add(x, child(m, "dropout1", SA(h))) : NULL;
        h = child(m, "norm2", x);
        return h ? em_add(x, child(m, "dropout2", FF(h))) : NULL;
    }
    x = child(m, "norm1", em_add(x, child(m, "dropout1", SA(x))));
    return x ? child(m, "norm2", em_add(x, child(m, "dropout2", FF(x)))) : NULL;
#undef SA
#undef FF
}

static const em_module_class enc_layer_class = {
    .struct_size = sizeof(em_module_class), .name = "TransformerEncoderLayer",
    .description = "self-attention and feed-forward blocks with residuals and LayerNorm "
                   "(torch.nn.TransformerEncoderLayer)",
    .options = enc_layer_opts, .n_options = NOPTS(enc_layer_opts),
    .state_size = sizeof(enc_layer_state), .init = enc_layer_init,
    .forward = enc_layer_forward, .n_inputs = 0,
};

static const em_option_spec enc_opts[] = {
    ENC_LAYER_OPTS,
    OPT_INT_REQ("num_layers", 1, 1e6, "encoder layers (layers.0, layers.1, ...)"),
    OPT_BOOL("norm", false, "a final LayerNorm(d_model, layer_norm_eps) (the norm argument)"),
};

static em_status enc_init(em_module *m, const em_options *o) {
    em_module *layers = em_module_new("Sequential", NULL);
    em_status st = layers ? em_module_add_child(m, "layers", layers) : em_last_status();
    int64_t nl = em_options_int(o, "num_layers");
    for (int64_t i = 0; i < nl && st == EM_OK; i++) {
        /* The layer's options are the encoder's less num_layers and norm. */
        em_options *lo = em_options_new();
        if (!lo) return em_set_error(EM_ERR_NOMEM, "out of memory");
        em_options_set_int(lo, "d_model", em_options_int(o, "d_model"));
        em_options_set_int(lo, "nhead", em_options_int(o, "nhead"));
        em_options_set_int(lo, "dim_feedforward", em_options_int(o, "dim_feedforward"));
        em_options_set_float(lo, "dropout", em_options_float(o, "dropout"));
        em_options_set_string(lo, "activation", em_options_string(o, "activation"));
        em_options_set_float(lo, "layer_norm_eps", em_options_float(o, "layer_norm_eps"));
        em_options_set_bool(lo, "batch_first", em_options_bool(o, "batch_first"));
        em_options_set_bool(lo, "norm_first", em_options_bool(o, "norm_first"));
        em_options_set_bool(lo, "causal", em_options_bool(o, "causal"));
        em_module *l = em_module_new("TransformerEncoderLayer", lo);
        em_options_free(lo);
        st = l ? em_module_append_child(layers, l) : em_last_status();
    }
    if (st == EM_OK && em_options_bool(o, "norm"))
        st = add_child(m, "norm", "LayerNorm", ln_opts(em_options_int(o, "d_model"),
                                                       em_options_float(o, "layer_norm_eps")));
    return st;
}

static em_tensor *enc_forward(em_module *m, em_tensor *const *in, int n) {
    if (n != 1 && n != 3) {
        em_set_error(EM_ERR_INVALID, "forward takes (src) or (src, mask, src_key_padding_mask), "
                     "got %d inputs", n);
        return NULL;
    }
    em_module *layers = em_module_child(m, "layers");
    em_tensor *args[3] = {in[0], n == 3 ? in[1] : NULL, n == 3 ? in[2] : NULL};
    size_t nl = em_module_child_count(layers);
    for (size_t i = 0; i < nl && args[0]; i++) {
        const char *name;
        em_module *l = em_module_child_at(layers, i, &name);
        em_tensor *y = em_module_forward_n(l, args, n);
        if (!y) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", em_last_error());
            em_set_error(em_last_status(), "layers.%s: %s", name, msg);
        }
        args[0] = y;
    }
    em_module *norm = em_module_child(m, "norm");
    return norm && args[0] ? em_module_forward(norm, args[0]) : args[0];
}

static const em_module_class enc_class = {
    .struct_size = sizeof(em_module_class), .name = "TransformerEncoder",
    .description = "num_layers TransformerEncoderLayers and an optional final LayerNorm "
                   "(torch.nn.TransformerEncoder)",
    .options = enc_opts, .n_options = NOPTS(enc_opts), .init = enc_init, .forward = enc_forward,
    .n_inputs = 0,
};

/* ---- positional encodings ------------------------------------------------------------------------- */

static const em_option_spec pe_opts[] = {
    OPT_INT_REQ("d_model", 1, 1e9, "the embedding dim E"),
    OPT_FLOAT("dropout", 0.1, 0, 1, "dropout after the sum (training only)"),
    OPT_INT("max_len", 5000, 1, 1e9, "the longest sequence"),
    OPT_BOOL("batch_first", false, "inputs are (B, L, E) instead of (L, B, E)"),
};

/* pe[pos, 0, 2i] = sin(pos w_i), pe[pos, 0, 2i+1] = cos(pos w_i), w_i = exp(-2i ln(10000) / d),
 * computed as the tutorial does in float32: w_i and pos * w_i are rounded to float before
 * the sine (so the buffer is PyTorch's within the sine's last bit). */
static em_status pe_init(em_module *m, const em_options *o) {
    int64_t d = em_options_int(o, "d_model"), len = em_options_int(o, "max_len");
    if ((double)len * (double)d > 1e9)
        return em_set_error(EM_ERR_RANGE, "PositionalEncoding: max_len * d_model = %g is too "
                            "large", (double)len * (double)d);
    em_tensor *pe = em_zeros(3, (int64_t[]){len, 1, d}, EM_F32, em_cpu());
    if (!pe) return em_last_status();
    float *p = em_tensor_data(pe);
    float c = (float)(-log(10000.0) / (double)d);
    for (int64_t i = 0; 2 * i < d; i++) {
        float w = expf((float)(2 * i) * c);
        for (int64_t pos = 0; pos < len; pos++) {
            float a = (float)pos * w;
            p[pos * d + 2 * i] = (float)sin((double)a);
            if (2 * i + 1 < d) p[pos * d + 2 * i + 1] = (float)cos((double)a);
        }
    }
    return em_module_add_buffer(m, "pe", pe, true);
}

/* x (L, B, E) or (B, L, E) plus rows [0, L) of table (L', E) (any dims after the first are
 * reshaped to E). */
static em_tensor *add_positions(em_module *m, const em_tensor *x, const em_tensor *table,
                                int64_t d, bool batch_first) {
    char b[128];
    if (em_tensor_ndim(x) != 3 || em_tensor_size(x, 2) != d) {
        em_set_error(EM_ERR_SHAPE, "expected an input (%s, %lld), got %s",
                     batch_first ? "B, L" : "L, B", (long long)d, SHAPE(x, b));
        return NULL;
    }
    int64_t L = em_tensor_size(x, batch_first ? 1 : 0), max = em_tensor_size(table, 0);
    if (L > max) {
        em_set_error(EM_ERR_SHAPE, "the input %s has %lld positions but max_len is %lld",
                     SHAPE(x, b), (long long)L, (long long)max);
        return NULL;
    }
    em_tensor *rows = em_reshape(em_narrow(table, 0, 0, L), 3,
                                 batch_first ? (int64_t[]){1, L, d} : (int64_t[]){L, 1, d});
    (void)m;
    return em_add(x, rows);
}

static em_tensor *pe_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const em_options *o = em_module_options(m);
    em_tensor *y = add_positions(m, in[0], em_module_buffer(m, "pe"), em_options_int(o, "d_model"),
                                 em_options_bool(o, "batch_first"));
    return y ? em_dropout(y, em_options_float(o, "dropout"), em_module_training(m), NULL, NULL)
             : NULL;
}

static const em_module_class pe_class = {
    .struct_size = sizeof(em_module_class), .name = "PositionalEncoding",
    .description = "adds sinusoidal position encodings, then dropout (PyTorch's "
                   "sequence-modelling tutorial)",
    .options = pe_opts, .n_options = NOPTS(pe_opts), .init = pe_init, .forward = pe_forward,
    .n_inputs = 1,
};

static const em_option_spec lpe_opts[] = {
    OPT_INT_REQ("d_model", 1, 1e9, "the embedding dim E"),
    OPT_FLOAT("dropout", 0.0, 0, 1, "dropout after the sum (training only)"),
    OPT_INT("max_len", 512, 1, 1e9, "the longest sequence (rows of weight)"),
    OPT_BOOL("batch_first", false, "inputs are (B, L, E) instead of (L, B, E)"),
};

static em_status lpe_init(em_module *m, const em_options *o) {
    int64_t d = em_options_int(o, "d_model"), len = em_options_int(o, "max_len");
    em_tensor *w = em_empty(2, (int64_t[]){len, d}, EM_F32, em_cpu());
    em_status st = em_module_add_parameter(m, "weight", w);
    return st == EM_OK ? em_init_normal_(w, 0.0, 1.0, NULL) : st;
}

static em_tensor *lpe_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const em_options *o = em_module_options(m);
    if (layers_check_float_input(in[0], em_module_parameter(m, "weight")) != EM_OK) return NULL;
    em_tensor *y = add_positions(m, in[0], em_module_parameter(m, "weight"),
                                 em_options_int(o, "d_model"), em_options_bool(o, "batch_first"));
    return y ? em_dropout(y, em_options_float(o, "dropout"), em_module_training(m), NULL, NULL)
             : NULL;
}

static const em_module_class lpe_class = {
    .struct_size = sizeof(em_module_class), .name = "LearnedPositionalEncoding",
    .description = "adds a learned embedding of each position (an nn.Embedding(max_len, "
                   "d_model) over arange(L)), then dropout",
    .options = lpe_opts, .n_options = NOPTS(lpe_opts), .init = lpe_init, .forward = lpe_forward,
    .n_inputs = 1,
};

const em_module_class *const layers_attn[] = {&mha_class, &enc_layer_class, &enc_class,
                                              &pe_class, &lpe_class, NULL};
