/*
 * test_checkpoint.c — em_checkpoint_save / em_checkpoint_load.
 *
 *   - Round trip: every part (model, optimizer, scheduler, loader position, the default
 *     generator, loop state, config, the caller's metadata) restored into freshly made
 *     objects equals what was saved, byte for byte.
 *   - Exact resume, in new processes: a small MLP with Dropout (training mode) on an in-memory
 *     dataset, shuffled, with SGD-momentum or Adam and a StepLR. Child A trains 2 epochs
 *     straight; child B trains 1 epoch (or k batches of epoch 0) and saves; child C builds
 *     everything afresh from different seeds, loads the checkpoint and finishes the 2 epochs.
 *     A's and C's parameters and optimizer state must be bit-identical (memcmp). A control
 *     child D does what C does but reseeds the default generator after loading: its
 *     parameters must differ, which shows that the generator state in the file is what makes
 *     the dropout masks, and so the resume, exact.
 *   - Errors: model keys missing, unexpected and mismatched (all named, nothing copied);
 *     corrupt or missing metadata entries (named); not a checkpoint; another format version;
 *     a part the file lacks; a stray tensor; a reserved metadata key; another optimizer class.
 *   - map_location: a checkpoint written from the CPU loads into a model and optimizer on
 *     another device ("testdev"), everything landing on that device with the same bytes.
 *   - Keep-last-N rotation of checkpoints named by step.
 *
 * Children never call Criterion: they report through a pipe and their exit status. The
 * parent process does no computation of its own before forking, so the children start clean.
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "serialize_common.h"

TestSuite(checkpoint, .init = em_test_setup, .fini = em_test_teardown);
/* With the testdev plugin: a second device type with its own address space (map_location). */
TestSuite(checkpoint_dev, .init = st_setup_testdev, .fini = em_test_teardown);

/* ---- a temporary directory per test --------------------------------------------------------- */

static char g_dir[64];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/em_ckpt_XXXXXX");
    cr_assert(mkdtemp(g_dir), "mkdtemp failed");
}

static void file_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

/* Remove every file of g_dir, then g_dir. */
static void remove_dir(void) {
    static const char *names[] = {"ck.safetensors", "bad.safetensors", "ref.bin", "res.bin",
                                  "ctl.bin", "run-1.safetensors", "run-2.safetensors",
                                  "run-3.safetensors", "run-4.safetensors", "run-5.safetensors"};
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        file_path(p, sizeof p, names[i]);
        unlink(p);
    }
    cr_assert_eq(rmdir(g_dir), 0, "rmdir %s: a file was left behind", g_dir);
}

/* ---- the training run ----------------------------------------------------------------------- */

enum { N_ITEMS = 44, N_FEAT = 6, N_HIDDEN = 16, N_CLASSES = 3, BATCH = 8 };

typedef struct run {
    em_dataset *ds;
    em_loader *dl;
    em_module *net, *loss;
    em_optimizer *opt;
    em_scheduler *sched;
    int64_t epoch, step;
} run;

/* Failures inside a child: the message goes to the pipe, the child exits 1. */
static int g_child_fd = -1;

static void fail_now(const char *what) {
    char m[1400];
    int n = snprintf(m, sizeof m, "%s: %s", what, em_last_error());
    if (g_child_fd >= 0) {
        ssize_t w = write(g_child_fd, m, (size_t)n);
        (void)w;
        _exit(1);
    }
    cr_assert_fail("%s", m);
}
#define CHECK(cond, what)                                                                      \
    do {                                                                                       \
        if (!(cond)) fail_now(what);                                                           \
    } while (0)

static em_module *make(const char *cls, const char *k1, const char *v1, const char *k2,
                       const char *v2) {
    em_options *o = em_options_new();
    if (k1) em_options_set_text(o, k1, v1, NULL);
    if (k2) em_options_set_text(o, k2, v2, NULL);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    CHECK(m, cls);
    return m;
}

/* The MLP: Linear(6, hidden) - ReLU - Dropout(0.3) - Linear(hidden, 3), in training mode, its
 * weights drawn from the default generator seeded with init_seed. with_dropout false leaves
 * the Dropout out (another set of keys). */
static em_module *make_net(uint64_t init_seed, int hidden, bool with_dropout) {
    char h[16];
    snprintf(h, sizeof h, "%d", hidden);
    em_seed(init_seed);
    em_module *net = make("Sequential", NULL, NULL, NULL, NULL);
    CHECK(em_module_append_child(net, make("Linear", "in_features", "6", "out_features", h)) == EM_OK,
          "append");
    CHECK(em_module_append_child(net, make("ReLU", NULL, NULL, NULL, NULL)) == EM_OK, "append");
    if (with_dropout)
        CHECK(em_module_append_child(net, make("Dropout", "p", "0.3", NULL, NULL)) == EM_OK,
              "append");
    CHECK(em_module_append_child(net, make("Linear", "in_features", h, "out_features", "3")) == EM_OK,
          "append");
    em_module_train(net, true);
    return net;
}

/* The same dataset in every process: x[i][k] = sin(7i + 3k + 1), label (5i) % 3. */
static em_dataset *make_data(void) {
    em_tensor *x = em_empty(2, (int64_t[]){N_ITEMS, N_FEAT}, EM_F32, em_cpu());
    em_tensor *y = em_empty(1, (int64_t[]){N_ITEMS}, EM_I64, em_cpu());
    CHECK(x && y, "data");
    float *px = em_tensor_data(x);
    int64_t *py = em_tensor_data(y);
    for (int64_t i = 0; i < N_ITEMS; i++) {
        for (int k = 0; k < N_FEAT; k++) px[i * N_FEAT + k] = (float)sin((double)(7 * i + 3 * k + 1));
        py[i] = (5 * i) % N_CLASSES;
    }
    em_dataset *ds = em_dataset_from_tensors(x, y, N_CLASSES);
    CHECK(ds, "from_tensors");
    em_tensor_release(x);
    em_tensor_release(y);
    return ds;
}

/* Build every object; init_seed seeds the weights, loader_seed the shuffling (a resumed run
 * gets different ones, which the checkpoint must override). */
static void build(run *r, const char *optim, uint64_t init_seed, uint64_t loader_seed,
                  int num_workers) {
    memset(r, 0, sizeof *r);
    r->ds = make_data();
    em_loader_options lo = {.struct_size = sizeof lo, .batch_size = BATCH, .shuffle = true,
                            .seed = loader_seed, .num_workers = num_workers};
    CHECK(r->dl = em_loader_new(r->ds, &lo), "loader");
    r->net = make_net(init_seed, N_HIDDEN, true);
    r->loss = make("CrossEntropyLoss", NULL, NULL, NULL, NULL);
    em_dict *params = em_module_named_parameters(r->net, true);
    em_options *o = em_options_new();
    if (!strcmp(optim, "SGD")) {
        em_options_set_float(o, "lr", 0.2);
        em_options_set_float(o, "momentum", 0.9);
        em_options_set_float(o, "weight_decay", 1e-3);
    } else {
        em_options_set_float(o, "lr", 0.01);
    }
    r->opt = em_optimizer_new(optim, params, o);
    em_options_free(o);
    em_dict_free(params);
    CHECK(r->opt, "optimizer");
    em_options *so = em_options_new();
    em_options_set_int(so, "step_size", 1);
    em_options_set_float(so, "gamma", 0.5);
    r->sched = em_scheduler_new("StepLR", r->opt, so);
    em_options_free(so);
    CHECK(r->sched, "scheduler");
}

static void teardown(run *r) {
    em_scheduler_free(r->sched);
    em_optimizer_free(r->opt);
    em_module_free(r->loss);
    em_module_free(r->net);
    em_loader_free(r->dl);
    em_dataset_free(r->ds);
}

/* Train until r->epoch reaches end_epoch, or stop as soon as r->step reaches stop_step
 * (-1: never). The scheduler steps at each epoch's end. */
static void train(run *r, int64_t end_epoch, int64_t stop_step) {
    while (r->epoch < end_epoch) {
        for (;;) {
            if (stop_step >= 0 && r->step == stop_step) return;
            em_tensor *x, *y;
            CHECK(em_loader_next(r->dl, &x, &y) == EM_OK, "loader_next");
            if (!x) break;
            CHECK(em_scope_begin() == EM_OK, "scope");
            em_tensor *out = em_module_forward(r->net, x);
            em_tensor *l = em_module_forward_n(r->loss, (em_tensor *[]){out, y}, 2);
            CHECK(l, "forward");
            CHECK(em_backward(l) == EM_OK, "backward");
            CHECK(em_optimizer_step(r->opt) == EM_OK, "step");
            em_optimizer_zero_grad(r->opt);
            CHECK(em_scope_end() == EM_OK, "scope");
            r->step++;
        }
        CHECK(em_scheduler_step(r->sched, NAN) == EM_OK, "scheduler step");
        r->epoch++;
    }
}

static em_checkpoint ck_of(run *r) {
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = r->net;
    ck.optimizer = r->opt;
    ck.scheduler = r->sched;
    ck.loader = r->dl;
    ck.epoch = r->epoch;
    ck.step = r->step;
    return ck;
}

/* Append every tensor's raw bytes of d to f. */
static void dump_dict(FILE *f, const em_dict *d) {
    for (size_t i = 0; i < em_dict_len(d); i++) {
        const em_tensor *t = em_dict_value(d, i);
        size_t n = (size_t)em_tensor_numel(t) * em_dtype_size(em_tensor_dtype(t));
        char *buf = malloc(n ? n : 1);
        CHECK(em_tensor_to_host(t, buf, n) == EM_OK, "to_host");
        fprintf(f, "%s %zu\n", em_dict_key(d, i), n);
        fwrite(buf, 1, n, f);
        free(buf);
    }
}

/* The model's state dict, the optimizer's state tensors and groups JSON, the scheduler's
 * JSON, the counters and the lr. */
static void dump_run(run *r, const char *name) {
    char p[128];
    file_path(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    CHECK(f, "fopen");
    em_dict *sd = em_module_state_dict(r->net), *ot;
    char *groups;
    CHECK(sd && em_optimizer_state_dict(r->opt, &ot, &groups) == EM_OK, "state dicts");
    dump_dict(f, sd);
    dump_dict(f, ot);
    char *sched;
    CHECK(em_scheduler_state_dict(r->sched, &sched) == EM_OK, "scheduler state");
    fprintf(f, "%s\n%s\nepoch %lld step %lld lr %.17g\n", groups, sched, (long long)r->epoch,
            (long long)r->step, em_optimizer_lr(r->opt, 0));
    em_host_free(groups);
    em_host_free(sched);
    em_dict_free(sd);
    em_dict_free(ot);
    fclose(f);
}

/* Run fn(arg) in a forked child; returns its exit status, its message into msg. */
typedef void (*child_fn)(const void *arg);
static int run_child(child_fn fn, const void *arg, char *msg, size_t cap) {
    int p[2];
    cr_assert_eq(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(p[0]);
        g_child_fd = p[1];
        fn(arg);
        _exit(0);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(p[0], msg + n, cap - 1 - n)) > 0) n += (size_t)r;
    msg[n] = '\0';
    close(p[0]);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

static void in_child(child_fn fn, const void *arg, const char *what) {
    char msg[2048];
    int rc = run_child(fn, arg, msg, sizeof msg);
    cr_assert_eq(rc, 0, "%s child exited with %d: %s", what, rc, msg);
}

/* Read a whole file (malloc'd) and its length. */
static char *slurp(const char *name, size_t *len) {
    char p[128];
    file_path(p, sizeof p, name);
    FILE *f = fopen(p, "rb");
    cr_assert(f, "cannot open %s", p);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* ---- the exact-resume children ------------------------------------------------------------- */

typedef struct resume_case {
    const char *optim;
    int num_workers;
    int resume_workers;   /* the resumed run's loader threads (batches do not depend on them) */
    int64_t stop_step;    /* where the first run saves: a step count (N_BATCHES: one epoch) */
    bool reseed_control;  /* child D: reseed the default generator after loading */
} resume_case;

#define N_BATCHES 6 /* 44 items in batches of 8: five of 8 and one of 4 */

/* A: two epochs straight. */
static void child_reference(const void *arg) {
    const resume_case *c = arg;
    run r;
    build(&r, c->optim, 11, 1234, c->num_workers);
    train(&r, 2, -1);
    dump_run(&r, "ref.bin");
    teardown(&r);
}

/* B: train up to stop_step (the end of epoch 0 included when it is N_BATCHES), save. */
static void child_first(const void *arg) {
    const resume_case *c = arg;
    run r;
    build(&r, c->optim, 11, 1234, c->num_workers);
    train(&r, c->stop_step == N_BATCHES ? 1 : 2, c->stop_step == N_BATCHES ? -1 : c->stop_step);
    em_checkpoint ck = ck_of(&r);
    ck.config = "{\"lr\": 0.2}";
    char p[128];
    file_path(p, sizeof p, "ck.safetensors");
    CHECK(em_checkpoint_save(p, &ck, NULL) == EM_OK, "checkpoint_save");
    teardown(&r);
}

/* C (and D): everything made afresh from other seeds, then the checkpoint, then the rest. */
static void child_resume(const void *arg) {
    const resume_case *c = arg;
    run r;
    build(&r, c->optim, 999, 4321, c->resume_workers);
    em_seed(5555); /* the default generator somewhere else entirely */
    em_checkpoint ck = ck_of(&r);
    ck.epoch = ck.step = -1;
    char p[128];
    file_path(p, sizeof p, "ck.safetensors");
    CHECK(em_checkpoint_load(p, &ck, NULL) == EM_OK, "checkpoint_load");
    CHECK(ck.config_out && !strcmp(ck.config_out, "{\"lr\": 0.2}"), "config");
    em_host_free(ck.config_out);
    r.epoch = ck.epoch;
    r.step = ck.step;
    if (c->reseed_control) em_seed(5555);
    train(&r, 2, -1);
    dump_run(&r, c->reseed_control ? "ctl.bin" : "res.bin");
    teardown(&r);
}

static void exact_resume(resume_case c) {
    make_dir();
    in_child(child_reference, &c, "reference");
    in_child(child_first, &c, "first half");
    in_child(child_resume, &c, "resume");
    c.reseed_control = true;
    in_child(child_resume, &c, "control");
    size_t na, nb, nc;
    char *a = slurp("ref.bin", &na), *b = slurp("res.bin", &nb), *ctl = slurp("ctl.bin", &nc);
    cr_assert_gt(na, 1000u);
    cr_assert_eq(na, nb, "dump sizes differ: %zu vs %zu", na, nb);
    cr_assert(memcmp(a, b, na) == 0, "the resumed run's parameters or optimizer state differ "
              "from the uninterrupted run's (%s, stop at step %lld)", c.optim,
              (long long)c.stop_step);
    /* The control ran the same batches with other dropout masks: it must differ. */
    cr_assert(na != nc || memcmp(a, ctl, na) != 0, "reseeding the default generator after "
              "loading changed nothing: the test does not exercise dropout");
    free(a);
    free(b);
    free(ctl);
    remove_dir();
}

Test(checkpoint, exact_resume_sgd_after_one_epoch) {
    exact_resume((resume_case){.optim = "SGD", .num_workers = 0, .stop_step = N_BATCHES});
}

Test(checkpoint, exact_resume_adam_after_one_epoch) {
    exact_resume((resume_case){.optim = "Adam", .num_workers = 0, .stop_step = N_BATCHES});
}

Test(checkpoint, exact_resume_mid_epoch) {
    exact_resume((resume_case){.optim = "SGD", .num_workers = 0, .stop_step = 3});
}

Test(checkpoint, exact_resume_mid_epoch_workers_adam) {
    exact_resume((resume_case){.optim = "Adam", .num_workers = 2, .resume_workers = 2,
                               .stop_step = 4});
}

/* Mid-epoch of the second epoch: the resumed loader must continue epoch 1's permutation;
 * saved with one worker thread, resumed with three. */
Test(checkpoint, exact_resume_mid_second_epoch) {
    exact_resume((resume_case){.optim = "SGD", .num_workers = 1, .resume_workers = 3,
                               .stop_step = N_BATCHES + 2});
}

/* ---- round trip of every part, in one process ------------------------------------------------ */

/* A snapshot of everything a checkpoint restores. */
typedef struct snap {
    char *model;
    size_t model_n;
    char *optim;
    size_t optim_n;
    char *groups, *sched;
    em_loader_state ls;
    em_rng_state rs;
} snap;

static char *dict_bytes(const em_dict *d, size_t *n) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, n);
    cr_assert(f);
    dump_dict(f, d);
    fclose(f);
    return buf;
}

static snap take(run *r) {
    snap s;
    em_dict *sd = em_module_state_dict(r->net), *ot;
    cr_assert(sd && em_optimizer_state_dict(r->opt, &ot, &s.groups) == EM_OK, "%s", em_last_error());
    cr_assert_eq(em_scheduler_state_dict(r->sched, &s.sched), EM_OK, "%s", em_last_error());
    s.model = dict_bytes(sd, &s.model_n);
    s.optim = dict_bytes(ot, &s.optim_n);
    em_dict_free(sd);
    em_dict_free(ot);
    s.ls = em_loader_get_state(r->dl);
    s.rs = em_generator_get_state(NULL);
    return s;
}

static void snap_free(snap *s) {
    free(s->model);
    free(s->optim);
    em_host_free(s->groups);
    em_host_free(s->sched);
}

Test(checkpoint, round_trip_every_part) {
    make_dir();
    char p[128];
    file_path(p, sizeof p, "ck.safetensors");
    run a;
    build(&a, "Adam", 3, 77, 0);
    a.epoch = 0;
    train(&a, 2, N_BATCHES + 2); /* into epoch 1: the scheduler has stepped once */
    snap s0 = take(&a);
    cr_assert_eq(s0.ls.epoch, 1);
    cr_assert_eq(s0.ls.batch, 2);
    em_checkpoint ck = ck_of(&a);
    ck.best_metric = 0.123456789012345678;
    ck.config = "{\"model\": \"mlp\", \"epochs\": 2}";
    em_metadata *um = em_metadata_new();
    cr_assert_eq(em_metadata_set(um, "note", "made by a test"), EM_OK);
    cr_assert_eq(em_checkpoint_save(p, &ck, um), EM_OK, "%s", em_last_error());
    em_metadata_free(um);

    /* Fresh objects, other seeds, the default generator moved on. */
    run b;
    build(&b, "Adam", 4, 88, 0);
    em_seed(31337);
    snap s1 = take(&b);
    cr_assert(s1.model_n != s0.model_n || memcmp(s1.model, s0.model, s0.model_n) != 0);
    snap_free(&s1);
    em_checkpoint lk = ck_of(&b);
    lk.epoch = lk.step = -1;
    em_metadata *meta = NULL;
    em_checkpoint_load_options lo = EM_CHECKPOINT_LOAD_OPTIONS_INIT;
    lo.metadata_out = &meta;
    cr_assert_eq(em_checkpoint_load(p, &lk, &lo), EM_OK, "%s", em_last_error());
    snap s2 = take(&b);
    cr_assert_eq(s2.model_n, s0.model_n);
    cr_assert(memcmp(s2.model, s0.model, s0.model_n) == 0, "model differs after loading");
    cr_assert_eq(s2.optim_n, s0.optim_n);
    cr_assert(memcmp(s2.optim, s0.optim, s0.optim_n) == 0, "optimizer state differs");
    cr_assert_str_eq(s2.groups, s0.groups);
    cr_assert_str_eq(s2.sched, s0.sched);
    cr_assert_eq(s2.ls.seed, 77u);
    cr_assert_eq(s2.ls.epoch, 1);
    cr_assert_eq(s2.ls.batch, 2);
    cr_assert_eq(s2.rs.seed, s0.rs.seed);
    cr_assert_eq(s2.rs.offset, s0.rs.offset);
    cr_assert_eq(lk.epoch, 1);
    cr_assert_eq(lk.step, N_BATCHES + 2);
    cr_assert(lk.best_metric == 0.123456789012345678, "best metric %.17g", lk.best_metric);
    cr_assert_str_eq(lk.config_out, "{\"model\": \"mlp\", \"epochs\": 2}");
    cr_assert_eq(em_optimizer_lr(b.opt, 0), em_optimizer_lr(a.opt, 0));
    cr_assert_eq(em_scheduler_last_epoch(b.sched), 1);
    em_host_free(lk.config_out);
    cr_assert_str_eq(em_metadata_get(meta, "note"), "made by a test");
    cr_assert_str_eq(em_metadata_get(meta, "ember.checkpoint"), "1");
    cr_assert_str_eq(em_metadata_get(meta, "ember.version"), em_version());
    cr_assert_str_eq(em_metadata_get(meta, "ember.parts"), "model,optimizer,scheduler,loader");
    em_metadata_free(meta);

    /* The file is plain safetensors: model.* and optim.* tensors, readable by em_load. */
    em_dict *raw;
    cr_assert_eq(em_load(p, NULL, &raw, NULL), EM_OK, "%s", em_last_error());
    cr_assert(em_dict_has(raw, "model.0.weight") && em_dict_has(raw, "model.3.bias"));
    cr_assert(em_dict_has(raw, "optim.state.0.exp_avg"), "keys: %s, ...", em_dict_key(raw, 0));
    em_dict_free(raw);

    /* A model alone loads from the full checkpoint; loop state comes back too. */
    em_module *m = make_net(6, N_HIDDEN, true);
    em_checkpoint only = EM_CHECKPOINT_INIT;
    only.model = m;
    cr_assert_eq(em_checkpoint_load(p, &only, NULL), EM_OK, "%s", em_last_error());
    em_dict *msd = em_module_state_dict(m);
    size_t mn;
    char *mb = dict_bytes(msd, &mn);
    cr_assert(mn == s0.model_n && memcmp(mb, s0.model, mn) == 0);
    free(mb);
    em_dict_free(msd);
    em_host_free(only.config_out);
    em_module_free(m);

    /* No best metric yet (NaN) and no config survive as such. */
    em_checkpoint nb = EM_CHECKPOINT_INIT;
    cr_assert_eq(em_checkpoint_save(p, &nb, NULL), EM_OK, "%s", em_last_error());
    nb.best_metric = 1.0;
    nb.config_out = (char *)"stale";
    cr_assert_eq(em_checkpoint_load(p, &nb, NULL), EM_OK, "%s", em_last_error());
    cr_assert(isnan(nb.best_metric));
    cr_assert_null(nb.config_out);

    snap_free(&s0);
    snap_free(&s2);
    teardown(&a);
    teardown(&b);
    remove_dir();
}

/* ---- errors --------------------------------------------------------------------------------- */

Test(checkpoint, model_key_problems_all_named_nothing_copied) {
    make_dir();
    char p[128];
    file_path(p, sizeof p, "ck.safetensors");
    em_module *src = make_net(1, N_HIDDEN, true); /* keys 0.*, 3.* */
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = src;
    cr_assert_eq(em_checkpoint_save(p, &ck, NULL), EM_OK, "%s", em_last_error());

    em_module *dst = make_net(2, 8, false); /* keys 0.* with 8 outputs, 2.* */
    em_dict *before_sd = em_module_state_dict(dst);
    size_t nb;
    char *before = dict_bytes(before_sd, &nb);
    em_dict_free(before_sd);
    em_checkpoint lk = EM_CHECKPOINT_INIT;
    lk.model = dst;
    cr_assert_eq(em_checkpoint_load(p, &lk, NULL), EM_ERR_INVALID);
    const char *e = em_last_error();
    cr_assert(strstr(e, "checkpoint '") && strstr(e, "ck.safetensors': model: "), "%s", e);
    cr_assert(strstr(e, "2 missing keys (2.weight, 2.bias)"), "%s", e);
    cr_assert(strstr(e, "2 unexpected keys (3.weight, 3.bias)"), "%s", e);
    cr_assert(strstr(e, "2 shape mismatches") && strstr(e, "0.weight") && strstr(e, "0.bias"),
              "%s", e);
    em_dict *after_sd = em_module_state_dict(dst);
    size_t na;
    char *after = dict_bytes(after_sd, &na);
    em_dict_free(after_sd);
    cr_assert(na == nb && memcmp(before, after, na) == 0, "a failed load changed the model");
    free(before);
    free(after);
    em_module_free(src);
    em_module_free(dst);
    remove_dir();
}

/* Rewrite the checkpoint at p into "bad.safetensors" with metadata key set to value (NULL:
 * removed) and, when extra is not NULL, one more tensor under that name. */
static void rewrite(const char *p, const char *key, const char *value, const char *extra,
                    char *bad, size_t cap) {
    em_dict *d;
    em_metadata *m;
    cr_assert_eq(em_load(p, NULL, &d, &m), EM_OK, "%s", em_last_error());
    em_metadata *m2 = em_metadata_new();
    for (size_t i = 0; i < em_metadata_len(m); i++)
        if (strcmp(em_metadata_key(m, i), key) != 0)
            em_metadata_set(m2, em_metadata_key(m, i), em_metadata_value(m, i));
    if (value) em_metadata_set(m2, key, value);
    if (extra) {
        em_tensor *t = em_zeros(1, (int64_t[]){2}, EM_F32, em_cpu());
        em_dict_set(d, extra, t);
        em_tensor_release(t);
    }
    file_path(bad, cap, "bad.safetensors");
    cr_assert_eq(em_save(d, bad, m2, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(d);
    em_metadata_free(m);
    em_metadata_free(m2);
}

Test(checkpoint, corrupt_metadata_named) {
    make_dir();
    char p[128], bad[128];
    file_path(p, sizeof p, "ck.safetensors");
    run r;
    build(&r, "SGD", 1, 2, 0);
    train(&r, 1, 2);
    em_checkpoint ck = ck_of(&r);
    cr_assert_eq(em_checkpoint_save(p, &ck, NULL), EM_OK, "%s", em_last_error());
    em_rng_state rs0 = em_generator_get_state(NULL);

    static const struct { const char *key, *value, *extra; em_status st; const char *needle; }
    cases[] = {
        {"loader.state", "{\"seed\":\"2\",\"epoch\":-1,\"batch\":0}", NULL, EM_ERR_FORMAT,
         "metadata entry 'loader.state': \"epoch\" is -1; expected an integer in [0, "
         "9007199254740992]"},
        {"loader.state", "{\"seed\":\"2\",\"epoch\":0,\"batch\":\"\"}", NULL, EM_ERR_FORMAT,
         "metadata entry 'loader.state': \"batch\" is malformed"},
        {"loader.state", "{\"epoch\":0,\"batch\":0}", NULL, EM_ERR_FORMAT,
         "metadata entry 'loader.state': \"seed\" is missing"},
        {"rng.default", "not json", NULL, EM_ERR_FORMAT,
         "metadata entry 'rng.default' is not valid JSON"},
        {"rng.default", NULL, NULL, EM_ERR_FORMAT, "metadata entry 'rng.default' is missing"},
        {"loop", "[1, 2]", NULL, EM_ERR_FORMAT, "metadata entry 'loop' is not a JSON object"},
        {"loop", "{\"epoch\":0,\"step\":2,\"best_metric\":\"high\"}", NULL, EM_ERR_FORMAT,
         "'loop': \"best_metric\" is malformed"},
        {"optim.param_groups", NULL, NULL, EM_ERR_FORMAT,
         "metadata entry 'optim.param_groups' is missing"},
        {"optim.param_groups", "{\"class\":\"SGD\"", NULL, EM_ERR_INVALID,
         "optimizer ('optim.param_groups'): SGD.load_state_dict: the groups JSON is malformed"},
        {"sched.state", "{}", NULL, EM_ERR_INVALID,
         "scheduler ('sched.state'): StepLR.load_state_dict: the state is from a (unnamed)"},
        {"ember.checkpoint", NULL, NULL, EM_ERR_FORMAT,
         "not an Ember checkpoint: its metadata has no 'ember.checkpoint' entry"},
        {"ember.checkpoint", "2", NULL, EM_ERR_FORMAT, "format version '2' (written by Ember "},
        {"ember.parts", "model,loader", NULL, EM_ERR_NOTFOUND,
         "lacks the state asked for: optimizer, scheduler (it holds: model,loader, the "
         "default generator, the loop state)"},
        {"note", "x", "stray", EM_ERR_FORMAT,
         "tensor 'stray' is not part of a checkpoint (its tensors are model.* and optim.*)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        rewrite(p, cases[i].key, cases[i].value, cases[i].extra, bad, sizeof bad);
        em_checkpoint lk = ck_of(&r);
        em_seed(424242);
        em_rng_state before = em_generator_get_state(NULL);
        cr_assert_eq(em_checkpoint_load(bad, &lk, NULL), cases[i].st, "case %zu (%s): %s", i,
                     cases[i].key, em_last_error());
        cr_assert(strstr(em_last_error(), cases[i].needle), "case %zu: '%s' lacks '%s'", i,
                  em_last_error(), cases[i].needle);
        cr_assert(strstr(em_last_error(), "bad.safetensors"), "case %zu: %s", i, em_last_error());
        cr_assert_null(lk.config_out);
        /* Checks that run before restoring leave the default generator alone. */
        if (cases[i].st == EM_ERR_FORMAT || cases[i].st == EM_ERR_NOTFOUND)
            cr_assert_eq(em_generator_get_state(NULL).offset, before.offset);
    }
    /* The good file still loads. */
    em_checkpoint lk = ck_of(&r);
    cr_assert_eq(em_checkpoint_load(p, &lk, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_generator_get_state(NULL).offset, rs0.offset);
    cr_assert_eq(lk.step, 2);
    teardown(&r);
    remove_dir();
}

/* The prefix rule: a caller built against older headers, whose structs end before the core's
 * do, is served — the core reads and writes only the bytes its struct_size covers. The bytes
 * past it here (the reserved ext) hold a pattern that must survive a save and a load. */
Test(checkpoint, a_caller_with_a_smaller_struct_is_served_within_it) {
    make_dir();
    char p[128];
    file_path(p, sizeof p, "ck.safetensors");
    run r;
    build(&r, "SGD", 1, 2, 0);
    em_checkpoint ck = ck_of(&r);
    ck.struct_size = offsetof(em_checkpoint, ext);
    memset(&ck.ext, 0xAB, sizeof ck.ext);
    ck.step = 7;
    cr_assert_eq(em_checkpoint_save(p, &ck, NULL), EM_OK, "%s", em_last_error());
    em_checkpoint lk = ck_of(&r);
    lk.struct_size = offsetof(em_checkpoint, ext);
    memset(&lk.ext, 0xAB, sizeof lk.ext);
    lk.step = 0;
    em_metadata *meta = NULL;
    em_checkpoint_load_options lo = {.struct_size = offsetof(em_checkpoint_load_options, ext),
                                     .metadata_out = &meta};
    cr_assert_eq(em_checkpoint_load(p, &lk, &lo), EM_OK, "%s", em_last_error());
    cr_assert_eq(lk.step, 7, "the loop state is written back");
    cr_assert_not_null(meta);
    em_metadata_free(meta);
    unsigned char want[sizeof lk.ext];
    memset(want, 0xAB, sizeof want);
    cr_assert_eq(memcmp(&lk.ext, want, sizeof want), 0, "written past the caller's struct_size");
    cr_assert_eq(lk.struct_size, offsetof(em_checkpoint, ext), "struct_size is the caller's");
    lk.struct_size = offsetof(em_checkpoint, run_id);
    cr_assert_eq(em_checkpoint_load(p, &lk, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "checkpoint_load: em_checkpoint struct_size");
    teardown(&r);
    remove_dir();
}

Test(checkpoint, other_errors) {
    make_dir();
    char p[128];
    file_path(p, sizeof p, "ck.safetensors");
    run r;
    build(&r, "SGD", 1, 2, 0);
    em_checkpoint ck = ck_of(&r);

    /* Reserved metadata keys are refused by name; nothing is written. */
    em_metadata *um = em_metadata_new();
    em_metadata_set(um, "optim.lr", "1");
    cr_assert_eq(em_checkpoint_save(p, &ck, um), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "metadata key 'optim.lr' is reserved");
    em_metadata_free(um);
    cr_assert_neq(access(p, F_OK), 0);

    /* A bad struct, NULL arguments. */
    em_checkpoint zero = {0};
    cr_assert_eq(em_checkpoint_save(p, &zero, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "checkpoint_save: em_checkpoint struct_size 0 is smaller than "
                    "the oldest layout this core accepts");
    cr_assert_eq(em_checkpoint_load(NULL, &ck, NULL), EM_ERR_INVALID);
    cr_assert_eq(em_checkpoint_save(p, NULL, NULL), EM_ERR_INVALID);

    /* No such file; a plain safetensors file that is not a checkpoint. */
    cr_assert_eq(em_checkpoint_load(p, &ck, NULL), EM_ERR_NOTFOUND);
    cr_assert(strstr(em_last_error(), "checkpoint '") && strstr(em_last_error(), "ck.safetensors"),
              "%s", em_last_error());
    em_dict *sd = em_module_state_dict(r.net);
    cr_assert_eq(em_save(sd, p, NULL, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(sd);
    cr_assert_eq(em_checkpoint_load(p, &ck, NULL), EM_ERR_FORMAT);
    em_assert_error(EM_ERR_FORMAT, "not an Ember checkpoint");

    /* A checkpoint of an SGD run loaded into an Adam optimizer names the part and the class. */
    cr_assert_eq(em_checkpoint_save(p, &ck, NULL), EM_OK, "%s", em_last_error());
    run a;
    build(&a, "Adam", 1, 2, 0);
    em_checkpoint lk = ck_of(&a);
    cr_assert_neq(em_checkpoint_load(p, &lk, NULL), EM_OK);
    cr_assert(strstr(em_last_error(), "optimizer ('optim.param_groups'): ") &&
              strstr(em_last_error(), "SGD"), "%s", em_last_error());
    teardown(&a);
    teardown(&r);
    remove_dir();
}

/* The metadata entry `key` of the checkpoint at p with the integer after "field": replaced by
 * value (the first such field), written to bad as rewrite() does. */
static void rewrite_field(const char *p, const char *key, const char *field, const char *value,
                          char *bad, size_t cap) {
    em_dict *d;
    em_metadata *m;
    cr_assert_eq(em_load(p, NULL, &d, &m), EM_OK, "%s", em_last_error());
    const char *json = em_metadata_get(m, key);
    cr_assert(json, "no %s", key);
    char pat[64], text[4096];
    snprintf(pat, sizeof pat, "\"%s\":", field);
    const char *at = strstr(json, pat);
    cr_assert(at, "%s lacks %s", json, pat);
    const char *rest = at + strlen(pat);
    while (*rest == '-' || (*rest >= '0' && *rest <= '9')) rest++;
    snprintf(text, sizeof text, "%.*s%s%s%s", (int)(at - json), json, pat, value, rest);
    em_dict_free(d);
    em_metadata_free(m);
    rewrite(p, key, text, NULL, bad, cap);
}

/* Whether two snapshots are the same, part by part. */
static void assert_same(const snap *a, const snap *b, const char *what) {
    cr_assert(a->model_n == b->model_n && !memcmp(a->model, b->model, a->model_n),
              "%s: the model changed", what);
    cr_assert(a->optim_n == b->optim_n && !memcmp(a->optim, b->optim, a->optim_n),
              "%s: the optimizer's state changed", what);
    cr_assert_str_eq(a->groups, b->groups, "%s: the optimizer's groups changed", what);
    cr_assert_str_eq(a->sched, b->sched, "%s: the scheduler changed", what);
    cr_assert(a->ls.seed == b->ls.seed && a->ls.epoch == b->ls.epoch && a->ls.batch == b->ls.batch,
              "%s: the loader moved", what);
    cr_assert(a->rs.seed == b->rs.seed && a->rs.offset == b->rs.offset,
              "%s: the default generator changed", what);
}

/* Counts near INT64_MAX overflowed when training went on; a loader batch past the epoch's
 * end trained nothing and a negative one failed mid-epoch; a 0-dim optimizer state failed the
 * first step; and a bad scheduler or optimizer state was found only after the model had been
 * restored. Every field is checked first: the error names the file, the entry and the range,
 * and nothing — model, optimizer, scheduler, loader, generator — changes. */
Test(checkpoint, every_field_is_checked_before_anything_is_restored) {
    make_dir();
    char p[128], bad[128];
    file_path(p, sizeof p, "ck.safetensors");
    run r;
    build(&r, "SGD", 1, 2, 0);
    train(&r, 1, 2);
    em_checkpoint ck = ck_of(&r);
    cr_assert_eq(em_checkpoint_save(p, &ck, NULL), EM_OK, "%s", em_last_error());
    run b; /* other weights and seeds: any restore would show */
    build(&b, "SGD", 5, 6, 0);
    em_seed(4242);
    snap before = take(&b);

    static const struct { const char *key, *field, *value; em_status st; const char *needle; }
    cases[] = {
        {"loop", "step", "9223372036854775807", EM_ERR_FORMAT,
         "metadata entry 'loop': \"step\" is 9223372036854775807; expected an integer in [0, "
         "9007199254740992]"},
        {"loop", "epoch", "-3", EM_ERR_FORMAT, "'loop': \"epoch\" is -3"},
        {"loop", "epoch", "9007199254740993", EM_ERR_FORMAT, "'loop': \"epoch\" is 9007199254740993"},
        {"loader.state", "batch", "-5", EM_ERR_FORMAT,
         "'loader.state': \"batch\" is -5; expected an integer in [0, 6]"},
        {"loader.state", "batch", "1000", EM_ERR_FORMAT, "'loader.state': \"batch\" is 1000"},
        {"loader.state", "epoch", "9223372036854775807", EM_ERR_FORMAT,
         "'loader.state': \"epoch\" is 9223372036854775807"},
        {"sched.state", "last_epoch", "9223372036854775807", EM_ERR_INVALID,
         "scheduler ('sched.state'): StepLR.load_state_dict: \"last_epoch\" 9223372036854775807"},
        {"sched.state", "step_count", "-1", EM_ERR_INVALID, "scheduler ('sched.state'): "},
        {"optim.param_groups", "steps", "9223372036854775807", EM_ERR_INVALID,
         "optimizer ('optim.param_groups'): SGD.load_state_dict: \"steps\" is 9223372036854775807"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        rewrite_field(p, cases[i].key, cases[i].field, cases[i].value, bad, sizeof bad);
        em_checkpoint lk = ck_of(&b);
        cr_assert_eq(em_checkpoint_load(bad, &lk, NULL), cases[i].st, "case %zu: %s", i,
                     em_last_error());
        cr_assert(strstr(em_last_error(), cases[i].needle), "case %zu: '%s' lacks '%s'", i,
                  em_last_error(), cases[i].needle);
        cr_assert(strstr(em_last_error(), "checkpoint '") &&
                  strstr(em_last_error(), "bad.safetensors'"), "case %zu: %s", i, em_last_error());
        snap now = take(&b);
        char what[32];
        snprintf(what, sizeof what, "case %zu", i);
        assert_same(&before, &now, what);
        snap_free(&now);
    }

    /* a 0-dim optimizer state where the parameter's shape belongs */
    em_dict *d;
    em_metadata *m;
    cr_assert_eq(em_load(p, NULL, &d, &m), EM_OK, "%s", em_last_error());
    cr_assert(em_dict_has(d, "optim.state.0.momentum_buffer"));
    em_tensor *z = em_zeros(0, NULL, EM_F32, em_cpu());
    em_dict_set(d, "optim.state.0.momentum_buffer", z);
    em_tensor_release(z);
    file_path(bad, sizeof bad, "bad.safetensors");
    cr_assert_eq(em_save(d, bad, m, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(d);
    em_metadata_free(m);
    em_checkpoint lk = ck_of(&b);
    cr_assert_eq(em_checkpoint_load(bad, &lk, NULL), EM_ERR_SHAPE, "%s", em_last_error());
    cr_assert(strstr(em_last_error(), "bad.safetensors': optimizer ('optim.param_groups'): "
                     "SGD.load_state_dict: 'state.0.momentum_buffer' has shape [] but parameter "
                     "0 ('0.weight') has shape [16, 6]"), "%s", em_last_error());
    snap now = take(&b);
    assert_same(&before, &now, "0-dim state");
    snap_free(&now);

    /* the good file restores everything */
    lk = ck_of(&b);
    cr_assert_eq(em_checkpoint_load(p, &lk, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(lk.step, 2);
    cr_assert_eq(em_loader_get_state(b.dl).batch, 2);
    snap_free(&before);
    teardown(&r);
    teardown(&b);
    remove_dir();
}

/* ---- keep-last-N ------------------------------------------------------------------------------ */

Test(checkpoint, rotation_keeps_last_n) {
    make_dir();
    char pattern[128], p[128];
    file_path(pattern, sizeof pattern, "run-{step}.safetensors");
    em_module *m = make_net(1, 4, true);
    for (int64_t step = 1; step <= 5; step++) {
        em_checkpoint ck = EM_CHECKPOINT_INIT;
        ck.model = m;
        ck.step = step;
        cr_assert_eq(em_checkpoint_path(pattern, step, p, sizeof p), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_checkpoint_save(p, &ck, NULL), EM_OK, "%s", em_last_error());
        em_checkpoint_rotation rot;
        cr_assert_eq(em_checkpoint_rotate(pattern, p, 2, &rot), EM_OK, "%s", em_last_error());
        cr_assert_eq(rot.removed, step > 2 ? 1u : 0u, "step %lld removed %zu", (long long)step,
                     rot.removed);
        cr_assert_eq(rot.others, 0);
    }
    for (int64_t step = 1; step <= 5; step++) {
        cr_assert_eq(em_checkpoint_path(pattern, step, p, sizeof p), EM_OK);
        cr_assert_eq(access(p, F_OK) == 0, step >= 4, "step %lld", (long long)step);
    }
    int64_t latest;
    cr_assert_eq(em_checkpoint_latest(pattern, &latest, p, sizeof p), EM_OK, "%s", em_last_error());
    cr_assert_eq(latest, 5);
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = m;
    cr_assert_eq(em_checkpoint_load(p, &ck, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(ck.step, 5);
    em_module_free(m);
    remove_dir();
}

/* ---- map_location ------------------------------------------------------------------------------ */

Test(checkpoint_dev, map_location_onto_the_models_device) {
    make_dir();
    char p[128];
    file_path(p, sizeof p, "ck.safetensors");
    run r;
    build(&r, "SGD", 1, 2, 0);
    train(&r, 1, 2); /* momentum buffers exist */
    em_checkpoint ck = ck_of(&r);
    cr_assert_eq(em_checkpoint_save(p, &ck, NULL), EM_OK, "%s", em_last_error());

    em_device td;
    cr_assert_eq(em_device_parse("testdev:1", &td), EM_OK, "%s", em_last_error());
    em_module *m = make_net(5, N_HIDDEN, true);
    cr_assert_eq(em_module_to_device(m, td), EM_OK, "%s", em_last_error());
    em_dict *params = em_module_named_parameters(m, true);
    em_options *o = em_options_new();
    em_options_set_float(o, "lr", 0.2);
    em_options_set_float(o, "momentum", 0.9);
    em_options_set_float(o, "weight_decay", 1e-3);
    em_optimizer *opt = em_optimizer_new("SGD", params, o);
    em_options_free(o);
    em_dict_free(params);
    cr_assert(opt, "%s", em_last_error());

    em_checkpoint lk = EM_CHECKPOINT_INIT;
    lk.model = m;
    lk.optimizer = opt;
    cr_assert_eq(em_checkpoint_load(p, &lk, NULL), EM_OK, "%s", em_last_error());
    em_dict *src = em_module_state_dict(r.net), *dst = em_module_state_dict(m);
    for (size_t i = 0; i < em_dict_len(dst); i++)
        cr_assert(em_device_equal(em_tensor_device(em_dict_value(dst, i)), td), "%s",
                  em_dict_key(dst, i));
    cr_assert(st_dicts_equal(src, dst), "the model on testdev:1 differs from the saved one");
    em_dict_free(src);
    em_dict_free(dst);
    for (int i = 0; i < em_optimizer_param_total(opt); i++) {
        em_tensor *a = em_optimizer_state(r.opt, i, "momentum_buffer");
        em_tensor *b = em_optimizer_state(opt, i, "momentum_buffer");
        cr_assert(a && b, "parameter %d has no momentum buffer", i);
        cr_assert(em_device_equal(em_tensor_device(b), td));
        size_t na, nb;
        unsigned char *x = st_bytes(a, &na), *y = st_bytes(b, &nb);
        cr_assert(na == nb && memcmp(x, y, na) == 0, "momentum buffer %d differs", i);
        free(x);
        free(y);
    }
    cr_assert_eq(em_optimizer_steps(opt), em_optimizer_steps(r.opt));
    em_optimizer_free(opt);
    em_module_free(m);
    teardown(&r);
    remove_dir();
}

/* ---- run identity: rotation deletes only the writing run's files (issue 13, item 1) ---------- */

static void save_step(em_module *m, const char *pattern, const char *run_id, int64_t step,
                      char *p, size_t cap) {
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = m;
    ck.step = step;
    snprintf(ck.run_id, sizeof ck.run_id, "%s", run_id);
    cr_assert_eq(em_checkpoint_path(pattern, step, p, cap), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_checkpoint_save(p, &ck, NULL), EM_OK, "%s", em_last_error());
}

static bool step_exists(const char *pattern, int64_t step) {
    char p[256];
    cr_assert_eq(em_checkpoint_path(pattern, step, p, sizeof p), EM_OK);
    return access(p, F_OK) == 0;
}

/* An older run left higher-numbered checkpoints in the directory; a new run's own files must
 * survive its rotation (the old rotation kept the highest steps whoever wrote them, so each new
 * file was deleted right after it was written), the older run's must survive too, and
 * em_checkpoint_latest must refuse to pick between the two runs. */
Test(checkpoint, rotation_deletes_only_the_writing_runs_files) {
    char dir[4096], pattern[4200], p[256];
    st_mkdtemp(dir, sizeof dir);
    snprintf(pattern, sizeof pattern, "%s/run-{step}.safetensors", dir);
    em_module *m = make_net(1, 4, false);
    em_checkpoint_rotation rot;
    for (int64_t step = 100; step <= 300; step += 100) {
        save_step(m, pattern, "old-run", step, p, sizeof p);
        cr_assert_eq(em_checkpoint_rotate(pattern, p, 3, &rot), EM_OK, "%s", em_last_error());
    }
    /* a plain safetensors file that happens to match: no run, never deleted */
    em_dict *sd = em_module_state_dict(m);
    cr_assert_eq(em_checkpoint_path(pattern, 5, p, sizeof p), EM_OK);
    cr_assert_eq(em_save(sd, p, NULL, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(sd);
    for (int64_t step = 10; step <= 40; step += 10) {
        save_step(m, pattern, "new-run", step, p, sizeof p);
        cr_assert_eq(em_checkpoint_rotate(pattern, p, 2, &rot), EM_OK, "%s", em_last_error());
        cr_assert(access(p, F_OK) == 0, "step %lld: the file just written was deleted",
                  (long long)step);
        cr_assert_eq(rot.removed, step > 20 ? 1u : 0u, "step %lld", (long long)step);
        cr_assert_eq(rot.others, 4u); /* the old run's three and the plain file */
        cr_assert_eq(rot.others_newest_step, 300);
    }
    const int64_t alive[] = {5, 30, 40, 100, 200, 300}, gone[] = {10, 20};
    for (size_t i = 0; i < ST_ARRAY_LEN(alive); i++)
        cr_assert(step_exists(pattern, alive[i]), "step %lld was deleted", (long long)alive[i]);
    for (size_t i = 0; i < ST_ARRAY_LEN(gone); i++)
        cr_assert(!step_exists(pattern, gone[i]), "step %lld survived", (long long)gone[i]);

    /* Two runs: which one is "the latest" is refused, naming both. */
    int64_t latest = -1;
    cr_assert_eq(em_checkpoint_latest(pattern, &latest, p, sizeof p), EM_ERR_STATE);
    cr_assert(strstr(em_last_error(), "run 'old-run' (3 files, steps 100 to 300") &&
              strstr(em_last_error(), "run 'new-run' (2 files, steps 30 to 40") &&
              strstr(em_last_error(), "run-40.safetensors") &&
              strstr(em_last_error(), "no recorded run (1 file, step 5"), "%s", em_last_error());

    /* The listing: highest step first, each file's run. */
    em_checkpoint_files *l;
    cr_assert_eq(em_checkpoint_list(pattern, &l), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_checkpoint_files_len(l), 6u);
    const em_checkpoint_file *f = em_checkpoint_files_get(l, 0);
    cr_assert(f->step == 300 && !strcmp(f->run_id, "old-run") && f->is_checkpoint &&
              f->status == EM_OK && !f->error && strstr(f->path, "/run-300.safetensors"));
    f = em_checkpoint_files_get(l, 5);
    cr_assert(f->step == 5 && !f->run_id[0] && !f->is_checkpoint && f->status == EM_OK);
    cr_assert_null(em_checkpoint_files_get(l, 6));
    em_checkpoint_files_free(l);

    /* A run resumed from an older checkpoint of its own: keep 1 keeps its highest step (300)
     * and never the file just written (150), whatever the keep count says. */
    save_step(m, pattern, "old-run", 150, p, sizeof p);
    cr_assert_eq(em_checkpoint_rotate(pattern, p, 1, &rot), EM_OK, "%s", em_last_error());
    cr_assert_eq(rot.removed, 2u);
    cr_assert(step_exists(pattern, 150) && step_exists(pattern, 300));
    cr_assert(!step_exists(pattern, 100) && !step_exists(pattern, 200));
    cr_assert(step_exists(pattern, 30) && step_exists(pattern, 40) && step_exists(pattern, 5));

    /* Arguments: a written file outside the pattern, one recording no run, one missing. */
    char other[4200];
    snprintf(other, sizeof other, "%s/other.safetensors", dir);
    save_step(m, pattern, "x", 1, p, sizeof p);
    cr_assert_eq(rename(p, other), 0);
    cr_assert_eq(em_checkpoint_rotate(pattern, other, 1, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "is not one of the files of the pattern");
    cr_assert_eq(em_checkpoint_path(pattern, 5, p, sizeof p), EM_OK);
    cr_assert_eq(em_checkpoint_rotate(pattern, p, 1, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "records no run");
    cr_assert_eq(em_checkpoint_path(pattern, 7, p, sizeof p), EM_OK);
    cr_assert_eq(em_checkpoint_rotate(pattern, p, 1, NULL), EM_ERR_NOTFOUND);
    cr_assert_eq(em_checkpoint_rotate(pattern, NULL, 1, NULL), EM_ERR_INVALID);
    cr_assert(step_exists(pattern, 5), "a refused rotation deleted something");
    em_module_free(m);
    st_rmdir(dir);
}

/* The identity goes into the file and comes back on load; an empty one is this process's. */
Test(checkpoint, run_identity_round_trip) {
    char dir[4096], a[4200], b[4200];
    st_mkdtemp(dir, sizeof dir);
    snprintf(a, sizeof a, "%s/a.safetensors", dir);
    snprintf(b, sizeof b, "%s/b.safetensors", dir);
    em_module *m = make_net(1, 4, false);
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = m;
    cr_assert_eq(em_checkpoint_save(a, &ck, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_checkpoint_save(b, &ck, NULL), EM_OK, "%s", em_last_error());
    em_checkpoint la = EM_CHECKPOINT_INIT, lb = EM_CHECKPOINT_INIT;
    la.model = lb.model = m;
    cr_assert_eq(em_checkpoint_load(a, &la, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_checkpoint_load(b, &lb, NULL), EM_OK, "%s", em_last_error());
    cr_assert(la.run_id[0] && !strcmp(la.run_id, lb.run_id), "'%s' '%s'", la.run_id, lb.run_id);
    char pid[32];
    snprintf(pid, sizeof pid, "-%ld-", (long)getpid());
    cr_assert(strstr(la.run_id, pid), "the process's run '%s' lacks its pid", la.run_id);
    /* a new identity differs; saving with it records it */
    char fresh[EM_CHECKPOINT_RUN_ID_MAX];
    cr_assert_eq(em_checkpoint_run_id_new(fresh, sizeof fresh), EM_OK);
    cr_assert_str_neq(fresh, la.run_id);
    cr_assert_eq(em_checkpoint_run_id_new(fresh, 8), EM_ERR_RANGE);
    cr_assert_eq(em_checkpoint_run_id_new(fresh, sizeof fresh), EM_OK);
    snprintf(ck.run_id, sizeof ck.run_id, "%s", fresh);
    cr_assert_eq(em_checkpoint_save(a, &ck, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_checkpoint_load(a, &la, NULL), EM_OK, "%s", em_last_error());
    cr_assert_str_eq(la.run_id, fresh);
    /* not an identity: refused on save, and on load when a file carries one */
    snprintf(ck.run_id, sizeof ck.run_id, "two words");
    cr_assert_eq(em_checkpoint_save(a, &ck, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "is not a run identity");
    memset(ck.run_id, 'x', sizeof ck.run_id);
    cr_assert_eq(em_checkpoint_save(a, &ck, NULL), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "not terminated");
    em_dict *d;
    em_metadata *meta;
    cr_assert_eq(em_load(a, NULL, &d, &meta), EM_OK, "%s", em_last_error());
    em_metadata_set(meta, EM_CHECKPOINT_RUN_KEY, "a/b");
    cr_assert_eq(em_save(d, b, meta, NULL), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_checkpoint_load(b, &lb, NULL), EM_ERR_FORMAT);
    em_assert_error(EM_ERR_FORMAT, "'ember.run' is not a run identity");
    em_checkpoint_files *l;
    snprintf(a, sizeof a, "%s/{step}b.safetensors", dir); /* matches nothing: "b" has no step */
    cr_assert_eq(em_checkpoint_list(a, &l), EM_OK);
    cr_assert_eq(em_checkpoint_files_len(l), 0u);
    em_checkpoint_files_free(l);
    em_dict_free(d);
    em_metadata_free(meta);
    em_module_free(m);
    st_rmdir(dir);
}
