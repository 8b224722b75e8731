/*
 * cpu_nn_simd.c — AVX-512 paths of the nn kernels, compiled with a function target attribute
 * and chosen at run time (cpu_nn_has_avx512), so the plugin still runs on CPUs without it.
 *
 * max_pool2d with a 2x2 window, stride 2, no padding, dilation 1 (the common CNN pooling):
 * oneDNN's max pooling cannot produce PyTorch's i64 plane indices nor let NaN win, so this is
 * ours. 16 outputs per step: two rows of 32 inputs are split into even and odd columns, the
 * four candidates are compared in PyTorch's order (row-major in the window; NaN or a greater
 * value replaces the running maximum) and the winner's flat index h * W + w is kept in two
 * vectors of 8 i64; a row's last chunk uses masked loads and stores (CNN planes are 28 or 14
 * wide). Edges (a last column or row cut by ceil_mode) use the same rule in scalar code.
 */
#include <immintrin.h>
#include <math.h>

#include "cpu_nn.h"

bool cpu_nn_has_avx512(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return has == 1;
}

/* Output (oh, ow) of the 2x2 pooling of x (H, W), window clipped to the plane. */
static inline void pool2_scalar(const float *x, int64_t H, int64_t W, int64_t oh, int64_t ow,
                                float *y, int64_t *idx) {
    int64_t hs = 2 * oh, ws = 2 * ow, he = hs + 2 < H ? hs + 2 : H, we = ws + 2 < W ? ws + 2 : W;
    float m = -INFINITY;
    int64_t best = hs * W + ws;
    for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) {
            float v = x[h * W + w];
            bool take = (v > m) | (v != v);
            m = take ? v : m;
            best = take ? h * W + w : best;
        }
    *y = m;
    *idx = best;
}

__attribute__((target("avx512f"))) void cpu_nn_max_pool2x2_f32(const float *x, int64_t H,
                                                                int64_t W, float *y,
                                                                int64_t *idx, int64_t OH,
                                                                int64_t OW) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i lane2 = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i one = _mm512_set1_epi64(1), wv = _mm512_set1_epi64(W),
                  w1 = _mm512_set1_epi64(W + 1), sixteen = _mm512_set1_epi64(16);
    /* Outputs whose window has both columns, done 16 at a time (masked at the row's end). */
    int64_t owf = W / 2 < OW ? W / 2 : OW;
    for (int64_t oh = 0; oh < OH; oh++) {
        int64_t h0 = 2 * oh;
        float *yr = y + oh * OW;
        int64_t *ir = idx + oh * OW, ow = 0;
        if (h0 + 1 < H) {
            const float *r0 = x + h0 * W, *r1 = r0 + W;
            for (; ow < owf; ow += 16) {
                int64_t n = owf - ow < 16 ? owf - ow : 16;
                __mmask16 mo = (__mmask16)((1u << n) - 1);
                __mmask16 m0 = (__mmask16)(n >= 8 ? 0xFFFFu : (1u << 2 * n) - 1);
                __mmask16 m1 = (__mmask16)(n > 8 ? (1u << (2 * n - 16)) - 1 : 0);
                const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
                __m512 a0 = _mm512_maskz_loadu_ps(m0, p0), a1 = _mm512_maskz_loadu_ps(m1, p0 + 16);
                __m512 b0 = _mm512_maskz_loadu_ps(m0, p1), b1 = _mm512_maskz_loadu_ps(m1, p1 + 16);
                __m512 cand[3] = {_mm512_permutex2var_ps(a0, odd, a1),
                                  _mm512_permutex2var_ps(b0, even, b1),
                                  _mm512_permutex2var_ps(b0, odd, b1)};
                __m512 m = _mm512_permutex2var_ps(a0, even, a1);
                __m512i lo = _mm512_add_epi64(_mm512_set1_epi64(h0 * W + 2 * ow), lane2);
                __m512i hi = _mm512_add_epi64(lo, sixteen); /* outputs ow+8.. read from 2ow+16 */
                __m512i base_lo = lo, base_hi = hi;
                const __m512i off[3] = {one, wv, w1};
                for (int c = 0; c < 3; c++) {
                    __mmask16 t = _mm512_cmp_ps_mask(cand[c], m, _CMP_GT_OQ) |
                                  _mm512_cmp_ps_mask(cand[c], cand[c], _CMP_UNORD_Q);
                    m = _mm512_mask_blend_ps(t, m, cand[c]);
                    lo = _mm512_mask_blend_epi64((__mmask8)t, lo, _mm512_add_epi64(base_lo, off[c]));
                    hi = _mm512_mask_blend_epi64((__mmask8)(t >> 8), hi,
                                                 _mm512_add_epi64(base_hi, off[c]));
                }
                _mm512_mask_storeu_ps(yr + ow, mo, m);
                _mm512_mask_storeu_epi64(ir + ow, (__mmask8)mo, lo);
                _mm512_mask_storeu_epi64(ir + ow + 8, (__mmask8)(mo >> 8), hi);
            }
            ow = owf;
        }
        for (; ow < OW; ow++) pool2_scalar(x, H, W, oh, ow, yr + ow, ir + ow);
    }
}
