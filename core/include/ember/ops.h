/*
 * ember/ops.h — the standard op set, as typed functions.
 *
 * Each function checks its inputs (NULL inputs return NULL without replacing the pending
 * error, so chains are checked once), infers the result's shape and dtype, and dispatches to
 * the kernel registered for the inputs' device and dtype (ember/dispatch.h). Every returned
 * tensor is a new reference. In-place variants end in '_' (em_add_), write into their first
 * argument, bump its version and return EM_OK or an error.
 *
 *     em_tensor *y = em_relu(em_add(em_matmul(x, w), b));   // each temporary in a scope
 *     if (!y) fprintf(stderr, "%s\n", em_last_error());
 *
 * Type promotion follows PyTorch (em_dtype_promote): f32 + f64 is f64, i64 + f32 is f32.
 * Broadcasting follows NumPy: shapes align from the last dim; sizes must be equal or 1.
 */
#ifndef EMBER_OPS_H
#define EMBER_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "ember/export.h"
#include "ember/random.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise, with broadcasting and promotion ---------------------------------------- */

EM_API em_tensor *em_add(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_sub(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_mul(const em_tensor *a, const em_tensor *b);
/* True division: integer inputs give float32, as in PyTorch. */
EM_API em_tensor *em_div(const em_tensor *a, const em_tensor *b);
/* In place: a op= b; b must broadcast to a's shape and the result must be representable in
 * a's dtype (an f32 result into an i64 tensor is EM_ERR_DTYPE, as in PyTorch). */
EM_API em_status em_add_(em_tensor *a, const em_tensor *b);
EM_API em_status em_sub_(em_tensor *a, const em_tensor *b);
EM_API em_status em_mul_(em_tensor *a, const em_tensor *b);
EM_API em_status em_div_(em_tensor *a, const em_tensor *b);

EM_API em_tensor *em_neg(const em_tensor *a);
/* exp and log of integer inputs give float32. */
EM_API em_tensor *em_exp(const em_tensor *a);
EM_API em_tensor *em_log(const em_tensor *a);
EM_API em_tensor *em_relu(const em_tensor *a);
EM_API em_status em_relu_(em_tensor *a);

/* ---- reductions --------------------------------------------------------------------------- */

/* Sum over the listed dims (ndims == 0: over all dims), keeping them as size 1 when keepdim.
 * bool and integer inputs sum to int64, as in PyTorch. f32 sums are blocked and pairwise. */
EM_API em_tensor *em_sum(const em_tensor *a, int ndims, const int *dims, bool keepdim);
/* Mean over dims (floating inputs only; EM_ERR_DTYPE names the dtype otherwise). The mean of
 * zero elements is NaN. */
EM_API em_tensor *em_mean(const em_tensor *a, int ndims, const int *dims, bool keepdim);

/* ---- linear algebra ----------------------------------------------------------------------- */

/* PyTorch's matmul: 1-D x 1-D is a dot product, 2-D x 2-D a matrix product, a 1-D operand is
 * promoted to a matrix and the added dim removed afterwards, and leading (batch) dims
 * broadcast. Floating dtypes only; both operands must have the same dtype. */
EM_API em_tensor *em_matmul(const em_tensor *a, const em_tensor *b);

/* ---- creation and data movement ----------------------------------------------------------- */

/* Set every element to value (converted to t's dtype). */
EM_API em_status em_fill_(em_tensor *t, double value);
/* [start, end) in steps of step, as a 1-D tensor of dtype dt on dev. */
EM_API em_tensor *em_arange(double start, double end, double step, em_dtype dt, em_device dev);
/* A COPY of the entries of a along dim picked by a 1-D int64 (or int32) index with values in
 * [0, size) (as in PyTorch, negative indices are an error, not counted from the end); unlike
 * basic indexing (em_select, em_slice) the result does not share storage with a. */
EM_API em_tensor *em_index_select(const em_tensor *a, int dim, const em_tensor *index);

/* ---- random fills (ember/random.h defines the streams) ----------------------------------- */

/* Fill floating t from gen (NULL: the default generator, em_seed()). Uniform on [lo, hi). */
EM_API em_status em_uniform_(em_tensor *t, double lo, double hi, em_generator *gen);
EM_API em_status em_normal_(em_tensor *t, double mean, double std, em_generator *gen);
/* 1 with probability p, else 0 (any dtype). */
EM_API em_status em_bernoulli_(em_tensor *t, double p, em_generator *gen);


/* ---- elementwise math: more unary and binary ops, comparisons, logical ops, where, clamp, scalar variants ---- */

/* (end of math) */


/* ---- reductions: max, min, argmax, argmin, var, std, logsumexp, norm, prod ---- */

/* (end of reduce) */


/* ---- neural-network ops: conv2d, pooling, batch_norm, layer_norm, softmax, log_softmax ---- */

/* (end of nn) */


/* ---- losses: cross_entropy, nll_loss, mse, l1, smooth_l1, bce_with_logits ---- */

/* (end of loss) */


/* ---- data movement: cat, stack, split, chunk, pad, gather, scatter, index_add, embedding, masked_fill, one_hot, tril, triu, flip, linspace ---- */

/* Joining and splitting. em_cat and em_stack return a new contiguous tensor (a copy) of the
 * inputs' promoted dtype (PyTorch's result_type over all of them); em_split, em_split_sizes
 * and em_chunk return VIEWS of t (writing through one changes t).
 *
 *     em_tensor *parts[3];
 *     int n;
 *     em_chunk(x, 3, 0, 3, parts, &n);          // x (7, 4) -> parts (3, 4), (3, 4), (1, 4)
 *     em_tensor *y = em_cat(n, (const em_tensor *const *)parts, 0);   // (7, 4) again
 */

/* Concatenate n >= 1 tensors along dim (negative counts from the end). All tensors must be on
 * one device and have the same number of dims and the same sizes except along dim; the
 * error names the first tensor at fault and both shapes ("cat: tensor 2 has shape [4, 5] but
 * tensor 0 has [4, 3]; all dims except dim 1 must match"). As in PyTorch, 1-D tensors of size
 * 0 are skipped by the shape checks (legacy rule: cat([empty(0), x]) is x) but still take
 * part in the dtype promotion; 0-dim tensors are an error. EM_ERR_INVALID for n <= 0. */
EM_API em_tensor *em_cat(int n, const em_tensor *const *tensors, int dim);
/* Join n >= 1 tensors of the same shape along a new dim (in [-ndim-1, ndim]): the result has
 * shape (..., n, ...). Unsqueeze + cat; errors name the first tensor whose shape differs. */
EM_API em_tensor *em_stack(int n, const em_tensor *const *tensors, int dim);
/* Split t along dim into pieces of split_size elements (the last one smaller when the size is
 * not a multiple; one piece when split_size exceeds it; split_size 0 only for a dim of size
 * 0, giving one empty piece). *n (may be NULL) receives the number of pieces. out may be NULL
 * to ask for the count only; otherwise it has room for `cap` tensors and receives *n new
 * references (views of t, tracked by the open scope like every returned tensor), which the
 * caller releases one by one. EM_ERR_RANGE when cap is too small; on any error nothing is
 * written to out. t must have at least one dim. */
EM_API em_status em_split(const em_tensor *t, int64_t split_size, int dim, int cap,
                          em_tensor **out /* out */, int *n /* out */);
/* Split t along dim into nsizes pieces of the given sizes (non-negative, summing to the
 * size of dim; the error names both). out has room for nsizes views (new references). */
EM_API em_status em_split_sizes(const em_tensor *t, int nsizes, const int64_t *sizes, int dim,
                                em_tensor **out /* out */);
/* PyTorch's chunk: split(ceil(size / chunks)), which can give FEWER than `chunks` pieces
 * (a dim of 6 in 4 chunks gives 3 pieces of 2); a dim of size 0 gives `chunks` empty pieces.
 * out, cap and n as for em_split. chunks must be positive. */
EM_API em_status em_chunk(const em_tensor *t, int chunks, int dim, int cap,
                          em_tensor **out /* out */, int *n /* out */);

/* Constant padding like torch.nn.functional.pad(t, pad, value=value): pad holds npad (even)
 * entries, (left, right) pairs starting from the LAST dim: {1, 2} pads the last dim with 1
 * element before and 2 after; {0, 0, 3, 3} pads the second-to-last by 3 on each side.
 * Negative entries crop. A new tensor of t's dtype (value converted to it); npad == 0 is a
 * copy. EM_ERR_INVALID for an odd npad; EM_ERR_SHAPE for more pairs than dims, or a dim that
 * would get a negative size (a size of 0 is allowed). */
EM_API em_tensor *em_pad(const em_tensor *t, int npad, const int64_t *pad, double value);

/* Gather and scatter along dim with an int64 index of the same number of dims as t
 * (PyTorch's rules; a 0-dim tensor counts as 1-D of size 1):
 *   gather:      out[i][j][k] = t[i][index[i][j][k]][k]                (dim 1); out has
 *                index's shape and t's dtype; index.size(d) <= t.size(d) for d != dim.
 *   scatter:     out = t; out[i][index[i][j][k]][k] = src[i][j][k]
 *   scatter_add: out = t; out[i][index[i][j][k]][k] += src[i][j][k]
 *                src has t's dtype and ndim; index.size(d) <= src.size(d) for every d and
 *                <= t.size(d) for d != dim; only the first index.size(d) entries of src are
 *                read. An empty index checks nothing and changes nothing (as in PyTorch).
 * Index values must lie in [0, t.size(dim)) — negative values are an error, not counted from
 * the end — else EM_ERR_RANGE naming the value and the size; the in-place forms then leave t
 * unchanged. All dtypes; scatter_add on bool is a logical or.
 * Order and determinism: when several positions hit one element, scatter keeps the value of
 * the last position along dim and scatter_add sums in that order (ascending position along
 * dim) — the strictly sequential order, in every mode: the CPU backend gives each thread a
 * disjoint set of output elements, so results are bitwise identical for every thread count
 * and em_deterministic() changes nothing. (PyTorch documents scatter with duplicate indices
 * as unspecified; Ember's answer is the sequential one.) */
EM_API em_tensor *em_gather(const em_tensor *t, int dim, const em_tensor *index);
EM_API em_tensor *em_scatter(const em_tensor *t, int dim, const em_tensor *index,
                             const em_tensor *src);
EM_API em_status em_scatter_(em_tensor *t, int dim, const em_tensor *index,
                             const em_tensor *src);
EM_API em_tensor *em_scatter_add(const em_tensor *t, int dim, const em_tensor *index,
                                 const em_tensor *src);
EM_API em_status em_scatter_add_(em_tensor *t, int dim, const em_tensor *index,
                                 const em_tensor *src);
/* out = t; for each i in order: out.select(dim, index[i]) += alpha * source.select(dim, i).
 * index is 1-D (or 0-dim) int64 or int32 with values in [0, t.size(dim)) (EM_ERR_RANGE
 * otherwise, t unchanged); source has t's dtype and ndim, index.numel() entries along dim and
 * t's sizes elsewhere (errors name both shapes). alpha is converted to the dtype (truncated
 * for integers, as in PyTorch). Same ordering and determinism as scatter_add. */
EM_API em_tensor *em_index_add(const em_tensor *t, int dim, const em_tensor *index,
                               const em_tensor *source, double alpha);
EM_API em_status em_index_add_(em_tensor *t, int dim, const em_tensor *index,
                               const em_tensor *source, double alpha);

/* "No padding index" for em_embedding and em_embedding_backward (PyTorch's None). */
#define EM_PADDING_IDX_NONE INT64_MIN
/* Look up rows of weight (V, D) (any dtype): indices of any shape, int64 or int32, give a
 * new tensor (*indices.shape, D). An index outside [0, V) is EM_ERR_RANGE naming it and V.
 * padding_idx (EM_PADDING_IDX_NONE, or in [-V, V), negative counts from the end) does not
 * change the forward result; it is checked here and matters to the backward. */
EM_API em_tensor *em_embedding(const em_tensor *weight, const em_tensor *indices,
                               int64_t padding_idx);
/* The dense gradient of the weight: grad (*indices.shape, D) floating, gives (num_weights, D)
 * of grad's dtype = zeros, then row indices[i] += grad[i] for every i in order (index_add
 * semantics, deterministic as scatter_add), with the padding_idx row left zero. */
EM_API em_tensor *em_embedding_backward(const em_tensor *grad, const em_tensor *indices,
                                        int64_t num_weights, int64_t padding_idx);

/* mask ? value : t, with a bool mask (EM_ERR_DTYPE otherwise) broadcast against t (the result
 * has the broadcast shape and t's dtype; value converted to it). In place: the mask must
 * broadcast to t's shape. All dtypes. */
EM_API em_tensor *em_masked_fill(const em_tensor *t, const em_tensor *mask, double value);
EM_API em_status em_masked_fill_(em_tensor *t, const em_tensor *mask, double value);

/* One-hot encoding: int64 class indices of any shape give an int64 tensor (*t.shape, C), 1
 * at each index. num_classes -1 infers C = max + 1 (reading t on the host; an empty t is then
 * EM_ERR_INVALID). Values outside [0, C) are EM_ERR_RANGE. */
EM_API em_tensor *em_one_hot(const em_tensor *t, int64_t num_classes);

/* Lower / upper triangle of the matrices in the last two dims (batched over the others):
 * elements (i, j) with j - i <= diagonal (tril) or j - i >= diagonal (triu) are kept, the
 * others are 0. t needs at least 2 dims. All dtypes. In-place forms write into t. */
EM_API em_tensor *em_tril(const em_tensor *t, int64_t diagonal);
EM_API em_tensor *em_triu(const em_tensor *t, int64_t diagonal);
EM_API em_status em_tril_(em_tensor *t, int64_t diagonal);
EM_API em_status em_triu_(em_tensor *t, int64_t diagonal);

/* A copy of t reversed along each of the ndims listed dims (unique; EM_ERR_INVALID names a
 * repeated one). All dtypes. */
EM_API em_tensor *em_flip(const em_tensor *t, int ndims, const int *dims);

/* steps evenly spaced values from start to end inclusive, as a 1-D tensor of dtype dt on dev
 * (steps >= 0; one step gives [start]). Values: step = (end - start) / (steps - 1); element i
 * is start + i * step in the first half and end - (steps - 1 - i) * step in the second, so
 * both ends are exact. Floating dtypes compute in their own precision (f16/bf16 in float,
 * rounded once); integer dtypes convert start and end to the dtype first and truncate each
 * value (as PyTorch). bool is EM_ERR_DTYPE. */
EM_API em_tensor *em_linspace(double start, double end, int64_t steps, em_dtype dt,
                              em_device dev);

/* (end of data) */


/* ---- linear algebra: addmm, linear, bmm, low-precision matmul ---- */

/* (end of linalg) */

#ifdef __cplusplus
}
#endif
#endif /* EMBER_OPS_H */
