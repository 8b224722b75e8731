/*
 * metrics.h — the figures ember-train's loop reports, and the sinks that record them.
 *
 * The loop (loop.c) fills one step_row every --log-every steps and one epoch_row per epoch
 * and hands each to every open sink: the --metrics file (epoch rows), the --metrics-steps
 * file (step rows, CSV or JSONL), the --tensorboard event files (both, as scalars; optional
 * histograms of the parameters and their gradients once per epoch). A sink that fails says
 * why in its err and the loop stops as it does for any file it cannot write (EXIT_TRAIN, the
 * checkpoint kept).
 */
#ifndef EMBER_TRAINER_METRICS_H
#define EMBER_TRAINER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/dict.h"

#define METRIC_GROUPS_MAX 16   /* parameter groups whose lr a step row carries */

/* One row of --metrics-steps: the figures since the previous row. */
typedef struct step_row {
    int64_t step;              /* optimizer steps done (the row is written after step `step`) */
    int64_t epoch;             /* 1-based */
    double loss;               /* mean training loss over the steps since the previous row */
    int n_groups;
    double lr[METRIC_GROUPS_MAX]; /* per parameter group, as the step used it */
    double grad_norm;          /* total L2 norm of the gradients before clipping, at the last
                                  step of the row; NAN when it was not computed */
    double samples_s;          /* training samples per second since the previous row */
    double data_wait_s;        /* seconds the loop waited for the loader since the previous row */
    /* mixed precision (--amp fp16): the gradient scaler's figures; amp false: not written */
    bool amp;
    int64_t skipped_steps;     /* steps skipped for inf/NaN gradients, since the start */
    double loss_scale;         /* the scale after the row's last step */
} step_row;

/* One row of --metrics: an epoch. The columns of the first ten fields are the file's
 * original ones, in order; the rest are appended after them. NAN: not measured (no
 * validation or test set; accuracy of a regression). */
typedef struct epoch_row {
    int64_t epoch, step;
    double lr, train_loss, grad_norm, val_loss, val_metric, samples_s, wait_pct;
    size_t peak;
    /* appended columns */
    double train_metric;       /* accuracy (classification) or MAE, over the whole epoch */
    double test_loss, test_metric;
    int64_t skipped_steps;     /* --amp: steps skipped so far; 0 otherwise */
    double loss_scale;         /* --amp fp16: the scale at the epoch's end; NAN otherwise */
    /* a language model (per-position class targets, a cross-entropy loss): exp of the mean
     * token loss of training and validation, and the validation targets' unigram perplexity
     * (NAN without a validation set); ppl false: none of the three is written */
    bool ppl;
    double train_ppl, val_ppl, val_unigram_ppl;
} epoch_row;

/* A place rows go. Functions may be NULL (the sink takes no such rows). Each returns false
 * on failure with the reason in err (the loop names the sink's option in its message). */
typedef struct metrics_sink {
    const char *option;        /* "--metrics", "--metrics-steps", "--tensorboard" */
    const char *metric_name;   /* "accuracy" or "mae": the val/test/train metric's name */
    void *ctx;
    bool (*step)(struct metrics_sink *s, const step_row *row);
    bool (*epoch)(struct metrics_sink *s, const epoch_row *row);
    /* once per epoch, after its last step: the trainable parameters (name -> tensor) and
     * whether their .grad is set; for histograms */
    bool (*params)(struct metrics_sink *s, int64_t epoch, int64_t step, const em_dict *params);
    /* flush what is buffered (the loop calls it at least every 10 s) */
    bool (*flush)(struct metrics_sink *s);
    /* flush and release; called once, also after a failure */
    bool (*close)(struct metrics_sink *s);
    char err[512];
} metrics_sink;

#endif /* EMBER_TRAINER_METRICS_H */
