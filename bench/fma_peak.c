/* The measured peak: each ISA's multiply-add chains on a team of threads. */
#include <omp.h>

#include "internal.h"
#include "shim.h"

typedef float (*chains_fn)(int64_t iterations);

/* Keeps the chains' results observable. */
static volatile float peak_sink;

double bench_fma_peak_run(mha_isa isa, int threads, int64_t iterations)
{
    chains_fn fn = NULL;
    double flops_per_iteration = 0.0;
    switch (isa) {
    case MHA_ISA_GENERIC:
        fn = bench_chains_generic;
        flops_per_iteration = bench_chains_generic_flops;
        break;
#if defined(MHA_BENCH_HAVE_CHAINS_AVX2)
    case MHA_ISA_AVX2:
        fn = bench_chains_avx2;
        flops_per_iteration = bench_chains_avx2_flops;
        break;
#endif
#if defined(MHA_BENCH_HAVE_CHAINS_AVX512)
    case MHA_ISA_AVX512:
        fn = bench_chains_avx512;
        flops_per_iteration = bench_chains_avx512_flops;
        break;
#endif
#if defined(MHA_BENCH_HAVE_CHAINS_NEON)
    case MHA_ISA_NEON:
        fn = bench_chains_neon;
        flops_per_iteration = bench_chains_neon_flops;
        break;
#endif
    default:
        return -1.0;
    }
    float sink = 0.0f;
    int ran = 0;
    /* Count the threads that really ran: the runtime may give fewer. */
#pragma omp parallel num_threads(threads) reduction(+ : sink, ran)
    {
        sink += fn(iterations);
        ran += 1;
    }
    peak_sink = sink;
    return (double)ran * (double)iterations * flops_per_iteration;
}
