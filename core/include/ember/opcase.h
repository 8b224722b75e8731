/*
 * ember/opcase.h — op cases: sample inputs an op is checked with, kept in the registry.
 *
 * A case row names a declared op and describes one call of it: the inputs to build (shape,
 * layout, values, dtype), the attributes, the dtypes the row holds for, the status every one
 * of them gives (EM_OK, or the error of an invalid variant), the tolerance scale and whether
 * the op is differentiable. The core registers the rows of the standard op set (every
 * declared standard op has at least one) at em_init(); a plugin attaches rows to the ops it
 * declares from its register function:
 *
 *     static const em_op_case my_cases[] = {
 *         { .struct_size = sizeof(em_op_case), .op = "myplugin.square", .variant = "2-d",
 *           .n_in = 1, .in = {{ .ndim = 2, .shape = {3, 4}, .dtype = -1 }},
 *           .dtypes = EM_CASE_DT(EM_F32) | EM_CASE_DT(EM_F64), .differentiable = true },
 *     };
 *     em_op_cases_register(reg, my_cases, 1);       // the rows are referenced: static const
 *
 * Every row is read through the registry (em_op_case_count / em_op_case_get): the tests,
 * ember-opcheck and a plugin's own checks see the same rows, and there is never a second
 * table. Rows go away with the registry that registered them (a plugin unloading).
 *
 * An input is a generator: shape (0-dim, empty and broadcast shapes are ordinary rows), layout
 * (contiguous, a transposed view, a sliced view with an offset, an expanded view with stride
 * 0), values (random, positive, indices below a bound, bools) and a dtype (the row's, or a
 * fixed one: indices are int64, masks bool). A fill (an op without inputs: arange, uniform,
 * ...) has one input entry describing the tensor it writes. A list op (fused_sgd, ...) lists
 * its input lists then its output lists, one tensor each.
 *
 * `typed` (optional) calls the op's typed C function with the row's inputs and attributes;
 * NULL: the op is reached by name (em_op_call_n) only, as a plugin's op usually is.
 * Tolerances (em_case_tolerance) are per dtype, scaled by the row's tol_scale (0 means 1).
 *
 * Layout and versioning: em_op_case starts with struct_size and may grow at its end (the
 * prefix rule of ember/plugin.h: a row built against older headers is copied and its missing
 * tail read as zero); em_case_input is part of the row's layout and never changes (what an
 * input needs later goes into the row's tail). The em_op_case* and em_case_* calls are new in
 * EMBER_1.1.
 */
#ifndef EMBER_OPCASE_H
#define EMBER_OPCASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EM_CASE_MAX_IN 6
#define EM_CASE_MAX_ATTRS 8

typedef enum em_case_layout {
    EM_CASE_CONTIG = 0,
    EM_CASE_TRANSPOSED, /* a transposed view of the last two dims (ndim >= 2) */
    EM_CASE_SLICED,     /* a view narrowed out of a wider last dim (offset 1) */
    EM_CASE_EXPANDED,   /* dim 0 expanded from size 1 (stride 0) */
    /* 4 dims (N, C, H, W) with channels-last strides (em_channels_last); new in 1.1 */
    EM_CASE_CHANNELS_LAST,
    /* 4 dims (N, C, H, W), C a multiple of 16, in the nChw16c storage layout (em_to_layout,
     * ember/tensor.h; contiguous where the shape cannot hold it); new in 1.1 */
    EM_CASE_BLOCKED,
} em_case_layout;

typedef enum em_case_values {
    EM_CASE_RANDN = 0, /* in [-2, 2) (integers: rounded, times 3) */
    EM_CASE_POS,       /* in [0.25, 2.25] */
    EM_CASE_INDEX,     /* integers in [0, bound) */
    EM_CASE_BOOLS,     /* alternating-ish true/false */
    EM_CASE_PROB,      /* in (0.05, 0.95) */
    EM_CASE_ONES,
} em_case_values;

typedef struct em_case_input {
    int ndim;
    int64_t shape[4];
    em_case_layout layout;
    em_case_values values;
    int dtype;      /* an em_dtype, or -1: the row's dtype */
    int64_t bound;  /* EM_CASE_INDEX: values in [0, bound) */
    bool absent;    /* an absent optional input (NULL) */
} em_case_input;

/* Call the op's typed function: fill out[0 .. *n_out) (room for 16) with new references (in
 * the thread's scope). */
typedef em_status (*em_case_typed_fn)(const em_tensor *const *in, const em_attr *attrs,
                                      em_tensor **out, int *n_out);

typedef struct em_op_case {
    size_t struct_size;    /* sizeof(em_op_case) */
    const char *op;        /* the declared op */
    const char *variant;   /* what this row tries ("transposed", "min > max", ...) */
    em_case_typed_fn typed; /* (optional) */
    int n_in;
    em_case_input in[EM_CASE_MAX_IN];
    em_attr attrs[EM_CASE_MAX_ATTRS]; /* the schema's attributes (EM_ATTR_NONE: default) */
    unsigned dtypes;       /* EM_CASE_DT(EM_F32) | ... */
    em_status expect;      /* EM_OK, or the error every listed dtype gives */
    bool differentiable;   /* the op has a derivative (gradcheck applies) */
    double tol_scale;      /* 0: 1 */
    /* Inputs whose gradient is none or zero by definition (a target, a class weight, the
     * padding rows of an embedding): gradchecks leave them alone (bit i: input i). */
    unsigned no_grad;
    unsigned flags;        /* EM_CASE_* below */
    void *ext;             /* reserved; NULL */
} em_op_case;

#define EM_CASE_DT(dt) (1u << (dt))
/* em_op_case.flags: the op draws from a generator (uniform, dropout): each dtype is its own
 * draw, so a result is not compared with float64; kernels and devices must still agree. */
#define EM_CASE_DRAWS (1u << 0)
/* A strided input (the row's layout) runs another kernel than its contiguous copy does (a
 * convolution on channels-last operands, which may sum in another order): the layout check
 * compares the two results at the dtype's tolerance instead of bit for bit. New in 1.1. */
#define EM_CASE_LAYOUT_TOL (1u << 1)

/* Attach n rows to declared ops, owned by reg (removed with it). The rows are referenced, not
 * copied (keep them static const) unless their struct_size is older than this header's, when
 * they are copied by the prefix rule. EM_ERR_NOTFOUND for a row naming an undeclared op;
 * EM_ERR_INVALID for a NULL argument, a struct_size below the first layout, n_in above
 * EM_CASE_MAX_IN or a row without dtypes (the message names the row and its op);
 * EM_ERR_NOMEM. */
EM_API em_status em_op_cases_register(em_registry *reg, const em_op_case *rows, size_t n);
/* Rows of every registry, the core's first, then in registration order. */
EM_API size_t em_op_case_count(void);
/* Row i (NULL past the end), valid while its registry is registered. */
EM_API const em_op_case *em_op_case_get(size_t i);
/* The registry that registered row i (NULL past the end): em_registry_core() for the
 * standard rows. */
EM_API const em_registry *em_op_case_owner(size_t i);

/* Build row c's inputs in dtype dt from seed (the same seed gives the same values); in[i] is
 * NULL for an absent input. The tensors are in the thread's scope. EM_OK or the first error. */
EM_API em_status em_case_inputs(const em_op_case *c, em_dtype dt, uint64_t seed,
                                em_tensor **in /* out: c->n_in entries */);
/* One input from its generator, in the scope; NULL when absent (no error) or on error. The
 * values are drawn in float64 and converted to the input's dtype. */
EM_API em_tensor *em_case_make(const em_case_input *spec, em_dtype row_dtype, uint64_t seed);

/* A valid row as a function of the inputs a gradient is taken for (em_gradcheck's
 * em_gradcheck_fn, user = the em_case_grad): the op called with `all`, the inputs at `which`
 * replaced by the function's arguments, reduced to one number as the sum over its floating
 * outputs of sum(out * w), w a fixed pseudo-random direction per output (a plain sum would
 * hide the gradient of an op whose outputs sum to a constant, softmax's). Outputs past the
 * first are auxiliary (indices, saved statistics) unless the op's outputs are variadic. The
 * call is the row's typed function, or by name when it has none. */
typedef struct em_case_grad {
    size_t struct_size;             /* set by the caller: sizeof(em_case_grad) */
    const em_op_case *c;
    em_tensor *all[EM_CASE_MAX_IN]; /* every input, in the scope */
    int which[EM_CASE_MAX_IN], n;   /* the positions that vary */
    void *ext;                      /* reserved */
} em_case_grad;

/* Build row c's inputs in dtype dt from seed into g (whose struct_size the caller set), and
 * in vary[0 .. g->n) leaves that require grad for the inputs a gradient is taken for: those
 * of the row's dtype that are not indices and not in the row's no_grad mask. Returns g->n
 * (0: nothing to differentiate), or -1 with EM_ERR_INVALID for a NULL argument or a
 * struct_size other than sizeof(em_case_grad). The tensors are in the thread's scope. */
EM_API int em_case_grad_setup(const em_op_case *c, em_dtype dt, uint64_t seed, em_case_grad *g,
                              em_tensor **vary /* out: room for EM_CASE_MAX_IN */);
/* The em_gradcheck_fn of a set-up em_case_grad (user); NULL with the op's error. */
EM_API em_tensor *em_case_grad_fn(em_tensor *const *inputs, int n, void *user);

/* The dtypes the valid rows of the op named `op` list (0: no row, or none valid). */
EM_API unsigned em_case_dtypes_of(const char *op);
/* The absolute and relative tolerance a result of dtype dt is compared with (0 for exact
 * dtypes): f32 1e-5, f64 1e-12, f16 2e-3, bf16 1.6e-2. */
EM_API double em_case_tolerance(em_dtype dt);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_OPCASE_H */
