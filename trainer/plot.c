/*
 * plot.c — training curves with PLplot (see plot.h): the rows, reading them back from the
 * metrics files, drawing them, and the --plot sink.
 */
#include "plot.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <plplot.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static bool fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return false;
}

const char *plot_format(const char *path) {
    size_t n = path ? strlen(path) : 0;
    if (n > 4 && !strcasecmp(path + n - 4, ".png")) return "png";
    if (n > 4 && !strcasecmp(path + n - 4, ".svg")) return "svg";
    return NULL;
}

/* ---- the rows ---------------------------------------------------------------------------------- */

/* Grow the k arrays of *cap doubles to hold n + 1; false when out of memory. */
static bool grow(size_t n, size_t *cap, double **arrays[], int k) {
    if (n < *cap) return true;
    size_t nc = *cap ? *cap * 2 : 64;
    for (int i = 0; i < k; i++) {
        double *v = realloc(*arrays[i], nc * sizeof *v);
        if (!v) return false;
        *arrays[i] = v;
    }
    *cap = nc;
    return true;
}

static bool add_epoch(plot_data *d, double epoch, double step, double lr, double tl, double vl,
                      double tm, double vm) {
    double **a[] = {&d->ep_epoch, &d->ep_step, &d->ep_lr, &d->ep_train_loss, &d->ep_val_loss,
                    &d->ep_train_metric, &d->ep_val_metric};
    if (!grow(d->n_ep, &d->cap_ep, a, 7)) return false;
    size_t i = d->n_ep++;
    d->ep_epoch[i] = epoch, d->ep_step[i] = step, d->ep_lr[i] = lr;
    d->ep_train_loss[i] = tl, d->ep_val_loss[i] = vl;
    d->ep_train_metric[i] = tm, d->ep_val_metric[i] = vm;
    return true;
}

static bool add_step(plot_data *d, double step, double epoch, double loss, double lr) {
    double **a[] = {&d->st_step, &d->st_epoch, &d->st_loss, &d->st_lr};
    if (!grow(d->n_st, &d->cap_st, a, 4)) return false;
    size_t i = d->n_st++;
    d->st_step[i] = step, d->st_epoch[i] = epoch, d->st_loss[i] = loss, d->st_lr[i] = lr;
    return true;
}

bool plot_add_epoch(plot_data *d, const epoch_row *r) {
    return add_epoch(d, (double)r->epoch, (double)r->step, r->lr, r->train_loss, r->val_loss,
                     r->train_metric, r->val_metric);
}

bool plot_add_step(plot_data *d, const step_row *r) {
    return add_step(d, (double)r->step, (double)r->epoch, r->loss, r->n_groups ? r->lr[0] : NAN);
}

void plot_data_free(plot_data *d) {
    double *v[] = {d->ep_epoch, d->ep_step, d->ep_lr, d->ep_train_loss, d->ep_val_loss,
                   d->ep_train_metric, d->ep_val_metric, d->st_step, d->st_epoch, d->st_loss,
                   d->st_lr};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) free(v[i]);
    memset(d, 0, sizeof *d);
}

/* ---- reading the metrics files ----------------------------------------------------------------- */

/* The columns a plot reads, by name; an epoch file has train_loss, a step file loss. */
enum { C_EPOCH, C_STEP, C_LR, C_TRAIN_LOSS, C_VAL_LOSS, C_VAL_ACC, C_VAL_MAE, C_TRAIN_ACC,
       C_TRAIN_MAE, C_LOSS, C_LR0, N_COLS };
static const char *const col_names[N_COLS] = {
    "epoch", "step", "lr", "train_loss", "val_loss", "val_accuracy", "val_mae",
    "train_accuracy", "train_mae", "loss", "lr_group0"};

static int col_of(const char *name) {
    for (int c = 0; c < N_COLS; c++)
        if (!strcmp(col_names[c], name)) return c;
    return -1;
}

/* One row's figures (NAN where absent) into d; kind 'e' (epoch) or 's' (step). */
static bool add_row(plot_data *d, char kind, const double *v) {
    if (kind == 'e') {
        bool mae = isfinite(v[C_VAL_MAE]) || isfinite(v[C_TRAIN_MAE]);
        if (mae) snprintf(d->metric, sizeof d->metric, "mae");
        else if (!d->metric[0]) snprintf(d->metric, sizeof d->metric, "accuracy");
        return add_epoch(d, v[C_EPOCH], v[C_STEP], v[C_LR], v[C_TRAIN_LOSS], v[C_VAL_LOSS],
                         mae ? v[C_TRAIN_MAE] : v[C_TRAIN_ACC], mae ? v[C_VAL_MAE] : v[C_VAL_ACC]);
    }
    return add_step(d, v[C_STEP], v[C_EPOCH], v[C_LOSS], isfinite(v[C_LR]) ? v[C_LR] : v[C_LR0]);
}

/* A CSV figure: a number, or nan/inf/empty (NAN). false when it is something else. */
static bool csv_num(const char *t, double *out) {
    while (*t == ' ') t++;
    if (!*t) return *out = NAN, true;
    char *end;
    *out = strtod(t, &end);
    while (*end == ' ') end++;
    return *end == '\0';
}

bool plot_read_file(plot_data *d, const char *path, char *err, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return fail(err, cap, "%s: cannot read: %s", path, strerror(errno));
    size_t n = strlen(path);
    bool jsonl = n > 6 && !strcmp(path + n - 6, ".jsonl");
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int map[64];                /* CSV: column i -> C_*, or -1 */
    int n_map = 0;
    char kind = 0;              /* 'e', 's'; 0 until the header (or first JSON line) says */
    bool ok = true;
    long lineno = 0;
    while (ok && (len = getline(&line, &lcap, f)) > 0) {
        lineno++;
        if (line[len - 1] != '\n') break; /* a row still being written */
        line[--len] = '\0';
        if (len && line[len - 1] == '\r') line[--len] = '\0';
        if (!len) continue;
        double v[N_COLS];
        for (int c = 0; c < N_COLS; c++) v[c] = NAN;
        if (jsonl) {
            json_error_t je;
            json_t *o = json_loads(line, 0, &je);
            if (!json_is_object(o)) {
                json_decref(o);
                ok = fail(err, cap, "%s:%ld: not a JSON object: %s", path, lineno,
                          o ? "another JSON value" : je.text);
                break;
            }
            const char *k;
            json_t *x;
            json_object_foreach(o, k, x) {
                int c = col_of(k);
                if (c >= 0 && json_is_number(x)) v[c] = json_number_value(x);
            }
            char kk = json_object_get(o, "train_loss") ? 'e' : json_object_get(o, "loss") ? 's' : 0;
            json_decref(o);
            if (!kk) {
                ok = fail(err, cap, "%s:%ld: neither an epoch row (train_loss) nor a step row "
                          "(loss)", path, lineno);
                break;
            }
            if (kind && kk != kind) {
                ok = fail(err, cap, "%s:%ld: epoch and step rows in one file", path, lineno);
                break;
            }
            kind = kk;
        } else if (!kind) { /* the header */
            for (char *tok = line, *next; tok && n_map < 64; tok = next) {
                next = strchr(tok, ',');
                if (next) *next++ = '\0';
                int c = col_of(tok);
                map[n_map++] = c;
                if (c == C_TRAIN_LOSS) kind = 'e';
                if (c == C_LOSS && kind != 'e') kind = 's';
            }
            if (!kind) {
                ok = fail(err, cap, "%s:1: not a --metrics or --metrics-steps file: no "
                          "train_loss or loss column in its header", path);
                break;
            }
            continue;
        } else {
            int i = 0;
            for (char *tok = line, *next; tok; tok = next, i++) {
                next = strchr(tok, ',');
                if (next) *next++ = '\0';
                double x;
                if (!csv_num(tok, &x)) {
                    ok = fail(err, cap, "%s:%ld: field %d ('%s') is not a number", path,
                              lineno, i + 1, tok);
                    break;
                }
                if (i < n_map && map[i] >= 0) v[map[i]] = x;
            }
            if (!ok) break;
        }
        if (!add_row(d, kind, v)) ok = fail(err, cap, "%s: out of memory", path);
    }
    free(line);
    if (ok && ferror(f)) ok = fail(err, cap, "%s: reading failed: %s", path, strerror(errno));
    fclose(f);
    if (ok && !kind) ok = fail(err, cap, "%s: no rows", path);
    return ok;
}

/* ---- drawing ----------------------------------------------------------------------------------- */

enum { COL_BG, COL_FG, COL_TRAIN_LOSS, COL_VAL_LOSS, COL_TRAIN_METRIC, COL_VAL_METRIC, COL_LR,
       COL_STEP_LOSS, COL_GRID, N_COLOURS };
static const int rgb[N_COLOURS][3] = {
    {255, 255, 255}, {0, 0, 0},       {0x1f, 0x77, 0xb4}, {0xff, 0x7f, 0x0e}, {0x2c, 0xa0, 0x2c},
    {0xd6, 0x27, 0x28}, {0x94, 0x67, 0xbd}, {0xae, 0xc7, 0xe8}, {0xdd, 0xdd, 0xdd}};

typedef struct series {
    const char *label;
    int colour;
    const double *x, *y;
    size_t n;
    bool points;               /* mark each point (epoch rows: few of them) */
} series;

/* PLplot reports recoverable errors through plabort: keep the first for the caller. */
static char plot_abort_msg[256];
static void on_abort(PLCHAR_VECTOR msg) {
    if (!plot_abort_msg[0]) snprintf(plot_abort_msg, sizeof plot_abort_msg, "%s", msg);
}

static void range_of(const series *s, int n, double *lo, double *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < s[k].n; i++)
            if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) {
                if (s[k].y[i] < *lo) *lo = s[k].y[i];
                if (s[k].y[i] > *hi) *hi = s[k].y[i];
            }
}

/* One panel in viewport rows [y0, y1]; series with no finite point are left out (of the
 * legend too). */
static void panel(double y0, double y1, double xmin, double xmax, const series *s, int n,
                  const char *ylabel, const char *xlabel, const char *title) {
    double lo, hi;
    range_of(s, n, &lo, &hi);
    if (!isfinite(lo)) lo = 0, hi = 1; /* nothing measured: an empty, labelled panel */
    if (hi - lo < 1e-12 * (fabs(hi) + 1)) {
        double m = fabs(hi) > 0 ? fabs(hi) * 0.1 : 1.0;
        lo -= m, hi += m;
    }
    double pad = (hi - lo) * 0.06;
    plvpor(0.10, 0.72, y0, y1);
    plwind(xmin, xmax, lo - pad, hi + pad);
    plwidth(1);
    plcol0(COL_GRID);
    plbox("g", 0, 0, "g", 0, 0);
    plcol0(COL_FG);
    plbox(xlabel ? "bcnst" : "bcst", 0, 0, "bcnstv", 0, 0);
    plmtex("l", 5.2, 0.5, 0.5, ylabel);
    if (xlabel) plmtex("b", 3.0, 0.5, 0.5, xlabel);
    if (title) plmtex("t", 1.2, 0.5, 0.5, title);
    PLINT opts[8], lcol[8], tcol[8], lsty[8], scol[8], snum[8];
    PLFLT lwid[8], sscale[8];
    const char *text[8], *sym[8];
    int nl = 0;
    for (int k = 0; k < n; k++) {
        bool any = false;
        plwidth(2.5);
        plcol0(s[k].colour);
        /* lines through consecutive finite points */
        for (size_t i = 0; i < s[k].n;) {
            while (i < s[k].n && !(isfinite(s[k].x[i]) && isfinite(s[k].y[i]))) i++;
            size_t j = i;
            while (j < s[k].n && isfinite(s[k].x[j]) && isfinite(s[k].y[j])) j++;
            if (j > i) {
                any = true;
                if (j - i > 1) plline((PLINT)(j - i), s[k].x + i, s[k].y + i);
                if (s[k].points) plpoin((PLINT)(j - i), s[k].x + i, s[k].y + i, 4);
            }
            i = j;
        }
        if (!any || nl == 8) continue;
        opts[nl] = PL_LEGEND_LINE;
        lcol[nl] = tcol[nl] = scol[nl] = s[k].colour; /* the labels in the series' colours */
        lsty[nl] = 1, lwid[nl] = 2.5, sscale[nl] = 1.0, snum[nl] = 1;
        text[nl] = s[k].label, sym[nl] = "";
        nl++;
    }
    plwidth(1);
    if (nl) {
        PLFLT w, h;
        pllegend(&w, &h, 0, PL_POSITION_RIGHT | PL_POSITION_OUTSIDE, 0.01, 0.0,
                 0.06, COL_BG, COL_FG, 1, 0, 0, nl, opts, 0.8, 0.75, 2.0, 0.0, tcol, text, NULL,
                 NULL, NULL, NULL, lcol, lsty, lwid, scol, sscale, snum, sym);
    }
}

/* x of each step row when the axis is in epochs: epoch e - 1 + the share of its steps done,
 * from the epoch rows' last steps (a step past the last epoch row: whole epochs). */
static double step_as_epoch(const plot_data *d, double step, double epoch) {
    double prev_end = 0, prev_epoch = 0;
    for (size_t i = 0; i < d->n_ep; i++) {
        if (!isfinite(d->ep_step[i]) || !isfinite(d->ep_epoch[i])) continue;
        if (step <= d->ep_step[i] && d->ep_step[i] > prev_end)
            return prev_epoch + (d->ep_epoch[i] - prev_epoch) * (step - prev_end) /
                                    (d->ep_step[i] - prev_end);
        prev_end = d->ep_step[i], prev_epoch = d->ep_epoch[i];
    }
    return epoch;
}

bool plot_render(const plot_data *d, const plot_spec *spec, char *err, size_t cap) {
    const char *fmt = plot_format(spec->path);
    if (!fmt) return fail(err, cap, "%s: the picture's name must end in .png or .svg", spec->path);
    if (spec->width < 200 || spec->height < 200 || spec->width > 10000 || spec->height > 10000)
        return fail(err, cap, "size %dx%d: each side must be 200..10000 pixels", spec->width,
                    spec->height);
    if (d->n_ep == 0 && d->n_st == 0) return fail(err, cap, "nothing to plot yet (no rows)");
    bool by_step = spec->x == PLOT_X_STEP || (spec->x == PLOT_X_AUTO && d->n_st >= 2);
    /* x of every row */
    size_t nx = d->n_ep + d->n_st;
    double *buf = malloc((nx ? nx : 1) * sizeof *buf);
    if (!buf) return fail(err, cap, "out of memory");
    double *ex = buf, *sx = buf + d->n_ep;
    double xmin = INFINITY, xmax = -INFINITY;
    for (size_t i = 0; i < d->n_ep; i++) ex[i] = by_step ? d->ep_step[i] : d->ep_epoch[i];
    for (size_t i = 0; i < d->n_st; i++)
        sx[i] = by_step ? d->st_step[i] : step_as_epoch(d, d->st_step[i], d->st_epoch[i]);
    for (size_t i = 0; i < nx; i++)
        if (isfinite(buf[i])) xmin = fmin(xmin, buf[i]), xmax = fmax(xmax, buf[i]);
    if (!isfinite(xmin)) {
        free(buf);
        return fail(err, cap, "nothing to plot: no row has a step or an epoch");
    }
    /* The axis starts at 0, before the first step: the first epoch (or the steps up to the
     * first row) is drawn as the span it took, not squeezed into the left edge. */
    if (xmin > 0) xmin = 0;
    if (xmax - xmin < 1e-9) xmin -= 0.5, xmax += 0.5;
    /* Draw into a temporary file beside the target and rename it: a viewer of a running
     * job never reads a half-written picture. Opening it here first turns an unwritable
     * place into a message (PLplot's driver would exit the process). */
    char tmp[4096];
    int tn = snprintf(tmp, sizeof tmp, "%s.tmp.%s", spec->path, fmt);
    FILE *probe = tn > 0 && (size_t)tn < sizeof tmp ? fopen(tmp, "w") : NULL;
    if (!probe) {
        free(buf);
        return fail(err, cap, "%s: cannot write: %s", spec->path,
                    tn > 0 && (size_t)tn < sizeof tmp ? strerror(errno) : "name too long");
    }
    fclose(probe);

    const bool mae = !strcmp(d->metric, "mae");
    series loss[3] = {
        {"train loss (steps)", COL_STEP_LOSS, sx, d->st_loss, d->n_st, false},
        {"train loss", COL_TRAIN_LOSS, ex, d->ep_train_loss, d->n_ep, true},
        {"validation loss", COL_VAL_LOSS, ex, d->ep_val_loss, d->n_ep, true}};
    series metric[2] = {
        {mae ? "train MAE" : "train accuracy", COL_TRAIN_METRIC, ex, d->ep_train_metric, d->n_ep,
         true},
        {mae ? "validation MAE" : "validation accuracy", COL_VAL_METRIC, ex, d->ep_val_metric,
         d->n_ep, true}};
    bool step_lr = false;
    for (size_t i = 0; i < d->n_st; i++) step_lr |= isfinite(d->st_lr[i]);
    series lr[1] = {step_lr ? (series){"lr", COL_LR, sx, d->st_lr, d->n_st, false}
                            : (series){"lr", COL_LR, ex, d->ep_lr, d->n_ep, true}};

    plot_abort_msg[0] = '\0';
    plsabort(on_abort);
    plsdev(!strcmp(fmt, "png") ? "pngcairo" : "svgcairo");
    plsfnam(tmp);
    plspage(0, 0, spec->width, spec->height, 0, 0);
    plscmap0n(N_COLOURS);
    for (int c = 0; c < N_COLOURS; c++) plscol0(c, rgb[c][0], rgb[c][1], rgb[c][2]);
    plinit();
    pladv(0);
    plschr(0, 0.85);
    const char *xl = by_step ? "step" : "epoch";
    panel(0.58, 0.93, xmin, xmax, loss, 3, "loss", NULL, spec->title);
    panel(0.34, 0.54, xmin, xmax, metric, 2, mae ? "MAE" : "accuracy", NULL, NULL);
    panel(0.10, 0.30, xmin, xmax, lr, 1, "learning rate", xl, NULL);
    plend();
    free(buf);
    if (plot_abort_msg[0]) {
        unlink(tmp);
        return fail(err, cap, "%s: PLplot: %s", spec->path, plot_abort_msg);
    }
    if (rename(tmp, spec->path) != 0) {
        int e = errno;
        unlink(tmp);
        return fail(err, cap, "%s: cannot write: %s", spec->path, strerror(e));
    }
    return true;
}

/* ---- the --plot sink --------------------------------------------------------------------------- */

typedef struct plot_sink {
    plot_data d;
    plot_spec spec;
} plot_sink;

static bool sink_step(metrics_sink *s, const step_row *r) {
    plot_sink *p = s->ctx;
    if (!plot_add_step(&p->d, r)) return fail(s->err, sizeof s->err, "out of memory");
    return true;
}

static bool sink_render(metrics_sink *s) {
    plot_sink *p = s->ctx;
    char e[400];
    if (!plot_render(&p->d, &p->spec, e, sizeof e))
        return fail(s->err, sizeof s->err, "%s", e);
    return true;
}

static bool sink_epoch(metrics_sink *s, const epoch_row *r) {
    plot_sink *p = s->ctx;
    if (!plot_add_epoch(&p->d, r)) return fail(s->err, sizeof s->err, "out of memory");
    return sink_render(s);
}

static bool sink_close(metrics_sink *s) {
    plot_sink *p = s->ctx;
    bool ok = p->d.n_ep == 0 && p->d.n_st == 0 ? true : sink_render(s);
    plot_data_free(&p->d);
    free(p);
    s->ctx = NULL;
    return ok;
}

bool plot_sink_open(metrics_sink *s, const char *path, const char *metric_name) {
    memset(s, 0, sizeof *s);
    if (!plot_format(path))
        return fail(s->err, sizeof s->err, "%s: the picture's name must end in .png or .svg", path);
    plot_sink *p = calloc(1, sizeof *p);
    if (!p) return fail(s->err, sizeof s->err, "out of memory");
    p->spec = (plot_spec){.path = path, .width = 1000, .height = 800, .x = PLOT_X_AUTO};
    snprintf(p->d.metric, sizeof p->d.metric, "%s", metric_name);
    *s = (metrics_sink){.option = "--plot", .metric_name = metric_name, .ctx = p,
                        .step = sink_step, .epoch = sink_epoch, .close = sink_close};
    return true;
}
