/*
 * The test oracle: attention and the layer in plain double precision,
 * written from the formula of docs/design.md (full score matrix, three passes).
 * It shares no code with the library; only the public structs describe the
 * problem. Inputs are assumed valid.
 */
#ifndef MHA_TEST_ORACLE_H
#define MHA_TEST_ORACLE_H

#include <stdint.h>

#include "mha.h"

typedef struct oracle_dims {
    int64_t batch, lq, lk, heads, kv_heads, d, dv;
} oracle_dims;

/* 1 if key j is hidden from query i of (batch b, head h) by the causal
 * flag, the keep-mask or the key lengths (not by -INFINITY in the bias). */
int oracle_hidden(const mha_mask *mask, int64_t b, int64_t h, int64_t i,
                  int64_t j, int64_t lq, int64_t lk);

/* 1 if key j lies outside query i's sliding window of terms (NULL or
 * window 0: never). */
int oracle_outside_window(const mha_score_terms *terms, int64_t i,
                          int64_t j, int64_t lq, int64_t lk);

/* Attention on packed double arrays: q [B,Lq,H,d], k [B,Lk,Hkv,d],
 * v [B,Lk,Hkv,dv]; writes out [B,Lq,H,dv] and, when non-NULL, weights
 * [B,H,Lq,Lk]. mask may be NULL. */
void oracle_sdpa(const oracle_dims *dims, const double *q, const double *k,
                 const double *v, const mha_mask *mask, double scale,
                 double *out, double *weights);
/* The same with score terms (NULL: none; mha.h's definitions: softcap,
 * ALiBi, window, sinks) and, when non-NULL, lse [B,H,Lq]. */
void oracle_sdpa_terms(const oracle_dims *dims, const double *q,
                       const double *k, const double *v,
                       const mha_mask *mask, const mha_score_terms *terms,
                       double scale, double *out, double *weights,
                       double *lse);

/* mha_attention's problem read through its views (strides honoured,
 * half-precision K/V decoded; args->out and args->weights are ignored).
 * out is packed [B,Lq,H,dv], weights packed [B,H,Lq,Lk] or NULL. */
void oracle_attention(const mha_attention_args *args, double *out,
                      double *weights);
/* The same with lse [B,H,Lq] (when non-NULL); args->terms, key_keep and
 * scale_explicit are honoured by both. */
void oracle_attention_lse(const mha_attention_args *args, double *out,
                          double *weights, double *lse);

/* nn.MultiheadAttention(batch_first=True): query [B,Lq,E], key [B,Lk,kdim],
 * value [B,Lk,vdim], weights of desc in nn.Linear layout. out [B,Lq,E];
 * weights (per head, not averaged) [B,H,Lq,Lk] or NULL. */
void oracle_layer(const mha_layer_desc *desc, const float *query,
                  const float *key, const float *value, int64_t batch,
                  int64_t lq, int64_t lk, const mha_mask *mask, double *out,
                  double *weights);
/* The same for a bf16 layer whose weights, biases and inputs the caller
 * gives as bf16 values: the projections' and the attention's outputs, and
 * out, rounded to the nearest bf16 value (ties to even). */
void oracle_layer_bf16(const mha_layer_desc *desc, const float *query,
                       const float *key, const float *value, int64_t batch,
                       int64_t lq, int64_t lk, const mha_mask *mask,
                       double *out, double *weights);

#endif
