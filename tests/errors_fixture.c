/* The errors suite's fixtures and the checks of a rejected call
 * (errors.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

void fixture_init(fixture *f)
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

void fixture_free(fixture *f)
{
    free(f->arena);
    free(f->w);
}

void layer_fixture_init(layer_fixture *f)
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

void layer_fixture_free(layer_fixture *f)
{
    free(f->arena);
    free(f->w);
}

const char *prime_message(void)
{
    static char primed[256];
    mha_engine *e = NULL;
    mha_config bad = {.num_threads = -7};
    ck_assert_int_eq(mha_engine_create(&bad, &e), MHA_ERR_BAD_ARGUMENT);
    snprintf(primed, sizeof primed, "%s", mha_last_error());
    ck_assert_msg(primed[0] != '\0', "no message for num_threads -7");
    return primed;
}

static int ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_';
}

int names_field(const char *msg, const char *fields)
{
    while (*fields) {
        size_t n = strcspn(fields, "|");
        for (const char *at = msg; n > 0 && *at; at++) {
            if (strncmp(at, fields, n) != 0)
                continue;
            int starts = at == msg || (!ident_char(at[-1]) && at[-1] != '.');
            if (starts && !ident_char(at[n]))
                return 1;
        }
        fields += n;
        if (*fields == '|')
            fields++;
    }
    return 0;
}

void expect_message(const char *primed, const char *fields, const char *what)
{
    const char *msg = mha_last_error();
    ck_assert_msg(msg && msg[0] != '\0', "%s: empty mha_last_error()", what);
    ck_assert_msg(strcmp(msg, primed) != 0,
                  "%s: mha_last_error() still holds an older message (%s)",
                  what, msg);
    ck_assert_msg(names_field(msg, fields),
                  "%s: the message '%s' does not name %s", what, msg, fields);
}

void expect_rejected(mha_status st, const expectation *e, mha_isa isa,
                     const char *primed, const void *before,
                     const void *arena, size_t arena_bytes,
                     const float *weights, size_t n_weights)
{
    ck_assert_msg(st == e->want, "%s [%s]: got %s, want %s (%s)", e->name,
                  mha_isa_name(isa), mha_status_string(st),
                  mha_status_string(e->want), mha_last_error());
    expect_message(primed, e->field, e->name);
    ck_assert_msg(memcmp(before, arena, arena_bytes) == 0,
                  "%s: an input or out byte changed", e->name);
    ck_assert_msg(count_changed(weights, n_weights) == 0,
                  "%s: a weights byte changed", e->name);
}
