/* Status codes, the thread-local last error, NULL-input chaining and logging. */
#include <pthread.h>

#include "common.h"

TestSuite(error, .fini = em_test_teardown);

Test(error, names_and_messages_come_from_one_map) {
    cr_assert_str_eq(em_status_name(EM_OK), "EM_OK");
    cr_assert_str_eq(em_status_name(EM_ERR_SHAPE), "EM_ERR_SHAPE");
    cr_assert_str_eq(em_status_str(EM_ERR_NOMEM), "out of memory");
    cr_assert_str_eq(em_status_name((em_status)999), "EM_UNKNOWN");
    cr_assert_str_eq(em_status_str((em_status)-1), "unknown status");
}

Test(error, set_clear_and_format) {
    em_clear_error();
    cr_assert_eq(em_last_status(), EM_OK);
    cr_assert_str_eq(em_last_error(), "");
    cr_assert_eq(em_set_error(EM_ERR_SHAPE, "op: %d != %d", 3, 4), EM_ERR_SHAPE);
    cr_assert_str_eq(em_last_error(), "op: 3 != 4");
    /* Formatting a message from the previous one is safe. */
    em_set_error(EM_ERR_IO, "wrapped: %s", em_last_error());
    cr_assert_str_eq(em_last_error(), "wrapped: op: 3 != 4");
    char big[4000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    em_set_error(EM_ERR_INVALID, "%s", big);
    cr_assert_eq(strlen(em_last_error()), 1023, "long messages are truncated to 1 KiB");
    em_clear_error();
}

static void *other_thread(void *arg) {
    (void)arg;
    /* A fresh thread has no error, and setting one does not touch the main thread's. */
    bool clean = em_last_status() == EM_OK;
    em_set_error(EM_ERR_IO, "thread error");
    return clean ? (void *)1 : NULL;
}

Test(error, the_last_error_is_per_thread) {
    em_set_error(EM_ERR_SHAPE, "main error");
    pthread_t th;
    void *ret;
    pthread_create(&th, NULL, other_thread, NULL);
    pthread_join(th, &ret);
    cr_assert_not_null(ret);
    cr_assert_str_eq(em_last_error(), "main error");
    em_clear_error();
}

Test(error, a_chain_of_ops_keeps_the_first_error, .init = em_test_setup, .fini = em_test_teardown) {
    em_clear_error();
    em_tensor *a = em_ones(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    em_tensor *b = em_ones(2, (int64_t[]){4, 5}, EM_F32, em_cpu());
    em_tensor *y = em_relu(em_exp(em_matmul(a, b)));
    cr_assert_null(y);
    em_assert_error(EM_ERR_SHAPE, "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
    /* A NULL input with no pending error says which input was NULL. */
    em_clear_error();
    cr_assert_null(em_add(a, NULL));
    em_assert_error(EM_ERR_INVALID, "add: input 1 is NULL");
    em_tensor_release(a);
    em_tensor_release(b);
}

typedef struct captured {
    int count;
    em_log_level level;
    char msg[256];
} captured;

static void capture(em_log_level level, const char *msg, void *user) {
    captured *c = user;
    c->count++;
    c->level = level;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
}

Test(error, logging_goes_through_the_callback_and_level) {
    captured c = {0};
    em_log_set(capture, &c);
    em_log_set_level(EM_LOG_WARN);
    em_log_write(EM_LOG_INFO, "hidden %d", 1);
    cr_assert_eq(c.count, 0, "info is below the warn level");
    em_log_write(EM_LOG_WARN, "shown %d", 2);
    cr_assert_eq(c.count, 1);
    cr_assert_eq(c.level, EM_LOG_WARN);
    cr_assert_str_eq(c.msg, "shown 2");
    em_log_set_level(EM_LOG_DEBUG);
    em_log_write(EM_LOG_DEBUG, "debug");
    cr_assert_eq(c.count, 2);
    em_log_set(NULL, NULL);
    em_log_set_level(EM_LOG_WARN);
}

Test(error, EMBER_LOG_sets_the_level_at_init) {
    /* Captured, not printed: em_init's info and debug lines would land on the test's stderr. */
    captured c = {0};
    em_log_set(capture, &c);
    setenv("EMBER_LOG", "debug", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_log_get_level(), EM_LOG_DEBUG);
    cr_assert_gt(c.count, 0, "em_init at debug level logged nothing");
    em_test_assert_clean_shutdown();
    c = (captured){0};
    setenv("EMBER_LOG", "loud", 1);
    em_log_set_level(EM_LOG_WARN);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert(strstr(c.msg, "EMBER_LOG='loud'"), "got '%s'", c.msg);
    em_test_assert_clean_shutdown();
    em_log_set(NULL, NULL);
    unsetenv("EMBER_LOG");
}
