/*
 * fuzz_safetensors.c — libFuzzer target for Ember's safetensors reader (em_load_buffer: the
 * parser and validator behind em_load). Built and run by tests/fuzz/run.sh with clang,
 * -fsanitize=fuzzer,address,undefined against a libember built the same way; not part of CI.
 * `make check` replays tests/fuzz/corpus/ and tests/fuzz/crashes/ through em_load instead
 * (tests/test_serialize_interop.c).
 *
 * Every input must either load — then the dict's tensors exactly fill the data section and
 * every byte is read back — or fail with EM_ERR_FORMAT / EM_ERR_DTYPE and a message naming
 * the input. Anything else (a crash, a sanitizer report, another status) is a finding.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ember/ember.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (em_init() != EM_OK) {
        fprintf(stderr, "fuzz_safetensors: em_init: %s\n", em_last_error());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    em_dict *d = NULL;
    em_metadata *m = NULL;
    em_status st = em_load_buffer(data, size, "fuzz-input", NULL, &d, &m);
    if (st != EM_OK) {
        if ((st != EM_ERR_FORMAT && st != EM_ERR_DTYPE) || d || m ||
            !strstr(em_last_error(), "fuzz-input")) {
            fprintf(stderr, "fuzz_safetensors: unexpected failure %s: %s\n", em_status_name(st),
                    em_last_error());
            abort();
        }
        return 0;
    }
    /* A file that loads: its tensors account for every data byte, and read back. */
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)data[i] << (8 * i);
    size_t total = 0;
    for (size_t i = 0; i < em_dict_len(d); i++) {
        em_tensor *t = em_dict_value(d, i);
        size_t n = em_tensor_nbytes(t);
        unsigned char *buf = malloc(n ? n : 1);
        if (em_tensor_to_host(t, buf, n) != EM_OK) abort();
        free(buf);
        total += n;
    }
    if (total != size - 8 - hlen) {
        fprintf(stderr, "fuzz_safetensors: tensors hold %zu bytes, the data section %llu\n",
                total, (unsigned long long)(size - 8 - hlen));
        abort();
    }
    for (size_t i = 0; i < em_metadata_len(m); i++)
        if (!em_metadata_key(m, i) || !em_metadata_value(m, i)) abort();
    em_dict_free(d);
    em_metadata_free(m);
    return 0;
}
