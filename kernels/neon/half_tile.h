/* The loops of the NEON half compute slots (neonbf16's bf16, neonfhm's
 * f16; docs/design.md, "Compute dtype"), written once over a table's
 * primitives: an 8-row x 8-column register tile of fp32 accumulators whose
 * depth (Q·Kᵀ) or keys (P·V) run over pairs. A pair row of a pack is 2 NR
 * halves (NR floats), whatever order the table's instructions want its
 * halves in; packed_v_floats is the same for both. Rows past m in a tile
 * reuse row 0's operands and are never stored, so every tile is the full
 * 8 x 8 and an element's sum never depends on m or n.
 *
 * The including file passes, as static functions (inlined here):
 *   tile(a, pairs, panel, acc)
 *       acc[r] += rows a[r] (2 pairs halves) times the panel's first
 *       pairs pair rows, in order
 *   last_key(a, t, panel, acc)
 *       acc[r] += half 2t of a[r] times the first key of pair row t only
 *       (the second may belong to a larger pack: 0 x inf must not reach o)
 *   to_half(row, n)
 *       n floats to n codes, nearest even, in the row's own first bytes
 *   pair_row(r0, r1, c0, nr, dst)
 *       columns c0..c0+nr-1 of value rows r0 and r1 (r1 NULL: zeros) as
 *       the pair row at dst, zeros past nr
 * Internal to kernels/neon*. */
#ifndef MK_NEON_HALF_TILE_H
#define MK_NEON_HALF_TILE_H

#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#include "neon/gemm.h"

#define MK_HALF_MR 8
#define MK_HALF_NR MK_NEON_NR /* 8 */
#define MK_HALF_INLINE static inline __attribute__((always_inline))

typedef void mk_neon_half_tile_fn(const uint16_t *const a[MK_HALF_MR],
                                  int64_t pairs, const uint16_t *panel,
                                  float32x4_t acc[MK_HALF_MR][2]);
typedef void mk_neon_half_row_fn(float *row, int64_t n);
typedef void mk_neon_half_pair_row_fn(const uint16_t *r0, const uint16_t *r1,
                                      int64_t c0, int64_t nr, uint16_t *dst);

MK_HALF_INLINE void mk_neon_half_store(float32x4_t acc[MK_HALF_MR][2],
                                       int64_t mr, int64_t nr, float *c,
                                       ptrdiff_t ldc)
{
    for (int64_t r = 0; r < mr; r++) {
        float tmp[MK_HALF_NR];
        vst1q_f32(tmp, acc[r][0]);
        vst1q_f32(tmp + 4, acc[r][1]);
        memcpy(c + r * ldc, tmp, (size_t)nr * sizeof(float));
    }
}

/* The qk slot over packed panels of NR keys, d / 2 pair rows each. */
MK_HALF_INLINE void mk_neon_half_qk(mk_neon_half_tile_fn *tile,
                                    const uint16_t *q, ptrdiff_t ldq,
                                    int64_t m, const float *kp, int64_t n,
                                    int64_t d, float *s, ptrdiff_t lds)
{
    assert(d % 2 == 0 && ldq % 2 == 0 && m >= 0 && n >= 0);
    const uint16_t *kh = (const uint16_t *)(const void *)kp;
    const int64_t pairs = d / 2;
    for (int64_t i0 = 0; i0 < m; i0 += MK_HALF_MR) {
        int64_t mr = m - i0 < MK_HALF_MR ? m - i0 : MK_HALF_MR;
        const uint16_t *a[MK_HALF_MR];
        for (int r = 0; r < MK_HALF_MR; r++)
            a[r] = q + (i0 + (r < mr ? r : 0)) * ldq;
        for (int64_t j0 = 0; j0 < n; j0 += MK_HALF_NR) {
            float32x4_t acc[MK_HALF_MR][2];
            for (int r = 0; r < MK_HALF_MR; r++)
                acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
            tile(a, pairs, kh + (j0 / MK_HALF_NR) * pairs * 2 * MK_HALF_NR,
                 acc);
            mk_neon_half_store(acc, mr, n - j0 < MK_HALF_NR ? n - j0 : MK_HALF_NR,
                               s + i0 * lds + j0, lds);
        }
    }
}

MK_HALF_INLINE size_t mk_neon_half_packed_v_floats(int64_t n, int64_t dv)
{
    return (size_t)((n + 1) / 2) * MK_HALF_NR *
           (size_t)((dv + MK_HALF_NR - 1) / MK_HALF_NR);
}

/* The pack_v slot: pair t of column block b at packed + b * cb_stride +
 * t * NR (floats). */
MK_HALF_INLINE void mk_neon_half_pack_v(mk_neon_half_pair_row_fn *pair_row,
                                        const uint16_t *v, ptrdiff_t ldv,
                                        int64_t n, int64_t dv, float *packed,
                                        ptrdiff_t cb_stride)
{
    assert(n >= 0 && dv >= 0 && ldv >= 0);
    assert(cb_stride >= (ptrdiff_t)mk_neon_half_packed_v_floats(n, 1));
    uint16_t *out = (uint16_t *)(void *)packed;
    for (int64_t t = 0; 2 * t < n; t++) {
        const uint16_t *r0 = v + 2 * t * ldv;
        const uint16_t *r1 = 2 * t + 1 < n ? r0 + ldv : NULL;
        for (int64_t c0 = 0, b = 0; c0 < dv; c0 += MK_HALF_NR, b++)
            pair_row(r0, r1, c0, dv - c0 < MK_HALF_NR ? dv - c0 : MK_HALF_NR,
                     out + 2 * (b * cb_stride + t * MK_HALF_NR));
    }
}

/*
 * The pv slot: o[i][c] = alpha[i] * o[i][c] + sum_j h(p[i][j]) * v[j][c].
 * P's rows become codes in place; each 8-column block of the pack is swept
 * by every 8-row tile over the whole pairs of keys, then, for an odd n,
 * the last key alone.
 */
MK_HALF_INLINE void mk_neon_half_pv(mk_neon_half_tile_fn *tile,
                                    mk_neon_half_tile_fn *last_key,
                                    mk_neon_half_row_fn *to_half, float *p,
                                    ptrdiff_t ldp, int64_t m, int64_t n,
                                    const float *vp, ptrdiff_t cb_stride,
                                    int64_t dv, const float *alpha, float *o,
                                    ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldp >= 0);
    assert(m <= 1 || ldp >= n);
    if (m == 0 || dv == 0)
        return;
    for (int64_t i = 0; i < m; i++)
        to_half(p + i * ldp, n);
    const uint16_t *ph = (const uint16_t *)(const void *)p;
    const int64_t pairs = n / 2;
    for (int64_t c0 = 0, b = 0; c0 < dv; c0 += MK_HALF_NR, b++) {
        const uint16_t *panel =
            (const uint16_t *)(const void *)(vp + b * cb_stride);
        int64_t nr = dv - c0 < MK_HALF_NR ? dv - c0 : MK_HALF_NR;
        for (int64_t i0 = 0; i0 < m; i0 += MK_HALF_MR) {
            int64_t mr = m - i0 < MK_HALF_MR ? m - i0 : MK_HALF_MR;
            const uint16_t *a[MK_HALF_MR];
            float32x4_t acc[MK_HALF_MR][2];
            for (int r = 0; r < MK_HALF_MR; r++) {
                int64_t i = i0 + (r < mr ? r : 0);
                a[r] = ph + 2 * i * ldp; /* a row of ldp floats */
                float tmp[MK_HALF_NR] = {0};
                memcpy(tmp, o + i * ldo + c0, (size_t)nr * sizeof(float));
                float32x4_t sc = vdupq_n_f32(alpha[i]);
                acc[r][0] = vmulq_f32(sc, vld1q_f32(tmp));
                acc[r][1] = vmulq_f32(sc, vld1q_f32(tmp + 4));
            }
            tile(a, pairs, panel, acc);
            if (n % 2)
                last_key(a, pairs, panel, acc);
            mk_neon_half_store(acc, mr, nr, o + i0 * ldo + c0, ldo);
        }
    }
}

#endif
