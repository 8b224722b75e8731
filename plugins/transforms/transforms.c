/*
 * transforms.c — the ember-transforms plugin: the built-in transform classes of
 * ember/transform.h, registered into the "transform" kind with typed options.
 *
 *   to_float    any dtype -> float32: uint8 with scale 0 is x / 255 in float32 (torchvision's
 *               ToTensor), otherwise float32(x) * float32(scale) (scale 0: 1)
 *   normalize   float32 (C, ...) -> (x - mean[c]) / std[c] in float32 (torchvision's
 *               Normalize; one value of mean/std applies to every channel)
 *   random_crop (C, H, W) of any dtype: zero padding by `padding`, a random (H, W) window
 *   hflip       (C, H, W) of any dtype: mirrored left-right with probability p
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/options.h"
#include "ember/plugin.h"
#include "ember/tensor.h"
#include "ember/transform.h"
#include "ember/version.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TO_FLOAT_SIMD 1
#endif

static const char *shape_text(const em_transform_layout *l, char *buf, size_t cap) {
    size_t at = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < l->ndim && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", d ? ", " : "", (long long)l->shape[d]);
    if (at < cap) snprintf(buf + at, cap - at, ")");
    return buf;
}

/* Crop and flip work on (C, H, W) items. */
static em_status need_chw(const char *cls, const char *what, const char *field,
                          const em_transform_layout *in) {
    if (in->ndim == 3) return EM_OK;
    char s[96];
    return em_set_error(EM_ERR_SHAPE, "transform '%s' on field '%s': %s need items of shape "
                        "(C, H, W); the field's items are %s", cls, field, what,
                        shape_text(in, s, sizeof s));
}

static size_t layout_bytes(const em_transform_layout *l) {
    return (size_t)em_transform_layout_numel(l) * em_dtype_size(l->dtype);
}

/* ---- to_float ----------------------------------------------------------------------------- */

static const em_option_spec to_float_opts[] = {
    {.name = "scale", .types = EM_OPT_FLOAT, .def = {.f = 0.0}, .has_range = true, .min = 0,
     .max = 1e30, .help = "multiply by this; 0: divide uint8 by 255 (ToTensor), else 1"},
};

typedef void (*u8_loop)(const uint8_t *r, float *o, int64_t n, float scale, bool div255);

typedef struct to_float_state {
    float scale;
    bool div255; /* uint8 with scale 0: x / 255 */
    /* uint8 items: the 256 results, each computed as the loop would (x / 255 or x * scale):
     * a load per byte instead of a conversion and a division, the same bits; the scalar
     * loop's (a CPU without AVX2, an item's last elements) */
    float u8[256];
    u8_loop simd; /* NULL: the table for every element */
    int width;    /* the elements simd converts per vector */
} to_float_state;

/* uint8 items on AVX-512 / AVX2: 16 (8) bytes widened to int32, converted to float32 (exact:
 * 0..255) and divided by 255 (or multiplied by the scale) in float32, a correctly rounded
 * division or product like the scalar one, so the bits are the table's (tests/
 * test_transforms.c checks every byte value in every lane and in the tail). The table's
 * loop, a load and a store per byte, was 8.0-10.0% of a Fashion-MNIST epoch's CPU samples on
 * Zen 4 (`perf record` of ember-train, the loader thread, four runs); this is 7.1-8.3%
 * written in place, bound by the stores, and 1.3-1.9% where the loader streams the items
 * (core/loader.c, stream_copy). The elements past the last full vector are the caller's. */
#ifdef TO_FLOAT_SIMD
__attribute__((target("avx512f"))) static void u8_avx512(const uint8_t *r, float *o, int64_t n,
                                                         float scale, bool div255) {
    const __m512 k = _mm512_set1_ps(div255 ? 255.0f : scale);
    for (int64_t i = 0; i + 16 <= n; i += 16) {
        __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)(r + i))));
        _mm512_storeu_ps(o + i, div255 ? _mm512_div_ps(x, k) : _mm512_mul_ps(x, k));
    }
}
__attribute__((target("avx2"))) static void u8_avx2(const uint8_t *r, float *o, int64_t n,
                                                    float scale, bool div255) {
    const __m256 k = _mm256_set1_ps(div255 ? 255.0f : scale);
    for (int64_t i = 0; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)(r + i))));
        _mm256_storeu_ps(o + i, div255 ? _mm256_div_ps(x, k) : _mm256_mul_ps(x, k));
    }
}
#endif

static em_status to_float_layout(const em_options *o, const char *field,
                                 const em_transform_layout *in, em_transform_layout *out) {
    (void)o, (void)field;
    *out = *in;
    out->dtype = EM_F32;
    return EM_OK;
}

static em_status to_float_init(const em_options *o, const em_transform_layout *in,
                               const em_transform_layout *out, void **state) {
    (void)in, (void)out;
    to_float_state *s = malloc(sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "transform 'to_float': out of memory");
    double scale = em_options_float(o, "scale");
    s->scale = scale == 0 ? 1.0f : (float)scale;
    s->div255 = scale == 0;
    for (int v = 0; v < 256; v++)
        s->u8[v] = scale == 0 ? (float)v / 255.0f : (float)v * s->scale;
    s->simd = NULL;
    s->width = 0;
#ifdef TO_FLOAT_SIMD
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        s->simd = u8_avx512, s->width = 16;
    else if (__builtin_cpu_supports("avx2"))
        s->simd = u8_avx2, s->width = 8;
#endif
    *state = s;
    return EM_OK;
}

static em_status to_float_apply(void *state, const em_transform_layout *in, const void *src,
                                const em_transform_layout *out, void *dst,
                                em_transform_rng *rng) {
    (void)out, (void)rng;
    const to_float_state *s = state;
    int64_t n = em_transform_layout_numel(in);
    float *o = dst;
    if (in->dtype == EM_U8) {
        const uint8_t *r = src;
        int64_t i = 0;
        if (s->simd) {
            s->simd(r, o, n, s->scale, s->div255);
            i = n / s->width * s->width;
        }
        for (; i < n; i++) o[i] = s->u8[r[i]];
    } else if (in->dtype == EM_F32) {
        const float *r = src;
        for (int64_t i = 0; i < n; i++) o[i] = r[i] * s->scale;
    } else {
        for (int64_t i = 0; i < n; i++) o[i] = (float)em_dtype_load(in->dtype, src, i) * s->scale;
    }
    return EM_OK;
}

/* ---- normalize ---------------------------------------------------------------------------- */

static const em_option_spec normalize_opts[] = {
    {.name = "mean", .types = EM_OPT_FLOATS, .required = true,
     .help = "per-channel means (one value: every channel)"},
    {.name = "std", .types = EM_OPT_FLOATS, .required = true, .has_range = true, .min = 1e-30,
     .max = 1e30, .help = "per-channel standard deviations > 0 (one value: every channel)"},
};

typedef struct normalize_state {
    int64_t channels, per_channel;
    float mean[EM_OPT_MAX_LIST], std[EM_OPT_MAX_LIST];
    int n;  /* entries of mean/std: 1 or channels */
} normalize_state;

static em_status normalize_layout(const em_options *o, const char *field,
                                  const em_transform_layout *in, em_transform_layout *out) {
    char s[96];
    if (in->dtype != EM_F32)
        return em_set_error(EM_ERR_DTYPE, "transform 'normalize' on field '%s': needs float32 "
                            "items, the field's are %s (list to_float before it)", field,
                            em_dtype_name(in->dtype));
    if (in->ndim < 1)
        return em_set_error(EM_ERR_SHAPE, "transform 'normalize' on field '%s': needs items "
                            "of shape (C, ...); the field's items are %s", field,
                            shape_text(in, s, sizeof s));
    double v[EM_OPT_MAX_LIST];
    int nm = em_options_floats(o, "mean", v, EM_OPT_MAX_LIST);
    int ns = em_options_floats(o, "std", v, EM_OPT_MAX_LIST);
    int64_t C = in->shape[0];
    if (nm != ns || (nm != 1 && nm != C))
        return em_set_error(EM_ERR_SHAPE, "transform 'normalize' on field '%s': option 'mean' "
                            "has %d values and 'std' %d; items %s need 1 or %lld (one per "
                            "channel, dim 0) of each", field, nm, ns,
                            shape_text(in, s, sizeof s), (long long)C);
    *out = *in;
    return EM_OK;
}

static em_status normalize_init(const em_options *o, const em_transform_layout *in,
                                const em_transform_layout *out, void **state) {
    (void)out;
    normalize_state *s = malloc(sizeof *s);
    if (!s) return em_set_error(EM_ERR_NOMEM, "transform 'normalize': out of memory");
    double m[EM_OPT_MAX_LIST], d[EM_OPT_MAX_LIST];
    s->n = em_options_floats(o, "mean", m, EM_OPT_MAX_LIST);
    em_options_floats(o, "std", d, EM_OPT_MAX_LIST);
    for (int c = 0; c < s->n; c++) s->mean[c] = (float)m[c], s->std[c] = (float)d[c];
    s->channels = in->shape[0];
    s->per_channel = s->channels ? em_transform_layout_numel(in) / s->channels : 0;
    *state = s;
    return EM_OK;
}

static em_status normalize_apply(void *state, const em_transform_layout *in, const void *src,
                                 const em_transform_layout *out, void *dst,
                                 em_transform_rng *rng) {
    (void)in, (void)out, (void)rng;
    const normalize_state *s = state;
    const float *r = src;
    float *o = dst;
    for (int64_t c = 0; c < s->channels; c++) {
        float m = s->mean[s->n == 1 ? 0 : c], sd = s->std[s->n == 1 ? 0 : c];
        const float *rc = r + c * s->per_channel;
        float *oc = o + c * s->per_channel;
        for (int64_t i = 0; i < s->per_channel; i++) oc[i] = (rc[i] - m) / sd;
    }
    return EM_OK;
}

/* ---- random_crop -------------------------------------------------------------------------- */

static const em_option_spec crop_opts[] = {
    {.name = "padding", .types = EM_OPT_INT, .def = {.i = 0}, .has_range = true, .min = 0,
     .max = 1 << 20, .help = "zero padding on each side before cropping back to (H, W)"},
};

static em_status crop_layout(const em_options *o, const char *field,
                             const em_transform_layout *in, em_transform_layout *out) {
    (void)o;
    em_status st = need_chw("random_crop", "crops", field, in);
    if (st != EM_OK) return st;
    *out = *in;
    return EM_OK;
}

static em_status crop_init(const em_options *o, const em_transform_layout *in,
                           const em_transform_layout *out, void **state) {
    (void)in, (void)out;
    int64_t *p = malloc(sizeof *p);
    if (!p) return em_set_error(EM_ERR_NOMEM, "transform 'random_crop': out of memory");
    *p = em_options_int(o, "padding");
    *state = p;
    return EM_OK;
}

static em_status crop_apply(void *state, const em_transform_layout *in, const void *src,
                            const em_transform_layout *out, void *dst, em_transform_rng *rng) {
    (void)out;
    int64_t p = *(const int64_t *)state;
    int64_t dy = (int64_t)em_transform_rng_below(rng, (uint64_t)(2 * p + 1)) - p;
    int64_t dx = (int64_t)em_transform_rng_below(rng, (uint64_t)(2 * p + 1)) - p;
    if (p == 0) { /* drawn all the same: the words after it do not depend on the padding */
        memcpy(dst, src, layout_bytes(in));
        return EM_OK;
    }
    int64_t C = in->shape[0], H = in->shape[1], W = in->shape[2];
    size_t es = em_dtype_size(in->dtype);
    /* Output (y, x) reads input (y + dy, x + dx): columns [x0, x1) come from inside. */
    int64_t x0 = dx < 0 ? -dx : 0, x1 = dx > 0 ? W - dx : W;
    if (x1 < x0) x1 = x0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < H; y++) {
            char *o = (char *)dst + (size_t)((c * H + y) * W) * es;
            int64_t sy = y + dy;
            if (sy < 0 || sy >= H || x0 >= W || x1 <= 0) {
                memset(o, 0, (size_t)W * es);
                continue;
            }
            const char *r = (const char *)src + (size_t)((c * H + sy) * W) * es;
            memset(o, 0, (size_t)x0 * es);
            memcpy(o + (size_t)x0 * es, r + (size_t)(x0 + dx) * es, (size_t)(x1 - x0) * es);
            memset(o + (size_t)x1 * es, 0, (size_t)(W - x1) * es);
        }
    return EM_OK;
}

/* ---- hflip -------------------------------------------------------------------------------- */

static const em_option_spec hflip_opts[] = {
    {.name = "p", .types = EM_OPT_FLOAT, .def = {.f = 0.5}, .has_range = true, .min = 0,
     .max = 1, .help = "probability of a flip"},
};

static em_status hflip_layout(const em_options *o, const char *field,
                              const em_transform_layout *in, em_transform_layout *out) {
    (void)o;
    em_status st = need_chw("hflip", "flips", field, in);
    if (st != EM_OK) return st;
    *out = *in;
    return EM_OK;
}

static em_status hflip_init(const em_options *o, const em_transform_layout *in,
                            const em_transform_layout *out, void **state) {
    (void)in, (void)out;
    uint64_t *t = malloc(sizeof *t);
    if (!t) return em_set_error(EM_ERR_NOMEM, "transform 'hflip': out of memory");
    /* flip when the draw w >= (1 - p) * 2^32: p = 0.5 is w >> 31, p = 1 always, p = 0 never */
    *t = (uint64_t)ldexp(1.0 - em_options_float(o, "p"), 32);
    *state = t;
    return EM_OK;
}

static em_status hflip_apply(void *state, const em_transform_layout *in, const void *src,
                             const em_transform_layout *out, void *dst, em_transform_rng *rng) {
    bool flip = (uint64_t)em_transform_rng_next(rng) >= *(const uint64_t *)state;
    if (!flip) {
        memcpy(dst, src, layout_bytes(out));
        return EM_OK;
    }
    int64_t rows = in->shape[0] * in->shape[1], W = in->shape[2];
    size_t es = em_dtype_size(in->dtype);
    if (es == 1) {
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *s = (const uint8_t *)src + r * W;
            uint8_t *o = (uint8_t *)dst + r * W;
            for (int64_t x = 0; x < W; x++) o[x] = s[W - 1 - x];
        }
    } else if (es == 4) {
        for (int64_t r = 0; r < rows; r++) {
            const uint32_t *s = (const uint32_t *)src + r * W;
            uint32_t *o = (uint32_t *)dst + r * W;
            for (int64_t x = 0; x < W; x++) o[x] = s[W - 1 - x];
        }
    } else {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t x = 0; x < W; x++)
                memcpy((char *)dst + (size_t)(r * W + x) * es,
                       (const char *)src + (size_t)(r * W + W - 1 - x) * es, es);
    }
    return EM_OK;
}

/* ---- registration ------------------------------------------------------------------------- */

static const em_transform_class classes[] = {
    {.struct_size = sizeof(em_transform_class), .name = "to_float",
     .description = "to float32: uint8 / 255 (ToTensor), or x * scale",
     .options = to_float_opts, .n_options = 1, .layout = to_float_layout,
     .init = to_float_init, .apply = to_float_apply, .free = free},
    {.struct_size = sizeof(em_transform_class), .name = "normalize",
     .description = "(x - mean[c]) / std[c] per channel (Normalize)",
     .options = normalize_opts, .n_options = 2, .layout = normalize_layout,
     .init = normalize_init, .apply = normalize_apply, .free = free},
    {.struct_size = sizeof(em_transform_class), .name = "random_crop",
     .description = "random (H, W) crop of the item zero-padded by `padding` (RandomCrop)",
     .options = crop_opts, .n_options = 1, .layout = crop_layout, .init = crop_init,
     .apply = crop_apply, .free = free},
    {.struct_size = sizeof(em_transform_class), .name = "hflip",
     .description = "mirror left-right with probability p (RandomHorizontalFlip)",
     .options = hflip_opts, .n_options = 1, .layout = hflip_layout, .init = hflip_init,
     .apply = hflip_apply, .free = free},
};

static em_status transforms_register(em_registry *r) {
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++) {
        em_status st = em_transform_class_register(r, &classes[i]);
        if (st != EM_OK) return st;
    }
    return EM_OK;
}

static const em_plugin_descriptor transforms_plugin = {
    .struct_size = sizeof(em_plugin_descriptor),
    .abi_major = EM_PLUGIN_ABI_MAJOR,
    .name = "ember-transforms",
    .version = EM_VERSION_STRING,
    .description = "data transforms: to_float, normalize, random_crop, hflip",
    .register_fn = transforms_register,
};

EM_PLUGIN_EXPORT const em_plugin_descriptor *ember_plugin_entry(void) {
    return &transforms_plugin;
}
