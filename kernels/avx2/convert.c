/* Widening half-precision keys and values to fp32, 8 values per ymm:
 * binary16 with F16C's VCVTPH2PS (exact, denormals included, NaN stays
 * NaN), bfloat16 as a 16-bit shift. Tails go through a zero-padded stack
 * copy, so nothing past n is read or written. */
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
