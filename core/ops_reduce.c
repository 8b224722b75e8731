/*
 * ops_reduce.c — the standard op set, reductions: max, min (values and indices), amax, amin,
 * argmax, argmin, var, std, logsumexp, norm, prod, all, any: schemas, shape/dtype inference
 * and the typed public functions of ember/ops.h. Also the dims helpers sum and mean share
 * (em__reduce_dims, em__reduce_drop).
 *
 * Every reduction op keeps the reduced dims (as size 1) in its output; the public functions
 * drop them afterwards unless keepdim. Attribute `dims` is always already normalised, sorted
 * and unique (an empty list reduces nothing: a 0-dim input has no dims).
 *
 * Kernel contracts (what a backend may assume, per op):
 *   amax/amin(x) -> y     attrs: dims. y has x's dtype (any dtype, bool included). Every
 *                         reduced dim has size > 0. NaN propagates.
 *   max_dim/min_dim(x) -> (values, indices)   attrs: dim (int, normalised; 0 for a 0-dim x).
 *                         values has x's dtype, indices int64, both with size 1 on dim.
 *                         x's size on dim is > 0. The index is the first occurrence of the
 *                         extreme value; a NaN is the extreme (the first NaN wins).
 *   argmax/argmin(x) -> y attrs: dims (one dim, or every dim for the flattened form). y is
 *                         int64: the C-order index within the reduced dims (for every dim,
 *                         the flat index). x is not bool; reduced dims are non-empty.
 *   var/std(x) -> y       attrs: dims, correction (float). Floating x (f16/bf16 computed in
 *                         float or wider); y = sum (x - mean)^2 / max(0, N - correction)
 *                         (std: its square root); N == 0 gives NaN.
 *   logsumexp(x) -> y     attrs: dims. Floating x. max-shifted; an infinite max shifts by 0
 *                         (all -inf gives -inf; +inf gives +inf); empty gives -inf.
 *   norm(x) -> y          attrs: dims, p (float). Floating x. p = 0: count of non-zeros;
 *                         inf/-inf: max/min of |x| (reduced dims non-empty); otherwise
 *                         (sum |x|^p)^(1/p). Empty gives 0.
 *   prod(x) -> y          attrs: dims. Floating or int64 x (other ints and bool arrive as
 *                         int64; int64 products wrap). Empty gives 1.
 *   all/any(x) -> y       attrs: dims. Any x dtype; y is bool, or uint8 for a uint8 x (as in
 *                         PyTorch). Empty: all is true, any false.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

static const em_op *op_amax, *op_amin, *op_max_dim, *op_min_dim, *op_argmax, *op_argmin,
    *op_var, *op_std, *op_logsumexp, *op_norm, *op_prod, *op_all, *op_any;

/* ---- dims helpers (shared with sum and mean in ops.c) ----------------------------------------- */

em_status em__reduce_dims(const char *who, const em_tensor *a, int ndims, const int *dims,
                          em_attr *attr) {
    bool mark[EM_MAX_DIMS] = {false};
    if (ndims < 0 || ndims > EM_MAX_DIMS || (ndims > 0 && !dims))
        return em_set_error(EM_ERR_INVALID, "%s: %d dims given", who, ndims);
    for (int i = 0; i < ndims; i++) {
        int d = em__wrap_dim(dims[i], a->ndim, who);
        if (d < 0) return em_last_status();
        if (mark[d] && a->ndim > 0)
            return em_set_error(EM_ERR_INVALID, "%s: dim %d appears more than once", who, d);
        mark[d] = true;
    }
    *attr = (em_attr){.type = EM_ATTR_INTS};
    for (int d = 0; d < a->ndim; d++)
        if (ndims == 0 || mark[d]) attr->ints[attr->n++] = d;
    return EM_OK;
}

em_tensor *em__reduce_drop(em_tensor *r, const em_attr *dims, bool keepdim) {
    if (!r || keepdim) return r;
    int64_t shape[EM_MAX_DIMS];
    int n = 0;
    for (int d = 0, j = 0; d < r->ndim; d++) {
        if (j < dims->n && dims->ints[j] == d) {
            j++;
            continue;
        }
        shape[n++] = r->shape[d];
    }
    em_tensor *v = em__view(r, n, shape);
    if (v) em__autograd_name_view(v, em_tensor_grad_fn_name(r));
    em_tensor_release(r);
    return v;
}

/* The ops without an identity (max, min, argmax, norm with p = +-inf) reject an empty
 * reduction, naming the dim as PyTorch does. */
static em_status check_nonempty(const char *who, const em_tensor *a, int ndims,
                                const em_attr *dims) {
    char s[160];
    if (a->numel != 0) return EM_OK;
    if (ndims == 0)
        return em_set_error(EM_ERR_SHAPE, "%s: cannot reduce all %lld elements of an empty "
                            "tensor of shape %s: the operation has no identity; specify the "
                            "reduction dims", who, (long long)a->numel,
                            em__shape_str(a->ndim, a->shape, s, sizeof s));
    for (int i = 0; i < dims->n; i++)
        if (a->shape[dims->ints[i]] == 0)
            return em_set_error(EM_ERR_SHAPE, "%s: expected reduction dim %d to have non-zero "
                                "size (input shape %s); the operation has no identity", who,
                                (int)dims->ints[i], em__shape_str(a->ndim, a->shape, s, sizeof s));
    return EM_OK;
}

static em_status check_floating(const char *who, const em_tensor *a) {
    if (em_dtype_is_floating(a->dtype)) return EM_OK;
    return em_set_error(EM_ERR_DTYPE, "%s: expected a floating tensor (float32, float64, "
                        "float16 or bfloat16), got %s; convert it with em_to_dtype first", who,
                        em_dtype_name(a->dtype));
}

/* ---- inference -------------------------------------------------------------------------------- */

/* x's shape with the dims of attrs[0] set to 1, dtype dt (or x's when dt < 0). */
static void keep_shape(const em_tensor *x, const em_attr *dims, int dt, em_tensor_meta *out) {
    out->dtype = dt < 0 ? x->dtype : (em_dtype)dt;
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    for (int i = 0; i < dims->n; i++) out->shape[dims->ints[i]] = 1;
}

static em_status infer_same(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    (void)op;
    keep_shape(in[0], &attrs[0], -1, out);
    return EM_OK;
}

static em_status infer_index(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                             em_tensor_meta *out) {
    (void)op;
    keep_shape(in[0], &attrs[0], EM_I64, out);
    return EM_OK;
}

static em_status infer_bool(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                            em_tensor_meta *out) {
    (void)op;
    keep_shape(in[0], &attrs[0], in[0]->dtype == EM_U8 ? EM_U8 : EM_BOOL, out);
    return EM_OK;
}

static em_status infer_max_dim(const em_op *op, const em_tensor *const *in,
                               const em_attr *attrs, em_tensor_meta *out) {
    (void)op;
    em_attr dims = {.type = EM_ATTR_INTS, .n = in[0]->ndim > 0, .ints = {attrs[0].v.i}};
    keep_shape(in[0], &dims, -1, &out[0]);
    keep_shape(in[0], &dims, EM_I64, &out[1]);
    return EM_OK;
}

/* ---- declarations ----------------------------------------------------------------------------- */

static em_status declare(em_registry *core, const em_op **out, const char *name, int n_out,
                         int n_attrs, const char *const *attr_names, const em_attr_type *types,
                         em_infer_fn infer, em_backward_fn backward, unsigned saves) {
    em_op_schema s = {.struct_size = sizeof s, .name = name, .n_inputs = 1, .n_outputs = n_out,
                      .n_attrs = n_attrs, .attr_names = attr_names, .attr_types = types,
                      .dispatch_arg = 0, .infer = infer, .backward = backward, .saves = saves,
                      .flags = backward ? 0 : EM_OP_NONDIFF};
    return em_op_declare(core, &s, out);
}

/* ---- derivatives -------------------------------------------------------------------------------
 * Every reduction op keeps its reduced dims (size 1), so the output and its grad broadcast
 * against the input directly. */

#define G (c->grad_out[0])
#define X (c->in[0])
#define Y (c->out[0])
#define RET(expr) return (gi[0] = (expr)) ? EM_OK : em_last_status()

/* The reduced dims (attribute 0) as an int list for em_sum/em_mean. */
static int attr_dims(const em_backward_ctx *c, int *dims) {
    for (int i = 0; i < c->attrs[0].n; i++) dims[i] = (int)c->attrs[0].ints[i];
    return c->attrs[0].n;
}

/* amax/amin: the grad is shared evenly among the elements equal to the extreme (PyTorch). */
static em_status d_amax(const em_backward_ctx *c, em_tensor **gi) {
    int dims[EM_MAX_DIMS], nd = attr_dims(c, dims);
    em_tensor *mask = em_to_dtype(em_eq(X, Y), X->dtype);
    em_tensor *count = em_sum(mask, nd, dims, true);
    RET(em_div(em_mul(G, mask), count));
}

/* max_dim/min_dim: the grad of the values goes to the index that was picked. */
static em_status d_max_dim(const em_backward_ctx *c, em_tensor **gi) {
    if (!G) return EM_OK;
    int dim = c->in_meta[0].ndim ? (int)c->attrs[0].v.i : 0;
    if (c->in_meta[0].ndim == 0) RET(em_tensor_retain(G));
    em_tensor *z = em_zeros(X->ndim, X->shape, X->dtype, em_tensor_device(X));
    RET(em_scatter_add(z, dim, c->out[1], G));
}

/* var = sum (x - mean)^2 / (N - correction): d/dx = 2 (x - mean) / (N - correction). */
static em_status var_grad(const em_backward_ctx *c, em_tensor **scaled_diff) {
    int dims[EM_MAX_DIMS], nd = attr_dims(c, dims);
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= X->shape[dims[i]];
    double dof = (double)n - c->attrs[1].v.f;
    em_tensor *diff = em_sub(X, em_mean(X, nd, dims, true));
    *scaled_diff = em_mul_scalar(diff, dof > 0 ? 2.0 / dof : NAN);
    return *scaled_diff ? EM_OK : em_last_status();
}
static em_status d_var(const em_backward_ctx *c, em_tensor **gi) {
    em_tensor *d;
    if (var_grad(c, &d) != EM_OK) return em_last_status();
    RET(em_mul(G, d));
}
/* std = sqrt(var): d/dx = d var / (2 std). */
static em_status d_std(const em_backward_ctx *c, em_tensor **gi) {
    em_tensor *d;
    if (var_grad(c, &d) != EM_OK) return em_last_status();
    RET(em_div(em_mul(G, d), em_mul_scalar(Y, 2.0)));
}

static em_status d_logsumexp(const em_backward_ctx *c, em_tensor **gi) {
    RET(em_mul(G, em_exp(em_sub(X, Y))));
}

/* norm: p = 0 has zero grad; inf/-inf like amax of |x|; otherwise
 * g * sign(x) |x|^(p-1) / y^(p-1) (p = 2: g x / y), 0 where y == 0 (PyTorch's subgradient). */
static em_status d_norm(const em_backward_ctx *c, em_tensor **gi) {
    double p = c->attrs[1].v.f;
    int dims[EM_MAX_DIMS], nd = attr_dims(c, dims);
    em_tensor *zero = em_scalar(0, X->dtype);
    if (p == 0) RET(em_zeros(X->ndim, X->shape, X->dtype, em_tensor_device(X)));
    em_tensor *ax = em_abs(X);
    if (isinf(p)) {
        em_tensor *mask = em_to_dtype(em_eq(ax, Y), X->dtype);
        em_tensor *share = em_div(mask, em_sum(mask, nd, dims, true));
        RET(em_mul(em_mul(G, share), em_sign(X)));
    }
    /* X and Y are borrowed; everything else here belongs to the backward's scope. */
    em_tensor *num = p == 1 ? em_sign(X) : p == 2 ? X : em_mul(em_sign(X), em_pow_scalar(ax, p - 1));
    em_tensor *den = p == 1 ? NULL : p == 2 ? Y : em_pow_scalar(Y, p - 1);
    em_tensor *r = den ? em_where(em_eq(den, zero), zero, em_div(num, den)) : num;
    RET(em_mul(G, r));
}

/* prod: d/dx_i = prod of the others. Without zeros that is y / x_i; with exactly one zero in
 * a reduction only the zero gets the product of the rest; with two or more, all get 0. */
static em_status d_prod(const em_backward_ctx *c, em_tensor **gi) {
    int dims[EM_MAX_DIMS], nd = attr_dims(c, dims);
    if (!em_dtype_is_floating(X->dtype))
        return em_set_error(EM_ERR_DTYPE, "backward: prod of %s has no gradient",
                            em_dtype_name(X->dtype));
    em_tensor *zero = em_scalar(0, X->dtype), *one = em_scalar(1, X->dtype);
    em_tensor *is0 = em_eq(X, zero);
    em_tensor *nzeros = em_sum(is0, nd, dims, true); /* int64 */
    em_tensor *rest = em_prod(em_where(is0, one, X), nd, dims, true);
    em_tensor *no_zero = em_eq(nzeros, em_scalar(0, EM_I64));
    em_tensor *one_zero = em_logical_and(is0, em_eq(nzeros, em_scalar(1, EM_I64)));
    em_tensor *r = em_where(no_zero, em_div(Y, em_where(is0, one, X)),
                            em_where(one_zero, rest, zero));
    RET(em_mul(G, r));
}
#undef G
#undef X
#undef Y
#undef RET

em_status em__ops_declare_reduce(em_registry *core) {
    static const char *const dims[] = {"dims"}, *const dim[] = {"dim"},
                             *const var[] = {"dims", "correction"}, *const norm[] = {"dims", "p"};
    static const em_attr_type ti[] = {EM_ATTR_INTS}, tint[] = {EM_ATTR_INT},
                              tif[] = {EM_ATTR_INTS, EM_ATTR_FLOAT};
    em_status st = EM_OK;
#define DECL(var, ...) if (st == EM_OK) st = declare(core, &var, __VA_ARGS__)
    const unsigned x = EM_SAVE_INPUT(0), xy = x | EM_SAVE_OUTPUT(0),
                   xi = x | EM_SAVE_OUTPUT(1); /* max_dim: the input and the indices */
    DECL(op_amax, "amax", 1, 1, dims, ti, infer_same, d_amax, xy);
    DECL(op_amin, "amin", 1, 1, dims, ti, infer_same, d_amax, xy);
    DECL(op_max_dim, "max_dim", 2, 1, dim, tint, infer_max_dim, d_max_dim, xi);
    DECL(op_min_dim, "min_dim", 2, 1, dim, tint, infer_max_dim, d_max_dim, xi);
    DECL(op_argmax, "argmax", 1, 1, dims, ti, infer_index, NULL, 0);
    DECL(op_argmin, "argmin", 1, 1, dims, ti, infer_index, NULL, 0);
    DECL(op_var, "var", 1, 2, var, tif, infer_same, d_var, x);
    DECL(op_std, "std", 1, 2, var, tif, infer_same, d_std, xy);
    DECL(op_logsumexp, "logsumexp", 1, 1, dims, ti, infer_same, d_logsumexp, xy);
    DECL(op_norm, "norm", 1, 2, norm, tif, infer_same, d_norm, xy);
    DECL(op_prod, "prod", 1, 1, dims, ti, infer_same, d_prod, xy);
    DECL(op_all, "all", 1, 1, dims, ti, infer_bool, NULL, 0);
    DECL(op_any, "any", 1, 1, dims, ti, infer_bool, NULL, 0);
#undef DECL
    return st;
}

/* ---- public functions ------------------------------------------------------------------------- */

/* Run a reduction op over dims of a (attrs[0] is filled here; extra attrs follow it) and
 * drop the reduced dims unless keepdim. */
static em_tensor *reduce(const em_op *op, const em_tensor *a, const em_attr *dims,
                         const em_attr *extra, int n_extra, bool keepdim) {
    em_attr attrs[3] = {*dims};
    for (int i = 0; i < n_extra; i++) attrs[1 + i] = extra[i];
    return em__reduce_drop(em__op1(op, &a, 1, attrs), dims, keepdim);
}

static em_tensor *extreme(const em_op *op, const char *who, const em_tensor *a, int ndims,
                          const int *dims, bool keepdim) {
    if (!em__check_inputs(who, &a, 1)) return NULL;
    em_attr d;
    if (em__reduce_dims(who, a, ndims, dims, &d) != EM_OK ||
        check_nonempty(who, a, ndims, &d) != EM_OK)
        return NULL;
    return em__scope_track(reduce(op, a, &d, NULL, 0, keepdim));
}

em_tensor *em_amax(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    return extreme(op_amax, "amax", a, ndims, dims, keepdim);
}
em_tensor *em_amin(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    return extreme(op_amin, "amin", a, ndims, dims, keepdim);
}
em_tensor *em_max(const em_tensor *a) { return extreme(op_amax, "max", a, 0, NULL, false); }
em_tensor *em_min(const em_tensor *a) { return extreme(op_amin, "min", a, 0, NULL, false); }

static em_status extreme_dim(const em_op *op, const char *who, const em_tensor *a, int dim,
                             bool keepdim, em_tensor **values, em_tensor **indices) {
    if (values) *values = NULL;
    if (indices) *indices = NULL;
    if (!values) return em_set_error(EM_ERR_INVALID, "%s: NULL values", who);
    if (!em__check_inputs(who, &a, 1)) return em_last_status();
    int d = em__wrap_dim(dim, a->ndim, who);
    if (d < 0) return em_last_status();
    em_attr dims = {.type = EM_ATTR_INTS, .n = a->ndim > 0, .ints = {d}};
    if (check_nonempty(who, a, 1, &dims) != EM_OK) return em_last_status();
    em_attr attr = {.type = EM_ATTR_INT, .v.i = a->ndim > 0 ? d : 0};
    em_tensor *out[2] = {NULL, NULL};
    em_status st = em__op_call(op, &a, 1, &attr, out);
    if (st != EM_OK) return st;
    out[0] = em__reduce_drop(out[0], &dims, keepdim);
    out[1] = em__reduce_drop(out[1], &dims, keepdim);
    if (!out[0] || !out[1]) {
        em_tensor_release(out[0]);
        em_tensor_release(out[1]);
        return em_last_status();
    }
    *values = em__scope_track(out[0]);
    if (indices) *indices = em__scope_track(out[1]);
    else em_tensor_release(out[1]);
    return EM_OK;
}

em_status em_max_dim(const em_tensor *a, int dim, bool keepdim, em_tensor **values,
                     em_tensor **indices) {
    return extreme_dim(op_max_dim, "max", a, dim, keepdim, values, indices);
}
em_status em_min_dim(const em_tensor *a, int dim, bool keepdim, em_tensor **values,
                     em_tensor **indices) {
    return extreme_dim(op_min_dim, "min", a, dim, keepdim, values, indices);
}

static em_tensor *arg_extreme(const em_op *op, const char *who, const em_tensor *a,
                              const int *dim, bool keepdim) {
    if (!em__check_inputs(who, &a, 1)) return NULL;
    if (a->dtype == EM_BOOL) {
        em_set_error(EM_ERR_DTYPE, "%s: bool tensors have no order (as in PyTorch); convert to an "
                     "integer dtype first", who);
        return NULL;
    }
    em_attr d;
    if (em__reduce_dims(who, a, dim ? 1 : 0, dim, &d) != EM_OK ||
        check_nonempty(who, a, dim ? 1 : 0, &d) != EM_OK)
        return NULL;
    return em__scope_track(reduce(op, a, &d, NULL, 0, keepdim));
}

em_tensor *em_argmax(const em_tensor *a, const int *dim, bool keepdim) {
    return arg_extreme(op_argmax, "argmax", a, dim, keepdim);
}
em_tensor *em_argmin(const em_tensor *a, const int *dim, bool keepdim) {
    return arg_extreme(op_argmin, "argmin", a, dim, keepdim);
}

static em_tensor *var_std(const em_op *op, const char *who, const em_tensor *a, int ndims,
                          const int *dims, double correction, bool keepdim) {
    if (!em__check_inputs(who, &a, 1)) return NULL;
    em_attr d;
    if (check_floating(who, a) != EM_OK || em__reduce_dims(who, a, ndims, dims, &d) != EM_OK)
        return NULL;
    if (!(correction >= 0) || isinf(correction)) {
        em_set_error(EM_ERR_INVALID, "%s: correction must be finite and >= 0, got %g", who,
                     correction);
        return NULL;
    }
    em_attr c = {.type = EM_ATTR_FLOAT, .v.f = correction};
    return em__scope_track(reduce(op, a, &d, &c, 1, keepdim));
}

em_tensor *em_var(const em_tensor *a, int ndims, const int *dims, double correction,
                  bool keepdim) {
    return var_std(op_var, "var", a, ndims, dims, correction, keepdim);
}
em_tensor *em_std(const em_tensor *a, int ndims, const int *dims, double correction,
                  bool keepdim) {
    return var_std(op_std, "std", a, ndims, dims, correction, keepdim);
}

em_tensor *em_logsumexp(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    if (!em__check_inputs("logsumexp", &a, 1)) return NULL;
    em_attr d;
    if (em__reduce_dims("logsumexp", a, ndims, dims, &d) != EM_OK) return NULL;
    /* Integer and bool inputs compute in float32, as in PyTorch. */
    em_tensor *x = em_dtype_is_floating(a->dtype) ? em_tensor_retain((em_tensor *)a)
                                                  : em__to_dtype(a, EM_F32);
    em_tensor *r = x ? reduce(op_logsumexp, x, &d, NULL, 0, keepdim) : NULL;
    em_tensor_release(x);
    return em__scope_track(r);
}

em_tensor *em_norm(const em_tensor *a, double p, int ndims, const int *dims, bool keepdim) {
    if (!em__check_inputs("norm", &a, 1)) return NULL;
    em_attr d;
    if (check_floating("norm", a) != EM_OK || em__reduce_dims("norm", a, ndims, dims, &d) != EM_OK)
        return NULL;
    if (isnan(p)) {
        em_set_error(EM_ERR_INVALID, "norm: p is NaN");
        return NULL;
    }
    if (isinf(p) && a->numel == 0) {
        char who[32];
        snprintf(who, sizeof who, "norm (p = %sinf)", p < 0 ? "-" : "");
        if (check_nonempty(who, a, ndims, &d) != EM_OK) return NULL;
    }
    em_attr pa = {.type = EM_ATTR_FLOAT, .v.f = p};
    return em__scope_track(reduce(op_norm, a, &d, &pa, 1, keepdim));
}

em_tensor *em_prod(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    if (!em__check_inputs("prod", &a, 1)) return NULL;
    em_attr d;
    if (em__reduce_dims("prod", a, ndims, dims, &d) != EM_OK) return NULL;
    em_tensor *x = em_dtype_is_floating(a->dtype) ? em_tensor_retain((em_tensor *)a)
                                                  : em__to_dtype(a, EM_I64);
    em_tensor *r = x ? reduce(op_prod, x, &d, NULL, 0, keepdim) : NULL;
    em_tensor_release(x);
    return em__scope_track(r);
}

static em_tensor *logical(const em_op *op, const char *who, const em_tensor *a, int ndims,
                          const int *dims, bool keepdim) {
    if (!em__check_inputs(who, &a, 1)) return NULL;
    em_attr d;
    if (em__reduce_dims(who, a, ndims, dims, &d) != EM_OK) return NULL;
    return em__scope_track(reduce(op, a, &d, NULL, 0, keepdim));
}

em_tensor *em_all(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    return logical(op_all, "all", a, ndims, dims, keepdim);
}
em_tensor *em_any(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    return logical(op_any, "any", a, ndims, dims, keepdim);
}
