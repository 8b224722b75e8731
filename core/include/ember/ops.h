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

/* Every reduction below takes dims as em_sum does: ndims dims (negative counts from the end;
 * each at most once), ndims == 0 meaning every dim; keepdim keeps the reduced dims as size 1.
 * Bad dims are EM_ERR_RANGE / EM_ERR_INVALID naming the op and the dim. The CPU backend
 * computes each output element on one thread in a fixed order, so results do not depend on
 * the thread count; f32, f16 and bf16 accumulate in double.
 *
 *     em_tensor *v, *i;
 *     em_max_dim(x, 1, false, &v, &i);                  // (N, C) -> values (N), indices (N)
 *     em_tensor *sd = em_std(x, 1, (const int[]){0}, 1.0, true);   // (N, C) -> (1, C)
 */

/* Largest / smallest element over dims; same dtype as a (every dtype, bool included). NaN
 * propagates: a NaN among the reduced elements gives NaN. A reduced dim of size 0 is
 * EM_ERR_SHAPE ("amax: expected reduction dim 0 to have non-zero size"), as is ndims == 0 on
 * an empty tensor: these ops have no identity. */
EM_API em_tensor *em_amax(const em_tensor *a, int ndims, const int *dims, bool keepdim);
EM_API em_tensor *em_amin(const em_tensor *a, int ndims, const int *dims, bool keepdim);
/* torch.max(a) / torch.min(a): amax / amin over every element, a 0-dim tensor; EM_ERR_SHAPE
 * for an empty a. */
EM_API em_tensor *em_max(const em_tensor *a);
EM_API em_tensor *em_min(const em_tensor *a);
/* torch.max(a, dim) / torch.min(a, dim): *values (a's dtype) and *indices (int64), both new
 * references with dim removed (size 1 when keepdim). The index is the first occurrence of
 * the extreme value; NaN counts as the extreme (the first NaN's index). indices may be NULL
 * (values only). A 0-dim a takes dim 0 or -1. EM_ERR_SHAPE when a's dim has size 0; on any
 * error *values and *indices are set to NULL. */
EM_API em_status em_max_dim(const em_tensor *a, int dim, bool keepdim,
                            em_tensor **values /* out */, em_tensor **indices /* out */);
EM_API em_status em_min_dim(const em_tensor *a, int dim, bool keepdim,
                            em_tensor **values /* out */, em_tensor **indices /* out */);
/* Index (int64) of the first largest / smallest element along *dim, or, when dim is NULL,
 * in the flattened a (a 0-dim result; with keepdim every dim has size 1). NaN counts as the
 * extreme. Every dtype but bool (EM_ERR_DTYPE); EM_ERR_SHAPE on an empty reduction. */
EM_API em_tensor *em_argmax(const em_tensor *a, const int *dim, bool keepdim);
EM_API em_tensor *em_argmin(const em_tensor *a, const int *dim, bool keepdim);

/* Variance over dims: sum (x - mean)^2 / max(0, N - correction), N the number of reduced
 * elements; correction 1 is the unbiased (Bessel) estimate, 0 the population variance. As in
 * PyTorch, N <= correction divides by zero (inf, or NaN when every element is equal, e.g. a
 * single element with correction 1) and N == 0 gives NaN. Floating a only (EM_ERR_DTYPE
 * otherwise); the result has a's dtype. correction must be finite and >= 0 (EM_ERR_INVALID).
 * em_std is its square root. */
EM_API em_tensor *em_var(const em_tensor *a, int ndims, const int *dims, double correction,
                         bool keepdim);
EM_API em_tensor *em_std(const em_tensor *a, int ndims, const int *dims, double correction,
                         bool keepdim);
/* log(sum(exp(x))) over dims, computed as m + log(sum(exp(x - m))) with m the maximum (an
 * infinite m shifts by 0, so all -inf gives -inf and any +inf gives +inf). Integer and bool
 * inputs compute in float32 (as PyTorch does); the sum of zero elements gives -inf. */
EM_API em_tensor *em_logsumexp(const em_tensor *a, int ndims, const int *dims, bool keepdim);
/* Vector p-norm over dims (torch.linalg.vector_norm): p = 2 (Euclidean), 1, INFINITY (max
 * |x|), -INFINITY (min |x|), 0 (count of non-zero elements), or any other p: (sum
 * |x|^p)^(1/p). Floating a only (EM_ERR_DTYPE); the result has a's dtype. The norm of zero
 * elements is 0, except for p = +-inf, which is EM_ERR_SHAPE (no identity). NaN p is
 * EM_ERR_INVALID. */
EM_API em_tensor *em_norm(const em_tensor *a, double p, int ndims, const int *dims,
                          bool keepdim);
/* Product over dims. bool and integer inputs give int64 (wrapping on overflow), as in
 * PyTorch; floating inputs keep their dtype. The product of zero elements is 1. */
EM_API em_tensor *em_prod(const em_tensor *a, int ndims, const int *dims, bool keepdim);
/* Whether every / any element over dims is non-zero (NaN counts as non-zero). Any dtype; the
 * result is bool, except for a uint8 input, which gives uint8 0/1 as in PyTorch. Over zero
 * elements all is true and any false. */
EM_API em_tensor *em_all(const em_tensor *a, int ndims, const int *dims, bool keepdim);
EM_API em_tensor *em_any(const em_tensor *a, int ndims, const int *dims, bool keepdim);

/* (end of reduce) */


/* ---- neural-network ops: conv2d, pooling, batch_norm, layer_norm, softmax, log_softmax ---- */

/* (end of nn) */


/* ---- losses: cross_entropy, nll_loss, mse, l1, smooth_l1, bce_with_logits ---- */

/* (end of loss) */


/* ---- data movement: cat, stack, split, chunk, pad, gather, scatter, index_add, embedding, masked_fill, one_hot, tril, triu, flip, linspace ---- */

/* (end of data) */


/* ---- linear algebra: addmm, linear, bmm, low-precision matmul ---- */

/* (end of linalg) */

#ifdef __cplusplus
}
#endif
#endif /* EMBER_OPS_H */
