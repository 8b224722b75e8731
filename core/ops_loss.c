/*
 * ops_loss.c — the standard op set, losses: cross_entropy, nll_loss, mse_loss, l1_loss,
 * smooth_l1_loss, binary_cross_entropy_with_logits and their backward ops: schemas,
 * shape/dtype inference and the typed public functions of ember/ops.h.
 *
 * Attributes (every loss op): reduction (int: EM_REDUCTION_NONE 0, MEAN 1, SUM 2 — PyTorch's
 * Reduction enum), and per op ignore_index (int), label_smoothing (float), beta (float). An
 * absent attribute (EM_ATTR_NONE) takes PyTorch's default: mean, -100, 0.0, 1.0.
 *
 * Optional tensor inputs (weight, pos_weight) are always passed to the op; a tensor with ZERO
 * elements means "none" (the public functions take NULL and pass a 1-D empty tensor of the
 * input's dtype). A genuine weight with zero elements only occurs when there are no classes
 * or no elements, where "none" gives the same result.
 *
 * Kernel contracts (what a backend may assume; the inference functions check the rest):
 *   cross_entropy(x, target, weight) -> loss
 *       x (N, C, d1, ...) or (C) floating; the class dim is 1 (0 for a 1-D x). target is
 *       either int64 class indices of x's shape without the class dim, or floating class
 *       probabilities of x's shape and dtype (the kernel picks the mode by target's dtype).
 *       weight (C) of x's dtype, or 0 elements (none). attrs: reduction, ignore_index,
 *       label_smoothing (in [0, 1]). loss has target's shape (class indices) or x's shape
 *       without the class dim (probabilities) for reduction none, else 0-dim; x's dtype. The
 *       kernel checks that every class index not equal to ignore_index is in [0, C)
 *       (EM_ERR_RANGE naming the index and C). Any strides.
 *   cross_entropy_backward(grad, x, target, weight) -> grad_x
 *       grad has the loss's shape (0-dim for mean/sum); the rest as for cross_entropy;
 *       grad_x has x's shape and dtype. Same attrs.
 *   nll_loss(x, target, weight) -> loss, nll_loss_backward(grad, x, target, weight) -> grad_x
 *       As cross_entropy with class indices, x holding log-probabilities; attrs: reduction,
 *       ignore_index.
 *   mse_loss / l1_loss / smooth_l1_loss(x, target) -> loss
 *       x and target of one shape (the public functions broadcast them first: strides may be
 *       0) and one floating dtype. attrs: reduction (+ beta >= 0 for smooth_l1). loss has x's
 *       shape (none) or is 0-dim.
 *   mse_loss_backward / l1_loss_backward / smooth_l1_loss_backward(grad, x, target) -> grad_x
 *       grad as above; grad_x has x's shape. The gradient for target is -grad_x.
 *   binary_cross_entropy_with_logits(x, target, weight, pos_weight) -> loss
 *       x, target of one shape and floating dtype; weight and pos_weight either of x's shape
 *       (the public function expands them: strides may be 0) and dtype, or 0 elements (none).
 *       attrs: reduction.
 *   binary_cross_entropy_with_logits_backward(grad, x, target, weight, pos_weight) -> grad_x
 */
#include <math.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/tensor.h"
#include "internal.h"

static const em_op *op_ce, *op_ce_bw, *op_nll, *op_nll_bw, *op_mse, *op_mse_bw, *op_l1,
    *op_l1_bw, *op_sl1, *op_sl1_bw, *op_bce, *op_bce_bw;

/* ---- attributes ------------------------------------------------------------------------------ */

static const char *const reduction_names[] = {"none", "mean", "sum"};

em_status em_reduction_parse(const char *name, em_reduction *out) {
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, reduction_names[i]) == 0) {
            if (out) *out = (em_reduction)i;
            return EM_OK;
        }
    return em_set_error(EM_ERR_INVALID, "reduction: '%s' is not one of 'none', 'mean', 'sum'",
                        name ? name : "(null)");
}

/* The reduction attribute (index 0 in every loss op), validated. */
static em_status get_reduction(const em_op *op, const em_attr *attrs, int64_t *red) {
    *red = em__attr_int_or(attrs, 0, EM_REDUCTION_MEAN);
    if (*red < 0 || *red > 2)
        return em_set_error(EM_ERR_INVALID, "%s: reduction %lld is not one of 0 (none), 1 (mean), "
                            "2 (sum)", em_op_name(op), (long long)*red);
    return EM_OK;
}

/* ---- inference ------------------------------------------------------------------------------- */

static void meta_of(em_tensor_meta *m, const em_tensor *t) {
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
}

static bool same_shape(const em_tensor *a, const em_tensor *b) {
    return a->ndim == b->ndim && memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

static em_status need_floating(const em_op *op, const char *what, const em_tensor *t) {
    if (em_dtype_is_floating(t->dtype)) return EM_OK;
    return em_set_error(EM_ERR_DTYPE, "%s: %s must be floating, got %s", em_op_name(op), what,
                        em_dtype_name(t->dtype));
}

/* An optional tensor (weight, pos_weight): 0 elements means none; otherwise dtype dt and, when
 * shape is non-NULL, that shape. */
static em_status check_optional(const em_op *op, const char *what, const em_tensor *w,
                                em_dtype dt, int ndim, const int64_t *shape) {
    if (w->numel == 0) return EM_OK;
    char x[160], y[160];
    if (w->ndim != ndim || memcmp(w->shape, shape, sizeof(int64_t) * (size_t)ndim) != 0)
        return em_set_error(EM_ERR_SHAPE, "%s: %s of shape %s must have shape %s (or be none)",
                            em_op_name(op), what, em__shape_str(w->ndim, w->shape, x, sizeof x),
                            em__shape_str(ndim, shape, y, sizeof y));
    if (w->dtype != dt)
        return em_set_error(EM_ERR_DTYPE, "%s: %s has dtype %s; expected the input's dtype %s",
                            em_op_name(op), what, em_dtype_name(w->dtype), em_dtype_name(dt));
    return EM_OK;
}

/* x (N, C, d...) or (C), target class indices or (cross_entropy) probabilities, weight (C).
 * `loss` receives the unreduced loss's shape. */
static em_status check_class_loss(const em_op *op, const em_tensor *x, const em_tensor *t,
                                  const em_tensor *w, bool probs_ok, em_tensor_meta *loss) {
    const char *who = em_op_name(op);
    char a[160], b[160];
    if (x->ndim < 1)
        return em_set_error(EM_ERR_SHAPE, "%s: input must have 1 or more dims (C) or (N, C, "
                            "...), got shape []", who);
    if (need_floating(op, "input", x) != EM_OK) return em_last_status();
    int cdim = x->ndim == 1 ? 0 : 1;
    int64_t C = x->shape[cdim];
    /* The unreduced loss: x's shape without the class dim. */
    loss->dtype = x->dtype;
    loss->ndim = x->ndim - 1;
    for (int d = 0, j = 0; d < x->ndim; d++)
        if (d != cdim) loss->shape[j++] = x->shape[d];
    if (em_dtype_is_floating(t->dtype) && probs_ok) {
        if (!same_shape(x, t))
            return em_set_error(EM_ERR_SHAPE, "%s: probability target of shape %s must have the "
                                "input's shape %s", who, em__shape_str(t->ndim, t->shape, a, sizeof a),
                                em__shape_str(x->ndim, x->shape, b, sizeof b));
        if (t->dtype != x->dtype)
            return em_set_error(EM_ERR_DTYPE, "%s: probability target has dtype %s; expected the "
                                "input's dtype %s", who, em_dtype_name(t->dtype),
                                em_dtype_name(x->dtype));
    } else if (t->dtype != EM_I64) {
        return em_set_error(EM_ERR_DTYPE, "%s: target has dtype %s; expected int64 class indices%s",
                            who, em_dtype_name(t->dtype),
                            probs_ok ? " or floating class probabilities" : "");
    } else if (x->ndim >= 2 && t->ndim >= 1 && t->shape[0] != x->shape[0]) {
        return em_set_error(EM_ERR_SHAPE, "%s: target batch size %lld does not match input batch "
                            "size %lld (target shape %s, input shape %s)", who,
                            (long long)t->shape[0], (long long)x->shape[0],
                            em__shape_str(t->ndim, t->shape, a, sizeof a),
                            em__shape_str(x->ndim, x->shape, b, sizeof b));
    } else if (t->ndim != loss->ndim ||
               memcmp(t->shape, loss->shape, sizeof(int64_t) * (size_t)t->ndim) != 0) {
        return em_set_error(EM_ERR_SHAPE, "%s: target of shape %s does not fit input of shape %s: "
                            "expected target shape %s (the input's shape without class dim %d)",
                            who, em__shape_str(t->ndim, t->shape, a, sizeof a),
                            em__shape_str(x->ndim, x->shape, b, sizeof b),
                            em__shape_str(loss->ndim, loss->shape, (char[160]){0}, 160), cdim);
    }
    if (w->numel != 0 && (w->ndim != 1 || w->shape[0] != C))
        return em_set_error(EM_ERR_SHAPE, "%s: weight of shape %s must have one entry per class "
                            "(%lld) or be none", who, em__shape_str(w->ndim, w->shape, a, sizeof a),
                            (long long)C);
    return check_optional(op, "weight", w, x->dtype, 1, &C);
}

/* The loss's shape for reduction red: unreduced, or 0-dim. */
static void reduce_meta(em_tensor_meta *m, int64_t red) {
    if (red != EM_REDUCTION_NONE) m->ndim = 0;
}

/* grad must have the loss's shape: `loss` for reduction none, any one element otherwise. */
static em_status check_grad(const em_op *op, const em_tensor *g, const em_tensor_meta *loss,
                            int64_t red, em_dtype dt) {
    char a[160], b[160];
    bool ok = red == EM_REDUCTION_NONE
                  ? g->ndim == loss->ndim &&
                        memcmp(g->shape, loss->shape, sizeof(int64_t) * (size_t)g->ndim) == 0
                  : g->numel == 1;
    if (!ok)
        return em_set_error(EM_ERR_SHAPE, "%s: grad of shape %s does not match the loss's shape %s "
                            "(reduction %s)", em_op_name(op),
                            em__shape_str(g->ndim, g->shape, a, sizeof a),
                            em__shape_str(red == EM_REDUCTION_NONE ? loss->ndim : 0, loss->shape,
                                          b, sizeof b),
                            reduction_names[red]);
    if (g->dtype != dt)
        return em_set_error(EM_ERR_DTYPE, "%s: grad has dtype %s; expected the input's dtype %s",
                            em_op_name(op), em_dtype_name(g->dtype), em_dtype_name(dt));
    return EM_OK;
}

static em_status check_smoothing(const em_op *op, const em_attr *attrs, int i) {
    double ls = em__attr_float_or(attrs, i, 0.0);
    if (!(ls >= 0.0 && ls <= 1.0))
        return em_set_error(EM_ERR_INVALID, "%s: label_smoothing must be in [0, 1], got %g",
                            em_op_name(op), ls);
    return EM_OK;
}

/* cross_entropy and nll_loss: (x, target, weight). */
static em_status infer_class(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                             em_tensor_meta *out) {
    int64_t red;
    if (get_reduction(op, attrs, &red) != EM_OK) return em_last_status();
    if (op == op_ce && check_smoothing(op, attrs, 2) != EM_OK) return em_last_status();
    if (check_class_loss(op, in[0], in[1], in[2], op == op_ce, out) != EM_OK)
        return em_last_status();
    reduce_meta(out, red);
    return EM_OK;
}

/* cross_entropy_backward and nll_loss_backward: (grad, x, target, weight). */
static em_status infer_class_bw(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                                em_tensor_meta *out) {
    int64_t red;
    em_tensor_meta loss;
    if (get_reduction(op, attrs, &red) != EM_OK) return em_last_status();
    if (op == op_ce_bw && check_smoothing(op, attrs, 2) != EM_OK) return em_last_status();
    if (check_class_loss(op, in[1], in[2], in[3], op == op_ce_bw, &loss) != EM_OK ||
        check_grad(op, in[0], &loss, red, in[1]->dtype) != EM_OK)
        return em_last_status();
    meta_of(out, in[1]);
    return EM_OK;
}

/* mse, l1, smooth_l1, bce: x and target of one shape and floating dtype. */
static em_status check_pointwise(const em_op *op, const em_tensor *x, const em_tensor *t,
                                 const em_attr *attrs) {
    char a[160], b[160];
    if (!same_shape(x, t))
        return em_set_error(EM_ERR_SHAPE, "%s: target of shape %s must have the input's shape %s",
                            em_op_name(op), em__shape_str(t->ndim, t->shape, a, sizeof a),
                            em__shape_str(x->ndim, x->shape, b, sizeof b));
    if (need_floating(op, "input", x) != EM_OK) return em_last_status();
    if (t->dtype != x->dtype)
        return em_set_error(EM_ERR_DTYPE, "%s: target has dtype %s; expected the input's dtype %s",
                            em_op_name(op), em_dtype_name(t->dtype), em_dtype_name(x->dtype));
    if ((op == op_sl1 || op == op_sl1_bw) && !(em__attr_float_or(attrs, 1, 1.0) >= 0))
        return em_set_error(EM_ERR_INVALID, "%s: beta must be >= 0, got %g", em_op_name(op),
                            em__attr_float_or(attrs, 1, 1.0));
    return EM_OK;
}

static em_status infer_pointwise(const em_op *op, const em_tensor *const *in,
                                 const em_attr *attrs, em_tensor_meta *out) {
    int64_t red;
    if (get_reduction(op, attrs, &red) != EM_OK || check_pointwise(op, in[0], in[1], attrs) != EM_OK)
        return em_last_status();
    if (op == op_bce &&
        (check_optional(op, "weight", in[2], in[0]->dtype, in[0]->ndim, in[0]->shape) != EM_OK ||
         check_optional(op, "pos_weight", in[3], in[0]->dtype, in[0]->ndim, in[0]->shape) != EM_OK))
        return em_last_status();
    meta_of(out, in[0]);
    reduce_meta(out, red);
    return EM_OK;
}

static em_status infer_pointwise_bw(const em_op *op, const em_tensor *const *in,
                                    const em_attr *attrs, em_tensor_meta *out) {
    int64_t red;
    if (get_reduction(op, attrs, &red) != EM_OK || check_pointwise(op, in[1], in[2], attrs) != EM_OK)
        return em_last_status();
    if (op == op_bce_bw &&
        (check_optional(op, "weight", in[3], in[1]->dtype, in[1]->ndim, in[1]->shape) != EM_OK ||
         check_optional(op, "pos_weight", in[4], in[1]->dtype, in[1]->ndim, in[1]->shape) != EM_OK))
        return em_last_status();
    meta_of(out, in[1]);
    em_tensor_meta loss = *out;
    return check_grad(op, in[0], &loss, red, in[1]->dtype);
}

/* ---- declarations ---------------------------------------------------------------------------- */

/* The *_backward ops are helpers of these derivatives, not differentiated themselves. */
static em_status c_loss(const em_op *op, const em_tensor *const *in, int n_in,
                        const em_attr *attrs, em_tensor **out, int cap, int *n_out);

/* Every loss is a composite over its kernel (c_loss); weight and pos_weight are optional (the
 * last inputs of the class losses and of bce). */
static em_status declare(em_registry *core, const em_op **out, const char *name, int n_in,
                         int n_attrs, const char *const *attr_names, const em_attr_type *types,
                         int dispatch_arg, em_infer_fn infer, em_backward_fn backward,
                         unsigned saves) {
    bool bce = strncmp(name, "binary_cross_entropy", 20) == 0,
         cls = strstr(name, "cross_entropy") || strstr(name, "nll_loss");
    unsigned opt = bce ? 3u << (n_in - 2) : cls ? 1u << (n_in - 1) : 0;
    return em__declare(core, out, (em_op_schema){.name = name, .n_inputs = n_in,
                       .n_attrs = n_attrs, .attr_names = attr_names, .attr_types = types,
                       .dispatch_arg = dispatch_arg, .flags = backward ? 0 : EM_OP_NONDIFF,
                       .infer = infer, .backward = backward, .saves = saves,
                       .composite = c_loss, .optional_inputs = opt, .category = "loss",
                       /* the losses run in float32 under autocast; their backward ops as
                        * the derivative calls them */
                       .autocast = backward ? EM_AUTOCAST_FLOAT32 : EM_AUTOCAST_NONE});
}

/* ---- derivatives: each loss's backward op gives the input's gradient ------------------------- */

/* grad_x = op_bw(grad, saved inputs...) with the forward's attributes. */
static em_tensor *loss_grad(const em_op *op_bw, const em_backward_ctx *c) {
    const em_tensor *in[5] = {c->grad_out[0]};
    for (int i = 0; i < c->n_in; i++) in[i + 1] = c->in[i];
    /* The saved inputs are already prepared: the backward op's kernel, not its composite. */
    return em__scope_track(em__kernel1(op_bw, in, c->n_in + 1, c->attrs));
}

/* Class losses: the gradient of the input only (class indices and weights have none; a
 * gradient for probability targets is not provided). */
static em_status d_class(const em_backward_ctx *c, em_tensor **gi, const em_op *op_bw) {
    if (c->needs_grad[1] || c->needs_grad[2])
        return em_set_error(EM_ERR_STATE, "backward: %s gives no gradient for its target or "
                            "weight; detach them (em_detach)", em_op_name(c->op));
    gi[0] = loss_grad(op_bw, c);
    return gi[0] ? EM_OK : em_last_status();
}
static em_status d_ce(const em_backward_ctx *c, em_tensor **gi) { return d_class(c, gi, op_ce_bw); }
static em_status d_nll(const em_backward_ctx *c, em_tensor **gi) { return d_class(c, gi, op_nll_bw); }

/* Pointwise losses: the target's gradient is the input's negated. */
static em_status d_pointwise(const em_backward_ctx *c, em_tensor **gi, const em_op *op_bw) {
    em_tensor *g = loss_grad(op_bw, c);
    if (!g) return em_last_status();
    if (c->needs_grad[0]) gi[0] = g;
    if (c->needs_grad[1] && !(gi[1] = em_neg(g))) return em_last_status();
    return EM_OK;
}
static em_status d_mse(const em_backward_ctx *c, em_tensor **gi) { return d_pointwise(c, gi, op_mse_bw); }
static em_status d_l1(const em_backward_ctx *c, em_tensor **gi) { return d_pointwise(c, gi, op_l1_bw); }
static em_status d_sl1(const em_backward_ctx *c, em_tensor **gi) { return d_pointwise(c, gi, op_sl1_bw); }

static em_status d_bce(const em_backward_ctx *c, em_tensor **gi) {
    if (c->needs_grad[1] || c->needs_grad[2] || c->needs_grad[3])
        return em_set_error(EM_ERR_STATE, "backward: binary_cross_entropy_with_logits gives no "
                            "gradient for its target, weight or pos_weight; detach them");
    gi[0] = loss_grad(op_bce_bw, c);
    return gi[0] ? EM_OK : em_last_status();
}

em_status em__ops_declare_loss(em_registry *core) {
    static const char *const ce[] = {"reduction", "ignore_index", "label_smoothing"},
                             *const nll[] = {"reduction", "ignore_index"},
                             *const red[] = {"reduction"}, *const sl1[] = {"reduction", "beta"};
    static const em_attr_type tce[] = {EM_ATTR_INT, EM_ATTR_INT, EM_ATTR_FLOAT},
                              tnll[] = {EM_ATTR_INT, EM_ATTR_INT}, tred[] = {EM_ATTR_INT},
                              tsl1[] = {EM_ATTR_INT, EM_ATTR_FLOAT};
    em_status st = EM_OK;
#define DECL(var, ...) if (st == EM_OK) st = declare(core, &var, __VA_ARGS__)
    const unsigned all3 = EM_SAVE_INPUT(0) | EM_SAVE_INPUT(1) | EM_SAVE_INPUT(2),
                   all2 = EM_SAVE_INPUT(0) | EM_SAVE_INPUT(1), all4 = all3 | EM_SAVE_INPUT(3);
    DECL(op_ce, "cross_entropy", 3, 3, ce, tce, 0, infer_class, d_ce, all3);
    DECL(op_ce_bw, "cross_entropy_backward", 4, 3, ce, tce, 1, infer_class_bw, NULL, 0);
    DECL(op_nll, "nll_loss", 3, 2, nll, tnll, 0, infer_class, d_nll, all3);
    DECL(op_nll_bw, "nll_loss_backward", 4, 2, nll, tnll, 1, infer_class_bw, NULL, 0);
    DECL(op_mse, "mse_loss", 2, 1, red, tred, 0, infer_pointwise, d_mse, all2);
    DECL(op_mse_bw, "mse_loss_backward", 3, 1, red, tred, 1, infer_pointwise_bw, NULL, 0);
    DECL(op_l1, "l1_loss", 2, 1, red, tred, 0, infer_pointwise, d_l1, all2);
    DECL(op_l1_bw, "l1_loss_backward", 3, 1, red, tred, 1, infer_pointwise_bw, NULL, 0);
    DECL(op_sl1, "smooth_l1_loss", 2, 2, sl1, tsl1, 0, infer_pointwise, d_sl1, all2);
    DECL(op_sl1_bw, "smooth_l1_loss_backward", 3, 2, sl1, tsl1, 1, infer_pointwise_bw, NULL, 0);
    DECL(op_bce, "binary_cross_entropy_with_logits", 4, 1, red, tred, 0, infer_pointwise, d_bce,
         all4);
    DECL(op_bce_bw, "binary_cross_entropy_with_logits_backward", 5, 1, red, tred, 1,
         infer_pointwise_bw, NULL, 0);
#undef DECL
    return st;
}

/* ---- public functions ------------------------------------------------------------------------ */

/* Every public function below builds its arguments in `own` (released at the end). */
typedef struct args {
    const em_tensor *in[5];
    em_tensor *own[8];
    int n_own;
} args;

static em_tensor *hold(args *a, em_tensor *t) {
    if (t) a->own[a->n_own++] = t;
    return t;
}

static void args_free(args *a) {
    for (int i = 0; i < a->n_own; i++) em_tensor_release(a->own[i]);
}

static em_status bad_reduction(const char *who, em_reduction r) {
    return em_set_error(EM_ERR_INVALID, "%s: reduction %d is not one of EM_REDUCTION_NONE, "
                        "EM_REDUCTION_MEAN, EM_REDUCTION_SUM", who, (int)r);
}

/* t converted to dt (a new reference, t itself when it already is dt). */
static em_tensor *as_dtype(args *a, const em_tensor *t, em_dtype dt) {
    return hold(a, t->dtype == dt ? em_tensor_retain((em_tensor *)t) : em__to_dtype(t, dt));
}

/* weight, or the empty "none" tensor of dtype dt on x's device when weight is NULL. */
static em_tensor *optional(args *a, const em_tensor *w, const em_tensor *x, em_dtype dt) {
    if (w) return hold(a, em_tensor_retain((em_tensor *)w));
    int64_t zero = 0;
    return hold(a, em__empty(1, &zero, dt, x->storage->device));
}

/* grad converted to x's dtype (grad must be floating). */
static em_tensor *grad_arg(args *a, const char *who, const em_tensor *g, const em_tensor *x) {
    if (!em_dtype_is_floating(g->dtype)) {
        em_set_error(EM_ERR_DTYPE, "%s: grad must be floating, got %s", who, em_dtype_name(g->dtype));
        return NULL;
    }
    return as_dtype(a, g, x->dtype);
}

static em_tensor *run(const em_op *op, args *a, int n, const em_attr *attrs) {
    em_tensor *r = NULL;
    bool ok = true;
    for (int i = 0; i < n; i++) ok = ok && a->in[i];
    if (ok) r = em__kernel1(op, a->in, n, attrs);
    args_free(a);
    return r;
}

/* Class losses: x, target; probability targets are promoted together with x. */
static em_tensor *class_loss(const em_op *op, const em_tensor *g, const em_tensor *x,
                             const em_tensor *t, const em_tensor *w, em_reduction red,
                             int64_t ignore_index, double ls) {
    const char *who = em_op_name(op);
    bool bw = g != NULL;
    if (red < EM_REDUCTION_NONE || red > EM_REDUCTION_SUM) {
        bad_reduction(who, red);
        return NULL;
    }
    args a = {0};
    int k = 0;
    bool probs = (op == op_ce || op == op_ce_bw) && em_dtype_is_floating(t->dtype);
    em_dtype dt = x->dtype;
    if (probs && em_dtype_is_floating(x->dtype)) {
        const em_tensor *xt[2] = {x, t};
        dt = em__result_type(xt, 2);
    }
    em_tensor *xc = as_dtype(&a, x, dt);
    if (bw) a.in[k++] = xc ? grad_arg(&a, who, g, xc) : NULL;
    a.in[k++] = xc;
    a.in[k++] = probs ? as_dtype(&a, t, dt) : t;
    a.in[k++] = optional(&a, w, x, dt);
    em_attr attrs[3] = {{.type = EM_ATTR_INT, .v.i = red},
                        {.type = EM_ATTR_INT, .v.i = ignore_index},
                        {.type = EM_ATTR_FLOAT, .v.f = ls}};
    return run(op, &a, k, attrs);
}

/* The broadcast shape of n tensors into shape/ndim; names the shapes when they do not
 * broadcast. */
static em_status broadcast_shape(const char *who, const em_tensor *const *ts, int n, int *ndim,
                                 int64_t *shape) {
    int nd = 0;
    for (int i = 0; i < n; i++) nd = EM_MAX(nd, ts[i]->ndim);
    for (int d = 0; d < nd; d++) {
        shape[d] = 1;
        for (int i = 0; i < n; i++) {
            int j = ts[i]->ndim - nd + d;
            int64_t s = j >= 0 ? ts[i]->shape[j] : 1;
            if (s == shape[d] || s == 1) continue;
            if (shape[d] != 1) {
                char a[160], b[160];
                return em_set_error(EM_ERR_SHAPE, "%s: shapes %s and %s cannot be broadcast "
                                    "(dim %d: %lld vs %lld)", who,
                                    em__shape_str(ts[0]->ndim, ts[0]->shape, a, sizeof a),
                                    em__shape_str(ts[i]->ndim, ts[i]->shape, b, sizeof b), d - nd,
                                    (long long)shape[d], (long long)s);
            }
            shape[d] = s;
        }
    }
    *ndim = nd;
    return EM_OK;
}

/* mse, l1, smooth_l1 (and their backward when g is non-NULL): x and target promoted to their
 * floating result type and broadcast together. */
static em_tensor *pointwise_loss(const em_op *op, const em_tensor *g, const em_tensor *x,
                                 const em_tensor *t, em_reduction red, double beta) {
    const char *who = em_op_name(op);
    bool bw = g != NULL;
    const em_tensor *xt[2] = {x, t};
    if (red < EM_REDUCTION_NONE || red > EM_REDUCTION_SUM) {
        bad_reduction(who, red);
        return NULL;
    }
    em_dtype dt = em__result_type(xt, 2);
    if (!em_dtype_is_floating(dt)) {
        em_set_error(EM_ERR_DTYPE, "%s: expected floating input or target, got %s and %s", who,
                     em_dtype_name(x->dtype), em_dtype_name(t->dtype));
        return NULL;
    }
    int nd;
    int64_t shape[EM_MAX_DIMS];
    if (broadcast_shape(who, xt, 2, &nd, shape) != EM_OK) return NULL;
    args a = {0};
    int k = 0;
    em_tensor *xc = as_dtype(&a, x, dt), *tc = as_dtype(&a, t, dt);
    em_tensor *xe = xc ? hold(&a, em__expand(xc, nd, shape)) : NULL;
    em_tensor *te = tc ? hold(&a, em__expand(tc, nd, shape)) : NULL;
    if (bw) a.in[k++] = xe ? grad_arg(&a, who, g, xe) : NULL;
    a.in[k++] = xe;
    a.in[k++] = te;
    em_attr attrs[2] = {{.type = EM_ATTR_INT, .v.i = red}, {.type = EM_ATTR_FLOAT, .v.f = beta}};
    return run(op, &a, k, attrs);
}

static bool beta_ok(const char *who, double beta) {
    if (beta >= 0) return true;
    em_set_error(EM_ERR_INVALID, "%s: beta must be >= 0, got %g", who, beta);
    return false;
}

/* bce_with_logits (and its backward when g is non-NULL). */
static em_tensor *bce_loss(const em_op *op, const em_tensor *g, const em_tensor *x,
                           const em_tensor *t, const em_tensor *w, const em_tensor *pw,
                           em_reduction red) {
    const char *who = em_op_name(op);
    bool bw = g != NULL;
    if (red < EM_REDUCTION_NONE || red > EM_REDUCTION_SUM) {
        bad_reduction(who, red);
        return NULL;
    }
    char s1[160], s2[160];
    if (!same_shape(x, t)) {
        em_set_error(EM_ERR_SHAPE, "%s: target of shape %s must have the input's shape %s", who,
                     em__shape_str(t->ndim, t->shape, s1, sizeof s1),
                     em__shape_str(x->ndim, x->shape, s2, sizeof s2));
        return NULL;
    }
    const em_tensor *all[4] = {x, t};
    int n = 2;
    if (w && (w->numel || !x->numel)) all[n++] = w;
    if (pw && (pw->numel || !x->numel)) all[n++] = pw;
    em_dtype dt = em__result_type(all, n);
    if (!em_dtype_is_floating(x->dtype) || !em_dtype_is_floating(t->dtype)) {
        em_set_error(EM_ERR_DTYPE, "%s: expected floating input and target, got %s and %s", who,
                     em_dtype_name(x->dtype), em_dtype_name(t->dtype));
        return NULL;
    }
    args a = {0};
    int k = 0;
    em_tensor *xc = as_dtype(&a, x, dt);
    if (bw) a.in[k++] = xc ? grad_arg(&a, who, g, xc) : NULL;
    a.in[k++] = xc;
    a.in[k++] = as_dtype(&a, t, dt);
    const em_tensor *opt[2] = {w, pw};
    for (int i = 0; i < 2; i++) {
        if (!opt[i] || (opt[i]->numel == 0 && x->numel != 0)) { /* absent, or "none" */
            a.in[k++] = optional(&a, NULL, x, dt);
            continue;
        }
        const em_tensor *pair[2] = {x, opt[i]};
        int nd;
        int64_t shape[EM_MAX_DIMS];
        em_tensor *c = as_dtype(&a, opt[i], dt);
        bool fits = broadcast_shape(who, pair, 2, &nd, shape) == EM_OK && nd == x->ndim &&
                    memcmp(shape, x->shape, sizeof(int64_t) * (size_t)nd) == 0;
        if (!fits) {
            em_set_error(EM_ERR_SHAPE, "%s: %s of shape %s does not broadcast to the input's "
                         "shape %s", who, i ? "pos_weight" : "weight",
                         em__shape_str(opt[i]->ndim, opt[i]->shape, s1, sizeof s1),
                         em__shape_str(x->ndim, x->shape, s2, sizeof s2));
            args_free(&a);
            return NULL;
        }
        a.in[k++] = c ? hold(&a, em__expand(c, x->ndim, x->shape)) : NULL;
    }
    em_attr attr = {.type = EM_ATTR_INT, .v.i = red};
    return run(op, &a, k, &attr);
}

/* ---- composites: the public losses over their kernels ---------------------------------------- */

static bool is_bw(const em_op *op) {
    return op == op_ce_bw || op == op_nll_bw || op == op_mse_bw || op == op_l1_bw ||
           op == op_sl1_bw || op == op_bce_bw;
}

/* Inputs as the schema lists them: the backward ops take the loss's grad first. Attributes
 * absent take PyTorch's defaults (mean, ignore_index -100, label_smoothing 0, beta 1). */
static em_status c_loss(const em_op *op, const em_tensor *const *in, int n_in,
                        const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    bool bw = is_bw(op);
    const em_tensor *g = bw ? in[0] : NULL, *const *xs = in + bw;
    if (bw && !em_dtype_is_floating(g->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s: grad must be floating, got %s", em_op_name(op),
                            em_dtype_name(g->dtype));
    em_reduction red = (em_reduction)em__attr_int_or(attrs, 0, EM_REDUCTION_MEAN);
    em_tensor *r;
    if (op == op_ce || op == op_ce_bw || op == op_nll || op == op_nll_bw) {
        bool ce = op == op_ce || op == op_ce_bw;
        r = class_loss(op, g, xs[0], xs[1], xs[2], red, em__attr_int_or(attrs, 1, -100),
                       ce ? em__attr_float_or(attrs, 2, 0) : 0);
    } else if (op == op_bce || op == op_bce_bw) {
        r = bce_loss(op, g, xs[0], xs[1], xs[2], xs[3], red);
    } else {
        bool sl1 = op == op_sl1 || op == op_sl1_bw;
        double beta = sl1 ? em__attr_float_or(attrs, 1, 1.0) : 0;
        r = sl1 && !beta_ok(em_op_name(op), beta) ? NULL
                                                 : pointwise_loss(op, g, xs[0], xs[1], red, beta);
    }
    *n_out = (out[0] = r) != NULL;
    return r ? EM_OK : em_last_status();
}

/* ---- public functions: one line each --------------------------------------------------------- */

#define RED(r) EM__A_INT((int64_t)(r))
em_tensor *em_cross_entropy(const em_tensor *input, const em_tensor *target,
                            const em_tensor *weight, em_reduction reduction, int64_t ignore_index,
                            double label_smoothing) {
    return em__call1(op_ce, 3, EM__IN(input, target, weight),
                     EM__ATTRS(RED(reduction), EM__A_INT(ignore_index),
                               EM__A_FLOAT(label_smoothing)));
}
em_tensor *em_cross_entropy_backward(const em_tensor *grad, const em_tensor *input,
                                     const em_tensor *target, const em_tensor *weight,
                                     em_reduction reduction, int64_t ignore_index,
                                     double label_smoothing) {
    return em__call1(op_ce_bw, 4, EM__IN(grad, input, target, weight),
                     EM__ATTRS(RED(reduction), EM__A_INT(ignore_index),
                               EM__A_FLOAT(label_smoothing)));
}
em_tensor *em_nll_loss(const em_tensor *input, const em_tensor *target, const em_tensor *weight,
                       em_reduction reduction, int64_t ignore_index) {
    return em__call1(op_nll, 3, EM__IN(input, target, weight),
                     EM__ATTRS(RED(reduction), EM__A_INT(ignore_index)));
}
em_tensor *em_nll_loss_backward(const em_tensor *grad, const em_tensor *input,
                                const em_tensor *target, const em_tensor *weight,
                                em_reduction reduction, int64_t ignore_index) {
    return em__call1(op_nll_bw, 4, EM__IN(grad, input, target, weight),
                     EM__ATTRS(RED(reduction), EM__A_INT(ignore_index)));
}
em_tensor *em_mse_loss(const em_tensor *input, const em_tensor *target, em_reduction reduction) {
    return em__call1(op_mse, 2, EM__IN(input, target), EM__ATTRS(RED(reduction)));
}
em_tensor *em_mse_loss_backward(const em_tensor *grad, const em_tensor *input,
                                const em_tensor *target, em_reduction reduction) {
    return em__call1(op_mse_bw, 3, EM__IN(grad, input, target), EM__ATTRS(RED(reduction)));
}
em_tensor *em_l1_loss(const em_tensor *input, const em_tensor *target, em_reduction reduction) {
    return em__call1(op_l1, 2, EM__IN(input, target), EM__ATTRS(RED(reduction)));
}
em_tensor *em_l1_loss_backward(const em_tensor *grad, const em_tensor *input,
                               const em_tensor *target, em_reduction reduction) {
    return em__call1(op_l1_bw, 3, EM__IN(grad, input, target), EM__ATTRS(RED(reduction)));
}
em_tensor *em_smooth_l1_loss(const em_tensor *input, const em_tensor *target,
                             em_reduction reduction, double beta) {
    return em__call1(op_sl1, 2, EM__IN(input, target),
                     EM__ATTRS(RED(reduction), EM__A_FLOAT(beta)));
}
em_tensor *em_smooth_l1_loss_backward(const em_tensor *grad, const em_tensor *input,
                                      const em_tensor *target, em_reduction reduction,
                                      double beta) {
    return em__call1(op_sl1_bw, 3, EM__IN(grad, input, target),
                     EM__ATTRS(RED(reduction), EM__A_FLOAT(beta)));
}
em_tensor *em_binary_cross_entropy_with_logits(const em_tensor *input, const em_tensor *target,
                                               const em_tensor *weight,
                                               const em_tensor *pos_weight,
                                               em_reduction reduction) {
    return em__call1(op_bce, 4, EM__IN(input, target, weight, pos_weight),
                     EM__ATTRS(RED(reduction)));
}
em_tensor *em_binary_cross_entropy_with_logits_backward(const em_tensor *grad,
                                                        const em_tensor *input,
                                                        const em_tensor *target,
                                                        const em_tensor *weight,
                                                        const em_tensor *pos_weight,
                                                        em_reduction reduction) {
    return em__call1(op_bce_bw, 5, EM__IN(grad, input, target, weight, pos_weight),
                     EM__ATTRS(RED(reduction)));
}
#undef RED
