/*
 * dispatch.c — op declarations, kernel stacks, running ops, the CPU fallback, and the
 * placement counters.
 *
 * Each op keeps, per (device type, dtype), a stack of kernels ordered by priority and then by
 * registration order (newest first among equals). Dispatch reads the top of the stack: one
 * table lookup and an indirect call. Registration and unregistration take a lock; they are
 * meant for start-up (plugins) and program set-up, not to race with running ops.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/plugin.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "internal.h"
#include "observe.h"

struct em_kernel {
    em_kernel_def def;            /* copied; def.name owned */
    struct em_op *op;
    int devtype;
    uint64_t seq;                 /* registration order */
    struct em_kernel *below;      /* next kernel down the stack */
    em_registry *owner;
};

struct em_op {
    em_op_schema schema;          /* copied; strings owned */
    em_registry *owner;
    struct em_op *next;
    em_kernel *top[EM_MAX_DEVICE_TYPES][EM_DTYPE_COUNT];
    atomic_uint_fast64_t fallbacks[EM_MAX_DEVICE_TYPES];
    atomic_bool warned[EM_MAX_DEVICE_TYPES];
};

/* em_op_call_at's choice: the kernel `depth` below the top of the call's stack, and the one
 * that was found there. */
typedef struct em__forced {
    const struct em_op *op;
    size_t depth;
    bool poison;            /* EM_CALL_POISON */
    const em_kernel *used;
} em__forced;

/* A composite run by em_op_call_at reaches its own kernel through em_op_call_kernel: the
 * choice travels in a thread-local, looked at only while some thread is inside em_op_call_at
 * (`forcing`), so a composite's ordinary kernel call pays one relaxed load. */
static atomic_int forcing;
static _Thread_local em__forced *tls_forced;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct em_op *ops_head;
static uint64_t kernel_seq;

typedef struct placement {
    atomic_uint_fast64_t ops, ns, bytes_in, bytes_out, fallbacks;
} placement;
static placement place[EM_MAX_DEVICE_TYPES];

static struct {
    atomic_int fallback;
    atomic_bool profile;
    atomic_bool deterministic;
} cfg = {EM_FALLBACK_ERROR, false, false};

uint64_t em__now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- settings -------------------------------------------------------------------------------- */

void em_fallback_set(em_fallback_policy p) {
    if (p >= EM_FALLBACK_ERROR && p <= EM_FALLBACK_ALLOW) cfg.fallback = p;
}
em_fallback_policy em_fallback_get(void) { return (em_fallback_policy)cfg.fallback; }
void em_profile_enable(bool on) { cfg.profile = on; }
bool em_profile_enabled(void) { return cfg.profile; }
void em_set_deterministic(bool on) { cfg.deterministic = on; }
bool em_deterministic(void) { return cfg.deterministic; }

void em__dispatch_init(void) {
    const char *fb = getenv("EMBER_FALLBACK");
    cfg.fallback = EM_FALLBACK_ERROR;
    if (fb && *fb) {
        if (strcmp(fb, "warn") == 0) cfg.fallback = EM_FALLBACK_WARN;
        else if (strcmp(fb, "allow") == 0) cfg.fallback = EM_FALLBACK_ALLOW;
        else if (strcmp(fb, "error") != 0)
            em_log_write(EM_LOG_WARN, "EMBER_FALLBACK='%s' is not one of error, warn, allow; using "
                   "error", fb);
    }
    em_placement_reset();
}

/* ---- ops ------------------------------------------------------------------------------------ */

static void op_free(struct em_op *op) {
    for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++)
        for (int t = 0; t < EM_DTYPE_COUNT; t++)
            for (em_kernel *k = op->top[d][t], *n; k; k = n) {
                n = k->below;
                em__registry_forget_kernel(k->owner, k);
                em__free((char *)k->def.name);
                em__free(k);
            }
    for (int i = 0; i < op->schema.n_inputs && op->schema.input_names; i++)
        em__free((char *)op->schema.input_names[i]);
    for (int i = 0; i < op->schema.n_attrs && op->schema.attr_names; i++)
        em__free((char *)op->schema.attr_names[i]);
    em__free((void *)op->schema.input_names);
    em__free((void *)op->schema.attr_names);
    em__free((void *)op->schema.attr_types);
    em__free((char *)op->schema.category);
    em__free((char *)op->schema.name);
    em__free(op);
}

static struct em_op *find_op_locked(const char *name) {
    for (struct em_op *op = ops_head; op; op = op->next)
        if (strcmp(op->schema.name, name) == 0) return op;
    return NULL;
}

/* Deep-copies the schema's strings; false (NOMEM set) on failure, with nothing leaked. */
static bool copy_schema(struct em_op *op, const em_op_schema *s) {
    memcpy(&op->schema, s, EM_MIN(s->struct_size, sizeof op->schema));
    op->schema.struct_size = sizeof op->schema;
    op->schema.input_names = NULL;
    op->schema.attr_names = NULL;
    op->schema.attr_types = NULL;
    op->schema.category = NULL;
    op->schema.name = em__strdup(s->name, "op name");
    if (!op->schema.name) return false;
    if (EM_SCHEMA_HAS(s, category) && s->category &&
        !(op->schema.category = em__strdup(s->category, "op category")))
        return false;
    if (s->input_names) {
        const char **names = em__calloc((size_t)s->n_inputs + 1, sizeof *names, "op inputs");
        op->schema.input_names = names;
        if (!names) return false;
        for (int i = 0; i < s->n_inputs; i++)
            if (!(names[i] = em__strdup(s->input_names[i], "op input name"))) return false;
    }
    if (s->n_attrs > 0) {
        const char **names = em__calloc((size_t)s->n_attrs, sizeof *names, "op attrs");
        em_attr_type *types = em__calloc((size_t)s->n_attrs, sizeof *types, "op attrs");
        op->schema.attr_names = names;
        op->schema.attr_types = types;
        if (!names || !types) return false;
        for (int i = 0; i < s->n_attrs; i++) {
            types[i] = s->attr_types[i];
            if (!(names[i] = em__strdup(s->attr_names[i], "op attr name"))) return false;
        }
    }
    return true;
}

em_status em_op_declare(em_registry *reg, const em_op_schema *s_in, const em_op **out) {
    em_op_schema full; /* the declarer's schema by the prefix rule: missing slots zero */
    if (s_in && EM__STRUCT_READ(em_op_schema, &full, s_in, offsetof(em_op_schema, ext),
                                "op_declare") != EM_OK)
        return em_last_status();
    const em_op_schema *s = s_in ? &full : NULL;
    if (!reg || !s || !s->name || !*s->name)
        return em_set_error(EM_ERR_INVALID, "op_declare: NULL registry, schema or name");
    if (s->n_inputs < 0 ||
        s->n_inputs > 8 || s->n_outputs < 1 ||
        s->n_outputs > ((s->flags & EM_OP_LISTS) ? 8 : 4) || s->n_attrs < 0 ||
        s->n_attrs > 8 || (s->n_attrs > 0 && (!s->attr_names || !s->attr_types)) ||
        s->dispatch_arg < -1 || s->dispatch_arg >= s->n_inputs ||
        (!s->infer && s->n_inputs > 0 && !(s->flags & EM_OP_LISTS) &&
         !(EM_SCHEMA_HAS(s, composite) && s->composite)) ||
        ((s->flags & EM_OP_VARIADIC_OUTPUTS) && !(EM_SCHEMA_HAS(s, composite) && s->composite)))
        return em_set_error(EM_ERR_INVALID, "op_declare: the schema of '%s' is malformed "
                            "(1..4 outputs (a list op 1..8), 0..8 inputs and attributes, a "
                            "dispatch_arg naming an input or -1, and an infer function unless it "
                            "is a list op or a composite are required; variadic outputs need a "
                            "composite)", s->name);
    if (EM_SCHEMA_HAS(s, autocast) &&
        (s->autocast < EM_AUTOCAST_NONE || s->autocast > EM_AUTOCAST_PROMOTE))
        return em_set_error(EM_ERR_INVALID, "op_declare: '%s' declares autocast class %d; the "
                            "classes are EM_AUTOCAST_NONE, _LOWER, _FLOAT32 and _PROMOTE (0..3)",
                            s->name, s->autocast);
    if (EM_SCHEMA_HAS(s, layout_arg) && s->layout_arg != 0 &&
        (s->layout_arg < 0 || s->layout_arg >= s->n_inputs))
        return em_set_error(EM_ERR_INVALID, "op_declare: '%s' takes its outputs' layout from "
                            "input %d (layout_arg) but has %d inputs", s->name, s->layout_arg,
                            s->n_inputs);
    bool composite = EM_SCHEMA_HAS(s, composite) && s->composite;
    if ((s->flags & EM_OP_VARIADIC) && !composite && !(s->flags & EM_OP_NONDIFF))
        return em_set_error(EM_ERR_INVALID, "op_declare: '%s' is variadic with a kernel of its "
                            "own, so it must be EM_OP_NONDIFF (autograd records at most 8 "
                            "inputs) or a composite", s->name);
    pthread_mutex_lock(&reg_lock);
    em_status st = EM_OK;
    struct em_op *op = NULL;
    if (find_op_locked(s->name)) {
        st = em_set_error(EM_ERR_EXISTS, "op_declare: an op named '%s' is already declared",
                          s->name);
    } else if (!(op = em__calloc(1, sizeof *op, "op"))) {
        st = EM_ERR_NOMEM;
    } else if (!copy_schema(op, s)) {
        st = EM_ERR_NOMEM;
    } else {
        op->owner = reg;
        st = em__registry_add_op(reg, op);
    }
    if (st == EM_OK) {
        op->next = ops_head;
        ops_head = op;
        if (out) *out = op;
    } else if (op) {
        op_free(op);
    }
    pthread_mutex_unlock(&reg_lock);
    return st;
}

const em_op *em_op_find(const char *name) {
    if (!name) {
        em_set_error(EM_ERR_INVALID, "op_find: NULL name");
        return NULL;
    }
    pthread_mutex_lock(&reg_lock);
    struct em_op *op = find_op_locked(name), *best = NULL;
    size_t best_d = 4;
    /* The list runs newest first; on a tie the op declared first wins ('ad': 'add', not the
     * later 'pad'). */
    for (struct em_op *o = ops_head; o && !op; o = o->next) {
        size_t d = (size_t)em__edit_distance(name, o->schema.name);
        if (d < best_d || (best && d == best_d)) best_d = d, best = o;
    }
    if (!op)
        em_set_error(EM_ERR_NOTFOUND, "no op named '%s' is declared%s%s%s", name,
                     best ? " (did you mean '" : "", best ? best->schema.name : "",
                     best ? "'?)" : "");
    pthread_mutex_unlock(&reg_lock);
    return op;
}

const char *em_op_name(const em_op *op) { return op ? op->schema.name : "(null)"; }
const em_op_schema *em_op_schema_of(const em_op *op) { return op ? &op->schema : NULL; }

/* Remove every op (and every kernel) the registry owns, and every kernel it registered on
 * other registries' ops. */
void em__ops_remove_owner(em_registry *owner) {
    pthread_mutex_lock(&reg_lock);
    for (struct em_op *op = ops_head; op; op = op->next)
        for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++)
            for (int t = 0; t < EM_DTYPE_COUNT; t++)
                for (em_kernel **pk = &op->top[d][t]; *pk;) {
                    em_kernel *k = *pk;
                    if (k->owner != owner) {
                        pk = &k->below;
                        continue;
                    }
                    *pk = k->below;
                    em__registry_forget_kernel(k->owner, k);
                    em__free((char *)k->def.name);
                    em__free(k);
                }
    for (struct em_op **pop = &ops_head; *pop;) {
        struct em_op *op = *pop;
        if (op->owner != owner) {
            pop = &op->next;
            continue;
        }
        *pop = op->next;
        op_free(op);
    }
    pthread_mutex_unlock(&reg_lock);
}

void em__dispatch_shutdown(void) {
    pthread_mutex_lock(&reg_lock);
    while (ops_head) {
        struct em_op *op = ops_head;
        ops_head = op->next;
        op_free(op);
    }
    pthread_mutex_unlock(&reg_lock);
}

/* ---- kernels ---------------------------------------------------------------------------------- */

em_status em_kernel_register(em_registry *reg, const em_kernel_def *def, em_kernel **out) {
    if (!reg || !def || !def->op || !def->device_type || !def->fn)
        return em_set_error(EM_ERR_INVALID, "kernel_register: NULL registry, op, device type "
                            "or function");
    em_kernel_def full; /* the registrant's record by the prefix rule: missing slots zero */
    if (EM__STRUCT_READ(em_kernel_def, &full, def, offsetof(em_kernel_def, ext),
                        "kernel_register") != EM_OK)
        return em_last_status();
    def = &full;
    if (!em_dtype_is_valid(def->dtype))
        return em_set_error(EM_ERR_DTYPE, "kernel_register: invalid dtype %d for op '%s'",
                            (int)def->dtype, def->op);
    int devtype = em__device_type_find(def->device_type);
    if (devtype < 0)
        return em_set_error(EM_ERR_NOTFOUND, "kernel_register: no device type '%s' is "
                            "registered (kernel for op '%s')", def->device_type, def->op);
    const em_op *found = em_op_find(def->op);
    if (!found)
        return em_set_error(EM_ERR_NOTFOUND, "kernel_register: %s", em_last_error());
    struct em_op *op = (struct em_op *)found;
    em_kernel *k = em__calloc(1, sizeof *k, "kernel");
    if (!k) return EM_ERR_NOMEM;
    k->def = full;
    k->def.op = op->schema.name;
    k->def.device_type = em__device_types[devtype].name;
    char fallback_name[96];
    snprintf(fallback_name, sizeof fallback_name, "%s_%s_%s", def->op, def->device_type,
             em_dtype_name(def->dtype));
    k->def.name = em__strdup(def->name ? def->name : fallback_name, "kernel name");
    if (!k->def.name) {
        em__free(k);
        return EM_ERR_NOMEM;
    }
    k->op = op;
    k->devtype = devtype;
    k->owner = reg;
    pthread_mutex_lock(&reg_lock);
    em_status st = em__registry_add_kernel(reg, k);
    if (st == EM_OK) {
        k->seq = ++kernel_seq;
        em_kernel **pk = &op->top[devtype][def->dtype];
        while (*pk && (*pk)->def.priority > def->priority) pk = &(*pk)->below;
        k->below = *pk;
        *pk = k;
        if (out) *out = k;
    }
    pthread_mutex_unlock(&reg_lock);
    if (st != EM_OK) {
        em__free((char *)k->def.name);
        em__free(k);
    }
    return st;
}

em_status em_kernel_unregister(em_kernel *k) {
    if (!k) return em_set_error(EM_ERR_INVALID, "kernel_unregister: NULL kernel");
    pthread_mutex_lock(&reg_lock);
    em_kernel **pk = &k->op->top[k->devtype][k->def.dtype];
    while (*pk && *pk != k) pk = &(*pk)->below;
    em_status st = EM_OK;
    if (*pk) {
        *pk = k->below;
        em__registry_forget_kernel(k->owner, k);
        em__free((char *)k->def.name);
        em__free(k);
    } else {
        st = em_set_error(EM_ERR_NOTFOUND, "kernel_unregister: kernel is not registered");
    }
    pthread_mutex_unlock(&reg_lock);
    return st;
}

void em__kernel_info(const em_kernel *k, em_kernel_info *out) {
    out->op = k->op->schema.name;
    out->device_type = k->def.device_type;
    out->dtype = k->def.dtype;
    out->priority = k->def.priority;
    out->name = k->def.name;
}

bool em__op_has_kernel(const em_op *op, int device_type, em_dtype dt) {
    return op && device_type >= 0 && device_type < EM_MAX_DEVICE_TYPES && em_dtype_is_valid(dt) &&
           op->top[device_type][dt] != NULL;
}

size_t em_op_kernel_count(const em_op *op, em_device dev, em_dtype dtype) {
    size_t n = 0;
    if (!em__op_has_kernel(op, dev.type, dtype)) return 0;
    pthread_mutex_lock(&reg_lock);
    for (const em_kernel *k = op->top[dev.type][dtype]; k; k = k->below) n++;
    pthread_mutex_unlock(&reg_lock);
    return n;
}

const em_kernel *em_op_kernel_get(const em_op *op, em_device dev, em_dtype dtype, size_t i) {
    if (!em__op_has_kernel(op, dev.type, dtype)) return NULL;
    pthread_mutex_lock(&reg_lock);
    const em_kernel *k = op->top[dev.type][dtype];
    while (k && i--) k = k->below;
    pthread_mutex_unlock(&reg_lock);
    return k;
}

const em_kernel_def *em_kernel_def_of(const em_kernel *k) { return k ? &k->def : NULL; }
const em_registry *em_kernel_owner(const em_kernel *k) { return k ? k->owner : NULL; }

/* ---- running ----------------------------------------------------------------------------------- */

bool em__check_inputs(const char *op, const em_tensor *const *in, int n) {
    for (int i = 0; i < n; i++) {
        if (in[i]) continue;
        if (!em__error_pending())
            em_set_error(EM_ERR_INVALID, "%s: input %d is NULL", op, i);
        return false;
    }
    return true;
}

/* What a NULL attribute array means: every attribute absent. Inference, prepare hooks,
 * composites and kernels then read EM_ATTR_NONE entries instead of through a NULL pointer. */
static const em_attr no_attrs[8];

static em_status check_attrs(const struct em_op *op, const em_attr *attrs) {
    for (int i = 0; i < op->schema.n_attrs; i++) {
        em_attr_type got = attrs ? attrs[i].type : EM_ATTR_NONE;
        if (got != EM_ATTR_NONE && got != op->schema.attr_types[i])
            return em_set_error(EM_ERR_INVALID, "%s: attribute '%s' has type %d; the schema "
                                "says %d", op->schema.name, op->schema.attr_names[i], (int)got,
                                (int)op->schema.attr_types[i]);
        if (got == EM_ATTR_INTS && (attrs[i].n < 0 || attrs[i].n > EM_MAX_DIMS)) {
            /* em__attr_ints marks a NULL C array of n entries as EM__INTS_NULL + n. */
            int n = attrs[i].n;
            bool null = n >= EM__INTS_NULL && n < EM__INTS_NULL + (1 << 20);
            return em_set_error(EM_ERR_INVALID, "%s: %d %s given%s (attribute '%s' holds 0 to "
                                "%d)", op->schema.name, null ? n - EM__INTS_NULL : n,
                                strcmp(op->schema.attr_names[i], "dims") == 0 ? "dims"
                                                                               : "values",
                                null ? " as NULL" : "", op->schema.attr_names[i], EM_MAX_DIMS);
        }
        if (got == EM_ATTR_INT_LIST && (attrs[i].n < 0 || (attrs[i].n > 0 && !attrs[i].v.list)))
            return em_set_error(EM_ERR_INVALID, "%s: attribute '%s' lists %d values at %s",
                                op->schema.name, op->schema.attr_names[i], attrs[i].n,
                                attrs[i].v.list ? "a valid address" : "NULL");
        if (got == EM_ATTR_STRING && !attrs[i].v.s)
            return em_set_error(EM_ERR_INVALID, "%s: attribute '%s' is a NULL string",
                                op->schema.name, op->schema.attr_names[i]);
    }
    return EM_OK;
}

/* Append to a fixed buffer, never overflowing; n tracks the length wanted. */
static void append(char *buf, size_t cap, size_t *n, const char *s) {
    if (*n < cap) snprintf(buf + *n, cap - *n, "%s", s);
    *n += strlen(s);
}

static em_status no_kernel_error(const struct em_op *op, int devtype, em_dtype dt) {
    char list[512] = "";
    size_t n = 0;
    for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) {
        if (!em__device_types[d].used) continue;
        bool first = true;
        for (int t = 0; t < EM_DTYPE_COUNT; t++) {
            if (!op->top[d][t]) continue;
            if (first) {
                if (n) append(list, sizeof list, &n, "; ");
                append(list, sizeof list, &n, em__device_types[d].name);
                append(list, sizeof list, &n, " (");
            } else {
                append(list, sizeof list, &n, ", ");
            }
            append(list, sizeof list, &n, em_dtype_name((em_dtype)t));
            first = false;
        }
        if (!first) append(list, sizeof list, &n, ")");
    }
    /* Kernels registered for this device and dtype that all declined the call (their
     * supports() said no: oneDNN's bf16 kernels on a CPU below AVX-512, operands a kernel
     * does not take) are named, so the message does not read as "none registered". */
    char declined[256] = "";
    size_t nd = 0;
    for (const em_kernel *k = op->top[devtype][dt]; k; k = k->below) {
        append(declined, sizeof declined, &nd, nd ? ", " : " (registered but declining these operands: ");
        append(declined, sizeof declined, &nd, k->def.name ? k->def.name : "unnamed");
    }
    if (nd) append(declined, sizeof declined, &nd, ")");
    return em_set_error(EM_ERR_NOKERNEL, "%s: no kernel for device '%s' and dtype %s takes "
                        "this call%s; registered: %s%s", op->schema.name,
                        em__device_types[devtype].name, em_dtype_name(dt), declined,
                        n ? list : "none",
                        devtype != EM_DEVICE_CPU_TYPE && op->top[EM_DEVICE_CPU_TYPE][dt]
                            ? ". EMBER_FALLBACK=allow (or em_fallback_set) runs it on the CPU "
                              "with the data copied over"
                            : "");
}

/* Run kernel k on ctx: the placement counters (and its time when profiling), a failure
 * message naming the op and kernel when the kernel set none, and on success a version bump of
 * each output (absent list entries are NULL). Both call paths end here. */
static em_status run_kernel(const struct em_op *op, const em_kernel *k, em_kernel_ctx *ctx,
                            em_device dev, em_tensor *const *out, int n_out) {
    ctx->user = k->def.user;
    uint64_t t0 = cfg.profile ? em__now_ns() : 0;
    em_status st = k->def.fn(ctx);
    if (ctx->workspace) em__workspace_release(ctx);
    if (cfg.profile) {
        if (dev.type != EM_DEVICE_CPU_TYPE) em__device_ops(dev)->synchronize(dev.index);
        atomic_fetch_add_explicit(&place[dev.type].ns, em__now_ns() - t0, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&place[dev.type].ops, 1, memory_order_relaxed);
    if (st != EM_OK && (!em__error_pending() || em_last_status() != st))
        em_set_error(st, "%s: kernel %s failed: %s", op->schema.name, k->def.name,
                     em_status_str(st));
    for (int i = 0; st == EM_OK && i < n_out; i++)
        if (out[i]) atomic_fetch_add(&out[i]->storage->version, 1);
    return st;
}

static em_status run_on_cpu(const struct em_op *op, const em_tensor *const *in, int n_in,
                            const em_attr *attrs, em_tensor *const *out, int n_out, int devtype);

/* An output in which several elements share one memory location (a dim of size > 1 with stride
 * 0: an expanded view) would be written in an order-dependent way, a silent wrong answer:
 * refused, as PyTorch does. */
static em_status overlapping_output(const struct em_op *op, const em_tensor *t, int i) {
    int d = em__expanded_dim(t);
    if (d < 0) return EM_OK;
    char s[160];
    return em_set_error(EM_ERR_INVALID, "%s: output %d (shape %s) has stride 0 in dim %d: "
                        "more than one of its elements refers to the same memory location "
                        "(an expanded view); write into a clone() of it instead",
                        op->schema.name, i, em__shape_str(t->ndim, t->shape, s, sizeof s), d);
}

/* The elements t can reach, as a byte range of its storage. */
static void byte_range(const em_tensor *t, int64_t *lo, int64_t *hi) {
    int64_t a = t->offset, b = t->offset;
    for (int d = 0; d < t->ndim; d++) {
        int64_t span = (t->shape[d] - 1) * t->strides[d];
        if (span < 0) a += span;
        else b += span;
    }
    int64_t size = (int64_t)em_dtype_size(t->dtype);
    *lo = a * size;
    *hi = (b + 1) * size;
}

static bool same_geometry(const em_tensor *a, const em_tensor *b) {
    if (a->offset != b->offset || a->ndim != b->ndim || a->dtype != b->dtype) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->strides[d] != b->strides[d]))
            return false;
    return true;
}

/* An input that shares memory with an output without being exactly it (x[1:] += x[:-1],
 * x += x[0]) would be read after it was partly written: refused, as PyTorch does. */
static em_status partial_overlap(const struct em_op *op, const em_tensor *const *in, int n_in,
                                 const em_tensor *o, int j) {
    if (o->numel == 0) return EM_OK;
    for (int i = 0; i < n_in; i++) {
        const em_tensor *t = in[i];
        if (t->storage != o->storage || t->numel == 0 || same_geometry(t, o)) continue;
        int64_t a0, a1, b0, b1;
        byte_range(t, &a0, &a1);
        byte_range(o, &b0, &b1);
        if (a1 <= b0 || b1 <= a0) continue;
        return em_set_error(EM_ERR_INVALID, "%s: input %d and output %d share memory without "
                            "being the same elements (an in-place op reading another view of "
                            "what it writes); clone() the input first", op->schema.name, i, j);
    }
    return EM_OK;
}

static em_status list_op_error(const struct em_op *op) {
    return em_set_error(EM_ERR_INVALID, "%s: a list op (it updates lists of tensors); run it "
                        "with em_op_call_lists", op->schema.name);
}

static inline __attribute__((always_inline)) em_status
dispatch(struct em_op *op, const em_tensor *const *in, int n_in, const em_attr *attrs,
         em_tensor *const *out, int n_out, em_device dev, em_dtype key, em_ktensor *kin,
         em_ktensor *kout, uint64_t *ids, uint64_t *vers, em__forced *forced);

/* em_op_call_out's checks and dispatch; `forced` (em_op_call_at) runs the kernel at a depth of
 * the stack instead of the stack's choice. Inlined into its two callers, so the plain path, which passes NULL, is
 * compiled without the test (the kernel-stack API costs the ordinary call nothing). */
static inline __attribute__((always_inline)) em_status
call_out_impl(const em_op *cop, const em_tensor *const *in, int n_in, const em_attr *attrs,
              em_tensor *const *out, int n_out, em__forced *forced) {
    struct em_op *op = (struct em_op *)cop;
    if (!op) return em__error_pending() ? em_last_status()
                                        : em_set_error(EM_ERR_INVALID, "op_call: NULL op");
    if (op->schema.flags & EM_OP_LISTS) return list_op_error(op);
    bool var = op->schema.flags & EM_OP_VARIADIC;
    if ((var ? n_in < op->schema.n_inputs : n_in != op->schema.n_inputs) ||
        n_out != op->schema.n_outputs)
        return em_set_error(EM_ERR_INVALID, "%s: called with %d inputs and %d outputs; it takes "
                            "%s%d and %d", op->schema.name, n_in, n_out, var ? "at least " : "",
                            op->schema.n_inputs, op->schema.n_outputs);
    if (!em__check_inputs(op->schema.name, in, n_in) ||
        !em__check_inputs(op->schema.name, (const em_tensor *const *)out, n_out))
        return em_last_status();
    if (!attrs) attrs = no_attrs;
    if (op->schema.n_attrs && check_attrs(op, attrs) != EM_OK) return em_last_status();
    /* A fill (no inputs) checks its attributes against the output it writes. */
    if (n_in == 0 && op->schema.prepare &&
        op->schema.prepare(op, (const em_tensor *const *)out, n_out, attrs, NULL) != EM_OK)
        return em_last_status();
    for (int i = 0; i < n_out; i++)
        if (overlapping_output(op, out[i], i) != EM_OK ||
            partial_overlap(op, in, n_in, out[i], i) != EM_OK)
            return em_last_status();
    em_device dev = out[0]->storage->device;
    if (!(op->schema.flags & EM_OP_CROSS_DEVICE)) {
        for (int i = 0; i < n_in + n_out; i++) {
            const em_tensor *t = i < n_in ? in[i] : out[i - n_in];
            if (em_device_equal(t->storage->device, dev)) continue;
            char a[48], b[48];
            return em_set_error(EM_ERR_DEVICE, "%s: expected all tensors on the same device, "
                                "but %s %d is on %s and output 0 on %s", op->schema.name,
                                i < n_in ? "input" : "output", i < n_in ? i : i - n_in,
                                em_device_str(t->storage->device, a, sizeof a),
                                em_device_str(dev, b, sizeof b));
        }
    }
    em_dtype key = op->schema.dispatch_arg >= 0 ? in[op->schema.dispatch_arg]->dtype
                                                : out[0]->dtype;
    /* Up to 8 inputs on the stack (every op but a variadic one with more). */
    em_ktensor kin_stack[8], kout[4], *kin = kin_stack;
    uint64_t ids_stack[12], vers_stack[12], *ids = ids_stack, *vers = vers_stack;
    void *heap = NULL;
    if (n_in > 8) {
        size_t n = (size_t)(n_in + n_out);
        if (!(heap = em__malloc(n * (sizeof *kin + 2 * sizeof *ids), "variadic op call")))
            return EM_ERR_NOMEM;
        kin = heap;
        ids = (uint64_t *)(kin + n_in);
        vers = ids + n;
    }
    em_status st = dispatch(op, in, n_in, attrs, out, n_out, dev, key, kin, kout, ids, vers,
                            forced);
    em__free(heap);
    return st;
}

static em_status call_out(const em_op *cop, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_tensor *const *out, int n_out) {
    return call_out_impl(cop, in, n_in, attrs, out, n_out, NULL);
}

/* Convert every tensor of a call to the plain layout (in place: values, versions and data
 * pointers stay), for a kernel that does not read the layouts its storages are in. */
static em_status plain_all(const em_tensor *const *in, int n_in, em_tensor *const *out,
                           int n_out) {
    for (int i = 0; i < n_in + n_out; i++) {
        const em_tensor *t = i < n_in ? in[i] : out[i - n_in];
        if (t && em__to_plain(t) != EM_OK) return em_last_status();
    }
    return EM_OK;
}

/* em_op_call_out past its checks: kernel views, the kernel stack, autograd. */
static inline __attribute__((always_inline)) em_status
dispatch(struct em_op *op, const em_tensor *const *in, int n_in, const em_attr *attrs,
         em_tensor *const *out, int n_out, em_device dev, em_dtype key, em_ktensor *kin,
         em_ktensor *kout, uint64_t *ids, uint64_t *vers, em__forced *forced) {
    unsigned layouts = 0; /* bit per storage layout among the call's tensors */
    for (int i = 0; i < n_in + n_out; i++) {
        const em_tensor *t = i < n_in ? in[i] : out[i - n_in];
        em__ktensor_fill(i < n_in ? &kin[i] : &kout[i - n_in], t);
        ids[i] = em__storage_id(t);
        vers[i] = atomic_load_explicit(&t->storage->version, memory_order_acquire);
        layouts |= 1u << em__layout_of(t);
    }
    em_stream *s = em__stream_current(dev);
    em_exec_ctx *x = em__exec_get(dev, s);
    if (!x) return em_last_status();
    em_kernel_ctx ctx = {.struct_size = sizeof ctx, .op = op, .device = dev, .n_in = n_in,
                         .storage_ids = ids, .versions = vers, .stream = s, .exec = x,
                         .n_out = n_out, .in = kin, .out = kout, .attrs = attrs};
    /* Storage layouts (em_layout): the kernel chosen must declare every one among the call's
     * tensors, or they are all converted to plain and the choice made again. */
    unsigned need = layouts & ~1u;
    uint8_t lays[16];
    if (need && n_in + n_out <= 16) {
        for (int i = 0; i < n_in + n_out; i++)
            lays[i] = (uint8_t)em__layout_of(i < n_in ? in[i] : out[i - n_in]);
        ctx.layouts = lays;
    } else if (need) {
        if (plain_all(in, n_in, out, n_out) != EM_OK) return em_last_status();
        need = 0;
    }
    em_kernel *k;
choose:
    k = op->top[dev.type][key];
    if (forced) {
        /* em_op_call_at: the kernel `depth` below the top of this call's stack. */
        size_t d = forced->depth, have = 0;
        for (const em_kernel *j = k; j; j = j->below) have++;
        while (k && d--) k = k->below;
        if (!k)
            return em_set_error(EM_ERR_RANGE, "%s: the %s %s kernel stack has %zu kernel(s); "
                                "there is none at depth %zu", op->schema.name,
                                em__device_types[dev.type].name, em_dtype_name(key), have,
                                forced->depth);
        forced->used = k;
        if (k->def.supports && !(ctx.user = k->def.user, k->def.supports(&ctx)))
            return em_set_error(EM_ERR_NOKERNEL, "%s: kernel %s declines this call (its "
                                "supports() returned false)", op->schema.name, k->def.name);
    }
    /* supports() sees the kernel's own user pointer, as its fn does. */
    while (!forced && k && k->def.supports && !(ctx.user = k->def.user, k->def.supports(&ctx)))
        k = k->below;
    if (need && (!k || (k->def.accepts_layouts & need) != need)) {
        if (plain_all(in, n_in, out, n_out) != EM_OK) return em_last_status();
        need = 0;
        ctx.layouts = NULL;
        goto choose;
    }
    if (!k && (dev.type == EM_DEVICE_CPU_TYPE || cfg.fallback == EM_FALLBACK_ERROR ||
               !op->top[EM_DEVICE_CPU_TYPE][key] || n_in > 8))
        return no_kernel_error(op, dev.type, key);
    em__node *node = NULL;
    em_status st = em__autograd_pre(op, in, n_in, attrs, out, n_out, &node);
    if (st != EM_OK) return st;
    if (!k) {
        st = run_on_cpu(op, in, n_in, attrs, out, n_out, dev.type);
    } else {
        st = run_kernel(op, k, &ctx, dev, out, n_out);
    }
    if (st != EM_OK) {
        em__autograd_post(node, out, n_out, false);
        return st;
    }
    if (em_grad_mode_get() == EM_GRAD_INFERENCE)
        for (int i = 0; i < n_out; i++) out[i]->inference = true;
    st = em__autograd_post(node, out, n_out, true);
    if (st == EM_OK && em__anomaly_on()) st = em__anomaly_check_forward(op, in, n_in, out, n_out);
    return st;
}

/* The fallback: copy inputs to the CPU, run there, copy the outputs back. */
static em_status run_on_cpu(const struct em_op *op, const em_tensor *const *in, int n_in,
                            const em_attr *attrs, em_tensor *const *out, int n_out, int devtype) {
    if (cfg.fallback == EM_FALLBACK_WARN && !atomic_exchange(&((struct em_op *)op)->warned[devtype], true))
        em_log_write(EM_LOG_WARN, "%s: no kernel on device type '%s'; running it on the CPU with its "
               "data copied over (slow; shown once)", op->schema.name,
               em__device_types[devtype].name);
    em_tensor *cin[8] = {0}, *cout[4] = {0};
    em_status st = EM_OK;
    em_grad_mode_push(EM_GRAD_DISABLED); /* the caller records the op itself */
    for (int i = 0; i < n_in && st == EM_OK; i++)
        if (!(cin[i] = em__to_device(in[i], em_cpu()))) st = em_last_status();
    for (int i = 0; i < n_out && st == EM_OK; i++) {
        cout[i] = em__empty(out[i]->ndim, out[i]->shape, out[i]->dtype, em_cpu());
        /* In-place ops read their output: start from its current contents. */
        if (!cout[i] || em_copy_(cout[i], out[i]) != EM_OK) st = em_last_status();
    }
    if (st == EM_OK) st = em_op_call_out(op, (const em_tensor *const *)cin, n_in, attrs, cout, n_out);
    for (int i = 0; i < n_out && st == EM_OK; i++) st = em_copy_(out[i], cout[i]);
    for (int i = 0; i < n_in; i++) em_tensor_release(cin[i]);
    for (int i = 0; i < n_out; i++) em_tensor_release(cout[i]);
    em_grad_mode_pop();
    if (st == EM_OK) {
        em__obs_note_fallback();
        atomic_fetch_add(&place[devtype].fallbacks, 1);
        atomic_fetch_add(&((struct em_op *)op)->fallbacks[devtype], 1);
    }
    return st;
}

/* ---- list ops -------------------------------------------------------------------------------- */

bool em_op_has_kernel(const em_op *op, em_device dev, em_dtype dtype) {
    return op && dev.type >= 0 && dev.type < EM_MAX_DEVICE_TYPES && em_dtype_is_valid(dtype) &&
           op->top[dev.type][dtype] != NULL;
}

/* "input list 'grads'" / "output list 1" for messages. */
static const char *list_name(const struct em_op *op, int list, char *buf, size_t cap) {
    int n_in = op->schema.n_inputs;
    if (list < n_in && op->schema.input_names)
        snprintf(buf, cap, "input list '%s'", op->schema.input_names[list]);
    else if (list < n_in)
        snprintf(buf, cap, "input list %d", list);
    else
        snprintf(buf, cap, "output list %d", list - n_in);
    return buf;
}

/* Checks one list of a list call (see em_op_call_lists); the references are tensors j of
 * output list 0 (ref). */
static em_status check_list(const struct em_op *op, int l, const em_tensor *const *ts,
                            const em_tensor *const *ref, int count, em_device dev, bool key,
                            bool scalar) {
    const char *name = op->schema.name;
    char lb[64], a[160], b[160], d0[48], d1[48];
    bool absent = ts[0] == NULL;
    if (absent && key)
        return em_set_error(EM_ERR_INVALID, "%s: %s picks the kernel and cannot be NULL",
                            name, list_name(op, l, lb, sizeof lb));
    for (int j = 0; j < count; j++) {
        const em_tensor *t = ts[j];
        if (absent != (t == NULL))
            return em_set_error(EM_ERR_INVALID, "%s: tensor %d of %s is %s; a list is all "
                                "tensors, or all NULL where the op allows it", name, j,
                                list_name(op, l, lb, sizeof lb), t ? "given" : "NULL");
        if (!t) continue;
        if (!em_device_equal(t->storage->device, dev))
            return em_set_error(EM_ERR_DEVICE, "%s: expected all tensors on one device, but "
                                "tensor %d of %s is on %s and tensor 0 of output list 0 on %s",
                                name, j, list_name(op, l, lb, sizeof lb),
                                em_device_str(t->storage->device, d0, sizeof d0),
                                em_device_str(dev, d1, sizeof d1));
        if (scalar && t->ndim != 0)
            return em_set_error(EM_ERR_SHAPE, "%s: tensor %d of %s has shape %s; that list "
                                "holds 0-dim tensors", name, j, list_name(op, l, lb, sizeof lb),
                                em__shape_str(t->ndim, t->shape, a, sizeof a));
        if (!scalar && (t->ndim != ref[j]->ndim ||
            memcmp(t->shape, ref[j]->shape, sizeof(int64_t) * (size_t)t->ndim) != 0))
            return em_set_error(EM_ERR_SHAPE, "%s: tensor %d of %s has shape %s but tensor %d "
                                "of output list 0 has shape %s", name, j,
                                list_name(op, l, lb, sizeof lb),
                                em__shape_str(t->ndim, t->shape, a, sizeof a), j,
                                em__shape_str(ref[j]->ndim, ref[j]->shape, b, sizeof b));
        if (key && t->dtype != ts[0]->dtype)
            return em_set_error(EM_ERR_DTYPE, "%s: the tensors of %s must share one dtype (it "
                                "picks the kernel): tensor 0 is %s, tensor %d %s", name,
                                list_name(op, l, lb, sizeof lb), em_dtype_name(ts[0]->dtype), j,
                                em_dtype_name(t->dtype));
    }
    return EM_OK;
}

/* Kernel views of the tensors live on the stack for calls up to this many tensors. */
#define LIST_STACK_TENSORS 48

static em_status call_lists(const em_op *cop, int count, const em_tensor *const *in,
                            const em_attr *attrs, em_tensor *const *out) {
    const struct em_op *op = cop;
    if (!op) return em__error_pending() ? em_last_status()
                                        : em_set_error(EM_ERR_INVALID, "op_call_lists: NULL op");
    const char *name = op->schema.name;
    if (!(op->schema.flags & EM_OP_LISTS))
        return em_set_error(EM_ERR_INVALID, "%s: not a list op; run it with em_op_call", name);
    int n_in = op->schema.n_inputs, n_out = op->schema.n_outputs, n_lists = n_in + n_out;
    if (count < 0 || (count > 0 && (!out || (n_in > 0 && !in))))
        return em_set_error(EM_ERR_INVALID, "%s: bad list call (count %d, inputs %s, outputs "
                            "%s)", name, count, in ? "given" : "NULL", out ? "given" : "NULL");
    if (count == 0) return EM_OK;
    if (!attrs) attrs = no_attrs;
    if (op->schema.n_attrs && check_attrs(op, attrs) != EM_OK) return em_last_status();
    /* Output list 0 gives the shapes and the device: every entry must be there. */
    if (!em__check_inputs(name, (const em_tensor *const *)out, count)) return em_last_status();
    em_device dev = out[0]->storage->device;
    int key_list = op->schema.dispatch_arg >= 0 ? op->schema.dispatch_arg : n_in;
    const em_tensor *const *ref = (const em_tensor *const *)out;
    for (int l = 0; l < n_lists; l++) {
        const em_tensor *const *ts = l < n_in ? in + (size_t)l * (size_t)count
                                              : ref + (size_t)(l - n_in) * (size_t)count;
        bool scalar = ((op->schema.flags & EM_OP_LISTS_SCALAR_OUT) && l == n_lists - 1 &&
                       n_out > 1) ||
                      ((op->schema.flags & EM_OP_LISTS_SCALAR_IN) && l == n_in - 1 && n_in > 1);
        if (check_list(op, l, ts, ref, count, dev, l == key_list, scalar) != EM_OK)
            return em_last_status();
    }
    em_dtype key = (key_list < n_in ? in[(size_t)key_list * (size_t)count] : out[0])->dtype;
    em_kernel *k = op->top[dev.type][key];
    size_t nk = (size_t)n_lists * (size_t)count;
    em_ktensor stack[LIST_STACK_TENSORS], *kt = stack;
    if (nk > LIST_STACK_TENSORS && !(kt = em__malloc(nk * sizeof *kt, "list op tensors")))
        return EM_ERR_NOMEM;
    for (size_t i = 0; i < nk; i++) {
        size_t n_in_all = (size_t)n_in * (size_t)count;
        const em_tensor *t = i < n_in_all ? in[i] : out[i - n_in_all];
        /* No list kernel reads a storage layout (em_layout): those tensors go plain. */
        if (t && em__layout_of(t) && em__to_plain(t) != EM_OK) {
            if (kt != stack) em__free(kt);
            return em_last_status();
        }
        if (t) em__ktensor_fill(&kt[i], t);
        else memset(&kt[i], 0, sizeof kt[i]);
    }
    em_stream *s = em__stream_current(dev);
    em_exec_ctx *x = em__exec_get(dev, s);
    em_kernel_ctx ctx = {.struct_size = sizeof ctx, .op = op, .device = dev,
                         .n_in = n_in * count, .n_out = n_out * count, .in = kt,
                         .out = kt + (size_t)n_in * (size_t)count, .attrs = attrs,
                         .stream = s, .exec = x};
    if (!x) k = NULL;
    while (k && k->def.supports && !(ctx.user = k->def.user, k->def.supports(&ctx))) k = k->below;
    em_status st;
    if (!x) {
        st = em_last_status();
    } else if (!k) {
        st = no_kernel_error(op, dev.type, key);
    } else {
        st = run_kernel(op, k, &ctx, dev, out, n_out * count);
    }
    if (kt != stack) em__free(kt);
    return st;
}

/* PyTorch's result_type: dimensioned tensors decide within a category; 0-dim tensors only
 * raise the category (int tensor + 0-dim double -> double, float tensor + 0-dim double ->
 * float). */
static int category(em_dtype t) { return t == EM_BOOL ? 0 : em_dtype_is_floating(t) ? 2 : 1; }
static em_dtype combine(int have_hi, em_dtype hi, int have_lo, em_dtype lo) {
    if (!have_hi) return lo;
    if (!have_lo) return hi;
    if (category(hi) == 2) return hi;
    if (hi == EM_BOOL || category(lo) == 2) return em_dtype_promote(hi, lo);
    return hi;
}
em_dtype em__result_type(const em_tensor *const *in, int n) {
    int have_dim = 0, have_zero = 0;
    em_dtype dim = EM_BOOL, zero = EM_BOOL;
    for (int i = 0; i < n; i++) {
        if (in[i]->ndim > 0) {
            dim = have_dim ? em_dtype_promote(dim, in[i]->dtype) : in[i]->dtype;
            have_dim = 1;
        } else {
            zero = have_zero ? em_dtype_promote(zero, in[i]->dtype) : in[i]->dtype;
            have_zero = 1;
        }
    }
    return combine(have_dim, dim, have_zero, zero);
}

static bool same_shape(const em_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->shape[d] != shape[d]) return false;
    return true;
}

/* The dtypes the inputs are converted to under op's policy (flags) and prepare hook. */
static em_status apply_policy(const struct em_op *op, const em_tensor *const *in, int n_in,
                              const em_attr *attrs, em_dtype *dts) {
    unsigned f = op->schema.flags;
    for (int i = 0; i < n_in; i++) dts[i] = in[i]->dtype;
    if (f & EM_OP_PROMOTE) {
        em_dtype rt = em__result_type(in, n_in);
        for (int i = 0; i < n_in; i++) dts[i] = rt;
    }
    if (f & EM_OP_FLOAT_RESULT)
        for (int i = 0; i < n_in; i++)
            if (!em_dtype_is_floating(dts[i])) dts[i] = EM_F32;
    if (f & EM_OP_FLOATING)
        for (int i = 0; i < n_in; i++)
            if (!em_dtype_is_floating(dts[i]))
                return em_set_error(EM_ERR_DTYPE, "%s: expected a floating tensor, got %s",
                                    op->schema.name, em_dtype_name(dts[i]));
    return op->schema.prepare ? op->schema.prepare(op, in, n_in, attrs, dts) : EM_OK;
}

static bool needs_policy(const struct em_op *op, const em_tensor *const *in, int n_in) {
    unsigned f = op->schema.flags;
    if (op->schema.prepare || (f & (EM_OP_FLOAT_RESULT | EM_OP_FLOATING))) return true;
    if (!(f & EM_OP_PROMOTE)) return false;
    for (int i = 1; i < n_in; i++)
        if (in[i]->dtype != in[0]->dtype) return true; /* one dtype: the result type is it */
    return false;
}

static em_status count_error(const struct em_op *op, int n_in) {
    bool var = op->schema.flags & EM_OP_VARIADIC;
    return em_set_error(EM_ERR_INVALID, "%s: called with %d inputs; it takes %s%d%s",
                        op->schema.name, n_in, var ? "at least " : "", op->schema.n_inputs,
                        op->schema.n_inputs || op->schema.composite
                            ? "" : " (ops without inputs run through em_op_call_out)");
}

/* Fill t with the poison of EM_CALL_POISON: NaN for floating dtypes, 0xA5 bytes otherwise. */
static em_status poison(em_tensor *t) {
    size_t n = (size_t)t->numel, es = em_dtype_size(t->dtype);
    if (!n) return EM_OK;
    unsigned char *b = em__malloc(n * es, "poisoned output");
    if (!b) return EM_ERR_NOMEM;
    memset(b, 0xA5, n * es);
    if (em_dtype_is_floating(t->dtype))
        for (size_t i = 0; i < n; i++) em_dtype_store(t->dtype, b, (int64_t)i, NAN);
    em_status st = EM_OK;
    /* Every element gets the same bytes: a storage layout needs no conversion first. */
    if (em__layout_of(t) || em_tensor_is_contiguous(t)) {
        st = em__device_copy(t->storage->device, em__tensor_bytes(t), em_cpu(), b, n * es);
    } else {
        em_tensor *src = em__empty(t->ndim, t->shape, t->dtype, t->storage->device);
        st = src ? em__device_copy(t->storage->device, em_tensor_data(src), em_cpu(), b, n * es)
                 : em_last_status();
        if (st == EM_OK) st = em_copy_(t, src);
        em_tensor_release(src);
    }
    em__free(b);
    return st;
}

/* A caller-made output of em_op_call_at: the inferred shape and dtype, on the device. */
static em_status given_output(const struct em_op *op, const em_tensor *t, int i,
                              const em_tensor_meta *m, em_device dev) {
    if (t->dtype == m->dtype && same_shape(t, m->ndim, m->shape) &&
        em_device_equal(t->storage->device, dev))
        return EM_OK;
    char a[160], b[160];
    return em_set_error(EM_ERR_SHAPE, "%s: output %d given as %s %s; the call makes %s %s",
                        op->schema.name, i, em_dtype_name(t->dtype),
                        em__shape_str(t->ndim, t->shape, a, sizeof a), em_dtype_name(m->dtype),
                        em__shape_str(m->ndim, m->shape, b, sizeof b));
}

/* Inference, policy and kernel of op (no composite): em_op_call's path for kernel ops. */
static em_status op_run_n(const struct em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_tensor **out, em_tensor **held,
                          em_tensor **bcast, const em_tensor **args);

static em_status op_run(const struct em_op *op, const em_tensor *const *in, int n_in,
                        const em_attr *attrs, em_tensor **out) {
    bool var = op->schema.flags & EM_OP_VARIADIC;
    if ((var ? n_in < op->schema.n_inputs : n_in != op->schema.n_inputs) || n_in < 1)
        return count_error(op, n_in);
    if (n_in <= 8) {
        em_tensor *held[8] = {0}, *bcast[8] = {0};
        const em_tensor *args[8];
        return op_run_n(op, in, n_in, attrs, out, held, bcast, args);
    }
    /* A variadic op with more than 8 inputs: its scratch on the heap. */
    void **scratch = em__calloc(3 * (size_t)n_in, sizeof *scratch, "variadic op call");
    if (!scratch) return EM_ERR_NOMEM;
    em_status st = op_run_n(op, in, n_in, attrs, out, (em_tensor **)scratch,
                            (em_tensor **)scratch + n_in, (const em_tensor **)scratch + 2 * n_in);
    em__free(scratch);
    return st;
}

/* op_run_n's body; `forced` and `given` (em_op_call_at: the kernel to run, caller-made
 * outputs) are NULL on the plain path, which is compiled without them (always inlined). */
static inline __attribute__((always_inline)) em_status
op_run_n_impl(const struct em_op *op, const em_tensor *const *in, int n_in,
              const em_attr *attrs, em_tensor **out, em_tensor **held, em_tensor **bcast,
              const em_tensor **args, em__forced *forced, em_tensor *const *given) {
    if (!em__check_inputs(op->schema.name, in, n_in)) return em_last_status();
    if (!attrs) attrs = no_attrs;
    if (op->schema.n_attrs && check_attrs(op, attrs) != EM_OK) return em_last_status();
    em_device dev = in[0]->storage->device;
    if (!(op->schema.flags & EM_OP_CROSS_DEVICE))
        for (int i = 1; i < n_in; i++) {
            if (em_device_equal(in[i]->storage->device, dev)) continue;
            char a[48], b[48];
            return em_set_error(EM_ERR_DEVICE, "%s: expected all tensors on the same device, "
                                "but input 0 is on %s and input %d on %s", op->schema.name,
                                em_device_str(dev, a, sizeof a), i,
                                em_device_str(in[i]->storage->device, b, sizeof b));
        }
    em_tensor *res[4] = {0};
    em_status st = EM_OK;
    for (int i = 0; i < n_in; i++) args[i] = in[i];
    if (needs_policy(op, in, n_in)) {
        em_dtype dts_stack[8], *dts = dts_stack;
        if (n_in > 8 && !(dts = em__malloc(sizeof *dts * (size_t)n_in, "variadic op call")))
            return EM_ERR_NOMEM;
        st = apply_policy(op, in, n_in, attrs, dts);
        for (int i = 0; i < n_in && st == EM_OK; i++)
            if (in[i]->dtype != dts[i]) {
                if (!(held[i] = em__to_dtype(in[i], dts[i]))) st = em_last_status();
                args[i] = held[i];
            }
        if (dts != dts_stack) em__free(dts);
    }
    em_tensor_meta meta[4]; /* zeroed for the outputs infer fills (one memset of all four
                               showed up in profiles of tiny ops) */
    for (int i = 0; i < op->schema.n_outputs; i++) meta[i] = (em_tensor_meta){0};
    if (st == EM_OK) st = op->schema.infer(op, args, attrs, meta);
    if (st == EM_OK && (op->schema.flags & EM_OP_BROADCAST))
        for (int i = 0; i < n_in && st == EM_OK; i++) {
            /* An input that already has the result's shape is used as it is: expanding it
             * would make a view with the same geometry. */
            if (same_shape(args[i], meta[0].ndim, meta[0].shape)) continue;
            if (!(bcast[i] = em__expand(args[i], meta[0].ndim, meta[0].shape))) st = em_last_status();
            args[i] = bcast[i];
        }
    /* EM_OP_CHANNELS_LAST: the outputs take the layout of input layout_arg */
    const em_tensor *lay = (op->schema.flags & EM_OP_CHANNELS_LAST) ? args[op->schema.layout_arg]
                                                                   : NULL;
    const bool cl = lay && em__is_channels_last(lay->ndim, lay->shape, lay->strides);
    /* ... and its storage layout, or the thread's preferred one for a plain input, when the
     * top kernel for the call declares it (a kernel below it that does not gets them
     * converted: dispatch). */
    int want = 0;
    if (lay && st == EM_OK && ((want = em__layout_of(lay)) || (want = em__layout_preferred()))) {
        em_dtype kd = op->schema.dispatch_arg >= 0 ? args[op->schema.dispatch_arg]->dtype
                                                   : meta[0].dtype;
        const em_kernel *top = op->top[dev.type][kd];
        if (!top || !(top->def.accepts_layouts >> want & 1u)) want = 0;
    }
    for (int i = 0; i < op->schema.n_outputs && st == EM_OK; i++) {
        bool blk = want && em__layout_fits(meta[i].ndim, meta[i].shape, dev, (em_layout)want);
        if (given && given[i]) {
            if ((st = given_output(op, given[i], i, &meta[i], dev)) == EM_OK)
                res[i] = em_tensor_retain(given[i]);
        } else if (!(res[i] = cl && meta[i].ndim == 4 && !blk
                                  ? em__empty_channels_last(meta[i].shape, meta[i].dtype, dev)
                                  : em__empty(meta[i].ndim, meta[i].shape, meta[i].dtype, dev))) {
            st = em_last_status();
        } else if (blk) {
            em__set_layout(res[i], (em_layout)want);
        }
        if (st == EM_OK && forced && forced->poison) st = poison(res[i]);
    }
    if (st == EM_OK)
        st = forced ? call_out_impl(op, args, n_in, attrs, res, op->schema.n_outputs, forced)
                    : call_out(op, args, n_in, attrs, res, op->schema.n_outputs);
    for (int i = 0; i < n_in; i++) {
        em_tensor_release(held[i]);
        em_tensor_release(bcast[i]);
    }
    for (int i = 0; i < op->schema.n_outputs; i++) {
        if (st == EM_OK) out[i] = res[i];
        else em_tensor_release(res[i]);
    }
    return st;
}

static em_status op_run_n(const struct em_op *op, const em_tensor *const *in, int n_in,
                          const em_attr *attrs, em_tensor **out, em_tensor **held,
                          em_tensor **bcast, const em_tensor **args) {
    return op_run_n_impl(op, in, n_in, attrs, out, held, bcast, args, NULL, NULL);
}

/* A composite's call: the checks every call gets, then its hook. */
static em_status composite_run(const struct em_op *op, const em_tensor *const *in, int n_in,
                               const em_attr *attrs, em_tensor **out, int cap_out,
                               int *n_out) {
    *n_out = 0;
    bool var = op->schema.flags & EM_OP_VARIADIC;
    if (var && (n_in < op->schema.n_inputs || (n_in > 0 && !in)))
        return op->schema.n_inputs == 1
                   ? em_set_error(EM_ERR_INVALID, "%s: expected a non-empty list of tensors, "
                                  "got %d", op->schema.name, n_in)
                   : em_set_error(EM_ERR_INVALID, "%s: expected a list of at least %d "
                                  "tensors, got %d", op->schema.name, op->schema.n_inputs, n_in);
    if (n_in < 0 || (!var && n_in != op->schema.n_inputs) || (n_in > 0 && !in))
        return count_error(op, n_in);
    for (int i = 0; i < n_in; i++) {
        if (in[i] || (i < 32 && (op->schema.optional_inputs >> i & 1u))) continue;
        if (!em__error_pending())
            em_set_error(EM_ERR_INVALID, "%s: input %d is NULL", op->schema.name, i);
        return em_last_status();
    }
    if (!attrs) attrs = no_attrs;
    if (op->schema.n_attrs && check_attrs(op, attrs) != EM_OK) return em_last_status();
    int n = 0;
    em_status st = op->schema.composite(op, in, n_in, attrs, out, cap_out, &n);
    /* On EM_ERR_RANGE (out too small) a variadic-output composite reports the count needed. */
    if (st == EM_OK || (st == EM_ERR_RANGE && (op->schema.flags & EM_OP_VARIADIC_OUTPUTS)))
        *n_out = n;
    return st;
}

/* The checks both call paths make first: an op (a failed em_op_find's error passes through),
 * somewhere to put the outputs, and not a list op (those take em_op_call_lists). */
static inline em_status call_check(const struct em_op *op, em_tensor **out) {
    if (!op) return em__error_pending() ? em_last_status()
                                        : em_set_error(EM_ERR_INVALID, "op_call: NULL op");
    if (!out) return em_set_error(EM_ERR_INVALID, "%s: NULL out", op->schema.name);
    if (op->schema.flags & EM_OP_LISTS) return list_op_error(op);
    return EM_OK;
}

static em_status op_call(const em_op *cop, const em_tensor *const *in, int n_in,
                         const em_attr *attrs, em_tensor **out) {
    const struct em_op *op = cop;
    em_status st = call_check(op, out);
    if (st != EM_OK) return st;
    if (op->schema.composite) {
        if (op->schema.flags & EM_OP_VARIADIC_OUTPUTS)
            return em_set_error(EM_ERR_INVALID, "%s: its number of outputs depends on the "
                                "call; run it with em_op_call_n", op->schema.name);
        int n;
        return composite_run(op, in, n_in, attrs, out, op->schema.n_outputs, &n);
    }
    return op_run(op, in, n_in, attrs, out);
}

em_status em_op_call(const em_op *op, const em_tensor *const *in, int n_in,
                     const em_attr *attrs, em_tensor **out) {
    em_status st = em__op_call(op, in, n_in, attrs, out);
    if (st == EM_OK)
        for (int i = 0; i < op->schema.n_outputs; i++) em__scope_track(out[i]);
    return st;
}

static em_status op_call_n(const em_op *cop, const em_tensor *const *in, int n_in,
                           const em_attr *attrs, em_tensor **out, int cap_out, int *n_out) {
    const struct em_op *op = cop;
    if (n_out) *n_out = 0;
    if (!op) return em__error_pending() ? em_last_status()
                                        : em_set_error(EM_ERR_INVALID, "op_call: NULL op");
    bool query = !out && cap_out == 0 && (op->schema.flags & EM_OP_VARIADIC_OUTPUTS);
    if ((!out && !query) || !n_out || cap_out < 0)
        return em_set_error(EM_ERR_INVALID, "%s: NULL out or n_out, or a negative capacity",
                            op->schema.name);
    if (op->schema.flags & EM_OP_LISTS) return list_op_error(op);
    if (op->schema.composite) return composite_run(op, in, n_in, attrs, out, cap_out, n_out);
    if (cap_out < op->schema.n_outputs)
        return em_set_error(EM_ERR_RANGE, "%s: it has %d outputs; out has room for %d",
                            op->schema.name, op->schema.n_outputs, cap_out);
    em_status st = op_run(op, in, n_in, attrs, out);
    if (st == EM_OK) *n_out = op->schema.n_outputs;
    return st;
}

em_status em_op_call_n(const em_op *op, const em_tensor *const *in, int n_in,
                       const em_attr *attrs, em_tensor **out, int cap_out, int *n_out) {
    em_status st = em__op_call_n(op, in, n_in, attrs, out, cap_out, n_out);
    if (st == EM_OK && out)
        for (int i = 0; i < *n_out; i++) em__scope_track(out[i]);
    return st;
}

em_status em_op_call_kernel(const em_op *op, const em_tensor *const *in, int n_in,
                            const em_attr *attrs, em_tensor **out) {
    em_status st = em__op_call_kernel(op, in, n_in, attrs, out);
    if (st == EM_OK)
        for (int i = 0; i < op->schema.n_outputs; i++) em__scope_track(out[i]);
    return st;
}

/* op_run with em_op_call_at's choice of kernel (and caller-made outputs, `given`). */
static em_status run_forced(const struct em_op *op, const em_tensor *const *in, int n_in,
                            const em_attr *attrs, em_tensor **out, em__forced *f,
                            em_tensor *const *given) {
    bool var = op->schema.flags & EM_OP_VARIADIC;
    if ((var ? n_in < op->schema.n_inputs : n_in != op->schema.n_inputs) || n_in < 1 ||
        n_in > 8)
        return n_in > 8 ? em_set_error(EM_ERR_INVALID, "%s: op_call_at takes at most 8 "
                                       "inputs, got %d", op->schema.name, n_in)
                        : count_error(op, n_in);
    em_tensor *held[8] = {0}, *bcast[8] = {0};
    const em_tensor *args[8];
    return op_run_n_impl(op, in, n_in, attrs, out, held, bcast, args, f, given);
}

em_status em_op_call_at(const em_op *cop, size_t depth, unsigned flags,
                        const em_tensor *const *in, int n_in, const em_attr *attrs,
                        em_tensor **out, int cap_out, int *n_out, const em_kernel **kernel) {
    if (n_out) *n_out = 0;
    if (kernel) *kernel = NULL;
    const struct em_op *op = cop;
    em_status st = call_check(op, out);
    if (st != EM_OK) return st;
    if (!n_out) return em_set_error(EM_ERR_INVALID, "%s: NULL n_out", op->schema.name);
    if (!op->schema.infer)
        return em_set_error(EM_ERR_INVALID, "%s: a composite without a kernel of its own",
                            op->schema.name);
    if (cap_out < op->schema.n_outputs)
        return em_set_error(EM_ERR_RANGE, "%s: it has %d outputs; out has room for %d",
                            op->schema.name, op->schema.n_outputs, cap_out);
    em__forced forced = {.op = op, .depth = depth, .poison = flags & EM_CALL_POISON};
    if (n_in == 0 && op->schema.n_inputs == 0) {
        /* A fill writes into the outputs the caller made, as em_op_call_out. */
        for (int i = 0; i < op->schema.n_outputs; i++)
            if (!out[i])
                return em_set_error(EM_ERR_INVALID, "%s: an op without inputs writes into "
                                    "outputs the caller makes; output %d is NULL",
                                    op->schema.name, i);
        for (int i = 0; forced.poison && i < op->schema.n_outputs; i++)
            if ((st = poison(out[i])) != EM_OK) return st;
        st = call_out_impl(op, in, 0, attrs, out, op->schema.n_outputs, &forced);
        if (kernel) *kernel = forced.used;
        if (st == EM_OK) *n_out = op->schema.n_outputs;
        return st;
    }
    em_tensor *given[4] = {0};
    for (int i = 0; i < op->schema.n_outputs; i++) given[i] = out[i];
    if (op->schema.composite) {
        /* The composite runs as it does for every call; its own kernel call takes the choice. */
        for (int i = 0; i < op->schema.n_outputs; i++)
            if (given[i])
                return em_set_error(EM_ERR_INVALID, "%s: a composite makes its own outputs; "
                                    "pass NULL entries", op->schema.name);
        em__forced *outer = tls_forced;
        tls_forced = &forced;
        atomic_fetch_add(&forcing, 1);
        int n = 0;
        st = op_call_n(op, in, n_in, attrs, out, cap_out, &n);
        atomic_fetch_sub(&forcing, 1);
        tls_forced = outer;
        if (kernel) *kernel = forced.used;
        if (st != EM_OK) return st;
        *n_out = n;
        for (int i = 0; i < n; i++) em__scope_track(out[i]);
        return EM_OK;
    }
    st = run_forced(op, in, n_in, attrs, out, &forced, given);
    if (kernel) *kernel = forced.used;
    if (st != EM_OK) {
        for (int i = 0; i < op->schema.n_outputs; i++) out[i] = given[i];
        return st;
    }
    *n_out = op->schema.n_outputs;
    for (int i = 0; i < *n_out; i++) em__scope_track(out[i]);
    return EM_OK;
}

static em_status op_call_kernel(const em_op *cop, const em_tensor *const *in, int n_in,
                                const em_attr *attrs, em_tensor **out) {
    const struct em_op *op = cop;
    em_status st = call_check(op, out);
    if (st != EM_OK) return st;
    if (!op->schema.infer)
        return em_set_error(EM_ERR_INVALID, "%s: a composite without a kernel of its own",
                            op->schema.name);
    em__forced *f = atomic_load_explicit(&forcing, memory_order_relaxed) ? tls_forced : NULL;
    if (f && f->op == op) return run_forced(op, in, n_in, attrs, out, f, NULL);
    return op_run(op, in, n_in, attrs, out);
}

em_tensor *em__op1(const em_op *op, const em_tensor *const *in, int n_in, const em_attr *attrs) {
    em_tensor *out[4] = {0};
    if (em__op_call(op, in, n_in, attrs, out) != EM_OK) return NULL;
    for (int i = 1; i < 4; i++) em_tensor_release(out[i]);
    return out[0];
}

em_tensor *em__kernel1(const em_op *op, const em_tensor *const *in, int n_in,
                       const em_attr *attrs) {
    em_tensor *out[4] = {0};
    if (em__op_call_kernel(op, in, n_in, attrs, out) != EM_OK) return NULL;
    for (int i = 1; i < 4; i++) em_tensor_release(out[i]);
    return out[0];
}

em_attr em__attr_ints(int n, const int *v) {
    em_attr a = {.type = EM_ATTR_INTS, .n = n};
    for (int i = 0; i < n && i < EM_MAX_DIMS && v; i++) a.ints[i] = v[i];
    if (n > 0 && !v) a.n = EM__INTS_NULL + EM_MIN(n, (1 << 20) - 1);
    return a;
}

em_attr em__attr_ints64(int n, const int64_t *v) {
    em_attr a = {.type = EM_ATTR_INTS, .n = n};
    for (int i = 0; i < n && i < EM_MAX_DIMS && v; i++) a.ints[i] = v[i];
    if (n > 0 && !v) a.n = EM__INTS_NULL + EM_MIN(n, (1 << 20) - 1);
    return a;
}

em_status em__callv(const em_op *op, int n_in, const em_tensor *const *in, const em_attr *attrs,
                    em_tensor **const *outs, int n_out) {
    em_tensor *r[8] = {0};
    for (int i = 0; i < n_out; i++)
        if (outs[i]) *outs[i] = NULL;
    em_status st = em__op_call(op, in, n_in, attrs, r);
    for (int i = 0; i < n_out && i < 8; i++) {
        if (st == EM_OK && outs[i]) *outs[i] = em__scope_track(r[i]);
        else em_tensor_release(r[i]);
    }
    return st;
}

/* In place: self = op(self, in[1..]) (in[0] is self). The result dtype under the op's policy
 * must be castable to self's (no float into int, no int into bool, as in PyTorch); a wider
 * result of the same kind (f32 += f64) is computed out of place and rounded once into self. */
static em_status op_inplace(const em_op *cop, em_tensor *self, const em_tensor *const *in,
                            int n_in, const em_attr *attrs) {
    const struct em_op *op = cop;
    if (!op) return em__error_pending() ? em_last_status()
                                        : em_set_error(EM_ERR_INVALID, "op_call: NULL op");
    char name[72]; /* errors name the in-place form: "add_" */
    snprintf(name, sizeof name, "%s_", op->schema.name);
    if (!em__check_inputs(name, in, n_in)) return em_last_status();
    if (n_in != op->schema.n_inputs || n_in > 8 || op->schema.composite || !op->schema.infer ||
        op->schema.n_outputs != 1)
        return em_set_error(EM_ERR_INVALID, "%s: no in-place form", name);
    if (!attrs) attrs = no_attrs;
    if (op->schema.n_attrs && check_attrs(op, attrs) != EM_OK) return em_last_status();
    em_dtype dts[8];
    if (apply_policy(op, in, n_in, attrs, dts) != EM_OK) return em_last_status();
    em_dtype rt = dts[0], st_dt = self->dtype;
    bool ok = rt == st_dt || em_dtype_is_floating(st_dt) ||
              (em_dtype_is_integral(st_dt) && !em_dtype_is_floating(rt));
    if (!ok)
        return em_set_error(EM_ERR_DTYPE, "%s: result type %s can't be cast to the desired "
                            "output type %s", name, em_dtype_name(rt), em_dtype_name(st_dt));
    char x[160], y[160];
    if (rt != st_dt) {
        em_tensor *r = em__op1(op, in, n_in, attrs);
        if (!r) return em_last_status();
        bool fits = same_shape(r, self->ndim, self->shape);
        em_status st = fits ? em_copy_(self, r)
                            : em_set_error(EM_ERR_SHAPE, "%s: the result's shape %s is not the "
                                           "in-place output's shape %s", name,
                                           em__shape_str(r->ndim, r->shape, x, sizeof x),
                                           em__shape_str(self->ndim, self->shape, y, sizeof y));
        em_tensor_release(r);
        return st;
    }
    em_tensor *held[8] = {0};
    const em_tensor *args[8];
    em_status st = EM_OK;
    for (int i = 0; i < n_in; i++) args[i] = in[i];
    for (int i = 1; i < n_in && st == EM_OK; i++)
        if (in[i]->dtype != dts[i]) {
            if (!(held[i] = em__to_dtype(in[i], dts[i]))) st = em_last_status();
            args[i] = held[i];
        }
    em_tensor_meta meta = {0};
    if (st == EM_OK) st = op->schema.infer(op, args, attrs, &meta);
    if (st == EM_OK && !same_shape(self, meta.ndim, meta.shape)) {
        int j = n_in > 1 ? 1 : 0;
        st = em_set_error(EM_ERR_SHAPE, "%s: shape %s does not broadcast to the in-place "
                          "output's shape %s", name,
                          em__shape_str(in[j]->ndim, in[j]->shape, x, sizeof x),
                          em__shape_str(self->ndim, self->shape, y, sizeof y));
    }
    if (st == EM_OK && meta.dtype != st_dt)
        st = em_set_error(EM_ERR_DTYPE, "%s: result type %s can't be cast to the desired "
                          "output type %s", name, em_dtype_name(meta.dtype),
                          em_dtype_name(st_dt));
    em_tensor *bcast[8] = {0};
    if (op->schema.flags & EM_OP_BROADCAST)
        for (int i = 1; i < n_in && st == EM_OK; i++) {
            if (same_shape(args[i], self->ndim, self->shape)) continue;
            if (!(bcast[i] = em__expand(args[i], self->ndim, self->shape))) st = em_last_status();
            args[i] = bcast[i];
        }
    if (st == EM_OK) st = em_op_call_out(op, args, n_in, attrs, &self, 1);
    for (int i = 0; i < n_in; i++) {
        em_tensor_release(held[i]);
        em_tensor_release(bcast[i]);
    }
    return st;
}

/* ---- observed entry points ------------------------------------------------------------------- */

/* Every call path above is entered through one of these: with no observer on the thread the
 * cost is em__observing()'s one thread-local load and branch; with one, the call is wrapped in
 * a begin and an end event (ember/trace.h). */

static em_op_event_kind call_kind(const em_op *op) {
    return op->schema.composite ? EM_OP_EVENT_COMPOSITE : EM_OP_EVENT_OP;
}

/* em__op_call and em__op_call_n under an autocast region (ember/autocast.h): a classed op runs
 * with its inputs cast and the region suspended; any other op runs as called. Observers see
 * the call as the caller made it, and the casts inside it. */
static em_status autocast_call(const em_op *op, const em_tensor *const *in, int n_in,
                               const em_attr *attrs, em_tensor **out, int cap_out, int *n_out) {
    em__autocast_args a;
    int r = (em__obs_word() & EM__OBS_AUTOCAST) && op->schema.autocast
                ? em__autocast_enter(op, in, n_in, &a) : 0;
    if (r < 0) return em_last_status();
    const em_tensor *const *args = r ? a.args : in;
    em_status st = n_out ? op_call_n(op, args, n_in, attrs, out, cap_out, n_out)
                         : op_call(op, args, n_in, attrs, out);
    if (r) em__autocast_finish(&a);
    return st;
}

em_status em__op_call(const em_op *op, const em_tensor *const *in, int n_in,
                      const em_attr *attrs, em_tensor **out) {
    if (!em__op_hooked() || !op) return op_call(op, in, n_in, attrs, out);
    if (!em__observing()) return autocast_call(op, in, n_in, attrs, out, 0, NULL);
    em__obs_frame f;
    em__obs_begin(&f, call_kind(op), op->schema.name, op, in, n_in, attrs, NULL, 0);
    return em__obs_end(&f, autocast_call(op, in, n_in, attrs, out, 0, NULL), out,
                       op->schema.n_outputs);
}

em_status em__op_call_n(const em_op *op, const em_tensor *const *in, int n_in,
                        const em_attr *attrs, em_tensor **out, int cap_out, int *n_out) {
    if (!em__op_hooked() || !op || !n_out)
        return op_call_n(op, in, n_in, attrs, out, cap_out, n_out);
    if (!em__observing()) return autocast_call(op, in, n_in, attrs, out, cap_out, n_out);
    em__obs_frame f;
    em__obs_begin(&f, call_kind(op), op->schema.name, op, in, n_in, attrs, NULL, 0);
    em_status st = autocast_call(op, in, n_in, attrs, out, cap_out, n_out);
    return em__obs_end(&f, st, out, *n_out);
}

/* Apart, as call_out_observed (below). */
static __attribute__((noinline)) em_status op_call_kernel_observed(const em_op *op,
                                                                   const em_tensor *const *in,
                                                                   int n_in, const em_attr *attrs,
                                                                   em_tensor **out) {
    em__obs_frame f;
    em__obs_begin(&f, EM_OP_EVENT_OP, op->schema.name, op, in, n_in, attrs, NULL, 0);
    return em__obs_end(&f, op_call_kernel(op, in, n_in, attrs, out), out, op->schema.n_outputs);
}

em_status em__op_call_kernel(const em_op *op, const em_tensor *const *in, int n_in,
                             const em_attr *attrs, em_tensor **out) {
    if (!em__observing() || !op) return op_call_kernel(op, in, n_in, attrs, out);
    return op_call_kernel_observed(op, in, n_in, attrs, out);
}

/* Apart, so that the unobserved call sets up no frame for the event: a test and a tail call, as
 * the compiler's own split of the function made it before the word was read atomically (GCC
 * does not split a function at an atomic load). */
static __attribute__((noinline)) em_status call_out_observed(const em_op *op,
                                                             const em_tensor *const *in,
                                                             int n_in, const em_attr *attrs,
                                                             em_tensor *const *out, int n_out) {
    em__obs_frame f;
    em__obs_begin(&f, EM_OP_EVENT_OUT, op->schema.name, op, in, n_in, attrs, out, n_out);
    return em__obs_end(&f, call_out(op, in, n_in, attrs, out, n_out), out, n_out);
}

em_status em_op_call_out(const em_op *op, const em_tensor *const *in, int n_in,
                         const em_attr *attrs, em_tensor *const *out, int n_out) {
    if (!em__observing() || !op) return call_out(op, in, n_in, attrs, out, n_out);
    return call_out_observed(op, in, n_in, attrs, out, n_out);
}

em_status em__op_inplace(const em_op *op, em_tensor *self, const em_tensor *const *in,
                         int n_in, const em_attr *attrs) {
    if (!em__observing() || !op || !self) return op_inplace(op, self, in, n_in, attrs);
    char name[72];
    snprintf(name, sizeof name, "%s_", op->schema.name);
    em__obs_frame f;
    em__obs_begin(&f, EM_OP_EVENT_INPLACE, name, op, in, n_in, attrs, &self, 1);
    return em__obs_end(&f, op_inplace(op, self, in, n_in, attrs), &self, 1);
}

em_status em_op_call_lists(const em_op *op, int count, const em_tensor *const *in,
                           const em_attr *attrs, em_tensor *const *out) {
    if (!em__observing() || !op || count < 0) return call_lists(op, count, in, attrs, out);
    int n_in = in ? op->schema.n_inputs * count : 0, n_out = out ? op->schema.n_outputs * count : 0;
    em__obs_frame f;
    em__obs_begin(&f, EM_OP_EVENT_LIST, op->schema.name, op, in, n_in, attrs, out, n_out);
    return em__obs_end(&f, call_lists(op, count, in, attrs, out), out, n_out);
}

/* ---- placement report ------------------------------------------------------------------------- */

void em__placement_count_copy(em_device dst, em_device src, size_t nbytes) {
    atomic_fetch_add(&place[dst.type].bytes_in, nbytes);
    atomic_fetch_add(&place[src.type].bytes_out, nbytes);
}

void em_placement_reset(void) {
    for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) {
        place[d].ops = place[d].ns = place[d].bytes_in = place[d].bytes_out = 0;
        place[d].fallbacks = 0;
    }
    pthread_mutex_lock(&reg_lock);
    for (struct em_op *op = ops_head; op; op = op->next)
        for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) op->fallbacks[d] = 0;
    pthread_mutex_unlock(&reg_lock);
}

em_status em_placement_get(const char *device_type, em_placement_stats *out) {
    int d = device_type ? em__device_type_find(device_type) : -1;
    if (d < 0 || !out)
        return em_set_error(EM_ERR_NOTFOUND, "placement_get: no device type '%s' is registered",
                            device_type ? device_type : "(null)");
    out->ops = place[d].ops;
    out->ns = place[d].ns;
    out->bytes_in = place[d].bytes_in;
    out->bytes_out = place[d].bytes_out;
    out->fallbacks = place[d].fallbacks;
    return EM_OK;
}

void em_placement_report(FILE *f) {
    fprintf(f, "%-12s %12s %12s %14s %14s %10s\n", "device", "ops", "time ms", "bytes in",
            "bytes out", "fallbacks");
    for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) {
        if (!em__device_types[d].used) continue;
        char ms[32];
        if (cfg.profile || place[d].ns)
            snprintf(ms, sizeof ms, "%.3f", (double)place[d].ns / 1e6);
        else
            snprintf(ms, sizeof ms, "-");
        fprintf(f, "%-12s %12llu %12s %14llu %14llu %10llu\n", em__device_types[d].name,
                (unsigned long long)place[d].ops, ms, (unsigned long long)place[d].bytes_in,
                (unsigned long long)place[d].bytes_out, (unsigned long long)place[d].fallbacks);
    }
    pthread_mutex_lock(&reg_lock);
    bool header = false;
    for (struct em_op *op = ops_head; op; op = op->next)
        for (int d = 0; d < EM_MAX_DEVICE_TYPES; d++) {
            if (!op->fallbacks[d]) continue;
            if (!header) fprintf(f, "ops that fell back to the CPU:\n");
            header = true;
            fprintf(f, "  %-24s from %-10s %llu time%s\n", op->schema.name,
                    em__device_types[d].name, (unsigned long long)op->fallbacks[d],
                    op->fallbacks[d] == 1 ? "" : "s");
        }
    pthread_mutex_unlock(&reg_lock);
    if (!cfg.profile) fprintf(f, "(op times: enable profiling with em_profile_enable)\n");
}
