/*
 * test_onnx_import.c — em_onnx_import (issue 24), against PyTorch and against Ember itself:
 *   - tests/fixtures/onnx/torch_net.onnx, written by torch.onnx.export (Debian's torch 1.13,
 *     opset 17; tests/fixtures/gen_onnx.py, the version in the fixture's metadata), gives
 *     PyTorch's outputs within allclose(1e-5, 1e-6);
 *   - fine-tuning the imported model 20 SGD steps gives the same weights as fine-tuning the
 *     Ember-built nn.Sequential twin from the same state dict: bitwise, because every node maps
 *     onto the op the Ember layer calls (Conv: em_conv2d, Gemm: em_linear, BatchNormalization:
 *     em_batch_norm with its running statistics updated, Relu, MaxPool, Flatten, Tanh);
 *   - malformed files (truncated, wrong wire types, a length past the end, a huge declared
 *     tensor, a cycle, a dangling input, an unknown op, an attribute of the wrong type, an
 *     unsupported opset) are refused with messages naming the file and the fault.
 * Round trips (export, import, export) are tests/onnx_export's (tests/test_onnx.sh).
 */
#include <criterion/criterion.h>

#include "clean_shutdown.h"
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef EM_TEST_SRCDIR
#define EM_TEST_SRCDIR "."
#endif
#define FIX EM_TEST_SRCDIR "/tests/fixtures/onnx/"

static em_dict *fixture(void) {
    em_dict *d = NULL;
    cr_assert_eq(em_load(FIX "torch_net.safetensors", NULL, &d, NULL), EM_OK, "%s", em_last_error());
    return d;
}

static em_module *layer(const char *cls, const char *opts) {
    em_options *o = em_options_new();
    char buf[512];
    snprintf(buf, sizeof buf, "%s", opts ? opts : "");
    for (char *save, *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        *eq = '\0';
        cr_assert_eq(em_options_set_text(o, kv, eq + 1, NULL), EM_OK, "%s", em_last_error());
    }
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    cr_assert_not_null(m, "%s: %s", cls, em_last_error());
    return m;
}

/* The nn.Sequential of gen_onnx.py, built from Ember's layers. */
static em_module *twin(void) {
    em_module *s = layer("Sequential", NULL);
    em_module *kids[] = {
        layer("Conv2d", "in_channels=1;out_channels=4;kernel_size=3;padding=1"), layer("ReLU", NULL),
        layer("MaxPool2d", "kernel_size=2"), layer("Flatten", NULL),
        layer("Linear", "in_features=64;out_features=16"), layer("BatchNorm1d", "num_features=16"),
        layer("Tanh", NULL), layer("Linear", "in_features=16;out_features=12"), layer("ReLU", NULL),
        layer("Linear", "in_features=12;out_features=5")};
    for (size_t i = 0; i < sizeof kids / sizeof *kids; i++)
        cr_assert_eq(em_module_append_child(s, kids[i]), EM_OK);
    return s;
}

static void read_f32(const em_tensor *t, float *out, size_t n) {
    cr_assert_eq(em_tensor_numel(t), (int64_t)n);
    cr_assert_eq(em_tensor_to_host(em_contiguous(em_to_dtype(t, EM_F32)), out, n * sizeof *out),
                 EM_OK, "%s", em_last_error());
}

Test(onnx_import, a_torch_export_gives_pytorchs_outputs) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    em_scope_begin();
    em_dict *d = fixture();
    em_module *m = em_onnx_import(FIX "torch_net.onnx", NULL);
    cr_assert_not_null(m, "%s", em_last_error());
    cr_assert_str_eq(em_module_class_of(m)->name, "onnx.Graph");
    em_module_train(m, false);
    em_tensor *y = em_module_forward(m, em_dict_get(d, "input"));
    cr_assert_not_null(y, "%s", em_last_error());
    float got[35], want[35];
    read_f32(y, got, 35);
    read_f32(em_dict_get(d, "output"), want, 35);
    for (int i = 0; i < 35; i++)
        cr_assert(fabsf(got[i] - want[i]) <= 1e-6f + 1e-5f * fabsf(want[i]),
                  "output %d: Ember %.9g, PyTorch %.9g", i, got[i], want[i]);
    /* initializers are trainable parameters under their state-dict names */
    em_dict *params = em_module_named_parameters(m, true);
    cr_assert_eq(em_dict_len(params), 10, "%zu parameters", em_dict_len(params));
    cr_assert(em_dict_has(params, "0.weight") && em_dict_has(params, "9.bias"));
    em_dict *sd = em_module_state_dict(m);
    cr_assert(em_dict_has(sd, "5.running_mean") && !em_dict_has(params, "5.running_mean"));
    em_dict_free(sd);
    em_dict_free(params);
    em_module_free(m);
    em_dict_free(d);
    em_scope_end();
}

/* 20 steps of SGD (momentum 0.9) on cross entropy, in training mode. */
static void fine_tune(em_module *m, const em_dict *d) {
    em_dict *params = em_module_named_parameters(m, true);
    em_options *o = em_options_new();
    em_options_set_float(o, "lr", 0.05);
    em_options_set_float(o, "momentum", 0.9);
    em_optimizer *opt = em_optimizer_new("SGD", params, o);
    cr_assert_not_null(opt, "%s", em_last_error());
    em_module *loss = layer("CrossEntropyLoss", NULL);
    em_module_train(m, true);
    const em_tensor *tx = em_dict_get(d, "train_x"), *ty = em_dict_get(d, "train_y");
    for (int step = 0; step < 20; step++) {
        em_scope_begin();
        em_tensor *x = em_select(tx, 0, step), *t = em_select(ty, 0, step);
        em_tensor *out = em_module_forward(m, x);
        cr_assert_not_null(out, "%s", em_last_error());
        em_tensor *l = em_module_forward_n(loss, (em_tensor *[]){out, t}, 2);
        em_optimizer_zero_grad(opt);
        cr_assert_eq(em_backward(l), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_optimizer_step(opt), EM_OK, "%s", em_last_error());
        em_scope_end();
    }
    em_module_free(loss);
    em_optimizer_free(opt);
    em_options_free(o);
    em_dict_free(params);
}

Test(onnx_import, fine_tuning_the_import_equals_fine_tuning_the_ember_built_model) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    em_scope_begin();
    em_dict *d = fixture();
    em_module *imp = em_onnx_import(FIX "torch_net.onnx", NULL), *ref = twin();
    cr_assert_not_null(imp, "%s", em_last_error());
    em_dict *sd = em_dict_new();
    for (size_t i = 0; i < em_dict_len(d); i++)
        if (strncmp(em_dict_key(d, i), "sd.", 3) == 0)
            em_dict_set(sd, em_dict_key(d, i) + 3, em_dict_value(d, i));
    cr_assert_eq(em_module_load_state_dict(ref, sd, true, NULL), EM_OK, "%s", em_last_error());
    em_dict_free(sd);
    em_seed(1);
    fine_tune(imp, d);
    em_seed(1);
    fine_tune(ref, d);
    em_dict *a = em_module_state_dict(imp), *b = em_module_state_dict(ref);
    size_t compared = 0;
    for (size_t i = 0; i < em_dict_len(a); i++) {
        const char *k = em_dict_key(a, i);
        const em_tensor *x = em_dict_value(a, i), *y = em_dict_get(b, k);
        cr_assert_not_null(y, "the Ember-built model has no '%s'", k);
        size_t n = (size_t)em_tensor_numel(x);
        float *p = malloc(n * sizeof *p), *q = malloc(n * sizeof *q);
        read_f32(x, p, n);
        read_f32(y, q, n);
        for (size_t j = 0; j < n; j++) {
            cr_assert(fabsf(p[j] - q[j]) <= 1e-6f + 1e-5f * fabsf(q[j]), "%s[%zu]: %.9g vs %.9g",
                      k, j, p[j], q[j]);
            cr_assert(memcmp(&p[j], &q[j], sizeof p[j]) == 0, "%s[%zu] not bitwise: %.9g vs %.9g",
                      k, j, p[j], q[j]);
        }
        free(p);
        free(q);
        compared++;
    }
    cr_assert_eq(compared, 12, "%zu tensors compared", compared); /* 10 params + 2 statistics */
    /* and they did move: the fine-tuned weights are not the fixture's */
    float w0[36], f0[36];
    read_f32(em_dict_get(a, "0.weight"), w0, 36);
    read_f32(em_dict_get(d, "sd.0.weight"), f0, 36);
    cr_assert(memcmp(w0, f0, sizeof w0) != 0, "fine-tuning changed nothing");
    em_dict_free(a);
    em_dict_free(b);
    em_module_free(imp);
    em_module_free(ref);
    em_dict_free(d);
    em_scope_end();
}

/* The import fails with a message that has every needle. */
static void refused(const char *path, const char *n1, const char *n2) {
    em_module *m = em_onnx_import(path, NULL);
    cr_assert_null(m, "%s was imported", path);
    const char *e = em_last_error();
    cr_assert(strstr(e, path), "'%s' does not name the file %s", e, path);
    cr_assert(strstr(e, n1), "'%s' lacks '%s'", e, n1);
    if (n2) cr_assert(strstr(e, n2), "'%s' lacks '%s'", e, n2);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

Test(onnx_import, malformed_files_are_refused_with_messages) {
    cr_assert_eq(em_init(), EM_OK, "%s", em_last_error());
    refused(FIX "bad_cycle.onnx", "node 'first' (Relu, opset 17)", "made by a node at or after it");
    refused(FIX "bad_op.onnx", "node 'mix' (Einsum, opset 17)", "op type Einsum is not supported");
    refused(FIX "bad_attr.onnx", "node 'conv' (Conv, opset 17)", "attribute 'strides' is FLOATS");
    refused(FIX "bad_huge.onnx", "tensor 'w' declares dim 1 = 1073741824", "past 2^56 elements");
    refused(FIX "bad_big.onnx", "tensor 'w' declares 1099511627776 elements of float32", "holds a "
            "different number");
    refused(FIX "bad_dangling.onnx", "node 'add'", "it reads 'ghost', which no node");
    refused(FIX "bad_opset.onnx", "opset 11", "Ember imports opsets 13..17");
    /* well-formed files whose values are hostile: the forward refuses, naming the node, and
     * allocates nothing of the size asked */
    static const struct { const char *file, *node, *why; } at_forward[] = {
        {"bad_range.onnx", "node 'range' (Range)", "more than 16777216 elements"},
        {"bad_split.onnx", "node 'split' (Split)", "the split sizes add up to 6, not dim 1's 4"},
    };
    for (size_t i = 0; i < sizeof at_forward / sizeof *at_forward; i++) {
        char p[512];
        snprintf(p, sizeof p, FIX "%s", at_forward[i].file);
        em_module *m = em_onnx_import(p, NULL);
        cr_assert_not_null(m, "%s: %s", p, em_last_error());
        em_scope_begin();
        em_tensor *x = em_zeros(2, (int64_t[]){2, 4}, EM_F32, em_cpu());
        em_tensor *y = em_module_forward(m, x);
        cr_assert_null(y, "%s: the forward ran", p);
        cr_assert(strstr(em_last_error(), at_forward[i].node) &&
                  strstr(em_last_error(), at_forward[i].why), "%s: '%s'", p, em_last_error());
        em_scope_end();
        em_module_free(m);
    }
    char tmp[] = "/tmp/onnx_importXXXXXX";
    cr_assert_not_null(mkdtemp(tmp));
    char path[256];
    /* truncated: the first 3000 of the fixture's 7098 bytes */
    FILE *f = fopen(FIX "torch_net.onnx", "rb");
    cr_assert_not_null(f);
    static unsigned char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_gt(n, 3000);
    snprintf(path, sizeof path, "%s/truncated.onnx", tmp);
    write_bytes(path, buf, 3000);
    refused(path, "not a valid ONNX model", "truncated");
    /* ir_version then the graph (field 7) as a varint: a wrong wire type */
    snprintf(path, sizeof path, "%s/wiretype.onnx", tmp);
    write_bytes(path, "\x08\x08\x38\x01", 4);
    refused(path, "not a valid ONNX model", "wrong wire type");
    /* the graph declares 2^62 bytes */
    snprintf(path, sizeof path, "%s/huge.onnx", tmp);
    write_bytes(path, "\x3a\x80\x80\x80\x80\x80\x80\x80\x80\x40", 10);
    refused(path, "not a valid ONNX model", "past the 10 bytes");
    /* 100000 empty nodes in 200 kB: more unpacked than 16 times the file (and 1 MiB) */
    static unsigned char many[200006] = {0x08, 0x08, 0x3a, 0xc0, 0x9a, 0x0c};
    for (int i = 0; i < 100000; i++) many[6 + 2 * i] = 0x0a;
    snprintf(path, sizeof path, "%s/many.onnx", tmp);
    write_bytes(path, many, sizeof many);
    refused(path, "would take more than", "refused as hostile");
    /* an empty file is a model without a graph */
    snprintf(path, sizeof path, "%s/empty.onnx", tmp);
    write_bytes(path, "", 0);
    refused(path, "the model has no graph", NULL);
    snprintf(path, sizeof path, "%s/absent.onnx", tmp);
    refused(path, "cannot open", "No such file");
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}
