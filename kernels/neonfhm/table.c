/* The NEON FHM table: neon's (every CPU that runs it runs neon), plus the
 * f16 compute slots on FMLAL/FMLAL2. The fp32 kernels and block sizes stay
 * neon's, and so does the f16 path's softmax step: P is rounded to f16
 * (2^-12 relative) after it, so neon's exp (far finer) costs nothing in
 * accuracy, and no shorter exp has been measured on AArch64 hardware (only
 * qemu runs it here). */
#include "neon/neon.h"
#include "neonfhm.h"

void mk_init_neonfhm(mk_table *t)
{
    mk_init_neon(t);
    t->name = "neonfhm";
    MK_SET_HALF(t, MK_HALF_F16, neonfhm, f16, 8x8);
    t->half[MK_HALF_F16].softmax_update = mk_neon_softmax_update;
}
