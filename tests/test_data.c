/*
 * test_data.c — datasets: the class registry and its option validation, the ember-data
 * formats (MNIST IDX raw and gzip, CIFAR-10, CSV, synthetic) on files generated here, the
 * bundled digits, bad input of every kind (inputs that are not regular files, headers that
 * claim more than the file holds, empty datasets, NUL bytes, byte-order marks, more than 64
 * CIFAR batches), in-memory datasets, subsets and random_split; and the items of every source
 * (the four formats, tensors, a callback) as the named fields "input" and "target".
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common.h"
#include "data_ref.h"

TestSuite(data, .init = em_test_setup, .fini = em_test_teardown);

/* ---- helpers ------------------------------------------------------------------------------ */

/* A fresh temporary directory for one test (removed by rm -rf in cleanup). */
static char tmpdir[256];
static const char *fresh_dir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ember-test-data-XXXXXX");
    cr_assert(mkdtemp(tmpdir), "mkdtemp");
    return tmpdir;
}
static void cleanup(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

static const char *path_in(const char *dir, const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void write_file(const char *path, const void *data, size_t n, bool gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb");
        cr_assert(f);
        cr_assert_eq(gzwrite(f, data, (unsigned)n), (int)n);
        cr_assert_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        cr_assert(f);
        cr_assert_eq(fwrite(data, 1, n, f), n);
        fclose(f);
    }
}

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* The bytes of an IDX images file of n items (h, w) with pixel (i, k) = (i * 7 + k) %
 * 256 (caller frees). */
static uint8_t *idx_images(uint32_t n, uint32_t h, uint32_t w, size_t *size) {
    *size = 16 + (size_t)n * h * w;
    uint8_t *img = malloc(*size);
    cr_assert(img);
    put32(img, 0x803);
    put32(img + 4, n);
    put32(img + 8, h);
    put32(img + 12, w);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < (size_t)h * w; k++) img[16 + i * h * w + k] = (uint8_t)((i * 7 + k) % 256);
    return img;
}

/* IDX images (n, h, w) as idx_images makes them, and labels i % 10. */
static void write_idx(const char *dir, const char *prefix, uint32_t n, uint32_t h, uint32_t w,
                      bool gz) {
    size_t isz;
    uint8_t *img = idx_images(n, h, w, &isz), *lab = malloc(8 + n);
    put32(lab, 0x801);
    put32(lab + 4, n);
    for (uint32_t i = 0; i < n; i++) lab[8 + i] = (uint8_t)(i % 10);
    char name[128];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", prefix, gz ? ".gz" : "");
    write_file(path_in(dir, name), img, isz, gz);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", prefix, gz ? ".gz" : "");
    write_file(path_in(dir, name), lab, 8 + n, gz);
    free(img);
    free(lab);
}

/* Open class cls with options given as text, the way a config file gives them: key, value,
 * ..., NULL. */
static em_dataset *open_text(const char *cls, ...) {
    em_options *o = em_options_new();
    cr_assert(o);
    va_list ap;
    va_start(ap, cls);
    for (const char *k; (k = va_arg(ap, const char *));)
        cr_assert_eq(em_options_set_text(o, k, va_arg(ap, const char *), NULL), EM_OK);
    va_end(ap);
    em_dataset *ds = em_dataset_open(cls, o);
    em_options_free(o);
    return ds;
}

/* Open a CSV file with more text options: key, value, ..., NULL. */
static em_dataset *open_csv(const char *path, ...) {
    em_options *o = em_options_new();
    cr_assert(o);
    cr_assert_eq(em_options_set_string(o, "path", path), EM_OK);
    va_list ap;
    va_start(ap, path);
    for (const char *k; (k = va_arg(ap, const char *));)
        cr_assert_eq(em_options_set_text(o, k, va_arg(ap, const char *), NULL), EM_OK);
    va_end(ap);
    em_dataset *ds = em_dataset_open("csv", o);
    em_options_free(o);
    return ds;
}

static em_dataset *open_mnist(const char *dir, const char *split) {
    return open_text("mnist", "path", dir, "split", split, NULL);
}

/* Read items of ds into fresh buffers (caller frees). */
static void read_items(em_dataset *ds, const int64_t *idx, int64_t n, void **in, void **tg) {
    const em_dataset_info *info = em_dataset_get_info(ds);
    size_t ib = em_dtype_size(info->input_dtype), tb = em_dtype_size(info->target_dtype);
    for (int d = 0; d < info->input_ndim; d++) ib *= (size_t)info->input_shape[d];
    for (int d = 0; d < info->target_ndim; d++) tb *= (size_t)info->target_shape[d];
    *in = malloc(ib * (size_t)n);
    *tg = malloc(tb * (size_t)n);
    cr_assert_eq(em_dataset_read(ds, idx, n, *in, *tg), EM_OK, "%s", em_last_error());
}

/* ---- the registry and options ------------------------------------------------------------- */

static em_status toy_open(const em_options *o, em_dataset_info *info, void **state) {
    *info = (em_dataset_info){.struct_size = sizeof *info, .length = em_options_int(o, "n"),
                              .input_ndim = 1, .input_shape = {1}, .input_dtype = EM_F32,
                              .target_dtype = EM_I64, .num_classes = 2};
    double *s = malloc(sizeof(double));
    *s = em_options_float(o, "value") * (em_options_bool(o, "negate") ? -1 : 1);
    if (strcmp(em_options_string(o, "mode"), "b") == 0) *s += 100;
    *state = s;
    return EM_OK;
}
static em_status toy_read(void *state, const int64_t *idx, int64_t n, void *in, void *tg) {
    for (int64_t j = 0; j < n; j++) {
        ((float *)in)[j] = (float)(*(double *)state + (double)idx[j]);
        ((int64_t *)tg)[j] = idx[j] % 2;
    }
    return EM_OK;
}
static const char *const toy_modes[] = {"a", "b", NULL};
static const em_option_spec toy_opts[] = {
    {.name = "n", .types = EM_OPT_INT, .def = {.i = 4}, .has_range = true, .min = 1, .max = 100,
     .help = "items"},
    {.name = "value", .types = EM_OPT_FLOAT, .required = true, .has_range = true, .min = -1e6,
     .max = 1e6, .help = "base value"},
    {.name = "negate", .types = EM_OPT_BOOL, .def = {.b = false}},
    {.name = "mode", .types = EM_OPT_STRING, .def = {.s = "a"}, .choices = toy_modes},
};

Test(data, program_registers_a_class_with_typed_options) {
    em_dataset_class_def d = {.struct_size = sizeof d, .name = "toy", .description = "a toy",
                              .options = toy_opts, .n_options = 4, .open = toy_open,
                              .read = toy_read, .close = free};
    em_registry *prog = em_registry_program();
    cr_assert_eq(em_dataset_class_register(prog, &d), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_dataset_class_register(prog, &d), EM_ERR_EXISTS);
    cr_assert_eq(em_registry_dataset_count(prog), 1);
    cr_assert_str_eq(em_registry_dataset_name(prog, 0), "toy");
    bool listed = false;
    for (size_t i = 0; i < em_dataset_class_count(); i++)
        listed |= strcmp(em_dataset_class_name(i), "toy") == 0;
    cr_assert(listed);

    em_dataset *ds = open_text("toy", "value", "2.5", "negate", "yes", "mode", "b", "n", "7",
                               NULL);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(ds), 7);
    cr_assert_str_eq(em_dataset_name(ds), "toy");
    float in;
    int64_t tg, i3 = 3;
    cr_assert_eq(em_dataset_read(ds, &i3, 1, &in, &tg), EM_OK);
    cr_assert_float_eq(in, 100.5f, 1e-6);
    cr_assert_eq(tg, 1);
    int64_t i9 = 9;
    cr_assert_eq(em_dataset_read(ds, &i9, 1, &in, &tg), EM_ERR_RANGE);
    em_assert_error(EM_ERR_RANGE, "item index 9 is out of range (length 7)");
    em_dataset_free(ds);
    /* typed setters from C give the same dataset; an int is accepted for a float option */
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_int(o, "value", 2), EM_OK);
    cr_assert_eq(em_options_set_bool(o, "negate", true), EM_OK);
    ds = em_dataset_open("toy", o);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(ds), 4); /* the default */
    cr_assert_eq(em_dataset_read(ds, &i3, 1, &in, &tg), EM_OK);
    cr_assert_float_eq(in, 1.0f, 1e-6); /* -2 + 3 */
    em_dataset_free(ds);
    /* the caller's bag is borrowed, not changed: still two entries, no defaults added */
    cr_assert_eq(em_options_count(o), 2);
    /* a wrong type from C */
    cr_assert_eq(em_options_set_string(o, "n", "seven"), EM_OK);
    cr_assert_null(em_dataset_open("toy", o));
    em_assert_error(EM_ERR_INVALID, "dataset 'toy': option 'n' = 'seven': wrong type; expected "
                    "an int in [1, 100] (items)");
    em_options_free(o);

#define BAD(needle, ...)                                                                       \
    do {                                                                                       \
        cr_assert_null(open_text("toy", __VA_ARGS__, NULL));                                   \
        em_assert_error(EM_ERR_INVALID, needle);                                               \
    } while (0)
    BAD("dataset 'toy': option 'value' is required: a number in [-1e+06, 1e+06] (base value)",
        "n", "3");
    BAD("dataset 'toy': unknown option 'valeu' (did you mean 'value'?); dataset 'toy' takes: "
        "n, value, negate, mode", "valeu", "1");
    BAD("dataset 'toy': unknown option 'colour'; dataset 'toy' takes: n, value, negate, mode",
        "colour", "red");
    BAD("dataset 'toy': option 'n' = 'x3': wrong type; expected an int in [1, 100] (items)",
        "value", "1", "n", "x3");
    BAD("dataset 'toy': option 'n' = '2.5': not an integer; expected an int in [1, 100]",
        "value", "1", "n", "2.5");
    BAD("dataset 'toy': option 'n' = 101: out of range; expected an int in [1, 100] (items)",
        "value", "1", "n", "101");
    BAD("dataset 'toy': option 'n' = 0: out of range", "value", "1", "n", "0");
    BAD("dataset 'toy': option 'value' = nan: out of range; expected a number in [-1e+06, "
        "1e+06]", "value", "nan");
    BAD("dataset 'toy': option 'negate' = 'maybe': wrong type; expected true or false",
        "value", "1", "negate", "maybe");
    BAD("dataset 'toy': option 'mode' = 'c': not one of the choices; expected one of 'a', 'b'",
        "value", "1", "mode", "c");
#undef BAD
    cr_assert_null(em_dataset_open("nope", NULL));
    em_assert_error(EM_ERR_NOTFOUND, "no dataset class named 'nope' is registered; registered: ");
    em_assert_error(EM_ERR_NOTFOUND, "EMBER_PLUGIN_PATH");
    em_assert_error(EM_ERR_NOTFOUND, "mnist");
    cr_assert_eq(em_dataset_class_unregister(prog, "toy"), EM_OK);
    cr_assert_null(em_dataset_class_find("toy"));
    /* malformed records */
    em_dataset_class_def bad = d;
    bad.name = "Bad Name";
    cr_assert_eq(em_dataset_class_register(prog, &bad), EM_ERR_INVALID);
    bad = d;
    bad.read = NULL;
    cr_assert_eq(em_dataset_class_register(prog, &bad), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "lacks an read function");
    /* malformed option tables: a duplicate, no types, defaults that fail their own checks */
    em_option_spec specs[2] = {toy_opts[0], toy_opts[0]};
    bad = d;
    bad.options = specs;
    bad.n_options = 2;
    cr_assert_eq(em_dataset_class_register(prog, &bad), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "class 'toy' declares option 'n' twice");
    bad.n_options = 1;
    specs[0].types = 0;
    cr_assert_eq(em_dataset_class_register(prog, &bad), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "class 'toy': option 0 has no name or no types");
    specs[0] = toy_opts[0];
    specs[0].def.i = 0; /* outside [1, 100] */
    cr_assert_eq(em_dataset_class_register(prog, &bad), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "the default of an option is invalid: toy: option 'n' = 0: "
                    "out of range");
    specs[0] = toy_opts[3];
    specs[0].def.s = "c"; /* not a choice */
    cr_assert_eq(em_dataset_class_register(prog, &bad), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "option 'mode' = 'c': not one of the choices");
    specs[0].def_type = EM_OPT_INT; /* a default of a type the option does not take */
    cr_assert_eq(em_dataset_class_register(prog, &bad), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "the default of option 'mode' has a type the option does "
                    "not allow");
    bad.n_options = -1;
    cr_assert_eq(em_dataset_class_register(prog, &bad), EM_ERR_INVALID);
    cr_assert_null(em_dataset_class_find("toy"));
}

Test(data, the_plugin_classes_check_their_options) {
    /* each of ember-data's classes, through the one options mechanism: unknown option with
     * a did-you-mean, wrong type, out of range, not a choice, missing */
    cr_assert_null(open_text("mnist", "pth", "/tmp", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'mnist': unknown option 'pth' (did you mean "
                    "'path'?); dataset 'mnist' takes: path, split, classes");
    cr_assert_null(open_text("mnist", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'mnist': option 'path' is required: a string");
    cr_assert_null(open_text("mnist", "path", "/tmp", "split", "tran", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'mnist': option 'split' = 'tran': not one of the "
                    "choices; expected one of 'train', 'test'");
    cr_assert_null(open_text("mnist", "path", "/tmp", "classes", "300", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'mnist': option 'classes' = 300: out of range; "
                    "expected an int in [1, 256]");
    cr_assert_null(open_text("mnist", "path", "/tmp", "classes", "ten", NULL));
    em_assert_error(EM_ERR_INVALID, "option 'classes' = 'ten': wrong type");
    cr_assert_null(open_text("cifar10", "path", "/tmp", "split", "valid", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'cifar10': option 'split' = 'valid': not one of");
    cr_assert_null(open_csv("/tmp/x.csv", "delimeter", ";", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'csv': unknown option 'delimeter' (did you mean "
                    "'delimiter'?)");
    cr_assert_null(open_csv("/tmp/x.csv", "header", "maybe", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'csv': option 'header' = 'maybe': not one of the "
                    "choices; expected one of 'auto', or true or false");
    cr_assert_null(open_csv("/tmp/x.csv", "classes", "-1", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'csv': option 'classes' = -1: out of range");
    cr_assert_null(open_csv("/tmp/x.csv", "target_columns", "[1, 2.5]", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'csv': option 'target_columns' = '[1, 2.5]'");
    cr_assert_null(open_text("synthetic", "length", "-5", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'synthetic': option 'length' = -5: out of range");
    cr_assert_null(open_text("synthetic", "shape", "[3, 0]", NULL));
    em_assert_error(EM_ERR_INVALID, "dataset 'synthetic': option 'shape' = [3, 0]: a list entry "
                    "is out of range");
    cr_assert_null(open_text("synthetic", "dtype", "float16", NULL));
    em_assert_error(EM_ERR_INVALID, "expected one of 'float32', 'uint8'");
    cr_assert_null(open_text("synthetic", "seed", "1.5", NULL));
    em_assert_error(EM_ERR_INVALID, "option 'seed' = '1.5': not an integer");
}

Test(data, the_data_plugin_registers_its_classes) {
    const char *want[] = {"mnist", "cifar10", "csv", "synthetic", "text"};
    for (int i = 0; i < 5; i++) cr_assert(em_dataset_class_find(want[i]), "%s", want[i]);
    bool found = false;
    for (size_t i = 0; i < em_plugin_count(); i++) {
        em_plugin_info p;
        cr_assert_eq(em_plugin_get(i, &p), EM_OK);
        if (p.name && strcmp(p.name, "ember-data") == 0) {
            found = true;
            cr_assert_eq(em_registry_dataset_count(p.registry), 5);
        }
    }
    cr_assert(found);
}

/* ---- MNIST IDX ---------------------------------------------------------------------------- */

static void check_idx(em_dataset *ds, uint32_t n, uint32_t h, uint32_t w) {
    cr_assert(ds, "%s", em_last_error());
    const em_dataset_info *info = em_dataset_get_info(ds);
    cr_assert_eq(info->length, n);
    cr_assert_eq(info->input_ndim, 3);
    cr_assert_eq(info->input_shape[0], 1);
    cr_assert_eq(info->input_shape[1], h);
    cr_assert_eq(info->input_shape[2], w);
    cr_assert_eq(info->input_dtype, EM_U8);
    cr_assert_eq(info->target_dtype, EM_I64);
    cr_assert_eq(info->num_classes, 10);
    int64_t idx[3] = {n - 1, 0, n / 2};
    void *in, *tg;
    read_items(ds, idx, 3, &in, &tg);
    for (int j = 0; j < 3; j++) {
        cr_assert_eq(((int64_t *)tg)[j], idx[j] % 10);
        for (size_t k = 0; k < (size_t)h * w; k++)
            cr_assert_eq(((uint8_t *)in)[j * h * w + k], (uint8_t)((idx[j] * 7 + (int64_t)k) % 256));
    }
    free(in);
    free(tg);
}

Test(data, mnist_raw_and_gzip_and_splits) {
    const char *dir = fresh_dir();
    write_idx(dir, "train", 50, 5, 6, false);
    write_idx(dir, "t10k", 20, 5, 6, true);
    em_dataset *tr = open_mnist(dir, "train"), *te = open_mnist(dir, "test");
    check_idx(tr, 50, 5, 6);
    check_idx(te, 20, 5, 6);
    em_dataset_free(tr);
    em_dataset_free(te);
    /* both raw and gzip present: the raw one wins (it is the uncompressed copy) */
    write_idx(dir, "train", 30, 5, 6, true);
    tr = open_mnist(dir, "train");
    check_idx(tr, 50, 5, 6);
    em_dataset_free(tr);
    cleanup();
}

/* A gzip file inflated whole into megabytes, the buffer handed over from the byte after the
 * header (not moved): every image at its place, the first and last bytes too. */
Test(data, mnist_gzip_of_several_mib) {
    const char *dir = fresh_dir();
    const uint32_t n = 3001, h = 28, w = 28; /* 2.35 MB of images, an odd count */
    write_idx(dir, "train", n, h, w, true);
    em_dataset *tr = open_mnist(dir, "train");
    check_idx(tr, n, h, w);
    int64_t all[3001];
    for (uint32_t i = 0; i < n; i++) all[i] = i;
    void *in, *tg;
    read_items(tr, all, n, &in, &tg);
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(((int64_t *)tg)[i], i % 10);
        for (size_t k = 0; k < (size_t)h * w; k++)
            cr_assert_eq(((uint8_t *)in)[i * h * w + k], (uint8_t)((i * 7 + k) % 256),
                         "image %u byte %zu", i, k);
    }
    free(in);
    free(tg);
    em_dataset_free(tr);
    cleanup();
}

/* Past 4 MiB (compressed and inflated together) a second thread faults in the buffers' pages
 * while the file is read and inflated (plugins/data/data.c, prefault_start): the items must
 * be the file's, every byte. Pixels from a 64-bit mix of their position, so that the gzip file
 * is about as large as the images (both buffers big enough to be faulted ahead). */
static uint8_t mixed_pixel(uint64_t at) {
    at = (at + 1) * 0x9E3779B97F4A7C15ull;
    at ^= at >> 29;
    at *= 0xBF58476D1CE4E5B9ull;
    return (uint8_t)(at >> 56);
}

Test(data, mnist_gzip_faulted_ahead) {
    const char *dir = fresh_dir();
    const uint32_t n = 7001, h = 28, w = 28; /* 5.5 MB of images, 5.5 MB gzip */
    size_t isz = 16 + (size_t)n * h * w;
    uint8_t *img = malloc(isz), *lab = malloc(8 + n);
    cr_assert(img && lab);
    put32(img, 0x803);
    put32(img + 4, n);
    put32(img + 8, h);
    put32(img + 12, w);
    for (size_t k = 16; k < isz; k++) img[k] = mixed_pixel(k);
    put32(lab, 0x801);
    put32(lab + 4, n);
    for (uint32_t i = 0; i < n; i++) lab[8 + i] = (uint8_t)(i % 10);
    write_file(path_in(dir, "train-images-idx3-ubyte.gz"), img, isz, true);
    write_file(path_in(dir, "train-labels-idx1-ubyte.gz"), lab, 8 + n, true);
    struct stat sb;
    cr_assert_eq(stat(path_in(dir, "train-images-idx3-ubyte.gz"), &sb), 0);
    cr_assert_gt(sb.st_size, 4 << 20, "the gzip file is only %lld bytes", (long long)sb.st_size);
    em_dataset *tr = open_mnist(dir, "train");
    cr_assert(tr, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(tr), n);
    int64_t *all = malloc(sizeof *all * n);
    cr_assert(all);
    for (uint32_t i = 0; i < n; i++) all[i] = n - 1 - i; /* last to first */
    void *in, *tg;
    read_items(tr, all, n, &in, &tg);
    for (uint32_t j = 0; j < n; j++) {
        uint32_t i = n - 1 - j;
        cr_assert_eq(((int64_t *)tg)[j], i % 10);
        cr_assert(memcmp((uint8_t *)in + (size_t)j * h * w, img + 16 + (size_t)i * h * w,
                         (size_t)h * w) == 0, "image %u differs from the file's", i);
    }
    free(in);
    free(tg);
    free(all);
    free(img);
    free(lab);
    em_dataset_free(tr);
    cleanup();
}

/* data as a gzip file of two members (the first `split` bytes, then the rest), which the data
 * plugin reads through zlib's stream, not inflated whole at open. */
static void write_gz_two_members(const char *path, const uint8_t *data, size_t n, size_t split) {
    gzFile f = gzopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(gzwrite(f, data, (unsigned)split), (int)split);
    cr_assert_eq(gzclose(f), Z_OK);
    cr_assert(f = gzopen(path, "ab")); /* append: a second member */
    cr_assert_eq(gzwrite(f, data + split, (unsigned)(n - split)), (int)(n - split));
    cr_assert_eq(gzclose(f), Z_OK);
}

/* The file's bytes (caller frees). */
static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    static uint8_t tmp[1 << 16];
    *n = fread(tmp, 1, sizeof tmp, f);
    fclose(f);
    cr_assert_lt(*n, sizeof tmp);
    uint8_t *b = malloc(*n);
    cr_assert(b);
    memcpy(b, tmp, *n);
    return b;
}

/* A gzip file of one member is inflated whole at open (libdeflate); several members, bytes
 * after the member or a damaged trailer go through zlib's stream. The items and every error
 * message must be the same either way: the stream (the reader before the whole-file path) is
 * the reference. */
Test(data, mnist_gzip_whole_and_streamed) {
    const char *dir = fresh_dir();
    write_idx(dir, "train", 40, 5, 6, true); /* the labels, and a one-member images file */
    char ip[512]; /* path_in's buffers are reused */
    snprintf(ip, sizeof ip, "%s", path_in(dir, "train-images-idx3-ubyte.gz"));
    size_t isz;
    uint8_t *img = idx_images(40, 5, 6, &isz);
    em_dataset *ds = open_mnist(dir, "train");
    check_idx(ds, 40, 5, 6);
    em_dataset_free(ds);
    /* two members, the split inside the header and inside the pixels */
    size_t splits[2] = {7, 500};
    for (int i = 0; i < 2; i++) {
        write_gz_two_members(ip, img, isz, splits[i]);
        ds = open_mnist(dir, "train");
        check_idx(ds, 40, 5, 6);
        em_dataset_free(ds);
    }
    /* the member followed by other bytes (zlib's stream ends at the member) */
    write_file(ip, img, isz, true);
    size_t gn;
    uint8_t *gz = slurp(ip, &gn), *longer = calloc(gn + 7, 1);
    memcpy(longer, gz, gn);
    write_file(ip, longer, gn + 7, false);
    ds = open_mnist(dir, "train");
    check_idx(ds, 40, 5, 6);
    em_dataset_free(ds);

    /* a header claiming more or fewer items than the pixels hold: the same message from a file
     * inflated whole and from the stream */
    uint32_t claims[2] = {41, 39};
    for (int c = 0; c < 2; c++) {
        write_idx(dir, "train", claims[c], 5, 6, true); /* labels for as many items */
        put32(img + 4, claims[c]);
        char whole[1024], streamed[1024];
        write_file(ip, img, isz, true);
        cr_assert_null(open_mnist(dir, "train"));
        cr_assert_eq(em_last_status(), EM_ERR_FORMAT);
        snprintf(whole, sizeof whole, "%s", em_last_error());
        write_gz_two_members(ip, img, isz, 300);
        cr_assert_null(open_mnist(dir, "train"));
        cr_assert_eq(em_last_status(), EM_ERR_FORMAT);
        snprintf(streamed, sizeof streamed, "%s", em_last_error());
        cr_assert_str_eq(whole, streamed);
        cr_assert(strstr(whole, ip), "%s", whole);
        cr_assert(strstr(whole, c == 0 ? "truncated: 41 images of 5 x 6 needs 30 more bytes"
                                       : "unexpected bytes after the 1186"), "%s", whole);
    }
    write_idx(dir, "train", 40, 5, 6, true);
    put32(img + 4, 40);

    /* a damaged trailer: the checksum, the length (one more, and past DEFLATE's 1032:1) */
    for (int d = 0; d < 3; d++) {
        uint8_t *bad = malloc(gn);
        memcpy(bad, gz, gn);
        if (d == 0) bad[gn - 8] ^= 1;          /* CRC-32 */
        else if (d == 1) bad[gn - 4] += 1;     /* ISIZE + 1 */
        else bad[gn - 1] = 0xff;               /* ISIZE about 4 GiB */
        write_file(ip, bad, gn, false);
        cr_assert_null(open_mnist(dir, "train"));
        /* zlib's stream fails the check in its first read: a corrupt file, not an I/O error */
        cr_assert_eq(em_last_status(), EM_ERR_FORMAT, "%s", em_last_error());
        cr_assert(strstr(em_last_error(), ip), "%s", em_last_error());
        cr_assert(strstr(em_last_error(), d == 0 ? "corrupt gzip file: CRC-32 mismatch"
                                                 : "corrupt gzip file: length mismatch"),
                  "%s", em_last_error());
        free(bad);
    }
    free(longer);
    free(gz);
    free(img);
    cleanup();
}

/* A damaged gzip file is reported as corrupt, naming the file and the check that failed,
 * never as an I/O error; an operating-system read error stays EM_ERR_IO. Each damaged file is
 * made here from a good one (zlib's gzip of an IDX images file): the trailer's CRC-32 or
 * length, the file cut inside the compressed data or inside the trailer, a header whose
 * compression method is not deflate, a deflate block of the reserved type. */
Test(data, gzip_corrupt_is_not_an_io_error) {
    const char *dir = fresh_dir();
    write_idx(dir, "train", 40, 5, 6, true);
    char ip[512];
    snprintf(ip, sizeof ip, "%s", path_in(dir, "train-images-idx3-ubyte.gz"));
    size_t gn;
    uint8_t *gz = slurp(ip, &gn);
    cr_assert(gn > 30 && gz[0] == 0x1f && gz[1] == 0x8b && gz[2] == 8, "zlib's gzip: %zu bytes", gn);
    uint8_t *bad = malloc(gn);
    static const struct {
        const char *what, *expect;
    } cases[] = {
        {"CRC-32 changed", "corrupt gzip file: CRC-32 mismatch"},
        {"ISIZE changed", "corrupt gzip file: length mismatch"},
        {"cut inside the compressed data", "corrupt gzip file: truncated: the compressed data ends"},
        {"cut inside the trailer", "corrupt gzip file: truncated: the compressed data ends"},
        {"compression method 7", "corrupt gzip file: not gzip: it starts with the gzip magic"},
        {"a reserved block type", "corrupt gzip file: the compressed data is damaged"},
    };
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        memcpy(bad, gz, gn);
        size_t n = gn;
        switch (c) {
        case 0: bad[gn - 8] ^= 0x10; break;
        case 1: bad[gn - 3] ^= 1; break;
        case 2: n = gn / 2; break;
        case 3: n = gn - 3; break;
        case 4: bad[2] = 7; break;
        case 5: bad[10] |= 6; break; /* the first block's BTYPE (bits 1-2) = 11 */
        }
        write_file(ip, bad, n, false);
        cr_assert_null(open_mnist(dir, "train"), "%s: opened", cases[c].what);
        cr_assert_eq(em_last_status(), EM_ERR_FORMAT, "%s: %s", cases[c].what, em_last_error());
        cr_assert(strstr(em_last_error(), ip), "%s: the file is not named: %s", cases[c].what,
                  em_last_error());
        cr_assert(strstr(em_last_error(), cases[c].expect), "%s: %s", cases[c].what,
                  em_last_error());
        cr_assert_null(strstr(em_last_error(), "read error"), "%s: %s", cases[c].what,
                       em_last_error());
    }
    /* the good file still opens */
    write_file(ip, gz, gn, false);
    em_dataset *ds = open_mnist(dir, "train");
    check_idx(ds, 40, 5, 6);
    em_dataset_free(ds);
    /* An operating-system read error: /proc/self/mem is a regular file whose read at offset 0
     * (an unmapped address) fails with EIO. The plain name wins over the .gz one. */
    char mp[512];
    snprintf(mp, sizeof mp, "%s", path_in(dir, "train-images-idx3-ubyte"));
    cr_assert_eq(symlink("/proc/self/mem", mp), 0, "symlink: %s", strerror(errno));
    cr_assert_null(open_mnist(dir, "train"));
    cr_assert_eq(em_last_status(), EM_ERR_IO, "%s", em_last_error());
    cr_assert(strstr(em_last_error(), mp), "%s", em_last_error());
    cr_assert_null(strstr(em_last_error(), "corrupt"), "%s", em_last_error());
    free(bad);
    free(gz);
    cleanup();
}

Test(data, bundled_digits) {
    em_dataset *tr = open_mnist(EM_TEST_SRCDIR "/data/digits", "train");
    em_dataset *te = open_mnist(EM_TEST_SRCDIR "/data/digits", "test");
    cr_assert(tr && te, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(tr), 1500);
    cr_assert_eq(em_dataset_length(te), 297);
    cr_assert_eq(em_dataset_get_info(tr)->input_shape[1], 8);
    /* the first two rows of scikit-learn's digits.csv, scaled by 255/16 */
    static const int row0[8] = {0, 0, 5, 13, 9, 1, 0, 0}, row1[8] = {0, 0, 0, 12, 13, 5, 0, 0};
    int64_t idx[2] = {0, 1};
    void *in, *tg;
    read_items(tr, idx, 2, &in, &tg);
    for (int k = 0; k < 8; k++) {
        cr_assert_eq(((uint8_t *)in)[k], (int)floor(row0[k] * 255.0 / 16 + 0.5));
        cr_assert_eq(((uint8_t *)in)[64 + k], (int)floor(row1[k] * 255.0 / 16 + 0.5));
    }
    cr_assert_eq(((int64_t *)tg)[0], 0);
    cr_assert_eq(((int64_t *)tg)[1], 1);
    free(in);
    free(tg);
    int64_t counts[10] = {0}, all[297];
    for (int i = 0; i < 297; i++) all[i] = i;
    read_items(te, all, 297, &in, &tg);
    for (int i = 0; i < 297; i++) counts[((int64_t *)tg)[i]]++;
    for (int c = 0; c < 10; c++) cr_assert_gt(counts[c], 20, "class %d in the test split", c);
    free(in);
    free(tg);
    em_dataset_free(tr);
    em_dataset_free(te);
}

Test(data, mnist_bad_input) {
    const char *dir = fresh_dir();
    /* missing directory, missing files */
    cr_assert_null(open_mnist("/nonexistent/ember", "train"));
    em_assert_error(EM_ERR_IO, "cannot open directory /nonexistent/ember");
    cr_assert_null(open_mnist(dir, "train"));
    em_assert_error(EM_ERR_IO, "no train-images* file in");
    cr_assert_null(open_mnist(dir, "validation"));
    em_assert_error(EM_ERR_INVALID, "dataset 'mnist': option 'split' = 'validation': not one of "
                    "the choices; expected one of 'train', 'test'");

    uint8_t img[16 + 4 * 4], lab[8 + 4];
    put32(img, 0x803), put32(img + 4, 4), put32(img + 8, 2), put32(img + 12, 2);
    memset(img + 16, 9, 16);
    put32(lab, 0x801), put32(lab + 4, 4);
    memset(lab + 8, 3, 4);
    char ip[512], lp[512];
    snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte", dir);
    snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte", dir);
    write_file(ip, img, sizeof img, false);
    write_file(lp, lab, sizeof lab, false);
    em_dataset *ok = open_mnist(dir, "train");
    cr_assert(ok, "%s", em_last_error());
    em_dataset_free(ok);

    /* wrong magic */
    uint8_t bad[sizeof img];
    memcpy(bad, img, sizeof img);
    put32(bad, 0x801);
    write_file(ip, bad, sizeof bad, false);
    cr_assert_null(open_mnist(dir, "train"));
    em_assert_error(EM_ERR_FORMAT, "train-images-idx3-ubyte: bad magic number 0x00000801, "
                    "expected 0x00000803");
    /* truncated data, raw and gzip */
    write_file(ip, img, sizeof img - 3, false);
    cr_assert_null(open_mnist(dir, "train"));
    em_assert_error(EM_ERR_FORMAT, "truncated: 4 images of 2 x 2 needs 3 more bytes");
    unlink(ip);
    write_file(path_in(dir, "train-images-idx3-ubyte.gz"), img, sizeof img - 5, true);
    cr_assert_null(open_mnist(dir, "train"));
    em_assert_error(EM_ERR_FORMAT, "train-images-idx3-ubyte.gz: truncated");
    /* a gzip file cut short (damaged compressed stream) */
    {
        gzFile f = gzopen(path_in(dir, "whole.gz"), "wb");
        static uint8_t big[16 + 4 * 4];
        memcpy(big, img, sizeof big);
        gzwrite(f, big, sizeof big);
        gzclose(f);
        FILE *src = fopen(path_in(dir, "whole.gz"), "rb");
        uint8_t buf[256];
        size_t n = fread(buf, 1, sizeof buf, src);
        fclose(src);
        write_file(path_in(dir, "train-images-idx3-ubyte.gz"), buf, n - 12, false);
        cr_assert_null(open_mnist(dir, "train"));
        cr_assert_eq(em_last_status(), EM_ERR_FORMAT, "%s", em_last_error());
        cr_assert(strstr(em_last_error(), "train-images-idx3-ubyte.gz"), "%s", em_last_error());
        unlink(path_in(dir, "train-images-idx3-ubyte.gz"));
        unlink(path_in(dir, "whole.gz"));
    }
    /* trailing bytes */
    uint8_t longer[sizeof img + 2] = {0};
    memcpy(longer, img, sizeof img);
    write_file(ip, longer, sizeof longer, false);
    cr_assert_null(open_mnist(dir, "train"));
    em_assert_error(EM_ERR_FORMAT, "unexpected bytes after the 32");
    /* image/label count mismatch */
    write_file(ip, img, sizeof img, false);
    uint8_t lab3[8 + 3];
    put32(lab3, 0x801), put32(lab3 + 4, 3);
    memset(lab3 + 8, 1, 3);
    write_file(lp, lab3, sizeof lab3, false);
    cr_assert_null(open_mnist(dir, "train"));
    em_assert_error(EM_ERR_FORMAT, "image/label count mismatch");
    em_assert_error(EM_ERR_FORMAT, "holds 4 images but");
    em_assert_error(EM_ERR_FORMAT, "holds 3 labels");
    /* label out of range */
    lab[8 + 2] = 10;
    write_file(lp, lab, sizeof lab, false);
    cr_assert_null(open_mnist(dir, "train"));
    em_assert_error(EM_ERR_FORMAT, "train-labels-idx1-ubyte: item 2 has label 10, outside [0, 10)");
    em_dataset *more = open_text("mnist", "path", dir, "classes", "11", NULL);
    cr_assert(more, "%s", em_last_error());
    em_dataset_free(more);
    cleanup();
}

/* ---- CIFAR-10 ----------------------------------------------------------------------------- */

static void write_cifar(const char *path, int n, int first, bool gz, int bad_label_at) {
    uint8_t *b = malloc((size_t)n * 3073);
    for (int r = 0; r < n; r++) {
        b[r * 3073] = (uint8_t)(r == bad_label_at ? 10 : (first + r) % 10);
        for (int k = 0; k < 3072; k++) b[r * 3073 + 1 + k] = (uint8_t)((first + r) * 3 + k);
    }
    write_file(path, b, (size_t)n * 3073, gz);
    free(b);
}

Test(data, cifar10_batches) {
    const char *dir = fresh_dir();
    write_cifar(path_in(dir, "data_batch_1.bin"), 3, 0, false, -1);
    write_cifar(path_in(dir, "data_batch_2.bin"), 4, 3, true, -1);
    write_cifar(path_in(dir, "test_batch.bin"), 2, 100, false, -1);
    em_dataset *tr = open_text("cifar10", "path", dir, NULL);
    cr_assert(tr, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(tr), 7);
    const em_dataset_info *info = em_dataset_get_info(tr);
    cr_assert_eq(info->input_shape[0], 3);
    cr_assert_eq(info->input_shape[1], 32);
    int64_t idx[2] = {6, 2};
    void *in, *tg;
    read_items(tr, idx, 2, &in, &tg);
    for (int j = 0; j < 2; j++) {
        cr_assert_eq(((int64_t *)tg)[j], idx[j] % 10);
        for (int k = 0; k < 3072; k++)
            cr_assert_eq(((uint8_t *)in)[j * 3072 + k], (uint8_t)(idx[j] * 3 + k));
    }
    free(in);
    free(tg);
    em_dataset_free(tr);
    em_dataset *te = open_text("cifar10", "path", dir, "split", "test", NULL);
    cr_assert(te, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(te), 2);
    em_dataset_free(te);
    /* truncated record, bad label */
    FILE *f = fopen(path_in(dir, "data_batch_2.bin"), "wb");
    uint8_t junk[3073 + 100] = {1};
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    cr_assert_null(open_text("cifar10", "path", dir, NULL));
    em_assert_error(EM_ERR_FORMAT, "data_batch_2.bin: truncated: record 1 has 100 of its 3073 bytes");
    write_cifar(path_in(dir, "data_batch_2.bin"), 4, 3, false, 2);
    cr_assert_null(open_text("cifar10", "path", dir, NULL));
    em_assert_error(EM_ERR_FORMAT, "data_batch_2.bin: record 2 (item 5) has label 10, outside [0, 10)");
    cleanup();
    cr_assert_null(open_text("cifar10", "path", dir, NULL));
    em_assert_error(EM_ERR_IO, "cannot open directory");
}

/* ---- CSV ---------------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text) {
    write_file(path, text, strlen(text), false);
}

Test(data, csv_labels_header_delimiters_quotes) {
    const char *dir = fresh_dir();
    const char *p = path_in(dir, "a.csv");
    write_text(p, "x1,x2,\"class\"\n1.5,-2,0\n\n3,\"4e1\",2\n  5 ,6,1\n");
    em_dataset *ds = open_csv(p, NULL);
    cr_assert(ds, "%s", em_last_error());
    const em_dataset_info *info = em_dataset_get_info(ds);
    cr_assert_eq(info->length, 3);
    cr_assert_eq(info->input_shape[0], 2);
    cr_assert_eq(info->num_classes, 3);
    int64_t idx[3] = {0, 1, 2};
    void *in, *tg;
    read_items(ds, idx, 3, &in, &tg);
    const float want[6] = {1.5f, -2, 3, 40, 5, 6};
    for (int k = 0; k < 6; k++) cr_assert_float_eq(((float *)in)[k], want[k], 1e-6);
    cr_assert_eq(((int64_t *)tg)[1], 2);
    free(in);
    free(tg);
    em_dataset_free(ds);
    /* semicolons, no header, label first, explicit classes */
    write_text(p, "1;0.5;0.25\n0;1;2\n");
    ds = open_csv(p, "delimiter", ";", "label_column", "0", "header", "false", "classes", "4",
                  NULL);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_get_info(ds)->num_classes, 4);
    read_items(ds, idx, 2, &in, &tg);
    cr_assert_float_eq(((float *)in)[1], 0.25f, 1e-7);
    cr_assert_eq(((int64_t *)tg)[0], 1);
    free(in);
    free(tg);
    em_dataset_free(ds);
    /* tabs, regression targets (as text "3,1" and as a list [3, 1]) */
    for (int i = 0; i < 2; i++) {
        write_text(p, "a\tb\tc\td\n1\t2\t3\t4\n5\t6\t7\t8\n");
        ds = open_csv(p, "delimiter", "tab", "target_columns", i ? "[3, 1]" : "3,1", NULL);
        cr_assert(ds, "%s", em_last_error());
        info = em_dataset_get_info(ds);
        cr_assert_eq(info->target_dtype, EM_F32);
        cr_assert_eq(info->target_shape[0], 2);
        cr_assert_eq(info->input_shape[0], 2);
        read_items(ds, idx, 2, &in, &tg);
        cr_assert_float_eq(((float *)in)[2], 5.0f, 0);
        cr_assert_float_eq(((float *)in)[3], 7.0f, 0);
        cr_assert_float_eq(((float *)tg)[2], 8.0f, 0);
        cr_assert_float_eq(((float *)tg)[3], 6.0f, 0);
        free(in);
        free(tg);
        em_dataset_free(ds);
    }
    cleanup();
}

Test(data, csv_bad_input) {
    const char *dir = fresh_dir();
    const char *p = path_in(dir, "bad.csv");
    cr_assert_null(open_csv(path_in(dir, "missing.csv"), NULL));
    em_assert_error(EM_ERR_IO, "missing.csv: No such file");
    write_text(p, "f1,f2,label\n1,2,0\n3,4\n");
    cr_assert_null(open_csv(p, NULL));
    em_assert_error(EM_ERR_FORMAT, "bad.csv line 3: 2 fields, expected 3 (as in line 1)");
    write_text(p, "1,2,0\n3,4,1\n5,abc,1\n");
    cr_assert_null(open_csv(p, NULL));
    em_assert_error(EM_ERR_FORMAT, "bad.csv line 3, column 2: 'abc' is not a number");
    write_text(p, "1,2,0\n3,,1\n");
    cr_assert_null(open_csv(p, NULL));
    em_assert_error(EM_ERR_FORMAT, "bad.csv line 2, column 2: '' is not a number");
    write_text(p, "1,2,0.5\n");
    cr_assert_null(open_csv(p, NULL));
    em_assert_error(EM_ERR_FORMAT, "bad.csv line 1 (item 0), column 3: label 0.5 is not a "
                    "non-negative integer");
    write_text(p, "h1,h2,h3\n1,2,0\n3,4,7\n");
    cr_assert_null(open_csv(p, "classes", "5", NULL));
    em_assert_error(EM_ERR_FORMAT, "bad.csv line 3 (item 1), column 3: label 7 is outside [0, 5)");
    write_text(p, "1,2,\"0\n");
    cr_assert_null(open_csv(p, NULL));
    em_assert_error(EM_ERR_FORMAT, "bad.csv line 1");
    write_text(p, "x,y\n");
    cr_assert_null(open_csv(p, NULL));
    em_assert_error(EM_ERR_FORMAT, "holds no data rows");
    write_text(p, "1,2\n");
    cr_assert_null(open_csv(p, "delimiter", "::", NULL));
    em_assert_error(EM_ERR_INVALID, "option 'delimiter' = '::' must be one character");
    cr_assert_null(open_csv(p, "label_column", "5", NULL));
    em_assert_error(EM_ERR_INVALID, "label_column 5 is outside the 2 columns");
    cleanup();
}

/* ---- inputs that are not files, memory before validation, silent misreads (issue 13) --- */

/* A FIFO (no writer) as a dataset file blocked in open() forever; /dev/zero as a CSV was read
 * until memory ran out. Every reader refuses anything but a regular file, naming it.
 * .timeout: a regression hangs instead of failing. */
Test(data, inputs_that_are_not_regular_files, .timeout = 30) {
    const char *dir = fresh_dir();
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/pipe.csv", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_null(open_csv(fifo, NULL));
    em_assert_error(EM_ERR_IO, "pipe.csv is a FIFO (named pipe), not a regular file");
    cr_assert_null(open_csv("/dev/zero", NULL));
    em_assert_error(EM_ERR_IO, "csv: /dev/zero is a character device, not a regular file");
    cr_assert_null(open_csv(dir, NULL));
    em_assert_error(EM_ERR_IO, "is a directory");
    cr_assert_null(open_mnist("/dev/zero", "train"));
    em_assert_error(EM_ERR_IO, "cannot open directory /dev/zero");
    /* a FIFO where an IDX file or a CIFAR batch should be */
    write_idx(dir, "train", 2, 2, 2, false);
    unlink(path_in(dir, "train-images-idx3-ubyte"));
    cr_assert_eq(mkfifo(path_in(dir, "train-images-idx3-ubyte"), 0600), 0);
    cr_assert_null(open_mnist(dir, "train"));
    em_assert_error(EM_ERR_IO, "train-images-idx3-ubyte is a FIFO");
    cr_assert_eq(mkfifo(path_in(dir, "data_batch_1.bin"), 0600), 0);
    cr_assert_null(open_text("cifar10", "path", dir, NULL));
    em_assert_error(EM_ERR_IO, "data_batch_1.bin is a FIFO");
    cleanup();
}

/* Cap the address space at what the process uses now plus `extra` bytes: an allocation the
 * input does not justify then fails instead of succeeding on an overcommitting machine. */
static struct rlimit saved_as;
static void limit_address_space(size_t extra) {
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert(f);
    unsigned long pages = 0;
    cr_assert_eq(fscanf(f, "%lu", &pages), 1);
    fclose(f);
    cr_assert_eq(getrlimit(RLIMIT_AS, &saved_as), 0);
    struct rlimit r = saved_as;
    r.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + extra;
    cr_assert_eq(setrlimit(RLIMIT_AS, &r), 0);
}
static void unlimit_address_space(void) { cr_assert_eq(setrlimit(RLIMIT_AS, &saved_as), 0); }

/* Memory is committed only after the input justifies it. An IDX header (16 bytes) claiming
 * 2^20 images of 256 x 256 (64 GiB) was allocated before the file was found to hold 10 bytes.
 * With the address space capped at 512 MiB more than in use, that allocation failed as
 * EM_ERR_NOMEM; now memory grows with what the file (raw or gzip) delivers and the file is
 * reported truncated. */
Test(data, idx_header_claims_are_not_allocated) {
    const char *dir = fresh_dir();
    uint8_t img[16 + 10] = {0}, lab[8 + 4] = {0};
    put32(img, 0x803), put32(img + 4, 1u << 20), put32(img + 8, 256), put32(img + 12, 256);
    put32(lab, 0x801), put32(lab + 4, 1u << 20);
    for (int gz = 0; gz < 2; gz++) {
        write_file(path_in(dir, gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte"),
                   img, sizeof img, gz);
        write_file(path_in(dir, gz ? "train-labels-idx1-ubyte.gz" : "train-labels-idx1-ubyte"),
                   lab, sizeof lab, gz);
        if (gz) {
            unlink(path_in(dir, "train-images-idx3-ubyte"));
            unlink(path_in(dir, "train-labels-idx1-ubyte"));
        }
        limit_address_space((size_t)512 << 20);
        em_dataset *ds = open_mnist(dir, "train");
        unlimit_address_space();
        cr_assert_null(ds);
        em_assert_error(EM_ERR_FORMAT, "truncated: 1048576 images of 256 x 256 needs");
    }
    cleanup();
}

/* A CSV whose first row has 2^19 fields (1 MiB of text) reserved 1,024 rows of them (4 GiB)
 * up front; with the address space capped as above that failed as EM_ERR_NOMEM. Rows are now
 * stored as they are read. */
Test(data, csv_rows_are_not_reserved_ahead) {
    const char *dir = fresh_dir();
    size_t row = (size_t)1 << 19;
    char *text = malloc(2 * row + 1);
    for (size_t i = 0; i < row; i++) text[2 * i] = '1', text[2 * i + 1] = ',';
    text[2 * row - 1] = '\n';
    text[2 * row] = '\0';
    write_text(path_in(dir, "wide.csv"), text);
    free(text);
    limit_address_space((size_t)512 << 20);
    em_dataset *ds = open_csv(path_in(dir, "wide.csv"), "header", "false", NULL);
    unlimit_address_space();
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(ds), 1);
    cr_assert_eq(em_dataset_get_info(ds)->input_shape[0], (int64_t)row - 1);
    em_dataset_free(ds);
    cleanup();
}

/* CIFAR directories with more than 64 batch files dropped the rest (which ones depended on
 * the directory order). Now every one is read, in natural order (data_batch_2 before
 * data_batch_10). */
Test(data, cifar10_more_than_64_batches) {
    const char *dir = fresh_dir();
    char name[64];
    for (int i = 1; i <= 70; i++) {
        snprintf(name, sizeof name, "data_batch_%d.bin", i);
        write_cifar(path_in(dir, name), 1, i - 1, i % 2 == 0, -1);
    }
    em_dataset *ds = open_text("cifar10", "path", dir, NULL);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(ds), 70);
    int64_t idx[3] = {1, 9, 69}; /* data_batch_2, _10, _70 */
    void *in, *tg;
    read_items(ds, idx, 3, &in, &tg);
    for (int j = 0; j < 3; j++) {
        cr_assert_eq(((int64_t *)tg)[j], idx[j] % 10);
        cr_assert_eq(((uint8_t *)in)[j * 3072 + 5], (uint8_t)(idx[j] * 3 + 5));
    }
    free(in);
    free(tg);
    em_dataset_free(ds);
    cleanup();
}

/* An empty dataset opened with 0 items, and a run on it trained nothing and exited 0. */
Test(data, an_empty_dataset_is_an_error) {
    const char *dir = fresh_dir();
    write_file(path_in(dir, "test_batch.bin"), "", 0, false);
    cr_assert_null(open_text("cifar10", "path", dir, "split", "test", NULL));
    em_assert_error(EM_ERR_FORMAT, "dataset 'cifar10' (path '");
    em_assert_error(EM_ERR_FORMAT, "') holds no items");
    write_idx(dir, "t10k", 0, 2, 2, true);
    cr_assert_null(open_mnist(dir, "test"));
    em_assert_error(EM_ERR_FORMAT, "dataset 'mnist' (path '");
    em_assert_error(EM_ERR_FORMAT, dir);
    cleanup();
}

/* A CSV field "1<NUL>garbage" parsed as 1 (strtod stops at the NUL). */
Test(data, csv_nul_in_a_field) {
    const char *dir = fresh_dir();
    const char *p = path_in(dir, "nul.csv");
    static const char nul[] = "1,2,0\n1\0garbage,2,0\n";
    write_file(p, nul, sizeof nul - 1, false);
    cr_assert_null(open_csv(p, NULL));
    em_assert_error(EM_ERR_FORMAT, "nul.csv line 2, column 1: '1?garbage' is not a number (it "
                    "holds a NUL byte");
    cleanup();
}

/* A UTF-8 byte-order mark made the first row of numbers a "header" and dropped it. */
Test(data, csv_byte_order_mark) {
    const char *dir = fresh_dir();
    const char *p = path_in(dir, "bom.csv");
    write_text(p, "\xEF\xBB\xBF" "1.5,2,0\n3,4,1\n");
    em_dataset *ds = open_csv(p, NULL);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(ds), 2);
    int64_t first = 0;
    void *in, *tg;
    read_items(ds, &first, 1, &in, &tg);
    cr_assert_float_eq(((float *)in)[0], 1.5f, 0);
    free(in);
    free(tg);
    em_dataset_free(ds);
    write_text(p, "\xEF\xBB\xBF" "x,y,label\n3,4,1\n"); /* before a header: still a header */
    ds = open_csv(p, NULL);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(ds), 1);
    em_dataset_free(ds);
    cleanup();
}

/* ---- synthetic ---------------------------------------------------------------------------- */

Test(data, synthetic_is_a_function_of_seed_and_item) {
    em_dataset *ds = open_text("synthetic", "length", "100", "shape", "2x3", "classes", "5",
                               "seed", "9", NULL);
    cr_assert(ds, "%s", em_last_error());
    int64_t idx[2] = {42, 7};
    void *in, *tg;
    read_items(ds, idx, 2, &in, &tg);
    for (int j = 0; j < 2; j++) {
        for (int e = 0; e < 6; e++)
            cr_assert_eq(((float *)in)[j * 6 + e], em_philox_uniform_f32(9, (uint64_t)idx[j] * 2, e));
        uint32_t w[4];
        em_philox_block(~(uint64_t)9, (uint64_t)idx[j], w);
        cr_assert_eq(((int64_t *)tg)[j], (int64_t)(((uint64_t)w[0] * 5) >> 32));
    }
    free(in);
    free(tg);
    em_dataset_free(ds);
    cr_assert_null(open_text("synthetic", "shape", "3x0", NULL));
    em_assert_error(EM_ERR_INVALID, "option 'shape' = '3x0'");
    /* the shape as a list (a config file's [2, 3]) or set from C is the same dataset */
    em_options *o = em_options_new();
    cr_assert_eq(em_options_set_ints(o, "shape", 2, (const int64_t[]){2, 3}), EM_OK);
    cr_assert_eq(em_options_set_int(o, "seed", 9), EM_OK);
    cr_assert_eq(em_options_set_int(o, "classes", 5), EM_OK);
    em_dataset *a = em_dataset_open("synthetic", o);
    em_options_free(o);
    em_dataset *b = open_text("synthetic", "shape", "[2, 3]", "seed", "9", "classes", "5", NULL);
    cr_assert(a && b, "%s", em_last_error());
    cr_assert_eq(em_dataset_length(a), 1024); /* the default */
    cr_assert_eq(em_dataset_get_info(b)->input_ndim, 2);
    cr_assert_eq(em_dataset_get_info(b)->input_shape[1], 3);
    void *ia, *ta, *ib, *tb;
    read_items(a, idx, 2, &ia, &ta);
    read_items(b, idx, 2, &ib, &tb);
    cr_assert_arr_eq(ia, ib, 12 * sizeof(float));
    cr_assert_arr_eq(ta, tb, 2 * sizeof(int64_t));
    free(ia), free(ta), free(ib), free(tb);
    em_dataset_free(a);
    em_dataset_free(b);
    /* the default shape: (1, 28, 28) */
    a = open_text("synthetic", NULL);
    cr_assert(a, "%s", em_last_error());
    cr_assert_eq(em_dataset_get_info(a)->input_ndim, 3);
    cr_assert_eq(em_dataset_get_info(a)->input_shape[2], 28);
    em_dataset_free(a);
}

/* ---- in-memory datasets, subsets, random_split -------------------------------------------- */

Test(data, tensors_subset_and_random_split) {
    em_tensor *x = em_test_tensor(EM_F64, 2, (int64_t[]){5, 2},
                                  (double[]){0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    em_tensor *y = em_test_tensor(EM_I32, 1, (int64_t[]){5}, (double[]){1, 0, 2, 1, 0});
    em_dataset *ds = em_dataset_from_tensors(x, y, 0);
    cr_assert(ds, "%s", em_last_error());
    cr_assert_eq(em_dataset_get_info(ds)->num_classes, 3);
    cr_assert_eq(em_dataset_get_info(ds)->input_dtype, EM_F64);
    int64_t idx[2] = {3, 1};
    double in[4];
    int64_t tg[2];
    cr_assert_eq(em_dataset_read(ds, idx, 2, in, tg), EM_OK);
    cr_assert_eq(in[0], 6);
    cr_assert_eq(in[3], 3);
    cr_assert_eq(tg[0], 1);
    cr_assert_eq(tg[1], 0);
    /* labels outside [0, classes) */
    cr_assert_null(em_dataset_from_tensors(x, y, 2));
    em_assert_error(EM_ERR_RANGE, "item 2 has label 2, outside [0, 2)");
    /* a transposed (non-contiguous) input is copied */
    em_tensor *xt = em_transpose(x, 0, 1);
    em_tensor *y2 = em_test_tensor(EM_I64, 1, (int64_t[]){2}, (double[]){0, 1});
    em_dataset *dt = em_dataset_from_tensors(xt, y2, 0);
    cr_assert(dt, "%s", em_last_error());
    int64_t one = 1;
    double row[5];
    int64_t lab;
    cr_assert_eq(em_dataset_read(dt, &one, 1, row, &lab), EM_OK);
    for (int k = 0; k < 5; k++) cr_assert_eq(row[k], 2 * k + 1);
    em_dataset_free(dt);
    /* shapes that do not match */
    cr_assert_null(em_dataset_from_tensors(x, y2, 0));
    em_assert_error(EM_ERR_SHAPE, "inputs [5, 2] and targets [2] must share their first dim");
    /* random_split: disjoint, covering, reproducible */
    em_dataset *parts[2], *again[2];
    cr_assert_eq(em_random_split(ds, (int64_t[]){3, 2}, 2, 77, parts), EM_OK, "%s", em_last_error());
    cr_assert_eq(em_random_split(ds, (int64_t[]){3, 2}, 2, 77, again), EM_OK);
    em_dataset_free(ds); /* the parts keep it alive */
    int seen[5] = {0};
    for (int p = 0; p < 2; p++) {
        int64_t n = em_dataset_length(parts[p]);
        cr_assert_eq(n, p ? 2 : 3);
        for (int64_t i = 0; i < n; i++) {
            double a[2], b[2];
            int64_t ta, tb;
            cr_assert_eq(em_dataset_read(parts[p], &i, 1, a, &ta), EM_OK);
            cr_assert_eq(em_dataset_read(again[p], &i, 1, b, &tb), EM_OK);
            cr_assert_eq(a[0], b[0]);
            seen[(int)a[0] / 2]++;
        }
    }
    for (int i = 0; i < 5; i++) cr_assert_eq(seen[i], 1, "item %d", i);
    cr_assert_eq(em_random_split(parts[0], (int64_t[]){1, 1}, 2, 0, again), EM_ERR_INVALID);
    em_assert_error(EM_ERR_INVALID, "the lengths add up to 2 but dataset 'subset' has 3 items");
    for (int p = 0; p < 2; p++) {
        em_dataset_free(parts[p]);
        em_dataset_free(again[p]);
    }
    em_tensor_release(xt);
    em_tensor_release(x);
    em_tensor_release(y);
    em_tensor_release(y2);
}

/* The loader over the real formats: digits through mnist with every option of a run. */
Test(data, loader_over_the_bundled_digits) {
    em_dataset *ds = open_mnist(EM_TEST_SRCDIR "/data/digits", "train");
    cr_assert(ds, "%s", em_last_error());
    em_loader_options o = {.struct_size = sizeof o, .batch_size = 128, .shuffle = true,
                           .seed = 1, .num_workers = 2, .transforms = {.to_float = true}};
    em_loader *l = em_loader_new(ds, &o);
    cr_assert(l, "%s", em_last_error());
    int64_t n = 0, nb = 0;
    em_tensor *x, *y;
    while (em_loader_next(l, &x, &y) == EM_OK && x) {
        cr_assert_eq(em_tensor_ndim(x), 4);
        cr_assert_eq(em_tensor_size(x, 1), 1);
        cr_assert_eq(em_tensor_size(x, 2), 8);
        const float *p = em_tensor_data(x);
        for (int64_t i = 0; i < em_tensor_numel(x); i++) cr_assert(p[i] >= 0 && p[i] <= 1);
        n += em_tensor_size(x, 0);
        nb++;
    }
    cr_assert_eq(em_last_status(), EM_OK, "%s", em_last_error());
    cr_assert_eq(n, 1500);
    cr_assert_eq(nb, 12);
    em_loader_free(l);
    em_dataset_free(ds);
}

/* ---- items as named fields ----------------------------------------------------------------- */

/* A callback item: input (4) uint8 = i + k, target (2) float32 = (i, -i). */
static em_status regression_item(void *user, int64_t i, void *input, void *target) {
    (void)user;
    for (int k = 0; k < 4; k++) ((uint8_t *)input)[k] = (uint8_t)(i + k);
    ((float *)target)[0] = (float)i;
    ((float *)target)[1] = (float)-i;
    return EM_OK;
}

/* What a source's items are, as Ember 1.0 delivered them. */
typedef struct io_items {
    const char *source;
    em_dtype in_dtype;
    int in_ndim;
    int64_t in_shape[3];
    em_dtype tg_dtype;  /* EM_I64: one label in [0, classes); EM_F32: (values) */
    int64_t classes, values;
} io_items;

static size_t items_bytes(em_dtype dt, int ndim, const int64_t *shape) {
    size_t b = em_dtype_size(dt);
    for (int d = 0; d < ndim; d++) b *= (size_t)shape[d];
    return b;
}

/* ds (which this frees) has exactly the fields "input" and "target" of w; a shuffled epoch of
 * em_loader_next_v2 batches them as (B, ...) named fields holding the documented permutation's
 * items as em_dataset_read reads them, the bytes em_loader_next hands out beside. */
static void check_io_fields(em_dataset *ds, const io_items *w) {
    cr_assert(ds, "%s: %s", w->source, em_last_error());
    const int tg_ndim = w->tg_dtype == EM_I64 ? 0 : 1;
    const int64_t tg_shape[1] = {w->values};
    cr_assert_eq(em_dataset_field_count(ds), 2, "%s", w->source);
    cr_assert_eq(em_dataset_field_index(ds, "input"), 0, "%s", w->source);
    cr_assert_eq(em_dataset_field_index(ds, "target"), 1, "%s", w->source);
    const em_field *in = em_dataset_field(ds, 0), *tg = em_dataset_field(ds, 1);
    cr_assert_str_eq(in->name, "input");
    cr_assert_str_eq(tg->name, "target");
    cr_assert(!in->variable && !tg->variable, "%s", w->source);
    cr_assert_eq(in->dtype, w->in_dtype, "%s", w->source);
    cr_assert_eq(in->ndim, w->in_ndim, "%s", w->source);
    cr_assert(memcmp(in->shape, w->in_shape, sizeof(int64_t) * (size_t)w->in_ndim) == 0,
              "%s", w->source);
    cr_assert_eq(in->num_classes, 0, "%s", w->source);
    cr_assert_eq(tg->dtype, w->tg_dtype, "%s", w->source);
    cr_assert_eq(tg->ndim, tg_ndim, "%s", w->source);
    if (tg_ndim) cr_assert_eq(tg->shape[0], w->values, "%s", w->source);
    cr_assert_eq(tg->num_classes, w->classes, "%s", w->source);
    const em_dataset_info *info = em_dataset_get_info(ds); /* the 1.0 view agrees */
    cr_assert_eq(info->input_dtype, w->in_dtype, "%s", w->source);
    cr_assert_eq(info->input_ndim, w->in_ndim, "%s", w->source);
    cr_assert_eq(info->target_dtype, w->tg_dtype, "%s", w->source);
    cr_assert_eq(info->target_ndim, tg_ndim, "%s", w->source);
    cr_assert_eq(info->num_classes, w->classes, "%s", w->source);

    const int64_t N = em_dataset_length(ds), B = 16;
    const uint64_t seed = 3;
    em_loader_options_v2 o2 = {.struct_size = sizeof o2, .batch_size = B, .shuffle = true,
                               .seed = seed, .num_workers = 1};
    em_loader_options o1 = {.struct_size = sizeof o1, .batch_size = B, .shuffle = true,
                            .seed = seed, .num_workers = 1};
    em_loader *l2 = em_loader_new_v2(ds, &o2), *l1 = em_loader_new(ds, &o1);
    cr_assert(l1 && l2, "%s: %s", w->source, em_last_error());
    int64_t *perm = malloc(sizeof(int64_t) * (size_t)N);
    for (int64_t i = 0; i < N; i++) perm[i] = i;
    ref_permute(perm, N, seed, 0, 0x53485546u);
    size_t ib = items_bytes(w->in_dtype, w->in_ndim, w->in_shape);
    size_t tb = items_bytes(w->tg_dtype, tg_ndim, tg_shape);
    void *rin = malloc(ib * (size_t)B), *rtg = malloc(tb * (size_t)B);
    const em_batch *b;
    int64_t at = 0;
    while (em_loader_next_v2(l2, &b) == EM_OK && b) {
        int64_t n = N - at < B ? N - at : B;
        cr_assert_eq(em_batch_size(b), n, "%s", w->source);
        cr_assert_eq(em_batch_field_count(b), 2, "%s", w->source);
        cr_assert_str_eq(em_batch_field_name(b, 0), "input");
        cr_assert_str_eq(em_batch_field_name(b, 1), "target");
        em_tensor *bx = em_batch_field(b, "input"), *by = em_batch_field(b, "target"), *x, *y;
        cr_assert(bx && by, "%s: %s", w->source, em_last_error());
        cr_assert_eq(em_tensor_dtype(bx), w->in_dtype, "%s", w->source);
        cr_assert_eq(em_tensor_ndim(bx), w->in_ndim + 1, "%s", w->source);
        cr_assert_eq(em_tensor_size(bx, 0), n, "%s", w->source);
        for (int d = 0; d < w->in_ndim; d++)
            cr_assert_eq(em_tensor_size(bx, d + 1), w->in_shape[d], "%s dim %d", w->source, d);
        cr_assert_eq(em_tensor_dtype(by), w->tg_dtype, "%s", w->source);
        cr_assert_eq(em_tensor_ndim(by), tg_ndim + 1, "%s", w->source);
        cr_assert_eq(em_tensor_size(by, 0), n, "%s", w->source);
        if (tg_ndim) cr_assert_eq(em_tensor_size(by, 1), w->values, "%s", w->source);
        cr_assert_eq(em_dataset_read(ds, perm + at, n, rin, rtg), EM_OK, "%s", em_last_error());
        cr_assert(memcmp(em_tensor_data(bx), rin, ib * (size_t)n) == 0, "%s: batch inputs at "
                  "%lld", w->source, (long long)at);
        cr_assert(memcmp(em_tensor_data(by), rtg, tb * (size_t)n) == 0, "%s: batch targets at "
                  "%lld", w->source, (long long)at);
        cr_assert_eq(em_loader_next(l1, &x, &y), EM_OK, "%s: %s", w->source, em_last_error());
        cr_assert(x && y, "%s", w->source);
        cr_assert_eq(em_tensor_nbytes(x), ib * (size_t)n, "%s", w->source);
        cr_assert_eq(em_tensor_nbytes(y), tb * (size_t)n, "%s", w->source);
        cr_assert(memcmp(em_tensor_data(x), rin, ib * (size_t)n) == 0, "%s", w->source);
        cr_assert(memcmp(em_tensor_data(y), rtg, tb * (size_t)n) == 0, "%s", w->source);
        at += n;
    }
    cr_assert_eq(em_last_status(), EM_OK, "%s: %s", w->source, em_last_error());
    cr_assert_eq(at, N, "%s", w->source);
    em_tensor *x, *y;
    cr_assert_eq(em_loader_next(l1, &x, &y), EM_OK, "%s", em_last_error());
    cr_assert(!x && !y, "%s: the 1.0 loader ends its epoch with the other", w->source);
    free(perm);
    free(rin);
    free(rtg);
    em_loader_free(l1);
    em_loader_free(l2);
    em_dataset_free(ds);
}

/* Every source of items declares the fields "input" and "target" with the dtypes and shapes of
 * Ember 1.0: the four ember-data formats (through the named-field class record), a tensor
 * dataset and a callback dataset. */
Test(data, every_source_has_the_fields_input_and_target) {
    const char *formats[] = {"mnist", "cifar10", "csv", "synthetic"};
    for (int i = 0; i < 4; i++) {
        const em_dataset_class_def *def = em_dataset_class_find(formats[i]);
        cr_assert(def, "%s", em_last_error());
        cr_assert(def->open_fields && def->read_fields && !def->open && !def->read,
                  "%s declares its items as named fields", formats[i]);
    }
    const char *dir = fresh_dir();
    write_idx(dir, "train", 40, 5, 6, true);
    check_io_fields(open_mnist(dir, "train"),
                    &(io_items){"mnist", EM_U8, 3, {1, 5, 6}, EM_I64, 10, 0});
    write_cifar(path_in(dir, "test_batch.bin"), 7, 0, false, -1);
    check_io_fields(open_text("cifar10", "path", dir, "split", "test", NULL),
                    &(io_items){"cifar10", EM_U8, 3, {3, 32, 32}, EM_I64, 10, 0});
    const char *p = path_in(dir, "a.csv");
    write_text(p, "1,2,0\n3,4,2\n5,6,1\n7,8,0\n9,10,1\n");
    check_io_fields(open_csv(p, NULL), &(io_items){"csv labels", EM_F32, 1, {2}, EM_I64, 3, 0});
    write_text(p, "a,b,c,d\n1,2,3,4\n5,6,7,8\n9,10,11,12\n");
    check_io_fields(open_csv(p, "target_columns", "1,3", NULL),
                    &(io_items){"csv regression", EM_F32, 1, {2}, EM_F32, 0, 2});
    check_io_fields(open_text("synthetic", "length", "30", "shape", "2x3", "dtype", "uint8",
                              "classes", "5", NULL),
                    &(io_items){"synthetic", EM_U8, 2, {2, 3}, EM_I64, 5, 0});
    check_io_fields(open_text("synthetic", "length", "20", NULL),
                    &(io_items){"synthetic f32", EM_F32, 3, {1, 28, 28}, EM_I64, 10, 0});
    cleanup();

    double labels[20];
    for (int i = 0; i < 20; i++) labels[i] = i % 4;
    em_scope_begin();
    em_tensor *x = em_reshape(em_arange(0, 60, 1, EM_F32, em_cpu()), 2, (int64_t[]){20, 3});
    em_tensor *y = em_test_tensor(EM_I32, 1, (int64_t[]){20}, labels); /* stored as int64 */
    em_dataset *ds = em_dataset_from_tensors(x, y, 0);
    em_scope_end();
    check_io_fields(ds, &(io_items){"tensors", EM_F32, 1, {3}, EM_I64, 4, 0});
    em_dataset_info info = {.struct_size = sizeof info, .length = 25, .input_ndim = 1,
                            .input_shape = {4}, .input_dtype = EM_U8, .target_ndim = 1,
                            .target_shape = {2}, .target_dtype = EM_F32};
    check_io_fields(em_dataset_from_callback(&info, regression_item, NULL),
                    &(io_items){"callback", EM_U8, 1, {4}, EM_F32, 0, 2});
}
