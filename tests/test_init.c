/*
 * test_init.c — starting and stopping the library: em_init() is idempotent and thread-safe,
 * init/shutdown cycles leave nothing behind (the suite runs under ASan), em_shutdown()
 * without em_init() does nothing, and a missing CPU plugin makes em_init() fail with a
 * message that says what is missing and where to look.
 */
#define _GNU_SOURCE /* setenv */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

static void no_setup(void) {}
static void teardown(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    unsetenv("EMBER_DISABLE_PLUGINS");
}

TestSuite(init, .init = no_setup, .fini = teardown);

/* sum(arange(n)) on the CPU, as a check that the library works. */
static double arange_sum(int n) {
    em_tensor *a = em_arange(0, n, 1, EM_F64, em_cpu());
    cr_assert_not_null(a, "%s", em_last_error());
    em_tensor *s = em_sum(a, 0, NULL, false);
    cr_assert_not_null(s, "%s", em_last_error());
    double v = em_item(s);
    em_tensor_release(a);
    em_tensor_release(s);
    return v;
}

Test(init, twice_is_idempotent) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert(em_initialized());
    size_t plugins = em_plugin_count();
    cr_assert_geq(plugins, 1);
    const char *path = em_plugin_search_path();
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert(em_initialized());
    cr_assert_eq(em_plugin_count(), plugins, "the second em_init loaded plugins again");
    cr_assert_str_eq(em_plugin_search_path(), path);
    cr_assert_eq(em_device_count("cpu"), 1);
    cr_assert_float_eq(arange_sum(10), 45.0, 0);
}

Test(init, cycles_leave_nothing_behind) {
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(em_init(), EM_OK, "round %d: %s", round, em_last_error());
        cr_assert(em_initialized());
        cr_assert_float_eq(arange_sum(100), 4950.0, 0, "round %d", round);
        cr_assert_not_null(em_op_find("add"));
        cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
        cr_assert(!em_initialized(), "round %d", round);
        cr_assert_eq(em_device_count("cpu"), 0, "the CPU device outlived em_shutdown");
    }
}

static pthread_barrier_t start;

static void *init_thread(void *arg) {
    em_status *out = arg;
    pthread_barrier_wait(&start);
    *out = em_init();
    return NULL;
}

Test(init, concurrent_init) {
    enum { N = 4 };
    pthread_t th[N];
    em_status st[N];
    cr_assert_eq(pthread_barrier_init(&start, NULL, N), 0);
    for (int i = 0; i < N; i++) cr_assert_eq(pthread_create(&th[i], NULL, init_thread, &st[i]), 0);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (int i = 0; i < N; i++)
        cr_assert_eq(st[i], EM_OK, "thread %d: %s", i, em_status_name(st[i]));
    cr_assert(em_initialized());
    size_t concurrent = em_plugin_count();
    cr_assert_float_eq(arange_sum(5), 10.0, 0);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    /* The same plugins as one plain em_init() sees: none were loaded twice. */
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_plugin_count(), concurrent);
}

Test(init, shutdown_without_init_does_nothing) {
    cr_assert(!em_initialized());
    em_shutdown();
    em_shutdown();
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    cr_assert(!em_initialized());
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_float_eq(arange_sum(3), 3.0, 0);
}

Test(init, version_and_build_info) {
    cr_assert_str_eq(em_version(), EM_VERSION_STRING);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", EM_VERSION_MAJOR, EM_VERSION_MINOR, EM_VERSION_PATCH);
    cr_assert_str_eq(em_version(), want);
    const char *bi = em_build_info();
    cr_assert_not_null(bi);
    cr_assert(strstr(bi, em_version()), "build info '%s' lacks the version", bi);
    char abi[32];
    snprintf(abi, sizeof abi, "plugin ABI %d", EM_PLUGIN_ABI_MAJOR);
    cr_assert(strstr(bi, abi), "build info '%s' lacks '%s'", bi, abi);
}

Test(init, without_the_cpu_plugin_init_fails) {
    setenv("EMBER_DISABLE_PLUGINS", "ember-cpu", 1);
    cr_assert_eq(em_init(), EM_ERR_PLUGIN);
    cr_assert_eq(em_last_status(), EM_ERR_PLUGIN);
    cr_assert(strstr(em_last_error(), "CPU device"), "message: %s", em_last_error());
    cr_assert(strstr(em_last_error(), "ember-info"), "message: %s", em_last_error());
    /* The plugin list is still there, saying why. */
    bool listed = false;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info p;
        cr_assert_eq(em_plugin_get(i, &p), EM_OK);
        if (p.name && strcmp(p.name, "ember-cpu") == 0) {
            cr_assert_eq(p.status, EM_PLUGIN_DISABLED);
            cr_assert(p.reason && strstr(p.reason, "EMBER_DISABLE_PLUGINS"));
            listed = true;
        }
    }
    cr_assert(listed, "ember-cpu is not listed");
    /* A second call gives the same answer. */
    em_clear_error();
    cr_assert_eq(em_init(), EM_ERR_PLUGIN);
    cr_assert(strstr(em_last_error(), "CPU device"), "message: %s", em_last_error());
    em_tensor *t = em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu());
    cr_assert_null(t);
    cr_assert_eq(em_last_status(), EM_ERR_DEVICE, "%s", em_last_error());

    /* Shut down, re-enable, and the library starts. */
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    unsetenv("EMBER_DISABLE_PLUGINS");
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_float_eq(arange_sum(4), 6.0, 0);
}

static void setup(void) { cr_assert_eq(em_init(), EM_OK, "%s", em_last_error()); }

Test(init, plugins_describe_their_choices, .init = setup, .fini = teardown) {
    bool found = false;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info info;
        cr_assert_eq(em_plugin_get(i, &info), EM_OK);
        if (!info.name || strcmp(info.name, "ember-cpu") != 0) continue;
        const char *notes = em_plugin_describe(i);
        cr_assert(notes && strstr(notes, "f32 GEMM: "), "ember-cpu says which GEMM it uses: %s",
                  notes ? notes : "(null)");
        found = true;
    }
    cr_assert(found);
    cr_assert_null(em_plugin_describe(em_plugin_count() + 5));
}

Test(init, openmp_waits_passively_unless_the_user_chose) {
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_str_eq(getenv("OMP_WAIT_POLICY"), "PASSIVE");
    cr_assert_null(getenv("GOMP_SPINCOUNT"), "no spin count is made up");
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_str_eq(getenv("OMP_WAIT_POLICY"), "ACTIVE", "the user's choice stands");
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    /* A spin count alone is a choice too: libgomp's policy stays the user's (unset), so the
     * count is libgomp's whole wait, not a passive policy's with the count on top. */
    unsetenv("OMP_WAIT_POLICY");
    setenv("GOMP_SPINCOUNT", "1000", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_assert_null(getenv("OMP_WAIT_POLICY"), "GOMP_SPINCOUNT=1000 alone: the policy stays unset");
    cr_assert_str_eq(getenv("GOMP_SPINCOUNT"), "1000");
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    unsetenv("GOMP_SPINCOUNT");
}

/* A program that loaded libgomp before em_init (it uses OpenMP itself) cannot get passive
 * workers from Ember: em_init says so once, and stays quiet when the user chose a policy. */
static char logged[2048];
static void keep_log(em_log_level level, const char *msg, void *user) {
    (void)user;
    if (level <= EM_LOG_WARN) strncat(logged, msg, sizeof logged - strlen(logged) - 1);
}

Test(init, warns_when_openmp_was_loaded_first) {
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
    void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL);
    cr_assert_not_null(gomp, "%s", dlerror());
    em_log_set(keep_log, NULL);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_expect(strstr(logged, "OpenMP (libgomp) was loaded before em_init") != NULL, "log: %s",
              logged);
    cr_expect(strstr(logged, "OMP_WAIT_POLICY=PASSIVE") != NULL, "the fix is named: %s", logged);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    logged[0] = 0;
    setenv("OMP_WAIT_POLICY", "ACTIVE", 1);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_expect(strstr(logged, "libgomp") == NULL, "the user chose: no warning, got %s", logged);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    em_log_set(NULL, NULL);
    unsetenv("OMP_WAIT_POLICY");
    dlclose(gomp);
}

Test(init, no_openmp_warning_in_a_plain_program) {
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
    if (dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD))
        cr_skip_test("libgomp is preloaded into this test (the sanitizer build does so)");
    em_log_set(keep_log, NULL);
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    cr_expect(strstr(logged, "libgomp") == NULL, "log: %s", logged);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
    em_log_set(NULL, NULL);
}

/* ---- a shutdown that tells ------------------------------------------------------------------ */

/* Run fn in a forked child (what it leaks dies with it, unseen by LeakSanitizer: _exit); its
 * text into out. Returns the child's exit status (128 + signal when killed). */
static int in_child(int (*fn)(char *, size_t), char *out, size_t cap) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(p[0]);
        char m[2048] = "";
        int rc = fn(m, sizeof m);
        ssize_t w = write(p[1], m, strlen(m));
        (void)w;
        _exit(rc);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(p[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = '\0';
    close(p[0]);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

/* Leaves tensors, a module, an optimizer, a dict, a generator and an open scope alive. */
static int leak_and_shut_down(char *m, size_t cap) {
    if (em_init() != EM_OK) return 1;
    em_tensor *a = em_zeros(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    em_module *relu = em_module_new("ReLU", NULL);
    em_dict *d = em_dict_new();
    em_tensor *w = em_ones(1, (int64_t[]){4}, EM_F32, em_cpu());
    em_requires_grad_(w, true);
    em_dict_set(d, "w", w);
    em_optimizer *o = em_optimizer_new("Adam", d, NULL);
    em_generator *g = em_generator_new(7);
    int line = __LINE__ + 1;
    em_scope_begin();
    em_tensor *b = em_ones(1, (int64_t[]){5}, EM_I64, em_cpu());
    if (!a || !relu || !d || !w || !o || !g || !b) {
        snprintf(m, cap, "setup: %s", em_last_error());
        return 2;
    }
    em_status st = em_shutdown_checked();
    snprintf(m, cap, "%d|%s|%s", line, em_status_name(st), em_last_error());
    return em_initialized() ? 3 : 0;
}

Test(init, shutdown_checked_names_what_is_still_alive) {
    char out[4096], want[256];
    int rc = in_child(leak_and_shut_down, out, sizeof out);
    cr_assert_eq(rc, 0, "the child failed (status %d): %s", rc, out);
    int line = atoi(out);
    const char *msg = strchr(out, '|') + 1;
    cr_assert(strncmp(msg, "EM_ERR_BUSY|", 12) == 0, "status: %s", out);
    cr_assert(strstr(msg, "em_shutdown_checked: the program still holds"), "%s", msg);
    cr_assert(strstr(msg, "3 tensors ("), "a, w and b: %s", msg);
    cr_assert(strstr(msg, "[2, 3] float32"), "%s", msg);
    cr_assert(strstr(msg, "[4] float32"), "%s", msg);
    snprintf(want, sizeof want, "[5] int64 (from the scope opened at %s:%d)", __FILE__, line);
    cr_assert(strstr(msg, want), "want '%s': %s", want, msg);
    snprintf(want, sizeof want, "1 open scope on this thread (the innermost opened at %s:%d)",
             __FILE__, line);
    cr_assert(strstr(msg, want), "want '%s': %s", want, msg);
    cr_assert(strstr(msg, "1 module"), "%s", msg);
    cr_assert(strstr(msg, "1 optimizer"), "%s", msg);
    cr_assert(strstr(msg, "1 dict"), "%s", msg);
    cr_assert(strstr(msg, "1 generator"), "%s", msg);
    cr_assert(strstr(msg, "release them before shutting down"), "%s", msg);
}

/* em_shutdown (void) logs the same verdict, and the library starts again afterwards. */
static char warned[2048];
static void keep_warning(em_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == EM_LOG_WARN) snprintf(warned, sizeof warned, "%s", msg);
}

static int leak_one_and_restart(char *m, size_t cap) {
    if (em_init() != EM_OK) return 1;
    em_log_set(keep_warning, NULL);
    em_tensor *t = em_arange(0, 3, 1, EM_F64, em_cpu());
    if (!t) return 2;
    em_shutdown();
    snprintf(m, cap, "%s", warned);
    if (em_initialized()) return 3;
    if (em_init() != EM_OK) return 4;
    em_tensor *u = em_ones(1, (int64_t[]){2}, EM_F32, em_cpu());
    em_tensor_release(u);
    /* One tensor of the first run is still alive (leaked): still named. */
    if (em_shutdown_checked() != EM_ERR_BUSY) return 5;
    if (!strstr(em_last_error(), "1 tensor ([3] float64)")) return 6;
    return 0;
}

Test(init, shutdown_logs_the_verdict_and_init_works_again) {
    char out[4096];
    int rc = in_child(leak_one_and_restart, out, sizeof out);
    cr_assert_eq(rc, 0, "the child failed (status %d): %s", rc, out);
    cr_assert(strstr(out, "em_shutdown_checked: the program still holds 1 tensor ([3] float64)"),
              "warning: %s", out);
}

Test(init, a_clean_shutdown_is_ok_and_repeats) {
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
        em_tensor *t = em_ones(1, (int64_t[]){8}, EM_F32, em_cpu());
        cr_assert_eq(em_scope_begin(), EM_OK);
        cr_assert_not_null(em_add(t, t));
        cr_assert_eq(em_scope_end(), EM_OK);
        em_tensor_release(t);
        cr_assert_eq(em_shutdown_checked(), EM_OK, "round %d: %s", round, em_last_error());
        cr_assert_eq(em_shutdown_checked(), EM_OK, "a second call finds nothing: %s",
                     em_last_error());
    }
}

/* Tensors made on threads that then exit, and freed on the main thread (the cross-thread path
 * of the live lists): the count stays right, a second release is still caught, and the
 * shutdown is clean (under ASan: nothing leaked or freed twice). */
#define MADE_PER_THREAD 1500 /* more than the quarantine holds */
static void *make_tensors(void *arg) {
    em_tensor **out = arg;
    for (int i = 0; i < MADE_PER_THREAD; i++)
        out[i] = em_full(1, (int64_t[]){i % 7 + 1}, (double)i, EM_F32, em_cpu());
    return NULL;
}

static char logged_error[2048];
static void keep_error(em_log_level level, const char *msg, void *user) {
    (void)user;
    if (level == EM_LOG_ERROR) snprintf(logged_error, sizeof logged_error, "%s", msg);
}

Test(init, tensors_freed_on_another_thread_are_accounted) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    static em_tensor *made[3][MADE_PER_THREAD];
    for (int round = 0; round < 3; round++) { /* later threads reuse the exited ones' lists */
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, make_tensors, made[round]), 0);
        cr_assert_eq(pthread_join(th, NULL), 0);
        for (int i = 0; i < MADE_PER_THREAD; i++) cr_assert_not_null(made[round][i]);
    }
    em_tensor *last = made[2][MADE_PER_THREAD - 1];
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < MADE_PER_THREAD; i++) em_tensor_release(made[round][i]);
    em_log_set(keep_error, NULL);
    em_clear_error();
    em_tensor_release(last); /* freed above, by this thread, for a thread that has exited */
    em_log_set(NULL, NULL);
    cr_assert_eq(em_last_status(), EM_ERR_STATE, "%s", em_last_error());
    cr_assert(strstr(logged_error, "tensor [2] float32 was already freed"), "%s", logged_error);
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}
