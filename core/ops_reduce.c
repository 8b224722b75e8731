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
 * Kernel contracts (what a backend may assume, per op). The public ops take their dims as
 * given (absent or empty: all) and keepdim as their last attribute; their composites pass the
 * kernel the dims normalised, the other attributes as given (keepdim included: kernels ignore
 * it), and drop the reduced dims afterwards unless keepdim.
 *   sum(x) -> y           attrs: dims. y has x's dtype (ints arrive as int64, bool converted).
 *   mean                  no kernel: sum times 1/count (f16/bf16 through f32).
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

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/tensor.h"
#include "internal.h"

static const em_op *op_sum, *op_mean, *op_mul;
static const em_op *op_amax, *op_amin, *op_max, *op_min, *op_max_dim, *op_min_dim, *op_argmax,
    *op_argmin, *op_var, *op_std, *op_logsumexp, *op_norm, *op_prod, *op_all, *op_any;

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

/* ---- sum and mean --------------------------------------------------------------------------- */

static bool keepdim_of(const em_attr *a) { return a->type == EM_ATTR_BOOL && a->v.b; }

static em_status infer_sum(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                           em_tensor_meta *out) {
    (void)op;
    infer_same(op, in, attrs, out);
    for (int i = 0; i < attrs[0].n; i++) out->shape[attrs[0].ints[i]] = 1;
    return EM_OK;
}

static em_status d_sum(const em_backward_ctx *c, em_tensor **gi) {
    /* The grad has the input's ndim with 1 on the reduced dims: broadcast it back. */
    gi[0] = em_expand(c->grad_out[0], c->in_meta[0].ndim, c->in_meta[0].shape);
    return gi[0] ? EM_OK : em_last_status();
}

/* Reduction attributes as the public ops take them (dims: INTS, absent or empty for all;
 * keepdim) normalised into `norm` (dims sorted and unique, the rest copied). */
em_status em__reduce_attrs(const em_op *op, const char *who, const em_tensor *a,
                           const em_attr *attrs, int n_attrs, em_attr *norm) {
    int dims[EM_MAX_DIMS], n = 0;
    if (attrs[0].type == EM_ATTR_INTS) {
        n = attrs[0].n;
        for (int i = 0; i < n; i++) dims[i] = (int)attrs[0].ints[i];
    }
    (void)op;
    for (int i = 1; i < n_attrs; i++) norm[i] = attrs[i];
    return em__reduce_dims(who, a, n, dims, &norm[0]);
}


/* sum(x; dims, keepdim): bool and integer inputs sum in int64. */
static em_tensor *sum_run(const em_op *op, const char *who, const em_tensor *a,
                          const em_attr *attrs, int64_t *count) {
    em_attr at[2];
    if (em__reduce_attrs(op, who, a, attrs, 2, at) != EM_OK) return NULL;
    *count = 1;
    for (int i = 0; i < at[0].n; i++) *count *= a->shape[at[0].ints[i]];
    em_tensor *x = em_dtype_is_floating(a->dtype) ? em_tensor_retain((em_tensor *)a)
                                                  : em__to_dtype(a, EM_I64);
    em_tensor *r = x ? em__kernel1(op_sum, (const em_tensor *const *)&x, 1, at) : NULL;
    em_tensor_release(x);
    return em__reduce_drop(r, &at[0], keepdim_of(&at[1]));
}

static em_status c_sum(const em_op *op, const em_tensor *const *in, int n_in,
                       const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    int64_t count;
    em_attr at[2] = {attrs ? attrs[0] : (em_attr){0}, attrs ? attrs[1] : (em_attr){0}};
    *n_out = (out[0] = sum_run(op, "sum", in[0], at, &count)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* The mean in a's own floating dtype (f32 or f64). */
static em_tensor *mean_run(const em_tensor *a, const em_attr *attrs) {
    int64_t count;
    em_tensor *s = sum_run(op_sum, "mean", a, attrs, &count);
    em_tensor *k = s ? em__full(0, NULL, count ? 1.0 / (double)count : NAN, a->dtype, em_cpu())
                     : NULL;
    em_tensor *kd = k ? em__to_device(k, a->storage->device) : NULL;
    /* Out of place: s may be a view of the sum, which autograd cannot rewrite in place. */
    const em_tensor *in[2] = {s, kd};
    em_tensor *r = kd ? em__op1(op_mul, in, 2, NULL) : NULL;
    em_tensor_release(k);
    em_tensor_release(kd);
    em_tensor_release(s);
    return r;
}

/* mean(x; dims, keepdim): floating inputs only; f16 and bf16 accumulate in f32 and round
 * once, as in PyTorch (their sum alone may overflow: the mean of 1e5 float16 ones is 1, their
 * sum inf). */
static em_status c_mean(const em_op *op, const em_tensor *const *in, int n_in,
                        const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)op, (void)n_in, (void)cap;
    const em_tensor *a = in[0];
    em_attr at[2] = {attrs ? attrs[0] : (em_attr){0}, attrs ? attrs[1] : (em_attr){0}};
    if (!em_dtype_is_floating(a->dtype))
        return em_set_error(EM_ERR_DTYPE, "mean: could not infer output dtype: input dtype %s "
                            "is not floating; convert it with em_to_dtype first",
                            em_dtype_name(a->dtype));
    em_tensor *r;
    if (a->dtype == EM_F32 || a->dtype == EM_F64) {
        r = mean_run(a, at);
    } else {
        em_tensor *x = em__to_dtype(a, EM_F32);
        em_tensor *m = x ? mean_run(x, at) : NULL;
        r = m ? em__to_dtype(m, a->dtype) : NULL;
        em_tensor_release(m);
        em_tensor_release(x);
    }
    *n_out = (out[0] = r) != NULL;
    return r ? EM_OK : em_last_status();
}

/* ---- composites: the public reductions over their keep-dims kernels ----------------------------- */

/* A reduction as the public op takes it: attrs (dims as given, the op's others, keepdim
 * last) checked, dims normalised for the kernel, the dtype rule applied, and the reduced dims
 * dropped unless keepdim. */
static em_status c_reduce(const em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    const char *who = em_op_name(op);
    const em_tensor *a = in[0];
    int na = em_op_schema_of(op)->n_attrs;
    em_attr given[3] = {{0}}, at[3];
    for (int i = 0; i < na && attrs; i++) given[i] = attrs[i];
    int ndims = given[0].type == EM_ATTR_INTS ? given[0].n : 0;
    bool arg = op == op_argmax || op == op_argmin, extreme = op == op_amax || op == op_amin;
    if (arg && a->dtype == EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "%s: bool tensors have no order (as in PyTorch); "
                            "convert to an integer dtype first", who);
    if (arg && ndims > 1)
        return em_set_error(EM_ERR_INVALID, "%s: one dim or none (the flattened tensor), got %d",
                            who, ndims);
    if ((op == op_var || op == op_std || op == op_norm) && check_floating(who, a) != EM_OK)
        return em_last_status();
    if (em__reduce_attrs(op, who, a, given, na, at) != EM_OK) return em_last_status();
    if ((arg || extreme) && check_nonempty(who, a, ndims, &at[0]) != EM_OK)
        return em_last_status();
    if (op == op_var || op == op_std) {
        double c = at[1].v.f;
        if (at[1].type != EM_ATTR_FLOAT || !(c >= 0) || isinf(c))
            return em_set_error(EM_ERR_INVALID, "%s: correction must be finite and >= 0, got %g",
                                who, at[1].type == EM_ATTR_FLOAT ? c : NAN);
    }
    if (op == op_norm) {
        double p = at[1].type == EM_ATTR_FLOAT ? at[1].v.f : NAN;
        if (isnan(p)) return em_set_error(EM_ERR_INVALID, "norm: p is NaN");
        if (isinf(p) && a->numel == 0) {
            char w[32];
            snprintf(w, sizeof w, "norm (p = %sinf)", p < 0 ? "-" : "");
            if (check_nonempty(w, a, ndims, &at[0]) != EM_OK) return em_last_status();
        }
    }
    /* Integer and bool inputs: logsumexp computes in float32, prod in int64 (PyTorch). */
    em_dtype dt = a->dtype;
    if (!em_dtype_is_floating(dt) && op == op_logsumexp) dt = EM_F32;
    if (!em_dtype_is_floating(dt) && op == op_prod) dt = EM_I64;
    em_tensor *x = dt == a->dtype ? em_tensor_retain((em_tensor *)a) : em__to_dtype(a, dt);
    em_tensor *r = x ? em__kernel1(op, (const em_tensor *const *)&x, 1, at) : NULL;
    em_tensor_release(x);
    *n_out = (out[0] = em__reduce_drop(r, &at[0], keepdim_of(&at[na - 1]))) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* max(x), min(x): over every element (no identity: an empty x is an error). */
static em_status c_extreme_all(const em_op *op, const em_tensor *const *in, int n_in,
                               const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)attrs, (void)cap;
    const em_op *k = op == op_max ? op_amax : op_amin;
    em_attr at[2];
    if (em__reduce_dims(em_op_name(op), in[0], 0, NULL, &at[0]) != EM_OK ||
        check_nonempty(em_op_name(op), in[0], 0, &at[0]) != EM_OK)
        return em_last_status();
    at[1] = EM__A_BOOL(false);
    *n_out = (out[0] = em__reduce_drop(em__kernel1(k, in, 1, at), &at[0], false)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* max_dim(x; dim, keepdim) -> (values, indices); errors name "max"/"min". */
static em_status c_extreme_dim(const em_op *op, const em_tensor *const *in, int n_in,
                               const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    const char *who = op == op_max_dim ? "max" : "min";
    const em_tensor *a = in[0];
    if (!attrs || attrs[0].type != EM_ATTR_INT)
        return em_set_error(EM_ERR_INVALID, "%s: attribute 'dim' is required", who);
    int d = em__wrap_dim((int)attrs[0].v.i, a->ndim, who);
    if (d < 0) return em_last_status();
    em_attr dims = {.type = EM_ATTR_INTS, .n = a->ndim > 0, .ints = {d}};
    if (check_nonempty(who, a, 1, &dims) != EM_OK) return em_last_status();
    em_attr at[2] = {EM__A_INT(a->ndim > 0 ? d : 0), attrs[1]};
    em_tensor *r[2] = {NULL, NULL};
    if (em__op_call_kernel(op, &a, 1, at, r) != EM_OK) return em_last_status();
    r[0] = em__reduce_drop(r[0], &dims, keepdim_of(&attrs[1]));
    r[1] = em__reduce_drop(r[1], &dims, keepdim_of(&attrs[1]));
    if (!r[0] || !r[1]) {
        em_tensor_release(r[0]);
        em_tensor_release(r[1]);
        return em_last_status();
    }
    out[0] = r[0], out[1] = r[1], *n_out = 2;
    return EM_OK;
}

/* ---- declarations ----------------------------------------------------------------------------- */

static em_status declare(em_registry *core, const em_op **out, int autocast, const char *name,
                         int n_out,
                         int n_attrs, const char *const *attr_names, const em_attr_type *types,
                         em_infer_fn infer, em_backward_fn backward, unsigned saves,
                         em_composite_fn composite) {
    em_op_schema s = {.struct_size = sizeof s, .name = name, .n_inputs = 1, .n_outputs = n_out,
                      .n_attrs = n_attrs, .attr_names = attr_names, .attr_types = types,
                      .dispatch_arg = 0, .infer = infer, .backward = backward, .saves = saves,
                      .flags = backward || !infer ? 0 : EM_OP_NONDIFF, .composite = composite,
                      .category = "reduce", .autocast = autocast};
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
    em_tensor *zero = em_full(0, NULL, 0, X->dtype, em_tensor_device(X)); /* X's device */
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
    em_device dev = em_tensor_device(X); /* the constants live where X does */
    em_tensor *zero = em_full(0, NULL, 0, X->dtype, dev), *one = em_full(0, NULL, 1, X->dtype, dev);
    em_tensor *is0 = em_eq(X, zero);
    em_tensor *nzeros = em_sum(is0, nd, dims, true); /* int64 */
    em_tensor *rest = em_prod(em_where(is0, one, X), nd, dims, true);
    em_tensor *no_zero = em_eq(nzeros, em_full(0, NULL, 0, EM_I64, dev));
    em_tensor *one_zero = em_logical_and(is0, em_eq(nzeros, em_full(0, NULL, 1, EM_I64, dev)));
    em_tensor *r = em_where(no_zero, em_div(Y, em_where(is0, one, X)),
                            em_where(one_zero, rest, zero));
    RET(em_mul(G, r));
}
#undef G
#undef X
#undef Y
#undef RET

em_status em__ops_declare_reduce(em_registry *core) {
    /* Every reduction takes its dims as given (absent or empty: all) and keepdim last; its
     * kernel sees the dims normalised and keeps them (size 1). */
    static const char *const dims[] = {"dims", "keepdim"}, *const dim[] = {"dim", "keepdim"},
                             *const var[] = {"dims", "correction", "keepdim"},
                             *const norm[] = {"dims", "p", "keepdim"};
    static const em_attr_type ti[] = {EM_ATTR_INTS, EM_ATTR_BOOL},
                              tint[] = {EM_ATTR_INT, EM_ATTR_BOOL},
                              tif[] = {EM_ATTR_INTS, EM_ATTR_FLOAT, EM_ATTR_BOOL};
    em_status st = EM_OK;
#define DECL(var, ...) if (st == EM_OK) st = declare(core, &var, EM_AUTOCAST_NONE, __VA_ARGS__)
    /* DECLA: with an autocast class (ember/autocast.h). */
#define DECLA(ac, var, ...) if (st == EM_OK) st = declare(core, &var, ac, __VA_ARGS__)
    const unsigned x = EM_SAVE_INPUT(0), xy = x | EM_SAVE_OUTPUT(0),
                   xi = x | EM_SAVE_OUTPUT(1); /* max_dim: the input and the indices */
    /* sum and mean: the kernel sees dims normalised (sorted, unique) and keeps them. */
    if (st == EM_OK)
        st = em__declare(core, &op_sum, (em_op_schema){.name = "sum", .n_inputs = 1, .n_attrs = 2,
                         .attr_names = dims, .attr_types = ti, .infer = infer_sum,
                         .backward = d_sum, .composite = c_sum, .category = "reduce",
                         .autocast = EM_AUTOCAST_FLOAT32});
    if (st == EM_OK)
        st = em__declare(core, &op_mean, (em_op_schema){.name = "mean", .n_inputs = 1,
                         .n_attrs = 2, .attr_names = dims, .attr_types = ti, .composite = c_mean,
                         .category = "reduce", .autocast = EM_AUTOCAST_FLOAT32});
    if (st == EM_OK && !(op_mul = em_op_find("mul"))) st = em_last_status(); /* mean's */
    DECL(op_amax, "amax", 1, 2, dims, ti, infer_same, d_amax, xy, c_reduce);
    DECL(op_amin, "amin", 1, 2, dims, ti, infer_same, d_amax, xy, c_reduce);
    DECL(op_max, "max", 1, 0, NULL, NULL, NULL, NULL, 0, c_extreme_all);
    DECL(op_min, "min", 1, 0, NULL, NULL, NULL, NULL, 0, c_extreme_all);
    DECL(op_max_dim, "max_dim", 2, 2, dim, tint, infer_max_dim, d_max_dim, xi, c_extreme_dim);
    DECL(op_min_dim, "min_dim", 2, 2, dim, tint, infer_max_dim, d_max_dim, xi, c_extreme_dim);
    DECL(op_argmax, "argmax", 1, 2, dims, ti, infer_index, NULL, 0, c_reduce);
    DECL(op_argmin, "argmin", 1, 2, dims, ti, infer_index, NULL, 0, c_reduce);
    DECL(op_var, "var", 1, 3, var, tif, infer_same, d_var, x, c_reduce);
    DECL(op_std, "std", 1, 3, var, tif, infer_same, d_std, xy, c_reduce);
    DECLA(EM_AUTOCAST_FLOAT32, op_logsumexp, "logsumexp", 1, 2, dims, ti, infer_same, d_logsumexp, xy, c_reduce);
    DECLA(EM_AUTOCAST_FLOAT32, op_norm, "norm", 1, 3, norm, tif, infer_same, d_norm, xy, c_reduce);
    DECLA(EM_AUTOCAST_FLOAT32, op_prod, "prod", 1, 2, dims, ti, infer_same, d_prod, xy, c_reduce);
    DECL(op_all, "all", 1, 2, dims, ti, infer_bool, NULL, 0, c_reduce);
    DECL(op_any, "any", 1, 2, dims, ti, infer_bool, NULL, 0, c_reduce);
#undef DECL
#undef DECLA
    return st;
}

/* ---- public functions: one line each over the schemas ------------------------------------------ */

#define R(fn, op) em_tensor *fn(const em_tensor *a, int ndims, const int *dims, bool keepdim) { return em__call1(op, 1, &a, EM__ATTRS(em__attr_ints(ndims, dims), EM__A_BOOL(keepdim))); }
R(em_amax, op_amax) R(em_amin, op_amin) R(em_logsumexp, op_logsumexp) R(em_prod, op_prod)
R(em_all, op_all) R(em_any, op_any)
#undef R
em_tensor *em_max(const em_tensor *a) { return em__call1(op_max, 1, &a, NULL); }
em_tensor *em_min(const em_tensor *a) { return em__call1(op_min, 1, &a, NULL); }

em_status em_max_dim(const em_tensor *a, int dim, bool keepdim, em_tensor **values,
                     em_tensor **indices) {
    if (!values) return em_set_error(EM_ERR_INVALID, "max: NULL values");
    return em__callv(op_max_dim, 1, &a, EM__ATTRS(EM__A_INT(dim), EM__A_BOOL(keepdim)),
                     (em_tensor **const[]){values, indices}, 2);
}
em_status em_min_dim(const em_tensor *a, int dim, bool keepdim, em_tensor **values,
                     em_tensor **indices) {
    if (!values) return em_set_error(EM_ERR_INVALID, "min: NULL values");
    return em__callv(op_min_dim, 1, &a, EM__ATTRS(EM__A_INT(dim), EM__A_BOOL(keepdim)),
                     (em_tensor **const[]){values, indices}, 2);
}
em_tensor *em_argmax(const em_tensor *a, const int *dim, bool keepdim) {
    return em__call1(op_argmax, 1, &a, EM__ATTRS(em__attr_ints(dim != NULL, dim), EM__A_BOOL(keepdim)));
}
em_tensor *em_argmin(const em_tensor *a, const int *dim, bool keepdim) {
    return em__call1(op_argmin, 1, &a, EM__ATTRS(em__attr_ints(dim != NULL, dim), EM__A_BOOL(keepdim)));
}
em_tensor *em_var(const em_tensor *a, int ndims, const int *dims, double correction,
                  bool keepdim) {
    return em__call1(op_var, 1, &a, EM__ATTRS(em__attr_ints(ndims, dims), EM__A_FLOAT(correction),
                                              EM__A_BOOL(keepdim)));
}
em_tensor *em_std(const em_tensor *a, int ndims, const int *dims, double correction,
                  bool keepdim) {
    return em__call1(op_std, 1, &a, EM__ATTRS(em__attr_ints(ndims, dims), EM__A_FLOAT(correction),
                                              EM__A_BOOL(keepdim)));
}
em_tensor *em_norm(const em_tensor *a, double p, int ndims, const int *dims, bool keepdim) {
    return em__call1(op_norm, 1, &a, EM__ATTRS(em__attr_ints(ndims, dims), EM__A_FLOAT(p),
                                               EM__A_BOOL(keepdim)));
}

em_tensor *em_sum(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    return em__call1(op_sum, 1, &a, EM__ATTRS(em__attr_ints(ndims, dims), EM__A_BOOL(keepdim)));
}
em_tensor *em_mean(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    return em__call1(op_mean, 1, &a, EM__ATTRS(em__attr_ints(ndims, dims), EM__A_BOOL(keepdim)));
}

