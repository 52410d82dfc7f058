/*
 * Prefill whose scores sit far below their rows' maxima, against the same
 * call without: whether an exp that reaches the subnormal range, or a P·V
 * on subnormal P, slows a table down (x86 cores compute on subnormal
 * floats through microcode assists).
 *
 *   far_scores [--isa NAME] [--rounds R] B H L D
 *
 * One engine on one thread; q, k and v random in [-0.5, 0.5) as
 * [B, L, H, D]. Each round times one call of each case (order rotating)
 * and the medians are printed with the ratio to the plain call:
 *   plain    no mask
 *   -inf     a bias of 0 on and below the diagonal, -inf above it
 *   -95      a bias of 0 on the diagonal and -95 off it (P about e^-95,
 *            a subnormal float, unless the exp flushes it)
 *   -200     the same at -200 (an exp that underflows to 0)
 *   sub      no mask, every value subnormal (v times 2^-130): P·V's FMAs
 *            on subnormal inputs
 *   sub/ftz  the same on an engine with flush_subnormals, which reads
 *            them as 0
 * docs/benchmarks.md has the figures.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mha.h"

enum { CASES = 6, SUB = 4, MAX_ROUNDS = 1000 };

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    mha_isa isa = MHA_ISA_AUTO;
    int rounds = 7, i = 1;
    for (; i + 1 < argc && argv[i][0] == '-' && argv[i][1] == '-'; i += 2) {
        if (!strcmp(argv[i], "--isa")) {
            if (mha_isa_from_name(argv[i + 1], &isa) != MHA_OK) {
                fprintf(stderr, "far_scores: unknown ISA %s\n", argv[i + 1]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--rounds")) {
            rounds = atoi(argv[i + 1]);
        } else {
            break;
        }
    }
    if (argc - i != 4 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: far_scores [--isa NAME] [--rounds R] "
                        "B H L D\n");
        return 2;
    }
    const int64_t B = atoll(argv[i]), H = atoll(argv[i + 1]),
                  L = atoll(argv[i + 2]), D = atoll(argv[i + 3]);
    if (B < 1 || H < 1 || L < 1 || D < 1 || L > 65536) {
        fprintf(stderr,
                "far_scores: B, H, L, D must be positive, L <= 65536\n");
        return 2;
    }
    mha_config cfg = {.num_threads = 1, .isa = isa};
    mha_config flush = {.num_threads = 1, .isa = isa, .flush_subnormals = 1};
    mha_engine *e, *ef;
    if (mha_engine_create(&cfg, &e) != MHA_OK ||
        mha_engine_create(&flush, &ef) != MHA_OK) {
        fprintf(stderr, "far_scores: %s\n", mha_last_error());
        return 1;
    }
    const size_t nel = (size_t)(B * L * H * D);
    float *q = malloc(nel * sizeof *q), *k = malloc(nel * sizeof *k);
    float *v = malloc(nel * sizeof *v), *o = malloc(nel * sizeof *o);
    float *vsub = malloc(nel * sizeof *vsub);
    float *bias[CASES] = {NULL};
    for (int c = 1; c < SUB; c++)
        bias[c] = malloc((size_t)(L * L) * sizeof(float));
    if (!q || !k || !v || !o || !vsub || !bias[1] || !bias[2] || !bias[3]) {
        fprintf(stderr, "far_scores: out of memory\n");
        return 1;
    }
    uint32_t s = 12345; /* a linear congruential sequence in [-0.5, 0.5) */
    float *const fill[3] = {q, k, v};
    for (int x = 0; x < 3; x++)
        for (size_t j = 0; j < nel; j++) {
            s = s * 1664525u + 1013904223u;
            fill[x][j] = (float)(s >> 8) * 0x1p-24f - 0.5f;
        }
    for (size_t j = 0; j < nel; j++)
        vsub[j] = ldexpf(v[j], -130);
    for (int64_t r = 0; r < L; r++)
        for (int64_t c = 0; c < L; c++) {
            bias[1][r * L + c] = c > r ? -INFINITY : 0.0f;
            bias[2][r * L + c] = c == r ? 0.0f : -95.0f;
            bias[3][r * L + c] = c == r ? 0.0f : -200.0f;
        }
    static const char *const name[CASES] = {"plain", "-inf", "-95",
                                            "-200",  "sub",  "sub/ftz"};
    const mha_engine *on[CASES] = {e, e, e, e, e, ef};
    static double t[CASES][MAX_ROUNDS];
    mha_mask mask[CASES];
    mha_attention_args a[CASES];
    for (int c = 0; c < CASES; c++) {
        memset(&mask[c], 0, sizeof mask[c]);
        mask[c].bias = bias[c];
        mask[c].bias_stride_query = L;
        memset(&a[c], 0, sizeof a[c]);
        a[c].q = mha_tensor_bshd(q, B, L, H, D);
        a[c].k = mha_tensor_bshd(k, B, L, H, D);
        a[c].v = mha_tensor_bshd(c >= SUB ? vsub : v, B, L, H, D);
        a[c].out = mha_tensor_bshd(o, B, L, H, D);
        a[c].mask = c && c < SUB ? &mask[c] : NULL;
        if (mha_attention(on[c], &a[c]) != MHA_OK) { /* warm, checked */
            fprintf(stderr, "far_scores: %s\n", mha_last_error());
            return 1;
        }
    }
    for (int r = 0; r < rounds; r++)
        for (int j = 0; j < CASES; j++) {
            int c = (r + j) % CASES;
            double t0 = now();
            mha_attention(on[c], &a[c]);
            t[c][r] = now() - t0;
        }
    printf("far_scores (%lld,%lld,%lld,%lld) %s, 1 thread, %d rounds "
           "(median ms; / plain)\n",
           (long long)B, (long long)H, (long long)L, (long long)D,
           mha_isa_name(mha_engine_isa(e)), rounds);
    double plain = 0.0;
    for (int c = 0; c < CASES; c++) {
        qsort(t[c], (size_t)rounds, sizeof(double), cmp_double);
        double med = t[c][rounds / 2] * 1e3;
        if (c == 0)
            plain = med;
        printf("  %-7s %10.2f  %7.2f\n", name[c], med, med / plain);
    }
    for (int c = 0; c < CASES; c++)
        free(bias[c]);
    free(q), free(k), free(v), free(o), free(vsub);
    mha_engine_destroy(e);
    mha_engine_destroy(ef);
    return 0;
}
