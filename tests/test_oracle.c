/* The oracle against cases small enough to compute by hand. Scores are
 * chosen as 0 and log(3) so the softmax weights are 1/4 and 3/4. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "oracle.h"
#include "util.h"

#define LN3 1.0986122886681098

static mha_attention_args packed_args(float *q, float *k, float *v,
                                      int64_t B, int64_t Lq, int64_t Lk,
                                      int64_t H, int64_t Hkv, int64_t d,
                                      int64_t dv)
{
    mha_attention_args a = {
        .q = layout_view(LAYOUT_BSHD, q, B, Lq, H, d),
        .k = layout_view(LAYOUT_BSHD, k, B, Lk, Hkv, d),
        .v = layout_view(LAYOUT_BSHD, v, B, Lk, Hkv, dv),
        .scale = 1.0f,
    };
    return a;
}

static void expect_near(const double *got, const double *want, size_t n,
                        const char *what)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= TOL_HAND,
                      "%s[%zu] = %.9g, want %.9g", what, i, got[i], want[i]);
}

START_TEST(two_keys_known_softmax)
{
    float q[1] = {1.0f}, k[2] = {0.0f, (float)LN3}, v[2] = {4.0f, 8.0f};
    mha_attention_args a = packed_args(q, k, v, 1, 1, 2, 1, 1, 1, 1);
    double out[1], w[2];
    oracle_attention(&a, out, w);
    expect_near(w, (double[]){0.25, 0.75}, 2, "weights");
    expect_near(out, (double[]){7.0}, 1, "out");
}
END_TEST

START_TEST(default_scale_is_inverse_sqrt_d)
{
    /* d = 4: scale 0 means 1/2, so a dot product of 2 log(3) scores log(3). */
    float h = (float)(LN3 / 2.0);
    float q[4] = {1, 1, 1, 1}, k[8] = {0, 0, 0, 0, h, h, h, h};
    float v[2] = {4.0f, 8.0f};
    mha_attention_args a = packed_args(q, k, v, 1, 1, 2, 1, 1, 4, 1);
    a.scale = 0.0f;
    double out[1], w[2];
    oracle_attention(&a, out, w);
    expect_near(w, (double[]){0.25, 0.75}, 2, "weights");
    expect_near(out, (double[]){7.0}, 1, "out");
}
END_TEST

/* Zero queries make every visible key equally likely, so each output is the
 * mean of the visible values 1, 2, 4. */
START_TEST(causal_alignments)
{
    float q[3] = {0}, k[3] = {0}, v[3] = {1.0f, 2.0f, 4.0f};
    mha_mask m = {.causal = MHA_CAUSAL_TOP_LEFT};
    mha_attention_args a = packed_args(q, k, v, 1, 2, 3, 1, 1, 1, 1);
    a.mask = &m;
    double out[3], w[9];

    oracle_attention(&a, out, w); /* Lq 2 < Lk 3, top-left */
    expect_near(w, (double[]){1, 0, 0, 0.5, 0.5, 0}, 6, "tl weights");
    expect_near(out, (double[]){1.0, 1.5}, 2, "tl out");

    m.causal = MHA_CAUSAL_BOTTOM_RIGHT; /* query i sees j <= i + 1 */
    oracle_attention(&a, out, w);
    expect_near(w, (double[]){0.5, 0.5, 0, 1 / 3., 1 / 3., 1 / 3.}, 6,
                "br weights");
    expect_near(out, (double[]){1.5, 7 / 3.}, 2, "br out");

    /* Lq 3 > Lk 2, bottom-right: query i sees j <= i - 1, so row 0 sees
     * nothing and must be zero. */
    a = packed_args(q, k, v, 1, 3, 2, 1, 1, 1, 1);
    a.mask = &m;
    oracle_attention(&a, out, w);
    expect_near(w, (double[]){0, 0, 1, 0, 0.5, 0.5}, 6, "br3 weights");
    expect_near(out, (double[]){0.0, 1.0, 1.5}, 3, "br3 out");

    m.causal = MHA_CAUSAL_TOP_LEFT; /* Lq > Lk, top-left: rows 1, 2 see all */
    oracle_attention(&a, out, w);
    expect_near(w, (double[]){1, 0, 0.5, 0.5, 0.5, 0.5}, 6, "tl3 weights");
}
END_TEST

START_TEST(keep_mask_broadcast_and_key_lengths)
{
    /* B 2, H 2, Lq 1, Lk 3, zero queries. keep [B,1,1,Lk]. */
    float q[4] = {0}, k[6] = {0};
    float v[6] = {1.0f, 2.0f, 4.0f, 10.0f, 20.0f, 40.0f};
    const uint8_t keep[6] = {1, 0, 1, 1, 1, 1};
    const int32_t lengths[2] = {3, 1};
    mha_mask m = {.keep = keep, .keep_stride_batch = 3,
                  .key_lengths = lengths};
    mha_attention_args a = packed_args(q, k, v, 2, 1, 3, 2, 1, 1, 1);
    a.mask = &m;
    double out[4], w[12];
    oracle_attention(&a, out, w);
    expect_near(w, (double[]){0.5, 0, 0.5, 0.5, 0, 0.5, 1, 0, 0, 1, 0, 0},
                12, "weights");
    expect_near(out, (double[]){2.5, 2.5, 10.0, 10.0}, 4, "out");
}
END_TEST

START_TEST(additive_bias_with_minus_infinity)
{
    float q[2] = {0}, k[3] = {0}, v[3] = {4.0f, 8.0f, 1000.0f};
    /* One [Lk] row broadcast over batch, head and query. */
    const float bias[3] = {0.0f, (float)LN3, -INFINITY};
    mha_mask m = {.bias = bias};
    mha_attention_args a = packed_args(q, k, v, 1, 2, 3, 1, 1, 1, 1);
    a.mask = &m;
    double out[2], w[6];
    oracle_attention(&a, out, w);
    expect_near(w, (double[]){0.25, 0.75, 0, 0.25, 0.75, 0}, 6, "weights");
    expect_near(out, (double[]){7.0, 7.0}, 2, "out");
}
END_TEST

START_TEST(fully_masked_rows_are_zero)
{
    float q[2] = {0.5f, -0.25f}, k[4] = {1, 2, 3, 4}, v[2] = {5.0f, 6.0f};
    const int32_t lengths[1] = {0};
    mha_mask m = {.key_lengths = lengths};
    mha_attention_args a = packed_args(q, k, v, 1, 1, 2, 1, 1, 2, 1);
    a.mask = &m;
    double out[1] = {99.0}, w[2] = {99.0, 99.0};
    oracle_attention(&a, out, w);
    expect_near(w, (double[]){0, 0}, 2, "lengths weights");
    expect_near(out, (double[]){0}, 1, "lengths out");

    const float bias[2] = {-INFINITY, -INFINITY};
    mha_mask mb = {.bias = bias};
    a.mask = &mb;
    out[0] = 99.0;
    oracle_attention(&a, out, w);
    ck_assert(out[0] == 0.0 && w[0] == 0.0 && w[1] == 0.0);
}
END_TEST

START_TEST(gqa_head_reads_its_group)
{
    /* H 4 over Hkv 2: heads 0, 1 read kv head 0; heads 2, 3 kv head 1. */
    float q[4] = {0}, k[4] = {0};
    float v[4] = {1.0f, 10.0f, 3.0f, 20.0f}; /* [Lk 2][Hkv 2] */
    mha_attention_args a = packed_args(q, k, v, 1, 1, 2, 4, 2, 1, 1);
    double out[4];
    oracle_attention(&a, out, NULL);
    expect_near(out, (double[]){2.0, 2.0, 15.0, 15.0}, 4, "out");
}
END_TEST

START_TEST(strided_views_match_packed)
{
    const int64_t B = 2, Lq = 3, Lk = 5, H = 2, Hkv = 1, d = 4, dv = 3;
    test_rng r;
    rng_seed(&r, 11);
    float *q = random_floats(&r, (size_t)(B * Lq * H * d));
    float *k = random_floats(&r, (size_t)(B * Lk * Hkv * d));
    float *v = random_floats(&r, (size_t)(B * Lk * Hkv * dv));
    mha_attention_args a = packed_args(q, k, v, B, Lq, Lk, H, Hkv, d, dv);
    size_t no = (size_t)(B * Lq * H * dv), nw = (size_t)(B * H * Lq * Lk);
    double *out1 = test_alloc(no * sizeof(double));
    double *w1 = test_alloc(nw * sizeof(double));
    oracle_attention(&a, out1, w1);

    /* The same numbers scattered into padded head-major views. */
    const mha_tensor *src[3] = {&a.q, &a.k, &a.v};
    mha_tensor views[3];
    float *bufs[3];
    for (int t = 0; t < 3; t++) {
        const mha_tensor *s = src[t];
        size_t n = layout_floats(LAYOUT_PAD_BHSD, s->batch, s->seq, s->heads,
                                 s->dim);
        bufs[t] = test_alloc(n * sizeof(float));
        fill_sentinel(bufs[t], n);
        views[t] = layout_view(LAYOUT_PAD_BHSD, bufs[t], s->batch, s->seq,
                               s->heads, s->dim);
        const float *from = s->data;
        float *to = bufs[t];
        size_t o = 0;
        for (int64_t b = 0; b < s->batch; b++)
            for (int64_t i = 0; i < s->seq; i++)
                for (int64_t h = 0; h < s->heads; h++)
                    for (int64_t c = 0; c < s->dim; c++)
                        to[b * views[t].stride_batch +
                           i * views[t].stride_seq +
                           h * views[t].stride_head + c] = from[o++];
    }
    mha_attention_args b = a;
    b.q = views[0];
    b.k = views[1];
    b.v = views[2];
    double *out2 = test_alloc(no * sizeof(double));
    double *w2 = test_alloc(nw * sizeof(double));
    oracle_attention(&b, out2, w2);
    ck_assert(memcmp(out1, out2, no * sizeof(double)) == 0);
    ck_assert(memcmp(w1, w2, nw * sizeof(double)) == 0);
    for (size_t i = 0; i < nw; i += (size_t)Lk) {
        double sum = 0.0;
        for (int64_t j = 0; j < Lk; j++)
            sum += w1[i + (size_t)j];
        ck_assert_double_eq_tol(sum, 1.0, 1e-12);
    }
    free(q), free(k), free(v), free(out1), free(w1), free(out2), free(w2);
    for (int t = 0; t < 3; t++)
        free(bufs[t]);
}
END_TEST

START_TEST(layer_single_head_by_hand)
{
    /* E 1, H 1: Wq 1, Wk 1, Wv 2, bv 1; scores 0 and log 3; V = 3, 7;
     * attention 0.25*3 + 0.75*7 = 6; Wo 1, bo 1 gives 7. */
    const float in_w[3] = {1.0f, 1.0f, 2.0f}, in_b[3] = {0.0f, 0.0f, 1.0f};
    const float out_w[1] = {1.0f}, out_b[1] = {1.0f};
    mha_layer_desc desc = {.embed_dim = 1, .num_heads = 1,
                           .in_proj_weight = in_w, .in_proj_bias = in_b,
                           .out_proj_weight = out_w, .out_proj_bias = out_b};
    const float query[1] = {1.0f}, key[2] = {0.0f, (float)LN3};
    const float value[2] = {1.0f, 3.0f};
    double out[1], w[2];
    oracle_layer(&desc, query, key, value, 1, 1, 2, NULL, out, w);
    expect_near(w, (double[]){0.25, 0.75}, 2, "weights");
    expect_near(out, (double[]){7.0}, 1, "out");
}
END_TEST

START_TEST(layer_heads_use_their_own_slice)
{
    /* E 2, H 2 (d 1), identity projections: head 0 sees scores 0, log 3;
     * head 1 sees 0, 0. */
    const float eye[4] = {1, 0, 0, 1};
    mha_layer_desc desc = {.embed_dim = 2, .num_heads = 2,
                           .q_proj_weight = eye, .k_proj_weight = eye,
                           .v_proj_weight = eye, .out_proj_weight = eye};
    const float query[2] = {1.0f, 0.0f};
    const float key[4] = {0.0f, 0.0f, (float)LN3, 0.0f};
    const float value[4] = {4.0f, 10.0f, 8.0f, 20.0f};
    double out[2], w[4];
    oracle_layer(&desc, query, key, value, 1, 1, 2, NULL, out, w);
    expect_near(w, (double[]){0.25, 0.75, 0.5, 0.5}, 4, "weights");
    expect_near(out, (double[]){7.0, 15.0}, 2, "out");
}
END_TEST

START_TEST(layer_kdim_vdim_by_hand)
{
    /* E 2, H 2, kdim 3, vdim 1, one key: every weight is 1, so the output
     * is Wo (Wv value + bv) + bo = Wo [11, 14] + [0, 0.5]. */
    const float wq[4] = {0.3f, -0.2f, 0.1f, 0.7f};
    const float wk[6] = {0.5f, 0.25f, -1.0f, 2.0f, 0.0f, 1.5f};
    const float wv[2] = {2.0f, 3.0f};
    const float in_b[6] = {0.1f, 0.2f, 0.3f, 0.4f, 1.0f, -1.0f};
    const float wo[4] = {1.0f, 0.0f, 1.0f, 1.0f}, bo[2] = {0.0f, 0.5f};
    mha_layer_desc desc = {.embed_dim = 2, .num_heads = 2, .kdim = 3,
                           .vdim = 1, .q_proj_weight = wq,
                           .k_proj_weight = wk, .v_proj_weight = wv,
                           .in_proj_bias = in_b, .out_proj_weight = wo,
                           .out_proj_bias = bo};
    const float query[2] = {1.0f, -1.0f}, key[3] = {0.5f, 0.5f, 0.5f};
    const float value[1] = {5.0f};
    double out[2], w[2];
    oracle_layer(&desc, query, key, value, 1, 1, 1, NULL, out, w);
    expect_near(w, (double[]){1.0, 1.0}, 2, "weights");
    expect_near(out, (double[]){11.0, 25.5}, 2, "out");
}
END_TEST

START_TEST(layer_packed_equals_separate)
{
    const int64_t E = 8, H = 2, B = 2, Lq = 3, Lk = 4;
    test_rng r;
    rng_seed(&r, 5);
    float *in_w = random_floats(&r, (size_t)(3 * E * E));
    float *in_b = random_floats(&r, (size_t)(3 * E));
    float *wo = random_floats(&r, (size_t)(E * E));
    float *query = random_floats(&r, (size_t)(B * Lq * E));
    float *kv = random_floats(&r, (size_t)(B * Lk * E));
    mha_layer_desc packed = {.embed_dim = E, .num_heads = H,
                             .in_proj_weight = in_w, .in_proj_bias = in_b,
                             .out_proj_weight = wo};
    mha_layer_desc separate = packed;
    separate.in_proj_weight = NULL;
    separate.q_proj_weight = in_w;
    separate.k_proj_weight = in_w + E * E;
    separate.v_proj_weight = in_w + 2 * E * E;
    double o1[48], o2[48];
    oracle_layer(&packed, query, kv, kv, B, Lq, Lk, NULL, o1, NULL);
    oracle_layer(&separate, query, kv, kv, B, Lq, Lk, NULL, o2, NULL);
    ck_assert(memcmp(o1, o2, sizeof o1) == 0);
    free(in_w), free(in_b), free(wo), free(query), free(kv);
}
END_TEST

Suite *suite_oracle(void)
{
    Suite *s = suite_create("oracle");
    TCase *tc = tcase_create("hand");
    tcase_add_test(tc, two_keys_known_softmax);
    tcase_add_test(tc, default_scale_is_inverse_sqrt_d);
    tcase_add_test(tc, causal_alignments);
    tcase_add_test(tc, keep_mask_broadcast_and_key_lengths);
    tcase_add_test(tc, additive_bias_with_minus_infinity);
    tcase_add_test(tc, fully_masked_rows_are_zero);
    tcase_add_test(tc, gqa_head_reads_its_group);
    tcase_add_test(tc, strided_views_match_packed);
    tcase_add_test(tc, layer_single_head_by_hand);
    tcase_add_test(tc, layer_heads_use_their_own_slice);
    tcase_add_test(tc, layer_kdim_vdim_by_hand);
    tcase_add_test(tc, layer_packed_equals_separate);
    suite_add_tcase(s, tc);
    return s;
}
