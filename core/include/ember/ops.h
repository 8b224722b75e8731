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
 *
 * Each function is one line over the op's schema (ember/dispatch.h): its checks, dtype rules
 * and composite parts live there, so em_op_call(em_op_find("clamp"), ...) with the function's
 * arguments as attributes is the same op (tests/test_op_schema checks it for every op). The
 * attributes by name are the function's arguments, in order (see each op's schema for names;
 * a NULL pointer argument is an absent attribute). Ops whose outputs vary in number (split,
 * chunk) run by name with em_op_call_n; the fills (arange, uniform_, ...) with em_op_call_out
 * into the tensor to write, taking the generator's seed and offset as attributes.
 *
 * Adding an op (the recipe; docs/adding-an-op.md has the details and what it touched):
 *   1. its schema and derivative in its family's core file (core/ops_<family>.c): a policy
 *      flag or a prepare hook for the dtype rule and the checks, an inference, the
 *      derivative, and the typed function as one line;
 *   2. its CPU kernel in one plugin file (plugins/backend-cpu/cpu_<family>.c);
 *   3. one declaration here;
 *   4. its rows in the op-case table (core/op_cases.c); make check fails without them.
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
/* A random permutation of 0 .. n-1 (PyTorch's randperm): a new 1-D tensor of dtype dt (EM_I64,
 * the index dtype, or EM_I32) on dev, drawn from gen (NULL: the default generator) by the
 * shuffle ember/random.h defines, so every backend gives the same permutation for the same
 * generator state. EM_ERR_INVALID for n < 0 or n > 2^32 (or above 2^31 for i32), EM_ERR_DTYPE
 * for other dtypes. */
EM_API em_tensor *em_randperm(int64_t n, em_dtype dt, em_device dev, em_generator *gen);


/* ---- elementwise math: more unary and binary ops, comparisons, logical ops, where, clamp, scalar variants ---- */

/*
 * Scalars. The *_scalar functions take the number as a double and treat it as PyTorch treats
 * a Python number: a value with no fractional part (|v| < 2^63) counts as an int, any other
 * (a fraction, an infinity, NaN) as a float. A number never widens a tensor of its own
 * category: an f16 tensor times 2.5 stays f16 (computed in float, the number rounded to float
 * once), an int32 tensor plus 3 stays int32 (integers wrap, the number truncated to the
 * tensor's width like a C cast: int32 * 2^40 is 0). A float number makes an integer or bool
 * tensor float32; an int number makes a bool tensor int64. int64 numbers beyond 2^53 are not
 * exact (they pass through a double).
 *
 * In-place variants (ending in '_') write into their argument, bump its version and return
 * EM_OK; when the result dtype differs from the argument's (sigmoid_ of an int64 tensor,
 * add_scalar_(int_tensor, 2.5)) they fail with EM_ERR_DTYPE "result type float32 can't be
 * cast to the desired output type int64", as in PyTorch.
 */

/* |x|, sign(x) in {-1, 0, 1} (sign(NaN) is 0, as in PyTorch). Same dtype as a; abs of a bool
 * tensor is EM_ERR_DTYPE; abs of the most negative int32/int64 wraps to itself; sign of a
 * bool tensor is the tensor itself. */
EM_API em_tensor *em_abs(const em_tensor *a);
EM_API em_status em_abs_(em_tensor *a);
EM_API em_tensor *em_sign(const em_tensor *a);
EM_API em_status em_sign_(em_tensor *a);
/* sqrt(x), 1/sqrt(x), 1/x, 1/(1+exp(-x)), tanh(x), log(1+x), exp(x)-1, elementwise, same
 * shape. Integer and bool inputs give float32 (1/0 is inf); f16/bf16 compute in float. */
EM_API em_tensor *em_sqrt(const em_tensor *a);
EM_API em_tensor *em_rsqrt(const em_tensor *a);
EM_API em_tensor *em_reciprocal(const em_tensor *a);
EM_API em_tensor *em_sigmoid(const em_tensor *a);
EM_API em_tensor *em_tanh(const em_tensor *a);
EM_API em_tensor *em_log1p(const em_tensor *a);
EM_API em_tensor *em_expm1(const em_tensor *a);
EM_API em_status em_sqrt_(em_tensor *a);
EM_API em_status em_rsqrt_(em_tensor *a);
EM_API em_status em_reciprocal_(em_tensor *a);
EM_API em_status em_sigmoid_(em_tensor *a);
EM_API em_status em_tanh_(em_tensor *a);
EM_API em_status em_log1p_(em_tensor *a);
EM_API em_status em_expm1_(em_tensor *a);

/* Activations of floating tensors (other dtypes: EM_ERR_DTYPE, as in PyTorch).
 * gelu: x * Phi(x) with approximate NULL or "none" (erf), or "tanh":
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); any other string is EM_ERR_INVALID.
 * silu: x * sigmoid(x). leaky_relu: x > 0 ? x : x * negative_slope (PyTorch's default slope
 * is 0.01). */
/* The error function erf(x) = 2 / sqrt(pi) int_0^x exp(-t^2) dt and its inverse on [-1, 1]
 * (erfinv(+-1) = +-inf, NaN outside), elementwise. Integer and bool inputs give float32;
 * f16/bf16 compute in float. Differentiable. */
EM_API em_tensor *em_erf(const em_tensor *a);
EM_API em_tensor *em_erfinv(const em_tensor *a);
EM_API em_tensor *em_gelu(const em_tensor *a, const char *approximate);
EM_API em_tensor *em_silu(const em_tensor *a);
EM_API em_status em_silu_(em_tensor *a);
EM_API em_tensor *em_leaky_relu(const em_tensor *a, double negative_slope);
EM_API em_status em_leaky_relu_(em_tensor *a, double negative_slope);

/* Clamp into [*min, *max]; either bound may be NULL (absent), not both (EM_ERR_INVALID).
 * Bounds are numbers (see Scalars): clamp of an int tensor to 1.5 gives float32. min > max
 * gives max everywhere; a NaN element stays NaN; a single NaN bound is ignored; two bounds of
 * which one is NaN give NaN everywhere (PyTorch's behaviour). */
EM_API em_tensor *em_clamp(const em_tensor *a, const double *min, const double *max);
EM_API em_status em_clamp_(em_tensor *a, const double *min, const double *max);

/* a + v, a - v, a * v, a / v for a number v (see Scalars). div_scalar is true division:
 * integer and bool tensors give float32. */
EM_API em_tensor *em_add_scalar(const em_tensor *a, double v);
EM_API em_tensor *em_sub_scalar(const em_tensor *a, double v);
EM_API em_tensor *em_mul_scalar(const em_tensor *a, double v);
EM_API em_tensor *em_div_scalar(const em_tensor *a, double v);
EM_API em_status em_add_scalar_(em_tensor *a, double v);
EM_API em_status em_sub_scalar_(em_tensor *a, double v);
EM_API em_status em_mul_scalar_(em_tensor *a, double v);
EM_API em_status em_div_scalar_(em_tensor *a, double v);

/* a ** exponent for a number exponent (see Scalars): an integer tensor to an int power stays
 * integer (wrapping), to a float power gives float32; an integer tensor to a negative int
 * power is EM_ERR_INVALID, as in PyTorch. Exponents 0.5 and -0.5 are sqrt and rsqrt
 * (pow(-0, 0.5) is -0, pow(-inf, 0.5) NaN, as in PyTorch). */
EM_API em_tensor *em_pow_scalar(const em_tensor *a, double exponent);
/* a ** b, max(a, b), min(a, b) elementwise with broadcasting and promotion, like em_add.
 * maximum and minimum propagate NaN. Integer pow with a negative exponent gives 0 unless the
 * base is 1 or -1; pow of two bool tensors is EM_ERR_DTYPE. Shapes that do not broadcast are
 * EM_ERR_SHAPE naming both shapes. */
EM_API em_tensor *em_pow(const em_tensor *a, const em_tensor *b);
/* PyTorch's div(a, b, rounding_mode): rounding_mode NULL is true division (em_div: integers
 * give float32); "trunc" rounds the quotient toward zero, "floor" toward -inf (for floats as
 * PyTorch does it, through fmod: a == b * floor_divide(a, b) + remainder(a, b)). With a
 * rounding mode the inputs are promoted (PyTorch's rules) and integers divide as integers:
 * a zero integer divisor is EM_ERR_INVALID ("integer division by zero"), the most negative
 * value over -1 wraps; two bool tensors are EM_ERR_DTYPE; another mode is EM_ERR_INVALID.
 * Broadcasts like em_add. The derivative of a rounded quotient is zero (as in PyTorch). */
EM_API em_tensor *em_div_mode(const em_tensor *a, const em_tensor *b, const char *rounding_mode);
/* em_div_mode(a, b, "floor"): PyTorch's floor_divide. */
EM_API em_tensor *em_floor_divide(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_maximum(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_minimum(const em_tensor *a, const em_tensor *b);

/* Comparisons a == b, a != b, a < b, a <= b, a > b, a >= b: bool results, operands promoted
 * (int64 vs float32 compares in float32, as in PyTorch) and broadcast. NaN compares unequal
 * to everything. For a number, compare with em_scalar(v, dt) (a 0-dim tensor). */
EM_API em_tensor *em_eq(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_ne(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_lt(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_le(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_gt(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_ge(const em_tensor *a, const em_tensor *b);

/* Logical ops on the truth of each element (non-zero is true, NaN is true), any dtypes, with
 * broadcasting; bool results. */
EM_API em_tensor *em_logical_and(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_logical_or(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_logical_xor(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_logical_not(const em_tensor *a);

/* cond ? a : b elementwise. cond must be bool (EM_ERR_DTYPE otherwise); a and b are promoted
 * like em_add's operands; all three broadcast together (EM_ERR_SHAPE names the three
 * shapes). */
EM_API em_tensor *em_where(const em_tensor *cond, const em_tensor *a, const em_tensor *b);

/* Backward helpers (the gradients autograd needs), all with promotion and broadcasting of
 * the two operands, floating only (EM_ERR_DTYPE otherwise):
 *   threshold_backward(grad, x, t) = x <= t ? 0 : grad      (relu's: t = 0)
 *   sigmoid_backward(grad, y)      = grad * (1 - y) * y     (y = sigmoid(x), the output)
 *   tanh_backward(grad, y)         = grad * (1 - y * y)     (y = tanh(x), the output)
 *   gelu_backward(grad, x, approximate)  = grad * gelu'(x)  (approximate as in em_gelu)
 *   silu_backward(grad, x)         = grad * s * (1 + x * (1 - s)), s = sigmoid(x)
 *   leaky_relu_backward(grad, x, slope) = x > 0 ? grad : grad * slope */
EM_API em_tensor *em_threshold_backward(const em_tensor *grad, const em_tensor *x,
                                        double threshold);
EM_API em_tensor *em_sigmoid_backward(const em_tensor *grad, const em_tensor *y);
EM_API em_tensor *em_tanh_backward(const em_tensor *grad, const em_tensor *y);
EM_API em_tensor *em_gelu_backward(const em_tensor *grad, const em_tensor *x,
                                   const char *approximate);
EM_API em_tensor *em_silu_backward(const em_tensor *grad, const em_tensor *x);
EM_API em_tensor *em_leaky_relu_backward(const em_tensor *grad, const em_tensor *x,
                                         double negative_slope);

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


/* ---- neural-network ops: conv2d, pooling, batch_norm, layer_norm, softmax, log_softmax,
 *      conv1d, conv_transpose2d, group_norm, scaled_dot_product_attention, lstm, gru ---- */

/* Common rules of the neural-network ops. Tensors are NCHW like PyTorch; inputs may have any
 * strides (they are made contiguous first). Floating dtypes only (EM_ERR_DTYPE otherwise):
 * f32 and f64 compute natively. bf16 runs in bf16 where the backend has a kernel for it (the
 * CPU: oneDNN, accumulating in f32, and its own max_pool2d; empty inputs and the few shapes
 * oneDNN lacks fall back to f32); otherwise, and always for f16, the op computes in f32 and
 * rounds the main result back once. The norms compute their per-channel tensors in f32 for
 * f16/bf16 inputs: saved statistics (and grad_weight, grad_bias when weight is NULL) are f32;
 * weight, bias and running statistics may have any floating dtype and are updated in f32 and
 * stored back in their own. The other inputs of one call share one dtype. Pair arguments
 * (stride, padding, ...) are (H, W) arrays; NULL means the default stated. Shape errors
 * (EM_ERR_SHAPE) name the shapes at fault. Multi-output functions return EM_OK or an error
 * and store new references into the non-NULL out-pointers (NULL ones are skipped); like every
 * result they go to the innermost scope. The *_backward functions are the gradients autograd
 * uses; they are ordinary ops too. */

/* 2-D cross-correlation (PyTorch's conv2d). input (N, C, H, W), weight (O, C/groups, kH, kW),
 * bias (O) or NULL. stride NULL: 1, padding NULL: 0 (zero padding on both sides), dilation
 * NULL: 1, groups >= 1 dividing C and O. Result (N, O, OH, OW) with
 * OH = (H + 2 padding - dilation (kH - 1) - 1) / stride + 1. Errors: channel mismatch and a
 * kernel larger than the padded input (EM_ERR_SHAPE, naming both shapes). */
EM_API em_tensor *em_conv2d(const em_tensor *input, const em_tensor *weight,
                            const em_tensor *bias, const int64_t stride[2],
                            const int64_t padding[2], const int64_t dilation[2], int64_t groups);
/* relu(conv2d(input, weight, bias, ...)) as one op, conv2d_relu: arguments, defaults and
 * errors as em_conv2d's (naming conv2d_relu). The fused op a Conv2d layer with activation
 * relu calls: on the CPU, f32 runs oneDNN's convolution, then relu in place over its output
 * (the bits of em_conv2d then em_relu, NaN and -inf included) with no second tensor; other
 * dtypes and devices run conv2d then relu.
 * Its gradient masks the output grad with the output (y > 0), then is conv2d's. */
EM_API em_tensor *em_conv2d_relu(const em_tensor *input, const em_tensor *weight,
                                 const em_tensor *bias, const int64_t stride[2],
                                 const int64_t padding[2], const int64_t dilation[2],
                                 int64_t groups);
/* Gradient of conv2d with respect to its input: grad_output (N, O, OH, OW), weight
 * (O, C/groups, kH, kW), input_size (H, W) of the forward's input (required: with stride > 1
 * several sizes give the same output). Result (N, C, H, W). */
EM_API em_tensor *em_conv2d_backward_data(const em_tensor *grad_output, const em_tensor *weight,
                                          const int64_t input_size[2], const int64_t stride[2],
                                          const int64_t padding[2], const int64_t dilation[2],
                                          int64_t groups);
/* Gradients of conv2d with respect to weight and bias: input (N, C, H, W), grad_output
 * (N, O, OH, OW), kernel_size (kH, kW) required. grad_weight (O, C/groups, kH, kW), grad_bias
 * (O) = grad_output summed over N, OH, OW (either out-pointer may be NULL). */
EM_API em_status em_conv2d_backward_weight(const em_tensor *input, const em_tensor *grad_output,
                                           const int64_t kernel_size[2], const int64_t stride[2],
                                           const int64_t padding[2], const int64_t dilation[2],
                                           int64_t groups, em_tensor **grad_weight /* out */,
                                           em_tensor **grad_bias /* out */);

/* 2-D max pooling of input (N, C, H, W): out (N, C, OH, OW) and indices (same shape, int64,
 * PyTorch's flat h * W + w position of the maximum in its input plane; a NaN is the maximum).
 * kernel_size required; stride NULL: kernel_size; padding NULL: 0 (at most half the kernel;
 * padded positions never win); dilation NULL: 1. ceil_mode rounds the output size up (the
 * last window must start inside the input or the left padding). */
EM_API em_status em_max_pool2d(const em_tensor *input, const int64_t kernel_size[2],
                               const int64_t stride[2], const int64_t padding[2],
                               const int64_t dilation[2], bool ceil_mode,
                               em_tensor **out /* out */, em_tensor **indices /* out */);
/* max_pool2d(relu(input), ...) as one op, max_pool2d_relu: arguments, defaults, outputs and
 * errors as em_max_pool2d's (naming max_pool2d_relu). The fused op a MaxPool2d layer with
 * activation relu calls: the window is pooled over relu's values (x <= 0 gives +0, NaN is
 * kept), so out and indices are bitwise em_relu then em_max_pool2d's — a window whose
 * inputs are all <= 0 gives +0 at its first position, not at the maximum of the input. On the
 * CPU f32 and f64 evaluate relu inside the pooling loops (channels-last and nChw16c inputs
 * too, the outputs keeping the layout); other dtypes and devices run relu then max_pool2d.
 * Its gradient masks the output grad with out (out > 0), then is max_pool2d's: no pass over
 * the full-size input in either direction. */
EM_API em_status em_max_pool2d_relu(const em_tensor *input, const int64_t kernel_size[2],
                                    const int64_t stride[2], const int64_t padding[2],
                                    const int64_t dilation[2], bool ceil_mode,
                                    em_tensor **out /* out */, em_tensor **indices /* out */);
/* Gradient of max_pool2d: grad_output scattered (summed) to the positions in indices of an
 * input of input_size (H, W); result (N, C, H, W). */
EM_API em_tensor *em_max_pool2d_backward(const em_tensor *grad_output, const em_tensor *indices,
                                         const int64_t input_size[2]);
/* 2-D average pooling, arguments as em_max_pool2d (no dilation). count_include_pad counts the
 * zero padding in the divisor (windows clipped to the padded input, as PyTorch). */
EM_API em_tensor *em_avg_pool2d(const em_tensor *input, const int64_t kernel_size[2],
                                const int64_t stride[2], const int64_t padding[2],
                                bool ceil_mode, bool count_include_pad);
/* Gradient of avg_pool2d for an input of input_size (H, W); the other arguments are the
 * forward's. Result (N, C, H, W). */
EM_API em_tensor *em_avg_pool2d_backward(const em_tensor *grad_output,
                                         const int64_t input_size[2],
                                         const int64_t kernel_size[2], const int64_t stride[2],
                                         const int64_t padding[2], bool ceil_mode,
                                         bool count_include_pad);
/* Adaptive average pooling of input (N, C, H, W) to output_size (OH, OW): output cell o of n
 * over an input size s averages [floor(o s / n), ceil((o + 1) s / n)). C, H, W must be
 * non-zero. */
EM_API em_tensor *em_adaptive_avg_pool2d(const em_tensor *input, const int64_t output_size[2]);
/* Gradient of adaptive_avg_pool2d for an input of input_size (H, W). */
EM_API em_tensor *em_adaptive_avg_pool2d_backward(const em_tensor *grad_output,
                                                  const int64_t input_size[2]);

/* Batch normalisation over dims 0, 2, 3, ... of input (N, C, ...). weight, bias (C) or NULL
 * (1 and 0). training: normalise by the batch's mean and biased variance; running_mean and
 * running_var (C) (may be NULL) are updated IN PLACE: r = (1 - momentum) r + momentum s, with
 * the unbiased variance, as PyTorch; more than one value per channel is required. Not
 * training: normalise by the running statistics (required). save_mean and save_invstd (C) are
 * what em_batch_norm_backward needs: the batch's mean and 1/sqrt(var + eps), or in
 * evaluation the running mean and 1/sqrt(running_var + eps). */
EM_API em_status em_batch_norm(const em_tensor *input, const em_tensor *weight,
                               const em_tensor *bias, em_tensor *running_mean,
                               em_tensor *running_var, bool training, double momentum,
                               double eps, em_tensor **out /* out */,
                               em_tensor **save_mean /* out */, em_tensor **save_invstd /* out */);
/* Gradients of batch_norm: grad_output and input (N, C, ...), weight (C) or NULL, and the
 * forward's save_mean, save_invstd; training as in the forward (evaluation treats the
 * statistics as constants). grad_input (N, C, ...), grad_weight and grad_bias (C). */
EM_API em_status em_batch_norm_backward(const em_tensor *grad_output, const em_tensor *input,
                                        const em_tensor *weight, const em_tensor *save_mean,
                                        const em_tensor *save_invstd, bool training,
                                        em_tensor **grad_input /* out */,
                                        em_tensor **grad_weight /* out */,
                                        em_tensor **grad_bias /* out */);
/* Layer normalisation over the last normalized_ndim dims of input, which must equal
 * normalized_shape. weight, bias of normalized_shape or NULL. mean and rstd (1/sqrt(biased
 * var + eps)) have input's shape with 1 on the normalised dims. */
EM_API em_status em_layer_norm(const em_tensor *input, int normalized_ndim,
                               const int64_t *normalized_shape, const em_tensor *weight,
                               const em_tensor *bias, double eps, em_tensor **out /* out */,
                               em_tensor **mean /* out */, em_tensor **rstd /* out */);
/* Gradients of layer_norm from the forward's mean and rstd; grad_weight and grad_bias have
 * normalized_shape (computed even when weight is NULL). */
EM_API em_status em_layer_norm_backward(const em_tensor *grad_output, const em_tensor *input,
                                        const em_tensor *mean, const em_tensor *rstd,
                                        const em_tensor *weight, int normalized_ndim,
                                        em_tensor **grad_input /* out */,
                                        em_tensor **grad_weight /* out */,
                                        em_tensor **grad_bias /* out */);

/* Softmax and log-softmax along dim (negative counts from the end), computed with the maximum
 * subtracted (no overflow). A 0-dim input is a 1-element row. */
/* Functional dropout (PyTorch's F.dropout): in training, y = x * mask / (1 - p) with mask a
 * bool tensor of x's shape, true with probability 1 - p, drawn from gen (NULL: the default
 * generator; ember/random.h's bernoulli stream, so every backend draws the same mask);
 * p == 1 gives zeros. Outside training (or p == 0) y is x (a new reference to it). mask
 * (may be NULL) receives the mask, a new reference. Floating x; p outside [0, 1] is
 * EM_ERR_INVALID. Differentiable: the grad is the grad times mask / (1 - p). By name the op
 * "dropout" takes p, training, and the stream's seed and offset as attributes. */
EM_API em_tensor *em_dropout(const em_tensor *x, double p, bool training, em_generator *gen,
                             em_tensor **mask /* out, may be NULL */);
EM_API em_tensor *em_softmax(const em_tensor *input, int dim);
EM_API em_tensor *em_log_softmax(const em_tensor *input, int dim);
/* Gradients from the forward's output y: softmax: y (g - sum(g y)); log_softmax:
 * g - exp(y) sum(g), sums along dim. */
EM_API em_tensor *em_softmax_backward(const em_tensor *grad_output, const em_tensor *output,
                                      int dim);
EM_API em_tensor *em_log_softmax_backward(const em_tensor *grad_output, const em_tensor *output,
                                          int dim);

/* 1-D cross-correlation (PyTorch's conv1d): input (N, C, L), weight (O, C/groups, K), bias
 * (O) or NULL; stride and dilation >= 1, padding >= 0 (zeros on both sides), groups >= 1
 * dividing C and O. Result (N, O, OL) with OL = (L + 2 padding - dilation (K - 1) - 1) /
 * stride + 1. Computed as conv2d over a (1, L) plane (so the same kernels, oneDNN included,
 * and conv2d's derivative). Errors as em_conv2d's, naming conv1d. */
EM_API em_tensor *em_conv1d(const em_tensor *input, const em_tensor *weight,
                            const em_tensor *bias, int64_t stride, int64_t padding,
                            int64_t dilation, int64_t groups);
/* 2-D transposed convolution (PyTorch's conv_transpose2d; the gradient of conv2d with
 * respect to its input): input (N, C, H, W), weight (C, O/groups, kH, kW), bias (O) or NULL.
 * Arguments in PyTorch's order; NULL pairs: stride 1, padding 0, output_padding 0, dilation 1.
 * Result (N, O, OH, OW) with OH = (H - 1) stride - 2 padding + dilation (kH - 1) +
 * output_padding + 1. output_padding must be smaller than stride (EM_ERR_INVALID; PyTorch
 * also allows it below dilation). Runs conv2d_backward_data (which is differentiable: its
 * derivative is conv2d and conv2d_backward_weight). Errors: channel mismatch (EM_ERR_SHAPE),
 * an output size below 1 (EM_ERR_SHAPE). */
EM_API em_tensor *em_conv_transpose2d(const em_tensor *input, const em_tensor *weight,
                                      const em_tensor *bias, const int64_t stride[2],
                                      const int64_t padding[2],
                                      const int64_t output_padding[2], int64_t groups,
                                      const int64_t dilation[2]);
/* Group normalisation (PyTorch's F.group_norm): input (N, C, *) split into num_groups groups
 * of C / num_groups channels, each (sample, group) normalised by its mean and biased
 * variance, then scaled and shifted per channel by weight and bias (C) or NULL (1 and 0).
 * num_groups must divide C (EM_ERR_INVALID); eps > 0 usually 1e-5. Computed as layer_norm
 * over each group (its kernels and derivative) and a broadcast multiply-add. */
EM_API em_tensor *em_group_norm(const em_tensor *input, int64_t num_groups,
                                const em_tensor *weight, const em_tensor *bias, double eps);

/* Scaled dot-product attention (PyTorch's F.scaled_dot_product_attention):
 *     out = dropout(softmax(query key^T * scale + mask)) value
 * query (..., L, E), key (..., S, E), value (..., S, Ev); the leading (batch, head) dims of
 * the three must be equal (no broadcasting). Result (..., L, Ev) in query's dtype.
 *   attn_mask   NULL, or a tensor broadcastable to (..., L, S) (NumPy rules; fewer dims are
 *               aligned from the right):
 *                 bool: TRUE MEANS "ATTEND" (the key is used), false masks it out — as in
 *                 PyTorch's F.scaled_dot_product_attention. (MultiheadAttention's
 *                 key_padding_mask, like PyTorch's, has the opposite sense: true = ignore.)
 *                 floating: added to the scaled scores (-inf masks out).
 *   is_causal   query i attends to keys j <= i only (top-left aligned: PyTorch's
 *               tril(ones(L, S))). Unlike PyTorch it may be combined with attn_mask: both
 *               apply.
 *   dropout_p   in [0, 1]: the probabilities are dropped with probability dropout_p and the
 *               rest scaled by 1 / (1 - dropout_p) (the row sums are taken before dropout).
 *               There is no training flag, as in PyTorch: pass 0 in evaluation. The mask
 *               is drawn from gen (NULL: the default generator) only when dropout_p > 0:
 *               element (b, i, j) of the flattened (B, L, S) score tensor is kept when
 *               ember/random.h's bernoulli stream at (seed, offset) gives true with
 *               probability 1 - dropout_p — the same mask em_dropout would draw for a
 *               (B, L, S) tensor from the same generator state.
 *   scale       NULL: 1 / sqrt(E) (1 when E is 0).
 * A query whose keys are all masked out gets a zero output row and zero gradients (as PyTorch 2.x;
 * softmax over nothing is taken as nothing). The CPU kernel is fused: the forward holds one row
 * block of scores (128 query rows, 64 when causal, fewer for very long keys; every key) per
 * thread, its products done by OpenBLAS; the backward recomputes the scores from logsumexp,
 * holding two such blocks per thread. The full (L, S) matrix never exists. Differentiable in query, key and value; a
 * floating attn_mask gets no gradient (a mask that requires grad is an error at backward: detach
 * it). Errors: EM_ERR_SHAPE for mismatched dims or a mask that does not broadcast (naming the
 * shapes), EM_ERR_DTYPE for non-floating q/k/v, a dtype mismatch among them, or a mask neither bool
 * nor floating, EM_ERR_INVALID for dropout_p outside [0, 1].
 * By name, the op "scaled_dot_product_attention" takes the attributes
 * dropout_p, is_causal, scale (absent: the default), seed and offset (the dropout stream;
 * required when dropout_p > 0), and returns (out, logsumexp).
 *   logsumexp   (may be NULL) receives a new reference to (..., L), in f64 for f64 inputs
 *               and f32 otherwise: each row's log-sum-exp of the scaled, masked scores (-inf
 *               for a row with every key masked), which the backward needs. It carries no
 *               gradient (backpropagating into it is an error). */
EM_API em_tensor *em_scaled_dot_product_attention(const em_tensor *query, const em_tensor *key,
                                                  const em_tensor *value,
                                                  const em_tensor *attn_mask, double dropout_p,
                                                  bool is_causal, const double *scale,
                                                  em_generator *gen,
                                                  em_tensor **logsumexp /* out, may be NULL */);
/* Gradients of scaled_dot_product_attention with respect to query, key and value, from the
 * forward's arguments and its logsumexp, with the dropout stream's (seed, offset) the forward
 * used (dropout_state; ignored when dropout_p is 0). Shapes as the forward's; any out-pointer
 * may be NULL. */
EM_API em_status em_scaled_dot_product_attention_backward(
    const em_tensor *grad_output, const em_tensor *query, const em_tensor *key,
    const em_tensor *value, const em_tensor *attn_mask, const em_tensor *logsumexp,
    double dropout_p, bool is_causal, const double *scale,
    em_rng_state dropout_state, em_tensor **grad_query /* out */,
    em_tensor **grad_key /* out */, em_tensor **grad_value /* out */);

/* Fused LSTM over a whole sequence: one layer, one direction (PyTorch's nn.LSTM gates):
 *     i = sigmoid(W_ii x + W_hi h + b_i)   f = sigmoid(W_if x + W_hf h + b_f)
 *     g = tanh(W_ig x + W_hg h + b_g)      o = sigmoid(W_io x + W_ho h + b_o)
 *     c' = f c + i g                       h' = o tanh(c')
 * input (T, N, I) time first; hx, cx (N, H) or NULL (zeros); weight (4H, I + H): PyTorch's
 * weight_ih (4H, I) and weight_hh (4H, H) catenated along dim 1, rows in gate order i, f, g,
 * o; bias (4H) or NULL: b_ih + b_hh (the LSTM only ever uses their sum); lengths NULL or
 * int64 (N) in [0, T]: step t of sequence b is taken when t < lengths[b], an untaken step
 * keeps the state and outputs zeros (PyTorch's packed sequences: h_n is each sequence's own
 * last state). reverse: the steps run from T - 1 down to 0 (a bidirectional layer's second
 * direction; output t stays at position t). Returns the output (T, N, H) (the h of every
 * step); h_n, c_n (N, H) and workspace (may be NULL) receive new references: the final
 * states, and the saved activations the backward needs ((T, N, 6H), in f64 for f64 and f32
 * otherwise; it carries no gradient). Differentiable in input, hx, cx, weight and bias.
 * Errors: EM_ERR_SHAPE naming the operand and the expected shape, EM_ERR_DTYPE for
 * non-floating or mixed dtypes or non-int64 lengths, EM_ERR_INVALID for lengths outside
 * [0, T] (naming the entry). The CPU kernel runs the input projection of every step as one
 * GEMM and each step's hidden product as another. */
EM_API em_tensor *em_lstm(const em_tensor *input, const em_tensor *hx, const em_tensor *cx,
                          const em_tensor *weight, const em_tensor *bias,
                          const em_tensor *lengths, bool reverse, em_tensor **h_n /* out */,
                          em_tensor **c_n /* out */, em_tensor **workspace /* out */);
/* The recurrence of em_lstm's gradient: from the gradients of its output (T, N, H), h_n and
 * c_n (N, H) (any may be NULL: zeros), its weight, workspace, lengths and direction, the
 * gradients of the gates' pre-activations grad_gates (T, N, 4H) (zero on untaken steps) and
 * of hx and cx (N, H). The input, weight and bias gradients follow with one GEMM each
 * (lstm's derivative composes them). Any out-pointer may be NULL. */
EM_API em_status em_lstm_backward(const em_tensor *grad_output, const em_tensor *grad_hn,
                                  const em_tensor *grad_cn, const em_tensor *weight,
                                  const em_tensor *workspace, const em_tensor *lengths,
                                  bool reverse, em_tensor **grad_gates /* out */,
                                  em_tensor **grad_hx /* out */, em_tensor **grad_cx /* out */);
/* Fused GRU over a whole sequence, one layer, one direction (PyTorch's nn.GRU; the reset
 * gate is applied after the hidden product: oneDNN's linear-before-reset GRU):
 *     r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)   z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
 *     n = tanh(W_in x + b_in + r (W_hn h + b_hn))  h' = (1 - z) n + z h
 * weight (3H, I + H): weight_ih (3H, I) and weight_hh (3H, H) catenated along dim 1, rows in
 * gate order r, z, n; bias_ih, bias_hh (3H) or NULL (zeros). Everything else as em_lstm's;
 * the workspace is (T, N, 5H). */
EM_API em_tensor *em_gru(const em_tensor *input, const em_tensor *hx, const em_tensor *weight,
                         const em_tensor *bias_ih, const em_tensor *bias_hh,
                         const em_tensor *lengths, bool reverse, em_tensor **h_n /* out */,
                         em_tensor **workspace /* out */);
/* The recurrence of em_gru's gradient: the pre-activation gradients of the input side
 * (grad_gates_input (T, N, 3H): r, z, n) and of the hidden side (grad_gates_hidden: r, z,
 * and n times r, which is what W_hn h + b_hn receives), and hx's gradient (N, H).
 * grad_output and grad_hn may be NULL (zeros); any out-pointer may be NULL. */
EM_API em_status em_gru_backward(const em_tensor *grad_output, const em_tensor *grad_hn,
                                 const em_tensor *weight, const em_tensor *workspace,
                                 const em_tensor *lengths, bool reverse,
                                 em_tensor **grad_gates_input /* out */,
                                 em_tensor **grad_gates_hidden /* out */,
                                 em_tensor **grad_hx /* out */);

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
