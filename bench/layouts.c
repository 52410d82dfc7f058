/*
 * Decode from a [B, L, H, D] cache against a [B, H, L, D] one, over the
 * same bytes, in one process: issue 19's layout ratio without the
 * placement of two buffers in it.
 *
 *   layouts [--isa NAME] [--threads N] [--rounds R] [--dtype f32|f16|bf16]
 *           [--huge] [--lq N] [--json FILE] B H KV LK D
 *
 * mha_bench gives each case buffers of its own. On 4 KiB pages under a
 * hypervisor where a buffer's pages land moved its decode rate by up to
 * 15% (Zen 4), so two cases' ratio carried that too (docs/benchmarks.md).
 * Here one K and one V buffer are read as both layouts (the same bytes,
 * other numbers: only the rate is of interest), alternating batch by
 * batch with the summing loop of membw.c, which reads its own 1 GiB: each
 * round times a batch of each (order rotating), and the medians of the
 * rates and of the per-round ratios are printed with their quartiles.
 * --huge advises the K/V buffers onto 2 MiB pages (madvise; where the
 * system allows them). --lq N reads N queries a sequence (a speculative
 * decode step; bottom-right causal) instead of 1. --json FILE appends
 * the ratios' quartiles as one JSON object a run: scripts/bench runs the
 * decode shapes of issue 19 so after its sweep and its report prints them
 * (--quick: once, on a tiny shape, as a smoke test).
 */
#define _DEFAULT_SOURCE /* madvise */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "internal.h"
#include "mha.h"
#include "shim.h"

enum { MAX_ROUNDS = 1000 };

/* A buffer of bytes, 2 MiB aligned and advised onto huge pages when huge
 * (a hint), else 64-byte aligned. NULL on failure. */
static void *buffer(size_t bytes, int huge)
{
    const size_t align = huge ? (size_t)2 << 20 : 64;
    if (bytes > SIZE_MAX - align)
        return NULL;
    const size_t whole = (bytes + align - 1) / align * align;
    void *p = aligned_alloc(align, whole > 0 ? whole : align);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p != NULL && huge)
        (void)madvise(p, whole, MADV_HUGEPAGE);
#endif
    return p;
}

/* n elements of dtype t from the hash, in chunks through fp32. */
static void fill(void *x, mha_dtype t, size_t n, uint64_t seed)
{
    float chunk[1024];
    for (size_t i0 = 0; i0 < n; i0 += 1024) {
        size_t m = n - i0 < 1024 ? n - i0 : 1024;
        for (size_t i = 0; i < m; i++)
            chunk[i] = bench_value(seed, i0 + i);
        if (t == MHA_F32)
            memcpy((float *)x + i0, chunk, m * sizeof *chunk);
        else if (t == MHA_F16)
            mha_f32_to_f16(chunk, m, (uint16_t *)x + i0);
        else
            mha_f32_to_bf16(chunk, m, (uint16_t *)x + i0);
    }
}

static int usage(void)
{
    fprintf(stderr, "usage: layouts [--isa NAME] [--threads N] [--rounds R] "
                    "[--dtype f32|f16|bf16] [--huge] [--lq N] "
                    "[--json FILE] B H KV LK D\n");
    return 2;
}

int main(int argc, char **argv)
{
    mha_isa isa = MHA_ISA_AUTO;
    int threads = 1, rounds = 15, huge = 0, pos = 0, lq = 1;
    const char *json = NULL;
    mha_dtype t = MHA_F32;
    long long dims[5];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--isa") && i + 1 < argc) {
            if (mha_isa_from_name(argv[++i], &isa) != MHA_OK)
                return usage();
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(a, "--rounds") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (!strcmp(a, "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            if (!strcmp(d, "f32"))
                t = MHA_F32;
            else if (!strcmp(d, "f16"))
                t = MHA_F16;
            else if (!strcmp(d, "bf16"))
                t = MHA_BF16;
            else
                return usage();
        } else if (!strcmp(a, "--lq") && i + 1 < argc) {
            lq = atoi(argv[++i]);
        } else if (!strcmp(a, "--json") && i + 1 < argc) {
            json = argv[++i];
        } else if (!strcmp(a, "--huge")) {
            huge = 1;
        } else if (a[0] != '-' && pos < 5) {
            dims[pos++] = atoll(a);
        } else {
            return usage();
        }
    }
    if (pos != 5 || threads < 1 || rounds < 1 || rounds > MAX_ROUNDS ||
        lq < 1 || lq > 4096)
        return usage();
    const int64_t B = dims[0], H = dims[1], KV = dims[2], LK = dims[3],
                  D = dims[4];
    /* Each size bounded first, so the product cannot overflow; the K/V
     * elements at most 2^34. */
    if (B < 1 || H < 1 || KV < 1 || LK < 1 || D < 1 || B > 4096 ||
        H > 4096 || KV > H || LK > ((int64_t)1 << 24) || D > 4096 ||
        H % KV != 0 || B * LK * KV * D > ((int64_t)1 << 34))
        return usage();
    const size_t es = mha_dtype_size(t);
    const size_t nq = (size_t)(B * lq * H * D),
                 nk = (size_t)(B * LK * KV * D);
    float *q = buffer(nq * sizeof(float), 0);
    float *out = buffer(nq * sizeof(float), 0);
    void *k = buffer(nk * es, huge), *v = buffer(nk * es, huge);
    if (!q || !out || !k || !v || bench_membw_prepare(threads) != 0) {
        fprintf(stderr, "layouts: out of memory\n");
        return 1;
    }
    fill(q, MHA_F32, nq, 1);
    fill(k, t, nk, 2);
    fill(v, t, nk, 3);

    /* args[0]: the cache as [B, L, H, D]; args[1]: the same bytes as
     * [B, H, L, D]. */
    mha_attention_args args[2];
    mha_mask mask = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    for (int l = 0; l < 2; l++) {
        memset(&args[l], 0, sizeof args[l]);
        args[l].q = mha_tensor_bshd(q, B, lq, H, D);
        args[l].out = mha_tensor_bshd(out, B, lq, H, D);
        args[l].mask = lq > 1 ? &mask : NULL;
        args[l].k = l ? mha_tensor_bhsd(k, B, LK, KV, D)
                      : mha_tensor_bshd(k, B, LK, KV, D);
        args[l].v = l ? mha_tensor_bhsd(v, B, LK, KV, D)
                      : mha_tensor_bshd(v, B, LK, KV, D);
        args[l].k.dtype = args[l].v.dtype = t;
    }
    mha_config config = {.num_threads = threads, .isa = isa};
    mha_engine *e = NULL;
    if (mha_engine_create(&config, &e) != MHA_OK) {
        fprintf(stderr, "layouts: mha_engine_create: %s\n", mha_last_error());
        return 1;
    }
    isa = mha_engine_isa(e); /* AUTO resolved, for the lines printed */
    for (int w = 0; w < 3; w++)
        for (int l = 0; l < 2; l++)
            if (mha_attention(e, &args[l]) != MHA_OK) {
                fprintf(stderr, "layouts: mha_attention: %s\n",
                        mha_last_error());
                return 1;
            }
    /* Calls per batch: about 50 ms of the first layout. */
    int reps = 0;
    for (double t0 = bench_now(); bench_now() - t0 < 0.05; reps++)
        (void)mha_attention(e, &args[0]);

    const double bytes = 2.0 * (double)nk * (double)es;
    static double rate[3][MAX_ROUNDS], ratio[3][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        for (int s = 0; s < 3; s++) {
            const int which = (r + s) % 3; /* 0, 1: layouts; 2: membw */
            const double t0 = bench_now();
            if (which == 2) {
                const double read = bench_membw_run(threads);
                rate[2][r] = read / (bench_now() - t0) * 1e-9;
                continue;
            }
            for (int i = 0; i < reps; i++)
                (void)mha_attention(e, &args[which]);
            rate[which][r] = bytes * reps / (bench_now() - t0) * 1e-9;
        }
        ratio[0][r] = rate[0][r] / rate[1][r];
        ratio[1][r] = rate[0][r] / rate[2][r];
        ratio[2][r] = rate[1][r] / rate[2][r];
    }
    printf("layouts %s (%lld,%lld,%lld,%d,%lld,%lld) %s, %d thread(s), "
           "%d rounds%s\n",
           mha_dtype_name(t), (long long)B, (long long)H, (long long)KV, lq,
           (long long)LK, (long long)D, mha_isa_name(isa), threads, rounds,
           huge ? ", K/V on 2 MiB pages (advised)" : "");
    const char *names[3] = {"[B, L, H, D]", "[B, H, L, D]", "membw"};
    for (int j = 0; j < 3; j++)
        printf("  %-13s %6.1f GB/s (quartiles %.1f-%.1f)\n", names[j],
               bench_quartile(rate[j], rounds, 2), bench_quartile(rate[j], rounds, 1),
               bench_quartile(rate[j], rounds, 3));
    const char *rnames[3] = {"BLHD / BHSD", "BLHD / membw", "BHSD / membw"};
    const char *keys[3] = {"blhd_bhsd", "blhd_membw", "bhsd_membw"};
    FILE *f = json ? fopen(json, "a") : NULL;
    if (f)
        fprintf(f,
                "{\"tool\": \"layouts\", \"dtype\": \"%s\", "
                "\"shape\": \"B%lld_H%lld_KV%lld_Lq%d_Lk%lld_D%lld\", "
                "\"isa\": \"%s\", \"threads\": %d, \"rounds\": %d, "
                "\"ratios\": {",
                mha_dtype_name(t), (long long)B, (long long)H, (long long)KV,
                lq, (long long)LK, (long long)D, mha_isa_name(isa), threads,
                rounds);
    for (int j = 0; j < 3; j++) {
        const double q1 = bench_quartile(ratio[j], rounds, 1),
                     q2 = bench_quartile(ratio[j], rounds, 2),
                     q3 = bench_quartile(ratio[j], rounds, 3);
        printf("  %-13s %6.3f (quartiles %.3f-%.3f)\n", rnames[j], q2, q1,
               q3);
        if (f)
            fprintf(f, "%s\"%s\": [%.4f, %.4f, %.4f]", j ? ", " : "",
                    keys[j], q1, q2, q3);
    }
    int status = 0;
    if (f) {
        fprintf(f, "}}\n");
        fclose(f);
    } else if (json) {
        fprintf(stderr, "layouts: cannot append to %s\n", json);
        status = 1;
    }
    mha_engine_destroy(e);
    free(q);
    free(out);
    free(k);
    free(v);
    return status;
}
