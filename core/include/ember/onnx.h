/*
 * ember/onnx.h — ONNX export and import, and the class kinds that supply them.
 *
 * The core links no protobuf library: the ONNX reader and writer live in the ember-onnx plugin
 * (plugins/onnx, the only part of Ember on protobuf-c). It registers the class "onnx" into the
 * core's "exporter" kind; em_onnx_export/em_onnx_import find it there and fail with
 * EM_ERR_NOTFOUND, saying the plugin is not installed, when it is absent.
 *
 *     em_tensor *x = em_zeros(2, (int64_t[]){1, 784}, EM_F32, em_cpu()); // example input
 *     em_options *o = em_options_new();
 *     em_options_set_int(o, "opset", 15);
 *     if (em_onnx_export(model, 1, &x, "model.onnx", o) != EM_OK)
 *         fprintf(stderr, "%s\n", em_last_error());   // nothing was written
 *     em_options_free(o);
 *
 * Export is per module class: the class "Linear" of the "onnx_layer" kind writes the nodes of
 * a Linear, "Sequential" those of its children in order, and a plugin's layer supplies its own
 * em_onnx_layer_class (docs/onnx.md says why this rather than tracing ops). A module whose
 * class has no ONNX exporter is an error, before anything is written, naming its path and
 * class and listing the classes that can be exported.
 */
#ifndef EMBER_ONNX_H
#define EMBER_ONNX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/error.h"
#include "ember/export.h"
#include "ember/module.h"
#include "ember/options.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the public calls ---------------------------------------------------------------------- */

/* Write m, in eval mode, as an ONNX model at path. example_inputs (n_inputs tensors, the
 * model's inputs with a batch dim first) fix the input shapes and dtypes; the model's mode is
 * restored afterwards and nothing is updated. options (may be NULL), by name:
 *   opset          int, 13..17 (default 17); below 17 LayerNorm is its decomposition
 *   dynamic_batch  bool (default true): dim 0 of inputs and output is the symbol batch_dim
 *   batch_dim      string (default "batch")
 *   input_name, output_name   strings (default "input", "output")
 *   input_dtype    string: the dtype a deployer feeds (e.g. "uint8"); default: the example's
 *   scale          float: to_float's factor; 0 means 1/255 for uint8 (a division by 255)
 *   mean, std      floats, one per channel (item dim 0): normalize
 *   transforms     "nodes" (default) puts the input transforms above (when any is given) into
 *                  the graph as its first nodes, "metadata" records them in the model's
 *                  metadata ("ember.input_transforms") and leaves the graph's input as the
 *                  model's
 *   variable_length bool (default false): the model is fed variable-length (padded) batches
 *                  with their padding mask (em_module_forward_masked): the graph has no mask
 *                  input, so a layer whose class reads the mask (takes_mask: LSTM, GRU,
 *                  MultiheadAttention) is refused (EM_ERR_INVALID, naming it) rather than
 *                  exported to numbers that differ on padded batches
 * The file is written to a temporary name and renamed. The bytes depend only on the model,
 * the example shapes and the options (deterministic). Errors: EM_ERR_NOTFOUND when the ONNX
 * plugin is not loaded or a layer has no exporter, EM_ERR_INVALID for a bad option, EM_ERR_IO
 * naming the file. */
EM_API em_status em_onnx_export(em_module *m, int n_inputs, em_tensor *const *example_inputs,
                                const char *path, const em_options *options);

/* Read the ONNX model at path and build an Ember module computing it (see docs/onnx.md for the
 * ops understood); initializers become trainable parameters. options (may be NULL):
 *   input_transforms  bool (default true): false leaves out the "/input_transforms/" nodes an
 *                     Ember export starts with (for a pipeline that applies them itself)
 * Returns a new module (the caller frees it) or NULL with the error: the file
 * and the fault, or the first unsupported node with its op type and opset. */
EM_API em_module *em_onnx_import(const char *path, const em_options *options);

/* ---- the "exporter" kind: model formats ---------------------------------------------------- */

#define EM_EXPORTER_KIND "exporter"

typedef struct em_exporter_class {
    size_t struct_size;       /* sizeof(em_exporter_class) */
    const char *name;         /* the format: "onnx" */
    const char *description;
    /* Write a model; the arguments of em_onnx_export. */
    em_status (*export_model)(em_module *m, int n_inputs, em_tensor *const *example_inputs,
                              const char *path, const em_options *options);
    /* (optional) Read a model; NULL: the format is export-only. */
    em_module *(*import_model)(const char *path, const em_options *options);
    void *ext;                /* reserved; NULL */
} em_exporter_class;

/* ---- the "onnx_layer" kind: one module class's ONNX nodes ---------------------------------- */

#define EM_ONNX_LAYER_KIND "onnx_layer"
/* The longest value name the builder hands out, with its NUL. */
#define EM_ONNX_NAME_MAX 256

typedef enum em_onnx_attr_type {
    EM_ONNX_ATTR_INT = 1,
    EM_ONNX_ATTR_FLOAT = 2,
    EM_ONNX_ATTR_STRING = 3,
    EM_ONNX_ATTR_INTS = 4,
    EM_ONNX_ATTR_FLOATS = 5,
} em_onnx_attr_type;

/* One node attribute: i, f, s, or n values of ints/floats. */
typedef struct em_onnx_attr {
    const char *name;
    em_onnx_attr_type type;
    int64_t i;
    double f;
    const char *s;
    int n;
    const int64_t *ints;
    const float *floats;
} em_onnx_attr;

typedef struct em_onnx_builder em_onnx_builder;

/* What the ONNX plugin hands a layer exporter: the graph being built, through function
 * pointers (so a plugin's exporter needs no link to ember-onnx.so). Names of values are
 * written into out buffers of EM_ONNX_NAME_MAX bytes. */
struct em_onnx_builder {
    size_t struct_size;       /* sizeof(em_onnx_builder) at the ONNX plugin's build */
    int opset;                /* the opset being written, 13..17 */
    /* Append a node op_type (default domain) of n_in inputs ("" for an absent optional one)
     * and one output, whose new name goes to out. */
    em_status (*node)(em_onnx_builder *b, const char *op_type, int n_in, const char *const *in,
                      int n_attr, const em_onnx_attr *attrs, char *out);
    /* Add t (a parameter or buffer of the module being exported, any device) as the
     * initializer of the state-dict key path.local ("0.weight"); its value name to out. */
    em_status (*initializer)(em_onnx_builder *b, const char *local, const em_tensor *t,
                             char *out);
    /* Add a constant (an anonymous initializer) holding t; its value name to out. */
    em_status (*constant)(em_onnx_builder *b, const em_tensor *t, char *out);
    /* Export child `name` of the module being exported, on the value `in` whose example is
     * x (borrowed); its output's name to out and, when out_example is not NULL, the child's
     * output on x to *out_example (owned by the scope the export runs in: never released). */
    em_status (*child)(em_onnx_builder *b, const char *name, const char *in, const em_tensor *x,
                       char *out, em_tensor **out_example);
    void *ext;                /* reserved */
};

typedef struct em_onnx_layer_class {
    size_t struct_size;       /* sizeof(em_onnx_layer_class) */
    const char *name;         /* the module class it exports: "Linear", "myplugin.Swish" */
    const char *description;  /* which ONNX ops, e.g. "Gemm (MatMul + Add above 2-D)" */
    /* Append the nodes computing m (in eval mode) on the value `in`, whose example is x (a
     * CPU or device tensor of the batch's shape), and name the result in out. It runs inside
     * a scope with grad off: tensors it makes (constants) are dropped at the export's end.
     * Errors name what cannot be exported (an option, a mode); the builder prefixes the
     * layer's path and class. */
    em_status (*export_layer)(em_onnx_builder *b, em_module *m, const char *in,
                              const em_tensor *x, char *out);
    void *ext;                /* reserved; NULL */
} em_onnx_layer_class;

#ifdef __cplusplus
}
#endif
#endif /* EMBER_ONNX_H */
