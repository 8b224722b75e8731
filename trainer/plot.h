/*
 * plot.h — training curves as a picture (PLplot): ember-train --plot and tools/ember-plot.
 *
 *   plot_data      the figures a plot shows: epoch rows (train and validation loss, train and
 *                  validation accuracy or MAE, the lr) and step rows (the loss and lr every
 *                  --log-every), added from the loop's rows or read back from --metrics and
 *                  --metrics-steps files (CSV or JSON lines, told apart by their columns)
 *   plot_render    three panels one above the other, sharing the x axis (step, or epoch):
 *                  the losses, the accuracies (MAEs), the lr; axes labelled, a legend beside
 *                  each panel; PNG or SVG by the file's extension (PLplot's cairo driver)
 *   plot_sink_open the --plot sink (metrics.h): keeps the rows and re-renders the file at the
 *                  end of each epoch and at the end of the run
 *
 * Why PLplot: a C library in Debian (libplplot-dev, plplot-driver-cairo) called in-process, so
 * the trainer needs no helper program on the PATH and a plotting failure is a status with a
 * message, not a subprocess's exit code and stderr to parse (gnuplot's case); its cairo
 * driver antialiases lines and text, and writes PNG and SVG alike.
 *
 * Colours (the test looks for them): train loss #1f77b4, validation loss #ff7f0e, train
 * accuracy #2ca02c, validation accuracy #d62728, lr #9467bd, per-step loss #aec7e8.
 */
#ifndef EMBER_TRAINER_PLOT_H
#define EMBER_TRAINER_PLOT_H

#include <stdbool.h>
#include <stddef.h>

#include "metrics.h"

typedef struct plot_data {
    /* epoch rows (NAN: not measured) */
    size_t n_ep, cap_ep;
    double *ep_epoch, *ep_step, *ep_lr, *ep_train_loss, *ep_val_loss, *ep_train_metric,
        *ep_val_metric;
    /* step rows */
    size_t n_st, cap_st;
    double *st_step, *st_epoch, *st_loss, *st_lr;
    char metric[16];           /* "accuracy" or "mae" */
} plot_data;

typedef enum { PLOT_X_AUTO, PLOT_X_STEP, PLOT_X_EPOCH } plot_x;

typedef struct plot_spec {
    const char *path;          /* .png or .svg */
    int width, height;         /* pixels (SVG: its user units) */
    plot_x x;                  /* AUTO: steps when there are step rows, else epochs */
    const char *title;         /* (optional) above the top panel */
} plot_spec;

/* "png", "svg", or NULL when path has neither extension. */
const char *plot_format(const char *path);

/* Add a row (copied); false when out of memory. */
bool plot_add_epoch(plot_data *d, const epoch_row *r);
bool plot_add_step(plot_data *d, const step_row *r);
/* Read a --metrics or --metrics-steps file (CSV, or JSON lines by ".jsonl") and add its rows;
 * a last line without its newline (a run still writing it) is left out. false with the reason
 * in err ("PATH:LINE: ..."). */
bool plot_read_file(plot_data *d, const char *path, char *err, size_t cap);
void plot_data_free(plot_data *d);

/* Draw d into spec->path; false with the reason in err (nothing to plot, a file that cannot
 * be written, a size out of range). Not thread-safe (PLplot's state is global). */
bool plot_render(const plot_data *d, const plot_spec *spec, char *err, size_t cap);

/* The --plot sink: epoch and step rows, rendered at each epoch row and at close. false with
 * the reason in s->err. */
bool plot_sink_open(metrics_sink *s, const char *path, const char *metric_name);

#endif /* EMBER_TRAINER_PLOT_H */
