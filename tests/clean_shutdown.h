/*
 * clean_shutdown.h — every Criterion test ends with an asserted clean shutdown (libuv's
 * MAKE_VALGRIND_HAPPY): included after <criterion/criterion.h>, it redefines Test() so that
 * the test's body is followed, inside the test itself, by
 *
 *     cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
 *
 * A tensor, module, optimizer, dict, ... the test left alive then fails that test, with the
 * message naming what was left. (An assertion in a .fini function does not: Criterion 2.4
 * has reported the test as passed by then, and ignores what its teardown says.) A suite's
 * .fini still runs afterwards; a second em_shutdown_checked there finds nothing to do.
 */
#ifndef EMBER_TESTS_CLEAN_SHUTDOWN_H
#define EMBER_TESTS_CLEAN_SHUTDOWN_H

#include <criterion/criterion.h>

#include <ember/ember.h>

#undef Test
#define Test(...) CR_EXPAND(EM__TEST_CLEAN(__VA_ARGS__, .sentinel_ = 0))
#define EM__TEST_CLEAN(Category, Name, ...)                                                    \
    static void em__test_body_##Category##_##Name(void);                                      \
    CR_TEST_BASE(Category, Name, __VA_ARGS__) {                                                \
        em__test_body_##Category##_##Name();                                                   \
        cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());                     \
    }                                                                                          \
    static void em__test_body_##Category##_##Name(void)

#endif /* EMBER_TESTS_CLEAN_SHUTDOWN_H */
