/*
 * The machine's read bandwidth, the reference of the decode cases: a team
 * of threads sums a buffer larger than the last-level cache, each thread a
 * fixed contiguous share of it.
 *
 * Plain C without ISA flags: 8 independent accumulators of 128-bit vectors
 * (SSE2 on x86-64, Advanced SIMD on AArch64) keep enough loads in flight
 * that memory, not the adds, limits the loop, as it does for decode.
 */
#include <omp.h>
#include <stdlib.h>

#include "internal.h"
#include "shim.h"

typedef float bench_v4f __attribute__((vector_size(16)));

enum { ACCS = 8 };

/* 1 GiB: twice the largest last-level cache we run on (480 MiB). */
#define MEMBW_BYTES ((size_t)1 << 30)
#define MEMBW_VECS (MEMBW_BYTES / sizeof(bench_v4f))

static bench_v4f *membw_buf;

/* Keeps the sums observable. */
static volatile float membw_sink;

/* [begin, end) of thread `id`'s share among `n`, in whole steps of ACCS
 * vectors (MEMBW_VECS is a multiple of ACCS). */
static void membw_share(int id, int n, size_t *begin, size_t *end)
{
    const size_t steps = MEMBW_VECS / ACCS;
    *begin = steps * (size_t)id / (size_t)n * ACCS;
    *end = steps * (size_t)(id + 1) / (size_t)n * ACCS;
}

/* The first touch is by a team of `threads` with the shares of the measured
 * loop, so each page lands near the thread that reads it. Later calls,
 * whatever their thread count, reuse the buffer. */
int bench_membw_prepare(int threads)
{
    if (membw_buf != NULL)
        return 0;
    membw_buf = aligned_alloc(64, MEMBW_BYTES);
    if (membw_buf == NULL)
        return bench_fail("membw: cannot allocate %zu bytes", MEMBW_BYTES);
#pragma omp parallel num_threads(threads)
    {
        size_t begin, end;
        membw_share(omp_get_thread_num(), omp_get_num_threads(), &begin, &end);
        const bench_v4f one = {1.0f, 1.0f, 1.0f, 1.0f};
        for (size_t i = begin; i < end; ++i)
            membw_buf[i] = one;
    }
    return 0;
}

static float membw_sum(size_t begin, size_t end)
{
    bench_v4f acc[ACCS] = {{0.0f}};
    for (size_t i = begin; i < end; i += ACCS) {
        for (int a = 0; a < ACCS; ++a)
            acc[a] += membw_buf[i + (size_t)a];
    }
    bench_v4f total = acc[0];
    for (int a = 1; a < ACCS; ++a)
        total += acc[a];
    return total[0] + total[1] + total[2] + total[3];
}

double bench_membw_run(int threads)
{
    if (bench_membw_prepare(threads) != 0)
        return -1.0;
    float sink = 0.0f;
    /* Split by the team the runtime gave, so the whole buffer is read. */
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        size_t begin, end;
        membw_share(omp_get_thread_num(), omp_get_num_threads(), &begin, &end);
        sink += membw_sum(begin, end);
    }
    membw_sink = sink;
    return (double)MEMBW_BYTES;
}
