/*
 * layer_plugin.c — a test plugin ("ember-test-layers") registering one module class,
 * "testplug.Affine": y = x * scale + shift with a learnable scale (ones) and shift (zeros) of
 * `features` entries. test_layers.c loads it through EMBER_PLUGIN_PATH and uses it by name,
 * inside a Sequential, exactly as a built-in layer. And "testplug.GradModeProbe", the identity,
 * whose forward fails when the module's mode and the grad mode disagree (training with
 * gradients off, or evaluating with them on): test_trainer.c puts it in a model to check that
 * ember-train validates, tests and predicts under no_grad. And "testplug.NoDerivative", the
 * identity through the plugin's own op "testplug.copy", which declares no derivative: training
 * a model with it stops at backward with the error a plugin author must see. And
 * "testplug.ReservedDropout", dropout (p 0.2) whose mask's numbers the layer reserves itself
 * (em_generator_reserve) and passes to the dropout op by name, seed and offset given: an eager
 * draw even inside a graph capture, the code ember-train --graph-capture's check that the
 * generator did not move during the capture (trainer/loop.c) is for:
 * tests/test_graph_capture.sh.
 */
#include <ember/ember.h>
#include <ember/op_helpers.h>

static const em_option_spec affine_opts[] = {
    {.name = "features", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1e9, .help = "size of the last dim"},
};

static em_status affine_init(em_module *m, const em_options *o) {
    int64_t n = em_options_int(o, "features");
    em_status st = em_module_add_parameter(m, "scale", em_ones(1, &n, EM_F32, em_cpu()));
    if (st == EM_OK)
        st = em_module_add_parameter(m, "shift", em_zeros(1, &n, EM_F32, em_cpu()));
    return st;
}

static em_tensor *affine_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    return em_add(em_mul(in[0], em_module_parameter(m, "scale")),
                  em_module_parameter(m, "shift"));
}

static const em_module_class affine_class = {
    .struct_size = sizeof(em_module_class), .name = "testplug.Affine",
    .description = "x * scale + shift (a test plugin's layer)", .options = affine_opts,
    .n_options = 1, .init = affine_init, .forward = affine_forward, .n_inputs = 1,
};

static em_tensor *probe_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    bool training = em_module_training(m), grad = em_grad_enabled();
    if (training != grad) {
        em_set_error(EM_ERR_STATE, "testplug.GradModeProbe: forward in %s mode with gradients "
                     "%s", training ? "train" : "eval", grad ? "on" : "off");
        return NULL;
    }
    return em_tensor_retain(in[0]);
}

static const em_module_class probe_class = {
    .struct_size = sizeof(em_module_class), .name = "testplug.GradModeProbe",
    .description = "the identity; fails when train/eval mode and grad mode disagree",
    .forward = probe_forward, .n_inputs = 1,
};

/* testplug.copy(input) -> a copy: float32 only, no backward declared (deliberately). */
static const char *const copy_inputs[] = {"input"};
static const em_op_schema copy_schema = {
    .struct_size = sizeof(em_op_schema), .name = "testplug.copy", .n_inputs = 1,
    .input_names = copy_inputs, .n_outputs = 1, .infer = em_infer_same,
};

static em_status copy_f32(const em_kernel_ctx *ctx) {
    const em_ktensor *ts[2] = {&ctx->out[0], &ctx->in[0]};
    em_kiter it;
    for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it))
        ((float *)ts[0]->data)[it.off[0]] = ((const float *)ts[1]->data)[it.off[1]];
    return EM_OK;
}

static em_tensor *noderiv_forward(em_module *m, em_tensor *const *in, int n) {
    (void)m, (void)n;
    em_tensor *out = NULL;
    const em_tensor *x = in[0];
    return em_op_call(em_op_find("testplug.copy"), &x, 1, NULL, &out) == EM_OK ? out : NULL;
}

static const em_module_class noderiv_class = {
    .struct_size = sizeof(em_module_class), .name = "testplug.NoDerivative",
    .description = "the identity through an op without a derivative", .forward = noderiv_forward,
    .n_inputs = 1,
};

static em_tensor *resdrop_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    const em_tensor *x = in[0];
    if (!em_module_training(m)) return em_tensor_retain(in[0]);
    /* 4 draws a block, as em_dropout */
    em_rng_state s = em_generator_reserve(NULL, ((uint64_t)em_tensor_numel(x) + 3) / 4);
    em_attr a[4] = {{.type = EM_ATTR_FLOAT, .v.f = 0.2}, {.type = EM_ATTR_BOOL, .v.b = true},
                    {.type = EM_ATTR_INT, .v.i = (int64_t)s.seed},
                    {.type = EM_ATTR_INT, .v.i = (int64_t)s.offset}};
    em_tensor *out[2] = {NULL, NULL}; /* the output and the mask, in the thread's scope */
    return em_op_call(em_op_find("dropout"), &x, 1, a, out) == EM_OK ? out[0] : NULL;
}

static const em_module_class resdrop_class = {
    .struct_size = sizeof(em_module_class), .name = "testplug.ReservedDropout",
    .description = "dropout p 0.2 from blocks the layer reserves with em_generator_reserve",
    .forward = resdrop_forward, .n_inputs = 1,
};

static em_status reg(em_registry *r) {
    em_status st = em_module_class_register(r, &affine_class);
    if (st == EM_OK) st = em_module_class_register(r, &probe_class);
    if (st == EM_OK) st = em_op_declare(r, &copy_schema, NULL);
    em_kernel_def k = {.struct_size = sizeof k, .op = "testplug.copy", .device_type = "cpu",
                       .dtype = EM_F32, .fn = copy_f32, .name = "testplug_copy_cpu_f32"};
    if (st == EM_OK) st = em_kernel_register(r, &k, NULL);
    if (st == EM_OK) st = em_module_class_register(r, &noderiv_class);
    return st == EM_OK ? em_module_class_register(r, &resdrop_class) : st;
}

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR, .name = "ember-test-layers",
    .version = "1.0", .description = "a module class from a test plugin", .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }
