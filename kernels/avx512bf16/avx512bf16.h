/* The AVX512-BF16 kernels: the bf16 compute slots table.c adds to the
 * avx512 table, and its decode kernels (avx512's built with VBMI). Not installed; no ISA types here. */
#ifndef MK_AVX512BF16_H
#define MK_AVX512BF16_H

#include "table_init.h"

MK_DECLARE_HALF(avx512bf16, bf16, 12x32);
MK_DECLARE_DECODE(avx512bf16);
mk_softmax_update_fn mk_avx512bf16_softmax_update;
mk_normalize_fn mk_avx512bf16_normalize;
/* The codes pair (kernels.h): softmax_codes.c, attention.c. */
mk_softmax_update_fn mk_avx512bf16_softmax_update_codes;
mk_pv_half_fn mk_avx512bf16_pv_bf16_codes_12x32;
/* P's m rows (stride ldp floats) to bf16 codes in place, as pv_codes
 * reads them (kernels.h): codes j < n in a row's first 2n bytes, a zero
 * code after an odd n. The amxbf16 table's pv takes it too. */
void mk_avx512bf16_p_to_codes(float *p, ptrdiff_t ldp, int64_t m, int64_t n);

#endif
