/* The AVX2+FMA kernels (F16C for binary16, which every AVX2 CPU has): the
 * instances table.c puts in the avx2 table. Not installed; no ISA types
 * here, so any file may include it. */
#ifndef MK_AVX2_H
#define MK_AVX2_H

#include "kernels.h"

/* pack.c: the transpose of x (n rows of depth k, row stride ldx) as panels
 * of 16 columns: x[16q + j][p] at 16*k*q + 16*p + j, zeros past n. */
mk_packed_floats_fn mk_avx2_packed_floats;
mk_pack_fn mk_avx2_pack;
/* attention.c */
mk_qk_fn mk_avx2_qk_6x16;
mk_softmax_update_fn mk_avx2_softmax_update;
mk_pv_fn mk_avx2_pv_6x16;
mk_normalize_fn mk_avx2_normalize;
/* decode.c */
mk_decode_qk_fn mk_avx2_decode_qk;
mk_decode_pv_fn mk_avx2_decode_pv;
/* convert.c */
mk_widen_fn mk_avx2_widen_f16, mk_avx2_widen_bf16;
/* linear.c */
mk_linear_fn mk_avx2_linear_6x16;
/* peak.c */
mk_fma_chains_fn mk_avx2_fma_chains;
extern const double mk_avx2_fma_chains_flops;

#endif
