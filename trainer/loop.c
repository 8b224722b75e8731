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
#include "trainer.h"

#include <errno.h>
#include <inttypes.h>
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
    if (subset) {
        o.sampler = EM_SAMPLER_SUBSET;
        o.subset = subset;
        o.subset_len = n_subset;
    }
    return em_loader_new(ds, &o);
}

/* ---- evaluation ---------------------------------------------------------------------------- */

typedef struct eval_result {
    double loss, metric; /* metric: accuracy in [0, 1], or MAE for regression */
    int64_t n;
} eval_result;

/* Evaluate on ds in eval mode under no_grad; predictions to `pred` (CSV) when not NULL. */
static em_status evaluate(run *r, em_dataset *ds, const int64_t *subset, int64_t n_subset,
                          FILE *pred, eval_result *out) {
    em_loader *l = make_loader(r, ds, false, subset, n_subset);
    if (!l) return em_last_status();
    bool was = em_module_training(r->model);
    em_module_train(r->model, false);
    em_grad_mode_push(EM_GRAD_DISABLED);
    double loss_sum = 0, metric_sum = 0;
    int64_t n = 0, b = 0, limit = r->s.limit_batches;
    em_status s = EM_OK;
    em_tensor *x, *y;
    while ((s = em_loader_next(l, &x, &y)) == EM_OK && x) {
        if (limit && b++ >= limit) continue; /* drain to the end mark */
        em_scope_begin();
        int64_t bs = em_tensor_shape(x)[0];
        em_tensor *outp = em_module_forward(r->model, x);
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
                fprintf(pred, "%" PRId64, n + i);
                for (int64_t j = 0; j < per; j++) {
                    if (classification(r))
                        fprintf(pred, ",%" PRId64 ",%" PRId64, ((int64_t *)em_tensor_data(pc))[i],
                                ((int64_t *)em_tensor_data(yc))[i]);
                    else
                        fprintf(pred, ",%.9g,%.9g", ((float *)em_tensor_data(pc))[i * per + j],
                                ((float *)em_tensor_data(yc))[i * per + j]);
                }
                fputc('\n', pred);
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
        FILE *f = fopen(r->s.predict, "w");
        if (!f) {
            fprintf(stderr, "ember-train: --predict %s: cannot write: %s\n", r->s.predict,
                    strerror(errno));
            return EXIT_USAGE;
        }
        fprintf(f, classification(r) ? "index,predicted,target\n" : "index,predicted,target\n");
        em_status s = evaluate(r, ds, NULL, 0, f, &e);
        if (fclose(f) != 0 && s == EM_OK) {
            fprintf(stderr, "ember-train: --predict %s: write failed\n", r->s.predict);
            return EXIT_TRAIN;
        }
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
 * em_checkpoint_save/load keep the model, optimizer, scheduler, the default generator and the
 * loop's epoch, step and best metric; the trainer adds its batch position within the epoch,
 * its best epoch and its seed as metadata of its own ("train.*"). */

static em_status meta_i64(em_metadata *m, const char *k, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return em_metadata_set(m, k, buf);
}

static em_status checkpoint_save(run *r, char *path_out, size_t cap) {
    const char *pattern = r->s.checkpoint;
    if (strstr(pattern, "{step}")) {
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
    em_metadata *m = em_metadata_new();
    em_status s = m ? EM_OK : em_last_status();
    if (s == EM_OK) s = meta_i64(m, "train.batch", r->batch);
    if (s == EM_OK) s = meta_i64(m, "train.best_epoch", r->best_epoch);
    if (s == EM_OK) s = meta_i64(m, "train.seed", (int64_t)r->s.seed);
    if (s == EM_OK) s = em_checkpoint_save(path_out, &ck, m);
    if (s == EM_OK && strstr(pattern, "{step}")) s = em_checkpoint_rotate(pattern, (int)r->s.keep, NULL);
    em_metadata_free(m);
    return s;
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

em_status checkpoint_load(run *r, const char *path) {
    char latest[4096];
    if (strstr(path, "{step}")) {
        int64_t st;
        if (em_checkpoint_latest(path, &st, latest, sizeof latest) != EM_OK) return em_last_status();
        path = latest;
    }
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
        fprintf(stderr, "ember-train: resumed from %s at epoch %" PRId64 ", batch %" PRId64
                ", step %" PRId64 "\n", path, ck.epoch + 1, batch, ck.step);
    }
    em_metadata_free(m);
    return s;
}

/* ---- metrics files ---------------------------------------------------------------------------- */

typedef struct epoch_row {
    int64_t epoch, step;
    double lr, train_loss, grad_norm, val_loss, val_metric, samples_s, wait_pct;
    size_t peak;
} epoch_row;

static void metrics_write(run *r, FILE *f, bool jsonl, const epoch_row *e) {
    const char *mn = classification(r) ? "val_accuracy" : "val_mae";
    if (jsonl) {
        fprintf(f, "{\"epoch\": %" PRId64 ", \"step\": %" PRId64 ", \"lr\": %.9g, "
                "\"train_loss\": %.9g, \"grad_norm\": %.9g, \"val_loss\": %.9g, \"%s\": %.9g, "
                "\"samples_per_s\": %.6g, \"data_wait_pct\": %.4g, \"peak_memory\": %zu}\n",
                e->epoch, e->step, e->lr, e->train_loss, e->grad_norm, e->val_loss, mn,
                e->val_metric, e->samples_s, e->wait_pct, e->peak);
    } else {
        fprintf(f, "%" PRId64 ",%" PRId64 ",%.9g,%.9g,%.9g,%.9g,%.9g,%.6g,%.4g,%zu\n", e->epoch,
                e->step, e->lr, e->train_loss, e->grad_norm, e->val_loss, e->val_metric,
                e->samples_s, e->wait_pct, e->peak);
    }
    fflush(f);
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

/* The command line as it was, without --resume, then --resume CHECKPOINT. */
static void put_resume_command(FILE *f, const run *r) {
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
    put_shell_word(f, r->s.checkpoint);
    fputc('\n', f);
}

static void interrupted_message(const run *r, const char *ckpt) {
    fprintf(stderr, "ember-train: interrupted by %s after step %" PRId64 " (epoch %" PRId64
            ", batch %" PRId64 ").\n", *r->stop == SIGTERM ? "SIGTERM" : "SIGINT", r->step,
            r->epoch + 1, r->batch);
    if (ckpt) {
        fprintf(stderr, "  checkpoint saved to %s; resume with:\n    ", ckpt);
        put_resume_command(stderr, r);
    } else
        fprintf(stderr, "  no --checkpoint was given, so nothing was saved; next time add "
                "--checkpoint PATH to be able to resume\n");
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
    FILE *mf = NULL;
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
        if (!(mf = fopen(r->s.metrics, exists ? "a" : "w"))) {
            fprintf(stderr, "ember-train: --metrics %s: cannot write: %s\n", r->s.metrics,
                    strerror(errno));
            em_loader_free(l);
            free(subset);
            return EXIT_USAGE;
        }
        if (!metrics_json && !exists)
            fprintf(mf, "epoch,step,lr,train_loss,grad_norm,val_loss,%s,samples_per_s,"
                    "data_wait_pct,peak_memory\n", classification(r) ? "val_accuracy" : "val_mae");
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
            em_tensor *x, *y;
            em_status s = em_loader_next(l, &x, &y);
            if (s != EM_OK || !x) {
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
            em_tensor *out = em_module_forward(r->model, x);
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
            loss_sum += lv * (double)em_tensor_shape(x)[0];
            seen += em_tensor_shape(x)[0];
            n_loss++;
            r->batch++;
            if (r->batch - group_first < group_len) continue;
            /* a step boundary */
            double gn = NAN;
            if (r->s.clip_grad_norm > 0 || mf) {
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
            if (*r->stop) {
                if (tty) fputc('\n', stderr);
                char path[4096];
                const char *saved = NULL;
                if (r->s.checkpoint) {
                    if (checkpoint_save(r, path, sizeof path) != EM_OK) report_error("checkpoint");
                    else saved = path;
                }
                interrupted_message(r, saved);
                rc = EXIT_INTERRUPTED;
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
        if (mf) {
            epoch_row row = {r->epoch + 1, r->step, lr, seen ? loss_sum / (double)seen : NAN,
                             n_gn ? gn_sum / (double)n_gn : NAN, ev.loss, ev.metric,
                             dt > 0 ? (double)seen / dt : 0, wait_pct, peak_total(r)};
            metrics_write(r, mf, metrics_json, &row);
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
            em_tensor *x, *y;
            if (nb < em_loader_num_batches(l)) loader_aligned = false;
            else if (em_loader_next(l, &x, &y) != EM_OK || x) /* the end-of-epoch mark */
                loader_aligned = false;
        }
        if (r->s.checkpoint) {
            /* a finished epoch is saved as the start of the next one */
            int64_t e = r->epoch;
            if (epoch_done) r->epoch++;
            char path[4096];
            if (checkpoint_save(r, path, sizeof path) != EM_OK) {
                report_error("checkpoint");
                rc = EXIT_TRAIN;
                r->epoch = e;
                break;
            }
            r->epoch = e;
        }
        if (!epoch_done) break;
        if (r->s.early_stop && val && r->epoch + 1 < r->s.epochs &&
            r->epoch - r->best_epoch >= r->s.early_stop) {
            stopped_early = true;
            r->epoch++; /* the epochs done, for the summary */
            break;
        }
    }
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
        if (!sd || em_save(sd, r->s.save_weights, NULL, NULL) != EM_OK) {
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
    if (r->s.profile) em_placement_report(stderr);
    if (mf) fclose(mf);
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
    em_tensor *x, *y;
    int rc = EXIT_OK;
    if (em_loader_next(l, &x, &y) != EM_OK || !x) {
        report_error("data");
        em_loader_free(l);
        return EXIT_USAGE;
    }
    em_module_train(r->model, true);
    em_scope_begin();
    em_tensor *out = em_module_forward(r->model, x);
    em_tensor *pair[2] = {out, y};
    em_tensor *loss = out ? em_module_forward_n(r->loss, pair, 2) : NULL;
    if (!loss || em_backward(loss) != EM_OK) {
        report_error("dry run");
        rc = EXIT_USAGE;
    } else {
        char xs[64], os[64];
        em_shape_str(em_tensor_ndim(x), em_tensor_shape(x), xs, sizeof xs);
        em_shape_str(em_tensor_ndim(out), em_tensor_shape(out), os, sizeof os);
        printf("dry run ok: input %s -> output %s, loss %.6f, %" PRId64 " trainable parameters, "
               "optimizer %s with %d group%s\n", xs, os, em_item(loss),
               em_module_parameter_count(r->model, true), em_optimizer_class(r->opt)->name,
               em_optimizer_group_count(r->opt), em_optimizer_group_count(r->opt) == 1 ? "" : "s");
    }
    em_scope_end();
    em_optimizer_zero_grad(r->opt);
    em_loader_free(l);
    return rc;
}
