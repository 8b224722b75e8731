/*
 * ember/checkpoint.h — everything a training run needs to resume, in one safetensors file:
 * the model, the optimizer, the scheduler, a DataLoader's position and seed, the default
 * generator's state, the loop counters (epoch, step, best metric) and the training config.
 *
 *     em_checkpoint ck = EM_CHECKPOINT_INIT;
 *     ck.model = model; ck.optimizer = opt; ck.scheduler = sched; ck.loader = dl;
 *     ck.epoch = epoch; ck.step = step; ck.best_metric = best; ck.config = config_json;
 *     char path[256];
 *     em_checkpoint_path("ckpt/run-{step}.safetensors", step, path, sizeof path);
 *     if (em_checkpoint_save(path, &ck, NULL) != EM_OK ||
 *         em_checkpoint_rotate("ckpt/run-{step}.safetensors", path, 3, NULL) != EM_OK) // keep 3
 *         fprintf(stderr, "%s\n", em_last_error());
 *
 *     // later, in a new process: build the same model, optimizer, scheduler and loader from
 *     // the config, then restore them in place
 *     em_checkpoint ck = EM_CHECKPOINT_INIT;
 *     ck.model = model; ck.optimizer = opt; ck.scheduler = sched; ck.loader = dl;
 *     if (em_checkpoint_load(path, &ck, NULL) != EM_OK)
 *         fprintf(stderr, "%s\n", em_last_error());
 *         // checkpoint 'ckpt/run-1200.safetensors': model: 1 missing key (fc2.bias), ...
 *     // ck.epoch, ck.step, ck.best_metric hold the saved loop state; ck.config_out the
 *     // config (em_host_free it); ck.run_id the run, which later saves from ck continue
 *
 * Resume is exact: training N steps, saving, loading the file into freshly made objects (in
 * a new process) and training on gives bit-for-bit the parameters of the uninterrupted run on
 * the CPU — dropout included, because the default generator's state is in the file, and in
 * the middle of an epoch too, because the loader's position is. What the file does NOT hold:
 * the objects' structure (the program recreates the model, optimizer, scheduler and loader
 * the same way, e.g. from the saved config), train/eval mode, the dataset, and generators the
 * program made itself (em_generator_new).
 *
 * The file. An ordinary safetensors file (ember/serialize.h: crash-safe writes, readable by
 * Python's safetensors). Tensors: the model's state dict under "model.<key>", the optimizer's
 * state tensors under "optim.state.<index>.<name>". Everything else is in the header's
 * __metadata__ (string to string):
 *   ember.checkpoint    "1" — the format version; its presence makes the file a checkpoint
 *   ember.version       the Ember version that wrote it (em_version())
 *   ember.parts         the parts present, comma-separated: model, optimizer, scheduler,
 *                       loader, scaler (the default generator and the loop state are always
 *                       saved)
 *   ember.run           the run that wrote it (em_checkpoint.run_id; rotation keys on it)
 *   optim.param_groups  the optimizer's groups JSON (em_optimizer_state_dict)
 *   sched.state         the scheduler's JSON (em_scheduler_state_dict)
 *   amp.scaler          the gradient scaler's JSON (em_grad_scaler_state_dict)
 *   loader.state        {"seed":"<u64>","epoch":E,"batch":B} (em_loader_get_state)
 *   rng.default         {"seed":"<u64>","offset":"<u64>"} (em_generator_get_state(NULL))
 *   loop                {"epoch":E,"step":S,"best_metric":M} (M: a number, "inf", "-inf" or
 *                       "nan"; NaN means none yet)
 *   config              the config text, when one was given
 * The caller's own metadata (em_checkpoint_save's `metadata`) joins these; its keys must not
 * be "loop" or "config" or start with "ember.", "model.", "optim.", "sched.", "loader.",
 * "amp." or "rng.".
 *
 * Keep-last-N: name the files by step with em_checkpoint_path and, after each save, call
 * em_checkpoint_rotate(pattern, path, N, NULL) (ember/serialize.h; N = 0 keeps
 * EM_CHECKPOINT_KEEP_DEFAULT, 3): it deletes only the older files of the run that wrote path.
 * em_checkpoint_latest finds the newest file to resume from, and refuses when the directory
 * holds several runs' files (em_checkpoint_list tells them apart). Since every save is atomic,
 * a crash during a save or a rotation never leaves fewer than the previous good files.
 */
#ifndef EMBER_CHECKPOINT_H
#define EMBER_CHECKPOINT_H

#include <math.h>
#include <stdint.h>

#include "ember/data.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/grad_scaler.h"
#include "ember/module.h"
#include "ember/optim.h"
#include "ember/serialize.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The parts of a checkpoint. Every pointer may be NULL: that part is neither saved nor
 * restored. The objects stay the caller's. */
typedef struct em_checkpoint {
    size_t struct_size;       /* sizeof(em_checkpoint) */
    em_module *model;
    em_optimizer *optimizer;
    em_scheduler *scheduler;
    em_loader *loader;
    /* Loop state: saved from these fields, and written into them by em_checkpoint_load. */
    int64_t epoch;
    int64_t step;
    double best_metric;       /* NaN: none yet (EM_CHECKPOINT_INIT sets NaN) */
    /* Save: the config text to store (borrowed; NULL: none), usually JSON. */
    const char *config;
    /* Load: the stored config as a new string (free with em_host_free), or NULL when the
     * file has none. Overwritten without being read or freed. */
    char *config_out;
    /* The run this checkpoint belongs to ("Run identity" in ember/serialize.h), saved as
     * "ember.run". Save: empty means this process's run, an identity em_checkpoint_save makes
     * once per process (as em_checkpoint_run_id_new does). Load: set from the file ("" when it
     * records none). A resumed run keeps what the load set, so that its saves are the same
     * run's and em_checkpoint_rotate deletes its older files, and no other run's. */
    char run_id[EM_CHECKPOINT_RUN_ID_MAX];
    void *ext;                /* reserved; NULL */
    /* ---- added in 1.1 ---- */
    em_grad_scaler *scaler;   /* mixed precision's gradient scaler (ember/grad_scaler.h) */
} em_checkpoint;
#define EM_CHECKPOINT_INIT { .struct_size = sizeof(em_checkpoint), .best_metric = NAN }

/*
 * Write the checkpoint ck to path (one safetensors file, laid out as described at the top of
 * this file), crash-safely (em_save: a temporary file renamed over the target; on any error
 * the previous file at path is untouched). Also saves the default generator's state.
 * metadata (may be NULL) adds the caller's own string entries.
 *
 * Errors: EM_ERR_INVALID for a NULL path or ck, a bad struct_size, a reserved metadata key
 * (named), a config that is not valid UTF-8, a run_id that is not a run identity (not
 * terminated within the array, or a character outside A-Z a-z 0-9 . _ : + @ -); the
 * state-dict functions' errors; em_save's
 * errors (EM_ERR_IO naming the file and the reason, ...).
 */
EM_API em_status em_checkpoint_save(const char *path, const em_checkpoint *ck,
                                    const em_metadata *metadata /* may be NULL */);

/* A new run identity into buf (cap >= EM_CHECKPOINT_RUN_ID_MAX): "HOST-YYYYMMDDTHHMMSS-PID-R"
 * with this host's name (as in temporary file names), the local time, the pid and 8 random hex
 * digits. EM_ERR_RANGE when cap is too small. */
EM_API em_status em_checkpoint_run_id_new(char *buf, size_t cap);

typedef struct em_checkpoint_load_options {
    size_t struct_size;             /* sizeof(em_checkpoint_load_options) */
    /* When not NULL, receives the file's whole metadata (a new em_metadata; free it), for the
     * caller's own entries. */
    em_metadata **metadata_out;
    void *ext;                      /* reserved; NULL */
} em_checkpoint_load_options;
#define EM_CHECKPOINT_LOAD_OPTIONS_INIT { .struct_size = sizeof(em_checkpoint_load_options) }

/*
 * Restore the parts ck names from the checkpoint at path, in place: the model's parameters
 * and buffers (strict: every key of the model's state dict must be in the file and every
 * model.* tensor of the file must belong to the model, with equal shapes; dtypes convert),
 * the optimizer (its groups' hyper-parameters, step count and state tensors), the scheduler,
 * the loader's seed and position (em_loader_set_state), the default generator, and the loop
 * state into ck->epoch, ck->step, ck->best_metric, ck->run_id and ck->config_out. Parts ck
 * leaves NULL are not restored (a model alone loads from a full checkpoint). opt may be NULL.
 *
 * map_location: the file holds nothing device-specific; the tensors are read onto the
 * model's device (the device of its first state-dict tensor; the CPU without a model) and
 * copied into each target on its own device, whatever machine wrote the file.
 *
 * Every field is checked before anything is restored, and every problem of a kind is named
 * at once; each message starts "checkpoint 'PATH': ":
 *   em_load's errors (EM_ERR_NOTFOUND, EM_ERR_IO, EM_ERR_FORMAT naming the file);
 *   EM_ERR_FORMAT: not a checkpoint (no ember.checkpoint), a format version this Ember does
 *     not read, a tensor outside model.* and optim.*, a metadata entry that is missing or
 *     malformed (naming the key, the field and what is wrong) — loop.epoch, loop.step and
 *     the loader's epoch must be integers in [0, EM_STEP_MAX] (ember/optim.h), the loader's
 *     batch in [0, em_loader_num_batches(ck->loader)];
 *   EM_ERR_NOTFOUND: parts ck asks for that the file lacks (all named, with what it holds);
 *   EM_ERR_INVALID (or EM_ERR_SHAPE, EM_ERR_DTYPE): the model's missing keys, unexpected keys
 *     and shape mismatches, all listed; the optimizer's or scheduler's own refusal (a
 *     different class, group or parameter count, a state of the wrong shape or dtype, a count
 *     out of range), prefixed with the part's name and its metadata key.
 * On any error nothing is restored: the model, optimizer, scheduler, loader and default
 * generator are as they were, and ck->config_out is NULL.
 */
EM_API em_status em_checkpoint_load(const char *path, em_checkpoint *ck,
                                    const em_checkpoint_load_options *opt /* may be NULL */);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_CHECKPOINT_H */
