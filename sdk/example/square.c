/*
 * sdk/example/square.c — the worked example of sdk/README.md: a plugin, "ember-square", that
 * declares a new op "square" (y = x * x) and gives it CPU kernels for float32 and float64.
 *
 * It shows the whole life of a plugin:
 *   1. the entry symbol returning a static descriptor (ember_plugin_entry, at the bottom);
 *   2. the register function, which declares the op (its schema and shape/dtype inference)
 *      and registers one kernel per dtype;
 *   3. kernels that read their tensors as em_ktensor: a data pointer, shape and strides in
 *      elements — inputs may be views (transposed, sliced, broadcast), so the kernel walks
 *      strides unless both sides are contiguous;
 *   4. errors through em_set_error with the op, dtype or shape at fault.
 *
 * Build it like any plugin (see sdk/template/Makefile):
 *     cc -shared -fPIC square.c $(pkg-config --cflags --libs ember) -o ember-square.so
 * and run a program with EMBER_PLUGIN_PATH=<its directory>; then
 *     const em_op *sq = em_op_find("square");
 *     em_tensor *y;  em_op_call(sq, (const em_tensor *[]){x}, 1, NULL, &y);
 */
#include <ember/ember.h> /* includes ember/op_helpers.h */

/* ---- the op: schema and inference ------------------------------------------------------------ */

/* y has x's shape and dtype. Only floating dtypes have kernels; say so here, where the message
 * can name the dtype, rather than let dispatch report a missing kernel. */
static em_status square_infer(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                              em_tensor_meta *out) {
    em_dtype dt = em_tensor_dtype(in[0]);
    if (dt != EM_F32 && dt != EM_F64)
        return em_set_error(EM_ERR_DTYPE, "%s: dtype %s is not supported (float32, float64)",
                            em_op_name(op), em_dtype_name(dt));
    return em_infer_same(op, in, attrs, out); /* ember/op_helpers.h: x's shape and dtype */
}

static const char *const square_inputs[] = {"input"};

static const em_op_schema square_schema = {
    .struct_size = sizeof(em_op_schema),
    .name = "square",
    .n_inputs = 1,
    .input_names = square_inputs,
    .n_outputs = 1,
    .dispatch_arg = 0, /* the kernel is chosen by input 0's dtype */
    .flags = 0,        /* no promotion, no broadcasting: one input, output like it */
    .infer = square_infer,
};

/* ---- the kernels ----------------------------------------------------------------------------- */

/* Visit every element of x (and the matching one of y) in C order, following both tensors'
 * strides with ember/op_helpers.h's em_kiter. A fast path handles the common case of two
 * contiguous tensors. */
#define DEFINE_SQUARE(T, sfx)                                                                  \
    static em_status square_##sfx(const em_kernel_ctx *ctx) {                                \
        const em_ktensor *x = &ctx->in[0], *y = &ctx->out[0];                                \
        const T *xp = (const T *)x->data;                                                    \
        T *yp = (T *)y->data;                                                                \
        if (x->contiguous && y->contiguous) {                                                \
            for (int64_t i = 0; i < x->numel; i++) yp[i] = xp[i] * xp[i];                    \
            return EM_OK;                                                                    \
        }                                                                                    \
        const em_ktensor *ts[2] = {y, x};                                                    \
        em_kiter it;                                                                         \
        for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it))              \
            yp[it.off[0]] = xp[it.off[1]] * xp[it.off[1]];                                   \
        return EM_OK;                                                                        \
    }
DEFINE_SQUARE(float, f32)
DEFINE_SQUARE(double, f64)

/* ---- registration ---------------------------------------------------------------------------- */

static em_status square_register(em_registry *reg) {
    em_status st = em_op_declare(reg, &square_schema, NULL);
    if (st != EM_OK) return st; /* em_op_declare has set the message */
    const struct { em_dtype dt; em_kernel_fn fn; const char *name; } kernels[] = {
        {EM_F32, square_f32, "square_cpu_f32"},
        {EM_F64, square_f64, "square_cpu_f64"},
    };
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        em_kernel_def def = {
            .struct_size = sizeof def,
            .op = "square",
            .device_type = "cpu",
            .dtype = kernels[i].dt,
            .priority = 0,     /* the only kernel for this op; a faster one could use 10 */
            .fn = kernels[i].fn,
            .supports = NULL,  /* handles every shape and layout */
            .name = kernels[i].name,
        };
        st = em_kernel_register(reg, &def, NULL);
        /* On failure the core removes everything this plugin registered so far. */
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static const em_plugin_descriptor square_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-square",
    .version = "1.0.0",
    .description = "example op: square (y = x * x) with CPU kernels for float32 and float64",
    .register_fn = square_register,
    .shutdown_fn = NULL, /* nothing allocated, nothing to free */
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &square_plugin; }
