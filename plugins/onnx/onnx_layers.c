/*
 * onnx_layers.c — the ONNX nodes of ember-layers' classes, one em_onnx_layer_class each (the
 * "onnx_layer" kind). Each reads the layer's resolved options and parameters, never its
 * private state, so it depends only on ember/module.h (and ember/ops.h for the LSTM/GRU
 * gates' order). Eval mode throughout: Dropout is an Identity, BatchNorm uses its running
 * statistics.
 *
 *   Linear             Gemm (transB = 1) on 2-D inputs; MatMul(x, Transpose(W)) + Add above
 *   Conv2d             Conv (pads [top, left, bottom, right]: 'same' puts an odd extra at the end)
 *   MaxPool2d          MaxPool;  AvgPool2d: AveragePool
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
 *   LSTM, GRU          one node per layer (both directions), gates reordered into constants,
 *                      Transpose/Reshape of Y to (T, N, D H); `output` picks Y, Y_h, Y_c
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
    return b->node(b, "Conv", bias ? 3 : 2, (const char *[]){in, wn, bn}, 5, a, out);
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

/* One layer's W, R and B (or none) for ONNX: directions stacked, gates reordered. */
static em_status rnn_params(em_onnx_builder *b, em_module *m, bool gru, int64_t l, int64_t D,
                            int64_t H, char *wn, char *rn, char *bn) {
    int G = gru ? 3 : 4;
    const int *order = gru ? gru_order : lstm_order;
    em_tensor *ws[2] = {NULL, NULL}, *rs[2] = {NULL, NULL}, *bs[2] = {NULL, NULL};
    bool has_bias = true;
    for (int64_t d = 0; d < D; d++) {
        const char *suf = d ? "_reverse" : "";
        char n1[64], n2[64], n3[64], n4[64];
        snprintf(n1, sizeof n1, "weight_ih_l%lld%s", (long long)l, suf);
        snprintf(n2, sizeof n2, "weight_hh_l%lld%s", (long long)l, suf);
        snprintf(n3, sizeof n3, "bias_ih_l%lld%s", (long long)l, suf);
        snprintf(n4, sizeof n4, "bias_hh_l%lld%s", (long long)l, suf);
        em_tensor *wih = em_module_parameter(m, n1), *whh = em_module_parameter(m, n2),
                  *bih = em_module_parameter(m, n3), *bhh = em_module_parameter(m, n4);
        if (!wih || !whh)
            return em_set_error(EM_ERR_STATE, "has no parameter %s or %s", n1, n2);
        if (!(ws[d] = gates(wih, G, order, H)) || !(rs[d] = gates(whh, G, order, H)))
            return em_last_status();
        has_bias = bih && bhh;
        if (has_bias) {
            em_tensor *gi = gates(bih, G, order, H), *gh = gates(bhh, G, order, H);
            if (!gi || !gh || !(bs[d] = em_cat(2, (const em_tensor *const[]){gi, gh}, 0)))
                return em_last_status();
        }
    }
    em_tensor *W = em_stack((int)D, (const em_tensor *const *)ws, 0),
              *R = em_stack((int)D, (const em_tensor *const *)rs, 0);
    em_status st;
    if (!W || !R) return em_last_status();
    if ((st = b->constant(b, W, wn)) != EM_OK || (st = b->constant(b, R, rn)) != EM_OK) return st;
    bn[0] = '\0';
    if (!has_bias) return EM_OK;
    em_tensor *B = em_stack((int)D, (const em_tensor *const *)bs, 0);
    return B ? b->constant(b, B, bn) : em_last_status();
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
        if ((st = rnn_params(b, m, gru, l, D, H, wn, rn, bn)) != EM_OK) return st;
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
LAYER(x_conv, "Conv2d", conv_x, "Conv")
LAYER(x_conv1d, "Conv1d", conv1d_x, "Conv (1-D)")
LAYER(x_convt, "ConvTranspose2d", convt_x, "ConvTranspose")
LAYER(x_gn, "GroupNorm", gn_x, "Reshape, ReduceMean, Sub, Mul, ReduceMean, Add, Sqrt, Div, "
      "Reshape (Mul, Add)")
LAYER(x_lstm, "LSTM", lstm_x, "LSTM per layer (gates i, o, f, c), Transpose, Reshape")
LAYER(x_gru, "GRU", gru_x, "GRU per layer (gates z, r, h; linear_before_reset), Transpose, "
      "Reshape")
LAYER(x_maxpool, "MaxPool2d", maxpool_x, "MaxPool")
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
    NULL,
};
