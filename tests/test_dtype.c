/*
 * test_dtype.c — dtype sizes, names, parsing, PyTorch's promotion table, the f16/bf16
 * conversions (exhaustive over all 65536 patterns, ties checked against an independent
 * nearest-value search) and per-element load/store.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <ember/ember.h>

#include "clean_shutdown.h" /* every Test() ends with em_shutdown_checked() == EM_OK */

static void setup(void) {
    cr_assert_eq(em_init(), EM_OK, "em_init: %s", em_last_error());
}

static void teardown(void) {
    cr_assert_eq(em_shutdown_checked(), EM_OK, "%s", em_last_error());
}

TestSuite(dtype, .init = setup, .fini = teardown);

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- sizes, names, parsing ---------------------------------------------------------------- */

Test(dtype, sizes_and_names) {
    static const struct {
        em_dtype dt;
        size_t size;
        const char *name;
    } want[] = {
        {EM_F32, 4, "float32"}, {EM_F64, 8, "float64"}, {EM_F16, 2, "float16"},
        {EM_BF16, 2, "bfloat16"}, {EM_I32, 4, "int32"}, {EM_I64, 8, "int64"},
        {EM_U8, 1, "uint8"}, {EM_BOOL, 1, "bool"},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        cr_expect_eq(em_dtype_size(want[k].dt), want[k].size, "size of %s", want[k].name);
        cr_expect_str_eq(em_dtype_name(want[k].dt), want[k].name);
        cr_expect(em_dtype_is_valid(want[k].dt));
    }
    cr_expect_eq(em_dtype_size(EM_DTYPE_COUNT), 0);
    cr_expect_str_eq(em_dtype_name(EM_DTYPE_COUNT), "invalid");
    cr_expect_str_eq(em_dtype_name((em_dtype)-1), "invalid");
    cr_expect_not(em_dtype_is_valid(EM_DTYPE_COUNT));
    cr_expect_not(em_dtype_is_valid((em_dtype)-1));
}

Test(dtype, categories) {
    /* F32 F64 F16 BF16 I32 I64 U8 BOOL */
    static const bool floating[EM_DTYPE_COUNT] = {1, 1, 1, 1, 0, 0, 0, 0};
    static const bool integral[EM_DTYPE_COUNT] = {0, 0, 0, 0, 1, 1, 1, 0};
    for (int d = 0; d < EM_DTYPE_COUNT; d++) {
        cr_expect_eq(em_dtype_is_floating((em_dtype)d), floating[d], "%s", em_dtype_name(d));
        cr_expect_eq(em_dtype_is_integral((em_dtype)d), integral[d], "%s", em_dtype_name(d));
    }
    cr_expect_not(em_dtype_is_floating(EM_DTYPE_COUNT));
    cr_expect_not(em_dtype_is_integral(EM_DTYPE_COUNT));
}

Test(dtype, parse_good_names) {
    static const struct {
        const char *name;
        em_dtype dt;
    } good[] = {
        {"float32", EM_F32}, {"f32", EM_F32}, {"float", EM_F32},
        {"float64", EM_F64}, {"f64", EM_F64}, {"double", EM_F64},
        {"float16", EM_F16}, {"f16", EM_F16}, {"half", EM_F16},
        {"bfloat16", EM_BF16}, {"bf16", EM_BF16},
        {"int32", EM_I32}, {"i32", EM_I32}, {"int", EM_I32},
        {"int64", EM_I64}, {"i64", EM_I64}, {"long", EM_I64},
        {"uint8", EM_U8}, {"u8", EM_U8}, {"bool", EM_BOOL},
    };
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        em_dtype dt = EM_DTYPE_COUNT;
        cr_expect_eq(em_dtype_parse(good[k].name, &dt), EM_OK, "parse '%s'", good[k].name);
        cr_expect_eq(dt, good[k].dt, "parse '%s'", good[k].name);
    }
    /* Every name em_dtype_name gives parses back to its dtype. */
    for (int d = 0; d < EM_DTYPE_COUNT; d++) {
        em_dtype dt = EM_DTYPE_COUNT;
        cr_expect_eq(em_dtype_parse(em_dtype_name(d), &dt), EM_OK);
        cr_expect_eq(dt, (em_dtype)d);
    }
}

Test(dtype, parse_bad_names) {
    static const char *const bad[] = {"float33", "", "Float32", "float32 ", "int8", "complex64"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        em_dtype dt = EM_I64;
        cr_expect_eq(em_dtype_parse(bad[k], &dt), EM_ERR_DTYPE, "parse '%s'", bad[k]);
        cr_expect_eq(em_last_status(), EM_ERR_DTYPE);
        cr_expect_eq(dt, EM_I64, "out must be untouched on failure");
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", bad[k]);
        const char *msg = em_last_error();
        cr_expect(strstr(msg, quoted) != NULL, "message names the bad name: %s", msg);
        cr_expect(strstr(msg, "float32") && strstr(msg, "bfloat16") && strstr(msg, "bool"),
                  "message lists the valid names: %s", msg);
    }
    em_dtype dt;
    cr_expect_eq(em_dtype_parse(NULL, &dt), EM_ERR_DTYPE);
    cr_expect(strstr(em_last_error(), "NULL") != NULL, "%s", em_last_error());
}

/* ---- promotion ---------------------------------------------------------------------------- */

/* torch.promote_types(a, b) for every pair, in enum order F32 F64 F16 BF16 I32 I64 U8 BOOL.
 * From PyTorch's rules: floating beats integral; among floats f64 wins, f16 with bf16 (or
 * either with f32) meets at f32; among integers bool < uint8 < int32 < int64. */
static const em_dtype promote_table[EM_DTYPE_COUNT][EM_DTYPE_COUNT] = {
    /*          F32     F64     F16      BF16     I32      I64      U8       BOOL   */
    /* F32  */ {EM_F32, EM_F64, EM_F32,  EM_F32,  EM_F32,  EM_F32,  EM_F32,  EM_F32},
    /* F64  */ {EM_F64, EM_F64, EM_F64,  EM_F64,  EM_F64,  EM_F64,  EM_F64,  EM_F64},
    /* F16  */ {EM_F32, EM_F64, EM_F16,  EM_F32,  EM_F16,  EM_F16,  EM_F16,  EM_F16},
    /* BF16 */ {EM_F32, EM_F64, EM_F32,  EM_BF16, EM_BF16, EM_BF16, EM_BF16, EM_BF16},
    /* I32  */ {EM_F32, EM_F64, EM_F16,  EM_BF16, EM_I32,  EM_I64,  EM_I32,  EM_I32},
    /* I64  */ {EM_F32, EM_F64, EM_F16,  EM_BF16, EM_I64,  EM_I64,  EM_I64,  EM_I64},
    /* U8   */ {EM_F32, EM_F64, EM_F16,  EM_BF16, EM_I32,  EM_I64,  EM_U8,   EM_U8},
    /* BOOL */ {EM_F32, EM_F64, EM_F16,  EM_BF16, EM_I32,  EM_I64,  EM_U8,   EM_BOOL},
};

Test(dtype, promotion_matches_pytorch) {
    for (int a = 0; a < EM_DTYPE_COUNT; a++)
        for (int b = 0; b < EM_DTYPE_COUNT; b++)
            cr_expect_eq(em_dtype_promote(a, b), promote_table[a][b], "%s + %s: got %s, want %s",
                         em_dtype_name(a), em_dtype_name(b),
                         em_dtype_name(em_dtype_promote(a, b)),
                         em_dtype_name(promote_table[a][b]));
    cr_expect_not(em_dtype_is_valid(em_dtype_promote(EM_DTYPE_COUNT, EM_F32)));
    cr_expect_not(em_dtype_is_valid(em_dtype_promote(EM_I32, (em_dtype)-1)));
}

/* ---- f16 ---------------------------------------------------------------------------------- */

/* IEEE binary16 decoded from its fields, independently of the library. */
static double f16_value(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0x1f)
        v = mant ? NAN : INFINITY;
    else if (exp == 0)
        v = ldexp(mant, -24);
    else
        v = ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

static bool f16_is_nan(uint16_t h) {
    return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

Test(dtype, f16_exhaustive_decode_and_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = em_f16_to_f32((uint16_t)h);
        double want = f16_value((uint16_t)h);
        if (f16_is_nan((uint16_t)h)) {
            cr_assert(isnan(f), "0x%04x should decode to NaN", h);
            cr_assert_eq(signbit(f) != 0, (h & 0x8000) != 0, "NaN sign of 0x%04x", h);
            uint16_t back = em_f32_to_f16(f);
            cr_assert(f16_is_nan(back), "0x%04x -> NaN -> 0x%04x is not NaN", h, back);
            cr_assert(back & 0x200, "0x%04x -> 0x%04x is not a quiet NaN", h, back);
            continue;
        }
        cr_assert_eq((double)f, want, "0x%04x decodes to %a, want %a", h, f, want);
        cr_assert_eq(signbit(f) != 0, (h & 0x8000) != 0, "sign of 0x%04x", h);
        uint16_t back = em_f32_to_f16(f);
        cr_assert_eq(back, h, "0x%04x -> %a -> 0x%04x", h, f, back);
    }
}

/* Every tie between two adjacent finite halves rounds to the even one; one float ulp either
 * side rounds to the nearer. Exhaustive over positive and negative patterns. */
Test(dtype, f16_ties_to_even_exhaustive) {
    for (uint32_t h = 0; h < 0x7bff; h++) {
        for (int s = 0; s < 2; s++) {
            uint16_t sg = s ? 0x8000 : 0;
            float a = em_f16_to_f32((uint16_t)(h | sg));
            float b = em_f16_to_f32((uint16_t)((h + 1) | sg));
            float mid = (float)(((double)a + (double)b) / 2); /* exact: 12 bits */
            cr_assert_eq((double)mid, ((double)a + (double)b) / 2);
            uint16_t even = (uint16_t)(((h & 1) ? h + 1 : h) | sg);
            cr_assert_eq(em_f32_to_f16(mid), even, "tie %a between 0x%04x and 0x%04x", mid,
                         h | sg, (h + 1) | sg);
            float below = nextafterf(mid, a), above = nextafterf(mid, b);
            cr_assert_eq(em_f32_to_f16(below), (uint16_t)(h | sg), "%a", below);
            cr_assert_eq(em_f32_to_f16(above), (uint16_t)((h + 1) | sg), "%a", above);
        }
    }
}

/* Reference rounding: the largest finite half <= |v| by binary search over the (monotonic)
 * positive patterns, then the nearer of it and the next, ties to even. The pattern after the
 * largest finite (0x7c00, inf) stands for 2^16, where the exponent range would continue: IEEE
 * rounds to inf exactly when |v| >= 65520, the midpoint of 65504 and 2^16. */
static uint16_t ref_f16(double v) {
    double x = fabs(v);
    uint16_t sign = signbit(v) ? 0x8000 : 0;
    uint32_t lo = 0, hi = 0x7bff;
    if (x >= 65504.0) {
        lo = 0x7bff;
    } else {
        while (lo < hi) { /* largest h with value(h) <= x */
            uint32_t m = (lo + hi + 1) / 2;
            if ((double)em_f16_to_f32((uint16_t)m) <= x)
                lo = m;
            else
                hi = m - 1;
        }
    }
    double vlo = em_f16_to_f32((uint16_t)lo);
    double vhi = lo == 0x7bff ? 65536.0 : em_f16_to_f32((uint16_t)(lo + 1));
    double dlo = x - vlo, dhi = vhi - x;
    uint32_t r;
    if (dlo < dhi)
        r = lo;
    else if (dhi < dlo)
        r = lo + 1;
    else
        r = (lo & 1) ? lo + 1 : lo;
    return (uint16_t)(sign | r);
}

static uint32_t xorshift32(uint32_t *s) {
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

Test(dtype, f16_random_floats_against_reference) {
    uint32_t s = 0x12345678u;
    for (int k = 0; k < 300000; k++) {
        uint32_t r = xorshift32(&s);
        uint32_t bits;
        if (k % 2) /* any float */
            bits = r;
        else /* exponent 2^-27 .. 2^18: around the subnormal, normal and overflow ranges */
            bits = (r & 0x807fffffu) | ((100u + (xorshift32(&s) % 46u)) << 23);
        float f = float_of(bits);
        if (isnan(f))
            continue;
        uint16_t got = em_f32_to_f16(f), want = ref_f16(f);
        cr_assert_eq(got, want, "%a (0x%08x): got 0x%04x, want 0x%04x", f, bits, got, want);
    }
}

Test(dtype, f16_special_values) {
    cr_expect_eq(em_f32_to_f16(0.0f), 0x0000);
    cr_expect_eq(em_f32_to_f16(-0.0f), 0x8000);
    cr_expect(signbit(em_f16_to_f32(0x8000)) && em_f16_to_f32(0x8000) == 0.0f);
    cr_expect_eq(em_f32_to_f16(1.0f), 0x3c00);
    cr_expect_eq(em_f32_to_f16(-2.0f), 0xc000);
    cr_expect_eq(em_f32_to_f16(65504.0f), 0x7bff);
    cr_expect_eq(em_f32_to_f16(65519.99f), 0x7bff);
    cr_expect_eq(em_f32_to_f16(65520.0f), 0x7c00);   /* the tie goes to inf (even) */
    cr_expect_eq(em_f32_to_f16(1e10f), 0x7c00);
    cr_expect_eq(em_f32_to_f16(-1e10f), 0xfc00);
    cr_expect_eq(em_f32_to_f16(FLT_MAX), 0x7c00);
    cr_expect_eq(em_f32_to_f16(INFINITY), 0x7c00);
    cr_expect_eq(em_f32_to_f16(-INFINITY), 0xfc00);
    cr_expect(isinf(em_f16_to_f32(0x7c00)) && em_f16_to_f32(0x7c00) > 0);
    /* subnormals: 2^-24 is the smallest; 2^-25 ties to 0; 3 * 2^-25 ties to 2 * 2^-24 */
    cr_expect_eq(em_f32_to_f16(0x1p-24f), 0x0001);
    cr_expect_eq(em_f32_to_f16(0x1p-25f), 0x0000);
    cr_expect_eq(em_f32_to_f16(-0x1p-25f), 0x8000);
    cr_expect_eq(em_f32_to_f16(0x1.0002p-25f), 0x0001);
    cr_expect_eq(em_f32_to_f16(0x3p-25f), 0x0002);
    cr_expect_eq(em_f32_to_f16(0x1p-14f), 0x0400);  /* smallest normal */
    cr_expect_eq(em_f32_to_f16(0x1.ffcp-15f), 0x0400); /* 1023.5 * 2^-24: tie, to even */
    cr_expect_eq(em_f32_to_f16(1e-30f), 0x0000);
    cr_expect_eq(em_f32_to_f16(0x1p-149f), 0x0000); /* float subnormal */
    cr_expect_eq(em_f16_to_f32(0x0001), 0x1p-24f);
    cr_expect_eq(em_f16_to_f32(0x03ff), 0x3ffp-24f);
    /* NaN, quiet or signalling, stays NaN; sign kept */
    cr_expect(f16_is_nan(em_f32_to_f16(NAN)));
    cr_expect(f16_is_nan(em_f32_to_f16(float_of(0x7f800001u)))); /* payload below bit 13 */
    cr_expect(f16_is_nan(em_f32_to_f16(float_of(0xff800001u))));
    cr_expect(em_f32_to_f16(float_of(0xff800001u)) & 0x8000);
    cr_expect(isnan(em_f16_to_f32(0x7c01)));
    cr_expect(bits_of(em_f16_to_f32(0x7c01)) & 0x400000u, "quiet");
}

/* ---- bfloat16 ----------------------------------------------------------------------------- */

static bool bf16_is_nan(uint16_t h) {
    return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

Test(dtype, bf16_exhaustive_decode_and_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = em_bf16_to_f32((uint16_t)h);
        if (bf16_is_nan((uint16_t)h)) {
            cr_assert(isnan(f), "0x%04x should decode to NaN", h);
            cr_assert_eq(signbit(f) != 0, (h & 0x8000) != 0);
            uint16_t back = em_f32_to_bf16(f);
            cr_assert(bf16_is_nan(back) && (back & 0x40), "0x%04x -> 0x%04x", h, back);
            continue;
        }
        /* bfloat16 is the top half of a float: the independent decoding */
        cr_assert_eq(bits_of(f), h << 16, "0x%04x decodes to 0x%08x", h, bits_of(f));
        cr_assert_eq(em_f32_to_bf16(f), h, "round trip of 0x%04x", h);
    }
}

Test(dtype, bf16_ties_to_even_exhaustive) {
    for (uint32_t h = 0; h < 0x7f7f; h++) {
        for (int s = 0; s < 2; s++) {
            uint32_t sg = s ? 0x8000 : 0;
            float a = em_bf16_to_f32((uint16_t)(h | sg));
            float b = em_bf16_to_f32((uint16_t)((h + 1) | sg));
            float mid = float_of(((h | sg) << 16) | 0x8000u); /* exactly halfway */
            cr_assert_eq((double)mid, ((double)a + (double)b) / 2);
            uint16_t even = (uint16_t)(((h & 1) ? h + 1 : h) | sg);
            cr_assert_eq(em_f32_to_bf16(mid), even, "tie %a", mid);
            cr_assert_eq(em_f32_to_bf16(nextafterf(mid, a)), (uint16_t)(h | sg));
            cr_assert_eq(em_f32_to_bf16(nextafterf(mid, b)), (uint16_t)((h + 1) | sg));
        }
    }
}

/* Reference: the nearer of the two bfloat16 values around |f| (the next after the largest
 * finite stands for 2^128), ties to even; computed in double. */
static uint16_t ref_f32_to_bf16(float f) {
    uint32_t ab = bits_of(f) & 0x7fffffffu;
    uint32_t lo = ab >> 16; /* truncation: the largest bf16 <= |f| */
    double x = fabs((double)f);
    double vlo = em_bf16_to_f32((uint16_t)lo);
    double vhi = lo == 0x7f7f ? ldexp(1.0, 128) : em_bf16_to_f32((uint16_t)(lo + 1));
    double dlo = x - vlo, dhi = vhi - x;
    uint32_t r = dlo < dhi ? lo : dhi < dlo ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
    return (uint16_t)((signbit(f) ? 0x8000 : 0) | r);
}

Test(dtype, bf16_random_floats_against_reference) {
    uint32_t s = 0x9e3779b9u;
    for (int k = 0; k < 300000; k++) {
        float f = float_of(xorshift32(&s));
        if (isnan(f) || isinf(f))
            continue;
        uint16_t got = em_f32_to_bf16(f), want = ref_f32_to_bf16(f);
        cr_assert_eq(got, want, "%a: got 0x%04x, want 0x%04x", f, got, want);
    }
}

Test(dtype, bf16_special_values) {
    cr_expect_eq(em_f32_to_bf16(0.0f), 0x0000);
    cr_expect_eq(em_f32_to_bf16(-0.0f), 0x8000);
    cr_expect(signbit(em_bf16_to_f32(0x8000)));
    cr_expect_eq(em_f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(em_f32_to_bf16(FLT_MAX), 0x7f80);      /* rounds up past the largest: inf */
    cr_expect_eq(em_f32_to_bf16(-FLT_MAX), 0xff80);
    cr_expect_eq(em_f32_to_bf16(float_of(0x7f7f7fffu)), 0x7f7f); /* just below the tie */
    cr_expect_eq(em_f32_to_bf16(INFINITY), 0x7f80);
    cr_expect_eq(em_f32_to_bf16(-INFINITY), 0xff80);
    /* subnormals both ways: the smallest bf16 subnormal is 2^-133 */
    cr_expect_eq(em_f32_to_bf16(0x1p-133f), 0x0001);
    cr_expect_eq(em_bf16_to_f32(0x0001), 0x1p-133f);
    cr_expect_eq(em_f32_to_bf16(0x1p-134f), 0x0000);    /* tie to even (0) */
    cr_expect_eq(em_f32_to_bf16(0x3p-134f), 0x0002);    /* tie to even (2) */
    cr_expect_eq(em_f32_to_bf16(0x1p-149f), 0x0000);
    /* NaN: a signalling NaN whose payload is all in the low 16 bits must not become inf */
    cr_expect(bf16_is_nan(em_f32_to_bf16(float_of(0x7f800001u))));
    cr_expect(bf16_is_nan(em_f32_to_bf16(float_of(0xff800001u))));
    cr_expect(em_f32_to_bf16(float_of(0xff800001u)) & 0x8000);
    cr_expect(bf16_is_nan(em_f32_to_bf16(NAN)));
    cr_expect(bits_of(em_bf16_to_f32(0x7f81)) & 0x400000u, "quiet");
}

/* ---- load and store ----------------------------------------------------------------------- */

Test(dtype, load_store_round_trip) {
    static const double values[] = {0.0, 1.0, -2.0, 3.5, 100.0, 0.25};
    unsigned char buf[8 * 6];
    for (int d = 0; d < EM_DTYPE_COUNT; d++) {
        for (int i = 0; i < 6; i++) {
            double v = em_dtype_is_floating(d) || d == EM_I32 || d == EM_I64
                           ? values[i]
                           : fabs(trunc(values[i]));
            if (d == EM_BOOL)
                v = v != 0;
            if (!em_dtype_is_floating(d))
                v = trunc(v);
            memset(buf, 0xa5, sizeof buf);
            em_dtype_store(d, buf, i, v);
            cr_expect_eq(em_dtype_load(d, buf, i), v, "%s element %d", em_dtype_name(d), i);
        }
    }
}

Test(dtype, store_layout) {
    float f[3];
    em_dtype_store(EM_F32, f, 2, 1.5);
    cr_expect_eq(f[2], 1.5f);
    uint16_t h[2];
    em_dtype_store(EM_F16, h, 1, 1.0);
    cr_expect_eq(h[1], 0x3c00);
    em_dtype_store(EM_BF16, h, 0, -2.0);
    cr_expect_eq(h[0], 0xc000);
    em_dtype_store(EM_F16, h, 0, 1.0 / 3.0);
    cr_expect_eq(h[0], em_f32_to_f16(1.0f / 3.0f));
    cr_expect_eq(em_dtype_load(EM_F16, h, 0), (double)em_f16_to_f32(h[0]));
    int64_t q[2];
    em_dtype_store(EM_I64, q, 1, 9007199254740992.0); /* 2^53 */
    cr_expect_eq(q[1], INT64_C(9007199254740992));
    uint8_t b[2] = {0, 7};
    cr_expect_eq(em_dtype_load(EM_BOOL, b, 1), 1.0, "any non-zero byte reads as true");
    cr_expect_eq(em_dtype_load(EM_U8, b, 1), 7.0);
}

Test(dtype, store_integer_truncation_saturation_and_wrapping) {
    int32_t i32[1];
    int64_t i64[1];
    uint8_t u8[1];
    uint8_t bo[1];
    static const struct {
        double v;
        int32_t i32;
        int64_t i64;
        uint8_t u8;
        uint8_t b;
    } cases[] = {
        /* Truncate toward zero to int64 (saturating there), then wrap to the width. */
        {2.7, 2, 2, 2, 1},
        {-2.7, -2, -2, 254, 1},  /* -2 wraps to 254 in uint8, as PyTorch gives */
        {0.5, 0, 0, 0, 1},       /* bool is v != 0 */
        {-0.0, 0, 0, 0, 0},
        {0.0, 0, 0, 0, 0},
        {255.9, 255, 255, 255, 1},
        {300.0, 300, 300, 44, 1}, /* 300 mod 256 */
        {1e20, -1, INT64_MAX, 255, 1},  /* INT64_MAX's low 32 and 8 bits */
        {-1e20, 0, INT64_MIN, 0, 1},    /* INT64_MIN's low bits are all 0 */
        {0x1p63, -1, INT64_MAX, 255, 1},
        {-0x1p63, 0, INT64_MIN, 0, 1},
        {2147483647.9, INT32_MAX, 2147483647, 255, 1},
        {-2147483648.9, INT32_MIN, -2147483648LL, 0, 1},
        {4294967296.0 + 5, 5, 4294967301LL, 5, 1},
        {INFINITY, -1, INT64_MAX, 255, 1},
        {-INFINITY, 0, INT64_MIN, 0, 1},
        {NAN, 0, 0, 0, 1},       /* NaN stores 0 in integers; NaN != 0 is true */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        double v = cases[k].v;
        em_dtype_store(EM_I32, i32, 0, v);
        em_dtype_store(EM_I64, i64, 0, v);
        em_dtype_store(EM_U8, u8, 0, v);
        em_dtype_store(EM_BOOL, bo, 0, v);
        cr_expect_eq(i32[0], cases[k].i32, "int32 of %g: %d", v, i32[0]);
        cr_expect_eq(i64[0], cases[k].i64, "int64 of %g: %lld", v, (long long)i64[0]);
        cr_expect_eq(u8[0], cases[k].u8, "uint8 of %g: %d", v, u8[0]);
        cr_expect_eq(bo[0], cases[k].b, "bool of %g: %d", v, bo[0]);
    }
}

Test(dtype, store_floating_rounding) {
    double d[1];
    float f[1];
    uint16_t h[1];
    em_dtype_store(EM_F64, d, 0, 0.1);
    cr_expect_eq(d[0], 0.1);
    em_dtype_store(EM_F32, f, 0, 0.1);
    cr_expect_eq(f[0], 0.1f);
    em_dtype_store(EM_F16, h, 0, 1e6);
    cr_expect_eq(h[0], 0x7c00, "overflow to inf");
    em_dtype_store(EM_BF16, h, 0, NAN);
    cr_expect(bf16_is_nan(h[0]));
    /* 1 + 2^-11 + 2^-40 is just above the tie between 1 and the next half: it must round up,
     * although (float)v alone would drop the 2^-40 and make it a tie (rounding to 1). */
    em_dtype_store(EM_F16, h, 0, 1.0 + 0x1p-11 + 0x1p-40);
    cr_expect_eq(h[0], 0x3c01);
    em_dtype_store(EM_F16, h, 0, 1.0 + 0x1p-11);
    cr_expect_eq(h[0], 0x3c00, "an exact tie goes to even");
    em_dtype_store(EM_BF16, h, 0, 1.0 + 0x1p-8 + 0x1p-40);
    cr_expect_eq(h[0], 0x3f81);
    em_dtype_store(EM_BF16, h, 0, -(1.0 + 0x1p-8));
    cr_expect_eq(h[0], 0xbf80);
}

/* Stores of doubles to f16 and bf16 are rounded once, against the nearest-value reference
 * (computed in double; for bf16 by truncating to float toward zero first, exact on the
 * bf16 grid, then comparing distances in double). */
static uint16_t ref_bf16_of_double(double v) {
    double x = fabs(v);
    float t = (float)x;
    if ((double)t > x)
        t = nextafterf(t, 0.0f);
    uint32_t lo = bits_of(t) >> 16; /* largest bf16 <= x */
    if (lo >= 0x7f80)
        lo = 0x7f7f;
    double vlo = em_bf16_to_f32((uint16_t)lo);
    double vhi = lo == 0x7f7f ? ldexp(1.0, 128) : em_bf16_to_f32((uint16_t)(lo + 1));
    double dlo = x - vlo, dhi = vhi - x;
    uint32_t r = dlo < dhi ? lo : dhi < dlo ? lo + 1 : ((lo & 1) ? lo + 1 : lo);
    return (uint16_t)((signbit(v) ? 0x8000 : 0) | r);
}

Test(dtype, store_f64_to_half_rounds_once) {
    uint32_t s = 0xdeadbeefu;
    for (int k = 0; k < 200000; k++) {
        /* a random double between 2^-30 and 2^20, with low bits that float would drop */
        uint64_t m = ((uint64_t)xorshift32(&s) << 32) | xorshift32(&s);
        double v = ldexp(1.0 + (double)(m >> 11) * 0x1p-53, (int)(xorshift32(&s) % 51) - 30);
        if (k % 3 == 0) { /* at a half tie, or one double ulp either side of it */
            uint16_t hh = (uint16_t)(xorshift32(&s) % 0x7bff);
            double mid = ((double)em_f16_to_f32(hh) + (double)em_f16_to_f32(hh + 1)) / 2;
            int side = (int)(xorshift32(&s) % 3);
            v = side == 0 ? mid : nextafter(mid, side == 1 ? 0.0 : 1e9);
        }
        if (xorshift32(&s) & 1)
            v = -v;
        uint16_t h[1], b[1];
        em_dtype_store(EM_F16, h, 0, v);
        em_dtype_store(EM_BF16, b, 0, v);
        cr_assert_eq(h[0], ref_f16(v), "f16 of %a: got 0x%04x, want 0x%04x", v, h[0],
                     ref_f16(v));
        cr_assert_eq(b[0], ref_bf16_of_double(v), "bf16 of %a: got 0x%04x, want 0x%04x", v,
                     b[0], ref_bf16_of_double(v));
    }
}
