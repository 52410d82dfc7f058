/* The online-softmax step and the normalisation on AVX2+FMA: the driver of
 * softmax_driver.h over 8-lane ymm primitives, exp from SLEEF
 * (Sleef_expf8_u10avx2, 1.0 ULP, exp(-inf) = 0 exactly). */
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
#define mk_v_exp Sleef_expf8_u10avx2
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
