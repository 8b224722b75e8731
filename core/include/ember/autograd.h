/*
 * ember/autograd.h — define-by-run automatic differentiation, with PyTorch's semantics.
 *
 * An op whose inputs require grad records a node (its backward, the tensors it saved and
 * their versions, edges to its inputs' nodes). em_backward() walks the graph once, in
 * dependency order, and accumulates into the .grad of every leaf that requires grad; the
 * graph is then freed unless retain_graph was asked.
 *
 *     em_tensor *w = em_empty(2, (int64_t[]){784, 10}, EM_F32, em_cpu());
 *     em_normal_(w, 0, 0.01, NULL);
 *     em_requires_grad_(w, true);                       // a leaf the loss is differentiated for
 *     for (int step = 0; step < steps; step++) {
 *         em_scope_begin();
 *         em_tensor *loss = em_mean(em_mul(em_matmul(x, w), y), 0, NULL, false);
 *         if (em_backward(loss) != EM_OK) puts(em_last_error());
 *         printf("%g\n", em_item(loss));              // a double: keeps no graph alive
 *         em_scope_end();                               // frees the step's tensors
 *         em_grad_mode_push(EM_GRAD_DISABLED);          // optimizer updates: not recorded
 *         em_sub_(w, em_mul(em_tensor_grad(w), lr));
 *         em_grad_mode_pop();
 *         em_tensor_set_grad(w, NULL);                  // zero_grad (set to none)
 *     }
 *
 * Semantics, as in PyTorch:
 *   - Grads accumulate into leaf .grad across backward calls until cleared (gradient
 *     accumulation: divide the loss by the number of micro-batches, step every N).
 *   - Non-leaf tensors get a .grad only when em_retain_grad() was called on them.
 *   - Broadcasting, dtype promotion and views are differentiable: each input's grad has the
 *     input's shape and dtype; grads flow through views into their base.
 *   - A second backward through a graph whose saved tensors were freed is an error naming
 *     the op; pass retain_graph to keep them.
 *   - Modifying in place a tensor that a node saved makes backward fail, naming the op, the
 *     tensor's shape and both versions.
 *   - An op that declared no derivative (schema.backward NULL, without EM_OP_NONDIFF) can be
 *     run forward; backpropagating into it is an error naming the op — never a silent zero.
 *   - In place ops: on a leaf that requires grad, or on a view of one, they are an error (do
 *     the update under EM_GRAD_DISABLED); on a non-leaf they rewrite its history, and a value
 *     that needs no grad (fill_, copy_ of a constant) cuts it. On a VIEW, as in PyTorch, the
 *     base's history is rewritten too (its grad_fn becomes "copy_slices"): writing x into
 *     a slice of a buffer that needs no grad makes the buffer require grad, and gradients
 *     reach x. Other views of that base made before the change are brought up to date when
 *     next used (an expanded one cannot be: an error says to make it again). A view made with
 *     gradients off from a tensor that requires grad cannot be changed in place with them on.
 *   - Grad mode is per thread. Higher-order gradients (create_graph) are not supported: asking
 *     for them is an error.
 *   - One backward at a time per graph: two threads must not run backward through shared
 *     nodes concurrently.
 * Memory: .grad tensors are tagged EM_MEM_GRADIENT.
 */
#ifndef EMBER_AUTOGRAD_H
#define EMBER_AUTOGRAD_H

#include <stdbool.h>
#include <stdio.h>

#include "ember/error.h"
#include "ember/export.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- requires_grad, .grad ----------------------------------------------------------------- */

/* Make a leaf require grad (or stop). A non-leaf (a tensor with a grad_fn) is EM_ERR_STATE:
 * "only leaf tensors can change requires_grad; use em_detach() to get a leaf". Only floating
 * dtypes can require grad (EM_ERR_DTYPE). */
EM_API em_status em_requires_grad_(em_tensor *t, bool on);
EM_API bool em_tensor_requires_grad(const em_tensor *t);
/* A leaf has no grad_fn: created by the user, or by an op that recorded nothing. */
EM_API bool em_tensor_is_leaf(const em_tensor *t);
/* The name of the op that created t ("mul", "view", ...), or NULL for a leaf. */
EM_API const char *em_tensor_grad_fn_name(const em_tensor *t);
/* t's .grad, BORROWED (valid until the next backward, em_tensor_set_grad, or t's release);
 * NULL when none. */
EM_API em_tensor *em_tensor_grad(const em_tensor *t);
/* Replace t's .grad (retains g; NULL clears it: zero_grad with set_to_none). g must have t's
 * shape, dtype and device. */
EM_API em_status em_tensor_set_grad(em_tensor *t, em_tensor *g);
/* Keep the grad of a non-leaf after backward (a no-op on leaves). */
EM_API em_status em_retain_grad(em_tensor *t);
/* A new tensor sharing t's storage, with no history and requires_grad off. */
EM_API em_tensor *em_detach(const em_tensor *t);

/* ---- grad mode (per thread) ---------------------------------------------------------------- */

typedef enum em_grad_mode {
    EM_GRAD_ENABLED = 0,   /* ops record their history (the default) */
    EM_GRAD_DISABLED = 1,  /* no_grad: nothing is recorded */
    EM_GRAD_INFERENCE = 2, /* like DISABLED; tensors made here can never be saved for backward */
} em_grad_mode;
/* Enter a grad mode until the matching pop (nests, like torch.no_grad() blocks). */
EM_API em_status em_grad_mode_push(em_grad_mode m);
/* EM_ERR_STATE when nothing was pushed on this thread. */
EM_API em_status em_grad_mode_pop(void);
EM_API em_grad_mode em_grad_mode_get(void);
EM_API bool em_grad_enabled(void);

/* ---- backward ------------------------------------------------------------------------------ */

typedef struct em_backward_options {
    size_t struct_size;  /* sizeof(em_backward_options) */
    bool retain_graph;   /* keep saved tensors so the graph can be walked again */
    bool create_graph;   /* higher-order gradients: not supported (EM_ERR_INVALID) */
    void *ext;
} em_backward_options;

/* Backpropagate from a one-element tensor (the loss): grad 1. */
EM_API em_status em_backward(em_tensor *loss);
/* Backpropagate from any tensor with grad `grad` (t's shape; NULL only for one-element t).
 * opt may be NULL (defaults: free the graph). */
EM_API em_status em_backward_with(em_tensor *t, const em_tensor *grad,
                                  const em_backward_options *opt);
/* torch.autograd.grad: the gradients of `outputs` (weighted by grad_outputs, which may be
 * NULL for one-element outputs) with respect to `inputs`, returned as n_inputs new
 * references in grads (NULL for an input the outputs do not depend on). No .grad is touched. */
EM_API em_status em_grad(int n_outputs, em_tensor *const *outputs,
                         const em_tensor *const *grad_outputs, int n_inputs,
                         em_tensor *const *inputs, em_tensor **grads /* out */,
                         const em_backward_options *opt);

/* ---- hooks ---------------------------------------------------------------------------------- */

/* Called with the gradient flowing into t during backward, before it is accumulated (leaf) or
 * passed on. Return NULL to keep `grad`, or a NEW reference to use instead (e.g. a clipped
 * grad). A hook that fails sets an error and returns NULL with *failed = true. */
typedef em_tensor *(*em_grad_hook_fn)(const em_tensor *grad, void *user, bool *failed);
/* Hooks run in registration order. On a non-leaf they see the grad of that output of its op. */
EM_API em_status em_tensor_register_hook(em_tensor *t, em_grad_hook_fn fn, void *user);

/* Called once per backward for a leaf t that requires grad, after every contribution of
 * that backward was accumulated into its .grad (em_tensor_grad(t) is then complete): the hook
 * PyTorch calls register_post_accumulate_grad_hook, on which data-parallel training starts a
 * gradient bucket's allreduce while the rest of backward runs (ember/ddp.h). It does not run
 * when the backward reached t with no gradient (every contribution was none), nor for
 * em_grad(), which accumulates nothing. It runs with grad mode disabled, inside a scope of its
 * own. Return EM_OK, or an error (em_set_error) that fails the backward. */
typedef em_status (*em_post_accumulate_hook_fn)(em_tensor *t, void *user);
/* Hooks run in registration order; EM_ERR_STATE on a non-leaf or a tensor that does not
 * require grad. (New in EMBER_1.1.) */
EM_API em_status em_tensor_register_post_accumulate_hook(em_tensor *t,
                                                         em_post_accumulate_hook_fn fn,
                                                         void *user);
/* Remove the first hook registered with fn and user; EM_ERR_NOTFOUND when none. (1.1) */
EM_API em_status em_tensor_remove_post_accumulate_hook(em_tensor *t,
                                                       em_post_accumulate_hook_fn fn,
                                                       void *user);

/* ---- diagnostics ------------------------------------------------------------------------------ */

/* Anomaly mode (also EMBER_ANOMALY=1 at em_init): every floating output of every op is
 * checked, for NaN in the forward pass (an infinity there is often meant: a -inf mask) and for
 * NaN or Inf in backward; the error names the first op that produced one, forward or
 * backward, the input shapes, and the sequence of ops that led to it. Slow: for debugging. */
EM_API void em_set_anomaly(bool on);
EM_API bool em_anomaly_enabled(void);

/* Write the graph behind t as Graphviz dot: one node per op with its name, output shapes,
 * dtypes, devices and the bytes of the tensors it saved; leaves with their shapes. This is the
 * backward graph; the forward one (every op, views and copies included, parameters by their
 * state-dict names) is a trace: em_trace_begin/em_trace_end, then em_graph_dump_trace
 * (ember/trace.h). */
EM_API em_status em_graph_dump(const em_tensor *t, FILE *f);

/* The function em_gradcheck differentiates: returns a new tensor computed from the inputs
 * (ops on them are recorded as usual). */
typedef em_tensor *(*em_gradcheck_fn)(em_tensor *const *inputs, int n, void *user);
/* Compare analytical gradients with central finite differences: the inputs that require grad
 * are perturbed by +-eps one element at a time and the projection of the output onto a fixed
 * random direction v is differentiated numerically; that must match the analytical grad of
 * sum(v * f(x)) within atol + rtol * |numerical| for every element. The inputs may be on any
 * device (fn, the backward and the projection then run there; v is drawn on the CPU and
 * copied, and an element is read and written through copies, never through em_tensor_data).
 * The inputs that require grad must be float64 and contiguous: a step of 1e-6 is lost in
 * float32 or half rounding, so such an input is EM_ERR_DTYPE "gradcheck: input 0 is float32: finite
 * differences need float64 ...; pass em_to_dtype(x, EM_F64) ..." — convert the leaf, and
 * convert back inside fn when the op under test must run in the lower precision (with an eps,
 * atol and rtol that the lower precision can resolve). Inputs that
 * do not require grad (targets, indices) may have any dtype. EM_OK, or EM_ERR_INVALID with a
 * message naming the input (its index in inputs[]), the element and both values.
 * eps/atol/rtol <= 0 take the defaults 1e-6, 1e-5, 1e-3 (PyTorch's). */
EM_API em_status em_gradcheck(em_gradcheck_fn fn, int n, em_tensor *const *inputs, void *user,
                              double eps, double atol, double rtol);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_AUTOGRAD_H */
