/* Widening half-precision keys and values to fp32, 16 values per zmm:
 * binary16 with VCVTPH2PS (exact, denormals included, NaN stays NaN),
 * bfloat16 as a 16-bit shift. The tail is one masked load and store, so
 * nothing past n is read or written. */
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
