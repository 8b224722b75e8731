/*
 * ember/dtype.h — element types, their sizes and names, scalar conversions, and PyTorch's type
 * promotion.
 *
 *     em_dtype t = em_dtype_promote(EM_I64, EM_F32);   // EM_F32, as in PyTorch
 *     uint16_t h = em_f32_to_f16(1.0f / 3.0f);         // round-to-nearest-even
 *
 * Values are stable ABI; new dtypes are appended.
 */
#ifndef EMBER_DTYPE_H
#define EMBER_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ember/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum em_dtype {
    EM_F32 = 0,
    EM_F64 = 1,
    EM_F16 = 2,
    EM_BF16 = 3,
    EM_I32 = 4,
    EM_I64 = 5,
    EM_U8 = 6,
    EM_BOOL = 7,
    EM_DTYPE_COUNT /* not a dtype: the number of them */
} em_dtype;

/* Bytes per element; 0 for an invalid dtype. */
EM_API size_t em_dtype_size(em_dtype dt);
/* "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "bool" (PyTorch's
 * names); "invalid" otherwise. Never NULL. */
EM_API const char *em_dtype_name(em_dtype dt);
/* Parse a name: PyTorch's ("float32"), short ("f32"), or the C type ("float"). Returns
 * EM_OK or EM_ERR_DTYPE (with a message that lists the valid names). */
EM_API int em_dtype_parse(const char *name, em_dtype *out /* out */);
EM_API bool em_dtype_is_floating(em_dtype dt);
EM_API bool em_dtype_is_integral(em_dtype dt); /* i32, i64, u8 (not bool) */
EM_API bool em_dtype_is_valid(em_dtype dt);

/* The dtype a binary op computes in, following PyTorch's promotion lattice for tensors of the
 * same category: bool < u8 < i32 < i64 < floating; f16 with bf16 gives f32; among floating
 * types the wider wins. */
EM_API em_dtype em_dtype_promote(em_dtype a, em_dtype b);

/* IEEE half and bfloat16 conversions, round-to-nearest-even; NaN stays NaN, overflow gives
 * infinity. */
EM_API uint16_t em_f32_to_f16(float f);
EM_API float em_f16_to_f32(uint16_t h);
EM_API uint16_t em_f32_to_bf16(float f);
EM_API float em_bf16_to_f32(uint16_t h);

/* Read element `i` of a contiguous buffer of dtype `dt` as a double, and write one. These
 * define Ember's scalar conversions: every backend's copy kernel converts the same way.
 * Storing rounds once to nearest even for floating dtypes (f16/bf16 included); integer
 * dtypes truncate toward zero to int64 (saturating there; NaN stores 0), then wrap to their
 * width like a C integer conversion (-1 stores 255 in uint8, as PyTorch does); bool stores
 * v != 0 (NaN is true). Loading a bool reads any non-zero byte as 1. */
EM_API double em_dtype_load(em_dtype dt, const void *base, int64_t i);
EM_API void em_dtype_store(em_dtype dt, void *base, int64_t i, double v);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_DTYPE_H */
