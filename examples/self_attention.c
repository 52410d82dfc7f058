/* Embeds libmha: self-attention of nn.MultiheadAttention(512, 8,
 * batch_first=True) over a batch of 2 sequences of 5 tokens, through the
 * layer API. Prints the shapes and a checksum of the output. */
#include <stdio.h>
#include <stdlib.h>

#include "mha.h"

enum { B = 2, L = 5, E = 512, H = 8 };

/* Deterministic values in [-0.5, 0.5) standing in for trained weights. */
static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
}

int main(void)
{
    float *in_proj = malloc(sizeof(float) * 3 * E * E);
    float *in_bias = malloc(sizeof(float) * 3 * E);
    float *out_proj = malloc(sizeof(float) * E * E);
    float *out_bias = malloc(sizeof(float) * E);
    float *x = malloc(sizeof(float) * B * L * E);
    float *y = malloc(sizeof(float) * B * L * E);
    if (!in_proj || !in_bias || !out_proj || !out_bias || !x || !y)
        return 1;
    fill(in_proj, 3 * E * E, 1);
    fill(in_bias, 3 * E, 2);
    fill(out_proj, E * E, 3);
    fill(out_bias, E, 4);
    fill(x, B * L * E, 5);

    mha_engine *engine = NULL;
    mha_layer *layer = NULL;
    mha_status st = mha_engine_create(NULL, &engine);
    if (st == MHA_OK) {
        mha_layer_desc desc = {0};
        desc.embed_dim = E;
        desc.num_heads = H;
        desc.in_proj_weight = in_proj;
        desc.in_proj_bias = in_bias;
        desc.out_proj_weight = out_proj;
        desc.out_proj_bias = out_bias;
        st = mha_layer_create(engine, &desc, &layer);
    }
    if (st == MHA_OK)
        st = mha_layer_forward(layer, x, x, x, B, L, L, NULL, y, NULL);
    if (st != MHA_OK) {
        fprintf(stderr, "libmha: %s: %s\n", mha_status_string(st),
                mha_last_error());
        return 1;
    }
    double sum = 0, abs_sum = 0;
    for (int i = 0; i < B * L * E; i++) {
        sum += y[i];
        abs_sum += y[i] < 0 ? -y[i] : y[i];
    }
    printf("libmha %s, isa %s\n", mha_version(),
           mha_isa_name(mha_engine_isa(engine)));
    printf("input  [%d, %d, %d]\noutput [%d, %d, %d]\n", B, L, E, B, L, E);
    printf("checksum: sum %.6f, sum of |y| %.6f\n", sum, abs_sum);
    mha_layer_destroy(layer);
    mha_engine_destroy(engine);
    free(in_proj), free(in_bias), free(out_proj), free(out_bias);
    free(x), free(y);
    return 0;
}
