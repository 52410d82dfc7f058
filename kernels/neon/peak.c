/*
 * The NEON peak (the table's fma_chains, for the benchmark): the driver of
 * kernels/peak_driver.h on 128-bit FMA chains (Advanced SIMD is baseline
 * on AArch64: no flags). 16 chains cover a 4-cycle FMA latency on up to
 * four pipes; 16 accumulators and the constant use 17 of the 32 registers.
 */
#include <arm_neon.h>

#include "neon.h"

#define MK_V float32x4_t
#define MK_W 4
#define MK_PEAK_CHAINS 16
#define mk_v_set1 vdupq_n_f32
/* a * b + c: VFMA takes the addend first. */
#define mk_v_fma(a, b, c) vfmaq_f32((c), (a), (b))
#define mk_v_add vaddq_f32
#define mk_v_hsum vaddvq_f32

#define MK_ISA neon
#include "peak_driver.h"
