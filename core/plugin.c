/*
 * plugin.c — registries (what each plugin or the program registered), the one class registry
 * (class kinds by name, each with its record size and owner, and the classes registered into
 * them: modules, optimizers, schedulers, datasets and any kind a plugin declares), the prefix
 * rule for structs that cross the ABI, and the plugin loader: discovery, dlopen, validation,
 * registration, quarantine of bad plugins, and unloading.
 */
#define _GNU_SOURCE /* dladdr */
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ember/comm.h"
#include "ember/data.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/init.h"
#include "ember/module.h"
#include "ember/onnx.h"
#include "ember/optim.h"
#include "ember/plugin.h"
#include "ember/version.h"
#include "internal.h"
#include "transform_internal.h"

/* ---- registries -------------------------------------------------------------------------------- */

em_registry *em__registry_new(const char *name) {
    em_registry *r = em__calloc(1, sizeof *r, "registry");
    if (!r) return NULL;
    if (!(r->name = em__strdup(name, "registry name"))) {
        em__free(r);
        return NULL;
    }
    return r;
}

void em__registry_free(em_registry *r) {
    if (!r) return;
    em__free(r->kernels);
    em__free(r->ops);
    em__free(r->name);
    em__free(r);
}

/* Grow a pointer array to hold one more; false (NOMEM) on failure. */
static bool grow(void *arrp, size_t n, size_t *cap, size_t elem) {
    if (n < *cap) return true;
    size_t nc = *cap ? *cap * 2 : 16;
    void **arr = (void **)arrp;
    void *p = em__realloc(*arr, *cap * elem, nc * elem, "registry list");
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

em_status em__registry_add_kernel(em_registry *r, em_kernel *k) {
    if (!grow(&r->kernels, r->n_kernels, &r->cap_kernels, sizeof *r->kernels)) return EM_ERR_NOMEM;
    r->kernels[r->n_kernels++] = k;
    return EM_OK;
}

void em__registry_forget_kernel(em_registry *r, const em_kernel *k) {
    for (size_t i = 0; r && i < r->n_kernels; i++)
        if (r->kernels[i] == k) {
            memmove(&r->kernels[i], &r->kernels[i + 1], (r->n_kernels - i - 1) * sizeof *r->kernels);
            r->n_kernels--;
            return;
        }
}

em_status em__registry_add_op(em_registry *r, const em_op *op) {
    if (!grow(&r->ops, r->n_ops, &r->cap_ops, sizeof *r->ops)) return EM_ERR_NOMEM;
    r->ops[r->n_ops++] = op;
    return EM_OK;
}

em_status em__registry_add_device_type(em_registry *r, int type) {
    if (r->n_device_types >= EM_MAX_DEVICE_TYPES)
        return em_set_error(EM_ERR_RANGE, "too many device types in one registry");
    r->device_types[r->n_device_types++] = type;
    return EM_OK;
}

/* ---- the class registry: kinds, and the classes registered into them ------------------------ */

/* One class: the core's copy of its record (kind->def.record_size bytes; rec->name points at
 * name) and the registry that registered it. */
typedef struct class_rec {
    em_class_head *rec;
    char *name;
    em_registry *owner;
} class_rec;

typedef struct class_kind {
    em_class_kind_def def; /* copied; def.name and def.description point at the copies */
    char *name, *description;
    em_registry *owner;
    class_rec *c;
    size_t n, cap;
} class_kind;

/* Every kind; one lock for all of them (registration and lookups by name are not hot: a
 * module, optimizer or dataset is looked up once when it is made). Records are allocated one
 * by one, so a pointer em_class_find returned stays valid until that class is removed. */
static struct {
    class_kind **k;
    size_t n, cap;
    pthread_mutex_t lock;
} K = {.lock = PTHREAD_MUTEX_INITIALIZER};

static class_kind *kind_find_locked(const char *name) {
    for (size_t i = 0; name && i < K.n; i++)
        if (strcmp(K.k[i]->name, name) == 0) return K.k[i];
    return NULL;
}

static ptrdiff_t class_index_locked(const class_kind *k, const char *name) {
    for (size_t i = 0; name && i < k->n; i++)
        if (strcmp(k->c[i].name, name) == 0) return (ptrdiff_t)i;
    return -1;
}

/* "module, optimizer, ..." for messages (under the lock). */
static const char *kind_names_locked(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < K.n && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", K.k[i]->name);
    return K.n ? buf : "none";
}

static em_status unknown_kind_locked(const char *who, const char *kind) {
    char names[256];
    return em_set_error(EM_ERR_NOTFOUND, "%s: no class kind named '%s' is declared; declared: %s "
                        "(a kind a plugin declares needs that plugin loaded)", who,
                        kind ? kind : "(null)", kind_names_locked(names, sizeof names));
}

static bool kind_name_ok(const char *s) {
    if (!s || !(*s >= 'a' && *s <= 'z')) return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) return false;
    return true;
}

static void class_rec_free(class_rec *c) {
    em__free(c->rec);
    em__free(c->name);
}

static void kind_free(class_kind *k) {
    for (size_t i = 0; i < k->n; i++) class_rec_free(&k->c[i]);
    em__free(k->c);
    em__free(k->name);
    em__free(k->description);
    em__free(k);
}

static em_status kind_add(em_registry *reg, const em_class_kind_def *def, const char *who) {
    if (!reg) return em_set_error(EM_ERR_INVALID, "%s: NULL registry", who);
    class_kind *k = em__calloc(1, sizeof *k, "class kind");
    if (!k) return EM_ERR_NOMEM;
    em_status st = EM__STRUCT_READ(em_class_kind_def, &k->def, def,
                                   EM__SIZE_THROUGH(em_class_kind_def, min_record_size), who);
    if (st != EM_OK) {
        em__free(k);
        return st;
    }
    if (!kind_name_ok(k->def.name)) {
        em__free(k);
        return em_set_error(EM_ERR_INVALID, "%s: kind name '%s' is not [a-z][a-z0-9_]*", who,
                            def->name ? def->name : "(null)");
    }
    if (!k->def.min_record_size) k->def.min_record_size = k->def.record_size;
    if (k->def.record_size < sizeof(em_class_head) ||
        k->def.min_record_size < sizeof(em_class_head) ||
        k->def.min_record_size > k->def.record_size) {
        st = em_set_error(EM_ERR_INVALID, "%s: kind '%s': record_size %zu and min_record_size "
                          "%zu must satisfy %zu (sizeof(em_class_head)) <= min_record_size <= "
                          "record_size", who, k->def.name, k->def.record_size,
                          k->def.min_record_size, sizeof(em_class_head));
        em__free(k);
        return st;
    }
    if (!(k->name = em__strdup(k->def.name, "class kind name")) ||
        !(k->description = em__strdup(k->def.description ? k->def.description : "",
                                      "class kind description"))) {
        kind_free(k);
        return EM_ERR_NOMEM;
    }
    k->def.name = k->name;
    k->def.description = k->description;
    k->owner = reg;
    pthread_mutex_lock(&K.lock);
    const class_kind *dup = kind_find_locked(k->name);
    if (dup) {
        st = em_set_error(EM_ERR_EXISTS, "%s: a class kind named '%s' is already declared (by %s)",
                          who, k->name, dup->owner->name);
    } else if (!grow(&K.k, K.n, &K.cap, sizeof *K.k)) {
        st = EM_ERR_NOMEM;
    } else {
        K.k[K.n++] = k;
        k = NULL;
    }
    pthread_mutex_unlock(&K.lock);
    if (k) kind_free(k);
    return st;
}

em_status em_class_kind_register(em_registry *reg, const em_class_kind_def *def) {
    return kind_add(reg, def, "class_kind_register");
}

size_t em_class_kind_count(void) {
    pthread_mutex_lock(&K.lock);
    size_t n = K.n;
    pthread_mutex_unlock(&K.lock);
    return n;
}

em_status em_class_kind_get(size_t i, em_class_kind_info *out) {
    pthread_mutex_lock(&K.lock);
    if (i >= K.n) {
        size_t n = K.n;
        pthread_mutex_unlock(&K.lock);
        return em_set_error(EM_ERR_RANGE, "class_kind_get: index %zu is out of range (%zu kinds)",
                            i, n);
    }
    const class_kind *k = K.k[i];
    em_class_kind_info info = {.struct_size = sizeof info, .name = k->name,
                               .description = k->description, .record_size = k->def.record_size,
                               .min_record_size = k->def.min_record_size,
                               .owner = k->owner->name, .class_count = k->n};
    pthread_mutex_unlock(&K.lock);
    return EM__STRUCT_WRITE(em_class_kind_info, out, &info,
                            EM__SIZE_THROUGH(em_class_kind_info, class_count), "class_kind_get");
}

em_status em__class_register(em_registry *reg, const char *kind, const void *record,
                             const char *who) {
    if (!reg || !record)
        return em_set_error(EM_ERR_INVALID, "%s: NULL %s", who, reg ? "class record" : "registry");
    pthread_mutex_lock(&K.lock);
    const class_kind *k = kind_find_locked(kind);
    if (!k) {
        em_status st = unknown_kind_locked(who, kind);
        pthread_mutex_unlock(&K.lock);
        return st;
    }
    /* The kind's definition is copied out so that its check runs without the lock (a check may
     * call the library, e.g. resolve an option's default); the kind cannot go away meanwhile:
     * only its owner's withdrawal removes it, and a registry does not register and unload at
     * once. */
    em_class_kind_def def = k->def;
    pthread_mutex_unlock(&K.lock);
    char what[96];
    snprintf(what, sizeof what, "%s class record", def.name);
    em_class_head *copy = em__malloc(def.record_size, "class record");
    if (!copy) return EM_ERR_NOMEM;
    em_status st = em__struct_read(copy, def.record_size, record, def.min_record_size, who, what);
    if (st == EM_OK && (!copy->name || !*copy->name))
        st = em_set_error(EM_ERR_INVALID, "%s: a %s class needs a name", who, def.name);
    if (st == EM_OK && def.check) st = def.check(copy, who);
    char *name = st == EM_OK ? em__strdup(copy->name, "class name") : NULL;
    if (st == EM_OK && !name) st = EM_ERR_NOMEM;
    if (st != EM_OK) {
        em__free(copy);
        return st;
    }
    copy->name = name;
    pthread_mutex_lock(&K.lock);
    class_kind *kk = kind_find_locked(kind);
    ptrdiff_t dup = kk ? class_index_locked(kk, name) : -1;
    if (!kk) st = unknown_kind_locked(who, kind);
    else if (dup >= 0)
        st = em_set_error(EM_ERR_EXISTS, "%s: %s %s class named '%s' is already registered "
                          "(by %s)", who, strchr("aeiou", kk->name[0]) ? "an" : "a", kk->name,
                          name, kk->c[dup].owner->name);
    else if (!grow(&kk->c, kk->n, &kk->cap, sizeof *kk->c)) st = EM_ERR_NOMEM;
    else kk->c[kk->n++] = (class_rec){.rec = copy, .name = name, .owner = reg};
    pthread_mutex_unlock(&K.lock);
    if (st != EM_OK) {
        em__free(copy);
        em__free(name);
    }
    return st;
}

em_status em_class_register(em_registry *reg, const char *kind, const void *record) {
    return em__class_register(reg, kind, record, "class_register");
}

em_status em_class_unregister(em_registry *reg, const char *kind, const char *name) {
    pthread_mutex_lock(&K.lock);
    class_kind *k = kind_find_locked(kind);
    em_status st = EM_OK;
    ptrdiff_t i = k ? class_index_locked(k, name) : -1;
    if (!k) st = unknown_kind_locked("class_unregister", kind);
    else if (i < 0 || k->c[i].owner != reg)
        st = em_set_error(EM_ERR_NOTFOUND, "class_unregister: this registry registered no %s "
                          "class named '%s'", k->name, name ? name : "(null)");
    else {
        class_rec_free(&k->c[i]);
        memmove(&k->c[i], &k->c[i + 1], (k->n - (size_t)i - 1) * sizeof *k->c);
        k->n--;
    }
    pthread_mutex_unlock(&K.lock);
    return st;
}

const void *em__class_find(const char *kind, const char *name, const char *who) {
    pthread_mutex_lock(&K.lock);
    const class_kind *k = kind_find_locked(kind);
    const void *found = NULL;
    if (!k) {
        unknown_kind_locked(who ? who : "class_find", kind);
    } else if (!name) {
        em_set_error(EM_ERR_INVALID, "%s%sNULL %s class name", who ? who : "", who ? ": " : "",
                     k->name);
    } else {
        ptrdiff_t i = class_index_locked(k, name);
        if (i >= 0) {
            found = k->c[i].rec;
        } else {
            const char *names[256];
            size_t n = 0;
            for (size_t j = 0; j < k->n && n < EM_ARRAY_LEN(names); j++) names[n++] = k->c[j].name;
            em__class_not_found(who, k->name, name, names, n); /* under the lock, as names */
        }
    }
    pthread_mutex_unlock(&K.lock);
    return found;
}

const void *em_class_find(const char *kind, const char *name) {
    return em__class_find(kind, name, NULL);
}

size_t em_class_count(const char *kind) {
    pthread_mutex_lock(&K.lock);
    const class_kind *k = kind_find_locked(kind);
    size_t n = k ? k->n : 0;
    pthread_mutex_unlock(&K.lock);
    return n;
}

const void *em_class_get(const char *kind, size_t i) {
    pthread_mutex_lock(&K.lock);
    const class_kind *k = kind_find_locked(kind);
    const void *c = k && i < k->n ? k->c[i].rec : NULL;
    pthread_mutex_unlock(&K.lock);
    return c;
}

size_t em_registry_class_count(const em_registry *reg, const char *kind) {
    pthread_mutex_lock(&K.lock);
    const class_kind *k = kind_find_locked(kind);
    size_t n = 0;
    for (size_t i = 0; reg && k && i < k->n; i++) n += k->c[i].owner == reg;
    pthread_mutex_unlock(&K.lock);
    return n;
}

const char *em_registry_class_name(const em_registry *reg, const char *kind, size_t i) {
    pthread_mutex_lock(&K.lock);
    const class_kind *k = kind_find_locked(kind);
    const char *name = NULL;
    for (size_t j = 0; reg && k && j < k->n && !name; j++)
        if (k->c[j].owner == reg && i-- == 0) name = k->c[j].name;
    pthread_mutex_unlock(&K.lock);
    return name;
}

/* Remove what owner registered: its classes in every kind, then the kinds it declared (with
 * every class still in them). */
static void classes_remove_owner(const em_registry *owner) {
    pthread_mutex_lock(&K.lock);
    size_t nk = 0;
    for (size_t i = 0; i < K.n; i++) {
        class_kind *k = K.k[i];
        size_t n = 0;
        for (size_t j = 0; j < k->n; j++) {
            if (k->c[j].owner == owner) class_rec_free(&k->c[j]);
            else k->c[n++] = k->c[j];
        }
        k->n = n;
        if (k->owner == owner) kind_free(k);
        else K.k[nk++] = k;
    }
    K.n = nk;
    if (!K.n) {
        em__free(K.k);
        K.k = NULL;
        K.cap = 0;
    }
    pthread_mutex_unlock(&K.lock);
}

static bool registry_has_classes(const em_registry *reg) {
    pthread_mutex_lock(&K.lock);
    bool any = false;
    for (size_t i = 0; i < K.n && !any; i++) {
        any = K.k[i]->owner == reg;
        for (size_t j = 0; j < K.k[i]->n && !any; j++) any = K.k[i]->c[j].owner == reg;
    }
    pthread_mutex_unlock(&K.lock);
    return any;
}

/* The core's own kinds, declared by its registry at em_init(). The smallest record each
 * accepts is the layout through the last field it requires. */
static em_status declare_core_kinds(em_registry *core) {
    const em_class_kind_def kinds[] = {
        {.struct_size = sizeof kinds[0], .name = "module",
         .description = "layers and losses (ember/module.h)",
         .record_size = sizeof(em_module_class),
         .min_record_size = EM__SIZE_THROUGH(em_module_class, forward),
         .check = em__module_class_check},
        {.struct_size = sizeof kinds[0], .name = "optimizer",
         .description = "optimizers (ember/optim.h)", .record_size = sizeof(em_optim_class),
         .min_record_size = offsetof(em_optim_class, validate),
         .check = em__optim_class_check},
        {.struct_size = sizeof kinds[0], .name = "scheduler",
         .description = "learning-rate schedulers (ember/optim.h)",
         .record_size = sizeof(em_sched_class),
         .min_record_size = offsetof(em_sched_class, closed_form),
         .check = em__sched_class_check},
        {.struct_size = sizeof kinds[0], .name = "dataset",
         .description = "datasets (ember/data.h)", .record_size = sizeof(em_dataset_class_def),
         .min_record_size = offsetof(em_dataset_class_def, ext),
         .check = em__dataset_class_check},
        {.struct_size = sizeof kinds[0], .name = EM_TRANSFORM_KIND,
         .description = "per-item data transforms (ember/transform.h)",
         .record_size = sizeof(em_transform_class),
         .min_record_size = offsetof(em_transform_class, ext),
         .check = em__transform_class_check},
        /* Model formats (ONNX) and each module class's ONNX nodes: declared by the core, not
         * by the ONNX plugin, so that a layer plugin loaded before it can register into it. */
        {.struct_size = sizeof kinds[0], .name = EM_EXPORTER_KIND,
         .description = "model exporters and importers (ember/onnx.h)",
         .record_size = sizeof(em_exporter_class),
         .min_record_size = EM__SIZE_THROUGH(em_exporter_class, export_model)},
        {.struct_size = sizeof kinds[0], .name = EM_ONNX_LAYER_KIND,
         .description = "a module class's ONNX nodes (ember/onnx.h)",
         .record_size = sizeof(em_onnx_layer_class),
         .min_record_size = EM__SIZE_THROUGH(em_onnx_layer_class, export_layer)},
        {.struct_size = sizeof kinds[0], .name = EM_COMM_KIND,
         .description = "communicators between processes (ember/comm.h)",
         .record_size = sizeof(em_comm_class),
         .min_record_size = offsetof(em_comm_class, done_at), .check = em__comm_class_check},
    };
    for (size_t i = 0; i < EM_ARRAY_LEN(kinds); i++) {
        em_status st = kind_add(core, &kinds[i], "em_init");
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

/* ---- structs that cross the ABI --------------------------------------------------------------- */

em_status em__struct_read(void *dst, size_t size, const void *src, size_t min, const char *who,
                          const char *type) {
    size_t have = src ? *(const size_t *)src : 0;
    if (!src || have < min)
        return src ? em_set_error(EM_ERR_INVALID, "%s: %s struct_size %zu is smaller than the "
                                  "oldest layout this core accepts (%zu bytes); set it to sizeof "
                                  "the struct", who, type, have, min)
                   : em_set_error(EM_ERR_INVALID, "%s: NULL %s", who, type);
    size_t n = EM_MIN(have, size);
    memcpy(dst, src, n);
    memset((char *)dst + n, 0, size - n);
    *(size_t *)dst = size;
    return EM_OK;
}

em_status em__struct_write(void *out, const void *src, size_t size, size_t min, const char *who,
                           const char *type) {
    size_t have = out ? *(const size_t *)out : 0;
    if (!out || have < min)
        return out ? em_set_error(EM_ERR_INVALID, "%s: %s struct_size %zu is smaller than the "
                                  "oldest layout this core accepts (%zu bytes); set it to sizeof "
                                  "the struct", who, type, have, min)
                   : em_set_error(EM_ERR_INVALID, "%s: NULL %s", who, type);
    size_t n = EM_MIN(have, size);
    if (n > sizeof(size_t)) /* the caller's struct_size stays what it set */
        memcpy((char *)out + sizeof(size_t), (const char *)src + sizeof(size_t),
               n - sizeof(size_t));
    return EM_OK;
}

/* ---- withdrawal and listings ------------------------------------------------------------------ */

/* Remove everything a registry registered: kernels, ops, device types, its classes of every
 * kind and the kinds it declared. */
static void registry_withdraw(em_registry *r) {
    em__op_cases_remove_owner(r);
    classes_remove_owner(r);
    em__ops_remove_owner(r);
    em__device_types_remove_owner(r);
    r->n_ops = 0;
    r->n_device_types = 0;
}

size_t em_registry_kernel_count(const em_registry *r) { return r ? r->n_kernels : 0; }
em_status em_registry_kernel_get(const em_registry *r, size_t i, em_kernel_info *out) {
    if (!r || !out || i >= r->n_kernels)
        return em_set_error(EM_ERR_RANGE, "registry_kernel_get: index %zu out of range", i);
    em__kernel_info(r->kernels[i], out);
    return EM_OK;
}
size_t em_registry_op_count(const em_registry *r) { return r ? r->n_ops : 0; }
const char *em_registry_op_name(const em_registry *r, size_t i) {
    return r && i < r->n_ops ? em_op_name(r->ops[i]) : NULL;
}
size_t em_registry_device_type_count(const em_registry *r) { return r ? r->n_device_types : 0; }
const char *em_registry_device_type_name(const em_registry *r, size_t i) {
    return r && i < r->n_device_types ? em__device_types[r->device_types[i]].name : NULL;
}

/* ---- the loader -------------------------------------------------------------------------------- */

typedef struct candidate {
    char *path, *name, *version, *description, *reason;
    em_plugin_status status;
    em_registry *reg;
    void *handle;
    /* The descriptor by the prefix rule: the core's full copy, the slots an older plugin's
     * lacks zero (all zero while none was accepted). */
    em_plugin_descriptor desc;
    bool pending; /* registration failed during the start-up pass: retried at its end */
} candidate;

static struct {
    candidate *c;
    size_t n, cap;
    char **queued; /* em_plugin_load() before em_init() */
    size_t n_queued, cap_queued;
    char *search_path;
    em_registry *core, *program;
    bool loading_done;
    bool first_pass; /* em__plugins_load_all is walking the search path */
} L;

em_registry *em__registry_core(void) { return L.core; }
const em_registry *em_registry_core(void) { return L.core; }
em_registry *em_registry_program(void) { return L.program; }

static void candidate_clear(candidate *c) {
    em__free(c->path);
    em__free(c->name);
    em__free(c->version);
    em__free(c->description);
    em__free(c->reason);
    memset(c, 0, sizeof *c);
}

static const char *disabled_list(void) {
    const char *e = getenv("EMBER_DISABLE_PLUGINS");
    return e ? e : "";
}

static bool name_in_list(const char *name, const char *list) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (!end) break;
        p = end + 1;
    }
    return false;
}

/* Record the refusal reason (formatted) and log it. */
static em_status refuse(candidate *c, em_plugin_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static em_status refuse(candidate *c, em_plugin_status status, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    c->status = status;
    c->reason = em__strdup(buf, "plugin refusal reason");
    if (c->handle) dlclose(c->handle);
    c->handle = NULL;
    memset(&c->desc, 0, sizeof c->desc);
    if (status == EM_PLUGIN_DISABLED) {
        em_log_write(EM_LOG_INFO, "plugin %s: %s", c->path, buf);
        return EM_OK;
    }
    em_log_write(EM_LOG_WARN, "plugin %s refused: %s", c->path, buf);
    return em_set_error(EM_ERR_PLUGIN, "plugin %s refused: %s", c->path, buf);
}

static candidate *find_loaded(const char *name) {
    for (size_t i = 0; i < L.n; i++)
        if (L.c[i].status == EM_PLUGIN_LOADED && L.c[i].name && strcmp(L.c[i].name, name) == 0)
            return &L.c[i];
    return NULL;
}

static bool already_seen(const char *real) {
    for (size_t i = 0; i < L.n; i++)
        if (strcmp(L.c[i].path, real) == 0) return true;
    return false;
}

/* Run c's register function. A plugin may need what a plugin found after it provides (a
 * third-party plugin on EMBER_PLUGIN_PATH that adds CPU kernels loads before ember-cpu), so a
 * failure that is not final (during the start-up pass) leaves c pending, and
 * register_pending() retries it once the whole search path is loaded. */
static em_status register_candidate(candidate *c, bool final) {
    const em_plugin_descriptor *d = &c->desc;
    if (!(c->reg = em__registry_new(c->name))) {
        dlclose(c->handle);
        c->handle = NULL;
        memset(&c->desc, 0, sizeof c->desc);
        c->pending = false;
        return EM_ERR_NOMEM;
    }
    em_clear_error();
    em_status st = d->register_fn(c->reg);
    if (st != EM_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", em__error_pending() ? em_last_error() : em_status_str(st));
        registry_withdraw(c->reg);
        if (d->shutdown_fn) d->shutdown_fn();
        em__registry_free(c->reg);
        c->reg = NULL;
        c->pending = !final && st != EM_ERR_NOMEM;
        if (c->pending) return EM_OK;
        em_status r = refuse(c, EM_PLUGIN_REFUSED, "registration failed: %s", why);
        return st == EM_ERR_NOMEM ? em_set_error(EM_ERR_NOMEM, "%s", why) : r;
    }
    c->pending = false;
    c->status = EM_PLUGIN_LOADED;
    em_log_write(EM_LOG_INFO, "plugin %s %s loaded from %s", c->name, c->version, c->path);
    return EM_OK;
}

/* Retry the pending plugins in discovery order while a pass loads one of them; then refuse
 * the rest with their own registration error. */
static em_status register_pending(void) {
    bool progress = true, nomem = false;
    while (progress) {
        progress = false;
        for (size_t i = 0; i < L.n; i++) {
            if (!L.c[i].pending) continue;
            candidate *dup = find_loaded(L.c[i].name);
            if (dup) {
                L.c[i].pending = false;
                refuse(&L.c[i], EM_PLUGIN_REFUSED, "a plugin named '%s' is already loaded "
                       "from %s", L.c[i].name, dup->path);
                continue;
            }
            nomem |= register_candidate(&L.c[i], false) == EM_ERR_NOMEM;
            progress |= L.c[i].status == EM_PLUGIN_LOADED;
        }
    }
    for (size_t i = 0; i < L.n; i++)
        if (L.c[i].pending) nomem |= register_candidate(&L.c[i], true) == EM_ERR_NOMEM;
    return nomem ? EM_ERR_NOMEM : EM_OK;
}

static em_status load_file(const char *path) {
    char real[PATH_MAX];
    if (!realpath(path, real)) snprintf(real, sizeof real, "%s", path);
    if (already_seen(real)) return EM_OK;
    if (!grow(&L.c, L.n, &L.cap, sizeof *L.c)) return EM_ERR_NOMEM;
    candidate *c = &L.c[L.n];
    memset(c, 0, sizeof *c);
    c->status = EM_PLUGIN_REFUSED; /* until registration succeeds */
    if (!(c->path = em__strdup(real, "plugin path"))) return EM_ERR_NOMEM;
    L.n++;

    dlerror();
    /* RTLD_NODELETE: unloading removes everything a plugin registered and closes it, but its
     * code stays mapped — runtimes it pulls in (libgomp's worker threads, CUDA) crash when
     * unmapped under their own threads. */
    c->handle = dlopen(real, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!c->handle) {
        const char *e = dlerror();
        return refuse(c, EM_PLUGIN_REFUSED, "cannot be loaded: %s", e ? e : "unknown error");
    }
    em_plugin_entry_fn entry;
    *(void **)&entry = dlsym(c->handle, EM_PLUGIN_ENTRY_SYMBOL);
    if (!entry)
        return refuse(c, EM_PLUGIN_REFUSED, "no entry symbol '%s' (not an Ember plugin?)",
                      EM_PLUGIN_ENTRY_SYMBOL);
    const em_plugin_descriptor *entered = entry();
    if (!entered) return refuse(c, EM_PLUGIN_REFUSED, "its descriptor is NULL");
    em_plugin_descriptor d_full;
    if (EM__STRUCT_READ(em_plugin_descriptor, &d_full, entered,
                        offsetof(em_plugin_descriptor, shutdown_fn), "plugin") != EM_OK)
        return refuse(c, EM_PLUGIN_REFUSED, "its descriptor is too small: %s", em_last_error());
    const em_plugin_descriptor *d = &d_full;
    if (d->abi_major != EM_PLUGIN_ABI_MAJOR)
        return refuse(c, EM_PLUGIN_REFUSED, "built for plugin ABI %d; this core (%s) "
                      "implements ABI %d — rebuild the plugin against this Ember",
                      d->abi_major, EM_VERSION_STRING, EM_PLUGIN_ABI_MAJOR);
    if (!d->name || !*d->name || !d->register_fn)
        return refuse(c, EM_PLUGIN_REFUSED, "its descriptor has no name or register function");
    if (!(c->name = em__strdup(d->name, "plugin name")) ||
        !(c->version = em__strdup(d->version ? d->version : "", "plugin version")) ||
        !(c->description = em__strdup(d->description ? d->description : "", "plugin desc"))) {
        dlclose(c->handle);
        c->handle = NULL;
        return EM_ERR_NOMEM;
    }
    if (name_in_list(c->name, disabled_list()))
        return refuse(c, EM_PLUGIN_DISABLED, "disabled by EMBER_DISABLE_PLUGINS");
    candidate *dup = find_loaded(c->name);
    if (dup)
        return refuse(c, EM_PLUGIN_REFUSED, "a plugin named '%s' is already loaded from %s",
                      c->name, dup->path);
    c->desc = d_full;
    return register_candidate(c, !L.first_pass);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Load every *.so in dir, in name order. EM_ERR_NOMEM if memory ran out on the way. */
static em_status load_dir(const char *dir) {
    em_status st = EM_OK;
    DIR *d = opendir(dir);
    if (!d) return EM_OK;
    char *names[512];
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < EM_ARRAY_LEN(names);) {
        size_t len = strlen(e->d_name);
        if (len > 3 && strcmp(e->d_name + len - 3, ".so") == 0) {
            char *p = em__malloc(strlen(dir) + len + 2, "plugin path");
            if (!p) {
                st = EM_ERR_NOMEM;
                break;
            }
            sprintf(p, "%s/%s", dir, e->d_name);
            names[n++] = p;
        }
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        if (load_file(names[i]) == EM_ERR_NOMEM) st = EM_ERR_NOMEM;
        em__free(names[i]);
    }
    return st;
}

static em_status load_entry(const char *entry) {
    struct stat sb;
    if (stat(entry, &sb) != 0) {
        em_log_write(EM_LOG_WARN, "EMBER_PLUGIN_PATH entry %s does not exist", entry);
        return EM_OK;
    }
    return S_ISDIR(sb.st_mode) ? load_dir(entry) : load_file(entry);
}

/* True when libember itself was loaded from inside its build tree. */
static bool running_uninstalled(void) {
    Dl_info info;
    char lib[PATH_MAX], build[PATH_MAX];
    if (!dladdr((void *)em_init, &info) || !info.dli_fname) return false;
    if (!realpath(info.dli_fname, lib) || !realpath(EM_BUILD_DIR, build)) return false;
    size_t n = strlen(build);
    return strncmp(lib, build, n) == 0 && lib[n] == '/';
}

/* The build tree's plugin directories: plugins/<name>/.libs. */
static bool append_build_dirs(char *buf, size_t cap, size_t *n) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/plugins", EM_BUILD_DIR);
    DIR *d = opendir(root);
    if (!d) return true;
    char *names[64];
    size_t k = 0;
    bool ok = true;
    for (struct dirent *e; ok && (e = readdir(d)) && k < EM_ARRAY_LEN(names);)
        if (e->d_name[0] != '.') ok = (names[k++] = em__strdup(e->d_name, "dir name")) != NULL;
    if (!ok) k--;
    closedir(d);
    qsort(names, k, sizeof *names, cmp_str);
    for (size_t i = 0; i < k; i++) {
        /* Only the plugins this build made: configure creates a directory for every plugin
         * (for its .deps), also one it does not build (ember-cuda --without-cuda). */
        char libs[PATH_MAX + 256];
        int len = snprintf(libs, sizeof libs, "%s/%s/.libs", root, names[i]);
        em__free(names[i]);
        struct stat st;
        if (len < 0 || (size_t)len >= sizeof libs || stat(libs, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (*n && *n < cap) buf[(*n)++] = ':';
        if (*n < cap) *n += (size_t)snprintf(buf + *n, cap - *n, "%s", libs);
    }
    return ok;
}

em_status em__plugins_load_all(void) {
    char path[8192];
    size_t n = 0;
    path[0] = '\0';
    const char *env = getenv("EMBER_PLUGIN_PATH");
    if (env && *env) n += (size_t)snprintf(path, sizeof path, "%s", env);
    size_t before = n;
    if (running_uninstalled() && !append_build_dirs(path, sizeof path, &n)) return EM_ERR_NOMEM;
    if (n == before && !running_uninstalled()) {
        if (n && n < sizeof path) path[n++] = ':';
        if (n < sizeof path) n += (size_t)snprintf(path + n, sizeof path - n, "%s", EM_PLUGIN_DIR);
    }
    if (n >= sizeof path) n = sizeof path - 1;
    path[n] = '\0';
    if (!(L.search_path = em__strdup(path, "plugin search path"))) return EM_ERR_NOMEM;

    bool nomem = false;
    L.first_pass = true;
    for (size_t i = 0; i < L.n_queued; i++) nomem |= load_file(L.queued[i]) == EM_ERR_NOMEM;
    char *save = NULL;
    for (char *tok = strtok_r(path, ":", &save); tok; tok = strtok_r(NULL, ":", &save))
        if (*tok) nomem |= load_entry(tok) == EM_ERR_NOMEM;
    L.first_pass = false;
    nomem |= register_pending() == EM_ERR_NOMEM;
    L.loading_done = true;
    if (nomem) return em_set_error(EM_ERR_NOMEM, "em_init: out of memory while loading plugins");
    em_clear_error(); /* refusals are reported by em_plugins(), not as em_init's error */
    return EM_OK;
}

void em__plugins_unload_all(void) {
    for (size_t i = L.n; i-- > 0;) {
        candidate *c = &L.c[i];
        if (c->status == EM_PLUGIN_LOADED) {
            registry_withdraw(c->reg);
            if (c->desc.shutdown_fn) c->desc.shutdown_fn();
            em__registry_free(c->reg);
            dlclose(c->handle);
        }
        candidate_clear(c);
    }
    em__free(L.c);
    for (size_t i = 0; i < L.n_queued; i++) em__free(L.queued[i]);
    em__free(L.queued);
    em__free(L.search_path);
    em_registry *core = L.core, *program = L.program; /* freed by em__registries_shutdown */
    memset(&L, 0, sizeof L);
    L.core = core;
    L.program = program;
}

em_status em__registries_init(void) {
    L.core = em__registry_new("ember-core");
    L.program = em__registry_new("<program>");
    if (!L.core || !L.program) return EM_ERR_NOMEM;
    return declare_core_kinds(L.core);
}

void em__registries_shutdown(void) {
    if (L.program) registry_withdraw(L.program);
    if (L.core) classes_remove_owner(L.core); /* the core's kinds (its ops go with dispatch) */
    em__op_cases_remove_owner(NULL);          /* the core's case rows */
    em__registry_free(L.program);
    em__registry_free(L.core);
    L.program = L.core = NULL;
}

em_status em_plugin_load(const char *path) {
    if (!path || !*path) return em_set_error(EM_ERR_INVALID, "plugin_load: empty path");
    if (!em_initialized() && !L.loading_done) {
        if (!grow(&L.queued, L.n_queued, &L.cap_queued, sizeof *L.queued)) return EM_ERR_NOMEM;
        if (!(L.queued[L.n_queued] = em__strdup(path, "plugin path"))) return EM_ERR_NOMEM;
        L.n_queued++;
        return EM_OK;
    }
    size_t before = L.n;
    em_status st = load_file(path);
    if (st == EM_OK && L.n > before && L.c[L.n - 1].status == EM_PLUGIN_REFUSED)
        st = em_set_error(EM_ERR_PLUGIN, "plugin %s refused: %s", L.c[L.n - 1].path,
                          L.c[L.n - 1].reason);
    return st;
}

static bool program_listed(void) {
    return L.program && (L.program->n_kernels || L.program->n_ops || L.program->n_device_types ||
                         registry_has_classes(L.program));
}

size_t em_plugin_count(void) { return L.n + (program_listed() ? 1 : 0); }

em_status em_plugin_get(size_t i, em_plugin_info *out) {
    if (!out || i >= em_plugin_count())
        return em_set_error(EM_ERR_RANGE, "plugin_get: index %zu is out of range (%zu "
                            "plugins)", i, em_plugin_count());
    if (i == L.n) {
        *out = (em_plugin_info){.path = "(registered by the program)", .name = "<program>",
                                .version = "", .description = "ops, kernels and classes the program "
                                "registered itself", .status = EM_PLUGIN_LOADED,
                                .registry = L.program};
        return EM_OK;
    }
    const candidate *c = &L.c[i];
    *out = (em_plugin_info){.path = c->path, .name = c->name, .version = c->version,
                            .description = c->description, .status = c->status,
                            .reason = c->reason, .registry = c->reg};
    return EM_OK;
}

const char *em_plugin_describe(size_t i) {
    if (i >= L.n || L.c[i].status != EM_PLUGIN_LOADED) return NULL;
    const em_plugin_descriptor *d = &L.c[i].desc;
    return d->describe ? d->describe() : NULL;
}

const char *em_plugin_search_path(void) { return L.search_path ? L.search_path : ""; }

em_status em__class_not_found(const char *who, const char *kind, const char *name,
                              const char *const *names, size_t n) {
    const char *near = NULL;
    int best = 1 << 30;
    char list[512];
    size_t len = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "",
                                    names[i]);
        int d = name ? em__edit_distance(name, names[i]) : best;
        if (d < best) {
            best = d;
            near = names[i];
        }
    }
    size_t nl = name ? strlen(name) : 0;
    int limit = nl <= 3 ? 1 : (nl <= 8 ? 2 : 3);
    char hint[160] = "";
    if (near && best <= limit) snprintf(hint, sizeof hint, " (did you mean '%s'?)", near);
    return em_set_error(EM_ERR_NOTFOUND, "%s%sno %s class named '%s'%s is registered; registered: "
                        "%s; loaded plugins: %s. A class from a plugin that is not loaded needs "
                        "that plugin: add its file or directory to EMBER_PLUGIN_PATH (ember-info "
                        "lists every plugin found and why any was refused)",
                        who ? who : "", who ? ": " : "", kind, name ? name : "(null)", hint,
                        n ? list : "none", em__plugin_names());
}

const char *em__plugin_names(void) {
    static _Thread_local char buf[512];
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < L.n; i++)
        if (L.c[i].status == EM_PLUGIN_LOADED && n < sizeof buf)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", n ? ", " : "", L.c[i].name);
    return n ? buf : "none";
}
