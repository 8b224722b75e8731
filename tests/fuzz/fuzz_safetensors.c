/*
 * fuzz_safetensors.c — fuzz target for Ember's safetensors reader: em_load_buffer (the parser
 * and validator) on the input, and em_load on the same bytes written to a file (the reader
 * that preads a file instead), which must agree with it. Fuzzed by tests/fuzz/run.sh
 * safetensors; `make check` replays tests/fuzz/corpus/safetensors/ and
 * tests/fuzz/crashes/safetensors/ through it (tests/fuzz/replay.c), and test_serialize_interop
 * loads the same files with em_load.
 *
 * Every input must either load — then the dict's tensors exactly fill the data section, every
 * byte is read back, and the file reader gives the same dict — or fail with EM_ERR_FORMAT /
 * EM_ERR_DTYPE and a message naming the input, the same status from both readers. Anything
 * else (a crash, a sanitizer report, another status, a disagreement) is a finding.
 */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_init("fuzz_safetensors");
    return 0;
}

/* The same keys, dtypes, shapes and bytes. */
static void same_dicts(const em_dict *a, const em_dict *b) {
    if (em_dict_len(a) != em_dict_len(b))
        FUZZ_FINDING("buffer and file readers: %zu vs %zu tensors", em_dict_len(a), em_dict_len(b));
    for (size_t i = 0; i < em_dict_len(a); i++) {
        const em_tensor *x = em_dict_value(a, i), *y = em_dict_value(b, i);
        if (strcmp(em_dict_key(a, i), em_dict_key(b, i)) || em_tensor_dtype(x) != em_tensor_dtype(y) ||
            em_tensor_ndim(x) != em_tensor_ndim(y) ||
            memcmp(em_tensor_shape(x), em_tensor_shape(y),
                   sizeof(int64_t) * (size_t)em_tensor_ndim(x)) != 0)
            FUZZ_FINDING("buffer and file readers differ at tensor %zu ('%s')", i, em_dict_key(a, i));
        size_t n = em_tensor_nbytes(x);
        unsigned char *p = malloc(n ? n : 1), *q = malloc(n ? n : 1);
        if (em_tensor_to_host(x, p, n) != EM_OK || em_tensor_to_host(y, q, n) != EM_OK ||
            memcmp(p, q, n) != 0)
            FUZZ_FINDING("buffer and file readers read different bytes for '%s'", em_dict_key(a, i));
        free(p);
        free(q);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    em_dict *d = NULL, *fd = NULL;
    em_metadata *m = NULL, *fm = NULL;
    em_status st = em_load_buffer(data, size, "fuzz-input", NULL, &d, &m);
    if (st != EM_OK) {
        fuzz_check_refusal("em_load_buffer", st, "fuzz-input", EM_ERR_FORMAT, EM_ERR_DTYPE, EM_OK);
        if (d || m) FUZZ_FINDING("em_load_buffer failed but set its outputs");
    }
    const char *path = fuzz_write("input.safetensors", data, size);
    em_status fst = em_load(path, NULL, &fd, &fm);
    if (fst != st)
        FUZZ_FINDING("em_load_buffer says %s but em_load %s: %s", em_status_name(st),
                     em_status_name(fst), em_last_error());
    if (st != EM_OK) {
        fuzz_check_refusal("em_load", fst, path, EM_ERR_FORMAT, EM_ERR_DTYPE, EM_OK);
        if (fd || fm) FUZZ_FINDING("em_load failed but set its outputs");
        fuzz_result("em_load", false);
        return 0;
    }
    fuzz_result("em_load", true);
    /* A file that loads: its tensors account for every data byte, and read back. */
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)data[i] << (8 * i);
    size_t total = 0;
    for (size_t i = 0; i < em_dict_len(d); i++) total += em_tensor_nbytes(em_dict_value(d, i));
    if (total != size - 8 - hlen)
        FUZZ_FINDING("tensors hold %zu bytes, the data section %llu", total,
                     (unsigned long long)(size - 8 - hlen));
    same_dicts(d, fd);
    if (em_metadata_len(m) != em_metadata_len(fm)) FUZZ_FINDING("metadata differ");
    for (size_t i = 0; i < em_metadata_len(m); i++)
        if (!em_metadata_key(m, i) || !em_metadata_value(m, i) ||
            strcmp(em_metadata_value(m, i), em_metadata_value(fm, i)))
            FUZZ_FINDING("metadata entry %zu", i);
    em_dict_free(d);
    em_dict_free(fd);
    em_metadata_free(m);
    em_metadata_free(fm);
    return 0;
}
