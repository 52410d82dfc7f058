/* The f16 compute kernels on AArch64 NEON with FEAT_FHM: Q·Kᵀ and P·V on an
 * 8-row x 8-column register tile of FMLAL/FMLAL2 steps (docs/design.md,
 * "Compute dtype"). FMLAL multiplies the low four halves of one register
 * by a half of another and adds the four exact products to fp32 lanes in
 * one rounding each; FMLAL2 does the same for the high four. So the depth
 * runs over pairs, as in the bf16 kernels, but a pair row of B holds its
 * two depths (two keys of a value pack) in separate halves of a register:
 * [B(2t)[j0..j3], B(2t+1)[j0..j3]] for columns j0..j3, and likewise for
 * j4..j7. FMLAL (depth 2t) then FMLAL2 (depth 2t + 1) add to the same
 * lanes, so each fp32 lane is one chain of fused multiply-adds in depth
 * order, the chain the fp32 kernels run on the widened values. (FMLA on
 * halves would accumulate in fp16, against the fp32 accumulation the
 * compute dtypes keep.) The loops around the tile are
 * kernels/neon/half_tile.h's, shared with neonbf16. */
#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#include "neon/half_tile.h"
#include "neonfhm.h"

#define NR MK_HALF_NR /* 8 */
#define MR MK_HALF_MR /* 8 */
/* Halves of one pair row: two depths of NR columns. */
#define PAIR_HALVES (2 * NR)

typedef uint16_t half_code;

/* Where half (column j of the panel, depth p) of a pair row goes. */
static inline int64_t at_in_pair(int64_t j, int64_t p)
{
    return (j / 4) * 8 + (p % 2) * 4 + j % 4;
}

/* One panel of up to NR keys (the rest zero), d deep, as pair rows. Eight
 * whole keys eight depths at a time go through an 8 x 8 transpose of
 * halves; the rest element by element. */
static void pack_panel(const half_code *x, ptrdiff_t ldx, int64_t nr,
                       int64_t d, half_code *out)
{
    int64_t p0 = 0;
    if (nr == NR)
        for (; p0 + 8 <= d; p0 += 8) {
            uint16x8_t r[8];
            for (int j = 0; j < 8; j++)
                r[j] = vld1q_u16(x + j * ldx + p0);
            uint16x8_t t[8];
            for (int j = 0; j < 8; j += 2) {
                t[j] = vtrn1q_u16(r[j], r[j + 1]);
                t[j + 1] = vtrn2q_u16(r[j], r[j + 1]);
            }
            uint32x4_t u[8];
            for (int j = 0; j < 8; j += 4)
                for (int o = 0; o < 2; o++) {
                    uint32x4_t a = vreinterpretq_u32_u16(t[j + o]);
                    uint32x4_t b = vreinterpretq_u32_u16(t[j + o + 2]);
                    u[j + o] = vtrn1q_u32(a, b);
                    u[j + o + 2] = vtrn2q_u32(a, b);
                }
            /* column p of the block: keys 0..3 from u[p % 4] (low or
             * high 64 bits by p / 4), keys 4..7 from u[4 + p % 4] */
            uint64x2_t c[8];
            for (int p = 0; p < 4; p++) {
                uint64x2_t lo = vreinterpretq_u64_u32(u[p]);
                uint64x2_t hi = vreinterpretq_u64_u32(u[4 + p]);
                c[p] = vtrn1q_u64(lo, hi);
                c[p + 4] = vtrn2q_u64(lo, hi);
            }
            for (int p = 0; p < 8; p += 2) {
                half_code *dst = out + (p0 + p) / 2 * PAIR_HALVES;
                vst1q_u16(dst, vreinterpretq_u16_u64(vtrn1q_u64(c[p], c[p + 1])));
                vst1q_u16(dst + 8,
                          vreinterpretq_u16_u64(vtrn2q_u64(c[p], c[p + 1])));
            }
        }
    for (int64_t p = p0; p < d; p++)
        for (int64_t j = 0; j < NR; j++)
            out[p / 2 * PAIR_HALVES + at_in_pair(j, p)] =
                j < nr ? x[j * ldx + p] : 0;
}

void mk_neonfhm_pack_f16(const uint16_t *x, ptrdiff_t ldx, int64_t n,
                         int64_t d, float *packed)
{
    assert(d % 2 == 0 && n >= 0);
    half_code *out = (half_code *)(void *)packed;
    for (int64_t j0 = 0; j0 < n; j0 += NR)
        pack_panel(x + j0 * ldx, ldx, n - j0 < NR ? n - j0 : NR, d,
                   out + (j0 / NR) * (d / 2) * PAIR_HALVES);
}

static inline float16x8_t halves8(const half_code *x)
{
    return vreinterpretq_f16_u16(vld1q_u16(x));
}

/* The FMLAL pair of one pair row (b: columns 0..3, then 4..7) times two
 * halves of a row's operand, lanes L and L + 1 of x. */
#define PAIR_STEP(acc, b0, b1, x, L)                                   \
    do {                                                               \
        (acc)[0] = vfmlalq_laneq_low_f16((acc)[0], b0, x, L);          \
        (acc)[0] = vfmlalq_laneq_high_f16((acc)[0], b0, x, (L) + 1);   \
        (acc)[1] = vfmlalq_laneq_low_f16((acc)[1], b1, x, L);          \
        (acc)[1] = vfmlalq_laneq_high_f16((acc)[1], b1, x, (L) + 1);   \
    } while (0)

/* acc[r] += sum over pairs t < pairs of rows a[r] (halves 2t, 2t + 1)
 * times pair row t of the panel, in depth order; four pairs a step, the
 * row's eight halves in one register. */
static void tile(const half_code *const a[MR], int64_t pairs,
                 const half_code *panel, float32x4_t acc[MR][2])
{
    int64_t t = 0;
    for (; t + 4 <= pairs; t += 4) {
        const half_code *b = panel + t * PAIR_HALVES;
        float16x8_t b0 = halves8(b), b1 = halves8(b + 8);
        float16x8_t b2 = halves8(b + 16), b3 = halves8(b + 24);
        float16x8_t b4 = halves8(b + 32), b5 = halves8(b + 40);
        float16x8_t b6 = halves8(b + 48), b7 = halves8(b + 56);
        for (int r = 0; r < MR; r++) {
            float16x8_t x = halves8(a[r] + 2 * t);
            PAIR_STEP(acc[r], b0, b1, x, 0);
            PAIR_STEP(acc[r], b2, b3, x, 2);
            PAIR_STEP(acc[r], b4, b5, x, 4);
            PAIR_STEP(acc[r], b6, b7, x, 6);
        }
    }
    for (; t < pairs; t++) {
        const half_code *b = panel + t * PAIR_HALVES;
        float16x8_t b0 = halves8(b), b1 = halves8(b + 8);
        for (int r = 0; r < MR; r++) {
            float16x8_t x0 = vreinterpretq_f16_u16(vld1q_dup_u16(a[r] + 2 * t));
            float16x8_t x1 =
                vreinterpretq_f16_u16(vld1q_dup_u16(a[r] + 2 * t + 1));
            acc[r][0] = vfmlalq_low_f16(acc[r][0], b0, x0);
            acc[r][0] = vfmlalq_high_f16(acc[r][0], b0, x1);
            acc[r][1] = vfmlalq_low_f16(acc[r][1], b1, x0);
            acc[r][1] = vfmlalq_high_f16(acc[r][1], b1, x1);
        }
    }
}

void mk_neonfhm_qk_f16_8x8(const uint16_t *q, ptrdiff_t ldq, int64_t m,
                           const float *kp, int64_t n, int64_t d, float *s,
                           ptrdiff_t lds)
{
    mk_neon_half_qk(tile, q, ldq, m, kp, n, d, s, lds);
}

size_t mk_neonfhm_packed_v_f16_floats(int64_t n, int64_t dv)
{
    return mk_neon_half_packed_v_floats(n, dv);
}

/* Rows r0 and r1 (two keys) of 8 value columns as one pair row: columns
 * 0..3 of r0 then of r1, columns 4..7 likewise (the second row zero past
 * an odd n, columns past nr zero). */
static void pair_row(const half_code *r0, const half_code *r1, int64_t c0,
                     int64_t nr, half_code *dst)
{
    if (nr == NR) {
        uint64x2_t x = vreinterpretq_u64_u16(vld1q_u16(r0 + c0));
        uint64x2_t y = vreinterpretq_u64_u16(r1 ? vld1q_u16(r1 + c0)
                                                : vdupq_n_u16(0));
        vst1q_u16(dst, vreinterpretq_u16_u64(vtrn1q_u64(x, y)));
        vst1q_u16(dst + 8, vreinterpretq_u16_u64(vtrn2q_u64(x, y)));
        return;
    }
    for (int64_t c = 0; c < NR; c++) {
        dst[at_in_pair(c, 0)] = c < nr ? r0[c0 + c] : 0;
        dst[at_in_pair(c, 1)] = c < nr && r1 ? r1[c0 + c] : 0;
    }
}

void mk_neonfhm_pack_v_f16(const uint16_t *v, ptrdiff_t ldv, int64_t n,
                           int64_t dv, float *packed, ptrdiff_t cb_stride)
{
    mk_neon_half_pack_v(pair_row, v, ldv, n, dv, packed, cb_stride);
}

/* Row of n floats to n f16 codes (FCVTN, nearest even) in its own first
 * bytes. Each store lands below the floats still to be read. */
static void row_to_f16(float *row, int64_t n)
{
    half_code *dst = (half_code *)(void *)row;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(row + j)),
                                          vld1q_f32(row + j + 4));
        vst1q_u16(dst + j, vreinterpretq_u16_f16(h));
    }
    for (; j < n; j++) {
        float16_t h = (float16_t)row[j];
        memcpy(dst + j, &h, sizeof h);
    }
}

/* The first key of pair row t alone: FMLAL of the row's half 2t, no
 * FMLAL2. */
static void last_key(const half_code *const a[MR], int64_t t,
                     const half_code *panel, float32x4_t acc[MR][2])
{
    const half_code *last = panel + t * PAIR_HALVES;
    float16x8_t b0 = halves8(last), b1 = halves8(last + 8);
    for (int r = 0; r < MR; r++) {
        float16x8_t x = vreinterpretq_f16_u16(vld1q_dup_u16(a[r] + 2 * t));
        acc[r][0] = vfmlalq_low_f16(acc[r][0], b0, x);
        acc[r][1] = vfmlalq_low_f16(acc[r][1], b1, x);
    }
}

/* P rounded to f16 (kernels/neon/half_tile.h, mk_neon_half_pv). */
void mk_neonfhm_pv_f16_8x8(float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                           const float *vp, ptrdiff_t cb_stride, int64_t dv,
                           const float *alpha, float *o, ptrdiff_t ldo)
{
    mk_neon_half_pv(tile, last_key, row_to_f16, p, ldp, m, n, vp, cb_stride,
                    dv, alpha, o, ldo);
}
