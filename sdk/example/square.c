/*
 * sdk/example/square.c — the worked example of sdk/README.md: a plugin, "ember-square", that
 * declares a new op "square" (y = x * x) with its derivative, gives it CPU kernels for float32
 * and float64, and registers a layer, "square.Quadratic", built on the op.
 *
 * It shows the whole life of a plugin:
 *   1. the entry symbol returning a static descriptor (ember_plugin_entry, at the bottom);
 *   2. the register function, which declares the op (its schema and shape/dtype inference)
 *      and registers one kernel per dtype;
 *   3. kernels that read their tensors as em_ktensor: a data pointer, shape and strides in
 *      elements — inputs may be views (transposed, sliced, broadcast), so the kernel walks
 *      strides unless both sides are contiguous;
 *   4. errors through em_set_error with the op, dtype or shape at fault;
 *   5. the derivative: a backward written with ops, and the inputs it needs saved (`saves`);
 *   6. a module class: options, a parameter and a buffer (state-dict names "weight", "bias",
 *      "running_mean", as PyTorch names a module's), train/eval behaviour, usable by name from
 *      C (em_module_new("square.Quadratic", opts)) and from an ember-train config.
 *
 * Build it like any plugin (see sdk/template/Makefile):
 *     cc -shared -fPIC square.c $(pkg-config --cflags --libs ember) -o ember-square.so
 * and run a program with EMBER_PLUGIN_PATH=<its directory>; then
 *     const em_op *sq = em_op_find("square");
 *     em_tensor *y;  em_op_call(sq, (const em_tensor *[]){x}, 1, NULL, &y);
 */
#include <ember/ember.h> /* includes ember/op_helpers.h */
#include <ember/opcase.h>

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

static em_status square_backward(const em_backward_ctx *ctx, em_tensor **grad_in);

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
    .backward = square_backward,   /* (defined below) the derivative, written with ops */
    .saves = EM_SAVE_INPUT(0),     /* it needs x: keep input 0 alive for it */
};

/* ---- the derivative ---------------------------------------------------------------------------- */

/* d(x * x)/dx = 2x, so the gradient of the input is grad_out * 2x. A backward is written with
 * ops (em_mul, ...), not loops, so it runs on every device that has kernels for them; it runs
 * with grad mode off inside a scope of its own, so its temporaries need no release, and the
 * tensor it leaves in grad_in[0] is kept by the autograd engine. x is there because the schema
 * asks for it to be saved (.saves = EM_SAVE_INPUT(0)); an input that is not saved is NULL. */
static em_status square_backward(const em_backward_ctx *ctx, em_tensor **grad_in) {
    if (!ctx->needs_grad[0] || !ctx->grad_out[0]) return EM_OK; /* nothing flows: no grad */
    grad_in[0] = em_mul(ctx->grad_out[0], em_mul_scalar(ctx->in[0], 2.0));
    return grad_in[0] ? EM_OK : em_last_status(); /* the failing op has set the message */
}

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

/* ---- sample inputs: the case rows ember-opcheck checks the op with ------------------------------ */

/* One row per call to try: the inputs to build (shape, layout, values; dtype -1 is the row's),
 * attributes (none here), the dtypes the row holds for, what they give (EM_OK, or the error
 * of an invalid call) and whether the backward is checked by finite differences. The registry
 * references the rows: keep them static const. */
static const em_op_case square_cases[] = {
    {.struct_size = sizeof(em_op_case), .op = "square", .variant = "2-d", .n_in = 1,
     .in = {{.ndim = 2, .shape = {3, 4}, .dtype = -1}},
     .dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64), .differentiable = true},
    {.struct_size = sizeof(em_op_case), .op = "square", .variant = "transposed", .n_in = 1,
     .in = {{.ndim = 2, .shape = {4, 5}, .layout = EM_CASE_TRANSPOSED, .dtype = -1}},
     .dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64), .differentiable = true},
    {.struct_size = sizeof(em_op_case), .op = "square", .variant = "0-dim", .n_in = 1,
     .in = {{.ndim = 0, .dtype = -1}},
     .dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64), .differentiable = true},
    {.struct_size = sizeof(em_op_case), .op = "square", .variant = "int32 refused", .n_in = 1,
     .in = {{.ndim = 1, .shape = {3}, .dtype = -1}}, .dtypes = EM_CASE_DT(EM_I32),
     .expect = EM_ERR_DTYPE, .differentiable = true /* the op is; this call fails first */},
};

/* ---- a layer that uses the op: square.Quadratic ------------------------------------------------ */

/* y = weight * (x * x - center) + bias over inputs of shape (N, features), per feature. In
 * training mode center is the batch mean of x * x, and the buffer running_mean follows it
 * (running_mean = (1 - momentum) * running_mean + momentum * batch mean, not recorded by
 * autograd); in eval mode center is running_mean, and nothing changes — the way BatchNorm
 * uses its running statistics. State dict: "weight", "bias" (parameters, float32, ones and
 * zeros) and "running_mean" (a persistent buffer, zeros); inside a Sequential at position 1,
 * "1.weight", "1.bias", "1.running_mean", as PyTorch names them. */
static const em_option_spec quadratic_options[] = {
    {.name = "features", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1e9, .help = "size of dim 1 of an input (N, features)"},
    {.name = "momentum", .types = EM_OPT_FLOAT, .def = {.f = 0.1}, .has_range = true, .min = 0,
     .max = 1, .help = "how far running_mean moves towards each training batch's mean"},
};

typedef struct quadratic_state { /* class-private, zeroed, freed with the module */
    int64_t features;
    double momentum;
    const em_op *square;         /* found once, at init */
} quadratic_state;

/* Options arrive resolved (every option has a value, checked against its spec). Tensors made
 * here are released when init returns unless the module holds them: add_parameter and
 * add_buffer retain theirs. */
static em_status quadratic_init(em_module *m, const em_options *o) {
    quadratic_state *s = em_module_state(m);
    s->features = em_options_int(o, "features");
    s->momentum = em_options_float(o, "momentum");
    if (!(s->square = em_op_find("square"))) return em_last_status();
    int64_t shape[1] = {s->features};
    em_status st = em_module_add_parameter(m, "weight", em_ones(1, shape, EM_F32, em_cpu()));
    if (st == EM_OK)
        st = em_module_add_parameter(m, "bias", em_zeros(1, shape, EM_F32, em_cpu()));
    if (st == EM_OK)
        st = em_module_add_buffer(m, "running_mean", em_zeros(1, shape, EM_F32, em_cpu()),
                                  true /* persistent: in the state dict */);
    return st;
}

/* Runs in a scope of its own: intermediates go with it, the result (a new reference) goes to
 * the caller. Errors are prefixed with the class name by the core. */
static em_tensor *quadratic_forward(em_module *m, em_tensor *const *in, int n_in) {
    (void)n_in;
    quadratic_state *s = em_module_state(m);
    const em_tensor *x = in[0];
    if (em_tensor_ndim(x) != 2 || em_tensor_size(x, 1) != s->features) {
        char shape[96];
        em_set_error(EM_ERR_SHAPE, "expected an input of shape (N, %lld), got %s",
                     (long long)s->features,
                     em_shape_str(em_tensor_ndim(x), em_tensor_shape(x), shape, sizeof shape));
        return NULL;
    }
    em_tensor *sq = NULL;
    if (em_op_call(s->square, &x, 1, NULL, &sq) != EM_OK) return NULL; /* recorded: square_backward */
    em_tensor *running = em_module_buffer(m, "running_mean");
    em_tensor *center = running;
    if (em_module_training(m)) {
        center = em_mean(sq, 1, (const int[]){0}, false);
        if (!center) return NULL;
        /* The running statistic is state, not part of the graph: update it with gradients off. */
        em_grad_mode_push(EM_GRAD_DISABLED);
        em_status st = em_mul_scalar_(running, 1.0 - s->momentum);
        if (st == EM_OK) st = em_add_(running, em_mul_scalar(center, s->momentum));
        em_grad_mode_pop();
        if (st != EM_OK) return NULL;
    }
    return em_add(em_mul(em_sub(sq, center), em_module_parameter(m, "weight")),
                  em_module_parameter(m, "bias"));
}

static const em_module_class quadratic_class = {
    .struct_size = sizeof(em_module_class),
    .name = "square.Quadratic", /* prefix layer names with your plugin's, like op names */
    .description = "weight * (x * x - mean of x * x) + bias, per feature (the SDK example)",
    .options = quadratic_options,
    .n_options = 2,
    .state_size = sizeof(quadratic_state),
    .init = quadratic_init,
    .forward = quadratic_forward,
    .n_inputs = 1,
};

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
    st = em_op_cases_register(reg, square_cases, sizeof square_cases / sizeof square_cases[0]);
    if (st != EM_OK) return st;
    /* The layer needs the op: register it after (its init finds "square" by name). */
    return em_module_class_register(reg, &quadratic_class);
}

static const em_plugin_descriptor square_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-square",
    .version = "1.0.0",
    .description = "example op: square (y = x * x) with its derivative and CPU kernels for "
                   "float32 and float64, and a layer using it: square.Quadratic",
    .register_fn = square_register,
    .shutdown_fn = NULL, /* nothing allocated, nothing to free */
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &square_plugin; }
