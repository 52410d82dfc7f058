/* The generic kernels: the instances table.c puts in the generic table
 * (their types are declared once in kernels.h). */
#ifndef MK_GENERIC_H
#define MK_GENERIC_H

#include "kernels.h"

mk_packed_floats_fn mk_generic_packed_floats; /* gemm.c */
mk_pack_fn mk_generic_pack;                   /* gemm.c */
mk_qk_fn mk_generic_qk_4x16;
mk_softmax_update_fn mk_generic_softmax_update;
mk_pv_fn mk_generic_pv_4x16;
mk_normalize_fn mk_generic_normalize;
mk_decode_qk_fn mk_generic_decode_qk;
mk_decode_pv_fn mk_generic_decode_pv;
mk_widen_fn mk_generic_widen_f32, mk_generic_widen_f16, mk_generic_widen_bf16;
mk_linear_fn mk_generic_linear_4x16;
mk_fma_chains_fn mk_generic_fma_chains;
extern const double mk_generic_fma_chains_flops;

#endif
