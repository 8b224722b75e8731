/*
 * ops_data.c — the standard op set, data movement: cat, stack, split, chunk, pad, gather,
 * scatter, scatter_add, index_add, embedding and its backward, masked_fill, one_hot, tril,
 * triu, flip, linspace: schemas, shape/dtype inference, derivatives and the typed public
 * functions of ember/ops.h.
 *
 * cat, stack, split, split_sizes, chunk and pad are composite ops (em_op_schema.composite, no
 * kernel of their own): views plus em_copy_/em_fill_ into views of a freshly allocated output,
 * which works on every device that has copy and fill kernels. cat and stack take any number
 * of inputs (EM_OP_VARIADIC); split, split_sizes and chunk make any number of outputs
 * (EM_OP_VARIADIC_OUTPUTS, run by name with em_op_call_n). A copy into a
 * view of the output would record history on that view only, so when an input requires grad
 * (and grad mode is on) cat adds each input into the output with index_add instead (one node
 * per input, whose backward selects the input's part of the grad), and pad is built from
 * narrow and cat. split and chunk return autograd views.
 *
 * Kernel contracts (what a backend may assume, per op). "index" inputs are int64 (the public
 * functions convert int32 where PyTorch accepts it) and may be strided; kernels check index
 * VALUES (the range) and fail with EM_ERR_RANGE naming the bad value and the size; shapes and
 * dtypes are checked here. A 0-dim self/index is treated as 1-D of size 1 (PyTorch's rule).
 *   gather(x, index) -> y      attrs: dim (normalised). y has index's shape and x's dtype;
 *                              index.ndim == x.ndim; index.size(d) <= x.size(d) for d != dim.
 *                              y[i..j..k] = x[i..index[i..j..k]..k] (j along dim).
 *   scatter(x, index, src) -> y, scatter_add(x, index, src) -> y
 *                              attrs: dim. y has x's shape and dtype; src has x's dtype;
 *                              index.ndim == x.ndim == src.ndim; index.size(d) <= src.size(d)
 *                              for all d and <= x.size(d) for d != dim; index non-empty. y is
 *                              x's values with y[..index[pos]..] = (or +=) src[pos] for every
 *                              position pos of index. y may BE x (same data and strides: in
 *                              place); otherwise the kernel copies x into y first. When
 *                              several positions hit one element, they apply in increasing
 *                              order of the position along dim (the last write wins for
 *                              scatter; scatter_add sums in that order) — results must not
 *                              depend on the thread count. Nothing is written when an index
 *                              is out of range.
 *   index_add(x, index, source) -> y   attrs: dim, alpha (float). index is 1-D int64 of
 *                              length source.size(dim); source has x's dtype and ndim and
 *                              x's sizes outside dim. y = x, then for i in order:
 *                              y.select(dim, index[i]) += alpha * source.select(dim, i)
 *                              (alpha converted to the dtype: truncated for integers, != 0 for
 *                              bool, where + is logical or). y may be x (in place); same
 *                              ordering and no-partial-write rules as scatter_add.
 *   embedding(weight, indices) -> y     weight (V, D), indices any shape (int64), y
 *                              (*indices.shape, D) of weight's dtype: y[..., :] =
 *                              weight[indices[...], :]. Range [0, V) checked. attrs:
 *                              padding_idx (normalised, -1: none); only the derivative
 *                              reads it (those rows get no gradient).
 *   embedding_backward(grad, indices) -> y   attrs: num_weights V, padding_idx (-1: none,
 *                              else in [0, V)). grad (N, D) floating, indices (N), y (V, D)
 *                              of grad's dtype: zeros, then y[indices[i]] += grad[i] in
 *                              order of i, skipping i with indices[i] == padding_idx.
 *   masked_fill(x, mask) -> y  attrs: value (float). Broadcast (EM_OP_BROADCAST): x and the
 *                              bool mask arrive with y's shape; y = mask ? value : x, value
 *                              converted to y's dtype (ember/dtype.h rules). y may alias x.
 *   one_hot(x) -> y            attrs: num_classes C (>= 0, already inferred). x int64 any
 *                              shape; y (*x.shape, C) int64, 1 at y[..., x[...]], 0 elsewhere.
 *                              Values outside [0, C) are EM_ERR_RANGE.
 *   tril(x) -> y, triu(x) -> y attrs: diagonal k. x has >= 2 dims; on each matrix of the last
 *                              two dims (row i, col j) y = x where j - i <= k (tril) or
 *                              j - i >= k (triu), else 0. y may alias x (in place).
 *   flip(x) -> y               attrs: dims (ints, normalised, unique). y[i] = x[i reversed
 *                              along each listed dim]. y never aliases x.
 *   linspace() -> y            attrs: start, end (floats). y is 1-D with steps = numel
 *                              elements; see em_linspace for the values.
 */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/op_helpers.h"
#include "ember/ops.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

const em_op *em__op_copy;
static const em_op *op_index_select;
static const em_op *op_cat, *op_stack, *op_split, *op_split_sizes, *op_chunk, *op_pad;
static const em_op *op_gather, *op_scatter, *op_scatter_add, *op_index_add, *op_embedding,
    *op_embedding_backward, *op_masked_fill, *op_one_hot, *op_tril, *op_triu, *op_flip,
    *op_linspace;

/* PyTorch's "ensure_nonempty" view of a shape: a 0-dim tensor counts as 1-D of size 1. */
static int ne_ndim(const em_tensor *t) { return t->ndim > 0 ? t->ndim : 1; }
static int64_t ne_size(const em_tensor *t, int d) { return t->ndim > 0 ? t->shape[d] : 1; }

static const char *shp(const em_tensor *t, char *buf, size_t cap) {
    return em__shape_str(t->ndim, t->shape, buf, cap);
}

/* ---- inference ------------------------------------------------------------------------------- */

static em_status infer_gather(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                              em_tensor_meta *out) {
    const em_tensor *x = in[0], *idx = in[1];
    int dim = (int)attrs[0].v.i;
    char a[160], b[160];
    if (idx->dtype != EM_I64)
        return em_set_error(EM_ERR_DTYPE, "%s: the index must be int64, got %s", em_op_name(op),
                            em_dtype_name(idx->dtype));
    if (dim < 0 || dim >= ne_ndim(x))
        return em_set_error(EM_ERR_RANGE, "%s: dim %d is out of range for input shape %s",
                            em_op_name(op), dim, shp(x, a, sizeof a));
    if (ne_ndim(idx) != ne_ndim(x))
        return em_set_error(EM_ERR_SHAPE, "%s: index shape %s and input shape %s must have the "
                            "same number of dims", em_op_name(op), shp(idx, a, sizeof a),
                            shp(x, b, sizeof b));
    for (int d = 0; d < ne_ndim(x); d++)
        if (d != dim && ne_size(idx, d) > ne_size(x, d))
            return em_set_error(EM_ERR_SHAPE, "%s: index shape %s must not exceed input shape "
                                "%s in any dim except dim %d (dim %d: %lld > %lld)",
                                em_op_name(op), shp(idx, a, sizeof a), shp(x, b, sizeof b), dim,
                                d, (long long)ne_size(idx, d), (long long)ne_size(x, d));
    out->dtype = x->dtype;
    out->ndim = idx->ndim;
    memcpy(out->shape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    return EM_OK;
}

/* scatter and scatter_add: PyTorch's scatter_shape_check, with both shapes named. */
static em_status infer_scatter(const em_op *op, const em_tensor *const *in,
                               const em_attr *attrs, em_tensor_meta *out) {
    const em_tensor *x = in[0], *idx = in[1], *src = in[2];
    int dim = (int)attrs[0].v.i;
    char a[160], b[160], c[160];
    if (idx->dtype != EM_I64)
        return em_set_error(EM_ERR_DTYPE, "%s: the index must be int64, got %s", em_op_name(op),
                            em_dtype_name(idx->dtype));
    if (src->dtype != x->dtype)
        return em_set_error(EM_ERR_DTYPE, "%s: src has dtype %s but the input has %s; they must "
                            "match", em_op_name(op), em_dtype_name(src->dtype),
                            em_dtype_name(x->dtype));
    if (dim < 0 || dim >= ne_ndim(x))
        return em_set_error(EM_ERR_RANGE, "%s: dim %d is out of range for input shape %s",
                            em_op_name(op), dim, shp(x, a, sizeof a));
    if (idx->numel > 0) {
        if (ne_ndim(idx) != ne_ndim(x) || ne_ndim(src) != ne_ndim(x))
            return em_set_error(EM_ERR_SHAPE, "%s: input %s, index %s and src %s must have the "
                                "same number of dims", em_op_name(op), shp(x, a, sizeof a),
                                shp(idx, b, sizeof b), shp(src, c, sizeof c));
        for (int d = 0; d < ne_ndim(x); d++)
            if ((d != dim && ne_size(idx, d) > ne_size(x, d)) || ne_size(idx, d) > ne_size(src, d))
                return em_set_error(EM_ERR_SHAPE, "%s: index shape %s must not exceed the input "
                                    "shape %s except in dim %d, nor the src shape %s in any dim "
                                    "(dim %d)", em_op_name(op), shp(idx, a, sizeof a),
                                    shp(x, b, sizeof b), dim, shp(src, c, sizeof c), d);
    }
    out->dtype = x->dtype;
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    return EM_OK;
}

static em_status infer_index_add(const em_op *op, const em_tensor *const *in,
                                 const em_attr *attrs, em_tensor_meta *out) {
    const em_tensor *x = in[0], *idx = in[1], *src = in[2];
    int dim = (int)attrs[0].v.i;
    char a[160], b[160];
    if (idx->dtype != EM_I64 || idx->ndim > 1)
        return em_set_error(EM_ERR_INVALID, "%s: the index must be a 1-D int64 (or int32) "
                            "tensor; got shape %s of %s", em_op_name(op), shp(idx, a, sizeof a),
                            em_dtype_name(idx->dtype));
    if (src->dtype != x->dtype)
        return em_set_error(EM_ERR_DTYPE, "%s: source has dtype %s but the input has %s; they "
                            "must match", em_op_name(op), em_dtype_name(src->dtype),
                            em_dtype_name(x->dtype));
    if (dim < 0 || dim >= ne_ndim(x))
        return em_set_error(EM_ERR_RANGE, "%s: dim %d is out of range for input shape %s",
                            em_op_name(op), dim, shp(x, a, sizeof a));
    if (ne_ndim(src) != ne_ndim(x))
        return em_set_error(EM_ERR_SHAPE, "%s: source shape %s and input shape %s must have the "
                            "same number of dims", em_op_name(op), shp(src, a, sizeof a),
                            shp(x, b, sizeof b));
    if (ne_size(src, dim) != idx->numel)
        return em_set_error(EM_ERR_SHAPE, "%s: the index has %lld entries but source shape %s "
                            "has %lld along dim %d", em_op_name(op), (long long)idx->numel,
                            shp(src, a, sizeof a), (long long)ne_size(src, dim), dim);
    for (int d = 0; d < ne_ndim(x); d++)
        if (d != dim && ne_size(src, d) != ne_size(x, d))
            return em_set_error(EM_ERR_SHAPE, "%s: source shape %s must match input shape %s "
                                "in every dim except dim %d (dim %d: %lld vs %lld)",
                                em_op_name(op), shp(src, a, sizeof a), shp(x, b, sizeof b), dim,
                                d, (long long)ne_size(src, d), (long long)ne_size(x, d));
    out->dtype = x->dtype;
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    return EM_OK;
}

static em_status infer_embedding(const em_op *op, const em_tensor *const *in,
                                 const em_attr *attrs, em_tensor_meta *out) {
    (void)attrs;
    const em_tensor *w = in[0], *idx = in[1];
    char a[160];
    if (w->ndim != 2)
        return em_set_error(EM_ERR_SHAPE, "%s: the weight must be 2-D (num_embeddings, "
                            "embedding_dim), got shape %s", em_op_name(op), shp(w, a, sizeof a));
    if (idx->dtype != EM_I64)
        return em_set_error(EM_ERR_DTYPE, "%s: indices must be int64 (or int32), got %s",
                            em_op_name(op), em_dtype_name(idx->dtype));
    if (idx->ndim >= EM_MAX_DIMS)
        return em_set_error(EM_ERR_SHAPE, "%s: indices with %d dims leave no room for the "
                            "embedding dim", em_op_name(op), idx->ndim);
    out->dtype = w->dtype;
    out->ndim = idx->ndim + 1;
    memcpy(out->shape, idx->shape, sizeof(int64_t) * (size_t)idx->ndim);
    out->shape[idx->ndim] = w->shape[1];
    return EM_OK;
}

static em_status infer_embedding_backward(const em_op *op, const em_tensor *const *in,
                                          const em_attr *attrs, em_tensor_meta *out) {
    const em_tensor *g = in[0], *idx = in[1];
    char a[160], b[160];
    int64_t v = attrs[0].v.i, pad = attrs[1].type == EM_ATTR_NONE ? -1 : attrs[1].v.i;
    if (!em_dtype_is_floating(g->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s: grad must be floating, got %s", em_op_name(op),
                            em_dtype_name(g->dtype));
    if (idx->dtype != EM_I64 || idx->ndim != 1 || g->ndim != 2 || g->shape[0] != idx->shape[0])
        return em_set_error(EM_ERR_SHAPE, "%s: expects grad (N, D) and 1-D int64 indices (N); "
                            "got grad %s and indices %s of %s", em_op_name(op),
                            shp(g, a, sizeof a), shp(idx, b, sizeof b),
                            em_dtype_name(idx->dtype));
    if (v < 0 || pad < -1 || pad >= EM_MAX(v, 1))
        return em_set_error(EM_ERR_RANGE, "%s: num_weights %lld and padding_idx %lld are invalid",
                            em_op_name(op), (long long)v, (long long)pad);
    *out = (em_tensor_meta){.dtype = g->dtype, .ndim = 2, .shape = {v, g->shape[1]}};
    return EM_OK;
}

/* masked_fill: NumPy broadcasting of x and the mask, naming both shapes; x's dtype. */
static em_status infer_masked_fill(const em_op *op, const em_tensor *const *in,
                                   const em_attr *attrs, em_tensor_meta *out) {
    (void)attrs;
    const em_tensor *x = in[0], *m = in[1];
    char a[160], b[160];
    if (m->dtype != EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "%s: the mask must be bool, got %s", em_op_name(op),
                            em_dtype_name(m->dtype));
    int nd = EM_MAX(x->ndim, m->ndim);
    for (int i = 0; i < nd; i++) {
        int ix = x->ndim - nd + i, im = m->ndim - nd + i;
        int64_t sx = ix >= 0 ? x->shape[ix] : 1, sm = im >= 0 ? m->shape[im] : 1;
        if (sx != sm && sx != 1 && sm != 1)
            return em_set_error(EM_ERR_SHAPE, "%s: input shape %s and mask shape %s cannot be "
                                "broadcast (dim %d: %lld vs %lld)", em_op_name(op),
                                shp(x, a, sizeof a), shp(m, b, sizeof b), i - nd, (long long)sx,
                                (long long)sm);
        out->shape[i] = sx == 1 ? sm : sx;
    }
    out->ndim = nd;
    out->dtype = x->dtype;
    return EM_OK;
}

static em_status infer_one_hot(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                               em_tensor_meta *out) {
    const em_tensor *x = in[0];
    if (x->dtype != EM_I64)
        return em_set_error(EM_ERR_DTYPE, "%s: expects an int64 tensor of class indices, got %s",
                            em_op_name(op), em_dtype_name(x->dtype));
    if (x->ndim >= EM_MAX_DIMS)
        return em_set_error(EM_ERR_SHAPE, "%s: an input with %d dims leaves no room for the "
                            "class dim", em_op_name(op), x->ndim);
    if (attrs[0].v.i < 0)
        return em_set_error(EM_ERR_INVALID, "%s: num_classes must be >= 0 here, got %lld",
                            em_op_name(op), (long long)attrs[0].v.i);
    out->dtype = EM_I64;
    out->ndim = x->ndim + 1;
    memcpy(out->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    out->shape[x->ndim] = attrs[0].v.i;
    return EM_OK;
}

static em_status infer_tri(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                           em_tensor_meta *out) {
    (void)attrs;
    const em_tensor *x = in[0];
    char a[160];
    if (x->ndim < 2)
        return em_set_error(EM_ERR_SHAPE, "%s: expects a tensor with at least 2 dims, got shape "
                            "%s", em_op_name(op), shp(x, a, sizeof a));
    out->dtype = x->dtype;
    out->ndim = x->ndim;
    memcpy(out->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    return EM_OK;
}

/* infer_same: em_infer_same (ember/op_helpers.h). */
#define infer_same em_infer_same

/* ---- declarations ---------------------------------------------------------------------------- */

/* ---- derivatives ------------------------------------------------------------------------------
 * Written with the public ops; they run with grad mode off inside a scope of their own, so
 * temporaries need no release. A grad passed through unchanged is returned as a new reference
 * (em_tensor_retain). Index inputs are integers: they never get a grad. */

#define G (c->grad_out[0])
#define NEED(i) (c->needs_grad[i])
#define DIM ((int)c->attrs[0].v.i)

static em_status done(em_tensor *g, em_tensor **slot) {
    *slot = g;
    return g ? EM_OK : em_last_status();
}

static em_tensor *zeros_of(const em_backward_ctx *c, int i) {
    return em_zeros(c->in_meta[i].ndim, c->in_meta[i].shape, c->in_meta[i].dtype,
                    em_tensor_device(G));
}

/* The grad of scatter's src: G gathered at the index (index's shape), placed into zeros of
 * src's shape when src is larger than the index (its other elements were not used). */
static em_tensor *src_grad(const em_backward_ctx *c) {
    const em_tensor *idx = c->in[1];
    const em_tensor_meta *m = &c->in_meta[2];
    em_tensor *g = em_gather(G, DIM, idx);
    if (!g || (m->ndim == em_tensor_ndim(g) &&
               memcmp(m->shape, em_tensor_shape(g), sizeof(int64_t) * (size_t)m->ndim) == 0))
        return g;
    if (m->ndim != em_tensor_ndim(g)) return em_reshape(g, m->ndim, m->shape); /* 0-dim */
    em_tensor *z = zeros_of(c, 2), *part = z;
    for (int d = 0; d < m->ndim && part; d++) part = em_narrow(part, d, 0, em_tensor_shape(g)[d]);
    return part && em_copy_(part, g) == EM_OK ? z : NULL;
}

static em_status d_gather(const em_backward_ctx *c, em_tensor **gi) {
    em_tensor *z = zeros_of(c, 0);
    return done(z ? em_scatter_add(z, DIM, c->in[1], G) : NULL, &gi[0]);
}

/* self: the grad with the overwritten positions zeroed; src: the grad gathered (as PyTorch,
 * exact when the index has no duplicates). */
static em_status d_scatter(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *idx = c->in[1];
    if (NEED(0)) {
        em_tensor *z = em_zeros(em_tensor_ndim(idx), em_tensor_shape(idx), em_tensor_dtype(G),
                                em_tensor_device(G));
        if (done(z ? em_scatter(G, DIM, idx, z) : NULL, &gi[0]) != EM_OK) return em_last_status();
    }
    if (NEED(2) && done(src_grad(c), &gi[2]) != EM_OK) return em_last_status();
    return EM_OK;
}

static em_status d_scatter_add(const em_backward_ctx *c, em_tensor **gi) {
    if (NEED(0)) gi[0] = em_tensor_retain(G);
    if (NEED(2) && done(src_grad(c), &gi[2]) != EM_OK) return em_last_status();
    return EM_OK;
}

/* self: the grad; source: the grad's slices at the index, times alpha. */
static em_status d_index_add(const em_backward_ctx *c, em_tensor **gi) {
    double alpha = c->attrs[1].v.f;
    if (NEED(0)) gi[0] = em_tensor_retain(G);
    if (NEED(2)) {
        const em_tensor_meta *m = &c->in_meta[2];
        em_tensor *g = em_index_select(G, DIM, c->in[1]);
        if (g && alpha != 1) g = em_mul_scalar(g, alpha);
        if (done(g ? em_reshape(g, m->ndim, m->shape) : NULL, &gi[2]) != EM_OK)
            return em_last_status();
    }
    return EM_OK;
}

static em_status d_embedding(const em_backward_ctx *c, em_tensor **gi) {
    int64_t pad = c->attrs[0].type == EM_ATTR_INT && c->attrs[0].v.i >= 0 ? c->attrs[0].v.i
                                                                          : EM_PADDING_IDX_NONE;
    return done(em_embedding_backward(G, c->in[1], c->in_meta[0].shape[0], pad), &gi[0]);
}

static em_status d_masked_fill(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_masked_fill(G, c->in[1], 0), &gi[0]);
}

static em_status d_tril(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_tril(G, c->attrs[0].v.i), &gi[0]);
}

static em_status d_triu(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_triu(G, c->attrs[0].v.i), &gi[0]);
}

static em_status d_flip(const em_backward_ctx *c, em_tensor **gi) {
    int dims[EM_MAX_DIMS];
    for (int i = 0; i < c->attrs[0].n; i++) dims[i] = (int)c->attrs[0].ints[i];
    return done(em_flip(G, c->attrs[0].n, dims), &gi[0]);
}
#undef G
#undef NEED
#undef DIM

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

static em_status d_copy(const em_backward_ctx *c, em_tensor **gi) {
    gi[0] = em_to_dtype(c->grad_out[0], c->in_meta[0].dtype);
    return gi[0] ? EM_OK : em_last_status();
}

static em_status d_index_select(const em_backward_ctx *c, em_tensor **gi) {
    /* The selected slices' grads added back at their index (repeats accumulate). */
    const em_tensor_meta *m = &c->in_meta[0];
    em_tensor *z = em_zeros(m->ndim, m->shape, m->dtype, em_tensor_device(c->grad_out[0]));
    gi[0] = z ? em_index_add(z, (int)c->attrs[0].v.i, c->in[1], c->grad_out[0], 1) : NULL;
    return gi[0] ? EM_OK : em_last_status();
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

/* The composites (below): views, copies and fills, on every device. */
EM__COMPOSITE(c_cat);
EM__COMPOSITE(c_stack);
EM__COMPOSITE(c_split);
EM__COMPOSITE(c_split_sizes);
EM__COMPOSITE(c_chunk);
EM__COMPOSITE(c_pad);
EM__COMPOSITE(c_index_read);
EM__COMPOSITE(c_index_write);
EM__COMPOSITE(c_one_hot);
EM__COMPOSITE(c_flip);
static em_status prep_linspace(const em_op *op, const em_tensor *const *out, int n_out,
                               const em_attr *attrs, em_dtype *dts);

em_status em__ops_declare_data(em_registry *core) {
    static const char *const dim[] = {"dim"}, *const dim_alpha[] = {"dim", "alpha"},
                             *const emb_bw[] = {"num_weights", "padding_idx"},
                             *const value[] = {"value"}, *const classes[] = {"num_classes"},
                             *const diagonal[] = {"diagonal"}, *const dims[] = {"dims"},
                             *const linspace[] = {"start", "end"},
                             *const padding[] = {"padding_idx"};
    static const em_attr_type ti[] = {EM_ATTR_INT}, tif[] = {EM_ATTR_INT, EM_ATTR_FLOAT},
                              tii[] = {EM_ATTR_INT, EM_ATTR_INT}, tf[] = {EM_ATTR_FLOAT},
                              tis[] = {EM_ATTR_INTS}, tff[] = {EM_ATTR_FLOAT, EM_ATTR_FLOAT};
    em_status st = EM_OK;
#define DECL(var, ...) if (st == EM_OK) st = em__declare_op(core, &var, __VA_ARGS__)
    const unsigned nd = EM_OP_NONDIFF, idx = EM_SAVE_INPUT(1);
/* DCA: with an autocast class (ember/autocast.h); DC: unaffected. */
#define DCA(ac, var, nm, nin, na, an, at, fl_, inf, bw, sv, comp)                              \
    if (st == EM_OK)                                                                            \
        st = em__declare(core, &var, (em_op_schema){.name = nm, .n_inputs = nin, .n_attrs = na, \
                         .attr_names = an, .attr_types = at, .flags = fl_, .infer = inf,        \
                         .backward = bw, .saves = sv, .composite = comp, .category = "data",    \
                         .autocast = ac})
#define DC(...) DCA(EM_AUTOCAST_NONE, __VA_ARGS__)
    DC(em__op_copy, "copy", 1, 0, NULL, NULL, 0, infer_same, d_copy, 0, NULL);
    /* index_select's derivative is index_add of the grad into zeros. */
    DC(op_index_select, "index_select", 2, 1, dim, ti, 0, infer_index_select, d_index_select,
       idx, c_index_select);
    DC(op_gather, "gather", 2, 1, dim, ti, 0, infer_gather, d_gather, idx, c_index_read);
    DC(op_scatter, "scatter", 3, 1, dim, ti, 0, infer_scatter, d_scatter, idx, c_index_write);
    DCA(EM_AUTOCAST_PROMOTE, op_scatter_add, "scatter_add", 3, 1, dim, ti, 0, infer_scatter, d_scatter_add, idx,
       c_index_write);
    DC(op_index_add, "index_add", 3, 2, dim_alpha, tif, 0, infer_index_add, d_index_add, idx,
       c_index_write);
    /* padding_idx (normalised, -1: none) only matters to the derivative. */
    DC(op_embedding, "embedding", 2, 1, padding, ti, 0, infer_embedding, d_embedding, idx,
       c_index_read);
    DC(op_embedding_backward, "embedding_backward", 2, 2, emb_bw, tii, nd,
       infer_embedding_backward, NULL, 0, c_index_read);
    DC(op_masked_fill, "masked_fill", 2, 1, value, tf, EM_OP_BROADCAST, infer_masked_fill,
       d_masked_fill, idx, NULL);
    DC(op_one_hot, "one_hot", 1, 1, classes, ti, nd, infer_one_hot, NULL, 0, c_one_hot);
    DC(op_tril, "tril", 1, 1, diagonal, ti, 0, infer_tri, d_tril, 0, NULL);
    DC(op_triu, "triu", 1, 1, diagonal, ti, 0, infer_tri, d_triu, 0, NULL);
    DC(op_flip, "flip", 1, 1, dims, tis, 0, infer_same, d_flip, 0, c_flip);
#undef DC
#undef DCA
    if (st == EM_OK)
        st = em__declare(core, &op_linspace, (em_op_schema){.name = "linspace", .n_attrs = 2,
                         .attr_names = linspace, .attr_types = tff, .dispatch_arg = -1,
                         .flags = nd, .prepare = prep_linspace, .category = "data"});
#undef DECL
    static const char *const split[] = {"split_size", "dim"}, *const sizes[] = {"sizes", "dim"},
                             *const chunk[] = {"chunks", "dim"}, *const pad[] = {"pad", "value"};
    static const em_attr_type tl_i[] = {EM_ATTR_INT_LIST, EM_ATTR_INT},
                              tl_f[] = {EM_ATTR_INT_LIST, EM_ATTR_FLOAT};
    const unsigned vin = EM_OP_VARIADIC, vout = EM_OP_VARIADIC_OUTPUTS;
#define DECLS(var, ...) if (st == EM_OK) st = em__declare(core, &var, (em_op_schema){__VA_ARGS__, \
                                                          .n_inputs = 1, .category = "data"})
    DECLS(op_cat, .name = "cat", .autocast = EM_AUTOCAST_PROMOTE, .flags = vin, .n_attrs = 1, .attr_names = dim,
          .attr_types = ti, .composite = c_cat);
    DECLS(op_stack, .name = "stack", .autocast = EM_AUTOCAST_PROMOTE, .flags = vin, .n_attrs = 1, .attr_names = dim,
          .attr_types = ti, .composite = c_stack);
    DECLS(op_split, .name = "split", .flags = vout, .n_attrs = 2, .attr_names = split,
          .attr_types = tii, .composite = c_split);
    DECLS(op_split_sizes, .name = "split_sizes", .flags = vout, .n_attrs = 2,
          .attr_names = sizes, .attr_types = tl_i, .composite = c_split_sizes);
    DECLS(op_chunk, .name = "chunk", .flags = vout, .n_attrs = 2, .attr_names = chunk,
          .attr_types = tii, .composite = c_chunk);
    DECLS(op_pad, .name = "pad", .n_attrs = 2, .attr_names = pad, .attr_types = tl_f,
          .composite = c_pad);
#undef DECLS
    return st;
}

/* ---- helpers --------------------------------------------------------------------------------- */

/* A view of t over elements [start, start + length) of dim (no scope tracking). */
static em_tensor *narrow_view(const em_tensor *t, int dim, int64_t start, int64_t length) {
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    shape[dim] = length;
    return em__tensor_view(t, t->ndim, shape, t->strides, t->offset + start * t->strides[dim]);
}

/* An int64 (or int32, converted) index tensor as int64; a new reference. */
static em_tensor *index_i64(const char *who, const em_tensor *index, bool allow_i32) {
    if (index->dtype == EM_I64) return em_tensor_retain((em_tensor *)index);
    if (allow_i32 && index->dtype == EM_I32) return em__to_dtype(index, EM_I64);
    em_set_error(EM_ERR_DTYPE, "%s: the index must be int64%s, got %s", who,
                 allow_i32 ? " (or int32)" : "", em_dtype_name(index->dtype));
    return NULL;
}

/* ---- cat and stack ----------------------------------------------------------------------------- */

/* PyTorch's legacy rule: 1-D tensors of size 0 take no part in cat's shape checks. */
static bool cat_skipped(const em_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

/* cat with history: each input (in the result dtype) is index_add-ed into its slice of an
 * output filled with -0.0 (x + -0.0 is x exactly, signed zeros and NaN included). shape is the
 * output's; ref the input whose shape the others were checked against. */
static em_tensor *cat_recorded(int n, const em_tensor *const *ts, int d, int ndim,
                               const int64_t *shape, int ref) {
    if (em_scope_begin() != EM_OK) return NULL;
    em_device dev = ts[0]->storage->device;
    em_dtype rt = em__result_type(ts, n);
    em_tensor *out = em_full(ndim, shape, -0.0, rt, dev);
    em_status st = out ? EM_OK : em_last_status();
    int64_t at = 0;
    for (int i = 0; i < n && st == EM_OK; i++) {
        const em_tensor *t = ts[i];
        if ((cat_skipped(t) && i != ref) || t->shape[d] == 0) continue;
        em_tensor *idx = em_arange((double)at, (double)(at + t->shape[d]), 1, EM_I64, dev);
        em_tensor *src = idx ? em_to_dtype(t, rt) : NULL;
        st = src ? em_index_add_(out, d, idx, src, 1) : em_last_status();
        at += t->shape[d];
    }
    if (st == EM_OK) em__scope_untrack(out);
    em_scope_end();
    return st == EM_OK ? out : NULL;
}

static em_tensor *cat_impl(const char *who, int n, const em_tensor *const *ts, int dim) {
    if (n <= 0 || !ts) {
        em_set_error(EM_ERR_INVALID, "%s: expected a non-empty list of tensors, got %d", who, n);
        return NULL;
    }
    if (!em__check_inputs(who, ts, n)) return NULL;
    int ref = -1;
    for (int i = 0; i < n; i++) {
        char a[48], b[48];
        if (ts[i]->ndim == 0) {
            em_set_error(EM_ERR_SHAPE, "%s: tensor %d is 0-dim and cannot be concatenated "
                         "(em_stack or em_unsqueeze it first)", who, i);
            return NULL;
        }
        if (!em_device_equal(ts[i]->storage->device, ts[0]->storage->device)) {
            em_set_error(EM_ERR_DEVICE, "%s: expected all tensors on the same device, but "
                         "tensor 0 is on %s and tensor %d on %s", who,
                         em_device_str(ts[0]->storage->device, a, sizeof a), i,
                         em_device_str(ts[i]->storage->device, b, sizeof b));
            return NULL;
        }
        if (ref < 0 && !cat_skipped(ts[i])) ref = i;
    }
    const em_tensor *r = ts[ref < 0 ? 0 : ref];
    int d = em__wrap_dim(dim, r->ndim, who);
    if (d < 0) return NULL;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, r->shape, sizeof(int64_t) * (size_t)r->ndim);
    shape[d] = 0;
    for (int i = 0; i < n; i++) {
        const em_tensor *t = ts[i];
        if (cat_skipped(t) && i != ref) continue;
        char a[160], b[160];
        if (t->ndim != r->ndim) {
            em_set_error(EM_ERR_SHAPE, "%s: tensor %d has shape %s but tensor %d has %s; all "
                         "tensors must have the same number of dims", who, i,
                         shp(t, a, sizeof a), ref, shp(r, b, sizeof b));
            return NULL;
        }
        for (int k = 0; k < r->ndim; k++)
            if (k != d && t->shape[k] != r->shape[k]) {
                em_set_error(EM_ERR_SHAPE, "%s: tensor %d has shape %s but tensor %d has %s; "
                             "all dims except dim %d must match", who, i, shp(t, a, sizeof a),
                             ref, shp(r, b, sizeof b), d);
                return NULL;
            }
        shape[d] += t->shape[d];
    }
    if (em_grad_enabled())
        for (int i = 0; i < n; i++)
            if (ts[i]->requires_grad) return cat_recorded(n, ts, d, r->ndim, shape, ref);
    em_tensor *out = em__empty(r->ndim, shape, em__result_type(ts, n), r->storage->device);
    if (!out) return NULL;
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        const em_tensor *t = ts[i];
        if ((cat_skipped(t) && i != ref) || t->shape[d] == 0) continue;
        em_tensor *v = narrow_view(out, d, at, t->shape[d]);
        em_status st = v ? em_copy_(v, t) : em_last_status();
        em_tensor_release(v);
        if (st != EM_OK) {
            em_tensor_release(out);
            return NULL;
        }
        at += t->shape[d];
    }
    return out;
}

static em_status one_out(em_tensor *r, em_tensor **out, int *n_out) {
    *n_out = (out[0] = r) != NULL;
    return r ? EM_OK : em_last_status();
}

/* cat(tensors...; dim): variadic. */
static em_status c_cat(const em_op *op, const em_tensor *const *in, int n_in,
                       const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)op, (void)cap;
    return one_out(cat_impl("cat", n_in, in, (int)em__attr_int_or(attrs, 0, 0)), out, n_out);
}

static em_tensor *stack_impl(int n, const em_tensor *const *ts, int dim) {
    for (int i = 1; i < n; i++) {
        bool same = ts[i]->ndim == ts[0]->ndim &&
                    memcmp(ts[i]->shape, ts[0]->shape, sizeof(int64_t) * (size_t)ts[0]->ndim) == 0;
        if (!same) {
            char a[160], b[160];
            em_set_error(EM_ERR_SHAPE, "stack: tensor %d has shape %s but tensor 0 has %s; all "
                         "tensors must have the same shape", i, shp(ts[i], a, sizeof a),
                         shp(ts[0], b, sizeof b));
            return NULL;
        }
    }
    if (ts[0]->ndim >= EM_MAX_DIMS) {
        em_set_error(EM_ERR_SHAPE, "stack: tensors with %d dims cannot gain one", ts[0]->ndim);
        return NULL;
    }
    int d = em__wrap_dim(dim, ts[0]->ndim + 1, "stack");
    if (d < 0) return NULL;
    /* unsqueeze + cat: each input becomes a size-1 slice of the new dim. */
    em_tensor **us = em__calloc((size_t)n, sizeof *us, "stack");
    if (!us) return NULL;
    em_tensor *out = NULL;
    int made = 0;
    for (; made < n; made++)
        if (!(us[made] = em__unsqueeze(ts[made], d))) break;
    if (made == n) out = cat_impl("stack", n, (const em_tensor *const *)us, d);
    for (int i = 0; i < made; i++) em_tensor_release(us[i]);
    em__free(us);
    return out;
}

/* stack(tensors...; dim): variadic. */
static em_status c_stack(const em_op *op, const em_tensor *const *in, int n_in,
                         const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)op, (void)cap;
    return one_out(stack_impl(n_in, in, (int)em__attr_int_or(attrs, 0, 0)), out, n_out);
}

/* ---- split and chunk --------------------------------------------------------------------------- */

/* count views of t along dim d: piece i has sizes[i] elements, or (sizes NULL) `uniform`
 * elements but the last, which has what is left. All or nothing (owned references: the
 * caller's em_op_call_n puts them in the scope). */
static em_status make_pieces(const em_tensor *t, int d, int64_t count, const int64_t *sizes,
                             int64_t uniform, em_tensor **out) {
    int64_t at = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t len = sizes ? sizes[i] : EM_MAX(EM_MIN(uniform, t->shape[d] - at), 0);
        em__view_info info = {.kind = EM__VIEW_NARROW, .dim = d, .start = at, .step = 1};
        if (!(out[i] = em__autograd_view(narrow_view(t, d, at, len), t, &info))) {
            for (int64_t j = 0; j < i; j++) {
                em_tensor_release(out[j]);
                out[j] = NULL;
            }
            return em_last_status();
        }
        at += len;
    }
    return EM_OK;
}

static em_status split_dim(const char *who, const em_tensor *t, int dim, int *d) {
    if (t->ndim == 0)
        return em_set_error(EM_ERR_SHAPE, "%s: expects a tensor with at least 1 dim, got a "
                            "0-dim tensor", who);
    *d = em__wrap_dim(dim, t->ndim, who);
    return *d < 0 ? em_last_status() : EM_OK;
}

static em_status pieces_fit(const char *who, int64_t count, int cap, em_tensor **out, int *n) {
    if (count > INT_MAX)
        return em_set_error(EM_ERR_RANGE, "%s: %lld pieces are too many", who, (long long)count);
    if (n) *n = (int)count;
    if (out && cap < count)
        return em_set_error(EM_ERR_RANGE, "%s: %lld pieces do not fit in an array of %d", who,
                            (long long)count, cap);
    return EM_OK;
}

/* split(t; split_size, dim) -> pieces: variadic outputs. */
static em_status c_split(const em_op *op, const em_tensor *const *in, int n_in,
                         const em_attr *attrs, em_tensor **out, int cap, int *n) {
    (void)op, (void)n_in;
    const em_tensor *t = in[0];
    if (!attrs || attrs[0].type != EM_ATTR_INT)
        return em_set_error(EM_ERR_INVALID, "split: attribute 'split_size' is required");
    int64_t split_size = attrs[0].v.i;
    int d = 0;
    em_status st = split_dim("split", t, (int)em__attr_int_or(attrs, 1, 0), &d);
    if (st != EM_OK) return st;
    int64_t size = t->shape[d];
    if (split_size < 0 || (split_size == 0 && size > 0))
        return em_set_error(EM_ERR_INVALID, "split: split_size must be positive (0 only for a "
                            "dim of size 0), got %lld for dim %d of size %lld",
                            (long long)split_size, d, (long long)size);
    int64_t count = split_size == 0 ? 1 : EM_MAX((size + split_size - 1) / split_size, 1);
    if ((st = pieces_fit("split", count, cap, out, n)) != EM_OK || !out) return st;
    return make_pieces(t, d, count, NULL, split_size, out);
}

/* split_sizes(t; sizes, dim) -> one piece per size: variadic outputs. */
static em_status c_split_sizes(const em_op *op, const em_tensor *const *in, int n_in,
                               const em_attr *attrs, em_tensor **out, int cap, int *n) {
    (void)op, (void)n_in;
    const em_tensor *t = in[0];
    bool listed = attrs && attrs[0].type == EM_ATTR_INT_LIST;
    int nsizes = listed ? attrs[0].n : 0;
    const int64_t *sizes = listed ? attrs[0].v.list : NULL;
    int d = 0;
    em_status st = split_dim("split_sizes", t, (int)em__attr_int_or(attrs, 1, 0), &d);
    if (st != EM_OK) return st;
    if (nsizes <= 0 || !sizes || !out)
        return em_set_error(EM_ERR_INVALID, "split_sizes: expects at least one size and an "
                            "output array (got %d sizes)", nsizes);
    int64_t sum = 0;
    for (int i = 0; i < nsizes; i++) {
        if (sizes[i] < 0)
            return em_set_error(EM_ERR_INVALID, "split_sizes: size %d is negative (%lld)", i,
                                (long long)sizes[i]);
        sum += sizes[i];
    }
    if (sum != t->shape[d]) {
        char a[160];
        return em_set_error(EM_ERR_SHAPE, "split_sizes: the sizes %s sum to %lld but dim %d has "
                            "size %lld", em__shape_str(nsizes, sizes, a, sizeof a), (long long)sum,
                            d, (long long)t->shape[d]);
    }
    if ((st = pieces_fit("split_sizes", nsizes, cap, out, n)) != EM_OK) return st;
    return make_pieces(t, d, nsizes, sizes, 0, out);
}

/* chunk(t; chunks, dim) -> pieces: variadic outputs. */
static em_status c_chunk(const em_op *op, const em_tensor *const *in, int n_in,
                         const em_attr *attrs, em_tensor **out, int cap, int *n) {
    (void)op, (void)n_in;
    const em_tensor *t = in[0];
    int chunks = (int)em__attr_int_or(attrs, 0, 0);
    int d = 0;
    em_status st = split_dim("chunk", t, (int)em__attr_int_or(attrs, 1, 0), &d);
    if (st != EM_OK) return st;
    if (chunks <= 0)
        return em_set_error(EM_ERR_INVALID, "chunk: chunks must be positive, got %d", chunks);
    int64_t size = t->shape[d], per = (size + chunks - 1) / chunks;
    /* A dim of size 0 gives `chunks` empty pieces (PyTorch); otherwise split(per), which may
     * give fewer pieces than asked (6 in 4 chunks: 3 pieces of 2). */
    int64_t count = size == 0 ? chunks : (size + per - 1) / per;
    if ((st = pieces_fit("chunk", count, cap, out, n)) != EM_OK || !out) return st;
    return make_pieces(t, d, count, NULL, per, out);
}

/* ---- pad ----------------------------------------------------------------------------------------- */

/* pad with history, one dim at a time: narrow away the negative padding, then cat the
 * padding blocks (filled with value) on both sides. */
static em_tensor *pad_recorded(const em_tensor *t, const int64_t *src_at, const int64_t *len,
                               const int64_t *dst_at, const int64_t *shape, double value) {
    if (em_scope_begin() != EM_OK) return NULL;
    em_device dev = t->storage->device;
    em_tensor *cur = (em_tensor *)t;
    bool fresh = false; /* cur is a new tensor, not a view of t */
    for (int d = 0; d < t->ndim && cur; d++) {
        if (len[d] != t->shape[d]) cur = em_narrow(cur, d, src_at[d], len[d]);
        int64_t after = shape[d] - dst_at[d] - len[d];
        if (!cur || (dst_at[d] == 0 && after == 0)) continue;
        const em_tensor *parts[3];
        int np = 0;
        int64_t bs[EM_MAX_DIMS];
        memcpy(bs, cur->shape, sizeof(int64_t) * (size_t)cur->ndim);
        if (dst_at[d] > 0) {
            bs[d] = dst_at[d];
            parts[np++] = em_full(cur->ndim, bs, value, t->dtype, dev);
        }
        parts[np++] = cur;
        if (after > 0) {
            bs[d] = after;
            parts[np++] = em_full(cur->ndim, bs, value, t->dtype, dev);
        }
        bool ok = true;
        for (int i = 0; i < np; i++) ok &= parts[i] != NULL;
        cur = ok ? em_cat(np, parts, d) : NULL;
        fresh = true;
    }
    /* A pad that only crops (or does nothing) is still a new tensor. */
    if (cur && !fresh) cur = em_clone(cur);
    em__scope_untrack(cur);
    em_scope_end();
    return cur;
}

static em_tensor *pad_impl(const em_tensor *t, int npad, const int64_t *pad, double value) {
    if (npad < 0 || npad % 2 || (npad > 0 && !pad)) {
        em_set_error(EM_ERR_INVALID, "pad: the pad list needs (left, right) pairs, last dim "
                     "first; got %d entries", npad);
        return NULL;
    }
    if (npad / 2 > t->ndim) {
        char a[160];
        em_set_error(EM_ERR_SHAPE, "pad: %d (left, right) pairs for shape %s, which has only %d "
                     "dims", npad / 2, shp(t, a, sizeof a), t->ndim);
        return NULL;
    }
    int64_t shape[EM_MAX_DIMS], src_at[EM_MAX_DIMS], dst_at[EM_MAX_DIMS], len[EM_MAX_DIMS];
    bool copy = true;
    for (int d = 0; d < t->ndim; d++) {
        int p = t->ndim - 1 - d; /* pair index: the last dim comes first */
        int64_t l = p < npad / 2 ? pad[2 * p] : 0, r = p < npad / 2 ? pad[2 * p + 1] : 0;
        shape[d] = t->shape[d] + l + r;
        if (shape[d] < 0) {
            char a[160];
            em_set_error(EM_ERR_SHAPE, "pad: dim %d of shape %s padded by (%lld, %lld) would "
                         "have size %lld", d, shp(t, a, sizeof a), (long long)l, (long long)r,
                         (long long)shape[d]);
            return NULL;
        }
        src_at[d] = l < 0 ? -l : 0;
        dst_at[d] = l > 0 ? l : 0;
        len[d] = t->shape[d] + EM_MIN(l, 0) + EM_MIN(r, 0);
        if (len[d] <= 0) copy = false;
    }
    if (t->requires_grad && em_grad_enabled() && copy)
        return pad_recorded(t, src_at, len, dst_at, shape, value);
    em_tensor *out = em__full(t->ndim, shape, value, t->dtype, t->storage->device);
    if (!out || !copy) return out;
    int64_t so = t->offset, doff = out->offset;
    for (int d = 0; d < t->ndim; d++) {
        so += src_at[d] * t->strides[d];
        doff += dst_at[d] * out->strides[d];
    }
    em_tensor *src = em__tensor_view(t, t->ndim, len, t->strides, so);
    em_tensor *dst = src ? em__tensor_view(out, t->ndim, len, out->strides, doff) : NULL;
    em_status st = dst ? em_copy_(dst, src) : em_last_status();
    em_tensor_release(src);
    em_tensor_release(dst);
    if (st != EM_OK) {
        em_tensor_release(out);
        return NULL;
    }
    return out;
}

/* pad(t; pad (a list of (left, right) pairs, last dim first), value). */
static em_status c_pad(const em_op *op, const em_tensor *const *in, int n_in,
                       const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)op, (void)n_in, (void)cap;
    bool listed = attrs && attrs[0].type == EM_ATTR_INT_LIST;
    double value = attrs && attrs[1].type == EM_ATTR_FLOAT ? attrs[1].v.f : 0;
    return one_out(pad_impl(in[0], listed ? attrs[0].n : 0, listed ? attrs[0].v.list : NULL,
                            value), out, n_out);
}

/* ---- gather, scatter, index_add ------------------------------------------------------------------ */

/* gather(t, index; dim): dim counted from the end when negative. */
static em_tensor *gather_run(const em_tensor *t, int dim, const em_tensor *index) {
    const em_tensor *in[2] = {t, index};
    int d = em__wrap_dim(dim, t->ndim, "gather");
    if (d < 0) return NULL;
    em_attr attr = {.type = EM_ATTR_INT, .v.i = d};
    if (index->numel == 0) { /* PyTorch checks nothing more for an empty index */
        em_tensor *e = em__empty(index->ndim, index->shape, t->dtype, t->storage->device);
        /* No kernel runs, but the result is still a function of t: record gather's node, as
         * the kernel call would, so backward gives t its (zero) gradient. */
        em__node *node = NULL;
        if (e && em__autograd_pre(op_gather, in, 2, &attr, &e, 1, &node) == EM_OK &&
            em__autograd_post(node, &e, 1, true) == EM_OK)
            return e;
        em_tensor_release(e);
        return NULL;
    }
    return em__kernel1(op_gather, in, 2, &attr);
}

/* Run scatter/scatter_add/index_add: into t itself when in place (*out == NULL on entry is
 * out-of-place: *out receives the new tensor). The index is converted to int64 first. */
static em_status index_write(const em_op *op, const char *who, em_tensor *t, int dim,
                             const em_tensor *index, const em_tensor *src, double alpha,
                             bool in_place, em_tensor **out) {
    const em_tensor *in[3] = {t, index, src};
    if (!em__check_inputs(who, in, 3)) return em_last_status();
    int d = em__wrap_dim(dim, t->ndim, who);
    if (d < 0) return em_last_status();
    if (op != op_index_add && index->numel == 0) { /* PyTorch: nothing to check or write */
        if (in_place) return EM_OK;
        *out = em__clone(t);
        return *out ? EM_OK : em_last_status();
    }
    em_tensor *idx = index_i64(who, index, op == op_index_add);
    if (!idx) return em_last_status();
    em_attr attrs[2] = {{.type = EM_ATTR_INT, .v.i = d}, {.type = EM_ATTR_FLOAT, .v.f = alpha}};
    const em_tensor *args[3] = {t, idx, src};
    em_status st;
    if (in_place) {
        em_tensor_meta meta;
        st = em_op_schema_of(op)->infer(op, args, attrs, &meta);
        if (st == EM_OK) st = em_op_call_out(op, args, 3, attrs, &t, 1);
    } else {
        *out = em__kernel1(op, args, 3, attrs);
        st = *out ? EM_OK : em_last_status();
    }
    em_tensor_release(idx);
    return st;
}

/* scatter, scatter_add (t, index, src; dim) and index_add (t, index, source; dim, alpha). */
static em_status c_index_write(const em_op *op, const em_tensor *const *in, int n_in,
                               const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    double alpha = op == op_index_add && attrs && attrs[1].type == EM_ATTR_FLOAT ? attrs[1].v.f
                                                                                 : 1;
    em_tensor *r = NULL;
    em_status st = index_write(op, em_op_name(op), (em_tensor *)in[0], (int)em__attr_int_or(attrs, 0, 0),
                               in[1], in[2], alpha, false, &r);
    *n_out = st == EM_OK;
    out[0] = r;
    return st;
}

/* ---- embedding ------------------------------------------------------------------------------------ */

/* padding_idx normalised to [0, v) or -1 for none. */
static em_status padding_index(const char *who, int64_t padding_idx, int64_t v, int64_t *out) {
    if (padding_idx == EM_PADDING_IDX_NONE) {
        *out = -1;
        return EM_OK;
    }
    if (padding_idx < -v || padding_idx >= v)
        return em_set_error(EM_ERR_RANGE, "%s: padding_idx %lld is out of range for %lld "
                            "embeddings (expected %lld..%lld, or EM_PADDING_IDX_NONE)", who,
                            (long long)padding_idx, (long long)v, (long long)-v,
                            (long long)(v - 1));
    *out = padding_idx < 0 ? padding_idx + v : padding_idx;
    return EM_OK;
}

static em_tensor *embedding_run(const em_tensor *weight, const em_tensor *indices,
                                int64_t padding_idx) {
    int64_t pad = -1;
    if (weight->ndim == 2 &&
        padding_index("embedding", padding_idx, weight->shape[0], &pad) != EM_OK)
        return NULL;
    em_tensor *idx = index_i64("embedding", indices, true);
    if (!idx) return NULL;
    const em_tensor *args[2] = {weight, idx};
    em_attr attr = {.type = EM_ATTR_INT, .v.i = weight->ndim == 2 ? pad : -1};
    em_tensor *r = em__kernel1(op_embedding, args, 2, &attr);
    em_tensor_release(idx);
    return r;
}

static em_tensor *embedding_backward_run(const em_tensor *grad, const em_tensor *indices,
                                         int64_t num_weights, int64_t padding_idx) {
    char a[160], b[160];
    bool fits = grad->ndim == indices->ndim + 1 &&
                memcmp(grad->shape, indices->shape, sizeof(int64_t) * (size_t)indices->ndim) == 0;
    if (!fits) {
        em_set_error(EM_ERR_SHAPE, "embedding_backward: grad shape %s must be the indices' "
                     "shape %s plus the embedding dim", shp(grad, a, sizeof a),
                     shp(indices, b, sizeof b));
        return NULL;
    }
    if (num_weights < 0) {
        em_set_error(EM_ERR_INVALID, "embedding_backward: num_weights must be >= 0, got %lld",
                     (long long)num_weights);
        return NULL;
    }
    int64_t pad;
    if (padding_index("embedding_backward", padding_idx, num_weights, &pad) != EM_OK) return NULL;
    em_tensor *idx = index_i64("embedding_backward", indices, true);
    int64_t n = indices->numel, gs[2] = {n, grad->shape[grad->ndim - 1]};
    em_tensor *i1 = idx ? em__reshape(idx, 1, &n) : NULL;
    em_tensor *g2 = i1 ? em__reshape(grad, 2, gs) : NULL;
    em_tensor *r = NULL;
    if (g2) {
        em_attr attrs[2] = {{.type = EM_ATTR_INT, .v.i = num_weights},
                            {.type = EM_ATTR_INT, .v.i = pad}};
        const em_tensor *args[2] = {g2, i1};
        r = em__kernel1(op_embedding_backward, args, 2, attrs);
    }
    em_tensor_release(g2);
    em_tensor_release(i1);
    em_tensor_release(idx);
    return r;
}

/* gather(t, index; dim), embedding(weight, indices; padding_idx: absent or
 * EM_PADDING_IDX_NONE for none), embedding_backward(grad, indices; num_weights, padding_idx). */
static em_status c_index_read(const em_op *op, const em_tensor *const *in, int n_in,
                              const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    em_tensor *r;
    if (op == op_gather) {
        r = gather_run(in[0], (int)em__attr_int_or(attrs, 0, 0), in[1]);
    } else if (op == op_embedding) {
        r = embedding_run(in[0], in[1], em__attr_int_or(attrs, 0, EM_PADDING_IDX_NONE));
    } else {
        if (!attrs || attrs[0].type != EM_ATTR_INT)
            return em_set_error(EM_ERR_INVALID, "embedding_backward: attribute 'num_weights' is "
                                "required");
        r = embedding_backward_run(in[0], in[1], attrs[0].v.i,
                                   em__attr_int_or(attrs, 1, EM_PADDING_IDX_NONE));
    }
    return one_out(r, out, n_out);
}

/* ---- masked_fill ----------------------------------------------------------------------------------- */

em_tensor *em_masked_fill(const em_tensor *t, const em_tensor *mask, double value) {
    return em__call1(op_masked_fill, 2, EM__IN(t, mask), EM__ATTRS(EM__A_FLOAT(value)));
}

/* In place, the mask broadcast to t's shape (never t to the mask's). */
em_status em_masked_fill_(em_tensor *t, const em_tensor *mask, double value) {
    const em_tensor *in[2] = {t, mask};
    if (!em__check_inputs("masked_fill_", in, 2)) return em_last_status();
    if (mask->dtype != EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "masked_fill_: the mask must be bool, got %s",
                            em_dtype_name(mask->dtype));
    em_tensor *m = em__expand(mask, t->ndim, t->shape);
    if (!m) {
        char a[160], b[160];
        return em_last_status() == EM_ERR_NOMEM
                   ? EM_ERR_NOMEM
                   : em_set_error(EM_ERR_SHAPE, "masked_fill_: mask shape %s does not broadcast "
                                  "to the input's shape %s", shp(mask, a, sizeof a),
                                  shp(t, b, sizeof b));
    }
    em_attr attr = {.type = EM_ATTR_FLOAT, .v.f = value};
    const em_tensor *args[2] = {t, m};
    em_status st = em_op_call_out(op_masked_fill, args, 2, &attr, &t, 1);
    em_tensor_release(m);
    return st;
}

/* ---- one_hot --------------------------------------------------------------------------------------- */

/* one_hot(t; num_classes: -1 or absent infers it as max + 1). */
static em_status c_one_hot(const em_op *op, const em_tensor *const *in, int n_in,
                           const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    const em_tensor *t = in[0];
    int64_t num_classes = em__attr_int_or(attrs, 0, -1);
    if (t->dtype != EM_I64) {
        return em_set_error(EM_ERR_DTYPE, "one_hot: expects an int64 tensor of class indices, "
                            "got %s", em_dtype_name(t->dtype));
    }
    if (num_classes < -1) {
        return em_set_error(EM_ERR_INVALID, "one_hot: num_classes must be -1 (infer it) or >= "
                            "0, got %lld", (long long)num_classes);
    }
    if (num_classes == -1) {
        /* max + 1, read on the host (PyTorch synchronises here too). */
        if (t->numel == 0) {
            return em_set_error(EM_ERR_INVALID, "one_hot: cannot infer num_classes from an "
                                "empty tensor; pass it");
        }
        size_t nb = (size_t)t->numel * sizeof(int64_t);
        int64_t *v = em__malloc(nb, "one_hot");
        if (!v) return EM_ERR_NOMEM;
        em_status st = em_tensor_to_host(t, v, nb);
        int64_t mx = v[0], mn = v[0];
        for (int64_t i = 1; st == EM_OK && i < t->numel; i++) {
            mx = EM_MAX(mx, v[i]);
            mn = EM_MIN(mn, v[i]);
        }
        em__free(v);
        if (st != EM_OK) return st;
        if (mn < 0)
            return em_set_error(EM_ERR_RANGE, "one_hot: class values must be non-negative, got "
                                "%lld", (long long)mn);
        num_classes = mx + 1;
    }
    em_attr attr = {.type = EM_ATTR_INT, .v.i = num_classes};
    return one_out(em__kernel1(op, &t, 1, &attr), out, n_out);
}

/* ---- tril, triu, flip ---------------------------------------------------------------------------- */

/* flip(t; dims): each dim counted from the end when negative, at most once. */
static em_status c_flip(const em_op *op, const em_tensor *const *in, int n_in,
                        const em_attr *attrs, em_tensor **out, int cap, int *n_out) {
    (void)n_in, (void)cap;
    const em_tensor *t = in[0];
    int ndims = attrs && attrs[0].type == EM_ATTR_INTS ? attrs[0].n : 0;
    bool seen[EM_MAX_DIMS] = {false};
    em_attr attr = {.type = EM_ATTR_INTS};
    for (int i = 0; i < ndims; i++) {
        int d = em__wrap_dim((int)attrs[0].ints[i], t->ndim, "flip");
        if (d < 0) return em_last_status();
        if (seen[d])
            return em_set_error(EM_ERR_INVALID, "flip: dim %d appears more than once in the list "
                                "of dims", d);
        seen[d] = true;
    }
    for (int d = 0; d < t->ndim; d++)
        if (seen[d]) attr.ints[attr.n++] = d;
    return one_out(em__kernel1(op, &t, 1, &attr), out, n_out);
}

/* ---- linspace ---------------------------------------------------------------------------------------- */

/* The fill's check on its output (em_op_call_out runs it). */
static em_status prep_linspace(const em_op *op, const em_tensor *const *out, int n_out,
                               const em_attr *attrs, em_dtype *dts) {
    (void)op, (void)n_out, (void)attrs, (void)dts;
    if (out[0]->dtype == EM_BOOL)
        return em_set_error(EM_ERR_DTYPE, "linspace: not defined for bool (as in PyTorch)");
    if (out[0]->ndim != 1)
        return em_set_error(EM_ERR_SHAPE, "linspace: the output must be 1-D");
    return EM_OK;
}

em_tensor *em_linspace(double start, double end, int64_t steps, em_dtype dt, em_device dev) {
    if (steps < 0) {
        em_set_error(EM_ERR_INVALID, "linspace: steps must be non-negative, got %lld",
                     (long long)steps);
        return NULL;
    }
    if (dt == EM_BOOL) { /* before the allocation: the output's check says the same */
        em_set_error(EM_ERR_DTYPE, "linspace: not defined for bool (as in PyTorch)");
        return NULL;
    }
    em_tensor *t = em__empty(1, &steps, dt, dev);
    em_attr attrs[2] = {{.type = EM_ATTR_FLOAT, .v.f = start}, {.type = EM_ATTR_FLOAT, .v.f = end}};
    if (t && em_op_call_out(op_linspace, NULL, 0, attrs, &t, 1) != EM_OK) {
        em_tensor_release(t);
        return NULL;
    }
    return em__scope_track(t);
}

/* ---- public functions of the composites: one line each ------------------------------------------- */

em_tensor *em_cat(int n, const em_tensor *const *tensors, int dim) {
    return em__call1(op_cat, n, tensors, EM__ATTRS(EM__A_INT(dim)));
}
em_tensor *em_stack(int n, const em_tensor *const *tensors, int dim) {
    return em__call1(op_stack, n, tensors, EM__ATTRS(EM__A_INT(dim)));
}
em_status em_split(const em_tensor *t, int64_t split_size, int dim, int cap, em_tensor **out,
                   int *n) {
    int got = 0;
    em_status st = em_op_call_n(op_split, &t, 1, EM__ATTRS(EM__A_INT(split_size), EM__A_INT(dim)),
                                out, out ? cap : 0, &got);
    if (n && (st == EM_OK || st == EM_ERR_RANGE)) *n = got;
    return st;
}
em_status em_split_sizes(const em_tensor *t, int nsizes, const int64_t *sizes, int dim,
                         em_tensor **out) {
    int got;
    return em_op_call_n(op_split_sizes, &t, 1, EM__ATTRS(EM__A_LIST(nsizes, sizes), EM__A_INT(dim)),
                        out, out ? EM_MAX(nsizes, 0) : 0, &got);
}
em_status em_chunk(const em_tensor *t, int chunks, int dim, int cap, em_tensor **out, int *n) {
    int got = 0;
    em_status st = em_op_call_n(op_chunk, &t, 1, EM__ATTRS(EM__A_INT(chunks), EM__A_INT(dim)),
                                out, out ? cap : 0, &got);
    if (n && (st == EM_OK || st == EM_ERR_RANGE)) *n = got;
    return st;
}
em_tensor *em_pad(const em_tensor *t, int npad, const int64_t *pad, double value) {
    return em__call1(op_pad, 1, &t, EM__ATTRS(EM__A_LIST(npad, pad), EM__A_FLOAT(value)));
}
em_tensor *em_gather(const em_tensor *t, int dim, const em_tensor *index) {
    return em__call1(op_gather, 2, EM__IN(t, index), EM__ATTRS(EM__A_INT(dim)));
}
em_tensor *em_scatter(const em_tensor *t, int dim, const em_tensor *index, const em_tensor *src) {
    return em__call1(op_scatter, 3, EM__IN(t, index, src), EM__ATTRS(EM__A_INT(dim)));
}
em_tensor *em_scatter_add(const em_tensor *t, int dim, const em_tensor *index,
                          const em_tensor *src) {
    return em__call1(op_scatter_add, 3, EM__IN(t, index, src), EM__ATTRS(EM__A_INT(dim)));
}
em_tensor *em_index_add(const em_tensor *t, int dim, const em_tensor *index,
                        const em_tensor *source, double alpha) {
    return em__call1(op_index_add, 3, EM__IN(t, index, source),
                     EM__ATTRS(EM__A_INT(dim), EM__A_FLOAT(alpha)));
}
/* The in-place forms run the composites' own code (index_write) into t. */
em_status em_scatter_(em_tensor *t, int dim, const em_tensor *index, const em_tensor *src) {
    return index_write(op_scatter, "scatter_", t, dim, index, src, 0, true, NULL);
}
em_status em_scatter_add_(em_tensor *t, int dim, const em_tensor *index, const em_tensor *src) {
    return index_write(op_scatter_add, "scatter_add_", t, dim, index, src, 0, true, NULL);
}
em_status em_index_add_(em_tensor *t, int dim, const em_tensor *index, const em_tensor *source,
                        double alpha) {
    return index_write(op_index_add, "index_add_", t, dim, index, source, alpha, true, NULL);
}
em_tensor *em_embedding(const em_tensor *weight, const em_tensor *indices, int64_t padding_idx) {
    return em__call1(op_embedding, 2, EM__IN(weight, indices), EM__ATTRS(EM__A_INT(padding_idx)));
}
em_tensor *em_embedding_backward(const em_tensor *grad, const em_tensor *indices,
                                 int64_t num_weights, int64_t padding_idx) {
    return em__call1(op_embedding_backward, 2, EM__IN(grad, indices),
                     EM__ATTRS(EM__A_INT(num_weights), EM__A_INT(padding_idx)));
}
em_tensor *em_one_hot(const em_tensor *t, int64_t num_classes) {
    return em__call1(op_one_hot, 1, &t, EM__ATTRS(EM__A_INT(num_classes)));
}
em_tensor *em_tril(const em_tensor *t, int64_t diagonal) {
    return em__call1(op_tril, 1, &t, EM__ATTRS(EM__A_INT(diagonal)));
}
em_tensor *em_triu(const em_tensor *t, int64_t diagonal) {
    return em__call1(op_triu, 1, &t, EM__ATTRS(EM__A_INT(diagonal)));
}
em_status em_tril_(em_tensor *t, int64_t diagonal) {
    return em__op_inplace(op_tril, t, EM__IN(t), 1, EM__ATTRS(EM__A_INT(diagonal)));
}
em_status em_triu_(em_tensor *t, int64_t diagonal) {
    return em__op_inplace(op_triu, t, EM__IN(t), 1, EM__ATTRS(EM__A_INT(diagonal)));
}
em_tensor *em_flip(const em_tensor *t, int ndims, const int *dims) {
    return em__call1(op_flip, 1, &t, EM__ATTRS(em__attr_ints(ndims, dims)));
}

em_tensor *em_index_select(const em_tensor *a, int dim, const em_tensor *index) {
    return em__call1(op_index_select, 2, EM__IN(a, index), EM__ATTRS(EM__A_INT(dim)));
}
