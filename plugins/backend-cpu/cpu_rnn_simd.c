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
    if (simd_level() == 2) lstm_cell_512(gr, xr, hr, bias, c, h, y, H);
    else lstm_cell_256(gr, xr, hr, bias, c, h, y, H);
}

void cpu_rnn_lstm_cell_bwd_f32(const float *gr, const float *gy, float *dh, float *dc,
                               float *d, int64_t H) {
    if (simd_level() == 2) lstm_cell_bwd_512(gr, gy, dh, dc, d, H);
    else lstm_cell_bwd_256(gr, gy, dh, dc, d, H);
}

void cpu_rnn_gru_cell_f32(float *gr, const float *hr, float *h, float *y, int64_t H) {
    if (simd_level() == 2) gru_cell_512(gr, hr, h, y, H);
    else gru_cell_256(gr, hr, h, y, H);
}

#endif
