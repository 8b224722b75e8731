/*
 * tests/op_cases.h — the tests' view of the standard op set's case rows (ember/opcase.h).
 * The rows live in the core (core/op_cases.c), registered by em_init() with the core's
 * registry, and are read here through the registry: there is never a second table.
 *
 *     for (int r = 0, nr = em_std_case_count(); r < nr; r++) {
 *         const em_op_case *c = em_op_case_get(r);
 *         em_tensor *in[EM_CASE_MAX_IN];
 *         em_case_inputs(c, EM_F32, 1, in);          // NULL entries: absent optional inputs
 *         ... em_op_call_n(em_op_find(c->op), in, c->n_in, c->attrs, out, 8, &n) ...
 *     }
 */
#ifndef EMBER_TESTS_OP_CASES_H
#define EMBER_TESTS_OP_CASES_H

#include <ember/ember.h>

/* The standard rows: the registry's first ones, those the core registered (a plugin's rows
 * follow them). */
static inline int em_std_case_count(void) {
    size_t n = em_op_case_count(), k = 0;
    const em_registry *core = em_registry_core();
    while (k < n && em_op_case_owner(k) == core) k++;
    return (int)k;
}

#endif /* EMBER_TESTS_OP_CASES_H */
