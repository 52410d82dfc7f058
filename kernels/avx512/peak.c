/*
 * The AVX-512 peak (the table's fma_chains, for the benchmark): the driver
 * of kernels/peak_driver.h on 512-bit FMA chains, reached only through the
 * avx512 table, which the engine hands out only on a CPU that runs it.
 *
 * 16 chains: an FMA has a latency of 4 cycles and two ports issue one
 * 512-bit FMA each per cycle on the cores with two FMA units, so 8 chains
 * in flight saturate them; 16 leave slack for a longer latency and, with
 * the constant, fit in the 32 zmm registers.
 */
#include <immintrin.h>

#include "avx512.h"

#define MK_V __m512
#define MK_W 16
#define MK_PEAK_CHAINS 16
#define mk_v_set1 _mm512_set1_ps
#define mk_v_fma _mm512_fmadd_ps
#define mk_v_add _mm512_add_ps
#define mk_v_hsum _mm512_reduce_add_ps

#define MK_ISA avx512
#include "peak_driver.h"
