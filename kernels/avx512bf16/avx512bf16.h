/* The AVX512-BF16 kernels: the bf16 compute slots table.c adds to the
 * avx512 table. Not installed; no ISA types here. */
#ifndef MK_AVX512BF16_H
#define MK_AVX512BF16_H

#include "table_init.h"

mk_pack_bf16_fn mk_avx512bf16_pack_bf16;
mk_qk_bf16_fn mk_avx512bf16_qk_bf16_12x32;
mk_packed_floats_fn mk_avx512bf16_packed_v_bf16_floats;
mk_pack_v_bf16_fn mk_avx512bf16_pack_v_bf16;
mk_pv_bf16_fn mk_avx512bf16_pv_bf16_12x32;
mk_softmax_update_fn mk_avx512bf16_softmax_update;
mk_normalize_fn mk_avx512bf16_normalize;

#endif
