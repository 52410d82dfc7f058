/* The AMX-BF16 kernels: the bf16 compute slots (Q·Kᵀ, P·V and its codes
 * form; the layer's bf16 projections run on the same Q·Kᵀ kernel) that
 * table.c puts over the avx512bf16 table. Declared for both builds of
 * attention.c: mk_amxbf16_* (AMX instructions) and mk_amxemu_* (the
 * tests' emulation, tiles.h). Not installed; no ISA types here. */
#ifndef MK_AMXBF16_H
#define MK_AMXBF16_H

#include "table_init.h"

mk_qk_half_fn mk_amxbf16_qk_bf16_16x16, mk_amxemu_qk_bf16_16x16;
mk_pv_half_fn mk_amxbf16_pv_bf16_16x16, mk_amxemu_pv_bf16_16x16;
mk_pv_half_fn mk_amxbf16_pv_bf16_codes_16x16, mk_amxemu_pv_bf16_codes_16x16;
/* The emulated table (the tests' library only): avx512bf16's with the
 * emulated slots, named "amxbf16 (emulated)". */
void mk_init_amxemu(mk_table *t);

#endif
