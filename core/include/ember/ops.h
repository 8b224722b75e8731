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

/* How a loss reduces over its elements (PyTorch's Reduction enum, same values): NONE keeps
 * one loss per element (per sample for the class losses), MEAN averages (see each loss for
 * what it divides by; the mean of nothing is NaN), SUM adds. */
typedef enum em_reduction {
    EM_REDUCTION_NONE = 0,
    EM_REDUCTION_MEAN = 1,
    EM_REDUCTION_SUM = 2,
} em_reduction;
/* Parse PyTorch's string form: "none", "mean" or "sum". EM_ERR_INVALID otherwise. */
EM_API em_status em_reduction_parse(const char *name, em_reduction *out /* out */);

/* Losses. Conventions shared by all of them:
 *   - The loss has the input's dtype; f16 and bf16 compute in f32, sums accumulate in double.
 *   - reduction NONE returns the per-element (per-sample) loss, MEAN and SUM a 0-dim tensor.
 *   - Optional tensors (weight, pos_weight) may be NULL: none.
 *   - Each *_backward returns the gradient with respect to `input` (input's shape and dtype)
 *     given `grad`, the gradient of the loss: 0-dim (any one-element tensor) for MEAN/SUM,
 *     the loss's shape for NONE. Gradients for targets are not computed (for mse, l1 and
 *     smooth_l1 the target's gradient is the negated input gradient).
 *   - Any layout (strided, transposed, broadcast views) and zero-size tensors are accepted.
 * Errors: EM_ERR_SHAPE and EM_ERR_DTYPE name the op and the shapes/dtypes at fault;
 * EM_ERR_INVALID for a bad reduction, label_smoothing or beta; EM_ERR_RANGE for a class index
 * out of range. */

/* PyTorch's cross_entropy: log_softmax over the class dim fused with the negative
 * log-likelihood.
 *   input   (N, C, d1, ...) or (C): unnormalised logits, floating; the class dim is 1 (0 for
 *           a 1-D input).
 *   target  either int64 class indices of shape (N, d1, ...) (() for a 1-D input), each in
 *           [0, C) or equal to ignore_index; or floating class probabilities of input's shape
 *           (promoted with input to their common dtype).
 *   weight  (C) per-class weights of input's dtype, or NULL.
 *   label_smoothing in [0, 1]: mixes the target with the uniform distribution over C classes.
 * Class indices: loss_i = -(1 - ls) w[t_i] log p_i[t_i] - (ls / C) sum_c w[c] log p_i[c] (0
 * where t_i == ignore_index, the default being -100); MEAN divides the sum by the sum of
 * w[t_i] over the samples not ignored (their count when weight is NULL), so with every target
 * ignored the mean is NaN. Probabilities: loss_i = -sum_c w[c] y'_ic log p_ic with
 * y' = (1 - ls) y + ls / C; MEAN divides by the number of samples N * d1 * ... .
 * Errors: "cross_entropy: target batch size 16 does not match input batch size 32 ...",
 * target dtype (EM_ERR_DTYPE, naming it), a class index outside [0, C) (EM_ERR_RANGE, naming
 * the index and C), a weight not of shape (C). Logits of +-1e4 give finite results. */
EM_API em_tensor *em_cross_entropy(const em_tensor *input, const em_tensor *target,
                                   const em_tensor *weight, em_reduction reduction,
                                   int64_t ignore_index, double label_smoothing);
EM_API em_tensor *em_cross_entropy_backward(const em_tensor *grad, const em_tensor *input,
                                            const em_tensor *target, const em_tensor *weight,
                                            em_reduction reduction, int64_t ignore_index,
                                            double label_smoothing);

/* PyTorch's nll_loss: input (N, C, d1, ...) or (C) holds log-probabilities; target, weight,
 * ignore_index and the reductions as for em_cross_entropy with class indices (no smoothing):
 * loss_i = -w[t_i] input[i, t_i]. */
EM_API em_tensor *em_nll_loss(const em_tensor *input, const em_tensor *target,
                              const em_tensor *weight, em_reduction reduction,
                              int64_t ignore_index);
EM_API em_tensor *em_nll_loss_backward(const em_tensor *grad, const em_tensor *input,
                                       const em_tensor *target, const em_tensor *weight,
                                       em_reduction reduction, int64_t ignore_index);

/* Regression losses: input and target broadcast together and promote to their (floating)
 * result type; MEAN divides by the number of elements of the broadcast shape.
 *   mse_loss:       (x - y)^2
 *   l1_loss:        |x - y|                      (gradient 0 where x == y)
 *   smooth_l1_loss: |d| < beta ? 0.5 d^2 / beta : |d| - 0.5 beta, d = x - y; beta >= 0
 *                   (EM_ERR_INVALID otherwise). beta == 0 is l1_loss, except that its
 *                   gradient where x == y is -grad, PyTorch's choice. */
EM_API em_tensor *em_mse_loss(const em_tensor *input, const em_tensor *target,
                              em_reduction reduction);
EM_API em_tensor *em_mse_loss_backward(const em_tensor *grad, const em_tensor *input,
                                       const em_tensor *target, em_reduction reduction);
EM_API em_tensor *em_l1_loss(const em_tensor *input, const em_tensor *target,
                             em_reduction reduction);
EM_API em_tensor *em_l1_loss_backward(const em_tensor *grad, const em_tensor *input,
                                      const em_tensor *target, em_reduction reduction);
EM_API em_tensor *em_smooth_l1_loss(const em_tensor *input, const em_tensor *target,
                                    em_reduction reduction, double beta);
EM_API em_tensor *em_smooth_l1_loss_backward(const em_tensor *grad, const em_tensor *input,
                                             const em_tensor *target, em_reduction reduction,
                                             double beta);

/* PyTorch's binary_cross_entropy_with_logits, in the numerically stable form:
 *   loss = w * ((1 - y) x + (1 + (pw - 1) y) (log(e^-m + e^(-x-m)) + m)),  m = max(-x, 0)
 *   input (any shape) logits, target of the same shape (floating, probabilities), weight and
 *   pos_weight (or NULL) broadcast to input's shape — a (C) pos_weight applies per class along
 *   the last dim, as in PyTorch. All promote to their common floating dtype. MEAN divides by
 *   input's element count. Logits of +-1e4 give finite results. */
EM_API em_tensor *em_binary_cross_entropy_with_logits(const em_tensor *input,
                                                      const em_tensor *target,
                                                      const em_tensor *weight,
                                                      const em_tensor *pos_weight,
                                                      em_reduction reduction);
EM_API em_tensor *em_binary_cross_entropy_with_logits_backward(
    const em_tensor *grad, const em_tensor *input, const em_tensor *target,
    const em_tensor *weight, const em_tensor *pos_weight, em_reduction reduction);

/* (end of loss) */


/* ---- data movement: cat, stack, split, chunk, pad, gather, scatter, index_add, embedding, masked_fill, one_hot, tril, triu, flip, linspace ---- */

/* (end of data) */


/* ---- linear algebra: addmm, linear, bmm, low-precision matmul ---- */

/* (end of linalg) */

#ifdef __cplusplus
}
#endif
#endif /* EMBER_OPS_H */
