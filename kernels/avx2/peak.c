/*
 * The AVX2 peak (the table's fma_chains, for the benchmark): independent
 * 256-bit FMA chains, reached only through the avx2 table, which the
 * engine hands out only on a CPU with AVX2 and FMA.
 *
 * 12 chains: an FMA has a latency of 4-5 cycles and two ports issue one
 * each per cycle, so 8-10 chains in flight saturate them; 12 accumulators
 * and 2 constants fit in the 16 ymm registers.
 */
#include <immintrin.h>

#include "avx2.h"

enum { CHAINS = 12, LANES = 8 };

const double mk_avx2_fma_chains_flops = 2.0 * CHAINS * LANES;

float mk_avx2_fma_chains(int64_t iterations)
{
    const __m256 mul = _mm256_set1_ps(0.5f);
    const __m256 add = _mm256_set1_ps(0.5f);
    __m256 acc[CHAINS];
    for (int c = 0; c < CHAINS; ++c)
        acc[c] = _mm256_set1_ps((float)c);
    for (int64_t i = 0; i < iterations; ++i) {
        for (int c = 0; c < CHAINS; ++c)
            acc[c] = _mm256_fmadd_ps(acc[c], mul, add);
    }
    __m256 total = acc[0];
    for (int c = 1; c < CHAINS; ++c)
        total = _mm256_add_ps(total, acc[c]);
    float lanes[LANES];
    _mm256_storeu_ps(lanes, total);
    float sum = 0.0f;
    for (int l = 0; l < LANES; ++l)
        sum += lanes[l];
    return sum;
}
