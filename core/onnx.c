/*
 * onnx.c — em_onnx_export and em_onnx_import: the calls a user makes, forwarded to the class
 * "onnx" of the "exporter" kind, which the ember-onnx plugin registers (the core links no
 * protobuf library). Without the plugin both fail with a message saying so.
 */
#include <stdio.h>
#include <string.h>

#include "ember/error.h"
#include "ember/onnx.h"
#include "ember/plugin.h"

static const em_exporter_class *onnx_format(const char *who) {
    const em_exporter_class *c = em_class_find(EM_EXPORTER_KIND, "onnx");
    if (!c || !c->export_model)
        em_set_error(EM_ERR_NOTFOUND, "%s: ONNX support is not installed: the ember-onnx plugin "
                     "(ember-onnx.so, built when configure finds protobuf-c, protoc-c and "
                     "onnx.proto) is not loaded; ember-info lists the plugins found and why "
                     "any was refused", who);
    return c;
}

em_status em_onnx_export(em_module *m, int n_inputs, em_tensor *const *example_inputs,
                         const char *path, const em_options *options) {
    if (!m || !path || n_inputs < 1 || !example_inputs)
        return em_set_error(EM_ERR_INVALID, "onnx_export: needs a module, a path and at least "
                            "one example input");
    for (int i = 0; i < n_inputs; i++)
        if (!example_inputs[i])
            return em_set_error(EM_ERR_INVALID, "onnx_export: example input %d is NULL", i);
    const em_exporter_class *c = onnx_format("onnx_export");
    if (!c) return em_last_status();
    return c->export_model(m, n_inputs, example_inputs, path, options);
}

em_module *em_onnx_import(const char *path, const em_options *options) {
    if (!path) {
        em_set_error(EM_ERR_INVALID, "onnx_import: NULL path");
        return NULL;
    }
    const em_exporter_class *c = onnx_format("onnx_import");
    if (!c) return NULL;
    if (!c->import_model) {
        em_set_error(EM_ERR_NOTFOUND, "onnx_import: the loaded ONNX plugin cannot import");
        return NULL;
    }
    return c->import_model(path, options);
}
