/*
 * ops.c — the standard op set: schemas (name, inputs, attributes, shape/dtype inference)
 * declared into the core's registry at em_init(), and the typed public functions of
 * ember/ops.h that call them. Kernels live in backend plugins.
 *
 * Kernel contracts (what a backend may assume, per op):
 *   copy(x) -> y          y has x's shape; dtypes may differ (convert); any strides.
 *   fill() -> y           attrs: value (float). In place on y.
 *   add/sub/mul/div(a, b) -> y, neg/exp/log/relu(x) -> y
 *                         inputs already promoted to y's dtype and broadcast to y's shape
 *                         (stride 0 on broadcast dims); y may alias an input (in place).
 *   sum(x) -> y           attrs: dims (ints, already normalised, sorted, unique). y has x's
 *                         ndim with size 1 on the reduced dims; same dtype (ints arrive as
 *                         int64, bool is converted first).
 *   index_select(x, idx) -> y   attrs: dim. idx is 1-D int64; the kernel checks its range.
 *   arange() -> y         attrs: start, step (floats); y[i] = start + i * step.
 *   uniform/normal/bernoulli() -> y   see ember/random.h for the attributes and streams.
 *   randperm() -> y                   attrs: seed, offset. y (n) i64 or i32, any strides: the
 *                                     permutation ember/random.h defines.
 */
#include <math.h>
#include <string.h>

#include "internal.h"

const em_op *em__op_copy, *em__op_fill;
static const em_op *op_add, *op_sub, *op_mul, *op_div, *op_neg, *op_exp, *op_log, *op_relu,
    *op_sum, *op_mean, *op_index_select, *op_arange, *op_uniform, *op_normal,
    *op_bernoulli, *op_randperm;

/* ---- inference ------------------------------------------------------------------------------- */

/* infer_same: em_infer_same (ember/op_helpers.h). */
#define infer_same em_infer_same

#define infer_broadcast em_infer_broadcast

static em_status infer_sum(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                           em_tensor_meta *out) {
    (void)op;
    infer_same(op, in, attrs, out);
    for (int i = 0; i < attrs[0].n; i++) out->shape[attrs[0].ints[i]] = 1;
    return EM_OK;
}

static em_status infer_index_select(const em_op *op, const em_tensor *const *in,
                                    const em_attr *attrs, em_tensor_meta *out) {
    const em_tensor *idx = in[1];
    if (idx->ndim > 1 || idx->dtype != EM_I64)
        return em_set_error(EM_ERR_INVALID, "%s: the index must be a 1-D int64 (or int32) "
                            "tensor; got %d dims of %s", em_op_name(op), idx->ndim,
                            em_dtype_name(idx->dtype));
    infer_same(op, in, attrs, out);
    out->shape[attrs[0].v.i] = idx->numel;
    return EM_OK;
}

/* ---- checks and dtype rules (prepare hooks) ------------------------------------------------------ */

static em_status prep_neg(const em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_dtype *dts) {
    (void)op, (void)n_in, (void)attrs, (void)dts;
    if (in[0]->dtype != EM_BOOL) return EM_OK;
    return em_set_error(EM_ERR_DTYPE, "neg: negation of a bool tensor is not supported; use a "
                        "logical not");
}

/* The elements of arange(start, end, step), or -1 with an error. */
static int64_t arange_len(double start, double end, double step) {
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step) ||
        (step > 0 && end < start) || (step < 0 && end > start)) {
        em_set_error(EM_ERR_INVALID, "arange: invalid range [%g, %g) with step %g (step must "
                     "be non-zero and point from start to end)", start, end, step);
        return -1;
    }
    double len = ceil((end - start) / step);
    if (len > 1e15) {
        em_set_error(EM_ERR_INVALID, "arange: %g elements are too many", len);
        return -1;
    }
    return (int64_t)len;
}

static em_status randperm_check(int64_t n, em_dtype dt) {
    if (dt != EM_I64 && dt != EM_I32)
        return em_set_error(EM_ERR_DTYPE, "randperm: dtype %s is not supported; it gives int64 "
                            "(the index dtype) or int32", em_dtype_name(dt));
    int64_t max = dt == EM_I32 ? INT64_C(1) << 31 : INT64_C(1) << 32;
    if (n < 0 || n > max)
        return em_set_error(EM_ERR_INVALID, "randperm: n must be between 0 and %lld for %s, got "
                            "%lld", (long long)max, em_dtype_name(dt), (long long)n);
    return EM_OK;
}

/* The fills (no inputs): em_op_call_out runs these on the output (dts is NULL). */
static em_status prep_fill(const em_op *op, const em_tensor *const *out, int n_out,
                           const em_attr *a, em_dtype *dts) {
    (void)n_out, (void)dts;
    const em_tensor *t = out[0];
    if (op == op_arange) {
        if (a[2].type == EM_ATTR_NONE) return EM_OK; /* no end: any length */
        int64_t n = arange_len(a[0].v.f, a[2].v.f, a[1].v.f);
        if (n < 0) return em_last_status();
        if (t->ndim != 1 || t->numel != n)
            return em_set_error(EM_ERR_SHAPE, "arange: [%g, %g) in steps of %g has %lld "
                                "elements; the output has %lld", a[0].v.f, a[2].v.f, a[1].v.f,
                                (long long)n, (long long)t->numel);
        return EM_OK;
    }
    if (op == op_randperm) return t->ndim == 1 ? randperm_check(t->numel, t->dtype)
                                               : em_set_error(EM_ERR_SHAPE, "randperm: the "
                                                              "output must be 1-D");
    if ((op == op_uniform || op == op_normal) && !em_dtype_is_floating(t->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s_: expected a floating tensor, got %s",
                            em_op_name(op), em_dtype_name(t->dtype));
    double p0 = a[2].v.f, p1 = a[3].v.f;
    if (op == op_uniform && (!(p0 <= p1) || !isfinite(p0) || !isfinite(p1)))
        return em_set_error(EM_ERR_INVALID, "uniform_: expects lo <= hi, both finite; got "
                            "[%g, %g)", p0, p1);
    if (op == op_normal && (!(p1 >= 0) || !isfinite(p0) || !isfinite(p1)))
        return em_set_error(EM_ERR_INVALID, "normal_: expects std >= 0 and finite mean; got "
                            "mean %g, std %g", p0, p1);
    if (op == op_bernoulli && !(p0 >= 0 && p0 <= 1))
        return em_set_error(EM_ERR_INVALID, "bernoulli_: expects 0 <= p <= 1, got %g", p0);
    return EM_OK;
}

static em_status op_check_fill(const em_op *op, em_tensor *const *t, int n, const em_attr *a) {
    return prep_fill(op, (const em_tensor *const *)t, n, a, NULL);
}

/* ---- composites ------------------------------------------------------------------------------------ */

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

static bool keepdim_of(const em_attr *a) { return a->type == EM_ATTR_BOOL && a->v.b; }

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

/* index_select(x, index; dim): dim counted from the end when negative, an int32 index
 * widened to int64 (the kernel's). */
static em_status c_index_select(const em_op *op, const em_tensor *const *in, int n_in,
                                const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    const em_tensor *a = in[0], *index = in[1];
    if (a->ndim == 0)
        return em_set_error(EM_ERR_SHAPE, "index_select: cannot index a 0-dim tensor");
    int d = em__wrap_dim(attrs && attrs[0].type == EM_ATTR_INT ? (int)attrs[0].v.i : 0,
                         a->ndim, "index_select");
    if (d < 0) return em_last_status();
    if (!attrs || attrs[0].type != EM_ATTR_INT)
        return em_set_error(EM_ERR_INVALID, "index_select: attribute 'dim' is required");
    if (index->dtype != EM_I64 && index->dtype != EM_I32)
        return em_set_error(EM_ERR_DTYPE, "index_select: the index must be int64 or int32, got %s",
                            em_dtype_name(index->dtype));
    em_tensor *idx = em__to_dtype(index, EM_I64);
    if (!idx) return em_last_status();
    em_attr attr = EM__A_INT(d);
    const em_tensor *args[2] = {a, idx};
    em_tensor *r = em__kernel1(op, args, 2, &attr);
    em_tensor_release(idx);
    *n_out = r != NULL;
    out[0] = r;
    return r ? EM_OK : em_last_status();
}

/* ---- declarations ---------------------------------------------------------------------------- */

em_status em__declare(em_registry *core, const em_op **out, em_op_schema s) {
    s.struct_size = sizeof s;
    if (!s.n_outputs) s.n_outputs = 1;
    return em_op_declare(core, &s, out);
}

em_status em__declare_op(em_registry *core, const em_op **out, const char *name, int n_in,
                         int n_attrs, const char *const *attr_names, const em_attr_type *types,
                         int dispatch_arg, unsigned flags, em_infer_fn infer,
                         em_backward_fn backward, unsigned saves) {
    em_op_schema s = {.struct_size = sizeof s, .name = name, .n_inputs = n_in, .n_outputs = 1,
                      .n_attrs = n_attrs, .attr_names = attr_names, .attr_types = types,
                      .dispatch_arg = dispatch_arg, .flags = flags, .infer = infer,
                      .backward = backward, .saves = saves};
    return em_op_declare(core, &s, out);
}

/* ---- derivatives ------------------------------------------------------------------------------
 * Written with the public ops; they run with grad mode off inside a scope of their own, so
 * temporaries need no release. A grad passed through unchanged is returned as a new reference
 * (em_tensor_retain). */

#define G (c->grad_out[0])
#define NEED(i) (c->needs_grad[i])

static em_status d_copy(const em_backward_ctx *c, em_tensor **gi) {
    gi[0] = em_to_dtype(G, c->in_meta[0].dtype);
    return gi[0] ? EM_OK : em_last_status();
}
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
static const em_op *op_relu_backward;
static em_status d_relu(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *in[2] = {G, c->out[0]};
    gi[0] = em__scope_track(em__op1(op_relu_backward, in, 2, NULL));
    return gi[0] ? EM_OK : em_last_status();
}
static em_status d_sum(const em_backward_ctx *c, em_tensor **gi) {
    /* The grad has the input's ndim with 1 on the reduced dims: broadcast it back. */
    gi[0] = em_expand(G, c->in_meta[0].ndim, c->in_meta[0].shape);
    return gi[0] ? EM_OK : em_last_status();
}
static em_status d_index_select(const em_backward_ctx *c, em_tensor **gi) {
    /* The selected slices' grads added back at their index (repeats accumulate). */
    const em_tensor_meta *m = &c->in_meta[0];
    em_tensor *z = em_zeros(m->ndim, m->shape, m->dtype, em_tensor_device(G));
    gi[0] = z ? em_index_add(z, (int)c->attrs[0].v.i, c->in[1], G, 1) : NULL;
    return gi[0] ? EM_OK : em_last_status();
}
#undef G
#undef NEED

em_status em__ops_declare_standard(em_registry *core) {
    static const char *const value[] = {"value"},
                             *const dim[] = {"dim"},
                             *const arange[] = {"start", "step", "end"},
                             *const dims_keep[] = {"dims", "keepdim"},
                             *const uniform[] = {"seed", "offset", "lo", "hi"},
                             *const normal[] = {"seed", "offset", "mean", "std"},
                             *const bernoulli[] = {"seed", "offset", "p"},
                             *const randperm[] = {"seed", "offset"};
    static const em_attr_type tf[] = {EM_ATTR_FLOAT},
                              tint[] = {EM_ATTR_INT},
                              tfff[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT, EM_ATTR_FLOAT},
                              tib[] = {EM_ATTR_INTS, EM_ATTR_BOOL},
                              tiiff[] = {EM_ATTR_INT, EM_ATTR_INT, EM_ATTR_FLOAT, EM_ATTR_FLOAT},
                              tiif[] = {EM_ATTR_INT, EM_ATTR_INT, EM_ATTR_FLOAT},
                              tii[] = {EM_ATTR_INT, EM_ATTR_INT};
    const unsigned ew = EM_OP_PROMOTE | EM_OP_BROADCAST;
    em_status st = EM_OK;
#define DECL(var, ...) if (st == EM_OK) st = em__declare_op(core, &var, __VA_ARGS__)
#define DECLS(var, ...) if (st == EM_OK) st = em__declare(core, &var, (em_op_schema){__VA_ARGS__})
    const unsigned nd = EM_OP_NONDIFF, in0 = EM_SAVE_INPUT(0), in01 = in0 | EM_SAVE_INPUT(1),
                   out0 = EM_SAVE_OUTPUT(0);
    DECL(em__op_copy, "copy", 1, 0, NULL, NULL, -1, 0, infer_same, d_copy, 0);
    DECL(em__op_fill, "fill", 0, 1, value, tf, -1, nd, NULL, NULL, 0);
    DECL(op_add, "add", 2, 0, NULL, NULL, 0, ew, infer_broadcast, d_add, 0);
    DECL(op_sub, "sub", 2, 0, NULL, NULL, 0, ew, infer_broadcast, d_sub, 0);
    DECL(op_mul, "mul", 2, 0, NULL, NULL, 0, ew, infer_broadcast, d_mul, in01);
    const unsigned fr = EM_OP_FLOAT_RESULT;
    DECL(op_div, "div", 2, 0, NULL, NULL, 0, ew | fr, infer_broadcast, d_div, in01);
    DECLS(op_neg, .name = "neg", .n_inputs = 1, .infer = infer_same, .backward = d_neg,
          .prepare = prep_neg);
    DECL(op_exp, "exp", 1, 0, NULL, NULL, 0, fr, infer_same, d_exp, out0);
    DECL(op_log, "log", 1, 0, NULL, NULL, 0, fr, infer_same, d_log, in0);
    DECL(op_relu, "relu", 1, 0, NULL, NULL, 0, 0, infer_same, d_relu, out0);
    /* relu_backward(grad, y) = grad where y > 0, else 0 (its own derivative is not needed). */
    DECL(op_relu_backward, "relu_backward", 2, 0, NULL, NULL, 0, nd, infer_same, NULL, 0);
    /* sum and mean: the kernel sees dims normalised (sorted, unique) and keeps them. */
    DECLS(op_sum, .name = "sum", .n_inputs = 1, .n_attrs = 2, .attr_names = dims_keep,
          .attr_types = tib, .infer = infer_sum, .backward = d_sum, .composite = c_sum);
    DECLS(op_mean, .name = "mean", .n_inputs = 1, .n_attrs = 2, .attr_names = dims_keep,
          .attr_types = tib, .composite = c_mean, .category = "reduce");
    /* index_select's derivative is index_add (ops_data.c) of the grad into zeros. */
    DECLS(op_index_select, .name = "index_select", .n_inputs = 2, .n_attrs = 1,
          .attr_names = dim, .attr_types = tint, .infer = infer_index_select,
          .backward = d_index_select, .saves = EM_SAVE_INPUT(1), .composite = c_index_select);
    /* The fills have no inputs: em_op_call_out checks their attributes on the output. */
    DECLS(op_arange, .name = "arange", .n_attrs = 3, .attr_names = arange, .attr_types = tfff,
          .dispatch_arg = -1, .flags = nd, .prepare = prep_fill);
    DECLS(op_uniform, .name = "uniform", .n_attrs = 4, .attr_names = uniform,
          .attr_types = tiiff, .dispatch_arg = -1, .flags = nd, .prepare = prep_fill);
    DECLS(op_normal, .name = "normal", .n_attrs = 4, .attr_names = normal, .attr_types = tiiff,
          .dispatch_arg = -1, .flags = nd, .prepare = prep_fill);
    DECLS(op_bernoulli, .name = "bernoulli", .n_attrs = 3, .attr_names = bernoulli,
          .attr_types = tiif, .dispatch_arg = -1, .flags = nd, .prepare = prep_fill);
    DECLS(op_randperm, .name = "randperm", .n_attrs = 2, .attr_names = randperm,
          .attr_types = tii, .dispatch_arg = -1, .flags = nd, .prepare = prep_fill);
#undef DECL
#undef DECLS
    if (st == EM_OK) st = em__ops_declare_math(core);
    if (st == EM_OK) st = em__ops_declare_reduce(core);
    if (st == EM_OK) st = em__ops_declare_nn(core);
    if (st == EM_OK) st = em__ops_declare_loss(core);
    if (st == EM_OK) st = em__ops_declare_data(core);
    if (st == EM_OK) st = em__ops_declare_linalg(core);
    if (st == EM_OK) st = em__ops_declare_optim(core);
    return st;
}

/* ---- elementwise ------------------------------------------------------------------------------ */

em_tensor *em_add(const em_tensor *a, const em_tensor *b) { return em__call1(op_add, 2, EM__IN(a, b), NULL); }
em_tensor *em_sub(const em_tensor *a, const em_tensor *b) { return em__call1(op_sub, 2, EM__IN(a, b), NULL); }
em_tensor *em_mul(const em_tensor *a, const em_tensor *b) { return em__call1(op_mul, 2, EM__IN(a, b), NULL); }
em_tensor *em_div(const em_tensor *a, const em_tensor *b) { return em__call1(op_div, 2, EM__IN(a, b), NULL); }
em_status em_add_(em_tensor *a, const em_tensor *b) { return em__op_inplace(op_add, a, EM__IN(a, b), 2, NULL); }
em_status em_sub_(em_tensor *a, const em_tensor *b) { return em__op_inplace(op_sub, a, EM__IN(a, b), 2, NULL); }
em_status em_mul_(em_tensor *a, const em_tensor *b) { return em__op_inplace(op_mul, a, EM__IN(a, b), 2, NULL); }
em_status em_div_(em_tensor *a, const em_tensor *b) { return em__op_inplace(op_div, a, EM__IN(a, b), 2, NULL); }
em_tensor *em_neg(const em_tensor *a) { return em__call1(op_neg, 1, &a, NULL); }
em_tensor *em_exp(const em_tensor *a) { return em__call1(op_exp, 1, &a, NULL); }
em_tensor *em_log(const em_tensor *a) { return em__call1(op_log, 1, &a, NULL); }
em_tensor *em_relu(const em_tensor *a) { return em__call1(op_relu, 1, &a, NULL); }
em_status em_relu_(em_tensor *a) { return em__op_inplace(op_relu, a, EM__IN(a), 1, NULL); }

/* ---- reductions ----------------------------------------------------------------------- */

em_tensor *em_sum(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    return em__call1(op_sum, 1, &a, EM__ATTRS(em__attr_ints(ndims, dims), EM__A_BOOL(keepdim)));
}
em_tensor *em_mean(const em_tensor *a, int ndims, const int *dims, bool keepdim) {
    return em__call1(op_mean, 1, &a, EM__ATTRS(em__attr_ints(ndims, dims), EM__A_BOOL(keepdim)));
}

/* ---- creation, data movement, random fills ------------------------------------------------------- */

em_status em_fill_(em_tensor *t, double value) {
    if (!em__check_inputs("fill_", (const em_tensor *const *)&t, 1)) return em_last_status();
    return em_op_call_out(em__op_fill, NULL, 0, EM__ATTRS(EM__A_FLOAT(value)), &t, 1);
}

em_tensor *em_arange(double start, double end, double step, em_dtype dt, em_device dev) {
    int64_t n = arange_len(start, end, step);
    em_tensor *t = n >= 0 ? em__empty(1, &n, dt, dev) : NULL;
    if (t && em_op_call_out(op_arange, NULL, 0, EM__ATTRS(EM__A_FLOAT(start), EM__A_FLOAT(step),
                                                          EM__A_FLOAT(end)), &t, 1) != EM_OK) {
        em_tensor_release(t);
        return NULL;
    }
    return em__scope_track(t);
}

em_tensor *em_index_select(const em_tensor *a, int dim, const em_tensor *index) {
    return em__call1(op_index_select, 2, EM__IN(a, index), EM__ATTRS(EM__A_INT(dim)));
}

/* A fill op's attributes from gen: seed and offset of the blocks reserved for t. */
static em_status random_fill(const em_op *op, em_tensor *t, em_generator *gen, int per_block,
                             double p0, double p1) {
    if (!em__check_inputs(em_op_name(op), (const em_tensor *const *)&t, 1)) return em_last_status();
    em_attr attrs[4] = {{0}, {0}, EM__A_FLOAT(p0), EM__A_FLOAT(p1)};
    /* Checked before the generator advances: a refused call draws nothing. */
    if (op_check_fill(op, &t, 1, attrs) != EM_OK) return em_last_status();
    uint64_t blocks = ((uint64_t)t->numel + (uint64_t)per_block - 1) / (uint64_t)per_block;
    em_rng_state s = em_generator_reserve(gen, blocks);
    attrs[0] = EM__A_INT((int64_t)s.seed);
    attrs[1] = EM__A_INT((int64_t)s.offset);
    return em_op_call_out(op, NULL, 0, attrs, &t, 1);
}

em_status em_uniform_(em_tensor *t, double lo, double hi, em_generator *gen) {
    return random_fill(op_uniform, t, gen, t && t->dtype == EM_F64 ? 2 : 4, lo, hi);
}
em_status em_normal_(em_tensor *t, double mean, double std, em_generator *gen) {
    return random_fill(op_normal, t, gen, 2, mean, std);
}
em_status em_bernoulli_(em_tensor *t, double p, em_generator *gen) {
    return random_fill(op_bernoulli, t, gen, 4, p, 0);
}

em_tensor *em_randperm(int64_t n, em_dtype dt, em_device dev, em_generator *gen) {
    if (randperm_check(n, dt) != EM_OK) return NULL;
    em_tensor *t = em__empty(1, &n, dt, dev);
    if (!t) return NULL;
    /* k = 0 .. n-2 draws word k: ceil((n - 1) / 4) blocks (ember/random.h). */
    em_rng_state s = em_generator_reserve(gen, n > 1 ? ((uint64_t)n + 2) / 4 : 0);
    if (em_op_call_out(op_randperm, NULL, 0, EM__ATTRS(EM__A_INT((int64_t)s.seed),
                                                       EM__A_INT((int64_t)s.offset)),
                       &t, 1) != EM_OK) {
        em_tensor_release(t);
        return NULL;
    }
    return em__scope_track(t);
}
