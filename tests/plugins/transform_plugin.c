/*
 * transform_plugin.c — a test plugin ("ember-test-transforms") registering one transform
 * class of its own, "test_window": a (C, H, W) item becomes the (C, size, size) window at a
 * random position (y0 = below(H - size + 1), then x0 = below(W - size + 1), from the item's
 * stream), scaled by `gain` for float32 items. It changes the item's shape, draws from the
 * stream and has typed options: test_transforms.c checks it against a plain loop over the
 * Philox words, and test_trainer.c uses it by name from a YAML config through ember-train.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

static const em_option_spec window_opts[] = {
    {.name = "size", .types = EM_OPT_INT, .required = true, .has_range = true, .min = 1,
     .max = 1 << 20, .help = "side of the square window"},
    {.name = "gain", .types = EM_OPT_FLOAT, .def = {.f = 1.0}, .help = "float32 items: times this"},
};

typedef struct window_state {
    int64_t size;
    float gain;
} window_state;

static em_status window_layout(const em_options *o, const char *field,
                               const em_transform_layout *in, em_transform_layout *out) {
    int64_t k = em_options_int(o, "size");
    if (in->ndim != 3 || in->shape[1] < k || in->shape[2] < k) {
        char s[96];
        int at = snprintf(s, sizeof s, "(");
        for (int d = 0; d < in->ndim && at < (int)sizeof s; d++)
            at += snprintf(s + at, sizeof s - (size_t)at, "%s%lld", d ? ", " : "",
                           (long long)in->shape[d]);
        return em_set_error(EM_ERR_SHAPE, "transform 'test_window' on field '%s': needs items "
                            "(C, H, W) with H, W >= size %lld; the field's items are %s)", field,
                            (long long)k, s);
    }
    *out = *in;
    out->shape[1] = out->shape[2] = k;
    return EM_OK;
}

static em_status window_init(const em_options *o, const em_transform_layout *in,
                             const em_transform_layout *out, void **state) {
    (void)in, (void)out;
    window_state *s = malloc(sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "test_window: out of memory");
    s->size = em_options_int(o, "size");
    s->gain = (float)em_options_float(o, "gain");
    *state = s;
    return EM_OK;
}

static em_status window_apply(void *state, const em_transform_layout *in, const void *src,
                              const em_transform_layout *out, void *dst, em_transform_rng *rng) {
    (void)out;
    const window_state *s = state;
    int64_t C = in->shape[0], H = in->shape[1], W = in->shape[2], k = s->size;
    int64_t y0 = (int64_t)em_transform_rng_below(rng, (uint64_t)(H - k + 1));
    int64_t x0 = (int64_t)em_transform_rng_below(rng, (uint64_t)(W - k + 1));
    size_t es = em_dtype_size(in->dtype);
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < k; y++) {
            const char *r = (const char *)src + (size_t)((c * H + y0 + y) * W + x0) * es;
            char *o = (char *)dst + (size_t)((c * k + y) * k) * es;
            memcpy(o, r, (size_t)k * es);
            if (in->dtype == EM_F32)
                for (int64_t x = 0; x < k; x++) ((float *)o)[x] *= s->gain;
        }
    return EM_OK;
}

static const em_transform_class window_class = {
    .struct_size = sizeof window_class, .name = "test_window",
    .description = "a random (C, size, size) window", .options = window_opts, .n_options = 2,
    .layout = window_layout, .init = window_init, .apply = window_apply, .free = free};

static em_status reg(em_registry *r) { return em_transform_class_register(r, &window_class); }

static const em_plugin_descriptor desc = {
    .struct_size = sizeof desc, .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-test-transforms", .version = "1.0",
    .description = "a transform class of a plugin (test_window)", .register_fn = reg,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) { return &desc; }
