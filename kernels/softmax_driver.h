/*
 * The online-softmax step and the final normalisation, written once over a
 * small set of vector primitives (as ggml keeps its SIMD mappings in one
 * header and PyTorch writes its flash-attention reductions once over
 * Vectorized<T>). Each ISA's softmax.c defines the primitives below, then
 * MK_ISA (its name, a bare token), then includes this header, which defines
 * mk_<isa>_softmax_update and mk_<isa>_normalize (the types of kernels.h).
 *
 * Primitives (static inline functions, or macros naming an intrinsic; n
 * counts lanes, 0 < n < MK_W for the _n forms, which read and write
 * nothing past lane n - 1):
 *   MK_V, MK_VM              the vector and lane-mask types
 *   MK_W                     lanes per vector
 *   mk_v_set1(f)             every lane f
 *   mk_v_load(p), mk_v_store(p, x)
 *   mk_v_load_n(p, n)        lanes >= n are 0
 *   mk_v_store_n(p, n, x)
 *   mk_v_lanes(n)            the mask of lanes < n
 *   mk_v_keep(keep, n)       the mask of lanes j < n with keep[j] != 0
 *                            (reads n bytes, n <= MK_W)
 *   mk_v_sel(m, x, y)        x in the lanes of m, y elsewhere
 *   mk_v_abs_lt(x, s)        the mask of lanes with |x| < s (s >= 0; not
 *                            NaN's lanes)
 *   mk_v_add, mk_v_sub, mk_v_mul(x, y)
 *   mk_v_fma(a, b, c)        a * b + c
 *   mk_v_max(x, acc)         lane-wise max, acc where x is NaN
 *   mk_v_exp(x)              exp for x <= 0, -inf and NaN (exp(-inf) = 0)
 *   mk_v_abs(x)              |x|
 *   mk_v_copysign(x, s)      x (+0 or more, or NaN) with the sign of s
 *   mk_v_div(x, y)           x / y, correctly rounded
 *   mk_v_hmax(x), mk_v_hsum(x)  lanes reduced in a fixed order
 * Optional hooks:
 *   MK_SM_FUSED_SUM          1: the exp pass also sums P (an accumulator
 *                            lives across the exp); 0 (default): a third
 *                            pass sums P, so nothing lives across a call
 *                            to an out-of-line exp (every vector register
 *                            is caller-saved).
 *   MK_V_EXP2                1: mk_v_exp2k(t, k) = k 2^t exists (t <=
 *                            2^-20, -inf or NaN; k a vector of one value
 *                            in [1/2, 2], the same across a loop), and the
 *                            exp pass works in base 2 (sm_exp2 below).
 *   MK_V_EXP2_SHIFT          h (with MK_V_EXP2; 0 by default): the
 *                            exp2k takes t + h, mk_v_exp2k(t, k) = k
 *                            2^(t - h), and sm_exp2_args folds h into
 *                            the argument's FMA (a floored reduction,
 *                            h = 1/2, needs no subtraction of its own).
 *   MK_V_EXP2_GROUP          G (with MK_V_EXP2): mk_v_exp2k_group(t, k)
 *                            sets t[g] = mk_v_exp2k(t[g], k) for g < G,
 *                            bit for bit, and the base-2 pass takes G
 *                            vectors at a time.
 *   MK_SM_SUMS               S (with MK_SM_FUSED_SUM and a G divisible by
 *                            S; 1 by default): the group loop sums P in S
 *                            accumulators, vector g into g mod S, added
 *                            into the row's sum after it (one add's
 *                            latency a vector bounded a short exp).
 *   MK_SM_CODES_GROUP        1 (with MK_SM_CODES and a group):
 *                            mk_v_store_codes_group(p, t) writes the G MK_W
 *                            codes of t[0..G) to p[] at once (a two-source
 *                            conversion converts two vectors in one).
 *   MK_SM_CODES              1: P leaves as half codes (kernels.h,
 *                            softmax_update_codes): mk_v_store_codes(p, x)
 *                            and mk_v_store_codes_n(p, n, x) write the
 *                            codes of MK_W (or n) lanes to uint16_t p[],
 *                            MK_SM_CODE_ONE is the code of 1; the driver
 *                            defines mk_<isa>_softmax_update_codes (and
 *                            no normalize).
 *   MK_V_STREAM              1: mk_v_stream(p, x) (a 64-byte aligned
 *                            non-temporal store) and mk_v_stream_fence()
 *                            exist, and normalize streams blocks of more
 *                            than MK_DECODE_ROWS rows (docs/design.md).
 *
 * Determinism: every lane of a tail takes the same operations as a lane of
 * a full vector, and every reduction runs in an order fixed by the row's
 * visible range alone.
 */
#ifndef MK_ISA
#error "define MK_ISA and the primitives before including softmax_driver.h"
#endif

#include <assert.h>
#include <math.h>
#include <string.h>

#include "kernels.h"

#define MK_SM_CAT_(a, b, c) a##b##c
#define MK_SM_CAT(a, b, c) MK_SM_CAT_(a, b, c)
#define MK_SM_FN(op) MK_SM_CAT(mk_, MK_ISA, _##op)

#ifndef MK_SM_FUSED_SUM
#define MK_SM_FUSED_SUM 0
#endif
#ifndef MK_V_STREAM
#define MK_V_STREAM 0
#endif
#ifndef MK_V_EXP2
#define MK_V_EXP2 0
#endif
#ifndef MK_SM_CODES
#define MK_SM_CODES 0
#endif
#ifndef MK_V_EXP2_SHIFT
#define MK_V_EXP2_SHIFT 0.0f
#endif
#ifndef MK_SM_SUMS
#define MK_SM_SUMS 1
#endif

#define MK_SM_INLINE static inline __attribute__((always_inline))

/* x = scale * s (+ bias), -inf where keep is 0 and in lanes >= cnt, for a
 * chunk of cnt keys (cnt == MK_W or a tail). Lanes >= cnt are not read. */
MK_SM_INLINE MK_V sm_scaled(const float *s, const float *bias,
                            const uint8_t *keep, const uint8_t *key_keep,
                            MK_V vscale, int64_t cnt)
{
    const MK_V ninf = mk_v_set1(-INFINITY);
    const int full = cnt == MK_W;
    MK_V x = full ? mk_v_load(s) : mk_v_load_n(s, cnt);
    if (bias)
        x = mk_v_fma(vscale, x, full ? mk_v_load(bias)
                                     : mk_v_load_n(bias, cnt));
    else
        x = mk_v_mul(vscale, x);
    if (key_keep)
        x = mk_v_sel(mk_v_keep(key_keep, cnt), x, ninf);
    if (keep)
        return mk_v_sel(mk_v_keep(keep, cnt), x, ninf);
    return full ? x : mk_v_sel(mk_v_lanes(cnt), x, ninf);
}

/* The score terms of one row (docs/design.md, "Score terms"): the
 * softcap (0: off) and the ALiBi slope with the distance j - i' of the
 * row's first visible key (slope 0 with alibi off). The cap's constants
 * (sm_terms_of) keep every intermediate of cap * tanh(x / cap) normal for
 * normal x, so flushed subnormals change no bit of it. */
typedef struct {
    int on;
    float cap, pre, inv_cap, slope;
    int64_t dist0;
} sm_terms;

/* y = x / cap as (x * pre) * inv_cap: pre = 2^-64 above 2^64 keeps
 * inv_cap at 2^-64 or more (1 / FLT_MAX is subnormal, and FTZ made it 0:
 * every score 0). Validation keeps cap normal. */
static inline sm_terms sm_terms_of(int on, float cap)
{
    const int big = cap > 0x1p64f;
    sm_terms tm = {on, cap, big ? 0x1p-64f : 1.0f,
                   cap > 0.0f ? (big ? 0x1p64f : 1.0f) / cap : 0.0f, 0.0f,
                   0};
    return tm;
}

/* 0, 1, ..., MK_W - 1: the lanes' key offsets within a chunk. */
static const float sm_iota[16] = {0, 1, 2,  3,  4,  5,  6,  7,
                                  8, 9, 10, 11, 12, 13, 14, 15};
_Static_assert(MK_W <= 16, "sm_iota covers every lane");

/* The capped score cap tanh(y) of a score x, y = x / cap as sm_terms_of
 * rounds it, for every x (+-cap at +-inf, NaN stays NaN): once for every
 * table over its primitives (docs/design.md, "Score terms"). SLEEF's
 * 1-ulp tanhf (a call a vector, in double-float arithmetic) made a
 * softcap call take twice the time of the same call without one
 * (docs/benchmarks.md). Below |y| = 5/8, x + x y^2 P(y^2), P of degree 4
 * (the minimax of (tanh(y) - y) / y^3 for tanh's relative error on
 * [0, 5/8], 4.4e-9 before its coefficients were rounded to float; 0.72
 * ulp measured over every float there with true FMAs). Written in x, not
 * cap y: x is the score itself, and where y or y^2 is below FLT_MIN (FTZ
 * makes it 0) the sum is x, as IEEE rounds it (x y^2 P is below half an
 * ulp of x from |y| < 2^-12 on), so a flushing engine gets the same bits
 * for normal x. From 5/8 on, cap (1 - 2t / (1 + t)) with t = exp(-2|y|)
 * (t <= 0.29, so nothing cancels; 1.4 ulp over every float with a
 * correctly rounded exp, and the table's exp adds its own ulp), given y's
 * sign. Both halves are computed and one selected per lane, unless
 * near_only (a constant) says every |y| is below 5/8: then the
 * polynomial alone, the same bits. A huge y's y^2 is inf in the half not
 * taken; t = 0 from |y| = 22.4 on (the exps' floor) gives exactly cap. */
MK_SM_INLINE MK_V sm_capped(MK_V x, MK_V y, MK_V cap, int near_only)
{
    const MK_V u = mk_v_mul(y, y);
    MK_V p = mk_v_fma(mk_v_set1(-5.704910835e-03f), u,
                      mk_v_set1(2.063902225e-02f));
    p = mk_v_fma(p, u, mk_v_set1(-5.373969620e-02f));
    p = mk_v_fma(p, u, mk_v_set1(1.333144199e-01f));
    p = mk_v_fma(p, u, mk_v_set1(-3.333328193e-01f));
    const MK_V near0 = mk_v_fma(mk_v_mul(x, u), p, x);
    if (near_only)
        return near0;
    const MK_V t = mk_v_exp(mk_v_mul(mk_v_abs(y), mk_v_set1(-2.0f)));
    const MK_V q = mk_v_div(mk_v_add(t, t), mk_v_add(mk_v_set1(1.0f), t));
    const MK_V far =
        mk_v_mul(cap, mk_v_copysign(mk_v_sub(mk_v_set1(1.0f), q), y));
    return mk_v_sel(mk_v_abs_lt(y, mk_v_set1(0.625f)), near0, far);
}

/* x = cap * tanh(scale * s / cap) (with a cap), + slope * (j - i'), +
 * bias; -inf where keep is 0 and in lanes >= cnt, for the chunk of cnt
 * keys at distance dist (its first key's j - i'). near_only: sm_capped's. */
MK_SM_INLINE MK_V sm_scaled_terms(const float *s, const float *bias,
                                  const uint8_t *keep,
                                  const uint8_t *key_keep, MK_V vscale,
                                  int64_t cnt, const sm_terms *tm,
                                  int64_t dist, int near_only)
{
    const MK_V ninf = mk_v_set1(-INFINITY);
    const int full = cnt == MK_W;
    MK_V x = mk_v_mul(vscale, full ? mk_v_load(s) : mk_v_load_n(s, cnt));
    if (tm->cap > 0.0f) {
        const MK_V y = mk_v_mul(mk_v_mul(x, mk_v_set1(tm->pre)),
                                mk_v_set1(tm->inv_cap));
        x = sm_capped(x, y, mk_v_set1(tm->cap), near_only);
    }
    if (tm->slope != 0.0f)
        x = mk_v_fma(mk_v_set1(tm->slope),
                     mk_v_add(mk_v_set1((float)dist), mk_v_load(sm_iota)), x);
    if (bias)
        x = mk_v_add(x, full ? mk_v_load(bias) : mk_v_load_n(bias, cnt));
    if (key_keep)
        x = mk_v_sel(mk_v_keep(key_keep, cnt), x, ninf);
    if (keep)
        return mk_v_sel(mk_v_keep(keep, cnt), x, ninf);
    return full ? x : mk_v_sel(mk_v_lanes(cnt), x, ninf);
}

/* max_j |s[j]| for j < n, NaN ignored (two accumulators). */
static float sm_abs_max(const float *s, int64_t n)
{
    MK_V m0 = mk_v_set1(0.0f), m1 = m0;
    int64_t j = 0;
    for (; j + 2 * MK_W <= n; j += 2 * MK_W) {
        m0 = mk_v_max(mk_v_abs(mk_v_load(s + j)), m0);
        m1 = mk_v_max(mk_v_abs(mk_v_load(s + j + MK_W)), m1);
    }
    for (; j < n; j += MK_W)
        m0 = mk_v_max(mk_v_abs(n - j < MK_W ? mk_v_load_n(s + j, n - j)
                                            : mk_v_load(s + j)),
                      m0);
    return mk_v_hmax(mk_v_max(m0, m1));
}

/* Pass 1 with score terms, for near_only (a constant) or not. */
MK_SM_INLINE float sm_terms_pass(float *s, int64_t n, MK_V vscale,
                                 const float *bias, const uint8_t *keep,
                                 const uint8_t *key_keep, const sm_terms *tm,
                                 int near_only)
{
    MK_V vmax = mk_v_set1(-INFINITY);
    for (int64_t j = 0; j < n; j += MK_W) {
        const int64_t cnt = n - j < MK_W ? n - j : MK_W;
        MK_V x = sm_scaled_terms(s + j, bias ? bias + j : NULL,
                                 keep ? keep + j : NULL,
                                 key_keep ? key_keep + j : NULL, vscale, cnt,
                                 tm, tm->dist0 + j, near_only);
        if (cnt == MK_W)
            mk_v_store(s + j, x);
        else
            mk_v_store_n(s + j, cnt, x);
        vmax = mk_v_max(x, vmax);
    }
    return mk_v_hmax(vmax);
}

/* Pass 1 with score terms: s[j] = x[j] for j < n; returns max_j x[j],
 * NaN ignored. A capped row whose scores all give |y| below sm_capped's
 * seam (a cap of 50 over logits below 25: nearly every row of a model's
 * scores) computes its tanh from the polynomial alone. The bound |scale|
 * max|s| pre inv_cap < 1/2 leaves room for the three roundings of y;
 * a NaN score, which the bound does not see, gives NaN either way. The
 * choice is the row's data's alone, so no thread count changes it. */
static float sm_scale_mask_terms(float *s, int64_t n, float scale,
                                 const float *bias, const uint8_t *keep,
                                 const uint8_t *key_keep, const sm_terms *tm)
{
    const MK_V vscale = mk_v_set1(scale);
    if (tm->cap > 0.0f &&
        fabsf(scale) * sm_abs_max(s, n) * tm->pre * tm->inv_cap < 0.5f)
        return sm_terms_pass(s, n, vscale, bias, keep, key_keep, tm, 1);
    return sm_terms_pass(s, n, vscale, bias, keep, key_keep, tm, 0);
}

/* Pass 1, general: s[j] = x[j] for j < n; returns max_j x[j], NaN
 * ignored. */
static float sm_scale_mask(float *s, int64_t n, float scale,
                           const float *bias, const uint8_t *keep,
                           const uint8_t *key_keep)
{
    const MK_V vscale = mk_v_set1(scale);
    MK_V vmax = mk_v_set1(-INFINITY);
    int64_t j = 0;
    for (; j + MK_W <= n; j += MK_W) {
        MK_V x = sm_scaled(s + j, bias ? bias + j : NULL,
                           keep ? keep + j : NULL,
                           key_keep ? key_keep + j : NULL, vscale, MK_W);
        mk_v_store(s + j, x);
        vmax = mk_v_max(x, vmax);
    }
    if (j < n) {
        MK_V x = sm_scaled(s + j, bias ? bias + j : NULL,
                           keep ? keep + j : NULL,
                           key_keep ? key_keep + j : NULL, vscale, n - j);
        mk_v_store_n(s + j, n - j, x);
        vmax = mk_v_max(x, vmax);
    }
    return mk_v_hmax(vmax);
}

/* Pass 1 without bias or keep: max_j s[j] for j < n, NaN ignored, s
 * untouched. Four accumulators hide the latency of max. */
static float sm_max(const float *s, int64_t n)
{
    const MK_V ninf = mk_v_set1(-INFINITY);
    MK_V m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t j = 0;
    for (; j + 4 * MK_W <= n; j += 4 * MK_W) {
        m0 = mk_v_max(mk_v_load(s + j), m0);
        m1 = mk_v_max(mk_v_load(s + j + MK_W), m1);
        m2 = mk_v_max(mk_v_load(s + j + 2 * MK_W), m2);
        m3 = mk_v_max(mk_v_load(s + j + 3 * MK_W), m3);
    }
    for (; j + MK_W <= n; j += MK_W)
        m0 = mk_v_max(mk_v_load(s + j), m0);
    if (j < n)
        m0 = mk_v_max(mk_v_sel(mk_v_lanes(n - j), mk_v_load_n(s + j, n - j),
                               ninf),
                      m0);
    return mk_v_hmax(mk_v_max(mk_v_max(m0, m1), mk_v_max(m2, m3)));
}

#if !MK_SM_FUSED_SUM
/* Pass 3: sum_j s[j] for j < n in a fixed order (4 accumulators). */
static float sm_sum(const float *s, int64_t n)
{
    MK_V a0 = mk_v_set1(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 4 * MK_W <= n; j += 4 * MK_W) {
        a0 = mk_v_add(a0, mk_v_load(s + j));
        a1 = mk_v_add(a1, mk_v_load(s + j + MK_W));
        a2 = mk_v_add(a2, mk_v_load(s + j + 2 * MK_W));
        a3 = mk_v_add(a3, mk_v_load(s + j + 3 * MK_W));
    }
    for (; j + MK_W <= n; j += MK_W)
        a0 = mk_v_add(a0, mk_v_load(s + j));
    if (j < n)
        a0 = mk_v_add(a0, mk_v_load_n(s + j, n - j));
    return mk_v_hsum(mk_v_add(mk_v_add(a0, a1), mk_v_add(a2, a3)));
}
#endif

/* What sm_exp2_args needs of a call's multiplier a of the scores (the
 * scale, or 1 when pass 1 wrote them scaled): A = a log2(e) rounded, and
 * q = (a L - A) / a (L = log2(e) as a float), A's rounding per unit of
 * score. */
typedef struct {
    float a, A, q;
} sm_base2;

static inline sm_base2 sm_base2_of(float a)
{
    const float L = 1.44269504f, A = a * L;
    sm_base2 b = {a, A, fmaf(a, L, -A) / a};
    return b;
}

/* P of one vector of scores x: exp(a x - b) (the product rounded before
 * the subtraction, so a huge score times a small scale stays finite), or
 * with base2 k 2^(a x + b) (sm_exp2_args's -B and k). */
MK_SM_INLINE MK_V sm_p(MK_V x, MK_V a, MK_V b, MK_V k, int base2)
{
#if MK_V_EXP2
    if (base2)
        return mk_v_exp2k(mk_v_fma(a, x, b), k);
#else
    (void)k, (void)base2;
#endif
    return mk_v_exp(mk_v_sub(mk_v_mul(a, x), b));
}

/* Pass 2: s[j] = sm_p(s[j]) for j < n. Returns sum_j s[j]: summed here
 * with MK_SM_FUSED_SUM, else by sm_sum. */
MK_SM_INLINE float sm_exp_pass(float *s, int64_t n, MK_V a, MK_V b, MK_V k,
                               int base2, uint16_t *codes)
{
#if MK_SM_FUSED_SUM
    MK_V sum = mk_v_set1(0.0f);
#endif
    int64_t j = 0;
#if MK_SM_CODES
    /* codes: the row's codes from this range's first key on; a row's
     * code j lies below its float j, so every store falls on floats this
     * loop has read already. */
#define MK_SM_STORE(j, e) mk_v_store_codes(codes + (j), e)
#define MK_SM_STORE_N(j, cnt, e) mk_v_store_codes_n(codes + (j), cnt, e)
#else
    (void)codes;
#define MK_SM_STORE(j, e) mk_v_store(s + (j), e)
#define MK_SM_STORE_N(j, cnt, e) mk_v_store_n(s + (j), cnt, e)
#endif
#if MK_V_EXP2 && defined(MK_V_EXP2_GROUP)
    if (base2) {
#if MK_SM_FUSED_SUM
        _Static_assert(MK_V_EXP2_GROUP % MK_SM_SUMS == 0,
                       "a group's vectors fill every accumulator");
        MK_V gsum[MK_SM_SUMS];
        for (int g = 0; g < MK_SM_SUMS; g++)
            gsum[g] = mk_v_set1(0.0f);
#endif
        for (; j + MK_V_EXP2_GROUP * MK_W <= n;
             j += MK_V_EXP2_GROUP * MK_W) {
            MK_V e[MK_V_EXP2_GROUP];
            for (int g = 0; g < MK_V_EXP2_GROUP; g++)
                e[g] = mk_v_fma(a, mk_v_load(s + j + g * MK_W), b);
            mk_v_exp2k_group(e, k);
#if MK_SM_CODES && defined(MK_SM_CODES_GROUP)
            mk_v_store_codes_group(codes + j, e);
#else
            for (int g = 0; g < MK_V_EXP2_GROUP; g++)
                MK_SM_STORE(j + g * MK_W, e[g]);
#endif
#if MK_SM_FUSED_SUM
            for (int g = 0; g < MK_V_EXP2_GROUP; g++)
                gsum[g % MK_SM_SUMS] = mk_v_add(gsum[g % MK_SM_SUMS], e[g]);
#endif
        }
#if MK_SM_FUSED_SUM
        for (int g = 0; g < MK_SM_SUMS; g++)
            sum = mk_v_add(sum, gsum[g]); /* 0 + x is x: P >= 0 */
#endif
    }
#endif
    for (; j + MK_W <= n; j += MK_W) {
        MK_V e = sm_p(mk_v_load(s + j), a, b, k, base2);
        MK_SM_STORE(j, e);
#if MK_SM_FUSED_SUM
        sum = mk_v_add(sum, e);
#endif
    }
    if (j < n) {
        MK_V e = sm_p(mk_v_load_n(s + j, n - j), a, b, k, base2);
        MK_SM_STORE_N(j, n - j, e);
#if MK_SM_FUSED_SUM
        sum = mk_v_add(sum, mk_v_sel(mk_v_lanes(n - j), e, mk_v_set1(0.0f)));
#endif
    }
#undef MK_SM_STORE
#undef MK_SM_STORE_N
#if MK_SM_FUSED_SUM
    return mk_v_hsum(sum);
#else
    _Static_assert(!MK_SM_CODES, "codes need the sum in the exp pass");
    return sm_sum(s, n);
#endif
}

/* s[j] = exp(a * s[j] - b) for j < n; returns their sum. */
static float sm_exp(float *s, int64_t n, MK_V a, MK_V b, uint16_t *codes)
{
    return sm_exp_pass(s, n, a, b, a, 0, codes);
}

#if MK_V_EXP2
/* Pass 2 in base 2 (sm_exp2_args): s[j] = k 2^(A s[j] - B) for j < n,
 * with A = a log2(e) and B = max' log2(e), each rounded to float: one FMA
 * a score (the product exact inside it) where sm_exp takes a multiply, a
 * subtraction and a multiply by log2(e). The roundings of A and B shift
 * every score of the row by one amount, c; k = 2^-c takes it back out, so
 * P is exp(a s[j] - max') to the FMA's rounding, 2^-24 of |A s[j] - B| (a
 * relative 1e-6 of P at e^-20 of the row's largest), and the polynomial's
 * error. With MK_V_EXP2_SHIFT h the FMA adds h - B (rounded: c holds
 * that rounding too) and mk_v_exp2k takes h back out. Returns sum_j s[j]. */
static float sm_exp2(float *s, int64_t n, MK_V a, MK_V negb, MK_V k,
                     uint16_t *codes)
{
    return sm_exp_pass(s, n, a, negb, k, 1, codes);
}
#endif

/* sm_exp2 for a row whose maximum is mx, in two halves so that a group's
 * rows can find theirs before any row's exp pass (softmax_update). With
 * B = mx L rounded, A s - B = (a s - mx) L' + c for every s, L' = A / a,
 * up to (a s - mx) times A's relative rounding: c = mx A / a - B = (mx L -
 * B) - mx q, its first term exact by an FMA. k = 2^-c by two terms of its
 * series past 1 (|c| < 2^-10 below the bound, so the next is under
 * 2^-33). sm_exp2_args returns 0 for rows past |mx| = 4096 or a
 * multiplier too small for a normal A and q, or so large that A = a L
 * overflows (a scale near FLT_MAX over tiny scores): those take sm_exp. */
static inline int sm_exp2_args(const sm_base2 *b2, float mx, float *negb,
                               float *k)
{
#if MK_V_EXP2
    if (!(fabsf(mx) <= 4096.0f && b2->a >= 0x1p-60f && b2->a <= 0x1p120f))
        return 0;
    const float L = 1.44269504f, B = mx * L, h = MK_V_EXP2_SHIFT;
    float c = fmaf(mx, L, -B) - mx * b2->q;
    /* The argument's constant is h - B rounded, nb, and mk_v_exp2k takes
     * h back out: the rounding, err = (h - B) - nb (exact, by Knuth's
     * two-sum), shifts every score by -err, which k takes out with c. */
    const float nb = h - B, bv = nb - h;
    const float err = (h - (nb - bv)) + (-B - bv);
    c -= err;
    const float y = c * -0.693147181f;
    *negb = nb;
    *k = fmaf(y, fmaf(0.5f, y, 1.0f), 1.0f);
    return 1;
#else
    /* Without mk_v_exp2k every row takes sm_exp. */
    (void)b2, (void)mx, (void)negb, (void)k;
    return 0;
#endif
}

/* With MK_SM_CODES, where a row's code lo goes (NULL otherwise). */
static inline uint16_t *sm_codes_at(float *row, int64_t lo)
{
#if MK_SM_CODES
    return (uint16_t *)(void *)row + lo;
#else
    (void)row, (void)lo;
    return NULL;
#endif
}

/* What pass 1 of one row leaves for its pass 2 (softmax_update). */
typedef struct {
    int64_t lo, hi;
    float bmax, mx;   /* the block's maximum; max' (-inf: the row is empty) */
    float negb, k;    /* sm_exp2's arguments, when base2 */
    int base2;
} sm_rowpass;

/* Pass 1 of one row: scale and mask the visible columns [lo, hi) (written
 * back unless unscaled) and find max' = max(old_max, their maximum). */
MK_SM_INLINE void sm_row_max(float *row, int64_t lo, int64_t hi,
                             float scale, int unscaled, const float *bias,
                             const uint8_t *keep, const uint8_t *key_keep,
                             const sm_terms *tm, const sm_base2 *b2,
                             float old_max, sm_rowpass *rp)
{
    float *vis = row + lo;
    const int64_t count = hi - lo;
    rp->lo = lo, rp->hi = hi;
    rp->bmax = unscaled ? scale * sm_max(vis, count)
               : tm->on ? sm_scale_mask_terms(vis, count, scale, bias, keep,
                                              key_keep, tm)
                        : sm_scale_mask(vis, count, scale, bias, keep,
                                        key_keep);
    rp->mx = mk_row_next_max(vis, count, rp->bmax, old_max);
    rp->base2 = rp->mx != -INFINITY &&
                sm_exp2_args(b2, rp->mx, &rp->negb, &rp->k);
}

/* Pass 2 of one row: P = exp(x - max') in [lo, hi) and 0 elsewhere.
 * Returns 0 for a row still empty (P = 0), else 1 with *psum = sum_j P. */
MK_SM_INLINE int sm_row_exp(float *row, int64_t n, const sm_rowpass *rp,
                            float scale, int unscaled, const sm_base2 *b2,
                            float *psum)
{
    const int64_t lo = rp->lo, hi = rp->hi, count = hi - lo;
    float *vis = row + lo;
#if MK_SM_CODES
    /* P as codes: n of them and a zero after an odd n; the zeros outside
     * [lo, hi) go in after the exp pass, whose floats they overlap. */
    uint16_t *codes = (uint16_t *)(void *)row;
    const int64_t ncodes = n + (n & 1);
    if (rp->mx == -INFINITY) {
        memset(codes, 0, (size_t)ncodes * sizeof *codes);
        return 0;
    }
#define MK_SM_ZERO_OUTSIDE()                                                \
    do {                                                                    \
        if (lo > 0)                                                         \
            memset(codes, 0, (size_t)lo * sizeof *codes);                   \
        if (ncodes > hi)                                                    \
            memset(codes + hi, 0, (size_t)(ncodes - hi) * sizeof *codes);   \
    } while (0)
#else
    if (rp->mx == -INFINITY) {
        memset(row, 0, (size_t)n * sizeof *row);
        return 0;
    }
    if (lo > 0)
        memset(row, 0, (size_t)lo * sizeof *row);
    if (hi < n)
        memset(row + hi, 0, (size_t)(n - hi) * sizeof *row);
#define MK_SM_ZERO_OUTSIDE() ((void)0)
#endif
    const float a = unscaled ? scale : 1.0f;
    (void)b2; /* read only with MK_V_EXP2 */
    if (count == 1 && rp->bmax == rp->mx) {
        /* One key, the row's maximum: P = exp(0) = 1 exactly, so its
         * output is its value row bit for bit (a causal first row). */
#if MK_SM_CODES
        codes[lo] = MK_SM_CODE_ONE;
#else
        vis[0] = 1.0f;
#endif
        *psum = 1.0f;
    }
#if MK_V_EXP2
    else if (rp->base2)
        *psum = sm_exp2(vis, count, mk_v_set1(b2->A), mk_v_set1(rp->negb),
                        mk_v_set1(rp->k), sm_codes_at(row, lo));
#endif
    else
        *psum = sm_exp(vis, count, mk_v_set1(a), mk_v_set1(rp->mx),
                       sm_codes_at(row, lo));
    MK_SM_ZERO_OUTSIDE();
#undef MK_SM_ZERO_OUTSIDE
    return 1;
}

/*
 * The fused scale + mask + online softmax step of kernels.h. Per row, the
 * keys outside the visible range [lo, hi) of mk_visible_range are never
 * read (P = 0 there). Pass 1 finds the row maximum of x = scale * s + bias
 * (-inf where keep is 0), or with score terms (softcap, ALiBi) of the score
 * of mk_mask: without bias or keep and with a finite scale > 0
 * it is scale * max_j s (rounding is monotonic, so the same float) and s
 * is left alone, the scale folded into the exp argument; otherwise x is
 * written back. Pass 2 writes P = exp(x - max') and sums it. The alphas of
 * MK_W rows take one vector exp. Rows whose maximum stays -inf get P = 0,
 * alpha = 1, unless a NaN reached every visible score (mk_row_next_max).
 * Preconditions: lds >= n when m > 1; mask->keep / bias readable for the
 * visible keys of each row (row stride keep_ld / bias_ld, 0 broadcasts;
 * interleaved rows by head and query: mk_row_of).
 */
#if MK_SM_CODES
#define MK_SM_UPDATE MK_SM_FN(softmax_update_codes)
#else
#define MK_SM_UPDATE MK_SM_FN(softmax_update)
#endif
void MK_SM_UPDATE(float *s, ptrdiff_t lds, int64_t m, int64_t n, float scale,
                  const mk_mask *mask, float *row_max, float *row_sum,
                  float *alpha)
{
    assert(m >= 0 && n >= 0 && mask);
    assert(m == 0 || (s && row_max && row_sum && alpha));
    assert(m <= 1 || lds >= n);
    const int terms = mask->softcap > 0.0f || mask->alibi;
    const int unscaled = !mask->bias && !mask->keep && !mask->key_keep &&
                         !terms &&
                         scale > 0.0f && scale < INFINITY;
    const sm_base2 b2 = sm_base2_of(unscaled ? scale : 1.0f);
    sm_terms tm = sm_terms_of(terms, mask->softcap);
    for (int64_t i0 = 0; i0 < m; i0 += MK_W) {
        const int64_t rows = m - i0 < MK_W ? m - i0 : MK_W;
        float arg[MK_W], sum[MK_W], e[MK_W];
        int live[MK_W];
        sm_rowpass rp[MK_W];
        for (int64_t r = 0; r < MK_W; r++)
            arg[r] = 0.0f, sum[r] = 0.0f, live[r] = 0;
        /* Pass 1 of every row of the group before any row's pass 2: a
         * row's exp pass waits on its maximum (a horizontal reduction and
         * the scalar arguments, tens of cycles), and found here, that
         * latency overlaps the rows around it instead of standing between
         * two exp passes (docs/design.md, "The softmax step's order"). */
        for (int64_t r = 0; r < rows; r++) {
            const int64_t i = i0 + r;
            int64_t lo, hi;
            mk_visible_range(mask, i, n, &lo, &hi);
            const mk_row rw = mk_row_of(mask, i);
            const float *bias =
                mask->bias ? mask->bias + rw.h * mask->bias_ld +
                                 rw.q * mask->bias_qld + lo
                           : NULL;
            const uint8_t *keep =
                mask->keep ? mask->keep + rw.h * mask->keep_ld +
                                 rw.q * mask->keep_qld + lo
                           : NULL;
            if (mask->alibi) {
                tm.slope = mask->alibi[rw.h * mask->alibi_ld];
                tm.dist0 =
                    lo - (mask->alibi_pos + rw.q * mask->alibi_pos_step);
            }
            sm_row_max(s + i * lds, lo, hi, scale, unscaled, bias, keep,
                       mask->key_keep ? mask->key_keep + lo : NULL, &tm,
                       &b2, row_max[i], &rp[r]);
        }
        for (int64_t r = 0; r < rows; r++) {
            const int64_t i = i0 + r;
            live[r] = sm_row_exp(s + i * lds, n, &rp[r], scale, unscaled,
                                 &b2, &sum[r]);
            if (live[r]) {
                arg[r] = row_max[i] - rp[r].mx;
                row_max[i] = rp[r].mx;
            }
        }
        mk_v_store(e, mk_v_exp(mk_v_load(arg)));
        for (int64_t r = 0; r < rows; r++) {
            alpha[i0 + r] = live[r] ? e[r] : 1.0f;
            if (live[r])
                row_sum[i0 + r] = row_sum[i0 + r] * e[r] + sum[r];
        }
    }
}

#if !MK_SM_CODES
/*
 * out[i][c] = o[i][c] * (1 / row_sum[i]), or 0 when row_sum[i] == 0 (a
 * row with every key masked: exact zeros even if o holds NaN). MK_W
 * columns per vector, the tail through the _n primitives. With MK_V_STREAM
 * and stream (the engine's choice: a prefill block's rows that nobody
 * reads soon), whole 64-byte aligned rows go by non-temporal stores: the
 * output rows are a page or more apart, so reading each line for
 * ownership first is wasted (docs/design.md). The value is the same
 * either way.
 * Preconditions: ldo >= 0 (0 repeats one row); ldout >= dv when m > 1.
 */
void MK_SM_FN(normalize)(const float *o, ptrdiff_t ldo, int64_t m,
                         int64_t dv, const float *row_sum, float *out,
                         ptrdiff_t ldout, int stream_rows)
{
    assert(m >= 0 && dv >= 0 && ldo >= 0);
    assert(m == 0 || (o && row_sum && out));
    assert(m <= 1 || ldout >= dv);
#if MK_V_STREAM
    const int stream = stream_rows && m > 0 && dv % MK_W == 0;
#else
    (void)stream_rows;
#endif
    for (int64_t i = 0; i < m; i++) {
        const float *src = o + i * ldo;
        float *dst = out + i * ldout;
        if (row_sum[i] == 0.0f) {
            memset(dst, 0, (size_t)dv * sizeof *dst);
            continue;
        }
        const MK_V inv = mk_v_set1(1.0f / row_sum[i]);
#if MK_V_STREAM
        if (stream && ((uintptr_t)dst & 63) == 0) {
            for (int64_t c = 0; c < dv; c += MK_W)
                mk_v_stream(dst + c, mk_v_mul(mk_v_load(src + c), inv));
            continue;
        }
#endif
        int64_t c = 0;
        for (; c + MK_W <= dv; c += MK_W)
            mk_v_store(dst + c, mk_v_mul(mk_v_load(src + c), inv));
        if (c < dv)
            mk_v_store_n(dst + c, dv - c,
                         mk_v_mul(mk_v_load_n(src + c, dv - c), inv));
    }
#if MK_V_STREAM
    if (stream) /* streamed rows are visible before anything after us */
        mk_v_stream_fence();
#endif
}

#endif /* !MK_SM_CODES: normalize */

#undef MK_SM_UPDATE
#undef MK_SM_INLINE
#undef MK_SM_FN
#undef MK_SM_CAT
#undef MK_SM_CAT_
