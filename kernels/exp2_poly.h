/*
 * The polynomials for 2^f, |f| <= 1/2, that the x86 softmax steps'
 * inline exps evaluate (kernels/avx2/softmax.c, kernels/avx512/softmax.c),
 * written once as Horner chains over the caller's FMA and coefficient
 * macros: FMA(a, b, c) = a * b + c, C(c) the vector of coefficient c (the
 * caller may fold a factor into it, as mk_v_exp2k folds its k).
 *
 * MK_EXP2_DEG6: degree 6 with the constant term exactly 1, so 2^0 is
 * exactly 1 (an unchanged maximum rescales by exactly 1: a row's state,
 * and an lse of a sink alone, stay bitwise what they were), 6.7e-8 (about
 * 1 ulp) evaluated in float over 200k points of [-1/2, 1/2]: the exps of
 * the rescale factors. MK_EXP2_DEG5: a degree-5 minimax fit of relative
 * error (Remez), 7.5e-8 in exact arithmetic, 2.1e-7 (about 2 ulp)
 * evaluated in float, its constant term not 1: the base-2 exp pass, whose
 * P carries a per-row correction anyway. MK_EXP2_DEG4: degree 4, 2.7e-6
 * evaluated in float, for the bf16 path's pass, whose P is rounded to
 * bf16 (2^-9) before it multiplies.
 */
#ifndef MK_EXP2_POLY_H
#define MK_EXP2_POLY_H

#define MK_EXP2_DEG6(FMA, C, f)                                              \
    FMA(FMA(FMA(FMA(FMA(FMA(C(1.533757750e-04f), f, C(1.339985989e-03f)), f, \
                        C(9.618519805e-03f)),                                \
                    f, C(5.550329015e-02f)),                                 \
                f, C(2.402264625e-01f)),                                     \
            f, C(6.931471825e-01f)),                                         \
        f, C(1.0f))

/* MK_EXP2_DEG5's coefficients, the highest degree's first, for a caller
 * that runs the chain one coefficient at a time across several vectors
 * (kernels/avx2/softmax.c, exp2k_each). */
#define MK_EXP2_DEG5_COEFFS                                                  \
    1.327647198e-03f, 9.675541334e-03f, 5.550713274e-02f, 2.402211972e-01f,  \
        6.931469671e-01f, 1.000000072e+00f
#define MK_EXP2_HORNER5_(FMA, C, f, c5, c4, c3, c2, c1, c0)                  \
    FMA(FMA(FMA(FMA(FMA(C(c5), f, C(c4)), f, C(c3)), f, C(c2)), f, C(c1)), f, \
        C(c0))
#define MK_EXP2_HORNER5(FMA, C, f, ...)                                      \
    MK_EXP2_HORNER5_(FMA, C, f, __VA_ARGS__)
#define MK_EXP2_DEG5(FMA, C, f)                                              \
    MK_EXP2_HORNER5(FMA, C, f, MK_EXP2_DEG5_COEFFS)

#define MK_EXP2_DEG4(FMA, C, f)                                              \
    FMA(FMA(FMA(FMA(C(9.560510516e-03f), f, C(5.591703951e-02f)), f,        \
                C(2.402498126e-01f)),                                        \
            f, C(6.931219697e-01f)),                                         \
        f, C(9.999991655e-01f))

/* The degree-5 and degree-4 polynomials re-expanded in x = f + 1/2, for
 * 2^(x - 1/2) over x in [0, 1): the same polynomials in exact arithmetic,
 * for an exp whose argument is floored rather than rounded (t - 1/2 =
 * floor(t) + x - 1/2; kernels/avx512/softmax.c, mk_v_exp2k). Evaluated in
 * float over 2M points of [0, 1): 1.7e-7 (degree 5) and 2.7e-6 (degree
 * 4) relative; at x = 1/2 (2^0) they give 1 exactly and 0.9999991655
 * (the originals at f = 0: 1 + 2^-23 and the same 0.9999991655). */
#define MK_EXP2_DEG5_HALF(FMA, C, x)                                         \
    MK_EXP2_HORNER5(FMA, C, x, 1.327647245e-03f, 6.356423255e-03f,           \
                    3.947516903e-02f, 1.698142439e-01f, 4.901332259e-01f,    \
                    7.071067095e-01f)
#define MK_EXP2_DEG4_HALF(FMA, C, x)                                         \
    FMA(FMA(FMA(FMA(C(9.560510516e-03f), x, C(3.679601848e-02f)), x,        \
                C(1.707150191e-01f)),                                        \
            x, C(4.900296926e-01f)),                                         \
        x, C(7.071085572e-01f))

#endif
