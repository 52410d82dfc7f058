/* The AVX-512 kernel table: avx2's (every CPU that runs it runs avx2),
 * with the compute kernels replaced. The decode kernels stay avx2's:
 * memory-bound kernels gain nothing from wider registers. block_q is a
 * multiple of the 12-row tile and block_k of the 32-key panel; 144 x 256
 * keeps the avx2 table's causal behaviour and a 144 KiB score tile in L2
 * (other sizes ran alike: docs/design.md). */
#include "avx512.h"
#include "tile.h"

#ifndef MK_AVX512_BLOCK_Q
#define MK_AVX512_BLOCK_Q 144
#endif
#ifndef MK_AVX512_BLOCK_K
#define MK_AVX512_BLOCK_K 256
#endif
_Static_assert(MK_AVX512_BLOCK_K % MK_AVX512_NR == 0,
               "block_k is a multiple of the packing panel");

void mk_init_avx512(mk_table *t)
{
    mk_init_avx2(t);
    t->name = "avx512";
    t->block_q = MK_AVX512_BLOCK_Q;
    t->block_k = MK_AVX512_BLOCK_K;
    t->packed_floats = mk_avx512_packed_floats;
    t->pack = mk_avx512_pack;
    t->qk = mk_avx512_qk_12x32;
    t->softmax_update = mk_avx512_softmax_update;
    t->pv = mk_avx512_pv_12x32;
    t->normalize = mk_avx512_normalize;
    t->widen[MK_F16] = mk_avx512_widen_f16;
    t->widen[MK_BF16] = mk_avx512_widen_bf16;
    t->linear = mk_avx512_linear_12x32;
    t->fma_chains = mk_avx512_fma_chains;
    t->fma_chains_flops = mk_avx512_fma_chains_flops;
}
