/*
 * test_trainer.c — ember-train end to end, and the config/model-builder library under it.
 *
 * The trainer runs as a child process (the built binary, EM_TRAINER) on the bundled digits set
 * with configs written into a temporary directory; the tests read its exit code, its output,
 * and the safetensors files it writes. Small and quick: an MLP, one or two epochs, except the
 * bundled example itself (8 of its 20 epochs).
 */
#include "common.h"

#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/* Run ember-train with args (NULL-terminated); its stdout+stderr into *out (malloc'd). */
static int spawn(const char *prog, char **out, const char *const *args) {
    char log[512];
    snprintf(log, sizeof log, "%s/out.txt", tmpdir);
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
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    FILE *f = fopen(log, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = calloc(1, (size_t)len + 1);
    cr_assert_eq(fread(*out, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
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

Test(trainer, eval_only_and_predict_match_training) {
    write_mlp("mlp.yaml", "", "0.1");
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

Test(trainer, command_line) {
    char *out;
    int rc = train(&out, (const char *[]){"--help", NULL});
    cr_assert_eq(rc, 0);
    cr_assert(strstr(out, "--accum-steps") && strstr(out, "Exit codes"), "%s", out);
    cr_assert(!strstr(out, "--early-stop") && !strstr(out, "--warmup-epochs"), "%s", out);
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
