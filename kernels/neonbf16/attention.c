/* The bf16 compute kernels on AArch64 NEON with FEAT_BF16: Q·Kᵀ and P·V on
 * an 8-row x 8-column register tile of BFDOT steps. As in the avx512bf16
 * kernels (docs/design.md, "Compute dtype"), the depth runs over pairs: an
 * element of A is a 32-bit pair of bf16 codes (two depths of a query row,
 * two keys of a P row), a row of B is 8 such pairs (8 keys of a packed key
 * panel, 8 columns of a value pack), and BFDOT adds both products of a pair
 * to an fp32 lane. Rows past m in a tile reuse row 0's operands and are
 * never stored, so every tile is the full 8 x 8 and an element's sum never
 * depends on m or n. */
#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#include "neon/gemm.h"
#include "neonbf16.h"

#define NR MK_NEON_NR /* 8 */
#define MR 8

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

/* One tile: rows a[0..7] (word pointers, kp pairs deep) against a panel of
 * NR keys; c rows r < mr, columns j < nr stored. acc starts at init (the
 * c rows times scale, or zero). */
static void tile(const word *const a[MR], int64_t pairs, const word *panel,
                 ptrdiff_t ldb, float32x4_t acc[MR][2])
{
    for (int64_t p = 0; p < pairs; p++) {
        bfloat16x8_t b0 = pairs4(panel + p * ldb);
        bfloat16x8_t b1 = pairs4(panel + p * ldb + 4);
        for (int r = 0; r < MR; r++) {
            bfloat16x8_t ar = pair_dup(a[r] + p);
            acc[r][0] = vbfdotq_f32(acc[r][0], ar, b0);
            acc[r][1] = vbfdotq_f32(acc[r][1], ar, b1);
        }
    }
}

static void store_rows(float32x4_t acc[MR][2], int64_t mr, int64_t nr,
                       float *c, ptrdiff_t ldc)
{
    for (int64_t r = 0; r < mr; r++) {
        float tmp[NR];
        vst1q_f32(tmp, acc[r][0]);
        vst1q_f32(tmp + 4, acc[r][1]);
        memcpy(c + r * ldc, tmp, (size_t)nr * sizeof(float));
    }
}

void mk_neonbf16_qk_bf16_8x8(const uint16_t *q, ptrdiff_t ldq, int64_t m,
                             const float *kp, int64_t n, int64_t d, float *s,
                             ptrdiff_t lds)
{
    assert(d % 2 == 0 && ldq % 2 == 0 && m >= 0 && n >= 0);
    const word *qw = (const word *)(const void *)q;
    const word *kw = (const word *)(const void *)kp;
    const int64_t pairs = d / 2;
    for (int64_t i0 = 0; i0 < m; i0 += MR) {
        int64_t mr = m - i0 < MR ? m - i0 : MR;
        const word *a[MR];
        for (int r = 0; r < MR; r++)
            a[r] = qw + (i0 + (r < mr ? r : 0)) * (ldq / 2);
        for (int64_t j0 = 0; j0 < n; j0 += NR) {
            float32x4_t acc[MR][2];
            for (int r = 0; r < MR; r++)
                acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
            tile(a, pairs, kw + (j0 / NR) * pairs * NR, NR, acc);
            store_rows(acc, mr, n - j0 < NR ? n - j0 : NR, s + i0 * lds + j0,
                       lds);
        }
    }
}

size_t mk_neonbf16_packed_v_bf16_floats(int64_t n, int64_t dv)
{
    return (size_t)((n + 1) / 2) * NR * (size_t)((dv + NR - 1) / NR);
}

/* Pair t of column block b: the 8 columns of rows 2t and 2t + 1 zipped
 * (the second row zero past an odd n, columns past dv zero). */
void mk_neonbf16_pack_v_bf16(const uint16_t *v, ptrdiff_t ldv, int64_t n,
                             int64_t dv, float *packed, ptrdiff_t cb_stride)
{
    assert(n >= 0 && dv >= 0 && ldv >= 0);
    assert(cb_stride >= (ptrdiff_t)mk_neonbf16_packed_v_bf16_floats(n, 1));
    uint16_t *out = (uint16_t *)(void *)packed;
    for (int64_t t = 0; 2 * t < n; t++) {
        const uint16_t *r0 = v + 2 * t * ldv;
        const uint16_t *r1 = 2 * t + 1 < n ? r0 + ldv : NULL;
        for (int64_t c0 = 0, b = 0; c0 < dv; c0 += NR, b++) {
            uint16_t *dst = out + 2 * (b * cb_stride + t * NR);
            if (dv - c0 >= NR) {
                uint16x8_t x = vld1q_u16(r0 + c0);
                uint16x8_t y = r1 ? vld1q_u16(r1 + c0) : vdupq_n_u16(0);
                vst1q_u16(dst, vzip1q_u16(x, y));
                vst1q_u16(dst + 8, vzip2q_u16(x, y));
                continue;
            }
            for (int64_t c = 0; c < NR; c++) {
                int in = c0 + c < dv;
                dst[2 * c] = in ? r0[c0 + c] : 0;
                dst[2 * c + 1] = in && r1 ? r1[c0 + c] : 0;
            }
        }
    }
}

/* Row of n floats to n bf16 codes (BFCVTN, nearest even) in its own first
 * bytes, a zero code after an odd n. Each store lands below the floats
 * still to be read. */
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
    if (n % 2)
        dst[n] = 0;
}

/*
 * o[i][c] = alpha[i] * o[i][c] + sum_j bf16(p[i][j]) * v[j][c]: P's rows
 * become bf16 codes in place; each 8-column block of the pack is swept by
 * every 8-row tile over the whole pairs of keys, then, for an odd n, one
 * step whose pair row keeps only its first key (a key past n may belong to
 * a larger pack, and 0 x inf must not reach o).
 */
void mk_neonbf16_pv_bf16_8x8(float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                             const float *vp, ptrdiff_t cb_stride,
                             int64_t dv, const float *alpha, float *o,
                             ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldp >= 0);
    assert(m <= 1 || ldp >= n);
    if (m == 0 || dv == 0)
        return;
    for (int64_t i = 0; i < m; i++)
        row_to_bf16(p + i * ldp, n);
    const word *pw = (const word *)(const void *)p;
    const int64_t pairs = n / 2;
    for (int64_t c0 = 0, b = 0; c0 < dv; c0 += NR, b++) {
        const word *panel = (const word *)(const void *)(vp + b * cb_stride);
        int64_t nr = dv - c0 < NR ? dv - c0 : NR;
        word last[NR];
        if (n % 2)
            for (int c = 0; c < NR; c++)
                last[c] = panel[pairs * NR + c] & 0xFFFFu;
        for (int64_t i0 = 0; i0 < m; i0 += MR) {
            int64_t mr = m - i0 < MR ? m - i0 : MR;
            const word *a[MR];
            float32x4_t acc[MR][2];
            for (int r = 0; r < MR; r++) {
                int64_t i = i0 + (r < mr ? r : 0);
                a[r] = pw + i * ldp;
                float tmp[NR] = {0};
                memcpy(tmp, o + i * ldo + c0, (size_t)nr * sizeof(float));
                float32x4_t sc = vdupq_n_f32(alpha[i]);
                acc[r][0] = vmulq_f32(sc, vld1q_f32(tmp));
                acc[r][1] = vmulq_f32(sc, vld1q_f32(tmp + 4));
            }
            tile(a, pairs, panel, NR, acc);
            if (n % 2) {
                const word *tail[MR];
                for (int r = 0; r < MR; r++)
                    tail[r] = a[r] + pairs;
                tile(tail, 1, last, NR, acc);
            }
            store_rows(acc, mr, nr, o + i0 * ldo + c0, ldo);
        }
    }
}
