/*
 * Every mask kind alone and combined, against the oracle on every ISA:
 * causal top-left / bottom-right (Lq < Lk and Lq > Lk), boolean keep-masks
 * [B,1,1,Lk], [1,1,Lq,Lk] and [B,H,Lq,Lk] (padded strides), additive masks
 * with -INFINITY entries, key lengths including 0 and Lk. check_attention
 * verifies that fully masked rows are exact zeros in out and weights and
 * that weight rows sum to 1 (or 0).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

enum { KEEP_NONE, KEEP_PAD, KEEP_LOOKAHEAD, KEEP_FULL, N_KEEP };
enum { BIAS_NONE, BIAS_ROW, BIAS_FULL, N_BIAS };
#define N_CAUSAL 3
#define N_LENGTHS 2
#define N_COMBOS (N_CAUSAL * N_KEEP * N_BIAS * N_LENGTHS)

static const char *const KEEP_NAME[] = {"none", "[B,1,1,Lk]", "[1,1,Lq,Lk]",
                                        "[B,H,Lq,Lk]"};
static const char *const BIAS_NAME[] = {"none", "[1,1,1,Lk]", "[B,H,Lq,Lk]"};
static const char *const CAUSAL_NAME[] = {"none", "top-left",
                                          "bottom-right"};

/* (Lq, Lk): below, equal to and above each other and common block sizes. */
static const int64_t SHAPES[][2] = {{1, 17},   {7, 17},  {17, 7},
                                    {64, 65},  {65, 64}, {200, 65},
                                    {65, 200}, {3, 1031}, {5, 1}};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

enum { B = 3, H = 4, HKV = 2, D = 13, DV = 16 };

/* Strides of a logical [nb, nh, lq, lk] mask (an axis of extent 1
 * broadcasts with stride 0) with prime padding after every row, head and
 * batch; *count is the number of elements it spans. */
static void mask_strides(int nb, int nh, int64_t lq, int64_t lk,
                         int64_t st[3], size_t *count)
{
    st[2] = lq > 1 ? lk + 3 : 0;
    int64_t head_span = lq > 1 ? lq * st[2] : lk;
    st[1] = nh > 1 ? head_span + 5 : 0;
    int64_t batch_span = nh > 1 ? nh * st[1] : head_span;
    st[0] = nb > 1 ? batch_span + 7 : 0;
    *count = (size_t)(nb > 1 ? nb * st[0] : batch_span);
}

/* Keep-flags: 70% kept, and every fifth (b, h, i) row masked entirely. */
static uint8_t *make_keep(test_rng *r, int nb, int nh, int64_t lq, int64_t lk,
                          int64_t st[3])
{
    size_t n;
    mask_strides(nb, nh, lq, lk, st, &n);
    uint8_t *keep = test_alloc(n);
    memset(keep, 0xee, n); /* padding: nonzero garbage */
    for (int b = 0; b < nb; b++)
        for (int h = 0; h < nh; h++)
            for (int64_t i = 0; i < lq; i++) {
                int dead = lq > 1 && (b + h + i) % 5 == 0;
                uint8_t *row = &keep[b * st[0] + h * st[1] + i * st[2]];
                for (int64_t j = 0; j < lk; j++)
                    row[j] = !dead && rng_uniform(r) < 0.4f ? 1 + (j & 3) : 0;
            }
    return keep;
}

/* Additive terms in [-2, 2), 20% -INFINITY, every sixth row all -INFINITY. */
static float *make_bias(test_rng *r, int nb, int nh, int64_t lq, int64_t lk,
                        int64_t st[3])
{
    size_t n;
    mask_strides(nb, nh, lq, lk, st, &n);
    float *bias = test_alloc(n * sizeof *bias);
    fill_sentinel(bias, n);
    for (int b = 0; b < nb; b++)
        for (int h = 0; h < nh; h++)
            for (int64_t i = 0; i < lq; i++) {
                int dead = lq > 1 && (b * 7 + h * 3 + i) % 6 == 0;
                float *row = &bias[b * st[0] + h * st[1] + i * st[2]];
                for (int64_t j = 0; j < lk; j++) {
                    float u = rng_uniform(r);
                    row[j] = dead || u < -0.6f ? -INFINITY : 2.0f * u;
                }
            }
    return bias;
}

/* One combination of mask kinds on one shape. */
static void run_masked(int combo, int shape)
{
    int lengths_kind = combo % N_LENGTHS;
    int bias_kind = combo / N_LENGTHS % N_BIAS;
    int keep_kind = combo / (N_LENGTHS * N_BIAS) % N_KEEP;
    int causal = combo / (N_LENGTHS * N_BIAS * N_KEEP);
    const int64_t lq = SHAPES[shape][0], lk = SHAPES[shape][1];
    const int want_weights = shape % 2 == 0;
    const test_layout layout = shape % 3 == 0 ? LAYOUT_PAD_BHSD : LAYOUT_BSHD;
    char what[256];
    snprintf(what, sizeof what,
             "Lq %lld Lk %lld causal %s keep %s bias %s lengths %s "
             "layout %s weights %d",
             (long long)lq, (long long)lk, CAUSAL_NAME[causal],
             KEEP_NAME[keep_kind], BIAS_NAME[bias_kind],
             lengths_kind ? "{0, Lk/2, Lk}" : "none", layout_name(layout),
             want_weights);

    test_rng r;
    rng_seed(&r, (uint64_t)(combo * 100 + shape));
    float *q = random_floats(&r, layout_floats(layout, B, lq, H, D));
    float *k = random_floats(&r, (size_t)(B * lk * HKV * D));
    float *v = random_floats(&r, (size_t)(B * lk * HKV * DV));
    size_t n_out = layout_floats(layout, B, lq, H, DV);
    float *out = test_alloc(n_out * sizeof *out);

    mha_mask mask = {.causal = (mha_causal)causal};
    int64_t st[3];
    uint8_t *keep = NULL;
    if (keep_kind != KEEP_NONE) {
        int nb = keep_kind == KEEP_LOOKAHEAD ? 1 : B;
        int nh = keep_kind == KEEP_FULL ? H : 1;
        int64_t nq = keep_kind == KEEP_PAD ? 1 : lq;
        keep = make_keep(&r, nb, nh, nq, lk, st);
        mask.keep = keep;
        mask.keep_stride_batch = st[0];
        mask.keep_stride_head = st[1];
        mask.keep_stride_query = st[2];
    }
    float *bias = NULL;
    if (bias_kind != BIAS_NONE) {
        int full = bias_kind == BIAS_FULL;
        bias = make_bias(&r, full ? B : 1, full ? H : 1, full ? lq : 1, lk,
                         st);
        mask.bias = bias;
        mask.bias_stride_batch = st[0];
        mask.bias_stride_head = st[1];
        mask.bias_stride_query = st[2];
    }
    const int32_t lengths[B] = {0, (int32_t)(lk / 2), (int32_t)lk};
    if (lengths_kind)
        mask.key_lengths = lengths;

    mha_attention_args args = {
        .q = layout_view(layout, q, B, lq, H, D),
        .k = layout_view(LAYOUT_BSHD, k, B, lk, HKV, D),
        .v = layout_view(LAYOUT_BSHD, v, B, lk, HKV, DV),
        .out = layout_view(layout, out, B, lq, H, DV),
        .mask = &mask,
    };
    check_attention(&args, n_out, want_weights, 0, what);
    free(q), free(k), free(v), free(out), free(keep), free(bias);
}

START_TEST(mask_combination)
{
    for (int shape = 0; shape < N_SHAPES; shape++)
        run_masked(_i, shape);
}
END_TEST

/* A problem whose every row is masked by one mechanism: out and weights
 * must be all zeros on every ISA (never NaN, never the mean of V). */
static void expect_all_zero(const mha_mask *mask, int64_t lq, int64_t lk,
                            const char *what)
{
    test_rng r;
    rng_seed(&r, 4242);
    float *q = random_floats(&r, (size_t)(B * lq * H * D));
    float *k = random_floats(&r, (size_t)(B * lk * HKV * D));
    float *v = random_floats(&r, (size_t)(B * lk * HKV * DV));
    size_t n_out = (size_t)(B * lq * H * DV), n_w = (size_t)(B * H * lq * lk);
    float *out = test_alloc(n_out * sizeof *out);
    float *w = test_alloc(n_w * sizeof *w);
    mha_attention_args args = {
        .q = layout_view(LAYOUT_BSHD, q, B, lq, H, D),
        .k = layout_view(LAYOUT_BSHD, k, B, lk, HKV, D),
        .v = layout_view(LAYOUT_BSHD, v, B, lk, HKV, DV),
        .out = layout_view(LAYOUT_BSHD, out, B, lq, H, DV),
        .mask = mask,
        .weights = w,
    };
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        mha_engine *e = make_engine(isas[t], 0);
        fill_sentinel(out, n_out);
        fill_sentinel(w, n_w);
        mha_status st = mha_attention(e, &args);
        ck_assert_msg(st == MHA_OK, "%s [%s]: %s (%s)", what,
                      mha_isa_name(isas[t]), mha_status_string(st),
                      mha_last_error());
        for (size_t i = 0; i < n_out; i++)
            REQUIRE(out[i] == 0.0f, "%s [%s]: out[%zu] = %g", what,
                    mha_isa_name(isas[t]), i, (double)out[i]);
        for (size_t i = 0; i < n_w; i++)
            REQUIRE(w[i] == 0.0f, "%s [%s]: weights[%zu] = %g", what,
                    mha_isa_name(isas[t]), i, (double)w[i]);
        mha_engine_destroy(e);
    }
    free(q), free(k), free(v), free(out), free(w);
}

START_TEST(every_row_masked_gives_zeros)
{
    const int64_t lq = 9, lk = 70;
    const int32_t zero_lengths[B] = {0, 0, 0};
    mha_mask m = {.key_lengths = zero_lengths};
    expect_all_zero(&m, lq, lk, "key lengths all 0");

    uint8_t *none = test_alloc((size_t)lk);
    memset(none, 0, (size_t)lk);
    mha_mask keep = {.keep = none};
    expect_all_zero(&keep, lq, lk, "keep all 0, broadcast");

    float *ninf = test_alloc((size_t)lk * sizeof *ninf);
    for (int64_t j = 0; j < lk; j++)
        ninf[j] = -INFINITY;
    mha_mask bias = {.bias = ninf};
    expect_all_zero(&bias, lq, lk, "bias all -inf, broadcast");

    /* Bottom-right with Lq > Lk hides every key from the first Lq - Lk
     * rows, key lengths 1 leave the others key 0 alone, and the keep-mask
     * hides key 0: three mechanisms that only together empty every row. */
    uint8_t *keep0 = test_alloc((size_t)lk);
    memset(keep0, 1, (size_t)lk);
    keep0[0] = 0;
    const int32_t one[B] = {1, 1, 1};
    mha_mask combo = {.causal = MHA_CAUSAL_BOTTOM_RIGHT, .keep = keep0,
                      .key_lengths = one};
    expect_all_zero(&combo, 80, lk, "bottom-right + lengths 1 + keep hides 0");
    free(none), free(ninf), free(keep0);
}
END_TEST

/* One causal call against the oracle on every table and thread count:
 * h query heads of layout ql over hkv kv heads ([B, L, H, D]), d wide,
 * with the weights output or not. */
static void check_causal(mha_causal c, int64_t lq, int64_t lk, int64_t h,
                         int64_t hkv, int64_t d, test_layout ql, int weights,
                         uint64_t seed)
{
    test_rng r;
    rng_seed(&r, seed);
    float *q = random_floats(&r, (size_t)(lq * h * d));
    float *k = random_floats(&r, (size_t)(lk * hkv * d));
    float *v = random_floats(&r, (size_t)(lk * hkv * d));
    size_t n_out = (size_t)(lq * h * d);
    float *out = test_alloc(n_out * sizeof *out);
    mha_mask mask = {.causal = c};
    mha_attention_args args = {
        .q = layout_view(ql, q, 1, lq, h, d),
        .k = layout_view(LAYOUT_BSHD, k, 1, lk, hkv, d),
        .v = layout_view(LAYOUT_BSHD, v, 1, lk, hkv, d),
        .out = layout_view(LAYOUT_BSHD, out, 1, lq, h, d),
        .mask = &mask,
    };
    char what[96];
    snprintf(what, sizeof what, "causal %s Lq %lld Lk %lld", CAUSAL_NAME[c],
             (long long)lq, (long long)lk);
    check_attention(&args, n_out, weights, 0, what);
    free(q), free(k), free(v), free(out);
}

/* Top-left with Lq > Lk and bottom-right with Lq < Lk see every key from
 * some row on; bottom-right with Lq > Lk leaves the first Lq - Lk rows
 * empty. check_attention verifies those rows are exact zeros. */
START_TEST(causal_alignment_edges)
{
    static const int64_t shapes[][2] = {{70, 3}, {3, 70}, {129, 128},
                                        {128, 129}, {1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int c = MHA_CAUSAL_TOP_LEFT; c <= MHA_CAUSAL_BOTTOM_RIGHT; c++)
            check_causal((mha_causal)c, shapes[s][0], shapes[s][1], 8, 1, 32,
                         LAYOUT_BHSD, 1, (uint64_t)(s * 10 + (size_t)c));
}
END_TEST

/* Rows of one block whose keys end in different key blocks: past 1024
 * queries an avx512 row block (96 rows) crossing a key block's start (512
 * keys) has its first causal sub-block (48 rows) see none of the last key
 * block, and those rows are finished by normalize while the others' P·V
 * writes them (engine/prefill.c, mha_prefill_finish). Six heads, so the
 * plan has enough row blocks not to split the keys (plan.c), no weights
 * (their rows are written whole, not finished so), and d = 4, so the
 * double oracle stays cheap. */
START_TEST(causal_rows_past_a_key_block)
{
    for (int c = MHA_CAUSAL_TOP_LEFT; c <= MHA_CAUSAL_BOTTOM_RIGHT; c++)
        check_causal((mha_causal)c, c == MHA_CAUSAL_TOP_LEFT ? 1100 : 1063,
                     1100, 6, 6, 4, LAYOUT_BSHD, 0, 90 + (uint64_t)c);
}
END_TEST

/* NaN policy (found by the fuzzer): a NaN in q reaches every score of its
 * row, so the row's output is NaN — not the zeros of a fully masked row,
 * which a max() that skips NaN would suggest. Rows without NaN stay finite,
 * and a fully masked row stays exactly zero next to it. */
START_TEST(nan_in_every_score_propagates)
{
    /* q: row 0 NaN, row 1 finite, row 2 finite but fully masked. */
    float q[6] = {NAN, 1.0f, 0.5f, -0.25f, 0.3f, 0.2f};
    float k[4] = {1, 2, 3, 4}, v[2] = {5, 6}, out[3];
    uint8_t keep[6] = {1, 1, 1, 1, 0, 0};
    mha_mask mask = {.keep = keep, .keep_stride_query = 2};
    mha_isa isas[TEST_MAX_ISAS];
    int n = available_isas(isas);
    for (int i = 0; i < n; i++) {
        mha_engine *e = make_engine(isas[i], 1);
        mha_attention_args a = {
            .q = mha_tensor_bshd(q, 1, 3, 1, 2),
            .k = mha_tensor_bshd(k, 1, 2, 1, 2),
            .v = mha_tensor_bshd(v, 1, 2, 1, 1),
            .out = mha_tensor_bshd(out, 1, 3, 1, 1),
            .mask = &mask,
        };
        ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
        ck_assert_msg(isnan(out[0]), "%s: NaN row gave %g",
                      mha_isa_name(isas[i]), (double)out[0]);
        ck_assert_msg(out[1] > 5.0f && out[1] < 6.0f, "%s: finite row %g",
                      mha_isa_name(isas[i]), (double)out[1]);
        ck_assert_msg(out[2] == 0.0f, "%s: masked row %g",
                      mha_isa_name(isas[i]), (double)out[2]);
        mha_engine_destroy(e);
    }
}
END_TEST

/* Huge scaled scores (scale 3e19): the row maximum must cancel exactly, so
 * the single dominant key gets probability 1, never exp(+-huge) = inf/NaN. */
START_TEST(huge_scores_stay_finite)
{
    mha_isa isas[TEST_MAX_ISAS];
    int n = available_isas(isas);
    for (int i = 0; i < n; i++) {
        mha_engine *e = make_engine(isas[i], 1);
        for (int t = 1; t <= 20; t++) {
            float q[1] = {0.1f * (float)t + 0.013f}, k[2] = {0.7f, -0.3f};
            float v[2] = {1, 2}, out[1];
            mha_attention_args a = {
                .q = mha_tensor_bshd(q, 1, 1, 1, 1),
                .k = mha_tensor_bshd(k, 1, 2, 1, 1),
                .v = mha_tensor_bshd(v, 1, 2, 1, 1),
                .out = mha_tensor_bshd(out, 1, 1, 1, 1),
                .scale = 3.0e19f,
            };
            ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
            ck_assert_msg(out[0] == 1.0f, "%s: q=%g gave %g, want v[0] = 1",
                          mha_isa_name(isas[i]), (double)q[0],
                          (double)out[0]);
        }
        mha_engine_destroy(e);
    }
}
END_TEST

Suite *suite_masks(void)
{
    Suite *s = suite_create("masks");
    TCase *tc = tcase_create("masks");
    tcase_add_loop_test(tc, mask_combination, 0, N_COMBOS);
    tcase_add_test(tc, every_row_masked_gives_zeros);
    tcase_add_test(tc, causal_alignment_edges);
    tcase_add_test(tc, causal_rows_past_a_key_block);
    tcase_add_test(tc, nan_in_every_score_propagates);
    tcase_add_test(tc, huge_scores_stay_finite);
    suite_add_tcase(s, tc);
    return s;
}
