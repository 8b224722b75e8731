/*
 * common.h — helpers shared by the Criterion tests: library set-up per test, tensors from
 * literals, and reading values back.
 */
#ifndef EMBER_TESTS_COMMON_H
#define EMBER_TESTS_COMMON_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

/* Library start-up and shutdown for a test suite: .init = em_test_setup, .fini = em_test_teardown */
static inline void em_test_setup(void) {
    cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error());
}
static inline void em_test_teardown(void) { em_shutdown(); }

/* A CPU tensor from a literal array of doubles, converted to dtype dt. */
static inline em_tensor *em_test_tensor(em_dtype dt, int ndim, const int64_t *shape,
                                        const double *values) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    /* Its own scope, so it works whether or not the caller has one open. */
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *t = em_empty(ndim, shape, dt, em_cpu());
    cr_assert(t, "em_empty: %s", em_last_error());
    double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
    memcpy(buf, values, sizeof(double) * (size_t)n);
    em_tensor *d = em_from_data(buf, ndim, shape, EM_F64, em_cpu());
    cr_assert(d, "em_from_data: %s", em_last_error());
    cr_assert_eq(em_copy_(t, d), EM_OK, "copy_: %s", em_last_error());
    free(buf);
    em_keep(t);
    cr_assert_eq(em_scope_end(), EM_OK);
    return t;
}

/* Element i (C order) of t as a double. */
static inline double em_test_at(const em_tensor *t, int64_t i) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *c = em_to_dtype(t, EM_F64);
    cr_assert(c, "to_dtype: %s", em_last_error());
    int64_t n = em_tensor_numel(c);
    double *buf = malloc(sizeof(double) * (size_t)(n ? n : 1));
    cr_assert_eq(em_tensor_to_host(c, buf, sizeof(double) * (size_t)n), EM_OK, "%s",
                 em_last_error());
    double v = buf[i];
    free(buf);
    cr_assert_eq(em_scope_end(), EM_OK);
    return v;
}

/* The last error contains `needle`. */
#define em_assert_error(status, needle)                                                        \
    do {                                                                                       \
        cr_assert_eq(em_last_status(), (status), "status %s, message: %s",                     \
                     em_status_name(em_last_status()), em_last_error());                       \
        cr_assert(strstr(em_last_error(), (needle)), "message '%s' lacks '%s'",                \
                  em_last_error(), (needle));                                                  \
    } while (0)

#endif /* EMBER_TESTS_COMMON_H */
