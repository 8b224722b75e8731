/*
 * test_trainer.c — ember-train end to end, and the config/model-builder library under it.
 *
 * The trainer runs as a child process (the built binary, EM_TRAINER) on the bundled digits set
 * with configs written into a temporary directory; the tests read its exit code, its output,
 * and the safetensors files it writes. Small and quick: an MLP, one or two epochs, except the
 * bundled example itself (8 of its 20 epochs).
 */
#define _GNU_SOURCE /* posix_openpt, ptsname (the progress-bar test) */
#include "common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static char tmpdir[256];

static void setup(void) {
    em_test_setup();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ember-train-test-XXXXXX");
    cr_assert(mkdtemp(tmpdir));
}

static void teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
    em_test_teardown();
}

TestSuite(trainer, .init = setup, .fini = teardown, .timeout = 300);

/* Start prog with args (NULL-terminated), its stdout and stderr into the file `log`. */
static pid_t start(const char *prog, const char *log, const char *const *args) {
    const char *argv[64] = {prog};
    int n = 1;
    for (; args[n - 1]; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, prog, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

static char *read_text(const char *name) {
    FILE *f = fopen(name, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, (size_t)len + 1);
    cr_assert_eq(fread(text, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return text;
}

/* Wait for pid; its output (from `log`) into *out (malloc'd); the exit code, or 128 + signal. */
static int finish(pid_t pid, const char *log, char **out) {
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    *out = read_text(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Run prog with args (NULL-terminated); its stdout+stderr into *out (malloc'd). */
static int spawn(const char *prog, char **out, const char *const *args) {
    char log[512];
    snprintf(log, sizeof log, "%s/out.txt", tmpdir);
    return finish(start(prog, log, args), log, out);
}

static int train(char **out, const char *const *args) { return spawn(EM_TRAINER, out, args); }

static const char *path(const char *name) {
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

static void write_file(const char *name, const char *text) {
    FILE *f = fopen(path(name), "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

/* The digits MLP; `extra` goes into the model list after the first ReLU (e.g. a Dropout). */
static void write_mlp(const char *name, const char *extra, const char *validation) {
    char text[4096];
    snprintf(text, sizeof text,
             "model:\n"
             "  - Flatten\n"
             "  - Linear: {in_features: 64, out_features: 32}\n"
             "  - ReLU\n%s"
             "  - Linear: {in_features: 32, out_features: 10}\n"
             "data:\n"
             "  class: mnist\n"
             "  options: {path: %s/data/digits}\n"
             "  validation: %s\n"
             "  test: {split: test}\n"
             "optimizer: {class: SGD, lr: 0.05, momentum: 0.9}\n"
             "loop: {epochs: 1, batch_size: 32}\n",
             extra, EM_TEST_SRCDIR, validation);
    write_file(name, text);
}

/* The trainer with args exits `want`, its output holding `needle`. */
static void expect_run(int want, const char *needle, const char *const *args) {
    char *out;
    int rc = train(&out, args);
    cr_assert_eq(rc, want, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, needle), "'%s' not in:\n%s", needle, out);
    free(out);
}

/* A linear model on the digits without a validation set. */
static void write_noval(const char *name) {
    char text[1024];
    snprintf(text, sizeof text,
             "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
             "data: {class: mnist, options: {path: %s/data/digits}}\n", EM_TEST_SRCDIR);
    write_file(name, text);
}

static double test_accuracy(const char *out) {
    const char *t = strstr(out, "test: loss");
    cr_assert(t, "no test line in:\n%s", out);
    const char *a = strstr(t, "accuracy ");
    cr_assert(a);
    return strtod(a + 9, NULL);
}

/* Every tensor of two safetensors files, allclose(rtol, atol) (0, 0: bit-identical). */
static void assert_weights_close(const char *a, const char *b, double rtol, double atol,
                                 bool expect_equal) {
    em_dict *da, *db;
    cr_assert_eq(em_load(a, NULL, &da, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_load(b, NULL, &db, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_dict_len(da), em_dict_len(db));
    bool all = true;
    double worst = 0;
    for (size_t i = 0; i < em_dict_len(da); i++) {
        em_tensor *x = em_dict_value(da, i), *y = em_dict_get(db, em_dict_key(da, i));
        cr_assert(y, "key %s", em_dict_key(da, i));
        int64_t n = em_tensor_numel(x);
        cr_assert_eq(n, em_tensor_numel(y));
        const float *px = em_tensor_data(x), *py = em_tensor_data(y);
        for (int64_t j = 0; j < n; j++) {
            double d = fabs((double)px[j] - (double)py[j]);
            if (d > worst) worst = d;
            if (rtol == 0 && atol == 0 ? px[j] != py[j] : d > atol + rtol * fabs((double)py[j]))
                all = false;
        }
    }
    em_dict_free(da);
    em_dict_free(db);
    if (expect_equal)
        cr_assert(all, "%s and %s differ (largest difference %g)", a, b, worst);
    else
        cr_assert(!all, "%s and %s should differ", a, b);
}

Test(trainer, bundled_example_reaches_95_percent) {
    char *out;
    int rc = train(&out, (const char *[]){EM_TEST_SRCDIR "/examples/digits.yaml", "--epochs", "8",
                                          "--metrics", path("m.csv"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    double acc = test_accuracy(out);
    cr_assert_geq(acc, 95.0, "test accuracy %.2f%%\n%s", acc, out);
    cr_assert(strstr(out, "best epoch"), "%s", out);
    cr_assert(strstr(out, "peak memory: "), "%s", out);
    cr_assert(!strchr(out, '\r'), "a progress bar without a terminal:\n%s", out);
    free(out);
    /* the metrics file: a header and 8 rows */
    FILE *f = fopen(path("m.csv"), "r");
    cr_assert(f);
    char line[512];
    int rows = 0;
    cr_assert(fgets(line, sizeof line, f));
    const char *head = "epoch,step,lr,train_loss,grad_norm,val_loss,val_accuracy,";
    cr_assert(!strncmp(line, head, strlen(head)), "%s", line);
    while (fgets(line, sizeof line, f)) rows++;
    fclose(f);
    cr_assert_eq(rows, 8);
}

/* The start line says how many CPU threads and why (a job bound to a few cores of a big node
 * must not run one thread per core of the node). */
Test(trainer, start_line_names_the_cpu_threads) {
    write_mlp("t.yaml", "", "0.1");
    char *out;
    setenv("EMBER_NUM_THREADS", "1", 1);
    int rc = train(&out, (const char *[]){path("t.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "device cpu (1 thread: EMBER_NUM_THREADS)\n"), "%s", out);
    free(out);
    unsetenv("EMBER_NUM_THREADS");
    rc = train(&out, (const char *[]){path("t.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "threads: ") || strstr(out, "thread: "), "%s", out);
    cr_assert(strstr(out, "online CPUs in this process's affinity mask"), "%s", out);
    free(out);
}

/* --profile: the run's ops by self time, from the profiling session (forward, backward
 * and optimizer ops alike), and where they ran. */
Test(trainer, profile_reports_the_ops_by_time) {
    write_mlp("t.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("t.yaml"), "--profile", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    const char *dev = strstr(out, "\ncpu ");
    cr_assert(dev, "no cpu row:\n%s", out);
    unsigned long long ops = 0;
    cr_assert_eq(sscanf(dev + 5, "%llu", &ops), 1, "%s", out);
    cr_assert_gt(ops, 100, "%s", out);
    const char *table = strstr(out, "ops by self time");
    cr_assert(table, "%s", out);
    cr_assert(strstr(table, "\n  linear "), "the forward's linear layers:\n%s", out);
    cr_assert(strstr(table, "\n  addmm ") || strstr(table, "\n  bmm "), "%s", out);
    free(out);
}

/* --trace with two loader workers: --profile's report (with its top 10 by total time, all
 * threads) and a Chrome trace with a track per thread: on the training thread the ops, one
 * loader wait per batch and one optimizer step per step, each wait before the forward of its
 * batch; on each worker's track, named after its loader (train, val, test: no two tracks
 * share a name), the batches it filled, the training loader's before the last step. */
Test(trainer, trace_writes_a_chrome_trace_with_a_track_per_thread) {
    write_mlp("t.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("t.yaml"), "--trace", path("trace.json"),
                                          "--max-steps", "5", "--workers", "2", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "ops by self time"), "--trace implies --profile:\n%s", out);
    cr_assert(strstr(out, "recorded while profiling; every figure below counts all of them"),
              "%s", out);
    const char *top = strstr(out, "top 10 ops by total time, all threads");
    cr_assert(top, "%s", out);
    cr_assert(strstr(top, "\n  linear "), "the linear layers among the top 10:\n%s", out);
    free(out);
    json_error_t jerr;
    json_t *root = json_load_file(path("trace.json"), 0, &jerr);
    cr_assert(root, "trace.json: %s (line %d)", jerr.text, jerr.line);
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    cr_assert(json_is_array(evs));
    size_t i;
    json_int_t main_tid = -1, worker_tids[16];
    const char *worker_names[16];
    int n_workers = 0, per_loader[3] = {0, 0, 0};
    const char *loaders[3] = {"train worker ", "val worker ", "test worker "};
    json_array_foreach(evs, i, e) { /* the metadata: the threads' names */
        const char *name = json_string_value(json_object_get(e, "name"));
        if (strcmp(json_string_value(json_object_get(e, "ph")), "M") ||
            strcmp(name, "thread_name"))
            continue;
        const char *tn = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
        json_int_t t = json_integer_value(json_object_get(e, "tid"));
        int k = 0;
        while (k < 3 && strncmp(tn, loaders[k], strlen(loaders[k]))) k++;
        if (!strcmp(tn, "main")) main_tid = t;
        else if (k < 3 && n_workers < 16) {
            const char *n = tn + strlen(loaders[k]);
            cr_assert(!strcmp(n, "0") || !strcmp(n, "1"), "two workers: %s", tn);
            for (int w = 0; w < n_workers; w++)
                cr_assert_str_neq(worker_names[w], tn, "two tracks named %s", tn);
            per_loader[k]++;
            worker_names[n_workers] = tn;
            worker_tids[n_workers++] = t;
        } else cr_assert_fail("an unexpected thread: %s", tn);
    }
    cr_assert_gt(main_tid, 0, "the training thread is named main");
    for (int k = 0; k < 3; k++) /* each loader's fills: at least one of its workers recorded */
        cr_assert_geq(per_loader[k], 1, "a track named %s0 or %s1", loaders[k], loaders[k]);
    int waits = 0, steps = 0, linears = 0, fills = 0, train_fills = 0;
    double last_wait = -1, first_linear_after_wait = -1, last_step = -1, wait_ts[64];
    double fill_ts[256]; /* about 30 fills: 5 trained and some ahead, 6 val and 10 test batches */
    bool fill_train[256];
    json_array_foreach(evs, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *name = json_string_value(json_object_get(e, "name"));
        cr_assert(ph && name);
        if (!strcmp(ph, "M")) continue;
        json_int_t t = json_integer_value(json_object_get(e, "tid"));
        bool on_worker = false, on_train = false;
        for (int k = 0; k < n_workers; k++) {
            on_worker |= worker_tids[k] == t;
            on_train |= worker_tids[k] == t && !strncmp(worker_names[k], "train ", 6);
        }
        cr_assert(t == main_tid || on_worker, "%s on an unnamed thread %lld", name, (long long)t);
        if (!strcmp(name, "loader_fill")) {
            cr_assert(on_worker, "with workers, the workers fill the batches");
            cr_assert(json_is_integer(json_object_get(json_object_get(e, "args"), "batch")));
            if (fills < 256) {
                fill_ts[fills] = json_number_value(json_object_get(e, "ts"));
                fill_train[fills] = on_train;
            }
            fills++;
            train_fills += on_train;
            continue;
        }
        cr_assert_eq(t, main_tid, "%s on the training thread", name);
        double ts = json_number_value(json_object_get(e, "ts"));
        if (!strcmp(name, "loader_wait")) {
            cr_assert_str_eq(json_string_value(json_object_get(e, "cat")), "data");
            cr_assert(json_is_integer(json_object_get(json_object_get(e, "args"), "batch")));
            if (waits < 64) wait_ts[waits++] = ts;
            last_wait = ts;
        } else if (!strcmp(name, "optimizer_step")) {
            steps++;
            last_step = ts;
        } else if (!strcmp(name, "linear")) {
            if (!linears++) first_linear_after_wait = ts - last_wait;
        }
    }
    cr_assert_eq(steps, 5);
    int train_waits = 0; /* the evaluation's loaders wait too, after the last step */
    for (int k = 0; k < waits; k++) train_waits += wait_ts[k] < last_step;
    cr_assert_eq(train_waits, 5, "one loader wait per batch trained");
    cr_assert_geq(train_fills, 5, "every batch trained was filled by a training loader's worker");
    /* the evaluation's loaders are made after the last step: their workers filled nothing
     * before it, the training loader's filled at least the 5 batches trained */
    cr_assert_leq(fills, 256);
    int train_fills_before = 0;
    for (int k = 0; k < fills; k++) {
        if (!fill_train[k])
            cr_assert_gt(fill_ts[k], last_step, "an evaluation loader's fill before the last step");
        else train_fills_before += fill_ts[k] < last_step;
    }
    cr_assert_geq(train_fills_before, 5);
    cr_assert_geq(linears, 10, "two linear layers per forward");
    cr_assert_geq(first_linear_after_wait, 0, "the first forward after its batch's wait");
    json_decref(root);
}

/* Batch 32 x 4 accumulated equals batch 128: 1344 training items = 10 batches of 128 and one
 * of 64 — so the last accumulation group has 2 micro-batches (divided by 2, not 4). */
Test(trainer, accumulation_matches_the_big_batch) {
    write_mlp("mlp.yaml", "", "156");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--batch-size", "128",
                                          "--save-weights", path("big.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--batch-size", "32", "--accum-steps", "4",
                                      "--save-weights", path("acc.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "11 steps"), "%s", out);
    free(out);
    assert_weights_close(path("acc.safetensors"), path("big.safetensors"), 1e-5, 1e-6, true);
    /* the test can fail: without accumulation the weights differ */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--batch-size", "32",
                                      "--save-weights", path("small.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    assert_weights_close(path("small.safetensors"), path("big.safetensors"), 1e-5, 1e-6, false);
}

/* With a Dropout of 0.5 the figures agree only if every evaluation runs in eval mode. */
Test(trainer, eval_only_and_predict_match_training) {
    write_mlp("mlp.yaml", "  - Dropout: {p: 0.5}\n", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--save-weights",
                                          path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    double trained = test_accuracy(out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--eval-only", "--init-weights",
                                      path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_eq(test_accuracy(out), trained, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--predict", path("p.csv"),
                                      "--init-weights", path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    FILE *f = fopen(path("p.csv"), "r");
    cr_assert(f);
    char line[256];
    cr_assert(fgets(line, sizeof line, f));
    cr_assert_str_eq(line, "index,predicted,target\n");
    long idx, p, t, n = 0, right = 0;
    while (fscanf(f, "%ld,%ld,%ld\n", &idx, &p, &t) == 3) {
        cr_assert_eq(idx, n);
        n++;
        right += p == t;
    }
    fclose(f);
    cr_assert_eq(n, 297);
    cr_assert_float_eq(100.0 * (double)right / (double)n, trained, 1e-3);
}

/* Validation, test, --eval-only and --predict run under no_grad, training with gradients: a
 * test plugin's layer fails its forward when the module's mode and the grad mode disagree. */
Test(trainer, evaluation_runs_without_gradients) {
    const char *d = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(d && *d, "EMBER_TEST_PLUGIN_DIR is not set (run through `make check`)");
    char plugin[4096];
    snprintf(plugin, sizeof plugin, "%s/layer_plugin.so", d);
    setenv("EMBER_PLUGIN_PATH", plugin, 1);
    write_mlp("probe.yaml", "  - testplug.GradModeProbe\n", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("probe.yaml"), "--epochs", "1", "--save-weights",
                                          path("probe.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("probe.yaml"), "--eval-only", "--init-weights",
                                      path("probe.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("probe.yaml"), "--predict", path("probe.csv"),
                                      "--init-weights", path("probe.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    unsetenv("EMBER_PLUGIN_PATH");
}

Test(trainer, resume_is_bit_exact) {
    /* Dropout draws from the default generator: its state must be restored too. */
    write_mlp("mlp.yaml", "  - Dropout: {p: 0.2}\n", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--save-weights",
                                          path("full.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    /* stop mid-epoch 1 (43 steps per epoch), then resume */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--max-steps", "20",
                                      "--checkpoint", path("ck.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--resume",
                                      path("ck.safetensors"), "--save-weights",
                                      path("resumed.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "resumed from"), "%s", out);
    free(out);
    assert_weights_close(path("resumed.safetensors"), path("full.safetensors"), 0, 0, true);
}

static void expect_usage_error(const char *yaml, const char *const *needles) {
    write_file("bad.yaml", yaml);
    char *out;
    int rc = train(&out, (const char *[]){path("bad.yaml"), "--epochs", "1", NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    for (; *needles; needles++) cr_assert(strstr(out, *needles), "'%s' not in:\n%s", *needles, out);
    free(out);
}

#define GOOD_DATA "data: {class: mnist, options: {path: " EM_TEST_SRCDIR "/data/digits}}\n"

Test(trainer, config_errors_exit_2_naming_the_problem) {
    /* a typo in a section name: file:line:col and a suggestion */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n" GOOD_DATA
                       "optimiser: {class: SGD, lr: 0.1}\n",
                       (const char *[]){"bad.yaml:3:1", "unknown key 'optimiser'",
                                        "did you mean 'optimizer'", NULL});
    /* a typo in a layer option */
    expect_usage_error("model:\n  - Flatten\n  - Linear: {in_feature: 64, out_features: 10}\n" GOOD_DATA,
                       (const char *[]){"bad.yaml:3:", "in_feature", "in_features", NULL});
    /* an unknown layer */
    expect_usage_error("model:\n  - Flatten\n  - Linaer: {in_features: 64, out_features: 10}\n" GOOD_DATA,
                       (const char *[]){"bad.yaml:3:5", "Linaer", "Linear", NULL});
    /* a missing data directory */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
                       "data: {class: mnist, options: {path: /nonexistent/digits}}\n",
                       (const char *[]){"/nonexistent/digits", NULL});
    /* dataset options are checked by the class, at their line: a typo, a value out of range */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
                       "data:\n  class: mnist\n  options: {path: " EM_TEST_SRCDIR "/data/digits}\n"
                       "  test: {splt: test}\n",
                       (const char *[]){"bad.yaml:5:", "dataset 'mnist': unknown option 'splt'",
                                        "did you mean 'split'", NULL});
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
                       "data: {class: mnist, options: {path: " EM_TEST_SRCDIR "/data/digits, "
                       "classes: 0}}\n",
                       (const char *[]){"bad.yaml:2:", "option 'classes' = 0: out of range",
                                        "[1, 256]", NULL});
    /* a shape that does not fit: 8x8 images into a 63-input layer */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 63, out_features: 10}}]\n" GOOD_DATA,
                       (const char *[]){"does not fit", "63", "64", NULL});
    /* outputs that do not match the classes */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 7}}]\n" GOOD_DATA,
                       (const char *[]){"7 outputs", "10 classes", NULL});
    /* an option typo in the scheduler: one location, the class and the suggestion */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n" GOOD_DATA
                       "scheduler: {class: StepLR, step_siz: 3}\n",
                       (const char *[]){"bad.yaml:3:", "step_siz", "did you mean 'step_size'", NULL});
    /* an unknown scheduler lists the registered ones */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n" GOOD_DATA
                       "scheduler: {class: CosineLR}\n",
                       (const char *[]){"CosineLR", "CosineAnnealingLR", NULL});
    /* YAML syntax */
    expect_usage_error("model: [Flatten\n" GOOD_DATA, (const char *[]){"bad.yaml:", "YAML", NULL});
    /* a parameter group that selects nothing */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n" GOOD_DATA
                       "optimizer: {class: SGD, lr: 0.1, groups: [{params: ['*.bais'], weight_decay: 0}]}\n",
                       (const char *[]){"selects no parameter", "1.bias", NULL});
}

/* Where several sets cannot be opened, the error is the first set's in the order training,
 * validation, test, naming its section, and the later sets' are not printed. */
Test(trainer, dataset_errors_in_the_sets_order) {
    /* both fail: the training set's error */
    expect_usage_error("model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
                       "data:\n  class: mnist\n  options: {path: /nonexistent/digits}\n"
                       "  test: {split: test}\n",
                       (const char *[]){"bad.yaml:3:3: data: mnist: cannot open directory "
                                        "/nonexistent/digits", NULL});
    char *out;
    cr_assert_eq(train(&out, (const char *[]){path("bad.yaml"), "--epochs", "1", NULL}), 2);
    cr_assert(!strstr(out, "data.test"), "the test set's error as well:\n%s", out);
    free(out);
    /* a directory of the training files only: the test set's error, at its line */
    cr_assert_eq(mkdir(path("train-only"), 0755), 0);
    const char *const files[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"};
    for (int i = 0; i < 2; i++) {
        char from[512], to[64];
        snprintf(from, sizeof from, "%s/data/digits/%s", EM_TEST_SRCDIR, files[i]);
        snprintf(to, sizeof to, "train-only/%s", files[i]);
        cr_assert_eq(symlink(from, path(to)), 0);
    }
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
             "data:\n  class: mnist\n  options: {path: %s}\n  validation: 0.1\n"
             "  test: {split: test}\n", path("train-only"));
    expect_usage_error(yaml, (const char *[]){"bad.yaml:6:9: data.test: mnist: no t10k-images* "
                                              "file in", NULL});
    /* a validation error before the test set's: the validation one alone */
    snprintf(yaml, sizeof yaml, "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
             "data:\n  class: mnist\n  options: {path: %s}\n  validation: 7.5\n"
             "  test: {split: test}\n", path("train-only"));
    expect_usage_error(yaml, (const char *[]){"bad.yaml:5:15: data.validation: expected a "
                                              "fraction", NULL});
    cr_assert_eq(train(&out, (const char *[]){path("bad.yaml"), "--epochs", "1", NULL}), 2);
    cr_assert(!strstr(out, "t10k"), "the test set's error as well:\n%s", out);
    free(out);
}

Test(trainer, command_line) {
    char *out;
    int rc = train(&out, (const char *[]){"--help", NULL});
    cr_assert_eq(rc, 0);
    cr_assert(strstr(out, "--accum-steps") && strstr(out, "Exit codes"), "%s", out);
    cr_assert(strstr(out, "--early-stop PATIENCE") && strstr(out, "--warmup-epochs N"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){"--bogus", NULL});
    cr_assert_eq(rc, 2, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){"--epochs", "x", NULL});
    cr_assert_eq(rc, 2, "%s", out);
    free(out);
    /* a device that is asked for and absent is an error, not a fall back */
    rc = train(&out, (const char *[]){"--device", "cuda", "--epochs", "1", NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "cuda"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){"--list-plugins", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "Conv2d") && strstr(out, "SGD") && strstr(out, "mnist"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){"--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "dry run ok: input [32, 1, 8, 8] -> output [32, 10]"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){"--summary", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "Conv2d"), "%s", out);
    free(out);
}

Test(trainer, nan_loss_stops_with_the_hint) {
    write_mlp("mlp.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--lr", "1e30", NULL});
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "--anomaly") && strstr(out, "--clip-grad-norm"), "%s", out);
    cr_assert(!strstr(out, "anomaly: "), "%s", out);
    free(out);
    /* with --anomaly the first op that made a NaN is named, in its layer, with its ops (here
     * a Linear's addmm: weights of ~1e30 overflow, and inf - inf is NaN) */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--lr", "1e30", "--anomaly", NULL});
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "(Linear)") && strstr(out, "anomaly: addmm produced NaN") &&
              strstr(out, "ops leading to it"), "%s", out);
    free(out);
}

/* The seeds' troubleshooting table's config mistakes get a warning at start. */
Test(trainer, softmax_before_cross_entropy_and_mse_on_classes_warn) {
    char text[1024];
    snprintf(text, sizeof text,
             "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}, LogSoftmax]\n"
             "data: {class: mnist, options: {path: %s/data/digits}}\n", EM_TEST_SRCDIR);
    write_file("sm.yaml", text);
    char *out;
    int rc = train(&out, (const char *[]){path("sm.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "warning: the model ends in LogSoftmax and the loss is CrossEntropyLoss"),
              "%s", out);
    free(out);
    /* MSE on class indices: the warning says why, before the shapes refuse it */
    snprintf(text, sizeof text,
             "model: [Flatten, {Linear: {in_features: 64, out_features: 1}}]\n"
             "data: {class: mnist, options: {path: %s/data/digits}}\n"
             "loss: MSELoss\n", EM_TEST_SRCDIR);
    write_file("mse.yaml", text);
    rc = train(&out, (const char *[]){path("mse.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "warning: MSELoss on class-index targets"), "%s", out);
    free(out);
    /* and neither warns on a right config */
    rc = train(&out, (const char *[]){"--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(!strstr(out, "warning"), "%s", out);
    free(out);
}

Test(trainer, model_from_config_in_a_c_program) {
    write_mlp("mlp.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--save-weights", path("w.safetensors"),
                                          NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    em_module *m = em_model_from_config(path("mlp.yaml"), path("w.safetensors"), true);
    cr_assert(m, "%s", em_last_error());
    cr_assert_eq(em_module_parameter_count(m, false), 64 * 32 + 32 + 32 * 10 + 10);
    em_scope_begin();
    em_tensor *x = em_zeros(4, (int64_t[]){2, 1, 8, 8}, EM_F32, em_cpu());
    em_tensor *y = em_module_forward(m, x);
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(em_tensor_shape(y)[1], 10);
    em_scope_end();
    em_module_free(m);
    /* strict loading names what is missing */
    write_file("other.yaml", "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n");
    cr_assert_null(em_model_from_config(path("other.yaml"), path("w.safetensors"), true));
    cr_assert(strstr(em_last_error(), "unexpected"), "%s", em_last_error());
}

Test(trainer, config_nodes_know_where_they_are) {
    const char *text = "a:\n  b: [1, 2]\n  c: {d: x}\nlist:\n  - 3\n";
    em_config *c = em_config_parse(text, strlen(text), "t.yaml");
    cr_assert(c, "%s", em_last_error());
    const em_config_node *root = em_config_root(c);
    const em_config_node *b = em_config_node_get(em_config_node_get(root, "a"), "b");
    cr_assert_eq(em_config_node_kind(b), EM_CONFIG_LIST);
    cr_assert_str_eq(em_config_node_where(b), "t.yaml:2:6");
    cr_assert_str_eq(em_config_node_key_where(b), "t.yaml:2:3");
    cr_assert_str_eq(em_config_node_path(em_config_node_at(b, 1, NULL)), "a.b[1]");
    cr_assert_str_eq(em_config_node_text(em_config_node_at(b, 1, NULL)), "2");
    cr_assert_eq(em_config_check_keys(root, (const char *const[]){"a", "lists", NULL}), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "t.yaml:4:1: unknown key 'list'") &&
              strstr(em_last_error(), "did you mean 'lists'"), "%s", em_last_error());
    em_options *o = em_options_new();
    cr_assert_eq(em_config_to_options(em_config_node_get(root, "a"), (const char *const[]){"c", NULL}, o),
                 EM_OK, "%s", em_last_error());
    cr_assert(em_options_has(o, "b") && !em_options_has(o, "c"));
    em_options_free(o);
    em_config_free(c);
    /* duplicate keys and syntax errors name the place */
    cr_assert_null(em_config_parse("a: 1\na: 2\n", 10, "d.yaml"));
    cr_assert(strstr(em_last_error(), "d.yaml:2:1: duplicate key 'a'"), "%s", em_last_error());
    cr_assert_null(em_config_parse("a: [1\n", 6, "s.yaml"));
    cr_assert(strstr(em_last_error(), "s.yaml:"), "%s", em_last_error());
    cr_assert_null(em_config_load("/nonexistent.yaml"));
    cr_assert_eq(em_last_status(), EM_ERR_NOTFOUND);
}

Test(trainer, the_hand_written_loop_example_runs) {
    char *out;
    int rc = spawn(EM_TRAIN_LOOP, &out, (const char *[]){EM_TEST_SRCDIR "/data/digits",
                                                         path("loop.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "epoch 5:") && strstr(out, "saved"), "%s", out);
    free(out);
    em_dict *d;
    cr_assert_eq(em_load(path("loop.safetensors"), NULL, &d, NULL), EM_OK, "%s", em_last_error());
    cr_assert(em_dict_get(d, "3.weight"));
    em_dict_free(d);
}

/* The CIFAR-10 example config on generated files of the binary format (label byte + 3072). */
Test(trainer, cifar10_config_dry_runs_on_generated_files) {
    const char *files[] = {"data_batch_1.bin", "test_batch.bin"};
    mkdir(path("cifar"), 0755);
    for (int k = 0; k < 2; k++) {
        char name[128];
        snprintf(name, sizeof name, "cifar/%s", files[k]);
        FILE *f = fopen(path(name), "wb");
        cr_assert(f);
        for (int i = 0; i < 40; i++) {
            fputc(i % 10, f);
            for (int j = 0; j < 3072; j++) fputc((i * 7 + j) & 255, f);
        }
        fclose(f);
    }
    char *out;
    int rc = train(&out, (const char *[]){EM_TEST_SRCDIR "/examples/cifar10-cnn.yaml", "--data",
                                          path("cifar"), "--dry-run", "--batch-size", "8", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "input [8, 3, 32, 32] -> output [8, 10]") &&
              strstr(out, "3 groups"), "%s", out);
    free(out);
}

/* Column `col` (0-based) of a --metrics CSV file, one value per epoch row; the row count. */
static int metrics_column(const char *file, int col, double *out, int cap) {
    FILE *f = fopen(file, "r");
    cr_assert(f, "%s", file);
    char line[1024];
    cr_assert(fgets(line, sizeof line, f)); /* the header */
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        cr_assert_lt(n, cap);
        const char *p = line;
        for (int c = 0; c < col; c++) {
            p = strchr(p, ',');
            cr_assert(p, "%s", line);
            p++;
        }
        out[n++] = strtod(p, NULL);
    }
    fclose(f);
    return n;
}

static void assert_lr_sequence(const double *got, const double *want, int n) {
    for (int i = 0; i < n; i++)
        cr_assert(fabs(got[i] - want[i]) <= 1e-8 * fabs(want[i]) + 1e-15,
                  "lr of row %d: %.12g, expected %.12g", i + 1, got[i], want[i]);
}

/* --warmup-epochs W: the lr of epoch k (0-based) is lr * (k + 1) / (W + 1) for k < W, then the
 * scheduler's from its own epoch 0 (here the cosine of CosineAnnealingLR, T_max 3). The metrics
 * file logs the lr each epoch trained with. */
Test(trainer, warmup_then_the_scheduler) {
    write_mlp("mlp.yaml", "", "0.1");
    char text[4096];
    FILE *f = fopen(path("mlp.yaml"), "a");
    cr_assert(f);
    fputs("scheduler: {class: CosineAnnealingLR, T_max: 3}\n", f);
    fclose(f);
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "6", "--warmup-epochs",
                                          "2", "--metrics", path("m.csv"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "warm-up over 2 epochs, then CosineAnnealingLR"), "%s", out);
    free(out);
    const double base = 0.05, W = 2, T = 3;
    double got[16], want[6];
    cr_assert_eq(metrics_column(path("m.csv"), 2, got, 16), 6);
    for (int k = 0; k < 6; k++)
        want[k] = k < W ? base * (k + 1) / (W + 1) : base * (1 + cos(M_PI * (k - W) / T)) / 2;
    assert_lr_sequence(got, want, 6);

    /* per step (interval: step), from the config: 10 steps an epoch (--limit-batches), so the
     * warm-up is 10 steps; each row's lr is the one after its epoch's last step */
    snprintf(text, sizeof text,
             "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
             "data: {class: mnist, options: {path: %s/data/digits}, validation: 0.1}\n"
             "optimizer: {class: SGD, lr: 0.1}\n"
             "scheduler: {class: CosineAnnealingLR, T_max: 50, interval: step, warmup_epochs: 1}\n"
             "loop: {epochs: 3, batch_size: 16, limit_batches: 10}\n", EM_TEST_SRCDIR);
    write_file("step.yaml", text);
    rc = train(&out, (const char *[]){path("step.yaml"), "--metrics", path("s.csv"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    cr_assert_eq(metrics_column(path("s.csv"), 2, got, 16), 3);
    for (int k = 0; k < 3; k++) {
        int t = 10 * (k + 1); /* scheduler steps taken */
        want[k] = t < 10 ? 0.1 * (t + 1) / 11 : 0.1 * (1 + cos(M_PI * (t - 10) / 50)) / 2;
    }
    assert_lr_sequence(got, want, 3);
    /* the step counts' steps: row 1 is the warm-up's end, so an lr below the base would show a
     * warm-up of the wrong length */
    cr_assert_float_eq(got[0], 0.1, 1e-12);

    /* without a scheduler: the warm-up, then the lr stays */
    snprintf(text, sizeof text,
             "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
             "data: {class: mnist, options: {path: %s/data/digits}}\n"
             "optimizer: {class: SGD, lr: 0.1}\n"
             "loop: {epochs: 5, batch_size: 64, limit_batches: 2}\n", EM_TEST_SRCDIR);
    write_file("const.yaml", text);
    rc = train(&out, (const char *[]){path("const.yaml"), "--warmup-epochs", "3", "--metrics",
                                      path("c.csv"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    cr_assert_eq(metrics_column(path("c.csv"), 2, got, 16), 5);
    for (int k = 0; k < 5; k++) want[k] = k < 3 ? 0.1 * (k + 1) / 4 : 0.1;
    assert_lr_sequence(got, want, 5);

    /* a scheduler that has its own warm-up is refused, naming it */
    snprintf(text, sizeof text,
             "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
             "data: {class: mnist, options: {path: %s/data/digits}}\n"
             "scheduler: {class: OneCycleLR, max_lr: 0.1, total_steps: 100}\n", EM_TEST_SRCDIR);
    write_file("one.yaml", text);
    rc = train(&out, (const char *[]){path("one.yaml"), "--warmup-epochs", "1", NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "OneCycleLR") && strstr(out, "pct_start"), "%s", out);
    free(out);
    /* an option typo in the scheduler behind a warm-up still names its place */
    snprintf(text, sizeof text,
             "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
             "data: {class: mnist, options: {path: %s/data/digits}}\n"
             "scheduler: {class: StepLR, step_siz: 3, warmup_epochs: 2}\n", EM_TEST_SRCDIR);
    write_file("typo.yaml", text);
    rc = train(&out, (const char *[]){path("typo.yaml"), NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "typo.yaml:3:") && strstr(out, "did you mean 'step_size'"), "%s", out);
    free(out);
}

/* --early-stop P stops after the first epoch that is P epochs past the best one. The reference
 * is the validation accuracy of a run without it (same seed, so the same trajectory). */
Test(trainer, early_stop) {
    write_mlp("mlp.yaml", "", "0.1");
    write_noval("noval.yaml");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "8", "--metrics",
                                          path("full.csv"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    double acc[16];
    cr_assert_eq(metrics_column(path("full.csv"), 6, acc, 16), 8);
    for (int P = 1; P <= 2; P++) {
        int best = 0, stop = 8;
        for (int e = 1; e < 8; e++) {
            if (acc[e] > acc[best]) best = e;
            if (e - best >= P) {
                stop = e + 1;
                break;
            }
        }
        char p[8], m[32];
        snprintf(p, sizeof p, "%d", P);
        snprintf(m, sizeof m, "p%d.csv", P);
        rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "8", "--early-stop", p,
                                          "--metrics", path(m), NULL});
        cr_assert_eq(rc, 0, "%s", out);
        double got[16];
        int rows = metrics_column(path(m), 6, got, 16);
        cr_assert_eq(rows, stop, "--early-stop %d: %d epochs, expected %d\n%s", P, rows, stop, out);
        cr_assert_eq(strstr(out, "stopped early") != NULL, stop < 8, "%s", out);
        if (P == 1) cr_assert_lt(stop, 8, "the reference run never stalls: the test cannot tell");
        free(out);
    }
    /* with lr 0 nothing changes: the best epoch is the first, the stop is after 1 + P */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "10", "--lr", "0",
                                      "--early-stop", "3", "--metrics", path("z.csv"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "stopped early after epoch 4") &&
              strstr(out, "has not improved for 3 epochs") && strstr(out, "best epoch 1"),
              "%s", out);
    free(out);
    double z[16];
    cr_assert_eq(metrics_column(path("z.csv"), 6, z, 16), 4);
    /* without a validation set there is nothing to watch */
    expect_run(2, "--early-stop needs a validation set", (const char *[]){path("noval.yaml"),
               "--early-stop", "2", NULL});
}

/* --init-weights-nonstrict loads what matches and lists the rest: a file with one key that
 * fits (1.weight), one of the wrong shape (1.bias), one the model lacks (extra.weight), and
 * none for the last layer (3.weight, 3.bias: missing). */
Test(trainer, init_weights_nonstrict_reports_what_it_skipped) {
    write_mlp("mlp.yaml", "", "0.1");
    em_dict *d = em_dict_new();
    em_tensor *w = em_full(2, (int64_t[]){32, 64}, 0.25, EM_F32, em_cpu());
    em_tensor *b = em_full(1, (int64_t[]){7}, 1.0, EM_F32, em_cpu());
    em_tensor *x = em_full(1, (int64_t[]){3}, 2.0, EM_F32, em_cpu());
    cr_assert(w && b && x, "%s", em_last_error());
    em_dict_set(d, "1.weight", w);
    em_dict_set(d, "1.bias", b);
    em_dict_set(d, "extra.weight", x);
    em_tensor_release(w);
    em_tensor_release(b);
    em_tensor_release(x);
    cr_assert_eq(em_save(d, path("part.safetensors"), NULL, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(d);
    char *out;
    /* strict (the default): exit 2 naming the problem */
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "0", "--init-weights",
                                          path("part.safetensors"), NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "--init-weights") && strstr(out, "part.safetensors"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "0", "--init-weights",
                                      path("part.safetensors"), "--init-weights-nonstrict",
                                      "--save-weights", path("out.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "loaded 1 tensors"), "%s", out);
    cr_assert(strstr(out, "2 missing keys (3.weight, 3.bias)"), "%s", out);
    cr_assert(strstr(out, "1 unexpected key (extra.weight)"), "%s", out);
    cr_assert(strstr(out, "1 shape mismatch (1.bias: [32] in the target, [7] in the source)"),
              "%s", out);
    free(out);
    /* what was loaded is in the model, what was skipped is not */
    em_dict *got;
    cr_assert_eq(em_load(path("out.safetensors"), NULL, &got, NULL), EM_OK, "%s", em_last_error());
    const float *pw = em_tensor_data(em_dict_get(got, "1.weight"));
    for (int i = 0; i < 32 * 64; i++) cr_assert_eq(pw[i], 0.25f);
    const float *pb = em_tensor_data(em_dict_get(got, "1.bias"));
    bool all_one = true;
    for (int i = 0; i < 32; i++) all_one &= pb[i] == 1.0f;
    cr_assert(!all_one);
    em_dict_free(got);
}

/* Poll `log` until it contains `needle` (the child still running); false if the child ended. */
static bool wait_for_output(pid_t pid, const char *log, const char *needle) {
    for (int i = 0; i < 60000; i++) {
        char *t = read_text(log);
        bool found = strstr(t, needle) != NULL;
        free(t);
        if (found) return true;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return false;
        usleep(2000);
    }
    return false;
}

/* SIGINT for real: the built binary (the libtool wrapper execs it, so the pid is the trainer's)
 * gets the signal once its first epoch is done; it must finish the step, save a mid-epoch
 * checkpoint, print the command that resumes and exit 130; resuming gives bit-identical final
 * weights to a run that was never interrupted — with Dropout (the generator's state), a
 * warm-up and a StepLR (SequentialLR's state) and momentum (the optimizer's state). */
Test(trainer, sigint_saves_a_checkpoint_that_resumes_exactly) {
    char text[4096];
    snprintf(text, sizeof text,
             "model:\n"
             "  - Flatten\n"
             "  - Linear: {in_features: 64, out_features: 512}\n"
             "  - ReLU\n"
             "  - Dropout: {p: 0.2}\n"
             "  - Linear: {in_features: 512, out_features: 10}\n"
             "data: {class: mnist, options: {path: %s/data/digits}, validation: 0.1}\n"
             "optimizer: {class: SGD, lr: 0.01, momentum: 0.9}\n"
             "scheduler: {class: StepLR, step_size: 1, gamma: 0.5, warmup_epochs: 1}\n"
             "loop: {epochs: 3, batch_size: 1}\n", EM_TEST_SRCDIR);
    write_file("big.yaml", text);
    char *out;
    int rc = train(&out, (const char *[]){path("big.yaml"), "--save-weights",
                                          path("full.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    const char *log = path("sig.txt");
    for (int k = 0; k < 2; k++) {
        int sig = k == 0 ? SIGTERM : SIGINT; /* SIGINT's checkpoint is the one resumed */
        /* A signal that lands before epoch 2's first step (the trainer descheduled on a busy
         * machine) gives an epoch-boundary checkpoint, which is right but not the mid-epoch
         * case this test resumes: SIGINT is then sent again to a new run, up to 5 times. */
        for (int attempt = 0;; attempt++) {
            pid_t pid = start(EM_TRAINER, log, (const char *[]){path("big.yaml"), "--checkpoint",
                                                                path("ck.safetensors"), NULL});
            cr_assert(wait_for_output(pid, log, "epoch 1/3"), "the trainer ended before its "
                      "first epoch line:\n%s", (out = read_text(log)));
            cr_assert_eq(kill(pid, sig), 0);
            rc = finish(pid, log, &out);
            cr_assert_eq(rc, 130, "exit %d:\n%s", rc, out);
            cr_assert(strstr(out, k == 0 ? "interrupted by SIGTERM" : "interrupted by SIGINT"),
                      "%s", out);
            cr_assert(strstr(out, "resume with:") && strstr(out, "--resume"), "%s", out);
            bool boundary = strstr(out, ", batch 0)") != NULL;
            free(out);
            struct stat sb;
            cr_assert_eq(stat(path("ck.safetensors"), &sb), 0);
            if (k == 0 || !boundary || attempt == 4) break;
        }
    }
    /* the command it printed, run as it is */
    char *cmd = strstr((out = read_text(log)), "resume with:\n    ");
    cr_assert(cmd, "%s", out);
    cmd += strlen("resume with:\n    ");
    *strchr(cmd, '\n') = '\0';
    cr_assert(strstr(cmd, EM_TRAINER) == cmd, "%s", cmd); /* the wrapper, not .libs/ */
    char line[8192];
    snprintf(line, sizeof line, "%s --save-weights '%s' > '%s' 2>&1", cmd, path("resumed.safetensors"),
             path("resume.txt"));
    free(out);
    rc = system(line);
    out = read_text(path("resume.txt"));
    cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "%s\n%s", line, out);
    /* a mid-epoch checkpoint: the resumed run starts part-way into an epoch */
    const char *at = strstr(out, "resumed from");
    cr_assert(at && !strstr(at, ", batch 0,"), "%s", out);
    free(out);
    assert_weights_close(path("resumed.safetensors"), path("full.safetensors"), 0, 0, true);
}

/* Run the trainer with `args` (NULL-terminated), stderr on a new terminal (stdout to a file);
 * what the terminal got (malloc'd) and the exit code. */
static int train_on_a_terminal(const char *const *args, char **text_out) {
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    cr_assert(m >= 0 && grantpt(m) == 0 && unlockpt(m) == 0);
    const char *slave = ptsname(m);
    cr_assert(slave);
    const char *argv[16] = {EM_TRAINER};
    for (int i = 0; args[i]; i++) argv[i + 1] = args[i];
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, path("stdout.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, slave, O_RDWR | O_NOCTTY, 0);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, EM_TRAINER, &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    for (;;) { /* until the child has closed the terminal (EIO) */
        if (len + 4096 > cap) text = realloc(text, cap *= 2);
        ssize_t k = read(m, text + len, 4096);
        if (k <= 0) break;
        len += (size_t)k;
    }
    text[len] = '\0';
    close(m);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    *text_out = text;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* On a terminal, stderr gets a progress bar redrawn after each step (batches done of the
 * epoch's, running loss, samples/s, ETA) and no progress lines, whatever --log-every says;
 * --quiet leaves the summary only. Elsewhere, lines (progress_lines_off_a_terminal_and_quiet). */
Test(trainer, progress_bar_on_a_terminal) {
    write_mlp("mlp.yaml", "", "0.1");
    char *text;
    int rc = train_on_a_terminal((const char *[]){path("mlp.yaml"), "--log-every", "5", NULL},
                                 &text);
    cr_assert_eq(rc, 0, "%s", text);
    /* 1500 - 150 validation = 1350 items: 43 batches of 32 */
    cr_assert(strstr(text, "\repoch 1/1 [1/43] loss ") && strstr(text, "\repoch 1/1 [43/43] loss "),
              "%s", text);
    cr_assert(strstr(text, "samples/s  ETA "), "%s", text);
    cr_assert(strstr(text, "epoch 1/1: train loss"), "%s", text); /* then the epoch's line */
    cr_assert(!strstr(text, "] step "), "%s", text);
    free(text);
    rc = train_on_a_terminal((const char *[]){path("mlp.yaml"), "--quiet", NULL}, &text);
    cr_assert_eq(rc, 0, "%s", text);
    cr_assert(!strstr(text, "\repoch") && !strstr(text, "epoch 1/1") && strstr(text, "43 steps in "),
              "%s", text);
    free(text);
}

/* ==== issue 13: saves, signals and start-up checks (items 1, 3, 4, 12) ======================
 * The trainer runs with stdout and stderr on a pipe (or a terminal) the test reads. To hold it
 * still the test fills the pipe (through a second, non-blocking open file description, so the
 * trainer's own stays blocking): its next message then blocks until the test drains the pipe.
 * Every save is preceded by a message (an epoch's line, the interruption's notice), so signals
 * sent while the pipe is full reach a trainer that has not started the save they are about;
 * and the trainer decides about a signal in its handler, before the interrupted write resumes,
 * so the drain that follows cannot overtake it — no sleep decides the order, however loaded
 * the machine. On a terminal the trainer writes after every step (its progress bar), so a
 * terminal the test stops reading holds it within the epoch it is in. */

typedef struct piped {
    pid_t pid;
    int rd, wr;          /* the pipe (wr kept until piped_fill or piped_finish); or the
                          * terminal's master (wr -1) */
    char slave[128];     /* the terminal's other side, "" for a pipe */
    char *text;          /* everything read so far, NUL-terminated */
    size_t len, cap;
} piped;

/* Start argv (argv[0]: a path) with both streams on a pipe of one page, or on a new terminal
 * when `tty`; `fsize` > 0 sets the child's file-size limit (RLIMIT_FSIZE, bytes) first. */
static void piped_start_on(piped *p, const char *const *argv, rlim_t fsize, bool tty) {
    int fds[2] = {-1, -1};
    memset(p, 0, sizeof *p);
    if (tty) {
        p->rd = posix_openpt(O_RDWR | O_NOCTTY);
        cr_assert(p->rd >= 0 && grantpt(p->rd) == 0 && unlockpt(p->rd) == 0);
        cr_assert(ptsname(p->rd));
        snprintf(p->slave, sizeof p->slave, "%s", ptsname(p->rd));
        p->wr = -1;
    } else {
        cr_assert_eq(pipe(fds), 0);
        fcntl(fds[0], F_SETPIPE_SZ, 4096);
        p->rd = fds[0];
        p->wr = fds[1];
    }
    p->cap = 1 << 16;
    p->text = calloc(1, p->cap);
    p->pid = fork();
    cr_assert_neq(p->pid, -1);
    if (p->pid == 0) {
        int out = tty ? open(p->slave, O_RDWR | O_NOCTTY) : fds[1];
        if (out < 0) _exit(97);
        dup2(out, 1);
        dup2(out, 2);
        close(p->rd);
        if (out > 2) close(out);
        if (fsize) {
            struct rlimit rl = {fsize, fsize};
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(99);
        }
        execv(argv[0], (char *const *)argv);
        _exit(98);
    }
}

static void piped_start(piped *p, const char *const *argv, rlim_t fsize) {
    piped_start_on(p, argv, fsize, false);
}

/* Read until `needle` appears; false when the pipe ends first. */
static bool piped_wait_for(piped *p, const char *needle) {
    while (!strstr(p->text, needle)) {
        if (p->len + 4096 + 1 > p->cap) p->text = realloc(p->text, p->cap *= 2);
        ssize_t k = read(p->rd, p->text + p->len, 4096);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p->len += (size_t)k;
        p->text[p->len] = '\0';
    }
    return true;
}

/* Fill the pipe (or the terminal) to the last byte, so that the trainer's next write blocks. */
static void piped_fill(piped *p) {
    char path[160], x[512];
    memset(x, '~', sizeof x);
    if (p->slave[0]) snprintf(path, sizeof path, "%s", p->slave);
    else snprintf(path, sizeof path, "/proc/self/fd/%d", p->wr);
    /* its own open file description: O_NONBLOCK stays ours */
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    while (write(fd, x, sizeof x) > 0) {
    }
    while (write(fd, x, 1) > 0) {
    }
    cr_assert_eq(errno, EAGAIN);
    close(fd);
}

/* Drain the pipe to its end and wait for the child: the exit code (128 + signal when killed);
 * the text (without the filler) into *out. */
static int piped_finish(piped *p, char **out) {
    if (p->wr >= 0) close(p->wr);
    p->wr = -1;
    while (piped_wait_for(p, "\x01never\x01")) {
    }
    close(p->rd);
    int st;
    cr_assert_eq(waitpid(p->pid, &st, 0), p->pid);
    size_t j = 0;
    for (size_t i = 0; i < p->len; i++)
        if (p->text[i] != '~') p->text[j++] = p->text[i];
    p->text[j] = '\0';
    *out = p->text;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The loop state "step" of a checkpoint file. */
static int64_t checkpoint_step(const char *file) {
    em_dict *d;
    em_metadata *m;
    cr_assert_eq(em_load(file, NULL, &d, &m), EM_OK, "%s", em_last_error());
    const char *loop = em_metadata_get(m, "loop"), *s = loop ? strstr(loop, "\"step\":") : NULL;
    cr_assert(s, "%s has no loop step", file);
    int64_t step = strtoll(s + 7, NULL, 10);
    em_dict_free(d);
    em_metadata_free(m);
    return step;
}

#define LONG_RUN "--epochs", "100000" /* stopped by a signal long before its end */

/* timeout(1) signals the trainer and then its process group: two SIGINTs from one sender in a
 * few microseconds, which the trainer took as "stop at once" and lost the checkpoint. The
 * test makes timeout fire at once with SIGALRM (its own timer's signal) once the first epoch
 * is done, while the trainer runs (not held: a held process may get the two as one). */
Test(trainer, timeout_s_int_saves_the_checkpoint) {
    const char *timeout = access("/usr/bin/timeout", X_OK) == 0 ? "/usr/bin/timeout" : "/bin/timeout";
    cr_assert_eq(access(timeout, X_OK), 0, "coreutils' timeout is not installed");
    write_mlp("mlp.yaml", "", "0.1");
    piped p;
    piped_start(&p, (const char *[]){timeout, "--preserve-status", "-s", "INT", "600", EM_TRAINER,
                                     path("mlp.yaml"), LONG_RUN, "--checkpoint",
                                     path("ck.safetensors"), NULL}, 0);
    cr_assert(piped_wait_for(&p, "epoch 1/"), "%s", p.text);
    cr_assert_eq(kill(p.pid, SIGALRM), 0);
    char *out;
    int rc = piped_finish(&p, &out);
    cr_assert_eq(rc, 130, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "interrupted by SIGINT") && strstr(out, "checkpoint saved to"), "%s", out);
    cr_assert(!strstr(out, "stopping at once"), "%s", out);
    cr_assert_gt(checkpoint_step(path("ck.safetensors")), 0);
    free(out);
}

/* Two kills 1 ms apart from one process are one signal: the checkpoint is saved, exit 130. */
Test(trainer, two_sigints_1ms_apart_are_one) {
    write_mlp("mlp.yaml", "", "0.1");
    piped p;
    piped_start(&p, (const char *[]){EM_TRAINER, path("mlp.yaml"), LONG_RUN, "--checkpoint",
                                     path("ck.safetensors"), NULL}, 0);
    cr_assert(piped_wait_for(&p, "epoch 1/"), "%s", p.text);
    piped_fill(&p);
    cr_assert_eq(kill(p.pid, SIGINT), 0);
    nanosleep(&(struct timespec){0, 1000000}, NULL);
    cr_assert_eq(kill(p.pid, SIGINT), 0);
    char *out;
    int rc = piped_finish(&p, &out);
    cr_assert_eq(rc, 130, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "checkpoint saved to") && strstr(out, "resume with:"), "%s", out);
    cr_assert(!strstr(out, "stopping at once"), "%s", out);
    free(out);
}

/* A second SIGINT 1 s after the first stops at once, saying what was and was not saved. The
 * first one arrives once the epoch-1 checkpoint exists and the pipe is full, so the trainer is
 * held before the interruption's own save: the message must name the epoch's checkpoint as the
 * one saved, and that file must hold the step it names. */
Test(trainer, second_sigint_1s_later_stops_at_once_saying_what_was_saved) {
    write_mlp("mlp.yaml", "", "0.1");
    char ck[512]; /* path()'s buffers are reused */
    snprintf(ck, sizeof ck, "%s", path("ck.safetensors"));
    piped p;
    piped_start(&p, (const char *[]){EM_TRAINER, path("mlp.yaml"), LONG_RUN, "--checkpoint", ck,
                                     NULL}, 0);
    cr_assert(piped_wait_for(&p, "epoch 1/"), "%s", p.text);
    while (access(ck, F_OK) != 0) { /* the rename of epoch 1's save */
        int st;
        cr_assert_eq(waitpid(p.pid, &st, WNOHANG), 0, "the trainer ended:\n%s", p.text);
        nanosleep(&(struct timespec){0, 1000000}, NULL); /* a poll, not a wait for time */
    }
    piped_fill(&p);
    cr_assert_eq(kill(p.pid, SIGINT), 0);
    nanosleep(&(struct timespec){1, 0}, NULL);
    cr_assert_eq(kill(p.pid, SIGINT), 0);
    char *out;
    int rc = piped_finish(&p, &out);
    cr_assert_eq(rc, 128 + SIGINT, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "a second SIGINT from pid") && strstr(out, "stopping at once"), "%s", out);
    const char *saved = strstr(out, "  saved: the checkpoint ");
    cr_assert(saved, "%s", out);
    char file[512];
    long long step = -1;
    cr_assert_eq(sscanf(saved, "  saved: the checkpoint %511s (step %lld)", file, &step), 2, "%s", out);
    cr_assert_str_eq(file, ck);
    cr_assert_eq(checkpoint_step(ck), step, "%s", out);
    cr_assert(strstr(out, "the steps after it are not saved"), "%s", out);
    cr_assert(!strstr(out, "checkpoint saved to"), "%s", out);
    free(out);
}

/* An older run left higher-numbered checkpoints: a new run keeps its own (rotation used to
 * delete each right after it was written, exit 0), is warned about the older run's, and
 * resuming by the pattern refuses to guess which run to continue, naming both; resuming the
 * new run by its file continues it, and its rotation removes only its own older file. */
Test(trainer, a_new_run_keeps_its_checkpoints_beside_an_older_runs) {
    write_mlp("mlp.yaml", "", "0.1");
    char pattern[512]; /* path()'s buffers are reused */
    snprintf(pattern, sizeof pattern, "%s", path("ck-{step}.safetensors"));
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--checkpoint",
                                          pattern, NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--max-steps", "20",
                                      "--keep", "1", "--checkpoint", pattern, NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "2 checkpoints matching --checkpoint") &&
              strstr(out, "not this run's (steps 43 to 86"), "%s", out);
    free(out);
    struct stat sb;
    cr_assert_eq(stat(path("ck-20.safetensors"), &sb), 0, "the new run's checkpoint was deleted");
    cr_assert_eq(stat(path("ck-43.safetensors"), &sb), 0);
    cr_assert_eq(stat(path("ck-86.safetensors"), &sb), 0);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--resume", pattern, NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "belong to different runs") && strstr(out, "ck-86.safetensors") &&
              strstr(out, "ck-20.safetensors") && strstr(out, "--resume FILE"), "%s", out);
    cr_assert(!strstr(out, "resumed from"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--max-steps", "25",
                                      "--keep", "1", "--checkpoint", pattern, "--resume",
                                      path("ck-20.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "resumed from") && strstr(out, "step 20"), "%s", out);
    free(out);
    cr_assert_eq(stat(path("ck-25.safetensors"), &sb), 0);
    cr_assert_neq(stat(path("ck-20.safetensors"), &sb), 0, "the run's older file was kept");
    cr_assert_eq(stat(path("ck-43.safetensors"), &sb), 0, "another run's file was deleted");
    cr_assert_eq(stat(path("ck-86.safetensors"), &sb), 0, "another run's file was deleted");
}

/* The newest checkpoint damaged (its data cut short, or its header): --resume PATTERN warns
 * and continues from the next newest of the run. */
Test(trainer, resume_pattern_passes_over_a_damaged_newest_checkpoint) {
    write_mlp("mlp.yaml", "", "0.1");
    char pattern[512]; /* path()'s buffers are reused */
    snprintf(pattern, sizeof pattern, "%s", path("ck-{step}.safetensors"));
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "3", "--checkpoint",
                                          pattern, NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    struct stat sb;
    cr_assert_eq(stat(path("ck-129.safetensors"), &sb), 0);
    cr_assert_eq(truncate(path("ck-129.safetensors"), sb.st_size / 2), 0);
    cr_assert_eq(truncate(path("ck-86.safetensors"), 5), 0);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "3", "--resume", pattern, NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "ck-129.safetensors is damaged") &&
              strstr(out, "trying the next newest"), "%s", out);
    cr_assert(strstr(out, "passing over") && strstr(out, "ck-86.safetensors"), "%s", out);
    cr_assert(strstr(out, "resumed from") && strstr(out, "ck-43.safetensors at epoch 2"), "%s", out);
    free(out);
}

/* A missing or unwritable place for --checkpoint or --save-weights, or a bad {step}, is found
 * before the first step — in --dry-run too — with exit 2, not after an epoch of training. */
Test(trainer, unwritable_outputs_and_bad_patterns_are_found_before_the_first_step) {
    write_mlp("mlp.yaml", "", "0.1");
    write_file("plain", "x");
    struct {
        const char *option, *value, *needle;
    } cases[] = {
        {"--checkpoint", path("missing/ck-{step}.safetensors"), "the directory does not exist"},
        {"--checkpoint", path("plain/ck.safetensors"), "Not a directory"},
        {"--checkpoint", path("ck-{steps}.safetensors"), "'{steps}' is not a placeholder"},
        {"--checkpoint", path("ck-{step}-{step}.safetensors"), "more than one {step}"},
        {"--checkpoint", path("{step}/ck.safetensors"), "in a directory name"},
        {"--checkpoint", path("ck-{step"), "'{' is not a placeholder"},
        {"--checkpoint", tmpdir, "is a directory"},
        {"--save-weights", path("missing/w.safetensors"), "the directory does not exist"},
        {"--save-weights", path("w-{step}.safetensors"), "only --checkpoint takes {step}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        cases[i].value = strdup(cases[i].value); /* path()'s buffers are reused */
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int dry = 0; dry < (i < 3 ? 2 : 1); dry++) { /* --dry-run: the first three */
            char *out;
            int rc = train(&out, (const char *[]){path("mlp.yaml"), cases[i].option,
                                                  cases[i].value, dry ? "--dry-run" : NULL, NULL});
            cr_assert_eq(rc, 2, "%s %s%s: exit %d\n%s", cases[i].option, cases[i].value,
                         dry ? " --dry-run" : "", rc, out);
            cr_assert(strstr(out, cases[i].option) && strstr(out, cases[i].needle), "%s", out);
            cr_assert(!strstr(out, "epoch 1/") && !strstr(out, "dry run ok"), "%s", out);
            free(out);
        }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) free((char *)cases[i].value);
}

/* Temporary files of killed saves are removed at start when their writer is gone; a live
 * writer's file (this test process's pid) and another host's are left alone. */
Test(trainer, temporary_files_of_killed_saves_are_removed_at_start) {
    write_mlp("mlp.yaml", "", "0.1");
    char ck[512]; /* path()'s buffers are reused */
    snprintf(ck, sizeof ck, "%s", path("ck.safetensors"));
    char *out;
    setenv("EMBER_TEST_SAVE_KILL", "written", 1); /* the trainer dies inside its first save */
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--checkpoint", ck, NULL});
    unsetenv("EMBER_TEST_SAVE_KILL");
    cr_assert_eq(rc, 128 + SIGKILL, "exit %d:\n%s", rc, out);
    free(out);
    DIR *dd = opendir(tmpdir);
    struct dirent *de;
    char dead[224] = "";
    while ((de = readdir(dd)) != NULL)
        if (strstr(de->d_name, ".tmp-")) snprintf(dead, sizeof dead, "%.200s", de->d_name);
    closedir(dd);
    const char *pre = ".ck.safetensors.tmp-";
    cr_assert(!strncmp(dead, pre, strlen(pre)), "'%s'", dead);
    char host[160], live[224], other[224];
    snprintf(host, sizeof host, "%.150s", dead + strlen(pre));
    for (int k = 0; k < 2; k++) { /* HOST-PID-N: strip -N, then -PID */
        char *dash = strrchr(host, '-');
        cr_assert(dash && dash > host, "'%s' is not .NAME.tmp-HOST-PID-N", dead);
        *dash = '\0';
    }
    snprintf(live, sizeof live, "%s%.150s-%ld-0", pre, host, (long)getpid());
    snprintf(other, sizeof other, "%sX%.150s-%ld-0", pre, host, (long)getpid() + 1000000);
    write_file(live, "x");
    write_file(other, "x");
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--checkpoint", ck, NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "removed 1 temporary file that killed saves to"), "%s", out);
    free(out);
    cr_assert_neq(access(path(dead), F_OK), 0, "%s survived", dead);
    cr_assert_eq(access(path(live), F_OK), 0, "a live writer's file was removed");
    cr_assert_eq(access(path(other), F_OK), 0, "another host's file was removed");
}

/* Every file ember-train writes: a failure is an error naming the file and the reason, and the
 * exit code says so. The file-size limit used to kill the trainer with SIGXFSZ (exit 153);
 * /dev/full stands for a full disk (--metrics used to exit 0 with an empty file). */
Test(trainer, write_failures_name_the_file_and_set_the_exit_code) {
    write_mlp("mlp.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--max-steps", "1", "--save-weights",
                                          path("w0.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    cr_assert_eq(symlink("/dev/full", path("m.jsonl")), 0); /* JSON lines: no header to fail */
    struct {
        const char *option, *file;
        int rc;
        const char *reason;
    } cases[] = {
        {"--checkpoint", path("ck.safetensors"), 1, "File too large"},
        {"--save-weights", path("w.safetensors"), 1, "File too large"},
        {"--metrics", "/dev/full", 2, "No space left on device"},     /* its header, at start */
        {"--metrics", path("m.jsonl"), 1, "No space left on device"}, /* a row, after epoch 1 */
        {"--predict", "/dev/full", 1, "No space left on device"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        cases[i].file = strdup(cases[i].file); /* path()'s buffers are reused */
    char w0[512];
    snprintf(w0, sizeof w0, "%s", path("w0.safetensors"));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bool fsize = !strcmp(cases[i].reason, "File too large");
        bool predict = !strcmp(cases[i].option, "--predict");
        piped p;
        piped_start(&p, (const char *[]){EM_TRAINER, path("mlp.yaml"), cases[i].option,
                                         cases[i].file, predict ? "--init-weights" : NULL,
                                         w0, NULL},
                    fsize ? 8192 : 0); /* the files are ~20 KB; the pipe is not a file */
        rc = piped_finish(&p, &out);
        cr_assert_eq(rc, cases[i].rc, "%s %s: exit %d\n%s", cases[i].option, cases[i].file, rc,
                     out);
        cr_assert(strstr(out, cases[i].option) && strstr(out, cases[i].file) &&
                  strstr(out, cases[i].reason), "%s", out);
        cr_assert(!strstr(out, "weights saved to") && !strstr(out, "wrote "), "%s", out);
        free(out);
    }
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) free((char *)cases[i].file);
}

/* --tensorboard DIR: the events file the run names holds the step and epoch tags, and the
 * histograms only with --tensorboard-histograms or loop.tensorboard_histograms (TensorBoard's
 * own reader checks the values in tests/test_tensorboard.sh); a DIR that cannot be made is a
 * usage error before the first step, a write that fails (the file-size limit) exit 1, both
 * naming the directory and the reason. */
static bool file_has(const char *file, const char *what) {
    struct stat st;
    cr_assert_eq(stat(file, &st), 0, "%s", file);
    char *text = read_text(file);
    bool found = memmem(text, (size_t)st.st_size, what, strlen(what)) != NULL;
    free(text);
    return found;
}

Test(trainer, tensorboard_events_and_failures) {
    write_mlp("mlp.yaml", "", "0.1");
    /* the same with the key in its loop section */
    char *text = read_text(path("mlp.yaml")), hist[4096];
    char *loop = strstr(text, "loop: {epochs: 1, batch_size: 32}\n");
    cr_assert(loop);
    snprintf(hist, sizeof hist, "%.*sloop: {epochs: 1, batch_size: 32, tensorboard_histograms: "
             "true}\n", (int)(loop - text), text);
    write_file("mlp_hist.yaml", hist);
    free(text);
    const struct { const char *config, *flag; bool hist; } runs[] = {
        {"mlp.yaml", NULL, false}, {"mlp.yaml", "--tensorboard-histograms", true},
        {"mlp_hist.yaml", NULL, true}};
    for (int i = 0; i < 3; i++) {
        char dir[64], *out;
        snprintf(dir, sizeof dir, "tb%d/run", i); /* its parent is made too */
        int rc = train(&out, (const char *[]){path(runs[i].config), "--tensorboard", path(dir),
                                              "--log-every", "10", runs[i].flag, NULL});
        cr_assert_eq(rc, 0, "%s", out);
        const char *w = strstr(out, "--tensorboard: writing ");
        cr_assert(w, "%s", out);
        char file[1024];
        cr_assert_eq(sscanf(w + 23, "%1023s", file), 1);
        cr_assert(strstr(file, path(dir)) == file && strstr(file, "/events.out.tfevents."), "%s", file);
        cr_assert(file_has(file, "brain.Event:2") && file_has(file, "train/loss") &&
                  file_has(file, "train/lr/group0") && file_has(file, "val/accuracy") &&
                  file_has(file, "test/accuracy") && file_has(file, "epoch/train_loss"), "%s", file);
        cr_assert_eq(file_has(file, "weights/1.weight"), runs[i].hist, "run %d", i);
        cr_assert_eq(file_has(file, "gradients/3.bias"), runs[i].hist, "run %d", i);
        free(out);
    }
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--tensorboard-histograms", NULL});
    cr_assert(rc == 2 && strstr(out, "--tensorboard-histograms needs --tensorboard"), "%s", out);
    free(out);
    char under[600];
    snprintf(under, sizeof under, "%s/tb", path("mlp.yaml")); /* under a file */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--tensorboard", under, NULL});
    cr_assert(rc == 2 && strstr(out, "--tensorboard") && strstr(out, under) &&
              strstr(out, "Not a directory"), "exit %d: %s", rc, out);
    cr_assert(!strstr(out, "epoch 1/1"), "%s", out); /* before the first step */
    free(out);
    /* the histograms (some KB) pass the file-size limit at the epoch's end */
    piped p;
    piped_start(&p, (const char *[]){EM_TRAINER, path("mlp.yaml"), "--tensorboard", path("tbf"),
                                     "--tensorboard-histograms", NULL}, 2048);
    rc = piped_finish(&p, &out);
    cr_assert(rc == 1 && strstr(out, "--tensorboard") && strstr(out, path("tbf")) &&
              strstr(out, "File too large"), "exit %d: %s", rc, out);
    free(out);
}

/* SIGINT when the checkpoint cannot be written: the message says the save failed and why (it
 * used to say "no --checkpoint was given"), and the exit code is 1, not 130. The trainer runs
 * on a terminal with batches of 1 (1,350 steps an epoch, a progress line each): the signal
 * comes after its first progress line, with the terminal full, so it is taken before the
 * epoch's own save. */
Test(trainer, sigint_with_a_failing_save_says_so) {
    write_mlp("mlp.yaml", "", "0.1");
    piped p;
    piped_start_on(&p, (const char *[]){EM_TRAINER, path("mlp.yaml"), "--batch-size", "1",
                                        "--checkpoint", path("ck.safetensors"), NULL}, 8192, true);
    cr_assert(piped_wait_for(&p, "\repoch 1/1 ["), "%s", p.text);
    piped_fill(&p);
    cr_assert_eq(kill(p.pid, SIGINT), 0);
    char *out;
    int rc = piped_finish(&p, &out);
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "interrupted by SIGINT") && strstr(out, "saving the checkpoint failed") &&
              strstr(out, path("ck.safetensors")) && strstr(out, "File too large") &&
              strstr(out, "nothing of this run was saved"), "%s", out);
    cr_assert(!strstr(out, "no --checkpoint was given"), "%s", out);
    free(out);
}

/* ---- config parsing: bounded aliases, linear cost (issue 13, items 6 and 7) ---------------- */

/* A host allocator that counts the bytes asked for (the copying realloc of a list grown one
 * item at a time shows up here as quadratic). It allocates as the default one does, so memory
 * may be freed after it is uninstalled. No em_init: parsing needs none. */
static size_t g_alloc_bytes;

static void *counting_alloc(size_t n, size_t align, void *user) {
    (void)user;
    g_alloc_bytes += n;
    void *p = NULL;
    return posix_memalign(&p, align, n ? n : 1) == 0 ? p : NULL;
}

static void counting_free(void *p, void *user) {
    (void)user;
    free(p);
}

/* Parse text; the bytes allocated and the key comparisons it cost. NULL config: the error. */
static em_config *parse_counted(const char *text, size_t *bytes, uint64_t *compares) {
    g_alloc_bytes = 0;
    em_host_allocator_set(&(em_host_allocator){counting_alloc, counting_free, NULL});
    em_config *c = em_config_parse(text, strlen(text), "big.yaml");
    em_host_allocator_set(NULL);
    *bytes = g_alloc_bytes;
    *compares = em_config_get_stats(c).key_compares;
    return c;
}

/* A config with n list items, n map keys, n anchors and n aliases to them. */
static char *big_config(int n) {
    size_t cap = (size_t)n * 64 + 64, used = 0;
    char *t = malloc(cap);
    used += (size_t)snprintf(t + used, cap - used, "list:\n");
    for (int i = 0; i < n; i++) used += (size_t)snprintf(t + used, cap - used, "  - %d\n", i);
    used += (size_t)snprintf(t + used, cap - used, "map:\n");
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(t + used, cap - used, "  k%d: &a%d %d\n", i, i, i);
    used += (size_t)snprintf(t + used, cap - used, "aliases:\n");
    for (int i = 0; i < n; i++) used += (size_t)snprintf(t + used, cap - used, "  - *a%d\n", i);
    cr_assert_lt(used, cap);
    return t;
}

TestSuite(config_parse, .fini = em_test_teardown, .timeout = 60);

/* Parsing 4n items costs about 4 times the bytes and the key comparisons of n items; the
 * quadratic parser (a copying realloc per item, a scan of the earlier keys per key) cost 16
 * times. Counted, not timed. */
Test(config_parse, cost_grows_linearly) {
    const int n = 4000;
    size_t b1, b4;
    uint64_t k1, k4;
    char *t1 = big_config(n), *t4 = big_config(4 * n);
    em_config *c1 = parse_counted(t1, &b1, &k1), *c4 = parse_counted(t4, &b4, &k4);
    cr_assert(c1 && c4, "%s", em_last_error());
    const em_config_node *r = em_config_root(c4);
    cr_assert_eq(em_config_node_len(em_config_node_get(r, "list")), (size_t)(4 * n));
    cr_assert_eq(em_config_node_len(em_config_node_get(r, "map")), (size_t)(4 * n));
    cr_assert_str_eq(em_config_node_text(em_config_node_get(em_config_node_get(r, "map"), "k12345")),
                     "12345");
    cr_assert_str_eq(em_config_node_text(em_config_node_at(em_config_node_get(r, "aliases"), 777,
                                                           NULL)), "777");
    cr_assert_eq(em_config_get_stats(c4).alias_nodes, (size_t)(4 * n));
    double rb = (double)b4 / (double)b1, rk = (double)k4 / (double)(k1 ? k1 : 1);
    cr_assert(k1 >= (uint64_t)n, "%llu comparisons for %d keys: the count is not counting",
              (unsigned long long)k1, n);
    cr_assert(rb < 4.5, "bytes: %zu for n = %d, %zu for 4n (x%.2f; linear is x4)", b1, n, b4, rb);
    /* Hash-probe counts depend on the per-process random hash seed (core/strindex.c): 4n keys
     * have read up to x4.58 of n's in a CI run. The bound is far from a scan per key (x16). */
    cr_assert(rk < 6.0, "key comparisons: %llu for n = %d, %llu for 4n (x%.2f; linear is x4)",
              (unsigned long long)k1, n, (unsigned long long)k4, rk);
    em_config_free(c1);
    em_config_free(c4);
    free(t1);
    free(t4);
}

/* A config map handed to a class as options (em_config_to_options) fills an option bag: n
 * keys cost about a quarter of the name comparisons of 4n (a scan per key cost 16 times). */
Test(config_parse, options_from_a_large_map_cost_linearly) {
    uint64_t k[2];
    const int n = 4000;
    for (int j = 0; j < 2; j++) {
        int m = j ? 4 * n : n;
        size_t cap = (size_t)m * 24 + 16, used = 0;
        char *t = malloc(cap);
        used += (size_t)snprintf(t, cap, "opts:\n");
        for (int i = 0; i < m; i++) used += (size_t)snprintf(t + used, cap - used, "  o%d: %d\n", i, i);
        em_config *c = em_config_parse(t, used, "opts.yaml");
        cr_assert(c, "%s", em_last_error());
        em_options *o = em_options_new();
        cr_assert_eq(em_config_to_options(em_config_node_get(em_config_root(c), "opts"), NULL, o),
                     EM_OK, "%s", em_last_error());
        cr_assert_eq(em_options_count(o), (size_t)m);
        cr_assert(em_options_has(o, "o3999") && !em_options_has(o, "o-1"));
        k[j] = em_options_key_compares(o);
        em_options_free(o);
        em_config_free(c);
        free(t);
    }
    double r = (double)k[1] / (double)(k[0] ? k[0] : 1);
    cr_assert(k[0] >= (uint64_t)n / 2, "%llu comparisons for %d options: not counting",
              (unsigned long long)k[0], n);
    /* Hash-probe counts depend on the per-process random hash seed (core/strindex.c): 4n keys
     * have read up to x4.58 of n's in a CI run. The bound is far from a scan per key (x16). */
    cr_assert(r < 6.0, "option names compared: %llu for %d, %llu for %d (x%.2f; linear is x4)",
              (unsigned long long)k[0], n, (unsigned long long)k[1], 4 * n, r);
}

/* "Billion laughs": nine levels of nine aliases each would be 9^9 nodes. The parse stops at
 * the alias limit, names the file, line and alias, and allocates a bounded amount. */
Test(config_parse, nested_aliases_are_bounded) {
    char text[2048];
    size_t used = (size_t)snprintf(text, sizeof text, "a: &a [lol, lol, lol, lol, lol, lol, lol, "
                                   "lol, lol]\n");
    for (char c = 'b'; c <= 'i'; c++)
        used += (size_t)snprintf(text + used, sizeof text - used,
                                 "%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c]\n", c, c,
                                 c - 1, c - 1, c - 1, c - 1, c - 1, c - 1, c - 1, c - 1, c - 1);
    cr_assert_lt(used, 600); /* the size of the attack */
    size_t bytes;
    uint64_t k;
    cr_assert_null(parse_counted(text, &bytes, &k));
    cr_assert_eq(em_last_status(), EM_ERR_FORMAT);
    cr_assert(strstr(em_last_error(), "big.yaml:6:") && strstr(em_last_error(), "alias *e") &&
              strstr(em_last_error(), "limit of 100000 nodes"), "%s", em_last_error());
    cr_assert_lt(bytes, (size_t)256 << 20, "the refused parse allocated %zu bytes", bytes);

    /* few nodes but large: a 64 KiB text aliased 2000 times (128 MiB) meets the byte limit */
    size_t big = 64 << 10, cap = big + 2000 * 8 + 64;
    char *t = malloc(cap);
    used = (size_t)snprintf(t, cap, "s: &s \"");
    memset(t + used, 'x', big);
    used += big;
    used += (size_t)snprintf(t + used, cap - used, "\"\nl:\n");
    for (int i = 0; i < 2000; i++) used += (size_t)snprintf(t + used, cap - used, "- *s\n");
    cr_assert_null(parse_counted(t, &bytes, &k));
    cr_assert(strstr(em_last_error(), "alias *s") && strstr(em_last_error(), "64 MiB"), "%s",
              em_last_error());
    cr_assert_lt(bytes, (size_t)256 << 20, "the refused parse allocated %zu bytes", bytes);
    free(t);

    /* a few aliases within the limits work, and are copies at their own place */
    const char *ok = "base: &b {lr: 0.1, betas: [0.9, 0.99]}\nfirst: *b\nsecond: *b\n";
    em_config *c = parse_counted(ok, &bytes, &k);
    cr_assert(c, "%s", em_last_error());
    const em_config_node *s = em_config_node_get(em_config_root(c), "second");
    cr_assert_str_eq(em_config_node_path(em_config_node_get(s, "betas")), "second.betas");
    cr_assert_str_eq(em_config_node_text(em_config_node_at(em_config_node_get(s, "betas"), 1, NULL)),
                     "0.99");
    cr_assert_eq(em_config_get_stats(c).alias_nodes, 2 * 5);
    em_config_free(c);
}

/* Aliases that go nowhere, keys and values that cannot be read, more than one document. */
Test(config_parse, bad_aliases_and_values_are_named) {
    static const struct { const char *text, *needle; } cases[] = {
        {"a: 1\nb: *nope\n", "t.yaml:2:4: alias *nope: no anchor &nope before it"},
        {"a: &s [1, *s]\n", "t.yaml:1:11: alias *s refers to the node that contains it"},
        {"a: &m {x: 1}\n*m : 2\n", "t.yaml:2:1: the top level: a key must be plain text; alias *m"},
        {"a: \"x\\0y\"\n", "t.yaml:1:4: a: the value holds a NUL character"},
        {"\"x\\0y\": 1\n", "t.yaml:1:1: the top level: a key holds a NUL character"},
        {"a: 1\n---\nb: 2\n", "t.yaml:2:1: a second YAML document"},
        {"&k a: 1\n*k : 2\n", "t.yaml:2:1: duplicate key 'a' in the top level (first at t.yaml:1:1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cr_assert_null(em_config_parse(cases[i].text, strlen(cases[i].text), "t.yaml"), "case %zu", i);
        cr_assert_eq(em_last_status(), EM_ERR_FORMAT, "case %zu", i);
        cr_assert(strstr(em_last_error(), cases[i].needle), "case %zu: '%s' lacks '%s'", i,
                  em_last_error(), cases[i].needle);
    }
    /* an anchored key's text serves aliases as a value or another map's key */
    const char *ok = "&k name: 1\nother: {*k : 2}\nv: *k\n";
    em_config *c = em_config_parse(ok, strlen(ok), "t.yaml");
    cr_assert(c, "%s", em_last_error());
    const em_config_node *r = em_config_root(c);
    cr_assert_str_eq(em_config_node_text(em_config_node_get(r, "v")), "name");
    cr_assert_str_eq(em_config_node_text(em_config_node_get(em_config_node_get(r, "other"), "name")), "2");
    em_config_free(c);
}

/* ---- numbers from configs and checkpoints get the command line's ranges (issue 13, items 9
 * and 10). Each case is its own run, so that the ASan+UBSan stage sees every field: before,
 * these overflowed (signed overflow), were truncated by casts, or trained nothing and exited
 * 0. --max-steps 1 keeps a run that wrongly starts short. */

#define SMALL_MODEL "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n" GOOD_DATA

Test(trainer, config_numbers_are_range_checked_like_the_command_line) {
    static const struct { const char *yaml, *needle; } cases[] = {
        {"loop: {epochs: 9223372036854775807}\n",
         "bad.yaml:4:16: loop.epochs: '9223372036854775807' is not an integer in [0, 2147483647] "
         "(as for --epochs)"},
        {"loop: {epochs: 1, accum_steps: 9223372036854775807}\n",
         "loop.accum_steps: '9223372036854775807' is not an integer in [1, 2147483647]"},
        {"loop: {epochs: 1, batch_size: 2147483648}\n",
         "loop.batch_size: '2147483648' is not an integer in [1, 2147483647]"},
        {"loop: {epochs: 1, overfit_batches: 9223372036854775807}\n",
         "loop.overfit_batches: '9223372036854775807' is not an integer in [0, 2147483647]"},
        {"loop: {epochs: 1, workers: 4294967297}\n",
         "loop.workers: '4294967297' is not an integer in [0, 256] (as for --workers)"},
        {"loop: {epochs: 1, clip_grad_norm: 1e400}\n",
         "loop.clip_grad_norm: '1e400' is not a finite number >= 0"},
        {"scheduler: {warmup_epochs: 9223372036854775807}\n",
         "scheduler.warmup_epochs: '9223372036854775807' is not an integer in [0, 2147483647] "
         "(as for --warmup-epochs)"},
        {"data: {class: mnist, options: {path: " EM_TEST_SRCDIR "/data/digits}, transforms: "
         "{crop_padding: 4294967297}}\n",
         "data.transforms.crop_padding: '4294967297' is not an integer in [0, 2147483647]"},
        {"optimizer: {class: SGD, lr: inf}\n",
         "bad.yaml:4:12: optimizer: SGD (param group 0): invalid learning rate inf (must be a "
         "finite number >= 0)"},
        {"optimizer: {class: SGD, lr: 1e400}\n",
         "bad.yaml:4:29: SGD (param group 0): option 'lr' = '1e400': beyond the range of a double"},
        {"optimizer: {class: SGD, lr: 0.1, momentum: 1e400}\n", "option 'momentum' = '1e400'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        /* the case is on line 4; a case with its own data section replaces the good one */
        char text[1024];
        snprintf(text, sizeof text, "model: [Flatten, {Linear: {in_features: 64, out_features: "
                 "10}}]\n%s#\n%s", strncmp(cases[i].yaml, "data:", 5) ? GOOD_DATA : "#\n",
                 cases[i].yaml);
        write_file("bad.yaml", text);
        char *out;
        int rc = train(&out, (const char *[]){path("bad.yaml"), "--max-steps", "1", NULL});
        cr_assert_eq(rc, 2, "case %zu: exit %d:\n%s", i, rc, out);
        cr_assert(strstr(out, cases[i].needle), "case %zu: '%s' not in:\n%s", i, cases[i].needle,
                  out);
        free(out);
    }
    /* the command line says the range too */
    char *out;
    int rc = train(&out, (const char *[]){"--epochs", "-1", NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "--epochs: '-1' is not an integer in [0, 2147483647]"), "%s", out);
    free(out);
}

/* The checkpoint at path with metadata `key` set to value (NULL: left as it is) and, when
 * tensor is not NULL, that tensor replaced by a 0-dim zero, written to "bad.safetensors". */
static void bad_checkpoint(const char *src, const char *key, const char *value, const char *tensor) {
    em_dict *d;
    em_metadata *m;
    cr_assert_eq(em_load(src, NULL, &d, &m), EM_OK, "%s", em_last_error());
    if (value) cr_assert_eq(em_metadata_set(m, key, value), EM_OK, "%s", em_last_error());
    if (tensor) {
        cr_assert(em_dict_has(d, tensor), "%s", tensor);
        em_tensor *z = em_zeros(0, NULL, EM_F32, em_cpu());
        em_dict_set(d, tensor, z);
        em_tensor_release(z);
    }
    cr_assert_eq(em_save(d, path("bad.safetensors"), m, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(d);
    em_metadata_free(m);
}

/* A JSON metadata entry of src with "field": set to value. */
static char *json_with(const char *src, const char *key, const char *field, const char *value) {
    em_dict *d;
    em_metadata *m;
    cr_assert_eq(em_load(src, NULL, &d, &m), EM_OK, "%s", em_last_error());
    const char *json = em_metadata_get(m, key);
    cr_assert(json, "%s", key);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", field);
    const char *at = strstr(json, pat);
    cr_assert(at, "%s in %s", pat, json);
    const char *rest = at + strlen(pat);
    while (*rest == '-' || (*rest >= '0' && *rest <= '9')) rest++;
    size_t cap = strlen(json) + strlen(value) + 1;
    char *s = malloc(cap);
    snprintf(s, cap, "%.*s%s%s", (int)(at + strlen(pat) - json), json, value, rest);
    em_dict_free(d);
    em_metadata_free(m);
    return s;
}

/* A checkpoint's loader position, loop counts, scheduler counts and optimizer state are
 * checked at --resume, the message naming the file and the entry, before any step. */
Test(trainer, resume_checks_every_field_of_the_checkpoint) {
    write_file("ck.yaml", SMALL_MODEL "optimizer: {class: SGD, lr: 0.1, momentum: 0.9}\n"
               "scheduler: {class: StepLR, step_size: 1}\nloop: {epochs: 1, batch_size: 32}\n");
    char *out, ck[512];
    snprintf(ck, sizeof ck, "%s", path("ck.safetensors"));
    int rc = train(&out, (const char *[]){path("ck.yaml"), "--max-steps", "3", "--checkpoint", ck,
                                          NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    char *step = json_with(ck, "loop", "step", "9223372036854775807");
    char *epoch = json_with(ck, "loop", "epoch", "9223372036854775807");
    char *last = json_with(ck, "sched.state", "last_epoch", "9223372036854775807");
    char *count = json_with(ck, "sched.state", "step_count", "9223372036854775807");
    const struct { const char *key, *value, *tensor, *needle; } cases[] = {
        {"train.batch", "-5", NULL,
         "bad.safetensors': metadata 'train.batch' is '-5'; expected an integer in [0, "
         "9007199254740992]"},
        {"train.batch", "1000", NULL,
         "bad.safetensors': metadata 'train.batch' is 1000, past the end of an epoch of this run "
         "(47 batches)"},
        {"train.batch", "100000000000000000000", NULL,
         "metadata 'train.batch' is '100000000000000000000'; expected an integer"},
        {"train.batch", "", NULL, "metadata 'train.batch' is ''; expected an integer"},
        {"train.best_epoch", "-9223372036854775808", NULL,
         "metadata 'train.best_epoch' is '-9223372036854775808'; expected an integer in [-1, 0]"},
        {"train.epoch_loss_sum", "nan", NULL,
         "bad.safetensors': metadata 'train.epoch_loss_sum' is 'nan'; expected a finite number "
         ">= 0"},
        {"train.epoch_samples", "-1", NULL,
         "metadata 'train.epoch_samples' is '-1'; expected an integer in [0, "},
        {"loop", step, NULL,
         "bad.safetensors': metadata entry 'loop': \"step\" is 9223372036854775807; expected an "
         "integer in [0, 9007199254740992]"},
        {"loop", epoch, NULL, "'loop': \"epoch\" is 9223372036854775807"},
        {"sched.state", last, NULL,
         "bad.safetensors': scheduler ('sched.state'): StepLR.load_state_dict: \"last_epoch\" "
         "9223372036854775807"},
        {"sched.state", count, NULL, "\"step_count\" 9223372036854775807 is out of range"},
        {NULL, NULL, "optim.state.0.momentum_buffer",
         "bad.safetensors': optimizer ('optim.param_groups'): SGD.load_state_dict: "
         "'state.0.momentum_buffer' has shape [] but parameter 0 ('1.weight') has shape [10, 64]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        bad_checkpoint(ck, cases[i].key, cases[i].value, cases[i].tensor);
        rc = train(&out, (const char *[]){path("ck.yaml"), "--resume", path("bad.safetensors"),
                                          "--max-steps", "4", NULL});
        cr_assert_eq(rc, 2, "case %zu: exit %d:\n%s", i, rc, out);
        cr_assert(strstr(out, cases[i].needle), "case %zu: '%s' not in:\n%s", i, cases[i].needle,
                  out);
        cr_assert(!strstr(out, "steps in"), "case %zu trained:\n%s", i, out);
        free(out);
    }
    free(step);
    free(epoch);
    free(last);
    free(count);
    /* the good checkpoint resumes */
    rc = train(&out, (const char *[]){path("ck.yaml"), "--resume", ck, "--max-steps", "4", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "resumed from") && strstr(out, "batch 3, step 3"), "%s", out);
    free(out);
}

/* ---- plugins named on the command line or in the config (issue 13, item 14) ---------------- */

/* A class from a plugin that is not loaded: the message says where plugins come from, and
 * --plugin or the config's plugins: list loads it for the run; a plugin that cannot be loaded
 * is an error naming the file (and, from the config, its line). */
Test(trainer, plugins_from_the_command_line_and_the_config) {
    const char *d = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(d && *d, "EMBER_TEST_PLUGIN_DIR is not set (run through `make check`)");
    char plugin[4096], text[8192];
    snprintf(plugin, sizeof plugin, "%s/layer_plugin.so", d);
    unsetenv("EMBER_PLUGIN_PATH");
    write_mlp("affine.yaml", "  - testplug.Affine: {features: 32}\n", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("affine.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "no module class named 'testplug.Affine'") &&
              strstr(out, "EMBER_PLUGIN_PATH") && strstr(out, "--plugin PATH"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("affine.yaml"), "--dry-run", "--plugin", plugin, NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "dry run ok"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("affine.yaml"), "--dry-run", "--plugin",
                                      path("missing.so"), NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "--plugin ") && strstr(out, "missing.so") &&
              strstr(out, "cannot open shared object file"), "%s", out);
    free(out);
    /* the config names it: an absolute path, then one relative to the config's directory */
    FILE *f = fopen(path("affine.yaml"), "r");
    cr_assert(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char cfg[sizeof plugin + sizeof text + 64];
    snprintf(cfg, sizeof cfg, "plugins: [%s]\n%s", plugin, text);
    write_file("with_plugin.yaml", cfg);
    rc = train(&out, (const char *[]){path("with_plugin.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    free(out);
    snprintf(cfg, sizeof cfg, "plugins:\n  - not_here.so\n%s", text);
    write_file("bad_plugin.yaml", cfg);
    rc = train(&out, (const char *[]){path("bad_plugin.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "bad_plugin.yaml:2:") && strstr(out, "plugins[0]") &&
              strstr(out, "not_here.so"), "%s", out);
    free(out);
}

/* data.transforms as a list of transform classes (issue 19): the built-ins by name, and a
 * class of a test plugin (tests/plugins/transform_plugin.c, named in the config's plugins:
 * list) that changes the items from (1, 8, 8) to (1, 4, 4), so only a model of 16 inputs fits;
 * errors in the list name the config line. */
static void write_tf(const char *name, const char *plugin, int in_features, const char *tf) {
    char text[8192];
    snprintf(text, sizeof text,
             "plugins: [%s]\n"
             "model:\n"
             "  - Flatten\n"
             "  - Linear: {in_features: %d, out_features: 10}\n"
             "data:\n"
             "  class: mnist\n"
             "  options: {path: %s/data/digits}\n"
             "  validation: 0.1\n"
             "  transforms:\n%s"
             "optimizer: {class: SGD, lr: 0.05, momentum: 0.9}\n"
             "loop: {epochs: 1, batch_size: 32}\n",
             plugin, in_features, EM_TEST_SRCDIR, tf);
    write_file(name, text);
}

Test(trainer, transform_classes_from_a_plugin_in_the_config) {
    const char *d = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(d && *d, "EMBER_TEST_PLUGIN_DIR is not set (run through `make check`)");
    char plugin[4096];
    snprintf(plugin, sizeof plugin, "%s/transform_plugin.so", d);
    const char *list = "    - to_float\n"
                       "    - {class: test_window, options: {size: 4, gain: 2}}\n"
                       "    - normalize: {mean: [0.5], std: [0.25]}\n"
                       "    - {class: hflip, train_only: true}\n";
    write_tf("window.yaml", plugin, 16, list);
    char *out;
    int rc = train(&out, (const char *[]){path("window.yaml"), NULL});
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "test: loss") || strstr(out, "val"), "%s", out);
    free(out);
    /* the items really are (1, 4, 4): a model of 64 inputs does not fit */
    write_tf("window64.yaml", plugin, 64, list);
    rc = train(&out, (const char *[]){path("window64.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "does not fit") && strstr(out, "[2, 16]"), "%s", out);
    free(out);
    /* an option the class does not declare, and a class nobody registered: the line */
    write_tf("badopt.yaml", plugin, 16, "    - {class: test_window, options: {sise: 4}}\n");
    rc = train(&out, (const char *[]){path("badopt.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "badopt.yaml:10:") && strstr(out, "test_window") &&
              strstr(out, "'sise'"), "%s", out);
    free(out);
    write_tf("badname.yaml", plugin, 16, "    - to_float\n    - test_windw: {size: 4}\n");
    rc = train(&out, (const char *[]){path("badname.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "badname.yaml:11:") && strstr(out, "no transform class named "
              "'test_windw' (did you mean 'test_window'?)"), "%s", out);
    free(out);
    /* a field the transform cannot take: the loader's message names transform, field, shape */
    write_tf("toobig.yaml", plugin, 16, "    - to_float\n    - test_window: {size: 9}\n");
    rc = train(&out, (const char *[]){path("toobig.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "toobig.yaml:10:") && strstr(out, "transform 'test_window' on field "
              "'input'") && strstr(out, "size 9; the field's items are (1, 8, 8)"), "%s", out);
    free(out);
}

/* A model that does not fit its data names the config line of the layer that refused the
 * input, not only its index in the Sequential (issue 13, item 14). */
Test(trainer, a_model_that_does_not_fit_names_the_layer_line) {
    write_file("nofit.yaml",
               "model:\n"
               "  - Flatten\n"
               "  - Linear: {in_features: 60, out_features: 10}\n"
               "data:\n"
               "  class: mnist\n"
               "  options: {path: " EM_TEST_SRCDIR "/data/digits}\n"
               "loop: {epochs: 1, batch_size: 32}\n");
    char *out;
    int rc = train(&out, (const char *[]){path("nofit.yaml"), "--dry-run", NULL});
    cr_assert_eq(rc, 2, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "the model does not fit the data") &&
              strstr(out, "layer 1 (Linear): ") && strstr(out, "nofit.yaml:3:5: Linear: input of "
              "shape [2, 64] and weight of shape [10, 60]"), "%s", out);
    free(out);
}

/* A layer whose op declares no derivative: training stops at backward with the core's error,
 * said once ("backward: op ... declares no derivative"), not "backward: backward: ..."
 * (issue 13, item 14). */
Test(trainer, a_backward_error_is_not_prefixed_twice) {
    const char *d = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(d && *d, "EMBER_TEST_PLUGIN_DIR is not set (run through `make check`)");
    char plugin[4096];
    snprintf(plugin, sizeof plugin, "%s/layer_plugin.so", d);
    write_mlp("noderiv.yaml", "  - testplug.NoDerivative\n", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("noderiv.yaml"), "--epochs", "1", "--plugin",
                                          plugin, NULL});
    cr_assert_eq(rc, 1, "exit %d:\n%s", rc, out);
    cr_assert(strstr(out, "ember-train: backward: op 'testplug.copy' declares no derivative"),
              "%s", out);
    cr_assert(!strstr(out, "backward: backward:"), "%s", out);
    free(out);
}

/* data.inputs / data.target name the fields of a dataset whose items are not input/target
 * (issue 19): a test plugin's variable-length sequences feed a model whose first layer,
 * testvl.MaskedMean, refuses to run without the padding mask: training, validation and the
 * model check before them all hand it the mask of the padded field. An unknown field is a
 * config error at its line that lists the dataset's fields. */
Test(trainer, named_fields_and_padding_masks_from_the_config) {
    const char *d = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(d && *d, "EMBER_TEST_PLUGIN_DIR is not set (run through `make check`)");
    char plugin[4096];
    snprintf(plugin, sizeof plugin, "%s/varlen_plugin.so", d);
    setenv("EMBER_PLUGIN_PATH", plugin, 1);
    static const char cfg[] = "model:\n"
                              "  - testvl.MaskedMean\n"
                              "  - Linear: {in_features: 3, out_features: 3}\n"
                              "data:\n"
                              "  class: test-varlen\n"
                              "  options: {length: 48}\n"
                              "  inputs: %s\n"
                              "  target: label\n"
                              "  validation: 0.25\n"
                              "optimizer: {class: SGD, lr: 0.05}\n"
                              "loop: {epochs: 2, batch_size: 8, workers: 1}\n";
    char text[1024];
    snprintf(text, sizeof text, cfg, "[seq]");
    write_file("varlen.yaml", text);
    char *out;
    int rc = train(&out, (const char *[]){path("varlen.yaml"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "val"), "%s", out);
    free(out);
    snprintf(text, sizeof text, cfg, "seqs");
    write_file("varlen_bad.yaml", text);
    rc = train(&out, (const char *[]){path("varlen_bad.yaml"), NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "varlen_bad.yaml:7") && strstr(out, "no field 'seqs'") &&
              strstr(out, "seq, marks, label"), "%s", out);
    free(out);
    unsetenv("EMBER_PLUGIN_PATH");
}

/* ==== issue 23: progress off a terminal, metrics rows, the trainer's remaining gaps =========
 * (items 1, 2 and 6). CSV files are read by column name, so a test says which figure it
 * checks. */

typedef struct csv {
    char *text;
    char *lines[512]; /* lines[0]: the header */
    int n;            /* lines, the header included */
} csv;

static void csv_read(csv *c, const char *file) {
    c->text = read_text(file);
    c->n = 0;
    for (char *s = c->text, *nl; *s && c->n < 512; s = nl + 1) {
        nl = strchr(s, '\n');
        cr_assert(nl, "%s: the last line has no newline", file);
        *nl = '\0';
        c->lines[c->n++] = s;
    }
}

/* The column named `name` (its index in the header). */
static int csv_col(const csv *c, const char *name) {
    const char *h = c->lines[0];
    size_t len = strlen(name);
    for (int col = 0;; col++) {
        if (!strncmp(h, name, len) && (h[len] == ',' || !h[len])) return col;
        h = strchr(h, ',');
        cr_assert(h, "no column '%s' in '%s'", name, c->lines[0]);
        h++;
    }
}

/* Field `col` of row `row` (1: the first after the header) as text, into buf. */
static const char *csv_text(const csv *c, int row, int col, char *buf, size_t cap) {
    cr_assert_lt(row, c->n);
    const char *p = c->lines[row];
    for (int k = 0; k < col; k++) {
        p = strchr(p, ',');
        cr_assert(p, "row %d has no column %d: %s", row, col, c->lines[row]);
        p++;
    }
    snprintf(buf, cap, "%.*s", (int)strcspn(p, ","), p);
    return buf;
}

static double csv_num(const csv *c, int row, const char *name) {
    char buf[64];
    return strtod(csv_text(c, row, csv_col(c, name), buf, sizeof buf), NULL);
}

/* Lines of text that contain needle. */
static int count_lines(const char *text, const char *needle) {
    int n = 0;
    for (const char *s = text; (s = strstr(s, needle)); s++) n++;
    return n;
}

/* Off a terminal: a line every --log-every N steps, or every T seconds (never more often:
 * the line count is bounded by the run's time over T, where one line a step would be
 * thousands), none in a short run by default (about every 10 s), and --quiet leaves the
 * errors and the summary only (no warnings). */
Test(trainer, progress_lines_off_a_terminal_and_quiet) {
    write_mlp("mlp.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--log-every", "5", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(!strchr(out, '\r'), "%s", out);
    cr_assert_eq(count_lines(out, "] step "), 8, "43 steps, every 5th:\n%s", out);
    for (int s = 5; s <= 40; s += 5) {
        char want[64];
        snprintf(want, sizeof want, "epoch 1/1 [%d/43] step %d  loss ", s, s);
        cr_assert(strstr(out, want), "no '%s' in:\n%s", want, out);
    }
    cr_assert(strstr(out, "samples/s  ETA ") && strstr(out, "elapsed "), "%s", out);
    free(out);
    /* by time: batches of 1 (1,350 steps) */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--log-every", "0.05s", "--batch-size",
                                      "1", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    const char *sum = strstr(out, " steps in ");
    cr_assert(sum, "%s", out);
    double secs = strtod(sum + strlen(" steps in "), NULL);
    int lines = count_lines(out, "] step ");
    cr_assert_leq(lines, secs / 0.05 + 3, "%d lines in %.1f s:\n%s", lines, secs, out);
    if (secs >= 0.2) cr_assert_geq(lines, 1, "%.1f s, no line:\n%s", secs, out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), NULL}); /* ~0.1 s: no line by default */
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_eq(count_lines(out, "] step "), 0, "%s", out);
    free(out);
    /* --quiet */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--quiet", "--log-every", "1", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(!strstr(out, "epoch 1/1") && !strstr(out, "config ") && !strchr(out, '\r'), "%s",
              out);
    cr_assert(strstr(out, "test: loss") && strstr(out, "43 steps in ") &&
              strstr(out, "best epoch 1"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--quiet", "--resume", path("none"), NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "--resume") && strstr(out, "none"), "%s", out);
    free(out);
    /* --quiet drops warnings too: the bundled example's cosine schedule (T_max 20) is longer
     * than one epoch, a warning without --quiet */
    const char *ex = EM_TEST_SRCDIR "/examples/digits.yaml";
    rc = train(&out, (const char *[]){ex, "--epochs", "1", "--limit-batches", "2", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "ember-train: warning: the run's 1 epoch"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){ex, "--epochs", "1", "--limit-batches", "2", "--quiet",
                                      NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(!strstr(out, "warning") && !strstr(out, "warn:"), "%s", out);
    cr_assert(strstr(out, "2 steps in ") && strstr(out, "test: loss"), "%s", out);
    free(out);
    expect_run(2, "--log-every: '0' is not a number of steps", (const char *[]){path("mlp.yaml"),
               "--log-every", "0", NULL});
}

/* --metrics gains train and test columns after its original ten; --metrics-steps has a row
 * every --log-every steps. References: the epoch's train_loss and grad_norm are the sample-
 * weighted mean of its steps' losses and the mean of their norms (rows every step); the test
 * columns of the last row are the final test line. Across a resume mid-epoch, every figure
 * of every row is the uninterrupted run's (the checkpoint carries the epoch's sums). */
Test(trainer, metrics_rows_across_a_resume) {
    write_mlp("mlp.yaml", "  - Dropout: {p: 0.2}\n", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--metrics",
                                          path("a.csv"), "--metrics-steps", path("as.csv"),
                                          "--log-every", "1", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    double final_test = test_accuracy(out);
    free(out);
    csv a, as;
    csv_read(&a, path("a.csv"));
    csv_read(&as, path("as.csv"));
    cr_assert_str_eq(a.lines[0], "epoch,step,lr,train_loss,grad_norm,val_loss,val_accuracy,"
                     "samples_per_s,data_wait_pct,peak_memory,train_accuracy,test_loss,"
                     "test_accuracy");
    cr_assert_str_eq(as.lines[0], "step,epoch,loss,lr,grad_norm,samples_per_s,data_wait_s");
    cr_assert_eq(a.n, 3);
    cr_assert_eq(as.n, 1 + 86);
    for (int e = 1; e <= 2; e++) {
        double ls = 0, gs = 0, n = 0;
        for (int s = 1; s <= 43; s++) { /* 1350 samples: 42 batches of 32, then 6 */
            int row = (e - 1) * 43 + s;
            cr_assert_eq(csv_num(&as, row, "step"), row);
            cr_assert_eq(csv_num(&as, row, "epoch"), e);
            double bs = s < 43 ? 32 : 6;
            ls += csv_num(&as, row, "loss") * bs;
            gs += csv_num(&as, row, "grad_norm");
            n += bs;
            cr_assert_float_eq(csv_num(&as, row, "lr"), 0.05, 1e-12);
            cr_assert_geq(csv_num(&as, row, "data_wait_s"), 0);
            cr_assert_gt(csv_num(&as, row, "samples_per_s"), 0);
        }
        cr_assert_float_eq(csv_num(&a, e, "train_loss"), ls / n, 1e-7 * ls / n);
        cr_assert_float_eq(csv_num(&a, e, "grad_norm"), gs / 43, 1e-7 * gs / 43);
        double acc = csv_num(&a, e, "train_accuracy");
        cr_assert(acc > 0.1 && acc <= 1, "%g", acc);
        cr_assert_gt(csv_num(&a, e, "test_loss"), 0);
    }
    cr_assert_float_eq(100 * csv_num(&a, 2, "test_accuracy"), final_test, 1e-4);
    cr_assert_gt(csv_num(&a, 2, "train_accuracy"), csv_num(&a, 1, "train_accuracy"));

    /* stopped at step 20 of epoch 1, then resumed: the same rows, appended to the same files */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--max-steps", "20",
                                      "--checkpoint", path("ck.safetensors"), "--metrics",
                                      path("b.csv"), "--metrics-steps", path("bs.csv"),
                                      "--log-every", "1", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    expect_run(0, "batch 20, step 20", (const char *[]){path("mlp.yaml"), "--epochs", "2",
               "--resume", path("ck.safetensors"), "--metrics", path("b.csv"), "--metrics-steps",
               path("bs.csv"), "--log-every", "1", NULL});
    csv b, bs;
    csv_read(&b, path("b.csv"));
    csv_read(&bs, path("bs.csv"));
    cr_assert_str_eq(b.lines[0], a.lines[0]);
    cr_assert_eq(b.n, 4, "the partial epoch's row, then the two epochs'");
    cr_assert_eq(csv_num(&b, 1, "step"), 20);
    const char *same[] = {"epoch", "step", "lr", "train_loss", "grad_norm", "val_loss",
                          "val_accuracy", "train_accuracy", "test_loss", "test_accuracy"};
    for (int e = 1; e <= 2; e++)
        for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
            char x[64], y[64];
            int col = csv_col(&a, same[i]);
            cr_assert_str_eq(csv_text(&b, e + 1, col, x, sizeof x), csv_text(&a, e, col, y, sizeof y),
                             "epoch %d %s", e, same[i]);
        }
    cr_assert_eq(bs.n, as.n);
    for (int row = 1; row < as.n; row++)
        for (int col = 0; col < 5; col++) { /* step, epoch, loss, lr, grad_norm */
            char x[64], y[64];
            cr_assert_str_eq(csv_text(&bs, row, col, x, sizeof x),
                             csv_text(&as, row, col, y, sizeof y), "step row %d", row);
        }
    free(a.text);
    free(as.text);
    free(b.text);
    free(bs.text);

    /* a file whose columns are not this run's is refused before the first step */
    write_file("old.csv", "epoch,step,lr\n1,43,0.05\n");
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--resume",
                                      path("ck.safetensors"), "--metrics", path("old.csv"), NULL});
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "--metrics ") && strstr(out, "old.csv: the resumed run would add rows") &&
              strstr(out, "give the resumed run a new file"), "%s", out);
    free(out);
}

/* JSON lines: the same names as keys, null for what was not measured (no validation set), and
 * lr per parameter group; a step file that cannot be written stops the run (exit 1). */
Test(trainer, metrics_jsonl_groups_and_failures) {
    char text[2048];
    snprintf(text, sizeof text,
             "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
             "data: {class: mnist, options: {path: %s/data/digits}}\n"
             "optimizer: {class: SGD, lr: 0.1, groups: [{params: ['*.bias'], lr: 0.01}]}\n"
             "loop: {epochs: 1, batch_size: 64, limit_batches: 4}\n", EM_TEST_SRCDIR);
    write_file("g.yaml", text);
    char *out;
    int rc = train(&out, (const char *[]){path("g.yaml"), "--metrics", path("m.jsonl"),
                                          "--metrics-steps", path("s.jsonl"), "--log-every", "2",
                                          NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    char *m = read_text(path("m.jsonl")), *s = read_text(path("s.jsonl"));
    cr_assert(!strncmp(m, "{\"epoch\": 1, \"step\": 4, \"lr\": 0.01, \"train_loss\": ", 49), "%s", m);
    cr_assert(strstr(m, "\"val_loss\": null, \"val_accuracy\": null,") &&
              strstr(m, "\"test_loss\": null, \"test_accuracy\": null}\n") &&
              strstr(m, "\"train_accuracy\": 0."), "%s", m);
    cr_assert_eq(count_lines(s, "\n"), 2, "%s", s);
    cr_assert(!strncmp(s, "{\"step\": 2, \"epoch\": 1, \"loss\": ", 31), "%s", s);
    cr_assert(strstr(s, "\"lr_group0\": 0.01, \"lr_group1\": 0.1, \"grad_norm\": ") &&
              strstr(s, "{\"step\": 4,"), "%s", s);
    free(m);
    free(s);
    /* /dev/full takes the header's write until the flush: found before the first step */
    expect_run(2, "--metrics-steps /dev/full: writing failed: No space left", (const char *[]){
               path("g.yaml"), "--metrics-steps", "/dev/full", NULL});
    cr_assert_eq(symlink("/dev/full", path("full.jsonl")), 0); /* no header: the rows fail */
    rc = train(&out, (const char *[]){path("g.yaml"), "--metrics-steps", path("full.jsonl"),
                                      "--log-every", "1", "--checkpoint", path("ck.safetensors"),
                                      NULL});
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert(strstr(out, "full.jsonl: writing failed: No space left on device") &&
              strstr(out, "and its checkpoint") && strstr(out, "once --metrics-steps can be"),
              "%s", out);
    free(out);
}

/* --save-best keeps the weights of the best validation epoch (the first of the highest
 * val_accuracy in --metrics), and the summary names it: evaluating the file gives that
 * epoch's validation accuracy. Without a validation set it is refused before training. */
Test(trainer, save_best_keeps_the_best_validation_epoch) {
    write_mlp("mlp.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "6", "--metrics",
                                          path("m.csv"), "--save-best", path("best.safetensors"),
                                          "--save-weights", path("last.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    csv m;
    csv_read(&m, path("m.csv"));
    cr_assert_eq(m.n, 7);
    int best = 1;
    for (int e = 2; e <= 6; e++)
        if (csv_num(&m, e, "val_accuracy") > csv_num(&m, best, "val_accuracy")) best = e;
    double want = csv_num(&m, best, "val_accuracy");
    free(m.text);
    char says[160];
    snprintf(says, sizeof says, "best epoch %d with validation accuracy ", best);
    cr_assert(strstr(out, says) && strstr(out, "its weights saved to ") &&
              strstr(out, "best.safetensors (--save-best)"), "epoch %d:\n%s", best, out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--eval-only", "--init-weights",
                                      path("best.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    const char *v = strstr(out, "validation: loss");
    cr_assert(v && strstr(v, "accuracy "), "%s", out);
    cr_assert_float_eq(strtod(strstr(v, "accuracy ") + 9, NULL), 100 * want, 1e-3, "%s", out);
    free(out);
    if (best < 6) /* the last epoch was not the best: its weights are not the file's */
        assert_weights_close(path("best.safetensors"), path("last.safetensors"), 0, 0, false);
    write_noval("noval.yaml");
    expect_run(2, "--save-best needs a validation set", (const char *[]){path("noval.yaml"),
               "--save-best", path("b.safetensors"), NULL});
    expect_run(2, "the directory does not exist", (const char *[]){
               path("mlp.yaml"), "--save-best", path("no/b.safetensors"), NULL});
}

/* --epochs that end before the schedule does: a warning naming both lengths (epochs, or steps
 * for a per-step schedule), none when the run is long enough. */
Test(trainer, epochs_shorter_than_the_schedule_warn) {
    char text[2048];
    const char *data = "data: {class: mnist, options: {path: " EM_TEST_SRCDIR "/data/digits}}\n"
                       "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n";
    snprintf(text, sizeof text, "%sscheduler: {class: CosineAnnealingLR, T_max: 10}\n", data);
    write_file("cos.yaml", text);
    char *out;
    int rc = train(&out, (const char *[]){path("cos.yaml"), "--epochs", "3", "--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "warning: the run's 3 epochs (--epochs) end before the schedule does: "
                     "CosineAnnealingLR's T_max is 10 epochs"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("cos.yaml"), "--epochs", "10", "--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(!strstr(out, "warning"), "%s", out);
    free(out);
    /* per step: 1500 digits in batches of 100 are 15 steps an epoch */
    snprintf(text, sizeof text, "%sscheduler: {class: OneCycleLR, max_lr: 0.1, total_steps: 100}\n"
             "loop: {batch_size: 100}\n", data);
    write_file("one.yaml", text);
    rc = train(&out, (const char *[]){path("one.yaml"), "--epochs", "6", "--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "the run's 6 epochs of 15 steps (90 steps) (--epochs) end before the "
                     "schedule does: OneCycleLR's total_steps is 100 steps") &&
              strstr(out, "raise --epochs to 7"), "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("one.yaml"), "--epochs", "7", "--dry-run", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(!strstr(out, "warning"), "%s", out);
    free(out);
}

/* --predict-scores: each class's logit (the model's outputs) or probability; the reference is
 * the softmax of the logits in f64 and their argmax (the predicted label). */
Test(trainer, predict_scores_logits_and_probabilities) {
    write_mlp("mlp.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--save-weights",
                                          path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    const char *kinds[2] = {"logits", "probabilities"}, *files[2] = {"l.csv", "p.csv"};
    csv c[2];
    for (int k = 0; k < 2; k++) {
        rc = train(&out, (const char *[]){path("mlp.yaml"), "--predict", path(files[k]),
                                          "--predict-scores", kinds[k], "--init-weights",
                                          path("w.safetensors"), "--eval-batch-size", "50", NULL});
        cr_assert_eq(rc, 0, "%s", out);
        free(out);
        csv_read(&c[k], path(files[k]));
        cr_assert_eq(c[k].n, 1 + 297);
    }
    cr_assert_str_eq(c[0].lines[0], "index,predicted,target,logit_0,logit_1,logit_2,logit_3,"
                     "logit_4,logit_5,logit_6,logit_7,logit_8,logit_9");
    cr_assert_str_eq(c[1].lines[0], "index,predicted,target,prob_0,prob_1,prob_2,prob_3,prob_4,"
                     "prob_5,prob_6,prob_7,prob_8,prob_9");
    for (int row = 1; row < c[0].n; row++) {
        double z[10], mx = -INFINITY, sum = 0;
        int arg = 0;
        char b[64];
        for (int j = 0; j < 10; j++) {
            z[j] = strtod(csv_text(&c[0], row, 3 + j, b, sizeof b), NULL);
            if (z[j] > mx) mx = z[j], arg = j;
        }
        cr_assert_eq(csv_num(&c[0], row, "predicted"), arg, "row %d", row);
        cr_assert_eq(csv_num(&c[1], row, "predicted"), arg, "row %d", row);
        for (int j = 0; j < 10; j++) sum += exp(z[j] - mx);
        for (int j = 0; j < 10; j++) {
            double p = exp(z[j] - mx) / sum;
            double got = strtod(csv_text(&c[1], row, 3 + j, b, sizeof b), NULL);
            cr_assert(fabs(got - p) <= 1e-6 + 1e-5 * p, "row %d class %d: %.9g, softmax %.9g",
                      row, j, got, p);
        }
    }
    free(c[0].text);
    free(c[1].text);
    expect_run(2, "--predict-scores needs --predict", (const char *[]){path("mlp.yaml"),
               "--predict-scores", "logits", NULL});
    expect_run(2, "'odds' is not logits or probabilities", (const char *[]){path("mlp.yaml"),
               "--predict", path("x.csv"), "--predict-scores", "odds", NULL});
}

/* Evaluation batches of --eval-batch-size (or loop.eval_batch_size): --limit-batches 2 then
 * evaluates 2 x that many samples; over the whole set the figures do not depend on it. */
Test(trainer, eval_batch_size) {
    write_mlp("mlp.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--save-weights",
                                          path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    expect_run(0, "(14 samples)", (const char *[]){path("mlp.yaml"), "--eval-only",
               "--init-weights", path("w.safetensors"), "--limit-batches", "2",
               "--eval-batch-size", "7", NULL});
    double loss[2];
    for (int k = 0; k < 2; k++) {
        rc = train(&out, (const char *[]){path("mlp.yaml"), "--eval-only", "--init-weights",
                                          path("w.safetensors"), "--eval-batch-size",
                                          k ? "297" : "7", NULL});
        cr_assert_eq(rc, 0, "%s", out);
        const char *t = strstr(out, "test: loss ");
        cr_assert(t && strstr(t, "(297 samples)"), "%s", out);
        loss[k] = strtod(t + strlen("test: loss "), NULL);
        free(out);
    }
    cr_assert_float_eq(loss[0], loss[1], 1e-5 * loss[1]);
    char text[4096], *yaml = read_text(path("mlp.yaml"));
    snprintf(text, sizeof text, "%s", yaml);
    free(yaml);
    char *loop = strstr(text, "loop: {");
    cr_assert(loop);
    snprintf(loop, sizeof text - (size_t)(loop - text), "loop: {epochs: 1, batch_size: 32, "
             "eval_batch_size: 5}\n");
    write_file("e.yaml", text);
    expect_run(0, "(10 samples)", (const char *[]){path("e.yaml"), "--eval-only", "--init-weights",
               path("w.safetensors"), "--limit-batches", "2", NULL});
    expect_run(2, "--eval-batch-size: '0' is not an integer in [1, ", (const char *[]){
               path("mlp.yaml"), "--eval-batch-size", "0", NULL});
}

/* ---- mixed precision (--amp) --------------------------------------------------------------- */

/* bf16 autocast trains the digits MLP about as well as float32; --eval-only and --predict run
 * under the same region (their accuracy is the training run's test accuracy); the metrics get
 * the scaler's columns (no scaler for bf16: 0 skipped, no scale); loop.amp in the config. */
Test(trainer, amp_bf16_trains_like_float32) {
    write_mlp("mlp.yaml", "", "156");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", NULL});
    cr_assert_eq(rc, 0, "%s", out);
    double f32 = test_accuracy(out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--amp", "bf16",
                                      "--save-weights", path("w.safetensors"), "--metrics",
                                      path("m.csv"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    double bf16 = test_accuracy(out);
    cr_assert(strstr(out, "amp bf16"), "%s", out);
    free(out);
    cr_expect(fabs(bf16 - f32) <= 3.0, "bf16 autocast %.2f%%, float32 %.2f%%", bf16, f32);
    csv m;
    csv_read(&m, path("m.csv"));
    cr_assert(strstr(m.lines[0], ",skipped_steps,loss_scale"), "%s", m.lines[0]);
    cr_expect_eq(csv_num(&m, 2, "skipped_steps"), 0);
    free(m.text);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--eval-only", "--amp", "bf16",
                                      "--init-weights", path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect_eq(test_accuracy(out), bf16, "%s", out);
    free(out);
    char *cfg = read_text(path("mlp.yaml")), amp_cfg[8192];
    char *loop = strstr(cfg, "loop: {");
    cr_assert(loop);
    snprintf(amp_cfg, sizeof amp_cfg, "%.*sloop: {amp: bf16, %s", (int)(loop - cfg), cfg,
             loop + strlen("loop: {"));
    free(cfg);
    write_file("amp.yaml", amp_cfg);
    rc = train(&out, (const char *[]){path("amp.yaml"), "--eval-only", "--init-weights",
                                      path("w.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect_eq(test_accuracy(out), bf16, "loop.amp: %s", out);
    free(out);
    /* --amp off over loop.amp: the float32 evaluation of the same weights (the test line, its
     * loss to 6 digits, which bf16 changes) */
    char f32_line[256], bf16_line[256], off_line[256];
    const char *const runs[3][7] = {
        {path("mlp.yaml"), "--eval-only", "--init-weights", path("w.safetensors"), NULL},
        {path("amp.yaml"), "--eval-only", "--init-weights", path("w.safetensors"), NULL},
        {path("amp.yaml"), "--eval-only", "--amp", "off", "--init-weights", path("w.safetensors"),
         NULL}};
    char *lines[3] = {f32_line, bf16_line, off_line};
    for (int i = 0; i < 3; i++) {
        rc = train(&out, runs[i]);
        cr_assert_eq(rc, 0, "%s", out);
        const char *t = strstr(out, "test: loss");
        cr_assert(t, "%s", out);
        snprintf(lines[i], sizeof f32_line, "%.*s", (int)strcspn(t, "\n"), t);
        free(out);
    }
    cr_expect_str_neq(f32_line, bf16_line, "bf16 and float32 evaluate alike: the check is void");
    cr_expect_str_eq(off_line, f32_line, "--amp off over loop.amp");
    expect_run(2, "--amp: 'fp32' is not bf16, fp16 or off",
               (const char *[]){path("mlp.yaml"), "--amp", "fp32", NULL});
    write_file("bad.yaml", "model: [Flatten, {Linear: {in_features: 64, out_features: 10}}]\n"
               GOOD_DATA "optimizer: {class: SGD, lr: 0.1}\nloop: {epochs: 1, amp: fp8}\n");
    expect_run(2, "expected bf16, fp16 or off, found 'fp8'", (const char *[]){path("bad.yaml"), NULL});
}

/* fp16 with the gradient scaler: the summary and metrics report it, the scaled micro-batches
 * of --accum-steps step once, --clip-grad-norm and grad_norm see the unscaled gradients, and
 * a resumed run ends bit-identical to the uninterrupted one (the scaler's state is in the
 * checkpoint). */
Test(trainer, amp_fp16_scaler_accumulation_clipping_and_resume) {
    write_mlp("mlp.yaml", "", "0.1");
    char *out;
    int rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "1", "--metrics",
                                          path("f32.csv"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "1", "--amp", "fp16",
                                      "--clip-grad-norm", "1000", "--metrics", path("f16.csv"),
                                      "--metrics-steps", path("f16s.csv"), "--log-every", "1",
                                      NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "amp fp16: 0 skipped steps, final loss scale 65536"), "%s", out);
    free(out);
    csv a, b, s;
    csv_read(&a, path("f32.csv"));
    csv_read(&b, path("f16.csv"));
    csv_read(&s, path("f16s.csv"));
    cr_assert(strstr(s.lines[0], ",skipped_steps,loss_scale"), "%s", s.lines[0]);
    cr_expect_eq(csv_num(&s, 1, "loss_scale"), 65536);
    cr_expect_eq(csv_num(&b, 1, "loss_scale"), 65536);
    double ga = csv_num(&a, 1, "grad_norm"), gb = csv_num(&b, 1, "grad_norm");
    cr_expect(fabs(gb - ga) <= 0.05 * ga, "the fp16 run's grad_norm %g is not the unscaled "
              "one (float32: %g)", gb, ga);
    free(a.text);
    free(b.text);
    free(s.text);
    /* accumulation: 4 scaled micro-batches per step */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--batch-size", "128", "--amp", "fp16",
                                      "--save-weights", path("big.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--batch-size", "32", "--accum-steps",
                                      "4", "--amp", "fp16", "--save-weights",
                                      path("acc.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "11 steps"), "%s", out);
    free(out);
    /* fp16 rounds each micro-batch's gradients on their own: close, not equal; without the
     * accumulation (43 steps of 32) the weights are far off at the same tolerance */
    assert_weights_close(path("acc.safetensors"), path("big.safetensors"), 5e-2, 1e-2, true);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--batch-size", "32", "--amp", "fp16",
                                      "--save-weights", path("small.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    assert_weights_close(path("small.safetensors"), path("big.safetensors"), 5e-2, 1e-2, false);
    /* resume */
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--amp", "fp16",
                                      "--save-weights", path("full.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--amp", "fp16",
                                      "--max-steps", "20", "--checkpoint",
                                      path("ck.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    rc = train(&out, (const char *[]){path("mlp.yaml"), "--epochs", "2", "--amp", "fp16",
                                      "--resume", path("ck.safetensors"), "--save-weights",
                                      path("resumed.safetensors"), NULL});
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    assert_weights_close(path("resumed.safetensors"), path("full.safetensors"), 0, 0, true);
    /* a checkpoint of an fp16 run holds the scaler */
    em_metadata *md = NULL;
    em_dict *d = NULL;
    cr_assert_eq(em_load(path("ck.safetensors"), NULL, &d, &md), EM_OK, "%s", em_last_error());
    cr_expect(em_metadata_get(md, "amp.scaler"));
    em_metadata_free(md);
    em_dict_free(d);
}
