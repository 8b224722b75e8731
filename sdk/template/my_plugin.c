/*
 * my_plugin.c — a minimal Ember plugin to copy and rename. It declares one op,
 * "my_plugin.scale" (y = alpha * x, alpha a float attribute, default 2) with its derivative
 * and float32/float64 CPU kernels, describes the op's sample inputs (case rows) for ember-opcheck,
 * and registers a layer, "my_plugin.Scale" (y = scale(x * weight) + bias), that an
 * ember-train config can use by name. See the SDK guide (sdk/README.md) for each piece.
 *
 *     make                                           # builds my_plugin.so
 *     make check                                     # ember-info, then ember-opcheck on it
 *     EMBER_PLUGIN_PATH=$PWD ember-info              # shows it loaded: op, kernel, layer
 */
#include <string.h>

#include <ember/ember.h>
#include <ember/opcase.h>

/* ---- the op ---------------------------------------------------------------------------------- */

/* The attribute alpha, or its default when the caller passed none (EM_ATTR_NONE). */
static double scale_alpha(const em_attr *attrs) {
    return attrs && attrs[0].type == EM_ATTR_FLOAT ? attrs[0].v.f : 2.0;
}

/* Output 0: x's shape and dtype; float32 and float64 only (the dtypes with a kernel). */
static em_status scale_infer(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                             em_tensor_meta *out) {
    (void)attrs;
    em_dtype dt = em_tensor_dtype(in[0]);
    if (dt != EM_F32 && dt != EM_F64)
        return em_set_error(EM_ERR_DTYPE, "%s: dtype %s is not supported (float32, float64)",
                            em_op_name(op), em_dtype_name(dt));
    out[0].dtype = dt;
    out[0].ndim = em_tensor_ndim(in[0]);
    memcpy(out[0].shape, em_tensor_shape(in[0]), sizeof(int64_t) * (size_t)out[0].ndim);
    return EM_OK;
}

/* The derivative: dy/dx = alpha, so grad_in = alpha * grad_out. Written with ops (it runs on
 * every device), with grad mode off, in a scope of its own; the engine keeps grad_in[0]. The
 * attributes are the ones the forward saw. It needs no saved tensor (.saves = 0). */
static em_status scale_backward(const em_backward_ctx *ctx, em_tensor **grad_in) {
    if (!ctx->needs_grad[0] || !ctx->grad_out[0]) return EM_OK;
    grad_in[0] = em_mul_scalar(ctx->grad_out[0], scale_alpha(ctx->attrs));
    return grad_in[0] ? EM_OK : em_last_status();
}

static const char *const scale_attr_names[] = {"alpha"};
static const em_attr_type scale_attr_types[] = {EM_ATTR_FLOAT};

static const em_op_schema scale_schema = {
    .struct_size = sizeof(em_op_schema),
    .name = "my_plugin.scale", /* prefix your ops with your plugin's name */
    .n_inputs = 1,
    .n_outputs = 1,
    .n_attrs = 1,
    .attr_names = scale_attr_names,
    .attr_types = scale_attr_types,
    .dispatch_arg = 0,
    .infer = scale_infer,
    .backward = scale_backward, /* or .flags = EM_OP_NONDIFF for an op without a derivative */
    .saves = 0,                 /* EM_SAVE_INPUT(i) | EM_SAVE_OUTPUT(j) for what it needs */
};

/* ---- the kernels ----------------------------------------------------------------------------- */

/* Advance a C-order index over shape by one element, moving the offsets of x and y (in
 * elements) by their strides: views (transposed, sliced, expanded) work as they are. */
static void next_index(const em_ktensor *x, const em_ktensor *y, int64_t *idx, int64_t *xo,
                       int64_t *yo) {
    for (int d = x->ndim - 1; d >= 0; d--) { /* last dim fastest */
        *xo += x->strides[d];
        *yo += y->strides[d];
        if (++idx[d] < x->shape[d]) return;
        *xo -= x->strides[d] * x->shape[d];
        *yo -= y->strides[d] * y->shape[d];
        idx[d] = 0;
    }
}

/* x may be any view; y is the op's output (strided too, with em_op_call_out). One kernel per
 * dtype: float32 for use, float64 so that gradients can be checked by finite differences. */
static em_status scale_f32(const em_kernel_ctx *ctx) {
    const em_ktensor *x = &ctx->in[0], *y = &ctx->out[0];
    float alpha = (float)scale_alpha(ctx->attrs);
    int64_t idx[EM_MAX_DIMS] = {0}, xo = 0, yo = 0;
    for (int64_t n = 0; n < x->numel; n++, next_index(x, y, idx, &xo, &yo))
        ((float *)y->data)[yo] = alpha * ((const float *)x->data)[xo];
    return EM_OK;
}

static em_status scale_f64(const em_kernel_ctx *ctx) {
    const em_ktensor *x = &ctx->in[0], *y = &ctx->out[0];
    double alpha = scale_alpha(ctx->attrs);
    int64_t idx[EM_MAX_DIMS] = {0}, xo = 0, yo = 0;
    for (int64_t n = 0; n < x->numel; n++, next_index(x, y, idx, &xo, &yo))
        ((double *)y->data)[yo] = alpha * ((const double *)x->data)[xo];
    return EM_OK;
}

/* ---- sample inputs for ember-opcheck (ember/opcase.h) ---------------------------------------- */

/* Each row is one call: the inputs to build (shape, layout, values), the attributes, the
 * dtypes it holds for and whether gradients are checked. ember-opcheck runs every row against
 * a float64 reference, in every layout, and the backward against finite differences. */
static const em_op_case scale_cases[] = {
    {.struct_size = sizeof(em_op_case), .op = "my_plugin.scale", .variant = "default alpha",
     .n_in = 1, .in = {{.ndim = 2, .shape = {3, 4}, .dtype = -1}},
     .dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64), .differentiable = true},
    {.struct_size = sizeof(em_op_case), .op = "my_plugin.scale",
     .variant = "alpha 0.5, transposed", .n_in = 1,
     .in = {{.ndim = 2, .shape = {4, 5}, .layout = EM_CASE_TRANSPOSED, .dtype = -1}},
     .attrs = {{.type = EM_ATTR_FLOAT, .v.f = 0.5}},
     .dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64), .differentiable = true},
    {.struct_size = sizeof(em_op_case), .op = "my_plugin.scale", .variant = "int32 refused",
     .n_in = 1, .in = {{.ndim = 1, .shape = {3}, .dtype = -1}},
     .dtypes = EM_CASE_DT(EM_I32), .expect = EM_ERR_DTYPE,
     .differentiable = true /* the op is, though this call fails first */},
};

/* ---- a layer: my_plugin.Scale ---------------------------------------------------------------- */

/* y = my_plugin.scale(x * weight, alpha) + bias over the last dim of x (features entries).
 * State dict: "weight" (ones) and "bias" (zeros), as PyTorch names a module's parameters. */
static const em_option_spec layer_options[] = {
    {.name = "features", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1e9, .help = "size of the last dim of an input"},
    {.name = "alpha", .types = EM_OPT_FLOAT, .def = {.f = 2.0}, .help = "the op's factor"},
};

static em_status layer_init(em_module *m, const em_options *o) {
    int64_t n = em_options_int(o, "features");
    em_status st = em_module_add_parameter(m, "weight", em_ones(1, &n, EM_F32, em_cpu()));
    return st == EM_OK ? em_module_add_parameter(m, "bias", em_zeros(1, &n, EM_F32, em_cpu()))
                       : st;
}

static em_tensor *layer_forward(em_module *m, em_tensor *const *in, int n_in) {
    (void)n_in;
    em_attr alpha = {.type = EM_ATTR_FLOAT, .v.f = em_options_float(em_module_options(m), "alpha")};
    const em_tensor *xw = em_mul(in[0], em_module_parameter(m, "weight"));
    em_tensor *y = NULL;
    if (!xw || em_op_call(em_op_find("my_plugin.scale"), &xw, 1, &alpha, &y) != EM_OK)
        return NULL;
    return em_add(y, em_module_parameter(m, "bias"));
}

static const em_module_class layer_class = {
    .struct_size = sizeof(em_module_class),
    .name = "my_plugin.Scale",
    .description = "my_plugin.scale(x * weight, alpha) + bias (template layer)",
    .options = layer_options,
    .n_options = 2,
    .init = layer_init,
    .forward = layer_forward,
    .n_inputs = 1,
};

/* ---- registration ---------------------------------------------------------------------------- */

static em_status my_plugin_register(em_registry *reg) {
    em_status st = em_op_declare(reg, &scale_schema, NULL);
    if (st != EM_OK) return st;
    em_kernel_def def = {.struct_size = sizeof def, .op = "my_plugin.scale",
                         .device_type = "cpu", .dtype = EM_F32, .priority = 0,
                         .fn = scale_f32, .name = "my_plugin_scale_cpu_f32"};
    if ((st = em_kernel_register(reg, &def, NULL)) != EM_OK) return st;
    def.dtype = EM_F64;
    def.fn = scale_f64;
    def.name = "my_plugin_scale_cpu_f64";
    if ((st = em_kernel_register(reg, &def, NULL)) != EM_OK) return st;
    if ((st = em_op_cases_register(reg, scale_cases, sizeof scale_cases / sizeof *scale_cases))
        != EM_OK)
        return st;
    return em_module_class_register(reg, &layer_class);
}

static const em_plugin_descriptor my_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "my-plugin",
    .version = "0.1.0",
    .description = "template plugin: my_plugin.scale (y = alpha * x) and layer my_plugin.Scale",
    .register_fn = my_plugin_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &my_plugin; }
