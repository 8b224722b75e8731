/*
 * optimizers.c — SGD, Adam, AdamW, RMSprop and Adagrad, step for step as PyTorch 1.13's
 * single-tensor (foreach=False) implementations in torch/optim/<name>.py, written with the public
 * ops so they run on every device that has the elementwise kernels.
 *
 * Each step walks the groups, reads the group's hyper-parameters from its options, and
 * updates every parameter that has a .grad (parameters without one are skipped and keep
 * their state, their step count included, as in PyTorch). State tensors are created on first
 * use with the parameter's shape, dtype and device, under PyTorch's names (momentum_buffer,
 * exp_avg, exp_avg_sq, max_exp_avg_sq, square_avg, grad_avg, sum) plus "step", a 0-dim f64
 * count on the CPU (PyTorch keeps a float32 tensor, which stops counting at 2^24).
 * PyTorch's fused forms (add with alpha, addcmul, addcdiv) are written as two or three ops;
 * the results differ from PyTorch's in the last bits only.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "optim_plugin.h"

/* Largest double below 1: the upper end of [0, 1) ranges. */
#define BELOW_ONE 0.99999999999999989

/* ---- helpers --------------------------------------------------------------------------------- */

/* The per-parameter state tensor `name`, created (zeros, or filled with `init`, like p) on
 * first use. Borrowed (the optimizer holds it). */
static em_tensor *state_like(em_optimizer *o, int index, const char *name, const em_tensor *p,
                             double init) {
    em_tensor *t = em_optimizer_state(o, index, name);
    if (t) return t;
    t = em_zeros_like(p);
    if (!t) return NULL;
    if (init != 0 && em_fill_(t, init) != EM_OK) return NULL;
    if (em_optimizer_set_state(o, index, name, t) != EM_OK) return NULL;
    return t;
}

/* Increment the parameter's "step" count and return the new value (NaN on error). */
static double step_count(em_optimizer *o, int index) {
    em_tensor *t = em_optimizer_state(o, index, "step");
    if (!t) {
        if (!(t = em_zeros(0, NULL, EM_F64, em_cpu()))) return NAN;
        if (em_optimizer_set_state(o, index, "step", t) != EM_OK) return NAN;
    }
    double v = 0;
    if (em_tensor_item(t, &v) != EM_OK) return NAN;
    v += 1;
    if (em_fill_(t, v) != EM_OK) return NAN;
    return v;
}

/* The grad to use: negated when maximizing, plus weight_decay * p when wd != 0. A new
 * reference in the caller's scope (or the borrowed grad itself when unchanged). */
static const em_tensor *effective_grad(const em_tensor *p, const em_tensor *grad, bool maximize,
                                       double wd) {
    const em_tensor *g = maximize ? em_neg(grad) : grad;
    if (wd != 0) g = em_add(g, em_mul_scalar(p, wd));
    return g;
}

/* a += alpha * b */
static em_status add_scaled_(em_tensor *a, const em_tensor *b, double alpha) {
    return em_add_(a, alpha == 1.0 ? b : em_mul_scalar(b, alpha));
}

/* ---- option checks shared by the classes ------------------------------------------------------- */

static em_status check_betas(const em_options *opts, const char *where) {
    double b[EM_OPT_MAX_LIST];
    int n = em_options_floats(opts, "betas", b, EM_OPT_MAX_LIST);
    if (n != 2)
        return em_set_error(EM_ERR_INVALID, "%s: option 'betas' needs 2 values (beta1, beta2), "
                            "got %d", where, n);
    return EM_OK;
}

static em_status sgd_validate(const em_options *opts, const char *where) {
    if (em_options_bool(opts, "nesterov") &&
        (em_options_float(opts, "momentum") <= 0 || em_options_float(opts, "dampening") != 0))
        return em_set_error(EM_ERR_INVALID, "%s: nesterov momentum requires a momentum > 0 and "
                            "zero dampening (momentum %g, dampening %g)", where,
                            em_options_float(opts, "momentum"),
                            em_options_float(opts, "dampening"));
    return EM_OK;
}

/* ---- SGD ------------------------------------------------------------------------------------- */

static em_status sgd_step(em_optimizer *o) {
    for (int g = 0; g < em_optimizer_group_count(o); g++) {
        const em_options *op = em_optimizer_group_options(o, g);
        double lr = em_options_float(op, "lr"), momentum = em_options_float(op, "momentum");
        double dampening = em_options_float(op, "dampening");
        double wd = em_options_float(op, "weight_decay");
        bool nesterov = em_options_bool(op, "nesterov"), maximize = em_options_bool(op, "maximize");
        for (int i = 0; i < em_optimizer_param_count(o, g); i++) {
            int idx;
            em_tensor *p = em_optimizer_param(o, g, i, &idx, NULL);
            const em_tensor *grad = em_tensor_grad(p);
            if (!grad) continue;
            em_scope_begin();
            em_status st = EM_OK;
            const em_tensor *d_p = effective_grad(p, grad, maximize, wd);
            if (d_p && momentum != 0) {
                em_tensor *buf = em_optimizer_state(o, idx, "momentum_buffer");
                if (!buf) {
                    buf = em_clone(d_p);
                    st = buf ? em_optimizer_set_state(o, idx, "momentum_buffer", buf)
                             : em_last_status();
                } else if ((st = em_mul_scalar_(buf, momentum)) == EM_OK) {
                    st = add_scaled_(buf, d_p, 1 - dampening);
                }
                if (st == EM_OK) d_p = nesterov ? em_add(d_p, em_mul_scalar(buf, momentum)) : buf;
            }
            if (st == EM_OK) st = d_p ? add_scaled_(p, d_p, -lr) : em_last_status();
            em_scope_end();
            if (st != EM_OK) return st;
        }
    }
    return EM_OK;
}

static const em_option_spec sgd_options[] = {
    {.name = "lr", .types = EM_OPT_FLOAT, .required = true,
     .help = "learning rate"},
    {.name = "momentum", .types = EM_OPT_FLOAT, .def = {.f = 0}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "momentum factor"},
    {.name = "dampening", .types = EM_OPT_FLOAT, .def = {.f = 0},
     .help = "dampening for momentum"},
    {.name = "weight_decay", .types = EM_OPT_FLOAT, .def = {.f = 0}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "weight decay (L2 penalty)"},
    {.name = "nesterov", .types = EM_OPT_BOOL, .def = {.b = false},
     .help = "Nesterov momentum (needs momentum > 0 and dampening 0)"},
    {.name = "maximize", .types = EM_OPT_BOOL, .def = {.b = false},
     .help = "maximize the objective instead of minimizing it"},
};

/* ---- Adam and AdamW --------------------------------------------------------------------------- */

static em_status adam_like_step(em_optimizer *o, bool decoupled) {
    for (int g = 0; g < em_optimizer_group_count(o); g++) {
        const em_options *op = em_optimizer_group_options(o, g);
        double betas[EM_OPT_MAX_LIST];
        em_options_floats(op, "betas", betas, EM_OPT_MAX_LIST);
        double lr = em_options_float(op, "lr"), eps = em_options_float(op, "eps");
        double wd = em_options_float(op, "weight_decay"), b1 = betas[0], b2 = betas[1];
        bool amsgrad = em_options_bool(op, "amsgrad"), maximize = em_options_bool(op, "maximize");
        for (int i = 0; i < em_optimizer_param_count(o, g); i++) {
            int idx;
            em_tensor *p = em_optimizer_param(o, g, i, &idx, NULL);
            const em_tensor *grad = em_tensor_grad(p);
            if (!grad) continue;
            em_scope_begin();
            em_status st = EM_OK;
            em_tensor *exp_avg = state_like(o, idx, "exp_avg", p, 0);
            em_tensor *exp_avg_sq = state_like(o, idx, "exp_avg_sq", p, 0);
            em_tensor *max_sq = amsgrad ? state_like(o, idx, "max_exp_avg_sq", p, 0) : NULL;
            double step = step_count(o, idx);
            const em_tensor *gr;
            if (!exp_avg || !exp_avg_sq || (amsgrad && !max_sq) || isnan(step)) {
                st = em_last_status();
                goto next;
            }
            if (decoupled) {
                gr = maximize ? em_neg(grad) : grad;
                if ((st = em_mul_scalar_(p, 1 - lr * wd)) != EM_OK) goto next;
            } else {
                gr = effective_grad(p, grad, maximize, wd);
            }
            if ((st = em_mul_scalar_(exp_avg, b1)) != EM_OK ||
                (st = add_scaled_(exp_avg, gr, 1 - b1)) != EM_OK ||
                (st = em_mul_scalar_(exp_avg_sq, b2)) != EM_OK ||
                (st = add_scaled_(exp_avg_sq, em_mul(gr, gr), 1 - b2)) != EM_OK)
                goto next;
            double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            double step_size = lr / bc1, bc2_sqrt = sqrt(bc2);
            const em_tensor *sq = exp_avg_sq;
            if (amsgrad) {
                if ((st = em_copy_(max_sq, em_maximum(max_sq, exp_avg_sq))) != EM_OK) goto next;
                sq = max_sq;
            }
            em_tensor *denom = em_div_scalar(em_sqrt(sq), bc2_sqrt);
            if (!denom || (st = em_add_scalar_(denom, eps)) != EM_OK) {
                st = em_last_status();
                goto next;
            }
            st = add_scaled_(p, em_div(exp_avg, denom), -step_size);
        next:
            em_scope_end();
            if (st != EM_OK) return st;
        }
    }
    return EM_OK;
}

static em_status adam_step(em_optimizer *o) { return adam_like_step(o, false); }
static em_status adamw_step(em_optimizer *o) { return adam_like_step(o, true); }

#define ADAM_OPTIONS(default_wd)                                                                  \
    {.name = "lr", .types = EM_OPT_FLOAT, .def = {.f = 1e-3},      \
     .help = "learning rate"},                                                  \
    {.name = "betas", .types = EM_OPT_FLOATS, .def = {.n = 2, .floats = {0.9, 0.999}},           \
     .has_range = true, .min = 0, .max = BELOW_ONE,                                              \
     .help = "coefficients of the running averages of the gradient and its square"},            \
    {.name = "eps", .types = EM_OPT_FLOAT, .def = {.f = 1e-8}, .has_range = true, .min = 0,     \
     .max = INFINITY, .help = "term added to the denominator for numerical stability"},         \
    {.name = "weight_decay", .types = EM_OPT_FLOAT, .def = {.f = default_wd}, .has_range = true, \
     .min = 0, .max = INFINITY, .help = "weight decay"},                                         \
    {.name = "amsgrad", .types = EM_OPT_BOOL, .def = {.b = false},                               \
     .help = "use the AMSGrad variant (the maximum of past squared-gradient averages)"},        \
    {.name = "maximize", .types = EM_OPT_BOOL, .def = {.b = false},                              \
     .help = "maximize the objective instead of minimizing it"}

static const em_option_spec adam_options[] = {ADAM_OPTIONS(0)};
static const em_option_spec adamw_options[] = {ADAM_OPTIONS(1e-2)};

/* ---- RMSprop --------------------------------------------------------------------------------- */

static em_status rmsprop_step(em_optimizer *o) {
    for (int g = 0; g < em_optimizer_group_count(o); g++) {
        const em_options *op = em_optimizer_group_options(o, g);
        double lr = em_options_float(op, "lr"), alpha = em_options_float(op, "alpha");
        double eps = em_options_float(op, "eps"), wd = em_options_float(op, "weight_decay");
        double momentum = em_options_float(op, "momentum");
        bool centered = em_options_bool(op, "centered"), maximize = em_options_bool(op, "maximize");
        for (int i = 0; i < em_optimizer_param_count(o, g); i++) {
            int idx;
            em_tensor *p = em_optimizer_param(o, g, i, &idx, NULL);
            const em_tensor *grad = em_tensor_grad(p);
            if (!grad) continue;
            em_scope_begin();
            em_status st = EM_OK;
            em_tensor *square_avg = state_like(o, idx, "square_avg", p, 0), *avg;
            const em_tensor *gr = effective_grad(p, grad, maximize, wd);
            if (!square_avg || !gr || isnan(step_count(o, idx))) {
                st = em_last_status();
                goto next;
            }
            if ((st = em_mul_scalar_(square_avg, alpha)) != EM_OK ||
                (st = add_scaled_(square_avg, em_mul(gr, gr), 1 - alpha)) != EM_OK)
                goto next;
            if (centered) {
                em_tensor *grad_avg = state_like(o, idx, "grad_avg", p, 0);
                if (!grad_avg || (st = em_mul_scalar_(grad_avg, alpha)) != EM_OK ||
                    (st = add_scaled_(grad_avg, gr, 1 - alpha)) != EM_OK) {
                    st = st != EM_OK ? st : em_last_status();
                    goto next;
                }
                avg = em_sqrt(em_sub(square_avg, em_mul(grad_avg, grad_avg)));
            } else {
                avg = em_sqrt(square_avg);
            }
            if (!avg || (st = em_add_scalar_(avg, eps)) != EM_OK) {
                st = st != EM_OK ? st : em_last_status();
                goto next;
            }
            if (momentum > 0) {
                em_tensor *buf = state_like(o, idx, "momentum_buffer", p, 0);
                if (!buf || (st = em_mul_scalar_(buf, momentum)) != EM_OK ||
                    (st = em_add_(buf, em_div(gr, avg))) != EM_OK) {
                    st = st != EM_OK ? st : em_last_status();
                    goto next;
                }
                st = add_scaled_(p, buf, -lr);
            } else {
                st = add_scaled_(p, em_div(gr, avg), -lr);
            }
        next:
            em_scope_end();
            if (st != EM_OK) return st;
        }
    }
    return EM_OK;
}

static const em_option_spec rmsprop_options[] = {
    {.name = "lr", .types = EM_OPT_FLOAT, .def = {.f = 1e-2},
     .help = "learning rate"},
    {.name = "alpha", .types = EM_OPT_FLOAT, .def = {.f = 0.99}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "smoothing constant of the squared-gradient average"},
    {.name = "eps", .types = EM_OPT_FLOAT, .def = {.f = 1e-8}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "term added to the denominator for numerical stability"},
    {.name = "weight_decay", .types = EM_OPT_FLOAT, .def = {.f = 0}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "weight decay (L2 penalty)"},
    {.name = "momentum", .types = EM_OPT_FLOAT, .def = {.f = 0}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "momentum factor"},
    {.name = "centered", .types = EM_OPT_BOOL, .def = {.b = false},
     .help = "normalise by the estimated variance of the gradient"},
    {.name = "maximize", .types = EM_OPT_BOOL, .def = {.b = false},
     .help = "maximize the objective instead of minimizing it"},
};

/* ---- Adagrad --------------------------------------------------------------------------------- */

static em_status adagrad_step(em_optimizer *o) {
    for (int g = 0; g < em_optimizer_group_count(o); g++) {
        const em_options *op = em_optimizer_group_options(o, g);
        double lr = em_options_float(op, "lr"), lr_decay = em_options_float(op, "lr_decay");
        double wd = em_options_float(op, "weight_decay"), eps = em_options_float(op, "eps");
        double init = em_options_float(op, "initial_accumulator_value");
        bool maximize = em_options_bool(op, "maximize");
        for (int i = 0; i < em_optimizer_param_count(o, g); i++) {
            int idx;
            em_tensor *p = em_optimizer_param(o, g, i, &idx, NULL);
            const em_tensor *grad = em_tensor_grad(p);
            if (!grad) continue;
            em_scope_begin();
            em_status st = EM_OK;
            /* PyTorch fills "sum" when the optimizer is made; here on first use, same values. */
            em_tensor *sum = state_like(o, idx, "sum", p, init);
            double step = step_count(o, idx);
            const em_tensor *gr = effective_grad(p, grad, maximize, wd);
            if (!sum || isnan(step) || !gr) {
                st = em_last_status();
            } else if ((st = em_add_(sum, em_mul(gr, gr))) == EM_OK) {
                double clr = lr / (1 + (step - 1) * lr_decay);
                em_tensor *std = em_sqrt(sum);
                if (!std || (st = em_add_scalar_(std, eps)) != EM_OK)
                    st = st != EM_OK ? st : em_last_status();
                else
                    st = add_scaled_(p, em_div(gr, std), -clr);
            }
            em_scope_end();
            if (st != EM_OK) return st;
        }
    }
    return EM_OK;
}

static const em_option_spec adagrad_options[] = {
    {.name = "lr", .types = EM_OPT_FLOAT, .def = {.f = 1e-2},
     .help = "learning rate"},
    {.name = "lr_decay", .types = EM_OPT_FLOAT, .def = {.f = 0}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "learning rate decay"},
    {.name = "weight_decay", .types = EM_OPT_FLOAT, .def = {.f = 0}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "weight decay (L2 penalty)"},
    {.name = "initial_accumulator_value", .types = EM_OPT_FLOAT, .def = {.f = 0},
     .has_range = true, .min = 0, .max = INFINITY, .help = "starting value of the sum of squares"},
    {.name = "eps", .types = EM_OPT_FLOAT, .def = {.f = 1e-10}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "term added to the denominator for numerical stability"},
    {.name = "maximize", .types = EM_OPT_BOOL, .def = {.b = false},
     .help = "maximize the objective instead of minimizing it"},
};

/* ---- registration ------------------------------------------------------------------------------ */

#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const em_optim_class classes[] = {
    {.struct_size = sizeof(em_optim_class), .name = "SGD",
     .description = "stochastic gradient descent (momentum, dampening, Nesterov, weight decay)",
     .options = sgd_options, .n_options = N_OPTS(sgd_options), .step = sgd_step,
     .validate = sgd_validate},
    {.struct_size = sizeof(em_optim_class), .name = "Adam",
     .description = "Adam (L2 weight decay added to the gradient; AMSGrad)",
     .options = adam_options, .n_options = N_OPTS(adam_options), .step = adam_step,
     .validate = check_betas},
    {.struct_size = sizeof(em_optim_class), .name = "AdamW",
     .description = "Adam with decoupled weight decay (AMSGrad)", .options = adamw_options,
     .n_options = N_OPTS(adamw_options), .step = adamw_step, .validate = check_betas},
    {.struct_size = sizeof(em_optim_class), .name = "RMSprop",
     .description = "RMSprop (momentum, centered)", .options = rmsprop_options,
     .n_options = N_OPTS(rmsprop_options), .step = rmsprop_step},
    {.struct_size = sizeof(em_optim_class), .name = "Adagrad",
     .description = "Adagrad (lr decay, weight decay, initial accumulator)",
     .options = adagrad_options, .n_options = N_OPTS(adagrad_options), .step = adagrad_step},
};

em_status em_optim_plugin_register_optimizers(em_registry *reg) {
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        em_status st = em_optim_class_register(reg, &classes[i]);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}
