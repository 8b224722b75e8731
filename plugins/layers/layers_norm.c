/*
 * layers_norm.c — layers whose behaviour depends on train/eval mode or that normalise:
 * BatchNorm1d, BatchNorm2d, LayerNorm, GroupNorm and Dropout. GroupNorm (torch.nn.GroupNorm):
 * weight (ones) and bias (zeros) of num_channels when affine, no buffers, the same in train
 * and eval.
 *
 * BatchNorm follows torch.nn.BatchNorm*d: parameters weight (ones) and bias (zeros) when
 * affine; buffers running_mean (zeros), running_var (ones) and num_batches_tracked (int64,
 * 0-dim) when track_running_stats. In training the batch statistics normalise and the running
 * ones are updated in place (momentum, or with momentum 'none' the cumulative average
 * 1/num_batches_tracked); in eval the running statistics normalise — or the batch's, when
 * they are not tracked. A training batch with one value per channel cannot be normalised and
 * is an error that points at its usual cause, a last batch of one sample (drop_last).
 */
#include "ember/autograd.h"
#include "ember/comm.h"
#include "ember/ddp.h"
#include "ember/device.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/tensor.h"
#include "layers.h"

/* ---- BatchNorm ---------------------------------------------------------------------------------- */

static const char *const none_choice[] = {"none", NULL};

static const em_option_spec bn_opts[] = {
    OPT_INT_REQ("num_features", 1, 1e9, "C of an input (N, C, ...)"),
    OPT_FLOAT("eps", 1e-5, 0, 1, "added to the variance for stability"),
    {.name = "momentum", .types = EM_OPT_FLOAT | EM_OPT_STRING, .def_type = EM_OPT_FLOAT,
     .def = {.f = 0.1}, .has_range = true, .min = 0, .max = 1, .choices = none_choice,
     .help = "running-stat update factor, or 'none' for a cumulative average"},
    OPT_BOOL("affine", true, "learn a per-channel scale and shift"),
    OPT_BOOL("track_running_stats", true, "keep running mean and variance for eval"),
};

typedef struct bn_state {
    int min_ndim, max_ndim; /* 2..3 for 1d, 4..4 for 2d */
    int64_t c;
    double eps, momentum;   /* momentum < 0: cumulative average */
    bool track;
} bn_state;

static em_status bn_init_common(em_module *m, const em_options *o, int lo, int hi) {
    bn_state *s = em_module_state(m);
    s->min_ndim = lo;
    s->max_ndim = hi;
    s->c = em_options_int(o, "num_features");
    s->eps = em_options_float(o, "eps");
    s->momentum = em_options_type(o, "momentum") == EM_OPT_STRING ? -1.0
                                                                  : em_options_float(o, "momentum");
    s->track = em_options_bool(o, "track_running_stats");
    int64_t shape[1] = {s->c};
    em_status st = EM_OK;
    if (em_options_bool(o, "affine")) {
        em_tensor *w = em_ones(1, shape, EM_F32, em_cpu());
        em_tensor *b = em_zeros(1, shape, EM_F32, em_cpu());
        if ((st = em_module_add_parameter(m, "weight", w)) != EM_OK ||
            (st = em_module_add_parameter(m, "bias", b)) != EM_OK)
            return st;
    }
    if (s->track) {
        em_tensor *rm = em_zeros(1, shape, EM_F32, em_cpu());
        em_tensor *rv = em_ones(1, shape, EM_F32, em_cpu());
        em_tensor *nb = em_zeros(0, NULL, EM_I64, em_cpu());
        if ((st = em_module_add_buffer(m, "running_mean", rm, true)) != EM_OK ||
            (st = em_module_add_buffer(m, "running_var", rv, true)) != EM_OK ||
            (st = em_module_add_buffer(m, "num_batches_tracked", nb, true)) != EM_OK)
            return st;
    }
    return EM_OK;
}

static em_status bn1d_init(em_module *m, const em_options *o) { return bn_init_common(m, o, 2, 3); }
static em_status bn2d_init(em_module *m, const em_options *o) { return bn_init_common(m, o, 4, 4); }

static em_tensor *bn_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    bn_state *s = em_module_state(m);
    const char *cls = em_module_class_of(m)->name;
    const em_tensor *x = in[0];
    int nd = em_tensor_ndim(x);
    char shape[128];
    em_shape_str(nd, em_tensor_shape(x), shape, sizeof shape);
    if (nd < s->min_ndim || nd > s->max_ndim) {
        em_set_error(EM_ERR_SHAPE, "expected %s input (got %dD input of shape %s)",
                     s->min_ndim == s->max_ndim ? "4D" : "2D or 3D", nd, shape);
        return NULL;
    }
    if (em_tensor_size(x, 1) != s->c) {
        em_set_error(EM_ERR_SHAPE, "expected %lld channels (num_features) but the input %s has "
                     "%lld in dim 1", (long long)s->c, shape, (long long)em_tensor_size(x, 1));
        return NULL;
    }
    bool training = em_module_training(m);
    bool use_batch = training || !s->track;
    if (training && em_tensor_numel(x) / (s->c ? s->c : 1) <= 1) {
        em_set_error(EM_ERR_SHAPE, "expected more than 1 value per channel when training, got "
                     "input size %s; %s cannot normalise a batch of one sample by its own "
                     "statistics: drop the incomplete last batch (drop_last) or use a batch "
                     "size above 1, or call eval()", shape, cls);
        return NULL;
    }
    em_tensor *rm = s->track ? em_module_buffer(m, "running_mean") : NULL;
    em_tensor *rv = s->track ? em_module_buffer(m, "running_var") : NULL;
    double factor = 0.0;
    if (training && s->track) {
        em_tensor *nb = em_module_buffer(m, "num_batches_tracked");
        em_grad_mode_push(EM_GRAD_DISABLED);
        em_status st = em_add_scalar_(nb, 1.0);
        em_grad_mode_pop();
        if (st != EM_OK)
            return NULL;
        factor = s->momentum >= 0 ? s->momentum : 1.0 / em_item(nb);
    }
    em_tensor *out = NULL;
    /* Training: the batch statistics normalise and the running ones (when tracked) are
     * updated in place; eval: the running ones normalise, or without tracking (rm, rv NULL)
     * the batch's, and nothing is updated. */
    if (em_batch_norm(x, em_module_parameter(m, "weight"), em_module_parameter(m, "bias"), rm,
                      rv, use_batch, factor, s->eps, &out, NULL, NULL) != EM_OK)
        return NULL;
    return out;
}

static const em_module_class bn1d_class = {
    .struct_size = sizeof(em_module_class), .name = "BatchNorm1d",
    .description = "batch normalisation of (N, C) or (N, C, L) (torch.nn.BatchNorm1d)",
    .options = bn_opts, .n_options = NOPTS(bn_opts), .state_size = sizeof(bn_state),
    .init = bn1d_init, .forward = bn_forward, .n_inputs = 1,
};

static const em_module_class bn2d_class = {
    .struct_size = sizeof(em_module_class), .name = "BatchNorm2d",
    .description = "batch normalisation of (N, C, H, W) (torch.nn.BatchNorm2d)",
    .options = bn_opts, .n_options = NOPTS(bn_opts), .state_size = sizeof(bn_state),
    .init = bn2d_init, .forward = bn_forward, .n_inputs = 1,
};

/* ---- SyncBatchNorm ------------------------------------------------------------------------------ */

/* torch.nn.SyncBatchNorm: BatchNorm's options, parameters and buffers, for (N, C, ...) inputs.
 * In training inside a data-parallel forward (em_ddp_forward, ember/ddp.h) on more than one
 * rank, the batch mean and variance are those of every rank's batch together: the per-channel
 * sums are reduced over the communicator, and so are their gradients in backward, so the
 * result equals BatchNorm on the concatenated batch. Otherwise (one process, or eval) it is
 * BatchNorm, as PyTorch's falls back when no process group runs. */

/* The sum over ranks of x, differentiable: the value is the all-reduced x, and a hook on the
 * result all-reduces the gradient flowing back, so each rank's x receives the gradient of
 * every rank's use of the total. (x - detach(x) is exactly zero: the value is the reduced
 * one bit for bit on every rank.) */
static em_tensor *grad_allreduce(const em_tensor *grad, void *user, bool *failed) {
    em_tensor *g = em_clone(grad);
    if (!g || em_comm_wait(em_comm_allreduce(user, g, EM_REDUCE_SUM)) != EM_OK) {
        *failed = true;
        return NULL;
    }
    return g;
}

static em_tensor *sum_over_ranks(em_comm *c, const em_tensor *x) {
    em_tensor *red = em_clone(em_detach(x));
    if (!red || em_comm_wait(em_comm_allreduce(c, red, EM_REDUCE_SUM)) != EM_OK) return NULL;
    em_tensor *glob = em_add(em_sub(x, em_detach(x)), red);
    if (glob && em_tensor_requires_grad(glob) &&
        em_tensor_register_hook(glob, grad_allreduce, c) != EM_OK)
        return NULL;
    return glob;
}

static em_tensor *sbn_forward(em_module *m, em_tensor *const *in, int n) {
    bn_state *s = em_module_state(m);
    em_comm *c = em_ddp_current_comm();
    if (!em_module_training(m) || !c || em_comm_size(c) < 2) return bn_forward(m, in, n);
    const em_tensor *x = in[0];
    int nd = em_tensor_ndim(x);
    char shape[128];
    em_shape_str(nd, em_tensor_shape(x), shape, sizeof shape);
    if (nd < 2 || em_tensor_size(x, 1) != s->c) {
        em_set_error(EM_ERR_SHAPE, "expected an input (N, %lld, ...), got %s", (long long)s->c,
                     shape);
        return NULL;
    }
    int dims[EM_MAX_DIMS], nr = 0;
    int64_t bshape[EM_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        if (i != 1) dims[nr++] = i;
        bshape[i] = i == 1 ? s->c : 1;
    }
    double local_n = (double)(em_tensor_numel(x) / s->c);
    /* [sum over the batch (C), count]: one reduction for both. */
    em_tensor *cnt = em_full(1, (int64_t[]){1}, local_n, em_tensor_dtype(x), em_tensor_device(x));
    const em_tensor *parts[2] = {em_sum(x, nr, dims, false), cnt};
    em_tensor *g1 = sum_over_ranks(c, em_cat(2, parts, 0));
    if (!g1) return NULL;
    em_tensor *ntot_t = em_narrow(g1, 0, s->c, 1);
    double ntot = em_item(ntot_t);
    if (ntot <= 1) {
        em_set_error(EM_ERR_SHAPE, "expected more than 1 value per channel over all ranks when "
                     "training, got %g", ntot);
        return NULL;
    }
    em_tensor *mean = em_div_scalar(em_narrow(g1, 0, 0, s->c), ntot);       /* (C) */
    em_tensor *xc = em_sub(x, em_reshape(mean, nd, bshape));                 /* (N, C, ...) */
    em_tensor *var = em_div_scalar(sum_over_ranks(c, em_sum(em_mul(xc, xc), nr, dims, false)),
                                   ntot);                                    /* (C), biased */
    if (!var) return NULL;
    em_tensor *y = em_mul(xc, em_reshape(em_rsqrt(em_add_scalar(var, s->eps)), nd, bshape));
    em_tensor *w = em_module_parameter(m, "weight"), *b = em_module_parameter(m, "bias");
    if (w) y = em_mul(y, em_reshape(w, nd, bshape));
    if (b) y = em_add(y, em_reshape(b, nd, bshape));
    if (!y) return NULL;
    if (s->track) {
        em_tensor *rm = em_module_buffer(m, "running_mean"), *rv = em_module_buffer(m, "running_var");
        em_tensor *nb = em_module_buffer(m, "num_batches_tracked");
        em_grad_mode_push(EM_GRAD_DISABLED);
        em_status st = em_add_scalar_(nb, 1.0);
        double f = s->momentum >= 0 ? s->momentum : 1.0 / em_item(nb);
        if (st == EM_OK) st = em_mul_scalar_(rm, 1.0 - f);
        if (st == EM_OK) st = em_add_(rm, em_mul_scalar(em_detach(mean), f));
        if (st == EM_OK) st = em_mul_scalar_(rv, 1.0 - f);
        if (st == EM_OK) st = em_add_(rv, em_mul_scalar(em_detach(var), f * ntot / (ntot - 1)));
        em_grad_mode_pop();
        if (st != EM_OK) return NULL;
    }
    return y;
}

static em_status sbn_init(em_module *m, const em_options *o) { return bn_init_common(m, o, 2, 5); }

static const em_module_class sbn_class = {
    .struct_size = sizeof(em_module_class), .name = "SyncBatchNorm",
    .description = "batch normalisation with statistics over every rank (torch.nn.SyncBatchNorm)",
    .options = bn_opts, .n_options = NOPTS(bn_opts), .state_size = sizeof(bn_state),
    .init = sbn_init, .forward = sbn_forward, .n_inputs = 1,
};

/* ---- LayerNorm --------------------------------------------------------------------------------- */

static const em_option_spec ln_opts[] = {
    {.name = "normalized_shape", .types = EM_OPT_INTS, .required = true, .has_range = true,
     .min = 1, .max = 1e9, .help = "the trailing dims to normalise: d or [d1, d2, ...]"},
    OPT_FLOAT("eps", 1e-5, 0, 1, "added to the variance for stability"),
    OPT_BOOL("elementwise_affine", true, "learn a per-element scale (and shift)"),
    OPT_BOOL("bias", true, "learn the shift (with elementwise_affine)"),
};

typedef struct ln_state {
    int nd;
    int64_t shape[EM_OPT_MAX_LIST];
    double eps;
} ln_state;

static em_status ln_init(em_module *m, const em_options *o) {
    ln_state *s = em_module_state(m);
    s->nd = em_options_ints(o, "normalized_shape", s->shape, EM_OPT_MAX_LIST);
    s->eps = em_options_float(o, "eps");
    if (s->nd < 1)
        return em_set_error(EM_ERR_INVALID, "LayerNorm: normalized_shape needs at least one dim");
    if (!em_options_bool(o, "elementwise_affine"))
        return EM_OK;
    em_status st = em_module_add_parameter(m, "weight", em_ones(s->nd, s->shape, EM_F32,
                                                                em_cpu()));
    if (st == EM_OK && em_options_bool(o, "bias"))
        st = em_module_add_parameter(m, "bias", em_zeros(s->nd, s->shape, EM_F32, em_cpu()));
    return st;
}

static em_tensor *ln_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    ln_state *s = em_module_state(m);
    em_tensor *out = NULL;
    if (em_layer_norm(in[0], s->nd, s->shape, em_module_parameter(m, "weight"),
                      em_module_parameter(m, "bias"), s->eps, &out, NULL, NULL) != EM_OK)
        return NULL;
    return out;
}

static const em_module_class ln_class = {
    .struct_size = sizeof(em_module_class), .name = "LayerNorm",
    .description = "layer normalisation over the trailing dims (torch.nn.LayerNorm)",
    .options = ln_opts, .n_options = NOPTS(ln_opts), .state_size = sizeof(ln_state),
    .init = ln_init, .forward = ln_forward, .n_inputs = 1,
};

/* ---- GroupNorm ---------------------------------------------------------------------------------- */

static const em_option_spec gn_opts[] = {
    OPT_INT_REQ("num_groups", 1, 1e9, "groups the channels are split into"),
    OPT_INT_REQ("num_channels", 1, 1e9, "C of an input (N, C, ...); num_groups must divide it"),
    OPT_FLOAT("eps", 1e-5, 0, 1, "added to the variance for stability"),
    OPT_BOOL("affine", true, "learn a per-channel scale (weight, ones) and shift (bias, zeros)"),
};

static em_status gn_init(em_module *m, const em_options *o) {
    int64_t G = em_options_int(o, "num_groups"), C = em_options_int(o, "num_channels");
    if (C % G)
        return em_set_error(EM_ERR_INVALID, "GroupNorm: num_groups=%lld must divide "
                            "num_channels=%lld", (long long)G, (long long)C);
    if (!em_options_bool(o, "affine"))
        return EM_OK;
    em_status st = em_module_add_parameter(m, "weight", em_ones(1, &C, EM_F32, em_cpu()));
    if (st == EM_OK)
        st = em_module_add_parameter(m, "bias", em_zeros(1, &C, EM_F32, em_cpu()));
    return st;
}

static em_tensor *gn_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const em_options *o = em_module_options(m);
    const em_tensor *x = in[0];
    int64_t C = em_options_int(o, "num_channels");
    if (x && (em_tensor_ndim(x) < 2 || em_tensor_shape(x)[1] != C)) {
        char b[160];
        em_set_error(EM_ERR_SHAPE, "GroupNorm: expected an input (N, %lld, ...), got %s",
                     (long long)C, em_shape_str(em_tensor_ndim(x), em_tensor_shape(x), b, sizeof b));
        return NULL;
    }
    return em_group_norm(x, em_options_int(o, "num_groups"), em_module_parameter(m, "weight"),
                         em_module_parameter(m, "bias"), em_options_float(o, "eps"));
}

static const em_module_class gn_class = {
    .struct_size = sizeof(em_module_class), .name = "GroupNorm",
    .description = "group normalisation over channel groups (torch.nn.GroupNorm)",
    .options = gn_opts, .n_options = NOPTS(gn_opts), .init = gn_init, .forward = gn_forward,
    .n_inputs = 1,
};

/* ---- Dropout ----------------------------------------------------------------------------------- */

static const em_option_spec dropout_opts[] = {
    OPT_FLOAT("p", 0.5, 0, 1, "probability of an element being zeroed"),
    OPT_BOOL("inplace", false, "accepted for PyTorch configs; the result is always a new tensor"),
};

/* Training: the dropout op, x * (mask / (1 - p)) with mask ~ Bernoulli(1 - p) from the
 * default generator (PyTorch's F.dropout; its backward is one product, the grad times the
 * scaled mask); eval (or p = 0): x itself. */
static em_tensor *dropout_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    double p = em_options_float(em_module_options(m), "p");
    em_tensor *x = in[0];
    if (!em_module_training(m) || p == 0.0)
        return em_tensor_retain(x);
    if (p == 1.0)
        return em_mul_scalar(x, 0.0);
    return em_dropout(x, p, true, NULL, NULL);
}

static const em_module_class dropout_class = {
    .struct_size = sizeof(em_module_class), .name = "Dropout",
    .description = "zeroes elements with probability p in training (torch.nn.Dropout)",
    .options = dropout_opts, .n_options = NOPTS(dropout_opts), .forward = dropout_forward,
    .n_inputs = 1,
};

const em_module_class *const layers_norm[] = {
    &bn1d_class, &bn2d_class, &sbn_class, &ln_class, &gn_class, &dropout_class, NULL,
};
