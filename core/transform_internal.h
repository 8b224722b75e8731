/*
 * transform_internal.h — the per-field transform pipeline (transform.c) that the DataLoader
 * (loader.c) builds from em_transform_spec lists; never installed.
 */
#ifndef EMBER_TRANSFORM_INTERNAL_H
#define EMBER_TRANSFORM_INTERNAL_H

#include "ember/data.h"
#include "ember/transform.h"
#include "internal.h"

/* The item's random stream (ember/transform.h): a cursor over the Philox blocks of
 * (seed, epoch, item). Lives on the applying thread's stack. */
struct em_transform_rng {
    uint64_t seed;
    int64_t epoch, item;
    uint32_t words[4];
    uint32_t next;       /* index of the next word of the stream */
};

/* Start the stream of `item` in `epoch` under `seed` (nothing is drawn yet). */
void em__transform_rng_init(em_transform_rng *r, uint64_t seed, int64_t epoch, int64_t item);

typedef struct em__transform_pipeline em__transform_pipeline;

/* The pipeline of one field: the specs (n of them) whose field is `field` (NULL in a spec
 * means "input"), in the order listed, each class found, its options resolved (a copy) and
 * its layout checked against what the previous stage makes of `in`; then each stage's state.
 * *out is NULL when no spec names the field (the field is delivered as read). Errors name
 * `who` ("loader"), the field, the spec's index and class, and the option or shape:
 * EM_ERR_NOTFOUND (unknown class), EM_ERR_INVALID (options), the class's layout error. */
em_status em__transform_pipeline_new(const char *who, const char *field,
                                     const em_transform_layout *in,
                                     const em_transform_spec *specs, int n,
                                     em__transform_pipeline **out /* out */);
/* What the pipeline delivers (the last stage's layout). */
const em_transform_layout *em__transform_pipeline_layout(const em__transform_pipeline *p);
/* Bytes of scratch em__transform_pipeline_apply needs for the stages between the first and
 * the last (0 for one stage); the caller allocates it once per thread. */
size_t em__transform_pipeline_scratch(const em__transform_pipeline *p);
/* Transform one item: src (the field as read) -> dst (the pipeline's layout), the stages
 * drawing from the stream of (seed, epoch, item). An apply error is returned with a message
 * naming the item, the field and the transform. */
em_status em__transform_pipeline_apply(const em__transform_pipeline *p, const void *src,
                                       void *dst, void *scratch, uint64_t seed, int64_t epoch,
                                       int64_t item);
/* Free every stage's state and options; NULL is a no-op. */
void em__transform_pipeline_free(em__transform_pipeline *p);

/* The 1.0 em_transforms of a loader as specs on the field "input" (ember/data.h's order),
 * with their option bags in opts[] (the caller frees them with em_options_free). At most
 * EM__LEGACY_TRANSFORMS specs; *n = 0 when t asks for nothing. EM_ERR_NOMEM, or
 * EM_ERR_INVALID for more than EM_OPT_MAX_LIST normalize channels. */
#define EM__LEGACY_TRANSFORMS 4
em_status em__transforms_to_specs(const em_transforms *t, em_dtype in_dtype,
                                  em_transform_spec specs[EM__LEGACY_TRANSFORMS],
                                  em_options *opts[EM__LEGACY_TRANSFORMS], int *n /* out */);

/* The "transform" kind's check of a record (declared at em_init() by plugin.c). */
em_status em__transform_class_check(const void *record, const char *who);

#endif /* EMBER_TRANSFORM_INTERNAL_H */
