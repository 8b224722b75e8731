/*
 * onnx_plugin.c — ember-onnx.so: ONNX export and import (ember/onnx.h, docs/onnx.md). It
 * registers the format "onnx" into the core's "exporter" kind, which em_onnx_export and
 * em_onnx_import call, and the ONNX nodes of ember-layers' classes into the "onnx_layer" kind,
 * where a plugin's own layer registers its exporter the same way. The only part of Ember that
 * links protobuf-c.
 */
#include "ember/error.h"
#include "ember/onnx.h"
#include "ember/plugin.h"
#include "ember/version.h"
#include "onnx_internal.h"

static const em_exporter_class onnx_format = {
    .struct_size = sizeof(em_exporter_class),
    .name = "onnx",
    .description = "ONNX (IR 8, opsets 13..17) through protobuf-c",
    .export_model = ox_export_model,
    .import_model = ox_import_model,
};

static em_status onnx_register(em_registry *reg) {
    em_status st = em_class_register(reg, EM_EXPORTER_KIND, &onnx_format);
    for (const em_onnx_layer_class *const *c = ox_layer_exporters; *c && st == EM_OK; c++)
        st = em_class_register(reg, EM_ONNX_LAYER_KIND, *c);
    for (const em_module_class *const *c = ox_import_classes; *c && st == EM_OK; c++)
        st = em_module_class_register(reg, *c);
    if (st == EM_OK) st = em_class_register(reg, EM_ONNX_LAYER_KIND, &ox_graph_exporter);
    return st;
}

static const em_plugin_descriptor onnx_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-onnx",
    .version = EM_VERSION_STRING,
    .description = "ONNX export and import (protobuf-c)",
    .register_fn = onnx_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &onnx_plugin; }
