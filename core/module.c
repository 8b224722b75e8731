/*
 * module.c — the module class registry and module instances (ember/module.h).
 *
 * Classes. Module classes are the "module" kind of the core's one class registry (plugin.c):
 * each is copied into a record of its own (so a plugin built against an older, shorter
 * em_module_class reads as zeros past its end) and attributed to the registry that registered
 * it, which removes them when its plugin unloads. This file holds the kind's own checks.
 *
 * Instances. A module holds its class, its resolved options, a zeroed state block, and three
 * ordered lists of named members: parameters (leaf tensors tagged EM_MEM_PARAMETER that
 * require grad unless frozen), buffers (persistent ones are in the state dict) and children.
 * The tree's dotted names ("0.weight", "layer1.0.bn1.running_mean") are built by walking it in
 * PyTorch's order: a module's own parameters, then its buffers, then each child's.
 *
 * Scopes. A class's init and forward run inside a scope of their own: intermediates are
 * released when they return, and the result is handed to the caller's scope (or to the caller
 * when none is open) — so a forward returns the same kind of reference as any op.
 *
 * Initialisation follows torch.nn.init, drawing through em_uniform_/em_normal_ (Philox)
 * with grad recording off.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <strings.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "ember/serialize.h"
#include "ember/tensor.h"
#include "internal.h"

/* ---- the class registry: the "module" kind of plugin.c's class registry ------------------ */

static bool class_name_ok(const char *s) {
    if (!s || !*s)
        return false;
    for (; *s; s++)
        if (!(*s == '_' || *s == '.' || (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') ||
              (*s >= 'A' && *s <= 'Z')))
            return false;
    return true;
}

em_status em__module_class_check(const void *record, const char *who) {
    const em_module_class *cls = record;
    if (!class_name_ok(cls->name))
        return em_set_error(EM_ERR_INVALID, "%s: bad class name '%s' (letters, digits, '_' and "
                            "'.')", who, cls->name ? cls->name : "(null)");
    if (!cls->forward)
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' has no forward", who, cls->name);
    if (cls->n_options < 0 || (cls->n_options > 0 && !cls->options))
        return em_set_error(EM_ERR_INVALID, "%s: class '%s' declares %d options without a table",
                            who, cls->name, cls->n_options);
    for (int i = 0; i < cls->n_options; i++) {
        const em_option_spec *sp = &cls->options[i];
        if (!sp->name || !*sp->name || !sp->types)
            return em_set_error(EM_ERR_INVALID, "%s: class '%s': option %d has no name or no "
                                "types", who, cls->name, i);
        for (int j = 0; j < i; j++)
            if (strcmp(cls->options[j].name, sp->name) == 0)
                return em_set_error(EM_ERR_INVALID, "%s: class '%s' declares option '%s' twice",
                                    who, cls->name, sp->name);
    }
    return EM_OK;
}

em_status em_module_class_register(em_registry *reg, const em_module_class *cls) {
    return em__class_register(reg, "module", cls, "module_class_register");
}

const em_module_class *em_module_class_find(const char *name) {
    return em__class_find("module", name, NULL);
}

size_t em_module_class_count(void) { return em_class_count("module"); }

const em_module_class *em_module_class_get(size_t i) { return em_class_get("module", i); }

size_t em_registry_module_class_count(const em_registry *reg) {
    return em_registry_class_count(reg, "module");
}

const char *em_registry_module_class_name(const em_registry *reg, size_t i) {
    return em_registry_class_name(reg, "module", i);
}

/* ---- instances ------------------------------------------------------------------------------ */

typedef struct member {
    char *name;
    em_tensor *t;     /* parameters and buffers: one reference held */
    em_module *m;     /* children: owned */
    bool persistent;  /* buffers */
} member;

typedef struct member_list {
    member *v;
    size_t n, cap;
} member_list;

typedef struct hook {
    em_forward_pre_hook pre;
    em_forward_hook post;
    void *user;
} hook;

struct em_module {
    const em_module_class *cls;
    em_options *opts;
    void *state;
    bool training;
    member_list params, buffers, children;
    hook *hooks;
    size_t n_hooks, cap_hooks;
    char *where; /* "file:line:col" of the config entry that built it (em_model_build), or NULL */
};

static void list_free(member_list *l, bool modules) {
    for (size_t i = 0; i < l->n; i++) {
        em__free(l->v[i].name);
        if (modules)
            em_module_free(l->v[i].m);
        else
            em_tensor_release(l->v[i].t);
    }
    em__free(l->v);
    memset(l, 0, sizeof *l);
}

void em_module_free(em_module *m) {
    if (!m)
        return;
    if (m->cls && m->cls->free)
        m->cls->free(m);
    list_free(&m->children, true);
    list_free(&m->params, false);
    list_free(&m->buffers, false);
    em__free(m->hooks);
    em__free(m->state);
    em_options_free(m->opts);
    em__free(m->where);
    em__free(m);
    em__live_dec(EM__LIVE_MODULE);
}

em_status em__module_set_where(em_module *m, const char *where) {
    char *w = where ? em__strdup(where, "module location") : NULL;
    if (where && !w) return EM_ERR_NOMEM;
    em__free(m->where);
    m->where = w;
    return EM_OK;
}

/* Prefix the pending error with "<Class>: " unless it already starts so. An op of the same
 * name in another case (Linear's "linear: ...") gives its place to the class name: "Linear:
 * linear: ..." tells the reader nothing more, and the class is what the config names. A layer
 * built from a config (no children: a container's message already carries its failing
 * child's) puts the config entry's file:line:col first, so a model that does not fit its data
 * names the line to change. */
static em_status blame(const em_module *m, em_status st) {
    if (st == EM_OK)
        st = EM_ERR_INTERNAL;
    const char *name = m->cls->name;
    const char *msg = em_last_error();
    size_t len = strlen(name);
    if (!*msg) {
        return em_set_error(st, "%s: failed without saying why (%s)", name,
                            em_status_str(st));
    }
    const char *body = msg; /* the message after a leading "<Class>: ", in any case */
    if (strncasecmp(msg, name, len) == 0 && msg[len] == ':')
        body = msg + len + 1 + (msg[len + 1] == ' ');
    bool has_class = body != msg && strncmp(msg, name, len) == 0;
    const char *where = m->where && m->children.n == 0 && !strstr(msg, m->where) ? m->where
                                                                                : NULL;
    if (has_class && !where)
        return st;
    char copy[1024];
    snprintf(copy, sizeof copy, "%s", body);
    if (where)
        return em_set_error(st, "%s: %s: %s", where, name, copy);
    return em_set_error(st, "%s: %s", name, copy);
}

em_module *em_module_new(const char *class_name, const em_options *opts) {
    const em_module_class *cls = em_module_class_find(class_name);
    if (!cls)
        return NULL;
    em_module *m = em__calloc(1, sizeof *m, "module");
    if (!m)
        return NULL;
    em__live_inc(EM__LIVE_MODULE);
    m->cls = cls;
    m->training = true;
    m->opts = opts ? em_options_copy(opts) : em_options_new();
    if (!m->opts)
        goto fail;
    if (em_options_resolve(m->opts, cls->name, cls->options, cls->n_options) != EM_OK)
        goto fail;
    if (cls->state_size && !(m->state = em__calloc(1, cls->state_size, "module state")))
        goto fail;
    if (cls->init) {
        if (em_scope_begin() != EM_OK)
            goto fail;
        em_status st = cls->init(m, m->opts);
        em_scope_end();
        if (st != EM_OK) {
            blame(m, st);
            goto fail;
        }
    }
    return m;
fail:
    em_module_free(m);
    return NULL;
}

const em_module_class *em_module_class_of(const em_module *m) { return m ? m->cls : NULL; }
const em_options *em_module_options(const em_module *m) { return m ? m->opts : NULL; }
void *em_module_state(em_module *m) { return m ? m->state : NULL; }

/* Output shapes recorded during a summary's forward (this thread only). */
typedef struct summary_rec {
    const em_module *m;
    int ndim;
    int64_t shape[EM_MAX_DIMS];
    size_t nbytes;
    bool seen;
    bool training; /* the mode to restore after the summary's eval-mode forward */
} summary_rec;
static _Thread_local struct {
    summary_rec *r;
    size_t n;
} REC;

static void record_output(const em_module *m, const em_tensor *out) {
    for (size_t i = 0; i < REC.n; i++)
        if (REC.r[i].m == m) {
            REC.r[i].seen = true;
            REC.r[i].ndim = out->ndim;
            memcpy(REC.r[i].shape, out->shape, sizeof out->shape);
            REC.r[i].nbytes = em_tensor_nbytes(out);
            return;
        }
}

/* Take ownership of t out of the current scope (t was returned as a new reference: either
 * tracked by the scope, or untracked and ours already). */
static em_tensor *own(em_tensor *t) {
    em__scope_untrack(t);
    return t;
}

/* The padding mask of the em_module_forward_masked call this thread is in (NULL: none). */
static _Thread_local const em_tensor *tl_mask;
#define EM__MASKED_MAX_INPUTS 15

em_tensor *em_module_forward_n(em_module *m, em_tensor *const *in, int n_in) {
    if (!m) {
        em_set_error(EM_ERR_INVALID, "module_forward: NULL module");
        return NULL;
    }
    if (n_in < 0 || (n_in > 0 && !in)) {
        em_set_error(EM_ERR_INVALID, "%s: forward: bad input list", m->cls->name);
        return NULL;
    }
    if (!em__check_inputs(m->cls->name, (const em_tensor *const *)in, n_in))
        return NULL;
    if (m->cls->n_inputs > 0 && n_in != m->cls->n_inputs) {
        em_set_error(EM_ERR_INVALID, "%s: forward takes %d input%s%s, got %d", m->cls->name,
                     m->cls->n_inputs, m->cls->n_inputs == 1 ? "" : "s",
                     m->cls->n_inputs == 2 ? " (input, target)" : "", n_in);
        return NULL;
    }
    em_tensor *with_mask[EM__MASKED_MAX_INPUTS + 1];
    bool masked = m->cls->takes_mask && tl_mask;
    if (masked) {
        if (n_in > EM__MASKED_MAX_INPUTS) {
            em_set_error(EM_ERR_INVALID, "%s: a masked forward takes at most %d inputs, got %d",
                         m->cls->name, EM__MASKED_MAX_INPUTS, n_in);
            return NULL;
        }
        for (int i = 0; i < n_in; i++) with_mask[i] = in[i];
        with_mask[n_in] = (em_tensor *)tl_mask;
    }
    if (em_scope_begin() != EM_OK)
        return NULL;
    em_tensor *out = NULL;
    em_status st = EM_OK;
    for (size_t i = 0; i < m->n_hooks && st == EM_OK; i++)
        if (m->hooks[i].pre)
            st = m->hooks[i].pre(m, in, n_in, m->hooks[i].user);
    if (st != EM_OK) {
        blame(m, st);
        goto done;
    }
    out = masked ? m->cls->forward(m, with_mask, n_in + 1) : m->cls->forward(m, in, n_in);
    if (!out) {
        blame(m, em_last_status());
        goto done;
    }
    out = own(out);
    for (size_t i = 0; i < m->n_hooks; i++) {
        if (!m->hooks[i].post)
            continue;
        em_clear_error();
        em_tensor *r = m->hooks[i].post(m, in, n_in, out, m->hooks[i].user);
        if (r) {
            em_tensor_release(out);
            out = own(r);
        } else if (em__error_pending()) {
            blame(m, em_last_status());
            em_tensor_release(out);
            out = NULL;
            goto done;
        }
    }
    if (REC.r)
        record_output(m, out);
done:
    em_scope_end();
    return em__scope_track(out);
}

em_tensor *em_module_forward_masked(em_module *m, em_tensor *const *in, int n_in,
                                    const em_tensor *mask) {
    const em_tensor *outer = tl_mask;
    tl_mask = mask;
    em_tensor *out = em_module_forward_n(m, in, n_in);
    tl_mask = outer;
    return out;
}

const em_tensor *em_module_forward_mask(void) { return tl_mask; }

em_tensor *em_module_forward(em_module *m, const em_tensor *x) {
    em_tensor *in[1] = {(em_tensor *)x};
    return em_module_forward_n(m, in, 1);
}

/* ---- members ------------------------------------------------------------------------------ */

static bool member_name_ok(const char *s) {
    if (!s || !*s)
        return false;
    for (; *s; s++)
        if (!(*s == '_' || (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') ||
              (*s >= 'A' && *s <= 'Z')))
            return false;
    return true;
}

static member *list_find(const member_list *l, const char *name) {
    for (size_t i = 0; name && i < l->n; i++)
        if (strcmp(l->v[i].name, name) == 0)
            return &l->v[i];
    return NULL;
}

static em_status check_new_name(const em_module *m, const char *what, const char *name) {
    if (!member_name_ok(name))
        return em_set_error(EM_ERR_INVALID, "%s: bad %s name '%s' (letters, digits and '_')",
                            m->cls->name, what, name ? name : "(null)");
    const char *kind = list_find(&m->params, name)     ? "parameter"
                       : list_find(&m->buffers, name)  ? "buffer"
                       : list_find(&m->children, name) ? "child module"
                                                       : NULL;
    if (kind)
        return em_set_error(EM_ERR_EXISTS, "%s: cannot add %s '%s': a %s of that name exists",
                            m->cls->name, what, name, kind);
    return EM_OK;
}

static em_status list_push(member_list *l, const char *name, em_tensor *t, em_module *c,
                           bool persistent) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        member *p = em__realloc(l->v, l->cap * sizeof *p, nc * sizeof *p, "module members");
        if (!p)
            return EM_ERR_NOMEM;
        l->v = p;
        l->cap = nc;
    }
    char *nm = em__strdup(name, "module member name");
    if (!nm)
        return EM_ERR_NOMEM;
    l->v[l->n++] = (member){.name = nm, .t = t, .m = c, .persistent = persistent};
    return EM_OK;
}

em_status em_module_add_parameter(em_module *m, const char *name, em_tensor *t) {
    if (!m)
        return em_set_error(EM_ERR_INVALID, "module_add_parameter: NULL module");
    if (!t)
        return em__error_pending() ? em_last_status()
                                   : em_set_error(EM_ERR_INVALID, "%s: parameter '%s' is NULL",
                                                  m->cls->name, name ? name : "(null)");
    em_status st = check_new_name(m, "parameter", name);
    if (st != EM_OK)
        return st;
    if (!em_tensor_is_leaf(t))
        return em_set_error(EM_ERR_STATE, "%s: parameter '%s' must be a leaf tensor (it was made "
                            "by '%s'; em_detach() it)", m->cls->name, name,
                            em_tensor_grad_fn_name(t));
    if (!em_dtype_is_floating(t->dtype))
        return em_set_error(EM_ERR_DTYPE, "%s: parameter '%s' must be floating, not %s",
                            m->cls->name, name, em_dtype_name(t->dtype));
    if ((st = list_push(&m->params, name, t, NULL, false)) != EM_OK)
        return st;
    em_tensor_retain(t);
    em_requires_grad_(t, true);
    if (t->storage->block)
        em_tensor_set_category(t, EM_MEM_PARAMETER);
    return EM_OK;
}

em_status em_module_add_buffer(em_module *m, const char *name, em_tensor *t, bool persistent) {
    if (!m)
        return em_set_error(EM_ERR_INVALID, "module_add_buffer: NULL module");
    if (!t)
        return em__error_pending() ? em_last_status()
                                   : em_set_error(EM_ERR_INVALID, "%s: buffer '%s' is NULL",
                                                  m->cls->name, name ? name : "(null)");
    em_status st = check_new_name(m, "buffer", name);
    if (st != EM_OK)
        return st;
    if ((st = list_push(&m->buffers, name, t, NULL, persistent)) != EM_OK)
        return st;
    em_tensor_retain(t);
    if (t->storage->block)
        em_tensor_set_category(t, EM_MEM_PARAMETER);
    return EM_OK;
}

em_status em_module_add_child(em_module *m, const char *name, em_module *child) {
    if (!m) {
        em_module_free(child);
        return em_set_error(EM_ERR_INVALID, "module_add_child: NULL module");
    }
    if (!child)
        return em__error_pending() ? em_last_status()
                                   : em_set_error(EM_ERR_INVALID, "%s: child '%s' is NULL",
                                                  m->cls->name, name ? name : "(null)");
    em_status st = check_new_name(m, "child module", name);
    if (st == EM_OK && child == m)
        st = em_set_error(EM_ERR_INVALID, "%s: a module cannot be its own child", m->cls->name);
    if (st == EM_OK)
        st = list_push(&m->children, name, NULL, child, false);
    if (st != EM_OK)
        em_module_free(child);
    return st;
}

em_status em__module_replace_child(em_module *m, const char *name, em_module *child) {
    member *e = m ? list_find(&m->children, name) : NULL;
    if (!e || !child || child == m) {
        em_module_free(child);
        return em_set_error(EM_ERR_NOTFOUND, "module_replace_child: no child named '%s'",
                            name ? name : "(null)");
    }
    em_module_free(e->m);
    e->m = child;
    return EM_OK;
}

em_status em_module_append_child(em_module *m, em_module *child) {
    char name[32];
    snprintf(name, sizeof name, "%zu", m ? m->children.n : 0);
    return em_module_add_child(m, name, child);
}

em_tensor *em_module_parameter(const em_module *m, const char *name) {
    member *e = m ? list_find(&m->params, name) : NULL;
    return e ? e->t : NULL;
}

em_tensor *em_module_buffer(const em_module *m, const char *name) {
    member *e = m ? list_find(&m->buffers, name) : NULL;
    return e ? e->t : NULL;
}

em_module *em_module_child(const em_module *m, const char *name) {
    member *e = m ? list_find(&m->children, name) : NULL;
    return e ? e->m : NULL;
}

em_status em_module_set_buffer(em_module *m, const char *name, em_tensor *t) {
    if (!m || !t)
        return em_set_error(EM_ERR_INVALID, "module_set_buffer: NULL %s", m ? "tensor" : "module");
    member *e = list_find(&m->buffers, name);
    if (!e)
        return em_set_error(EM_ERR_NOTFOUND, "%s: no buffer named '%s'", m->cls->name,
                            name ? name : "(null)");
    em_tensor_retain(t);
    em_tensor_release(e->t);
    e->t = t;
    return EM_OK;
}

size_t em_module_child_count(const em_module *m) { return m ? m->children.n : 0; }

em_module *em_module_child_at(const em_module *m, size_t i, const char **name) {
    if (!m || i >= m->children.n) {
        if (name)
            *name = NULL;
        return NULL;
    }
    if (name)
        *name = m->children.v[i].name;
    return m->children.v[i].m;
}

/* ---- the tree ----------------------------------------------------------------------------- */

/* Walk the tree in PyTorch's order; visit(kind, dotted name, member, user): kind 0 parameter,
 * 1 buffer. Stops at the first non-OK status. */
typedef em_status (*visit_fn)(int kind, const char *name, member *e, void *user);

static em_status walk(const em_module *m, const char *prefix, visit_fn fn, void *user) {
    char name[512];
    em_status st;
    for (size_t i = 0; i < m->params.n; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, m->params.v[i].name);
        if ((st = fn(0, name, &m->params.v[i], user)) != EM_OK)
            return st;
    }
    for (size_t i = 0; i < m->buffers.n; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, m->buffers.v[i].name);
        if ((st = fn(1, name, &m->buffers.v[i], user)) != EM_OK)
            return st;
    }
    for (size_t i = 0; i < m->children.n; i++) {
        snprintf(name, sizeof name, "%s%s.", prefix, m->children.v[i].name);
        if ((st = walk(m->children.v[i].m, name, fn, user)) != EM_OK)
            return st;
    }
    return EM_OK;
}

typedef struct collect {
    em_dict *d;
    bool params, buffers, trainable_only;
    int64_t count;
} collect;

static em_status collect_visit(int kind, const char *name, member *e, void *user) {
    collect *c = user;
    if (kind == 0 && (!c->params || (c->trainable_only && !em_tensor_requires_grad(e->t))))
        return EM_OK;
    if (kind == 1 && (!c->buffers || !e->persistent))
        return EM_OK;
    if (!c->d) {
        c->count += em_tensor_numel(e->t);
        return EM_OK;
    }
    return em_dict_set(c->d, name, e->t);
}

static em_dict *collect_dict(const em_module *m, bool params, bool buffers, bool trainable) {
    if (!m) {
        em_set_error(EM_ERR_INVALID, "module: NULL module");
        return NULL;
    }
    collect c = {.d = em_dict_new(), .params = params, .buffers = buffers,
                 .trainable_only = trainable};
    if (!c.d)
        return NULL;
    if (walk(m, "", collect_visit, &c) != EM_OK) {
        em_dict_free(c.d);
        return NULL;
    }
    return c.d;
}

em_dict *em_module_named_parameters(const em_module *m, bool trainable_only) {
    return collect_dict(m, true, false, trainable_only);
}

em_dict *em_module_state_dict(const em_module *m) { return collect_dict(m, true, true, false); }

int64_t em_module_parameter_count(const em_module *m, bool trainable_only) {
    if (!m)
        return 0;
    collect c = {.params = true, .trainable_only = trainable_only};
    walk(m, "", collect_visit, &c);
    return c.count;
}

em_status em_module_load_state_dict(em_module *m, const em_dict *sd, bool strict,
                                    em_load_report **report) {
    if (report) *report = NULL;
    if (!m || !sd)
        return em_set_error(EM_ERR_INVALID, "load_state_dict: NULL %s", m ? "dict" : "module");
    /* The module's state dict holds its live tensors: em_dict_load_into copies into them in
     * place, after checking every key, shape and dtype at once. */
    em_dict *own = em_module_state_dict(m);
    if (!own) return em_last_status();
    em_status st = em_dict_load_into(own, sd, strict, report);
    if (st != EM_OK && !strstr(em_last_error(), m->cls->name)) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        em_set_error(st, "%s (loading the state dict of a %s)", msg, m->cls->name);
    }
    em_dict_free(own);
    return st;
}

void em_module_train(em_module *m, bool on) {
    if (!m)
        return;
    m->training = on;
    for (size_t i = 0; i < m->children.n; i++)
        em_module_train(m->children.v[i].m, on);
}

bool em_module_training(const em_module *m) { return m && m->training; }

static em_status zero_visit(int kind, const char *name, member *e, void *user) {
    (void)name;
    (void)user;
    if (kind == 0)
        em_tensor_set_grad(e->t, NULL);
    return EM_OK;
}

void em_module_zero_grad(em_module *m) {
    if (m)
        walk(m, "", zero_visit, NULL);
}

typedef struct freeze_ctx {
    const char *prefix;
    bool frozen;
    int matched, changed;
    char names[512];
} freeze_ctx;

static bool prefix_match(const char *name, const char *prefix) {
    size_t lp = strlen(prefix);
    if (lp == 0 || strcmp(name, prefix) == 0)
        return true;
    if (strncmp(name, prefix, lp) != 0)
        return false;
    return prefix[lp - 1] == '.' || name[lp] == '.';
}

static em_status freeze_visit(int kind, const char *name, member *e, void *user) {
    freeze_ctx *c = user;
    if (kind != 0)
        return EM_OK;
    size_t len = strlen(c->names);
    if (len + 1 < sizeof c->names)
        snprintf(c->names + len, sizeof c->names - len, "%s%s", len ? ", " : "", name);
    if (!prefix_match(name, c->prefix))
        return EM_OK;
    c->matched++;
    if (em_tensor_requires_grad(e->t) == c->frozen) {
        em_requires_grad_(e->t, !c->frozen);
        c->changed++;
    }
    return EM_OK;
}

em_status em_module_freeze(em_module *m, const char *prefix, bool frozen, int *count) {
    if (count)
        *count = 0;
    if (!m || !prefix)
        return em_set_error(EM_ERR_INVALID, "module_freeze: NULL %s", m ? "prefix" : "module");
    freeze_ctx c = {.prefix = prefix, .frozen = frozen};
    walk(m, "", freeze_visit, &c);
    if (c.matched == 0)
        return em_set_error(EM_ERR_NOTFOUND, "module_freeze: no parameter of this %s is named "
                            "'%s' or lies under it; parameters: %s", m->cls->name, prefix,
                            c.names[0] ? c.names : "none");
    if (count)
        *count = c.changed;
    return EM_OK;
}

/* Move every parameter and buffer: to a device (dt < 0) or to a floating dtype. */
typedef struct move_ctx {
    bool to_dev;
    em_device dev;
    em_dtype dt;
} move_ctx;

static em_tensor *moved(const move_ctx *c, em_tensor *t) {
    if (c->to_dev)
        return em__to_device(t, c->dev);
    if (!em_dtype_is_floating(t->dtype))
        return em_tensor_retain(t);
    return em__to_dtype(t, c->dt);
}

static em_status move_visit(int kind, const char *name, member *e, void *user) {
    const move_ctx *c = user;
    em_tensor *n = moved(c, e->t);
    if (!n)
        return em_set_error(em_last_status(), "moving %s: %s", name, em_last_error());
    if (n == e->t) {
        em_tensor_release(n);
        return EM_OK;
    }
    if (n->storage->block)
        em_tensor_set_category(n, EM_MEM_PARAMETER);
    if (kind == 0) {
        em_requires_grad_(n, em_tensor_requires_grad(e->t));
        em_tensor *g = em_tensor_grad(e->t);
        if (g) {
            em_tensor *ng = moved(c, g);
            if (!ng || em_tensor_set_grad(n, ng) != EM_OK) {
                em_tensor_release(ng);
                em_tensor_release(n);
                return em_set_error(em_last_status(), "moving the grad of %s: %s", name,
                                    em_last_error());
            }
            if (ng->storage->block)
                em_tensor_set_category(ng, EM_MEM_GRADIENT);
            em_tensor_release(ng);
        }
    }
    em_tensor_release(e->t);
    e->t = n;
    return EM_OK;
}

static em_status move_all(em_module *m, move_ctx *c) {
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_status st = walk(m, "", move_visit, c);
    em_grad_mode_pop();
    return st;
}

em_status em_module_to_device(em_module *m, em_device dev) {
    if (!m)
        return em_set_error(EM_ERR_INVALID, "module_to_device: NULL module");
    em_status st = em__device_check(dev, "module_to_device");
    if (st != EM_OK)
        return st;
    move_ctx c = {.to_dev = true, .dev = dev};
    return move_all(m, &c);
}

em_status em_module_to_dtype(em_module *m, em_dtype dt) {
    if (!m)
        return em_set_error(EM_ERR_INVALID, "module_to_dtype: NULL module");
    if (!em_dtype_is_valid(dt) || !em_dtype_is_floating(dt))
        return em_set_error(EM_ERR_DTYPE, "module_to_dtype: %s is not a floating dtype",
                            em_dtype_is_valid(dt) ? em_dtype_name(dt) : "(invalid)");
    move_ctx c = {.dt = dt};
    return move_all(m, &c);
}

static em_status apply_rec(em_module *m, const char *path, em_module_fn fn, void *user) {
    em_status st = fn(m, path, user);
    if (st != EM_OK)
        return st;
    char sub[512];
    for (size_t i = 0; i < m->children.n; i++) {
        snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", m->children.v[i].name);
        if ((st = apply_rec(m->children.v[i].m, sub, fn, user)) != EM_OK)
            return st;
    }
    return EM_OK;
}

em_status em_module_apply(em_module *m, em_module_fn fn, void *user) {
    if (!m || !fn)
        return em_set_error(EM_ERR_INVALID, "module_apply: NULL %s", m ? "function" : "module");
    return apply_rec(m, "", fn, user);
}

static em_status add_hook(em_module *m, hook h) {
    if (!m || (!h.pre && !h.post))
        return em_set_error(EM_ERR_INVALID, "module_add_forward_hook: NULL %s",
                            m ? "hook" : "module");
    if (m->n_hooks == m->cap_hooks) {
        size_t nc = m->cap_hooks ? m->cap_hooks * 2 : 2;
        hook *p = em__realloc(m->hooks, m->cap_hooks * sizeof *p, nc * sizeof *p, "hooks");
        if (!p)
            return EM_ERR_NOMEM;
        m->hooks = p;
        m->cap_hooks = nc;
    }
    m->hooks[m->n_hooks++] = h;
    return EM_OK;
}

em_status em_module_add_forward_pre_hook(em_module *m, em_forward_pre_hook fn, void *user) {
    return add_hook(m, (hook){.pre = fn, .user = user});
}

em_status em_module_add_forward_hook(em_module *m, em_forward_hook fn, void *user) {
    return add_hook(m, (hook){.post = fn, .user = user});
}

/* ---- summary ------------------------------------------------------------------------------- */

typedef struct sum_row {
    const em_module *m;
    char name[160];
    int depth;
} sum_row;

typedef struct sum_ctx {
    sum_row *rows;
    size_t n, cap;
} sum_ctx;

static em_status sum_collect(em_module *m, const char *path, void *user) {
    sum_ctx *c = user;
    if (c->n == c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 16;
        sum_row *p = em__realloc(c->rows, c->cap * sizeof *p, nc * sizeof *p, "summary");
        if (!p)
            return EM_ERR_NOMEM;
        c->rows = p;
        c->cap = nc;
    }
    sum_row *r = &c->rows[c->n++];
    r->m = m;
    int depth = 0;
    const char *last = path;
    for (const char *p = path; *p; p++)
        if (*p == '.') {
            depth++;
            last = p + 1;
        }
    r->depth = *path ? depth + 1 : 0;
    snprintf(r->name, sizeof r->name, "%s", *path ? last : "");
    return EM_OK;
}

static void fmt_count(char *buf, size_t cap, int64_t v) {
    char raw[32];
    snprintf(raw, sizeof raw, "%" PRId64, v);
    size_t len = strlen(raw), k = 0;
    for (size_t i = 0; i < len && k + 2 < cap; i++) {
        if (i && (len - i) % 3 == 0)
            buf[k++] = ',';
        buf[k++] = raw[i];
    }
    buf[k] = 0;
}

static int64_t own_params(const em_module *m, bool trainable) {
    int64_t n = 0;
    for (size_t i = 0; i < m->params.n; i++)
        if (!trainable || em_tensor_requires_grad(m->params.v[i].t))
            n += em_tensor_numel(m->params.v[i].t);
    return n;
}

static size_t tree_bytes(const em_module *m, bool params, bool trainable) {
    size_t n = 0;
    if (params) {
        for (size_t i = 0; i < m->params.n; i++)
            if (!trainable || em_tensor_requires_grad(m->params.v[i].t))
                n += em_tensor_nbytes(m->params.v[i].t);
    } else {
        for (size_t i = 0; i < m->buffers.n; i++)
            n += em_tensor_nbytes(m->buffers.v[i].t);
    }
    for (size_t i = 0; i < m->children.n; i++)
        n += tree_bytes(m->children.v[i].m, params, trainable);
    return n;
}

/* The first floating parameter's dtype and device (f32 on the CPU when none). */
static void model_placement(const em_module *m, em_dtype *dt, em_device *dev, bool *found) {
    for (size_t i = 0; i < m->params.n && !*found; i++) {
        *dt = m->params.v[i].t->dtype;
        *dev = m->params.v[i].t->storage->device;
        *found = true;
    }
    for (size_t i = 0; i < m->children.n && !*found; i++)
        model_placement(m->children.v[i].m, dt, dev, found);
}

em_status em_module_summary(em_module *m, int ndim, const int64_t *input_shape, FILE *f) {
    if (!m || !f || ndim < 0 || ndim > EM_MAX_DIMS || (ndim > 0 && !input_shape))
        return em_set_error(EM_ERR_INVALID, "module_summary: %s", !m ? "NULL module"
                            : !f ? "NULL stream" : "bad input shape");
    if (m->cls->n_inputs > 1)
        return em_set_error(EM_ERR_INVALID, "module_summary: %s takes %d inputs; a summary runs "
                            "a one-input model", m->cls->name, m->cls->n_inputs);
    sum_ctx c = {0};
    em_status st = em_module_apply(m, sum_collect, &c);
    if (st != EM_OK) {
        em__free(c.rows);
        return st;
    }
    summary_rec *rec = em__calloc(c.n, sizeof *rec, "summary");
    if (!rec) {
        em__free(c.rows);
        return EM_ERR_NOMEM;
    }
    /* The forward runs in eval mode so that it changes nothing (BatchNorm's running
     * statistics, Dropout's generator draws); each module's mode is restored after. */
    for (size_t i = 0; i < c.n; i++) {
        rec[i].m = c.rows[i].m;
        rec[i].training = c.rows[i].m->training;
        ((em_module *)c.rows[i].m)->training = false;
    }
    em_dtype dt = EM_F32;
    em_device dev = em_cpu();
    bool found = false;
    model_placement(m, &dt, &dev, &found);

    /* Forward zeros without recording; a model that rejects a floating input (an embedding
     * takes indices) gets int64 zeros instead. */
    em_grad_mode_push(EM_GRAD_DISABLED);
    REC.r = rec;
    REC.n = c.n;
    size_t input_bytes = 0;
    st = em_scope_begin();
    if (st == EM_OK) {
        em_tensor *x = em_zeros(ndim, input_shape, dt, dev);
        em_tensor *y = x ? em_module_forward(m, x) : NULL;
        if (!y && x && em_last_status() == EM_ERR_DTYPE) {
            x = em_zeros(ndim, input_shape, EM_I64, dev);
            y = x ? em_module_forward(m, x) : NULL;
        }
        if (x)
            input_bytes = em_tensor_nbytes(x);
        st = y ? EM_OK : em_last_status();
        if (st != EM_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", em_last_error());
            em_set_error(st, "module_summary: the forward pass on an input of shape %s failed: %s",
                         em_shape_str(ndim, input_shape, (char[128]){0}, 128), msg);
        }
        em_scope_end();
    }
    REC.r = NULL;
    REC.n = 0;
    em_grad_mode_pop();
    for (size_t i = 0; i < c.n; i++)
        ((em_module *)c.rows[i].m)->training = rec[i].training;
    if (st != EM_OK) {
        em__free(rec);
        em__free(c.rows);
        return st;
    }

    static const char *eq = "==================================================================="
                            "=========================";
    static const char *dash = "-----------------------------------------------------------------"
                              "---------------------------";
    fprintf(f, "%.92s\n%-40s %-25s %12s %12s\n%.92s\n", eq, "Layer (type)", "Output Shape",
            "Param #", "Trainable", eq);
    size_t act_bytes = 0;
    for (size_t i = 0; i < c.n; i++) {
        const sum_row *r = &c.rows[i];
        char label[256], shape[128] = "--", np[32] = "--", nt[32] = "--";
        if (r->depth == 0)
            snprintf(label, sizeof label, "%s", r->m->cls->name);
        else
            snprintf(label, sizeof label, "%*s%s (%s)", 2 * r->depth, "", r->name,
                     r->m->cls->name);
        if (rec[i].seen) {
            em_shape_str(rec[i].ndim, rec[i].shape, shape, sizeof shape);
            if (r->m->children.n == 0)
                act_bytes += rec[i].nbytes;
        }
        if (r->m->params.n) {
            fmt_count(np, sizeof np, own_params(r->m, false));
            fmt_count(nt, sizeof nt, own_params(r->m, true));
        }
        fprintf(f, "%-40s %-25s %12s %12s\n", label, shape, np, nt);
    }
    int64_t total = em_module_parameter_count(m, false);
    int64_t trainable = em_module_parameter_count(m, true);
    char a[32], b[32], d[32];
    fmt_count(a, sizeof a, total);
    fmt_count(b, sizeof b, trainable);
    fmt_count(d, sizeof d, total - trainable);
    size_t pbytes = tree_bytes(m, true, false), gbytes = tree_bytes(m, true, true);
    size_t bbytes = tree_bytes(m, false, false);
    const double MB = 1024.0 * 1024.0;
    fprintf(f, "%.92s\nTotal params: %s\nTrainable params: %s\nNon-trainable params: %s\n%.92s\n",
            eq, a, b, d, dash);
    fprintf(f, "Input size (MB): %.2f\n", (double)input_bytes / MB);
    fprintf(f, "Params size (MB): %.2f\n", (double)(pbytes + bbytes) / MB);
    fprintf(f, "Gradients size (MB): %.2f\n", (double)gbytes / MB);
    fprintf(f, "Forward activations size (MB): %.2f\n", (double)act_bytes / MB);
    fprintf(f, "Estimated total size (MB): %.2f\n%.92s\n",
            (double)(input_bytes + pbytes + bbytes + gbytes + act_bytes) / MB, eq);
    em__free(rec);
    em__free(c.rows);
    return ferror(f) ? em_set_error(EM_ERR_IO, "module_summary: writing failed") : EM_OK;
}

/* ---- initialisation ------------------------------------------------------------------------- */

static em_status init_fill(em_tensor *t, int kind, double a, double b, em_generator *gen) {
    if (!t)
        return em__error_pending() ? em_last_status()
                                   : em_set_error(EM_ERR_INVALID, "init: NULL tensor");
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_status st = kind == 0 ? em_uniform_(t, a, b, gen)
                   : kind == 1 ? em_normal_(t, a, b, gen)
                               : em_fill_(t, a);
    em_grad_mode_pop();
    return st;
}

em_status em_init_uniform_(em_tensor *t, double lo, double hi, em_generator *gen) {
    return init_fill(t, 0, lo, hi, gen);
}
em_status em_init_normal_(em_tensor *t, double mean, double std, em_generator *gen) {
    return init_fill(t, 1, mean, std, gen);
}
em_status em_init_zeros_(em_tensor *t) { return init_fill(t, 2, 0, 0, NULL); }
em_status em_init_ones_(em_tensor *t) { return init_fill(t, 2, 1, 0, NULL); }

em_status em_init_calculate_fans(const em_tensor *t, int64_t *fan_in, int64_t *fan_out) {
    if (!t)
        return em_set_error(EM_ERR_INVALID, "init: NULL tensor");
    if (t->ndim < 2)
        return em_set_error(EM_ERR_SHAPE, "init: fan in and fan out can not be computed for a "
                            "tensor with fewer than 2 dimensions (shape %s)",
                            em_shape_str(t->ndim, t->shape, (char[128]){0}, 128));
    int64_t receptive = 1;
    for (int i = 2; i < t->ndim; i++)
        receptive *= t->shape[i];
    if (fan_in)
        *fan_in = t->shape[1] * receptive;
    if (fan_out)
        *fan_out = t->shape[0] * receptive;
    return EM_OK;
}

em_status em_init_calculate_gain(const char *nonlinearity, double param, double *gain) {
    static const char *const linear[] = {"linear", "conv1d", "conv2d", "conv3d",
                                         "conv_transpose1d", "conv_transpose2d",
                                         "conv_transpose3d", "sigmoid", NULL};
    if (!nonlinearity || !gain)
        return em_set_error(EM_ERR_INVALID, "calculate_gain: NULL argument");
    for (int i = 0; linear[i]; i++)
        if (strcmp(nonlinearity, linear[i]) == 0)
            return *gain = 1.0, EM_OK;
    if (strcmp(nonlinearity, "tanh") == 0)
        return *gain = 5.0 / 3.0, EM_OK;
    if (strcmp(nonlinearity, "relu") == 0)
        return *gain = sqrt(2.0), EM_OK;
    if (strcmp(nonlinearity, "leaky_relu") == 0) {
        double slope = isnan(param) ? 0.01 : param;
        return *gain = sqrt(2.0 / (1.0 + slope * slope)), EM_OK;
    }
    if (strcmp(nonlinearity, "selu") == 0)
        return *gain = 3.0 / 4.0, EM_OK;
    return em_set_error(EM_ERR_INVALID, "calculate_gain: unsupported nonlinearity '%s' (linear, "
                        "conv1d/2d/3d, conv_transpose1d/2d/3d, sigmoid, tanh, relu, leaky_relu, "
                        "selu)", nonlinearity);
}

static em_status kaiming_std(const em_tensor *t, double a, const char *mode,
                             const char *nonlinearity, const char *who, double *std) {
    int64_t fi, fo;
    em_status st = em_init_calculate_fans(t, &fi, &fo);
    if (st != EM_OK)
        return st;
    if (!mode)
        mode = "fan_in";
    if (!nonlinearity)
        nonlinearity = "leaky_relu";
    int64_t fan;
    if (strcmp(mode, "fan_in") == 0)
        fan = fi;
    else if (strcmp(mode, "fan_out") == 0)
        fan = fo;
    else
        return em_set_error(EM_ERR_INVALID, "%s: mode '%s' is not supported (fan_in or fan_out)",
                            who, mode);
    double gain;
    if ((st = em_init_calculate_gain(nonlinearity, a, &gain)) != EM_OK)
        return st;
    *std = fan > 0 ? gain / sqrt((double)fan) : 0.0;
    return EM_OK;
}

em_status em_init_kaiming_uniform_(em_tensor *t, double a, const char *mode,
                                   const char *nonlinearity, em_generator *gen) {
    if (t && t->numel == 0)
        return EM_OK; /* as PyTorch: initialising a zero-element tensor is a no-op */
    double std;
    em_status st = kaiming_std(t, a, mode, nonlinearity, "kaiming_uniform_", &std);
    if (st != EM_OK)
        return st;
    double bound = sqrt(3.0) * std;
    return em_init_uniform_(t, -bound, bound, gen);
}

em_status em_init_kaiming_normal_(em_tensor *t, double a, const char *mode,
                                  const char *nonlinearity, em_generator *gen) {
    if (t && t->numel == 0)
        return EM_OK;
    double std;
    em_status st = kaiming_std(t, a, mode, nonlinearity, "kaiming_normal_", &std);
    if (st != EM_OK)
        return st;
    return em_init_normal_(t, 0.0, std, gen);
}

static em_status xavier_std(const em_tensor *t, double gain, double *std) {
    int64_t fi, fo;
    em_status st = em_init_calculate_fans(t, &fi, &fo);
    if (st != EM_OK)
        return st;
    *std = fi + fo > 0 ? gain * sqrt(2.0 / (double)(fi + fo)) : 0.0;
    return EM_OK;
}

em_status em_init_xavier_uniform_(em_tensor *t, double gain, em_generator *gen) {
    double std;
    em_status st = xavier_std(t, gain, &std);
    if (st != EM_OK)
        return st;
    double a = sqrt(3.0) * std;
    return em_init_uniform_(t, -a, a, gen);
}

em_status em_init_xavier_normal_(em_tensor *t, double gain, em_generator *gen) {
    double std;
    em_status st = xavier_std(t, gain, &std);
    if (st != EM_OK)
        return st;
    return em_init_normal_(t, 0.0, std, gen);
}
