/*
 * onnx_layers.c — the ONNX nodes of ember-layers' classes, one em_onnx_layer_class each (the
 * "onnx_layer" kind). Each reads the layer's resolved options and parameters, never its
 * private state, so it depends only on ember/module.h (and ember/ops.h for the LSTM/GRU
 * gates' order). Eval mode throughout: Dropout is an Identity, BatchNorm uses its running
 * statistics.
 *
 *   Linear             Gemm (transB = 1) on 2-D inputs; MatMul(x, Transpose(W)) + Add above
 *   Conv2d             Conv (pads [top, left, bottom, right]: 'same' puts an odd extra at the end);
 *                      activation relu (the fused conv2d_relu): Conv, Relu
 *   MaxPool2d          MaxPool; activation relu (the fused max_pool2d_relu): Relu, MaxPool
 *   AvgPool2d          AveragePool
 *   AdaptiveAvgPool2d  GlobalAveragePool for 1x1, else AveragePool where the size divides
 *   BatchNorm1d/2d     BatchNormalization (running statistics)
 *   LayerNorm          LayerNormalization (opset 17); below: ReduceMean, Sub, Mul, ReduceMean,
 *                      Add, Sqrt, Div, Mul, Add
 *   Dropout, Identity  Identity
 *   ReLU, LeakyReLU, Tanh, Sigmoid, Softmax, LogSoftmax: the ONNX op of the same meaning;
 *   SiLU               Sigmoid, Mul;   GELU: Div, Erf, Add, Mul, Mul (tanh form: its formula)
 *   Flatten            Flatten (to the last dim), else Reshape
 *   Embedding          Gather
 *   Conv1d             Conv (1-D);  ConvTranspose2d: ConvTranspose (PyTorch's weight layout)
 *   GroupNorm          Reshape (N, G, -1), LayerNorm's decomposition on the last axis,
 *                      Reshape back, Mul, Add (GroupNormalization is opset 18)
 *   LSTM, GRU          one node per layer (both directions), gates reordered into
 *                      initializers named after the state-dict entries ("weight_ih_l0:onnx_iofc"),
 *                      Transpose/Reshape of Y to (T, N, D H); `output` picks Y, Y_h, Y_c
 *   LSTMCell, GRUCell  an LSTM/GRU node over one step (zero initial states), Reshape
 *   MultiheadAttention self-attention: in_proj_weight, Split, heads by Reshape/Transpose,
 *                      Softmax(q k^T scale (+ causal mask)) v, out_proj; no mask inputs
 *   TransformerEncoderLayer, TransformerEncoder: their children (pre or post norm)
 *   PositionalEncoding, LearnedPositionalEncoding: Add of a Slice of pe / weight
 *   Sequential         the children in order; Residual: branch, shortcut, Add; Parallel:
 *                      branches then Concat or Add
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/onnx.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/tensor.h"
#include "onnx_internal.h"

#define N EM_ONNX_NAME_MAX

static em_status pair(const em_options *o, const char *name, const int64_t *dflt, int64_t out[2]) {
    int64_t v[EM_OPT_MAX_LIST];
    int n = em_options_has(o, name) ? em_options_ints(o, name, v, EM_OPT_MAX_LIST) : 0;
    if (n == 0 && dflt) {
        out[0] = dflt[0];
        out[1] = dflt[1];
    } else if (n == 1) {
        out[0] = out[1] = v[0];
    } else if (n == 2) {
        out[0] = v[0];
        out[1] = v[1];
    } else {
        return em_set_error(EM_ERR_INVALID, "option '%s' has %d values", name, n);
    }
    return EM_OK;
}

static em_status unary(em_onnx_builder *b, const char *op, const char *in, char *out) {
    return b->node(b, op, 1, (const char *[]){in}, 0, NULL, out);
}

static em_status binary(em_onnx_builder *b, const char *op, const char *x, const char *y,
                        char *out) {
    return b->node(b, op, 2, (const char *[]){x, y}, 0, NULL, out);
}

/* A float32 scalar constant. */
static em_status scalar(em_onnx_builder *b, double v, char *out) {
    em_tensor *t = em_scalar(v, EM_F32);
    return t ? b->constant(b, t, out) : em_last_status();
}

/* ---- Linear ------------------------------------------------------------------------------- */

static em_status linear_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                          char *out) {
    em_tensor *w = em_module_parameter(m, "weight"), *bias = em_module_parameter(m, "bias");
    char wn[N], bn[N] = "";
    em_status st = b->initializer(b, "weight", w, wn);
    if (st == EM_OK && bias) st = b->initializer(b, "bias", bias, bn);
    if (st != EM_OK) return st;
    if (em_tensor_ndim(x) == 2)
        return b->node(b, "Gemm", bias ? 3 : 2, (const char *[]){in, wn, bn}, 1,
                       (em_onnx_attr[]){OX_INT("transB", 1)}, out);
    char wt[N], y[N];
    if ((st = b->node(b, "Transpose", 1, (const char *[]){wn}, 1,
                      (em_onnx_attr[]){OX_INTS("perm", 2, ((int64_t[]){1, 0}))}, wt)) != EM_OK ||
        (st = binary(b, "MatMul", in, wt, bias ? y : out)) != EM_OK)
        return st;
    return bias ? binary(b, "Add", y, bn, out) : EM_OK;
}

/* ---- Conv2d ------------------------------------------------------------------------------- */

static em_status conv_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                        char *out) {
    (void)x;
    const em_options *o = em_module_options(m);
    em_tensor *w = em_module_parameter(m, "weight"), *bias = em_module_parameter(m, "bias");
    int64_t k[2] = {em_tensor_size(w, 2), em_tensor_size(w, 3)}, s[2], d[2], pads[4] = {0};
    em_status st;
    if ((st = pair(o, "stride", NULL, s)) != EM_OK || (st = pair(o, "dilation", NULL, d)) != EM_OK)
        return st;
    const char *mode = em_options_type(o, "padding") == EM_OPT_STRING
                           ? em_options_string(o, "padding") : NULL;
    if (mode && strcmp(mode, "same") == 0) {
        for (int i = 0; i < 2; i++) {
            int64_t total = d[i] * (k[i] - 1);
            pads[i] = total / 2;
            pads[i + 2] = total - total / 2; /* PyTorch pads the odd one at the end */
        }
    } else if (!mode) {
        int64_t p[2];
        if ((st = pair(o, "padding", NULL, p)) != EM_OK) return st;
        pads[0] = pads[2] = p[0];
        pads[1] = pads[3] = p[1];
    }
    char wn[N], bn[N] = "";
    if ((st = b->initializer(b, "weight", w, wn)) != EM_OK ||
        (bias && (st = b->initializer(b, "bias", bias, bn)) != EM_OK))
        return st;
    em_onnx_attr a[] = {OX_INTS("dilations", 2, d), OX_INT("group", em_options_int(o, "groups")),
                        OX_INTS("kernel_shape", 2, k), OX_INTS("pads", 4, pads),
                        OX_INTS("strides", 2, s)};
    /* activation relu (the fused conv2d_relu): its decomposition, Conv then Relu */
    bool relu = strcmp(em_options_string(o, "activation"), "relu") == 0;
    char y[N];
    if ((st = b->node(b, "Conv", bias ? 3 : 2, (const char *[]){in, wn, bn}, 5, a,
                      relu ? y : out)) != EM_OK || !relu)
        return st;
    return unary(b, "Relu", y, out);
}

/* ---- pooling ------------------------------------------------------------------------------ */

static em_status pool_common(const em_options *o, int64_t k[2], int64_t s[2], int64_t pads[4]) {
    em_status st;
    int64_t p[2];
    if ((st = pair(o, "kernel_size", NULL, k)) != EM_OK || (st = pair(o, "stride", k, s)) != EM_OK ||
        (st = pair(o, "padding", NULL, p)) != EM_OK)
        return st;
    pads[0] = pads[2] = p[0];
    pads[1] = pads[3] = p[1];
    return EM_OK;
}

static em_status maxpool_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                           char *out) {
    (void)x;
    const em_options *o = em_module_options(m);
    int64_t k[2], s[2], pads[4], d[2] = {1, 1};
    em_status st = pool_common(o, k, s, pads);
    if (st == EM_OK && em_options_has(o, "dilation")) st = pair(o, "dilation", NULL, d);
    if (st != EM_OK) return st;
    em_onnx_attr a[] = {OX_INT("ceil_mode", em_options_bool(o, "ceil_mode")),
                        OX_INTS("dilations", 2, d), OX_INTS("kernel_shape", 2, k),
                        OX_INTS("pads", 4, pads), OX_INTS("strides", 2, s)};
    /* activation relu (the fused max_pool2d_relu): its decomposition, Relu then MaxPool */
    char r[N];
    if (strcmp(em_options_string(o, "activation"), "relu") == 0) {
        if ((st = unary(b, "Relu", in, r)) != EM_OK) return st;
        in = r;
    }
    return b->node(b, "MaxPool", 1, (const char *[]){in}, 5, a, out);
}

static em_status avgpool_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                           char *out) {
    (void)x;
    const em_options *o = em_module_options(m);
    int64_t k[2], s[2], pads[4];
    em_status st = pool_common(o, k, s, pads);
    if (st != EM_OK) return st;
    em_onnx_attr a[] = {OX_INT("ceil_mode", em_options_bool(o, "ceil_mode")),
                        OX_INT("count_include_pad", em_options_bool(o, "count_include_pad")),
                        OX_INTS("kernel_shape", 2, k), OX_INTS("pads", 4, pads),
                        OX_INTS("strides", 2, s)};
    return b->node(b, "AveragePool", 1, (const char *[]){in}, 5, a, out);
}

static em_status adaptive_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                            char *out) {
    int64_t os[2];
    em_status st = pair(em_module_options(m), "output_size", NULL, os);
    if (st != EM_OK) return st;
    if (os[0] == 1 && os[1] == 1) return unary(b, "GlobalAveragePool", in, out);
    int nd = em_tensor_ndim(x);
    int64_t h = em_tensor_size(x, nd - 2), w = em_tensor_size(x, nd - 1);
    if (h % os[0] || w % os[1])
        return em_set_error(EM_ERR_INVALID, "output_size [%lld, %lld] does not divide the input's "
                            "[%lld, %lld]: ONNX has no adaptive pooling for uneven windows",
                            (long long)os[0], (long long)os[1], (long long)h, (long long)w);
    int64_t k[2] = {h / os[0], w / os[1]}, pads[4] = {0};
    em_onnx_attr a[] = {OX_INTS("kernel_shape", 2, k), OX_INTS("pads", 4, pads),
                        OX_INTS("strides", 2, k)};
    return b->node(b, "AveragePool", 1, (const char *[]){in}, 3, a, out);
}

/* ---- normalisation ------------------------------------------------------------------------ */

static em_status bn_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                      char *out) {
    (void)x;
    const em_options *o = em_module_options(m);
    em_tensor *rm = em_module_buffer(m, "running_mean"), *rv = em_module_buffer(m, "running_var");
    if (!rm || !rv)
        return em_set_error(EM_ERR_INVALID, "track_running_stats is false: in eval it normalises "
                            "by each batch's statistics, which ONNX's BatchNormalization "
                            "(inference) does not do");
    em_tensor *w = em_module_parameter(m, "weight"), *bias = em_module_parameter(m, "bias");
    char wn[N], bn[N], mn[N], vn[N];
    em_status st;
    if (w) {
        if ((st = b->initializer(b, "weight", w, wn)) != EM_OK ||
            (st = b->initializer(b, "bias", bias, bn)) != EM_OK)
            return st;
    } else {
        int64_t c = em_tensor_size(rm, 0);
        em_tensor *one = em_ones(1, &c, EM_F32, em_cpu()), *zero = em_zeros(1, &c, EM_F32, em_cpu());
        if (!one || !zero) return em_last_status();
        if ((st = b->constant(b, one, wn)) != EM_OK || (st = b->constant(b, zero, bn)) != EM_OK)
            return st;
    }
    if ((st = b->initializer(b, "running_mean", rm, mn)) != EM_OK ||
        (st = b->initializer(b, "running_var", rv, vn)) != EM_OK)
        return st;
    em_onnx_attr a[] = {OX_FLOAT("epsilon", em_options_float(o, "eps"))};
    return b->node(b, "BatchNormalization", 5, (const char *[]){in, wn, bn, mn, vn}, 1, a, out);
}

static em_status ln_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                      char *out) {
    (void)x;
    const em_options *o = em_module_options(m);
    int64_t shape[EM_OPT_MAX_LIST];
    int k = em_options_ints(o, "normalized_shape", shape, EM_OPT_MAX_LIST);
    double eps = em_options_float(o, "eps");
    em_tensor *w = em_module_parameter(m, "weight"), *bias = em_module_parameter(m, "bias");
    char wn[N] = "", bn[N] = "";
    em_status st = EM_OK;
    if (w) st = b->initializer(b, "weight", w, wn);
    if (st == EM_OK && bias) st = b->initializer(b, "bias", bias, bn);
    if (st != EM_OK) return st;
    if (b->opset >= 17) {
        if (!w) {
            em_tensor *one = em_ones(k, shape, EM_F32, em_cpu());
            if (!one || (st = b->constant(b, one, wn)) != EM_OK) return em_last_status();
        }
        em_onnx_attr a[] = {OX_INT("axis", -k), OX_FLOAT("epsilon", eps)};
        return b->node(b, "LayerNormalization", bias ? 3 : 2, (const char *[]){in, wn, bn}, 2, a,
                       out);
    }
    /* opset 13..16: (x - mean) / sqrt(var + eps) * weight + bias, var the biased variance */
    int64_t axes[EM_OPT_MAX_LIST];
    for (int i = 0; i < k; i++) axes[i] = i - k;
    em_onnx_attr red[] = {OX_INTS("axes", k, axes), OX_INT("keepdims", 1)};
    char mean[N], d[N], sq[N], var[N], epsn[N], ve[N], sd[N], y[N], yw[N];
    if ((st = b->node(b, "ReduceMean", 1, (const char *[]){in}, 2, red, mean)) != EM_OK ||
        (st = binary(b, "Sub", in, mean, d)) != EM_OK ||
        (st = binary(b, "Mul", d, d, sq)) != EM_OK ||
        (st = b->node(b, "ReduceMean", 1, (const char *[]){sq}, 2, red, var)) != EM_OK ||
        (st = scalar(b, eps, epsn)) != EM_OK || (st = binary(b, "Add", var, epsn, ve)) != EM_OK ||
        (st = unary(b, "Sqrt", ve, sd)) != EM_OK)
        return st;
    if (!w && !bias) return binary(b, "Div", d, sd, out);
    if ((st = binary(b, "Div", d, sd, y)) != EM_OK) return st;
    if (!bias) return binary(b, "Mul", y, wn, out);
    if ((st = binary(b, "Mul", y, wn, yw)) != EM_OK) return st;
    return binary(b, "Add", yw, bn, out);
}

/* ---- activations and shape layers --------------------------------------------------------- */

#define SIMPLE(fn, op)                                                                         \
    static em_status fn(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,   \
                        char *out) {                                                           \
        (void)m;                                                                               \
        (void)x;                                                                               \
        return unary(b, op, in, out);                                                          \
    }
SIMPLE(relu_x, "Relu")
SIMPLE(tanh_x, "Tanh")
SIMPLE(sigmoid_x, "Sigmoid")
SIMPLE(identity_x, "Identity")

static em_status leaky_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                         char *out) {
    (void)x;
    em_onnx_attr a[] = {OX_FLOAT("alpha", em_options_float(em_module_options(m), "negative_slope"))};
    return b->node(b, "LeakyRelu", 1, (const char *[]){in}, 1, a, out);
}

static em_status silu_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                        char *out) {
    (void)m;
    (void)x;
    char s[N];
    em_status st = unary(b, "Sigmoid", in, s);
    return st == EM_OK ? binary(b, "Mul", in, s, out) : st;
}

static em_status gelu_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                        char *out) {
    (void)x;
    const char *approx = em_options_string(em_module_options(m), "approximate");
    char c[N], t[N], u[N], one[N], half[N], v[N], w[N];
    em_status st;
    if (strcmp(approx, "tanh") == 0) {
        /* 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
        char x2[N], x3[N], k[N], a[N], s2[N];
        if ((st = binary(b, "Mul", in, in, x2)) != EM_OK ||
            (st = binary(b, "Mul", x2, in, x3)) != EM_OK || (st = scalar(b, 0.044715, k)) != EM_OK ||
            (st = binary(b, "Mul", x3, k, a)) != EM_OK || (st = binary(b, "Add", in, a, u)) != EM_OK ||
            (st = scalar(b, sqrt(2.0 / M_PI), s2)) != EM_OK ||
            (st = binary(b, "Mul", u, s2, c)) != EM_OK || (st = unary(b, "Tanh", c, t)) != EM_OK)
            return st;
    } else {
        /* 0.5 x (1 + erf(x / sqrt 2)) */
        char r2[N];
        if ((st = scalar(b, sqrt(2.0), r2)) != EM_OK || (st = binary(b, "Div", in, r2, c)) != EM_OK ||
            (st = unary(b, "Erf", c, t)) != EM_OK)
            return st;
    }
    if ((st = scalar(b, 1.0, one)) != EM_OK || (st = binary(b, "Add", t, one, v)) != EM_OK ||
        (st = binary(b, "Mul", in, v, w)) != EM_OK || (st = scalar(b, 0.5, half)) != EM_OK)
        return st;
    return binary(b, "Mul", w, half, out);
}

static em_status softmax_common(em_onnx_builder *b, em_module *m, const char *op, const char *in,
                                char *out) {
    em_onnx_attr a[] = {OX_INT("axis", em_options_int(em_module_options(m), "dim"))};
    return b->node(b, op, 1, (const char *[]){in}, 1, a, out);
}
static em_status softmax_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                           char *out) {
    (void)x;
    return softmax_common(b, m, "Softmax", in, out);
}
static em_status log_softmax_x(em_onnx_builder *b, em_module *m, const char *in,
                               const em_tensor *x, char *out) {
    (void)x;
    return softmax_common(b, m, "LogSoftmax", in, out);
}

static em_status flatten_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                           char *out) {
    const em_options *o = em_module_options(m);
    int nd = em_tensor_ndim(x);
    int s = (int)em_options_int(o, "start_dim"), e = (int)em_options_int(o, "end_dim");
    if (s < 0) s += nd;
    if (e < 0) e += nd;
    if (s < 0 || e >= nd || s > e)
        return em_set_error(EM_ERR_SHAPE, "start_dim %d and end_dim %d do not fit a %d-D input",
                            (int)em_options_int(o, "start_dim"), (int)em_options_int(o, "end_dim"),
                            nd);
    if (e == nd - 1) {
        em_onnx_attr a[] = {OX_INT("axis", s)};
        return b->node(b, "Flatten", 1, (const char *[]){in}, 1, a, out);
    }
    /* dims kept: 0 (copy the input's: the batch stays dynamic) for dim 0, sizes after */
    int64_t shape[EM_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < s; i++) shape[k++] = i == 0 ? 0 : em_tensor_size(x, i);
    shape[k++] = s == 0 ? -1 : 1;
    if (s == 0) {
        for (int i = e + 1; i < nd; i++) shape[k++] = em_tensor_size(x, i);
    } else {
        int64_t merged = 1;
        for (int i = s; i <= e; i++) merged *= em_tensor_size(x, i);
        shape[k - 1] = merged;
        for (int i = e + 1; i < nd; i++) shape[k++] = em_tensor_size(x, i);
    }
    em_tensor *st = em_from_data(shape, 1, (int64_t[]){k}, EM_I64, em_cpu());
    char sn[N];
    em_status rc = st ? b->constant(b, st, sn) : em_last_status();
    return rc == EM_OK ? binary(b, "Reshape", in, sn, out) : rc;
}

static em_status embedding_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                             char *out) {
    (void)x;
    char wn[N];
    em_status st = b->initializer(b, "weight", em_module_parameter(m, "weight"), wn);
    if (st != EM_OK) return st;
    em_onnx_attr a[] = {OX_INT("axis", 0)};
    return b->node(b, "Gather", 2, (const char *[]){wn, in}, 1, a, out);
}

/* ---- Conv1d, ConvTranspose2d ---------------------------------------------------------------- */

static em_status conv1d_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                          char *out) {
    (void)x;
    const em_options *o = em_module_options(m);
    em_tensor *w = em_module_parameter(m, "weight"), *bias = em_module_parameter(m, "bias");
    int64_t k = em_tensor_size(w, 2), s = em_options_int(o, "stride"),
            d = em_options_int(o, "dilation"), pads[2] = {0, 0};
    const char *mode = em_options_type(o, "padding") == EM_OPT_STRING
                           ? em_options_string(o, "padding") : NULL;
    if (mode && strcmp(mode, "same") == 0) {
        int64_t total = d * (k - 1);
        pads[0] = total / 2;
        pads[1] = total - total / 2; /* PyTorch pads the odd one at the end */
    } else if (!mode) {
        pads[0] = pads[1] = em_options_int(o, "padding");
    }
    char wn[N], bn[N] = "";
    em_status st;
    if ((st = b->initializer(b, "weight", w, wn)) != EM_OK ||
        (bias && (st = b->initializer(b, "bias", bias, bn)) != EM_OK))
        return st;
    em_onnx_attr a[] = {OX_INTS("dilations", 1, &d), OX_INT("group", em_options_int(o, "groups")),
                        OX_INTS("kernel_shape", 1, &k), OX_INTS("pads", 2, pads),
                        OX_INTS("strides", 1, &s)};
    return b->node(b, "Conv", bias ? 3 : 2, (const char *[]){in, wn, bn}, 5, a, out);
}

/* ONNX's ConvTranspose takes PyTorch's weight layout (C_in, C_out / group, kH, kW) and its
 * output size: stride (in - 1) + output_padding + dilation (k - 1) + 1 - both pads. */
static em_status convt_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                         char *out) {
    (void)x;
    const em_options *o = em_module_options(m);
    em_tensor *w = em_module_parameter(m, "weight"), *bias = em_module_parameter(m, "bias");
    int64_t k[2] = {em_tensor_size(w, 2), em_tensor_size(w, 3)}, s[2], d[2], p[2], op[2];
    em_status st;
    if ((st = pair(o, "stride", NULL, s)) != EM_OK || (st = pair(o, "dilation", NULL, d)) != EM_OK ||
        (st = pair(o, "padding", NULL, p)) != EM_OK ||
        (st = pair(o, "output_padding", NULL, op)) != EM_OK)
        return st;
    int64_t pads[4] = {p[0], p[1], p[0], p[1]};
    char wn[N], bn[N] = "";
    if ((st = b->initializer(b, "weight", w, wn)) != EM_OK ||
        (bias && (st = b->initializer(b, "bias", bias, bn)) != EM_OK))
        return st;
    em_onnx_attr a[] = {OX_INTS("dilations", 2, d), OX_INT("group", em_options_int(o, "groups")),
                        OX_INTS("kernel_shape", 2, k), OX_INTS("output_padding", 2, op),
                        OX_INTS("pads", 4, pads), OX_INTS("strides", 2, s)};
    return b->node(b, "ConvTranspose", bias ? 3 : 2, (const char *[]){in, wn, bn}, 6, a, out);
}

/* An int64 vector constant (shapes, axes). */
static em_status ints_const(em_onnx_builder *b, int n, const int64_t *v, char *out) {
    em_tensor *t = em_from_data(v, 1, (int64_t[]){n}, EM_I64, em_cpu());
    return t ? b->constant(b, t, out) : em_last_status();
}

static em_status reshape_to(em_onnx_builder *b, const char *in, int n, const int64_t *shape,
                            char *out) {
    char sn[N];
    em_status st = ints_const(b, n, shape, sn);
    return st == EM_OK ? binary(b, "Reshape", in, sn, out) : st;
}

static em_status transpose(em_onnx_builder *b, const char *in, int n, const int64_t *perm,
                           char *out) {
    return b->node(b, "Transpose", 1, (const char *[]){in}, 1,
                   (em_onnx_attr[]){OX_INTS("perm", n, perm)}, out);
}

/* ---- GroupNorm ---------------------------------------------------------------------------- */

/* GroupNormalization is opset 18: for 13..17 its decomposition. x (N, C, ...) is reshaped to
 * (N, G, -1), normalised over the last axis as LayerNorm's decomposition (biased variance),
 * reshaped back to x's shape (Shape of x: the batch stays dynamic), then weight and bias
 * (reshaped to (C, 1, ...)) scale and shift per channel. */
static em_status gn_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                      char *out) {
    const em_options *o = em_module_options(m);
    int nd = em_tensor_ndim(x);
    int64_t G = em_options_int(o, "num_groups"), C = em_options_int(o, "num_channels");
    double eps = em_options_float(o, "eps");
    em_tensor *w = em_module_parameter(m, "weight"), *bias = em_module_parameter(m, "bias");
    if (nd < 2 || em_tensor_size(x, 1) != C)
        return em_set_error(EM_ERR_SHAPE, "expected an input (N, %lld, ...), got %d dims",
                            (long long)C, nd);
    em_onnx_attr red[] = {OX_INTS("axes", 1, ((int64_t[]){2})), OX_INT("keepdims", 1)};
    char g[N], mean[N], d[N], sq[N], var[N], epsn[N], ve[N], sd[N], y[N], shp[N];
    em_status st;
    if ((st = reshape_to(b, in, 3, (int64_t[]){0, G, -1}, g)) != EM_OK ||
        (st = b->node(b, "ReduceMean", 1, (const char *[]){g}, 2, red, mean)) != EM_OK ||
        (st = binary(b, "Sub", g, mean, d)) != EM_OK ||
        (st = binary(b, "Mul", d, d, sq)) != EM_OK ||
        (st = b->node(b, "ReduceMean", 1, (const char *[]){sq}, 2, red, var)) != EM_OK ||
        (st = scalar(b, eps, epsn)) != EM_OK || (st = binary(b, "Add", var, epsn, ve)) != EM_OK ||
        (st = unary(b, "Sqrt", ve, sd)) != EM_OK || (st = binary(b, "Div", d, sd, y)) != EM_OK ||
        (st = unary(b, "Shape", in, shp)) != EM_OK)
        return st;
    if (!w) return binary(b, "Reshape", y, shp, out);
    char yb[N], wn[N], bn[N], wr[N], br[N], yw[N];
    int64_t pshape[EM_MAX_DIMS] = {C};
    for (int i = 1; i < nd - 1; i++) pshape[i] = 1;
    if ((st = binary(b, "Reshape", y, shp, yb)) != EM_OK ||
        (st = b->initializer(b, "weight", w, wn)) != EM_OK ||
        (st = b->initializer(b, "bias", bias, bn)) != EM_OK ||
        (st = reshape_to(b, wn, nd - 1, pshape, wr)) != EM_OK ||
        (st = reshape_to(b, bn, nd - 1, pshape, br)) != EM_OK ||
        (st = binary(b, "Mul", yb, wr, yw)) != EM_OK)
        return st;
    return binary(b, "Add", yw, br, out);
}

/* ---- LSTM, GRU ---------------------------------------------------------------------------- */

/* PyTorch's gate blocks (rows of H) in ONNX's order: LSTM i,f,g,o -> i,o,f,c (0, 3, 1, 2);
 * GRU r,z,n -> z,r,h (1, 0, 2). */
static const int lstm_order[4] = {0, 3, 1, 2}, gru_order[3] = {1, 0, 2};

static em_tensor *gates(const em_tensor *t, int G, const int *order, int64_t H) {
    const em_tensor *parts[4];
    for (int i = 0; i < G; i++)
        if (!(parts[i] = em_narrow(t, 0, order[i] * H, H))) return NULL;
    return em_cat(G, parts, 0);
}

/* The parameter kind ("weight_ih") of layer l, direction d: the cells' have no suffix. */
static void rnn_pname(char *buf, size_t cap, const char *kind, bool cell, int64_t l, int64_t d) {
    if (cell) snprintf(buf, cap, "%s", kind);
    else snprintf(buf, cap, "%s_l%lld%s", kind, (long long)l, d ? "_reverse" : "");
}

/* One layer's W, R and B (or none) for ONNX: directions stacked, gates reordered. They are
 * initializers named after the state-dict entries they are made of, joined by '+', with the
 * gate order: "weight_ih_l0:onnx_iofc", "weight_ih_l0+weight_ih_l0_reverse:onnx_iofc",
 * "bias_ih_l0+bias_hh_l0:onnx_zrh" (a cell's "weight_ih:onnx_iofc"), under the layer's path. */
static em_status rnn_params(em_onnx_builder *b, em_module *m, bool gru, bool cell, int64_t l,
                            int64_t D, int64_t H, char *wn, char *rn, char *bn) {
    int G = gru ? 3 : 4;
    const int *order = gru ? gru_order : lstm_order;
    const char *tag = gru ? ":onnx_zrh" : ":onnx_iofc";
    em_tensor *ws[2] = {NULL, NULL}, *rs[2] = {NULL, NULL}, *bs[2] = {NULL, NULL};
    char wname[N] = "", rname[N] = "", bname[N] = "";
    bool has_bias = true;
    for (int64_t d = 0; d < D; d++) {
        char n1[64], n2[64], n3[64], n4[64];
        rnn_pname(n1, sizeof n1, "weight_ih", cell, l, d);
        rnn_pname(n2, sizeof n2, "weight_hh", cell, l, d);
        rnn_pname(n3, sizeof n3, "bias_ih", cell, l, d);
        rnn_pname(n4, sizeof n4, "bias_hh", cell, l, d);
        em_tensor *wih = em_module_parameter(m, n1), *whh = em_module_parameter(m, n2),
                  *bih = em_module_parameter(m, n3), *bhh = em_module_parameter(m, n4);
        if (!wih || !whh)
            return em_set_error(EM_ERR_STATE, "has no parameter %s or %s", n1, n2);
        if (!(ws[d] = gates(wih, G, order, H)) || !(rs[d] = gates(whh, G, order, H)))
            return em_last_status();
        const char *sep = d ? "+" : "";
        size_t u = strlen(wname), v = strlen(rname), k = strlen(bname);
        snprintf(wname + u, sizeof wname - u, "%s%s", sep, n1);
        snprintf(rname + v, sizeof rname - v, "%s%s", sep, n2);
        snprintf(bname + k, sizeof bname - k, "%s%s+%s", sep, n3, n4);
        has_bias = bih && bhh;
        if (has_bias) {
            em_tensor *gi = gates(bih, G, order, H), *gh = gates(bhh, G, order, H);
            if (!gi || !gh || !(bs[d] = em_cat(2, (const em_tensor *const[]){gi, gh}, 0)))
                return em_last_status();
        }
    }
    size_t u = strlen(wname), v = strlen(rname), k = strlen(bname);
    snprintf(wname + u, sizeof wname - u, "%s", tag);
    snprintf(rname + v, sizeof rname - v, "%s", tag);
    snprintf(bname + k, sizeof bname - k, "%s", tag);
    em_tensor *W = em_stack((int)D, (const em_tensor *const *)ws, 0),
              *R = em_stack((int)D, (const em_tensor *const *)rs, 0);
    em_status st;
    if (!W || !R) return em_last_status();
    if ((st = b->initializer(b, wname, W, wn)) != EM_OK ||
        (st = b->initializer(b, rname, R, rn)) != EM_OK)
        return st;
    bn[0] = '\0';
    if (!has_bias) return EM_OK;
    em_tensor *B = em_stack((int)D, (const em_tensor *const *)bs, 0);
    return B ? b->initializer(b, bname, B, bn) : em_last_status();
}

/* The layers as chained LSTM/GRU nodes (eval: no dropout between them). Between layers and at
 * the end, Y (T, D, N, H) becomes (T, N, D H) by Transpose and Reshape. */
static em_status rnn_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       bool gru, char *out) {
    const em_options *o = em_module_options(m);
    int64_t H = em_options_int(o, "hidden_size"), L = em_options_int(o, "num_layers");
    int64_t D = em_options_bool(o, "bidirectional") ? 2 : 1;
    bool bf = em_options_bool(o, "batch_first");
    const char *output = em_options_string(o, "output");
    if (em_tensor_ndim(x) != 3)
        return em_set_error(EM_ERR_SHAPE, "the example input has %d dims; export takes a "
                            "batched input (%s, input_size), not an unbatched one",
                            em_tensor_ndim(x), bf ? "N, T" : "T, N");
    if (L > 64) return em_set_error(EM_ERR_RANGE, "num_layers=%lld: at most 64 export", (long long)L);
    static const int64_t swap01[3] = {1, 0, 2};
    char cur[N], hn[64][N], cn[64][N];
    em_status st;
    if (bf) {
        if ((st = transpose(b, in, 3, swap01, cur)) != EM_OK) return st;
    } else {
        snprintf(cur, sizeof cur, "%s", in);
    }
    const char *dir = D == 2 ? "bidirectional" : "forward";
    bool want_y = strcmp(output, "sequence") == 0;
    for (int64_t l = 0; l < L; l++) {
        char wn[N], rn[N], bn[N], y[N], yt[N];
        if ((st = rnn_params(b, m, gru, false, l, D, H, wn, rn, bn)) != EM_OK) return st;
        em_onnx_attr a[3] = {{.name = "direction", .type = EM_ONNX_ATTR_STRING, .s = dir},
                             OX_INT("hidden_size", H), OX_INT("linear_before_reset", 1)};
        char *outs[3] = {y, hn[l], cn[l]};
        st = ox_builder_node_n(b, gru ? "GRU" : "LSTM", bn[0] ? 4 : 3,
                               (const char *[]){cur, wn, rn, bn}, gru ? 3 : 2, a, gru ? 2 : 3,
                               outs);
        if (st != EM_OK) return st;
        if (l + 1 < L || want_y) {
            if ((st = transpose(b, y, 4, (int64_t[]){0, 2, 1, 3}, yt)) != EM_OK ||
                (st = reshape_to(b, yt, 3, (int64_t[]){0, 0, -1}, cur)) != EM_OK)
                return st;
        }
    }
    if (want_y) {
        if (bf) return transpose(b, cur, 3, swap01, out);
        return unary(b, "Identity", cur, out);
    }
    if (strcmp(output, "last") == 0) {
        char t[N];
        if ((st = transpose(b, hn[L - 1], 3, swap01, t)) != EM_OK) return st;
        return reshape_to(b, t, 2, (int64_t[]){0, -1}, out);
    }
    bool c = strcmp(output, "c_n") == 0;
    const char *parts[64];
    for (int64_t l = 0; l < L; l++) parts[l] = c ? cn[l] : hn[l];
    if (L == 1) return unary(b, "Identity", parts[0], out);
    return b->node(b, "Concat", (int)L, parts, 1, (em_onnx_attr[]){OX_INT("axis", 0)}, out);
}

static em_status lstm_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                        char *out) {
    return rnn_x(b, m, in, x, false, out);
}
static em_status gru_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       char *out) {
    return rnn_x(b, m, in, x, true, out);
}

/* LSTMCell, GRUCell: one step as an LSTM/GRU node over a sequence of length 1, h0 (and c0)
 * absent, i.e. zeros, as the cell's forward of one input. x (N, I) is reshaped to (1, N, I);
 * Y_h (or Y_c: LSTMCell's output c) (1, N, H) back to (N, H). */
static em_status cell_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                        bool gru, char *out) {
    const em_options *o = em_module_options(m);
    int64_t H = em_options_int(o, "hidden_size"), I = em_options_int(o, "input_size");
    if (em_tensor_ndim(x) != 2)
        return em_set_error(EM_ERR_SHAPE, "the example input has %d dims; export takes a "
                            "batched input (N, input_size), not an unbatched one",
                            em_tensor_ndim(x));
    char seq[N], wn[N], rn[N], bn[N], y[N], hn[N], cn[N];
    em_status st;
    if ((st = reshape_to(b, in, 3, (int64_t[]){1, -1, I}, seq)) != EM_OK ||
        (st = rnn_params(b, m, gru, true, 0, 1, H, wn, rn, bn)) != EM_OK)
        return st;
    em_onnx_attr a[3] = {{.name = "direction", .type = EM_ONNX_ATTR_STRING, .s = "forward"},
                         OX_INT("hidden_size", H), OX_INT("linear_before_reset", 1)};
    char *outs[3] = {y, hn, cn};
    if ((st = ox_builder_node_n(b, gru ? "GRU" : "LSTM", bn[0] ? 4 : 3,
                                (const char *[]){seq, wn, rn, bn}, gru ? 3 : 2, a, gru ? 2 : 3,
                                outs)) != EM_OK)
        return st;
    bool c = !gru && strcmp(em_options_string(o, "output"), "c") == 0;
    return reshape_to(b, c ? cn : hn, 2, (int64_t[]){-1, H}, out);
}
static em_status lstmcell_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                            char *out) {
    return cell_x(b, m, in, x, false, out);
}
static em_status grucell_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                           char *out) {
    return cell_x(b, m, in, x, true, out);
}

/* ---- MultiheadAttention, TransformerEncoderLayer, TransformerEncoder ---------------------- */

/* A 0-dim constant of dtype dt. */
static em_status scalar_of(em_onnx_builder *b, double v, em_dtype dt, char *out) {
    em_tensor *t = em_scalar(v, dt);
    return t ? b->constant(b, t, out) : em_last_status();
}

/* The causal mask of scores s (B, H, L, L) as an additive (L, L) float: -inf where key j > query
 * i, else 0. L comes from Shape(s), so it follows a dynamic sequence dim (dim 0 of an input
 * that is not batch_first is the graph's dynamic dim). Range, Reshape, Greater, Where exist
 * in every opset 13..17 (Trilu only from 14). */
static em_status causal_mask(em_onnx_builder *b, const char *s, char *out) {
    char shp[N], starts[N], ends[N], axes[N], lt[N], empty[N], ls[N], zero[N], one[N], r[N],
        col[N], gt[N], ninf[N], fz[N];
    em_tensor *e = em_zeros(1, (int64_t[]){0}, EM_I64, em_cpu());
    em_status st;
    if (!e) return em_last_status();
    if ((st = unary(b, "Shape", s, shp)) != EM_OK ||
        (st = ints_const(b, 1, (int64_t[]){2}, starts)) != EM_OK ||
        (st = ints_const(b, 1, (int64_t[]){3}, ends)) != EM_OK ||
        (st = ints_const(b, 1, (int64_t[]){0}, axes)) != EM_OK ||
        (st = b->node(b, "Slice", 4, (const char *[]){shp, starts, ends, axes}, 0, NULL, lt)) !=
            EM_OK ||
        (st = b->constant(b, e, empty)) != EM_OK || (st = binary(b, "Reshape", lt, empty, ls)) != EM_OK ||
        (st = scalar_of(b, 0, EM_I64, zero)) != EM_OK || (st = scalar_of(b, 1, EM_I64, one)) != EM_OK ||
        (st = b->node(b, "Range", 3, (const char *[]){zero, ls, one}, 0, NULL, r)) != EM_OK ||
        (st = reshape_to(b, r, 2, (int64_t[]){-1, 1}, col)) != EM_OK ||
        (st = binary(b, "Greater", r, col, gt)) != EM_OK ||
        (st = scalar_of(b, -INFINITY, EM_F32, ninf)) != EM_OK ||
        (st = scalar_of(b, 0, EM_F32, fz)) != EM_OK)
        return st;
    return b->node(b, "Where", 3, (const char *[]){gt, ninf, fz}, 0, NULL, out);
}

/* Self-attention on the one input (what a Sequential or an encoder layer passes), no mask
 * but the causal option: in_proj_weight (3E, E) stacked q;k;v as the initializer of its
 * state-dict name, x W^T + in_proj_bias, Split into q, k, v, heads by Reshape/Transpose,
 * Softmax(q k^T / sqrt(E / H) (+ the causal mask)) v, heads merged, out_proj (its Linear's
 * exporter, out_proj.weight and out_proj.bias). (L, B, E) inputs are transposed to (B, L, E)
 * and back. key_padding_mask and attn_mask are forward inputs, which a one-input graph has
 * not: the padding mask of variable-length batches is refused by the export option
 * variable_length (docs/onnx.md). */
static em_status mha_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       char *out) {
    const em_options *o = em_module_options(m);
    int64_t E = em_options_int(o, "embed_dim"), Hh = em_options_int(o, "num_heads"), D = E / Hh;
    bool bf = em_options_bool(o, "batch_first"), causal = em_options_bool(o, "causal");
    em_tensor *w = em_module_parameter(m, "in_proj_weight"), *bias = em_module_parameter(m, "in_proj_bias");
    if (!w)
        return em_set_error(EM_ERR_INVALID, "kdim or vdim differs from embed_dim (separate "
                            "q/k/v_proj_weight): export takes self-attention on one input, "
                            "whose key and value have embed_dim features");
    if (em_tensor_ndim(x) != 3 || em_tensor_size(x, 2) != E)
        return em_set_error(EM_ERR_SHAPE, "the example input has %d dims; export takes a "
                            "batched input (%s, %lld), not an unbatched one", em_tensor_ndim(x),
                            bf ? "B, L" : "L, B", (long long)E);
    static const int64_t swap01[3] = {1, 0, 2}, heads[4] = {0, 2, 1, 3}, keys[4] = {0, 2, 3, 1};
    char xb[N], wn[N], wt[N], bn[N], qkv0[N], qkv[N], sp[N], q[N], k[N], v[N], qr[N], kr[N],
        vr[N], qh[N], kt[N], vh[N], sc[N], scale[N], s2[N], mask[N], s3[N], p[N], a[N], at[N],
        ar[N], y[N];
    em_status st;
    if (bf) snprintf(xb, sizeof xb, "%s", in);
    else if ((st = transpose(b, in, 3, swap01, xb)) != EM_OK) return st;
    if ((st = b->initializer(b, "in_proj_weight", w, wn)) != EM_OK ||
        (bias && (st = b->initializer(b, "in_proj_bias", bias, bn)) != EM_OK) ||
        (st = transpose(b, wn, 2, (int64_t[]){1, 0}, wt)) != EM_OK ||
        (st = binary(b, "MatMul", xb, wt, bias ? qkv0 : qkv)) != EM_OK ||
        (bias && (st = binary(b, "Add", qkv0, bn, qkv)) != EM_OK) ||
        (st = ints_const(b, 3, (int64_t[]){E, E, E}, sp)) != EM_OK)
        return st;
    char *parts[3] = {q, k, v};
    if ((st = ox_builder_node_n(b, "Split", 2, (const char *[]){qkv, sp}, 1,
                                (em_onnx_attr[]){OX_INT("axis", 2)}, 3, parts)) != EM_OK ||
        (st = reshape_to(b, q, 4, (int64_t[]){0, 0, Hh, D}, qr)) != EM_OK ||
        (st = reshape_to(b, k, 4, (int64_t[]){0, 0, Hh, D}, kr)) != EM_OK ||
        (st = reshape_to(b, v, 4, (int64_t[]){0, 0, Hh, D}, vr)) != EM_OK ||
        (st = transpose(b, qr, 4, heads, qh)) != EM_OK ||
        (st = transpose(b, kr, 4, keys, kt)) != EM_OK ||
        (st = transpose(b, vr, 4, heads, vh)) != EM_OK ||
        (st = binary(b, "MatMul", qh, kt, sc)) != EM_OK ||
        (st = scalar(b, 1.0 / sqrt((double)D), scale)) != EM_OK ||
        (st = binary(b, "Mul", sc, scale, causal ? s2 : s3)) != EM_OK ||
        (causal && ((st = causal_mask(b, s2, mask)) != EM_OK ||
                    (st = binary(b, "Add", s2, mask, s3)) != EM_OK)) ||
        (st = b->node(b, "Softmax", 1, (const char *[]){s3}, 1,
                      (em_onnx_attr[]){OX_INT("axis", -1)}, p)) != EM_OK ||
        (st = binary(b, "MatMul", p, vh, a)) != EM_OK ||
        (st = transpose(b, a, 4, heads, at)) != EM_OK ||
        (st = reshape_to(b, at, 3, (int64_t[]){0, 0, E}, ar)) != EM_OK)
        return st;
    /* out_proj's example: (B, L, E) */
    int64_t B = em_tensor_size(x, bf ? 0 : 1), L = em_tensor_size(x, bf ? 1 : 0);
    em_tensor *ex = em_zeros(3, (int64_t[]){B, L, E}, em_tensor_dtype(x), em_tensor_device(x));
    if (!ex) return em_last_status();
    if ((st = b->child(b, "out_proj", ar, ex, bf ? out : y, NULL)) != EM_OK) return st;
    return bf ? EM_OK : transpose(b, y, 3, swap01, out);
}

/* The feed-forward block: linear2(activation(linear1(h))) (its dropout an Identity in eval:
 * left out); GELU exact, as the layer's em_gelu(x, NULL). */
static em_status enc_ff(em_onnx_builder *b, const char *h, const em_tensor *x, bool gelu,
                        char *out) {
    char l1[N], act[N];
    em_tensor *y1 = NULL;
    em_status st = b->child(b, "linear1", h, x, l1, &y1);
    if (st != EM_OK) return st;
    if (gelu) {
        char r2[N], c[N], t[N], one[N], v[N], w[N], half[N];
        if ((st = scalar(b, sqrt(2.0), r2)) != EM_OK || (st = binary(b, "Div", l1, r2, c)) != EM_OK ||
            (st = unary(b, "Erf", c, t)) != EM_OK || (st = scalar(b, 1.0, one)) != EM_OK ||
            (st = binary(b, "Add", t, one, v)) != EM_OK || (st = binary(b, "Mul", l1, v, w)) != EM_OK ||
            (st = scalar(b, 0.5, half)) != EM_OK || (st = binary(b, "Mul", w, half, act)) != EM_OK)
            return st;
    } else if ((st = unary(b, "Relu", l1, act)) != EM_OK) {
        return st;
    }
    return b->child(b, "linear2", act, y1, out, NULL);
}

/* Post-norm: norm2(h + ff(h)), h = norm1(x + self_attn(x)); pre-norm (norm_first):
 * h + ff(norm2(h)), h = x + self_attn(norm1(x)). The dropouts are identities in eval. */
static em_status enc_layer_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                             char *out) {
    const em_options *o = em_module_options(m);
    bool pre = em_options_bool(o, "norm_first");
    bool gelu = strcmp(em_options_string(o, "activation"), "gelu") == 0;
    char n1[N], sa[N], r1[N], n2[N], f[N], r2[N];
    em_status st;
    if (pre) {
        if ((st = b->child(b, "norm1", in, x, n1, NULL)) != EM_OK ||
            (st = b->child(b, "self_attn", n1, x, sa, NULL)) != EM_OK ||
            (st = binary(b, "Add", in, sa, r1)) != EM_OK ||
            (st = b->child(b, "norm2", r1, x, n2, NULL)) != EM_OK ||
            (st = enc_ff(b, n2, x, gelu, f)) != EM_OK)
            return st;
        return binary(b, "Add", r1, f, out);
    }
    if ((st = b->child(b, "self_attn", in, x, sa, NULL)) != EM_OK ||
        (st = binary(b, "Add", in, sa, r1)) != EM_OK ||
        (st = b->child(b, "norm1", r1, x, n1, NULL)) != EM_OK ||
        (st = enc_ff(b, n1, x, gelu, f)) != EM_OK || (st = binary(b, "Add", n1, f, r2)) != EM_OK)
        return st;
    return b->child(b, "norm2", r2, x, out, NULL);
}

/* layers (a Sequential of TransformerEncoderLayers), then norm when there is one. */
static em_status enc_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       char *out) {
    if (!em_module_child(m, "norm")) return b->child(b, "layers", in, x, out, NULL);
    char y[N];
    em_status st = b->child(b, "layers", in, x, y, NULL);
    return st == EM_OK ? b->child(b, "norm", y, x, out, NULL) : st;
}

/* ---- PositionalEncoding, LearnedPositionalEncoding ---------------------------------------- */

/* x + rows [0, L) of the table (PositionalEncoding's buffer pe (max_len, 1, d), the learned
 * one's weight (max_len, d), as the initializer of its state-dict name): L is Shape(x)'s
 * sequence dim (dynamic when it is the graph's dim 0), the rows a Slice, reshaped to
 * (1, L, d) or (L, 1, d) to broadcast. Dropout: an identity in eval. */
static em_status pos_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       const char *table_name, em_tensor *table, char *out) {
    const em_options *o = em_module_options(m);
    int64_t d = em_options_int(o, "d_model");
    bool bf = em_options_bool(o, "batch_first");
    if (em_tensor_ndim(x) != 3 || em_tensor_size(x, 2) != d)
        return em_set_error(EM_ERR_SHAPE, "the example input has %d dims; export takes an input "
                            "(%s, %lld)", em_tensor_ndim(x), bf ? "B, L" : "L, B", (long long)d);
    int64_t la = bf ? 1 : 0;
    char tn[N], shp[N], s0[N], e0[N], ax[N], lt[N], z[N], rows[N], rr[N];
    em_status st;
    if ((st = b->initializer(b, table_name, table, tn)) != EM_OK ||
        (st = unary(b, "Shape", in, shp)) != EM_OK ||
        (st = ints_const(b, 1, &la, s0)) != EM_OK ||
        (st = ints_const(b, 1, (int64_t[]){la + 1}, e0)) != EM_OK ||
        (st = ints_const(b, 1, (int64_t[]){0}, ax)) != EM_OK ||
        (st = b->node(b, "Slice", 4, (const char *[]){shp, s0, e0, ax}, 0, NULL, lt)) != EM_OK ||
        (st = ints_const(b, 1, (int64_t[]){0}, z)) != EM_OK ||
        (st = b->node(b, "Slice", 4, (const char *[]){tn, z, lt, ax}, 0, NULL, rows)) != EM_OK ||
        (st = reshape_to(b, rows, 3, bf ? (int64_t[]){1, -1, d} : (int64_t[]){-1, 1, d}, rr)) !=
            EM_OK)
        return st;
    return binary(b, "Add", in, rr, out);
}
static em_status pe_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                      char *out) {
    em_tensor *t = em_module_buffer(m, "pe");
    if (!t) return em_set_error(EM_ERR_STATE, "has no buffer pe");
    return pos_x(b, m, in, x, "pe", t, out);
}
static em_status lpe_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       char *out) {
    em_tensor *t = em_module_parameter(m, "weight");
    if (!t) return em_set_error(EM_ERR_STATE, "has no parameter weight");
    return pos_x(b, m, in, x, "weight", t, out);
}

/* ---- containers ----------------------------------------------------------------------------- */

static em_status seq_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       char *out) {
    char cur[N];
    snprintf(cur, sizeof cur, "%s", in);
    const em_tensor *xc = x;
    size_t k = em_module_child_count(m);
    for (size_t i = 0; i < k; i++) {
        const char *name;
        em_module_child_at(m, i, &name);
        em_tensor *y = NULL;
        em_status st = b->child(b, name, cur, xc, cur, i + 1 < k ? &y : NULL);
        if (st != EM_OK) return st;
        xc = y;
    }
    if (k == 0) return unary(b, "Identity", in, out);
    snprintf(out, N, "%s", cur);
    return EM_OK;
}

static em_status res_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       char *out) {
    const char *sc = em_options_string(em_module_options(m), "shortcut");
    char f[N], s[N];
    snprintf(f, sizeof f, "%s", in);
    snprintf(s, sizeof s, "%s", in);
    const em_tensor *xf = x;
    size_t k = em_module_child_count(m);
    for (size_t i = 0; i < k; i++) {
        const char *name;
        em_module_child_at(m, i, &name);
        em_status st;
        if (strcmp(name, sc) == 0) {
            st = b->child(b, name, in, x, s, NULL);
        } else {
            em_tensor *y = NULL;
            st = b->child(b, name, f, xf, f, &y);
            xf = y;
        }
        if (st != EM_OK) return st;
    }
    return binary(b, "Add", s, f, out);
}

static em_status par_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                       char *out) {
    const em_options *o = em_module_options(m);
    size_t k = em_module_child_count(m);
    if (k == 0 || k > 64)
        return em_set_error(EM_ERR_STATE, "has %zu branches (1..64 can be exported)", k);
    char names[64][N];
    const char *ins[64];
    for (size_t i = 0; i < k; i++) {
        const char *name;
        em_module_child_at(m, i, &name);
        em_status st = b->child(b, name, in, x, names[i], NULL);
        if (st != EM_OK) return st;
        ins[i] = names[i];
    }
    if (strcmp(em_options_string(o, "mode"), "cat") == 0) {
        em_onnx_attr a[] = {OX_INT("axis", em_options_int(o, "dim"))};
        return b->node(b, "Concat", (int)k, ins, 1, a, out);
    }
    if (k == 1) return unary(b, "Identity", ins[0], out);
    char acc[N];
    snprintf(acc, sizeof acc, "%s", ins[0]);
    for (size_t i = 1; i < k; i++) {
        em_status st = binary(b, "Add", acc, ins[i], i + 1 < k ? acc : out);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

/* ---- the table ---------------------------------------------------------------------------- */

#define LAYER(var, cls, fn, desc)                                                              \
    static const em_onnx_layer_class var = {.struct_size = sizeof(em_onnx_layer_class),         \
                                            .name = cls, .description = desc,                  \
                                            .export_layer = fn};
LAYER(x_linear, "Linear", linear_x, "Gemm (2-D input), else MatMul(x, Transpose(W)) + Add")
LAYER(x_conv, "Conv2d", conv_x, "Conv (then Relu with activation relu)")
LAYER(x_conv1d, "Conv1d", conv1d_x, "Conv (1-D)")
LAYER(x_convt, "ConvTranspose2d", convt_x, "ConvTranspose")
LAYER(x_gn, "GroupNorm", gn_x, "Reshape, ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div, "
      "Reshape (Mul, Add)")
LAYER(x_lstm, "LSTM", lstm_x, "LSTM per layer (gates i, o, f, c), Transpose, Reshape")
LAYER(x_gru, "GRU", gru_x, "GRU per layer (gates z, r, h; linear_before_reset), Transpose, "
      "Reshape")
LAYER(x_lstmcell, "LSTMCell", lstmcell_x, "LSTM of one step (gates i, o, f, c), Reshape")
LAYER(x_grucell, "GRUCell", grucell_x, "GRU of one step (gates z, r, h; linear_before_reset), "
      "Reshape")
LAYER(x_mha, "MultiheadAttention", mha_x, "self-attention: MatMul, Add, Split, Reshape, "
      "Transpose, MatMul, Mul (causal: Add of a Range/Greater/Where mask), Softmax, MatMul, "
      "out_proj")
LAYER(x_enc_layer, "TransformerEncoderLayer", enc_layer_x, "self_attn, Add, LayerNorm, "
      "feed-forward (Relu or GELU's Erf form), pre or post norm")
LAYER(x_enc, "TransformerEncoder", enc_x, "its layers in order, the final norm")
LAYER(x_pe, "PositionalEncoding", pe_x, "Shape, Slice of pe, Reshape, Add")
LAYER(x_lpe, "LearnedPositionalEncoding", lpe_x, "Shape, Slice of weight, Reshape, Add")
LAYER(x_maxpool, "MaxPool2d", maxpool_x, "MaxPool (after Relu with activation relu)")
LAYER(x_avgpool, "AvgPool2d", avgpool_x, "AveragePool")
LAYER(x_adaptive, "AdaptiveAvgPool2d", adaptive_x, "GlobalAveragePool, or AveragePool")
LAYER(x_bn1, "BatchNorm1d", bn_x, "BatchNormalization (running statistics)")
LAYER(x_bn2, "BatchNorm2d", bn_x, "BatchNormalization (running statistics)")
LAYER(x_ln, "LayerNorm", ln_x, "LayerNormalization (opset 17), its decomposition below")
LAYER(x_dropout, "Dropout", identity_x, "Identity (eval)")
LAYER(x_identity, "Identity", identity_x, "Identity")
LAYER(x_relu, "ReLU", relu_x, "Relu")
LAYER(x_leaky, "LeakyReLU", leaky_x, "LeakyRelu")
LAYER(x_tanh, "Tanh", tanh_x, "Tanh")
LAYER(x_sigmoid, "Sigmoid", sigmoid_x, "Sigmoid")
LAYER(x_silu, "SiLU", silu_x, "Sigmoid, Mul")
LAYER(x_gelu, "GELU", gelu_x, "Div, Erf, Add, Mul (tanh: its formula)")
LAYER(x_softmax, "Softmax", softmax_x, "Softmax")
LAYER(x_log_softmax, "LogSoftmax", log_softmax_x, "LogSoftmax")
LAYER(x_flatten, "Flatten", flatten_x, "Flatten, or Reshape")
LAYER(x_embedding, "Embedding", embedding_x, "Gather")
LAYER(x_seq, "Sequential", seq_x, "the children in order")
LAYER(x_res, "Residual", res_x, "the branch, the shortcut, Add")
LAYER(x_par, "Parallel", par_x, "the branches, Concat or Add")

const em_onnx_layer_class *const ox_layer_exporters[] = {
    &x_linear, &x_conv,     &x_maxpool, &x_avgpool, &x_adaptive, &x_bn1,     &x_bn2,
    &x_ln,     &x_dropout,  &x_identity, &x_relu,   &x_leaky,    &x_tanh,    &x_sigmoid,
    &x_silu,   &x_gelu,     &x_softmax, &x_log_softmax, &x_flatten, &x_embedding, &x_seq,
    &x_res,    &x_par,      &x_conv1d,  &x_convt,   &x_gn,       &x_lstm,    &x_gru,
    &x_lstmcell, &x_grucell, &x_mha,   &x_enc_layer, &x_enc,    &x_pe,      &x_lpe,
    NULL,
};
