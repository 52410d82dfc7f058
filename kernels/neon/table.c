/* The NEON kernel table: generic's, with every kernel but widen[MK_F32]
 * replaced. Tiles are multiples of the 8x8 register tile; a 64-key block
 * of packed K at d = 128 (32 KiB) and the 32 x 64 score tile (8 KiB) fit a
 * 64 KiB L1D. */
#include "neon.h"

void mk_init_neon(mk_table *t)
{
    mk_init_generic(t);
    t->name = "neon";
    t->block_q = 32;
    t->block_k = 64;
    t->packed_floats = mk_neon_packed_floats;
    t->pack = mk_neon_pack;
    t->qk = mk_neon_qk_8x8;
    t->softmax_update = mk_neon_softmax_update;
    t->pv = mk_neon_pv_8x8;
    t->normalize = mk_neon_normalize;
    t->decode_qk = mk_neon_decode_qk;
    t->decode_pv = mk_neon_decode_pv;
    t->widen[MK_F16] = mk_neon_widen_f16;
    t->widen[MK_BF16] = mk_neon_widen_bf16;
    t->linear = mk_neon_linear_8x8;
    t->fma_chains = mk_neon_fma_chains;
    t->fma_chains_flops = mk_neon_fma_chains_flops;
}
