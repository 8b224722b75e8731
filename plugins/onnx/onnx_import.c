/*
 * onnx_import.c — reading an ONNX model into an Ember module (em_onnx_import).
 *
 * The file is read whole (at most 2 GiB, protobuf's own limit) and unpacked by protobuf-c
 * with an allocator capped at a multiple of the file size, so a hostile file cannot make it
 * allocate without bound; then everything is checked before a module exists: the opset, each
 * node's op type, input count and attributes (their types too), each initializer's dims
 * against its data (a declared size larger than the bytes present is refused, never
 * allocated), and that every value a node reads is produced before it (a cycle, or a value
 * nothing produces, is an error naming the node).
 *
 * The module is of class "onnx.Graph": its forward runs the graph's nodes in topological order
 * with Ember's ops — a Gemm is em_linear, a Conv em_conv2d, a BatchNormalization em_batch_norm,
 * LayerNormalization em_layer_norm, a Gather of an initializer em_embedding — the same calls
 * Ember's Linear, Conv2d, BatchNorm, LayerNorm and Embedding make, so those compute the same
 * bits as the Ember-built model. Floating initializers whose names are dotted paths of
 * [A-Za-z0-9_] ("0.weight", "fc.bias") become trainable parameters under those state-dict
 * keys (held by "onnx.Params" children), "running_mean"/"running_var" persistent buffers
 * (BatchNormalization in training mode updates them, momentum 1 - ONNX's); other initializers
 * (shape constants, Ember's anonymous "/.../Constant" ones, torch's "onnx::...") are constants.
 * An onnx.Graph exports back as the nodes it was read from, with the current weights.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ember/autograd.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/ops.h"
#include "ember/scope.h"
#include "ember/tensor.h"
#include "onnx.pb-c.h"
#include "onnx_internal.h"

#define MAX_IN 64

typedef enum op_kind {
    OP_GEMM, OP_MATMUL, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_RELU, OP_SIGMOID, OP_TANH,
    OP_SOFTMAX, OP_LOGSOFTMAX, OP_LEAKY, OP_IDENTITY, OP_FLATTEN, OP_RESHAPE, OP_TRANSPOSE,
    OP_CONCAT, OP_CONV, OP_MAXPOOL, OP_AVGPOOL, OP_GAP, OP_BN, OP_LN, OP_GATHER, OP_CAST,
    OP_ERF, OP_SQRT, OP_REDUCEMEAN, OP_CONSTANT, OP_SPLIT, OP_SHAPE, OP_SLICE, OP_RANGE,
    OP_GREATER, OP_WHERE,
} op_kind;

static const struct {
    const char *name;
    op_kind op;
    int min_in, max_in;
} OPS[] = {
    {"Gemm", OP_GEMM, 2, 3}, {"MatMul", OP_MATMUL, 2, 2}, {"Add", OP_ADD, 2, 2},
    {"Sub", OP_SUB, 2, 2}, {"Mul", OP_MUL, 2, 2}, {"Div", OP_DIV, 2, 2},
    {"Relu", OP_RELU, 1, 1}, {"Sigmoid", OP_SIGMOID, 1, 1}, {"Tanh", OP_TANH, 1, 1},
    {"Softmax", OP_SOFTMAX, 1, 1}, {"LogSoftmax", OP_LOGSOFTMAX, 1, 1},
    {"LeakyRelu", OP_LEAKY, 1, 1}, {"Identity", OP_IDENTITY, 1, 1},
    {"Dropout", OP_IDENTITY, 1, 3}, {"Flatten", OP_FLATTEN, 1, 1},
    {"Reshape", OP_RESHAPE, 2, 2}, {"Transpose", OP_TRANSPOSE, 1, 1},
    {"Concat", OP_CONCAT, 1, MAX_IN}, {"Conv", OP_CONV, 2, 3}, {"MaxPool", OP_MAXPOOL, 1, 1},
    {"AveragePool", OP_AVGPOOL, 1, 1}, {"GlobalAveragePool", OP_GAP, 1, 1},
    {"BatchNormalization", OP_BN, 5, 5}, {"LayerNormalization", OP_LN, 2, 3},
    {"Gather", OP_GATHER, 2, 2}, {"Cast", OP_CAST, 1, 1}, {"Erf", OP_ERF, 1, 1},
    {"Sqrt", OP_SQRT, 1, 1}, {"ReduceMean", OP_REDUCEMEAN, 1, 1},
    {"Constant", OP_CONSTANT, 0, 0}, {"Split", OP_SPLIT, 1, 2}, {"Shape", OP_SHAPE, 1, 1},
    {"Slice", OP_SLICE, 3, 5}, {"Range", OP_RANGE, 3, 3}, {"Greater", OP_GREATER, 2, 2},
    {"Where", OP_WHERE, 3, 3},
};

#define MAX_OUT 16        /* Split's outputs */
#define MAX_RANGE (1 << 24) /* the most elements a Range makes (a hostile file asks for more) */

enum { V_COMPUTED, V_INPUT, V_PARAM, V_BUFFER, V_CONST };

typedef struct value {
    const char *name;         /* borrowed from the model */
    int kind;
    em_module *holder;        /* V_PARAM, V_BUFFER: the onnx.Params module holding it */
    const char *local;        /* its name there (borrowed from the model) */
    em_tensor *constant;      /* V_CONST (owned) */
    int producer;             /* step index, -1 */
} value;

typedef struct step {
    op_kind op;
    int min_in;               /* inputs that must be present */
    bool skip;                /* an input transform left out (input_transforms false) */
    const Onnx__NodeProto *node;
    int in[MAX_IN], n_in, out;
    int outs[MAX_OUT], n_out;  /* Split: every output (outs[0] == out) */
    int64_t axis, transA, transB, group, keepdims, to;
    double alpha, beta, eps, momentum;
    int64_t k[2], s[2], d[2], pads[4];
    int auto_pad; /* 0 NOTSET, 1 SAME_UPPER, 2 SAME_LOWER, 3 VALID */
    bool ceil_mode, count_include_pad;
    int64_t perm[EM_MAX_DIMS], axes[EM_MAX_DIMS];
    int n_perm, n_axes;
} step;

typedef struct ox_graph {
    Onnx__ModelProto *model;
    value *v;
    int n_v, cap_v;
    step *st;
    int n_st;
    int input, output;
    int64_t opset;
    bool keep_transforms;     /* the input_transforms option */
    /* the name table: open addressing over v */
    int *slots;
    size_t n_slots;
} ox_graph;

/* ---- the classes ------------------------------------------------------------------------------ */

static em_tensor *params_forward(em_module *m, em_tensor *const *in, int n) {
    (void)m;
    (void)in;
    (void)n;
    em_set_error(EM_ERR_STATE, "holds an imported graph's parameters; it is not a layer "
                 "(the enclosing onnx.Graph computes the graph)");
    return NULL;
}

static const em_module_class params_class = {
    .struct_size = sizeof(em_module_class), .name = "onnx.Params",
    .description = "the parameters of an imported ONNX graph under one path",
    .forward = params_forward, .n_inputs = 1,
};

static void graph_free_state(ox_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_v; i++) em_tensor_release(g->v[i].constant);
    free(g->v);
    free(g->st);
    free(g->slots);
    if (g->model) protobuf_c_message_free_unpacked(&g->model->base, NULL);
    free(g);
}

static void graph_free(em_module *m) {
    ox_graph **s = em_module_state(m);
    graph_free_state(*s);
    *s = NULL;
}

static em_tensor *graph_forward(em_module *m, em_tensor *const *in, int n);

static const em_module_class graph_class = {
    .struct_size = sizeof(em_module_class), .name = "onnx.Graph",
    .description = "an imported ONNX graph (em_onnx_import)", .state_size = sizeof(ox_graph *),
    .forward = graph_forward, .free = graph_free, .n_inputs = 1,
};

const em_module_class *const ox_import_classes[] = {&graph_class, &params_class, NULL};

/* ---- reading ---------------------------------------------------------------------------------- */

typedef struct capped {
    size_t used, cap;
    bool over;
} capped;

static void *cap_alloc(void *data, size_t size) {
    capped *c = data;
    if (size > c->cap - c->used) {
        c->over = true;
        return NULL;
    }
    void *p = malloc(size + sizeof(size_t));
    if (!p) return NULL;
    *(size_t *)p = size;
    c->used += size;
    return (size_t *)p + 1;
}

static void cap_free(void *data, void *ptr) {
    capped *c = data;
    if (!ptr) return;
    size_t *p = (size_t *)ptr - 1;
    c->used -= *p;
    free(p);
}

/* The model unpacked with the default allocator (so that it can be freed like any message)
 * after a trial unpack under the capped one has shown it stays within bounds. */
static Onnx__ModelProto *unpack(const char *path, const uint8_t *buf, size_t n) {
    capped c = {.used = 0, .cap = 16 * n + (1u << 20)};
    ProtobufCAllocator a = {.alloc = cap_alloc, .free = cap_free, .allocator_data = &c};
    Onnx__ModelProto *m = onnx__model_proto__unpack(&a, n, buf);
    if (!m && c.over) {
        em_set_error(EM_ERR_FORMAT, "onnx import: %s: its messages would take more than %zu "
                     "bytes unpacked (16 times the file's %zu): refused as hostile", path, c.cap,
                     n);
        return NULL;
    }
    if (!m) {
        em_set_error(EM_ERR_FORMAT, "onnx import: %s: not a valid ONNX model (the protobuf "
                     "is truncated, has a field of the wrong wire type, or declares lengths "
                     "past the %zu bytes of the file)", path, n);
        return NULL;
    }
    onnx__model_proto__free_unpacked(m, &a);
    m = onnx__model_proto__unpack(NULL, n, buf);
    if (!m) em_set_error(EM_ERR_NOMEM, "onnx import: %s: out of memory", path);
    return m;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        em_set_error(EM_ERR_IO, "onnx import: cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        em_set_error(EM_ERR_IO, "onnx import: %s is not a regular file", path);
        return NULL;
    }
    if (sb.st_size > (off_t)INT32_MAX) {
        fclose(f);
        em_set_error(EM_ERR_FORMAT, "onnx import: %s is %lld bytes; an ONNX protobuf is at most "
                     "2 GiB (larger models keep their weights in external data, which Ember "
                     "does not read)", path, (long long)sb.st_size);
        return NULL;
    }
    size_t len = (size_t)sb.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        fclose(f);
        em_set_error(EM_ERR_NOMEM, "onnx import: %s: out of memory for %zu bytes", path, len);
        return NULL;
    }
    size_t got = fread(buf, 1, len, f);
    fclose(f);
    if (got != len) {
        free(buf);
        em_set_error(EM_ERR_IO, "onnx import: %s: read %zu of %zu bytes", path, got, len);
        return NULL;
    }
    *n = len;
    return buf;
}

/* ---- names -------------------------------------------------------------------------------------- */

static uint64_t hash(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

static int find_value(const ox_graph *g, const char *name) {
    if (!g->n_slots) return -1;
    for (size_t i = hash(name) & (g->n_slots - 1);; i = (i + 1) & (g->n_slots - 1)) {
        int k = g->slots[i];
        if (k < 0) return -1;
        if (strcmp(g->v[k].name, name) == 0) return k;
    }
}

/* The value named name (added when absent); -1 after the message. */
static int intern(ox_graph *g, const char *name) {
    int k = find_value(g, name);
    if (k >= 0) return k;
    if (g->n_v == g->cap_v) {
        int nc = g->cap_v ? g->cap_v * 2 : 64;
        value *nv = realloc(g->v, (size_t)nc * sizeof *nv);
        if (!nv) return em_set_error(EM_ERR_NOMEM, "onnx import: out of memory"), -1;
        g->v = nv;
        g->cap_v = nc;
    }
    if ((size_t)(g->n_v + 1) * 2 > g->n_slots) {
        size_t ns = g->n_slots ? g->n_slots * 2 : 128;
        int *sl = malloc(ns * sizeof *sl);
        if (!sl) return em_set_error(EM_ERR_NOMEM, "onnx import: out of memory"), -1;
        for (size_t i = 0; i < ns; i++) sl[i] = -1;
        free(g->slots);
        g->slots = sl;
        g->n_slots = ns;
        for (int j = 0; j < g->n_v; j++) {
            size_t i = hash(g->v[j].name) & (ns - 1);
            while (sl[i] >= 0) i = (i + 1) & (ns - 1);
            sl[i] = j;
        }
    }
    k = g->n_v++;
    g->v[k] = (value){.name = name, .kind = V_COMPUTED, .producer = -1};
    size_t i = hash(name) & (g->n_slots - 1);
    while (g->slots[i] >= 0) i = (i + 1) & (g->n_slots - 1);
    g->slots[i] = k;
    return k;
}

/* ---- initializers ---------------------------------------------------------------------------- */

static em_tensor *tensor_from_proto(const char *path, const Onnx__TensorProto *t) {
    const char *nm = t->name ? t->name : "";
    em_dtype dt;
    if (!t->has_data_type || !ox_ember_dtype(t->data_type, &dt)) {
        em_set_error(EM_ERR_DTYPE, "onnx import: %s: tensor '%s' has data type %d, which Ember "
                     "has no dtype for", path, nm, t->has_data_type ? (int)t->data_type : 0);
        return NULL;
    }
    if (t->n_external_data || (t->has_data_location && t->data_location)) {
        em_set_error(EM_ERR_FORMAT, "onnx import: %s: tensor '%s' keeps its data in an external "
                     "file, which Ember does not read", path, nm);
        return NULL;
    }
    if (t->n_dims > EM_MAX_DIMS) {
        em_set_error(EM_ERR_SHAPE, "onnx import: %s: tensor '%s' has %zu dims (at most %d)", path,
                     nm, t->n_dims, EM_MAX_DIMS);
        return NULL;
    }
    uint64_t numel = 1;
    for (size_t i = 0; i < t->n_dims; i++) {
        if (t->dims[i] < 0 || (t->dims[i] > 0 && numel > (UINT64_MAX >> 8) / (uint64_t)t->dims[i])) {
            em_set_error(EM_ERR_FORMAT, "onnx import: %s: tensor '%s' declares dim %zu = %lld, "
                         "%s", path, nm, i, (long long)t->dims[i],
                         t->dims[i] < 0 ? "a negative size" : "a size past 2^56 elements");
            return NULL;
        }
        numel *= (uint64_t)t->dims[i];
    }
    size_t es = em_dtype_size(dt);
    const void *src = NULL;
    size_t have = 0;
    void *conv = NULL;
    if (t->has_raw_data) {
        src = t->raw_data.data;
        have = t->raw_data.len / es;
        if (t->raw_data.len % es) have = (size_t)-1;
    } else if (dt == EM_F32) {
        src = t->float_data;
        have = t->n_float_data;
    } else if (dt == EM_I64) {
        src = t->int64_data;
        have = t->n_int64_data;
    } else if (dt == EM_F64) {
        src = t->double_data;
        have = t->n_double_data;
    } else if (dt == EM_I32 || dt == EM_U8 || dt == EM_BOOL) {
        have = t->n_int32_data;
        if (have == numel && numel) {
            conv = malloc((size_t)numel * es);
            if (!conv) {
                em_set_error(EM_ERR_NOMEM, "onnx import: out of memory");
                return NULL;
            }
            for (size_t i = 0; i < numel; i++) {
                if (dt == EM_I32) ((int32_t *)conv)[i] = t->int32_data[i];
                else ((uint8_t *)conv)[i] = (uint8_t)t->int32_data[i];
            }
            src = conv;
        }
    }
    if (have != numel) {
        em_set_error(EM_ERR_FORMAT, "onnx import: %s: tensor '%s' declares %llu elements of %s "
                     "but holds %s", path, nm, (unsigned long long)numel, em_dtype_name(dt),
                     have == (size_t)-1 ? "a byte count that is not a multiple of its size"
                                        : "a different number");
        free(conv);
        return NULL;
    }
    int64_t shape[EM_MAX_DIMS];
    for (size_t i = 0; i < t->n_dims; i++) shape[i] = t->dims[i];
    static const char zero[8];
    em_tensor *out = em_from_data(numel ? src : zero, (int)t->n_dims, shape, dt, em_cpu());
    free(conv);
    return out;
}

static bool valid_path(const char *s) {
    if (!*s || *s == '.') return false;
    for (const char *c = s; *c; c++) {
        bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                  *c == '_' || (*c == '.' && c[1] && c[1] != '.');
        if (!ok) return false;
    }
    return true;
}

/* The onnx.Params module for the dotted prefix of name under root (made when absent); its
 * last component to *local. */
static em_module *holder_for(em_module *root, const char *name, const char **local) {
    em_module *cur = root;
    const char *p = name;
    for (const char *dot; (dot = strchr(p, '.')); p = dot + 1) {
        char part[256];
        size_t n = (size_t)(dot - p);
        if (n >= sizeof part) {
            em_set_error(EM_ERR_RANGE, "onnx import: the name '%s' has a part longer than 255", name);
            return NULL;
        }
        memcpy(part, p, n);
        part[n] = '\0';
        em_module *c = em_module_child(cur, part);
        if (!c) {
            if (em_module_parameter(cur, part) || em_module_buffer(cur, part)) {
                em_set_error(EM_ERR_INVALID, "onnx import: '%s' is both a tensor and a path", part);
                return NULL;
            }
            if (!(c = em_module_new("onnx.Params", NULL)) || em_module_add_child(cur, part, c) != EM_OK)
                return NULL;
        }
        cur = c;
    }
    *local = p;
    return cur;
}

/* ---- attributes --------------------------------------------------------------------------------- */

static const char *attr_type_name(int t) {
    switch (t) {
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT: return "FLOAT";
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT: return "INT";
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING: return "STRING";
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR: return "TENSOR";
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOATS: return "FLOATS";
    case ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS: return "INTS";
    default: return "another type";
    }
}

typedef struct nctx {
    const char *path;
    const Onnx__NodeProto *n;
    int64_t opset;
} nctx;

static em_status node_error(const nctx *c, em_status st, const char *fmt, const char *a,
                            const char *b) {
    char what[512];
    snprintf(what, sizeof what, fmt, a, b);
    return em_set_error(st, "onnx import: %s: node '%s' (%s, opset %lld): %s", c->path,
                        c->n->name ? c->n->name : "", c->n->op_type ? c->n->op_type : "",
                        (long long)c->opset, what);
}

static const Onnx__AttributeProto *attr(const nctx *c, const char *name, int type, em_status *st) {
    for (size_t i = 0; i < c->n->n_attribute; i++) {
        const Onnx__AttributeProto *a = c->n->attribute[i];
        if (!a->name || strcmp(a->name, name)) continue;
        if (a->type != (Onnx__AttributeProto__AttributeType)type) {
            *st = node_error(c, EM_ERR_FORMAT, "attribute '%s' is %s", name, attr_type_name(a->type));
            return NULL;
        }
        return a;
    }
    return NULL;
}

static em_status get_int(const nctx *c, const char *name, int64_t dflt, int64_t *out) {
    em_status st = EM_OK;
    const Onnx__AttributeProto *a = attr(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT, &st);
    *out = a ? a->i : dflt;
    return st;
}

/* ONNX's float attributes are float32: epsilon 1e-5 arrives as 9.99999975e-06. They are read
 * back as the 7-digit decimal they print as (1e-05), the double Ember's layers were given, so
 * an imported BatchNormalization computes what Ember's BatchNorm does. */
static double decimal7(double v) {
    char t[32];
    snprintf(t, sizeof t, "%.7g", v);
    return strtod(t, NULL);
}

static em_status get_float(const nctx *c, const char *name, double dflt, double *out) {
    em_status st = EM_OK;
    const Onnx__AttributeProto *a = attr(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT, &st);
    *out = a ? decimal7(a->f) : dflt;
    return st;
}

/* An INTS attribute of exactly n values (n < 0: up to -n), else dflt when absent. */
static em_status get_ints(const nctx *c, const char *name, int n, const int64_t *dflt,
                          int64_t *out, int *count) {
    em_status st = EM_OK;
    const Onnx__AttributeProto *a = attr(c, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS, &st);
    if (st != EM_OK) return st;
    if (!a) {
        if (!dflt) return node_error(c, EM_ERR_FORMAT, "attribute '%s' is required%s", name, "");
        for (int i = 0; i < (n < 0 ? 0 : n); i++) out[i] = dflt[i];
        if (count) *count = n < 0 ? 0 : n;
        return EM_OK;
    }
    if ((n >= 0 && a->n_ints != (size_t)n) || (n < 0 && a->n_ints > (size_t)-n)) {
        char want[32];
        snprintf(want, sizeof want, n >= 0 ? "%d" : "at most %d", n >= 0 ? n : -n);
        return node_error(c, EM_ERR_FORMAT, "attribute '%s' has a wrong number of values "
                          "(expected %s; Ember imports 2-D convolutions and pooling)", name, want);
    }
    for (size_t i = 0; i < a->n_ints; i++) out[i] = a->ints[i];
    if (count) *count = (int)a->n_ints;
    return EM_OK;
}

static em_status parse_step(const nctx *c, step *s) {
    static const int64_t ones[4] = {1, 1, 1, 1}, zeros[4] = {0};
    em_status st = EM_OK;
    switch (s->op) {
    case OP_GEMM:
        if ((st = get_int(c, "transA", 0, &s->transA)) || (st = get_int(c, "transB", 0, &s->transB)) ||
            (st = get_float(c, "alpha", 1.0, &s->alpha)) || (st = get_float(c, "beta", 1.0, &s->beta)))
            return st;
        break;
    case OP_SOFTMAX:
    case OP_LOGSOFTMAX:
        return get_int(c, "axis", -1, &s->axis);
    case OP_FLATTEN:
    case OP_GATHER:
        return get_int(c, "axis", s->op == OP_FLATTEN ? 1 : 0, &s->axis);
    case OP_CONCAT:
        if ((st = get_int(c, "axis", INT64_MIN, &s->axis))) return st;
        if (s->axis == INT64_MIN) return node_error(c, EM_ERR_FORMAT, "attribute 'axis' is required%s%s", "", "");
        break;
    case OP_LEAKY:
        return get_float(c, "alpha", 0.01, &s->alpha);
    case OP_SPLIT:
        return get_int(c, "axis", 0, &s->axis);
    case OP_SHAPE: /* start and end (opset 15): s->k[0], s->k[1] */
        if ((st = get_int(c, "start", 0, &s->k[0])) || (st = get_int(c, "end", INT64_MAX, &s->k[1])))
            return st;
        break;
    case OP_TRANSPOSE:
        return get_ints(c, "perm", -EM_MAX_DIMS, zeros, s->perm, &s->n_perm);
    case OP_CAST:
        if ((st = get_int(c, "to", -1, &s->to))) return st;
        em_dtype dt;
        if (!ox_ember_dtype((int)s->to, &dt)) {
            char t[24];
            snprintf(t, sizeof t, "%lld", (long long)s->to);
            return node_error(c, EM_ERR_DTYPE, "a cast to ONNX type %s, which Ember has no dtype "
                              "for%s", t, "");
        }
        break;
    case OP_REDUCEMEAN:
        if ((st = get_ints(c, "axes", -EM_MAX_DIMS, zeros, s->axes, &s->n_axes)) ||
            (st = get_int(c, "keepdims", 1, &s->keepdims)))
            return st;
        break;
    case OP_BN:
        if ((st = get_float(c, "epsilon", 1e-5, &s->eps)) || (st = get_float(c, "momentum", 0.9, &s->momentum)))
            return st;
        /* Ember's (and PyTorch's) momentum is 1 - ONNX's */
        s->momentum = decimal7(1.0 - s->momentum);
        int64_t tm;
        if ((st = get_int(c, "training_mode", 0, &tm))) return st;
        if (tm) return node_error(c, EM_ERR_INVALID, "training_mode=1 is not imported%s%s", "", "");
        break;
    case OP_LN:
        if ((st = get_int(c, "axis", -1, &s->axis)) || (st = get_float(c, "epsilon", 1e-5, &s->eps)))
            return st;
        break;
    case OP_CONV:
    case OP_MAXPOOL:
    case OP_AVGPOOL: {
        if ((st = get_ints(c, "kernel_shape", 2, s->op == OP_CONV ? zeros : NULL, s->k, NULL)) ||
            (st = get_ints(c, "strides", 2, ones, s->s, NULL)) ||
            (st = get_ints(c, "dilations", 2, ones, s->d, NULL)) ||
            (st = get_ints(c, "pads", 4, zeros, s->pads, NULL)) ||
            (st = get_int(c, "group", 1, &s->group)))
            return st;
        int64_t cm = 0, cip = 0;
        if ((st = get_int(c, "ceil_mode", 0, &cm)) || (st = get_int(c, "count_include_pad", 0, &cip)))
            return st;
        s->ceil_mode = cm;
        s->count_include_pad = cip;
        const Onnx__AttributeProto *a = attr(c, "auto_pad", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING, &st);
        if (st) return st;
        if (a) {
            static const char *const modes[] = {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"};
            s->auto_pad = -1;
            for (int i = 0; i < 4; i++)
                if (a->s.len == strlen(modes[i]) && memcmp(a->s.data, modes[i], a->s.len) == 0)
                    s->auto_pad = i;
            if (s->auto_pad < 0)
                return node_error(c, EM_ERR_FORMAT, "auto_pad is not NOTSET, SAME_UPPER, "
                                  "SAME_LOWER or VALID%s%s", "", "");
            if (s->op != OP_CONV && s->auto_pad != 0 && s->auto_pad != 3)
                return node_error(c, EM_ERR_INVALID, "auto_pad SAME for pooling is not imported%s%s", "", "");
        }
        for (int i = 0; i < 2; i++)
            if (s->k[i] < 0 || s->s[i] < 1 || s->d[i] < 1 || s->pads[i] < 0 || s->pads[i + 2] < 0)
                return node_error(c, EM_ERR_FORMAT, "a kernel, stride, dilation or pad is out of "
                                  "range%s%s", "", "");
        if (s->op != OP_CONV && (s->pads[0] != s->pads[2] || s->pads[1] != s->pads[3]))
            return node_error(c, EM_ERR_INVALID, "asymmetric pads for pooling are not imported%s%s", "", "");
        break;
    }
    default:
        break;
    }
    return EM_OK;
}

/* ---- building ----------------------------------------------------------------------------------- */

static em_status build(const char *path, ox_graph *g, em_module *root) {
    const Onnx__ModelProto *mp = g->model;
    const Onnx__GraphProto *gp = mp->graph;
    if (!gp) return em_set_error(EM_ERR_FORMAT, "onnx import: %s: the model has no graph", path);
    g->opset = -1;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
        if ((!o->domain || !*o->domain || !strcmp(o->domain, "ai.onnx")) && o->has_version)
            g->opset = o->version;
    }
    if (g->opset < 13 || g->opset > 17)
        return em_set_error(EM_ERR_INVALID, "onnx import: %s: opset %lld of the default domain; "
                            "Ember imports opsets 13..17", path, (long long)g->opset);
    /* initializers */
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        if (!t->name || !*t->name)
            return em_set_error(EM_ERR_FORMAT, "onnx import: %s: initializer %zu has no name", path, i);
        if (find_value(g, t->name) >= 0)
            return em_set_error(EM_ERR_FORMAT, "onnx import: %s: two initializers named '%s'",
                                path, t->name);
        int k = intern(g, t->name);
        if (k < 0) return em_last_status();
        em_tensor *x = tensor_from_proto(path, t);
        if (!x) return em_last_status();
        value *v = &g->v[k];
        if (em_dtype_is_floating(em_tensor_dtype(x)) && valid_path(t->name)) {
            if (!(v->holder = holder_for(root, t->name, &v->local))) return em_last_status();
            bool buffer = !strcmp(v->local, "running_mean") || !strcmp(v->local, "running_var");
            em_status st = buffer ? em_module_add_buffer(v->holder, v->local, x, true)
                                  : em_module_add_parameter(v->holder, v->local, x);
            if (st != EM_OK) return st;
            v->kind = buffer ? V_BUFFER : V_PARAM;
        } else {
            v->kind = V_CONST;
            v->constant = em_tensor_retain(x); /* the graph's reference; the scope drops x's */
        }
    }
    /* the one graph input that is not an initializer, and the one output */
    g->input = -1;
    for (size_t i = 0; i < gp->n_input; i++) {
        const char *nm = gp->input[i]->name ? gp->input[i]->name : "";
        if (find_value(g, nm) >= 0) continue;
        if (g->input >= 0)
            return em_set_error(EM_ERR_INVALID, "onnx import: %s: the graph has several inputs "
                                "('%s', '%s'); Ember imports graphs of one", path,
                                g->v[g->input].name, nm);
        if ((g->input = intern(g, nm)) < 0) return em_last_status();
        g->v[g->input].kind = V_INPUT;
    }
    if (g->input < 0) return em_set_error(EM_ERR_INVALID, "onnx import: %s: the graph has no input", path);
    if (gp->n_output != 1)
        return em_set_error(EM_ERR_INVALID, "onnx import: %s: the graph has %zu outputs; Ember "
                            "imports graphs of one", path, gp->n_output);
    /* nodes */
    if (!(g->st = calloc(gp->n_node ? gp->n_node : 1, sizeof *g->st)))
        return em_set_error(EM_ERR_NOMEM, "onnx import: out of memory");
    for (size_t i = 0; i < gp->n_node; i++) {
        const Onnx__NodeProto *n = gp->node[i];
        nctx c = {.path = path, .n = n, .opset = g->opset};
        if (!n->op_type) return node_error(&c, EM_ERR_FORMAT, "no op type%s%s", "", "");
        if (n->domain && *n->domain && strcmp(n->domain, "ai.onnx"))
            return node_error(&c, EM_ERR_INVALID, "the op domain '%s' is not imported%s", n->domain, "");
        step *s = &g->st[i];
        s->node = n;
        int kind = -1;
        for (size_t j = 0; j < sizeof OPS / sizeof *OPS; j++)
            if (!strcmp(OPS[j].name, n->op_type)) kind = (int)j;
        if (kind < 0)
            return node_error(&c, EM_ERR_NOTFOUND, "op type %s is not supported by Ember's importer "
                              "(docs/onnx.md lists the ops imported)%s", n->op_type, "");
        s->op = OPS[kind].op;
        s->min_in = OPS[kind].min_in;
        if (n->n_input < (size_t)OPS[kind].min_in || n->n_input > (size_t)OPS[kind].max_in)
            return node_error(&c, EM_ERR_FORMAT, "a wrong number of inputs for %s%s", n->op_type, "");
        if (n->n_output < 1 || !n->output[0] || !*n->output[0] ||
            (n->n_output > 1 && s->op != OP_IDENTITY && s->op != OP_SPLIT))
            return node_error(&c, EM_ERR_FORMAT, "it must have one output%s%s", "", "");
        if (s->op == OP_SPLIT && n->n_output > MAX_OUT)
            return node_error(&c, EM_ERR_INVALID, "a Split into more than 16 outputs is not "
                              "imported%s%s", "", "");
        s->n_in = (int)n->n_input;
        for (int j = 0; j < s->n_in; j++) {
            if (!n->input[j] || !*n->input[j]) {
                s->in[j] = -1; /* an absent optional input */
                continue;
            }
            if ((s->in[j] = intern(g, n->input[j])) < 0) return em_last_status();
        }
        int o = intern(g, n->output[0]);
        if (o < 0) return em_last_status();
        if (g->v[o].kind != V_COMPUTED || g->v[o].producer >= 0)
            return node_error(&c, EM_ERR_FORMAT, "its output '%s' is also %s", n->output[0],
                              g->v[o].kind == V_COMPUTED ? "another node's output" : "a graph input or initializer");
        g->v[o].producer = (int)i;
        s->out = o;
        s->outs[0] = o;
        s->n_out = 1;
        for (size_t j = 1; s->op == OP_SPLIT && j < n->n_output; j++) {
            if (!n->output[j] || !*n->output[j])
                return node_error(&c, EM_ERR_FORMAT, "output %s has no name%s", j == 1 ? "1" : "2+", "");
            int oj = intern(g, n->output[j]);
            if (oj < 0) return em_last_status();
            if (g->v[oj].kind != V_COMPUTED || g->v[oj].producer >= 0)
                return node_error(&c, EM_ERR_FORMAT, "its output '%s' is also %s", n->output[j],
                                  g->v[oj].kind == V_COMPUTED ? "another node's output" : "a graph input or initializer");
            g->v[oj].producer = (int)i;
            s->outs[s->n_out++] = oj;
        }
        em_status st = parse_step(&c, s);
        if (st != EM_OK) return st;
        if (s->op == OP_CONSTANT) {
            const Onnx__AttributeProto *a = attr(&c, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR, &st);
            if (st) return st;
            if (!a || !a->t) return node_error(&c, EM_ERR_INVALID, "only a 'value' tensor is imported%s%s", "", "");
            em_tensor *x = tensor_from_proto(path, a->t);
            if (!x) return em_last_status();
            g->v[o].kind = V_CONST;
            g->v[o].constant = em_tensor_retain(x);
        }
        if (s->op == OP_GEMM && s->transA)
            return node_error(&c, EM_ERR_INVALID, "transA=1 is not imported%s%s", "", "");
    }
    g->n_st = (int)gp->n_node;
    /* every value read is made earlier (ONNX requires topological order; a cycle breaks it) */
    for (int i = 0; i < g->n_st; i++) {
        step *s = &g->st[i];
        for (int j = 0; j < s->n_in; j++) {
            if (s->in[j] < 0) continue;
            const value *v = &g->v[s->in[j]];
            nctx c = {.path = path, .n = s->node, .opset = g->opset};
            if (v->kind == V_COMPUTED && v->producer < 0)
                return node_error(&c, EM_ERR_FORMAT, "it reads '%s', which no node, input or "
                                  "initializer makes%s", v->name, "");
            if (v->kind == V_COMPUTED && v->producer >= i)
                return node_error(&c, EM_ERR_FORMAT, "it reads '%s', made by a node at or after it "
                                  "(a cycle, or nodes out of topological order)%s", v->name, "");
        }
        if (s->op == OP_GATHER && (s->in[0] < 0 || g->v[s->in[0]].kind == V_COMPUTED ||
                                   s->axis != 0)) {
            nctx c = {.path = path, .n = s->node, .opset = g->opset};
            return node_error(&c, EM_ERR_INVALID, "only a Gather of an initializer along axis 0 "
                              "(an embedding) is imported%s%s", "", "");
        }
    }
    /* input_transforms false: Ember's "/input_transforms/" nodes, first in the graph, are
     * left out; the value the last of them makes is the input */
    if (!g->keep_transforms) {
        int last = -1;
        for (int i = 0; i < g->n_st; i++) {
            const char *nm = g->st[i].node->name ? g->st[i].node->name : "";
            if (strncmp(nm, "/input_transforms/", 18) != 0) break;
            last = i;
        }
        for (int i = 0; i <= last; i++) g->st[i].skip = true;
        if (last >= 0) {
            g->v[g->input].kind = V_COMPUTED;
            g->input = g->st[last].out;
            g->v[g->input].kind = V_INPUT;
            g->v[g->input].producer = -1;
        }
    }
    const char *out = gp->output[0]->name ? gp->output[0]->name : "";
    if ((g->output = find_value(g, out)) < 0)
        return em_set_error(EM_ERR_FORMAT, "onnx import: %s: the graph output '%s' is made by "
                            "nothing", path, out);
    return EM_OK;
}

static const em_option_spec import_opts[] = {
    {.name = "input_transforms", .types = EM_OPT_BOOL, .def = {.b = true},
     .help = "keep the input transforms an Ember export put first (false: the graph starts "
             "after them, for a pipeline that applies them itself)"},
};

em_module *ox_import_model(const char *path, const em_options *options) {
    em_options *o = options ? em_options_copy(options) : em_options_new();
    if (!o || em_options_resolve(o, "onnx import", import_opts, 1) != EM_OK) {
        em_options_free(o);
        return NULL;
    }
    bool keep = em_options_bool(o, "input_transforms");
    em_options_free(o);
    size_t n = 0;
    uint8_t *buf = read_all(path, &n);
    if (!buf) return NULL;
    Onnx__ModelProto *mp = unpack(path, buf, n);
    free(buf);
    if (!mp) return NULL;
    em_module *m = em_module_new("onnx.Graph", NULL);
    ox_graph *g = calloc(1, sizeof *g);
    if (!m || !g) {
        free(g);
        onnx__model_proto__free_unpacked(mp, NULL);
        em_module_free(m);
        if (m) em_set_error(EM_ERR_NOMEM, "onnx import: out of memory");
        return NULL;
    }
    g->model = mp;
    g->keep_transforms = keep;
    *(ox_graph **)em_module_state(m) = g;
    /* in a scope of its own: the tensors read are dropped but for the module's references */
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_scope_begin();
    em_status st = build(path, g, m);
    em_scope_end();
    em_grad_mode_pop();
    if (st != EM_OK) {
        em_module_free(m);
        return NULL;
    }
    return m;
}

/* ---- forward ------------------------------------------------------------------------------------- */

static em_tensor *value_tensor(em_module *m, const ox_graph *g, em_tensor **vals, int k,
                               em_device dev) {
    if (k < 0) return NULL;
    const value *v = &g->v[k];
    switch (v->kind) {
    case V_PARAM: return em_module_parameter(v->holder, v->local);
    case V_BUFFER: return em_module_buffer(v->holder, v->local);
    case V_CONST:
        return em_tensor_device(v->constant).type == dev.type &&
                       em_tensor_device(v->constant).index == dev.index
                   ? v->constant : em_to_device(v->constant, dev);
    default: (void)m; return vals[k];
    }
}

/* The values of a 1-D (or 0-D) integer tensor, at most cap of them, on the host; -1 (the
 * error set) when it is not one. */
static int host_ints(const em_tensor *t, int64_t *out, int cap, const char *what) {
    if (!t || em_dtype_is_floating(em_tensor_dtype(t)) || em_tensor_ndim(t) > 1 ||
        em_tensor_numel(t) > cap) {
        em_set_error(EM_ERR_SHAPE, "%s must be a 0-D or 1-D integer tensor of at most %d "
                     "values", what, cap);
        return -1;
    }
    em_tensor *l = em_contiguous(em_to_dtype(t, EM_I64));
    int n = (int)em_tensor_numel(t);
    if (!l || (n && em_tensor_to_host(l, out, (size_t)cap * sizeof *out) != EM_OK)) return -1;
    return n;
}

/* A tensor made on the host, on dev. */
static em_tensor *to_dev(em_tensor *t, em_device dev) {
    if (!t) return NULL;
    em_device d = em_tensor_device(t);
    return d.type == dev.type && d.index == dev.index ? t : em_to_device(t, dev);
}

/* Split's parts of x into vals[s->outs[...]]: the sizes of input 1, or equal ones. */
static em_status run_split(const ox_graph *g, const step *s, em_tensor *x, em_tensor *sizes,
                           em_tensor **vals) {
    int nd = em_tensor_ndim(x), ax = (int)(s->axis < 0 ? s->axis + nd : s->axis);
    if (ax < 0 || ax >= nd)
        return em_set_error(EM_ERR_SHAPE, "axis %lld does not fit a %d-D input",
                            (long long)s->axis, nd);
    int64_t len[MAX_OUT], dim = em_tensor_size(x, ax), total = 0;
    if (sizes) {
        int k = host_ints(sizes, len, MAX_OUT, "split");
        if (k < 0) return em_last_status();
        if (k != s->n_out)
            return em_set_error(EM_ERR_SHAPE, "split has %d sizes for %d outputs", k, s->n_out);
    } else {
        if (dim % s->n_out)
            return em_set_error(EM_ERR_SHAPE, "dim %d (%lld) does not split evenly into %d",
                                ax, (long long)dim, s->n_out);
        for (int j = 0; j < s->n_out; j++) len[j] = dim / s->n_out;
    }
    for (int j = 0; j < s->n_out; j++) {
        if (len[j] < 0) return em_set_error(EM_ERR_SHAPE, "split size %lld", (long long)len[j]);
        total += len[j];
    }
    if (total != dim)
        return em_set_error(EM_ERR_SHAPE, "the split sizes add up to %lld, not dim %d's %lld",
                            (long long)total, ax, (long long)dim);
    for (int j = 0, at = 0; j < s->n_out; at += (int)len[j], j++)
        if (!(vals[s->outs[j]] = em_narrow(x, ax, at, len[j]))) return em_last_status();
    (void)g;
    return EM_OK;
}

static em_tensor *run_step(em_module *m, const ox_graph *g, const step *s, em_tensor **vals,
                           em_device dev) {
    em_tensor *a[MAX_IN] = {0};
    for (int j = 0; j < s->n_in; j++) a[j] = value_tensor(m, g, vals, s->in[j], dev);
    for (int j = 0; j < s->min_in; j++)
        if (!a[j]) {
            em_set_error(EM_ERR_INVALID, "input %d is absent", j);
            return NULL;
        }
    em_tensor *x = a[0];
    switch (s->op) {
    case OP_GEMM: {
        const em_tensor *w = s->transB ? a[1] : em_transpose(a[1], 0, 1);
        em_tensor *y = em_linear(x, w, s->beta == 1.0 ? a[2] : NULL);
        if (s->alpha != 1.0) y = em_mul_scalar(y, s->alpha);
        if (a[2] && s->beta != 1.0) y = em_add(y, em_mul_scalar(a[2], s->beta));
        return y;
    }
    case OP_MATMUL: return em_matmul(x, a[1]);
    case OP_ADD: return em_add(x, a[1]);
    case OP_SUB: return em_sub(x, a[1]);
    case OP_MUL: return em_mul(x, a[1]);
    case OP_DIV: return em_div(x, a[1]);
    case OP_RELU: return em_relu(x);
    case OP_SIGMOID: return em_sigmoid(x);
    case OP_TANH: return em_tanh(x);
    case OP_SOFTMAX: return em_softmax(x, (int)s->axis);
    case OP_LOGSOFTMAX: return em_log_softmax(x, (int)s->axis);
    case OP_LEAKY: return em_leaky_relu(x, s->alpha);
    case OP_IDENTITY: return x; /* borrowed: graph_forward knows */
    case OP_ERF: return em_erf(x);
    case OP_SQRT: return em_sqrt(x);
    case OP_CAST: {
        em_dtype dt;
        ox_ember_dtype((int)s->to, &dt);
        return em_to_dtype(x, dt);
    }
    case OP_FLATTEN: {
        int nd = em_tensor_ndim(x), ax = (int)(s->axis < 0 ? s->axis + nd : s->axis);
        if (ax < 0 || ax > nd) break;
        int64_t outer = 1, inner = 1;
        for (int i = 0; i < nd; i++) *(i < ax ? &outer : &inner) *= em_tensor_size(x, i);
        return em_reshape(x, 2, (int64_t[]){outer, inner});
    }
    case OP_RESHAPE: {
        em_tensor *sh = em_to_dtype(a[1], EM_I64);
        int64_t k = sh ? em_tensor_numel(sh) : 0, shape[EM_MAX_DIMS];
        if (!sh || em_tensor_ndim(sh) != 1 || k > EM_MAX_DIMS) break;
        if (em_tensor_to_host(em_contiguous(sh), shape, sizeof shape) != EM_OK) return NULL;
        int64_t known = 1, unknown = -1;
        for (int i = 0; i < k; i++) {
            if (shape[i] == 0 && i < em_tensor_ndim(x)) shape[i] = em_tensor_size(x, i);
            if (shape[i] == -1 && unknown < 0) unknown = i;
            else known *= shape[i];
        }
        if (unknown >= 0 && known > 0) shape[unknown] = em_tensor_numel(x) / known;
        return em_reshape(x, (int)k, shape);
    }
    case OP_TRANSPOSE: {
        int nd = em_tensor_ndim(x), perm[EM_MAX_DIMS];
        for (int i = 0; i < nd; i++) perm[i] = s->n_perm ? (int)s->perm[i] : nd - 1 - i;
        if (s->n_perm && s->n_perm != nd) break;
        return em_contiguous(em_permute(x, nd, perm));
    }
    case OP_CONCAT: return em_cat(s->n_in, (const em_tensor *const *)a, (int)s->axis);
    case OP_CONV: {
        if (!a[1] || em_tensor_ndim(a[1]) != 4) break;
        int64_t k[2] = {em_tensor_size(a[1], 2), em_tensor_size(a[1], 3)}, p[4];
        memcpy(p, s->pads, sizeof p);
        if (s->auto_pad == 1 || s->auto_pad == 2) { /* SAME: output = ceil(input / stride) */
            for (int i = 0; i < 2; i++) {
                int64_t in = em_tensor_size(x, 2 + i), o = (in + s->s[i] - 1) / s->s[i];
                int64_t total = (o - 1) * s->s[i] + s->d[i] * (k[i] - 1) + 1 - in;
                if (total < 0) total = 0;
                p[i] = s->auto_pad == 1 ? total / 2 : total - total / 2;
                p[i + 2] = total - p[i];
            }
        } else if (s->auto_pad == 3) {
            memset(p, 0, sizeof p);
        }
        int64_t sym[2] = {p[0] < p[2] ? p[0] : p[2], p[1] < p[3] ? p[1] : p[3]};
        const em_tensor *xi = x;
        if (p[0] != p[2] || p[1] != p[3]) /* the rest of an asymmetric padding as a zero pad */
            xi = em_pad(x, 4, (int64_t[]){p[1] - sym[1], p[3] - sym[1], p[0] - sym[0], p[2] - sym[0]}, 0.0);
        return em_conv2d(xi, a[1], a[2], s->s, sym, s->d, s->group);
    }
    case OP_MAXPOOL: {
        em_tensor *out = NULL;
        int64_t p[2] = {s->pads[0], s->pads[1]};
        if (em_max_pool2d(x, s->k, s->s, p, s->d, s->ceil_mode, &out, NULL) != EM_OK) return NULL;
        return out;
    }
    case OP_AVGPOOL: {
        int64_t p[2] = {s->pads[0], s->pads[1]};
        return em_avg_pool2d(x, s->k, s->s, p, s->ceil_mode, s->count_include_pad);
    }
    case OP_GAP: return em_adaptive_avg_pool2d(x, (int64_t[]){1, 1});
    case OP_BN: {
        em_tensor *out = NULL;
        bool training = em_module_training(m);
        if (em_batch_norm(x, a[1], a[2], a[3], a[4], training, s->momentum, s->eps, &out,
                          NULL, NULL) != EM_OK)
            return NULL;
        return out;
    }
    case OP_LN: {
        int nd = em_tensor_ndim(x), ax = (int)(s->axis < 0 ? s->axis + nd : s->axis);
        if (ax < 0 || ax >= nd) break;
        em_tensor *out = NULL;
        if (em_layer_norm(x, nd - ax, em_tensor_shape(x) + ax, a[1], a[2], s->eps, &out, NULL,
                          NULL) != EM_OK)
            return NULL;
        return out;
    }
    case OP_GATHER: return em_embedding(a[0], a[1], EM_PADDING_IDX_NONE);
    case OP_REDUCEMEAN: {
        int nd = em_tensor_ndim(x), dims[EM_MAX_DIMS];
        for (int i = 0; i < s->n_axes; i++) dims[i] = (int)(s->axes[i] < 0 ? s->axes[i] + nd : s->axes[i]);
        if (!s->n_axes)
            for (int i = 0; i < nd; i++) dims[i] = i;
        return em_mean(x, s->n_axes ? s->n_axes : nd, dims, s->keepdims != 0);
    }
    case OP_CONSTANT: return g->v[s->out].constant;
    case OP_SPLIT: break; /* graph_forward: several outputs */
    case OP_SHAPE: {
        int nd = em_tensor_ndim(x);
        int64_t b = s->k[0] < 0 ? s->k[0] + nd : s->k[0], e = s->k[1] < 0 ? s->k[1] + nd : s->k[1];
        b = b < 0 ? 0 : b > nd ? nd : b;
        e = e < b ? b : e > nd ? nd : e;
        return to_dev(em_from_data(em_tensor_shape(x) + b, 1, (int64_t[]){e - b}, EM_I64,
                                   em_cpu()), dev);
    }
    case OP_SLICE: {
        int64_t st[EM_MAX_DIMS], en[EM_MAX_DIMS], ax[EM_MAX_DIMS], sp[EM_MAX_DIMS];
        int nd = em_tensor_ndim(x);
        int k = host_ints(a[1], st, EM_MAX_DIMS, "starts");
        if (k < 0 || host_ints(a[2], en, EM_MAX_DIMS, "ends") != k) {
            if (k >= 0) em_set_error(EM_ERR_SHAPE, "starts and ends differ in length");
            return NULL;
        }
        if (a[3] && host_ints(a[3], ax, EM_MAX_DIMS, "axes") != k) {
            em_set_error(EM_ERR_SHAPE, "axes and starts differ in length");
            return NULL;
        }
        if (a[4] && host_ints(a[4], sp, EM_MAX_DIMS, "steps") != k) {
            em_set_error(EM_ERR_SHAPE, "steps and starts differ in length");
            return NULL;
        }
        em_tensor *y = x;
        for (int i = 0; i < k; i++) {
            int d = (int)(a[3] ? (ax[i] < 0 ? ax[i] + nd : ax[i]) : i);
            if (d < 0 || d >= nd || (a[4] && sp[i] != 1)) {
                em_set_error(EM_ERR_INVALID, d < 0 || d >= nd ? "axis %lld does not fit a %d-D "
                             "input" : "a step other than 1 (%lld) is not imported (%d)",
                             (long long)(a[3] ? ax[i] : a[4] ? sp[i] : i), nd);
                return NULL;
            }
            int64_t n = em_tensor_size(x, d), b = st[i] < 0 ? st[i] + n : st[i],
                    e = en[i] < 0 ? en[i] + n : en[i];
            b = b < 0 ? 0 : b > n ? n : b;
            e = e < b ? b : e > n ? n : e;
            if (!(y = em_narrow(y, d, b, e - b))) return NULL;
        }
        return y == x ? em_clone(x) : y; /* a result of its own, never the input borrowed */
    }
    case OP_RANGE: {
        double v[3];
        for (int i = 0; i < 3; i++) {
            em_tensor *f = a[i] && em_tensor_numel(a[i]) == 1 && em_tensor_ndim(a[i]) <= 1
                               ? em_to_dtype(a[i], EM_F64) : NULL;
            if (!f || em_tensor_to_host(f, &v[i], sizeof v[i]) != EM_OK) {
                em_set_error(EM_ERR_SHAPE, "start, limit and delta must be scalars");
                return NULL;
            }
        }
        double n = v[2] != 0 ? ceil((v[1] - v[0]) / v[2]) : NAN;
        if (!(n <= MAX_RANGE)) { /* NaN too: a zero delta, infinite bounds */
            em_set_error(EM_ERR_RANGE, "start %g, limit %g, delta %g: more than %d elements (or "
                         "none defined)", v[0], v[1], v[2], MAX_RANGE);
            return NULL;
        }
        if (n <= 0) return to_dev(em_empty(1, (int64_t[]){0}, em_tensor_dtype(x), em_cpu()), dev);
        return em_arange(v[0], v[1], v[2], em_tensor_dtype(x), dev);
    }
    case OP_GREATER: return em_gt(x, a[1]);
    case OP_WHERE: return em_where(x, a[1], a[2]);
    }
    em_set_error(EM_ERR_SHAPE, "its %d-D input does not fit the node", em_tensor_ndim(x));
    return NULL;
}

static em_tensor *graph_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    ox_graph *g = *(ox_graph **)em_module_state(m);
    /* vals[k]: value k's tensor, borrowed; made[k]: an op result of this forward (owned by
     * its scope), which is returned as it is, where anything else is retained */
    em_tensor **vals = calloc((size_t)g->n_v, sizeof *vals);
    bool *made = calloc((size_t)g->n_v, sizeof *made);
    if (!vals || !made) {
        free(vals);
        free(made);
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    vals[g->input] = in[0];
    em_device dev = em_tensor_device(in[0]);
    for (int i = 0; i < g->n_st; i++) {
        const step *s = &g->st[i];
        if (s->op == OP_CONSTANT || s->skip) continue; /* a value of its own; left out */
        if (s->op == OP_SPLIT) {
            em_tensor *x = value_tensor(m, g, vals, s->in[0], dev);
            em_tensor *sizes = s->n_in > 1 ? value_tensor(m, g, vals, s->in[1], dev) : NULL;
            if (x && run_split(g, s, x, sizes, vals) == EM_OK) {
                for (int j = 0; j < s->n_out; j++) made[s->outs[j]] = true;
                continue;
            }
            if (!x) em_set_error(EM_ERR_INVALID, "input 0 is absent");
        }
        em_tensor *y = s->op == OP_SPLIT ? NULL : run_step(m, g, s, vals, dev);
        if (!y) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", em_last_error());
            em_set_error(em_last_status(), "node '%s' (%s): %s", s->node->name ? s->node->name : "",
                         s->node->op_type, msg);
            free(vals);
            free(made);
            return NULL;
        }
        vals[s->out] = y;
        made[s->out] = s->op != OP_IDENTITY || (s->in[0] >= 0 && made[s->in[0]]);
    }
    em_tensor *out = value_tensor(m, g, vals, g->output, dev);
    bool own = made[g->output];
    free(vals);
    free(made);
    return own ? out : em_tensor_retain(out);
}

/* ---- export of an onnx.Graph: the nodes it was read from, the current weights ---------------- */

static em_status graph_x(em_onnx_builder *b, em_module *m, const char *in, const em_tensor *x,
                         char *out) {
    (void)x;
    ox_graph *g = *(ox_graph **)em_module_state(m);
    const Onnx__GraphProto *gp = g->model->graph;
    em_status st = EM_OK;
    for (size_t i = 0; i < gp->n_initializer && st == EM_OK; i++) {
        int k = find_value(g, gp->initializer[i]->name);
        if (!g->keep_transforms && !strncmp(g->v[k].name, "/input_transforms/", 18)) continue;
        em_tensor *t = value_tensor(m, g, NULL, k, em_cpu());
        st = t ? ox_builder_raw_initializer(b, g->v[k].name, t) : em_last_status();
    }
    for (int i = 0; i < g->n_st && st == EM_OK; i++)
        if (!g->st[i].skip) st = ox_builder_raw_node(b, g->st[i].node, g->v[g->input].name, in);
    if (st == EM_OK && g->keep_transforms) ox_builder_set_origin(b, g->model);
    if (st == EM_OK) snprintf(out, EM_ONNX_NAME_MAX, "%s", g->v[g->output].name);
    return st;
}

const em_onnx_layer_class ox_graph_exporter = {
    .struct_size = sizeof(em_onnx_layer_class), .name = "onnx.Graph",
    .description = "the nodes it was imported from, with the current weights",
    .export_layer = graph_x,
};
