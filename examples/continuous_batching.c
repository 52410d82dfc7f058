/* Continuous batching over a paged K/V cache, as an inference server runs
 * attention: requests of different prompt lengths arrive over time; every
 * step is ONE mha_attention_varlen call that mixes the prefill chunks of
 * new requests (at most CHUNK prompt tokens per request per step) with the
 * decode rows of running ones. Each request's keys and values live in
 * fixed-size blocks taken from a free list (vLLM's block tables); blocks
 * return to the list when the request finishes. The "model" is a stand-in
 * that makes up each token's q, k and v; the attention calls are real.
 * Once per step one sequence is checked against a contiguous mha_attention
 * call on its gathered keys. Prints steps, tokens and tokens per second.
 * An 8-bit cache (i8, fp8_e4m3, fp8_e5m2) is written by slot with
 * mha_quantize_paged, one scale per (slot, kv head).
 *
 *   continuous_batching [f32|f16|bf16|i8|fp8_e4m3|fp8_e5m2] [requests]
 *                       [threads]     (default f32 12 0 = all threads)
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mha.h"
#include "stand_in.h"

enum {
    H = 16, HKV = 4, D = 64, /* query heads, kv heads, head size */
    BLOCK = 16,              /* keys per cache block */
    POOL = 2048,             /* blocks in the pool */
    CHUNK = 128,             /* prompt tokens per request per step */
    GEN = 48,                /* tokens each request generates */
    MAX_REQ = 64,
    MAX_BLOCKS = 128         /* block table row: up to 2048 keys */
};

typedef struct {
    int prompt, done;        /* prompt length; tokens whose K/V are cached */
    int arrival;             /* the step it arrives at */
    int generated;
    int32_t table[MAX_BLOCKS];
    int blocks;
} request;

/* The pool's free list: a stack of block ids. */
static int32_t free_list[POOL];
static int n_free;

static int take_block(void) { return n_free > 0 ? free_list[--n_free] : -1; }
static void give_block(int32_t b) { free_list[n_free++] = b; }

/* The pools: K and V [POOL, BLOCK, HKV, D] of one dtype, and for an 8-bit
 * one their scales [POOL, BLOCK, HKV]. */
typedef struct {
    mha_dtype dt;
    void *k, *v;
    float *ks, *vs;
} pools;

static mha_tensor pool_view(const pools *p, int value)
{
    mha_tensor t =
        mha_tensor_bshd_typed(value ? p->v : p->k, p->dt, POOL, BLOCK, HKV, D);
    if (mha_dtype_size(p->dt) == 1)
        t.scales = (mha_scales){value ? p->vs : p->ks, BLOCK * HKV, HKV, 1};
    return t;
}

/* Writes token pos of request r (its K and V, all kv heads) into the
 * request's block for pos, taking a new block when pos starts one. */
static int append(request *rq, int r, int pos, const pools *p)
{
    if (pos % BLOCK == 0) {
        int b = take_block();
        if (b < 0 || rq->blocks == MAX_BLOCKS)
            return -1;
        rq->table[rq->blocks++] = b;
    }
    size_t at = ((size_t)rq->table[pos / BLOCK] * BLOCK + pos % BLOCK) *
                HKV * D;
    float k[HKV * D], v[HKV * D];
    for (unsigned i = 0; i < HKV * D; i++) {
        k[i] = act((unsigned)pos, i, 2u * (unsigned)r + 1u);
        v[i] = act((unsigned)pos, i, 2u * (unsigned)r + 2u);
    }
    if (mha_dtype_size(p->dt) == 1) { /* the slot's codes and scales */
        int64_t slot = (int64_t)rq->table[pos / BLOCK] * BLOCK + pos % BLOCK;
        mha_tensor src = mha_tensor_bshd(k, 1, 1, HKV, D);
        mha_tensor kp = pool_view(p, 0), vp = pool_view(p, 1);
        kp.scales.data = vp.scales.data = NULL; /* computed */
        if (mha_quantize_paged(&src, &kp, &slot, p->ks) != MHA_OK)
            return -1;
        src.data = v;
        return mha_quantize_paged(&src, &vp, &slot, p->vs) == MHA_OK ? 0 : -1;
    }
    if (p->dt == MHA_F16) {
        mha_f32_to_f16(k, HKV * D, (uint16_t *)p->k + at);
        mha_f32_to_f16(v, HKV * D, (uint16_t *)p->v + at);
    } else if (p->dt == MHA_BF16) {
        mha_f32_to_bf16(k, HKV * D, (uint16_t *)p->k + at);
        mha_f32_to_bf16(v, HKV * D, (uint16_t *)p->v + at);
    } else {
        memcpy((float *)p->k + at, k, sizeof k);
        memcpy((float *)p->v + at, v, sizeof v);
    }
    return 0;
}

/* Request r's first n keys (or values) gathered into a contiguous
 * [1, n, HKV, D] array of the pool's dtype (and their scales into
 * dst_scales [n, HKV] when scales is not NULL). */
static void gather(const request *rq, const void *pool, size_t es, int n,
                   void *dst, const float *scales, float *dst_scales)
{
    for (int j = 0; j < n; j++) {
        size_t slot = (size_t)rq->table[j / BLOCK] * BLOCK + j % BLOCK;
        memcpy((char *)dst + (size_t)j * HKV * D * es,
               (const char *)pool + slot * HKV * D * es,
               (size_t)HKV * D * es);
        if (scales)
            memcpy(dst_scales + (size_t)j * HKV, scales + slot * HKV,
                   HKV * sizeof *scales);
    }
}

/* Sequence `which` of the step (rows [q0, q0 + lq) of q and out, keys
 * [0, lk) of request rq) against one mha_attention call on its gathered
 * keys. Returns the largest difference. */
static double check(const mha_engine *e, const request *rq, const float *q,
                    const float *out, int q0, int lq, int lk,
                    const pools *p)
{
    mha_dtype dt = p->dt;
    size_t es = mha_dtype_size(dt);
    int scaled = es == 1;
    void *k = malloc((size_t)lk * HKV * D * es);
    void *v = malloc((size_t)lk * HKV * D * es);
    float *o = malloc((size_t)lq * H * D * sizeof *o);
    float *ks = malloc((size_t)lk * HKV * sizeof *ks);
    float *vs = malloc((size_t)lk * HKV * sizeof *vs);
    double worst = INFINITY;
    if (k && v && o && ks && vs) {
        gather(rq, p->k, es, lk, k, scaled ? p->ks : NULL, ks);
        gather(rq, p->v, es, lk, v, scaled ? p->vs : NULL, vs);
        mha_mask mask = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
        mha_attention_args a = {
            .q = mha_tensor_bshd_typed(q + (size_t)q0 * H * D, MHA_F32, 1,
                                       lq, H, D),
            .k = mha_tensor_bshd_typed(k, dt, 1, lk, HKV, D),
            .v = mha_tensor_bshd_typed(v, dt, 1, lk, HKV, D),
            .out = mha_tensor_bshd(o, 1, lq, H, D),
            .mask = &mask};
        if (scaled) {
            a.k.scales = (mha_scales){ks, 0, HKV, 1};
            a.v.scales = (mha_scales){vs, 0, HKV, 1};
        }
        if (mha_attention(e, &a) == MHA_OK) {
            worst = 0.0;
            for (size_t i = 0; i < (size_t)lq * H * D; i++)
                worst = fmax(worst, fabs(o[i] - out[(size_t)q0 * H * D + i]));
        }
    }
    free(k), free(v), free(o), free(ks), free(vs);
    return worst;
}

int main(int argc, char **argv)
{
    static const mha_dtype kinds[] = {MHA_F32, MHA_F16, MHA_BF16, MHA_I8,
                                      MHA_FP8_E4M3, MHA_FP8_E5M2};
    int kind = argc > 1 ? -1 : 0;
    for (int i = 0; argc > 1 && i < 6; i++)
        if (strcmp(argv[1], mha_dtype_name(kinds[i])) == 0)
            kind = i;
    if (kind < 0) {
        fprintf(stderr, "usage: %s [f32|f16|bf16|i8|fp8_e4m3|fp8_e5m2] "
                "[requests] [threads]\n", argv[0]);
        return 2;
    }
    mha_dtype dt = kinds[kind];
    int n_req = argc > 2 ? atoi(argv[2]) : 12;
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    if (n_req < 1 || n_req > MAX_REQ || threads < 0) {
        fprintf(stderr, "requests must be in [1, %d], threads >= 0\n",
                MAX_REQ);
        return 2;
    }
    static const int prompts[] = {37,  300, 129, 800, 64,  513, 222, 1000,
                                  15,  450, 700, 90,  256, 31,  640, 177};
    request rq[MAX_REQ];
    for (int r = 0; r < n_req; r++)
        rq[r] = (request){.prompt = prompts[r % 16], .arrival = 3 * r};
    for (int b = POOL - 1; b >= 0; b--)
        give_block(b);

    size_t es = mha_dtype_size(dt), pool_elems = (size_t)POOL * BLOCK * HKV * D;
    pools pool = {dt, malloc(pool_elems * es), malloc(pool_elems * es),
                  malloc((size_t)POOL * BLOCK * HKV * sizeof(float)),
                  malloc((size_t)POOL * BLOCK * HKV * sizeof(float))};
    /* Per step at most CHUNK rows per request. */
    float *q = malloc((size_t)MAX_REQ * CHUNK * H * D * sizeof *q);
    float *out = malloc((size_t)MAX_REQ * CHUNK * H * D * sizeof *out);
    int32_t cu[MAX_REQ + 1], lens[MAX_REQ], table[MAX_REQ * MAX_BLOCKS];
    int who[MAX_REQ];
    if (!pool.k || !pool.v || !pool.ks || !pool.vs || !q || !out) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    mha_config config = {.num_threads = threads};
    mha_engine *engine;
    if (mha_engine_create(&config, &engine) != MHA_OK) {
        fprintf(stderr, "engine: %s\n", mha_last_error());
        return 1;
    }

    int finished = 0, steps = 0;
    long prefill_tokens = 0, decode_tokens = 0;
    double seconds = 0.0, worst = 0.0;
    while (finished < n_req) {
        /* The batch of this step: every arrived, unfinished request. */
        int n = 0, rows = 0;
        cu[0] = 0;
        for (int r = 0; r < n_req; r++) {
            request *x = &rq[r];
            if (x->arrival > steps || x->generated == GEN)
                continue;
            int prefilling = x->done < x->prompt;
            int lq = prefilling ? (x->prompt - x->done < CHUNK
                                       ? x->prompt - x->done
                                       : CHUNK)
                                : 1;
            for (int i = 0; i < lq; i++) {
                int pos = x->done + i;
                for (unsigned c = 0; c < H * D; c++)
                    q[((size_t)rows + i) * H * D + c] =
                        act((unsigned)pos, c, 1000u + (unsigned)r);
                if (append(x, r, pos, &pool) != 0) {
                    fprintf(stderr, "the pool of %d blocks is full, or: %s\n",
                            POOL, mha_last_error());
                    return 1;
                }
            }
            x->done += lq;
            if (prefilling)
                prefill_tokens += lq;
            else
                decode_tokens += 1;
            who[n] = r;
            lens[n] = x->done;
            memcpy(&table[n * MAX_BLOCKS], x->table,
                   (size_t)x->blocks * sizeof *x->table);
            rows += lq;
            cu[++n] = rows;
        }
        if (n == 0) {
            steps++;
            continue;
        }
        mha_paged_kv paged = {table, MAX_BLOCKS, 0, lens};
        mha_varlen_args a = {
            .batch = n,
            .q = mha_tensor_bshd(q, 1, rows, H, D),
            .cu_seqlens_q = cu,
            .k = pool_view(&pool, 0),
            .v = pool_view(&pool, 1),
            .paged = &paged,
            .out = mha_tensor_bshd(out, 1, rows, H, D),
            .causal = MHA_CAUSAL_BOTTOM_RIGHT};
        double t0 = now();
        mha_status st = mha_attention_varlen(engine, &a);
        seconds += now() - t0;
        if (st != MHA_OK) {
            fprintf(stderr, "step %d: %s: %s\n", steps,
                    mha_status_string(st), mha_last_error());
            return 1;
        }
        /* One sequence per step (in turn) against a contiguous call. */
        int s = steps % n;
        double diff = check(engine, &rq[who[s]], q, out, cu[s],
                            cu[s + 1] - cu[s], lens[s], &pool);
        worst = fmax(worst, diff);
        if (!(diff <= 1e-4)) {
            fprintf(stderr, "step %d, request %d: differs from a contiguous "
                    "call by %g\n", steps, who[s], diff);
            return 1;
        }
        /* Requests past their prompt generated a token this step. */
        for (int i = 0; i < n; i++) {
            request *x = &rq[who[i]];
            if (x->done > x->prompt && ++x->generated == GEN) {
                for (int b = 0; b < x->blocks; b++)
                    give_block(x->table[b]);
                x->blocks = 0;
                finished++;
            }
        }
        steps++;
    }
    if (n_free != POOL) {
        fprintf(stderr, "%d blocks were not returned\n", POOL - n_free);
        return 1;
    }
    long tokens = prefill_tokens + decode_tokens;
    char thr[32] = "OpenMP's default";
    if (mha_engine_num_threads(engine) > 0)
        snprintf(thr, sizeof thr, "%d", mha_engine_num_threads(engine));
    printf("%d requests, %d steps, %s cache in %d-key blocks (%s, %s "
           "threads)\n", n_req, steps, mha_dtype_name(dt), BLOCK,
           mha_isa_name(mha_engine_isa(engine)), thr);
    printf("%ld prompt tokens and %ld decode tokens in %.3f s of attention: "
           "%.0f tokens/s (largest difference from contiguous calls %.2g)\n",
           prefill_tokens, decode_tokens, seconds,
           seconds > 0 ? (double)tokens / seconds : 0.0, worst);
    mha_engine_destroy(engine);
    free(pool.k), free(pool.v), free(pool.ks), free(pool.vs), free(q),
        free(out);
    return 0;
}
