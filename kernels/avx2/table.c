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
    t->packed_floats = mk_avx2_packed_floats;
    t->pack = mk_avx2_pack;
    t->qk = mk_avx2_qk_6x16;
    t->softmax_update = mk_avx2_softmax_update;
    t->pv = mk_avx2_pv_6x16;
    t->normalize = mk_avx2_normalize;
    t->decode_qk = mk_avx2_decode_qk;
    t->decode_pv = mk_avx2_decode_pv;
    t->widen[MK_F16] = mk_avx2_widen_f16;
    t->widen[MK_BF16] = mk_avx2_widen_bf16;
    t->linear = mk_avx2_linear_6x16;
    t->fma_chains = mk_avx2_fma_chains;
    t->fma_chains_flops = mk_avx2_fma_chains_flops;
}
