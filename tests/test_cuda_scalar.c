/*
 * test_cuda_scalar.c — the scalar definitions the CUDA kernels compile for the device
 * (plugins/backend-cuda/cuda_scalar.h, __host__ __device__ under nvcc, plain C here) against
 * the core's own: the f16/bf16 conversions of core/dtype.c and the Philox streams of
 * ember/random.h. This part of the GPU's bitwise agreement with the CPU runs without a GPU:
 * the device compiles the same source (integer and IEEE-exact arithmetic only, except the
 * normal stream's log/cos, whose device ulp bound ember/random.h states).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <ember/ember.h>
#include <ember/random.h>

#include "../plugins/backend-cuda/cuda_scalar.h"
#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint64_t dbits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* Every f16 and bf16 pattern widens to the core's float, bit for bit (NaNs included). */
Test(cuda_scalar, widening_is_exhaustively_the_cores) {
    for (uint32_t h = 0; h < 65536; h++) {
        cr_assert_eq(bits(ck_f16_to_f32((uint16_t)h)), bits(em_f16_to_f32((uint16_t)h)),
                     "f16 0x%04x", h);
        cr_assert_eq(bits(ck_bf16_to_f32((uint16_t)h)), bits(em_bf16_to_f32((uint16_t)h)),
                     "bf16 0x%04x", h);
    }
}

static void check_narrow(uint32_t u) {
    float f = from_bits(u);
    cr_assert_eq(ck_f32_to_f16(f), em_f32_to_f16(f), "f16 of f32 0x%08x", u);
    cr_assert_eq(ck_f32_to_bf16(f), em_f32_to_bf16(f), "bf16 of f32 0x%08x", u);
}

/* Narrowing: around every rounding boundary of both formats (each representable value, the
 * midpoints to its neighbours and one float ulp either side), a sweep over the whole f32
 * space, and NaN payloads. */
Test(cuda_scalar, narrowing_is_the_cores_at_every_boundary) {
    for (uint32_t h = 0; h < 65536; h++) {
        uint32_t lo = bits(em_f16_to_f32((uint16_t)h)), hi = bits(em_f16_to_f32((uint16_t)(h + 1)));
        uint32_t mid = lo / 2 + hi / 2 + (lo & hi & 1);
        for (int d = -2; d <= 2; d++) check_narrow(lo + (uint32_t)d), check_narrow(mid + (uint32_t)d);
        uint32_t b = (uint32_t)h << 16; /* bf16: its value, the midpoint up, +-1 ulp */
        for (int d = -2; d <= 2; d++) check_narrow(b + (uint32_t)d), check_narrow(b + 0x8000u + (uint32_t)d);
    }
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4099) check_narrow((uint32_t)u);
    const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
                                 0x7fbfffffu, 0x00000001u, 0x80000001u, 0x477ff000u, 0x477fefffu,
                                 0x33000000u, 0x33000001u, 0x387fe000u};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) check_narrow(specials[i]);
}

/* Philox words, the uniform streams and the normal stream of ember/random.h. */
Test(cuda_scalar, philox_streams_are_ember_random_h) {
    const uint64_t seeds[] = {0, 1, 42, 0xdeadbeefull, 0x123456789abcdef0ull, ~0ull};
    const uint64_t offsets[] = {0, 7, 0xfffffff0ull, 0xfffffffffffffff0ull};
    for (size_t s = 0; s < sizeof seeds / sizeof *seeds; s++)
        for (size_t o = 0; o < sizeof offsets / sizeof *offsets; o++) {
            uint64_t seed = seeds[s], off = offsets[o];
            for (uint64_t b = 0; b < 64; b++) {
                uint32_t want[4], got[4];
                em_philox_block(seed, off + b, want);
                ck_philox_block(seed, off + b, got);
                cr_assert_eq(memcmp(want, got, sizeof want), 0, "seed %llu block %llu",
                             (unsigned long long)seed, (unsigned long long)(off + b));
            }
            for (uint64_t i = 0; i < 256; i++) {
                uint32_t w[4];
                ck_philox_block(seed, off + i / 4, w);
                cr_assert_eq(bits(ck_u24(w[i % 4])), bits(em_philox_uniform_f32(seed, off, i)),
                             "uniform f32 element %llu", (unsigned long long)i);
                ck_philox_block(seed, off + i / 2, w);
                unsigned j = (unsigned)(i % 2) * 2;
                cr_assert_eq(dbits(ck_u53(w[j], w[j + 1])), dbits(em_philox_uniform_f64(seed, off, i)),
                             "uniform f64 element %llu", (unsigned long long)i);
                cr_assert_eq(dbits(ck_box_muller(w[j], w[j + 1])), dbits(em_philox_normal(seed, off, i)),
                             "normal element %llu", (unsigned long long)i);
            }
        }
}
