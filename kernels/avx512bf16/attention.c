/* The bf16 compute kernels on AVX512-BF16: Q·Kᵀ and P·V on the avx512
 * 12x32 register tile (kernels/avx512/tile.h) with VDPBF16PS as its step,
 * through the drivers of kernels/tile_driver.h. The tile's depth runs over
 * pairs: an element of A is a pair of bf16 codes (two depths of a query
 * row, two keys of a P row), a row of B is 32 such pairs (32 keys of a
 * packed key panel, 32 columns of an interleaved V panel), and one
 * instruction adds both products of a pair to the fp32 accumulator: twice
 * the multiply-adds of an fp32 FMA (docs/design.md, "Compute dtype"). */
#include <assert.h>
#include <immintrin.h>

#define MK_AVX512_STEP(acc, a, b) \
    _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#include "avx512/tile.h"

#include "avx512/avx512.h"
#include "avx512bf16.h"
#include "tile_driver.h"

/* Keys of K are transposed as 32-bit words, a word being the pair of
 * depths (2p, 2p + 1): avx512's pack moves bits without arithmetic, so
 * its panels of floats are panels of pairs here. */
void mk_avx512bf16_pack_bf16(const uint16_t *x, ptrdiff_t ldx, int64_t n,
                             int64_t d, float *packed)
{
    assert(d % 2 == 0 && ldx % 2 == 0);
    mk_avx512_pack((const float *)(const void *)x, ldx / 2, n, d / 2, packed);
}

void mk_avx512bf16_qk_bf16_12x32(const uint16_t *q, ptrdiff_t ldq, int64_t m,
                                 const float *kp, int64_t n, int64_t d,
                                 float *s, ptrdiff_t lds)
{
    assert(d % 2 == 0 && ldq % 2 == 0);
    mk_td_qk((const float *)(const void *)q, ldq / 2, m, kp, n, d / 2, s,
             lds);
}

/* Keys per V panel: 128 keys x 32 columns of bf16 is 8 KiB, in L1 while
 * every strip of P reads it. */
#ifndef PV_PANEL_KEYS
#define PV_PANEL_KEYS 128
#endif
#define PV_COPY_AHEAD 8

static inline __mmask32 lanes32(int64_t n)
{
    return n >= 32 ? (__mmask32)0xFFFFFFFFu
                   : n <= 0 ? (__mmask32)0 : (__mmask32)((1u << n) - 1u);
}

/* Row of n floats to n bf16 codes (nearest even) in its own first bytes,
 * with a zero code after an odd n so pairs are whole. Each store lands
 * below the floats still to be read. */
static void row_to_bf16(float *row, int64_t n)
{
    uint16_t *dst = (uint16_t *)(void *)row;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 lo = _mm512_loadu_ps(row + j), hi = _mm512_loadu_ps(row + j + 16);
        _mm512_storeu_si512(dst + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    if (j < n) {
        int64_t rest = n - j;
        __m512 lo = _mm512_maskz_loadu_ps(mk_avx512_first(rest), row + j);
        __m512 hi = _mm512_maskz_loadu_ps(mk_avx512_first(rest - 16),
                                          row + j + 16);
        _mm512_mask_storeu_epi16(dst + j, lanes32(rest + (rest & 1)),
                                 (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* Columns c0..c0+nr-1 of keys 0..jn-1 of v (already offset) as pairs of
 * keys: panel word 32t + c = (V[2t][c], V[2t+1][c]), zeros past nr and for
 * the missing key of an odd jn. */
static void interleave_panel(const uint16_t *v, ptrdiff_t ldv, int64_t jn,
                             int64_t nr, uint32_t *panel)
{
    const __mmask32 cols = lanes32(nr);
    const __m512i idx_lo = _mm512_set_epi16(
        47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i idx_hi = _mm512_set_epi16(
        63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
        55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    for (int64_t t = 0; 2 * t < jn; t++) {
        const uint16_t *r0 = v + 2 * t * ldv;
        if (2 * t + PV_COPY_AHEAD < jn)
            _mm_prefetch((const char *)(r0 + PV_COPY_AHEAD * ldv),
                         _MM_HINT_T0);
        __m512i a = _mm512_maskz_loadu_epi16(cols, r0);
        __m512i b = 2 * t + 1 < jn ? _mm512_maskz_loadu_epi16(cols, r0 + ldv)
                                   : _mm512_setzero_si512();
        _mm512_store_si512(panel + 32 * t,
                           _mm512_permutex2var_epi16(a, idx_lo, b));
        _mm512_store_si512(panel + 32 * t + 16,
                           _mm512_permutex2var_epi16(a, idx_hi, b));
    }
}

/*
 * o[i][c] = alpha[i] * o[i][c] + sum_j bf16(p[i][j]) * v[j][c]. P's rows
 * become bf16 codes in place (pairs of keys, the tile's A elements); V goes
 * one 32-column block at a time through interleaved panels of
 * PV_PANEL_KEYS keys on the stack, every strip of P sweeping a panel, the
 * sums carried in o between panels (the first starts from alpha * o).
 */
void mk_avx512bf16_pv_bf16_12x32(float *p, ptrdiff_t ldp, int64_t m,
                                 int64_t n, const uint16_t *v, ptrdiff_t ldv,
                                 int64_t dv, const float *alpha, float *o,
                                 ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldv >= 0 && ldp >= 0);
    assert(m <= 1 || ldp >= n);
    if (m == 0 || dv == 0)
        return;
    for (int64_t i = 0; i < m; i++)
        row_to_bf16(p + i * ldp, n);
    _Alignas(64) uint32_t panel[PV_PANEL_KEYS / 2 * MK_AVX512_NR];
    const float *pw = p, *pan = (const float *)(const void *)panel;
    for (int64_t c0 = 0; c0 < dv; c0 += MK_AVX512_NR) {
        int64_t nr = dv - c0 < MK_AVX512_NR ? dv - c0 : MK_AVX512_NR;
        if (n == 0) /* o = alpha * o */
            mk_td_pv_chunk(MK_TD_BY_COLUMNS, MK_TILE_C_NARROW, 1, pw, ldp, m,
                           0, pan, MK_AVX512_NR, nr, alpha, o + c0, ldo);
        for (int64_t j0 = 0; j0 < n; j0 += PV_PANEL_KEYS) {
            int64_t jn = n - j0 < PV_PANEL_KEYS ? n - j0 : PV_PANEL_KEYS;
            interleave_panel(v + j0 * ldv + c0, ldv, jn, nr, panel);
            mk_td_pv_chunk(MK_TD_BY_COLUMNS, MK_TILE_C_NARROW, j0 == 0,
                           pw + j0 / 2, ldp, m, (jn + 1) / 2, pan,
                           MK_AVX512_NR, nr, alpha, o + c0, ldo);
        }
    }
}
