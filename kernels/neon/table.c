/* The NEON kernel table: generic's, with every kernel but widen[MK_F32]
 * replaced (and narrow[], which generic leaves empty, set). Tiles are
 * multiples of the 8x8 register tile; a 64-key block of packed K at d =
 * 128 (32 KiB) and the 32 x 64 score tile (8 KiB) fit a 64 KiB L1D. */
#include "neon.h"

MK_DEFINE_PV_FINISH_COMPOSED(neon, 8x8)

void mk_init_neon(mk_table *t)
{
    mk_init_generic(t);
    t->name = "neon";
    t->block_q = 32;
    t->block_k = 64;
    t->strip_rows = 8;
    MK_SET_PREFILL(t, neon, 8x8);
    MK_SET_DECODE(t, neon);
    MK_SET_WIDEN(t, neon);
    MK_SET_NARROW(t, neon);
    MK_SET_PEAK(t, neon);
}
