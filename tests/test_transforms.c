/*
 * test_transforms.c — transform classes (ember/transform.h) in the DataLoader: the built-ins
 * of ember-transforms against plain loops (to_float against a correctly rounded x / 255 for
 * every byte value, computed here without a float division), the item's random stream against
 * the Philox words of ember/data.h's definition, the 1.0 em_transforms struct giving the same
 * batches as the specs it stands for, a class of a test plugin (tests/plugins/
 * transform_plugin.c) used by name, and the errors naming the field, transform and option.
 */
#include "common.h"

#include <math.h>

TestSuite(transforms, .init = em_test_setup, .fini = em_test_teardown);

/* x / 255 rounded to the nearest float32 (ties to even), found from the candidates around a
 * double quotient by exact arithmetic: c * 255 is exact in double (24 + 8 bits), so
 * |c * 255 - x| orders the candidates by their distance to x / 255. */
static float div255_ref(int x) {
    float c = (float)((double)x / 255.0), best = c;
    double bd = fabs((double)c * 255.0 - x);
    float cands[2] = {nextafterf(c, -1.0f), nextafterf(c, 2.0f)};
    for (int i = 0; i < 2; i++) {
        double d = fabs((double)cands[i] * 255.0 - x);
        uint32_t bits;
        memcpy(&bits, &cands[i], 4);
        if (d < bd || (d == bd && !(bits & 1))) best = cands[i], bd = d;
    }
    return best;
}

/* One item of the 256 byte values, as a dataset over tensors. */
static em_dataset *all_bytes(void) {
    em_tensor *x = em_empty(2, (int64_t[]){1, 256}, EM_U8, em_cpu());
    em_tensor *y = em_zeros(1, (int64_t[]){1}, EM_I64, em_cpu());
    for (int v = 0; v < 256; v++) ((uint8_t *)em_tensor_data(x))[v] = (uint8_t)v;
    em_dataset *ds = em_dataset_from_tensors(x, y, 1);
    cr_assert(ds, "%s", em_last_error());
    em_tensor_release(x);
    em_tensor_release(y);
    return ds;
}

static void first_batch(em_dataset *ds, const em_loader_options *o, float *out, size_t n) {
    em_loader *l = em_loader_new(ds, o);
    cr_assert(l, "%s", em_last_error());
    em_tensor *x, *y;
    cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_dtype(x), EM_F32);
    cr_assert_eq((size_t)em_tensor_numel(x), n);
    memcpy(out, em_tensor_data(x), n * sizeof(float));
    em_loader_free(l);
}

Test(transforms, to_float_is_x_over_255_for_every_byte) {
    em_dataset *ds = all_bytes();
    float ref[256];
    int old_off = 0;
    for (int v = 0; v < 256; v++) {
        ref[v] = div255_ref(v);
        old_off += (float)v * (float)(1.0 / 255.0) != ref[v]; /* Ember 1.0's formula */
    }
    cr_assert_eq(old_off, 126, "the 1.0 multiply was off for %d byte values", old_off);
    const em_transform_spec spec = {.struct_size = sizeof spec, .field = "input",
                                    .name = "to_float"};
    em_loader_options with_specs = {.struct_size = sizeof with_specs, .transform_specs = &spec,
                                    .n_transform_specs = 1};
    em_loader_options with_struct = {.struct_size = sizeof with_struct,
                                     .transforms = {.to_float = true}};
    const em_loader_options *both[2] = {&with_specs, &with_struct};
    for (int k = 0; k < 2; k++) {
        float got[256];
        first_batch(ds, both[k], got, 256);
        for (int v = 0; v < 256; v++)
            cr_assert(memcmp(&got[v], &ref[v], 4) == 0, "%s: %d -> %.9g, x / 255 is %.9g",
                      k ? "em_transforms" : "specs", v, got[v], ref[v]);
    }
    /* an explicit scale multiplies */
    em_options *o = em_options_new();
    em_options_set_float(o, "scale", 0.5);
    const em_transform_spec half = {.struct_size = sizeof half, .name = "to_float", .options = o};
    with_specs.transform_specs = &half;
    float got[256];
    first_batch(ds, &with_specs, got, 256);
    for (int v = 0; v < 256; v++) cr_assert_eq(got[v], v * 0.5f);
    em_options_free(o);
    em_dataset_free(ds);
}

/* Items of 37 bytes (two AVX-512 vectors, or four AVX2 ones, and a tail the scalar loop
 * converts): item i holds bytes (i + 5 k) % 256, so over 256 items every byte value sits at
 * every position, in a vector lane and in the tail. x / 255 against the correctly rounded
 * reference, and an explicit scale (1/3: inexact products) against float32 products; made in
 * the caller's thread and by two workers (which stream each 148-byte item into the batch:
 * core/loader.c, stream_copy, with its unaligned starts and ends). */
static em_status odd_item(void *user, int64_t i, void *input, void *target) {
    (void)user;
    for (int k = 0; k < 37; k++) ((uint8_t *)input)[k] = (uint8_t)((i + 5 * k) % 256);
    *(int64_t *)target = 0;
    return EM_OK;
}

Test(transforms, to_float_items_of_odd_length) {
    em_dataset_info info = {.struct_size = sizeof info, .length = 256, .input_ndim = 1,
                            .input_shape = {37}, .input_dtype = EM_U8, .target_dtype = EM_I64,
                            .num_classes = 1};
    em_dataset *ds = em_dataset_from_callback(&info, odd_item, NULL);
    cr_assert(ds, "%s", em_last_error());
    em_options *o = em_options_new();
    em_options_set_float(o, "scale", 1.0 / 3.0);
    for (int c = 0; c < 4; c++) {
        int k = c % 2;
        const em_transform_spec spec = {.struct_size = sizeof spec, .name = "to_float",
                                        .options = k ? o : NULL};
        em_loader_options lo = {.struct_size = sizeof lo, .batch_size = 256,
                                .num_workers = c / 2 * 2, .transform_specs = &spec,
                                .n_transform_specs = 1};
        float *got = malloc(sizeof(float) * 256 * 37);
        cr_assert(got);
        first_batch(ds, &lo, got, 256 * 37);
        for (int i = 0; i < 256; i++)
            for (int j = 0; j < 37; j++) {
                int v = (i + 5 * j) % 256;
                float want = k ? (float)v * (float)(1.0 / 3.0) : div255_ref(v);
                cr_assert(memcmp(&got[i * 37 + j], &want, 4) == 0,
                          "%s, %d workers: item %d element %d (byte %d) -> %.9g, want %.9g",
                          k ? "scale 1/3" : "x / 255", c / 2 * 2, i, j, v, got[i * 37 + j],
                          want);
            }
        free(got);
    }
    em_options_free(o);
    em_dataset_free(ds);
}

/* 40 images (3, 4, 4) u8 with distinct pixels; the label is the item index. */
static em_status image_item(void *user, int64_t i, void *input, void *target) {
    (void)user;
    uint8_t *p = input;
    for (int k = 0; k < 48; k++) p[k] = (uint8_t)(1 + (i * 7 + k * 3) % 250);
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

/* Word k of the stream of (seed, epoch, item), from ember/data.h's definition. */
static uint32_t stream_word(uint64_t seed, uint64_t epoch, uint64_t item, unsigned k) {
    uint32_t b = k / 4, S = b == 0 ? 0x5846524du : 0x59000000u + b - 1;
    uint32_t ctr[4] = {(uint32_t)item, (uint32_t)(item >> 32), (uint32_t)epoch, S};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32) ^ (uint32_t)(epoch >> 32)};
    uint32_t w[4];
    em_philox4x32_10(ctr, key, w);
    return w[k % 4];
}

static uint64_t below(uint32_t w, uint64_t n) { return ((uint64_t)w * n) >> 32; }

/* All batches of two epochs, as floats (48 per item) and the item order. */
static void epochs(em_dataset *ds, em_loader_options o, int64_t per_item, float *out,
                   int64_t *order) {
    em_loader *l = em_loader_new(ds, &o);
    cr_assert(l, "%s", em_last_error());
    em_tensor *x, *y;
    int64_t at = 0;
    for (int e = 0; e < 2; e++)
        while (em_loader_next(l, &x, &y) == EM_OK && x) {
            int64_t b = em_tensor_size(x, 0);
            cr_assert_eq(em_tensor_dtype(x), EM_F32);
            cr_assert_eq(em_tensor_numel(x), b * per_item);
            memcpy(out + at * per_item, em_tensor_data(x), sizeof(float) * (size_t)(b * per_item));
            memcpy(order + at, em_tensor_data(y), sizeof(int64_t) * (size_t)b);
            at += b;
        }
    cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
    cr_assert_eq(at, 80);
    em_loader_free(l);
}

/* random_crop(1), hflip, to_float, normalize against a loop over the stream's words; the same
 * from 0 and 2 workers, and from the 1.0 struct that stands for these specs. */
Test(transforms, the_builtins_are_plain_loops_over_the_stream) {
    em_dataset *ds = images();
    static const float mean[3] = {0.5f, 0.25f, 0.125f}, stdv[3] = {0.5f, 2.0f, 0.3f};
    em_options *crop = em_options_new(), *norm = em_options_new();
    em_options_set_int(crop, "padding", 1);
    em_options_set_floats(norm, "mean", 3, (const double[]){0.5, 0.25, 0.125});
    em_options_set_floats(norm, "std", 3, (const double[]){0.5, 2.0, 0.3});
    const em_transform_spec specs[] = {
        {.struct_size = sizeof specs[0], .name = "random_crop", .options = crop},
        {.struct_size = sizeof specs[0], .field = "input", .name = "hflip"},
        {.struct_size = sizeof specs[0], .name = "to_float"},
        {.struct_size = sizeof specs[0], .name = "normalize", .options = norm},
    };
    const uint64_t seed = 0x123456789abcull;
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 7, .shuffle = true,
                           .seed = seed, .transform_specs = specs, .n_transform_specs = 4};
    static float a[80 * 48], b[80 * 48];
    int64_t oa[80], ob[80];
    epochs(ds, o, 48, a, oa);
    em_options_free(crop);
    em_options_free(norm);
    o.num_workers = 2;
    o.transform_specs = specs; /* the bags are gone: a new loader must not need them ... */
    o.n_transform_specs = 0;   /* ... so the 1.0 struct gives the rest */
    o.transforms = (em_transforms){.mean = mean, .std = stdv, .n_channels = 3,
                                   .crop_padding = 1, .hflip = true};
    epochs(ds, o, 48, b, ob);
    cr_assert(memcmp(oa, ob, sizeof oa) == 0);
    for (int k = 0; k < 80 * 48; k++)
        cr_assert(memcmp(&a[k], &b[k], 4) == 0, "the 1.0 struct with 2 workers differs at item %d "
                  "value %d: %.9g vs %.9g", k / 48, k % 48, a[k], b[k]);
    int flips = 0, shifts = 0;
    for (int j = 0; j < 80; j++) {
        int64_t item = oa[j], e = j / 40, lab;
        uint8_t raw[48];
        image_item(NULL, item, raw, &lab);
        int dy = (int)below(stream_word(seed, (uint64_t)e, (uint64_t)item, 0), 3) - 1;
        int dx = (int)below(stream_word(seed, (uint64_t)e, (uint64_t)item, 1), 3) - 1;
        bool f = stream_word(seed, (uint64_t)e, (uint64_t)item, 2) >= 0x80000000u;
        flips += f;
        shifts += dy || dx;
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 4; y++)
                for (int x = 0; x < 4; x++) {
                    /* crop then flip: output x reads the cropped column 3 - x */
                    int cx = f ? 3 - x : x, sy = y + dy, sx = cx + dx;
                    float v = sy >= 0 && sy < 4 && sx >= 0 && sx < 4
                                  ? div255_ref(raw[c * 16 + sy * 4 + sx]) : 0.0f;
                    float want = (v - mean[c]) / stdv[c];
                    float got = a[j * 48 + c * 16 + y * 4 + x];
                    cr_assert(memcmp(&got, &want, 4) == 0, "item %lld epoch %lld (c %d, y %d, x "
                              "%d): %.9g, want %.9g", (long long)item, (long long)e, c, y, x,
                              got, want);
                }
    }
    cr_assert(flips > 20 && flips < 60, "flips %d of 80", flips);
    cr_assert(shifts > 40, "shifts %d of 80", shifts);
    em_dataset_free(ds);
}

/* hflip draws the next word of the stream: word 0 alone, word 2 after a crop. The 1.0
 * struct's flip without a crop keeps drawing word 2, as 1.0 did. */
Test(transforms, a_flip_draws_its_word_of_the_stream) {
    em_dataset *ds = images();
    const em_transform_spec flip = {.struct_size = sizeof flip, .name = "hflip"};
    em_loader_options with_specs = {.struct_size = sizeof with_specs, .batch_size = 40,
                                    .seed = 5, .transform_specs = &flip, .n_transform_specs = 1};
    em_loader_options with_struct = {.struct_size = sizeof with_struct, .batch_size = 40,
                                     .seed = 5, .transforms = {.hflip = true}};
    const em_loader_options *both[2] = {&with_specs, &with_struct};
    for (int k = 0; k < 2; k++) {
        em_loader *l = em_loader_new(ds, both[k]);
        cr_assert(l, "%s", em_last_error());
        em_tensor *x, *y;
        cr_assert_eq(em_loader_next(l, &x, &y), EM_OK, "%s", em_last_error());
        cr_assert_eq(em_tensor_dtype(x), EM_U8);
        int flips = 0;
        for (int64_t item = 0; item < 40; item++) {
            uint8_t raw[48];
            int64_t lab;
            image_item(NULL, item, raw, &lab);
            bool f = stream_word(5, 0, (uint64_t)item, k ? 2 : 0) >= 0x80000000u;
            flips += f;
            const uint8_t *got = (const uint8_t *)em_tensor_data(x) + item * 48;
            for (int i = 0; i < 48; i++) {
                int row = i / 4, col = i % 4;
                cr_assert_eq(got[i], raw[row * 4 + (f ? 3 - col : col)], "%s: item %lld",
                             k ? "em_transforms" : "specs", (long long)item);
            }
        }
        cr_assert(flips > 5 && flips < 35, "flips %d", flips);
        em_loader_free(l);
    }
    em_dataset_free(ds);
}

static void load_test_plugin(void) {
    const char *d = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(d && *d, "EMBER_TEST_PLUGIN_DIR is not set (run through `make check`)");
    char path[4096];
    snprintf(path, sizeof path, "%s/transform_plugin.so", d);
    cr_assert_eq(em_plugin_load(path), EM_OK, "%s", em_last_error());
}

/* A plugin's class, after hflip (word 0 of the stream) and random_crop (words 1 and 2): its two
 * draws are word 3 and word 0 of the next block. It changes the shape to (3, 2, 2). */
Test(transforms, a_plugin_class_changes_the_shape_and_draws_on) {
    load_test_plugin();
    const em_transform_class *cls = em_transform_class_find("test_window");
    cr_assert_not_null(cls, "%s", em_last_error());
    cr_assert_eq(cls->n_options, 2);
    em_dataset *ds = images();
    em_options *win = em_options_new(), *crop = em_options_new();
    em_options_set_text(win, "size", "2", "test");
    em_options_set_text(win, "gain", "3", "test");
    em_options_set_int(crop, "padding", 1);
    const em_transform_spec specs[] = {
        {.struct_size = sizeof specs[0], .name = "hflip"},
        {.struct_size = sizeof specs[0], .name = "random_crop", .options = crop},
        {.struct_size = sizeof specs[0], .name = "to_float"},
        {.struct_size = sizeof specs[0], .name = "test_window", .options = win},
    };
    const uint64_t seed = 7;
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 16, .seed = seed,
                           .num_workers = 1, .transform_specs = specs, .n_transform_specs = 4};
    em_loader *l = em_loader_new(ds, &o);
    em_options_free(win);
    em_options_free(crop);
    cr_assert(l, "%s", em_last_error());
    em_tensor *x, *t;
    cr_assert_eq(em_loader_next(l, &x, &t), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_ndim(x), 4);
    cr_assert_eq(em_tensor_size(x, 1), 3);
    cr_assert_eq(em_tensor_size(x, 2), 2);
    cr_assert_eq(em_tensor_size(x, 3), 2);
    const float *got = em_tensor_data(x);
    for (int64_t item = 0; item < 16; item++) {
        uint8_t raw[48];
        int64_t lab;
        image_item(NULL, item, raw, &lab);
        bool f = stream_word(seed, 0, (uint64_t)item, 0) >= 0x80000000u;
        int dy = (int)below(stream_word(seed, 0, (uint64_t)item, 1), 3) - 1;
        int dx = (int)below(stream_word(seed, 0, (uint64_t)item, 2), 3) - 1;
        int y0 = (int)below(stream_word(seed, 0, (uint64_t)item, 3), 3);
        int x0 = (int)below(stream_word(seed, 0, (uint64_t)item, 4), 3);
        for (int c = 0; c < 3; c++)
            for (int y = 0; y < 2; y++)
                for (int xx = 0; xx < 2; xx++) {
                    /* flip first, then crop: output (y, x) of the crop reads the flipped
                     * image at (y + dy, x + dx), which is column 3 - (x + dx) when flipped */
                    int fy = y0 + y, fx = x0 + xx, sy = fy + dy, sx = fx + dx;
                    float v = 0;
                    if (sy >= 0 && sy < 4 && sx >= 0 && sx < 4)
                        v = div255_ref(raw[c * 16 + sy * 4 + (f ? 3 - sx : sx)]);
                    float want = v * 3.0f;
                    float g = got[item * 12 + c * 4 + y * 2 + xx];
                    cr_assert(memcmp(&g, &want, 4) == 0, "item %lld: %.9g, want %.9g",
                              (long long)item, g, want);
                }
    }
    em_loader_free(l);
    em_dataset_free(ds);
}

static void expect_refused(em_dataset *ds, const em_transform_spec *specs, int n,
                           em_status status, const char *a, const char *b) {
    em_loader_options o = {.struct_size = sizeof o, .transform_specs = specs,
                           .n_transform_specs = n};
    cr_assert_null(em_loader_new(ds, &o));
    em_assert_error(status, a);
    if (b) em_assert_error(status, b);
}

Test(transforms, errors_name_the_field_the_transform_and_the_option) {
    em_dataset *ds = images();
    em_options *o = em_options_new();
    em_transform_spec s = {.struct_size = sizeof s, .name = "to_flaot"};
    expect_refused(ds, &s, 1, EM_ERR_NOTFOUND, "field 'input'", "did you mean 'to_float'");
    s.name = "hflip";
    s.options = o;
    em_options_set_float(o, "q", 0.5);
    expect_refused(ds, &s, 1, EM_ERR_INVALID, "transform 'hflip' on field 'input'", "'q'");
    em_options_free(o);
    o = em_options_new();
    s.options = o;
    em_options_set_float(o, "p", 2);
    expect_refused(ds, &s, 1, EM_ERR_INVALID, "transform 'hflip' on field 'input'", "'p'");
    s.name = "normalize";
    em_options_free(o);
    o = em_options_new();
    s.options = o;
    em_options_set_floats(o, "mean", 2, (const double[]){0, 0});
    em_options_set_floats(o, "std", 2, (const double[]){1, 1});
    expect_refused(ds, &s, 1, EM_ERR_DTYPE, "transform 'normalize' on field 'input'",
                   "list to_float before it");
    em_transform_spec two[2] = {{.struct_size = sizeof s, .name = "to_float"}, s};
    expect_refused(ds, two, 2, EM_ERR_SHAPE, "option 'mean' has 2 values", "(3, 4, 4)");
    em_options_free(o);
    s = (em_transform_spec){.struct_size = sizeof s, .field = "label", .name = "hflip"};
    expect_refused(ds, &s, 1, EM_ERR_INVALID, "transform_specs[0] applies to the field 'label'",
                   NULL);
    em_dataset_free(ds);
    /* crop and flip need (C, H, W): the message names the shape */
    em_tensor *x = em_zeros(2, (int64_t[]){4, 10}, EM_F32, em_cpu());
    em_tensor *y = em_zeros(1, (int64_t[]){4}, EM_I64, em_cpu());
    ds = em_dataset_from_tensors(x, y, 1);
    em_tensor_release(x);
    em_tensor_release(y);
    s = (em_transform_spec){.struct_size = sizeof s, .name = "random_crop"};
    expect_refused(ds, &s, 1, EM_ERR_SHAPE, "transform 'random_crop' on field 'input'",
                   "the field's items are (10)");
    /* one form or the other */
    em_loader_options lo = {.struct_size = sizeof lo, .transform_specs = &s,
                            .n_transform_specs = 1, .transforms = {.to_float = true}};
    cr_assert_null(em_loader_new(ds, &lo));
    em_assert_error(EM_ERR_INVALID, "either transforms");
    em_dataset_free(ds);
}

static em_status nop_layout(const em_options *o, const char *f, const em_transform_layout *in,
                            em_transform_layout *out) {
    (void)o, (void)f;
    *out = *in;
    return EM_OK;
}

/* The kind's checks, and the classes of ember-transforms listed with their options. */
Test(transforms, the_kind_checks_its_records) {
    const char *const builtins[] = {"to_float", "normalize", "random_crop", "hflip"};
    for (int i = 0; i < 4; i++) {
        const em_transform_class *c = em_transform_class_find(builtins[i]);
        cr_assert_not_null(c, "%s", em_last_error());
        cr_assert_gt(c->n_options, 0);
    }
    cr_assert_null(em_transform_class_find("flip"));
    em_assert_error(EM_ERR_NOTFOUND, "no transform class named 'flip'");
    em_registry *prog = em_registry_program();
    em_transform_class c = {.struct_size = sizeof c, .name = "nop", .layout = nop_layout};
    cr_assert_eq(em_transform_class_register(prog, &c), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "transform class 'nop' lacks an apply function");
    c.name = "hflip";
    cr_assert_eq(em_transform_class_register(prog, &c), EM_ERR_INVALID);
    static const em_option_spec twice[] = {{.name = "a", .types = EM_OPT_INT},
                                           {.name = "a", .types = EM_OPT_INT}};
    c.apply = (em_status(*)(void *, const em_transform_layout *, const void *,
                            const em_transform_layout *, void *, em_transform_rng *))1;
    c.options = twice;
    c.n_options = 2;
    cr_assert_eq(em_transform_class_register(prog, &c), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "declares option 'a' twice");
    c.n_options = 0;
    cr_assert_eq(em_transform_class_register(prog, &c), EM_ERR_EXISTS);
    em_assert_error(EM_ERR_EXISTS, "(by ember-transforms)");
}
