/*
 * data_internal.h — what data.c (dataset classes, datasets) and loader.c (the DataLoader)
 * share; never installed.
 */
#ifndef EMBER_DATA_INTERNAL_H
#define EMBER_DATA_INTERNAL_H

#include "ember/data.h"
#include "ember/random.h"
#include "internal.h"

/* Philox streams of the data subsystem: word 3 of the counter, so that no two uses of one
 * seed ever draw the same numbers. */
enum {
    EM__DATA_STREAM_SHUFFLE = 0x53485546u,   /* "SHUF": per-epoch permutations */
    EM__DATA_STREAM_WEIGHTED = 0x57474854u,  /* "WGHT": weighted draws */
    EM__DATA_STREAM_TRANSFORM = 0x5846524du, /* "XFRM": per-item transforms */
    EM__DATA_STREAM_SPLIT = 0x53504c54u,     /* "SPLT": random_split */
};

/* Word w (0..3) of the block `block` of (seed, epoch, stream). */
static inline uint32_t em__data_word(uint64_t seed, uint64_t epoch, uint32_t stream,
                                     uint64_t block, unsigned w) {
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)epoch, stream};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    key[1] ^= (uint32_t)(epoch >> 32);
    em_philox4x32_10(ctr, key, out);
    return out[w & 3];
}

/* A uniform integer in [0, n) from a 32-bit word (n <= 2^32; multiply-shift). */
static inline uint64_t em__data_below(uint32_t w, uint64_t n) {
    return ((uint64_t)w * n) >> 32;
}

/* Fill perm[0..n) with a Fisher-Yates permutation of v[0..n) (v may be perm itself) drawn
 * from (seed, epoch, stream): element i (from the top) uses word i % 4 of block i / 4. */
void em__data_permute(int64_t *perm, int64_t n, uint64_t seed, uint64_t epoch,
                      uint32_t stream);

/* The read function of a field dataset (em_dataset_class_def.read_fields). */
typedef em_status (*em__fields_read_fn)(void *state, const int64_t *indices, int64_t n,
                                        void *const *data, int64_t *const *lengths);

struct em_dataset {
    atomic_int refcount;
    em_dataset_info info;          /* a field dataset: length, and input/target where they fit */
    char *name;
    /* Exactly one of the two: a 1.0 read (fields "input" and "target"), or a fields read. */
    em_status (*read)(void *state, const int64_t *indices, int64_t n, void *inputs,
                      void *targets);
    em__fields_read_fn read_fields;
    void (*close)(void *state);
    void *state;
    size_t input_bytes, target_bytes; /* per item (1.0 layout; 0 when a field is missing) */
    int nf;
    em_field fields[EM_MAX_FIELDS];   /* names point into names[] */
    char names[EM_MAX_FIELDS][64];
    size_t field_bytes[EM_MAX_FIELDS]; /* per item at the full shape */
    int in_f, tg_f;                   /* the fields "input" and "target"; -1 when absent */
    struct em_metadata *meta;         /* the class's metadata (owned; empty when none) */
    const struct em_metadata *meta_of; /* what em_dataset_metadata gives: meta, or a
                                        * subset's parent's */
};

/* A class name of the dataset and transform kinds: [a-z][a-z0-9_-]*. */
bool em__class_name_ok(const char *s);
/* A class's option table (n specs): every option named and typed, declared once, and its
 * default passing its own checks; errors name `who` (the registering function) and cls. */
em_status em__option_table_check(const char *who, const char *cls, const em_option_spec *opts,
                                 int n);

/* Bytes of one item's inputs / targets. */
size_t em__data_item_bytes(int ndim, const int64_t *shape, em_dtype dt);

/* Read items into per-field buffers without the range checks of em_dataset_read_fields
 * (the loader's indices are valid); lengths[f] must be set for every variable field, and the
 * lengths read are checked. */
em_status em__dataset_read_fields(em_dataset *ds, const int64_t *indices, int64_t n,
                                  void *const *data, int64_t *const *lengths);

#endif /* EMBER_DATA_INTERNAL_H */
