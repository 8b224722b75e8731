/*
 * ops_nn.c — the standard op set, neural-network ops: conv2d, pooling, batch_norm,
 * layer_norm, softmax, log_softmax and their backward helpers: schemas, shape/dtype inference,
 * derivatives (through the backward helpers) and the typed public functions of ember/ops.h.
 *
 * The public functions make every input contiguous, so the kernels see dense row-major
 * (NCHW) tensors — except channels-last activations on the CPU (em_tensor_is_channels_last):
 * conv2d's input, conv2d_backward_data's grad_output, conv2d_backward_weight's input and
 * grad_output, max_pool2d's input and max_pool2d_backward's grad_output and indices are then
 * passed as they are, and conv2d, conv2d_backward_data, max_pool2d and its backward
 * (EM_OP_CHANNELS_LAST) give their outputs that layout; a kernel that does not read it
 * declines the call in supports() and the call is made again on contiguous copies, whose
 * 4-dim results are then made channels-last (keep_layout: the layout does not depend on
 * which kernel ran; docs/performance.md, design (b)). max_pool2d_backward's outputs take its
 * indices' layout (the schema's layout_arg): the grad a flatten's backward gives is row-major
 * and the CPU kernel reads it in place beside channels-last indices. f32 and f64 run in their own dtype. f16 and bf16 run in their own dtype
 * when the device's backend registers a kernel of the op for that dtype and the kernel
 * accepts the call; otherwise — no kernel for the dtype, or every kernel's supports()
 * declined (the dispatcher reports that as EM_ERR_NOKERNEL before it runs or records
 * anything, and the call is then retried) — the inputs are converted to f32, the op computes
 * in f32 and the main result is rounded back once. One mechanism, so a backend without
 * reduced-precision kernels keeps working unchanged. On the CPU, bf16 runs natively (oneDNN
 * for conv2d, average pooling, the norms and softmax, accumulating in f32; our own loop for
 * max_pool2d) except on operands oneDNN declines (empty ones, average-pooling divisors it
 * lacks), which take the f32 path; f16 always takes the f32 path (oneDNN 2.6 has no f16
 * primitives on CPUs without AVX512-FP16). The norms' per-channel and per-row tensors
 * (weight, bias, running and saved statistics, and the grads of weight and bias) are in the
 * statistics dtype S: f64 for f64 inputs, f32 for every other dtype — oneDNN's interface,
 * PyTorch's mixed-precision practice, and the statistics keep their precision; the public
 * functions convert a caller's weight and running statistics to S and the grads back.
 * Optional inputs (bias, weight, running statistics) are passed as 0-element tensors of the
 * kernel dtype (S for the norms) when absent ("none"): the dispatcher requires non-NULL
 * inputs and one op per function is simpler than a variant per combination.
 *
 * Kernel contracts (every input contiguous and of the output's floating dtype unless stated;
 * S as above; every attribute present — the infer functions reject missing ones; INTS attrs
 * hold 2 values (H, W)):
 *   conv2d(x (N,C,H,W), w (O,C/g,kH,kW), b (O) or (0)) -> y (N,O,OH,OW)
 *       attrs: stride, padding, dilation (ints), groups (int). OH = (H + 2pH - dH(kH-1) - 1)
 *       / sH + 1. Zero padding, cross-correlation (PyTorch's conv2d).
 *   conv2d_relu(x, w, b) -> y    relu(conv2d(x, w, b)), attrs and checks as conv2d's: the fused
 *       op (docs/performance.md, "Design: fused ops"). Its composite runs the op's own kernel
 *       where the device registers one for the call's dtype that accepts the call (no f32
 *       conversion of an f16/bf16 call) and otherwise composes conv2d and relu, so a backend without the kernel runs it unchanged. Derivative: relu's mask
 *       on the saved output (relu_backward(gy, y)), then conv2d's.
 *   conv2d_backward_data(gy (N,O,OH,OW), w (O,C/g,kH,kW)) -> gx (N,C,H,W)
 *       attrs: stride, padding, dilation, groups, input_size (ints: H, W).
 *   conv2d_backward_weight(x (N,C,H,W), gy (N,O,OH,OW)) -> gw (O,C/g,kH,kW), gb (O)
 *       attrs: stride, padding, dilation, groups, kernel_size (ints: kH, kW).
 *   max_pool2d(x (N,C,H,W)) -> y (N,C,OH,OW), idx (N,C,OH,OW) int64
 *       attrs: kernel_size, stride, padding, dilation (ints), ceil_mode (bool). idx is
 *       PyTorch's flat h*W+w position in the input plane; NaN wins the max.
 *   max_pool2d_relu(x (N,C,H,W)) -> y, idx    max_pool2d(relu(x)), attrs and checks as
 *       max_pool2d's: the second fused op (docs/performance.md, "Design: fused ops"). The
 *       window's values are relu's (x <= 0 ? +0 : x, NaN kept), evaluated per element inside
 *       the pooling, so a window whose x are all <= 0 gives +0 at its first position (the tie
 *       rule), not the argmax of x. Its composite as conv2d_relu's: the op's own kernel where
 *       the device registers one for the call's dtype, otherwise relu then max_pool2d.
 *       Derivative: relu's mask on the pooled output (relu_backward(gy, y)), then
 *       max_pool2d's scatter: at a window's winner relu's output is the pooled value, so this
 *       is relu's mask on the scattered grad, taken on the pooled quarter of the elements.
 *   max_pool2d_backward(gy (N,C,OH,OW), idx int64) -> gx (N,C,H,W)
 *       attrs: input_size (ints). gx[idx] += gy (zero elsewhere).
 *   avg_pool2d(x) -> y    attrs: kernel_size, stride, padding (ints), ceil_mode,
 *       count_include_pad (bools). Divisors as PyTorch (windows clipped to the padded input).
 *   avg_pool2d_backward(gy) -> gx   same attrs + input_size.
 *   adaptive_avg_pool2d(x) -> y     attrs: output_size (ints). Window o of n over size s:
 *       [floor(o*s/n), ceil((o+1)*s/n)).
 *   adaptive_avg_pool2d_backward(gy) -> gx   attrs: input_size.
 *   batch_norm(x (N,C,*), w (C)|(0), b (C)|(0), running_mean (C)|(0), running_var (C)|(0))
 *       -> y (N,C,*), save_mean (C), save_invstd (C)     w, b, running and saved stats in S.
 *       attrs: training (bool), momentum, eps (floats). Training: batch statistics (biased
 *       variance for y), running stats (when given) updated IN PLACE: r = (1-m) r + m s with
 *       the unbiased variance. Eval: running stats used (required); save_mean/save_invstd
 *       are then running_mean and 1/sqrt(running_var + eps).
 *   batch_norm_backward(gy (N,C,*), x, w (C)|(0), save_mean (C), save_invstd (C))
 *       -> gx (N,C,*), gw (C), gb (C)      attrs: training (bool). w, stats, gw, gb in S.
 *   layer_norm(x (..., D...), w (D...)|(0), b (D...)|(0)) -> y, mean, rstd   w, b, mean,
 *       rstd in S.
 *       attrs: normalized_ndim (int k >= 1), eps. mean/rstd have x's shape with 1 on the
 *       last k dims.
 *   layer_norm_backward(gy, x, mean, rstd, w (D...)|(0)) -> gx, gw (D...), gb (D...)
 *       attrs: normalized_ndim. mean, rstd, w, gw, gb in S.
 *   softmax / log_softmax(x) -> y          attrs: dim (int, normalised). Max-subtracted.
 *   softmax_backward(gy, y) -> gx          gx = y * (gy - sum(gy * y))      attrs: dim.
 *   log_softmax_backward(gy, y) -> gx      gx = gy - exp(y) * sum(gy)       attrs: dim.
 */
#include <math.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

static const em_op *op_conv2d, *op_conv2d_bwd_data, *op_conv2d_bwd_weight, *op_max_pool2d,
    *op_max_pool2d_bwd, *op_avg_pool2d, *op_avg_pool2d_bwd, *op_adaptive_avg_pool2d,
    *op_adaptive_avg_pool2d_bwd, *op_batch_norm, *op_batch_norm_bwd, *op_layer_norm,
    *op_layer_norm_bwd, *op_softmax, *op_log_softmax, *op_softmax_bwd, *op_log_softmax_bwd,
    *op_dropout, *op_bernoulli, *op_mul, *op_div_scalar, *op_conv1d, *op_conv_transpose2d,
    *op_group_norm, *op_conv2d_relu, *op_relu_bwd, *op_max_pool2d_relu;

/* ---- shared checks ---------------------------------------------------------------------------- */

#define SHAPE(t, buf) em__shape_str((t)->ndim, (t)->shape, buf, sizeof buf)

/* Every attribute of the schema is present (INTS with 2 values): kernels read them as is. */
static em_status check_attrs_present(const em_op *op, const em_attr *attrs) {
    const em_op_schema *s = em_op_schema_of(op);
    for (int i = 0; i < s->n_attrs; i++) {
        /* layer_norm's normalized_shape is its composite's check, not the kernel's. */
        if (strcmp(s->attr_names[i], "normalized_shape") == 0) continue;
        if (!attrs || attrs[i].type != s->attr_types[i] ||
            (s->attr_types[i] == EM_ATTR_INTS && attrs[i].n != 2))
            return em_set_error(EM_ERR_INVALID, "%s: attribute '%s' is required%s",
                                em_op_name(op), s->attr_names[i],
                                s->attr_types[i] == EM_ATTR_INTS ? " (2 ints: H, W)" : "");
    }
    return EM_OK;
}

/* All of in[0..n) share in[0]'s floating dtype. */
static em_status check_same_float(const em_op *op, const em_tensor *const *in, int n) {
    for (int i = 0; i < n; i++)
        if (!em_dtype_is_floating(in[i]->dtype) || in[i]->dtype != in[0]->dtype)
            return em_set_error(EM_ERR_DTYPE, "%s: input %d has dtype %s; expected %s like "
                                "input 0 (a floating dtype)", em_op_name(op), i,
                                em_dtype_name(in[i]->dtype), em_dtype_name(in[0]->dtype));
    return EM_OK;
}

/* The dtype the ops compute in when a call is converted, and the norms' statistics dtype S:
 * f64 for f64, f32 for every other floating dtype. */
static em_dtype compute_dtype(em_dtype dt) { return dt == EM_F64 ? EM_F64 : EM_F32; }

/* in[first..first+n) have the statistics dtype S of in[0]'s (floating) dtype. */
static em_status check_stats(const em_op *op, const em_tensor *const *in, int first, int n) {
    em_dtype sd = compute_dtype(in[0]->dtype);
    for (int i = first; i < first + n; i++)
        if (in[i]->dtype != sd)
            return em_set_error(EM_ERR_DTYPE, "%s: input %d (%s) has dtype %s; expected %s, the "
                                "statistics dtype of a %s input", em_op_name(op), i,
                                em_op_schema_of(op)->input_names[i], em_dtype_name(in[i]->dtype),
                                em_dtype_name(sd), em_dtype_name(in[0]->dtype));
    return EM_OK;
}

static em_status check_4d(const em_op *op, const char *what, const em_tensor *t) {
    char b[160];
    if (t->ndim != 4)
        return em_set_error(EM_ERR_SHAPE, "%s: expected a 4-D (N, C, H, W) %s, got shape %s",
                            em_op_name(op), what, SHAPE(t, b));
    return EM_OK;
}

static void meta4(em_tensor_meta *m, em_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d) {
    *m = (em_tensor_meta){.dtype = dt, .ndim = 4, .shape = {a, b, c, d}};
}

static void meta_like(em_tensor_meta *m, const em_tensor *t, em_dtype dt) {
    m->dtype = dt;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
}

/* ---- convolution ------------------------------------------------------------------------------ */

/* Output size of a convolution along one dim; < 1 when the kernel does not fit. */
static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

/* stride > 0, padding >= 0, dilation > 0, groups > 0, and the (dilated) kernel fits in the
 * padded input. x and w give the shapes for messages. */
static em_status conv_check(const em_op *op, const em_attr *a, int64_t H, int64_t W, int64_t kh,
                            int64_t kw, const em_tensor *x, const em_tensor *w) {
    char b1[160], b2[160];
    for (int i = 0; i < 2; i++)
        if (a[0].ints[i] <= 0 || a[1].ints[i] < 0 || a[2].ints[i] <= 0)
            return em_set_error(EM_ERR_INVALID, "%s: stride (%lld, %lld) and dilation (%lld, "
                                "%lld) must be positive and padding (%lld, %lld) non-negative",
                                em_op_name(op), (long long)a[0].ints[0], (long long)a[0].ints[1],
                                (long long)a[2].ints[0], (long long)a[2].ints[1],
                                (long long)a[1].ints[0], (long long)a[1].ints[1]);
    if (a[3].v.i <= 0)
        return em_set_error(EM_ERR_INVALID, "%s: groups must be positive, got %lld",
                            em_op_name(op), (long long)a[3].v.i);
    int64_t ph = H + 2 * a[1].ints[0], pw = W + 2 * a[1].ints[1];
    int64_t eh = a[2].ints[0] * (kh - 1) + 1, ew = a[2].ints[1] * (kw - 1) + 1;
    if (ph < eh || pw < ew)
        return em_set_error(EM_ERR_SHAPE, "%s: the kernel (%lld x %lld, dilated %lld x %lld) of "
                            "weight %s is larger than the padded input (%lld x %lld) of input %s",
                            em_op_name(op), (long long)kh, (long long)kw, (long long)eh,
                            (long long)ew, SHAPE(w, b2), (long long)ph, (long long)pw,
                            SHAPE(x, b1));
    return EM_OK;
}

/* Channel agreement of input channels C, weight w (O, C/g, kH, kW) and groups g. */
static em_status conv_channels(const em_op *op, int64_t C, const em_tensor *w, int64_t g,
                               const em_tensor *x) {
    char b1[160], b2[160];
    if (w->shape[1] * g != C || w->shape[0] % g != 0)
        return em_set_error(EM_ERR_SHAPE, "%s: input %s has %lld channels but weight %s with "
                            "%lld groups expects %lld (weight.shape[1] * groups), and %lld "
                            "output channels must divide into the groups", em_op_name(op),
                            SHAPE(x, b1), (long long)C, SHAPE(w, b2), (long long)g,
                            (long long)(w->shape[1] * g), (long long)w->shape[0]);
    return EM_OK;
}

static em_status infer_conv2d(const em_op *op, const em_tensor *const *in, const em_attr *a,
                              em_tensor_meta *out) {
    const em_tensor *x = in[0], *w = in[1], *b = in[2];
    char b1[160], b2[160];
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK) st = check_4d(op, "input", x);
    if (st == EM_OK && w->ndim != 4)
        st = em_set_error(EM_ERR_SHAPE, "%s: expected a 4-D (O, C/groups, kH, kW) weight, got "
                          "shape %s", em_op_name(op), SHAPE(w, b1));
    if (st == EM_OK) st = check_same_float(op, in, 3);
    if (st == EM_OK) st = conv_channels(op, x->shape[1], w, a[3].v.i, x);
    if (st == EM_OK && !(b->numel == 0 || (b->ndim == 1 && b->shape[0] == w->shape[0])))
        st = em_set_error(EM_ERR_SHAPE, "%s: bias %s does not match weight %s (expected [%lld])",
                          em_op_name(op), SHAPE(b, b1), SHAPE(w, b2), (long long)w->shape[0]);
    if (st == EM_OK) st = conv_check(op, a, x->shape[2], x->shape[3], w->shape[2], w->shape[3], x, w);
    if (st != EM_OK) return st;
    meta4(out, x->dtype, x->shape[0], w->shape[0],
          conv_out(x->shape[2], w->shape[2], a[0].ints[0], a[1].ints[0], a[2].ints[0]),
          conv_out(x->shape[3], w->shape[3], a[0].ints[1], a[1].ints[1], a[2].ints[1]));
    return EM_OK;
}

/* grad_output's spatial size matches the convolution of an (H, W) input. */
static em_status conv_grad_shape(const em_op *op, const em_attr *a, int64_t H, int64_t W,
                                 int64_t kh, int64_t kw, int64_t O, const em_tensor *gy) {
    int64_t oh = conv_out(H, kh, a[0].ints[0], a[1].ints[0], a[2].ints[0]);
    int64_t ow = conv_out(W, kw, a[0].ints[1], a[1].ints[1], a[2].ints[1]);
    char b1[160];
    if (gy->shape[1] != O || gy->shape[2] != oh || gy->shape[3] != ow)
        return em_set_error(EM_ERR_SHAPE, "%s: grad_output %s does not match the convolution's "
                            "output [%lld, %lld, %lld, %lld] for an input of %lld x %lld",
                            em_op_name(op), SHAPE(gy, b1), (long long)gy->shape[0],
                            (long long)O, (long long)oh, (long long)ow, (long long)H,
                            (long long)W);
    return EM_OK;
}

static em_status infer_conv2d_bwd_data(const em_op *op, const em_tensor *const *in,
                                       const em_attr *a, em_tensor_meta *out) {
    const em_tensor *gy = in[0], *w = in[1];
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK) st = check_4d(op, "grad_output", gy);
    if (st == EM_OK) st = check_4d(op, "weight", w);
    if (st == EM_OK) st = check_same_float(op, in, 2);
    if (st != EM_OK) return st;
    int64_t g = a[3].v.i, H = a[4].ints[0], W = a[4].ints[1];
    if (g <= 0 || w->shape[0] % g != 0 || H < 0 || W < 0)
        return em_set_error(EM_ERR_INVALID, "%s: groups %lld must divide the %lld output "
                            "channels; input_size (%lld, %lld) must be non-negative",
                            em_op_name(op), (long long)g, (long long)w->shape[0], (long long)H,
                            (long long)W);
    st = conv_check(op, a, H, W, w->shape[2], w->shape[3], gy, w);
    if (st == EM_OK) st = conv_grad_shape(op, a, H, W, w->shape[2], w->shape[3], w->shape[0], gy);
    if (st != EM_OK) return st;
    meta4(out, gy->dtype, gy->shape[0], w->shape[1] * g, H, W);
    return EM_OK;
}

static em_status infer_conv2d_bwd_weight(const em_op *op, const em_tensor *const *in,
                                         const em_attr *a, em_tensor_meta *out) {
    const em_tensor *x = in[0], *gy = in[1];
    char b1[160], b2[160];
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK) st = check_4d(op, "input", x);
    if (st == EM_OK) st = check_4d(op, "grad_output", gy);
    if (st == EM_OK) st = check_same_float(op, in, 2);
    if (st != EM_OK) return st;
    int64_t g = a[3].v.i, kh = a[4].ints[0], kw = a[4].ints[1], C = x->shape[1], O = gy->shape[1];
    if (g <= 0 || C % g != 0 || O % g != 0 || kh <= 0 || kw <= 0 || x->shape[0] != gy->shape[0])
        return em_set_error(EM_ERR_SHAPE, "%s: input %s and grad_output %s do not fit groups %lld "
                            "and kernel (%lld, %lld) (channels must divide into the groups, "
                            "batch sizes must match)", em_op_name(op), SHAPE(x, b1),
                            SHAPE(gy, b2), (long long)g, (long long)kh, (long long)kw);
    st = conv_check(op, a, x->shape[2], x->shape[3], kh, kw, x, gy);
    if (st == EM_OK) st = conv_grad_shape(op, a, x->shape[2], x->shape[3], kh, kw, O, gy);
    if (st != EM_OK) return st;
    meta4(&out[0], x->dtype, O, C / g, kh, kw);
    out[1] = (em_tensor_meta){.dtype = x->dtype, .ndim = 1, .shape = {O}};
    return EM_OK;
}

/* ---- pooling ---------------------------------------------------------------------------------- */

/* PyTorch's pooling_output_shape: with ceil_mode the last window must start inside the input
 * or the left padding. */
static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
    int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (ceil_mode && (o - 1) * s >= in + p) o--;
    return o;
}

/* attrs: kernel_size, stride, padding, then dilation at index dil (or -1: 1). */
static em_status infer_pool_common(const em_op *op, const em_tensor *x, const int64_t *hw,
                                   const em_attr *a, int dil, bool ceil_mode, em_tensor_meta *out) {
    char b1[160];
    if (!hw) hw = x->shape + 2;
    em_status st = check_4d(op, "input", x);
    if (st == EM_OK && !em_dtype_is_floating(x->dtype))
        st = em_set_error(EM_ERR_DTYPE, "%s: expected a floating input, got %s", em_op_name(op),
                          em_dtype_name(x->dtype));
    if (st != EM_OK) return st;
    int64_t o[2];
    for (int i = 0; i < 2; i++) {
        int64_t k = a[0].ints[i], s = a[1].ints[i], p = a[2].ints[i], d = dil >= 0 ? a[dil].ints[i] : 1;
        if (k <= 0 || s <= 0 || d <= 0 || p < 0)
            return em_set_error(EM_ERR_INVALID, "%s: kernel_size, stride and dilation must be "
                                "positive and padding non-negative; got kernel %lld, stride "
                                "%lld, padding %lld, dilation %lld", em_op_name(op),
                                (long long)k, (long long)s, (long long)p, (long long)d);
        if (p > k / 2)
            return em_set_error(EM_ERR_INVALID, "%s: padding %lld should be at most half of the "
                                "kernel size %lld", em_op_name(op), (long long)p, (long long)k);
        o[i] = pool_out(hw[i], k, s, p, d, ceil_mode);
        if (o[i] < 1)
            return em_set_error(EM_ERR_SHAPE, "%s: input %s is too small for kernel (%lld, %lld) "
                                "with padding (%lld, %lld) and dilation (%lld, %lld): output "
                                "size would be %lld", em_op_name(op),
                                hw == x->shape + 2 ? SHAPE(x, b1)
                                                   : em__shape_str(2, hw, b1, sizeof b1),
                                (long long)a[0].ints[0], (long long)a[0].ints[1],
                                (long long)a[2].ints[0], (long long)a[2].ints[1],
                                (long long)(dil >= 0 ? a[dil].ints[0] : 1),
                                (long long)(dil >= 0 ? a[dil].ints[1] : 1), (long long)o[i]);
    }
    meta4(out, x->dtype, x->shape[0], x->shape[1], o[0], o[1]);
    return EM_OK;
}

static em_status infer_max_pool2d(const em_op *op, const em_tensor *const *in, const em_attr *a,
                                  em_tensor_meta *out) {
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK) st = infer_pool_common(op, in[0], NULL, a, 3, a[4].v.b, &out[0]);
    if (st != EM_OK) return st;
    out[1] = out[0];
    out[1].dtype = EM_I64;
    return EM_OK;
}

/* A pooling backward: grad_output (N, C, OH, OW) matches the forward's output for an input of
 * input_size (attr ia); fwd_out is that output (from the forward's infer). */
static em_status pool_grad_check(const em_op *op, const em_tensor *gy, const em_tensor_meta *fwd) {
    char b1[160], b2[160];
    if (gy->ndim != 4 || memcmp(gy->shape, fwd->shape, sizeof(int64_t) * 4) != 0)
        return em_set_error(EM_ERR_SHAPE, "%s: grad_output %s does not match the forward's "
                            "output %s", em_op_name(op), SHAPE(gy, b1),
                            em__shape_str(4, fwd->shape, b2, sizeof b2));
    return EM_OK;
}

static em_status infer_max_pool2d_bwd(const em_op *op, const em_tensor *const *in,
                                      const em_attr *a, em_tensor_meta *out) {
    const em_tensor *gy = in[0], *idx = in[1];
    char b1[160], b2[160];
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK) st = check_4d(op, "grad_output", gy);
    if (st != EM_OK) return st;
    if (!em_dtype_is_floating(gy->dtype) || idx->dtype != EM_I64 || idx->ndim != 4 ||
        memcmp(idx->shape, gy->shape, sizeof(int64_t) * 4) != 0)
        return em_set_error(EM_ERR_SHAPE, "%s: expected a floating grad_output and int64 indices "
                            "of the same shape; got %s %s and %s %s", em_op_name(op),
                            em_dtype_name(gy->dtype), SHAPE(gy, b1), em_dtype_name(idx->dtype),
                            SHAPE(idx, b2));
    if (a[0].ints[0] < 0 || a[0].ints[1] < 0)
        return em_set_error(EM_ERR_INVALID, "%s: negative input_size", em_op_name(op));
    meta4(out, gy->dtype, gy->shape[0], gy->shape[1], a[0].ints[0], a[0].ints[1]);
    return EM_OK;
}

static em_status infer_avg_pool2d(const em_op *op, const em_tensor *const *in, const em_attr *a,
                                  em_tensor_meta *out) {
    em_status st = check_attrs_present(op, a);
    return st == EM_OK ? infer_pool_common(op, in[0], NULL, a, -1, a[3].v.b, out) : st;
}

static em_status infer_avg_pool2d_bwd(const em_op *op, const em_tensor *const *in,
                                      const em_attr *a, em_tensor_meta *out) {
    const em_tensor *gy = in[0];
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK) st = check_4d(op, "grad_output", gy);
    if (st != EM_OK) return st;
    /* The forward's output for an input of input_size. */
    em_tensor_meta fwd;
    st = infer_pool_common(op, gy, a[5].ints, a, -1, a[3].v.b, &fwd);
    if (st == EM_OK) st = pool_grad_check(op, gy, &fwd);
    if (st != EM_OK) return st;
    meta4(out, gy->dtype, gy->shape[0], gy->shape[1], a[5].ints[0], a[5].ints[1]);
    return EM_OK;
}

static em_status infer_adaptive(const em_op *op, const em_tensor *const *in, const em_attr *a,
                                em_tensor_meta *out) {
    const em_tensor *x = in[0];
    char b1[160];
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK) st = check_4d(op, "input", x);
    if (st != EM_OK) return st;
    if (!em_dtype_is_floating(x->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s: expected a floating input, got %s",
                            em_op_name(op), em_dtype_name(x->dtype));
    bool bwd = op == op_adaptive_avg_pool2d_bwd;
    if (a[0].ints[0] < 0 || a[0].ints[1] < 0 ||
        (!bwd && (x->shape[1] == 0 || x->shape[2] == 0 || x->shape[3] == 0)))
        return em_set_error(EM_ERR_SHAPE, "%s: input %s and size (%lld, %lld): sizes must be "
                            "non-negative and the input's C, H and W non-zero", em_op_name(op),
                            SHAPE(x, b1), (long long)a[0].ints[0], (long long)a[0].ints[1]);
    meta4(out, x->dtype, x->shape[0], x->shape[1], a[0].ints[0], a[0].ints[1]);
    return EM_OK;
}

/* ---- normalisation ---------------------------------------------------------------------------- */

/* p is none (0 elements) or a 1-D (C) tensor. */
static em_status check_param(const em_op *op, const char *name, const em_tensor *p, int64_t C,
                             const em_tensor *x) {
    char b1[160], b2[160];
    if (p->numel == 0 && (C != 0 || p->ndim != 1)) return EM_OK;
    if (p->ndim != 1 || p->shape[0] != C)
        return em_set_error(EM_ERR_SHAPE, "%s: %s %s does not match the %lld channels of input "
                            "%s (expected [%lld])", em_op_name(op), name, SHAPE(p, b1),
                            (long long)C, SHAPE(x, b2), (long long)C);
    return EM_OK;
}

static em_status infer_batch_norm(const em_op *op, const em_tensor *const *in, const em_attr *a,
                                  em_tensor_meta *out) {
    static const char *const names[] = {"input", "weight", "bias", "running_mean", "running_var"};
    const em_tensor *x = in[0];
    char b1[160];
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK && x->ndim < 2)
        st = em_set_error(EM_ERR_SHAPE, "%s: expected an input of at least 2 dims (N, C, ...), "
                          "got shape %s", em_op_name(op), SHAPE(x, b1));
    if (st == EM_OK) st = check_same_float(op, in, 1);
    if (st == EM_OK) st = check_stats(op, in, 1, 4);
    for (int i = 1; i < 5 && st == EM_OK; i++) st = check_param(op, names[i], in[i], x->shape[1], x);
    if (st == EM_OK && !a[0].v.b && (in[3]->numel != x->shape[1] || in[4]->numel != x->shape[1]))
        st = em_set_error(EM_ERR_INVALID, "%s: evaluation mode (training = false) needs "
                          "running_mean and running_var", em_op_name(op));
    if (st != EM_OK) return st;
    meta_like(&out[0], x, x->dtype);
    out[1] = out[2] = (em_tensor_meta){.dtype = compute_dtype(x->dtype), .ndim = 1,
                                       .shape = {x->shape[1]}};
    return EM_OK;
}

static em_status infer_batch_norm_bwd(const em_op *op, const em_tensor *const *in,
                                      const em_attr *a, em_tensor_meta *out) {
    const em_tensor *gy = in[0], *x = in[1];
    char b1[160], b2[160];
    em_status st = check_attrs_present(op, a);
    if (st == EM_OK && (x->ndim < 2 || gy->ndim != x->ndim ||
                        memcmp(gy->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) != 0))
        st = em_set_error(EM_ERR_SHAPE, "%s: grad_output %s and input %s must have the same "
                          "shape of at least 2 dims", em_op_name(op), SHAPE(gy, b1), SHAPE(x, b2));
    if (st == EM_OK) st = check_same_float(op, in, 2);
    if (st == EM_OK) st = check_stats(op, in, 2, 3);
    if (st == EM_OK) st = check_param(op, "weight", in[2], x->shape[1], x);
    if (st == EM_OK && (in[3]->numel != x->shape[1] || in[4]->numel != x->shape[1] ||
                        in[3]->ndim != 1 || in[4]->ndim != 1))
        st = em_set_error(EM_ERR_SHAPE, "%s: save_mean %s and save_invstd %s must be [%lld]",
                          em_op_name(op), SHAPE(in[3], b1), SHAPE(in[4], b2),
                          (long long)x->shape[1]);
    if (st != EM_OK) return st;
    meta_like(&out[0], x, x->dtype);
    out[1] = out[2] = (em_tensor_meta){.dtype = compute_dtype(x->dtype), .ndim = 1,
                                       .shape = {x->shape[1]}};
    return EM_OK;
}

/* w is none or has the last k dims of x. */
static em_status check_ln_param(const em_op *op, const char *name, const em_tensor *w, int k,
                                const em_tensor *x) {
    char b1[160], b2[160];
    if (w->numel == 0 && w->ndim == 1 && w->shape[0] == 0 &&
        em__numel(k, x->shape + x->ndim - k) != 0)
        return EM_OK;
    if (w->ndim != k || memcmp(w->shape, x->shape + x->ndim - k, sizeof(int64_t) * (size_t)k) != 0)
        return em_set_error(EM_ERR_SHAPE, "%s: %s %s does not match the last %d dims of input %s",
                            em_op_name(op), name, SHAPE(w, b1), k, SHAPE(x, b2));
    return EM_OK;
}

static em_status infer_layer_norm(const em_op *op, const em_tensor *const *in, const em_attr *a,
                                  em_tensor_meta *out) {
    const em_tensor *x = in[0];
    char b1[160];
    em_status st = check_attrs_present(op, a);
    if (st != EM_OK) return st;
    int k = (int)a[0].v.i;
    if (k < 1 || k > x->ndim)
        return em_set_error(EM_ERR_SHAPE, "%s: normalized_ndim %d is out of range for input %s",
                            em_op_name(op), k, SHAPE(x, b1));
    st = check_same_float(op, in, 1);
    if (st == EM_OK) st = check_stats(op, in, 1, 2);
    if (st == EM_OK) st = check_ln_param(op, "weight", in[1], k, x);
    if (st == EM_OK) st = check_ln_param(op, "bias", in[2], k, x);
    if (st != EM_OK) return st;
    meta_like(&out[0], x, x->dtype);
    meta_like(&out[1], x, compute_dtype(x->dtype));
    for (int d = x->ndim - k; d < x->ndim; d++) out[1].shape[d] = 1;
    out[2] = out[1];
    return EM_OK;
}

static em_status infer_layer_norm_bwd(const em_op *op, const em_tensor *const *in,
                                      const em_attr *a, em_tensor_meta *out) {
    const em_tensor *gy = in[0], *x = in[1];
    char b1[160], b2[160];
    em_status st = check_attrs_present(op, a);
    if (st != EM_OK) return st;
    int k = (int)a[0].v.i;
    if (k < 1 || k > x->ndim || gy->ndim != x->ndim ||
        memcmp(gy->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim) != 0)
        return em_set_error(EM_ERR_SHAPE, "%s: grad_output %s and input %s must have the same "
                            "shape with at least normalized_ndim %d dims", em_op_name(op),
                            SHAPE(gy, b1), SHAPE(x, b2), k);
    st = check_same_float(op, in, 2);
    if (st == EM_OK) st = check_stats(op, in, 2, 3);
    int64_t rows = em__numel(x->ndim - k, x->shape);
    if (st == EM_OK && (in[2]->numel != rows || in[3]->numel != rows))
        st = em_set_error(EM_ERR_SHAPE, "%s: mean %s and rstd %s must have %lld elements",
                          em_op_name(op), SHAPE(in[2], b1), SHAPE(in[3], b2), (long long)rows);
    if (st == EM_OK) st = check_ln_param(op, "weight", in[4], k, x);
    if (st != EM_OK) return st;
    meta_like(&out[0], x, x->dtype);
    out[1] = (em_tensor_meta){.dtype = compute_dtype(x->dtype), .ndim = k};
    memcpy(out[1].shape, x->shape + x->ndim - k, sizeof(int64_t) * (size_t)k);
    out[2] = out[1];
    return EM_OK;
}

/* ---- softmax ---------------------------------------------------------------------------------- */

static em_status infer_softmax(const em_op *op, const em_tensor *const *in, const em_attr *a,
                               em_tensor_meta *out) {
    const em_tensor *x = in[0];
    char b1[160], b2[160];
    em_status st = check_attrs_present(op, a);
    int n = op == op_softmax || op == op_log_softmax ? 1 : 2;
    if (st == EM_OK) st = check_same_float(op, in, n);
    if (st == EM_OK && n == 2 && (in[1]->ndim != x->ndim ||
                                  memcmp(in[1]->shape, x->shape, sizeof(int64_t) * (size_t)x->ndim)))
        st = em_set_error(EM_ERR_SHAPE, "%s: grad_output %s and output %s must have the same "
                          "shape", em_op_name(op), SHAPE(x, b1), SHAPE(in[1], b2));
    if (st == EM_OK && (a[0].v.i < 0 || a[0].v.i >= (x->ndim ? x->ndim : 1)))
        st = em_set_error(EM_ERR_RANGE, "%s: dim %lld is out of range for shape %s",
                          em_op_name(op), (long long)a[0].v.i, SHAPE(x, b1));
    if (st != EM_OK) return st;
    meta_like(out, x, x->dtype);
    return EM_OK;
}

/* ---- declarations ----------------------------------------------------------------------------- */

/* Every nn op is a composite over its kernel (the c_* functions below): absent optional
 * inputs become the kernel's 0-element "none" tensors, attributes take their defaults, and
 * f16/bf16 calls run in f32 where the device has no native kernel. */
EM__COMPOSITE(c_conv2d);
EM__COMPOSITE(c_conv2d_relu);
EM__COMPOSITE(c_conv2d_bwd_data);
EM__COMPOSITE(c_conv2d_bwd_weight);
EM__COMPOSITE(c_max_pool2d);
EM__COMPOSITE(c_max_pool2d_bwd);
EM__COMPOSITE(c_max_pool2d_relu);
EM__COMPOSITE(c_avg_pool);
EM__COMPOSITE(c_adaptive);
EM__COMPOSITE(c_batch_norm);
EM__COMPOSITE(c_batch_norm_bwd);
EM__COMPOSITE(c_layer_norm);
EM__COMPOSITE(c_layer_norm_bwd);
EM__COMPOSITE(c_softmax);
EM__COMPOSITE(c_dropout);
EM__COMPOSITE(c_conv1d);
EM__COMPOSITE(c_conv_transpose2d);
EM__COMPOSITE(c_group_norm);

/* The kernel ops whose output keeps a channels-last input's layout (conv2d_backward_weight's
 * outputs are the weight's and the bias's: always plain). */
static unsigned layout_flags(const char *name) {
    static const char *const cl[] = {"conv2d", "conv2d_relu", "conv2d_backward_data",
                                     "max_pool2d", "max_pool2d_backward", "max_pool2d_relu"};
    for (size_t i = 0; i < sizeof cl / sizeof cl[0]; i++)
        if (strcmp(name, cl[i]) == 0) return EM_OP_CHANNELS_LAST;
    return 0;
}

/* The input whose layout those outputs take (EM_OP_CHANNELS_LAST): max_pool2d_backward's
 * indices, which come from the forward in the activation's layout, while its grad may arrive
 * row-major (through a flatten's backward); input 0 elsewhere. */
static int layout_arg(const char *name) { return strcmp(name, "max_pool2d_backward") == 0; }

static em_status declare(em_registry *core, const em_op **out, int autocast, const char *name,
                         int n_in, const char *const *in_names, int n_out, int n_attrs,
                         const char *const *attr_names, const em_attr_type *types,
                         em_infer_fn infer, em_backward_fn backward, unsigned saves,
                         em_composite_fn composite, unsigned optional) {
    return em__declare(core, out, (em_op_schema){.name = name, .n_inputs = n_in,
                       .input_names = in_names, .n_outputs = n_out, .n_attrs = n_attrs,
                       .attr_names = attr_names, .attr_types = types, .dispatch_arg = 0,
                       .flags = (backward ? 0 : EM_OP_NONDIFF) | layout_flags(name),
                       .infer = infer,
                       .backward = backward, .saves = saves, .composite = composite,
                       .optional_inputs = optional, .category = "nn", .autocast = autocast,
                       .layout_arg = layout_arg(name)});
}

/* ---- derivatives ------------------------------------------------------------------------------
 * Written with the public backward functions below (they make the grad contiguous and of the
 * kernel dtype); run with grad mode off inside a scope of their own. The ops' inputs are the
 * prepared (contiguous, kernel- or statistics-dtype) tensors, so grads have their shapes and
 * dtypes: a bf16 op that ran natively is differentiated by bf16 backward calls. Optional
 * inputs passed as 0-element "none" tensors get no grad. The auxiliary outputs (max_pool2d's
 * indices, the saved statistics of the norms) carry no gradient: indices are integers, and
 * a gradient flowing into a statistic is refused rather than dropped. */

#define G (c->grad_out[0])
#define NEED(i) (c->needs_grad[i] && c->in_meta[i].ndim > 0 && \
                 em__numel(c->in_meta[i].ndim, c->in_meta[i].shape) > 0)

static em_status done(em_tensor *g, em_tensor **slot) {
    *slot = g;
    return g ? EM_OK : em_last_status();
}

static em_status stats_have_no_grad(const em_backward_ctx *c) {
    for (int j = 1; j < c->n_out; j++)
        if (c->grad_out[j])
            return em_set_error(EM_ERR_STATE, "backward: %s: gradients through its output %d "
                                "(a saved statistic) are not supported; compute the statistic "
                                "with differentiable ops", em_op_name(c->op), j);
    return EM_OK;
}

/* conv2d's grads for the output grad g (conv2d's and conv2d_relu's derivatives). */
static em_status conv2d_grads(const em_backward_ctx *c, const em_tensor *g, em_tensor **gi) {
    const em_attr *a = c->attrs; /* stride, padding, dilation, groups */
    const int64_t *xs = c->in_meta[0].shape, *ws = c->in_meta[1].shape;
    if (NEED(0) && !(gi[0] = em_conv2d_backward_data(g, c->in[1], xs + 2, a[0].ints, a[1].ints,
                                                     a[2].ints, a[3].v.i)))
        return em_last_status();
    if (!NEED(1) && !NEED(2)) return EM_OK;
    em_tensor *gw = NULL, *gb = NULL;
    em_status st = em_conv2d_backward_weight(c->in[0], g, ws + 2, a[0].ints, a[1].ints,
                                             a[2].ints, a[3].v.i, &gw, &gb);
    if (st != EM_OK) return st;
    if (NEED(1)) gi[1] = gw;
    if (NEED(2)) gi[2] = gb;
    return EM_OK;
}

static em_status d_conv2d(const em_backward_ctx *c, em_tensor **gi) { return conv2d_grads(c, G, gi); }

/* conv2d_relu: relu's mask on the saved output y (y > 0, as relu's own derivative), then
 * conv2d's grads. */
static em_status d_conv2d_relu(const em_backward_ctx *c, em_tensor **gi) {
    const em_tensor *in[2] = {G, c->out[0]};
    em_tensor *g = em__scope_track(em__op1(op_relu_bwd, in, 2, NULL));
    return g ? conv2d_grads(c, g, gi) : em_last_status();
}

/* conv2d_backward_data is linear in grad_output and in weight: its derivative is conv2d
 * (grad_output's) and conv2d_backward_weight (weight's), so conv2d has a second derivative
 * and conv_transpose2d, built on it, a first. */
static em_status d_conv2d_bwd_data(const em_backward_ctx *c, em_tensor **gi) {
    const em_attr *a = c->attrs; /* stride, padding, dilation, groups, input_size */
    if (!G) return EM_OK;
    if (NEED(0) && !(gi[0] = em_conv2d(G, c->in[1], NULL, a[0].ints, a[1].ints, a[2].ints,
                                       a[3].v.i)))
        return em_last_status();
    if (NEED(1))
        return em_conv2d_backward_weight(G, c->in[0], c->in_meta[1].shape + 2, a[0].ints,
                                         a[1].ints, a[2].ints, a[3].v.i, &gi[1], NULL);
    return EM_OK;
}

static em_status d_max_pool2d(const em_backward_ctx *c, em_tensor **gi) {
    if (!G) return EM_OK; /* only the indices were used */
    return done(em_max_pool2d_backward(G, c->out[1], c->in_meta[0].shape + 2), &gi[0]);
}

/* max_pool2d_relu: relu's mask on the saved pooled output y (y > 0), then max_pool2d's
 * scatter to the saved indices. Bitwise relu_backward(max_pool2d_backward(gy, idx), relu(x)):
 * every grad reaching an input element comes from a window it won, whose pooled value is that
 * element's relu, so the same terms are kept (gy) or dropped (+0) in the same order. */
static em_status d_max_pool2d_relu(const em_backward_ctx *c, em_tensor **gi) {
    if (!G) return EM_OK; /* only the indices were used */
    const em_tensor *in[2] = {G, c->out[0]};
    em_tensor *g = em__scope_track(em__op1(op_relu_bwd, in, 2, NULL));
    return g ? done(em_max_pool2d_backward(g, c->out[1], c->in_meta[0].shape + 2), &gi[0])
             : em_last_status();
}

static em_status d_avg_pool2d(const em_backward_ctx *c, em_tensor **gi) {
    const em_attr *a = c->attrs; /* kernel_size, stride, padding, ceil_mode, count_include_pad */
    return done(em_avg_pool2d_backward(G, c->in_meta[0].shape + 2, a[0].ints, a[1].ints,
                                       a[2].ints, a[3].v.b, a[4].v.b), &gi[0]);
}

static em_status d_adaptive_avg_pool2d(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_adaptive_avg_pool2d_backward(G, c->in_meta[0].shape + 2), &gi[0]);
}

/* Training: through the batch statistics (saved mean and invstd); evaluation: the running
 * statistics are constants (save_mean/save_invstd hold them). The running statistics get no
 * grad, as in PyTorch. */
static em_status d_batch_norm(const em_backward_ctx *c, em_tensor **gi) {
    em_status st = stats_have_no_grad(c);
    if (st != EM_OK || !G) return st;
    em_tensor *gx = NULL, *gw = NULL, *gb = NULL;
    const em_tensor *w = c->in_meta[1].shape[0] > 0 ? c->in[1] : NULL;
    st = em_batch_norm_backward(G, c->in[0], w, c->out[1], c->out[2], c->attrs[0].v.b, &gx,
                                &gw, &gb);
    if (st != EM_OK) return st;
    if (NEED(0)) gi[0] = gx;
    if (NEED(1)) gi[1] = gw;
    if (NEED(2)) gi[2] = gb;
    return EM_OK;
}

static em_status d_layer_norm(const em_backward_ctx *c, em_tensor **gi) {
    em_status st = stats_have_no_grad(c);
    if (st != EM_OK || !G) return st;
    em_tensor *gx = NULL, *gw = NULL, *gb = NULL;
    int k = (int)c->attrs[0].v.i;
    bool has_w = em__numel(c->in_meta[1].ndim, c->in_meta[1].shape) > 0;
    st = em_layer_norm_backward(G, c->in[0], c->out[1], c->out[2], has_w ? c->in[1] : NULL, k,
                                &gx, &gw, &gb);
    if (st != EM_OK) return st;
    /* The grads of weight and bias have the normalized shape (the params' own). */
    if (NEED(0)) gi[0] = gx;
    if (NEED(1)) gi[1] = gw;
    if (NEED(2)) gi[2] = gb;
    return EM_OK;
}

static em_status d_softmax(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_softmax_backward(G, c->out[0], (int)c->attrs[0].v.i), &gi[0]);
}

static em_status d_log_softmax(const em_backward_ctx *c, em_tensor **gi) {
    return done(em_log_softmax_backward(G, c->out[0], (int)c->attrs[0].v.i), &gi[0]);
}
#undef G
#undef NEED

em_status em__ops_declare_nn(em_registry *core) {
#define I EM_ATTR_INTS
#define N EM_ATTR_INT
#define B EM_ATTR_BOOL
#define F EM_ATTR_FLOAT
    static const char *const conv_a[] = {"stride", "padding", "dilation", "groups", "input_size"},
                             *const convw_a[] = {"stride", "padding", "dilation", "groups",
                                                 "kernel_size"},
                             *const maxp_a[] = {"kernel_size", "stride", "padding", "dilation",
                                                "ceil_mode"},
                             *const avgp_a[] = {"kernel_size", "stride", "padding", "ceil_mode",
                                                "count_include_pad", "input_size"},
                             *const in_size[] = {"input_size"}, *const out_size[] = {"output_size"},
                             *const bn_a[] = {"training", "momentum", "eps"},
                             *const ln_a[] = {"normalized_ndim", "eps", "normalized_shape"},
                             *const dim[] = {"dim"};
    static const char *const conv_i[] = {"input", "weight", "bias"},
                             *const convd_i[] = {"grad_output", "weight"},
                             *const convw_i[] = {"input", "grad_output"},
                             *const x_i[] = {"input"}, *const gy_i[] = {"grad_output"},
                             *const maxpb_i[] = {"grad_output", "indices"},
                             *const bn_i[] = {"input", "weight", "bias", "running_mean",
                                              "running_var"},
                             *const bnb_i[] = {"grad_output", "input", "weight", "save_mean",
                                               "save_invstd"},
                             *const ln_i[] = {"input", "weight", "bias"},
                             *const lnb_i[] = {"grad_output", "input", "mean", "rstd", "weight"},
                             *const smb_i[] = {"grad_output", "output"};
    static const em_attr_type conv_t[] = {I, I, I, N, I}, maxp_t[] = {I, I, I, I, B},
                              avgp_t[] = {I, I, I, B, B, I}, ints_t[] = {I},
                              bn_t[] = {B, F, F}, ln_t[] = {N, F, I}, int_t[] = {N}, b_t[] = {B};
#undef I
#undef N
#undef B
#undef F
    em_status st = EM_OK;
#define DECL(var, ...) if (st == EM_OK) st = declare(core, &var, EM_AUTOCAST_NONE, __VA_ARGS__)
    /* DECLA: with an autocast class (ember/autocast.h). */
#define DECLA(ac, var, ...) if (st == EM_OK) st = declare(core, &var, ac, __VA_ARGS__)
    /* The *_backward helpers are not differentiable (declared with no backward: NONDIFF). */
    const unsigned in0 = EM_SAVE_INPUT(0), in01 = in0 | EM_SAVE_INPUT(1),
                   out0 = EM_SAVE_OUTPUT(0), out1 = EM_SAVE_OUTPUT(1),
                   stats = EM_SAVE_OUTPUT(1) | EM_SAVE_OUTPUT(2);
    DECLA(EM_AUTOCAST_LOWER, op_conv2d, "conv2d", 3, conv_i, 1, 4, conv_a, conv_t, infer_conv2d, d_conv2d, in01,
         c_conv2d, 1u << 2);
    DECLA(EM_AUTOCAST_LOWER, op_conv2d_relu, "conv2d_relu", 3, conv_i, 1, 4, conv_a, conv_t,
          infer_conv2d, d_conv2d_relu, in01 | out0, c_conv2d_relu, 1u << 2);
    DECL(op_conv2d_bwd_data, "conv2d_backward_data", 2, convd_i, 1, 5, conv_a, conv_t,
         infer_conv2d_bwd_data, d_conv2d_bwd_data, in01, c_conv2d_bwd_data, 0);
    DECL(op_conv2d_bwd_weight, "conv2d_backward_weight", 2, convw_i, 2, 5, convw_a, conv_t,
         infer_conv2d_bwd_weight, NULL, 0, c_conv2d_bwd_weight, 0);
    DECL(op_max_pool2d, "max_pool2d", 1, x_i, 2, 5, maxp_a, maxp_t, infer_max_pool2d,
         d_max_pool2d, out1, c_max_pool2d, 0);
    DECL(op_max_pool2d_bwd, "max_pool2d_backward", 2, maxpb_i, 1, 1, in_size, ints_t,
         infer_max_pool2d_bwd, NULL, 0, c_max_pool2d_bwd, 0);
    DECL(op_max_pool2d_relu, "max_pool2d_relu", 1, x_i, 2, 5, maxp_a, maxp_t, infer_max_pool2d,
         d_max_pool2d_relu, out0 | out1, c_max_pool2d_relu, 0);
    DECL(op_avg_pool2d, "avg_pool2d", 1, x_i, 1, 5, avgp_a, avgp_t, infer_avg_pool2d,
         d_avg_pool2d, 0, c_avg_pool, 0);
    DECL(op_avg_pool2d_bwd, "avg_pool2d_backward", 1, gy_i, 1, 6, avgp_a, avgp_t,
         infer_avg_pool2d_bwd, NULL, 0, c_avg_pool, 0);
    DECL(op_adaptive_avg_pool2d, "adaptive_avg_pool2d", 1, x_i, 1, 1, out_size, ints_t,
         infer_adaptive, d_adaptive_avg_pool2d, 0, c_adaptive, 0);
    DECL(op_adaptive_avg_pool2d_bwd, "adaptive_avg_pool2d_backward", 1, gy_i, 1, 1, in_size,
         ints_t, infer_adaptive, NULL, 0, c_adaptive, 0);
    DECLA(EM_AUTOCAST_FLOAT32, op_batch_norm, "batch_norm", 5, bn_i, 3, 3, bn_a, bn_t, infer_batch_norm,
         d_batch_norm, in01 | stats, c_batch_norm, 0x1eu);
    DECL(op_batch_norm_bwd, "batch_norm_backward", 5, bnb_i, 3, 1, bn_a, b_t,
         infer_batch_norm_bwd, NULL, 0, c_batch_norm_bwd, 1u << 2);
    DECLA(EM_AUTOCAST_FLOAT32, op_layer_norm, "layer_norm", 3, ln_i, 3, 3, ln_a, ln_t, infer_layer_norm,
         d_layer_norm, in01 | stats, c_layer_norm, 0x6u);
    DECL(op_layer_norm_bwd, "layer_norm_backward", 5, lnb_i, 3, 1, ln_a, int_t,
         infer_layer_norm_bwd, NULL, 0, c_layer_norm_bwd, 1u << 4);
    DECLA(EM_AUTOCAST_FLOAT32, op_softmax, "softmax", 1, x_i, 1, 1, dim, int_t, infer_softmax, d_softmax, out0,
         c_softmax, 0);
    DECLA(EM_AUTOCAST_FLOAT32, op_log_softmax, "log_softmax", 1, x_i, 1, 1, dim, int_t, infer_softmax,
         d_log_softmax, out0, c_softmax, 0);
    DECL(op_softmax_bwd, "softmax_backward", 2, smb_i, 1, 1, dim, int_t, infer_softmax, NULL,
         0, c_softmax, 0);
    DECL(op_log_softmax_bwd, "log_softmax_backward", 2, smb_i, 1, 1, dim, int_t,
         infer_softmax, NULL, 0, c_softmax, 0);
#undef DECL
#undef DECLA
    /* dropout(x; p, training, seed, offset) -> (y, mask): the mask is bernoulli(1 - p) from the
     * Philox stream at (seed, offset) (em_dropout draws them from a generator); seed absent:
     * offset relative to a graph capture's generator state, as bernoulli's (ops_fill.c). */
    static const char *const drop_a[] = {"p", "training", "seed", "offset"},
                             *const drop_o[] = {"input"};
    static const em_attr_type drop_t[] = {EM_ATTR_FLOAT, EM_ATTR_BOOL, EM_ATTR_INT, EM_ATTR_INT};
    if (st == EM_OK)
        st = em__declare(core, &op_dropout, (em_op_schema){.name = "dropout", .n_inputs = 1,
                         .input_names = drop_o, .n_outputs = 2, .n_attrs = 4,
                         .attr_names = drop_a, .attr_types = drop_t, .composite = c_dropout,
                         .category = "nn"});
    /* conv1d, conv_transpose2d and group_norm: composites of conv2d, conv2d_backward_data and
     * layer_norm (their kernels and derivatives) with the elementwise ops. */
    static const char *const conv1d_a[] = {"stride", "padding", "dilation", "groups"},
                             *const convt_a[] = {"stride", "padding", "output_padding", "groups",
                                                 "dilation"},
                             *const gn_a[] = {"num_groups", "eps"};
    static const em_attr_type conv1d_t[] = {EM_ATTR_INT, EM_ATTR_INT, EM_ATTR_INT, EM_ATTR_INT},
                              convt_t[] = {EM_ATTR_INTS, EM_ATTR_INTS, EM_ATTR_INTS, EM_ATTR_INT,
                                           EM_ATTR_INTS},
                              gn_t[] = {EM_ATTR_INT, EM_ATTR_FLOAT};
    static const struct {
        const char *name;
        int n_attrs;
        const char *const *attr_names;
        const em_attr_type *types;
        em_composite_fn fn;
        unsigned optional;
        int autocast;
    } comps[] = {
        {"conv1d", 4, conv1d_a, conv1d_t, c_conv1d, 1u << 2, EM_AUTOCAST_LOWER},
        {"conv_transpose2d", 5, convt_a, convt_t, c_conv_transpose2d, 1u << 2, EM_AUTOCAST_LOWER},
        {"group_norm", 2, gn_a, gn_t, c_group_norm, 0x6u, EM_AUTOCAST_FLOAT32},
    };
    const em_op **vars[] = {&op_conv1d, &op_conv_transpose2d, &op_group_norm};
    for (size_t i = 0; i < sizeof comps / sizeof comps[0] && st == EM_OK; i++)
        st = em__declare(core, vars[i], (em_op_schema){.name = comps[i].name, .n_inputs = 3,
                         .input_names = i == 2 ? ln_i : conv_i, .n_outputs = 1,
                         .n_attrs = comps[i].n_attrs, .attr_names = comps[i].attr_names,
                         .attr_types = comps[i].types, .composite = comps[i].fn,
                         .optional_inputs = comps[i].optional, .category = "nn",
                         .autocast = comps[i].autocast});
    /* dropout's parts, declared before this family (ops.c, ops_math.c). */
    if (st == EM_OK &&
        (!(op_bernoulli = em_op_find("bernoulli")) || !(op_mul = em_op_find("mul")) ||
         !(op_div_scalar = em_op_find("div_scalar")) ||
         !(op_relu_bwd = em_op_find("relu_backward"))))
        st = em_last_status();
    return st;
}

/* ---- public functions: argument preparation --------------------------------------------------- */

static bool check_float(const char *who, const char *name, const em_tensor *t) {
    if (em_dtype_is_floating(t->dtype)) return true;
    em_set_error(EM_ERR_DTYPE, "%s: expected a floating %s, got %s", who, name,
                 em_dtype_name(t->dtype));
    return false;
}

/* An owned, contiguous reference to t in dtype dt; a 0-element "none" tensor for NULL t.
 * keep_cl: a channels-last t already in dt on the CPU is passed as it is (the CPU kernels of
 * the convolutions and max pooling read that layout; docs/performance.md). */
static em_tensor *prep(const em_tensor *t, em_dtype dt, em_device dev, bool keep_cl) {
    if (!t) return em__empty(1, (const int64_t[]){0}, dt, dev);
    if (keep_cl && t->dtype == dt && em__is_channels_last(t->ndim, t->shape, t->strides))
        return em_tensor_retain((em_tensor *)t);
    em_tensor *c = em__to_dtype(t, dt);
    em_tensor *r = c ? em__contiguous(c) : NULL;
    em_tensor_release(c);
    if (r && em__is_channels_last(r->ndim, r->shape, r->strides)) {
        /* One channel, channels-last strides: contiguous bytes, but the kernel op would give
         * its outputs that layout; a row-major copy. */
        em_tensor *p = em__empty(r->ndim, r->shape, r->dtype, dev);
        if (p && em_copy_(p, r) != EM_OK) {
            em_tensor_release(p);
            p = NULL;
        }
        em_tensor_release(r);
        r = p;
    }
    return r;
}

/* Converts an owned result to dtype dt (releasing the original), keeping a channels-last
 * result channels-last (keep_layout). */
static em_tensor *finish(em_tensor *r, em_dtype dt) {
    if (!r || r->dtype == dt) return r;
    em_tensor *c = em__to_dtype(r, dt);
    if (c && em__is_channels_last(r->ndim, r->shape, r->strides) &&
        !em__is_channels_last(c->ndim, c->shape, c->strides)) {
        em_tensor *l = em__channels_last(c);
        em_tensor_release(c);
        c = l;
    }
    em_tensor_release(r);
    return c;
}

/* A multi-output composite's end: on success its n results (owned) become the outputs; on
 * failure every result made so far is released. */
static em_status outputs(em_status st, em_tensor **res, int n, em_tensor **out, int *n_out) {
    if (st != EM_OK) {
        for (int i = 0; i < n; i++) em_tensor_release(res[i]);
        return st;
    }
    for (int i = 0; i < n; i++) out[i] = res[i];
    *n_out = n;
    return EM_OK;
}

/* Run op on n prepared inputs (released here); n_out results into out (owned). */
static em_status run(const em_op *op, em_tensor **in, int n, const em_attr *attrs,
                     em_tensor **out) {
    em_status st = EM_OK;
    for (int i = 0; i < n; i++)
        if (!in[i]) st = em_last_status();
    if (st == EM_OK) st = em__op_call_kernel(op, (const em_tensor *const *)in, n, attrs, out);
    for (int i = 0; i < n; i++) em_tensor_release(in[i]);
    return st;
}

/* How call() prepares an input: in the kernel dtype (activations, their grads, conv weights),
 * in the statistics dtype S (the norms' per-channel and per-row tensors), or as it is
 * (max_pool2d's indices); AS_XL and AS_ISL as AS_X and AS_IS, except that a channels-last
 * input on the CPU stays channels-last (the activations of conv2d, its backwards and max
 * pooling). A kernel that does not read that layout declines it (supports()); the call is
 * then made again on contiguous copies. */
enum { AS_X = 'x', AS_S = 's', AS_IS = 'i', AS_XL = 'l', AS_ISL = 'j' };

/* An op that keeps channels-last activations (EM_OP_CHANNELS_LAST) gives them whichever
 * kernel ran: when input x (t[layout_arg]) is channels-last and a kernel that does not read that layout ran
 * on contiguous copies (or another device's kernel did), its 4-dim results are made
 * channels-last here, as the dispatcher allocates them for a kernel that does (one copy each,
 * on those paths only). On failure every result is released. */
static em_status keep_layout(const em_op *op, const em_tensor *const *t, em_tensor **res) {
    const em_op_schema *s = em_op_schema_of(op);
    if (!(s->flags & EM_OP_CHANNELS_LAST)) return EM_OK;
    const em_tensor *x = t[s->layout_arg];
    if (!em__is_channels_last(x->ndim, x->shape, x->strides)) return EM_OK;
    em_status st = EM_OK;
    for (int i = 0; i < s->n_outputs; i++) {
        em_tensor *r = res[i];
        /* A result in a storage layout (em_layout) is what the kernel chose to keep. */
        if (st != EM_OK || r->ndim != 4 || em__layout_of(r) ||
            em__is_channels_last(r->ndim, r->shape, r->strides))
            continue;
        if (!(res[i] = em__channels_last(r))) st = em_last_status();
        em_tensor_release(r);
    }
    if (st != EM_OK)
        for (int i = 0; i < s->n_outputs; i++) {
            em_tensor_release(res[i]);
            res[i] = NULL;
        }
    return st;
}

/* Runs op on the caller's inputs t[0..n) (NULL: an absent optional input, passed as "none"),
 * each prepared as roles[i] says; n_out results into res (owned). dt is the call's dtype
 * (input 0's, usually): an f16/bf16 call first runs in dt when the device's backend
 * registers a kernel of op for dt; when there is none, or its supports() declined the call
 * (the dispatcher then says EM_ERR_NOKERNEL having run and recorded nothing), it runs in f32.
 * Results are in the kernel dtype; the caller rounds them back (finish). */
static em_status call(const em_op *op, em_dtype dt, const em_tensor *const *t, const char *roles,
                      int n, const em_attr *attrs, em_tensor **res) {
    em_device dev = t[0]->storage->device;
    em_dtype cd = compute_dtype(dt);
    bool native = dt != cd && em__op_has_kernel(op, dev.type, dt);
    bool keep_cl = dev.type == EM_DEVICE_CPU_TYPE;
    for (;;) {
        em_dtype kd = native ? dt : cd;
        em_tensor *in[8];
        bool kept = false;
        for (int i = 0; i < n; i++) {
            char r = roles[i];
            bool x = r == AS_X || r == AS_XL, l = keep_cl && (r == AS_XL || r == AS_ISL);
            em_dtype want = x ? kd : r == AS_S || !t[i] ? cd : t[i]->dtype;
            in[i] = prep(t[i], want, dev, l);
            kept |= l && in[i] && in[i] == t[i] &&
                    em__is_channels_last(t[i]->ndim, t[i]->shape, t[i]->strides);
        }
        em_status st = run(op, in, n, attrs, res);
        if (st == EM_OK) st = keep_layout(op, t, res);
        if (st != EM_ERR_NOKERNEL) return st;
        if (kept) { /* no kernel reads channels-last here: the same call on contiguous copies */
            em_clear_error();
            keep_cl = false;
            continue;
        }
        if (!native) return st;
        em_clear_error();
        native = false;
    }
}

/* The preparation above for the nn ops of other core files (ops_attention.c). */
em_status em__nn_call(const em_op *op, em_dtype dt, const em_tensor *const *t,
                      const char *roles, int n, const em_attr *attrs, em_tensor **res) {
    return call(op, dt, t, roles, n, attrs, res);
}
em_tensor *em__nn_finish(em_tensor *r, em_dtype dt) { return finish(r, dt); }
em_status em__nn_outputs(em_status st, em_tensor **res, int n, em_tensor **out, int *n_out) {
    return outputs(st, res, n, out, n_out);
}

static em_attr ints2(const int64_t *v, int64_t def) {
    em_attr a = {.type = EM_ATTR_INTS, .n = 2};
    a.ints[0] = v ? v[0] : def;
    a.ints[1] = v ? v[1] : def;
    return a;
}
static em_attr aint(int64_t v) { return (em_attr){.type = EM_ATTR_INT, .v.i = v}; }
static em_attr abool(bool v) { return (em_attr){.type = EM_ATTR_BOOL, .v.b = v}; }
static em_attr afloat(double v) { return (em_attr){.type = EM_ATTR_FLOAT, .v.f = v}; }

/* ---- composites: the public nn ops over their kernels ----------------------------------------- */

/* A pair attribute (kernel_size, stride, ...) or its default: def (both entries) when absent,
 * `fallback` (another attribute) first when given. */
static em_attr pair_or(const em_attr *attrs, int i, const em_attr *fallback, int64_t def) {
    if (attrs && attrs[i].type == EM_ATTR_INTS) return attrs[i];
    if (fallback && fallback->type == EM_ATTR_INTS) return *fallback;
    return ints2(NULL, def);
}
static bool has_pair(const em_attr *attrs, int i) { return attrs && attrs[i].type == EM_ATTR_INTS; }

#define UNUSED (void)op, (void)n_in, (void)cap

/* conv2d(input, weight, bias?; stride, padding, dilation, groups): absent stride and
 * dilation are 1, padding 0, groups 1. */
/* conv2d's and conv2d_relu's operand checks (floating, one dtype), naming the op. */
static em_status conv_operands_ok(const char *op, const em_tensor *input,
                                  const em_tensor *weight, const em_tensor *bias) {
    if (!check_float(op, "input", input) || !check_float(op, "weight", weight) ||
        (bias && !check_float(op, "bias", bias)))
        return em_last_status();
    if (weight->dtype != input->dtype || (bias && bias->dtype != input->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s: input (%s), weight (%s) and bias (%s) must "
                            "have the same dtype", op, em_dtype_name(input->dtype),
                            em_dtype_name(weight->dtype),
                            bias ? em_dtype_name(bias->dtype) : "none");
    return EM_OK;
}

EM__COMPOSITE(c_conv2d) {
    UNUSED;
    const em_tensor *input = in[0], *weight = in[1], *bias = in[2];
    if (conv_operands_ok("conv2d", input, weight, bias) != EM_OK) return em_last_status();
    em_attr a[4] = {pair_or(attrs, 0, NULL, 1), pair_or(attrs, 1, NULL, 0),
                    pair_or(attrs, 2, NULL, 1), aint(em__attr_int_or(attrs, 3, 1))};
    em_tensor *y = NULL;
    if (call(op_conv2d, input->dtype, in, "lxx", 3, a, &y) != EM_OK) return em_last_status();
    *n_out = (out[0] = finish(y, input->dtype)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* conv2d_relu(input, weight, bias?; as conv2d): the op's own kernel where the device has one
 * for the call's dtype that accepts the call; otherwise — none registered (f64, f16 and bf16
 * on the CPU, where conv2d's own bf16 kernel beats converting to f32 for the fused one; the
 * CUDA backend; a third-party backend) or every one declined (EM_ERR_NOKERNEL, nothing run
 * or recorded) — relu(conv2d(...)), which
 * has the same meaning and, on the CPU, the same bits. The shapes are checked first by the
 * op's own inference on either path, so its errors name conv2d_relu. A device without the
 * kernel composes on the device (never the CPU fallback a kernel op would take). */
static em_status scoped_result(em_tensor *y, em_tensor **out, int *n_out);

EM__COMPOSITE(c_conv2d_relu) {
    UNUSED;
    const em_tensor *input = in[0], *weight = in[1], *bias = in[2];
    if (conv_operands_ok("conv2d_relu", input, weight, bias) != EM_OK) return em_last_status();
    em_attr a[4] = {pair_or(attrs, 0, NULL, 1), pair_or(attrs, 1, NULL, 0),
                    pair_or(attrs, 2, NULL, 1), aint(em__attr_int_or(attrs, 3, 1))};
    em_device dev = input->storage->device;
    em_status st;
    if (em__op_has_kernel(op_conv2d_relu, dev.type, input->dtype)) {
        em_tensor *y = NULL;
        st = call(op_conv2d_relu, input->dtype, in, "lxx", 3, a, &y);
        if (st == EM_OK) {
            *n_out = (out[0] = finish(y, input->dtype)) != NULL;
            return *n_out ? EM_OK : em_last_status();
        }
        if (st != EM_ERR_NOKERNEL) return st;
        em_clear_error();
    } else { /* no kernel here (not even through the CPU fallback): the op's own checks */
        em_tensor *none = bias ? NULL : em__empty(1, (const int64_t[]){0}, input->dtype, dev);
        em_tensor_meta m = {0};
        if (!bias && !none) return em_last_status();
        st = infer_conv2d(op_conv2d_relu, (const em_tensor *[]){input, weight, bias ? bias : none},
                          a, &m);
        em_tensor_release(none);
        if (st != EM_OK) return st;
    }
    if (em_scope_begin() != EM_OK) return em_last_status();
    return scoped_result(em_relu(em_conv2d(input, weight, bias, a[0].ints, a[1].ints, a[2].ints,
                                           a[3].v.i)),
                         out, n_out);
}

/* conv2d_backward_data(grad_output, weight; stride, padding, dilation, groups, input_size). */
EM__COMPOSITE(c_conv2d_bwd_data) {
    UNUSED;
    const em_tensor *gy = in[0], *weight = in[1];
    if (!check_float("conv2d_backward_data", "grad_output", gy) ||
        !check_float("conv2d_backward_data", "weight", weight))
        return em_last_status();
    if (!has_pair(attrs, 4))
        return em_set_error(EM_ERR_INVALID, "conv2d_backward_data: input_size is required");
    em_attr a[5] = {pair_or(attrs, 0, NULL, 1), pair_or(attrs, 1, NULL, 0),
                    pair_or(attrs, 2, NULL, 1), aint(em__attr_int_or(attrs, 3, 1)), attrs[4]};
    em_tensor *gx = NULL;
    if (call(op_conv2d_bwd_data, gy->dtype, in, "lx", 2, a, &gx) != EM_OK)
        return em_last_status();
    *n_out = (out[0] = finish(gx, gy->dtype)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* conv2d_backward_weight(input, grad_output; ..., kernel_size) -> (grad_weight, grad_bias). */
EM__COMPOSITE(c_conv2d_bwd_weight) {
    UNUSED;
    const em_tensor *input = in[0], *gy = in[1];
    if (!check_float("conv2d_backward_weight", "input", input) ||
        !check_float("conv2d_backward_weight", "grad_output", gy))
        return em_last_status();
    if (!has_pair(attrs, 4))
        return em_set_error(EM_ERR_INVALID, "conv2d_backward_weight: kernel_size is required");
    em_attr a[5] = {pair_or(attrs, 0, NULL, 1), pair_or(attrs, 1, NULL, 0),
                    pair_or(attrs, 2, NULL, 1), aint(em__attr_int_or(attrs, 3, 1)), attrs[4]};
    em_tensor *res[2] = {NULL, NULL};
    em_status st = call(op_conv2d_bwd_weight, input->dtype, in, "ll", 2, a, res);
    for (int i = 0; i < 2 && st == EM_OK; i++)
        if (!(res[i] = finish(res[i], input->dtype))) st = em_last_status();
    return outputs(st, res, 2, out, n_out);
}

/* max_pool2d(input; kernel_size, stride (absent: kernel_size), padding, dilation, ceil_mode)
 * -> (out, indices). */
EM__COMPOSITE(c_max_pool2d) {
    UNUSED;
    const em_tensor *input = in[0];
    if (!check_float("max_pool2d", "input", input)) return em_last_status();
    if (!has_pair(attrs, 0))
        return em_set_error(EM_ERR_INVALID, "max_pool2d: kernel_size is required");
    em_attr a[5] = {attrs[0], pair_or(attrs, 1, &attrs[0], 1), pair_or(attrs, 2, NULL, 0),
                    pair_or(attrs, 3, NULL, 1), abool(em__attr_bool_or(attrs, 4, false))};
    em_tensor *res[2] = {NULL, NULL};
    em_status st = call(op_max_pool2d, input->dtype, &input, "l", 1, a, res);
    if (st == EM_OK && !(res[0] = finish(res[0], input->dtype))) st = em_last_status();
    return outputs(st, res, 2, out, n_out);
}

/* max_pool2d_relu(input; as max_pool2d): the op's own kernel where the device has one for the
 * call's dtype that accepts the call; otherwise — none registered (bf16 and f16 on the CPU,
 * the CUDA backend, a third-party backend) or every one declined (EM_ERR_NOKERNEL, nothing
 * run or recorded) — max_pool2d(relu(x)), which has the same meaning and, on the CPU, the
 * same bits (values and indices). The op's own inference checks the call first on either
 * path, so its errors name max_pool2d_relu; a device without the kernel composes on the
 * device (never through the CPU fallback). */
EM__COMPOSITE(c_max_pool2d_relu) {
    UNUSED;
    const em_tensor *input = in[0];
    if (!check_float("max_pool2d_relu", "input", input)) return em_last_status();
    if (!has_pair(attrs, 0))
        return em_set_error(EM_ERR_INVALID, "max_pool2d_relu: kernel_size is required");
    em_attr a[5] = {attrs[0], pair_or(attrs, 1, &attrs[0], 1), pair_or(attrs, 2, NULL, 0),
                    pair_or(attrs, 3, NULL, 1), abool(em__attr_bool_or(attrs, 4, false))};
    em_device dev = input->storage->device;
    em_status st;
    if (em__op_has_kernel(op_max_pool2d_relu, dev.type, input->dtype)) {
        em_tensor *res[2] = {NULL, NULL};
        st = call(op_max_pool2d_relu, input->dtype, &input, "l", 1, a, res);
        if (st == EM_OK) {
            if (!(res[0] = finish(res[0], input->dtype))) st = em_last_status();
            return outputs(st, res, 2, out, n_out);
        }
        if (st != EM_ERR_NOKERNEL) return st;
        em_clear_error();
    } else { /* no kernel here (not even through the CPU fallback): the op's own checks */
        em_tensor_meta m[2] = {{0}};
        if ((st = infer_max_pool2d(op_max_pool2d_relu, &input, a, m)) != EM_OK) return st;
    }
    if (em_scope_begin() != EM_OK) return em_last_status();
    em_tensor *res[2] = {NULL, NULL}, *r = em_relu(input);
    st = r ? em_max_pool2d(r, a[0].ints, a[1].ints, a[2].ints, a[3].ints, a[4].v.b, &res[0],
                           &res[1])
           : em_last_status();
    for (int i = 0; i < 2; i++) /* the results outlive the scope; on failure none is ours */
        res[i] = st == EM_OK ? em_tensor_retain(res[i]) : NULL;
    em_scope_end();
    return outputs(st, res, 2, out, n_out);
}

/* max_pool2d_backward(grad_output, indices; input_size). */
EM__COMPOSITE(c_max_pool2d_bwd) {
    UNUSED;
    if (!check_float("max_pool2d_backward", "grad_output", in[0])) return em_last_status();
    if (!has_pair(attrs, 0))
        return em_set_error(EM_ERR_INVALID, "max_pool2d_backward: input_size is required");
    /* gx takes the indices' layout (layout_arg): from a channels-last forward it is
     * channels-last whether the grad is too or arrives row-major through a flatten's
     * backward; the CPU kernel reads either grad in place (another kernel declines the mix
     * and runs on contiguous copies, keep_layout then making gx channels-last). */
    em_tensor *gx = NULL;
    em_status st = call(op_max_pool2d_bwd, in[0]->dtype, in, "lj", 2, attrs, &gx);
    if (st != EM_OK) return em_last_status();
    *n_out = (out[0] = finish(gx, in[0]->dtype)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* avg_pool2d(input; kernel_size, stride, padding, ceil_mode, count_include_pad) and its
 * backward (grad_output; the same, input_size). */
EM__COMPOSITE(c_avg_pool) {
    UNUSED;
    const char *who = em_op_name(op);
    const em_tensor *t = in[0];
    bool bw = op == op_avg_pool2d_bwd;
    if (!check_float(who, "input", t)) return em_last_status();
    if (!has_pair(attrs, 0) || (bw && !has_pair(attrs, 5)))
        return em_set_error(EM_ERR_INVALID, "%s: kernel_size%s required", who,
                            bw ? " and input_size are" : " is");
    em_attr a[6] = {attrs[0], pair_or(attrs, 1, &attrs[0], 1), pair_or(attrs, 2, NULL, 0),
                    abool(em__attr_bool_or(attrs, 3, false)), abool(em__attr_bool_or(attrs, 4, true)),
                    bw ? attrs[5] : ints2(NULL, 0)};
    em_tensor *y = NULL;
    if (call(op, t->dtype, &t, "x", 1, a, &y) != EM_OK) return em_last_status();
    *n_out = (out[0] = finish(y, t->dtype)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}

/* adaptive_avg_pool2d(input; output_size) and its backward (grad_output; input_size). */
EM__COMPOSITE(c_adaptive) {
    UNUSED;
    const char *who = em_op_name(op);
    const em_tensor *t = in[0];
    if (!check_float(who, "input", t)) return em_last_status();
    if (!has_pair(attrs, 0)) return em_set_error(EM_ERR_INVALID, "%s: the size is required", who);
    em_tensor *y = NULL;
    if (call(op, t->dtype, &t, "x", 1, attrs, &y) != EM_OK) return em_last_status();
    *n_out = (out[0] = finish(y, t->dtype)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}


/* batch_norm(input, weight?, bias?, running_mean?, running_var?; training, momentum, eps)
 * -> (out, save_mean, save_invstd). Training updates running_mean and running_var in place.
 * Absent: training false, momentum 0.1, eps 1e-5 (PyTorch's). */
EM__COMPOSITE(c_batch_norm) {
    UNUSED;
    const em_tensor *input = in[0], *weight = in[1], *bias = in[2];
    em_tensor *running_mean = (em_tensor *)in[3], *running_var = (em_tensor *)in[4];
    bool training = em__attr_bool_or(attrs, 0, false);
    const em_tensor *opt[4] = {weight, bias, running_mean, running_var};
    static const char *const names[4] = {"weight", "bias", "running_mean", "running_var"};
    if (!check_float("batch_norm", "input", input)) return em_last_status();
    for (int i = 0; i < 4; i++)
        if (opt[i] && !check_float("batch_norm", names[i], opt[i])) return em_last_status();
    if (!training && (!running_mean || !running_var))
        return em_set_error(EM_ERR_INVALID, "batch_norm: evaluation mode (training = false) "
                            "needs running_mean and running_var");
    if (input->ndim >= 2 && training) {
        int64_t per = input->numel / (input->shape[1] ? input->shape[1] : 1);
        if (per == 1) {
            char b[160];
            return em_set_error(EM_ERR_INVALID, "batch_norm: expected more than 1 value per "
                                "channel when training, got input %s", SHAPE(input, b));
        }
    }
    em_dtype cd = compute_dtype(input->dtype);
    em_device dev = input->storage->device;
    /* The running stats the kernel updates: the caller's own when usable as they are (S,
     * contiguous), otherwise copies written back afterwards. */
    em_tensor *rs[2] = {prep(running_mean, cd, dev, false),
                        prep(running_var, cd, dev, false)},
              *user[2] = {running_mean, running_var};
    em_attr a[3] = {abool(training), afloat(em__attr_float_or(attrs, 1, 0.1)),
                    afloat(em__attr_float_or(attrs, 2, 1e-5))};
    em_tensor *res[3] = {NULL, NULL, NULL};
    em_status st = !rs[0] || !rs[1] ? em_last_status()
                                    : call(op_batch_norm, input->dtype,
                                           (const em_tensor *[]){input, weight, bias, rs[0], rs[1]},
                                           "xssss", 5, a, res);
    for (int i = 0; i < 2; i++) {
        if (st == EM_OK && training && user[i]) {
            if (rs[i] != user[i]) st = em_copy_(user[i], rs[i]);
            else em_tensor_bump_version(user[i]);
        }
        em_tensor_release(rs[i]);
    }
    if (st == EM_OK && !(res[0] = finish(res[0], input->dtype))) st = em_last_status();
    return outputs(st, res, 3, out, n_out);
}

/* batch_norm_backward(grad_output, input, weight?, save_mean, save_invstd; training). */
EM__COMPOSITE(c_batch_norm_bwd) {
    UNUSED;
    const em_tensor *chk[4] = {in[0], in[1], in[3], in[4]}, *input = in[1], *weight = in[2];
    for (int i = 0; i < 4; i++)
        if (!check_float("batch_norm_backward", "tensor", chk[i])) return em_last_status();
    if (weight && !check_float("batch_norm_backward", "weight", weight)) return em_last_status();
    em_attr a[1] = {abool(em__attr_bool_or(attrs, 0, true))};
    em_tensor *res[3] = {NULL, NULL, NULL};
    em_status st = call(op_batch_norm_bwd, input->dtype, in, "xxsss", 5, a, res);
    if (st == EM_OK && !(res[0] = finish(res[0], input->dtype))) st = em_last_status();
    for (int i = 1; i < 3 && st == EM_OK; i++)
        if (!(res[i] = finish(res[i], weight ? weight->dtype : compute_dtype(input->dtype))))
            st = em_last_status();
    return outputs(st, res, 3, out, n_out);
}

/* The normalized_shape given must be the last dims of x. */
static em_status ln_shape(const char *who, const em_tensor *x, int k, const int64_t *shape) {
    char b1[160], b2[160];
    if (k < 1 || k > x->ndim || !shape ||
        memcmp(shape, x->shape + x->ndim - k, sizeof(int64_t) * (size_t)k) != 0)
        return em_set_error(EM_ERR_SHAPE, "%s: normalized_shape %s is not the last dims of "
                            "input %s", who, shape ? em__shape_str(k, shape, b1, sizeof b1) : "NULL",
                            SHAPE(x, b2));
    return EM_OK;
}

/* layer_norm(input, weight?, bias?; normalized_ndim, eps, normalized_shape) -> (out, mean,
 * rstd). Absent eps: 1e-5. */
EM__COMPOSITE(c_layer_norm) {
    UNUSED;
    const em_tensor *input = in[0], *weight = in[1], *bias = in[2];
    if (!check_float("layer_norm", "input", input) ||
        (weight && !check_float("layer_norm", "weight", weight)) ||
        (bias && !check_float("layer_norm", "bias", bias)))
        return em_last_status();
    int k = (int)em__attr_int_or(attrs, 0, 0);
    bool listed = attrs && attrs[2].type == EM_ATTR_INTS && attrs[2].n == k;
    if (ln_shape("layer_norm", input, k, listed ? attrs[2].ints : NULL) != EM_OK)
        return em_last_status();
    em_attr a[3] = {aint(k), afloat(em__attr_float_or(attrs, 1, 1e-5)),
                    listed ? attrs[2] : (em_attr){.type = EM_ATTR_NONE}};
    em_tensor *res[3] = {NULL, NULL, NULL};
    em_status st = call(op_layer_norm, input->dtype, in, "xss", 3, a, res);
    if (st == EM_OK && !(res[0] = finish(res[0], input->dtype))) st = em_last_status();
    return outputs(st, res, 3, out, n_out);
}

/* layer_norm_backward(grad_output, input, mean, rstd, weight?; normalized_ndim). */
EM__COMPOSITE(c_layer_norm_bwd) {
    UNUSED;
    const em_tensor *input = in[1], *weight = in[4];
    for (int i = 0; i < 4; i++)
        if (!check_float("layer_norm_backward", "tensor", in[i])) return em_last_status();
    if (weight && !check_float("layer_norm_backward", "weight", weight)) return em_last_status();
    em_tensor *res[3] = {NULL, NULL, NULL};
    em_attr a[1] = {aint(em__attr_int_or(attrs, 0, 0))};
    em_status st = call(op_layer_norm_bwd, input->dtype, in, "xxsss", 5, a, res);
    if (st == EM_OK && !(res[0] = finish(res[0], input->dtype))) st = em_last_status();
    for (int i = 1; i < 3 && st == EM_OK; i++)
        if (!(res[i] = finish(res[i], weight ? weight->dtype : compute_dtype(input->dtype))))
            st = em_last_status();
    return outputs(st, res, 3, out, n_out);
}

/* softmax, log_softmax (input; dim) and their backward (grad_output, output; dim). */
EM__COMPOSITE(c_softmax) {
    (void)cap;
    const char *who = em_op_name(op);
    const em_tensor *gy = in[0];
    for (int i = 0; i < n_in; i++)
        if (!check_float(who, i ? "output" : "input", in[i])) return em_last_status();
    int d = em__wrap_dim((int)em__attr_int_or(attrs, 0, -1), gy->ndim ? gy->ndim : 1, who);
    if (d < 0) return em_last_status();
    em_attr a[1] = {aint(d)};
    em_tensor *r = NULL;
    if (call(op, gy->dtype, in, "xx", n_in, a, &r) != EM_OK) return em_last_status();
    *n_out = (out[0] = finish(r, gy->dtype)) != NULL;
    return *n_out ? EM_OK : em_last_status();
}
/* dropout: y = x * mask / (1 - p) with mask ~ bernoulli(1 - p) (bool), as PyTorch's
 * F.dropout computes it (the mask scaled in x's dtype, then multiplied); p == 1 gives zeros
 * and an all-false mask; outside training (or p == 0) y is x itself and the mask all true.
 * The derivative follows from the ops: the grad times the scaled mask. */
EM__COMPOSITE(c_dropout) {
    UNUSED;
    const em_tensor *x = in[0];
    double p = em__attr_float_or(attrs, 0, 0.5);
    bool training = em__attr_bool_or(attrs, 1, true);
    if (!check_float("dropout", "input", x)) return em_last_status();
    if (!(p >= 0 && p <= 1))
        return em_set_error(EM_ERR_INVALID, "dropout: p must be in [0, 1], got %g", p);
    em_device dev = x->storage->device;
    em_tensor *y = NULL, *mask = NULL;
    em_status st = EM_OK;
    if (!training || p == 0 || p == 1) {
        bool keep = !training || p == 0;
        mask = em__full(x->ndim, x->shape, keep, EM_BOOL, dev);
        em_tensor *zero = keep ? NULL : em__full(0, NULL, 0, x->dtype, dev);
        const em_tensor *args[2] = {x, zero};
        y = !mask ? NULL
            : keep ? em_tensor_retain((em_tensor *)x)
            : zero ? em__op1(op_mul, args, 2, NULL)
                   : NULL;
        em_tensor_release(zero);
        if (!y) st = em_last_status();
    } else if (!attrs || attrs[3].type != EM_ATTR_INT ||
               (attrs[2].type != EM_ATTR_INT && attrs[2].type != EM_ATTR_NONE)) {
        st = em_set_error(EM_ERR_INVALID, "dropout: attributes 'seed' and 'offset' are required "
                          "in training (em_dropout draws them from a generator)");
    } else {
        mask = em__empty(x->ndim, x->shape, EM_BOOL, dev);
        /* seed absent (a graph capture's relative offset) passes to the mask's draw as is */
        em_attr ba[3] = {attrs[2], attrs[3], afloat(1 - p)};
        st = mask ? em_op_call_out(op_bernoulli, NULL, 0, ba, &mask, 1) : em_last_status();
        em_tensor *m = st == EM_OK ? em__to_dtype(mask, x->dtype) : NULL;
        em_attr k = afloat(1 - p);
        em_tensor *scaled = m ? em__op1(op_div_scalar, (const em_tensor *const *)&m, 1, &k) : NULL;
        const em_tensor *args[2] = {x, scaled};
        y = scaled ? em__op1(op_mul, args, 2, NULL) : NULL;
        em_tensor_release(m);
        em_tensor_release(scaled);
        if (st == EM_OK && !y) st = em_last_status();
    }
    if (st != EM_OK) {
        em_tensor_release(y);
        em_tensor_release(mask);
        return st;
    }
    out[0] = y, out[1] = mask, *n_out = 2;
    return EM_OK;
}

/* A composite's result y (a reference in the composite's own scope) handed out, the scope
 * closed. */
static em_status scoped_result(em_tensor *y, em_tensor **out, int *n_out) {
    em_status st = y ? EM_OK : em_last_status();
    if (y) em_tensor_retain(y);
    em_scope_end();
    if (st != EM_OK) return st;
    out[0] = y, *n_out = 1;
    return EM_OK;
}

/* conv1d(input, weight, bias?; stride, padding, dilation, groups): conv2d over (1, L) planes.
 * Absent: stride 1, padding 0, dilation 1, groups 1. */
EM__COMPOSITE(c_conv1d) {
    UNUSED;
    const em_tensor *x = in[0], *w = in[1], *b = in[2];
    char b1[160], b2[160];
    int64_t s = em__attr_int_or(attrs, 0, 1), p = em__attr_int_or(attrs, 1, 0),
            d = em__attr_int_or(attrs, 2, 1), g = em__attr_int_or(attrs, 3, 1);
    if (!check_float("conv1d", "input", x) || !check_float("conv1d", "weight", w) ||
        (b && !check_float("conv1d", "bias", b)))
        return em_last_status();
    if (x->ndim != 3 || w->ndim != 3)
        return em_set_error(EM_ERR_SHAPE, "conv1d: expected a 3-D (N, C, L) input and a 3-D "
                            "(O, C/groups, K) weight, got %s and %s", SHAPE(x, b1), SHAPE(w, b2));
    if (s <= 0 || d <= 0 || p < 0 || g <= 0)
        return em_set_error(EM_ERR_INVALID, "conv1d: stride %lld, dilation %lld and groups %lld "
                            "must be positive and padding %lld non-negative", (long long)s,
                            (long long)d, (long long)g, (long long)p);
    if (w->shape[1] * g != x->shape[1] || w->shape[0] % g != 0)
        return em_set_error(EM_ERR_SHAPE, "conv1d: input %s has %lld channels but weight %s with "
                            "%lld groups expects %lld (weight.shape[1] * groups), and %lld output "
                            "channels must divide into the groups", SHAPE(x, b1),
                            (long long)x->shape[1], SHAPE(w, b2), (long long)g,
                            (long long)(w->shape[1] * g), (long long)w->shape[0]);
    if (x->shape[2] + 2 * p < d * (w->shape[2] - 1) + 1)
        return em_set_error(EM_ERR_SHAPE, "conv1d: the kernel (%lld, dilated %lld) of weight %s "
                            "is longer than the padded input (%lld) of input %s",
                            (long long)w->shape[2], (long long)(d * (w->shape[2] - 1) + 1),
                            SHAPE(w, b2), (long long)(x->shape[2] + 2 * p), SHAPE(x, b1));
    if (em_scope_begin() != EM_OK) return em_last_status();
    const int64_t st2[2] = {1, s}, pd2[2] = {0, p}, dl2[2] = {1, d};
    em_tensor *y = em_squeeze(em_conv2d(em_unsqueeze(x, 2), em_unsqueeze(w, 2), b, st2, pd2,
                                        dl2, g), 2);
    return scoped_result(y, out, n_out);
}

/* conv_transpose2d(input, weight, bias?; stride, padding, output_padding, groups, dilation):
 * conv2d_backward_data of input with the output size the arguments give, plus the bias.
 * Absent pairs: stride 1, padding 0, output_padding 0, dilation 1; groups 1. */
EM__COMPOSITE(c_conv_transpose2d) {
    UNUSED;
    const em_tensor *x = in[0], *w = in[1], *b = in[2];
    char b1[160], b2[160];
    em_attr s = pair_or(attrs, 0, NULL, 1), p = pair_or(attrs, 1, NULL, 0),
            op_ = pair_or(attrs, 2, NULL, 0), d = pair_or(attrs, 4, NULL, 1);
    int64_t g = em__attr_int_or(attrs, 3, 1);
    if (!check_float("conv_transpose2d", "input", x) ||
        !check_float("conv_transpose2d", "weight", w) ||
        (b && !check_float("conv_transpose2d", "bias", b)))
        return em_last_status();
    if (x->ndim != 4 || w->ndim != 4)
        return em_set_error(EM_ERR_SHAPE, "conv_transpose2d: expected a 4-D (N, C, H, W) input and "
                            "a 4-D (C, O/groups, kH, kW) weight, got %s and %s", SHAPE(x, b1),
                            SHAPE(w, b2));
    if (g <= 0 || w->shape[0] != x->shape[1] || x->shape[1] % g != 0)
        return em_set_error(EM_ERR_SHAPE, "conv_transpose2d: input %s has %lld channels but "
                            "weight %s expects %lld (weight.shape[0]), which must divide into "
                            "%lld groups", SHAPE(x, b1), (long long)x->shape[1], SHAPE(w, b2),
                            (long long)w->shape[0], (long long)g);
    int64_t O = w->shape[1] * g, size[2];
    for (int i = 0; i < 2; i++) {
        if (s.ints[i] <= 0 || d.ints[i] <= 0 || p.ints[i] < 0 || op_.ints[i] < 0 ||
            op_.ints[i] >= s.ints[i])
            return em_set_error(EM_ERR_INVALID, "conv_transpose2d: stride (%lld, %lld) and "
                                "dilation (%lld, %lld) must be positive, padding (%lld, %lld) "
                                "non-negative and output_padding (%lld, %lld) non-negative and "
                                "smaller than stride", (long long)s.ints[0], (long long)s.ints[1],
                                (long long)d.ints[0], (long long)d.ints[1], (long long)p.ints[0],
                                (long long)p.ints[1], (long long)op_.ints[0],
                                (long long)op_.ints[1]);
        size[i] = (x->shape[2 + i] - 1) * s.ints[i] - 2 * p.ints[i] +
                  d.ints[i] * (w->shape[2 + i] - 1) + op_.ints[i] + 1;
    }
    if (size[0] < 1 || size[1] < 1)
        return em_set_error(EM_ERR_SHAPE, "conv_transpose2d: input %s with weight %s, stride (%lld, "
                            "%lld) and padding (%lld, %lld) gives an output of %lld x %lld",
                            SHAPE(x, b1), SHAPE(w, b2), (long long)s.ints[0], (long long)s.ints[1],
                            (long long)p.ints[0], (long long)p.ints[1], (long long)size[0],
                            (long long)size[1]);
    if (b && !(b->ndim == 1 && b->shape[0] == O))
        return em_set_error(EM_ERR_SHAPE, "conv_transpose2d: bias %s does not match the %lld "
                            "output channels of weight %s", SHAPE(b, b1), (long long)O,
                            SHAPE(w, b2));
    if (em_scope_begin() != EM_OK) return em_last_status();
    em_tensor *y = em_conv2d_backward_data(x, w, size, s.ints, p.ints, d.ints, g);
    if (b) y = em_add(y, em_reshape(b, 4, (const int64_t[]){1, O, 1, 1}));
    return scoped_result(y, out, n_out);
}

/* group_norm(input, weight?, bias?; num_groups, eps): layer_norm over each (sample, group)
 * row of input viewed as (N, G, C/G * spatial), then weight and bias per channel. Absent eps:
 * 1e-5. */
EM__COMPOSITE(c_group_norm) {
    UNUSED;
    const em_tensor *x = in[0], *w = in[1], *b = in[2];
    char b1[160], b2[160];
    int64_t G = em__attr_int_or(attrs, 0, 0);
    double eps = em__attr_float_or(attrs, 1, 1e-5);
    if (!check_float("group_norm", "input", x) || (w && !check_float("group_norm", "weight", w)) ||
        (b && !check_float("group_norm", "bias", b)))
        return em_last_status();
    if ((w && w->dtype != x->dtype) || (b && b->dtype != x->dtype))
        return em_set_error(EM_ERR_DTYPE, "group_norm: input (%s), weight (%s) and bias (%s) must "
                            "have the same dtype", em_dtype_name(x->dtype),
                            w ? em_dtype_name(w->dtype) : "none", b ? em_dtype_name(b->dtype) : "none");
    if (x->ndim < 2)
        return em_set_error(EM_ERR_SHAPE, "group_norm: expected an input of at least 2 dims "
                            "(N, C, ...), got %s", SHAPE(x, b1));
    int64_t N = x->shape[0], C = x->shape[1];
    if (G <= 0 || C % G != 0)
        return em_set_error(EM_ERR_INVALID, "group_norm: num_groups %lld must be positive and "
                            "divide the %lld channels of input %s", (long long)G, (long long)C,
                            SHAPE(x, b1));
    const em_tensor *pr[2] = {w, b};
    for (int i = 0; i < 2; i++)
        if (pr[i] && !(pr[i]->ndim == 1 && pr[i]->shape[0] == C))
            return em_set_error(EM_ERR_SHAPE, "group_norm: %s %s does not match the %lld channels "
                                "of input %s", i ? "bias" : "weight", SHAPE(pr[i], b1),
                                (long long)C, SHAPE(x, b2));
    int64_t D = em__numel(x->ndim - 2, x->shape + 2) * (C / G);
    if (em_scope_begin() != EM_OK) return em_last_status();
    em_tensor *y = NULL;
    if (D == 0 || N == 0) {
        y = em_mul_scalar(x, 1); /* nothing to normalise: an empty result of x's shape */
    } else if (em_layer_norm(em_reshape(x, 3, (const int64_t[]){N, G, D}), 1, &D, NULL, NULL,
                             eps, &y, NULL, NULL) == EM_OK) {
        y = em_reshape(y, x->ndim, x->shape);
    }
    int64_t pshape[EM_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) pshape[i] = i == 1 ? C : 1;
    if (w) y = em_mul(y, em_reshape(w, x->ndim, pshape));
    if (b) y = em_add(y, em_reshape(b, x->ndim, pshape));
    return scoped_result(y, out, n_out);
}
#undef UNUSED

/* ---- public functions: one line each ---------------------------------------------------------- */

#define P2(p) ((p) ? ints2((p), 0) : (em_attr){.type = EM_ATTR_NONE})

em_tensor *em_conv2d(const em_tensor *input, const em_tensor *weight, const em_tensor *bias,
                     const int64_t stride[2], const int64_t padding[2],
                     const int64_t dilation[2], int64_t groups) {
    return em__call1(op_conv2d, 3, EM__IN(input, weight, bias),
                     EM__ATTRS(P2(stride), P2(padding), P2(dilation), aint(groups)));
}
em_tensor *em_conv2d_relu(const em_tensor *input, const em_tensor *weight, const em_tensor *bias,
                          const int64_t stride[2], const int64_t padding[2],
                          const int64_t dilation[2], int64_t groups) {
    return em__call1(op_conv2d_relu, 3, EM__IN(input, weight, bias),
                     EM__ATTRS(P2(stride), P2(padding), P2(dilation), aint(groups)));
}
em_tensor *em_conv2d_backward_data(const em_tensor *grad_output, const em_tensor *weight,
                                   const int64_t input_size[2], const int64_t stride[2],
                                   const int64_t padding[2], const int64_t dilation[2],
                                   int64_t groups) {
    return em__call1(op_conv2d_bwd_data, 2, EM__IN(grad_output, weight),
                     EM__ATTRS(P2(stride), P2(padding), P2(dilation), aint(groups),
                               P2(input_size)));
}
em_status em_conv2d_backward_weight(const em_tensor *input, const em_tensor *grad_output,
                                    const int64_t kernel_size[2], const int64_t stride[2],
                                    const int64_t padding[2], const int64_t dilation[2],
                                    int64_t groups, em_tensor **grad_weight,
                                    em_tensor **grad_bias) {
    return em__callv(op_conv2d_bwd_weight, 2, EM__IN(input, grad_output),
                     EM__ATTRS(P2(stride), P2(padding), P2(dilation), aint(groups),
                               P2(kernel_size)),
                     (em_tensor **const[]){grad_weight, grad_bias}, 2);
}
/* max_pool2d and max_pool2d_relu: the same inputs, attributes and outputs. */
static em_status max_pool_call(const em_op *op, const em_tensor *input,
                               const int64_t kernel_size[2], const int64_t stride[2],
                               const int64_t padding[2], const int64_t dilation[2],
                               bool ceil_mode, em_tensor **out, em_tensor **indices) {
    return em__callv(op, 1, &input,
                     EM__ATTRS(P2(kernel_size), P2(stride), P2(padding), P2(dilation),
                               abool(ceil_mode)),
                     (em_tensor **const[]){out, indices}, 2);
}
em_status em_max_pool2d(const em_tensor *input, const int64_t kernel_size[2],
                        const int64_t stride[2], const int64_t padding[2],
                        const int64_t dilation[2], bool ceil_mode, em_tensor **out,
                        em_tensor **indices) {
    return max_pool_call(op_max_pool2d, input, kernel_size, stride, padding, dilation,
                         ceil_mode, out, indices);
}
em_status em_max_pool2d_relu(const em_tensor *input, const int64_t kernel_size[2],
                             const int64_t stride[2], const int64_t padding[2],
                             const int64_t dilation[2], bool ceil_mode, em_tensor **out,
                             em_tensor **indices) {
    return max_pool_call(op_max_pool2d_relu, input, kernel_size, stride, padding, dilation,
                         ceil_mode, out, indices);
}
em_tensor *em_max_pool2d_backward(const em_tensor *grad_output, const em_tensor *indices,
                                  const int64_t input_size[2]) {
    return em__call1(op_max_pool2d_bwd, 2, EM__IN(grad_output, indices),
                     EM__ATTRS(P2(input_size)));
}
em_tensor *em_avg_pool2d(const em_tensor *input, const int64_t kernel_size[2],
                         const int64_t stride[2], const int64_t padding[2], bool ceil_mode,
                         bool count_include_pad) {
    return em__call1(op_avg_pool2d, 1, &input,
                     EM__ATTRS(P2(kernel_size), P2(stride), P2(padding), abool(ceil_mode),
                               abool(count_include_pad)));
}
em_tensor *em_avg_pool2d_backward(const em_tensor *grad_output, const int64_t input_size[2],
                                  const int64_t kernel_size[2], const int64_t stride[2],
                                  const int64_t padding[2], bool ceil_mode,
                                  bool count_include_pad) {
    return em__call1(op_avg_pool2d_bwd, 1, &grad_output,
                     EM__ATTRS(P2(kernel_size), P2(stride), P2(padding), abool(ceil_mode),
                               abool(count_include_pad), P2(input_size)));
}
em_tensor *em_adaptive_avg_pool2d(const em_tensor *input, const int64_t output_size[2]) {
    return em__call1(op_adaptive_avg_pool2d, 1, &input, EM__ATTRS(P2(output_size)));
}
em_tensor *em_adaptive_avg_pool2d_backward(const em_tensor *grad_output,
                                           const int64_t input_size[2]) {
    return em__call1(op_adaptive_avg_pool2d_bwd, 1, &grad_output, EM__ATTRS(P2(input_size)));
}
em_status em_batch_norm(const em_tensor *input, const em_tensor *weight, const em_tensor *bias,
                        em_tensor *running_mean, em_tensor *running_var, bool training,
                        double momentum, double eps, em_tensor **out, em_tensor **save_mean,
                        em_tensor **save_invstd) {
    return em__callv(op_batch_norm, 5, EM__IN(input, weight, bias, running_mean, running_var),
                     EM__ATTRS(abool(training), afloat(momentum), afloat(eps)),
                     (em_tensor **const[]){out, save_mean, save_invstd}, 3);
}
em_status em_batch_norm_backward(const em_tensor *grad_output, const em_tensor *input,
                                 const em_tensor *weight, const em_tensor *save_mean,
                                 const em_tensor *save_invstd, bool training,
                                 em_tensor **grad_input, em_tensor **grad_weight,
                                 em_tensor **grad_bias) {
    return em__callv(op_batch_norm_bwd, 5,
                     EM__IN(grad_output, input, weight, save_mean, save_invstd),
                     EM__ATTRS(abool(training)),
                     (em_tensor **const[]){grad_input, grad_weight, grad_bias}, 3);
}
em_status em_layer_norm(const em_tensor *input, int normalized_ndim,
                        const int64_t *normalized_shape, const em_tensor *weight,
                        const em_tensor *bias, double eps, em_tensor **out, em_tensor **mean,
                        em_tensor **rstd) {
    return em__callv(op_layer_norm, 3, EM__IN(input, weight, bias),
                     EM__ATTRS(aint(normalized_ndim), afloat(eps),
                               em__attr_ints64(normalized_ndim, normalized_shape)),
                     (em_tensor **const[]){out, mean, rstd}, 3);
}
em_status em_layer_norm_backward(const em_tensor *grad_output, const em_tensor *input,
                                 const em_tensor *mean, const em_tensor *rstd,
                                 const em_tensor *weight, int normalized_ndim,
                                 em_tensor **grad_input, em_tensor **grad_weight,
                                 em_tensor **grad_bias) {
    return em__callv(op_layer_norm_bwd, 5, EM__IN(grad_output, input, mean, rstd, weight),
                     EM__ATTRS(aint(normalized_ndim)),
                     (em_tensor **const[]){grad_input, grad_weight, grad_bias}, 3);
}
em_tensor *em_softmax(const em_tensor *input, int dim) {
    return em__call1(op_softmax, 1, &input, EM__ATTRS(aint(dim)));
}
em_tensor *em_log_softmax(const em_tensor *input, int dim) {
    return em__call1(op_log_softmax, 1, &input, EM__ATTRS(aint(dim)));
}
em_tensor *em_softmax_backward(const em_tensor *grad_output, const em_tensor *output, int dim) {
    return em__call1(op_softmax_bwd, 2, EM__IN(grad_output, output), EM__ATTRS(aint(dim)));
}
em_tensor *em_log_softmax_backward(const em_tensor *grad_output, const em_tensor *output,
                                   int dim) {
    return em__call1(op_log_softmax_bwd, 2, EM__IN(grad_output, output), EM__ATTRS(aint(dim)));
}
em_tensor *em_conv1d(const em_tensor *input, const em_tensor *weight, const em_tensor *bias,
                     int64_t stride, int64_t padding, int64_t dilation, int64_t groups) {
    return em__call1(op_conv1d, 3, EM__IN(input, weight, bias),
                     EM__ATTRS(aint(stride), aint(padding), aint(dilation), aint(groups)));
}
em_tensor *em_conv_transpose2d(const em_tensor *input, const em_tensor *weight,
                               const em_tensor *bias, const int64_t stride[2],
                               const int64_t padding[2], const int64_t output_padding[2],
                               int64_t groups, const int64_t dilation[2]) {
    return em__call1(op_conv_transpose2d, 3, EM__IN(input, weight, bias),
                     EM__ATTRS(P2(stride), P2(padding), P2(output_padding), aint(groups),
                               P2(dilation)));
}
em_tensor *em_group_norm(const em_tensor *input, int64_t num_groups, const em_tensor *weight,
                         const em_tensor *bias, double eps) {
    return em__call1(op_group_norm, 3, EM__IN(input, weight, bias),
                     EM__ATTRS(aint(num_groups), afloat(eps)));
}
#undef P2

/* The generator's blocks for the mask (4 draws a block, as em_bernoulli_) become the op's seed
 * and offset (in a graph capture on x's device: no seed, the offset relative to the capture's
 * generator state); nothing is drawn when the mask is not random. */
em_tensor *em_dropout(const em_tensor *x, double p, bool training, em_generator *gen,
                      em_tensor **mask) {
    bool draws = x && training && p > 0 && p < 1, graph = false;
    em_rng_state s = {0};
    if (draws && em__rng_draw(gen, ((uint64_t)x->numel + 3) / 4, x->storage->device,
                              "dropout", true, &s, &graph) != EM_OK)
        return NULL;
    em_tensor *y = NULL;
    em_status st = em__callv(op_dropout, 1, &x, EM__ATTRS(afloat(p), abool(training),
                                                          em__rng_seed_attr(s, graph),
                                                          aint((int64_t)s.offset)),
                             (em_tensor **const[]){&y, mask}, 2);
    return st == EM_OK ? y : NULL;
}
