/* The NEON kernels: the instances table.c puts in the neon table. pack
 * (gemm.c) lays the transpose of x out as panels of MK_NEON_NR columns
 * (gemm.h). Internal. */
#ifndef MK_NEON_H
#define MK_NEON_H

#include "table_init.h"

MK_DECLARE_PREFILL(neon, 8x8);
MK_DECLARE_DECODE(neon);
MK_DECLARE_WIDEN(neon);
MK_DECLARE_NARROW(neon);
MK_DECLARE_PEAK(neon);

#endif
