/*
 * cpu_rnn_simd.c — AVX-512 f32 cell kernels of the fused lstm and gru ops (cpu_rnn_loops.h
 * calls them for one batch row of one step), compiled with a function target attribute and
 * chosen at run time (cpu_nn_has_avx512, cpu_nn_simd.c), so the plugin still runs on CPUs without AVX-512.
 *
 * The gate nonlinearities take glibc's vector math library (libmvec: _ZGVeN16v_expf and
 * _ZGVeN16v_tanhf, 16 lanes, a few ULP like libm's scalar expf/tanhf): the scalar loop spent
 * most of the LSTM step in libm's tanhf/expm1f, one element at a time. sigmoid(v) is
 * 1 / (1 + exp(-v)) as in the scalar kernel. The formulas and the workspace layout are the
 * scalar kernels' (contracts in core/ops_rnn.c); a row's last chunk (H not a multiple of 16)
 * uses masked loads and stores. Built only when configure found libmvec (EM_HAVE_LIBMVEC,
 * CPU_RNN_SIMD in cpu.h); otherwise only the scalar loops exist.
 */
#include "config.h"

#include <stdbool.h>
#include <stdint.h>

#include "cpu.h"

#if defined(EM_HAVE_LIBMVEC) && defined(__x86_64__)
#include <immintrin.h>

/* libmvec's AVX-512 variants (the x86_64 vector ABI names; glibc >= 2.35 for tanhf). */
__m512 _ZGVeN16v_expf(__m512 x);
__m512 _ZGVeN16v_tanhf(__m512 x);

#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 v_sig(__m512 v) {
    const __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_div_ps(one, _mm512_add_ps(one, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_setzero_ps(), v))));
}

AVX512 static inline __mmask16 lanes(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

#define LD(p) _mm512_maskz_loadu_ps(m, (p))
#define ST(p, v) _mm512_mask_storeu_ps((p), m, (v))

AVX512 void cpu_rnn_lstm_cell_f32(float *gr, const float *xr, const float *hr,
                                  const float *bias, float *c, float *h, float *y, int64_t H) {
#define PRE(q)                                                                                 \
    _mm512_add_ps(_mm512_add_ps(LD(xr + (q) * H + j), LD(hr + (q) * H + j)),                   \
                  bias ? LD(bias + (q) * H + j) : _mm512_setzero_ps())
    for (int64_t j = 0; j < H; j += 16) {
        __mmask16 m = lanes(H - j);
        __m512 ig = v_sig(PRE(0)), fg = v_sig(PRE(1));
        __m512 gg = _ZGVeN16v_tanhf(PRE(2)), og = v_sig(PRE(3));
        __m512 cp = LD(c + j), hp = LD(h + j);
        __m512 cn = _mm512_add_ps(_mm512_mul_ps(fg, cp), _mm512_mul_ps(ig, gg));
        __m512 hn = _mm512_mul_ps(og, _ZGVeN16v_tanhf(cn));
        ST(gr + j, ig), ST(gr + H + j, fg), ST(gr + 2 * H + j, gg), ST(gr + 3 * H + j, og);
        ST(gr + 4 * H + j, cp), ST(gr + 5 * H + j, hp);
        ST(c + j, cn), ST(h + j, hn), ST(y + j, hn);
    }
#undef PRE
}

AVX512 void cpu_rnn_lstm_cell_bwd_f32(const float *gr, const float *gy, float *dh, float *dc,
                                      float *d, int64_t H) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t j = 0; j < H; j += 16) {
        __mmask16 m = lanes(H - j);
        __m512 ig = LD(gr + j), fg = LD(gr + H + j), gg = LD(gr + 2 * H + j),
               og = LD(gr + 3 * H + j), cp = LD(gr + 4 * H + j);
        __m512 tc = _ZGVeN16v_tanhf(_mm512_add_ps(_mm512_mul_ps(fg, cp), _mm512_mul_ps(ig, gg)));
        __m512 dht = LD(dh + j);
        if (gy) dht = _mm512_add_ps(dht, LD(gy + j));
        __m512 dct = _mm512_add_ps(
            LD(dc + j), _mm512_mul_ps(_mm512_mul_ps(dht, og),
                                      _mm512_sub_ps(one, _mm512_mul_ps(tc, tc))));
        ST(d + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dct, gg), ig), _mm512_sub_ps(one, ig)));
        ST(d + H + j,
           _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dct, cp), fg), _mm512_sub_ps(one, fg)));
        ST(d + 2 * H + j, _mm512_mul_ps(_mm512_mul_ps(dct, ig),
                                        _mm512_sub_ps(one, _mm512_mul_ps(gg, gg))));
        ST(d + 3 * H + j,
           _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(dht, tc), og), _mm512_sub_ps(one, og)));
        ST(dc + j, _mm512_mul_ps(dct, fg));
        ST(dh + j, _mm512_setzero_ps());
    }
}

AVX512 void cpu_rnn_gru_cell_f32(float *gr, const float *hr, float *h, float *y, int64_t H) {
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t j = 0; j < H; j += 16) {
        __mmask16 m = lanes(H - j);
        __m512 r = v_sig(_mm512_add_ps(LD(gr + j), LD(hr + j)));
        __m512 z = v_sig(_mm512_add_ps(LD(gr + H + j), LD(hr + H + j)));
        __m512 nl = LD(hr + 2 * H + j), hp = LD(h + j);
        __m512 n = _ZGVeN16v_tanhf(_mm512_add_ps(LD(gr + 2 * H + j), _mm512_mul_ps(r, nl)));
        __m512 hn = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(one, z), n), _mm512_mul_ps(z, hp));
        ST(gr + j, r), ST(gr + H + j, z), ST(gr + 2 * H + j, n), ST(gr + 3 * H + j, nl);
        ST(gr + 4 * H + j, hp);
        ST(h + j, hn), ST(y + j, hn);
    }
}

#undef LD
#undef ST

#endif
