// sdk/example/softsign.cpp — an Ember plugin in C++ (sdk/README.md, "A plugin in C++"):
// "ember-cxx-example" declares the op "cxx_example.softsign" (y = x / (1 + |x|)) with its
// derivative (dy/dx = 1 / (1 + |x|)^2, written with ops), CPU kernels for float32 and float64
// from one function template, and case rows for ember-opcheck.
//
// What C++ changes: the entry point needs C linkage (extern "C"), so that libember finds the
// symbol "ember_plugin_entry" by that name; exceptions must never cross into Ember (it is C:
// catch them in every function Ember calls and turn them into em_set_error); the structs are
// filled field by field (designated initialisers are C++20 and must follow declaration order).
//
//     g++ -std=c++17 -O2 -fPIC -fvisibility=hidden -shared -Wl,-z,defs softsign.cpp
//         $(pkg-config --cflags --libs ember) -o ember-cxx-example.so      (one line)
#include <cmath>
#include <cstring>
#include <exception>
#include <new>

#include <ember/ember.h>
#include <ember/opcase.h>

namespace {

constexpr const char *kOp = "cxx_example.softsign";

// y has x's shape and dtype; float32 and float64 have kernels.
em_status softsign_infer(const em_op *op, const em_tensor *const *in, const em_attr *attrs,
                         em_tensor_meta *out) {
    em_dtype dt = em_tensor_dtype(in[0]);
    if (dt != EM_F32 && dt != EM_F64)
        return em_set_error(EM_ERR_DTYPE, "%s: dtype %s is not supported (float32, float64)",
                            em_op_name(op), em_dtype_name(dt));
    return em_infer_same(op, in, attrs, out);
}

// d/dx x / (1 + |x|) = 1 / (1 + |x|)^2: grad_in = grad_out / (1 + |x|)^2, with ops.
em_status softsign_backward(const em_backward_ctx *ctx, em_tensor **grad_in) {
    if (!ctx->needs_grad[0] || !ctx->grad_out[0]) return EM_OK;
    em_tensor *d = em_add_scalar(em_abs(ctx->in[0]), 1.0);
    grad_in[0] = d ? em_div(ctx->grad_out[0], em_mul(d, d)) : nullptr;
    return grad_in[0] ? EM_OK : em_last_status();
}

// One kernel body for every dtype. No exception can leave it (nothing in it throws), and one
// that could would be caught here and reported with em_set_error.
template <typename T>
em_status softsign_kernel(const em_kernel_ctx *ctx) {
    try {
        const em_ktensor *ts[2] = {&ctx->out[0], &ctx->in[0]};
        const T *x = static_cast<const T *>(ctx->in[0].data);
        T *y = static_cast<T *>(ctx->out[0].data);
        em_kiter it;
        for (em_kiter_init(&it, 2, ts); em_kiter_more(&it); em_kiter_next(&it)) {
            T v = x[it.off[1]];
            y[it.off[0]] = v / (T(1) + std::abs(v));
        }
        return EM_OK;
    } catch (const std::exception &e) {
        return em_set_error(EM_ERR_INVALID, "%s: %s", em_op_name(ctx->op), e.what());
    }
}

// Case rows are referenced by the registry, not copied: static storage.
const em_op_case *softsign_cases(size_t *n) {
    static em_op_case rows[3];
    static bool made = false;
    if (!made) {
        std::memset(rows, 0, sizeof rows);
        for (em_op_case &r : rows) {
            r.struct_size = sizeof(em_op_case);
            r.op = kOp;
            r.n_in = 1;
            r.in[0].dtype = -1; // the row's dtype
            r.dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64);
            r.differentiable = true;
        }
        rows[0].variant = "2-d";
        rows[0].in[0].ndim = 2;
        rows[0].in[0].shape[0] = 3;
        rows[0].in[0].shape[1] = 4;
        rows[1].variant = "sliced 3-d";
        rows[1].in[0].ndim = 3;
        rows[1].in[0].shape[0] = 2;
        rows[1].in[0].shape[1] = 3;
        rows[1].in[0].shape[2] = 5;
        rows[1].in[0].layout = EM_CASE_SLICED;
        rows[2].variant = "int64 refused";
        rows[2].in[0].ndim = 1;
        rows[2].in[0].shape[0] = 4;
        rows[2].dtypes = EM_CASE_DT(EM_I64);
        rows[2].expect = EM_ERR_DTYPE; // still differentiable: the op is, the call fails first
        made = true;
    }
    *n = sizeof rows / sizeof rows[0];
    return rows;
}

em_status cxx_register(em_registry *reg) {
    static const char *const inputs[] = {"input"};
    em_op_schema s;
    std::memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.name = kOp;
    s.n_inputs = 1;
    s.input_names = inputs;
    s.n_outputs = 1;
    s.dispatch_arg = 0;
    s.infer = softsign_infer;
    s.backward = softsign_backward;
    s.saves = EM_SAVE_INPUT(0);
    em_status st = em_op_declare(reg, &s, nullptr);
    if (st != EM_OK) return st;
    struct { em_dtype dt; em_kernel_fn fn; const char *name; } kernels[] = {
        {EM_F32, softsign_kernel<float>, "cxx_example_softsign_cpu_f32"},
        {EM_F64, softsign_kernel<double>, "cxx_example_softsign_cpu_f64"},
    };
    for (const auto &k : kernels) {
        em_kernel_def def;
        std::memset(&def, 0, sizeof def);
        def.struct_size = sizeof def;
        def.op = kOp;
        def.device_type = "cpu";
        def.dtype = k.dt;
        def.fn = k.fn;
        def.name = k.name;
        if ((st = em_kernel_register(reg, &def, nullptr)) != EM_OK) return st;
    }
    size_t n = 0;
    const em_op_case *rows = softsign_cases(&n);
    return em_op_cases_register(reg, rows, n);
}

em_plugin_descriptor make_descriptor() {
    em_plugin_descriptor d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.abi_major = EM_PLUGIN_ABI_MAJOR;
    d.name = "ember-cxx-example";
    d.version = "1.0.0";
    d.description = "example C++ plugin: cxx_example.softsign (y = x / (1 + |x|))";
    d.register_fn = cxx_register;
    return d;
}

} // namespace

// C linkage: the loader looks the symbol up by its C name. The descriptor is made on the first
// call (a function-local static), not by a global constructor.
extern "C" EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) {
    static const em_plugin_descriptor descriptor = make_descriptor();
    return &descriptor;
}
