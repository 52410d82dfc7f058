/* The NEON kernels: the instances table.c puts in the neon table.
 * Internal. */
#ifndef MK_NEON_H
#define MK_NEON_H

#include "kernels.h"

/* gemm.c (mk_neon_pack: panels of MK_NEON_NR columns, gemm.h) */
mk_packed_floats_fn mk_neon_packed_floats;
mk_pack_fn mk_neon_pack;
/* attention.c */
mk_qk_fn mk_neon_qk_8x8;
mk_softmax_update_fn mk_neon_softmax_update;
mk_pv_fn mk_neon_pv_8x8;
mk_normalize_fn mk_neon_normalize;
/* decode.c */
mk_decode_qk_fn mk_neon_decode_qk;
mk_decode_pv_fn mk_neon_decode_pv;
/* convert.c */
mk_widen_fn mk_neon_widen_f16, mk_neon_widen_bf16;
/* linear.c */
mk_linear_fn mk_neon_linear_8x8;
/* peak.c */
mk_fma_chains_fn mk_neon_fma_chains;
extern const double mk_neon_fma_chains_flops;

#endif
