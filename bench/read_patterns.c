/*
 * The read patterns of decode without its arithmetic: how fast this
 * machine reads K and V bytes in the orders the decode kernels read them,
 * each against a plain stream over the same bytes in the same process.
 * It tells a kernel's limit from the pattern's (docs/benchmarks.md,
 * twenty-fifth session).
 *
 *   read_patterns [--threads N] [--rounds R] [--mib M]
 *
 * K and V are M MiB each (default 256, past any last-level cache we run
 * on), seen as positions of 16 KiB: 32 kv heads of 128 fp32 elements, a
 * [B, L, H, D] cache's position. Every pattern sums every byte once:
 *
 *   stream      each block of 64 positions: its K, then its V, front to
 *               back (the reference)
 *   bhsd        32 KiB of K, then the same 32 KiB of V (one head's block
 *               of 64 keys in a [B, H, L, D] cache), on through both
 *   blhd        blocks of 64 positions: their K whole, then their V
 *               (one pass of every head across a position)
 *   blhd2       the same blocks read in two passes: the first 8 KiB of
 *               each position (16 heads), then the second 8 KiB, K then V
 *               (what the decode kernels do where a 32 KiB L1 cannot hold
 *               32 heads' queries beside a position's run)
 *   blhd2-fetch blhd2 with each line fetched into L2 two positions ahead
 *               (__builtin_prefetch, locality 2) as the one in use is read
 *   blhd2-sub16 two passes over 16 positions at a time, the first pass
 *               fetching whole positions (both halves) two ahead, the
 *               second none: its halves should still be in L2
 *   blhd2-pages blhd2 fetching only the first 4 lines of each 4 KiB page
 *               two positions ahead, to start the hardware prefetchers
 *   blhd-x8     blocks of 8 positions read head by head: a head's 512
 *               bytes of each of the 8, then the next head's (the decode
 *               kernels' loop head by head, kernels/decode_heads.h)
 *   blhd-x8f    blhd-x8 with each head's run fetched into L2 8 positions
 *               ahead as it is read (what the kernels do)
 *   blhd-x4f, blhd-x16f   the same over 4 or 16 positions, fetched 4 or 16
 *               positions ahead
 *
 * A team of N threads splits each pattern's blocks (static shares).
 * Rounds run the patterns in rotating order; medians of the rates and of
 * each pattern's ratio to stream in the same round are printed.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef float v4f __attribute__((vector_size(16)));

enum { POS = 16384, HALF = POS / 2, BLOCK = 64, AHEAD = 2, PATTERNS = 11,
       SUB = 16, PAGE = 4096, HEAD = 512,
       MAX_ROUNDS = 1000 };

static const char *const NAMES[PATTERNS] = {
    "stream", "bhsd", "blhd", "blhd2", "blhd2-fetch", "blhd2-sub16",
    "blhd2-pages", "blhd-x8", "blhd-x4f", "blhd-x8f", "blhd-x16f"};

static volatile float sink;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The sum of bytes [0, n) of p (n a multiple of 128): 8 independent
 * accumulators, as membw.c, so memory rather than the adds bounds it.
 * Unless ahead is NULL, each step of 128 bytes also fetches into L2 the
 * next `lines` lines of ahead (2: the same bytes' lines; 4: a run twice
 * as long). */
static v4f sum_run_n(const char *p, size_t n, const char *ahead, int lines,
                     v4f acc)
{
    v4f a[8] = {{0.0f}};
    for (size_t i = 0; i < n; i += 128) {
        if (ahead)
            for (int l = 0; l < lines; l++)
                __builtin_prefetch(
                    ahead + (size_t)lines / 2 * i + 64 * (size_t)l, 0, 2);
        for (int x = 0; x < 8; x++) {
            v4f v;
            memcpy(&v, p + i + 16 * (size_t)x, sizeof v);
            a[x] += v;
        }
    }
    for (int x = 0; x < 8; x++)
        acc += a[x];
    return acc;
}

static v4f sum_run(const char *p, size_t n, const char *ahead, v4f acc)
{
    return sum_run_n(p, n, ahead, 2, acc);
}

/* One pattern over the blocks of 64 positions [b0, b1) of k and v. */
static v4f read_blocks(int pattern, const char *k, const char *v, size_t b0,
                       size_t b1, size_t positions)
{
    v4f acc = {0.0f};
    const size_t block = (size_t)BLOCK * POS;
    for (size_t b = b0; b < b1; b++) {
        const size_t p0 = b * BLOCK;
        switch (pattern) {
        case 0: /* stream: the block's bytes of K, then of V, in order */
        case 1: /* bhsd: the same bytes as 32 KiB runs, K then V */
        {
            const size_t run = pattern ? 32768 : block;
            for (size_t o = 0; o < block; o += run) {
                acc = sum_run(k + p0 * POS + o, run, NULL, acc);
                acc = sum_run(v + p0 * POS + o, run, NULL, acc);
            }
            break;
        }
        case 2: /* blhd: whole positions */
            for (int kv = 0; kv < 2; kv++)
                for (size_t p = p0; p < p0 + BLOCK; p++)
                    acc = sum_run((kv ? v : k) + p * POS, POS, NULL, acc);
            break;
        case 5: /* blhd2-sub16 */
            for (int kv = 0; kv < 2; kv++)
                for (size_t s0 = p0; s0 < p0 + BLOCK; s0 += SUB)
                    for (size_t half = 0; half < POS; half += HALF)
                        for (size_t p = s0; p < s0 + SUB; p++) {
                            const char *base = (kv ? v : k) + p * POS;
                            const char *ahead =
                                half == 0 && p + AHEAD < positions
                                    ? base + AHEAD * POS
                                    : NULL;
                            acc = sum_run_n(base + half, HALF, ahead, 4, acc);
                        }
            break;
        case 6: /* blhd2-pages */
            for (int kv = 0; kv < 2; kv++)
                for (size_t half = 0; half < POS; half += HALF)
                    for (size_t p = p0; p < p0 + BLOCK; p++) {
                        const char *x = (kv ? v : k) + p * POS + half;
                        for (size_t pg = 0; p + AHEAD < positions && pg < HALF;
                             pg += PAGE)
                            for (int l = 0; l < 4; l++)
                                __builtin_prefetch(
                                    x + AHEAD * POS + pg + 64 * l, 0, 2);
                        acc = sum_run(x, HALF, NULL, acc);
                    }
            break;
        case 7: /* blhd-x8, blhd-x4f, blhd-x8f, blhd-x16f */
        case 8:
        case 9:
        case 10: {
            const size_t x = pattern == 8 ? 4 : pattern == 10 ? 16 : 8;
            for (int kv = 0; kv < 2; kv++)
                for (size_t s0 = p0; s0 < p0 + BLOCK; s0 += x)
                    for (size_t h = 0; h < POS; h += HEAD)
                        for (size_t p = s0; p < s0 + x; p++) {
                            const char *run = (kv ? v : k) + p * POS + h;
                            const char *ahead =
                                pattern > 7 && p + x < positions
                                    ? run + x * POS
                                    : NULL;
                            acc = sum_run(run, HEAD, ahead, acc);
                        }
            break;
        }
        default: /* blhd2 and blhd2-fetch: half positions, two passes */
            for (int kv = 0; kv < 2; kv++)
                for (size_t half = 0; half < POS; half += HALF)
                    for (size_t p = p0; p < p0 + BLOCK; p++) {
                        const char *x = (kv ? v : k) + p * POS + half;
                        const char *ahead =
                            pattern == 4 && p + AHEAD < positions
                                ? x + AHEAD * POS
                                : NULL;
                        acc = sum_run(x, HALF, ahead, acc);
                    }
            break;
        }
    }
    return acc;
}

static double time_pattern(int pattern, const char *k, const char *v,
                           size_t positions, int threads)
{
    const size_t blocks = positions / BLOCK;
    const double t0 = now();
    float s = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : s)
    {
        const size_t id = (size_t)omp_get_thread_num(),
                     n = (size_t)omp_get_num_threads();
        v4f acc = read_blocks(pattern, k, v, blocks * id / n,
                              blocks * (id + 1) / n, positions);
        s += acc[0] + acc[1] + acc[2] + acc[3];
    }
    sink = s;
    return now() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

int main(int argc, char **argv)
{
    int threads = 1, rounds = 5;
    long mib = 256;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--threads") == 0)
            threads = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--mib") == 0)
            mib = atol(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: read_patterns [--threads N] [--rounds R] "
                    "[--mib M]\n");
            return 2;
        }
    }
    if (threads < 1 || rounds < 1 || rounds > MAX_ROUNDS || mib < 1 ||
        mib > 65536) {
        fprintf(stderr, "read_patterns: threads >= 1, rounds 1..%d, "
                        "mib 1..65536\n", MAX_ROUNDS);
        return 2;
    }
    /* whole blocks of 64 positions (1 MiB), at least one a thread */
    size_t bytes = (size_t)mib << 20;
    const size_t block = (size_t)BLOCK * POS;
    bytes = bytes / block * block;
    if (bytes < block * (size_t)threads)
        bytes = block * (size_t)threads;
    const size_t positions = bytes / POS;
    char *k = aligned_alloc(4096, bytes), *v = aligned_alloc(4096, bytes);
    if (!k || !v) {
        fprintf(stderr, "read_patterns: cannot allocate 2 x %zu bytes\n",
                bytes);
        return 1;
    }
    /* first touch by the team that reads them */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < bytes; i += 4096) {
        memset(k + i, 1, 4096);
        memset(v + i, 2, 4096);
    }
    static double rate[PATTERNS][MAX_ROUNDS], ratio[PATTERNS][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        double sec[PATTERNS];
        for (int x = 0; x < PATTERNS; x++) {
            const int pattern = (x + r) % PATTERNS;
            sec[pattern] = time_pattern(pattern, k, v, positions, threads);
        }
        for (int x = 0; x < PATTERNS; x++) {
            rate[x][r] = 2.0 * (double)bytes / sec[x] / 1e9;
            ratio[x][r] = sec[0] / sec[x];
        }
    }
    printf("read_patterns: K and V %zu MiB each, %d thread(s), %d round(s)\n",
           bytes >> 20, threads, rounds);
    for (int x = 0; x < PATTERNS; x++)
        printf("  %-12s %6.1f GB/s  %5.3f of stream\n", NAMES[x],
               median(rate[x], rounds), median(ratio[x], rounds));
    free(k);
    free(v);
    return 0;
}
