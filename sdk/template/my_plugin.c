/*
 * my_plugin.c — a minimal Ember plugin to copy and rename: it declares one op,
 * "my_plugin.scale" (y = alpha * x, alpha a float attribute, default 2), with a CPU kernel for
 * float32. See ../README.md (the SDK guide) for what each piece means.
 *
 *     make                                     # builds my_plugin.so
 *     EMBER_PLUGIN_PATH=$PWD ember-info        # shows it loaded, with its op and kernel
 */
#include <string.h>

#include <ember/ember.h>

/* ---- the op ---------------------------------------------------------------------------------- */

/* Output 0: x's shape, float32 only (the only dtype with a kernel). */
static em_status scale_infer(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                             em_tensor_meta *out) {
    (void)attrs;
    if (em_tensor_dtype(in[0]) != EM_F32)
        return em_set_error(EM_ERR_DTYPE, "%s: dtype %s is not supported (float32)",
                            em_op_name(op), em_dtype_name(em_tensor_dtype(in[0])));
    out[0].dtype = EM_F32;
    out[0].ndim = em_tensor_ndim(in[0]);
    memcpy(out[0].shape, em_tensor_shape(in[0]), sizeof(int64_t) * (size_t)out[0].ndim);
    return EM_OK;
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
};

/* ---- the kernel ------------------------------------------------------------------------------ */

/* x may be any view (strided, transposed); y is the op's output. Walk both by strides. */
static em_status scale_f32(const em_kernel_ctx *ctx) {
    const em_ktensor *x = &ctx->in[0], *y = &ctx->out[0];
    bool given = ctx->attrs && ctx->attrs[0].type == EM_ATTR_FLOAT; /* NONE: the default */
    float alpha = given ? (float)ctx->attrs[0].v.f : 2.0f;
    const float *xp = (const float *)x->data;
    float *yp = (float *)y->data;
    int64_t idx[EM_MAX_DIMS] = {0}, xo = 0, yo = 0;
    for (int64_t n = 0; n < x->numel; n++) {
        yp[yo] = alpha * xp[xo];
        for (int d = x->ndim - 1; d >= 0; d--) { /* next index, last dim fastest */
            xo += x->strides[d];
            yo += y->strides[d];
            if (++idx[d] < x->shape[d]) break;
            xo -= x->strides[d] * x->shape[d];
            yo -= y->strides[d] * y->shape[d];
            idx[d] = 0;
        }
    }
    return EM_OK;
}

/* ---- registration ---------------------------------------------------------------------------- */

static em_status my_plugin_register(em_registry *reg) {
    em_status st = em_op_declare(reg, &scale_schema, NULL);
    if (st != EM_OK) return st;
    em_kernel_def def = {.struct_size = sizeof def, .op = "my_plugin.scale",
                         .device_type = "cpu", .dtype = EM_F32, .priority = 0,
                         .fn = scale_f32, .name = "my_plugin_scale_cpu_f32"};
    return em_kernel_register(reg, &def, NULL);
}

static const em_plugin_descriptor my_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "my-plugin",
    .version = "0.1.0",
    .description = "template plugin: my_plugin.scale (y = alpha * x)",
    .register_fn = my_plugin_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &my_plugin; }
