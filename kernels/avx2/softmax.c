/* The online-softmax step and the normalisation on AVX2+FMA: the driver of
 * softmax_driver.h over 8-lane ymm primitives, exp inline (below). */
#include <immintrin.h>
#include <string.h>

#include "avx2.h"
#include "exp2_poly.h"

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
MK_INLINE MK_VM mk_v_abs_lt(MK_V x, MK_V s)
{
    const __m256 abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    return _mm256_castps_si256(_mm256_cmp_ps(abs, s, _CMP_LT_OQ));
}
#define mk_v_add _mm256_add_ps
#define mk_v_sub _mm256_sub_ps
#define mk_v_mul _mm256_mul_ps
#define mk_v_fma _mm256_fmadd_ps
/* MAXPS returns its second operand when either is NaN. */
#define mk_v_max _mm256_max_ps
/* The exps round t to the nearest integer n by adding MK_AVX2_EXP_MAGIC,
 * 1.5 2^23 - MK_AVX2_EXP_ZERO: for t in the exps' range (clamped at
 * MK_AVX2_EXP_ZERO, at most 2^-20) the sum r is an integer of unit ulp,
 * n = r - MAGIC exactly, and r's low mantissa bits hold n -
 * MK_AVX2_EXP_ZERO (times_pow2 reads them). Against VROUNDPS, VCVTPS2DQ
 * and an integer add (4 uops on Intel, where VROUNDPS is 2, three of them
 * on the two FMA ports) an add and a subtract, which Intel's fast adders
 * on a third port take too: the avx2 softmax step over 96 x 512 scores
 * ran 1.19x faster on Intel (docs/benchmarks.md). The sum rounds ties to
 * the even r, so to the odd n (the magic is odd): where t is exactly an
 * odd multiple of 1/2, f = t - n is 1/2 where VROUNDPS gave -1/2, both in
 * the polynomials' range, and P comes out an ulp from what it was (5 of
 * 7.8M values in a random test); every other t gives the same n as
 * before, so the same bits. It rounds in MXCSR's mode, as all the
 * library's arithmetic does. */
#define MK_AVX2_EXP_ZERO (-65)
#define MK_AVX2_EXP_SHIFT 62 /* 127 + MK_AVX2_EXP_ZERO */
#define MK_AVX2_EXP_MAGIC (0x1.8p23f - (float)MK_AVX2_EXP_ZERO)
/* mk_v_exp's clamp, ln 2^(MK_AVX2_EXP_ZERO + 1/4) (about -44.88): x L
 * there rounds to n = MK_AVX2_EXP_ZERO, which builds +0, and it lies
 * below the floor (MK_EXP_FLOOR_LN, about -44.708), whose results are 0
 * anyway. */
#define MK_AVX2_EXP_CLAMP                                                 \
    ((float)((MK_AVX2_EXP_ZERO + 0.25) * 0.69314718055994531))
_Static_assert(2 * MK_AVX2_EXP_ZERO + 1 == MK_EXP_FLOOR_HALVES,
               "rounded to nearest, t from 2^-64.5 down makes n = -65");
/* The exps' 2^n, n integral in [MK_AVX2_EXP_ZERO, 0] (or NaN), from r = t
 * + MK_AVX2_EXP_MAGIC as the float bits (n - MK_AVX2_EXP_ZERO) << 23 (the
 * shift drops r's exponent and upper mantissa): 2^(n -
 * MK_AVX2_EXP_SHIFT), so n = MK_AVX2_EXP_ZERO gives +0, the floor of
 * kernels.h (MK_EXP_FLOOR_LOG2: a result from 2^-64.5 down is 0, never a
 * subnormal on the way; the exps clamp their argument so that n >=
 * MK_AVX2_EXP_ZERO). The exps' polynomials carry the factor
 * 2^MK_AVX2_EXP_SHIFT in their coefficients (exact), so p 2^n comes out
 * with the bits of the plain product. A NaN t makes the polynomial NaN (f
 * = t - n), whatever bits r gives: NaN stays NaN. */
/* r = t + MK_AVX2_EXP_MAGIC (for times_pow2), and *n = r - MAGIC = t
 * rounded to an integer (see above). */
MK_INLINE MK_V round_magic(MK_V t, MK_V *n)
{
    MK_V r = _mm256_add_ps(t, _mm256_set1_ps(MK_AVX2_EXP_MAGIC));
    *n = _mm256_sub_ps(r, _mm256_set1_ps(MK_AVX2_EXP_MAGIC));
    return r;
}
MK_INLINE MK_V times_pow2(MK_V p, MK_V r)
{
    __m256i e = _mm256_castps_si256(r);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
}
/* Coefficient c of an exp's polynomial, times 2^MK_AVX2_EXP_SHIFT. */
#define MK_AVX2_EXP_C(c) ((c) * 0x1p62f)
_Static_assert(MK_AVX2_EXP_SHIFT == 62, "MK_AVX2_EXP_C's factor");
#define MK_CE(c) _mm256_set1_ps(MK_AVX2_EXP_C(c))
/* exp for x <= 0 (the rescale factors, and the rows sm_exp2_args of
 * softmax_driver.h leaves to sm_exp), inline: a call per 8 scores to
 * SLEEF's 1-ulp exp was a tenth of prefill's instructions at d = 64 and
 * forced the sum into a pass of its own (docs/benchmarks.md, "Where
 * 1-thread AVX2 prefill goes"). As 2^t, t = x log2(e) = n + f, n rounded
 * to nearest, |f| <= 1/2 from one FMA (x L - n) plus x L_lo (L_lo =
 * log2(e) - L); 2^f by kernels/exp2_poly.h's degree 6 (2^0 exactly 1,
 * about 1 ulp), times 2^n (times_pow2). x is clamped at MK_AVX2_EXP_CLAMP
 * first, where n = MK_AVX2_EXP_ZERO builds +0: from 2^-64.5 (x about
 * -44.7) down the result is 0, the floor of kernels.h, and -inf gives 0,
 * without a compare. MAXPS
 * returns its second operand when either is NaN, so a NaN x passes the
 * clamp: NaN stays NaN. */
MK_INLINE MK_V mk_v_exp(MK_V x)
{
    MK_V xc = _mm256_max_ps(_mm256_set1_ps(MK_AVX2_EXP_CLAMP), x);
    MK_V n,
        r = round_magic(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504f)), &n);
    MK_V f = _mm256_fmsub_ps(xc, _mm256_set1_ps(1.44269504f), n);
    f = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.925963034e-08f), f);
    return times_pow2(MK_EXP2_DEG6(_mm256_fmadd_ps, MK_CE, f), r);
}
#define MK_V_EXP2_GROUP 4
/* k 2^t for t <= 2^-20 (sm_exp2 of softmax_driver.h: the exp pass in
 * base 2, its argument out of one FMA, k a correction near 1): mk_v_exp's
 * steps without the multiply by log2(e) and its correction, f = t - n
 * exact, MK_EXP2_DEG5's coefficients times k (hoisted out of the caller's
 * loop: k is the same across it). t is clamped at MK_AVX2_EXP_ZERO, as
 * mk_v_exp's x at MK_AVX2_EXP_CLAMP: -inf gives 0, NaN stays NaN. 12
 * instructions a vector: with the argument's FMA and the sum, 14 a score
 * vector against sm_exp's 18.
 *
 * For n vectors t[0..n) in place (n a constant), one step at a time
 * across them: lane for lane the same operations in the same order for
 * any n, so the same bits. An exp is a dependent chain of some 30 cycles;
 * one vector at a time the next instructions in the window mostly wait
 * on it, across four on other vectors' steps. On Zen 3 the softmax step
 * of a 96 x 512 block ran 1.02x with four when the host was quiet and
 * 1.13-1.22x when it was loaded (when the one-vector order slows by a
 * third while FMA loops do not); prefill 1.00-1.025x
 * (docs/benchmarks.md). */
MK_INLINE void exp2k_each(MK_V *t, const int n, MK_V k)
{
    static const float c[] = {MK_EXP2_DEG5_COEFFS};
    MK_V r[MK_V_EXP2_GROUP], m[MK_V_EXP2_GROUP], p[MK_V_EXP2_GROUP];
#define MK_EACH(g) for (int g = 0; g < n; g++)
    MK_EACH(g) t[g] =
        _mm256_max_ps(_mm256_set1_ps((float)MK_AVX2_EXP_ZERO), t[g]);
    MK_EACH(g) r[g] = round_magic(t[g], &m[g]);
    MK_EACH(g) t[g] = _mm256_sub_ps(t[g], m[g]);
    MK_EACH(g) p[g] = _mm256_mul_ps(_mm256_set1_ps(MK_AVX2_EXP_C(c[0])), k);
    for (size_t i = 1; i < sizeof c / sizeof c[0]; i++)
        MK_EACH(g) p[g] = _mm256_fmadd_ps(
            p[g], t[g],
            _mm256_mul_ps(_mm256_set1_ps(MK_AVX2_EXP_C(c[i])), k));
    MK_EACH(g) t[g] = times_pow2(p[g], r[g]);
#undef MK_EACH
}
MK_INLINE MK_V mk_v_exp2k(MK_V t, MK_V k)
{
    exp2k_each(&t, 1, k);
    return t;
}
MK_INLINE void mk_v_exp2k_group(MK_V t[MK_V_EXP2_GROUP], MK_V k)
{
    exp2k_each(t, MK_V_EXP2_GROUP, k);
}
#undef MK_CE
#define MK_V_EXP2 1
/* The sum of P rides in the exp pass: nothing is called across it. */
#define MK_SM_FUSED_SUM 1
MK_INLINE MK_V mk_v_abs(MK_V x)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}
MK_INLINE MK_V mk_v_copysign(MK_V x, MK_V s)
{
    return _mm256_or_ps(x, _mm256_and_ps(_mm256_set1_ps(-0.0f), s));
}
#define mk_v_div _mm256_div_ps
/* Prefill output rows by non-temporal stores (normalize), as on AVX-512:
 * nothing reads them back, so reading each line for ownership first is
 * wasted (docs/design.md). _mm256_stream_ps needs 32-byte alignment; the
 * driver streams only 64-byte aligned rows of whole vectors. */
#define MK_V_STREAM 1
#define mk_v_stream _mm256_stream_ps
#define mk_v_stream_fence _mm_sfence
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
