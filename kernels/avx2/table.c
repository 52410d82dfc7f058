/* The AVX2+FMA kernel table. Every slot is set. block_q is a multiple of
 * the 6-row tile and block_k of the 16-key panel. block_q = 144 amortises
 * packing each key block over more query rows than 96 (+2-3% on dense
 * prefill) while a causal mask still wastes little on the diagonal blocks
 * (dense-equivalent 1.81-1.83x the unmasked rate at L = 2048, 1.87x at 96);
 * block_k = 256 keeps the 144 x 256 score tile and the packed key block in
 * L2. */
#include "avx2.h"

const mk_table mk_table_avx2 = {
    .name = "avx2",
    .block_q = 144,
    .block_k = 256,
    .packed_k_floats = mk_avx2_packed_k_floats,
    .pack_k = mk_avx2_pack_k,
    .qk = mk_avx2fma_qk_6x16,
    .softmax_update = mk_avx2fma_softmax_update_8,
    .pv = mk_avx2fma_pv_6x16,
    .normalize = mk_avx2_normalize_8,
    .decode_qk = mk_avx2fma_decode_qk,
    .decode_pv = mk_avx2fma_decode_pv,
    .cvt_f16 = mk_f16c_cvt_f16_8,
    .cvt_bf16 = mk_avx2_cvt_bf16_8,
    .packed_w_floats = mk_avx2_packed_w_floats,
    .pack_w = mk_avx2_pack_w,
    .linear = mk_avx2fma_linear_6x16,
};
