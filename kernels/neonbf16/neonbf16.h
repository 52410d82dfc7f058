/* The NEON BF16 kernels: the bf16 compute slots table.c adds to the
 * neonfhm table. Not installed; no ISA types here. */
#ifndef MK_NEONBF16_H
#define MK_NEONBF16_H

#include "table_init.h"

MK_DECLARE_HALF(neonbf16, bf16, 8x8);

#endif
