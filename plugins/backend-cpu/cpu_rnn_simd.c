/*
 * cpu_rnn_simd.c — vector f32 cell kernels of the fused lstm and gru ops (cpu_rnn_loops.h
 * calls them for one batch row of one step): AVX-512 (16 lanes) and AVX2 with FMA (8 lanes,
 * for CPUs without AVX-512), compiled with function target attributes from one template
 * (cpu_rnn_simd_loops.h) and chosen at run time (cpu_rnn_simd_ok and the public functions
 * below), so the plugin still runs on any x86-64.
 *
 * The gate nonlinearities take glibc's vector math library (libmvec: _ZGVeN16v_expf and
 * _ZGVeN16v_tanhf, _ZGVdN8v_expf and _ZGVdN8v_tanhf; a few ULP like libm's scalar
 * expf/tanhf): the scalar loop spent most of the LSTM step in libm's tanhf/expm1f, one
 * element at a time (on an AVX2-only CPU 23% of the whole training step). sigmoid(v) is
 * 1 / (1 + exp(-v)) as in the scalar kernel. The formulas and the workspace layout are the
 * scalar kernels' (contracts in core/ops_rnn.c); a row's last chunk (H not a multiple of the
 * width) uses masked loads and stores. Built only when configure found libmvec
 * (EM_HAVE_LIBMVEC, CPU_RNN_SIMD in cpu.h); otherwise only the scalar loops exist.
 */
#include "config.h"

#include <stdbool.h>
#include <stdint.h>

#include "cpu.h"

#if defined(EM_HAVE_LIBMVEC) && defined(__x86_64__)
#include <immintrin.h>

/* libmvec's variants (the x86_64 vector ABI names; glibc >= 2.35 for tanhf). */
__m512 _ZGVeN16v_expf(__m512 x);
__m512 _ZGVeN16v_tanhf(__m512 x);
__m256 _ZGVdN8v_expf(__m256 x);
__m256 _ZGVdN8v_tanhf(__m256 x);

/* 2: AVX-512, 1: AVX2 and FMA, 0: neither (the scalar loops). */
static int simd_level(void) {
    return cpu_nn_has_avx512() ? 2 : cpu_nn_has_avx2() ? 1 : 0;
}

bool cpu_rnn_simd_ok(void) { return simd_level() > 0; }

/* ---- AVX-512 ---- */
#define V __m512
#define M __mmask16
#define W 16
#define FN(name) name##_512
#define ATTR __attribute__((target("avx512f")))
#define MASK(left) ((left) >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (left)) - 1u))
#define LDF(p) _mm512_loadu_ps(p)
#define STF(p, v) _mm512_storeu_ps((p), (v))
#define LDM(p, m) _mm512_maskz_loadu_ps((m), (p))
#define STM(p, m, v) _mm512_mask_storeu_ps((p), (m), (v))
#define ADD _mm512_add_ps
#define SUB _mm512_sub_ps
#define MUL _mm512_mul_ps
#define DIV _mm512_div_ps
#define SET1 _mm512_set1_ps
#define ZERO _mm512_setzero_ps
#define VEXP _ZGVeN16v_expf
#define VTANH _ZGVeN16v_tanhf
#define STNT(p, v) _mm512_stream_ps((p), (v))
#define FENCE _mm_sfence
#include "cpu_rnn_simd_loops.h"

/* ---- AVX2 (masks are vectors of 0 / -1 lanes) ---- */
#define V __m256
#define M __m256i
#define W 8
#define FN(name) name##_256
#define ATTR __attribute__((target("avx2,fma")))
#define MASK(left) _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(left)), \
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define LDF(p) _mm256_loadu_ps(p)
#define STF(p, v) _mm256_storeu_ps((p), (v))
#define LDM(p, m) _mm256_maskload_ps((p), (m))
#define STM(p, m, v) _mm256_maskstore_ps((p), (m), (v))
#define ADD _mm256_add_ps
#define SUB _mm256_sub_ps
#define MUL _mm256_mul_ps
#define DIV _mm256_div_ps
#define SET1 _mm256_set1_ps
#define ZERO _mm256_setzero_ps
#define VEXP _ZGVdN8v_expf
#define VTANH _ZGVdN8v_tanhf
#define STNT(p, v) _mm256_stream_ps((p), (v))
#define FENCE _mm_sfence
#include "cpu_rnn_simd_loops.h"

void cpu_rnn_lstm_cell_f32(float *gr, const float *xr, const float *hr, const float *bias,
                           float *c, float *h, float *y, int64_t H) {
    cpu_rnn_lstm_cell_part_f32(gr, xr, hr, bias, c, h, h, y, H, 0, H);
}

void cpu_rnn_lstm_cell_part_f32(float *gr, const float *xr, const float *hr, const float *bias,
                                float *c, const float *hin, float *hout, float *y, int64_t H,
                                int64_t j0, int64_t j1) {
    if (simd_level() == 2) lstm_cell_512(gr, xr, hr, bias, c, hin, hout, y, H, j0, j1);
    else lstm_cell_256(gr, xr, hr, bias, c, hin, hout, y, H, j0, j1);
}

void cpu_rnn_lstm_cell_bwd_f32(const float *gr, const float *gy, float *dh, float *dc,
                               float *d, int64_t H) {
    cpu_rnn_lstm_cell_bwd_part_f32(gr, gy, dh, dc, d, H, 0, H);
}

void cpu_rnn_lstm_cell_bwd_part_f32(const float *gr, const float *gy, float *dh, float *dc,
                                    float *d, int64_t H, int64_t j0, int64_t j1) {
    if (simd_level() == 2) lstm_cell_bwd_512(gr, gy, dh, dc, d, H, j0, j1);
    else lstm_cell_bwd_256(gr, gy, dh, dc, d, H, j0, j1);
}

void cpu_rnn_gru_cell_f32(float *gr, const float *hr, float *h, float *y, int64_t H) {
    if (simd_level() == 2) gru_cell_512(gr, hr, h, y, H);
    else gru_cell_256(gr, hr, h, y, H);
}

/* ---- the one-thread recurrent product (AVX-512) ---------------------------------------------
 *
 * c (M, ncols) = a (M, K) b (K, ncols) (or c += a b) on b packed in panels of 16 columns,
 * each K x 16 floats (k major), zero past the matrix. Every element of c is summed the same
 * way whatever the tile, the panel or the thread it falls in: k in chunks of KC, each chunk
 * one FMA chain in k order from 0, added to the sum so far (to c's old value first when
 * accumulating). So a product split by columns among threads gives the same bits for any
 * split, and they are those of oneDNN 2.6.3's brgemm matmul (its kernels broadcast a's
 * element and FMA into a zeroed accumulator, then add it to c, in K blocks of 512 here):
 * compared bit for bit on Zen 4 with the op's oneDNN path for the forward's K = H up to 600
 * and the backward's K = 4H up to 1024 (not at 2400, where oneDNN blocks otherwise; such
 * sums agree within rounding). Tiles are RB rows by CB panels (24 of the 32 zmm registers
 * accumulate; 4 weight loads and 6 broadcasts per 24 FMAs). */
int cpu_rnn_panel_width(void) { return simd_level() == 2 ? 16 : 0; }

void cpu_rnn_pack_f32(float *p, const float *b, int64_t K, int64_t bs0, int64_t bs1, int64_t n) {
    for (int64_t c0 = 0; c0 < n; c0 += 16, p += K * 16) {
        int64_t w = n - c0 < 16 ? n - c0 : 16;
        for (int64_t k = 0; k < K; k++) {
            float *row = p + k * 16;
            int64_t l = 0;
            for (; l < w; l++) row[l] = b[k * bs0 + (c0 + l) * bs1];
            for (; l < 16; l++) row[l] = 0;
        }
    }
}

#define RB 6
#define CB 4
#define KC 512

__attribute__((target("avx512f"), always_inline)) static inline void
mm_tile_512(const float *a, int64_t lda, const float *p, int64_t K, int64_t kn, float *c,
            int64_t ldc, const __mmask16 *mk, int R, int C, bool accumulate) {
    __m512 acc[RB][CB];
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int q = 0; q < C; q++) acc[r][q] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kn; k++) {
        __m512 w[CB];
        _Pragma("GCC unroll 8") for (int q = 0; q < C; q++) w[q] = _mm512_loadu_ps(p + q * K * 16 + k * 16);
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            __m512 av = _mm512_set1_ps(a[r * lda + k]);
            _Pragma("GCC unroll 8") for (int q = 0; q < C; q++) acc[r][q] = _mm512_fmadd_ps(av, w[q], acc[r][q]);
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 8") for (int q = 0; q < C; q++) {
            float *o = c + r * ldc + q * 16;
            __m512 v = acc[r][q];
            if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mk[q], o));
            _mm512_mask_storeu_ps(o, mk[q], v);
        }
}

/* The tile of every shape up to RB x CB, with its loops unrolled. */
#define MM_TILE(R, C)                                                                           \
    __attribute__((target("avx512f"))) static void mm_tile_##R##_##C(                          \
        const float *a, int64_t lda, const float *p, int64_t K, int64_t kn, float *c,          \
        int64_t ldc, const __mmask16 *mk, bool accumulate) {                                   \
        mm_tile_512(a, lda, p, K, kn, c, ldc, mk, R, C, accumulate);                           \
    }
#define MM_TILES(R) MM_TILE(R, 1) MM_TILE(R, 2) MM_TILE(R, 3) MM_TILE(R, 4)
MM_TILES(1) MM_TILES(2) MM_TILES(3) MM_TILES(4) MM_TILES(5) MM_TILES(6)
#undef MM_TILES
#undef MM_TILE

typedef void (*mm_tile_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *,
                           int64_t, const __mmask16 *, bool);
#define MM_ROW(R) {mm_tile_##R##_1, mm_tile_##R##_2, mm_tile_##R##_3, mm_tile_##R##_4}
static const mm_tile_fn mm_tiles[RB][CB] = {MM_ROW(1), MM_ROW(2), MM_ROW(3),
                                             MM_ROW(4), MM_ROW(5), MM_ROW(6)};
#undef MM_ROW

void cpu_rnn_mm_f32(const float *a, int64_t lda, int64_t M, int64_t K, const float *p,
                    int64_t groups, int64_t n, int64_t gstride, float *c, int64_t ldc,
                    bool accumulate) {
    const int64_t kc = KC;
    int64_t np = (n + 15) / 16; /* panels per group */
    for (int64_t g = 0; g < groups; g++)
        for (int64_t p0 = 0; p0 < np; p0 += CB) {
            int C = np - p0 < CB ? (int)(np - p0) : CB;
            __mmask16 mk[CB];
            for (int q = 0; q < C; q++) {
                int64_t left = n - (p0 + q) * 16;
                mk[q] = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
            }
            const float *pp = p + (g * np + p0) * K * 16;
            float *cc = c + g * gstride + p0 * 16;
            for (int64_t m0 = 0; m0 < M; m0 += RB) {
                int R = M - m0 < RB ? (int)(M - m0) : RB;
                for (int64_t k0 = 0; k0 < K; k0 += kc) {
                    int64_t kn = K - k0 < kc ? K - k0 : kc;
                    mm_tiles[R - 1][C - 1](a + m0 * lda + k0, lda, pp + k0 * 16, K, kn,
                                           cc + m0 * ldc, ldc, mk, accumulate || k0 > 0);
                }
            }
        }
}
#undef RB
#undef CB
#undef KC

#endif
