/* The online-softmax step and the normalisation on AVX-512: the driver of
 * softmax_driver.h over 16-lane zmm primitives. Full vectors go without
 * opmasks; only a row's tail is masked (masked-off lanes are neither read
 * nor written). exp inline (below). */
#include <immintrin.h>

#include "avx512.h"
#include "exp2_poly.h"

#define MK_V __m512
#define MK_VM __mmask16
#define MK_W 16
/* The sum of P rides in the exp pass, as the AVX-512 kernel summed it
 * before the driver was shared (avx2 sums in a third pass). */
#define MK_SM_FUSED_SUM 1
#define MK_V_STREAM 1
#define MK_INLINE static inline __attribute__((always_inline))

MK_INLINE MK_VM mk_v_lanes(int64_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF
           : n <= 0 ? (__mmask16)0
                    : (__mmask16)((1u << n) - 1u);
}
#define mk_v_set1 _mm512_set1_ps
#define mk_v_load _mm512_loadu_ps
#define mk_v_store _mm512_storeu_ps
MK_INLINE MK_V mk_v_load_n(const float *p, int64_t n)
{
    return _mm512_maskz_loadu_ps(mk_v_lanes(n), p);
}
MK_INLINE void mk_v_store_n(float *p, int64_t n, MK_V x)
{
    _mm512_mask_storeu_ps(p, mk_v_lanes(n), x);
}
MK_INLINE MK_VM mk_v_keep(const uint8_t *keep, int64_t n)
{
    __m128i k8 = _mm_maskz_loadu_epi8(mk_v_lanes(n), keep);
    return _mm_test_epi8_mask(k8, k8);
}
MK_INLINE MK_V mk_v_sel(MK_VM m, MK_V x, MK_V y)
{
    return _mm512_mask_blend_ps(m, y, x);
}
MK_INLINE MK_VM mk_v_abs_lt(MK_V x, MK_V s)
{
    return _mm512_cmp_ps_mask(_mm512_abs_ps(x), s, _CMP_LT_OQ);
}
#define mk_v_add _mm512_add_ps
#define mk_v_sub _mm512_sub_ps
#define mk_v_mul _mm512_mul_ps
#define mk_v_fma _mm512_fmadd_ps
/* VMAXPS returns its second operand when either is NaN. */
#define mk_v_max _mm512_max_ps
/* The lanes of an exp to keep: those whose result 2^e (e = x log2(e) of
 * an exp of x) is not below the floor, 2^MK_EXP_FLOOR_LOG2 (kernels.h),
 * and NaN's. The exps zero the others through VSCALEFPS's zeroing mask,
 * where the other tables build 0 in the exponent bits. On Intel a
 * VSCALEFPS whose result is subnormal or underflows near that range (x
 * from about -87 to -300) takes a microcode assist, and so does a P·V FMA
 * on a subnormal P or partial sum: scores 95 below their row's maximum (a
 * bias, ALiBi over a long context, a peaked row) made a (1,8,512,512,64)
 * call 71 times slower (docs/benchmarks.md). A masked-off lane is not
 * computed, so takes no assist. One compare a vector. */
MK_INLINE __mmask16 mk_v_above_floor(MK_V e, float least)
{
    return _mm512_cmp_ps_mask(e, _mm512_set1_ps(least), _CMP_NLT_UQ);
}
/* exp for x <= 0, inline, as 2^t with t = x log2(e) = n + f, n rounded to
 * nearest and |f| <= 1/2: f = x L - n in one FMA (exact but for L's
 * rounding) plus x L_lo (L_lo = log2(e) - L), so f carries the product
 * to ~2^-24 relative; 2^f by kernels/exp2_poly.h's degree 6 (2^0 exactly
 * 1, about 1 ulp, in the bf16 table's step too: these are the rescale
 * factors); times 2^n by VSCALEFPS, the lanes whose x L is below the
 * floor zeroed (mk_v_above_floor). x is clamped at -110 first, so -inf
 * takes no inf - inf (its lane is zeroed: 0). VMAXPS returns its second
 * operand when either is NaN, so the clamp keeps a NaN, and NaN stays
 * NaN. A
 * call per 16 scores to SLEEF's exp was 8% of bf16 prefill's time and
 * 4-5% of fp32's. The softmax pass itself takes mk_v_exp2k (below); this
 * one the rescale factors and the rows sm_exp2_args leaves to sm_exp. */
MK_INLINE MK_V mk_v_exp(MK_V x)
{
    __m512 xc = _mm512_max_ps(_mm512_set1_ps(-110.0f), x);
    __m512 y = _mm512_mul_ps(xc, _mm512_set1_ps(1.44269504f));
    __m512 n = _mm512_roundscale_ps(
        y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fmsub_ps(xc, _mm512_set1_ps(1.44269504f), n);
    f = _mm512_fmadd_ps(xc, _mm512_set1_ps(1.925963034e-08f), f);
#define MK_C1(c) _mm512_set1_ps(c)
    return _mm512_maskz_scalef_ps(
        mk_v_above_floor(y, (float)MK_EXP_FLOOR_LOG2),
        MK_EXP2_DEG6(_mm512_fmadd_ps, MK_C1, f), n);
#undef MK_C1
}
/* k 2^(t - 1/2) for t <= 1/2 + 2^-20 (sm_exp2 of softmax_driver.h: the
 * exp pass in base 2, its argument out of one FMA that also adds the 1/2,
 * MK_V_EXP2_SHIFT; k a correction near 1): x = t - floor(t) in [0, 1) by
 * VREDUCEPS rounding down (exact), 2^(x - 1/2) by the polynomial
 * re-expanded in x (kernels/exp2_poly.h, the coefficients times k,
 * hoisted out of the caller's loop: k is the same across it), degree 5
 * (1.7e-7) or with MK_AVX512_EXP_BF16 (the bf16 table's step, whose P is
 * rounded to bf16, 2^-9, before it multiplies) degree 4 (2.7e-6); times
 * 2^floor(t) by VSCALEFPS, which floors t itself, the lanes whose result
 * falls below the floor (2^(t - 1/2) below 2^MK_EXP_FLOOR_LOG2) zeroed
 * (mk_v_above_floor). The floor and the polynomial's x agree, so no
 * n = t - f is formed (one instruction a vector fewer than
 * rounding to nearest). The 1/2 puts the polynomial's jump from x = 1 to
 * x = 0 where rounding to nearest had it, half an integer from the row's
 * maximum (t = 1/2 there): flooring t - 1/2 itself would jump at the
 * maximum, where two rows whose maxima differ by an ulp got P = 1 from
 * the polynomial's two ends (a layer test of one visible key caught it).
 * No clamp: VREDUCEPS gives +0 for -inf, whose lane is zeroed; a NaN
 * stays NaN. 8 instructions a vector at degree 5; with the argument's
 * FMA, 10 a score vector against sm_exp's 16. */
MK_INLINE MK_V mk_v_exp2k(MK_V t, MK_V k)
{
    __m512 x = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
#define MK_CK(c) _mm512_mul_ps(_mm512_set1_ps(c), k)
#ifdef MK_AVX512_EXP_BF16
    __m512 p = MK_EXP2_DEG4_HALF(_mm512_fmadd_ps, MK_CK, x);
#else
    __m512 p = MK_EXP2_DEG5_HALF(_mm512_fmadd_ps, MK_CK, x);
#endif
#undef MK_CK
    return _mm512_maskz_scalef_ps(
        mk_v_above_floor(t, (float)MK_EXP_FLOOR_LOG2 + 0.5f), p, t);
}
#define MK_V_EXP2_SHIFT 0.5f
/* Two vectors a group, each summed into its own accumulator: the adds'
 * latency (4 cycles) then no longer bounds a vector's 8 or 9 instructions
 * on two ports. */
#define MK_V_EXP2_GROUP 2
#define MK_SM_SUMS 2
MK_INLINE void mk_v_exp2k_group(MK_V t[2], MK_V k)
{
    t[0] = mk_v_exp2k(t[0], k);
    t[1] = mk_v_exp2k(t[1], k);
}
#define MK_V_EXP2 1
#define mk_v_abs _mm512_abs_ps
MK_INLINE MK_V mk_v_copysign(MK_V x, MK_V s)
{
    return _mm512_or_ps(x, _mm512_and_ps(_mm512_set1_ps(-0.0f), s));
}
#define mk_v_div _mm512_div_ps
#define mk_v_hmax _mm512_reduce_max_ps
#define mk_v_hsum _mm512_reduce_add_ps
#define mk_v_stream _mm512_stream_ps
#define mk_v_stream_fence _mm_sfence

/* kernels/avx512bf16/softmax.c includes this file with its own name and
 * exp (MK_AVX512_EXP_BF16). */
#ifdef MK_AVX512_SOFTMAX_ISA
#define MK_ISA MK_AVX512_SOFTMAX_ISA
#else
#define MK_ISA avx512
#endif
#include "softmax_driver.h"
