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

#include "internal.h"

static const em_op *op_abs, *op_sqrt, *op_rsqrt, *op_reciprocal, *op_sigmoid, *op_tanh,
    *op_log1p, *op_expm1, *op_sign, *op_gelu, *op_silu, *op_leaky_relu, *op_clamp,
    *op_add_scalar, *op_sub_scalar, *op_mul_scalar, *op_div_scalar, *op_pow_scalar, *op_pow,
    *op_maximum, *op_minimum, *op_eq, *op_ne, *op_lt, *op_le, *op_gt, *op_ge,
    *op_logical_and, *op_logical_or, *op_logical_xor, *op_logical_not, *op_where,
    *op_threshold_backward, *op_sigmoid_backward, *op_tanh_backward, *op_gelu_backward,
    *op_silu_backward, *op_leaky_relu_backward;

/* ---- inference ------------------------------------------------------------------------------- */

static em_status infer_same(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    (void)op, (void)attrs;
    out->dtype = in[0]->dtype;
    out->ndim = in[0]->ndim;
    memcpy(out->shape, in[0]->shape, sizeof(int64_t) * (size_t)in[0]->ndim);
    return EM_OK;
}

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

/* NumPy broadcasting of the op's inputs (2 or 3); names every shape when they do not
 * broadcast. */
static em_status broadcast_shapes(const em_op *op, const em_tensor *const *in, int n,
                                  em_tensor_meta *out) {
    int nd = 0;
    for (int k = 0; k < n; k++) nd = EM_MAX(nd, in[k]->ndim);
    for (int i = 0; i < nd; i++) {
        int64_t size = 1;
        for (int k = 0; k < n; k++) {
            int ik = in[k]->ndim - nd + i;
            int64_t s = ik >= 0 ? in[k]->shape[ik] : 1;
            if (s == 1 || s == size) continue;
            if (size != 1) {
                char x[160], y[160], z[160] = "";
                em__shape_str(in[0]->ndim, in[0]->shape, x, sizeof x);
                em__shape_str(in[1]->ndim, in[1]->shape, y, sizeof y);
                if (n > 2) em__shape_str(in[2]->ndim, in[2]->shape, z, sizeof z);
                return em_set_error(EM_ERR_SHAPE, "%s: shapes %s%s %s%s%s cannot be broadcast "
                                    "(dim %d: %lld vs %lld)", em_op_name(op), x,
                                    n > 2 ? "," : " and", y, n > 2 ? " and " : "", z, i - nd,
                                    (long long)size, (long long)s);
            }
            size = s;
        }
        out->shape[i] = size;
    }
    out->ndim = nd;
    return EM_OK;
}

static em_status infer_broadcast(const em_op *op, const em_tensor *const *in,
                                 const em_attr *attrs, em_tensor_meta *out) {
    (void)attrs;
    out->dtype = in[0]->dtype;
    return broadcast_shapes(op, in, 2, out);
}

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

/* ---- declarations ---------------------------------------------------------------------------- */

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
                             *const thresh[] = {"threshold"};
    static const em_attr_type tf[] = {EM_ATTR_FLOAT}, ts[] = {EM_ATTR_STRING},
                              tff[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT};
    const unsigned ew = EM_OP_PROMOTE | EM_OP_BROADCAST, nd = EM_OP_NONDIFF,
                   in0 = EM_SAVE_INPUT(0), in01 = in0 | EM_SAVE_INPUT(1),
                   out0 = EM_SAVE_OUTPUT(0);
    em_status st = EM_OK;
#define DECL(var, ...) if (st == EM_OK) st = em__declare_op(core, &var, __VA_ARGS__)
    DECL(op_abs, "abs", 1, 0, NULL, NULL, 0, 0, infer_same, d_abs, in0);
    DECL(op_sqrt, "sqrt", 1, 0, NULL, NULL, 0, 0, infer_same, d_sqrt, out0);
    DECL(op_rsqrt, "rsqrt", 1, 0, NULL, NULL, 0, 0, infer_same, d_rsqrt, out0);
    DECL(op_reciprocal, "reciprocal", 1, 0, NULL, NULL, 0, 0, infer_same, d_reciprocal,
         out0);
    DECL(op_sigmoid, "sigmoid", 1, 0, NULL, NULL, 0, 0, infer_same, d_sigmoid, out0);
    DECL(op_tanh, "tanh", 1, 0, NULL, NULL, 0, 0, infer_same, d_tanh, out0);
    DECL(op_log1p, "log1p", 1, 0, NULL, NULL, 0, 0, infer_same, d_log1p, in0);
    DECL(op_expm1, "expm1", 1, 0, NULL, NULL, 0, 0, infer_same, d_expm1, out0);
    DECL(op_sign, "sign", 1, 0, NULL, NULL, 0, 0, infer_same, d_sign, 0);
    DECL(op_gelu, "gelu", 1, 1, approx, ts, 0, 0, infer_gelu, d_gelu, in0);
    DECL(op_silu, "silu", 1, 0, NULL, NULL, 0, 0, infer_same, d_silu, in0);
    DECL(op_leaky_relu, "leaky_relu", 1, 1, slope, tf, 0, 0, infer_same, d_leaky_relu,
         in0);
    DECL(op_clamp, "clamp", 1, 2, bounds, tff, 0, 0, infer_same, d_clamp, in0);
    DECL(op_add_scalar, "add_scalar", 1, 1, value, tf, 0, 0, infer_same, d_pass, 0);
    DECL(op_sub_scalar, "sub_scalar", 1, 1, value, tf, 0, 0, infer_same, d_pass, 0);
    DECL(op_mul_scalar, "mul_scalar", 1, 1, value, tf, 0, 0, infer_same, d_mul_scalar, 0);
    DECL(op_div_scalar, "div_scalar", 1, 1, value, tf, 0, 0, infer_same, d_div_scalar, 0);
    DECL(op_pow_scalar, "pow_scalar", 1, 1, value, tf, 0, 0, infer_same, d_pow_scalar,
         in0);
    DECL(op_pow, "pow", 2, 0, NULL, NULL, 0, ew, infer_broadcast, d_pow, in01 | out0);
    DECL(op_maximum, "maximum", 2, 0, NULL, NULL, 0, ew, infer_broadcast, d_maximum, in01);
    DECL(op_minimum, "minimum", 2, 0, NULL, NULL, 0, ew, infer_broadcast, d_minimum, in01);
    /* Not differentiable: bool outputs, and the backward helpers (their own derivatives are
     * not needed: no higher-order gradients). */
    const unsigned cmp = ew | nd, lgc = EM_OP_BROADCAST | nd;
    DECL(op_eq, "eq", 2, 0, NULL, NULL, 0, cmp, infer_compare, NULL, 0);
    DECL(op_ne, "ne", 2, 0, NULL, NULL, 0, cmp, infer_compare, NULL, 0);
    DECL(op_lt, "lt", 2, 0, NULL, NULL, 0, cmp, infer_compare, NULL, 0);
    DECL(op_le, "le", 2, 0, NULL, NULL, 0, cmp, infer_compare, NULL, 0);
    DECL(op_gt, "gt", 2, 0, NULL, NULL, 0, cmp, infer_compare, NULL, 0);
    DECL(op_ge, "ge", 2, 0, NULL, NULL, 0, cmp, infer_compare, NULL, 0);
    DECL(op_logical_and, "logical_and", 2, 0, NULL, NULL, 0, lgc, infer_compare, NULL, 0);
    DECL(op_logical_or, "logical_or", 2, 0, NULL, NULL, 0, lgc, infer_compare, NULL, 0);
    DECL(op_logical_xor, "logical_xor", 2, 0, NULL, NULL, 0, lgc, infer_compare, NULL, 0);
    DECL(op_logical_not, "logical_not", 1, 0, NULL, NULL, 0, nd, infer_bool, NULL, 0);
    /* The condition is bool: it never requires grad. */
    DECL(op_where, "where", 3, 0, NULL, NULL, 1, EM_OP_BROADCAST, infer_where, d_where, in0);
    DECL(op_threshold_backward, "threshold_backward", 2, 1, thresh, tf, 0, ew | nd,
         infer_backward, NULL, 0);
    DECL(op_sigmoid_backward, "sigmoid_backward", 2, 0, NULL, NULL, 0, ew | nd, infer_backward,
         NULL, 0);
    DECL(op_tanh_backward, "tanh_backward", 2, 0, NULL, NULL, 0, ew | nd, infer_backward, NULL,
         0);
    DECL(op_gelu_backward, "gelu_backward", 2, 1, approx, ts, 0, ew | nd, infer_backward, NULL,
         0);
    DECL(op_silu_backward, "silu_backward", 2, 0, NULL, NULL, 0, ew | nd, infer_backward, NULL,
         0);
    DECL(op_leaky_relu_backward, "leaky_relu_backward", 2, 1, slope, tf, 0, ew | nd,
         infer_backward, NULL, 0);
#undef DECL
    return st;
}

/* ---- helpers ------------------------------------------------------------------------------------ */

static em_tensor *as_dtype(const em_tensor *t, em_dtype dt) {
    return t->dtype == dt ? em_tensor_retain((em_tensor *)t) : em__to_dtype(t, dt);
}

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

static em_status cast_error(const char *who, em_dtype rt, em_dtype to) {
    return em_set_error(EM_ERR_DTYPE, "%s: result type %s can't be cast to the desired output "
                        "type %s", who, em_dtype_name(rt), em_dtype_name(to));
}

/* Run a one-input op on x converted to dt. */
static em_tensor *unary_as(const em_op *op, const em_tensor *x, em_dtype dt,
                           const em_attr *attrs) {
    em_tensor *c = as_dtype(x, dt);
    em_tensor *r = c ? em__op1(op, (const em_tensor *const *)&c, 1, attrs) : NULL;
    em_tensor_release(c);
    return em__scope_track(r);
}

/* In place: x = op(x) when the op's result dtype rt is x's own dtype. */
static em_status unary_inplace(const em_op *op, const char *who, em_tensor *x, em_dtype rt,
                               const em_attr *attrs) {
    if (rt != x->dtype) return cast_error(who, rt, x->dtype);
    return em_op_call_out(op, (const em_tensor *const *)&x, 1, attrs, &x, 1);
}

/* ---- unary ------------------------------------------------------------------------------------- */

/* Ops that produce floats: integer and bool inputs compute in float32, as in PyTorch. */
static em_dtype float_of(em_dtype dt) { return em_dtype_is_floating(dt) ? dt : EM_F32; }

static em_tensor *unary_float(const em_op *op, const em_tensor *x) {
    if (!em__check_inputs(em_op_name(op), &x, 1)) return NULL;
    return unary_as(op, x, float_of(x->dtype), NULL);
}

static em_status unary_float_(const em_op *op, const char *who, em_tensor *x) {
    if (!em__check_inputs(who, (const em_tensor *const *)&x, 1)) return em_last_status();
    return unary_inplace(op, who, x, float_of(x->dtype), NULL);
}

em_tensor *em_sqrt(const em_tensor *a) { return unary_float(op_sqrt, a); }
em_tensor *em_rsqrt(const em_tensor *a) { return unary_float(op_rsqrt, a); }
em_tensor *em_reciprocal(const em_tensor *a) { return unary_float(op_reciprocal, a); }
em_tensor *em_sigmoid(const em_tensor *a) { return unary_float(op_sigmoid, a); }
em_tensor *em_tanh(const em_tensor *a) { return unary_float(op_tanh, a); }
em_tensor *em_log1p(const em_tensor *a) { return unary_float(op_log1p, a); }
em_tensor *em_expm1(const em_tensor *a) { return unary_float(op_expm1, a); }
em_status em_sqrt_(em_tensor *a) { return unary_float_(op_sqrt, "sqrt_", a); }
em_status em_rsqrt_(em_tensor *a) { return unary_float_(op_rsqrt, "rsqrt_", a); }
em_status em_reciprocal_(em_tensor *a) { return unary_float_(op_reciprocal, "reciprocal_", a); }
em_status em_sigmoid_(em_tensor *a) { return unary_float_(op_sigmoid, "sigmoid_", a); }
em_status em_tanh_(em_tensor *a) { return unary_float_(op_tanh, "tanh_", a); }
em_status em_log1p_(em_tensor *a) { return unary_float_(op_log1p, "log1p_", a); }
em_status em_expm1_(em_tensor *a) { return unary_float_(op_expm1, "expm1_", a); }

static bool check_abs(const char *who, const em_tensor *a) {
    if (!em__check_inputs(who, &a, 1)) return false;
    if (a->dtype != EM_BOOL) return true;
    em_set_error(EM_ERR_DTYPE, "%s: not supported for bool tensors", who);
    return false;
}

em_tensor *em_abs(const em_tensor *a) {
    return check_abs("abs", a) ? unary_as(op_abs, a, a->dtype, NULL) : NULL;
}
em_status em_abs_(em_tensor *a) {
    if (!check_abs("abs_", a)) return em_last_status();
    return unary_inplace(op_abs, "abs_", a, a->dtype, NULL);
}

em_tensor *em_sign(const em_tensor *a) {
    if (!em__check_inputs("sign", &a, 1)) return NULL;
    return unary_as(op_sign, a, a->dtype, NULL);
}
em_status em_sign_(em_tensor *a) {
    if (!em__check_inputs("sign_", (const em_tensor *const *)&a, 1)) return em_last_status();
    return unary_inplace(op_sign, "sign_", a, a->dtype, NULL);
}

/* Activations defined for floating tensors only (PyTorch has no integer kernels for them). */
static bool check_floating(const char *who, const em_tensor *a) {
    if (!em__check_inputs(who, &a, 1)) return false;
    if (em_dtype_is_floating(a->dtype)) return true;
    em_set_error(EM_ERR_DTYPE, "%s: expected a floating tensor, got %s", who,
                 em_dtype_name(a->dtype));
    return false;
}

static em_attr gelu_attr(const char *approximate) {
    return approximate ? (em_attr){.type = EM_ATTR_STRING, .v.s = approximate}
                       : (em_attr){.type = EM_ATTR_NONE};
}

em_tensor *em_gelu(const em_tensor *a, const char *approximate) {
    em_attr attr = gelu_attr(approximate);
    return check_floating("gelu", a) ? unary_as(op_gelu, a, a->dtype, &attr) : NULL;
}

em_tensor *em_silu(const em_tensor *a) {
    return check_floating("silu", a) ? unary_as(op_silu, a, a->dtype, NULL) : NULL;
}
em_status em_silu_(em_tensor *a) {
    if (!check_floating("silu_", a)) return em_last_status();
    return unary_inplace(op_silu, "silu_", a, a->dtype, NULL);
}

em_tensor *em_leaky_relu(const em_tensor *a, double negative_slope) {
    em_attr attr = {.type = EM_ATTR_FLOAT, .v.f = negative_slope};
    return check_floating("leaky_relu", a) ? unary_as(op_leaky_relu, a, a->dtype, &attr) : NULL;
}
em_status em_leaky_relu_(em_tensor *a, double negative_slope) {
    if (!check_floating("leaky_relu_", a)) return em_last_status();
    em_attr attr = {.type = EM_ATTR_FLOAT, .v.f = negative_slope};
    return unary_inplace(op_leaky_relu, "leaky_relu_", a, a->dtype, &attr);
}

/* ---- clamp ------------------------------------------------------------------------------------ */

/* The bounds as attributes and the dtype clamp computes in (bounds are numbers: a fractional
 * bound makes an integer tensor float32, an integral one makes a bool tensor int64). */
static bool clamp_prepare(const char *who, const em_tensor *a, const double *min,
                          const double *max, em_attr *attrs, em_dtype *rt) {
    if (!em__check_inputs(who, &a, 1)) return false;
    if (!min && !max) {
        em_set_error(EM_ERR_INVALID, "%s: at least one of min and max must be given", who);
        return false;
    }
    attrs[0] = min ? (em_attr){.type = EM_ATTR_FLOAT, .v.f = *min} : (em_attr){0};
    attrs[1] = max ? (em_attr){.type = EM_ATTR_FLOAT, .v.f = *max} : (em_attr){0};
    em_dtype t = a->dtype;
    if (min) t = scalar_result(t, *min);
    if (max) t = scalar_result(t, *max);
    *rt = t;
    return true;
}

em_tensor *em_clamp(const em_tensor *a, const double *min, const double *max) {
    em_attr attrs[2];
    em_dtype rt;
    if (!clamp_prepare("clamp", a, min, max, attrs, &rt)) return NULL;
    return unary_as(op_clamp, a, rt, attrs);
}

em_status em_clamp_(em_tensor *a, const double *min, const double *max) {
    em_attr attrs[2];
    em_dtype rt;
    if (!clamp_prepare("clamp_", a, min, max, attrs, &rt)) return em_last_status();
    return unary_inplace(op_clamp, "clamp_", a, rt, attrs);
}

/* ---- scalar arithmetic -------------------------------------------------------------------------- */

static em_dtype scalar_op_dtype(const em_op *op, em_dtype t, double v) {
    em_dtype rt = scalar_result(t, v);
    return op == op_div_scalar ? float_of(rt) : rt;
}

static em_tensor *scalar_op(const em_op *op, const em_tensor *a, double v) {
    if (!em__check_inputs(em_op_name(op), &a, 1)) return NULL;
    em_attr attr = {.type = EM_ATTR_FLOAT, .v.f = v};
    return unary_as(op, a, scalar_op_dtype(op, a->dtype, v), &attr);
}

static em_status scalar_op_(const em_op *op, const char *who, em_tensor *a, double v) {
    if (!em__check_inputs(who, (const em_tensor *const *)&a, 1)) return em_last_status();
    em_attr attr = {.type = EM_ATTR_FLOAT, .v.f = v};
    return unary_inplace(op, who, a, scalar_op_dtype(op, a->dtype, v), &attr);
}

em_tensor *em_add_scalar(const em_tensor *a, double v) { return scalar_op(op_add_scalar, a, v); }
em_tensor *em_sub_scalar(const em_tensor *a, double v) { return scalar_op(op_sub_scalar, a, v); }
em_tensor *em_mul_scalar(const em_tensor *a, double v) { return scalar_op(op_mul_scalar, a, v); }
em_tensor *em_div_scalar(const em_tensor *a, double v) { return scalar_op(op_div_scalar, a, v); }
em_status em_add_scalar_(em_tensor *a, double v) {
    return scalar_op_(op_add_scalar, "add_scalar_", a, v);
}
em_status em_sub_scalar_(em_tensor *a, double v) {
    return scalar_op_(op_sub_scalar, "sub_scalar_", a, v);
}
em_status em_mul_scalar_(em_tensor *a, double v) {
    return scalar_op_(op_mul_scalar, "mul_scalar_", a, v);
}
em_status em_div_scalar_(em_tensor *a, double v) {
    return scalar_op_(op_div_scalar, "div_scalar_", a, v);
}

em_tensor *em_pow_scalar(const em_tensor *a, double exponent) {
    if (!em__check_inputs("pow_scalar", &a, 1)) return NULL;
    if (!em_dtype_is_floating(a->dtype) && scalar_is_int(exponent) && exponent < 0) {
        em_set_error(EM_ERR_INVALID, "pow_scalar: integers to negative integer powers are not "
                     "allowed (%s tensor to the power %g)", em_dtype_name(a->dtype), exponent);
        return NULL;
    }
    return scalar_op(op_pow_scalar, a, exponent);
}

/* ---- binary ---------------------------------------------------------------------------------- */

static em_tensor *binary(const em_op *op, const em_tensor *a, const em_tensor *b) {
    const em_tensor *in[2] = {a, b};
    return em__scope_track(em__op1(op, in, 2, NULL));
}

em_tensor *em_pow(const em_tensor *a, const em_tensor *b) {
    const em_tensor *in[2] = {a, b};
    if (!em__check_inputs("pow", in, 2)) return NULL;
    if (em__result_type(in, 2) == EM_BOOL) {
        em_set_error(EM_ERR_DTYPE, "pow: not supported for two bool tensors");
        return NULL;
    }
    return binary(op_pow, a, b);
}
em_tensor *em_maximum(const em_tensor *a, const em_tensor *b) {
    return binary(op_maximum, a, b);
}
em_tensor *em_minimum(const em_tensor *a, const em_tensor *b) {
    return binary(op_minimum, a, b);
}
em_tensor *em_eq(const em_tensor *a, const em_tensor *b) { return binary(op_eq, a, b); }
em_tensor *em_ne(const em_tensor *a, const em_tensor *b) { return binary(op_ne, a, b); }
em_tensor *em_lt(const em_tensor *a, const em_tensor *b) { return binary(op_lt, a, b); }
em_tensor *em_le(const em_tensor *a, const em_tensor *b) { return binary(op_le, a, b); }
em_tensor *em_gt(const em_tensor *a, const em_tensor *b) { return binary(op_gt, a, b); }
em_tensor *em_ge(const em_tensor *a, const em_tensor *b) { return binary(op_ge, a, b); }

/* Operands of different dtypes are converted to bool (v != 0; NaN is true) rather than
 * promoted: promotion could round a tiny non-zero value to zero. */
static em_tensor *logical(const em_op *op, const em_tensor *a, const em_tensor *b) {
    const em_tensor *in[2] = {a, b};
    if (!em__check_inputs(em_op_name(op), in, 2)) return NULL;
    if (a->dtype == b->dtype) return binary(op, a, b);
    em_tensor *ba = as_dtype(a, EM_BOOL), *bb = ba ? as_dtype(b, EM_BOOL) : NULL;
    em_tensor *r = bb ? binary(op, ba, bb) : NULL;
    em_tensor_release(ba);
    em_tensor_release(bb);
    return r;
}

em_tensor *em_logical_and(const em_tensor *a, const em_tensor *b) {
    return logical(op_logical_and, a, b);
}
em_tensor *em_logical_or(const em_tensor *a, const em_tensor *b) {
    return logical(op_logical_or, a, b);
}
em_tensor *em_logical_xor(const em_tensor *a, const em_tensor *b) {
    return logical(op_logical_xor, a, b);
}
em_tensor *em_logical_not(const em_tensor *a) {
    return em__scope_track(em__op1(op_logical_not, &a, 1, NULL));
}

em_tensor *em_where(const em_tensor *cond, const em_tensor *a, const em_tensor *b) {
    const em_tensor *in[3] = {cond, a, b};
    if (!em__check_inputs("where", in, 3)) return NULL;
    if (cond->dtype != EM_BOOL) {
        em_set_error(EM_ERR_DTYPE, "where: the condition must be a bool tensor, got %s",
                     em_dtype_name(cond->dtype));
        return NULL;
    }
    em_dtype rt = em__result_type(in + 1, 2);
    em_tensor *ca = as_dtype(a, rt), *cb = ca ? as_dtype(b, rt) : NULL;
    em_tensor *r = NULL;
    if (cb) {
        const em_tensor *args[3] = {cond, ca, cb};
        r = em__op1(op_where, args, 3, NULL);
    }
    em_tensor_release(ca);
    em_tensor_release(cb);
    return em__scope_track(r);
}

/* ---- backward helpers --------------------------------------------------------------------------- */

static em_tensor *backward(const em_op *op, const em_tensor *g, const em_tensor *x,
                           const em_attr *attrs) {
    const em_tensor *in[2] = {g, x};
    return em__scope_track(em__op1(op, in, 2, attrs));
}

em_tensor *em_threshold_backward(const em_tensor *grad, const em_tensor *x, double threshold) {
    em_attr attr = {.type = EM_ATTR_FLOAT, .v.f = threshold};
    return backward(op_threshold_backward, grad, x, &attr);
}
em_tensor *em_sigmoid_backward(const em_tensor *grad, const em_tensor *y) {
    return backward(op_sigmoid_backward, grad, y, NULL);
}
em_tensor *em_tanh_backward(const em_tensor *grad, const em_tensor *y) {
    return backward(op_tanh_backward, grad, y, NULL);
}
em_tensor *em_gelu_backward(const em_tensor *grad, const em_tensor *x, const char *approximate) {
    em_attr attr = gelu_attr(approximate);
    return backward(op_gelu_backward, grad, x, &attr);
}
em_tensor *em_silu_backward(const em_tensor *grad, const em_tensor *x) {
    return backward(op_silu_backward, grad, x, NULL);
}
em_tensor *em_leaky_relu_backward(const em_tensor *grad, const em_tensor *x,
                                  double negative_slope) {
    em_attr attr = {.type = EM_ATTR_FLOAT, .v.f = negative_slope};
    return backward(op_leaky_relu_backward, grad, x, &attr);
}
