/* The AVX512-BF16 table: avx512's (every CPU that runs it runs avx512),
 * plus the bf16 compute slots and avx512's decode kernels built with
 * AVX512-VBMI (E4M3 widened through byte lookups). The fp32 kernels, block sizes and the FMA
 * peak (the fp32 reference the benchmark reads bf16 rates against) stay
 * avx512's. */
#include "avx512/avx512.h"
#include "avx512bf16.h"

void mk_init_avx512bf16(mk_table *t)
{
    mk_init_avx512(t);
    t->name = "avx512bf16";
    MK_SET_HALF(t, MK_HALF_BF16, avx512bf16, bf16, 12x32);
    MK_SET_DECODE(t, avx512bf16);
    t->half[MK_HALF_BF16].softmax_update = mk_avx512bf16_softmax_update;
    t->half[MK_HALF_BF16].softmax_update_codes =
        mk_avx512bf16_softmax_update_codes;
    t->half[MK_HALF_BF16].pv_codes = mk_avx512bf16_pv_bf16_codes_12x32;
}
