/*
 * cpu_math.c — CPU kernels for the elementwise math ops (core/ops_math.c states their
 * contracts): unary math and activations, erf and erfinv, clamp, the scalar variants, pow,
 * maximum, minimum, division with a rounding mode, comparisons, logical ops, where, and the
 * activations' backward helpers.
 *
 * Layout of each op: an f32 loop whose contiguous runs go to a function the compiler
 * vectorises (`omp simd`), built for AVX-512, AVX2 and baseline x86-64 with target_clones and
 * picked at load time by the CPU (glibc's ifunc); an f64 loop; integer loops where the op has
 * them. f16 and bf16 go through the f32 loop in blocks of 256 converted elements, so they
 * compute in float and round once.
 *
 * Transcendentals vectorise through glibc's libmvec: GCC calls _ZGVeN16v_expf and friends
 * only for functions declared `omp declare simd`, which glibc's <math.h> does under
 * -ffast-math alone. We declare them here instead (without -ffast-math: NaN, infinities,
 * signed zeros and errno-free semantics of the scalar functions are kept, the vector
 * functions are within a few ulp; tests/test_ops_math.c checks them against NumPy's ULP
 * tables). sqrtf does not vectorise without -fno-math-errno, so sqrt and rsqrt use SSE's
 * sqrtps directly (correctly rounded like sqrtf).
 *
 * Integer arithmetic is done in unsigned types so that overflow wraps, as in PyTorch.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu.h"
#include "../common/scalar_math.h"

#if defined(__x86_64__) && defined(__GLIBC__) && defined(_OPENMP) && !defined(__clang__) &&   \
    !defined(__FAST_MATH__)
#if __GLIBC_PREREQ(2, 35)
/* The vector variants exported by libmvec (linked through libm's linker script). */
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float log1pf(float);
#pragma omp declare simd notinbranch
float expm1f(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float powf(float, float);
#endif
#endif


/* Per-call parameters of a loop: attributes as floats (d) and as saturated integers (i). */
typedef struct mctx {
    double d0, d1;
    int64_t i0, i1;
    int mode;
} mctx;

static int64_t sat_i64(double v) {
    if (v != v) return 0;
    if (v >= 0x1p63) return INT64_MAX;
    if (v <= -0x1p63) return INT64_MIN;
    return (int64_t)v;
}

#define LD_ID(x) (x)
#define ST_ID(x) (x)
#define P_F(c, f) ((c)->d##f)
#define P_I(c, f) ((c)->i##f)

/* ---- generic loops -------------------------------------------------------------------------- */

/* o = EXPR(x) over a run; p[0] the output (type OT), p[1] the input (type T, computed as CT
 * after LD). p0 and p1 are the parameters as CT. */
#define LOOP1(name, sfx, T, CT, LD, OT, ST, PRM, EXPR)                                         \
    static void name##_##sfx(char **p, const int64_t *s, int64_t n, void *vc) {                \
        const mctx *c = vc;                                                                    \
        const CT p0 = (CT)PRM(c, 0), p1 = (CT)PRM(c, 1);                                       \
        (void)p0, (void)p1;                                                                    \
        if (s[0] == (int64_t)sizeof(OT) && s[1] == (int64_t)sizeof(T)) {                       \
            OT *o = (OT *)p[0];                                                                \
            const T *a = (const T *)p[1];                                                      \
            for (int64_t i = 0; i < n; i++) {                                                  \
                CT x = LD(a[i]);                                                               \
                o[i] = ST(EXPR);                                                               \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                      \
            CT x = LD(*(const T *)(p[1] + i * s[1]));                                          \
            *(OT *)(p[0] + i * s[0]) = ST(EXPR);                                               \
        }                                                                                      \
    }

/* o = EXPR(x, y) over a run; p[1], p[2] the inputs. */
#define LOOP2(name, sfx, T, CT, LD, OT, ST, PRM, EXPR)                                         \
    static void name##_##sfx(char **p, const int64_t *s, int64_t n, void *vc) {                \
        const mctx *c = vc;                                                                    \
        const CT p0 = (CT)PRM(c, 0), p1 = (CT)PRM(c, 1);                                       \
        (void)p0, (void)p1;                                                                    \
        const int64_t e = (int64_t)sizeof(T);                                                  \
        if (s[0] == (int64_t)sizeof(OT) && s[1] == e && (s[2] == e || s[2] == 0)) {            \
            OT *o = (OT *)p[0];                                                                \
            const T *a = (const T *)p[1], *b = (const T *)p[2];                                \
            if (s[2] == 0) {                                                                   \
                const CT y = LD(b[0]);                                                         \
                for (int64_t i = 0; i < n; i++) {                                              \
                    CT x = LD(a[i]);                                                           \
                    o[i] = ST(EXPR);                                                           \
                }                                                                              \
            } else {                                                                           \
                for (int64_t i = 0; i < n; i++) {                                              \
                    CT x = LD(a[i]), y = LD(b[i]);                                             \
                    o[i] = ST(EXPR);                                                           \
                }                                                                              \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                      \
            CT x = LD(*(const T *)(p[1] + i * s[1])), y = LD(*(const T *)(p[2] + i * s[2]));   \
            *(OT *)(p[0] + i * s[0]) = ST(EXPR);                                               \
        }                                                                                      \
    }

/* f32 in a vectorised, CPU-dispatched function, in blocks of FAST_BLOCK elements: a short tail
 * is padded to a whole block and strided operands are gathered into one, so every element goes
 * through the same vector code whatever the layout (a transposed, sliced or expanded input
 * gives the bits of its contiguous copy; a scalar epilogue would round differently). */
#define FAST_BLOCK 16
#define FAST1(name, OT, EXPR)                                                                  \
    static inline __attribute__((always_inline)) void name##_f32_blk(OT *o, const float *a,    \
                                                                     float p0, float p1) {     \
        (void)p0, (void)p1;                                                                    \
        _Pragma("omp simd") for (int i = 0; i < FAST_BLOCK; i++) {                             \
            float x = a[i];                                                                    \
            o[i] = (EXPR);                                                                     \
        }                                                                                      \
    }                                                                                          \
    SIMD_CLONES static void name##_f32_run(OT *o, const float *a, int64_t n, float p0,         \
                                           float p1) {                                         \
        int64_t i = 0;                                                                         \
        for (; i + FAST_BLOCK <= n; i += FAST_BLOCK) name##_f32_blk(o + i, a + i, p0, p1);     \
        if (i < n) {                                                                           \
            float ta[FAST_BLOCK] = {0};                                                        \
            OT to[FAST_BLOCK];                                                                 \
            memcpy(ta, a + i, sizeof(float) * (size_t)(n - i));                                \
            name##_f32_blk(to, ta, p0, p1);                                                    \
            memcpy(o + i, to, sizeof(OT) * (size_t)(n - i));                                   \
        }                                                                                      \
    }                                                                                          \
    SIMD_CLONES static void name##_f32_gather(char **p, const int64_t *s, int64_t n, float p0, \
                                              float p1) {                                      \
        float ta[FAST_BLOCK] = {0};                                                            \
        OT to[FAST_BLOCK];                                                                     \
        for (int64_t i = 0; i < n; i += FAST_BLOCK) {                                          \
            int m = n - i < FAST_BLOCK ? (int)(n - i) : FAST_BLOCK;                            \
            for (int j = 0; j < m; j++) ta[j] = *(const float *)(p[1] + (i + j) * s[1]);       \
            name##_f32_blk(to, ta, p0, p1);                                                    \
            for (int j = 0; j < m; j++) *(OT *)(p[0] + (i + j) * s[0]) = to[j];                \
        }                                                                                      \
    }                                                                                          \
    static void name##_f32(char **p, const int64_t *s, int64_t n, void *vc) {                  \
        const mctx *c = vc;                                                                    \
        const float p0 = (float)c->d0, p1 = (float)c->d1;                                      \
        if (s[0] == (int64_t)sizeof(OT) && s[1] == 4)                                          \
            name##_f32_run((OT *)p[0], (const float *)p[1], n, p0, p1);                        \
        else                                                                                   \
            name##_f32_gather(p, s, n, p0, p1);                                                \
    }

#define FAST2(name, OT, EXPR)                                                                  \
    static inline __attribute__((always_inline)) void name##_f32_blk(                          \
        OT *o, const float *a, const float *b, float p0, float p1) {                           \
        (void)p0, (void)p1;                                                                    \
        _Pragma("omp simd") for (int i = 0; i < FAST_BLOCK; i++) {                             \
            float x = a[i], y = b[i];                                                          \
            o[i] = (EXPR);                                                                     \
        }                                                                                      \
    }                                                                                          \
    SIMD_CLONES static void name##_f32_run(OT *o, const float *a, const float *b, int64_t n,   \
                                           float p0, float p1) {                               \
        int64_t i = 0;                                                                         \
        for (; i + FAST_BLOCK <= n; i += FAST_BLOCK)                                           \
            name##_f32_blk(o + i, a + i, b + i, p0, p1);                                       \
        if (i < n) {                                                                           \
            float ta[FAST_BLOCK] = {0}, tb[FAST_BLOCK] = {0};                                  \
            OT to[FAST_BLOCK];                                                                 \
            memcpy(ta, a + i, sizeof(float) * (size_t)(n - i));                                \
            memcpy(tb, b + i, sizeof(float) * (size_t)(n - i));                                \
            name##_f32_blk(to, ta, tb, p0, p1);                                                \
            memcpy(o + i, to, sizeof(OT) * (size_t)(n - i));                                   \
        }                                                                                      \
    }                                                                                          \
    SIMD_CLONES static void name##_f32_run_s(OT *o, const float *a, float y, int64_t n,        \
                                             float p0, float p1) {                             \
        float ta[FAST_BLOCK] = {0}, tb[FAST_BLOCK];                                            \
        OT to[FAST_BLOCK];                                                                     \
        for (int j = 0; j < FAST_BLOCK; j++) tb[j] = y;                                        \
        int64_t i = 0;                                                                         \
        for (; i + FAST_BLOCK <= n; i += FAST_BLOCK) name##_f32_blk(o + i, a + i, tb, p0, p1); \
        if (i < n) {                                                                           \
            memcpy(ta, a + i, sizeof(float) * (size_t)(n - i));                                \
            name##_f32_blk(to, ta, tb, p0, p1);                                                \
            memcpy(o + i, to, sizeof(OT) * (size_t)(n - i));                                   \
        }                                                                                      \
    }                                                                                          \
    SIMD_CLONES static void name##_f32_gather(char **p, const int64_t *s, int64_t n, float p0, \
                                              float p1) {                                      \
        float ta[FAST_BLOCK] = {0}, tb[FAST_BLOCK] = {0};                                      \
        OT to[FAST_BLOCK];                                                                     \
        for (int64_t i = 0; i < n; i += FAST_BLOCK) {                                          \
            int m = n - i < FAST_BLOCK ? (int)(n - i) : FAST_BLOCK;                            \
            for (int j = 0; j < m; j++) {                                                      \
                ta[j] = *(const float *)(p[1] + (i + j) * s[1]);                               \
                tb[j] = *(const float *)(p[2] + (i + j) * s[2]);                               \
            }                                                                                  \
            name##_f32_blk(to, ta, tb, p0, p1);                                                \
            for (int j = 0; j < m; j++) *(OT *)(p[0] + (i + j) * s[0]) = to[j];                \
        }                                                                                      \
    }                                                                                          \
    static void name##_f32(char **p, const int64_t *s, int64_t n, void *vc) {                  \
        const mctx *c = vc;                                                                    \
        const float p0 = (float)c->d0, p1 = (float)c->d1;                                      \
        if (s[0] == (int64_t)sizeof(OT) && s[1] == 4 && s[2] == 4)                             \
            name##_f32_run((OT *)p[0], (const float *)p[1], (const float *)p[2], n, p0, p1);   \
        else if (s[0] == (int64_t)sizeof(OT) && s[1] == 4 && s[2] == 0)                        \
            name##_f32_run_s((OT *)p[0], (const float *)p[1], *(const float *)p[2], n, p0, p1); \
        else                                                                                   \
            name##_f32_gather(p, s, n, p0, p1);                                                \
    }

/* f16 and bf16 through the f32 loop: blocks of 256 elements are converted to float (the
 * operands in `half`, a bit per operand, 0 = output), run, and the output converted back. */
#define HALF_BLOCK 256
static void via_f32(char **p, const int64_t *s, int64_t n, void *c, cpu_loop_fn f32, int nops,
                    unsigned half, bool bf) {
    float buf[4][HALF_BLOCK];
    for (int64_t i0 = 0; i0 < n; i0 += HALF_BLOCK) {
        int64_t m = cpu_min_i64(HALF_BLOCK, n - i0);
        char *q[4];
        int64_t qs[4];
        for (int k = 0; k < nops; k++) {
            char *src = p[k] + i0 * s[k];
            if (!(half >> k & 1)) {
                q[k] = src, qs[k] = s[k];
                continue;
            }
            q[k] = (char *)buf[k], qs[k] = 4;
            if (k == 0) continue;
            for (int64_t i = 0; i < m; i++) {
                uint16_t h = *(const uint16_t *)(src + i * s[k]);
                buf[k][i] = bf ? cpu_b2f(h) : cpu_h2f(h);
            }
        }
        f32(q, qs, m, c);
        if (half & 1)
            for (int64_t i = 0; i < m; i++)
                *(uint16_t *)(p[0] + (i0 + i) * s[0]) = bf ? cpu_f2b(buf[0][i])
                                                           : cpu_f2h(buf[0][i]);
    }
}

#define HALF(name, nops, mask)                                                                 \
    static void name##_f16(char **p, const int64_t *s, int64_t n, void *c) {                   \
        via_f32(p, s, n, c, name##_f32, nops, mask, false);                                    \
    }                                                                                          \
    static void name##_bf16(char **p, const int64_t *s, int64_t n, void *c) {                  \
        via_f32(p, s, n, c, name##_f32, nops, mask, true);                                     \
    }

/* A floating unary op: f32 (fast), f64, f16, bf16. */
#define UNARY_FLOAT(name, EXPR_F, EXPR_D)                                                      \
    FAST1(name, float, EXPR_F)                                                                 \
    LOOP1(name, f64, double, double, LD_ID, double, ST_ID, P_F, EXPR_D)                        \
    HALF(name, 2, 3u)

/* A floating binary op. */
#define BINARY_FLOAT(name, EXPR_F, EXPR_D)                                                     \
    FAST2(name, float, EXPR_F)                                                                 \
    LOOP2(name, f64, double, double, LD_ID, double, ST_ID, P_F, EXPR_D)                        \
    HALF(name, 3, 7u)

/* Integer variants (wrapping arithmetic in the unsigned CT). */
#define INTS1(name, EXPR)                                                                      \
    LOOP1(name, i32, int32_t, uint32_t, LD_ID, int32_t, ST_ID, P_I, EXPR)                      \
    LOOP1(name, i64, int64_t, uint64_t, LD_ID, int64_t, ST_ID, P_I, EXPR)                      \
    LOOP1(name, u8, uint8_t, uint8_t, LD_ID, uint8_t, ST_ID, P_I, EXPR)
#define INTS2(name, EXPR)                                                                      \
    LOOP2(name, i32, int32_t, uint32_t, LD_ID, int32_t, ST_ID, P_I, EXPR)                      \
    LOOP2(name, i64, int64_t, uint64_t, LD_ID, int64_t, ST_ID, P_I, EXPR)                      \
    LOOP2(name, u8, uint8_t, uint8_t, LD_ID, uint8_t, ST_ID, P_I, EXPR)

/* ---- loop tables and the kernel runner -------------------------------------------------------- */

typedef struct loop_table {
    cpu_loop_fn fn[EM_DTYPE_COUNT];
} loop_table;

#define T_FLOAT(name)                                                                          \
    [EM_F32] = name##_f32, [EM_F64] = name##_f64, [EM_F16] = name##_f16,                       \
    [EM_BF16] = name##_bf16
#define T_INTS(name) [EM_I32] = name##_i32, [EM_I64] = name##_i64, [EM_U8] = name##_u8

/* Run the loop of the dispatch dtype over (out, in...) with the op's parameters. */
static em_status run(const em_kernel_ctx *k, const loop_table *t, em_dtype dt, const mctx *c) {
    cpu_loop_fn fn = t->fn[dt];
    if (!fn)
        return em_set_error(EM_ERR_DTYPE, "%s: the CPU kernel has no loop for %s",
                            em_op_name(k->op), em_dtype_name(dt));
    const em_ktensor *ts[4] = {&k->out[0]};
    for (int i = 0; i < k->n_in; i++) ts[1 + i] = &k->in[i];
    cpu_foreach(k, 1 + k->n_in, ts, fn, (void *)c, CPU_GRAIN);
    return EM_OK;
}

/* Parameters from the op's float attributes (absent: `dflt`). */
static mctx params(const em_kernel_ctx *k, int nattrs, double dflt) {
    mctx c = {0};
    if (nattrs > 0)
        c.d0 = k->attrs[0].type == EM_ATTR_FLOAT ? k->attrs[0].v.f : dflt;
    if (nattrs > 1)
        c.d1 = k->attrs[1].type == EM_ATTR_FLOAT ? k->attrs[1].v.f : dflt;
    c.i0 = sat_i64(c.d0);
    c.i1 = sat_i64(c.d1);
    return c;
}

#define KERNEL(name, nattrs, dflt)                                                             \
    static em_status k_##name(const em_kernel_ctx *k) {                                        \
        mctx c = params(k, nattrs, dflt);                                                      \
        return run(k, &t_##name, k->in[0].dtype, &c);                                          \
    }

/* ---- unary math -------------------------------------------------------------------------------- */

#if defined(__SSE2__)
/* sqrt and 1/sqrt of a contiguous run with SSE's correctly rounded sqrtps (sqrtf itself does
 * not vectorise while it may set errno). */
SIMD_CLONES static void sqrt_f32_run(float *o, const float *a, int64_t n, float p0, float p1) {
    (void)p0, (void)p1;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(o + i, _mm_sqrt_ps(_mm_loadu_ps(a + i)));
    for (; i < n; i++) o[i] = sqrtf(a[i]);
}
SIMD_CLONES static void rsqrt_f32_run(float *o, const float *a, int64_t n, float p0, float p1) {
    (void)p0, (void)p1;
    int64_t i = 0;
    const __m128 one = _mm_set1_ps(1.0f);
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(o + i, _mm_div_ps(one, _mm_sqrt_ps(_mm_loadu_ps(a + i))));
    for (; i < n; i++) o[i] = 1.0f / sqrtf(a[i]);
}
#else
static void sqrt_f32_run(float *o, const float *a, int64_t n, float p0, float p1) {
    (void)p0, (void)p1;
    for (int64_t i = 0; i < n; i++) o[i] = sqrtf(a[i]);
}
static void rsqrt_f32_run(float *o, const float *a, int64_t n, float p0, float p1) {
    (void)p0, (void)p1;
    for (int64_t i = 0; i < n; i++) o[i] = 1.0f / sqrtf(a[i]);
}
#endif
#define STRIDED_F32(name, EXPR)                                                                \
    static void name##_f32(char **p, const int64_t *s, int64_t n, void *vc) {                  \
        (void)vc;                                                                              \
        if (s[0] == 4 && s[1] == 4) {                                                          \
            name##_f32_run((float *)p[0], (const float *)p[1], n, 0, 0);                       \
            return;                                                                            \
        }                                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                      \
            float x = *(const float *)(p[1] + i * s[1]);                                       \
            *(float *)(p[0] + i * s[0]) = (EXPR);                                              \
        }                                                                                      \
    }
STRIDED_F32(sqrt, sqrtf(x))
STRIDED_F32(rsqrt, 1.0f / sqrtf(x))
LOOP1(sqrt, f64, double, double, LD_ID, double, ST_ID, P_F, sqrt(x))
LOOP1(rsqrt, f64, double, double, LD_ID, double, ST_ID, P_F, 1.0 / sqrt(x))
HALF(sqrt, 2, 3u)
HALF(rsqrt, 2, 3u)

UNARY_FLOAT(reciprocal, 1.0f / x, 1.0 / x)
UNARY_FLOAT(sigmoid, 1.0f / (1.0f + expf(-x)), 1.0 / (1.0 + exp(-x)))
UNARY_FLOAT(tanh, tanhf(x), tanh(x))
UNARY_FLOAT(log1p, log1pf(x), log1p(x))
UNARY_FLOAT(expm1, expm1f(x), expm1(x))
/* exp and log (declared in ops.c, scalar kernels in cpu_elementwise.c): the vectorised f32
 * and f16/bf16 loops are registered above those at priority 1. */
UNARY_FLOAT(exp, expf(x), exp(x))
UNARY_FLOAT(log, logf(x), log(x))

UNARY_FLOAT(abs, fabsf(x), fabs(x))
/* abs of the most negative int32/int64 wraps to itself (unsigned negation). */
LOOP1(abs, i32, int32_t, int32_t, LD_ID, int32_t, ST_ID, P_I,
      x < 0 ? (int32_t)(0u - (uint32_t)x) : x)
LOOP1(abs, i64, int64_t, int64_t, LD_ID, int64_t, ST_ID, P_I,
      x < 0 ? (int64_t)(0ull - (uint64_t)x) : x)
LOOP1(abs, u8, uint8_t, uint8_t, LD_ID, uint8_t, ST_ID, P_I, x)

/* sign(NaN) = 0, sign(-0) = +0 (PyTorch's (0 < x) - (x < 0)). */
UNARY_FLOAT(sign, (float)((x > 0) - (x < 0)), (double)((x > 0) - (x < 0)))
LOOP1(sign, i32, int32_t, int32_t, LD_ID, int32_t, ST_ID, P_I, (int32_t)((x > 0) - (x < 0)))
LOOP1(sign, i64, int64_t, int64_t, LD_ID, int64_t, ST_ID, P_I, (int64_t)((x > 0) - (x < 0)))
LOOP1(sign, u8, uint8_t, uint8_t, LD_ID, uint8_t, ST_ID, P_I, (uint8_t)(x > 0))
LOOP1(sign, bool, bool, bool, LD_ID, bool, ST_ID, P_I, x)

UNARY_FLOAT(erf, erff(x), erf(x))

UNARY_FLOAT(erfinv, (float)sc_erfinv_d((double)x), sc_erfinv_d(x))

static const loop_table t_sqrt = {{T_FLOAT(sqrt)}}, t_rsqrt = {{T_FLOAT(rsqrt)}},
                        t_reciprocal = {{T_FLOAT(reciprocal)}}, t_sigmoid = {{T_FLOAT(sigmoid)}},
                        t_tanh = {{T_FLOAT(tanh)}}, t_log1p = {{T_FLOAT(log1p)}},
                        t_expm1 = {{T_FLOAT(expm1)}}, t_exp = {{T_FLOAT(exp)}},
                        t_log = {{T_FLOAT(log)}}, t_abs = {{T_FLOAT(abs), T_INTS(abs)}},
                        t_sign = {{T_FLOAT(sign), T_INTS(sign), [EM_BOOL] = sign_bool}},
                        t_erf = {{T_FLOAT(erf)}}, t_erfinv = {{T_FLOAT(erfinv)}};
KERNEL(erf, 0, 0)
KERNEL(erfinv, 0, 0)
KERNEL(sqrt, 0, 0)
KERNEL(rsqrt, 0, 0)
KERNEL(reciprocal, 0, 0)
KERNEL(sigmoid, 0, 0)
KERNEL(tanh, 0, 0)
KERNEL(log1p, 0, 0)
KERNEL(expm1, 0, 0)
KERNEL(exp, 0, 0)
KERNEL(log, 0, 0)
KERNEL(abs, 0, 0)
KERNEL(sign, 0, 0)

/* ---- activations ------------------------------------------------------------------------------- */

#define SQRT1_2 0.70710678118654752440
#define SQRT_2_PI 0.79788456080286535588 /* sqrt(2 / pi) */
#define INV_SQRT_2PI 0.39894228040143267794 /* 1 / sqrt(2 pi) */
#define GELU_K 0.044715

UNARY_FLOAT(gelu_erf, 0.5f * x * (1.0f + erff(x * (float)SQRT1_2)),
            0.5 * x * (1.0 + erf(x * SQRT1_2)))
UNARY_FLOAT(gelu_tanh,
            0.5f * x * (1.0f + tanhf((float)SQRT_2_PI * (x + (float)GELU_K * x * x * x))),
            0.5 * x * (1.0 + tanh(SQRT_2_PI * (x + GELU_K * x * x * x))))
UNARY_FLOAT(silu, x / (1.0f + expf(-x)), x / (1.0 + exp(-x)))
UNARY_FLOAT(leaky_relu, x > 0 ? x : x * p0, x > 0 ? x : x * p0)

static const loop_table t_gelu_erf = {{T_FLOAT(gelu_erf)}}, t_gelu_tanh = {{T_FLOAT(gelu_tanh)}},
                        t_silu = {{T_FLOAT(silu)}}, t_leaky_relu = {{T_FLOAT(leaky_relu)}};
KERNEL(silu, 0, 0)
KERNEL(leaky_relu, 1, 0.01)

/* The approximate attribute: 0 "none" (or absent), 1 "tanh", -1 anything else. */
static int gelu_mode(const em_kernel_ctx *k) {
    const em_attr *a = &k->attrs[0];
    if (a->type == EM_ATTR_NONE) return 0;
    if (a->type != EM_ATTR_STRING || !a->v.s) return -1;
    return strcmp(a->v.s, "none") == 0 ? 0 : strcmp(a->v.s, "tanh") == 0 ? 1 : -1;
}

static em_status bad_mode(const em_kernel_ctx *k) {
    return em_set_error(EM_ERR_INVALID, "%s: approximate must be \"none\" or \"tanh\"",
                        em_op_name(k->op));
}

static em_status k_gelu(const em_kernel_ctx *k) {
    int m = gelu_mode(k);
    if (m < 0) return bad_mode(k);
    mctx c = {0};
    return run(k, m ? &t_gelu_tanh : &t_gelu_erf, k->in[0].dtype, &c);
}

/* ---- clamp ------------------------------------------------------------------------------------- */

/* lo then hi, so min > max gives max; NaN x stays NaN and a NaN bound compares false. Absent
 * bounds are -+inf (floats) or the type's range (integers). */
#define CLAMP(x, lo, hi) (((x) < (lo) ? (lo) : (x)) > (hi) ? (hi) : ((x) < (lo) ? (lo) : (x)))
UNARY_FLOAT(clamp, CLAMP(x, p0, p1), CLAMP(x, p0, p1))
LOOP1(clamp, i32, int32_t, int32_t, LD_ID, int32_t, ST_ID, P_I, CLAMP(x, p0, p1))
LOOP1(clamp, i64, int64_t, int64_t, LD_ID, int64_t, ST_ID, P_I, CLAMP(x, p0, p1))
LOOP1(clamp, u8, uint8_t, uint8_t, LD_ID, uint8_t, ST_ID, P_I, CLAMP(x, p0, p1))
/* Both bounds given and one of them NaN: NaN everywhere (p0 is NaN). */
UNARY_FLOAT(fill_nan, x - x + p0, x - x + p0)
static const loop_table t_clamp = {{T_FLOAT(clamp), T_INTS(clamp)}},
                        t_fill_nan = {{T_FLOAT(fill_nan)}};

static int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

static em_status k_clamp(const em_kernel_ctx *k) {
    bool has_lo = k->attrs[0].type == EM_ATTR_FLOAT, has_hi = k->attrs[1].type == EM_ATTR_FLOAT;
    double lo = has_lo ? k->attrs[0].v.f : -INFINITY, hi = has_hi ? k->attrs[1].v.f : INFINITY;
    mctx c = {.d0 = lo, .d1 = hi};
    em_dtype dt = k->in[0].dtype;
    if (has_lo && has_hi && (isnan(lo) || isnan(hi)) && em_dtype_is_floating(dt)) {
        c.d0 = NAN;
        return run(k, &t_fill_nan, dt, &c);
    }
    /* Integer bounds saturate to the dtype's range. */
    int64_t tmin = dt == EM_I32 ? INT32_MIN : dt == EM_U8 ? 0 : INT64_MIN;
    int64_t tmax = dt == EM_I32 ? INT32_MAX : dt == EM_U8 ? UINT8_MAX : INT64_MAX;
    c.i0 = has_lo ? min_i64(max_i64(sat_i64(lo), tmin), tmax) : tmin;
    c.i1 = has_hi ? min_i64(max_i64(sat_i64(hi), tmin), tmax) : tmax;
    return run(k, &t_clamp, dt, &c);
}

/* ---- scalar arithmetic --------------------------------------------------------------------------- */

/* x op value; the value arrives as p0 (float, or int64 truncated then wrapped to the width). */
#define SCALAR_OP(name, EXPR_F, EXPR_I)                                                        \
    UNARY_FLOAT(name, EXPR_F, EXPR_F)                                                          \
    INTS1(name, EXPR_I)
SCALAR_OP(add_scalar, x + p0, x + p0)
SCALAR_OP(sub_scalar, x - p0, x - p0)
SCALAR_OP(mul_scalar, x * p0, x * p0)
UNARY_FLOAT(div_scalar, x / p0, x / p0)
static const loop_table t_add_scalar = {{T_FLOAT(add_scalar), T_INTS(add_scalar)}},
                        t_sub_scalar = {{T_FLOAT(sub_scalar), T_INTS(sub_scalar)}},
                        t_mul_scalar = {{T_FLOAT(mul_scalar), T_INTS(mul_scalar)}},
                        t_div_scalar = {{T_FLOAT(div_scalar)}};
KERNEL(add_scalar, 1, 0)
KERNEL(sub_scalar, 1, 0)
KERNEL(mul_scalar, 1, 0)
KERNEL(div_scalar, 1, 1)

/* Integer power by squaring, wrapping; a negative exponent gives 1/b truncated. */
static inline uint64_t ipow(int64_t b, int64_t e) {
    if (e < 0) return b == 1 ? 1u : b == -1 ? ((e & 1) ? (uint64_t)-1 : 1u) : 0u;
    uint64_t r = 1, x = (uint64_t)b;
    while (e) {
        if (e & 1) r *= x;
        x *= x;
        e >>= 1;
    }
    return r;
}

/* pow with a scalar exponent, as PyTorch: 2, 3, 0.5, -0.5, -1, -2 are done with products,
 * sqrt and division (so pow(-0, 0.5) = -0 like sqrt), other exponents with pow(). */
UNARY_FLOAT(pow_sq, x * x, x * x)
UNARY_FLOAT(pow_cube, x * x * x, x * x * x)
UNARY_FLOAT(pow_recip, 1.0f / x, 1.0 / x)
UNARY_FLOAT(pow_recip_sq, 1.0f / (x * x), 1.0 / (x * x))
UNARY_FLOAT(pow_gen, powf(x, p0), pow(x, p0))
LOOP1(pow_scalar, i32, int32_t, int64_t, LD_ID, int32_t, (int32_t)(uint32_t), P_I, ipow(x, p0))
LOOP1(pow_scalar, i64, int64_t, int64_t, LD_ID, int64_t, (int64_t), P_I, ipow(x, p0))
LOOP1(pow_scalar, u8, uint8_t, int64_t, LD_ID, uint8_t, (uint8_t), P_I, ipow(x, p0))
static const loop_table t_pow_sq = {{T_FLOAT(pow_sq)}}, t_pow_cube = {{T_FLOAT(pow_cube)}},
                        t_pow_recip = {{T_FLOAT(pow_recip)}},
                        t_pow_recip_sq = {{T_FLOAT(pow_recip_sq)}},
                        t_pow_gen = {{T_FLOAT(pow_gen), T_INTS(pow_scalar)}};

static em_status k_pow_scalar(const em_kernel_ctx *k) {
    mctx c = params(k, 1, 1);
    em_dtype dt = k->in[0].dtype;
    const loop_table *t = &t_pow_gen;
    if (em_dtype_is_floating(dt)) {
        double e = c.d0;
        t = e == 2 ? &t_pow_sq : e == 3 ? &t_pow_cube : e == 0.5 ? &t_sqrt
            : e == -0.5 ? &t_rsqrt : e == -1 ? &t_pow_recip : e == -2 ? &t_pow_recip_sq
            : &t_pow_gen;
    }
    return run(k, t, dt, &c);
}

/* ---- binary: pow, maximum, minimum ------------------------------------------------------------- */

BINARY_FLOAT(pow, powf(x, y), pow(x, y))
LOOP2(pow, i32, int32_t, int64_t, LD_ID, int32_t, (int32_t)(uint32_t), P_I, ipow(x, y))
LOOP2(pow, i64, int64_t, int64_t, LD_ID, int64_t, (int64_t), P_I, ipow(x, y))
LOOP2(pow, u8, uint8_t, int64_t, LD_ID, uint8_t, (uint8_t), P_I, ipow(x, y))

/* NaN propagates: x is kept when it is NaN, y wins every comparison with NaN x otherwise. */
#define MAXIMUM(x, y) ((x) > (y) || (x) != (x) ? (x) : (y))
#define MINIMUM(x, y) ((x) < (y) || (x) != (x) ? (x) : (y))
BINARY_FLOAT(maximum, MAXIMUM(x, y), MAXIMUM(x, y))
BINARY_FLOAT(minimum, MINIMUM(x, y), MINIMUM(x, y))
#define INTS2_ALL(name, EXPR)                                                                  \
    LOOP2(name, i32, int32_t, int32_t, LD_ID, int32_t, ST_ID, P_I, EXPR)                       \
    LOOP2(name, i64, int64_t, int64_t, LD_ID, int64_t, ST_ID, P_I, EXPR)                       \
    LOOP2(name, u8, uint8_t, uint8_t, LD_ID, uint8_t, ST_ID, P_I, EXPR)                        \
    LOOP2(name, bool, bool, bool, LD_ID, bool, ST_ID, P_I, EXPR)
INTS2_ALL(maximum, x > y ? x : y)
INTS2_ALL(minimum, x < y ? x : y)
static const loop_table t_pow = {{T_FLOAT(pow), T_INTS(pow)}},
                        t_maximum = {{T_FLOAT(maximum), T_INTS(maximum),
                                      [EM_BOOL] = maximum_bool}},
                        t_minimum = {{T_FLOAT(minimum), T_INTS(minimum),
                                      [EM_BOOL] = minimum_bool}};
KERNEL(pow, 0, 0)
KERNEL(maximum, 0, 0)
KERNEL(minimum, 0, 0)

/* ---- comparisons and logical ops (bool output) ---------------------------------------------------- */

#define TO_BOOL(v) ((bool)(v))
#define COMPARE(name, EXPR)                                                                    \
    FAST2(name, bool, EXPR)                                                                    \
    LOOP2(name, f64, double, double, LD_ID, bool, TO_BOOL, P_F, EXPR)                          \
    HALF(name, 3, 6u)                                                                          \
    LOOP2(name, i32, int32_t, int32_t, LD_ID, bool, TO_BOOL, P_I, EXPR)                        \
    LOOP2(name, i64, int64_t, int64_t, LD_ID, bool, TO_BOOL, P_I, EXPR)                        \
    LOOP2(name, u8, uint8_t, uint8_t, LD_ID, bool, TO_BOOL, P_I, EXPR)                         \
    LOOP2(name, bool, bool, bool, LD_ID, bool, TO_BOOL, P_I, EXPR)                             \
    static const loop_table t_##name = {{T_FLOAT(name), T_INTS(name), [EM_BOOL] = name##_bool}}; \
    KERNEL(name, 0, 0)
COMPARE(eq, x == y)
COMPARE(ne, x != y)
COMPARE(lt, x < y)
COMPARE(le, x <= y)
COMPARE(gt, x > y)
COMPARE(ge, x >= y)
/* Truth of an element: non-zero (NaN is true; -0 is false). */
COMPARE(logical_and, x != 0 && y != 0)
COMPARE(logical_or, x != 0 || y != 0)
COMPARE(logical_xor, (x != 0) != (y != 0))

FAST1(logical_not, bool, x == 0)
LOOP1(logical_not, f64, double, double, LD_ID, bool, TO_BOOL, P_F, x == 0)
HALF(logical_not, 2, 2u)
LOOP1(logical_not, i32, int32_t, int32_t, LD_ID, bool, TO_BOOL, P_I, x == 0)
LOOP1(logical_not, i64, int64_t, int64_t, LD_ID, bool, TO_BOOL, P_I, x == 0)
LOOP1(logical_not, u8, uint8_t, uint8_t, LD_ID, bool, TO_BOOL, P_I, x == 0)
LOOP1(logical_not, bool, bool, bool, LD_ID, bool, TO_BOOL, P_I, !x)
static const loop_table t_logical_not = {{T_FLOAT(logical_not), T_INTS(logical_not),
                                          [EM_BOOL] = logical_not_bool}};
KERNEL(logical_not, 0, 0)

/* ---- where ---------------------------------------------------------------------------------------- */

/* y = cond ? a : b moves elements, so one loop per element size serves every dtype. */
#define WHERE(bits)                                                                            \
    static void where_##bits(char **p, const int64_t *s, int64_t n, void *vc) {                \
        (void)vc;                                                                              \
        const int64_t e = bits / 8;                                                            \
        if (s[0] == e && s[1] == 1 && s[2] == e && s[3] == e) {                                \
            uint##bits##_t *o = (uint##bits##_t *)p[0];                                       \
            const bool *c = (const bool *)p[1];                                                \
            const uint##bits##_t *a = (const uint##bits##_t *)p[2],                            \
                                 *b = (const uint##bits##_t *)p[3];                            \
            for (int64_t i = 0; i < n; i++) o[i] = c[i] ? a[i] : b[i];                         \
            return;                                                                            \
        }                                                                                      \
        for (int64_t i = 0; i < n; i++)                                                        \
            *(uint##bits##_t *)(p[0] + i * s[0]) =                                             \
                *(const bool *)(p[1] + i * s[1]) ? *(const uint##bits##_t *)(p[2] + i * s[2])  \
                                                 : *(const uint##bits##_t *)(p[3] + i * s[3]); \
    }
WHERE(8)
WHERE(16)
WHERE(32)
WHERE(64)

static em_status k_where(const em_kernel_ctx *k) {
    static const cpu_loop_fn by_size[9] = {[1] = where_8, [2] = where_16, [4] = where_32,
                                           [8] = where_64};
    const em_ktensor *ts[4] = {&k->out[0], &k->in[0], &k->in[1], &k->in[2]};
    cpu_foreach(k, 4, ts, by_size[em_dtype_size(k->out[0].dtype)], NULL, CPU_GRAIN);
    return EM_OK;
}

/* ---- division with a rounding mode ----------------------------------------------------------- */

/* PyTorch's (c10) floor division of floats: through fmod, so that it agrees with the
 * remainder (a = b * floor_divide(a, b) + remainder); division by 0 gives IEEE's a / b. */
#define DIV_FLOOR_FLOAT(T, FMOD, FLOOR, COPYSIGN)                                              \
    static T div_floor_##T(T a, T b) {                                                         \
        if (b == 0) return a / b;                                                              \
        T mod = FMOD(a, b), div = (a - mod) / b;                                               \
        if (mod != 0 && (b < 0) != (mod < 0)) div -= (T)1;                                     \
        if (div == 0) return COPYSIGN((T)0, a / b);                                            \
        T fl = FLOOR(div);                                                                     \
        return div - fl > (T)0.5 ? fl + (T)1 : fl;                                             \
    }
DIV_FLOOR_FLOAT(float, fmodf, floorf, copysignf)
DIV_FLOOR_FLOAT(double, fmod, floor, copysign)
/* mode: 0 true division (floating only), 1 trunc, 2 floor. */
#define DIV_MODE_F(T, x, y, m)                                                                 \
    ((m) == 0 ? (x) / (y) : (m) == 1 ? (T)trunc((double)((x) / (y))) : div_floor_##T(x, y))
LOOP2(div_mode, f64, double, double, LD_ID, double, ST_ID, P_I, DIV_MODE_F(double, x, y, c->mode))
/* f32 (and, through it, f16/bf16): a scalar loop; trunc of an f32 quotient is exact in double. */
LOOP2(div_mode, f32, float, float, LD_ID, float, ST_ID, P_I, DIV_MODE_F(float, x, y, c->mode))
HALF(div_mode, 3, 7u)

/* Integers: C's division truncates; floor rounds down where the signs differ and a remainder
 * is left. A zero divisor is an error (PyTorch's ZeroDivisionError), flagged here and reported
 * once the loop ends; the most negative value divided by -1 wraps to itself. */
typedef struct divi_ctx {
    int mode;
    atomic_bool zero;
} divi_ctx;
#define DIV_INT(sfx, T, UT, MIN)                                                               \
    static void div_int_##sfx(char **p, const int64_t *s, int64_t n, void *vc) {                \
        divi_ctx *c = vc;                                                                      \
        for (int64_t i = 0; i < n; i++) {                                                      \
            T a = *(const T *)(p[1] + i * s[1]), b = *(const T *)(p[2] + i * s[2]), q;          \
            if (b == 0) {                                                                      \
                atomic_store_explicit(&c->zero, true, memory_order_relaxed);                   \
                q = 0;                                                                         \
            } else if (a == (T)(MIN) && b == (T)-1) {                                          \
                q = (T)(0u - (UT)a);                                                           \
            } else {                                                                           \
                q = (T)(a / b);                                                                \
                if (c->mode == 2 && ((a < 0) != (b < 0)) && (T)(a % b) != 0) q = (T)(q - 1);   \
            }                                                                                  \
            *(T *)(p[0] + i * s[0]) = q;                                                       \
        }                                                                                      \
    }
DIV_INT(i32, int32_t, uint32_t, INT32_MIN)
DIV_INT(i64, int64_t, uint64_t, INT64_MIN)
/* uint8: no signs, so trunc and floor agree. */
static void div_int_u8(char **p, const int64_t *s, int64_t n, void *vc) {
    divi_ctx *c = vc;
    for (int64_t i = 0; i < n; i++) {
        uint8_t a = *(const uint8_t *)(p[1] + i * s[1]), b = *(const uint8_t *)(p[2] + i * s[2]);
        if (!b) atomic_store_explicit(&c->zero, true, memory_order_relaxed);
        *(uint8_t *)(p[0] + i * s[0]) = b ? (uint8_t)(a / b) : 0;
    }
}
static const loop_table t_div_mode = {{T_FLOAT(div_mode), [EM_I32] = div_int_i32,
                                       [EM_I64] = div_int_i64, [EM_U8] = div_int_u8}};

static em_status k_div_mode(const em_kernel_ctx *k) {
    const em_attr *a = &k->attrs[0];
    int mode = a->type != EM_ATTR_STRING ? 0 : strcmp(a->v.s, "trunc") == 0 ? 1
               : strcmp(a->v.s, "floor") == 0 ? 2 : -1;
    em_dtype dt = k->in[0].dtype;
    if (mode < 0 || (mode == 0 && !em_dtype_is_floating(dt)))
        return em_set_error(EM_ERR_INVALID, "div_mode: the CPU kernel got rounding mode %s for %s",
                            a->type == EM_ATTR_STRING ? a->v.s : "(true division)",
                            em_dtype_name(dt));
    if (em_dtype_is_floating(dt)) {
        mctx c = {.mode = mode};
        return run(k, &t_div_mode, dt, &c);
    }
    divi_ctx c = {.mode = mode};
    atomic_init(&c.zero, false);
    const em_ktensor *ts[3] = {&k->out[0], &k->in[0], &k->in[1]};
    cpu_foreach(k, 3, ts, t_div_mode.fn[dt], &c, CPU_GRAIN);
    if (atomic_load(&c.zero))
        return em_set_error(EM_ERR_INVALID, "div_mode: integer division by zero");
    return EM_OK;
}

/* ---- backward helpers (x: input 1 = the forward's input or output, y: grad = input 0) -------- */

/* LOOP2's operands are (x, y) = (grad, second input); name them g and v here. */
#define BW(name, EXPR_F, EXPR_D) BINARY_FLOAT(name, EXPR_F, EXPR_D)
#define g x
#define v y
BW(threshold_backward, v <= p0 ? 0.0f : g, v <= p0 ? 0.0 : g)
BW(sigmoid_backward, g * (1.0f - v) * v, g * (1.0 - v) * v)
BW(tanh_backward, g * (1.0f - v * v), g * (1.0 - v * v))
BW(silu_backward, g * (1.0f / (1.0f + expf(-v))) * (1.0f + v * (1.0f - 1.0f / (1.0f + expf(-v)))),
   g * (1.0 / (1.0 + exp(-v))) * (1.0 + v * (1.0 - 1.0 / (1.0 + exp(-v)))))
BW(leaky_relu_backward, v > 0 ? g : g * p0, v > 0 ? g : g * p0)
/* d/dv [v Phi(v)] = Phi(v) + v phi(v). */
BW(gelu_erf_backward,
   g * (0.5f * (1.0f + erff(v * (float)SQRT1_2)) + v * (float)INV_SQRT_2PI * expf(-0.5f * v * v)),
   g * (0.5 * (1.0 + erf(v * SQRT1_2)) + v * INV_SQRT_2PI * exp(-0.5 * v * v)))
/* PyTorch's formula: with u = sqrt(2/pi) (v + k v^3), t = tanh(u):
 * 0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 k v^2). */
#define GELU_TANH_D(T, TANH, t)                                                                \
    ((T)0.5 * ((T)1 + (t)) +                                                                   \
     (T)0.5 * v * ((T)1 - (t) * (t)) * (T)SQRT_2_PI * ((T)1 + (T)(3 * GELU_K) * v * v))
#define T_INNER_F tanhf((float)SQRT_2_PI * (v + (float)GELU_K * v * v * v))
#define T_INNER_D tanh(SQRT_2_PI * (v + GELU_K * v * v * v))
BW(gelu_tanh_backward, g * GELU_TANH_D(float, tanhf, T_INNER_F),
   g * GELU_TANH_D(double, tanh, T_INNER_D))
#undef g
#undef v
static const loop_table t_threshold_backward = {{T_FLOAT(threshold_backward)}},
                        t_sigmoid_backward = {{T_FLOAT(sigmoid_backward)}},
                        t_tanh_backward = {{T_FLOAT(tanh_backward)}},
                        t_silu_backward = {{T_FLOAT(silu_backward)}},
                        t_leaky_relu_backward = {{T_FLOAT(leaky_relu_backward)}},
                        t_gelu_erf_backward = {{T_FLOAT(gelu_erf_backward)}},
                        t_gelu_tanh_backward = {{T_FLOAT(gelu_tanh_backward)}};
KERNEL(threshold_backward, 1, 0)
KERNEL(sigmoid_backward, 0, 0)
KERNEL(tanh_backward, 0, 0)
KERNEL(silu_backward, 0, 0)
KERNEL(leaky_relu_backward, 1, 0.01)

static em_status k_gelu_backward(const em_kernel_ctx *k) {
    int m = gelu_mode(k);
    if (m < 0) return bad_mode(k);
    mctx c = {0};
    return run(k, m ? &t_gelu_tanh_backward : &t_gelu_erf_backward, k->in[0].dtype, &c);
}

/* ---- registration --------------------------------------------------------------------------------- */

em_status cpu_register_math(em_registry *r) {
    static const em_dtype all[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8, EM_BOOL};
    static const em_dtype num[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8};
    static const em_dtype flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    em_status st = EM_OK;
#define REG(op, set, fn)                                                                       \
    if (st == EM_OK)                                                                           \
    st = cpu_register_kernels(r, op, set, (int)(sizeof set / sizeof *set), fn, "cpu_" op)
    REG("abs", num, k_abs);
    REG("sign", all, k_sign);
    REG("erf", flt, k_erf);
    REG("erfinv", flt, k_erfinv);
    REG("div_mode", num, k_div_mode);
    REG("sqrt", flt, k_sqrt);
    REG("rsqrt", flt, k_rsqrt);
    REG("reciprocal", flt, k_reciprocal);
    REG("sigmoid", flt, k_sigmoid);
    REG("tanh", flt, k_tanh);
    REG("log1p", flt, k_log1p);
    REG("expm1", flt, k_expm1);
    REG("gelu", flt, k_gelu);
    REG("silu", flt, k_silu);
    REG("leaky_relu", flt, k_leaky_relu);
    REG("clamp", num, k_clamp);
    REG("add_scalar", num, k_add_scalar);
    REG("sub_scalar", num, k_sub_scalar);
    REG("mul_scalar", num, k_mul_scalar);
    REG("div_scalar", flt, k_div_scalar);
    REG("pow_scalar", num, k_pow_scalar);
    REG("pow", num, k_pow);
    REG("maximum", all, k_maximum);
    REG("minimum", all, k_minimum);
    REG("eq", all, k_eq);
    REG("ne", all, k_ne);
    REG("lt", all, k_lt);
    REG("le", all, k_le);
    REG("gt", all, k_gt);
    REG("ge", all, k_ge);
    REG("logical_and", all, k_logical_and);
    REG("logical_or", all, k_logical_or);
    REG("logical_xor", all, k_logical_xor);
    REG("logical_not", all, k_logical_not);
    REG("where", all, k_where);
    REG("threshold_backward", flt, k_threshold_backward);
    REG("sigmoid_backward", flt, k_sigmoid_backward);
    REG("tanh_backward", flt, k_tanh_backward);
    REG("gelu_backward", flt, k_gelu_backward);
    REG("silu_backward", flt, k_silu_backward);
    REG("leaky_relu_backward", flt, k_leaky_relu_backward);
#undef REG
    /* The vectorised exp and log, above cpu_elementwise.c's scalar loops. */
    for (int i = 0; i < 4 && st == EM_OK; i++)
        for (int j = 0; j < 2 && st == EM_OK; j++) {
            char name[64];
            snprintf(name, sizeof name, "cpu_%s_simd_%s", j ? "log" : "exp",
                     em_dtype_name(flt[i]));
            em_kernel_def def = {.struct_size = sizeof def, .op = j ? "log" : "exp",
                                 .device_type = "cpu", .dtype = flt[i], .priority = 1,
                                 .fn = j ? k_log : k_exp, .name = name};
            st = em_kernel_register(r, &def, NULL);
        }
    return st;
}
