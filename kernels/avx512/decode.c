/* The AVX-512 decode kernels for 8- and 16-bit caches (and wide calls of
 * every dtype: 9 to MK_DECODE_WIDE_ROWS rows of one kv head, below): up
 * to MK_DECODE_ROWS query rows (or rows across kv heads) against key and
 * value rows read in place, codes widened in registers 16 at a time (sign
 * extension and VCVTDQ2PS for int8, fp8 moved into binary16 bits for
 * VCVTPH2PS or, with VBMI, E4M3 through byte lookups, VCVTPH2PS and a
 * shift for the 16-bit types), tails through opmasks. The avx2 table's
 * kernels convert 8 codes per instruction, and an 8-bit cache's decode is
 * bound by those conversions rather than by memory: 16 lanes run it
 * 1.15-1.5x faster; 16-bit caches measured 1.04-1.17x faster on 1 thread
 * (level on 2). fp32 stays on the avx2 kernels, one kv head at a time
 * too (but for P.V of 6 to 8 rows a kv head, SEG_ROWS: one head's rows
 * take the wide P.V's passes, rows across kv heads this file's blocks of
 * MK_PV_BLOCK keys; the same operations per element), so that a
 * call across kv heads gives the bits of a call per head
 * (tests/test_kernel_decode.c): level there on Zen 4 and Zen 5, 0.88-0.95x
 * across kv heads with one query row per kv head (docs/benchmarks.md). A
 * scaled row's scale multiplies its score (keys) or its probability
 * (values).
 *
 * As in the avx2 kernels, rows are prefetched a fixed distance ahead into
 * L2 (one head's rows of a [B, L, H, D] cache are a page or more apart,
 * where the hardware prefetchers stop), never past row n - 1; the
 * across-heads loops fetch up to mk_heads.more rows past it, which the
 * caller's row table or cache holds (kernels/decode_heads.h).
 *
 * Determinism: a score is two 16-lane chains over d (even and odd
 * 16-element chunks) reduced the same way for every row (in a wide call:
 * one chain over d in order); an output element is scaled by alpha, then
 * takes one FMA per key in key order. Neither depends on m (among narrow
 * calls, or among wide ones), n or the element's place. */
#include <assert.h>
#include <immintrin.h>

#include "avx2/avx2.h"
#include "avx2/e4m3.h"
#include "avx512.h"

#include "fetch_step.h"

#define INLINE static inline __attribute__((always_inline))

/* The table whose decode slots this build defines: avx512, or avx512bf16
 * (kernels/avx512bf16/decode.c, with MK_AVX512_VBMI). */
#ifndef MK_AVX512_DECODE_ISA
#define MK_AVX512_DECODE_ISA avx512
#endif
#define MK_AVX512_DECODE_CAT(isa, op) mk_##isa##_##op
#define MK_AVX512_DECODE_XCAT(isa, op) MK_AVX512_DECODE_CAT(isa, op)
#define MK_AVX512_DECODE_NAME(op) MK_AVX512_DECODE_XCAT(MK_AVX512_DECODE_ISA, op)


/* Rows (kv heads) of keys_dot, chunk by chunk across them: 16 of the 32
 * registers accumulate. 8 at a time read a [B, L, H, D] fp16 cache from
 * DRAM 1.1-1.25x faster than 1 (4: 1.05x), the fetch spread over the
 * chunks (docs/benchmarks.md). */
#define MK_KEYS_DOT 8

/* Every cache line of a row of row_bytes bytes, into L2. Kept
 * always_inline beside its loops: a shared static inline helper compiled
 * to half the prefetches and halved [B, L, H, D] decode
 * (docs/benchmarks.md). */
INLINE void prefetch_row(const char *row, size_t row_bytes)
{
    for (size_t off = 0; off < row_bytes; off += 64)
        _mm_prefetch(row + off, _MM_HINT_T1);
    _mm_prefetch(row + row_bytes - 1, _MM_HINT_T1);
}

#ifdef MK_AVX512_VBMI
/* E4M3 through byte lookups (AVX512-VBMI; the avx512bf16 table's build of
 * this file): every E4M3 value is a bfloat16 (4 significant bits,
 * exponents 2^-9..2^8), so a code's fp32 bits are its bfloat16's high
 * byte (sign | E4M3_HI[code & 0x7F]) and low byte (E4M3_LO[...]) over 16
 * zero bits. Two 128-entry VPERMI2B lookups, a VPTERNLOGD for the sign and
 * one zero-masked VPERMT2B that places the bytes: 4 instructions per 16
 * codes instead of the binary16 path's 7 and a VCVTPH2PS. NaN (0x7F and
 * 0xFF) maps to a quiet NaN; the tables were generated from the format's
 * definition and the quant suite checks all 256 codes. */
_Alignas(64) static const uint8_t E4M3_HI[128] = {
    0x00, 0x3B, 0x3B, 0x3B, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C,
    0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D,
    0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E,
    0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F,
    0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
    0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
    0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
    0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x7F,
};
_Alignas(64) static const uint8_t E4M3_LO[128] = {
    0x00, 0x00, 0x80, 0xC0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xC0,
};
/* Where codes 16k..16k+15 of a 64-code lookup go: byte 4i + 2
 * from lo's byte 16k + i, 4i + 3 from hi's (64 + 16k + i). */
_Alignas(64) static const uint8_t E4M3_PLACE4[4][64] = {
    {0, 0, 0, 64, 0, 0, 1, 65, 0, 0, 2, 66, 0, 0, 3, 67, 0, 0, 4, 68, 0, 0, 5, 69, 0, 0, 6, 70, 0, 0, 7, 71, 0, 0, 8, 72, 0, 0, 9, 73, 0, 0, 10, 74, 0, 0, 11, 75, 0, 0, 12, 76, 0, 0, 13, 77, 0, 0, 14, 78, 0, 0, 15, 79},
    {0, 0, 16, 80, 0, 0, 17, 81, 0, 0, 18, 82, 0, 0, 19, 83, 0, 0, 20, 84, 0, 0, 21, 85, 0, 0, 22, 86, 0, 0, 23, 87, 0, 0, 24, 88, 0, 0, 25, 89, 0, 0, 26, 90, 0, 0, 27, 91, 0, 0, 28, 92, 0, 0, 29, 93, 0, 0, 30, 94, 0, 0, 31, 95},
    {0, 0, 32, 96, 0, 0, 33, 97, 0, 0, 34, 98, 0, 0, 35, 99, 0, 0, 36, 100, 0, 0, 37, 101, 0, 0, 38, 102, 0, 0, 39, 103, 0, 0, 40, 104, 0, 0, 41, 105, 0, 0, 42, 106, 0, 0, 43, 107, 0, 0, 44, 108, 0, 0, 45, 109, 0, 0, 46, 110, 0, 0, 47, 111},
    {0, 0, 48, 112, 0, 0, 49, 113, 0, 0, 50, 114, 0, 0, 51, 115, 0, 0, 52, 116, 0, 0, 53, 117, 0, 0, 54, 118, 0, 0, 55, 119, 0, 0, 56, 120, 0, 0, 57, 121, 0, 0, 58, 122, 0, 0, 59, 123, 0, 0, 60, 124, 0, 0, 61, 125, 0, 0, 62, 126, 0, 0, 63, 127},
};

/* 64 codes at once (x, 64 bytes): the two lookups and the sign serve all
 * four 16-code vectors, out[k] holding codes 16k..16k+15 as fp32: 7
 * instructions per 64 codes against 16. Exact, as e4m3_to_f32. */
INLINE void e4m3_to_f32x4(__m512i x, __m512 out[4])
{
    __m512i hi = _mm512_permutex2var_epi8(
        _mm512_load_si512(E4M3_HI), x, _mm512_load_si512(E4M3_HI + 64));
    __m512i lo = _mm512_permutex2var_epi8(
        _mm512_load_si512(E4M3_LO), x, _mm512_load_si512(E4M3_LO + 64));
    hi = _mm512_ternarylogic_epi32(hi, x, _mm512_set1_epi8((char)0x80),
                                   0xF8); /* hi | (x & 0x80) */
    for (int k = 0; k < 4; k++)
        out[k] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi8(
            0xCCCCCCCCCCCCCCCCull, lo, _mm512_load_si512(E4M3_PLACE4[k]),
            hi));
}

/* 16 codes: the first vector of the 64-code form (the unused lookups
 * and placements compile away). */
INLINE __m512 e4m3_to_f32(__m128i codes)
{
    __m512 out[4];
    e4m3_to_f32x4(_mm512_castsi128_si512(codes), out);
    return out[0];
}

/* E4M3 loads as its exact value: nothing to undo. */
INLINE float code_factor(mk_dtype t)
{
    (void)t;
    return 1.0f;
}
#else
/* What load16 leaves to undo per row: E4M3 loads as its value times 2^-8. */
INLINE float code_factor(mk_dtype t)
{
    return t == MK_FP8_E4M3 ? 256.0f : 1.0f;
}
#endif

INLINE __mmask16 lanes(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF
           : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* Elements [c, c + 16) of a row of type t as fp32 (an E4M3 code's value
 * times 2^-8), or with full 0 only the lanes of k (zeros elsewhere,
 * nothing past them read). */
INLINE __m512 load16(const void *row, mk_dtype t, int64_t c, int full,
                     __mmask16 k)
{
    const uint16_t *h = (const uint16_t *)row + c;
    const int8_t *b = (const int8_t *)row + c;
    switch (t) {
    case MK_F32:
        return full ? _mm512_loadu_ps((const float *)row + c)
                    : _mm512_maskz_loadu_ps(k, (const float *)row + c);
    case MK_F16:
        return _mm512_cvtph_ps(full ? _mm256_loadu_si256((const __m256i *)h)
                                    : _mm256_maskz_loadu_epi16(k, h));
    case MK_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(full ? _mm256_loadu_si256((const __m256i *)h)
                                       : _mm256_maskz_loadu_epi16(k, h)),
            16));
    case MK_I8:
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            full ? _mm_loadu_si128((const __m128i *)b)
                 : _mm_maskz_loadu_epi8(k, b)));
    case MK_FP8_E4M3:
#ifdef MK_AVX512_VBMI
        return e4m3_to_f32(full ? _mm_loadu_si128((const __m128i *)b)
                                : _mm_maskz_loadu_epi8(k, b));
#else
        return _mm512_cvtph_ps(mk_e4m3_to_f16x16(_mm256_cvtepi8_epi16(
            full ? _mm_loadu_si128((const __m128i *)b)
                 : _mm_maskz_loadu_epi8(k, b))));
#endif
    case MK_FP8_E5M2: /* the high byte of a binary16 */
        return _mm512_cvtph_ps(_mm256_slli_epi16(
            _mm256_cvtepu8_epi16(full ? _mm_loadu_si128((const __m128i *)b)
                                      : _mm_maskz_loadu_epi8(k, b)),
            8));
    case MK_DTYPE_COUNT: break;
    }
    return _mm512_setzero_ps();
}

/* A score from its two chains: lanes l and l + 8, then l + 4, l + 2,
 * l + 1 (_mm512_reduce_add_ps's tree, written out so that every kernel
 * of this file sums the same way whichever compiler builds it). */
INLINE float hsum16(__m512 a0, __m512 a1)
{
    __m512 x = _mm512_add_ps(a0, a1);
    __m256 h = _mm256_add_ps(
        _mm512_castps512_ps256(x),
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(h),
                          _mm256_extractf128_ps(h, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
}

/* Row r's score: its sum times the row's scale sc[r] (and the code
 * factor) when t is scaled. */
INLINE float scaled_score(mk_dtype t, float x, float sc)
{
    return mk_dtype_scaled(t) ? x * code_factor(t) * sc : x;
}

/* s[r * lds] = q row r . key row, r < R, times the row's scale sc when t
 * is scaled. */
INLINE void dot_rows(const int R, const float *q, ptrdiff_t ldq,
                     const void *row, mk_dtype t, float sc, int64_t d,
                     float *s, ptrdiff_t lds)
{
    __m512 a[MK_DECODE_ROWS][2];
    for (int r = 0; r < R; r++)
        a[r][0] = a[r][1] = _mm512_setzero_ps();
    int64_t c = 0;
#ifdef MK_AVX512_VBMI
    /* E4M3 for one or two rows (one query row per kv head): 64 codes per
     * lookup, the chunks to the same chains in the same order. */
    if (t == MK_FP8_E4M3 && R <= 2)
        for (; c + 64 <= d; c += 64) {
            __m512 k4[4];
            e4m3_to_f32x4(_mm512_loadu_si512((const int8_t *)row + c), k4);
            for (int x = 0; x < 4; x++)
                for (int r = 0; r < R; r++)
                    a[r][x & 1] = _mm512_fmadd_ps(
                        _mm512_loadu_ps(q + r * ldq + c + 16 * x), k4[x],
                        a[r][x & 1]);
        }
#endif
    for (; c + 32 <= d; c += 32) {
        __m512 k0 = load16(row, t, c, 1, 0), k1 = load16(row, t, c + 16, 1, 0);
        for (int r = 0; r < R; r++) {
            const float *qr = q + r * ldq + c;
            a[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(qr), k0, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16), k1, a[r][1]);
        }
    }
    if (c < d) { /* 1..31 left: an even chunk, then an odd one if any */
        __mmask16 m0 = lanes(d - c), m1 = lanes(d - c - 16);
        __m512 k0 = load16(row, t, c, 0, m0);
        for (int r = 0; r < R; r++)
            a[r][0] = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(m0, q + r * ldq + c), k0, a[r][0]);
        if (m1) {
            __m512 k1 = load16(row, t, c + 16, 0, m1);
            for (int r = 0; r < R; r++)
                a[r][1] = _mm512_fmadd_ps(
                    _mm512_maskz_loadu_ps(m1, q + r * ldq + c + 16), k1,
                    a[r][1]);
        }
    }
    for (int r = 0; r < R; r++)
        s[r * lds] = scaled_score(t, hsum16(a[r][0], a[r][1]), sc);
}

/* s[r * lds] = q row r (q + r * ldq) . key row k + r * kstep, times
 * sc[r * sc_step] when t is scaled, r < R <= MK_KEYS_DOT: each row against
 * its own key (the kv heads of a position), the chains and sums as
 * dot_rows's, the runs pf + r * pf_step (d elements each) fetched ahead as
 * the chunks go. Chunk by chunk across the rows: the rows' lines are
 * loaded (and fetched) together, not one row's after another's. */
INLINE void keys_dot(const int R, const float *q, ptrdiff_t ldq,
                     const char *k, ptrdiff_t kstep, mk_dtype t,
                     const float *sc, ptrdiff_t sc_step, int64_t d, float *s,
                     ptrdiff_t lds, const char *pf, ptrdiff_t pf_step)
{
    const size_t es = mk_dtype_size(t);
    __m512 a[MK_DECODE_ROWS][2];
    for (int r = 0; r < R; r++)
        a[r][0] = a[r][1] = _mm512_setzero_ps();
    int64_t c = 0;
#ifdef MK_AVX512_VBMI
    if (t == MK_FP8_E4M3) /* 64 codes per lookup (dot_rows) */
        for (; c + 64 <= d; c += 64)
            for (int r = 0; r < R; r++) {
                mk_fetch_step(pf + r * pf_step, (size_t)c, 64);
                __m512 k4[4];
                e4m3_to_f32x4(
                    _mm512_loadu_si512((const int8_t *)(k + r * kstep) + c),
                    k4);
                for (int x = 0; x < 4; x++)
                    a[r][x & 1] = _mm512_fmadd_ps(
                        _mm512_loadu_ps(q + r * ldq + c + 16 * x), k4[x],
                        a[r][x & 1]);
            }
#endif
    for (; c + 32 <= d; c += 32)
        for (int r = 0; r < R; r++) {
            const float *qr = q + r * ldq + c;
            const char *kr = k + r * kstep;
            mk_fetch_step(pf + r * pf_step, (size_t)c * es, 32 * es);
            a[r][0] = _mm512_fmadd_ps(_mm512_loadu_ps(qr),
                                      load16(kr, t, c, 1, 0), a[r][0]);
            a[r][1] = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16),
                                      load16(kr, t, c + 16, 1, 0), a[r][1]);
        }
    if (c < d) {
        __mmask16 m0 = lanes(d - c), m1 = lanes(d - c - 16);
        for (int r = 0; r < R; r++) {
            const float *qr = q + r * ldq + c;
            const char *kr = k + r * kstep;
            a[r][0] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, qr),
                                      load16(kr, t, c, 0, m0), a[r][0]);
            if (m1)
                a[r][1] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, qr + 16),
                                          load16(kr, t, c + 16, 0, m1),
                                          a[r][1]);
        }
    }
    for (int r = 0; r < R; r++) {
        mk_fetch_rest(pf + r * pf_step, (size_t)c * es, (size_t)d * es);
        s[r * lds] = scaled_score(t, hsum16(a[r][0], a[r][1]),
                                  sc ? sc[r * sc_step] : 1.0f);
    }
}

/* The (row, key) scores dot_rows_keys computes at once. */
#define MK_QK_BLOCK 8

/* Eight scores from their chains, x[i] = a[i][0] + a[i][1]: hsum16's
 * steps (lanes l and l + 8, then l + 4, l + 2, l + 1, each sum in that
 * order), but for eight vectors at once, transposed by shuffles: 15 adds
 * for 8 scores instead of 5 adds and 4 shuffles per score. Lane i of the
 * result (i < 8) is x[i]'s sum, the same float as hsum16's. */
INLINE __m256 hsum16x8(const __m512 *x)
{
    __m512 y[4], z[2];
    for (int p = 0; p < 4; p++) /* 256-bit halves: x[2p], x[2p + 1] */
        y[p] = _mm512_add_ps(
            _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0x44),
            _mm512_shuffle_f32x4(x[2 * p], x[2 * p + 1], 0xEE));
    for (int p = 0; p < 2; p++) /* 128-bit quarters: lane k of z[p] */
        z[p] = _mm512_add_ps(
            _mm512_shuffle_f32x4(y[2 * p], y[2 * p + 1], 0x88),
            _mm512_shuffle_f32x4(y[2 * p], y[2 * p + 1], 0xDD));
    /* Per 128-bit lane k: u[0] + u[2], u[1] + u[3] of x[k], then x[k + 4]. */
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x44),
                                   _mm512_shuffle_ps(z[0], z[1], 0xEE));
    /* v[0] + v[1]: lane 4k holds x[k]'s sum, 4k + 1 x[k + 4]'s. */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w, w, 0x88),
                                   _mm512_shuffle_ps(w, w, 0xDD));
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0),
        r));
}

/* s[r * lds + k] = q row r . key row rows[k] (times sc[k] when t is
 * scaled), r < R, k < K, R * K = MK_QK_BLOCK (grouped rows: a kv head's
 * G rows against K = 8 / G keys): each key's chunks widened once and each
 * query chunk loaded once for all of them, and the eight sums reduced
 * together (hsum16x8). Chains and sums are dot_rows's, bit for bit. */
INLINE void dot_rows_keys(const int R, const int K, const float *q,
                          ptrdiff_t ldq, const char *const *rows, mk_dtype t,
                          const float *sc, int64_t d, float *s, ptrdiff_t lds,
                          const char *const *pf)
{
    const size_t es = mk_dtype_size(t);
    __m512 a[MK_QK_BLOCK][2];
    for (int x = 0; x < R * K; x++)
        a[x][0] = a[x][1] = _mm512_setzero_ps();
    int64_t c = 0;
    if (R == 1) /* one row, 8 keys: each key's chunks widened as used */
        for (; c + 32 <= d; c += 32) {
            const __m512 q0 = _mm512_loadu_ps(q + c),
                         q1 = _mm512_loadu_ps(q + c + 16);
            for (int k = 0; k < K; k++) {
                mk_fetch_step(pf[k], (size_t)c * es, 32 * es);
                a[k][0] = _mm512_fmadd_ps(q0, load16(rows[k], t, c, 1, 0),
                                          a[k][0]);
                a[k][1] = _mm512_fmadd_ps(q1, load16(rows[k], t, c + 16, 1, 0),
                                          a[k][1]);
            }
        }
#ifdef MK_AVX512_VBMI
    /* E4M3 of one or two keys a call (4 or 8 rows): 64 codes per lookup
     * (dot_rows), the chunks to the same chains in the same order. */
    if (t == MK_FP8_E4M3 && K <= 2)
        for (; c + 64 <= d; c += 64) {
            __m512 k4[2][4];
            for (int k = 0; k < K; k++) {
                mk_fetch_step(pf[k], (size_t)c, 64);
                e4m3_to_f32x4(_mm512_loadu_si512(rows[k] + c), k4[k]);
            }
            for (int x = 0; x < 4; x++)
                for (int r = 0; r < R; r++) {
                    const __m512 qx = _mm512_loadu_ps(q + r * ldq + c + 16 * x);
                    for (int k = 0; k < K; k++)
                        a[r * K + k][x & 1] =
                            _mm512_fmadd_ps(qx, k4[k][x], a[r * K + k][x & 1]);
                }
        }
#endif
    for (; c + 32 <= d; c += 32) {
        __m512 kv[MK_QK_BLOCK][2];
        for (int k = 0; k < K; k++) {
            mk_fetch_step(pf[k], (size_t)c * es, 32 * es);
            kv[k][0] = load16(rows[k], t, c, 1, 0);
            kv[k][1] = load16(rows[k], t, c + 16, 1, 0);
        }
        for (int r = 0; r < R; r++) {
            const __m512 q0 = _mm512_loadu_ps(q + r * ldq + c),
                         q1 = _mm512_loadu_ps(q + r * ldq + c + 16);
            for (int k = 0; k < K; k++) {
                a[r * K + k][0] = _mm512_fmadd_ps(q0, kv[k][0], a[r * K + k][0]);
                a[r * K + k][1] = _mm512_fmadd_ps(q1, kv[k][1], a[r * K + k][1]);
            }
        }
    }
    if (c < d) { /* as dot_rows: an even chunk, then an odd one if any */
        const __mmask16 m0 = lanes(d - c), m1 = lanes(d - c - 16);
        for (int k = 0; k < K; k++) {
            const __m512 k0 = load16(rows[k], t, c, 0, m0);
            for (int r = 0; r < R; r++)
                a[r * K + k][0] = _mm512_fmadd_ps(
                    _mm512_maskz_loadu_ps(m0, q + r * ldq + c), k0,
                    a[r * K + k][0]);
            if (m1) {
                const __m512 k1 = load16(rows[k], t, c + 16, 0, m1);
                for (int r = 0; r < R; r++)
                    a[r * K + k][1] = _mm512_fmadd_ps(
                        _mm512_maskz_loadu_ps(m1, q + r * ldq + c + 16), k1,
                        a[r * K + k][1]);
            }
        }
    }
    for (int k = 0; k < K; k++)
        mk_fetch_rest(pf[k], (size_t)c * es, (size_t)d * es);
    __m512 x[MK_QK_BLOCK];
    for (int i = 0; i < MK_QK_BLOCK; i++)
        x[i] = i < R * K ? _mm512_add_ps(a[i][0], a[i][1])
                         : _mm512_setzero_ps();
    __m256 sum = hsum16x8(x);
    if (mk_dtype_scaled(t)) { /* scaled_score's x * factor * sc, per lane */
        float scale[MK_QK_BLOCK];
        for (int r = 0; r < R; r++)
            for (int k = 0; k < K; k++)
                scale[r * K + k] = sc[k];
        sum = _mm256_mul_ps(_mm256_mul_ps(sum, _mm256_set1_ps(code_factor(t))),
                            _mm256_loadu_ps(scale));
    }
    float out[MK_QK_BLOCK];
    _mm256_storeu_ps(out, sum);
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++)
            s[r * lds + k] = out[r * K + k];
}

/* s[r * lds] = q row r . key row, r < m <= MK_DECODE_ROWS: every row
 * against the key at once. */
INLINE void rows_dot(const float *q, ptrdiff_t ldq, int64_t m,
                     const void *row, mk_dtype t, float sc, int64_t d,
                     float *s, ptrdiff_t lds)
{
    switch (m) {
    case 1: dot_rows(1, q, ldq, row, t, sc, d, s, lds); break;
    case 2: dot_rows(2, q, ldq, row, t, sc, d, s, lds); break;
    case 3: dot_rows(3, q, ldq, row, t, sc, d, s, lds); break;
    case 4: dot_rows(4, q, ldq, row, t, sc, d, s, lds); break;
    case 5: dot_rows(5, q, ldq, row, t, sc, d, s, lds); break;
    case 6: dot_rows(6, q, ldq, row, t, sc, d, s, lds); break;
    case 7: dot_rows(7, q, ldq, row, t, sc, d, s, lds); break;
    case 8: dot_rows(8, q, ldq, row, t, sc, d, s, lds); break;
    default: break;
    }
}

/* o rows i < R += pk[k][i] times value row rg[k], for the K (1 or 2)
 * keys k in key order (dv wide): one FMA per key and element (pv_chunk's
 * for one key), the output chunk in a register across the keys, so K
 * keys load and store it once (the fetch runs pf[k] spread over the
 * chunks unless pf is NULL). */
INLINE void pv_keys(const int K, int64_t R,
                    const float (*pk)[MK_DECODE_ROWS],
                    const char *const *rg, mk_dtype t, int64_t dv, float *o,
                    ptrdiff_t ldo, const char *const *pf)
{
    const size_t es = mk_dtype_size(t);
    const int64_t full = dv / 16 * 16;
    const __mmask16 tail = lanes(dv - full);
    int64_t c = 0;
#ifdef MK_AVX512_VBMI
    if (t == MK_FP8_E4M3) /* 64 codes per lookup (dot_rows) */
        for (; c + 64 <= full; c += 64) {
            __m512 x4[2][4];
            for (int k = 0; k < K; k++) {
                if (pf)
                    mk_fetch_step(pf[k], (size_t)c, 64);
                e4m3_to_f32x4(_mm512_loadu_si512((const int8_t *)rg[k] + c),
                              x4[k]);
            }
            for (int x = 0; x < 4; x++)
                for (int64_t i = 0; i < R; i++) {
                    float *oi = o + i * ldo + c + 16 * x;
                    __m512 a = _mm512_loadu_ps(oi);
                    for (int k = 0; k < K; k++)
                        a = _mm512_fmadd_ps(_mm512_set1_ps(pk[k][i]),
                                            x4[k][x], a);
                    _mm512_storeu_ps(oi, a);
                }
        }
#endif
    for (; c < full; c += 16) {
        __m512 x[2];
        for (int k = 0; k < K; k++) {
            if (pf)
                mk_fetch_step(pf[k], (size_t)c * es, 16 * es);
            x[k] = load16(rg[k], t, c, 1, 0);
        }
        for (int64_t i = 0; i < R; i++) {
            float *oi = o + i * ldo + c;
            __m512 a = _mm512_loadu_ps(oi);
            for (int k = 0; k < K; k++)
                a = _mm512_fmadd_ps(_mm512_set1_ps(pk[k][i]), x[k], a);
            _mm512_storeu_ps(oi, a);
        }
    }
    if (tail) {
        __m512 x[2];
        for (int k = 0; k < K; k++)
            x[k] = load16(rg[k], t, full, 0, tail);
        for (int64_t i = 0; i < R; i++) {
            float *oi = o + i * ldo + full;
            __m512 a = _mm512_maskz_loadu_ps(tail, oi);
            for (int k = 0; k < K; k++)
                a = _mm512_fmadd_ps(_mm512_set1_ps(pk[k][i]), x[k], a);
            _mm512_mask_storeu_ps(oi, tail, a);
        }
    }
    for (int k = 0; pf && k < K; k++)
        mk_fetch_rest(pf[k], (size_t)c * es, (size_t)dv * es);
}

/* Grouped rows fetch each kv head's run ahead into L2: into L1 their
 * 16-bit rows read 0.90-0.95x (docs/benchmarks.md). */
INLINE void prefetch_run(const char *run, size_t run_bytes, int l1)
{
    (void)l1;
    prefetch_row(run, run_bytes);
}

/* Keys a grouped kv head's rows take at once (pv_block; decode_heads.h
 * calls it for K > 2 keys of rows of whole kv heads). */
#define MK_PV_BLOCK 8

/* o rows i < G (a kv head's rows, G = 2, 4 or 8, a constant) += pk[k][i]
 * times value row rg[k], for the K keys k < K in key order: one FMA per
 * key and element, as pv_keys, but the outputs of C = 16 / G chunks of
 * all G rows stay in registers (4 rows x 4 chunks at G = 4) across the K
 * keys, each key's chunks widened once for the G rows and the broadcast
 * of a probability shared by its C chunks. pv_keys loads and stores each
 * output chunk once per key pair: for grouped rows as many 512-bit
 * stores as FMAs, and Zen 4 takes two cycles a store (docs/benchmarks.md). */
INLINE void pv_block(const int K, const int G,
                     const float (*pk)[MK_DECODE_ROWS],
                     const char *const *rg, mk_dtype t, int64_t dv, float *o,
                     ptrdiff_t ldo, const char *const *pf)
{
    const size_t run = (size_t)dv * mk_dtype_size(t);
    const int C = 16 / G; /* chunks a row keeps in registers */
    const int64_t full = dv / 16 * 16;
    int64_t c = 0;
    for (; c + 16 * C <= full; c += 16 * C) {
        __m512 acc[16];
        for (int i = 0; i < G; i++)
            for (int x = 0; x < C; x++)
                acc[i * C + x] = _mm512_loadu_ps(o + i * ldo + c + 16 * x);
        for (int k = 0; k < K; k++) {
            __m512 xv[16];
            if (c == 0 && pf && pf[k]) /* run k's fetch among its FMAs */
                prefetch_run(pf[k], run, 0);
#ifdef MK_AVX512_VBMI
            if (t == MK_FP8_E4M3 && C % 4 == 0) /* 64 codes per lookup */
                for (int x = 0; x < C; x += 4)
                    e4m3_to_f32x4(_mm512_loadu_si512((const int8_t *)rg[k] +
                                                     c + 16 * x),
                                  xv + x);
            else
#endif
                for (int x = 0; x < C; x++)
                    xv[x] = load16(rg[k], t, c + 16 * x, 1, 0);
            for (int i = 0; i < G; i++) {
                const __m512 b = _mm512_set1_ps(pk[k][i]);
                for (int x = 0; x < C; x++)
                    acc[i * C + x] = _mm512_fmadd_ps(b, xv[x], acc[i * C + x]);
            }
        }
        for (int i = 0; i < G; i++)
            for (int x = 0; x < C; x++)
                _mm512_storeu_ps(o + i * ldo + c + 16 * x, acc[i * C + x]);
    }
    /* The chunks short of C, and a last partial one, a chunk at a time. */
    for (; c < dv; c += 16) {
        const int whole = c + 16 <= dv;
        const __mmask16 m = lanes(dv - c);
        __m512 acc[MK_DECODE_ROWS];
        for (int i = 0; i < G; i++)
            acc[i] = whole ? _mm512_loadu_ps(o + i * ldo + c)
                           : _mm512_maskz_loadu_ps(m, o + i * ldo + c);
        for (int k = 0; k < K; k++) {
            if (c == 0 && pf && pf[k]) /* dv < 16 C: not fetched yet */
                prefetch_run(pf[k], run, 0);
            const __m512 xv = load16(rg[k], t, c, whole, m);
            for (int i = 0; i < G; i++)
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(pk[k][i]), xv, acc[i]);
        }
        for (int i = 0; i < G; i++) {
            if (whole)
                _mm512_storeu_ps(o + i * ldo + c, acc[i]);
            else
                _mm512_mask_storeu_ps(o + i * ldo + c, m, acc[i]);
        }
    }
}

/* One query row per kv head of a 16-bit cache: the head's run (4 lines
 * at d = 128) before the head's work, as the avx2 kernels fetch theirs,
 * into L1 where it has room (l1: mk_heads.into_l1). Against the spread
 * fetch into L2, [B, L, H, D] (8,32,1,2048,128) fp16 read 1.28x and
 * (1,32,1,4096,128) 1.08-1.14x in three builds of different code layout
 * (1T, Zen 5); into Zen 4's 32 KiB L1 0.5x, so there into L2
 * (docs/benchmarks.md). */
INLINE void prefetch_run_near(const char *run, size_t run_bytes, int l1)
{
    mk_fetch_run(run, run_bytes, l1);
}

/* The 8-bit types spread their fetch across heads (one query row per kv
 * head: 4 KiB runs of 32 heads, read FMA-bound); the 16-bit ones fetch
 * per head (prefetch_run_near). */
INLINE int spread_fetch(mk_dtype t, int l1)
{
    (void)l1;
    return t != MK_F16 && t != MK_BF16;
}

#include "decode_heads.h"

/* Rows of one kv head (m = 1, 2, 4 or 8, a constant) against MK_QK_BLOCK
 * / m keys at a time (dot_rows_keys), each key's row `ahead` rows on
 * fetched among the chunks as decode_qk fetches it; returns the keys
 * done, the rest left to rows_dot. */
INLINE int64_t qk_rows_block_loop(const int M, const float *q, ptrdiff_t ldq,
                                  const void *k, mk_dtype t, ptrdiff_t ldk,
                                  const void *const *k_rows, const float *ks,
                                  ptrdiff_t ks_ld, int64_t n, int64_t d,
                                  float *s, ptrdiff_t lds, int64_t ahead)
{
    const size_t es = mk_dtype_size(t);
    const int K = MK_QK_BLOCK / M;
    int64_t j = 0;
    for (; j + K <= n; j += K) {
        const char *rows[MK_QK_BLOCK], *pf[MK_QK_BLOCK];
        float sc[MK_QK_BLOCK];
        for (int x = 0; x < K; x++) {
            rows[x] = row_at(k, ldk, k_rows, es, j + x);
            pf[x] = j + x + ahead < n
                        ? row_at(k, ldk, k_rows, es, j + x + ahead)
                        : rows[x];
            sc[x] = mk_dtype_scaled(t) ? ks[(j + x) * ks_ld] : 1.0f;
        }
        dot_rows_keys(M, K, q, ldq, rows, t, sc, d, s + j, lds, pf);
    }
    return j;
}

/* Out of line, one copy per dtype and row count (decode_heads.h,
 * MK_BLOCKS_RETURN). */
static __attribute__((noinline)) int64_t
qk_rows_blocks(const float *q, ptrdiff_t ldq, int64_t m, const void *k,
               mk_dtype t, ptrdiff_t ldk, const void *const *k_rows,
               const float *ks, ptrdiff_t ks_ld, int64_t n, int64_t d,
               float *s, ptrdiff_t lds, int64_t ahead)
{
#define QK_ROWS(M, T)                                                     \
    qk_rows_block_loop(M, q, ldq, k, T, ldk, k_rows, ks, ks_ld, n, d, s, lds, \
                       ahead)
    if (m == 1 && t == MK_I8)
        return QK_ROWS(1, MK_I8);
    MK_BLOCKS_RETURN(m, t, QK_ROWS);
#undef QK_ROWS
}

/* ---- Wide blocks: more than MK_DECODE_ROWS rows of one kv head -------
 * With 9 to MK_DECODE_WIDE_ROWS query rows on the same keys (grouped
 * queries: 16 query heads a kv head, or a speculative step's queries of
 * 4 or 8), the rows' dot products bound the work, not memory: the 8-row
 * path spends a reduction across lanes on every score. Here a vector's
 * lanes are the rows: the queries are transposed once per call (qt[p]
 * holds q[i][p] for the 16 rows i), and each key's element p, broadcast,
 * multiplies qt[p] for all rows in one FMA, no reduction. A score is
 * then one chain over p = 0 .. d - 1 in order, the same whatever m (in
 * 9 .. MK_DECODE_WIDE_ROWS), n or the key's place (docs/design.md,
 * "Kernel contract", wide decode calls). */

/* The depth the transposed queries and a block's widened key rows are
 * kept for on the stack (24 KiB); deeper rows take the 8-row path for
 * each half of the rows. */
#define WIDE_D 256
/* Keys a step: their accumulators and the qt vector in registers, each
 * FMA's key element a broadcast load. */
enum { WIDE_KEYS = 8 };

/* Rows a wide kernel fetches ahead: four times the narrow kernels'
 * distance, as its keys take about four times as long. */
INLINE int64_t wide_ahead(size_t row_bytes)
{
    return 4 * mk_ahead_rows(row_bytes);
}

/* rows[x] = row j + x, x < nk, of n; each fetches the row wide_ahead
 * on into L2 and the next step's into L1. */
INLINE void wide_rows(const void *base, ptrdiff_t ld, const void *const *tab,
                      size_t es, int64_t j, int64_t nk, int64_t n,
                      size_t row_bytes, const char **rows)
{
    const int64_t ahead = wide_ahead(row_bytes);
    for (int64_t x = 0; x < nk; x++) {
        rows[x] = mk_decode_row(base, ld, tab, es, j + x);
        if (j + x + ahead < n)
            prefetch_row(mk_decode_row(base, ld, tab, es, j + x + ahead),
                         row_bytes);
        if (j + x + WIDE_KEYS < n)
            mk_fetch_run(mk_decode_row(base, ld, tab, es, j + x + WIDE_KEYS),
                         row_bytes, 1);
    }
}

/* acc[x] = the K keys' scores for every row (lanes = rows), key x's
 * fp32 elements at r[x]: each FMA broadcasts one of them against the
 * transposed queries. fp32 keys are read from their rows; other types
 * are widened into the stack buffer first, the r[x] its rows (copying
 * fp32 too cost 16% of a step: 176 to 156 cycles a key in L2,
 * avx512bf16, Zen 4; docs/benchmarks.md). */
INLINE void wide_dots(const int K, const float *qt, const float *const *r,
                      int64_t d, __m512 *acc)
{
    for (int x = 0; x < K; x++)
        acc[x] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t p = 0; p < d; p++) {
        const __m512 qv = _mm512_load_ps(qt + 16 * p);
        for (int x = 0; x < K; x++)
            acc[x] = _mm512_fmadd_ps(qv, _mm512_set1_ps(r[x][p]), acc[x]);
    }
}

/* A full step's scores, a[x] key x's for every row (lanes = rows), into
 * rows i < m of s (eight keys a row) through a transpose in registers:
 * the 128 scalar moves it replaces took a fifth of the step (a 16-row
 * call ran at 188 cycles a key against the FMAs' 128, docs/benchmarks.md). */
INLINE void wide_scores8(const __m512 *a, int64_t m, float *s, ptrdiff_t lds)
{
    /* Within each 128-bit block b (rows 4b .. 4b + 3): pairs of keys,
     * then u[r] = keys 0-3 and w[r] = keys 4-7 of row 4b + r. */
    __m512 t[8], u[4], w[4];
    for (int x = 0; x < 8; x += 2) {
        t[x] = _mm512_unpacklo_ps(a[x], a[x + 1]);
        t[x + 1] = _mm512_unpackhi_ps(a[x], a[x + 1]);
    }
    u[0] = _mm512_shuffle_ps(t[0], t[2], 0x44);
    u[1] = _mm512_shuffle_ps(t[0], t[2], 0xEE);
    u[2] = _mm512_shuffle_ps(t[1], t[3], 0x44);
    u[3] = _mm512_shuffle_ps(t[1], t[3], 0xEE);
    w[0] = _mm512_shuffle_ps(t[4], t[6], 0x44);
    w[1] = _mm512_shuffle_ps(t[4], t[6], 0xEE);
    w[2] = _mm512_shuffle_ps(t[5], t[7], 0x44);
    w[3] = _mm512_shuffle_ps(t[5], t[7], 0xEE);
    /* Blocks 0 and 1 (lo), 2 and 3 (hi) of u[r] and w[r] side by side:
     * rows r, 4 + r (lo) and 8 + r, 12 + r (hi), one 256-bit half each. */
    const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4,
                                             5, 6, 7, 20, 21, 22, 23);
    const __m512i hi_idx = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27,
                                             12, 13, 14, 15, 28, 29, 30, 31);
    for (int r = 0; r < 4; r++) {
        const __m512 lo = _mm512_permutex2var_ps(u[r], lo_idx, w[r]);
        const __m512 hi = _mm512_permutex2var_ps(u[r], hi_idx, w[r]);
        const __m256 half[4] = {
            _mm512_castps512_ps256(lo),
            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lo), 1)),
            _mm512_castps512_ps256(hi),
            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(hi), 1))};
        for (int b = 0; b < 4; b++)
            if (4 * b + r < m)
                _mm256_storeu_ps(s + (4 * b + r) * lds, half[b]);
    }
}

/* The scores of keys j .. j + K - 1 (rows at `rows`, their scales sc
 * when t is scaled) into s, rows i < m. */
INLINE void wide_step(const int K, const float *qt, const char *const *rows,
                      mk_dtype t, const float *sc, int64_t m, int64_t d,
                      float *kb, float *s, ptrdiff_t lds)
{
    const float *r[WIDE_KEYS];
    for (int x = 0; x < K; x++) {
        if (t == MK_F32) {
            r[x] = (const float *)rows[x];
            continue;
        }
        r[x] = kb + x * WIDE_D;
        for (int64_t c = 0; c < d; c += 16) /* kb has room past d */
            _mm512_store_ps(kb + x * WIDE_D + c,
                            load16(rows[x], t, c, c + 16 <= d, lanes(d - c)));
    }
    __m512 acc[WIDE_KEYS];
    wide_dots(K, qt, r, d, acc);
    for (int x = 0; x < K; x++)
        if (mk_dtype_scaled(t)) /* scaled_score's two products */
            acc[x] = _mm512_mul_ps(
                _mm512_mul_ps(acc[x], _mm512_set1_ps(code_factor(t))),
                _mm512_set1_ps(sc[x]));
    if (K == WIDE_KEYS) {
        wide_scores8(acc, m, s, lds);
        return;
    }
    _Alignas(64) float st[WIDE_KEYS][16];
    for (int x = 0; x < K; x++)
        _mm512_store_ps(st[x], acc[x]);
    for (int64_t i = 0; i < m; i++)
        for (int x = 0; x < K; x++)
            s[i * lds + x] = st[x][i];
}

/* decode_qk for MK_DECODE_ROWS < m <= MK_DECODE_WIDE_ROWS rows of one kv
 * head, d <= WIDE_D. */
INLINE void qk_wide(const float *q, ptrdiff_t ldq, int64_t m, const void *k,
                    mk_dtype t, ptrdiff_t ldk, const void *const *k_rows,
                    const float *ks, ptrdiff_t ks_ld, int64_t n, int64_t d,
                    float *s, ptrdiff_t lds)
{
    const size_t es = mk_dtype_size(t), row_bytes = (size_t)d * es;
    _Alignas(64) float qt[WIDE_D * 16];
    _Alignas(64) float kb[WIDE_KEYS * WIDE_D];
    for (int64_t p = 0; p < d; p++)
        for (int64_t i = 0; i < 16; i++)
            qt[16 * p + i] = i < m ? q[i * ldq + p] : 0.0f;
    for (int64_t j = 0; j < n; j += WIDE_KEYS) {
        const int64_t nk = n - j < WIDE_KEYS ? n - j : WIDE_KEYS;
        const char *rows[WIDE_KEYS];
        float sc[WIDE_KEYS];
        wide_rows(k, ldk, k_rows, es, j, nk, n, row_bytes, rows);
        for (int64_t x = 0; x < nk; x++)
            sc[x] = mk_dtype_scaled(t) ? ks[(j + x) * ks_ld] : 1.0f;
        if (nk == WIDE_KEYS)
            wide_step(WIDE_KEYS, qt, rows, t, sc, m, d, kb, s + j, lds);
        else
            wide_step((int)nk, qt, rows, t, sc, m, d, kb, s + j, lds);
    }
}

/* The wide calls, out of line: inlined into decode_qk and decode_pv, they
 * slowed the narrow paths of the same functions (one query row of an
 * int8 or fp8 cache: 0.83-0.96x, docs/benchmarks.md). */
static __attribute__((noinline)) void
wide_qk(const float *q, ptrdiff_t ldq, int64_t m, const void *k, mk_dtype kt,
        ptrdiff_t ldk, const void *const *k_rows, const float *ks,
        ptrdiff_t ks_ld, int64_t n, int64_t d, float *s, ptrdiff_t lds)
{
#define QK_WIDE(T)                                                        \
    qk_wide(q, ldq, m, k, T, ldk, k_rows, ks, ks_ld, n, d, s, lds)
    MK_FOR_DTYPE(kt, QK_WIDE);
#undef QK_WIDE
}

INLINE void decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                      const void *k, mk_dtype t, ptrdiff_t ldk,
                      const void *const *k_rows, const float *ks,
                      ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                      ptrdiff_t lds, const mk_heads *h)
{
    const size_t es = mk_dtype_size(t), row_bytes = (size_t)d * es;
    if (h) {
        decode_qk_across(q, ldq, m, k, t, ldk, k_rows, ks, ks_ld, n, d, s, lds,
                         h);
        return;
    }
    const int64_t ahead = mk_ahead_rows(row_bytes);
    int64_t j = 0;
    /* A grouped-query group's rows, or one row of int8 keys: 8 keys a
     * call (hsum16x8 reduces their 8 scores at once), 23.9 -> 19.0 cycles
     * a key in L2, and from DRAM [B, H, L, D] int8 read 1.11x. The
     * 16-bit types read 0.86-0.92x from DRAM that way (their
     * rows fetched a line a chunk instead of whole), E4M3 slower in L2
     * (31.5 -> 34.2): they keep rows_dot (Zen 4, docs/benchmarks.md). */
    if ((m == 1 && t == MK_I8) || m == 2 || m == 4 || m == 8)
        j = qk_rows_blocks(q, ldq, m, k, t, ldk, k_rows, ks, ks_ld, n, d, s,
                           lds, ahead);
    for (; j < n; j++) {
        const char *row = mk_decode_row(k, ldk, k_rows, es, j);
        const float sc = mk_dtype_scaled(t) ? ks[j * ks_ld] : 1.0f;
        if (j + ahead < n)
            prefetch_row(mk_decode_row(k, ldk, k_rows, es, j + ahead),
                         row_bytes);
        rows_dot(q, ldq, m, row, t, sc, d, s + j, lds);
    }
}

void MK_AVX512_DECODE_NAME(decode_qk)(const float *q, ptrdiff_t ldq, int64_t m,
                         const void *k, mk_dtype kt, ptrdiff_t ldk,
                         const void *const *k_rows, const float *ks,
                         ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                         ptrdiff_t lds, const mk_heads *heads)
{
    assert(m >= 0 && n >= 0 && d >= 0);
    assert(heads ? heads->group > 0 &&
                       heads->group <= MK_DECODE_ROWS
                 : m <= MK_DECODE_WIDE_ROWS);
    assert(!mk_dtype_scaled(kt) == !ks && ks_ld >= 0);
    if (!heads && m > MK_DECODE_ROWS) { /* every dtype, fp32 too */
        if (d > WIDE_D) { /* each half of the rows as 8 or fewer */
            MK_AVX512_DECODE_NAME(decode_qk)(q, ldq, MK_DECODE_ROWS, k, kt,
                                             ldk, k_rows, ks, ks_ld, n, d, s,
                                             lds, NULL);
            MK_AVX512_DECODE_NAME(decode_qk)(
                q + MK_DECODE_ROWS * ldq, ldq, m - MK_DECODE_ROWS, k, kt, ldk,
                k_rows, ks, ks_ld, n, d, s + MK_DECODE_ROWS * lds, lds, NULL);
            return;
        }
        wide_qk(q, ldq, m, k, kt, ldk, k_rows, ks, ks_ld, n, d, s, lds);
        return;
    }
    /* fp32 is avx2's (see the file comment). */
#define DECODE_QK(T)                                                      \
    decode_qk(q, ldq, m, k, T, ldk, k_rows, ks, ks_ld, n, d, s, lds, heads)
    switch (kt) {
    case MK_I8: DECODE_QK(MK_I8); break;
    case MK_FP8_E4M3: DECODE_QK(MK_FP8_E4M3); break;
    case MK_FP8_E5M2: DECODE_QK(MK_FP8_E5M2); break;
    case MK_F16: DECODE_QK(MK_F16); break;
    case MK_BF16: DECODE_QK(MK_BF16); break;
    case MK_F32:
    case MK_DTYPE_COUNT:
        mk_avx2_decode_qk(q, ldq, m, k, kt, ldk, k_rows, ks, ks_ld, n, d, s,
                          lds, heads);
        break;
    }
#undef DECODE_QK
}

/* Keys per step of decode_pv: their rows (and prefetches) are issued
 * together, and each 16-column chunk of them is widened once for every
 * query row. */
enum { KEYS = 8 };

/* o rows i < m, columns [c, c + 16) (lanes of k when not full) += the
 * probabilities pk[i][jj] times the widened chunks vj[jj], jj < nj. */
INLINE void pv_chunk(int64_t m, int64_t nj, const float pk[][KEYS],
                     const __m512 *vj, float *o, ptrdiff_t ldo, int64_t c,
                     int full, __mmask16 k)
{
    for (int64_t i = 0; i < m; i++) {
        float *oi = o + i * ldo + c;
        __m512 acc = full ? _mm512_loadu_ps(oi) : _mm512_maskz_loadu_ps(k, oi);
        for (int64_t jj = 0; jj < nj; jj++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(pk[i][jj]), vj[jj], acc);
        if (full)
            _mm512_storeu_ps(oi, acc);
        else
            _mm512_mask_storeu_ps(oi, k, acc);
    }
}

/* One row's output columns [c, c + 16 C) (C = 4 or 8 chunks) += pk[jj]
 * times value rows rows[jj], jj < nj: the C chunks in registers across
 * the keys, each key's widened once (E4M3 64 codes per lookup), each
 * element's FMAs in key order as pv_chunk's. Chunk by chunk, one row's
 * output is one chain of FMAs a chunk and a step: [B, H, L, D] P.V of
 * one query row took 25-26 cycles a key in L2 (fp16, int8; fp8 through
 * 16-code lookups 40.5) for its 8 FMAs (Zen 4, docs/benchmarks.md). */
INLINE void pv_row_chunks(const int C, int64_t nj, const char *const *rows,
                          mk_dtype t, const float *pk, float *o, int64_t c)
{
    __m512 acc[8];
    for (int x = 0; x < C; x++)
        acc[x] = _mm512_loadu_ps(o + c + 16 * x);
    for (int64_t jj = 0; jj < nj; jj++) {
        __m512 v[8];
#ifdef MK_AVX512_VBMI
        if (t == MK_FP8_E4M3)
            for (int x = 0; x < C; x += 4)
                e4m3_to_f32x4(_mm512_loadu_si512(rows[jj] + c + 16 * x),
                              v + x);
        else
#endif
            for (int x = 0; x < C; x++)
                v[x] = load16(rows[jj], t, c + 16 * x, 1, 0);
        const __m512 b = _mm512_set1_ps(pk[jj]);
        for (int x = 0; x < C; x++)
            acc[x] = _mm512_fmadd_ps(b, v[x], acc[x]);
    }
    for (int x = 0; x < C; x++)
        _mm512_storeu_ps(o + c + 16 * x, acc[x]);
}

/* o rows i < m += pk[i][jj] times value rows rows[jj], jj < nj, chunk by
 * chunk (each chunk widened once for every row); called with a constant
 * nj for a whole step, so the keys' loop is unrolled. */
INLINE void pv_step(const int64_t nj, int64_t m, const char *const *rows,
                    mk_dtype t, const float pk[][KEYS], int64_t dv, float *o,
                    ptrdiff_t ldo)
{
    const int64_t full = dv / 16 * 16;
    const __mmask16 tail = lanes(dv - full);
    __m512 vj[KEYS];
    int64_t c = 0;
    /* One query row per kv head: 128 columns at a time, E4M3 64 (its two
     * lookups' 128 took 28.0 cycles a key in L2 against 25.0). */
    if (m == 1) {
        for (; t != MK_FP8_E4M3 && c + 128 <= full; c += 128)
            pv_row_chunks(8, nj, rows, t, pk[0], o, c);
        for (; c + 64 <= full; c += 64)
            pv_row_chunks(4, nj, rows, t, pk[0], o, c);
    }
    for (; c < full; c += 16) {
        for (int64_t jj = 0; jj < nj; jj++)
            vj[jj] = load16(rows[jj], t, c, 1, 0);
        pv_chunk(m, nj, pk, vj, o, ldo, c, 1, 0);
    }
    if (tail) {
        for (int64_t jj = 0; jj < nj; jj++)
            vj[jj] = load16(rows[jj], t, full, 0, tail);
        pv_chunk(m, nj, pk, vj, o, ldo, full, 0,
                 tail);
    }
}

/* The fewest rows of one kv head (no mk_heads) decode_pv takes through
 * the wide P.V's passes (pv_wide), with 8 rows' registers up to 8: from 6
 * rows their 6-8 chains of FMAs per chunk beat the 8-row kernel, which
 * loads and stores the outputs every step of keys (in L2, cycles a key:
 * 6 rows 92 -> 80, 7 rows 104 -> 77, 8 rows 125 -> 77-90); with 2-5 rows
 * the chains are too few (53-79 -> 75-81; avx512bf16, Zen 4,
 * docs/benchmarks.md). The same operations per element either way. */
enum { SEG_ROWS = MK_AVX512_SEG_ROWS };

/* Keys of one pass of the wide P.V: a 16-column chunk of every row stays
 * in registers across all of them, so the rows' outputs are loaded and
 * stored once per WIDE_SEG keys. Once per step of WIDE_KEYS, that was
 * 177 cycles a key in L2 against the FMAs' 128; 64 keys take 142 (32:
 * 147, 128: 143; avx512bf16, Zen 4, docs/benchmarks.md). */
enum { WIDE_SEG = 64 };

/* Rows h .. h + 7 of a pass of the wide P.V (m > h; zeros past row m in
 * pk), columns [c, c + 32): both 16-column chunks of the eight rows stay
 * in registers across the keys, so each probability, broadcast once,
 * takes two FMAs: 10 loads for 16 FMAs, where a chunk at a time for every
 * row takes a broadcast load per FMA (17 for 16). fetch: this pass
 * fetches the pair's bytes of the row `ahead` keys on (the first of a
 * pair's row halves). One FMA per key and element, in key order. */
INLINE void pv_wide_pair(int64_t h, int64_t m, const void *v, ptrdiff_t ldv,
                         const void *const *tab, mk_dtype t, int64_t j0,
                         int64_t nk, int64_t n, const float *pk, int64_t c,
                         int64_t ahead, int fetch, float *o, ptrdiff_t ldo)
{
    const size_t es = mk_dtype_size(t);
    /* Broadcast from pk at each key, as pv_wide_seg's. */
    const float *pc = pk + h * WIDE_SEG;
    __asm__("" : "+r"(pc));
    __m512 acc[8][2];
    for (int i = 0; i < 8; i++) {
        const int live = h + i < m;
        const float *oi = o + (h + i) * ldo + c;
        acc[i][0] = live ? _mm512_loadu_ps(oi) : _mm512_setzero_ps();
        acc[i][1] = live ? _mm512_loadu_ps(oi + 16) : _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < nk; k++) {
        const char *row = mk_decode_row(v, ldv, tab, es, j0 + k);
        if (fetch && j0 + k + ahead < n)
            mk_fetch_step(mk_decode_row(v, ldv, tab, es, j0 + k + ahead),
                          (size_t)c * es, 32 * es);
        const __m512 x0 = load16(row, t, c, 1, 0),
                     x1 = load16(row, t, c + 16, 1, 0);
        for (int i = 0; i < 8; i++) {
            const __m512 pb = _mm512_set1_ps(pc[i * WIDE_SEG + k]);
            acc[i][0] = _mm512_fmadd_ps(pb, x0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(pb, x1, acc[i][1]);
        }
    }
    for (int i = 0; i < 8 && h + i < m; i++) {
        _mm512_storeu_ps(o + (h + i) * ldo + c, acc[i][0]);
        _mm512_storeu_ps(o + (h + i) * ldo + c + 16, acc[i][1]);
    }
}

/* decode_pv's sum for m <= R rows of one kv head (R = 8 or 16 rows'
 * registers; alpha applied), keys j0 .. j0 + nk - 1 (nk <= WIDE_SEG), the
 * probabilities row-major in pk (a row every WIDE_SEG floats; zeros past row
 * m). Whole pairs of 16-column chunks go eight rows at a time (pv_wide_pair)
 * where that widens no chunk twice: with 8 rows' registers, and for fp32,
 * which has nothing to widen (16 rows' registers take two passes, each
 * loading the key's pair). 1 thread, Zen 5, against a chunk at a time:
 * [B, H, L, D] 1.08-1.16x for 7 and 8 rows a kv head (fp32, f16, bf16), fp32
 * with 16 rows [B, H, L, D] 1.05x and [B, L, H, D] 1.16x; 16-bit rows of 16
 * read 0.92-0.96x in two passes, widened twice, so they keep the pass chunk
 * by chunk (docs/benchmarks.md). That pass (and a dv short of a pair): every
 * row's chunk in registers, each key's chunk loaded once for all of them.
 * Each pass fetches its own bytes of the row wide_ahead keys on, so the
 * fetches spread over all passes: fetched whole in the first pass, they came
 * as a burst the core's outstanding misses could not take, and from DRAM the
 * step read 0.94x the per-step kernel; spread, 1.22x (docs/benchmarks.md).
 * An element takes the operations it takes with fewer rows: one FMA per key
 * in key order. */
INLINE void pv_wide_seg(const int R, int64_t m, const void *v, ptrdiff_t ldv,
                        const void *const *tab, mk_dtype t, int64_t j0,
                        int64_t nk, int64_t n, const float *pk, int64_t dv,
                        float *o, ptrdiff_t ldo)
{
    const size_t es = mk_dtype_size(t), row_bytes = (size_t)dv * es;
    const int64_t ahead = wide_ahead(row_bytes);
    int64_t c = 0;
    for (; (R == 8 || t == MK_F32) && c + 32 <= dv; c += 32)
        for (int64_t h = 0; h < R && h < m; h += 8)
            pv_wide_pair(h, m, v, ldv, tab, t, j0, nk, n, pk, c, ahead,
                         h == 0, o, ldo);
    for (; c < dv; c += 16) {
        const int whole = c + 16 <= dv;
        const __mmask16 msk = lanes(dv - c);
        /* Broadcast from pk at each key: hoisted, gcc kept the
         * broadcast vectors on the stack instead. */
        const float *pc = pk;
        __asm__("" : "+r"(pc));
        __m512 acc[16];
        for (int i = 0; i < R; i++)
            acc[i] = i >= m    ? _mm512_setzero_ps()
                     : whole ? _mm512_loadu_ps(o + i * ldo + c)
                             : _mm512_maskz_loadu_ps(msk, o + i * ldo + c);
        for (int64_t k = 0; k < nk; k++) {
            const char *row = mk_decode_row(v, ldv, tab, es, j0 + k);
            if (j0 + k + ahead < n)
                mk_fetch_step(mk_decode_row(v, ldv, tab, es, j0 + k + ahead),
                              (size_t)c * es, 16 * es);
            const __m512 xv = load16(row, t, c, whole, msk);
            for (int i = 0; i < R; i++)
                acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(pc[i * WIDE_SEG + k]),
                                         xv, acc[i]);
        }
        for (int i = 0; i < R && i < m; i++) {
            if (whole)
                _mm512_storeu_ps(o + i * ldo + c, acc[i]);
            else
                _mm512_mask_storeu_ps(o + i * ldo + c, msk, acc[i]);
        }
    }
}

/* decode_pv's sum for m <= R rows of one kv head, WIDE_SEG keys at a
 * time through pv_wide_seg. */
INLINE void pv_wide(const int R, const float *p, ptrdiff_t ldp, int64_t m,
                    int64_t n, const void *v, mk_dtype t, ptrdiff_t ldv,
                    const void *const *v_rows, const float *vs,
                    ptrdiff_t vs_ld, int64_t dv, float *o, ptrdiff_t ldo)
{
    for (int64_t j0 = 0; j0 < n; j0 += WIDE_SEG) {
        const int64_t nk = n - j0 < WIDE_SEG ? n - j0 : WIDE_SEG;
        /* The keys' probabilities by row (zeros past row m and key nk); a
         * scaled row's takes its scale (and the code factor), as
         * decode_pv's. */
        _Alignas(64) float pk[16 * WIDE_SEG];
        for (int64_t k0 = 0; k0 < WIDE_SEG; k0 += 16) {
            const __mmask16 kk = lanes(nk - k0);
            __m512 f = _mm512_set1_ps(1.0f);
            if (mk_dtype_scaled(t)) {
                _Alignas(64) float sv[16] = {0};
                for (int64_t jj = k0; jj < nk && jj < k0 + 16; jj++)
                    sv[jj - k0] = vs[(j0 + jj) * vs_ld];
                f = _mm512_load_ps(sv);
            }
            for (int64_t i = 0; i < R; i++) {
                __m512 x = _mm512_setzero_ps();
                if (i < m && k0 < nk)
                    x = _mm512_maskz_loadu_ps(kk, p + i * ldp + j0 + k0);
                if (mk_dtype_scaled(t))
                    x = _mm512_mul_ps(_mm512_mul_ps(x, f),
                                      _mm512_set1_ps(code_factor(t)));
                _mm512_store_ps(pk + i * WIDE_SEG + k0, x);
            }
        }
        pv_wide_seg(R, m, v, ldv, v_rows, t, j0, nk, n, pk, dv, o, ldo);
    }
}

/* o rows i < m *= alpha[i] (nothing when alpha is NULL). */
INLINE void rescale_rows(const float *alpha, int64_t m, int64_t dv, float *o,
                         ptrdiff_t ldo)
{
    const int64_t full = dv / 16 * 16;
    const __mmask16 tail = lanes(dv - full);
    for (int64_t i = 0; alpha && i < m; i++) {
        float *oi = o + i * ldo;
        __m512 a = _mm512_set1_ps(alpha[i]);
        for (int64_t c = 0; c < full; c += 16)
            _mm512_storeu_ps(oi + c, _mm512_mul_ps(a, _mm512_loadu_ps(oi + c)));
        if (tail)
            _mm512_mask_storeu_ps(
                oi + full, tail,
                _mm512_mul_ps(a, _mm512_maskz_loadu_ps(tail, oi + full)));
    }
}

/* The wide P.V, out of line as wide_qk. */
static __attribute__((noinline)) void
wide_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n, const void *v,
        mk_dtype vt, ptrdiff_t ldv, const void *const *v_rows,
        const float *vs, ptrdiff_t vs_ld, int64_t dv, const float *alpha,
        float *o, ptrdiff_t ldo)
{
    rescale_rows(alpha, m, dv, o, ldo);
#define PV_WIDE8(T)                                                       \
    pv_wide(8, p, ldp, m, n, v, T, ldv, v_rows, vs, vs_ld, dv, o, ldo)
#define PV_WIDE16(T)                                                      \
    pv_wide(16, p, ldp, m, n, v, T, ldv, v_rows, vs, vs_ld, dv, o, ldo)
    if (m <= 8) {
        MK_FOR_DTYPE(vt, PV_WIDE8);
    } else {
        MK_FOR_DTYPE(vt, PV_WIDE16);
    }
#undef PV_WIDE8
#undef PV_WIDE16
}

INLINE void decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                      const void *v, mk_dtype t, ptrdiff_t ldv,
                      const void *const *v_rows, const float *vs,
                      ptrdiff_t vs_ld, int64_t dv, const float *alpha,
                      float *o, ptrdiff_t ldo, const mk_heads *h)
{
    const size_t es = mk_dtype_size(t), row_bytes = (size_t)dv * es;
    rescale_rows(alpha, m, dv, o, ldo);
    if (h) {
        decode_pv_across(p, ldp, m, n, v, t, ldv, v_rows, vs, vs_ld, dv, o, ldo,
                         h);
        return;
    }
    const int64_t ahead = mk_ahead_rows(row_bytes);
    const int64_t step = mk_step_keys(row_bytes, KEYS);
    for (int64_t j0 = 0; j0 < n; j0 += step) {
        const int64_t nj = n - j0 < step ? n - j0 : step;
        const char *rows[KEYS];
        for (int64_t jj = 0; jj < nj; jj++)
            rows[jj] = mk_decode_row(v, ldv, v_rows, es, j0 + jj);
        for (int64_t jj = ahead; jj < ahead + nj && j0 + jj < n; jj++)
            prefetch_row(mk_decode_row(v, ldv, v_rows, es, j0 + jj),
                         row_bytes);
        /* A scaled row's probability takes its scale (and the code
         * factor, exact): one multiply per key, not per element. */
        float pk[MK_DECODE_ROWS][KEYS];
        for (int64_t i = 0; i < m; i++)
            for (int64_t jj = 0; jj < nj; jj++)
                pk[i][jj] = mk_dtype_scaled(t)
                                ? p[i * ldp + j0 + jj] *
                                      vs[(j0 + jj) * vs_ld] * code_factor(t)
                                : p[i * ldp + j0 + jj];
        if (nj == KEYS)
            pv_step(KEYS, m, rows, t, (const float(*)[KEYS])pk, dv, o, ldo);
        else if (nj == KEYS / 2)
            pv_step(KEYS / 2, m, rows, t, (const float(*)[KEYS])pk, dv, o,
                    ldo);
        else
            pv_step(nj, m, rows, t, (const float(*)[KEYS])pk, dv, o, ldo);
    }
}

void MK_AVX512_DECODE_NAME(decode_pv)(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                         const void *v, mk_dtype vt, ptrdiff_t ldv,
                         const void *const *v_rows, const float *vs,
                         ptrdiff_t vs_ld, int64_t dv, const float *alpha,
                         float *o, ptrdiff_t ldo, const mk_heads *heads)
{
    assert(m >= 0 && n >= 0 && dv >= 0);
    assert(heads ? heads->group > 0 &&
                       heads->group <= MK_DECODE_ROWS
                 : m <= MK_DECODE_WIDE_ROWS);
    assert(!mk_dtype_scaled(vt) == !vs && vs_ld >= 0);
    /* As for decode_qk. */
#define DECODE_PV(T)                                                      \
    decode_pv(p, ldp, m, n, v, T, ldv, v_rows, vs, vs_ld, dv, alpha, o, ldo, \
              heads)
    if (!heads && m >= SEG_ROWS) { /* every dtype */
        wide_pv(p, ldp, m, n, v, vt, ldv, v_rows, vs, vs_ld, dv, alpha, o,
                ldo);
        return;
    }
    switch (vt) {
    case MK_I8: DECODE_PV(MK_I8); break;
    case MK_FP8_E4M3: DECODE_PV(MK_FP8_E4M3); break;
    case MK_FP8_E5M2: DECODE_PV(MK_FP8_E5M2); break;
    case MK_F16: DECODE_PV(MK_F16); break;
    case MK_BF16: DECODE_PV(MK_BF16); break;
    case MK_F32:
        /* Across kv heads, groups of SEG_ROWS rows or more take this
         * file's P.V (pv_blocks: a head's output chunks in registers over
         * MK_PV_BLOCK keys) instead of avx2's pairs of keys: group 8 from
         * [B, L, H, D] read 1.11x (1.16x from L3); group 4 read 0.7-0.8x,
         * so it stays on avx2's (docs/benchmarks.md). The engine no longer
         * spans fp32 groups of SEG_ROWS or more (head_rows_f32): one kv
         * head a block, wide_pv's registers over 64 keys read faster. */
        if (heads && heads->group >= SEG_ROWS) {
            DECODE_PV(MK_F32);
            break;
        }
        /* fall through */
    case MK_DTYPE_COUNT:
        mk_avx2_decode_pv(p, ldp, m, n, v, vt, ldv, v_rows, vs, vs_ld, dv,
                          alpha, o, ldo, heads);
        break;
    }
#undef DECODE_PV
}
