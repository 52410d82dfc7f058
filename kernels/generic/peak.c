/*
 * The generic peak (the table's fma_chains, for the benchmark): the driver
 * of kernels/peak_driver.h on the widest vector every CPU of the
 * architecture has (128 bits: SSE2 on x86-64, Advanced SIMD on AArch64).
 * The generic kernels are compiled without ISA flags and with
 * -ffp-contract=off, so this multiply plus add, not an FMA, is the best
 * instruction mix they can reach.
 *
 * 12 chains of 4 floats: 12 accumulators and the constant fit in the 16
 * registers of x86-64 and leave enough chains in flight to cover the
 * latency of a multiply followed by an add.
 */
#include "generic.h"

typedef float v4f __attribute__((vector_size(16)));

#define MK_V v4f
#define MK_W 4
#define MK_PEAK_CHAINS 12
#define mk_v_set1(f) ((v4f){(f), (f), (f), (f)})
#define mk_v_fma(a, b, c) ((a) * (b) + (c))
#define mk_v_add(a, b) ((a) + (b))
#define mk_v_hsum(x) ((x)[0] + (x)[1] + (x)[2] + (x)[3])

#define MK_ISA generic
#include "peak_driver.h"
