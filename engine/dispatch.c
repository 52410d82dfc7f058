/* Picks a kernel table: the config's ISA, else MHA_ISA from the
 * environment, else the best the build and the CPU offer. */
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "engine.h"


const char *mha_isa_name(mha_isa isa)
{
    switch (isa) {
    case MHA_ISA_AUTO: return "auto";
    case MHA_ISA_GENERIC: return "generic";
    case MHA_ISA_AVX2: return "avx2";
    case MHA_ISA_NEON: return "neon";
    case MHA_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

/* The ISA's table initialiser, NULL when the build lacks it. */
typedef void table_init(mk_table *t);
static table_init *isa_init(mha_isa isa)
{
    switch (isa) {
    case MHA_ISA_GENERIC: return mk_init_generic;
#ifdef MHA_HAVE_AVX2
    case MHA_ISA_AVX2: return mk_init_avx2;
#endif
#ifdef MHA_HAVE_NEON
    case MHA_ISA_NEON: return mk_init_neon;
#endif
#ifdef MHA_HAVE_AVX512
    case MHA_ISA_AVX512: return mk_init_avx512;
#endif
    default: return NULL;
    }
}

static int cpu_runs(mha_isa isa)
{
    switch (isa) {
    case MHA_ISA_GENERIC: return 1;
    case MHA_ISA_AVX2: return mha_cpu_has_avx2_fma();
    case MHA_ISA_NEON: return mha_cpu_has_neon();
    case MHA_ISA_AVX512: return mha_cpu_has_avx512();
    default: return 0;
    }
}

static mha_status isa_from_env(mha_isa *isa)
{
    const char *env = getenv("MHA_ISA");
    *isa = MHA_ISA_AUTO;
    if (!env || !*env || strcmp(env, "auto") == 0)
        return MHA_OK;
    const mha_isa known[] = {MHA_ISA_GENERIC, MHA_ISA_AVX2, MHA_ISA_NEON,
                             MHA_ISA_AVX512};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(env, mha_isa_name(known[i])) == 0) {
            *isa = known[i];
            return MHA_OK;
        }
    return mha_fail(MHA_ERR_UNSUPPORTED,
                    "MHA_ISA=%.32s is not one of generic, avx2, avx512, "
                    "neon, auto",
                    env);
}

mha_status mha_dispatch(mha_isa isa, mha_isa *picked, mk_table *table)
{
    if (isa == MHA_ISA_AUTO) {
        mha_status st = isa_from_env(&isa);
        if (st != MHA_OK)
            return st;
    }
    if (isa == MHA_ISA_AUTO) {
        const mha_isa best_first[] = {MHA_ISA_AVX512, MHA_ISA_AVX2,
                                      MHA_ISA_NEON, MHA_ISA_GENERIC};
        for (size_t i = 0; i < sizeof best_first / sizeof best_first[0]; i++)
            if (isa_init(best_first[i]) && cpu_runs(best_first[i])) {
                isa = best_first[i];
                break;
            }
    }
    if ((int)isa < (int)MHA_ISA_GENERIC || (int)isa > (int)MHA_ISA_AVX512)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "config.isa (%d) is not an mha_isa (generic 1, avx2 "
                        "2, neon 3, avx512 4)",
                        (int)isa);
    table_init *init = isa_init(isa);
    if (!init)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "ISA %s is not compiled into this build",
                        mha_isa_name(isa));
    if (!cpu_runs(isa))
        return mha_fail(MHA_ERR_UNSUPPORTED, "this CPU cannot run ISA %s",
                        mha_isa_name(isa));
    init(table);
    *picked = isa;
    return MHA_OK;
}

mha_status mha_engine_create(const mha_config *config, mha_engine **engine)
{
    if (!engine)
        return mha_fail(MHA_ERR_NULL_POINTER, "engine (output) is NULL");
    mha_config cfg = {0, MHA_ISA_AUTO};
    if (config)
        cfg = *config;
    if (cfg.num_threads < 0)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "config.num_threads (%d) is negative",
                        cfg.num_threads);
    mk_table table;
    mha_isa picked;
    mha_status st = mha_dispatch(cfg.isa, &picked, &table);
    if (st != MHA_OK)
        return st;
    mha_engine *e = mha_alloc(sizeof *e);
    if (!e)
        return mha_fail(MHA_ERR_OUT_OF_MEMORY, "engine allocation failed");
    e->isa = picked;
    e->num_threads = cfg.num_threads;
    e->kernels = table;
    *engine = e;
    return MHA_OK;
}

void mha_engine_destroy(mha_engine *engine) { mha_free(engine); }

mha_isa mha_engine_isa(const mha_engine *engine)
{
    return engine ? engine->isa : MHA_ISA_AUTO;
}

int mha_engine_num_threads(const mha_engine *engine)
{
    return engine ? engine->num_threads : 0;
}

int mha_threads_for_call(const mha_engine *engine)
{
    int n = engine->num_threads > 0 ? engine->num_threads
                                    : omp_get_max_threads();
    return n > 0 ? n : 1;
}
