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
 */
#ifndef EMBER_SCOPE_H
#define EMBER_SCOPE_H

#include "ember/error.h"
#include "ember/export.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open a scope on this thread. EM_ERR_NOMEM if the scope stack cannot grow. */
EM_API em_status em_scope_begin(void);
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
