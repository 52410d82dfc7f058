/* The measured peak: the FMA chains of an ISA's kernel table (the slot
 * fma_chains, kernels/<isa>/peak.c) on a team of threads, so a new ISA
 * brings its peak loop with its table and bench/ does not change. */
#include <omp.h>

#include "engine.h"
#include "internal.h"
#include "shim.h"

/* Keeps the chains' results observable. */
static volatile float peak_sink;

double bench_fma_peak_run(mha_isa isa, int threads, int64_t iterations)
{
    mk_table table;
    mha_isa picked;
    if (isa == MHA_ISA_AUTO || mha_dispatch(isa, &picked, &table) != MHA_OK)
        return -1.0;
    mk_fma_chains_fn *fn = table.fma_chains;
    float sink = 0.0f;
    int ran = 0;
    /* Count the threads that really ran: the runtime may give fewer. */
#pragma omp parallel num_threads(threads) reduction(+ : sink, ran)
    {
        sink += fn(iterations);
        ran += 1;
    }
    peak_sink = sink;
    return (double)ran * (double)iterations * table.fma_chains_flops;
}
