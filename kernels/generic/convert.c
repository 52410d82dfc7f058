/* Portable widening of half-precision keys and values to fp32. Written on
 * the bits, branch-light, so the loops vectorise. */
#include <string.h>

#include "generic.h"

/* binary16 -> binary32 without branches: the 15 bits of exponent and
 * mantissa, moved into place, read as a float are the value times 2^-112
 * (a subnormal binary16 lands on a float subnormal), so one exact multiply
 * by 2^112 rebiases normals and subnormals alike; infinities and NaNs
 * (exponent 31) get the all-ones exponent instead. Every floating-point
 * step is unconditional, so the loop vectorises. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t body = (uint32_t)(h & 0x7FFFu) << 13, bits;
    float f;
    memcpy(&f, &body, sizeof f);
    f *= 0x1p112f;
    memcpy(&bits, &f, sizeof bits);
    uint32_t special = 0u - (uint32_t)((h & 0x7C00u) == 0x7C00u);
    bits = (bits & ~special) | ((body | 0x7F800000u) & special);
    bits |= (uint32_t)(h & 0x8000u) << 16;
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
