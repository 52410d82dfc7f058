/* The engines of tables the tests emulate (util.h): the amxbf16 kernels
 * over emulated tiles (kernels/amxbf16/tiles.h), on avx512bf16's table.
 * In test_mha only: it reaches the engine's table (engine.h). */
#include "util.h"

#include "engine.h"
#ifdef MHA_TEST_AMX_EMULATED
#include "amxbf16/amxbf16.h"
#endif

int emulated_engines(void)
{
#ifdef MHA_TEST_AMX_EMULATED
    return mha_isa_available(MHA_ISA_AVX512_BF16);
#else
    return 0;
#endif
}

/* avx512bf16's engine with the amxbf16 slots over emulated tiles. */
mha_engine *make_emulated_engine(int nthreads)
{
    ck_assert_msg(emulated_engines() == 1, "no emulated table here");
    mha_engine *e = make_engine(MHA_ISA_AVX512_BF16, nthreads);
#ifdef MHA_TEST_AMX_EMULATED
    mk_init_amxemu(&e->kernels);
#endif
    return e;
}

mha_engine *make_walk_engine(int i, const mha_isa *isas, int n_isas,
                             int nthreads)
{
    return i < n_isas ? make_engine(isas[i], nthreads)
                      : make_emulated_engine(nthreads);
}

const char *walk_isa_name(int i, const mha_isa *isas, int n_isas)
{
    return i < n_isas ? mha_isa_name(isas[i]) : EMULATED_ISA_NAME;
}
