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
#include "ember/serialize.h"
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
    bool v1 = def->open || def->read, fields = def->open_fields || def->read_fields;
    if (v1 && fields)
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' sets both the 1.0 open/read and "
                            "open_fields/read_fields: set one pair", who, def->name);
    if (fields && (!def->open_fields || !def->read_fields))
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' lacks a %s function", who,
                            def->name, !def->open_fields ? "open_fields" : "read_fields");
    if (!fields && (!def->open || !def->read))
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

static bool valid_field_name(const char *s) {
    if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
    size_t n = 0;
    for (; *s; s++, n++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return n < sizeof(((em_dataset *)0)->names[0]);
}

/* Check field f (index k) of dataset `who`. */
static em_status field_check(const char *who, int k, const em_field *f) {
    char s[96];
    if (!valid_field_name(f->name))
        return em_set_error(EM_ERR_INVALID, "dataset '%s': field %d has name '%s', not "
                            "[A-Za-z_][A-Za-z0-9_]* of at most 63 characters", who, k,
                            f->name ? f->name : "(null)");
    if (!em_dtype_is_valid(f->dtype))
        return em_set_error(EM_ERR_DTYPE, "dataset '%s': field '%s' has an invalid dtype %d",
                            who, f->name, (int)f->dtype);
    if (f->ndim < 0 || f->ndim > EM_MAX_DIMS - 1)
        return em_set_error(EM_ERR_INVALID, "dataset '%s': field '%s' has %d dims (must be in "
                            "[0, %d])", who, f->name, f->ndim, EM_MAX_DIMS - 1);
    for (int d = 0; d < f->ndim; d++)
        if (f->shape[d] <= 0)
            return em_set_error(EM_ERR_SHAPE, "dataset '%s': field '%s' has shape %s with a "
                                "non-positive size", who, f->name,
                                em__shape_str(f->ndim, f->shape, s, sizeof s));
    if (f->variable && (f->var_dim < 0 || f->var_dim >= f->ndim))
        return em_set_error(EM_ERR_INVALID, "dataset '%s': field '%s' has variable dim %d, "
                            "outside its %d dims", who, f->name, f->var_dim, f->ndim);
    if (f->num_classes < 0 || (f->num_classes > 0 && !em_dtype_is_integral(f->dtype)))
        return em_set_error(EM_ERR_INVALID, "dataset '%s': field '%s': num_classes %lld needs "
                            "an integer dtype (has %s) and must be >= 0", who, f->name,
                            (long long)f->num_classes, em_dtype_name(f->dtype));
    if (!isfinite(f->pad_value) && em_dtype_is_integral(f->dtype))
        return em_set_error(EM_ERR_INVALID, "dataset '%s': field '%s' of %s pads with %g",
                            who, f->name, em_dtype_name(f->dtype), f->pad_value);
    return EM_OK;
}

/* Copy field f into ds's table (slot ds->nf). */
static void field_add(em_dataset *ds, const em_field *f) {
    int k = ds->nf++;
    em_field *c = &ds->fields[k];
    *c = *f;
    c->struct_size = sizeof *c;
    c->ext = NULL;
    if (!c->variable) c->var_dim = 0;
    snprintf(ds->names[k], sizeof ds->names[k], "%s", f->name);
    c->name = ds->names[k];
    ds->field_bytes[k] = em__data_item_bytes(c->ndim, c->shape, c->dtype);
}

/* The 1.0 layout as fields: "input" and "target". */
static void fields_from_info(em_dataset *ds) {
    const em_dataset_info *in = &ds->info;
    em_field f = {.struct_size = sizeof f, .name = "input", .dtype = in->input_dtype,
                  .ndim = in->input_ndim};
    memcpy(f.shape, in->input_shape, sizeof f.shape);
    field_add(ds, &f);
    em_field t = {.struct_size = sizeof t, .name = "target", .dtype = in->target_dtype,
                  .ndim = in->target_ndim, .num_classes = in->num_classes};
    memcpy(t.shape, in->target_shape, sizeof t.shape);
    field_add(ds, &t);
}

/* A field dataset's em_dataset_info: the length, and input/target where they fit the 1.0
 * rules (fixed; an int64 label or (k) float32 target). */
static void info_from_fields(em_dataset *ds, int64_t length) {
    em_dataset_info *in = &ds->info;
    memset(in, 0, sizeof *in);
    in->struct_size = sizeof *in;
    in->length = length;
    if (ds->in_f >= 0 && !ds->fields[ds->in_f].variable) {
        const em_field *f = &ds->fields[ds->in_f];
        in->input_ndim = f->ndim;
        memcpy(in->input_shape, f->shape, sizeof in->input_shape);
        in->input_dtype = f->dtype;
        ds->input_bytes = ds->field_bytes[ds->in_f];
    }
    if (ds->tg_f >= 0 && !ds->fields[ds->tg_f].variable) {
        const em_field *f = &ds->fields[ds->tg_f];
        in->target_ndim = f->ndim;
        memcpy(in->target_shape, f->shape, sizeof in->target_shape);
        in->target_dtype = f->dtype;
        in->num_classes = f->num_classes;
        ds->target_bytes = ds->field_bytes[ds->tg_f];
    }
}

static em_dataset *dataset_alloc(const char *name) {
    em_dataset *ds = em__calloc(1, sizeof *ds, "dataset");
    if (!ds) return NULL;
    if (!(ds->name = em__strdup(name, "dataset name")) || !(ds->meta = em_metadata_new())) {
        if (ds->name && !ds->meta)
            em_set_error(EM_ERR_NOMEM, "dataset '%s': out of memory for its metadata", name);
        em__free(ds->name);
        em__free(ds);
        return NULL;
    }
    ds->meta_of = ds->meta;
    em__live_inc(EM__LIVE_DATASET);
    atomic_init(&ds->refcount, 1);
    ds->in_f = ds->tg_f = -1;
    return ds;
}

static void find_io_fields(em_dataset *ds) {
    for (int k = 0; k < ds->nf; k++) {
        if (strcmp(ds->fields[k].name, "input") == 0) ds->in_f = k;
        if (strcmp(ds->fields[k].name, "target") == 0) ds->tg_f = k;
    }
}

/* A new dataset handle (refcount 1) over state with the given functions. */
static em_dataset *dataset_new(const char *name, const em_dataset_info *info,
                               em_status (*read)(void *, const int64_t *, int64_t, void *, void *),
                               void (*close)(void *), void *state) {
    if (info_check(name, info) != EM_OK) return NULL;
    em_dataset *ds = dataset_alloc(name);
    if (!ds) return NULL;
    ds->info = *info;
    ds->info.struct_size = sizeof ds->info;
    ds->info.ext = NULL;
    ds->read = read;
    ds->close = close;
    ds->state = state;
    ds->input_bytes = em__data_item_bytes(info->input_ndim, info->input_shape, info->input_dtype);
    ds->target_bytes = em__data_item_bytes(info->target_ndim, info->target_shape,
                                           info->target_dtype);
    fields_from_info(ds);
    ds->in_f = 0;
    ds->tg_f = 1;
    return ds;
}

/* A new field dataset (refcount 1): fields[0..n) with the stride fields[0].struct_size. */
static em_dataset *dataset_new_fields(const char *name, int64_t length, const em_field *fields,
                                      int n, em__fields_read_fn read, void (*close)(void *),
                                      void *state) {
    if (length < 0) {
        em_set_error(EM_ERR_INVALID, "dataset '%s': negative length %lld", name,
                     (long long)length);
        return NULL;
    }
    if (n < 1 || n > EM_MAX_FIELDS || !fields) {
        em_set_error(EM_ERR_INVALID, "dataset '%s': an item has %d fields (must be in [1, %d])",
                     name, fields ? n : 0, EM_MAX_FIELDS);
        return NULL;
    }
    size_t stride = fields[0].struct_size;
    if (stride < offsetof(em_field, ext)) {
        em_set_error(EM_ERR_INVALID, "dataset '%s': em_field struct_size %zu is smaller than "
                     "the 1.1 em_field (%zu)", name, stride, offsetof(em_field, ext));
        return NULL;
    }
    em_dataset *ds = dataset_alloc(name);
    if (!ds) return NULL;
    for (int k = 0; k < n; k++) {
        const char *src = (const char *)fields + (size_t)k * stride; /* by the stride rule */
        em_field f = {0};
        memcpy(&f, src, EM_MIN(stride, sizeof f));
        if (field_check(name, k, &f) != EM_OK) goto fail;
        for (int j = 0; j < k; j++)
            if (strcmp(ds->fields[j].name, f.name) == 0) {
                em_set_error(EM_ERR_INVALID, "dataset '%s': field '%s' is declared twice", name,
                             f.name);
                goto fail;
            }
        field_add(ds, &f);
    }
    find_io_fields(ds);
    info_from_fields(ds, length);
    ds->read_fields = read;
    ds->close = close;
    ds->state = state;
    return ds;
fail:
    em_metadata_free(ds->meta);
    em__free(ds->name);
    em__free(ds);
    em__live_dec(EM__LIVE_DATASET);
    return NULL;
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
    em_dataset_layout lay = {.struct_size = sizeof lay};
    void *state = NULL;
    em_status st = def->open_fields ? def->open_fields(o, &lay, &state)
                                    : def->open(o, &info, &state);
    if (def->open_fields) info.length = lay.length;
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
    em_dataset *ds = def->open_fields
                         ? dataset_new_fields(name, lay.length, lay.fields, lay.n_fields,
                                              def->read_fields, def->close, state)
                         : dataset_new(name, &info, def->read, def->close, state);
    if (!ds && def->close) def->close(state);
    if (ds && def->open_fields && lay.n_meta > 0) {
        /* the class's text beside the items (copied: the arrays may live in its state) */
        em_status ms = lay.n_meta > 4096 || !lay.meta_keys || !lay.meta_values
                           ? em_set_error(EM_ERR_INVALID, "dataset '%s': %d metadata entries "
                                          "without keys or values (or more than 4096)", name,
                                          lay.n_meta)
                           : EM_OK;
        for (int i = 0; ms == EM_OK && i < lay.n_meta; i++) {
            ms = em_metadata_set(ds->meta, lay.meta_keys[i], lay.meta_values[i]);
            if (ms != EM_OK) {
                char why[256];
                snprintf(why, sizeof why, "%s", em_last_error());
                em_set_error(ms, "dataset '%s': metadata entry %d ('%s'): %s", name, i,
                             lay.meta_keys[i] ? lay.meta_keys[i] : "(null)", why);
            }
        }
        if (ms != EM_OK) {
            em_dataset_free(ds);
            return NULL;
        }
    }
    return ds;
}

const em_dataset_info *em_dataset_get_info(const em_dataset *ds) { return &ds->info; }
int64_t em_dataset_length(const em_dataset *ds) { return ds->info.length; }
const char *em_dataset_name(const em_dataset *ds) { return ds->name; }

/* Every index in [0, length): else EM_ERR_RANGE naming the first one out. */
static em_status check_indices(const em_dataset *ds, const int64_t *indices, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        if (indices[j] < 0 || indices[j] >= ds->info.length)
            return em_set_error(EM_ERR_RANGE, "dataset '%s': item index %lld is out of range "
                                "(length %lld)", ds->name, (long long)indices[j],
                                (long long)ds->info.length);
    return EM_OK;
}

em_status em_dataset_read(em_dataset *ds, const int64_t *indices, int64_t n, void *inputs,
                          void *targets) {
    if (!ds || (n > 0 && (!indices || !inputs || !targets)))
        return em_set_error(EM_ERR_INVALID, "dataset_read: NULL dataset or buffer");
    if (check_indices(ds, indices, n) != EM_OK) return EM_ERR_RANGE;
    if (!ds->read) {
        /* A field dataset: exactly the fixed fields "input" and "target". */
        if (ds->nf != 2 || ds->in_f < 0 || ds->tg_f < 0 || ds->fields[0].variable ||
            ds->fields[1].variable)
            return em_set_error(EM_ERR_INVALID, "dataset '%s': em_dataset_read reads the fixed "
                                "fields 'input' and 'target' only; this dataset's items have "
                                "%d fields (read them with em_dataset_read_fields)", ds->name,
                                ds->nf);
    }
    if (n <= 0) return EM_OK;
    void *data[2];
    data[ds->read ? 0 : ds->in_f] = inputs;
    data[ds->read ? 1 : ds->tg_f] = targets;
    int64_t *lengths[2] = {NULL, NULL};
    return em__dataset_read_fields(ds, indices, n, data, lengths);
}

em_status em__dataset_read_fields(em_dataset *ds, const int64_t *indices, int64_t n,
                                  void *const *data, int64_t *const *lengths) {
    if (n <= 0) return EM_OK;
    em_status st;
    if (ds->read) {
        st = ds->read(ds->state, indices, n, data[0], data[1]);
    } else {
        for (int f = 0; f < ds->nf; f++)
            if (ds->fields[f].variable)
                for (int64_t j = 0; j < n; j++) lengths[f][j] = -1; /* "not set" */
        st = ds->read_fields(ds->state, indices, n, data, lengths);
        for (int f = 0; st == EM_OK && f < ds->nf; f++) {
            const em_field *fd = &ds->fields[f];
            if (!fd->variable) continue;
            int64_t mx = fd->shape[fd->var_dim];
            for (int64_t j = 0; j < n; j++)
                if (lengths[f][j] < 0 || lengths[f][j] > mx) {
                    char got[48] = "has no length set";
                    if (lengths[f][j] != -1)
                        snprintf(got, sizeof got, "has length %lld", (long long)lengths[f][j]);
                    st = em_set_error(EM_ERR_FORMAT, "dataset '%s': item %lld: field '%s' %s "
                                      "(its variable dim %d holds 0 .. %lld)", ds->name,
                                      (long long)indices[j], fd->name, got, fd->var_dim,
                                      (long long)mx);
                    break;
                }
        }
    }
    if (st != EM_OK && !em__error_pending())
        em_set_error(st, "dataset '%s': read of %lld items failed without saying why", ds->name,
                     (long long)n);
    return st;
}

em_status em_dataset_read_fields(em_dataset *ds, const int64_t *indices, int64_t n,
                                 void *const *data, int64_t *const *lengths) {
    if (!ds || (n > 0 && (!indices || !data)))
        return em_set_error(EM_ERR_INVALID, "dataset_read_fields: NULL dataset or buffer");
    if (check_indices(ds, indices, n) != EM_OK) return EM_ERR_RANGE;
    for (int f = 0; n > 0 && f < ds->nf; f++)
        if (!data[f] || (ds->fields[f].variable && (!lengths || !lengths[f])))
            return em_set_error(EM_ERR_INVALID, "dataset_read_fields: dataset '%s': no %s for "
                                "field '%s'", ds->name, data[f] ? "lengths buffer" : "buffer",
                                ds->fields[f].name);
    int64_t *none[EM_MAX_FIELDS] = {0};
    return em__dataset_read_fields(ds, indices, n, data, lengths ? lengths : none);
}

int em_dataset_field_count(const em_dataset *ds) { return ds ? ds->nf : 0; }

const em_field *em_dataset_field(const em_dataset *ds, int i) {
    if (!ds || i < 0 || i >= ds->nf) {
        em_set_error(EM_ERR_RANGE, "dataset_field: index %d is out of range (%d fields)", i,
                     ds ? ds->nf : 0);
        return NULL;
    }
    return &ds->fields[i];
}

int em_dataset_field_index(const em_dataset *ds, const char *name) {
    if (!ds || !name) {
        em_set_error(EM_ERR_INVALID, "dataset_field_index: NULL dataset or name");
        return -1;
    }
    for (int k = 0; k < ds->nf; k++)
        if (strcmp(ds->fields[k].name, name) == 0) return k;
    char list[EM_MAX_FIELDS * 66] = "";
    size_t at = 0;
    for (int k = 0; k < ds->nf && at < sizeof list; k++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", k ? ", " : "",
                               ds->fields[k].name);
    em_set_error(EM_ERR_NOTFOUND, "dataset '%s' has no field '%s' (its fields: %s)", ds->name,
                 name, list);
    return -1;
}

void em_dataset_free(em_dataset *ds) {
    if (!ds || atomic_fetch_sub(&ds->refcount, 1) != 1) return;
    if (ds->close) ds->close(ds->state);
    em_metadata_free(ds->meta);
    em__free(ds->name);
    em__free(ds);
    em__live_dec(EM__LIVE_DATASET);
}

const em_metadata *em_dataset_metadata(const em_dataset *ds) { return ds->meta_of; }

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

/* ---- field callback datasets -------------------------------------------------------------- */

typedef struct fields_cb_state {
    em_fields_fn fn;
    void *user;
    int nf;
    size_t fb[EM_MAX_FIELDS];
} fields_cb_state;

static em_status fields_cb_read(void *state, const int64_t *idx, int64_t n, void *const *data,
                                int64_t *const *lengths) {
    const fields_cb_state *s = state;
    void *d[EM_MAX_FIELDS];
    int64_t len[EM_MAX_FIELDS];
    for (int64_t j = 0; j < n; j++) {
        for (int f = 0; f < s->nf; f++) {
            d[f] = (char *)data[f] + (size_t)j * s->fb[f];
            len[f] = -1;
        }
        em_clear_error();
        em_status st = s->fn(s->user, idx[j], d, len);
        if (st != EM_OK)
            return em_set_error(st, "fields dataset: item %lld: %s", (long long)idx[j],
                                *em_last_error() ? em_last_error() : em_status_str(st));
        for (int f = 0; f < s->nf; f++)
            if (lengths[f]) lengths[f][j] = len[f];
    }
    return EM_OK;
}

em_dataset *em_dataset_from_fields(int64_t length, const em_field *fields, int n_fields,
                                   em_fields_fn fn, void *user) {
    if (!fn) {
        em_set_error(EM_ERR_INVALID, "dataset_from_fields: NULL function");
        return NULL;
    }
    fields_cb_state *s = em__calloc(1, sizeof *s, "fields dataset");
    if (!s) return NULL;
    s->fn = fn;
    s->user = user;
    em_dataset *ds = dataset_new_fields("fields", length, fields, n_fields, fields_cb_read,
                                        callback_close, s);
    if (!ds) {
        em__free(s);
        return NULL;
    }
    s->nf = ds->nf;
    memcpy(s->fb, ds->field_bytes, sizeof s->fb);
    return ds;
}

/* ---- subsets and random_split ------------------------------------------------------------- */

typedef struct subset_state {
    em_dataset *parent; /* owned reference */
    int64_t *idx;
    int64_t n;
} subset_state;

static em_status subset_read(void *state, const int64_t *idx, int64_t n, void *const *data,
                             int64_t *const *lengths) {
    const subset_state *s = state;
    em_dataset *p = s->parent;
    int64_t map[256]; /* no allocation per read: map the indices in chunks */
    void *d[EM_MAX_FIELDS];
    int64_t *ln[EM_MAX_FIELDS];
    for (int64_t j = 0; j < n; j += 256) {
        int64_t m = EM_MIN(256, n - j);
        for (int64_t k = 0; k < m; k++) map[k] = s->idx[idx[j + k]];
        for (int f = 0; f < p->nf; f++) {
            d[f] = (char *)data[f] + (size_t)j * p->field_bytes[f];
            ln[f] = lengths[f] ? lengths[f] + j : NULL;
        }
        em_status st = em__dataset_read_fields(p, map, m, d, ln);
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
    em_dataset *sub = dataset_new_fields("subset", n, ds->fields, ds->nf, subset_read,
                                         subset_close, s);
    if (!sub) subset_close(s);
    else sub->meta_of = ds->meta_of; /* the parent lives as long as the subset */
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
