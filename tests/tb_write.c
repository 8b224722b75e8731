/*
 * tb_write.c — drives the --tensorboard sink (trainer/tensorboard.c) with rows and tensors
 * read from stdin, one command a line, so that tests/tensorboard_check.py can write known
 * figures and read them back with TensorBoard's own reader:
 *
 *   open DIR HISTOGRAMS(0|1) METRIC_NAME RESUMED_AT (-1: a new run)
 *   step STEP EPOCH LOSS N_GROUPS LR... GRAD_NORM SAMPLES_S DATA_WAIT_S AMP SKIPPED LOSS_SCALE
 *   epoch EPOCH STEP LR TRAIN_LOSS GRAD_NORM VAL_LOSS VAL_METRIC SAMPLES_S WAIT_PCT PEAK
 *         TRAIN_METRIC TEST_LOSS TEST_METRIC SKIPPED LOSS_SCALE
 *   param NAME DTYPE N V... G    (G: 0, or N gradient values follow: "G V...")
 *   params EPOCH STEP            (the parameters given so far, then forgotten)
 *   flush | close
 *
 * Numbers as strtod reads them ("nan" too). Prints the events file's path after open.
 * Exit 0, or 1 with the sink's message (2: a malformed line).
 */
#include "../trainer/tensorboard.h"

#include "ember/autograd.h"
#include "ember/dict.h"
#include "ember/dtype.h"
#include "ember/ember.h"
#include "ember/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *tok(char **p) {
    char *t = strtok_r(NULL, " \t\n", p);
    if (!t) {
        fprintf(stderr, "tb_write: a line ends early\n");
        exit(2);
    }
    return t;
}
static double num(char **p) { return strtod(tok(p), NULL); }
static int64_t inum(char **p) { return strtoll(tok(p), NULL, 10); }

static em_tensor *tensor_from(char **p, int64_t n, em_dtype dt) {
    double *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = num(p);
    em_tensor *d = em_from_data(v, 1, &n, EM_F64, em_cpu());
    em_tensor *t = d ? em_to_dtype(d, dt) : NULL;
    em_tensor_release(d);
    free(v);
    if (!t) {
        fprintf(stderr, "tb_write: %s\n", em_last_error());
        exit(1);
    }
    return t;
}

int main(void) {
    if (em_init() != EM_OK) {
        fprintf(stderr, "tb_write: em_init: %s\n", em_last_error());
        return 1;
    }
    metrics_sink s = {0};
    bool open = false, ok = true;
    em_dict *params = em_dict_new();
    char line[1 << 16], metric[16] = "";
    while (ok && fgets(line, sizeof line, stdin)) {
        char *p, *cmd = strtok_r(line, " \t\n", &p);
        if (!cmd) continue;
        if (!strcmp(cmd, "open")) {
            char *dir = tok(&p);
            bool hist = inum(&p) != 0;
            snprintf(metric, sizeof metric, "%s", tok(&p));
            int64_t resumed_at = inum(&p);
            if (!(ok = open = tensorboard_sink_open(&s, dir, hist, metric, resumed_at))) break;
            printf("%s\n", tensorboard_sink_path(&s));
        } else if (!strcmp(cmd, "step")) {
            step_row r = {0}; /* in order: an initialiser list's calls are not sequenced */
            r.step = inum(&p);
            r.epoch = inum(&p);
            r.loss = num(&p);
            r.n_groups = (int)inum(&p);
            if (r.n_groups < 0 || r.n_groups > METRIC_GROUPS_MAX) {
                fprintf(stderr, "tb_write: %d groups\n", r.n_groups);
                return 2;
            }
            for (int g = 0; g < r.n_groups; g++) r.lr[g] = num(&p);
            r.grad_norm = num(&p);
            r.samples_s = num(&p);
            r.data_wait_s = num(&p);
            r.amp = inum(&p) != 0;
            r.skipped_steps = inum(&p);
            r.loss_scale = num(&p);
            ok = s.step(&s, &r);
        } else if (!strcmp(cmd, "epoch")) {
            epoch_row e;
            e.epoch = inum(&p);
            e.step = inum(&p);
            e.lr = num(&p);
            e.train_loss = num(&p);
            e.grad_norm = num(&p);
            e.val_loss = num(&p);
            e.val_metric = num(&p);
            e.samples_s = num(&p);
            e.wait_pct = num(&p);
            e.peak = (size_t)inum(&p);
            e.train_metric = num(&p);
            e.test_loss = num(&p);
            e.test_metric = num(&p);
            e.skipped_steps = inum(&p);
            e.loss_scale = num(&p);
            e.ppl = false;
            ok = s.epoch(&s, &e);
        } else if (!strcmp(cmd, "param")) {
            char *name = tok(&p);
            em_dtype dt;
            if (em_dtype_parse(tok(&p), &dt) != 0) {
                fprintf(stderr, "tb_write: %s\n", em_last_error());
                return 2;
            }
            int64_t n = inum(&p);
            em_tensor *w = tensor_from(&p, n, dt);
            if (inum(&p)) {
                em_tensor *g = tensor_from(&p, n, dt);
                if (em_requires_grad_(w, true) != EM_OK || em_tensor_set_grad(w, g) != EM_OK) {
                    fprintf(stderr, "tb_write: %s\n", em_last_error());
                    return 1;
                }
                em_tensor_release(g);
            }
            em_dict_set(params, name, w);
            em_tensor_release(w);
        } else if (!strcmp(cmd, "params")) {
            int64_t epoch = inum(&p), step = inum(&p);
            ok = s.params ? s.params(&s, epoch, step, params) : true;
            em_dict_free(params);
            params = em_dict_new();
        } else if (!strcmp(cmd, "flush")) {
            ok = s.flush(&s);
        } else if (!strcmp(cmd, "close")) {
            ok = s.close(&s);
            open = false;
        } else {
            fprintf(stderr, "tb_write: unknown command '%s'\n", cmd);
            return 2;
        }
    }
    if (open && !s.close(&s)) ok = false;
    if (!ok) fprintf(stderr, "tb_write: %s %s\n", s.option ? s.option : "", s.err);
    em_dict_free(params);
    if (em_shutdown_checked() != EM_OK) {
        fprintf(stderr, "tb_write: %s\n", em_last_error());
        return 1;
    }
    return ok ? 0 : 1;
}
