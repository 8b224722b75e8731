/*
 * autograd.c — the define-by-run engine: grad mode, graph nodes, recording ops and views,
 * backward traversal in dependency order, leaf accumulation, retain_grad, hooks, saved-tensor
 * version checks, anomaly mode and the graph dump.
 *
 * A node is created for every op (or view) whose inputs require grad. It holds strong
 * references to the nodes (or leaves) of its inputs, so a tensor's grad_fn keeps its whole
 * history alive and nothing else does. Saved tensors are detached aliases (sharing storage,
 * without history), so a node saving its own output makes no cycle.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/ops.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "internal.h"

#define MAX_IN 8
#define MAX_OUT 4

struct em__hook {
    em_grad_hook_fn fn;
    em_post_accumulate_hook_fn post; /* post_hooks: fn is NULL */
    void *user;
    em__hook *next;
};

/* NODE_CONST: the history of a tensor overwritten in place by a value that needs no grad
 * (fill_, or copy_ from a constant): the grad stops there. NODE_COPY_SLICES: the history of a
 * base after an in-place op on one of its views: inputs the base's old history and the view's
 * new value (view geometry in `view`, EM__VIEW_STRIDED). */
typedef enum node_kind {
    NODE_OP, NODE_VIEW, NODE_TO_DEVICE, NODE_CONST, NODE_COPY_SLICES
} node_kind;

typedef struct edge {
    em__node *node;   /* owned reference, or NULL */
    int output_nr;
    em_tensor *leaf;  /* owned reference to a leaf that requires grad, or NULL */
} edge;

struct em__node {
    atomic_int refcount;
    node_kind kind;
    const em_op *op;  /* NODE_OP */
    const char *name;
    int n_in, n_out;
    edge next[MAX_IN];
    em_tensor_meta in_meta[MAX_IN];
    em_device in_device[MAX_IN];
    em_tensor_meta out_meta[MAX_OUT];
    em_tensor *saved_in[MAX_IN], *saved_out[MAX_OUT];
    uint64_t ver_in[MAX_IN], ver_out[MAX_OUT];
    bool had_saved, released;
    em_attr attrs[8];
    em__view_info view;
    em_tensor *retain[MAX_OUT]; /* weak: non-leaf outputs that retain their grad */
    em__hook *hooks[MAX_OUT];   /* hooks registered on non-leaf outputs */
    uint64_t seq;
    char *trace;                /* anomaly mode: the ops that led here */
    /* state of the backward run in progress */
    uint64_t run;
    int deps;
    em_tensor *buf[MAX_OUT];
};

static atomic_uint_fast64_t node_seq, run_seq;
static atomic_bool anomaly;

/* ---- grad mode --------------------------------------------------------------------------------- */

static _Thread_local struct {
    em_grad_mode stack[64];
    int depth;
} G;

em_grad_mode em_grad_mode_get(void) { return G.depth ? G.stack[G.depth - 1] : EM_GRAD_ENABLED; }
bool em_grad_enabled(void) { return em_grad_mode_get() == EM_GRAD_ENABLED; }

em_status em_grad_mode_push(em_grad_mode m) {
    if (m < EM_GRAD_ENABLED || m > EM_GRAD_INFERENCE)
        return em_set_error(EM_ERR_INVALID, "grad_mode_push: invalid mode %d", (int)m);
    if (G.depth == (int)EM_ARRAY_LEN(G.stack))
        return em_set_error(EM_ERR_STATE, "grad_mode_push: more than %d nested grad modes "
                            "(a push without its pop in a loop?)", (int)EM_ARRAY_LEN(G.stack));
    G.stack[G.depth++] = m;
    return EM_OK;
}

em_status em_grad_mode_pop(void) {
    if (G.depth == 0)
        return em_set_error(EM_ERR_STATE, "grad_mode_pop: no grad mode was pushed on this thread");
    G.depth--;
    return EM_OK;
}

/* ---- anomaly mode: a per-thread trace of the last ops ------------------------------------------ */

#define TRACE_LEN 8
static _Thread_local struct {
    char entry[TRACE_LEN][96];
    unsigned next;
} T;

void em_set_anomaly(bool on) { anomaly = on; }
bool em_anomaly_enabled(void) { return anomaly; }
/* Inside a backward function the engine checks the gradients it returns (naming the op whose
 * backward failed), so the forward check of the ops it uses is skipped. */
static _Thread_local int in_backward, in_check; /* in_check: first_bad converting */
bool em__anomaly_on(void) { return anomaly && !in_backward && !in_check; }

void em__autograd_init(void) {
    const char *e = getenv("EMBER_ANOMALY");
    anomaly = e && *e && strcmp(e, "0") != 0;
}

static void trace_push(const char *name, const em_tensor *const *in, int n_in) {
    char *e = T.entry[T.next++ % TRACE_LEN];
    size_t n = (size_t)snprintf(e, 96, "%s", name);
    for (int i = 0; i < n_in && n < 96; i++) {
        char s[64];
        n += (size_t)snprintf(e + n, 96 - n, "%s%s", i ? " x " : " ",
                              em__shape_str(in[i]->ndim, in[i]->shape, s, sizeof s));
    }
}

/* "matmul [2, 3] x [3, 4] -> add ... -> exp" into buf. */
static const char *trace_str(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    unsigned first = T.next > TRACE_LEN ? T.next - TRACE_LEN : 0;
    for (unsigned i = first; i < T.next && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i > first ? " -> " : "",
                              T.entry[i % TRACE_LEN]);
    return buf;
}

/* Index of the first NaN/Inf in a floating tensor, or -1. */
/* The first element of t that is NaN (nan_only) or not finite, or -1. */
static int64_t first_bad(const em_tensor *t, double *value, bool nan_only) {
    if (!em_dtype_is_floating(t->dtype) || t->numel == 0) return -1;
    /* The conversion is an op itself: it must not be checked (it would fail on the very NaN
     * being looked for, and the op that made it would go unnamed) nor traced. */
    in_check++;
    em_tensor *d = em__to_dtype(t, EM_F64);
    in_check--;
    if (!d) return -1;
    int64_t n = t->numel, found = -1;
    double *v = em__malloc(sizeof(double) * (size_t)n, "anomaly check");
    if (v && em_tensor_to_host(d, v, sizeof(double) * (size_t)n) == EM_OK)
        for (int64_t i = 0; i < n && found < 0; i++)
            if (nan_only ? isnan(v[i]) : !isfinite(v[i])) found = i, *value = v[i];
    em__free(v);
    em_tensor_release(d);
    return found;
}

em_status em__anomaly_check_forward(const em_op *op, const em_tensor *const *in, int n_in,
                                    em_tensor *const *out, int n_out) {
    (void)in; /* described by the trace entry em__autograd_pre pushed */
    /* NaN only: an infinity in the forward pass is often meant (a -inf attention mask, log 0
     * then masked); its NaN or Inf gradient is caught in backward. */
    for (int j = 0; j < n_out; j++) {
        double v = 0;
        int64_t at = first_bad(out[j], &v, true);
        if (at < 0) continue;
        char tr[TRACE_LEN * 100], s[160];
        return em_set_error(EM_ERR_RANGE, "anomaly: %s produced NaN at element %lld of output %d "
                            "(shape %s) in the forward pass; inputs: %s; ops leading to it: %s",
                            em_op_name(op), (long long)at, j,
                            em__shape_str(out[j]->ndim, out[j]->shape, s, sizeof s),
                            n_in ? T.entry[(T.next - 1) % TRACE_LEN] : "none",
                            trace_str(tr, sizeof tr));
    }
    return EM_OK;
}

/* ---- nodes -------------------------------------------------------------------------------------- */

static em__node *node_ref(em__node *n) {
    if (n) atomic_fetch_add(&n->refcount, 1);
    return n;
}

static void free_saved(em__node *n) {
    for (int i = 0; i < MAX_IN; i++) {
        em_tensor_release(n->saved_in[i]);
        n->saved_in[i] = NULL;
    }
    for (int j = 0; j < MAX_OUT; j++) {
        em_tensor_release(n->saved_out[j]);
        n->saved_out[j] = NULL;
    }
}

static void hooks_free(em__hook *h) {
    while (h) {
        em__hook *next = h->next;
        em__free(h);
        h = next;
    }
}

static void node_release(em__node *n);

/* Free a node whose last reference is gone; its input nodes are pushed on *stack. */
static void node_destroy(em__node *n, em__node ***stack, size_t *len, size_t *cap,
                         em__node **local) {
    free_saved(n);
    for (int j = 0; j < MAX_OUT; j++) {
        hooks_free(n->hooks[j]);
        em_tensor_release(n->buf[j]);
    }
    for (int i = 0; i < 8; i++)
        if (n->attrs[i].type == EM_ATTR_STRING) em__free((char *)n->attrs[i].v.s);
    em__free(n->trace);
    for (int i = 0; i < n->n_in; i++) {
        em_tensor_release(n->next[i].leaf);
        em__node *c = n->next[i].node;
        if (!c) continue;
        if (*len == *cap) {
            size_t nc = *cap * 2;
            em__node **p = em__malloc(nc * sizeof *p, "graph release");
            if (!p) {
                node_release(c); /* no memory for the work list: recurse for this one */
                continue;
            }
            memcpy(p, *stack, *len * sizeof *p);
            if (*stack != local) em__free(*stack);
            *stack = p;
            *cap = nc;
        }
        (*stack)[(*len)++] = c;
    }
    em__free(n);
}

/* Drop a reference. Freeing a long chain walks it with a work list, not recursion (a
 * 10,000-op graph would overflow the stack). */
static void node_release(em__node *n) {
    em__node *local[64], **stack = local;
    size_t len = 0, cap = EM_ARRAY_LEN(local);
    if (n) stack[len++] = n;
    while (len) {
        em__node *x = stack[--len];
        if (atomic_fetch_sub(&x->refcount, 1) == 1) node_destroy(x, &stack, &len, &cap, local);
    }
    if (stack != local) em__free(stack);
}

static void meta_of(const em_tensor *t, em_tensor_meta *m) {
    m->dtype = t->dtype;
    m->ndim = t->ndim;
    memcpy(m->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
}

/* A detached alias of t: same storage and geometry, no history. */
static em_tensor *alias(const em_tensor *t) {
    return em__tensor_view(t, t->ndim, t->shape, t->strides, t->offset);
}

/* A node with edges to the given inputs. */
static void set_history(em_tensor *t, em__node *n, int j);
static em_status refresh_view(em_tensor *t);

static em__node *node_new(node_kind kind, const char *name, const em_tensor *const *in, int n_in,
                          int n_out) {
    em__node *n = em__calloc(1, sizeof *n, "autograd node");
    if (!n) return NULL;
    atomic_init(&n->refcount, 1);
    n->kind = kind;
    n->name = name;
    n->n_in = n_in;
    n->n_out = n_out;
    n->seq = atomic_fetch_add(&node_seq, 1) + 1;
    for (int i = 0; i < n_in; i++) {
        if (refresh_view((em_tensor *)in[i]) != EM_OK) {
            n->n_in = i;
            node_release(n);
            return NULL;
        }
        meta_of(in[i], &n->in_meta[i]);
        n->in_device[i] = in[i]->storage->device;
        if (in[i]->grad_fn) {
            n->next[i].node = node_ref(in[i]->grad_fn);
            n->next[i].output_nr = in[i]->output_nr;
        } else if (in[i]->requires_grad) {
            n->next[i].leaf = em_tensor_retain((em_tensor *)in[i]);
        }
    }
    if (anomaly) {
        char tr[TRACE_LEN * 100];
        n->trace = em__strdup(trace_str(tr, sizeof tr), "anomaly trace");
    }
    return n;
}

/* Make node n the history of output j of t. Non-floating outputs (indices) never require
 * grad, as in PyTorch: they only record their metadata. */
static void set_history(em_tensor *t, em__node *n, int j) {
    if (!em_dtype_is_floating(t->dtype)) {
        meta_of(t, &n->out_meta[j]);
        return;
    }
    em__node *old = t->grad_fn;
    t->grad_fn = node_ref(n);
    t->output_nr = j;
    t->requires_grad = true;
    if (t->is_view) t->view_version = em_tensor_version(t); /* its history is current */
    meta_of(t, &n->out_meta[j]);
    if (t->retains_grad) n->retain[j] = t;
    if (old) {
        for (int k = 0; k < MAX_OUT; k++)
            if (old->retain[k] == t) old->retain[k] = NULL;
        node_release(old);
    }
}

/* The root tensor a view's storage belongs to is dense: views of it are described by strides
 * and an offset from it (EM__VIEW_STRIDED). */
static bool base_dense(const em_tensor *b) {
    return em__is_contiguous(b->ndim, b->shape, b->strides);
}

/* Make t's history a strided view of its base's current history. */
static em_status view_of_base(em_tensor *t) {
    const em_tensor *b = t->view_base;
    em__node *v = node_new(NODE_VIEW, "as_strided", &b, 1, 1);
    if (!v) return em__error_pending() ? em_last_status() : EM_ERR_NOMEM;
    v->view.kind = EM__VIEW_STRIDED;
    memcpy(v->view.strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
    v->view.offset = t->offset - b->offset;
    set_history(t, v, 0);
    node_release(v);
    return EM_OK;
}

/* A view whose base was changed in place since its history was recorded (the base has a new
 * history) gets a history from the base's current one before it is used, as in PyTorch. */
static em_status refresh_view(em_tensor *t) {
    if (!t->is_view || !t->view_base || !t->view_base->requires_grad || !t->view_base_requires_grad ||
        t->view_version == em_tensor_version(t) || !em_grad_enabled())
        return EM_OK;
    if (!base_dense(t->view_base) || em__expanded_dim(t) >= 0) {
        char a[160];
        return em_set_error(EM_ERR_STATE, "a view (shape %s) of a tensor that requires grad "
                            "was made before an in-place change of its storage, and its kind "
                            "(%s) cannot be brought up to date; make the view again after the "
                            "change", em__shape_str(t->ndim, t->shape, a, sizeof a),
                            em__expanded_dim(t) >= 0 ? "an expanded view" : "a view of a strided base");
    }
    return view_of_base(t);
}

/* Whether an in-place op writing t must change a history: t has one (a non-leaf), or t is a
 * view of a tensor that requires grad. */
static bool history_touched(const em_tensor *o) {
    return o->grad_fn || (o->is_view && o->view_base && o->view_base->requires_grad);
}

/* The checks PyTorch makes before an in-place op on o records history. */
static em_status check_inplace(const em_op *op, const em_tensor *o, bool any) {
    char a[160];
    if (any && o->requires_grad && !o->grad_fn && !o->is_view)
        return em_set_error(EM_ERR_STATE, "%s: a leaf tensor that requires grad (shape "
                            "%s) is used in an in-place operation; update parameters under "
                            "em_grad_mode_push(EM_GRAD_DISABLED)", em_op_name(op),
                            em__shape_str(o->ndim, o->shape, a, sizeof a));
    if (!o->is_view || !o->view_base) return EM_OK;
    const em_tensor *b = o->view_base;
    if (!b->requires_grad && !any) return EM_OK;
    if (b->requires_grad && !b->grad_fn)
        return em_set_error(EM_ERR_STATE, "%s: a view (shape %s) of a leaf tensor that requires "
                            "grad is used in an in-place operation; change parameters under "
                            "em_grad_mode_push(EM_GRAD_DISABLED)", em_op_name(op),
                            em__shape_str(o->ndim, o->shape, a, sizeof a));
    if (b->requires_grad && !o->view_base_requires_grad)
        return em_set_error(EM_ERR_STATE, "%s: the view (shape %s) was made with gradients off "
                            "from a tensor that requires grad, and is changed in place with "
                            "gradients on; make the view with gradients on, or change it with "
                            "them off", em_op_name(op),
                            em__shape_str(o->ndim, o->shape, a, sizeof a));
    if (!base_dense(b))
        return em_set_error(EM_ERR_STATE, "%s: in-place operation with gradients on a view "
                            "(shape %s) of a strided tensor; make the tensor contiguous first",
                            em_op_name(op), em__shape_str(o->ndim, o->shape, a, sizeof a));
    return EM_OK;
}

/* After an in-place op on the view o wrote its new value (history o_new set on o): the base's
 * history becomes copy_slices(old base, o_new), and o's a view of that. */
static em_status rebase(em_tensor *o) {
    em_tensor *b = o->view_base;
    const em_tensor *in[2] = {b, o};
    em__node *c = node_new(NODE_COPY_SLICES, "copy_slices", in, 2, 1);
    if (!c) return em__error_pending() ? em_last_status() : EM_ERR_NOMEM;
    c->view.kind = EM__VIEW_STRIDED;
    memcpy(c->view.strides, o->strides, sizeof(int64_t) * (size_t)o->ndim);
    c->view.offset = o->offset - b->offset;
    set_history(b, c, 0);
    node_release(c);
    return view_of_base(o);
}

em_status em__autograd_pre(const em_op *op, const em_tensor *const *in, int n_in,
                           const em_attr *attrs, em_tensor *const *out, int n_out,
                           em__node **node) {
    *node = NULL;
    if (anomaly && !in_check) trace_push(em_op_name(op), in, n_in);
    if (!em_grad_enabled()) return EM_OK;
    bool any = false, touched = false;
    const em_op_schema *s = em_op_schema_of(op);
    if (!(s->flags & EM_OP_NONDIFF))
        for (int i = 0; i < n_in; i++) any |= in[i]->requires_grad;
    /* An op writing into a tensor with a history (in place, or an out= call) replaces that
     * history even when its inputs need no grad: the old one no longer produced the values. */
    for (int j = 0; j < n_out; j++) touched |= history_touched(out[j]);
    if (!any && !touched) return EM_OK;
    for (int j = 0; j < n_out; j++) {
        em_status st = check_inplace(op, out[j], any);
        if (st != EM_OK) return st;
    }
    if (!any) {
        *node = node_new(NODE_CONST, em_op_name(op), NULL, 0, n_out);
        if (!*node) return EM_ERR_NOMEM;
        (*node)->op = op;
        return EM_OK;
    }
    em__node *n = node_new(NODE_OP, em_op_name(op), in, n_in, n_out);
    if (!n) return em__error_pending() ? em_last_status() : EM_ERR_NOMEM;
    n->op = op;
    for (int i = 0; i < s->n_attrs && attrs; i++) {
        n->attrs[i] = attrs[i];
        if (attrs[i].type == EM_ATTR_STRING &&
            !(n->attrs[i].v.s = em__strdup(attrs[i].v.s, "attribute"))) {
            n->attrs[i].type = EM_ATTR_NONE;
            node_release(n);
            return EM_ERR_NOMEM;
        }
    }
    for (int i = 0; i < n_in; i++) {
        if (!(s->saves & EM_SAVE_INPUT(i))) continue;
        if (in[i]->inference) {
            node_release(n);
            return em_set_error(EM_ERR_STATE, "%s: input %d was made under EM_GRAD_INFERENCE "
                                "and cannot be saved for backward; make it outside inference "
                                "mode", em_op_name(op), i);
        }
        /* An input that the op overwrites (in place) is saved as a copy of its old value. */
        bool overwritten = false;
        for (int j = 0; j < n_out; j++) overwritten |= out[j]->storage == in[i]->storage;
        n->saved_in[i] = overwritten ? em__clone(in[i]) : alias(in[i]);
        if (!n->saved_in[i]) {
            node_release(n);
            return em_last_status();
        }
        n->ver_in[i] = em_tensor_version(n->saved_in[i]);
        n->had_saved = true;
    }
    *node = n;
    return EM_OK;
}

em_status em__autograd_post(em__node *n, em_tensor *const *out, int n_out, bool ok) {
    if (!n) return EM_OK;
    if (!ok) {
        node_release(n);
        return EM_OK;
    }
    const em_op_schema *s = em_op_schema_of(n->op);
    for (int j = 0; j < n_out && n->kind == NODE_OP; j++) {
        if (!(s->saves & EM_SAVE_OUTPUT(j))) continue;
        if (!(n->saved_out[j] = alias(out[j]))) {
            node_release(n);
            return em_last_status();
        }
        n->ver_out[j] = em_tensor_version(out[j]);
        n->had_saved = true;
    }
    em_status st = EM_OK;
    for (int j = 0; j < n_out; j++) {
        em_tensor *o = out[j];
        bool view = o->is_view && o->view_base && em_dtype_is_floating(o->dtype);
        set_history(o, n, j);
        if (view && st == EM_OK) st = rebase(o);
    }
    node_release(n);
    return st;
}

static const char *view_name(em__view_kind k) {
    switch (k) {
    case EM__VIEW_STRIDED: return "as_strided";
    case EM__VIEW_RESHAPE: return "view";
    case EM__VIEW_PERMUTE: return "permute";
    case EM__VIEW_EXPAND: return "expand";
    case EM__VIEW_NARROW: return "narrow";
    }
    return "view";
}

em_tensor *em__autograd_view(em_tensor *view, const em_tensor *base, const em__view_info *info) {
    if (!view) return NULL;
    view->is_view = true;
    view->inference = base->inference;
    const em_tensor *root = base->is_view && base->view_base ? base->view_base : base;
    view->view_base = em_tensor_retain((em_tensor *)root);
    view->view_version = em_tensor_version(view);
    if (!base->requires_grad || !em_grad_enabled()) return view;
    em__node *n = node_new(NODE_VIEW, view_name(info->kind), &base, 1, 1);
    if (!n) {
        em_tensor_release(view);
        return NULL;
    }
    n->view = *info;
    view->view_base_requires_grad = true;
    set_history(view, n, 0);
    node_release(n);
    return view;
}

void em__autograd_name_view(em_tensor *t, const char *name) {
    if (t && t->grad_fn && t->grad_fn->kind == NODE_VIEW && name) t->grad_fn->name = name;
}

/* to_device is a copy across devices done outside the op dispatcher: recorded here. */
em_status em__autograd_to_device(em_tensor *out, const em_tensor *in) {
    if (!in->requires_grad || !em_grad_enabled()) return EM_OK;
    em__node *n = node_new(NODE_TO_DEVICE, "to_device", &in, 1, 1);
    if (!n) return EM_ERR_NOMEM;
    set_history(out, n, 0);
    node_release(n);
    return EM_OK;
}

void em__autograd_tensor_free(em_tensor *t) {
    if (t->grad_fn) {
        for (int k = 0; k < MAX_OUT; k++)
            if (t->grad_fn->retain[k] == t) t->grad_fn->retain[k] = NULL;
        node_release(t->grad_fn);
    }
    em_tensor_release(t->grad);
    hooks_free(t->hooks);
    hooks_free(t->post_hooks);
    em_tensor_release(t->view_base);
}

/* ---- the tensor-side API --------------------------------------------------------------------- */

em_status em_requires_grad_(em_tensor *t, bool on) {
    if (!t) return em__error_pending() ? em_last_status()
                                       : em_set_error(EM_ERR_INVALID, "requires_grad_: NULL tensor");
    if (t->grad_fn)
        return em_set_error(EM_ERR_STATE, "requires_grad_: only leaf tensors can change "
                            "requires_grad; this one was made by '%s' (use em_detach() to get a "
                            "leaf)", t->grad_fn->name);
    if (on && !em_dtype_is_floating(t->dtype))
        return em_set_error(EM_ERR_DTYPE, "requires_grad_: only floating tensors can require "
                            "grad; this one is %s", em_dtype_name(t->dtype));
    t->requires_grad = on;
    return EM_OK;
}

bool em_tensor_requires_grad(const em_tensor *t) { return t && t->requires_grad; }
bool em_tensor_is_leaf(const em_tensor *t) { return t && !t->grad_fn; }
const char *em_tensor_grad_fn_name(const em_tensor *t) {
    return t && t->grad_fn ? t->grad_fn->name : NULL;
}
em_tensor *em_tensor_grad(const em_tensor *t) { return t ? t->grad : NULL; }

em_status em_tensor_set_grad(em_tensor *t, em_tensor *g) {
    if (!t) return em_set_error(EM_ERR_INVALID, "tensor_set_grad: NULL tensor");
    if (g) {
        char a[160], b[160];
        if (g->ndim != t->ndim || memcmp(g->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) ||
            g->dtype != t->dtype || !em_device_equal(g->storage->device, t->storage->device))
            return em_set_error(EM_ERR_SHAPE, "tensor_set_grad: the grad (%s %s) must have the "
                                "tensor's shape and dtype (%s %s) and device",
                                em__shape_str(g->ndim, g->shape, a, sizeof a),
                                em_dtype_name(g->dtype), em__shape_str(t->ndim, t->shape, b, sizeof b),
                                em_dtype_name(t->dtype));
        em_tensor_retain(g);
    }
    em_tensor_release(t->grad);
    t->grad = g;
    return EM_OK;
}

em_status em_retain_grad(em_tensor *t) {
    if (!t) return em_set_error(EM_ERR_INVALID, "retain_grad: NULL tensor");
    if (!t->requires_grad)
        return em_set_error(EM_ERR_STATE, "retain_grad: the tensor does not require grad");
    if (!t->grad_fn) return EM_OK; /* leaves keep their grad anyway */
    t->retains_grad = true;
    t->grad_fn->retain[t->output_nr] = t;
    return EM_OK;
}

em_tensor *em_detach(const em_tensor *t) {
    if (!em__check_inputs("detach", &t, 1)) return NULL;
    return em__scope_track(alias(t));
}

em_status em_tensor_register_hook(em_tensor *t, em_grad_hook_fn fn, void *user) {
    if (!t || !fn) return em_set_error(EM_ERR_INVALID, "register_hook: NULL tensor or function");
    if (!t->requires_grad)
        return em_set_error(EM_ERR_STATE, "register_hook: cannot register a hook on a tensor "
                            "that does not require grad");
    em__hook *h = em__calloc(1, sizeof *h, "grad hook");
    if (!h) return EM_ERR_NOMEM;
    h->fn = fn;
    h->user = user;
    em__hook **list = t->grad_fn ? &t->grad_fn->hooks[t->output_nr] : &t->hooks;
    while (*list) list = &(*list)->next;
    *list = h;
    return EM_OK;
}

em_status em_tensor_register_post_accumulate_hook(em_tensor *t, em_post_accumulate_hook_fn fn,
                                                  void *user) {
    if (!t || !fn)
        return em_set_error(EM_ERR_INVALID, "register_post_accumulate_hook: NULL tensor or "
                            "function");
    if (t->grad_fn || !t->requires_grad)
        return em_set_error(EM_ERR_STATE, "register_post_accumulate_hook: only a leaf that "
                            "requires grad accumulates a .grad (this one %s)",
                            t->grad_fn ? "has a grad_fn" : "does not require grad");
    em__hook *h = em__calloc(1, sizeof *h, "post-accumulate hook");
    if (!h) return EM_ERR_NOMEM;
    h->post = fn;
    h->user = user;
    em__hook **list = &t->post_hooks;
    while (*list) list = &(*list)->next;
    *list = h;
    return EM_OK;
}

em_status em_tensor_remove_post_accumulate_hook(em_tensor *t, em_post_accumulate_hook_fn fn,
                                                void *user) {
    for (em__hook **p = t ? &t->post_hooks : NULL; p && *p; p = &(*p)->next)
        if ((*p)->post == fn && (*p)->user == user) {
            em__hook *h = *p;
            *p = h->next;
            em__free(h);
            return EM_OK;
        }
    return em_set_error(EM_ERR_NOTFOUND, "remove_post_accumulate_hook: no such hook on the "
                        "tensor");
}

/* ---- applying one node ----------------------------------------------------------------------- */

static em_status check_saved(const em__node *n) {
    if (n->released && n->had_saved)
        return em_set_error(EM_ERR_STATE, "backward: trying to backward through the graph a "
                            "second time: the tensors saved by '%s' were freed by the first "
                            "backward; pass retain_graph to the first one if you need this",
                            n->name);
    for (int k = 0; k < MAX_IN + MAX_OUT; k++) {
        const em_tensor *t = k < MAX_IN ? n->saved_in[k] : n->saved_out[k - MAX_IN];
        uint64_t ver = k < MAX_IN ? n->ver_in[k] : n->ver_out[k - MAX_IN];
        if (!t || em_tensor_version(t) == ver) continue;
        char s[160];
        return em_set_error(EM_ERR_STATE, "backward: one of the tensors needed for the gradient "
                            "(%s %d of '%s', shape %s) has been modified by an in-place "
                            "operation: it is at version %llu, but '%s' saved version %llu. Use "
                            "the out-of-place op, or clone the tensor before changing it",
                            k < MAX_IN ? "input" : "output", k < MAX_IN ? k : k - MAX_IN,
                            n->name, em__shape_str(t->ndim, t->shape, s, sizeof s),
                            (unsigned long long)em_tensor_version(t), n->name,
                            (unsigned long long)ver);
    }
    return EM_OK;
}

/* grads[0] for a view node from the view's grad g (inside the engine's scope). */
static em_status apply_view(const em__node *n, em_tensor *g, em_tensor **grads) {
    const em_tensor_meta *m = &n->in_meta[0];
    const em__view_info *v = &n->view;
    em_tensor *r = NULL;
    switch (v->kind) {
    case EM__VIEW_RESHAPE:
        r = em_reshape(g, m->ndim, m->shape);
        break;
    case EM__VIEW_PERMUTE: {
        int inv[EM_MAX_DIMS];
        for (int i = 0; i < m->ndim; i++) inv[v->perm[i]] = i;
        r = em_permute(g, m->ndim, inv);
        break;
    }
    case EM__VIEW_EXPAND: {
        /* Sum over the new leading dims and the dims that were broadcast from size 1. */
        int dims[EM_MAX_DIMS], nd = 0, lead = g->ndim - m->ndim;
        for (int d = 0; d < g->ndim; d++)
            if (d < lead || (m->shape[d - lead] == 1 && g->shape[d] != 1)) dims[nd++] = d;
        r = nd ? em_reshape(em_sum(g, nd, dims, true), m->ndim, m->shape)
               : em_reshape(g, m->ndim, m->shape);
        break;
    }
    case EM__VIEW_STRIDED: {
        em_tensor *z = em_zeros(m->ndim, m->shape, m->dtype, n->in_device[0]);
        em_tensor *part = z ? em__scope_track(em__tensor_view(z, g->ndim, g->shape, v->strides,
                                                              v->offset)) : NULL;
        if (part && em_copy_(part, g) == EM_OK) r = z;
        break;
    }
    case EM__VIEW_NARROW: {
        em_tensor *z = em_zeros(m->ndim, m->shape, m->dtype, n->in_device[0]);
        int64_t len = v->squeezed ? 1 : g->shape[v->dim];
        em_tensor *part = em_slice(z, v->dim, v->start, v->start + len * v->step, v->step);
        em_tensor *src = v->squeezed ? em_unsqueeze(g, v->dim) : g;
        if (part && src && em_copy_(part, src) == EM_OK) r = z;
        break;
    }
    }
    grads[0] = r;
    return r ? EM_OK : em_last_status();
}

/* copy_slices: the base's grad g outside the view's region goes to the old base, the region's
 * to the view's new value. */
static em_status apply_copy_slices(const em__node *n, em_tensor *g, em_tensor **grads) {
    const em_tensor_meta *vm = &n->in_meta[1];
    em_tensor *gc = em_clone(g);
    em_tensor *region = gc ? em__scope_track(em__tensor_view(gc, vm->ndim, vm->shape,
                                                             n->view.strides, n->view.offset))
                           : NULL;
    if (!region) return em_last_status();
    if (n->next[1].node || n->next[1].leaf) {
        if (!(grads[1] = em_clone(region))) return em_last_status();
    }
    if (n->next[0].node || n->next[0].leaf) {
        if (em_fill_(region, 0) != EM_OK) return em_last_status();
        grads[0] = gc;
    }
    return EM_OK;
}

static em_status apply_op(const em__node *n, em_tensor **grads) {
    const em_op_schema *s = em_op_schema_of(n->op);
    if (!s->backward)
        return em_set_error(EM_ERR_STATE, "backward: op '%s' declares no derivative, so "
                            "gradients cannot flow through it (its schema needs a backward "
                            "function, or EM_OP_NONDIFF if it is not differentiable)", n->name);
    bool needs[MAX_IN];
    for (int i = 0; i < n->n_in; i++) needs[i] = n->next[i].node || n->next[i].leaf;
    em_backward_ctx ctx = {.struct_size = sizeof ctx, .op = n->op, .n_in = n->n_in,
                           .n_out = n->n_out, .in = n->saved_in, .out = n->saved_out,
                           .attrs = n->attrs, .grad_out = n->buf, .needs_grad = needs,
                           .in_meta = n->in_meta};
    em_status st = s->backward(&ctx, grads);
    if (st != EM_OK && !em__error_pending())
        em_set_error(st, "backward of '%s' failed: %s", n->name, em_status_str(st));
    return st;
}

/* Run n's backward; grads[i] receives an owned reference per input (or NULL). */
static em_status apply_node(em__node *n, em_tensor **grads) {
    em_status st = check_saved(n);
    if (st != EM_OK) return st;
    if (em_scope_begin() != EM_OK) return em_last_status();
    in_backward++;
    em_tensor *g0 = n->buf[0];
    if (n->kind == NODE_OP) {
        st = apply_op(n, grads);
    } else if (!g0) {
        st = EM_OK;
    } else if (n->kind == NODE_CONST) {
        st = EM_OK;
    } else if (n->kind == NODE_VIEW) {
        st = apply_view(n, g0, grads);
    } else if (n->kind == NODE_COPY_SLICES) {
        st = apply_copy_slices(n, g0, grads);
    } else { /* NODE_TO_DEVICE */
        grads[0] = em_to_device(g0, n->in_device[0]);
        st = grads[0] ? EM_OK : em_last_status();
    }
    /* Take the returned grads out of the scope: the engine owns them. Tensors not in the
     * scope were returned as references of their own (em_tensor_retain). */
    for (int i = 0; i < n->n_in; i++) em__scope_untrack(grads[i]);
    in_backward--;
    em_scope_end();
    if (st != EM_OK) return st;
    for (int i = 0; i < n->n_in; i++) {
        em_tensor *g = grads[i];
        if (!g) continue;
        const em_tensor_meta *m = &n->in_meta[i];
        char a[160], b[160];
        if (g->ndim != m->ndim || memcmp(g->shape, m->shape, sizeof(int64_t) * (size_t)m->ndim) ||
            g->dtype != m->dtype)
            return em_set_error(EM_ERR_INTERNAL, "backward of '%s' returned a gradient of shape "
                                "%s %s for input %d of shape %s %s", n->name,
                                em__shape_str(g->ndim, g->shape, a, sizeof a),
                                em_dtype_name(g->dtype), i,
                                em__shape_str(m->ndim, m->shape, b, sizeof b),
                                em_dtype_name(m->dtype));
        if (anomaly) {
            double v = 0;
            int64_t at = first_bad(g, &v, false);
            if (at >= 0)
                return em_set_error(EM_ERR_RANGE, "anomaly: the backward of '%s' produced %s at "
                                    "element %lld of the gradient of its input %d (shape %s); "
                                    "'%s' was created after: %s", n->name,
                                    isnan(v) ? "NaN" : "Inf", (long long)at, i,
                                    em__shape_str(m->ndim, m->shape, a, sizeof a), n->name,
                                    n->trace ? n->trace : "(no trace)");
        }
    }
    return EM_OK;
}

/* ---- the engine ------------------------------------------------------------------------------------ */

/* Runs hooks on grad (a reference the caller owns); returns the grad to use (owned). */
static em_tensor *run_hooks(em__hook *h, em_tensor *grad) {
    for (; h && grad; h = h->next) {
        bool failed = false;
        em_scope_begin();
        em_tensor *r = h->fn(grad, h->user, &failed);
        em__scope_untrack(r);
        em_scope_end();
        if (failed) {
            em_tensor_release(r);
            em_tensor_release(grad);
            if (!em__error_pending()) em_set_error(EM_ERR_INVALID, "a gradient hook failed");
            return NULL;
        }
        if (r) {
            em_tensor_release(grad);
            grad = r;
        }
    }
    return grad;
}

/* A contribution to leaf (accumulated or not) arrived in run; once every one has, the post
 * hooks run when the run accumulated into its .grad. */
static em_status post_arrive(em_tensor *leaf, uint64_t run, bool accumulated) {
    if (!leaf->post_hooks || leaf->post_run != run) return EM_OK;
    leaf->post_got |= accumulated;
    if (--leaf->post_pending > 0 || !leaf->post_got || !leaf->grad) return EM_OK;
    for (em__hook *h = leaf->post_hooks; h; h = h->next) {
        em_scope_begin();
        em_status st = h->post(leaf, h->user);
        em_scope_end();
        if (st != EM_OK)
            return em__error_pending() ? st
                                       : em_set_error(st, "a post-accumulate hook failed");
    }
    return EM_OK;
}

/* *acc += g (owned g is consumed). */
static em_status accumulate(em_tensor **acc, em_tensor *g) {
    if (!*acc) {
        *acc = g;
        return EM_OK;
    }
    const em_tensor *in[2] = {*acc, g};
    em_tensor *sum = em_add(in[0], in[1]);
    em__scope_untrack(sum);
    em_tensor_release(g);
    if (!sum) return em_last_status();
    em_tensor_release(*acc);
    *acc = sum;
    return EM_OK;
}

static em_status accumulate_leaf(em_tensor *leaf, em_tensor *g) {
    g = run_hooks(leaf->hooks, g);
    if (!g) return em_last_status();
    if (leaf->grad) {
        em_status st = em_add_(leaf->grad, g);
        em_tensor_release(g);
        return st;
    }
    /* Take g as the .grad when nothing else can see it; otherwise a contiguous copy, so the
     * .grad never aliases another tensor (the optimizer updates it in place). */
    bool exclusive = atomic_load(&g->refcount) == 1 && em_tensor_is_contiguous(g) &&
                     !g->requires_grad;
    if (exclusive && g->view_base) /* a view that alone holds its base (a transposed result) */
        exclusive = atomic_load(&g->view_base->refcount) == 1 &&
                    atomic_load(&g->storage->refcount) == 2;
    else if (exclusive)
        exclusive = atomic_load(&g->storage->refcount) == 1;
    if (exclusive && g->view_base) {
        em_tensor_release(g->view_base);
        g->view_base = NULL;
        g->is_view = false;
    }
    em_tensor *own = exclusive ? g : em__clone(g);
    if (!exclusive) em_tensor_release(g);
    if (!own) return em_last_status();
    if (own->storage->block) em_tensor_set_category(own, EM_MEM_GRADIENT);
    leaf->grad = own;
    return EM_OK;
}

typedef struct capture {
    int n;
    em_tensor *const *inputs;
    em_tensor **grads;
} capture;

static int capture_index(const capture *c, const em_tensor *t) {
    for (int k = 0; c && k < c->n; k++)
        if (c->inputs[k] == t) return k;
    return -1;
}

/* Max-heap of nodes by seq: later nodes run first, as in PyTorch. */
typedef struct heap {
    em__node **a;
    size_t n, cap;
} heap;

static bool heap_push(heap *h, em__node *x) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        em__node **p = em__realloc(h->a, h->cap * sizeof *p, nc * sizeof *p, "backward queue");
        if (!p) return false;
        h->a = p;
        h->cap = nc;
    }
    size_t i = h->n++;
    h->a[i] = x;
    while (i && h->a[(i - 1) / 2]->seq < h->a[i]->seq) {
        em__node *t = h->a[i];
        h->a[i] = h->a[(i - 1) / 2];
        h->a[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
    return true;
}

static em__node *heap_pop(heap *h) {
    em__node *top = h->a[0];
    h->a[0] = h->a[--h->n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->a[l]->seq > h->a[m]->seq) m = l;
        if (r < h->n && h->a[r]->seq > h->a[m]->seq) m = r;
        if (m == i) break;
        em__node *t = h->a[i];
        h->a[i] = h->a[m];
        h->a[m] = t;
        i = m;
    }
    return top;
}

/* Collect the nodes reachable from the roots into *all and count each one's incoming edges. */
static em_status collect(em__node *const *roots, int n_roots, uint64_t run, heap *all) {
    heap stack = {0};
    em_status st = EM_OK;
    for (int r = 0; r < n_roots && st == EM_OK; r++) {
        em__node *n = roots[r];
        if (!n || n->run == run) continue;
        n->run = run;
        n->deps = 0;
        if (!heap_push(&stack, n) || !heap_push(all, n)) st = EM_ERR_NOMEM;
    }
    while (st == EM_OK && stack.n) {
        em__node *n = stack.a[--stack.n];
        for (int i = 0; i < n->n_in; i++) {
            em_tensor *leaf = n->next[i].leaf;
            if (leaf && leaf->post_hooks) { /* one more contribution for its post hooks */
                if (leaf->post_run != run) {
                    leaf->post_run = run;
                    leaf->post_pending = 0;
                    leaf->post_got = false;
                }
                leaf->post_pending++;
            }
            em__node *c = n->next[i].node;
            if (!c) continue;
            if (c->run != run) {
                c->run = run;
                c->deps = 0;
                if (!heap_push(&stack, c) || !heap_push(all, c)) {
                    st = EM_ERR_NOMEM;
                    break;
                }
            }
            c->deps++;
        }
    }
    em__free(stack.a);
    return st;
}

static em_status run_backward(int n_roots, em_tensor *const *roots, em_tensor **root_grads,
                              const em_backward_options *opt_in, capture *cap) {
    em_backward_options o = {.struct_size = sizeof o}; /* the caller's by the prefix rule */
    em_status rd = opt_in ? EM__STRUCT_READ(em_backward_options, &o, opt_in,
                                            offsetof(em_backward_options, ext), "backward")
                          : EM_OK;
    const em_backward_options *opt = &o;
    bool retain = opt->retain_graph;
    if (rd != EM_OK || opt->create_graph) { /* the root grads are consumed on every path */
        for (int r = 0; r < n_roots; r++) {
            em_tensor_release(root_grads[r]);
            root_grads[r] = NULL;
        }
        return rd != EM_OK ? rd : em_set_error(EM_ERR_INVALID, "backward: create_graph "
                                               "(higher-order gradients) is not supported");
    }
    uint64_t run = atomic_fetch_add(&run_seq, 1) + 1;
    em__node *root_nodes[16];
    for (int r = 0; r < n_roots; r++) root_nodes[r] = roots[r]->grad_fn;
    heap all = {0}, ready = {0};
    em_status st = collect(root_nodes, n_roots, run, &all);
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_scope_begin();
    /* Seed the roots. */
    for (int r = 0; r < n_roots && st == EM_OK; r++) {
        em_tensor *g = root_grads[r];
        root_grads[r] = NULL;
        em__node *n = roots[r]->grad_fn;
        int k = capture_index(cap, roots[r]);
        if (k >= 0) {
            em_tensor_retain(g);
            st = accumulate(&cap->grads[k], g);
        }
        if (st != EM_OK) {
            em_tensor_release(g);
        } else if (n) {
            st = accumulate(&n->buf[roots[r]->output_nr], g);
        } else if (!cap) {
            em_tensor *lf = roots[r]; /* backward from a leaf: its one contribution */
            st = accumulate_leaf(lf, g);
            if (st == EM_OK && lf->post_hooks) {
                if (lf->post_run != run) {
                    lf->post_run = run;
                    lf->post_pending = 0;
                    lf->post_got = false;
                }
                lf->post_pending++;
                st = post_arrive(lf, run, true);
            }
        } else {
            em_tensor_release(g);
        }
    }
    for (size_t i = 0; i < all.n && st == EM_OK; i++)
        if (all.a[i]->deps == 0 && !heap_push(&ready, all.a[i])) st = EM_ERR_NOMEM;
    while (st == EM_OK && ready.n) {
        em__node *n = heap_pop(&ready);
        /* Hooks, retain_grad and captures see the grad of each output. */
        for (int j = 0; j < n->n_out && st == EM_OK; j++) {
            if (!n->buf[j]) continue;
            if (n->hooks[j] && !(n->buf[j] = run_hooks(n->hooks[j], n->buf[j]))) st = em_last_status();
            em_tensor *t = n->retain[j];
            if (st == EM_OK && t && !cap) st = accumulate(&t->grad, em__clone(n->buf[j]));
            int k = st == EM_OK && t ? capture_index(cap, t) : -1;
            if (k >= 0) st = accumulate(&cap->grads[k], em_tensor_retain(n->buf[j]));
        }
        for (int k = 0; cap && k < cap->n && st == EM_OK; k++) {
            const em_tensor *t = cap->inputs[k];
            if (t->grad_fn == n && !n->retain[t->output_nr] && n->buf[t->output_nr])
                st = accumulate(&cap->grads[k], em_tensor_retain(n->buf[t->output_nr]));
        }
        em_tensor *grads[MAX_IN] = {0};
        bool any = false;
        for (int j = 0; j < n->n_out; j++) any |= n->buf[j] != NULL;
        if (st == EM_OK && any) st = apply_node(n, grads);
        /* The node's grads are spent: releasing them first lets a leaf take a grad that is a
         * view of one (a transposed weight's) without a copy. */
        for (int j = 0; j < n->n_out; j++) {
            em_tensor_release(n->buf[j]);
            n->buf[j] = NULL;
        }
        for (int i = 0; i < n->n_in; i++) {
            edge *e = &n->next[i];
            em_tensor *g = grads[i];
            grads[i] = NULL;
            bool to_leaf = false; /* a contribution accumulated into e->leaf's .grad */
            if (st != EM_OK || !g) {
                em_tensor_release(g);
            } else if (e->leaf) {
                int k = capture_index(cap, e->leaf);
                if (k >= 0) st = accumulate(&cap->grads[k], g);
                else if (!cap) st = accumulate_leaf(e->leaf, g), to_leaf = true;
                else em_tensor_release(g);
            } else if (e->node) {
                st = accumulate(&e->node->buf[e->output_nr], g);
            } else {
                em_tensor_release(g);
            }
            if (e->leaf && !cap && st == EM_OK) st = post_arrive(e->leaf, run, to_leaf);
            if (e->node && --e->node->deps == 0 && st == EM_OK && !heap_push(&ready, e->node))
                st = EM_ERR_NOMEM;
        }
        if (!retain && st == EM_OK) {
            free_saved(n);
            n->released = true;
        }
    }
    /* On error, nodes that never ran still hold buffers. */
    for (size_t i = 0; i < all.n; i++)
        for (int j = 0; j < all.a[i]->n_out; j++) {
            em_tensor_release(all.a[i]->buf[j]);
            all.a[i]->buf[j] = NULL;
        }
    em_scope_end();
    em_grad_mode_pop();
    em__free(all.a);
    em__free(ready.a);
    if (st == EM_ERR_NOMEM && !em__error_pending())
        em_set_error(st, "backward: out of memory");
    return st;
}

static em_status check_root(const char *who, const em_tensor *t) {
    if (!t) return em__error_pending() ? em_last_status()
                                       : em_set_error(EM_ERR_INVALID, "%s: NULL tensor", who);
    if (!t->requires_grad)
        return em_set_error(EM_ERR_STATE, "%s: the tensor does not require grad and has no "
                            "grad_fn (was it computed under EM_GRAD_DISABLED, or do the "
                            "parameters lack em_requires_grad_?)", who);
    return EM_OK;
}

/* The root grad: `grad` checked against t, or ones for a one-element t. Owned. */
static em_tensor *root_grad(const char *who, const em_tensor *t, const em_tensor *grad) {
    char a[160], b[160];
    if (!grad) {
        if (t->numel != 1) {
            em_set_error(EM_ERR_SHAPE, "%s: a gradient can be created implicitly only for a "
                         "one-element tensor, this one has shape %s; pass the gradient "
                         "(em_backward_with)", who, em__shape_str(t->ndim, t->shape, a, sizeof a));
            return NULL;
        }
        return em__full(t->ndim, t->shape, 1.0, t->dtype, t->storage->device);
    }
    if (grad->ndim != t->ndim || memcmp(grad->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim)) {
        em_set_error(EM_ERR_SHAPE, "%s: the gradient has shape %s but the tensor has shape %s",
                     who, em__shape_str(grad->ndim, grad->shape, a, sizeof a),
                     em__shape_str(t->ndim, t->shape, b, sizeof b));
        return NULL;
    }
    em_tensor *g = em__to_dtype(grad, t->dtype);
    em_tensor *d = g ? em__to_device(g, t->storage->device) : NULL;
    em_tensor_release(g);
    return d;
}

em_status em_backward_with(em_tensor *t, const em_tensor *grad, const em_backward_options *opt) {
    em_status st = check_root("backward", t);
    if (st != EM_OK) return st;
    em_tensor *g = root_grad("backward", t, grad);
    if (!g) return em_last_status();
    int ac = em__autocast_suspend(); /* derivatives run in their forward's dtypes */
    st = run_backward(1, &t, &g, opt, NULL);
    em__autocast_resume(ac);
    em_tensor_release(g); /* NULL once the run consumed it */
    return st;
}

em_status em_backward(em_tensor *loss) { return em_backward_with(loss, NULL, NULL); }

em_status em_grad(int n_out, em_tensor *const *outputs, const em_tensor *const *grad_outputs,
                  int n_in, em_tensor *const *inputs, em_tensor **grads,
                  const em_backward_options *opt) {
    if (n_out < 1 || n_out > 16 || n_in < 1 || !outputs || !inputs || !grads)
        return em_set_error(EM_ERR_INVALID, "grad: 1..16 outputs and at least one input are "
                            "required, with an array for the results");
    for (int k = 0; k < n_in; k++) grads[k] = NULL;
    for (int k = 0; k < n_in; k++)
        if (!inputs[k] || !inputs[k]->requires_grad)
            return em_set_error(EM_ERR_STATE, "grad: input %d does not require grad", k);
    em_tensor *rg[16] = {0};
    em_status st = EM_OK;
    for (int r = 0; r < n_out && st == EM_OK; r++) {
        st = check_root("grad", outputs[r]);
        if (st == EM_OK && !(rg[r] = root_grad("grad", outputs[r], grad_outputs ? grad_outputs[r] : NULL)))
            st = em_last_status();
    }
    capture cap = {n_in, inputs, grads};
    int ac = em__autocast_suspend();
    if (st == EM_OK) st = run_backward(n_out, outputs, rg, opt, &cap);
    em__autocast_resume(ac);
    for (int r = 0; r < n_out; r++) em_tensor_release(rg[r]);
    if (st != EM_OK)
        for (int k = 0; k < n_in; k++) {
            em_tensor_release(grads[k]);
            grads[k] = NULL;
        }
    for (int k = 0; k < n_in && st == EM_OK; k++) em__scope_track(grads[k]);
    return st;
}

/* ---- graph dump --------------------------------------------------------------------------------- */

static size_t saved_bytes(const em__node *n) {
    size_t b = 0;
    for (int i = 0; i < MAX_IN; i++) b += n->saved_in[i] ? em_tensor_nbytes(n->saved_in[i]) : 0;
    for (int j = 0; j < MAX_OUT; j++) b += n->saved_out[j] ? em_tensor_nbytes(n->saved_out[j]) : 0;
    return b;
}

em_status em_graph_dump(const em_tensor *t, FILE *f) {
    if (!t || !f) return em_set_error(EM_ERR_INVALID, "graph_dump: NULL tensor or file");
    char s[160], dev[48];
    fprintf(f, "digraph ember {\n  node [shape=box, fontname=\"monospace\"];\n");
    fprintf(f, "  t [label=\"tensor %s %s %s\", shape=ellipse];\n",
            em__shape_str(t->ndim, t->shape, s, sizeof s), em_dtype_name(t->dtype),
            em_device_str(t->storage->device, dev, sizeof dev));
    if (!t->grad_fn) {
        fprintf(f, "}\n");
        return EM_OK;
    }
    uint64_t run = atomic_fetch_add(&run_seq, 1) + 1;
    heap all = {0};
    em__node *root = t->grad_fn;
    em_status st = collect(&root, 1, run, &all);
    fprintf(f, "  n%p -> t;\n", (void *)root);
    size_t leaves = 0;
    for (size_t i = 0; i < all.n && st == EM_OK; i++) {
        em__node *n = all.a[i];
        fprintf(f, "  n%p [label=\"%s", (void *)n, n->name);
        for (int j = 0; j < n->n_out; j++)
            fprintf(f, "\\nout %s %s", em__shape_str(n->out_meta[j].ndim, n->out_meta[j].shape,
                                                     s, sizeof s),
                    em_dtype_name(n->out_meta[j].dtype));
        fprintf(f, "\\non %s\\nsaved %zu bytes%s\"];\n",
                em_device_str(n->in_device[0], dev, sizeof dev), saved_bytes(n),
                n->released && n->had_saved ? " (freed)" : "");
        for (int i2 = 0; i2 < n->n_in; i2++) {
            const edge *e = &n->next[i2];
            if (e->node) {
                fprintf(f, "  n%p -> n%p;\n", (void *)e->node, (void *)n);
            } else if (e->leaf) {
                fprintf(f, "  l%zu [label=\"leaf %s %s\", shape=ellipse];\n  l%zu -> n%p;\n",
                        leaves, em__shape_str(e->leaf->ndim, e->leaf->shape, s, sizeof s),
                        em_dtype_name(e->leaf->dtype), leaves, (void *)n);
                leaves++;
            }
        }
    }
    fprintf(f, "}\n");
    em__free(all.a);
    if (st != EM_OK) return st;
    return ferror(f) ? em_set_error(EM_ERR_IO, "graph_dump: write failed") : EM_OK;
}

/* ---- what the tracer asks (trace.c) ------------------------------------------------------------ */

uint64_t em__autograd_seq(void) { return atomic_load(&node_seq); }

void em__autograd_leaf_edges(const em_tensor *t, uint64_t since,
                             void (*fn)(void *user, const em_tensor *leaf, const char *node),
                             void *user) {
    if (!t || !t->grad_fn || t->grad_fn->seq <= since) return;
    const em__node *stack[64], *seen[256];
    int sp = 0, ns = 0;
    stack[sp++] = t->grad_fn;
    while (sp) {
        const em__node *n = stack[--sp];
        bool dup = false;
        for (int i = 0; i < ns && !dup; i++) dup = seen[i] == n;
        if (dup) continue;
        if (ns < (int)EM_ARRAY_LEN(seen)) seen[ns++] = n;
        for (int i = 0; i < n->n_in; i++) {
            const edge *e = &n->next[i];
            if (e->leaf) fn(user, e->leaf, n->name);
            else if (e->node && e->node->seq > since && sp < (int)EM_ARRAY_LEN(stack))
                stack[sp++] = e->node;
        }
    }
}
