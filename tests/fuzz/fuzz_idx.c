/*
 * fuzz_idx.c — fuzz target for the IDX (MNIST) reader of the ember-data plugin (dataset class
 * "mnist", plugins/data/idx.c, raw or gzip: zlib tells them apart by content). The input is
 *
 *     byte 0        flags: bit 0 the split (train-* / t10k-* files), bit 1 classes 256 (else
 *                   the default 10)
 *     bytes 1..2    n, little-endian: the first n bytes of the rest are the images file
 *     the rest      the images file, then the labels file
 *
 * Both files are written to a scratch directory and opened. Either the dataset opens — then
 * it has items of the header's shape, and the first and last 64 items read back with labels
 * below `classes` — or the open fails with EM_ERR_FORMAT / EM_ERR_IO naming the file. Anything else
 * (a crash, a sanitizer report, another status such as EM_ERR_NOMEM, an allocation past the
 * fuzzer's limit) is a finding. Fuzzed by tests/fuzz/run.sh idx; `make check` replays
 * tests/fuzz/corpus/idx/ and tests/fuzz/crashes/idx/ (tests/fuzz/replay.c).
 */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_init("fuzz_idx");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    bool test = data[0] & 1;
    int64_t classes = data[0] & 2 ? 256 : 10;
    size_t n = (size_t)data[1] | (size_t)data[2] << 8, rest = size - 3;
    if (n > rest) n = rest;
    const char *pre = test ? "t10k" : "train", *other = test ? "train" : "t10k";
    char name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", pre);
    fuzz_write(name, data + 3, n);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", pre);
    fuzz_write(name, data + 3 + n, rest - n);
    /* the other split's names must not linger from an earlier input */
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", other);
    unlink(fuzz_path(name));
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", other);
    unlink(fuzz_path(name));

    em_options *o = em_options_new();
    char cls[8];
    snprintf(cls, sizeof cls, "%lld", (long long)classes);
    if (!o || em_options_set_string(o, "path", fuzz_dir) != EM_OK ||
        em_options_set_string(o, "split", test ? "test" : "train") != EM_OK ||
        em_options_set_text(o, "classes", cls, NULL) != EM_OK)
        FUZZ_FINDING("options: %s", em_last_error());
    em_dataset *ds = em_dataset_open("mnist", o);
    em_options_free(o);
    if (!ds) {
        fuzz_check_refusal("mnist", em_last_status(), fuzz_dir, EM_ERR_FORMAT, EM_ERR_IO, EM_OK);
        fuzz_result("mnist", false);
        return 0;
    }
    fuzz_result("mnist", true);
    const em_dataset_info *info = em_dataset_get_info(ds);
    int64_t len = em_dataset_length(ds);
    if (len <= 0 || info->input_ndim != 3 || info->input_shape[0] != 1 ||
        info->input_dtype != EM_U8 || info->target_dtype != EM_I64 || info->num_classes != classes)
        FUZZ_FINDING("mnist: opened with length %lld and a bad item description", (long long)len);
    size_t item = (size_t)(info->input_shape[1] * info->input_shape[2]);
    uint8_t *in = malloc(item);
    for (int64_t i = 0; i < len; i = i == 63 && len > 128 ? len - 64 : i + 1) { /* ends */
        int64_t label = -1;
        if (em_dataset_read(ds, &i, 1, in, &label) != EM_OK)
            FUZZ_FINDING("mnist: reading item %lld: %s", (long long)i, em_last_error());
        if (label < 0 || label >= classes) FUZZ_FINDING("mnist: item %lld has label %lld",
                                                        (long long)i, (long long)label);
    }
    free(in);
    em_dataset_free(ds);
    return 0;
}
