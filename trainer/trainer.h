/*
 * trainer.h — what ember-train's two halves share: the run's settings (config file merged
 * with the command line), the objects built from them, and the loop's entry points.
 *
 *   ember-train.c  command line, config sections -> settings, building the model, data,
 *                  loss, optimizer and scheduler; output checks; signals; --help,
 *                  --list-plugins, --summary, exit codes
 *   loop.c         the training loop, evaluation, checkpoints, metrics, predictions, progress
 *   ddp.c          data parallelism under mpirun: the communicator, the ranks' agreement
 */
#ifndef EMBER_TRAINER_H
#define EMBER_TRAINER_H

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ember/comm.h"
#include "ember/config.h"
#include "ember/ddp.h"
#include "ember/data.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/error.h"
#include "ember/grad_scaler.h"
#include "ember/module.h"
#include "ember/optim.h"
#include "ember/random.h"
#include "ember/serialize.h"
#include "ember/trace.h" /* em_profiler */

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
    bool graph_capture;            /* --graph-capture / loop.graph_capture (loop.c) */
    const char *init_weights, *save_weights, *checkpoint, *resume, *metrics, *predict;
    const char *export_onnx;       /* --export-onnx FILE (docs/onnx.md) */
    const char *init_onnx;         /* --init-onnx FILE: the model, imported */
    bool init_nonstrict, eval_only, summary, memory_summary, profile, anomaly, dry_run;
    /* progress and metrics (issue 23) */
    bool quiet;                    /* --quiet: errors and the summary only */
    int64_t log_every;             /* --log-every N: every N steps; 0: by time */
    double log_every_s;            /* --log-every Ts: every T seconds (default 10) */
    const char *metrics_steps;     /* --metrics-steps FILE */
    const char *save_best;         /* --save-best FILE */
    int predict_scores;            /* --predict-scores: PREDICT_* */
    int64_t eval_batch_size;       /* loop.eval_batch_size / --eval-batch-size (default:
                                    * batch_size) */
    const char *tensorboard;       /* --tensorboard DIR */
    bool tensorboard_histograms;   /* --tensorboard-histograms / loop.tensorboard_histograms */
    char amp[8];                   /* --amp / loop.amp: "bf16", "fp16" or "" (off) */
    double amp_init_scale;         /* loop.amp_init_scale: the scaler's init_scale (0: 65536) */
    int64_t amp_growth_interval;   /* loop.amp_growth_interval (0: 2000) */
    /* --generate N (0: no generation) from --prompt TEXT, --temperature T (> 0; 1), --top-k K
     * (0: every token) */
    int64_t generate, top_k;
    const char *prompt;
    double temperature;
    const char *trace;             /* --trace FILE: the profiler's Chrome trace (implies profile) */
    const char *plot;              /* --plot FILE: training curves, .png or .svg */
    /* data parallelism (ddp.c) */
    double ddp_bucket_mib;         /* --ddp-bucket-mib; 0: 25 (PyTorch's bucket_cap_mb) */
    bool sync_batchnorm;           /* --sync-batchnorm */
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

/* The run's place in a data-parallel job (ddp.c); rank 0 of a world of 1 in a plain run. */
typedef struct ddp_state {
    em_comm *comm;                 /* NULL: a plain run (MPI never started) */
    em_ddp *ddp;                   /* the model's wrapper, once ddp_wrap made it */
    int rank, world;
    bool agreed;                   /* a non-zero exit code every rank knows (ddp_agree) */
    int first_failed;              /* the lowest rank with a non-zero code at the last
                                    * ddp_agree; -1: none */
    bool have_rng;                 /* --resume read this rank's generator state */
    em_rng_state rng;
} ddp_state;

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
    em_grad_scaler *scaler;        /* --amp fp16: the gradient scaler (checkpointed) */
    ddp_state d;
} run;

/* Whether this process speaks for the run: writes files, prints progress and figures. */
static inline bool primary(const run *r) { return r->d.rank == 0; }

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
/* --export-onnx: the model with its evaluation input transforms as ONNX; false after the
 * message. */
bool write_onnx(run *r);
em_status checkpoint_load(run *r, const char *path);
void checkpoint_prepare(run *r, bool dry);

/* ddp.c. Every function taking a run is collective in a data-parallel run (every rank calls
 * it at the same point) and does nothing in a plain one. */
const char *ddp_launcher(void);  /* the launcher variable found in the environment, or NULL */
/* Join the job when an MPI launcher started the process (0, or an exit code after the
 * message). */
int ddp_start(run *r);
/* A setting every rank must share: a number, or a hash of a text or a file. */
typedef struct ddp_setting {
    const char *name;
    int64_t value;                 /* the number, a double's bits, or the hash */
    enum { DDP_INT, DDP_REAL, DDP_HASH } kind;
} ddp_setting;
int64_t ddp_hash_text(const char *s);
int64_t ddp_hash_file(const char *path); /* -1: unreadable */
/* Rank 0 names the first setting where a rank differs from it; EXIT_USAGE on every rank. */
int ddp_check_same(run *r, const ddp_setting *set, int n);
/* Wrap the model (broadcasting rank 0's weights) and set this rank's random stream: the one
 * --resume read, else one of its own (from the seed and the rank). 0 or an exit code. */
int ddp_wrap(run *r);
/* v[0..n) becomes the sum over the ranks (a failure of the communicator ends the process). */
em_status ddp_sum(run *r, double *v, int n);
/* rc, or the first non-zero exit code of any rank (then known to every rank). */
int ddp_agree(run *r, int rc);
/* Leave at once with rc when it is a failure the other ranks do not know of. */
void ddp_exit(run *r, int rc);
void ddp_free(run *r);
/* The checkpoint's "train.rng_ranks": every rank's generator state (malloc'd text, on rank 0;
 * NULL on the others and in a plain run). */
em_status ddp_rng_text(run *r, char **text);
/* This rank's state from "train.rng_ranks" into r->d.rng. */
em_status ddp_rng_parse(run *r, const char *path, const char *text);
/* Rank 0's checkpoint status s (and *saved) on every rank: the others get an error naming path
 * when rank 0 failed. */
em_status ddp_share_status(run *r, em_status s, bool *saved, const char *path);

/* ember-train.c: the signal thread's side of the saves (see "signals" there). A save is
 * announced before it starts — stop_save_begin never returns once a second signal is stopping
 * the process, so no save is cut short that the message would call saved — and after it ends
 * (`checkpoint`: it was a checkpoint and it was written, at `step`). */
void report_error(const char *what);
/* An informational message to stderr ("ember-train: " is the caller's), unless --quiet. */
void say(const run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A warning to stderr ("ember-train: warning: ..." is the caller's), unless --quiet. */
void warn(const run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void stop_save_begin(const char *what, const char *path);
void stop_save_end(bool checkpoint, int64_t step);
void stop_training_over(void); /* the loop is done: any signal now stops at once */
int stop_repeats(void);        /* repeated signals taken as the first */

#endif /* EMBER_TRAINER_H */
