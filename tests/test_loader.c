/*
 * test_loader.c — the DataLoader: batching, drop_last, shuffling (against the documented
 * Philox permutation, reimplemented here), samplers, transforms, independence from the
 * worker count, saving and restoring the position, worker errors at their batch, stopping
 * mid-epoch, the per-batch wait record, no allocation in steady state, an epoch without a
 * batch refused, buffers no larger than the epoch, pinned buffers and copies to the test
 * device.
 */
#define _GNU_SOURCE /* setenv */
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "common.h"
#include "data_ref.h"

TestSuite(loader, .init = em_test_setup, .fini = em_test_teardown);

/* A tensor dataset of n items: inputs (n, 2) float32 = {i, -i}, labels i % classes. */
static em_dataset *counting(int64_t n, int64_t classes) {
    em_tensor *x = em_empty(2, (int64_t[]){n, 2}, EM_F32, em_cpu());
    em_tensor *y = em_empty(1, (int64_t[]){n}, EM_I64, em_cpu());
    cr_assert(x && y, "%s", em_last_error());
    float *px = em_tensor_data(x);
    int64_t *py = em_tensor_data(y);
    for (int64_t i = 0; i < n; i++) {
        px[2 * i] = (float)i;
        px[2 * i + 1] = (float)-i;
        py[i] = i % classes;
    }
    em_dataset *ds = em_dataset_from_tensors(x, y, classes);
    cr_assert(ds, "from_tensors: %s", em_last_error());
    em_tensor_release(x);
    em_tensor_release(y);
    return ds;
}

/* The item indices of one batch of a counting dataset (read back from inputs). */
static int64_t batch_items(const em_tensor *x, const em_tensor *y, int64_t *out, int64_t classes) {
    cr_assert_eq(em_tensor_dtype(x), EM_F32);
    cr_assert_eq(em_tensor_dtype(y), EM_I64);
    int64_t b = em_tensor_size(x, 0);
    cr_assert_eq(em_tensor_size(y, 0), b);
    const float *px = em_tensor_data(x);
    const int64_t *py = em_tensor_data(y);
    for (int64_t j = 0; j < b; j++) {
        out[j] = (int64_t)px[2 * j];
        cr_assert_eq(px[2 * j + 1], -px[2 * j]);
        cr_assert_eq(py[j], out[j] % classes, "label of item %lld", (long long)out[j]);
    }
    return b;
}

/* All items of one epoch, in order; returns how many; checks batch sizes. */
static int64_t epoch_items(em_loader *l, int64_t *out, int64_t bs, int64_t classes) {
    int64_t n = 0, nb = 0;
    em_tensor *x, *y;
    while (true) {
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
        if (!x) break;
        int64_t b = batch_items(x, y, out + n, classes);
        cr_assert(b == bs || b < bs);
        n += b;
        nb++;
    }
    cr_assert_eq(nb, em_loader_num_batches(l));
    return n;
}

Test(loader, sequential_batches_and_short_last) {
    em_dataset *ds = counting(10, 3);
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 4};
    em_loader *l = em_loader_new(ds, &o);
    cr_assert(l, "%s", em_last_error());
    cr_assert_eq(em_loader_num_batches(l), 3);
    em_tensor *x, *y;
    int64_t items[4];
    for (int b = 0; b < 3; b++) {
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
        cr_assert(x && y);
        int64_t n = batch_items(x, y, items, 3);
        cr_assert_eq(n, b < 2 ? 4 : 2);
        cr_assert_eq(em_tensor_ndim(x), 2);
        cr_assert_eq(em_tensor_size(x, 1), 2);
        cr_assert_eq(em_tensor_category(x), EM_MEM_DATA);
        cr_assert_eq(em_tensor_category(y), EM_MEM_DATA);
        for (int j = 0; j < n; j++) cr_assert_eq(items[j], b * 4 + j);
    }
    cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
    cr_assert_null(x, "the end of the epoch is a NULL batch");
    em_loader_state s = em_loader_get_state(l);
    cr_assert_eq(s.epoch, 1);
    cr_assert_eq(s.batch, 0);
    cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
    cr_assert(x);
    cr_assert_eq(batch_items(x, y, items, 3), 4);
    cr_assert_eq(items[0], 0);
    em_loader_free(l);
    /* drop_last: 10 items in batches of 4 are 2 batches */
    o.drop_last = true;
    l = em_loader_new(ds, &o);
    cr_assert_eq(em_loader_num_batches(l), 2);
    int64_t all[10];
    cr_assert_eq(epoch_items(l, all, 4, 3), 8);
    em_loader_free(l);
    em_dataset_free(ds);
}

Test(loader, shuffle_matches_the_documented_permutation) {
    const int64_t N = 1000;
    em_dataset *ds = counting(N, 7);
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 64, .shuffle = true,
                           .seed = 1234, .num_workers = 2};
    em_loader *l = em_loader_new(ds, &o);
    cr_assert(l, "%s", em_last_error());
    int64_t got[1000], ref[1000], prev[1000];
    for (int e = 0; e < 3; e++) {
        cr_assert_eq(epoch_items(l, got, 64, 7), N);
        for (int64_t i = 0; i < N; i++) ref[i] = i;
        ref_permute(ref, N, 1234, (uint64_t)e, 0x53485546u);
        for (int64_t i = 0; i < N; i++)
            cr_assert_eq(got[i], ref[i], "epoch %d position %lld", e, (long long)i);
        if (e > 0) cr_assert(memcmp(got, prev, sizeof got) != 0, "a new order each epoch");
        memcpy(prev, got, sizeof got);
    }
    em_loader_free(l);
    em_dataset_free(ds);
}

/* Batches of a loader over a u8 image dataset with every transform, as one flat float array. */
static void transformed_epoch(em_dataset *ds, int workers, float *out, int64_t *order) {
    static const float mean[3] = {0.5f, 0.25f, 0.1f}, std[3] = {0.5f, 2.0f, 1.0f};
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 7, .shuffle = true, .seed = 99,
                           .num_workers = workers,
                           .transforms = {.mean = mean, .std = std, .n_channels = 3,
                                          .crop_padding = 2, .hflip = true}};
    em_loader *l = em_loader_new(ds, &o);
    cr_assert(l, "%s", em_last_error());
    em_tensor *x, *y;
    int64_t at = 0;
    while (em_loader_next(l, &x, &y) == EM_OK && x) {
        int64_t b = em_tensor_size(x, 0);
        cr_assert_eq(em_tensor_dtype(x), EM_F32);
        memcpy(out + at * 48, em_tensor_data(x), sizeof(float) * (size_t)(b * 48));
        memcpy(order + at, em_tensor_data(y), sizeof(int64_t) * (size_t)b);
        at += b;
    }
    cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
    cr_assert_eq(at, 40);
    em_loader_free(l);
}

/* 40 images (3, 4, 4) u8 with distinct pixels; the label is the item index. */
static em_status image_item(void *user, int64_t i, void *input, void *target) {
    (void)user;
    uint8_t *p = input;
    for (int k = 0; k < 48; k++) p[k] = (uint8_t)(1 + (i * 5 + k) % 250);
    *(int64_t *)target = i;
    return EM_OK;
}

static em_dataset *images(void) {
    em_dataset_info info = {.struct_size = sizeof info, .length = 40, .input_ndim = 3,
                            .input_shape = {3, 4, 4}, .input_dtype = EM_U8,
                            .target_dtype = EM_I64, .num_classes = 40};
    em_dataset *ds = em_dataset_from_callback(&info, image_item, NULL);
    cr_assert(ds, "%s", em_last_error());
    return ds;
}

/* The prefix rule: an info record that ends before the reserved ext (a caller built against
 * older headers) is read only as far as its struct_size goes — here it is allocated that small,
 * so a read past it is a heap overflow under ASan — and a record smaller than the oldest
 * layout is refused. */
Test(loader, a_smaller_info_record_is_read_within_its_size) {
    const size_t n = offsetof(em_dataset_info, ext);
    em_dataset_info full = {.struct_size = n, .length = 40, .input_ndim = 3,
                            .input_shape = {3, 4, 4}, .input_dtype = EM_U8,
                            .target_dtype = EM_I64, .num_classes = 40};
    void *info = malloc(n);
    cr_assert_not_null(info);
    memcpy(info, &full, n);
    em_dataset *ds = em_dataset_from_callback(info, image_item, NULL);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(ds), 40);
    em_dataset_free(ds);
    size_t too_small = offsetof(em_dataset_info, length);
    memcpy(info, &too_small, sizeof too_small);
    cr_assert_null(em_dataset_from_callback(info, image_item, NULL));
    em_assert_error(EM_ERR_INVALID, "dataset_from_callback: em_dataset_info struct_size");
    free(info);
}

Test(loader, transforms_are_correct_and_independent_of_workers) {
    em_dataset *ds = images();
    static float a[40 * 48], b[40 * 48];
    int64_t oa[40], ob[40];
    transformed_epoch(ds, 0, a, oa);
    for (int w = 1; w <= 3; w++) {
        transformed_epoch(ds, w, b, ob);
        cr_assert(memcmp(oa, ob, sizeof oa) == 0, "order with %d workers", w);
        cr_assert(memcmp(a, b, sizeof a) == 0, "pixels with %d workers", w);
    }
    /* Each output is the item, normalised, cropped by some shift in [-2, 2]^2 with zero
     * padding, and maybe mirrored: find the one that matches. */
    static const float mean[3] = {0.5f, 0.25f, 0.1f}, std[3] = {0.5f, 2.0f, 1.0f};
    int flips = 0, shifts = 0;
    for (int j = 0; j < 40; j++) {
        uint8_t raw[48];
        int64_t lab;
        image_item(NULL, oa[j], raw, &lab);
        bool found = false;
        for (int f = 0; f < 2 && !found; f++)
            for (int dy = -2; dy <= 2 && !found; dy++)
                for (int dx = -2; dx <= 2 && !found; dx++) {
                    bool ok = true;
                    for (int c = 0; c < 3 && ok; c++)
                        for (int yy = 0; yy < 4 && ok; yy++)
                            for (int xx = 0; xx < 4 && ok; xx++) {
                                int sy = yy + dy, sx = (f ? 3 - xx : xx) + dx;
                                double v = sy >= 0 && sy < 4 && sx >= 0 && sx < 4
                                               ? raw[c * 16 + sy * 4 + sx] / 255.0 : 0.0;
                                double want = (v - mean[c]) / std[c];
                                ok = fabs(a[j * 48 + c * 16 + yy * 4 + xx] - want) < 1e-5;
                            }
                    if (ok) {
                        found = true;
                        flips += f;
                        shifts += dy != 0 || dx != 0;
                    }
                }
        cr_assert(found, "item %lld is no crop/flip of its source", (long long)oa[j]);
    }
    cr_assert(flips > 5 && flips < 35, "flips: %d of 40", flips);
    cr_assert(shifts > 20, "shifts: %d of 40", shifts);
    em_dataset_free(ds);
}

/* Crop and flip on the raw bytes (no to-float): the generic path. Float inputs take it too. */
Test(loader, crop_and_flip_without_float) {
    em_dataset *ds = images();
    for (int asfloat = 0; asfloat <= 1; asfloat++) {
        em_dataset *src = ds;
        em_tensor *fx = NULL, *fy = NULL;
        if (asfloat) { /* the same images as float32 tensors */
            fx = em_empty(4, (int64_t[]){40, 3, 4, 4}, EM_F32, em_cpu());
            fy = em_empty(1, (int64_t[]){40}, EM_I64, em_cpu());
            for (int64_t i = 0; i < 40; i++) {
                uint8_t raw[48];
                image_item(NULL, i, raw, (int64_t *)em_tensor_data(fy) + i);
                for (int k = 0; k < 48; k++) ((float *)em_tensor_data(fx))[i * 48 + k] = raw[k];
            }
            src = em_dataset_from_tensors(fx, fy, 40);
            cr_assert(src, "%s", em_last_error());
        }
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 40, .seed = 4,
                               .transforms = {.crop_padding = 1, .hflip = true}};
        em_loader *l = em_loader_new(src, &o);
        cr_assert(l, "%s", em_last_error());
        em_tensor *x, *y;
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_tensor_dtype(x), asfloat ? EM_F32 : EM_U8);
        int flips = 0;
        for (int64_t j = 0; j < 40; j++) {
            uint8_t raw[48];
            int64_t lab;
            image_item(NULL, j, raw, &lab);
            bool found = false;
            for (int f = 0; f < 2 && !found; f++)
                for (int dy = -1; dy <= 1 && !found; dy++)
                    for (int dx = -1; dx <= 1 && !found; dx++) {
                        bool ok = true;
                        for (int k = 0; k < 48 && ok; k++) {
                            int c = k / 16, yy = (k / 4) % 4, xx = k % 4;
                            int sy = yy + dy, sx = (f ? 3 - xx : xx) + dx;
                            int want = sy >= 0 && sy < 4 && sx >= 0 && sx < 4 ? raw[c * 16 + sy * 4 + sx] : 0;
                            double got = asfloat ? ((float *)em_tensor_data(x))[j * 48 + k]
                                                 : ((uint8_t *)em_tensor_data(x))[j * 48 + k];
                            ok = got == want;
                        }
                        if (ok) found = true, flips += f;
                    }
            cr_assert(found, "item %lld (float %d)", (long long)j, asfloat);
        }
        cr_assert(flips > 5 && flips < 35, "flips %d", flips);
        em_loader_free(l);
        if (asfloat) {
            em_dataset_free(src);
            em_tensor_release(fx);
            em_tensor_release(fy);
        }
    }
    em_dataset_free(ds);
}

Test(loader, to_float_scaling) {
    em_dataset *ds = images();
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 40,
                           .transforms = {.to_float = true}};
    em_loader *l = em_loader_new(ds, &o);
    em_tensor *x, *y;
    cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_dtype(x), EM_F32);
    const float *p = em_tensor_data(x);
    for (int64_t i = 0; i < 40; i++) {
        uint8_t raw[48];
        int64_t lab;
        image_item(NULL, i, raw, &lab);
        for (int k = 0; k < 48; k++) cr_assert_float_eq(p[i * 48 + k], raw[k] / 255.0f, 1e-7);
    }
    em_loader_free(l);
    o.transforms.scale = 2.0;
    l = em_loader_new(ds, &o);
    cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
    p = em_tensor_data(x);
    cr_assert_float_eq(p[0], 2.0f * 1, 1e-6); /* item 0 pixel 0 is 1 */
    em_loader_free(l);
    em_dataset_free(ds);
}

Test(loader, same_batches_for_any_worker_count_and_prefetch) {
    em_dataset *ds = counting(999, 5);
    static int64_t ref[999], got[999];
    for (int w = 0; w <= 4; w++)
        for (int pf = 0; pf <= 3; pf += 3) {
            em_loader_options o = {.struct_size = sizeof o, .batch_size = 10, .shuffle = true,
                                   .seed = 7, .num_workers = w, .prefetch = pf};
            em_loader *l = em_loader_new(ds, &o);
            cr_assert(l, "%s", em_last_error());
            for (int e = 0; e < 2; e++) {
                cr_assert_eq(epoch_items(l, got, 10, 5), 999);
                if (w == 0 && pf == 0 && e == 0) memcpy(ref, got, sizeof ref);
                if (e == 0) cr_assert(memcmp(ref, got, sizeof ref) == 0, "workers %d", w);
            }
            em_loader_free(l);
        }
    em_dataset_free(ds);
}

Test(loader, position_save_and_restore) {
    em_dataset *ds = counting(100, 4);
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 8, .shuffle = true,
                           .seed = 5, .num_workers = 2};
    em_loader *a = em_loader_new(ds, &o);
    int64_t tmp[100];
    epoch_items(a, tmp, 8, 4); /* epoch 0 */
    em_tensor *x, *y;
    for (int b = 0; b < 5; b++) cr_assert_eq(em_loader_next(a, &x, &y), EM_OK);
    em_loader_state s = em_loader_get_state(a);
    cr_assert_eq(s.epoch, 1);
    cr_assert_eq(s.batch, 5);
    /* the rest of epoch 1 and epoch 2 from the original */
    int64_t want[300], n = 0;
    while (em_loader_next(a, &x, &y) == EM_OK && x) n += batch_items(x, y, want + n, 4);
    n += epoch_items(a, want + n, 8, 4);
    em_loader_free(a);
    /* a fresh loader (other worker count) restored to s gives the same */
    o.num_workers = 0;
    o.seed = 0; /* the state carries the seed */
    em_loader *b = em_loader_new(ds, &o);
    cr_assert_eq(em_loader_set_state(b, s), EM_OK, "%s", em_last_error());
    int64_t got[300], m = 0;
    while (em_loader_next(b, &x, &y) == EM_OK && x) m += batch_items(x, y, got + m, 4);
    m += epoch_items(b, got + m, 8, 4);
    cr_assert_eq(m, n);
    cr_assert(memcmp(got, want, sizeof(int64_t) * (size_t)n) == 0);
    cr_assert_eq(em_loader_set_state(b, (em_loader_state){5, 0, 99}), EM_ERR_RANGE);
    em_assert_error(EM_ERR_RANGE, "13 batches per epoch");
    em_loader_free(b);
    em_dataset_free(ds);
}

Test(loader, subset_sampler) {
    em_dataset *ds = counting(50, 50);
    int64_t sub[6] = {3, 9, 27, 1, 48, 0}, got[6];
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 4,
                           .sampler = EM_SAMPLER_SUBSET, .subset = sub, .subset_len = 6};
    em_loader *l = em_loader_new(ds, &o);
    cr_assert(l, "%s", em_last_error());
    cr_assert_eq(epoch_items(l, got, 4, 50), 6);
    cr_assert(memcmp(got, sub, sizeof sub) == 0);
    em_loader_free(l);
    o.shuffle = true;
    l = em_loader_new(ds, &o);
    cr_assert_eq(epoch_items(l, got, 4, 50), 6);
    int64_t ref[6];
    memcpy(ref, sub, sizeof sub);
    ref_permute(ref, 6, 0, 0, 0x53485546u);
    cr_assert(memcmp(got, ref, sizeof ref) == 0);
    em_loader_free(l);
    sub[2] = 50;
    cr_assert_null(em_loader_new(ds, &o));
    em_assert_error(EM_ERR_RANGE, "subset[2] = 50 is out of range");
    em_dataset_free(ds);
}

Test(loader, weighted_sampler) {
    em_dataset *ds = counting(4, 4);
    double w[4] = {1.0, 0.0, 3.0, 6.0};
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 1000, .seed = 3,
                           .sampler = EM_SAMPLER_WEIGHTED, .weights = w, .num_samples = 20000,
                           .num_workers = 1};
    em_loader *l = em_loader_new(ds, &o);
    cr_assert(l, "%s", em_last_error());
    static int64_t got[20000];
    cr_assert_eq(epoch_items(l, got, 1000, 4), 20000);
    int64_t count[4] = {0};
    for (int i = 0; i < 20000; i++) count[got[i]]++;
    cr_assert_eq(count[1], 0, "a zero weight is never drawn");
    /* expected 2000, 6000, 12000; 5 standard deviations */
    cr_assert(llabs(count[0] - 2000) < 5 * 43, "%lld", (long long)count[0]);
    cr_assert(llabs(count[2] - 6000) < 5 * 65, "%lld", (long long)count[2]);
    cr_assert(llabs(count[3] - 12000) < 5 * 70, "%lld", (long long)count[3]);
    em_loader_free(l);
    w[1] = -1;
    cr_assert_null(em_loader_new(ds, &o));
    em_assert_error(EM_ERR_INVALID, "weights[1] = -1");
    em_dataset_free(ds);
}

Test(loader, sharded_sampler_pads_like_distributed_sampler) {
    em_dataset *ds = counting(10, 10);
    int64_t seen[10] = {0};
    for (int r = 0; r < 3; r++) {
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 3,
                               .sampler = EM_SAMPLER_SHARDED, .rank = r, .world_size = 3};
        em_loader *l = em_loader_new(ds, &o);
        cr_assert(l, "%s", em_last_error());
        int64_t got[4];
        cr_assert_eq(epoch_items(l, got, 3, 10), 4, "ceil(10 / 3) items per rank");
        /* sequential: padded list 0..9, 0, 1; rank r takes r, r+3, r+6, r+9 */
        for (int j = 0; j < 4; j++) {
            cr_assert_eq(got[j], (r + 3 * j) % 10, "rank %d item %d", r, j);
            seen[got[j]]++;
        }
        em_loader_free(l);
    }
    for (int i = 0; i < 10; i++) cr_assert_eq(seen[i], i < 2 ? 2 : 1);
    /* shuffled: the ranks still cover every item, all from the same permutation */
    int64_t cover[10] = {0};
    for (int r = 0; r < 3; r++) {
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 2, .shuffle = true,
                               .seed = 11, .sampler = EM_SAMPLER_SHARDED, .rank = r,
                               .world_size = 3};
        em_loader *l = em_loader_new(ds, &o);
        int64_t got[4];
        epoch_items(l, got, 2, 10);
        for (int j = 0; j < 4; j++) cover[got[j]]++;
        em_loader_free(l);
    }
    for (int i = 0; i < 10; i++) cr_assert(cover[i] >= 1, "item %d not on any rank", i);
    em_loader_options bad = {.struct_size = sizeof bad, .sampler = EM_SAMPLER_SHARDED,
                             .rank = 3, .world_size = 3};
    cr_assert_null(em_loader_new(ds, &bad));
    em_assert_error(EM_ERR_INVALID, "rank 3, world_size 3");
    em_dataset_free(ds);
}

Test(loader, sharded_sampler_drops_the_tail_like_distributed_sampler_drop_last) {
    em_dataset *ds = counting(10, 10);
    int64_t seen[10] = {0};
    for (int r = 0; r < 3; r++) {
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 2,
                               .sampler = EM_SAMPLER_SHARDED, .rank = r, .world_size = 3,
                               .shard_drop_last = true};
        em_loader *l = em_loader_new(ds, &o);
        cr_assert(l, "%s", em_last_error());
        int64_t got[4];
        cr_assert_eq(epoch_items(l, got, 2, 10), 3, "floor(10 / 3) items per rank");
        /* sequential: the list cut to 0..8; rank r takes r, r+3, r+6 */
        for (int j = 0; j < 3; j++) {
            cr_assert_eq(got[j], r + 3 * j, "rank %d item %d", r, j);
            seen[got[j]]++;
        }
        em_loader_free(l);
    }
    for (int i = 0; i < 10; i++) cr_assert_eq(seen[i], i < 9 ? 1 : 0, "item %d", i);
    /* shuffled: the same permutation as padding uses, cut instead of extended: each rank's
     * items are the first floor(N / W) of its padded share, and no item is on two ranks */
    int64_t cover[10] = {0};
    for (int r = 0; r < 3; r++) {
        int64_t pad[4], cut[4];
        for (int drop = 0; drop < 2; drop++) {
            em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = 4, .shuffle = true,
                                      .seed = 5, .sampler = EM_SAMPLER_SHARDED, .rank = r,
                                      .world_size = 3, .shard_drop_last = drop};
            em_loader *l = em_loader_new_v2(ds, &o);
            cr_assert(l, "%s", em_last_error());
            cr_assert_eq(epoch_items(l, drop ? cut : pad, 4, 10), drop ? 3 : 4);
            em_loader_free(l);
        }
        for (int j = 0; j < 3; j++) {
            cr_assert_eq(cut[j], pad[j], "rank %d item %d", r, j);
            cover[cut[j]]++;
        }
    }
    for (int i = 0; i < 10; i++) cr_assert(cover[i] <= 1, "item %d on two ranks", i);
    em_dataset_free(ds);
    em_dataset *two = counting(2, 2);
    em_loader_options o = {.struct_size = sizeof o, .sampler = EM_SAMPLER_SHARDED, .rank = 0,
                           .world_size = 3, .shard_drop_last = true};
    cr_assert_null(em_loader_new(two, &o));
    em_assert_error(EM_ERR_INVALID, "has 2 items, fewer than world_size 3");
    em_dataset_free(two);
}

/* Fails at item 37; counts calls. */
static atomic_int calls;
static em_status failing_item(void *user, int64_t i, void *input, void *target) {
    (void)user;
    atomic_fetch_add(&calls, 1);
    if (i == 37) return em_set_error(EM_ERR_FORMAT, "record.bin: bad checksum");
    *(float *)input = (float)i;
    *(int64_t *)target = 0;
    return EM_OK;
}

Test(loader, worker_error_surfaces_at_its_batch) {
    em_dataset_info info = {.struct_size = sizeof info, .length = 100, .input_ndim = 1,
                            .input_shape = {1}, .input_dtype = EM_F32, .target_dtype = EM_I64,
                            .num_classes = 1};
    em_dataset *ds = em_dataset_from_callback(&info, failing_item, NULL);
    cr_assert(ds, "%s", em_last_error());
    for (int w = 0; w <= 2; w += 2) {
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 8, .num_workers = w};
        em_loader *l = em_loader_new(ds, &o);
        em_tensor *x, *y;
        for (int b = 0; b < 4; b++) {
            cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "batch %d: %s", b, em_last_error());
            cr_assert_eq(((float *)em_tensor_data(x))[0], (float)(b * 8));
        }
        cr_assert_eq(em_loader_next(l, &x, &y), EM_ERR_FORMAT);
        cr_assert_null(x);
        em_assert_error(EM_ERR_FORMAT, "batch 4 of epoch 0");
        em_assert_error(EM_ERR_FORMAT, "item 37");
        em_assert_error(EM_ERR_FORMAT, "record.bin: bad checksum");
        cr_assert_eq(em_loader_next(l, &x, &y), EM_ERR_STATE, "stays stopped");
        em_assert_error(EM_ERR_STATE, "item 37");
        /* restart after the bad batch */
        cr_assert_eq(em_loader_set_state(l, (em_loader_state){0, 0, 5}), EM_OK);
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
        cr_assert_eq(((float *)em_tensor_data(x))[0], 40.0f);
        em_loader_free(l);
    }
    em_dataset_free(ds);
}

Test(loader, stop_mid_epoch_joins_workers) {
    em_dataset *ds = counting(10000, 10);
    for (int w = 1; w <= 4; w++) {
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 16, .shuffle = true,
                               .num_workers = w, .prefetch = 3};
        em_loader *l = em_loader_new(ds, &o);
        em_tensor *x, *y;
        for (int b = 0; b < w; b++) cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
        em_loader_free(l); /* workers may be blocked on a full ring, or filling */
    }
    /* freeing right after creation, before any batch */
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 16, .num_workers = 3};
    em_loader_free(em_loader_new(ds, &o));
    em_loader_free(NULL);
    em_dataset_free(ds);
}

Test(loader, wait_time_is_reported) {
    em_dataset *ds = counting(64, 2);
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 8, .num_workers = 1};
    em_loader *l = em_loader_new(ds, &o);
    int64_t tmp[64];
    epoch_items(l, tmp, 8, 2);
    em_loader_stats s = em_loader_get_stats(l);
    cr_assert_eq(s.batches, 8);
    cr_assert(s.wait_ns > 0 && s.max_wait_ns <= s.wait_ns && s.last_wait_ns <= s.max_wait_ns);
    em_loader_reset_stats(l);
    cr_assert_eq(em_loader_get_stats(l).batches, 0);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* The wait record. Timing bounds are one-sided and generous: a sleep lasts at least as long
 * as asked (the only exact fact about time here), and a worker given 10x the time it needs
 * is ahead of the consumer. */
#define ITEM_SLEEP_NS 1000000L /* 1 ms per item */
static void sleep_ns(long ns) {
    struct timespec t = {ns / 1000000000L, ns % 1000000000L};
    while (nanosleep(&t, &t) != 0) {}
}
static em_status slow_item(void *user, int64_t i, void *input, void *target) {
    (void)user;
    sleep_ns(ITEM_SLEEP_NS);
    *(float *)input = (float)i;
    *(int64_t *)target = 0;
    return EM_OK;
}
static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

Test(loader, wait_record_gives_the_median_wait) {
    em_dataset_info info = {.struct_size = sizeof info, .length = 12, .input_ndim = 1,
                            .input_shape = {1}, .input_dtype = EM_F32, .target_dtype = EM_I64,
                            .num_classes = 1};
    em_dataset *ds = em_dataset_from_callback(&info, slow_item, NULL);
    cr_assert(ds, "%s", em_last_error());
    for (int w = 0; w <= 1; w++) {
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 1, .num_workers = w};
        em_loader *l = em_loader_new(ds, &o);
        cr_assert(l, "%s", em_last_error());
        cr_assert_eq(em_loader_wait_quantile(l, 0.5), 0, "no batch yet");
        uint64_t waits[12];
        em_tensor *x, *y;
        for (int b = 0; b < 12; b++) {
            cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
            cr_assert_not_null(x);
            waits[b] = em_loader_get_stats(l).last_wait_ns;
            if (w == 1) sleep_ns(10 * ITEM_SLEEP_NS); /* a slow training step */
        }
        /* every wait is recorded: the quantiles match the exact ones from the per-batch
         * waits to within the histogram's 1/128 (this part does not depend on timing) */
        qsort(waits, 12, sizeof *waits, cmp_u64);
        uint64_t med = em_loader_wait_quantile(l, 0.5);
        cr_assert(fabs((double)med - (double)waits[5]) <= (double)waits[5] / 128 + 1,
                  "median %llu, exact (lower) median %llu", (unsigned long long)med,
                  (unsigned long long)waits[5]);
        cr_assert(fabs((double)em_loader_wait_quantile(l, 1.0) - (double)waits[11]) <=
                  (double)waits[11] / 128 + 1);
        cr_assert(fabs((double)em_loader_wait_quantile(l, 0.0) - (double)waits[0]) <=
                  (double)waits[0] / 128 + 1);
        cr_assert_eq(em_loader_wait_quantile(l, 1.5), 0);
        cr_assert_eq(em_loader_wait_quantile(l, NAN), 0);
        if (w == 0) {
            /* the caller makes each batch: every wait includes the item's sleep */
            cr_assert_geq(waits[0], (uint64_t)ITEM_SLEEP_NS);
            cr_assert_geq(med, (uint64_t)(0.99 * ITEM_SLEEP_NS));
        } else {
            /* the worker had the next batch ready while the consumer slept */
            cr_assert_lt(med, (uint64_t)(ITEM_SLEEP_NS / 2), "median wait %llu ns with a worker",
                         (unsigned long long)med);
        }
        /* a reset starts a new interval */
        em_loader_reset_stats(l);
        cr_assert_eq(em_loader_wait_quantile(l, 0.5), 0);
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK); /* the end-of-epoch mark: no wait */
        cr_assert_null(x);
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
        cr_assert_not_null(x);
        cr_assert_eq(em_loader_get_stats(l).batches, 1);
        uint64_t one = em_loader_get_stats(l).last_wait_ns;
        cr_assert(fabs((double)em_loader_wait_quantile(l, 0.5) - (double)one) <= one / 128.0 + 1);
        em_loader_free(l);
    }
    cr_assert_eq(em_loader_wait_quantile(NULL, 0.5), 0);
    em_dataset_free(ds);
}

Test(loader, bad_options) {
    em_dataset *ds = counting(10, 2);
    em_loader_options o = {.struct_size = sizeof o, .transforms = {.hflip = true}};
    cr_assert_null(em_loader_new(ds, &o));
    em_assert_error(EM_ERR_SHAPE, "need items of shape (C, H, W)");
    o = (em_loader_options){.struct_size = sizeof o,
                            .transforms = {.mean = (float[]){0}, .std = (float[]){1},
                                           .n_channels = 1}};
    cr_assert_null(em_loader_new(ds, &o));
    em_assert_error(EM_ERR_SHAPE, "n_channels is 1");
    o = (em_loader_options){.struct_size = sizeof o, .sampler = EM_SAMPLER_SEQUENTIAL,
                            .shuffle = true};
    cr_assert_null(em_loader_new(ds, &o));
    em_assert_error(EM_ERR_INVALID, "sequential sampler cannot shuffle");
    o = (em_loader_options){.struct_size = sizeof o, .batch_size = -1};
    cr_assert_null(em_loader_new(ds, &o));
    em_assert_error(EM_ERR_INVALID, "batch_size -1");
    o = (em_loader_options){.struct_size = 0};
    cr_assert_null(em_loader_new(ds, &o));
    em_assert_error(EM_ERR_INVALID, "struct_size");
    cr_assert_null(em_loader_new(NULL, NULL));
    /* NULL options: batches of 1 */
    em_loader *l = em_loader_new(ds, NULL);
    cr_assert(l, "%s", em_last_error());
    cr_assert_eq(em_loader_num_batches(l), 10);
    em_loader_free(l);
    em_dataset_free(ds);
}

Test(loader, a_saved_batch_notices_the_refill) {
    em_dataset *ds = counting(8, 2);
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 4};
    em_loader *l = em_loader_new(ds, &o);
    em_tensor *x, *y;
    cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
    uint64_t v = em_tensor_version(x);
    em_tensor *keep = em_tensor_retain(x);
    cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
    cr_assert_gt(em_tensor_version(keep), v, "the refilled buffer's version moved on");
    em_tensor_release(keep);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* ---- no allocation in steady state: a counting host allocator -------------------------- */

static atomic_long n_allocs;
static void *count_alloc(size_t n, size_t align, void *user) {
    (void)user;
    atomic_fetch_add(&n_allocs, 1);
    void *p = NULL;
    return posix_memalign(&p, align, n) == 0 ? p : NULL;
}
static void count_free(void *p, void *user) {
    (void)user;
    free(p);
}
static void counting_setup(void) {
    em_host_allocator a = {count_alloc, count_free, NULL};
    em_host_allocator_set(&a);
    em_test_setup();
}
static void counting_teardown(void) {
    em_test_teardown();
    em_host_allocator_set(NULL);
}

Test(loader_alloc, no_allocation_per_batch, .init = counting_setup, .fini = counting_teardown) {
    em_dataset *ds = images();
    for (int w = 0; w <= 2; w++) {
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 4, .shuffle = true,
                               .num_workers = w, .transforms = {.to_float = true, .hflip = true}};
        em_loader *l = em_loader_new(ds, &o);
        cr_assert(l, "%s", em_last_error());
        em_tensor *x, *y;
        for (int e = 0; e < 3; e++) {
            cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
            long before = atomic_load(&n_allocs);
            int n = 1;
            while (em_loader_next(l, &x, &y) == EM_OK && x) n++;
            cr_assert_eq(n, 10);
            cr_assert_eq(atomic_load(&n_allocs), before, "%ld allocations in epoch %d with %d "
                         "workers", atomic_load(&n_allocs) - before, e, w);
        }
        em_loader_free(l);
    }
    em_dataset_free(ds);
}

/* ---- an epoch with no batch is an error; buffers are sized by the epoch ---------------- */

/* Before, a loader over an empty dataset (or with drop_last over fewer items than a batch)
 * had 0 batches: a training run did nothing and exited 0. */
Test(loader, an_epoch_without_a_batch_is_an_error) {
    em_dataset *empty = counting(0, 2);
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 4, .shuffle = true};
    cr_assert_null(em_loader_new(empty, &o));
    em_assert_error(EM_ERR_INVALID, "loader: dataset 'tensors' has no items");
    cr_assert_null(em_loader_new(empty, NULL));
    em_assert_error(EM_ERR_INVALID, "an epoch would have no batch");
    em_dataset *sub = em_dataset_subset(empty, NULL, 0);
    cr_assert(sub, "%s", em_last_error());
    cr_assert_null(em_loader_new(sub, NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'subset' has no items");
    em_dataset_free(sub);
    em_dataset_free(empty);
    em_dataset *three = counting(3, 2);
    o = (em_loader_options){.struct_size = sizeof o, .batch_size = 4, .drop_last = true};
    cr_assert_null(em_loader_new(three, &o));
    em_assert_error(EM_ERR_INVALID, "dataset 'tensors' gives 3 items per epoch, fewer than "
                    "batch_size 4, and drop_last drops them");
    /* sharded: 3 items over 4 ranks with drop_last is 1 item per rank, no batch of 2 */
    o = (em_loader_options){.struct_size = sizeof o, .batch_size = 2, .drop_last = true,
                            .sampler = EM_SAMPLER_SHARDED, .world_size = 4, .rank = 1};
    cr_assert_null(em_loader_new(three, &o));
    em_assert_error(EM_ERR_INVALID, "gives 1 items per epoch");
    o.drop_last = false;
    em_loader *l = em_loader_new(three, &o);
    cr_assert(l, "%s", em_last_error());
    cr_assert_eq(em_loader_num_batches(l), 1);
    em_loader_free(l);
    em_dataset_free(three);
}

/* The largest host block asked for. */
static atomic_size_t biggest;
static void *biggest_alloc(size_t n, size_t align, void *user) {
    (void)user;
    size_t b = atomic_load(&biggest);
    while (n > b && !atomic_compare_exchange_weak(&biggest, &b, n)) {
    }
    void *p = NULL;
    return posix_memalign(&p, align, n) == 0 ? p : NULL;
}
static void biggest_setup(void) {
    em_host_allocator a = {biggest_alloc, count_free, NULL};
    em_host_allocator_set(&a);
    em_test_setup();
}

/* Before, every buffer held batch_size items whatever the dataset's size: batch_size 2^24
 * over 10 items of 8 bytes asked for 128 MiB per slot (and 4 slots). */
Test(loader_alloc, buffers_hold_at_most_the_epoch, .init = biggest_setup,
     .fini = counting_teardown) {
    em_dataset *ds = counting(10, 3);
    em_loader_options o = {.struct_size = sizeof o, .batch_size = (int64_t)1 << 24,
                           .num_workers = 2, .transforms = {.to_float = true, .scale = 2}};
    atomic_store(&biggest, 0);
    em_loader *l = em_loader_new(ds, &o);
    cr_assert(l, "%s", em_last_error());
    cr_assert_lt(atomic_load(&biggest), (size_t)1 << 20, "%zu bytes asked for",
                 atomic_load(&biggest));
    cr_assert_eq(em_loader_num_batches(l), 1);
    em_tensor *x, *y;
    int64_t items[10];
    for (int e = 0; e < 2; e++) {
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_tensor_size(x, 0), 10);
        const float *px = em_tensor_data(x);
        const int64_t *py = em_tensor_data(y);
        for (int j = 0; j < 10; j++) {
            items[j] = (int64_t)(px[2 * j] / 2);
            cr_assert_eq(py[j], items[j] % 3);
        }
        for (int j = 0; j < 10; j++) cr_assert_eq(items[j], j);
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK);
        cr_assert_null(x);
    }
    em_loader_free(l);
    em_dataset_free(ds);
}

/* ---- pinned buffers and copies to the test device -------------------------------------- */

static void testdev_setup(void) {
    const char *dir = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(dir, "EMBER_TEST_PLUGIN_DIR is not set (run through make check)");
    char path[4096];
    snprintf(path, sizeof path, "%s/testdev.so", dir);
    setenv("EMBER_PLUGIN_PATH", path, 1);
    em_test_setup();
}
static void testdev_teardown(void) {
    em_test_teardown();
    unsetenv("EMBER_PLUGIN_PATH");
}

Test(loader_device, pinned_batches_on_testdev, .init = testdev_setup, .fini = testdev_teardown) {
    char path[4096];
    snprintf(path, sizeof path, "%s/testdev.so", getenv("EMBER_TEST_PLUGIN_DIR"));
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    cr_assert(h, "testdev is not loaded: %s", dlerror());
    void (*pinned)(size_t *, size_t *) = (void (*)(size_t *, size_t *))dlsym(h, "ember_testdev_pinned");
    cr_assert(pinned);
    em_device dev;
    cr_assert_eq(em_device_parse("testdev:1", &dev), EM_OK, "%s", em_last_error());
    em_dataset *ds = counting(30, 4);
    for (int pin = 0; pin <= 1; pin++) {
        em_loader_options o = {.struct_size = sizeof o, .batch_size = 8, .shuffle = true,
                               .seed = 2, .num_workers = 2, .device = dev, .pin_memory = pin};
        size_t blocks0, bytes0, blocks, bytes;
        pinned(&blocks0, &bytes0);
        em_loader *l = em_loader_new(ds, &o);
        cr_assert(l, "%s", em_last_error());
        pinned(&blocks, &bytes);
        if (pin) {
            /* 4 ring slots (2 per worker) x (inputs + targets) */
            cr_assert_eq(blocks - blocks0, 8);
            cr_assert_eq(bytes - bytes0, 4 * (8 * 2 * sizeof(float) + 8 * sizeof(int64_t)));
        } else {
            cr_assert_eq(blocks, blocks0, "no pinned memory without pin_memory");
        }
        em_memory_stats st;
        cr_assert_eq(em_memory_stats_get(dev, &st), EM_OK);
        cr_assert_gt(st.current[EM_MEM_DATA], 0, "device batch buffers count as data");
        int64_t got[30], n = 0;
        em_tensor *x, *y;
        while (em_loader_next(l, &x, &y) == EM_OK && x) {
            cr_assert(em_device_equal(em_tensor_device(x), dev));
            cr_assert(em_device_equal(em_tensor_device(y), dev));
            em_scope_begin();
            em_tensor *hx = em_to_device(x, em_cpu()), *hy = em_to_device(y, em_cpu());
            cr_assert(hx && hy, "%s", em_last_error());
            n += batch_items(hx, hy, got + n, 4);
            em_scope_end();
        }
        cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
        cr_assert_eq(n, 30);
        int64_t ref[30];
        for (int i = 0; i < 30; i++) ref[i] = i;
        ref_permute(ref, 30, 2, 0, 0x53485546u);
        cr_assert(memcmp(got, ref, sizeof ref) == 0);
        em_loader_free(l);
        pinned(&blocks, &bytes);
        cr_assert_eq(blocks, blocks0, "the pinned buffers are freed");
    }
    em_dataset_free(ds);
}

/* The consumer on its own current stream of the asynchronous testdev, where every copy and
 * kernel runs only once something waits for it: it keeps each batch's results pending and
 * reads them all at the end. A batch buffer overwritten before the consumer's kernels read
 * it, or a host slot (pinned or not) refilled before the copy out of it ran, shows as a wrong
 * item; a slot freed too early, as an ASan report. */
Test(loader_device, side_stream_copies_ordered_on_async_testdev, .init = testdev_setup,
     .fini = testdev_teardown) {
    char path[4096];
    snprintf(path, sizeof path, "%s/testdev.so", getenv("EMBER_TEST_PLUGIN_DIR"));
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    cr_assert(h, "testdev is not loaded: %s", dlerror());
    size_t (*pending)(int, const em_stream *) =
        (size_t (*)(int, const em_stream *))dlsym(h, "ember_testdev_pending");
    cr_assert(pending);
    dlclose(h);
    em_device dev;
    cr_assert_eq(em_device_parse("testdev:1", &dev), EM_OK, "%s", em_last_error());
    em_stream *c = NULL;
    cr_assert_eq(em_stream_create(dev, &c), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_set_current(dev, c), EM_OK, "%s", em_last_error());
    em_dataset *ds = counting(30, 4);
    for (int pin = 0; pin <= 1; pin++) {
        for (int w = 0; w <= 2; w += 2) {
            em_loader_options o = {.struct_size = sizeof o, .batch_size = 8, .shuffle = true,
                                   .seed = 3, .num_workers = w, .device = dev,
                                   .pin_memory = pin};
            em_loader *l = em_loader_new(ds, &o);
            cr_assert(l, "%s", em_last_error());
            em_tensor *xs[4], *ys[4], *x, *y;
            int nb = 0;
            while (em_loader_next(l, &x, &y) == EM_OK && x) {
                cr_assert_lt(nb, 4);
                em_tensor *zero = em_zeros_like(x);
                xs[nb] = em_add(x, zero); /* on c, reading the loader's device buffer */
                ys[nb] = em_clone(y);
                cr_assert(zero && xs[nb] && ys[nb], "%s", em_last_error());
                em_tensor_release(zero);
                cr_assert_geq(pending(1, c), 3, "the consumer's kernels are pending");
                nb++;
            }
            cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
            cr_assert_eq(nb, 4);
            int64_t got[30], n = 0;
            for (int b = 0; b < nb; b++) {
                em_tensor *hx = em_to_device(xs[b], em_cpu()), *hy = em_to_device(ys[b], em_cpu());
                cr_assert(hx && hy, "%s", em_last_error());
                n += batch_items(hx, hy, got + n, 4);
                em_tensor_release(hx);
                em_tensor_release(hy);
                em_tensor_release(xs[b]);
                em_tensor_release(ys[b]);
            }
            cr_assert_eq(n, 30);
            int64_t ref[30];
            for (int i = 0; i < 30; i++) ref[i] = i;
            ref_permute(ref, 30, 3, 0, 0x53485546u);
            cr_assert(memcmp(got, ref, sizeof ref) == 0, "pin_memory %d, %d workers: the "
                      "batches differ from the sampler's order", pin, w);
            em_loader_free(l);
        }
    }
    cr_assert_eq(em_stream_set_current(dev, NULL), EM_OK);
    em_stream_free(dev, c);
    em_dataset_free(ds);
}

/* The loader's device buffers were allocated on the default stream, but the consumer reads
 * them on its own stream: freed with the loader while that read is pending, their blocks
 * must not go back to the default stream's cache until the consumer's stream is done. */
Test(loader_device, buffers_wait_for_the_consumer_stream_when_freed, .init = testdev_setup,
     .fini = testdev_teardown) {
    em_device dev;
    cr_assert_eq(em_device_parse("testdev:1", &dev), EM_OK, "%s", em_last_error());
    em_dataset *ds = counting(8, 4);
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 8, .device = dev};
    em_loader *l = em_loader_new(ds, &o); /* buffers on the default stream */
    cr_assert(l, "%s", em_last_error());
    em_stream *c = NULL;
    cr_assert_eq(em_stream_create(dev, &c), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_stream_set_current(dev, c), EM_OK, "%s", em_last_error());
    em_tensor *x, *y;
    cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
    cr_assert(x && y);
    void *bufs[2] = {em_tensor_data(x), em_tensor_data(y)};
    em_tensor *zero = em_zeros_like(x);
    em_tensor *sum = em_add(x, zero); /* on c: reads the loader's buffer, later */
    em_tensor *label = em_clone(y);
    cr_assert(zero && sum && label, "%s", em_last_error());
    cr_assert_eq(em_stream_set_current(dev, NULL), EM_OK);
    em_loader_free(l);
    em_tensor *t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = em_empty(2, (int64_t[]){8, 2}, EM_F32, dev); /* on the default stream */
        cr_assert(t[i], "%s", em_last_error());
        for (int k = 0; k < 2; k++)
            cr_assert_neq(em_tensor_data(t[i]), bufs[k], "a loader buffer went to the default "
                          "stream while the consumer's stream still read it");
    }
    cr_assert_eq(em_stream_set_current(dev, c), EM_OK);
    em_tensor *hx = em_to_device(sum, em_cpu()), *hy = em_to_device(label, em_cpu());
    cr_assert(hx && hy, "%s", em_last_error());
    int64_t got[8];
    cr_assert_eq(batch_items(hx, hy, got, 4), 8);
    for (int i = 0; i < 8; i++) cr_assert_eq(got[i], i);
    cr_assert_eq(em_stream_set_current(dev, NULL), EM_OK);
    for (int i = 0; i < 3; i++) em_tensor_release(t[i]);
    em_tensor_release(hx);
    em_tensor_release(hy);
    em_tensor_release(sum);
    em_tensor_release(label);
    em_tensor_release(zero);
    em_stream_free(dev, c);
    em_dataset_free(ds);
}
