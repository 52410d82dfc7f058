/* Engines: creation from a config, and the thread count of a call. */
#include <omp.h>

#include "engine.h"

mha_status mha_engine_create(const mha_config *config, mha_engine **engine)
{
    if (!engine)
        return mha_fail(MHA_ERR_NULL_POINTER, "engine (output) is NULL");
    mha_config cfg = {0, MHA_ISA_AUTO, 0};
    if (config)
        cfg = *config;
    if (cfg.num_threads < 0 || cfg.num_threads > MHA_MAX_THREADS)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "config.num_threads (%d) is outside [0, %d]",
                        cfg.num_threads, MHA_MAX_THREADS);
    if (cfg.flush_subnormals && !mha_fpenv_can_flush())
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "config.flush_subnormals: this CPU cannot flush "
                        "subnormal inputs");
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
    e->flush = cfg.flush_subnormals != 0;
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

/* The engine's count, or OpenMP's default clamped to MHA_MAX_THREADS
 * (libgomp overflows its stack on teams of ~100,000), and never more than
 * the call has work items: an idle thread costs a wake-up and a stack. */
int mha_threads_for_call(const mha_engine *engine, int64_t items)
{
    int n = engine->num_threads > 0 ? engine->num_threads
                                    : omp_get_max_threads();
    if (n > MHA_MAX_THREADS)
        n = MHA_MAX_THREADS;
    if (items < n)
        n = (int)items;
    return n > 0 ? n : 1;
}
