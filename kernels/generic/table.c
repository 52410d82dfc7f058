/* The generic kernel table: every slot set, the base of every other ISA's
 * table. Tiles are multiples of the 4x16 register tile of gemm.c. */
#include "generic.h"

MK_DEFINE_PV_FINISH_COMPOSED(generic, 4x16)

void mk_init_generic(mk_table *t)
{
    *t = (mk_table){
        .name = "generic",
        .block_q = 32,
        .block_k = 64,
        .strip_rows = 4,
        .linear_rows = 96,
        .decode_rows = MK_DECODE_ROWS,
        .packed_floats = mk_generic_packed_floats,
        .pack = mk_generic_pack,
        .qk = mk_generic_qk_4x16,
        .softmax_update = mk_generic_softmax_update,
        .pv = mk_generic_pv_4x16,
        .normalize = mk_generic_normalize,
        .pv_finish = mk_generic_pv_finish_4x16,
        .decode_qk = mk_generic_decode_qk,
        .decode_pv = mk_generic_decode_pv,
        .widen = {[MK_F32] = mk_generic_widen_f32,
                  [MK_F16] = mk_generic_widen_f16,
                  [MK_BF16] = mk_generic_widen_bf16,
                  [MK_I8] = mk_generic_widen_i8,
                  [MK_FP8_E4M3] = mk_generic_widen_fp8_e4m3,
                  [MK_FP8_E5M2] = mk_generic_widen_fp8_e5m2},
        .linear = mk_generic_linear_4x16,
        .fma_chains = mk_generic_fma_chains,
        .fma_chains_flops = mk_generic_fma_chains_flops,
    };
}
