/*
 * Issue 19's prefill and layer ratios in one process: the fp32 rate
 * against the FMA peak, N threads against one, and the bf16 and fp16
 * compute dtypes against fp32.
 *
 *   ratios [--isa NAME] [--threads N] [--rounds R] [--layer]
 *          [--json FILE] B H L D
 *
 * mha_bench runs each case (and the peak) in a process of its own, in
 * sequence, so on a shared host two rows can be minutes apart and each
 * carries that moment's load: 1-thread prefill moved 15-25% between
 * processes on Zen 3, more than the ratios the issue asks for
 * (docs/benchmarks.md). Here every variant is created once over the
 * inputs of mha_bench's cases (the shim), and each round times one batch
 * of each, in an order rotating round by round; the medians of the rates
 * and of the per-round ratios are printed with their quartiles, so a
 * slow moment slows the variants of one round alike. The variants:
 * the FMA peak on 1 and on N threads (the engine's table's chains, as
 * fma_peak/), attention (or, with --layer, the self-attention layer,
 * E = H * D) in fp32 on 1 and on N threads, and the bf16 compute dtype
 * (attention_bf16/, layer_bf16/) and, for attention, fp16 (attention_f16/)
 * on 1 thread, with K/V of that dtype as those kinds. Lq = Lk = L.
 * --json FILE appends the ratios' quartiles as one JSON object a run:
 * scripts/bench runs the prefill and layer shapes of the sweep so after
 * it and its report prints them (--quick: once, on a tiny shape, as a
 * smoke test).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "mha.h"
#include "shim.h"

enum { MAX_ROUNDS = 1000 };

/* The variants, in the order of the table printed. */
enum { PEAK1, PEAKN, F32_1, F32_N, BF16_1, F16_1, VARIANTS };

static int usage(void)
{
    fprintf(stderr, "usage: ratios [--isa NAME] [--threads N] [--rounds R] "
                    "[--layer] [--json FILE] B H L D\n");
    return 2;
}

/* One timed variant: a case of the shim, or the peak loop. */
typedef struct {
    const char *name;
    bench_case *c;   /* NULL: the peak loop (or a variant not run) */
    int peak_threads; /* > 0: the peak loop on that many threads */
    int reps;         /* calls (or peak iterations / peak_step) a batch */
    double flops;     /* of one call */
} variant;

/* Peak iterations per batch step (the chains' iterations of one call of
 * bench_fma_peak_run). */
#define PEAK_STEP 1000000

/* Runs one batch of v; returns its GFLOP/s, or -1 on failure. */
static double run_batch(const variant *v, mha_isa isa)
{
    const double t0 = bench_now();
    double flops = 0.0;
    if (v->peak_threads > 0) {
        flops = bench_fma_peak_run(isa, v->peak_threads,
                                   (int64_t)v->reps * PEAK_STEP);
        if (flops < 0.0)
            return -1.0;
    } else {
        for (int i = 0; i < v->reps; i++)
            if (bench_case_run(v->c) != 0)
                return -1.0;
        flops = v->flops * v->reps;
    }
    return flops / (bench_now() - t0) * 1e-9;
}

/* Batch sizes of about 60 ms (at least one call). */
static int calibrate(variant *v, mha_isa isa)
{
    v->reps = 1;
    const double t0 = bench_now();
    if (run_batch(v, isa) < 0.0)
        return -1;
    const double once = bench_now() - t0;
    v->reps = once > 0.0 && once < 0.06 ? (int)(0.06 / once) : 1;
    if (v->reps < 1)
        v->reps = 1;
    return 0;
}

int main(int argc, char **argv)
{
    mha_isa isa = MHA_ISA_AUTO;
    int threads = 2, rounds = 11, layer = 0, pos = 0;
    const char *json = NULL;
    long long dims[4];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--isa") && i + 1 < argc) {
            if (mha_isa_from_name(argv[++i], &isa) != MHA_OK)
                return usage();
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(a, "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (!strcmp(a, "--json") && i + 1 < argc) {
            json = argv[++i];
        } else if (!strcmp(a, "--layer")) {
            layer = 1;
        } else if (a[0] != '-' && pos < 4) {
            dims[pos++] = atoll(a);
        } else {
            return usage();
        }
    }
    if (pos != 4 || threads < 1 || threads > MHA_MAX_THREADS || rounds < 1 ||
        rounds > MAX_ROUNDS)
        return usage();
    for (int j = 0; j < 4; j++)
        if (dims[j] < 1 || dims[j] > ((long long)1 << 20))
            return usage();
    /* The ISA the cases run: AUTO resolved by an engine, so the peak is
     * that table's. */
    if (isa == MHA_ISA_AUTO) {
        mha_engine *e = NULL;
        mha_config config = {.num_threads = 1, .isa = MHA_ISA_AUTO};
        if (mha_engine_create(&config, &e) != MHA_OK) {
            fprintf(stderr, "ratios: mha_engine_create: %s\n",
                    mha_last_error());
            return 1;
        }
        isa = mha_engine_isa(e);
        mha_engine_destroy(e);
    }

    variant vs[VARIANTS] = {
        [PEAK1] = {.name = "fma_peak 1 thread", .peak_threads = 1},
        [PEAKN] = {.name = "fma_peak N threads", .peak_threads = threads},
        [F32_1] = {.name = "fp32 1 thread"},
        [F32_N] = {.name = "fp32 N threads"},
        [BF16_1] = {.name = "bf16 1 thread"},
        [F16_1] = {.name = "fp16 1 thread"},
    };
    const struct {
        int which, threads;
        mha_dtype dtype;
    } cases[] = {{F32_1, 1, MHA_F32},
                 {F32_N, threads, MHA_F32},
                 {BF16_1, 1, MHA_BF16},
                 {F16_1, 1, MHA_F16}};
    int status = 0;
    for (size_t x = 0; x < sizeof cases / sizeof cases[0]; x++) {
        /* The layer's compute dtypes are fp32 and bf16 (layer_bf16/). */
        if (layer && cases[x].dtype == MHA_F16)
            continue;
        bench_spec s = {.impl = layer ? BENCH_IMPL_LAYER
                                      : BENCH_IMPL_ATTENTION,
                        .batch = dims[0],
                        .heads = dims[1],
                        .kv_heads = dims[1],
                        .lq = dims[2],
                        .lk = dims[2],
                        .d = dims[3],
                        .kv_dtype = cases[x].dtype,
                        .compute = cases[x].dtype,
                        .isa = isa,
                        .threads = cases[x].threads};
        variant *v = &vs[cases[x].which];
        v->c = bench_case_create(&s);
        if (!v->c) {
            fprintf(stderr, "ratios: %s: %s\n", v->name, bench_error());
            status = 1;
            break;
        }
        v->flops = bench_spec_flops(&s);
    }
    static double rate[VARIANTS][MAX_ROUNDS];
    int runs[VARIANTS], n = 0;
    for (int w = 0; w < VARIANTS && status == 0; w++) {
        if (w != PEAK1 && w != PEAKN && !vs[w].c)
            continue;
        if (calibrate(&vs[w], isa) != 0) {
            fprintf(stderr, "ratios: %s failed: %s\n", vs[w].name,
                    bench_error());
            status = 1;
        }
        runs[n++] = w;
    }
    for (int r = 0; r < rounds && status == 0; r++)
        for (int x = 0; x < n && status == 0; x++) {
            const int w = runs[(r + x) % n];
            rate[w][r] = run_batch(&vs[w], isa);
            if (rate[w][r] < 0.0) {
                fprintf(stderr, "ratios: %s failed: %s\n", vs[w].name,
                            bench_error());
                status = 1;
            }
        }
    if (status == 0) {
        printf("ratios %s (%lld,%lld,%lld,%lld) %s, 1 and %d threads, "
               "%d rounds (GFLOP/s)\n",
               layer ? "layer" : "attention", dims[0], dims[1], dims[2],
               dims[3], mha_isa_name(isa), threads, rounds);
        /* The per-round ratios first: bench_quartile() sorts its input. */
        const struct {
            const char *name, *key; /* key: the JSON's */
            int num, den;
        } rs[] = {{"fp32 1 thread / fma_peak", "peak", F32_1, PEAK1},
                  {"fp32 N / 1 threads", "threads", F32_N, F32_1},
                  {"fma_peak N / 1 threads", "peak_threads", PEAKN, PEAK1},
                  {"bf16 / fp32, 1 thread", "bf16", BF16_1, F32_1},
                  {"fp16 / fp32, 1 thread", "f16", F16_1, F32_1}};
        static double ratio[sizeof rs / sizeof rs[0]][MAX_ROUNDS];
        for (size_t j = 0; j < sizeof rs / sizeof rs[0]; j++)
            for (int r = 0; r < rounds; r++)
                ratio[j][r] = rate[rs[j].num][r] / rate[rs[j].den][r];
        for (int x = 0; x < n; x++) {
            const int w = runs[x];
            printf("  %-26s %7.1f (quartiles %.1f-%.1f)\n", vs[w].name,
                   bench_quartile(rate[w], rounds, 2), bench_quartile(rate[w], rounds, 1),
                   bench_quartile(rate[w], rounds, 3));
        }
        FILE *f = json ? fopen(json, "a") : NULL;
        if (json && !f) {
            fprintf(stderr, "ratios: cannot append to %s\n", json);
            status = 1;
        }
        if (f)
            fprintf(f,
                    "{\"tool\": \"ratios\", \"kind\": \"%s\", "
                    "\"shape\": \"B%lld_H%lld_KV%lld_Lq%lld_Lk%lld_D%lld\", "
                    "\"isa\": \"%s\", \"threads\": %d, \"rounds\": %d, "
                    "\"ratios\": {",
                    layer ? "layer" : "attention", dims[0], dims[1], dims[1],
                    dims[2], dims[2], dims[3], mha_isa_name(isa), threads,
                    rounds);
        const char *sep = "";
        for (size_t j = 0; j < sizeof rs / sizeof rs[0]; j++) {
            if (!vs[rs[j].num].c && vs[rs[j].num].peak_threads == 0)
                continue;
            const double q1 = bench_quartile(ratio[j], rounds, 1),
                         q2 = bench_quartile(ratio[j], rounds, 2),
                         q3 = bench_quartile(ratio[j], rounds, 3);
            printf("  %-26s %7.3f (quartiles %.3f-%.3f)\n", rs[j].name, q2,
                   q1, q3);
            if (f)
                fprintf(f, "%s\"%s\": [%.4f, %.4f, %.4f]", sep, rs[j].key,
                        q1, q2, q3);
            sep = ", ";
        }
        if (f) {
            fprintf(f, "}}\n");
            fclose(f);
        }
    }
    for (int w = 0; w < VARIANTS; w++)
        bench_case_destroy(vs[w].c);
    return status;
}
