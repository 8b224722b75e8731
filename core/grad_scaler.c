/*
 * grad_scaler.c — the gradient scaler (ember/grad_scaler.h): PyTorch's GradScaler state
 * machine per optimizer (ready, unscaled, stepped), the fused check-and-unscale list op per
 * (device, dtype) of the gradients, PyTorch's scale update, Ember's floor, and the state
 * dict; and the capturable form, which keeps that state in 0-dim device tensors and undoes
 * a skipped step on the device (em_grad_scaler_set_capturable).
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/dispatch.h"
#include "ember/grad_scaler.h"
#include "ember/ops.h"
#include "ember/optim.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

#define MAX_OPTIMIZERS 8

typedef enum stage { READY = 0, UNSCALED, STEPPED } stage;

typedef struct per_optim {
    const em_optimizer *o;
    stage st;
    bool found_inf;
    char first_bad[96]; /* the first parameter whose gradient was inf/NaN */
    em_tensor *found_t; /* capturable: the step's verdict, a 0-dim bool on the device */
} per_optim;

/* Capturable (em_grad_scaler_set_capturable): the state as 0-dim tensors on dev, each owned. */
typedef struct cap_state {
    bool on;
    em_device dev;
    em_tensor *scale;                 /* f32 */
    em_tensor *tracker, *skipped, *fs; /* f64: whole numbers, exact below 2^53 */
    em_tensor *found;                 /* f32: the last update's verdict, 0 or 1 */
    em_tensor *zero32, *zero64, *min32, *min64, *interval; /* constants the update reads */
    em_tensor **saved;                /* the step's tensors before it, for a skipped step */
    int n_saved;
    bool counted; /* the last step called em_optimizer_step whatever the verdict */
} cap_state;

struct em_grad_scaler {
    em_grad_scaler_options opt;
    float scale;
    int64_t growth_tracker;
    int64_t skipped;      /* skipped steps since creation (or load) */
    int64_t floor_skips;  /* skipped steps in a row at the floor */
    per_optim per[MAX_OPTIMIZERS];
    int n_per;
    bool last_found; /* the last update's verdict */
    cap_state cap;
};

static em_status check_options(const em_grad_scaler_options *o) {
    const char *bad = NULL;
    if (!(o->init_scale > 0) || !isfinite(o->init_scale)) bad = "init_scale (> 0, finite)";
    else if (!(o->growth_factor > 1) || !isfinite(o->growth_factor)) bad = "growth_factor (> 1)";
    else if (!(o->backoff_factor > 0 && o->backoff_factor < 1)) bad = "backoff_factor (in (0, 1))";
    else if (o->growth_interval < 1) bad = "growth_interval (>= 1)";
    else if (!(o->min_scale > 0) || o->min_scale > o->init_scale)
        bad = "min_scale (> 0, at most init_scale)";
    else if (o->max_floor_skips < 1) bad = "max_floor_skips (>= 1)";
    if (bad) return em_set_error(EM_ERR_INVALID, "grad_scaler: option %s is out of range", bad);
    return EM_OK;
}

em_grad_scaler *em_grad_scaler_new(const em_grad_scaler_options *opt) {
    em_grad_scaler_options o = EM_GRAD_SCALER_OPTIONS_INIT;
    if (opt && EM__STRUCT_READ(em_grad_scaler_options, &o, opt,
                               offsetof(em_grad_scaler_options, ext), "grad_scaler_new") != EM_OK)
        return NULL;
    if (check_options(&o) != EM_OK) return NULL;
    em_grad_scaler *s = em__calloc(1, sizeof *s, "grad scaler");
    if (!s) return NULL;
    s->opt = o;
    s->scale = (float)o.init_scale;
    return s;
}

static void cap_free(cap_state *c) {
    em_tensor *t[] = {c->scale, c->tracker, c->skipped, c->fs, c->found, c->zero32, c->zero64,
                      c->min32, c->min64, c->interval};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) em_tensor_release(t[i]);
    for (int i = 0; i < c->n_saved; i++) em_tensor_release(c->saved[i]);
    em__free(c->saved);
    memset(c, 0, sizeof *c);
}

static void per_reset(em_grad_scaler *s) {
    for (int i = 0; i < s->n_per; i++) em_tensor_release(s->per[i].found_t);
    s->n_per = 0;
}

void em_grad_scaler_free(em_grad_scaler *s) {
    if (!s) return;
    per_reset(s);
    cap_free(&s->cap);
    em__free(s);
}

double em_grad_scaler_get_scale(const em_grad_scaler *s) {
    return s && s->opt.enabled ? (double)s->scale : 1.0;
}
int64_t em_grad_scaler_growth_tracker(const em_grad_scaler *s) { return s ? s->growth_tracker : 0; }
int64_t em_grad_scaler_skipped_steps(const em_grad_scaler *s) { return s ? s->skipped : 0; }
bool em_grad_scaler_is_enabled(const em_grad_scaler *s) { return s && s->opt.enabled; }

em_tensor *em_grad_scaler_scale(em_grad_scaler *s, const em_tensor *loss) {
    if (!loss) return NULL; /* the loss's error passes through */
    if (!s) {
        em_set_error(EM_ERR_INVALID, "grad_scaler_scale: NULL scaler");
        return NULL;
    }
    if (!s->opt.enabled) return em__scope_track(em_tensor_retain((em_tensor *)loss));
    /* PyTorch: outputs * self._scale, a float32 tensor of shape (1,) that decides the dtype:
     * a float16/bfloat16 loss is scaled in float32 (the scale is a power of two times the
     * float32 init_scale: exact in the loss's dtype). */
    em_dtype dt = em_tensor_dtype(loss) == EM_F64 ? EM_F64 : EM_F32;
    em_tensor *l = em_to_dtype(loss, dt);
    if (l && s->cap.on) /* the product of the same two values */
        return em_mul(l, dt == EM_F32 ? s->cap.scale : em_to_dtype(s->cap.scale, EM_F64));
    return l ? em_mul_scalar(l, (double)s->scale) : NULL;
}

static per_optim *per_of(em_grad_scaler *s, const em_optimizer *o, bool make) {
    for (int i = 0; i < s->n_per; i++)
        if (s->per[i].o == o) return &s->per[i];
    if (!make) return NULL;
    if (s->n_per == MAX_OPTIMIZERS) {
        em_set_error(EM_ERR_RANGE, "grad_scaler: at most %d optimizers per step", MAX_OPTIMIZERS);
        return NULL;
    }
    per_optim *p = &s->per[s->n_per++];
    memset(p, 0, sizeof *p);
    p->o = o;
    return p;
}

/* One fused check-and-unscale call over the grads of one (device, dtype). The per-tensor
 * found_inf flags the op writes are the elements of one (n,) tensor, read back with one copy:
 * one host read per group and step (PyTorch reads its found_inf once per device, in step()),
 * not one per gradient. */
static em_status unscale_group(em_tensor **grads, const char **names, int n, double inv,
                               per_optim *p) {
    static const em_op *op;
    if (!op && !(op = em_op_find("amp_unscale_"))) return em_last_status();
    em_tensor **lists = em__calloc(2 * (size_t)n, sizeof *lists, "grad scaler lists");
    float *flag = em__calloc((size_t)n, sizeof *flag, "grad scaler flags");
    em_tensor *flags = em__empty(1, (int64_t[]){n}, EM_F32, em_tensor_device(grads[0]));
    em_status st = lists && flag && flags ? EM_OK : em_last_status();
    if (st == EM_OK) st = em_scope_begin();
    if (st == EM_OK) {
        for (int j = 0; j < n; j++) lists[j] = grads[j];
        for (int j = 0; j < n && st == EM_OK; j++) /* 0-dim views: element j */
            if (!(lists[n + j] = em_select(flags, 0, j))) st = em_last_status();
        em_attr attrs[1] = {{.type = EM_ATTR_FLOAT, .v.f = inv}};
        if (st == EM_OK) st = em_op_call_lists(op, n, NULL, attrs, lists);
        em_status se = em_scope_end();
        if (st == EM_OK) st = se;
    }
    if (st == EM_OK && p->found_t) { /* capturable: the verdict stays on the device */
        em_status sb = em_scope_begin();
        em_tensor *f = sb == EM_OK ? em_add(p->found_t, em_sum(flags, 0, NULL, false)) : NULL;
        if (f) em_tensor_retain(f);
        if (!f && st == EM_OK) st = em_last_status();
        if (sb == EM_OK) em_scope_end();
        em_tensor_release(p->found_t);
        p->found_t = f;
        n = 0; /* no host read */
    }
    if (st == EM_OK && n) st = em_tensor_to_host(flags, flag, (size_t)n * sizeof *flag);
    for (int j = 0; j < n && st == EM_OK; j++)
        if (flag[j] != 0 && !p->found_inf) {
            p->found_inf = true;
            snprintf(p->first_bad, sizeof p->first_bad, "%s", names[j] ? names[j] : "?");
        }
    em_tensor_release(flags);
    em__free(flag);
    em__free(lists);
    return st;
}

/* ---- capturable: the state on the device ------------------------------------------------- */

/* The host copies into the device tensors (set_capturable, load_state_dict). */
static em_status cap_put(em_grad_scaler *s) {
    cap_state *c = &s->cap;
    em_status st = em_fill_(c->scale, (double)s->scale);
    if (st == EM_OK) st = em_fill_(c->tracker, (double)s->growth_tracker);
    if (st == EM_OK) st = em_fill_(c->skipped, (double)s->skipped);
    if (st == EM_OK) st = em_fill_(c->fs, (double)s->floor_skips);
    if (st == EM_OK) st = em_fill_(c->found, s->last_found ? 1.0 : 0.0);
    return st;
}

em_status em_grad_scaler_set_capturable(em_grad_scaler *s, em_device dev) {
    if (!s) return em_set_error(EM_ERR_INVALID, "grad_scaler_set_capturable: NULL scaler");
    if (!s->opt.enabled) return EM_OK;
    if (s->n_per)
        return em_set_error(EM_ERR_STATE, "grad_scaler_set_capturable: a step is in progress "
                            "(call it before unscale_/step, or after update)");
    cap_free(&s->cap);
    cap_state *c = &s->cap;
    em_tensor **t[] = {&c->scale, &c->found, &c->zero32, &c->min32};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        *t[i] = em__full(0, NULL, i == 3 ? (double)(float)s->opt.min_scale : 0.0, EM_F32, dev);
    em_tensor **u[] = {&c->tracker, &c->skipped, &c->fs, &c->zero64, &c->min64, &c->interval};
    double uv[] = {0, 0, 0, 0, s->opt.min_scale, (double)s->opt.growth_interval};
    for (size_t i = 0; i < sizeof u / sizeof *u; i++) *u[i] = em__full(0, NULL, uv[i], EM_F64, dev);
    bool ok = c->scale && c->found && c->zero32 && c->min32 && c->tracker && c->skipped &&
              c->fs && c->zero64 && c->min64 && c->interval;
    em_status st = ok ? EM_OK : em_last_status();
    if (st == EM_OK) {
        c->on = true;
        c->dev = dev;
        st = cap_put(s);
    }
    if (st != EM_OK) cap_free(c);
    return st;
}

/* Every grad times 1/scale formed on the device: (float)(1 / (double)scale), as the host's
 * inv_scale, multiplied in float32 (f32, f16, bf16 grads, rounded back) or widened (f64):
 * amp_unscale_'s products. */
static em_status cap_unscale(em_grad_scaler *s, em_tensor **grads, int n) {
    em_status st = em_scope_begin();
    if (st != EM_OK) return st;
    em_tensor *inv = em_to_dtype(em_reciprocal(em_to_dtype(s->cap.scale, EM_F64)), EM_F32);
    em_tensor *inv64 = inv ? em_to_dtype(inv, EM_F64) : NULL;
    if (!inv64) st = em_last_status();
    for (int i = 0; i < n && st == EM_OK; i++) {
        em_dtype dt = em_tensor_dtype(grads[i]);
        if (dt == EM_F32 || dt == EM_F64) {
            st = em_mul_(grads[i], dt == EM_F32 ? inv : inv64);
        } else {
            em_tensor *v = em_mul(em_to_dtype(grads[i], EM_F32), inv);
            if (v) v = em_to_dtype(v, dt);
            st = v ? em_copy_(grads[i], v) : em_last_status();
        }
    }
    em_status se = em_scope_end();
    return st == EM_OK ? se : st;
}

em_status em_grad_scaler_unscale_(em_grad_scaler *s, em_optimizer *o) {
    if (!s || !o) return em_set_error(EM_ERR_INVALID, "grad_scaler_unscale_: NULL argument");
    if (!s->opt.enabled) return EM_OK;
    per_optim *p = per_of(s, o, true);
    if (!p) return em_last_status();
    if (p->st == UNSCALED)
        return em_set_error(EM_ERR_STATE, "grad_scaler_unscale_: unscale_() has already been "
                            "called on this optimizer since the last update()");
    if (p->st == STEPPED)
        return em_set_error(EM_ERR_STATE, "grad_scaler_unscale_: unscale_() is being called "
                            "after step()");
    /* PyTorch: inv_scale = self._scale.double().reciprocal().float() */
    double inv = (double)(float)(1.0 / (double)s->scale);
    int total = em_optimizer_param_total(o);
    em_tensor **grads = em__calloc((size_t)(total ? total : 1), sizeof *grads, "grad scaler");
    const char **names = em__calloc((size_t)(total ? total : 1), sizeof *names, "grad scaler");
    bool *done = em__calloc((size_t)(total ? total : 1), sizeof *done, "grad scaler");
    em_tensor **all = em__calloc((size_t)(total ? total : 1), sizeof *all, "grad scaler");
    const char **all_names = em__calloc((size_t)(total ? total : 1), sizeof *all_names, "grad scaler");
    em_status st = grads && names && done && all && all_names ? EM_OK : EM_ERR_NOMEM;
    int n_all = 0;
    for (int g = 0; st == EM_OK && g < em_optimizer_group_count(o); g++)
        for (int i = 0; i < em_optimizer_param_count(o, g); i++) {
            const char *name = NULL;
            em_tensor *w = em_optimizer_param(o, g, i, NULL, &name);
            em_tensor *gr = w ? em_tensor_grad(w) : NULL;
            if (!gr) continue;
            all[n_all] = gr;
            all_names[n_all++] = name;
        }
    p->found_inf = false;
    p->first_bad[0] = '\0';
    em_tensor_release(p->found_t);
    p->found_t = NULL;
    if (s->cap.on) { /* checked with inv_scale 1, then multiplied by the device's 1/scale */
        p->found_t = em_tensor_retain(s->cap.zero32);
        inv = 1.0;
    }
    /* Group by (device, dtype), in parameter order. */
    for (int a = 0; st == EM_OK && a < n_all; a++) {
        if (done[a]) continue;
        int n = 0;
        em_device dev = em_tensor_device(all[a]);
        em_dtype dt = em_tensor_dtype(all[a]);
        for (int b = a; b < n_all; b++)
            if (!done[b] && em_tensor_dtype(all[b]) == dt &&
                em_device_equal(em_tensor_device(all[b]), dev)) {
                grads[n] = all[b];
                names[n++] = all_names[b];
                done[b] = true;
            }
        st = unscale_group(grads, names, n, inv, p);
    }
    if (st == EM_OK && s->cap.on) st = cap_unscale(s, all, n_all);
    em__free(grads);
    em__free((void *)names);
    em__free(done);
    em__free(all);
    em__free((void *)all_names);
    if (st == EM_OK) p->st = UNSCALED;
    return st;
}

/* The step, undone on the device where an inf/NaN was found: every parameter and state is
 * saved, the optimizer steps, and where(found, saved, new) puts the saved values back (bit for
 * bit a step not taken). Before the optimizer's first step (no states to save yet) the verdict
 * is read on the host and the step taken or skipped there. */
static em_status cap_step(em_grad_scaler *s, per_optim *p, em_optimizer *o, bool *stepped) {
    cap_state *c = &s->cap;
    em_status st = EM_OK;
    if (em_optimizer_steps(o) == 0) {
        double f = 0;
        if ((st = em_tensor_item(p->found_t, &f)) != EM_OK) return st;
        c->counted = false;
        if (f != 0) return EM_OK;
        st = em_optimizer_step(o);
        if (stepped) *stepped = st == EM_OK;
        return st;
    }
    int n = em__optimizer_step_tensor_count(o);
    em_tensor **t = em__calloc((size_t)(n ? n : 1), sizeof *t, "grad scaler step");
    em_tensor **after = em__calloc((size_t)(n ? n : 1), sizeof *after, "grad scaler step");
    if (!t || !after || em__optimizer_step_tensors(o, t, n) != n) {
        em__free(t);
        em__free(after);
        return em_last_status();
    }
    bool same = c->n_saved == n;
    for (int i = 0; i < n && same; i++)
        same = em_tensor_dtype(c->saved[i]) == em_tensor_dtype(t[i]) &&
               em_tensor_numel(c->saved[i]) == em_tensor_numel(t[i]) &&
               em_tensor_ndim(c->saved[i]) == em_tensor_ndim(t[i]) &&
               em_device_equal(em_tensor_device(c->saved[i]), em_tensor_device(t[i]));
    if (!same) { /* the buffers, made by the first such step (eager, before a capture) */
        for (int i = 0; i < c->n_saved; i++) em_tensor_release(c->saved[i]);
        em__free(c->saved);
        c->n_saved = 0;
        if (!(c->saved = em__calloc((size_t)(n ? n : 1), sizeof *c->saved, "grad scaler step")))
            st = em_last_status();
        for (int i = 0; i < n && st == EM_OK; i++, c->n_saved++)
            if (!(c->saved[i] = em__empty(em_tensor_ndim(t[i]), em_tensor_shape(t[i]),
                                          em_tensor_dtype(t[i]), em_tensor_device(t[i]))))
                st = em_last_status();
    }
    if (st == EM_OK) st = em_grad_mode_push(EM_GRAD_DISABLED);
    if (st != EM_OK) {
        em__free(t);
        em__free(after);
        return st;
    }
    for (int i = 0; i < n && st == EM_OK; i++) st = em_copy_(c->saved[i], t[i]);
    if (st == EM_OK) st = em_optimizer_step(o);
    c->counted = st == EM_OK;
    if (st == EM_OK && (em__optimizer_step_tensor_count(o) != n ||
                        em__optimizer_step_tensors(o, after, n) != n))
        st = em_set_error(EM_ERR_STATE, "grad_scaler_step: the optimizer's states changed in "
                          "its step; a capturable scaler needs them made by an earlier step");
    for (int i = 0; i < n && st == EM_OK; i++)
        if (after[i] != t[i])
            st = em_set_error(EM_ERR_STATE, "grad_scaler_step: the optimizer replaced a state "
                              "tensor in its step; a capturable scaler needs them updated in "
                              "place");
    if (st == EM_OK) st = em_scope_begin();
    if (st == EM_OK) {
        em_tensor *found = em_ne(p->found_t, c->zero32);
        if (!found) st = em_last_status();
        for (int i = 0; i < n && st == EM_OK; i++) {
            em_tensor *v = em_where(found, c->saved[i], t[i]);
            st = v ? em_copy_(t[i], v) : em_last_status();
        }
        em_status se = em_scope_end();
        if (st == EM_OK) st = se;
    }
    em_grad_mode_pop();
    if (stepped) *stepped = st == EM_OK; /* queued: read_step says whether it was undone */
    em__free(t);
    em__free(after);
    return st;
}

em_status em_grad_scaler_step(em_grad_scaler *s, em_optimizer *o, bool *stepped) {
    if (stepped) *stepped = false;
    if (!s || !o) return em_set_error(EM_ERR_INVALID, "grad_scaler_step: NULL argument");
    if (!s->opt.enabled) {
        em_status st = em_optimizer_step(o);
        if (stepped) *stepped = st == EM_OK;
        return st;
    }
    per_optim *p = per_of(s, o, true);
    if (!p) return em_last_status();
    if (p->st == STEPPED)
        return em_set_error(EM_ERR_STATE, "grad_scaler_step: step() has already been called "
                            "since the last update()");
    em_status st = EM_OK;
    if (p->st == READY) st = em_grad_scaler_unscale_(s, o);
    if (st != EM_OK) return st;
    if (s->cap.on) {
        st = cap_step(s, p, o, stepped);
        if (st == EM_OK) p->st = STEPPED;
        return st;
    }
    if (!p->found_inf) {
        st = em_optimizer_step(o);
        if (stepped) *stepped = st == EM_OK;
    }
    if (st == EM_OK) p->st = STEPPED;
    return st;
}

/* _amp_update_scale_ as device ops, the host's arithmetic below line for line (scale in
 * float32, the factors' products in double, the tracker and counts as whole float64s). */
static em_status cap_update(em_grad_scaler *s) {
    cap_state *c = &s->cap;
    const em_grad_scaler_options *o = &s->opt;
    em_status st = em_scope_begin();
    if (st != EM_OK) return st;
    em_tensor *any = NULL;
    for (int i = 0; i < s->n_per; i++)
        if (s->per[i].st != READY && s->per[i].found_t)
            any = any ? em_add(any, s->per[i].found_t) : s->per[i].found_t;
    em_tensor *found = any ? em_ne(any, c->zero32) : NULL;
    em_tensor *s64 = em_to_dtype(c->scale, EM_F64);
    /* found: next = (float)(scale * backoff); (double)next < min ? (float)min : next */
    em_tensor *next = em_to_dtype(em_mul_scalar(s64, o->backoff_factor), EM_F32);
    em_tensor *back = next ? em_where(em_lt(em_to_dtype(next, EM_F64), c->min64), c->min32, next)
                           : NULL;
    /* clean: ok = tracker + 1; at the interval (float)(scale * growth) when finite, tracker 0 */
    em_tensor *ok = em_add_scalar(c->tracker, 1.0);
    em_tensor *hit = ok ? em_eq(ok, c->interval) : NULL;
    em_tensor *grown = em_to_dtype(em_mul_scalar(s64, o->growth_factor), EM_F32);
    em_tensor *fin = grown ? em_eq(em_mul_scalar(grown, 0.0), c->zero32) : NULL; /* inf*0: NaN */
    em_tensor *good = hit && fin ? em_where(em_logical_and(hit, fin), grown, c->scale) : NULL;
    em_tensor *scale = found && back && good ? em_where(found, back, good) : NULL;
    em_tensor *tracker = scale ? em_where(found, c->zero64, em_where(hit, c->zero64, ok)) : NULL;
    em_tensor *f64 = found ? em_to_dtype(found, EM_F64) : NULL;
    em_tensor *skipped = f64 ? em_add(c->skipped, f64) : NULL;
    /* a skip at the floor counts on, anything else starts again */
    em_tensor *at_floor = f64 ? em_logical_and(found, em_le(s64, c->min64)) : NULL;
    em_tensor *fs = at_floor ? em_where(at_floor, em_add_scalar(c->fs, 1.0), c->zero64) : NULL;
    em_tensor *f32 = found ? em_to_dtype(found, EM_F32) : NULL;
    if (!any)
        st = em_set_error(EM_ERR_STATE, "grad_scaler_update: no inf checks were recorded "
                          "prior to update() (call unscale_() or step() first)");
    else if (!scale || !tracker || !skipped || !fs || !f32)
        st = em_last_status();
    if (st == EM_OK) st = em_copy_(c->scale, scale);
    if (st == EM_OK) st = em_copy_(c->tracker, tracker);
    if (st == EM_OK) st = em_copy_(c->skipped, skipped);
    if (st == EM_OK) st = em_copy_(c->fs, fs);
    if (st == EM_OK) st = em_copy_(c->found, f32);
    em_status se = em_scope_end();
    if (st == EM_OK) st = se;
    if (st == EM_OK) per_reset(s);
    return st;
}

em_status em_grad_scaler_read_step(em_grad_scaler *s, em_optimizer *o, bool *skipped) {
    if (skipped) *skipped = false;
    if (!s) return em_set_error(EM_ERR_INVALID, "grad_scaler_read_step: NULL scaler");
    if (!s->opt.enabled) return EM_OK;
    if (!s->cap.on) {
        if (skipped) *skipped = s->last_found;
        return EM_OK;
    }
    cap_state *c = &s->cap;
    double v[5] = {0};
    em_tensor *t[5] = {c->found, c->scale, c->tracker, c->skipped, c->fs};
    for (int i = 0; i < 5; i++) {
        em_status st = em_tensor_item(t[i], &v[i]);
        if (st != EM_OK) return st;
    }
    s->last_found = v[0] != 0;
    s->scale = (float)v[1];
    s->growth_tracker = (int64_t)v[2];
    s->skipped = (int64_t)v[3];
    s->floor_skips = (int64_t)v[4];
    if (s->last_found && c->counted) em__optimizer_uncount(o);
    if (skipped) *skipped = s->last_found;
    if (s->floor_skips >= s->opt.max_floor_skips)
        return em_set_error(EM_ERR_RANGE, "grad_scaler: %" PRId64 " steps in a row had inf/NaN "
                            "gradients at the scale's floor %g, so the gradients overflow even "
                            "unscaled and training stopped. Try a lower learning rate, gradient "
                            "clipping (--clip-grad-norm 1.0), and --anomaly to name the op that "
                            "first makes a NaN/Inf", s->floor_skips, s->opt.min_scale);
    return EM_OK;
}

em_status em_grad_scaler_update(em_grad_scaler *s) {
    if (!s) return em_set_error(EM_ERR_INVALID, "grad_scaler_update: NULL scaler");
    if (!s->opt.enabled) return EM_OK;
    bool found = false, any = false;
    const char *bad = NULL;
    for (int i = 0; i < s->n_per; i++) {
        if (s->per[i].st == READY) continue;
        any = true;
        if (s->per[i].found_inf && !found) bad = s->per[i].first_bad;
        found |= s->per[i].found_inf;
    }
    if (!any)
        return em_set_error(EM_ERR_STATE, "grad_scaler_update: no inf checks were recorded "
                            "prior to update() (call unscale_() or step() first)");
    if (s->cap.on) return cap_update(s);
    char bad_name[96];
    snprintf(bad_name, sizeof bad_name, "%s", bad ? bad : "");
    per_reset(s);
    s->last_found = found;
    /* PyTorch's _amp_update_scale_ (CPU): float scale, double factors. */
    bool at_floor = false;
    if (found) {
        s->skipped++;
        at_floor = (double)s->scale <= s->opt.min_scale;
        float next = (float)((double)s->scale * s->opt.backoff_factor);
        s->scale = (double)next < s->opt.min_scale ? (float)s->opt.min_scale : next;
        s->growth_tracker = 0;
    } else {
        int64_t ok = s->growth_tracker + 1;
        if (ok == s->opt.growth_interval) {
            float next = (float)((double)s->scale * s->opt.growth_factor);
            if (isfinite(next)) s->scale = next;
            s->growth_tracker = 0;
        } else {
            s->growth_tracker = ok;
        }
    }
    s->floor_skips = at_floor ? s->floor_skips + 1 : 0;
    if (s->floor_skips >= s->opt.max_floor_skips)
        return em_set_error(EM_ERR_RANGE, "grad_scaler: %" PRId64 " steps in a row had inf/NaN "
                            "gradients (the first: %s) at the scale's floor %g, so the gradients "
                            "overflow even unscaled and training stopped. Try a lower learning "
                            "rate, gradient clipping (--clip-grad-norm 1.0), and --anomaly to "
                            "name the op that first makes a NaN/Inf", s->floor_skips,
                            bad_name[0] ? bad_name : "?", s->opt.min_scale);
    return EM_OK;
}

/* ---- state dict ------------------------------------------------------------------------------ */

em_status em_grad_scaler_state_dict(const em_grad_scaler *s, char **json) {
    if (!s || !json) return em_set_error(EM_ERR_INVALID, "grad_scaler_state_dict: NULL argument");
    *json = NULL;
    json_t *r = json_pack("{s:f, s:f, s:f, s:I, s:I, s:f, s:I, s:I, s:I, s:b}",
                          "scale", (double)s->scale, "growth_factor", s->opt.growth_factor,
                          "backoff_factor", s->opt.backoff_factor,
                          "growth_interval", (json_int_t)s->opt.growth_interval,
                          "_growth_tracker", (json_int_t)s->growth_tracker,
                          "min_scale", s->opt.min_scale,
                          "max_floor_skips", (json_int_t)s->opt.max_floor_skips,
                          "skipped_steps", (json_int_t)s->skipped,
                          "floor_skips", (json_int_t)s->floor_skips,
                          "enabled", s->opt.enabled);
    char *t = r ? json_dumps(r, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(r);
    if (!t) return em_set_error(EM_ERR_NOMEM, "grad_scaler_state_dict: out of memory");
    *json = em__strdup(t, "grad scaler state");
    free(t);
    return *json ? EM_OK : EM_ERR_NOMEM;
}

static bool get_num(json_t *r, const char *key, bool required, double *out, bool integer,
                    const char **bad) {
    json_t *v = json_object_get(r, key);
    if (!v) {
        if (required) *bad = key;
        return !required;
    }
    if (integer ? !json_is_integer(v) : !json_is_number(v)) {
        *bad = key;
        return false;
    }
    *out = json_number_value(v);
    return true;
}

em_status em_grad_scaler_load_state_dict(em_grad_scaler *s, const char *json) {
    if (!s || !json) return em_set_error(EM_ERR_INVALID, "grad_scaler_load_state_dict: NULL argument");
    json_error_t err;
    json_t *r = json_loads(json, 0, &err);
    if (!r || !json_is_object(r)) {
        json_decref(r);
        return em_set_error(EM_ERR_FORMAT, "grad_scaler_load_state_dict: not a JSON object "
                            "(%s)", r ? "another JSON value" : err.text);
    }
    em_grad_scaler_options o = s->opt;
    double scale = 0, gt = 0, skipped = (double)s->skipped, fs = 0, gi = 0, mfs = (double)o.max_floor_skips;
    const char *bad = NULL;
    bool ok = get_num(r, "scale", true, &scale, false, &bad) &&
              get_num(r, "growth_factor", true, &o.growth_factor, false, &bad) &&
              get_num(r, "backoff_factor", true, &o.backoff_factor, false, &bad) &&
              get_num(r, "growth_interval", true, &gi, true, &bad) &&
              get_num(r, "_growth_tracker", true, &gt, true, &bad) &&
              get_num(r, "min_scale", false, &o.min_scale, false, &bad) &&
              get_num(r, "max_floor_skips", false, &mfs, true, &bad) &&
              get_num(r, "skipped_steps", false, &skipped, true, &bad) &&
              get_num(r, "floor_skips", false, &fs, true, &bad);
    json_t *en = json_object_get(r, "enabled");
    if (ok && en && !json_is_boolean(en)) ok = false, bad = "enabled";
    if (ok && en) o.enabled = json_is_true(en);
    json_decref(r);
    if (!ok)
        return em_set_error(EM_ERR_FORMAT, "grad_scaler_load_state_dict: key '%s' is missing or "
                            "not a number", bad);
    o.growth_interval = (int64_t)gi;
    o.max_floor_skips = (int64_t)mfs;
    o.init_scale = fmax(scale, o.min_scale);
    if (!(scale > 0) || !isfinite(scale) || gt < 0 || gt >= gi || skipped < 0 || fs < 0)
        return em_set_error(EM_ERR_FORMAT, "grad_scaler_load_state_dict: scale %g, "
                            "_growth_tracker %g, skipped_steps %g or floor_skips %g is out of "
                            "range", scale, gt, skipped, fs);
    if (check_options(&o) != EM_OK)
        return em_set_error(EM_ERR_FORMAT, "grad_scaler_load_state_dict: %s", em_last_error());
    s->opt.growth_factor = o.growth_factor;
    s->opt.backoff_factor = o.backoff_factor;
    s->opt.growth_interval = o.growth_interval;
    s->opt.min_scale = o.min_scale;
    s->opt.max_floor_skips = o.max_floor_skips;
    s->opt.enabled = o.enabled;
    s->scale = (float)scale;
    s->growth_tracker = (int64_t)gt;
    s->skipped = (int64_t)skipped;
    s->floor_skips = (int64_t)fs;
    per_reset(s);
    return s->cap.on ? cap_put(s) : EM_OK;
}
