/* The AVX-512 kernels (F/BW/VL/DQ with FMA and F16C): the instances
 * table.c puts in the avx512 table. Not installed; no
 * ISA types here, so any file may include it. pack (pack.c) lays the
 * transpose of x out as panels of 32 columns: x[32q + j][p] at
 * 32*k*q + 32*p + j, zeros past n. */
#ifndef MK_AVX512_H
#define MK_AVX512_H

#include "table_init.h"

/* The fewest rows of one kv head decode_pv takes through the wide P.V's
 * passes (decode.c, SEG_ROWS); the table's head_rows_f32 too. */
#define MK_AVX512_SEG_ROWS 6

MK_DECLARE_PREFILL(avx512, 12x32);
MK_DECLARE_DECODE(avx512);
MK_DECLARE_WIDEN(avx512);
MK_DECLARE_NARROW(avx512);
MK_DECLARE_PEAK(avx512);

#endif
