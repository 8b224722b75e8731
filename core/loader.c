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
 * Memory: every buffer (K host slots of every field, with a variable field's lengths and mask;
 * the workers' staging and scratch buffers for transforms and padding; the device buffers;
 * the epoch's index list) is allocated in em_loader_new, each for min(batch_size, items per
 * epoch) items (a variable field's at its longest): a dataset smaller than a batch costs its
 * size. em_loader_next allocates only the views of a short last batch, once per epoch, and
 * of each padded field's batch, lengths and mask.
 *
 * Waits. Every batch's wait (the time em_loader_next blocked) goes into a log-linear
 * histogram inside the loader: exact below 64 ns, then 64 buckets per power of two, so a
 * bucket spans 1/64 of its lower edge and its midpoint is within 1/128 (0.8%) of any value
 * in it. It costs a few instructions per batch, never allocates, and holds any number of
 * batches, which a list of the last N waits would not; em_loader_wait_quantile reads it.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#define LOADER_STREAM 1
#endif

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

/* One field as the loader delivers it. */
typedef struct lfield {
    const em_field *df;            /* the dataset's */
    em_dtype dtype;                /* delivered (float32 after to-float) */
    size_t raw_ib, out_ib, es;     /* bytes per item as read / delivered (full shape); element */
    bool staged;                   /* read into the worker's staging first (transform, padding) */
    em__transform_pipeline *pipe;  /* the field's transforms; NULL: none */
    int ndim;                      /* the item as delivered (variable dim at its longest) */
    int64_t shape[EM_MAX_DIMS];
    bool variable;
    int64_t outer, inner, maxlen;  /* variable: elements before / after its dim; longest */
    unsigned char pad[16];         /* one element holding pad_value */
    bool pad_zero;
} lfield;

typedef struct slot {
    void *buf[EM_MAX_FIELDS];       /* host buffers of batch_size items (full shape) */
    em_tensor *t[EM_MAX_FIELDS];    /* CPU target: tensors over buf (cap, ...) */
    int64_t *len[EM_MAX_FIELDS];    /* variable fields: cap lengths; NULL for fixed ones */
    uint8_t *mask[EM_MAX_FIELDS];   /* variable fields: the (n, L) mask at the front */
    em_tensor *tlen[EM_MAX_FIELDS], *tmask[EM_MAX_FIELDS]; /* CPU target: over len / mask */
    int64_t L[EM_MAX_FIELDS];       /* variable fields: the batch's longest item */
    int64_t batch;
    int state;
    em_status status;
    char msg[1024];
} slot;

typedef struct worker {
    struct em_loader *l;
    pthread_t thread;
    bool started;
    void *raw[EM_MAX_FIELDS];       /* staging for staged fields: batch_size raw items */
    void *scratch;                  /* the transform pipelines' between-stage buffers */
    void *item;                     /* workers: one transformed item, then streamed (fill) */
} worker;

/* The batch handed out last (em_loader_next_v2). */
struct em_batch {
    int64_t n;
    int nf;
    const char *name[EM_MAX_FIELDS];
    em_tensor *t[EM_MAX_FIELDS], *len[EM_MAX_FIELDS], *mask[EM_MAX_FIELDS];
};

struct em_loader {
    em_dataset *ds;
    em_loader_options_v2 o;        /* transforms, the arrays, name are NULL after creation */
    int64_t bs;
    int64_t cap;                   /* items per buffer: min(bs, epoch_len) */
    /* items */
    int nf;
    lfield f[EM_MAX_FIELDS];
    size_t scratch_bytes;          /* the largest pipeline scratch */
    size_t item_bytes;             /* the largest transformed item (worker's item buffer) */
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
    char name[EM_LOADER_NAME_MAX + 1]; /* options.name ("": none): the workers' trace names */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_ready;
    int64_t epoch, next_fill, next_out;
    uint64_t gen;
    int busy;
    bool stop, paused, failed;
    /* consumer side */
    int handed;                    /* slot handed out last; -1 none */
    em_tensor *views[3 * EM_MAX_FIELDS]; /* views handed out last (short or padded batches) */
    int nviews;
    em_batch batch;
    char err[1280];
    em_status err_status;
    bool stopped;                  /* after an error: until set_state */
    em_loader_stats stats;
    uint64_t wait_hist[WAIT_BUCKETS]; /* per-batch waits since the last reset (see the top) */
    /* target device */
    bool on_device, pinned;
    em_device dev;
    em_tensor *dt[EM_MAX_FIELDS];  /* device buffers (cap, ...) */
    em_tensor *dlen[EM_MAX_FIELDS], *dmask[EM_MAX_FIELDS];
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
    const em_loader_options_v2 *o = &l->o;
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

/* Pad field k's n items from the staging (each contiguous in its own shape at the full
 * item stride) into the slot: (n, ..., L, ...) contiguous with L the batch's longest, and
 * the (n, L) mask. */
static void pad_field(const em_loader *l, int k, const void *raw, slot *s, int64_t n) {
    const lfield *lf = &l->f[k];
    const int64_t *len = s->len[k];
    int64_t L = 0;
    for (int64_t j = 0; j < n; j++) L = EM_MAX(L, len[j]);
    s->L[k] = L;
    size_t es = lf->es, row = (size_t)lf->inner * es;
    for (int64_t j = 0; j < n; j++) {
        const char *src = (const char *)raw + (size_t)j * lf->raw_ib;
        char *dst = (char *)s->buf[k] + (size_t)j * (size_t)(lf->outer * L) * row;
        size_t have = (size_t)len[j] * row, room = (size_t)L * row;
        for (int64_t o = 0; o < lf->outer; o++) {
            char *d = dst + (size_t)o * room;
            memcpy(d, src + (size_t)o * have, have);
            if (lf->pad_zero) {
                memset(d + have, 0, room - have);
            } else {
                for (size_t b = have; b < room; b += es) memcpy(d + b, lf->pad, es);
            }
        }
        uint8_t *m = s->mask[k] + j * L;
        for (int64_t t = 0; t < L; t++) m[t] = t < len[j];
    }
}

/* Copy n bytes with non-temporal stores (past the cache, into memory), for a batch that a
 * worker thread makes and another thread reads a step later. Written through the cache, a
 * batch evicts what the training threads keep there: a Fashion-MNIST batch of 128 float32
 * images is 401 KB, a Zen 4 core's L2 1 MB, and the first layer's weights 803 KB; a loader
 * thread runs on the cores the training threads use. The transformed items of an epoch of
 * examples/fashion-mnist-mlp.yaml on the bench VM (2 Zen 4 cores), streamed instead of
 * written in place: the whole process 0.576 s against 0.655 s (bench/README.md, "The
 * whole-process epoch outside its products"). The caller fences (_mm_sfence) before the batch is handed over: the
 * stores are weakly ordered. */
#define LOADER_STREAM_ITEM_MAX ((size_t)256 << 10)

static void stream_copy(void *dst, const void *src, size_t n) {
#ifdef LOADER_STREAM
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    for (; n >= 16; n -= 16, d += 16, s += 16)
        _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, n);
#else
    memcpy(dst, src, n);
#endif
}

/* Make batch b of `epoch` into slot s with the worker's staging. Sets s->status and s->msg. */
static void fill(em_loader *l, worker *wk, slot *s, int64_t b, int64_t epoch) {
    uint64_t t0 = em__spanning() ? em__now_ns() : 0;
    int64_t start = b * l->bs, n = EM_MIN(l->bs, l->epoch_len - start);
    const int64_t *ids = l->idx + start;
    em_clear_error();
    void *data[EM_MAX_FIELDS];
    for (int k = 0; k < l->nf; k++) data[k] = l->f[k].staged ? wk->raw[k] : s->buf[k];
    em_status st = em__dataset_read_fields(l->ds, ids, n, data, s->len);
    for (int k = 0; st == EM_OK && k < l->nf; k++) {
        const lfield *lf = &l->f[k];
        if (lf->pipe) {
            /* Each item through the field's pipeline, drawing from its own stream; a worker
             * makes it in its item buffer and streams it into the slot (stream_copy). */
            for (int64_t j = 0; st == EM_OK && j < n; j++) {
                const char *src = (const char *)wk->raw[k] + (size_t)j * lf->raw_ib;
                char *dst = (char *)s->buf[k] + (size_t)j * lf->out_ib;
                st = em__transform_pipeline_apply(lf->pipe, src, wk->item ? wk->item : dst,
                                                  wk->scratch, l->o.seed, epoch, ids[j]);
                if (st == EM_OK && wk->item) stream_copy(dst, wk->item, lf->out_ib);
            }
        } else if (lf->variable) {
            pad_field(l, k, wk->raw[k], s, n);
        }
    }
#ifdef LOADER_STREAM
    if (wk->item) _mm_sfence(); /* the streamed items before the slot is marked ready */
#endif
    s->status = st;
    if (st != EM_OK) snprintf(s->msg, sizeof s->msg, "%s", em_last_error());
    if (em__spanning()) em__prof_span("loader_fill", "data", "batch", NULL, b, t0, em__now_ns());
}

static void *worker_main(void *arg) {
    worker *wk = arg;
    em_loader *l = wk->l;
    /* its track in a trace */
    em__thread_set_name("%s worker %d", l->name[0] ? l->name : "loader", (int)(wk - l->w));
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

/* The field a spec names ("input" when NULL or when the spec predates the field). */
static const char *spec_field(const em_transform_spec *sp) {
    const char *f = sp->struct_size >= EM__SIZE_THROUGH(em_transform_spec, field) ? sp->field
                                                                                  : NULL;
    return f ? f : "input";
}

/* Check the options; t: the 1.0 transforms; `list`: the spec list's name in the caller's
 * options ("transform_specs" or "transforms"). */
static em_status check_options(em_loader *l, const em_transforms *t, const char *list) {
    const em_loader_options_v2 *o = &l->o;
    const em_dataset_info *in = &l->ds->info;
    int64_t N = in->length;
    char s[96];
    bool legacy = t->to_float || t->mean || t->std || t->crop_padding || t->hflip || t->scale;
    if (legacy && o->n_transforms)
        return em_set_error(EM_ERR_INVALID, "loader: set either transforms (the 1.0 struct) or "
                            "transform_specs, not both");
    if (o->n_transforms < 0 || (o->n_transforms > 0 && !o->transforms))
        return em_set_error(EM_ERR_INVALID, "loader: n_%s %d without a %s array", list,
                            o->n_transforms, list);
    for (int i = 0; i < o->n_transforms; i++) {
        const char *f = spec_field(&o->transforms[i]);
        int k = em_dataset_field_index(l->ds, f);
        if (k < 0)
            return em_set_error(EM_ERR_INVALID, "loader: %s[%d] applies to the field '%s': %s",
                                list, i, f, em_last_error());
        if (l->ds->fields[k].variable)
            return em_set_error(EM_ERR_INVALID, "loader: %s[%d] applies to the field '%s' of "
                                "dataset '%s', which is variable-length (transforms take fixed "
                                "fields)", list, i, f, l->ds->name);
    }
    if (o->batch_size < 0)
        return em_set_error(EM_ERR_INVALID, "loader: batch_size %lld is negative",
                            (long long)o->batch_size);
    if (o->num_workers < 0 || o->num_workers > 256 || o->prefetch < 0 || o->prefetch > 4096)
        return em_set_error(EM_ERR_INVALID, "loader: num_workers %d must be in [0, 256] and "
                            "prefetch %d in [0, 4096]", o->num_workers, o->prefetch);
    if (o->name) { /* the workers' names in a trace: "<name> worker 255" fits their 31 bytes */
        size_t n = strlen(o->name);
        if (n > EM_LOADER_NAME_MAX)
            return em_set_error(EM_ERR_INVALID, "loader: name '%.*s...' has %zu bytes; at most "
                                "%d", EM_LOADER_NAME_MAX, o->name, n, EM_LOADER_NAME_MAX);
        for (size_t i = 0; i < n; i++)
            if (o->name[i] < 0x20 || o->name[i] > 0x7e)
                return em_set_error(EM_ERR_INVALID, "loader: name has byte 0x%02x at %zu; it "
                                    "takes printable ASCII only", (unsigned char)o->name[i], i);
    }
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
    if (o->sampler == EM_SAMPLER_SHARDED && o->shard_drop_last && N < o->world_size)
        return em_set_error(EM_ERR_INVALID, "loader: dataset '%s' has %lld items, fewer than "
                            "world_size %d: with shard_drop_last every shard would be empty "
                            "(use fewer ranks, more data, or padding: shard_drop_last false)",
                            l->ds->name, (long long)N, o->world_size);
    bool geometry = t->crop_padding != 0 || t->hflip;
    bool any = geometry || t->to_float || t->mean || t->std;
    int in_f = l->ds->in_f;
    if (any && (in_f < 0 || l->ds->fields[in_f].variable))
        return em_set_error(EM_ERR_INVALID, "loader: the transforms apply to a fixed field "
                            "'input'; dataset '%s' %s", l->ds->name,
                            in_f < 0 ? "has no field 'input'" : "has a variable-length 'input'");
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

/* The batch shape of field f for n items: (n, item shape as delivered) with the variable
 * dim at L (L < 0: the field's longest). */
static void field_shape(const em_loader *l, int f, int64_t n, int64_t L, int64_t *shp) {
    const lfield *lf = &l->f[f];
    shp[0] = n;
    memcpy(shp + 1, lf->shape, sizeof(int64_t) * (size_t)lf->ndim);
    if (lf->variable && L >= 0) shp[1 + lf->df->var_dim] = L;
}

/* The fields as delivered: each one's transform pipeline (from the specs naming it), whether
 * it is staged, its bytes, its padding. */
static em_status plan_fields(em_loader *l, const em_transform_spec *specs, int nspecs) {
    const em_dataset *ds = l->ds;
    l->nf = ds->nf;
    for (int k = 0; k < l->nf; k++) {
        lfield *lf = &l->f[k];
        const em_field *df = &ds->fields[k];
        lf->df = df;
        lf->dtype = df->dtype;
        lf->ndim = df->ndim;
        memcpy(lf->shape, df->shape, sizeof lf->shape);
        lf->es = em_dtype_size(df->dtype);
        lf->raw_ib = lf->out_ib = ds->field_bytes[k];
        lf->variable = df->variable;
        if (!lf->variable) {
            em_transform_layout item = {.struct_size = sizeof item, .dtype = df->dtype,
                                        .ndim = df->ndim};
            memcpy(item.shape, df->shape, sizeof item.shape);
            /* only the specs naming this field (the pipeline skips the others) */
            em_status st = em__transform_pipeline_new("loader", df->name, &item, specs, nspecs,
                                                      &lf->pipe);
            if (st != EM_OK) return st;
        }
        if (lf->pipe) {
            const em_transform_layout *d = em__transform_pipeline_layout(lf->pipe);
            lf->staged = true;
            lf->dtype = d->dtype;
            lf->ndim = d->ndim;
            memcpy(lf->shape, d->shape, sizeof lf->shape);
            lf->out_ib = em__data_item_bytes(lf->ndim, lf->shape, lf->dtype);
            lf->es = em_dtype_size(lf->dtype);
            l->scratch_bytes = EM_MAX(l->scratch_bytes, em__transform_pipeline_scratch(lf->pipe));
            l->item_bytes = EM_MAX(l->item_bytes, lf->out_ib);
        }
        if (lf->variable) {
            lf->staged = true;
            lf->outer = em__numel(df->var_dim, df->shape);
            lf->inner = em__numel(df->ndim - df->var_dim - 1, df->shape + df->var_dim + 1);
            lf->maxlen = df->shape[df->var_dim];
            memset(lf->pad, 0, sizeof lf->pad);
            em_dtype_store(df->dtype, lf->pad, 0, df->pad_value);
            lf->pad_zero = true;
            for (size_t b = 0; b < lf->es; b++) lf->pad_zero &= lf->pad[b] == 0;
        }
    }
    return EM_OK;
}

/* The loader over ds with options o (already read by the prefix rule), the 1.0 transforms
 * tr, and the name of o's spec list in the caller's struct (for messages). */
static em_loader *loader_create(em_dataset *ds, const em_loader_options_v2 *opts,
                                const em_transforms *tr, const char *list) {
    em_loader *l = em__calloc(1, sizeof *l, "loader");
    if (!l) return NULL;
    em__live_inc(EM__LIVE_LOADER);
    l->o = *opts;
    l->ds = ds;
    l->handed = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv_work, NULL);
    pthread_cond_init(&l->cv_ready, NULL);
    if (check_options(l, tr, list) != EM_OK) goto fail;
    em_loader_options_v2 *o = &l->o;
    const em_dataset_info *in = &ds->info;
    int64_t N = in->length;
    l->bs = o->batch_size ? o->batch_size : 1;
    /* The caller's arrays are copied below; the copy of the options keeps no pointer. */
    const int64_t *subset = l->o.subset;
    const double *weights = l->o.weights;
    const em_transform_spec *specs = l->o.transforms;
    int nspecs = l->o.n_transforms;
    l->o.subset = NULL;
    l->o.weights = NULL;
    if (o->name) snprintf(l->name, sizeof l->name, "%s", o->name);
    l->o.name = NULL;
    l->o.transforms = NULL;
    l->o.n_transforms = 0;

    /* items and transforms: the 1.0 struct becomes specs on "input" */
    em_transform_spec legacy[EM__LEGACY_TRANSFORMS];
    em_options *lopts[EM__LEGACY_TRANSFORMS];
    for (int i = 0; i < EM__LEGACY_TRANSFORMS; i++) lopts[i] = NULL;
    if (nspecs == 0) {
        if (em__transforms_to_specs(tr, in->input_dtype, legacy, lopts, &nspecs) != EM_OK)
            goto fail;
        specs = legacy;
    }
    em_status pst = plan_fields(l, specs, nspecs);
    for (int i = 0; i < EM__LEGACY_TRANSFORMS; i++) em_options_free(lopts[i]);
    if (pst != EM_OK) goto fail;

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
        l->epoch_len = o->shard_drop_last ? N / W : (N + W - 1) / W;
        /* the permutation of all N items, then (padding) up to epoch_len * W */
        l->scratch = em__malloc(sizeof(int64_t) * (size_t)EM_MAX(N, l->epoch_len * W),
                                "loader shard");
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
    for (int k = 0; k < l->K; k++) {
        slot *s = &l->slots[k];
        for (int f = 0; f < l->nf; f++) {
            const lfield *lf = &l->f[f];
            size_t nbytes = (size_t)l->cap * lf->out_ib;
            size_t nmask = (size_t)(l->cap * lf->maxlen);
            if (!l->on_device) {
                int64_t shp[EM_MAX_DIMS + 1];
                field_shape(l, f, l->cap, -1, shp);
                s->t[f] = em__tensor_new(lf->ndim + 1, shp, lf->dtype, l->dev, EM_MEM_DATA);
                if (!s->t[f]) goto fail;
                s->buf[f] = em_tensor_data(s->t[f]);
                if (lf->variable) {
                    int64_t nm = (int64_t)nmask;
                    s->tlen[f] = em__tensor_new(1, &l->cap, EM_I64, l->dev, EM_MEM_DATA);
                    s->tmask[f] = em__tensor_new(1, &nm, EM_BOOL, l->dev, EM_MEM_DATA);
                    if (!s->tlen[f] || !s->tmask[f]) goto fail;
                    s->len[f] = em_tensor_data(s->tlen[f]);
                    s->mask[f] = em_tensor_data(s->tmask[f]);
                }
            } else {
                if (!(s->buf[f] = host_buffer(l, nbytes))) goto fail;
                if (lf->variable &&
                    (!(s->len[f] = host_buffer(l, (size_t)l->cap * sizeof(int64_t))) ||
                     !(s->mask[f] = host_buffer(l, nmask))))
                    goto fail;
            }
        }
    }
    if (l->on_device) {
        /* The buffers were allocated on this thread's current stream and the loader's
         * stream writes them: their blocks wait for it too when freed. */
        if (em_stream_create(l->dev, &l->stream) != EM_OK ||
            em_event_create(l->dev, &l->ev_consumer) != EM_OK ||
            em_event_create(l->dev, &l->ev_copy) != EM_OK)
            goto fail;
        for (int f = 0; f < l->nf; f++) {
            const lfield *lf = &l->f[f];
            int64_t shp[EM_MAX_DIMS + 1], nm = l->cap * lf->maxlen;
            field_shape(l, f, l->cap, -1, shp);
            l->dt[f] = em__tensor_new(lf->ndim + 1, shp, lf->dtype, l->dev, EM_MEM_DATA);
            if (!l->dt[f] || em_tensor_record_stream(l->dt[f], l->stream) != EM_OK) goto fail;
            if (!lf->variable) continue;
            l->dlen[f] = em__tensor_new(1, &l->cap, EM_I64, l->dev, EM_MEM_DATA);
            l->dmask[f] = em__tensor_new(1, &nm, EM_BOOL, l->dev, EM_MEM_DATA);
            if (!l->dlen[f] || !l->dmask[f] ||
                em_tensor_record_stream(l->dlen[f], l->stream) != EM_OK ||
                em_tensor_record_stream(l->dmask[f], l->stream) != EM_OK)
                goto fail;
        }
    }
    int nctx = l->nw ? l->nw : 1;
    l->w = em__calloc((size_t)nctx, sizeof *l->w, "loader workers");
    if (!l->w) goto fail;
    for (int i = 0; i < nctx; i++) {
        l->w[i].l = l;
        if (l->scratch_bytes &&
            !(l->w[i].scratch = em__malloc(l->scratch_bytes, "loader transform scratch")))
            goto fail;
        /* the consumer is another thread: transformed items go into the slots streamed,
         * through a buffer a core's L2 keeps (larger items are written in place: the extra
         * copy would come from memory, and that case was not measured) */
        if (l->nw > 0 && l->item_bytes && l->item_bytes <= LOADER_STREAM_ITEM_MAX &&
            !(l->w[i].item = em__malloc(l->item_bytes, "loader item buffer")))
            goto fail;
        for (int f = 0; f < l->nf; f++)
            if (l->f[f].staged &&
                !(l->w[i].raw[f] = em__malloc((size_t)l->cap * l->f[f].raw_ib, "loader staging")))
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

em_loader *em_loader_new(em_dataset *ds, const em_loader_options *opts) {
    if (!ds) {
        if (!em__error_pending()) em_set_error(EM_ERR_INVALID, "loader_new: NULL dataset");
        return NULL;
    }
    em_loader_options lo = {.struct_size = sizeof lo}; /* the caller's by the prefix rule */
    if (opts && EM__STRUCT_READ(em_loader_options, &lo, opts, offsetof(em_loader_options, ext),
                                "loader_new") != EM_OK)
        return NULL;
    em_loader_options_v2 o = {
        .struct_size = sizeof o, .batch_size = lo.batch_size, .shuffle = lo.shuffle,
        .drop_last = lo.drop_last, .seed = lo.seed, .num_workers = lo.num_workers,
        .prefetch = lo.prefetch, .sampler = lo.sampler, .subset = lo.subset,
        .subset_len = lo.subset_len, .weights = lo.weights, .num_samples = lo.num_samples,
        .rank = lo.rank, .world_size = lo.world_size, .device = lo.device,
        .pin_memory = lo.pin_memory, .transforms = lo.transform_specs,
        .n_transforms = lo.n_transform_specs, .shard_drop_last = lo.shard_drop_last,
        .name = lo.name};
    return loader_create(ds, &o, &lo.transforms, "transform_specs");
}

em_loader *em_loader_new_v2(em_dataset *ds, const em_loader_options_v2 *opts) {
    if (!ds) {
        if (!em__error_pending()) em_set_error(EM_ERR_INVALID, "loader_new_v2: NULL dataset");
        return NULL;
    }
    em_loader_options_v2 o = {.struct_size = sizeof o};
    if (opts && EM__STRUCT_READ(em_loader_options_v2, &o, opts,
                                offsetof(em_loader_options_v2, ext), "loader_new_v2") != EM_OK)
        return NULL;
    const em_transforms none = {0};
    return loader_create(ds, &o, &none, "transforms");
}

/* ---- consuming ----------------------------------------------------------------------------- */

static void release_views(em_loader *l) {
    for (int i = 0; i < l->nviews; i++) em_tensor_release(l->views[i]);
    l->nviews = 0;
}

/* The front of a batch buffer as a contiguous (shape) tensor to hand out: t itself when the
 * shapes agree, else a view over t's storage (released at the next call). */
static em_tensor *front(em_loader *l, em_tensor *t, int ndim, const int64_t *shape) {
    if (em_tensor_ndim(t) == ndim &&
        memcmp(em_tensor_shape(t), shape, sizeof(int64_t) * (size_t)ndim) == 0)
        return t;
    int64_t strides[EM_MAX_DIMS];
    em__contiguous_strides(ndim, shape, strides);
    em_tensor *v = em__tensor_view(t, ndim, shape, strides, 0);
    if (v) l->views[l->nviews++] = v;
    return v;
}

/* Bytes of field f's batch of n items (padded to the slot's L). */
static size_t field_batch_bytes(const em_loader *l, const slot *s, int f, int64_t n) {
    const lfield *lf = &l->f[f];
    if (!lf->variable) return (size_t)n * lf->out_ib;
    return (size_t)(n * lf->outer * s->L[f] * lf->inner) * lf->es;
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
    em_status st = EM_OK;
    for (int f = 0; st == EM_OK && f < l->nf; f++) {
        st = em_tensor_record_stream(l->dt[f], consumer);
        if (st == EM_OK && l->f[f].variable) st = em_tensor_record_stream(l->dlen[f], consumer);
        if (st == EM_OK && l->f[f].variable) st = em_tensor_record_stream(l->dmask[f], consumer);
    }
    if (st == EM_OK) st = em_event_record(l->dev, l->ev_consumer, consumer);
    if (st == EM_OK) st = em_event_wait(l->dev, l->stream, l->ev_consumer);
    size_t total = 0;
    for (int f = 0; st == EM_OK && f < l->nf; f++) {
        size_t nb = field_batch_bytes(l, s, f, n);
        if (nb) st = ops->copy(l->dev, em_tensor_data(l->dt[f]), cpu, s->buf[f], nb, l->stream);
        total += nb;
        if (st != EM_OK || !l->f[f].variable) continue;
        size_t nl = (size_t)n * sizeof(int64_t), nm = (size_t)(n * s->L[f]);
        if (nl) st = ops->copy(l->dev, em_tensor_data(l->dlen[f]), cpu, s->len[f], nl, l->stream);
        if (st == EM_OK && nm)
            st = ops->copy(l->dev, em_tensor_data(l->dmask[f]), cpu, s->mask[f], nm, l->stream);
        total += nl + nm;
    }
    if (st == EM_OK) st = em_event_record(l->dev, l->ev_copy, l->stream);
    if (st == EM_OK) st = em_event_wait(l->dev, consumer, l->ev_copy);
    if (st == EM_OK) {
        em__placement_count_copy(l->dev, cpu, total);
        l->copy_pending = true;
    }
    return st;
}

/* The batch of slot s (n items) as tensors into l->batch. */
static em_status make_batch(em_loader *l, slot *s, int64_t n) {
    em_batch *bt = &l->batch;
    bt->n = n;
    bt->nf = l->nf;
    for (int f = 0; f < l->nf; f++) {
        const lfield *lf = &l->f[f];
        bt->name[f] = lf->df->name;
        bt->len[f] = bt->mask[f] = NULL;
        em_tensor *base = l->on_device ? l->dt[f] : s->t[f];
        em_tensor_bump_version(base);
        int64_t shp[EM_MAX_DIMS + 1];
        field_shape(l, f, n, lf->variable ? s->L[f] : -1, shp);
        if (!(bt->t[f] = front(l, base, lf->ndim + 1, shp))) return EM_ERR_NOMEM;
        if (!lf->variable) continue;
        em_tensor *bl = l->on_device ? l->dlen[f] : s->tlen[f];
        em_tensor *bm = l->on_device ? l->dmask[f] : s->tmask[f];
        em_tensor_bump_version(bl);
        em_tensor_bump_version(bm);
        int64_t ms[2] = {n, s->L[f]};
        if (!(bt->len[f] = front(l, bl, 1, &n)) || !(bt->mask[f] = front(l, bm, 2, ms)))
            return EM_ERR_NOMEM;
    }
    return EM_OK;
}

em_status em_loader_next_v2(em_loader *l, const em_batch **batch) {
    if (batch) *batch = NULL;
    if (!l || !batch)
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
    if (em__spanning()) em__prof_span("loader_wait", "data", "batch", NULL, b, t0, t0 + wait);
    if (s->status != EM_OK) {
        l->stopped = true;
        l->err_status = s->status;
        snprintf(l->err, sizeof l->err, "batch %lld of epoch %lld: %s", (long long)b,
                 (long long)l->epoch, s->msg);
        return em_set_error(s->status, "loader: %s", l->err);
    }
    int64_t n = EM_MIN(l->bs, l->epoch_len - b * l->bs);
    if (l->on_device) {
        em_status st = to_device(l, s, n);
        if (st != EM_OK) {
            l->stopped = true;
            l->err_status = st;
            snprintf(l->err, sizeof l->err, "batch %lld of epoch %lld: copy to the device: %s",
                     (long long)b, (long long)l->epoch, em_last_error());
            return em_set_error(st, "loader: %s", l->err);
        }
    }
    if (make_batch(l, s, n) != EM_OK) {
        release_views(l);
        return em_last_status() != EM_OK ? em_last_status() : EM_ERR_NOMEM;
    }
    *batch = &l->batch;
    l->next_out = b + 1;
    l->stats.batches++;
    return EM_OK;
}

em_status em_loader_next(em_loader *l, em_tensor **inputs, em_tensor **targets) {
    if (inputs) *inputs = NULL;
    if (targets) *targets = NULL;
    if (!l || !inputs || !targets)
        return em_set_error(EM_ERR_INVALID, "loader_next: NULL loader or output");
    if (l->ds->in_f < 0 || l->ds->tg_f < 0)
        return em_set_error(EM_ERR_NOTFOUND, "loader_next: dataset '%s' has no field '%s' "
                            "(em_loader_next_v2 gives every field by name)", l->ds->name,
                            l->ds->in_f < 0 ? "input" : "target");
    const em_batch *b = NULL;
    em_status st = em_loader_next_v2(l, &b);
    if (st != EM_OK || !b) return st;
    *inputs = b->t[l->ds->in_f];
    *targets = b->t[l->ds->tg_f];
    return EM_OK;
}

/* ---- batches -------------------------------------------------------------------------------- */

static int batch_find(const em_batch *b, const char *name, const char *who) {
    if (!b || !name) {
        em_set_error(EM_ERR_INVALID, "%s: NULL batch or name", who);
        return -1;
    }
    for (int f = 0; f < b->nf; f++)
        if (strcmp(b->name[f], name) == 0) return f;
    char list[EM_MAX_FIELDS * 66] = "";
    size_t at = 0;
    for (int f = 0; f < b->nf && at < sizeof list; f++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", f ? ", " : "", b->name[f]);
    em_set_error(EM_ERR_NOTFOUND, "%s: the batch has no field '%s' (its fields: %s)", who, name,
                 list);
    return -1;
}

int64_t em_batch_size(const em_batch *b) { return b ? b->n : 0; }
int em_batch_field_count(const em_batch *b) { return b ? b->nf : 0; }

const char *em_batch_field_name(const em_batch *b, int i) {
    if (!b || i < 0 || i >= b->nf) {
        em_set_error(EM_ERR_RANGE, "batch_field_name: index %d is out of range (%d fields)", i,
                     b ? b->nf : 0);
        return NULL;
    }
    return b->name[i];
}

em_tensor *em_batch_field(const em_batch *b, const char *name) {
    int f = batch_find(b, name, "batch_field");
    return f < 0 ? NULL : b->t[f];
}

static em_tensor *batch_padded(const em_batch *b, const char *name, bool mask, const char *who) {
    int f = batch_find(b, name, who);
    if (f < 0) return NULL;
    if (!b->len[f]) {
        em_set_error(EM_ERR_INVALID, "%s: field '%s' has a fixed shape (only variable-length "
                     "fields are padded and have lengths and a mask)", who, name);
        return NULL;
    }
    return mask ? b->mask[f] : b->len[f];
}

em_tensor *em_batch_lengths(const em_batch *b, const char *name) {
    return batch_padded(b, name, false, "batch_lengths");
}

em_tensor *em_batch_mask(const em_batch *b, const char *name) {
    return batch_padded(b, name, true, "batch_mask");
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
        for (int f = 0; f < EM_MAX_FIELDS; f++) em__free(l->w[i].raw[f]);
        em__free(l->w[i].scratch);
        em__free(l->w[i].item);
    }
    em__free(l->w);
    for (int k = 0; l->slots && k < l->K; k++) {
        slot *s = &l->slots[k];
        for (int f = 0; f < EM_MAX_FIELDS; f++) {
            if (!l->on_device) {
                em_tensor_release(s->t[f]);
                em_tensor_release(s->tlen[f]);
                em_tensor_release(s->tmask[f]);
            } else {
                host_buffer_free(l, s->buf[f]);
                host_buffer_free(l, s->len[f]);
                host_buffer_free(l, s->mask[f]);
            }
        }
    }
    em__free(l->slots);
    for (int f = 0; f < EM_MAX_FIELDS; f++) {
        em_tensor_release(l->dt[f]);
        em_tensor_release(l->dlen[f]);
        em_tensor_release(l->dmask[f]);
    }
    if (l->ev_copy) em_event_free(l->dev, l->ev_copy);
    if (l->ev_consumer) em_event_free(l->dev, l->ev_consumer);
    if (l->stream) em_stream_free(l->dev, l->stream);
    for (int f = 0; f < EM_MAX_FIELDS; f++) em__transform_pipeline_free(l->f[f].pipe);
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
