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
 *
 * SGD, Adam and AdamW run through the core's fused list ops (fused_sgd, fused_adam,
 * fused_adamw: core/ops_optim.c) wherever the parameter's device has a kernel for its dtype:
 * one call updates every parameter of a bucket (same device and dtype, and the same step
 * count for Adam / the same momentum-buffer state for SGD), with the arithmetic of the
 * op-by-op form, in the same order; the other parameters take the op-by-op form. On the fused
 * path an f16 or bf16 parameter gets f32 state (under PyTorch's names) and an f32 copy of its
 * weights, "master_param", on which the update is made; the parameter receives it rounded. A
 * parameter changed outside the optimizer since its last step (its value no longer the
 * master rounded) is taken as it is.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/optim.h"
#include "ember/options.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "optim_plugin.h"

/* A fused call updates at most this many parameters (larger buckets take several calls). */
#define FUSED_MAX 64

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

/* ---- the fused path (SGD, Adam, AdamW) ------------------------------------------------------ */

static bool low_precision(em_dtype dt) { return dt == EM_F16 || dt == EM_BF16; }

/* Whether p takes the fused path: its device has a kernel of op for its dtype and the grad
 * has the parameter's dtype and device. */
static bool fusable(const em_op *op, const em_tensor *p, const em_tensor *grad) {
    return op && em_op_has_kernel(op, em_tensor_device(p), em_tensor_dtype(p)) &&
           em_tensor_dtype(grad) == em_tensor_dtype(p) &&
           em_device_equal(em_tensor_device(grad), em_tensor_device(p));
}

/* State `name` of the fused path: f32 for f16/bf16 parameters (one of another dtype, e.g.
 * from a PyTorch state dict, is converted once), the parameter's dtype otherwise; zeros when
 * absent (*fresh set). Borrowed; NULL on error. */
static em_tensor *fused_state(em_optimizer *o, int idx, const char *name, const em_tensor *p,
                              bool *fresh) {
    em_dtype want = low_precision(em_tensor_dtype(p)) ? EM_F32 : em_tensor_dtype(p);
    em_tensor *t = em_optimizer_state(o, idx, name);
    if (fresh) *fresh = t == NULL;
    if (t && em_tensor_dtype(t) == want) return t;
    em_tensor *u = t ? em_to_dtype(t, want)
                     : em_zeros(em_tensor_ndim(p), em_tensor_shape(p), want, em_tensor_device(p));
    if (!u || em_optimizer_set_state(o, idx, name, u) != EM_OK) return NULL;
    return u;
}

/* The f32 master weights of an f16/bf16 parameter (a copy of it when absent). Borrowed. */
static em_tensor *master_weights(em_optimizer *o, int idx, const em_tensor *p) {
    em_tensor *t = em_optimizer_state(o, idx, "master_param");
    if (t && em_tensor_dtype(t) == EM_F32) return t;
    em_tensor *u = em_to_dtype(t ? t : p, EM_F32);
    if (!u || em_optimizer_set_state(o, idx, "master_param", u) != EM_OK) return NULL;
    return u;
}

/* A parameter waiting for its fused call: its output lists after the params (states, then
 * the master weights; NULL where a list is absent) and its bucket key (SGD: whether its
 * momentum buffer is new; Adam: its step count). */
typedef struct pending {
    em_tensor *p;
    const em_tensor *grad;
    em_tensor *outs[4];
    em_tensor *lr; /* the capturable forms: the group's lr on the device (input list 1) */
    double key;
    bool taken;
} pending;

static bool same_bucket(const pending *a, const pending *b) {
    return a->key == b->key && em_tensor_dtype(a->p) == em_tensor_dtype(b->p) &&
           em_device_equal(em_tensor_device(a->p), em_tensor_device(b->p));
}

static em_status fused_call(const em_op *op, pending *const *batch, int n, int n_outs,
                            const em_attr *attrs) {
    const em_tensor *in[2 * FUSED_MAX];
    em_tensor *out[5 * FUSED_MAX];
    for (int j = 0; j < n; j++) {
        in[j] = batch[j]->grad;
        in[n + j] = batch[j]->lr; /* read by the capturable forms only (2 input lists) */
        out[j] = batch[j]->p;
        for (int l = 1; l < n_outs; l++) out[l * n + j] = batch[j]->outs[l - 1];
    }
    return em_op_call_lists(op, n, in, attrs, out);
}

/* Run op over the pending parameters, one call per bucket (at most FUSED_MAX each); the
 * bucket's key goes into attribute key_attr (a bool for SGD, a float for Adam; -1: none, the
 * capturable Adam forms). */
static em_status fused_run(const em_op *op, pending *pend, int np, int n_outs, em_attr *attrs,
                           int key_attr) {
    pending *batch[FUSED_MAX];
    for (int i = 0; i < np; i++) {
        if (pend[i].taken) continue;
        if (key_attr < 0) {
        } else if (attrs[key_attr].type == EM_ATTR_BOOL) {
            attrs[key_attr].v.b = pend[i].key != 0;
        } else {
            attrs[key_attr].v.f = pend[i].key;
        }
        int n = 0;
        for (int j = i; j < np; j++) {
            if (pend[j].taken || !same_bucket(&pend[i], &pend[j])) continue;
            pend[j].taken = true;
            batch[n++] = &pend[j];
            em_status st = n == FUSED_MAX ? fused_call(op, batch, n, n_outs, attrs) : EM_OK;
            if (st != EM_OK) return st;
            if (n == FUSED_MAX) n = 0;
        }
        em_status st = n ? fused_call(op, batch, n, n_outs, attrs) : EM_OK;
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

/* ---- capturable steps ---------------------------------------------------------------------- *
 *
 * With the option capturable (SGD, Adam, AdamW; PyTorch's Adam has it), every parameter takes
 * the capturable fused form (fused_sgd_capturable, fused_adam_capturable,
 * fused_adamw_capturable: core/ops_optim.c), whose kernel reads the group's learning rate
 * from a tensor on the parameters' device (em_optimizer_lr_tensor) and Adam's step count from
 * its "step" state, kept there (a 0-dim float64 tensor on the parameter's device, incremented
 * by the kernel): nothing of the step is read or written on the host, so a step captured in a
 * graph replays as it would run. The arithmetic is the plain fused form's. A parameter that
 * cannot take it (no such kernel for its device and dtype) is an error naming it. */

/* The capturable form's refusal of p: why, naming the option. */
static em_status capturable_refused(em_optimizer *o, int idx, const em_tensor *p,
                                    const em_tensor *grad, const char *op_name) {
    char d[48];
    const char *why = !em_device_equal(em_tensor_device(grad), em_tensor_device(p))
                          ? "its grad is on another device"
                      : em_tensor_dtype(grad) != em_tensor_dtype(p)
                          ? "its grad has another dtype"
                          : "the device has no kernel of it for that dtype";
    return em_set_error(EM_ERR_NOKERNEL, "%s: capturable: parameter %d (%s on %s) cannot take "
                        "%s (%s); capturable steps run only that fused form",
                        em_optimizer_class(o)->name, idx, em_dtype_name(em_tensor_dtype(p)),
                        em_device_str(em_tensor_device(p), d, sizeof d), op_name, why);
}

/* The group's lr tensor on p's device; one device per group. Borrowed. */
static em_tensor *capturable_lr(em_optimizer *o, int g, int idx, const em_tensor *p,
                                em_tensor *have) {
    char a[48], b[48];
    if (have && !em_device_equal(em_tensor_device(have), em_tensor_device(p)))
        return em_set_error(EM_ERR_DEVICE, "%s: capturable: parameter %d is on %s but another "
                            "of group %d on %s; a capturable group's parameters share one "
                            "device (its lr tensor)", em_optimizer_class(o)->name, idx,
                            em_device_str(em_tensor_device(p), a, sizeof a), g,
                            em_device_str(em_tensor_device(have), b, sizeof b)),
               NULL;
    return have ? have : em_optimizer_lr_tensor(o, g, em_tensor_device(p));
}

/* Adam's "step" state as a 0-dim float64 tensor on p's device (moved there once, e.g. after a
 * state dict load; zero when absent). Borrowed. */
static em_tensor *device_step(em_optimizer *o, int idx, const em_tensor *p) {
    em_tensor *t = em_optimizer_state(o, idx, "step");
    if (t && em_device_equal(em_tensor_device(t), em_tensor_device(p)) &&
        em_tensor_dtype(t) == EM_F64 && em_tensor_ndim(t) == 0)
        return t;
    em_tensor *u = t ? em_to_dtype(em_to_device(t, em_tensor_device(p)), EM_F64)
                     : em_zeros(0, NULL, EM_F64, em_tensor_device(p));
    if (u && em_tensor_ndim(u) != 0) u = em_reshape(u, 0, NULL);
    if (!u || em_optimizer_set_state(o, idx, "step", u) != EM_OK) return NULL;
    return u;
}

#define F(x) {.type = EM_ATTR_FLOAT, .v.f = (x)}
#define B(x) {.type = EM_ATTR_BOOL, .v.b = (x)}

/* ---- SGD ------------------------------------------------------------------------------------- */

typedef struct sgd_hp {
    double lr, momentum, dampening, wd;
    bool nesterov, maximize;
} sgd_hp;

/* One parameter, op by op (devices or dtypes without a fused kernel). */
static em_status sgd_one(em_optimizer *o, int idx, em_tensor *p, const em_tensor *grad,
                         const sgd_hp *h) {
    em_scope_begin();
    em_status st = EM_OK;
    const em_tensor *d_p = effective_grad(p, grad, h->maximize, h->wd);
    if (d_p && h->momentum != 0) {
        em_tensor *buf = em_optimizer_state(o, idx, "momentum_buffer");
        if (!buf) {
            buf = em_clone(d_p);
            st = buf ? em_optimizer_set_state(o, idx, "momentum_buffer", buf) : em_last_status();
        } else if ((st = em_mul_scalar_(buf, h->momentum)) == EM_OK) {
            st = add_scaled_(buf, d_p, 1 - h->dampening);
        }
        if (st == EM_OK) d_p = h->nesterov ? em_add(d_p, em_mul_scalar(buf, h->momentum)) : buf;
    }
    if (st == EM_OK) st = d_p ? add_scaled_(p, d_p, -h->lr) : em_last_status();
    em_scope_end();
    return st;
}

static em_status sgd_group(em_optimizer *o, int g, const em_op *op, pending *pend) {
    const em_options *opts = em_optimizer_group_options(o, g);
    sgd_hp h = {em_options_float(opts, "lr"), em_options_float(opts, "momentum"),
                em_options_float(opts, "dampening"), em_options_float(opts, "weight_decay"),
                em_options_bool(opts, "nesterov"), em_options_bool(opts, "maximize")};
    bool cap = em_options_bool(opts, "capturable");
    if (cap && !(op = em_op_find("fused_sgd_capturable"))) return em_last_status();
    em_tensor *lr_t = NULL;
    int np = 0;
    em_status st = EM_OK;
    for (int i = 0; i < em_optimizer_param_count(o, g) && st == EM_OK; i++) {
        int idx;
        em_tensor *p = em_optimizer_param(o, g, i, &idx, NULL);
        const em_tensor *grad = em_tensor_grad(p);
        if (!grad) continue;
        if (cap && !fusable(op, p, grad)) return capturable_refused(o, idx, p, grad, em_op_name(op));
        if (cap && !(lr_t = capturable_lr(o, g, idx, p, lr_t))) return em_last_status();
        if (!fusable(op, p, grad)) {
            st = sgd_one(o, idx, p, grad, &h);
            continue;
        }
        pending *q = &pend[np++];
        *q = (pending){.p = p, .grad = grad, .lr = lr_t};
        bool fresh = false;
        if (h.momentum != 0 &&
            !(q->outs[0] = fused_state(o, idx, "momentum_buffer", p, &fresh)))
            st = em_last_status();
        if (low_precision(em_tensor_dtype(p)) && !(q->outs[1] = master_weights(o, idx, p)))
            st = em_last_status();
        q->key = fresh;
    }
    em_attr attrs[7] = {F(h.lr), F(h.momentum), F(h.dampening), F(h.wd), B(h.nesterov),
                        B(h.maximize), B(false)};
    if (st == EM_OK && cap) return fused_run(op, pend, np, 3, attrs + 1, 5); /* less lr */
    return st == EM_OK ? fused_run(op, pend, np, 3, attrs, 6) : st;
}

/* Each group: the fused kernel where there is one, op by op elsewhere. */
static em_status step_groups(em_optimizer *o, const char *op_name,
                             em_status (*group)(em_optimizer *, int, const em_op *, pending *)) {
    const em_op *op = em_op_find(op_name);
    if (!op) return em_last_status();
    int most = 0;
    for (int g = 0; g < em_optimizer_group_count(o); g++)
        if (em_optimizer_param_count(o, g) > most) most = em_optimizer_param_count(o, g);
    pending *pend = em_host_alloc((size_t)(most ? most : 1) * sizeof *pend, 64);
    if (!pend)
        return em_set_error(EM_ERR_NOMEM, "%s.step: out of memory for %d parameters",
                            em_optimizer_class(o)->name, most);
    em_status st = EM_OK;
    em_scope_begin();
    for (int g = 0; g < em_optimizer_group_count(o) && st == EM_OK; g++) st = group(o, g, op, pend);
    em_scope_end();
    em_host_free(pend);
    return st;
}

static em_status sgd_step(em_optimizer *o) { return step_groups(o, "fused_sgd", sgd_group); }

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
    {.name = "capturable", .types = EM_OPT_BOOL, .def = {.b = false},
     .help = "read the lr on the parameters' device (the fused_sgd_capturable kernel), so the "
             "step can be captured in a graph and replayed"},
};

/* ---- Adam and AdamW --------------------------------------------------------------------------- */

typedef struct adam_hp {
    double lr, b1, b2, eps, wd;
    bool amsgrad, maximize, decoupled;
} adam_hp;

/* One parameter, op by op (devices or dtypes without a fused kernel). */
/* Adam's moments: exp_avg = b1 exp_avg + (1 - b1) gr, exp_avg_sq = b2 exp_avg_sq + (1 - b2) gr^2
 * (adam_one's and adam_one_capturable's, in this order). */
static em_status adam_moments_(em_tensor *exp_avg, em_tensor *exp_avg_sq, const em_tensor *gr,
                               double b1, double b2) {
    em_status st;
    if (!gr) return em_last_status();
    if ((st = em_mul_scalar_(exp_avg, b1)) != EM_OK ||
        (st = add_scaled_(exp_avg, gr, 1 - b1)) != EM_OK ||
        (st = em_mul_scalar_(exp_avg_sq, b2)) != EM_OK)
        return st;
    return add_scaled_(exp_avg_sq, em_mul(gr, gr), 1 - b2);
}

static em_status adam_one(em_optimizer *o, int idx, em_tensor *p, const em_tensor *grad,
                          const adam_hp *h) {
    em_scope_begin();
    em_status st = EM_OK;
    double lr = h->lr, eps = h->eps, wd = h->wd, b1 = h->b1, b2 = h->b2;
    em_tensor *exp_avg = state_like(o, idx, "exp_avg", p, 0);
    em_tensor *exp_avg_sq = state_like(o, idx, "exp_avg_sq", p, 0);
    em_tensor *max_sq = h->amsgrad ? state_like(o, idx, "max_exp_avg_sq", p, 0) : NULL;
    double step = step_count(o, idx);
    const em_tensor *gr;
    if (!exp_avg || !exp_avg_sq || (h->amsgrad && !max_sq) || isnan(step)) {
        st = em_last_status();
        goto done;
    }
    if (h->decoupled) {
        gr = h->maximize ? em_neg(grad) : grad;
        if ((st = em_mul_scalar_(p, 1 - lr * wd)) != EM_OK) goto done;
    } else {
        gr = effective_grad(p, grad, h->maximize, wd);
    }
    if ((st = adam_moments_(exp_avg, exp_avg_sq, gr, b1, b2)) != EM_OK) goto done;
    double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
    double step_size = lr / bc1, bc2_sqrt = sqrt(bc2);
    const em_tensor *sq = exp_avg_sq;
    if (h->amsgrad) {
        if ((st = em_copy_(max_sq, em_maximum(max_sq, exp_avg_sq))) != EM_OK) goto done;
        sq = max_sq;
    }
    em_tensor *denom = em_div_scalar(em_sqrt(sq), bc2_sqrt);
    if (!denom || (st = em_add_scalar_(denom, eps)) != EM_OK) {
        st = em_last_status();
        goto done;
    }
    st = add_scaled_(p, em_div(exp_avg, denom), -step_size);
done:
    em_scope_end();
    return st;
}

/* x rounded to dtype dt (a 0-dim device scalar; x itself when it has dt). */
static em_tensor *as_dtype(em_tensor *x, em_dtype dt) {
    return x && em_tensor_dtype(x) != dt ? em_to_dtype(x, dt) : x;
}

/* 1 - x, bit for bit the host's 1 - x (1 + (-x) is the same IEEE operation). */
static em_tensor *one_minus(em_tensor *x) { return em_add_scalar(em_neg(x), 1.0); }

/* One parameter of a capturable AMSGrad group, op by op: adam_one's ops in adam_one's order,
 * with the scalars that change between steps formed on the device as 0-dim float64 tensors
 * (the step count, the "step" state, incremented by an op; the bias corrections from
 * pow(beta, step); the lr, the group's lr tensor) and rounded to the parameter's dtype where
 * adam_one's scalar ops round theirs: the same bits as adam_one (and the fused kernel) where
 * the device's pow is the host's, and nothing read or written on the host, so the step can be
 * captured and replayed. The fused capturable kernels have no AMSGrad maximum (a list call of
 * the op-case table holds 6 lists: there is no room for max_exp_avg_sq). float32 and float64
 * parameters, as the capturable kernels. */
static em_status adam_one_capturable(em_optimizer *o, int idx, em_tensor *p,
                                     const em_tensor *grad, const adam_hp *h, em_tensor *lr) {
    em_dtype dt = em_tensor_dtype(p);
    char d[48];
    if ((dt != EM_F32 && dt != EM_F64) || em_tensor_dtype(grad) != dt ||
        !em_device_equal(em_tensor_device(grad), em_tensor_device(p)))
        return em_set_error(EM_ERR_DTYPE, "%s: capturable with amsgrad: parameter %d (%s on %s) "
                            "%s; capturable AMSGrad steps take float32 and float64 parameters "
                            "whose grads have their dtype and device",
                            em_optimizer_class(o)->name, idx, em_dtype_name(dt),
                            em_device_str(em_tensor_device(p), d, sizeof d),
                            dt != EM_F32 && dt != EM_F64 ? "is not float32 or float64"
                            : em_tensor_dtype(grad) != dt ? "has a grad of another dtype"
                                                          : "has a grad on another device");
    em_scope_begin();
    em_status st = EM_OK;
    double eps = h->eps, wd = h->wd, b1 = h->b1, b2 = h->b2;
    em_device dev = em_tensor_device(p);
    em_tensor *exp_avg = state_like(o, idx, "exp_avg", p, 0);
    em_tensor *exp_avg_sq = state_like(o, idx, "exp_avg_sq", p, 0);
    em_tensor *max_sq = state_like(o, idx, "max_exp_avg_sq", p, 0);
    em_tensor *step = device_step(o, idx, p);
    const em_tensor *gr;
    if (!exp_avg || !exp_avg_sq || !max_sq || !step || (st = em_add_scalar_(step, 1)) != EM_OK) {
        st = st != EM_OK ? st : em_last_status();
        goto done;
    }
    if (h->decoupled) {
        gr = h->maximize ? em_neg(grad) : grad;
        em_tensor *f = as_dtype(one_minus(em_mul_scalar(lr, wd)), dt); /* 1 - lr * wd */
        if ((st = f ? em_mul_(p, f) : em_last_status()) != EM_OK) goto done;
    } else {
        gr = effective_grad(p, grad, h->maximize, wd);
    }
    if ((st = adam_moments_(exp_avg, exp_avg_sq, gr, b1, b2)) != EM_OK) goto done;
    em_tensor *bc1 = one_minus(em_pow(em_full(0, NULL, b1, EM_F64, dev), step));
    em_tensor *bc2 = one_minus(em_pow(em_full(0, NULL, b2, EM_F64, dev), step));
    em_tensor *neg_step_size = as_dtype(em_neg(em_div(lr, bc1)), dt); /* -(lr / bc1) */
    em_tensor *bc2_sqrt = as_dtype(em_sqrt(bc2), dt);
    if (!neg_step_size || !bc2_sqrt ||
        (st = em_copy_(max_sq, em_maximum(max_sq, exp_avg_sq))) != EM_OK) {
        st = st != EM_OK ? st : em_last_status();
        goto done;
    }
    em_tensor *denom = em_div(em_sqrt(max_sq), bc2_sqrt);
    if (!denom || (st = em_add_scalar_(denom, eps)) != EM_OK) {
        st = st != EM_OK ? st : em_last_status();
        goto done;
    }
    em_tensor *upd = em_mul(em_div(exp_avg, denom), neg_step_size);
    st = upd ? em_add_(p, upd) : em_last_status();
done:
    em_scope_end();
    return st;
}

/* A capturable group: every parameter through fused_adam(w)_capturable, the step counts and
 * the lr on the device; with amsgrad, op by op with those on the device
 * (adam_one_capturable). */
static em_status adam_capturable_group(em_optimizer *o, int g, pending *pend, const adam_hp *h) {
    const em_op *op = em_op_find(h->decoupled ? "fused_adamw_capturable" : "fused_adam_capturable");
    if (!op) return em_last_status();
    em_tensor *lr_t = NULL;
    int np = 0;
    for (int i = 0; i < em_optimizer_param_count(o, g); i++) {
        int idx;
        em_tensor *p = em_optimizer_param(o, g, i, &idx, NULL);
        const em_tensor *grad = em_tensor_grad(p);
        if (!grad) continue;
        if (h->amsgrad) {
            em_status st = (lr_t = capturable_lr(o, g, idx, p, lr_t))
                               ? adam_one_capturable(o, idx, p, grad, h, lr_t)
                               : em_last_status();
            if (st != EM_OK) return st;
            continue;
        }
        if (!fusable(op, p, grad)) return capturable_refused(o, idx, p, grad, em_op_name(op));
        if (!(lr_t = capturable_lr(o, g, idx, p, lr_t))) return em_last_status();
        pending *q = &pend[np++];
        *q = (pending){.p = p, .grad = grad, .lr = lr_t};
        if (!(q->outs[0] = fused_state(o, idx, "exp_avg", p, NULL)) ||
            !(q->outs[1] = fused_state(o, idx, "exp_avg_sq", p, NULL)) ||
            !(q->outs[2] = device_step(o, idx, p)))
            return em_last_status();
    }
    em_attr attrs[5] = {F(h->b1), F(h->b2), F(h->eps), F(h->wd), B(h->maximize)};
    return fused_run(op, pend, np, 4, attrs, -1);
}

static em_status adam_like_group(em_optimizer *o, int g, const em_op *op, pending *pend,
                                 bool decoupled) {
    const em_options *opts = em_optimizer_group_options(o, g);
    double betas[EM_OPT_MAX_LIST];
    em_options_floats(opts, "betas", betas, EM_OPT_MAX_LIST);
    adam_hp h = {em_options_float(opts, "lr"), betas[0], betas[1], em_options_float(opts, "eps"),
                 em_options_float(opts, "weight_decay"), em_options_bool(opts, "amsgrad"),
                 em_options_bool(opts, "maximize"), decoupled};
    if (em_options_bool(opts, "capturable"))
        return adam_capturable_group(o, g, pend, &h);
    int np = 0;
    em_status st = EM_OK;
    for (int i = 0; i < em_optimizer_param_count(o, g) && st == EM_OK; i++) {
        int idx;
        em_tensor *p = em_optimizer_param(o, g, i, &idx, NULL);
        const em_tensor *grad = em_tensor_grad(p);
        if (!grad) continue;
        if (!fusable(op, p, grad)) {
            st = adam_one(o, idx, p, grad, &h);
            continue;
        }
        pending *q = &pend[np++];
        *q = (pending){.p = p, .grad = grad};
        if (!(q->outs[0] = fused_state(o, idx, "exp_avg", p, NULL)) ||
            !(q->outs[1] = fused_state(o, idx, "exp_avg_sq", p, NULL)) ||
            (h.amsgrad && !(q->outs[2] = fused_state(o, idx, "max_exp_avg_sq", p, NULL))) ||
            (low_precision(em_tensor_dtype(p)) && !(q->outs[3] = master_weights(o, idx, p))) ||
            isnan(q->key = step_count(o, idx)))
            st = em_last_status();
    }
    em_attr attrs[8] = {F(h.lr), F(h.b1), F(h.b2), F(h.eps), F(h.wd), F(0), B(h.amsgrad),
                        B(h.maximize)};
    return st == EM_OK ? fused_run(op, pend, np, 5, attrs, 5) : st;
}

static em_status adam_group(em_optimizer *o, int g, const em_op *op, pending *pend) {
    return adam_like_group(o, g, op, pend, false);
}
static em_status adamw_group(em_optimizer *o, int g, const em_op *op, pending *pend) {
    return adam_like_group(o, g, op, pend, true);
}

#undef F
#undef B

static em_status adam_step(em_optimizer *o) { return step_groups(o, "fused_adam", adam_group); }
static em_status adamw_step(em_optimizer *o) {
    return step_groups(o, "fused_adamw", adamw_group);
}

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
     .help = "maximize the objective instead of minimizing it"},                                \
    {.name = "capturable", .types = EM_OPT_BOOL, .def = {.b = false},                            \
     .help = "keep the step count and read the lr on the parameters' device (the "              \
             "fused_adam(w)_capturable kernels; with amsgrad, op by op with those on the "      \
             "device: float32/float64 parameters), so the step can be captured in a graph and " \
             "replayed"}

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

em_status optim_plugin_register_optimizers(em_registry *reg) {
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        em_status st = em_optim_class_register(reg, &classes[i]);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}
