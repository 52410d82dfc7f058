/*
 * Score terms (mha.h, docs/design.md "Score terms"): sliding windows (size
 * 1, one side, both, wider than the sequence, with causal masks and both
 * alignments, on prefill, decode, grouped decode and split-KV shapes),
 * softcap (with masks, with huge scores), ALiBi (against the same call
 * with the explicit additive bias), sinks (fully masked rows: zeros, lse =
 * sink), the lse output, mha_merge_states (1, 2 and 5 parts equal one
 * call), every K/V dtype, every available ISA, against the double oracle.
 * Then the porting fixes: typed views, key_keep with keep, an explicit zero
 * scale, mha_layer_forward_ex with [L, B, E] strides and averaged weights.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oracle.h"
#include "util.h"

/* One problem: shapes, K/V dtypes, mask and terms; q drawn in [-1, 1)
 * times q_scale (huge scores for the softcap). */
typedef struct tdesc {
    int64_t b, h, hkv, lq, lk, d, dv;
    mha_dtype kt, vt;
    const mha_mask *mask;
    const mha_score_terms *terms;
    int weights;
    float q_scale;
    float scale;
    int scale_explicit;
} tdesc;

typedef struct tbufs {
    float *q;
    void *k, *v;
    float *out, *w, *lse;
    mha_attention_args args;
} tbufs;

static void make_bufs(const tdesc *c, uint64_t seed, tbufs *t)
{
    test_rng r;
    rng_seed(&r, seed);
    size_t nq = (size_t)(c->b * c->lq * c->h * c->d);
    size_t nk = (size_t)(c->b * c->lk * c->hkv * c->d);
    size_t nv = (size_t)(c->b * c->lk * c->hkv * c->dv);
    t->q = random_floats(&r, nq);
    for (size_t i = 0; i < nq; i++)
        t->q[i] *= c->q_scale ? c->q_scale : 1.0f;
    float *k = random_floats(&r, nk), *v = random_floats(&r, nv);
    t->k = as_dtype(k, nk, c->kt);
    t->v = as_dtype(v, nv, c->vt);
    free(k), free(v);
    size_t no = (size_t)(c->b * c->lq * c->h * c->dv);
    t->out = test_alloc(no * sizeof *t->out);
    t->w = c->weights ? test_alloc((size_t)(c->b * c->h * c->lq * c->lk) *
                                   sizeof(float))
                      : NULL;
    t->lse = test_alloc((size_t)(c->b * c->h * c->lq) * sizeof(float));
    mha_attention_args a = {
        .q = mha_tensor_bshd_typed(t->q, MHA_F32, c->b, c->lq, c->h, c->d),
        .k = mha_tensor_bshd_typed(t->k, c->kt, c->b, c->lk, c->hkv, c->d),
        .v = mha_tensor_bshd_typed(t->v, c->vt, c->b, c->lk, c->hkv, c->dv),
        .out = mha_tensor_bshd(t->out, c->b, c->lq, c->h, c->dv),
        .mask = c->mask,
        .terms = c->terms,
        .scale = c->scale,
        .scale_explicit = c->scale_explicit,
        .weights = t->w,
        .lse = t->lse,
    };
    t->args = a;
}

static void free_bufs(tbufs *t)
{
    free(t->q), free(t->k), free(t->v), free(t->out), free(t->w);
    free(t->lse);
}

/* Runs c on every available ISA against the oracle: out, weights, lse;
 * rows the oracle finds fully masked are exact zeros. */
static void run(const tdesc *c, uint64_t seed, const char *what)
{
    tbufs t;
    make_bufs(c, seed, &t);
    const size_t no = (size_t)(c->b * c->lq * c->h * c->dv);
    const size_t nw = (size_t)(c->b * c->h * c->lq * c->lk);
    const size_t nl = (size_t)(c->b * c->h * c->lq);
    double *want = test_alloc(no * sizeof *want);
    double *want_w = test_alloc(nw * sizeof *want_w);
    double *want_l = test_alloc(nl * sizeof *want_l);
    oracle_attention_lse(&t.args, want, want_w, want_l);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int x = 0; x < n_isa; x++) {
        const char *isa = mha_isa_name(isas[x]);
        mha_engine *e = make_engine(isas[x], 0);
        fill_sentinel(t.out, no);
        fill_sentinel(t.lse, nl);
        if (t.w)
            fill_sentinel(t.w, nw);
        mha_status st = mha_attention(e, &t.args);
        ck_assert_msg(st == MHA_OK, "%s [%s]: %s (%s)", what, isa,
                      mha_status_string(st), mha_last_error());
        size_t worst;
        double r = tol_ratio(t.out, want, no, TOL_ATTN_ABS, TOL_ATTN_REL,
                             &worst);
        ck_assert_msg(r <= 1.0, "%s [%s]: out[%zu] = %.9g, want %.9g", what,
                      isa, worst, (double)t.out[worst], want[worst]);
        for (int64_t row = 0; row < (int64_t)nl; row++) {
            int64_t b = row / (c->h * c->lq), h = row / c->lq % c->h;
            int64_t i = row % c->lq;
            const double *w = &want_w[row * c->lk];
            int visible = 0;
            for (int64_t j = 0; j < c->lk && !visible; j++)
                visible = w[j] != 0.0;
            const float *o = &t.out[((b * c->lq + i) * c->h + h) * c->dv];
            for (int64_t k = 0; k < c->dv && !visible; k++)
                REQUIRE(o[k] == 0.0f, "%s [%s]: masked row %lld out = %g",
                        what, isa, (long long)row, (double)o[k]);
        }
        if (t.w)
            check_weights(t.w, want_w, (int64_t)nl, c->lk, TOL_ATTN_ABS,
                          TOL_ATTN_REL, what, isa);
        check_lse(t.lse, want_l, nl, what, isa);
        mha_engine_destroy(e);
    }
    free(want), free(want_w), free(want_l);
    free_bufs(&t);
}

/* ---- Windows ----------------------------------------------------------- */

/* (Lq, Lk, H, Hkv): prefill, several row blocks with the head cache and
 * the diagonal cut, Lq > Lk, decode, grouped decode, split-KV decode and
 * split-KV prefill. */
static const int64_t WSHAPES[][4] = {
    {7, 300, 4, 2},  {200, 333, 2, 1}, {300, 7, 2, 2}, {3, 40, 2, 2},
    {1, 37, 8, 2},   {1, 2100, 2, 2},  {1, 2100, 8, 2}, {64, 1500, 2, 1}};
#define N_WSHAPES ((int)(sizeof WSHAPES / sizeof WSHAPES[0]))
/* (left, right): size 1, one side, both, wider than any sequence, the
 * flag with both sides unbounded. */
static const int64_t WINDOWS[][2] = {{0, 0},  {3, -1}, {-1, 2},
                                     {5, 5},  {0, 4},  {1000000, 1000000},
                                     {-1, -1}, {700, 0}};
#define N_WINDOWS ((int)(sizeof WINDOWS / sizeof WINDOWS[0]))

START_TEST(window_grid)
{
    const int64_t *s = WSHAPES[_i];
    for (int w = 0; w < N_WINDOWS; w++)
        for (int causal = 0; causal < 3; causal++)
            for (int align = 0; align < 2; align++) {
                mha_mask mask = {.causal = (mha_causal)causal};
                mha_score_terms terms = {.window = 1,
                                         .window_left = WINDOWS[w][0],
                                         .window_right = WINDOWS[w][1],
                                         .align = (mha_align)align};
                tdesc c = {.b = 2, .h = s[2], .hkv = s[3], .lq = s[0],
                           .lk = s[1], .d = 16, .dv = 8, .mask = &mask,
                           .terms = &terms, .weights = (w + causal) % 2};
                char what[160];
                snprintf(what, sizeof what,
                         "Lq %lld Lk %lld H %lld/%lld window (%lld, %lld) "
                         "causal %d align %d",
                         (long long)s[0], (long long)s[1], (long long)s[2],
                         (long long)s[3], (long long)WINDOWS[w][0],
                         (long long)WINDOWS[w][1], causal, align);
                run(&c, (uint64_t)(_i * 1000 + w * 10 + causal * 2 + align),
                    what);
            }
}
END_TEST

/* ---- Softcap, ALiBi, sinks --------------------------------------------- */

START_TEST(softcap_masks_huge)
{
    test_rng r;
    rng_seed(&r, 77);
    enum { BB = 2, LK = 150 };
    uint8_t keep[BB * LK];
    float bias[LK];
    for (int j = 0; j < BB * LK; j++)
        keep[j] = rng_uniform(&r) > -0.5f;
    for (int j = 0; j < LK; j++)
        bias[j] = j % 9 == 0 ? -INFINITY : rng_uniform(&r);
    const float caps[] = {0.5f, 30.0f};
    const float q_scales[] = {1.0f, 1e4f, 1e30f};
    for (int ci = 0; ci < 2; ci++)
        for (int qi = 0; qi < 3; qi++)
            for (int m = 0; m < 2; m++) {
                mha_mask mask = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
                if (m) {
                    mask.keep = keep, mask.keep_stride_batch = LK;
                    mask.bias = bias;
                }
                mha_score_terms terms = {.softcap = caps[ci]};
                tdesc c = {.b = BB, .h = 2, .hkv = 1, .lq = 70, .lk = LK,
                           .d = 8, .dv = 8, .mask = &mask, .terms = &terms,
                           .weights = 1, .q_scale = q_scales[qi]};
                char what[96];
                snprintf(what, sizeof what, "softcap %g q x %g masks %d",
                         (double)caps[ci], (double)q_scales[qi], m);
                run(&c, (uint64_t)(ci * 10 + qi * 2 + m), what);
            }
}
END_TEST

/* ALiBi equals the same call with its bias spelled out: -slope * (i' -
 * j) in a [B, H, Lq, Lk] additive mask. */
START_TEST(alibi_equals_bias)
{
    enum { BB = 2, HH = 4, LQ = 33, LK = 90, DD = 8 };
    const float slopes[BB * HH] = {0.5f,  0.25f, 0.125f, 0.0625f,
                                   0.03f, 1.0f,  0.0f,   2.0f};
    for (int per_batch = 0; per_batch < 2; per_batch++)
        for (int align = 0; align < 2; align++) {
            mha_score_terms terms = {.alibi_slopes = slopes,
                                     .alibi_stride_batch = per_batch ? HH : 0,
                                     .align = (mha_align)align};
            float *bias = test_alloc(BB * HH * LQ * LK * sizeof(float));
            for (int b = 0; b < BB; b++)
                for (int h = 0; h < HH; h++)
                    for (int i = 0; i < LQ; i++)
                        for (int j = 0; j < LK; j++) {
                            int ip = align ? i : i + LK - LQ;
                            float s = slopes[(per_batch ? b * HH : 0) + h];
                            bias[((b * HH + h) * LQ + i) * LK + j] =
                                -s * (float)(ip - j);
                        }
            mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
            mha_mask explicit_bias = causal;
            explicit_bias.bias = bias;
            explicit_bias.bias_stride_batch = HH * LQ * LK;
            explicit_bias.bias_stride_head = LQ * LK;
            explicit_bias.bias_stride_query = LK;
            tdesc a = {.b = BB, .h = HH, .hkv = 2, .lq = LQ, .lk = LK,
                       .d = DD, .dv = DD, .mask = &causal, .terms = &terms,
                       .weights = 1};
            tdesc e = a;
            e.mask = &explicit_bias;
            e.terms = NULL;
            run(&a, 5, "alibi");
            run(&e, 5, "alibi as explicit bias");
            /* The two calls agree with each other, not only with the
             * oracle. */
            tbufs ta, te;
            make_bufs(&a, 5, &ta);
            make_bufs(&e, 5, &te);
            mha_isa isas[TEST_MAX_ISAS];
            mha_engine *en = make_engine(isas[available_isas(isas) - 1], 0);
            ck_assert_int_eq(mha_attention(en, &ta.args), MHA_OK);
            ck_assert_int_eq(mha_attention(en, &te.args), MHA_OK);
            size_t no = BB * LQ * HH * DD;
            for (size_t x = 0; x < no; x++)
                REQUIRE(fabsf(ta.out[x] - te.out[x]) <=
                            TOL_ATTN_ABS + TOL_ATTN_REL * fabsf(te.out[x]),
                        "alibi vs bias: out[%zu] %g vs %g", x,
                        (double)ta.out[x], (double)te.out[x]);
            mha_engine_destroy(en);
            free_bufs(&ta), free_bufs(&te), free(bias);
        }
}
END_TEST

START_TEST(sinks_and_masked_rows)
{
    enum { BB = 3, HH = 4, LQ = 20, LK = 70 };
    const float sinks[HH] = {-1.0f, 0.5f, 3.0f, 20.0f};
    const int32_t lengths[BB] = {0, 35, LK};
    mha_mask mask = {.key_lengths = lengths,
                     .causal = MHA_CAUSAL_TOP_LEFT};
    mha_score_terms terms = {.sinks = sinks};
    tdesc c = {.b = BB, .h = HH, .hkv = 2, .lq = LQ, .lk = LK, .d = 8,
               .dv = 8, .mask = &mask, .terms = &terms, .weights = 1};
    run(&c, 9, "sinks");
    /* Batch 0 sees no key: zeros, lse = sink exactly, on every ISA. */
    tbufs t;
    make_bufs(&c, 9, &t);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int x = 0; x < n_isa; x++) {
        mha_engine *e = make_engine(isas[x], 0);
        ck_assert_int_eq(mha_attention(e, &t.args), MHA_OK);
        for (int h = 0; h < HH; h++)
            for (int i = 0; i < LQ; i++)
                REQUIRE(t.lse[h * LQ + i] == sinks[h],
                        "[%s] masked row h %d i %d: lse %g, want the sink %g",
                        mha_isa_name(isas[x]), h, i,
                        (double)t.lse[h * LQ + i], (double)sinks[h]);
        mha_engine_destroy(e);
    }
    free_bufs(&t);
    /* Split-KV decode and grouped decode rows take the sink once. */
    tdesc d = {.b = 2, .h = HH, .hkv = 1, .lq = 1, .lk = 3000, .d = 8,
               .dv = 8, .terms = &terms};
    run(&d, 10, "sinks, grouped split-KV decode");
    d.hkv = HH;
    run(&d, 11, "sinks, split-KV decode");
    /* A speculative decode step (3 queries, 2 query heads a kv head):
     * rows across kv heads interleave the queries (mha_seq.ilv), each
     * row starting from its own head's sink; split-KV, with the causal
     * diagonal and then a window too. */
    mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_score_terms windowed = {.sinks = sinks, .window = 1,
                                .window_left = 40, .window_right = 0};
    tdesc e = {.b = 2, .h = HH, .hkv = 2, .lq = 3, .lk = 3000, .d = 8,
               .dv = 8, .mask = &causal, .terms = &terms};
    run(&e, 12, "sinks, speculative decode across kv heads");
    e.terms = &windowed;
    run(&e, 13, "sinks and a window, speculative decode across kv heads");
}
END_TEST

/* Prefill long enough for several row blocks per head, without weights:
 * blocks crossing the causal diagonal (or a window's left edge) by more
 * than a sub-block run as row sub-blocks (engine/prefill.c), each with
 * its rows' ALiBi positions (the sinks start the whole block's sums);
 * all_terms_every_dtype's prefill asks for weights, which keeps rows
 * whole, and a sub-block's ALiBi rows shifted by one position passed
 * every other test. */
START_TEST(terms_prefill_sub_blocks)
{
    enum { HH = 4, LL = 400 };
    const float sinks[HH] = {-3.0f, 0.5f, 2.0f, 6.0f};
    const float slopes[HH] = {0.02f, 0.05f, 0.0f, 0.1f};
    mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_score_terms t0 = {.sinks = sinks};
    mha_score_terms t1 = {.sinks = sinks, .alibi_slopes = slopes,
                          .window = 1, .window_left = 100,
                          .window_right = 0};
    tdesc c = {.b = 2, .h = HH, .hkv = 2, .lq = LL, .lk = LL, .d = 16,
               .dv = 8, .mask = &causal, .terms = &t0};
    run(&c, 21, "sinks, causal prefill sub-blocks");
    c.terms = &t1;
    c.mask = NULL;
    run(&c, 22, "sinks + alibi, window prefill sub-blocks");
}
END_TEST

/* Every term and mask at once, every K/V dtype pair. */
START_TEST(all_terms_every_dtype)
{
    const mha_dtype dts[3] = {MHA_F32, MHA_F16, MHA_BF16};
    enum { BB = 2, HH = 4, LK = 600 };
    const float slopes[HH] = {0.5f, 0.25f, 0.125f, 0.0625f};
    const float sinks[HH] = {0.0f, 1.0f, -2.0f, 4.0f};
    uint8_t key_keep[BB * LK];
    for (int j = 0; j < BB * LK; j++)
        key_keep[j] = j % 7 != 3;
    const int64_t shapes[][2] = {{150, LK}, {1, LK}, {5, LK}};
    for (int s = 0; s < 3; s++)
        for (int kt = 0; kt < 3; kt++)
            for (int vt = 0; vt < 3; vt++) {
                mha_mask mask = {.causal = MHA_CAUSAL_BOTTOM_RIGHT,
                                 .key_keep = key_keep,
                                 .key_keep_stride_batch = LK};
                mha_score_terms terms = {.window = 1, .window_left = 64,
                                         .window_right = 0, .softcap = 5.0f,
                                         .alibi_slopes = slopes,
                                         .sinks = sinks};
                tdesc c = {.b = BB, .h = HH, .hkv = shapes[s][0] == 1 ? 1 : 2,
                           .lq = shapes[s][0], .lk = shapes[s][1], .d = 16,
                           .dv = 8, .kt = dts[kt], .vt = dts[vt],
                           .mask = &mask, .terms = &terms,
                           .weights = s == 0};
                char what[96];
                snprintf(what, sizeof what, "all terms Lq %lld k %s v %s",
                         (long long)shapes[s][0], mha_dtype_name(dts[kt]),
                         mha_dtype_name(dts[vt]));
                run(&c, (uint64_t)(s * 9 + kt * 3 + vt), what);
            }
}
END_TEST

/* A shard placed at the far end of the positions the library takes
 * (terms.key_total = INT64_MAX / 4, just below 2^61, the largest it
 * accepts) under a bottom-right causal mask, a window and ALiBi: the mask
 * and the ALiBi distances depend on positions only through differences,
 * so every ISA gives the bits of the same keys at positions 0..Lk-1, for
 * prefill, decode and split-KV shapes. One more is refused, naming the
 * field. */
START_TEST(positions_at_the_bound)
{
    const int64_t far = INT64_MAX / 4;
    const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    static const int64_t shapes[3][2] = {{17, 70}, {1, 70}, {1, 2100}};
    mha_mask causal = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_score_terms near = {.window = 1, .window_left = 30,
                            .window_right = -1, .alibi_slopes = slopes};
    mha_score_terms at_far = near;
    at_far.key_total = far;
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int sh = 0; sh < 3; sh++) {
        const int64_t lq = shapes[sh][0], lk = shapes[sh][1];
        at_far.key_offset = far - lk;
        tdesc c = {.b = 2, .h = 4, .hkv = 2, .lq = lq, .lk = lk, .d = 16,
                   .dv = 16, .mask = &causal, .terms = &near};
        tbufs t, f;
        make_bufs(&c, 31, &t);
        c.terms = &at_far;
        make_bufs(&c, 31, &f);
        const size_t no = (size_t)(c.b * lq * c.h * c.dv),
                     nl = (size_t)(c.b * c.h * lq);
        for (int x = 0; x < n_isa; x++) {
            mha_engine *e = make_engine(isas[x], 0);
            const char *isa = mha_isa_name(isas[x]);
            ck_assert_int_eq(mha_attention(e, &t.args), MHA_OK);
            ck_assert_msg(mha_attention(e, &f.args) == MHA_OK, "[%s] %s", isa,
                          mha_last_error());
            ck_assert_msg(memcmp(t.out, f.out, no * sizeof(float)) == 0 &&
                              memcmp(t.lse, f.lse, nl * sizeof(float)) == 0,
                          "[%s] (%lld, %lld): keys at 2^61 - %lld differ "
                          "from keys at 0",
                          isa, (long long)lq, (long long)lk, (long long)lk);
            /* Past the bound: refused, outputs untouched. */
            mha_score_terms past = at_far;
            past.key_total = far + 1;
            f.args.terms = &past;
            fill_sentinel(f.out, no);
            ck_assert_int_eq(mha_attention(e, &f.args), MHA_ERR_BAD_ARGUMENT);
            ck_assert_ptr_nonnull(strstr(mha_last_error(), "terms.key_total"));
            ck_assert_uint_eq(count_changed(f.out, no), 0);
            past = at_far;
            past.key_offset = far; /* key_total 0: it ends the keys */
            past.key_total = 0;
            ck_assert_int_eq(mha_attention(e, &f.args), MHA_OK);
            past.key_offset = far + 1;
            fill_sentinel(f.out, no);
            ck_assert_int_eq(mha_attention(e, &f.args), MHA_ERR_BAD_ARGUMENT);
            ck_assert_ptr_nonnull(
                strstr(mha_last_error(), "terms.key_offset"));
            ck_assert_uint_eq(count_changed(f.out, no), 0);
            f.args.terms = &at_far;
            mha_engine_destroy(e);
        }
        free_bufs(&t), free_bufs(&f);
    }
}
END_TEST

/* ---- Merging ----------------------------------------------------------- */

/* Keys split into n parts (uneven), each part's (out, lse), merged: equal
 * to one call over all keys within the fp32 tolerance (out and lse), on
 * every ISA. Part 0 holds the sinks; a part batch 1 sees none of. */
/* With positional: the parts are shards of one sequence (terms.key_offset
 * and key_total), under a bottom-right causal mask, a window and ALiBi,
 * which must see the global positions for the merge to equal one call. */
static void merge_parts(int n, mha_dtype kt, int positional)
{
    enum { BB = 2, HH = 4, HKV = 2, LQ = 9, LK = 300, DD = 16, DV = 8 };
    const float sinks[HH] = {0.0f, 1.0f, -2.0f, 4.0f};
    const float slopes[HH] = {0.5f, 0.25f, 0.125f, 0.0625f};
    uint8_t key_keep[BB * LK];
    for (int j = 0; j < BB * LK; j++)
        key_keep[j] = !(j >= LK + 40 && j < LK + 110) && j % 11 != 5;
    mha_mask mask = {.key_keep = key_keep, .key_keep_stride_batch = LK};
    mha_score_terms terms = {.sinks = sinks};
    if (positional) {
        mask.causal = MHA_CAUSAL_BOTTOM_RIGHT;
        terms.window = 1;
        terms.window_left = 150;
        terms.window_right = -1;
        terms.alibi_slopes = slopes;
    }
    tdesc c = {.b = BB, .h = HH, .hkv = HKV, .lq = LQ, .lk = LK, .d = DD,
               .dv = DV, .kt = kt, .vt = kt, .mask = &mask, .terms = &terms};
    tbufs whole;
    make_bufs(&c, 21, &whole);
    const size_t no = BB * LQ * HH * DV, nl = BB * HH * LQ;
    double *want = test_alloc(no * sizeof *want);
    double *want_l = test_alloc(nl * sizeof *want_l);
    oracle_attention_lse(&whole.args, want, NULL, want_l);
    int64_t cut[6] = {0};
    for (int p = 1; p < n; p++)
        cut[p] = p == 1 && n > 1 ? 40 : LK * p / n + 3;
    cut[n] = LK;
    float *outs = test_alloc((size_t)n * no * sizeof(float));
    float *lses = test_alloc((size_t)n * nl * sizeof(float));
    float *out = test_alloc(no * sizeof(float)), *lse = test_alloc(nl * 4);
    mha_tensor views[5];
    const float *lse_ptr[5];
    mha_score_terms none = {0};
    size_t es = mha_dtype_size(kt);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int x = 0; x < n_isa; x++) {
        mha_engine *e = make_engine(isas[x], 0);
        ck_assert_int_eq(mha_attention(e, &whole.args), MHA_OK);
        for (int p = 0; p < n; p++) {
            mha_attention_args a = whole.args;
            mha_mask pm = mask;
            pm.key_keep = key_keep + cut[p];
            int64_t len = cut[p + 1] - cut[p];
            a.k.data = (char *)whole.k + (size_t)(cut[p] * a.k.stride_seq) * es;
            a.v.data = (char *)whole.v + (size_t)(cut[p] * a.v.stride_seq) * es;
            a.k.seq = a.v.seq = len;
            a.mask = &pm;
            /* The sink joins one part only: the merge counts it once. */
            mha_score_terms shard = terms;
            shard.sinks = p == 0 ? sinks : NULL;
            shard.key_offset = cut[p];
            shard.key_total = LK;
            a.terms = positional ? &shard : p == 0 ? &terms : &none;
            a.out = mha_tensor_bshd(outs + p * no, BB, LQ, HH, DV);
            a.lse = lses + p * nl;
            a.weights = NULL;
            ck_assert_msg(mha_attention(e, &a) == MHA_OK, "part %d: %s", p,
                          mha_last_error());
            views[p] = a.out;
            lse_ptr[p] = a.lse;
        }
        fill_sentinel(out, no);
        mha_merge_args m = {.parts = n, .outs = views, .lses = lse_ptr,
                            .out = mha_tensor_bshd(out, BB, LQ, HH, DV),
                            .lse = lse};
        ck_assert_msg(mha_merge_states(&m) == MHA_OK, "merge: %s",
                      mha_last_error());
        char what[64];
        snprintf(what, sizeof what, "merge of %d %sparts, %s", n,
                 positional ? "positioned " : "", mha_dtype_name(kt));
        const char *isa = mha_isa_name(isas[x]);
        for (size_t i = 0; i < no; i++)
            REQUIRE(fabsf(out[i] - whole.out[i]) <=
                        TOL_ATTN_ABS + TOL_ATTN_REL * fabsf(whole.out[i]),
                    "%s [%s]: out[%zu] %.9g, one call %.9g", what, isa, i,
                    (double)out[i], (double)whole.out[i]);
        size_t worst;
        ck_assert_msg(tol_ratio(out, want, no, TOL_ATTN_ABS, TOL_ATTN_REL,
                                &worst) <= 1.0,
                      "%s [%s]: out[%zu] vs oracle", what, isa, worst);
        check_lse(lse, want_l, nl, what, isa);
        check_lse(whole.lse, want_l, nl, "one call", isa);
        mha_engine_destroy(e);
    }
    free(want), free(want_l), free(outs), free(lses), free(out), free(lse);
    free_bufs(&whole);
}

START_TEST(merge_1_2_5)
{
    const int ns[3] = {1, 2, 5};
    const mha_dtype dts[3] = {MHA_F32, MHA_F16, MHA_BF16};
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 3; t++)
            for (int positional = 0; positional < 2; positional++)
                merge_parts(ns[i], dts[t], positional);
}
END_TEST

/* Parts whose every key is masked add nothing; all of them: zeros, -inf;
 * NaN in an lse propagates. */
START_TEST(merge_edges)
{
    float o0[4] = {1, 2, 3, 4}, o1[4] = {5, 6, 7, 8}, out[4], lse;
    const float ninf = -INFINITY;
    float l0 = ninf, l1 = ninf;
    mha_tensor v[2] = {mha_tensor_bshd(o0, 1, 1, 1, 4),
                       mha_tensor_bshd(o1, 1, 1, 1, 4)};
    const float *ls[2] = {&l0, &l1};
    mha_merge_args m = {.parts = 2, .outs = v, .lses = ls,
                        .out = mha_tensor_bshd(out, 1, 1, 1, 4), .lse = &lse};
    ck_assert_int_eq(mha_merge_states(&m), MHA_OK);
    for (int i = 0; i < 4; i++)
        ck_assert(out[i] == 0.0f);
    ck_assert(lse == -INFINITY);
    l1 = 0.5f;
    ck_assert_int_eq(mha_merge_states(&m), MHA_OK);
    for (int i = 0; i < 4; i++)
        ck_assert(out[i] == o1[i]);
    ck_assert(lse == 0.5f);
    l0 = NAN;
    ck_assert_int_eq(mha_merge_states(&m), MHA_OK);
    ck_assert(isnan(out[0]) && isnan(lse));
    /* Two equal halves: the mean, lse + log 2. */
    l0 = l1 = 1.0f;
    ck_assert_int_eq(mha_merge_states(&m), MHA_OK);
    ck_assert(fabsf(out[0] - 3.0f) < 1e-6f && fabsf(lse - (1.0f + logf(2.0f))) < 1e-6f);
    /* Bad input names the field and writes nothing. */
    fill_sentinel(out, 4);
    m.parts = 0;
    ck_assert_int_eq(mha_merge_states(&m), MHA_ERR_BAD_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(mha_last_error(), "parts"));
    m.parts = 2;
    m.out = v[1];
    ck_assert_int_eq(mha_merge_states(&m), MHA_ERR_BAD_STRIDE);
    m.out = mha_tensor_bshd(out, 1, 1, 1, 3);
    ck_assert_int_eq(mha_merge_states(&m), MHA_ERR_BAD_SHAPE);
    ck_assert_ptr_nonnull(strstr(mha_last_error(), "outs[0]"));
    ck_assert_uint_eq(count_changed(out, 4), 0);
}
END_TEST

/* mha_merge_states' refusals, one per row (engine/merge.c): each breaks a
 * valid merge of two parts [1, 2, 2, 3] in one way and must give its
 * status and a message naming the field, with out and lse untouched. */
enum { MB_L = 2, MB_H = 2, MB_D = 3, MB_N = MB_L * MB_H * MB_D,
       MB_NL = MB_H * MB_L };
typedef struct {
    float parts[2][MB_N], plse[2][MB_NL], out[MB_N], lse[MB_NL];
    mha_tensor outs[2];
    const float *lses[2];
    mha_merge_args a;
} merge_bufs;

static void merge_valid(merge_bufs *m)
{
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < MB_N; i++)
            m->parts[c][i] = (float)(c + 1) * 0.25f * (float)i;
        for (int i = 0; i < MB_NL; i++)
            m->plse[c][i] = 0.5f * (float)(i - c);
        m->outs[c] = mha_tensor_bshd(m->parts[c], 1, MB_L, MB_H, MB_D);
        m->lses[c] = m->plse[c];
    }
    m->a = (mha_merge_args){.parts = 2, .outs = m->outs, .lses = m->lses,
                            .out = mha_tensor_bshd(m->out, 1, MB_L, MB_H,
                                                   MB_D),
                            .lse = m->lse};
}

static const struct merge_bad {
    const char *what;  /* what the row breaks */
    mha_status status;
    const char *field; /* in the message */
} MERGE_BAD[] = {
    {"args NULL", MHA_ERR_NULL_POINTER, "args"},
    {"parts 0", MHA_ERR_BAD_ARGUMENT, "parts"},
    {"outs NULL", MHA_ERR_NULL_POINTER, "outs"},
    {"lses NULL", MHA_ERR_NULL_POINTER, "lses"},
    {"out.data NULL", MHA_ERR_NULL_POINTER, "out.data"},
    {"out fp16", MHA_ERR_UNSUPPORTED, "out.dtype"},
    {"out heads share memory", MHA_ERR_BAD_STRIDE, "out strides"},
    {"lse inside out", MHA_ERR_BAD_STRIDE, "lse overlaps out"},
    {"lse past the address space", MHA_ERR_OVERFLOW, "lse extends"},
    {"outs[1] bf16", MHA_ERR_UNSUPPORTED, "outs[1].dtype"},
    {"outs[1] narrower", MHA_ERR_BAD_SHAPE, "outs[1]"},
    {"outs[0] is out", MHA_ERR_BAD_STRIDE, "outs[0] overlaps out"},
    {"lse inside outs[1]", MHA_ERR_BAD_STRIDE, "outs[1] overlaps lse"},
    {"lses[1] NULL", MHA_ERR_NULL_POINTER, "lses[1]"},
    {"lses[0] inside out", MHA_ERR_BAD_STRIDE, "lses[0] overlaps out"},
    {"lses[1] is lse", MHA_ERR_BAD_STRIDE, "lses[1] overlaps lse"},
    {"lses[1] past the address space", MHA_ERR_OVERFLOW, "lses[1]"},
};
enum { N_MERGE_BAD = sizeof MERGE_BAD / sizeof MERGE_BAD[0] };

START_TEST(merge_bad_input)
{
    merge_bufs *m = test_alloc(sizeof *m);
    merge_valid(m);
    fill_sentinel(m->out, MB_N);
    fill_sentinel(m->lse, MB_NL);
    ck_assert_int_eq(mha_merge_states(&m->a), MHA_OK); /* the valid merge */
    merge_valid(m);
    mha_merge_args *a = &m->a;
    /* Far pointers are never dereferenced: the checks refuse them first. */
    float *far = (float *)(UINTPTR_MAX - 8);
    switch (_i) {
    case 0: a = NULL; break;
    case 1: a->parts = 0; break;
    case 2: a->outs = NULL; break;
    case 3: a->lses = NULL; break;
    case 4: a->out.data = NULL; break;
    case 5: a->out.dtype = MHA_F16; break;
    case 6: a->out.stride_head = 0; break;
    case 7: a->lse = m->out + 2; break;
    case 8: a->lse = far; break;
    case 9: m->outs[1].dtype = MHA_BF16; break;
    case 10: m->outs[1].dim = MB_D - 1; break;
    case 11: m->outs[0] = a->out; break;
    case 12: a->lse = m->parts[1] + 1; break;
    case 13: m->lses[1] = NULL; break;
    case 14: m->lses[0] = m->out + MB_N - 1; break;
    case 15: m->lses[1] = m->lse; break;
    case 16: m->lses[1] = far; break;
    }
    const struct merge_bad *row = &MERGE_BAD[_i];
    fill_sentinel(m->out, MB_N);
    fill_sentinel(m->lse, MB_NL);
    mha_status st = mha_merge_states(a);
    ck_assert_msg(st == row->status, "%s: status %s, want %s (%s)", row->what,
                  mha_status_string(st), mha_status_string(row->status),
                  mha_last_error());
    ck_assert_msg(strstr(mha_last_error(), row->field) != NULL,
                  "%s: message '%s' does not name '%s'", row->what,
                  mha_last_error(), row->field);
    ck_assert_msg(count_changed(m->out, MB_N) == 0 &&
                      count_changed(m->lse, MB_NL) == 0,
                  "%s: out or lse written", row->what);
    free(m);
}
END_TEST

/* ---- What porting from PyTorch trips over ------------------------------ */

START_TEST(porting_fixes)
{
    /* key_keep with keep and bias, an explicit zero scale. */
    enum { BB = 2, HH = 2, LQ = 6, LK = 21 };
    uint8_t keep[LQ * LK], key_keep[BB * LK];
    float bias[LK];
    for (int j = 0; j < LQ * LK; j++)
        keep[j] = j % 5 != 1;
    for (int j = 0; j < BB * LK; j++)
        key_keep[j] = j % 3 != 0;
    for (int j = 0; j < LK; j++)
        bias[j] = 0.1f * (float)j;
    mha_mask mask = {.keep = keep, .keep_stride_query = LK,
                     .key_keep = key_keep, .key_keep_stride_batch = LK,
                     .bias = bias};
    tdesc c = {.b = BB, .h = HH, .hkv = HH, .lq = LQ, .lk = LK, .d = 8,
               .dv = 8, .mask = &mask, .weights = 1};
    run(&c, 31, "key_keep + keep + bias");
    c.scale_explicit = 1;
    run(&c, 32, "explicit zero scale");
    c.kt = MHA_BF16;
    run(&c, 33, "typed bf16 keys");
    mha_tensor t = mha_tensor_bhsd_typed(keep, MHA_F16, 1, 2, 3, 4);
    ck_assert_int_eq(t.dtype, MHA_F16);
    ck_assert_int_eq(t.stride_head, 8);
}
END_TEST

/* mha_layer_forward_ex with [L, B, E] strides equals the packed call;
 * averaged weights are the heads' mean; lse matches mha_attention's. */
START_TEST(layer_strides_average)
{
    enum { E = 16, NH = 4, BB = 3, LQ = 5, LK = 7 };
    test_rng r;
    rng_seed(&r, 41);
    float *in_w = random_floats(&r, 3 * E * E), *out_w = random_floats(&r, E * E);
    float *in_b = random_floats(&r, 3 * E);
    mha_layer_desc desc = {.embed_dim = E, .num_heads = NH,
                           .in_proj_weight = in_w, .in_proj_bias = in_b,
                           .out_proj_weight = out_w};
    float *q = random_floats(&r, BB * LQ * E), *kv = random_floats(&r, BB * LK * E);
    float *q_lbe = test_alloc(BB * LQ * E * 4), *kv_lbe = test_alloc(BB * LK * E * 4);
    for (int b = 0; b < BB; b++)
        for (int s = 0; s < LQ; s++)
            memcpy(&q_lbe[(s * BB + b) * E], &q[(b * LQ + s) * E], E * 4);
    for (int b = 0; b < BB; b++)
        for (int s = 0; s < LK; s++)
            memcpy(&kv_lbe[(s * BB + b) * E], &kv[(b * LK + s) * E], E * 4);
    float *out = test_alloc(BB * LQ * E * 4), *out2 = test_alloc(BB * LQ * E * 4);
    float *w = test_alloc(BB * NH * LQ * LK * 4), *wa = test_alloc(BB * LQ * LK * 4);
    float *lse = test_alloc(BB * NH * LQ * 4);
    const float slopes[NH] = {0.5f, 0.25f, 0.1f, 0.0f};
    mha_score_terms terms = {.alibi_slopes = slopes, .softcap = 3.0f,
                             .window = 1, .window_left = 2, .window_right = 1};
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int x = 0; x < n_isa; x++) {
        mha_engine *e = make_engine(isas[x], 0);
        mha_layer *l = NULL;
        ck_assert_int_eq(mha_layer_create(e, &desc, &l), MHA_OK);
        mha_layer_args a = {.query = q, .key = kv, .value = kv, .out = out,
                            .batch = BB, .lq = LQ, .lk = LK, .terms = &terms,
                            .weights = w};
        ck_assert_msg(mha_layer_forward_ex(l, &a) == MHA_OK, "%s",
                      mha_last_error());
        mha_layer_args s = a;
        s.query = q_lbe, s.key = s.value = kv_lbe, s.out = out2;
        s.query_stride_batch = E, s.query_stride_seq = BB * E;
        s.key_stride_batch = s.value_stride_batch = E;
        s.key_stride_seq = s.value_stride_seq = BB * E;
        s.out_stride_batch = E, s.out_stride_seq = BB * E;
        s.weights = wa, s.average_weights = 1, s.lse = lse;
        ck_assert_msg(mha_layer_forward_ex(l, &s) == MHA_OK, "%s",
                      mha_last_error());
        for (int b = 0; b < BB; b++)
            for (int i = 0; i < LQ; i++)
                for (int c = 0; c < E; c++)
                    REQUIRE(out2[(i * BB + b) * E + c] ==
                                out[(b * LQ + i) * E + c],
                            "[%s] [L,B,E] out b %d i %d c %d differs",
                            mha_isa_name(isas[x]), b, i, c);
        for (int b = 0; b < BB; b++)
            for (int i = 0; i < LQ * LK; i++) {
                double m = 0.0;
                for (int h = 0; h < NH; h++)
                    m += w[(b * NH + h) * LQ * LK + i];
                m /= NH;
                REQUIRE(fabs(wa[b * LQ * LK + i] - m) <= 1e-6,
                        "[%s] averaged weight %d %d: %g, want %g",
                        mha_isa_name(isas[x]), b, i,
                        (double)wa[b * LQ * LK + i], m);
            }
        for (int i = 0; i < BB * NH * LQ; i++)
            REQUIRE(isfinite(lse[i]), "lse[%d] = %g", i, (double)lse[i]);
        /* The old entry point is the packed, per-head form. */
        ck_assert_int_eq(mha_layer_forward(l, q, kv, kv, BB, LQ, LK, NULL,
                                           out2, NULL),
                         MHA_OK);
        mha_layer_destroy(l);
        mha_engine_destroy(e);
    }
    free(in_w), free(out_w), free(in_b), free(q), free(kv), free(q_lbe);
    free(kv_lbe), free(out), free(out2), free(w), free(wa), free(lse);
}
END_TEST

Suite *suite_terms(void)
{
    Suite *s = suite_create("terms");
    TCase *tc = tcase_create("terms");
    tcase_add_loop_test(tc, window_grid, 0, N_WSHAPES);
    tcase_add_test(tc, softcap_masks_huge);
    tcase_add_test(tc, alibi_equals_bias);
    tcase_add_test(tc, sinks_and_masked_rows);
    tcase_add_test(tc, terms_prefill_sub_blocks);
    tcase_add_test(tc, all_terms_every_dtype);
    tcase_add_test(tc, positions_at_the_bound);
    tcase_add_test(tc, merge_1_2_5);
    tcase_add_test(tc, merge_edges);
    tcase_add_loop_test(tc, merge_bad_input, 0, N_MERGE_BAD);
    tcase_add_test(tc, porting_fixes);
    tcase_add_test(tc, layer_strides_average);
    suite_add_tcase(s, tc);
    return s;
}
