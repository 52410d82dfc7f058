/*
 * The benchmark's FMA peak (the table's fma_chains, kernels.h) written once
 * over the vector primitives of softmax_driver.h: independent chains of
 * x -> 0.5 x + 0.5 (converges to 1: no overflow, no denormals), each in
 * its own register, reduced into one value so no compiler drops a chain.
 * Each ISA's peak.c defines MK_V, MK_W, mk_v_set1, mk_v_fma(a, b, c)
 * (a * b + c: one FMA on the SIMD ISAs; generic's multiply then add),
 * mk_v_add, mk_v_hsum, MK_PEAK_CHAINS (enough chains
 * to cover the FMA latency on every FMA port, few enough that they and the
 * two constants fit in the register file) and MK_ISA, then includes this
 * header, which defines mk_<isa>_fma_chains and mk_<isa>_fma_chains_flops.
 */
#if !defined(MK_ISA) || !defined(MK_PEAK_CHAINS)
#error "define MK_ISA, MK_PEAK_CHAINS and the primitives before peak_driver.h"
#endif

#define MK_PK_CAT_(a, b, c) a##b##c
#define MK_PK_CAT(a, b, c) MK_PK_CAT_(a, b, c)
#define MK_PK_FN(op) MK_PK_CAT(mk_, MK_ISA, _##op)

/* Two flops (a multiply and an add) per lane of each chain a step. */
const double MK_PK_FN(fma_chains_flops) = 2.0 * MK_PEAK_CHAINS * MK_W;

float MK_PK_FN(fma_chains)(int64_t iterations)
{
    const MK_V half = mk_v_set1(0.5f);
    MK_V acc[MK_PEAK_CHAINS];
    /* Unrolled in full, so every chain lives in a register. No chain
     * starts at the fixed point 1, which a compiler could fold away. */
#pragma GCC unroll 32
    for (int c = 0; c < MK_PEAK_CHAINS; ++c)
        acc[c] = mk_v_set1(-(float)c);
    for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 32
        for (int c = 0; c < MK_PEAK_CHAINS; ++c)
            acc[c] = mk_v_fma(acc[c], half, half);
    }
    MK_V total = acc[0];
#pragma GCC unroll 32
    for (int c = 1; c < MK_PEAK_CHAINS; ++c)
        total = mk_v_add(total, acc[c]);
    return mk_v_hsum(total);
}

#undef MK_PK_FN
#undef MK_PK_CAT
#undef MK_PK_CAT_
