/*
 * ops_linalg.c — the standard op set, linear algebra: bmm, addmm, and the composites matmul
 * and linear: schemas, shape/dtype inference, derivatives and the typed public functions of
 * ember/ops.h.
 *
 * Kernel contracts (what a backend may assume, per op):
 *   addmm(bias, a, b) -> y   attrs: beta, alpha (floats). y (M, N) = beta * bias + alpha *
 *                         a @ b, with a (M, K), b (K, N) and bias already broadcast to (M, N)
 *                         (stride 0 on broadcast dims); one floating dtype for all (bf16 and
 *                         f16 accumulate in f32). a and b may be strided (a transposed operand
 *                         is a view with swapped strides: pass it to GEMM as transposed, do not
 *                         copy). beta == 0: bias is not read (NaN and inf in it do not
 *                         propagate, as in PyTorch). K == 0: y = beta * bias.
 *   bmm(a, b) -> y          a (B, M, K), b (B, K, N), y (B, M, N), one floating dtype; a and b
 *                         may be strided (e.g. transposed), same rules as addmm.
 *
 * matmul is composite: PyTorch's broadcasting and 1-D rules over bmm. linear is composite:
 * x (..., in) is flattened to (R, in) and multiplied by the weight (out, in) as a transposed
 * view, through addmm (with a bias) or bmm (without): one GEMM for
 * all leading dims, the weight never copied.
 */
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/tensor.h"
#include "internal.h"

static const em_op *op_addmm, *op_bmm, *op_matmul, *op_linear;

/* ---- checks and inference -------------------------------------------------------------------- */

static bool same_floating(const char *who, const em_tensor *a, const char *na,
                          const em_tensor *b, const char *nb) {
    if (a->dtype == b->dtype && em_dtype_is_floating(a->dtype)) return true;
    if (a->dtype != b->dtype)
        em_set_error(EM_ERR_DTYPE, "%s: expected %s and %s to have the same dtype, got %s and "
                     "%s", who, na, nb, em_dtype_name(a->dtype), em_dtype_name(b->dtype));
    else
        em_set_error(EM_ERR_DTYPE, "%s: expected floating operands (f32, f64, bf16, f16), got "
                     "%s", who, em_dtype_name(a->dtype));
    return false;
}

static em_status infer_bmm(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                           em_tensor_meta *out) {
    (void)op, (void)attrs;
    const em_tensor *a = in[0], *b = in[1];
    char x[160], y[160];
    if (a->ndim != 3 || b->ndim != 3) {
        em_set_error(EM_ERR_SHAPE, "bmm: expected 3-D operands (B, M, K) and (B, K, N), got "
                     "shapes %s and %s", em__shape_str(a->ndim, a->shape, x, sizeof x),
                     em__shape_str(b->ndim, b->shape, y, sizeof y));
        return em_last_status();
    }
    if (a->shape[0] != b->shape[0] || a->shape[2] != b->shape[1]) {
        em_set_error(EM_ERR_SHAPE, "bmm: shapes %s and %s cannot be multiplied as batches "
                     "(B, M, K) x (B, K, N) (%s)", em__shape_str(3, a->shape, x, sizeof x),
                     em__shape_str(3, b->shape, y, sizeof y),
                     a->shape[0] != b->shape[0] ? "batch sizes differ" : "K differs");
        return em_last_status();
    }
    if (!same_floating("bmm", a, "input", b, "mat2")) return em_last_status();
    *out = (em_tensor_meta){.dtype = a->dtype, .ndim = 3,
                            .shape = {a->shape[0], a->shape[1], b->shape[2]}};
    return EM_OK;
}


static em_status infer_addmm(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                             em_tensor_meta *out) {
    (void)op, (void)attrs;
    /* em_addmm checked shapes and dtypes and broadcast the bias; op callers (em_op_call)
     * get the same checks here. */
    const em_tensor *bias = in[0], *a = in[1], *b = in[2];
    char x[160], y[160];
    if (a->ndim != 2 || b->ndim != 2 || a->shape[1] != b->shape[0])
        return em_set_error(EM_ERR_SHAPE, "addmm: shapes %s and %s cannot be multiplied as "
                            "matrices (M, K) x (K, N)",
                            em__shape_str(a->ndim, a->shape, x, sizeof x),
                            em__shape_str(b->ndim, b->shape, y, sizeof y));
    int64_t mn[2] = {a->shape[0], b->shape[1]};
    if (bias->ndim != 2 || bias->shape[0] != mn[0] || bias->shape[1] != mn[1])
        return em_set_error(EM_ERR_SHAPE, "addmm: the op expects the bias broadcast to the "
                            "product's shape %s, got %s", em__shape_str(2, mn, x, sizeof x),
                            em__shape_str(bias->ndim, bias->shape, y, sizeof y));
    if (a->dtype != b->dtype || bias->dtype != a->dtype)
        return em_set_error(EM_ERR_DTYPE, "addmm: bias, mat1 and mat2 have dtypes %s, %s and "
                            "%s; they must match", em_dtype_name(bias->dtype),
                            em_dtype_name(a->dtype), em_dtype_name(b->dtype));
    *out = (em_tensor_meta){.dtype = a->dtype, .ndim = 2, .shape = {mn[0], mn[1]}};
    return EM_OK;
}

/* ---- derivatives ------------------------------------------------------------------------------ */

/* y = beta * bias + alpha * a @ b: d bias = beta * g, d a = alpha * g @ b^T,
 * d b = alpha * a^T @ g (bias arrives broadcast: its expand node sums the grad back). */
static em_tensor *scaled(em_tensor *t, double k) {
    return k == 1 ? t : em_mul_scalar(t, k);
}
/* x @ y laid out like `like` (see em__is_transposed_dense): linear's weight enters addmm as a
 * transposed view, and its grad then arrives contiguous, as the weight is. */
static em_tensor *mm_like(const em_tensor *like, const em_tensor *x, const em_tensor *y) {
    if (!em__is_transposed_dense(like)) return em_matmul(x, y);
    em_tensor *r = em_matmul(em_transpose(y, 0, 1), em_transpose(x, 0, 1));
    return r ? em_transpose(r, 0, 1) : NULL;
}
static em_status d_addmm(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *g = c->grad_out[0];
    double beta = c->attrs[0].type == EM_ATTR_FLOAT ? c->attrs[0].v.f : 1;
    double alpha = c->attrs[1].type == EM_ATTR_FLOAT ? c->attrs[1].v.f : 1;
    if (c->needs_grad[0] && !(gi[0] = beta == 1 ? em_tensor_retain((em_tensor *)g)
                                                : em_mul_scalar(g, beta)))
        return em_last_status();
    if (c->needs_grad[1] && !(gi[1] = scaled(mm_like(c->in[1], g, em_transpose(c->in[2], 0, 1)),
                                             alpha)))
        return em_last_status();
    if (c->needs_grad[2] && !(gi[2] = scaled(mm_like(c->in[2], em_transpose(c->in[1], 0, 1), g),
                                             alpha)))
        return em_last_status();
    return EM_OK;
}

/* x @ y batched, laid out like `like`: when like is a transposed dense view, computed as
 * (y^T @ x^T)^T so the result has like's strides. */
static em_tensor *bmm_like(const em_tensor *like, const em_tensor *x, const em_tensor *y) {
    bool t = em__is_transposed_dense(like);
    const em_tensor *in[2] = {t ? em_transpose(y, 1, 2) : x, t ? em_transpose(x, 1, 2) : y};
    em_tensor *r = em__scope_track(em__op1(op_bmm, in, 2, NULL));
    return t && r ? em_transpose(r, 1, 2) : r;
}
static em_status d_bmm(const em_backward_ctx *c, em_tensor **gi) {
    /* (B,M,K) x (B,K,N): dA = G x B^T, dB = A^T x G, each in its input's layout */
    const em_tensor *g = c->grad_out[0];
    if (c->needs_grad[0] && !(gi[0] = bmm_like(c->in[0], g, em_transpose(c->in[1], 1, 2))))
        return em_last_status();
    if (c->needs_grad[1] && !(gi[1] = bmm_like(c->in[1], em_transpose(c->in[0], 1, 2), g)))
        return em_last_status();
    return EM_OK;
}

/* ---- composites --------------------------------------------------------------------------------- */

/* PyTorch's matmul on top of the bmm op: 1-D operands become matrices (and the added dim is
 * removed afterwards); batch dims broadcast and are flattened into one. */
static em_tensor *matmul_run(const em_tensor *a, const em_tensor *b) {
    char x[160], y[160];
    if (a->ndim == 0 || b->ndim == 0) {
        em_set_error(EM_ERR_SHAPE, "matmul: both arguments need at least 1 dim, got shapes %s "
                     "and %s", em__shape_str(a->ndim, a->shape, x, sizeof x),
                     em__shape_str(b->ndim, b->shape, y, sizeof y));
        return NULL;
    }
    int64_t k_a = a->shape[a->ndim - 1], k_b = b->shape[b->ndim >= 2 ? b->ndim - 2 : 0];
    if (k_a != k_b) {
        em_set_error(EM_ERR_SHAPE, "matmul: shapes %s and %s cannot be multiplied (%lld != %lld)",
                     em__shape_str(a->ndim, a->shape, x, sizeof x),
                     em__shape_str(b->ndim, b->shape, y, sizeof y), (long long)k_a,
                     (long long)k_b);
        return NULL;
    }
    if (a->dtype != b->dtype || !em_dtype_is_floating(a->dtype)) {
        em_set_error(EM_ERR_DTYPE, "matmul: expected both operands to have the same floating "
                     "dtype, got %s and %s", em_dtype_name(a->dtype), em_dtype_name(b->dtype));
        return NULL;
    }
    /* Matrices: (..., M, K) and (..., K, N). */
    int64_t m = a->ndim >= 2 ? a->shape[a->ndim - 2] : 1, n = b->ndim >= 2 ? b->shape[b->ndim - 1] : 1;
    int ba = a->ndim > 2 ? a->ndim - 2 : 0, bb = b->ndim > 2 ? b->ndim - 2 : 0;
    int nb = EM_MAX(ba, bb);
    int64_t batch[EM_MAX_DIMS], nbatch = 1;
    for (int i = 0; i < nb; i++) {
        int ia = ba - nb + i, ib = bb - nb + i;
        int64_t sa = ia >= 0 ? a->shape[ia] : 1, sb = ib >= 0 ? b->shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            em_set_error(EM_ERR_SHAPE, "matmul: batch dims of shapes %s and %s cannot be "
                         "broadcast (%lld vs %lld)", em__shape_str(a->ndim, a->shape, x, sizeof x),
                         em__shape_str(b->ndim, b->shape, y, sizeof y), (long long)sa,
                         (long long)sb);
            return NULL;
        }
        batch[i] = sa == 1 ? sb : sa;
        nbatch *= batch[i];
    }
    int64_t ea[EM_MAX_DIMS + 2], eb[EM_MAX_DIMS + 2];
    memcpy(ea, batch, sizeof(int64_t) * (size_t)nb);
    memcpy(eb, batch, sizeof(int64_t) * (size_t)nb);
    ea[nb] = m, ea[nb + 1] = k_a;
    eb[nb] = k_a, eb[nb + 1] = n;
    int64_t a3[3] = {nbatch, m, k_a}, b3[3] = {nbatch, k_a, n};
    int64_t am[2] = {m, k_a}, bm[2] = {k_a, n};
    em_tensor *a2 = em__reshape(a, a->ndim >= 2 ? a->ndim : 2, a->ndim >= 2 ? a->shape : am);
    em_tensor *b2 = b->ndim >= 2 ? em__reshape(b, b->ndim, b->shape) : em__reshape(b, 2, bm);
    em_tensor *ae = a2 ? em__expand(a2, nb + 2, ea) : NULL;
    em_tensor *be = b2 ? em__expand(b2, nb + 2, eb) : NULL;
    em_tensor *av = ae ? em__reshape(ae, 3, a3) : NULL;
    em_tensor *bv = be ? em__reshape(be, 3, b3) : NULL;
    em_tensor *r = NULL;
    if (av && bv) {
        const em_tensor *args[2] = {av, bv};
        em_tensor *r3 = em__op1(op_bmm, args, 2, NULL);
        int64_t rs[EM_MAX_DIMS + 2];
        int nr = 0;
        for (int i = 0; i < nb; i++) rs[nr++] = batch[i];
        if (a->ndim >= 2) rs[nr++] = m;
        if (b->ndim >= 2) rs[nr++] = n;
        r = r3 ? em__view(r3, nr, rs) : NULL;
        em_tensor_release(r3);
    }
    em_tensor_release(a2);
    em_tensor_release(b2);
    em_tensor_release(ae);
    em_tensor_release(be);
    em_tensor_release(av);
    em_tensor_release(bv);
    return r;
}


/* beta * bias + alpha * a @ b with a (M, K), b (K, N), bias broadcastable to (M, N); no scope
 * tracking. */
static em_tensor *addmm_impl(const char *who, const em_tensor *bias, const em_tensor *a,
                             const em_tensor *b, double beta, double alpha) {
    int64_t mn[2] = {a->shape[0], b->shape[1]};
    em_tensor *be = em__expand(bias, 2, mn);
    if (!be) {
        char x[160], y[160];
        em_set_error(EM_ERR_SHAPE, "%s: bias of shape %s does not broadcast to the product's "
                     "shape %s", who, em__shape_str(bias->ndim, bias->shape, x, sizeof x),
                     em__shape_str(2, mn, y, sizeof y));
        return NULL;
    }
    em_attr attrs[2] = {{.type = EM_ATTR_FLOAT, .v.f = beta}, {.type = EM_ATTR_FLOAT, .v.f = alpha}};
    const em_tensor *args[3] = {be, a, b};
    em_tensor *r = em__kernel1(op_addmm, args, 3, attrs);
    em_tensor_release(be);
    return r;
}

static em_tensor *addmm_run(const em_tensor *bias, const em_tensor *a, const em_tensor *b,
                            double beta, double alpha) {
    char x[160], y[160];
    if (a->ndim != 2 || b->ndim != 2) {
        em_set_error(EM_ERR_SHAPE, "addmm: expected 2-D matrices, got shapes %s and %s",
                     em__shape_str(a->ndim, a->shape, x, sizeof x),
                     em__shape_str(b->ndim, b->shape, y, sizeof y));
        return NULL;
    }
    if (a->shape[1] != b->shape[0]) {
        em_set_error(EM_ERR_SHAPE, "addmm: shapes %s and %s cannot be multiplied (%lld != %lld)",
                     em__shape_str(2, a->shape, x, sizeof x), em__shape_str(2, b->shape, y, sizeof y),
                     (long long)a->shape[1], (long long)b->shape[0]);
        return NULL;
    }
    if (!same_floating("addmm", a, "mat1", b, "mat2") ||
        !same_floating("addmm", bias, "bias", a, "mat1"))
        return NULL;
    return addmm_impl("addmm", bias, a, b, beta, alpha);
}


static em_tensor *linear_run(const em_tensor *x, const em_tensor *weight, const em_tensor *bias) {
    char s1[160], s2[160];
    if (weight->ndim != 2 || x->ndim == 0 || x->shape[x->ndim - 1] != weight->shape[1]) {
        em_set_error(EM_ERR_SHAPE, "linear: input of shape %s and weight of shape %s do not "
                     "fit: the weight must be (out_features, in_features) with in_features "
                     "equal to the input's last dim",
                     em__shape_str(x->ndim, x->shape, s1, sizeof s1),
                     em__shape_str(weight->ndim, weight->shape, s2, sizeof s2));
        return NULL;
    }
    if (!same_floating("linear", x, "input", weight, "weight")) return NULL;
    int64_t out_f = weight->shape[0], in_f = weight->shape[1];
    if (bias) {
        if (bias->ndim > 1 || (bias->ndim == 1 && bias->shape[0] != out_f && bias->shape[0] != 1)) {
            em_set_error(EM_ERR_SHAPE, "linear: bias of shape %s does not fit weight of shape "
                         "%s: expected (%lld,)", em__shape_str(bias->ndim, bias->shape, s1, sizeof s1),
                         em__shape_str(2, weight->shape, s2, sizeof s2), (long long)out_f);
            return NULL;
        }
        if (!same_floating("linear", bias, "bias", weight, "weight")) return NULL;
    }
    /* (..., in) -> (R, in): a view when x's leading dims allow it (reshape copies otherwise). */
    int64_t rows = 1;
    for (int i = 0; i < x->ndim - 1; i++) rows *= x->shape[i];
    int64_t x2s[2] = {rows, in_f};
    em_tensor *x2 = em__reshape(x, 2, x2s);
    em_tensor *wt = em__transpose(weight, 0, 1); /* (in, out), strides swapped: no copy */
    em_tensor *r2 = NULL;
    if (x2 && wt) {
        if (bias) {
            r2 = addmm_impl("linear", bias, x2, wt, 1.0, 1.0);
        } else {
            int64_t a3[3] = {1, rows, in_f}, b3[3] = {1, in_f, out_f};
            em_tensor *x3 = em__reshape(x2, 3, a3), *w3 = em__reshape(wt, 3, b3);
            const em_tensor *args[2] = {x3, w3};
            em_tensor *r3 = x3 && w3 ? em__op1(op_bmm, args, 2, NULL) : NULL;
            int64_t rs[2] = {rows, out_f};
            r2 = r3 ? em__view(r3, 2, rs) : NULL;
            em_tensor_release(x3);
            em_tensor_release(w3);
            em_tensor_release(r3);
        }
    }
    /* (R, out) -> (..., out) */
    em_tensor *r = NULL;
    if (r2) {
        int64_t shape[EM_MAX_DIMS];
        memcpy(shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
        shape[x->ndim - 1] = out_f;
        r = em__view(r2, x->ndim, shape);
    }
    em_tensor_release(x2);
    em_tensor_release(wt);
    em_tensor_release(r2);
    return r;
}

static em_status c_matmul(const em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)op, (void)n_in, (void)attrs, (void)cap;
    *n_out = (out[0] = matmul_run(in[0], in[1])) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* addmm(bias, mat1, mat2; beta, alpha): absent scales are 1 (PyTorch's defaults). */
static em_status c_addmm(const em_op *op, const em_tensor *const *in, int n_in,
                         const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)op, (void)n_in, (void)cap;
    double beta = attrs && attrs[0].type == EM_ATTR_FLOAT ? attrs[0].v.f : 1;
    double alpha = attrs && attrs[1].type == EM_ATTR_FLOAT ? attrs[1].v.f : 1;
    *n_out = (out[0] = addmm_run(in[0], in[1], in[2], beta, alpha)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* linear(x, weight, bias): bias is optional. */
static em_status c_linear(const em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)op, (void)n_in, (void)attrs, (void)cap;
    *n_out = (out[0] = linear_run(in[0], in[1], in[2])) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* ---- declarations ---------------------------------------------------------------------------- */

em_status em__ops_declare_linalg(em_registry *core) {
    static const char *const addmm_in[] = {"bias", "mat1", "mat2"},
                             *const addmm_attrs[] = {"beta", "alpha"},
                             *const linear_in[] = {"input", "weight", "bias"};
    static const em_attr_type tff[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT};
    const unsigned in12 = EM_SAVE_INPUT(1) | EM_SAVE_INPUT(2);
    em_status st = EM_OK;
#define DECLS(var, ...) if (st == EM_OK) st = em__declare(core, &var, (em_op_schema){__VA_ARGS__, \
                                                          .category = "linalg"})
    DECLS(op_bmm, .name = "bmm", .autocast = EM_AUTOCAST_LOWER, .n_inputs = 2, .infer = infer_bmm, .backward = d_bmm,
          .saves = EM_SAVE_INPUT(0) | EM_SAVE_INPUT(1));
    /* The kernel sees the bias broadcast to (M, N); the composite does that. */
    DECLS(op_addmm, .name = "addmm", .autocast = EM_AUTOCAST_LOWER, .n_inputs = 3, .input_names = addmm_in, .n_attrs = 2,
          .attr_names = addmm_attrs, .attr_types = tff, .dispatch_arg = 1, .infer = infer_addmm,
          .backward = d_addmm, .saves = in12, .composite = c_addmm);
    DECLS(op_matmul, .name = "matmul", .autocast = EM_AUTOCAST_LOWER, .n_inputs = 2, .composite = c_matmul);
    DECLS(op_linear, .name = "linear", .autocast = EM_AUTOCAST_LOWER, .n_inputs = 3, .input_names = linear_in,
          .optional_inputs = 1u << 2, .composite = c_linear);
#undef DECLS
    return st;
}

/* ---- public functions: one line each ------------------------------------------------------------- */

em_tensor *em_bmm(const em_tensor *a, const em_tensor *b) {
    return em__call1(op_bmm, 2, EM__IN(a, b), NULL);
}
em_tensor *em_matmul(const em_tensor *a, const em_tensor *b) {
    return em__call1(op_matmul, 2, EM__IN(a, b), NULL);
}
em_tensor *em_addmm(const em_tensor *bias, const em_tensor *a, const em_tensor *b, double beta,
                    double alpha) {
    return em__call1(op_addmm, 3, EM__IN(bias, a, b),
                     EM__ATTRS(EM__A_FLOAT(beta), EM__A_FLOAT(alpha)));
}
em_tensor *em_linear(const em_tensor *x, const em_tensor *weight, const em_tensor *bias) {
    return em__call1(op_linear, 3, EM__IN(x, weight, bias), NULL);
}
