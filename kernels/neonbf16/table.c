/* The NEON BF16 table: neonfhm's (the CPUs with FEAT_BF16 have FEAT_FHM
 * too; engine/cpu.c asks for both), plus the bf16 compute slots on BFDOT.
 * The fp32 kernels, block sizes and the bf16 path's softmax step stay
 * neon's (no shorter exp measured on AArch64 hardware yet: only qemu runs
 * it here). */
#include "neon/neon.h"
#include "neonbf16.h"

void mk_init_neonbf16(mk_table *t)
{
    mk_init_neonfhm(t);
    t->name = "neonbf16";
    MK_SET_HALF(t, MK_HALF_BF16, neonbf16, bf16, 8x8);
    t->half[MK_HALF_BF16].softmax_update = mk_neon_softmax_update;
}
