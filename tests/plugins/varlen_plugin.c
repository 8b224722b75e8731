/*
 * varlen_plugin.c — a test plugin ("ember-test-varlen") for items as named fields:
 *   - the dataset class "test-varlen", whose items (varlen.h) have a variable-length float32
 *     sequence "seq", a variable-length uint8 "marks" whose variable dim is not the first and
 *     whose padding is not zero, and an int64 "label": registered with open_fields and
 *     read_fields (the 1.1 record);
 *   - the layer "testvl.MaskedMean" (takes_mask): x (B, L, D) and the padding mask (B, L) give
 *     the mean of each item's real positions, (B, D); its forward fails without a mask, so a
 *     model that runs shows the mask reached it.
 * tests/test_fields.c and tests/test_trainer.c load it through EMBER_PLUGIN_PATH.
 */
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

#include "varlen.h"

typedef struct vl_state {
    int64_t length, max_len, dim, classes;
    em_field f[3]; /* the layout points here: the core reads it after open returns */
} vl_state;

static const em_option_spec vl_opts[] = {
    {.name = "length", .types = EM_OPT_INT, .def = {.i = 37}, .has_range = true, .min = 1,
     .max = 1e6, .help = "items"},
    {.name = "max_len", .types = EM_OPT_INT, .def = {.i = 9}, .has_range = true, .min = 1,
     .max = 256, .help = "longest sequence"},
    {.name = "dim", .types = EM_OPT_INT, .def = {.i = 3}, .has_range = true, .min = 1,
     .max = 64, .help = "features per position"},
    {.name = "classes", .types = EM_OPT_INT, .def = {.i = 3}, .has_range = true, .min = 1,
     .max = 100, .help = "label classes"},
    {.name = "path", .types = EM_OPT_STRING, .def = {.s = ""}, .help = "unused (the trainer's "
     "--data)"},
};

static em_status vl_open(const em_options *o, em_dataset_layout *lay, void **state) {
    vl_state *s = calloc(1, sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "test-varlen: out of memory");
    s->length = em_options_int(o, "length");
    s->max_len = em_options_int(o, "max_len");
    s->dim = em_options_int(o, "dim");
    s->classes = em_options_int(o, "classes");
    em_field *f = s->f;
    const em_field decl[3] = {
        {.struct_size = sizeof f[0], .name = "seq", .dtype = EM_F32, .ndim = 2,
         .shape = {s->max_len, s->dim}, .variable = true, .var_dim = 0},
        {.struct_size = sizeof f[0], .name = "marks", .dtype = EM_U8, .ndim = 2,
         .shape = {2, s->max_len}, .variable = true, .var_dim = 1, .pad_value = 7},
        {.struct_size = sizeof f[0], .name = "label", .dtype = EM_I64, .ndim = 0,
         .num_classes = s->classes},
    };
    memcpy(f, decl, sizeof decl);
    lay->length = s->length;
    lay->fields = f;
    lay->n_fields = 3;
    *state = s;
    return EM_OK;
}

static em_status vl_read(void *state, const int64_t *idx, int64_t n, void *const *data,
                         int64_t *const *lengths) {
    const vl_state *s = state;
    for (int64_t j = 0; j < n; j++) {
        int64_t i = idx[j];
        float *seq = (float *)data[0] + j * s->max_len * s->dim;
        int64_t len = vl_seq_len(i, s->max_len);
        for (int64_t t = 0; t < len; t++)
            for (int64_t d = 0; d < s->dim; d++) seq[t * s->dim + d] = vl_seq(i, t, d);
        lengths[0][j] = len;
        uint8_t *mk = (uint8_t *)data[1] + j * 2 * s->max_len;
        int64_t len2 = vl_marks_len(i, s->max_len);
        for (int64_t r = 0; r < 2; r++) /* contiguous in its own shape (2, len2) */
            for (int64_t t = 0; t < len2; t++) mk[r * len2 + t] = vl_marks(i, r, t);
        lengths[1][j] = len2;
        ((int64_t *)data[2])[j] = vl_label(i, s->max_len, s->classes);
    }
    return EM_OK;
}

static void vl_close(void *state) { free(state); }

static const em_dataset_class_def vl_class = {
    .struct_size = sizeof vl_class, .name = "test-varlen",
    .description = "random-length sequences (a test plugin)", .options = vl_opts,
    .n_options = 5, .close = vl_close, .open_fields = vl_open, .read_fields = vl_read,
};

static em_tensor *mm_forward(em_module *m, em_tensor *const *in, int n) {
    (void)m;
    if (n != 2) {
        em_set_error(EM_ERR_INVALID, "testvl.MaskedMean: no padding mask (run the model under "
                     "em_module_forward_masked)");
        return NULL;
    }
    em_tensor *w = em_to_dtype(in[1], EM_F32);          /* (B, L) */
    em_tensor *s = em_sum(em_mul(in[0], em_unsqueeze(w, -1)), 1, (int[]){1}, false);
    const double one = 1.0;
    em_tensor *c = em_clamp(em_sum(w, 1, (int[]){1}, true), &one, NULL); /* (B, 1) */
    return em_div(s, c);                                 /* (B, D) */
}

static const em_module_class mm_class = {
    .struct_size = sizeof mm_class, .name = "testvl.MaskedMean",
    .description = "mean over the real positions (a test plugin's masked layer)",
    .forward = mm_forward, .n_inputs = 1, .takes_mask = true,
};

static em_status reg(em_registry *r) {
    em_status st = em_dataset_class_register(r, &vl_class);
    return st == EM_OK ? em_module_class_register(r, &mm_class) : st;
}

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR, .name = "ember-test-varlen",
    .version = "1.0", .description = "variable-length items and a masked layer",
    .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }
