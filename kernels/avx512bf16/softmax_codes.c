/* The bf16 path's softmax step handing P to P·V as bf16 codes
 * (kernels.h, softmax_update_codes): softmax.c's step, whose exp pass
 * rounds each vector of P to bf16 (VCVTNEPS2BF16, nearest even, as
 * pv_bf16's own conversion) and stores the codes in the row's first bytes.
 * pv_bf16_codes then multiplies them without a pass of its own over P
 * (2.7% of bf16 prefill's samples, docs/benchmarks.md). */
#include <immintrin.h>
#include <stdint.h>

#define MK_SM_CODES 1
#define MK_SM_CODE_ONE ((uint16_t)0x3F80) /* bf16 1.0 */

static inline __attribute__((always_inline)) void
mk_v_store_codes(uint16_t *p, __m512 x)
{
    _mm256_storeu_si256((__m256i *)(void *)p, (__m256i)_mm512_cvtneps_pbh(x));
}

static inline __attribute__((always_inline)) void
mk_v_store_codes_n(uint16_t *p, int64_t n, __m512 x)
{
    _mm256_mask_storeu_epi16(p, (__mmask16)((1u << n) - 1u),
                             (__m256i)_mm512_cvtneps_pbh(x));
}

/* Two vectors' codes at once (the exp pass's groups of two, MK_SM_CODES_
 * GROUP): VCVTNE2PS2BF16 converts both, the first into the low half, in
 * the uops VCVTNEPS2BF16 takes for one; the same rounding. */
#define MK_SM_CODES_GROUP 1
static inline __attribute__((always_inline)) void
mk_v_store_codes_group(uint16_t *p, const __m512 t[2])
{
    _mm512_storeu_si512((void *)p, (__m512i)_mm512_cvtne2ps_pbh(t[1], t[0]));
}

#define MK_AVX512_EXP_BF16 1
#define MK_AVX512_SOFTMAX_ISA avx512bf16
#include "avx512/softmax.c"
