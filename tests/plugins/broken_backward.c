/*
 * broken_backward.c — a test plugin ("ember-test-broken-backward") whose op
 * "broken_backward.double" (y = 2 * x, float32 and float64, correct kernels and case rows) has
 * a backward off by a factor of two (it returns grad_out instead of 2 * grad_out).
 * tests/test_sdk_install.sh runs `ember-opcheck --plugin` on it: the grad mode must fail,
 * naming the op. Never installed.
 */
#include <ember/ember.h>
#include <ember/opcase.h>

static em_status double_backward(const em_backward_ctx *ctx, em_tensor **grad_in) {
    if (!ctx->needs_grad[0] || !ctx->grad_out[0]) return EM_OK;
    grad_in[0] = em_tensor_retain(ctx->grad_out[0]); /* wrong: d(2x)/dx is 2 */
    return EM_OK;
}

static const em_op_schema double_schema = {
    .struct_size = sizeof(em_op_schema), .name = "broken_backward.double", .n_inputs = 1,
    .n_outputs = 1, .infer = em_infer_same, .backward = double_backward,
};

#define DEFINE_DOUBLE(T, sfx)                                                                  \
    static em_status double_##sfx(const em_kernel_ctx *ctx) {                                \
        const em_ktensor *ts[2] = {&ctx->out[0], &ctx->in[0]};                               \
        em_kiter it;                                                                         \
        for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it))              \
            ((T *)ts[0]->data)[it.off[0]] = 2 * ((const T *)ts[1]->data)[it.off[1]];         \
        return EM_OK;                                                                        \
    }
DEFINE_DOUBLE(float, f32)
DEFINE_DOUBLE(double, f64)

static const em_op_case double_cases[] = {
    {.struct_size = sizeof(em_op_case), .op = "broken_backward.double", .variant = "2-d",
     .n_in = 1, .in = {{.ndim = 2, .shape = {3, 4}, .dtype = -1}},
     .dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64), .differentiable = true},
};

static em_status reg(em_registry *r) {
    em_status st = em_op_declare(r, &double_schema, NULL);
    em_kernel_def k = {.struct_size = sizeof k, .op = "broken_backward.double",
                       .device_type = "cpu", .dtype = EM_F32, .fn = double_f32,
                       .name = "broken_backward_double_f32"};
    if (st == EM_OK) st = em_kernel_register(r, &k, NULL);
    k.dtype = EM_F64;
    k.fn = double_f64;
    k.name = "broken_backward_double_f64";
    if (st == EM_OK) st = em_kernel_register(r, &k, NULL);
    return st == EM_OK ? em_op_cases_register(r, double_cases, 1) : st;
}

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-test-broken-backward", .version = "1.0",
    .description = "an op whose backward is off by a factor of two (ember-opcheck must say so)",
    .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }
