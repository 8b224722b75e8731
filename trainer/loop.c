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
#include "ember/autocast.h"
#include "ember/autograd.h"
#include "ember/checkpoint.h"
#include "ember/data.h"
#include "ember/ddp.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/onnx.h"
#include "ember/ops.h"
#include "ember/optim.h"
#include "ember/plugin.h"
#include "ember/scope.h"
#include "ember/serialize.h"
#include "ember/tensor.h"
#include "ember/transform.h"
#include "ember/trace.h"
#include "metrics.h"
#include "metrics_file.h"
#include "plot.h"
#include "tensorboard.h"
#include "trainer.h"

#include <errno.h>
#include <stddef.h>
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

/* Class-index targets: one per sample, or one per position (sequence_targets). */
static bool classification(const run *r) {
    return r->info->num_classes > 0 && (r->info->target_ndim == 0 || sequence_targets(r));
}

bool sequence_targets(const run *r) {
    return r->info->num_classes > 0 && r->info->target_ndim == 1 && r->info->target_dtype == EM_I64;
}

em_tensor *loss_forward(const run *r, em_tensor *out, em_tensor *y) {
    if (out && y && sequence_targets(r)) {
        /* (B, L, V) logits against (B, L) next-token targets: the loss over B * L tokens,
         * as PyTorch scripts do with logits.view(-1, V) and y.view(-1) */
        const int64_t *os = em_tensor_shape(out), *ys = em_tensor_shape(y);
        if (em_tensor_ndim(out) != 3 || em_tensor_ndim(y) != 2 || os[0] != ys[0] ||
            os[1] != ys[1]) {
            char a[64], b[64];
            em_shape_str(em_tensor_ndim(out), os, a, sizeof a);
            em_shape_str(em_tensor_ndim(y), ys, b, sizeof b);
            em_set_error(EM_ERR_SHAPE, "the model's output %s does not fit the sequence targets "
                         "%s: per-position class targets (B, L) need (B, L, classes) outputs", a,
                         b);
            return NULL;
        }
        out = em_reshape(out, 2, (int64_t[]){os[0] * os[1], os[2]});
        y = em_reshape(y, 1, (int64_t[]){ys[0] * ys[1]});
    }
    em_tensor *pair[2] = {out, y};
    return out && y ? em_module_forward_n(r->loss, pair, 2) : NULL;
}

/* ---- loaders ------------------------------------------------------------------------------ */

static em_loader *make_loader(run *r, em_dataset *ds, bool train, const int64_t *subset,
                              int64_t n_subset) {
    em_loader_options o = {.struct_size = sizeof o,
                           .batch_size = train ? r->s.batch_size : r->s.eval_batch_size,
                           .shuffle = train && r->s.shuffle && !subset, .seed = r->s.seed,
                           .num_workers = (int)r->s.workers, .device = r->dev,
                           .transforms = r->tf,
                           /* its workers' tracks in --trace: "train worker 0", ... */
                           .name = train ? "train" : ds == r->val ? "val"
                                   : ds == r->test ? "test" : "eval"};
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
    if (r->d.comm) {
        /* this rank's shard (DistributedSampler): the permutation of every rank, cut into
         * items rank, rank + world, ...; padded with the first items to a multiple of the world
         * size, so every rank has as many batches (evaluate counts the padding out) */
        o.sampler = EM_SAMPLER_SHARDED;
        o.rank = r->d.rank;
        o.world_size = r->d.world;
    }
    return em_loader_new(ds, &o);
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

/* --amp: the autocast region around a forward and its loss (ember/autocast.h), on the run's
 * device type in bf16 or fp16. EM_OK without --amp. */
static em_status amp_begin(const run *r) {
    if (!r->s.amp[0]) return EM_OK;
    char type[48];
    em_device_str(r->dev, type, sizeof type);
    type[strcspn(type, ":")] = '\0';
    return em_autocast_begin(type, strcmp(r->s.amp, "fp16") ? EM_BF16 : EM_F16);
}
static void amp_end(const run *r) {
    if (r->s.amp[0]) em_autocast_end();
}

/* The model on a batch's inputs, with the padding mask for the layers that take one. */
static em_tensor *model_forward(const run *r, em_tensor *const *in, em_tensor *mask) {
    /* training under data parallelism: rank 0's buffers first, SyncBatchNorm's communicator */
    if (r->d.ddp && em_module_training(r->model))
        return em_ddp_forward_masked(r->d.ddp, in, r->n_in, mask);
    return em_module_forward_masked(r->model, in, r->n_in, mask);
}

/* The batch's metric as a sum over its samples: correct predictions (classification: the
 * argmax of out (B, C) against the labels y (B)), or the per-sample mean absolute error
 * (regression). *pred (may be NULL): the predictions (labels, or out itself). NULL on error. */
static em_tensor *batch_metric(const run *r, em_tensor *out, em_tensor *y, int64_t bs,
                               em_tensor **pred) {
    em_tensor *p, *m;
    if (classification(r)) {
        int dim = sequence_targets(r) ? 2 : 1; /* (B, C), or (B, L, C) per position */
        p = em_argmax(out, &dim, false);
        m = em_sum(em_to_dtype(em_eq(p, y), EM_F32), 0, NULL, false);
        if (m && sequence_targets(r)) m = em_div_scalar(m, (double)(em_tensor_numel(y) / bs));
    } else {
        p = out;
        m = em_sum(em_abs(em_sub(out, em_reshape(y, em_tensor_ndim(out), em_tensor_shape(out)))),
                   0, NULL, false);
        if (m) m = em_div_scalar(m, (double)(em_tensor_numel(out) / bs));
    }
    if (pred) *pred = p;
    return m;
}

/* ---- evaluation ---------------------------------------------------------------------------- */

typedef struct eval_result {
    double loss, metric; /* metric: accuracy in [0, 1], or MAE for regression */
    int64_t n;
    /* sequence targets: the perplexity of the targets' own token frequencies (the best any
     * model blind to context does on them: exp of their entropy); NAN otherwise */
    double unigram_ppl;
} eval_result;

/* Whether the loss is a mean token cross-entropy, whose exp is the perplexity. */
static bool perplexity_loss(const run *r) {
    return sequence_targets(r) && (!strcmp(r->loss_class, "CrossEntropyLoss") ||
                                   !strcmp(r->loss_class, "NLLLoss"));
}

/* exp(-sum p log p) of the counts[0..k) (n in all). */
static double unigram_perplexity(const int64_t *counts, int64_t k, int64_t n) {
    double h = 0;
    for (int64_t c = 0; c < k; c++)
        if (counts[c]) {
            double p = (double)counts[c] / (double)n;
            h -= p * log(p);
        }
    return exp(h);
}

/* Evaluate on ds in eval mode under no_grad; predictions to `pred` (CSV) when not NULL (a
 * failed write stops the evaluation with EM_ERR_IO naming the file and the reason).
 * Data-parallel: each rank evaluates its shard and the sums are reduced over the ranks. A
 * shard's item j sits at position j * world + rank of the (padded) epoch, so the padding (the
 * positions from the dataset's length on, repeating its first items) is the end of a shard:
 * those rows are left out of the loss and the metric, and every sample counts once. */
static em_status evaluate(run *r, em_dataset *ds, const int64_t *subset, int64_t n_subset,
                          out_file *pred, eval_result *out) {
    em_loader *l = make_loader(r, ds, false, subset, n_subset);
    if (!l) return em_last_status();
    bool was = em_module_training(r->model);
    em_module_train(r->model, false);
    em_grad_mode_push(EM_GRAD_DISABLED);
    double loss_sum = 0, metric_sum = 0;
    int64_t n = 0, b = 0, limit = r->s.limit_batches, K = r->info->num_classes, tokens = 0;
    /* data-parallel: the items of this rank's shard that are not padding, and the shard's
     * items delivered so far */
    const int64_t W = r->d.world, own = (em_dataset_length(ds) - r->d.rank + W - 1) / W;
    int64_t at = 0;
    int64_t *counts = sequence_targets(r) ? calloc((size_t)K, sizeof *counts) : NULL;
    em_status s = sequence_targets(r) && !counts
                      ? em_set_error(EM_ERR_NOMEM, "evaluate: out of memory for %lld token "
                                     "counts", (long long)K)
                      : EM_OK;
    if (s != EM_OK) {
        em_grad_mode_pop();
        em_module_train(r->model, was);
        em_loader_free(l);
        return s;
    }
    em_tensor *xs[IN_MAX], *y, *mask;
    while ((s = next_batch(r, l, xs, &y, &mask)) == EM_OK && xs[0]) {
        int64_t bs = em_tensor_shape(xs[0])[0], first = at;
        at += bs;
        if (limit && b++ >= limit) continue; /* drain to the end mark */
        if (r->d.comm && first + bs > own) bs = own > first ? own - first : 0;
        if (bs == 0) continue; /* padding only */
        em_scope_begin();
        em_status as = amp_begin(r);
        em_tensor *outp = as == EM_OK ? model_forward(r, xs, mask) : NULL;
        if (outp && bs < em_tensor_shape(outp)[0]) { /* the padding's rows out */
            outp = em_narrow(outp, 0, 0, bs);
            y = em_narrow(y, 0, 0, bs);
        }
        em_tensor *loss = loss_forward(r, outp, y);
        if (as == EM_OK) amp_end(r);
        em_tensor *pred_t = NULL, *m = loss ? batch_metric(r, outp, y, bs, &pred_t) : NULL;
        if (!m) {
            s = em_last_status();
            em_scope_end();
            break;
        }
        loss_sum += em_item(loss) * (double)bs;
        metric_sum += em_item(m);
        if (counts) {
            em_tensor *yc = em_contiguous(em_to_device(y, em_cpu()));
            if (!yc) {
                s = em_last_status();
                em_scope_end();
                break;
            }
            const int64_t *t = em_tensor_data(yc);
            for (int64_t i = 0; i < em_tensor_numel(yc); i++)
                if (t[i] >= 0 && t[i] < K) counts[t[i]]++, tokens++;
        }
        if (pred) {
            em_tensor *pc = em_to_device(em_to_dtype(pred_t, classification(r) ? EM_I64 : EM_F32), em_cpu());
            em_tensor *yc = em_to_device(em_to_dtype(y, classification(r) ? EM_I64 : EM_F32), em_cpu());
            /* --predict-scores: the model's outputs (B, C), or their softmax */
            em_tensor *sc = NULL;
            int64_t C = em_tensor_ndim(outp) == 2 ? em_tensor_shape(outp)[1] : 0;
            if (r->s.predict_scores && C) {
                em_tensor *v = r->s.predict_scores == PREDICT_PROBABILITIES ? em_softmax(outp, 1) : outp;
                sc = v ? em_contiguous(em_to_device(em_to_dtype(v, EM_F32), em_cpu())) : NULL;
                if (!sc) {
                    s = em_last_status();
                    em_scope_end();
                    break;
                }
            }
            int64_t per = em_tensor_numel(pc) / bs;
            for (int64_t i = 0; i < bs; i++) {
                OUT_PRINTF(pred, "%" PRId64, n + i);
                for (int64_t j = 0; j < per; j++) {
                    if (classification(r))
                        OUT_PRINTF(pred, ",%" PRId64 ",%" PRId64,
                                   ((int64_t *)em_tensor_data(pc))[i * per + j],
                                   ((int64_t *)em_tensor_data(yc))[i * per + j]);
                    else
                        OUT_PRINTF(pred, ",%.9g,%.9g", ((float *)em_tensor_data(pc))[i * per + j],
                                   ((float *)em_tensor_data(yc))[i * per + j]);
                }
                for (int64_t j = 0; sc && j < C; j++)
                    OUT_PRINTF(pred, ",%.9g", ((float *)em_tensor_data(sc))[i * C + j]);
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
    if (s == EM_OK && counts && r->d.comm) { /* data-parallel: every rank's token counts */
        double *c = malloc(sizeof *c * (size_t)(K + 1));
        if (!c) {
            s = em_set_error(EM_ERR_NOMEM, "evaluate: out of memory for %lld token counts",
                             (long long)K);
        } else {
            for (int64_t i = 0; i < K; i++) c[i] = (double)counts[i];
            c[K] = (double)tokens;
            if ((s = ddp_sum(r, c, (int)(K + 1))) == EM_OK) {
                for (int64_t i = 0; i < K; i++) counts[i] = (int64_t)c[i];
                tokens = (int64_t)c[K];
            }
            free(c);
        }
    }
    out->unigram_ppl = counts && tokens ? unigram_perplexity(counts, K, tokens) : NAN;
    free(counts);
    if (s != EM_OK) return s;
    double sums[3] = {loss_sum, metric_sum, (double)n};
    if ((s = ddp_sum(r, sums, 3)) != EM_OK) return s;
    loss_sum = sums[0];
    metric_sum = sums[1];
    n = (int64_t)sums[2];
    out->n = n;
    out->loss = n ? loss_sum / (double)n : NAN;
    out->metric = n ? metric_sum / (double)n : NAN;
    return EM_OK;
}

static const char *metric_name(const run *r) { return classification(r) ? "accuracy" : "MAE"; }

static void print_eval(const run *r, const char *what, const eval_result *e) {
    if (!primary(r)) return;
    if (perplexity_loss(r))
        printf("%s: loss %.6f perplexity %.4f (unigram %.4f) token accuracy %.4f%% (%" PRId64
               " samples)\n", what, e->loss, exp(e->loss), e->unigram_ppl, 100.0 * e->metric,
               e->n);
    else if (classification(r))
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
        OUT_PRINTF(&f, "index,predicted,target");
        for (int64_t c = 0; r->s.predict_scores && c < r->info->num_classes; c++)
            OUT_PRINTF(&f, r->s.predict_scores == PREDICT_LOGITS ? ",logit_%" PRId64 : ",prob_%" PRId64, c);
        OUT_PRINTF(&f, "\n");
        em_status s = evaluate(r, ds, NULL, 0, &f, &e);
        if (!out_close(&f) && s == EM_OK) s = out_error(&f);
        if (s != EM_OK) {
            report_error("predict");
            return EXIT_TRAIN;
        }
        print_eval(r, r->test ? "test" : r->val ? "validation" : "train", &e);
        say(r, "ember-train: wrote %" PRId64 " predictions to %s\n", e.n, r->s.predict);
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

/* %.17g: the double comes back bit for bit */
static em_status meta_f64(em_metadata *m, const char *k, double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    return em_metadata_set(m, k, buf);
}

/* The epoch_sums fields as metadata entries. */
static const struct {
    const char *key;
    size_t off;
    bool f; /* a double; else an int64_t */
} part_keys[] = {
    {"train.epoch_loss_sum", offsetof(epoch_sums, loss), true},
    {"train.epoch_metric_sum", offsetof(epoch_sums, metric), true},
    {"train.epoch_grad_norm_sum", offsetof(epoch_sums, grad_norm), true},
    {"train.epoch_time_s", offsetof(epoch_sums, time_s), true},
    {"train.epoch_wait_s", offsetof(epoch_sums, wait_s), true},
    {"train.epoch_samples", offsetof(epoch_sums, samples), false},
    {"train.epoch_grad_norms", offsetof(epoch_sums, grad_norms), false},
};
enum { N_PART = sizeof part_keys / sizeof *part_keys };

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
        warn(r, "ember-train: warning%s: %zu checkpoint%s matching --checkpoint %s %s not "
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
        warn(r, "ember-train: warning: --checkpoint %s holds %s; this run replaces it at "
                "its first save\n", r->s.checkpoint, what);
    }
    if (unreadable)
        warn(r, "ember-train: warning%s: %zu file%s matching --checkpoint %s cannot be "
                "read and %s left alone (%s)\n", when, unreadable, unreadable == 1 ? "" : "s",
                r->s.checkpoint, unreadable == 1 ? "is" : "are", bad->error);
}

static em_status checkpoint_write(run *r, const char *path_out, const char *rng_ranks,
                                  bool *saved);

/* Save the checkpoint of r's position to path_out, then rotate. *saved: whether the file was
 * written (an error with *saved true is the rotation's). Data-parallel: collective; every
 * rank's generator state goes to rank 0, which writes the file, and its outcome comes back to
 * every rank. */
static em_status checkpoint_save(run *r, char *path_out, size_t cap, bool *saved) {
    const char *pattern = r->s.checkpoint;
    *saved = false;
    bool numbered = strstr(pattern, "{step}") != NULL;
    em_status s = EM_OK;
    if (numbered) {
        s = em_checkpoint_path(pattern, r->step, path_out, cap); /* the same on every rank */
        if (s != EM_OK) return s;
    } else {
        snprintf(path_out, cap, "%s", pattern);
    }
    char *rng_ranks = NULL;
    if ((s = ddp_rng_text(r, &rng_ranks)) != EM_OK) return ddp_share_status(r, s, saved, path_out);
    if (primary(r)) s = checkpoint_write(r, path_out, rng_ranks, saved);
    free(rng_ranks);
    s = ddp_share_status(r, s, saved, path_out);
    if (*saved) {
        snprintf(r->last_saved, sizeof r->last_saved, "%s", path_out);
        r->last_saved_step = r->step;
    }
    return s;
}

/* checkpoint_save's writing and rotating (rank 0's part). */
static em_status checkpoint_write(run *r, const char *path_out, const char *rng_ranks,
                                  bool *saved) {
    const char *pattern = r->s.checkpoint;
    bool numbered = strstr(pattern, "{step}") != NULL;
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = r->model;
    ck.optimizer = r->opt;
    ck.scheduler = r->sched;
    ck.scaler = r->scaler;
    ck.epoch = r->epoch;
    ck.step = r->step;
    ck.best_metric = r->best_metric;
    snprintf(ck.run_id, sizeof ck.run_id, "%s", r->run_id);
    em_metadata *m = em_metadata_new();
    em_status s = m ? EM_OK : em_last_status();
    if (s == EM_OK) s = meta_i64(m, "train.batch", r->batch);
    if (s == EM_OK) s = meta_i64(m, "train.best_epoch", r->best_epoch);
    if (s == EM_OK) s = meta_i64(m, "train.seed", (int64_t)r->s.seed);
    const em_metadata *dm = em_dataset_metadata(r->train); /* a vocabulary, ... */
    for (size_t i = 0; s == EM_OK && i < em_metadata_len(dm); i++)
        if (strncmp(em_metadata_key(dm, i), "train.", 6))
            s = em_metadata_set(m, em_metadata_key(dm, i), em_metadata_value(dm, i));
    /* data-parallel: the world size (a resume needs the same) and every rank's stream */
    if (s == EM_OK && r->d.comm) s = meta_i64(m, "train.world_size", r->d.world);
    if (s == EM_OK && rng_ranks) s = em_metadata_set(m, "train.rng_ranks", rng_ranks);
    /* the epoch so far, for its figures over all its batches after a resume */
    const epoch_sums z = {0}, *e = r->batch ? &r->part : &z;
    for (int i = 0; i < N_PART && s == EM_OK; i++)
        s = part_keys[i].f ? meta_f64(m, part_keys[i].key, *(const double *)((const char *)e + part_keys[i].off))
                           : meta_i64(m, part_keys[i].key, *(const int64_t *)((const char *)e + part_keys[i].off));
    if (s == EM_OK) {
        stop_save_begin("checkpoint", path_out);
        s = em_checkpoint_save(path_out, &ck, m);
        stop_save_end(s == EM_OK, r->step);
    }
    em_metadata_free(m);
    if (s != EM_OK) return s;
    *saved = true;
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
 * saves of --checkpoint, --save-weights and --save-best left. */
void checkpoint_prepare(run *r, bool dry) {
    if (!r->run_id[0] && em_checkpoint_run_id_new(r->run_id, sizeof r->run_id) != EM_OK)
        report_error("run identity");
    if (!primary(r)) return; /* rank 0 writes the files */
    if (r->s.checkpoint) {
        em_checkpoint_files *l;
        if (em_checkpoint_list(r->s.checkpoint, &l) == EM_OK) warn_other_files(r, l, "");
        em_checkpoint_files_free(l);
    }
    const char *paths[3] = {r->s.checkpoint, r->s.save_weights, r->s.save_best};
    for (int i = 0; i < 3 && !dry; i++) {
        size_t n = 0;
        if (!paths[i]) continue;
        if (em_save_remove_stale(paths[i], &n) != EM_OK)
            warn(r, "ember-train: warning: %s\n", em_last_error());
        else if (n)
            say(r, "ember-train: removed %zu temporary file%s that killed saves to %s left "
                "behind\n", n, n == 1 ? "" : "s", paths[i]);
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

/* Metadata entry k as a finite number >= 0; EM_ERR_FORMAT naming the file and entry otherwise. */
static em_status meta_get_f64(const em_metadata *m, const char *path, const char *k, double *v) {
    const char *t = em_metadata_get(m, k);
    char *end = NULL;
    errno = 0;
    double x = t && *t ? strtod(t, &end) : NAN;
    if (!t || !*t || *end || errno || !isfinite(x) || x < 0)
        return em_set_error(EM_ERR_FORMAT, "checkpoint '%s': metadata '%s' is '%s'; expected a "
                            "finite number >= 0", path, k, t ? t : "");
    *v = x;
    return EM_OK;
}

/* Restore r from one checkpoint file. */
static em_status load_file(run *r, const char *path) {
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.model = r->model;
    ck.optimizer = r->opt;
    ck.scheduler = r->sched;
    ck.scaler = r->scaler;
    em_metadata *m = NULL;
    em_checkpoint_load_options lo = EM_CHECKPOINT_LOAD_OPTIONS_INIT;
    lo.metadata_out = &m;
    em_status s = em_checkpoint_load(path, &ck, &lo);
    em_host_free(ck.config_out);
    int64_t batch = 0, be = -1;
    /* the batch is checked against the epoch's batches when the loader exists (train_loop) */
    if (s == EM_OK) s = meta_get_i64(m, path, "train.batch", 0, EM_STEP_MAX, &batch);
    if (s == EM_OK) s = meta_get_i64(m, path, "train.best_epoch", -1, ck.epoch, &be);
    /* the ranks: absent from a single process's checkpoint. The shards, and every rank's
     * random stream, are those of one world size */
    int64_t world = 1;
    if (s == EM_OK && em_metadata_get(m, "train.world_size"))
        s = meta_get_i64(m, path, "train.world_size", 1, INT32_MAX, &world);
    if (s == EM_OK && world != r->d.world)
        s = em_set_error(EM_ERR_STATE, "checkpoint '%s' was written by a run on %" PRId64
                         " process%s%s and this run has %d: resume it with the same number "
                         "(%s%" PRId64 "), since each rank's shard of the data and its random "
                         "stream depend on it (to change the number, start a new run from the "
                         "model's weights: --save-weights, then --init-weights)", path, world, world == 1 ? "" : "es",
                         world == 1 ? " (no mpirun)" : "", r->d.world,
                         world == 1 ? "without mpirun, or -np " : "mpirun -np ", world);
    if (s == EM_OK && r->d.comm) {
        const char *t = em_metadata_get(m, "train.rng_ranks");
        s = t ? ddp_rng_parse(r, path, t)
              : em_set_error(EM_ERR_FORMAT, "checkpoint '%s': no metadata 'train.rng_ranks' (each "
                             "rank's random state) in a checkpoint of %" PRId64 " ranks", path,
                             world);
    }
    /* the epoch's sums: absent from checkpoints older than them (the resumed epoch's figures
     * then cover the batches after the resume) */
    epoch_sums part = {0};
    bool have_part = false;
    for (int i = 0; i < N_PART && s == EM_OK; i++) {
        if (!em_metadata_get(m, part_keys[i].key)) continue;
        have_part = true;
        void *at = (char *)&part + part_keys[i].off;
        if (part_keys[i].f) s = meta_get_f64(m, path, part_keys[i].key, at);
        else s = meta_get_i64(m, path, part_keys[i].key, 0, INT64_MAX, at);
    }
    if (s == EM_OK) {
        snprintf(resumed_from, sizeof resumed_from, "%s", path);
        r->epoch = ck.epoch;
        r->batch = batch;
        r->step = ck.step;
        r->best_epoch = be;
        r->best_metric = ck.best_metric;
        r->part = part;
        if (batch > 0 && !have_part)
            warn(r, "ember-train: warning: %s holds no sums of its epoch so far (written "
                    "by an older ember-train): epoch %" PRId64 "'s figures will cover the batches "
                    "after the resume only\n", path, ck.epoch + 1);
        snprintf(r->run_id, sizeof r->run_id, "%s", ck.run_id);
        say(r, "ember-train: resumed from %s at epoch %" PRId64 ", batch %" PRId64 ", step %"
            PRId64 "\n", path, ck.epoch + 1, batch, ck.step);
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
            warn(r, "ember-train: warning: --resume %s: passing over %s\n", path, f->error);
            continue;
        }
        if (strcmp(f->run_id, run_id) != 0) continue;
        if ((s = load_file(r, f->path)) == EM_OK) break;
        if (s != EM_ERR_FORMAT && s != EM_ERR_IO) break; /* not damage: every file would fail */
        snprintf(why, sizeof why, "%s", em_last_error());
        warn(r, "ember-train: warning: --resume %s: %s is damaged (%s); trying the next "
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

static size_t peak_total(const run *r) {
    em_memory_stats st;
    if (em_memory_stats_get(r->dev, &st) != EM_OK) return 0;
    return st.peak_reserved;
}

/* ---- the sinks: every place the loop's rows go (metrics.h) ----------------------------------
 * All of them are opened in sinks_open and called only through the functions below, which say
 * which sink failed and why. A new sink is one more entry in sinks_open. */

enum { SINKS_MAX = 8, SINK_FLUSH_S = 10 };

typedef struct sinks {
    metrics_sink s[SINKS_MAX];
    bool dead[SINKS_MAX];     /* failed (reported): not called again, but closed */
    int n;
    bool epochs, steps;       /* some sink takes epoch rows / step rows */
    const char *failed;       /* the option of the first sink that failed; NULL: none */
    double last_flush;
} sinks;

/* Sink i failed: "ember-train: OPTION ERR[THEN]"; false. */
static bool sink_fail(sinks *k, int i, const char *then) {
    fprintf(stderr, "ember-train: %s %s%s\n", k->s[i].option, k->s[i].err, then ? then : "");
    k->dead[i] = true;
    if (!k->failed) k->failed = k->s[i].option;
    return false;
}

static bool sinks_add_file(run *r, sinks *k, const char *option, const char *path, bool steps) {
    metrics_sink *s = &k->s[k->n];
    int ng = em_optimizer_group_count(r->opt);
    metrics_file_spec spec = {.option = option, .path = path, .steps = steps,
                              .append = r->s.resume != NULL, .classification = classification(r),
                              .n_groups = ng < METRIC_GROUPS_MAX ? ng : METRIC_GROUPS_MAX,
                              .amp = r->s.amp[0] != '\0',
                              .perplexity = perplexity_loss(r)};
    if (!metrics_file_open(s, &spec)) {
        fprintf(stderr, "ember-train: %s %s\n", option, s->err);
        return false;
    }
    k->n++;
    return true;
}

static bool sinks_add_tensorboard(run *r, sinks *k) {
    metrics_sink *s = &k->s[k->n];
    if (!tensorboard_sink_open(s, r->s.tensorboard, r->s.tensorboard_histograms,
                               classification(r) ? "accuracy" : "mae",
                               r->s.resume ? r->step : -1)) {
        fprintf(stderr, "ember-train: --tensorboard %s\n", s->err);
        return false;
    }
    say(r, "ember-train: --tensorboard: writing %s\n", tensorboard_sink_path(s));
    k->n++;
    return true;
}

static bool sinks_add_plot(run *r, sinks *k) {
    metrics_sink *s = &k->s[k->n];
    if (!plot_sink_open(s, r->s.plot, classification(r) ? "accuracy" : "mae")) {
        fprintf(stderr, "ember-train: --plot %s\n", s->err);
        return false;
    }
    k->n++;
    return true;
}

/* Open every sink the run asks for; false (after the message, the others closed) when one
 * cannot be opened. */
static bool sinks_open(run *r, sinks *k) {
    memset(k, 0, sizeof *k);
    k->last_flush = now_s();
    bool ok = (!r->s.metrics || sinks_add_file(r, k, "--metrics", r->s.metrics, false)) &&
              (!r->s.metrics_steps ||
               sinks_add_file(r, k, "--metrics-steps", r->s.metrics_steps, true)) &&
              (!r->s.tensorboard || sinks_add_tensorboard(r, k)) &&
              (!r->s.plot || sinks_add_plot(r, k));
    for (int i = 0; i < k->n; i++) {
        if (!ok) k->s[i].close(&k->s[i]);
        k->epochs |= k->s[i].epoch != NULL;
        k->steps |= k->s[i].step != NULL;
    }
    if (!ok) k->n = 0;
    return ok;
}

/* Each hands its row to every live sink that takes it; false after the first failure's
 * message (THEN completes it: what the loop does now). */
static bool sinks_step(sinks *k, const step_row *row, const char *then) {
    for (int i = 0; i < k->n; i++)
        if (!k->dead[i] && k->s[i].step && !k->s[i].step(&k->s[i], row))
            return sink_fail(k, i, then);
    return true;
}

static bool sinks_epoch(sinks *k, const epoch_row *row, const char *then) {
    for (int i = 0; i < k->n; i++)
        if (!k->dead[i] && k->s[i].epoch && !k->s[i].epoch(&k->s[i], row))
            return sink_fail(k, i, then);
    return true;
}

static bool sinks_params(sinks *k, int64_t epoch, int64_t step, const em_dict *params,
                         const char *then) {
    for (int i = 0; i < k->n; i++)
        if (!k->dead[i] && k->s[i].params && !k->s[i].params(&k->s[i], epoch, step, params))
            return sink_fail(k, i, then);
    return true;
}

/* Flush every sink when `force` or SINK_FLUSH_S seconds have passed since the last flush. */
static bool sinks_flush(sinks *k, bool force, const char *then) {
    double t = now_s();
    if (!force && t - k->last_flush < SINK_FLUSH_S) return true;
    k->last_flush = t;
    for (int i = 0; i < k->n; i++)
        if (!k->dead[i] && k->s[i].flush && !k->s[i].flush(&k->s[i]))
            return sink_fail(k, i, then);
    return true;
}

/* Close every sink; false when one failed now (reported) or before. */
static bool sinks_close(sinks *k) {
    for (int i = 0; i < k->n; i++)
        if (!k->s[i].close(&k->s[i]) && !k->dead[i]) sink_fail(k, i, NULL);
    k->n = 0;
    return !k->failed;
}

/* ---- progress: a bar on a terminal, a line every --log-every elsewhere ----------------------- */

typedef struct progress {
    bool bar, lines;          /* stderr is a terminal: the bar; else lines; --quiet: neither */
    double last_log;          /* when the last line / step row was due (--log-every by time) */
} progress;

/* Whether a progress line and a step row are due after step `step`, at time t. */
static bool log_due(const run *r, progress *p, int64_t step, double t) {
    if (r->s.log_every) return step % r->s.log_every == 0;
    if (t - p->last_log < r->s.log_every_s) return false;
    p->last_log = t;
    return true;
}

/* The bar (redrawn in place) or one line. The ETA and samples/s are this run's: a resumed
 * epoch's batches before the resume took no time of it. */
static void progress_put(const run *r, bool bar, int64_t nb, double loss, double sps, double eta,
                         double lr, double elapsed) {
    if (bar)
        fprintf(stderr, "\repoch %" PRId64 "/%" PRId64 " [%" PRId64 "/%" PRId64 "] loss %.4f  "
                "%.0f samples/s  ETA %.0fs   ", r->epoch + 1, r->s.epochs, r->batch, nb, loss,
                sps, eta);
    else
        fprintf(stderr, "epoch %" PRId64 "/%" PRId64 " [%" PRId64 "/%" PRId64 "] step %" PRId64
                "  loss %.4f  lr %.3g  %.0f samples/s  ETA %.0fs  elapsed %.1fs\n", r->epoch + 1,
                r->s.epochs, r->batch, nb, r->step, loss, lr, sps, eta, elapsed);
}

/* ---- the loop ---------------------------------------------------------------------------------- */

/* The loss backward starts from: scaled by --amp fp16's gradient scaler. */
static em_tensor *scaled(const run *r, em_tensor *loss) {
    return r->scaler ? em_grad_scaler_scale(r->scaler, loss) : loss;
}

/* ---- --graph-capture ----------------------------------------------------------------------------
 *
 * A full-size batch's step (forward, loss, the batch metric, backward, optimizer step) recorded
 * once as a graph (em_graph_capture_begin, ember/device.h) on a stream of the run's own, which
 * is the loop's current stream from start to end so that the loader's copies, the eager steps,
 * evaluation and the replays run in order; later full-size batches are copied into the
 * captured batch's storages and the graph replayed, and the loss and metric are read from the
 * captured outputs. The optimizer runs with its option capturable (SGD, Adam, AdamW: the lr
 * and Adam's step count are device tensors its kernels read, plugins/optim/optimizers.c), so
 * a replay sees the lr a schedule set since (per step or per epoch: em_optimizer_set_lr fills
 * the group's lr tensor outside the graph) and Adam's count moves on the device. --amp fp16's
 * gradient scaler runs capturable (core/grad_scaler.c: the scale, its update and the undoing
 * of a skipped step on the device; em_grad_scaler_read_step after each step and replay brings
 * the verdict and the scale to the host, as the loss is read). What a replay
 * cannot see is refused up front (graph_refusal) or caught at the capture (random numbers
 * drawn, an op that reads the host); a change of another scalar of the captured step (a
 * momentum or beta1 a schedule cycles) makes a new capture. */

enum { GRAPH_WARMUP = 3 }; /* full-size steps run eagerly first: optimizer state, caches */

typedef struct gstep {
    bool on;
    em_stream *s;
    em_stream *prev;               /* the loop's current stream before */
    em_graph *g;                   /* NULL: not captured (yet, or since the lr changed) */
    em_tensor *x[IN_MAX], *y, *mask; /* the captured batch: replays read these storages */
    em_tensor *loss, *metric;      /* its outputs (0-dim; metric NULL without epoch rows) */
    em_tensor *gnorm;              /* the gradient norm before clipping (0-dim; NULL: none) */
    double *hp;                    /* (groups) the momentum / beta1 the capture used */
    int64_t warm, captures, replays;
    bool fresh; /* captured, not replayed yet */
} gstep;

/* Why this run's step cannot be replayed as a graph; NULL: it can. */
static const char *graph_refusal(const run *r, char *buf, size_t cap) {
    char d[48];
    if (!em_graph_capture_supported(r->dev)) {
        snprintf(buf, cap, "device %s cannot capture graphs (a CUDA device can)",
                 em_device_str(r->dev, d, sizeof d));
        return buf;
    }
    const char *cls = em_optimizer_class(r->opt)->name;
    bool adam = !strcmp(cls, "Adam") || !strcmp(cls, "AdamW");
    if (strcmp(cls, "SGD") && !adam) {
        snprintf(buf, cap, "the %s optimizer's step uses its step count, which the host "
                 "changes every step and a replay would repeat: SGD, Adam and AdamW steps "
                 "replay as captured (their capturable kernels read the lr and the count on the "
                 "device)", cls);
        return buf;
    }
    if (r->sched && r->sched_per_step &&
        !strcmp(em_scheduler_class(r->sched)->name, "OneCycleLR") &&
        em_options_bool(em_scheduler_options(r->sched), "cycle_momentum"))
        return "a per-step OneCycleLR with cycle_momentum sets a new momentum (beta1) every "
               "step, a scalar of the captured step a replay would repeat (cycle_momentum: "
               "false keeps it; the lr is read on the device)";
    if (r->s.accum_steps > 1)
        return "--accum-steps (loop.accum_steps) > 1: a step of several micro-batches";
    if (r->d.comm) return "data parallelism: the gradients' all-reduce runs on the host";
    return NULL;
}

static void graph_drop(gstep *g) {
    em_graph_free(g->g);
    g->g = NULL;
    for (int i = 0; i < IN_MAX; i++) em_tensor_release(g->x[i]), g->x[i] = NULL;
    em_tensor_release(g->y);
    em_tensor_release(g->mask);
    em_tensor_release(g->loss);
    em_tensor_release(g->metric);
    em_tensor_release(g->gnorm);
    g->y = g->mask = g->loss = g->metric = g->gnorm = NULL;
}

/* The stream the whole loop runs on (made current), or a message naming the option. */
static em_status graph_open(run *r, gstep *g) {
    *g = (gstep){.on = r->s.graph_capture};
    if (!g->on) return EM_OK;
    char why[256];
    const char *no = graph_refusal(r, why, sizeof why);
    if (no) return em_set_error(EM_ERR_INVALID, "--graph-capture (loop.graph_capture): %s", no);
    int ng = em_optimizer_group_count(r->opt);
    if (!(g->hp = calloc((size_t)(ng ? ng : 1), sizeof *g->hp)))
        return em_set_error(EM_ERR_NOMEM, "--graph-capture: out of memory");
    /* the optimizer's capturable form: the lr and Adam's step count on the device */
    for (int i = 0; i < ng; i++) {
        em_status st = em_options_set_bool(em_optimizer_group_options_mutable(r->opt, i),
                                           "capturable", true);
        if (st != EM_OK) return st;
    }
    g->prev = em_stream_current(r->dev);
    em_status st = em_stream_create(r->dev, &g->s);
    if (st == EM_OK && (st = em_stream_set_current(r->dev, g->s)) != EM_OK) {
        em_stream_free(r->dev, g->s);
        g->s = NULL;
    }
    /* --amp fp16: the scale, its update and the skipped steps on the device */
    if (st == EM_OK && r->scaler) st = em_grad_scaler_set_capturable(r->scaler, r->dev);
    return st;
}

static void graph_close(run *r, gstep *g) {
    if (!g->on) return;
    graph_drop(g);
    if (g->s) {
        em_stream_synchronize(r->dev, g->s);
        em_stream_set_current(r->dev, g->prev);
        em_stream_free(r->dev, g->s);
    }
    free(g->hp);
    g->s = NULL;
    g->hp = NULL;
}

/* The group's scalar of the step that a schedule may cycle (SGD's momentum, Adam's beta1):
 * an attribute of the captured kernels (the lr is read on the device). */
static double group_hp(const run *r, int i) {
    const em_options *o = em_optimizer_group_options(r->opt, i);
    if (em_options_has(o, "momentum")) return em_options_float(o, "momentum");
    double b[EM_OPT_MAX_LIST] = {0};
    em_options_floats(o, "betas", b, EM_OPT_MAX_LIST);
    return b[0];
}

/* Whether the graph's momentum / beta1 are the optimizer's now. */
static bool graph_hp_same(const run *r, const gstep *g) {
    for (int i = 0; i < em_optimizer_group_count(r->opt); i++)
        if (group_hp(r, i) != g->hp[i]) return false;
    return true;
}

/* Record the step on a copy of this batch (nothing runs: the replay that follows runs it);
 * norm: the gradients' norm and clipping too, as em_clip_grad_norm_device_ (no host read). */
static em_status graph_capture(run *r, gstep *g, em_tensor *const *xs, em_tensor *y,
                               em_tensor *mask, bool metric, bool norm) {
    char d[48];
    em_device_str(r->dev, d, sizeof d);
    em_status st = EM_OK;
    em_scope_begin();
    for (int i = 0; i < r->n_in && st == EM_OK; i++)
        if (!(g->x[i] = em_keep(em_clone(xs[i])))) st = em_last_status();
    if (st == EM_OK && !(g->y = em_keep(em_clone(y)))) st = em_last_status();
    if (st == EM_OK && mask && !(g->mask = em_keep(em_clone(mask)))) st = em_last_status();
    em_scope_end();
    if (st != EM_OK) {
        graph_drop(g);
        return st;
    }
    /* the captured backward makes the gradients, in the graph's memory */
    em_optimizer_zero_grad(r->opt);
    em_rng_state before = em_generator_get_state(em_default_generator());
    if ((st = em_graph_capture_begin(r->dev, g->s)) != EM_OK) {
        graph_drop(g);
        return st;
    }
    em_scope_begin();
    em_tensor *loss = NULL, *m = NULL;
    em_status as = amp_begin(r);
    em_tensor *out = as == EM_OK ? model_forward(r, g->x, g->mask) : NULL;
    if (out) loss = loss_forward(r, out, g->y);
    if (as == EM_OK) amp_end(r);
    if (loss && metric) {
        em_grad_mode_push(EM_GRAD_DISABLED);
        m = batch_metric(r, out, g->y, em_tensor_shape(g->x[0])[0], NULL);
        em_grad_mode_pop();
    }
    double maxn = r->s.clip_grad_norm > 0 ? r->s.clip_grad_norm : INFINITY;
    em_tensor *gn = NULL;
    if (loss && (!metric || m) && em_backward(scaled(r, loss)) == EM_OK &&
        (!norm || !r->scaler || em_grad_scaler_unscale_(r->scaler, r->opt) == EM_OK) &&
        (!norm || em_clip_grad_norm_device_(r->params, maxn, 2.0, &gn) == EM_OK) &&
        (r->scaler ? em_grad_scaler_step(r->scaler, r->opt, NULL) == EM_OK &&
                         em_grad_scaler_update(r->scaler) == EM_OK
                   : em_optimizer_step(r->opt) == EM_OK)) {
        g->loss = em_keep(loss);
        g->metric = m ? em_keep(m) : NULL;
        g->gnorm = gn;
        gn = NULL;
    }
    em_tensor_release(gn);
    char why[768] = "";
    if (!g->loss) snprintf(why, sizeof why, "%s", em_last_error());
    em_scope_end();
    st = em_graph_capture_end(r->dev, &g->g);
    if (st == EM_OK && !g->loss) st = EM_ERR_DEVICE; /* an op failed, and the capture held */
    if (st != EM_OK) {
        if (!why[0]) snprintf(why, sizeof why, "%s", em_last_error());
        graph_drop(g);
        em_optimizer_zero_grad(r->opt); /* gradients that were only recorded */
        return em_set_error(EM_ERR_DEVICE, "--graph-capture (loop.graph_capture): the training "
                            "step cannot be captured on %s: %s", d, why);
    }
    em_rng_state after = em_generator_get_state(em_default_generator());
    if (memcmp(&before, &after, sizeof before)) {
        em_generator_set_state(em_default_generator(), before);
        graph_drop(g);
        em_optimizer_zero_grad(r->opt);
        /* the standard drawing ops draw relative to the graph's generator state without
         * moving the generator (ember/random.h, "Graph capture"); this is code that reserved
         * blocks itself (em_generator_reserve), whose numbers every replay would repeat */
        return em_set_error(EM_ERR_INVALID, "--graph-capture (loop.graph_capture): the training "
                            "step moved the random generator during the capture (an op that "
                            "reserves its numbers with em_generator_reserve, not one of the "
                            "capture-aware draws of ember/random.h), and every replay would draw "
                            "the same ones; train without --graph-capture");
    }
    for (int i = 0; i < em_optimizer_group_count(r->opt); i++) g->hp[i] = group_hp(r, i);
    g->captures++;
    g->fresh = true;
    return EM_OK;
}

/* This batch into the captured batch's storages, then the step: the replay runs forward,
 * backward, the clipping and the update; the loss, metric and gradient norm (NAN without)
 * are read from its outputs. */
static em_status graph_replay(run *r, gstep *g, em_tensor *const *xs, em_tensor *y,
                              em_tensor *mask, double *lv, double *mv, double *gv) {
    em_status st = EM_OK;
    for (int i = 0; i < r->n_in && st == EM_OK; i++) st = em_copy_(g->x[i], xs[i]);
    if (st == EM_OK) st = em_copy_(g->y, y);
    if (st == EM_OK && g->mask) st = em_copy_(g->mask, mask);
    if (st == EM_OK) st = em_graph_replay(g->g);
    /* em_optimizer_steps: the capture's em_optimizer_step counted the first replay's step */
    if (st == EM_OK && !g->fresh) st = em_optimizer_count_replayed(r->opt, 1);
    if (st == EM_OK) g->fresh = false;
    if (st == EM_OK) st = em_tensor_item(g->loss, lv);
    if (st == EM_OK && g->metric) st = em_tensor_item(g->metric, mv);
    if (st == EM_OK && g->gnorm) st = em_tensor_item(g->gnorm, gv);
    if (st == EM_OK) g->replays++;
    return st;
}

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

/* The command line as it was, without --resume, then --resume `from` (data-parallel: after
 * the launcher's, with the same number of ranks). */
static void put_resume_command(FILE *f, const run *r, const char *from) {
    if (r->d.comm) {
        const char *l = ddp_launcher();
        fprintf(f, "%s %d ", l && !strcmp(l, "OMPI_COMM_WORLD_SIZE") ? "mpirun -np" : "srun -n",
                r->d.world);
    }
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
    if (!primary(r)) { /* rank 0 saves and speaks; the others take part in the save */
        char path[4096];
        bool saved = false;
        if (r->s.checkpoint && checkpoint_save(r, path, sizeof path, &saved) != EM_OK)
            return EXIT_TRAIN;
        return EXIT_INTERRUPTED;
    }
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

/* The model's state dict to `path` for `option` (--save-weights, --save-best), announced to
 * the signal thread; false after the message. */
/* --trace: the profiler's timeline; false after the message. */
static bool write_trace(run *r) {
    FILE *f = fopen(r->s.trace, "w");
    if (!f) {
        fprintf(stderr, "ember-train: --trace %s: %s\n", r->s.trace, strerror(errno));
        return false;
    }
    bool ok = em_profiler_write_trace(r->profiler, f) == EM_OK;
    if (!ok) fprintf(stderr, "ember-train: --trace %s: %s\n", r->s.trace, em_last_error());
    if (fclose(f) != 0 && ok) {
        fprintf(stderr, "ember-train: --trace %s: %s\n", r->s.trace, strerror(errno));
        ok = false;
    }
    if (ok) say(r, "ember-train: --trace: wrote %s\n", r->s.trace);
    return ok;
}

static bool save_model(run *r, const char *option, const char *path) {
    if (!primary(r)) return true; /* the weights are rank 0's on every rank */
    char what[48];
    snprintf(what, sizeof what, "%s file", option);
    em_dict *sd = em_module_state_dict(r->model);
    em_status ws = EM_ERR_NOMEM;
    if (sd) {
        stop_save_begin(what, path);
        /* the training set's metadata (a vocabulary) goes with the weights */
        ws = em_save(sd, path, em_dataset_metadata(r->train), NULL);
        stop_save_end(false, r->step);
    }
    em_dict_free(sd);
    if (ws != EM_OK) report_error(option);
    return ws == EM_OK;
}

/* The options of a transform spec, resolved against its class (defaults filled in); a new bag
 * or NULL after the message. */
static em_options *resolved_spec(const em_transform_spec *sp) {
    const em_transform_class *c = em_class_find(EM_TRANSFORM_KIND, sp->name);
    em_options *o = sp->options ? em_options_copy(sp->options) : em_options_new();
    if (!c || !o || em_options_resolve(o, sp->name, c->options, c->n_options) != EM_OK) {
        em_options_free(o);
        return NULL;
    }
    return o;
}

bool write_onnx(run *r) {
    const char *path = r->s.export_onnx;
    if (r->n_in != 1) {
        fprintf(stderr, "ember-train: --export-onnx %s: the model reads %d input fields; ONNX "
                "export takes models of one input\n", path, r->n_in);
        return false;
    }
    const em_field *f = em_dataset_field(r->train, em_dataset_field_index(r->train,
                                                                         r->in_names[0]));
    em_options *o = em_options_new();
    em_dtype model_dt = f->dtype;
    bool ok = o != NULL;
    /* the evaluation transforms (the loader's, without the augmentations) become the graph's
     * first nodes, so a deployer feeds what the dataset holds (raw uint8 pixels) */
    if (!strcmp(r->in_names[0], "input") && (r->tf.to_float || r->tf.mean)) {
        model_dt = EM_F32;
        ok = ok && em_options_set_float(o, "scale", r->tf.scale) == EM_OK;
        if (r->tf.mean) {
            double m[8], sd[8];
            for (int i = 0; i < r->tf.n_channels; i++) {
                m[i] = r->tf.mean[i];
                sd[i] = r->tf.std[i];
            }
            ok = ok && em_options_set_floats(o, "mean", r->tf.n_channels, m) == EM_OK &&
                 em_options_set_floats(o, "std", r->tf.n_channels, sd) == EM_OK;
        }
    }
    for (int i = 0; ok && i < r->n_tspec; i++) {
        const em_transform_spec *sp = &r->tspec[i];
        if (r->ttrain_only[i] || strcmp(sp->field ? sp->field : "input", r->in_names[0])) continue;
        em_options *so = resolved_spec(sp);
        if (!so) {
            report_error("--export-onnx");
            ok = false;
        } else if (!strcmp(sp->name, "to_float")) {
            model_dt = EM_F32;
            ok = em_options_set_float(o, "scale", em_options_float(so, "scale")) == EM_OK;
        } else if (!strcmp(sp->name, "normalize")) {
            double m[8], sd[8];
            int n = em_options_floats(so, "mean", m, 8);
            em_options_floats(so, "std", sd, 8);
            model_dt = EM_F32;
            ok = em_options_set_floats(o, "mean", n, m) == EM_OK &&
                 em_options_set_floats(o, "std", n, sd) == EM_OK;
        } else {
            fprintf(stderr, "ember-train: --export-onnx %s: the evaluation transform '%s' of "
                    "field '%s' has no ONNX form (to_float and normalize have)\n", path,
                    sp->name, r->in_names[0]);
            ok = false;
        }
        em_options_free(so);
    }
    if (ok && model_dt != f->dtype)
        ok = em_options_set_string(o, "input_dtype", em_dtype_name(f->dtype)) == EM_OK;
    /* batches of padded variable-length items carry a mask the graph has no input for */
    if (ok && r->mask_in >= 0) ok = em_options_set_bool(o, "variable_length", true) == EM_OK;
    if (ok) {
        int64_t shape[EM_MAX_DIMS + 1] = {1};
        for (int i = 0; i < f->ndim; i++) shape[i + 1] = f->shape[i];
        em_scope_begin();
        em_tensor *x = em_zeros(f->ndim + 1, shape, model_dt, r->dev);
        stop_save_begin("--export-onnx file", path);
        ok = x && em_onnx_export(r->model, 1, &x, path, o) == EM_OK;
        stop_save_end(false, r->step);
        em_scope_end();
        if (!ok) report_error("--export-onnx");
    }
    em_options_free(o);
    if (ok) say(r, "ember-train: ONNX model written to %s\n", path);
    return ok;
}

/* The signal that stops the run at this point (0: none) and, data-parallel, whether some
 * rank's *stop_run is set (stop_run may be NULL): the same answer on every rank, from every
 * rank's flags, so that all of them stop after the same step. */
static int agreed_stop(run *r, bool *stop_run) {
    int sig = atomic_load(r->stop);
    if (!r->d.comm) return sig;
    double f[3] = {sig == SIGINT, sig == SIGTERM, stop_run && *stop_run};
    ddp_sum(r, f, 3);
    sig = f[1] > 0 ? SIGTERM : f[0] > 0 ? SIGINT : 0;
    if (sig) atomic_store(r->stop, sig);
    if (stop_run) *stop_run = f[2] > 0;
    return sig;
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
    progress pg = {.bar = !r->s.quiet && isatty(2), .lines = !r->s.quiet && !isatty(2)};
    sinks k;
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
    /* rank 0 writes the files; every rank learns what they take (the test set is evaluated
     * each epoch for them, collectively) */
    bool sinks_ok = true;
    if (primary(r)) {
        sinks_ok = sinks_open(r, &k);
    } else {
        memset(&k, 0, sizeof k);
        k.last_flush = now_s();
    }
    if (r->d.comm) {
        double f[3] = {primary(r) && !sinks_ok, primary(r) && k.epochs, primary(r) && k.steps};
        ddp_sum(r, f, 3);
        sinks_ok = f[0] == 0;
        k.epochs = f[1] > 0;
        k.steps = f[2] > 0;
        if (!sinks_ok) r->d.agreed = true;
    }
    if (!sinks_ok) {
        em_loader_free(l);
        free(subset);
        free(sw.wait);
        free(sw.time);
        return EXIT_USAGE;
    }
    em_dataset *val = r->s.overfit_batches ? r->train : r->val;
    const char *mn = metric_name(r);
    double t_start = now_s();
    pg.last_log = t_start;
    int rc = EXIT_OK;
    bool stop_run = false, wait_hinted = false, first_step = true, mem_after_first = r->s.memory_summary;
    /* the test set's figures after the last step, when an epoch row needed them */
    eval_result et = {NAN, NAN, 0, NAN};
    int64_t test_step = -1;
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
    /* the step rows' window: the figures since the previous row */
    double win_loss = 0, win_t0 = now_s();
    int64_t win_samples = 0;
    uint64_t win_wait_ns = 0;
    gstep gs;
    if (graph_open(r, &gs) != EM_OK) {
        report_error(NULL);
        rc = EXIT_USAGE;
        stop_run = true;
    }
    em_module_train(r->model, true);
    for (; r->epoch < r->s.epochs && !stop_run; r->epoch++) {
        if (!loader_aligned) em_loader_set_state(l, (em_loader_state){r->s.seed, r->epoch, r->batch});
        loader_aligned = true;
        em_loader_reset_stats(l);
        if (r->batch == 0) r->part = (epoch_sums){0};
        const epoch_sums before = r->part; /* a resumed epoch's batches before the resume */
        const int64_t batch0 = r->batch;
        double t0 = now_s();
        em_module_train(r->model, true);
        em_optimizer_zero_grad(r->opt);
        double t_step = now_s();
        uint64_t step_wait_ns = 0;
        char then[160]; /* the end of a failed sink's message */
        /* the step's micro-batches so far: loss x samples, metric, samples, non-finite losses
         * (summed over the ranks at the step's end) */
        double pend[4] = {0, 0, 0, 0};
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
            int64_t bs = em_tensor_shape(xs[0])[0];
            /* data-parallel: the group's micro-batches before its last only accumulate (no_sync);
             * the last one's backward reduces them all */
            bool local = r->d.ddp && r->batch + 1 - group_first < group_len;
            if (local && em_ddp_no_sync_begin(r->d.ddp) != EM_OK) {
                report_error("no_sync");
                rc = EXIT_TRAIN;
                stop_run = true;
                break;
            }
            /* --graph-capture: full-size batches replay the captured step once warm */
            bool graphed = gs.on && bs == B && gs.warm >= GRAPH_WARMUP;
            double lv = NAN, mv = 0, gn = NAN;
            const bool want_norm = r->s.clip_grad_norm > 0 || k.n;
            if (graphed) {
                if (gs.g && !graph_hp_same(r, &gs)) graph_drop(&gs); /* a new momentum */
                em_status gst = gs.g ? EM_OK
                                     : graph_capture(r, &gs, xs, y, mask, k.epochs, want_norm);
                if (gst == EM_OK) gst = graph_replay(r, &gs, xs, y, mask, &lv, &mv, &gn);
                if (gst != EM_OK) { /* the capture's messages name the option already */
                    report_error(strncmp(em_last_error(), "--graph-capture", 15)
                                     ? "--graph-capture" : NULL);
                    rc = EXIT_TRAIN;
                } else if (!isfinite(lv)) {
                    nan_hint(r, lv);
                    rc = EXIT_TRAIN;
                }
            } else {
                /* --amp fp16: warm-up steps once the optimizer has stepped (its states
                 * exist: the scaler saves them to undo a skipped step on the device) */
                gs.warm += gs.on && bs == B && (!r->scaler || em_optimizer_steps(r->opt) > 0);
                em_scope_begin();
                em_status as = amp_begin(r);
                em_tensor *out = as == EM_OK ? model_forward(r, xs, mask) : NULL;
                em_tensor *loss = loss_forward(r, out, y);
                if (as == EM_OK) amp_end(r);
                lv = loss ? em_item(loss) : NAN;
                if (loss && k.epochs) { /* the epoch's train metric, as the batch was trained on */
                    em_grad_mode_push(EM_GRAD_DISABLED);
                    em_tensor *m = batch_metric(r, out, y, bs, NULL);
                    em_grad_mode_pop();
                    if (!m) loss = NULL;
                    else mv = em_item(m);
                }
                if (!loss) {
                    report_error("forward");
                    rc = em_last_status() == EM_ERR_SHAPE ? EXIT_USAGE : EXIT_TRAIN;
                } else if (!isfinite(lv) && !r->d.comm) {
                    nan_hint(r, lv);
                    rc = EXIT_TRAIN;
                } else if (em_backward(scaled(r, group_len > 1
                                                     ? em_div_scalar(loss, (double)group_len)
                                                     : loss)) != EM_OK) {
                    report_error("backward");
                    rc = EXIT_TRAIN;
                }
                em_scope_end();
            }
            if (local && !rc && em_ddp_no_sync_end(r->d.ddp) != EM_OK) {
                report_error("no_sync");
                rc = EXIT_TRAIN;
            }
            if (rc) {
                stop_run = true;
                break;
            }
            /* a rank's non-finite loss stops every rank at the step's end (its backward ran so
             * that the others do not wait for its gradients) */
            pend[0] += lv * (double)bs;
            pend[1] += mv;
            pend[2] += (double)bs;
            pend[3] += !isfinite(lv);
            r->batch++;
            if (r->batch - group_first < group_len) continue;
            /* a step boundary: the gradients averaged over the ranks, the step's figures summed */
            if (r->d.ddp && em_ddp_wait(r->d.ddp) != EM_OK) {
                report_error("data parallelism");
                rc = EXIT_TRAIN;
                stop_run = true;
                break;
            }
            ddp_sum(r, pend, 4);
            if (pend[3] > 0) {
                if (primary(r)) nan_hint(r, pend[0]);
                rc = EXIT_TRAIN;
                r->d.agreed = true;
                stop_run = true;
                break;
            }
            r->part.loss += pend[0];
            r->part.metric += pend[1];
            r->part.samples += (int64_t)pend[2];
            win_loss += pend[0];
            win_samples += (int64_t)pend[2];
            memset(pend, 0, sizeof pend);
            bool due = (k.steps || pg.lines) && log_due(r, &pg, r->step + 1, now_s());
            step_row row = {.step = r->step + 1, .epoch = r->epoch + 1, .grad_norm = NAN};
            if (due) { /* the lrs the step uses */
                int ng = em_optimizer_group_count(r->opt);
                row.n_groups = ng < METRIC_GROUPS_MAX ? ng : METRIC_GROUPS_MAX;
                for (int g = 0; g < row.n_groups; g++) row.lr[g] = em_optimizer_lr(r->opt, g);
            }
            /* --amp fp16: the norm and the clipping see the unscaled gradients */
            if (!graphed && r->scaler && want_norm &&
                em_grad_scaler_unscale_(r->scaler, r->opt) != EM_OK) {
                report_error("amp unscale");
                rc = EXIT_TRAIN;
                stop_run = true;
                break;
            }
            if (!graphed && want_norm) { /* a replay clipped and stepped already */
                double maxn = r->s.clip_grad_norm > 0 ? r->s.clip_grad_norm : INFINITY;
                if (em_clip_grad_norm_(r->params, maxn, 2.0, false, &gn) != EM_OK) {
                    report_error("clip_grad_norm");
                    rc = EXIT_TRAIN;
                    stop_run = true;
                    break;
                }
            }
            if (want_norm && isfinite(gn)) r->part.grad_norm += gn, r->part.grad_norms++;
            if (!graphed && (r->scaler ? em_grad_scaler_step(r->scaler, r->opt, NULL)
                                       : em_optimizer_step(r->opt)) != EM_OK) {
                report_error("optimizer step");
                rc = EXIT_TRAIN;
                stop_run = true;
                break;
            }
            if (r->scaler && ((!graphed && em_grad_scaler_update(r->scaler) != EM_OK) ||
                              (gs.on && em_grad_scaler_read_step(r->scaler, r->opt, NULL) !=
                                            EM_OK))) {
                /* overflowing at the scale's floor: the NaN advice */
                fprintf(stderr, "ember-train: at step %" PRId64 ": %s\n", r->step + 1,
                        em_last_error());
                rc = EXIT_TRAIN;
                stop_run = true;
                break;
            }
            row.amp = r->s.amp[0] != '\0';
            row.skipped_steps = em_grad_scaler_skipped_steps(r->scaler);
            row.loss_scale = r->scaler ? em_grad_scaler_get_scale(r->scaler) : NAN;
            snprintf(then, sizeof then, "; training stops after step %" PRId64 "%s", r->step + 1,
                     r->s.checkpoint ? " and its checkpoint" : "");
            if (r->batch >= nb && !sinks_params(&k, r->epoch + 1, r->step + 1, r->params, then))
                stop_run = true; /* the epoch's last step: its gradients are still there */
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
            win_wait_ns += step_wait_ns;
            step_wait_ns = 0;
            r->part.time_s = before.time_s + (t_end - t0);
            r->part.wait_s = before.wait_s + (double)em_loader_get_stats(l).wait_ns * 1e-9;
            if (mem_after_first && first_step && primary(r)) {
                fprintf(stderr, "ember-train: memory after the first step:\n");
                em_memory_summary(stderr);
            }
            first_step = false;
            if (due || pg.bar) {
                double el = t_end - t0;
                int64_t done = r->batch - batch0;
                double sps = el > 0 ? (double)(r->part.samples - before.samples) / el : 0.0;
                double eta = done ? el / (double)done * (double)(nb - r->batch) : 0;
                double lr0 = due ? row.lr[0] : em_optimizer_lr(r->opt, 0);
                if (pg.bar || pg.lines)
                    progress_put(r, pg.bar, nb, r->part.loss / (double)r->part.samples, sps, eta,
                                 lr0, t_end - t_start);
            }
            if (due && k.steps) {
                row.loss = win_samples ? win_loss / (double)win_samples : NAN;
                row.grad_norm = gn;
                row.samples_s = t_end > win_t0 ? (double)win_samples / (t_end - win_t0) : 0.0;
                row.data_wait_s = (double)win_wait_ns * 1e-9;
                if (!sinks_step(&k, &row, then)) stop_run = true;
                win_loss = 0;
                win_samples = 0;
                win_wait_ns = 0;
                win_t0 = t_end;
            }
            if (!sinks_flush(&k, false, then)) stop_run = true;
            if (agreed_stop(r, &stop_run)) {
                if (pg.bar) fputc('\n', stderr);
                rc = interrupted(r);
                stop_run = true;
                break;
            }
            if (stop_run) break; /* a sink failed: the epoch's row and checkpoint, then stop */
            if (r->s.max_steps && r->step >= r->s.max_steps) {
                stop_run = true;
                break;
            }
        }
        if (pg.bar) fputc('\n', stderr);
        if (rc) break;
        bool epoch_done = r->batch >= nb;
        double dt = before.time_s + (now_s() - t0);
        em_loader_stats ls = em_loader_get_stats(l);
        r->part.time_s = dt;
        r->part.wait_s = before.wait_s + (double)ls.wait_ns * 1e-9;
        double wait_pct = dt > 0 ? 100.0 * r->part.wait_s / dt : 0;
        if (!wait_hinted && wait_pct > 10.0 && dt > 0.2) {
            say(r, "ember-train: waiting for data took %.0f%% of the epoch's time; more loader "
                "threads may help (--workers %d)\n", wait_pct,
                (int)(r->s.workers ? r->s.workers * 2 : 2));
            wait_hinted = true;
        }
        eval_result ev = {NAN, NAN, 0, NAN};
        if (val && evaluate(r, val, subset, n_subset, NULL, &ev) != EM_OK) {
            report_error("validation");
            rc = EXIT_TRAIN;
            break;
        }
        if (k.epochs && r->test) {
            if (evaluate(r, r->test, NULL, 0, NULL, &et) != EM_OK) {
                report_error("test");
                rc = EXIT_TRAIN;
                break;
            }
            test_step = r->step;
        }
        bool better = val && (isnan(r->best_metric) ||
                              (classification(r) ? ev.metric > r->best_metric : ev.metric < r->best_metric));
        if (better) {
            r->best_metric = ev.metric;
            r->best_epoch = r->epoch;
            if (r->s.save_best &&
                (rc = ddp_agree(r, save_model(r, "--save-best", r->s.save_best) ? 0 : EXIT_TRAIN)))
                break;
            r->best_saved_epoch = r->best_epoch;
        }
        double lr = em_optimizer_lr(r->opt, 0);
        const epoch_sums *e = &r->part;
        double train_loss = e->samples ? e->loss / (double)e->samples : NAN;
        char vbuf[160] = "", tppl[32] = "", vppl[64] = "";
        if (perplexity_loss(r)) { /* exp of the mean token loss */
            snprintf(tppl, sizeof tppl, " ppl %.3f", exp(train_loss));
            snprintf(vppl, sizeof vppl, " ppl %.3f (unigram %.3f)", exp(ev.loss), ev.unigram_ppl);
        }
        if (val)
            snprintf(vbuf, sizeof vbuf, "  val loss %.4f%s %s %.2f%s", ev.loss, vppl, mn,
                     classification(r) ? 100 * ev.metric : ev.metric, classification(r) ? "%" : "");
        say(r, "epoch %" PRId64 "/%" PRId64 "%s: train loss %.4f%s%s  lr %.3g  %.1fs  %.0f "
            "samples/s\n", r->epoch + 1, r->s.epochs, epoch_done ? "" : " (partial)", train_loss,
            tppl, vbuf, lr, dt, dt > 0 ? (double)e->samples / dt : 0);
        snprintf(then, sizeof then, "; training stops after epoch %" PRId64 "%s", r->epoch + 1,
                 r->s.checkpoint ? " and its checkpoint" : "");
        epoch_row row = {r->epoch + 1, r->step, lr, train_loss,
                         e->grad_norms ? e->grad_norm / (double)e->grad_norms : NAN, ev.loss,
                         ev.metric, dt > 0 ? (double)e->samples / dt : 0, wait_pct, peak_total(r),
                         e->samples ? e->metric / (double)e->samples : NAN,
                         test_step == r->step ? et.loss : NAN,
                         test_step == r->step ? et.metric : NAN,
                         em_grad_scaler_skipped_steps(r->scaler),
                         r->scaler ? em_grad_scaler_get_scale(r->scaler) : NAN, perplexity_loss(r),
                         exp(train_loss), val ? exp(ev.loss) : NAN, val ? ev.unigram_ppl : NAN};
        if (k.epochs) sinks_epoch(&k, &row, then);
        if (!k.failed) sinks_flush(&k, true, then);
        if (epoch_done) {
            if (r->sched && !r->sched_per_step &&
                em_scheduler_step(r->sched, val ? ev.loss : train_loss) != EM_OK) {
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
        int sig = agreed_stop(r, NULL);
        if (r->s.checkpoint || sig) {
            /* a finished epoch is saved as the start of the next one */
            int64_t ep = r->epoch;
            if (epoch_done) r->epoch++;
            char path[4096];
            bool saved = false;
            if (sig) { /* a signal during the epoch's end: stop here */
                rc = interrupted(r);
            } else if (checkpoint_save(r, path, sizeof path, &saved) != EM_OK) {
                if (primary(r)) /* the others' message would only repeat it */
                    report_error(saved ? "--checkpoint (saved; removing the older ones)"
                                       : "--checkpoint");
                rc = EXIT_TRAIN;
            }
            r->epoch = ep;
        }
        if (k.failed) { /* the exit code says a file was not written */
            if (rc == EXIT_OK && r->s.checkpoint && r->last_saved[0])
                fprintf(stderr, "  the checkpoint %s was saved: once %s can be written, "
                        "continue with --resume %s\n", r->last_saved, k.failed, r->last_saved);
            rc = EXIT_TRAIN;
        }
        if ((rc = ddp_agree(r, rc))) break; /* rank 0's files */
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
        say(r, "ember-train: stopped early after epoch %" PRId64 ": the validation %s has not "
            "improved for %" PRId64 " epoch%s (--early-stop %" PRId64 ")\n", r->epoch, mn,
            r->epoch - 1 - r->best_epoch, r->epoch - 1 - r->best_epoch == 1 ? "" : "s",
            r->s.early_stop);
    if (rc == EXIT_OK && r->test) {
        if (test_step != r->step && evaluate(r, r->test, NULL, 0, NULL, &et) != EM_OK) {
            report_error("test");
            rc = EXIT_TRAIN;
        } else {
            print_eval(r, "test", &et);
        }
    }
    if (rc == EXIT_OK && r->s.save_weights) {
        if (save_model(r, "--save-weights", r->s.save_weights))
            say(r, "ember-train: weights saved to %s\n", r->s.save_weights);
        else
            rc = EXIT_TRAIN;
        rc = ddp_agree(r, rc); /* rank 0's file */
    }
    if (rc == EXIT_OK && r->s.export_onnx) /* rank 0's file */
        rc = ddp_agree(r, primary(r) && !write_onnx(r) ? EXIT_TRAIN : EXIT_OK);
    if (!primary(r)) { /* rank 0 speaks for the run */
    } else if (rc == EXIT_OK || rc == EXIT_INTERRUPTED) {
        fprintf(stderr, "ember-train: %" PRId64 " steps in %.1fs%s", r->step, wall,
                stopped_early ? " (stopped early)" : "");
        if (r->scaler)
            fprintf(stderr, "; amp fp16: %" PRId64 " skipped step%s, final loss scale %g",
                    em_grad_scaler_skipped_steps(r->scaler),
                    em_grad_scaler_skipped_steps(r->scaler) == 1 ? "" : "s",
                    em_grad_scaler_get_scale(r->scaler));
        else if (r->s.amp[0])
            fprintf(stderr, "; amp %s", r->s.amp);
        if (r->best_epoch >= 0)
            fprintf(stderr, "; best epoch %" PRId64 " with validation %s %.4f%s", r->best_epoch + 1,
                    mn, classification(r) ? 100 * r->best_metric : r->best_metric,
                    classification(r) ? "%" : "");
        if (r->best_epoch >= 0 && r->s.save_best)
            fprintf(stderr, r->best_saved_epoch == r->best_epoch
                                ? ", its weights saved to %s (--save-best)"
                                : ", before the resume (not saved to %s by this run)",
                    r->s.save_best);
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
        if (gs.on)
            fprintf(stderr, "  --graph-capture: %" PRId64 " step%s replayed from %" PRId64
                    " capture%s\n", gs.replays, gs.replays == 1 ? "" : "s", gs.captures,
                    gs.captures == 1 ? "" : "s");
    }
    if (r->s.memory_summary && primary(r)) {
        fprintf(stderr, "ember-train: memory at the end:\n");
        em_memory_summary(stderr);
    }
    /* Ended here, with the loaders' workers still alive: every thread's buffer is merged. */
    if (r->profiler && em_profiler_end(r->profiler) != EM_OK)
        fprintf(stderr, "ember-train: --profile: %s\n", em_last_error());
    if (r->profiler && primary(r)) {
        em_profiler_report(r->profiler, stderr, 25);
        if (r->s.trace && !write_trace(r) && (rc == EXIT_OK || rc == EXIT_INTERRUPTED))
            rc = EXIT_TRAIN;
    }
    bool reported = k.failed != NULL; /* a row that failed was reported when it failed */
    if (!sinks_close(&k) && !reported && (rc == EXIT_OK || rc == EXIT_INTERRUPTED)) rc = EXIT_TRAIN;
    graph_close(r, &gs);
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
    em_status as = amp_begin(r);
    em_tensor *out = as == EM_OK ? model_forward(r, xs, mask) : NULL;
    em_tensor *loss = loss_forward(r, out, y);
    if (as == EM_OK) amp_end(r);
    if (!loss || em_backward(loss) != EM_OK || (r->d.ddp && em_ddp_wait(r->d.ddp) != EM_OK)) {
        report_error("dry run");
        rc = EXIT_USAGE;
    } else if (primary(r)) {
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
