/*
 * The NEON peak (the table's fma_chains, for the benchmark): independent
 * 128-bit FMA chains (Advanced SIMD is baseline
 * on AArch64: no flags). 16 chains cover a 4-cycle FMA latency on up to four
 * pipes; 16 accumulators and 2 constants use 18 of the 32 registers.
 */
#include <arm_neon.h>

#include "neon.h"

enum { CHAINS = 16, LANES = 4 };

const double mk_neon_fma_chains_flops = 2.0 * CHAINS * LANES;

float mk_neon_fma_chains(int64_t iterations)
{
    const float32x4_t mul = vdupq_n_f32(0.5f);
    const float32x4_t add = vdupq_n_f32(0.5f);
    float32x4_t acc[CHAINS];
    for (int c = 0; c < CHAINS; ++c)
        acc[c] = vdupq_n_f32((float)c);
    for (int64_t i = 0; i < iterations; ++i) {
        for (int c = 0; c < CHAINS; ++c)
            acc[c] = vfmaq_f32(add, acc[c], mul); /* add + acc * mul */
    }
    float32x4_t total = acc[0];
    for (int c = 1; c < CHAINS; ++c)
        total = vaddq_f32(total, acc[c]);
    return vaddvq_f32(total);
}
