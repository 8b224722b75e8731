/*
 * fuzz_checkpoint.c — fuzz target for the checkpoint reader (em_checkpoint_load, the
 * --resume path: the safetensors reader with its header-first plan, then the checkpoint's
 * metadata — format, parts, optimizer groups, scheduler, loader position, generator, loop
 * state). The input is the checkpoint file. It is loaded into freshly made objects each time:
 * a model (Linear 3 -> 2), an Adam optimizer (moments and a step count per parameter), a
 * StepLR scheduler and a loader over 10 items in batches of 4. Either the load succeeds or it
 * fails with a message naming the file; a status of EM_ERR_INTERNAL or EM_ERR_NOMEM, a crash,
 * a sanitizer report or an allocation past the fuzzer's limit is a finding. Fuzzed by
 * tests/fuzz/run.sh checkpoint; `make check` replays tests/fuzz/corpus/checkpoint/ and
 * tests/fuzz/crashes/checkpoint/ (tests/fuzz/replay.c).
 *
 * With FUZZ_CHECKPOINT_WRITE_SEEDS=DIR in the environment, LLVMFuzzerInitialize writes the
 * seed checkpoints of tests/fuzz/make_corpus.py into DIR instead (see there).
 */
#include "fuzz.h"

typedef struct objs {
    em_module *model;
    em_optimizer *opt;
    em_scheduler *sched;
    em_dataset *ds;
    em_loader *loader;
} objs;

static void objs_free(objs *b) {
    em_loader_free(b->loader);
    em_dataset_free(b->ds);
    em_scheduler_free(b->sched);
    em_optimizer_free(b->opt);
    em_module_free(b->model);
}

static objs objs_make(void) {
    objs b = {0};
    em_options *o = em_options_new();
    em_options_set_text(o, "in_features", "3", NULL);
    em_options_set_text(o, "out_features", "2", NULL);
    b.model = em_module_new("Linear", o);
    em_options_free(o);
    if (!b.model) FUZZ_FINDING("Linear: %s", em_last_error());
    em_dict *params = em_module_named_parameters(b.model, true);
    b.opt = em_optimizer_new("Adam", params, NULL);
    em_dict_free(params);
    if (!b.opt) FUZZ_FINDING("Adam: %s", em_last_error());
    o = em_options_new();
    em_options_set_text(o, "step_size", "2", NULL);
    b.sched = em_scheduler_new("StepLR", b.opt, o);
    em_options_free(o);
    if (!b.sched) FUZZ_FINDING("StepLR: %s", em_last_error());
    em_scope_begin();
    em_tensor *x = em_zeros(2, (int64_t[]){10, 3}, EM_F32, em_cpu());
    em_tensor *y = em_zeros(1, (int64_t[]){10}, EM_I64, em_cpu());
    b.ds = em_dataset_from_tensors(x, y, 2);
    em_scope_end();
    em_loader_options lo = {.struct_size = sizeof lo, .batch_size = 4, .shuffle = true};
    if (!b.ds || !(b.loader = em_loader_new(b.ds, &lo))) FUZZ_FINDING("loader: %s", em_last_error());
    return b;
}

static em_checkpoint ck_of(const objs *b) {
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = b->model;
    ck.optimizer = b->opt;
    ck.scheduler = b->sched;
    ck.loader = b->loader;
    return ck;
}

/* The seeds: a checkpoint before any step, and one after two training steps (the optimizer
 * has state), with a config and loop state. */
static void write_seeds(const char *dir) {
    objs b = objs_make();
    char path[4096];
    em_checkpoint ck = ck_of(&b);
    snprintf(path, sizeof path, "%s/valid_fresh", dir);
    if (em_checkpoint_save(path, &ck, NULL) != EM_OK) FUZZ_FINDING("save: %s", em_last_error());
    for (int s = 0; s < 2; s++) {
        em_scope_begin();
        em_tensor *x, *y;
        if (em_loader_next(b.loader, &x, &y) != EM_OK || !x) FUZZ_FINDING("next: %s", em_last_error());
        em_tensor *out = em_module_forward(b.model, x);
        em_tensor *loss = em_sum(em_mul(out, out), 0, NULL, false);
        if (em_backward(loss) != EM_OK || em_optimizer_step(b.opt) != EM_OK ||
            em_scheduler_step(b.sched, NAN) != EM_OK)
            FUZZ_FINDING("step: %s", em_last_error());
        em_scope_end();
    }
    ck.epoch = 1;
    ck.step = 2;
    ck.best_metric = 0.5;
    ck.config = "{\"model\": [\"Linear\"]}";
    snprintf(path, sizeof path, "%s/valid_trained", dir);
    if (em_checkpoint_save(path, &ck, NULL) != EM_OK) FUZZ_FINDING("save: %s", em_last_error());
    objs_free(&b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_init("fuzz_checkpoint");
    const char *seeds = getenv("FUZZ_CHECKPOINT_WRITE_SEEDS");
    if (seeds && *seeds) {
        write_seeds(seeds);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("input.ckpt", data, size);
    objs b = objs_make();
    em_checkpoint ck = ck_of(&b);
    em_clear_error();
    em_status st = em_checkpoint_load(path, &ck, NULL);
    if (st != EM_OK) {
        if (st == EM_ERR_INTERNAL || st == EM_ERR_NOMEM)
            FUZZ_FINDING("em_checkpoint_load: %s: %s", em_status_name(st), em_last_error());
        if (!strstr(em_last_error(), path))
            FUZZ_FINDING("em_checkpoint_load: the message does not name the file: %s",
                         em_last_error());
    }
    fuzz_result("em_checkpoint_load", st == EM_OK);
    em_host_free(ck.config_out);
    objs_free(&b);
    return 0;
}
