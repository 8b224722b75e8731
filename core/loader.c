/*
 * loader.c — the DataLoader: samplers, per-epoch Philox permutations, batching, worker
 * threads filling a bounded ring of batch buffers, per-item transforms, pinned host buffers
 * and async copies to the target device, errors reported at their batch, and a position that
 * can be saved and restored.
 *
 * The ring. Batch b of an epoch always goes to slot b % K. A worker claims the lowest batch
 * not yet claimed once its slot is FREE (the consumer has moved past batch b - K), fills it
 * outside the lock, and marks it READY (or READY with an error). The consumer hands out the
 * slots in batch order and frees the previous one at its next call. Everything waits on
 * condition variables; nothing spins. A restart (a new epoch, em_loader_set_state) bumps a
 * generation number, waits until no worker is filling, and resets the ring; a batch made
 * under an old generation is thrown away.
 *
 * Memory: every buffer (K host slots, the workers' staging and scratch buffers for
 * transforms, the device buffers, the epoch's index list) is allocated in em_loader_new, each for
 * min(batch_size, items per epoch) items: a dataset smaller than a batch costs its size. em_loader_next
 * allocates only the views of a short last batch, once per epoch.
 *
 * Waits. Every batch's wait (the time em_loader_next blocked) goes into a log-linear
 * histogram inside the loader: exact below 64 ns, then 64 buckets per power of two, so a
 * bucket spans 1/64 of its lower edge and its midpoint is within 1/128 (0.8%) of any value
 * in it. It costs a few instructions per batch, never allocates, and holds any number of
 * batches, which a list of the last N waits would not; em_loader_wait_quantile reads it.
 */
#include <math.h>
#include <string.h>

#include "ember/data.h"
#include "ember/device.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "ember/optim.h"
#include "ember/random.h"
#include "ember/tensor.h"
#include "data_internal.h"
#include "transform_internal.h"

enum { SLOT_FREE = 0, SLOT_FILLING = 1, SLOT_READY = 2 };

/* The wait histogram: values < WAIT_SUB ns have a bucket each; above, bucket
 * WAIT_SUB + (e - WAIT_SUB_BITS) * WAIT_SUB + m holds [ (WAIT_SUB + m) << k, +1 << k ) with
 * k = e - WAIT_SUB_BITS, for the value's top bit e up to WAIT_TOP_BIT (2^41 ns, 37 minutes;
 * longer waits count in the last bucket). */
#define WAIT_SUB_BITS 6
#define WAIT_SUB (1 << WAIT_SUB_BITS)
#define WAIT_TOP_BIT 40
#define WAIT_BUCKETS (WAIT_SUB + (WAIT_TOP_BIT - WAIT_SUB_BITS + 1) * WAIT_SUB)

static int wait_bucket(uint64_t v) {
    if (v < WAIT_SUB) return (int)v;
    int e = 63 - __builtin_clzll(v);
    if (e > WAIT_TOP_BIT) return WAIT_BUCKETS - 1;
    int k = e - WAIT_SUB_BITS;
    return WAIT_SUB + k * WAIT_SUB + (int)((v >> k) - WAIT_SUB);
}

/* The midpoint of bucket i (its value when exact). */
static uint64_t wait_bucket_mid(int i) {
    if (i < WAIT_SUB) return (uint64_t)i;
    int k = (i - WAIT_SUB) / WAIT_SUB, m = (i - WAIT_SUB) % WAIT_SUB;
    return ((uint64_t)(WAIT_SUB + m) << k) + (k ? (uint64_t)1 << (k - 1) : 0);
}

typedef struct slot {
    void *in, *tg;          /* host buffers of batch_size items */
    em_tensor *tin, *ttg;   /* CPU target: tensors over in/tg (batch_size, ...) */
    int64_t batch;
    int state;
    em_status status;
    char msg[1024];
} slot;

typedef struct worker {
    struct em_loader *l;
    pthread_t thread;
    bool started;
    void *raw;              /* staging for transforms: batch_size raw items */
    void *scratch;          /* the transform pipeline's between-stage buffers */
} worker;

struct em_loader {
    em_dataset *ds;
    em_loader_options o;
    int64_t bs;
    int64_t cap;                   /* items per buffer: min(bs, epoch_len) */
    /* items */
    size_t raw_ib, out_ib, tb;     /* bytes per item: dataset inputs, delivered inputs, targets */
    em_dtype out_dtype;
    int ndim;                      /* delivered item input dims */
    int64_t shape[EM_MAX_DIMS];
    em__transform_pipeline *pipe;  /* the field "input"'s transforms; NULL: none */
    /* sampler */
    int64_t *subset;
    double *cdf;                   /* weighted: cumulative weights */
    int64_t *scratch;              /* sharded: the padded permutation */
    int64_t *idx;                  /* this epoch's item order */
    bool idx_valid;
    int64_t epoch_len, nb;
    /* ring */
    int K;
    slot *slots;
    worker *w;
    int nw;                        /* threads (0: the caller fills) */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    int64_t epoch, next_fill, next_out;
    uint64_t gen;
    int busy;
    bool stop, paused, failed;
    /* consumer side */
    int handed;                    /* slot handed out last; -1 none */
    em_tensor *view_in, *view_tg;  /* short-batch views handed out last */
    char err[1280];
    em_status err_status;
    bool stopped;                  /* after an error: until set_state */
    em_loader_stats stats;
    uint64_t wait_hist[WAIT_BUCKETS]; /* per-batch waits since the last reset (see the top) */
    /* target device */
    bool on_device, pinned;
    em_device dev;
    em_tensor *din, *dtg;          /* device buffers (batch_size, ...) */
    em_stream *stream;
    em_event *ev_consumer, *ev_copy;
    bool copy_pending;
};

/* ---- samplers ------------------------------------------------------------------------------ */

/* A uniform double in [0, 1) for draw k of the weighted stream. */
static double weighted_u(uint64_t seed, uint64_t epoch, uint64_t k) {
    uint32_t w0 = em__data_word(seed, epoch, EM__DATA_STREAM_WEIGHTED, k / 2, (unsigned)(k % 2) * 2);
    uint32_t w1 = em__data_word(seed, epoch, EM__DATA_STREAM_WEIGHTED, k / 2, (unsigned)(k % 2) * 2 + 1);
    return ((double)(w0 >> 5) * 67108864.0 + (double)(w1 >> 6)) * (1.0 / 9007199254740992.0);
}

/* The item order of `epoch` into l->idx. */
static void epoch_order(em_loader *l, int64_t epoch) {
    const em_loader_options *o = &l->o;
    int64_t N = l->ds->info.length;
    uint64_t seed = o->seed;
    switch (o->sampler) {
    case EM_SAMPLER_DEFAULT:
    case EM_SAMPLER_SEQUENTIAL:
    case EM_SAMPLER_RANDOM:
        for (int64_t i = 0; i < N; i++) l->idx[i] = i;
        if (o->shuffle || o->sampler == EM_SAMPLER_RANDOM)
            em__data_permute(l->idx, N, seed, (uint64_t)epoch, EM__DATA_STREAM_SHUFFLE);
        break;
    case EM_SAMPLER_SUBSET:
        memcpy(l->idx, l->subset, sizeof(int64_t) * (size_t)l->epoch_len);
        if (o->shuffle)
            em__data_permute(l->idx, l->epoch_len, seed, (uint64_t)epoch, EM__DATA_STREAM_SHUFFLE);
        break;
    case EM_SAMPLER_WEIGHTED: {
        double total = l->cdf[N - 1];
        for (int64_t k = 0; k < l->epoch_len; k++) {
            double u = weighted_u(seed, (uint64_t)epoch, (uint64_t)k) * total;
            int64_t lo = 0, hi = N - 1; /* the first i with cdf[i] > u */
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (l->cdf[mid] > u) hi = mid;
                else lo = mid + 1;
            }
            l->idx[k] = lo;
        }
        break;
    }
    case EM_SAMPLER_SHARDED: {
        int64_t W = o->world_size, total = l->epoch_len * W;
        for (int64_t i = 0; i < N; i++) l->scratch[i] = i;
        if (o->shuffle)
            em__data_permute(l->scratch, N, seed, (uint64_t)epoch, EM__DATA_STREAM_SHUFFLE);
        for (int64_t i = N; i < total; i++) l->scratch[i] = l->scratch[(i - N) % N];
        for (int64_t j = 0; j < l->epoch_len; j++) l->idx[j] = l->scratch[o->rank + j * W];
        break;
    }
    }
}

/* ---- filling a batch ----------------------------------------------------------------------- */

/* Make batch b of `epoch` into slot s with staging `raw`. Sets s->status and s->msg. */
static void fill(em_loader *l, worker *wk, slot *s, int64_t b, int64_t epoch) {
    int64_t start = b * l->bs, n = EM_MIN(l->bs, l->epoch_len - start);
    const int64_t *ids = l->idx + start;
    em_clear_error();
    em_status st;
    if (!l->pipe) {
        st = em_dataset_read(l->ds, ids, n, s->in, s->tg);
    } else {
        /* Each item through the field's pipeline, drawing from its own stream. */
        st = em_dataset_read(l->ds, ids, n, wk->raw, s->tg);
        for (int64_t j = 0; st == EM_OK && j < n; j++)
            st = em__transform_pipeline_apply(l->pipe,
                                              (const char *)wk->raw + (size_t)j * l->raw_ib,
                                              (char *)s->in + (size_t)j * l->out_ib, wk->scratch,
                                              l->o.seed, epoch, ids[j]);
    }
    s->status = st;
    if (st != EM_OK) snprintf(s->msg, sizeof s->msg, "%s", em_last_error());
}

static void *worker_main(void *arg) {
    worker *wk = arg;
    em_loader *l = wk->l;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        if (l->paused || l->failed || l->next_fill >= l->nb ||
            l->slots[l->next_fill % l->K].state != SLOT_FREE) {
            pthread_cond_wait(&l->cv_work, &l->mu);
            continue;
        }
        int64_t b = l->next_fill++, epoch = l->epoch;
        uint64_t gen = l->gen;
        slot *s = &l->slots[b % l->K];
        s->state = SLOT_FILLING;
        s->batch = b;
        l->busy++;
        pthread_mutex_unlock(&l->mu);
        fill(l, wk, s, b, epoch);
        pthread_mutex_lock(&l->mu);
        l->busy--;
        if (gen != l->gen) {
            s->state = SLOT_FREE; /* made for a position that no longer exists */
        } else {
            s->state = SLOT_READY;
            if (s->status != EM_OK) l->failed = true;
        }
        pthread_cond_broadcast(&l->cv_ready);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Move the ring to (epoch, batch): drop what was made ahead, compute the epoch's order. */
static void restart(em_loader *l, int64_t epoch, int64_t batch) {
    pthread_mutex_lock(&l->mu);
    l->paused = true;
    l->gen++;
    while (l->busy > 0) pthread_cond_wait(&l->cv_ready, &l->mu);
    for (int k = 0; k < l->K; k++) l->slots[k].state = SLOT_FREE;
    if (epoch != l->epoch || !l->idx_valid) epoch_order(l, epoch);
    l->idx_valid = true;
    l->epoch = epoch;
    l->next_fill = l->next_out = batch;
    l->failed = false;
    l->paused = false;
    l->handed = -1;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
}

/* ---- creation ------------------------------------------------------------------------------ */

static em_status check_options(em_loader *l) {
    const em_loader_options *o = &l->o;
    const em_dataset_info *in = &l->ds->info;
    const em_transforms *t = &o->transforms;
    int64_t N = in->length;
    char s[96];
    bool legacy = t->to_float || t->mean || t->std || t->crop_padding || t->hflip || t->scale;
    if (legacy && o->n_transform_specs)
        return em_set_error(EM_ERR_INVALID, "loader: set either transforms (the 1.0 struct) or "
                            "transform_specs, not both");
    if (o->n_transform_specs < 0 || (o->n_transform_specs > 0 && !o->transform_specs))
        return em_set_error(EM_ERR_INVALID, "loader: n_transform_specs %d without a "
                            "transform_specs array", o->n_transform_specs);
    for (int i = 0; i < o->n_transform_specs; i++) {
        const em_transform_spec *sp = &o->transform_specs[i];
        const char *f = sp->struct_size >= EM__SIZE_THROUGH(em_transform_spec, field) ? sp->field
                                                                                      : NULL;
        if (f && strcmp(f, "input") != 0)
            return em_set_error(EM_ERR_INVALID, "loader: transform_specs[%d] applies to the "
                                "field '%s'; dataset '%s' items have the fields 'input' (which "
                                "transforms apply to) and 'target'", i, f, l->ds->name);
    }
    if (o->batch_size < 0)
        return em_set_error(EM_ERR_INVALID, "loader: batch_size %lld is negative",
                            (long long)o->batch_size);
    if (o->num_workers < 0 || o->num_workers > 256 || o->prefetch < 0 || o->prefetch > 4096)
        return em_set_error(EM_ERR_INVALID, "loader: num_workers %d must be in [0, 256] and "
                            "prefetch %d in [0, 4096]", o->num_workers, o->prefetch);
    if ((unsigned)o->sampler > EM_SAMPLER_SHARDED)
        return em_set_error(EM_ERR_INVALID, "loader: unknown sampler %d", (int)o->sampler);
    if (o->sampler == EM_SAMPLER_SEQUENTIAL && o->shuffle)
        return em_set_error(EM_ERR_INVALID, "loader: the sequential sampler cannot shuffle "
                            "(set shuffle = false, or use EM_SAMPLER_RANDOM)");
    if (o->sampler == EM_SAMPLER_WEIGHTED && o->shuffle)
        return em_set_error(EM_ERR_INVALID, "loader: the weighted sampler draws at random "
                            "already; shuffle must be false");
    if (o->sampler == EM_SAMPLER_SUBSET) {
        if (o->subset_len <= 0 || !o->subset)
            return em_set_error(EM_ERR_INVALID, "loader: the subset sampler needs subset and "
                                "subset_len > 0");
        for (int64_t j = 0; j < o->subset_len; j++)
            if (o->subset[j] < 0 || o->subset[j] >= N)
                return em_set_error(EM_ERR_RANGE, "loader: subset[%lld] = %lld is out of range "
                                    "for dataset '%s' of length %lld", (long long)j,
                                    (long long)o->subset[j], l->ds->name, (long long)N);
    }
    if (o->sampler == EM_SAMPLER_WEIGHTED) {
        if (!o->weights || N == 0)
            return em_set_error(EM_ERR_INVALID, "loader: the weighted sampler needs one weight "
                                "per item (and a non-empty dataset)");
        if (o->num_samples < 0)
            return em_set_error(EM_ERR_INVALID, "loader: num_samples %lld is negative",
                                (long long)o->num_samples);
        double total = 0;
        for (int64_t i = 0; i < N; i++) {
            if (!(o->weights[i] >= 0) || !isfinite(o->weights[i]))
                return em_set_error(EM_ERR_INVALID, "loader: weights[%lld] = %g; weights must "
                                    "be finite and >= 0", (long long)i, o->weights[i]);
            total += o->weights[i];
        }
        if (!(total > 0))
            return em_set_error(EM_ERR_INVALID, "loader: the weights sum to 0; at least one "
                                "item must have a positive weight");
    }
    if (o->sampler == EM_SAMPLER_SHARDED &&
        (o->world_size < 1 || o->rank < 0 || o->rank >= o->world_size || N == 0))
        return em_set_error(EM_ERR_INVALID, "loader: the sharded sampler needs 0 <= rank < "
                            "world_size (rank %d, world_size %d) and a non-empty dataset",
                            o->rank, o->world_size);
    bool geometry = t->crop_padding != 0 || t->hflip;
    if (t->crop_padding < 0)
        return em_set_error(EM_ERR_INVALID, "loader: crop_padding %d is negative",
                            t->crop_padding);
    if (geometry && in->input_ndim != 3)
        return em_set_error(EM_ERR_SHAPE, "loader: random crop and flip need items of shape "
                            "(C, H, W); dataset '%s' items are %s", l->ds->name,
                            em__shape_str(in->input_ndim, in->input_shape, s, sizeof s));
    if (t->mean || t->std) {
        if (!t->mean || !t->std || in->input_ndim < 1 || t->n_channels != in->input_shape[0])
            return em_set_error(EM_ERR_SHAPE, "loader: normalize needs mean and std with one "
                                "value per channel (item dim 0); dataset '%s' items are %s and "
                                "n_channels is %d", l->ds->name,
                                em__shape_str(in->input_ndim, in->input_shape, s, sizeof s),
                                t->n_channels);
        for (int c = 0; c < t->n_channels; c++)
            if (!(t->std[c] > 0) || !isfinite(t->mean[c]))
                return em_set_error(EM_ERR_INVALID, "loader: normalize channel %d: std %g must "
                                    "be > 0 and mean %g finite", c, t->std[c], t->mean[c]);
    }
    if (t->scale < 0 || !isfinite(t->scale))
        return em_set_error(EM_ERR_INVALID, "loader: scale %g must be finite and >= 0", t->scale);
    return EM_OK;
}

/* Host buffer of nbytes for a slot: pinned from the device when asked, else core memory. */
static void *host_buffer(em_loader *l, size_t nbytes) {
    if (l->pinned) {
        void *p = NULL;
        em_status st = em__device_ops(l->dev)->host_alloc(nbytes ? nbytes : 1, &p);
        if (st != EM_OK || !p) {
            if (!em__error_pending()) em_set_error(EM_ERR_NOMEM, "loader: page-locked host "
                                                   "allocation of %zu bytes failed", nbytes);
            return NULL;
        }
        return p;
    }
    return em__malloc(nbytes, "loader batch buffer");
}

static void host_buffer_free(em_loader *l, void *p) {
    if (!p) return;
    if (l->pinned) em__device_ops(l->dev)->host_free(p);
    else em__free(p);
}

em_loader *em_loader_new(em_dataset *ds, const em_loader_options *opts) {
    if (!ds) {
        if (!em__error_pending()) em_set_error(EM_ERR_INVALID, "loader_new: NULL dataset");
        return NULL;
    }
    em_loader_options lo = {.struct_size = sizeof lo}; /* the caller's by the prefix rule */
    if (opts && EM__STRUCT_READ(em_loader_options, &lo, opts, offsetof(em_loader_options, ext),
                                "loader_new") != EM_OK)
        return NULL;
    em_loader *l = em__calloc(1, sizeof *l, "loader");
    if (!l) return NULL;
    em__live_inc(EM__LIVE_LOADER);
    l->o = lo;
    l->ds = ds;
    l->handed = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    if (check_options(l) != EM_OK) goto fail;
    em_loader_options *o = &l->o;
    const em_dataset_info *in = &ds->info;
    int64_t N = in->length;
    l->bs = o->batch_size ? o->batch_size : 1;
    /* The caller's arrays are copied below; the copy of the options keeps no pointer. */
    const em_transforms tr = l->o.transforms, *t = &tr;
    const int64_t *subset = l->o.subset;
    const double *weights = l->o.weights;
    l->o.transforms.mean = l->o.transforms.std = NULL;
    l->o.subset = NULL;
    l->o.weights = NULL;

    /* items and transforms: the 1.0 struct becomes specs on "input" */
    em_transform_spec legacy[EM__LEGACY_TRANSFORMS];
    em_options *lopts[EM__LEGACY_TRANSFORMS];
    const em_transform_spec *specs = l->o.transform_specs;
    int nspecs = l->o.n_transform_specs;
    l->o.transform_specs = NULL;
    l->o.n_transform_specs = 0;
    if (nspecs == 0) {
        if (em__transforms_to_specs(t, in->input_dtype, legacy, lopts, &nspecs) != EM_OK)
            goto fail;
        specs = legacy;
    } else {
        for (int i = 0; i < EM__LEGACY_TRANSFORMS; i++) lopts[i] = NULL;
    }
    em_transform_layout item = {.struct_size = sizeof item, .dtype = in->input_dtype,
                                .ndim = in->input_ndim};
    memcpy(item.shape, in->input_shape, sizeof item.shape);
    em_status pst = em__transform_pipeline_new("loader", "input", &item, specs, nspecs, &l->pipe);
    for (int i = 0; i < EM__LEGACY_TRANSFORMS; i++) em_options_free(lopts[i]);
    if (pst != EM_OK) goto fail;
    const em_transform_layout *delivered = l->pipe ? em__transform_pipeline_layout(l->pipe) : &item;
    l->ndim = delivered->ndim;
    memcpy(l->shape, delivered->shape, sizeof l->shape);
    l->out_dtype = delivered->dtype;
    l->raw_ib = ds->input_bytes;
    l->out_ib = em__data_item_bytes(l->ndim, l->shape, l->out_dtype);
    l->tb = ds->target_bytes;

    /* sampler */
    switch (o->sampler) {
    case EM_SAMPLER_SUBSET:
        l->epoch_len = o->subset_len;
        l->subset = em__malloc(sizeof(int64_t) * (size_t)l->epoch_len, "loader subset");
        if (!l->subset) goto fail;
        memcpy(l->subset, subset, sizeof(int64_t) * (size_t)l->epoch_len);
        break;
    case EM_SAMPLER_WEIGHTED:
        l->epoch_len = o->num_samples ? o->num_samples : N;
        l->cdf = em__malloc(sizeof(double) * (size_t)N, "loader weights");
        if (!l->cdf) goto fail;
        for (int64_t i = 0; i < N; i++) l->cdf[i] = (i ? l->cdf[i - 1] : 0.0) + weights[i];
        break;
    case EM_SAMPLER_SHARDED: {
        int64_t W = o->world_size;
        l->epoch_len = (N + W - 1) / W;
        l->scratch = em__malloc(sizeof(int64_t) * (size_t)(l->epoch_len * W), "loader shard");
        if (!l->scratch) goto fail;
        break;
    }
    default:
        l->epoch_len = N;
    }
    l->nb = o->drop_last ? l->epoch_len / l->bs : (l->epoch_len + l->bs - 1) / l->bs;
    if (l->nb == 0) {
        /* An epoch without a batch would train nothing and report success. */
        if (l->epoch_len == 0)
            em_set_error(EM_ERR_INVALID, "loader: dataset '%s' has no items%s: an epoch would "
                         "have no batch", ds->name,
                         o->sampler == EM_SAMPLER_WEIGHTED ? " to draw (num_samples)" : "");
        else
            em_set_error(EM_ERR_INVALID, "loader: dataset '%s' gives %lld items per epoch, "
                         "fewer than batch_size %lld, and drop_last drops them: an epoch would "
                         "have no batch (lower batch_size or turn drop_last off)", ds->name,
                         (long long)l->epoch_len, (long long)l->bs);
        goto fail;
    }
    /* Buffers hold a batch, or the whole epoch when that is smaller. */
    l->cap = EM_MIN(l->bs, l->epoch_len);
    l->idx = em__malloc(sizeof(int64_t) * (size_t)(l->epoch_len ? l->epoch_len : 1), "loader order");
    if (!l->idx) goto fail;

    /* target device */
    l->dev = o->device;
    if (em__device_check(l->dev, "loader") != EM_OK) goto fail;
    l->on_device = l->dev.type != EM_DEVICE_CPU_TYPE;
    l->pinned = l->on_device && o->pin_memory && em__device_ops(l->dev)->host_alloc &&
                em__device_ops(l->dev)->host_free;

    /* ring */
    l->nw = o->num_workers;
    l->K = l->nw == 0 ? 1 : o->prefetch ? o->prefetch : EM_MAX(2, 2 * l->nw);
    l->slots = em__calloc((size_t)l->K, sizeof *l->slots, "loader ring");
    if (!l->slots) goto fail;
    int64_t bshape[EM_MAX_DIMS + 1];
    bshape[0] = l->cap;
    memcpy(bshape + 1, l->shape, sizeof(int64_t) * (size_t)l->ndim);
    int64_t tshape[EM_MAX_DIMS + 1];
    tshape[0] = l->cap;
    memcpy(tshape + 1, in->target_shape, sizeof(int64_t) * (size_t)in->target_ndim);
    for (int k = 0; k < l->K; k++) {
        slot *s = &l->slots[k];
        if (!l->on_device) {
            s->tin = em__tensor_new(l->ndim + 1, bshape, l->out_dtype, l->dev, EM_MEM_DATA);
            s->ttg = em__tensor_new(in->target_ndim + 1, tshape, in->target_dtype, l->dev,
                                    EM_MEM_DATA);
            if (!s->tin || !s->ttg) goto fail;
            s->in = em_tensor_data(s->tin);
            s->tg = em_tensor_data(s->ttg);
        } else {
            s->in = host_buffer(l, (size_t)l->cap * l->out_ib);
            s->tg = host_buffer(l, (size_t)l->cap * l->tb);
            if (!s->in || !s->tg) goto fail;
        }
    }
    if (l->on_device) {
        l->din = em__tensor_new(l->ndim + 1, bshape, l->out_dtype, l->dev, EM_MEM_DATA);
        l->dtg = em__tensor_new(in->target_ndim + 1, tshape, in->target_dtype, l->dev, EM_MEM_DATA);
        if (!l->din || !l->dtg) goto fail;
        /* The buffers were allocated on this thread's current stream and the loader's
         * stream writes them: their blocks wait for it too when freed. */
        if (em_stream_create(l->dev, &l->stream) != EM_OK ||
            em_event_create(l->dev, &l->ev_consumer) != EM_OK ||
            em_event_create(l->dev, &l->ev_copy) != EM_OK ||
            em_tensor_record_stream(l->din, l->stream) != EM_OK ||
            em_tensor_record_stream(l->dtg, l->stream) != EM_OK)
            goto fail;
    }
    int nctx = l->nw ? l->nw : 1;
    l->w = em__calloc((size_t)nctx, sizeof *l->w, "loader workers");
    if (!l->w) goto fail;
    for (int i = 0; i < nctx; i++) {
        l->w[i].l = l;
        if (!l->pipe) continue;
        size_t scratch = em__transform_pipeline_scratch(l->pipe);
        if (!(l->w[i].raw = em__malloc((size_t)l->cap * l->raw_ib, "loader staging")) ||
            (scratch && !(l->w[i].scratch = em__malloc(scratch, "loader transform scratch"))))
            goto fail;
    }
    restart(l, 0, 0);
    for (int i = 0; i < l->nw; i++) {
        if (pthread_create(&l->w[i].thread, NULL, worker_main, &l->w[i]) != 0) {
            em_set_error(EM_ERR_NOMEM, "loader: cannot start worker thread %d of %d", i, l->nw);
            goto fail;
        }
        l->w[i].started = true;
    }
    return l;
fail:
    em_loader_free(l);
    return NULL;
}

/* ---- consuming ----------------------------------------------------------------------------- */

static void release_views(em_loader *l) {
    em_tensor_release(l->view_in);
    em_tensor_release(l->view_tg);
    l->view_in = l->view_tg = NULL;
}

/* The first n rows of a batch buffer, as a tensor to hand out (t itself when full). */
static em_tensor *rows(em_loader *l, em_tensor *t, int64_t n, em_tensor **view) {
    if (n == l->cap) return t;
    int64_t shape[EM_MAX_DIMS];
    memcpy(shape, em_tensor_shape(t), sizeof(int64_t) * (size_t)em_tensor_ndim(t));
    shape[0] = n;
    *view = em__tensor_view(t, em_tensor_ndim(t), shape, em_tensor_strides(t), 0);
    return *view;
}

/* Copy slot s (n items) to the device buffers, asynchronously on the loader's stream, ordered
 * by events after the consumer's work so far on its current stream (which may still read the
 * previous batch from the same buffers) and before its work from now on. */
static em_status to_device(em_loader *l, slot *s, int64_t n) {
    const em_device_ops *ops = em__device_ops(l->dev);
    em_device cpu = em_cpu();
    em_stream *consumer = em_stream_current(l->dev);
    /* The consumer's stream reads the buffers: when they are freed their blocks wait for it
     * too (it need not be the stream they were allocated on). Nothing new after the first
     * call from a stream. */
    em_status st = em_tensor_record_stream(l->din, consumer);
    if (st == EM_OK) st = em_tensor_record_stream(l->dtg, consumer);
    if (st == EM_OK) st = em_event_record(l->dev, l->ev_consumer, consumer);
    if (st == EM_OK) st = em_event_wait(l->dev, l->stream, l->ev_consumer);
    size_t ni = (size_t)n * l->out_ib, nt = (size_t)n * l->tb;
    if (st == EM_OK && ni)
        st = ops->copy(l->dev, em_tensor_data(l->din), cpu, s->in, ni, l->stream);
    if (st == EM_OK && nt)
        st = ops->copy(l->dev, em_tensor_data(l->dtg), cpu, s->tg, nt, l->stream);
    if (st == EM_OK) st = em_event_record(l->dev, l->ev_copy, l->stream);
    if (st == EM_OK) st = em_event_wait(l->dev, consumer, l->ev_copy);
    if (st == EM_OK) {
        em__placement_count_copy(l->dev, cpu, ni + nt);
        l->copy_pending = true;
    }
    return st;
}

em_status em_loader_next(em_loader *l, em_tensor **inputs, em_tensor **targets) {
    if (inputs) *inputs = NULL;
    if (targets) *targets = NULL;
    if (!l || !inputs || !targets)
        return em_set_error(EM_ERR_INVALID, "loader_next: NULL loader or output");
    uint64_t t0 = em__now_ns();
    release_views(l);
    if (l->copy_pending) {
        /* The host slot may be refilled only once the copy out of it has finished. */
        l->copy_pending = false;
        em_status st = em_event_synchronize(l->dev, l->ev_copy);
        if (st != EM_OK) return st;
    }
    int64_t b = l->next_out;
    bool ahead = l->nw > 0 && !l->stopped && b < l->nb; /* a worker made (or makes) batch b */
    slot *s = &l->slots[b % l->K];
    if (l->handed >= 0 || ahead) {
        /* Hand the previous slot back and take batch b in one critical section; then wake
         * ONE worker for the one freed slot, after unlocking (a woken worker would otherwise
         * block on the mutex at once). Not a broadcast: measured with 2 workers, glibc's
         * broadcast blocked the consumer for about one batch fill (~80 us per Fashion-MNIST
         * batch of 128), as a broadcast may wait for threads woken earlier to leave the
         * condition variable; a signal costs the wake-up of one sleeping thread (< 10 us). */
        bool freed = l->handed >= 0;
        pthread_mutex_lock(&l->mu);
        if (freed) {
            l->slots[l->handed].state = SLOT_FREE;
            l->handed = -1;
        }
        while (ahead && !(s->state == SLOT_READY && s->batch == b)) {
            if (freed) pthread_cond_signal(&l->cv_work);
            freed = false;
            pthread_cond_wait(&l->cv_ready, &l->mu);
        }
        pthread_mutex_unlock(&l->mu);
        if (freed) pthread_cond_signal(&l->cv_work);
    }
    if (l->stopped)
        return em_set_error(EM_ERR_STATE,
                            "loader: stopped after an error (em_loader_set_state restarts it): %s",
                            l->err);
    if (b >= l->nb) {
        restart(l, l->epoch + 1, 0); /* the workers begin the next epoch now */
        return EM_OK;
    }
    if (l->nw == 0) {
        s->batch = b;
        fill(l, &l->w[0], s, b, l->epoch);
    }
    l->handed = (int)(b % l->K);
    uint64_t wait = em__now_ns() - t0;
    l->stats.wait_ns += wait;
    l->stats.last_wait_ns = wait;
    l->stats.max_wait_ns = EM_MAX(l->stats.max_wait_ns, wait);
    l->wait_hist[wait_bucket(wait)]++;
    if (s->status != EM_OK) {
        l->stopped = true;
        l->err_status = s->status;
        snprintf(l->err, sizeof l->err, "batch %lld of epoch %lld: %s", (long long)b,
                 (long long)l->epoch, s->msg);
        return em_set_error(s->status, "loader: %s", l->err);
    }
    int64_t n = EM_MIN(l->bs, l->epoch_len - b * l->bs);
    em_tensor *bin, *btg;
    if (l->on_device) {
        em_status st = to_device(l, s, n);
        if (st != EM_OK) {
            l->stopped = true;
            l->err_status = st;
            snprintf(l->err, sizeof l->err, "batch %lld of epoch %lld: copy to the device: %s",
                     (long long)b, (long long)l->epoch, em_last_error());
            return em_set_error(st, "loader: %s", l->err);
        }
        bin = l->din;
        btg = l->dtg;
    } else {
        bin = s->tin;
        btg = s->ttg;
    }
    em_tensor_bump_version(bin);
    em_tensor_bump_version(btg);
    *inputs = rows(l, bin, n, &l->view_in);
    *targets = rows(l, btg, n, &l->view_tg);
    if (!*inputs || !*targets) {
        *inputs = *targets = NULL;
        release_views(l);
        return em_last_status() != EM_OK ? em_last_status() : EM_ERR_NOMEM;
    }
    l->next_out = b + 1;
    l->stats.batches++;
    return EM_OK;
}

int64_t em_loader_num_batches(const em_loader *l) { return l ? l->nb : 0; }

em_loader_state em_loader_get_state(const em_loader *l) {
    em_loader_state s = {0, 0, 0};
    if (!l) return s;
    s.seed = l->o.seed;
    s.epoch = l->epoch;
    s.batch = l->next_out;
    return s;
}

em_status em_loader_set_state(em_loader *l, em_loader_state s) {
    if (!l) return em_set_error(EM_ERR_INVALID, "loader_set_state: NULL loader");
    /* epoch <= EM_STEP_MAX: the loader counts epochs on from it */
    if (s.epoch < 0 || s.epoch > EM_STEP_MAX || s.batch < 0 || s.batch > l->nb)
        return em_set_error(EM_ERR_RANGE, "loader_set_state: epoch %lld, batch %lld is not a "
                            "position of this loader (epoch in [0, %lld], batch in [0, %lld]: "
                            "%lld batches per epoch)", (long long)s.epoch, (long long)s.batch,
                            (long long)EM_STEP_MAX, (long long)l->nb, (long long)l->nb);
    release_views(l);
    if (l->copy_pending) {
        l->copy_pending = false;
        em_event_synchronize(l->dev, l->ev_copy);
    }
    l->o.seed = s.seed;
    l->idx_valid = false; /* the seed may have changed */
    l->stopped = false;
    l->err[0] = '\0';
    restart(l, s.epoch, s.batch);
    return EM_OK;
}

em_loader_stats em_loader_get_stats(const em_loader *l) {
    em_loader_stats s = {0, 0, 0, 0};
    return l ? l->stats : s;
}

void em_loader_reset_stats(em_loader *l) {
    if (!l) return;
    memset(&l->stats, 0, sizeof l->stats);
    memset(l->wait_hist, 0, sizeof l->wait_hist);
}

uint64_t em_loader_wait_quantile(const em_loader *l, double q) {
    if (!l || !(q >= 0 && q <= 1)) return 0;
    uint64_t n = 0;
    for (int i = 0; i < WAIT_BUCKETS; i++) n += l->wait_hist[i];
    if (n == 0) return 0;
    /* the k-th smallest wait, k = ceil(q n) in [1, n] (q = 0.5: the lower median) */
    uint64_t k = (uint64_t)ceil(q * (double)n);
    if (k < 1) k = 1;
    if (k > n) k = n;
    uint64_t seen = 0;
    for (int i = 0; i < WAIT_BUCKETS; i++)
        if ((seen += l->wait_hist[i]) >= k) return wait_bucket_mid(i);
    return wait_bucket_mid(WAIT_BUCKETS - 1);
}

void em_loader_free(em_loader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv_work);
    pthread_mutex_unlock(&l->mu);
    int nctx = l->nw ? l->nw : 1;
    for (int i = 0; l->w && i < l->nw; i++)
        if (l->w[i].started) pthread_join(l->w[i].thread, NULL);
    release_views(l);
    if (l->copy_pending) em_event_synchronize(l->dev, l->ev_copy);
    for (int i = 0; l->w && i < nctx; i++) {
        em__free(l->w[i].raw);
        em__free(l->w[i].scratch);
    }
    em__free(l->w);
    for (int k = 0; l->slots && k < l->K; k++) {
        slot *s = &l->slots[k];
        if (s->tin || s->ttg) {
            em_tensor_release(s->tin);
            em_tensor_release(s->ttg);
        } else {
            host_buffer_free(l, s->in);
            host_buffer_free(l, s->tg);
        }
    }
    em__free(l->slots);
    em_tensor_release(l->din);
    em_tensor_release(l->dtg);
    if (l->ev_copy) em_event_free(l->dev, l->ev_copy);
    if (l->ev_consumer) em_event_free(l->dev, l->ev_consumer);
    if (l->stream) em_stream_free(l->dev, l->stream);
    em__transform_pipeline_free(l->pipe);
    em__free(l->subset);
    em__free(l->cdf);
    em__free(l->scratch);
    em__free(l->idx);
    pthread_cond_destroy(&l->cv_work);
    pthread_cond_destroy(&l->cv_ready);
    pthread_mutex_destroy(&l->mu);
    em__free(l);
    em__live_dec(EM__LIVE_LOADER);
}
