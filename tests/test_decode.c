/*
 * The decode path (Lq = 1 against a long cache, and Lq = 3 and 8: blocks
 * of up to MK_DECODE_ROWS query rows take the decode kernels too, here
 * with bottom-right causal masking and a keep-mask; Lq 2-7 without one,
 * blocks interleaving the queries of several kv heads), per ISA:
 *  - fp32, fp16 and bf16 K/V against the oracle. The K/V values are drawn
 *    on grids each format holds exactly (k/1024 for binary16, k/128 for
 *    bfloat16), so the oracle sees the very values the library widens and
 *    the tolerance is TOL_ATTN's; against the oracle of the unrounded fp32
 *    draws they must also agree within the rounding of the inputs
 *    (TOL_F16_INPUT / TOL_BF16_INPUT);
 *  - split-KV (long Lk, few rows) against the unsplit path (the weights
 *    output turns splitting off) and against the oracle;
 *  - GQA groups of 1, 4, 8, 16 and 64 query heads per kv head;
 *  - bitwise determinism over 1..8 threads with split-KV active, including
 *    a single head over 32768 keys and a speculative step of 4 queries.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "oracle.h"
#include "util.h"

/* Uniform draws in [-1, 1) snapped to the dtype's exact grid. */
static float snap(float x, mha_dtype dt)
{
    float steps = dt == MHA_F16 ? 1024.0f : dt == MHA_BF16 ? 128.0f : 0.0f;
    return steps == 0.0f ? x : nearbyintf(x * steps) / steps;
}

typedef struct decode_case {
    int64_t b, h, hkv, lk, d;
    mha_causal causal;
    int lengths; /* use per-batch key lengths */
    int64_t lq;
    int keep; /* a [B, 1, Lq, Lk] keep-mask hiding about a fifth of keys */
} decode_case;

typedef struct decode_data {
    decode_case c;
    float *q, *k, *v;     /* fp32 values (snapped for half dtypes) */
    float *kraw, *vraw;   /* the unsnapped draws */
    void *kstore, *vstore; /* what the library reads */
    uint8_t *keep;
    int32_t lengths[4];
    mha_mask mask;
    size_t nq, nkv;
} decode_data;

static void make_data(decode_data *dd, const decode_case *c, mha_dtype dt,
                      uint64_t seed)
{
    test_rng r;
    rng_seed(&r, seed);
    memset(dd, 0, sizeof *dd);
    dd->c = *c;
    dd->nq = (size_t)(c->b * c->lq * c->h * c->d);
    dd->nkv = (size_t)(c->b * c->lk * c->hkv * c->d);
    dd->q = random_floats(&r, dd->nq);
    dd->kraw = random_floats(&r, dd->nkv);
    dd->vraw = random_floats(&r, dd->nkv);
    dd->k = test_alloc(dd->nkv * sizeof(float));
    dd->v = test_alloc(dd->nkv * sizeof(float));
    size_t esize = mha_dtype_size(dt);
    dd->kstore = test_alloc(dd->nkv * esize);
    dd->vstore = test_alloc(dd->nkv * esize);
    for (size_t i = 0; i < dd->nkv; i++) {
        dd->k[i] = snap(dd->kraw[i], dt);
        dd->v[i] = snap(dd->vraw[i], dt);
    }
    /* The grid values are exact in the dtype: narrowing does not round. */
    if (dt == MHA_F32) {
        memcpy(dd->kstore, dd->k, dd->nkv * esize);
        memcpy(dd->vstore, dd->v, dd->nkv * esize);
    } else if (dt == MHA_F16) {
        mha_f32_to_f16(dd->k, dd->nkv, dd->kstore);
        mha_f32_to_f16(dd->v, dd->nkv, dd->vstore);
    } else {
        mha_f32_to_bf16(dd->k, dd->nkv, dd->kstore);
        mha_f32_to_bf16(dd->v, dd->nkv, dd->vstore);
    }
    dd->mask.causal = c->causal;
    if (c->keep) {
        /* Rows padded by 3 bytes of nonzero garbage; one mask per batch,
         * broadcast over heads. */
        ptrdiff_t ld = c->lk + 3;
        size_t bytes = (size_t)(c->b * c->lq * ld);
        dd->keep = test_alloc(bytes);
        memset(dd->keep, 0x5a, bytes);
        for (int64_t i = 0; i < c->b * c->lq; i++)
            for (int64_t j = 0; j < c->lk; j++)
                dd->keep[i * ld + j] = rng_uniform(&r) < -0.6f ? 0 : 1;
        dd->mask.keep = dd->keep;
        dd->mask.keep_stride_batch = c->lq * ld;
        dd->mask.keep_stride_head = 0;
        dd->mask.keep_stride_query = ld;
    }
    if (c->lengths) {
        for (int64_t b = 0; b < c->b; b++)
            dd->lengths[b] = (int32_t)(b == 0 ? c->lk : (c->lk * (b + 1)) / 5);
        dd->mask.key_lengths = dd->lengths;
    }
}

static void free_data(decode_data *dd)
{
    free(dd->q), free(dd->k), free(dd->v), free(dd->kraw), free(dd->vraw);
    free(dd->kstore), free(dd->vstore), free(dd->keep);
}

static mha_attention_args decode_args(decode_data *dd, mha_dtype dt,
                                      float *out, float *weights)
{
    const decode_case *c = &dd->c;
    mha_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = mha_tensor_bshd(dd->q, c->b, c->lq, c->h, c->d);
    a.k = mha_tensor_bshd(dd->kstore, c->b, c->lk, c->hkv, c->d);
    a.v = mha_tensor_bshd(dd->vstore, c->b, c->lk, c->hkv, c->d);
    a.k.dtype = a.v.dtype = dt;
    a.out = mha_tensor_bshd(out, c->b, c->lq, c->h, c->d);
    a.mask = &dd->mask;
    a.weights = weights;
    return a;
}

/* The oracle on the given fp32 K/V arrays. */
static void oracle_on(const decode_data *dd, const float *k, const float *v,
                      double *out)
{
    const decode_case *c = &dd->c;
    oracle_dims dims = {c->b, c->lq, c->lk, c->h, c->hkv, c->d, c->d};
    double *q = test_alloc(dd->nq * sizeof(double));
    double *kd = test_alloc(dd->nkv * sizeof(double));
    double *vd = test_alloc(dd->nkv * sizeof(double));
    for (size_t i = 0; i < dd->nq; i++)
        q[i] = dd->q[i];
    for (size_t i = 0; i < dd->nkv; i++)
        kd[i] = k[i], vd[i] = v[i];
    oracle_sdpa(&dims, q, kd, vd, &dd->mask, 1.0 / sqrt((double)c->d), out,
                NULL);
    free(q), free(kd), free(vd);
}

static const decode_case cases[] = {
    /* b, h, hkv, lk, d, causal, lengths, lq, keep */
    {1, 8, 8, 300, 64, MHA_CAUSAL_BOTTOM_RIGHT, 0, 1, 0},
    {2, 8, 2, 1031, 128, MHA_CAUSAL_BOTTOM_RIGHT, 1, 1, 0},
    {1, 32, 8, 4099, 128, MHA_CAUSAL_NONE, 0, 1, 0}, /* split, groups of 4 */
    {3, 8, 1, 2500, 80, MHA_CAUSAL_BOTTOM_RIGHT, 1, 1, 0}, /* group of 8 */
    {1, 64, 1, 700, 32, MHA_CAUSAL_NONE, 0, 1, 0}, /* group above block_q */
    {1, 4, 2, 1500, 17, MHA_CAUSAL_TOP_LEFT, 0, 1, 0}, /* key 0 only */
    /* Key rows 8 KiB (fp32) / 4 KiB (half) apart: short chunks taken
     * across the heads of each batch (the engine's key-major order). */
    {2, 16, 16, 700, 128, MHA_CAUSAL_BOTTOM_RIGHT, 1, 1, 0},
    /* Lq 3 and 8: per-head blocks of 3 / 8 rows, split-KV over 1031 keys;
     * the causal diagonal and the keep-mask cut into every key block. */
    {2, 4, 2, 1031, 64, MHA_CAUSAL_BOTTOM_RIGHT, 1, 3, 1},
    {1, 2, 1, 517, 128, MHA_CAUSAL_BOTTOM_RIGHT, 0, 8, 1},
    {1, 2, 2, 40, 17, MHA_CAUSAL_BOTTOM_RIGHT, 0, 8, 1}, /* Lk near Lq */
    /* Blocks of 16 and 12 rows over value rows 4 KiB apart, over 1100
     * keys (split): wide decode blocks where the table has them (group 16
     * over fp32 rows a page apart, a head's 12 queries), else the prefill
     * stream, fp32 values gathered with the fetch ahead rather than read
     * in place (mha_gathers_values). */
    {1, 128, 8, 1100, 128, MHA_CAUSAL_BOTTOM_RIGHT, 0, 1, 0}, /* group 16 */
    {2, 8, 8, 600, 128, MHA_CAUSAL_BOTTOM_RIGHT, 1, 12, 1},
    /* Speculative decode steps (Lq 2-7, no keep-mask): on the tables
     * that read across kv heads, blocks interleave the queries of several
     * kv heads' query heads (mha_seq.ilv) and the diagonal goes by each
     * row's query: 32 kv heads in two blocks of 16 (split), group 2 at
     * Lq 4 (8 rows a kv head), group 4 at Lq 2 (top-left), 3 rows a kv
     * head (no constant group), Lq 7 in blocks of 10, 10 and 8 kv heads
     * over keys near Lq. */
    {1, 32, 32, 1100, 128, MHA_CAUSAL_BOTTOM_RIGHT, 0, 4, 0},
    {2, 8, 4, 700, 64, MHA_CAUSAL_BOTTOM_RIGHT, 1, 4, 0},
    {2, 8, 2, 600, 64, MHA_CAUSAL_TOP_LEFT, 1, 2, 0},
    {1, 6, 6, 300, 80, MHA_CAUSAL_NONE, 0, 3, 0},
    {1, 28, 28, 90, 64, MHA_CAUSAL_BOTTOM_RIGHT, 0, 7, 0},
    /* More rows a kv head than MK_DECODE_ROWS: one wide decode block a kv
     * head where the table has them, else the step in blocks of fewer
     * queries (row blocks taken key chunk by key chunk): group 4 at Lq 4
     * (two of 2 queries), group 8 at Lq 3 (three of one query, the
     * grouped rows at queries 1 and 2), group 3 at Lq 3 (2 queries, then
     * 1). Then two wide blocks a kv head over fp32 rows a page apart:
     * group 8 at Lq 3 (2 queries, then 1), group 4 at Lq 8 with a
     * keep-mask (4 and 4). */
    {2, 16, 4, 900, 64, MHA_CAUSAL_BOTTOM_RIGHT, 1, 4, 0},
    {1, 16, 2, 700, 64, MHA_CAUSAL_BOTTOM_RIGHT, 0, 3, 0},
    {1, 12, 4, 500, 32, MHA_CAUSAL_TOP_LEFT, 1, 3, 0},
    {1, 64, 8, 700, 128, MHA_CAUSAL_BOTTOM_RIGHT, 0, 3, 0},
    {1, 32, 8, 500, 128, MHA_CAUSAL_TOP_LEFT, 1, 8, 1},
    /* Four or more decode blocks' worth (32 rows a kv head and up): one
     * prefill block of the step's interleaved rows a kv head (group 8 at
     * Lq 4 and 8, the latter with a keep-mask at query and head strides). */
    {2, 24, 3, 900, 128, MHA_CAUSAL_TOP_LEFT, 1, 4, 0},
    {1, 32, 4, 700, 64, MHA_CAUSAL_BOTTOM_RIGHT, 0, 8, 1},
};

START_TEST(decode_dtypes_vs_oracle)
{
    const decode_case *c = &cases[_i % (sizeof cases / sizeof cases[0])];
    mha_dtype dt = (mha_dtype)(_i / (sizeof cases / sizeof cases[0]));
    decode_data dd;
    make_data(&dd, c, dt, 1000 + (uint64_t)_i);
    double *want = test_alloc(dd.nq * sizeof(double));
    double *want_raw = test_alloc(dd.nq * sizeof(double));
    oracle_on(&dd, dd.k, dd.v, want);
    oracle_on(&dd, dd.kraw, dd.vraw, want_raw);
    double input_tol = dt == MHA_F16    ? TOL_F16_INPUT
                       : dt == MHA_BF16 ? TOL_BF16_INPUT
                                        : TOL_ATTN_ABS;
    float *out = test_alloc(dd.nq * sizeof(float));
    mha_isa isas[TEST_MAX_ISAS];
    int n = available_isas(isas);
    for (int i = 0; i < n; i++) {
        mha_engine *e = make_engine(isas[i], 2);
        mha_attention_args a = decode_args(&dd, dt, out, NULL);
        mha_status st = mha_attention(e, &a);
        ck_assert_msg(st == MHA_OK, "%s", mha_last_error());
        size_t at;
        double ratio = tol_ratio(out, want, dd.nq, TOL_ATTN_ABS, TOL_ATTN_REL,
                                 &at);
        ck_assert_msg(ratio <= 1.0,
                      "%s %s H=%lld Hkv=%lld Lq=%lld Lk=%lld d=%lld: "
                      "out[%zu] = %g, oracle %g (ratio %g)",
                      mha_isa_name(isas[i]), mha_dtype_name(dt),
                      (long long)c->h, (long long)c->hkv, (long long)c->lq,
                      (long long)c->lk, (long long)c->d, at, (double)out[at],
                      want[at], ratio);
        ratio = tol_ratio(out, want_raw, dd.nq, input_tol, 0.0, &at);
        ck_assert_msg(ratio <= 1.0,
                      "%s %s Lq=%lld: out[%zu] = %g is %g from the "
                      "fp32-input oracle",
                      mha_isa_name(isas[i]), mha_dtype_name(dt),
                      (long long)c->lq, at, (double)out[at],
                      fabs(out[at] - want_raw[at]));
        mha_engine_destroy(e);
    }
    free(out), free(want), free(want_raw);
    free_data(&dd);
}
END_TEST

/* Splitting the keys changes only rounding: compare the split path (no
 * weights) with the unsplit one (weights requested) and both with the
 * oracle. */
START_TEST(split_matches_unsplit)
{
    const decode_case c = {1, 2, 1, 9001, 64, MHA_CAUSAL_BOTTOM_RIGHT, 0, 1,
                           0};
    decode_data dd;
    make_data(&dd, &c, MHA_F32, 77);
    double *want = test_alloc(dd.nq * sizeof(double));
    oracle_on(&dd, dd.k, dd.v, want);
    float *split = test_alloc(dd.nq * sizeof(float));
    float *whole = test_alloc(dd.nq * sizeof(float));
    float *weights = test_alloc((size_t)(c.h * c.lk) * sizeof(float));
    double *whole_d = test_alloc(dd.nq * sizeof(double));
    mha_isa isas[TEST_MAX_ISAS];
    int n = available_isas(isas);
    for (int i = 0; i < n; i++) {
        mha_engine *e = make_engine(isas[i], 2);
        mha_attention_args a = decode_args(&dd, MHA_F32, split, NULL);
        ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
        a = decode_args(&dd, MHA_F32, whole, weights);
        ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
        for (size_t x = 0; x < dd.nq; x++)
            whole_d[x] = whole[x];
        size_t at;
        double r1 = tol_ratio(split, want, dd.nq, TOL_ATTN_ABS, TOL_ATTN_REL,
                              &at);
        ck_assert_msg(r1 <= 1.0, "%s split vs oracle at %zu: %g vs %g",
                      mha_isa_name(isas[i]), at, (double)split[at], want[at]);
        double r2 = tol_ratio(split, whole_d, dd.nq, TOL_ATTN_ABS,
                              TOL_ATTN_REL, &at);
        ck_assert_msg(r2 <= 1.0, "%s split vs unsplit at %zu: %g vs %g",
                      mha_isa_name(isas[i]), at, (double)split[at],
                      whole_d[at]);
        mha_engine_destroy(e);
    }
    free(split), free(whole), free(weights), free(whole_d), free(want);
    free_data(&dd);
}
END_TEST

/* With split-KV active the result must not depend on the thread count. */
START_TEST(split_deterministic_over_threads)
{
    static const decode_case shapes[] = {
        {1, 1, 1, 32768, 128, MHA_CAUSAL_BOTTOM_RIGHT, 0, 1, 0},
        {2, 32, 16, 1500, 128, MHA_CAUSAL_NONE, 1, 1, 0}, /* key-major */
        /* A speculative step in two query blocks across kv heads, taken
         * key chunk by key chunk. */
        {1, 32, 8, 3000, 128, MHA_CAUSAL_BOTTOM_RIGHT, 0, 4, 0},
    };
    const decode_case *c = &shapes[_i];
    mha_dtype dt = _i == 1 ? MHA_F16 : MHA_F32;
    decode_data dd;
    make_data(&dd, c, dt, 500 + (uint64_t)_i);
    float *first = test_alloc(dd.nq * sizeof(float));
    float *again = test_alloc(dd.nq * sizeof(float));
    mha_isa isas[TEST_MAX_ISAS];
    int n = available_isas(isas);
    for (int i = 0; i < n; i++) {
        for (int t = 1; t <= 8; t++) {
            mha_engine *e = make_engine(isas[i], t);
            mha_attention_args a =
                decode_args(&dd, dt, t == 1 ? first : again, NULL);
            ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
            if (t > 1)
                ck_assert_msg(memcmp(first, again, dd.nq * sizeof(float)) == 0,
                              "%s Lk=%lld: %d threads differ from 1",
                              mha_isa_name(isas[i]), (long long)c->lk, t);
            mha_engine_destroy(e);
        }
    }
    free(first), free(again);
    free_data(&dd);
}
END_TEST

Suite *suite_decode(void)
{
    Suite *s = suite_create("decode");
    TCase *tc = tcase_create("decode");
    tcase_set_timeout(tc, 600);
    int ncases = (int)(sizeof cases / sizeof cases[0]);
    tcase_add_loop_test(tc, decode_dtypes_vs_oracle, 0, 3 * ncases);
    tcase_add_test(tc, split_matches_unsplit);
    tcase_add_loop_test(tc, split_deterministic_over_threads, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}
