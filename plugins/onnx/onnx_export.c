/*
 * onnx_export.c — writing an Ember module as an ONNX model (em_onnx_export).
 *
 * The module tree is walked from the root: each module's class is looked up in the
 * "onnx_layer" kind and its exporter appends the nodes computing it (containers export their
 * children through the builder's child slot). Every module runs forward once on the example
 * value that reaches it, in eval mode without grad, so each exporter knows the shapes it
 * works on. The whole model is built in memory first: a module without an exporter, or with an
 * option ONNX cannot express, fails before a byte is written. The file goes to a temporary
 * name, is fsync'd and renamed. Names are fixed by the module tree (initializers carry the
 * state-dict keys, nodes the layer paths) and protobuf-c writes fields in their number order,
 * so the bytes depend only on the model, the example shapes and the options.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ember/autograd.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/plugin.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "ember/version.h"
#include "onnx.pb-c.h"
#include "onnx_internal.h"

/* ---- dtypes ------------------------------------------------------------------------------- */

int ox_onnx_dtype(em_dtype dt) {
    switch (dt) {
    case EM_F32: return ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    case EM_F64: return ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
    case EM_F16: return ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16;
    case EM_BF16: return ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
    case EM_I32: return ONNX__TENSOR_PROTO__DATA_TYPE__INT32;
    case EM_I64: return ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    case EM_U8: return ONNX__TENSOR_PROTO__DATA_TYPE__UINT8;
    case EM_BOOL: return ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
    default: return 0;
    }
}

bool ox_ember_dtype(int t, em_dtype *out) {
    static const em_dtype all[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8, EM_BOOL};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (ox_onnx_dtype(all[i]) == t) {
            *out = all[i];
            return true;
        }
    return false;
}

/* ---- the builder ---------------------------------------------------------------------------- */

typedef struct ox_builder {
    em_onnx_builder pub;      /* first: what exporters see */
    Onnx__NodeProto **nodes;
    size_t n_nodes, cap_nodes;
    Onnx__TensorProto **inits;
    size_t n_inits, cap_inits;
    char path[1024];          /* the dotted path of the module being exported ("" at the root) */
    em_module *cur;           /* the module being exported */
    bool prefixed;            /* the error message already names a layer */
    const Onnx__ModelProto *origin; /* set by an imported graph: its metadata */
    bool origin_is_root;
    bool variable_length;     /* the option: the model was trained on padded batches */
} ox_builder;

static char *dup_str(const char *s) {
    char *d = strdup(s ? s : "");
    if (!d) em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
    return d;
}

static bool grow(void *arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*(void **)arr, nc * elem);
    if (!p) {
        em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
        return false;
    }
    *(void **)arr = p;
    *cap = nc;
    return true;
}

static bool name_taken(const ox_builder *b, const char *name) {
    for (size_t i = 0; i < b->n_nodes; i++)
        if (strcmp(b->nodes[i]->name, name) == 0) return true;
    for (size_t i = 0; i < b->n_inits; i++)
        if (strcmp(b->inits[i]->name, name) == 0) return true;
    return false;
}

/* "/<path with / for .>/<what>", made unique with _1, _2 ... into out (EM_ONNX_NAME_MAX). */
static em_status unique_name(const ox_builder *b, const char *what, char *out) {
    char base[EM_ONNX_NAME_MAX];
    int n = snprintf(base, sizeof base, "/%s%s%s", b->path, *b->path ? "/" : "", what);
    if (n < 0 || (size_t)n >= sizeof base)
        return em_set_error(EM_ERR_RANGE, "onnx export: the name '%s' is too long", base);
    for (char *c = base; *c; c++)
        if (*c == '.') *c = '/';
    snprintf(out, EM_ONNX_NAME_MAX, "%s", base);
    for (int k = 1; name_taken(b, out); k++)
        if (snprintf(out, EM_ONNX_NAME_MAX, "%s_%d", base, k) >= EM_ONNX_NAME_MAX)
            return em_set_error(EM_ERR_RANGE, "onnx export: the name '%s' is too long", base);
    return EM_OK;
}

static Onnx__AttributeProto *make_attr(const em_onnx_attr *a) {
    Onnx__AttributeProto *p = malloc(sizeof *p);
    if (!p) return NULL;
    onnx__attribute_proto__init(p);
    if (!(p->name = dup_str(a->name))) {
        free(p);
        return NULL;
    }
    p->has_type = true;
    switch (a->type) {
    case EM_ONNX_ATTR_INT:
        p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
        p->has_i = true;
        p->i = a->i;
        break;
    case EM_ONNX_ATTR_FLOAT:
        p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
        p->has_f = true;
        p->f = (float)a->f;
        break;
    case EM_ONNX_ATTR_STRING:
        p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
        p->has_s = true;
        p->s.len = strlen(a->s ? a->s : "");
        if (!(p->s.data = (uint8_t *)dup_str(a->s))) goto fail;
        break;
    case EM_ONNX_ATTR_INTS:
        p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
        if (a->n > 0) {
            if (!(p->ints = malloc((size_t)a->n * sizeof *p->ints))) goto fail;
            memcpy(p->ints, a->ints, (size_t)a->n * sizeof *p->ints);
            p->n_ints = (size_t)a->n;
        }
        break;
    case EM_ONNX_ATTR_FLOATS:
        p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS;
        if (a->n > 0) {
            if (!(p->floats = malloc((size_t)a->n * sizeof *p->floats))) goto fail;
            memcpy(p->floats, a->floats, (size_t)a->n * sizeof *p->floats);
            p->n_floats = (size_t)a->n;
        }
        break;
    default:
        protobuf_c_message_free_unpacked(&p->base, NULL);
        em_set_error(EM_ERR_INVALID, "onnx export: attribute '%s' has an unknown type %d",
                     a->name, (int)a->type);
        return NULL;
    }
    return p;
fail:
    protobuf_c_message_free_unpacked(&p->base, NULL);
    em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
    return NULL;
}

static em_status b_node(em_onnx_builder *pub, const char *op_type, int n_in,
                        const char *const *in, int n_attr, const em_onnx_attr *attrs, char *out) {
    return ox_builder_node_n(pub, op_type, n_in, in, n_attr, attrs, 1, &out);
}

em_status ox_builder_node_n(em_onnx_builder *pub, const char *op_type, int n_in,
                            const char *const *in, int n_attr, const em_onnx_attr *attrs,
                            int n_out, char *const *out) {
    ox_builder *b = (ox_builder *)pub;
    char name[EM_ONNX_NAME_MAX];
    em_status st = unique_name(b, op_type, name);
    if (st != EM_OK) return st;
    if (!grow(&b->nodes, &b->cap_nodes, b->n_nodes, sizeof *b->nodes)) return EM_ERR_NOMEM;
    Onnx__NodeProto *n = malloc(sizeof *n);
    if (!n) return em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
    onnx__node_proto__init(n);
    b->nodes[b->n_nodes++] = n; /* owned from here: freed with the builder */
    if (!(n->name = dup_str(name)) || !(n->op_type = dup_str(op_type)))
        return EM_ERR_NOMEM;
    if (n_in > 0) {
        if (!(n->input = calloc((size_t)n_in, sizeof *n->input))) return EM_ERR_NOMEM;
        for (int i = 0; i < n_in; i++, n->n_input++)
            if (!(n->input[i] = dup_str(in[i]))) return EM_ERR_NOMEM;
    }
    if (!(n->output = calloc((size_t)n_out, sizeof *n->output))) return EM_ERR_NOMEM;
    for (int k = 0; k < n_out; k++, n->n_output++) {
        char oname[EM_ONNX_NAME_MAX + 32];
        snprintf(oname, sizeof oname, "%s_output_%d", name, k);
        if (strlen(oname) >= EM_ONNX_NAME_MAX)
            return em_set_error(EM_ERR_RANGE, "onnx export: the name '%s' is too long", oname);
        if (!(n->output[k] = dup_str(oname))) return EM_ERR_NOMEM;
        memcpy(out[k], oname, strlen(oname) + 1); /* shorter than EM_ONNX_NAME_MAX */
    }
    if (n_attr > 0) {
        if (!(n->attribute = calloc((size_t)n_attr, sizeof *n->attribute))) return EM_ERR_NOMEM;
        for (int i = 0; i < n_attr; i++, n->n_attribute++)
            if (!(n->attribute[i] = make_attr(&attrs[i]))) return em_last_status();
    }
    return EM_OK;
}

/* An initializer named `name` holding t (converted to a contiguous CPU tensor). */
static em_status add_tensor(ox_builder *b, const char *name, const em_tensor *t, char *out) {
    int dt = ox_onnx_dtype(em_tensor_dtype(t));
    if (!dt)
        return em_set_error(EM_ERR_DTYPE, "onnx export: '%s' is %s, which ONNX has no type for",
                            name, em_dtype_name(em_tensor_dtype(t)));
    if (!grow(&b->inits, &b->cap_inits, b->n_inits, sizeof *b->inits)) return EM_ERR_NOMEM;
    Onnx__TensorProto *p = malloc(sizeof *p);
    if (!p) return em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
    onnx__tensor_proto__init(p);
    b->inits[b->n_inits++] = p;
    if (!(p->name = dup_str(name))) return EM_ERR_NOMEM;
    p->has_data_type = true;
    p->data_type = dt;
    int nd = em_tensor_ndim(t);
    if (nd > 0) {
        if (!(p->dims = malloc((size_t)nd * sizeof *p->dims))) return EM_ERR_NOMEM;
        memcpy(p->dims, em_tensor_shape(t), (size_t)nd * sizeof *p->dims);
        p->n_dims = (size_t)nd;
    }
    size_t nbytes = (size_t)em_tensor_numel(t) * em_dtype_size(em_tensor_dtype(t));
    p->has_raw_data = true;
    p->raw_data.len = nbytes;
    if (nbytes) {
        if (!(p->raw_data.data = malloc(nbytes)))
            return em_set_error(EM_ERR_NOMEM, "onnx export: out of memory for '%s'", name);
        /* little-endian raw_data, as ONNX specifies (Ember runs on little-endian hosts) */
        em_status st = em_tensor_to_host(t, p->raw_data.data, nbytes);
        if (st != EM_OK) return st;
    }
    snprintf(out, EM_ONNX_NAME_MAX, "%s", name);
    return EM_OK;
}

static em_status b_initializer(em_onnx_builder *pub, const char *local, const em_tensor *t,
                               char *out) {
    ox_builder *b = (ox_builder *)pub;
    char name[EM_ONNX_NAME_MAX];
    int n = snprintf(name, sizeof name, "%s%s%s", b->path, *b->path ? "." : "", local);
    if (n < 0 || (size_t)n >= sizeof name)
        return em_set_error(EM_ERR_RANGE, "onnx export: the key '%s' is too long", name);
    for (size_t i = 0; i < b->n_inits; i++)
        if (strcmp(b->inits[i]->name, name) == 0) { /* shared (tied) weights: one initializer */
            snprintf(out, EM_ONNX_NAME_MAX, "%s", name);
            return EM_OK;
        }
    return add_tensor(b, name, t, out);
}

static em_status b_constant(em_onnx_builder *pub, const em_tensor *t, char *out) {
    ox_builder *b = (ox_builder *)pub;
    char name[EM_ONNX_NAME_MAX];
    em_status st = unique_name(b, "Constant", name);
    return st == EM_OK ? add_tensor(b, name, t, out) : st;
}

static em_status export_module(ox_builder *b, em_module *m, const char *in, const em_tensor *x,
                               char *out);

em_status ox_builder_raw_initializer(em_onnx_builder *pub, const char *name, const em_tensor *t) {
    ox_builder *b = (ox_builder *)pub;
    char out[EM_ONNX_NAME_MAX];
    if (strlen(name) >= EM_ONNX_NAME_MAX)
        return em_set_error(EM_ERR_RANGE, "onnx export: the name '%s' is too long", name);
    for (size_t i = 0; i < b->n_inits; i++)
        if (strcmp(b->inits[i]->name, name) == 0) return EM_OK;
    return add_tensor(b, name, t, out);
}

void ox_builder_set_origin(em_onnx_builder *pub, const Onnx__ModelProto *model) {
    ox_builder *b = (ox_builder *)pub;
    b->origin = model;
    b->origin_is_root = !*b->path;
}

em_status ox_builder_raw_node(em_onnx_builder *pub, const Onnx__NodeProto *n, const char *from_in,
                              const char *to_in) {
    ox_builder *b = (ox_builder *)pub;
    size_t len = protobuf_c_message_get_packed_size(&n->base);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
    protobuf_c_message_pack(&n->base, buf);
    Onnx__NodeProto *c = onnx__node_proto__unpack(NULL, len, buf);
    free(buf);
    if (!c) return em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
    if (!grow(&b->nodes, &b->cap_nodes, b->n_nodes, sizeof *b->nodes)) {
        onnx__node_proto__free_unpacked(c, NULL);
        return EM_ERR_NOMEM;
    }
    b->nodes[b->n_nodes++] = c;
    if (!c->name && !(c->name = dup_str(""))) return EM_ERR_NOMEM;
    for (size_t i = 0; i < c->n_input; i++)
        if (strcmp(c->input[i], from_in) == 0 && strcmp(from_in, to_in)) {
            char *d = dup_str(to_in);
            if (!d) return EM_ERR_NOMEM;
            free(c->input[i]);
            c->input[i] = d;
        }
    return EM_OK;
}

static em_status b_child(em_onnx_builder *pub, const char *name, const char *in,
                         const em_tensor *x, char *out, em_tensor **out_example) {
    ox_builder *b = (ox_builder *)pub;
    em_module *parent = b->cur, *c = em_module_child(parent, name);
    if (!c)
        return em_set_error(EM_ERR_NOTFOUND, "onnx export: '%s' has no child '%s'", b->path, name);
    size_t len = strlen(b->path);
    int n = snprintf(b->path + len, sizeof b->path - len, "%s%s", len ? "." : "", name);
    if (n < 0 || (size_t)n >= sizeof b->path - len)
        return em_set_error(EM_ERR_RANGE, "onnx export: the module path under '%s' is too long",
                            b->path);
    em_status st = export_module(b, c, in, x, out);
    if (st == EM_OK && out_example) {
        *out_example = em_module_forward(c, x);
        if (!*out_example) {
            st = em_last_status();
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", em_last_error());
            em_set_error(st, "onnx export: layer '%s' (%s) fails on the example input: %s",
                         b->path, em_module_class_of(c)->name, msg);
            b->prefixed = true;
        }
    }
    b->path[len] = '\0';
    b->cur = parent;
    return st;
}

/* The exportable module classes, for the message about one that is not. */
static void exportable_list(char *buf, size_t cap) {
    size_t n = em_class_count(EM_ONNX_LAYER_KIND), used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < cap; i++) {
        const em_onnx_layer_class *c = em_class_get(EM_ONNX_LAYER_KIND, i);
        int k = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", c->name);
        if (k < 0) break;
        used += (size_t)k;
    }
}

static em_status export_module(ox_builder *b, em_module *m, const char *in, const em_tensor *x,
                               char *out) {
    const char *cls = em_module_class_of(m)->name;
    const char *where = *b->path ? b->path : "(the model)";
    const em_onnx_layer_class *e = NULL;
    for (size_t i = 0, n = em_class_count(EM_ONNX_LAYER_KIND); i < n && !e; i++) {
        const em_onnx_layer_class *c = em_class_get(EM_ONNX_LAYER_KIND, i);
        if (strcmp(c->name, cls) == 0) e = c;
    }
    if (!e) {
        char list[2048];
        exportable_list(list, sizeof list);
        b->prefixed = true;
        return em_set_error(EM_ERR_NOTFOUND, "onnx export: layer '%s' (%s) has no ONNX exporter "
                            "(nothing was written); the classes that can be exported: %s; a "
                            "plugin's layer supplies its own (an em_onnx_layer_class, "
                            "ember/onnx.h)", where, cls, list);
    }
    /* The graph has one input and no padding mask: a layer that reads the batches' mask
     * (em_module_forward_masked) would compute every padded step as a real one in ONNX
     * Runtime, so a model trained on variable-length batches is refused there rather than
     * exported to numbers Ember's would not give. */
    if (b->variable_length && em_module_class_of(m)->takes_mask) {
        b->prefixed = true;
        return em_set_error(EM_ERR_INVALID, "onnx export: layer '%s' (%s) reads the padding "
                            "mask of variable-length batches (variable_length is set: the "
                            "model was trained on them), and the exported graph has no mask "
                            "input: ONNX Runtime would treat every padded step as real and "
                            "give other numbers than Ember (nothing was written)", where, cls);
    }
    b->cur = m;
    em_status st = e->export_layer(&b->pub, m, in, x, out);
    b->cur = m;
    if (st != EM_OK && !b->prefixed) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        b->prefixed = true;
        return em_set_error(st, "onnx export: layer '%s' (%s): %s (nothing was written)", where,
                            cls, msg);
    }
    return st;
}

/* ---- options ---------------------------------------------------------------------------------- */

static const char *const transform_modes[] = {"nodes", "metadata", NULL};
static const em_option_spec export_opts[] = {
    {.name = "opset", .types = EM_OPT_INT, .def = {.i = 17}, .has_range = true, .min = 13,
     .max = 17, .help = "the ONNX opset written (13..17)"},
    {.name = "dynamic_batch", .types = EM_OPT_BOOL, .def = {.b = true},
     .help = "dim 0 of the input and output is a symbol, not the example's size"},
    {.name = "batch_dim", .types = EM_OPT_STRING, .def = {.s = "batch"},
     .help = "the batch dim's symbol"},
    {.name = "input_name", .types = EM_OPT_STRING, .def = {.s = "input"},
     .help = "the graph input's name"},
    {.name = "output_name", .types = EM_OPT_STRING, .def = {.s = "output"},
     .help = "the graph output's name"},
    {.name = "input_dtype", .types = EM_OPT_STRING, .def = {.s = ""},
     .help = "the dtype a deployer feeds (uint8 for raw pixels); default: the example's"},
    {.name = "scale", .types = EM_OPT_FLOAT, .def = {.f = NAN},
     .help = "to_float's factor (0: 1/255 for uint8, by division)"},
    {.name = "mean", .types = EM_OPT_FLOATS, .def = {.n = 0}, .help = "normalize: per channel"},
    {.name = "std", .types = EM_OPT_FLOATS, .def = {.n = 0}, .help = "normalize: per channel"},
    {.name = "transforms", .types = EM_OPT_STRING, .def = {.s = "nodes"},
     .choices = transform_modes,
     .help = "input transforms as the graph's first nodes, or in the model's metadata"},
    {.name = "variable_length", .types = EM_OPT_BOOL, .def = {.b = false},
     .help = "the model is fed variable-length (padded) batches with a padding mask: the "
             "layers that read the mask (LSTM, GRU, MultiheadAttention) are refused, the "
             "graph having no mask input"},
};

/* ---- the model -------------------------------------------------------------------------------- */

static Onnx__ValueInfoProto *value_info(const char *name, int elem, int nd, const int64_t *shape,
                                        const char *batch_sym) {
    Onnx__ValueInfoProto *v = calloc(1, sizeof *v);
    Onnx__TypeProto *tp = calloc(1, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = calloc(1, sizeof *tt);
    Onnx__TensorShapeProto *sp = calloc(1, sizeof *sp);
    if (!v || !tp || !tt || !sp) goto fail;
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(tp);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sp);
    v->type = tp;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    tt->has_elem_type = true;
    tt->elem_type = elem;
    tt->shape = sp;
    tp = NULL;
    tt = NULL;
    sp = NULL;
    if (!(v->name = dup_str(name))) goto fail;
    Onnx__TensorShapeProto *s = v->type->tensor_type->shape;
    if (nd > 0 && !(s->dim = calloc((size_t)nd, sizeof *s->dim))) goto fail;
    for (int i = 0; i < nd; i++) {
        Onnx__TensorShapeProto__Dimension *d = malloc(sizeof *d);
        if (!d) goto fail;
        onnx__tensor_shape_proto__dimension__init(d);
        s->dim[s->n_dim++] = d;
        if (i == 0 && batch_sym && !*batch_sym) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE__NOT_SET; /* unknown */
        } else if (i == 0 && batch_sym) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            if (!(d->dim_param = dup_str(batch_sym))) goto fail;
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = shape[i];
        }
    }
    return v;
fail:
    free(tp);
    free(tt);
    free(sp);
    if (v) protobuf_c_message_free_unpacked(&v->base, NULL);
    em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
    return NULL;
}

static Onnx__StringStringEntryProto *meta(const char *k, const char *v) {
    Onnx__StringStringEntryProto *e = malloc(sizeof *e);
    if (!e) return NULL;
    onnx__string_string_entry_proto__init(e);
    e->key = dup_str(k);
    e->value = dup_str(v);
    if (!e->key || !e->value) {
        protobuf_c_message_free_unpacked(&e->base, NULL);
        return NULL;
    }
    return e;
}

/* The input transforms as the graph's first nodes, from `in`; the value the model reads to
 * out, and a description to desc (empty when there is nothing to do). */
static em_status transform_nodes(ox_builder *b, const char *in, em_dtype raw, em_dtype model_dt,
                                 double scale, int n_mean, const double *mean, const double *sd,
                                 int item_nd, bool as_nodes, char *out, char *desc, size_t cap) {
    char cur[EM_ONNX_NAME_MAX];
    snprintf(cur, sizeof cur, "%s", in);
    size_t used = 0;
    desc[0] = '\0';
    snprintf(b->path, sizeof b->path, "input_transforms");
    em_status st = EM_OK;
    if (raw != model_dt) {
        if (as_nodes)
            st = b_node(&b->pub, "Cast", 1, (const char *[]){cur}, 1,
                        (em_onnx_attr[]){OX_INT("to", ox_onnx_dtype(model_dt))}, cur);
        used += (size_t)snprintf(desc + used, cap - used, "cast %s to %s; ", em_dtype_name(raw),
                                 em_dtype_name(model_dt));
    }
    if (st == EM_OK && !isnan(scale)) {
        bool div = scale == 0 && raw == EM_U8;
        double v = scale == 0 ? (raw == EM_U8 ? 255.0 : 1.0) : scale;
        if (v != 1.0 || div) {
            if (as_nodes) {
                em_tensor *c = em_scalar(v, model_dt);
                char cn[EM_ONNX_NAME_MAX];
                st = c ? b_constant(&b->pub, c, cn) : em_last_status();
                if (st == EM_OK)
                    st = b_node(&b->pub, div ? "Div" : "Mul", 2, (const char *[]){cur, cn}, 0,
                                NULL, cur);
            }
            used += (size_t)snprintf(desc + used, cap - used, "x %s %.9g; ", div ? "/" : "*", v);
        }
    }
    if (st == EM_OK && n_mean > 0) {
        int64_t shape[EM_MAX_DIMS];
        shape[0] = n_mean;
        for (int i = 1; i < item_nd; i++) shape[i] = 1;
        float mf[EM_OPT_MAX_LIST], sf[EM_OPT_MAX_LIST];
        for (int i = 0; i < n_mean; i++) {
            mf[i] = (float)mean[i];
            sf[i] = (float)sd[i];
        }
        if (as_nodes) {
            em_tensor *mt = em_from_data(mf, item_nd, shape, EM_F32, em_cpu());
            em_tensor *stt = em_from_data(sf, item_nd, shape, EM_F32, em_cpu());
            char mn[EM_ONNX_NAME_MAX], sn[EM_ONNX_NAME_MAX];
            st = mt && stt ? b_constant(&b->pub, mt, mn) : em_last_status();
            if (st == EM_OK) st = b_constant(&b->pub, stt, sn);
            if (st == EM_OK) st = b_node(&b->pub, "Sub", 2, (const char *[]){cur, mn}, 0, NULL, cur);
            if (st == EM_OK) st = b_node(&b->pub, "Div", 2, (const char *[]){cur, sn}, 0, NULL, cur);
        }
        used += (size_t)snprintf(desc + used, cap - used, "(x - mean[c]) / std[c] over dim 1, "
                                 "mean [");
        for (int i = 0; i < n_mean && used < cap; i++)
            used += (size_t)snprintf(desc + used, cap - used, "%s%.9g", i ? ", " : "", mf[i]);
        used += (size_t)snprintf(desc + used, cap - used, "], std [");
        for (int i = 0; i < n_mean && used < cap; i++)
            used += (size_t)snprintf(desc + used, cap - used, "%s%.9g", i ? ", " : "", sf[i]);
        used += (size_t)snprintf(desc + used, cap - used, "]; ");
    }
    if (used >= 2 && used < cap) desc[used - 2] = '\0'; /* the last "; " */
    b->path[0] = '\0';
    snprintf(out, EM_ONNX_NAME_MAX, "%s", cur);
    return st;
}

static void builder_free(ox_builder *b) {
    for (size_t i = 0; i < b->n_nodes; i++) protobuf_c_message_free_unpacked(&b->nodes[i]->base, NULL);
    for (size_t i = 0; i < b->n_inits; i++) protobuf_c_message_free_unpacked(&b->inits[i]->base, NULL);
    free(b->nodes);
    free(b->inits);
}

static em_status write_file(const char *path, const uint8_t *buf, size_t n) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return em_set_error(EM_ERR_IO, "onnx export: %s: the path is too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return em_set_error(EM_ERR_IO, "onnx export: cannot create %s: %s", tmp, strerror(errno));
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return em_set_error(EM_ERR_IO, "onnx export: writing %s: %s", path, strerror(e));
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return em_set_error(EM_ERR_IO, "onnx export: writing %s: %s", path, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return em_set_error(EM_ERR_IO, "onnx export: cannot rename %s to %s: %s", tmp, path,
                            strerror(e));
    }
    return EM_OK;
}

/* The name of the last node's output becomes the graph output's: rename every use. */
static em_status rename_value(ox_builder *b, const char *from, const char *to) {
    for (size_t i = 0; i < b->n_nodes; i++) {
        Onnx__NodeProto *n = b->nodes[i];
        for (size_t j = 0; j < n->n_output; j++)
            if (strcmp(n->output[j], from) == 0) {
                char *d = dup_str(to);
                if (!d) return EM_ERR_NOMEM;
                free(n->output[j]);
                n->output[j] = d;
            }
        for (size_t j = 0; j < n->n_input; j++)
            if (strcmp(n->input[j], from) == 0) {
                char *d = dup_str(to);
                if (!d) return EM_ERR_NOMEM;
                free(n->input[j]);
                n->input[j] = d;
            }
    }
    return EM_OK;
}

static em_status build_and_write(ox_builder *b, em_module *m, const em_tensor *x,
                                 const char *path, const em_options *o) {
    int opset = (int)em_options_int(o, "opset");
    b->pub.opset = opset;
    const char *batch = em_options_bool(o, "dynamic_batch") ? em_options_string(o, "batch_dim")
                                                            : NULL;
    const char *in_name = em_options_string(o, "input_name");
    const char *out_name = em_options_string(o, "output_name");
    if (!*in_name || !*out_name || strcmp(in_name, out_name) == 0)
        return em_set_error(EM_ERR_INVALID, "onnx export: input_name '%s' and output_name '%s' "
                            "must be different and not empty", in_name, out_name);
    if (batch && em_tensor_ndim(x) == 0)
        return em_set_error(EM_ERR_SHAPE, "onnx export: the example input is a scalar; "
                            "dynamic_batch needs a batch dim (or set dynamic_batch false)");
    em_dtype model_dt = em_tensor_dtype(x), raw = model_dt;
    const char *rawname = em_options_string(o, "input_dtype");
    if (*rawname && em_dtype_parse(rawname, &raw) != EM_OK) return em_last_status();
    double scale = em_options_float(o, "scale");
    double mean[EM_OPT_MAX_LIST], sd[EM_OPT_MAX_LIST];
    int n_mean = em_options_floats(o, "mean", mean, EM_OPT_MAX_LIST);
    int n_std = em_options_floats(o, "std", sd, EM_OPT_MAX_LIST);
    if (n_mean != n_std)
        return em_set_error(EM_ERR_INVALID, "onnx export: mean has %d values and std %d; "
                            "normalize takes one of each per channel", n_mean, n_std);
    if (n_mean > 0 && (em_tensor_ndim(x) < 2 || em_tensor_size(x, 1) != n_mean))
        return em_set_error(EM_ERR_SHAPE, "onnx export: normalize has %d channels but the "
                            "example input's dim 1 is %lld", n_mean,
                            em_tensor_ndim(x) < 2 ? 0LL : (long long)em_tensor_size(x, 1));
    for (int i = 0; i < n_std; i++)
        if (sd[i] == 0)
            return em_set_error(EM_ERR_INVALID, "onnx export: std[%d] is 0", i);
    if ((raw != model_dt || !isnan(scale) || n_mean) && !em_dtype_is_floating(model_dt))
        return em_set_error(EM_ERR_DTYPE, "onnx export: input transforms give a floating model "
                            "input, but the example input is %s", em_dtype_name(model_dt));
    bool as_nodes = strcmp(em_options_string(o, "transforms"), "nodes") == 0;
    char cur[EM_ONNX_NAME_MAX], desc[1024];
    em_status st = transform_nodes(b, in_name, raw, model_dt, scale, n_mean, mean, sd,
                                   em_tensor_ndim(x) - 1, as_nodes, cur, desc, sizeof desc);
    if (st != EM_OK) return st;
    char out[EM_ONNX_NAME_MAX];
    if ((st = export_module(b, m, cur, x, out)) != EM_OK) return st;
    em_tensor *y = em_module_forward(m, x);
    if (!y) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", em_last_error());
        return em_set_error(em_last_status(), "onnx export: the model fails on the example "
                            "input: %s", msg);
    }
    if (!ox_onnx_dtype(em_tensor_dtype(y)))
        return em_set_error(EM_ERR_DTYPE, "onnx export: the model's output is %s",
                            em_dtype_name(em_tensor_dtype(y)));
    /* the output value takes the graph output's name; an input or initializer passed through
     * gets an Identity node to carry it */
    bool from_node = false;
    for (size_t i = 0; i < b->n_nodes && !from_node; i++)
        from_node = strcmp(b->nodes[i]->output[0], out) == 0;
    if (!from_node) {
        snprintf(b->path, sizeof b->path, "output");
        st = b_node(&b->pub, "Identity", 1, (const char *[]){out}, 0, NULL, out);
        b->path[0] = '\0';
        if (st != EM_OK) return st;
    }
    if ((st = rename_value(b, out, out_name)) != EM_OK) return st;

    Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
    Onnx__GraphProto graph = ONNX__GRAPH_PROTO__INIT;
    Onnx__OperatorSetIdProto ops = ONNX__OPERATOR_SET_ID_PROTO__INIT, *opsp = &ops;
    model.has_ir_version = true;
    model.ir_version = 8;
    model.n_opset_import = 1;
    model.opset_import = &opsp;
    ops.domain = (char *)"";
    ops.has_version = true;
    ops.version = opset;
    model.producer_name = (char *)"ember";
    model.producer_version = (char *)EM_VERSION_STRING;
    model.graph = &graph;
    graph.name = (char *)"ember";
    graph.n_node = b->n_nodes;
    graph.node = b->nodes;
    graph.n_initializer = b->n_inits;
    graph.initializer = b->inits;
    Onnx__ValueInfoProto *vin = value_info(in_name, ox_onnx_dtype(as_nodes ? raw : model_dt),
                                           em_tensor_ndim(x), em_tensor_shape(x), batch);
    /* the output's dim 0 is the batch when it has the example's batch size; else unknown */
    const char *out_batch = batch && em_tensor_ndim(y) > 0 &&
                                    em_tensor_size(y, 0) == em_tensor_size(x, 0) ? batch
                            : batch ? "" : NULL;
    Onnx__ValueInfoProto *vout = value_info(out_name, ox_onnx_dtype(em_tensor_dtype(y)),
                                            em_tensor_ndim(y), em_tensor_shape(y), out_batch);
    Onnx__StringStringEntryProto *md[16] = {NULL};
    size_t n_md = 0;
    if (*desc) {
        char v[1100];
        snprintf(v, sizeof v, "%s%s", desc, as_nodes ? " (done by the graph's first nodes)" : "");
        if (!(md[n_md++] = meta("ember.input_transforms", v))) st = EM_ERR_NOMEM;
    } else if (b->origin && b->origin_is_root) { /* an imported model exported again */
        for (size_t i = 0; i < b->origin->n_metadata_props && n_md < 16 && st == EM_OK; i++) {
            const Onnx__StringStringEntryProto *e = b->origin->metadata_props[i];
            if (!(md[n_md++] = meta(e->key, e->value))) st = EM_ERR_NOMEM;
        }
    }
    uint8_t *buf = NULL;
    if (!vin || !vout) st = em_last_status();
    if (st == EM_OK) {
        graph.n_input = 1;
        graph.input = &vin;
        graph.n_output = 1;
        graph.output = &vout;
        model.n_metadata_props = n_md;
        model.metadata_props = md;
        size_t n = protobuf_c_message_get_packed_size(&model.base);
        if (!(buf = malloc(n ? n : 1))) st = em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
        else if (protobuf_c_message_pack(&model.base, buf) != n)
            st = em_set_error(EM_ERR_INTERNAL, "onnx export: protobuf-c packed a wrong size");
        else st = write_file(path, buf, n);
    }
    free(buf);
    if (vin) protobuf_c_message_free_unpacked(&vin->base, NULL);
    if (vout) protobuf_c_message_free_unpacked(&vout->base, NULL);
    for (size_t i = 0; i < n_md; i++)
        if (md[i]) protobuf_c_message_free_unpacked(&md[i]->base, NULL);
    return st;
}

em_status ox_export_model(em_module *m, int n_inputs, em_tensor *const *example_inputs,
                          const char *path, const em_options *options) {
    if (n_inputs != 1)
        return em_set_error(EM_ERR_INVALID, "onnx export: models of one input are exported "
                            "(%d example inputs given)", n_inputs);
    em_options *o = options ? em_options_copy(options) : em_options_new();
    if (!o) return em_set_error(EM_ERR_NOMEM, "onnx export: out of memory");
    em_status st = em_options_resolve(o, "onnx export", export_opts,
                                      (int)(sizeof export_opts / sizeof *export_opts));
    if (st != EM_OK) {
        em_options_free(o);
        return st;
    }
    bool was_training = em_module_training(m);
    em_module_train(m, false);
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_scope_begin();
    ox_builder b;
    memset(&b, 0, sizeof b);
    b.pub.struct_size = sizeof b.pub;
    b.pub.node = b_node;
    b.pub.initializer = b_initializer;
    b.pub.constant = b_constant;
    b.pub.child = b_child;
    b.variable_length = em_options_bool(o, "variable_length");
    st = build_and_write(&b, m, example_inputs[0], path, o);
    builder_free(&b);
    em_scope_end();
    em_grad_mode_pop();
    em_module_train(m, was_training);
    em_options_free(o);
    return st;
}
