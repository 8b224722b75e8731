/*
 * abi_v10.c — "ember-abi-v1.0": a plugin built against the frozen Ember 1.0 headers
 * (tests/abi/v1.0/, never the current ones; see its README), loaded by tests/test_abi.c into
 * the current core. It uses what a 1.0 plugin uses, through the 1.0 struct layouts and sizes:
 *   - an op, "abi10.square" (y = x * x), declared with the 1.0 em_op_schema, whose backward
 *     (grad_x = 2 * x * grad_y) needs its input saved, asked for with the 1.0 EM_SAVE_INPUT;
 *   - its float32 CPU kernel, registered with the 1.0 em_kernel_def and reading the 1.0
 *     em_kernel_ctx;
 *   - a layer class, "abi10.ScaledSquare" (y = square(x) * scale, a learnable scale of
 *     `features` entries), registered with the 1.0 em_module_class and options;
 *   - a dataset class, "abi10-ramp" (item i: input (2) float32 {i, 2i}, target the label
 *     i % 3; `length` items), registered with the 1.0 em_dataset_class_def (open/read over
 *     em_dataset_info), which the 1.1 core reads through the old-size path.
 * abi10_struct_sizes() reports the sizes it was built with, for the test to compare.
 */
#include <stddef.h>
#include <stdlib.h>

#include <ember/ember.h>
#include <ember/op_helpers.h>

static const char *const square_inputs[] = {"input"};

/* grad_x = 2 * x * grad_y: the saved input (ctx->in[0]) is what EM_SAVE_INPUT(0) asked for. */
static em_status square_backward(const em_backward_ctx *ctx, em_tensor **grad_in) {
    if (!ctx->in[0] || !ctx->grad_out[0])
        return em_set_error(EM_ERR_STATE, "abi10.square backward: input not saved");
    grad_in[0] = em_mul_scalar(em_mul(ctx->in[0], ctx->grad_out[0]), 2.0); /* kept by the engine */
    return grad_in[0] ? EM_OK : em_last_status();
}

static const em_op_schema square_schema = {
    .struct_size = sizeof(em_op_schema), .name = "abi10.square", .n_inputs = 1,
    .input_names = square_inputs, .n_outputs = 1, .dispatch_arg = 0, .infer = em_infer_same,
    .backward = square_backward, .saves = EM_SAVE_INPUT(0),
};

static em_status square_f32(const em_kernel_ctx *ctx) {
    if (ctx->n_in != 1 || ctx->n_out != 1)
        return em_set_error(EM_ERR_INVALID, "abi10.square: %d inputs and %d outputs",
                            ctx->n_in, ctx->n_out);
    const em_ktensor *ts[2] = {&ctx->out[0], &ctx->in[0]};
    em_kiter it;
    for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it)) {
        float x = ((const float *)ts[1]->data)[it.off[1]];
        ((float *)ts[0]->data)[it.off[0]] = x * x;
    }
    return EM_OK;
}

static const em_option_spec layer_opts[] = {
    {.name = "features", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1e9, .help = "size of the last dim"},
};

static em_status layer_init(em_module *m, const em_options *o) {
    int64_t n = em_options_int(o, "features");
    return em_module_add_parameter(m, "scale", em_full(1, &n, 0.5, EM_F32, em_cpu()));
}

static em_tensor *layer_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    em_tensor *y = NULL;
    const em_tensor *x = in[0];
    if (em_op_call(em_op_find("abi10.square"), &x, 1, NULL, &y) != EM_OK) return NULL;
    return em_mul(y, em_module_parameter(m, "scale"));
}

static const em_module_class layer_class = {
    .struct_size = sizeof(em_module_class), .name = "abi10.ScaledSquare",
    .description = "square(x) * scale, from a plugin built against the 1.0 headers",
    .options = layer_opts, .n_options = 1, .init = layer_init, .forward = layer_forward,
    .n_inputs = 1,
};

static const em_option_spec ramp_opts[] = {
    {.name = "length", .types = EM_OPT_INT, .def = {.i = 7}, .has_range = true, .min = 1,
     .max = 1e6, .help = "items"},
};

static em_status ramp_open(const em_options *o, em_dataset_info *info, void **state) {
    int64_t *n = malloc(sizeof *n);
    if (!n) return em_set_error(EM_ERR_NOMEM, "abi10-ramp: out of memory");
    *n = em_options_int(o, "length");
    info->length = *n;
    info->input_ndim = 1;
    info->input_shape[0] = 2;
    info->input_dtype = EM_F32;
    info->target_dtype = EM_I64;
    info->num_classes = 3;
    *state = n;
    return EM_OK;
}

static em_status ramp_read(void *state, const int64_t *idx, int64_t n, void *inputs,
                           void *targets) {
    (void)state;
    for (int64_t j = 0; j < n; j++) {
        ((float *)inputs)[2 * j] = (float)idx[j];
        ((float *)inputs)[2 * j + 1] = (float)(2 * idx[j]);
        ((int64_t *)targets)[j] = idx[j] % 3;
    }
    return EM_OK;
}

static const em_dataset_class_def ramp_class = {
    .struct_size = sizeof(em_dataset_class_def), .name = "abi10-ramp",
    .description = "a ramp, from a plugin built against the 1.0 headers", .options = ramp_opts,
    .n_options = 1, .open = ramp_open, .read = ramp_read, .close = free,
};

static em_status reg(em_registry *r) {
    em_status st = em_op_declare(r, &square_schema, NULL);
    em_kernel_def k = {.struct_size = sizeof k, .op = "abi10.square", .device_type = "cpu",
                       .dtype = EM_F32, .fn = square_f32, .name = "abi10_square_cpu_f32"};
    if (st == EM_OK) st = em_kernel_register(r, &k, NULL);
    if (st == EM_OK) st = em_module_class_register(r, &layer_class);
    return st == EM_OK ? em_dataset_class_register(r, &ramp_class) : st;
}

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR, .name = "ember-abi-v1.0",
    .version = "1.0", .description = "built against the Ember 1.0 headers", .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }

/* The 1.0 em_dataset_class_def and em_loader_options sizes this plugin was built with. */
EM_PLUGIN_EXPORT void abi10_data_sizes(size_t out[2]);
void abi10_data_sizes(size_t out[2]) {
    out[0] = sizeof(em_dataset_class_def);
    out[1] = sizeof(em_loader_options);
}

/* The 1.0 sizes this plugin was built with, and its EM_SAVE_INPUT(0) and EM_SAVE_OUTPUT(0). */
EM_PLUGIN_EXPORT void abi10_struct_sizes(size_t out[8]);
void abi10_struct_sizes(size_t out[8]) {
    out[0] = sizeof(em_plugin_descriptor);
    out[1] = sizeof(em_op_schema);
    out[2] = sizeof(em_kernel_def);
    out[3] = sizeof(em_kernel_ctx);
    out[4] = sizeof(em_backward_ctx);
    out[5] = sizeof(em_module_class);
    out[6] = EM_SAVE_INPUT(0);
    out[7] = EM_SAVE_OUTPUT(0);
}
