/* The AVX-512 kernels (F/BW/VL/DQ with FMA and F16C): the instances
 * table.c puts in the avx512 table. Not installed; no ISA types here, so
 * any file may include it. */
#ifndef MK_AVX512_H
#define MK_AVX512_H

#include "kernels.h"

/* pack.c: the transpose of x (n rows of depth k, row stride ldx) as panels
 * of 32 columns: x[32q + j][p] at 32*k*q + 32*p + j, zeros past n. */
mk_packed_floats_fn mk_avx512_packed_floats;
mk_pack_fn mk_avx512_pack;
/* attention.c */
mk_qk_fn mk_avx512_qk_12x32;
mk_softmax_update_fn mk_avx512_softmax_update;
mk_pv_fn mk_avx512_pv_12x32;
mk_normalize_fn mk_avx512_normalize;
/* convert.c */
mk_widen_fn mk_avx512_widen_f16, mk_avx512_widen_bf16;
/* linear.c */
mk_linear_fn mk_avx512_linear_12x32;
/* peak.c */
mk_fma_chains_fn mk_avx512_fma_chains;
extern const double mk_avx512_fma_chains_flops;

#endif
