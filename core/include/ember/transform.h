/*
 * ember/transform.h — per-item data transforms as classes: the "transform" kind of the class
 * registry (ember/plugin.h).
 *
 * A transform class (to_float, normalize, random_crop, hflip from the ember-transforms plugin,
 * or a plugin's or program's own) maps one field of one dataset item to a new value: it
 * declares typed options (ember/options.h), says what it makes of a field of a given dtype and
 * shape (or refuses it), and applies itself to one item's buffer at a time, drawing its random
 * choices from the item's own stream (the same seed gives the same batches, whatever the
 * number of workers). The DataLoader applies, for each field, the transforms naming that
 * field in the order they are listed (em_loader_options.transform_specs, ember/data.h; the
 * trainer's data.transforms list, trainer/README.md).
 *
 *     // A class of one's own: add a constant to every element of a float32 field.
 *     static const em_option_spec add_opts[] = {
 *         {.name = "value", .types = EM_OPT_FLOAT, .def = {.f = 1.0}, .help = "what to add"},
 *     };
 *     static em_status add_layout(const em_options *o, const char *field,
 *                                 const em_transform_layout *in, em_transform_layout *out) {
 *         (void)o;
 *         if (in->dtype != EM_F32)
 *             return em_set_error(EM_ERR_DTYPE, "transform 'add' on field '%s': needs float32 "
 *                                 "items, not %s", field, em_dtype_name(in->dtype));
 *         *out = *in;                                        // same dtype and shape
 *         return EM_OK;
 *     }
 *     static em_status add_init(const em_options *o, const em_transform_layout *in,
 *                               const em_transform_layout *out, void **state) {
 *         float *v = malloc(sizeof *v);
 *         if (!v) return em_set_error(EM_ERR_NOMEM, "transform 'add': out of memory");
 *         *v = (float)em_options_float(o, "value");
 *         *state = v;
 *         return EM_OK;
 *     }
 *     static em_status add_apply(void *state, const em_transform_layout *in, const void *src,
 *                                const em_transform_layout *out, void *dst,
 *                                em_transform_rng *rng) {
 *         (void)out; (void)rng;
 *         int64_t n = em_transform_layout_numel(in);
 *         for (int64_t i = 0; i < n; i++)
 *             ((float *)dst)[i] = ((const float *)src)[i] + *(const float *)state;
 *         return EM_OK;
 *     }
 *     static const em_transform_class add_class = {
 *         .struct_size = sizeof add_class, .name = "add", .description = "x + value",
 *         .options = add_opts, .n_options = 1, .layout = add_layout, .init = add_init,
 *         .apply = add_apply, .free = free};
 *     em_transform_class_register(reg, &add_class);     // from a plugin's register function
 *
 *     // Using classes: to_float then normalize on the field "input", then "add".
 *     em_options *norm = em_options_new();
 *     em_options_set_floats(norm, "mean", 3, (const double[]){0.49, 0.48, 0.45});
 *     em_options_set_floats(norm, "std", 3, (const double[]){0.25, 0.24, 0.26});
 *     const em_transform_spec specs[] = {
 *         {.struct_size = sizeof specs[0], .field = "input", .name = "to_float"},
 *         {.struct_size = sizeof specs[0], .field = "input", .name = "normalize",
 *          .options = norm},
 *         {.struct_size = sizeof specs[0], .field = "input", .name = "add"},
 *     };
 *     em_loader_options lo = {.struct_size = sizeof lo, .batch_size = 128,
 *                             .transform_specs = specs, .n_transform_specs = 3};
 *     em_loader *dl = em_loader_new(ds, &lo);            // checks every spec against the items
 *     em_options_free(norm);                             // the loader keeps what it needs
 *
 * Errors. An unknown class is EM_ERR_NOTFOUND listing the registered ones; an option the class
 * does not declare, of the wrong type or out of range is EM_ERR_INVALID naming the field, the
 * transform and the option; a field the transform cannot take (random_crop on items that are
 * not (C, H, W)) is the class's layout error, which names the transform, the field and the
 * shape. An apply error fails the batch holding the item (the message names the item, the
 * field and the transform).
 *
 * Threads. apply is called from the loader's worker threads, several at once on different
 * items with the same state: it must only read the state (whatever it needs to write lives in
 * `dst`). The random stream is the item's own (see em_transform_rng_next).
 *
 * The built-in classes (plugins/transforms, ember-transforms.so):
 *   to_float    options scale (float >= 0, default 0): the field becomes float32; uint8
 *               items with scale 0 are divided by 255 in float32 (x / 255, torchvision's
 *               ToTensor, bit for bit), any other scale multiplies (float32(x) * scale; 0
 *               on non-uint8 items means 1)
 *   normalize   options mean, std (lists of 1 or C floats, std > 0): a float32 field of
 *               shape (C, ...) becomes (x - mean[c]) / std[c] in float32, torchvision's
 *               Normalize
 *   random_crop options padding (int >= 0, default 0): a (C, H, W) field is padded with
 *               zeros by `padding` on each side and cropped back to (H, W) at a random
 *               offset (two draws: dy, then dx, each uniform in [-padding, padding])
 *   hflip       options p (float in [0, 1], default 0.5): a (C, H, W) field is mirrored
 *               left-right with probability p (one draw w: flipped when w < p * 2^32)
 *
 * The em_transform_* functions are new in EMBER_1.1.
 */
#ifndef EMBER_TRANSFORM_H
#define EMBER_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/options.h"
#include "ember/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The name of the class kind (em_class_find(EM_TRANSFORM_KIND, "hflip")). */
#define EM_TRANSFORM_KIND "transform"

/* What one field of one item is, before or after a transform: `ndim` dims of `shape`, C order,
 * of `dtype`. */
typedef struct em_transform_layout {
    size_t struct_size;           /* sizeof(em_transform_layout) */
    em_dtype dtype;
    int ndim;                     /* 0 .. EM_MAX_DIMS - 1 */
    int64_t shape[EM_MAX_DIMS];
    void *ext;                    /* reserved; NULL */
} em_transform_layout;

/* Elements of one item of layout l (1 for ndim 0). */
EM_API int64_t em_transform_layout_numel(const em_transform_layout *l);

/* The random stream of one item (epoch e, item index x, the loader's seed): an opaque cursor
 * the loader keeps on its stack for the item; a transform draws from it in apply. */
typedef struct em_transform_rng em_transform_rng;

/* The next 32-bit word of the item's stream. Word k is word k % 4 of the Philox block
 * P(x, e, S) of ember/data.h with S = 0x5846524d for k < 4 and S = 0x59000000 + k/4 - 1
 * after, so the stream depends only on (seed, epoch, item). Each field's pipeline draws the
 * stream from its start, its transforms in order: random_crop takes words 0 and 1, hflip after
 * it word 2; a second field with the same random transforms (a mask beside its image) gets
 * the same choices. */
EM_API uint32_t em_transform_rng_next(em_transform_rng *rng);
/* A uniform integer in [0, n) from the next word ((w * n) >> 32; 1 <= n <= 2^32). */
EM_API uint64_t em_transform_rng_below(em_transform_rng *rng, uint64_t n);

/* A transform class: the record a plugin (or program) registers into the "transform" kind.
 * The core copies it; the strings, the options table and the functions must stay valid while
 * the class is registered (static data). */
typedef struct em_transform_class {
    size_t struct_size;           /* sizeof(em_transform_class) */
    const char *name;             /* unique, [a-z][a-z0-9_-]*: "to_float", "random_crop" */
    const char *description;      /* one line */
    const em_option_spec *options; /* n_options entries (may be NULL when 0) */
    int n_options;
    /* What the transform makes of a field: from the resolved options (borrowed for the call)
     * and the field's layout `in`, fill *out (start from *in; struct_size is set), or refuse
     * with an error set by em_set_error naming the transform, the field and the shape or
     * dtype (EM_ERR_SHAPE, EM_ERR_DTYPE, EM_ERR_INVALID). Required. */
    em_status (*layout)(const em_options *opts, const char *field,
                        const em_transform_layout *in, em_transform_layout *out /* out */);
    /* (optional) Make the state apply reads, once per loader and field, after layout accepted
     * the field (opts borrowed for the call: copy what apply needs). NULL: the state is the
     * NULL pointer. */
    em_status (*init)(const em_options *opts, const em_transform_layout *in,
                      const em_transform_layout *out, void **state /* out */);
    /* Transform one item: read `src` (layout in), write all of `dst` (layout out; the
     * buffers never overlap), drawing random choices from rng. Called from several threads
     * at once with the same state (read it only). Return EM_OK or an error set with
     * em_set_error. Required. */
    em_status (*apply)(void *state, const em_transform_layout *in, const void *src,
                       const em_transform_layout *out, void *dst, em_transform_rng *rng);
    /* (optional) Free what init made. NULL: nothing to free. */
    void (*free)(void *state);
    void *ext;                    /* reserved; NULL */
} em_transform_class;

/* One transform of a pipeline: apply class `name` with `options` to the item field `field`
 * ("input" for a dataset's inputs). The loader copies what it needs at em_loader_new. */
typedef struct em_transform_spec {
    size_t struct_size;           /* sizeof(em_transform_spec) */
    const char *field;            /* the field it applies to; NULL: "input" */
    const char *name;             /* the transform class */
    const em_options *options;    /* its options (borrowed; NULL: none, the defaults) */
    void *ext;                    /* reserved; NULL */
} em_transform_spec;

/* Register a transform class (em_class_register(reg, EM_TRANSFORM_KIND, cls) with the kind's
 * checks). EM_ERR_EXISTS when the name is taken (naming who registered it), EM_ERR_INVALID
 * for a malformed record (a bad name, no layout or apply function, an option without a name
 * or types, declared twice, or whose default fails its own checks), EM_ERR_NOMEM. */
EM_API em_status em_transform_class_register(em_registry *reg, const em_transform_class *cls);
/* The core's copy of a registered class (valid until it is removed), or NULL with
 * EM_ERR_NOTFOUND listing the registered classes and the loaded plugins. */
EM_API const em_transform_class *em_transform_class_find(const char *name);

/* What a loader with these specs (n of them) delivers for `field` (NULL: "input") whose items
 * are `in`: the specs naming the field, in order, each found, its options resolved and its
 * layout applied, into *out (*in when no spec names the field). For a program (or ember-train)
 * to size a model before the first batch. The loader's errors (EM_ERR_NOTFOUND, EM_ERR_INVALID,
 * the class's layout error) naming the field, the transform and the option or shape. */
EM_API em_status em_transform_specs_layout(const em_transform_spec *specs, int n,
                                           const char *field, const em_transform_layout *in,
                                           em_transform_layout *out /* out */);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_TRANSFORM_H */
