/* The AMX-BF16 table: avx512bf16's (every CPU with AMX-BF16 has
 * AVX512-BF16), with its bf16 Q·Kᵀ and P·V on tiles. Packing, the
 * softmax steps, decode and every fp32 or f16 slot stay avx512bf16's, and
 * so do the block sizes: 96 x 512 is three 32-row blocks of 16 32-key
 * panels. The layer's bf16 projections take the Q·Kᵀ slot
 * (engine/layer.c), so they run on tiles too. Built twice
 * (tiles.h): this is mk_init_amxbf16 or, in the tests' copy,
 * mk_init_amxemu. */
#include "amxbf16/amxbf16.h"
#include "amxbf16/tiles.h"
#include "avx512/avx512.h"
#include "avx512bf16/avx512bf16.h"

#ifdef MK_AMX_EMULATE
#define TABLE_NAME "amxbf16 (emulated)"
#define TABLE_INIT mk_init_amxemu
#else
#define TABLE_NAME "amxbf16"
#define TABLE_INIT mk_init_amxbf16
#endif

void TABLE_INIT(mk_table *t)
{
    mk_init_avx512bf16(t);
    t->name = TABLE_NAME;
    t->half[MK_HALF_BF16].qk = MK_AMX(qk_bf16_16x16);
    t->half[MK_HALF_BF16].pv = MK_AMX(pv_bf16_16x16);
    t->half[MK_HALF_BF16].pv_codes = MK_AMX(pv_bf16_codes_16x16);
}
