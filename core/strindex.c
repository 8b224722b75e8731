/*
 * strindex.c — a hashed index over an array of strings that the caller owns: the key lookup
 * under the config parser's maps and anchors and the safetensors metadata, so that a file
 * with n keys costs O(n), never O(n^2) (a linear scan per entry made an 80,000-entry header
 * take seconds and a 400,000-item config minutes).
 *
 * Layout. Open addressing with linear probing over a power-of-two table of slots, each the
 * key's position in the caller's array + 1 (0 marks an empty slot), at most half full; the
 * table doubles when it would pass that. Keys are not copied: the caller passes its array to
 * every call — the address of the first key pointer and the stride between key pointers, so
 * that an array of structs with a name field works as well as an array of strings — and must
 * keep the positions it added stable.
 *
 * Hash. Keys come from files, so the hash is seeded once per process from the kernel's
 * random source: an attacker cannot precompute keys that all land in one slot. FNV-1a over
 * the bytes from the seed, then a 64-bit finaliser (murmur3's fmix64) so that the low bits
 * the table uses depend on every byte.
 *
 * Work counter. Every probe that compares the key with a stored one adds 1 to the caller's
 * counter (which may be NULL): tests check that parsing 4n keys costs about 4 times the
 * comparisons of n keys (em_config_stats, em_metadata_key_compares).
 */
#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "ember/error.h"
#include "internal.h"

#define STRINDEX_MIN_SLOTS 16

static _Atomic uint64_t g_seed; /* 0: not yet drawn */

static uint64_t fmix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t seed(void) {
    uint64_t s = atomic_load_explicit(&g_seed, memory_order_relaxed);
    if (s) return s;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
        /* no entropy yet (early boot): the clock and an address, still unknown to a file */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s = fmix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)&ts);
    }
    s |= 1; /* never 0 */
    uint64_t expected = 0;
    /* the first thread's draw wins, so every index of the process agrees */
    if (!atomic_compare_exchange_strong(&g_seed, &expected, s)) s = expected;
    return s;
}

uint64_t em__strhash(const char *s) {
    uint64_t h = 1469598103934665603ULL ^ seed();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 1099511628211ULL;
    }
    return fmix64(h);
}

/* Key i of the caller's array. */
static const char *key_at(const void *keys, size_t stride, size_t i) {
    return *(const char *const *)((const char *)keys + i * stride);
}

/* The slot holding key, or the empty slot where it would go. cap > 0. */
static size_t slot_of(const em__strindex *x, const void *keys, size_t stride, const char *key,
                      uint64_t h, uint64_t *compares) {
    size_t mask = x->cap - 1, s = (size_t)h & mask;
    while (x->slots[s]) {
        if (compares) (*compares)++;
        if (!strcmp(key_at(keys, stride, x->slots[s] - 1), key)) return s;
        s = (s + 1) & mask;
    }
    return s;
}

ptrdiff_t em__strindex_find(const em__strindex *x, const void *keys, size_t stride,
                            const char *key, uint64_t *compares) {
    if (!x || !x->cap || !key) return -1;
    size_t s = slot_of(x, keys, stride, key, em__strhash(key), compares);
    return x->slots[s] ? (ptrdiff_t)(x->slots[s] - 1) : -1;
}

em_status em__strindex_add(em__strindex *x, const void *keys, size_t stride, size_t pos,
                           uint64_t *compares) {
    if (2 * (x->count + 1) > x->cap) {
        size_t cap = x->cap ? 2 * x->cap : STRINDEX_MIN_SLOTS;
        while (2 * (x->count + 1) > cap) cap *= 2;
        size_t *slots = em__calloc(cap, sizeof *slots, "string index");
        if (!slots) return EM_ERR_NOMEM;
        /* re-file the keys already in (one pass over the old table: linear overall, as the
         * table doubles) */
        for (size_t i = 0; i < x->cap; i++) {
            if (!x->slots[i]) continue;
            size_t s = (size_t)em__strhash(key_at(keys, stride, x->slots[i] - 1)) & (cap - 1);
            while (slots[s]) s = (s + 1) & (cap - 1);
            slots[s] = x->slots[i];
        }
        em__free(x->slots);
        x->slots = slots;
        x->cap = cap;
    }
    const char *key = key_at(keys, stride, pos);
    size_t s = slot_of(x, keys, stride, key, em__strhash(key), compares);
    if (!x->slots[s]) x->count++;
    x->slots[s] = pos + 1; /* an equal key already in: this position replaces it */
    return EM_OK;
}

void em__strindex_free(em__strindex *x) {
    if (!x) return;
    em__free(x->slots);
    memset(x, 0, sizeof *x);
}
