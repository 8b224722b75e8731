/*
 * tests/op_cases.h — the one op-case table: every op of the standard set (ember/ops.h), with
 * the inputs to build, the attributes (valid and invalid variants), the dtypes each row
 * holds for, the tolerance per dtype, and whether the op is differentiable. There is never a
 * second table: tests that need cases of a declared op read this one.
 *
 *     for (int i = 0; i < em_op_case_count; i++) {
 *         const em_op_case *c = &em_op_cases[i];
 *         em_tensor *in[EM_CASE_MAX_IN];
 *         em_case_inputs(c, EM_F32, 1, in);          // NULL entries: absent optional inputs
 *         ... em_op_call_n(em_op_find(c->op), in, c->n_in, c->attrs, out, 8, &n) ...
 *     }
 *
 * A row lists its op's inputs as the op's schema takes them (the backward ops: the grad
 * first). An input is a generator: shape (0-dim, empty and broadcast shapes are ordinary
 * rows), layout (contiguous, a transposed view, a sliced view with an offset, an expanded
 * view with stride 0), values (random, positive, indices below a bound, bools) and a dtype
 * (the row's, or a fixed one: indices are int64, masks bool). A fill (an op without inputs:
 * arange, uniform, ...) has one input entry describing the tensor it writes. A list op
 * (fused_sgd, ...) lists its input lists then its output lists, one tensor each.
 *
 * `typed` calls the op's typed function of ember/ops.h with the row's inputs and attributes
 * (NULL: the op has none — a helper of a derivative or a list op, reached by name only).
 * `expect` is what every dtype of the row gives: EM_OK, or the error of an invalid variant.
 * Tolerances (em_case_tolerance) are per dtype, scaled by the row's tol_scale (0 means 1).
 *
 * Adding an op: one row (or a few: a layout, an invalid attribute) and, when it has a typed
 * function, its adapter in op_cases.c. tests/test_op_schema's coverage check fails while a
 * declared standard op has no row.
 */
#ifndef EMBER_TESTS_OP_CASES_H
#define EMBER_TESTS_OP_CASES_H

#include <ember/ember.h>
#include <stdbool.h>
#include <stdint.h>

#define EM_CASE_MAX_IN 6
#define EM_CASE_MAX_ATTRS 8

typedef enum em_case_layout {
    EM_CASE_CONTIG = 0,
    EM_CASE_TRANSPOSED, /* a transposed view of the last two dims (ndim >= 2) */
    EM_CASE_SLICED,     /* a view narrowed out of a wider last dim (offset 1) */
    EM_CASE_EXPANDED,   /* dim 0 expanded from size 1 (stride 0) */
} em_case_layout;

typedef enum em_case_values {
    EM_CASE_RANDN = 0, /* roughly normal in [-2, 2] (integers: rounded, times 3) */
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

/* Call the typed function: fill out[0 .. *n_out) (room for 16) with new references (in the
 * scope). */
typedef em_status (*em_case_typed_fn)(const em_tensor *const *in, const em_attr *attrs,
                                      em_tensor **out, int *n_out);

typedef struct em_op_case {
    const char *op;        /* the declared op */
    const char *variant;   /* what this row tries ("transposed", "min > max", ...) */
    em_case_typed_fn typed;
    int n_in;
    em_case_input in[EM_CASE_MAX_IN];
    em_attr attrs[EM_CASE_MAX_ATTRS];
    unsigned dtypes;       /* EM_CASE_DT(EM_F32) | ... */
    em_status expect;
    bool differentiable;   /* the op has a derivative (gradcheck applies) */
    double tol_scale;
    /* Inputs whose gradient is none or zero by definition (a target, a class weight, the
     * padding rows of an embedding): gradchecks leave them alone. */
    unsigned no_grad;
} em_op_case;

#define EM_CASE_DT(dt) (1u << (dt))

extern const em_op_case em_op_cases[];
extern const int em_op_case_count;

/* Build row c's inputs in dtype dt (seeded); in[i] is NULL for an absent input. The tensors
 * are in the thread's scope. EM_OK or the first error. */
em_status em_case_inputs(const em_op_case *c, em_dtype dt, uint64_t seed,
                         em_tensor **in /* out: c->n_in entries */);
/* One input from its generator (NULL when absent), in the scope. */
em_tensor *em_case_make(const em_case_input *spec, em_dtype row_dtype, uint64_t seed);
/* A valid row as a function of the inputs a gradient is taken for (em_gradcheck's
 * em_gradcheck_fn, user = the em_case_grad): the typed call with `all`, the inputs at
 * `which` replaced by the function's arguments, reduced to one number as the sum over its
 * floating outputs of sum(out * w), w a fixed pseudo-random direction per output (a plain sum
 * would hide the gradient of an op whose outputs sum to a constant, softmax's). Outputs past
 * the first are auxiliary (indices, saved statistics) unless the op's outputs are variadic. */
typedef struct em_case_grad {
    const em_op_case *c;
    em_tensor *all[EM_CASE_MAX_IN]; /* every input, in the scope */
    int which[EM_CASE_MAX_IN], n;   /* the positions that vary */
} em_case_grad;

/* Build row c's inputs in dtype dt from `seed` into g, and in vary[0 .. g->n) leaves that
 * require grad for the inputs a gradient is taken for: those of the row's dtype that are not
 * indices and not in the row's no_grad mask. Returns g->n (0: nothing to differentiate). */
int em_case_grad_setup(const em_op_case *c, em_dtype dt, uint64_t seed, em_case_grad *g,
                       em_tensor **vary /* out: room for EM_CASE_MAX_IN */);
em_tensor *em_case_grad_fn(em_tensor *const *inputs, int n, void *user);

/* The dtypes the valid rows of `op` list (0: the op has no row, or none valid): what the table
 * says the op takes, for tests that loop over an op's dtypes. */
unsigned em_case_dtypes_of(const char *op);

/* The absolute/relative tolerance a result of dtype dt is compared with (0 for exact
 * dtypes). */
double em_case_tolerance(em_dtype dt);

#endif /* EMBER_TESTS_OP_CASES_H */
