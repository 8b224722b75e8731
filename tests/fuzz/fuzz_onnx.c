/*
 * fuzz_onnx.c — fuzz target for the ONNX reader of the ember-onnx plugin (em_onnx_import:
 * protobuf-c's unpacking under a capped allocator, then the checks of plugins/onnx/
 * onnx_import.c). The input is written to a scratch file and imported.
 *
 * Either it imports — then its state dict lists tensors and the module frees cleanly — or the
 * import fails with EM_ERR_FORMAT, EM_ERR_INVALID, EM_ERR_NOTFOUND, EM_ERR_DTYPE,
 * EM_ERR_SHAPE or EM_ERR_RANGE and a message naming the file. Anything else (a crash, a
 * sanitizer report, EM_ERR_NOMEM, an allocation past the fuzzer's limit) is a finding. Fuzzed
 * by tests/fuzz/run.sh onnx; `make check` replays tests/fuzz/corpus/onnx/ and
 * tests/fuzz/crashes/onnx/ (tests/fuzz/replay.c).
 */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_init("fuzz_onnx");
    if (em_class_count("exporter") == 0) FUZZ_FINDING("fuzz_onnx: the ember-onnx plugin is not loaded");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("input.onnx", data, size);
    em_module *m = em_onnx_import(path, NULL);
    if (!m) {
        fuzz_check_refusal("em_onnx_import", em_last_status(), path, EM_ERR_FORMAT,
                           EM_ERR_INVALID, EM_ERR_NOTFOUND, EM_ERR_DTYPE, EM_ERR_SHAPE,
                           EM_ERR_RANGE, EM_OK);
        fuzz_result("em_onnx_import", false);
        return 0;
    }
    fuzz_result("em_onnx_import", true);
    em_dict *sd = em_module_state_dict(m);
    if (!sd) FUZZ_FINDING("state dict of an imported model: %s", em_last_error());
    for (size_t i = 0; i < em_dict_len(sd); i++)
        if (!em_dict_value(sd, i)) FUZZ_FINDING("state dict entry %zu is NULL", i);
    em_dict_free(sd);
    em_module_free(m);
    return 0;
}
