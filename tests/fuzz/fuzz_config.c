/*
 * fuzz_config.c — fuzz target for the YAML config reader (core/config.c, em_config_parse):
 * every input either parses — then every node of the tree is walked (kind, text, entries,
 * keys, locations, paths) and every map is converted to options (em_config_to_options) —
 * or fails with EM_ERR_FORMAT naming the input ("fuzz-input.yaml:LINE:COL: ..."). Anything
 * else (a crash, a sanitizer report, another status, a hang or an allocation past the
 * fuzzer's limits) is a finding. Fuzzed by tests/fuzz/run.sh config; `make check` replays
 * tests/fuzz/corpus/config/ and tests/fuzz/crashes/config/ (tests/fuzz/replay.c).
 */
#include "fuzz.h"

#define NAME "fuzz-input.yaml"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_init("fuzz_config");
    return 0;
}

static size_t walk(const em_config_node *n, int depth) {
    if (depth > 200) FUZZ_FINDING("config nested %d levels deep", depth);
    em_config_kind k = em_config_node_kind(n);
    const char *where = em_config_node_where(n), *kw = em_config_node_key_where(n);
    if (!where || strncmp(where, NAME ":", strlen(NAME) + 1) || !kw || !em_config_node_path(n))
        FUZZ_FINDING("node at depth %d: bad location '%s'", depth, where ? where : "(null)");
    size_t len = em_config_node_len(n), count = 1;
    if (k == EM_CONFIG_SCALAR) {
        if (!em_config_node_text(n) || len) FUZZ_FINDING("scalar without text, or with entries");
        return 1;
    }
    if (k != EM_CONFIG_LIST && k != EM_CONFIG_MAP) FUZZ_FINDING("node kind %d", (int)k);
    for (size_t i = 0; i < len; i++) {
        const char *key = NULL;
        const em_config_node *c = em_config_node_at(n, i, &key);
        if (!c || (k == EM_CONFIG_MAP) != (key != NULL)) FUZZ_FINDING("entry %zu", i);
        if (key && em_config_node_get(n, key) != c) FUZZ_FINDING("key '%s' finds another node", key);
        count += walk(c, depth + 1);
    }
    if (em_config_node_at(n, len, NULL)) FUZZ_FINDING("an entry past the end");
    if (k == EM_CONFIG_MAP) {
        em_options *o = em_options_new();
        em_status st = em_config_to_options(n, NULL, o);
        if (st != EM_OK) fuzz_check_refusal("em_config_to_options", st, NAME, EM_ERR_INVALID, EM_OK);
        em_options_free(o);
    }
    return count;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    em_clear_error();
    em_config *c = em_config_parse((const char *)data, size, NAME);
    if (!c) {
        fuzz_check_refusal("em_config_parse", em_last_status(), NAME, EM_ERR_FORMAT, EM_OK);
        fuzz_result("em_config_parse", false);
        return 0;
    }
    fuzz_result("em_config_parse", true);
    if (strcmp(em_config_name(c), NAME)) FUZZ_FINDING("config name '%s'", em_config_name(c));
    walk(em_config_root(c), 0);
    em_config_free(c);
    return 0;
}
