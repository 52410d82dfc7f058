/* Widening half-precision keys and values to fp32, 16 values per zmm:
 * binary16 with VCVTPH2PS (exact, denormals included, NaN stays NaN),
 * bfloat16 as a 16-bit shift; and narrowing a half compute call's fp32
 * output rows back (VCVTPS2PH, and bfloat16's rounding on the bits). The
 * tail is one masked load and store, so nothing past n is read or
 * written. */
#include <assert.h>
#include <immintrin.h>

#include "avx512.h"
#include "tile.h"

/* y[0..n) from x[0..n) through widen16, which maps 16 uint16 to 16
 * floats. */
static inline __attribute__((always_inline)) void
widen(const uint16_t *x, int64_t n, float *y, __m512 (*widen16)(__m256i))
{
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 lanes = mk_avx512_first(n - i);
        _mm512_mask_storeu_ps(y + i, lanes,
                              widen16(_mm256_maskz_loadu_epi16(lanes, x + i)));
    }
}

static inline __m512 f16_to_f32_16(__m256i h) { return _mm512_cvtph_ps(h); }

static inline __m512 bf16_to_f32_16(__m256i h)
{
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* y[i] = x[i] widened, i < n (binary16 and bfloat16). */
MK_DEFINE_WIDEN(avx512, widen, f16_to_f32_16, bf16_to_f32_16)

/* y[0..n) from x[0..n) times scale through narrow16, which maps 16
 * floats to 16 codes. */
static inline __attribute__((always_inline)) void
narrow(const float *x, int64_t n, float scale, uint16_t *y,
       __m256i (*narrow16)(__m512))
{
    const __m512 s = _mm512_set1_ps(scale);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 lanes = mk_avx512_first(n - i);
        _mm256_mask_storeu_epi16(
            y + i, lanes,
            narrow16(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, x + i), s)));
    }
}

/* VCVTPS2PH rounding to nearest even: IEEE binary16 with its subnormals,
 * overflow to infinity, a NaN quiet with its sign and top payload bits,
 * as engine/dtype.c's to_f16. */
static inline __m256i f32_to_f16_16(__m512 x)
{
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* engine/dtype.c's to_bf16 on 16 lanes: the bits plus 0x7fff plus the
 * kept lowest bit, shifted down (nearest even; VCVTNEPS2BF16 would flush
 * subnormal inputs, which the engine's rounding keeps), and a NaN the top
 * half with the quiet bit set. */
static inline __m256i f32_to_bf16_16(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(
        _mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
        _mm512_and_si512(hi, _mm512_set1_epi32(1)));
    r = _mm512_srli_epi32(r, 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                              _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

/* y[i] = x[i] narrowed, i < n (binary16 and bfloat16). */
MK_DEFINE_NARROW(avx512, narrow, f32_to_f16_16, f32_to_bf16_16)
