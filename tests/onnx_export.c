/*
 * onnx_export.c — the Ember side of tests/test_onnx.sh: builds the test models, exports each
 * at every opset 13..17 into DIR, and writes inputs and Ember's outputs on them (batches of 1
 * and 7) as .npy files, for tests/onnx_check.py to judge with onnx's checker and ONNX Runtime:
 *
 *   DIR/NAME.opK.onnx          the model NAME exported at opset K (dynamic batch)
 *   DIR/NAME.bB.in.npy         an input of batch B as the deployer feeds it (raw uint8 pixels
 *                              for the "mlp" model, whose transforms are the graph's first nodes)
 *   DIR/NAME.bB.out.npy        Ember's output on it (after the config's transforms)
 *   DIR/NAME.keys.txt          the model's state-dict keys, one a line
 *   DIR/models.txt             the names, one a line
 *
 * It also checks, itself, what needs no other program: the export is deterministic (the same
 * bytes twice); export, em_onnx_import, export gives the same bytes, and the imported model
 * the Ember model's outputs (bitwise for "mlp" and "residual", whose nodes all map onto the
 * ops Ember's layers call; within allclose(1e-5, 1e-6) where GELU, SiLU, a 3-D Linear or a
 * program's layer, the attention, the Transformer layers or the positional encodings are
 * decompositions) — for the models whose ops the importer has not (Conv1d, ConvTranspose2d,
 * LSTM, GRU and their cells) the import's error names the node instead; a layer without an
 * exporter fails before anything is written with a message naming the layer's path and class
 * and the exportable classes, a layer that reads the padding mask (LSTM, GRU,
 * MultiheadAttention) is refused under the option variable_length, an unbatched LSTM/GRU
 * or attention example is refused, and so is attention with separate k/v sizes, a program-registered layer
 * exports through its own em_onnx_layer_class, an opset outside 13..17 is refused; it writes
 * DIR/meta.onnx with the transforms in the metadata only (tests/onnx_check.py reads it).
 * --absent (run with EMBER_DISABLE_PLUGINS=ember-onnx): em_onnx_export and em_onnx_import say
 * the plugin is not installed. Exit 0, or 1 with the reason.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ember/autograd.h"
#include "ember/dict.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/init.h"
#include "ember/module.h"
#include "ember/onnx.h"
#include "ember/ops.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/random.h"
#include "ember/scope.h"
#include "ember/tensor.h"

static const char *dir;
static int failures;

#define FAIL(...)                                                                              \
    do {                                                                                       \
        fprintf(stderr, "onnx_export: " __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                                   \
        failures++;                                                                            \
    } while (0)

static void die(const char *what) {
    fprintf(stderr, "onnx_export: %s: %s\n", what, em_last_error());
    exit(1);
}

/* ---- models ------------------------------------------------------------------------------ */

static em_module *layer(const char *cls, const char *opts) {
    em_options *o = em_options_new();
    char buf[512];
    snprintf(buf, sizeof buf, "%s", opts ? opts : "");
    for (char *save, *kv = strtok_r(buf, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        *eq = '\0';
        if (em_options_set_text(o, kv, eq + 1, NULL) != EM_OK) die(kv);
    }
    em_module *m = em_module_new(cls, o);
    em_options_free(o);
    if (!m) die(cls);
    return m;
}

static em_module *seq(em_module **kids, int n) {
    em_module *s = layer("Sequential", NULL);
    for (int i = 0; i < n; i++)
        if (em_module_append_child(s, kids[i]) != EM_OK) die("append");
    return s;
}
#define SEQ(...) seq((em_module *[]){__VA_ARGS__}, (int)(sizeof((em_module *[]){__VA_ARGS__}) / sizeof(em_module *)))

static em_module *mlp(void) {
    return SEQ(layer("Flatten", NULL), layer("Linear", "in_features=64;out_features=32"),
               layer("ReLU", NULL), layer("Linear", "in_features=32;out_features=10"));
}

static em_module *cnn(void) {
    return SEQ(layer("Conv2d", "in_channels=3;out_channels=8;kernel_size=3;padding=1"),
               layer("ReLU", NULL), layer("MaxPool2d", "kernel_size=2"),
               layer("Conv2d", "in_channels=8;out_channels=6;kernel_size=[2, 3];padding=same"),
               layer("GELU", NULL), layer("AvgPool2d", "kernel_size=2;stride=1;padding=1"),
               layer("Conv2d", "in_channels=6;out_channels=6;kernel_size=3;stride=2;groups=3;bias=false"),
               layer("AdaptiveAvgPool2d", "output_size=1"),
               layer("Flatten", "start_dim=1;end_dim=2"), layer("Flatten", NULL),
               layer("Linear", "in_features=6;out_features=4"));
}

/* Conv2d with activation relu (the fused conv2d_relu): exported as Conv then Relu, which the
 * importer runs as em_conv2d and em_relu, the same bits. */
static em_module *cnn_fused(void) {
    return SEQ(layer("Conv2d", "in_channels=3;out_channels=8;kernel_size=3;padding=1;activation=relu"),
               layer("MaxPool2d", "kernel_size=2"),
               layer("Conv2d", "in_channels=8;out_channels=6;kernel_size=3;activation=relu"),
               layer("Flatten", NULL), layer("Linear", "in_features=96;out_features=4"));
}

/* MaxPool2d with activation relu (the fused max_pool2d_relu) after plain convolutions:
 * exported as Relu then MaxPool, which the importer runs as em_relu and em_max_pool2d, the
 * same bits (values and indices); a 2x2 pooling and an overlapping 3x3 stride 2 padding 1
 * ceil one. */
static em_module *cnn_pool_fused(void) {
    return SEQ(layer("Conv2d", "in_channels=3;out_channels=16;kernel_size=3;padding=1"),
               layer("MaxPool2d", "kernel_size=2;activation=relu"),
               layer("Conv2d", "in_channels=16;out_channels=8;kernel_size=3;padding=1"),
               layer("MaxPool2d", "kernel_size=3;stride=2;padding=1;ceil_mode=true;activation=relu"),
               layer("Flatten", NULL), layer("Linear", "in_features=128;out_features=4"));
}

static em_module *bn_dropout(void) {
    return SEQ(layer("Conv2d", "in_channels=3;out_channels=4;kernel_size=3"),
               layer("BatchNorm2d", "num_features=4"), layer("ReLU", NULL),
               layer("Dropout", "p=0.5"), layer("Flatten", NULL),
               layer("Linear", "in_features=144;out_features=16"),
               layer("BatchNorm1d", "num_features=16;affine=false"),
               layer("LayerNorm", "normalized_shape=16"), layer("SiLU", NULL),
               layer("Dropout", "p=0.2"), layer("GELU", "approximate=tanh"),
               layer("Linear", "in_features=16;out_features=5"), layer("LogSoftmax", NULL));
}

static em_module *residual(void) {
    em_module *r1 = layer("Residual", NULL);
    em_module_add_child(r1, "0", layer("Linear", "in_features=16;out_features=16"));
    em_module_add_child(r1, "1", layer("ReLU", NULL));
    em_module_add_child(r1, "2", layer("Linear", "in_features=16;out_features=16"));
    em_module *r2 = layer("Residual", NULL);
    em_module_add_child(r2, "0", layer("Linear", "in_features=16;out_features=8"));
    em_module_add_child(r2, "1", layer("Tanh", NULL));
    em_module_add_child(r2, "shortcut", layer("Linear", "in_features=16;out_features=8;bias=false"));
    em_module *p1 = layer("Parallel", NULL);
    em_module_add_child(p1, "a", layer("Linear", "in_features=8;out_features=4"));
    em_module_add_child(p1, "b", SEQ(layer("Sigmoid", NULL), layer("Linear", "in_features=8;out_features=3")));
    em_module *p2 = layer("Parallel", "mode=sum");
    em_module_add_child(p2, "a", layer("Linear", "in_features=7;out_features=5"));
    em_module_add_child(p2, "b", layer("Linear", "in_features=7;out_features=5"));
    return SEQ(layer("Linear", "in_features=12;out_features=16"), r1, layer("ReLU", NULL), r2, p1,
               layer("LeakyReLU", "negative_slope=0.2"), p2, layer("Softmax", NULL));
}

/* Embedding, a 3-D Linear (MatMul), a partial Flatten (Reshape), LayerNorm over two dims,
 * Identity. */
static em_module *embed(void) {
    return SEQ(layer("Embedding", "num_embeddings=20;embedding_dim=6"),
               layer("Linear", "in_features=6;out_features=6"),
               layer("LayerNorm", "normalized_shape=[5, 6];elementwise_affine=false"),
               layer("Identity", NULL), layer("Flatten", "start_dim=1;end_dim=2"),
               layer("Linear", "in_features=30;out_features=3;bias=false"));
}

/* Conv1d ('same' with an odd total pad, strided, dilated, grouped) and GroupNorm on (N, C, L). */
static em_module *conv1d_gn(void) {
    return SEQ(layer("Conv1d", "in_channels=4;out_channels=6;kernel_size=4;padding=same"),
               layer("GroupNorm", "num_groups=3;num_channels=6"), layer("ReLU", NULL),
               layer("Conv1d", "in_channels=6;out_channels=8;kernel_size=3;stride=2;dilation=2;"
                     "groups=2;padding=1;bias=false"),
               layer("GroupNorm", "num_groups=2;num_channels=8;affine=false;eps=0.001"),
               layer("Flatten", NULL));
}

/* ConvTranspose2d (output_padding, groups, dilation, uneven stride) and GroupNorm on 4-D. */
static em_module *deconv(void) {
    return SEQ(layer("ConvTranspose2d", "in_channels=3;out_channels=4;kernel_size=3;stride=2;"
                     "padding=1;output_padding=1"),
               layer("GroupNorm", "num_groups=2;num_channels=4"), layer("Tanh", NULL),
               layer("ConvTranspose2d", "in_channels=4;out_channels=6;kernel_size=[2, 3];"
                     "stride=[1, 2];groups=2;dilation=2;bias=false"));
}

/* Recurrent layers, each `output`. Those not batch_first take (T, N, I): dim 0, the "batch"
 * of the export, is then the sequence length, which varies between the runs. */
static em_module *lstm_seq(void) {
    return SEQ(layer("LSTM", "input_size=3;hidden_size=4;num_layers=2;bidirectional=true;"
                     "batch_first=true"),
               layer("Linear", "in_features=8;out_features=2"));
}
static em_module *lstm_cn(void) {
    return SEQ(layer("LSTM", "input_size=3;hidden_size=5;num_layers=2;output=c_n"));
}
static em_module *lstm_last(void) {
    return SEQ(layer("LSTM", "input_size=3;hidden_size=4;bidirectional=true;batch_first=true;"
                     "bias=false;output=last"),
               layer("Linear", "in_features=8;out_features=3"));
}
static em_module *lstm_hn(void) {
    return SEQ(layer("LSTM", "input_size=2;hidden_size=3;bidirectional=true;output=h_n"));
}
static em_module *gru_seq(void) {
    return SEQ(layer("GRU", "input_size=3;hidden_size=4;num_layers=2;bidirectional=true;"
                     "batch_first=true"),
               layer("Linear", "in_features=8;out_features=2"));
}
static em_module *gru_hn(void) {
    return SEQ(layer("GRU", "input_size=3;hidden_size=5;num_layers=2;bidirectional=true;"
                     "output=h_n"));
}
static em_module *gru_last(void) {
    return SEQ(layer("GRU", "input_size=3;hidden_size=4;num_layers=2;batch_first=true;"
                     "bias=false;output=last"),
               layer("Linear", "in_features=4;out_features=3"));
}
static em_module *gru_t(void) {
    return SEQ(layer("GRU", "input_size=2;hidden_size=3"));
}

/* The cells: one step from zero states, (N, input_size) -> (N, hidden_size). */
static em_module *lstm_cell(void) {
    return SEQ(layer("LSTMCell", "input_size=3;hidden_size=5"),
               layer("Linear", "in_features=5;out_features=2"));
}
static em_module *lstm_cell_c(void) {
    return SEQ(layer("LSTMCell", "input_size=3;hidden_size=4;bias=false;output=c"));
}
static em_module *gru_cell(void) {
    return SEQ(layer("GRUCell", "input_size=4;hidden_size=3"), layer("Tanh", NULL));
}

/* Attention and Transformer layers on one input (self-attention). Those not batch_first take
 * (L, B, E): the export's dynamic dim 0 is then the sequence length, which the causal mask
 * and the positional encodings follow. */
static em_module *mha_bf(void) {
    return SEQ(layer("MultiheadAttention", "embed_dim=8;num_heads=2;batch_first=true"));
}
static em_module *mha_causal(void) {
    return SEQ(layer("MultiheadAttention", "embed_dim=8;num_heads=4;causal=true;bias=false"),
               layer("Linear", "in_features=8;out_features=3"));
}
static em_module *enc_post(void) {
    return SEQ(layer("TransformerEncoderLayer", "d_model=8;nhead=2;dim_feedforward=16;"
                     "batch_first=true"));
}
static em_module *enc_pre(void) {
    return SEQ(layer("TransformerEncoder", "d_model=8;nhead=2;dim_feedforward=12;num_layers=2;"
                     "norm_first=true;activation=gelu;norm=true;causal=true"));
}
/* A character-level Transformer LM: tokens, sinusoidal positions, a causal post-norm GELU
 * layer, the logits. */
static em_module *charlm(void) {
    return SEQ(layer("Embedding", "num_embeddings=20;embedding_dim=8"),
               layer("PositionalEncoding", "d_model=8;max_len=32;batch_first=true"),
               layer("TransformerEncoder", "d_model=8;nhead=2;dim_feedforward=16;num_layers=1;"
                     "activation=gelu;causal=true;batch_first=true"),
               layer("Linear", "in_features=8;out_features=20"));
}
static em_module *lpe_t(void) {
    return SEQ(layer("LearnedPositionalEncoding", "d_model=4;max_len=10"),
               layer("PositionalEncoding", "d_model=4;max_len=12;dropout=0.3"),
               layer("Linear", "in_features=4;out_features=3"));
}

/* ---- data --------------------------------------------------------------------------------- */

static uint64_t lcg = 12345;
static uint32_t next_u32(void) {
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(lcg >> 33);
}

static em_tensor *randn(int nd, const int64_t *shape) {
    em_tensor *t = em_empty(nd, shape, EM_F32, em_cpu());
    if (!t || em_init_normal_(t, 0.0, 1.0, NULL) != EM_OK) die("randn");
    return t;
}

static em_tensor *rand_ints(int nd, const int64_t *shape, em_dtype dt, uint32_t hi) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    int64_t *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = next_u32() % hi;
    em_tensor *t = em_from_data(v, nd, shape, EM_I64, em_cpu());
    free(v);
    return dt == EM_I64 ? t : em_to_dtype(t, dt);
}

/* A .npy file (version 1.0) of a contiguous CPU tensor. */
static void write_npy(const char *path, const em_tensor *t) {
    const char *descr = em_tensor_dtype(t) == EM_F32 ? "<f4" : em_tensor_dtype(t) == EM_I64 ? "<i8"
                                                                                             : "|u1";
    char shape[256] = "";
    size_t u = 0;
    for (int i = 0; i < em_tensor_ndim(t); i++)
        u += (size_t)snprintf(shape + u, sizeof shape - u, "%lld, ", (long long)em_tensor_size(t, i));
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, shape);
    int total = 10 + n + 1;
    int pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    uint16_t hl = (uint16_t)(n + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f);
    fputc(hl >> 8, f);
    fwrite(hdr, 1, (size_t)n, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t nb = em_tensor_nbytes(t);
    void *buf = malloc(nb);
    if (em_tensor_to_host(t, buf, nb) != EM_OK) die("to_host");
    fwrite(buf, 1, nb, f);
    free(buf);
    fclose(f);
}

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* ---- one model ---------------------------------------------------------------------------- */

typedef struct spec {
    const char *name;
    em_module *(*make)(void);
    int nd;                 /* input dims after the batch */
    int64_t shape[4];
    em_dtype dt;            /* the model input's dtype */
    bool pixels;            /* raw uint8 input, to_float + normalize as the first nodes */
    bool bitwise;           /* its import computes with the ops Ember's layers call */
    const char *no_import;  /* the importer refuses it with this message (no round trip) */
} spec;

static const double MEAN[1] = {0.1307}, STD[1] = {0.3081};

/* What the deployer feeds (raw) and what the model sees (after Ember's transforms). */
static em_tensor *make_input(const spec *s, int64_t batch, em_tensor **raw) {
    int64_t shape[5] = {batch};
    for (int i = 0; i < s->nd; i++) shape[i + 1] = s->shape[i];
    if (s->pixels) {
        *raw = rand_ints(s->nd + 1, shape, EM_U8, 256);
        /* Ember's to_float (x / 255 in float32) then normalize ((x - mean) / std) */
        em_tensor *x = em_div_scalar(em_to_dtype(*raw, EM_F32), 255.0);
        float m = (float)MEAN[0], sd = (float)STD[0];
        em_tensor *mt = em_from_data(&m, 1, (int64_t[]){1}, EM_F32, em_cpu());
        em_tensor *st = em_from_data(&sd, 1, (int64_t[]){1}, EM_F32, em_cpu());
        return em_div(em_sub(x, mt), st);
    }
    *raw = s->dt == EM_F32 ? randn(s->nd + 1, shape) : rand_ints(s->nd + 1, shape, s->dt, 20);
    return *raw;
}

static em_options *export_options(const spec *s, int opset) {
    em_options *o = em_options_new();
    em_options_set_int(o, "opset", opset);
    if (s->pixels) {
        em_options_set_string(o, "input_dtype", "uint8");
        em_options_set_float(o, "scale", 0);
        em_options_set_floats(o, "mean", 1, MEAN);
        em_options_set_floats(o, "std", 1, STD);
    }
    return o;
}

static void run_model(const spec *s, FILE *list) {
    em_scope_begin();
    em_module *m = s->make();
    /* running statistics worth the name: a few training batches */
    em_tensor *raw;
    for (int i = 0; i < 3; i++) {
        em_tensor *y = em_module_forward(m, make_input(s, 8, &raw));
        if (!y) die(s->name);
    }
    em_module_train(m, false);
    em_tensor *ex = make_input(s, 2, &raw);
    char path[4096], again[4096];
    for (int opset = 13; opset <= 17; opset++) {
        em_options *o = export_options(s, opset);
        snprintf(path, sizeof path, "%s/%s.op%d.onnx", dir, s->name, opset);
        if (em_onnx_export(m, 1, &ex, path, o) != EM_OK) die(path);
        if (opset == 17) { /* deterministic: the same bytes again */
            snprintf(again, sizeof again, "%s/%s.again.onnx", dir, s->name);
            if (em_onnx_export(m, 1, &ex, again, o) != EM_OK) die(again);
            size_t na, nb;
            void *a = read_file(path, &na), *b = read_file(again, &nb);
            if (!a || !b || na != nb || memcmp(a, b, na))
                FAIL("%s: two exports of the same model differ", s->name);
            free(a);
            free(b);
            remove(again);
        }
        em_options_free(o);
    }
    /* round trip: import the opset-17 file, export that: the same bytes; the same outputs */
    snprintf(path, sizeof path, "%s/%s.op17.onnx", dir, s->name);
    em_module *m2 = em_onnx_import(path, NULL);
    if (s->no_import) { /* the importer cannot express it: refused, naming the node */
        if (m2) FAIL("%s: imported, though Ember's importer has no such op", s->name);
        else if (!strstr(em_last_error(), s->no_import))
            FAIL("%s: the import's error \"%s\" does not say \"%s\"", s->name, em_last_error(),
                 s->no_import);
        em_module_free(m2);
        goto outputs;
    }
    if (!m2) die(path);
    em_module_train(m2, false);
    em_tensor *raw_ex;
    make_input(s, 2, &raw_ex);
    snprintf(again, sizeof again, "%s/%s.rt.onnx", dir, s->name);
    if (em_onnx_export(m2, 1, &raw_ex, again, NULL) != EM_OK) die(again);
    size_t na, nb;
    void *fa = read_file(path, &na), *fb = read_file(again, &nb);
    if (!fa || !fb || na != nb || memcmp(fa, fb, na))
        FAIL("%s: export, import, export: the files differ (%zu and %zu bytes)", s->name, na, nb);
    free(fa);
    free(fb);
    remove(again);
    em_grad_mode_push(EM_GRAD_DISABLED);
    for (int64_t batch = 1; batch <= 7; batch += 6) {
        em_tensor *x = make_input(s, batch, &raw);
        em_tensor *y = em_contiguous(em_module_forward(m, x)), *y2 = em_module_forward(m2, raw);
        if (!y || !y2) die(s->name);
        int64_t n = em_tensor_numel(y);
        float *p = malloc((size_t)n * sizeof *p), *q = malloc((size_t)n * sizeof *q);
        if (em_tensor_numel(y2) != n || em_tensor_to_host(y, p, (size_t)n * 4) != EM_OK ||
            em_tensor_to_host(em_contiguous(y2), q, (size_t)n * 4) != EM_OK)
            die("round trip outputs");
        for (int64_t i = 0; i < n; i++) {
            bool same = s->bitwise ? memcmp(&p[i], &q[i], 4) == 0
                                   : fabsf(p[i] - q[i]) <= 1e-6f + 1e-5f * fabsf(p[i]);
            if (!same) {
                FAIL("%s: the imported model's output %lld is %.9g, Ember's %.9g (%s)", s->name,
                     (long long)i, q[i], p[i], s->bitwise ? "bitwise" : "allclose");
                break;
            }
        }
        free(p);
        free(q);
    }
    em_grad_mode_pop();
    em_module_free(m2);
outputs:
    em_grad_mode_push(EM_GRAD_DISABLED);
    for (int64_t batch = 1; batch <= 7; batch += 6) {
        em_tensor *x = make_input(s, batch, &raw);
        em_tensor *y = em_module_forward(m, x);
        if (!y) die(s->name);
        snprintf(path, sizeof path, "%s/%s.b%lld.in.npy", dir, s->name, (long long)batch);
        write_npy(path, raw);
        snprintf(path, sizeof path, "%s/%s.b%lld.out.npy", dir, s->name, (long long)batch);
        write_npy(path, em_contiguous(y));
    }
    em_grad_mode_pop();
    /* the state-dict keys, which tests/onnx_check.py finds among the initializers' names */
    snprintf(path, sizeof path, "%s/%s.keys.txt", dir, s->name);
    FILE *kf = fopen(path, "w");
    em_dict *sd = em_module_state_dict(m);
    if (!kf || !sd) die(path);
    for (size_t i = 0; i < em_dict_len(sd); i++) fprintf(kf, "%s\n", em_dict_key(sd, i));
    fclose(kf);
    em_dict_free(sd);
    fprintf(list, "%s\n", s->name);
    em_module_free(m);
    em_scope_end();
}

/* ---- what this program checks itself ------------------------------------------------------ */

static bool has(const char *msg, const char *part) {
    if (strstr(msg, part)) return true;
    FAIL("the message \"%s\" does not say \"%s\"", msg, part);
    return false;
}

/* A program's own layer, with its own exporter: y = x * sigmoid(beta x). */
static em_tensor *swish_forward(em_module *m, em_tensor *const *in, int n) {
    (void)n;
    double beta = em_options_float(em_module_options(m), "beta");
    return em_mul(in[0], em_sigmoid(em_mul_scalar(in[0], beta)));
}
static const em_option_spec swish_opts[] = {
    {.name = "beta", .types = EM_OPT_FLOAT, .def = {.f = 1.5}, .help = "slope"},
};
static const em_module_class swish_class = {
    .struct_size = sizeof swish_class, .name = "test.Swish", .description = "x sigmoid(beta x)",
    .options = swish_opts, .n_options = 1, .forward = swish_forward, .n_inputs = 1,
};
static em_status swish_export(em_onnx_builder *b, em_module *m, const char *in,
                              const em_tensor *x, char *out) {
    (void)x;
    char beta[EM_ONNX_NAME_MAX], bx[EM_ONNX_NAME_MAX], s[EM_ONNX_NAME_MAX];
    em_tensor *c = em_scalar(em_options_float(em_module_options(m), "beta"), EM_F32);
    em_status st = b->constant(b, c, beta);
    if (st == EM_OK) st = b->node(b, "Mul", 2, (const char *[]){in, beta}, 0, NULL, bx);
    if (st == EM_OK) st = b->node(b, "Sigmoid", 1, (const char *[]){bx}, 0, NULL, s);
    return st == EM_OK ? b->node(b, "Mul", 2, (const char *[]){in, s}, 0, NULL, out) : st;
}
static const em_onnx_layer_class swish_export_class = {
    .struct_size = sizeof swish_export_class, .name = "test.Swish",
    .description = "Mul, Sigmoid, Mul", .export_layer = swish_export,
};
/* A program's layer registered without an exporter: 2 x. */
static em_tensor *twice_forward(em_module *m, em_tensor *const *in, int n) {
    (void)m;
    (void)n;
    return em_mul_scalar(in[0], 2.0);
}
static const em_module_class twice_class = {
    .struct_size = sizeof twice_class, .name = "test.Twice", .description = "2 x",
    .forward = twice_forward, .n_inputs = 1,
};
static em_module *swish_model(void) {
    return SEQ(layer("Linear", "in_features=5;out_features=4"), layer("test.Swish", NULL),
               layer("Linear", "in_features=4;out_features=2"));
}

static void self_checks(void) {
    em_scope_begin();
    char path[4096];
    struct stat sb;
    /* a layer without an exporter (a program's, registered with none): refused, naming it
     * and listing the exportable classes (the sequence layers among them), before anything
     * is written */
    em_module *conv1 = SEQ(layer("Linear", "in_features=4;out_features=6"),
                           SEQ(layer("ReLU", NULL), layer("test.Twice", NULL)));
    em_tensor *x = randn(2, (int64_t[]){3, 4});
    snprintf(path, sizeof path, "%s/refused.onnx", dir);
    em_status st = em_onnx_export(conv1, 1, &x, path, NULL);
    if (st != EM_ERR_NOTFOUND) FAIL("test.Twice exported (status %d)", (int)st);
    has(em_last_error(), "layer '1.1' (test.Twice) has no ONNX exporter");
    has(em_last_error(), "nothing was written");
    has(em_last_error(), "Linear, Conv2d, MaxPool2d");
    has(em_last_error(), "LSTMCell, GRUCell, MultiheadAttention, TransformerEncoderLayer, "
        "TransformerEncoder, PositionalEncoding, LearnedPositionalEncoding");
    if (stat(path, &sb) == 0) FAIL("%s exists after a refused export", path);
    /* variable_length (a model trained on padded batches): the layers that read the padding
     * mask are refused, naming the layer, as deep as they are; the cells (no mask) and the
     * positional encodings are not */
    em_options *vl = em_options_new();
    em_options_set_bool(vl, "variable_length", true);
    em_module *lm = charlm();
    em_tensor *tok = rand_ints(2, (int64_t[]){2, 6}, EM_I64, 20);
    if (em_onnx_export(lm, 1, &tok, path, vl) != EM_ERR_INVALID)
        FAIL("variable_length: a Transformer exported");
    has(em_last_error(), "layer '2.layers.0.self_attn' (MultiheadAttention) reads the padding "
        "mask");
    has(em_last_error(), "nothing was written");
    em_module *lstm = lstm_last();
    em_tensor *xs = randn(3, (int64_t[]){2, 6, 3});
    if (em_onnx_export(lstm, 1, &xs, path, vl) != EM_ERR_INVALID)
        FAIL("variable_length: an LSTM exported");
    has(em_last_error(), "layer '0' (LSTM) reads the padding mask");
    if (stat(path, &sb) == 0) FAIL("%s exists after a refused export", path);
    em_module *cell = lstm_cell();
    em_tensor *xc = randn(2, (int64_t[]){2, 3});
    if (em_onnx_export(cell, 1, &xc, path, vl) != EM_OK) die("variable_length: LSTMCell");
    remove(path);
    em_options_free(vl);
    /* attention that is not self-attention on one batched input: refused, naming the layer */
    em_module *kv = SEQ(layer("MultiheadAttention", "embed_dim=4;num_heads=2;kdim=3;vdim=3"));
    em_tensor *x3 = randn(3, (int64_t[]){5, 2, 4});
    if (em_onnx_export(kv, 1, &x3, path, NULL) == EM_OK) FAIL("kdim=3 attention exported");
    has(em_last_error(), "layer '0' (MultiheadAttention): kdim or vdim differs from embed_dim");
    em_module *mh = SEQ(layer("MultiheadAttention", "embed_dim=4;num_heads=2"));
    em_tensor *x2 = randn(2, (int64_t[]){5, 4});
    if (em_onnx_export(mh, 1, &x2, path, NULL) == EM_OK) FAIL("unbatched attention exported");
    has(em_last_error(), "layer '0' (MultiheadAttention): the example input has 2 dims");
    if (stat(path, &sb) == 0) FAIL("%s exists after a refused export", path);
    em_module_free(kv);
    em_module_free(mh);
    em_module_free(lm);
    em_module_free(lstm);
    em_module_free(cell);
    /* an option ONNX cannot express: named with the layer */
    em_module *bn = SEQ(layer("BatchNorm1d", "num_features=4;track_running_stats=false"));
    if (em_onnx_export(bn, 1, &x, path, NULL) == EM_OK) FAIL("untracked BatchNorm exported");
    has(em_last_error(), "layer '0' (BatchNorm1d): track_running_stats is false");
    /* an unbatched sequence: refused, naming the layer */
    em_module *rnn = SEQ(layer("GRU", "input_size=4;hidden_size=2"));
    if (em_onnx_export(rnn, 1, &x, path, NULL) == EM_OK) FAIL("unbatched GRU input exported");
    has(em_last_error(), "layer '0' (GRU): the example input has 2 dims");
    has(em_last_error(), "not an unbatched one");
    em_module_free(rnn);
    /* a bad option */
    em_options *o = em_options_new();
    em_options_set_int(o, "opset", 12);
    if (em_onnx_export(bn, 1, &x, path, o) != EM_ERR_INVALID) FAIL("opset 12 accepted");
    has(em_last_error(), "opset");
    em_options_free(o);
    if (stat(path, &sb) == 0) FAIL("%s exists after a refused export", path);
    /* transforms in the metadata only: tests/onnx_check.py reads it back */
    em_module *mm = mlp();
    em_tensor *xm = randn(4, (int64_t[]){2, 1, 8, 8});
    o = export_options(&(spec){.pixels = true}, 17);
    em_options_set_string(o, "transforms", "metadata");
    snprintf(path, sizeof path, "%s/meta.onnx", dir);
    if (em_onnx_export(mm, 1, &xm, path, o) != EM_OK) die(path);
    em_options_free(o);
    em_module_free(mm);
    em_module_free(conv1);
    em_module_free(bn);
    em_scope_end();
}

/* EMBER_DISABLE_PLUGINS=ember-onnx: both calls say ONNX support is not installed. */
static int absent(void) {
    if (em_init() != EM_OK) die("em_init");
    em_scope_begin();
    em_module *m = layer("ReLU", NULL);
    em_tensor *x = randn(2, (int64_t[]){1, 3});
    if (em_onnx_export(m, 1, &x, "/nonexistent/x.onnx", NULL) != EM_ERR_NOTFOUND)
        FAIL("export without the plugin did not fail with EM_ERR_NOTFOUND");
    has(em_last_error(), "ONNX support is not installed: the ember-onnx plugin");
    if (em_onnx_import("/nonexistent/x.onnx", NULL)) FAIL("import without the plugin");
    has(em_last_error(), "onnx_import: ONNX support is not installed");
    em_module_free(m);
    em_scope_end();
    if (em_shutdown_checked() != EM_OK) FAIL("%s", em_last_error());
    return failures ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: onnx_export DIR | --absent\n");
        return 2;
    }
    if (strcmp(argv[1], "--absent") == 0) return absent();
    dir = argv[1];
    if (em_init() != EM_OK) die("em_init");
    em_seed(7);
    if (em_module_class_register(em_registry_program(), &swish_class) != EM_OK ||
        em_class_register(em_registry_program(), EM_ONNX_LAYER_KIND, &swish_export_class) != EM_OK ||
        em_module_class_register(em_registry_program(), &twice_class) != EM_OK)
        die("register test.Swish");
#define UNSUPPORTED(op) "(" op ", opset 17): op type " op " is not supported by Ember's importer"
    static const spec specs[] = {
        {"mlp", mlp, 3, {1, 8, 8}, EM_F32, true, true, NULL},
        {"cnn", cnn, 3, {3, 12, 12}, EM_F32, false, false, NULL},
        {"cnn_fused", cnn_fused, 3, {3, 12, 12}, EM_F32, false, true, NULL},
        {"bn_dropout", bn_dropout, 3, {3, 8, 8}, EM_F32, false, false, NULL},
        {"residual", residual, 1, {12}, EM_F32, false, true, NULL},
        {"embed", embed, 1, {5}, EM_I64, false, false, NULL},
        {"swish", swish_model, 1, {5}, EM_F32, false, false, NULL},
        {"conv1d_gn", conv1d_gn, 2, {4, 16}, EM_F32, false, false,
         "(Conv, opset 17): attribute 'kernel_shape' has a wrong number of values"},
        {"deconv", deconv, 3, {3, 5, 5}, EM_F32, false, false, UNSUPPORTED("ConvTranspose")},
        {"lstm_seq", lstm_seq, 2, {5, 3}, EM_F32, false, false, UNSUPPORTED("LSTM")},
        {"lstm_cn", lstm_cn, 2, {4, 3}, EM_F32, false, false, UNSUPPORTED("LSTM")},
        {"lstm_last", lstm_last, 2, {6, 3}, EM_F32, false, false, UNSUPPORTED("LSTM")},
        {"lstm_hn", lstm_hn, 2, {3, 2}, EM_F32, false, false, UNSUPPORTED("LSTM")},
        {"gru_seq", gru_seq, 2, {5, 3}, EM_F32, false, false, UNSUPPORTED("GRU")},
        {"gru_hn", gru_hn, 2, {4, 3}, EM_F32, false, false, UNSUPPORTED("GRU")},
        {"gru_last", gru_last, 2, {6, 3}, EM_F32, false, false, UNSUPPORTED("GRU")},
        {"gru_t", gru_t, 2, {2, 2}, EM_F32, false, false, UNSUPPORTED("GRU")},
        {"lstm_cell", lstm_cell, 1, {3}, EM_F32, false, false, UNSUPPORTED("LSTM")},
        {"lstm_cell_c", lstm_cell_c, 1, {3}, EM_F32, false, false, UNSUPPORTED("LSTM")},
        {"gru_cell", gru_cell, 1, {4}, EM_F32, false, false, UNSUPPORTED("GRU")},
        {"mha_bf", mha_bf, 2, {5, 8}, EM_F32, false, false, NULL},
        {"mha_causal", mha_causal, 2, {3, 8}, EM_F32, false, false, NULL},
        {"enc_post", enc_post, 2, {6, 8}, EM_F32, false, false, NULL},
        {"enc_pre", enc_pre, 2, {3, 8}, EM_F32, false, false, NULL},
        {"charlm", charlm, 1, {6}, EM_I64, false, false, NULL},
        {"lpe_t", lpe_t, 2, {3, 4}, EM_F32, false, false, NULL},
        {"cnn_pool_fused", cnn_pool_fused, 3, {3, 12, 12}, EM_F32, false, true, NULL},
    };
    char path[4096];
    snprintf(path, sizeof path, "%s/models.txt", dir);
    FILE *list = fopen(path, "w");
    if (!list) {
        perror(path);
        return 1;
    }
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) run_model(&specs[i], list);
    fclose(list);
    self_checks();
    if (em_shutdown_checked() != EM_OK) {
        fprintf(stderr, "onnx_export: %s\n", em_last_error());
        return 1;
    }
    return failures ? 1 : 0;
}
