/* The AVX2+FMA kernel table: generic's, with every kernel but widen[MK_F32]
 * replaced. block_q is a multiple of the 6-row tile and block_k of the
 * 16-key panel. block_q = 144 amortises packing each key block over more
 * query rows than 96 while a causal mask still wastes little on the
 * diagonal blocks; block_k = 256 keeps the 144 x 256 score tile and the
 * packed key block in L2 (docs/design.md). */
#include "avx2.h"

void mk_init_avx2(mk_table *t)
{
    mk_init_generic(t);
    t->name = "avx2";
    t->block_q = 144;
    t->block_k = 256;
    t->strip_rows = 6;
    MK_SET_PREFILL(t, avx2, 6x16);
    MK_SET_DECODE(t, avx2);
    t->decode_heads = 1;
    MK_SET_WIDEN(t, avx2);
    MK_SET_PEAK(t, avx2);
}
