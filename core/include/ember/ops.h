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

/* (end of data) */


/* ---- linear algebra: addmm, linear, bmm, low-precision matmul ---- */

/* Linear algebra runs in the operands' dtype: f32, f64, bf16 or f16, all operands the same
 * (EM_ERR_DTYPE names the dtypes otherwise, and integer operands). bf16 and f16 accumulate in
 * f32 and round the result once (the CPU backend runs bf16 natively through oneDNN where the
 * CPU has bf16 instructions, f16 through f32). Transposed operands (em_tensor_transpose views)
 * are multiplied as they are, without copies. em_matmul (above) takes bf16 and f16 as well. */

/* Batched matrix product: a (B, M, K) x b (B, K, N) -> (B, M, N), as PyTorch's bmm (no
 * broadcasting of B: use em_matmul for that). EM_ERR_SHAPE names both shapes when they are
 * not 3-D or B or K differ. */
EM_API em_tensor *em_bmm(const em_tensor *a, const em_tensor *b);

/* beta * bias + alpha * (a @ b), as PyTorch's addmm(bias, a, b, beta=beta, alpha=alpha):
 * a (M, K), b (K, N), bias broadcastable to (M, N) (typically (N,) or (M, N)) -> (M, N).
 * beta == 0 ignores bias (its NaN and inf do not propagate). K == 0 gives beta * bias.
 * EM_ERR_SHAPE names both shapes when a and b do not multiply, and the bias and product
 * shapes when the bias does not broadcast. */
EM_API em_tensor *em_addmm(const em_tensor *bias, const em_tensor *a, const em_tensor *b,
                           double beta, double alpha);

/* A fully connected layer, as PyTorch's linear: x (..., in) times weight (out, in)
 * transposed, plus bias (out) -> (..., out). bias may be NULL: no bias (a NULL from an earlier
 * failed call is taken as "no bias" too, so check such a bias first). The leading dims of x
 * are flattened into one GEMM (a view when x's layout allows; a copy otherwise) and the
 * weight is multiplied transposed in place, never copied. EM_ERR_SHAPE names the input and
 * weight shapes when in differs or the weight is not 2-D, and the bias shape when it is not
 * (out). */
EM_API em_tensor *em_linear(const em_tensor *x, const em_tensor *weight, const em_tensor *bias);

/* (end of linalg) */

#ifdef __cplusplus
}
#endif
#endif /* EMBER_OPS_H */
