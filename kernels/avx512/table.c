/* The AVX-512 kernel table: avx2's (every CPU that runs it runs avx2),
 * with the compute kernels replaced, and the decode kernels: memory-bound
 * for fp32 and 16-bit caches, but bound by the widening of 8-bit ones,
 * which 16-lane conversions halve. block_q is a
 * multiple of the 12-row tile and block_k of the 32-key panel; 96 x 512,
 * the avx2 table's blocks (kernels/avx2/table.c: half the softmax step's
 * per-row work of 256-key blocks, a 192 KiB score tile), read 1.00-1.02x
 * the speed of 144 x 256 in fp32 and 1.02x in bf16 on Zen 4
 * (docs/benchmarks.md). */
#include "avx512.h"
#include "tile.h"

#ifndef MK_AVX512_BLOCK_Q
#define MK_AVX512_BLOCK_Q 96
#endif
#ifndef MK_AVX512_BLOCK_K
#define MK_AVX512_BLOCK_K 512
#endif
_Static_assert(MK_AVX512_BLOCK_K % MK_AVX512_NR == 0,
               "block_k is a multiple of the packing panel");

void mk_init_avx512(mk_table *t)
{
    mk_init_avx2(t);
    t->name = "avx512";
    t->block_q = MK_AVX512_BLOCK_Q;
    t->block_k = MK_AVX512_BLOCK_K;
    t->strip_rows = MK_AVX512_MR;
    /* Its strip-major linear (linear.c) was measured at 96 rows a call;
     * avx2's 192 is for its panel-by-panel order. */
    t->linear_rows = 96;
    t->decode_rows = MK_DECODE_WIDE_ROWS; /* decode.c, qk_wide */
    /* fp32 group 8 from [B, L, H, D] read 1.33-1.38x one kv head a block
     * (1 thread; 2 threads 1.36-1.53x), group 7 1.15x, group 6 1.07x;
     * group 5 (8-row kernels) 0.92x, and 16-bit caches 0.91-1.07x
     * (Zen 5, docs/benchmarks.md). */
    t->head_rows_f32 = MK_AVX512_SEG_ROWS;
    MK_SET_PREFILL(t, avx512, 12x32);
    MK_SET_DECODE(t, avx512);
    MK_SET_WIDEN(t, avx512);
    MK_SET_NARROW(t, avx512);
    MK_SET_PEAK(t, avx512);
}
