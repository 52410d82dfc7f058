/*
 * Determinism and concurrency, per ISA:
 *  - outputs (and weights) bitwise equal for 1, 2, 3 and 7 OpenMP threads,
 *    for masked attention (prefill, decode with split keys, GQA, subnormal
 *    values, NaN and infinite inputs) and for the layer;
 *  - several pthreads calling mha_attention and mha_layer_forward on one
 *    shared engine and layer at once get the bytes of serial calls;
 *  - the calling thread's floating-point environment (rounding mode,
 *    FTZ/DAZ, enabled traps) changes no byte and raises no signal, and is
 *    the caller's again after each call, flags included;
 *  - mha_config.flush_subnormals reads subnormal inputs as 0 on every
 *    thread of a call.
 */
#define _GNU_SOURCE /* feenableexcept */
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oracle.h"
#include "util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

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
    job jobs[10];
    int n_jobs;
    float *bufs[40];
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
    /* Values below FLT_MIN: the P·V sums are subnormal, which FTZ (the
     * caller's, not the engine's) would make 0. */
    add_attention(w, &r, "subnormal values", 1, 40, 90, 2, 2, 16, NULL, 1);
    float *v = (float *)w->jobs[w->n_jobs - 1].args.v.data;
    for (int64_t i = 0; i < 90 * 2 * 16; i++)
        v[i] = ldexpf(v[i], -130);
    /* A NaN query element and an infinite key element: NaN rows, and an
     * invalid operation that a trap would turn into SIGFPE. */
    add_attention(w, &r, "nan and inf inputs", 1, 9, 70, 2, 1, 32, NULL, 0);
    ((float *)w->jobs[w->n_jobs - 1].args.q.data)[40] = NAN;
    ((float *)w->jobs[w->n_jobs - 1].args.k.data)[100] = INFINITY;

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
    float *out[10], *w[10];
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

/* ---- The caller's floating-point environment -------------------------- */

enum {
    ENV_UPWARD,
    ENV_DOWNWARD,
    ENV_TOWARD_ZERO,
    ENV_FLUSH,
    ENV_TRAPS,
    ENV_COUNT
};
static const char *const env_names[ENV_COUNT] = {
    "rounding upward", "rounding downward", "rounding toward zero",
    "subnormals flushed (FTZ and DAZ, or FZ)", "traps enabled"};

/* The calling thread's control state the tests set (rounding, flushing,
 * trap enables; not the flags). */
static uint64_t fp_controls(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return _mm_getcsr() & ~0x3Fu;
#elif defined(__aarch64__)
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return fpcr;
#else
    return (uint64_t)fegetround();
#endif
}

/* Sets environment e on the calling thread over the default; 0 when this
 * platform cannot (flushing outside x86 and AArch64; traps where the FPU,
 * or qemu's, has none). */
static int set_caller_env(int e)
{
    fesetenv(FE_DFL_ENV);
    switch (e) {
    case ENV_UPWARD: return fesetround(FE_UPWARD) == 0;
    case ENV_DOWNWARD: return fesetround(FE_DOWNWARD) == 0;
    case ENV_TOWARD_ZERO: return fesetround(FE_TOWARDZERO) == 0;
    case ENV_FLUSH:
#if defined(__x86_64__) || defined(__i386__)
        _mm_setcsr(_mm_getcsr() | 0x8040u);
        return 1;
#elif defined(__aarch64__)
    {
        uint64_t fpcr;
        __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
        fpcr |= (uint64_t)1 << 24;
        __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
        return 1;
    }
#else
        return 0;
#endif
    case ENV_TRAPS: {
        const int traps = FE_INVALID | FE_DIVBYZERO | FE_OVERFLOW;
        return feenableexcept(traps) != -1 && fegetexcept() == traps;
    }
    }
    return 0;
}

/* The workload under each environment, on 1 and 2 threads, against its
 * bytes under the default environment: the same bytes, no signal (a
 * trapped NaN would end the suite), the environment the caller's again
 * after every call. Then the flags: a call's own (the NaN job's invalid
 * operation) do not reach the caller, and the caller's stay. */
START_TEST(caller_fp_environment_changes_nothing)
{
    workload w;
    workload_init(&w);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    int ran[ENV_COUNT] = {0};
    for (int t = 0; t < n_isa; t++) {
        const char *isa = mha_isa_name(isas[t]);
        results base;
        mha_engine *e1 = make_engine(isas[t], 1);
        run_all(e1, &w, &base);
        mha_engine_destroy(e1);
        for (int env = 0; env < ENV_COUNT; env++)
            for (int threads = 1; threads <= 2; threads++) {
                mha_engine *e = make_engine(isas[t], threads);
                if (!set_caller_env(env)) {
                    fesetenv(FE_DFL_ENV);
                    mha_engine_destroy(e);
                    continue;
                }
                ran[env] = 1;
                uint64_t want = fp_controls();
                results res;
                run_all(e, &w, &res);
                uint64_t after = fp_controls();
                fesetenv(FE_DFL_ENV);
                ck_assert_msg(after == want,
                              "[%s] %s, %d threads: the caller's control "
                              "state went from %#llx to %#llx",
                              isa, env_names[env], threads,
                              (unsigned long long)want,
                              (unsigned long long)after);
                char how[96];
                snprintf(how, sizeof how, "under %s, %d threads",
                         env_names[env], threads);
                expect_same(&w, &base, &res, isa, how);
                results_free(&w, &res);
                mha_engine_destroy(e);
            }
        mha_engine *e2 = make_engine(isas[t], 2);
        results res;
        feclearexcept(FE_ALL_EXCEPT);
        run_all(e2, &w, &res);
        ck_assert_msg(fetestexcept(FE_ALL_EXCEPT) == 0,
                      "[%s] the calls left flags %#x raised", isa,
                      fetestexcept(FE_ALL_EXCEPT));
        results_free(&w, &res);
        /* glibc may raise underflow by an operation that is inexact too
         * (AArch64): the caller's flags are those it then holds. */
        feraiseexcept(FE_UNDERFLOW);
        int raised = fetestexcept(FE_ALL_EXCEPT);
        ck_assert(raised & FE_UNDERFLOW);
        run_all(e2, &w, &res);
        ck_assert_msg(fetestexcept(FE_ALL_EXCEPT) == raised,
                      "[%s] the caller's flags %#x became %#x", isa, raised,
                      fetestexcept(FE_ALL_EXCEPT));
        feclearexcept(FE_ALL_EXCEPT);
        results_free(&w, &res);
        mha_engine_destroy(e2);
        results_free(&w, &base);
    }
    for (int env = 0; env < ENV_COUNT; env++)
        if (!ran[env])
            printf("threads: the caller's %s cannot be set here: not run\n",
                   env_names[env]);
    workload_free(&w);
}
END_TEST

/* ---- mha_config.flush_subnormals ---------------------------------------- */

static mha_engine *make_flush_engine(mha_isa isa, int threads, int flush)
{
    mha_config c = {.num_threads = threads, .isa = isa,
                    .flush_subnormals = flush};
    return make_engine_config(&c);
}

static void attend(const mha_engine *e, const mha_attention_args *a,
                   const float *k, const float *v, float *out)
{
    mha_attention_args x = *a;
    x.k.data = (void *)k;
    x.v.data = (void *)v;
    x.out.data = out;
    ck_assert_int_eq(mha_attention(e, &x), MHA_OK);
}

/* An engine that flushes computes normal data to the bytes of one that
 * does not; with every third element of k and v subnormal, to the bytes
 * of those elements zeroed (sign kept), on 1 and 2 threads; and from
 * values that are all subnormal, where IEEE gives subnormal outputs, to
 * zeros. The layer (no biases) from subnormal inputs: zeros as well. */
START_TEST(flush_subnormals_reads_them_as_zero)
{
#if !defined(__x86_64__) && !defined(__i386__) && !defined(__aarch64__)
    mha_config c = {.flush_subnormals = 1};
    mha_engine *none = NULL;
    ck_assert_int_eq(mha_engine_create(&c, &none), MHA_ERR_UNSUPPORTED);
    printf("threads: flush_subnormals is unsupported on this CPU: not run\n");
    return;
#endif
    enum { B = 2, LQ = 33, LK = 77, H = 4, HKV = 2, D = 64 };
    const size_t nq = (size_t)B * LQ * H * D, nk = (size_t)B * LK * HKV * D;
    test_rng r;
    rng_seed(&r, 77);
    float *q = random_floats(&r, nq), *k = random_floats(&r, nk);
    float *v = random_floats(&r, nk);
    float *km = test_alloc(nk * 4), *vm = test_alloc(nk * 4);
    float *kz = test_alloc(nk * 4), *vz = test_alloc(nk * 4);
    float *vs = test_alloc(nk * 4);
    for (size_t i = 0; i < nk; i++) {
        int sub = i % 3 == 0;
        km[i] = sub ? ldexpf(k[i], -130) : k[i];
        vm[i] = sub ? ldexpf(v[i], -131) : v[i];
        kz[i] = sub ? copysignf(0.0f, k[i]) : k[i];
        vz[i] = sub ? copysignf(0.0f, v[i]) : v[i];
        vs[i] = ldexpf(v[i], -130);
    }
    float *want = test_alloc(nq * 4), *got = test_alloc(nq * 4);
    mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_attention_args a = {0};
    a.q = mha_tensor_bshd(q, B, LQ, H, D);
    a.k = mha_tensor_bshd(NULL, B, LK, HKV, D);
    a.v = mha_tensor_bshd(NULL, B, LK, HKV, D);
    a.out = mha_tensor_bshd(NULL, B, LQ, H, D);
    a.mask = &causal;

    /* The layer: self-attention of subnormal inputs, no biases, weights
     * near 2^24, so that IEEE's projections of the inputs are normal
     * numbers: flushed, the projections are zeros on every thread. */
    enum { E = 64, LH = 4, LL = 37 };
    float *w_in = random_floats(&r, 3 * E * E);
    float *w_out = random_floats(&r, E * E);
    float *x = random_floats(&r, (size_t)B * LL * E);
    for (size_t i = 0; i < 3 * E * E; i++)
        w_in[i] = ldexpf(w_in[i], 24);
    for (size_t i = 0; i < E * E; i++)
        w_out[i] = ldexpf(w_out[i], 24);
    for (size_t i = 0; i < (size_t)B * LL * E; i++)
        x[i] = ldexpf(x[i], -128);
    mha_layer_desc desc = {.embed_dim = E, .num_heads = LH,
                           .in_proj_weight = w_in, .out_proj_weight = w_out};
    float *lo = test_alloc((size_t)B * LL * E * 4);

    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        const char *isa = mha_isa_name(isas[t]);
        mha_engine *ieee = make_flush_engine(isas[t], 1, 0);
        for (int threads = 1; threads <= 2; threads++) {
            mha_engine *fl = make_flush_engine(isas[t], threads, 1);
            attend(ieee, &a, k, v, want);
            attend(fl, &a, k, v, got);
            ck_assert_msg(memcmp(want, got, nq * 4) == 0,
                          "[%s] %d threads: flushing changed normal data",
                          isa, threads);
            attend(fl, &a, kz, vz, want);
            attend(fl, &a, km, vm, got);
            ck_assert_msg(memcmp(want, got, nq * 4) == 0,
                          "[%s] %d threads: subnormal k and v flushed are "
                          "not zeros",
                          isa, threads);
            attend(ieee, &a, k, vs, want);
            attend(fl, &a, k, vs, got);
            size_t nonzero = 0;
            for (size_t i = 0; i < nq; i++) {
                REQUIRE(got[i] == 0.0f, "[%s] %d threads: out[%zu] = %g "
                        "from subnormal values flushed", isa, threads, i,
                        (double)got[i]);
                nonzero += want[i] != 0.0f;
            }
            ck_assert_msg(nonzero > nq / 2,
                          "[%s] IEEE made %zu of %zu outputs of subnormal "
                          "values nonzero", isa, nonzero, nq);
            mha_layer *ly;
            ck_assert_int_eq(mha_layer_create(fl, &desc, &ly), MHA_OK);
            ck_assert_int_eq(mha_layer_forward(ly, x, x, x, B, LL, LL, NULL,
                                               lo, NULL),
                             MHA_OK);
            for (size_t i = 0; i < (size_t)B * LL * E; i++)
                REQUIRE(lo[i] == 0.0f, "[%s] %d threads: layer out[%zu] = "
                        "%g from subnormal inputs flushed", isa, threads, i,
                        (double)lo[i]);
            mha_layer_destroy(ly);
            mha_engine_destroy(fl);
        }
        mha_layer *ly;
        ck_assert_int_eq(mha_layer_create(ieee, &desc, &ly), MHA_OK);
        ck_assert_int_eq(mha_layer_forward(ly, x, x, x, B, LL, LL, NULL, lo,
                                           NULL),
                         MHA_OK);
        size_t nonzero = 0;
        for (size_t i = 0; i < (size_t)B * LL * E; i++)
            nonzero += lo[i] != 0.0f;
        ck_assert_msg(nonzero > (size_t)B * LL * E / 2,
                      "[%s] IEEE made %zu of the layer's %zu outputs of "
                      "subnormal inputs nonzero", isa, nonzero,
                      (size_t)B * LL * E);
        mha_layer_destroy(ly);
        mha_engine_destroy(ieee);
    }
    float *bufs[] = {q, k, v, km, vm, kz, vz, vs, want, got, w_in, w_out,
                     x, lo};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}
END_TEST

/* The flush is the computing's, not the checking's: a call is accepted
 * or refused alike by an engine that flushes and one that does not
 * (validation reads arguments in IEEE). Under DAZ a comparison reads a
 * subnormal as 0, and before, a softcap of 1e-40 (below 1/FLT_MAX) was
 * refused by one and passed as "off" by the other, and a subnormal scale
 * became the default 1/sqrt(d). Now the softcap is refused by both
 * (attention, varlen, the layer), the int8 K's subnormal scale (checked
 * by its bits) accepted by both, and a subnormal scale is the
 * call's, read as 0 by the flushed kernels: even weights, every output
 * row the mean of the value rows, which the default scale is not. */
START_TEST(flush_subnormals_checks_arguments_alike)
{
#if !defined(__x86_64__) && !defined(__i386__) && !defined(__aarch64__)
    printf("threads: flush_subnormals is unsupported on this CPU: not run\n");
    return;
#endif
    enum { L = 9, H = 2, D = 8, E = H * D };
    const size_t n = (size_t)L * H * D;
    test_rng r;
    rng_seed(&r, 91);
    float *q = random_floats(&r, n), *k = random_floats(&r, n);
    float *v = random_floats(&r, n), *out = test_alloc(n * 4);
    int8_t *k8 = test_alloc(n);
    float *kscale = test_alloc((size_t)L * H * 4);
    for (size_t i = 0; i < n; i++)
        k8[i] = (int8_t)(i * 7 % 255 - 127);
    for (int64_t i = 0; i < L * H; i++)
        kscale[i] = 1e-40f;
    float *w_in = random_floats(&r, 3 * E * E);
    float *w_out = random_floats(&r, E * E);
    const mha_score_terms cap = {.softcap = 1e-40f};
    const int32_t cu[2] = {0, L};
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        const char *isa = mha_isa_name(isas[t]);
        for (int flush = 0; flush < 2; flush++) {
            mha_engine *e = make_flush_engine(isas[t], 1, flush);
            mha_attention_args a = {0};
            a.q = mha_tensor_bshd(q, 1, L, H, D);
            a.k = mha_tensor_bshd(k, 1, L, H, D);
            a.v = mha_tensor_bshd(v, 1, L, H, D);
            a.out = mha_tensor_bshd(out, 1, L, H, D);
            a.terms = &cap;
            ck_assert_msg(mha_attention(e, &a) == MHA_ERR_BAD_ARGUMENT &&
                              strstr(mha_last_error(), "terms.softcap"),
                          "[%s] flush %d: a softcap of 1e-40: %s", isa,
                          flush, mha_last_error());
            mha_varlen_args va = {.batch = 1, .q = a.q, .cu_seqlens_q = cu,
                                  .k = a.k, .v = a.v, .cu_seqlens_k = cu,
                                  .out = a.out, .terms = &cap};
            va.q.seq = va.k.seq = va.v.seq = va.out.seq = L;
            va.q.batch = va.k.batch = va.v.batch = va.out.batch = 1;
            ck_assert_msg(mha_attention_varlen(e, &va) ==
                                  MHA_ERR_BAD_ARGUMENT &&
                              strstr(mha_last_error(), "terms.softcap"),
                          "[%s] flush %d: varlen, a softcap of 1e-40: %s",
                          isa, flush, mha_last_error());
            mha_layer_desc desc = {.embed_dim = E, .num_heads = H,
                                   .in_proj_weight = w_in,
                                   .out_proj_weight = w_out};
            mha_layer *ly;
            ck_assert_int_eq(mha_layer_create(e, &desc, &ly), MHA_OK);
            mha_layer_args la = {.query = q, .key = q, .value = q,
                                 .out = out, .batch = 1, .lq = L, .lk = L,
                                 .terms = &cap};
            ck_assert_msg(mha_layer_forward_ex(ly, &la) ==
                                  MHA_ERR_BAD_ARGUMENT &&
                              strstr(mha_last_error(), "terms.softcap"),
                          "[%s] flush %d: layer, a softcap of 1e-40: %s",
                          isa, flush, mha_last_error());
            mha_layer_destroy(ly);

            a.terms = NULL;
            mha_attention_args a8 = a;
            a8.k = mha_tensor_bshd_typed(k8, MHA_I8, 1, L, H, D);
            a8.k.scales = (mha_scales){kscale, L * H, H, 1};
            ck_assert_msg(mha_attention(e, &a8) == MHA_OK,
                          "[%s] flush %d: an int8 K of scale 1e-40: %s",
                          isa, flush, mha_last_error());

            /* A subnormal scale: even weights (flushed or not, since
             * 1e-40 times a score of order 1 is 0 beside the maximum's
             * 0 in exp), never the default scale's. */
            a.scale = 1e-40f;
            ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
            double off_mean = 0.0;
            for (int64_t h = 0; h < H; h++)
                for (int64_t c = 0; c < D; c++) {
                    double mean = 0.0;
                    for (int64_t j = 0; j < L; j++)
                        mean += v[(j * H + h) * D + c];
                    mean /= L;
                    for (int64_t i = 0; i < L; i++) {
                        double got = out[(i * H + h) * D + c];
                        REQUIRE(fabs(got - mean) <= 1e-6 + 1e-5 * fabs(mean),
                                "[%s] flush %d: scale 1e-40, out[%lld, "
                                "%lld, %lld] = %.9g, want the mean %.9g",
                                isa, flush, (long long)i, (long long)h,
                                (long long)c, got, mean);
                    }
                }
            a.scale = 0.0f; /* the default, 1/sqrt(D) */
            ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
            for (int64_t i = 0; i < L; i++) {
                double mean = 0.0;
                for (int64_t j = 0; j < L; j++)
                    mean += v[j * H * D];
                off_mean += fabs(out[i * H * D] - mean / L);
            }
            ck_assert_msg(off_mean > 1e-3,
                          "[%s] flush %d: the default scale gave even "
                          "weights too (%g): the check above proves nothing",
                          isa, flush, off_mean);
            mha_engine_destroy(e);
        }
    }
    float *bufs[] = {q, k, v, out, kscale, w_in, w_out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(k8);
}
END_TEST

/* A softcap keeps normal data's bits on a flushing engine. Before, the
 * kernels multiplied by 1 / cap, subnormal for caps above 1/FLT_MIN, and
 * scores below cap * FLT_MIN gave subnormal quotients: FTZ made them 0,
 * and outputs of caps from 1e37 up moved by up to 0.37 (1e38: every score
 * 0). Here every cap, from FLT_MIN (scores near 0: even weights) to
 * FLT_MAX (no cap in effect), gives the same bits flushed or not, on one
 * and two threads, and the double oracle's values. */
START_TEST(flush_subnormals_keeps_softcaps)
{
#if !defined(__x86_64__) && !defined(__i386__) && !defined(__aarch64__)
    printf("threads: flush_subnormals is unsupported on this CPU: not run\n");
    return;
#endif
    /* Prefill, and grouped decode (one query row, four query heads on
     * one kv head), which takes other kernels. */
    enum { B = 2, LK = 37, D = 16, NMAX = B * 19 * 2 * D };
    const struct { int64_t lq, h, hkv; } shapes[] = {{19, 2, 2}, {1, 4, 1}};
    const size_t nk = (size_t)B * LK * 2 * D;
    test_rng r;
    rng_seed(&r, 93);
    float *q = random_floats(&r, NMAX), *k = random_floats(&r, nk);
    float *v = random_floats(&r, nk);
    /* Scores from 1e-3 to about 30: every cap below sees them capped,
     * every cap from 2^64 up leaves them as they are. */
    for (size_t i = 0; i < NMAX; i++)
        q[i] *= (float)(i % 7 == 0 ? 1e-3 : 4.0);
    float *want = test_alloc(NMAX * 4), *got = test_alloc(NMAX * 4);
    double *ref = malloc(NMAX * sizeof *ref);
    ck_assert_ptr_nonnull(ref);
    const float caps[] = {FLT_MIN, 1e-3f, 1.0f, 30.0f, 0x1p64f, 0x1p65f,
                          1e37f, 1e38f, FLT_MAX};
    mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t lq = shapes[si].lq, h = shapes[si].h;
        const size_t nq = (size_t)(B * lq * h * D);
        mha_attention_args a = {0};
        a.q = mha_tensor_bshd(q, B, lq, h, D);
        a.k = mha_tensor_bshd(k, B, LK, shapes[si].hkv, D);
        a.v = mha_tensor_bshd(v, B, LK, shapes[si].hkv, D);
        a.out = mha_tensor_bshd(want, B, lq, h, D);
        a.mask = &causal;
        for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++) {
            const mha_score_terms terms = {.softcap = caps[ci]};
            a.terms = &terms;
            oracle_attention_lse(&a, ref, NULL, NULL);
            for (int t = 0; t < n_isa; t++) {
                const char *isa = mha_isa_name(isas[t]);
                mha_engine *ieee = make_flush_engine(isas[t], 1, 0);
                attend(ieee, &a, k, v, want);
                for (size_t i = 0; i < nq; i++)
                    REQUIRE(fabs(want[i] - ref[i]) <=
                                TOL_ATTN_ABS + TOL_ATTN_REL * fabs(ref[i]),
                            "[%s] Lq %lld, cap %g: out[%zu] = %.9g, oracle "
                            "%.9g", isa, (long long)lq, (double)caps[ci], i,
                            (double)want[i], ref[i]);
                for (int threads = 1; threads <= 2; threads++) {
                    mha_engine *fl = make_flush_engine(isas[t], threads, 1);
                    attend(fl, &a, k, v, got);
                    for (size_t i = 0; i < nq; i++)
                        REQUIRE(memcmp(&want[i], &got[i], 4) == 0,
                                "[%s] Lq %lld, cap %g, %d threads: out[%zu] "
                                "= %.9g flushed, %.9g not", isa,
                                (long long)lq, (double)caps[ci], threads, i,
                                (double)got[i], (double)want[i]);
                    mha_engine_destroy(fl);
                }
                mha_engine_destroy(ieee);
            }
        }
    }
    free(q), free(k), free(v), free(want), free(got), free(ref);
}
END_TEST

Suite *suite_threads(void)
{
    Suite *s = suite_create("threads");
    TCase *tc = tcase_create("threads");
    tcase_add_test(tc, bitwise_equal_across_thread_counts);
    tcase_add_test(tc, concurrent_callers_share_an_engine);
    tcase_add_test(tc, concurrent_callers_share_a_kept_workspace);
    tcase_add_test(tc, caller_fp_environment_changes_nothing);
    tcase_add_test(tc, flush_subnormals_reads_them_as_zero);
    tcase_add_test(tc, flush_subnormals_checks_arguments_alike);
    tcase_add_test(tc, flush_subnormals_keeps_softcaps);
    suite_add_tcase(s, tc);
    return s;
}
