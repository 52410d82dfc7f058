/* Portable widening of half-precision keys and values to fp32. Written on
 * the bits, branch-light, so the loops vectorise. */
#include <string.h>

#include "generic.h"

/* binary16 -> binary32 without branches: exponent and mantissa moved into
 * place and rebiased by integer adds (normals), the all-ones exponent for
 * infinities and NaNs, and for subnormals (exponent 0) 2^-14 * (1 + m/1024)
 * minus 2^-14, exact in one float subtraction whose operands and result are
 * normal floats (so flush-to-zero and denormals-are-zero modes cannot touch
 * it). The subtraction runs for every value and integer masks pick the
 * result, so the loop vectorises. */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t body = (uint32_t)(h & 0x7FFFu) << 13;
    uint32_t exp = h & 0x7C00u;
    uint32_t normal = body + (112u << 23);
    uint32_t special = 0u - (uint32_t)(exp == 0x7C00u);
    uint32_t subnormal = 0u - (uint32_t)(exp == 0);
    uint32_t bits = body + (113u << 23), sub;
    float f;
    memcpy(&f, &bits, sizeof f);
    f -= 6.103515625e-05f; /* 2^-14 */
    memcpy(&sub, &f, sizeof sub);
    bits = (normal & ~(special | subnormal)) |
           ((body | 0x7F800000u) & special) | (sub & subnormal);
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, sizeof f);
    return f;
}

void mk_generic_widen_f32(const void *x, int64_t n, float *y)
{
    if (n > 0)
        memcpy(y, x, (size_t)n * sizeof *y);
}

void mk_generic_widen_f16(const void *x, int64_t n, float *y)
{
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = f16_to_f32(h[i]);
}

void mk_generic_widen_bf16(const void *x, int64_t n, float *y)
{
    const uint16_t *h = x;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)h[i] << 16;
        memcpy(&y[i], &bits, sizeof bits);
    }
}

void mk_generic_widen_i8(const void *x, int64_t n, float *y)
{
    const int8_t *c = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)c[i];
}

/* OCP E4M3: value = 2^(e-7) * (1 + m/8), subnormals (e = 0) m * 2^-9, and
 * S.1111.111 NaN (no infinities). Every value is an integer times 2^-9
 * below 2^18, so it is built as that integer (exact in fp32) times 2^-9:
 * integer work and one multiply whose result is a normal float, exact
 * under flush-to-zero. */
static float fp8_e4m3_to_f32(uint8_t c)
{
    uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
    uint32_t units = e ? (8u + m) << (e - 1) : m;
    float f = (float)units * 0x1p-9f;
    if ((c & 0x7Fu) == 0x7Fu)
        f = NAN;
    return (c & 0x80u) ? -f : f;
}

void mk_generic_widen_fp8_e4m3(const void *x, int64_t n, float *y)
{
    const uint8_t *c = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = fp8_e4m3_to_f32(c[i]);
}

/* OCP E5M2 is the high byte of an IEEE binary16 (infinities and NaN
 * included). */
void mk_generic_widen_fp8_e5m2(const void *x, int64_t n, float *y)
{
    const uint8_t *c = x;
    for (int64_t i = 0; i < n; i++)
        y[i] = f16_to_f32((uint16_t)(c[i] << 8));
}
