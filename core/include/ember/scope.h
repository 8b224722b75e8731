/*
 * ember/scope.h — per-thread scopes that release intermediate tensors for you.
 *
 * Every function returning a tensor returns a new reference. Inside a scope those references
 * belong to the scope: em_scope_end() drops every reference created since the matching
 * em_scope_begin(), except the ones passed to em_keep(), which move to the enclosing scope
 * (or, at the outermost scope, to the caller). Objects that something else still holds — a
 * module's parameters, optimizer state, running statistics, a tensor the caller retained —
 * live on, because dropping a reference frees only the last one.
 *
 *     for (int step = 0; step < steps; step++) {
 *         em_scope_begin();
 *         em_tensor *h = em_relu(em_add(em_matmul(x, w1), b1));   // no release per temporary
 *         em_tensor *y = em_matmul(h, w2);
 *         last = em_keep(em_sum(y, 0, NULL, false));                // survives the scope
 *         em_scope_end();
 *         ...
 *         em_tensor_release(last);
 *     }
 *
 * Rules: do not em_tensor_release() a reference that a scope owns (em_keep it first, or
 * em_tensor_retain it to get a reference of your own). Scopes nest, and are per thread: a
 * tensor created on one thread belongs to that thread's scope. A helper function that releases
 * the tensors it creates should open a scope of its own around them (and em_keep what it
 * returns): it then works the same whether or not its caller has a scope open.
 *
 * Misuse is caught, not left to corrupt the heap (see em_tensor_release in ember/tensor.h):
 *   - releasing a tensor whose every reference belongs to open scopes sets EM_ERR_STATE and
 *     logs (at EM_LOG_ERROR, through the log callback) the tensor's shape and dtype and the
 *     file:line of the em_scope_begin that owns it, e.g.
 *         em_tensor_release: tensor [2, 3] float32 is owned by the scope opened at
 *         train.c:41 (em_keep it, or em_tensor_retain a reference of your own, before
 *         releasing it); released now, and that scope will not drop it
 *     The release then takes effect and that scope no longer drops the tensor. (When the
 *     owning scope is another thread's, nothing is released: that scope drops it.)
 *   - releasing a tensor after its scope ended and dropped it (a result used past
 *     em_scope_end without em_keep) sets EM_ERR_STATE and logs the same way ("tensor [2, 3]
 *     float32 was already freed: the scope opened at train.c:41 dropped its last reference
 *     ..."), and does nothing else. Freed tensors are poisoned and held in a per-thread
 *     quarantine of the last 1,024 before their memory is reused; a pointer older than that
 *     is no longer recognised (AddressSanitizer still reports it).
 */
#ifndef EMBER_SCOPE_H
#define EMBER_SCOPE_H

#include "ember/error.h"
#include "ember/export.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open a scope on this thread, remembering file:line (the call site, named in the messages
 * of ember/tensor.h's em_tensor_release and of em_shutdown_checked; the strings must outlive
 * the scope: __FILE__ does). EM_ERR_NOMEM if the scope stack cannot grow. Call it through
 * the em_scope_begin() macro. */
EM_API em_status em_scope_begin_at(const char *file, int line);
/* Open a scope on this thread: em_scope_begin_at(__FILE__, __LINE__). EM_ERR_NOMEM if the
 * scope stack cannot grow. (The function of that name stays exported for binaries built
 * before it became a macro; their scopes are named "(a caller built before
 * em_scope_begin_at)". `(em_scope_begin)()` or a pointer to it reaches it too.) */
EM_API em_status em_scope_begin(void);
#define em_scope_begin() em_scope_begin_at(__FILE__, __LINE__)
/* Close the innermost scope, dropping the references it owns. EM_ERR_STATE if no scope is
 * open on this thread. */
EM_API em_status em_scope_end(void);
/* Move t's reference out of the innermost scope (to the enclosing scope, or to the caller at
 * the outermost). Returns t. A tensor not owned by the current scope is returned unchanged.
 * NULL stays NULL. */
EM_API em_tensor *em_keep(em_tensor *t);
/* Number of open scopes on this thread. */
EM_API int em_scope_depth(void);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_SCOPE_H */
