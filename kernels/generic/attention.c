/* The portable attention kernels: the production path on CPUs without a
 * faster table and the baseline every other table is tested against. */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "gemm.h"
#include "generic.h"
#include "kernels.h"

/* exp(x) for x <= 0 (or NaN), inline and branch-free so the softmax loop
 * vectorises: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-7
 * Taylor polynomial (truncation < 1e-8 relative), and 2^n built in the
 * exponent bits. Results below 2^-126 flush to 0; NaN stays NaN. */
static inline float exp_nonpositive(float x)
{
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f;
    const float ln2_lo = -2.12194440e-4f;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: rounds to integer */
    float xc = x < -87.0f ? -87.0f : x;
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
    return x < -87.0f ? 0.0f : e;
}

void mk_generic_qk(const float *q, ptrdiff_t ldq, int64_t m,
                       const float *kp, int64_t n, int64_t d, float *s,
                       ptrdiff_t lds)
{
    mk_generic_gemm_4x16(m, n, d, q, ldq, kp, MK_GENERIC_NR,
                         d * MK_GENERIC_NR, NULL, s, lds);
}

/* Scale and mask one score row in place; returns the row maximum. */
static float scale_mask_row(float *row, int64_t i, int64_t n, float scale,
                            const mk_mask *mask)
{
    int64_t lo, hi;
    mk_visible_range(mask, i, n, &lo, &hi);
    const float *bias = mask->bias ? mask->bias + i * mask->bias_ld : NULL;
    const uint8_t *keep = mask->keep ? mask->keep + i * mask->keep_ld : NULL;
    for (int64_t j = lo; j < hi; j++)
        row[j] *= scale;
    if (bias)
        for (int64_t j = lo; j < hi; j++)
            row[j] += bias[j];
    if (keep)
        for (int64_t j = lo; j < hi; j++)
            row[j] = keep[j] ? row[j] : -INFINITY;
    for (int64_t j = 0; j < lo; j++)
        row[j] = -INFINITY;
    for (int64_t j = hi; j < n; j++)
        row[j] = -INFINITY;
    float mx = -INFINITY;
    for (int64_t j = lo; j < hi; j++)
        mx = row[j] > mx ? row[j] : mx;
    return mx;
}

void mk_generic_softmax_update(float *s, ptrdiff_t lds, int64_t m,
                                   int64_t n, float scale,
                                   const mk_mask *mask, float *row_max,
                                   float *row_sum, float *alpha)
{
    assert(m >= 0 && n >= 0);
    for (int64_t i = 0; i < m; i++) {
        float *row = s + i * lds;
        float bmax = scale_mask_row(row, i, n, scale, mask);
        float mnew = mk_row_next_max(row, n, bmax, row_max[i]);
        if (mnew == -INFINITY) {
            for (int64_t j = 0; j < n; j++)
                row[j] = 0.0f;
            alpha[i] = 1.0f;
            continue;
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            row[j] = exp_nonpositive(row[j] - mnew);
            sum += row[j];
        }
        alpha[i] = exp_nonpositive(row_max[i] - mnew);
        row_sum[i] = row_sum[i] * alpha[i] + sum;
        row_max[i] = mnew;
    }
}

void mk_generic_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                       const float *v, ptrdiff_t ldv, int64_t dv,
                       const float *alpha, float *o, ptrdiff_t ldo)
{
    mk_generic_gemm_4x16(m, dv, n, p, ldp, v, ldv, MK_GENERIC_NR, alpha, o,
                         ldo);
}

void mk_generic_normalize(const float *o, ptrdiff_t ldo, int64_t m,
                              int64_t dv, const float *row_sum, float *out,
                              ptrdiff_t ldout)
{
    for (int64_t i = 0; i < m; i++) {
        const float *src = o + i * ldo;
        float *dst = out + i * ldout;
        if (row_sum[i] == 0.0f) {
            for (int64_t c = 0; c < dv; c++)
                dst[c] = 0.0f;
            continue;
        }
        float inv = 1.0f / row_sum[i];
        for (int64_t c = 0; c < dv; c++)
            dst[c] = src[c] * inv;
    }
}

