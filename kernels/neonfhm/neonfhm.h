/* The NEON FHM kernels: the f16 compute slots table.c adds to the neon
 * table. Not installed; no ISA types here. */
#ifndef MK_NEONFHM_H
#define MK_NEONFHM_H

#include "table_init.h"

MK_DECLARE_HALF(neonfhm, f16, 8x8);

#endif
