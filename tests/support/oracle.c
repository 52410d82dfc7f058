/* The double-precision oracle (see oracle.h). Deliberately naive. */
#include "oracle.h"

#include "support.h"

#include <math.h>
#include <stdlib.h>

static void *oracle_alloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size);
    if (!p)
        abort();
    return p;
}

/* Key j sits at position koff + j of total keys (terms.key_offset and
 * key_total: a shard of a longer sequence); the causal mask compares
 * positions, the other masks index the call's keys. */
static int hidden_at(const mha_mask *mask, int64_t b, int64_t h, int64_t i,
                     int64_t j, int64_t lq, int64_t koff, int64_t total)
{
    if (!mask)
        return 0;
    if (mask->causal == MHA_CAUSAL_TOP_LEFT && koff + j > i)
        return 1;
    if (mask->causal == MHA_CAUSAL_BOTTOM_RIGHT && koff + j > i + total - lq)
        return 1;
    if (mask->key_lengths && j >= mask->key_lengths[b])
        return 1;
    if (mask->key_keep && mask->key_keep[b * mask->key_keep_stride_batch + j] == 0)
        return 1;
    if (mask->keep) {
        int64_t at = b * mask->keep_stride_batch + h * mask->keep_stride_head +
                     i * mask->keep_stride_query + j;
        if (mask->keep[at] == 0)
            return 1;
    }
    return 0;
}

int oracle_hidden(const mha_mask *mask, int64_t b, int64_t h, int64_t i,
                  int64_t j, int64_t lq, int64_t lk)
{
    return hidden_at(mask, b, h, i, j, lq, 0, lk);
}

static double bias_at(const mha_mask *mask, int64_t b, int64_t h, int64_t i,
                      int64_t j)
{
    if (!mask || !mask->bias)
        return 0.0;
    return mask->bias[b * mask->bias_stride_batch +
                      h * mask->bias_stride_head +
                      i * mask->bias_stride_query + j];
}

/* i', the aligned position of query i among total key positions. */
static int64_t aligned(const mha_score_terms *terms, int64_t i, int64_t lq,
                       int64_t total)
{
    return terms->align == MHA_ALIGN_TOP_LEFT ? i : i + total - lq;
}

/* The full sequence's key count: key_total, or the shard's end. */
static int64_t total_keys(const mha_score_terms *terms, int64_t lk)
{
    if (!terms)
        return lk;
    return terms->key_total ? terms->key_total : terms->key_offset + lk;
}

/* j here is a key position (key_offset + the call's index). */
static int outside_at(const mha_score_terms *terms, int64_t i, int64_t j,
                      int64_t lq, int64_t total)
{
    if (!terms || !terms->window)
        return 0;
    /* Distances, not ip +- extent: an extent may be near INT64_MAX (an
     * unbounded window in all but name), positions stay below 2^62. */
    int64_t ip = aligned(terms, i, lq, total);
    if (terms->window_left >= 0 && ip - j > terms->window_left)
        return 1;
    return terms->window_right >= 0 && j - ip > terms->window_right;
}

int oracle_outside_window(const mha_score_terms *terms, int64_t i,
                          int64_t j, int64_t lq, int64_t lk)
{
    int64_t koff = terms ? terms->key_offset : 0;
    return outside_at(terms, i, koff + j, lq, total_keys(terms, lk));
}

void oracle_sdpa(const oracle_dims *dims, const double *q, const double *k,
                 const double *v, const mha_mask *mask, double scale,
                 double *out, double *weights)
{
    oracle_sdpa_terms(dims, q, k, v, mask, NULL, scale, out, weights, NULL);
}

void oracle_sdpa_terms(const oracle_dims *dims, const double *q,
                       const double *k, const double *v,
                       const mha_mask *mask, const mha_score_terms *terms,
                       double scale, double *out, double *weights,
                       double *lse)
{
    const int64_t B = dims->batch, Lq = dims->lq, Lk = dims->lk;
    const int64_t H = dims->heads, Hkv = dims->kv_heads;
    const int64_t d = dims->d, dv = dims->dv;
    const int64_t group = H / Hkv;
    const int64_t koff = terms ? terms->key_offset : 0;
    const int64_t total = total_keys(terms, Lk);
    double *s = oracle_alloc((size_t)(Lq * Lk), sizeof *s);

    for (int64_t b = 0; b < B; b++) {
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / group;
            /* Pass 1: scaled, biased, masked scores. */
            for (int64_t i = 0; i < Lq; i++) {
                const double *qi = &q[((b * Lq + i) * H + h) * d];
                for (int64_t j = 0; j < Lk; j++) {
                    const double *kj = &k[((b * Lk + j) * Hkv + g) * d];
                    double dot = 0.0;
                    for (int64_t c = 0; c < d; c++)
                        dot += qi[c] * kj[c];
                    double x = scale * dot;
                    if (terms && terms->softcap > 0.0f) {
                        double cap = terms->softcap;
                        x = cap * tanh(x / cap);
                    }
                    if (terms && terms->alibi_slopes) {
                        double slope =
                            terms->alibi_slopes[b * terms->alibi_stride_batch +
                                                h];
                        x += -slope *
                             (double)(aligned(terms, i, Lq, total) - (koff + j));
                    }
                    x += bias_at(mask, b, h, i, j);
                    if (hidden_at(mask, b, h, i, j, Lq, koff, total) ||
                        outside_at(terms, i, koff + j, Lq, total))
                        x = -INFINITY;
                    s[i * Lk + j] = x;
                }
            }
            /* Pass 2: row max and sum; pass 3: normalise, then P V. */
            for (int64_t i = 0; i < Lq; i++) {
                double *si = &s[i * Lk];
                /* A sink is one more logit in the denominator, with no
                 * value. */
                int has_sink = terms && terms->sinks;
                double sink = has_sink ? terms->sinks[h] : -INFINITY;
                double mx = sink;
                int nan = 0;
                for (int64_t j = 0; j < Lk; j++) {
                    if (si[j] > mx)
                        mx = si[j];
                    nan |= si[j] != si[j];
                }
                double sum = has_sink && mx != -INFINITY ? exp(sink - mx) : 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    si[j] = mx == -INFINITY ? 0.0 : exp(si[j] - mx);
                    sum += si[j];
                }
                for (int64_t j = 0; j < Lk; j++)
                    si[j] = sum > 0.0 ? si[j] / sum : 0.0;
                if (lse)
                    lse[(b * H + h) * Lq + i] =
                        nan ? NAN : sum > 0.0 ? mx + log(sum) : -INFINITY;

                double *oi = &out[((b * Lq + i) * H + h) * dv];
                for (int64_t c = 0; c < dv; c++)
                    oi[c] = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    if (si[j] == 0.0)
                        continue; /* masked: its V row takes no part */
                    const double *vj = &v[((b * Lk + j) * Hkv + g) * dv];
                    for (int64_t c = 0; c < dv; c++)
                        oi[c] += si[j] * vj[c];
                }
                if (weights)
                    for (int64_t j = 0; j < Lk; j++)
                        weights[((b * H + h) * Lq + i) * Lk + j] = si[j];
            }
        }
    }
    free(s);
}

/* A view copied into a packed [B, S, H, D] double array. */
static double *gather(const mha_tensor *t)
{
    double *x = oracle_alloc((size_t)(t->batch * t->seq * t->heads * t->dim),
                             sizeof *x);
    view_gather_double(t, x);
    return x;
}

void oracle_attention(const mha_attention_args *args, double *out,
                      double *weights)
{
    oracle_attention_lse(args, out, weights, NULL);
}

void oracle_attention_lse(const mha_attention_args *args, double *out,
                          double *weights, double *lse)
{
    oracle_dims dims = {.batch = args->q.batch, .lq = args->q.seq,
                        .lk = args->k.seq, .heads = args->q.heads,
                        .kv_heads = args->k.heads, .d = args->q.dim,
                        .dv = args->v.dim};
    double scale = args->scale != 0.0f || args->scale_explicit
                       ? (double)args->scale
                       : 1.0 / sqrt((double)dims.d);
    double *q = gather(&args->q), *k = gather(&args->k), *v = gather(&args->v);
    oracle_sdpa_terms(&dims, q, k, v, args->mask, args->terms, scale, out,
                      weights, lse);
    free(q);
    free(k);
    free(v);
}

/* y[r][o] = sum_c x[r][c] * w[o][c] + bias[o]: nn.Linear, w [n_out, n_in]. */
static void linear(const double *x, int64_t rows, int64_t n_in,
                   const float *w, const float *bias, int64_t n_out, double *y)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < n_out; o++) {
            double acc = bias ? (double)bias[o] : 0.0;
            for (int64_t c = 0; c < n_in; c++)
                acc += x[r * n_in + c] * (double)w[o * n_in + c];
            y[r * n_out + o] = acc;
        }
}

static double *widen(const float *x, size_t n)
{
    double *y = oracle_alloc(n, sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

/* x to the nearest bfloat16 value (8 significant bits, ties to even);
 * zero, infinities and NaN as they are (no subnormal or overflow case
 * arises in the tests). */
static double round_bf16(double x)
{
    if (x == 0 || !isfinite(x))
        return x;
    int e;
    frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
    double unit = ldexp(1.0, e - 8);
    return nearbyint(x / unit) * unit;
}

static void round_all(double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = round_bf16(x[i]);
}

/* The layer, with the outputs of each projection and of the attention
 * rounded to bf16 when bf16 is set. */
static void layer(const mha_layer_desc *desc, const float *query,
                  const float *key, const float *value, int64_t batch,
                  int64_t lq, int64_t lk, const mha_mask *mask, double *out,
                  double *weights, int bf16)
{
    const int64_t E = desc->embed_dim, H = desc->num_heads;
    const int64_t kdim = desc->kdim ? desc->kdim : E;
    const int64_t vdim = desc->vdim ? desc->vdim : E;
    const float *wq = desc->q_proj_weight, *wk = desc->k_proj_weight;
    const float *wv = desc->v_proj_weight;
    if (desc->in_proj_weight) {
        wq = desc->in_proj_weight;
        wk = desc->in_proj_weight + E * E;
        wv = desc->in_proj_weight + 2 * E * E;
    }
    const float *bq = NULL, *bk = NULL, *bv = NULL;
    if (desc->in_proj_bias) {
        bq = desc->in_proj_bias;
        bk = desc->in_proj_bias + E;
        bv = desc->in_proj_bias + 2 * E;
    }

    double *xq = widen(query, (size_t)(batch * lq * E));
    double *xk = widen(key, (size_t)(batch * lk * kdim));
    double *xv = widen(value, (size_t)(batch * lk * vdim));
    double *q = oracle_alloc((size_t)(batch * lq * E), sizeof *q);
    double *k = oracle_alloc((size_t)(batch * lk * E), sizeof *k);
    double *v = oracle_alloc((size_t)(batch * lk * E), sizeof *v);
    double *attn = oracle_alloc((size_t)(batch * lq * E), sizeof *attn);
    linear(xq, batch * lq, E, wq, bq, E, q);
    linear(xk, batch * lk, kdim, wk, bk, E, k);
    linear(xv, batch * lk, vdim, wv, bv, E, v);
    if (bf16) {
        round_all(q, (size_t)(batch * lq * E));
        round_all(k, (size_t)(batch * lk * E));
        round_all(v, (size_t)(batch * lk * E));
    }

    /* [B, L, E] is [B, L, H, E/H]: the heads split without a copy. */
    oracle_dims dims = {.batch = batch, .lq = lq, .lk = lk, .heads = H,
                        .kv_heads = H, .d = E / H, .dv = E / H};
    oracle_sdpa(&dims, q, k, v, mask, 1.0 / sqrt((double)(E / H)), attn,
                weights);
    if (bf16)
        round_all(attn, (size_t)(batch * lq * E));
    linear(attn, batch * lq, E, desc->out_proj_weight, desc->out_proj_bias, E,
           out);
    if (bf16)
        round_all(out, (size_t)(batch * lq * E));

    free(xq);
    free(xk);
    free(xv);
    free(q);
    free(k);
    free(v);
    free(attn);
}

void oracle_layer(const mha_layer_desc *desc, const float *query,
                  const float *key, const float *value, int64_t batch,
                  int64_t lq, int64_t lk, const mha_mask *mask, double *out,
                  double *weights)
{
    layer(desc, query, key, value, batch, lq, lk, mask, out, weights, 0);
}

void oracle_layer_bf16(const mha_layer_desc *desc, const float *query,
                       const float *key, const float *value, int64_t batch,
                       int64_t lq, int64_t lk, const mha_mask *mask,
                       double *out, double *weights)
{
    layer(desc, query, key, value, batch, lq, lk, mask, out, weights, 1);
}
