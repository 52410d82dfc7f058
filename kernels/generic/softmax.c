/* The online-softmax step and the normalisation on the portable path: the
 * driver of softmax_driver.h over one-lane (scalar) primitives, with an
 * inline exp so the loops stay free of calls. */
#include <math.h>
#include <string.h>

#include "generic.h"

/* exp(x) for x <= 0 (or NaN), inline and branch-free so the softmax loop
 * vectorises: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-7
 * Taylor polynomial (truncation < 1e-8 relative), and 2^n built in the
 * exponent bits. Results from the floor of kernels.h down (x below
 * MK_EXP_FLOOR_LN, about -44.708) are 0; NaN stays NaN. */
static inline float exp_nonpositive(float x)
{
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f;
    const float ln2_lo = -2.12194440e-4f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: rounds to integer */
    /* Below the floor the result is discarded (the return): clamped
     * there, n stays far above -126, where the bits below would wrap. */
    float xc = x < MK_EXP_FLOOR_LN ? MK_EXP_FLOOR_LN : x;
    float t = xc * log2e + shifter;
    float n = t - shifter;
    float r = (xc - n * ln2_hi) - n * ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t tbits, sbits;
    memcpy(&tbits, &t, sizeof tbits);
    /* The low mantissa bits of t hold n (two's complement, as n >= -126). */
    sbits = (tbits - 0x4B400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &sbits, sizeof scale);
    float e = p * scale;
    return x < MK_EXP_FLOOR_LN ? 0.0f : e;
}

#define MK_V float
#define MK_VM int
#define MK_W 1
#define MK_INLINE static inline

/* With one lane, every chunk is whole: the _n forms and masks exist for
 * the driver's tail branches, which never run. */
MK_INLINE MK_VM mk_v_lanes(int64_t n) { return n > 0; }
MK_INLINE MK_V mk_v_set1(float f) { return f; }
MK_INLINE MK_V mk_v_load(const float *p) { return *p; }
MK_INLINE void mk_v_store(float *p, MK_V x) { *p = x; }
MK_INLINE MK_V mk_v_load_n(const float *p, int64_t n)
{
    return n > 0 ? *p : 0.0f;
}
MK_INLINE void mk_v_store_n(float *p, int64_t n, MK_V x)
{
    if (n > 0)
        *p = x;
}
MK_INLINE MK_VM mk_v_keep(const uint8_t *keep, int64_t n)
{
    return n > 0 && *keep != 0;
}
MK_INLINE MK_V mk_v_sel(MK_VM m, MK_V x, MK_V y) { return m ? x : y; }
MK_INLINE MK_VM mk_v_abs_lt(MK_V x, MK_V s) { return fabsf(x) < s; }
MK_INLINE MK_V mk_v_add(MK_V x, MK_V y) { return x + y; }
MK_INLINE MK_V mk_v_sub(MK_V x, MK_V y) { return x - y; }
MK_INLINE MK_V mk_v_mul(MK_V x, MK_V y) { return x * y; }
/* Two roundings: the build passes -ffp-contract=off. */
MK_INLINE MK_V mk_v_fma(MK_V a, MK_V b, MK_V c) { return a * b + c; }
MK_INLINE MK_V mk_v_max(MK_V x, MK_V acc) { return x > acc ? x : acc; }
MK_INLINE MK_V mk_v_exp(MK_V x) { return exp_nonpositive(x); }
MK_INLINE MK_V mk_v_abs(MK_V x) { return fabsf(x); }
MK_INLINE MK_V mk_v_copysign(MK_V x, MK_V s) { return copysignf(x, s); }
MK_INLINE MK_V mk_v_div(MK_V x, MK_V y) { return x / y; }
MK_INLINE float mk_v_hmax(MK_V x) { return x; }
MK_INLINE float mk_v_hsum(MK_V x) { return x; }

#define MK_ISA generic
#include "softmax_driver.h"
