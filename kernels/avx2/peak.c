/*
 * The AVX2 peak (the table's fma_chains, for the benchmark): the driver of
 * kernels/peak_driver.h on 256-bit FMA chains, reached only through the
 * avx2 table, which the engine hands out only on a CPU with AVX2 and FMA.
 *
 * 12 chains: an FMA has a latency of 4-5 cycles and two ports issue one
 * each per cycle, so 8-10 chains in flight saturate them; 12 accumulators
 * and the constant fit in the 16 ymm registers.
 */
#include <immintrin.h>

#include "avx2.h"

#define MK_V __m256
#define MK_W 8
#define MK_PEAK_CHAINS 12
#define mk_v_set1 _mm256_set1_ps
#define mk_v_fma _mm256_fmadd_ps
#define mk_v_add _mm256_add_ps

static inline float mk_v_hsum(__m256 x)
{
    float lanes[MK_W], sum = 0.0f;
    _mm256_storeu_ps(lanes, x);
    for (int l = 0; l < MK_W; ++l)
        sum += lanes[l];
    return sum;
}

#define MK_ISA avx2
#include "peak_driver.h"
