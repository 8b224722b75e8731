/*
 * trainer.h — what ember-train's two halves share: the run's settings (config file merged
 * with the command line), the objects built from them, and the loop's entry points.
 *
 *   ember-train.c  command line, config sections -> settings, building the model, data,
 *                  loss, optimizer and scheduler; output checks; signals; --help,
 *                  --list-plugins, --summary, exit codes
 *   loop.c         the training loop, evaluation, checkpoints, metrics, predictions, progress
 */
#ifndef EMBER_TRAINER_H
#define EMBER_TRAINER_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ember/config.h"
#include "ember/data.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/optim.h"
#include "ember/serialize.h"

/* Exit codes (documented in --help and the README). */
enum {
    EXIT_OK = 0,
    EXIT_TRAIN = 1,       /* a training failure: NaN/Inf loss, an op error mid-run, a file
                           * (checkpoint, weights, metrics, predictions) not written */
    EXIT_USAGE = 2,       /* command line, config file, data or model that does not fit */
    EXIT_INTERRUPTED = 130, /* SIGINT/SIGTERM: stopped after the step (checkpoint saved) */
};

typedef struct settings {
    const char *config_path;
    char device[32];
    bool device_given;
    int64_t epochs, max_steps, batch_size, accum_steps, workers, limit_batches, overfit_batches;
    int64_t keep;
    int64_t early_stop;            /* epochs without a better validation metric; 0: off */
    uint64_t seed;
    double clip_grad_norm;
    bool deterministic, shuffle;
    const char *init_weights, *save_weights, *checkpoint, *resume, *metrics, *predict;
    bool init_nonstrict, eval_only, summary, memory_summary, profile, anomaly, dry_run;
    /* progress and metrics (issue 23) */
    bool quiet;                    /* --quiet: errors, warnings and the summary only */
    int64_t log_every;             /* --log-every N: every N steps; 0: by time */
    double log_every_s;            /* --log-every Ts: every T seconds (default 10) */
    const char *metrics_steps;     /* --metrics-steps FILE */
    const char *save_best;         /* --save-best FILE */
    int predict_scores;            /* --predict-scores: PREDICT_* */
    int64_t eval_batch_size;       /* loop.eval_batch_size / --eval-batch-size (default:
                                    * batch_size) */
    const char *tensorboard;       /* --tensorboard DIR */
    bool tensorboard_histograms;   /* --tensorboard-histograms / loop.tensorboard_histograms */
    /* --generate N (0: no generation) from --prompt TEXT, --temperature T (> 0; 1), --top-k K
     * (0: every token) */
    int64_t generate, top_k;
    const char *prompt;
    double temperature;
    int argc;                      /* the command line, for the resume command on a signal */
    char **argv;
} settings;

enum { PREDICT_LABELS, PREDICT_LOGITS, PREDICT_PROBABILITIES };

/* The sums behind an epoch's figures, so that an epoch resumed mid-way reports them over all
 * its batches (checkpointed as train.epoch_* metadata when a checkpoint is mid-epoch). */
typedef struct epoch_sums {
    double loss;                   /* sum of batch loss x batch size */
    double metric;                 /* correct predictions, or the sum of per-sample MAEs */
    double grad_norm;              /* sum of the steps' gradient norms (before clipping) */
    double time_s, wait_s;         /* training time of the epoch, and the loader's share */
    int64_t samples, grad_norms;   /* samples trained on; steps whose norm is in grad_norm */
} epoch_sums;

/* Entries of a data.transforms list. */
#define TF_MAX 32

typedef struct run {
    settings s;
    em_device dev;
    em_config *cfg;
    em_module *model, *loss;
    const char *loss_class;
    em_dataset *train_full, *train, *val, *test;
    em_transforms tf;              /* data.transforms as a map (the 1.0 keys) */
    float tf_mean[8], tf_std[8];
    /* data.transforms as a list of classes: specs (names and fields borrowed from the
     * config), their option bags (owned), and which apply to the training loader only */
    em_transform_spec tspec[TF_MAX];
    em_options *topt[TF_MAX];
    bool ttrain_only[TF_MAX];
    int n_tspec;
    em_optimizer *opt;
    em_scheduler *sched;
    bool sched_per_step;
    em_dict *params;               /* trainable parameters (for clipping) */
    const em_dataset_info *info;   /* the chosen fields of the training set (finfo) */
    /* data.inputs / data.target: the fields that feed the model (in order) and the target;
     * names borrowed from the config or static; the first padded input's mask is handed to
     * the layers that take one (em_module_forward_masked) */
#define IN_MAX 8
    const char *in_names[IN_MAX];
    int n_in;
    const char *tg_name;
    int mask_in;                   /* index into in_names of the first padded input; -1 */
    em_dataset_info finfo;         /* input: in_names[0] (longest length), target: tg_name */
    /* loop state (checkpointed) */
    int64_t epoch, batch, step;
    double best_metric;
    int64_t best_epoch;
    epoch_sums part;               /* the epoch in progress (checkpointed mid-epoch) */
    int64_t best_saved_epoch;      /* --save-best: the epoch this run saved; -1: none */
    char run_id[EM_CHECKPOINT_RUN_ID_MAX]; /* new, or the resumed checkpoint's (checkpointed) */
    char last_saved[4096];         /* this run's last checkpoint saved ("" when none) */
    int64_t last_saved_step;
    size_t others_seen;            /* files matching --checkpoint not this run's, last warned */
    /* SIGINT or SIGTERM once a signal asked the loop to stop; 0 until then */
    atomic_int *stop;
    em_profiler *profiler;         /* --profile: the ops of this (the training) thread */
} run;

/* loop.c */
/* Whether the target field holds one class index per position ((L) int64 with classes: a
 * language model's next tokens). */
bool sequence_targets(const run *r);
/* The loss of the model's output against the targets: r->loss on (out, y), or for sequence
 * targets on out (B, L, C) and y (B, L) flattened to (B * L, C) and (B * L), so the mean is
 * over tokens. NULL + error (EM_ERR_SHAPE naming both shapes when they do not fit). */
em_tensor *loss_forward(const run *r, em_tensor *out, em_tensor *y);
int train_loop(run *r);
/* generate.c: --generate (needs --init-weights with the text.* vocabulary metadata). */
int generate_text(run *r);
int evaluate_only(run *r);
int dry_run(run *r);
em_status checkpoint_load(run *r, const char *path);
void checkpoint_prepare(run *r, bool dry);

/* ember-train.c: the signal thread's side of the saves (see "signals" there). A save is
 * announced before it starts — stop_save_begin never returns once a second signal is stopping
 * the process, so no save is cut short that the message would call saved — and after it ends
 * (`checkpoint`: it was a checkpoint and it was written, at `step`). */
void report_error(const char *what);
/* An informational message to stderr ("ember-train: " is the caller's), unless --quiet. */
void say(const run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void stop_save_begin(const char *what, const char *path);
void stop_save_end(bool checkpoint, int64_t step);
void stop_training_over(void); /* the loop is done: any signal now stops at once */
int stop_repeats(void);        /* repeated signals taken as the first */

#endif /* EMBER_TRAINER_H */
