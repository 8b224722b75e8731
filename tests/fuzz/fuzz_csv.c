/*
 * fuzz_csv.c — fuzz target for the CSV reader of the ember-data plugin (dataset class "csv",
 * plugins/data/csv.c, libcsv). The input is
 *
 *     byte 0     options: bits 0-1 the delimiter (',' ';' tab ' '), bits 2-3 header (auto,
 *                true, false, auto), bit 4 regression (target_columns "0") instead of a label
 *                column, bit 5 the label column (0, else the last)
 *     the rest   the file
 *
 * Either the dataset opens — then every item reads back (the first and last 64), with labels
 * in [0, num_classes) — or the open fails with EM_ERR_FORMAT / EM_ERR_IO naming the file, or
 * EM_ERR_INVALID naming the file or the option. Anything else (a crash, a sanitizer report,
 * another status such as EM_ERR_NOMEM, an allocation past the fuzzer's limit) is a finding.
 * Fuzzed by tests/fuzz/run.sh csv; `make check` replays tests/fuzz/corpus/csv/ and
 * tests/fuzz/crashes/csv/ (tests/fuzz/replay.c).
 */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_init("fuzz_csv");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *const delims[4] = {",", ";", "tab", " "};
    static const char *const headers[4] = {"auto", "true", "false", "auto"};
    unsigned f = data[0];
    const char *path = fuzz_write("input.csv", data + 1, size - 1);
    em_options *o = em_options_new();
    if (!o || em_options_set_string(o, "path", path) != EM_OK ||
        em_options_set_string(o, "delimiter", delims[f & 3]) != EM_OK ||
        em_options_set_text(o, "header", headers[(f >> 2) & 3], NULL) != EM_OK ||
        (f & 16 ? em_options_set_string(o, "target_columns", "0")
                : em_options_set_text(o, "label_column", f & 32 ? "0" : "-1", NULL)) != EM_OK)
        FUZZ_FINDING("options: %s", em_last_error());
    em_dataset *ds = em_dataset_open("csv", o);
    em_options_free(o);
    if (!ds) {
        em_status st = em_last_status();
        fuzz_check_refusal("csv", st, st == EM_ERR_INVALID ? "csv" : path, EM_ERR_FORMAT,
                           EM_ERR_IO, EM_ERR_INVALID, EM_OK);
        fuzz_result("csv", false);
        return 0;
    }
    fuzz_result("csv", true);
    const em_dataset_info *info = em_dataset_get_info(ds);
    int64_t len = em_dataset_length(ds);
    bool labels = info->target_dtype == EM_I64;
    if (len <= 0 || len > (int64_t)size || info->input_ndim != 1 || info->input_shape[0] < 1 ||
        info->input_dtype != EM_F32 || labels == !!(f & 16))
        FUZZ_FINDING("csv: opened with length %lld and a bad item description", (long long)len);
    float *in = malloc(sizeof(float) * (size_t)info->input_shape[0]);
    float tg[8];
    for (int64_t i = 0; i < len; i = i == 63 && len > 128 ? len - 64 : i + 1) { /* the ends */
        if (em_dataset_read(ds, &i, 1, in, tg) != EM_OK)
            FUZZ_FINDING("csv: reading item %lld: %s", (long long)i, em_last_error());
        int64_t label;
        memcpy(&label, tg, sizeof label);
        if (labels && (label < 0 || label >= info->num_classes))
            FUZZ_FINDING("csv: item %lld has label %lld of %lld classes", (long long)i,
                         (long long)label, (long long)info->num_classes);
    }
    free(in);
    em_dataset_free(ds);
    return 0;
}
