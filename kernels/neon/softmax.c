/* The online-softmax step and the normalisation on NEON: the driver of
 * softmax_driver.h over 4-lane primitives; the exp pass in base 2 inline
 * (mk_v_exp2k), the rescale factors' exp from SLEEF
 * (Sleef_expf4_u10advsimd, 1.0 ULP). NEON has no masked loads: a tail
 * goes through a zero-padded copy, so nothing past the row is touched. */
#include <arm_neon.h>
#include <sleef.h>
#include <string.h>

#include "exp2_poly.h"
#include "neon.h"

#define MK_V float32x4_t
#define MK_VM uint32x4_t
#define MK_W 4
/* As the NEON kernel summed before the driver was shared. */
#define MK_SM_FUSED_SUM 1
#define MK_INLINE static inline __attribute__((always_inline))

MK_INLINE MK_VM mk_v_lanes(int64_t n)
{
    const uint32_t iota[4] = {0, 1, 2, 3};
    return vcltq_u32(vld1q_u32(iota), vdupq_n_u32((uint32_t)n));
}
MK_INLINE MK_V mk_v_set1(float f) { return vdupq_n_f32(f); }
MK_INLINE MK_V mk_v_load(const float *p) { return vld1q_f32(p); }
MK_INLINE void mk_v_store(float *p, MK_V x) { vst1q_f32(p, x); }
MK_INLINE MK_V mk_v_load_n(const float *p, int64_t n)
{
    float buf[4] = {0};
    memcpy(buf, p, (size_t)n * sizeof *buf);
    return vld1q_f32(buf);
}
MK_INLINE void mk_v_store_n(float *p, int64_t n, MK_V x)
{
    float buf[4];
    vst1q_f32(buf, x);
    memcpy(p, buf, (size_t)n * sizeof *buf);
}
MK_INLINE MK_VM mk_v_keep(const uint8_t *keep, int64_t n)
{
    uint8_t bytes[8] = {0};
    memcpy(bytes, keep, (size_t)n);
    uint16x8_t wide = vmovl_u8(vld1_u8(bytes));
    return vmvnq_u32(vceqzq_u32(vmovl_u16(vget_low_u16(wide))));
}
MK_INLINE MK_V mk_v_sel(MK_VM m, MK_V x, MK_V y) { return vbslq_f32(m, x, y); }
MK_INLINE MK_VM mk_v_abs_lt(MK_V x, MK_V s) { return vcaltq_f32(x, s); }
MK_INLINE MK_V mk_v_add(MK_V x, MK_V y) { return vaddq_f32(x, y); }
MK_INLINE MK_V mk_v_sub(MK_V x, MK_V y) { return vsubq_f32(x, y); }
MK_INLINE MK_V mk_v_mul(MK_V x, MK_V y) { return vmulq_f32(x, y); }
MK_INLINE MK_V mk_v_fma(MK_V a, MK_V b, MK_V c) { return vfmaq_f32(c, a, b); }
/* FMAXNM returns the number when one operand is NaN. */
MK_INLINE MK_V mk_v_max(MK_V x, MK_V acc) { return vmaxnmq_f32(x, acc); }
/* SLEEF's exp, made 0 from the floor of kernels.h down (x below
 * MK_EXP_FLOOR_LN, about -44.708), as the base-2 exp below and every
 * other table's exps make it. A NaN x fails the compare and stays NaN. */
MK_INLINE MK_V mk_v_exp(MK_V x)
{
    return vbslq_f32(vcltq_f32(x, vdupq_n_f32(MK_EXP_FLOOR_LN)),
                     vdupq_n_f32(0.0f), Sleef_expf4_u10advsimd(x));
}
/* k 2^t for t <= 2^-20 (sm_exp2 of softmax_driver.h: the exp pass in
 * base 2, its argument out of one FMA, k a correction near 1), inline as
 * on x86 (kernels/avx2/softmax.c): t clamped at -65, n = t rounded to
 * nearest, 2^(t - n) by kernels/exp2_poly.h's degree 5 with its
 * coefficients times 2^62 k (hoisted: k is the same across the caller's
 * loop), times 2^(n - 62) built as the bits (n + 65) << 23 (n = -65: +0,
 * so -inf gives 0, and a result from 2^-64.5 down is 0: the floor of
 * kernels.h). FMAX propagates a NaN t, whose n converts to 0 (2^-62 is
 * finite): NaN stays NaN. Replaces a SLEEF call per 4 scores in the exp
 * pass; the rescale factors keep SLEEF's exp (exp(0) exactly 1). */
MK_INLINE MK_V mk_v_exp2k(MK_V t, MK_V k)
{
    MK_V tc = vmaxq_f32(vdupq_n_f32(-65.0f), t);
    MK_V n = vrndnq_f32(tc);
#define MK_FMA(a, b, c) vfmaq_f32(c, a, b)
#define MK_CK(c) vmulq_f32(vdupq_n_f32((c) * 0x1p62f), k)
    MK_V p = MK_EXP2_DEG5(MK_FMA, MK_CK, vsubq_f32(tc, n));
#undef MK_CK
#undef MK_FMA
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(65)),
                              23);
    return vmulq_f32(p, vreinterpretq_f32_s32(e));
}
_Static_assert(2 * -65 + 1 == MK_EXP_FLOOR_HALVES,
               "mk_v_exp2k's clamp and bias");
#define MK_V_EXP2 1
MK_INLINE MK_V mk_v_abs(MK_V x) { return vabsq_f32(x); }
MK_INLINE MK_V mk_v_copysign(MK_V x, MK_V s)
{
    return vbslq_f32(vdupq_n_u32(0x80000000u), s, x);
}
MK_INLINE MK_V mk_v_div(MK_V x, MK_V y) { return vdivq_f32(x, y); }
MK_INLINE float mk_v_hmax(MK_V x) { return vmaxnmvq_f32(x); }
MK_INLINE float mk_v_hsum(MK_V x) { return vaddvq_f32(x); }

#define MK_ISA neon
#include "softmax_driver.h"
