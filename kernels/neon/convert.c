/* Half-precision keys and values widened to fp32, four lanes a step:
 * binary16 with FCVTL (exact for every finite value and infinity), bfloat16
 * with a 16-bit widening shift. FCVTL quiets a signalling NaN, so NaN lanes
 * are rebuilt from their bits: every input, NaN payloads included, widens
 * to the same bits as on the generic path. And a half compute call's fp32
 * output rows narrowed back: binary16 with FCVTN, bfloat16 rounded on the
 * bits (as engine/dtype.c's to_bf16). */
#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#include "neon.h"

/* Four binary16 values (as bits) to fp32. */
static inline float32x4_t f16x4_to_f32(uint16x4_t h)
{
    float32x4_t y = vcvt_f32_f16(vreinterpret_f16_u16(h));
    uint32x4_t w = vmovl_u16(h);
    uint32x4_t nan =
        vcgtq_u32(vandq_u32(w, vdupq_n_u32(0x7FFFu)), vdupq_n_u32(0x7C00u));
    uint32x4_t sign = vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x8000u)), 16);
    uint32x4_t payload = vshlq_n_u32(vandq_u32(w, vdupq_n_u32(0x03FFu)), 13);
    uint32x4_t nan_bits =
        vorrq_u32(vorrq_u32(sign, payload), vdupq_n_u32(0x7F800000u));
    return vbslq_f32(nan, vreinterpretq_f32_u32(nan_bits), y);
}

/* Four bfloat16 values (as bits) to fp32: the high half of each float. */
static inline float32x4_t bf16x4_to_f32(uint16x4_t h)
{
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

/* y[0..n) from x[0..n) through widen4, which maps 4 uint16 to 4 floats;
 * the tail goes through a zero-padded buffer, so nothing past n is read
 * or written. */
static inline __attribute__((always_inline)) void
widen(const uint16_t *x, int64_t n, float *y,
      float32x4_t (*widen4)(uint16x4_t))
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8_t h = vld1q_u16(x + i);
        vst1q_f32(y + i, widen4(vget_low_u16(h)));
        vst1q_f32(y + i + 4, widen4(vget_high_u16(h)));
    }
    for (; i < n; i += 4) {
        size_t lanes = (size_t)(n - i < 4 ? n - i : 4);
        uint16_t in[4] = {0};
        float out[4];
        memcpy(in, x + i, lanes * sizeof *in);
        vst1q_f32(out, widen4(vld1_u16(in)));
        memcpy(y + i, out, lanes * sizeof *out);
    }
}

/* y[i] = x[i] widened, i < n (binary16 and bfloat16). */
MK_DEFINE_WIDEN(neon, widen, f16x4_to_f32, bf16x4_to_f32)

/* y[0..n) from x[0..n) times scale through narrow4, which maps 4 floats
 * to 4 codes; the tail goes through a zero-padded buffer, as widen's. */
static inline __attribute__((always_inline)) void
narrow(const float *x, int64_t n, float scale, uint16_t *y,
       uint16x4_t (*narrow4)(float32x4_t))
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x4_t lo = narrow4(vmulq_n_f32(vld1q_f32(x + i), scale));
        uint16x4_t hi = narrow4(vmulq_n_f32(vld1q_f32(x + i + 4), scale));
        vst1q_u16(y + i, vcombine_u16(lo, hi));
    }
    for (; i < n; i += 4) {
        size_t lanes = (size_t)(n - i < 4 ? n - i : 4);
        float in[4] = {0};
        uint16_t out[4];
        memcpy(in, x + i, lanes * sizeof *in);
        vst1_u16(out, narrow4(vmulq_n_f32(vld1q_f32(in), scale)));
        memcpy(y + i, out, lanes * sizeof *out);
    }
}

/* FCVTN under Linux's default FPCR (round to nearest even, no flush to
 * zero, no default NaN): IEEE binary16 with its subnormals, overflow to
 * infinity, a NaN quiet with its sign and top payload bits, as
 * engine/dtype.c's to_f16. */
static inline uint16x4_t f32x4_to_f16(float32x4_t x)
{
    return vreinterpret_u16_f16(vcvt_f16_f32(x));
}

/* engine/dtype.c's to_bf16 on 4 lanes: the bits plus 0x7fff plus the kept
 * lowest bit, shifted down (nearest even); a NaN the top half with the
 * quiet bit set. */
static inline uint16x4_t f32x4_to_bf16(float32x4_t x)
{
    uint32x4_t u = vreinterpretq_u32_f32(x);
    uint32x4_t hi = vshrq_n_u32(u, 16);
    uint32x4_t r = vshrq_n_u32(
        vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fffu)),
                  vandq_u32(hi, vdupq_n_u32(1u))),
        16);
    uint32x4_t nan = vmvnq_u32(vceqq_f32(x, x));
    r = vbslq_u32(nan, vorrq_u32(hi, vdupq_n_u32(0x40u)), r);
    return vmovn_u32(r);
}

/* y[i] = x[i] narrowed, i < n (binary16 and bfloat16). */
MK_DEFINE_NARROW(neon, narrow, f32x4_to_f16, f32x4_to_bf16)
