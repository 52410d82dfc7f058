/*
 * The AVX-512 peak (the table's fma_chains, for the benchmark):
 * independent 512-bit FMA chains, reached only through the avx512 table,
 * which the engine hands out only on a CPU that runs it.
 *
 * 16 chains: an FMA has a latency of 4 cycles and two ports issue one
 * 512-bit FMA each per cycle on the cores with two FMA units, so 8 chains
 * in flight saturate them; 16 leave slack for a longer latency and, with
 * the 2 constants, fit in the 32 zmm registers.
 */
#include <immintrin.h>

#include "avx512.h"

#define CHAINS 16

const double mk_avx512_fma_chains_flops = 2.0 * CHAINS * 16;

float mk_avx512_fma_chains(int64_t iterations)
{
    const __m512 half = _mm512_set1_ps(0.5f);
    __m512 chain[CHAINS];
    for (int c = 0; c < CHAINS; ++c)
        chain[c] = _mm512_set1_ps((float)c);
    for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
        for (int c = 0; c < CHAINS; ++c)
            chain[c] = _mm512_fmadd_ps(chain[c], half, half);
    }
    /* One value that depends on every chain. */
    __m512 total = _mm512_setzero_ps();
    for (int c = 0; c < CHAINS; ++c)
        total = _mm512_add_ps(total, chain[c]);
    return _mm512_reduce_add_ps(total);
}
