/*
 * ops_elementwise.c — the standard op set, the arithmetic core: add, sub, mul, div, neg, exp,
 * log, relu (and relu_backward, its derivative's helper): schemas, dtype rules, derivatives
 * and the typed public functions of ember/ops.h. More elementwise math is in ops_math.c.
 *
 * Kernel contracts (what a backend may assume, per op):
 *   add/sub/mul/div(a, b) -> y, neg/exp/log/relu(x) -> y
 *                         inputs already promoted to y's dtype and broadcast to y's shape
 *                         (stride 0 on broadcast dims); y may alias an input (in place).
 *                         div, exp and log see floating inputs (EM_OP_FLOAT_RESULT: integers
 *                         arrive as float32); neg never sees bool.
 *   relu_backward(grad, y) -> dx    dx = y > 0 ? grad : 0.
 */
#include <math.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/op_helpers.h"
#include "ember/ops.h"
#include "ember/tensor.h"
#include "internal.h"

static const em_op *op_add, *op_sub, *op_mul, *op_div, *op_neg, *op_exp, *op_log, *op_relu,
    *op_relu_backward;

#define infer_same em_infer_same
#define infer_broadcast em_infer_broadcast

static em_status prep_neg(const em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_dtype *dts) {
    (void)op, (void)n_in, (void)attrs, (void)dts;
    if (in[0]->dtype != EM_BOOL) return EM_OK;
    return em_set_error(EM_ERR_DTYPE, "neg: negation of a bool tensor is not supported; use a "
                        "logical not");
}

/* ---- derivatives ------------------------------------------------------------------------------
 * Written with the public ops; they run with grad mode off inside a scope of their own, so
 * temporaries need no release. A grad passed through unchanged is returned as a new reference
 * (em_tensor_retain). */

#define G (c->grad_out[0])
#define NEED(i) (c->needs_grad[i])

static em_status d_add(const em_backward_ctx *c, em_tensor **gi) {
    if (NEED(0)) gi[0] = em_tensor_retain(G);
    if (NEED(1)) gi[1] = em_tensor_retain(G);
    return EM_OK;
}
static em_status d_sub(const em_backward_ctx *c, em_tensor **gi) {
    if (NEED(0)) gi[0] = em_tensor_retain(G);
    if (NEED(1) && !(gi[1] = em_neg(G))) return em_last_status();
    return EM_OK;
}
static em_status d_mul(const em_backward_ctx *c, em_tensor **gi) {
    if (NEED(0) && !(gi[0] = em_mul(G, c->in[1]))) return em_last_status();
    if (NEED(1) && !(gi[1] = em_mul(G, c->in[0]))) return em_last_status();
    return EM_OK;
}
static em_status d_div(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *a = c->in[0], *b = c->in[1];
    if (NEED(0) && !(gi[0] = em_div(G, b))) return em_last_status();
    /* d(a/b)/db = -a / b^2 */
    if (NEED(1) && !(gi[1] = em_neg(em_div(em_mul(G, a), em_mul(b, b))))) return em_last_status();
    return EM_OK;
}
static em_status d_neg(const em_backward_ctx *c, em_tensor **gi) {
    gi[0] = em_neg(G);
    return gi[0] ? EM_OK : em_last_status();
}
static em_status d_exp(const em_backward_ctx *c, em_tensor **gi) {
    gi[0] = em_mul(G, c->out[0]);
    return gi[0] ? EM_OK : em_last_status();
}
static em_status d_log(const em_backward_ctx *c, em_tensor **gi) {
    gi[0] = em_div(G, c->in[0]);
    return gi[0] ? EM_OK : em_last_status();
}
static em_status d_relu(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *in[2] = {G, c->out[0]};
    gi[0] = em__scope_track(em__op1(op_relu_backward, in, 2, NULL));
    return gi[0] ? EM_OK : em_last_status();
}
#undef G
#undef NEED

em_status em__ops_declare_elementwise(em_registry *core) {
    const unsigned ew = EM_OP_PROMOTE | EM_OP_BROADCAST, fr = EM_OP_FLOAT_RESULT,
                   nd = EM_OP_NONDIFF, in0 = EM_SAVE_INPUT(0), in01 = in0 | EM_SAVE_INPUT(1),
                   out0 = EM_SAVE_OUTPUT(0);
    em_status st = EM_OK;
#define DECL(var, ...) if (st == EM_OK) st = em__declare_op(core, &var, __VA_ARGS__)
    /* DECLA: with an autocast class (ember/autocast.h). */
#define DECLA(ac, var, nm, nin, fl_, inf, bw, sv)                                               \
    if (st == EM_OK)                                                                            \
        st = em__declare(core, &var, (em_op_schema){.name = nm, .n_inputs = nin, .flags = fl_,  \
                         .infer = inf, .backward = bw, .saves = sv, .autocast = ac})
    DECLA(EM_AUTOCAST_PROMOTE, op_add, "add", 2, ew, infer_broadcast, d_add, 0);
    DECLA(EM_AUTOCAST_PROMOTE, op_sub, "sub", 2, ew, infer_broadcast, d_sub, 0);
    DECLA(EM_AUTOCAST_PROMOTE, op_mul, "mul", 2, ew, infer_broadcast, d_mul, in01);
    DECLA(EM_AUTOCAST_PROMOTE, op_div, "div", 2, ew | fr, infer_broadcast, d_div, in01);
    if (st == EM_OK)
        st = em__declare(core, &op_neg, (em_op_schema){.name = "neg", .n_inputs = 1,
                         .infer = infer_same, .backward = d_neg, .prepare = prep_neg});
    DECLA(EM_AUTOCAST_FLOAT32, op_exp, "exp", 1, fr, infer_same, d_exp, out0);
    DECLA(EM_AUTOCAST_FLOAT32, op_log, "log", 1, fr, infer_same, d_log, in0);
    /* relu and its backward keep a channels-last activation's layout (EM_OP_CHANNELS_LAST:
     * the CPU loop runs over it as one flat array). */
    const unsigned cl = EM_OP_CHANNELS_LAST;
    DECL(op_relu, "relu", 1, 0, NULL, NULL, 0, cl, infer_same, d_relu, out0);
    /* relu_backward(grad, y) = grad where y > 0, else 0 (its own derivative is not needed). */
    DECL(op_relu_backward, "relu_backward", 2, 0, NULL, NULL, 0, nd | cl, infer_same, NULL, 0);
#undef DECL
#undef DECLA
    return st;
}

/* ---- public functions: one line each ------------------------------------------------------------ */

em_tensor *em_add(const em_tensor *a, const em_tensor *b) {
    return em__call1(op_add, 2, EM__IN(a, b), NULL);
}
em_tensor *em_sub(const em_tensor *a, const em_tensor *b) {
    return em__call1(op_sub, 2, EM__IN(a, b), NULL);
}
em_tensor *em_mul(const em_tensor *a, const em_tensor *b) {
    return em__call1(op_mul, 2, EM__IN(a, b), NULL);
}
em_tensor *em_div(const em_tensor *a, const em_tensor *b) {
    return em__call1(op_div, 2, EM__IN(a, b), NULL);
}
em_status em_add_(em_tensor *a, const em_tensor *b) {
    return em__op_inplace(op_add, a, EM__IN(a, b), 2, NULL);
}
em_status em_sub_(em_tensor *a, const em_tensor *b) {
    return em__op_inplace(op_sub, a, EM__IN(a, b), 2, NULL);
}
em_status em_mul_(em_tensor *a, const em_tensor *b) {
    return em__op_inplace(op_mul, a, EM__IN(a, b), 2, NULL);
}
em_status em_div_(em_tensor *a, const em_tensor *b) {
    return em__op_inplace(op_div, a, EM__IN(a, b), 2, NULL);
}
em_tensor *em_neg(const em_tensor *a) { return em__call1(op_neg, 1, &a, NULL); }
em_tensor *em_exp(const em_tensor *a) { return em__call1(op_exp, 1, &a, NULL); }
em_tensor *em_log(const em_tensor *a) { return em__call1(op_log, 1, &a, NULL); }
em_tensor *em_relu(const em_tensor *a) { return em__call1(op_relu, 1, &a, NULL); }
em_status em_relu_(em_tensor *a) { return em__op_inplace(op_relu, a, EM__IN(a), 1, NULL); }

