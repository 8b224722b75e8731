/*
 * layers.c — ember-layers.so: the plugin entry, shared helpers, and the stateless and
 * weight layers: Linear, Conv2d, Conv1d, ConvTranspose2d, MaxPool2d, AvgPool2d,
 * AdaptiveAvgPool2d, the activations (ReLU, LeakyReLU, GELU, SiLU, Tanh, Sigmoid, Softmax,
 * LogSoftmax), Flatten, Identity and Embedding. Every forward is one or a few public ops, so
 * autograd differentiates it.
 *
 * Options, parameter names and default initialisation follow torch.nn: Linear and Conv*d
 * weights are kaiming_uniform(a = sqrt 5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in from the weight's dim 1 and kernel (so for
 * ConvTranspose2d, whose weight is (in, out / groups, kH, kW) as PyTorch's, out / groups
 * times the kernel); Embedding weights N(0, 1) with the padding row zeroed.
 */
#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/tensor.h"
#include "ember/version.h"
#include "layers.h"

const char *const layers_reductions[] = {"none", "mean", "sum", NULL};

/* ---- helpers --------------------------------------------------------------------------------- */

em_status layers_pair(const char *cls, const em_options *o, const char *name,
                         const int64_t *dflt, int64_t out[2]) {
    int64_t v[EM_OPT_MAX_LIST];
    int n = em_options_ints(o, name, v, EM_OPT_MAX_LIST);
    if (n == 0 && dflt) {
        out[0] = dflt[0];
        out[1] = dflt[1];
        return EM_OK;
    }
    if (n == 1) {
        out[0] = out[1] = v[0];
        return EM_OK;
    }
    if (n == 2) {
        out[0] = v[0];
        out[1] = v[1];
        return EM_OK;
    }
    return em_set_error(EM_ERR_INVALID, "%s: option '%s' takes one int or a list of 2 (H, W), "
                        "got %d values", cls, name, n);
}

em_reduction layers_reduction(const em_options *o) {
    em_reduction r = EM_REDUCTION_MEAN;
    const char *s = em_options_string(o, "reduction");
    if (s)
        em_reduction_parse(s, &r);
    return r;
}

em_tensor *layers_floats_tensor(const em_options *o, const char *name, bool *made) {
    double v[EM_OPT_MAX_LIST];
    int n = em_options_floats(o, name, v, EM_OPT_MAX_LIST);
    *made = n > 0;
    if (n == 0)
        return NULL;
    em_tensor *t = em_from_data(v, 1, (int64_t[]){n}, EM_F64, em_cpu());
    return t ? em_to_dtype(t, EM_F32) : NULL;
}

em_status layers_check_float_input(const em_tensor *x, const em_tensor *w) {
    if (!x || !w) return EM_OK; /* the op reports a NULL input */
    em_dtype xd = em_tensor_dtype(x), wd = em_tensor_dtype(w);
    if (em_dtype_is_floating(xd) || !em_dtype_is_floating(wd)) return EM_OK;
    return em_set_error(EM_ERR_DTYPE, "the input is %s but the layer's weight is %s: convert the "
                        "batch to floating point first (the DataLoader's to_float transform, "
                        "em_loader_options.transforms.to_float = true, scales uint8 images "
                        "to [0, 1]; or em_to_dtype(x, %s))", em_dtype_name(xd), em_dtype_name(wd),
                        wd == EM_F32 ? "EM_F32" : em_dtype_name(wd));
}

em_status layers_default_init(em_tensor *weight, em_tensor *bias) {
    em_status st = em_init_kaiming_uniform_(weight, sqrt(5.0), "fan_in", "leaky_relu", NULL);
    if (st != EM_OK || !bias)
        return st;
    int64_t fan_in;
    if ((st = em_init_calculate_fans(weight, &fan_in, NULL)) != EM_OK)
        return st;
    double bound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
    return em_init_uniform_(bias, -bound, bound, NULL);
}

static em_tensor *param(em_module *m, const char *name, int ndim, const int64_t *shape) {
    em_tensor *t = em_empty(ndim, shape, EM_F32, em_cpu());
    return t && em_module_add_parameter(m, name, t) == EM_OK ? t : NULL;
}

/* ---- Linear ----------------------------------------------------------------------------------- */

static const em_option_spec linear_opts[] = {
    OPT_INT_REQ("in_features", 1, 1e12, "size of each input sample"),
    OPT_INT_REQ("out_features", 1, 1e12, "size of each output sample"),
    OPT_BOOL("bias", true, "learn an additive bias"),
};

static em_status linear_init(em_module *m, const em_options *o) {
    int64_t in = em_options_int(o, "in_features"), out = em_options_int(o, "out_features");
    em_tensor *w = param(m, "weight", 2, (int64_t[]){out, in});
    em_tensor *b = NULL;
    if (!w)
        return em_last_status();
    if (em_options_bool(o, "bias") && !(b = param(m, "bias", 1, (int64_t[]){out})))
        return em_last_status();
    return layers_default_init(w, b);
}

static em_tensor *linear_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    if (layers_check_float_input(in[0], em_module_parameter(m, "weight")) != EM_OK) return NULL;
    return em_linear(in[0], em_module_parameter(m, "weight"), em_module_parameter(m, "bias"));
}

static const em_module_class linear_class = {
    .struct_size = sizeof(em_module_class), .name = "Linear",
    .description = "y = x W^T + b (torch.nn.Linear)", .options = linear_opts,
    .n_options = NOPTS(linear_opts), .init = linear_init, .forward = linear_forward,
    .n_inputs = 1,
};

/* ---- Conv2d ------------------------------------------------------------------------------------ */

static const char *const pad_modes[] = {"same", "valid", NULL};
static const char *const zeros_only[] = {"zeros", NULL};
static const char *const mem_formats[] = {"contiguous", "channels_last", "blocked", NULL};
static const char *const activations[] = {"none", "relu", NULL};

static const em_option_spec conv_opts[] = {
    OPT_INT_REQ("in_channels", 1, 1e9, "channels of the input"),
    OPT_INT_REQ("out_channels", 1, 1e9, "channels of the output"),
    OPT_PAIR_REQ("kernel_size", 1, "kernel size: k or [kH, kW]"),
    OPT_PAIR("stride", 1, 1, "stride: s or [sH, sW]"),
    {.name = "padding", .types = EM_OPT_INTS | EM_OPT_STRING, .def_type = EM_OPT_INTS,
     .def = {.n = 1, .ints = {0}}, .choices = pad_modes, .has_range = true, .min = 0,
     .max = 1e9, .help = "zero padding: p, [pH, pW], 'same' or 'valid'"},
    OPT_PAIR("dilation", 1, 1, "spacing between kernel elements"),
    OPT_INT("groups", 1, 1, 1e9, "blocked connections from input to output channels"),
    OPT_BOOL("bias", true, "learn an additive bias"),
    OPT_CHOICE("padding_mode", "zeros", zeros_only, "padding values (only zeros)"),
    OPT_CHOICE("memory_format", "contiguous", mem_formats,
               "the activation layout: channels_last runs the convolution on an (N, C, H, W) "
               "input with NHWC strides and gives its output so (on the CPU; ReLU and max "
               "pooling keep it); blocked gives the output in oneDNN's nChw16c storage layout "
               "when out_channels is a multiple of 16 and the device's convolution takes it "
               "(the CPU's f32 one), kept by ReLU, max pooling and the next blocked Conv2d and "
               "converted back by anything else (a Flatten), contiguous otherwise"),
    OPT_CHOICE("activation", "none", activations,
               "applied to the output: relu runs the fused op conv2d_relu, the same as a ReLU "
               "layer after the convolution (the parameters and state-dict keys are the same)"),
};

typedef struct conv_state {
    int64_t stride[2], padding[2], dilation[2], groups;
    int64_t extra[2]; /* 'same' with an odd total padding: one more row/column at the end */
    bool channels_last; /* memory_format: channels_last */
    bool blocked;       /* memory_format: blocked */
    bool relu;          /* activation: relu */
} conv_state;

static em_status conv_init(em_module *m, const em_options *o) {
    conv_state *s = em_module_state(m);
    int64_t cin = em_options_int(o, "in_channels"), cout = em_options_int(o, "out_channels");
    int64_t k[2];
    em_status st;
    if ((st = layers_pair("Conv2d", o, "kernel_size", NULL, k)) != EM_OK ||
        (st = layers_pair("Conv2d", o, "stride", NULL, s->stride)) != EM_OK ||
        (st = layers_pair("Conv2d", o, "dilation", NULL, s->dilation)) != EM_OK)
        return st;
    s->groups = em_options_int(o, "groups");
    s->channels_last = strcmp(em_options_string(o, "memory_format"), "channels_last") == 0;
    s->blocked = strcmp(em_options_string(o, "memory_format"), "blocked") == 0;
    s->relu = strcmp(em_options_string(o, "activation"), "relu") == 0;
    if (cin % s->groups || cout % s->groups)
        return em_set_error(EM_ERR_INVALID, "Conv2d: groups=%lld must divide in_channels=%lld "
                            "and out_channels=%lld", (long long)s->groups, (long long)cin,
                            (long long)cout);
    const char *mode = em_options_string(o, "padding");
    if (mode && strcmp(mode, "same") == 0) {
        if (s->stride[0] != 1 || s->stride[1] != 1)
            return em_set_error(EM_ERR_INVALID, "Conv2d: padding='same' is not supported for "
                                "strided convolutions (stride [%lld, %lld])",
                                (long long)s->stride[0], (long long)s->stride[1]);
        for (int i = 0; i < 2; i++) {
            int64_t total = s->dilation[i] * (k[i] - 1);
            s->padding[i] = total / 2;
            s->extra[i] = total - 2 * s->padding[i];
        }
    } else if (!mode) {
        if ((st = layers_pair("Conv2d", o, "padding", NULL, s->padding)) != EM_OK)
            return st;
    } /* 'valid': zeros */
    em_tensor *w = param(m, "weight", 4, (int64_t[]){cout, cin / s->groups, k[0], k[1]});
    em_tensor *b = NULL;
    if (!w)
        return em_last_status();
    if (em_options_bool(o, "bias") && !(b = param(m, "bias", 1, (int64_t[]){cout})))
        return em_last_status();
    return layers_default_init(w, b);
}

static em_tensor *conv_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    conv_state *s = em_module_state(m);
    const em_tensor *x = in[0];
    if (layers_check_float_input(x, em_module_parameter(m, "weight")) != EM_OK) return NULL;
    if (s->extra[0] || s->extra[1]) /* PyTorch pads the extra element at the end */
        x = em_pad(x, 4, (int64_t[]){0, s->extra[1], 0, s->extra[0]}, 0.0);
    /* channels_last: the input in that layout (itself when it already is: a previous
     * layer's output; a copy otherwise, e.g. the network's input), so conv2d's output is. */
    if (s->channels_last && x && em_tensor_ndim(x) == 4 && !(x = em_channels_last(x)))
        return NULL;
    /* blocked: the thread prefers nChw16c for the convolution's output (a blocked input, a
     * previous blocked layer's output, keeps it anyway). */
    em_layout was = s->blocked ? em_layout_prefer(EM_LAYOUT_NCHW16C) : EM_LAYOUT_PLAIN;
    em_tensor *y = x ? (s->relu ? em_conv2d_relu : em_conv2d)(x, em_module_parameter(m, "weight"),
                                                        em_module_parameter(m, "bias"),
                                                        s->stride, s->padding, s->dilation,
                                                        s->groups)
                     : NULL;
    if (s->blocked) em_layout_prefer(was);
    return y;
}

static const em_module_class conv_class = {
    .struct_size = sizeof(em_module_class), .name = "Conv2d",
    .description = "2-D convolution (torch.nn.Conv2d)", .options = conv_opts,
    .n_options = NOPTS(conv_opts), .state_size = sizeof(conv_state), .init = conv_init,
    .forward = conv_forward, .n_inputs = 1,
};

/* ---- Conv1d ------------------------------------------------------------------------------------ */

static const em_option_spec conv1d_opts[] = {
    OPT_INT_REQ("in_channels", 1, 1e9, "channels of the input (N, C, L)"),
    OPT_INT_REQ("out_channels", 1, 1e9, "channels of the output"),
    OPT_INT_REQ("kernel_size", 1, 1e9, "kernel length"),
    OPT_INT("stride", 1, 1, 1e9, "stride"),
    {.name = "padding", .types = EM_OPT_INT | EM_OPT_STRING, .def_type = EM_OPT_INT,
     .def = {.i = 0}, .choices = pad_modes, .has_range = true, .min = 0, .max = 1e9,
     .help = "zero padding on both sides: p, 'same' or 'valid'"},
    OPT_INT("dilation", 1, 1, 1e9, "spacing between kernel elements"),
    OPT_INT("groups", 1, 1, 1e9, "blocked connections from input to output channels"),
    OPT_BOOL("bias", true, "learn an additive bias"),
    OPT_CHOICE("padding_mode", "zeros", zeros_only, "padding values (only zeros)"),
};

typedef struct conv1d_state {
    int64_t stride, padding, dilation, groups, extra; /* extra: as conv_state's */
} conv1d_state;

/* Conv1d and ConvTranspose2d: groups must divide both channel counts. */
static em_status check_groups(const char *cls, int64_t groups, int64_t cin, int64_t cout) {
    if (cin % groups || cout % groups)
        return em_set_error(EM_ERR_INVALID, "%s: groups=%lld must divide in_channels=%lld and "
                            "out_channels=%lld", cls, (long long)groups, (long long)cin,
                            (long long)cout);
    return EM_OK;
}

static em_status conv1d_init(em_module *m, const em_options *o) {
    conv1d_state *s = em_module_state(m);
    int64_t cin = em_options_int(o, "in_channels"), cout = em_options_int(o, "out_channels"),
            k = em_options_int(o, "kernel_size");
    s->stride = em_options_int(o, "stride");
    s->dilation = em_options_int(o, "dilation");
    s->groups = em_options_int(o, "groups");
    em_status st = check_groups("Conv1d", s->groups, cin, cout);
    if (st != EM_OK) return st;
    const char *mode = em_options_string(o, "padding");
    if (mode && strcmp(mode, "same") == 0) {
        if (s->stride != 1)
            return em_set_error(EM_ERR_INVALID, "Conv1d: padding='same' is not supported for "
                                "strided convolutions (stride %lld)", (long long)s->stride);
        int64_t total = s->dilation * (k - 1);
        s->padding = total / 2;
        s->extra = total - 2 * s->padding;
    } else if (!mode) {
        s->padding = em_options_int(o, "padding");
    }
    em_tensor *w = param(m, "weight", 3, (int64_t[]){cout, cin / s->groups, k}), *b = NULL;
    if (!w) return em_last_status();
    if (em_options_bool(o, "bias") && !(b = param(m, "bias", 1, (int64_t[]){cout})))
        return em_last_status();
    return layers_default_init(w, b);
}

static em_tensor *conv1d_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    conv1d_state *s = em_module_state(m);
    const em_tensor *x = in[0];
    if (layers_check_float_input(x, em_module_parameter(m, "weight")) != EM_OK) return NULL;
    if (s->extra) x = em_pad(x, 2, (int64_t[]){0, s->extra}, 0.0);
    return em_conv1d(x, em_module_parameter(m, "weight"), em_module_parameter(m, "bias"),
                     s->stride, s->padding, s->dilation, s->groups);
}

static const em_module_class conv1d_class = {
    .struct_size = sizeof(em_module_class), .name = "Conv1d",
    .description = "1-D convolution (torch.nn.Conv1d)", .options = conv1d_opts,
    .n_options = NOPTS(conv1d_opts), .state_size = sizeof(conv1d_state), .init = conv1d_init,
    .forward = conv1d_forward, .n_inputs = 1,
};

/* ---- ConvTranspose2d ----------------------------------------------------------------------------- */

static const em_option_spec convt_opts[] = {
    OPT_INT_REQ("in_channels", 1, 1e9, "channels of the input"),
    OPT_INT_REQ("out_channels", 1, 1e9, "channels of the output"),
    OPT_PAIR_REQ("kernel_size", 1, "kernel size: k or [kH, kW]"),
    OPT_PAIR("stride", 1, 1, "stride: s or [sH, sW]"),
    OPT_PAIR("padding", 0, 0, "dilation (k - 1) - padding zeros added to both sides"),
    OPT_PAIR("output_padding", 0, 0, "extra size on one side of the output (below stride)"),
    OPT_INT("groups", 1, 1, 1e9, "blocked connections from input to output channels"),
    OPT_BOOL("bias", true, "learn an additive bias"),
    OPT_PAIR("dilation", 1, 1, "spacing between kernel elements"),
    OPT_CHOICE("padding_mode", "zeros", zeros_only, "padding values (only zeros)"),
};

typedef struct convt_state {
    int64_t stride[2], padding[2], output_padding[2], dilation[2], groups;
} convt_state;

static em_status convt_init(em_module *m, const em_options *o) {
    convt_state *s = em_module_state(m);
    int64_t cin = em_options_int(o, "in_channels"), cout = em_options_int(o, "out_channels");
    int64_t k[2];
    em_status st;
    if ((st = layers_pair("ConvTranspose2d", o, "kernel_size", NULL, k)) != EM_OK ||
        (st = layers_pair("ConvTranspose2d", o, "stride", NULL, s->stride)) != EM_OK ||
        (st = layers_pair("ConvTranspose2d", o, "padding", NULL, s->padding)) != EM_OK ||
        (st = layers_pair("ConvTranspose2d", o, "output_padding", NULL, s->output_padding)) != EM_OK ||
        (st = layers_pair("ConvTranspose2d", o, "dilation", NULL, s->dilation)) != EM_OK)
        return st;
    s->groups = em_options_int(o, "groups");
    if ((st = check_groups("ConvTranspose2d", s->groups, cin, cout)) != EM_OK) return st;
    for (int i = 0; i < 2; i++)
        if (s->output_padding[i] >= s->stride[i])
            return em_set_error(EM_ERR_INVALID, "ConvTranspose2d: output_padding [%lld, %lld] "
                                "must be smaller than stride [%lld, %lld]",
                                (long long)s->output_padding[0], (long long)s->output_padding[1],
                                (long long)s->stride[0], (long long)s->stride[1]);
    /* PyTorch's layout: (in_channels, out_channels / groups, kH, kW). */
    em_tensor *w = param(m, "weight", 4, (int64_t[]){cin, cout / s->groups, k[0], k[1]});
    em_tensor *b = NULL;
    if (!w) return em_last_status();
    if (em_options_bool(o, "bias") && !(b = param(m, "bias", 1, (int64_t[]){cout})))
        return em_last_status();
    return layers_default_init(w, b);
}

static em_tensor *convt_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    convt_state *s = em_module_state(m);
    const em_tensor *x = in[0];
    if (layers_check_float_input(x, em_module_parameter(m, "weight")) != EM_OK) return NULL;
    return em_conv_transpose2d(x, em_module_parameter(m, "weight"), em_module_parameter(m, "bias"),
                               s->stride, s->padding, s->output_padding, s->groups, s->dilation);
}

static const em_module_class convt_class = {
    .struct_size = sizeof(em_module_class), .name = "ConvTranspose2d",
    .description = "2-D transposed convolution (torch.nn.ConvTranspose2d)", .options = convt_opts,
    .n_options = NOPTS(convt_opts), .state_size = sizeof(convt_state), .init = convt_init,
    .forward = convt_forward, .n_inputs = 1,
};

/* ---- pooling ----------------------------------------------------------------------------------- */

static const em_option_spec maxpool_opts[] = {
    OPT_PAIR_REQ("kernel_size", 1, "window size: k or [kH, kW]"),
    {.name = "stride", .types = EM_OPT_INTS, .def = {.n = 0}, .has_range = true, .min = 1,
     .max = 1e9, .help = "window stride (default: kernel_size)"},
    OPT_PAIR("padding", 0, 0, "implicit padding on both sides (at most half the kernel)"),
    OPT_PAIR("dilation", 1, 1, "spacing between window elements"),
    OPT_BOOL("ceil_mode", false, "round the output size up"),
    OPT_CHOICE("activation", "none", activations,
               "applied to the input before the pooling: relu runs the fused op "
               "max_pool2d_relu, the same values as a ReLU layer before it (the indices are "
               "those of the pooled ReLU output), with the ReLU and its gradient on the pooled "
               "elements only"),
};

static const em_option_spec avgpool_opts[] = {
    OPT_PAIR_REQ("kernel_size", 1, "window size: k or [kH, kW]"),
    {.name = "stride", .types = EM_OPT_INTS, .def = {.n = 0}, .has_range = true, .min = 1,
     .max = 1e9, .help = "window stride (default: kernel_size)"},
    OPT_PAIR("padding", 0, 0, "implicit zero padding on both sides"),
    OPT_BOOL("ceil_mode", false, "round the output size up"),
    OPT_BOOL("count_include_pad", true, "count the zero padding in the average"),
};

typedef struct pool_state {
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    bool ceil_mode, count_include_pad;
    bool relu; /* MaxPool2d's activation: relu */
} pool_state;

static em_status pool_init_common(em_module *m, const em_options *o, const char *cls) {
    pool_state *s = em_module_state(m);
    em_status st;
    if ((st = layers_pair(cls, o, "kernel_size", NULL, s->kernel)) != EM_OK ||
        (st = layers_pair(cls, o, "stride", s->kernel, s->stride)) != EM_OK ||
        (st = layers_pair(cls, o, "padding", NULL, s->padding)) != EM_OK)
        return st;
    s->dilation[0] = s->dilation[1] = 1;
    if (em_options_has(o, "dilation") &&
        (st = layers_pair(cls, o, "dilation", NULL, s->dilation)) != EM_OK)
        return st;
    for (int i = 0; i < 2; i++)
        if (s->padding[i] * 2 > s->kernel[i])
            return em_set_error(EM_ERR_INVALID, "%s: padding should be at most half of the "
                                "kernel size, got padding [%lld, %lld] for kernel_size [%lld, "
                                "%lld]", cls, (long long)s->padding[0], (long long)s->padding[1],
                                (long long)s->kernel[0], (long long)s->kernel[1]);
    s->ceil_mode = em_options_bool(o, "ceil_mode");
    s->count_include_pad = em_options_bool(o, "count_include_pad");
    return EM_OK;
}

static em_status maxpool_init(em_module *m, const em_options *o) {
    pool_state *s = em_module_state(m);
    s->relu = strcmp(em_options_string(o, "activation"), "relu") == 0;
    return pool_init_common(m, o, "MaxPool2d");
}
static em_status avgpool_init(em_module *m, const em_options *o) {
    return pool_init_common(m, o, "AvgPool2d");
}

static em_tensor *maxpool_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    pool_state *s = em_module_state(m);
    em_tensor *out = NULL;
    if ((s->relu ? em_max_pool2d_relu : em_max_pool2d)(in[0], s->kernel, s->stride, s->padding,
                                                       s->dilation, s->ceil_mode, &out,
                                                       NULL) != EM_OK)
        return NULL;
    return out;
}

static em_tensor *avgpool_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    pool_state *s = em_module_state(m);
    return em_avg_pool2d(in[0], s->kernel, s->stride, s->padding, s->ceil_mode,
                         s->count_include_pad);
}

static const em_module_class maxpool_class = {
    .struct_size = sizeof(em_module_class), .name = "MaxPool2d",
    .description = "2-D max pooling (torch.nn.MaxPool2d)", .options = maxpool_opts,
    .n_options = NOPTS(maxpool_opts), .state_size = sizeof(pool_state), .init = maxpool_init,
    .forward = maxpool_forward, .n_inputs = 1,
};

static const em_module_class avgpool_class = {
    .struct_size = sizeof(em_module_class), .name = "AvgPool2d",
    .description = "2-D average pooling (torch.nn.AvgPool2d)", .options = avgpool_opts,
    .n_options = NOPTS(avgpool_opts), .state_size = sizeof(pool_state), .init = avgpool_init,
    .forward = avgpool_forward, .n_inputs = 1,
};

static const em_option_spec adaptive_opts[] = {
    OPT_PAIR_REQ("output_size", 1, "output size: s or [H, W]"),
};

static em_status adaptive_init(em_module *m, const em_options *o) {
    return layers_pair("AdaptiveAvgPool2d", o, "output_size", NULL, em_module_state(m));
}

static em_tensor *adaptive_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    return em_adaptive_avg_pool2d(in[0], em_module_state(m));
}

static const em_module_class adaptive_class = {
    .struct_size = sizeof(em_module_class), .name = "AdaptiveAvgPool2d",
    .description = "2-D adaptive average pooling (torch.nn.AdaptiveAvgPool2d)",
    .options = adaptive_opts, .n_options = NOPTS(adaptive_opts),
    .state_size = 2 * sizeof(int64_t), .init = adaptive_init, .forward = adaptive_forward,
    .n_inputs = 1,
};

/* ---- activations ------------------------------------------------------------------------------- */

#define UNARY_CLASS(var, nm, desc, expr)                                                      \
    static em_tensor *var##_forward(em_module *m, em_tensor *const *in, int n) {              \
        (void)m;                                                                              \
        (void)n;                                                                              \
        const em_tensor *x = in[0];                                                           \
        return expr;                                                                          \
    }                                                                                         \
    static const em_module_class var##_class = {                                              \
        .struct_size = sizeof(em_module_class), .name = nm, .description = desc,             \
        .forward = var##_forward, .n_inputs = 1,                                              \
    };

UNARY_CLASS(relu, "ReLU", "max(x, 0) (torch.nn.ReLU)", em_relu(x))
UNARY_CLASS(silu, "SiLU", "x sigmoid(x) (torch.nn.SiLU)", em_silu(x))
UNARY_CLASS(tanh_, "Tanh", "tanh(x) (torch.nn.Tanh)", em_tanh(x))
UNARY_CLASS(sigmoid, "Sigmoid", "1 / (1 + exp(-x)) (torch.nn.Sigmoid)", em_sigmoid(x))
UNARY_CLASS(identity, "Identity", "returns its input (torch.nn.Identity)",
            em_tensor_retain((em_tensor *)x))

static const em_option_spec leaky_opts[] = {
    OPT_FLOAT("negative_slope", 0.01, -1e9, 1e9, "slope for x < 0"),
};
static em_tensor *leaky_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    return em_leaky_relu(in[0], em_options_float(em_module_options(m), "negative_slope"));
}
static const em_module_class leaky_class = {
    .struct_size = sizeof(em_module_class), .name = "LeakyReLU",
    .description = "x >= 0 ? x : negative_slope x (torch.nn.LeakyReLU)", .options = leaky_opts,
    .n_options = NOPTS(leaky_opts), .forward = leaky_forward, .n_inputs = 1,
};

static const char *const gelu_modes[] = {"none", "tanh", NULL};
static const em_option_spec gelu_opts[] = {
    OPT_CHOICE("approximate", "none", gelu_modes, "'none' (erf) or the 'tanh' approximation"),
};
static em_tensor *gelu_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    return em_gelu(in[0], em_options_string(em_module_options(m), "approximate"));
}
static const em_module_class gelu_class = {
    .struct_size = sizeof(em_module_class), .name = "GELU",
    .description = "x Phi(x) (torch.nn.GELU)", .options = gelu_opts,
    .n_options = NOPTS(gelu_opts), .forward = gelu_forward, .n_inputs = 1,
};

/* Softmax's dim defaults to -1 (the last): PyTorch's implicit-dim rule (dim 0 for 0-, 1- and
 * 3-D inputs, else 1) is deprecated there and a classic source of wrong results. */
static const em_option_spec softmax_opts[] = {
    OPT_INT("dim", -1, -8, 7, "the dim along which the outputs sum to 1 (default: the last)"),
};
static em_tensor *softmax_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    return em_softmax(in[0], (int)em_options_int(em_module_options(m), "dim"));
}
static em_tensor *log_softmax_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    return em_log_softmax(in[0], (int)em_options_int(em_module_options(m), "dim"));
}
static const em_module_class softmax_class = {
    .struct_size = sizeof(em_module_class), .name = "Softmax",
    .description = "softmax along dim (torch.nn.Softmax); never before CrossEntropyLoss",
    .options = softmax_opts, .n_options = NOPTS(softmax_opts), .forward = softmax_forward,
    .n_inputs = 1,
};
static const em_module_class log_softmax_class = {
    .struct_size = sizeof(em_module_class), .name = "LogSoftmax",
    .description = "log of softmax along dim (torch.nn.LogSoftmax); pairs with NLLLoss",
    .options = softmax_opts, .n_options = NOPTS(softmax_opts), .forward = log_softmax_forward,
    .n_inputs = 1,
};

/* ---- Flatten ----------------------------------------------------------------------------------- */

static const em_option_spec flatten_opts[] = {
    OPT_INT("start_dim", 1, -8, 7, "first dim to flatten"),
    OPT_INT("end_dim", -1, -8, 7, "last dim to flatten"),
};
static em_tensor *flatten_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const em_options *o = em_module_options(m);
    return em_flatten(in[0], (int)em_options_int(o, "start_dim"),
                      (int)em_options_int(o, "end_dim"));
}
static const em_module_class flatten_class = {
    .struct_size = sizeof(em_module_class), .name = "Flatten",
    .description = "merge dims start_dim..end_dim (torch.nn.Flatten)", .options = flatten_opts,
    .n_options = NOPTS(flatten_opts), .forward = flatten_forward, .n_inputs = 1,
};

/* ---- Embedding --------------------------------------------------------------------------------- */

static const char *const none_choice[] = {"none", NULL};
static const em_option_spec embedding_opts[] = {
    OPT_INT_REQ("num_embeddings", 1, 1e12, "size of the dictionary"),
    OPT_INT_REQ("embedding_dim", 1, 1e9, "size of each embedding vector"),
    {.name = "padding_idx", .types = EM_OPT_INT | EM_OPT_STRING, .def_type = EM_OPT_STRING,
     .def = {.s = "none"}, .choices = none_choice, .help = "a row kept at zero and not "
     "trained, or 'none'"},
};

static em_status embedding_init(em_module *m, const em_options *o) {
    int64_t v = em_options_int(o, "num_embeddings"), d = em_options_int(o, "embedding_dim");
    int64_t *pad = em_module_state(m);
    *pad = EM_PADDING_IDX_NONE;
    if (em_options_type(o, "padding_idx") == EM_OPT_INT) {
        *pad = em_options_int(o, "padding_idx");
        if (*pad < -v || *pad >= v)
            return em_set_error(EM_ERR_INVALID, "Embedding: padding_idx %lld must be within "
                                "num_embeddings [-%lld, %lld)", (long long)*pad, (long long)v,
                                (long long)v);
        if (*pad < 0)
            *pad += v;
    }
    em_tensor *w = param(m, "weight", 2, (int64_t[]){v, d});
    if (!w)
        return em_last_status();
    em_status st = em_init_normal_(w, 0.0, 1.0, NULL);
    if (st == EM_OK && *pad != EM_PADDING_IDX_NONE) {
        em_grad_mode_push(EM_GRAD_DISABLED);
        st = em_fill_(em_select(w, 0, *pad), 0.0);
        em_grad_mode_pop();
    }
    return st;
}

static em_tensor *embedding_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    return em_embedding(em_module_parameter(m, "weight"), in[0],
                        *(int64_t *)em_module_state(m));
}

static const em_module_class embedding_class = {
    .struct_size = sizeof(em_module_class), .name = "Embedding",
    .description = "a lookup table of num_embeddings vectors (torch.nn.Embedding)",
    .options = embedding_opts, .n_options = NOPTS(embedding_opts),
    .state_size = sizeof(int64_t), .init = embedding_init, .forward = embedding_forward,
    .n_inputs = 1,
};

const em_module_class *const layers_basic[] = {
    &linear_class,   &conv_class,    &maxpool_class,   &avgpool_class, &adaptive_class,
    &relu_class,     &leaky_class,   &gelu_class,      &silu_class,    &tanh__class,
    &sigmoid_class,  &softmax_class, &log_softmax_class, &flatten_class, &identity_class,
    &embedding_class, &conv1d_class, &convt_class, NULL,
};

/* ---- the plugin ------------------------------------------------------------------------------- */

static em_status layers_register(em_registry *reg) {
    const em_module_class *const *tables[] = {layers_basic, layers_norm, layers_containers,
                                              layers_losses, layers_rnn, layers_attn};
    for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
        for (const em_module_class *const *c = tables[t]; *c; c++) {
            em_status st = em_module_class_register(reg, *c);
            if (st != EM_OK)
                return st;
        }
    return EM_OK;
}

static const em_plugin_descriptor layers_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-layers",
    .version = EM_VERSION_STRING,
    .description = "layers, containers and losses (torch.nn equivalents)",
    .register_fn = layers_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &layers_plugin; }
