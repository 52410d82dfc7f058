/* Portable widening of half-precision keys and values to fp32. Written on
 * the bits, branch-light, so the loops vectorise. */
#include <string.h>

#include "generic.h"

/* binary16 -> binary32: rebias normal exponents; subnormals are the
 * integer mantissa times 2^-24; infinities and NaNs keep their payload. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    float f;
    if (exp == 0) {
        f = (float)man * (1.0f / 16777216.0f); /* 2^-24, exact */
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    } else if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

void mk_generic_cvt_f16(const uint16_t *x, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = f16_to_f32(x[i]);
}

void mk_generic_cvt_bf16(const uint16_t *x, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)x[i] << 16;
        memcpy(&y[i], &bits, sizeof bits);
    }
}
