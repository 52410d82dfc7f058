/*
 * Bad input: every invalid field returns its status, records a message for
 * the calling thread that names the field, and leaves every output byte
 * untouched (sentinel-filled out and weights, the engine and layer
 * pointers). Each row of the tables below carries its own mutation of a
 * valid fixture. Allocation failures are in test_errors_alloc.c,
 * mha_attention_varlen's fields in test_errors_varlen.c.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, strdup */

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

/* ---- mha_attention ---------------------------------------------------- */

/* The call a row breaks: the fixture, and the engine and args pointers
 * passed (a row may set either to NULL). */
typedef struct attn_call {
    fixture *f;
    const mha_engine *engine;
    const mha_attention_args *args;
} attn_call;

/* One field of the fixture's args or mask set to a value. */
typedef enum { NO_EDIT, ARG_I64, ARG_ENUM, ARG_F32, MASK_I64, MASK_ENUM }
    edit_kind;
typedef struct edit {
    edit_kind kind;
    size_t at; /* offsetof in mha_attention_args or mha_mask */
    int64_t i;
    float f;
} edit;
#define ARG(fld, v) {ARG_I64, offsetof(mha_attention_args, fld), (v), 0}
#define ARG_E(fld, v) {ARG_ENUM, offsetof(mha_attention_args, fld), (v), 0}
#define SCALE(v) {ARG_F32, offsetof(mha_attention_args, scale), 0, (v)}
#define MASK(fld, v) {MASK_I64, offsetof(mha_mask, fld), (v), 0}
#define MASK_E(fld, v) {MASK_ENUM, offsetof(mha_mask, fld), (v), 0}
_Static_assert(sizeof(mha_dtype) == sizeof(int) &&
                   sizeof(mha_causal) == sizeof(int),
               "enum fields are edited as int");

typedef struct attn_bad {
    expectation e;
    edit set[4];               /* applied in order; NO_EDIT ends the list */
    void (*fn)(attn_call *c); /* changes edits cannot express, or NULL */
} attn_bad;

static void apply_edit(const edit *x, fixture *f)
{
    char *base = x->kind == MASK_I64 || x->kind == MASK_ENUM
                     ? (char *)&f->mask
                     : (char *)&f->args;
    int e = (int)x->i;
    switch (x->kind) {
    case ARG_I64:
    case MASK_I64: memcpy(base + x->at, &x->i, sizeof x->i); break;
    case ARG_ENUM:
    case MASK_ENUM: memcpy(base + x->at, &e, sizeof e); break;
    case ARG_F32: memcpy(base + x->at, &x->f, sizeof x->f); break;
    case NO_EDIT: break;
    }
}

/* Mutations that are not a field set to a value. */
static void engine_null(attn_call *c) { c->engine = NULL; }
static void args_null(attn_call *c) { c->args = NULL; }
static void q_null(attn_call *c) { c->f->args.q.data = NULL; }
static void k_null(attn_call *c) { c->f->args.k.data = NULL; }
static void v_null(attn_call *c) { c->f->args.v.data = NULL; }
static void out_null(attn_call *c) { c->f->args.out.data = NULL; }
static void out_is_q(attn_call *c) { c->f->args.out.data = c->f->q; }
static void out_in_k_tail(attn_call *c)
{
    c->f->args.out.data = c->f->k + N_K - 1;
}
static void out_in_v_head(attn_call *c)
{
    c->f->args.out.data = c->f->v - N_OUT + 1;
}
static void length_negative(attn_call *c) { c->f->lengths[1] = -1; }
static void length_past_lk(attn_call *c) { c->f->lengths[0] = LK + 1; }
/* Only the arrays the overflowing case needs: k, v broadcast over keys. */
static void mask_off(attn_call *c)
{
    c->f->mask.keep = NULL;
    c->f->mask.bias = NULL;
    c->f->mask.key_lengths = NULL;
}
static void k_scales(attn_call *c)
{
    static const float one = 1.0f;
    c->f->args.k.scales.data = &one;
}

/* Score terms and lse: one bad field each (a static terms struct). */
static mha_score_terms bad_terms;
static float bad_slopes[H], bad_sinks[H];
static void use_terms(attn_call *c, mha_score_terms t)
{
    bad_terms = t;
    c->f->args.terms = &bad_terms;
}
static void window_left_neg(attn_call *c)
{
    use_terms(c, (mha_score_terms){.window = 1, .window_left = -2});
}
static void window_right_neg(attn_call *c)
{
    use_terms(c, (mha_score_terms){.window = 1, .window_right = -5});
}
static void window_flag_bad(attn_call *c)
{
    use_terms(c, (mha_score_terms){.window = 2});
}
static void align_bad(attn_call *c)
{
    use_terms(c, (mha_score_terms){.align = (mha_align)7});
}
static void softcap_nan(attn_call *c)
{
    use_terms(c, (mha_score_terms){.softcap = NAN});
}
static void softcap_inf(attn_call *c)
{
    use_terms(c, (mha_score_terms){.softcap = INFINITY});
}
static void softcap_subnormal(attn_call *c)
{
    use_terms(c, (mha_score_terms){.softcap = 1e-40f});
}
/* Above 1/FLT_MAX (accepted until a flushing engine read it as 0: off). */
static void softcap_subnormal_big(attn_call *c)
{
    use_terms(c, (mha_score_terms){.softcap = 5e-39f});
}
static void softcap_neg(attn_call *c)
{
    use_terms(c, (mha_score_terms){.softcap = -1.0f});
}
static void slope_inf(attn_call *c)
{
    for (int h = 0; h < H; h++)
        bad_slopes[h] = h == 2 ? INFINITY : 0.5f;
    use_terms(c, (mha_score_terms){.alibi_slopes = bad_slopes});
}
static void slope_stride_neg(attn_call *c)
{
    for (int h = 0; h < H; h++)
        bad_slopes[h] = 0.5f;
    use_terms(c, (mha_score_terms){.alibi_slopes = bad_slopes,
                                   .alibi_stride_batch = -1});
}
static void key_offset_neg(attn_call *c)
{
    use_terms(c, (mha_score_terms){.key_offset = -1});
}
static void key_total_short(attn_call *c)
{
    /* Below key_offset + Lk: the shard would end past the sequence. */
    use_terms(c, (mha_score_terms){.key_offset = 3,
                                   .key_total = 3 + c->f->args.k.seq - 1});
}
static int64_t bad_positions[B];
static void key_totals_short(attn_call *c)
{
    /* Batch entry 1's total leaves no room for its Lk keys. */
    for (int b = 0; b < B; b++)
        bad_positions[b] = b == 1 ? c->f->args.k.seq - 1 : 0;
    use_terms(c, (mha_score_terms){.key_totals = bad_positions});
}
static void sink_nan(attn_call *c)
{
    for (int h = 0; h < H; h++)
        bad_sinks[h] = h == 3 ? NAN : 1.0f;
    use_terms(c, (mha_score_terms){.sinks = bad_sinks});
}
static void sinks_in_out(attn_call *c)
{
    use_terms(c, (mha_score_terms){.sinks = c->f->out});
}
static void lse_is_out(attn_call *c) { c->f->args.lse = c->f->out; }
static void lse_in_q(attn_call *c) { c->f->args.lse = c->f->q + 1; }
static void key_keep_stride_neg(attn_call *c)
{
    c->f->mask.key_keep = c->f->keep;
    c->f->mask.key_keep_stride_batch = -1;
}

#define BAD_ALL(fld, x) \
    {ARG(q.fld, x), ARG(k.fld, x), ARG(v.fld, x), ARG(out.fld, x)}

static const attn_bad BAD[] = {
    {{"engine NULL", MHA_ERR_NULL_POINTER, "engine"}, {{0}}, engine_null},
    {{"args NULL", MHA_ERR_NULL_POINTER, "args"}, {{0}}, args_null},
    {{"q.data NULL", MHA_ERR_NULL_POINTER, "q.data"}, {{0}}, q_null},
    {{"k.data NULL", MHA_ERR_NULL_POINTER, "k.data"}, {{0}}, k_null},
    {{"v.data NULL", MHA_ERR_NULL_POINTER, "v.data"}, {{0}}, v_null},
    {{"out.data NULL", MHA_ERR_NULL_POINTER, "out.data"}, {{0}}, out_null},
    /* Every tensor is wrong: the message may name any of them. */
    {{"batch 0 everywhere", MHA_ERR_BAD_SHAPE,
      "q.batch|k.batch|v.batch|out.batch"}, BAD_ALL(batch, 0), NULL},
    {{"batch -1 everywhere", MHA_ERR_BAD_SHAPE,
      "q.batch|k.batch|v.batch|out.batch"}, BAD_ALL(batch, -1), NULL},
    {{"Lq 0", MHA_ERR_BAD_SHAPE, "q.seq|out.seq"},
     {ARG(q.seq, 0), ARG(out.seq, 0)}, NULL},
    {{"Lk 0", MHA_ERR_BAD_SHAPE, "k.seq|v.seq"},
     {ARG(k.seq, 0), ARG(v.seq, 0)}, NULL},
    {{"heads 0", MHA_ERR_BAD_SHAPE, "q.heads|out.heads"},
     {ARG(q.heads, 0), ARG(out.heads, 0)}, NULL},
    {{"kv heads 0", MHA_ERR_BAD_SHAPE, "k.heads|v.heads"},
     {ARG(k.heads, 0), ARG(v.heads, 0)}, NULL},
    {{"d 0", MHA_ERR_BAD_SHAPE, "q.dim|k.dim"},
     {ARG(q.dim, 0), ARG(k.dim, 0)}, NULL},
    {{"dv 0", MHA_ERR_BAD_SHAPE, "v.dim|out.dim"},
     {ARG(v.dim, 0), ARG(out.dim, 0)}, NULL},
    {{"k.batch differs", MHA_ERR_BAD_SHAPE, "k.batch"}, {ARG(k.batch, 1)},
     NULL},
    {{"v.batch differs", MHA_ERR_BAD_SHAPE, "v.batch"}, {ARG(v.batch, 1)},
     NULL},
    {{"out.batch differs", MHA_ERR_BAD_SHAPE, "out.batch"},
     {ARG(out.batch, 1)}, NULL},
    {{"v.seq differs from k.seq", MHA_ERR_BAD_SHAPE, "v.seq"},
     {ARG(v.seq, LK - 1)}, NULL},
    {{"out.seq differs from q.seq", MHA_ERR_BAD_SHAPE, "out.seq"},
     {ARG(out.seq, LQ - 1)}, NULL},
    {{"v.heads differs from k.heads", MHA_ERR_BAD_SHAPE, "v.heads"},
     {ARG(v.heads, 1)}, NULL},
    {{"out.heads differs from q.heads", MHA_ERR_BAD_SHAPE, "out.heads"},
     {ARG(out.heads, 2)}, NULL},
    {{"k.dim differs from q.dim", MHA_ERR_BAD_SHAPE, "k.dim"},
     {ARG(k.dim, D - 1)}, NULL},
    {{"out.dim differs from v.dim", MHA_ERR_BAD_SHAPE, "out.dim"},
     {ARG(out.dim, DV - 1)}, NULL},
    {{"Hkv 3 does not divide H 4", MHA_ERR_BAD_SHAPE, "k.heads"},
     {ARG(k.heads, 3), ARG(v.heads, 3)}, NULL},
    {{"Hkv 8 above H 4", MHA_ERR_BAD_SHAPE, "k.heads"},
     {ARG(k.heads, 8), ARG(v.heads, 8)}, NULL},
    {{"q.stride_batch -1", MHA_ERR_BAD_STRIDE, "q.stride_batch"},
     {ARG(q.stride_batch, -1)}, NULL},
    {{"q.stride_seq -1", MHA_ERR_BAD_STRIDE, "q.stride_seq"},
     {ARG(q.stride_seq, -1)}, NULL},
    {{"q.stride_head -1", MHA_ERR_BAD_STRIDE, "q.stride_head"},
     {ARG(q.stride_head, -1)}, NULL},
    {{"k.stride_batch -1", MHA_ERR_BAD_STRIDE, "k.stride_batch"},
     {ARG(k.stride_batch, -1)}, NULL},
    {{"k.stride_seq -1", MHA_ERR_BAD_STRIDE, "k.stride_seq"},
     {ARG(k.stride_seq, -1)}, NULL},
    {{"v.stride_head -1", MHA_ERR_BAD_STRIDE, "v.stride_head"},
     {ARG(v.stride_head, -1)}, NULL},
    {{"out.stride_batch -1", MHA_ERR_BAD_STRIDE, "out.stride_batch"},
     {ARG(out.stride_batch, -1)}, NULL},
    {{"out.stride_seq -1", MHA_ERR_BAD_STRIDE, "out.stride_seq"},
     {ARG(out.stride_seq, -1)}, NULL},
    {{"out.stride_head -1", MHA_ERR_BAD_STRIDE, "out.stride_head"},
     {ARG(out.stride_head, -1)}, NULL},
    {{"out is q", MHA_ERR_BAD_STRIDE, "out"}, {{0}}, out_is_q},
    {{"out overlaps the tail of k", MHA_ERR_BAD_STRIDE, "out"}, {{0}},
     out_in_k_tail},
    {{"out overlaps the head of v", MHA_ERR_BAD_STRIDE, "out"}, {{0}},
     out_in_v_head},
    {{"out.stride_seq 0 (overlaps itself)", MHA_ERR_BAD_STRIDE, "out"},
     {ARG(out.stride_seq, 0)}, NULL},
    {{"out.stride_head 0 (overlaps itself)", MHA_ERR_BAD_STRIDE, "out"},
     {ARG(out.stride_head, 0)}, NULL},
    {{"out.stride_batch 0 (overlaps itself)", MHA_ERR_BAD_STRIDE, "out"},
     {ARG(out.stride_batch, 0)}, NULL},
    {{"out rows overlap (stride_head < dv)", MHA_ERR_BAD_STRIDE, "out"},
     {ARG(out.stride_head, DV - 1)}, NULL},
    {{"keep_stride_batch -1", MHA_ERR_BAD_MASK, "mask.keep_stride_batch"},
     {MASK(keep_stride_batch, -1)}, NULL},
    {{"keep_stride_head -1", MHA_ERR_BAD_MASK, "mask.keep_stride_head"},
     {MASK(keep_stride_head, -1)}, NULL},
    {{"keep_stride_query -1", MHA_ERR_BAD_MASK, "mask.keep_stride_query"},
     {MASK(keep_stride_query, -1)}, NULL},
    {{"bias_stride_batch -1", MHA_ERR_BAD_MASK, "mask.bias_stride_batch"},
     {MASK(bias_stride_batch, -1)}, NULL},
    {{"bias_stride_head -1", MHA_ERR_BAD_MASK, "mask.bias_stride_head"},
     {MASK(bias_stride_head, -1)}, NULL},
    {{"bias_stride_query -1", MHA_ERR_BAD_MASK, "mask.bias_stride_query"},
     {MASK(bias_stride_query, -1)}, NULL},
    {{"causal 3", MHA_ERR_BAD_MASK, "mask.causal"}, {MASK_E(causal, 3)},
     NULL},
    {{"causal -1", MHA_ERR_BAD_MASK, "mask.causal"}, {MASK_E(causal, -1)},
     NULL},
    {{"key length -1", MHA_ERR_BAD_MASK, "mask.key_lengths"}, {{0}},
     length_negative},
    {{"key length Lk + 1", MHA_ERR_BAD_MASK, "mask.key_lengths"}, {{0}},
     length_past_lk},
    /* (Lk - 1) * 2^62 elements */
    {{"k offset overflows int64", MHA_ERR_OVERFLOW, "k"},
     {ARG(k.stride_seq, HUGE_STRIDE)}, NULL},
    /* 2^62 elements fit in int64, 2^64 bytes do not */
    {{"k byte count overflows int64", MHA_ERR_OVERFLOW, "k"},
     {ARG(k.stride_batch, HUGE_STRIDE)}, NULL},
    /* B*H*Lq*Lk = 3 * 2^65 weights; k, v broadcast over keys */
    {{"weights count overflows int64", MHA_ERR_OVERFLOW, "weights|Lk"},
     {ARG(k.seq, HUGE_STRIDE), ARG(v.seq, HUGE_STRIDE), ARG(k.stride_seq, 0),
      ARG(v.stride_seq, 0)},
     mask_off},
    {{"q.dtype F16", MHA_ERR_UNSUPPORTED, "q.dtype"},
     {ARG_E(q.dtype, MHA_F16)}, NULL},
    {{"out.dtype BF16", MHA_ERR_UNSUPPORTED, "out.dtype"},
     {ARG_E(out.dtype, MHA_BF16)}, NULL},
    {{"k.dtype 7", MHA_ERR_UNSUPPORTED, "k.dtype"}, {ARG_E(k.dtype, 7)},
     NULL},
    {{"scale NaN", MHA_ERR_BAD_ARGUMENT, "scale"}, {SCALE(NAN)}, NULL},
    {{"scale +inf", MHA_ERR_BAD_ARGUMENT, "scale"}, {SCALE(INFINITY)}, NULL},
    {{"scale -inf", MHA_ERR_BAD_ARGUMENT, "scale"}, {SCALE(-INFINITY)},
     NULL},
    {{"terms.window_left -2", MHA_ERR_BAD_MASK, "terms.window_left"},
     {{0}}, window_left_neg},
    {{"terms.window_right -5", MHA_ERR_BAD_MASK, "terms.window_right"},
     {{0}}, window_right_neg},
    {{"terms.window 2", MHA_ERR_BAD_MASK, "terms.window"}, {{0}},
     window_flag_bad},
    {{"terms.align 7", MHA_ERR_BAD_ARGUMENT, "terms.align"}, {{0}},
     align_bad},
    {{"terms.softcap NaN", MHA_ERR_BAD_ARGUMENT, "terms.softcap"}, {{0}},
     softcap_nan},
    {{"terms.softcap inf", MHA_ERR_BAD_ARGUMENT, "terms.softcap"}, {{0}},
     softcap_inf},
    {{"terms.softcap 1e-40", MHA_ERR_BAD_ARGUMENT, "terms.softcap"}, {{0}},
     softcap_subnormal},
    {{"terms.softcap 5e-39", MHA_ERR_BAD_ARGUMENT, "terms.softcap"}, {{0}},
     softcap_subnormal_big},
    {{"terms.softcap -1", MHA_ERR_BAD_ARGUMENT, "terms.softcap"}, {{0}},
     softcap_neg},
    {{"terms.alibi_slopes inf", MHA_ERR_BAD_ARGUMENT, "terms.alibi_slopes"},
     {{0}}, slope_inf},
    {{"terms.alibi_stride_batch -1", MHA_ERR_BAD_ARGUMENT,
      "terms.alibi_stride_batch"}, {{0}}, slope_stride_neg},
    {{"terms.key_offset -1", MHA_ERR_BAD_ARGUMENT, "terms.key_offset"},
     {{0}}, key_offset_neg},
    {{"terms.key_total below key_offset + Lk", MHA_ERR_BAD_ARGUMENT,
      "terms.key_total"}, {{0}}, key_total_short},
    {{"terms.key_totals[1] below Lk", MHA_ERR_BAD_ARGUMENT,
      "terms.key_totals[1]"}, {{0}}, key_totals_short},
    {{"terms.sinks NaN", MHA_ERR_BAD_ARGUMENT, "terms.sinks"}, {{0}},
     sink_nan},
    {{"terms.sinks inside out", MHA_ERR_BAD_ARGUMENT, "terms.sinks"}, {{0}},
     sinks_in_out},
    {{"lse is out", MHA_ERR_BAD_STRIDE, "lse"}, {{0}}, lse_is_out},
    {{"lse inside q", MHA_ERR_BAD_STRIDE, "lse"}, {{0}}, lse_in_q},
    {{"mask.key_keep_stride_batch -1", MHA_ERR_BAD_MASK,
      "mask.key_keep_stride_batch"}, {{0}}, key_keep_stride_neg},
    /* The float dtypes take no scales (quantised ones: tests/test_quant.c). */
    {{"k.scales.data set", MHA_ERR_UNSUPPORTED, "k.scales"}, {{0}},
     k_scales},
};
#define N_BAD ((int)(sizeof BAD / sizeof BAD[0]))

START_TEST(attention_bad_input)
{
    const attn_bad *bad = &BAD[_i];
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
        attn_call c = {&f, engine, &f.args};
        for (int i = 0; i < 4 && bad->set[i].kind != NO_EDIT; i++)
            apply_edit(&bad->set[i], &f);
        if (bad->fn)
            bad->fn(&c);
        /* mha_attention_check refuses exactly what mha_attention does. */
        const char *primed = prime_message();
        mha_status st = mha_attention_check(c.engine, c.args);
        expect_rejected(st, &bad->e, isas[t], primed, before, f.arena,
                        arena_bytes, f.w, N_W);
        primed = prime_message();
        st = mha_attention(c.engine, c.args);
        expect_rejected(st, &bad->e, isas[t], primed, before, f.arena,
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
    mha_engine *e = make_engine(MHA_ISA_GENERIC, 1);
    ck_assert_msg(mha_attention_check(e, &f.args) == MHA_OK, "%s",
                  mha_last_error());
    mha_engine_destroy(e);
    check_attention(&f.args, N_OUT, 1, 2, "error fixture");
    fixture_free(&f);
}
END_TEST

/* ---- Engine creation -------------------------------------------------- */

/* Sets MHA_ISA (NULL: unsets it); returns the previous value to give back
 * to restore_isa_env. */
static char *set_isa_env(const char *value)
{
    const char *saved = getenv("MHA_ISA");
    char *copy = saved ? strdup(saved) : NULL;
    if (value)
        setenv("MHA_ISA", value, 1);
    else
        unsetenv("MHA_ISA");
    return copy;
}

static void restore_isa_env(char *copy)
{
    if (copy)
        setenv("MHA_ISA", copy, 1);
    else
        unsetenv("MHA_ISA");
    free(copy);
}

/* A refused mha_engine_create: status, message naming `field`, *engine
 * untouched. */
static void expect_refused_config(const mha_config *config, mha_status want,
                                  const char *field, const char *name)
{
    static char marker;
    mha_engine *const sentinel = (mha_engine *)(void *)&marker;
    mha_engine *e = sentinel;
    const char *primed = prime_message();
    mha_status st = mha_engine_create(config, &e);
    ck_assert_msg(st == want, "%s: got %s, want %s (%s)", name,
                  mha_status_string(st), mha_status_string(want),
                  mha_last_error());
    expect_message(primed, field, name);
    ck_assert_msg(e == sentinel, "%s: *engine was written", name);
}

START_TEST(engine_bad_config)
{
    static const struct {
        const char *name;
        mha_config config;
        mha_status want;
        const char *field;
    } rows[] = {
        {"num_threads -1", {.num_threads = -1}, MHA_ERR_BAD_ARGUMENT,
         "config.num_threads|num_threads"},
        {"num_threads MHA_MAX_THREADS + 1",
         {.num_threads = MHA_MAX_THREADS + 1}, MHA_ERR_BAD_ARGUMENT,
         "config.num_threads|num_threads"},
        {"isa 99", {.isa = (mha_isa)99}, MHA_ERR_BAD_ARGUMENT,
         "config.isa|isa"},
        {"isa -1", {.isa = (mha_isa)-1}, MHA_ERR_BAD_ARGUMENT,
         "config.isa|isa"},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
        expect_refused_config(&rows[r].config, rows[r].want, rows[r].field,
                              rows[r].name);
    /* Every ISA this build or CPU lacks, named in its message. */
    mha_isa lack[TEST_MAX_ISAS];
    int n_lack = missing_isas(lack);
    for (int i = 0; i < n_lack; i++) {
        mha_config config = {.isa = lack[i]};
        expect_refused_config(&config, MHA_ERR_UNSUPPORTED,
                              mha_isa_name(lack[i]), mha_isa_name(lack[i]));
    }
    ck_assert_int_eq(mha_engine_create(NULL, NULL), MHA_ERR_NULL_POINTER);
    ck_assert_msg(names_field(mha_last_error(), "engine"),
                  "engine NULL: message '%s'", mha_last_error());

    /* An unknown MHA_ISA value is refused, not silently ignored. */
    char *saved = set_isa_env("no-such-isa");
    expect_refused_config(NULL, MHA_ERR_UNSUPPORTED, "MHA_ISA",
                          "MHA_ISA=no-such-isa");
    restore_isa_env(saved);

    /* NULL config means defaults. */
    mha_engine *e = NULL;
    ck_assert_int_eq(mha_engine_create(NULL, &e), MHA_OK);
    ck_assert(e != NULL);
    ck_assert_int_ne(mha_engine_isa(e), MHA_ISA_AUTO);
    mha_engine_destroy(e);
    mha_engine_destroy(NULL);

    /* The bound itself is accepted. */
    mha_config most = {.num_threads = MHA_MAX_THREADS};
    ck_assert_msg(mha_engine_create(&most, &e) == MHA_OK,
                  "num_threads MHA_MAX_THREADS refused: %s",
                  mha_last_error());
    ck_assert_int_eq(mha_engine_num_threads(e), MHA_MAX_THREADS);
    mha_engine_destroy(e);
}
END_TEST

/* MHA_ISA=<name> forces that table for every ISA of mha_isas(): engine
 * creation picks exactly it when mha_isa_available says it runs, and fails
 * with MHA_ERR_UNSUPPORTED and a message naming it otherwise. */
START_TEST(isa_from_environment)
{
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    char *saved = set_isa_env(NULL);
    for (size_t i = 0; i < n; i++) {
        const char *name = mha_isa_name(all[i]);
        setenv("MHA_ISA", name, 1);
        mha_engine *e = NULL;
        mha_status st = mha_engine_create(NULL, &e);
        mha_isa got = st == MHA_OK ? mha_engine_isa(e) : MHA_ISA_AUTO;
        mha_engine_destroy(st == MHA_OK ? e : NULL);
        if (mha_isa_available(all[i]))
            ck_assert_msg(st == MHA_OK && got == all[i],
                          "MHA_ISA=%s: %s, picked %s", name,
                          mha_status_string(st), mha_isa_name(got));
        else
            ck_assert_msg(st == MHA_ERR_UNSUPPORTED &&
                              names_field(mha_last_error(), name),
                          "MHA_ISA=%s (not available): %s, message '%s'",
                          name, mha_status_string(st), mha_last_error());
    }
    restore_isa_env(saved);
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

/* mha_layer_create's arguments as a row may break them. */
typedef struct create_call {
    layer_fixture *f;
    const mha_engine *engine;
    const mha_layer_desc *desc;
    mha_layer **layer;
} create_call;

typedef struct create_bad {
    expectation e;
    void (*fn)(create_call *c);
} create_bad;

static void c_engine_null(create_call *c) { c->engine = NULL; }
static void c_desc_null(create_call *c) { c->desc = NULL; }
static void c_layer_null(create_call *c) { c->layer = NULL; }
static void c_out_w_null(create_call *c)
{
    c->f->desc.out_proj_weight = NULL;
}
static void c_k_w_null(create_call *c)
{
    c->f->desc.in_proj_weight = NULL;
    c->f->desc.q_proj_weight = c->f->in_w;
    c->f->desc.v_proj_weight = c->f->in_w;
}
static void c_no_in_proj(create_call *c) { c->f->desc.in_proj_weight = NULL; }
static void c_embed_0(create_call *c) { c->f->desc.embed_dim = 0; }
static void c_embed_neg(create_call *c) { c->f->desc.embed_dim = -8; }
static void c_heads_0(create_call *c) { c->f->desc.num_heads = 0; }
static void c_heads_3(create_call *c) { c->f->desc.num_heads = 3; }
static void c_kdim_neg(create_call *c) { c->f->desc.kdim = -1; }
static void c_vdim_neg(create_call *c) { c->f->desc.vdim = -1; }
static void c_kdim_5(create_call *c) { c->f->desc.kdim = 5; }
static void c_embed_huge(create_call *c)
{
    c->f->desc.embed_dim = (int64_t)1 << 40;
    c->f->desc.num_heads = 1;
}
static void c_kdim_huge(create_call *c)
{
    mha_layer_desc *d = &c->f->desc;
    d->in_proj_weight = NULL;
    d->q_proj_weight = d->k_proj_weight = d->v_proj_weight = c->f->in_w;
    d->kdim = HUGE_STRIDE;
}
static void c_shard_neg(create_call *c) { c->f->desc.shard_heads = -1; }
static void c_shard_first_only(create_call *c) { c->f->desc.shard_first = 1; }
static void c_shard_past(create_call *c)
{
    c->f->desc.shard_first = LH - 1;
    c->f->desc.shard_heads = 2;
}
static void c_shard_first_neg(create_call *c)
{
    c->f->desc.shard_first = -1;
    c->f->desc.shard_heads = 1;
}

static const create_bad LAYER_CREATE_BAD[] = {
    {{"engine NULL", MHA_ERR_NULL_POINTER, "engine"}, c_engine_null},
    {{"desc NULL", MHA_ERR_NULL_POINTER, "desc"}, c_desc_null},
    {{"layer pointer NULL", MHA_ERR_NULL_POINTER, "layer"}, c_layer_null},
    {{"out_proj_weight NULL", MHA_ERR_NULL_POINTER,
      "desc.out_proj_weight|out_proj_weight"}, c_out_w_null},
    {{"separate weights, k_proj_weight NULL", MHA_ERR_NULL_POINTER,
      "desc.k_proj_weight|k_proj_weight"}, c_k_w_null},
    {{"no input projection at all", MHA_ERR_NULL_POINTER,
      "desc.in_proj_weight|in_proj_weight"}, c_no_in_proj},
    {{"embed_dim 0", MHA_ERR_BAD_SHAPE, "desc.embed_dim"}, c_embed_0},
    {{"embed_dim -8", MHA_ERR_BAD_SHAPE, "desc.embed_dim"}, c_embed_neg},
    {{"num_heads 0", MHA_ERR_BAD_SHAPE, "desc.num_heads"}, c_heads_0},
    {{"num_heads 3 does not divide 8", MHA_ERR_BAD_SHAPE, "desc.num_heads"},
     c_heads_3},
    {{"kdim -1", MHA_ERR_BAD_SHAPE, "desc.kdim"}, c_kdim_neg},
    {{"vdim -1", MHA_ERR_BAD_SHAPE, "desc.vdim"}, c_vdim_neg},
    {{"in_proj_weight with kdim 5", MHA_ERR_BAD_SHAPE, "kdim|desc.kdim"},
     c_kdim_5},
    {{"embed_dim 2^40: weight bytes overflow", MHA_ERR_OVERFLOW,
      "embed_dim|desc.embed_dim"}, c_embed_huge},
    {{"kdim 2^62: weight bytes overflow", MHA_ERR_OVERFLOW,
      "kdim|desc.kdim"}, c_kdim_huge},
    {{"shard_heads -1", MHA_ERR_BAD_SHAPE, "desc.shard_heads"}, c_shard_neg},
    {{"shard_first -1", MHA_ERR_BAD_SHAPE, "desc.shard_first"},
     c_shard_first_neg},
    {{"shard_first without shard_heads", MHA_ERR_BAD_ARGUMENT,
      "desc.shard_first"}, c_shard_first_only},
    {{"shard past the last head", MHA_ERR_BAD_SHAPE, "desc.shard_heads"},
     c_shard_past},
};
#define N_LAYER_CREATE_BAD \
    ((int)(sizeof LAYER_CREATE_BAD / sizeof LAYER_CREATE_BAD[0]))

START_TEST(layer_create_bad_input)
{
    const create_bad *bad = &LAYER_CREATE_BAD[_i];
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        layer_fixture f;
        layer_fixture_init(&f);
        mha_engine *engine = make_engine(isas[t], 1);
        mha_layer *sentinel = (mha_layer *)&f, *layer = sentinel;
        create_call c = {&f, engine, &f.desc, &layer};
        bad->fn(&c);
        const char *primed = prime_message();
        mha_status st = mha_layer_create(c.engine, c.desc, c.layer);
        ck_assert_msg(st == bad->e.want,
                      "layer_create %s [%s]: got %s, want %s (%s)",
                      bad->e.name, mha_isa_name(isas[t]),
                      mha_status_string(st), mha_status_string(bad->e.want),
                      mha_last_error());
        expect_message(primed, bad->e.field, bad->e.name);
        ck_assert_msg(layer == sentinel, "%s: *layer was written",
                      bad->e.name);
        mha_engine_destroy(engine);
        layer_fixture_free(&f);
    }
}
END_TEST

/* mha_layer_forward's arguments as a row may break them. */
typedef struct forward_call {
    layer_fixture *f;
    const mha_layer *layer;
    const float *q, *k, *v;
    float *out;
    int64_t b, lq, lk;
    uint8_t keep[LLK];
} forward_call;

typedef struct forward_bad {
    expectation e;
    void (*fn)(forward_call *c);
} forward_bad;

static void f_layer_null(forward_call *c) { c->layer = NULL; }
static void f_query_null(forward_call *c) { c->q = NULL; }
static void f_key_null(forward_call *c) { c->k = NULL; }
static void f_value_null(forward_call *c) { c->v = NULL; }
static void f_out_null(forward_call *c) { c->out = NULL; }
static void f_batch_0(forward_call *c) { c->b = 0; }
static void f_lq_0(forward_call *c) { c->lq = 0; }
static void f_lk_neg(forward_call *c) { c->lk = -1; }
static void f_out_is_query(forward_call *c) { c->out = c->f->query; }
static void f_out_in_key(forward_call *c) { c->out = c->f->key + L_NK - 2; }
static void f_out_in_value(forward_call *c)
{
    c->out = c->f->value - L_NQ + 1;
}
static void f_causal_9(forward_call *c)
{
    c->f->mask.causal = (mha_causal)9;
}
static void f_length(forward_call *c) { c->f->lengths[1] = LLK + 1; }
static void f_keep_stride(forward_call *c)
{
    c->f->mask.keep = c->keep;
    c->f->mask.keep_stride_query = -1;
}
static void f_lq_huge(forward_call *c) { c->lq = HUGE_STRIDE; }

static const forward_bad LAYER_FORWARD_BAD[] = {
    {{"layer NULL", MHA_ERR_NULL_POINTER, "layer"}, f_layer_null},
    {{"query NULL", MHA_ERR_NULL_POINTER, "query"}, f_query_null},
    {{"key NULL", MHA_ERR_NULL_POINTER, "key"}, f_key_null},
    {{"value NULL", MHA_ERR_NULL_POINTER, "value"}, f_value_null},
    {{"out NULL", MHA_ERR_NULL_POINTER, "out"}, f_out_null},
    {{"batch 0", MHA_ERR_BAD_SHAPE, "batch"}, f_batch_0},
    {{"lq 0", MHA_ERR_BAD_SHAPE, "lq"}, f_lq_0},
    {{"lk -1", MHA_ERR_BAD_SHAPE, "lk"}, f_lk_neg},
    {{"out is query", MHA_ERR_BAD_STRIDE, "out"}, f_out_is_query},
    {{"out overlaps the tail of key", MHA_ERR_BAD_STRIDE, "out"},
     f_out_in_key},
    {{"out overlaps the head of value", MHA_ERR_BAD_STRIDE, "out"},
     f_out_in_value},
    {{"causal 9", MHA_ERR_BAD_MASK, "mask.causal"}, f_causal_9},
    {{"key length Lk + 1", MHA_ERR_BAD_MASK, "mask.key_lengths"}, f_length},
    {{"keep_stride_query -1", MHA_ERR_BAD_MASK, "mask.keep_stride_query"},
     f_keep_stride},
    {{"lq 2^62: query bytes overflow", MHA_ERR_OVERFLOW, "lq|Lq"},
     f_lq_huge},
};
#define N_LAYER_FORWARD_BAD \
    ((int)(sizeof LAYER_FORWARD_BAD / sizeof LAYER_FORWARD_BAD[0]))

/* A layer call a row breaks: the fixture, its engine and layer, and the
 * arena as it was before the call. */
typedef struct layer_case {
    layer_fixture f;
    mha_engine *engine;
    mha_layer *layer;
    unsigned char *before;
    const char *primed;
} layer_case;

#define LAYER_ARENA_BYTES ((2 * L_NQ + 2 * L_NK) * sizeof(float))

static void layer_case_open(layer_case *c, mha_isa isa)
{
    layer_fixture_init(&c->f);
    c->engine = make_engine(isa, 2);
    ck_assert_int_eq(mha_layer_create(c->engine, &c->f.desc, &c->layer),
                     MHA_OK);
}

/* After the row's changes, just before the call: sentinels, the arena's
 * bytes, a primed message. */
static void layer_case_snap(layer_case *c)
{
    fill_sentinel(c->f.out, L_NQ);
    fill_sentinel(c->f.w, L_NW);
    c->before = test_alloc(LAYER_ARENA_BYTES);
    memcpy(c->before, c->f.arena, LAYER_ARENA_BYTES);
    c->primed = prime_message();
}

static void layer_case_close(layer_case *c, mha_status st,
                             const expectation *e, mha_isa isa)
{
    expect_rejected(st, e, isa, c->primed, c->before, c->f.arena,
                    LAYER_ARENA_BYTES, c->f.w, L_NW);
    free(c->before);
    mha_layer_destroy(c->layer);
    mha_engine_destroy(c->engine);
    layer_fixture_free(&c->f);
}

START_TEST(layer_forward_bad_input)
{
    const forward_bad *bad = &LAYER_FORWARD_BAD[_i];
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        layer_case lc;
        layer_case_open(&lc, isas[t]);
        layer_fixture *f = &lc.f;
        forward_call c = {f, lc.layer, f->query, f->key, f->value, f->out,
                          LB, LLQ, LLK, {1, 1, 0, 1}};
        bad->fn(&c);
        layer_case_snap(&lc);
        /* mha_layer_check refuses exactly what the forward does. */
        mha_layer_args a = {.query = c.q, .key = c.k, .value = c.v,
                            .out = c.out, .batch = c.b, .lq = c.lq,
                            .lk = c.lk, .mask = &f->mask, .weights = f->w};
        mha_status st = mha_layer_check(c.layer, &a);
        expect_rejected(st, &bad->e, isas[t], lc.primed, lc.before,
                        lc.f.arena, LAYER_ARENA_BYTES, lc.f.w, L_NW);
        lc.primed = prime_message();
        st = mha_layer_forward(c.layer, c.q, c.k, c.v, c.b, c.lq, c.lk,
                               &f->mask, c.out, f->w);
        layer_case_close(&lc, st, &bad->e, isas[t]);
    }
}
END_TEST

/* Averaged weights ([B, Lq, Lk], mha_layer_forward_ex) are checked
 * against the mask arrays like per-head weights: a keep array inside them
 * is refused before anything is written. */
START_TEST(layer_average_weights_overlap_mask)
{
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    const expectation e = {"averaged weights over mask.keep",
                           MHA_ERR_BAD_MASK, "weights"};
    for (int t = 0; t < n_isa; t++) {
        layer_case lc;
        layer_case_open(&lc, isas[t]);
        layer_fixture *f = &lc.f;
        f->mask.keep = (const uint8_t *)(f->w + 1);
        f->mask.keep_stride_query = LLK;
        mha_layer_args a = {.query = f->query, .key = f->key,
                            .value = f->value, .out = f->out, .batch = LB,
                            .lq = LLQ, .lk = LLK, .mask = &f->mask,
                            .weights = f->w, .average_weights = 1};
        layer_case_snap(&lc);
        layer_case_close(&lc, mha_layer_forward_ex(lc.layer, &a), &e, isas[t]);
    }
}
END_TEST

/* A shard's output leaves out the other heads: averaging its weights over
 * all heads is refused, nothing written. */
START_TEST(layer_shard_refuses_average_weights)
{
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    const expectation e = {"averaged weights of a shard", MHA_ERR_UNSUPPORTED,
                           "average_weights"};
    for (int t = 0; t < n_isa; t++) {
        layer_case lc;
        layer_case_open(&lc, isas[t]);
        layer_fixture *f = &lc.f;
        mha_layer_destroy(lc.layer);
        f->desc.shard_heads = 1;
        ck_assert_int_eq(mha_layer_create(lc.engine, &f->desc, &lc.layer),
                         MHA_OK);
        mha_layer_args a = {.query = f->query, .key = f->key,
                            .value = f->value, .out = f->out, .batch = LB,
                            .lq = LLQ, .lk = LLK, .weights = f->w,
                            .average_weights = 1};
        layer_case_snap(&lc);
        layer_case_close(&lc, mha_layer_forward_ex(lc.layer, &a), &e, isas[t]);
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
    tcase_add_test(tc, layer_average_weights_overlap_mask);
    tcase_add_test(tc, layer_shard_refuses_average_weights);
    errors_add_allocation_tests(tc);
    errors_add_varlen_tests(tc);
    suite_add_tcase(s, tc);
    return s;
}
