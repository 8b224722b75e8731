/*
 * test_grad_scaler.c — the gradient scaler (ember/grad_scaler.h):
 *   - a scripted run with inf/NaN injected into the scaled gradients gives, step for step,
 *     torch.amp.GradScaler("cpu")'s skipped steps, scales and growth trackers (exactly) and
 *     its SGD parameters at the end (within 1e-6 relative: the same float32 arithmetic), for
 *     small options and for PyTorch's defaults (tests/fixtures/gen_grad_scaler.py, PyTorch
 *     SCALER_TORCH_VERSION);
 *   - unscale_, then clipping, then step equals clipping the unscaled gradients (bit for bit:
 *     the scales are powers of two);
 *   - a checkpoint taken mid-run (optimizer and scaler) and resumed into new objects ends
 *     bit for bit where the uninterrupted run ends;
 *   - the floor: backoffs stop at min_scale and skipping at the floor max_floor_skips times
 *     stops with the NaN advice naming the parameter; the state dict round trip and its
 *     errors; the disabled scaler; the call-order errors; the fused op's kernel against a
 *     plain loop in every floating dtype;
 *   - on the test device with host kernels (tests/plugins/host/, which counts its copies to
 *     host memory), unscale_ of 6 gradients reads the found_inf flags back once, not once per
 *     gradient, and still unscales each gradient exactly and finds the one inf.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/common.h"
#include "tests/fixtures/autocast/grad_scaler_fixture.h"

TestSuite(grad_scaler, .init = em_test_setup, .fini = em_test_teardown);

typedef struct run_cfg {
    const double *p[2], *g[2], *final[2], *scales;
    const int *stepped;
    const int64_t *trackers;
    double init_scale;
    int64_t growth_interval;
} run_cfg;

static const int64_t shapes[2][2] = {{3, 4}, {5, 0}};
static const int ndims[2] = {2, 1};
static const int64_t numels[2] = {12, 5};

static run_cfg small_cfg(void) {
    return (run_cfg){{small_p0, small_p1}, {small_g0, small_g1}, {small_final0, small_final1},
                     small_scales, small_stepped, small_trackers, small_init_scale,
                     small_growth_interval};
}
static run_cfg dflt_cfg(void) {
    return (run_cfg){{dflt_p0, dflt_p1}, {dflt_g0, dflt_g1}, {dflt_final0, dflt_final1},
                     dflt_scales, dflt_stepped, dflt_trackers, dflt_init_scale,
                     dflt_growth_interval};
}

static em_tensor *tensor(const double *v, int i) {
    return em_test_tensor(EM_F32, ndims[i], shapes[i], v);
}

static em_optimizer *sgd(em_tensor **p) {
    em_dict *d = em_dict_new();
    em_dict_set(d, "w", p[0]);
    em_dict_set(d, "b", p[1]);
    em_options *o = em_options_new();
    em_options_set_float(o, "lr", 0.1);
    em_options_set_float(o, "momentum", 0.9);
    em_optimizer *opt = em_optimizer_new("SGD", d, o);
    cr_assert(opt, "%s", em_last_error());
    em_options_free(o);
    em_dict_free(d);
    return opt;
}

/* Step s of the script: grads = g_s * scale with the injections. */
static void set_grads(const run_cfg *c, em_tensor **p, int s, double scale) {
    for (int i = 0; i < 2; i++) {
        double *v = malloc(sizeof(double) * (size_t)numels[i]);
        for (int64_t k = 0; k < numels[i]; k++)
            v[k] = (double)((float)c->g[i][s * numels[i] + k] * (float)scale);
        for (size_t j = 0; j < sizeof injects / sizeof injects[0]; j++)
            if (injects[j].step == s && injects[j].param == i) v[injects[j].index] = injects[j].value;
        cr_assert_eq(em_tensor_set_grad(p[i], tensor(v, i)), EM_OK, "%s", em_last_error());
        free(v);
    }
}

static em_grad_scaler *scaler_for(const run_cfg *c) {
    em_grad_scaler_options o = EM_GRAD_SCALER_OPTIONS_INIT;
    o.init_scale = c->init_scale;
    o.growth_interval = c->growth_interval;
    em_grad_scaler *s = em_grad_scaler_new(&o);
    cr_assert(s, "%s", em_last_error());
    return s;
}

/* Steps [from, to) of the script, checking each against PyTorch. */
static void run_steps(const run_cfg *c, em_tensor **p, em_optimizer *o, em_grad_scaler *sc,
                      int from, int to) {
    for (int s = from; s < to; s++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        set_grads(c, p, s, em_grad_scaler_get_scale(sc));
        bool stepped = true;
        cr_assert_eq(em_grad_scaler_step(sc, o, &stepped), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_grad_scaler_update(sc), EM_OK, "%s", em_last_error());
        cr_expect_eq(stepped, c->stepped[s] != 0, "step %d: stepped %d, PyTorch %d", s, stepped,
                     c->stepped[s]);
        cr_expect_eq(em_grad_scaler_get_scale(sc), c->scales[s], "step %d: scale %g, PyTorch %g",
                     s, em_grad_scaler_get_scale(sc), c->scales[s]);
        cr_expect_eq(em_grad_scaler_growth_tracker(sc), c->trackers[s],
                     "step %d: growth tracker %lld, PyTorch %lld", s,
                     (long long)em_grad_scaler_growth_tracker(sc), (long long)c->trackers[s]);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
}

static void check_script(run_cfg c) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *p[2] = {tensor(c.p[0], 0), tensor(c.p[1], 1)};
    for (int i = 0; i < 2; i++) cr_assert_eq(em_requires_grad_(p[i], true), EM_OK);
    em_optimizer *o = sgd(p);
    em_grad_scaler *sc = scaler_for(&c);
    run_steps(&c, p, o, sc, 0, SCALER_STEPS);
    int skipped = 0;
    for (int s = 0; s < SCALER_STEPS; s++) skipped += !c.stepped[s];
    cr_expect_eq(em_grad_scaler_skipped_steps(sc), skipped);
    for (int i = 0; i < 2; i++) {
        const float *v = em_tensor_data(p[i]);
        for (int64_t k = 0; k < numels[i]; k++)
            cr_expect(fabs(v[k] - c.final[i][k]) <= 1e-6 * fabs(c.final[i][k]) + 1e-7,
                      "param %d[%lld]: %.9g, PyTorch %.9g", i, (long long)k, v[k], c.final[i][k]);
    }
    em_grad_scaler_free(sc);
    em_optimizer_free(o);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

Test(grad_scaler, matches_pytorch_small_options) { check_script(small_cfg()); }
Test(grad_scaler, matches_pytorch_defaults) { check_script(dflt_cfg()); }

static bool same_bits(const em_tensor *a, const em_tensor *b) {
    return em_tensor_nbytes(a) == em_tensor_nbytes(b) &&
           memcmp(em_tensor_data(a), em_tensor_data(b), em_tensor_nbytes(a)) == 0;
}

Test(grad_scaler, unscale_then_clip_equals_clipping_unscaled_grads) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    run_cfg c = small_cfg();
    em_tensor *pa[2] = {tensor(c.p[0], 0), tensor(c.p[1], 1)},
              *pb[2] = {tensor(c.p[0], 0), tensor(c.p[1], 1)};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(em_requires_grad_(pa[i], true), EM_OK);
        cr_assert_eq(em_requires_grad_(pb[i], true), EM_OK);
    }
    em_optimizer *oa = sgd(pa), *ob = sgd(pb);
    em_grad_scaler *sc = scaler_for(&c);
    em_dict *da = em_dict_new(), *db = em_dict_new();
    em_dict_set(da, "w", pa[0]), em_dict_set(da, "b", pa[1]);
    em_dict_set(db, "w", pb[0]), em_dict_set(db, "b", pb[1]);
    for (int s = 0; s < 3; s++) { /* steps without injections */
        set_grads(&c, pa, s, em_grad_scaler_get_scale(sc));
        set_grads(&c, pb, s, 1.0);
        cr_assert_eq(em_grad_scaler_unscale_(sc, oa), EM_OK, "%s", em_last_error());
        double na, nb;
        cr_assert_eq(em_clip_grad_norm_(da, 0.5, 2.0, false, &na), EM_OK);
        cr_assert_eq(em_clip_grad_norm_(db, 0.5, 2.0, false, &nb), EM_OK);
        cr_expect_eq(na, nb, "step %d: the norm of the unscaled grads %g, of the plain ones %g",
                     s, na, nb);
        bool stepped;
        cr_assert_eq(em_grad_scaler_step(sc, oa, &stepped), EM_OK, "%s", em_last_error());
        cr_expect(stepped);
        cr_assert_eq(em_grad_scaler_update(sc), EM_OK);
        cr_assert_eq(em_optimizer_step(ob), EM_OK);
        for (int i = 0; i < 2; i++)
            cr_expect(same_bits(pa[i], pb[i]), "step %d: param %d differs", s, i);
    }
    cr_expect_eq(em_grad_scaler_get_scale(sc), 2 * c.init_scale, "grew after 3 clean steps");
    em_dict_free(da);
    em_dict_free(db);
    em_grad_scaler_free(sc);
    em_optimizer_free(oa);
    em_optimizer_free(ob);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

Test(grad_scaler, checkpoint_resume_is_bitwise) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    run_cfg c = small_cfg();
    /* the uninterrupted run */
    em_tensor *pa[2] = {tensor(c.p[0], 0), tensor(c.p[1], 1)};
    for (int i = 0; i < 2; i++) cr_assert_eq(em_requires_grad_(pa[i], true), EM_OK);
    em_optimizer *oa = sgd(pa);
    em_grad_scaler *sa = scaler_for(&c);
    run_steps(&c, pa, oa, sa, 0, SCALER_STEPS);
    /* the interrupted one: 5 steps (after the first skips), a checkpoint, new objects */
    em_tensor *pb[2] = {tensor(c.p[0], 0), tensor(c.p[1], 1)};
    for (int i = 0; i < 2; i++) cr_assert_eq(em_requires_grad_(pb[i], true), EM_OK);
    em_optimizer *ob = sgd(pb);
    em_grad_scaler *sb = scaler_for(&c);
    run_steps(&c, pb, ob, sb, 0, 5);
    char path[] = "/tmp/test_grad_scaler_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    em_checkpoint ck = EM_CHECKPOINT_INIT;
    ck.optimizer = ob;
    ck.scaler = sb;
    ck.step = 5;
    cr_assert_eq(em_checkpoint_save(path, &ck, NULL), EM_OK, "%s", em_last_error());
    em_tensor *pc[2] = {em_clone(em_detach(pb[0])), em_clone(em_detach(pb[1]))}; /* by hand */
    for (int i = 0; i < 2; i++) cr_assert_eq(em_requires_grad_(pc[i], true), EM_OK);
    em_optimizer *oc = sgd(pc);
    em_grad_scaler_options other = EM_GRAD_SCALER_OPTIONS_INIT; /* overwritten by the load */
    em_grad_scaler *scc = em_grad_scaler_new(&other);
    em_checkpoint ld = EM_CHECKPOINT_INIT;
    ld.optimizer = oc;
    ld.scaler = scc;
    cr_assert_eq(em_checkpoint_load(path, &ld, NULL), EM_OK, "%s", em_last_error());
    cr_expect_eq(ld.step, 5);
    cr_expect_eq(em_grad_scaler_get_scale(scc), em_grad_scaler_get_scale(sb));
    cr_expect_eq(em_grad_scaler_skipped_steps(scc), em_grad_scaler_skipped_steps(sb));
    run_steps(&c, pc, oc, scc, 5, SCALER_STEPS);
    for (int i = 0; i < 2; i++) cr_expect(same_bits(pa[i], pc[i]), "param %d differs", i);
    cr_expect_eq(em_grad_scaler_skipped_steps(scc), em_grad_scaler_skipped_steps(sa));
    /* a checkpoint without the scaler cannot give one */
    em_checkpoint ck2 = EM_CHECKPOINT_INIT;
    ck2.optimizer = ob;
    cr_assert_eq(em_checkpoint_save(path, &ck2, NULL), EM_OK);
    cr_expect_eq(em_checkpoint_load(path, &ld, NULL), EM_ERR_NOTFOUND);
    cr_expect(strstr(em_last_error(), "scaler"), "%s", em_last_error());
    unlink(path);
    em_grad_scaler *all[] = {sa, sb, scc};
    for (int i = 0; i < 3; i++) em_grad_scaler_free(all[i]);
    em_optimizer_free(oa);
    em_optimizer_free(ob);
    em_optimizer_free(oc);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

static em_optimizer *opt_of(em_tensor **p, const char *cls) {
    if (!strcmp(cls, "SGD")) return sgd(p);
    em_dict *d = em_dict_new();
    em_dict_set(d, "w", p[0]);
    em_dict_set(d, "b", p[1]);
    em_options *o = em_options_new();
    em_options_set_float(o, "lr", 0.01);
    em_optimizer *opt = em_optimizer_new(cls, d, o);
    cr_assert(opt, "%s", em_last_error());
    em_options_free(o);
    em_dict_free(d);
    return opt;
}

/* The capturable scaler (em_grad_scaler_set_capturable: the state, the update and the
 * found-inf verdict on the device; a skipped step undone there), here on the CPU device, next
 * to the plain one over PyTorch's script: the scales, trackers and skipped steps are
 * PyTorch's, and the parameters, every optimizer state (Adam's step count too) and the step
 * counts are the plain scaler's bit for bit after every step. */
static void check_capturable(run_cfg c, const char *cls) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_tensor *p[2][2];
    em_optimizer *o[2];
    em_grad_scaler *sc[2];
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 2; i++) {
            p[r][i] = tensor(c.p[i], i);
            cr_assert_eq(em_requires_grad_(p[r][i], true), EM_OK);
        }
        o[r] = opt_of(p[r], cls);
        sc[r] = scaler_for(&c);
    }
    cr_assert_eq(em_grad_scaler_set_capturable(sc[1], em_cpu()), EM_OK, "%s", em_last_error());
    const char *states[] = {"momentum_buffer", "exp_avg", "exp_avg_sq", "step"};
    int skipped = 0;
    for (int s = 0; s < SCALER_STEPS; s++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        bool stepped[2] = {true, true}, skip = false;
        for (int r = 0; r < 2; r++) {
            set_grads(&c, p[r], s, em_grad_scaler_get_scale(sc[r]));
            cr_assert_eq(em_grad_scaler_step(sc[r], o[r], &stepped[r]), EM_OK, "%s",
                         em_last_error());
            cr_assert_eq(em_grad_scaler_update(sc[r]), EM_OK, "%s", em_last_error());
        }
        cr_assert_eq(em_grad_scaler_read_step(sc[1], o[1], &skip), EM_OK, "%s", em_last_error());
        skipped += skip;
        cr_expect_eq(!skip, c.stepped[s] != 0, "%s step %d: skipped %d, PyTorch stepped %d",
                     cls, s, skip, c.stepped[s]);
        cr_expect_eq(stepped[0], c.stepped[s] != 0);
        cr_expect_eq(em_grad_scaler_get_scale(sc[1]), c.scales[s], "%s step %d: scale %g, "
                     "PyTorch %g", cls, s, em_grad_scaler_get_scale(sc[1]), c.scales[s]);
        cr_expect_eq(em_grad_scaler_growth_tracker(sc[1]), c.trackers[s]);
        cr_expect_eq(em_grad_scaler_skipped_steps(sc[1]), skipped);
        cr_expect_eq(em_optimizer_steps(o[1]), em_optimizer_steps(o[0]), "%s step %d: %lld "
                     "steps counted, the plain scaler's %lld", cls, s,
                     (long long)em_optimizer_steps(o[1]), (long long)em_optimizer_steps(o[0]));
        for (int i = 0; i < 2; i++) {
            cr_expect(same_bits(p[1][i], p[0][i]), "%s step %d: param %d differs", cls, s, i);
            for (size_t k = 0; k < sizeof states / sizeof *states; k++) {
                em_tensor *a = em_optimizer_state(o[0], i, states[k]);
                em_tensor *b = em_optimizer_state(o[1], i, states[k]);
                cr_expect(!a == !b, "%s step %d: state %s of param %d", cls, s, states[k], i);
                if (a && b)
                    cr_expect(same_bits(a, b), "%s step %d: state %s of param %d differs", cls, s,
                              states[k], i);
            }
        }
        cr_assert_eq(em_scope_end(), EM_OK);
    }
    cr_expect(skipped > 0 && skipped < SCALER_STEPS, "%d skipped: the script must skip some", skipped);
    /* the state dict of the device state: the plain scaler's */
    char *j[2];
    for (int r = 0; r < 2; r++) cr_assert_eq(em_grad_scaler_state_dict(sc[r], &j[r]), EM_OK);
    cr_expect_str_eq(j[1], j[0]);
    for (int r = 0; r < 2; r++) {
        em_host_free(j[r]);
        em_grad_scaler_free(sc[r]);
        em_optimizer_free(o[r]);
    }
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

Test(grad_scaler, capturable_sgd_matches_pytorch_and_the_host_scaler) {
    check_capturable(small_cfg(), "SGD");
}
Test(grad_scaler, capturable_adam_matches_pytorch_and_the_host_scaler) {
    check_capturable(small_cfg(), "Adam");
}
Test(grad_scaler, capturable_adamw_defaults_match_pytorch_and_the_host_scaler) {
    check_capturable(dflt_cfg(), "AdamW");
}

/* max_floor_skips skips in a row at the floor stop training with the advice: from update for
 * the plain scaler (naming the first parameter with an inf/NaN), from read_step for the
 * capturable one (the steps undone on the device, none counted). */
static void check_floor(bool capturable) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    run_cfg c = small_cfg();
    em_tensor *p[2] = {tensor(c.p[0], 0), tensor(c.p[1], 1)};
    for (int i = 0; i < 2; i++) cr_assert_eq(em_requires_grad_(p[i], true), EM_OK);
    em_optimizer *o = sgd(p);
    em_grad_scaler_options so = EM_GRAD_SCALER_OPTIONS_INIT;
    so.init_scale = 16;
    so.min_scale = 4;
    so.max_floor_skips = 3;
    em_grad_scaler *sc = em_grad_scaler_new(&so);
    cr_assert(sc);
    if (capturable)
        cr_assert_eq(em_grad_scaler_set_capturable(sc, em_cpu()), EM_OK, "%s", em_last_error());
    const double want[] = {8, 4, 4, 4, 4};
    em_status last = EM_OK;
    int s = 0;
    for (; s < 5 && last == EM_OK; s++) {
        double v[5] = {1, NAN, 1, 1, 1};
        cr_assert_eq(em_tensor_set_grad(p[1], tensor(v, 1)), EM_OK);
        cr_assert_eq(em_tensor_set_grad(p[0], NULL), EM_OK);
        cr_assert_eq(em_grad_scaler_step(sc, o, NULL), EM_OK, "%s", em_last_error());
        last = em_grad_scaler_update(sc);
        if (capturable) {
            cr_assert_eq(last, EM_OK, "%s", em_last_error());
            bool skip = false;
            last = em_grad_scaler_read_step(sc, o, &skip);
            cr_expect(skip, "update %d: not skipped", s);
        }
        cr_expect_eq(em_grad_scaler_get_scale(sc), want[s], "update %d: scale %g", s,
                     em_grad_scaler_get_scale(sc));
    }
    /* 16 -> 8 -> 4 (reaching the floor is not a skip at it), then 3 skips at the floor */
    cr_expect_eq(s, 5, "stopped after %d updates", s);
    cr_expect_eq(last, EM_ERR_RANGE);
    if (!capturable)
        cr_expect(strstr(em_last_error(), "'b'") || strstr(em_last_error(), "b)"), "%s",
                  em_last_error());
    cr_expect(strstr(em_last_error(), "lower learning rate"), "%s", em_last_error());
    cr_expect(strstr(em_last_error(), "floor 4"), "%s", em_last_error());
    cr_expect_eq(em_optimizer_steps(o), 0);
    em_grad_scaler_free(sc);
    em_optimizer_free(o);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

Test(grad_scaler, overflowing_at_the_floor_stops_with_advice) { check_floor(false); }
Test(grad_scaler, capturable_overflowing_at_the_floor_stops) { check_floor(true); }

Test(grad_scaler, state_dict_options_and_call_order) {
    cr_assert_eq(em_scope_begin(), EM_OK);
    em_grad_scaler *s = em_grad_scaler_new(NULL);
    cr_assert(s);
    cr_expect_eq(em_grad_scaler_get_scale(s), 65536.0);
    char *json = NULL;
    cr_assert_eq(em_grad_scaler_state_dict(s, &json), EM_OK);
    cr_expect(strstr(json, "\"scale\":65536") && strstr(json, "\"growth_interval\":2000") &&
              strstr(json, "\"_growth_tracker\":0") && strstr(json, "\"backoff_factor\":0.5") &&
              strstr(json, "\"growth_factor\":2"), "%s", json);
    em_grad_scaler *t = em_grad_scaler_new(NULL);
    cr_assert_eq(em_grad_scaler_load_state_dict(t, "{\"scale\": 8.0, \"growth_factor\": 3.0, "
                 "\"backoff_factor\": 0.25, \"growth_interval\": 7, \"_growth_tracker\": 2}"),
                 EM_OK, "%s", em_last_error()); /* PyTorch's keys alone */
    cr_expect_eq(em_grad_scaler_get_scale(t), 8.0);
    cr_expect_eq(em_grad_scaler_growth_tracker(t), 2);
    cr_expect_eq(em_grad_scaler_load_state_dict(t, "{\"scale\": 8.0}"), EM_ERR_FORMAT);
    cr_expect(strstr(em_last_error(), "growth_factor"), "%s", em_last_error());
    cr_expect_eq(em_grad_scaler_load_state_dict(t, "[1]"), EM_ERR_FORMAT);
    cr_expect_eq(em_grad_scaler_load_state_dict(t, "{\"scale\": -1, \"growth_factor\": 2, "
                 "\"backoff_factor\": 0.5, \"growth_interval\": 5, \"_growth_tracker\": 0}"),
                 EM_ERR_FORMAT);
    cr_expect_eq(em_grad_scaler_get_scale(t), 8.0, "a refused load changes nothing");
    em_host_free(json);
    em_grad_scaler_options bad = EM_GRAD_SCALER_OPTIONS_INIT;
    bad.backoff_factor = 1.5;
    cr_expect_null(em_grad_scaler_new(&bad));
    cr_expect(strstr(em_last_error(), "backoff_factor"), "%s", em_last_error());
    /* call order */
    run_cfg c = small_cfg();
    em_tensor *p[2] = {tensor(c.p[0], 0), tensor(c.p[1], 1)};
    for (int i = 0; i < 2; i++) cr_assert_eq(em_requires_grad_(p[i], true), EM_OK);
    em_optimizer *o = sgd(p);
    cr_expect_eq(em_grad_scaler_update(s), EM_ERR_STATE);
    set_grads(&c, p, 0, 65536.0);
    cr_assert_eq(em_grad_scaler_unscale_(s, o), EM_OK);
    cr_expect_eq(em_grad_scaler_unscale_(s, o), EM_ERR_STATE);
    cr_expect(strstr(em_last_error(), "already been called"), "%s", em_last_error());
    cr_assert_eq(em_grad_scaler_step(s, o, NULL), EM_OK);
    cr_expect_eq(em_grad_scaler_step(s, o, NULL), EM_ERR_STATE);
    cr_assert_eq(em_grad_scaler_update(s), EM_OK);
    /* scale(): loss times the scale; disabled: the loss */
    em_tensor *loss = em_test_tensor(EM_F32, 0, NULL, (double[]){0.75});
    em_tensor *scaled = em_grad_scaler_scale(s, loss);
    cr_assert(scaled);
    cr_expect_eq(*(const float *)em_tensor_data(scaled), 0.75f * 65536.0f);
    em_grad_scaler_options off = EM_GRAD_SCALER_OPTIONS_INIT;
    off.enabled = false;
    em_grad_scaler *d = em_grad_scaler_new(&off);
    cr_expect_eq(em_grad_scaler_scale(d, loss), loss);
    cr_expect_eq(em_grad_scaler_get_scale(d), 1.0);
    bool stepped = false;
    cr_expect_eq(em_grad_scaler_step(d, o, &stepped), EM_OK);
    cr_expect(stepped);
    cr_expect_eq(em_grad_scaler_update(d), EM_OK);
    em_grad_scaler_free(d);
    em_grad_scaler_free(s);
    em_grad_scaler_free(t);
    em_optimizer_free(o);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}

/* The fused op against a plain loop: per dtype, values rounded to it, scaled in float32. */
Test(grad_scaler, fused_unscale_matches_a_plain_loop) {
    const em_op *op = em_op_find("amp_unscale_");
    cr_assert(op);
    em_dtype dts[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    for (int d = 0; d < 4; d++) {
        cr_assert_eq(em_scope_begin(), EM_OK);
        double a[6] = {1.5, -3, 1024, 0.125, 7, -0.5}, b[4] = {2, INFINITY, 4, 8};
        em_tensor *ga = em_test_tensor(dts[d], 2, (int64_t[]){2, 3}, a),
                  *gb = em_test_tensor(dts[d], 1, (int64_t[]){4}, b),
                  *fa = em_zeros(0, NULL, EM_F32, em_cpu()), *fb = em_zeros(0, NULL, EM_F32, em_cpu());
        em_tensor *lists[4] = {ga, gb, fa, fb};
        em_attr at[1] = {{.type = EM_ATTR_FLOAT, .v.f = 1.0 / 64}};
        cr_assert_eq(em_op_call_lists(op, 2, NULL, at, lists), EM_OK, "%s", em_last_error());
        cr_expect_eq(*(float *)em_tensor_data(fa), 0.0f);
        cr_expect_eq(*(float *)em_tensor_data(fb), 1.0f);
        em_tensor *ca = em_to_dtype(ga, EM_F64);
        const double *v = em_tensor_data(ca);
        for (int i = 0; i < 6; i++)
            cr_expect_eq(v[i], a[i] / 64, "%s[%d]: %g", em_dtype_name(dts[d]), i, v[i]);
        cr_assert_eq(em_scope_end(), EM_OK);
    }
    em_test_assert_clean_shutdown();
}

/* PyTorch reads its found_inf once per device (in step()); the scaler's flags are one buffer,
 * read with one copy per (device, dtype) and unscale_. */
Test(grad_scaler, unscale_reads_the_device_once_for_all_gradients) {
    const char *dir = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(dir, "EMBER_TEST_PLUGIN_DIR is not set (run through make check)");
    char path[4096];
    snprintf(path, sizeof path, "%s/../host/.libs/testdev_host.so", dir);
    cr_assert_eq(em_plugin_load(path), EM_OK, "%s", em_last_error());
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    cr_assert(h, "testdev_host is not loaded: %s", dlerror());
    uint64_t (*reads)(int) = (uint64_t (*)(int))dlsym(h, "ember_testdev_host_reads");
    cr_assert(reads, "ember_testdev_host_reads: %s", dlerror());
    dlclose(h); /* the library still holds it */
    em_device td;
    cr_assert_eq(em_device_parse("testdev:0", &td), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_scope_begin(), EM_OK);
    enum { NP = 6, NE = 4 };
    em_tensor *p[NP];
    em_dict *d = em_dict_new();
    for (int i = 0; i < NP; i++) {
        double v[NE] = {i + 1, -(i + 2), 0.5 * i, 3};
        p[i] = em_to_device(em_test_tensor(EM_F32, 1, (int64_t[]){NE}, v), td);
        cr_assert(p[i], "%s", em_last_error());
        cr_assert_eq(em_requires_grad_(p[i], true), EM_OK);
        char name[16];
        snprintf(name, sizeof name, "p%d", i);
        cr_assert_eq(em_dict_set(d, name, p[i]), EM_OK);
    }
    em_options *oo = em_options_new();
    em_options_set_float(oo, "lr", 0.1);
    em_optimizer *o = em_optimizer_new("SGD", d, oo);
    cr_assert(o, "%s", em_last_error());
    em_options_free(oo);
    em_dict_free(d);
    em_grad_scaler *sc = em_grad_scaler_new(NULL);
    cr_assert(sc, "%s", em_last_error());
    for (int round = 0; round < 2; round++) { /* round 1: an inf in p4's gradient */
        double scale = em_grad_scaler_get_scale(sc);
        for (int i = 0; i < NP; i++) {
            double g[NE];
            for (int k = 0; k < NE; k++) g[k] = (double)((k + 1) * (i + 1)) * scale;
            if (round == 1 && i == 4) g[2] = INFINITY;
            em_tensor *gd = em_to_device(em_test_tensor(EM_F32, 1, (int64_t[]){NE}, g), td);
            cr_assert(gd, "%s", em_last_error());
            cr_assert_eq(em_tensor_set_grad(p[i], gd), EM_OK, "%s", em_last_error());
        }
        uint64_t r0 = reads(0);
        cr_assert_eq(em_grad_scaler_unscale_(sc, o), EM_OK, "%s", em_last_error());
        cr_expect_eq(reads(0) - r0, 1, "round %d: %llu reads of testdev:0 for %d gradients",
                     round, (unsigned long long)(reads(0) - r0), NP);
        for (int i = 0; i < NP; i++) { /* the scale is a power of two: exact */
            float g[NE];
            cr_assert_eq(em_tensor_to_host(em_tensor_grad(p[i]), g, sizeof g), EM_OK);
            for (int k = 0; k < NE; k++) {
                float want = round == 1 && i == 4 && k == 2 ? INFINITY : (float)((k + 1) * (i + 1));
                cr_expect_eq(g[k], want, "round %d: grad %d[%d] %g, not %g", round, i, k,
                             (double)g[k], (double)want);
            }
        }
        bool stepped = !round;
        cr_assert_eq(em_grad_scaler_step(sc, o, &stepped), EM_OK, "%s", em_last_error());
        cr_expect_eq(stepped, round == 0, "round %d: stepped %d", round, stepped);
        cr_assert_eq(em_grad_scaler_update(sc), EM_OK, "%s", em_last_error());
    }
    cr_expect_eq(em_grad_scaler_skipped_steps(sc), 1);
    em_grad_scaler_free(sc);
    em_optimizer_free(o);
    cr_assert_eq(em_scope_end(), EM_OK);
    em_test_assert_clean_shutdown();
}
