/*
 * ember/dispatch.h — op schemas, kernels, and how the core picks one to run.
 *
 * An op is declared once by a schema: its name, inputs, outputs, typed attributes and a
 * shape/dtype inference function. The schema is the op: its argument checks and dtype rules
 * (policy flags the dispatcher applies, or a prepare hook), whether it is a composite of other
 * ops (a composite hook, with variadic inputs or outputs where it needs them) and its
 * derivative all live there, so em_op_call by name runs exactly what a typed em_X() function
 * runs. The core declares the standard op set (ember/ops.h); a plugin or a program may
 * declare more; ember/op_helpers.h has the common inference helpers and a strided iterator.
 *
 * Kernels are registered per (op, device type, dtype) with a priority and stack: the highest priority wins, a later registration at equal
 * priority wins, and unregistering restores the one below. An optional supports() predicate
 * lets a kernel decline a call (a shape or attribute it cannot handle); the next one down the
 * stack is tried.
 *
 *     static em_status my_square(const em_kernel_ctx *k) {
 *         const float *x = k->in[0].data; float *y = k->out[0].data;
 *         for (int64_t i = 0; i < k->out[0].numel; i++) y[i] = x[i] * x[i];
 *         return EM_OK;
 *     }
 *     em_kernel_def def = { .struct_size = sizeof def, .op = "square", .device_type = "cpu",
 *                           .dtype = EM_F32, .fn = my_square, .name = "square_f32" };
 *     em_kernel_register(em_registry_program(), &def, NULL);
 *
 * Every kernel call runs in an execution context (em_kernel_ctx.exec): one per (device,
 * stream), made by the core on first use with the backend's context_create (ember/device.h)
 * and holding the backend's library handles for that stream (a BLAS or DNN handle); the
 * stream is the calling thread's current one on the device (em_stream_set_current). The
 * default stream's context is found with one load, so the common call pays nothing for it.
 * Scratch memory a kernel needs is kernel workspace, held for the call and handed back when
 * it returns:
 *
 *     static em_status my_kernel(const em_kernel_ctx *k) {
 *         float *tmp;                                          // (n) floats of scratch
 *         if (em_kernel_workspace(k, n * sizeof *tmp, (void **)&tmp) != EM_OK)
 *             return em_last_status();                         // "my_op: out of memory ..."
 *         my_blas *h = k->exec->backend;                       // the backend's handles
 *         ...
 *     }
 *
 * When the device of the inputs has no kernel for the op and dtype, the fallback policy
 * decides: EM_FALLBACK_ERROR (default) fails naming the op, device, dtype and what is
 * registered; EM_FALLBACK_WARN and EM_FALLBACK_ALLOW copy the inputs to the CPU, run the CPU
 * kernel and copy the outputs back (WARN also logs once per op and device). EMBER_FALLBACK=
 * error|warn|allow sets it at em_init().
 */
#ifndef EMBER_DISPATCH_H
#define EMBER_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ember/device.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Who registers: a loaded plugin, or the program itself (em_registry_program()). Everything
 * registered is attributed to its registry, listed by em_plugins()/ember-info, and removed
 * when the plugin is unloaded or its registration fails. */
typedef struct em_registry em_registry;
/* The program's own registry (valid between em_init() and em_shutdown()). */
EM_API em_registry *em_registry_program(void);

/* ---- attributes -------------------------------------------------------------------------- */

typedef enum em_attr_type {
    EM_ATTR_NONE = 0, /* absent: the op uses its default */
    EM_ATTR_INT = 1,
    EM_ATTR_FLOAT = 2,
    EM_ATTR_BOOL = 3,
    EM_ATTR_INTS = 4, /* up to EM_MAX_DIMS integers */
    EM_ATTR_STRING = 5,
    /* n integers at v.list, borrowed for the duration of the call (lists longer than
     * EM_MAX_DIMS: split_sizes, pad). Not saved for a backward: ops whose derivative needs
     * the list take it as INTS. */
    EM_ATTR_INT_LIST = 6,
} em_attr_type;

typedef struct em_attr {
    em_attr_type type;
    int n; /* number of entries of ints */
    union {
        int64_t i;
        double f;
        bool b;
        const char *s; /* borrowed for the duration of the call */
        const int64_t *list; /* EM_ATTR_INT_LIST: n entries, borrowed likewise */
    } v;
    int64_t ints[EM_MAX_DIMS];
} em_attr;

/* Shape and dtype of an output, filled by an op's inference function. */
typedef struct em_tensor_meta {
    em_dtype dtype;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
} em_tensor_meta;

typedef struct em_op em_op; /* a declared op (owned by the core) */

/* Schema flags. */
enum {
    /* Inputs 0..n_inputs-1 are converted to their promoted dtype (PyTorch's rules) before the
     * kernel runs; kernels see one dtype. */
    EM_OP_PROMOTE = 1u << 0,
    /* Inputs are broadcast (as views) to output 0's shape before the kernel runs; kernels see
     * inputs with the output's shape and stride 0 on broadcast dims. */
    EM_OP_BROADCAST = 1u << 1,
    /* Inputs may be on different devices (the op moves data itself, e.g. copy). */
    EM_OP_CROSS_DEVICE = 1u << 2,
    /* The outputs are not differentiable (comparisons, argmax, index outputs): they never
     * require grad and no history is recorded. */
    EM_OP_NONDIFF = 1u << 3,
    /* A list op: each input and output is a list of tensors and one call updates many
     * tensors (the fused optimizer steps). Run with em_op_call_lists only; infer may be NULL;
     * dispatch_arg names an input list (-1: output list 0). */
    EM_OP_LISTS = 1u << 4,
    /* Dtype policy: after promotion, an integer or bool input computes in float32 (true
     * division, exp, sqrt: PyTorch's "integer inputs to floating outputs"). */
    EM_OP_FLOAT_RESULT = 1u << 5,
    /* Argument policy: every input must be floating (after promotion); otherwise
     * EM_ERR_DTYPE "<op>: expected a floating tensor, got <dtype>". */
    EM_OP_FLOATING = 1u << 6,
    /* Variadic inputs: a call passes n_inputs or more tensors (cat, stack); the schema's
     * input_names name the first n_inputs. */
    EM_OP_VARIADIC = 1u << 7,
    /* Variadic outputs: a call receives between 0 and the caller's capacity outputs (split,
     * chunk); run it with em_op_call_n. Requires a composite. */
    EM_OP_VARIADIC_OUTPUTS = 1u << 8,
    /* A list op (EM_OP_LISTS) whose last output list holds one 0-dim tensor per entry, a
     * per-tensor result (amp_unscale_'s found-inf flags), instead of tensors of output list
     * 0's shapes. New in 1.1. */
    EM_OP_LISTS_SCALAR_OUT = 1u << 9,
    /* A list op (EM_OP_LISTS) with two or more input lists whose last input list holds one
     * 0-dim tensor per entry, a per-tensor scalar operand the kernel reads on the device
     * (the capturable optimizer steps' learning rates), instead of tensors of output list 0's
     * shapes. New in 1.1. */
    EM_OP_LISTS_SCALAR_IN = 1u << 11,
    /* Layout policy: when input layout_arg (input 0 unless the schema names another) is
     * channels-last (em_tensor_is_channels_last), every output with 4 dims is allocated
     * channels-last too (dense, strides H*W*C, 1, W*C, C) instead of C-contiguous; the
     * kernels then see those strides (em_ktensor.strides, contiguous false unless C = 1).
     * The other inputs come as they are: a kernel that does not read their layout declines
     * the call in supports(). Ops whose kernels keep an activation's layout: relu,
     * relu_backward, conv2d, conv2d_backward_data, max_pool2d and max_pool2d_backward (whose
     * outputs follow its indices, input 1: the grad may arrive row-major through a flatten)
     * (docs/performance.md). The same ops keep a storage layout (em_layout, ember/tensor.h):
     * when input layout_arg's storage is in one, or the thread prefers one
     * (em_layout_prefer), and the top kernel for the call declares it (accepts_layouts),
     * every 4-dim output whose C is a multiple of 16 is allocated in it. New in 1.1. */
    EM_OP_CHANNELS_LAST = 1u << 10,
};

/* What a backward function receives: the saved tensors (see em_op_schema.saves), the
 * attributes, and the gradient of each output. Inputs not saved are NULL in `in`, outputs
 * not saved are NULL in `out`. grad_out[j] is NULL when no gradient flows into output j
 * (treat it as zeros). Backward functions are written with ops (em_mul, em_matmul, ...) so
 * they run on every device; they run with grad mode disabled, inside a scope of their own:
 * temporaries need no release. */
typedef struct em_backward_ctx {
    size_t struct_size;
    const em_op *op;
    int n_in, n_out;
    em_tensor *const *in;        /* (n_in) saved inputs, or NULL */
    em_tensor *const *out;       /* (n_out) saved outputs, or NULL */
    const em_attr *attrs;        /* the schema's n_attrs attributes, as the forward saw them */
    em_tensor *const *grad_out;  /* (n_out) gradient of each output, or NULL */
    const bool *needs_grad;      /* (n_in) whether input i needs a gradient */
    const em_tensor_meta *in_meta; /* (n_in) shape and dtype of every input */
    void *ext;
} em_backward_ctx;

/* Fill grad_in[i] (for each input with needs_grad[i]) with a tensor of input i's shape and
 * dtype, or leave it NULL for "no gradient". Returned tensors are kept by the engine. Return
 * EM_OK or an error set with em_set_error. */
typedef em_status (*em_backward_fn)(const em_backward_ctx *ctx, em_tensor **grad_in);

/* em_op_schema.saves: which inputs and outputs the backward needs. */
#define EM_SAVE_INPUT(i) (1u << (i))
#define EM_SAVE_OUTPUT(j) (1u << (8 + (j)))

/* Infers output shapes and dtypes from the inputs and attributes, or rejects them: return
 * an error set with em_set_error naming the op and the shapes (e.g. "matmul: shapes [2, 3]
 * and [4, 5] cannot be multiplied (3 != 4)"). Inputs are the tensors as passed (after
 * promotion when EM_OP_PROMOTE is set). */
typedef em_status (*em_infer_fn)(const em_op *op, const em_tensor *const *in,
                                 const em_attr *attrs, em_tensor_meta *out);

/* (optional) The op's argument checks and dtype rule, run by em_op_call before inference:
 * dtypes (n_in entries) arrive holding the dtype each input will be converted to under the
 * declared policy (EM_OP_PROMOTE, EM_OP_FLOAT_RESULT, EM_OP_FLOATING; otherwise the inputs'
 * own); the hook may change them (clamp: a fractional bound makes an integer tensor float32)
 * or reject the call with an error naming the op. It must not keep the tensors. For an op
 * without inputs (a fill: arange, uniform), em_op_call_out runs it on the outputs instead,
 * with dtypes NULL, to check the attributes against what is written. */
typedef em_status (*em_prepare_fn)(const em_op *op, const em_tensor *const *in, int n_in,
                                   const em_attr *attrs, em_dtype *dtypes /* in, out */);

/* (optional) A composite op: its meaning written with other ops, and with its own kernel
 * (em_op_call_kernel runs the op's inference and kernel, skipping this hook). em_op_call
 * runs it in place of inference and dispatch, after checking the inputs (count, NULLs) and
 * the attribute types. It fills out[0 .. *n_out) with new references that no scope holds (at
 * most cap_out; the schema's n_outputs unless EM_OP_VARIADIC_OUTPUTS), or returns an error
 * with none; em_op_call puts them in the caller's scope. A composite written with the public
 * ops (whose results go to the thread's scope) opens a scope of its own and retains what it
 * returns before closing it:
 *     em_scope_begin(); em_tensor *y = em_mul(in[0], em_sigmoid(in[0]));
 *     out[0] = em_tensor_retain(y); em_scope_end(); */
typedef em_status (*em_composite_fn)(const em_op *op, const em_tensor *const *in, int n_in,
                                     const em_attr *attrs, em_tensor **out, int cap_out,
                                     int *n_out /* out */);

typedef struct em_op_schema {
    size_t struct_size;          /* sizeof(em_op_schema) */
    const char *name;            /* unique: "add", "myplugin.fused_gelu" */
    int n_inputs;                /* 0..8 */
    const char *const *input_names;  /* (optional) n_inputs names; NULL: "input0", ... */
    int n_outputs;               /* 1..4; a list op (EM_OP_LISTS) 1..8 */
    int n_attrs;                 /* 0..8 */
    const char *const *attr_names;   /* n_attrs names */
    const em_attr_type *attr_types;  /* n_attrs types; a call passes exactly these (or NONE) */
    /* Which input's dtype selects the kernel; -1: output 0's dtype. */
    int dispatch_arg;
    unsigned flags;              /* EM_OP_* */
    em_infer_fn infer;
    void *ext;                   /* reserved; NULL */
    /* ---- autograd (a schema shorter than this has no derivative) ---- */
    /* The derivative, written with ops; NULL with EM_OP_NONDIFF: not differentiable; NULL
     * without it: backpropagating into the op is an error naming it. */
    em_backward_fn backward;
    unsigned saves;              /* EM_SAVE_INPUT(i) | EM_SAVE_OUTPUT(j) ... */
    /* ---- the op's meaning (a schema shorter than this has none of them: NULL, 0) ---- */
    em_prepare_fn prepare;       /* (optional) checks and dtype rule; see em_prepare_fn */
    em_composite_fn composite;   /* (optional) see em_composite_fn */
    unsigned optional_inputs;    /* composites: bit i, input i may be NULL (linear's bias) */
    const char *category;        /* (optional) the op's family for reports and the op-case
                                    table ("elementwise", "reduce", ...); copied */
    /* ---- added in 1.1 (a schema shorter than this is EM_AUTOCAST_NONE) ---- */
    /* What an autocast region (ember/autocast.h) does to the op's floating inputs: an
     * em_autocast_class. A plugin's op declares its own; 0 (NONE) leaves it alone. */
    int autocast;
    /* With EM_OP_CHANNELS_LAST: the input whose layout the outputs take (0..n_inputs-1; a
     * schema shorter than this: input 0). */
    int layout_arg;
} em_op_schema;

/* em_op_schema.autocast: the op's class under an autocast region (the lists are in
 * ember/autocast.h). Only float32, float16 and bfloat16 inputs on the region's device type
 * are cast; float64, integer and bool inputs never are. */
typedef enum em_autocast_class {
    EM_AUTOCAST_NONE = 0,    /* unaffected: inputs as given (ops inside a composite of this
                                class still see the region) */
    EM_AUTOCAST_LOWER = 1,   /* lower precision: inputs cast to the region's dtype */
    EM_AUTOCAST_FLOAT32 = 2, /* float32: float16/bfloat16 inputs cast to float32 */
    EM_AUTOCAST_PROMOTE = 3, /* the widest floating dtype among the inputs */
} em_autocast_class;

/* Whether a schema (as declared, or as em_op_schema_of returns it) carries field f. */
#define EM_SCHEMA_HAS(s, f)                                                                     \
    ((s)->struct_size >= offsetof(em_op_schema, f) + sizeof((s)->f))

/* Declare an op. The schema's strings are copied. EM_ERR_EXISTS when the name is taken. */
EM_API em_status em_op_declare(em_registry *reg, const em_op_schema *schema,
                               const em_op **out /* out, may be NULL */);
/* Find a declared op by name; NULL (EM_ERR_NOTFOUND, with near names) if none. */
EM_API const em_op *em_op_find(const char *name);
EM_API const char *em_op_name(const em_op *op);
EM_API const em_op_schema *em_op_schema_of(const em_op *op);

/* ---- kernels ----------------------------------------------------------------------------- */

/* A tensor as a kernel sees it: plain data, nothing to call. */
typedef struct em_ktensor {
    void *data;                      /* first element, in device memory */
    em_dtype dtype;
    int ndim;
    int64_t numel;
    int64_t shape[EM_MAX_DIMS];      /* (ndim) */
    int64_t strides[EM_MAX_DIMS];    /* (ndim) in elements; 0 on broadcast dims */
    bool contiguous;                 /* C order without gaps */
} em_ktensor;

/* The execution context of a (device, stream): made by the core on the first kernel call
 * that runs there (with the backend's context_create, ember/device.h), shared by every
 * kernel call on that device and stream from any thread, and freed with the stream
 * (em_stream_free), its device type or at em_shutdown(). Read-only to kernels. */
typedef struct em_exec_ctx {
    size_t struct_size;  /* sizeof(em_exec_ctx) as the core built it */
    em_device device;
    em_stream *stream;   /* the stream (NULL: the default stream) */
    void *backend;       /* what the backend's context_create made (its library handles), or
                            NULL when it has none */
    void *ext;           /* reserved; NULL */
} em_exec_ctx;

typedef struct em_kernel_ctx {
    size_t struct_size;
    const em_op *op;
    em_device device;
    /* The stream to run on: the calling thread's current stream on `device`
     * (em_stream_current; NULL: the default stream). */
    em_stream *stream;
    int n_in, n_out;
    const em_ktensor *in;   /* (n_in) inputs; a NULL-able input has data == NULL */
    const em_ktensor *out;  /* (n_out) outputs, already allocated */
    const em_attr *attrs;   /* (n_attrs of the schema) */
    void *user;             /* the kernel's em_kernel_def.user */
    void *ext;
    /* ---- added later: read only when struct_size covers them (EM_KCTX_HAS_IDS) ---- */
    /* Per tensor, the inputs then the outputs (n_in + n_out entries), or NULL: the storage's
     * identity (never reused while the process runs; 0 for a missing input) and its version
     * counter at the call. Equal (id, version) pairs mean equal contents, so a kernel may
     * reuse what it derived from them earlier (a reordered copy). Code that writes through
     * em_tensor_data() must call em_tensor_bump_version() (ember/tensor.h). */
    const uint64_t *storage_ids;
    const uint64_t *versions;
    /* ---- added in 1.1: read only when struct_size covers them (EM_KCTX_HAS_EXEC) ---- */
    /* The (device, stream) execution context this call runs in: its library handles are in
     * exec->backend. Never NULL. */
    const em_exec_ctx *exec;
    /* The core's: the workspace this call holds (em_kernel_workspace). Do not touch. */
    void *workspace;
    /* ---- added in 1.1: read only when struct_size covers it (EM_KCTX_LAYOUT) ---- */
    /* Per tensor, the inputs then the outputs, its storage layout (em_layout, ember/tensor.h),
     * or NULL when every tensor of the call is plain. Only a kernel whose def declares a
     * layout in accepts_layouts is ever called with a tensor in it; its em_ktensor then has
     * the logical shape and the plain row-major strides, and data at the storage's start. */
    const uint8_t *layouts;
} em_kernel_ctx;

/* The layout of tensor i of the call (inputs first, then outputs): EM_LAYOUT_PLAIN when the
 * core is older than the plugin's headers or every tensor is plain. */
#define EM_KCTX_LAYOUT(ctx, i)                                                                  \
    ((ctx)->struct_size >= offsetof(em_kernel_ctx, layouts) + sizeof(void *) && (ctx)->layouts \
         ? (int)(ctx)->layouts[(i)]                                                             \
         : 0)

/* Whether ctx carries storage ids and versions (a core older than the plugin's headers does
 * not). */
#define EM_KCTX_HAS_IDS(ctx)                                                                    \
    ((ctx)->struct_size >= offsetof(em_kernel_ctx, versions) + sizeof(void *) &&               \
     (ctx)->storage_ids && (ctx)->versions)
/* Whether ctx carries an execution context and can hand out workspace (a core older than the
 * plugin's headers does not). */
#define EM_KCTX_HAS_EXEC(ctx)                                                                   \
    ((ctx)->struct_size >= offsetof(em_kernel_ctx, workspace) + sizeof(void *))

/* Scratch memory for the running kernel call: at least nbytes (0 is allowed) on the call's
 * device, aligned to 64 bytes, from the device's caching allocator in category
 * EM_MEM_WORKSPACE (so memory statistics, the injectable host allocator and out-of-memory
 * tests see it). It stays valid until the kernel returns; then the core hands it back to the
 * cache — a kernel never frees it. Call it from the thread that runs the kernel (before a
 * parallel region, not inside it), from the kernel function only (not from supports()).
 *     float *tmp;
 *     if (em_kernel_workspace(k, n * sizeof *tmp, (void **)&tmp) != EM_OK) return em_last_status();
 * Errors: EM_ERR_NOMEM "<op>: out of memory for <n> bytes of kernel workspace on <device>
 * (...)" naming what holds the memory; EM_ERR_INVALID for a NULL argument or a context
 * without workspace (not EM_KCTX_HAS_EXEC). *out is NULL on error. */
EM_API em_status em_kernel_workspace(const em_kernel_ctx *k, size_t nbytes, void **out /* out */);

/* For the kernels of the ops that draw random numbers (uniform, normal, bernoulli,
 * scaled_dot_product_attention with dropout and its backward): when the call's "seed"
 * attribute is absent and its "offset" given, the call is recorded in a graph capture: the
 * work reads the seed and a base offset, two uint64 {seed, base}, from the device memory this
 * returns when it runs (a replay's values, which em_graph_replay writes first), and draws
 * from Philox block base + offset (ember/random.h, "Graph capture"). Call it from the kernel
 * function on the thread that queues the work. NULL with EM_ERR_STATE (naming the op and
 * device) when no capture on the call's device and stream has a generator state. New in
 * EMBER_1.1. */
EM_API const uint64_t *em_kernel_generator_state(const em_kernel_ctx *k);

typedef em_status (*em_kernel_fn)(const em_kernel_ctx *ctx);
/* (optional) Return false to pass the call to the next kernel down the stack. */
typedef bool (*em_kernel_supports_fn)(const em_kernel_ctx *ctx);

typedef struct em_kernel_def {
    size_t struct_size;      /* sizeof(em_kernel_def) */
    const char *op;          /* op name */
    const char *device_type; /* "cpu", "cuda" */
    em_dtype dtype;          /* the dtype of the schema's dispatch_arg */
    int priority;            /* higher wins; built-in backends use 0, oneDNN-style fast paths
                                10, third parties anything */
    em_kernel_fn fn;
    em_kernel_supports_fn supports; /* (optional) NULL: supports every call */
    const char *name;        /* for reports: "cpu_add_f32_avx512" */
    void *user;              /* passed to fn as ctx->user */
    void *ext;               /* reserved; NULL */
    /* ---- added in 1.1 (a shorter def reads as 0) ---- */
    /* Bit (1u << l) per storage layout l beyond plain (em_layout, ember/tensor.h) that fn and
     * supports read and write (EM_KCTX_LAYOUT). Before a kernel without the bit runs, the
     * core converts every tensor of the call to plain; layout-keeping ops
     * (EM_OP_CHANNELS_LAST) allocate their outputs in a layout only when the top kernel for
     * the call declares it. 0: plain tensors only. */
    unsigned accepts_layouts;
} em_kernel_def;

typedef struct em_kernel em_kernel;
/* Register a kernel. EM_ERR_NOTFOUND for an undeclared op or unregistered device type. The
 * optional handle unregisters it. */
EM_API em_status em_kernel_register(em_registry *reg, const em_kernel_def *def,
                                    em_kernel **out /* out, may be NULL */);
/* Remove a kernel; the one below it in its stack runs again. */
EM_API em_status em_kernel_unregister(em_kernel *k);

/* ---- running ops ------------------------------------------------------------------------- */

/* Run an op: check devices, promote and broadcast (per flags), infer, allocate outputs on the
 * inputs' device, dispatch. `out` receives n_outputs new references. attrs has the schema's
 * n_attrs entries, or is NULL: every attribute absent (the op's default, or its error for a
 * required one). NULL inputs fail without replacing the pending error. */
EM_API em_status em_op_call(const em_op *op, const em_tensor *const *in, int n_in,
                            const em_attr *attrs, em_tensor **out /* out */);
/* em_op_call for any op, variadic outputs included (EM_OP_VARIADIC_OUTPUTS: split, chunk):
 * out has room for cap_out tensors and *n_out receives how many were made (new references,
 * in the thread's scope like em_op_call's). An op with more outputs than cap_out is
 * EM_ERR_RANGE and makes none (a variadic-output op then still sets *n_out to the count
 * needed); out NULL with cap_out 0 asks a variadic-output op for that count alone. */
EM_API em_status em_op_call_n(const em_op *op, const em_tensor *const *in, int n_in,
                              const em_attr *attrs, em_tensor **out /* out */, int cap_out,
                              int *n_out /* out */);
/* Run op's own inference, dtype policy and kernel (what em_op_call does for an op without a
 * composite), skipping its composite hook: the kernel contract of a composite op that has a
 * kernel of its own (sum, conv2d, ...), as a composite reaches it. out receives n_outputs
 * new references (in the thread's scope, like em_op_call's). */
EM_API em_status em_op_call_kernel(const em_op *op, const em_tensor *const *in, int n_in,
                                     const em_attr *attrs, em_tensor **out /* out */);
/* Run an op into caller-allocated outputs of the right shape and dtype (PyTorch's out=):
 * no inference, no allocation, no promotion — the dispatch alone. Bumps the outputs'
 * versions. */
EM_API em_status em_op_call_out(const em_op *op, const em_tensor *const *in, int n_in,
                                const em_attr *attrs, em_tensor *const *out, int n_out);

/* Run a list op (EM_OP_LISTS) over `count` tensors per list. `in` holds the schema's
 * n_inputs lists one after the other (in[i * count + j] is tensor j of input list i), `out`
 * the n_outputs lists, which the kernel updates in place (their versions are bumped). A list
 * may be all NULL where the op's contract says it is optional (its kernel sees data == NULL);
 * otherwise tensor j of every list has the shape of out[j] (tensor j of output list 0), every
 * tensor is on one device, and the tensors of the dispatch list share one dtype, which picks
 * the kernel. The kernel context has n_in = n_inputs * count and n_out = n_outputs * count.
 * No autograd history is recorded (list ops are updates, like an optimizer step) and there is
 * no CPU fallback: EM_ERR_NOKERNEL when the device has no kernel (em_op_has_kernel asks
 * first). Errors name the op, the list and the tensor. */
EM_API em_status em_op_call_lists(const em_op *op, int count, const em_tensor *const *in,
                                  const em_attr *attrs, em_tensor *const *out);
/* Whether a kernel for op is registered for dev's device type and dtype (a kernel's
 * supports() predicate may still decline a call). */
EM_API bool em_op_has_kernel(const em_op *op, em_device dev, em_dtype dtype);

/* ---- kernel stacks (checking tools: ember-opcheck) ---------------------------------------
 *
 * The kernels of one (op, device type, dtype), top of the stack (the one a call picks first)
 * to bottom, and a way to run one of them: a checker compares each kernel with the one below
 * it. The ordinary call path does not look at any of this. A kernel pointer is valid while it
 * is registered. New in EMBER_1.1. */

/* Number of kernels registered for op on dev's device type and dtype (0: none, or NULL op). */
EM_API size_t em_op_kernel_count(const em_op *op, em_device dev, em_dtype dtype);
/* Kernel i of that stack, 0 the top; NULL past the end. */
EM_API const em_kernel *em_op_kernel_get(const em_op *op, em_device dev, em_dtype dtype,
                                         size_t i);
/* The core's copy of a kernel's definition (op, device type, dtype, priority, name, fn,
 * supports, user); NULL for NULL. Read-only, valid while the kernel is registered. */
EM_API const em_kernel_def *em_kernel_def_of(const em_kernel *k);
/* The registry that registered k (a plugin's, the program's); NULL for NULL. */
EM_API const em_registry *em_kernel_owner(const em_kernel *k);
/* em_op_call_at flags: every output of the call (given or allocated, and those of a
 * composite's call of its own kernel) is filled with poison before the kernel runs — NaN for
 * floating dtypes, 0xA5 bytes otherwise — so an element the kernel does not write shows. */
#define EM_CALL_POISON (1u << 0)

/* Run op as em_op_call_n does (argument checks, dtype policy, inference, broadcasting,
 * autograd) with the kernel `depth` below the top of the stack this call dispatches on (0:
 * the top, what a plain call tries first), without trying others: a checker runs depth 0, 1,
 * ... until EM_ERR_RANGE and compares each with the next. A composite runs as usual and the
 * choice applies to its call of its own kernel (em_op_call_kernel). *kernel (may be NULL)
 * receives the kernel found at that depth, also when it declines; NULL after a success means
 * the composite did not call its kernel for these inputs. out has room for cap_out tensors;
 * for an op that is not a composite, an entry that is non-NULL on entry is used as that output
 * (it must have the inferred dtype and shape and be on the inputs' device), a NULL one is
 * allocated. On success out[0 .. *n_out) hold new references (in the thread's scope). An op
 * without inputs (a fill) takes n_in 0 and every output given. flags: EM_CALL_POISON or 0.
 * Errors: the op's own; EM_ERR_RANGE when the stack has no kernel at depth (the message says
 * how many it has); EM_ERR_NOKERNEL when that kernel's supports() declines the call (it is not
 * run); EM_ERR_SHAPE for a given output of the wrong geometry; EM_ERR_INVALID for a list op, a
 * composite without a kernel, given outputs of a composite, or more than 8 inputs. */
EM_API em_status em_op_call_at(const em_op *op, size_t depth, unsigned flags,
                               const em_tensor *const *in, int n_in, const em_attr *attrs,
                               em_tensor **out /* in, out */, int cap_out,
                               int *n_out /* out */,
                               const em_kernel **kernel /* out, may be NULL */);

/* ---- fallback, placement and profiling -------------------------------------------------- */

typedef enum em_fallback_policy {
    EM_FALLBACK_ERROR = 0,
    EM_FALLBACK_WARN = 1,
    EM_FALLBACK_ALLOW = 2,
} em_fallback_policy;
EM_API void em_fallback_set(em_fallback_policy p);
EM_API em_fallback_policy em_fallback_get(void);

/* Per device type the core counts the ops run, the bytes copied between devices and the ops
 * that fell back to the CPU; with profiling on it also times each op (synchronising the
 * device, so profiling slows asynchronous devices). */
EM_API void em_profile_enable(bool on);
EM_API bool em_profile_enabled(void);
EM_API void em_placement_reset(void);
/* Print where ops ran: per device type, ops run, time (when profiled), bytes copied, and the
 * ops that fell back with their counts. */
EM_API void em_placement_report(FILE *f);

typedef struct em_placement_stats {
    uint64_t ops;          /* ops run on this device type */
    uint64_t ns;           /* total kernel time when profiling was on */
    uint64_t bytes_in;     /* copied to this device type from another */
    uint64_t bytes_out;    /* copied from this device type to another */
    uint64_t fallbacks;    /* ops of this device type's tensors that ran on the CPU */
} em_placement_stats;
/* Counters for one device type by name ("cpu"). EM_ERR_NOTFOUND if not registered. */
EM_API em_status em_placement_get(const char *device_type, em_placement_stats *out /* out */);

/* ---- determinism ------------------------------------------------------------------------- */

/* With deterministic mode on, every op gives bitwise-identical results for the same inputs
 * regardless of scheduling, and regardless of thread count except where said below. Ops whose
 * behaviour changes under it:
 *   - sum and mean over all elements of a long run: the CPU backend sums fixed-size blocks
 *     (16384 elements) combined in block order, instead of one block per thread (which is
 *     faster, and repeatable only at the same thread count).
 * The elementwise, copy, index and random-fill kernels compute each element independently and
 * are deterministic in both modes; matmul and the convolutions are whatever their libraries
 * give (repeatable at a fixed thread count, not across thread counts: the CPU backend splits
 * conv2d's weight gradient over the batch, one chunk per thread, and adds the chunks' sums in
 * chunk order), and under deterministic mode the CPU backend does not use the per-shape
 * library choices it measured (EMBER_GEMM_AUTOTUNE), which vary between processes. On CUDA,
 * the convolutions then take only cuDNN engines without the non-deterministic note (docs/cuda.md).
 * Off by default. */
EM_API void em_set_deterministic(bool on);
EM_API bool em_deterministic(void);

/* Number of threads CPU kernels may use. The setting is the CPU backend's own (its named
 * functions "num_threads", "set_num_threads" and "num_threads_reason", em_backend_proc);
 * these three are conveniences that call them. EMBER_NUM_THREADS when the backend loads,
 * default the CPUs this process may use — its affinity mask (taskset, cpusets, a batch
 * system's binding), capped by its cgroup CPU quota (docker --cpus) rounded up — not the
 * machine's core count. Without a CPU backend loaded: 1, and setting does nothing. The CPU
 * kernels read the count from their execution context (em_kernel_ctx.exec), which a set
 * updates for the calls that start after it. */
EM_API int em_num_threads(void);
EM_API void em_set_num_threads(int n); /* below 1 becomes 1 */
/* Where em_num_threads() came from, in words: "EMBER_NUM_THREADS", "em_set_num_threads", or
 * the affinity mask and quota it was computed from (e.g. "4 of 64 online CPUs in this
 * process's affinity mask"); "no CPU backend is loaded" without one. */
EM_API const char *em_num_threads_reason(void);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_DISPATCH_H */
