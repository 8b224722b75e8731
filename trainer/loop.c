/*
 * loop.c — ember-train's training loop: the seeds' skeleton (train/eval switching, zero_grad /
 * backward / step, gradient accumulation and clipping, lr schedule per step or per epoch,
 * no_grad validation) with the trainer's care around it: progress, NaN/Inf stops with a hint,
 * the data-wait hint and the median loader wait per step, metrics files, checkpoints each
 * epoch / at --max-steps / on a signal
 * (resumable exactly: model, optimizer, scheduler, RNG and the loader's position), the final
 * summary, --eval-only and --predict.
 *
 * Accumulation groups are aligned at the start of each epoch: micro-batches [kA, (k+1)A) form
 * step k; the epoch's last group may be shorter, and its losses are divided by the number of
 * micro-batches it really has, so each step's gradient is the mean over its micro-batches.
 * Checkpoints are only taken at step boundaries, so no partial gradient needs saving.
 */
#include "ember/autograd.h"
#include "ember/checkpoint.h"
#include "ember/data.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/optim.h"
#include "ember/scope.h"
#include "ember/serialize.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "metrics.h"
#include "trainer.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool classification(const run *r) { return r->info->num_classes > 0 && r->info->target_ndim == 0; }

/* ---- loaders ------------------------------------------------------------------------------ */

static em_loader *make_loader(run *r, em_dataset *ds, bool train, const int64_t *subset,
                              int64_t n_subset) {
    em_loader_options o = {.struct_size = sizeof o, .batch_size = r->s.batch_size,
                           .shuffle = train && r->s.shuffle && !subset, .seed = r->s.seed,
                           .num_workers = (int)r->s.workers, .device = r->dev,
                           .transforms = r->tf};
    if (!train) {
        o.transforms.crop_padding = 0;
        o.transforms.hflip = false;
    }
    em_transform_spec specs[TF_MAX];
    int n = 0;
    for (int i = 0; i < r->n_tspec; i++)
        if (train || !r->ttrain_only[i]) specs[n++] = r->tspec[i];
    if (r->n_tspec) {
        o.transform_specs = specs;
        o.n_transform_specs = n;
    }
    if (subset) {
        o.sampler = EM_SAMPLER_SUBSET;
        o.subset = subset;
        o.subset_len = n_subset;
    }
    return em_loader_new(ds, &o);
}

/* ---- text files the trainer writes (--metrics, --predict) -----------------------------------
 * stdio reports a failed write (a full disk; the file-size limit, since ember-train ignores
 * SIGXFSZ) as a negative return from whichever call flushed the buffer. The first failure's
 * errno is kept, so the message names the reason however many calls came after it. */

typedef struct out_file {
    FILE *f;
    const char *option, *path; /* "--metrics", the file */
    int err;                   /* the first failure's errno; 0: none */
} out_file;

static void out_note(out_file *o, bool ok) {
    if (!ok && !o->err) o->err = errno ? errno : EIO;
}
#define OUT_PRINTF(o, ...) out_note((o), fprintf((o)->f, __VA_ARGS__) >= 0)

static bool out_open(out_file *o, const char *option, const char *path, const char *mode) {
    *o = (out_file){fopen(path, mode), option, path, 0};
    if (!o->f) {
        fprintf(stderr, "ember-train: %s %s: cannot write: %s\n", option, path, strerror(errno));
        return false;
    }
    return true;
}

static bool out_flush(out_file *o) {
    out_note(o, fflush(o->f) == 0);
    return !o->err;
}

/* Close o (when open); false when any write or the close failed. */
static bool out_close(out_file *o) {
    if (!o->f) return !o->err;
    errno = 0;
    out_note(o, fclose(o->f) == 0);
    o->f = NULL;
    return !o->err;
}

/* The failure as the thread's error, for report_error. */
static em_status out_error(const out_file *o) {
    return em_set_error(EM_ERR_IO, "%s %s: writing failed: %s", o->option, o->path,
                        strerror(o->err));
}

/* The next batch of l: the model's inputs in[0..r->n_in) (the fields data.inputs names),
 * the target (data.target) and the mask of the first padded input (NULL: none), all
 * borrowed from the loader. EM_OK with in[0] = NULL at the end of the epoch. */
static em_status next_batch(const run *r, em_loader *l, em_tensor **in, em_tensor **y,
                            em_tensor **mask) {
    in[0] = *y = *mask = NULL;
    const em_batch *b;
    em_status s = em_loader_next_v2(l, &b);
    if (s != EM_OK || !b) return s;
    for (int k = 0; k < r->n_in; k++)
        if (!(in[k] = em_batch_field(b, r->in_names[k]))) break;
    if (in[r->n_in - 1] && (*y = em_batch_field(b, r->tg_name)) &&
        (r->mask_in < 0 || (*mask = em_batch_mask(b, r->in_names[r->mask_in]))))
        return EM_OK;
    in[0] = NULL;
    return em_last_status();
}

/* The model on a batch's inputs, with the padding mask for the layers that take one. */
static em_tensor *model_forward(const run *r, em_tensor *const *in, em_tensor *mask) {
    return em_module_forward_masked(r->model, in, r->n_in, mask);
}

/* ---- evaluation ---------------------------------------------------------------------------- */

typedef struct eval_result {
    double loss, metric; /* metric: accuracy in [0, 1], or MAE for regression */
    int64_t n;
} eval_result;

/* Evaluate on ds in eval mode under no_grad; predictions to `pred` (CSV) when not NULL (a
 * failed write stops the evaluation with EM_ERR_IO naming the file and the reason). */
static em_status evaluate(run *r, em_dataset *ds, const int64_t *subset, int64_t n_subset,
                          out_file *pred, eval_result *out) {
    em_loader *l = make_loader(r, ds, false, subset, n_subset);
    if (!l) return em_last_status();
    bool was = em_module_training(r->model);
    em_module_train(r->model, false);
    em_grad_mode_push(EM_GRAD_DISABLED);
    double loss_sum = 0, metric_sum = 0;
    int64_t n = 0, b = 0, limit = r->s.limit_batches;
    em_status s = EM_OK;
    em_tensor *xs[IN_MAX], *y, *mask;
    while ((s = next_batch(r, l, xs, &y, &mask)) == EM_OK && xs[0]) {
        if (limit && b++ >= limit) continue; /* drain to the end mark */
        em_scope_begin();
        int64_t bs = em_tensor_shape(xs[0])[0];
        em_tensor *outp = model_forward(r, xs, mask);
        em_tensor *pair[2] = {outp, y};
        em_tensor *loss = outp ? em_module_forward_n(r->loss, pair, 2) : NULL;
        em_tensor *m = NULL, *pred_t = NULL;
        if (loss && classification(r)) {
            int dim = 1;
            pred_t = em_argmax(outp, &dim, false);
            m = em_sum(em_to_dtype(em_eq(pred_t, y), EM_F32), 0, NULL, false);
        } else if (loss) {
            pred_t = outp;
            m = em_sum(em_abs(em_sub(outp, em_reshape(y, em_tensor_ndim(outp), em_tensor_shape(outp)))),
                       0, NULL, false);
            if (m) m = em_div_scalar(m, (double)(em_tensor_numel(outp) / bs));
        }
        if (!m) {
            s = em_last_status();
            em_scope_end();
            break;
        }
        loss_sum += em_item(loss) * (double)bs;
        metric_sum += em_item(m);
        if (pred) {
            em_tensor *pc = em_to_device(em_to_dtype(pred_t, classification(r) ? EM_I64 : EM_F32), em_cpu());
            em_tensor *yc = em_to_device(em_to_dtype(y, classification(r) ? EM_I64 : EM_F32), em_cpu());
            int64_t per = em_tensor_numel(pc) / bs;
            for (int64_t i = 0; i < bs; i++) {
                OUT_PRINTF(pred, "%" PRId64, n + i);
                for (int64_t j = 0; j < per; j++) {
                    if (classification(r))
                        OUT_PRINTF(pred, ",%" PRId64 ",%" PRId64, ((int64_t *)em_tensor_data(pc))[i],
                                   ((int64_t *)em_tensor_data(yc))[i]);
                    else
                        OUT_PRINTF(pred, ",%.9g,%.9g", ((float *)em_tensor_data(pc))[i * per + j],
                                   ((float *)em_tensor_data(yc))[i * per + j]);
                }
                OUT_PRINTF(pred, "\n");
            }
            if (pred->err) {
                s = out_error(pred);
                em_scope_end();
                break;
            }
        }
        n += bs;
        em_scope_end();
    }
    em_grad_mode_pop();
    em_module_train(r->model, was);
    em_loader_free(l);
    if (s != EM_OK) return s;
    out->n = n;
    out->loss = n ? loss_sum / (double)n : NAN;
    out->metric = n ? metric_sum / (double)n : NAN;
    return EM_OK;
}

static const char *metric_name(const run *r) { return classification(r) ? "accuracy" : "MAE"; }

static void print_eval(const run *r, const char *what, const eval_result *e) {
    if (classification(r))
        printf("%s: loss %.6f accuracy %.4f%% (%" PRId64 " samples)\n", what, e->loss,
               100.0 * e->metric, e->n);
    else
        printf("%s: loss %.6f MAE %.6f (%" PRId64 " samples)\n", what, e->loss, e->metric, e->n);
    fflush(stdout);
}

int evaluate_only(run *r) {
    eval_result e;
    if (r->s.predict) {
        em_dataset *ds = r->test ? r->test : r->val ? r->val : r->train;
        out_file f;
        if (!out_open(&f, "--predict", r->s.predict, "w")) return EXIT_USAGE;
        OUT_PRINTF(&f, "index,predicted,target\n");
        em_status s = evaluate(r, ds, NULL, 0, &f, &e);
        if (!out_close(&f) && s == EM_OK) s = out_error(&f);
        if (s != EM_OK) {
            report_error("predict");
            return EXIT_TRAIN;
        }
        print_eval(r, r->test ? "test" : r->val ? "validation" : "train", &e);
        fprintf(stderr, "ember-train: wrote %" PRId64 " predictions to %s\n", e.n, r->s.predict);
        if (!r->s.eval_only) return EXIT_OK;
    }
    if (r->val) {
        if (evaluate(r, r->val, NULL, 0, NULL, &e) != EM_OK) {
            report_error("validation");
            return EXIT_TRAIN;
        }
        print_eval(r, "validation", &e);
    }
    if (r->test) {
        if (evaluate(r, r->test, NULL, 0, NULL, &e) != EM_OK) {
            report_error("test");
            return EXIT_TRAIN;
        }
        print_eval(r, "test", &e);
    }
    return EXIT_OK;
}

/* ---- checkpoints ----------------------------------------------------------------------------
 * em_checkpoint_save/load keep the model, optimizer, scheduler, the default generator, the
 * loop's epoch, step and best metric, and the run's identity; the trainer adds its batch
 * position within the epoch, its best epoch and its seed as metadata of its own ("train.*").
 * Every save is announced to the signal thread (stop_save_begin/end in ember-train.c), which
 * says what was saved when a second signal stops the run at once. */

static em_status meta_i64(em_metadata *m, const char *k, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return em_metadata_set(m, k, buf);
}

/* A file matching --checkpoint that is not this run's (another run's, none's, unreadable):
 * said once per count, since rotation leaves them alone and resuming by the pattern will ask
 * which run to continue. `when`: "" at start, else where they were seen. */
static void warn_other_files(run *r, const em_checkpoint_files *l, const char *when) {
    size_t others = 0, unreadable = 0;
    const em_checkpoint_file *newest = NULL, *bad = NULL;
    int64_t lowest = 0;
    for (size_t i = 0; i < em_checkpoint_files_len(l); i++) {
        const em_checkpoint_file *f = em_checkpoint_files_get(l, i);
        if (f->status != EM_OK) {
            unreadable++;
            if (!bad) bad = f;
        } else if (strcmp(f->run_id, r->run_id) != 0) {
            others++;
            if (!newest) newest = f;
            lowest = f->step;
        }
    }
    if (others + unreadable <= r->others_seen) return;
    r->others_seen = others + unreadable;
    bool pattern = strstr(r->s.checkpoint, "{step}") != NULL;
    if (others && pattern) {
        char steps[64];
        if (others == 1) snprintf(steps, sizeof steps, "step %" PRId64, newest->step);
        else snprintf(steps, sizeof steps, "steps %" PRId64 " to %" PRId64, lowest, newest->step);
        char whose[EM_CHECKPOINT_RUN_ID_MAX + 16];
        if (newest->run_id[0]) snprintf(whose, sizeof whose, "run %s", newest->run_id);
        else snprintf(whose, sizeof whose, "no recorded run");
        fprintf(stderr, "ember-train: warning%s: %zu checkpoint%s matching --checkpoint %s %s not "
                "this run's (%s, the newest %s, %s). Rotation (--keep) deletes only this run's "
                "files and leaves them alone, but a file of a step this run also saves is "
                "replaced, and --resume with the pattern will ask which run to continue: give "
                "each run its own directory or pattern.\n", when, others,
                others == 1 ? "" : "s", r->s.checkpoint, others == 1 ? "is" : "are", steps,
                newest->path, whose);
    } else if (others) {
        char what[EM_CHECKPOINT_RUN_ID_MAX + 64];
        if (!newest->is_checkpoint)
            snprintf(what, sizeof what, "a file that is not a checkpoint");
        else if (newest->run_id[0])
            snprintf(what, sizeof what, "a checkpoint of another run (%s)", newest->run_id);
        else
            snprintf(what, sizeof what, "a checkpoint that records no run");
        fprintf(stderr, "ember-train: warning: --checkpoint %s holds %s; this run replaces it at "
                "its first save\n", r->s.checkpoint, what);
    }
    if (unreadable)
        fprintf(stderr, "ember-train: warning%s: %zu file%s matching --checkpoint %s cannot be "
                "read and %s left alone (%s)\n", when, unreadable, unreadable == 1 ? "" : "s",
                r->s.checkpoint, unreadable == 1 ? "is" : "are", bad->error);
}

/* Save the checkpoint of r's position to path_out, then rotate. *saved: whether the file was
 * written (an error with *saved true is the rotation's). */
static em_status checkpoint_save(run *r, char *path_out, size_t cap, bool *saved) {
    const char *pattern = r->s.checkpoint;
    *saved = false;
    bool numbered = strstr(pattern, "{step}") != NULL;
    if (numbered) {
        if (em_checkpoint_path(pattern, r->step, path_out, cap) != EM_OK) return em_last_status();
    } else {
        snprintf(path_out, cap, "%s", pattern);
    }
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = r->model;
    ck.optimizer = r->opt;
    ck.scheduler = r->sched;
    ck.epoch = r->epoch;
    ck.step = r->step;
    ck.best_metric = r->best_metric;
    snprintf(ck.run_id, sizeof ck.run_id, "%s", r->run_id);
    em_metadata *m = em_metadata_new();
    em_status s = m ? EM_OK : em_last_status();
    if (s == EM_OK) s = meta_i64(m, "train.batch", r->batch);
    if (s == EM_OK) s = meta_i64(m, "train.best_epoch", r->best_epoch);
    if (s == EM_OK) s = meta_i64(m, "train.seed", (int64_t)r->s.seed);
    if (s == EM_OK) {
        stop_save_begin("checkpoint", path_out);
        s = em_checkpoint_save(path_out, &ck, m);
        stop_save_end(s == EM_OK, r->step);
    }
    em_metadata_free(m);
    if (s != EM_OK) return s;
    *saved = true;
    snprintf(r->last_saved, sizeof r->last_saved, "%s", path_out);
    r->last_saved_step = r->step;
    if (numbered) {
        em_checkpoint_rotation rot;
        if (em_checkpoint_rotate(pattern, path_out, (int)r->s.keep, &rot) != EM_OK)
            return em_last_status();
        if (rot.others > r->others_seen) { /* another run writing here now */
            em_checkpoint_files *l;
            if (em_checkpoint_list(pattern, &l) == EM_OK)
                warn_other_files(r, l, " (seen at rotation)");
            em_checkpoint_files_free(l);
        }
    }
    return EM_OK;
}

/* Before the first step (and in --dry-run): make the run's identity, say which files matching
 * --checkpoint are not this run's, and (unless `dry`) remove the temporary files that killed
 * saves of --checkpoint and --save-weights left. */
void checkpoint_prepare(run *r, bool dry) {
    if (!r->run_id[0] && em_checkpoint_run_id_new(r->run_id, sizeof r->run_id) != EM_OK)
        report_error("run identity");
    if (r->s.checkpoint) {
        em_checkpoint_files *l;
        if (em_checkpoint_list(r->s.checkpoint, &l) == EM_OK) warn_other_files(r, l, "");
        em_checkpoint_files_free(l);
    }
    const char *paths[2] = {r->s.checkpoint, r->s.save_weights};
    for (int i = 0; i < 2 && !dry; i++) {
        size_t n = 0;
        if (!paths[i]) continue;
        if (em_save_remove_stale(paths[i], &n) != EM_OK)
            fprintf(stderr, "ember-train: warning: %s\n", em_last_error());
        else if (n)
            fprintf(stderr, "ember-train: removed %zu temporary file%s that killed saves to %s "
                    "left behind\n", n, n == 1 ? "" : "s", paths[i]);
    }
}

/* The checkpoint --resume read (the pattern's newest file), for messages after the load. */
static char resumed_from[4096];

/* Metadata entry k of the checkpoint at path as an integer in [lo, hi]; EM_ERR_FORMAT naming
 * the file, the entry and the range otherwise (an empty or overflowing text included). */
static em_status meta_get_i64(const em_metadata *m, const char *path, const char *k, int64_t lo,
                              int64_t hi, int64_t *v) {
    const char *t = m ? em_metadata_get(m, k) : NULL;
    char *end = NULL;
    errno = 0;
    long long x = t && *t ? strtoll(t, &end, 10) : 0;
    if (!t || !*t || *end || errno || x < lo || x > hi)
        return em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata '%s' is %s%s%s; expected an "
                            "integer in [%lld, %lld]%s", path, k, t ? "'" : "", t ? t : "missing",
                            t ? "'" : "", (long long)lo, (long long)hi,
                            t ? "" : " (not an ember-train checkpoint?)");
    *v = x;
    return EM_OK;
}

/* Restore r from one checkpoint file. */
static em_status load_file(run *r, const char *path) {
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = r->model;
    ck.optimizer = r->opt;
    ck.scheduler = r->sched;
    em_metadata *m = NULL;
    em_checkpoint_load_options lo = EM_CHECKPOINT_LOAD_OPTIONS_INIT;
    lo.metadata_out = &m;
    em_status s = em_checkpoint_load(path, &ck, &lo);
    em_host_free(ck.config_out);
    int64_t batch = 0, be = -1;
    /* the batch is checked against the epoch's batches when the loader exists (train_loop) */
    if (s == EM_OK) s = meta_get_i64(m, path, "train.batch", 0, EM_STEP_MAX, &batch);
    if (s == EM_OK) s = meta_get_i64(m, path, "train.best_epoch", -1, ck.epoch, &be);
    if (s == EM_OK) {
        snprintf(resumed_from, sizeof resumed_from, "%s", path);
        r->epoch = ck.epoch;
        r->batch = batch;
        r->step = ck.step;
        r->best_epoch = be;
        r->best_metric = ck.best_metric;
        snprintf(r->run_id, sizeof r->run_id, "%s", ck.run_id);
        fprintf(stderr, "ember-train: resumed from %s at epoch %" PRId64 ", batch %" PRId64
                ", step %" PRId64 "\n", path, ck.epoch + 1, batch, ck.step);
    }
    em_metadata_free(m);
    return s;
}

/* --resume FILE, or --resume PATTERN: the newest checkpoint of the one run the pattern's files
 * belong to (em_checkpoint_latest refuses to choose between runs, naming them); when that file
 * is damaged, the next newest of the same run, with a warning for each one passed over. */
em_status checkpoint_load(run *r, const char *path) {
    if (!strstr(path, "{step}")) return load_file(r, path);
    int64_t step;
    char latest[4096];
    if (em_checkpoint_latest(path, &step, latest, sizeof latest) != EM_OK) {
        if (em_last_status() != EM_ERR_STATE) return em_last_status();
        char msg[1100];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        return em_set_error(EM_ERR_STATE, "%s. Name the checkpoint to continue from (--resume "
                            "FILE), or move the other run's files away", msg);
    }
    em_checkpoint_files *l;
    if (em_checkpoint_list(path, &l) != EM_OK) return em_last_status();
    char run_id[EM_CHECKPOINT_RUN_ID_MAX] = "", why[1100] = "";
    for (size_t i = 0; i < em_checkpoint_files_len(l); i++)
        if (!strcmp(em_checkpoint_files_get(l, i)->path, latest))
            snprintf(run_id, sizeof run_id, "%s", em_checkpoint_files_get(l, i)->run_id);
    em_status s = EM_ERR_NOTFOUND;
    size_t passed = 0;
    for (size_t i = 0; i < em_checkpoint_files_len(l); i++) {
        const em_checkpoint_file *f = em_checkpoint_files_get(l, i);
        if (f->status != EM_OK) {
            fprintf(stderr, "ember-train: warning: --resume %s: passing over %s\n", path, f->error);
            continue;
        }
        if (strcmp(f->run_id, run_id) != 0) continue;
        if ((s = load_file(r, f->path)) == EM_OK) break;
        if (s != EM_ERR_FORMAT && s != EM_ERR_IO) break; /* not damage: every file would fail */
        snprintf(why, sizeof why, "%s", em_last_error());
        fprintf(stderr, "ember-train: warning: --resume %s: %s is damaged (%s); trying the next "
                "newest checkpoint of its run\n", path, f->path, why);
        passed++;
    }
    if (s != EM_OK && passed && (s == EM_ERR_FORMAT || s == EM_ERR_IO))
        s = em_set_error(s, "none of the %zu checkpoints of the run loads (the oldest: %s)",
                         passed, why);
    em_checkpoint_files_free(l);
    return s;
}

/* ---- metrics files ---------------------------------------------------------------------------- */

/* One row, flushed; false when the file could not be written (o->err says why). */
static bool metrics_write(run *r, out_file *o, bool jsonl, const epoch_row *e) {
    const char *mn = classification(r) ? "val_accuracy" : "val_mae";
    if (jsonl) {
        OUT_PRINTF(o, "{\"epoch\": %" PRId64 ", \"step\": %" PRId64 ", \"lr\": %.9g, "
                "\"train_loss\": %.9g, \"grad_norm\": %.9g, \"val_loss\": %.9g, \"%s\": %.9g, "
                "\"samples_per_s\": %.6g, \"data_wait_pct\": %.4g, \"peak_memory\": %zu}\n",
                e->epoch, e->step, e->lr, e->train_loss, e->grad_norm, e->val_loss, mn,
                e->val_metric, e->samples_s, e->wait_pct, e->peak);
    } else {
        OUT_PRINTF(o, "%" PRId64 ",%" PRId64 ",%.9g,%.9g,%.9g,%.9g,%.9g,%.6g,%.4g,%zu\n", e->epoch,
                   e->step, e->lr, e->train_loss, e->grad_norm, e->val_loss, e->val_metric,
                   e->samples_s, e->wait_pct, e->peak);
    }
    return out_flush(o);
}

static size_t peak_total(const run *r) {
    em_memory_stats st;
    if (em_memory_stats_get(r->dev, &st) != EM_OK) return 0;
    return st.peak_reserved;
}

/* ---- the loop ---------------------------------------------------------------------------------- */

static void nan_hint(const run *r, double loss) {
    fprintf(stderr, "ember-train: the loss is %s at epoch %" PRId64 ", step %" PRId64 " (batch %"
            PRId64 "): training stopped.\n  Try a lower learning rate (--lr), gradient clipping "
            "(--clip-grad-norm 1.0), and --anomaly to name the op that first makes a NaN/Inf.\n",
            isnan(loss) ? "NaN" : "infinite", r->epoch + 1, r->step, r->batch);
    if (r->s.anomaly && !strncmp(em_last_error(), "anomaly:", 8))
        fprintf(stderr, "  %s\n", em_last_error());
}

/* One argument for a POSIX shell: as it is when it is plain, else in single quotes. */
static void put_shell_word(FILE *f, const char *w) {
    if (*w && strspn(w, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=@%+,-")
                  == strlen(w)) {
        fputs(w, f);
        return;
    }
    fputc('\'', f);
    for (; *w; w++) {
        if (*w == '\'') fputs("'\\''", f);
        else fputc(*w, f);
    }
    fputc('\'', f);
}

/* The command line as it was, without --resume, then --resume `from`. */
static void put_resume_command(FILE *f, const run *r, const char *from) {
    for (int i = 0; i < r->s.argc; i++) {
        const char *a = r->s.argv[i];
        if (i > 0 && !strcmp(a, "--resume")) {
            i++;
            continue;
        }
        if (i > 0 && !strncmp(a, "--resume=", 9)) continue;
        if (i > 0) fputc(' ', f);
        const char *libs = i == 0 ? strstr(a, "/.libs/") : NULL;
        if (libs && !strchr(libs + 7, '/')) {
            /* uninstalled: the libtool wrapper one directory up, which finds libember */
            char w[4096];
            const char *base = libs + 7;
            if (!strncmp(base, "lt-", 3)) base += 3;
            snprintf(w, sizeof w, "%.*s/%s", (int)(libs - a), a, base);
            put_shell_word(f, w);
            continue;
        }
        put_shell_word(f, a);
    }
    fputs(" --resume ", f);
    put_shell_word(f, from);
    fputc('\n', f);
}

/* SIGINT/SIGTERM asked the loop to stop (seen at a step boundary or at the end of an epoch):
 * save the checkpoint, then say what was saved and how to resume. EXIT_INTERRUPTED, or
 * EXIT_TRAIN when the checkpoint could not be written. */
static int interrupted(run *r) {
    int sig = atomic_load(r->stop);
    fprintf(stderr, "ember-train: interrupted by %s after step %" PRId64 " (epoch %" PRId64
            ", batch %" PRId64 ")%s\n", sig == SIGTERM ? "SIGTERM" : "SIGINT", r->step,
            r->epoch + 1, r->batch,
            r->s.checkpoint ? "; saving a checkpoint (a second signal stops at once)" : ".");
    int repeats = stop_repeats();
    if (repeats)
        fprintf(stderr, "  (%d more signal%s from the same sender within 250 ms: taken as the "
                "same one)\n", repeats, repeats == 1 ? "" : "s");
    if (!r->s.checkpoint) {
        fprintf(stderr, "  no --checkpoint was given, so nothing was saved; next time add "
                "--checkpoint PATH to be able to resume\n");
        return EXIT_INTERRUPTED;
    }
    char path[4096];
    bool saved = false;
    if (checkpoint_save(r, path, sizeof path, &saved) != EM_OK) {
        if (saved) {
            fprintf(stderr, "  checkpoint saved to %s, but removing the older ones failed: %s\n",
                    path, em_last_error());
        } else {
            fprintf(stderr, "  saving the checkpoint failed: %s\n", em_last_error());
            if (r->last_saved[0])
                fprintf(stderr, "  the last checkpoint saved is %s (step %" PRId64 "); the steps "
                        "after it are lost\n", r->last_saved, r->last_saved_step);
            else
                fprintf(stderr, "  nothing of this run was saved\n");
        }
        return EXIT_TRAIN;
    }
    fprintf(stderr, "  checkpoint saved to %s; resume with:\n    ", path);
    /* by the pattern, unless other runs' files would make it ask which run */
    put_resume_command(stderr, r, r->others_seen ? path : r->s.checkpoint);
    return EXIT_INTERRUPTED;
}

/* ---- the loader's wait per step ---------------------------------------------------------- */

/* Issue 6's figure: the median time a step waited for data (the sum of its batches'
 * em_loader_next waits), over this run's steps after a warm-up, against the median step time
 * (from one step's end to the next's). Both are recorded in arrays allocated once. */
enum { WAIT_WARMUP_STEPS = 10 };
typedef struct step_waits {
    double *wait, *time; /* seconds, per recorded step */
    int64_t n, cap;
} step_waits;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void print_step_waits(const run *r, step_waits *sw) {
    if (sw->n == 0) {
        fprintf(stderr, "  loader wait per step: no median (only the first %d steps, the "
                "warm-up, ran)\n", WAIT_WARMUP_STEPS);
        return;
    }
    double w = median(sw->wait, sw->n), t = median(sw->time, sw->n);
    fprintf(stderr, "  loader wait per step (median over steps %d..%" PRId64 " of this run, %"
            PRId64 " worker%s): %.1f us = %.2f%% of the median step time (%.3f ms)\n",
            WAIT_WARMUP_STEPS + 1, WAIT_WARMUP_STEPS + sw->n, r->s.workers,
            r->s.workers == 1 ? "" : "s", w * 1e6, t > 0 ? 100.0 * w / t : 0.0, t * 1e3);
}

int train_loop(run *r) {
    const int64_t A = r->s.accum_steps, B = r->s.batch_size;
    int64_t *subset = NULL, n_subset = 0;
    if (r->s.overfit_batches) {
        n_subset = r->s.overfit_batches * B;
        if (n_subset > em_dataset_length(r->train)) n_subset = em_dataset_length(r->train);
        subset = malloc((size_t)n_subset * sizeof *subset);
        for (int64_t i = 0; i < n_subset; i++) subset[i] = i;
    }
    em_loader *l = make_loader(r, r->train, true, subset, n_subset);
    if (!l) {
        report_error("data loader");
        free(subset);
        return EXIT_USAGE;
    }
    int64_t nb = em_loader_num_batches(l);
    if (r->s.limit_batches && r->s.limit_batches < nb) nb = r->s.limit_batches;
    if (r->batch > nb) {
        /* past the end of an epoch it would train nothing and exit 0 */
        fprintf(stderr, "ember-train: --resume: checkpoint '%s': metadata 'train.batch' is %" PRId64
                ", past the end of an epoch of this run (%" PRId64 " batches): a different "
                "dataset, --batch-size or --limit-batches?\n", resumed_from, r->batch, nb);
        em_loader_free(l);
        free(subset);
        return EXIT_USAGE;
    }
    bool tty = isatty(2), metrics_json = false;
    out_file mo = {0};
    step_waits sw = {0};
    int64_t steps_run = 0;
    {
        int64_t cap = 0; /* a product too large to count leaves the figure out */
        if (r->s.epochs > r->epoch &&
            __builtin_mul_overflow(r->s.epochs - r->epoch, (nb + A - 1) / A, &cap))
            cap = INT64_MAX;
        if (r->s.max_steps && r->s.max_steps - r->step < cap) cap = r->s.max_steps - r->step;
        if (cap > WAIT_WARMUP_STEPS && (uint64_t)cap <= SIZE_MAX / 2 / sizeof *sw.wait) {
            sw.wait = malloc((size_t)cap * sizeof *sw.wait);
            sw.time = malloc((size_t)cap * sizeof *sw.time);
            sw.cap = sw.wait && sw.time ? cap : 0; /* out of memory: the figure is left out */
        }
    }
    if (r->s.metrics) {
        size_t len = strlen(r->s.metrics);
        metrics_json = len > 6 && !strcmp(r->s.metrics + len - 6, ".jsonl");
        bool exists = r->s.resume && access(r->s.metrics, F_OK) == 0;
        bool ok = out_open(&mo, "--metrics", r->s.metrics, exists ? "a" : "w");
        if (ok && !metrics_json && !exists)
            OUT_PRINTF(&mo, "epoch,step,lr,train_loss,grad_norm,val_loss,%s,samples_per_s,"
                       "data_wait_pct,peak_memory\n", classification(r) ? "val_accuracy" : "val_mae");
        if (ok && !out_flush(&mo)) { /* a full disk, found before the first step */
            out_error(&mo);
            report_error(NULL);
            out_close(&mo);
            ok = false;
        }
        if (!ok) {
            em_loader_free(l);
            free(subset);
            free(sw.wait);
            free(sw.time);
            return EXIT_USAGE;
        }
    }
    em_dataset *val = r->s.overfit_batches ? r->train : r->val;
    const char *mn = metric_name(r);
    double t_start = now_s();
    int rc = EXIT_OK;
    bool stop_run = false, wait_hinted = false, first_step = true, mem_after_first = r->s.memory_summary;
    if ((r->epoch > 0 || r->batch > 0) &&
        em_loader_set_state(l, (em_loader_state){r->s.seed, r->epoch, r->batch}) != EM_OK) {
        fprintf(stderr, "ember-train: --resume: checkpoint '%s': %s\n", resumed_from,
                em_last_error());
        rc = EXIT_USAGE;
        stop_run = true;
    }
    bool loader_aligned = true;
    /* --early-stop: the epochs since the best one are r->epoch - r->best_epoch, so a resumed run
     * needs no state of its own; a checkpoint of a run that already stopped early stays stopped */
    bool stopped_early = false;
    if (r->s.early_stop && val && r->best_epoch >= 0 && r->batch == 0 &&
        r->epoch - 1 - r->best_epoch >= r->s.early_stop)
        stopped_early = stop_run = true;
    em_module_train(r->model, true);
    for (; r->epoch < r->s.epochs && !stop_run; r->epoch++) {
        if (!loader_aligned) em_loader_set_state(l, (em_loader_state){r->s.seed, r->epoch, r->batch});
        loader_aligned = true;
        em_loader_reset_stats(l);
        double t0 = now_s(), loss_sum = 0, gn_sum = 0;
        int64_t seen = 0, n_loss = 0, n_gn = 0;
        em_module_train(r->model, true);
        em_optimizer_zero_grad(r->opt);
        double t_step = now_s();
        uint64_t step_wait_ns = 0;
        while (r->batch < nb) {
            em_tensor *xs[IN_MAX], *y, *mask;
            em_status s = next_batch(r, l, xs, &y, &mask);
            if (s != EM_OK || !xs[0]) {
                if (s == EM_OK) em_set_error(EM_ERR_STATE, "the loader ended early");
                report_error("data");
                rc = EXIT_TRAIN;
                stop_run = true;
                break;
            }
            step_wait_ns += em_loader_get_stats(l).last_wait_ns;
            int64_t group_first = (r->batch / A) * A;
            int64_t group_len = nb - group_first < A ? nb - group_first : A;
            em_scope_begin();
            em_tensor *out = model_forward(r, xs, mask);
            em_tensor *pair[2] = {out, y};
            em_tensor *loss = out ? em_module_forward_n(r->loss, pair, 2) : NULL;
            double lv = loss ? em_item(loss) : NAN;
            if (!loss) {
                report_error("forward");
                rc = em_last_status() == EM_ERR_SHAPE ? EXIT_USAGE : EXIT_TRAIN;
            } else if (!isfinite(lv)) {
                nan_hint(r, lv);
                rc = EXIT_TRAIN;
            } else if (em_backward(group_len > 1 ? em_div_scalar(loss, (double)group_len) : loss) != EM_OK) {
                report_error("backward");
                rc = EXIT_TRAIN;
            }
            em_scope_end();
            if (rc) {
                stop_run = true;
                break;
            }
            loss_sum += lv * (double)em_tensor_shape(xs[0])[0];
            seen += em_tensor_shape(xs[0])[0];
            n_loss++;
            r->batch++;
            if (r->batch - group_first < group_len) continue;
            /* a step boundary */
            double gn = NAN;
            if (r->s.clip_grad_norm > 0 || mo.f) {
                double maxn = r->s.clip_grad_norm > 0 ? r->s.clip_grad_norm : INFINITY;
                if (em_clip_grad_norm_(r->params, maxn, 2.0, false, &gn) != EM_OK) {
                    report_error("clip_grad_norm");
                    rc = EXIT_TRAIN;
                    stop_run = true;
                    break;
                }
                if (isfinite(gn)) gn_sum += gn, n_gn++;
            }
            if (em_optimizer_step(r->opt) != EM_OK) {
                report_error("optimizer step");
                rc = EXIT_TRAIN;
                stop_run = true;
                break;
            }
            em_optimizer_zero_grad(r->opt);
            r->step++;
            if (r->sched && r->sched_per_step && em_scheduler_step(r->sched, NAN) != EM_OK) {
                report_error("scheduler");
                rc = EXIT_TRAIN;
                stop_run = true;
                break;
            }
            double t_end = now_s();
            if (++steps_run > WAIT_WARMUP_STEPS && sw.n < sw.cap) {
                sw.wait[sw.n] = (double)step_wait_ns * 1e-9;
                sw.time[sw.n] = t_end - t_step;
                sw.n++;
            }
            t_step = t_end;
            step_wait_ns = 0;
            if (mem_after_first && first_step) {
                fprintf(stderr, "ember-train: memory after the first step:\n");
                em_memory_summary(stderr);
            }
            first_step = false;
            if (tty) {
                double el = now_s() - t0;
                double eta = r->batch ? el / (double)r->batch * (double)(nb - r->batch) : 0;
                fprintf(stderr, "\repoch %" PRId64 "/%" PRId64 " [%" PRId64 "/%" PRId64 "] "
                        "loss %.4f  %.0f samples/s  ETA %.0fs   ", r->epoch + 1, r->s.epochs,
                        r->batch, nb, loss_sum / (double)(seen ? seen : 1),
                        el > 0 ? (double)seen / el : 0.0, eta);
            }
            if (atomic_load(r->stop)) {
                if (tty) fputc('\n', stderr);
                rc = interrupted(r);
                stop_run = true;
                break;
            }
            if (r->s.max_steps && r->step >= r->s.max_steps) {
                stop_run = true;
                break;
            }
        }
        if (tty) fputc('\n', stderr);
        if (rc) break;
        bool epoch_done = r->batch >= nb;
        double dt = now_s() - t0;
        em_loader_stats ls = em_loader_get_stats(l);
        double wait_pct = dt > 0 ? 100.0 * (double)ls.wait_ns * 1e-9 / dt : 0;
        if (!wait_hinted && wait_pct > 10.0 && dt > 0.2) {
            fprintf(stderr, "ember-train: waiting for data took %.0f%% of the epoch's time; more "
                    "loader threads may help (--workers %d)\n", wait_pct,
                    (int)(r->s.workers ? r->s.workers * 2 : 2));
            wait_hinted = true;
        }
        eval_result ev = {NAN, NAN, 0};
        if (val && evaluate(r, val, subset, n_subset, NULL, &ev) != EM_OK) {
            report_error("validation");
            rc = EXIT_TRAIN;
            break;
        }
        bool better = val && (isnan(r->best_metric) ||
                              (classification(r) ? ev.metric > r->best_metric : ev.metric < r->best_metric));
        if (better) {
            r->best_metric = ev.metric;
            r->best_epoch = r->epoch;
        }
        double lr = em_optimizer_lr(r->opt, 0);
        char vbuf[128] = "";
        if (val)
            snprintf(vbuf, sizeof vbuf, "  val loss %.4f %s %.2f%s", ev.loss, mn,
                     classification(r) ? 100 * ev.metric : ev.metric, classification(r) ? "%" : "");
        fprintf(stderr, "epoch %" PRId64 "/%" PRId64 "%s: train loss %.4f%s  lr %.3g  %.1fs  %.0f "
                "samples/s\n", r->epoch + 1, r->s.epochs, epoch_done ? "" : " (partial)",
                seen ? loss_sum / (double)seen : NAN, vbuf, lr, dt, dt > 0 ? (double)seen / dt : 0);
        bool metrics_failed = false;
        if (mo.f) {
            epoch_row row = {r->epoch + 1, r->step, lr, seen ? loss_sum / (double)seen : NAN,
                             n_gn ? gn_sum / (double)n_gn : NAN, ev.loss, ev.metric,
                             dt > 0 ? (double)seen / dt : 0, wait_pct, peak_total(r),
                             NAN, NAN, NAN, 0, NAN};
            if ((metrics_failed = !metrics_write(r, &mo, metrics_json, &row)))
                fprintf(stderr, "ember-train: --metrics %s: writing failed: %s; training stops "
                        "after epoch %" PRId64 "%s\n", mo.path, strerror(mo.err), r->epoch + 1,
                        r->s.checkpoint ? " and its checkpoint" : "");
        }
        (void)n_loss;
        if (epoch_done) {
            if (r->sched && !r->sched_per_step &&
                em_scheduler_step(r->sched, val ? ev.loss : loss_sum / (double)(seen ? seen : 1)) != EM_OK) {
                report_error("scheduler");
                rc = EXIT_TRAIN;
                break;
            }
            r->batch = 0;
            em_tensor *xs[IN_MAX], *y, *mask;
            if (nb < em_loader_num_batches(l)) loader_aligned = false;
            else if (next_batch(r, l, xs, &y, &mask) != EM_OK || xs[0]) /* the end-of-epoch mark */
                loader_aligned = false;
        }
        if (r->s.checkpoint || atomic_load(r->stop)) {
            /* a finished epoch is saved as the start of the next one */
            int64_t e = r->epoch;
            if (epoch_done) r->epoch++;
            char path[4096];
            bool saved = false;
            if (atomic_load(r->stop)) { /* a signal during the epoch's end: stop here */
                rc = interrupted(r);
            } else if (checkpoint_save(r, path, sizeof path, &saved) != EM_OK) {
                report_error(saved ? "--checkpoint (saved; removing the older ones)"
                                   : "--checkpoint");
                rc = EXIT_TRAIN;
            }
            r->epoch = e;
        }
        if (metrics_failed) { /* the exit code says a file was not written */
            if (rc == EXIT_OK && r->s.checkpoint && r->last_saved[0])
                fprintf(stderr, "  the checkpoint %s was saved: once --metrics can be written, "
                        "continue with --resume %s\n", r->last_saved, r->last_saved);
            rc = EXIT_TRAIN;
        }
        if (rc) break;
        if (!epoch_done) break;
        if (r->s.early_stop && val && r->epoch + 1 < r->s.epochs &&
            r->epoch - r->best_epoch >= r->s.early_stop) {
            stopped_early = true;
            r->epoch++; /* the epochs done, for the summary */
            break;
        }
    }
    stop_training_over(); /* from here a signal stops at once */
    double wall = now_s() - t_start;
    if (stopped_early)
        fprintf(stderr, "ember-train: stopped early after epoch %" PRId64 ": the validation %s "
                "has not improved for %" PRId64 " epoch%s (--early-stop %" PRId64 ")\n", r->epoch,
                mn, r->epoch - 1 - r->best_epoch, r->epoch - 1 - r->best_epoch == 1 ? "" : "s",
                r->s.early_stop);
    if (rc == EXIT_OK && r->test) {
        eval_result et;
        if (evaluate(r, r->test, NULL, 0, NULL, &et) != EM_OK) {
            report_error("test");
            rc = EXIT_TRAIN;
        } else {
            print_eval(r, "test", &et);
        }
    }
    if (rc == EXIT_OK && r->s.save_weights) {
        em_dict *sd = em_module_state_dict(r->model);
        em_status ws = EM_ERR_NOMEM;
        if (sd) {
            stop_save_begin("--save-weights file", r->s.save_weights);
            ws = em_save(sd, r->s.save_weights, NULL, NULL);
            stop_save_end(false, r->step);
        }
        if (ws != EM_OK) {
            report_error("--save-weights");
            rc = EXIT_TRAIN;
        } else {
            fprintf(stderr, "ember-train: weights saved to %s\n", r->s.save_weights);
        }
        em_dict_free(sd);
    }
    if (rc == EXIT_OK || rc == EXIT_INTERRUPTED) {
        fprintf(stderr, "ember-train: %" PRId64 " steps in %.1fs%s", r->step, wall,
                stopped_early ? " (stopped early)" : "");
        if (r->best_epoch >= 0)
            fprintf(stderr, "; best epoch %" PRId64 " with validation %s %.4f%s", r->best_epoch + 1,
                    mn, classification(r) ? 100 * r->best_metric : r->best_metric,
                    classification(r) ? "%" : "");
        fprintf(stderr, "\n");
        em_memory_stats st;
        if (em_memory_stats_get(r->dev, &st) == EM_OK) {
            fprintf(stderr, "  peak memory:");
            for (int c = 0; c < EM_MEM_CATEGORY_COUNT; c++)
                if (st.peak[c])
                    fprintf(stderr, " %s %.1f KiB", em_mem_category_name((em_mem_category)c),
                            (double)st.peak[c] / 1024.0);
            fprintf(stderr, "\n");
        }
        if (sw.cap) print_step_waits(r, &sw);
    }
    if (r->s.memory_summary) {
        fprintf(stderr, "ember-train: memory at the end:\n");
        em_memory_summary(stderr);
    }
    if (r->profiler) em_profiler_report(r->profiler, stderr, 25);
    bool reported = mo.err != 0; /* a row that failed was reported at its epoch */
    if (mo.f && !out_close(&mo) && !reported) {
        out_error(&mo);
        report_error(NULL);
        if (rc == EXIT_OK || rc == EXIT_INTERRUPTED) rc = EXIT_TRAIN;
    }
    em_loader_free(l);
    free(subset);
    free(sw.wait);
    free(sw.time);
    return rc;
}

/* --dry-run: one batch forward and backward, no step. */
int dry_run(run *r) {
    em_loader *l = make_loader(r, r->train, true, NULL, 0);
    if (!l) {
        report_error("data loader");
        return EXIT_USAGE;
    }
    em_tensor *xs[IN_MAX], *y, *mask;
    int rc = EXIT_OK;
    if (next_batch(r, l, xs, &y, &mask) != EM_OK || !xs[0]) {
        report_error("data");
        em_loader_free(l);
        return EXIT_USAGE;
    }
    em_module_train(r->model, true);
    em_scope_begin();
    em_tensor *out = model_forward(r, xs, mask);
    em_tensor *pair[2] = {out, y};
    em_tensor *loss = out ? em_module_forward_n(r->loss, pair, 2) : NULL;
    if (!loss || em_backward(loss) != EM_OK) {
        report_error("dry run");
        rc = EXIT_USAGE;
    } else {
        char xsh[64], os[64];
        em_shape_str(em_tensor_ndim(xs[0]), em_tensor_shape(xs[0]), xsh, sizeof xsh);
        em_shape_str(em_tensor_ndim(out), em_tensor_shape(out), os, sizeof os);
        printf("dry run ok: input %s -> output %s, loss %.6f, %" PRId64 " trainable parameters, "
               "optimizer %s with %d group%s\n", xsh, os, em_item(loss),
               em_module_parameter_count(r->model, true), em_optimizer_class(r->opt)->name,
               em_optimizer_group_count(r->opt), em_optimizer_group_count(r->opt) == 1 ? "" : "s");
    }
    em_scope_end();
    em_optimizer_zero_grad(r->opt);
    em_loader_free(l);
    return rc;
}
