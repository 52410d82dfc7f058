/* The AVX-512 kernel table. The decode slots stay NULL: the engine fills
 * them from the avx2 table (memory-bound kernels gain nothing from wider
 * registers). block_q is a multiple of the 12-row tile and block_k of the
 * 32-key panel. block_q 96..240 and block_k 128..512 measured alike
 * within the noise at (1,32,1024,1024,128), one thread; 144 x 256 keeps
 * the avx2 table's causal behaviour and a 144 KiB score tile in L2. */
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

const mk_table mk_table_avx512 = {
    .name = "avx512",
    .block_q = MK_AVX512_BLOCK_Q,
    .block_k = MK_AVX512_BLOCK_K,
    .packed_k_floats = mk_avx512_packed_k_floats,
    .pack_k = mk_avx512_pack_k,
    .qk = mk_avx512_qk_12x32,
    .softmax_update = mk_avx512_softmax_update_16,
    .pv = mk_avx512_pv_12x32,
    .normalize = mk_avx512_normalize_16,
    .cvt_f16 = mk_avx512_cvt_f16_16,
    .cvt_bf16 = mk_avx512_cvt_bf16_16,
    .packed_w_floats = mk_avx512_packed_w_floats,
    .pack_w = mk_avx512_pack_w,
    .linear = mk_avx512_linear_12x32,
};
