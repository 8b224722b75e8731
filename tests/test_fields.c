/*
 * test_fields.c — items as named fields (issue 19): a variable-length dataset class from a test
 * plugin (tests/plugins/varlen_plugin.c, items in varlen.h) batches with padding, lengths and
 * masks checked item by item against plain loops, with 0, 1 and 2 workers, shuffled (against
 * the documented permutation), resumed mid-epoch (bitwise the same batches), copied to the
 * test device with pinned buffers; 1.0 datasets appear as the fields "input" and "target"; a
 * program's callback field dataset; the errors of bad fields, bad lengths and unknown names;
 * and a layer that takes the padding mask, reached through a container.
 */
#define _GNU_SOURCE /* setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "data_ref.h"
#include "plugins/varlen.h"

static void varlen_setup(void) {
    const char *dir = getenv("EMBER_TEST_PLUGIN_DIR");
    cr_assert(dir, "EMBER_TEST_PLUGIN_DIR is not set (run through make check)");
    char path[8192];
    snprintf(path, sizeof path, "%s/varlen_plugin.so:%s/testdev.so", dir, dir);
    setenv("EMBER_PLUGIN_PATH", path, 1);
    em_test_setup();
}
static void varlen_teardown(void) {
    em_test_teardown();
    unsetenv("EMBER_PLUGIN_PATH");
}

TestSuite(fields, .init = varlen_setup, .fini = varlen_teardown);

enum { N = 37, MAXLEN = 9, DIM = 3, CLASSES = 3, BS = 5 };
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static em_dataset *open_varlen(void) {
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_int(o, "length", N), EM_OK);
    cr_assert_eq(em_options_set_int(o, "max_len", MAXLEN), EM_OK);
    cr_assert_eq(em_options_set_int(o, "dim", DIM), EM_OK);
    cr_assert_eq(em_options_set_int(o, "classes", CLASSES), EM_OK);
    em_dataset *ds = em_dataset_open("test-varlen", o);
    em_options_free(o);
    cr_assert(ds, "%s", em_last_error());
    return ds;
}

/* A tensor's bytes on the host (malloc'd; the caller frees). */
static void *host_bytes(const em_tensor *t, size_t *n) {
    cr_assert(t, "%s", em_last_error());
    *n = em_tensor_nbytes(t);
    void *p = malloc(*n ? *n : 1);
    cr_assert(p);
    cr_assert_eq(em_tensor_to_host(t, p, *n), EM_OK, "%s", em_last_error());
    return p;
}

/* Append a batch's bytes (every field, its lengths and mask) to a growing record. */
typedef struct record {
    unsigned char *p;
    size_t n, cap;
} record;
static void record_add(record *r, const void *p, size_t n) {
    if (r->n + n > r->cap) {
        r->cap = (r->n + n) * 2;
        r->p = realloc(r->p, r->cap);
        cr_assert(r->p);
    }
    memcpy(r->p + r->n, p, n);
    r->n += n;
}
static void record_batch(record *r, const em_batch *b) {
    static const char *const names[3] = {"seq", "marks", "label"};
    for (int f = 0; f < 3; f++) {
        em_tensor *ts[3] = {em_batch_field(b, names[f]), NULL, NULL};
        if (f < 2) {
            ts[1] = em_batch_lengths(b, names[f]);
            ts[2] = em_batch_mask(b, names[f]);
        }
        for (int k = 0; k < 3 && (k == 0 || f < 2); k++) {
            size_t n;
            void *p = host_bytes(ts[k], &n);
            int64_t nd = em_tensor_ndim(ts[k]);
            record_add(r, &nd, sizeof nd); /* the shape is part of the batch */
            record_add(r, em_tensor_shape(ts[k]), sizeof(int64_t) * (size_t)nd);
            record_add(r, p, n);
            free(p);
        }
    }
}

/* Check one batch of the varlen dataset against varlen.h for the items items[0..n). */
static void check_batch(const em_batch *b, const int64_t *items, int64_t n, em_device dev) {
    cr_assert_eq(em_batch_size(b), n);
    cr_assert_eq(em_batch_field_count(b), 3);
    cr_assert_str_eq(em_batch_field_name(b, 0), "seq");
    cr_assert_str_eq(em_batch_field_name(b, 1), "marks");
    cr_assert_str_eq(em_batch_field_name(b, 2), "label");
    int64_t L = 0, L2 = 0;
    for (int64_t j = 0; j < n; j++) {
        L = MAX(L, vl_seq_len(items[j], MAXLEN));
        L2 = MAX(L2, vl_marks_len(items[j], MAXLEN));
    }
    em_tensor *seq = em_batch_field(b, "seq"), *marks = em_batch_field(b, "marks");
    em_tensor *label = em_batch_field(b, "label");
    em_tensor *sl = em_batch_lengths(b, "seq"), *sm = em_batch_mask(b, "seq");
    em_tensor *ml = em_batch_lengths(b, "marks"), *mm = em_batch_mask(b, "marks");
    em_tensor *all[7] = {seq, marks, label, sl, sm, ml, mm};
    for (int k = 0; k < 7; k++) {
        cr_assert(all[k], "%s", em_last_error());
        cr_assert(em_device_equal(em_tensor_device(all[k]), dev));
        cr_assert(em_tensor_is_contiguous(all[k]));
        cr_assert_eq(em_tensor_category(all[k]), EM_MEM_DATA);
    }
    int64_t want_seq[3] = {n, L, DIM}, want_marks[3] = {n, 2, L2};
    cr_assert_eq(em_tensor_ndim(seq), 3);
    cr_assert(memcmp(em_tensor_shape(seq), want_seq, sizeof want_seq) == 0,
              "seq is padded to the batch's longest item, %lld", (long long)L);
    cr_assert_eq(em_tensor_ndim(marks), 3);
    cr_assert(memcmp(em_tensor_shape(marks), want_marks, sizeof want_marks) == 0);
    cr_assert_eq(em_tensor_ndim(label), 1);
    cr_assert_eq(em_tensor_dtype(seq), EM_F32);
    cr_assert_eq(em_tensor_dtype(marks), EM_U8);
    cr_assert_eq(em_tensor_dtype(label), EM_I64);
    cr_assert_eq(em_tensor_dtype(sl), EM_I64);
    cr_assert_eq(em_tensor_dtype(sm), EM_BOOL);
    cr_assert_eq(em_tensor_ndim(sm), 2);
    cr_assert_eq(em_tensor_size(sm, 0), n);
    cr_assert_eq(em_tensor_size(sm, 1), L);
    cr_assert_eq(em_tensor_size(mm, 1), L2);
    size_t nb;
    float *ps = host_bytes(seq, &nb);
    uint8_t *pm = host_bytes(marks, &nb);
    int64_t *pl = host_bytes(label, &nb), *psl = host_bytes(sl, &nb), *pml = host_bytes(ml, &nb);
    uint8_t *psm = host_bytes(sm, &nb), *pmm = host_bytes(mm, &nb);
    for (int64_t j = 0; j < n; j++) {
        int64_t i = items[j], len = vl_seq_len(i, MAXLEN), len2 = vl_marks_len(i, MAXLEN);
        cr_assert_eq(pl[j], vl_label(i, MAXLEN, CLASSES));
        cr_assert_eq(psl[j], len, "item %lld: seq length", (long long)i);
        cr_assert_eq(pml[j], len2, "item %lld: marks length", (long long)i);
        for (int64_t t = 0; t < L; t++) {
            cr_assert_eq(psm[j * L + t], t < len, "item %lld: seq mask at %lld", (long long)i,
                         (long long)t);
            for (int64_t d = 0; d < DIM; d++)
                cr_assert_eq(ps[(j * L + t) * DIM + d], t < len ? vl_seq(i, t, d) : 0.f,
                             "item %lld seq[%lld][%lld]", (long long)i, (long long)t,
                             (long long)d);
        }
        for (int64_t t = 0; t < L2; t++) {
            cr_assert_eq(pmm[j * L2 + t], t < len2);
            for (int64_t r = 0; r < 2; r++)
                cr_assert_eq(pm[(j * 2 + r) * L2 + t], t < len2 ? vl_marks(i, r, t) : 7,
                             "item %lld marks[%lld][%lld]", (long long)i, (long long)r,
                             (long long)t);
        }
    }
    free(ps), free(pm), free(pl), free(psl), free(pml), free(psm), free(pmm);
}

/* Two shuffled epochs with 0, 1 and 2 workers: every batch is the documented permutation's
 * items, padded; the class's fields are what it declared. */
Test(fields, variable_length_batches_pad_with_lengths_and_masks) {
    em_dataset *ds = open_varlen();
    cr_assert_eq(em_dataset_field_count(ds), 3);
    const em_field *f = em_dataset_field(ds, 1);
    cr_assert(f && f->variable && f->var_dim == 1 && f->pad_value == 7);
    cr_assert_eq(em_dataset_field_index(ds, "label"), 2);
    cr_assert_eq(em_dataset_field(ds, 2)->num_classes, CLASSES);
    for (int w = 0; w <= 2; w++) {
        em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = BS, .shuffle = true,
                                  .seed = 11, .num_workers = w};
        em_loader *l = em_loader_new_v2(ds, &o);
        cr_assert(l, "%s", em_last_error());
        cr_assert_eq(em_loader_num_batches(l), (N + BS - 1) / BS);
        for (int e = 0; e < 2; e++) {
            int64_t ref[N];
            for (int i = 0; i < N; i++) ref[i] = i;
            ref_permute(ref, N, 11, (uint64_t)e, 0x53485546u);
            const em_batch *b;
            int64_t at = 0;
            while (em_loader_next_v2(l, &b) == EM_OK && b) {
                int64_t n = MIN(BS, N - at);
                check_batch(b, ref + at, n, em_cpu());
                at += n;
            }
            cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
            cr_assert_eq(at, N, "%d workers, epoch %d", w, e);
        }
        em_loader_stats st = em_loader_get_stats(l);
        cr_assert_eq(st.batches, 2 * (uint64_t)em_loader_num_batches(l));
        cr_assert_gt(em_loader_wait_quantile(l, 1.0), 0, "the waits are recorded");
        em_loader_free(l);
    }
    em_dataset_free(ds);
}

/* A loader restored to a position mid-epoch gives bitwise the batches the original gave from
 * there, whatever either loader's worker count. */
Test(fields, resumed_mid_epoch_gives_the_same_batches) {
    em_dataset *ds = open_varlen();
    for (int w = 0; w <= 2; w += 2) {
        em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = BS, .shuffle = true,
                                  .seed = 5, .num_workers = w};
        em_loader *a = em_loader_new_v2(ds, &o);
        cr_assert(a, "%s", em_last_error());
        const em_batch *b;
        while (em_loader_next_v2(a, &b) == EM_OK && b) {} /* epoch 0 */
        for (int k = 0; k < 3; k++) cr_assert_eq(em_loader_next_v2(a, &b), EM_OK);
        em_loader_state pos = em_loader_get_state(a);
        cr_assert_eq(pos.epoch, 1);
        cr_assert_eq(pos.batch, 3);
        record ra = {0}, rb = {0};
        while (em_loader_next_v2(a, &b) == EM_OK && b) record_batch(&ra, b);
        cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
        o.num_workers = 1 - w / 2; /* 1 when a had 0, 0 when a had 2 */
        o.seed = 99;               /* the state's seed wins */
        em_loader *c = em_loader_new_v2(ds, &o);
        cr_assert(c, "%s", em_last_error());
        cr_assert_eq(em_loader_set_state(c, pos), EM_OK, "%s", em_last_error());
        while (em_loader_next_v2(c, &b) == EM_OK && b) record_batch(&rb, b);
        cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
        cr_assert_gt(ra.n, 0);
        cr_assert_eq(ra.n, rb.n);
        cr_assert(memcmp(ra.p, rb.p, ra.n) == 0, "the resumed batches differ (%d workers)", w);
        free(ra.p);
        free(rb.p);
        em_loader_free(a);
        em_loader_free(c);
    }
    em_dataset_free(ds);
}

/* Every field, its lengths and its mask reach the test device, from pinned host buffers or
 * not, with 0 and 2 workers, equal to the CPU loader's batches. */
Test(fields, variable_fields_on_the_test_device) {
    em_device dev;
    cr_assert_eq(em_device_parse("testdev:1", &dev), EM_OK, "%s", em_last_error());
    em_dataset *ds = open_varlen();
    int64_t ref[N];
    for (int i = 0; i < N; i++) ref[i] = i;
    ref_permute(ref, N, 8, 0, 0x53485546u);
    for (int pin = 0; pin <= 1; pin++)
        for (int w = 0; w <= 2; w += 2) {
            em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = BS,
                                      .shuffle = true, .seed = 8, .num_workers = w,
                                      .device = dev, .pin_memory = pin};
            em_loader *l = em_loader_new_v2(ds, &o);
            cr_assert(l, "%s", em_last_error());
            const em_batch *b;
            int64_t at = 0;
            while (em_loader_next_v2(l, &b) == EM_OK && b) {
                int64_t n = MIN(BS, N - at);
                check_batch(b, ref + at, n, dev);
                at += n;
            }
            cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
            cr_assert_eq(at, N);
            em_loader_free(l);
        }
    em_dataset_free(ds);
}

/* A 1.0 dataset's items are the fields "input" and "target": em_loader_next_v2 hands out the
 * tensors em_loader_next does. */
Test(fields, a_1_0_dataset_has_input_and_target) {
    em_scope_begin();
    em_tensor *x = em_arange(0, 12, 1, EM_F32, em_cpu());
    x = em_reshape(x, 2, (int64_t[]){6, 2});
    em_tensor *y = em_arange(0, 6, 1, EM_I64, em_cpu());
    em_dataset *ds = em_dataset_from_tensors(x, y, 6);
    em_scope_end();
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_field_count(ds), 2);
    cr_assert_str_eq(em_dataset_field(ds, 0)->name, "input");
    cr_assert_str_eq(em_dataset_field(ds, 1)->name, "target");
    cr_assert_eq(em_dataset_field(ds, 1)->num_classes, 6);
    cr_assert_eq(em_dataset_field(ds, 0)->ndim, 1);
    cr_assert(!em_dataset_field(ds, 0)->variable);
    cr_assert_null(em_dataset_field(ds, 2));
    cr_assert_eq(em_last_status(), EM_ERR_RANGE);
    em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = 4};
    em_loader *l = em_loader_new_v2(ds, &o);
    cr_assert(l, "%s", em_last_error());
    const em_batch *b;
    cr_assert_eq(em_loader_next_v2(l, &b), EM_OK, "%s", em_last_error());
    em_tensor *bx = em_batch_field(b, "input"), *by = em_batch_field(b, "target");
    cr_assert(bx && by);
    for (int j = 0; j < 4; j++) {
        cr_assert_eq(((const float *)em_tensor_data(bx))[2 * j + 1], (float)(2 * j + 1));
        cr_assert_eq(((const int64_t *)em_tensor_data(by))[j], j);
    }
    cr_assert_null(em_batch_field(b, "inputs"));
    cr_assert_eq(em_last_status(), EM_ERR_NOTFOUND);
    cr_assert(strstr(em_last_error(), "'inputs'") && strstr(em_last_error(), "input, target"),
              "%s", em_last_error());
    cr_assert_null(em_batch_mask(b, "input"));
    cr_assert_eq(em_last_status(), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "fixed"), "%s", em_last_error());
    em_tensor *x2, *y2; /* the short last batch, through the 1.0 call */
    cr_assert_eq(em_loader_next(l, &x2, &y2), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_tensor_size(x2, 0), 2);
    cr_assert_eq(((const int64_t *)em_tensor_data(y2))[1], 5);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* ---- a program's field dataset ----------------------------------------------------------- */

/* Item i: "ids" (len) int32 = i*10 + t with len = i % 4 (0 .. 3, longest 3), pad -1; item 5
 * reports length 9 when `bad` is set. */
static em_status ids_item(void *user, int64_t i, void *const *data, int64_t *lengths) {
    int32_t *p = data[0];
    int64_t len = i % 4;
    for (int64_t t = 0; t < len; t++) p[t] = (int32_t)(i * 10 + t);
    lengths[0] = (user && i == 5) ? 9 : len;
    *(float *)data[1] = (float)i / 2;
    return EM_OK;
}

static const em_field ids_fields[2] = {
    {.struct_size = sizeof(em_field), .name = "ids", .dtype = EM_I32, .ndim = 1, .shape = {3},
     .variable = true, .var_dim = 0, .pad_value = -1},
    {.struct_size = sizeof(em_field), .name = "w", .dtype = EM_F32, .ndim = 0},
};

Test(fields, a_callback_field_dataset_and_its_errors) {
    em_dataset *ds = em_dataset_from_fields(8, ids_fields, 2, ids_item, NULL);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_str_eq(em_dataset_name(ds), "fields");
    em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = 4, .num_workers = 1};
    em_loader *l = em_loader_new_v2(ds, &o);
    cr_assert(l, "%s", em_last_error());
    const em_batch *b;
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(em_loader_next_v2(l, &b), EM_OK, "%s", em_last_error());
        em_tensor *ids = em_batch_field(b, "ids");
        cr_assert_eq(em_tensor_size(ids, 1), 3);
        const int32_t *p = em_tensor_data(ids);
        for (int j = 0; j < 4; j++) {
            int64_t i = 4 * k + j;
            for (int t = 0; t < 3; t++)
                cr_assert_eq(p[j * 3 + t], t < i % 4 ? (int32_t)(i * 10 + t) : -1);
            cr_assert_eq(((const float *)em_tensor_data(em_batch_field(b, "w")))[j],
                         (float)i / 2);
        }
    }
    /* the 1.0 entry points name what is missing */
    em_tensor *x, *y;
    cr_assert_eq(em_loader_next(l, &x, &y), EM_ERR_NOTFOUND);
    cr_assert(strstr(em_last_error(), "no field 'input'"), "%s", em_last_error());
    char buf[64];
    cr_assert_eq(em_dataset_read(ds, (int64_t[]){0}, 1, buf, buf), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "em_dataset_read_fields"), "%s", em_last_error());
    em_loader_free(l);
    em_dataset_free(ds);

    /* a length beyond the field's longest stops the loader at its batch, naming it */
    ds = em_dataset_from_fields(8, ids_fields, 2, ids_item, (void *)1);
    cr_assert(ds, "%s", em_last_error());
    l = em_loader_new_v2(ds, &o);
    cr_assert(l, "%s", em_last_error());
    cr_assert_eq(em_loader_next_v2(l, &b), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_loader_next_v2(l, &b), EM_ERR_FORMAT);
    cr_assert(strstr(em_last_error(), "batch 1") && strstr(em_last_error(), "item 5") &&
              strstr(em_last_error(), "'ids' has length 9"), "%s", em_last_error());
    em_loader_free(l);
    em_dataset_free(ds);

    /* bad declarations */
    em_field bad[2];
    memcpy(bad, ids_fields, sizeof bad);
    bad[1].name = "ids";
    cr_assert_null(em_dataset_from_fields(8, bad, 2, ids_item, NULL));
    cr_assert(strstr(em_last_error(), "'ids' is declared twice"), "%s", em_last_error());
    memcpy(bad, ids_fields, sizeof bad);
    bad[0].var_dim = 1;
    cr_assert_null(em_dataset_from_fields(8, bad, 2, ids_item, NULL));
    cr_assert(strstr(em_last_error(), "variable dim 1"), "%s", em_last_error());
    memcpy(bad, ids_fields, sizeof bad);
    bad[1].name = "2w";
    cr_assert_null(em_dataset_from_fields(8, bad, 2, ids_item, NULL));
    cr_assert(strstr(em_last_error(), "'2w'"), "%s", em_last_error());
    cr_assert_null(em_dataset_from_fields(8, ids_fields, 0, ids_item, NULL));
    cr_assert_eq(em_last_status(), EM_ERR_INVALID);
}

/* ---- layers that take the mask ----------------------------------------------------------- */

/* testvl.MaskedMean inside a Sequential gets the batch's mask through the container: the mean
 * over each item's real positions, against a plain loop; without a mask it refuses. */
Test(fields, a_masked_layer_receives_the_padding_mask) {
    em_dataset *ds = open_varlen();
    em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = 8};
    em_loader *l = em_loader_new_v2(ds, &o);
    cr_assert(l, "%s", em_last_error());
    const em_batch *b;
    cr_assert_eq(em_loader_next_v2(l, &b), EM_OK, "%s", em_last_error());
    em_module *seq = em_module_new("Sequential", NULL);
    cr_assert(seq, "%s", em_last_error());
    em_module *mm = em_module_new("testvl.MaskedMean", NULL);
    cr_assert(mm, "%s", em_last_error());
    cr_assert_eq(em_module_append_child(seq, mm), EM_OK, "%s", em_last_error());
    em_scope_begin();
    em_tensor *x = em_batch_field(b, "seq");
    em_tensor *y = em_module_forward_masked(seq, &x, 1, em_batch_mask(b, "seq"));
    cr_assert(y, "%s", em_last_error());
    cr_assert_eq(em_tensor_size(y, 0), 8);
    cr_assert_eq(em_tensor_size(y, 1), DIM);
    const float *py = em_tensor_data(em_contiguous(y));
    for (int64_t i = 0; i < 8; i++) {
        int64_t len = vl_seq_len(i, MAXLEN);
        for (int64_t d = 0; d < DIM; d++) {
            double s = 0;
            for (int64_t t = 0; t < len; t++) s += vl_seq(i, t, d);
            cr_assert_float_eq(py[i * DIM + d], s / (double)len, 1e-5, "item %lld", (long long)i);
        }
    }
    cr_assert_null(em_module_forward(seq, x), "no mask outside em_module_forward_masked");
    cr_assert(strstr(em_last_error(), "no padding mask"), "%s", em_last_error());
    em_scope_end();
    em_module_free(seq);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* ---- transforms per field ----------------------------------------------------------------- */

/* Transform specs apply to the field they name: to_float with a scale on "label" (an int64
 * field) delivers label * 0.5 in float32 beside the untouched variable fields; a spec on a
 * variable-length field, or on a field the dataset lacks, is refused naming the spec. */
Test(fields, transforms_apply_to_the_field_they_name) {
    em_dataset *ds = open_varlen();
    em_options *half = em_options_new();
    cr_assert_eq(em_options_set_float(half, "scale", 0.5), EM_OK);
    em_transform_spec sp = {.struct_size = sizeof sp, .field = "label", .name = "to_float",
                            .options = half};
    em_loader_options_v2 o = {.struct_size = sizeof o, .batch_size = BS, .num_workers = 2,
                              .transforms = &sp, .n_transforms = 1};
    em_loader *l = em_loader_new_v2(ds, &o);
    cr_assert(l, "%s", em_last_error());
    const em_batch *b;
    int64_t at = 0;
    while (em_loader_next_v2(l, &b) == EM_OK && b) {
        int64_t n = MIN(BS, N - at);
        em_tensor *lab = em_batch_field(b, "label");
        cr_assert_eq(em_tensor_dtype(lab), EM_F32);
        for (int64_t j = 0; j < n; j++)
            cr_assert_eq(((const float *)em_tensor_data(lab))[j],
                         (float)vl_label(at + j, MAXLEN, CLASSES) * 0.5f);
        em_tensor *seq = em_batch_field(b, "seq");
        cr_assert_eq(em_tensor_dtype(seq), EM_F32);
        cr_assert_eq(em_tensor_size(em_batch_mask(b, "seq"), 0), n);
        at += n;
    }
    cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
    cr_assert_eq(at, N);
    em_loader_free(l);
    sp.field = "seq";
    cr_assert_null(em_loader_new_v2(ds, &o));
    cr_assert_eq(em_last_status(), EM_ERR_INVALID);
    cr_assert(strstr(em_last_error(), "transforms[0]") && strstr(em_last_error(), "'seq'") &&
              strstr(em_last_error(), "variable-length"), "%s", em_last_error());
    sp.field = "lable";
    cr_assert_null(em_loader_new_v2(ds, &o));
    cr_assert(strstr(em_last_error(), "transforms[0] applies to the field 'lable'") &&
              strstr(em_last_error(), "seq, marks, label"), "%s", em_last_error());
    em_options_free(half);
    em_dataset_free(ds);
}
