/*
 * metrics_file.h — text files ember-train writes, and the two metrics sinks made of them.
 *
 *   out_file         a FILE with the first write failure's errno kept, so a full disk or the
 *                    file-size limit is reported with its reason however many writes came
 *                    after it (--metrics, --metrics-steps, --predict)
 *   metrics_file_open  the --metrics sink (epoch rows) and the --metrics-steps sink (step
 *                    rows): CSV with a header, or JSON lines when the name ends in .jsonl
 *
 * The loop (loop.c) opens the sinks and hands them rows (metrics.h).
 */
#ifndef EMBER_TRAINER_METRICS_FILE_H
#define EMBER_TRAINER_METRICS_FILE_H

#include <stdbool.h>
#include <stdio.h>

#include "ember/error.h"
#include "metrics.h"

/* ---- out_file -------------------------------------------------------------------------------
 * stdio reports a failed write (a full disk; the file-size limit, since ember-train ignores
 * SIGXFSZ) as a negative return from whichever call flushed the buffer. */
typedef struct out_file {
    FILE *f;
    const char *option, *path; /* "--metrics", the file (borrowed) */
    int err;                   /* the first failure's errno; 0: none */
} out_file;

/* Record a failed call (ok false) as o's first failure, unless it has one. */
void out_note(out_file *o, bool ok);
#define OUT_PRINTF(o, ...) out_note((o), fprintf((o)->f, __VA_ARGS__) >= 0)

/* Open path with fopen's mode; false after printing "ember-train: OPTION PATH: cannot write:
 * REASON" to stderr. */
bool out_open(out_file *o, const char *option, const char *path, const char *mode);
/* Flush; false when this or an earlier write failed. */
bool out_flush(out_file *o);
/* Close o (when open); false when any write or the close failed. */
bool out_close(out_file *o);
/* The failure as the thread's error ("OPTION PATH: writing failed: REASON"), for report_error. */
em_status out_error(const out_file *o);

/* ---- the --metrics and --metrics-steps sinks ------------------------------------------------ */

typedef struct metrics_file_spec {
    const char *option;        /* "--metrics" (epoch rows) or "--metrics-steps" (step rows) */
    const char *path;          /* borrowed for the sink's life; ".jsonl": JSON lines, else CSV */
    bool steps;                /* step rows; else epoch rows */
    bool append;               /* a resumed run adds to the file: no header */
    bool classification;       /* the metric columns are accuracies; else MAEs */
    int n_groups;              /* parameter groups (step rows' lr columns), 1..METRIC_GROUPS_MAX */
    bool amp;                  /* add the gradient scaler's columns (skipped_steps, loss_scale) */
    bool perplexity;           /* epoch rows: add train_ppl, val_ppl, val_unigram_ppl */
} metrics_file_spec;

/* Open the file and fill *s (its functions, option, metric name; the header written and
 * flushed, so a full disk shows before the first step). false with the reason in s->err
 * ("PATH: cannot write: REASON" or "PATH: writing failed: REASON"); s->close is then NULL and
 * nothing needs releasing. On success s->close must be called once. */
bool metrics_file_open(metrics_sink *s, const metrics_file_spec *spec);

#endif /* EMBER_TRAINER_METRICS_FILE_H */
