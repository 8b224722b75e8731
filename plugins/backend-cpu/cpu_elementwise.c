/*
 * cpu_elementwise.c — copy (with dtype conversion), fill, arange, the arithmetic binary ops,
 * unary ops, and index_select on the CPU.
 *
 * Each op's inner loop is generated per dtype by a macro: contiguous branches the compiler
 * vectorises (`omp simd`, built per CPU with SIMD_CLONES; a plain -O2 loop stayed scalar and
 * branched on every value: the dispatcher guarantees an output is either an input exactly or
 * disjoint from it) and a strided branch for views and broadcasts. f16 and bf16
 * compute in float.
 */
#include <math.h>
#include <string.h>

#include "ember/dispatch.h"
#include "ember/dtype.h"
#include "ember/error.h"
#include "cpu.h"

/* Per dtype: C type, compute type, load to compute type, store from compute type. */
#define LD_ID(x) (x)
#define ST_ID(x) (x)
#define LD_H(x) cpu_h2f(x)
#define ST_H(x) cpu_f2h(x)
#define LD_B(x) cpu_b2f(x)
#define ST_B(x) cpu_f2b(x)


/* ---- binary ---------------------------------------------------------------------------------- */

#define DEF_BINARY(opname, EXPR)                                                               \
    DEF_BINARY_T(opname, EXPR, f32, float, float, LD_ID, ST_ID)                                \
    DEF_BINARY_T(opname, EXPR, f64, double, double, LD_ID, ST_ID)                              \
    DEF_BINARY_T(opname, EXPR, f16, uint16_t, float, LD_H, ST_H)                               \
    DEF_BINARY_T(opname, EXPR, bf16, uint16_t, float, LD_B, ST_B)                              \
    DEF_BINARY_T(opname, EXPR, i32, int32_t, uint32_t, LD_ID, ST_ID)                           \
    DEF_BINARY_T(opname, EXPR, i64, int64_t, uint64_t, LD_ID, ST_ID)                           \
    DEF_BINARY_T(opname, EXPR, u8, uint8_t, uint8_t, LD_ID, ST_ID)

/* out = EXPR(x, y); p[0] is the output, p[1], p[2] the inputs. int32 and int64 compute in
 * unsigned arithmetic so that overflow wraps, as in PyTorch, instead of being undefined. */
#define DEF_BINARY_T(opname, EXPR, sfx, T, CT, LD, ST)                                         \
    SIMD_CLONES static void opname##_##sfx(char **p, const int64_t *s, int64_t n, void *ctx) { \
        (void)ctx;                                                                             \
        const int64_t e = (int64_t)sizeof(T);                                                  \
        if (s[0] == e && s[1] == e && s[2] == e) {                                             \
            T *o = (T *)p[0];                                                                  \
            const T *a = (const T *)p[1], *b = (const T *)p[2];                                \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                              \
                CT x = LD(a[i]), y = LD(b[i]);                                                 \
                o[i] = ST((CT)(EXPR));                                                         \
            }                                                                                  \
        } else if (s[0] == e && s[1] == e && s[2] == 0) {                                      \
            T *o = (T *)p[0];                                                                  \
            const T *a = (const T *)p[1];                                                      \
            CT y = LD(*(const T *)p[2]);                                                       \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                              \
                CT x = LD(a[i]);                                                               \
                o[i] = ST((CT)(EXPR));                                                         \
            }                                                                                  \
        } else {                                                                               \
            for (int64_t i = 0; i < n; i++) {                                                  \
                CT x = LD(*(const T *)(p[1] + i * s[1])), y = LD(*(const T *)(p[2] + i * s[2])); \
                *(T *)(p[0] + i * s[0]) = ST((CT)(EXPR));                                      \
            }                                                                                  \
        }                                                                                      \
    }

DEF_BINARY(add, x + y)
DEF_BINARY(sub, x - y)
DEF_BINARY(mul, x *y)
DEF_BINARY_T(div, x / y, f32, float, float, LD_ID, ST_ID)
DEF_BINARY_T(div, x / y, f64, double, double, LD_ID, ST_ID)
DEF_BINARY_T(div, x / y, f16, uint16_t, float, LD_H, ST_H)
DEF_BINARY_T(div, x / y, bf16, uint16_t, float, LD_B, ST_B)
DEF_BINARY_T(add, x || y, bool, bool, bool, LD_ID, ST_ID)
/* relu_backward(grad, y): grad where y > 0 */
DEF_BINARY_T(relu_bw, y > 0 ? x : 0, f32, float, float, LD_ID, ST_ID)
DEF_BINARY_T(relu_bw, y > 0 ? x : 0, f64, double, double, LD_ID, ST_ID)
DEF_BINARY_T(relu_bw, y > 0 ? x : 0, f16, uint16_t, float, LD_H, ST_H)
/* bf16 relu and its backward work on the bits, 16-bit lanes: what widening to f32, comparing
 * and rounding back gives (the round trip is exact but for NaN, which is quieted: bit 0x40),
 * without the conversions, which made the bf16 loops slower than the f32 ones on half the
 * bytes. y > 0 for a bf16 y: sign clear, not zero, not NaN (0x0001..0x7f80). */
#define BF16_QUIET(h) ((uint16_t)(((h)&0x7fffu) > 0x7f80u ? (h) | 0x40u : (h)))
#define BF16_GT0(h) ((uint16_t)((h)-1u) < 0x7f80u)
DEF_BINARY_T(relu_bw, BF16_GT0(y) ? BF16_QUIET(x) : 0, bf16, uint16_t, uint16_t, LD_ID, ST_ID)
DEF_BINARY_T(mul, x &&y, bool, bool, bool, LD_ID, ST_ID)

/* Pick the inner loop for the output dtype from a table indexed by dtype. */
typedef struct loop_table {
    cpu_loop_fn fn[EM_DTYPE_COUNT];
} loop_table;

static em_status run_table(const em_kernel_ctx *k, const loop_table *t, int64_t grain) {
    cpu_loop_fn fn = t->fn[k->out[0].dtype];
    if (!fn)
        return em_set_error(EM_ERR_DTYPE, "%s: the CPU kernel has no loop for %s",
                            em_op_name(k->op), em_dtype_name(k->out[0].dtype));
    const em_ktensor *ts[3] = {&k->out[0], &k->in[0], k->n_in > 1 ? &k->in[1] : &k->in[0]};
    cpu_foreach(k, 1 + k->n_in, ts, fn, NULL, grain);
    return EM_OK;
}

#define ARITH_TABLE(opname)                                                                    \
    {{[EM_F32] = opname##_f32, [EM_F64] = opname##_f64, [EM_F16] = opname##_f16,             \
      [EM_BF16] = opname##_bf16, [EM_I32] = opname##_i32, [EM_I64] = opname##_i64,           \
      [EM_U8] = opname##_u8}}
static const loop_table t_add = {{[EM_F32] = add_f32, [EM_F64] = add_f64, [EM_F16] = add_f16,
                                  [EM_BF16] = add_bf16, [EM_I32] = add_i32, [EM_I64] = add_i64,
                                  [EM_U8] = add_u8, [EM_BOOL] = add_bool}};
static const loop_table t_sub = ARITH_TABLE(sub);
static const loop_table t_mul = {{[EM_F32] = mul_f32, [EM_F64] = mul_f64, [EM_F16] = mul_f16,
                                  [EM_BF16] = mul_bf16, [EM_I32] = mul_i32, [EM_I64] = mul_i64,
                                  [EM_U8] = mul_u8, [EM_BOOL] = mul_bool}};
static const loop_table t_div = {{[EM_F32] = div_f32, [EM_F64] = div_f64, [EM_F16] = div_f16,
                                  [EM_BF16] = div_bf16}};

static const loop_table t_relu_bw = {{[EM_F32] = relu_bw_f32, [EM_F64] = relu_bw_f64,
                                      [EM_F16] = relu_bw_f16, [EM_BF16] = relu_bw_bf16}};
static em_status k_relu_bw(const em_kernel_ctx *k) { return run_table(k, &t_relu_bw, CPU_GRAIN_MEM); }
static em_status k_add(const em_kernel_ctx *k) { return run_table(k, &t_add, CPU_GRAIN_MEM); }
static em_status k_sub(const em_kernel_ctx *k) { return run_table(k, &t_sub, CPU_GRAIN_MEM); }
static em_status k_mul(const em_kernel_ctx *k) { return run_table(k, &t_mul, CPU_GRAIN_MEM); }
static em_status k_div(const em_kernel_ctx *k) { return run_table(k, &t_div, CPU_GRAIN_MEM); }

/* ---- unary ------------------------------------------------------------------------------------ */

#define DEF_UNARY_T(opname, EXPR, sfx, T, CT, LD, ST)                                          \
    SIMD_CLONES static void opname##_##sfx(char **p, const int64_t *s, int64_t n, void *ctx) { \
        (void)ctx;                                                                             \
        const int64_t e = (int64_t)sizeof(T);                                                  \
        if (s[0] == e && s[1] == e) {                                                          \
            T *o = (T *)p[0];                                                                  \
            const T *a = (const T *)p[1];                                                      \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                              \
                CT x = LD(a[i]);                                                               \
                o[i] = ST((CT)(EXPR));                                                         \
            }                                                                                  \
        } else {                                                                               \
            for (int64_t i = 0; i < n; i++) {                                                  \
                CT x = LD(*(const T *)(p[1] + i * s[1]));                                      \
                *(T *)(p[0] + i * s[0]) = ST((CT)(EXPR));                                      \
            }                                                                                  \
        }                                                                                      \
    }
#define DEF_UNARY_FLOAT(opname, EXPR_F, EXPR_D)                                                \
    DEF_UNARY_T(opname, EXPR_F, f32, float, float, LD_ID, ST_ID)                               \
    DEF_UNARY_T(opname, EXPR_D, f64, double, double, LD_ID, ST_ID)                             \
    DEF_UNARY_T(opname, EXPR_F, f16, uint16_t, float, LD_H, ST_H)                              \
    DEF_UNARY_T(opname, EXPR_F, bf16, uint16_t, float, LD_B, ST_B)

DEF_UNARY_FLOAT(neg, -x, -x)
/* Negating int32/int64 wraps at the minimum, as in PyTorch (done in unsigned arithmetic). */
DEF_UNARY_T(neg, (int32_t)(0u - (uint32_t)x), i32, int32_t, int32_t, LD_ID, ST_ID)
DEF_UNARY_T(neg, (int64_t)(0ull - (uint64_t)x), i64, int64_t, int64_t, LD_ID, ST_ID)
DEF_UNARY_T(neg, (uint8_t)(0u - x), u8, uint8_t, uint8_t, LD_ID, ST_ID)
DEF_UNARY_FLOAT(exp, expf(x), exp(x))
DEF_UNARY_FLOAT(log, logf(x), log(x))
/* relu keeps NaN (x > 0 is false for NaN, so x is returned when it is not <= 0). */
DEF_UNARY_T(relu, x <= 0 ? 0 : x, f32, float, float, LD_ID, ST_ID)
DEF_UNARY_T(relu, x <= 0 ? 0 : x, f64, double, double, LD_ID, ST_ID)
DEF_UNARY_T(relu, x <= 0 ? 0 : x, f16, uint16_t, float, LD_H, ST_H)
/* bf16 on the bits (see relu_bw above): NaN quieted, negative values and -0 to +0. */
DEF_UNARY_T(relu, (x & 0x7fffu) > 0x7f80u ? x | 0x40u : (x & 0x8000u) ? 0 : x, bf16, uint16_t,
            uint16_t, LD_ID, ST_ID)
DEF_UNARY_T(relu, x < 0 ? 0 : x, i32, int32_t, int32_t, LD_ID, ST_ID)
DEF_UNARY_T(relu, x < 0 ? 0 : x, i64, int64_t, int64_t, LD_ID, ST_ID)
DEF_UNARY_T(relu, x, u8, uint8_t, uint8_t, LD_ID, ST_ID) /* unsigned: nothing to clamp */

#define FLOAT_TABLE(opname)                                                                    \
    {{[EM_F32] = opname##_f32, [EM_F64] = opname##_f64, [EM_F16] = opname##_f16,             \
      [EM_BF16] = opname##_bf16}}
static const loop_table t_neg = ARITH_TABLE(neg);
static const loop_table t_exp = FLOAT_TABLE(exp);
static const loop_table t_log = FLOAT_TABLE(log);
static const loop_table t_relu = ARITH_TABLE(relu);

static em_status k_neg(const em_kernel_ctx *k) { return run_table(k, &t_neg, CPU_GRAIN_MEM); }
static em_status k_exp(const em_kernel_ctx *k) { return run_table(k, &t_exp, CPU_GRAIN); }
static em_status k_log(const em_kernel_ctx *k) { return run_table(k, &t_log, CPU_GRAIN); }
static em_status k_relu(const em_kernel_ctx *k) { return run_table(k, &t_relu, CPU_GRAIN_MEM); }

/* ---- copy with conversion ------------------------------------------------------------------------ */

/* Converting copies go through em_dtype_load/em_dtype_store, which define Ember's scalar
 * conversions (ember/dtype.h); integer-to-integer copies keep all 64 bits. */
static inline double load_d(em_dtype dt, const char *p) { return em_dtype_load(dt, p, 0); }
static inline void store_d(em_dtype dt, char *p, double v) { em_dtype_store(dt, p, 0, v); }

typedef struct copy_ctx {
    em_dtype to, from;
} copy_ctx;

static void copy_same(char **p, const int64_t *s, int64_t n, void *vctx) {
    size_t e = em_dtype_size(((const copy_ctx *)vctx)->to);
    if (s[0] == (int64_t)e && s[1] == (int64_t)e) {
        memcpy(p[0], p[1], (size_t)n * e);
        return;
    }
    for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], p[1] + i * s[1], e);
}

static void copy_convert(char **p, const int64_t *s, int64_t n, void *vctx) {
    const copy_ctx *c = vctx;
    /* Integer sources keep all 64 bits when the destination is an integer too. */
    bool ints = !em_dtype_is_floating(c->from) && !em_dtype_is_floating(c->to) && c->to != EM_BOOL;
    for (int64_t i = 0; i < n; i++) {
        const char *src = p[1] + i * s[1];
        char *dst = p[0] + i * s[0];
        if (ints) {
            int64_t v = c->from == EM_I64 ? *(const int64_t *)src
                        : c->from == EM_I32 ? *(const int32_t *)src
                        : c->from == EM_U8 ? *(const uint8_t *)src : *(const bool *)src;
            if (c->to == EM_I64) *(int64_t *)dst = v;
            else if (c->to == EM_I32) *(int32_t *)dst = (int32_t)(uint32_t)(uint64_t)v;
            else *(uint8_t *)dst = (uint8_t)(uint64_t)v;
        } else {
            store_d(c->to, dst, load_d(c->from, src));
        }
    }
}

/* The conversions between floating dtypes that mixed precision does all the time, typed (the
 * general loop above goes through double per element, ~10 ns each). Rounding is the same:
 * every f32 value is exact in double. */
#define DEF_CONVERT(name, TF, TT, CONV)                                                        \
    SIMD_CLONES static void name(char **p, const int64_t *s, int64_t n, void *ctx) {          \
        (void)ctx;                                                                             \
        if (s[0] == (int64_t)sizeof(TT) && s[1] == (int64_t)sizeof(TF)) {                      \
            TT *o = (TT *)p[0];                                                                \
            const TF *a = (const TF *)p[1];                                                    \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = CONV(a[i]);             \
            return;                                                                            \
        }                                                                                      \
        for (int64_t i = 0; i < n; i++)                                                        \
            *(TT *)(p[0] + i * s[0]) = CONV(*(const TF *)(p[1] + i * s[1]));                   \
    }
#define AS_F32(x) ((float)(x))
#define AS_F64(x) ((double)(x))
#define B2D(x) ((double)cpu_b2f(x))
#define H2D(x) ((double)cpu_h2f(x))
DEF_CONVERT(conv_f32_bf16, float, uint16_t, cpu_f2b)
DEF_CONVERT(conv_bf16_f32, uint16_t, float, cpu_b2f)
DEF_CONVERT(conv_f32_f16, float, uint16_t, cpu_f2h)
DEF_CONVERT(conv_f16_f32, uint16_t, float, cpu_h2f)
DEF_CONVERT(conv_f32_f64, float, double, AS_F64)
DEF_CONVERT(conv_f64_f32, double, float, AS_F32)
DEF_CONVERT(conv_bf16_f64, uint16_t, double, B2D)
DEF_CONVERT(conv_f16_f64, uint16_t, double, H2D)
/* bool and u8 to the float dtypes: masks made floating (dropout's, attention's) */
#define BOOL_F32(x) ((x) ? 1.0f : 0.0f)
#define BOOL_F64(x) ((x) ? 1.0 : 0.0)
DEF_CONVERT(conv_bool_f32, uint8_t, float, BOOL_F32)
DEF_CONVERT(conv_bool_f64, uint8_t, double, BOOL_F64)
DEF_CONVERT(conv_u8_f32, uint8_t, float, AS_F32)
DEF_CONVERT(conv_u8_f64, uint8_t, double, AS_F64)

static cpu_loop_fn typed_convert(em_dtype to, em_dtype from) {
    if (from == EM_F32) return to == EM_BF16 ? conv_f32_bf16 : to == EM_F16 ? conv_f32_f16
                               : to == EM_F64 ? conv_f32_f64 : NULL;
    if (to == EM_F32) return from == EM_BF16 ? conv_bf16_f32 : from == EM_F16 ? conv_f16_f32
                             : from == EM_F64 ? conv_f64_f32 : from == EM_BOOL ? conv_bool_f32
                             : from == EM_U8 ? conv_u8_f32 : NULL;
    if (to == EM_F64) return from == EM_BF16 ? conv_bf16_f64 : from == EM_F16 ? conv_f16_f64
                             : from == EM_BOOL ? conv_bool_f64 : from == EM_U8 ? conv_u8_f64
                             : NULL;
    return NULL;
}

/* A same-dtype copy whose two operands are dense along different dims (a channels-last
 * (N, C, H, W) activation copied to row-major for a flatten: per image a C x HW transpose;
 * the channels-last copy of a row-major tensor: the reverse). The iteration engine's runs go
 * along the destination's unit-stride dim, reading the source at a stride of whole rows, one
 * element per call (~3 GB/s); here the two unit-stride dims a (the destination's) and b (the
 * source's) are walked in square tiles that stay in L1 (each source line read once per tile
 * row), the other dims outside, typed by element size: the same bits as the element loop. */
#define COPY_TILE 32
typedef struct transpose_geom {
    int nd;                          /* dims other than a and b */
    int64_t shape[EM_MAX_DIMS], os[EM_MAX_DIMS], is[EM_MAX_DIMS]; /* element strides */
    int64_t na, nb, os_b, is_a;      /* a: unit stride in the output; b: in the input */
} transpose_geom;

#define DEF_TRANSPOSE_TILE(name, T)                                                            \
    SIMD_CLONES static void name(char *dst, const char *src, int64_t a0, int64_t ae,          \
                                 int64_t b0, int64_t be, int64_t os_b, int64_t is_a) {         \
        T *restrict o = (T *)dst;                                                              \
        const T *restrict s = (const T *)src;                                                  \
        for (int64_t b = b0; b < be; b++) {                                                    \
            T *ob = o + b * os_b;                                                              \
            const T *sb = s + b;                                                               \
            _Pragma("omp simd") for (int64_t a = a0; a < ae; a++) ob[a] = sb[a * is_a];        \
        }                                                                                      \
    }
DEF_TRANSPOSE_TILE(transpose_tile_16, uint16_t)
DEF_TRANSPOSE_TILE(transpose_tile_32, uint32_t)
DEF_TRANSPOSE_TILE(transpose_tile_64, uint64_t)

/* The geometry of a transposing copy y <- x, or false (the element loop's case: a
 * destination run that is contiguous in both, a broadcast or overlapping source, too few
 * elements for tiles to pay). Size-1 dims dropped, adjacent dims merged where both operands
 * are contiguous across them (as the engine does). */
static bool transpose_geometry(const em_ktensor *y, const em_ktensor *x, transpose_geom *g) {
    if (y->numel < 4 * COPY_TILE * COPY_TILE) return false;
    int64_t sh[EM_MAX_DIMS], os[EM_MAX_DIMS], is[EM_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < y->ndim; d++) {
        if (y->shape[d] == 1) continue;
        if (nd > 0 && os[nd - 1] == y->strides[d] * y->shape[d] &&
            is[nd - 1] == x->strides[d] * y->shape[d]) {
            sh[nd - 1] *= y->shape[d];
            os[nd - 1] = y->strides[d], is[nd - 1] = x->strides[d];
            continue;
        }
        sh[nd] = y->shape[d], os[nd] = y->strides[d], is[nd] = x->strides[d];
        nd++;
    }
    int a = -1, b = -1;
    for (int d = 0; d < nd; d++) {
        if (os[d] == 1 && a < 0) a = d;
        if (is[d] == 1 && b < 0) b = d;
    }
    if (a < 0 || b < 0 || a == b || sh[a] < COPY_TILE / 2 || sh[b] < COPY_TILE / 2) return false;
    g->na = sh[a], g->nb = sh[b], g->os_b = os[b], g->is_a = is[a];
    if (g->os_b <= 0 || g->is_a <= 0) return false;
    g->nd = 0;
    for (int d = 0; d < nd; d++) {
        if (d == a || d == b) continue;
        if (os[d] <= 0 || is[d] <= 0) return false; /* broadcast or reversed: the engine's */
        g->shape[g->nd] = sh[d], g->os[g->nd] = os[d], g->is[g->nd] = is[d];
        g->nd++;
    }
    return true;
}

static bool copy_transposed(const em_kernel_ctx *k) {
    const em_ktensor *y = &k->out[0], *x = &k->in[0];
    size_t e = em_dtype_size(y->dtype);
    if (x->dtype != y->dtype || (e != 2 && e != 4 && e != 8) || x->ndim != y->ndim) return false;
    for (int d = 0; d < y->ndim; d++)
        if (x->shape[d] != y->shape[d]) return false;
    transpose_geom g;
    if (!transpose_geometry(y, x, &g)) return false;
    void (*tile)(char *, const char *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) =
        e == 2 ? transpose_tile_16 : e == 4 ? transpose_tile_32 : transpose_tile_64;
    int64_t outer = 1;
    for (int d = 0; d < g.nd; d++) outer *= g.shape[d];
    const int64_t tb = (g.nb + COPY_TILE - 1) / COPY_TILE, items = outer * tb;
    const int nt = cpu_threads(k);
    const bool par = nt > 1 && y->numel >= CPU_GRAIN;
#pragma omp parallel for num_threads(nt) if (par) schedule(static)
    for (int64_t it = 0; it < items; it++) {
        int64_t o = it / tb, b0 = (it % tb) * COPY_TILE, oo = 0, io = 0;
        for (int d = g.nd - 1; d >= 0; d--) {
            int64_t i = o % g.shape[d];
            o /= g.shape[d];
            oo += i * g.os[d], io += i * g.is[d];
        }
        char *dst = (char *)y->data + oo * (int64_t)e;
        const char *src = (const char *)x->data + io * (int64_t)e;
        const int64_t be = cpu_min_i64(b0 + COPY_TILE, g.nb);
        for (int64_t a0 = 0; a0 < g.na; a0 += COPY_TILE)
            tile(dst, src, a0, cpu_min_i64(a0 + COPY_TILE, g.na), b0, be, g.os_b, g.is_a);
    }
    return true;
}

static em_status k_copy(const em_kernel_ctx *k) {
    copy_ctx c = {k->out[0].dtype, k->in[0].dtype};
    if (c.to == c.from && copy_transposed(k)) return EM_OK;
    const em_ktensor *ts[2] = {&k->out[0], &k->in[0]};
    cpu_loop_fn typed = typed_convert(c.to, c.from);
    cpu_foreach(k, 2, ts, c.to == c.from ? copy_same : typed ? typed : copy_convert, &c, CPU_GRAIN);
    return EM_OK;
}

/* ---- fill and arange --------------------------------------------------------------------------------- */

typedef struct fill_ctx {
    em_dtype dt;
    _Alignas(8) char value[8]; /* one element of dt */
} fill_ctx;

static void fill_loop(char **p, const int64_t *s, int64_t n, void *vctx) {
    const fill_ctx *f = vctx;
    size_t e = em_dtype_size(f->dt);
    bool zero = true;
    for (size_t i = 0; i < e; i++) zero = zero && f->value[i] == 0;
    if (zero && s[0] == (int64_t)e) {
        memset(p[0], 0, (size_t)n * e);
        return;
    }
    for (int64_t i = 0; i < n; i++) memcpy(p[0] + i * s[0], f->value, e);
}

static em_status k_fill(const em_kernel_ctx *k) {
    fill_ctx f = {.dt = k->out[0].dtype};
    store_d(f.dt, f.value, k->attrs[0].v.f);
    const em_ktensor *ts[1] = {&k->out[0]};
    cpu_foreach(k, 1, ts, fill_loop, &f, CPU_GRAIN);
    return EM_OK;
}

static em_status k_arange(const em_kernel_ctx *k) {
    const em_ktensor *o = &k->out[0];
    double start = k->attrs[0].v.f, step = k->attrs[1].v.f;
    size_t e = em_dtype_size(o->dtype);
    int64_t stride = o->ndim ? o->strides[0] : 1;
    for (int64_t i = 0; i < o->numel; i++)
        store_d(o->dtype, (char *)o->data + i * stride * (int64_t)e, start + (double)i * step);
    return EM_OK;
}

/* ---- index_select ------------------------------------------------------------------------------------- */

static em_status k_index_select(const em_kernel_ctx *k) {
    const em_ktensor *x = &k->in[0], *idx = &k->in[1], *y = &k->out[0];
    int dim = (int)k->attrs[0].v.i;
    int64_t size = x->shape[dim];
    const int64_t *ip = idx->data;
    int64_t istride = idx->ndim ? idx->strides[0] : 1;
    for (int64_t j = 0; j < idx->numel; j++) {
        int64_t v = ip[j * istride];
        if (v < 0 || v >= size) /* PyTorch's index_select takes no negative indices */
            return em_set_error(EM_ERR_RANGE, "index_select: index %lld is out of range for dim "
                                "%d of size %lld", (long long)v, dim, (long long)size);
    }
    /* For each run of consecutive indices idx[j .. j + r) = v .. v + r (all of cat's
     * backward, which selects a block along dim): y.narrow(dim, j, r) = x.narrow(dim, v, r),
     * one copy of whole rows rather than r copies of strided slices. */
    size_t e = em_dtype_size(x->dtype);
    int64_t per = y->numel / (idx->numel ? idx->numel : 1); /* elements of one slice */
    for (int64_t j = 0; j < idx->numel;) {
        int64_t v = ip[j * istride], r = 1;
        while (j + r < idx->numel && ip[(j + r) * istride] == v + r) r++;
        em_ktensor xs = *x, ys = *y;
        xs.data = (char *)x->data + v * x->strides[dim] * (int64_t)e;
        ys.data = (char *)y->data + j * y->strides[dim] * (int64_t)e;
        xs.shape[dim] = ys.shape[dim] = r;
        xs.numel = ys.numel = per * r;
        xs.contiguous = ys.contiguous = false;
        const em_ktensor *ts[2] = {&ys, &xs};
        copy_ctx c = {x->dtype, x->dtype};
        cpu_foreach(k, 2, ts, copy_same, &c, CPU_GRAIN_MEM);
        j += r;
    }
    return EM_OK;
}

/* ---- registration --------------------------------------------------------------------------------------- */

em_status cpu_register_elementwise(em_registry *r) {
    static const em_dtype all[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8, EM_BOOL};
    static const em_dtype num[] = {EM_F32, EM_F64, EM_F16, EM_BF16, EM_I32, EM_I64, EM_U8};
    static const em_dtype flt[] = {EM_F32, EM_F64, EM_F16, EM_BF16};
    em_status st = EM_OK;
#define REG(op, set, fn) if (st == EM_OK) st = cpu_register_kernels(r, op, set, (int)(sizeof set / sizeof *set), fn, "cpu_" op)
    REG("copy", all, k_copy);
    REG("fill", all, k_fill);
    REG("arange", num, k_arange);
    REG("add", all, k_add);
    REG("sub", num, k_sub);
    REG("mul", all, k_mul);
    REG("div", flt, k_div);
    REG("neg", num, k_neg);
    REG("exp", flt, k_exp);
    REG("log", flt, k_log);
    /* relu and its backward run over the bytes: any storage layout, the same for all. */
    if (st == EM_OK)
        st = cpu_register_kernels_ex(r, "relu", num, (int)(sizeof num / sizeof *num), k_relu,
                                     "cpu_relu", cpu_same_layouts, CPU_NCHW16C);
    if (st == EM_OK)
        st = cpu_register_kernels_ex(r, "relu_backward", flt, (int)(sizeof flt / sizeof *flt),
                                     k_relu_bw, "cpu_relu_backward", cpu_same_layouts,
                                     CPU_NCHW16C);
    REG("index_select", all, k_index_select);
#undef REG
    return st;
}
