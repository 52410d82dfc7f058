/* The bf16 compute kernels on AArch64 NEON with FEAT_BF16: Q·Kᵀ and P·V on
 * an 8-row x 8-column register tile of BFDOT steps. As in the avx512bf16
 * kernels (docs/design.md, "Compute dtype"), the depth runs over pairs: an
 * element of A is a 32-bit pair of bf16 codes (two depths of a query row,
 * two keys of a P row), a row of B is 8 such pairs (8 keys of a packed key
 * panel, 8 columns of a value pack), and BFDOT adds both products of a pair
 * to an fp32 lane. The loops around the tile are kernels/neon/half_tile.h's,
 * shared with neonfhm. */
#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#include "neon/half_tile.h"
#include "neonbf16.h"

#define NR MK_HALF_NR /* 8 */
#define MR MK_HALF_MR /* 8 */

typedef uint32_t word;

static inline bfloat16x8_t pair_dup(const word *w)
{
    return vreinterpretq_bf16_u32(vld1q_dup_u32(w));
}

static inline bfloat16x8_t pairs4(const word *w)
{
    return vreinterpretq_bf16_u32(vld1q_u32(w));
}

/* Keys are transposed as 32-bit words (pairs of depths) by neon's pack,
 * which moves bits without arithmetic. */
void mk_neonbf16_pack_bf16(const uint16_t *x, ptrdiff_t ldx, int64_t n,
                           int64_t d, float *packed)
{
    assert(d % 2 == 0 && ldx % 2 == 0);
    mk_neon_pack((const float *)(const void *)x, ldx / 2, n, d / 2, packed);
}

/* One tile: rows a[0..7] (pairs pairs deep) against a panel of NR keys or
 * value columns, added to acc. */
static void tile(const uint16_t *const a16[MR], int64_t pairs,
                 const uint16_t *panel16, float32x4_t acc[MR][2])
{
    const word *a[MR];
    for (int r = 0; r < MR; r++)
        a[r] = (const word *)(const void *)a16[r];
    const word *panel = (const word *)(const void *)panel16;
    for (int64_t p = 0; p < pairs; p++) {
        bfloat16x8_t b0 = pairs4(panel + p * NR);
        bfloat16x8_t b1 = pairs4(panel + p * NR + 4);
        for (int r = 0; r < MR; r++) {
            bfloat16x8_t ar = pair_dup(a[r] + p);
            acc[r][0] = vbfdotq_f32(acc[r][0], ar, b0);
            acc[r][1] = vbfdotq_f32(acc[r][1], ar, b1);
        }
    }
}

void mk_neonbf16_qk_bf16_8x8(const uint16_t *q, ptrdiff_t ldq, int64_t m,
                             const float *kp, int64_t n, int64_t d, float *s,
                             ptrdiff_t lds)
{
    mk_neon_half_qk(tile, q, ldq, m, kp, n, d, s, lds);
}

size_t mk_neonbf16_packed_v_bf16_floats(int64_t n, int64_t dv)
{
    return mk_neon_half_packed_v_floats(n, dv);
}

/* Rows r0 and r1 (two keys) of 8 value columns zipped into one pair row
 * (the second row zero past an odd n, columns past nr zero). */
static void pair_row(const uint16_t *r0, const uint16_t *r1, int64_t c0,
                     int64_t nr, uint16_t *dst)
{
    if (nr == NR) {
        uint16x8_t x = vld1q_u16(r0 + c0);
        uint16x8_t y = r1 ? vld1q_u16(r1 + c0) : vdupq_n_u16(0);
        vst1q_u16(dst, vzip1q_u16(x, y));
        vst1q_u16(dst + 8, vzip2q_u16(x, y));
        return;
    }
    for (int64_t c = 0; c < NR; c++) {
        dst[2 * c] = c < nr ? r0[c0 + c] : 0;
        dst[2 * c + 1] = c < nr && r1 ? r1[c0 + c] : 0;
    }
}

void mk_neonbf16_pack_v_bf16(const uint16_t *v, ptrdiff_t ldv, int64_t n,
                             int64_t dv, float *packed, ptrdiff_t cb_stride)
{
    mk_neon_half_pack_v(pair_row, v, ldv, n, dv, packed, cb_stride);
}

/* Row of n floats to n bf16 codes (BFCVTN, nearest even) in its own first
 * bytes. Each store lands below the floats still to be read. */
static void row_to_bf16(float *row, int64_t n)
{
    uint16_t *dst = (uint16_t *)(void *)row;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        bfloat16x8_t h = vcvtq_high_bf16_f32(
            vcvtq_low_bf16_f32(vld1q_f32(row + j)), vld1q_f32(row + j + 4));
        vst1q_bf16((bfloat16_t *)(void *)(dst + j), h);
    }
    for (; j < n; j++) {
        bfloat16_t h = vcvth_bf16_f32(row[j]);
        memcpy(dst + j, &h, sizeof h);
    }
}

/* The first key of pair row t alone: one BFDOT step whose pairs keep only
 * their first key (the row's second code is past n). */
static void last_key(const uint16_t *const a[MR], int64_t t,
                     const uint16_t *panel, float32x4_t acc[MR][2])
{
    const word *pr = (const word *)(const void *)panel + t * NR;
    word last[NR];
    for (int c = 0; c < NR; c++)
        last[c] = pr[c] & 0xFFFFu;
    const uint16_t *tail[MR];
    for (int r = 0; r < MR; r++)
        tail[r] = a[r] + 2 * t;
    tile(tail, 1, (const uint16_t *)(const void *)last, acc);
}

/* P rounded to bf16 (kernels/neon/half_tile.h, mk_neon_half_pv). */
void mk_neonbf16_pv_bf16_8x8(float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                             const float *vp, ptrdiff_t cb_stride,
                             int64_t dv, const float *alpha, float *o,
                             ptrdiff_t ldo)
{
    mk_neon_half_pv(tile, last_key, row_to_bf16, p, ldp, m, n, vp, cb_stride,
                    dv, alpha, o, ldo);
}
