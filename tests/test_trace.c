/*
 * test_trace.c — the observer point every op passes, the forward-graph tracer and the op
 * profiler (ember/trace.h).
 *
 * The model traces compare the recorded node list with one written here from the models'
 * definitions: an MLP and a CNN forward + loss under no_grad (op names in order, input and
 * output shapes and dtypes, attribute values, parameters and buffers by their state-dict
 * names, graph inputs), the MLP again with gradients on (each node's backward op and each
 * parameter's gradient op). A call that bypassed the observer is missing from the list, or
 * shows up as a graph input where a node's output should be: either fails the comparison.
 * Then: views, copies and in-place ops appear once each; a composite appears once with its
 * sub-ops nested; observers stack and belong to their thread; the JSON and dot writers; the
 * profiler; a profiling session covers every thread (its own buffer and track each, the
 * buffers of exited threads kept, loader workers named), begins and ends on any thread, and
 * stays whole while threads run ops through begin and end.
 */
#define _GNU_SOURCE /* open_memstream */
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

TestSuite(trace, .init = em_test_setup, .fini = em_test_teardown);

/* ---- helpers -------------------------------------------------------------------------------- */

static em_module *make(const char *cls, ...) {
    va_list ap;
    va_start(ap, cls);
    em_options *o = em_options_new();
    for (const char *k; (k = va_arg(ap, const char *));)
        em_options_set_text(o, k, va_arg(ap, const char *), NULL);
    va_end(ap);
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    cr_assert(m, "%s: %s", cls, em_last_error());
    return m;
}
#define MAKE(...) make(__VA_ARGS__, NULL)

static em_module *sequential(em_module *const *layers, int n) {
    em_module *s = em_module_new("Sequential", NULL);
    cr_assert(s, "%s", em_last_error());
    for (int i = 0; i < n; i++) cr_assert_eq(em_module_append_child(s, layers[i]), EM_OK);
    return s;
}

/* A short dtype name for the rendered lists. */
static const char *dt(em_dtype d) {
    switch (d) {
    case EM_F32: return "f32";
    case EM_F64: return "f64";
    case EM_I64: return "i64";
    case EM_I32: return "i32";
    case EM_BOOL: return "bool";
    default: return em_dtype_name(d);
    }
}

static void shape_text(char *b, size_t cap, const em_trace_value *v) {
    size_t n = (size_t)snprintf(b, cap, "%s[", dt(v->dtype));
    for (int d = 0; d < v->ndim && n < cap; d++)
        n += (size_t)snprintf(b + n, cap - n, "%s%lld", d ? "," : "", (long long)v->shape[d]);
    if (n < cap) snprintf(b + n, cap - n, "]");
}

static void attr_text(char *b, size_t cap, const em_attr *a) {
    switch (a->type) {
    case EM_ATTR_NONE: snprintf(b, cap, "-"); break;
    case EM_ATTR_INT: snprintf(b, cap, "%lld", (long long)a->v.i); break;
    case EM_ATTR_FLOAT: snprintf(b, cap, "%g", a->v.f); break;
    case EM_ATTR_BOOL: snprintf(b, cap, "%s", a->v.b ? "true" : "false"); break;
    case EM_ATTR_STRING: snprintf(b, cap, "%s", a->v.s); break;
    case EM_ATTR_INTS:
    case EM_ATTR_INT_LIST: {
        const int64_t *v = a->type == EM_ATTR_INTS ? a->ints : a->v.list;
        size_t n = (size_t)snprintf(b, cap, "[");
        for (int i = 0; i < a->n && n < cap; i++)
            n += (size_t)snprintf(b + n, cap - n, "%s%lld", i ? "," : "", (long long)v[i]);
        if (n < cap) snprintf(b + n, cap - n, "]");
        break;
    }
    }
}

/* One node as a line: "  " per depth, op, (inputs), {attrs}, -> outputs, then flags. An input
 * made by a node shows that node's position in `list` (#k, .j for output j > 0); graph inputs,
 * parameters and buffers their names. With grad, the node's grad_fn and each parameter's
 * gradient op are shown too. */
static void render(const em_trace *tr, const size_t *list, size_t n_list, size_t k, bool grad,
                   char *b, size_t cap) {
    const em_trace_node *n = em_trace_node_at(tr, list[k]);
    size_t len = 0;
#define PUT(...) (len += (size_t)snprintf(b + len, len < cap ? cap - len : 0, __VA_ARGS__))
    PUT("%*s%s(", 2 * n->depth, "", n->op);
    for (int i = 0; i < n->n_in; i++) {
        const em_trace_value *v = &n->in[i];
        char s[96];
        shape_text(s, sizeof s, v);
        if (i) PUT(", ");
        switch (v->source) {
        case EM_TRACE_FROM_NODE: {
            long pos = -1;
            for (size_t j = 0; j < n_list; j++)
                if (list[j] == (size_t)v->node) pos = (long)j;
            if (v->output) PUT("#%ld.%d %s", pos, v->output, s);
            else PUT("#%ld %s", pos, s);
            break;
        }
        case EM_TRACE_FROM_INPUT:
        case EM_TRACE_FROM_BUFFER: PUT("%s %s", v->name, s); break;
        case EM_TRACE_FROM_PARAMETER:
            PUT("%s %s", v->name, s);
            if (grad) PUT(" grad:%s", v->grad_op ? v->grad_op : "-");
            break;
        case EM_TRACE_FROM_NONE: PUT("none"); break;
        case EM_TRACE_FROM_LOCAL: PUT("local %s", s); break;
        }
    }
    PUT(")");
    if (n->n_attrs) {
        PUT(" {");
        for (int i = 0; i < n->n_attrs; i++) {
            char s[96];
            attr_text(s, sizeof s, &n->attrs[i]);
            PUT("%s%s=%s", i ? ", " : "", n->attr_names[i], s);
        }
        PUT("}");
    }
    PUT(" ->");
    for (int j = 0; j < n->n_out; j++) {
        char s[96];
        shape_text(s, sizeof s, &n->out[j]);
        PUT("%s %s", j ? "," : "", s);
    }
    if (n->inplace) PUT(" inplace");
    if (grad) PUT(" grad_fn:%s", n->grad_fn ? n->grad_fn : "-");
#undef PUT
}

/* Compare the trace's nodes (all of them, or only the top level) with the expected lines. */
static void expect_nodes(const em_trace *tr, bool top_only, bool grad, const char *const *want,
                         size_t n_want) {
    size_t list[256], n = 0;
    for (size_t i = 0; i < em_trace_node_count(tr) && n < 256; i++)
        if (!top_only || em_trace_node_at(tr, i)->parent < 0) list[n++] = i;
    char all[16384] = "";
    size_t len = 0;
    for (size_t k = 0; k < n; k++) {
        char line[1024];
        render(tr, list, n, k, grad, line, sizeof line);
        len += (size_t)snprintf(all + len, len < sizeof all ? sizeof all - len : 0, "%s\n", line);
    }
    for (size_t k = 0; k < n && k < n_want; k++) {
        char line[1024];
        render(tr, list, n, k, grad, line, sizeof line);
        cr_assert_str_eq(line, want[k], "node %zu differs; the trace:\n%s", k, all);
    }
    cr_assert_eq(n, n_want, "%zu nodes, %zu expected; the trace:\n%s", n, n_want, all);
}

static em_trace *trace_of(void (*body)(void *), void *user, const em_module *m) {
    em_trace_options o = {.struct_size = sizeof o, .module = m};
    cr_assert_eq(em_trace_begin(&o), EM_OK, "%s", em_last_error());
    body(user);
    em_trace *tr = em_trace_end();
    cr_assert(tr, "%s", em_last_error());
    return tr;
}

/* ---- an MLP and a CNN, forward + loss ---------------------------------------------------------- */

typedef struct fwd {
    em_module *model;
    em_tensor *x, *target;
} fwd;

static void forward_loss(void *user) {
    fwd *f = user;
    em_tensor *y = em_module_forward(f->model, f->x);
    cr_assert(y, "%s", em_last_error());
    cr_assert(em_cross_entropy(y, f->target, NULL, EM_REDUCTION_MEAN, -100, 0.0), "%s",
              em_last_error());
}

static em_module *mlp(void) {
    em_module *l[] = {MAKE("Linear", "in_features", "4", "out_features", "8"), MAKE("ReLU"),
                      MAKE("Linear", "in_features", "8", "out_features", "3")};
    return sequential(l, 3);
}

/* linear is a composite: x (N, in) -> (N, in) as rows, weight transposed to (in, out), the
 * bias expanded to (N, out), one addmm, and the (N, out) view of its result. */
static const char *const mlp_nodes[] = {
    "linear(input0 f32[2,4], 0.weight f32[8,4], 0.bias f32[8]) -> f32[2,8]",
    "  reshape(input0 f32[2,4]) {shape=[2,4]} -> f32[2,4]",
    "  transpose(0.weight f32[8,4]) {dim0=0, dim1=1} -> f32[4,8]",
    "  expand(0.bias f32[8]) {shape=[2,8]} -> f32[2,8]",
    "  addmm(#3 f32[2,8], #1 f32[2,4], #2 f32[4,8]) {beta=1, alpha=1} -> f32[2,8]",
    "  view(#4 f32[2,8]) {shape=[2,8]} -> f32[2,8]",
    "relu(#0 f32[2,8]) -> f32[2,8]",
    "linear(#6 f32[2,8], 2.weight f32[3,8], 2.bias f32[3]) -> f32[2,3]",
    "  reshape(#6 f32[2,8]) {shape=[2,8]} -> f32[2,8]",
    "  transpose(2.weight f32[3,8]) {dim0=0, dim1=1} -> f32[8,3]",
    "  expand(2.bias f32[3]) {shape=[2,3]} -> f32[2,3]",
    "  addmm(#10 f32[2,3], #8 f32[2,8], #9 f32[8,3]) {beta=1, alpha=1} -> f32[2,3]",
    "  view(#11 f32[2,3]) {shape=[2,3]} -> f32[2,3]",
    /* reduction 1 is EM_REDUCTION_MEAN; the composite passes its kernel an empty weight it
     * allocated itself when none is given */
    "cross_entropy(#7 f32[2,3], input1 i64[2], none) {reduction=1, ignore_index=-100, "
    "label_smoothing=0} -> f32[]",
    "  cross_entropy(#7 f32[2,3], input1 i64[2], local f32[0]) {reduction=1, "
    "ignore_index=-100, label_smoothing=0} -> f32[]",
};

Test(trace, mlp_forward_and_loss_under_no_grad) {
    em_scope_begin();
    fwd f = {.model = mlp(), .x = em_ones(2, (int64_t[]){2, 4}, EM_F32, em_cpu()),
             .target = em_zeros(1, (int64_t[]){2}, EM_I64, em_cpu())};
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_trace *tr = trace_of(forward_loss, &f, f.model);
    em_grad_mode_pop();
    expect_nodes(tr, false, false, mlp_nodes, N_OF(mlp_nodes));
    cr_assert_eq(em_trace_input_count(tr), 2);
    /* linear 2 x 8 floats: its result's storage (the addmm output its view holds) */
    cr_assert_eq(em_trace_node_at(tr, 0)->bytes, 2 * 8 * 4);
    cr_assert_eq(em_trace_node_at(tr, 5)->bytes, 0, "a view holds no memory of its own");
    const em_trace_node *lin = em_trace_node_at(tr, 0);
    cr_assert_eq(lin->kind, EM_OP_EVENT_COMPOSITE);
    cr_assert_eq(lin->n_children, 5);
    for (int k = 0; k < 5; k++) cr_assert_eq(lin->children[k], 1 + k);
    em_trace_free(tr);
    em_module_free(f.model);
    em_scope_end();
}

/* Gradients on: each node names its backward op; each parameter, the backward op its gradient
 * comes from (the weight reaches addmm through its transposed view, the bias through its
 * expanded one). */
static const char *const mlp_grad_nodes[] = {
    "linear(input0 f32[2,4], 0.weight f32[8,4] grad:permute, 0.bias f32[8] grad:expand) -> "
    "f32[2,8] grad_fn:view",
    "relu(#0 f32[2,8]) -> f32[2,8] grad_fn:relu",
    "linear(#1 f32[2,8], 2.weight f32[3,8] grad:permute, 2.bias f32[3] grad:expand) -> "
    "f32[2,3] grad_fn:view",
    "cross_entropy(#2 f32[2,3], input1 i64[2], none) {reduction=1, ignore_index=-100, "
    "label_smoothing=0} -> f32[] grad_fn:cross_entropy",
};

Test(trace, mlp_with_gradients_on_records_the_gradient_ops) {
    em_scope_begin();
    fwd f = {.model = mlp(), .x = em_ones(2, (int64_t[]){2, 4}, EM_F32, em_cpu()),
             .target = em_zeros(1, (int64_t[]){2}, EM_I64, em_cpu())};
    em_trace *tr = trace_of(forward_loss, &f, f.model);
    expect_nodes(tr, true, true, mlp_grad_nodes, N_OF(mlp_grad_nodes));
    /* Inside the composite the transposed view is where the weight's gradient comes from. */
    const em_trace_node *t = em_trace_node_at(tr, 2);
    cr_assert_str_eq(t->op, "transpose");
    cr_assert_str_eq(t->grad_fn, "permute");
    cr_assert_str_eq(t->in[0].grad_op, "permute");
    em_trace_free(tr);
    em_module_free(f.model);
    em_scope_end();
}

/* BatchNorm2d in training mode counts its batches in place (num_batches_tracked += 1), then
 * normalises with the batch statistics (outputs: y, the batch mean and variance). */
static const char *const cnn_nodes[] = {
    "conv2d(input0 f32[2,1,4,4], 0.weight f32[2,1,3,3], 0.bias f32[2]) {stride=[1,1], "
    "padding=[1,1], dilation=[1,1], groups=1} -> f32[2,2,4,4]",
    "add_scalar_(1.num_batches_tracked i64[]) {value=1} -> i64[] inplace",
    "batch_norm(#0 f32[2,2,4,4], 1.weight f32[2], 1.bias f32[2], 1.running_mean f32[2], "
    "1.running_var f32[2]) {training=true, momentum=0.1, eps=1e-05} -> f32[2,2,4,4], f32[2], "
    "f32[2]",
    "relu(#2 f32[2,2,4,4]) -> f32[2,2,4,4]",
    "max_pool2d(#3 f32[2,2,4,4]) {kernel_size=[2,2], stride=[2,2], padding=[0,0], "
    "dilation=[1,1], ceil_mode=false} -> f32[2,2,2,2], i64[2,2,2,2]",
    "flatten(#4 f32[2,2,2,2]) {start_dim=1, end_dim=-1} -> f32[2,8]",
    "linear(#5 f32[2,8], 5.weight f32[3,8], 5.bias f32[3]) -> f32[2,3]",
    "cross_entropy(#6 f32[2,3], input1 i64[2], none) {reduction=1, ignore_index=-100, "
    "label_smoothing=0} -> f32[]",
};

Test(trace, cnn_forward_and_loss_under_no_grad) {
    em_scope_begin();
    em_module *l[] = {MAKE("Conv2d", "in_channels", "1", "out_channels", "2", "kernel_size", "3",
                           "padding", "1"),
                      MAKE("BatchNorm2d", "num_features", "2"), MAKE("ReLU"),
                      MAKE("MaxPool2d", "kernel_size", "2"), MAKE("Flatten"),
                      MAKE("Linear", "in_features", "8", "out_features", "3")};
    fwd f = {.model = sequential(l, 6), .x = em_ones(4, (int64_t[]){2, 1, 4, 4}, EM_F32, em_cpu()),
             .target = em_zeros(1, (int64_t[]){2}, EM_I64, em_cpu())};
    em_grad_mode_push(EM_GRAD_DISABLED);
    em_trace *tr = trace_of(forward_loss, &f, f.model);
    em_grad_mode_pop();
    expect_nodes(tr, true, false, cnn_nodes, N_OF(cnn_nodes));
    /* The buffer's in-place update wrote into the buffer: later reads of it still name it. */
    cr_assert_eq(em_trace_input_count(tr), 2);
    em_trace_free(tr);
    em_module_free(f.model);
    em_scope_end();
}

/* ---- views, copies, in-place ops: each once -------------------------------------------------- */

typedef struct vt {
    em_tensor *x; /* (2, 3) f32 */
} vt;

static void views_copies_inplace(void *user) {
    vt *v = user;
    em_tensor *x = v->x;
    em_tensor *a = em_view(x, 2, (int64_t[]){3, 2});
    em_tensor *b = em_reshape(a, 1, (int64_t[]){6});
    em_tensor *c = em_permute(x, 2, (int[]){1, 0});
    em_tensor *d = em_transpose(c, 0, 1);
    em_tensor *e = em_expand(em_unsqueeze(x, 0), 3, (int64_t[]){4, 2, 3});
    em_tensor *g = em_narrow(x, 1, 1, 2);
    em_tensor *h = em_slice(x, 1, 0, 3, 2);
    em_tensor *i = em_select(x, 0, 1);
    em_tensor *j = em_squeeze(em_unsqueeze(i, 1), 1);
    em_tensor *k = em_flatten(e, 0, 1);
    em_tensor *l = em_squeeze_all(g);
    em_tensor *m = em_to_dtype(x, EM_F64);
    em_tensor *n = em_clone(x);
    em_tensor *o = em_contiguous(c);
    cr_assert_eq(em_copy_(n, d), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_add_(n, x), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_relu_(n), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_fill_(m, 2.0), EM_OK, "%s", em_last_error());
    em_tensor *p = em_to_device(m, em_cpu());
    cr_assert(a && b && c && d && e && g && h && i && j && k && l && m && n && o && p, "%s",
              em_last_error());
}

static const char *const view_nodes[] = {
    "view(input0 f32[2,3]) {shape=[3,2]} -> f32[3,2]",
    "reshape(#0 f32[3,2]) {shape=[6]} -> f32[6]",
    "permute(input0 f32[2,3]) {dims=[1,0]} -> f32[3,2]",
    "transpose(#2 f32[3,2]) {dim0=0, dim1=1} -> f32[2,3]",
    "unsqueeze(input0 f32[2,3]) {dim=0} -> f32[1,2,3]",
    "expand(#4 f32[1,2,3]) {shape=[4,2,3]} -> f32[4,2,3]",
    "narrow(input0 f32[2,3]) {dim=1, start=1, length=2} -> f32[2,2]",
    "slice(input0 f32[2,3]) {dim=1, start=0, end=3, step=2} -> f32[2,2]",
    "select(input0 f32[2,3]) {dim=0, index=1} -> f32[3]",
    "unsqueeze(#8 f32[3]) {dim=1} -> f32[3,1]",
    "squeeze(#9 f32[3,1]) {dim=1} -> f32[3]",
    "flatten(#5 f32[4,2,3]) {start_dim=0, end_dim=1} -> f32[8,3]",
    "squeeze_all(#6 f32[2,2]) -> f32[2,2]",
    "to_dtype(input0 f32[2,3]) {dtype=float64} -> f64[2,3]",
    "clone(input0 f32[2,3]) -> f32[2,3]",
    "contiguous(#2 f32[3,2]) -> f32[3,2]",
    "copy_(#14 f32[2,3], #3 f32[2,3]) -> f32[2,3] inplace",
    "add_(#16 f32[2,3], input0 f32[2,3]) -> f32[2,3] inplace",
    "relu_(#17 f32[2,3]) -> f32[2,3] inplace",
    /* a fill reads nothing: the value it writes into #13 does not depend on the old one */
    "fill() {value=2} -> f64[2,3] inplace",
    "to_device(#19 f64[2,3]) {device=cpu} -> f64[2,3]",
};

Test(trace, views_copies_and_inplace_ops_appear_once_each) {
    em_scope_begin();
    vt v = {.x = em_ones(2, (int64_t[]){2, 3}, EM_F32, em_cpu())};
    em_trace *tr = trace_of(views_copies_inplace, &v, NULL);
    expect_nodes(tr, false, false, view_nodes, N_OF(view_nodes));
    cr_assert_eq(em_trace_node_at(tr, 0)->kind, EM_OP_EVENT_VIEW);
    cr_assert_eq(em_trace_node_at(tr, 13)->kind, EM_OP_EVENT_COPY);
    cr_assert_eq(em_trace_node_at(tr, 17)->kind, EM_OP_EVENT_INPLACE);
    cr_assert_eq(em_trace_node_at(tr, 19)->kind, EM_OP_EVENT_OUT);
    cr_assert_eq(em_trace_node_at(tr, 13)->bytes, 6 * 8, "to_dtype allocated 6 doubles");
    cr_assert_eq(em_trace_node_at(tr, 17)->bytes, 0, "in place: no new memory");
    em_trace_free(tr);
    em_scope_end();
}

/* ---- composites: once, with their sub-ops nested ------------------------------------------------ */

/* A program's own composite written with the public ops: swish(x) = x * sigmoid(x). */
static em_status swish(const em_op *op, const em_tensor *const *in, int n_in, const em_attr *attrs,
                       em_tensor **out, int cap_out, int *n_out) {
    (void)op, (void)n_in, (void)attrs, (void)cap_out;
    em_scope_begin();
    em_tensor *y = em_mul(in[0], em_sigmoid(in[0]));
    out[0] = em_tensor_retain(y);
    em_scope_end();
    *n_out = y != NULL;
    return y ? EM_OK : em_last_status();
}

static void call_swish_twice(void *user) {
    const em_op *op = user;
    em_tensor *x = em_full(1, (int64_t[]){5}, 0.5, EM_F32, em_cpu());
    em_tensor *out[1];
    cr_assert_eq(em_op_call(op, (const em_tensor *const[]){x}, 1, NULL, out), EM_OK, "%s",
                 em_last_error());
    cr_assert_eq(em_op_call(op, (const em_tensor *const[]){out[0]}, 1, NULL, out), EM_OK, "%s",
                 em_last_error());
}

static const char *const swish_nodes[] = {
    "fill() {value=0.5} -> f32[5]",
    "test.swish(#0 f32[5]) -> f32[5]",
    "  sigmoid(#0 f32[5]) -> f32[5]",
    "  mul(#0 f32[5], #2 f32[5]) -> f32[5]",
    "test.swish(#1 f32[5]) -> f32[5]",
    "  sigmoid(#1 f32[5]) -> f32[5]",
    "  mul(#1 f32[5], #5 f32[5]) -> f32[5]",
};

Test(trace, a_composite_appears_once_with_its_sub_ops_nested) {
    em_op_schema s = {.struct_size = sizeof s, .name = "test.swish", .n_inputs = 1,
                      .n_outputs = 1, .dispatch_arg = 0, .composite = swish};
    const em_op *op = NULL;
    cr_assert_eq(em_op_declare(em_registry_program(), &s, &op), EM_OK, "%s", em_last_error());
    em_scope_begin();
    em_trace *tr = trace_of(call_swish_twice, (void *)op, NULL);
    expect_nodes(tr, false, false, swish_nodes, N_OF(swish_nodes));
    const em_trace_node *n = em_trace_node_at(tr, 1);
    cr_assert_eq(n->kind, EM_OP_EVENT_COMPOSITE);
    cr_assert_eq(n->n_children, 2);
    cr_assert_eq(em_trace_node_at(tr, 2)->parent, 1);
    cr_assert_eq(em_trace_node_at(tr, 3)->parent, 1);
    /* The second call reads the first one's output: the composite, not its last sub-op. */
    cr_assert_eq(em_trace_node_at(tr, 4)->in[0].node, 1);
    em_trace_free(tr);
    em_scope_end();
}

/* matmul (a standard composite over bmm): the 2-D operands as batches of one, the product,
 * the (M, N) view. */
static void call_matmul(void *user) {
    (void)user;
    em_tensor *a = em_ones(2, (int64_t[]){2, 3}, EM_F32, em_cpu());
    em_tensor *b = em_ones(2, (int64_t[]){3, 4}, EM_F32, em_cpu());
    cr_assert(em_matmul(a, b), "%s", em_last_error());
}

static const char *const matmul_nodes[] = {
    "fill() {value=1} -> f32[2,3]",
    "fill() {value=1} -> f32[3,4]",
    "matmul(#0 f32[2,3], #1 f32[3,4]) -> f32[2,4]",
    "  reshape(#0 f32[2,3]) {shape=[2,3]} -> f32[2,3]",
    "  reshape(#1 f32[3,4]) {shape=[3,4]} -> f32[3,4]",
    "  expand(#3 f32[2,3]) {shape=[2,3]} -> f32[2,3]",
    "  expand(#4 f32[3,4]) {shape=[3,4]} -> f32[3,4]",
    "  reshape(#5 f32[2,3]) {shape=[1,2,3]} -> f32[1,2,3]",
    "  reshape(#6 f32[3,4]) {shape=[1,3,4]} -> f32[1,3,4]",
    "  bmm(#7 f32[1,2,3], #8 f32[1,3,4]) -> f32[1,2,4]",
    "  view(#9 f32[1,2,4]) {shape=[2,4]} -> f32[2,4]",
};

Test(trace, a_standard_composite_nests_its_views_and_kernel) {
    em_scope_begin();
    em_trace *tr = trace_of(call_matmul, NULL, NULL);
    expect_nodes(tr, false, false, matmul_nodes, N_OF(matmul_nodes));
    cr_assert_eq(em_trace_input_count(tr), 0, "everything was made inside the trace");
    em_trace_free(tr);
    em_scope_end();
}

/* ---- identity: an address reused by a new tensor is not the old value -------------------------- */

static void reuse(void *user) {
    em_tensor *x = user;
    em_scope_begin();
    em_tensor *y = em_relu(x);
    cr_assert(y);
    em_scope_end(); /* y is freed: its address may be reused */
    em_tensor *z = em_empty(1, (int64_t[]){7}, EM_F32, em_cpu()); /* not an op */
    cr_assert(em_neg(z), "%s", em_last_error());
}

Test(trace, a_freed_tensors_address_is_not_its_value) {
    em_scope_begin();
    em_tensor *x = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu());
    em_trace *tr = trace_of(reuse, x, NULL);
    const char *const want[] = {"relu(input0 f32[3]) -> f32[3]", "neg(input1 f32[7]) -> f32[7]"};
    expect_nodes(tr, false, false, want, 2);
    em_trace_free(tr);
    em_scope_end();
}

/* ---- the tracer's own errors ------------------------------------------------------------------ */

Test(trace, begin_and_end_are_checked) {
    cr_assert_null(em_trace_end());
    em_assert_error(EM_ERR_STATE, "trace_end: this thread is not recording a trace");
    cr_assert_eq(em_trace_begin(NULL), EM_OK);
    cr_assert_eq(em_trace_begin(NULL), EM_ERR_STATE);
    em_assert_error(EM_ERR_STATE, "trace_begin: this thread is recording a trace already");
    em_trace *tr = em_trace_end();
    cr_assert(tr, "%s", em_last_error());
    cr_assert_eq(em_trace_node_count(tr), 0);
    cr_assert_null(em_trace_node_at(tr, 0));
    em_trace_free(tr);
    em_trace_free(NULL);
    em_trace_options bad = {.struct_size = 1};
    cr_assert_eq(em_trace_begin(&bad), EM_ERR_INVALID);
}

/* A failing op is recorded (no outputs) and its error reaches the caller unchanged. */
static void failing(void *user) {
    (void)user;
    em_tensor *a = em_ones(1, (int64_t[]){2}, EM_F32, em_cpu());
    em_tensor *b = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu());
    cr_assert_null(em_add(a, b));
    em_assert_error(EM_ERR_SHAPE, "add: ");
}

Test(trace, a_failed_op_is_a_node_without_outputs) {
    em_scope_begin();
    em_trace *tr = trace_of(failing, NULL, NULL);
    const char *const want[] = {"fill() {value=1} -> f32[2]", "fill() {value=1} -> f32[3]",
                                "add(#0 f32[2], #1 f32[3]) ->"};
    expect_nodes(tr, false, false, want, 3);
    em_trace_free(tr);
    em_scope_end();
}

/* ---- JSON and dot ------------------------------------------------------------------------------- */

static char *write_with(em_status (*fn)(const em_trace *, FILE *), const em_trace *tr) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert(f);
    cr_assert_eq(fn(tr, f), EM_OK, "%s", em_last_error());
    fclose(f);
    return text;
}

Test(trace, json_and_dot_describe_the_graph) {
    em_scope_begin();
    fwd f = {.model = mlp(), .x = em_ones(2, (int64_t[]){2, 4}, EM_F32, em_cpu()),
             .target = em_zeros(1, (int64_t[]){2}, EM_I64, em_cpu())};
    em_trace *tr = trace_of(forward_loss, &f, f.model);
    char *js = write_with(em_trace_write_json, tr);
    json_error_t err;
    json_t *root = json_loads(js, 0, &err);
    cr_assert(root, "not JSON (%s):\n%s", err.text, js);
    json_t *nodes = json_object_get(root, "nodes");
    cr_assert_eq(json_array_size(nodes), em_trace_node_count(tr));
    json_t *n0 = json_array_get(nodes, 0);
    cr_assert_str_eq(json_string_value(json_object_get(n0, "op")), "linear");
    cr_assert_str_eq(json_string_value(json_object_get(n0, "kind")), "composite");
    json_t *w = json_array_get(json_object_get(n0, "inputs"), 1);
    cr_assert_str_eq(json_string_value(json_object_get(w, "from")), "parameter");
    cr_assert_str_eq(json_string_value(json_object_get(w, "name")), "0.weight");
    cr_assert_str_eq(json_string_value(json_object_get(w, "grad_op")), "permute");
    cr_assert_eq(json_array_size(json_object_get(n0, "children")), 5);
    json_t *relu = json_array_get(nodes, 6);
    json_t *from = json_array_get(json_object_get(relu, "inputs"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(from, "from")), "node");
    cr_assert_eq(json_integer_value(json_object_get(from, "node")), 0);
    json_t *ce = json_array_get(nodes, 13);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(ce, "attrs"), "ignore_index")),
                 -100);
    cr_assert_eq(json_array_size(json_object_get(root, "inputs")), 2);
    json_decref(root);
    free(js);

    char *dot = write_with(em_graph_dump_trace, tr);
    cr_assert(strncmp(dot, "digraph", 7) == 0, "%s", dot);
    cr_assert(strstr(dot, "\"0.weight\" -> n0;"), "%s", dot);
    cr_assert(strstr(dot, "n0 -> n6;"), "relu reads linear:\n%s", dot);
    cr_assert(strstr(dot, "= reshape transpose expand addmm view"), "%s", dot);
    cr_assert_null(strstr(dot, "n1 "), "sub-ops are in their composite's label:\n%s", dot);
    free(dot);
    cr_assert_eq(em_trace_write_json(NULL, stdout), EM_ERR_INVALID);
    em_trace_free(tr);
    em_module_free(f.model);
    em_scope_end();
}

/* ---- observers ------------------------------------------------------------------------------------ */

typedef struct log {
    char text[4096];
    size_t len;
    int begins, ends;
} log_t;

static void log_begin(void *user, const em_op_event *ev) {
    log_t *l = user;
    l->begins++;
    l->len += (size_t)snprintf(l->text + l->len, sizeof l->text - l->len, "%*s<%s", ev->depth,
                               "", ev->name);
}
static void log_end(void *user, const em_op_event *ev) {
    log_t *l = user;
    l->ends++;
    l->len += (size_t)snprintf(l->text + l->len, sizeof l->text - l->len, "%s>%s ", ev->name,
                               ev->status == EM_OK ? "" : "!");
}

Test(trace, observers_stack_and_see_nesting) {
    log_t a = {0}, b = {0};
    em_observer oa = {.struct_size = sizeof oa, .begin = log_begin, .end = log_end, .user = &a};
    em_observer ob = {.struct_size = sizeof ob, .begin = log_begin, .end = log_end, .user = &b};
    em_scope_begin();
    em_tensor *x = em_ones(2, (int64_t[]){2, 2}, EM_F32, em_cpu());
    em_tensor *y = em_ones(1, (int64_t[]){2}, EM_F32, em_cpu());
    cr_assert_eq(em_observer_push(&oa), EM_OK);
    cr_assert_eq(em_observer_push(&ob), EM_OK);
    cr_assert_eq(em_observer_count(), 2);
    cr_assert(em_add(x, y)); /* y is broadcast: an expand nested in add */
    cr_assert_eq(em_observer_pop(&oa), EM_OK, "pops the older one, not only the newest");
    cr_assert(em_neg(x));
    cr_assert_eq(em_observer_pop(&ob), EM_OK);
    cr_assert_eq(em_observer_pop(&ob), EM_ERR_NOTFOUND);
    cr_assert(em_neg(x));
    cr_assert_str_eq(a.text, "<add <expandexpand> add> ");
    cr_assert_str_eq(b.text, "<add <expandexpand> add> <negneg> ");
    em_scope_end();
    em_observer bad = {.struct_size = 4};
    cr_assert_eq(em_observer_push(&bad), EM_ERR_INVALID);
    cr_assert_eq(em_observer_push(NULL), EM_ERR_INVALID);
    em_observer many[17];
    for (int i = 0; i < 17; i++) {
        many[i] = (em_observer){.struct_size = sizeof many[i], .end = log_end, .user = &a};
        em_status st = em_observer_push(&many[i]);
        cr_assert_eq(st, i < 16 ? EM_OK : EM_ERR_RANGE, "push %d", i);
    }
    for (int i = 0; i < 16; i++) cr_assert_eq(em_observer_pop(&many[i]), EM_OK);
    cr_assert_eq(em_observer_count(), 0);
}

/* A callback's own calls are not observed, nor may it change the stack; a failing op's end
 * comes with its status and the message stays the op's. */
static em_status pushed_inside;
static void nested_begin(void *user, const em_op_event *ev) {
    log_t *l = user;
    log_begin(user, ev);
    if (l->begins == 1) {
        em_scope_begin();
        cr_assert(em_ones(1, (int64_t[]){1}, EM_F32, em_cpu())); /* a fill: not seen */
        em_scope_end();
        em_observer o = {.struct_size = sizeof o, .end = log_end, .user = user};
        pushed_inside = em_observer_push(&o);
        em_set_error(EM_ERR_IO, "the callback's own error");
    }
}

Test(trace, callbacks_run_unobserved_and_keep_the_ops_error) {
    log_t l = {0};
    em_observer o = {.struct_size = sizeof o, .begin = nested_begin, .end = log_end, .user = &l};
    em_scope_begin();
    em_tensor *a = em_ones(1, (int64_t[]){2}, EM_F32, em_cpu());
    em_tensor *b = em_ones(1, (int64_t[]){3}, EM_F32, em_cpu());
    cr_assert_eq(em_observer_push(&o), EM_OK);
    cr_assert_null(em_add(a, b));
    em_assert_error(EM_ERR_SHAPE, "add: ");
    cr_assert_eq(em_observer_pop(&o), EM_OK);
    cr_assert_eq(pushed_inside, EM_ERR_STATE);
    cr_assert_str_eq(l.text, "<addadd>! ");
    em_scope_end();
}

/* Observers belong to their thread. */
static void *other_thread(void *user) {
    log_t *l = user;
    em_observer o = {.struct_size = sizeof o, .begin = log_begin, .end = log_end, .user = l};
    em_scope_begin();
    em_tensor *x = em_ones(1, (int64_t[]){4}, EM_F32, em_cpu());
    if (em_observer_push(&o) != EM_OK) return NULL;
    em_tensor *y = em_exp(x);
    em_observer_pop(&o);
    em_scope_end();
    return y;
}

Test(trace, an_observer_sees_only_its_own_threads_ops) {
    log_t mine = {0}, theirs = {0};
    em_observer o = {.struct_size = sizeof o, .begin = log_begin, .end = log_end, .user = &mine};
    cr_assert_eq(em_observer_push(&o), EM_OK);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, other_thread, &theirs), 0);
    void *ok;
    pthread_join(th, &ok);
    cr_assert(ok, "the other thread's ops ran");
    em_scope_begin();
    cr_assert(em_sqrt(em_ones(1, (int64_t[]){4}, EM_F32, em_cpu())));
    em_scope_end();
    cr_assert_eq(em_observer_pop(&o), EM_OK);
    cr_assert_str_eq(theirs.text, "<expexp> ");
    cr_assert_str_eq(mine.text, "<fillfill> <sqrtsqrt> ", "the other thread's fill and exp "
                     "are not here: %s", mine.text);
}

/* ---- the profiler ------------------------------------------------------------------------------- */

Test(trace, the_profiler_counts_times_and_sizes_ops) {
    em_scope_begin();
    em_tensor *x = em_ones(2, (int64_t[]){16, 16}, EM_F32, em_cpu());
    em_profiler *p = em_profiler_start();
    cr_assert(p, "%s", em_last_error());
    for (int i = 0; i < 3; i++) cr_assert(em_exp(x));
    cr_assert(em_matmul(x, x));
    cr_assert(em_transpose(x, 0, 1));
    cr_assert_eq(em_profiler_stop(p), EM_OK);
    cr_assert_eq(em_profiler_stop(p), EM_ERR_STATE);
    cr_assert(em_exp(x)); /* stopped: not counted */
    const em_profile_row *exp = NULL, *mm = NULL, *bmm = NULL, *tr = NULL;
    for (size_t i = 0; i < em_profiler_row_count(p); i++) {
        const em_profile_row *r = em_profiler_row(p, i);
        cr_assert_str_eq(r->device_type, "cpu");
        if (!strcmp(r->op, "exp")) exp = r;
        if (!strcmp(r->op, "matmul")) mm = r;
        if (!strcmp(r->op, "bmm")) bmm = r;
        if (!strcmp(r->op, "transpose")) tr = r;
    }
    cr_assert(exp && mm && bmm && tr);
    cr_assert_eq(exp->calls, 3);
    cr_assert_eq(exp->bytes, 3 * 16 * 16 * 4);
    cr_assert_eq(mm->calls, 1);
    cr_assert_eq(bmm->calls, 1, "matmul's kernel is nested in it");
    cr_assert_geq(mm->total_ns, bmm->total_ns);
    cr_assert_leq(mm->self_ns, mm->total_ns - bmm->total_ns);
    cr_assert_eq(tr->bytes, 0, "a view allocates nothing");
    cr_assert_null(em_profiler_row(p, em_profiler_row_count(p)));
    cr_assert_eq(em_profiler_bytes_copied(p, "cpu", "cpu"), 0);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    em_profiler_report(p, f, 2);
    fclose(f);
    cr_assert(strstr(text, "device ") && strstr(text, "\ncpu "), "%s", text);
    cr_assert(strstr(text, "ops by self time (the slowest), all threads:"), "%s", text);
    cr_assert(strstr(text, "threads: 1 recorded while profiling"), "%s", text);
    free(text);
    em_profiler_free(p);
    em_profiler_free(NULL);
    em_scope_end();
}

/* ---- the profiler's trace (Chrome trace-event JSON) ------------------------------------------ */

/* The "X" events of a trace named `name` (NULL: all), and the first one in *first. */
static int count_events(json_t *evs, const char *name, json_t **first) {
    int n = 0;
    size_t i;
    json_t *e;
    if (first) *first = NULL;
    json_array_foreach(evs, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (!ph || strcmp(ph, "X") || !nm || (name && strcmp(nm, name))) continue;
        if (first && !*first) *first = e;
        n++;
    }
    return n;
}

static double num(json_t *e, const char *k) {
    json_t *v = json_object_get(e, k);
    cr_assert(json_is_number(v), "no number %s in %s", k, json_dumps(e, 0));
    return json_number_value(v);
}

/* b lies within a on the timeline (ns rounding of the microsecond figures allowed). */
static bool inside(json_t *a, json_t *b) {
    double a0 = num(a, "ts"), a1 = a0 + num(a, "dur"), b0 = num(b, "ts"), b1 = b0 + num(b, "dur");
    return b0 >= a0 - 1e-3 && b1 <= a1 + 1e-3;
}

Test(trace, the_profilers_trace_is_chrome_trace_json) {
    em_scope_begin();
    em_module *fc = MAKE("Linear", "in_features", "4", "out_features", "3");
    em_dict *params = em_module_named_parameters(fc, true);
    em_options *oo = em_options_new();
    cr_assert_eq(em_options_set_text(oo, "lr", "0.1", NULL), EM_OK);
    em_optimizer *opt = em_optimizer_new("SGD", params, oo);
    cr_assert(opt, "%s", em_last_error());
    em_tensor *x = em_ones(2, (int64_t[]){5, 4}, EM_F32, em_cpu());
    em_profiler_range_begin("ignored"); /* no tracing profiler yet: nothing */
    em_profiler_range_end();
    em_profiler *plain = em_profiler_start();
    cr_assert_eq(em_profiler_write_trace(plain, stderr), EM_ERR_STATE, "no options.trace");
    em_profiler_free(plain);
    em_profiler_options po = {.struct_size = sizeof po, .trace = true};
    em_profiler *p = em_profiler_begin(&po);
    cr_assert(p, "%s", em_last_error());
    em_profiler_range_begin("step");
    em_tensor *y = em_module_forward(fc, x);
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(em_backward(em_sum(y, 0, NULL, false)), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_optimizer_step(opt), EM_OK, "%s", em_last_error());
    em_profiler_range_end();
    cr_assert(em_exp(x) && em_exp(x));
    cr_assert_eq(em_profiler_end(p), EM_OK);
    cr_assert(em_exp(x)); /* ended: not in the trace */
    em_profiler_range_begin("after");
    em_profiler_range_end();

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(em_profiler_write_trace(p, f), EM_OK, "%s", em_last_error());
    fclose(f);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    cr_assert(root, "not JSON: %s (line %d)\n%s", jerr.text, jerr.line, text);
    json_t *evs = json_object_get(root, "traceEvents");
    cr_assert(json_is_array(evs));
    long tid = (long)syscall(SYS_gettid);
    size_t i;
    json_t *e;
    bool named_thread = false;
    json_array_foreach(evs, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        cr_assert(ph, "an event without ph");
        cr_assert_eq((long)json_integer_value(json_object_get(e, "pid")), (long)getpid());
        cr_assert_eq((long)json_integer_value(json_object_get(e, "tid")), tid,
                     "every event on this thread's id");
        if (!strcmp(ph, "M")) {
            named_thread |= !strcmp(json_string_value(json_object_get(e, "name")), "thread_name");
            continue;
        }
        cr_assert_str_eq(ph, "X");
        cr_assert_geq(num(e, "ts"), 0);
        cr_assert_geq(num(e, "dur"), 0);
        cr_assert(json_string_value(json_object_get(e, "cat")));
    }
    cr_assert(named_thread);
    json_t *exp0, *step, *ostep, *linear, *addmm, *sum;
    cr_assert_eq(count_events(evs, "exp", &exp0), 2, "the two exps while it ran, not the third");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(exp0, "args"), "device")),
                     "cpu:0");
    cr_assert_str_eq(json_string_value(json_object_get(exp0, "cat")), "op");
    cr_assert_eq(count_events(evs, "step", &step), 1);
    cr_assert_str_eq(json_string_value(json_object_get(step, "cat")), "range");
    cr_assert_eq(count_events(evs, "ignored", NULL) + count_events(evs, "after", NULL), 0);
    cr_assert_eq(count_events(evs, "optimizer_step", &ostep), 1);
    cr_assert_str_eq(json_string_value(json_object_get(ostep, "cat")), "optimizer");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(ostep, "args"),
                                                       "optimizer")), "SGD");
    cr_assert_eq(count_events(evs, "linear", &linear), 1);
    cr_assert_str_eq(json_string_value(json_object_get(linear, "cat")), "composite");
    cr_assert_geq(count_events(evs, "addmm", &addmm), 1);
    cr_assert_geq(count_events(evs, "sum", &sum), 1, "the loss (and the bias gradient)");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(addmm, "args"), "depth")), 1,
                 "linear's addmm is nested in it");
    cr_assert(inside(linear, addmm), "the sub-op inside its composite's span");
    cr_assert(inside(step, linear) && inside(step, sum) && inside(step, ostep));
    cr_assert(!inside(step, exp0), "the exps ran after the range");
    cr_assert_geq(num(exp0, "ts"), num(ostep, "ts") + num(ostep, "dur") - 1e-3, "in time order");
    json_decref(root);
    free(text);
    em_profiler_free(p);
    em_optimizer_free(opt);
    em_options_free(oo);
    em_dict_free(params);
    em_module_free(fc);
    em_scope_end();
}

/* ---- a session profiles every thread ---------------------------------------------------------- */

/* The trace of an ended profiler, parsed (json_decref it). */
static json_t *profiler_trace(const em_profiler *p) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_eq(em_profiler_write_trace(p, f), EM_OK, "%s", em_last_error());
    fclose(f);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    cr_assert(root, "not JSON: %s (line %d)", jerr.text, jerr.line);
    free(text);
    return root;
}

/* The name a trace's thread_name metadata gives tid (NULL: none; two for one tid fail). */
static const char *thread_name_of(json_t *evs, long tid) {
    const char *name = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (strcmp(json_string_value(json_object_get(e, "ph")), "M") || strcmp(nm, "thread_name") ||
            json_integer_value(json_object_get(e, "tid")) != tid)
            continue;
        cr_assert_null(name, "two names for thread %ld", tid);
        name = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
    }
    return name;
}

/* The "X" events named `name` on thread tid (tid 0: on any thread but `but`). */
static int events_on(json_t *evs, const char *name, long tid, long but) {
    int n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        long t = (long)json_integer_value(json_object_get(e, "tid"));
        if (!strcmp(json_string_value(json_object_get(e, "ph")), "X") &&
            !strcmp(json_string_value(json_object_get(e, "name")), name) &&
            (tid ? t == tid : t != but))
            n++;
    }
    return n;
}

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stage;     /* 1: the thread ran an op (registered); 2: the session began */
    long tid;
    em_profiler *p;
    em_status st;
} handshake;

static void stage_wait(handshake *h, int stage) {
    pthread_mutex_lock(&h->mu);
    while (h->stage < stage) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

static void stage_set(handshake *h, int stage) {
    pthread_mutex_lock(&h->mu);
    h->stage = stage;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Runs an op before the session (so it is a known thread when it begins), three exps in it,
 * and exits before it ends. */
static void *exp_thread(void *user) {
    handshake *h = user;
    pthread_setname_np(pthread_self(), "exp thread");
    h->tid = (long)syscall(SYS_gettid);
    em_scope_begin();
    em_tensor *x = em_ones(1, (int64_t[]){8}, EM_F32, em_cpu());
    stage_set(h, 1);
    stage_wait(h, 2);
    for (int i = 0; i < 3; i++) x = x ? em_exp(x) : NULL;
    em_scope_end();
    return x ? h : NULL;
}

/* Neither runs ops nor began the profiler: ends it. */
static void *end_elsewhere(void *user) {
    handshake *h = user;
    h->st = em_profiler_end(h->p);
    return NULL;
}

Test(trace, a_profiling_session_covers_every_thread_and_any_thread_ends_it) {
    handshake h = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    em_scope_begin();
    em_tensor *x = em_ones(1, (int64_t[]){8}, EM_F32, em_cpu());
    pthread_t th, ender;
    cr_assert_eq(pthread_create(&th, NULL, exp_thread, &h), 0);
    stage_wait(&h, 1);
    em_profiler_options po = {.struct_size = sizeof po, .trace = true};
    em_profiler *p = em_profiler_begin(&po);
    cr_assert(p, "%s", em_last_error());
    cr_assert_null(em_profiler_begin(&po), "one session at a time");
    em_assert_error(EM_ERR_STATE, "a profiler is running already");
    cr_assert_eq(em_observer_count(), 0, "a session is no observer of the thread");
    stage_set(&h, 2);
    cr_assert(em_neg(x) && em_neg(x));
    void *ok;
    pthread_join(th, &ok);
    cr_assert(ok, "the other thread's ops ran");
    h.p = p;
    cr_assert_eq(pthread_create(&ender, NULL, end_elsewhere, &h), 0);
    pthread_join(ender, NULL);
    cr_assert_eq(h.st, EM_OK, "ended from a third thread");
    cr_assert_eq(em_profiler_end(p), EM_ERR_STATE, "ended already");
    cr_assert(em_neg(x)); /* ended: not counted */

    uint64_t exps = 0, negs = 0;
    for (size_t i = 0; i < em_profiler_row_count(p); i++) {
        const em_profile_row *r = em_profiler_row(p, i);
        if (!strcmp(r->op, "exp")) exps += r->calls;
        if (!strcmp(r->op, "neg")) negs += r->calls;
    }
    cr_assert_eq(exps, 3, "the exited thread's calls are kept");
    cr_assert_eq(negs, 2);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    em_profiler_report(p, f, 5);
    fclose(f);
    cr_assert(strstr(text, "threads: 2 recorded while profiling; every figure below counts all "
                     "of them") && strstr(text, "  main ") && strstr(text, "  exp thread "),
              "%s", text);
    free(text);

    json_t *root = profiler_trace(p), *evs = json_object_get(root, "traceEvents");
    long me = (long)syscall(SYS_gettid);
    cr_assert_neq(me, h.tid);
    cr_assert_eq(events_on(evs, "exp", h.tid, 0), 3);
    cr_assert_eq(events_on(evs, "exp", 0, h.tid), 0, "each call on its own thread's track");
    cr_assert_eq(events_on(evs, "neg", me, 0), 2);
    cr_assert_eq(events_on(evs, "neg", 0, me), 0);
    cr_assert_str_eq(thread_name_of(evs, me), "main");
    cr_assert_str_eq(thread_name_of(evs, h.tid), "exp thread", "its pthread name");
    json_decref(root);
    em_profiler_free(p);
    em_scope_end();
}

/* A dataset whose read runs ops (as a decoder or a transform written with them would): items
 * {-i, -i} from em_neg, labels i % 2. */
static em_status ops_open(const em_options *o, em_dataset_info *info, void **state) {
    (void)o;
    *info = (em_dataset_info){.struct_size = sizeof *info, .length = 16, .input_ndim = 1,
                              .input_shape = {2}, .input_dtype = EM_F32,
                              .target_dtype = EM_I64, .num_classes = 2};
    *state = NULL;
    return EM_OK;
}

static em_status ops_read(void *state, const int64_t *idx, int64_t n, void *in, void *tg) {
    (void)state;
    em_scope_begin();
    em_tensor *t = em_empty(2, (int64_t[]){n, 2}, EM_F32, em_cpu());
    if (t) {
        float *d = em_tensor_data(t);
        for (int64_t j = 0; j < 2 * n; j++) d[j] = (float)idx[j / 2];
    }
    em_tensor *u = t ? em_neg(t) : NULL;
    if (u) memcpy(in, em_tensor_data(u), (size_t)n * 2 * sizeof(float));
    for (int64_t j = 0; j < n; j++) ((int64_t *)tg)[j] = idx[j] % 2;
    em_scope_end();
    return u ? EM_OK : EM_ERR_NOMEM;
}

Test(trace, loader_workers_have_their_own_tracks) {
    em_dataset_class_def d = {.struct_size = sizeof d, .name = "ops_read", .description = "ops",
                              .open = ops_open, .read = ops_read};
    cr_assert_eq(em_dataset_class_register(em_registry_program(), &d), EM_OK, "%s",
                 em_last_error());
    em_dataset *ds = em_dataset_open("ops_read", NULL);
    cr_assert(ds, "%s", em_last_error());
    em_module *fc = MAKE("Linear", "in_features", "2", "out_features", "2");
    em_dict *params = em_module_named_parameters(fc, true);
    em_options *oo = em_options_new();
    cr_assert_eq(em_options_set_text(oo, "lr", "0.1", NULL), EM_OK);
    em_optimizer *opt = em_optimizer_new("SGD", params, oo);
    cr_assert(opt, "%s", em_last_error());
    /* Begun before the loader: its workers fill batches from their start. */
    em_profiler_options po = {.struct_size = sizeof po, .trace = true};
    em_profiler *p = em_profiler_begin(&po);
    cr_assert(p, "%s", em_last_error());
    em_loader_options lo = {.struct_size = sizeof lo, .batch_size = 4, .num_workers = 2};
    em_loader *l = em_loader_new(ds, &lo);
    cr_assert(l, "%s", em_last_error());
    int steps = 0;
    for (;;) {
        em_tensor *x, *y;
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
        if (!x) break;
        cr_assert_float_eq(((const float *)em_tensor_data(x))[0],
                           -(float)(4 * steps), 0, "batch %d made by the ops", steps);
        em_scope_begin();
        em_tensor *loss = em_cross_entropy(em_module_forward(fc, x), y, NULL,
                                           EM_REDUCTION_MEAN, -100, 0.0);
        cr_assert(loss, "%s", em_last_error());
        cr_assert_eq(em_backward(loss), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_optimizer_step(opt), EM_OK, "%s", em_last_error());
        em_optimizer_zero_grad(opt);
        em_scope_end();
        steps++;
    }
    cr_assert_eq(steps, 4);
    em_loader_free(l); /* the workers exit before the end: their buffers stay */
    cr_assert_eq(em_profiler_end(p), EM_OK, "%s", em_last_error());

    json_t *root = profiler_trace(p), *evs = json_object_get(root, "traceEvents");
    long me = (long)syscall(SYS_gettid);
    cr_assert_str_eq(thread_name_of(evs, me), "main");
    cr_assert_eq(events_on(evs, "loader_wait", me, 0), 4, "a wait per batch, on this thread");
    cr_assert_eq(events_on(evs, "optimizer_step", me, 0), 4);
    cr_assert_geq(events_on(evs, "linear", me, 0), 4);
    cr_assert_eq(events_on(evs, "neg", me, 0), 0, "the reads ran on the workers");
    cr_assert_geq(events_on(evs, "neg", 0, me), 4, "every batch's read (and some ahead)");
    /* Each worker's op events lie on its own named track. */
    long tids[8];
    int n_tids = 0;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        long t = (long)json_integer_value(json_object_get(e, "tid"));
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") ||
            strcmp(json_string_value(json_object_get(e, "cat")), "op"))
            continue;
        bool seen = false;
        for (int k = 0; k < n_tids; k++) seen |= tids[k] == t;
        if (!seen && n_tids < 8) tids[n_tids++] = t;
    }
    cr_assert_geq(n_tids, 2, "op events on this thread and a worker's");
    for (int k = 0; k < n_tids; k++) {
        const char *nm = thread_name_of(evs, tids[k]);
        cr_assert(nm, "thread %ld has no name", tids[k]);
        if (tids[k] == me) continue;
        cr_assert(!strcmp(nm, "loader worker 0") || !strcmp(nm, "loader worker 1"), "%s", nm);
        cr_assert_geq(events_on(evs, "neg", tids[k], 0), 1);
        cr_assert_geq(events_on(evs, "loader_fill", tids[k], 0), 1, "its batches' spans");
        cr_assert_eq(events_on(evs, "neg", tids[k], 0), events_on(evs, "loader_fill", tids[k], 0),
                     "one read per batch filled");
    }
    json_decref(root);
    em_profiler_free(p);
    em_optimizer_free(opt);
    em_options_free(oo);
    em_dict_free(params);
    em_module_free(fc);
    em_dataset_free(ds);
}

/* The [ts, ts + dur] of the one "X" event named `name` on thread tid (range spans). */
static void span_of(json_t *evs, const char *name, long tid, double *t0, double *t1) {
    int n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "X") ||
            strcmp(json_string_value(json_object_get(e, "name")), name) ||
            json_integer_value(json_object_get(e, "tid")) != tid)
            continue;
        *t0 = json_number_value(json_object_get(e, "ts"));
        *t1 = *t0 + json_number_value(json_object_get(e, "dur"));
        n++;
    }
    cr_assert_eq(n, 1, "one '%s' span on thread %ld", name, tid);
}

/* One epoch of l (batches of 4 of the 16 items), then free it and end the range begun before
 * it was made (its worker starts filling in em_loader_new). */
static void drain_loader(em_loader *l) {
    cr_assert(l, "%s", em_last_error());
    int n = 0;
    for (em_tensor *x, *y; em_loader_next(l, &x, &y) == EM_OK && x;) n++;
    cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
    cr_assert_eq(n, 4);
    em_loader_free(l); /* joins its worker inside the range */
    em_profiler_range_end();
}

/* Three loaders of one process, one worker each (ember-train's train, validation and test
 * loaders): the named ones' tracks carry their names (em_loader_options and _v2), the unnamed
 * one's the default; each track holds the fills of its own loader, which ran inside the
 * range around that loader's life. */
Test(trace, loaders_name_their_workers_tracks) {
    em_dataset_class_def d = {.struct_size = sizeof d, .name = "ops_read", .description = "ops",
                              .open = ops_open, .read = ops_read};
    cr_assert_eq(em_dataset_class_register(em_registry_program(), &d), EM_OK, "%s",
                 em_last_error());
    em_dataset *ds = em_dataset_open("ops_read", NULL);
    cr_assert(ds, "%s", em_last_error());
    em_profiler_options po = {.struct_size = sizeof po, .trace = true};
    em_profiler *p = em_profiler_begin(&po);
    cr_assert(p, "%s", em_last_error());
    em_loader_options lo = {.struct_size = sizeof lo, .batch_size = 4, .num_workers = 1,
                            .name = "train"};
    em_profiler_range_begin("with train");
    drain_loader(em_loader_new(ds, &lo));
    em_loader_options_v2 lo2 = {.struct_size = sizeof lo2, .batch_size = 4, .num_workers = 1,
                                .name = "val"};
    em_profiler_range_begin("with val");
    drain_loader(em_loader_new_v2(ds, &lo2));
    lo.name = NULL;
    em_profiler_range_begin("with unnamed");
    drain_loader(em_loader_new(ds, &lo));
    cr_assert_eq(em_profiler_end(p), EM_OK, "%s", em_last_error());

    json_t *root = profiler_trace(p), *evs = json_object_get(root, "traceEvents");
    long me = (long)syscall(SYS_gettid);
    const char *names[3] = {"train worker 0", "val worker 0", "loader worker 0"};
    const char *ranges[3] = {"with train", "with val", "with unnamed"};
    long tids[3] = {0, 0, 0};
    size_t i;
    json_t *e;
    json_array_foreach(evs, i, e) {
        if (strcmp(json_string_value(json_object_get(e, "ph")), "M") ||
            strcmp(json_string_value(json_object_get(e, "name")), "thread_name"))
            continue;
        long t = (long)json_integer_value(json_object_get(e, "tid"));
        const char *nm = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
        if (t == me) continue;
        int k = 0;
        while (k < 3 && strcmp(nm, names[k])) k++;
        cr_assert_lt(k, 3, "an unexpected track '%s'", nm);
        cr_assert_eq(tids[k], 0, "two tracks named '%s'", nm);
        tids[k] = t;
    }
    for (int k = 0; k < 3; k++) {
        cr_assert_neq(tids[k], 0, "no track named '%s'", names[k]);
        double r0, r1;
        span_of(evs, ranges[k], me, &r0, &r1);
        int fills = 0;
        json_array_foreach(evs, i, e) {
            if (strcmp(json_string_value(json_object_get(e, "ph")), "X") ||
                strcmp(json_string_value(json_object_get(e, "name")), "loader_fill") ||
                json_integer_value(json_object_get(e, "tid")) != tids[k])
                continue;
            double ts = json_number_value(json_object_get(e, "ts"));
            double te = ts + json_number_value(json_object_get(e, "dur"));
            /* ts and dur are rounded to 1 ns each */
            cr_assert(ts >= r0 - 0.002 && te <= r1 + 0.002, "a fill of '%s' at [%.3f, %.3f] "
                      "outside its loader's life [%.3f, %.3f]", names[k], ts, te, r0, r1);
            fills++;
        }
        cr_assert_geq(fills, 4, "'%s' filled its loader's 4 batches", names[k]);
        cr_assert_eq(events_on(evs, "loader_fill", me, 0), 0, "the workers fill");
    }
    json_decref(root);
    em_profiler_free(p);
    em_dataset_free(ds);
}

/* A loader's name must fit its workers' names in a trace and be printable. */
Test(trace, loader_name_checked) {
    em_dataset_class_def d = {.struct_size = sizeof d, .name = "ops_read", .description = "ops",
                              .open = ops_open, .read = ops_read};
    cr_assert_eq(em_dataset_class_register(em_registry_program(), &d), EM_OK, "%s",
                 em_last_error());
    em_dataset *ds = em_dataset_open("ops_read", NULL);
    cr_assert(ds, "%s", em_last_error());
    char longest[EM_LOADER_NAME_MAX + 2];
    memset(longest, 'n', EM_LOADER_NAME_MAX);
    longest[EM_LOADER_NAME_MAX] = 0;
    em_loader_options lo = {.struct_size = sizeof lo, .batch_size = 4, .num_workers = 1,
                            .name = longest};
    em_loader *l = em_loader_new(ds, &lo);
    cr_assert(l, "%d bytes are allowed: %s", EM_LOADER_NAME_MAX, em_last_error());
    em_loader_free(l);
    strcat(longest, "n");
    cr_assert_null(em_loader_new(ds, &lo));
    cr_assert_eq(em_last_status(), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "loader: name 'nnnn") &&
              strstr(em_last_error(), "has 21 bytes; at most 20"), "%s", em_last_error());
    em_loader_options_v2 lo2 = {.struct_size = sizeof lo2, .name = "tab\there"};
    cr_assert_null(em_loader_new_v2(ds, &lo2));
    cr_assert_eq(em_last_status(), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "loader: name has byte 0x09 at 3; it takes printable"),
              "%s", em_last_error());
    em_dataset_free(ds);
}

/* Threads run ops (in bursts) while sessions begin and end: each session has what the
 * threads did in it, and nothing is torn (ASan, UBSan). */
static atomic_int ops_stop, ops_started;

static void *ops_forever(void *user) {
    (void)user;
    em_tensor *x = em_ones(1, (int64_t[]){4}, EM_F32, em_cpu());
    long n = 0;
    while (!atomic_load(&ops_stop) && x) {
        em_tensor *y = em_exp(x);
        em_tensor_release(y);
        if (n == 0) atomic_fetch_add(&ops_started, 1);
        if (++n % 16 == 0) nanosleep(&(struct timespec){0, 50000}, NULL); /* leave a core */
    }
    em_tensor_release(x);
    return (void *)n;
}

Test(trace, sessions_begin_and_end_while_threads_run_ops) {
    enum { THREADS = 3, SESSIONS = 12 };
    pthread_t th[THREADS];
    atomic_store(&ops_stop, 0);
    atomic_store(&ops_started, 0);
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, ops_forever, NULL), 0);
    /* Every thread has run an op before the first session: on a busy machine (the ASan
     * stage of a fresh-clone CI run) a thread could otherwise get its first slice only after
     * the sessions, and the per-thread count below read 0. */
    for (int w = 0; atomic_load(&ops_started) < THREADS && w < 10000; w++)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    cr_assert_eq(atomic_load(&ops_started), THREADS, "every thread ran an op within 10 s");
    int with_others = 0;
    for (int s = 0; s < SESSIONS; s++) {
        em_profiler_options po = {.struct_size = sizeof po, .trace = s % 2 == 0};
        em_profiler *p = em_profiler_begin(&po);
        cr_assert(p, "%s", em_last_error());
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        cr_assert_eq(em_profiler_end(p), EM_OK, "%s", em_last_error());
        uint64_t exps = 0;
        for (size_t i = 0; i < em_profiler_row_count(p); i++)
            if (!strcmp(em_profiler_row(p, i)->op, "exp")) exps += em_profiler_row(p, i)->calls;
        with_others += exps > 0;
        if (po.trace) {
            json_t *root = profiler_trace(p);
            cr_assert_eq((uint64_t)count_events(json_object_get(root, "traceEvents"), "exp",
                                                NULL), exps, "a row's calls are its events");
            json_decref(root);
        }
        em_profiler_free(p);
    }
    atomic_store(&ops_stop, 1);
    for (int i = 0; i < THREADS; i++) {
        void *n;
        pthread_join(th[i], &n);
        cr_assert_gt((long)n, 0);
    }
    cr_assert_gt(with_others, 0, "some session saw the threads' exps");
}
