/*
 * ember/data.h — datasets and the DataLoader.
 *
 * A dataset CLASS (a format: "mnist", "cifar10", "csv", "synthetic", ...) is registered by a
 * plugin (or by the program, through em_registry_program()) with typed options. Opening a
 * class with options gives an em_dataset: a length, its item as a list of named FIELDS
 * (em_field: a dtype, a shape, optionally one variable-length dim with a pad value), and a
 * way to read any set of items into preallocated buffers. The image and table formats have
 * the fields "input" and "target" (em_dataset_info describes those two, as in Ember 1.0). A
 * program can also make a dataset from tensors it already has, or from a callback, without
 * a plugin. The DataLoader turns a dataset into batches: sampling, shuffling, batching
 * (fixed fields stacked, variable ones padded to the batch's longest item with a length
 * tensor and a mask beside), worker threads that fill a bounded ring of batch buffers ahead
 * of the consumer, pinned host buffers and async copies to an accelerator, and per-item
 * transforms per field (ember/transform.h).
 *
 *     em_options *opts = em_options_new();
 *     em_options_set_string(opts, "path", "data/digits");
 *     em_options_set_string(opts, "split", "train");
 *     em_dataset *ds = em_dataset_open("mnist", opts);     // checks opts against the class
 *     em_options_free(opts);
 *     if (!ds) { fprintf(stderr, "%s\n", em_last_error()); return 1; }
 *     const em_transform_spec tf[] = {{.struct_size = sizeof tf[0], .field = "input",
 *                                      .name = "to_float"}};   // ember/transform.h
 *     em_loader_options o = {.struct_size = sizeof o, .batch_size = 128, .shuffle = true,
 *                            .seed = 42, .num_workers = 1,
 *                            .transform_specs = tf, .n_transform_specs = 1};
 *     em_loader *dl = em_loader_new(ds, &o);
 *     for (int epoch = 0; epoch < 3; epoch++) {
 *         em_tensor *x, *y;                  // borrowed: valid until the next em_loader_next
 *         while (em_loader_next(dl, &x, &y) == EM_OK && x) {
 *             em_scope_begin();
 *             ... forward (x: (B, 1, 28, 28) float32), loss against y: (B) int64 ...
 *             em_scope_end();
 *         }
 *         if (em_last_status() != EM_OK) { fprintf(stderr, "%s\n", em_last_error()); break; }
 *     }
 *     em_loader_free(dl);                    // joins the workers, frees every buffer
 *     em_dataset_free(ds);
 *
 * Named fields and variable lengths (since 1.1). A batch is addressed by field name; a
 * variable-length field comes padded, with its lengths and mask:
 *
 *     // a class whose items are {"tokens": (L <= 128) int64, padded with 0; "label": int64}
 *     em_dataset *ds = em_dataset_open("my-text", opts);
 *     em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = 32, .shuffle = true,
 *                               .seed = 1, .num_workers = 2};
 *     em_loader *dl = em_loader_new_v2(ds, &o);
 *     const em_batch *b;                     // borrowed: valid until the next call
 *     while (em_loader_next_v2(dl, &b) == EM_OK && b) {
 *         em_tensor *tok = em_batch_field(b, "tokens");   // (B, L) int64, L = longest in b
 *         em_tensor *len = em_batch_lengths(b, "tokens"); // (B) int64
 *         em_tensor *mask = em_batch_mask(b, "tokens");   // (B, L) bool, true = real token
 *         em_tensor *y = em_batch_field(b, "label");      // (B) int64
 *         em_scope_begin();
 *         em_tensor *out = em_module_forward_masked(model, &tok, 1, mask); // ember/module.h
 *         ... loss against y ...
 *         em_scope_end();
 *     }
 *
 * A class declares its fields from open_fields (em_dataset_layout) and reads them with
 * read_fields: each item of a variable field contiguous in its own shape at its slot (the
 * field's longest size apart), its length beside. The loader checks every length, pads
 * (pad_value), and hands out contiguous (B, ..., L, ...) tensors. Every loader mechanism
 * works for every field: samplers, worker threads, the ring, pinned buffers and the copies
 * to a device (lengths and masks included), resumable positions, the wait record.
 * em_loader_next is em_loader_next_v2 reduced to the fields "input" and "target"; a 1.0
 * class (open/read) keeps working unchanged. A batch of a padded field is a view made per
 * batch (the buffers themselves are all allocated by em_loader_new).
 *
 * Reproducibility. Every random choice is a Philox 4x32-10 function (ember/random.h) of the
 * loader's seed and of the epoch (permutations, weighted draws) or of (epoch, item index)
 * (transforms), never of a thread or of timing: the same seed gives the same batches whatever
 * num_workers is, and a loader restored to a position (em_loader_set_state) continues exactly
 * as the original run did. The definitions (P(c, e, S) = em_philox4x32_10 with counter
 * {lo32(c), hi32(c), lo32(e), S} and key {lo32(seed), hi32(seed) ^ hi32(e)}):
 *   permutation of epoch e over a list v of n items (S = 0x53485546): for k = 0 .. n-2,
 *       i = n-1-k, w = word k%4 of P(k/4, e, S), j = (w * (i+1)) >> 32, swap v[i], v[j];
 *   weighted draw k of epoch e (S = 0x57474854): w0, w1 = words 2(k%2), 2(k%2)+1 of
 *       P(k/2, e, S), u = ((w0 >> 5) * 2^26 + (w1 >> 6)) * 2^-53, item = the first i with
 *       w[0] + ... + w[i] > u * (sum of weights);
 *   transforms of item x in epoch e (S = 0x5846524d): the item's stream of words
 *       (em_transform_rng_next, ember/transform.h) is w0, w1, w2, w3 = P(x, e, S), then the
 *       words of P(x, e, 0x59000000 + b - 1) for block b >= 1; each field's transforms draw
 *       it from its start, in their order. random_crop(padding p) draws dy, dx:
 *       dy = ((w * (2p+1)) >> 32) - p (output pixel (y, x) is input pixel (y + dy, x + dx),
 *       zero outside); hflip(prob q) draws w and mirrors (output x reads W-1-x) when
 *       w >= (1 - q) * 2^32 (q = 0.5: w >> 31); crop then flip uses w0, w1, w2;
 *   random_split(seed): the permutation above of 0..N-1 with e = 0 and S = 0x53504c54,
 *       cut into consecutive pieces of the given lengths.
 *
 * Threads. A dataset's read function is called from the loader's worker threads, several at
 * once on disjoint items; the classes in ember-data and the in-memory datasets are safe for
 * that (callback datasets must make their callback safe when num_workers > 1).
 */
#ifndef EMBER_DATA_H
#define EMBER_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/device.h"
#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/export.h"
#include "ember/options.h"
#include "ember/tensor.h"
#include "ember/transform.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the item layout -------------------------------------------------------------------- */

/* What one item of a dataset is. Inputs of item i occupy input_shape elements of
 * input_dtype; targets are either a class label (target_ndim 0, EM_I64, in
 * [0, num_classes)) or target_shape float32 values (regression, num_classes 0). */
typedef struct em_dataset_info {
    size_t struct_size;           /* sizeof(em_dataset_info) */
    int64_t length;               /* number of items */
    int input_ndim;
    int64_t input_shape[EM_MAX_DIMS]; /* e.g. (1, 28, 28), (3, 32, 32), (13) */
    em_dtype input_dtype;         /* EM_U8 for images, EM_F32 for features */
    int target_ndim;              /* 0: one class label; 1: (k) regression targets */
    int64_t target_shape[EM_MAX_DIMS];
    em_dtype target_dtype;        /* EM_I64 (labels) or EM_F32 (regression) */
    int64_t num_classes;          /* labels lie in [0, num_classes); 0 for regression */
    void *ext;                    /* reserved; NULL */
} em_dataset_info;

/* ---- items as named fields (since 1.1) --------------------------------------------------- */

/* The most fields an item has. */
#define EM_MAX_FIELDS 16

/* One named field of an item (Hugging Face's "features", the keys of the dict a PyTorch
 * Dataset returns): a dtype and a per-item shape, optionally with one dim whose length varies
 * from item to item (a token sequence, a list of boxes). Batching stacks fixed fields into
 * (B, ...) and pads variable ones to the longest item of the batch (torch's pad_sequence
 * with batch_first), with pad_value in the padding and a length tensor and a mask beside.
 * Arrays of em_field are read with the stride fields[0].struct_size (every entry of one
 * array has the same struct_size), so an array built against older headers still reads. */
typedef struct em_field {
    size_t struct_size;           /* sizeof(em_field) */
    const char *name;             /* [A-Za-z_][A-Za-z0-9_]*, <= 63 chars, unique; copied */
    em_dtype dtype;
    int ndim;                     /* item dims, 0 .. EM_MAX_DIMS - 1 (0: one value per item) */
    int64_t shape[EM_MAX_DIMS];   /* the item's shape; at var_dim its longest length */
    bool variable;                /* dim var_dim's length varies per item */
    int var_dim;                  /* 0 <= var_dim < ndim when variable */
    double pad_value;             /* what padding holds (converted to dtype); 0 by default */
    int64_t num_classes;          /* integer labels in [0, num_classes); 0: not class labels */
    void *ext;                    /* reserved; NULL */
} em_field;

/* What a class's open_fields reports: the number of items and their fields. */
typedef struct em_dataset_layout {
    size_t struct_size;           /* sizeof(em_dataset_layout) (set by the core) */
    int64_t length;               /* number of items */
    const em_field *fields;       /* n_fields entries (see em_field for the stride) */
    int n_fields;                 /* 1 .. EM_MAX_FIELDS */
    void *ext;                    /* reserved; NULL */
    /* (1.1) Text the dataset carries beside its items, as key/value pairs (a tokenizer's
     * vocabulary: ember-data's "text" class sets text.level, text.vocab, text.seq_len, ...;
     * see docs/data.md): n_meta entries of meta_keys and meta_values, non-empty key and
     * valid UTF-8 each, copied by the core after open returns (em_dataset_metadata). NULL
     * and 0: none. A class built against older headers leaves them zero. */
    const char *const *meta_keys;
    const char *const *meta_values;
    int n_meta;
} em_dataset_layout;

/* ---- dataset classes (registered by plugins and programs) ------------------------------- */

/* The record a plugin fills to register a dataset class; copied by the core (the strings and
 * the options table must stay valid while the class is registered: use static data). Options
 * are declared like a module's (ember/options.h):
 *
 *     static const char *const splits[] = {"train", "test", NULL};
 *     static const em_option_spec mnist_opts[] = {
 *         {.name = "path", .types = EM_OPT_STRING, .required = true, .help = "directory"},
 *         {.name = "split", .types = EM_OPT_STRING, .def = {.s = "train"}, .choices = splits},
 *         {.name = "classes", .types = EM_OPT_INT, .def = {.i = 10}, .has_range = true,
 *          .min = 1, .max = 256},
 *     };
 */
typedef struct em_dataset_class_def {
    size_t struct_size;           /* sizeof(em_dataset_class_def) */
    const char *name;             /* unique, [a-z][a-z0-9_-]*: "mnist", "csv" */
    const char *description;      /* one line */
    const em_option_spec *options; /* n_options entries (may be NULL when 0) */
    int n_options;
    /* Open an instance from its resolved options (every declared option has a value: read
     * them with em_options_string/int/float/bool; the bag is borrowed for the call): validate
     * the files, fill *info, and return the class's state in *state. Errors (EM_ERR_IO,
     * EM_ERR_FORMAT, ...) set a message naming the file, the item or line and the reason. */
    em_status (*open)(const em_options *opts, em_dataset_info *info /* out */,
                      void **state /* out */);
    /* Read items indices[0..n) into `inputs` (n * input item bytes, item j at offset
     * j * item bytes, C order) and `targets` (likewise). Called from several threads at once
     * on disjoint outputs. Errors name the file, the item index and the reason. */
    em_status (*read)(void *state, const int64_t *indices, int64_t n, void *inputs,
                      void *targets);
    /* Free the state (may be NULL when open allocated nothing). */
    void (*close)(void *state);
    void *ext;                    /* reserved; NULL */
    /* ---- since 1.1: items as named fields. A class sets EITHER open and read above (the 1.0
     * record: its items are the two fields "input" and "target" of its em_dataset_info) OR
     * these two (open and read then stay NULL); a record built against the 1.0 headers ends
     * at ext and keeps working. */
    /* Open an instance: fill *layout (length and the item's fields) and return the state in
     * *state. The core copies the fields array and its names after open returns, before
     * em_dataset_open does: point them at static data or into the state, never at open's
     * stack. Errors as for open. */
    em_status (*open_fields)(const em_options *opts, em_dataset_layout *layout /* out */,
                             void **state /* out */);
    /* Read items indices[0..n): data[f] receives field f's values (declared order) for the
     * n items, item j at offset j * (field f's item bytes at its full shape), C order;
     * a variable field's item is written contiguous in its own shape (its length along the
     * variable dim, not the maximum) at that offset, and its length into lengths[f][j]
     * (lengths[f] is NULL for fixed fields). Called from several threads at once on
     * disjoint outputs. Errors name the file, the item index and the reason. */
    em_status (*read_fields)(void *state, const int64_t *indices, int64_t n,
                             void *const *data, int64_t *const *lengths);
} em_dataset_class_def;

/* Register a dataset class (from a plugin's register function, or from a program with
 * em_registry_program()): the "dataset" kind of ember/plugin.h's class registry, which copies
 * the record. EM_ERR_EXISTS when the name is taken, EM_ERR_INVALID for a
 * malformed record (a missing name/open/read; an option without a name or types, declared
 * twice, or whose default does not pass its own checks), EM_ERR_NOMEM. */
EM_API em_status em_dataset_class_register(em_registry *reg, const em_dataset_class_def *def);
/* Remove a class the registry registered; EM_ERR_NOTFOUND otherwise. Instances already open
 * must be freed first (the class's functions may go away with its plugin). */
EM_API em_status em_dataset_class_unregister(em_registry *reg, const char *name);

/* The classes registered now, in registration order (names valid while registered). */
EM_API size_t em_dataset_class_count(void);
EM_API const char *em_dataset_class_name(size_t i);
/* The classes one registry registered (for ember-info). */
EM_API size_t em_registry_dataset_count(const em_registry *reg);
EM_API const char *em_registry_dataset_name(const em_registry *reg, size_t i);
/* The definition of a registered class (borrowed; NULL + EM_ERR_NOTFOUND when unknown). */
EM_API const em_dataset_class_def *em_dataset_class_find(const char *name);

/* ---- datasets --------------------------------------------------------------------------- */

typedef struct em_dataset em_dataset;

/* Open a dataset of class `name` with options (borrowed: the call resolves a copy; NULL for
 * none), set from C (em_options_set_string(o, "path", "data/digits")) or as text from a
 * config file (em_options_set_text, em_config_to_options). Unknown class: EM_ERR_NOTFOUND
 * listing the registered ones. An unknown option (with a did-you-mean), a value of the wrong
 * type, out of range or not among the choices, or a missing required option:
 * EM_ERR_INVALID naming the class, the option and what is allowed (em_options_resolve).
 * Then the class's own errors; and EM_ERR_FORMAT naming the class and its 'path' option when
 * the class opens with no items (an empty file or split would train nothing). Returns a new
 * dataset (free with em_dataset_free) or NULL. */
EM_API em_dataset *em_dataset_open(const char *name, const em_options *opts);

/* A dataset over tensors the program already has: item i is inputs[i] (any CPU tensor of
 * shape (N, ...)) and targets[i] (shape (N) of an integer dtype — class labels, stored as
 * int64, that must lie in [0, num_classes) (num_classes 0: max + 1) — or (N, k) float32 for
 * regression). The tensors are copied into the dataset when they are not contiguous or the
 * labels are not int64, and otherwise retained (the dataset holds a reference and sees later
 * writes). NULL + error for a shape, dtype, device or label problem. */
EM_API em_dataset *em_dataset_from_tensors(em_tensor *inputs, em_tensor *targets,
                                           int64_t num_classes);

/* Fills item `index`: input_shape elements of input_dtype into `input`, and the target into
 * `target` (one int64 label, or target_shape float32 values). Return EM_OK, or an error with
 * em_set_error() saying why (it reaches the consumer at the batch holding the item). */
typedef em_status (*em_item_fn)(void *user, int64_t index, void *input, void *target);
/* A dataset whose items a function fills; `info` describes them (copied). `user` is passed
 * through and must outlive the dataset. With num_workers > 1 the function is called from
 * several threads at once. */
EM_API em_dataset *em_dataset_from_callback(const em_dataset_info *info, em_item_fn fn,
                                            void *user);

/* Split ds into n disjoint subsets of the given lengths (summing to ds's length) by a random
 * permutation of (seed), like torch.utils.data.random_split. out[0..n) receive new datasets
 * that keep ds alive (free each, and ds, with em_dataset_free in any order). EM_ERR_INVALID
 * when the lengths do not add up. */
EM_API em_status em_random_split(em_dataset *ds, const int64_t *lengths, int n, uint64_t seed,
                                 em_dataset **out /* out: n datasets */);

/* A subset of ds: items indices[0..n) (copied; each in [0, length)). Keeps ds alive. */
EM_API em_dataset *em_dataset_subset(em_dataset *ds, const int64_t *indices, int64_t n);

/* Read-only views (borrowed; ds must not be NULL). */
EM_API const em_dataset_info *em_dataset_get_info(const em_dataset *ds);
EM_API int64_t em_dataset_length(const em_dataset *ds);
/* The class name ("mnist", "tensors", "callback", "subset"). */
EM_API const char *em_dataset_name(const em_dataset *ds);
/* Read items indices[0..n) into host buffers of n items each (see em_dataset_class_def.read).
 * Indices out of range are EM_ERR_RANGE naming the index and the length. */
EM_API em_status em_dataset_read(em_dataset *ds, const int64_t *indices, int64_t n,
                                 void *inputs, void *targets);
/* Drop the caller's reference; NULL is a no-op. Subsets keep their parent alive. */
EM_API void em_dataset_free(em_dataset *ds);

/* The item's fields (since 1.1). Every dataset has them: a 1.0 class's items, and those of
 * em_dataset_from_tensors and em_dataset_from_callback, are the fields "input" (the info's
 * input shape and dtype) and "target" (one int64 label with num_classes, or (k) float32).
 * em_dataset_field borrows (valid while ds lives; NULL + EM_ERR_RANGE for i out of range). */
EM_API int em_dataset_field_count(const em_dataset *ds);
EM_API const em_field *em_dataset_field(const em_dataset *ds, int i);
/* The index of the field `name`, or -1 with EM_ERR_NOTFOUND naming the dataset and listing
 * its fields. */
EM_API int em_dataset_field_index(const em_dataset *ds, const char *name);
/* The dataset's metadata (em_dataset_layout.meta_keys/meta_values; ember/serialize.h's
 * ordered string map): borrowed, valid while ds lives, never NULL (empty when the class set
 * none). A subset or random_split piece has its parent's. ember-train writes every entry
 * into the safetensors metadata of the weights and checkpoints it saves (since 1.1). */
struct em_metadata;
EM_API const struct em_metadata *em_dataset_metadata(const em_dataset *ds);
/* Read items indices[0..n) field by field into host buffers (see
 * em_dataset_class_def.read_fields: data[f] holds n items of field f at its full shape;
 * lengths[f] receives a variable field's lengths and may be NULL for fixed fields). Errors:
 * EM_ERR_RANGE for an index out of range; EM_ERR_FORMAT naming the dataset, field and item
 * when a variable field's length is outside [0, its longest] or was not set. */
EM_API em_status em_dataset_read_fields(em_dataset *ds, const int64_t *indices, int64_t n,
                                        void *const *data, int64_t *const *lengths);

/* Fills item `index` of a field dataset: data[f] receives field f's values (a variable
 * field's contiguous in its own shape) and lengths[f] a variable field's length (lengths[f]
 * of a fixed field is to be left alone). Return EM_OK or an error with em_set_error(). */
typedef em_status (*em_fields_fn)(void *user, int64_t index, void *const *data,
                                  int64_t *lengths);
/* A dataset of `length` items of the given fields (n_fields in [1, EM_MAX_FIELDS]; copied)
 * that a function fills. `user` must outlive the dataset; with num_workers > 1 the function
 * is called from several threads at once. EM_ERR_INVALID naming the field for a bad name,
 * dtype, shape or variable dim, or a name used twice. */
EM_API em_dataset *em_dataset_from_fields(int64_t length, const em_field *fields, int n_fields,
                                          em_fields_fn fn, void *user);

/* ---- the DataLoader --------------------------------------------------------------------- */

typedef enum em_sampler_kind {
    EM_SAMPLER_DEFAULT = 0,    /* sequential, or random when shuffle is set */
    EM_SAMPLER_SEQUENTIAL = 1, /* 0, 1, ..., N-1 (shuffle must be off) */
    EM_SAMPLER_RANDOM = 2,     /* a new permutation each epoch */
    EM_SAMPLER_SUBSET = 3,     /* the items subset[0..subset_len), permuted when shuffle */
    EM_SAMPLER_WEIGHTED = 4,   /* num_samples draws with replacement, P(i) ~ weights[i] */
    EM_SAMPLER_SHARDED = 5,    /* rank's share for data parallelism (DistributedSampler):
                                  permuted when shuffle, padded by repeating the first
                                  items to a multiple of world_size (or cut to one with
                                  shard_drop_last), then items rank, rank + world_size, ... */
} em_sampler_kind;

/* The fixed set of per-item transforms of Ember 1.0, kept for its users: the loader turns it
 * into transform classes of ember/transform.h (the ember-transforms plugin) on the field
 * "input", in this order: random_crop (padding = crop_padding) when crop_padding > 0 or
 * hflip, hflip when hflip, to_float (scale) when to_float or normalizing, normalize (mean, std) when
 * mean is set. So uint8 items with scale 0 are divided by 255 in float32 (torchvision's
 * ToTensor; before Ember 1.1 they were multiplied by float32(1/255), 1 ulp off for 126 of
 * the 256 byte values), then normalized as (x - mean[c]) / std[c] in float32. Crop and
 * flip need items of shape (C, H, W); normalize takes at most 8 channels. Each item's
 * random choices depend only on (seed, epoch, item index): crop draws words 0 and 1 of the
 * item's stream and flip word 2, as in 1.0 (a flip alone brings a crop of padding 0). New code
 * lists classes in em_loader_options.transform_specs instead (any class, any order, with
 * typed options); a loader takes one form or the other. */
typedef struct em_transforms {
    bool to_float;       /* inputs become float32, multiplied by scale */
    double scale;        /* 0: 1/255 for uint8 inputs, 1 otherwise */
    const float *mean;   /* normalize: n_channels means and stds (NULL: no normalize); */
    const float *std;    /*   channel = item dim 0; implies to_float; copied by the loader */
    int n_channels;
    int crop_padding;    /* > 0: random crop of (H, W) out of the item padded by this much */
    bool hflip;          /* flip left-right with probability 1/2 */
} em_transforms;

typedef struct em_loader_options {
    size_t struct_size;  /* sizeof(em_loader_options) */
    int64_t batch_size;  /* 0: 1 (PyTorch's default) */
    bool shuffle;        /* a new Philox permutation each epoch, from (seed, epoch) */
    bool drop_last;      /* drop a last batch smaller than batch_size */
    uint64_t seed;
    int num_workers;     /* worker threads; 0: batches are made in the caller's thread */
    int prefetch;        /* ring slots (batches made ahead); 0: 2 per worker (at least 2) */
    em_sampler_kind sampler;
    const int64_t *subset; /* EM_SAMPLER_SUBSET: subset_len item indices (copied) */
    int64_t subset_len;
    const double *weights; /* EM_SAMPLER_WEIGHTED: one weight >= 0 per item (copied) */
    int64_t num_samples;   /* EM_SAMPLER_WEIGHTED: draws per epoch; 0: the dataset length */
    int rank, world_size;  /* EM_SAMPLER_SHARDED: 0 <= rank < world_size */
    /* Where batches are delivered. Zero-initialised: the CPU. For another device the
     * loader copies each batch there (asynchronously, on its own stream, ordered by events
     * after the work em_loader_next's caller queued so far on its current stream on that
     * device, em_stream_current, and before the work it queues there next) into device
     * buffers it owns; the next em_loader_next overwrites them. */
    em_device device;
    /* Host batch buffers come from the device's page-locked host allocator (fast async
     * copies). Only meaningful when device is not the CPU (ignored otherwise). */
    bool pin_memory;
    em_transforms transforms; /* the 1.0 transforms (above); zero: none */
    void *ext;           /* reserved; NULL */
    /* (1.1) Transform classes to apply per item (ember/transform.h): for each field, the
     * specs naming it in the order listed (a field no spec names is delivered as read).
     * The array and its options are read by em_loader_new only (it resolves a copy of each
     * bag); unknown classes, options or fields, and fields a transform cannot take, fail
     * em_loader_new naming the field, the transform and the option or shape. Cannot be
     * combined with `transforms`. */
    const struct em_transform_spec *transform_specs;
    int n_transform_specs;
    /* (1.1) EM_SAMPLER_SHARDED: drop the tail of the (permuted) dataset so every shard has
     * floor(N / world_size) items, instead of padding with repeated items to
     * ceil(N / world_size) (DistributedSampler's drop_last; not the batch-level drop_last
     * above). Every item appears at most once across the shards. */
    bool shard_drop_last;
    /* (1.1) The loader's name in a profiler trace (docs/tracing.md): its workers' tracks
     * are "<name> worker 0", "<name> worker 1", ... (ember-train's loaders are "train",
     * "val" and "test"). NULL or "": "loader worker 0", ... Copied; at most
     * EM_LOADER_NAME_MAX bytes of printable ASCII, else em_loader_new fails with
     * EM_ERR_INVALID naming the option. */
    const char *name;
} em_loader_options;

/* The longest em_loader_options.name (bytes, without the terminating 0). */
#define EM_LOADER_NAME_MAX 20

typedef struct em_loader em_loader;

/* A loader over ds (which must outlive the loader) with options o (copied; NULL: defaults).
 * Starts its workers, which begin on epoch 0 at once. EM_ERR_INVALID naming the option at
 * fault (bad sampler arguments, transforms that do not fit the items, ...) or naming the
 * dataset when an epoch would have no batch (no items, or drop_last with fewer items than
 * batch_size), EM_ERR_DEVICE, EM_ERR_NOMEM. Every buffer is allocated here, each for
 * min(batch_size, items per epoch) items (a variable field's at its longest): em_loader_next
 * allocates nothing except the view of a short last batch (once per epoch) and, for each
 * variable-length field, the views of its padded batch, lengths and mask. */
EM_API em_loader *em_loader_new(em_dataset *ds, const em_loader_options *o);

/* The next batch of the current epoch.
 *   - EM_OK with *inputs (B, ...) and *targets (B) int64 or (B, k) float32 set: BORROWED
 *     tensors, owned by the loader, tagged EM_MEM_DATA, valid until the next em_loader_next
 *     or em_loader_free (clone them to keep them longer; never release them). The loader
 *     bumps their version when it refills a buffer, so a graph that saved one notices.
 *   - EM_OK with *inputs = *targets = NULL: the epoch is over; the next call starts the
 *     next epoch (whose batches the workers have already begun to make).
 *   - an error: a worker failed on an item of this batch (the message names the batch,
 *     the dataset's file, the item index and the reason), or a copy failed. The loader
 *     then stays stopped (EM_ERR_STATE) until em_loader_set_state restarts it. */
EM_API em_status em_loader_next(em_loader *l, em_tensor **inputs /* out */,
                                em_tensor **targets /* out */);

/* Batches per epoch (after drop_last). */
EM_API int64_t em_loader_num_batches(const em_loader *l);

/* The loader's position: the batch em_loader_next hands out next is batch `batch` of
 * epoch `epoch` (batch == num_batches: the end-of-epoch mark comes next). Together with
 * the options (the seed) this is the whole state: checkpoints save it. */
typedef struct em_loader_state {
    uint64_t seed;
    int64_t epoch;
    int64_t batch;
} em_loader_state;
EM_API em_loader_state em_loader_get_state(const em_loader *l);
/* Continue from a saved position (drops whatever the workers made ahead, clears a stopped
 * loader's error). EM_ERR_RANGE, changing nothing, unless 0 <= batch <= num_batches and
 * 0 <= epoch <= EM_STEP_MAX (ember/optim.h). */
EM_API em_status em_loader_set_state(em_loader *l, em_loader_state s);

/* Where the consumer's time went: time spent blocked in em_loader_next waiting for a batch
 * (with num_workers 0 that is the time to make it). */
typedef struct em_loader_stats {
    uint64_t batches;       /* batches handed out */
    uint64_t wait_ns;       /* total time blocked in em_loader_next */
    uint64_t last_wait_ns;  /* the last call's */
    uint64_t max_wait_ns;
} em_loader_stats;
EM_API em_loader_stats em_loader_get_stats(const em_loader *l);
/* Zero the stats and the per-batch wait record: what follows covers the batches from now on
 * (e.g. reset after a warm-up of 10 batches to measure batches 10..N). */
EM_API void em_loader_reset_stats(em_loader *l);
/* A quantile of the per-batch waits since the loader was made or its stats reset: q = 0.5
 * the median (the lower one for an even count), 0.9 the 90th percentile, in ns. Every wait is
 * recorded (no sampling, nothing allocated per batch) in a log-scale histogram, so the value
 * is within 0.8% of the exact quantile (exact below 64 ns). 0 when no batch was handed out
 * or q is outside [0, 1]. With num_workers >= 1 the wait is the time the consumer found no
 * batch ready: a median near 0 means the workers keep ahead of the training step. */
EM_API uint64_t em_loader_wait_quantile(const em_loader *l, double q);

/* Stop the workers (mid-epoch is fine: they are joined), free every buffer. The borrowed
 * batch tensors are released with it. NULL is a no-op. */
EM_API void em_loader_free(em_loader *l);

/* ---- the DataLoader over named fields (since 1.1) -------------------------------------- */

/* The loader options, version 2: those of em_loader_options without the closed
 * em_transforms struct; transforms come as a list of classes per field. */
typedef struct em_loader_options_v2 {
    size_t struct_size;  /* sizeof(em_loader_options_v2) */
    int64_t batch_size;  /* 0: 1 */
    bool shuffle;
    bool drop_last;
    uint64_t seed;
    int num_workers;
    int prefetch;
    em_sampler_kind sampler;
    const int64_t *subset;
    int64_t subset_len;
    const double *weights;
    int64_t num_samples;
    int rank, world_size;
    em_device device;    /* as in em_loader_options: every field's batch goes there */
    bool pin_memory;
    /* Transform classes (ember/transform.h), per field by name: for each field, the specs
     * whose field names it (NULL: "input"), in the order listed; a field no spec names is
     * delivered as read. Read by em_loader_new_v2 only (it resolves a copy of each bag).
     * Errors (EM_ERR_INVALID, ...) name transforms[i], the field and the transform; a spec
     * naming a field the dataset lacks lists its fields; variable-length fields take no
     * transforms. */
    const em_transform_spec *transforms;
    int n_transforms;
    void *ext;           /* reserved; NULL */
    bool shard_drop_last; /* as in em_loader_options */
    const char *name;     /* (1.1) as in em_loader_options */
} em_loader_options_v2;

/* A loader over ds with options version 2 (copied; NULL: defaults); everything else as
 * em_loader_new. */
EM_API em_loader *em_loader_new_v2(em_dataset *ds, const em_loader_options_v2 *o);

/* One batch, addressed by field name: owned by the loader, valid until the next
 * em_loader_next / em_loader_next_v2 / em_loader_set_state / em_loader_free. */
typedef struct em_batch em_batch;

/* The next batch of the current epoch as named fields.
 *   - EM_OK with *batch set: every field of the dataset, batched (B = em_batch_size);
 *   - EM_OK with *batch = NULL: the epoch is over (the next call starts the next one);
 *   - an error, as em_loader_next.
 * em_loader_next is this call followed by the fields "input" and "target" (EM_ERR_NOTFOUND
 * when the dataset lacks one). */
EM_API em_status em_loader_next_v2(em_loader *l, const em_batch **batch /* out */);

/* Items in the batch. */
EM_API int64_t em_batch_size(const em_batch *b);
/* The fields, in the dataset's order (names borrowed). */
EM_API int em_batch_field_count(const em_batch *b);
EM_API const char *em_batch_field_name(const em_batch *b, int i);
/* The batched field `name`: BORROWED (like em_loader_next's tensors; never release it),
 * (B, item shape) on the loader's device, tagged EM_MEM_DATA. A variable field is padded to
 * the batch's longest item L along its variable dim: (B, ..., L, ...), pad_value beyond each
 * item's length. NULL with EM_ERR_NOTFOUND listing the batch's fields. */
EM_API em_tensor *em_batch_field(const em_batch *b, const char *name);
/* A variable field's lengths: (B) int64, item j's length along the variable dim. BORROWED.
 * NULL with EM_ERR_NOTFOUND for an unknown field, EM_ERR_INVALID for a fixed one. */
EM_API em_tensor *em_batch_lengths(const em_batch *b, const char *name);
/* A variable field's mask: (B, L) bool, true at positions t < length[j] (real items), false
 * in the padding. BORROWED. Errors as em_batch_lengths. */
EM_API em_tensor *em_batch_mask(const em_batch *b, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_DATA_H */
