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

void mk_avx512bf16_p_to_codes(float *p, ptrdiff_t ldp, int64_t m, int64_t n)
{
    for (int64_t i = 0; i < m; i++)
        row_to_bf16(p + i * ldp, n);
}

size_t mk_avx512bf16_packed_v_bf16_floats(int64_t n, int64_t dv)
{
    return (size_t)((n + 1) / 2) * MK_AVX512_NR *
           (size_t)((dv + MK_AVX512_NR - 1) / MK_AVX512_NR);
}

/* Rows ahead that pack_v_bf16 prefetches (a row is a page apart in a
 * [B, L, H, D] cache). */
#define PACK_V_AHEAD 8

/* Each pair of rows is read whole, once, and interleaved one 32-column
 * block at a time with a two-source word permute. */
void mk_avx512bf16_pack_v_bf16(const uint16_t *v, ptrdiff_t ldv, int64_t n,
                               int64_t dv, float *packed, ptrdiff_t cb_stride)
{
    assert(n >= 0 && dv >= 0 && ldv >= 0);
    assert(cb_stride >= (ptrdiff_t)mk_avx512bf16_packed_v_bf16_floats(n, 1));
    const __m512i idx_lo = _mm512_set_epi16(
        47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i idx_hi = _mm512_set_epi16(
        63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
        55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    for (int64_t t = 0; 2 * t < n; t++) {
        const uint16_t *r0 = v + 2 * t * ldv;
        const int two = 2 * t + 1 < n;
        if (2 * t + PACK_V_AHEAD + 1 < n)
            for (int64_t c = 0; c < dv; c += 32) {
                _mm_prefetch((const char *)(r0 + PACK_V_AHEAD * ldv + c),
                             _MM_HINT_T0);
                _mm_prefetch((const char *)(r0 + (PACK_V_AHEAD + 1) * ldv + c),
                             _MM_HINT_T0);
            }
        float *out = packed + 32 * t;
        for (int64_t c0 = 0; c0 < dv; c0 += 32, out += cb_stride) {
            const __mmask32 cols = lanes32(dv - c0);
            __m512i a = _mm512_maskz_loadu_epi16(cols, r0 + c0);
            __m512i b = two ? _mm512_maskz_loadu_epi16(cols, r0 + ldv + c0)
                            : _mm512_setzero_si512();
            _mm512_storeu_si512(out, _mm512_permutex2var_epi16(a, idx_lo, b));
            _mm512_storeu_si512(out + 16,
                                _mm512_permutex2var_epi16(a, idx_hi, b));
        }
    }
}

/*
 * o[i][c] = alpha[i] * o[i][c] + sum_j P[i][j] * v[j][c], P's rows bf16
 * codes in their first bytes (pairs of keys, the tile's A elements, a
 * zero code after an odd n); each 32-column block of the pack is swept
 * by every strip of P over the whole pairs of keys. An odd n ends with
 * one more step whose pair row keeps only its first key's codes: the key
 * after n may be one of a larger pack's, and 0 x inf must not reach o.
 */
static void pv_codes(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                     const float *vp, ptrdiff_t cb_stride, int64_t dv,
                     const float *alpha, float *o, ptrdiff_t ldo)
{
    const int64_t pairs = n / 2;
    _Alignas(64) float tail[MK_AVX512_NR];
    const __m512i first_key = _mm512_set1_epi32(0xFFFF);
    for (int64_t c0 = 0; c0 < dv; c0 += MK_AVX512_NR, vp += cb_stride) {
        int64_t nr = dv - c0 < MK_AVX512_NR ? dv - c0 : MK_AVX512_NR;
        mk_td_pv_chunk(MK_TD_BY_ROWS, MK_TILE_C_NARROW, 1, p, ldp, m, pairs,
                       vp, MK_AVX512_NR, nr, alpha, o + c0, ldo);
        if (n % 2 == 0)
            continue;
        const float *last = vp + MK_AVX512_NR * pairs;
        _mm512_store_si512(tail, _mm512_and_si512(_mm512_loadu_si512(last),
                                                  first_key));
        _mm512_store_si512(tail + 16,
                           _mm512_and_si512(_mm512_loadu_si512(last + 16),
                                            first_key));
        mk_td_pv_chunk(MK_TD_BY_ROWS, MK_TILE_C_NARROW, 0, p + pairs, ldp, m,
                       1, tail, 0, nr, alpha, o + c0, ldo);
    }
}

/* pv_bf16 (kernels.h): P's rows become bf16 codes in place, then
 * pv_codes. */
void mk_avx512bf16_pv_bf16_12x32(float *p, ptrdiff_t ldp, int64_t m,
                                 int64_t n, const float *vp,
                                 ptrdiff_t cb_stride, int64_t dv,
                                 const float *alpha, float *o, ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldp >= 0);
    assert(m <= 1 || ldp >= n);
    if (m == 0 || dv == 0)
        return;
    mk_avx512bf16_p_to_codes(p, ldp, m, n);
    pv_codes(p, ldp, m, n, vp, cb_stride, dv, alpha, o, ldo);
}

/* pv_codes (kernels.h): P already codes, as softmax_update_codes leaves
 * it. */
void mk_avx512bf16_pv_bf16_codes_12x32(float *p, ptrdiff_t ldp, int64_t m,
                                       int64_t n, const float *vp,
                                       ptrdiff_t cb_stride, int64_t dv,
                                       const float *alpha, float *o,
                                       ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldp >= 0);
    assert(m <= 1 || ldp >= n);
    if (m == 0 || dv == 0)
        return;
    pv_codes(p, ldp, m, n, vp, cb_stride, dv, alpha, o, ldo);
}
