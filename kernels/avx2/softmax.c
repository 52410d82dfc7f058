/* The online-softmax step and the normalisation on AVX2+FMA: the driver of
 * softmax_driver.h over 8-lane ymm primitives, exp inline (below), tanh
 * (the softcap) from SLEEF. */
#include <immintrin.h>
#include <sleef.h>
#include <string.h>

#include "avx2.h"

#define MK_V __m256
#define MK_VM __m256i
#define MK_W 8
#define MK_INLINE static inline __attribute__((always_inline))

MK_INLINE MK_VM mk_v_lanes(int64_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#define mk_v_set1 _mm256_set1_ps
#define mk_v_load _mm256_loadu_ps
#define mk_v_store _mm256_storeu_ps
MK_INLINE MK_V mk_v_load_n(const float *p, int64_t n)
{
    return _mm256_maskload_ps(p, mk_v_lanes(n));
}
MK_INLINE void mk_v_store_n(float *p, int64_t n, MK_V x)
{
    _mm256_maskstore_ps(p, mk_v_lanes(n), x);
}
MK_INLINE MK_VM mk_v_keep(const uint8_t *keep, int64_t n)
{
    uint64_t bytes = 0;
    memcpy(&bytes, keep, (size_t)n);
    __m256i k32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes));
    return _mm256_xor_si256(_mm256_cmpeq_epi32(k32, _mm256_setzero_si256()),
                            _mm256_set1_epi32(-1));
}
MK_INLINE MK_V mk_v_sel(MK_VM m, MK_V x, MK_V y)
{
    return _mm256_blendv_ps(y, x, _mm256_castsi256_ps(m));
}
#define mk_v_add _mm256_add_ps
#define mk_v_sub _mm256_sub_ps
#define mk_v_mul _mm256_mul_ps
#define mk_v_fma _mm256_fmadd_ps
/* MAXPS returns its second operand when either is NaN. */
#define mk_v_max _mm256_max_ps
/* exp for x <= 0 (the softmax's only arguments), inline: a call per 8
 * scores to SLEEF's 1-ulp exp was a tenth of prefill's instructions at
 * d = 64 and forced the sum into a pass of its own (docs/benchmarks.md,
 * "Where 1-thread AVX2 prefill goes"). x = n ln2 + r, |r| <= ln2 / 2, n
 * rounded to nearest; exp(r) by a degree-6 polynomial (Cephes' expf
 * coefficients, ~1 ulp on this range); 2^n added to the exponent bits.
 * Below -87.33 (2^n no longer normal) the result is 0, as a probability
 * that small is in fp32 accumulation; -inf gives 0, NaN stays NaN. */
MK_INLINE MK_V mk_v_exp(MK_V x)
{
    const MK_V lo = _mm256_set1_ps(-87.33654f);
    MK_V xc = _mm256_max_ps(x, lo); /* NaN becomes lo; restored below */
    MK_V n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    MK_V r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    MK_V p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    MK_V r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    MK_V y = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_castps_si256(p), e));
    y = _mm256_and_ps(y, _mm256_cmp_ps(x, lo, _CMP_GT_OQ)); /* tiny: 0 */
    MK_V nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return _mm256_blendv_ps(y, x, nan);
}
/* The sum of P rides in the exp pass: nothing is called across it. */
#define MK_SM_FUSED_SUM 1
#define mk_v_tanh Sleef_tanhf8_u10avx2
MK_INLINE float mk_v_hmax(MK_V x)
{
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(x),
                          _mm256_extractf128_ps(x, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
MK_INLINE float mk_v_hsum(MK_V x)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x),
                          _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

#define MK_ISA avx2
#include "softmax_driver.h"
