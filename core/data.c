/*
 * data.c — datasets: the registry of dataset classes (with typed, validated options), the
 * em_dataset handle every loader reads through, the in-memory datasets a program makes
 * without a plugin (over tensors, over a callback), subsets and random_split.
 *
 * Dataset classes are the "dataset" kind of the core's one class registry (plugin.c): entries
 * remember the registry that added them, so unloading a plugin withdraws its classes. This
 * file holds the kind's own checks.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ember/data.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/tensor.h"
#include "data_internal.h"

/* ---- the "dataset" kind of plugin.c's class registry ---------------------------------------- */

bool em__class_name_ok(const char *s) {
    if (!s || !(*s >= 'a' && *s <= 'z')) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
            return false;
    return true;
}

/* A spec's default must pass the spec's own checks (type, range, choices): resolve a bag
 * holding just the default against that one spec. */
static em_status check_default(const char *who, const char *cls, const em_option_spec *sp) {
    if (sp->required) return EM_OK;
    unsigned t = sp->def_type ? sp->def_type : (sp->types & (~sp->types + 1u));
    if (!(t & sp->types) || (t & (t - 1u)))
        return em_set_error(EM_ERR_INVALID, "%s: class '%s': the default of option '%s' has a "
                            "type the option does not allow", who, cls, sp->name);
    em_options *o = em_options_new();
    if (!o) return EM_ERR_NOMEM;
    em_status st;
    switch (t) {
    case EM_OPT_INT: st = em_options_set_int(o, sp->name, sp->def.i); break;
    case EM_OPT_FLOAT: st = em_options_set_float(o, sp->name, sp->def.f); break;
    case EM_OPT_BOOL: st = em_options_set_bool(o, sp->name, sp->def.b); break;
    case EM_OPT_STRING: st = em_options_set_string(o, sp->name, sp->def.s ? sp->def.s : ""); break;
    case EM_OPT_INTS: st = em_options_set_ints(o, sp->name, sp->def.n, sp->def.ints); break;
    case EM_OPT_FLOATS: st = em_options_set_floats(o, sp->name, sp->def.n, sp->def.floats); break;
    default: st = em_set_error(EM_ERR_INVALID, "unknown type bits %#x", t); break;
    }
    if (st == EM_OK) st = em_options_resolve(o, cls, sp, 1);
    em_options_free(o);
    if (st != EM_OK && st != EM_ERR_NOMEM)
        st = em_set_error(EM_ERR_INVALID, "%s: the default of an option is invalid: %s", who,
                          em_last_error());
    return st;
}

em_status em__dataset_class_check(const void *record, const char *who) {
    const em_dataset_class_def *def = record;
    if (!em__class_name_ok(def->name))
        return em_set_error(EM_ERR_INVALID, "%s: name '%s' is not [a-z][a-z0-9_-]*", who,
                            def->name ? def->name : "(null)");
    if (!def->open || !def->read)
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' lacks an %s function", who,
                            def->name, !def->open ? "open" : "read");
    return em__option_table_check(who, def->name, def->options, def->n_options);
}

em_status em__option_table_check(const char *who, const char *cls, const em_option_spec *opts,
                                 int n) {
    if (n < 0 || (n > 0 && !opts))
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' declares %d options without a table",
                            who, cls, n);
    for (int i = 0; i < n; i++) {
        const em_option_spec *sp = &opts[i];
        if (!sp->name || !*sp->name || !sp->types)
            return em_set_error(EM_ERR_INVALID, "%s: class '%s': option %d has no name or no "
                                "types", who, cls, i);
        for (int j = 0; j < i; j++)
            if (strcmp(opts[j].name, sp->name) == 0)
                return em_set_error(EM_ERR_INVALID, "%s: class '%s' declares option '%s' twice",
                                    who, cls, sp->name);
        em_status st = check_default(who, cls, sp);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

em_status em_dataset_class_register(em_registry *reg, const em_dataset_class_def *def) {
    return em__class_register(reg, "dataset", def, "dataset_class_register");
}

em_status em_dataset_class_unregister(em_registry *reg, const char *name) {
    return em_class_unregister(reg, "dataset", name);
}

size_t em_dataset_class_count(void) { return em_class_count("dataset"); }

const char *em_dataset_class_name(size_t i) {
    const em_dataset_class_def *d = em_class_get("dataset", i);
    return d ? d->name : NULL;
}

size_t em_registry_dataset_count(const em_registry *reg) {
    return em_registry_class_count(reg, "dataset");
}

const char *em_registry_dataset_name(const em_registry *reg, size_t i) {
    return em_registry_class_name(reg, "dataset", i);
}

const em_dataset_class_def *em_dataset_class_find(const char *name) {
    return em__class_find("dataset", name, NULL);
}

/* ---- datasets ----------------------------------------------------------------------------- */

size_t em__data_item_bytes(int ndim, const int64_t *shape, em_dtype dt) {
    return (size_t)em__numel(ndim, shape) * em_dtype_size(dt);
}

/* Check what a class's open (or a program) said about its items. */
static em_status info_check(const char *who, const em_dataset_info *in) {
    char s[96];
    if (in->length < 0)
        return em_set_error(EM_ERR_INTERNAL, "dataset '%s': negative length %lld", who,
                            (long long)in->length);
    if (in->input_ndim < 0 || in->input_ndim > EM_MAX_DIMS - 1 || in->target_ndim < 0 ||
        in->target_ndim > EM_MAX_DIMS - 1)
        return em_set_error(EM_ERR_INVALID, "dataset '%s': item inputs have %d dims and "
                            "targets %d (each must be in [0, %d])", who, in->input_ndim,
                            in->target_ndim, EM_MAX_DIMS - 1);
    for (int d = 0; d < in->input_ndim; d++)
        if (in->input_shape[d] <= 0)
            return em_set_error(EM_ERR_SHAPE, "dataset '%s': item input shape %s has a "
                                "non-positive size", who,
                                em__shape_str(in->input_ndim, in->input_shape, s, sizeof s));
    if (!em_dtype_is_valid(in->input_dtype))
        return em_set_error(EM_ERR_DTYPE, "dataset '%s': invalid input dtype %d", who,
                            (int)in->input_dtype);
    if (in->target_dtype == EM_I64) {
        if (in->target_ndim != 0 || in->num_classes <= 0)
            return em_set_error(EM_ERR_INVALID, "dataset '%s': class-label targets are one "
                                "int64 per item with num_classes > 0 (got %d dims, %lld "
                                "classes)", who, in->target_ndim, (long long)in->num_classes);
    } else if (in->target_dtype == EM_F32) {
        if (in->target_ndim != 1 || in->target_shape[0] <= 0)
            return em_set_error(EM_ERR_INVALID, "dataset '%s': regression targets are (k) "
                                "float32 per item, k >= 1 (got %s)", who,
                                em__shape_str(in->target_ndim, in->target_shape, s, sizeof s));
    } else {
        return em_set_error(EM_ERR_DTYPE, "dataset '%s': targets must be int64 labels or "
                            "float32 values, not %s", who, em_dtype_name(in->target_dtype));
    }
    return EM_OK;
}

/* A new dataset handle (refcount 1) over state with the given functions. */
static em_dataset *dataset_new(const char *name, const em_dataset_info *info,
                               em_status (*read)(void *, const int64_t *, int64_t, void *, void *),
                               void (*close)(void *), void *state) {
    if (info_check(name, info) != EM_OK) return NULL;
    em_dataset *ds = em__calloc(1, sizeof *ds, "dataset");
    if (!ds) return NULL;
    if (!(ds->name = em__strdup(name, "dataset name"))) {
        em__free(ds);
        return NULL;
    }
    em__live_inc(EM__LIVE_DATASET);
    atomic_init(&ds->refcount, 1);
    ds->info = *info;
    ds->info.struct_size = sizeof ds->info;
    ds->info.ext = NULL;
    ds->read = read;
    ds->close = close;
    ds->state = state;
    ds->input_bytes = em__data_item_bytes(info->input_ndim, info->input_shape, info->input_dtype);
    ds->target_bytes = em__data_item_bytes(info->target_ndim, info->target_shape,
                                           info->target_dtype);
    return ds;
}

em_dataset *em_dataset_open(const char *name, const em_options *opts) {
    const em_dataset_class_def *def = em_dataset_class_find(name);
    if (!def) return NULL;
    em_options *o = opts ? em_options_copy(opts) : em_options_new();
    if (!o) return NULL;
    char owner[128]; /* errors read "dataset 'csv': unknown option 'delimeter' ..." */
    snprintf(owner, sizeof owner, "dataset '%s'", def->name);
    if (em_options_resolve(o, owner, def->options, def->n_options) != EM_OK) {
        em_options_free(o);
        return NULL;
    }
    em_dataset_info info = {.struct_size = sizeof info};
    void *state = NULL;
    em_status st = def->open(o, &info, &state);
    if (st != EM_OK) {
        em_options_free(o);
        if (!em__error_pending())
            em_set_error(st, "dataset '%s': open failed without saying why", name);
        return NULL;
    }
    if (info.length == 0) {
        /* Training on it would run no step and report success. */
        bool has_path = em_options_type(o, "path") == EM_OPT_STRING;
        em_set_error(EM_ERR_FORMAT, "dataset '%s'%s%s%s holds no items (an empty file or "
                     "split?)", name, has_path ? " (path '" : "",
                     has_path ? em_options_string(o, "path") : "", has_path ? "')" : "");
        em_options_free(o);
        if (def->close) def->close(state);
        return NULL;
    }
    em_options_free(o);
    em_dataset *ds = dataset_new(name, &info, def->read, def->close, state);
    if (!ds && def->close) def->close(state);
    return ds;
}

const em_dataset_info *em_dataset_get_info(const em_dataset *ds) { return &ds->info; }
int64_t em_dataset_length(const em_dataset *ds) { return ds->info.length; }
const char *em_dataset_name(const em_dataset *ds) { return ds->name; }

em_status em_dataset_read(em_dataset *ds, const int64_t *indices, int64_t n, void *inputs,
                          void *targets) {
    if (!ds || (n > 0 && (!indices || !inputs || !targets)))
        return em_set_error(EM_ERR_INVALID, "dataset_read: NULL dataset or buffer");
    for (int64_t j = 0; j < n; j++)
        if (indices[j] < 0 || indices[j] >= ds->info.length)
            return em_set_error(EM_ERR_RANGE, "dataset '%s': item index %lld is out of range "
                                "(length %lld)", ds->name, (long long)indices[j],
                                (long long)ds->info.length);
    if (n <= 0) return EM_OK;
    em_status st = ds->read(ds->state, indices, n, inputs, targets);
    if (st != EM_OK && !em__error_pending())
        em_set_error(st, "dataset '%s': read of %lld items failed without saying why", ds->name,
                     (long long)n);
    return st;
}

void em_dataset_free(em_dataset *ds) {
    if (!ds || atomic_fetch_sub(&ds->refcount, 1) != 1) return;
    if (ds->close) ds->close(ds->state);
    em__free(ds->name);
    em__free(ds);
    em__live_dec(EM__LIVE_DATASET);
}

/* ---- tensor datasets ---------------------------------------------------------------------- */

typedef struct tensors_state {
    em_tensor *inputs, *targets; /* contiguous CPU tensors, owned references */
    size_t ib, tb;
} tensors_state;

static em_status tensors_read(void *state, const int64_t *idx, int64_t n, void *in, void *tg) {
    const tensors_state *s = state;
    const char *pi = em_tensor_data(s->inputs), *pt = em_tensor_data(s->targets);
    for (int64_t j = 0; j < n; j++) {
        memcpy((char *)in + (size_t)j * s->ib, pi + (size_t)idx[j] * s->ib, s->ib);
        memcpy((char *)tg + (size_t)j * s->tb, pt + (size_t)idx[j] * s->tb, s->tb);
    }
    return EM_OK;
}

static void tensors_close(void *state) {
    tensors_state *s = state;
    if (!s) return;
    em_tensor_release(s->inputs);
    em_tensor_release(s->targets);
    em__free(s);
}

em_dataset *em_dataset_from_tensors(em_tensor *inputs, em_tensor *targets, int64_t num_classes) {
    if (!inputs || !targets) {
        if (!em__error_pending())
            em_set_error(EM_ERR_INVALID, "dataset_from_tensors: NULL inputs or targets");
        return NULL;
    }
    char a[96], b[96];
    int ni = em_tensor_ndim(inputs), nt = em_tensor_ndim(targets);
    const int64_t *si = em_tensor_shape(inputs), *stt = em_tensor_shape(targets);
    if (em_tensor_device(inputs).type != EM_DEVICE_CPU_TYPE ||
        em_tensor_device(targets).type != EM_DEVICE_CPU_TYPE) {
        em_set_error(EM_ERR_DEVICE, "dataset_from_tensors: inputs and targets must be CPU "
                     "tensors (the loader moves batches to the device)");
        return NULL;
    }
    if (ni < 1 || nt < 1 || nt > 2 || si[0] != stt[0]) {
        em_set_error(EM_ERR_SHAPE, "dataset_from_tensors: inputs %s and targets %s must share "
                     "their first dim (N, ...) and (N) or (N, k)",
                     em__shape_str(ni, si, a, sizeof a), em__shape_str(nt, stt, b, sizeof b));
        return NULL;
    }
    em_dtype tdt = em_tensor_dtype(targets);
    bool labels = em_dtype_is_integral(tdt) || tdt == EM_BOOL;
    if (labels && nt != 1) {
        em_set_error(EM_ERR_SHAPE, "dataset_from_tensors: class-label targets must have shape "
                     "(N), not %s", em__shape_str(nt, stt, b, sizeof b));
        return NULL;
    }
    tensors_state *s = em__calloc(1, sizeof *s, "tensor dataset");
    if (!s) return NULL;
    s->inputs = em__contiguous(inputs);
    em_tensor *t = labels ? em__to_dtype(targets, EM_I64) : em__to_dtype(targets, EM_F32);
    s->targets = t ? em__contiguous(t) : NULL;
    em_tensor_release(t);
    if (!s->inputs || !s->targets) goto fail;
    em_dataset_info info = {.struct_size = sizeof info, .length = si[0], .input_ndim = ni - 1,
                            .input_dtype = em_tensor_dtype(inputs)};
    memcpy(info.input_shape, si + 1, sizeof(int64_t) * (size_t)(ni - 1));
    if (labels) {
        const int64_t *lab = em_tensor_data(s->targets);
        int64_t mx = -1;
        for (int64_t i = 0; i < si[0]; i++) {
            if (lab[i] < 0 || (num_classes > 0 && lab[i] >= num_classes)) {
                em_set_error(EM_ERR_RANGE, "dataset_from_tensors: item %lld has label %lld, "
                             "outside [0, %lld)", (long long)i, (long long)lab[i],
                             (long long)(num_classes > 0 ? num_classes : INT64_MAX));
                goto fail;
            }
            mx = EM_MAX(mx, lab[i]);
        }
        info.target_dtype = EM_I64;
        info.num_classes = num_classes > 0 ? num_classes : mx + 1;
        if (info.num_classes <= 0) info.num_classes = 1;
    } else {
        info.target_dtype = EM_F32;
        info.target_ndim = 1;
        info.target_shape[0] = nt == 2 ? stt[1] : 1;
    }
    s->ib = em__data_item_bytes(info.input_ndim, info.input_shape, info.input_dtype);
    s->tb = em__data_item_bytes(info.target_ndim, info.target_shape, info.target_dtype);
    em_dataset *ds = dataset_new("tensors", &info, tensors_read, tensors_close, s);
    if (ds) return ds;
fail:
    tensors_close(s);
    return NULL;
}

/* ---- callback datasets -------------------------------------------------------------------- */

typedef struct callback_state {
    em_item_fn fn;
    void *user;
    size_t ib, tb;
} callback_state;

static em_status callback_read(void *state, const int64_t *idx, int64_t n, void *in, void *tg) {
    const callback_state *s = state;
    for (int64_t j = 0; j < n; j++) {
        em_clear_error();
        em_status st = s->fn(s->user, idx[j], (char *)in + (size_t)j * s->ib,
                             (char *)tg + (size_t)j * s->tb);
        if (st != EM_OK)
            return em_set_error(st, "callback dataset: item %lld: %s", (long long)idx[j],
                                *em_last_error() ? em_last_error() : em_status_str(st));
    }
    return EM_OK;
}

static void callback_close(void *state) { em__free(state); }

em_dataset *em_dataset_from_callback(const em_dataset_info *info_in, em_item_fn fn, void *user) {
    if (!fn) {
        em_set_error(EM_ERR_INVALID, "dataset_from_callback: NULL function");
        return NULL;
    }
    em_dataset_info full; /* the caller's info by the prefix rule: read only what it covers */
    if (EM__STRUCT_READ(em_dataset_info, &full, info_in, offsetof(em_dataset_info, ext),
                        "dataset_from_callback") != EM_OK)
        return NULL;
    const em_dataset_info *info = &full;
    callback_state *s = em__calloc(1, sizeof *s, "callback dataset");
    if (!s) return NULL;
    s->fn = fn;
    s->user = user;
    s->ib = em__data_item_bytes(info->input_ndim, info->input_shape, info->input_dtype);
    s->tb = em__data_item_bytes(info->target_ndim, info->target_shape, info->target_dtype);
    em_dataset *ds = dataset_new("callback", info, callback_read, callback_close, s);
    if (!ds) em__free(s);
    return ds;
}

/* ---- subsets and random_split ------------------------------------------------------------- */

typedef struct subset_state {
    em_dataset *parent; /* owned reference */
    int64_t *idx;
    int64_t n;
} subset_state;

static em_status subset_read(void *state, const int64_t *idx, int64_t n, void *in, void *tg) {
    const subset_state *s = state;
    int64_t map[256]; /* no allocation per read: map the indices in chunks */
    for (int64_t j = 0; j < n; j += 256) {
        int64_t m = EM_MIN(256, n - j);
        for (int64_t k = 0; k < m; k++) map[k] = s->idx[idx[j + k]];
        em_status st = s->parent->read(s->parent->state, map, m,
                                       (char *)in + (size_t)j * s->parent->input_bytes,
                                       (char *)tg + (size_t)j * s->parent->target_bytes);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static void subset_close(void *state) {
    subset_state *s = state;
    if (!s) return;
    em_dataset_free(s->parent);
    em__free(s->idx);
    em__free(s);
}

em_dataset *em_dataset_subset(em_dataset *ds, const int64_t *indices, int64_t n) {
    if (!ds || n < 0 || (n > 0 && !indices)) {
        em_set_error(EM_ERR_INVALID, "dataset_subset: NULL dataset or indices, or n < 0");
        return NULL;
    }
    for (int64_t j = 0; j < n; j++)
        if (indices[j] < 0 || indices[j] >= ds->info.length) {
            em_set_error(EM_ERR_RANGE, "dataset_subset: index %lld (entry %lld) is out of range "
                         "for dataset '%s' of length %lld", (long long)indices[j], (long long)j,
                         ds->name, (long long)ds->info.length);
            return NULL;
        }
    subset_state *s = em__calloc(1, sizeof *s, "subset dataset");
    if (!s) return NULL;
    s->idx = em__malloc(sizeof(int64_t) * (size_t)(n ? n : 1), "subset indices");
    if (!s->idx) {
        em__free(s);
        return NULL;
    }
    if (n) memcpy(s->idx, indices, sizeof(int64_t) * (size_t)n);
    s->n = n;
    atomic_fetch_add(&ds->refcount, 1);
    s->parent = ds;
    em_dataset_info info = ds->info;
    info.length = n;
    em_dataset *sub = dataset_new("subset", &info, subset_read, subset_close, s);
    if (!sub) subset_close(s);
    return sub;
}

void em__data_permute(int64_t *perm, int64_t n, uint64_t seed, uint64_t epoch, uint32_t stream) {
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t k = (uint64_t)(n - 1 - i); /* the k-th draw */
        uint32_t w = em__data_word(seed, epoch, stream, k / 4, (unsigned)(k % 4));
        int64_t j = (int64_t)em__data_below(w, (uint64_t)i + 1);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

em_status em_random_split(em_dataset *ds, const int64_t *lengths, int n, uint64_t seed,
                          em_dataset **out) {
    if (!ds || !lengths || n <= 0 || !out)
        return em_set_error(EM_ERR_INVALID, "random_split: NULL dataset, lengths or out, or "
                            "n <= 0");
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        if (lengths[i] < 0)
            return em_set_error(EM_ERR_INVALID, "random_split: length %d is negative (%lld)", i,
                                (long long)lengths[i]);
        total += lengths[i];
    }
    if (total != ds->info.length)
        return em_set_error(EM_ERR_INVALID, "random_split: the lengths add up to %lld but "
                            "dataset '%s' has %lld items", (long long)total, ds->name,
                            (long long)ds->info.length);
    int64_t *perm = em__malloc(sizeof(int64_t) * (size_t)(total ? total : 1), "random_split");
    if (!perm) return EM_ERR_NOMEM;
    for (int64_t i = 0; i < total; i++) perm[i] = i;
    em__data_permute(perm, total, seed, 0, EM__DATA_STREAM_SPLIT);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        out[i] = em_dataset_subset(ds, perm + at, lengths[i]);
        if (!out[i]) {
            for (int k = 0; k < i; k++) em_dataset_free(out[k]), out[k] = NULL;
            em__free(perm);
            return em_last_status() != EM_OK ? em_last_status() : EM_ERR_NOMEM;
        }
        at += lengths[i];
    }
    em__free(perm);
    return EM_OK;
}
