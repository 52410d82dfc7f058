/* E4M3 codes as binary16 bits, for the decode kernels of the avx2 table
 * and of the avx512 table without VBMI (F16C then widens them). Needs
 * AVX2; include from a file compiled for it. */
#ifndef MK_AVX2_E4M3_H
#define MK_AVX2_E4M3_H

#include <immintrin.h>

/* 16 E4M3 codes (sign-extended to 16 bits) as the binary16 of their value
 * times 2^-8: shifted left by 7 the exponent and mantissa land in a
 * binary16's (the exponent field's top bit cleared, the sign at bit 15),
 * whose bias is 8 more than E4M3's; binary16 subnormals are E4M3
 * subnormals at the same 2^-8, so F16C converts all of them exactly. The
 * NaN codes (S.1111.111) get the all-ones exponent. 16 codes a call: the
 * integer steps serve a whole ymm of 16-bit lanes (10 instructions per 16
 * codes with the two conversions, against 18 through xmm halves). A
 * 256-entry table would need a gather per 8 codes, slower than these few
 * integer ops. */
static inline __attribute__((always_inline)) __m256i
mk_e4m3_to_f16x16(__m256i s)
{
    __m256i h = _mm256_and_si256(_mm256_slli_epi16(s, 7),
                                 _mm256_set1_epi16(-16385));
    __m256i nan = _mm256_cmpeq_epi16(
        _mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
        _mm256_set1_epi16(0x3F80));
    return _mm256_or_si256(h,
                           _mm256_and_si256(nan, _mm256_set1_epi16(0x7C00)));
}

#endif
