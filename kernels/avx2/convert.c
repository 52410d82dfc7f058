/* Widening half-precision keys and values to fp32, 8 values per ymm:
 * binary16 with F16C's VCVTPH2PS (exact, denormals included, NaN stays
 * NaN), bfloat16 as a 16-bit shift; and narrowing a half compute call's
 * fp32 output rows back (VCVTPS2PH, and bfloat16's rounding on the
 * bits). Tails go through a zero-padded stack copy, so nothing past n is
 * read or written. */
#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "avx2.h"

/* y[0..n) from x[0..n) through widen8, which maps 8 uint16 to 8 floats. */
static inline __attribute__((always_inline)) void
widen(const uint16_t *x, int64_t n, float *y, __m256 (*widen8)(__m128i))
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         widen8(_mm_loadu_si128((const __m128i *)(x + i))));
    if (i < n) {
        uint16_t in[8] = {0};
        float out[8];
        memcpy(in, x + i, (size_t)(n - i) * sizeof *x);
        _mm256_storeu_ps(out, widen8(_mm_loadu_si128((const __m128i *)in)));
        memcpy(y + i, out, (size_t)(n - i) * sizeof *y);
    }
}

static inline __m256 f16_to_f32_8(__m128i h) { return _mm256_cvtph_ps(h); }

static inline __m256 bf16_to_f32_8(__m128i h)
{
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* y[i] = x[i] widened, i < n (binary16 and bfloat16). */
MK_DEFINE_WIDEN(avx2, widen, f16_to_f32_8, bf16_to_f32_8)

/* y[0..n) from x[0..n) times scale through narrow8, which maps 8 floats
 * to 8 codes. */
static inline __attribute__((always_inline)) void
narrow(const float *x, int64_t n, float scale, uint16_t *y,
       __m128i (*narrow8)(__m256))
{
    const __m256 s = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         narrow8(_mm256_mul_ps(_mm256_loadu_ps(x + i), s)));
    if (i < n) {
        float in[8] = {0};
        uint16_t out[8];
        memcpy(in, x + i, (size_t)(n - i) * sizeof *x);
        _mm_storeu_si128((__m128i *)out,
                         narrow8(_mm256_mul_ps(_mm256_loadu_ps(in), s)));
        memcpy(y + i, out, (size_t)(n - i) * sizeof *y);
    }
}

/* F16C's VCVTPS2PH rounding to nearest even: IEEE binary16 with its
 * subnormals, overflow to infinity, a NaN quiet with its sign and top
 * payload bits, as engine/dtype.c's to_f16. */
static inline __m128i f32_to_f16_8(__m256 x)
{
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* engine/dtype.c's to_bf16 on 8 lanes: the bits plus 0x7fff plus the kept
 * lowest bit, shifted down (nearest even), a NaN the top half with the
 * quiet bit set; the 8 results (each below 2^16) packed to words. */
static inline __m128i f32_to_bf16_8(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_add_epi32(
        _mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
        _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    r = _mm256_srli_epi32(r, 16);
    r = _mm256_blendv_epi8(
        r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)),
        _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    return _mm_packus_epi32(_mm256_castsi256_si128(r),
                            _mm256_extracti128_si256(r, 1));
}

/* y[i] = x[i] narrowed, i < n (binary16 and bfloat16). */
MK_DEFINE_NARROW(avx2, narrow, f32_to_f16_8, f32_to_bf16_8)
