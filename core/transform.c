/*
 * transform.c — the "transform" class kind (ember/transform.h): the kind's checks, the item's
 * random stream, and the per-field pipelines the DataLoader applies to each item (the specs
 * naming a field, in their order, each with its resolved options, layout and state), plus the
 * translation of the 1.0 em_transforms struct into specs.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ember/data.h"
#include "ember/error.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/random.h"
#include "ember/transform.h"
#include "data_internal.h"
#include "transform_internal.h"

/* ---- the kind --------------------------------------------------------------------------- */

em_status em__transform_class_check(const void *record, const char *who) {
    const em_transform_class *c = record;
    if (!em__class_name_ok(c->name))
        return em_set_error(EM_ERR_INVALID, "%s: transform class name '%s' is not "
                            "[a-z][a-z0-9_-]*", who, c->name ? c->name : "(null)");
    if (!c->layout || !c->apply)
        return em_set_error(EM_ERR_INVALID, "%s: transform class '%s' lacks %s function", who,
                            c->name, !c->layout ? "a layout" : "an apply");
    return em__option_table_check(who, c->name, c->options, c->n_options);
}

em_status em_transform_class_register(em_registry *reg, const em_transform_class *cls) {
    return em__class_register(reg, EM_TRANSFORM_KIND, cls, "transform_class_register");
}

const em_transform_class *em_transform_class_find(const char *name) {
    return em__class_find(EM_TRANSFORM_KIND, name, NULL);
}

int64_t em_transform_layout_numel(const em_transform_layout *l) {
    return l ? em__numel(l->ndim, l->shape) : 0;
}

/* ---- the item's stream ------------------------------------------------------------------ */

void em__transform_rng_init(em_transform_rng *r, uint64_t seed, int64_t epoch, int64_t item) {
    r->seed = seed;
    r->epoch = epoch;
    r->item = item;
    r->next = 0;
}

uint32_t em_transform_rng_next(em_transform_rng *r) {
    if (!r) return 0;
    uint32_t k = r->next++;
    if (k % 4 == 0) {
        uint32_t b = k / 4;
        uint32_t stream = b == 0 ? EM__DATA_STREAM_TRANSFORM : 0x59000000u + b - 1;
        uint32_t ctr[4] = {(uint32_t)r->item, (uint32_t)((uint64_t)r->item >> 32),
                           (uint32_t)r->epoch, stream};
        uint32_t key[2] = {(uint32_t)r->seed,
                           (uint32_t)(r->seed >> 32) ^ (uint32_t)((uint64_t)r->epoch >> 32)};
        em_philox4x32_10(ctr, key, r->words);
    }
    return r->words[k % 4];
}

uint64_t em_transform_rng_below(em_transform_rng *r, uint64_t n) {
    return em__data_below(em_transform_rng_next(r), n);
}

/* ---- pipelines -------------------------------------------------------------------------- */

typedef struct stage {
    const em_transform_class *cls; /* the core's copy (valid while the class is registered) */
    em_options *opts;              /* resolved copy */
    void *state;
    em_transform_layout in, out;
} stage;

struct em__transform_pipeline {
    char field[64];
    int n;
    stage *st;
    size_t scratch;                /* bytes of each of the two intermediate buffers */
};

static const char *spec_field(const em_transform_spec *s) {
    return s->field ? s->field : "input";
}

/* Read spec i by the prefix rule (through options). */
static em_status spec_read(const char *who, const em_transform_spec *specs, int i,
                           em_transform_spec *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    char what[64];
    snprintf(what, sizeof what, "transform_specs[%d]", i);
    return em__struct_read(out, sizeof *out, &specs[i],
                           EM__SIZE_THROUGH(em_transform_spec, options), who, what);
}

em_status em__transform_pipeline_new(const char *who, const char *field,
                                     const em_transform_layout *in,
                                     const em_transform_spec *specs, int n,
                                     em__transform_pipeline **out) {
    *out = NULL;
    if (n < 0 || (n > 0 && !specs))
        return em_set_error(EM_ERR_INVALID, "%s: %d transform specs without an array", who, n);
    int count = 0;
    for (int i = 0; i < n; i++) {
        em_transform_spec s;
        em_status st = spec_read(who, specs, i, &s);
        if (st != EM_OK) return st;
        if (strcmp(spec_field(&s), field) == 0) count++;
    }
    if (count == 0) return EM_OK;
    em__transform_pipeline *p = em__calloc(1, sizeof *p, "transform pipeline");
    if (!p) return EM_ERR_NOMEM;
    snprintf(p->field, sizeof p->field, "%s", field);
    p->st = em__calloc((size_t)count, sizeof *p->st, "transform pipeline");
    if (!p->st) {
        em__free(p);
        return EM_ERR_NOMEM;
    }
    em_transform_layout cur = *in;
    cur.struct_size = sizeof cur;
    em_status st = EM_OK;
    char shape[96];
    for (int i = 0; i < n && st == EM_OK; i++) {
        em_transform_spec s;
        spec_read(who, specs, i, &s);
        if (strcmp(spec_field(&s), field) != 0) continue;
        stage *g = &p->st[p->n];
        if (!s.name || !*s.name) {
            st = em_set_error(EM_ERR_INVALID, "%s: transform_specs[%d] on field '%s' names no "
                              "transform class", who, i, field);
            break;
        }
        g->cls = em__class_find(EM_TRANSFORM_KIND, s.name, NULL);
        if (!g->cls) {
            st = em_set_error(EM_ERR_NOTFOUND, "%s: field '%s', transform_specs[%d]: %s", who,
                              field, i, em_last_error());
            break;
        }
        g->opts = s.options ? em_options_copy(s.options) : em_options_new();
        if (!g->opts) {
            st = EM_ERR_NOMEM;
            break;
        }
        p->n++;
        char owner[160];
        snprintf(owner, sizeof owner, "transform '%s' on field '%s'", s.name, field);
        st = em_options_resolve(g->opts, owner, g->cls->options, g->cls->n_options);
        if (st != EM_OK) {
            st = em_set_error(st, "%s: %s", who, em_last_error());
            break;
        }
        g->in = cur;
        g->out = cur;
        em_clear_error();
        st = g->cls->layout(g->opts, field, &g->in, &g->out);
        g->out.struct_size = sizeof g->out;
        if (st == EM_OK && (g->out.ndim < 0 || g->out.ndim > EM_MAX_DIMS - 1 ||
                            em_dtype_size(g->out.dtype) == 0))
            st = em_set_error(EM_ERR_INTERNAL, "transform '%s' on field '%s' gave a bad layout "
                              "(%d dims of dtype %d)", s.name, field, g->out.ndim,
                              (int)g->out.dtype);
        for (int d = 0; st == EM_OK && d < g->out.ndim; d++)
            if (g->out.shape[d] < 0)
                st = em_set_error(EM_ERR_INTERNAL, "transform '%s' on field '%s' gave the "
                                  "negative shape %s", s.name, field,
                                  em__shape_str(g->out.ndim, g->out.shape, shape, sizeof shape));
        if (st != EM_OK) {
            if (!em__error_pending())
                em_set_error(st, "transform '%s' refused field '%s' of shape %s", s.name, field,
                             em__shape_str(cur.ndim, cur.shape, shape, sizeof shape));
            st = em_set_error(st, "%s: %s", who, em_last_error());
            break;
        }
        if (g->cls->init) {
            st = g->cls->init(g->opts, &g->in, &g->out, &g->state);
            if (st != EM_OK) {
                if (!em__error_pending())
                    em_set_error(st, "transform '%s' on field '%s': init failed", s.name, field);
                st = em_set_error(st, "%s: %s", who, em_last_error());
                break;
            }
        }
        cur = g->out;
        if (p->n < count) {
            size_t b = (size_t)em__numel(cur.ndim, cur.shape) * em_dtype_size(cur.dtype);
            p->scratch = EM_MAX(p->scratch, b);
        }
    }
    if (st != EM_OK) {
        em__transform_pipeline_free(p);
        return st;
    }
    *out = p;
    return EM_OK;
}

const em_transform_layout *em__transform_pipeline_layout(const em__transform_pipeline *p) {
    return &p->st[p->n - 1].out;
}

size_t em__transform_pipeline_scratch(const em__transform_pipeline *p) {
    return p->n > 2 ? 2 * p->scratch : p->scratch;
}

em_status em__transform_pipeline_apply(const em__transform_pipeline *p, const void *src,
                                       void *dst, void *scratch, uint64_t seed, int64_t epoch,
                                       int64_t item) {
    em_transform_rng r;
    em__transform_rng_init(&r, seed, epoch, item);
    const void *from = src;
    for (int i = 0; i < p->n; i++) {
        const stage *g = &p->st[i];
        /* Stages alternate between the two halves of the scratch; the last writes dst. */
        void *to = i == p->n - 1 ? dst : (char *)scratch + (size_t)(i % 2) * p->scratch;
        em_status st = g->cls->apply(g->state, &g->in, from, &g->out, to, &r);
        if (st != EM_OK) {
            if (!em__error_pending())
                em_set_error(st, "transform '%s' failed", g->cls->name);
            return em_set_error(st, "item %lld, field '%s', transform '%s': %s",
                                (long long)item, p->field, g->cls->name, em_last_error());
        }
        from = to;
    }
    return EM_OK;
}

void em__transform_pipeline_free(em__transform_pipeline *p) {
    if (!p) return;
    for (int i = 0; i < p->n; i++) {
        if (p->st[i].cls->free && p->st[i].state) p->st[i].cls->free(p->st[i].state);
        em_options_free(p->st[i].opts);
    }
    em__free(p->st);
    em__free(p);
}

em_status em_transform_specs_layout(const em_transform_spec *specs, int n, const char *field,
                                    const em_transform_layout *in, em_transform_layout *out) {
    if (!in || !out)
        return em_set_error(EM_ERR_INVALID, "transform_specs_layout: NULL layout");
    em__transform_pipeline *p;
    em_status st = em__transform_pipeline_new("transform_specs_layout", field ? field : "input",
                                              in, specs, n, &p);
    if (st != EM_OK) return st;
    *out = p ? *em__transform_pipeline_layout(p) : *in;
    out->struct_size = sizeof *out;
    em__transform_pipeline_free(p);
    return EM_OK;
}

/* ---- the 1.0 struct --------------------------------------------------------------------- */

em_status em__transforms_to_specs(const em_transforms *t, em_dtype in_dtype,
                                  em_transform_spec specs[EM__LEGACY_TRANSFORMS],
                                  em_options *opts[EM__LEGACY_TRANSFORMS], int *n) {
    *n = 0;
    for (int i = 0; i < EM__LEGACY_TRANSFORMS; i++) opts[i] = NULL;
    bool normalize = t->mean != NULL;
    bool tofloat = t->to_float || normalize;
    /* Float to float at scale 1 with nothing else: nothing to do (as in 1.0). */
    if (tofloat && in_dtype == EM_F32 && !normalize && t->crop_padding == 0 && !t->hflip &&
        (t->scale == 0 || t->scale == 1))
        return EM_OK;
    if (normalize && t->n_channels > EM_OPT_MAX_LIST)
        return em_set_error(EM_ERR_INVALID, "loader: normalize takes at most %d channels "
                            "(n_channels is %d)", EM_OPT_MAX_LIST, t->n_channels);
    struct { bool on; const char *name; } want[EM__LEGACY_TRANSFORMS] = {
        /* a flip without a crop still gets random_crop (padding 0: a copy) so that the flip
         * draws word 2 of the item's stream, as it did in 1.0 */
        {t->crop_padding > 0 || t->hflip, "random_crop"}, {t->hflip, "hflip"},
        {tofloat, "to_float"}, {normalize, "normalize"}};
    em_status st = EM_OK;
    for (int i = 0; i < EM__LEGACY_TRANSFORMS && st == EM_OK; i++) {
        if (!want[i].on) continue;
        em_options *o = opts[*n] = em_options_new();
        if (!o) {
            st = EM_ERR_NOMEM;
            break;
        }
        specs[*n] = (em_transform_spec){.struct_size = sizeof specs[0], .field = "input",
                                        .name = want[i].name, .options = o};
        (*n)++;
        if (i == 0) {
            st = em_options_set_int(o, "padding", t->crop_padding);
        } else if (i == 2) {
            if (t->scale != 0) st = em_options_set_float(o, "scale", t->scale);
        } else if (i == 3) {
            double m[EM_OPT_MAX_LIST], s[EM_OPT_MAX_LIST];
            for (int c = 0; c < t->n_channels; c++) m[c] = t->mean[c], s[c] = t->std[c];
            st = em_options_set_floats(o, "mean", t->n_channels, m);
            if (st == EM_OK) st = em_options_set_floats(o, "std", t->n_channels, s);
        }
    }
    if (st != EM_OK) {
        for (int i = 0; i < *n; i++) em_options_free(opts[i]), opts[i] = NULL;
        *n = 0;
    }
    return st;
}
