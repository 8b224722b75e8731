/*
 * data_ref.h — the DataLoader's documented per-epoch permutation (ember/data.h), written out
 * independently of the core, for the loader tests (test_loader.c, test_fields.c).
 */
#ifndef EM_TEST_DATA_REF_H
#define EM_TEST_DATA_REF_H

#include <stdint.h>

#include "ember/random.h"

/* The documented permutation, written out independently of the core. */
static inline void ref_permute(int64_t *v, int64_t n, uint64_t seed, uint64_t epoch, uint32_t stream) {
    for (int64_t k = 0; k + 1 < n; k++) {
        int64_t i = n - 1 - k;
        uint32_t ctr[4] = {(uint32_t)(k / 4), 0, (uint32_t)epoch, stream};
        uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
        uint32_t w[4];
        em_philox4x32_10(ctr, key, w);
        int64_t j = (int64_t)(((uint64_t)w[k % 4] * (uint64_t)(i + 1)) >> 32);
        int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

#endif
