/*
 * ember/trace.h — watching every op as it runs: observers, the forward-graph tracer and the
 * op profiler.
 *
 * Every op passes one per-thread observer point: ops run by name or by their typed em_X()
 * function, composites (whose sub-ops are reported nested inside them), in-place forms
 * (add_), calls into given outputs (em_op_call_out, the fills), list ops (fused optimizer
 * steps), views (view, reshape, permute, transpose, expand, narrow, slice, select, squeeze,
 * unsqueeze, flatten) and copies (copy_, clone, contiguous, to_dtype, to_device). An observer
 * is a pair of callbacks, called as each op begins and ends, with its name, inputs,
 * attributes and outputs. Observers belong to the thread that pushed them: they see the ops
 * that thread runs, nothing else (push one on each thread to watch several). Several can be
 * pushed; each sees every op.
 *
 * The tracer is one such observer. It records what a region of code ran as a graph: nodes
 * with their op, attributes, input and output shapes and dtypes, the edges between them, which
 * inputs are the parameters and buffers of a module by their state-dict names ("0.weight",
 * "1.running_mean") and which are inputs of the graph; under grad mode also the backward op
 * recorded for each output and the one that produces each parameter's gradient.
 *
 *     em_trace_options o = {.struct_size = sizeof o, .module = model};
 *     em_grad_mode_push(EM_GRAD_DISABLED);
 *     em_trace_begin(&o);
 *     em_tensor *loss = em_cross_entropy(em_module_forward(model, x), target, NULL);
 *     em_trace *tr = em_trace_end();                   // NULL + message on failure
 *     em_grad_mode_pop();
 *     for (size_t i = 0; i < em_trace_node_count(tr); i++) {
 *         const em_trace_node *n = em_trace_node_at(tr, i);
 *         if (n->parent < 0) printf("%s\n", n->op);    // top level: linear, relu, ...
 *     }
 *     em_graph_dump_trace(tr, stdout);                  // Graphviz dot
 *     em_trace_free(tr);
 *
 * The profiler (em_profiler_start) is built on the same point but is process-wide: while it
 * runs it counts and times every op of every thread by name and device, with its own time
 * apart from the time of the ops nested in it, the bytes its outputs allocated, the bytes
 * copied between devices and the ops that fell back to the CPU, and can keep a per-thread
 * timeline (em_profiler_write_trace). ember-train --profile prints its report.
 *
 * Cost: with no observer on the thread and no profiler running an op pays one thread-local
 * load and a branch. An
 * observer's callbacks run with observation suspended (ops they run are not reported) and
 * must not keep the tensors they are shown past the callback without retaining them.
 */
#ifndef EMBER_TRACE_H
#define EMBER_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ember/dispatch.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/module.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- observers ------------------------------------------------------------------------------ */

/* What kind of call an event reports. */
typedef enum em_op_event_kind {
    EM_OP_EVENT_OP = 0,        /* an op with a kernel, run by em_op_call or its em_X():
                                  the dispatcher allocated the outputs */
    EM_OP_EVENT_COMPOSITE = 1, /* an op written with other ops: their events are nested in it */
    EM_OP_EVENT_OUT = 2,       /* em_op_call_out: an op into outputs the caller gave (the
                                  fills: zeros, uniform_, arange; out= calls) */
    EM_OP_EVENT_INPLACE = 3,   /* the in-place form of an op (add_, relu_): in[0] is out[0] */
    EM_OP_EVENT_LIST = 4,      /* em_op_call_lists (fused optimizer steps); in and out hold the
                                  lists one after the other */
    EM_OP_EVENT_VIEW = 5,      /* a view: the output shares the input's storage */
    EM_OP_EVENT_COPY = 6,      /* copy_ (in[0] is the destination, also out[0]), clone,
                                  contiguous, to_dtype, to_device */
} em_op_event_kind;

/* One op call as an observer sees it. Everything is borrowed for the duration of the callback. */
typedef struct em_op_event {
    size_t struct_size;
    em_op_event_kind kind;
    const char *name;        /* "linear", "add_", "view", "to_dtype" */
    const em_op *op;         /* the declared op, or NULL (views, copies) */
    uint64_t id;             /* unique among this thread's events (1, 2, ...) */
    uint64_t parent;         /* id of the call this one runs inside (a composite's sub-op, an
                                op's broadcast views and dtype casts), 0 at the top */
    int depth;               /* 0 at the top; parent's depth + 1 inside it */
    int n_in;
    const em_tensor *const *in;    /* (n_in) inputs as the caller passed them; an optional
                                      input left out is NULL */
    int n_attrs;
    const char *const *attr_names; /* (n_attrs) the schema's names ("dims", "keepdim") */
    const em_attr *attrs;          /* (n_attrs) their values (EM_ATTR_NONE when absent) */
    int n_out;
    /* (n_out) the outputs: at the end of a successful call; at its beginning only where the
     * caller gave them (OUT, INPLACE, LIST, copy_), else NULL. */
    em_tensor *const *out;
    em_status status;        /* at the end: EM_OK, or the call's error (the message is set) */
    bool fell_back;          /* at the end: the op had no kernel on its device and ran on the
                                CPU with its data copied there and back */
    void *ext;
} em_op_event;

typedef void (*em_op_event_fn)(void *user, const em_op_event *ev);

typedef struct em_observer {
    size_t struct_size;   /* sizeof(em_observer) */
    em_op_event_fn begin; /* (optional) as a call starts, before its checks */
    em_op_event_fn end;   /* (optional) as it returns, successfully or not */
    void *user;
    void *ext;            /* reserved; NULL */
} em_observer;

/* Push an observer (copied) on the calling thread: from now on it sees every op this thread
 * runs. Observers stack: each pushed one sees every event, the oldest first at the begin of a
 * call and last at its end. At most 16 per thread (EM_ERR_RANGE); EM_ERR_STATE from inside an
 * observer's callback. */
EM_API em_status em_observer_push(const em_observer *obs);
/* Remove the most recently pushed observer of this thread with obs's callbacks and user
 * pointer (it need not be the newest one). EM_ERR_NOTFOUND when this thread has none such;
 * EM_ERR_STATE from inside a callback. */
EM_API em_status em_observer_pop(const em_observer *obs);
/* Number of observers pushed on this thread. */
EM_API int em_observer_count(void);

/* ---- the tracer ----------------------------------------------------------------------------- */

typedef struct em_trace em_trace;

typedef struct em_trace_options {
    size_t struct_size;       /* sizeof(em_trace_options) */
    /* (optional) The model: its parameters and buffers are named by their state-dict keys
     * where ops read them. Must outlive the trace's recording (em_trace_end). */
    const em_module *module;
    void *ext;                /* reserved; NULL */
} em_trace_options;

/* Where a node's input came from. */
typedef enum em_trace_source {
    EM_TRACE_FROM_NODE = 0,      /* output `output` of node `node` of the trace */
    EM_TRACE_FROM_INPUT = 1,     /* an input of the graph: a tensor made before the trace began
                                    (or outside the ops it sees), numbered in order of first use */
    EM_TRACE_FROM_PARAMETER = 2, /* a parameter of the traced module */
    EM_TRACE_FROM_BUFFER = 3,    /* a buffer of the traced module (running_mean) */
    EM_TRACE_FROM_NONE = 4,      /* an optional input left out (NULL) */
    EM_TRACE_FROM_LOCAL = 5,     /* a tensor a composite made for its sub-ops without an op (an
                                    allocation: cross_entropy's empty weight); only inside one */
} em_trace_source;

/* A tensor as a node saw it. */
typedef struct em_trace_value {
    em_trace_source source;
    int64_t node;         /* FROM_NODE: the producing node's index, else -1 */
    int output;           /* FROM_NODE: which of its outputs */
    int64_t input;        /* FROM_INPUT: the graph input's number, else -1 */
    const char *name;     /* PARAMETER, BUFFER: the state-dict key ("0.weight"); INPUT:
                             "input0", "input1", ...; otherwise NULL */
    em_dtype dtype;
    em_device device;
    int ndim;
    int64_t shape[EM_MAX_DIMS]; /* (ndim) */
    /* PARAMETER read under grad mode: the backward op that computes its gradient from this use
     * ("addmm", "conv2d", "permute" for a transposed weight); NULL otherwise. */
    const char *grad_op;
} em_trace_value;

typedef struct em_trace_node {
    const char *op;            /* "linear", "relu", "view", "add_", "to_dtype", "fill" */
    em_op_event_kind kind;
    int64_t parent;            /* the composite this node ran inside, or -1 (top level) */
    int depth;                 /* 0 at the top level */
    int n_children;            /* a composite's direct sub-ops, in order */
    const int64_t *children;   /* (n_children) node indices */
    int n_in;
    const em_trace_value *in;  /* (n_in) */
    int n_out;
    const em_trace_value *out; /* (n_out): source FROM_NODE, node = this one */
    int n_attrs;
    const char *const *attr_names; /* (n_attrs) */
    const em_attr *attrs;      /* (n_attrs) as the op saw them; strings and lists copied */
    bool inplace;              /* it wrote into a tensor it was given (add_, copy_, fill_) */
    /* Under grad mode: the backward op recorded for output 0 ("addmm", "view"), or NULL (no
     * history: gradients off, or no input requires grad). */
    const char *grad_fn;
    size_t bytes;              /* bytes of the storage its outputs hold that none of its inputs
                                  shares (0 for a view or an in-place op) */
} em_trace_node;

/* Start recording on the calling thread (opt may be NULL: no module). One trace per thread at
 * a time: EM_ERR_STATE when one is recording; end it before em_shutdown. Views and dtype casts
 * an op makes of its own inputs (broadcasting, promotion) are part of that op, not nodes; a
 * composite's sub-ops are nodes with the composite as parent. Values are tracked per tensor:
 * after an in-place op, reads of that tensor come from it, but reads of another view of the
 * same storage (the base of a slice written in place) still name the view's earlier producer.
 * The trace keeps no reference to the tensors it sees. */
EM_API em_status em_trace_begin(const em_trace_options *opt);
/* Stop recording and return the graph (a new object: em_trace_free). NULL with EM_ERR_STATE
 * when this thread is not recording, EM_ERR_NOMEM when recording ran out of memory. */
EM_API em_trace *em_trace_end(void);
/* NULL is a no-op. */
EM_API void em_trace_free(em_trace *tr);
/* Nodes in the order their calls began (a composite before its sub-ops), top level and nested
 * together: a node's parent tells which. Borrowed from tr. */
EM_API size_t em_trace_node_count(const em_trace *tr);
EM_API const em_trace_node *em_trace_node_at(const em_trace *tr, size_t i); /* NULL past end */
/* The graph inputs, by number (their first use as a node's input: em_trace_node_at). */
EM_API size_t em_trace_input_count(const em_trace *tr);
/* Write the trace as JSON: {"nodes": [{"id", "op", "kind", "parent", "inputs": [{"from":
 * "node"|"input"|"parameter"|"buffer"|"none"|"local", "node", "output", "name", "dtype", "shape",
 * "device", "grad_op"}], "outputs": [...], "attrs": {name: value}, "inplace", "grad_fn",
 * "bytes", "children": [...]}], "inputs": [names]}. EM_ERR_IO when writing fails. */
EM_API em_status em_trace_write_json(const em_trace *tr, FILE *f);
/* em_graph_dump for a forward trace: Graphviz dot, one box per top-level node (a composite's
 * label lists its sub-ops; views dashed), with its op, attributes, output shapes, dtypes,
 * bytes and grad_fn; parameters and buffers as ellipses named by their state-dict keys, graph inputs as
 * ellipses. EM_ERR_IO when writing fails. */
EM_API em_status em_graph_dump_trace(const em_trace *tr, FILE *f);

/* ---- the profiler --------------------------------------------------------------------------- */

typedef struct em_profiler em_profiler;

/* One row of a profile: an op name on one device type. */
typedef struct em_profile_row {
    const char *op;          /* "conv2d", "view", "to_device" */
    const char *device_type; /* where it ran ("cpu"; a copy: its destination) */
    uint64_t calls;
    uint64_t total_ns;       /* begin to end, ops nested inside included; a call made inside
                                a call of the same op (a composite around its kernel of the
                                same name) is counted in the outer call's only */
    uint64_t self_ns;        /* total_ns less the time of the ops nested inside */
    uint64_t bytes;          /* bytes of new storage its outputs held (none an input shares) */
    uint64_t fallbacks;      /* calls that ran on the CPU for want of a kernel on the device */
} em_profile_row;

/* Start a profiling session: from now until it stops, every op every thread of the process
 * runs is counted and timed, each thread into a buffer of its own (no lock per op; threads
 * that start later and threads that exit before the end included), merged into the rows when
 * it stops. One session runs at a time. Times are wall clock, per thread (the threads' times
 * add up); on an asynchronous device each op is synchronised at its end, which slows it. NULL
 * with EM_ERR_NOMEM, or EM_ERR_STATE when a profiler is running already. The same as
 * em_profiler_begin(NULL). */
EM_API em_profiler *em_profiler_start(void);

/* What em_profiler_begin records besides the per-op rows. */
typedef struct em_profiler_options {
    size_t struct_size; /* sizeof(em_profiler_options) */
    /* Also keep a timeline for em_profiler_write_trace: every call's start and duration (its
     * op, kind, device and nesting depth) on every thread, and the spans marked while it runs:
     * the loader's waits in em_loader_next ("loader_wait", with the batch), the batches its
     * workers (or em_loader_next itself, without workers) fill ("loader_fill", with the
     * batch), optimizer steps ("optimizer_step", with the class) and the program's
     * em_profiler_range_begin/end. 48 bytes per call; past 4 Mi events, all threads together,
     * the timeline stops (the report says so). */
    bool trace;
    void *ext;          /* reserved; NULL */
} em_profiler_options;

/* em_profiler_start with options (opt NULL: none; EM_ERR_INVALID for a struct_size too
 * small). End it with em_profiler_end, free it with em_profiler_free, from any thread. */
EM_API em_profiler *em_profiler_begin(const em_profiler_options *opt);
/* em_profiler_begin's pair: stop collecting on every thread and merge their buffers, as
 * em_profiler_stop (the same errors). Any thread may call it: it waits for the threads in the
 * middle of recording an event (a few instructions each). */
EM_API em_status em_profiler_end(em_profiler *p);
/* Write the timeline of a profiler begun with options.trace in the Chrome trace-event format
 * (JSON: {"traceEvents": [...]}) that Perfetto (ui.perfetto.dev) and chrome://tracing open:
 * one complete ("X") event per call, named by its op, with cat its kind ("op", "composite",
 * "view", "copy", "inplace", "out", "list"), ts and dur in microseconds from the profiler's
 * start, pid the process, tid the id (gettid) of the thread that made the call, args
 * {"device": "cpu:0", "depth",
 * "clock"}: "device" when dur is the device's own time between two timed events recorded on
 * the thread's current stream as the call began and ended (an asynchronous device whose
 * backend has em_device_ops.event_create_timed: CUDA), else "host" (the host's clock, the
 * call synchronised at its end on an asynchronous device);
 * one per span (cat "data", "optimizer", "range") on the thread that marked it, and metadata
 * events naming the process and each thread that recorded ("thread_name": "main" for the
 * process's first thread, "loader worker 0", ... for a loader's, a name set with
 * pthread_setname_np, else "thread <tid>"; "thread_sort_index" in the order they first
 * recorded). A call nested in another (a composite's sub-ops) lies inside its parent's span
 * on the same thread. Call it after em_profiler_end. EM_ERR_STATE without options.trace or
 * while it runs; EM_ERR_IO when writing fails. */
EM_API em_status em_profiler_write_trace(const em_profiler *p, FILE *f);
/* Mark a span of the calling thread's work (a training step, a forward pass) on its track in
 * the trace of the running tracing profiler, like torch.profiler.record_function: begin and
 * end pair up per thread, nest, and the name (borrowed until the end) is the event's name, cat
 * "range". With no tracing profiler running both cost a load and a branch. */
EM_API void em_profiler_range_begin(const char *name);
EM_API void em_profiler_range_end(void);
/* Stop collecting (from any thread) and merge every thread's rows into the profiler's, which
 * stay readable. EM_ERR_STATE when it is already stopped, or when called from inside the
 * profiler's own recording. */
EM_API em_status em_profiler_stop(em_profiler *p);
/* Stops it if running and frees it (from any thread). NULL is a no-op. */
EM_API void em_profiler_free(em_profiler *p);
/* Rows, every thread's merged, in first-seen order (the threads in the order they first
 * recorded); none while it runs (they are merged when it stops). Borrowed; valid until
 * em_profiler_free. */
EM_API size_t em_profiler_row_count(const em_profiler *p);
EM_API const em_profile_row *em_profiler_row(const em_profiler *p, size_t i); /* NULL past end */
/* Bytes copied from device type `from` to device type `to` (names) while profiling. */
EM_API uint64_t em_profiler_bytes_copied(const em_profiler *p, const char *from, const char *to);
/* Print the profile of a stopped profiler, every thread's calls counted: the threads that ran
 * ops or marked spans (name, tid, calls, self time, spans); per device type the ops run, their
 * time, the bytes copied in and out and the ops that fell back to the CPU; then the ops by
 * self time, the `top` first (0: all), and the 10 with the most total time. While it runs it
 * prints one line saying so. */
EM_API void em_profiler_report(const em_profiler *p, FILE *f, int top);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_TRACE_H */
