/* Scopes: references created inside are dropped at the end, em_keep moves them out, objects
 * held elsewhere survive, and a loop inside scopes holds memory flat. Misuse (releasing what a
 * scope owns, or what it already dropped) is caught and explained, in a child process each. */
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

TestSuite(scope, .init = em_test_setup, .fini = em_test_teardown);

static size_t activation_bytes(void) {
    em_memory_stats s;
    cr_assert_eq(em_memory_stats_get(em_cpu(), &s), EM_OK, "%s", em_last_error());
    return s.current[EM_MEM_ACTIVATION];
}

Test(scope, end_drops_what_was_created_inside) {
    size_t before = activation_bytes();
    cr_assert_eq(em_scope_begin(), EM_OK);
    cr_assert_eq(em_scope_depth(), 1);
    em_tensor *a = em_ones(1, (int64_t[]){1000}, EM_F32, em_cpu());
    em_tensor *b = em_add(a, a);
    cr_assert_not_null(b);
    cr_assert_gt(activation_bytes(), before);
    cr_assert_eq(em_scope_end(), EM_OK);
    cr_assert_eq(em_scope_depth(), 0);
    cr_assert_eq(activation_bytes(), before, "every tensor made in the scope is freed");
}

Test(scope, keep_moves_a_reference_out) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *a = em_full(1, (int64_t[]){4}, 2.0, EM_F32, em_cpu());
    em_tensor *s = em_keep(em_sum(em_mul(a, a), 0, NULL, false));
    cr_assert_eq(em_scope_end(), EM_OK);
    cr_assert_float_eq(em_item(s), 16.0, 0);
    em_tensor_release(s); /* kept at the outermost scope: the caller owns it */
}

Test(scope, nested_scopes_and_keep_to_the_parent) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *outer = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu());
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *inner = em_keep(em_add(outer, outer)); /* moves to the outer scope */
    em_tensor *dropped = em_mul(outer, outer);
    (void)dropped;
    cr_assert_eq(em_scope_end(), EM_OK);
    cr_assert_float_eq(em_test_at(inner, 0), 2.0, 0, "inner survives the inner scope");
    cr_assert_eq(em_scope_end(), EM_OK); /* frees outer and inner */
    cr_assert_eq(em_scope_end(), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "no scope is open");
}

Test(scope, objects_held_elsewhere_live_on) {
    /* A "parameter" created outside any scope and retained by the program survives scopes that
     * use it and views of it. */
    em_tensor *w = em_ones(2, (int64_t[]){2, 2}, EM_F32, em_cpu());
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *wt = em_transpose(w, 0, 1);
    em_tensor *held = em_tensor_retain(wt); /* a reference of the program's own */
    cr_assert_eq(em_scope_end(), EM_OK);
    cr_assert_float_eq(em_test_at(held, 3), 1.0, 0);
    em_tensor_release(held);
    cr_assert_float_eq(em_test_at(w, 0), 1.0, 0);
    em_tensor_release(w);
}

Test(scope, a_training_like_loop_holds_memory_flat) {
    em_tensor *w = em_ones(2, (int64_t[]){16, 8}, EM_F32, em_cpu());
    em_tensor *x = em_ones(2, (int64_t[]){4, 16}, EM_F32, em_cpu());
    size_t after_first = 0;
    for (int step = 0; step < 200; step++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        em_tensor *loss = em_sum(em_relu(em_matmul(x, w)), 0, NULL, false);
        cr_assert_float_eq(em_item(loss), 4 * 8 * 16.0, 0);
        cr_assert_eq(em_scope_end(), EM_OK);
        if (step == 0) after_first = activation_bytes();
        cr_assert_eq(activation_bytes(), after_first, "step %d", step);
    }
    em_memory_stats s;
    em_memory_stats_get(em_cpu(), &s);
    cr_assert_gt(s.cache_hits, 100, "steady-state steps reuse cached blocks");
    em_tensor_release(w);
    em_tensor_release(x);
}

/* ---- misuse is caught, in a child process ------------------------------------------------- */

TestSuite(scope_misuse, .init = em_test_setup, .fini = em_test_teardown);

/* What the child's log callback and last error said, for the parent to check. */
typedef struct misuse_log {
    char text[2048];
    int count;
} misuse_log;

static void keep_log(em_log_level level, const char *msg, void *user) {
    misuse_log *l = user;
    if (level != EM_LOG_ERROR) return;
    l->count++;
    strncat(l->text, msg, sizeof l->text - strlen(l->text) - 2);
    strcat(l->text, "\n");
}

/* Run fn in a forked child with a log callback; fn returns 0 when its own checks held. The
 * child writes "<errors logged>|<the log>|<em_last_error after fn>" into out, and the line fn
 * set into *line. Returns the
 * child's exit status, 128 + the signal when it was killed (an abort). */
static int in_child(int (*fn)(int *line), char *out, size_t cap, int *line) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(p[0]);
        static misuse_log log;
        em_log_set(keep_log, &log);
        int rc = fn(line);
        char buf[4096];
        int n = snprintf(buf, sizeof buf, "%d:%d|%s|%s", *line, log.count, log.text,
                         em_last_error());
        ssize_t w = write(p[1], buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
        (void)w;
        /* Everything was released: the child's shutdown is clean too. */
        if (rc == 0 && em_shutdown_checked() != EM_OK) rc = 20;
        _exit(rc);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(p[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = '\0';
    close(p[0]);
    /* The child's fn set *line in the child: take it from the front of out. */
    char *colon = strchr(out, ':');
    *line = atoi(out);
    if (colon) memmove(out, colon + 1, strlen(colon + 1) + 1);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* A result made in a scope, released by the program: caught, released once, not dropped
 * again by the scope. */
static int release_scope_owned(int *line) {
    *line = __LINE__ + 1;
    if (em_scope_begin() != EM_OK) return 1;
    em_tensor *t = em_zeros(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    if (!t) return 2;
    em_clear_error();
    em_tensor_release(t); /* the scope owns this reference */
    if (em_last_status() != EM_ERR_STATE) return 3;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    if (em_scope_end() != EM_OK) return 4; /* must not drop t a second time */
    em_set_error(EM_ERR_STATE, "%s", msg);
    return 0;
}

Test(scope_misuse, releasing_a_reference_the_scope_owns_is_caught) {
    char out[4096], want[256];
    int line = 0;
    int rc = in_child(release_scope_owned, out, sizeof out, &line);
    cr_assert_eq(rc, 0, "the child failed (status %d; 134 is an abort): %s", rc, out);
    cr_assert(strncmp(out, "1|", 2) == 0, "one error logged: %s", out);
    snprintf(want, sizeof want, "test_scope.c:%d", line);
    cr_assert(strstr(out, want), "the owning em_scope_begin (%s) is named: %s", want, out);
    cr_assert(strstr(out, "tensor [2, 3] float32 is owned by the scope"), "%s", out);
    cr_assert(strstr(out, "that scope will not drop it"), "%s", out);
    /* The log and the last error say the same. */
    const char *log = strchr(out, '|') + 1, *err = strrchr(out, '|') + 1;
    cr_assert(strncmp(log, err, strlen(err)) == 0, "log and last error differ: %s", out);
}

/* Owned by the outer of two scopes: the outer one is named, both end cleanly. */
static int release_outer_owned(int *line) {
    *line = __LINE__ + 1;
    if (em_scope_begin() != EM_OK) return 1;
    em_tensor *t = em_ones(1, (int64_t[]){7}, EM_F64, em_cpu());
    if (em_scope_begin() != EM_OK) return 2;
    em_tensor *u = em_add(t, t); /* the inner scope's */
    em_tensor_release(t);
    if (em_last_status() != EM_ERR_STATE) return 3;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", em_last_error());
    if (!u || em_scope_end() != EM_OK || em_scope_end() != EM_OK) return 4;
    em_set_error(EM_ERR_STATE, "%s", msg);
    return 0;
}

Test(scope_misuse, the_owning_scope_is_the_one_named) {
    char out[4096], want[256];
    int line = 0;
    int rc = in_child(release_outer_owned, out, sizeof out, &line);
    cr_assert_eq(rc, 0, "the child failed (status %d): %s", rc, out);
    snprintf(want, sizeof want, "tensor [7] float64 is owned by the scope opened at %s:%d",
             __FILE__, line);
    cr_assert(strstr(out, want), "want '%s' in: %s", want, out);
}

/* A reference of the program's own (retained, or kept) is not misuse. */
static int release_own_reference(int *line) {
    *line = 0;
    em_clear_error();
    if (em_scope_begin() != EM_OK) return 1;
    em_tensor *t = em_zeros(1, (int64_t[]){3}, EM_F32, em_cpu());
    em_tensor_release(em_tensor_retain(t));
    em_tensor *k = em_keep(em_add(t, t));
    if (em_scope_end() != EM_OK) return 2;
    em_tensor_release(k);
    return em_last_status() == EM_OK ? 0 : 3;
}

Test(scope_misuse, releasing_your_own_reference_is_not_misuse) {
    char out[4096];
    int line;
    int rc = in_child(release_own_reference, out, sizeof out, &line);
    cr_assert_eq(rc, 0, "the child failed (status %d): %s", rc, out);
    cr_assert(strncmp(out, "0|", 2) == 0, "nothing logged: %s", out);
}

/* A result used after its scope ended and dropped it: caught through the quarantine. */
static int release_after_scope_end(int *line) {
    *line = __LINE__ + 1;
    if (em_scope_begin() != EM_OK) return 1;
    em_tensor *t = em_ones(1, (int64_t[]){4}, EM_I64, em_cpu());
    if (!t || em_scope_end() != EM_OK) return 2;
    /* Other tensors come and go meanwhile (fewer than the quarantine holds). */
    for (int i = 0; i < 100; i++) em_tensor_release(em_zeros(1, (int64_t[]){4}, EM_I64, em_cpu()));
    em_clear_error();
    em_tensor_release(t); /* t was freed by em_scope_end */
    return em_last_status() == EM_ERR_STATE ? 0 : 3;
}

Test(scope_misuse, releasing_what_the_scope_dropped_is_caught) {
    char out[4096], want[256];
    int line = 0;
    int rc = in_child(release_after_scope_end, out, sizeof out, &line);
    cr_assert_eq(rc, 0, "the child failed (status %d; 134 is an abort): %s", rc, out);
    cr_assert(strncmp(out, "1|", 2) == 0, "one error logged: %s", out);
    snprintf(want, sizeof want, "test_scope.c:%d dropped its last reference", line);
    cr_assert(strstr(out, want), "the scope that dropped it (%s) is named: %s", want, out);
    cr_assert(strstr(out, "tensor [4] int64 was already freed"), "%s", out);
}

/* Released twice without any scope: caught the same way. */
static int release_twice(int *line) {
    *line = 0;
    em_tensor *t = em_full(2, (int64_t[]){1, 2}, 3.0, EM_BF16, em_cpu());
    em_tensor_release(t);
    em_tensor_release(t);
    return em_last_status() == EM_ERR_STATE ? 0 : 3;
}

Test(scope_misuse, a_second_release_is_caught) {
    char out[4096];
    int line;
    int rc = in_child(release_twice, out, sizeof out, &line);
    cr_assert_eq(rc, 0, "the child failed (status %d): %s", rc, out);
    cr_assert(strstr(out, "tensor [1, 2] bfloat16 was already freed (its last reference was "
                          "released before)"), "%s", out);
}
