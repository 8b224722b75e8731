/*
 * ops_math.c — the standard op set, elementwise math: more unary and binary ops, comparisons,
 * logical ops, where, clamp, scalar variants, and the backward helpers of the activations:
 * schemas, shape/dtype inference, derivatives and the typed public functions of ember/ops.h.
 *
 * Kernel contracts (what a backend may assume, per op):
 *   abs/sign(x) -> y                 y has x's shape and dtype (abs: no bool; sign: any).
 *   sqrt/rsqrt/reciprocal/sigmoid/tanh/log1p/expm1/silu(x) -> y
 *                                    floating x (the wrappers convert integers to float32);
 *                                    y has x's shape and dtype; y may alias x (in place).
 *   erf/erfinv(x) -> y               floating x (integers arrive as float32); y has x's shape
 *                                    and dtype. erfinv(+-1) = +-inf, NaN outside [-1, 1].
 *   div_mode(a, b) -> y              attrs: rounding_mode (string "trunc" | "floor"; absent:
 *                                    true division, and then a and b are floating). a and b
 *                                    promoted to y's dtype and broadcast like add. trunc:
 *                                    the quotient rounded toward zero; floor: toward -inf,
 *                                    for floats as PyTorch's c10 div_floor (through fmod, so
 *                                    that a = b * y + remainder). Integers: a zero divisor is
 *                                    EM_ERR_INVALID; the most negative value over -1 wraps.
 *   gelu(x) -> y                     attrs: approximate (string "none" | "tanh"; absent:
 *                                    "none"). Floating.
 *   leaky_relu(x) -> y               attrs: negative_slope (float). Floating.
 *   clamp(x) -> y                    attrs: min, max (floats, each may be absent). y has x's
 *                                    dtype (the wrapper promotes x first); integer dtypes
 *                                    take the bounds truncated. y = x < min ? min : x, then
 *                                    y > max ? max : y (a NaN x stays NaN, a NaN single bound
 *                                    compares false and is ignored, min > max gives max); when
 *                                    both bounds are given and either is NaN, y is all NaN
 *                                    (PyTorch's semantics, checked against 1.13).
 *   add/sub/mul/div/pow_scalar(x) -> y   attrs: value (float). y = x op value, computed in
 *                                    x's dtype (f16/bf16 in float, the value rounded to
 *                                    float once; integers take the value truncated to int64
 *                                    and wrap). x is already of the result dtype.
 *   pow/maximum/minimum(a, b) -> y   promoted to y's dtype and broadcast (stride 0) like add.
 *                                    maximum/minimum propagate NaN. Integer pow with a
 *                                    negative exponent gives 1/x truncated (0 unless |x| = 1).
 *   eq/ne/lt/le/gt/ge(a, b) -> y     a and b promoted to one dtype (the kernel's) and
 *                                    broadcast; y is bool.
 *   logical_and/or/xor(a, b) -> y    a and b have one dtype (the wrapper converts both to
 *                                    bool when they differ) and are broadcast; y is bool;
 *                                    an element is true when it is non-zero (NaN is true).
 *   logical_not(x) -> y              y is bool, x any dtype.
 *   where(cond, a, b) -> y           cond bool, a and b of y's dtype (the kernel's), all
 *                                    three broadcast to y's shape.
 *   threshold_backward(g, x) -> dx   attrs: threshold (float). dx = x <= threshold ? 0 : g.
 *   sigmoid_backward(g, y) -> dx     dx = g * (1 - y) * y   (y: the forward's output).
 *   tanh_backward(g, y) -> dx        dx = g * (1 - y * y)   (y: the forward's output).
 *   gelu_backward(g, x) -> dx        attrs: approximate; dx = g * d gelu(x) / dx.
 *   silu_backward(g, x) -> dx        s = sigmoid(x); dx = g * s * (1 + x * (1 - s)).
 *   leaky_relu_backward(g, x) -> dx  attrs: negative_slope; dx = x > 0 ? g : g * slope.
 *                                    The backward ops take floating g and x of one dtype
 *                                    (promoted) broadcast to dx's shape.
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

static const em_op *op_abs, *op_sqrt, *op_rsqrt, *op_reciprocal, *op_sigmoid, *op_tanh,
    *op_log1p, *op_expm1, *op_sign, *op_gelu, *op_silu, *op_leaky_relu, *op_clamp,
    *op_add_scalar, *op_sub_scalar, *op_mul_scalar, *op_div_scalar, *op_pow_scalar, *op_pow,
    *op_maximum, *op_minimum, *op_eq, *op_ne, *op_lt, *op_le, *op_gt, *op_ge,
    *op_logical_and, *op_logical_or, *op_logical_xor, *op_logical_not, *op_where,
    *op_threshold_backward, *op_sigmoid_backward, *op_tanh_backward, *op_gelu_backward,
    *op_silu_backward, *op_leaky_relu_backward, *op_erf, *op_erfinv, *op_div_mode;

/* ---- inference ------------------------------------------------------------------------------- */

/* infer_same: em_infer_same (ember/op_helpers.h). */
#define infer_same em_infer_same

static em_status infer_bool(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    infer_same(op, in, attrs, out);
    out->dtype = EM_BOOL;
    return EM_OK;
}

/* "none" -> 0, "tanh" -> 1, anything else -> -1 (absent: "none"). */
static int gelu_mode(const em_attr *a) {
    if (a->type == EM_ATTR_NONE) return 0;
    if (a->type != EM_ATTR_STRING || !a->v.s) return -1;
    return strcmp(a->v.s, "none") == 0 ? 0 : strcmp(a->v.s, "tanh") == 0 ? 1 : -1;
}

static em_status bad_approximate(const em_op *op, const em_attr *a) {
    return em_set_error(EM_ERR_INVALID, "%s: approximate must be \"none\" or \"tanh\", got "
                        "\"%s\"", em_op_name(op),
                        a->type == EM_ATTR_STRING && a->v.s ? a->v.s : "(null)");
}

static em_status infer_gelu(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    if (gelu_mode(&attrs[0]) < 0) return bad_approximate(op, &attrs[0]);
    return infer_same(op, in, attrs, out);
}

/* The inputs' broadcast shape into out (ember/op_helpers.h names every shape on failure). */
static em_status broadcast_shapes(const em_op *op, const em_tensor *const *in, int n,
                                  em_tensor_meta *out) {
    return em_broadcast_shapes(em_op_name(op), in, n, &out->ndim, out->shape);
}

#define infer_broadcast em_infer_broadcast

static em_status infer_compare(const em_op *op, const em_tensor *const *in,
                               const em_attr *attrs, em_tensor_meta *out) {
    (void)attrs;
    if (in[0]->dtype != in[1]->dtype)
        return em_set_error(EM_ERR_DTYPE, "%s: operands have dtypes %s and %s; they must "
                            "match", em_op_name(op), em_dtype_name(in[0]->dtype),
                            em_dtype_name(in[1]->dtype));
    out->dtype = EM_BOOL;
    return broadcast_shapes(op, in, 2, out);
}

static em_status infer_where(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                             em_tensor_meta *out) {
    (void)attrs;
    if (in[0]->dtype != EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "%s: the condition must be a bool tensor, got %s",
                            em_op_name(op), em_dtype_name(in[0]->dtype));
    if (in[1]->dtype != in[2]->dtype)
        return em_set_error(EM_ERR_DTYPE, "%s: the values have dtypes %s and %s; they must "
                            "match", em_op_name(op), em_dtype_name(in[1]->dtype),
                            em_dtype_name(in[2]->dtype));
    out->dtype = in[1]->dtype;
    return broadcast_shapes(op, in, 3, out);
}

static em_status infer_backward(const em_op *op, const em_tensor *const *in,
                                const em_attr *attrs, em_tensor_meta *out) {
    if (!em_dtype_is_floating(in[0]->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s: expected floating tensors, got %s",
                            em_op_name(op), em_dtype_name(in[0]->dtype));
    if (op == op_gelu_backward && gelu_mode(&attrs[0]) < 0)
        return bad_approximate(op, &attrs[0]);
    return infer_broadcast(op, in, attrs, out);
}

/* ---- checks and dtype rules (prepare hooks) ------------------------------------------------------ */

/* The dtype an op computes in when one operand is x and the other a C double treated as
 * PyTorch treats a Python number: a value with no fractional part (and |v| < 2^63) counts as
 * an int, any other value (fractions, infinities, NaN) as a float; a number never widens a
 * tensor of its own category (f16 * 2.5 stays f16, i32 + 3 stays i32); a float makes an
 * integer or bool tensor float32, an int makes a bool tensor int64. */
static bool scalar_is_int(double v) { return v == trunc(v) && fabs(v) < 0x1p63; }

static em_dtype scalar_result(em_dtype t, double v) {
    if (em_dtype_is_floating(t)) return t;
    if (!scalar_is_int(v)) return EM_F32;
    return t == EM_BOOL ? EM_I64 : t;
}

static em_status prep_abs(const em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_dtype *dts) {
    (void)n_in, (void)attrs, (void)dts;
    if (in[0]->dtype != EM_BOOL) return EM_OK;
    return em_set_error(EM_ERR_DTYPE, "%s: not supported for bool tensors", em_op_name(op));
}

/* clamp: at least one bound; the bounds are numbers (a fractional bound makes an integer
 * tensor float32, an integral one makes a bool tensor int64). */
static em_status prep_clamp(const em_op *op, const em_tensor *const *in, int n_in,
                            const em_attr *attrs, em_dtype *dts) {
    (void)n_in;
    const em_attr *lo = attrs ? &attrs[0] : NULL, *hi = attrs ? &attrs[1] : NULL;
    bool has_lo = lo && lo->type == EM_ATTR_FLOAT, has_hi = hi && hi->type == EM_ATTR_FLOAT;
    if (!has_lo && !has_hi)
        return em_set_error(EM_ERR_INVALID, "%s: at least one of min and max must be given",
                            em_op_name(op));
    em_dtype t = in[0]->dtype;
    if (has_lo) t = scalar_result(t, lo->v.f);
    if (has_hi) t = scalar_result(t, hi->v.f);
    dts[0] = t;
    return EM_OK;
}

/* x op value: the number's dtype rule; div_scalar divides truly (integers give float32). */
static em_status prep_scalar(const em_op *op, const em_tensor *const *in, int n_in,
                             const em_attr *attrs, em_dtype *dts) {
    (void)n_in;
    double v = attrs && attrs[0].type == EM_ATTR_FLOAT ? attrs[0].v.f : 0;
    if (!attrs || attrs[0].type != EM_ATTR_FLOAT)
        return em_set_error(EM_ERR_INVALID, "%s: attribute 'value' is required", em_op_name(op));
    em_dtype rt = scalar_result(in[0]->dtype, v);
    if (op == op_div_scalar && !em_dtype_is_floating(rt)) rt = EM_F32;
    if (op == op_pow_scalar && !em_dtype_is_floating(in[0]->dtype) && scalar_is_int(v) && v < 0)
        return em_set_error(EM_ERR_INVALID, "pow_scalar: integers to negative integer powers are "
                            "not allowed (%s tensor to the power %g)",
                            em_dtype_name(in[0]->dtype), v);
    dts[0] = rt;
    return EM_OK;
}

static em_status prep_pow(const em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_dtype *dts) {
    (void)op, (void)in, (void)n_in, (void)attrs;
    if (dts[0] == EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "pow: not supported for two bool tensors");
    return EM_OK;
}

/* Operands of different dtypes are converted to bool (v != 0; NaN is true) rather than
 * promoted: promotion could round a tiny non-zero value to zero. */
static em_status prep_logical(const em_op *op, const em_tensor *const *in, int n_in,
                              const em_attr *attrs, em_dtype *dts) {
    (void)op, (void)attrs;
    if (in[0]->dtype != in[1]->dtype)
        for (int i = 0; i < n_in; i++) dts[i] = EM_BOOL;
    return EM_OK;
}

/* where: a bool condition; the values promoted to their result type. */
static em_status prep_where(const em_op *op, const em_tensor *const *in, int n_in,
                            const em_attr *attrs, em_dtype *dts) {
    (void)n_in, (void)attrs;
    if (in[0]->dtype != EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "%s: the condition must be a bool tensor, got %s",
                            em_op_name(op), em_dtype_name(in[0]->dtype));
    dts[1] = dts[2] = em__result_type(in + 1, 2);
    return EM_OK;
}

/* div_mode's rounding_mode: 0 absent (true division), 1 "trunc", 2 "floor", -1 other. */
static int rounding_mode(const em_attr *attrs) {
    if (!attrs || attrs[0].type == EM_ATTR_NONE) return 0;
    if (attrs[0].type != EM_ATTR_STRING || !attrs[0].v.s) return -1;
    return strcmp(attrs[0].v.s, "trunc") == 0 ? 1 : strcmp(attrs[0].v.s, "floor") == 0 ? 2 : -1;
}

/* div_mode: true division (absent mode) makes integers float32, as em_div does; a rounding
 * mode keeps the promoted dtype (integer division for integers), not for bool. */
static em_status prep_div_mode(const em_op *op, const em_tensor *const *in, int n_in,
                               const em_attr *attrs, em_dtype *dts) {
    (void)in;
    int m = rounding_mode(attrs);
    if (m < 0)
        return em_set_error(EM_ERR_INVALID, "%s: rounding_mode must be \"trunc\", \"floor\" or "
                            "absent (true division), got \"%s\"", em_op_name(op),
                            attrs[0].type == EM_ATTR_STRING ? attrs[0].v.s : "(not a string)");
    em_dtype rt = dts[0];
    if (m == 0 && !em_dtype_is_floating(rt)) rt = EM_F32;
    if (m != 0 && rt == EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "%s: division of two bool tensors with rounding mode "
                            "\"%s\" is not supported", em_op_name(op), attrs[0].v.s);
    for (int i = 0; i < n_in; i++) dts[i] = rt;
    return EM_OK;
}

static em_status infer_div_mode(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                                em_tensor_meta *out) {
    int m = rounding_mode(attrs);
    if (m < 0 || (m == 0 && !em_dtype_is_floating(in[0]->dtype)))
        return em_set_error(EM_ERR_INVALID, "%s: rounding_mode must be \"trunc\" or \"floor\" "
                            "(absent: true division of floating tensors)", em_op_name(op));
    return infer_broadcast(op, in, attrs, out);
}

/* ---- derivatives ------------------------------------------------------------------------------
 * Written with the public ops; they run with grad mode off inside a scope of their own, so
 * temporaries need no release. A grad passed through unchanged is returned as a new reference
 * (em_tensor_retain). Inputs arrive promoted and broadcast (the dispatcher's views and copies
 * carry those parts of the derivative), so every grad here has the output's shape. */

#define G (c->grad_out[0])
#define NEED(i) (c->needs_grad[i])
#define X (c->in[0])
#define Y (c->out[0])

static em_status done(em_tensor *g, em_tensor **slot) {
    *slot = g;
    return g ? EM_OK : em_last_status();
}

/* A 0-dim tensor of value v in t's dtype and device (to broadcast against t). */
static em_tensor *scalar_like(const em_tensor *t, double v) {
    return em_full(0, NULL, v, em_tensor_dtype(t), em_tensor_device(t));
}

static em_tensor *zeros_of(const em_backward_ctx *c, int i) {
    return em_zeros(c->in_meta[i].ndim, c->in_meta[i].shape, c->in_meta[i].dtype,
                    em_tensor_device(G));
}

/* g where keep is true, else 0. */
static em_tensor *keep_where(const em_tensor *keep, const em_tensor *g) {
    return em_where(keep, g, scalar_like(g, 0));
}

static em_status d_abs(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_mul(G, em_sign(X)), &gi[0]);
}
static em_status d_sign(const em_backward_ctx *c, em_tensor **gi) {
    return done(zeros_of(c, 0), &gi[0]);
}
static em_status d_sqrt(const em_backward_ctx *c, em_tensor **gi) { /* 1 / (2 sqrt(x)) */
    return done(em_div(G, em_mul_scalar(Y, 2)), &gi[0]);
}
static em_status d_rsqrt(const em_backward_ctx *c, em_tensor **gi) { /* -x^(-3/2) / 2 */
    return done(em_mul(G, em_mul_scalar(em_mul(em_mul(Y, Y), Y), -0.5)), &gi[0]);
}
static em_status d_reciprocal(const em_backward_ctx *c, em_tensor **gi) { /* -1 / x^2 */
    return done(em_mul(G, em_neg(em_mul(Y, Y))), &gi[0]);
}
static em_status d_sigmoid(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_sigmoid_backward(G, Y), &gi[0]);
}
static em_status d_tanh(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_tanh_backward(G, Y), &gi[0]);
}
static em_status d_gelu(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *in[2] = {G, X};
    return done(em__scope_track(em__op1(op_gelu_backward, in, 2, c->attrs)), &gi[0]);
}
static em_status d_silu(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_silu_backward(G, X), &gi[0]);
}
static em_status d_leaky_relu(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_leaky_relu_backward(G, X, c->attrs[0].v.f), &gi[0]);
}
static em_status d_log1p(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_div(G, em_add_scalar(X, 1)), &gi[0]);
}
static em_status d_expm1(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_mul(G, em_add_scalar(Y, 1)), &gi[0]);
}

/* d(a^b)/da = b a^(b-1) (0 where b == 0); d(a^b)/db = a^b log a (0 where a == 0 and b >= 0),
 * as PyTorch's pow_backward_self / pow_backward_exponent. */
static em_status d_pow(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *a = c->in[0], *b = c->in[1];
    if (NEED(0)) {
        em_tensor *d = em_mul(b, em_pow(a, em_sub_scalar(b, 1)));
        em_tensor *z = d ? em_eq(b, scalar_like(b, 0)) : NULL;
        if (!z || done(em_mul(G, em_where(z, scalar_like(d, 0), d)), &gi[0]) != EM_OK)
            return em_last_status();
    }
    if (NEED(1)) {
        em_tensor *z = em_logical_and(em_eq(a, scalar_like(a, 0)), em_ge(b, scalar_like(b, 0)));
        em_tensor *d = z ? em_mul(Y, em_log(a)) : NULL;
        if (!d || done(em_mul(G, em_where(z, scalar_like(d, 0), d)), &gi[1]) != EM_OK)
            return em_last_status();
    }
    return EM_OK;
}
static em_status d_pow_scalar(const em_backward_ctx *c, em_tensor **gi) {
    double p = c->attrs[0].v.f;
    if (p == 0) return done(zeros_of(c, 0), &gi[0]);
    return done(em_mul(G, em_mul_scalar(em_pow_scalar(X, p - 1), p)), &gi[0]);
}

/* maximum/minimum: the grad goes to the operand that won, split equally on ties (PyTorch).
 * Input 0 gets nothing where it lost (a < b for maximum), input 1 where a won. */
static em_status minmax(const em_backward_ctx *c, em_tensor **gi, bool is_max) {
    const em_tensor *a = c->in[0], *b = c->in[1];
    em_tensor *tie = em_eq(a, b);
    em_tensor *half = tie ? em_where(tie, em_mul_scalar(G, 0.5), G) : NULL;
    if (!half) return em_last_status();
    if (NEED(0) && !(gi[0] = em_masked_fill(half, is_max ? em_lt(a, b) : em_gt(a, b), 0)))
        return em_last_status();
    if (NEED(1) && !(gi[1] = em_masked_fill(half, is_max ? em_gt(a, b) : em_lt(a, b), 0)))
        return em_last_status();
    return EM_OK;
}
static em_status d_maximum(const em_backward_ctx *c, em_tensor **gi) {
    return minmax(c, gi, true);
}
static em_status d_minimum(const em_backward_ctx *c, em_tensor **gi) {
    return minmax(c, gi, false);
}

/* The grad passes where min <= x <= max (a bound that is absent does not limit). */
static em_status d_clamp(const em_backward_ctx *c, em_tensor **gi) {
    const em_attr *lo = &c->attrs[0], *hi = &c->attrs[1];
    em_tensor *keep = NULL;
    if (lo->type == EM_ATTR_FLOAT) keep = em_ge(X, scalar_like(X, lo->v.f));
    if (hi->type == EM_ATTR_FLOAT) {
        em_tensor *k = em_le(X, scalar_like(X, hi->v.f));
        keep = keep && k ? em_logical_and(keep, k) : k;
    }
    if (!keep) return em_last_status();
    return done(keep_where(keep, G), &gi[0]);
}

static em_status d_where(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *cond = c->in[0];
    if (NEED(1) && !(gi[1] = keep_where(cond, G))) return em_last_status();
    if (NEED(2) && !(gi[2] = em_where(cond, scalar_like(G, 0), G))) return em_last_status();
    return EM_OK;
}

/* d erf(x) = 2 / sqrt(pi) exp(-x^2); d erfinv(x) = sqrt(pi) / 2 exp(erfinv(x)^2). */
static em_status d_erf(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_mul(G, em_mul_scalar(em_exp(em_neg(em_mul(X, X))), 1.12837916709551257390)),
                &gi[0]);
}
static em_status d_erfinv(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_mul(G, em_mul_scalar(em_exp(em_mul(Y, Y)), 0.88622692545275801365)), &gi[0]);
}
/* True division as div; with a rounding mode the quotient is piecewise constant: zero
 * gradients (PyTorch's derivatives.yaml). */
static em_status d_div_mode(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *a = c->in[0], *b = c->in[1];
    for (int i = 0; i < 2; i++)
        if (NEED(i) && rounding_mode(c->attrs) != 0 && !(gi[i] = zeros_of(c, i)))
            return em_last_status();
    if (rounding_mode(c->attrs) != 0) return EM_OK;
    if (NEED(0) && !(gi[0] = em_div(G, b))) return em_last_status();
    if (NEED(1) && !(gi[1] = em_neg(em_div(em_mul(G, a), em_mul(b, b))))) return em_last_status();
    return EM_OK;
}

static em_status d_pass(const em_backward_ctx *c, em_tensor **gi) {
    gi[0] = em_tensor_retain(G);
    return EM_OK;
}
static em_status d_mul_scalar(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_mul_scalar(G, c->attrs[0].v.f), &gi[0]);
}
static em_status d_div_scalar(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_div_scalar(G, c->attrs[0].v.f), &gi[0]);
}
#undef G
#undef NEED
#undef X
#undef Y

em_status em__ops_declare_math(em_registry *core) {
    static const char *const value[] = {"value"}, *const approx[] = {"approximate"},
                             *const slope[] = {"negative_slope"},
                             *const bounds[] = {"min", "max"},
                             *const thresh[] = {"threshold"},
                             *const rounding[] = {"rounding_mode"};
    static const em_attr_type tf[] = {EM_ATTR_FLOAT}, ts[] = {EM_ATTR_STRING},
                              tff[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT};
    const unsigned ew = EM_OP_PROMOTE | EM_OP_BROADCAST, nd = EM_OP_NONDIFF,
                   fr = EM_OP_FLOAT_RESULT, fl = EM_OP_FLOATING,
                   in0 = EM_SAVE_INPUT(0), in01 = in0 | EM_SAVE_INPUT(1),
                   out0 = EM_SAVE_OUTPUT(0);
    em_status st = EM_OK;
    /* name, inputs, attributes (count, names, types), policy flags, inference, derivative and
     * what it saves, prepare hook.
     * DA also declares the op's autocast class (ember/autocast.h); D leaves it unaffected. */
#define DA(ac, var, nm, nin, na, an, at, fl_, inf, bw, sv, prep)                                \
    if (st == EM_OK)                                                                            \
        st = em__declare(core, &var, (em_op_schema){.name = nm, .n_inputs = nin, .n_attrs = na, \
                         .attr_names = an, .attr_types = at, .flags = fl_, .infer = inf,        \
                         .backward = bw, .saves = sv, .prepare = prep,                          \
                         .dispatch_arg = strcmp(nm, "where") == 0, .category = "elementwise",   \
                         .autocast = ac})
#define D(...) DA(EM_AUTOCAST_NONE, __VA_ARGS__)
    D(op_abs, "abs", 1, 0, NULL, NULL, 0, infer_same, d_abs, in0, prep_abs);
    D(op_sqrt, "sqrt", 1, 0, NULL, NULL, fr, infer_same, d_sqrt, out0, NULL);
    DA(EM_AUTOCAST_FLOAT32, op_rsqrt, "rsqrt", 1, 0, NULL, NULL, fr, infer_same, d_rsqrt, out0, NULL);
    DA(EM_AUTOCAST_FLOAT32, op_reciprocal, "reciprocal", 1, 0, NULL, NULL, fr, infer_same, d_reciprocal, out0, NULL);
    D(op_sigmoid, "sigmoid", 1, 0, NULL, NULL, fr, infer_same, d_sigmoid, out0, NULL);
    D(op_tanh, "tanh", 1, 0, NULL, NULL, fr, infer_same, d_tanh, out0, NULL);
    DA(EM_AUTOCAST_FLOAT32, op_log1p, "log1p", 1, 0, NULL, NULL, fr, infer_same, d_log1p, in0, NULL);
    DA(EM_AUTOCAST_FLOAT32, op_expm1, "expm1", 1, 0, NULL, NULL, fr, infer_same, d_expm1, out0, NULL);
    D(op_sign, "sign", 1, 0, NULL, NULL, 0, infer_same, d_sign, 0, NULL);
    D(op_erf, "erf", 1, 0, NULL, NULL, fr, infer_same, d_erf, in0, NULL);
    DA(EM_AUTOCAST_FLOAT32, op_erfinv, "erfinv", 1, 0, NULL, NULL, fr, infer_same, d_erfinv, out0, NULL);
    D(op_div_mode, "div_mode", 2, 1, rounding, ts, ew, infer_div_mode, d_div_mode, in01,
      prep_div_mode);
    D(op_gelu, "gelu", 1, 1, approx, ts, fl, infer_gelu, d_gelu, in0, NULL);
    D(op_silu, "silu", 1, 0, NULL, NULL, fl, infer_same, d_silu, in0, NULL);
    D(op_leaky_relu, "leaky_relu", 1, 1, slope, tf, fl, infer_same, d_leaky_relu, in0, NULL);
    D(op_clamp, "clamp", 1, 2, bounds, tff, 0, infer_same, d_clamp, in0, prep_clamp);
    D(op_add_scalar, "add_scalar", 1, 1, value, tf, 0, infer_same, d_pass, 0, prep_scalar);
    D(op_sub_scalar, "sub_scalar", 1, 1, value, tf, 0, infer_same, d_pass, 0, prep_scalar);
    D(op_mul_scalar, "mul_scalar", 1, 1, value, tf, 0, infer_same, d_mul_scalar, 0,
      prep_scalar);
    D(op_div_scalar, "div_scalar", 1, 1, value, tf, 0, infer_same, d_div_scalar, 0,
      prep_scalar);
    DA(EM_AUTOCAST_FLOAT32, op_pow_scalar, "pow_scalar", 1, 1, value, tf, 0, infer_same, d_pow_scalar, in0,
      prep_scalar);
    DA(EM_AUTOCAST_FLOAT32, op_pow, "pow", 2, 0, NULL, NULL, ew, infer_broadcast, d_pow, in01 | out0, prep_pow);
    DA(EM_AUTOCAST_PROMOTE, op_maximum, "maximum", 2, 0, NULL, NULL, ew, infer_broadcast, d_maximum, in01, NULL);
    DA(EM_AUTOCAST_PROMOTE, op_minimum, "minimum", 2, 0, NULL, NULL, ew, infer_broadcast, d_minimum, in01, NULL);
    /* Not differentiable: bool outputs, and the backward helpers (their own derivatives are
     * not needed: no higher-order gradients). */
    const unsigned cmp = ew | nd, lgc = EM_OP_BROADCAST | nd;
    D(op_eq, "eq", 2, 0, NULL, NULL, cmp, infer_compare, NULL, 0, NULL);
    D(op_ne, "ne", 2, 0, NULL, NULL, cmp, infer_compare, NULL, 0, NULL);
    D(op_lt, "lt", 2, 0, NULL, NULL, cmp, infer_compare, NULL, 0, NULL);
    D(op_le, "le", 2, 0, NULL, NULL, cmp, infer_compare, NULL, 0, NULL);
    D(op_gt, "gt", 2, 0, NULL, NULL, cmp, infer_compare, NULL, 0, NULL);
    D(op_ge, "ge", 2, 0, NULL, NULL, cmp, infer_compare, NULL, 0, NULL);
    D(op_logical_and, "logical_and", 2, 0, NULL, NULL, lgc, infer_compare, NULL, 0,
      prep_logical);
    D(op_logical_or, "logical_or", 2, 0, NULL, NULL, lgc, infer_compare, NULL, 0, prep_logical);
    D(op_logical_xor, "logical_xor", 2, 0, NULL, NULL, lgc, infer_compare, NULL, 0,
      prep_logical);
    D(op_logical_not, "logical_not", 1, 0, NULL, NULL, nd, infer_bool, NULL, 0, NULL);
    /* The condition is bool: it never requires grad; input 1 picks the kernel. */
    DA(EM_AUTOCAST_PROMOTE, op_where, "where", 3, 0, NULL, NULL, EM_OP_BROADCAST, infer_where, d_where, in0,
      prep_where);
    D(op_threshold_backward, "threshold_backward", 2, 1, thresh, tf, ew | nd, infer_backward,
      NULL, 0, NULL);
    D(op_sigmoid_backward, "sigmoid_backward", 2, 0, NULL, NULL, ew | nd, infer_backward, NULL,
      0, NULL);
    D(op_tanh_backward, "tanh_backward", 2, 0, NULL, NULL, ew | nd, infer_backward, NULL, 0,
      NULL);
    D(op_gelu_backward, "gelu_backward", 2, 1, approx, ts, ew | nd, infer_backward, NULL, 0,
      NULL);
    D(op_silu_backward, "silu_backward", 2, 0, NULL, NULL, ew | nd, infer_backward, NULL, 0,
      NULL);
    D(op_leaky_relu_backward, "leaky_relu_backward", 2, 1, slope, tf, ew | nd, infer_backward,
      NULL, 0, NULL);
#undef D
#undef DA
    return st;
}

/* ---- public functions: one line each over the schemas above ------------------------------------ */

#define U1(fn, op)                                                                              \
    em_tensor *fn(const em_tensor *a) { return em__call1(op, 1, &a, NULL); }
#define U1_(fn, op)                                                                             \
    em_status fn(em_tensor *a) { return em__op_inplace(op, a, EM__IN(a), 1, NULL); }
U1(em_sqrt, op_sqrt) U1(em_rsqrt, op_rsqrt) U1(em_reciprocal, op_reciprocal)
U1(em_sigmoid, op_sigmoid) U1(em_tanh, op_tanh) U1(em_log1p, op_log1p) U1(em_expm1, op_expm1)
U1(em_erf, op_erf) U1(em_erfinv, op_erfinv)
U1(em_abs, op_abs) U1(em_sign, op_sign) U1(em_silu, op_silu) U1(em_logical_not, op_logical_not)
U1_(em_sqrt_, op_sqrt) U1_(em_rsqrt_, op_rsqrt) U1_(em_reciprocal_, op_reciprocal)
U1_(em_sigmoid_, op_sigmoid) U1_(em_tanh_, op_tanh) U1_(em_log1p_, op_log1p)
U1_(em_expm1_, op_expm1) U1_(em_abs_, op_abs) U1_(em_sign_, op_sign) U1_(em_silu_, op_silu)
#undef U1
#undef U1_

em_tensor *em_gelu(const em_tensor *a, const char *approximate) {
    return em__call1(op_gelu, 1, &a, EM__ATTRS(EM__A_STR(approximate)));
}
em_tensor *em_leaky_relu(const em_tensor *a, double negative_slope) {
    return em__call1(op_leaky_relu, 1, &a, EM__ATTRS(EM__A_FLOAT(negative_slope)));
}
em_status em_leaky_relu_(em_tensor *a, double negative_slope) {
    return em__op_inplace(op_leaky_relu, a, EM__IN(a), 1, EM__ATTRS(EM__A_FLOAT(negative_slope)));
}
em_tensor *em_clamp(const em_tensor *a, const double *min, const double *max) {
    return em__call1(op_clamp, 1, &a, EM__ATTRS(EM__A_OPTF(min), EM__A_OPTF(max)));
}
em_status em_clamp_(em_tensor *a, const double *min, const double *max) {
    return em__op_inplace(op_clamp, a, EM__IN(a), 1, EM__ATTRS(EM__A_OPTF(min), EM__A_OPTF(max)));
}

#define S1(fn, op)                                                                              \
    em_tensor *fn(const em_tensor *a, double v) {                                               \
        return em__call1(op, 1, &a, EM__ATTRS(EM__A_FLOAT(v)));                                 \
    }
#define S1_(fn, op)                                                                             \
    em_status fn(em_tensor *a, double v) {                                                      \
        return em__op_inplace(op, a, EM__IN(a), 1, EM__ATTRS(EM__A_FLOAT(v)));                  \
    }
S1(em_add_scalar, op_add_scalar) S1(em_sub_scalar, op_sub_scalar)
S1(em_mul_scalar, op_mul_scalar) S1(em_div_scalar, op_div_scalar)
S1(em_pow_scalar, op_pow_scalar)
S1_(em_add_scalar_, op_add_scalar) S1_(em_sub_scalar_, op_sub_scalar)
S1_(em_mul_scalar_, op_mul_scalar) S1_(em_div_scalar_, op_div_scalar)
#undef S1
#undef S1_

#define B2(fn, op)                                                                              \
    em_tensor *fn(const em_tensor *a, const em_tensor *b) {                                     \
        return em__call1(op, 2, EM__IN(a, b), NULL);                                            \
    }
B2(em_pow, op_pow) B2(em_maximum, op_maximum) B2(em_minimum, op_minimum)
B2(em_eq, op_eq) B2(em_ne, op_ne) B2(em_lt, op_lt) B2(em_le, op_le) B2(em_gt, op_gt)
B2(em_ge, op_ge) B2(em_logical_and, op_logical_and) B2(em_logical_or, op_logical_or)
B2(em_logical_xor, op_logical_xor)
B2(em_sigmoid_backward, op_sigmoid_backward) B2(em_tanh_backward, op_tanh_backward)
B2(em_silu_backward, op_silu_backward)
#undef B2

em_tensor *em_where(const em_tensor *cond, const em_tensor *a, const em_tensor *b) {
    return em__call1(op_where, 3, EM__IN(cond, a, b), NULL);
}
em_tensor *em_threshold_backward(const em_tensor *grad, const em_tensor *x, double threshold) {
    return em__call1(op_threshold_backward, 2, EM__IN(grad, x), EM__ATTRS(EM__A_FLOAT(threshold)));
}
em_tensor *em_gelu_backward(const em_tensor *grad, const em_tensor *x, const char *approximate) {
    return em__call1(op_gelu_backward, 2, EM__IN(grad, x), EM__ATTRS(EM__A_STR(approximate)));
}
em_tensor *em_leaky_relu_backward(const em_tensor *grad, const em_tensor *x,
                                  double negative_slope) {
    return em__call1(op_leaky_relu_backward, 2, EM__IN(grad, x),
                     EM__ATTRS(EM__A_FLOAT(negative_slope)));
}
em_tensor *em_div_mode(const em_tensor *a, const em_tensor *b, const char *rounding_mode) {
    return em__call1(op_div_mode, 2, EM__IN(a, b), EM__ATTRS(EM__A_STR(rounding_mode)));
}
em_tensor *em_floor_divide(const em_tensor *a, const em_tensor *b) {
    return em__call1(op_div_mode, 2, EM__IN(a, b), EM__ATTRS(EM__A_STR("floor")));
}
