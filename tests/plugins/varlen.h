/*
 * varlen.h — the items of the test dataset class "test-varlen" (tests/plugins/varlen_plugin.c),
 * as plain functions of the item index, so that the tests check every batch against them.
 * Item i has three fields:
 *   seq   (len, dim) float32, len = vl_seq_len(i) in [1, max_len], variable along dim 0,
 *         padded with 0: seq[t][d] = vl_seq(i, t, d);
 *   marks (2, len2) uint8, len2 = vl_marks_len(i) in [0, max_len], variable along dim 1,
 *         padded with 7: marks[r][t] = vl_marks(i, r, t);
 *   label ()  int64 in [0, classes): vl_label(i).
 */
#ifndef EM_TEST_VARLEN_H
#define EM_TEST_VARLEN_H

#include <stdint.h>

static inline uint64_t vl_mix(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static inline int64_t vl_seq_len(int64_t i, int64_t max_len) {
    return 1 + (int64_t)(vl_mix((uint64_t)i) % (uint64_t)max_len);
}
static inline int64_t vl_marks_len(int64_t i, int64_t max_len) {
    return (int64_t)(vl_mix((uint64_t)i ^ 0x5a5aull) % (uint64_t)(max_len + 1));
}
static inline float vl_seq(int64_t i, int64_t t, int64_t d) {
    return (float)(i % 17) * 0.25f + (float)t * 0.5f - (float)d;
}
static inline uint8_t vl_marks(int64_t i, int64_t r, int64_t t) {
    return (uint8_t)((i + 3 * r + t) % 5);
}
static inline int64_t vl_label(int64_t i, int64_t max_len, int64_t classes) {
    return vl_seq_len(i, max_len) % classes;
}

#endif
