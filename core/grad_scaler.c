/*
 * grad_scaler.c — the gradient scaler (ember/grad_scaler.h): PyTorch's GradScaler state
 * machine per optimizer (ready, unscaled, stepped), the fused check-and-unscale list op per
 * (device, dtype) of the gradients, PyTorch's scale update, Ember's floor, and the state
 * dict.
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
} per_optim;

struct em_grad_scaler {
    em_grad_scaler_options opt;
    float scale;
    int64_t growth_tracker;
    int64_t skipped;      /* skipped steps since creation (or load) */
    int64_t floor_skips;  /* skipped steps in a row at the floor */
    per_optim per[MAX_OPTIMIZERS];
    int n_per;
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

void em_grad_scaler_free(em_grad_scaler *s) { em__free(s); }

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
    if (st == EM_OK) st = em_tensor_to_host(flags, flag, (size_t)n * sizeof *flag);
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
    em__free(grads);
    em__free((void *)names);
    em__free(done);
    em__free(all);
    em__free((void *)all_names);
    if (st == EM_OK) p->st = UNSCALED;
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
    if (!p->found_inf) {
        st = em_optimizer_step(o);
        if (stepped) *stepped = st == EM_OK;
    }
    if (st == EM_OK) p->st = STEPPED;
    return st;
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
    char bad_name[96];
    snprintf(bad_name, sizeof bad_name, "%s", bad ? bad : "");
    s->n_per = 0;
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
    s->n_per = 0;
    return EM_OK;
}
