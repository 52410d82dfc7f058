/* Shared by the C files of bench/; the driver sees only shim.h. */
#ifndef MHA_BENCH_INTERNAL_H
#define MHA_BENCH_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "mha.h"

/* Uniform in [-1, 1): a hash of (seed, index) (SplitMix64's finaliser),
 * so inputs do not depend on the thread count that fills them; shim.c's
 * inputs and layouts.c's caches. */
static inline float bench_value(uint64_t seed, size_t i)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15u + i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    z ^= z >> 31;
    return 2.0f * ((float)(z >> 40) * (1.0f / 16777216.0f)) - 1.0f;
}

/* Seconds on the monotonic clock: the hand-run tools' timer. */
static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline int bench_by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Quartile q (0, 1, 2 = median, 3, 4) of n values, sorted in place. */
static inline double bench_quartile(double *x, int n, int q)
{
    qsort(x, (size_t)n, sizeof *x, bench_by_value);
    return x[(n - 1) * q / 4];
}

/* shim.c: records a formatted message for bench_error(). Returns -1. */
int bench_fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* blas_baseline.c (built only with MHA_BENCH_HAVE_BLAS): the attention a C
 * user writes with OpenBLAS. Per (batch, head): S = scale * Q K^T by
 * cblas_sgemm, a row softmax (masked entries and fully masked rows as in
 * mha.h), O = P V by cblas_sgemm; OpenMP across batch x heads with OpenBLAS
 * held to one thread. Reads the tensors and scale of args (mask: only the
 * causal flag); scratch holds bench_blas_scratch_floats() floats. */
size_t bench_blas_scratch_floats(const mha_attention_args *args, int threads);
void bench_blas_attention(const mha_attention_args *args, mha_causal causal,
                          int threads, float *scratch);

#endif
