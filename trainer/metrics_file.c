/*
 * metrics_file.c — out_file, and the --metrics / --metrics-steps sinks (see metrics_file.h).
 *
 * Columns of --metrics (one row per epoch; the first ten are the file's original ones, in
 * their original order; the rest are appended):
 *   epoch,step,lr,train_loss,grad_norm,val_loss,val_accuracy,samples_per_s,data_wait_pct,
 *   peak_memory,train_accuracy,test_loss,test_accuracy[,skipped_steps,loss_scale]
 *   [,train_ppl,val_ppl,val_unigram_ppl] (language models: per-position class targets)
 * (val_mae, train_mae, test_mae for regression). Columns of --metrics-steps (one row every
 * --log-every):
 *   step,epoch,loss,lr (lr_group0,lr_group1,... with several groups),grad_norm,samples_per_s,
 *   data_wait_s[,skipped_steps,loss_scale]
 * JSON lines carry the same names as keys; a figure that was not measured is "nan" in CSV
 * (as pandas and numpy read it) and null in JSON (which has no NaN).
 */
#include "metrics_file.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- out_file ------------------------------------------------------------------------------ */

void out_note(out_file *o, bool ok) {
    if (!ok && !o->err) o->err = errno ? errno : EIO;
}

bool out_open(out_file *o, const char *option, const char *path, const char *mode) {
    *o = (out_file){fopen(path, mode), option, path, 0};
    if (!o->f) {
        fprintf(stderr, "ember-train: %s %s: cannot write: %s\n", option, path, strerror(errno));
        return false;
    }
    return true;
}

bool out_flush(out_file *o) {
    out_note(o, fflush(o->f) == 0);
    return !o->err;
}

bool out_close(out_file *o) {
    if (!o->f) return !o->err;
    errno = 0;
    out_note(o, fclose(o->f) == 0);
    o->f = NULL;
    return !o->err;
}

em_status out_error(const out_file *o) {
    return em_set_error(EM_ERR_IO, "%s %s: writing failed: %s", o->option, o->path,
                        strerror(o->err));
}

/* ---- the sinks ----------------------------------------------------------------------------- */

typedef struct file_sink {
    out_file o;
    metrics_file_spec spec;
    bool jsonl;
} file_sink;

static bool fail(metrics_sink *s, file_sink *fs) {
    snprintf(s->err, sizeof s->err, "%s: writing failed: %s", fs->o.path, strerror(fs->o.err));
    return false;
}

/* A figure: %.PRECg, or nan (CSV) / null (JSON) when it is not finite. */
static void put_num(file_sink *fs, int prec, double v) {
    if (isfinite(v)) OUT_PRINTF(&fs->o, "%.*g", prec, v);
    else OUT_PRINTF(&fs->o, "%s", fs->jsonl ? "null" : isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
}

/* One field: `,` before all but the first, the key in JSON. */
static void put_key(file_sink *fs, bool first, const char *key) {
    if (fs->jsonl) OUT_PRINTF(&fs->o, "%s\"%s\": ", first ? "{" : ", ", key);
    else if (!first) OUT_PRINTF(&fs->o, ",");
}

static void put_f(file_sink *fs, bool first, const char *key, int prec, double v) {
    put_key(fs, first, key);
    put_num(fs, prec, v);
}

static void put_i(file_sink *fs, bool first, const char *key, int64_t v) {
    put_key(fs, first, key);
    OUT_PRINTF(&fs->o, "%" PRId64, v);
}

static void put_end(file_sink *fs) { OUT_PRINTF(&fs->o, fs->jsonl ? "}\n" : "\n"); }

static const char *mname(const file_sink *fs) {
    return fs->spec.classification ? "accuracy" : "mae";
}

/* The lr column of group g: "lr" with one group, else "lr_groupG". */
static const char *lr_name(const file_sink *fs, int g, char *buf, size_t cap) {
    if (fs->spec.n_groups == 1) return "lr";
    snprintf(buf, cap, "lr_group%d", g);
    return buf;
}

/* The CSV header (without the newline) into buf. */
static void header(const file_sink *fs, char *buf, size_t cap) {
    size_t n = 0;
#define ADD(...) (n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__))
    if (fs->spec.steps) {
        ADD("step,epoch,loss");
        for (int g = 0; g < fs->spec.n_groups; g++) {
            char b[32];
            ADD(",%s", lr_name(fs, g, b, sizeof b));
        }
        ADD(",grad_norm,samples_per_s,data_wait_s");
    } else {
        const char *m = mname(fs);
        ADD("epoch,step,lr,train_loss,grad_norm,val_loss,val_%s,samples_per_s,data_wait_pct,"
            "peak_memory,train_%s,test_loss,test_%s", m, m, m);
    }
    if (fs->spec.amp) ADD(",skipped_steps,loss_scale");
    if (fs->spec.perplexity && !fs->spec.steps) ADD(",train_ppl,val_ppl,val_unigram_ppl");
#undef ADD
}

static bool sink_step(metrics_sink *s, const step_row *r) {
    file_sink *fs = s->ctx;
    put_i(fs, true, "step", r->step);
    put_i(fs, false, "epoch", r->epoch);
    put_f(fs, false, "loss", 9, r->loss);
    for (int g = 0; g < fs->spec.n_groups; g++) {
        char b[32];
        put_f(fs, false, lr_name(fs, g, b, sizeof b), 9, g < r->n_groups ? r->lr[g] : NAN);
    }
    put_f(fs, false, "grad_norm", 9, r->grad_norm);
    put_f(fs, false, "samples_per_s", 6, r->samples_s);
    put_f(fs, false, "data_wait_s", 6, r->data_wait_s);
    if (fs->spec.amp) {
        put_i(fs, false, "skipped_steps", r->skipped_steps);
        put_f(fs, false, "loss_scale", 9, r->loss_scale);
    }
    put_end(fs);
    return fs->o.err ? fail(s, fs) : true; /* flushed by the loop's flush calls */
}

static bool sink_epoch(metrics_sink *s, const epoch_row *e) {
    file_sink *fs = s->ctx;
    char k[3][32];
    snprintf(k[0], sizeof k[0], "val_%s", mname(fs));
    snprintf(k[1], sizeof k[1], "train_%s", mname(fs));
    snprintf(k[2], sizeof k[2], "test_%s", mname(fs));
    put_i(fs, true, "epoch", e->epoch);
    put_i(fs, false, "step", e->step);
    put_f(fs, false, "lr", 9, e->lr);
    put_f(fs, false, "train_loss", 9, e->train_loss);
    put_f(fs, false, "grad_norm", 9, e->grad_norm);
    put_f(fs, false, "val_loss", 9, e->val_loss);
    put_f(fs, false, k[0], 9, e->val_metric);
    put_f(fs, false, "samples_per_s", 6, e->samples_s);
    put_f(fs, false, "data_wait_pct", 4, e->wait_pct);
    put_key(fs, false, "peak_memory");
    OUT_PRINTF(&fs->o, "%zu", e->peak);
    put_f(fs, false, k[1], 9, e->train_metric);
    put_f(fs, false, "test_loss", 9, e->test_loss);
    put_f(fs, false, k[2], 9, e->test_metric);
    if (fs->spec.amp) {
        put_i(fs, false, "skipped_steps", e->skipped_steps);
        put_f(fs, false, "loss_scale", 9, e->loss_scale);
    }
    if (fs->spec.perplexity) {
        put_f(fs, false, "train_ppl", 9, e->ppl ? e->train_ppl : NAN);
        put_f(fs, false, "val_ppl", 9, e->ppl ? e->val_ppl : NAN);
        put_f(fs, false, "val_unigram_ppl", 9, e->ppl ? e->val_unigram_ppl : NAN);
    }
    put_end(fs);
    return out_flush(&fs->o) ? true : fail(s, fs); /* an epoch is worth a flush */
}

static bool sink_flush(metrics_sink *s) {
    file_sink *fs = s->ctx;
    return out_flush(&fs->o) ? true : fail(s, fs);
}

static bool sink_close(metrics_sink *s) {
    file_sink *fs = s->ctx;
    bool ok = out_close(&fs->o), reported = fs->o.err && s->err[0];
    if (!ok && !reported) fail(s, fs);
    free(fs);
    s->ctx = NULL;
    return ok || reported; /* a failure already reported is not reported twice */
}

/* The first line of path (without its newline) into buf; false when it has none. */
static bool first_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\r\n")] = '\0';
    return ok;
}

bool metrics_file_open(metrics_sink *s, const metrics_file_spec *spec) {
    *s = (metrics_sink){.option = spec->option};
    file_sink *fs = calloc(1, sizeof *fs);
    if (!fs) {
        snprintf(s->err, sizeof s->err, "%s: out of memory", spec->path);
        return false;
    }
    fs->spec = *spec;
    size_t len = strlen(spec->path);
    fs->jsonl = len > 6 && !strcmp(spec->path + len - 6, ".jsonl");
    char want[1024], have[1024];
    header(fs, want, sizeof want);
    bool append = spec->append && access(spec->path, F_OK) == 0;
    if (append && !fs->jsonl && (!first_line(spec->path, have, sizeof have) || strcmp(have, want))) {
        snprintf(s->err, sizeof s->err, "%.120s: the resumed run would add rows with the columns "
                 "'%.100s', but the file's header is '%.100s': give the resumed run a new file",
                 spec->path, want, first_line(spec->path, have, sizeof have) ? have : "");
        free(fs);
        return false;
    }
    errno = 0;
    fs->o = (out_file){fopen(spec->path, append ? "a" : "w"), spec->option, spec->path, 0};
    if (!fs->o.f) {
        snprintf(s->err, sizeof s->err, "%s: cannot write: %s", spec->path, strerror(errno));
        free(fs);
        return false;
    }
    if (!fs->jsonl && !append) OUT_PRINTF(&fs->o, "%s\n", want);
    if (!out_flush(&fs->o)) { /* a full disk, found before the first step */
        fail(s, fs);
        out_close(&fs->o);
        free(fs);
        return false;
    }
    s->metric_name = mname(fs);
    s->ctx = fs;
    if (spec->steps) s->step = sink_step;
    else s->epoch = sink_epoch;
    s->flush = sink_flush;
    s->close = sink_close;
    return true;
}
