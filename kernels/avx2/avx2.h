/* The AVX2+FMA kernels (F16C for binary16, which every AVX2 CPU has): the
 * instances table.c puts in the avx2 table. Not installed; no ISA types
 * here, so any file may include it. pack (pack.c) lays the transpose of x
 * out as panels of 16 columns: x[16q + j][p] at 16*k*q + 16*p + j, zeros
 * past n. */
#ifndef MK_AVX2_H
#define MK_AVX2_H

#include "table_init.h"

/* The linear's row block (MK_TD_LINEAR_MC) and the table's linear_rows:
 * a projection's weights stream from L3 or memory once a row block, so
 * 192 rows stream them half as often as 96 (docs/design.md,
 * "Kernel contract"). */
#define MK_AVX2_LINEAR_ROWS 192

MK_DECLARE_PREFILL(avx2, 6x16);
MK_DECLARE_DECODE(avx2);
MK_DECLARE_WIDEN(avx2);
MK_DECLARE_NARROW(avx2);
MK_DECLARE_PEAK(avx2);

#endif
