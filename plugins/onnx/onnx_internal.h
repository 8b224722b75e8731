/*
 * onnx_internal.h — the ember-onnx plugin's shared declarations: the model writer
 * (onnx_export.c), the standard layers' exporters (onnx_layers.c) and the reader
 * (onnx_import.c). Only this plugin includes the protobuf-c bindings, generated at build time
 * from Debian's onnx.proto (onnx.pb-c.h in the build tree).
 */
#ifndef EMBER_ONNX_INTERNAL_H
#define EMBER_ONNX_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/module.h"
#include "ember/onnx.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/tensor.h"
#include "onnx.pb-c.h"

/* ONNX's TensorProto.DataType for an Ember dtype; 0 when there is none. */
int ox_onnx_dtype(em_dtype dt);
/* The Ember dtype of an ONNX data type; false when Ember has none. */
bool ox_ember_dtype(int onnx_type, em_dtype *out);

/* The standard layers' exporters, registered by the plugin; NULL-terminated. */
extern const em_onnx_layer_class *const ox_layer_exporters[];

/* em_exporter_class's slots for "onnx". */
em_status ox_export_model(em_module *m, int n_inputs, em_tensor *const *example_inputs,
                          const char *path, const em_options *options);

/* The importer's module classes (onnx.Graph, onnx.Params), NULL-terminated, and onnx.Graph's
 * exporter: the nodes it was read from. */
extern const em_module_class *const ox_import_classes[];
extern const em_onnx_layer_class ox_graph_exporter;
em_module *ox_import_model(const char *path, const em_options *options);
/* For onnx.Graph's exporter: an initializer of exactly this name (once), and a copy of node n
 * with its name, attributes and value names, the input from_in renamed to to_in. */
em_status ox_builder_raw_initializer(em_onnx_builder *b, const char *name, const em_tensor *t);
/* The model an imported graph came from: its metadata is written again when the export adds
 * none of its own (the graph being the whole model). */
void ox_builder_set_origin(em_onnx_builder *b, const Onnx__ModelProto *model);
em_status ox_builder_raw_node(em_onnx_builder *b, const Onnx__NodeProto *n, const char *from_in,
                              const char *to_in);

/* The builder's node with n_out outputs (LSTM's Y, Y_h, Y_c), their names to out[0..n_out). */
em_status ox_builder_node_n(em_onnx_builder *b, const char *op_type, int n_in,
                            const char *const *in, int n_attr, const em_onnx_attr *attrs,
                            int n_out, char *const *out);

/* Attribute shorthands for the layer exporters. */
#define OX_INT(nm, v) ((em_onnx_attr){.name = (nm), .type = EM_ONNX_ATTR_INT, .i = (v)})
#define OX_FLOAT(nm, v) ((em_onnx_attr){.name = (nm), .type = EM_ONNX_ATTR_FLOAT, .f = (v)})
#define OX_INTS(nm, k, p) ((em_onnx_attr){.name = (nm), .type = EM_ONNX_ATTR_INTS, .n = (k), .ints = (p)})

#endif /* EMBER_ONNX_INTERNAL_H */
