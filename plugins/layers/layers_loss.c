/*
 * layers_loss.c — losses as module classes whose forward takes (input, target):
 * CrossEntropyLoss, NLLLoss, MSELoss, L1Loss, SmoothL1Loss, BCEWithLogitsLoss.
 *
 * CrossEntropyLoss takes LOGITS: it applies log_softmax itself, so a model must not end in
 * Softmax (the probabilities would be squashed twice and learning stalls) — end it in the last
 * Linear. Targets are class indices (int64) or class probabilities (floating, input's shape).
 *
 * Class weights (and BCEWithLogitsLoss's pos_weight) come from the `weight` / `pos_weight`
 * options (up to 8 values) or, for more classes, from a buffer of that name the program adds
 * after creation (em_module_add_buffer(loss, "weight", w, true)); either way they are
 * persistent buffers, in the state dict as PyTorch's are.
 *
 * The regression losses refuse a target whose shape differs from the input's: PyTorch only
 * warns and broadcasts ([32, 1] against [32] gives a [32, 32] loss), a silent wrong answer.
 */
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/tensor.h"
#include "layers.h"

static const em_option_spec ce_opts[] = {
    OPT_CHOICE("reduction", "mean", layers_reductions, "none, mean or sum"),
    OPT_INT("ignore_index", -100, -1e18, 1e18, "a target value that contributes nothing"),
    OPT_FLOAT("label_smoothing", 0.0, 0, 1, "mix the target with the uniform distribution"),
    OPT_FLOATS("weight", "per-class weights (or add a 'weight' buffer)"),
};

static const em_option_spec nll_opts[] = {
    OPT_CHOICE("reduction", "mean", layers_reductions, "none, mean or sum"),
    OPT_INT("ignore_index", -100, -1e18, 1e18, "a target value that contributes nothing"),
    OPT_FLOATS("weight", "per-class weights (or add a 'weight' buffer)"),
};

static const em_option_spec red_opts[] = {
    OPT_CHOICE("reduction", "mean", layers_reductions, "none, mean or sum"),
};

static const em_option_spec smooth_opts[] = {
    OPT_CHOICE("reduction", "mean", layers_reductions, "none, mean or sum"),
    OPT_FLOAT("beta", 1.0, 0, 1e30, "where the loss changes from quadratic to linear"),
};

static const em_option_spec bce_opts[] = {
    OPT_CHOICE("reduction", "mean", layers_reductions, "none, mean or sum"),
    OPT_FLOATS("weight", "a weight per element, broadcast (or add a 'weight' buffer)"),
    OPT_FLOATS("pos_weight", "weight of positive examples per class (or a buffer)"),
};

/* Weight buffers from the FLOATS options. */
static em_status weights_init(em_module *m, const em_options *o) {
    static const char *const names[] = {"weight", "pos_weight"};
    for (int i = 0; i < 2; i++) {
        if (!em_options_has(o, names[i]))
            continue;
        bool made;
        em_tensor *t = layers_floats_tensor(o, names[i], &made);
        if (made) {
            em_status st = t ? em_module_add_buffer(m, names[i], t, true) : em_last_status();
            if (st != EM_OK)
                return st;
        }
    }
    return EM_OK;
}

/* A weight buffer in the input's dtype (NULL when none). */
static em_tensor *weight_for(em_module *m, const char *name, const em_tensor *input) {
    em_tensor *w = em_module_buffer(m, name);
    return w ? em_to_dtype(w, em_tensor_dtype(input)) : NULL;
}

static em_tensor *ce_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const em_options *o = em_module_options(m);
    em_tensor *w = weight_for(m, "weight", in[0]);
    if (!w && em_module_buffer(m, "weight"))
        return NULL;
    return em_cross_entropy(in[0], in[1], w, layers_reduction(o),
                            em_options_int(o, "ignore_index"),
                            em_options_float(o, "label_smoothing"));
}

static em_tensor *nll_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const em_options *o = em_module_options(m);
    em_tensor *w = weight_for(m, "weight", in[0]);
    if (!w && em_module_buffer(m, "weight"))
        return NULL;
    return em_nll_loss(in[0], in[1], w, layers_reduction(o),
                       em_options_int(o, "ignore_index"));
}

/* The regression losses' shape rule (see the purpose block). */
static bool same_shape(const em_tensor *a, const em_tensor *b) {
    char sa[128], sb[128];
    int na = em_tensor_ndim(a), nb = em_tensor_ndim(b);
    if (na == nb && memcmp(em_tensor_shape(a), em_tensor_shape(b), sizeof(int64_t) * (size_t)na) == 0)
        return true;
    em_shape_str(na, em_tensor_shape(a), sa, sizeof sa);
    em_shape_str(nb, em_tensor_shape(b), sb, sizeof sb);
    em_set_error(EM_ERR_SHAPE, "using a target size (%s) that is different to the input size "
                 "(%s) would broadcast and give a wrong loss; reshape the target to the input's "
                 "shape", sb, sa);
    return false;
}

static em_tensor *mse_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    if (!same_shape(in[0], in[1]))
        return NULL;
    return em_mse_loss(in[0], in[1], layers_reduction(em_module_options(m)));
}

static em_tensor *l1_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    if (!same_shape(in[0], in[1]))
        return NULL;
    return em_l1_loss(in[0], in[1], layers_reduction(em_module_options(m)));
}

static em_tensor *smooth_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    if (!same_shape(in[0], in[1]))
        return NULL;
    const em_options *o = em_module_options(m);
    return em_smooth_l1_loss(in[0], in[1], layers_reduction(o), em_options_float(o, "beta"));
}

static em_tensor *bce_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    if (!same_shape(in[0], in[1]))
        return NULL;
    em_tensor *w = weight_for(m, "weight", in[0]);
    if (!w && em_module_buffer(m, "weight"))
        return NULL;
    em_tensor *pw = weight_for(m, "pos_weight", in[0]);
    if (!pw && em_module_buffer(m, "pos_weight"))
        return NULL;
    return em_binary_cross_entropy_with_logits(in[0], in[1], w, pw,
                                               layers_reduction(em_module_options(m)));
}

#define LOSS_CLASS(var, nm, desc, opts, init_fn, fwd)                                         \
    static const em_module_class var = {                                                     \
        .struct_size = sizeof(em_module_class), .name = nm, .description = desc,             \
        .options = opts, .n_options = NOPTS(opts), .init = init_fn, .forward = fwd,          \
        .n_inputs = 2,                                                                       \
    };

LOSS_CLASS(ce_class, "CrossEntropyLoss",
           "log_softmax + NLL on LOGITS (torch.nn.CrossEntropyLoss): do not end the model in "
           "Softmax", ce_opts, weights_init, ce_forward)
LOSS_CLASS(nll_class, "NLLLoss", "negative log-likelihood of log-probabilities (torch.nn.NLLLoss)",
           nll_opts, weights_init, nll_forward)
LOSS_CLASS(mse_class, "MSELoss", "mean squared error (torch.nn.MSELoss)", red_opts, NULL,
           mse_forward)
LOSS_CLASS(l1_class, "L1Loss", "mean absolute error (torch.nn.L1Loss)", red_opts, NULL,
           l1_forward)
LOSS_CLASS(smooth_class, "SmoothL1Loss", "Huber-like loss (torch.nn.SmoothL1Loss)", smooth_opts,
           NULL, smooth_forward)
LOSS_CLASS(bce_class, "BCEWithLogitsLoss",
           "sigmoid + binary cross entropy on logits (torch.nn.BCEWithLogitsLoss)", bce_opts,
           weights_init, bce_forward)

const em_module_class *const layers_losses[] = {
    &ce_class, &nll_class, &mse_class, &l1_class, &smooth_class, &bce_class, NULL,
};
