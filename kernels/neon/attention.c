/* The AArch64 Advanced SIMD (NEON) attention kernels.
 * Advanced SIMD is baseline on AArch64, so this file needs no ISA flags;
 * the engine still asks the CPU (HWCAP_ASIMD) before picking the table.
 * exp comes from SLEEF's Sleef_expf4_u10advsimd (1.0 ULP). */
#include <arm_neon.h>
#include <assert.h>
#include <math.h>
#include <sleef.h>
#include <string.h>

#include "gemm.h"
#include "kernels.h"
#include "neon.h"

/* S = Q Kᵀ on the 8x8 tile of gemm.c, K packed into 8-key panels. */
void mk_neon_qk_8x8(const float *q, ptrdiff_t ldq, int64_t m,
                           const float *kp, int64_t n, int64_t d, float *s,
                           ptrdiff_t lds)
{
    assert(m >= 0 && n >= 0 && d >= 0);
    assert(m <= 1 || lds >= n); /* inputs may broadcast: ldq >= 0 */
    assert(ldq >= 0);
    mk_neon_gemm_8x8(m, n, d, q, ldq, kp, MK_NEON_NR, d * MK_NEON_NR, NULL,
                     NULL, s, lds);
}

/* Four keep bytes as lanes: all ones where the byte is zero (masked). */
static inline uint32x4_t masked_lanes(const uint8_t *keep)
{
    uint32_t bytes;
    memcpy(&bytes, keep, sizeof bytes);
    uint16x8_t wide = vmovl_u8(vcreate_u8(bytes));
    return vceqzq_u32(vmovl_u16(vget_low_u16(wide)));
}

/* x = scale * s (+ bias), -inf where keep is 0, over columns [0, visible)
 * of one row, in place, 4 lanes a step and the same operations one lane at
 * a time on the tail. Returns the row maximum; like the generic path it
 * skips NaN (FMAXNM), so a NaN score reaches the output through exp rather
 * than through the maximum. */
static float scale_mask_row(float *row, const float *bias,
                            const uint8_t *keep, int64_t visible,
                            float scale)
{
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    float32x4_t vmax = ninf;
    int64_t j = 0;
    for (; j + 4 <= visible; j += 4) {
        float32x4_t x = vmulq_n_f32(vld1q_f32(row + j), scale);
        if (bias)
            x = vaddq_f32(x, vld1q_f32(bias + j));
        if (keep)
            x = vbslq_f32(masked_lanes(keep + j), ninf, x);
        vst1q_f32(row + j, x);
        vmax = vmaxnmq_f32(vmax, x);
    }
    float mx = vmaxnmvq_f32(vmax);
    for (; j < visible; j++) {
        float x = row[j] * scale;
        if (bias)
            x += bias[j];
        if (keep && !keep[j])
            x = -INFINITY;
        row[j] = x;
        mx = x > mx ? x : mx;
    }
    return mx;
}

/* P = exp(x - mx) over columns [0, visible) in place; returns the sum of
 * P. The tail goes through a buffer padded with -inf (exp gives 0) so every
 * element takes the same vector exp wherever it sits. */
static float exp_row(float *row, int64_t visible, float mx)
{
    const float32x4_t vmx = vdupq_n_f32(mx);
    float32x4_t sum = vdupq_n_f32(0.0f);
    int64_t j = 0;
    for (; j + 4 <= visible; j += 4) {
        float32x4_t p =
            Sleef_expf4_u10advsimd(vsubq_f32(vld1q_f32(row + j), vmx));
        vst1q_f32(row + j, p);
        sum = vaddq_f32(sum, p);
    }
    if (j < visible) {
        size_t tail = (size_t)(visible - j) * sizeof(float);
        float buf[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        memcpy(buf, row + j, tail);
        float32x4_t p =
            Sleef_expf4_u10advsimd(vsubq_f32(vld1q_f32(buf), vmx));
        vst1q_f32(buf, p);
        memcpy(row + j, buf, tail);
        sum = vaddq_f32(sum, p);
    }
    return vaddvq_f32(sum);
}

/* The fused scale + mask + online softmax step of kernels.h, one row at a
 * time: a masking pass that finds the row maximum, then an exp pass that
 * sums P. Columns a causal or key-length mask hides are never read; they
 * become P = 0. Preconditions: lds >= n, row_max/row_sum/alpha hold m
 * floats, keep/bias rows hold n columns. */
void mk_neon_softmax_update(float *s, ptrdiff_t lds, int64_t m,
                                   int64_t n, float scale,
                                   const mk_mask *mask, float *row_max,
                                   float *row_sum, float *alpha)
{
    assert(m >= 0 && n >= 0 && (m <= 1 || lds >= n));
    assert(mask != NULL);
    assert(m == 0 || (row_max && row_sum && alpha));
    for (int64_t i = 0; i < m; i++) {
        int64_t lo, hi;
        mk_visible_range(mask, i, n, &lo, &hi);
        float *whole = s + i * lds, *row = whole + lo;
        int64_t visible = hi - lo;
        const float *bias =
            mask->bias ? mask->bias + i * mask->bias_ld + lo : NULL;
        const uint8_t *keep =
            mask->keep ? mask->keep + i * mask->keep_ld + lo : NULL;
        float bmax = scale_mask_row(row, bias, keep, visible, scale);
        float mnew = mk_row_next_max(row, visible, bmax, row_max[i]);
        if (mnew == -INFINITY) {
            memset(whole, 0, (size_t)n * sizeof *whole);
            alpha[i] = 1.0f;
            continue;
        }
        float sum = exp_row(row, visible, mnew);
        memset(whole, 0, (size_t)lo * sizeof *whole);
        memset(whole + hi, 0, (size_t)(n - hi) * sizeof *whole);
        float a = vgetq_lane_f32(
            Sleef_expf4_u10advsimd(vdupq_n_f32(row_max[i] - mnew)), 0);
        alpha[i] = a;
        row_sum[i] = row_sum[i] * a + sum;
        row_max[i] = mnew;
    }
}

/* O = alpha O + P V on the 8x8 tile of gemm.c, V read in place (row j of
 * V is row j of the right-hand side, 8 columns a panel). */
void mk_neon_pv_8x8(const float *p, ptrdiff_t ldp, int64_t m,
                           int64_t n, const float *v, ptrdiff_t ldv,
                           int64_t dv, const float *alpha, float *o,
                           ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0);
    assert(ldp >= 0 && ldv >= 0); /* inputs may broadcast */
    assert(m <= 1 || ldo >= dv);
    assert(m == 0 || alpha != NULL);
    mk_neon_gemm_8x8(m, dv, n, p, ldp, v, ldv, MK_NEON_NR, alpha, NULL, o,
                     ldo);
}

/* out = o / row_sum as o * (1 / row_sum), as on the generic path; rows
 * with row_sum == 0 (every key masked) become zeros. */
void mk_neon_normalize(const float *o, ptrdiff_t ldo, int64_t m,
                              int64_t dv, const float *row_sum, float *out,
                              ptrdiff_t ldout)
{
    assert(m >= 0 && dv >= 0 && ldo >= 0);
    assert(m <= 1 || ldout >= dv);
    for (int64_t i = 0; i < m; i++) {
        const float *src = o + i * ldo;
        float *dst = out + i * ldout;
        if (row_sum[i] == 0.0f) {
            memset(dst, 0, (size_t)dv * sizeof *dst);
            continue;
        }
        float inv = 1.0f / row_sum[i];
        int64_t c = 0;
        for (; c + 4 <= dv; c += 4)
            vst1q_f32(dst + c, vmulq_n_f32(vld1q_f32(src + c), inv));
        for (; c < dv; c++)
            dst[c] = src[c] * inv;
    }
}
