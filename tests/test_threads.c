/*
 * Determinism and concurrency, per ISA:
 *  - outputs (and weights) bitwise equal for 1, 2, 3 and 7 OpenMP threads,
 *    for masked attention (prefill, decode with split keys, GQA) and for
 *    the layer;
 *  - several pthreads calling mha_attention and mha_layer_forward on one
 *    shared engine and layer at once get the bytes of serial calls.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct job {
    const char *name;
    int is_layer;
    /* attention: args with out.data and weights set per run */
    mha_attention_args args;
    /* layer */
    int64_t b, lq, lk;
    const float *query, *key, *value;
    size_t out_floats, w_floats;
    int want_weights;
} job;

/* The inputs every job reads; built once per test. */
typedef struct workload {
    job jobs[8];
    int n_jobs;
    float *bufs[32];
    int n_bufs;
    uint8_t *keep;
    float *bias;
    int32_t lengths[3];
    mha_mask mask_prefill, mask_decode, mask_layer;
    mha_layer_desc desc;
} workload;

static float *owned(workload *w, test_rng *r, size_t n)
{
    ck_assert_int_lt(w->n_bufs, (int)(sizeof w->bufs / sizeof w->bufs[0]));
    float *x = random_floats(r, n);
    w->bufs[w->n_bufs++] = x;
    return x;
}

static void add_attention(workload *w, test_rng *r, const char *name,
                          int64_t b, int64_t lq, int64_t lk, int64_t h,
                          int64_t hkv, int64_t d, const mha_mask *mask,
                          int want_weights)
{
    job *j = &w->jobs[w->n_jobs++];
    memset(j, 0, sizeof *j);
    j->name = name;
    j->args.q = layout_view(LAYOUT_BHSD, owned(w, r, (size_t)(b * lq * h * d)),
                            b, lq, h, d);
    j->args.k = layout_view(LAYOUT_BSHD,
                            owned(w, r, (size_t)(b * lk * hkv * d)), b, lk,
                            hkv, d);
    j->args.v = layout_view(LAYOUT_BSHD,
                            owned(w, r, (size_t)(b * lk * hkv * d)), b, lk,
                            hkv, d);
    j->args.out = layout_view(LAYOUT_BSHD, NULL, b, lq, h, d);
    j->args.mask = mask;
    j->out_floats = (size_t)(b * lq * h * d);
    j->w_floats = (size_t)(b * h * lq * lk);
    j->want_weights = want_weights;
}

static void add_layer(workload *w, test_rng *r, const char *name, int64_t b,
                      int64_t lq, int64_t lk, int want_weights)
{
    const int64_t E = w->desc.embed_dim, H = w->desc.num_heads;
    job *j = &w->jobs[w->n_jobs++];
    memset(j, 0, sizeof *j);
    j->name = name;
    j->is_layer = 1;
    j->b = b, j->lq = lq, j->lk = lk;
    j->query = owned(w, r, (size_t)(b * lq * E));
    if (lq == lk) {
        j->key = j->value = j->query;
    } else {
        j->key = owned(w, r, (size_t)(b * lk * E));
        j->value = owned(w, r, (size_t)(b * lk * E));
    }
    j->out_floats = (size_t)(b * lq * E);
    j->w_floats = (size_t)(b * H * lq * lk);
    j->want_weights = want_weights;
}

static void workload_init(workload *w)
{
    test_rng r;
    rng_seed(&r, 2024);
    memset(w, 0, sizeof *w);
    /* Prefill: B 2, H 4 over Hkv 2, Lq 130, Lk 300, every mask kind. */
    const int64_t lq = 130, lk = 300;
    w->keep = test_alloc((size_t)(2 * lk));
    for (int64_t i = 0; i < 2 * lk; i++)
        w->keep[i] = rng_uniform(&r) < 0.6f;
    w->bias = owned(w, &r, (size_t)(lq * lk));
    for (int64_t i = 0; i < lq * lk; i += 7)
        w->bias[i] = -INFINITY;
    w->lengths[0] = (int32_t)lk;
    w->lengths[1] = 211;
    w->lengths[2] = 0;
    w->mask_prefill = (mha_mask){.causal = MHA_CAUSAL_BOTTOM_RIGHT,
                                 .keep = w->keep, .keep_stride_batch = lk,
                                 .bias = w->bias, .bias_stride_query = lk,
                                 .key_lengths = w->lengths};
    add_attention(w, &r, "prefill masked", 2, lq, lk, 4, 2, 64,
                  &w->mask_prefill, 1);
    /* Decode: Lq 1 over a long cache, the split-key path. */
    static const int32_t decode_lengths[3] = {1031, 700, 0};
    w->mask_decode = (mha_mask){.key_lengths = decode_lengths};
    add_attention(w, &r, "decode GQA", 3, 1, 1031, 8, 1, 128,
                  &w->mask_decode, 0);
    add_attention(w, &r, "decode weights", 3, 1, 1031, 8, 2, 64,
                  &w->mask_decode, 1);
    add_attention(w, &r, "decode long cache", 1, 1, 4099, 8, 2, 64, NULL, 0);
    add_attention(w, &r, "odd shape", 1, 17, 65, 2, 2, 3, NULL, 1);

    /* The layer: E 64, H 4, packed projections with biases. */
    const int64_t E = 64;
    w->desc = (mha_layer_desc){.embed_dim = E, .num_heads = 4,
                               .in_proj_weight = owned(w, &r, 3 * E * E),
                               .in_proj_bias = owned(w, &r, 3 * E),
                               .out_proj_weight = owned(w, &r, E * E),
                               .out_proj_bias = owned(w, &r, E)};
    w->mask_layer = (mha_mask){.causal = MHA_CAUSAL_TOP_LEFT};
    add_layer(w, &r, "layer self", 2, 37, 37, 1);
    add_layer(w, &r, "layer cross decode", 3, 1, 500, 0);
}

static void workload_free(workload *w)
{
    for (int i = 0; i < w->n_bufs; i++)
        free(w->bufs[i]);
    free(w->keep);
}

static mha_status run_job(const mha_engine *e, const mha_layer *layer,
                          const workload *w, const job *j, float *out,
                          float *weights)
{
    if (!j->want_weights)
        weights = NULL;
    if (j->is_layer)
        return mha_layer_forward(layer, j->query, j->key, j->value, j->b,
                                 j->lq, j->lk,
                                 j->lq == j->lk ? &w->mask_layer : NULL, out,
                                 weights);
    mha_attention_args a = j->args;
    a.out.data = out;
    a.weights = weights;
    return mha_attention(e, &a);
}

/* Output bytes of every job of w on engine e (with its own layer). */
typedef struct results {
    float *out[8], *w[8];
} results;

static void run_all(const mha_engine *e, const workload *w, results *res)
{
    mha_layer *layer;
    ck_assert_int_eq(mha_layer_create(e, &w->desc, &layer), MHA_OK);
    for (int i = 0; i < w->n_jobs; i++) {
        const job *j = &w->jobs[i];
        res->out[i] = test_alloc(j->out_floats * sizeof(float));
        res->w[i] = test_alloc(j->w_floats * sizeof(float));
        fill_sentinel(res->out[i], j->out_floats);
        fill_sentinel(res->w[i], j->w_floats);
        mha_status st = run_job(e, layer, w, j, res->out[i], res->w[i]);
        ck_assert_msg(st == MHA_OK, "%s: %s (%s)", j->name,
                      mha_status_string(st), mha_last_error());
    }
    mha_layer_destroy(layer);
}

static void results_free(const workload *w, results *res)
{
    for (int i = 0; i < w->n_jobs; i++) {
        free(res->out[i]);
        free(res->w[i]);
    }
}

static void expect_same(const workload *w, const results *a,
                        const results *b, const char *isa, const char *how)
{
    for (int i = 0; i < w->n_jobs; i++) {
        const job *j = &w->jobs[i];
        ck_assert_msg(memcmp(a->out[i], b->out[i],
                             j->out_floats * sizeof(float)) == 0,
                      "%s [%s]: out differs %s", j->name, isa, how);
        ck_assert_msg(!j->want_weights ||
                          memcmp(a->w[i], b->w[i],
                                 j->w_floats * sizeof(float)) == 0,
                      "%s [%s]: weights differ %s", j->name, isa, how);
    }
}

START_TEST(bitwise_equal_across_thread_counts)
{
    static const int threads[] = {1, 2, 3, 7};
    workload w;
    workload_init(&w);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        const char *isa = mha_isa_name(isas[t]);
        results base;
        mha_engine *e1 = make_engine(isas[t], threads[0]);
        run_all(e1, &w, &base);
        mha_engine_destroy(e1);
        for (size_t n = 1; n < sizeof threads / sizeof threads[0]; n++) {
            mha_engine *e = make_engine(isas[t], threads[n]);
            ck_assert_int_eq(mha_engine_num_threads(e), threads[n]);
            results res;
            run_all(e, &w, &res);
            char how[64];
            snprintf(how, sizeof how, "between 1 and %d threads", threads[n]);
            expect_same(&w, &base, &res, isa, how);
            results_free(&w, &res);
            mha_engine_destroy(e);
        }
        results_free(&w, &base);
    }
    workload_free(&w);
}
END_TEST

/* ---- Many callers on one engine --------------------------------------- */

enum { CALLERS = 4, ROUNDS = 3 };

typedef struct caller {
    const mha_engine *engine;
    const mha_layer *layer;
    const workload *w;
    const results *want;
    int first;       /* job order is rotated per caller */
    int mismatches;  /* written by the caller thread, read after join */
    int failures;
} caller;

static void *caller_main(void *p)
{
    caller *c = p;
    const workload *w = c->w;
    for (int round = 0; round < ROUNDS; round++)
        for (int k = 0; k < w->n_jobs; k++) {
            int i = (c->first + k) % w->n_jobs;
            const job *j = &w->jobs[i];
            float *out = malloc(j->out_floats * sizeof(float));
            float *wt = malloc(j->w_floats * sizeof(float));
            if (!out || !wt) {
                c->failures++;
            } else if (run_job(c->engine, c->layer, w, j, out, wt) !=
                       MHA_OK) {
                c->failures++;
            } else {
                c->mismatches +=
                    memcmp(out, c->want->out[i],
                           j->out_floats * sizeof(float)) != 0 ||
                    (j->want_weights &&
                     memcmp(wt, c->want->w[i],
                            j->w_floats * sizeof(float)) != 0);
            }
            free(out);
            free(wt);
        }
    return NULL;
}

START_TEST(concurrent_callers_share_an_engine)
{
    workload w;
    workload_init(&w);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        mha_engine *e = make_engine(isas[t], 2);
        results serial;
        run_all(e, &w, &serial);
        mha_layer *layer;
        ck_assert_int_eq(mha_layer_create(e, &w.desc, &layer), MHA_OK);
        caller callers[CALLERS];
        pthread_t th[CALLERS];
        for (int c = 0; c < CALLERS; c++) {
            callers[c] = (caller){.engine = e, .layer = layer, .w = &w,
                                  .want = &serial, .first = c};
            ck_assert_int_eq(
                pthread_create(&th[c], NULL, caller_main, &callers[c]), 0);
        }
        for (int c = 0; c < CALLERS; c++)
            ck_assert_int_eq(pthread_join(th[c], NULL), 0);
        for (int c = 0; c < CALLERS; c++) {
            ck_assert_msg(callers[c].failures == 0,
                          "[%s] caller %d: %d calls failed",
                          mha_isa_name(isas[t]), c, callers[c].failures);
            ck_assert_msg(callers[c].mismatches == 0,
                          "[%s] caller %d: %d results differ from serial",
                          mha_isa_name(isas[t]), c, callers[c].mismatches);
        }
        mha_layer_destroy(layer);
        results_free(&w, &serial);
        mha_engine_destroy(e);
    }
    workload_free(&w);
}
END_TEST

/* ---- Many callers on one layer that keeps its workspace --------------- */

typedef struct ws_caller {
    const mha_layer *layer;
    const ws_layer *f;
    const float *want; /* 3 x WS_E */
    int calls, failures, mismatches;
} ws_caller;

static void *ws_caller_main(void *p)
{
    ws_caller *c = p;
    for (int i = 0; i < c->calls; i++) {
        float out[3 * WS_E];
        /* Alternately the larger call and the smaller: the kept block is
         * taken, replaced and given back across the callers. */
        int64_t lk = i % 2 ? WS_KEYS : WS_KEYS + WS_KEYS / 4;
        if (mha_layer_forward(c->layer, c->f->query, c->f->kv, c->f->kv, 1,
                              3, lk, NULL, out, NULL) != MHA_OK)
            c->failures++;
        else
            c->mismatches += memcmp(out, c->want + (i % 2) * 3 * WS_E,
                                    sizeof out) != 0;
    }
    return NULL;
}

/* CALLERS pthreads call one layer at once with workspaces the layer keeps
 * between calls (engine/layer.c, ws_take): each gets the bytes of a
 * serial call on a layer of its own (ThreadSanitizer's stage runs this
 * suite). */
START_TEST(concurrent_callers_share_a_kept_workspace)
{
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    mha_engine *e = make_engine(isas[n_isa > 1 ? 1 : 0], 1);
    ws_layer *f = test_alloc(sizeof *f);
    ws_layer_init(f, WS_KEYS + WS_KEYS / 4);
    float want[2][3 * WS_E];
    for (int i = 0; i < 2; i++) {
        mha_layer *own;
        ck_assert_int_eq(mha_layer_create(e, &f->desc, &own), MHA_OK);
        ck_assert_int_eq(mha_layer_forward(own, f->query, f->kv, f->kv, 1, 3,
                                           i ? WS_KEYS
                                             : WS_KEYS + WS_KEYS / 4,
                                           NULL, want[i], NULL),
                         MHA_OK);
        mha_layer_destroy(own);
    }
    mha_layer *layer;
    ck_assert_int_eq(mha_layer_create(e, &f->desc, &layer), MHA_OK);
    ws_caller callers[CALLERS];
    pthread_t th[CALLERS];
    for (int c = 0; c < CALLERS; c++) {
        callers[c] = (ws_caller){layer, f, &want[0][0], 4, 0, 0};
        ck_assert_int_eq(
            pthread_create(&th[c], NULL, ws_caller_main, &callers[c]), 0);
    }
    for (int c = 0; c < CALLERS; c++)
        ck_assert_int_eq(pthread_join(th[c], NULL), 0);
    for (int c = 0; c < CALLERS; c++) {
        ck_assert_msg(callers[c].failures == 0, "caller %d: %d calls failed",
                      c, callers[c].failures);
        ck_assert_msg(callers[c].mismatches == 0,
                      "caller %d: %d results differ from serial", c,
                      callers[c].mismatches);
    }
    mha_layer_destroy(layer);
    free(f->kv);
    free(f);
    mha_engine_destroy(e);
}
END_TEST

Suite *suite_threads(void)
{
    Suite *s = suite_create("threads");
    TCase *tc = tcase_create("threads");
    tcase_add_test(tc, bitwise_equal_across_thread_counts);
    tcase_add_test(tc, concurrent_callers_share_an_engine);
    tcase_add_test(tc, concurrent_callers_share_a_kept_workspace);
    suite_add_tcase(s, tc);
    return s;
}
