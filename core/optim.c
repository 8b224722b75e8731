/*
 * optim.c — optimizer and scheduler class registries, the optimizer object (parameter groups,
 * per-parameter state, state dicts), gradient clipping, and the scheduler object
 * (ember/optim.h). The classes themselves (SGD, Adam, StepLR, ...) live in plugins/optim.
 *
 * Classes. Optimizer and scheduler classes are the "optimizer" and "scheduler" kinds of the
 * core's one class registry (plugin.c): each registered class is copied (missing trailing
 * slots of an older, smaller struct zeroed) and attributed to the registry that registered it;
 * unloading a plugin removes its classes. This file holds the two kinds' own checks.
 * Optimizers and schedulers must be freed before the plugin that made their class unloads.
 *
 * Parameters are numbered globally, group by group, as in PyTorch's state_dict; state is kept
 * per parameter index as (name, tensor) pairs, tensors tagged EM_MEM_OPTIMIZER.
 *
 * The state dict's JSON ("groups_json"):
 *   {"class": "Adam", "steps": 50,
 *    "param_groups": [{"lr": 0.001, "betas": [0.9, 0.999], ..., "initial_lr": 0.001,
 *                      "params": [0, 1], "param_names": ["0.weight", "0.bias"]}, ...]}
 * A scheduler's: {"class": "StepLR", "last_epoch": 3, "step_count": 4, "base_lrs": [...],
 *                 "last_lr": [...], "state": <class-private JSON or null>}.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/optim.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

/* ---- the "optimizer" and "scheduler" kinds of plugin.c's class registry ------------------- */

/* Checks an option table: names present, unique. */
static em_status check_specs(const char *who, const char *name, const em_option_spec *specs,
                             int n) {
    if (n < 0 || (n > 0 && !specs))
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' has %d options but no option table",
                            who, name, n);
    for (int i = 0; i < n; i++) {
        if (!specs[i].name || !*specs[i].name)
            return em_set_error(EM_ERR_INVALID, "%s: class '%s': option %d has no name", who,
                                name, i);
        for (int j = 0; j < i; j++)
            if (strcmp(specs[i].name, specs[j].name) == 0)
                return em_set_error(EM_ERR_INVALID, "%s: class '%s' declares option '%s' twice",
                                    who, name, specs[i].name);
    }
    return EM_OK;
}

em_status em__optim_class_check(const void *record, const char *who) {
    const em_optim_class *cls = record;
    if (!cls->step)
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' needs a step function", who,
                            cls->name);
    return check_specs(who, cls->name, cls->options, cls->n_options);
}

em_status em__sched_class_check(const void *record, const char *who) {
    const em_sched_class *cls = record;
    if (!cls->step)
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' needs a step function", who,
                            cls->name);
    if (!cls->interval || (strcmp(cls->interval, "step") != 0 && strcmp(cls->interval, "epoch") != 0))
        return em_set_error(EM_ERR_INVALID, "%s: class '%s': interval must be \"step\" (per "
                            "batch) or \"epoch\", not '%s'", who, cls->name,
                            cls->interval ? cls->interval : "(null)");
    return check_specs(who, cls->name, cls->options, cls->n_options);
}

em_status em_optim_class_register(em_registry *reg, const em_optim_class *cls) {
    return em__class_register(reg, "optimizer", cls, "optim_class_register");
}
const em_optim_class *em_optim_class_find(const char *name) {
    return em__class_find("optimizer", name, NULL);
}
size_t em_optim_class_count(void) { return em_class_count("optimizer"); }
const em_optim_class *em_optim_class_get(size_t i) { return em_class_get("optimizer", i); }

em_status em_sched_class_register(em_registry *reg, const em_sched_class *cls) {
    return em__class_register(reg, "scheduler", cls, "sched_class_register");
}
const em_sched_class *em_sched_class_find(const char *name) {
    return em__class_find("scheduler", name, NULL);
}
size_t em_sched_class_count(void) { return em_class_count("scheduler"); }
const em_sched_class *em_sched_class_get(size_t i) { return em_class_get("scheduler", i); }

size_t em_registry_optim_class_count(const em_registry *reg) {
    return em_registry_class_count(reg, "optimizer");
}
const char *em_registry_optim_class_name(const em_registry *reg, size_t i) {
    return em_registry_class_name(reg, "optimizer", i);
}
size_t em_registry_sched_class_count(const em_registry *reg) {
    return em_registry_class_count(reg, "scheduler");
}
const char *em_registry_sched_class_name(const em_registry *reg, size_t i) {
    return em_registry_class_name(reg, "scheduler", i);
}

/* ---- options helpers ------------------------------------------------------------------------- */

/* Copy option `name` of src (typed when src knows its type, else as text) into dst. */
static em_status option_copy(em_options *dst, const em_options *src, size_t i) {
    const char *name = em_options_name(src, i);
    int64_t iv[EM_OPT_MAX_LIST];
    double fv[EM_OPT_MAX_LIST];
    int n;
    switch (em_options_type(src, name)) {
    case EM_OPT_INT: return em_options_set_int(dst, name, em_options_int(src, name));
    case EM_OPT_FLOAT: return em_options_set_float(dst, name, em_options_float(src, name));
    case EM_OPT_BOOL: return em_options_set_bool(dst, name, em_options_bool(src, name));
    case EM_OPT_STRING: return em_options_set_string(dst, name, em_options_string(src, name));
    case EM_OPT_INTS:
        n = em_options_ints(src, name, iv, EM_OPT_MAX_LIST);
        return em_options_set_ints(dst, name, n, iv);
    case EM_OPT_FLOATS:
        n = em_options_floats(src, name, fv, EM_OPT_MAX_LIST);
        return em_options_set_floats(dst, name, n, fv);
    default: {
        char buf[512];
        return em_options_set_text(dst, name, em_options_text(src, i, buf, sizeof buf), NULL);
    }
    }
}

/* A new bag: defaults (may be NULL) overlaid with over (may be NULL). */
static em_options *options_merge(const em_options *defaults, const em_options *over) {
    em_options *o = defaults ? em_options_copy(defaults) : em_options_new();
    if (!o) return NULL;
    for (size_t i = 0; over && i < em_options_count(over); i++)
        if (option_copy(o, over, i) != EM_OK) {
            em_options_free(o);
            return NULL;
        }
    return o;
}

/* An option's value as JSON (NULL on out of memory). */
static json_t *option_json(const em_options *o, size_t i) {
    const char *name = em_options_name(o, i);
    int64_t iv[EM_OPT_MAX_LIST];
    double fv[EM_OPT_MAX_LIST];
    json_t *a;
    int n;
    switch (em_options_type(o, name)) {
    case EM_OPT_INT: return json_integer(em_options_int(o, name));
    case EM_OPT_FLOAT: return json_real(em_options_float(o, name));
    case EM_OPT_BOOL: return json_boolean(em_options_bool(o, name));
    case EM_OPT_STRING: return json_string(em_options_string(o, name));
    case EM_OPT_INTS:
        n = em_options_ints(o, name, iv, EM_OPT_MAX_LIST);
        if (!(a = json_array())) return NULL;
        for (int k = 0; k < n; k++) json_array_append_new(a, json_integer(iv[k]));
        return a;
    case EM_OPT_FLOATS:
        n = em_options_floats(o, name, fv, EM_OPT_MAX_LIST);
        if (!(a = json_array())) return NULL;
        for (int k = 0; k < n; k++) json_array_append_new(a, json_real(fv[k]));
        return a;
    default: {
        char buf[512];
        return json_string(em_options_text(o, i, buf, sizeof buf));
    }
    }
}

/* Set option `name` from a JSON value; `where` names it in errors. */
static em_status option_from_json(em_options *o, const char *name, const json_t *v,
                                  const char *where) {
    if (json_is_integer(v)) return em_options_set_int(o, name, json_integer_value(v));
    if (json_is_real(v)) return em_options_set_float(o, name, json_real_value(v));
    if (json_is_boolean(v)) return em_options_set_bool(o, name, json_is_true(v));
    if (json_is_string(v)) return em_options_set_string(o, name, json_string_value(v));
    if (json_is_array(v)) {
        size_t n = json_array_size(v);
        if (n > EM_OPT_MAX_LIST)
            return em_set_error(EM_ERR_INVALID, "%s: option '%s' has %zu values (at most %d)",
                                where, name, n, EM_OPT_MAX_LIST);
        bool any_real = false;
        int64_t iv[EM_OPT_MAX_LIST];
        double fv[EM_OPT_MAX_LIST];
        for (size_t k = 0; k < n; k++) {
            const json_t *e = json_array_get(v, k);
            if (!json_is_number(e))
                return em_set_error(EM_ERR_INVALID, "%s: option '%s' entry %zu is not a number",
                                    where, name, k);
            any_real |= json_is_real(e);
            fv[k] = json_number_value(e);
            iv[k] = json_is_integer(e) ? json_integer_value(e) : 0;
        }
        return any_real ? em_options_set_floats(o, name, (int)n, fv)
                        : em_options_set_ints(o, name, (int)n, iv);
    }
    return em_set_error(EM_ERR_INVALID, "%s: option '%s' has a value of an unsupported JSON "
                        "type", where, name);
}

/* json_dumps into a string from em__malloc (NULL on failure, error set). */
static char *json_text(json_t *root) {
    char *s = root ? json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    if (!s) {
        em_set_error(EM_ERR_NOMEM, "out of memory writing JSON");
        return NULL;
    }
    char *r = em__strdup(s, "state dict JSON");
    free(s);
    return r;
}

/* ---- the optimizer --------------------------------------------------------------------------- */

typedef struct state_entry {
    char *name;
    em_tensor *t; /* one reference held */
} state_entry;

typedef struct param_state {
    state_entry *e;
    int n, cap;
} param_state;

typedef struct opt_group {
    em_options *opts; /* resolved */
    int first, n;     /* global indices first..first+n-1 */
    bool has_initial_lr;
    double initial_lr;
    em_tensor *lr_t;   /* em_optimizer_lr_tensor's (one reference), or NULL */
    double lr_t_value; /* the value last written into it */
} opt_group;

struct em_optimizer {
    const em_optim_class *cls;
    opt_group *groups;
    int n_groups;
    em_tensor **params; /* [n_params], one reference each */
    char **names;       /* [n_params] */
    param_state *state; /* [n_params] */
    int n_params;
    int64_t steps;
};

static void state_clear(param_state *ps) {
    for (int k = 0; k < ps->n; k++) {
        em__free(ps->e[k].name);
        em_tensor_release(ps->e[k].t);
    }
    em__free(ps->e);
    memset(ps, 0, sizeof *ps);
}

void em_optimizer_free(em_optimizer *o) {
    if (!o) return;
    for (int g = 0; g < o->n_groups; g++) {
        em_options_free(o->groups[g].opts);
        em_tensor_release(o->groups[g].lr_t);
    }
    em__free(o->groups);
    for (int i = 0; i < o->n_params; i++) {
        em_tensor_release(o->params[i]);
        em__free(o->names ? o->names[i] : NULL);
        if (o->state) state_clear(&o->state[i]);
    }
    em__free(o->params);
    em__free(o->names);
    em__free(o->state);
    em__free(o);
    em__live_dec(EM__LIVE_OPTIMIZER);
}

static em_optimizer *optimizer_build(const char *class_name, const em_param_group *groups,
                                     int n_groups, const em_options *defaults) {
    if (!class_name)
        return em_set_error(EM_ERR_INVALID, "optimizer_new: NULL class name"), NULL;
    const em_optim_class *cls = em__class_find("optimizer", class_name, "optimizer_new");
    if (!cls) return NULL;
    if (n_groups < 1 || !groups)
        return em_set_error(EM_ERR_INVALID, "optimizer_new(%s): no parameter groups", cls->name),
               NULL;
    int total = 0;
    for (int g = 0; g < n_groups; g++) {
        if (!groups[g].params)
            return em_set_error(EM_ERR_INVALID, "%s: param group %d has no params dict",
                                cls->name, g), NULL;
        size_t len = em_dict_len(groups[g].params);
        if (len == 0)
            return em_set_error(EM_ERR_INVALID, "%s: param group %d is empty (optimizer got an "
                                "empty parameter list)", cls->name, g), NULL;
        total += (int)len;
    }
    em_optimizer *o = em__calloc(1, sizeof *o, "optimizer");
    if (!o) return NULL;
    em__live_inc(EM__LIVE_OPTIMIZER);
    o->cls = cls;
    if (!(o->groups = em__calloc((size_t)n_groups, sizeof *o->groups, "optimizer groups")) ||
        !(o->params = em__calloc((size_t)total, sizeof *o->params, "optimizer params")) ||
        !(o->names = em__calloc((size_t)total, sizeof *o->names, "optimizer params")) ||
        !(o->state = em__calloc((size_t)total, sizeof *o->state, "optimizer state")))
        goto fail;
    o->n_groups = n_groups;
    for (int g = 0; g < n_groups; g++) {
        opt_group *G = &o->groups[g];
        char where[160];
        snprintf(where, sizeof where, "%s (param group %d)", cls->name, g);
        if (!(G->opts = options_merge(defaults, groups[g].options))) goto fail;
        if (em_options_resolve(G->opts, where, cls->options, cls->n_options) != EM_OK) goto fail;
        if (em_options_has(G->opts, "lr") &&
            !(em_options_float(G->opts, "lr") >= 0 && isfinite(em_options_float(G->opts, "lr")))) {
            /* Checked here, not by the spec's range: schedulers may drive lr below 0
             * (OneCycleLR's last step overshoots, as in PyTorch) and such a state must load. */
            em_set_error(EM_ERR_INVALID, "%s: invalid learning rate %g (must be a finite number "
                         ">= 0)", where, em_options_float(G->opts, "lr"));
            goto fail;
        }
        if (cls->validate && cls->validate(G->opts, where) != EM_OK) goto fail;
        G->first = o->n_params;
        for (size_t i = 0; i < em_dict_len(groups[g].params); i++) {
            const char *name = em_dict_key(groups[g].params, i);
            em_tensor *p = em_dict_value(groups[g].params, i);
            if (!em_dtype_is_floating(em_tensor_dtype(p))) {
                em_set_error(EM_ERR_DTYPE, "%s: parameter '%s' (group %d) has dtype %s; only "
                             "floating tensors can be optimized", cls->name, name, g,
                             em_dtype_name(em_tensor_dtype(p)));
                goto fail;
            }
            if (!em_tensor_is_leaf(p)) {
                em_set_error(EM_ERR_INVALID, "%s: can't optimize a non-leaf tensor: parameter "
                             "'%s' (group %d) was made by %s", cls->name, name, g,
                             em_tensor_grad_fn_name(p));
                goto fail;
            }
            for (int j = 0; j < o->n_params; j++)
                if (o->params[j] == p) {
                    int gj = 0;
                    while (gj < g && j >= o->groups[gj].first + o->groups[gj].n) gj++;
                    em_set_error(EM_ERR_INVALID, "%s: parameter '%s' of group %d is also in "
                                 "group %d (as '%s'); a parameter may appear once only",
                                 cls->name, name, g, gj, o->names[j]);
                    goto fail;
                }
            if (!(o->names[o->n_params] = em__strdup(name, "parameter name"))) goto fail;
            o->params[o->n_params++] = em_tensor_retain(p);
            G->n++;
        }
    }
    return o;
fail:
    em_optimizer_free(o);
    return NULL;
}

em_optimizer *em_optimizer_new(const char *class_name, const em_dict *params,
                               const em_options *opts) {
    em_param_group g = {.params = params, .options = opts};
    return optimizer_build(class_name, &g, 1, NULL);
}

em_optimizer *em_optimizer_new_groups(const char *class_name, const em_param_group *groups,
                                      int n_groups) {
    return optimizer_build(class_name, groups, n_groups, NULL);
}

em_optimizer *em_optimizer_new_groups_defaults(const char *class_name,
                                               const em_param_group *groups, int n_groups,
                                               const em_options *defaults) {
    return optimizer_build(class_name, groups, n_groups, defaults);
}

em_status em_optimizer_step(em_optimizer *o) {
    if (!o) return em_set_error(EM_ERR_INVALID, "optimizer_step: NULL optimizer");
    em_status st = em_grad_mode_push(EM_GRAD_DISABLED);
    if (st != EM_OK) return st;
    if ((st = em_scope_begin()) != EM_OK) {
        em_grad_mode_pop();
        return st;
    }
    em_clear_error();
    uint64_t t0 = em__spanning() ? em__now_ns() : 0;
    st = o->cls->step(o);
    if (st != EM_OK && !em__error_pending())
        em_set_error(st, "%s.step failed: %s", o->cls->name, em_status_str(st));
    if (em__spanning())
        em__prof_span("optimizer_step", "optimizer", "optimizer", o->cls->name, 0, t0,
                      em__now_ns());
    em_scope_end();
    em_grad_mode_pop();
    if (st == EM_OK) o->steps++;
    return st;
}

void em_optimizer_zero_grad(em_optimizer *o) {
    for (int i = 0; o && i < o->n_params; i++) em_tensor_set_grad(o->params[i], NULL);
}

const em_optim_class *em_optimizer_class(const em_optimizer *o) { return o ? o->cls : NULL; }
int em_optimizer_group_count(const em_optimizer *o) { return o ? o->n_groups : 0; }
int em_optimizer_param_total(const em_optimizer *o) { return o ? o->n_params : 0; }
int64_t em_optimizer_steps(const em_optimizer *o) { return o ? o->steps : 0; }

int em__optimizer_step_tensor_count(const em_optimizer *o) {
    int n = 0;
    for (int i = 0; o && i < o->n_params; i++) n += 1 + o->state[i].n;
    return n;
}

int em__optimizer_step_tensors(const em_optimizer *o, em_tensor **out, int cap) {
    int n = 0;
    for (int i = 0; i < o->n_params; i++)
        for (int k = -1; k < o->state[i].n; k++) {
            if (n == cap) {
                em_set_error(EM_ERR_STATE, "optimizer: more step tensors than the %d expected",
                             cap);
                return -1;
            }
            out[n++] = k < 0 ? o->params[i] : o->state[i].e[k].t;
        }
    return n;
}

void em__optimizer_uncount(em_optimizer *o) {
    if (o && o->steps > 0) o->steps--;
}

em_status em_optimizer_count_replayed(em_optimizer *o, int64_t n) {
    if (!o) return em_set_error(EM_ERR_INVALID, "optimizer_count_replayed: NULL optimizer");
    if (n < 0 || n > EM_STEP_MAX - o->steps)
        return em_set_error(EM_ERR_RANGE, "optimizer_count_replayed: %lld more steps after %lld "
                            "(at most %lld in all)", (long long)n, (long long)o->steps,
                            (long long)EM_STEP_MAX);
    o->steps += n;
    return EM_OK;
}

static bool group_ok(const em_optimizer *o, int g, const char *who) {
    if (o && g >= 0 && g < o->n_groups) return true;
    em_set_error(EM_ERR_RANGE, "%s: param group %d is out of range (%d groups)", who, g,
                 o ? o->n_groups : 0);
    return false;
}

const em_options *em_optimizer_group_options(const em_optimizer *o, int g) {
    return group_ok(o, g, "optimizer_group_options") ? o->groups[g].opts : NULL;
}
em_options *em_optimizer_group_options_mutable(em_optimizer *o, int g) {
    return group_ok(o, g, "optimizer_group_options_mutable") ? o->groups[g].opts : NULL;
}

em_status em_optimizer_set_lr(em_optimizer *o, int g, double lr) {
    if (!group_ok(o, g, "optimizer_set_lr")) return EM_ERR_RANGE;
    if (isnan(lr))
        return em_set_error(EM_ERR_INVALID, "optimizer_set_lr: %s group %d: the learning rate "
                            "is NaN", o->cls->name, g);
    em_status st = em_options_set_float(o->groups[g].opts, "lr", lr);
    opt_group *G = &o->groups[g];
    if (st == EM_OK && G->lr_t && G->lr_t_value != lr) {
        if ((st = em_fill_(G->lr_t, lr)) == EM_OK) G->lr_t_value = lr;
    }
    return st;
}

em_tensor *em_optimizer_lr_tensor(em_optimizer *o, int g, em_device dev) {
    if (!group_ok(o, g, "optimizer_lr_tensor")) return NULL;
    opt_group *G = &o->groups[g];
    double lr = em_options_float(G->opts, "lr");
    if (G->lr_t && !em_device_equal(em_tensor_device(G->lr_t), dev)) {
        em_tensor_release(G->lr_t);
        G->lr_t = NULL;
    }
    if (!G->lr_t) {
        em_scope_begin(); /* a reference of the group's own, whatever scope the caller has */
        em_tensor *t = em_empty(0, NULL, EM_F64, dev);
        if (t && em_fill_(t, lr) == EM_OK) G->lr_t = em_tensor_retain(t);
        em_scope_end();
        if (!G->lr_t) return NULL;
        G->lr_t_value = lr;
    } else if (G->lr_t_value != lr) { /* the options were changed directly */
        if (em_fill_(G->lr_t, lr) != EM_OK) return NULL;
        G->lr_t_value = lr;
    }
    return G->lr_t;
}

double em_optimizer_lr(const em_optimizer *o, int g) {
    if (!group_ok(o, g, "optimizer_lr")) return NAN;
    return em_options_float(o->groups[g].opts, "lr");
}

int em_optimizer_param_count(const em_optimizer *o, int g) {
    return group_ok(o, g, "optimizer_param_count") ? o->groups[g].n : 0;
}

em_tensor *em_optimizer_param(const em_optimizer *o, int g, int i, int *index, const char **name) {
    if (!group_ok(o, g, "optimizer_param")) return NULL;
    if (i < 0 || i >= o->groups[g].n) {
        em_set_error(EM_ERR_RANGE, "optimizer_param: parameter %d of group %d is out of range "
                     "(%d parameters)", i, g, o->groups[g].n);
        return NULL;
    }
    int k = o->groups[g].first + i;
    if (index) *index = k;
    if (name) *name = o->names[k];
    return o->params[k];
}

em_tensor *em_optimizer_state(const em_optimizer *o, int index, const char *name) {
    if (!o || !name || index < 0 || index >= o->n_params) return NULL;
    const param_state *ps = &o->state[index];
    for (int k = 0; k < ps->n; k++)
        if (strcmp(ps->e[k].name, name) == 0) return ps->e[k].t;
    return NULL;
}

/* Put t (retained) under name in ps, replacing. */
static em_status state_put(param_state *ps, const char *name, em_tensor *t) {
    for (int k = 0; k < ps->n; k++)
        if (strcmp(ps->e[k].name, name) == 0) {
            em_tensor_retain(t);
            em_tensor_release(ps->e[k].t);
            ps->e[k].t = t;
            return EM_OK;
        }
    if (ps->n == ps->cap) {
        int nc = ps->cap ? ps->cap * 2 : 4;
        state_entry *e = em__realloc(ps->e, (size_t)ps->cap * sizeof *e, (size_t)nc * sizeof *e,
                                     "optimizer state");
        if (!e) return EM_ERR_NOMEM;
        ps->e = e;
        ps->cap = nc;
    }
    char *n = em__strdup(name, "optimizer state name");
    if (!n) return EM_ERR_NOMEM;
    ps->e[ps->n++] = (state_entry){.name = n, .t = em_tensor_retain(t)};
    return EM_OK;
}

/* Tag t's storage as optimizer state (wrapped memory has no category: left as it is). */
static void tag_optimizer(em_tensor *t) {
    if (t->storage->block) em_tensor_set_category(t, EM_MEM_OPTIMIZER);
}

em_status em_optimizer_set_state(em_optimizer *o, int index, const char *name, em_tensor *t) {
    if (!o || !name || !*name || !t)
        return em_set_error(EM_ERR_INVALID, "optimizer_set_state: NULL optimizer, name or tensor");
    if (index < 0 || index >= o->n_params)
        return em_set_error(EM_ERR_RANGE, "optimizer_set_state: parameter index %d is out of "
                            "range (%d parameters)", index, o->n_params);
    if (strchr(name, '.'))
        return em_set_error(EM_ERR_INVALID, "optimizer_set_state: state name '%s' must not "
                            "contain '.' (state dict keys are state.<index>.<name>)", name);
    tag_optimizer(t);
    return state_put(&o->state[index], name, t);
}

/* ---- optimizer state dict -------------------------------------------------------------------- */

em_status em_optimizer_state_dict(const em_optimizer *o, em_dict **tensors, char **groups_json) {
    if (!o || !tensors || !groups_json)
        return em_set_error(EM_ERR_INVALID, "optimizer_state_dict: NULL argument");
    *tensors = NULL;
    *groups_json = NULL;
    em_dict *d = em_dict_new();
    json_t *root = json_object(), *groups = json_array();
    if (!d || !root || !groups) goto nomem;
    json_object_set_new(root, "class", json_string(o->cls->name));
    json_object_set_new(root, "steps", json_integer(o->steps));
    json_object_set_new(root, "param_groups", groups);
    for (int g = 0; g < o->n_groups; g++) {
        const opt_group *G = &o->groups[g];
        json_t *jg = json_object(), *ids = json_array(), *names = json_array();
        if (!jg || !ids || !names) {
            json_decref(jg), json_decref(ids), json_decref(names);
            goto nomem;
        }
        json_array_append_new(groups, jg);
        for (size_t i = 0; i < em_options_count(G->opts); i++)
            json_object_set_new(jg, em_options_name(G->opts, i), option_json(G->opts, i));
        if (G->has_initial_lr) json_object_set_new(jg, "initial_lr", json_real(G->initial_lr));
        for (int i = 0; i < G->n; i++) {
            json_array_append_new(ids, json_integer(G->first + i));
            json_array_append_new(names, json_string(o->names[G->first + i]));
        }
        json_object_set_new(jg, "params", ids);
        json_object_set_new(jg, "param_names", names);
    }
    for (int i = 0; i < o->n_params; i++)
        for (int k = 0; k < o->state[i].n; k++) {
            char key[256];
            snprintf(key, sizeof key, "state.%d.%s", i, o->state[i].e[k].name);
            if (em_dict_set(d, key, o->state[i].e[k].t) != EM_OK) goto fail;
        }
    if (!(*groups_json = json_text(root))) goto fail;
    json_decref(root);
    *tensors = d;
    return EM_OK;
nomem:
    em_set_error(EM_ERR_NOMEM, "optimizer_state_dict: out of memory");
fail:
    json_decref(root);
    em_dict_free(d);
    return em_last_status();
}

/* Parse "state.<index>.<name>": index and a pointer to name; false when malformed. */
static bool parse_state_key(const char *key, long *index, const char **name) {
    if (strncmp(key, "state.", 6) != 0) return false;
    char *end;
    const char *p = key + 6;
    if (*p < '0' || *p > '9') return false;
    *index = strtol(p, &end, 10);
    if (*end != '.' || !end[1]) return false;
    *name = end + 1;
    return strchr(*name, '.') == NULL;
}

/* What a loaded state dict will put in place, checked whole (em__optimizer_load_prepare). */
struct em__optim_load {
    em_options **opts;  /* [n_groups] */
    double *init_lr;    /* [n_groups] */
    bool *has_init;     /* [n_groups] */
    param_state *state; /* [n_params] */
    int64_t steps;
};

void em__optimizer_load_discard(const em_optimizer *o, em__optim_load *p) {
    if (!p) return;
    for (int g = 0; p->opts && g < o->n_groups; g++) em_options_free(p->opts[g]);
    for (int i = 0; p->state && i < o->n_params; i++) state_clear(&p->state[i]);
    em__free(p->opts);
    em__free(p->state);
    em__free(p->init_lr);
    em__free(p->has_init);
    em__free(p);
}

/* A "step" count: 0-dim, a whole number in [0, EM_STEP_MAX]. */
static em_status check_step_state(const char *who, const char *key, const em_tensor *src) {
    char sb[128];
    if (em_tensor_ndim(src) != 0)
        return em_set_error(EM_ERR_SHAPE, "%s.load_state_dict: '%s' has shape %s; a step count "
                            "is 0-dim", who, key,
                            em__shape_str(em_tensor_ndim(src), em_tensor_shape(src), sb, sizeof sb));
    double v = NAN;
    if (em_dtype_is_floating(em_tensor_dtype(src)) || em_tensor_dtype(src) == EM_I64 ||
        em_tensor_dtype(src) == EM_I32) {
        em_tensor *c = em__to_device(src, em_cpu());
        em_status st = c ? em_tensor_item(c, &v) : em_last_status();
        em_tensor_release(c);
        if (st != EM_OK) return st;
    }
    if (!(v >= 0 && v <= (double)EM_STEP_MAX && v == floor(v)))
        return em_set_error(EM_ERR_INVALID, "%s.load_state_dict: '%s' is %g (%s); a step count "
                            "is a whole number in [0, %lld]", who, key, v,
                            em_dtype_name(em_tensor_dtype(src)), (long long)EM_STEP_MAX);
    return EM_OK;
}

em_status em__optimizer_load_prepare(const em_optimizer *o, const em_dict *tensors,
                                     const char *groups_json, em__optim_load **out) {
    *out = NULL;
    if (!o || !tensors || !groups_json)
        return em_set_error(EM_ERR_INVALID, "optimizer_load_state_dict: NULL argument");
    const char *who = o->cls->name;
    json_error_t jerr;
    json_t *root = json_loads(groups_json, 0, &jerr);
    em__optim_load *p = NULL;
    em_status st = EM_OK;
    if (!root)
        return em_set_error(EM_ERR_INVALID, "%s.load_state_dict: the groups JSON is malformed "
                            "(line %d column %d: %s)", who, jerr.line, jerr.column, jerr.text);
    const json_t *jcls = json_object_get(root, "class"), *jsteps = json_object_get(root, "steps");
    const json_t *groups = json_object_get(root, "param_groups");
    if (!json_is_string(jcls) || !json_is_integer(jsteps) || !json_is_array(groups)) {
        st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: the groups JSON lacks \"class\", "
                          "\"steps\" or \"param_groups\"", who);
        goto done;
    }
    if (strcmp(json_string_value(jcls), who) != 0) {
        st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: the state dict is from a %s "
                          "optimizer, not %s", who, json_string_value(jcls), who);
        goto done;
    }
    if (json_integer_value(jsteps) < 0 || json_integer_value(jsteps) > EM_STEP_MAX) {
        st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: \"steps\" is %lld; expected an "
                          "integer in [0, %lld]", who, (long long)json_integer_value(jsteps),
                          (long long)EM_STEP_MAX);
        goto done;
    }
    if (json_array_size(groups) != (size_t)o->n_groups) {
        st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: loaded state dict has %zu "
                          "parameter groups, this optimizer has %d", who,
                          json_array_size(groups), o->n_groups);
        goto done;
    }
    if (!(p = em__calloc(1, sizeof *p, "load_state_dict")) ||
        !(p->opts = em__calloc((size_t)o->n_groups, sizeof *p->opts, "load_state_dict")) ||
        !(p->init_lr = em__calloc((size_t)o->n_groups, sizeof *p->init_lr, "load_state_dict")) ||
        !(p->has_init = em__calloc((size_t)o->n_groups, sizeof *p->has_init, "load_state_dict")) ||
        !(p->state = em__calloc((size_t)o->n_params, sizeof *p->state, "load_state_dict"))) {
        st = EM_ERR_NOMEM;
        goto done;
    }
    p->steps = json_integer_value(jsteps);
    for (int g = 0; g < o->n_groups; g++) {
        const json_t *jg = json_array_get(groups, (size_t)g);
        const json_t *ids = json_object_get(jg, "params");
        char where[160];
        snprintf(where, sizeof where, "%s.load_state_dict (param group %d)", who, g);
        if (!json_is_object(jg) || !json_is_array(ids)) {
            st = em_set_error(EM_ERR_INVALID, "%s: the group is not an object with \"params\"",
                              where);
            goto done;
        }
        if (json_array_size(ids) != (size_t)o->groups[g].n) {
            st = em_set_error(EM_ERR_INVALID, "%s: the loaded group has %zu parameters, this "
                              "optimizer's group has %d (a different model?)", where,
                              json_array_size(ids), o->groups[g].n);
            goto done;
        }
        if (!(p->opts[g] = em_options_new())) {
            st = EM_ERR_NOMEM;
            goto done;
        }
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)jg, key, v) {
            if (!strcmp(key, "params") || !strcmp(key, "param_names")) continue;
            if (!strcmp(key, "initial_lr")) {
                if (!json_is_number(v)) {
                    st = em_set_error(EM_ERR_INVALID, "%s: initial_lr is not a number", where);
                    goto done;
                }
                p->has_init[g] = true;
                p->init_lr[g] = json_number_value(v);
                continue;
            }
            if ((st = option_from_json(p->opts[g], key, v, where)) != EM_OK) goto done;
        }
        if ((st = em_options_resolve(p->opts[g], where, o->cls->options, o->cls->n_options)) != EM_OK)
            goto done;
        if (o->cls->validate && (st = o->cls->validate(p->opts[g], where)) != EM_OK) goto done;
    }
    for (size_t i = 0; i < em_dict_len(tensors); i++) {
        const char *key = em_dict_key(tensors, i), *name;
        long idx;
        if (!parse_state_key(key, &idx, &name)) {
            st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: key '%s' is not of the form "
                              "state.<index>.<name>", who, key);
            goto done;
        }
        if (idx < 0 || idx >= o->n_params) {
            st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: key '%s' names parameter %ld "
                              "but the optimizer has %d parameters", who, key, idx, o->n_params);
            goto done;
        }
        const em_tensor *src = em_dict_value(tensors, i), *par = o->params[idx];
        em_dtype sdt = em_tensor_dtype(src), pdt = em_tensor_dtype(par);
        bool step = !strcmp(name, "step");
        if (step) {
            if ((st = check_step_state(who, key, src)) != EM_OK) goto done;
        } else if (em_tensor_ndim(src) != em_tensor_ndim(par) ||
                   memcmp(em_tensor_shape(src), em_tensor_shape(par),
                          sizeof(int64_t) * (size_t)em_tensor_ndim(par)) != 0) {
            /* every state but the step count has its parameter's shape: a 0-dim one would
             * load and fail the first step, far from the file */
            char a[128], b[128];
            st = em_set_error(EM_ERR_SHAPE, "%s.load_state_dict: '%s' has shape %s but "
                              "parameter %ld ('%s') has shape %s", who, key,
                              em__shape_str(em_tensor_ndim(src), em_tensor_shape(src), a, sizeof a),
                              idx, o->names[idx],
                              em__shape_str(em_tensor_ndim(par), em_tensor_shape(par), b, sizeof b));
            goto done;
        } else if (!em_dtype_is_floating(sdt)) {
            st = em_set_error(EM_ERR_DTYPE, "%s.load_state_dict: '%s' has dtype %s; the state of "
                              "parameter %ld ('%s', %s) must be floating", who, key,
                              em_dtype_name(sdt), idx, o->names[idx], em_dtype_name(pdt));
            goto done;
        }
        /* PyTorch's rule: floating state follows the parameter's dtype, except the step
         * count, which keeps its own, and f32 state of an f16/bf16 parameter, which stays f32
         * (the master weights and moments the fused optimizers keep); everything moves to the
         * parameter's device. */
        bool keep = step || (sdt == EM_F32 && (pdt == EM_F16 || pdt == EM_BF16));
        em_tensor *t = em__to_device(src, em_tensor_device(par));
        em_tensor *u = t && !keep ? em__to_dtype(t, pdt) : em_tensor_retain(t);
        em_tensor *c = u ? em__clone(u) : NULL;
        em_tensor_release(t);
        em_tensor_release(u);
        if (!c) {
            st = em_last_status();
            goto done;
        }
        tag_optimizer(c);
        st = state_put(&p->state[idx], name, c);
        em_tensor_release(c);
        if (st != EM_OK) goto done;
    }
    *out = p;
    p = NULL;
done:
    em__optimizer_load_discard(o, p);
    json_decref(root);
    return st;
}

void em__optimizer_load_commit(em_optimizer *o, em__optim_load *p) {
    for (int g = 0; g < o->n_groups; g++) {
        em_options_free(o->groups[g].opts);
        o->groups[g].opts = p->opts[g];
        p->opts[g] = NULL;
        o->groups[g].has_initial_lr = p->has_init[g];
        o->groups[g].initial_lr = p->init_lr[g];
    }
    for (int i = 0; i < o->n_params; i++) {
        state_clear(&o->state[i]);
        o->state[i] = p->state[i];
        memset(&p->state[i], 0, sizeof p->state[i]);
    }
    o->steps = p->steps;
    em__optimizer_load_discard(o, p);
}

em_status em_optimizer_load_state_dict(em_optimizer *o, const em_dict *tensors,
                                       const char *groups_json) {
    em__optim_load *p;
    em_status st = em__optimizer_load_prepare(o, tensors, groups_json, &p);
    if (st == EM_OK) em__optimizer_load_commit(o, p);
    return st;
}

/* ---- gradient clipping ------------------------------------------------------------------------ */

/* The whole clipping runs as ops on the grads' device, with no host read unless the caller
 * asks for the norm as a number (or error_if_nonfinite checks it), so it can be recorded in a
 * graph (em_graph_capture_begin) and replayed: the total norm and the clip coefficient are
 * 0-dim device tensors (PyTorch's clip_grad_norm_ with foreach). The arithmetic is fixed, the
 * same on every device and in a replay: each grad's norm in its dtype (as torch.norm),
 * rounded to float32, then combined in float64 in the params' order (p = 2: the sum of
 * squares, each exact for float32 values, then sqrt; 1: the sum; inf: the NaN-propagating
 * maximum; other p: the sum of pow(|n|, p), then pow(sum, 1/p), with pow itself, not
 * pow_scalar's products for some exponents) and rounded to float32; the coefficient
 * float32(max_norm) / (total + 1e-6) clamped to at most 1 (a NaN stays NaN) in float32, and
 * each grad multiplied by it (float16 / bfloat16 grads in float32, rounded once). */
static em_status clip_norm(const em_dict *params, double max_norm, double norm_type,
                           bool error_if_nonfinite, double *total_norm, em_tensor **total_t) {
    if (total_norm) *total_norm = 0;
    if (total_t) *total_t = NULL;
    if (!params) return em_set_error(EM_ERR_INVALID, "clip_grad_norm_: NULL params");
    if (isnan(max_norm))
        return em_set_error(EM_ERR_INVALID, "clip_grad_norm_: max_norm is NaN");
    if (isnan(norm_type) || norm_type <= 0)
        return em_set_error(EM_ERR_INVALID, "clip_grad_norm_: norm_type %g is not supported (use "
                            "2, 1, any p > 0, or INFINITY)", norm_type);
    em_status st = em_grad_mode_push(EM_GRAD_DISABLED);
    if (st != EM_OK) return st;
    em_scope_begin();
    em_tensor *acc = NULL, *total = NULL;
    em_device dev = em_cpu();
    size_t n_grads = 0;
    for (size_t i = 0; i < em_dict_len(params) && st == EM_OK; i++) {
        em_tensor *g = em_tensor_grad(em_dict_value(params, i));
        if (!g) continue;
        if (!n_grads++) dev = em_tensor_device(g);
        em_tensor *v = em_norm(g, norm_type, 0, NULL, false);
        if (v && em_tensor_dtype(v) != EM_F32) v = em_to_dtype(v, EM_F32);
        if (v && !em_device_equal(em_tensor_device(v), dev)) v = em_to_device(v, dev);
        if (v) v = em_to_dtype(v, EM_F64);
        if (v && norm_type == 2) v = em_mul(v, v);
        else if (v && norm_type != 1 && !isinf(norm_type)) /* pow itself, as the host's */
            v = em_pow(em_abs(v), em_full(0, NULL, norm_type, EM_F64, dev));
        if (v) acc = !acc ? v : isinf(norm_type) ? em_maximum(acc, v) : em_add(acc, v);
        if (!v || !acc)
            st = em_set_error(em_last_status(), "clip_grad_norm_: the norm of the grad of '%s' "
                              "failed: %s", em_dict_key(params, i), em_last_error());
    }
    if (st == EM_OK && acc) {
        total = norm_type == 2 ? em_sqrt(acc)
                : norm_type == 1 || isinf(norm_type) ? acc
                : em_pow(acc, em_full(0, NULL, 1.0 / norm_type, EM_F64, dev));
        if (total) total = em_to_dtype(total, EM_F32);
        if (!total) st = em_last_status();
    }
    double host = NAN;
    if (st == EM_OK && total && (total_norm || error_if_nonfinite))
        st = em_tensor_item(total, &host); /* a host read: never under a capture */
    if (st == EM_OK && total && total_norm) *total_norm = host;
    if (st == EM_OK && total && error_if_nonfinite && !isfinite(host))
        st = em_set_error(EM_ERR_RANGE, "clip_grad_norm_: the total norm of order %g for "
                          "gradients is non-finite (%g), so it cannot be clipped; to scale the "
                          "gradients by the non-finite norm anyway, pass error_if_nonfinite = "
                          "false", norm_type, host);
    em_tensor *coef = NULL;
    if (st == EM_OK && total) {
        double one = 1.0;
        em_tensor *m = em_full(0, NULL, max_norm, EM_F32, dev);
        em_tensor *den = em_add_scalar(total, 1e-6);
        coef = m && den ? em_clamp(em_div(m, den), NULL, &one) : NULL;
        if (!coef) st = em_last_status();
    }
    for (size_t i = 0; coef && i < em_dict_len(params) && st == EM_OK; i++) {
        em_tensor *g = em_tensor_grad(em_dict_value(params, i));
        if (!g) continue;
        em_dtype dt = em_tensor_dtype(g);
        em_tensor *c = em_device_equal(em_tensor_device(g), dev) ? coef
                                                                 : em_to_device(coef, em_tensor_device(g));
        if (c && (dt == EM_F16 || dt == EM_BF16)) {
            em_tensor *w = em_mul(em_to_dtype(g, EM_F32), c);
            st = w ? em_copy_(g, w) : em_last_status();
        } else if (c) {
            if (dt != EM_F32) c = em_to_dtype(c, dt);
            st = c ? em_mul_(g, c) : em_last_status();
        } else {
            st = em_last_status();
        }
    }
    if (st == EM_OK && total && total_t) *total_t = em_tensor_retain(total);
    em_scope_end();
    em_grad_mode_pop();
    return st;
}

em_status em_clip_grad_norm_(const em_dict *params, double max_norm, double norm_type,
                             bool error_if_nonfinite, double *total_norm) {
    return clip_norm(params, max_norm, norm_type, error_if_nonfinite, total_norm, NULL);
}

em_status em_clip_grad_norm_device_(const em_dict *params, double max_norm, double norm_type,
                                    em_tensor **total_norm) {
    if (!total_norm) return em_set_error(EM_ERR_INVALID, "clip_grad_norm_device_: NULL total_norm");
    return clip_norm(params, max_norm, norm_type, false, NULL, total_norm);
}

em_status em_clip_grad_value_(const em_dict *params, double clip) {
    if (!params) return em_set_error(EM_ERR_INVALID, "clip_grad_value_: NULL params");
    if (isnan(clip) || clip < 0)
        return em_set_error(EM_ERR_INVALID, "clip_grad_value_: clip value %g must be >= 0", clip);
    em_status st = em_grad_mode_push(EM_GRAD_DISABLED);
    if (st != EM_OK) return st;
    double lo = -clip, hi = clip;
    for (size_t i = 0; i < em_dict_len(params); i++) {
        em_tensor *g = em_tensor_grad(em_dict_value(params, i));
        if (g && (st = em_clamp_(g, &lo, &hi)) != EM_OK) break;
    }
    em_grad_mode_pop();
    return st;
}

/* ---- schedulers ------------------------------------------------------------------------------- */

struct em_scheduler {
    const em_sched_class *cls;
    em_optimizer *opt;
    em_options *opts;
    void *state;
    int64_t last_epoch, step_count;
    double *base_lrs, *last_lrs; /* [n_groups] */
    int n_groups;
    bool inited;
};

void em_scheduler_free(em_scheduler *s) {
    if (!s) return;
    if (s->inited && s->cls->free) s->cls->free(s);
    em_options_free(s->opts);
    em__free(s->state);
    em__free(s->base_lrs);
    em__free(s->last_lrs);
    em__free(s);
    em__live_dec(EM__LIVE_SCHEDULER);
}

static void record_last_lr(em_scheduler *s) {
    for (int g = 0; g < s->n_groups; g++) s->last_lrs[g] = em_optimizer_lr(s->opt, g);
}

/* One step with grad mode off and a scope around the class's code. */
static em_status sched_run(em_scheduler *s, double metric, bool closed) {
    s->step_count++;
    em_clear_error();
    em_status st = closed && s->cls->closed_form ? s->cls->closed_form(s) : s->cls->step(s, metric);
    if (st != EM_OK && !em__error_pending())
        em_set_error(st, "%s.step failed: %s", s->cls->name, em_status_str(st));
    if (st == EM_OK) record_last_lr(s);
    return st;
}

em_scheduler *em_scheduler_new(const char *class_name, em_optimizer *o, const em_options *opts) {
    if (!class_name || !o)
        return em_set_error(EM_ERR_INVALID, "scheduler_new: NULL class name or optimizer"), NULL;
    const em_sched_class *cls = em__class_find("scheduler", class_name, "scheduler_new");
    if (!cls) return NULL;
    em_scheduler *s = em__calloc(1, sizeof *s, "scheduler");
    if (!s) return NULL;
    em__live_inc(EM__LIVE_SCHEDULER);
    s->cls = cls;
    s->opt = o;
    s->n_groups = o->n_groups;
    s->last_epoch = -1;
    if (!(s->opts = opts ? em_options_copy(opts) : em_options_new()) ||
        !(s->base_lrs = em__calloc((size_t)s->n_groups, sizeof(double), "scheduler lrs")) ||
        !(s->last_lrs = em__calloc((size_t)s->n_groups, sizeof(double), "scheduler lrs")) ||
        (cls->state_size && !(s->state = em__calloc(1, cls->state_size, "scheduler state"))))
        goto fail;
    if (em_options_resolve(s->opts, cls->name, cls->options, cls->n_options) != EM_OK) goto fail;
    /* PyTorch: group.setdefault('initial_lr', group['lr']); base_lrs = initial_lr. */
    for (int g = 0; g < s->n_groups; g++) {
        opt_group *G = &o->groups[g];
        if (!G->has_initial_lr) {
            G->initial_lr = em_options_float(G->opts, "lr");
            G->has_initial_lr = true;
        }
        s->base_lrs[g] = G->initial_lr;
    }
    s->inited = true; /* free runs even when init fails half-way */
    if (cls->init && cls->init(s, s->opts) != EM_OK) goto fail;
    if (em_scheduler_initial_step(s) != EM_OK) goto fail;
    return s;
fail:
    em_scheduler_free(s);
    return NULL;
}

em_status em_scheduler_initial_step(em_scheduler *s) {
    if (!s) return em_set_error(EM_ERR_INVALID, "scheduler_initial_step: NULL scheduler");
    s->step_count = 0;
    return em_scheduler_step(s, NAN);
}

em_status em_scheduler_step(em_scheduler *s, double metric) {
    if (!s) return em_set_error(EM_ERR_INVALID, "scheduler_step: NULL scheduler");
    s->last_epoch++;
    em_status st = sched_run(s, metric, false);
    if (st != EM_OK) s->last_epoch--;
    return st;
}

em_status em_scheduler_step_epoch(em_scheduler *s, int64_t epoch) {
    if (!s) return em_set_error(EM_ERR_INVALID, "scheduler_step_epoch: NULL scheduler");
    int64_t before = s->last_epoch;
    s->last_epoch = epoch;
    em_status st = sched_run(s, NAN, true);
    if (st != EM_OK) s->last_epoch = before;
    return st;
}

void em_scheduler_set_last_epoch(em_scheduler *s, int64_t epoch) {
    if (s) s->last_epoch = epoch;
}

double em_scheduler_last_lr(const em_scheduler *s, int g) {
    if (!s || g < 0 || g >= s->n_groups) {
        em_set_error(EM_ERR_RANGE, "scheduler_last_lr: group %d is out of range (%d groups)", g,
                     s ? s->n_groups : 0);
        return NAN;
    }
    return s->last_lrs[g];
}

double em_scheduler_base_lr(const em_scheduler *s, int g) {
    if (!s || g < 0 || g >= s->n_groups) {
        em_set_error(EM_ERR_RANGE, "scheduler_base_lr: group %d is out of range (%d groups)", g,
                     s ? s->n_groups : 0);
        return NAN;
    }
    return s->base_lrs[g];
}

em_status em_scheduler_set_base_lr(em_scheduler *s, int g, double lr) {
    if (!s || g < 0 || g >= s->n_groups)
        return em_set_error(EM_ERR_RANGE, "scheduler_set_base_lr: group %d is out of range (%d "
                            "groups)", g, s ? s->n_groups : 0);
    s->base_lrs[g] = lr;
    s->opt->groups[g].initial_lr = lr;
    s->opt->groups[g].has_initial_lr = true;
    return EM_OK;
}

const em_sched_class *em_scheduler_class(const em_scheduler *s) { return s ? s->cls : NULL; }
em_optimizer *em_scheduler_optimizer(const em_scheduler *s) { return s ? s->opt : NULL; }
const em_options *em_scheduler_options(const em_scheduler *s) { return s ? s->opts : NULL; }
void *em_scheduler_state(em_scheduler *s) { return s ? s->state : NULL; }
int64_t em_scheduler_last_epoch(const em_scheduler *s) { return s ? s->last_epoch : 0; }
int64_t em_scheduler_step_count(const em_scheduler *s) { return s ? s->step_count : 0; }

static json_t *doubles_json(const double *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

em_status em_scheduler_state_dict(const em_scheduler *s, char **json) {
    if (!s || !json) return em_set_error(EM_ERR_INVALID, "scheduler_state_dict: NULL argument");
    *json = NULL;
    json_t *root = json_object();
    if (!root) return em_set_error(EM_ERR_NOMEM, "scheduler_state_dict: out of memory");
    json_object_set_new(root, "class", json_string(s->cls->name));
    json_object_set_new(root, "last_epoch", json_integer(s->last_epoch));
    json_object_set_new(root, "step_count", json_integer(s->step_count));
    json_object_set_new(root, "base_lrs", doubles_json(s->base_lrs, s->n_groups));
    json_object_set_new(root, "last_lr", doubles_json(s->last_lrs, s->n_groups));
    json_t *state = json_null();
    if (s->cls->save) {
        char *text = NULL;
        if (s->cls->save(s, &text) != EM_OK) {
            json_decref(root);
            return em_last_status();
        }
        json_error_t jerr;
        state = json_loads(text, 0, &jerr);
        em_host_free(text);
        if (!state) {
            json_decref(root);
            return em_set_error(EM_ERR_INVALID, "%s.state_dict: the class saved malformed JSON "
                                "(%s)", s->cls->name, jerr.text);
        }
    }
    json_object_set_new(root, "state", state);
    *json = json_text(root);
    json_decref(root);
    return *json ? EM_OK : em_last_status();
}

/* n doubles from a JSON array into out; false when it is not that. */
static bool json_doubles(const json_t *a, double *out, int n) {
    if (!json_is_array(a) || (int)json_array_size(a) != n) return false;
    for (int i = 0; i < n; i++) {
        const json_t *e = json_array_get(a, (size_t)i);
        if (!json_is_number(e)) return false;
        out[i] = json_number_value(e);
    }
    return true;
}

/* A loaded scheduler state, checked, with the class's state already loaded and the state it
 * replaced kept to put back (em__scheduler_load_discard). */
struct em__sched_load {
    int64_t last_epoch, step_count;
    double *base, *last; /* [n_groups] */
    char *backup;        /* the class's state before (em_host_free), or NULL */
    bool class_loaded;
};

void em__scheduler_load_discard(em_scheduler *s, em__sched_load *p) {
    if (!p) return;
    if (p->class_loaded && p->backup) {
        /* what the class's own save wrote: it loads back (out of memory aside) */
        em_status st = s->cls->load(s, p->backup);
        (void)st;
    }
    em_host_free(p->backup);
    em__free(p->base);
    em__free(p->last);
    em__free(p);
}

em_status em__scheduler_load_prepare(em_scheduler *s, const char *json, em__sched_load **out) {
    *out = NULL;
    if (!s || !json)
        return em_set_error(EM_ERR_INVALID, "scheduler_load_state_dict: NULL argument");
    const char *who = s->cls->name;
    json_error_t jerr;
    json_t *root = json_loads(json, 0, &jerr);
    if (!root)
        return em_set_error(EM_ERR_INVALID, "%s.load_state_dict: malformed JSON (line %d column "
                            "%d: %s)", who, jerr.line, jerr.column, jerr.text);
    em_status st = EM_OK;
    em__sched_load *p = em__calloc(1, sizeof *p, "scheduler state");
    if (p) p->base = em__calloc((size_t)s->n_groups, sizeof(double), "scheduler lrs");
    if (p && p->base) p->last = em__calloc((size_t)s->n_groups, sizeof(double), "scheduler lrs");
    const json_t *jc = json_object_get(root, "class"), *je = json_object_get(root, "last_epoch");
    const json_t *js = json_object_get(root, "step_count"), *jst = json_object_get(root, "state");
    if (!p || !p->last) {
        st = EM_ERR_NOMEM;
    } else if (!json_is_string(jc) || strcmp(json_string_value(jc), who) != 0) {
        st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: the state is from a %s scheduler",
                          who, json_is_string(jc) ? json_string_value(jc) : "(unnamed)");
    } else if (!json_is_integer(je) || !json_is_integer(js)) {
        st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: \"last_epoch\" or \"step_count\" "
                          "is missing or not an integer", who);
    } else if (json_integer_value(je) < -1 || json_integer_value(je) > EM_STEP_MAX ||
               json_integer_value(js) < 0 || json_integer_value(js) > EM_STEP_MAX) {
        /* stepping adds 1 to both: a count near INT64_MAX would overflow */
        st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: \"last_epoch\" %lld or "
                          "\"step_count\" %lld is out of range (last_epoch in [-1, %lld], "
                          "step_count in [0, %lld])", who, (long long)json_integer_value(je),
                          (long long)json_integer_value(js), (long long)EM_STEP_MAX,
                          (long long)EM_STEP_MAX);
    } else if (!json_doubles(json_object_get(root, "base_lrs"), p->base, s->n_groups) ||
               !json_doubles(json_object_get(root, "last_lr"), p->last, s->n_groups)) {
        st = em_set_error(EM_ERR_INVALID, "%s.load_state_dict: \"base_lrs\" and \"last_lr\" must "
                          "be arrays of %d numbers (one per param group)", who, s->n_groups);
    } else if (s->cls->load && jst && !json_is_null(jst)) {
        /* the class loads its own state; what it had is kept to put back if a later part of
         * a checkpoint fails (or this load fails half-way: SequentialLR's sub-schedulers) */
        if (s->cls->save && (st = s->cls->save(s, &p->backup)) != EM_OK) p->backup = NULL;
        char *text = st == EM_OK ? json_text((json_t *)jst) : NULL;
        if (st == EM_OK) {
            p->class_loaded = true;
            st = text ? s->cls->load(s, text) : em_last_status();
        }
        em__free(text);
    }
    if (st == EM_OK) {
        p->last_epoch = json_integer_value(je);
        p->step_count = json_integer_value(js);
        *out = p;
        p = NULL;
    } else if (p) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em__scheduler_load_discard(s, p);
        em_set_error(st, "%s", msg);
    }
    json_decref(root);
    return st;
}

void em__scheduler_load_commit(em_scheduler *s, em__sched_load *p) {
    s->last_epoch = p->last_epoch;
    s->step_count = p->step_count;
    memcpy(s->base_lrs, p->base, sizeof(double) * (size_t)s->n_groups);
    memcpy(s->last_lrs, p->last, sizeof(double) * (size_t)s->n_groups);
    p->class_loaded = false; /* keep what was loaded */
    em__scheduler_load_discard(s, p);
}

em_status em_scheduler_load_state_dict(em_scheduler *s, const char *json) {
    em__sched_load *p;
    em_status st = em__scheduler_load_prepare(s, json, &p);
    if (st == EM_OK) em__scheduler_load_commit(s, p);
    return st;
}
