/*
 * The layer (nn.MultiheadAttention, batch_first=True) against the oracle on
 * every ISA: self- and cross-attention, kdim/vdim != E, packed and separate
 * input projections, with and without biases, masks, and the worked
 * examples the project grew from; and the same cases as bf16 layers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oracle.h"
#include "test_hooks.h"
#include "util.h"

typedef struct layer_case {
    const char *name;
    int64_t e, h, kdim, vdim; /* kdim, vdim: 0 means E */
    int64_t b, lq, lk;
    int self;     /* query, key and value are one array (lq == lk) */
    int packed;   /* in_proj_weight rather than q/k/v_proj_weight */
    int in_bias, out_bias;
    int weights;  /* ask for the weights output */
    int mask;     /* 0 none, 1 causal top-left + [B,1,1,Lk] keep, 2 bottom-
                     right + key lengths */
} layer_case;

static const layer_case CASES[] = {
    {"self packed biases", 64, 4, 0, 0, 2, 17, 17, 1, 1, 1, 1, 1, 0},
    {"self separate no biases", 48, 3, 0, 0, 3, 7, 7, 1, 0, 0, 0, 0, 0},
    {"cross packed in-bias only", 32, 8, 0, 0, 2, 5, 65, 0, 1, 1, 0, 1, 0},
    {"cross kdim 24 vdim 40", 64, 2, 24, 40, 3, 9, 33, 0, 0, 1, 1, 1, 0},
    {"cross kdim 7 vdim 130 d 1", 16, 16, 7, 130, 1, 65, 3, 0, 0, 0, 1, 0, 2},
    {"self causal + padding", 40, 5, 0, 0, 2, 70, 70, 1, 1, 1, 1, 1, 1},
    {"cross kdim = vdim = E given", 24, 3, 24, 24, 2, 3, 8, 0, 0, 1, 0, 1, 2},
    {"single token", 8, 1, 0, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0},
    {"cross Lq > Lk bottom-right", 32, 4, 20, 0, 2, 40, 9, 0, 0, 1, 1, 1, 2},
    /* The worked examples: B 2, L 5 and 10, E 512, H 8 self-attention. */
    {"worked B2 L5 E512 H8", 512, 8, 0, 0, 2, 5, 5, 1, 1, 1, 1, 1, 0},
    {"worked B2 L10 E512 H8", 512, 8, 0, 0, 2, 10, 10, 1, 1, 1, 1, 1, 0},
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

/* A case's input widths and element counts (inputs, out, weights). */
typedef struct {
    int64_t e, kdim, vdim;
    size_t nq, nk, nv, n_out, n_w;
} case_sizes;

static case_sizes sizes_of(const layer_case *c)
{
    case_sizes z;
    z.e = c->e;
    z.kdim = c->kdim ? c->kdim : c->e;
    z.vdim = c->vdim ? c->vdim : c->e;
    z.nq = z.n_out = (size_t)(c->b * c->lq * c->e);
    z.nk = (size_t)(c->b * c->lk * z.kdim);
    z.nv = (size_t)(c->b * c->lk * z.vdim);
    z.n_w = (size_t)(c->b * c->h * c->lq * c->lk);
    return z;
}

/* nn.Linear-like weights: uniform in [-1/sqrt(in), 1/sqrt(in)). */
static float *linear_weights(test_rng *r, int64_t out, int64_t in)
{
    float *w = random_floats(r, (size_t)(out * in));
    float s = 1.0f / sqrtf((float)in);
    for (int64_t i = 0; i < out * in; i++)
        w[i] *= s;
    return w;
}

typedef struct layer_problem {
    mha_layer_desc desc;
    float *w[6]; /* owned weight arrays (some NULL) */
    float *query, *key, *value;
    uint8_t *keep;
    int32_t *lengths;
    mha_mask mask;
} layer_problem;

static void make_problem(const layer_case *c, uint64_t seed,
                         layer_problem *p)
{
    test_rng r;
    rng_seed(&r, seed);
    memset(p, 0, sizeof *p);
    const int64_t E = c->e;
    const int64_t kdim = c->kdim ? c->kdim : E, vdim = c->vdim ? c->vdim : E;
    p->desc = (mha_layer_desc){.embed_dim = E, .num_heads = c->h,
                               .kdim = c->kdim, .vdim = c->vdim};
    if (c->packed) {
        p->w[0] = linear_weights(&r, 3 * E, E);
        p->desc.in_proj_weight = p->w[0];
    } else {
        p->w[0] = linear_weights(&r, E, E);
        p->w[1] = linear_weights(&r, E, kdim);
        p->w[2] = linear_weights(&r, E, vdim);
        p->desc.q_proj_weight = p->w[0];
        p->desc.k_proj_weight = p->w[1];
        p->desc.v_proj_weight = p->w[2];
    }
    p->w[3] = linear_weights(&r, E, E);
    p->desc.out_proj_weight = p->w[3];
    if (c->in_bias) {
        p->w[4] = random_floats(&r, (size_t)(3 * E));
        p->desc.in_proj_bias = p->w[4];
    }
    if (c->out_bias) {
        p->w[5] = random_floats(&r, (size_t)E);
        p->desc.out_proj_bias = p->w[5];
    }
    p->query = random_floats(&r, (size_t)(c->b * c->lq * E));
    if (c->self) {
        p->key = p->value = p->query;
    } else {
        p->key = random_floats(&r, (size_t)(c->b * c->lk * kdim));
        p->value = random_floats(&r, (size_t)(c->b * c->lk * vdim));
    }
    if (c->mask == 1) {
        p->keep = test_alloc((size_t)(c->b * c->lk));
        for (int64_t i = 0; i < c->b * c->lk; i++)
            p->keep[i] = rng_uniform(&r) < 0.5f;
        p->mask = (mha_mask){.causal = MHA_CAUSAL_TOP_LEFT, .keep = p->keep,
                             .keep_stride_batch = c->lk};
    } else if (c->mask == 2) {
        p->lengths = test_alloc((size_t)c->b * sizeof *p->lengths);
        for (int64_t b = 0; b < c->b; b++)
            p->lengths[b] = (int32_t)(c->lk - b * c->lk / 2);
        p->mask = (mha_mask){.causal = MHA_CAUSAL_BOTTOM_RIGHT,
                             .key_lengths = p->lengths};
    }
}

static void free_problem(layer_problem *p)
{
    for (int i = 0; i < 6; i++)
        free(p->w[i]);
    if (p->key != p->query) {
        free(p->key);
        free(p->value);
    }
    free(p->query);
    free(p->keep);
    free(p->lengths);
}

/* Scribble over the caller's weights: the layer must have copied them. */
static void scribble(layer_problem *p, const layer_case *c)
{
    const int64_t E = c->e;
    const int64_t kdim = c->kdim ? c->kdim : E, vdim = c->vdim ? c->vdim : E;
    size_t n[6] = {(size_t)((c->packed ? 3 * E : E) * E),
                   c->packed ? 0 : (size_t)(E * kdim),
                   c->packed ? 0 : (size_t)(E * vdim), (size_t)(E * E),
                   c->in_bias ? (size_t)(3 * E) : 0,
                   c->out_bias ? (size_t)E : 0};
    for (int i = 0; i < 6; i++)
        if (p->w[i])
            fill_sentinel(p->w[i], n[i]);
}

/* The layer of case c against the oracle on every ISA. */
static void run_layer_case(const layer_case *c, uint64_t seed)
{
    layer_problem p;
    make_problem(c, seed, &p);
    const mha_mask *mask = c->mask ? &p.mask : NULL;
    const size_t n_out = (size_t)(c->b * c->lq * c->e);
    const size_t n_w = (size_t)(c->b * c->h * c->lq * c->lk);
    double *want = test_alloc(n_out * sizeof *want);
    double *want_w = test_alloc(n_w * sizeof *want_w);
    oracle_layer(&p.desc, p.query, p.key, p.value, c->b, c->lq, c->lk, mask,
                 want, want_w);

    /* out gets a guard zone: output shape = input shape, nothing beyond. */
    const size_t guard = 37;
    float *out = test_alloc((n_out + guard) * sizeof *out);
    float *w = c->weights ? test_alloc((n_w + guard) * sizeof *w) : NULL;
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    mha_layer *layers[TEST_MAX_ISAS];
    mha_engine *engines[TEST_MAX_ISAS];
    for (int t = 0; t < n_isa; t++) {
        engines[t] = make_engine(isas[t], 0);
        mha_status st = mha_layer_create(engines[t], &p.desc, &layers[t]);
        ck_assert_msg(st == MHA_OK, "%s [%s]: layer_create: %s (%s)",
                      c->name, mha_isa_name(isas[t]), mha_status_string(st),
                      mha_last_error());
    }
    scribble(&p, c);
    for (int t = 0; t < n_isa; t++) {
        const char *isa = mha_isa_name(isas[t]);
        fill_sentinel(out, n_out + guard);
        if (w)
            fill_sentinel(w, n_w + guard);
        mha_status st = mha_layer_forward(layers[t], p.query, p.key, p.value,
                                          c->b, c->lq, c->lk, mask, out, w);
        ck_assert_msg(st == MHA_OK, "%s [%s]: forward: %s (%s)", c->name, isa,
                      mha_status_string(st), mha_last_error());
        size_t worst;
        double r = tol_ratio(out, want, n_out, TOL_LAYER_ABS, TOL_LAYER_REL,
                             &worst);
        ck_assert_msg(r <= 1.0,
                      "%s [%s]: out[b %zu][i %zu][e %zu] = %.9g, want %.9g "
                      "(ratio %.3g)",
                      c->name, isa, worst / (size_t)(c->lq * c->e),
                      worst / (size_t)c->e % (size_t)c->lq,
                      worst % (size_t)c->e, (double)out[worst], want[worst],
                      r);
        ck_assert_msg(count_changed(out + n_out, guard) == 0,
                      "%s [%s]: wrote past out", c->name, isa);
        if (w) {
            check_weights(w, want_w, c->b * c->h * c->lq, c->lk,
                          TOL_LAYER_ABS, TOL_LAYER_REL, c->name, isa);
            ck_assert_msg(count_changed(w + n_w, guard) == 0,
                          "%s [%s]: wrote past weights", c->name, isa);
        }
        mha_layer_destroy(layers[t]);
        mha_engine_destroy(engines[t]);
    }
    free(want), free(want_w), free(out), free(w);
    free_problem(&p);
}

START_TEST(layer_case_vs_oracle)
{
    run_layer_case(&CASES[_i], 500 + (uint64_t)_i);
}
END_TEST

/* E 128, H 8, B 3, L 2 with the padding keep-mask [[0,1],[0,1],[1,0]] as
 * [B,1,1,Lk], broadcast over heads and queries: each batch sees exactly
 * one key, so every weight is 0 or 1 and every query of a batch gets the
 * same output. */
START_TEST(worked_padding_mask)
{
    enum { E = 128, H = 8, B = 3, L = 2 };
    const uint8_t keep[B * L] = {0, 1, 0, 1, 1, 0};
    const layer_case c = {"worked padding", E, H, 0, 0, B, L, L, 1, 1, 1, 1,
                          1, 0};
    layer_problem p;
    make_problem(&c, 77, &p);
    p.mask = (mha_mask){.keep = keep, .keep_stride_batch = L};
    double want[B * L * E], want_w[B * H * L * L];
    oracle_layer(&p.desc, p.query, p.key, p.value, B, L, L, &p.mask, want,
                 want_w);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        const char *isa = mha_isa_name(isas[t]);
        mha_engine *e = make_engine(isas[t], 0);
        mha_layer *layer;
        ck_assert_int_eq(mha_layer_create(e, &p.desc, &layer), MHA_OK);
        float out[B * L * E], w[B * H * L * L];
        ck_assert_int_eq(mha_layer_forward(layer, p.query, p.query, p.query,
                                           B, L, L, &p.mask, out, w),
                         MHA_OK);
        ck_assert_msg(tol_ratio(out, want, B * L * E, TOL_LAYER_ABS,
                                TOL_LAYER_REL, NULL) <= 1.0,
                      "[%s] out differs from the oracle", isa);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < L; i++)
                    for (int j = 0; j < L; j++) {
                        float got = w[((b * H + h) * L + i) * L + j];
                        float expect = keep[b * L + j] ? 1.0f : 0.0f;
                        ck_assert_msg(fabsf(got - expect) <= TOL_LAYER_ABS,
                                      "[%s] weights b %d h %d i %d j %d = %g",
                                      isa, b, h, i, j, (double)got);
                    }
        for (int b = 0; b < B; b++)
            for (int x = 0; x < E; x++)
                ck_assert_msg(out[(b * L) * E + x] == out[(b * L + 1) * E + x],
                              "[%s] batch %d: both queries see one key, "
                              "outputs differ at %d", isa, b, x);
        mha_layer_destroy(layer);
        mha_engine_destroy(e);
    }
    free_problem(&p);
}
END_TEST

/* The full layer's weights of shard (first, count), as a caller who
 * slices a state dict by hand would give them (shard_sliced). */
static void slice_desc(const layer_problem *p, const layer_case *c,
                       int64_t first, int64_t count, float *sl[6],
                       mha_layer_desc *d)
{
    const int64_t E = c->e, dh = E / c->h, w = count * dh, r0 = first * dh;
    const int64_t kdim = c->kdim ? c->kdim : E, vdim = c->vdim ? c->vdim : E;
    const int64_t in[3] = {E, kdim, vdim};
    *d = p->desc;
    d->shard_first = first, d->shard_heads = count, d->shard_sliced = 1;
    memset(sl, 0, 6 * sizeof *sl);
    if (c->packed) {
        sl[0] = test_alloc((size_t)(3 * w * E) * sizeof(float));
        for (int i = 0; i < 3; i++)
            memcpy(sl[0] + i * w * E, p->w[0] + (i * E + r0) * E,
                   (size_t)(w * E) * sizeof(float));
        d->in_proj_weight = sl[0];
    } else {
        for (int i = 0; i < 3; i++) {
            sl[i] = test_alloc((size_t)(w * in[i]) * sizeof(float));
            memcpy(sl[i], p->w[i] + r0 * in[i],
                   (size_t)(w * in[i]) * sizeof(float));
        }
        d->q_proj_weight = sl[0], d->k_proj_weight = sl[1];
        d->v_proj_weight = sl[2];
    }
    sl[3] = test_alloc((size_t)(E * w) * sizeof(float));
    for (int64_t r = 0; r < E; r++)
        memcpy(sl[3] + r * w, p->w[3] + r * E + r0,
               (size_t)w * sizeof(float));
    d->out_proj_weight = sl[3];
    if (c->in_bias) {
        sl[4] = test_alloc((size_t)(3 * w) * sizeof(float));
        for (int i = 0; i < 3; i++)
            memcpy(sl[4] + i * w, p->w[4] + i * E + r0,
                   (size_t)w * sizeof(float));
        d->in_proj_bias = sl[4];
    }
}

/* Shards (tensor-parallel head slices): the layer cut into shards of
 * uneven head counts, from the full weights and from hand-sliced ones,
 * with per-head bias mask, ALiBi slopes and sinks. Summed in shard order
 * plus out_proj_bias, their outputs are the full layer's (TOL_LAYER);
 * each shard's weights and lse are the full layer's rows of its heads. */
START_TEST(layer_shards_sum_to_layer)
{
    const layer_case *c = &CASES[_i % N_CASES];
    const int sliced = _i >= N_CASES;
    layer_problem p;
    make_problem(c, 900 + (uint64_t)_i, &p);
    const int64_t B = c->b, H = c->h, Lq = c->lq, Lk = c->lk, E = c->e;
    test_rng r;
    rng_seed(&r, 33 + (uint64_t)_i);
    float *bias = random_floats(&r, (size_t)(H * Lq * Lk));
    float *slopes = random_floats(&r, (size_t)H);
    float *sinks = random_floats(&r, (size_t)H);
    mha_mask m = c->mask ? p.mask : (mha_mask){0};
    m.bias = bias, m.bias_stride_head = Lq * Lk, m.bias_stride_query = Lk;
    mha_score_terms terms = {.alibi_slopes = slopes, .sinks = sinks};
    const size_t n_out = (size_t)(B * Lq * E), n_w = (size_t)(B * H * Lq * Lk);
    float *full = test_alloc(n_out * sizeof *full);
    float *full_w = test_alloc(n_w * sizeof *full_w);
    float *full_lse = test_alloc((size_t)(B * H * Lq) * sizeof *full_lse);
    float *part = test_alloc(n_out * sizeof *part);
    float *part_w = test_alloc(n_w * sizeof *part_w);
    float *part_lse = test_alloc((size_t)(B * H * Lq) * sizeof *part_lse);
    double *sum = test_alloc(n_out * sizeof *sum);
    double *want_w = test_alloc(n_w * sizeof *want_w);
    double *want_lse = test_alloc((size_t)(B * H * Lq) * sizeof *want_lse);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        const char *isa = mha_isa_name(isas[t]);
        mha_engine *en = make_engine(isas[t], 0);
        mha_layer *layer;
        ck_assert_int_eq(mha_layer_create(en, &p.desc, &layer), MHA_OK);
        mha_layer_args a = {.query = p.query, .key = p.key, .value = p.value,
                            .out = full, .batch = B, .lq = Lq, .lk = Lk,
                            .mask = &m, .terms = &terms, .weights = full_w,
                            .lse = full_lse};
        ck_assert_msg(mha_layer_forward_ex(layer, &a) == MHA_OK, "%s",
                      mha_last_error());
        mha_layer_destroy(layer);
        /* Shards of 1, 2, 1, 2, ... heads (the last takes what is left). */
        for (size_t i = 0; i < n_out; i++)
            sum[i] = p.desc.out_proj_bias ? p.desc.out_proj_bias[i % E] : 0;
        for (int64_t first = 0, k = 0; first < H; k++) {
            int64_t count = (k % 2) + 1;
            if (count > H - first)
                count = H - first;
            mha_layer_desc d = p.desc;
            float *sl[6] = {0};
            if (sliced)
                slice_desc(&p, c, first, count, sl, &d);
            d.shard_first = first, d.shard_heads = count;
            mha_status st = mha_layer_create(en, &d, &layer);
            ck_assert_msg(st == MHA_OK, "%s [%s] shard %lld+%lld: %s",
                          c->name, isa, (long long)first, (long long)count,
                          mha_last_error());
            for (int i = 0; i < 6; i++)
                if (sl[i])
                    fill_sentinel(sl[i], 1); /* copied at creation */
            a.out = part, a.weights = part_w, a.lse = part_lse;
            st = mha_layer_forward_ex(layer, &a);
            ck_assert_msg(st == MHA_OK, "%s [%s] shard forward: %s", c->name,
                          isa, mha_last_error());
            for (size_t i = 0; i < n_out; i++)
                sum[i] += part[i];
            /* The shard's [B, count, Lq, Lk] against the full layer's. */
            for (int64_t b = 0; b < B; b++)
                for (int64_t x = 0; x < count * Lq * Lk; x++)
                    want_w[b * count * Lq * Lk + x] =
                        full_w[(b * H + first) * Lq * Lk + x];
            for (int64_t b = 0; b < B; b++)
                for (int64_t x = 0; x < count * Lq; x++)
                    want_lse[b * count * Lq + x] =
                        full_lse[(b * H + first) * Lq + x];
            ck_assert_msg(tol_ratio(part_w, want_w, (size_t)(B * count * Lq * Lk),
                                    TOL_LAYER_ABS, TOL_LAYER_REL, NULL) <= 1.0,
                          "%s [%s] shard %lld+%lld: weights differ from the "
                          "layer's heads", c->name, isa, (long long)first,
                          (long long)count);
            ck_assert_msg(tol_ratio(part_lse, want_lse, (size_t)(B * count * Lq),
                                    TOL_LAYER_ABS, TOL_LAYER_REL, NULL) <= 1.0,
                          "%s [%s] shard %lld+%lld: lse differs", c->name,
                          isa, (long long)first, (long long)count);
            mha_layer_destroy(layer);
            for (int i = 0; i < 6; i++)
                free(sl[i]);
            first += count;
        }
        size_t worst;
        double ratio = tol_ratio(full, sum, n_out, TOL_LAYER_ABS,
                                 TOL_LAYER_REL, &worst);
        ck_assert_msg(ratio <= 1.0,
                      "%s [%s]%s: layer out[%zu] = %.9g, shards sum to %.9g",
                      c->name, isa, sliced ? " sliced" : "", worst,
                      (double)full[worst], sum[worst]);
        mha_engine_destroy(en);
    }
    free(bias), free(slopes), free(sinks), free(full), free(full_w);
    free(full_lse), free(part), free(part_w), free(part_lse), free(sum);
    free(want_w), free(want_lse);
    free_problem(&p);
}
END_TEST

/* ---- bf16 layers ---------------------------------------------------- *
 * desc.dtype bf16 with the fp32 weights of the case: the layer rounds its
 * weights and biases to bf16; its inputs are bf16. The oracle takes the
 * same bf16 values and rounds the projections', the attention's and the
 * output's values to bf16 as the layer must. What remains between them:
 * fp32 sums instead of double ones, which may move a rounding by one bf16
 * ulp (2^-7 relative) at a stage and carry it through the next projection,
 * and, on a table with bf16 slots, P rounded to bf16 before P·V (at most
 * 2^-8 of the largest |V| per attention output). Tolerance: 2^-7 |want| +
 * 2^-6 max |want|. Weights (fp32 probabilities over bf16 q and k): 2^-6
 * absolute. */

static void to_bf16_values(float *x, size_t n, uint16_t **codes)
{
    *codes = test_alloc(n * sizeof **codes);
    mha_f32_to_bf16(x, n, *codes);
    mha_bf16_to_f32(*codes, n, x);
}

START_TEST(layer_bf16_vs_oracle)
{
    const layer_case *c = &CASES[_i];
    layer_problem p;
    make_problem(c, 900 + (uint64_t)_i, &p);
    const case_sizes z = sizes_of(c);
    const int64_t E = z.e, kdim = z.kdim, vdim = z.vdim;
    const mha_mask *mask = c->mask ? &p.mask : NULL;
    const size_t n_out = z.n_out, n_w = z.n_w, nq = z.nq, nk = z.nk,
                 nv = z.nv;

    /* The oracle's desc: the weights' and biases' bf16 values. */
    size_t n[6] = {(size_t)((c->packed ? 3 * E : E) * E),
                   c->packed ? 0 : (size_t)(E * kdim),
                   c->packed ? 0 : (size_t)(E * vdim), (size_t)(E * E),
                   c->in_bias ? (size_t)(3 * E) : 0,
                   c->out_bias ? (size_t)E : 0};
    float *rounded[6] = {0};
    uint16_t *unused;
    for (int i = 0; i < 6; i++)
        if (p.w[i]) {
            rounded[i] = test_alloc(n[i] * sizeof(float));
            memcpy(rounded[i], p.w[i], n[i] * sizeof(float));
            to_bf16_values(rounded[i], n[i], &unused);
            free(unused);
        }
    mha_layer_desc od = p.desc;
    if (c->packed)
        od.in_proj_weight = rounded[0];
    else
        od.q_proj_weight = rounded[0], od.k_proj_weight = rounded[1],
        od.v_proj_weight = rounded[2];
    od.out_proj_weight = rounded[3];
    od.in_proj_bias = rounded[4], od.out_proj_bias = rounded[5];

    uint16_t *q16, *k16 = NULL, *v16 = NULL;
    to_bf16_values(p.query, nq, &q16);
    if (!c->self) {
        to_bf16_values(p.key, nk, &k16);
        to_bf16_values(p.value, nv, &v16);
    }
    double *want = test_alloc(n_out * sizeof *want);
    double *want_w = test_alloc(n_w * sizeof *want_w);
    oracle_layer_bf16(&od, p.query, p.key, p.value, c->b, c->lq, c->lk, mask,
                      want, want_w);
    double big = 0;
    for (size_t x = 0; x < n_out; x++)
        big = fabs(want[x]) > big ? fabs(want[x]) : big;

    const size_t guard = 37;
    uint16_t *out = test_alloc((n_out + guard) * sizeof *out);
    float *got = test_alloc(n_out * sizeof *got);
    float *w = c->weights ? test_alloc(n_w * sizeof *w) : NULL;
    mha_layer_desc bd = p.desc;
    bd.dtype = MHA_BF16;
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa + emulated_engines(); t++) {
        const char *isa = walk_isa_name(t, isas, n_isa);
        mha_engine *e = make_walk_engine(t, isas, n_isa, 2);
        mha_layer *l;
        mha_status st = mha_layer_create(e, &bd, &l);
        ck_assert_msg(st == MHA_OK, "%s [%s] bf16: layer_create: %s",
                      c->name, isa, mha_last_error());
        for (size_t x = 0; x < n_out + guard; x++)
            out[x] = 0xA5A5u;
        mha_layer_args a = {.query = q16, .key = c->self ? q16 : k16,
                            .value = c->self ? q16 : v16, .out = out,
                            .batch = c->b, .lq = c->lq, .lk = c->lk,
                            .mask = mask, .weights = w};
        st = mha_layer_forward_ex(l, &a);
        ck_assert_msg(st == MHA_OK, "%s [%s] bf16: forward: %s", c->name, isa,
                      mha_last_error());
        mha_bf16_to_f32(out, n_out, got);
        for (size_t x = 0; x < n_out; x++) {
            double tol = fabs(want[x]) / 128 + big / 64;
            ck_assert_msg(fabs((double)got[x] - want[x]) <= tol,
                          "%s [%s] bf16: out[%zu] = %.6g, oracle %.6g", c->name,
                          isa, x, (double)got[x], want[x]);
        }
        for (size_t x = n_out; x < n_out + guard; x++)
            ck_assert_msg(out[x] == 0xA5A5u, "%s [%s] bf16: wrote past out",
                          c->name, isa);
        for (size_t x = 0; w && x < n_w; x++)
            ck_assert_msg(fabs((double)w[x] - want_w[x]) <= 1.0 / 64,
                          "%s [%s] bf16: weights[%zu] = %.6g, oracle %.6g",
                          c->name, isa, x, (double)w[x], want_w[x]);
        /* fp32 pointers through mha_layer_forward are refused. */
        ck_assert_int_eq(mha_layer_forward(l, p.query, p.key, p.value, c->b,
                                           c->lq, c->lk, mask, got, NULL),
                         MHA_ERR_UNSUPPORTED);
        mha_layer_destroy(l);
        mha_engine_destroy(e);
    }
    for (int i = 0; i < 6; i++)
        free(rounded[i]);
    free(q16), free(k16), free(v16), free(want), free(want_w), free(out);
    free(got), free(w);
    free_problem(&p);
}
END_TEST

/* ---- strided rows -------------------------------------------------- *
 * mha_layer_forward_ex with every buffer's rows strided: an odd row
 * stride, a batch gap and the first row one element in (for a bf16 layer
 * on a table whose bf16 products read code pairs, rows at an odd stride
 * or a 2-byte-aligned address are copied into pairs first; no other case
 * reaches that copy). An fp32 layer's query rows are 4 KiB apart
 * instead, a stride that crowds every L1's sets (mha_rows_crowd), so its
 * projection copies them first where the packed call reads its rows in
 * place. The padding holds NaN, so a read of it shows; the output must
 * equal the packed call's bit for bit (the same projections, only their
 * rows' addresses differ) and leave out's padding alone. */
typedef struct {
    int64_t ss, sb, off; /* in elements */
} strided;

/* Rows of w elements at an odd stride, or with crowd at the next multiple
 * of 1024 elements. */
static strided strided_for(int64_t w, int64_t rows, int64_t off, int crowd)
{
    strided g;
    if (crowd)
        g.ss = (w / 1024 + 1) * 1024;
    else
        g.ss = w % 2 == 0 ? w + 1 : w + 2;
    g.sb = rows * g.ss + 3;
    g.off = off;
    return g;
}

/* The packed [B, L, w] rows of x (es-byte elements) laid out as g, every
 * other element fill. */
static void *lay_out(const void *x, size_t es, int64_t B, int64_t L,
                     int64_t w, strided g, uint16_t fill16, float fill32,
                     size_t *n_out)
{
    size_t n = (size_t)(g.off + B * g.sb);
    char *buf = test_alloc(n * es);
    for (size_t i = 0; i < n; i++) {
        if (es == 2)
            memcpy(buf + i * es, &fill16, 2);
        else
            memcpy(buf + i * es, &fill32, 4);
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < L; r++)
            memcpy(buf + (size_t)(g.off + b * g.sb + r * g.ss) * es,
                   (const char *)x + (size_t)((b * L + r) * w) * es,
                   (size_t)w * es);
    if (n_out)
        *n_out = n;
    return buf;
}

static const int STRIDED_CASES[] = {0, 3, 5};
/* The self-attention cases: E 64 and 512 (stacked on every table), 48
 * (on tables of 16-wide panels), 40 and 8 (never). */
static const int SELF_CASES[] = {0, 1, 5, 7, 9};

/* The layer of desc d on a 2-thread engine of isa (*e, to destroy after
 * the layer). */
static mha_layer *layer_on(int t, const mha_isa *isas, int n_isa,
                           const mha_layer_desc *d, const char *name,
                           mha_engine **e)
{
    mha_layer *l = NULL;
    *e = make_walk_engine(t, isas, n_isa, 2);
    ck_assert_msg(mha_layer_create(*e, d, &l) == MHA_OK,
                  "%s [%s]: layer_create: %s", name,
                  walk_isa_name(t, isas, n_isa), mha_last_error());
    return l;
}

START_TEST(layer_strided_rows)
{
    const layer_case *c = &CASES[STRIDED_CASES[_i / 2]];
    const int bf16 = _i % 2;
    const size_t es = bf16 ? 2 : 4;
    layer_problem p;
    make_problem(c, 1300 + (uint64_t)_i, &p);
    const case_sizes z = sizes_of(c);
    const int64_t E = z.e, kdim = z.kdim, vdim = z.vdim;
    const mha_mask *mask = c->mask ? &p.mask : NULL;
    /* The packed inputs in the layer's dtype. */
    void *q = p.query, *k = p.key, *v = p.value;
    if (bf16) {
        q = test_alloc(z.nq * 2);
        mha_f32_to_bf16(p.query, z.nq, q);
        if (c->self) {
            k = v = q;
        } else {
            k = test_alloc(z.nk * 2);
            v = test_alloc(z.nv * 2);
            mha_f32_to_bf16(p.key, z.nk, k);
            mha_f32_to_bf16(p.value, z.nv, v);
        }
    }
    const uint16_t nan16 = 0x7FC1u;
    const float nan32 = NAN;
    strided gq = strided_for(E, c->lq, 1, !bf16),
            gk = strided_for(kdim, c->lk, 1, 0),
            gv = strided_for(vdim, c->lk, 1, 0),
            go = strided_for(E + 2, c->lq, 2, 0);
    void *sq = lay_out(q, es, c->b, c->lq, E, gq, nan16, nan32, NULL);
    void *sk = c->self ? sq
                       : lay_out(k, es, c->b, c->lk, kdim, gk, nan16, nan32,
                                 NULL);
    void *sv = c->self ? sq
                       : lay_out(v, es, c->b, c->lk, vdim, gv, nan16, nan32,
                                 NULL);
    if (c->self)
        gk = gv = gq;
    const size_t n_so = (size_t)(go.off + c->b * go.sb);
    char *ref = test_alloc(z.n_out * es), *so = test_alloc(n_so * es);
    char *fresh = test_alloc(n_so * es);
    mha_layer_desc d = p.desc;
    d.dtype = bf16 ? MHA_BF16 : MHA_F32;
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa + emulated_engines(); t++) {
        const char *isa = walk_isa_name(t, isas, n_isa);
        mha_engine *e;
        mha_layer *l = layer_on(t, isas, n_isa, &d, c->name, &e);
        mha_layer_args a = {.query = q, .key = k, .value = v, .out = ref,
                            .batch = c->b, .lq = c->lq, .lk = c->lk,
                            .mask = mask};
        ck_assert_msg(mha_layer_forward_ex(l, &a) == MHA_OK,
                      "%s [%s]: packed forward: %s", c->name, isa,
                      mha_last_error());
        for (size_t x = 0; x < n_so; x++) {
            if (es == 2)
                memcpy(so + x * es, &nan16, 2);
            else
                memcpy(so + x * es, &nan32, 4);
        }
        memcpy(fresh, so, n_so * es);
        a = (mha_layer_args){
            .query = (char *)sq + gq.off * es,
            .key = (char *)sk + gk.off * es,
            .value = (char *)sv + gv.off * es,
            .out = so + go.off * es, .batch = c->b, .lq = c->lq,
            .lk = c->lk, .mask = mask,
            .query_stride_batch = gq.sb, .query_stride_seq = gq.ss,
            .key_stride_batch = gk.sb, .key_stride_seq = gk.ss,
            .value_stride_batch = gv.sb, .value_stride_seq = gv.ss,
            .out_stride_batch = go.sb, .out_stride_seq = go.ss};
        ck_assert_msg(mha_layer_forward_ex(l, &a) == MHA_OK,
                      "%s [%s]: strided forward: %s", c->name, isa,
                      mha_last_error());
        /* Row by row: the packed call's bits; elsewhere untouched. */
        for (int64_t b = 0; b < c->b; b++)
            for (int64_t r = 0; r < c->lq; r++) {
                size_t at = (size_t)(go.off + b * go.sb + r * go.ss);
                ck_assert_msg(memcmp(so + at * es,
                                     ref + (size_t)((b * c->lq + r) * E) * es,
                                     (size_t)E * es) == 0,
                              "%s [%s] %s: strided out row (%lld, %lld) "
                              "differs from the packed call's",
                              c->name, isa, bf16 ? "bf16" : "fp32",
                              (long long)b, (long long)r);
                memcpy(fresh + at * es, so + at * es, (size_t)E * es);
            }
        ck_assert_msg(memcmp(fresh, so, n_so * es) == 0,
                      "%s [%s]: wrote out's padding", c->name, isa);
        mha_layer_destroy(l);
        mha_engine_destroy(e);
    }
    if (bf16) {
        free(q);
        if (!c->self)
            free(k), free(v);
    }
    if (!c->self)
        free(sk), free(sv);
    free(sq), free(ref), free(so), free(fresh);
    free_problem(&p);
}
END_TEST

/* Only fp32 and bf16 layers, and no bf16 shard. */
/* Self-attention through a layer whose q, k and v share a stacked pack
 * (one multiply into [B, L, 3w] rows) against the same layer given key
 * and value as copies of the query (three projections into buffers of
 * their own): the same sums in the same order, so the outputs and
 * weights are bitwise equal, on every ISA, fp32 and bf16. A layer of E a
 * multiple of 32 (every table's panel width divides it) must take the
 * stacked pack. */
START_TEST(layer_fused_matches_separate)
{
    const layer_case *c = &CASES[SELF_CASES[_i / 2]];
    const int bf16 = _i % 2;
    const size_t es = bf16 ? 2 : 4;
    layer_problem p;
    make_problem(c, 1700 + (uint64_t)_i, &p);
    const case_sizes z = sizes_of(c);
    ck_assert(c->self && z.kdim == z.e && z.vdim == z.e);
    void *x = bf16 ? as_dtype(p.query, z.nq, MHA_BF16) : p.query;
    char *x2 = test_alloc(z.nq * es), *x3 = test_alloc(z.nq * es);
    memcpy(x2, x, z.nq * es);
    memcpy(x3, x, z.nq * es);
    char *fused = test_alloc(z.n_out * es), *apart = test_alloc(z.n_out * es);
    float *wf = c->weights ? test_alloc(z.n_w * sizeof *wf) : NULL;
    float *wa = c->weights ? test_alloc(z.n_w * sizeof *wa) : NULL;
    mha_layer_desc d = p.desc;
    d.dtype = bf16 ? MHA_BF16 : MHA_F32;
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa + emulated_engines(); t++) {
        const char *isa = walk_isa_name(t, isas, n_isa);
        mha_engine *en = make_walk_engine(t, isas, n_isa, 0);
        mha_layer *l = NULL;
        ck_assert_int_eq(mha_layer_create(en, &d, &l), MHA_OK);
        if (c->e % 32 == 0)
            ck_assert_msg(mha_test_layer_fused(l),
                          "%s [%s]: E %lld did not stack q, k, v", c->name,
                          isa, (long long)c->e);
        mha_layer_args a = {.query = x, .key = x, .value = x, .out = fused,
                            .batch = c->b, .lq = c->lq, .lk = c->lk,
                            .mask = c->mask ? &p.mask : NULL, .weights = wf};
        fill_sentinel((float *)(void *)fused, z.n_out * es / 4);
        ck_assert_int_eq(mha_layer_forward_ex(l, &a), MHA_OK);
        a.key = x2, a.value = x3, a.out = apart, a.weights = wa;
        fill_sentinel((float *)(void *)apart, z.n_out * es / 4);
        ck_assert_int_eq(mha_layer_forward_ex(l, &a), MHA_OK);
        for (size_t i = 0; i < z.n_out; i++)
            REQUIRE(memcmp(fused + i * es, apart + i * es, es) == 0,
                    "%s [%s] %s: out[%zu] differs between one input array "
                    "and three", c->name, isa, bf16 ? "bf16" : "fp32", i);
        if (wf)
            ck_assert_msg(memcmp(wf, wa, z.n_w * sizeof *wf) == 0,
                          "%s [%s]: weights differ", c->name, isa);
        mha_layer_destroy(l);
        mha_engine_destroy(en);
    }
    if (bf16)
        free(x);
    free(x2), free(x3), free(fused), free(apart), free(wf), free(wa);
    free_problem(&p);
}
END_TEST

START_TEST(layer_dtype_refused)
{
    layer_problem p;
    make_problem(&CASES[0], 77, &p);
    mha_isa isas[TEST_MAX_ISAS];
    available_isas(isas);
    mha_engine *e = make_engine(isas[0], 1);
    mha_layer *l = NULL;
    const struct {
        mha_dtype dtype;
        int64_t shard_heads;
        const char *field;
    } rows[] = {{MHA_F16, 0, "desc.dtype (f16)"},
                {MHA_I8, 0, "desc.dtype (i8)"},
                {MHA_BF16, 2, "desc.shard_heads"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        mha_layer_desc d = p.desc;
        d.dtype = rows[i].dtype;
        d.shard_heads = rows[i].shard_heads;
        ck_assert_int_eq(mha_layer_create(e, &d, &l), MHA_ERR_UNSUPPORTED);
        ck_assert_msg(strstr(mha_last_error(), rows[i].field),
                      "message \"%s\" does not name %s", mha_last_error(),
                      rows[i].field);
        ck_assert_ptr_null(l);
    }
    mha_engine_destroy(e);
    free_problem(&p);
}
END_TEST

Suite *suite_layer(void)
{
    Suite *s = suite_create("layer");
    TCase *tc = tcase_create("layer");
    tcase_add_loop_test(tc, layer_case_vs_oracle, 0, N_CASES);
    tcase_add_test(tc, worked_padding_mask);
    tcase_add_loop_test(tc, layer_bf16_vs_oracle, 0, N_CASES);
    tcase_add_test(tc, layer_dtype_refused);
    tcase_add_loop_test(tc, layer_strided_rows, 0,
                        2 * (int)(sizeof STRIDED_CASES / sizeof STRIDED_CASES[0]));
    tcase_add_loop_test(tc, layer_shards_sum_to_layer, 0, 2 * N_CASES);
    tcase_add_loop_test(tc, layer_fused_matches_separate, 0,
                        2 * (int)(sizeof SELF_CASES / sizeof SELF_CASES[0]));
    suite_add_tcase(s, tc);
    return s;
}
