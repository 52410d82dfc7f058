/* The AVX2+FMA kernel table: generic's, with every kernel but widen[MK_F32]
 * replaced. block_q is a multiple of the 6-row tile and block_k of the
 * 16-key panel. block_k = 512 halves the per-row work of the softmax step
 * (a row's maximum, sums and rescale are paid per key block) against 256:
 * 1-thread prefill 1.5-2% faster on Zen 4. block_q = 96 keeps the 96 x 512
 * score tile at 192 KiB, in the 512 KiB L2 of Zen 3 beside the key panels
 * in use (not measured there); a head's keys are packed once per thread by the head cache, so
 * fewer rows a block cost no repacking, and 96 is two causal sub-blocks
 * (docs/design.md, docs/benchmarks.md). */
#include "avx2.h"

void mk_init_avx2(mk_table *t)
{
    mk_init_generic(t);
    t->name = "avx2";
    t->block_q = 96;
    t->block_k = 512;
    t->strip_rows = 6;
    t->linear_rows = MK_AVX2_LINEAR_ROWS;
    MK_SET_PREFILL(t, avx2, 6x16);
    MK_SET_DECODE(t, avx2);
    t->decode_heads = 1;
    MK_SET_WIDEN(t, avx2);
    MK_SET_NARROW(t, avx2);
    MK_SET_PEAK(t, avx2);
}
