/*
 * trace.c — the forward-graph tracer (ember/trace.h): an observer that turns the calls a
 * thread makes between em_trace_begin and em_trace_end into nodes and edges, and writes them
 * as JSON (jansson) and Graphviz dot.
 *
 * Identity. The tracer keeps no reference to the tensors it sees (tracing must not change
 * what holds memory): a table maps a tensor's address to the value it was last seen as (a
 * node's output, a graph input, or a parameter or buffer of the module, whose state dict the
 * trace holds). An address can be reused once its tensor is freed, so an entry also records
 * the storage's identity (never reused) and the tensor's geometry, and an entry that no longer
 * matches is a new tensor.
 *
 * Nesting. A call that begins inside a recorded composite is a node with the composite as its
 * parent; a call inside any other node (an op's broadcast views, its dtype casts, the kernel
 * stage of an in-place op or a copy) is part of that node and is not recorded.
 */
#include <jansson.h>
#include <string.h>

#include "ember/autograd.h"
#include "ember/device.h"
#include "ember/dict.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/tensor.h"
#include "ember/trace.h"
#include "internal.h"
#include "observe.h"

/* ---- an arena for the trace's strings and arrays -------------------------------------------- */

typedef struct block {
    struct block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} block;

static void *arena_alloc(block **a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!*a || (*a)->cap - (*a)->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        block *b = em__malloc(sizeof *b + cap, "trace");
        if (!b) return NULL;
        b->next = *a, b->used = 0, b->cap = cap;
        *a = b;
    }
    void *p = (*a)->data + (*a)->used;
    (*a)->used += n;
    memset(p, 0, n);
    return p;
}

static char *arena_strdup(block **a, const char *s) {
    size_t n = strlen(s) + 1;
    char *p = arena_alloc(a, n);
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- the tensor table --------------------------------------------------------------------------- */

typedef struct entry {
    const em_tensor *key;      /* NULL: empty slot */
    em_trace_source source;
    int64_t node, input;
    int output;
    const char *name;          /* parameter, buffer, input: arena */
    uint64_t storage, geometry;
} entry;

typedef struct table {
    entry *e;
    size_t cap, n;
} table;

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

static uint64_t geometry_of(const em_tensor *t) {
    uint64_t h = mix((uint64_t)t->dtype, (uint64_t)t->ndim);
    h = mix(h, (uint64_t)t->offset);
    for (int d = 0; d < t->ndim; d++) h = mix(mix(h, (uint64_t)t->shape[d]), (uint64_t)t->strides[d]);
    return h;
}

static size_t slot_of(const table *tb, const em_tensor *t) {
    uint64_t h = (uint64_t)(uintptr_t)t * 0x9e3779b97f4a7c15ull;
    size_t i = (size_t)(h >> 17) & (tb->cap - 1);
    while (tb->e[i].key && tb->e[i].key != t) i = (i + 1) & (tb->cap - 1);
    return i;
}

static bool table_grow(table *tb) {
    size_t cap = tb->cap ? tb->cap * 2 : 256;
    entry *e = em__calloc(cap, sizeof *e, "trace");
    if (!e) return false;
    table old = *tb;
    tb->e = e, tb->cap = cap;
    for (size_t i = 0; i < old.cap; i++)
        if (old.e[i].key) tb->e[slot_of(tb, old.e[i].key)] = old.e[i];
    em__free(old.e);
    return true;
}

/* The slot for t (a new one when absent), or NULL when the table cannot grow. */
static entry *table_put(table *tb, const em_tensor *t) {
    if ((tb->n + 1) * 2 > tb->cap && !table_grow(tb)) return NULL;
    entry *e = &tb->e[slot_of(tb, t)];
    if (!e->key) {
        e->key = t;
        tb->n++;
    }
    return e;
}

/* The entry t was last recorded as, or NULL when it is not known (or its address now holds
 * another tensor). */
static const entry *table_get(const table *tb, const em_tensor *t) {
    if (!tb->cap) return NULL;
    const entry *e = &tb->e[slot_of(tb, t)];
    if (!e->key) return NULL;
    if (e->source == EM_TRACE_FROM_PARAMETER || e->source == EM_TRACE_FROM_BUFFER) return e;
    return e->storage == em__storage_id(t) && e->geometry == geometry_of(t) ? e : NULL;
}

/* ---- the trace ------------------------------------------------------------------------------------ */

typedef struct tnode {
    em_trace_node pub;
    em_trace_value *in, *out;
    em_attr *attrs;
    const char **attr_names;
    int64_t *children;
    int cap_children;
    bool grad_on;
    uint64_t seq0;             /* autograd node count when it began */
} tnode;

typedef struct open_call {
    uint64_t id;
    int64_t node;              /* -1: not recorded */
    bool composite;
} open_call;

struct em_trace {
    tnode *nodes;
    size_t n, cap;
    block *arena;
    const char **inputs;       /* graph input names, by number */
    size_t n_inputs, cap_inputs;
    /* while recording */
    table tb;
    em_dict *state;            /* the module's parameters and buffers, retained */
    open_call *open;
    size_t n_open, cap_open;
    em_status failed;          /* the first allocation failure */
    em_observer obs;
};

static _Thread_local em_trace *recording;

static void fail(em_trace *tr) {
    if (tr->failed == EM_OK) tr->failed = EM_ERR_NOMEM;
}

static void value_meta(em_trace_value *v, const em_tensor *t) {
    v->dtype = t->dtype;
    v->device = t->storage->device;
    v->ndim = t->ndim;
    memcpy(v->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
}

/* What the tensor t read as an input of a node at depth `depth` is. */
static void resolve(em_trace *tr, const em_tensor *t, int depth, em_trace_value *v) {
    v->node = -1, v->input = -1;
    if (!t) {
        v->source = EM_TRACE_FROM_NONE;
        return;
    }
    value_meta(v, t);
    const entry *e = table_get(&tr->tb, t);
    if (!e && depth > 0) {
        v->source = EM_TRACE_FROM_LOCAL; /* the composite around it allocated it */
        return;
    }
    if (!e) {
        char name[32];
        snprintf(name, sizeof name, "input%zu", tr->n_inputs);
        if (tr->n_inputs == tr->cap_inputs) {
            size_t nc = tr->cap_inputs ? tr->cap_inputs * 2 : 8;
            const char **p = em__realloc(tr->inputs, tr->cap_inputs * sizeof *p, nc * sizeof *p,
                                         "trace");
            if (!p) return fail(tr);
            tr->inputs = p, tr->cap_inputs = nc;
        }
        entry *n = table_put(&tr->tb, t);
        const char *s = arena_strdup(&tr->arena, name);
        if (!n || !s) return fail(tr);
        *n = (entry){.key = t, .source = EM_TRACE_FROM_INPUT, .node = -1,
                     .input = (int64_t)tr->n_inputs, .name = s, .storage = em__storage_id(t),
                     .geometry = geometry_of(t)};
        tr->inputs[tr->n_inputs++] = s;
        e = n;
    }
    v->source = e->source;
    v->node = e->node;
    v->output = e->output;
    v->input = e->input;
    v->name = e->name;
}

static const em_attr no_attr;

/* Copy an attribute into the arena (strings and lists are borrowed by the call). */
static void copy_attr(em_trace *tr, const em_attr *a, em_attr *to) {
    *to = *a;
    if (a->type == EM_ATTR_INTS && (a->n < 0 || a->n > EM_MAX_DIMS)) to->n = a->n < 0 ? 0 : EM_MAX_DIMS;
    if (a->type == EM_ATTR_STRING && a->v.s && !(to->v.s = arena_strdup(&tr->arena, a->v.s)))
        fail(tr);
    if (a->type == EM_ATTR_INT_LIST) {
        int64_t *l = a->n > 0 && a->v.list ? arena_alloc(&tr->arena, sizeof *l * (size_t)a->n) : NULL;
        if (a->n > 0 && a->v.list && !l) return fail(tr);
        if (l) memcpy(l, a->v.list, sizeof *l * (size_t)a->n);
        to->v.list = l;
        to->n = l ? a->n : 0;
    }
}

static bool add_child(em_trace *tr, tnode *p, int64_t child) {
    if (p->pub.n_children == p->cap_children) {
        int nc = p->cap_children ? p->cap_children * 2 : 4;
        int64_t *c = em__realloc(p->children, sizeof *c * (size_t)p->cap_children,
                                 sizeof *c * (size_t)nc, "trace");
        if (!c) {
            fail(tr);
            return false;
        }
        p->children = c, p->cap_children = nc;
    }
    p->children[p->pub.n_children++] = child;
    return true;
}

/* Whether t is already a value of the trace (a call writing into it works in place). */
static bool known(const em_trace *tr, const em_tensor *t) { return t && table_get(&tr->tb, t); }

static void on_begin(void *user, const em_op_event *ev) {
    em_trace *tr = user;
    if (tr->failed != EM_OK) return;
    if (tr->n_open == tr->cap_open) {
        size_t nc = tr->cap_open ? tr->cap_open * 2 : 16;
        open_call *o = em__realloc(tr->open, tr->cap_open * sizeof *o, nc * sizeof *o, "trace");
        if (!o) return fail(tr);
        tr->open = o, tr->cap_open = nc;
    }
    open_call *up = tr->n_open ? &tr->open[tr->n_open - 1] : NULL;
    open_call *oc = &tr->open[tr->n_open++];
    *oc = (open_call){.id = ev->id, .node = -1, .composite = false};
    if (up && (up->node < 0 || !up->composite)) return; /* part of the node it runs inside */
    if (tr->n == tr->cap) {
        size_t nc = tr->cap ? tr->cap * 2 : 64;
        tnode *p = em__realloc(tr->nodes, tr->cap * sizeof *p, nc * sizeof *p, "trace");
        if (!p) return fail(tr);
        tr->nodes = p, tr->cap = nc;
    }
    int64_t idx = (int64_t)tr->n;
    tnode *n = &tr->nodes[tr->n++];
    memset(n, 0, sizeof *n);
    oc->node = idx;
    oc->composite = ev->kind == EM_OP_EVENT_COMPOSITE;
    n->pub.kind = ev->kind;
    n->pub.parent = up ? up->node : -1;
    n->pub.depth = up ? tr->nodes[up->node].pub.depth + 1 : 0;
    if (!(n->pub.op = arena_strdup(&tr->arena, ev->name ? ev->name : "?"))) return fail(tr);
    if (up && !add_child(tr, &tr->nodes[up->node], idx)) return;
    n->pub.n_in = ev->n_in;
    if (ev->n_in && !(n->in = arena_alloc(&tr->arena, sizeof *n->in * (size_t)ev->n_in)))
        return fail(tr);
    for (int i = 0; i < ev->n_in; i++) resolve(tr, ev->in[i], n->pub.depth, &n->in[i]);
    n->pub.n_attrs = ev->n_attrs;
    if (ev->n_attrs) {
        n->attrs = arena_alloc(&tr->arena, sizeof *n->attrs * (size_t)ev->n_attrs);
        n->attr_names = arena_alloc(&tr->arena, sizeof *n->attr_names * (size_t)ev->n_attrs);
        if (!n->attrs || !n->attr_names) return fail(tr);
        for (int i = 0; i < ev->n_attrs; i++) {
            copy_attr(tr, ev->attrs ? &ev->attrs[i] : &no_attr, &n->attrs[i]);
            const char *nm = ev->attr_names && ev->attr_names[i] ? ev->attr_names[i] : "?";
            if (!(n->attr_names[i] = arena_strdup(&tr->arena, nm))) return fail(tr);
        }
    }
    bool writes = ev->kind == EM_OP_EVENT_INPLACE ||
                  (ev->kind == EM_OP_EVENT_COPY && strcmp(ev->name, "copy_") == 0);
    for (int j = 0; j < ev->n_out && ev->out && !writes && ev->kind == EM_OP_EVENT_OUT; j++)
        writes = known(tr, ev->out[j]);
    n->pub.inplace = writes;
    n->grad_on = em_grad_enabled();
    n->seq0 = n->grad_on ? em__autograd_seq() : 0;
}

typedef struct leaf_ctx {
    em_trace *tr;
    tnode *n;
    const em_op_event *ev;
} leaf_ctx;

/* A backward node made by this call leads to leaf: the gradient op of the parameter it is. */
static void on_leaf(void *user, const em_tensor *leaf, const char *node) {
    leaf_ctx *c = user;
    for (int i = 0; i < c->n->pub.n_in; i++) {
        em_trace_value *v = &c->n->in[i];
        if (c->ev->in[i] != leaf || v->source != EM_TRACE_FROM_PARAMETER || v->grad_op) continue;
        if (!(v->grad_op = arena_strdup(&c->tr->arena, node))) fail(c->tr);
    }
}

static void on_end(void *user, const em_op_event *ev) {
    em_trace *tr = user;
    if (tr->failed != EM_OK || !tr->n_open) return;
    open_call oc = tr->open[--tr->n_open];
    if (oc.id != ev->id || oc.node < 0) return;
    tnode *n = &tr->nodes[oc.node];
    if (ev->status != EM_OK) {
        n->pub.n_out = 0; /* a failed call: kept, with no outputs, as the call that failed */
        return;
    }
    n->pub.n_out = ev->n_out;
    if (ev->n_out && !(n->out = arena_alloc(&tr->arena, sizeof *n->out * (size_t)ev->n_out)))
        return fail(tr);
    for (int j = 0; j < ev->n_out; j++) {
        const em_tensor *t = ev->out[j];
        em_trace_value *v = &n->out[j];
        v->source = EM_TRACE_FROM_NODE, v->node = oc.node, v->output = j, v->input = -1;
        if (!t) continue;
        value_meta(v, t);
        if (!n->pub.inplace) n->pub.bytes += em__obs_new_bytes(ev, j);
        entry *e = table_put(&tr->tb, t);
        if (!e) return fail(tr);
        if (e->source == EM_TRACE_FROM_PARAMETER || e->source == EM_TRACE_FROM_BUFFER) continue;
        *e = (entry){.key = t, .source = EM_TRACE_FROM_NODE, .node = oc.node, .output = j,
                     .input = -1, .storage = em__storage_id(t), .geometry = geometry_of(t)};
    }
    if (!n->grad_on) return;
    if (ev->n_out && ev->out[0] && em_tensor_grad_fn_name(ev->out[0]) &&
        !(n->pub.grad_fn = arena_strdup(&tr->arena, em_tensor_grad_fn_name(ev->out[0]))))
        return fail(tr);
    leaf_ctx c = {tr, n, ev};
    for (int j = 0; j < ev->n_out; j++) em__autograd_leaf_edges(ev->out[j], n->seq0, on_leaf, &c);
}

static void trace_free_parts(em_trace *tr) {
    for (size_t i = 0; i < tr->n; i++) em__free(tr->nodes[i].children);
    em__free(tr->nodes);
    em__free(tr->inputs);
    em__free(tr->tb.e);
    em__free(tr->open);
    em_dict_free(tr->state);
    for (block *b = tr->arena, *nb; b; b = nb) {
        nb = b->next;
        em__free(b);
    }
}

void em_trace_free(em_trace *tr) {
    if (!tr) return;
    trace_free_parts(tr);
    em__free(tr);
}

/* Name the module's parameters and persistent buffers by their state-dict keys. */
static em_status name_state(em_trace *tr, const em_module *m) {
    em_dict *params = em_module_named_parameters(m, false);
    tr->state = em_module_state_dict(m);
    em_status st = params && tr->state ? EM_OK : em_last_status();
    for (size_t i = 0; st == EM_OK && i < em_dict_len(tr->state); i++) {
        em_tensor *t = em_dict_value(tr->state, i);
        const char *key = em_dict_key(tr->state, i);
        entry *e = table_put(&tr->tb, t);
        const char *s = arena_strdup(&tr->arena, key);
        if (!e || !s) {
            st = EM_ERR_NOMEM;
            break;
        }
        bool param = em_dict_get(params, key) == t;
        *e = (entry){.key = t, .source = param ? EM_TRACE_FROM_PARAMETER : EM_TRACE_FROM_BUFFER,
                     .node = -1, .input = -1, .name = s};
    }
    /* A parameter outside the state dict (none today) is still a parameter. */
    for (size_t i = 0; st == EM_OK && params && i < em_dict_len(params); i++) {
        em_tensor *t = em_dict_value(params, i);
        if (table_get(&tr->tb, t)) continue;
        entry *e = table_put(&tr->tb, t);
        const char *s = arena_strdup(&tr->arena, em_dict_key(params, i));
        if (!e || !s) {
            st = EM_ERR_NOMEM;
            break;
        }
        *e = (entry){.key = t, .source = EM_TRACE_FROM_PARAMETER, .node = -1, .input = -1,
                     .name = s};
    }
    em_dict_free(params);
    return st;
}

em_status em_trace_begin(const em_trace_options *opt) {
    if (opt && opt->struct_size < offsetof(em_trace_options, ext))
        return em_set_error(EM_ERR_INVALID, "trace_begin: options struct_size %zu is too small",
                            opt->struct_size);
    if (recording)
        return em_set_error(EM_ERR_STATE, "trace_begin: this thread is recording a trace "
                            "already (end it with em_trace_end first)");
    em_trace *tr = em__calloc(1, sizeof *tr, "trace");
    if (!tr) return EM_ERR_NOMEM;
    em_status st = table_grow(&tr->tb) ? EM_OK : EM_ERR_NOMEM;
    if (st == EM_OK && opt && opt->module) st = name_state(tr, opt->module);
    tr->obs = (em_observer){.struct_size = sizeof tr->obs, .begin = on_begin, .end = on_end,
                            .user = tr};
    if (st == EM_OK) st = em_observer_push(&tr->obs);
    if (st != EM_OK) {
        em_trace_free(tr);
        return st;
    }
    recording = tr;
    return EM_OK;
}

em_trace *em_trace_end(void) {
    em_trace *tr = recording;
    if (!tr) {
        em_set_error(EM_ERR_STATE, "trace_end: this thread is not recording a trace "
                     "(em_trace_begin)");
        return NULL;
    }
    if (em_observer_pop(&tr->obs) != EM_OK) return NULL; /* inside a callback: still recording */
    recording = NULL;
    em_dict_free(tr->state);
    tr->state = NULL;
    em__free(tr->tb.e);
    tr->tb = (table){0};
    em__free(tr->open);
    tr->open = NULL, tr->n_open = tr->cap_open = 0;
    if (tr->failed != EM_OK) {
        em_trace_free(tr);
        em_set_error(EM_ERR_NOMEM, "trace_end: out of memory while recording the trace");
        return NULL;
    }
    for (size_t i = 0; i < tr->n; i++) {
        tnode *n = &tr->nodes[i];
        n->pub.in = n->in;
        n->pub.out = n->out;
        n->pub.attrs = n->attrs;
        n->pub.attr_names = n->attr_names;
        n->pub.children = n->children;
    }
    return tr;
}

size_t em_trace_node_count(const em_trace *tr) { return tr ? tr->n : 0; }
const em_trace_node *em_trace_node_at(const em_trace *tr, size_t i) {
    return tr && i < tr->n ? &tr->nodes[i].pub : NULL;
}
size_t em_trace_input_count(const em_trace *tr) { return tr ? tr->n_inputs : 0; }

/* ---- JSON ----------------------------------------------------------------------------------------- */

static const char *kind_name(em_op_event_kind k) {
    switch (k) {
    case EM_OP_EVENT_OP: return "op";
    case EM_OP_EVENT_COMPOSITE: return "composite";
    case EM_OP_EVENT_OUT: return "out";
    case EM_OP_EVENT_INPLACE: return "inplace";
    case EM_OP_EVENT_LIST: return "list";
    case EM_OP_EVENT_VIEW: return "view";
    case EM_OP_EVENT_COPY: return "copy";
    }
    return "?";
}

static const char *source_name(em_trace_source s) {
    switch (s) {
    case EM_TRACE_FROM_NODE: return "node";
    case EM_TRACE_FROM_INPUT: return "input";
    case EM_TRACE_FROM_PARAMETER: return "parameter";
    case EM_TRACE_FROM_BUFFER: return "buffer";
    case EM_TRACE_FROM_NONE: return "none";
    case EM_TRACE_FROM_LOCAL: return "local";
    }
    return "?";
}

static json_t *ints_json(int n, const int64_t *v) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer((json_int_t)v[i]));
    return a;
}

static json_t *attr_json(const em_attr *a) {
    switch (a->type) {
    case EM_ATTR_NONE: return json_null();
    case EM_ATTR_INT: return json_integer((json_int_t)a->v.i);
    case EM_ATTR_FLOAT: return json_real(a->v.f);
    case EM_ATTR_BOOL: return json_boolean(a->v.b);
    case EM_ATTR_INTS: return ints_json(a->n, a->ints);
    case EM_ATTR_INT_LIST: return ints_json(a->n, a->v.list);
    case EM_ATTR_STRING: return json_string(a->v.s ? a->v.s : "");
    }
    return json_null();
}

static json_t *value_json(const em_trace_value *v) {
    json_t *o = json_object();
    if (!o) return NULL;
    json_object_set_new(o, "from", json_string(source_name(v->source)));
    if (v->source == EM_TRACE_FROM_NONE || v->source == EM_TRACE_FROM_LOCAL) return o;
    if (v->source == EM_TRACE_FROM_NODE) {
        json_object_set_new(o, "node", json_integer((json_int_t)v->node));
        json_object_set_new(o, "output", json_integer(v->output));
    }
    if (v->name) json_object_set_new(o, "name", json_string(v->name));
    char dev[48];
    json_object_set_new(o, "dtype", json_string(em_dtype_name(v->dtype)));
    json_object_set_new(o, "shape", ints_json(v->ndim, v->shape));
    json_object_set_new(o, "device", json_string(em_device_str(v->device, dev, sizeof dev)));
    if (v->grad_op) json_object_set_new(o, "grad_op", json_string(v->grad_op));
    return o;
}

em_status em_trace_write_json(const em_trace *tr, FILE *f) {
    if (!tr || !f) return em_set_error(EM_ERR_INVALID, "trace_write_json: NULL trace or file");
    json_t *root = json_object(), *nodes = json_array(), *inputs = json_array();
    if (!root || !nodes || !inputs) {
        json_decref(root), json_decref(nodes), json_decref(inputs);
        return em_set_error(EM_ERR_NOMEM, "trace_write_json: out of memory");
    }
    for (size_t i = 0; i < tr->n; i++) {
        const em_trace_node *n = &tr->nodes[i].pub;
        json_t *o = json_object(), *in = json_array(), *out = json_array(), *at = json_object();
        json_object_set_new(o, "id", json_integer((json_int_t)i));
        json_object_set_new(o, "op", json_string(n->op));
        json_object_set_new(o, "kind", json_string(kind_name(n->kind)));
        json_object_set_new(o, "parent", n->parent < 0 ? json_null()
                                                       : json_integer((json_int_t)n->parent));
        for (int k = 0; k < n->n_in; k++) json_array_append_new(in, value_json(&n->in[k]));
        for (int k = 0; k < n->n_out; k++) json_array_append_new(out, value_json(&n->out[k]));
        for (int k = 0; k < n->n_attrs; k++)
            json_object_set_new(at, n->attr_names[k], attr_json(&n->attrs[k]));
        json_object_set_new(o, "inputs", in);
        json_object_set_new(o, "outputs", out);
        json_object_set_new(o, "attrs", at);
        json_object_set_new(o, "inplace", json_boolean(n->inplace));
        json_object_set_new(o, "grad_fn", n->grad_fn ? json_string(n->grad_fn) : json_null());
        json_object_set_new(o, "bytes", json_integer((json_int_t)n->bytes));
        json_object_set_new(o, "children", json_array());
        for (int k = 0; k < n->n_children; k++)
            json_array_append_new(json_object_get(o, "children"),
                                  json_integer((json_int_t)n->children[k]));
        json_array_append_new(nodes, o);
    }
    for (size_t i = 0; i < tr->n_inputs; i++) json_array_append_new(inputs, json_string(tr->inputs[i]));
    json_object_set_new(root, "nodes", nodes);
    json_object_set_new(root, "inputs", inputs);
    int rc = json_dumpf(root, f, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc != 0 || fputc('\n', f) == EOF || ferror(f))
        return em_set_error(EM_ERR_IO, "trace_write_json: write failed");
    return EM_OK;
}

/* ---- Graphviz dot ----------------------------------------------------------------------------------- */

/* An attribute value as a label shows it. */
static void attr_text(FILE *f, const em_attr *a) {
    switch (a->type) {
    case EM_ATTR_NONE: fputs("-", f); break;
    case EM_ATTR_INT: fprintf(f, "%lld", (long long)a->v.i); break;
    case EM_ATTR_FLOAT: fprintf(f, "%g", a->v.f); break;
    case EM_ATTR_BOOL: fputs(a->v.b ? "true" : "false", f); break;
    case EM_ATTR_STRING: fprintf(f, "%s", a->v.s ? a->v.s : ""); break;
    case EM_ATTR_INTS:
    case EM_ATTR_INT_LIST: {
        const int64_t *v = a->type == EM_ATTR_INTS ? a->ints : a->v.list;
        fputc('[', f);
        for (int i = 0; i < a->n; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)v[i]);
        fputc(']', f);
        break;
    }
    }
}

/* The top-level node that holds node i (itself, or the composite around it). */
static int64_t top_of(const em_trace *tr, int64_t i) {
    while (i >= 0 && tr->nodes[i].pub.parent >= 0) i = tr->nodes[i].pub.parent;
    return i;
}

em_status em_graph_dump_trace(const em_trace *tr, FILE *f) {
    if (!tr || !f) return em_set_error(EM_ERR_INVALID, "graph_dump_trace: NULL trace or file");
    char s[160];
    fprintf(f, "digraph ember_trace {\n  node [shape=box, fontname=\"monospace\"];\n");
    for (size_t i = 0; i < tr->n; i++) {
        const em_trace_node *n = &tr->nodes[i].pub;
        if (n->parent >= 0) continue;
        fprintf(f, "  n%zu [label=\"%s%s", i, n->op, n->inplace ? " (in place)" : "");
        for (int k = 0; k < n->n_attrs; k++) {
            if (n->attrs[k].type == EM_ATTR_NONE) continue;
            fprintf(f, "\\n%s=", n->attr_names[k]);
            attr_text(f, &n->attrs[k]);
        }
        if (n->n_children) {
            fputs("\\n=", f);
            for (int k = 0; k < n->n_children; k++)
                fprintf(f, " %s", tr->nodes[n->children[k]].pub.op);
        }
        for (int j = 0; j < n->n_out; j++)
            fprintf(f, "\\nout %s %s", em__shape_str(n->out[j].ndim, n->out[j].shape, s, sizeof s),
                    em_dtype_name(n->out[j].dtype));
        if (n->bytes) fprintf(f, "\\n%zu bytes", n->bytes);
        if (n->grad_fn) fprintf(f, "\\ngrad_fn %s", n->grad_fn);
        fprintf(f, "\"%s];\n", n->kind == EM_OP_EVENT_VIEW ? ", style=dashed" : "");
        for (int k = 0; k < n->n_in; k++) {
            const em_trace_value *v = &n->in[k];
            switch (v->source) {
            case EM_TRACE_FROM_NODE:
                fprintf(f, "  n%lld -> n%zu;\n", (long long)top_of(tr, v->node), i);
                break;
            case EM_TRACE_FROM_INPUT:
            case EM_TRACE_FROM_PARAMETER:
            case EM_TRACE_FROM_BUFFER:
                /* One ellipse per name, declared where it is used (dot merges repeats). */
                fprintf(f, "  \"%s\" [shape=ellipse, label=\"%s\\n%s %s%s%s\"];\n  \"%s\" -> n%zu;\n",
                        v->name, v->name, em__shape_str(v->ndim, v->shape, s, sizeof s),
                        em_dtype_name(v->dtype), v->grad_op ? "\\ngrad " : "",
                        v->grad_op ? v->grad_op : "", v->name, i);
                break;
            case EM_TRACE_FROM_NONE:
            case EM_TRACE_FROM_LOCAL: break;
            }
        }
    }
    fprintf(f, "}\n");
    return ferror(f) ? em_set_error(EM_ERR_IO, "graph_dump_trace: write failed") : EM_OK;
}
