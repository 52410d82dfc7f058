/*
 * The generic peak (the table's fma_chains, for the benchmark): independent
 * multiply-then-add chains on the
 * widest vector every CPU of the architecture has (128 bits: SSE2 on x86-64,
 * Advanced SIMD on AArch64). The generic kernels are compiled without ISA
 * flags and with -ffp-contract=off, so this multiply plus add, not an FMA,
 * is the best instruction mix they can reach.
 *
 * 12 chains of 4 floats: 12 accumulators and 2 constants fit in the 16
 * registers of x86-64 and leave enough chains in flight to cover the
 * latency of a multiply followed by an add.
 */
#include "generic.h"

typedef float v4f __attribute__((vector_size(16)));

enum { CHAINS = 12, LANES = 4 };

const double mk_generic_fma_chains_flops = 2.0 * CHAINS * LANES;

float mk_generic_fma_chains(int64_t iterations)
{
    /* x -> 0.5 x + 0.5 converges to 1: no overflow, no denormals. */
    const v4f mul = {0.5f, 0.5f, 0.5f, 0.5f};
    const v4f add = {0.5f, 0.5f, 0.5f, 0.5f};
    v4f acc[CHAINS];
    for (int c = 0; c < CHAINS; ++c) {
        const float x = (float)c;
        acc[c] = (v4f){x, x + 1.0f, x + 2.0f, x + 3.0f};
    }
    for (int64_t i = 0; i < iterations; ++i) {
        for (int c = 0; c < CHAINS; ++c)
            acc[c] = acc[c] * mul + add;
    }
    v4f total = acc[0];
    for (int c = 1; c < CHAINS; ++c)
        total += acc[c];
    return total[0] + total[1] + total[2] + total[3];
}
