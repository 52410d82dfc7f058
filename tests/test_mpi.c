/*
 * The MPI component (include/mha_mpi.h) under mpirun with any number of
 * ranks: every rank's results against the same computation done by one
 * process (the single-process layer and attention, layer tolerance),
 * bitwise equality across runs, thread counts and ranks, and the error
 * agreement (a bad argument on one rank fails every rank, nothing
 * written, nothing hangs).
 *
 * Every test makes all its collective calls before it asserts anything:
 * a failed check on one rank must not leave the others waiting in a
 * collective. Check runs without fork (CK_FORK=no), so every rank runs
 * the tests in the same order.
 */
#include <fenv.h>
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha_mpi.h"
#include "mpi_test_hooks.h"
#include "util.h"

static int rank, nranks;

/* ---- Helpers ---------------------------------------------------------- */

/* The engine a server would make: the best table here (main names it). */
static mha_engine *engine(int threads)
{
    mha_config c = {.num_threads = threads, .isa = MHA_ISA_AUTO};
    mha_engine *e = NULL;
    ck_assert_int_eq(mha_engine_create(&c, &e), MHA_OK);
    return e;
}

static double *widen(const float *x, size_t n)
{
    double *d = test_alloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* got against the single-process want, layer tolerance. */
static double ratio(const float *got, const float *want, size_t n)
{
    double *w = widen(want, n);
    double r = tol_ratio(got, w, n, TOL_LAYER_ABS, TOL_LAYER_REL, NULL);
    free(w);
    return r;
}

/* Whether every rank holds the same bytes (a hash gathered to all). */
static int same_on_all_ranks(const void *data, size_t bytes)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = data;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    uint64_t lo, hi;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* Rank r's share of n keys: uneven (rank r gets about r + 1 parts), at
 * least one each. */
static void shard_of(int64_t n, int r, int p, int64_t *first, int64_t *count)
{
    int64_t parts = (int64_t)p * (p + 1) / 2, before = (int64_t)r * (r + 1) / 2;
    int64_t lo = (n - p) * before / parts + r;
    int64_t hi = (n - p) * (before + r + 1) / parts + r + 1;
    *first = lo, *count = hi - lo;
}

/* ---- Tensor-parallel layer ------------------------------------------ */

enum { LE = 48, LH = 12, LB = 2, LLQ = 7, LLK = 9 };

typedef struct {
    float *in_w, *in_b, *out_w, *out_b, *x, *kv, *bias, *slopes, *sinks;
    mha_layer_desc desc;
    mha_mask mask;
    mha_score_terms terms;
} layer_data;

static void layer_data_init(layer_data *d, uint64_t seed)
{
    test_rng r;
    rng_seed(&r, seed);
    d->in_w = random_floats(&r, 3 * LE * LE);
    d->in_b = random_floats(&r, 3 * LE);
    d->out_w = random_floats(&r, LE * LE);
    d->out_b = random_floats(&r, LE);
    for (int i = 0; i < 3 * LE * LE; i++)
        d->in_w[i] *= 0.2f;
    for (int i = 0; i < LE * LE; i++)
        d->out_w[i] *= 0.2f;
    d->x = random_floats(&r, LB * LLQ * LE);
    d->kv = random_floats(&r, LB * LLK * LE);
    d->bias = random_floats(&r, LH * LLQ * LLK);
    d->slopes = random_floats(&r, LH);
    d->sinks = random_floats(&r, LH);
    d->desc = (mha_layer_desc){.embed_dim = LE, .num_heads = LH,
                               .in_proj_weight = d->in_w,
                               .in_proj_bias = d->in_b,
                               .out_proj_weight = d->out_w,
                               .out_proj_bias = d->out_b};
    /* A per-head bias and per-head slopes and sinks: each rank must read
     * its own heads' entries. */
    d->mask = (mha_mask){.causal = MHA_CAUSAL_BOTTOM_RIGHT, .bias = d->bias,
                         .bias_stride_head = LLQ * LLK,
                         .bias_stride_query = LLK};
    d->terms = (mha_score_terms){.alibi_slopes = d->slopes,
                                 .sinks = d->sinks};
}

static void layer_data_free(layer_data *d)
{
    free(d->in_w), free(d->in_b), free(d->out_w), free(d->out_b);
    free(d->x), free(d->kv), free(d->bias), free(d->slopes), free(d->sinks);
}

static mha_layer_args layer_args(layer_data *d, float *out, float *w,
                                 float *lse)
{
    return (mha_layer_args){.query = d->x, .key = d->kv, .value = d->kv,
                            .out = out, .batch = LB, .lq = LLQ, .lk = LLK,
                            .mask = &d->mask, .terms = &d->terms,
                            .weights = w, .lse = lse};
}

/* This rank's slices of the full weights (mha_layer_desc's sliced form). */
static void slice_weights(const layer_data *d, int64_t first, int64_t count,
                          float **in_w, float **in_b, float **out_w)
{
    const int64_t dh = LE / LH, w = count * dh, r0 = first * dh;
    *in_w = test_alloc((size_t)(3 * w * LE) * sizeof(float));
    *in_b = test_alloc((size_t)(3 * w) * sizeof(float));
    *out_w = test_alloc((size_t)(LE * w) * sizeof(float));
    for (int i = 0; i < 3; i++) {
        memcpy(*in_w + i * w * LE, d->in_w + (i * LE + r0) * LE,
               (size_t)(w * LE) * sizeof(float));
        memcpy(*in_b + i * w, d->in_b + i * LE + r0, (size_t)w * sizeof(float));
    }
    for (int64_t r = 0; r < LE; r++)
        memcpy(*out_w + r * w, d->out_w + r * LE + r0,
               (size_t)w * sizeof(float));
}

/* _i 0: the full state dict on every rank; 1: pre-sliced weights. Each
 * rank's out against the single-process layer, its weights and lse
 * against the single-process layer's rows of its heads. */
START_TEST(layer_matches_one_process)
{
    layer_data d;
    layer_data_init(&d, 11);
    mha_engine *e = engine(1);
    const size_t n_out = LB * LLQ * LE, n_w = LB * LH * LLQ * LLK,
                 n_l = LB * LH * LLQ;
    float *want = test_alloc(n_out * sizeof *want);
    float *want_w = test_alloc(n_w * sizeof *want_w);
    float *want_l = test_alloc(n_l * sizeof *want_l);
    mha_layer *one;
    ck_assert_int_eq(mha_layer_create(e, &d.desc, &one), MHA_OK);
    mha_layer_args a = layer_args(&d, want, want_w, want_l);
    ck_assert_int_eq(mha_layer_forward_ex(one, &a), MHA_OK);
    mha_layer_destroy(one);

    const int64_t count = LH / nranks, first = rank * count;
    float *in_w = NULL, *in_b = NULL, *out_w = NULL;
    mha_layer_desc desc = d.desc;
    if (_i == 1) {
        slice_weights(&d, first, count, &in_w, &in_b, &out_w);
        desc.in_proj_weight = in_w, desc.in_proj_bias = in_b;
        desc.out_proj_weight = out_w, desc.shard_sliced = 1;
    }
    mha_mpi_layer *tp = NULL;
    mha_status cst = mha_mpi_layer_create(e, MPI_COMM_WORLD, &desc, &tp);
    float *out = test_alloc(n_out * sizeof *out);
    float *w = test_alloc(n_w * sizeof *w), *lse = test_alloc(n_l * sizeof *lse);
    fill_sentinel(w, n_w), fill_sentinel(lse, n_l);
    a = layer_args(&d, out, w, lse);
    mha_status fst = cst == MHA_OK ? mha_mpi_layer_forward(tp, &a) : cst;
    int64_t hf = -1, hc = -1;
    mha_mpi_layer_heads(tp, &hf, &hc);
    int agree = same_on_all_ranks(out, n_out * sizeof *out);
    mha_mpi_layer_destroy(tp);

    ck_assert_msg(cst == MHA_OK && fst == MHA_OK, "rank %d: %s", rank,
                  mha_mpi_last_error());
    ck_assert_msg(hf == first && hc == count, "rank %d owns heads %lld+%lld",
                  rank, (long long)hf, (long long)hc);
    double r = ratio(out, want, n_out);
    ck_assert_msg(r <= 1.0, "rank %d of %d (%s): out differs from one "
                  "process (ratio %g)", rank, nranks,
                  _i ? "sliced" : "full", r);
    ck_assert_msg(agree, "ranks hold different outputs");
    /* Own heads: [B, count, ...] against the full layer's rows. */
    for (int64_t b = 0; b < LB; b++) {
        ck_assert_msg(ratio(w + b * count * LLQ * LLK,
                            want_w + (b * LH + first) * LLQ * LLK,
                            (size_t)(count * LLQ * LLK)) <= 1.0,
                      "rank %d: weights of batch %lld", rank, (long long)b);
        ck_assert_msg(ratio(lse + b * count * LLQ,
                            want_l + (b * LH + first) * LLQ,
                            (size_t)(count * LLQ)) <= 1.0,
                      "rank %d: lse of batch %lld", rank, (long long)b);
    }
    ck_assert_msg(count_changed(w + LB * count * LLQ * LLK,
                                n_w - (size_t)(LB * count * LLQ * LLK)) == 0,
                  "rank %d: weights written past its heads", rank);
    free(want), free(want_w), free(want_l), free(out), free(w), free(lse);
    free(in_w), free(in_b), free(out_w);
    mha_engine_destroy(e);
    layer_data_free(&d);
}
END_TEST

/* The same bits for repeated runs and for 1, 2 and 3 threads on every
 * rank, and on every rank alike; out with strides ([L, B, E]). */
START_TEST(layer_bitwise_over_runs_and_threads)
{
    layer_data d;
    layer_data_init(&d, 12);
    const size_t n_out = LB * LLQ * LE;
    float *first = test_alloc(n_out * sizeof *first);
    float *out = test_alloc(n_out * sizeof *out);
    int same = 1, ok = 1;
    /* Run 4 under the caller's rounding upward: the same bytes, and the
     * caller's mode after. */
    int kept_mode = 1;
    for (int run = 0; run < 5; run++) {
        mha_engine *e = engine(run == 0 || run == 4 ? 1 : run);
        mha_mpi_layer *tp = NULL;
        mha_status st = mha_mpi_layer_create(e, MPI_COMM_WORLD, &d.desc, &tp);
        mha_layer_args a = layer_args(&d, out, NULL, NULL);
        a.out_stride_batch = LE, a.out_stride_seq = LB * LE;
        if (run == 4)
            fesetround(FE_UPWARD);
        if (st == MHA_OK)
            st = mha_mpi_layer_forward(tp, &a);
        if (run == 4) {
            kept_mode = fegetround() == FE_UPWARD;
            fesetround(FE_TONEAREST);
        }
        ok &= st == MHA_OK;
        mha_mpi_layer_destroy(tp);
        mha_engine_destroy(e);
        if (run == 0)
            memcpy(first, out, n_out * sizeof *out);
        else
            same &= memcmp(first, out, n_out * sizeof *out) == 0;
    }
    int agree = same_on_all_ranks(first, n_out * sizeof *first);
    ck_assert_msg(ok, "rank %d: %s", rank, mha_mpi_last_error());
    ck_assert_msg(same, "rank %d: runs, thread counts or the caller's "
                  "rounding mode differ", rank);
    ck_assert_msg(kept_mode, "rank %d: the caller's rounding mode changed",
                  rank);
    ck_assert_msg(agree, "ranks hold different outputs");
    free(first), free(out);
    layer_data_free(&d);
}
END_TEST

/* Out with one stride 0 and the other not (batch 1, rows padded): taken
 * as given, as the single-process layer takes it; only both 0 means
 * packed. Each row's E values against one process, the padding
 * untouched. */
START_TEST(layer_out_one_stride_zero)
{
    enum { PAD = 3, LD = LE + PAD };
    layer_data d;
    layer_data_init(&d, 13);
    mha_engine *e = engine(1);
    const size_t n_out = LLQ * LD;
    float *want = test_alloc(n_out * sizeof *want);
    float *out = test_alloc(n_out * sizeof *out);
    fill_sentinel(want, n_out), fill_sentinel(out, n_out);
    mha_layer_args a = layer_args(&d, want, NULL, NULL);
    a.batch = 1;
    a.out_stride_batch = 0, a.out_stride_seq = LD;
    mha_layer *one;
    ck_assert_int_eq(mha_layer_create(e, &d.desc, &one), MHA_OK);
    ck_assert_int_eq(mha_layer_forward_ex(one, &a), MHA_OK);
    mha_layer_destroy(one);
    mha_mpi_layer *tp = NULL;
    mha_status st = mha_mpi_layer_create(e, MPI_COMM_WORLD, &d.desc, &tp);
    a.out = out;
    if (st == MHA_OK)
        st = mha_mpi_layer_forward(tp, &a);
    mha_mpi_layer_destroy(tp);
    ck_assert_msg(st == MHA_OK, "rank %d: %s", rank, mha_mpi_last_error());
    for (int64_t i = 0; i < LLQ; i++) {
        ck_assert_msg(ratio(out + i * LD, want + i * LD, LE) <= 1.0,
                      "rank %d of %d: row %lld differs from one process",
                      rank, nranks, (long long)i);
        ck_assert_msg(count_changed(out + i * LD + LE, PAD) == 0,
                      "rank %d: padding of row %lld written", rank,
                      (long long)i);
    }
    free(want), free(out);
    mha_engine_destroy(e);
    layer_data_free(&d);
}
END_TEST

/* ---- Sequence-parallel attention ------------------------------------- */

enum { AB = 2, AH = 6, AHKV = 3, AD = 16, ALQ = 5, ALK = 61 };

static const mha_dtype KV_DTYPES[3] = {MHA_F32, MHA_F16, MHA_I8};

/* Terms by case: none, causal + window, ALiBi + softcap + sinks. */
static const float SLOPES[AH] = {0.5f, 0.25f, 0.125f, 0.3f, 0.05f, 1.0f};
static const float SINKS[AH] = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f, -0.5f};
static const mha_score_terms ATERMS[3] = {
    {0},
    {.window = 1, .window_left = 20, .window_right = 0},
    {.alibi_slopes = SLOPES, .softcap = 8.0f, .sinks = SINKS},
};

/* K/V of ALK keys in dtype dt (8-bit: per-row scales), q, and views of
 * this rank's shard; the reference runs over all keys. */
typedef struct {
    float *q, *kf, *vf;  /* fp32 sources */
    void *k, *v;         /* in dt */
    float *ks, *vs;      /* per (b, key, head) scales, 8-bit only */
    mha_dtype dt;
} attn_data;

static void attn_data_init(attn_data *d, mha_dtype dt, uint64_t seed)
{
    test_rng r;
    rng_seed(&r, seed);
    const size_t nk = AB * ALK * AHKV * AD;
    d->q = random_floats(&r, AB * ALQ * AH * AD);
    d->kf = random_floats(&r, nk);
    d->vf = random_floats(&r, nk);
    d->dt = dt;
    d->ks = d->vs = NULL;
    size_t es = mha_dtype_size(dt);
    d->k = test_alloc(nk * es);
    d->v = test_alloc(nk * es);
    if (dt == MHA_F32) {
        memcpy(d->k, d->kf, nk * sizeof(float));
        memcpy(d->v, d->vf, nk * sizeof(float));
    } else if (dt == MHA_F16) {
        mha_f32_to_f16(d->kf, nk, d->k);
        mha_f32_to_f16(d->vf, nk, d->v);
    } else {
        d->ks = test_alloc(AB * ALK * AHKV * sizeof(float));
        d->vs = test_alloc(AB * ALK * AHKV * sizeof(float));
        mha_tensor src = mha_tensor_bshd(d->kf, AB, ALK, AHKV, AD);
        mha_tensor dst = mha_tensor_bshd_typed(d->k, dt, AB, ALK, AHKV, AD);
        dst.scales = (mha_scales){NULL, ALK * AHKV, AHKV, 1};
        ck_assert_int_eq(mha_quantize(&src, &dst, d->ks), MHA_OK);
        src.data = d->vf, dst.data = d->v;
        ck_assert_int_eq(mha_quantize(&src, &dst, d->vs), MHA_OK);
    }
}

static void attn_data_free(attn_data *d)
{
    free(d->q), free(d->kf), free(d->vf), free(d->k), free(d->v);
    free(d->ks), free(d->vs);
}

/* Keys [first, first + count) of d's K or V. */
static mha_tensor kv_view(const attn_data *d, int value, int64_t first,
                          int64_t count)
{
    size_t es = mha_dtype_size(d->dt);
    const char *base = value ? d->v : d->k;
    mha_tensor t = mha_tensor_bshd_typed(base + (size_t)(first * AHKV * AD) * es,
                                         d->dt, AB, count, AHKV, AD);
    t.stride_batch = ALK * AHKV * AD;
    if (d->ks) {
        const float *s = (value ? d->vs : d->ks) + first * AHKV;
        t.scales = (mha_scales){s, ALK * AHKV, AHKV, 1};
    }
    return t;
}

/* _i: dtype (_i % 3) x terms (_i / 3). Every rank's out and lse against
 * one mha_attention over all the keys; every rank alike. */
START_TEST(attention_matches_one_process)
{
    attn_data d;
    attn_data_init(&d, KV_DTYPES[_i % 3], 40 + (uint64_t)_i);
    const mha_score_terms *t = &ATERMS[_i / 3];
    mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_engine *e = engine(1);
    const size_t n_out = AB * ALQ * AH * AD, n_l = AB * AH * ALQ;
    float *want = test_alloc(n_out * sizeof *want);
    float *want_l = test_alloc(n_l * sizeof *want_l);
    float *out = test_alloc(n_out * sizeof *out);
    float *lse = test_alloc(n_l * sizeof *lse);
    mha_attention_args a = {
        .q = mha_tensor_bshd(d.q, AB, ALQ, AH, AD),
        .k = kv_view(&d, 0, 0, ALK), .v = kv_view(&d, 1, 0, ALK),
        .out = mha_tensor_bshd(want, AB, ALQ, AH, AD),
        .mask = _i / 3 == 1 ? &causal : NULL, .terms = t, .lse = want_l};
    ck_assert_int_eq(mha_attention(e, &a), MHA_OK);

    int64_t first, count;
    shard_of(ALK, rank, nranks, &first, &count);
    a.k = kv_view(&d, 0, first, count), a.v = kv_view(&d, 1, first, count);
    a.out.data = out, a.lse = lse;
    mha_status st = mha_mpi_attention(e, MPI_COMM_WORLD, &a);
    int agree = same_on_all_ranks(out, n_out * sizeof *out);

    ck_assert_msg(st == MHA_OK, "rank %d: %s", rank, mha_mpi_last_error());
    double r = ratio(out, want, n_out), rl = ratio(lse, want_l, n_l);
    ck_assert_msg(r <= 1.0 && rl <= 1.0,
                  "rank %d of %d, keys %lld+%lld, %s, terms %d: out ratio %g, "
                  "lse ratio %g", rank, nranks, (long long)first,
                  (long long)count, mha_dtype_name(d.dt), _i / 3, r, rl);
    ck_assert_msg(agree, "ranks hold different outputs");
    free(want), free(want_l), free(out), free(lse);
    mha_engine_destroy(e);
    attn_data_free(&d);
}
END_TEST

/* A continuous batch over paged shards: three sequences whose keys split
 * across the ranks differently (a rank may hold none of a sequence),
 * each rank's pool its own, blocks of 4 in shuffled order; packed queries
 * of 1, 3 and 2 rows. Against one mha_attention_varlen over packed keys
 * holding every key, with causal, a window and sinks; then the same
 * bits again on 2 threads. */
START_TEST(varlen_paged_matches_one_process)
{
    enum { VB = 3, BS = 4 };
    const int32_t lk[VB] = {37, 9, 50}, cu_q[VB + 1] = {0, 1, 4, 6};
    const int64_t tq = 6;
    test_rng r;
    rng_seed(&r, 77);
    int32_t cu_k[VB + 1] = {0};
    for (int b = 0; b < VB; b++)
        cu_k[b + 1] = cu_k[b] + lk[b];
    const int64_t tk = cu_k[VB];
    float *q = random_floats(&r, (size_t)(tq * AH * AD));
    float *k = random_floats(&r, (size_t)(tk * AHKV * AD));
    float *v = random_floats(&r, (size_t)(tk * AHKV * AD));
    mha_score_terms terms = {.window = 1, .window_left = 25,
                             .window_right = 0, .sinks = SINKS};
    mha_engine *e1 = engine(1);
    mha_engine *e2 = engine(2);
    const size_t n_out = (size_t)(tq * AH * AD), n_l = (size_t)(AH * tq);
    float *want = test_alloc(n_out * sizeof *want);
    float *want_l = test_alloc(n_l * sizeof *want_l);
    mha_varlen_args a = {.batch = VB,
                         .q = mha_tensor_bshd(q, 1, tq, AH, AD),
                         .cu_seqlens_q = cu_q,
                         .k = mha_tensor_bshd(k, 1, tk, AHKV, AD),
                         .v = mha_tensor_bshd(v, 1, tk, AHKV, AD),
                         .cu_seqlens_k = cu_k,
                         .out = mha_tensor_bshd(want, 1, tq, AH, AD),
                         .causal = MHA_CAUSAL_BOTTOM_RIGHT, .terms = &terms,
                         .lse = want_l};
    ck_assert_int_eq(mha_attention_varlen(e1, &a), MHA_OK);

    /* This rank's shard of each sequence; sequence 1 lies whole on rank 1
     * (rank 0 alone), so the other ranks hold none of it. */
    int64_t first[VB], count[VB];
    for (int b = 0; b < VB; b++)
        shard_of(lk[b], rank, nranks, &first[b], &count[b]);
    int owner = nranks > 1 ? 1 : 0;
    first[1] = 0, count[1] = rank == owner ? lk[1] : 0;
    /* The rank's pool: its shards' keys in blocks of BS, shuffled. */
    int64_t nblk = 0, maxb = 0;
    for (int b = 0; b < VB; b++) {
        int64_t nb = (count[b] + BS - 1) / BS;
        nblk += nb;
        maxb = nb > maxb ? nb : maxb;
    }
    if (maxb == 0)
        maxb = 1;
    int64_t pool_blocks = nblk + 2; /* two unused blocks, NaN-filled */
    float *kp = test_alloc((size_t)(pool_blocks * BS * AHKV * AD) * sizeof *kp);
    float *vp = test_alloc((size_t)(pool_blocks * BS * AHKV * AD) * sizeof *vp);
    for (int64_t i = 0; i < pool_blocks * BS * AHKV * AD; i++)
        kp[i] = vp[i] = NAN;
    int32_t *table = test_alloc((size_t)(VB * maxb) * sizeof *table);
    int32_t seqlens[VB];
    int64_t next = 0;
    for (int b = 0; b < VB; b++) {
        seqlens[b] = (int32_t)count[b];
        for (int64_t j = 0; j < count[b]; j++) {
            if (j % BS == 0)
                /* Block slots from the end of the pool backwards. */
                table[b * maxb + j / BS] = (int32_t)(pool_blocks - 1 - next++);
            int64_t blk = table[b * maxb + j / BS];
            size_t dst = (size_t)((blk * BS + j % BS) * AHKV * AD);
            size_t src = (size_t)((cu_k[b] + first[b] + j) * AHKV * AD);
            memcpy(kp + dst, k + src, AHKV * AD * sizeof *kp);
            memcpy(vp + dst, v + src, AHKV * AD * sizeof *vp);
        }
    }
    mha_paged_kv paged = {.block_table = table, .max_blocks = maxb,
                          .seqlens = seqlens};
    float *out = test_alloc(n_out * sizeof *out);
    float *out2 = test_alloc(n_out * sizeof *out2);
    float *lse = test_alloc(n_l * sizeof *lse);
    a.k = mha_tensor_bshd(kp, pool_blocks, BS, AHKV, AD);
    a.v = mha_tensor_bshd(vp, pool_blocks, BS, AHKV, AD);
    a.cu_seqlens_k = NULL, a.paged = &paged;
    a.out.data = out, a.lse = lse;
    mha_status st = mha_mpi_attention_varlen(e1, MPI_COMM_WORLD, &a);
    a.out.data = out2, a.lse = NULL;
    mha_status st2 = mha_mpi_attention_varlen(e2, MPI_COMM_WORLD, &a);
    int agree = same_on_all_ranks(out, n_out * sizeof *out);

    ck_assert_msg(st == MHA_OK && st2 == MHA_OK, "rank %d: %s", rank,
                  mha_mpi_last_error());
    double ro = ratio(out, want, n_out), rl = ratio(lse, want_l, n_l);
    ck_assert_msg(ro <= 1.0 && rl <= 1.0,
                  "rank %d of %d: out ratio %g, lse ratio %g", rank, nranks,
                  ro, rl);
    ck_assert_msg(memcmp(out, out2, n_out * sizeof *out) == 0,
                  "rank %d: 1 and 2 threads differ", rank);
    ck_assert_msg(agree, "ranks hold different outputs");
    free(q), free(k), free(v), free(want), free(want_l), free(kp), free(vp);
    free(table), free(out), free(out2), free(lse);
    mha_engine_destroy(e1), mha_engine_destroy(e2);
}
END_TEST

/* ---- Errors: every rank fails alike, nothing written, nothing hangs -- */

/* The rank that breaks its own arguments in the cases below: the last. */
static int culprit(void)
{
    return nranks - 1;
}

/* Whether msg names the field, and on other ranks the culprit rank. */
static int message_ok(const char *msg, const char *field)
{
    if (!strstr(msg, field))
        return 0;
    if (rank == culprit())
        return 1;
    char who[32];
    snprintf(who, sizeof who, "rank %d", culprit());
    return strstr(msg, who) != NULL;
}

/* _i selects the fault, made on the last rank only (on every rank where
 * noted); every rank must return want and leave out and lse untouched. */
typedef struct {
    const char *name, *field;
    mha_status want;
    int all_ranks; /* the fault is on every rank */
} attn_fault;

static const attn_fault ATTN_FAULTS[] = {
    {"q.seq differs across ranks", "q.seq", MHA_ERR_BAD_SHAPE, 0},
    {"out NULL on one rank", "out", MHA_ERR_NULL_POINTER, 0},
    {"terms.key_offset set on one rank", "terms.key_offset",
     MHA_ERR_BAD_ARGUMENT, 0},
    {"weights asked for", "weights", MHA_ERR_UNSUPPORTED, 1},
    {"causal differs across ranks", "causal", MHA_ERR_BAD_SHAPE, 0},
    {"k.heads does not divide q.heads on one rank", "k.heads",
     MHA_ERR_BAD_SHAPE, 0},
    /* Partials travel and merge in fp32: a half compute dtype is refused
     * (libmha's own calls take it). */
    {"bf16 q and out", "q.dtype", MHA_ERR_UNSUPPORTED, 1},
};
#define N_ATTN_FAULTS ((int)(sizeof ATTN_FAULTS / sizeof ATTN_FAULTS[0]))

START_TEST(attention_errors_agree)
{
    const attn_fault *f = &ATTN_FAULTS[_i];
    /* Disagreements need two ranks; alone, the rank's own checks still
     * apply to the faults that are local. */
    int disagreement = _i == 0 || _i == 4;
    attn_data d;
    attn_data_init(&d, MHA_F32, 90);
    mha_engine *e = engine(1);
    const size_t n_out = AB * ALQ * AH * AD, n_l = AB * AH * ALQ;
    float *out = test_alloc(n_out * sizeof *out);
    float *lse = test_alloc(n_l * sizeof *lse);
    float *w = test_alloc((size_t)(AB * AH * ALQ * ALK) * sizeof *w);
    fill_sentinel(out, n_out), fill_sentinel(lse, n_l);
    int64_t first, count;
    shard_of(ALK, rank, nranks, &first, &count);
    mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_score_terms t = {0};
    mha_attention_args a = {.q = mha_tensor_bshd(d.q, AB, ALQ, AH, AD),
                            .k = kv_view(&d, 0, first, count),
                            .v = kv_view(&d, 1, first, count),
                            .out = mha_tensor_bshd(out, AB, ALQ, AH, AD),
                            .lse = lse, .mask = &causal, .terms = &t};
    int here = f->all_ranks || rank == culprit();
    if (here) {
        switch (_i) {
        case 0: a.q.seq = a.out.seq = ALQ - 1; break;
        case 1: a.out.data = NULL; break;
        case 2: t.key_offset = 3; break;
        case 3: a.weights = w; break;
        case 4: causal.causal = MHA_CAUSAL_TOP_LEFT; break;
        case 5: a.k.heads = 4, a.v.heads = 4; break;
        case 6: a.q.dtype = a.out.dtype = MHA_BF16; break;
        }
    }
    mha_status st = mha_mpi_attention(e, MPI_COMM_WORLD, &a);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mha_mpi_last_error());
    mha_engine_destroy(e);

    if (disagreement && nranks == 1) {
        /* One rank agrees with itself: a valid call on its own. */
        ck_assert_msg(st == MHA_OK, "%s alone: %s", f->name, msg);
    } else {
        ck_assert_msg(st == f->want, "%s: rank %d got %s, want %s (%s)",
                      f->name, rank, mha_status_string(st),
                      mha_status_string(f->want), msg);
        /* A disagreement is no one rank's fault: every rank names the
         * field. */
        ck_assert_msg(message_ok(msg, f->field) ||
                          ((f->all_ranks || disagreement) &&
                           strstr(msg, f->field)),
                      "%s: rank %d's message \"%s\" names neither %s nor the "
                      "rank", f->name, rank, msg, f->field);
        ck_assert_msg(count_changed(out, n_out) == 0 &&
                          count_changed(lse, n_l) == 0,
                      "%s: rank %d's outputs were written", f->name, rank);
    }
    free(out), free(lse), free(w);
    attn_data_free(&d);
}
END_TEST

/* Layer faults: heads not a multiple of the ranks, shard fields that are
 * not this rank's (a communicator of the wrong size), one rank's NULL
 * weights, one rank's batch. */
START_TEST(layer_errors_agree)
{
    layer_data d;
    layer_data_init(&d, 13);
    mha_engine *e = engine(1);
    mha_mpi_layer *tp = NULL;
    mha_layer_desc desc = d.desc;
    const char *field = "";
    mha_status want = MHA_OK;
    int fault = 1;
    switch (_i) {
    case 0: /* 7 heads over the ranks: fine alone */
        desc.embed_dim = 7 * 8, desc.num_heads = 7;
        fault = nranks > 1 && 7 % nranks != 0;
        want = MHA_ERR_BAD_SHAPE, field = "desc.num_heads";
        break;
    case 1: /* slices cut for one more rank than there are */
        desc.shard_heads = LH / (nranks + 1) ? LH / (nranks + 1) : 1;
        desc.shard_first = rank * desc.shard_heads;
        want = MHA_ERR_BAD_ARGUMENT, field = "shard";
        fault = desc.shard_heads != LH / nranks;
        break;
    case 2:
        if (rank == culprit())
            desc.out_proj_weight = NULL;
        want = MHA_ERR_NULL_POINTER, field = "out_proj_weight";
        break;
    }
    float *big = NULL;
    if (_i == 0) {
        test_rng r;
        rng_seed(&r, 5);
        big = random_floats(&r, 4 * 56 * 56);
        desc.in_proj_weight = big, desc.out_proj_weight = big + 3 * 56 * 56;
        desc.in_proj_bias = NULL, desc.out_proj_bias = NULL;
    }
    mha_status st = mha_mpi_layer_create(e, MPI_COMM_WORLD, &desc, &tp);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mha_mpi_last_error());
    mha_mpi_layer_destroy(tp);

    /* The forward: one rank's batch differs. */
    mha_status fst = MHA_ERR_BAD_ARGUMENT;
    float *out = test_alloc(LB * LLQ * LE * sizeof *out);
    fill_sentinel(out, LB * LLQ * LE);
    if (_i == 2) {
        mha_mpi_layer *ok_layer = NULL;
        mha_status cst = mha_mpi_layer_create(e, MPI_COMM_WORLD, &d.desc,
                                              &ok_layer);
        mha_layer_args a = layer_args(&d, out, NULL, NULL);
        if (rank == culprit())
            a.batch = 1;
        fst = cst == MHA_OK ? mha_mpi_layer_forward(ok_layer, &a) : cst;
        mha_mpi_layer_destroy(ok_layer);
    }
    mha_engine_destroy(e);

    if (!fault) {
        ck_assert_msg(st == MHA_OK, "case %d with %d ranks: %s", _i, nranks,
                      msg);
    } else {
        ck_assert_msg(st == want, "case %d: rank %d got %s, want %s (%s)", _i,
                      rank, mha_status_string(st), mha_status_string(want),
                      msg);
        ck_assert_msg(strstr(msg, field), "case %d: rank %d's message \"%s\" "
                      "does not name %s", _i, rank, msg, field);
    }
    if (_i == 2) {
        if (nranks > 1) {
            ck_assert_msg(fst == MHA_ERR_BAD_SHAPE, "one rank's batch: rank "
                          "%d got %s (%s)", rank, mha_status_string(fst),
                          mha_mpi_last_error());
            ck_assert_msg(count_changed(out, LB * LLQ * LE) == 0,
                          "rank %d's out was written", rank);
        } else {
            ck_assert_msg(fst == MHA_OK, "batch 1 alone: %s",
                          mha_mpi_last_error());
        }
    }
    free(out), free(big);
    layer_data_free(&d);
}
END_TEST

/* ---- Allocation failures ---------------------------------------------- */

/* _i 0: a tensor-parallel layer created and run; 1: sequence-parallel
 * attention. Returns the call's status; out and lse are what it writes. */
static mha_status oom_call(int which, layer_data *ld, attn_data *ad,
                           mha_engine *e, float *out, float *lse)
{
    if (which == 0) {
        mha_mpi_layer *tp = NULL;
        mha_status st = mha_mpi_layer_create(e, MPI_COMM_WORLD, &ld->desc,
                                             &tp);
        if (st == MHA_OK) {
            mha_layer_args a = layer_args(ld, out, NULL, lse);
            st = mha_mpi_layer_forward(tp, &a);
        }
        mha_mpi_layer_destroy(tp);
        return st;
    }
    int64_t first, count;
    shard_of(ALK, rank, nranks, &first, &count);
    mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_attention_args a = {.q = mha_tensor_bshd(ad->q, AB, ALQ, AH, AD),
                            .k = kv_view(ad, 0, first, count),
                            .v = kv_view(ad, 1, first, count),
                            .out = mha_tensor_bshd(out, AB, ALQ, AH, AD),
                            .lse = lse, .mask = &causal};
    return mha_mpi_attention(e, MPI_COMM_WORLD, &a);
}

/* Each allocation the MPI component makes on one rank (the last) fails in
 * turn (mpi_test_hooks.h): every rank returns MHA_ERR_OUT_OF_MEMORY with
 * its outputs untouched, none is left waiting in a collective, and once
 * the rank's allocations all succeed every rank gets the bytes of an
 * unhindered call. */
START_TEST(allocation_failure_on_one_rank)
{
    layer_data ld;
    attn_data ad;
    layer_data_init(&ld, 14);
    attn_data_init(&ad, MHA_F32, 92);
    mha_engine *e = engine(1);
    const size_t n_out = _i == 0 ? LB * LLQ * LE : AB * ALQ * AH * AD;
    const size_t n_l = _i == 0 ? LB * LH * LLQ : AB * AH * ALQ;
    float *want = test_alloc(n_out * sizeof *want);
    float *want_l = test_alloc(n_l * sizeof *want_l);
    float *out = test_alloc(n_out * sizeof *out);
    float *lse = test_alloc(n_l * sizeof *lse);
    fill_sentinel(want_l, n_l);
    mha_mpi_test_fail_alloc_after(-1);
    mha_status st0 = oom_call(_i, &ld, &ad, e, want, want_l);
    long made = mha_mpi_test_fail_alloc_after(-1);
    /* Every rank loops over the culprit's allocations alike. */
    MPI_Bcast(&made, 1, MPI_LONG, culprit(), MPI_COMM_WORLD);
    char bad[512] = "";
    for (long n = 0; n <= made; n++) {
        if (rank == culprit())
            mha_mpi_test_fail_alloc_after(n);
        fill_sentinel(out, n_out), fill_sentinel(lse, n_l);
        mha_status st = oom_call(_i, &ld, &ad, e, out, lse);
        mha_mpi_test_fail_alloc_after(-1);
        int ok = n < made
                     ? st == MHA_ERR_OUT_OF_MEMORY &&
                           count_changed(out, n_out) == 0 &&
                           count_changed(lse, n_l) == 0
                     : st == MHA_OK &&
                           memcmp(out, want, n_out * sizeof *out) == 0 &&
                           memcmp(lse, want_l, n_l * sizeof *lse) == 0;
        if (!ok && !bad[0])
            snprintf(bad, sizeof bad, "allocation %ld of %ld failing on rank "
                     "%d: status %s (%s)%s", n, made, culprit(),
                     mha_status_string(st), mha_mpi_last_error(),
                     st == MHA_ERR_OUT_OF_MEMORY || st == MHA_OK
                         ? ", outputs not as they should be" : "");
    }
    ck_assert_msg(st0 == MHA_OK, "rank %d: %s", rank, mha_mpi_last_error());
    ck_assert_msg(made > 0, "the %s made no allocation on rank %d",
                  _i == 0 ? "layer" : "attention", culprit());
    ck_assert_msg(!bad[0], "rank %d of %d, %s: %s", rank, nranks,
                  _i == 0 ? "layer" : "attention", bad);
    free(want), free(want_l), free(out), free(lse);
    mha_engine_destroy(e);
    attn_data_free(&ad);
    layer_data_free(&ld);
}
END_TEST

static Suite *suite_mpi(void)
{
    Suite *s = suite_create("mpi");
    TCase *tc = tcase_create("mpi");
    tcase_add_loop_test(tc, layer_matches_one_process, 0, 2);
    tcase_add_test(tc, layer_bitwise_over_runs_and_threads);
    tcase_add_test(tc, layer_out_one_stride_zero);
    tcase_add_loop_test(tc, attention_matches_one_process, 0, 9);
    tcase_add_test(tc, varlen_paged_matches_one_process);
    tcase_add_loop_test(tc, attention_errors_agree, 0, N_ATTN_FAULTS);
    tcase_add_loop_test(tc, layer_errors_agree, 0, 3);
    tcase_add_loop_test(tc, allocation_failure_on_one_rank, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (rank == 0) {
        char isas[256];
        describe_isas(isas, sizeof isas);
        printf("%d ranks; %s\n", nranks, isas);
        fflush(stdout);
    }
    SRunner *runner = srunner_create(suite_mpi());
    srunner_set_fork_status(runner, CK_NOFORK);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner), any = 0;
    srunner_free(runner);
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
