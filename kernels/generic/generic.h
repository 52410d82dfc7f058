/* The generic kernels: the instances table.c puts in the generic table.
 * pack (gemm.c) lays the transpose of x out as panels of MK_GENERIC_NR
 * columns (gemm.h). */
#ifndef MK_GENERIC_H
#define MK_GENERIC_H

#include "table_init.h"

MK_DECLARE_PREFILL(generic, 4x16);
MK_DECLARE_DECODE(generic);
MK_DECLARE_WIDEN(generic);
mk_widen_fn mk_generic_widen_f32;
/* The 8-bit codes to their unscaled values (every table's widen[] for
 * them: prefill widens a block once, so a SIMD twin would buy little). */
mk_widen_fn mk_generic_widen_i8, mk_generic_widen_fp8_e4m3,
    mk_generic_widen_fp8_e5m2;
MK_DECLARE_PEAK(generic);

#endif
