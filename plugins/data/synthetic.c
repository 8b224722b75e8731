/*
 * synthetic.c — dataset class "synthetic": random inputs of a given shape and random class
 * labels, for benchmarks and smoke tests. Item i is a pure function of (seed, i), so any read
 * order and any number of threads give the same data:
 *     input element j (float32): em_philox_uniform_f32(seed, i * B, j), B = ceil(numel / 4)
 *     input element j (uint8):   the top 8 bits of the same stream's word j
 *     label: word 0 of em_philox_block(~seed, i), multiplied by classes, high 32 bits
 * Items are the fields "input" (the shape, float32 or uint8) and "target" (an int64 label).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/data.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/options.h"
#include "ember/random.h"
#include "ember/tensor.h"
#include "data.h"

static const char *const syn_dtypes[] = {"float32", "uint8", NULL};
static const em_option_spec syn_options[] = {
    {.name = "length", .types = EM_OPT_INT, .def = {.i = 1024}, .has_range = true, .min = 0,
     .max = 1e12, .help = "number of items"},
    {.name = "shape", .types = EM_OPT_INTS | EM_OPT_STRING, .def_type = EM_OPT_INTS,
     .def = {.n = 3, .ints = {1, 28, 28}}, .has_range = true, .min = 1, .max = 1e12,
     .help = "item input shape: a list of dims, e.g. [3, 32, 32] or 64, or text 3x32x32"},
    {.name = "classes", .types = EM_OPT_INT, .def = {.i = 10}, .has_range = true, .min = 1,
     .max = 1e9, .help = "labels lie in [0, classes)"},
    {.name = "seed", .types = EM_OPT_INT, .def = {.i = 0}, .has_range = true, .min = 0,
     .max = 9.2e18, .help = "Philox seed of the data"},
    {.name = "dtype", .types = EM_OPT_STRING, .def = {.s = "float32"}, .choices = syn_dtypes,
     .help = "input dtype (uniform [0, 1) or [0, 255])"},
};

typedef struct syn_state {
    em_field fields[2]; /* "input", "target" (read by the core after open) */
    uint64_t seed;
    int64_t numel, classes;
    bool u8;
} syn_state;

static em_status syn_open(const em_options *o, em_dataset_layout *lay, void **out) {
    int64_t dims[EM_OPT_MAX_LIST > EM_MAX_DIMS ? EM_OPT_MAX_LIST : EM_MAX_DIMS];
    int nd = 0;
    if (em_options_type(o, "shape") == EM_OPT_INTS) {
        nd = em_options_ints(o, "shape", dims, EM_OPT_MAX_LIST); /* each >= 1 (the range) */
        if (nd > EM_MAX_DIMS - 1)
            return em_set_error(EM_ERR_INVALID, "dataset 'synthetic': option 'shape' has %d "
                                "dims (at most %d)", nd, EM_MAX_DIMS - 1);
    }
    const char *shape = nd ? "" : em_options_string(o, "shape");
    for (const char *q = shape; *q;) {
        char *end;
        long long d = strtoll(q, &end, 10);
        if (end == q || d <= 0 || (*end && *end != 'x') || nd == EM_MAX_DIMS - 1)
            return em_set_error(EM_ERR_INVALID, "dataset 'synthetic': option 'shape' = '%s' is "
                                "not positive dims joined by 'x' (at most %d), e.g. 1x28x28",
                                shape, EM_MAX_DIMS - 1);
        dims[nd++] = d;
        q = *end ? end + 1 : end;
    }
    if (nd == 0)
        return em_set_error(EM_ERR_INVALID, "dataset 'synthetic': option 'shape' is empty");
    syn_state *s = calloc(1, sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "synthetic: out of memory");
    s->seed = (uint64_t)em_options_int(o, "seed");
    s->classes = em_options_int(o, "classes");
    s->u8 = strcmp(em_options_string(o, "dtype"), "uint8") == 0;
    s->numel = 1;
    for (int d = 0; d < nd; d++) s->numel *= dims[d];
    dt_declare_io(lay, s->fields, em_options_int(o, "length"), s->u8 ? EM_U8 : EM_F32, nd, dims,
                  s->classes, 0);
    *out = s;
    return EM_OK;
}

static em_status syn_read(void *state, const int64_t *idx, int64_t n, void *const *data,
                          int64_t *const *lengths) {
    (void)lengths; /* both fields are fixed */
    const syn_state *s = state;
    void *in = data[0], *tg = data[1];
    uint64_t blocks = (uint64_t)(s->numel + 3) / 4;
    for (int64_t j = 0; j < n; j++) {
        uint64_t off = (uint64_t)idx[j] * blocks;
        if (s->u8) {
            uint8_t *p = (uint8_t *)in + (size_t)j * (size_t)s->numel;
            for (int64_t b = 0; b < (int64_t)blocks; b++) {
                uint32_t w[4];
                em_philox_block(s->seed, off + (uint64_t)b, w);
                for (int k = 0; k < 4 && b * 4 + k < s->numel; k++) p[b * 4 + k] = (uint8_t)(w[k] >> 24);
            }
        } else {
            float *p = (float *)in + (size_t)j * (size_t)s->numel;
            for (int64_t e = 0; e < s->numel; e++)
                p[e] = em_philox_uniform_f32(s->seed, off, (uint64_t)e);
        }
        uint32_t w[4];
        em_philox_block(~s->seed, (uint64_t)idx[j], w);
        ((int64_t *)tg)[j] = (int64_t)(((uint64_t)w[0] * (uint64_t)s->classes) >> 32);
    }
    return EM_OK;
}

static void syn_close(void *state) { free(state); }

em_status dt_register_synthetic(em_registry *r) {
    em_dataset_class_def d = {
        .struct_size = sizeof d, .name = "synthetic",
        .description = "random inputs of a given shape and random labels (Philox), for "
                       "benchmarks",
        .options = syn_options, .n_options = (int)(sizeof syn_options / sizeof syn_options[0]),
        .open_fields = syn_open, .read_fields = syn_read, .close = syn_close};
    return em_dataset_class_register(r, &d);
}
