/* Helpers shared by the test suites (declared in util.h). */
#include "util.h"

#include "oracle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

mha_engine *make_engine_config(const mha_config *config)
{
    mha_engine *engine = NULL;
    mha_status st = mha_engine_create(config, &engine);
    ck_assert_msg(st == MHA_OK && engine != NULL,
                  "mha_engine_create(isa %s, %d threads, flush %d): %s (%s)",
                  mha_isa_name(config->isa), config->num_threads,
                  config->flush_subnormals, mha_status_string(st),
                  mha_last_error());
    ck_assert_msg(mha_engine_isa(engine) == config->isa,
                  "engine picked %s, asked %s",
                  mha_isa_name(mha_engine_isa(engine)),
                  mha_isa_name(config->isa));
    return engine;
}

mha_engine *make_engine(mha_isa isa, int nthreads)
{
    mha_config config = {.num_threads = nthreads, .isa = isa};
    return make_engine_config(&config);
}

void *test_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    REQUIRE(p != NULL, "test_alloc(%zu) failed", bytes);
    return p;
}

float *random_floats(test_rng *r, size_t n)
{
    float *x = test_alloc(n * sizeof *x);
    fill_uniform(r, x, n);
    return x;
}

const char *layout_name(test_layout layout)
{
    switch (layout) {
    case LAYOUT_BSHD: return "bshd";
    case LAYOUT_BHSD: return "bhsd";
    case LAYOUT_PAD_BSHD: return "padded-bshd";
    case LAYOUT_PAD_BHSD: return "padded-bhsd";
    case LAYOUT_COUNT: break;
    }
    return "?";
}

/* Strides of a layout; padded layouts add 3 floats per row, 5 per seq (or
 * head) step and 7 per batch. */
static void layout_strides(test_layout layout, int64_t s, int64_t h,
                           int64_t d, int64_t st[3])
{
    int64_t pad_row = 0, pad_mid = 0, pad_batch = 0;
    if (layout == LAYOUT_PAD_BSHD || layout == LAYOUT_PAD_BHSD) {
        pad_row = 3;
        pad_mid = 5;
        pad_batch = 7;
    }
    int64_t row = d + pad_row;
    if (layout == LAYOUT_BSHD || layout == LAYOUT_PAD_BSHD) {
        st[2] = row;                  /* head */
        st[1] = h * row + pad_mid;    /* seq */
        st[0] = s * st[1] + pad_batch;
    } else {
        st[1] = row;                  /* seq */
        st[2] = s * row + pad_mid;    /* head */
        st[0] = h * st[2] + pad_batch;
    }
}

size_t layout_floats(test_layout layout, int64_t b, int64_t s, int64_t h,
                     int64_t d)
{
    int64_t st[3];
    layout_strides(layout, s, h, d, st);
    return (size_t)(b * st[0]);
}

mha_tensor layout_view(test_layout layout, float *data, int64_t b, int64_t s,
                       int64_t h, int64_t d)
{
    int64_t st[3];
    layout_strides(layout, s, h, d, st);
    mha_tensor t = {.data = data, .batch = b, .seq = s, .heads = h, .dim = d,
                    .stride_batch = st[0], .stride_seq = st[1],
                    .stride_head = st[2], .dtype = MHA_F32};
    return t;
}

size_t count_changed_outside(const float *buf, size_t n, const mha_tensor *t)
{
    unsigned char *inside = test_alloc(n);
    memset(inside, 0, n);
    size_t base = (size_t)((const float *)t->data - buf);
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seq; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t c = 0; c < t->dim; c++)
                    inside[base + (size_t)(b * t->stride_batch +
                                           s * t->stride_seq +
                                           h * t->stride_head + c)] = 1;
    size_t changed = 0;
    for (size_t i = 0; i < n; i++)
        if (!inside[i])
            changed += count_changed(&buf[i], 1);
    free(inside);
    return changed;
}

/* Position of a packed [B, S, H, D] index, for failure messages. */
static void split_bshd(size_t at, const mha_tensor *t, int64_t ix[4])
{
    size_t dims[4] = {(size_t)t->batch, (size_t)t->seq, (size_t)t->heads,
                      (size_t)t->dim};
    for (int a = 3; a >= 0; a--) {
        ix[a] = (int64_t)(at % dims[a]);
        at /= dims[a];
    }
}

void check_weights(const float *got, const double *want, int64_t rows,
                   int64_t lk, double abs, double rel, const char *what,
                   const char *isa)
{
    size_t n = (size_t)(rows * lk), worst;
    double r = tol_ratio(got, want, n, abs, rel, &worst);
    ck_assert_msg(r <= 1.0,
                  "%s [%s]: weights row %zu key %zu: got %.9g, want %.9g "
                  "(ratio %.3g)",
                  what, isa, worst / (size_t)lk, worst % (size_t)lk,
                  (double)got[worst], want[worst], r);
    for (int64_t i = 0; i < rows; i++) {
        const float *g = &got[i * lk];
        const double *w = &want[i * lk];
        double sum = 0.0, want_sum = 0.0;
        for (int64_t j = 0; j < lk; j++) {
            sum += g[j];
            want_sum += w[j];
            REQUIRE(w[j] != 0.0 || g[j] == 0.0,
                          "%s [%s]: masked weight row %lld key %lld = %g",
                          what, isa, (long long)i, (long long)j,
                          (double)g[j]);
        }
        if (want_sum == 0.0)
            continue; /* fully masked: every entry checked zero above */
        /* 1, or less with a sink (its share is no key's). */
        REQUIRE(fabs(sum - want_sum) <= TOL_WEIGHT_SUM,
                      "%s [%s]: weights row %lld sums to %.9g, want %.9g",
                      what, isa, (long long)i, sum, want_sum);
    }
}

/* A row that sees one key (weight exactly 1) is that key's value row bit
 * for bit, as PyTorch's exp(0) = 1 gives (docs/design.md, "Kernel
 * contract"): checked when no keep or bias mask can hide keys inside the
 * range of keys the row's causal, window and length limits leave, and V
 * is not 8-bit (code times scale is rounded to float once widened, the
 * oracle's product is not). */
static void check_one_key_row(const mha_attention_args *args,
                              const double *w, int64_t lk, const float *o,
                              const double *want, int64_t dv,
                              const char *what, const char *isa)
{
    if ((args->mask && (args->mask->keep || args->mask->bias)) ||
        mha_dtype_size(args->v.dtype) == 1)
        return;
    int64_t seen = 0, at = 0;
    for (int64_t j = 0; j < lk; j++)
        if (w[j] != 0.0)
            seen++, at = j;
    if (seen != 1 || w[at] != 1.0)
        return;
    for (int64_t c = 0; c < dv; c++)
        REQUIRE((double)o[c] == want[c],
                "%s [%s]: a row seeing only key %lld: out[%lld] = %.9g, "
                "want its value %.9g exactly", what, isa, (long long)at,
                (long long)c, (double)o[c], want[c]);
}

void check_attention(const mha_attention_args *args, size_t out_floats,
                     int want_weights, int nthreads, const char *what)
{
    const mha_tensor *ov = &args->out;
    const int64_t B = args->q.batch, Lq = args->q.seq, H = args->q.heads;
    const int64_t Lk = args->k.seq, dv = args->v.dim;
    const size_t n_out = (size_t)(B * Lq * H * dv);
    const size_t n_w = (size_t)(B * H * Lq * Lk);
    double *want = test_alloc(n_out * sizeof *want);
    double *want_w = test_alloc(n_w * sizeof *want_w);
    oracle_attention(args, want, want_w);

    float *got = test_alloc(n_out * sizeof *got);
    float *got_w = want_weights ? test_alloc(n_w * sizeof *got_w) : NULL;
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        const char *isa = mha_isa_name(isas[t]);
        mha_engine *engine = make_engine(isas[t], nthreads);
        mha_attention_args a = *args;
        a.weights = got_w;
        fill_sentinel(ov->data, out_floats);
        if (got_w)
            fill_sentinel(got_w, n_w);
        mha_status st = mha_attention(engine, &a);
        ck_assert_msg(st == MHA_OK, "%s [%s]: %s (%s)", what, isa,
                      mha_status_string(st), mha_last_error());

        view_gather(ov, got);
        size_t worst;
        double r = tol_ratio(got, want, n_out, TOL_ATTN_ABS, TOL_ATTN_REL,
                             &worst);
        int64_t ix[4];
        split_bshd(worst, ov, ix);
        ck_assert_msg(r <= 1.0,
                      "%s [%s]: out[b %lld][i %lld][h %lld][c %lld] = %.9g, "
                      "want %.9g (ratio %.3g)",
                      what, isa, (long long)ix[0], (long long)ix[1],
                      (long long)ix[2], (long long)ix[3],
                      (double)got[worst], want[worst], r);
        ck_assert_msg(count_changed_outside(ov->data, out_floats, ov) == 0,
                      "%s [%s]: wrote outside the out view", what, isa);

        /* Rows the oracle finds fully masked must be exact zeros. */
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Lq; i++) {
                    const double *w = &want_w[((b * H + h) * Lq + i) * Lk];
                    int visible = 0;
                    for (int64_t j = 0; j < Lk && !visible; j++)
                        visible = w[j] != 0.0;
                    if (visible) {
                        check_one_key_row(args, w, Lk,
                                          &got[((b * Lq + i) * H + h) * dv],
                                          &want[((b * Lq + i) * H + h) * dv],
                                          dv, what, isa);
                        continue;
                    }
                    const float *o = &got[((b * Lq + i) * H + h) * dv];
                    for (int64_t c = 0; c < dv; c++)
                        REQUIRE(o[c] == 0.0f,
                                      "%s [%s]: fully masked row b %lld h "
                                      "%lld i %lld: out[%lld] = %g",
                                      what, isa, (long long)b, (long long)h,
                                      (long long)i, (long long)c,
                                      (double)o[c]);
                }
        if (got_w)
            check_weights(got_w, want_w, B * H * Lq, Lk, TOL_ATTN_ABS,
                          TOL_ATTN_REL, what, isa);
        mha_engine_destroy(engine);
    }
    free(want);
    free(want_w);
    free(got);
    free(got_w);
}

/* lse rows against the oracle's: -inf exactly where it is -inf. */
void check_lse(const float *got, const double *want, size_t n,
               const char *what, const char *isa)
{
    for (size_t i = 0; i < n; i++) {
        if (want[i] == -INFINITY) {
            REQUIRE(got[i] == -INFINITY, "%s [%s]: lse[%zu] = %g, want -inf",
                    what, isa, i, (double)got[i]);
            continue;
        }
        REQUIRE(fabs(got[i] - want[i]) <=
                    TOL_LSE_ABS + TOL_LSE_REL * fabs(want[i]),
                "%s [%s]: lse[%zu] = %.9g, want %.9g", what, isa, i,
                (double)got[i], want[i]);
    }
}

/* n floats as dtype t: the floats themselves, or their rounding. */
void *as_dtype(const float *x, size_t n, mha_dtype t)
{
    if (t == MHA_F32) {
        float *y = test_alloc(n * sizeof *y);
        memcpy(y, x, n * sizeof *y);
        return y;
    }
    uint16_t *y = test_alloc(n * sizeof *y);
    if (t == MHA_F16)
        mha_f32_to_f16(x, n, y);
    else
        mha_f32_to_bf16(x, n, y);
    return y;
}

void ws_layer_init(ws_layer *f, int64_t lk)
{
    test_rng r;
    rng_seed(&r, 0x5eedu);
    float *x[] = {f->w_in, f->b_in, f->w_out, f->b_out, f->query};
    size_t n[] = {3 * WS_E * WS_E, 3 * WS_E, WS_E * WS_E, WS_E, 3 * WS_E};
    for (int i = 0; i < 5; i++)
        for (size_t j = 0; j < n[i]; j++)
            x[i][j] = rng_uniform(&r);
    f->kv = random_floats(&r, (size_t)(lk * WS_E));
    f->desc = (mha_layer_desc){.embed_dim = WS_E, .num_heads = 2,
                               .in_proj_weight = f->w_in,
                               .in_proj_bias = f->b_in,
                               .out_proj_weight = f->w_out,
                               .out_proj_bias = f->b_out};
}
