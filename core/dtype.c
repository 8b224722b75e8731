/*
 * dtype.c — element types: sizes, names, parsing, PyTorch's promotion lattice, the half and
 * bfloat16 conversions, and the slow per-element load/store used for printing, item() and
 * tests.
 *
 * The f16/bf16 conversions work on bit patterns, not on the FPU's rounding mode, so they give
 * the same result on every machine: round to nearest, ties to even; NaN stays NaN (made quiet,
 * sign and top payload bits kept); overflow gives infinity; subnormals are produced and read
 * in both directions.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ember/dtype.h"
#include "ember/error.h"
#include "internal.h"

/* ---- sizes and names ---------------------------------------------------------------------- */

const size_t em__dtype_sizes[EM_DTYPE_COUNT] = {
    [EM_F32] = 4, [EM_F64] = 8, [EM_F16] = 2, [EM_BF16] = 2,
    [EM_I32] = 4, [EM_I64] = 8, [EM_U8] = 1,  [EM_BOOL] = 1,
};

static const char *const dtype_names[EM_DTYPE_COUNT] = {
    [EM_F32] = "float32", [EM_F64] = "float64", [EM_F16] = "float16", [EM_BF16] = "bfloat16",
    [EM_I32] = "int32",   [EM_I64] = "int64",   [EM_U8] = "uint8",    [EM_BOOL] = "bool",
};

/* Every spelling em_dtype_parse accepts: PyTorch's name, the short one, the C type. */
static const struct {
    const char *name;
    em_dtype dt;
} dtype_aliases[] = {
    {"float32", EM_F32},  {"f32", EM_F32},   {"float", EM_F32},
    {"float64", EM_F64},  {"f64", EM_F64},   {"double", EM_F64},
    {"float16", EM_F16},  {"f16", EM_F16},   {"half", EM_F16},
    {"bfloat16", EM_BF16}, {"bf16", EM_BF16},
    {"int32", EM_I32},    {"i32", EM_I32},   {"int", EM_I32},
    {"int64", EM_I64},    {"i64", EM_I64},   {"long", EM_I64},
    {"uint8", EM_U8},     {"u8", EM_U8},
    {"bool", EM_BOOL},
};

#define DTYPE_VALID_NAMES                                                                    \
    "float32 (f32, float), float64 (f64, double), float16 (f16, half), bfloat16 (bf16), "     \
    "int32 (i32, int), int64 (i64, long), uint8 (u8), bool"

bool em_dtype_is_valid(em_dtype dt) {
    return (unsigned)dt < (unsigned)EM_DTYPE_COUNT;
}

size_t em_dtype_size(em_dtype dt) {
    return em_dtype_is_valid(dt) ? em__dtype_sizes[dt] : 0;
}

const char *em_dtype_name(em_dtype dt) {
    return em_dtype_is_valid(dt) ? dtype_names[dt] : "invalid";
}

int em_dtype_parse(const char *name, em_dtype *out /* out */) {
    if (!out)
        return em_set_error(EM_ERR_INVALID, "em_dtype_parse: out is NULL");
    if (!name)
        return em_set_error(EM_ERR_DTYPE, "dtype name is NULL; valid: " DTYPE_VALID_NAMES);
    for (size_t k = 0; k < EM_ARRAY_LEN(dtype_aliases); k++) {
        if (strcmp(name, dtype_aliases[k].name) == 0) {
            *out = dtype_aliases[k].dt;
            return EM_OK;
        }
    }
    /* The name is cut at 64 characters so that the list of valid names always fits. */
    return em_set_error(EM_ERR_DTYPE, "unknown dtype '%.64s'; valid: " DTYPE_VALID_NAMES, name);
}

bool em_dtype_is_floating(em_dtype dt) {
    return dt == EM_F32 || dt == EM_F64 || dt == EM_F16 || dt == EM_BF16;
}

bool em_dtype_is_integral(em_dtype dt) {
    return dt == EM_I32 || dt == EM_I64 || dt == EM_U8;
}

/* ---- promotion ---------------------------------------------------------------------------- */

/* Rank of the non-floating dtypes in PyTorch's lattice: bool < uint8 < int32 < int64. */
static int int_rank(em_dtype dt) {
    switch (dt) {
    case EM_BOOL: return 0;
    case EM_U8: return 1;
    case EM_I32: return 2;
    case EM_I64: return 3;
    default: return -1;
    }
}

/* Invalid inputs give EM_DTYPE_COUNT (not a dtype), which every caller rejects through
 * em_dtype_is_valid. */
em_dtype em_dtype_promote(em_dtype a, em_dtype b) {
    if (!em_dtype_is_valid(a) || !em_dtype_is_valid(b))
        return EM_DTYPE_COUNT;
    if (a == b)
        return a;
    bool fa = em_dtype_is_floating(a), fb = em_dtype_is_floating(b);
    if (fa && fb) /* two different floating types: f64 wins, every other pair meets at f32 */
        return (a == EM_F64 || b == EM_F64) ? EM_F64 : EM_F32;
    if (fa)
        return a;
    if (fb)
        return b;
    return int_rank(a) > int_rank(b) ? a : b;
}

/* ---- half and bfloat16 -------------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Shift m right by `shift` (1..31) rounding to nearest, ties to even. */
static uint32_t shift_rne(uint32_t m, unsigned shift) {
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return q;
}

uint16_t em_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: quiet, keep the top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 (max half + half an ulp), or inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax >= 0x38800000u) { /* a normal half: rebias the exponent (127 -> 15), round 13 bits */
        uint32_t r = shift_rne(ax - 0x38000000u, 13);
        return (uint16_t)(sign | r); /* a carry out of the mantissa bumps the exponent */
    }
    /* Below 2^-14: a half subnormal k * 2^-24, k = m * 2^(e - 126) with m the 24-bit
     * significand; shifts beyond 24 leave less than half of 2^-24, which rounds to 0. A k of
     * 1024 is the bit pattern of the smallest normal, as it should be. */
    unsigned e = ax >> 23;
    unsigned shift = 126u - e;
    if (e == 0 || shift > 24)
        return sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | shift_rne(m, shift));
}

float em_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* inf, or NaN made quiet */
        return f32_from_bits(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0));
    if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t em_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: truncating could give inf; quiet it */
        return (uint16_t)((x >> 16) | 0x0040u);
    /* Round the low 16 bits to nearest even; a carry rolls into the exponent, up to inf. */
    uint32_t bias = 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)((x + bias) >> 16);
}

float em_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u)
        x |= 0x400000u;
    return f32_from_bits(x);
}

/* ---- per-element load and store ----------------------------------------------------------- */

double em_dtype_load(em_dtype dt, const void *base, int64_t i) {
    switch (dt) {
    case EM_F32: return ((const float *)base)[i];
    case EM_F64: return ((const double *)base)[i];
    case EM_F16: return em_f16_to_f32(((const uint16_t *)base)[i]);
    case EM_BF16: return em_bf16_to_f32(((const uint16_t *)base)[i]);
    case EM_I32: return ((const int32_t *)base)[i];
    case EM_I64: return (double)((const int64_t *)base)[i];
    case EM_U8: return ((const uint8_t *)base)[i];
    case EM_BOOL: return ((const uint8_t *)base)[i] != 0; /* any non-zero byte is true */
    default: return NAN;
    }
}

/* Truncate v toward zero into [lo, hi]; NaN gives 0. lo and hi are exact in double, and the
 * comparisons happen before the cast, so the cast itself is always defined. */
static double trunc_saturate(double v, double lo, double hi) {
    if (isnan(v))
        return 0.0;
    if (v <= lo)
        return lo;
    if (v >= hi)
        return hi;
    return trunc(v);
}

/* v as a float rounded to odd: truncated toward zero, with the last bit set when anything
 * was cut off. Rounding that float to f16 or bf16 (at least 2 bits narrower) then gives the
 * correctly rounded result of v; plain (float)v would round twice and can turn a value just
 * above a half-way point into an exact tie (1 + 2^-11 + 2^-40 would become 1, not 1 + 2^-10). */
static float f64_to_f32_odd(double v) {
    float f = (float)v;
    if (isnan(v) || isinf(f) || (double)f == v)
        return f;
    if (fabs((double)f) > fabs(v)) /* rounded away from zero: step back */
        f = nextafterf(f, 0.0f);
    return f32_from_bits(f32_bits(f) | 1u);
}

/* Floating stores round once, to nearest even, to the dtype. Integer stores truncate toward
 * zero to int64, saturating at int64's range (NaN stores 0), then wrap to the dtype's width
 * like a C integer conversion (-1 stores 255 in uint8, as PyTorch does). bool stores v != 0
 * (so NaN is true). */
/* v truncated toward zero and saturated to int64 (NaN: 0). INT64_MAX is not a double, so
 * everything >= 2^63 saturates to it by hand. */
static int64_t store_i64(double v) {
    if (!isnan(v) && v >= 0x1p63) return INT64_MAX;
    return (int64_t)trunc_saturate(v, -0x1p63, 0x1p63 - 1024.0);
}

void em_dtype_store(em_dtype dt, void *base, int64_t i, double v) {
    switch (dt) {
    case EM_F32: ((float *)base)[i] = (float)v; break;
    case EM_F64: ((double *)base)[i] = v; break;
    case EM_F16: ((uint16_t *)base)[i] = em_f32_to_f16(f64_to_f32_odd(v)); break;
    case EM_BF16: ((uint16_t *)base)[i] = em_f32_to_bf16(f64_to_f32_odd(v)); break;
    case EM_I32:
        ((int32_t *)base)[i] = (int32_t)(uint32_t)(uint64_t)store_i64(v);
        break;
    case EM_I64: ((int64_t *)base)[i] = store_i64(v); break;
    case EM_U8: ((uint8_t *)base)[i] = (uint8_t)(uint64_t)store_i64(v); break;
    case EM_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: break;
    }
}
