/*
 * Bad input: every invalid field returns its status, records a non-empty
 * message for the calling thread, and leaves every output byte untouched
 * (sentinel-filled out and weights, the engine and layer pointers). Then
 * allocation failures: each allocation of a call fails in turn.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "test_hooks.h"
#include "util.h"

/* ---- mha_attention ---------------------------------------------------- */

enum { B = 2, LQ = 3, LK = 5, H = 4, HKV = 2, D = 8, DV = 6 };
#define N_Q (B * LQ * H * D)
#define N_K (B * LK * HKV * D)
#define N_V (B * LK * HKV * DV)
#define N_OUT (B * LQ * H * DV)
#define N_W (B * H * LQ * LK)

/* One arena holds q, k, v and out back to back, so overlaps are easy to
 * build; weights live apart. */
typedef struct fixture {
    float *arena, *q, *k, *v, *out, *w;
    uint8_t keep[B * LK];
    float bias[LQ * LK];
    int32_t lengths[B];
    mha_mask mask;
    mha_attention_args args;
} fixture;

static void fixture_init(fixture *f)
{
    test_rng r;
    rng_seed(&r, 3);
    f->arena = test_alloc((N_Q + N_K + N_V + N_OUT) * sizeof(float));
    f->q = f->arena;
    f->k = f->q + N_Q;
    f->v = f->k + N_K;
    f->out = f->v + N_V;
    f->w = test_alloc(N_W * sizeof(float));
    fill_uniform(&r, f->arena, N_Q + N_K + N_V);
    for (int i = 0; i < B * LK; i++)
        f->keep[i] = (uint8_t)(i % 3 != 0);
    fill_uniform(&r, f->bias, LQ * LK);
    f->lengths[0] = LK;
    f->lengths[1] = 2;
    f->mask = (mha_mask){.causal = MHA_CAUSAL_BOTTOM_RIGHT, .keep = f->keep,
                         .keep_stride_batch = LK, .bias = f->bias,
                         .bias_stride_query = LK, .key_lengths = f->lengths};
    f->args = (mha_attention_args){
        .q = layout_view(LAYOUT_BSHD, f->q, B, LQ, H, D),
        .k = layout_view(LAYOUT_BSHD, f->k, B, LK, HKV, D),
        .v = layout_view(LAYOUT_BSHD, f->v, B, LK, HKV, DV),
        .out = layout_view(LAYOUT_BSHD, f->out, B, LQ, H, DV),
        .mask = &f->mask,
        .weights = f->w,
    };
}

static void fixture_free(fixture *f)
{
    free(f->arena);
    free(f->w);
}

/* A stride whose product with any size above 1 overflows int64, or whose
 * byte count (times 4) does. */
#define HUGE_STRIDE ((int64_t)1 << 62)

typedef struct bad_input {
    const char *name;
    mha_status want;
} bad_input;

static const bad_input BAD[] = {
    {"engine NULL", MHA_ERR_NULL_POINTER},
    {"args NULL", MHA_ERR_NULL_POINTER},
    {"q.data NULL", MHA_ERR_NULL_POINTER},
    {"k.data NULL", MHA_ERR_NULL_POINTER},
    {"v.data NULL", MHA_ERR_NULL_POINTER},
    {"out.data NULL", MHA_ERR_NULL_POINTER},
    {"batch 0 everywhere", MHA_ERR_BAD_SHAPE},
    {"batch -1 everywhere", MHA_ERR_BAD_SHAPE},
    {"Lq 0", MHA_ERR_BAD_SHAPE},
    {"Lk 0", MHA_ERR_BAD_SHAPE},
    {"heads 0", MHA_ERR_BAD_SHAPE},
    {"kv heads 0", MHA_ERR_BAD_SHAPE},
    {"d 0", MHA_ERR_BAD_SHAPE},
    {"dv 0", MHA_ERR_BAD_SHAPE},
    {"k.batch differs", MHA_ERR_BAD_SHAPE},
    {"v.batch differs", MHA_ERR_BAD_SHAPE},
    {"out.batch differs", MHA_ERR_BAD_SHAPE},
    {"v.seq differs from k.seq", MHA_ERR_BAD_SHAPE},
    {"out.seq differs from q.seq", MHA_ERR_BAD_SHAPE},
    {"v.heads differs from k.heads", MHA_ERR_BAD_SHAPE},
    {"out.heads differs from q.heads", MHA_ERR_BAD_SHAPE},
    {"k.dim differs from q.dim", MHA_ERR_BAD_SHAPE},
    {"out.dim differs from v.dim", MHA_ERR_BAD_SHAPE},
    {"Hkv 3 does not divide H 4", MHA_ERR_BAD_SHAPE},
    {"Hkv 8 above H 4", MHA_ERR_BAD_SHAPE},
    {"q.stride_batch -1", MHA_ERR_BAD_STRIDE},
    {"q.stride_seq -1", MHA_ERR_BAD_STRIDE},
    {"q.stride_head -1", MHA_ERR_BAD_STRIDE},
    {"k.stride_batch -1", MHA_ERR_BAD_STRIDE},
    {"k.stride_seq -1", MHA_ERR_BAD_STRIDE},
    {"v.stride_head -1", MHA_ERR_BAD_STRIDE},
    {"out.stride_batch -1", MHA_ERR_BAD_STRIDE},
    {"out.stride_seq -1", MHA_ERR_BAD_STRIDE},
    {"out.stride_head -1", MHA_ERR_BAD_STRIDE},
    {"out is q", MHA_ERR_BAD_STRIDE},
    {"out overlaps the tail of k", MHA_ERR_BAD_STRIDE},
    {"out overlaps the head of v", MHA_ERR_BAD_STRIDE},
    {"out.stride_seq 0 (overlaps itself)", MHA_ERR_BAD_STRIDE},
    {"out.stride_head 0 (overlaps itself)", MHA_ERR_BAD_STRIDE},
    {"out.stride_batch 0 (overlaps itself)", MHA_ERR_BAD_STRIDE},
    {"out rows overlap (stride_head < dv)", MHA_ERR_BAD_STRIDE},
    {"keep_stride_batch -1", MHA_ERR_BAD_MASK},
    {"keep_stride_head -1", MHA_ERR_BAD_MASK},
    {"keep_stride_query -1", MHA_ERR_BAD_MASK},
    {"bias_stride_batch -1", MHA_ERR_BAD_MASK},
    {"bias_stride_head -1", MHA_ERR_BAD_MASK},
    {"bias_stride_query -1", MHA_ERR_BAD_MASK},
    {"causal 3", MHA_ERR_BAD_MASK},
    {"causal -1", MHA_ERR_BAD_MASK},
    {"key length -1", MHA_ERR_BAD_MASK},
    {"key length Lk + 1", MHA_ERR_BAD_MASK},
    {"k offset overflows int64", MHA_ERR_OVERFLOW},
    {"k byte count overflows int64", MHA_ERR_OVERFLOW},
    {"weights count overflows int64", MHA_ERR_OVERFLOW},
    {"q.dtype F16", MHA_ERR_UNSUPPORTED},
    {"out.dtype BF16", MHA_ERR_UNSUPPORTED},
    {"k.dtype 7", MHA_ERR_UNSUPPORTED},
    {"scale NaN", MHA_ERR_BAD_ARGUMENT},
    {"scale +inf", MHA_ERR_BAD_ARGUMENT},
    {"scale -inf", MHA_ERR_BAD_ARGUMENT},
};
#define N_BAD ((int)(sizeof BAD / sizeof BAD[0]))

/* Applies BAD[which] to f->args; may clear *engine or *args. */
static void corrupt(int which, fixture *f, const mha_engine **engine,
                    const mha_attention_args **args)
{
    mha_attention_args *a = &f->args;
    mha_tensor *all[4] = {&a->q, &a->k, &a->v, &a->out};
    switch (which) {
    case 0: *engine = NULL; break;
    case 1: *args = NULL; break;
    case 2: a->q.data = NULL; break;
    case 3: a->k.data = NULL; break;
    case 4: a->v.data = NULL; break;
    case 5: a->out.data = NULL; break;
    case 6: for (int t = 0; t < 4; t++) all[t]->batch = 0; break;
    case 7: for (int t = 0; t < 4; t++) all[t]->batch = -1; break;
    case 8: a->q.seq = a->out.seq = 0; break;
    case 9: a->k.seq = a->v.seq = 0; break;
    case 10: a->q.heads = a->out.heads = 0; break;
    case 11: a->k.heads = a->v.heads = 0; break;
    case 12: a->q.dim = a->k.dim = 0; break;
    case 13: a->v.dim = a->out.dim = 0; break;
    case 14: a->k.batch = 1; break;
    case 15: a->v.batch = 1; break;
    case 16: a->out.batch = 1; break;
    case 17: a->v.seq = LK - 1; break;
    case 18: a->out.seq = LQ - 1; break;
    case 19: a->v.heads = 1; break;
    case 20: a->out.heads = 2; break;
    case 21: a->k.dim = D - 1; break;
    case 22: a->out.dim = DV - 1; break;
    case 23: a->k.heads = a->v.heads = 3; break;
    case 24: a->k.heads = a->v.heads = 8; break;
    case 25: a->q.stride_batch = -1; break;
    case 26: a->q.stride_seq = -1; break;
    case 27: a->q.stride_head = -1; break;
    case 28: a->k.stride_batch = -1; break;
    case 29: a->k.stride_seq = -1; break;
    case 30: a->v.stride_head = -1; break;
    case 31: a->out.stride_batch = -1; break;
    case 32: a->out.stride_seq = -1; break;
    case 33: a->out.stride_head = -1; break;
    case 34: a->out.data = f->q; break;
    case 35: a->out.data = f->k + N_K - 1; break;
    case 36: a->out.data = f->v - N_OUT + 1; break;
    case 37: a->out.stride_seq = 0; break;
    case 38: a->out.stride_head = 0; break;
    case 39: a->out.stride_batch = 0; break;
    case 40: a->out.stride_head = DV - 1; break;
    case 41: f->mask.keep_stride_batch = -1; break;
    case 42: f->mask.keep_stride_head = -1; break;
    case 43: f->mask.keep_stride_query = -1; break;
    case 44: f->mask.bias_stride_batch = -1; break;
    case 45: f->mask.bias_stride_head = -1; break;
    case 46: f->mask.bias_stride_query = -1; break;
    case 47: f->mask.causal = (mha_causal)3; break;
    case 48: f->mask.causal = (mha_causal)-1; break;
    case 49: f->lengths[1] = -1; break;
    case 50: f->lengths[0] = LK + 1; break;
    case 51: /* (Lk - 1) * 2^62 elements */
        a->k.stride_seq = HUGE_STRIDE;
        break;
    case 52: /* 2^62 elements fit in int64, 2^64 bytes do not */
        a->k.stride_batch = HUGE_STRIDE;
        break;
    case 53: /* B*H*Lq*Lk = 3 * 2^65 weights; k, v broadcast over keys */
        a->k.seq = a->v.seq = HUGE_STRIDE;
        a->k.stride_seq = a->v.stride_seq = 0;
        f->mask.keep = NULL;
        f->mask.bias = NULL;
        f->mask.key_lengths = NULL;
        break;
    case 54: a->q.dtype = MHA_F16; break;
    case 55: a->out.dtype = MHA_BF16; break;
    case 56: a->k.dtype = (mha_dtype)7; break;
    case 57: a->scale = NAN; break;
    case 58: a->scale = INFINITY; break;
    case 59: a->scale = -INFINITY; break;
    }
}

/* Leaves a known message for this thread, so a failing call that forgets
 * to record its own is caught: its message would still be this one. */
static const char *prime_message(void)
{
    static char primed[256];
    mha_engine *e = NULL;
    mha_config bad = {.num_threads = -7};
    ck_assert_int_eq(mha_engine_create(&bad, &e), MHA_ERR_BAD_ARGUMENT);
    snprintf(primed, sizeof primed, "%s", mha_last_error());
    ck_assert_msg(primed[0] != '\0', "no message for num_threads -7");
    return primed;
}

static void expect_message(mha_status want, const char *primed,
                           const char *what)
{
    const char *msg = mha_last_error();
    ck_assert_msg(msg && msg[0] != '\0', "%s: empty mha_last_error()", what);
    ck_assert_msg(want == MHA_ERR_BAD_ARGUMENT || strcmp(msg, primed) != 0,
                  "%s: mha_last_error() still holds an older message (%s)",
                  what, msg);
}

/* A rejected call: its status, its own message, and not one byte written
 * to the arena (inputs and out; `before` is its copy) or the weights. */
static void expect_rejected(mha_status st, const bad_input *bad, mha_isa isa,
                            const char *primed, const void *before,
                            const void *arena, size_t arena_bytes,
                            const float *weights, size_t n_weights)
{
    ck_assert_msg(st == bad->want, "%s [%s]: got %s, want %s (%s)",
                  bad->name, mha_isa_name(isa), mha_status_string(st),
                  mha_status_string(bad->want), mha_last_error());
    expect_message(bad->want, primed, bad->name);
    ck_assert_msg(memcmp(before, arena, arena_bytes) == 0,
                  "%s: an input or out byte changed", bad->name);
    ck_assert_msg(count_changed(weights, n_weights) == 0,
                  "%s: a weights byte changed", bad->name);
}

START_TEST(attention_bad_input)
{
    const bad_input *bad = &BAD[_i];
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    const size_t arena_bytes = (N_Q + N_K + N_V + N_OUT) * sizeof(float);
    for (int t = 0; t < n_isa; t++) {
        fixture f;
        fixture_init(&f);
        fill_sentinel(f.out, N_OUT);
        fill_sentinel(f.w, N_W);
        unsigned char *before = test_alloc(arena_bytes);
        memcpy(before, f.arena, arena_bytes);
        mha_engine *engine = make_engine(isas[t], 2);
        const mha_engine *e = engine;
        const mha_attention_args *a = &f.args;
        corrupt(_i, &f, &e, &a);
        const char *primed = prime_message();

        mha_status st = mha_attention(e, a);
        expect_rejected(st, bad, isas[t], primed, before, f.arena,
                        arena_bytes, f.w, N_W);
        mha_engine_destroy(engine);
        free(before);
        fixture_free(&f);
    }
}
END_TEST

/* The untouched fixture is valid and right: the failures above come from
 * the one field each case breaks. Adjacent q, k, v, out are no overlap. */
START_TEST(fixture_is_valid)
{
    fixture f;
    fixture_init(&f);
    f.args.weights = NULL;
    check_attention(&f.args, N_OUT, 1, 2, "error fixture");
    fixture_free(&f);
}
END_TEST

/* ---- Engine creation -------------------------------------------------- */

START_TEST(engine_bad_config)
{
    mha_engine sentinel_engine;
    mha_engine *const sentinel = &sentinel_engine;
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    mha_isa missing = MHA_ISA_AUTO;
    for (mha_isa cand = MHA_ISA_AVX2; cand <= MHA_ISA_AVX512; cand++) {
        int have = 0;
        for (int t = 0; t < n_isa; t++)
            have |= isas[t] == cand;
        if (!have)
            missing = cand;
    }
    struct {
        const char *name;
        mha_config config;
        mha_status want;
    } cases[] = {
        {"num_threads -1", {.num_threads = -1}, MHA_ERR_BAD_ARGUMENT},
        {"isa 99", {.isa = (mha_isa)99}, MHA_ERR_BAD_ARGUMENT},
        {"isa -1", {.isa = (mha_isa)-1}, MHA_ERR_BAD_ARGUMENT},
        {"isa the build or CPU lacks", {.isa = missing}, MHA_ERR_UNSUPPORTED},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    if (missing == MHA_ISA_AUTO)
        n--; /* every ISA runs here: nothing is missing */
    for (int c = 0; c < n; c++) {
        mha_engine *e = sentinel;
        mha_status st = mha_engine_create(&cases[c].config, &e);
        ck_assert_msg(st == cases[c].want, "%s: got %s", cases[c].name,
                      mha_status_string(st));
        ck_assert_msg(mha_last_error()[0] != '\0', "%s: no message",
                      cases[c].name);
        ck_assert_msg(e == sentinel, "%s: *engine was written",
                      cases[c].name);
    }
    ck_assert_int_eq(mha_engine_create(NULL, NULL), MHA_ERR_NULL_POINTER);
    ck_assert_msg(mha_last_error()[0] != '\0', "engine NULL: no message");

    /* An unknown MHA_ISA value is refused, not silently ignored. */
    const char *saved = getenv("MHA_ISA");
    char *copy = saved ? strdup(saved) : NULL;
    setenv("MHA_ISA", "no-such-isa", 1);
    mha_engine *e = sentinel;
    mha_status st = mha_engine_create(NULL, &e);
    if (copy) {
        setenv("MHA_ISA", copy, 1);
        free(copy);
    } else {
        unsetenv("MHA_ISA");
    }
    ck_assert_msg(st == MHA_ERR_UNSUPPORTED, "MHA_ISA=no-such-isa: got %s",
                  mha_status_string(st));
    ck_assert(e == sentinel);

    /* NULL config means defaults. */
    ck_assert_int_eq(mha_engine_create(NULL, &e), MHA_OK);
    ck_assert(e != sentinel && e != NULL);
    ck_assert_int_ne(mha_engine_isa(e), MHA_ISA_AUTO);
    mha_engine_destroy(e);
    mha_engine_destroy(NULL);
}
END_TEST

/* MHA_ISA=<name> forces that table: engine creation picks exactly it when
 * the build and CPU run it (available_isas asks through the config field,
 * a separate path), and fails with MHA_ERR_UNSUPPORTED and a message
 * otherwise. */
START_TEST(isa_from_environment)
{
    static const mha_isa named[] = {MHA_ISA_GENERIC, MHA_ISA_AVX2,
                                    MHA_ISA_NEON, MHA_ISA_AVX512};
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    const char *saved = getenv("MHA_ISA");
    char *copy = saved ? strdup(saved) : NULL;
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        const char *name = mha_isa_name(named[i]);
        int have = 0;
        for (int t = 0; t < n_isa; t++)
            have |= isas[t] == named[i];
        setenv("MHA_ISA", name, 1);
        mha_engine *e = NULL;
        mha_status st = mha_engine_create(NULL, &e);
        mha_isa got = st == MHA_OK ? mha_engine_isa(e) : MHA_ISA_AUTO;
        mha_engine_destroy(st == MHA_OK ? e : NULL);
        if (have)
            ck_assert_msg(st == MHA_OK && got == named[i],
                          "MHA_ISA=%s: %s, picked %s", name,
                          mha_status_string(st), mha_isa_name(got));
        else
            ck_assert_msg(st == MHA_ERR_UNSUPPORTED &&
                              strstr(mha_last_error(), name),
                          "MHA_ISA=%s (not available): %s, message '%s'",
                          name, mha_status_string(st), mha_last_error());
    }
    if (copy) {
        setenv("MHA_ISA", copy, 1);
        free(copy);
    } else {
        unsetenv("MHA_ISA");
    }
}
END_TEST

START_TEST(status_strings)
{
    const char *seen[MHA_ERR_BAD_ARGUMENT + 1];
    for (int s = MHA_OK; s <= MHA_ERR_BAD_ARGUMENT; s++) {
        seen[s] = mha_status_string((mha_status)s);
        ck_assert_msg(seen[s] && seen[s][0], "status %d has no name", s);
        for (int o = 0; o < s; o++)
            ck_assert_msg(strcmp(seen[o], seen[s]) != 0,
                          "statuses %d and %d share the name %s", o, s,
                          seen[s]);
    }
    ck_assert_ptr_nonnull(mha_status_string((mha_status)99));
    ck_assert_ptr_nonnull(mha_status_string((mha_status)-1));
}
END_TEST

static void *read_fresh_error(void *arg)
{
    const char **msg = arg;
    *msg = mha_last_error();
    return NULL;
}

START_TEST(last_error_is_per_thread)
{
    const char *primed = prime_message();
    ck_assert(primed[0] != '\0');
    const char *other = NULL;
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, read_fresh_error, &other), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_msg(other && other[0] == '\0',
                  "a new thread sees another thread's message: %s",
                  other ? other : "(NULL)");
    ck_assert_str_eq(mha_last_error(), primed);
}
END_TEST

/* ---- The layer -------------------------------------------------------- */

enum { LE = 8, LH = 2, LB = 2, LLQ = 3, LLK = 4 };

typedef struct layer_fixture {
    float in_w[3 * LE * LE], in_b[3 * LE], out_w[LE * LE], out_b[LE];
    float *arena, *query, *key, *value, *out, *w;
    int32_t lengths[LB];
    mha_mask mask;
    mha_layer_desc desc;
} layer_fixture;

#define L_NQ (LB * LLQ * LE)
#define L_NK (LB * LLK * LE)
#define L_NW (LB * LH * LLQ * LLK)

static void layer_fixture_init(layer_fixture *f)
{
    test_rng r;
    rng_seed(&r, 8);
    fill_uniform(&r, f->in_w, 3 * LE * LE);
    fill_uniform(&r, f->in_b, 3 * LE);
    fill_uniform(&r, f->out_w, LE * LE);
    fill_uniform(&r, f->out_b, LE);
    f->arena = test_alloc((2 * L_NQ + 2 * L_NK) * sizeof(float));
    f->query = f->arena;
    f->key = f->query + L_NQ;
    f->value = f->key + L_NK;
    f->out = f->value + L_NK;
    f->w = test_alloc(L_NW * sizeof(float));
    fill_uniform(&r, f->arena, L_NQ + 2 * L_NK);
    f->lengths[0] = LLK;
    f->lengths[1] = 1;
    f->mask = (mha_mask){.causal = MHA_CAUSAL_TOP_LEFT,
                         .key_lengths = f->lengths};
    f->desc = (mha_layer_desc){.embed_dim = LE, .num_heads = LH,
                               .in_proj_weight = f->in_w,
                               .in_proj_bias = f->in_b,
                               .out_proj_weight = f->out_w,
                               .out_proj_bias = f->out_b};
}

static const bad_input LAYER_CREATE_BAD[] = {
    {"engine NULL", MHA_ERR_NULL_POINTER},
    {"desc NULL", MHA_ERR_NULL_POINTER},
    {"layer pointer NULL", MHA_ERR_NULL_POINTER},
    {"out_proj_weight NULL", MHA_ERR_NULL_POINTER},
    {"separate weights, k_proj_weight NULL", MHA_ERR_NULL_POINTER},
    {"no input projection at all", MHA_ERR_NULL_POINTER},
    {"embed_dim 0", MHA_ERR_BAD_SHAPE},
    {"embed_dim -8", MHA_ERR_BAD_SHAPE},
    {"num_heads 0", MHA_ERR_BAD_SHAPE},
    {"num_heads 3 does not divide 8", MHA_ERR_BAD_SHAPE},
    {"kdim -1", MHA_ERR_BAD_SHAPE},
    {"vdim -1", MHA_ERR_BAD_SHAPE},
    {"in_proj_weight with kdim 5", MHA_ERR_BAD_SHAPE},
    {"embed_dim 2^40: weight bytes overflow", MHA_ERR_OVERFLOW},
    {"kdim 2^62: weight bytes overflow", MHA_ERR_OVERFLOW},
};
#define N_LAYER_CREATE_BAD \
    ((int)(sizeof LAYER_CREATE_BAD / sizeof LAYER_CREATE_BAD[0]))

START_TEST(layer_create_bad_input)
{
    const bad_input *bad = &LAYER_CREATE_BAD[_i];
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        layer_fixture f;
        layer_fixture_init(&f);
        mha_engine *engine = make_engine(isas[t], 1);
        const mha_engine *e = engine;
        mha_layer_desc *d = &f.desc;
        const mha_layer_desc *dp = d;
        mha_layer *sentinel = (mha_layer *)&f, *layer = sentinel;
        mha_layer **lp = &layer;
        switch (_i) {
        case 0: e = NULL; break;
        case 1: dp = NULL; break;
        case 2: lp = NULL; break;
        case 3: d->out_proj_weight = NULL; break;
        case 4:
            d->in_proj_weight = NULL;
            d->q_proj_weight = f.in_w;
            d->v_proj_weight = f.in_w;
            break;
        case 5: d->in_proj_weight = NULL; break;
        case 6: d->embed_dim = 0; break;
        case 7: d->embed_dim = -8; break;
        case 8: d->num_heads = 0; break;
        case 9: d->num_heads = 3; break;
        case 10: d->kdim = -1; break;
        case 11: d->vdim = -1; break;
        case 12: d->kdim = 5; break;
        case 13: d->embed_dim = (int64_t)1 << 40; d->num_heads = 1; break;
        case 14:
            d->in_proj_weight = NULL;
            d->q_proj_weight = d->k_proj_weight = d->v_proj_weight = f.in_w;
            d->kdim = HUGE_STRIDE;
            break;
        }
        const char *primed = prime_message();
        mha_status st = mha_layer_create(e, dp, lp);
        ck_assert_msg(st == bad->want,
                      "layer_create %s [%s]: got %s, want %s (%s)", bad->name,
                      mha_isa_name(isas[t]), mha_status_string(st),
                      mha_status_string(bad->want), mha_last_error());
        expect_message(bad->want, primed, bad->name);
        ck_assert_msg(layer == sentinel, "%s: *layer was written", bad->name);
        mha_engine_destroy(engine);
        free(f.arena);
        free(f.w);
    }
}
END_TEST

static const bad_input LAYER_FORWARD_BAD[] = {
    {"layer NULL", MHA_ERR_NULL_POINTER},
    {"query NULL", MHA_ERR_NULL_POINTER},
    {"key NULL", MHA_ERR_NULL_POINTER},
    {"value NULL", MHA_ERR_NULL_POINTER},
    {"out NULL", MHA_ERR_NULL_POINTER},
    {"batch 0", MHA_ERR_BAD_SHAPE},
    {"lq 0", MHA_ERR_BAD_SHAPE},
    {"lk -1", MHA_ERR_BAD_SHAPE},
    {"out is query", MHA_ERR_BAD_STRIDE},
    {"out overlaps the tail of key", MHA_ERR_BAD_STRIDE},
    {"out overlaps the head of value", MHA_ERR_BAD_STRIDE},
    {"causal 9", MHA_ERR_BAD_MASK},
    {"key length Lk + 1", MHA_ERR_BAD_MASK},
    {"keep_stride_query -1", MHA_ERR_BAD_MASK},
    {"lq 2^62: query bytes overflow", MHA_ERR_OVERFLOW},
};
#define N_LAYER_FORWARD_BAD \
    ((int)(sizeof LAYER_FORWARD_BAD / sizeof LAYER_FORWARD_BAD[0]))

START_TEST(layer_forward_bad_input)
{
    const bad_input *bad = &LAYER_FORWARD_BAD[_i];
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    const size_t arena_bytes = (2 * L_NQ + 2 * L_NK) * sizeof(float);
    for (int t = 0; t < n_isa; t++) {
        layer_fixture f;
        layer_fixture_init(&f);
        mha_engine *engine = make_engine(isas[t], 2);
        mha_layer *layer;
        ck_assert_int_eq(mha_layer_create(engine, &f.desc, &layer), MHA_OK);
        const mha_layer *l = layer;
        const float *q = f.query, *k = f.key, *v = f.value;
        float *out = f.out;
        int64_t b = LB, lq = LLQ, lk = LLK;
        uint8_t keep[LLK] = {1, 1, 0, 1};
        switch (_i) {
        case 0: l = NULL; break;
        case 1: q = NULL; break;
        case 2: k = NULL; break;
        case 3: v = NULL; break;
        case 4: out = NULL; break;
        case 5: b = 0; break;
        case 6: lq = 0; break;
        case 7: lk = -1; break;
        case 8: out = f.query; break;
        case 9: out = f.key + L_NK - 2; break;
        case 10: out = f.value - L_NQ + 1; break;
        case 11: f.mask.causal = (mha_causal)9; break;
        case 12: f.lengths[1] = LLK + 1; break;
        case 13:
            f.mask.keep = keep;
            f.mask.keep_stride_query = -1;
            break;
        case 14: lq = HUGE_STRIDE; break;
        }
        fill_sentinel(f.out, L_NQ);
        fill_sentinel(f.w, L_NW);
        unsigned char *before = test_alloc(arena_bytes);
        memcpy(before, f.arena, arena_bytes);
        const char *primed = prime_message();
        mha_status st = mha_layer_forward(l, q, k, v, b, lq, lk, &f.mask, out,
                                          f.w);
        expect_rejected(st, bad, isas[t], primed, before, f.arena,
                        arena_bytes, f.w, L_NW);
        free(before);
        mha_layer_destroy(layer);
        mha_engine_destroy(engine);
        free(f.arena);
        free(f.w);
    }
}
END_TEST

/* ---- Allocation failures --------------------------------------------- */

/* A call whose allocations are made to fail one by one. run() returns the
 * call's status; outputs are the bytes it may write on success. */
typedef struct oom_call {
    const char *name;
    mha_status (*run)(void *ctx);
    void *ctx;
    void *outputs;
    size_t output_bytes;
} oom_call;

/* Fails allocation 0, 1, 2, ... of the call in turn: each must give
 * MHA_ERR_OUT_OF_MEMORY with the outputs untouched, until the call makes
 * no more allocations than allowed and succeeds with the bytes of an
 * unhindered run. Returns the number of allocations the call makes. */
static long fail_each_allocation(const oom_call *c)
{
    unsigned char *want = test_alloc(c->output_bytes);
    unsigned char *sentinel = test_alloc(c->output_bytes);
    memset(sentinel, 0xa5, c->output_bytes);

    mha_test_fail_alloc_after(-1);
    memcpy(c->outputs, sentinel, c->output_bytes);
    ck_assert_msg(c->run(c->ctx) == MHA_OK, "%s: unhindered run failed: %s",
                  c->name, mha_last_error());
    long allocations = mha_test_fail_alloc_after(-1);
    memcpy(want, c->outputs, c->output_bytes);

    for (long n = 0;; n++) {
        ck_assert_msg(n <= allocations, "%s: still failing after %ld "
                      "allocations (an unhindered run makes %ld)",
                      c->name, n, allocations);
        memcpy(c->outputs, sentinel, c->output_bytes);
        mha_test_fail_alloc_after(n);
        mha_status st = c->run(c->ctx);
        long made = mha_test_fail_alloc_after(-1);
        if (st == MHA_OK) {
            ck_assert_msg(made <= n, "%s: allocation %ld failed yet the "
                          "call succeeded", c->name, n);
            ck_assert_msg(memcmp(c->outputs, want, c->output_bytes) == 0,
                          "%s: result differs from the unhindered run",
                          c->name);
            break;
        }
        ck_assert_msg(st == MHA_ERR_OUT_OF_MEMORY,
                      "%s: allocation %ld failed, status %s", c->name, n,
                      mha_status_string(st));
        ck_assert_msg(mha_last_error()[0] != '\0', "%s: no message",
                      c->name);
        ck_assert_msg(memcmp(c->outputs, sentinel, c->output_bytes) == 0,
                      "%s: allocation %ld failed and outputs changed",
                      c->name, n);
    }
    free(want);
    free(sentinel);
    return allocations;
}

typedef struct oom_ctx {
    mha_isa isa;
    mha_engine *engine;
    mha_layer *layer;
    fixture attn;
    layer_fixture lay;
    /* What the calls write. */
    struct {
        float out[N_OUT], w[N_W];
    } attn_out;
    struct {
        float out[L_NQ], w[L_NW];
    } layer_out;
    struct {
        mha_engine *engine;
    } engine_out;
    struct {
        mha_layer *layer;
    } created;
} oom_ctx;

static mha_status run_attention(void *p)
{
    oom_ctx *c = p;
    mha_attention_args a = c->attn.args;
    a.out.data = c->attn_out.out;
    a.weights = c->attn_out.w;
    return mha_attention(c->engine, &a);
}

static mha_status run_layer_forward(void *p)
{
    oom_ctx *c = p;
    layer_fixture *f = &c->lay;
    return mha_layer_forward(c->layer, f->query, f->key, f->value, LB, LLQ,
                             LLK, &f->mask, c->layer_out.out,
                             c->layer_out.w);
}

static mha_status run_engine_create(void *p)
{
    oom_ctx *c = p;
    mha_config config = {.num_threads = 2, .isa = c->isa};
    mha_engine *e = c->engine_out.engine;
    mha_status st = mha_engine_create(&config, &e);
    if (st == MHA_OK) {
        mha_engine_destroy(e);
        /* The pointer differs run to run; record that it was written. */
        c->engine_out.engine = (mha_engine *)c;
    }
    return st;
}

static mha_status run_layer_create(void *p)
{
    oom_ctx *c = p;
    mha_layer *l = c->created.layer;
    mha_status st = mha_layer_create(c->engine, &c->lay.desc, &l);
    if (st == MHA_OK) {
        mha_layer_destroy(l);
        c->created.layer = (mha_layer *)c;
    }
    return st;
}

START_TEST(allocation_failures)
{
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        oom_ctx *c = test_alloc(sizeof *c);
        memset(c, 0, sizeof *c);
        c->isa = isas[t];
        c->engine = make_engine(isas[t], 2);
        fixture_init(&c->attn);
        layer_fixture_init(&c->lay);
        ck_assert_int_eq(mha_layer_create(c->engine, &c->lay.desc, &c->layer),
                         MHA_OK);
        oom_call calls[] = {
            {"mha_attention", run_attention, c, &c->attn_out,
             sizeof c->attn_out},
            {"mha_layer_forward", run_layer_forward, c, &c->layer_out,
             sizeof c->layer_out},
            {"mha_engine_create", run_engine_create, c, &c->engine_out,
             sizeof c->engine_out},
            {"mha_layer_create", run_layer_create, c, &c->created,
             sizeof c->created},
        };
        for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
            long n = fail_each_allocation(&calls[i]);
            /* The layer copies its weights: it must allocate. */
            if (calls[i].run == run_layer_create)
                ck_assert_msg(n > 0, "mha_layer_create allocated nothing");
        }
        mha_layer_destroy(c->layer);
        mha_engine_destroy(c->engine);
        fixture_free(&c->attn);
        free(c->lay.arena);
        free(c->lay.w);
        free(c);
    }
}
END_TEST

Suite *suite_errors(void)
{
    Suite *s = suite_create("errors");
    TCase *tc = tcase_create("errors");
    tcase_add_test(tc, fixture_is_valid);
    tcase_add_loop_test(tc, attention_bad_input, 0, N_BAD);
    tcase_add_test(tc, engine_bad_config);
    tcase_add_test(tc, isa_from_environment);
    tcase_add_test(tc, status_strings);
    tcase_add_test(tc, last_error_is_per_thread);
    tcase_add_loop_test(tc, layer_create_bad_input, 0, N_LAYER_CREATE_BAD);
    tcase_add_loop_test(tc, layer_forward_bad_input, 0, N_LAYER_FORWARD_BAD);
    tcase_add_test(tc, allocation_failures);
    suite_add_tcase(s, tc);
    return s;
}
