/* The NEON BF16 table: neon's (every CPU that runs it runs neon), plus the
 * bf16 compute slots on BFDOT. The fp32 kernels, block sizes and the bf16
 * path's softmax step stay neon's (no shorter exp measured on AArch64
 * hardware yet: only qemu runs it here). */
#include "neon/neon.h"
#include "neonbf16.h"

void mk_init_neonbf16(mk_table *t)
{
    mk_init_neon(t);
    t->name = "neonbf16";
    MK_SET_BF16(t, neonbf16, 8x8);
    t->softmax_update_bf16 = mk_neon_softmax_update;
}
