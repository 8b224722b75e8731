/*
 * opcheck_wrong.c — test plugin "ember-opcheck-wrong" (built for `make check`, never
 * installed): what ember-opcheck must catch, next to what it must pass (tests/test_opcheck.sh).
 *
 *   - "opcheck.scale2" (y = 2x): float32/float64 kernels, a backward written with ops, and case
 *     rows registered with em_op_cases_register — correct, so it passes eval, grad and support;
 *   - "opcheck.nograd" (y = x + 1): kernels but neither a backward nor EM_OP_NONDIFF, and no
 *     case rows — checked with generic inputs, and its grad check fails;
 *   - a float32 kernel for the standard op "sigmoid" above the CPU backend's, off by a factor
 *     1 + 1e-3 — caught against the kernel below it;
 *   - a float32 kernel for the standard op "tanh" whose supports() declines every call —
 *     reported as declined, never as passed;
 *   - "opcheck.leak" (y = x), whose kernel keeps a tensor it made — the allocator's bytes in
 *     use stay above their baseline after the case.
 */
#include <ember/ember.h>
#include <math.h>

static em_status infer_floating(const em_op *op, const em_tensor *const *in,
                                const em_attr *attrs, em_tensor_meta *out) {
    em_dtype dt = em_tensor_dtype(in[0]);
    if (dt != EM_F32 && dt != EM_F64)
        return em_set_error(EM_ERR_DTYPE, "%s: dtype %s is not supported (float32, float64)",
                            em_op_name(op), em_dtype_name(dt));
    return em_infer_same(op, in, attrs, out);
}

/* y = EXPR(x) over every element, walking strides. */
#define ELEMENTWISE(name, T, EXPR)                                                             \
    static em_status name(const em_kernel_ctx *k) {                                           \
        const em_ktensor *ts[2] = {&k->out[0], &k->in[0]};                                    \
        T *y = k->out[0].data;                                                                \
        const T *xp = k->in[0].data;                                                          \
        em_kiter it;                                                                          \
        for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it)) {            \
            T x = xp[it.off[1]];                                                              \
            y[it.off[0]] = (EXPR);                                                            \
        }                                                                                     \
        return EM_OK;                                                                         \
    }
ELEMENTWISE(scale2_f32, float, 2 * x)
ELEMENTWISE(scale2_f64, double, 2 * x)
ELEMENTWISE(nograd_f32, float, x + 1)
ELEMENTWISE(nograd_f64, double, x + 1)
ELEMENTWISE(sigmoid_off_f32, float, (1.0f + 1e-3f) / (1.0f + expf(-x)))
ELEMENTWISE(tanh_never_f32, float, tanhf(x))

ELEMENTWISE(leak_copy_f32, float, x)
static em_status leak_f32(const em_kernel_ctx *k) {
    int64_t n = 256;
    em_tensor_retain(em_empty(1, &n, EM_F32, em_cpu())); /* never released: the bug */
    return leak_copy_f32(k);
}

static bool never(const em_kernel_ctx *k) {
    (void)k;
    return false;
}

static em_status d_scale2(const em_backward_ctx *c, em_tensor **gi) {
    if (c->needs_grad[0] && c->grad_out[0] && !(gi[0] = em_mul_scalar(c->grad_out[0], 2)))
        return em_last_status();
    return EM_OK;
}

static const char *const x_name[] = {"input"};
static const em_op_schema scale2 = {
    .struct_size = sizeof scale2, .name = "opcheck.scale2", .n_inputs = 1,
    .input_names = x_name, .n_outputs = 1, .dispatch_arg = 0, .infer = infer_floating,
    .backward = d_scale2,
};
static const em_op_schema leak = {
    .struct_size = sizeof leak, .name = "opcheck.leak", .n_inputs = 1, .input_names = x_name,
    .n_outputs = 1, .dispatch_arg = 0, .flags = EM_OP_NONDIFF, .infer = infer_floating,
};
static const em_op_schema nograd = {
    .struct_size = sizeof nograd, .name = "opcheck.nograd", .n_inputs = 1,
    .input_names = x_name, .n_outputs = 1, .dispatch_arg = 0, .infer = infer_floating,
};

#define DT2 (EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64))
static const em_op_case scale2_cases[] = {
    {.struct_size = sizeof(em_op_case), .op = "opcheck.scale2", .variant = "2-d", .n_in = 1,
     .in = {{.ndim = 2, .shape = {3, 4}, .dtype = -1}}, .dtypes = DT2, .differentiable = true},
    {.struct_size = sizeof(em_op_case), .op = "opcheck.scale2", .variant = "transposed",
     .n_in = 1, .in = {{.ndim = 2, .shape = {3, 5}, .layout = EM_CASE_TRANSPOSED, .dtype = -1}},
     .dtypes = DT2, .differentiable = true},
    {.struct_size = sizeof(em_op_case), .op = "opcheck.scale2", .variant = "int64 input",
     .n_in = 1, .in = {{.ndim = 1, .shape = {3}, .dtype = -1}},
     .dtypes = EM_CASE_DT(EM_I64), .expect = EM_ERR_DTYPE, .differentiable = true},
    {.struct_size = sizeof(em_op_case), .op = "opcheck.leak", .variant = "1-d", .n_in = 1,
     .in = {{.ndim = 1, .shape = {5}, .dtype = -1}}, .dtypes = EM_CASE_DT(EM_F32)},
};

static em_status reg(em_registry *r) {
    em_status st = em_op_declare(r, &scale2, NULL);
    if (st == EM_OK) st = em_op_declare(r, &nograd, NULL);
    if (st == EM_OK) st = em_op_declare(r, &leak, NULL);
    if (st == EM_OK)
        st = em_op_cases_register(r, scale2_cases, sizeof scale2_cases / sizeof scale2_cases[0]);
    const em_kernel_def ks[] = {
        {.op = "opcheck.scale2", .dtype = EM_F32, .fn = scale2_f32, .name = "opcheck_scale2_f32"},
        {.op = "opcheck.scale2", .dtype = EM_F64, .fn = scale2_f64, .name = "opcheck_scale2_f64"},
        {.op = "opcheck.nograd", .dtype = EM_F32, .fn = nograd_f32, .name = "opcheck_nograd_f32"},
        {.op = "opcheck.nograd", .dtype = EM_F64, .fn = nograd_f64, .name = "opcheck_nograd_f64"},
        {.op = "opcheck.leak", .dtype = EM_F32, .fn = leak_f32, .name = "opcheck_leak_f32"},
        {.op = "sigmoid", .dtype = EM_F32, .priority = 50, .fn = sigmoid_off_f32,
         .name = "opcheck_sigmoid_f32_off"},
        {.op = "tanh", .dtype = EM_F32, .priority = 50, .fn = tanh_never_f32, .supports = never,
         .name = "opcheck_tanh_f32_never"},
    };
    for (size_t i = 0; st == EM_OK && i < sizeof ks / sizeof ks[0]; i++) {
        em_kernel_def k = ks[i];
        k.struct_size = sizeof k;
        k.device_type = "cpu";
        st = em_kernel_register(r, &k, NULL);
    }
    return st;
}

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR, .name = "ember-opcheck-wrong",
    .version = "1.0", .description = "ember-opcheck's test plugin: right and wrong kernels",
    .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }
