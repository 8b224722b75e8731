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
 *
 * In oneDNN's nChw16c layout (16 channels contiguous per position) a 2x2 window is four
 * vector loads of 16 channels: cpu_nn_max_pool2x2_nchw16c_f32, the same comparisons per lane;
 * its backward's disjoint tiles are four masked stores (cpu_nn_max_pool2x2_bwd_nchw16c_f32).
 * Their two row streams are prefetched a row pair ahead: without it both ran slower than the
 * plane kernels on data from memory (a batch of 128 x 32 x 28 x 28), with it faster.
 *
 * The f32 kernels also serve max_pool2d_relu (their relu argument): each loaded value is
 * replaced by relu's (x <= 0 ? +0 : x, NaN kept: one compare that is true for NaN and a masked
 * move) before the same comparisons, so the maxima and indices are those of pooling relu's
 * output. Each kernel body is written once, always inlined into its entry point's two
 * branches, so neither instance tests the flag in its loop.
 *
 * The bf16 variant is the same kernel with bf16 loads widened to f32 in registers (a shift:
 * exact, NaN stays NaN) and the maxima stored as their upper halves (exact: each is an input
 * value); it needs AVX512BW/VL for masked 16-bit loads. cpu_nn_f32_to_bf16 rounds an f32
 * buffer to bf16 as em_f32_to_bf16 does (nearest even; NaN quieted), 16 at a time.
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

bool cpu_nn_has_avx2(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0;
    }
    return has == 1;
}

bool cpu_nn_has_avx512bw(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl")
                  ? 1
                  : 0;
    }
    return has == 1;
}

/* relu's value (x <= 0 ? +0 : x, NaN kept) when relu, x otherwise. */
static inline float relu_if(bool relu, float v) { return relu && v <= 0 ? 0.0f : v; }

/* The index of output (oh, ow) of the 2x2 pooling of x (H, W), window clipped to the plane;
 * x is f32, or bf16 when bf; over relu's values when relu. */
static inline int64_t pool2_best(const void *x, bool bf, bool relu, int64_t H, int64_t W,
                                 int64_t oh, int64_t ow) {
    int64_t hs = 2 * oh, ws = 2 * ow, he = hs + 2 < H ? hs + 2 : H, we = ws + 2 < W ? ws + 2 : W;
    float m = -INFINITY;
    int64_t best = hs * W + ws;
    for (int64_t h = hs; h < he; h++)
        for (int64_t w = ws; w < we; w++) {
            float v = relu_if(relu, bf ? cpu_b2f(((const uint16_t *)x)[h * W + w])
                                       : ((const float *)x)[h * W + w]);
            bool take = (v > m) | (v != v);
            m = take ? v : m;
            best = take ? h * W + w : best;
        }
    return best;
}

static inline void pool2_scalar(const float *x, bool relu, int64_t H, int64_t W, int64_t oh,
                                int64_t ow, float *y, int64_t *idx) {
    *idx = pool2_best(x, false, relu, H, W, oh, ow);
    *y = relu_if(relu, x[*idx]);
}

/* relu's values of 16 (AVX-512) or 8 (AVX2) lanes: kept where not v <= 0 (NaN included),
 * +0 elsewhere. */
__attribute__((target("avx512f"))) static inline __m512 relu16(__m512 v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLE_UQ), v);
}
__attribute__((target("avx2"))) static inline __m256 relu8(__m256 v) {
    return _mm256_and_ps(v, _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NLE_UQ));
}

/* The maxima of 16 2x2 windows whose rows are a0:a1 (row h0) and b0:b1 (row h0 + 1), 32
 * consecutive values each, and their flat indices (lo: windows 0-7, hi: 8-15; base: the index
 * of the first value of a0). NaN wins, and the first of equal values, as in the loops. */
__attribute__((target("avx512f"))) static inline __m512
pool2_windows(__m512 a0, __m512 a1, __m512 b0, __m512 b1, int64_t base, int64_t W,
              __m512i *lo_out, __m512i *hi_out) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                           28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i lane2 = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i off[3] = {_mm512_set1_epi64(1), _mm512_set1_epi64(W),
                            _mm512_set1_epi64(W + 1)};
    __m512 cand[3] = {_mm512_permutex2var_ps(a0, odd, a1), _mm512_permutex2var_ps(b0, even, b1),
                      _mm512_permutex2var_ps(b0, odd, b1)};
    __m512 m = _mm512_permutex2var_ps(a0, even, a1);
    __m512i lo = _mm512_add_epi64(_mm512_set1_epi64(base), lane2);
    __m512i hi = _mm512_add_epi64(lo, _mm512_set1_epi64(16)); /* windows 8.. start 16 later */
    const __m512i base_lo = lo, base_hi = hi;
    for (int c = 0; c < 3; c++) {
        __mmask16 t = _mm512_cmp_ps_mask(cand[c], m, _CMP_GT_OQ) |
                      _mm512_cmp_ps_mask(cand[c], cand[c], _CMP_UNORD_Q);
        m = _mm512_mask_blend_ps(t, m, cand[c]);
        lo = _mm512_mask_blend_epi64((__mmask8)t, lo, _mm512_add_epi64(base_lo, off[c]));
        hi = _mm512_mask_blend_epi64((__mmask8)(t >> 8), hi, _mm512_add_epi64(base_hi, off[c]));
    }
    *lo_out = lo, *hi_out = hi;
    return m;
}

/* The masks of a block of n (<= 16) windows: outputs, then the two 16-value loads of a row. */
static inline void pool2_masks(int64_t n, __mmask16 *mo, __mmask16 *m0, __mmask16 *m1) {
    *mo = (__mmask16)((1u << n) - 1);
    *m0 = (__mmask16)(n >= 8 ? 0xFFFFu : (1u << 2 * n) - 1);
    *m1 = (__mmask16)(n > 8 ? (1u << (2 * n - 16)) - 1 : 0);
}

__attribute__((target("avx512f"), always_inline)) static inline void
max_pool2x2_f32(const float *x, int64_t H, int64_t W, float *y, int64_t *idx, int64_t OH,
                int64_t OW, bool relu) {
#define LD(m, p) (relu ? relu16(_mm512_maskz_loadu_ps(m, p)) : _mm512_maskz_loadu_ps(m, p))
    /* Outputs whose window has both columns, done 16 at a time (masked at the row's end). */
    int64_t owf = W / 2 < OW ? W / 2 : OW;
    for (int64_t oh = 0; oh < OH; oh++) {
        int64_t h0 = 2 * oh;
        float *yr = y + oh * OW;
        int64_t *ir = idx + oh * OW, ow = 0;
        if (h0 + 1 < H) {
            const float *r0 = x + h0 * W, *r1 = r0 + W;
            for (; ow < owf; ow += 16) {
                __mmask16 mo, m0, m1;
                pool2_masks(owf - ow < 16 ? owf - ow : 16, &mo, &m0, &m1);
                const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
                __m512i lo, hi;
                __m512 m = pool2_windows(LD(m0, p0), LD(m1, p0 + 16), LD(m0, p1),
                                         LD(m1, p1 + 16), h0 * W + 2 * ow, W, &lo, &hi);
                _mm512_mask_storeu_ps(yr + ow, mo, m);
                _mm512_mask_storeu_epi64(ir + ow, (__mmask8)mo, lo);
                _mm512_mask_storeu_epi64(ir + ow + 8, (__mmask8)(mo >> 8), hi);
            }
            ow = owf;
        }
        for (; ow < OW; ow++) pool2_scalar(x, relu, H, W, oh, ow, yr + ow, ir + ow);
    }
#undef LD
}

__attribute__((target("avx512f"))) void cpu_nn_max_pool2x2_f32(const float *x, int64_t H,
                                                                int64_t W, float *y,
                                                                int64_t *idx, int64_t OH,
                                                                int64_t OW, bool relu) {
    if (relu) max_pool2x2_f32(x, H, W, y, idx, OH, OW, true);
    else max_pool2x2_f32(x, H, W, y, idx, OH, OW, false);
}

/* AVX2: the maxima of 8 2x2 windows whose rows are a0:a1 (row h0) and b0:b1 (row h0 + 1), 16
 * consecutive values each, and their flat indices (lo: windows 0-3, hi: 4-7; base: the index
 * of the first value of a0). The same comparisons as pool2_windows, in the same order. */
__attribute__((target("avx2"))) static inline __m256 pool2_windows8(__m256 a0, __m256 a1,
                                                                   __m256 b0, __m256 b1,
                                                                   int64_t base, int64_t W,
                                                                   __m256i *lo_out,
                                                                   __m256i *hi_out) {
    /* even and odd columns: shuffle within 128-bit lanes, then put the lanes in order */
#define EVEN8(u, v) _mm256_castpd_ps(_mm256_permute4x64_pd( \
        _mm256_castps_pd(_mm256_shuffle_ps(u, v, _MM_SHUFFLE(2, 0, 2, 0))), _MM_SHUFFLE(3, 1, 2, 0)))
#define ODD8(u, v) _mm256_castpd_ps(_mm256_permute4x64_pd( \
        _mm256_castps_pd(_mm256_shuffle_ps(u, v, _MM_SHUFFLE(3, 1, 3, 1))), _MM_SHUFFLE(3, 1, 2, 0)))
    __m256 cand[3] = {ODD8(a0, a1), EVEN8(b0, b1), ODD8(b0, b1)};
    __m256 m = EVEN8(a0, a1);
#undef EVEN8
#undef ODD8
    const __m256i off[3] = {_mm256_set1_epi32(1), _mm256_set1_epi32((int)W),
                            _mm256_set1_epi32((int)W + 1)};
    __m256i o = _mm256_setzero_si256(); /* the winner's offset in its window */
    for (int c = 0; c < 3; c++) {
        __m256 t = _mm256_or_ps(_mm256_cmp_ps(cand[c], m, _CMP_GT_OQ),
                                _mm256_cmp_ps(cand[c], cand[c], _CMP_UNORD_Q));
        m = _mm256_blendv_ps(m, cand[c], t);
        o = _mm256_blendv_epi8(o, off[c], _mm256_castps_si256(t));
    }
    const __m256i lane2 = _mm256_setr_epi64x(0, 2, 4, 6);
    __m256i lo = _mm256_add_epi64(_mm256_set1_epi64x(base), lane2);
    __m256i hi = _mm256_add_epi64(lo, _mm256_set1_epi64x(8)); /* windows 4.. start 8 later */
    *lo_out = _mm256_add_epi64(lo, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(o)));
    *hi_out = _mm256_add_epi64(hi, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(o, 1)));
    return m;
}

/* A mask of the first n (0..8) 32-bit lanes, and of the first n (0..4) 64-bit lanes. */
__attribute__((target("avx2"))) static inline __m256i mask32(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
__attribute__((target("avx2"))) static inline __m256i mask64(int64_t n) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
}

__attribute__((target("avx2"), always_inline)) static inline void
max_pool2x2_f32_avx2(const float *x, int64_t H, int64_t W, float *y, int64_t *idx, int64_t OH,
                     int64_t OW, bool relu) {
#define R(v) (relu ? relu8(v) : (v))
    int64_t owf = W / 2 < OW ? W / 2 : OW;
    for (int64_t oh = 0; oh < OH; oh++) {
        int64_t h0 = 2 * oh;
        float *yr = y + oh * OW;
        int64_t *ir = idx + oh * OW, ow = 0;
        if (h0 + 1 < H) {
            const float *r0 = x + h0 * W, *r1 = r0 + W;
            for (; ow + 8 <= owf; ow += 8) { /* whole blocks: plain loads and stores */
                const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
                __m256i lo, hi;
                __m256 m = pool2_windows8(R(_mm256_loadu_ps(p0)), R(_mm256_loadu_ps(p0 + 8)),
                                          R(_mm256_loadu_ps(p1)), R(_mm256_loadu_ps(p1 + 8)),
                                          h0 * W + 2 * ow, W, &lo, &hi);
                _mm256_storeu_ps(yr + ow, m);
                _mm256_storeu_si256((__m256i *)(ir + ow), lo);
                _mm256_storeu_si256((__m256i *)(ir + ow + 4), hi);
            }
            if (ow < owf) { /* the row's last n < 8 windows: 2n inputs a row, masked */
                int64_t n = owf - ow;
                __m256i m0 = mask32(2 * n), m1 = mask32(2 * n - 8);
                const float *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
                __m256i lo, hi;
                __m256 m = pool2_windows8(R(_mm256_maskload_ps(p0, m0)),
                                          R(_mm256_maskload_ps(p0 + 8, m1)),
                                          R(_mm256_maskload_ps(p1, m0)),
                                          R(_mm256_maskload_ps(p1 + 8, m1)), h0 * W + 2 * ow, W,
                                          &lo, &hi);
                _mm256_maskstore_ps(yr + ow, mask32(n), m);
                _mm256_maskstore_epi64((long long *)(ir + ow), mask64(n), lo);
                _mm256_maskstore_epi64((long long *)(ir + ow + 4), mask64(n - 4), hi);
            }
            ow = owf;
        }
        for (; ow < OW; ow++) pool2_scalar(x, relu, H, W, oh, ow, yr + ow, ir + ow);
    }
#undef R
}

__attribute__((target("avx2"))) void cpu_nn_max_pool2x2_f32_avx2(const float *x, int64_t H,
                                                                 int64_t W, float *y,
                                                                 int64_t *idx, int64_t OH,
                                                                 int64_t OW, bool relu) {
    if (relu) max_pool2x2_f32_avx2(x, H, W, y, idx, OH, OW, true);
    else max_pool2x2_f32_avx2(x, H, W, y, idx, OH, OW, false);
}

/* Channels-last 2x2 window at one output position: the C-vectors p00 (row h0, column w0),
 * p00 + C, p00 + WC and p00 + WC + C, in the plane kernels' order of comparisons (the same
 * maxima and indices per channel); base = h0 * W + w0. */
__attribute__((target("avx2"), always_inline)) static inline void
max_pool2x2_nhwc_f32_avx2(const float *p00, int64_t WC, int64_t C, int64_t base, int64_t W,
                          float *y, int64_t *idx, bool relu) {
    const float *q[3] = {p00 + C, p00 + WC, p00 + WC + C};
    const __m256i off[3] = {_mm256_set1_epi32(1), _mm256_set1_epi32((int)W),
                            _mm256_set1_epi32((int)W + 1)};
    const __m256i b64 = _mm256_set1_epi64x(base);
    for (int64_t c = 0; c < C; c += 8) {
        int64_t n = C - c < 8 ? C - c : 8;
        __m256i mk = mask32(n);
        __m256 m = n == 8 ? _mm256_loadu_ps(p00 + c) : _mm256_maskload_ps(p00 + c, mk);
        if (relu) m = relu8(m);
        __m256i o = _mm256_setzero_si256();
        for (int j = 0; j < 3; j++) {
            __m256 v = n == 8 ? _mm256_loadu_ps(q[j] + c) : _mm256_maskload_ps(q[j] + c, mk);
            if (relu) v = relu8(v);
            __m256 t = _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            m = _mm256_blendv_ps(m, v, t);
            o = _mm256_blendv_epi8(o, off[j], _mm256_castps_si256(t));
        }
        __m256i lo = _mm256_add_epi64(b64, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(o)));
        __m256i hi = _mm256_add_epi64(b64, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(o, 1)));
        if (n == 8) {
            _mm256_storeu_ps(y + c, m);
            _mm256_storeu_si256((__m256i *)(idx + c), lo);
            _mm256_storeu_si256((__m256i *)(idx + c + 4), hi);
        } else {
            _mm256_maskstore_ps(y + c, mk, m);
            _mm256_maskstore_epi64((long long *)(idx + c), mask64(n), lo);
            _mm256_maskstore_epi64((long long *)(idx + c + 4), mask64(n - 4), hi);
        }
    }
}

__attribute__((target("avx2"))) void cpu_nn_max_pool2x2_nhwc_f32_avx2(const float *p00,
                                                                      int64_t WC, int64_t C,
                                                                      int64_t base, int64_t W,
                                                                      float *y, int64_t *idx,
                                                                      bool relu) {
    if (relu) max_pool2x2_nhwc_f32_avx2(p00, WC, C, base, W, y, idx, true);
    else max_pool2x2_nhwc_f32_avx2(p00, WC, C, base, W, y, idx, false);
}

/* One candidate of a 16-channel window: NaN or a greater value replaces the running maximum
 * m, and its plane index at the running indices lo (channels 0-7) and hi (8-15). */
__attribute__((target("avx512f"))) static inline void pool16_take(__m512 v, int64_t at, __m512 *m,
                                                                  __m512i *lo, __m512i *hi) {
    __mmask16 t = _mm512_cmp_ps_mask(v, *m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i a = _mm512_set1_epi64(at);
    *m = _mm512_mask_blend_ps(t, *m, v);
    *lo = _mm512_mask_blend_epi64((__mmask8)t, *lo, a);
    *hi = _mm512_mask_blend_epi64((__mmask8)(t >> 8), *hi, a);
}

/* nChw16c: the 2x2 windows of outputs [0, n_ow) of row oh of one block x (H, W, 16), each
 * inside the plane; 16 channels a step, from the four 16-vectors at (2oh, 2ow), (2oh, 2ow + 1),
 * (2oh + 1, 2ow), (2oh + 1, 2ow + 1), compared in the plane kernels' order (the same maxima and
 * indices per channel). y and idx: the output row (OW, 16). */
__attribute__((target("avx512f"), always_inline)) static inline void
max_pool2x2_nchw16c_f32(const float *x, int64_t W, int64_t oh, int64_t n_ow, float *y,
                        int64_t *idx, bool relu) {
#define LD(p) (relu ? relu16(_mm512_loadu_ps(p)) : _mm512_loadu_ps(p))
    const float *r0 = x + 2 * oh * W * 16, *r1 = r0 + W * 16;
    for (int64_t ow = 0; ow < n_ow; ow++) {
        const float *p0 = r0 + 2 * ow * 16, *p1 = r1 + 2 * ow * 16;
        const int64_t a = 2 * oh * W + 2 * ow;
        /* the same window of the next output row (or the next block's first): from memory,
         * two streams a row apart ran slower than the plain kernel's one without it */
        _mm_prefetch((const char *)(p0 + 2 * W * 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(p0 + 2 * W * 16 + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(p1 + 2 * W * 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(p1 + 2 * W * 16 + 16), _MM_HINT_T0);
        __m512 m = LD(p0);
        __m512i lo = _mm512_set1_epi64(a), hi = lo;
        pool16_take(LD(p0 + 16), a + 1, &m, &lo, &hi);
        pool16_take(LD(p1), a + W, &m, &lo, &hi);
        pool16_take(LD(p1 + 16), a + W + 1, &m, &lo, &hi);
        _mm512_storeu_ps(y + ow * 16, m);
        _mm512_storeu_si512(idx + ow * 16, lo);
        _mm512_storeu_si512(idx + ow * 16 + 8, hi);
    }
#undef LD
}

__attribute__((target("avx512f"))) void cpu_nn_max_pool2x2_nchw16c_f32(const float *x, int64_t W,
                                                                        int64_t oh, int64_t n_ow,
                                                                        float *y, int64_t *idx,
                                                                        bool relu) {
    if (relu) max_pool2x2_nchw16c_f32(x, W, oh, n_ow, y, idx, true);
    else max_pool2x2_nchw16c_f32(x, W, oh, n_ow, y, idx, false);
}

/* The backward of that pooling for one block when every index lies in its own output's tile:
 * gx's tiles (2 OH x 2 OW of a row W wide) from gy and idx (OH, OW, 16), 16 channels a step:
 * 0 + gy (the scatter's sum: -0 becomes +0, as there) at the tile position each index names,
 * 0 at the other three. false (gx partly written) at the first index outside its tile. */
__attribute__((target("avx512f"))) bool cpu_nn_max_pool2x2_bwd_nchw16c_f32(const float *gy,
                                                                           const int64_t *idx,
                                                                           int64_t W, int64_t OH,
                                                                           int64_t OW, float *gx) {
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t oh = 0; oh < OH; oh++)
        for (int64_t ow = 0; ow < OW; ow++) {
            const int64_t i = oh * OW + ow, a = 2 * oh * W + 2 * ow;
            const __m512i lo = _mm512_loadu_si512(idx + i * 16),
                          hi = _mm512_loadu_si512(idx + i * 16 + 8);
            __mmask16 e[4];
            const int64_t at[4] = {a, a + 1, a + W, a + W + 1};
            for (int j = 0; j < 4; j++) {
                const __m512i t = _mm512_set1_epi64(at[j]);
                e[j] = _mm512_kunpackb(_mm512_cmpeq_epi64_mask(hi, t),
                                       _mm512_cmpeq_epi64_mask(lo, t));
            }
            if ((__mmask16)(e[0] | e[1] | e[2] | e[3]) != 0xFFFF) return false;
            const __m512 v = _mm512_add_ps(zero, _mm512_loadu_ps(gy + i * 16));
            float *x00 = gx + a * 16, *x10 = x00 + W * 16;
            /* the next tile row's lines, for writing: two streams a row apart, as the
             * forward's reads */
            __builtin_prefetch(x00 + 2 * W * 16, 1, 3);
            __builtin_prefetch(x00 + 2 * W * 16 + 16, 1, 3);
            __builtin_prefetch(x10 + 2 * W * 16, 1, 3);
            __builtin_prefetch(x10 + 2 * W * 16 + 16, 1, 3);
            _mm512_storeu_ps(x00, _mm512_maskz_mov_ps(e[0], v));
            _mm512_storeu_ps(x00 + 16, _mm512_maskz_mov_ps(e[1], v));
            _mm512_storeu_ps(x10, _mm512_maskz_mov_ps(e[2], v));
            _mm512_storeu_ps(x10 + 16, _mm512_maskz_mov_ps(e[3], v));
        }
    return true;
}

/* 16 bf16 values (masked) widened to f32. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512
ld_bf16(__mmask16 m, const uint16_t *p) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void cpu_nn_max_pool2x2_bf16(
    const uint16_t *x, int64_t H, int64_t W, uint16_t *y, int64_t *idx, int64_t OH, int64_t OW) {
    int64_t owf = W / 2 < OW ? W / 2 : OW;
    for (int64_t oh = 0; oh < OH; oh++) {
        int64_t h0 = 2 * oh;
        uint16_t *yr = y + oh * OW;
        int64_t *ir = idx + oh * OW, ow = 0;
        if (h0 + 1 < H) {
            const uint16_t *r0 = x + h0 * W, *r1 = r0 + W;
            for (; ow < owf; ow += 16) {
                __mmask16 mo, m0, m1;
                pool2_masks(owf - ow < 16 ? owf - ow : 16, &mo, &m0, &m1);
                const uint16_t *p0 = r0 + 2 * ow, *p1 = r1 + 2 * ow;
                __m512i lo, hi;
                __m512 m = pool2_windows(ld_bf16(m0, p0), ld_bf16(m1, p0 + 16), ld_bf16(m0, p1),
                                         ld_bf16(m1, p1 + 16), h0 * W + 2 * ow, W, &lo, &hi);
                _mm512_mask_cvtepi32_storeu_epi16(yr + ow, mo,
                                                  _mm512_srli_epi32(_mm512_castps_si512(m), 16));
                _mm512_mask_storeu_epi64(ir + ow, (__mmask8)mo, lo);
                _mm512_mask_storeu_epi64(ir + ow + 8, (__mmask8)(mo >> 8), hi);
            }
            ow = owf;
        }
        for (; ow < OW; ow++) {
            ir[ow] = pool2_best(x, true, false, H, W, oh, ow);
            yr[ow] = x[ir[ow]];
        }
    }
}

__attribute__((target("avx512f"))) void cpu_nn_f32_to_bf16(const float *x, uint16_t *y,
                                                           int64_t n) {
    const __m512i lsb = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff),
                  abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  quiet = _mm512_set1_epi32(0x40);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = (__mmask16)(n - i >= 16 ? 0xFFFFu : (1u << (n - i)) - 1);
        __m512i v = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + i));
        __m512i hi = _mm512_srli_epi32(v, 16);
        __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(v, _mm512_add_epi32(half, _mm512_and_si512(hi, lsb))), 16);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, abs), inf);
        r = _mm512_mask_or_epi32(r, nan, hi, quiet);
        _mm512_mask_cvtepi32_storeu_epi16(y + i, m, r);
    }
}

/* The backward of a 2x2 / stride 2 max pooling of a bf16 plane: gx (2*OH, 2*OW) from gy and
 * idx (OH, OW) when each idx lies in its own window (the windows are disjoint, so each gx
 * element gets at most one gy: no sum). 16 windows a step: the offset of each index in its
 * window (0, 1, W, W + 1) picks which of the four gx values is gy, the other three are 0; the
 * two rows of 32 are written as 16 pairs of 16-bit values. gy's bits are stored as the f32
 * path's one rounding of 0 + gy gives them: -0 becomes +0 and a NaN is quieted. Returns false
 * at the first index outside its window, gx then partly written (the caller redoes the plane). */
__attribute__((target("avx512f,avx512bw,avx512vl"))) bool cpu_nn_max_pool2x2_bwd_bf16(
    const uint16_t *gy, const int64_t *idx, int64_t OH, int64_t OW, uint16_t *gx) {
    const int64_t W = 2 * OW;
    const __m512i lane2 = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i one = _mm512_set1_epi32(1), w0 = _mm512_set1_epi32((int)W),
                  w1 = _mm512_set1_epi32((int)W + 1), negz = _mm512_set1_epi32(0x8000),
                  abs = _mm512_set1_epi32(0x7fff), inf = _mm512_set1_epi32(0x7f80),
                  quiet = _mm512_set1_epi32(0x40);
    for (int64_t oh = 0; oh < OH; oh++) {
        const uint16_t *g = gy + oh * OW;
        const int64_t *ir = idx + oh * OW;
        uint16_t *r0 = gx + 2 * oh * W, *r1 = r0 + W;
        for (int64_t ow = 0; ow < OW; ow += 16) {
            int64_t n = OW - ow < 16 ? OW - ow : 16;
            __mmask16 mo = (__mmask16)((1u << n) - 1);
            __mmask32 m2 = (__mmask32)(n == 16 ? 0xFFFFFFFFu : (1u << 2 * n) - 1);
            __m512i base = _mm512_add_epi64(_mm512_set1_epi64(2 * oh * W + 2 * ow), lane2);
            __m512i dlo = _mm512_sub_epi64(_mm512_maskz_loadu_epi64((__mmask8)mo, ir + ow), base);
            __m512i dhi = _mm512_sub_epi64(
                _mm512_maskz_loadu_epi64((__mmask8)(mo >> 8), ir + ow + 8),
                _mm512_add_epi64(base, _mm512_set1_epi64(16)));
            /* saturated to i32: an offset beyond it matches none of 0, 1, W, W + 1 */
            __m512i d = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi64_epi32(dlo)),
                                           _mm512_cvtsepi64_epi32(dhi), 1);
            __mmask16 e0 = _mm512_cmpeq_epi32_mask(d, _mm512_setzero_si512()),
                      e1 = _mm512_cmpeq_epi32_mask(d, one), e2 = _mm512_cmpeq_epi32_mask(d, w0),
                      e3 = _mm512_cmpeq_epi32_mask(d, w1);
            if ((__mmask16)(e0 | e1 | e2 | e3) != mo) return false;
            __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mo, g + ow));
            v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epi32_mask(v, negz), _mm512_setzero_si512());
            v = _mm512_mask_or_epi32(v, _mm512_cmpgt_epu32_mask(_mm512_and_si512(v, abs), inf), v,
                                     quiet);
            __m512i a = _mm512_or_si512(_mm512_maskz_mov_epi32(e0, v),
                                        _mm512_slli_epi32(_mm512_maskz_mov_epi32(e1, v), 16));
            __m512i b = _mm512_or_si512(_mm512_maskz_mov_epi32(e2, v),
                                        _mm512_slli_epi32(_mm512_maskz_mov_epi32(e3, v), 16));
            _mm512_mask_storeu_epi16(r0 + 2 * ow, m2, a);
            _mm512_mask_storeu_epi16(r1 + 2 * ow, m2, b);
        }
    }
    return true;
}
