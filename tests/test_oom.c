/*
 * test_oom.c — out-of-memory paths leak nothing (SQLite's malloc tests, Lua's Memcontrol).
 *
 * A counting host allocator, installed before em_init(), fails the Nth allocation (and, in
 * the "sticky" variant, every one after it too). For N = 1, 2, ... a fixed sequence runs —
 * em_init(); zeros, ones, from_data; two adds; a transpose view; em_contiguous; copy to the
 * host; release everything; em_shutdown() — until N is past the last allocation the sequence
 * makes. At every N:
 *   - a step that fails returns NULL or EM_ERR_NOMEM, with em_last_status() == EM_ERR_NOMEM
 *     and a message saying "out of memory" (em_init() failing that way is fine too);
 *   - a sequence that succeeds despite the failure (a retry absorbed it) computed the right
 *     values, checked against a plain loop;
 *   - after em_shutdown() no allocation made through the hook is still live.
 * CPU tensor bytes go through the same hook (the CPU backend allocates with em_host_alloc), so
 * device allocations fail too. dlopen's own allocations do not use the hook.
 */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

/* The counting allocator. Atomics: kernels may run on several threads. */
static struct {
    atomic_long calls;    /* alloc calls since arming */
    atomic_long live;     /* successful allocs not yet freed */
    atomic_long failures; /* allocs refused */
    long fail_at;         /* 1-based call number to refuse; 0 = never */
    bool sticky;          /* refuse every call from fail_at on */
} g_count;

static void *counting_alloc(size_t n, size_t align, void *user) {
    (void)user;
    long call = atomic_fetch_add(&g_count.calls, 1) + 1;
    long at = g_count.fail_at;
    if (at && (call == at || (g_count.sticky && call > at))) {
        atomic_fetch_add(&g_count.failures, 1);
        return NULL;
    }
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : 1) != 0)
        return NULL;
    atomic_fetch_add(&g_count.live, 1);
    return p;
}

static void counting_free(void *p, void *user) {
    (void)user;
    if (!p)
        return;
    atomic_fetch_sub(&g_count.live, 1);
    free(p);
}

static void arm(long fail_at, bool sticky) {
    atomic_store(&g_count.calls, 0);
    atomic_store(&g_count.failures, 0);
    g_count.fail_at = fail_at;
    g_count.sticky = sticky;
}

static void install(void) {
    atomic_store(&g_count.live, 0);
    arm(0, false);
    em_host_allocator_set(&(em_host_allocator){counting_alloc, counting_free, NULL});
}

static void uninstall(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    em_host_allocator_set(NULL);
}

TestSuite(oom, .init = install, .fini = uninstall);

/* ---- the sequence ------------------------------------------------------------------------- */

#define ROWS 3
#define COLS 5

typedef enum outcome { RAN_OK, FAILED_CLEANLY } outcome;

/* A step failed: it must be an out-of-memory error, reported as such. */
static void expect_nomem(long n, const char *step) {
    cr_assert_eq(em_last_status(), EM_ERR_NOMEM,
                 "fail_at=%ld: %s failed with %s (%s) instead of EM_ERR_NOMEM", n, step,
                 em_status_name(em_last_status()), em_last_error());
    cr_assert_not_null(strstr(em_last_error(), "out of memory"),
                       "fail_at=%ld: %s: message does not say out of memory: '%s'", n, step,
                       em_last_error());
}

/* cc = transpose(zeros + ones + arange) made contiguous: cc[j][i] = 1 + i * COLS + j. */
static void expect_values(long n, const float *got) {
    for (int j = 0; j < COLS; j++)
        for (int i = 0; i < ROWS; i++)
            cr_assert_eq(got[j * ROWS + i], (float)(1 + i * COLS + j),
                         "fail_at=%ld: cc[%d][%d] = %g", n, j, i, (double)got[j * ROWS + i]);
}

#define STEP(var, expr, name)                                                                 \
    do {                                                                                      \
        if (!((var) = (expr))) {                                                              \
            step = (name);                                                                    \
            goto done;                                                                        \
        }                                                                                     \
    } while (0)

static outcome run_sequence(long n) {
    em_clear_error();
    if (em_init() != EM_OK) {
        expect_nomem(n, "em_init");
        cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
        return FAILED_CLEANLY;
    }
    int64_t shape[2] = {ROWS, COLS};
    float data[ROWS * COLS], out[ROWS * COLS];
    for (int i = 0; i < ROWS * COLS; i++)
        data[i] = (float)i;
    em_tensor *a = NULL, *b = NULL, *d = NULL, *s = NULL, *c = NULL, *ct = NULL, *cc = NULL;
    const char *step = NULL;
    STEP(a, em_zeros(2, shape, EM_F32, em_cpu()), "em_zeros");
    STEP(b, em_ones(2, shape, EM_F32, em_cpu()), "em_ones");
    STEP(d, em_from_data(data, 2, shape, EM_F32, em_cpu()), "em_from_data");
    STEP(s, em_add(a, b), "em_add(zeros, ones)");
    STEP(c, em_add(s, d), "em_add(ones, arange)");
    STEP(ct, em_transpose(c, 0, 1), "em_transpose");
    STEP(cc, em_contiguous(ct), "em_contiguous");
    if (em_tensor_to_host(cc, out, sizeof out) != EM_OK)
        step = "em_tensor_to_host";
done:
    if (step)
        expect_nomem(n, step);
    else
        expect_values(n, out);
    em_tensor *all[] = {a, b, d, s, c, ct, cc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        em_tensor_release(all[i]);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    return step ? FAILED_CLEANLY : RAN_OK;
}

/* Fail allocation N for N = 1, 2, ... until the sequence makes fewer than N allocations. */
static void sweep(bool sticky) {
    arm(0, false);
    cr_assert_eq(run_sequence(0), RAN_OK, "the sequence works without failures");
    cr_assert_eq(atomic_load(&g_count.live), 0, "%ld allocations leaked without any failure",
                 atomic_load(&g_count.live));
    long total = atomic_load(&g_count.calls);
    cr_assert_gt(total, 5, "the hook saw only %ld allocations: is it installed?", total);

    long clean_failures = 0, n;
    for (n = 1; n <= 4 * total + 100; n++) {
        arm(n, sticky);
        outcome o = run_sequence(n);
        long leaked = atomic_load(&g_count.live);
        cr_assert_eq(leaked, 0, "fail_at=%ld%s: %ld allocations still live after em_shutdown",
                     n, sticky ? " (sticky)" : "", leaked);
        if (atomic_load(&g_count.failures) == 0) {
            cr_assert_eq(o, RAN_OK);
            break; /* the sequence no longer reaches allocation n */
        }
        clean_failures += o == FAILED_CLEANLY;
    }
    cr_assert_leq(n, 4 * total + 100, "the sweep never got past the last allocation");
    cr_assert_gt(n, total, "every allocation of the failure-free run was tried (%ld of %ld)",
                 n - 1, total);
    cr_assert_gt(clean_failures, 0, "no injected failure surfaced as an error");
}

Test(oom, failing_the_nth_allocation_leaks_nothing) {
    sweep(false);
}

Test(oom, failing_every_allocation_from_the_nth_leaks_nothing) {
    sweep(true);
}

/* The library reports the failed request in em__malloc's words; check one by hand: the very
 * first allocation em_init makes is refused. */
Test(oom, init_reports_out_of_memory) {
    arm(1, true);
    cr_assert_eq(em_init(), EM_ERR_NOMEM, "%s", em_last_error());
    cr_assert_not_null(strstr(em_last_error(), "out of memory"), "%s", em_last_error());
    cr_assert_not(em_initialized());
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    cr_assert_eq(atomic_load(&g_count.live), 0, "%ld allocations leaked after a failed em_init",
                 atomic_load(&g_count.live));
    /* With memory back, the library starts. */
    arm(0, false);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    cr_assert_eq(atomic_load(&g_count.live), 0, "%ld allocations leaked by em_init/em_shutdown",
                 atomic_load(&g_count.live));
}

/* A kernel's scratch memory is kernel workspace (em_kernel_workspace): it comes from the
 * caching allocator, so through this hook, and a refused request fails the op with an
 * out-of-memory error naming it. randperm into an int32 tensor shuffles in workspace (an
 * int64 vector) and then stores: with the cache emptied and every allocation refused, the
 * workspace request is the call's only allocation. */
Test(oom, kernel_workspace_failure_names_the_op) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    const em_op *op = em_op_find("randperm");
    cr_assert_not_null(op, "%s", em_last_error());
    int64_t n = 1000;
    em_tensor *y = em_empty(1, &n, EM_I32, em_cpu());
    cr_assert_not_null(y, "%s", em_last_error());
    em_attr attrs[2] = {{.type = EM_ATTR_INT, .v.i = 7}, {.type = EM_ATTR_INT, .v.i = 0}};
    /* Once with memory: the execution context and everything else a first call makes. */
    cr_assert_eq(em_op_call_out(op, NULL, 0, attrs, &y, 1), EM_OK, "%s", em_last_error());
    em_empty_cache();
    arm(1, true);
    em_clear_error();
    cr_assert_eq(em_op_call_out(op, NULL, 0, attrs, &y, 1), EM_ERR_NOMEM,
                 "a refused workspace request must fail the op (%s)", em_last_error());
    cr_expect_gt(atomic_load(&g_count.failures), 0, "the workspace went through the hook");
    const char *msg = em_last_error();
    cr_expect(strncmp(msg, "randperm: ", 10) == 0, "the message names the op: %s", msg);
    cr_expect_not_null(strstr(msg, "out of memory for 8000 bytes of kernel workspace on cpu"),
                       "%s", msg);
    em_memory_stats st;
    cr_assert_eq(em_memory_stats_get(em_cpu(), &st), EM_OK);
    cr_expect_eq(st.current[EM_MEM_WORKSPACE], 0, "no workspace held after the failed call");
    /* With memory back the same call works and gives a permutation. */
    arm(0, false);
    cr_assert_eq(em_op_call_out(op, NULL, 0, attrs, &y, 1), EM_OK, "%s", em_last_error());
    int32_t v[1000];
    bool seen[1000] = {false};
    cr_assert_eq(em_tensor_to_host(y, v, sizeof v), EM_OK, "%s", em_last_error());
    for (int i = 0; i < 1000; i++) {
        cr_assert(v[i] >= 0 && v[i] < 1000 && !seen[v[i]], "y[%d] = %d", i, v[i]);
        seen[v[i]] = true;
    }
    cr_assert_eq(em_memory_stats_get(em_cpu(), &st), EM_OK);
    cr_expect_eq(st.current[EM_MEM_WORKSPACE], 0, "the workspace went back when the call ended");
    cr_expect_gt(st.current[EM_MEM_CACHED], 0, "... into the cache");
    em_tensor_release(y);
    em_shutdown();
    cr_assert_eq(atomic_load(&g_count.live), 0, "%ld allocations leaked",
                 atomic_load(&g_count.live));
}
