/* Portable widening of half-precision keys and values to fp32. Written on
 * the bits, branch-light, so the loops vectorise. */
#include <string.h>

#include "generic.h"

/* binary16 -> binary32 without branches: move exponent and mantissa into
 * place and rebias; a subnormal (exponent 0) is then off by 2^-14, which one
 * float subtraction of 2^-14 removes exactly; infinities and NaNs get the
 * all-ones exponent. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t body = (uint32_t)(h & 0x7FFFu) << 13;
    uint32_t exp = body & 0x0F800000u;
    uint32_t bits = body + (112u << 23);
    bits += exp == 0x0F800000u ? (112u << 23) : 0u;
    bits += exp == 0 ? (1u << 23) : 0u;
    float f, magic = 6.103515625e-05f; /* 2^-14 */
    memcpy(&f, &bits, sizeof f);
    f = exp == 0 ? f - magic : f;
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
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
