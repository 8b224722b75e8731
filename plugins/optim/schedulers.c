/*
 * schedulers.c — learning-rate schedulers, step for step as PyTorch 1.13's
 * torch/optim/lr_scheduler.py: the chainable (recursive) forms that step() uses, reading the
 * group's current lr, in double precision like Python's floats, and the closed forms that
 * step(epoch) uses (SequentialLR calls it at a milestone).
 *
 * Interval (how the classes are meant to be stepped, as in PyTorch's documentation):
 *   StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, SequentialLR and
 *   ReduceLROnPlateau are stepped once per epoch ("epoch"; CosineAnnealingLR and LinearLR may
 *   be stepped per batch with T_max / total_iters counted in batches); OneCycleLR is stepped
 *   once per batch ("step"), total_steps times at most.
 *
 * SequentialLR takes its sub-schedulers as text, the way a config file writes them:
 *     schedulers = "LinearLR(start_factor=0.1, total_iters=5), CosineAnnealingLR(T_max=95)"
 *     milestones = [5]
 * Each entry is a class name with its options in parentheses (key=value, values as in a
 * config file: numbers, true/false, strings, [lists]); the sub-schedulers are created on the
 * same optimizer, in order, exactly as PyTorch users construct them before SequentialLR.
 */
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/optim.h"
#include "ember/options.h"
#include "optim_plugin.h"

#define BELOW_ONE 0.99999999999999989
#define N_OPTS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static int ngroups(em_scheduler *s) { return em_optimizer_group_count(em_scheduler_optimizer(s)); }
static double lr_of(em_scheduler *s, int g) { return em_optimizer_lr(em_scheduler_optimizer(s), g); }
static em_status set_lr(em_scheduler *s, int g, double lr) {
    return em_optimizer_set_lr(em_scheduler_optimizer(s), g, lr);
}
/* Multiply every group's lr by f. */
static em_status scale_all(em_scheduler *s, double f) {
    for (int g = 0; g < ngroups(s); g++) {
        em_status st = set_lr(s, g, lr_of(s, g) * f);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

/* A FLOAT or FLOATS option as one value per group (a single value repeats). */
static em_status per_group(em_scheduler *s, const em_options *o, const char *name, double *out) {
    int n = ngroups(s);
    if (em_options_type(o, name) == EM_OPT_FLOATS) {
        double v[EM_OPT_MAX_LIST];
        int k = em_options_floats(o, name, v, EM_OPT_MAX_LIST);
        if (k != n)
            return em_set_error(EM_ERR_INVALID, "%s: expected %d values for %s (one per param "
                                "group), got %d", em_scheduler_class(s)->name, n, name, k);
        memcpy(out, v, sizeof(double) * (size_t)n);
        return EM_OK;
    }
    for (int g = 0; g < n; g++) out[g] = em_options_float(o, name);
    return EM_OK;
}

/* ---- StepLR ---------------------------------------------------------------------------------- */

static em_status steplr_step(em_scheduler *s, double metric) {
    (void)metric;
    const em_options *o = em_scheduler_options(s);
    int64_t e = em_scheduler_last_epoch(s), k = em_options_int(o, "step_size");
    if (e == 0 || e % k != 0) return EM_OK;
    return scale_all(s, em_options_float(o, "gamma"));
}

static em_status steplr_closed(em_scheduler *s) {
    const em_options *o = em_scheduler_options(s);
    int64_t e = em_scheduler_last_epoch(s), k = em_options_int(o, "step_size");
    int64_t q = e >= 0 ? e / k : -((-e + k - 1) / k); /* Python's floor division */
    for (int g = 0; g < ngroups(s); g++) {
        em_status st = set_lr(s, g, em_scheduler_base_lr(s, g) *
                                        pow(em_options_float(o, "gamma"), (double)q));
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static const em_option_spec steplr_options[] = {
    {.name = "step_size", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1e15, .help = "period of learning rate decay, in epochs"},
    {.name = "gamma", .types = EM_OPT_FLOAT, .def = {.f = 0.1},
     .help = "multiplicative factor of learning rate decay"},
};

/* ---- MultiStepLR ------------------------------------------------------------------------------ */

static em_status multistep_init(em_scheduler *s, const em_options *o) {
    int64_t m[EM_OPT_MAX_LIST];
    int n = em_options_ints(o, "milestones", m, EM_OPT_MAX_LIST);
    for (int i = 1; i < n; i++)
        if (m[i] < m[i - 1])
            return em_set_error(EM_ERR_INVALID, "%s: milestones must be increasing (%lld after "
                                "%lld)", em_scheduler_class(s)->name, (long long)m[i],
                                (long long)m[i - 1]);
    return EM_OK;
}

static em_status multistep_step(em_scheduler *s, double metric) {
    (void)metric;
    const em_options *o = em_scheduler_options(s);
    int64_t m[EM_OPT_MAX_LIST], e = em_scheduler_last_epoch(s);
    int n = em_options_ints(o, "milestones", m, EM_OPT_MAX_LIST), count = 0;
    for (int i = 0; i < n; i++) count += m[i] == e;
    if (count == 0) return EM_OK;
    return scale_all(s, pow(em_options_float(o, "gamma"), count));
}

static em_status multistep_closed(em_scheduler *s) {
    const em_options *o = em_scheduler_options(s);
    int64_t m[EM_OPT_MAX_LIST], e = em_scheduler_last_epoch(s);
    int n = em_options_ints(o, "milestones", m, EM_OPT_MAX_LIST), below = 0;
    for (int i = 0; i < n; i++) below += m[i] <= e; /* bisect_right on the sorted list */
    for (int g = 0; g < ngroups(s); g++) {
        em_status st = set_lr(s, g, em_scheduler_base_lr(s, g) *
                                        pow(em_options_float(o, "gamma"), below));
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static const em_option_spec multistep_options[] = {
    {.name = "milestones", .types = EM_OPT_INTS, .required = true, .has_range = true, .min = 0,
     .max = 1e15, .help = "epochs at which the lr is multiplied by gamma (increasing, up to 8)"},
    {.name = "gamma", .types = EM_OPT_FLOAT, .def = {.f = 0.1},
     .help = "multiplicative factor of learning rate decay"},
};

/* ---- ExponentialLR ---------------------------------------------------------------------------- */

static em_status explr_step(em_scheduler *s, double metric) {
    (void)metric;
    if (em_scheduler_last_epoch(s) == 0) return EM_OK;
    return scale_all(s, em_options_float(em_scheduler_options(s), "gamma"));
}

static em_status explr_closed(em_scheduler *s) {
    double gamma = em_options_float(em_scheduler_options(s), "gamma");
    for (int g = 0; g < ngroups(s); g++) {
        em_status st = set_lr(s, g, em_scheduler_base_lr(s, g) *
                                        pow(gamma, (double)em_scheduler_last_epoch(s)));
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static const em_option_spec explr_options[] = {
    {.name = "gamma", .types = EM_OPT_FLOAT, .required = true,
     .help = "multiplicative factor of learning rate decay, every epoch"},
};

/* ---- CosineAnnealingLR ------------------------------------------------------------------------ */

static em_status cosine_step(em_scheduler *s, double metric) {
    (void)metric;
    const em_options *o = em_scheduler_options(s);
    double T = (double)em_options_int(o, "T_max"), eta_min = em_options_float(o, "eta_min");
    int64_t e = em_scheduler_last_epoch(s);
    if (e == 0) return EM_OK;
    for (int g = 0; g < ngroups(s); g++) {
        double base = em_scheduler_base_lr(s, g), lr = lr_of(s, g), v;
        int64_t Ti = em_options_int(o, "T_max");
        if (em_scheduler_step_count(s) == 1 && e > 0) {
            v = eta_min + (base - eta_min) * (1 + cos((double)e * M_PI / T)) / 2;
        } else if (((e - 1 - Ti) % (2 * Ti) + 2 * Ti) % (2 * Ti) == 0) {
            v = lr + (base - eta_min) * (1 - cos(M_PI / T)) / 2;
        } else {
            v = (1 + cos(M_PI * (double)e / T)) / (1 + cos(M_PI * (double)(e - 1) / T)) *
                    (lr - eta_min) + eta_min;
        }
        em_status st = set_lr(s, g, v);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static em_status cosine_closed(em_scheduler *s) {
    const em_options *o = em_scheduler_options(s);
    double T = (double)em_options_int(o, "T_max"), eta_min = em_options_float(o, "eta_min");
    double e = (double)em_scheduler_last_epoch(s);
    for (int g = 0; g < ngroups(s); g++) {
        double base = em_scheduler_base_lr(s, g);
        em_status st = set_lr(s, g, eta_min + (base - eta_min) * (1 + cos(M_PI * e / T)) / 2);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static const em_option_spec cosine_options[] = {
    {.name = "T_max", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1e15, .help = "maximum number of iterations (half a cosine period)"},
    {.name = "eta_min", .types = EM_OPT_FLOAT, .def = {.f = 0}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "minimum learning rate"},
};

/* ---- LinearLR --------------------------------------------------------------------------------- */

static em_status linear_init(em_scheduler *s, const em_options *o) {
    if (em_options_float(o, "start_factor") <= 0)
        return em_set_error(EM_ERR_INVALID, "%s: start_factor must be in (0, 1], got %g",
                            em_scheduler_class(s)->name, em_options_float(o, "start_factor"));
    return EM_OK;
}

static em_status linear_step(em_scheduler *s, double metric) {
    (void)metric;
    const em_options *o = em_scheduler_options(s);
    double sf = em_options_float(o, "start_factor"), ef = em_options_float(o, "end_factor");
    int64_t T = em_options_int(o, "total_iters"), e = em_scheduler_last_epoch(s);
    if (e == 0) return scale_all(s, sf);
    if (e > T) return EM_OK;
    return scale_all(s, 1. + (ef - sf) / ((double)T * sf + (double)(e - 1) * (ef - sf)));
}

static em_status linear_closed(em_scheduler *s) {
    const em_options *o = em_scheduler_options(s);
    double sf = em_options_float(o, "start_factor"), ef = em_options_float(o, "end_factor");
    int64_t T = em_options_int(o, "total_iters"), e = em_scheduler_last_epoch(s);
    double f = T == 0 ? ef : sf + (ef - sf) * (double)(e < T ? e : T) / (double)T;
    for (int g = 0; g < ngroups(s); g++) {
        em_status st = set_lr(s, g, em_scheduler_base_lr(s, g) * f);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static const em_option_spec linear_options[] = {
    {.name = "start_factor", .types = EM_OPT_FLOAT, .def = {.f = 1.0 / 3}, .has_range = true,
     .min = 0, .max = 1, .help = "factor of the lr in the first epoch, in (0, 1]"},
    {.name = "end_factor", .types = EM_OPT_FLOAT, .def = {.f = 1.0}, .has_range = true,
     .min = 0, .max = 1, .help = "factor of the lr at the end, in [0, 1]"},
    {.name = "total_iters", .types = EM_OPT_INT, .def = {.i = 5}, .has_range = true, .min = 0,
     .max = 1e15, .help = "epochs over which the factor moves from start to end"},
};

/* ---- SequentialLR ----------------------------------------------------------------------------- */

typedef struct seq_state {
    em_scheduler **subs;
    int n;
} seq_state;

static const char *skip_space(const char *p) {
    while (isspace((unsigned char)*p)) p++;
    return p;
}

/* Parse one "Name(key=value, ...)" at *pp into a new scheduler on s's optimizer. */
static em_scheduler *parse_sub(em_scheduler *s, const char **pp, int index) {
    const char *p = skip_space(*pp), *start = p;
    char name[128], where[96];
    snprintf(where, sizeof where, "SequentialLR schedulers[%d]", index);
    while (isalnum((unsigned char)*p) || *p == '_' || *p == '.') p++;
    size_t len = (size_t)(p - start);
    if (len == 0 || len >= sizeof name) {
        em_set_error(EM_ERR_INVALID, "%s: expected a scheduler class name at '%.40s'", where, start);
        return NULL;
    }
    memcpy(name, start, len);
    name[len] = '\0';
    em_options *o = em_options_new();
    if (!o) return NULL;
    p = skip_space(p);
    if (*p == '(') {
        p++;
        for (;;) {
            p = skip_space(p);
            if (*p == ')') {
                p++;
                break;
            }
            const char *k = p;
            while (isalnum((unsigned char)*p) || *p == '_') p++;
            size_t klen = (size_t)(p - k);
            p = skip_space(p);
            if (klen == 0 || klen >= 64 || *p != '=') {
                em_set_error(EM_ERR_INVALID, "%s (%s): expected key=value at '%.40s'", where, name, k);
                em_options_free(o);
                return NULL;
            }
            char key[64], val[256];
            memcpy(key, k, klen);
            key[klen] = '\0';
            const char *v = skip_space(p + 1);
            int depth = 0;
            p = v;
            while (*p && (depth > 0 || (*p != ',' && *p != ')'))) {
                if (*p == '[' || *p == '(') depth++;
                if (*p == ']' || *p == ')') depth--;
                p++;
            }
            size_t vlen = (size_t)(p - v);
            while (vlen && isspace((unsigned char)v[vlen - 1])) vlen--;
            if (!*p || vlen == 0 || vlen >= sizeof val) {
                em_set_error(EM_ERR_INVALID, "%s (%s): option '%s' has %s", where, name, key,
                             !*p ? "no closing ')'" : vlen ? "a value too long" : "no value");
                em_options_free(o);
                return NULL;
            }
            memcpy(val, v, vlen);
            val[vlen] = '\0';
            if (em_options_set_text(o, key, val, where) != EM_OK) {
                em_options_free(o);
                return NULL;
            }
            if (*p == ',') p++;
        }
    }
    *pp = p;
    em_scheduler *sub = em_scheduler_new(name, em_scheduler_optimizer(s), o);
    em_options_free(o);
    if (!sub) {
        char msg[768];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_set_error(em_last_status(), "%s: %s", where, msg);
    }
    return sub;
}

static void seq_free(em_scheduler *s) {
    seq_state *st = em_scheduler_state(s);
    for (int i = 0; i < st->n; i++) em_scheduler_free(st->subs[i]);
    free(st->subs);
    st->subs = NULL;
    st->n = 0;
}

static em_status seq_init(em_scheduler *s, const em_options *o) {
    seq_state *st = em_scheduler_state(s);
    const char *p = em_options_string(o, "schedulers");
    int64_t m[EM_OPT_MAX_LIST];
    int nm = em_options_ints(o, "milestones", m, EM_OPT_MAX_LIST);
    while (*(p = skip_space(p))) {
        em_scheduler **grown = realloc(st->subs, sizeof *grown * (size_t)(st->n + 1));
        if (!grown) return em_set_error(EM_ERR_NOMEM, "SequentialLR: out of memory");
        st->subs = grown;
        if (!(st->subs[st->n] = parse_sub(s, &p, st->n))) return em_last_status();
        st->n++;
        p = skip_space(p);
        if (*p == ',' || *p == ';') p++;
        else if (*p)
            return em_set_error(EM_ERR_INVALID, "SequentialLR: expected ',' between schedulers "
                                "at '%.40s'", p);
    }
    if (st->n == 0)
        return em_set_error(EM_ERR_INVALID, "SequentialLR: option 'schedulers' names no scheduler");
    if (nm != st->n - 1)
        return em_set_error(EM_ERR_INVALID, "SequentialLR: expects the number of schedulers to "
                            "be one more than the number of milestones, but got %d schedulers "
                            "and %d milestones", st->n, nm);
    for (int i = 1; i < nm; i++)
        if (m[i] <= m[i - 1])
            return em_set_error(EM_ERR_INVALID, "SequentialLR: milestones must be increasing "
                                "(%lld after %lld)", (long long)m[i], (long long)m[i - 1]);
    return EM_OK;
}

static em_status seq_step(em_scheduler *s, double metric) {
    (void)metric;
    seq_state *st = em_scheduler_state(s);
    int64_t e = em_scheduler_last_epoch(s), m[EM_OPT_MAX_LIST];
    int nm = em_options_ints(em_scheduler_options(s), "milestones", m, EM_OPT_MAX_LIST);
    if (e == 0) {
        /* PyTorch's constructor: reset the lrs to initial_lr, undo the sub-schedulers'
         * initial steps, and redo the first one's. */
        for (int g = 0; g < ngroups(s); g++) {
            em_status r = set_lr(s, g, em_scheduler_base_lr(s, g));
            if (r != EM_OK) return r;
        }
        for (int i = 0; i < st->n; i++)
            em_scheduler_set_last_epoch(st->subs[i], em_scheduler_last_epoch(st->subs[i]) - 1);
        return em_scheduler_initial_step(st->subs[0]);
    }
    int idx = 0;
    while (idx < nm && m[idx] <= e) idx++; /* bisect_right */
    if (idx > 0 && m[idx - 1] == e) return em_scheduler_step_epoch(st->subs[idx], 0);
    return em_scheduler_step(st->subs[idx], NAN);
}

static em_status seq_save(const em_scheduler *s, char **json) {
    const seq_state *st = em_scheduler_state((em_scheduler *)s);
    json_t *root = json_object(), *arr = json_array();
    if (!root || !arr) {
        json_decref(root), json_decref(arr);
        return em_set_error(EM_ERR_NOMEM, "SequentialLR.state_dict: out of memory");
    }
    json_object_set_new(root, "schedulers", arr);
    for (int i = 0; i < st->n; i++) {
        char *sub = NULL;
        if (em_scheduler_state_dict(st->subs[i], &sub) != EM_OK) {
            json_decref(root);
            return em_last_status();
        }
        json_array_append_new(arr, json_loads(sub, 0, NULL));
        em_host_free(sub);
    }
    char *text = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(root);
    size_t n = text ? strlen(text) + 1 : 0;
    *json = text ? em_host_alloc(n, 16) : NULL;
    if (*json) memcpy(*json, text, n);
    free(text);
    return *json ? EM_OK : em_set_error(EM_ERR_NOMEM, "SequentialLR.state_dict: out of memory");
}

static em_status seq_load(em_scheduler *s, const char *json) {
    seq_state *st = em_scheduler_state(s);
    json_t *root = json_loads(json, 0, NULL);
    const json_t *arr = json_object_get(root, "schedulers");
    em_status r = EM_OK;
    if (!json_is_array(arr) || (int)json_array_size(arr) != st->n) {
        r = em_set_error(EM_ERR_INVALID, "SequentialLR.load_state_dict: expected the states of "
                         "%d sub-schedulers", st->n);
    }
    for (int i = 0; r == EM_OK && i < st->n; i++) {
        char *sub = json_dumps(json_array_get(arr, (size_t)i), JSON_COMPACT | JSON_REAL_PRECISION(17));
        r = sub ? em_scheduler_load_state_dict(st->subs[i], sub)
                : em_set_error(EM_ERR_NOMEM, "SequentialLR.load_state_dict: out of memory");
        free(sub);
    }
    json_decref(root);
    return r;
}

static const em_option_spec seq_options[] = {
    {.name = "schedulers", .types = EM_OPT_STRING, .required = true,
     .help = "sub-schedulers in order, e.g. \"LinearLR(start_factor=0.1, total_iters=5), "
             "CosineAnnealingLR(T_max=95)\""},
    {.name = "milestones", .types = EM_OPT_INTS, .required = true, .has_range = true, .min = 1,
     .max = 1e15, .help = "epochs at which the next sub-scheduler takes over (one fewer than "
                          "the schedulers)"},
};

/* ---- OneCycleLR ------------------------------------------------------------------------------- */

typedef struct onecycle_state {
    double *initial, *max_lr, *min_lr, *max_mom, *base_mom; /* [groups] each, one block */
    int64_t total;
    int n_phases;
    struct {
        double end_step;
        int start_lr, end_lr, start_mom, end_mom; /* 0 initial, 1 max, 2 min; 0 max_mom, 1 base */
    } phases[3];
    bool cycle_momentum, use_beta1, linear;
} onecycle_state;

static void onecycle_free(em_scheduler *s) {
    onecycle_state *st = em_scheduler_state(s);
    free(st->initial);
    st->initial = NULL;
}

/* Set the group's momentum (SGD, RMSprop) or beta1 (Adam, AdamW). */
static em_status set_momentum(em_scheduler *s, int g, bool beta1, double m) {
    em_options *go = em_optimizer_group_options_mutable(em_scheduler_optimizer(s), g);
    if (!go) return em_last_status();
    if (!beta1) return em_options_set_float(go, "momentum", m);
    double b[EM_OPT_MAX_LIST];
    int n = em_options_floats(go, "betas", b, EM_OPT_MAX_LIST);
    b[0] = m;
    return em_options_set_floats(go, "betas", n, b);
}

static em_status onecycle_init(em_scheduler *s, const em_options *o) {
    onecycle_state *st = em_scheduler_state(s);
    const char *who = "OneCycleLR";
    int n = ngroups(s);
    int64_t total = em_options_int(o, "total_steps"), epochs = em_options_int(o, "epochs");
    int64_t spe = em_options_int(o, "steps_per_epoch");
    if (total == 0 && (epochs == 0 || spe == 0))
        return em_set_error(EM_ERR_INVALID, "%s: define either total_steps or (epochs and "
                            "steps_per_epoch)", who);
    st->total = total ? total : epochs * spe;
    double pct = em_options_float(o, "pct_start"), T = (double)st->total;
    if (em_options_bool(o, "three_phase")) {
        st->n_phases = 3;
        st->phases[0].end_step = pct * T - 1;
        st->phases[0].start_lr = 0, st->phases[0].end_lr = 1;
        st->phases[0].start_mom = 0, st->phases[0].end_mom = 1;
        st->phases[1].end_step = 2 * pct * T - 2;
        st->phases[1].start_lr = 1, st->phases[1].end_lr = 0;
        st->phases[1].start_mom = 1, st->phases[1].end_mom = 0;
        st->phases[2].end_step = T - 1;
        st->phases[2].start_lr = 0, st->phases[2].end_lr = 2;
        st->phases[2].start_mom = 0, st->phases[2].end_mom = 0;
    } else {
        st->n_phases = 2;
        st->phases[0].end_step = pct * T - 1;
        st->phases[0].start_lr = 0, st->phases[0].end_lr = 1;
        st->phases[0].start_mom = 0, st->phases[0].end_mom = 1;
        st->phases[1].end_step = T - 1;
        st->phases[1].start_lr = 1, st->phases[1].end_lr = 2;
        st->phases[1].start_mom = 1, st->phases[1].end_mom = 0;
    }
    st->linear = strcmp(em_options_string(o, "anneal_strategy"), "linear") == 0;
    if (!(st->initial = calloc((size_t)n * 5, sizeof(double))))
        return em_set_error(EM_ERR_NOMEM, "%s: out of memory", who);
    st->max_lr = st->initial + n, st->min_lr = st->initial + 2 * n;
    st->max_mom = st->initial + 3 * n, st->base_mom = st->initial + 4 * n;
    em_status r;
    if ((r = per_group(s, o, "max_lr", st->max_lr)) != EM_OK) return r;
    double div = em_options_float(o, "div_factor"), fdiv = em_options_float(o, "final_div_factor");
    for (int g = 0; g < n; g++) {
        st->initial[g] = st->max_lr[g] / div;
        st->min_lr[g] = st->initial[g] / fdiv;
        if ((r = em_scheduler_set_base_lr(s, g, st->initial[g])) != EM_OK) return r;
    }
    st->cycle_momentum = em_options_bool(o, "cycle_momentum");
    if (st->cycle_momentum) {
        const em_options *g0 = em_optimizer_group_options(em_scheduler_optimizer(s), 0);
        if (!em_options_has(g0, "momentum") && !em_options_has(g0, "betas"))
            return em_set_error(EM_ERR_INVALID, "%s: the optimizer (%s) has no momentum or betas "
                                "option; set cycle_momentum false", who,
                                em_optimizer_class(em_scheduler_optimizer(s))->name);
        st->use_beta1 = em_options_has(g0, "betas");
        if ((r = per_group(s, o, "max_momentum", st->max_mom)) != EM_OK ||
            (r = per_group(s, o, "base_momentum", st->base_mom)) != EM_OK)
            return r;
        for (int g = 0; g < n; g++)
            if ((r = set_momentum(s, g, st->use_beta1, st->max_mom[g])) != EM_OK) return r;
    }
    return EM_OK;
}

static double anneal(bool linear, double start, double end, double pct) {
    if (linear) return (end - start) * pct + start;
    return end + (start - end) / 2.0 * (cos(M_PI * pct) + 1);
}

static em_status onecycle_step(em_scheduler *s, double metric) {
    (void)metric;
    onecycle_state *st = em_scheduler_state(s);
    int64_t step = em_scheduler_last_epoch(s);
    if (step > st->total)
        return em_set_error(EM_ERR_RANGE, "OneCycleLR: tried to step %lld times; the specified "
                            "number of total steps is %lld", (long long)step + 1,
                            (long long)st->total);
    for (int g = 0; g < ngroups(s); g++) {
        double lrs[3] = {st->initial[g], st->max_lr[g], st->min_lr[g]};
        double moms[2] = {st->max_mom[g], st->base_mom[g]};
        double start = 0, lr = 0, mom = 0;
        for (int i = 0; i < st->n_phases; i++) {
            double end = st->phases[i].end_step;
            if ((double)step <= end || i == st->n_phases - 1) {
                double pct = ((double)step - start) / (end - start);
                lr = anneal(st->linear, lrs[st->phases[i].start_lr], lrs[st->phases[i].end_lr], pct);
                mom = anneal(st->linear, moms[st->phases[i].start_mom],
                             moms[st->phases[i].end_mom], pct);
                break;
            }
            start = end;
        }
        em_status r = set_lr(s, g, lr);
        if (r == EM_OK && st->cycle_momentum) r = set_momentum(s, g, st->use_beta1, mom);
        if (r != EM_OK) return r;
    }
    return EM_OK;
}

static const char *const anneal_choices[] = {"cos", "linear", NULL};

static const em_option_spec onecycle_options[] = {
    {.name = "max_lr", .types = EM_OPT_FLOAT | EM_OPT_FLOATS, .required = true, .has_range = true,
     .min = 0, .max = INFINITY, .help = "peak learning rate (one value, or one per group)"},
    {.name = "total_steps", .types = EM_OPT_INT, .def = {.i = 0}, .has_range = true, .min = 0,
     .max = 1e15, .help = "steps in the cycle (0: epochs * steps_per_epoch)"},
    {.name = "epochs", .types = EM_OPT_INT, .def = {.i = 0}, .has_range = true, .min = 0,
     .max = 1e15, .help = "epochs (with steps_per_epoch, when total_steps is 0)"},
    {.name = "steps_per_epoch", .types = EM_OPT_INT, .def = {.i = 0}, .has_range = true,
     .min = 0, .max = 1e15, .help = "steps per epoch (with epochs)"},
    {.name = "pct_start", .types = EM_OPT_FLOAT, .def = {.f = 0.3}, .has_range = true, .min = 0,
     .max = 1, .help = "fraction of the cycle spent increasing the lr"},
    {.name = "anneal_strategy", .types = EM_OPT_STRING, .def = {.s = "cos"},
     .choices = anneal_choices, .help = "cos or linear annealing"},
    {.name = "cycle_momentum", .types = EM_OPT_BOOL, .def = {.b = true},
     .help = "cycle momentum (or Adam's beta1) inversely to the lr"},
    {.name = "base_momentum", .types = EM_OPT_FLOAT | EM_OPT_FLOATS, .def = {.f = 0.85},
     .help = "lowest momentum in the cycle"},
    {.name = "max_momentum", .types = EM_OPT_FLOAT | EM_OPT_FLOATS, .def = {.f = 0.95},
     .help = "highest momentum in the cycle"},
    {.name = "div_factor", .types = EM_OPT_FLOAT, .def = {.f = 25}, .has_range = true,
     .min = 1e-300, .max = INFINITY, .help = "initial lr = max_lr / div_factor"},
    {.name = "final_div_factor", .types = EM_OPT_FLOAT, .def = {.f = 1e4}, .has_range = true,
     .min = 1e-300, .max = INFINITY, .help = "min lr = initial lr / final_div_factor"},
    {.name = "three_phase", .types = EM_OPT_BOOL, .def = {.b = false},
     .help = "a third phase annihilates the lr down to min lr"},
};

/* ---- ReduceLROnPlateau ------------------------------------------------------------------------ */

typedef struct plateau_state {
    double best;
    int64_t num_bad_epochs, cooldown_counter;
    double *min_lrs;
    bool max_mode, abs_mode;
} plateau_state;

static void plateau_free(em_scheduler *s) {
    plateau_state *st = em_scheduler_state(s);
    free(st->min_lrs);
    st->min_lrs = NULL;
}

static em_status plateau_init(em_scheduler *s, const em_options *o) {
    plateau_state *st = em_scheduler_state(s);
    st->max_mode = strcmp(em_options_string(o, "mode"), "max") == 0;
    st->abs_mode = strcmp(em_options_string(o, "threshold_mode"), "abs") == 0;
    st->best = st->max_mode ? -INFINITY : INFINITY;
    if (!(st->min_lrs = calloc((size_t)ngroups(s), sizeof(double))))
        return em_set_error(EM_ERR_NOMEM, "ReduceLROnPlateau: out of memory");
    return per_group(s, o, "min_lr", st->min_lrs);
}

static bool is_better(const plateau_state *st, double threshold, double a) {
    if (!st->max_mode && !st->abs_mode) return a < st->best * (1. - threshold);
    if (!st->max_mode) return a < st->best - threshold;
    if (!st->abs_mode) return a > st->best * (threshold + 1.);
    return a > st->best + threshold;
}

static em_status plateau_step(em_scheduler *s, double metric) {
    plateau_state *st = em_scheduler_state(s);
    const em_options *o = em_scheduler_options(s);
    if (em_scheduler_last_epoch(s) == 0) return EM_OK; /* created: PyTorch takes no step */
    if (is_better(st, em_options_float(o, "threshold"), metric)) {
        st->best = metric;
        st->num_bad_epochs = 0;
    } else {
        st->num_bad_epochs++;
    }
    if (st->cooldown_counter > 0) {
        st->cooldown_counter--;
        st->num_bad_epochs = 0;
    }
    if (st->num_bad_epochs > em_options_int(o, "patience")) {
        double factor = em_options_float(o, "factor"), eps = em_options_float(o, "eps");
        for (int g = 0; g < ngroups(s); g++) {
            double old = lr_of(s, g), nw = fmax(old * factor, st->min_lrs[g]);
            if (old - nw > eps) {
                em_status r = set_lr(s, g, nw);
                if (r != EM_OK) return r;
            }
        }
        st->cooldown_counter = em_options_int(o, "cooldown");
        st->num_bad_epochs = 0;
    }
    return EM_OK;
}

static em_status plateau_save(const em_scheduler *s, char **json) {
    const plateau_state *st = em_scheduler_state((em_scheduler *)s);
    char buf[160];
    if (isinf(st->best))
        snprintf(buf, sizeof buf, "{\"best\":null,\"num_bad_epochs\":%lld,\"cooldown_counter\":%lld}",
                 (long long)st->num_bad_epochs, (long long)st->cooldown_counter);
    else
        snprintf(buf, sizeof buf, "{\"best\":%.17g,\"num_bad_epochs\":%lld,\"cooldown_counter\":%lld}",
                 st->best, (long long)st->num_bad_epochs, (long long)st->cooldown_counter);
    size_t n = strlen(buf) + 1;
    if (!(*json = em_host_alloc(n, 16))) return em_last_status();
    memcpy(*json, buf, n);
    return EM_OK;
}

static em_status plateau_load(em_scheduler *s, const char *json) {
    plateau_state *st = em_scheduler_state(s);
    json_t *root = json_loads(json, 0, NULL);
    const json_t *b = json_object_get(root, "best"), *nb = json_object_get(root, "num_bad_epochs");
    const json_t *cc = json_object_get(root, "cooldown_counter");
    em_status r = EM_OK;
    if (!json_is_integer(nb) || !json_is_integer(cc) || !(json_is_null(b) || json_is_number(b)))
        r = em_set_error(EM_ERR_INVALID, "ReduceLROnPlateau.load_state_dict: expected best, "
                         "num_bad_epochs and cooldown_counter");
    else if (json_integer_value(nb) < 0 || json_integer_value(nb) > EM_STEP_MAX ||
             json_integer_value(cc) < 0 || json_integer_value(cc) > EM_STEP_MAX)
        /* each step counts them on by one: near INT64_MAX (or MIN) they would overflow */
        r = em_set_error(EM_ERR_INVALID, "ReduceLROnPlateau.load_state_dict: num_bad_epochs %lld "
                         "or cooldown_counter %lld is out of range [0, %lld]",
                         (long long)json_integer_value(nb), (long long)json_integer_value(cc),
                         (long long)EM_STEP_MAX);
    else {
        st->best = json_is_null(b) ? (st->max_mode ? -INFINITY : INFINITY) : json_number_value(b);
        st->num_bad_epochs = json_integer_value(nb);
        st->cooldown_counter = json_integer_value(cc);
    }
    json_decref(root);
    return r;
}

static const char *const mode_choices[] = {"min", "max", NULL};
static const char *const tmode_choices[] = {"rel", "abs", NULL};

static const em_option_spec plateau_options[] = {
    {.name = "mode", .types = EM_OPT_STRING, .def = {.s = "min"}, .choices = mode_choices,
     .help = "min: reduce when the metric stops decreasing; max: stops increasing"},
    {.name = "factor", .types = EM_OPT_FLOAT, .def = {.f = 0.1}, .has_range = true, .min = 0,
     .max = BELOW_ONE, .help = "new lr = lr * factor (must be < 1)"},
    {.name = "patience", .types = EM_OPT_INT, .def = {.i = 10}, .has_range = true, .min = 0,
     .max = 1e15, .help = "epochs without improvement before the lr is reduced"},
    {.name = "threshold", .types = EM_OPT_FLOAT, .def = {.f = 1e-4}, .has_range = true,
     .min = 0, .max = INFINITY, .help = "the least change that counts as an improvement"},
    {.name = "threshold_mode", .types = EM_OPT_STRING, .def = {.s = "rel"},
     .choices = tmode_choices, .help = "rel: relative to the best; abs: absolute"},
    {.name = "cooldown", .types = EM_OPT_INT, .def = {.i = 0}, .has_range = true, .min = 0,
     .max = 1e15, .help = "epochs to wait after a reduction before counting again"},
    {.name = "min_lr", .types = EM_OPT_FLOAT | EM_OPT_FLOATS, .def = {.f = 0}, .has_range = true,
     .min = 0, .max = INFINITY, .help = "lower bound on the lr (one value, or one per group)"},
    {.name = "eps", .types = EM_OPT_FLOAT, .def = {.f = 1e-8}, .has_range = true, .min = 0,
     .max = INFINITY, .help = "reductions smaller than this are skipped"},
};

/* ---- registration ------------------------------------------------------------------------------ */

#define SCHED(nm, desc, opts, iv, ...)                                                            \
    {.struct_size = sizeof(em_sched_class), .name = nm, .description = desc, .options = opts,   \
     .n_options = N_OPTS(opts), .interval = iv, __VA_ARGS__}

static const em_sched_class classes[] = {
    SCHED("StepLR", "lr * gamma every step_size epochs", steplr_options, "epoch",
          .step = steplr_step, .closed_form = steplr_closed),
    SCHED("MultiStepLR", "lr * gamma at each milestone epoch", multistep_options, "epoch",
          .init = multistep_init, .step = multistep_step, .closed_form = multistep_closed),
    SCHED("ExponentialLR", "lr * gamma every epoch", explr_options, "epoch",
          .step = explr_step, .closed_form = explr_closed),
    SCHED("CosineAnnealingLR", "cosine annealing from the base lr to eta_min over T_max",
          cosine_options, "epoch", .step = cosine_step, .closed_form = cosine_closed),
    SCHED("LinearLR", "lr factor moving linearly from start_factor to end_factor",
          linear_options, "epoch", .init = linear_init, .step = linear_step,
          .closed_form = linear_closed),
    SCHED("SequentialLR", "sub-schedulers one after another, switching at milestones",
          seq_options, "epoch", .state_size = sizeof(seq_state), .init = seq_init,
          .step = seq_step, .free = seq_free, .save = seq_save, .load = seq_load),
    SCHED("OneCycleLR", "the 1cycle policy (lr up then down, momentum the other way)",
          onecycle_options, "step", .state_size = sizeof(onecycle_state), .init = onecycle_init,
          .step = onecycle_step, .free = onecycle_free),
    SCHED("ReduceLROnPlateau", "lr * factor when a metric stops improving", plateau_options,
          "epoch", .state_size = sizeof(plateau_state), .init = plateau_init,
          .step = plateau_step, .free = plateau_free, .save = plateau_save, .load = plateau_load),
};

em_status optim_plugin_register_schedulers(em_registry *reg) {
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        em_status st = em_sched_class_register(reg, &classes[i]);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}
