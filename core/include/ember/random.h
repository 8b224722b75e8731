/*
 * ember/random.h — one counter-based generator, Philox 4x32-10, for every backend.
 *
 * A generator's whole state is two numbers, (seed, offset): checkpoints save it and every
 * backend reproduces the same stream from it. The definitions below are the reference: a
 * backend's fill kernel must produce exactly these values, element by element, which also
 * makes them independent of thread count and launch shape.
 *
 *     em_seed(42);                                  // the default generator
 *     em_uniform_(w, -0.1, 0.1, NULL);              // same numbers on CPU and GPU
 *     em_rng_state s = em_generator_get_state(NULL);
 *     ...
 *     em_generator_set_state(NULL, s);              // replay from here
 *
 * Stream definition. Block b (a 64-bit counter) yields four 32-bit words
 *     philox4x32_10(counter = {lo32(b), hi32(b), 0, 0}, key = {lo32(seed), hi32(seed)}).
 * A fill of n elements starting at generator offset o (in blocks) uses, for element i:
 *     uniform, bernoulli (f32, f16, bf16 and non-floating dtypes):
 *         w = word (i % 4) of block o + i / 4;  u = (w >> 8) * 2^-24   in [0, 1)
 *     uniform for f64:
 *         w0, w1 = words 2j, 2j+1 (j = i % 2) of block o + i / 2;
 *         u = ((w0 >> 5) * 2^26 + (w1 >> 6)) * 2^-53                      in [0, 1)
 *     normal (every dtype, computed in double, then rounded to the dtype):
 *         w0, w1 = words 2j, 2j+1 (j = i % 2) of block o + i / 2;
 *         u1 = ((w0 >> 8) + 1) * 2^-24 (in (0, 1]),  u2 = (w1 >> 8) * 2^-24;
 *         z = sqrt(-2 ln u1) * cos(2 pi u2)
 *     uniform on [lo, hi): lo + u * (hi - lo); bernoulli(p): 1 if u < p else 0.
 * and then advances the offset by ceil(n / 4) blocks (4-per-block streams) or ceil(n / 2)
 * (2-per-block streams).
 *
 * randperm(n) (em_randperm; n <= 2^32) is a Fisher-Yates shuffle of v = 0, 1, ..., n-1 that
 * draws from the 4-per-block stream at offset o:
 *     for k = 0 .. n-2:  i = n-1-k;  w = word (k % 4) of block o + k / 4;
 *                        j = (w * (i + 1)) >> 32  (a 64-bit product, so 0 <= j <= i);
 *                        swap v[i] and v[j]
 * and advances the offset by ceil((n - 1) / 4) blocks (none for n <= 1). The map from w to j
 * favours some j by at most n / 2^32 in probability, as PyTorch's modulo draw does. *
 * Across backends (the CPU's and the CUDA plugin's fill kernels), for the same (seed, offset)
 * and shape: the raw words, every uniform fill, every bernoulli fill (dropout's masks) and
 * randperm are bitwise identical, in every dtype — they are integer and exactly rounded
 * power-of-two arithmetic, the device compiled without multiply-add contraction. A normal
 * fill is computed in double through log, sqrt and cos, which the GPU's libdevice gives within
 * 1 ulp of glibc's (sqrt exactly): each value is within 2 ulp of double of the CPU's before
 * it is rounded to the output dtype, so f32, f16 and bf16 normal fills almost always agree
 * bitwise and otherwise differ by one unit in their last place.
 *
 * Graph capture (ember/device.h; PyTorch's "seed_extragraph"/"offset_extragraph"). A graph
 * replays its kernels' arguments, so a draw whose offset were an argument would repeat its
 * numbers in every replay. While a thread captures on a device, the drawing ops it runs there
 * (em_uniform_, em_normal_, em_bernoulli_, em_dropout, em_scaled_dot_product_attention with
 * dropout, and that op's backward) do not move their generator: each takes its blocks from a
 * count of the capture's own, starting at 0, and passes that relative offset as its offset
 * attribute with the seed attribute absent; their kernels then read the seed and a base
 * offset from a (2) uint64 device tensor of the graph (em_kernel_generator_state,
 * ember/dispatch.h) and draw from block base + offset (the schemas keep their attributes, so
 * a call by name with both attributes is an eager draw, in a capture too). The graph remembers the generator (one per capture: a second one is
 * an error naming the op) and the blocks it takes (em_graph_generator). Each em_graph_replay
 * reserves those blocks from the generator and writes its (seed, offset) into the device
 * tensor on the replay stream ahead of the graph: a replay draws exactly the numbers the same
 * ops run eagerly at the generator's state would draw, and leaves the generator where they
 * would. Ops that draw otherwise (em_randperm) fail during a capture, naming the op; eager
 * calls are unchanged (seed and offset given).
 */
#ifndef EMBER_RANDOM_H
#define EMBER_RANDOM_H

#include <math.h>
#include <stdint.h>

#include "ember/error.h"
#include "ember/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The scale factors below are 2^-24 and 2^-53 written as exact decimal literals: hexadecimal
 * floating literals (0x1p-24) are not valid C++ before C++17, and this header is included
 * from C++. */

/* Philox 4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
 * SC'11), matching Random123's philox4x32_10. */
static inline void em_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                    uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* The four words of block b for `seed`. */
static inline void em_philox_block(uint64_t seed, uint64_t block, uint32_t out[4]) {
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    em_philox4x32_10(ctr, key, out);
}

/* Element i of the 4-per-block uniform stream starting at block `offset`: [0, 1). */
static inline float em_philox_uniform_f32(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t w[4];
    em_philox_block(seed, offset + i / 4, w);
    return (float)(w[i % 4] >> 8) * 5.9604644775390625e-08f;
}

/* Element i of the 2-per-block f64 uniform stream: [0, 1) with 53 random bits. */
static inline double em_philox_uniform_f64(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t w[4];
    em_philox_block(seed, offset + i / 2, w);
    unsigned j = (unsigned)(i % 2) * 2;
    return ((double)(w[j] >> 5) * 67108864.0 + (double)(w[j + 1] >> 6)) *
           1.1102230246251565404236316680908203125e-16;
}

/* Element i of the 2-per-block normal stream (mean 0, std 1). */
static inline double em_philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
    uint32_t w[4];
    em_philox_block(seed, offset + i / 2, w);
    unsigned j = (unsigned)(i % 2) * 2;
    double u1 = ((double)(w[j] >> 8) + 1.0) * 5.9604644775390625e-08;
    double u2 = (double)(w[j + 1] >> 8) * 5.9604644775390625e-08;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

/* ---- generators ------------------------------------------------------------------------ */

typedef struct em_generator em_generator;

/* The whole state of a generator. */
typedef struct em_rng_state {
    uint64_t seed;
    uint64_t offset; /* next unused block */
} em_rng_state;

/* A new generator at (seed, 0); NULL on out of memory. Free with em_generator_free. */
EM_API em_generator *em_generator_new(uint64_t seed);
EM_API void em_generator_free(em_generator *g);
/* The process's default generator (used when a fill is given NULL). Seeded from 0 at
 * em_init(), or from EMBER_SEED. */
EM_API em_generator *em_default_generator(void);
/* Reset the default generator to (seed, 0). */
EM_API void em_seed(uint64_t seed);
/* State of g (NULL: the default generator). Thread-safe. */
EM_API em_rng_state em_generator_get_state(const em_generator *g);
EM_API void em_generator_set_state(em_generator *g, em_rng_state s);
/* Take `blocks` blocks from g (NULL: the default): returns the state to fill from and
 * advances the offset past them. Thread-safe; fills use it. */
EM_API em_rng_state em_generator_reserve(em_generator *g, uint64_t blocks);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_RANDOM_H */
