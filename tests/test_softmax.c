/*
 * The fused scale + mask + online softmax step (softmax_update) of every
 * table this build and CPU can run (kernel_check.h), on edge tiles and
 * every mk_mask field alone and combined: keep (per row and broadcast),
 * bias (with -inf entries), the left edge diag_lo, the causal diagonal
 * diag_hi, a sliding window (both), key_limit, key_start, key_keep, the
 * score terms (softcap, ALiBi per row and shared), and rows that see nothing
 * (empty ranges on either side, lo past hi). Two consecutive tiles per
 * case, from a fresh state and from a running max above every score. The
 * reference is a double loop that decides visibility key by key from the
 * mask's definition (not through mk_visible_range); TOL_REF against it,
 * TOL_KERNEL against the generic table, and masked P, alpha = 1 and the
 * state of empty rows bitwise. A table's half compute steps (the bf16
 * path's, with a shorter exp) run every case as tables of their own, at
 * the same tolerances.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_check.h"

/* ---- softmax_update ---------------------------------------------------- */

enum {
    MV_NONE, MV_KEEP, MV_KEEP_BROADCAST, MV_BIAS, MV_BIAS_BROADCAST,
    MV_CAUSAL_0, MV_CAUSAL_NEG, MV_CAUSAL_POS, MV_CAUSAL_ALL,
    MV_LIMIT_0, MV_LIMIT_HALF, MV_LIMIT_ABOVE, MV_ALL,
    MV_LO_0, MV_LO_NEG, MV_LO_POS, MV_LO_ALL, MV_WINDOW, MV_WINDOW_CROSSED,
    MV_WINDOW_LIMIT, MV_WINDOW_ALL, MV_SOFTCAP, MV_ALIBI, MV_ALIBI_SHARED,
    MV_KEY_KEEP, MV_TERMS_ALL, MV_CAUSAL_PERIOD, MV_PERIOD_TERMS,
    N_MASK_VARIANTS
};
static const char *const MV_NAME[] = {
    "none", "keep", "keep ld 0", "bias", "bias ld 0", "causal 0",
    "causal -2", "causal n-m+3", "causal all hidden", "key_limit 0",
    "key_limit n/2", "key_limit n+100", "everything", "diag_lo 0",
    "diag_lo -3", "diag_lo 5", "diag_lo all hidden", "window [-4, 0]",
    "window lo > hi", "window + key_limit n/2",
    "window + keep + bias + key_limit", "softcap 2", "alibi per row",
    "alibi one query (step 0)", "key_keep + key_start",
    "softcap + alibi + key_keep + keep + bias + window",
    "causal -1, 2 rows a query, 3 queries a head",
    "causal 0 + keep + bias + alibi, 2 rows a query, 3 queries a head"};
_Static_assert(sizeof MV_NAME / sizeof MV_NAME[0] == N_MASK_VARIANTS,
               "a name per mask variant");

typedef struct mask_buf {
    mk_mask mask;
    uint8_t *keep, *key_keep;
    float *bias, *alibi;
} mask_buf;

/* Mask variant v for an m x n tile. Keep-masks hide every fifth row
 * entirely; biases have 20% -INFINITY and every fourth row all -INFINITY. */
static void make_mask(int v, int64_t m, int64_t n, test_rng *r, mask_buf *mb)
{
    memset(mb, 0, sizeof *mb);
    mb->mask.diag_lo = MK_NO_DIAG_LO;
    mb->mask.diag_hi = MK_NO_DIAG_HI;
    mb->mask.key_limit = n;
    int keep = v == MV_KEEP || v == MV_KEEP_BROADCAST || v == MV_ALL ||
               v == MV_WINDOW_ALL || v == MV_TERMS_ALL || v == MV_PERIOD_TERMS;
    int bias = v == MV_BIAS || v == MV_BIAS_BROADCAST || v == MV_ALL ||
               v == MV_WINDOW_ALL || v == MV_TERMS_ALL || v == MV_PERIOD_TERMS;
    /* Interleaved rows (a speculative decode block): 2 rows (heads) a
     * query, 3 queries a head pair; the keep and bias arrays hold a row
     * per (head, query), heads (n + 3) * 3 apart and queries n + 3, and
     * the slopes one per head. */
    int period = v == MV_PERIOD_TERMS;
    int64_t prows = (m / 6 + 1) * 6; /* rows of whole head pairs */
    if (v == MV_SOFTCAP || v == MV_TERMS_ALL)
        mb->mask.softcap = 2.0f;
    if (v == MV_ALIBI || v == MV_ALIBI_SHARED || v == MV_TERMS_ALL ||
        period) {
        mb->alibi = test_alloc((size_t)prows * sizeof(float));
        for (int64_t i = 0; i < prows; i++)
            mb->alibi[i] = 0.5f * rng_uniform(r);
        mb->mask.alibi = mb->alibi;
        mb->mask.alibi_ld = v == MV_ALIBI_SHARED ? 0 : 1;
        mb->mask.alibi_pos = v == MV_ALIBI ? n / 2 : -7;
        mb->mask.alibi_pos_step = v == MV_ALIBI_SHARED ? 0 : 1;
    }
    if (v == MV_KEY_KEEP || v == MV_TERMS_ALL) {
        mb->key_keep = test_alloc((size_t)n + 1);
        for (int64_t j = 0; j < n; j++)
            mb->key_keep[j] = rng_uniform(r) > -0.6f;
        mb->mask.key_keep = mb->key_keep;
        mb->mask.key_start = v == MV_KEY_KEEP ? n / 3 : 0;
    }
    if (v == MV_TERMS_ALL) {
        mb->mask.diag_lo = -6;
        mb->mask.diag_hi = 3;
    }
    if (keep) {
        ptrdiff_t ld = v == MV_KEEP_BROADCAST ? 0 : n + 3;
        int64_t rows = period ? prows : ld ? m : 1;
        mb->keep = test_alloc((size_t)((rows - 1) * ld + n));
        memset(mb->keep, 0x5a, (size_t)((rows - 1) * ld + n));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < n; j++)
                mb->keep[i * ld + j] =
                    (i % 5 == 4 || rng_uniform(r) < -0.4f) ? 0
                                                            : (uint8_t)(1 + j % 7);
        mb->mask.keep = mb->keep;
        mb->mask.keep_ld = period ? 3 * ld : ld;
        mb->mask.keep_qld = period ? ld : 0;
    }
    if (bias) {
        ptrdiff_t ld = v == MV_BIAS_BROADCAST ? 0 : n + 5;
        int64_t rows = period ? prows : ld ? m : 1;
        mb->bias = test_alloc((size_t)((rows - 1) * ld + n) * sizeof(float));
        fill_sentinel(mb->bias, (size_t)((rows - 1) * ld + n));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < n; j++) {
                float u = rng_uniform(r);
                mb->bias[i * ld + j] =
                    (ld && i % 4 == 2) || u < -0.6f ? -INFINITY : 3.0f * u;
            }
        mb->mask.bias = mb->bias;
        mb->mask.bias_ld = period ? 3 * ld : ld;
        mb->mask.bias_qld = period ? ld : 0;
    }
    switch (v) {
    case MV_CAUSAL_0: mb->mask.diag_hi = 0; break;
    case MV_CAUSAL_NEG: mb->mask.diag_hi = -2; break;
    case MV_CAUSAL_POS: mb->mask.diag_hi = n - m + 3; break;
    case MV_CAUSAL_ALL: mb->mask.diag_hi = -(m + 5); break;
    /* Rows interleaving queries (a speculative decode block across
     * heads): rows 2q and 2q + 1 are query q of 3, then the next head's
     * rows; query 0 sees no key, query 2 keys 0 and 1. */
    case MV_CAUSAL_PERIOD:
        mb->mask.diag_hi = -1;
        mb->mask.diag_rows = 2;
        mb->mask.diag_period = 3;
        break;
    case MV_PERIOD_TERMS:
        mb->mask.diag_hi = 0;
        mb->mask.diag_rows = 2;
        mb->mask.diag_period = 3;
        break;
    case MV_LIMIT_0: mb->mask.key_limit = 0; break;
    case MV_LIMIT_HALF: mb->mask.key_limit = n / 2; break;
    case MV_LIMIT_ABOVE: mb->mask.key_limit = n + 100; break;
    case MV_ALL:
        mb->mask.diag_hi = 1;
        mb->mask.key_limit = n - 1;
        break;
    /* Row i sees keys j >= i + diag_lo: with diag_lo 0 and 5 the last
     * rows of a wide-enough tile see nothing; n + 2 hides every key. */
    case MV_LO_0: mb->mask.diag_lo = 0; break;
    case MV_LO_NEG: mb->mask.diag_lo = -3; break;
    case MV_LO_POS: mb->mask.diag_lo = 5; break;
    case MV_LO_ALL: mb->mask.diag_lo = n + 2; break;
    /* A sliding window: keys i - 4 .. i (rows before 4 are cut at 0). */
    case MV_WINDOW:
        mb->mask.diag_lo = -4;
        mb->mask.diag_hi = 0;
        break;
    /* lo past hi: every row is empty, though neither edge alone hides
     * every key. */
    case MV_WINDOW_CROSSED:
        mb->mask.diag_lo = 2;
        mb->mask.diag_hi = 1;
        break;
    case MV_WINDOW_LIMIT:
        mb->mask.diag_lo = -6;
        mb->mask.diag_hi = 2;
        mb->mask.key_limit = n / 2;
        break;
    case MV_WINDOW_ALL:
        mb->mask.diag_lo = -5;
        mb->mask.diag_hi = 1;
        mb->mask.key_limit = n - 1;
        break;
    }
}

/* A row's query and head, from the definition of mk_mask: the row
 * itself, or its place among interleaved queries of several heads. */
static void ref_row(const mk_mask *mk, int64_t row, int64_t *q, int64_t *h)
{
    *q = *h = row;
    if (mk->diag_period > 0) {
        int64_t per_query = mk->diag_rows, queries = mk->diag_period;
        *q = row / per_query % queries;
        *h = row / (per_query * queries) * per_query + row % per_query;
    }
}

/* The row's bias at key j (bias set). */
static float ref_bias(const mk_mask *mk, int64_t row, int64_t j)
{
    int64_t q, h;
    ref_row(mk, row, &q, &h);
    return mk->bias[h * mk->bias_ld + q * mk->bias_qld + j];
}

/* Whether key j is hidden from a row, from the definition of mk_mask. */
static int ref_hidden(const mk_mask *mk, int64_t row, int64_t j)
{
    int64_t i, h; /* the row's query and head */
    ref_row(mk, row, &i, &h);
    if (mk->diag_lo != MK_NO_DIAG_LO && j < i + mk->diag_lo)
        return 1;
    if (mk->diag_hi != MK_NO_DIAG_HI && j > i + mk->diag_hi)
        return 1;
    if (j >= mk->key_limit || j < mk->key_start)
        return 1;
    if (mk->key_keep && mk->key_keep[j] == 0)
        return 1;
    return mk->keep &&
           mk->keep[h * mk->keep_ld + i * mk->keep_qld + j] == 0;
}

/* The reference step in double. s is read as float; p, row state as
 * double. */
static void ref_softmax_update(const float *s, ptrdiff_t lds, int64_t m,
                               int64_t n, float scale, const mk_mask *mk,
                               double *row_max, double *row_sum, double *p,
                               double *alpha)
{
    for (int64_t i = 0; i < m; i++) {
        double *pi = &p[i * n];
        double mx = row_max[i];
        for (int64_t j = 0; j < n; j++) {
            double x = (double)scale * s[i * lds + j];
            if (mk->softcap > 0.0f)
                x = mk->softcap * tanh(x / mk->softcap);
            int64_t q, h;
            ref_row(mk, i, &q, &h);
            if (mk->alibi)
                x += (double)mk->alibi[h * mk->alibi_ld] *
                     (double)(j - (mk->alibi_pos + q * mk->alibi_pos_step));
            if (mk->bias)
                x += ref_bias(mk, i, j);
            if (ref_hidden(mk, i, j))
                x = -INFINITY;
            pi[j] = x;
            if (x > mx)
                mx = x;
        }
        if (mx == -INFINITY) {
            for (int64_t j = 0; j < n; j++)
                pi[j] = 0.0;
            alpha[i] = 1.0;
            continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) {
            pi[j] = exp(pi[j] - mx);
            sum += pi[j];
        }
        alpha[i] = exp(row_max[i] - mx);
        row_sum[i] = row_sum[i] * alpha[i] + sum;
        row_max[i] = mx;
    }
}

/* What one table's softmax_update left after one tile. */
typedef struct sm_result {
    float *s, *row_max, *row_sum, *alpha;
} sm_result;

static void sm_free(sm_result *r)
{
    free(r->s), free(r->row_max), free(r->row_sum), free(r->alpha);
}

static float *copy_floats(const float *x, size_t n)
{
    float *y = out_buffer(n);
    memcpy(y, x, n * sizeof *y);
    return y;
}

/* Two consecutive tiles through each table, from state (init_max, 0),
 * the scores random times spread. */
static void softmax_case(const table_set *ts, int64_t m, int64_t n, int v,
                         float scale, float init_max, float spread,
                         test_rng *r)
{
    const ptrdiff_t lds = n + 3;
    const size_t ns = (size_t)(m * lds);
    float *tiles[2];
    for (int k = 0; k < 2; k++) {
        tiles[k] = random_floats(r, ns);
        for (size_t x = 0; x < ns; x++)
            tiles[k][x] *= spread;
    }
    mask_buf mb;
    make_mask(v, m, n, r, &mb);

    /* Reference: both tiles, keeping the state after each. */
    double *p_ref[2], *alpha_ref[2], *max_ref[2], *sum_ref[2];
    double *rm = test_alloc((size_t)m * sizeof *rm);
    double *rs = test_alloc((size_t)m * sizeof *rs);
    for (int64_t i = 0; i < m; i++)
        rm[i] = init_max, rs[i] = 0.0;
    for (int k = 0; k < 2; k++) {
        p_ref[k] = test_alloc((size_t)(m * n) * sizeof(double));
        alpha_ref[k] = test_alloc((size_t)m * sizeof(double));
        ref_softmax_update(tiles[k], lds, m, n, scale, &mb.mask, rm, rs,
                           p_ref[k], alpha_ref[k]);
        max_ref[k] = test_alloc((size_t)m * sizeof(double));
        sum_ref[k] = test_alloc((size_t)m * sizeof(double));
        memcpy(max_ref[k], rm, (size_t)m * sizeof(double));
        memcpy(sum_ref[k], rs, (size_t)m * sizeof(double));
    }
    /* Error scales: P and alpha lie in [0, 1], so 1 is their scale; the row
     * sum is a sum of positive terms, its own scale; the max is relative to
     * itself. Masked P entries and the state of fully masked rows (alpha 1,
     * max -inf, sum unchanged) must be exact. P, alpha and the sum carry the
     * rounding of the argument x (scale s, plus the ALiBi term, bias...)
     * to float: an error of |x| 2^-24 in exp's exponent, |max| 2^-24 of P
     * relative near the row's maximum (further down P is small enough for
     * the absolute tolerance), in any fp32 implementation; generic and a
     * kernel may round it apart, so the scale grows by |max| 2^-23 over
     * the relative tolerance. It matters only where the arguments are
     * large: ALiBi at distances in the hundreds gives |max| ~ 250, where
     * two tables' sums differ by 1.4e-5 relative; at |max| <= 9 (every
     * other variant) it adds a tenth. */
    double *mag_sum = test_alloc((size_t)m * sizeof *mag_sum);
    double *mag_alpha = test_alloc((size_t)m * sizeof *mag_alpha);
    double *mag_p = test_alloc((size_t)(m * n) * sizeof *mag_p);
    unsigned char *exact_p = test_alloc((size_t)(m * n));
    unsigned char *exact_row = test_alloc((size_t)m);
    unsigned char *exact_alpha = test_alloc((size_t)m);
    double *mag_max = test_alloc((size_t)m * sizeof *mag_max);

    sm_result gen[2];
    for (int x = 0; x < ts->n; x++) {
        const mk_table *t = &ts->t[x];
        float *row_max = out_buffer((size_t)m);
        float *row_sum = out_buffer((size_t)m);
        float *alpha = out_buffer((size_t)m);
        for (int64_t i = 0; i < m; i++)
            row_max[i] = init_max, row_sum[i] = 0.0f;
        for (int k = 0; k < 2; k++) {
            sm_result got;
            /* Padding columns of the tile hold the sentinel. */
            got.s = out_buffer(ns);
            for (int64_t i = 0; i < m; i++)
                memcpy(&got.s[i * lds], &tiles[k][i * lds],
                       (size_t)n * sizeof(float));
            fill_sentinel(alpha, (size_t)m);
            t->softmax_update(got.s, lds, m, n, scale, &mb.mask, row_max,
                              row_sum, alpha);
            got.row_max = copy_floats(row_max, (size_t)m);
            got.row_sum = copy_floats(row_sum, (size_t)m);
            got.alpha = copy_floats(alpha, (size_t)m);

            for (int64_t i = 0; i < m; i++) {
                int dead = max_ref[k][i] == -INFINITY;
                exact_row[i] = (unsigned char)dead;
                mag_max[i] = fabs(max_ref[k][i]);
                const double arg =
                    dead ? 1.0
                         : 1.0 + mag_max[i] * 0x1p-23 / TOL_KERNEL_REL;
                mag_sum[i] = sum_ref[k][i] * arg;
                mag_alpha[i] = arg;
                for (int64_t j = 0; j < n; j++) {
                    mag_p[i * n + j] = arg;
                    exact_p[i * n + j] =
                        dead || ref_hidden(&mb.mask, i, j) ||
                        (mb.mask.bias &&
                         ref_bias(&mb.mask, i, j) == -INFINITY);
                }
            }
            expect e = {.isa = t->name};
            snprintf(e.shape, sizeof e.shape,
                     "tile %d m %lld n %lld lds %td mask %s scale %g "
                     "initial max %g",
                     k, (long long)m, (long long)n, lds, MV_NAME[v],
                     (double)scale, (double)init_max);
            const sm_result *g = x ? &gen[k] : NULL;
            e.kernel = "softmax_update P";
            expect_both(&e, x == 0, got.s, g ? g->s : NULL, m, n, lds,
                        p_ref[k], mag_p, exact_p);
            /* A maximum that did not move rescales by exactly 1 (an lse
             * of a sink alone stays the sink: the exp of 0 is 1). */
            for (int64_t i = 0; i < m; i++)
                exact_alpha[i] = exact_row[i] || alpha_ref[k][i] == 1.0;
            e.kernel = "softmax_update alpha";
            expect_both(&e, x == 0, got.alpha, g ? g->alpha : NULL, m, 1, 1,
                        alpha_ref[k], mag_alpha, exact_alpha);
            e.kernel = "softmax_update row_sum";
            expect_both(&e, x == 0, got.row_sum, g ? g->row_sum : NULL, m, 1,
                        1, sum_ref[k], mag_sum, exact_row);
            e.kernel = "softmax_update row_max";
            expect_both(&e, x == 0, got.row_max, g ? g->row_max : NULL, m, 1,
                        1, max_ref[k], mag_max, exact_row);
            if (x == 0)
                gen[k] = got;
            else
                sm_free(&got);
        }
        free(row_max), free(row_sum), free(alpha);
    }
    for (int k = 0; k < 2; k++) {
        sm_free(&gen[k]);
        free(tiles[k]), free(p_ref[k]), free(alpha_ref[k]);
        free(max_ref[k]), free(sum_ref[k]);
    }
    free(rm), free(rs), free(mag_p), free(mag_alpha), free(exact_p);
    free(exact_row);
    free(exact_alpha);
    free(mag_max), free(mag_sum), free(mb.keep), free(mb.bias), free(mb.alibi);
    free(mb.key_keep);
}

/* The tables plus, for each half dtype a table has slots for whose step
 * is not the table's own softmax_update, a copy whose softmax_update is
 * that step. */
static table_set with_half_steps(const table_set *ts)
{
    static const char *const name[MK_HALF_COUNT] = {
        "softmax_update of bf16", "softmax_update of f16"};
    table_set all = *ts;
    for (int x = 0; x < ts->n; x++)
        for (int h = 0; h < MK_HALF_COUNT; h++) {
            mk_softmax_update_fn *f = ts->t[x].half[h].softmax_update;
            if (!f || f == ts->t[x].softmax_update ||
                (h > 0 && f == ts->t[x].half[h - 1].softmax_update))
                continue;
            ck_assert_int_lt(all.n, TEST_MAX_ISAS);
            all.isa[all.n] = ts->isa[x];
            all.t[all.n] = ts->t[x];
            all.t[all.n].softmax_update = f;
            all.t[all.n].name = name[h];
            all.n++;
        }
    return all;
}

static void softmax_tile(const table_set *tables, int64_t m, int64_t n,
                         test_rng *r)
{
    const table_set all = with_half_steps(tables);
    const table_set *ts = &all;
    for (int v = 0; v < N_MASK_VARIANTS; v++) {
        /* Fresh state, or a running max (9) above every score (< 8.2),
         * where alpha must be 1. */
        float init = (m + n + v) % 3 == 0 ? 9.0f : -INFINITY;
        float scale = v % 2 ? 0.125f : 1.3f;
        softmax_case(ts, m, n, v, scale, init, 4.0f, r);
    }
}

/* A scale near FLT_MAX over scores near FLT_MIN (their products moderate,
 * up to 32): scale times log2(e) overflows a float, so the base-2 exp
 * (softmax_driver.h) must leave such a scale to the plain exp. Found by
 * the fuzz target (weights NaN at scale 3.4e38). */
static void softmax_huge_scale_tile(const table_set *tables, int64_t m,
                                    int64_t n, test_rng *r)
{
    const table_set all = with_half_steps(tables);
    const float scales[] = {FLT_MAX, 0x1p127f, 0x1p120f};
    for (int x = 0; x < 3; x++)
        softmax_case(&all, m, n, x, scales[x], -INFINITY,
                     32.0f / scales[x], r);
}

START_TEST(softmax_huge_scale)
{
    for_edge_tiles(2, softmax_huge_scale_tile, 41);
}
END_TEST

START_TEST(softmax_update_edges)
{
    for_edge_tiles(4, softmax_tile, 37);
}
END_TEST

/* A mask that hides nothing from n keys. */
static mk_mask open_mask(int64_t n)
{
    mk_mask mask;
    memset(&mask, 0, sizeof mask);
    mask.diag_lo = MK_NO_DIAG_LO;
    mask.diag_hi = MK_NO_DIAG_HI;
    mask.key_limit = n;
    return mask;
}

/* Table x's softmax step (h = 0) or its half dtype h - 1's (NULL when it
 * has none), and the words naming it after "softmax_update". */
static mk_softmax_update_fn *step_of(const table_set *ts, int x, int h)
{
    return h ? ts->t[x].half[h - 1].softmax_update : ts->t[x].softmax_update;
}
static const char *const step_name[1 + MK_HALF_COUNT] = {"", " of bf16",
                                                          " of f16"};

/* The exp inside softmax_update on its own: one row of scores spread over
 * [-44, 0] (a maximum of exactly 0, scale 1, so P[j] = exp(s[j]) of the
 * score as stored; from about -44.7, 2^MK_EXP_FLOOR_LOG2, down P is 0:
 * softmax_underflow_is_zero), against the double exp at a bound far tighter
 * than the attention tolerances: 2.5e-7 relative (about 2 ulp; the inline
 * polynomials measured 1.2e-7 and 2.1e-7) for softmax_update, 1e-5 for a
 * half dtype's step (its P is rounded to bf16, 2^-9, or f16, 2^-12, next;
 * the bf16 exp measured 6.4e-6), plus |x| 2^-23: a pass in base 2
 * (softmax_driver.h, sm_exp2) rounds its argument x log2(e) to float, as
 * any float exp(x - max) rounds x - max when max is not 0 (an absolute
 * error of P below 4.4e-8 everywhere: e^x |x| 2^-23 <= 2^-23 / e). */
START_TEST(softmax_exp_accuracy)
{
    table_set ts;
    get_tables(&ts);
    const int64_t n = 4099;
    float *s = test_alloc((size_t)n * sizeof *s);
    float *x = test_alloc((size_t)n * sizeof *x);
    const mk_mask mask = open_mask(n);
    for (int64_t j = 0; j < n; j++) /* 0, then a fine irregular grid */
        x[j] = j == 0 ? 0.0f
                      : -44.0f * (float)((j * 2654435761u) % 1000003u) /
                            1000003.0f;
    for (int x_ = 0; x_ < ts.n; x_++)
        for (int h = 0; h <= MK_HALF_COUNT; h++) {
            mk_softmax_update_fn *f = step_of(&ts, x_, h);
            if (!f)
                continue;
            const double base = h && f != ts.t[x_].softmax_update ? 1e-5
                                                                  : 2.5e-7;
            memcpy(s, x, (size_t)n * sizeof *s);
            float mx = -INFINITY, sum = 0.0f, alpha = 0.0f;
            f(s, n, 1, n, 1.0f, &mask, &mx, &sum, &alpha);
            REQUIRE(mx == 0.0f, "softmax_update%s [%s]: max %a, want 0",
                    step_name[h], mha_isa_name(ts.isa[x_]),
                    (double)mx);
            double worst = 0.0, bound = base;
            int64_t at = 0;
            for (int64_t j = 0; j < n; j++) {
                double want = exp((double)x[j]);
                double err = fabs((double)s[j] - want) / want;
                double allowed = base + fabs((double)x[j]) * 0x1p-23;
                if (err / allowed > worst / bound)
                    worst = err, bound = allowed, at = j;
            }
            REQUIRE(worst <= bound,
                    "softmax_update%s [%s]: exp(%a) = %a, want %a: relative "
                    "error %.3g > %.3g", step_name[h],
                    mha_isa_name(ts.isa[x_]), (double)x[at], (double)s[at],
                    exp((double)x[at]), worst, bound);
        }
    free(s);
    free(x);
}
END_TEST

/* The softcap inside softmax_update on its own: rows of one key each, so
 * each row's maximum is its capped score x = cap tanh(s / cap) exactly as
 * the step computed it (softmax_driver.h's sm_capped over the table's
 * primitives). s sweeps |s| / cap from 2^-14 (where x is s itself) to
 * 2^6 on a fine irregular grid, both signs, the neighbours of the two
 * formulas' seam (|y| = 5/8), and 0 and 1e30; caps 1, 30 and 1e30 (x / cap
 * rescaled by 2^-64 on the way). Against the double tanh, relative to x:
 * 3e-7, about 5 ulp of x (tanh measured 0.7 ulp near 0 and 1.4 ulp beyond
 * 5/8 with a correctly rounded exp; each table's exp adds its own ulp, and
 * y = s / cap rounds, as does cap (1 - q) beyond the seam). A row of one moderate
 * score takes the polynomial alone (sm_scale_mask_terms); the same score
 * beside -FLT_MAX (capped to -cap, never above it) takes both halves: its
 * maximum must come out with the same bits. */
START_TEST(softmax_tanh_accuracy)
{
    table_set ts;
    get_tables(&ts);
    enum { N = 6000 };
    /* The step writes P over s: the scores are kept in in[]. */
    float *s = test_alloc(N * sizeof *s), *y = test_alloc(N * sizeof *y);
    float *in = test_alloc(N * sizeof *in);
    float *mx = test_alloc(N * sizeof *mx), *sum = test_alloc(N * sizeof *sum);
    float *alpha = test_alloc(N * sizeof *alpha);
    float *s2 = test_alloc(2 * N * sizeof *s2);
    float *mx2 = test_alloc(N * sizeof *mx2);
    const mk_mask open = open_mask(1);
    for (int64_t j = 0; j < N; j++) {
        double u = (double)((j * 2654435761u) % 1000003u) / 1000003.0;
        y[j] = (float)ldexp(1.0, -14 + (int)(20 * u)) * (float)(1.0 + u);
        y[j] = j % 2 ? -y[j] : y[j];
    }
    const float seam[6] = {0.625f, 0x1.3ffffep-1f, 0x1.400002p-1f, 0.0f,
                           1e30f, 4.0f};
    for (int k = 0; k < 6; k++)
        y[k] = seam[k], y[6 + k] = -seam[k];
    const float caps[3] = {1.0f, 30.0f, 1e30f};
    for (int c = 0; c < 3; c++)
        for (int x_ = 0; x_ < ts.n; x_++)
            for (int h = 0; h <= MK_HALF_COUNT; h++) {
                mk_softmax_update_fn *f = step_of(&ts, x_, h);
                if (!f)
                    continue;
                mk_mask mask = open;
                mask.softcap = caps[c];
                for (int64_t j = 0; j < N; j++) {
                    /* s = y cap, unless that overflows: then y is huge. */
                    in[j] = s[j] = fabsf(y[j]) >= 1e29f && c == 2
                                       ? y[j]
                                       : y[j] * caps[c];
                    mx[j] = -INFINITY, sum[j] = 0.0f;
                }
                f(s, 1, N, 1, 1.0f, &mask, mx, sum, alpha);
                mask.key_limit = 2;
                for (int64_t j = 0; j < N; j++) {
                    s2[2 * j] = in[j], s2[2 * j + 1] = -FLT_MAX;
                    mx2[j] = -INFINITY, sum[j] = 0.0f;
                }
                f(s2, 2, N, 2, 1.0f, &mask, mx2, sum, alpha);
                for (int64_t j = 0; j < N; j++)
                    REQUIRE(memcmp(&mx[j], &mx2[j], sizeof *mx) == 0,
                            "softmax_update%s [%s]: cap %g, s %a: x %a alone, "
                            "%a beside -FLT_MAX", step_name[h],
                            mha_isa_name(ts.isa[x_]), (double)caps[c],
                            (double)in[j], (double)mx[j], (double)mx2[j]);
                double worst = 0.0;
                int64_t at = 0;
                for (int64_t j = 0; j < N; j++) {
                    double want = (double)caps[c] *
                                  tanh((double)in[j] / (double)caps[c]);
                    double err = fabs((double)mx[j] - want);
                    double rel = want != 0.0 ? err / fabs(want)
                                             : (err == 0.0 ? 0.0 : 1.0);
                    if (rel > worst)
                        worst = rel, at = j;
                }
                REQUIRE(worst <= 3e-7,
                        "softmax_update%s [%s]: cap %g, s %a: x %a, want %a: "
                        "relative error %.3g > 3e-7", step_name[h],
                        mha_isa_name(ts.isa[x_]), (double)caps[c],
                        (double)in[at], (double)mx[at],
                        (double)caps[c] * tanh((double)in[at] / caps[c]),
                        worst);
                if (c == 1)
                    printf("softcap tanh%s [%s]: worst relative error "
                           "%.3g (%.2f x 2^-24)\n", step_name[h],
                           mha_isa_name(ts.isa[x_]), worst,
                           worst * 0x1p24);
            }
    free(s), free(y), free(in), free(mx), free(sum), free(alpha);
    free(s2), free(mx2);
}
END_TEST

/* Scores far below their row's maximum: P is exactly 0 from the floor of
 * kernels.h down (2^MK_EXP_FLOOR_LOG2, x - max about -44.7), and kept
 * above it, on every table: never a subnormal or a P near FLT_MIN, whose
 * P·V sums pass through subnormals (an x86 core computes on those through
 * microcode assists: scores 95 below their maxima made a call 71 times
 * slower on Intel; docs/benchmarks.md). Rows of one maximum and 4098
 * scores spread over [max - 400, max - 43], some -inf: P is 0 below the
 * floor's x - max less 0.01, above 0 over it plus 0.01, and 0 or at least
 * 2^(MK_EXP_FLOOR_LOG2 - 0.1) between. At maxima 0 and 3 (the base-2
 * pass) and 5000 (past sm_exp2_args' 4096: the plain exp), scales 1 and
 * 0.5 (the maximum and the gaps scaled), and with a bias of zeros (scores
 * written back scaled). Each step's P of the maximum is its exp(0),
 * within the exp accuracy bound above, and its sum is at least that P. */
START_TEST(softmax_underflow_is_zero)
{
    table_set ts;
    get_tables(&ts);
    const int64_t n = 4099;
    float *s = test_alloc((size_t)n * sizeof *s);
    float *x = test_alloc((size_t)n * sizeof *x);
    float *zeros = test_alloc((size_t)n * sizeof *zeros);
    memset(zeros, 0, (size_t)n * sizeof *zeros);
    static const float maxima[] = {0.0f, 3.0f, 5000.0f};
    static const float scales[] = {1.0f, 0.5f};
    int checked = 0;
    for (int mi = 0; mi < 3; mi++)
        for (int si = 0; si < 2; si++)
            for (int biased = 0; biased < 2; biased++) {
                const float scale = scales[si], mx = maxima[mi];
                for (int64_t j = 0; j < n; j++) /* the maximum at j = 7 */
                    x[j] = j == 7 ? mx / scale
                           : j % 97 == 3
                               ? -INFINITY
                               : (mx - 43.0f -
                                  357.0f * (float)((j * 2654435761u) %
                                                   1000003u) /
                                      1000003.0f) /
                                     scale;
                mk_mask mask = open_mask(n);
                if (biased)
                    mask.bias = zeros;
                for (int x_ = 0; x_ < ts.n; x_++)
                    for (int h = 0; h <= MK_HALF_COUNT; h++) {
                        mk_softmax_update_fn *f = step_of(&ts, x_, h);
                        if (!f)
                            continue;
                        memcpy(s, x, (size_t)n * sizeof *s);
                        float m = -INFINITY, sum = 0.0f, alpha = 0.0f;
                        f(s, n, 1, n, scale, &mask, &m, &sum, &alpha);
                        const char *isa = mha_isa_name(ts.isa[x_]);
                        REQUIRE(m == mx, "softmax_update%s [%s]: max %a, "
                                "want %a", step_name[h], isa, (double)m,
                                (double)mx);
                        REQUIRE(fabs((double)s[7] - 1.0) <= 1e-5 &&
                                    sum >= s[7],
                                "softmax_update%s [%s]: P of the maximum %a "
                                "and sum %a, want exp(0) and at least that",
                                step_name[h], isa, (double)s[7], (double)sum);
                        const double edge = MK_EXP_FLOOR_LOG2 * log(2.0);
                        const double least = exp2(MK_EXP_FLOOR_LOG2 - 0.1);
                        for (int64_t j = 0; j < n; j++) {
                            const double gap = (double)x[j] * scale - mx;
                            const int ok =
                                j == 7 ||
                                (gap < edge - 0.01   ? s[j] == 0.0f
                                 : gap > edge + 0.01 ? s[j] > 0.0f
                                                     : s[j] == 0.0f ||
                                                           s[j] >= least);
                            REQUIRE(ok,
                                    "softmax_update%s [%s] (max %g, scale "
                                    "%g, bias %d): P = %a at x - max = %g, "
                                    "the floor at %g",
                                    step_name[h], isa, (double)mx,
                                    (double)scale, biased, (double)s[j], gap,
                                    edge);
                        }
                        checked++;
                    }
            }
    ck_assert_int_ge(checked, 12 * ts.n);
    free(s), free(x), free(zeros);
}
END_TEST

/* A row that sees one key which is its maximum gets P = 1 exactly (and a
 * sum of 1), so its output is that key's value row bit for bit, as
 * PyTorch's exp(0) = 1 gives: a one-key tile, and the first row under a
 * causal diagonal, from a fresh state, on every table. */
START_TEST(softmax_single_key_exact)
{
    table_set ts;
    get_tables(&ts);
    const table_set all = with_half_steps(&ts);
    test_rng r;
    rng_seed(&r, 61);
    const int64_t m = 19;
    for (int causal = 0; causal < 2; causal++) {
        const int64_t n = causal ? 40 : 1;
        float *s = random_floats(&r, (size_t)(m * n));
        for (int x = 0; x < all.n; x++) {
            float *got = copy_floats(s, (size_t)(m * n));
            float row_max[19], row_sum[19], alpha[19];
            for (int64_t i = 0; i < m; i++)
                row_max[i] = -INFINITY, row_sum[i] = 0.0f;
            mk_mask mask = open_mask(n);
            if (causal)
                mask.diag_hi = 0;
            all.t[x].softmax_update(got, n, m, n, 0.3f, &mask, row_max,
                                    row_sum, alpha);
            for (int64_t i = 0; i < (causal ? 1 : m); i++)
                REQUIRE(got[i * n] == 1.0f && row_sum[i] == 1.0f,
                        "%s: row %lld of %s sees one key: P = %a, sum %a, "
                        "want exactly 1", all.t[x].name, (long long)i,
                        causal ? "a causal tile" : "a one-key tile",
                        (double)got[i * n], (double)row_sum[i]);
            free(got);
        }
        free(s);
    }
}
END_TEST

/* The codes pair of the half slots (kernels.h): softmax_update_codes
 * leaves, bit for bit, softmax_update's state and its P rounded to the
 * half dtype in each row's first bytes (a zero code after an odd n, zeros
 * outside the visible range, an empty row all zeros, P = 1 exactly for a
 * row's one visible maximum), and pv_codes on those codes writes what pv
 * writes on the float P. Tiles: a causal diagonal with a window's left
 * edge (rows of one key, rows empty in this tile), a key limit, keep and
 * bias with -inf, odd and even n, a state carried over from an earlier
 * block. */
START_TEST(softmax_half_codes)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, 67);
    int checked = 0;
    for (int x = 0; x < ts.n; x++)
        for (int h = 0; h < MK_HALF_COUNT; h++) {
            const mk_half_slots *hs = &ts.t[x].half[h];
            REQUIRE(!hs->softmax_update_codes == !hs->pv_codes,
                    "[%s] half %d: the codes pair is both slots or neither",
                    mha_isa_name(ts.isa[x]), h);
            if (!hs->softmax_update_codes)
                continue;
            checked++;
            for (int kind = 0; kind < 4; kind++)
                for (int64_t n = 37; n <= 64; n += 27) {
                    const int64_t m = 21, lds = n + 3, dv = 40;
                    mk_mask mask;
                    memset(&mask, 0, sizeof mask);
                    mask.diag_lo = kind == 0 ? -3 : MK_NO_DIAG_LO;
                    mask.diag_hi = kind == 0 ? -2 : MK_NO_DIAG_HI;
                    mask.key_limit = kind == 1 ? n - 5 : n;
                    uint8_t *keep = NULL;
                    float *bias = NULL;
                    if (kind == 2) {
                        keep = test_alloc((size_t)(m * n));
                        for (int64_t i = 0; i < m * n; i++)
                            keep[i] = (uint8_t)(i % 5 != 1 && i / n != 4);
                        mask.keep = keep, mask.keep_ld = n;
                    }
                    if (kind == 3) {
                        bias = random_floats(&r, (size_t)(m * n));
                        for (int64_t i = 0; i < m * n; i += 3)
                            bias[i] = -INFINITY;
                        mask.bias = bias, mask.bias_ld = n;
                    }
                    float *sc = random_floats(&r, (size_t)(m * lds));
                    for (int64_t i = 0; i < m * lds; i++)
                        sc[i] *= 9.0f;
                    float *pf = copy_floats(sc, (size_t)(m * lds));
                    float *pc = copy_floats(sc, (size_t)(m * lds));
                    float st[2][3][21];
                    for (int g = 0; g < 2; g++)
                        for (int64_t i = 0; i < m; i++)
                            st[g][0][i] = i % 3 ? -INFINITY : 1.5f,
                            st[g][1][i] = i % 3 ? 0.0f : 2.0f;
                    hs->softmax_update(pf, lds, m, n, 0.2f, &mask, st[0][0],
                                       st[0][1], st[0][2]);
                    hs->softmax_update_codes(pc, lds, m, n, 0.2f, &mask,
                                             st[1][0], st[1][1], st[1][2]);
                    REQUIRE(memcmp(st[0], st[1], sizeof st[0]) == 0,
                            "[%s] half %d kind %d n %lld: the codes step's "
                            "row_max, row_sum or alpha differ",
                            mha_isa_name(ts.isa[x]), h, kind, (long long)n);
                    for (int64_t i = 0; i < m; i++) {
                        uint16_t want[66];
                        if (h == MK_HALF_BF16)
                            mha_f32_to_bf16(pf + i * lds, (size_t)n, want);
                        else
                            mha_f32_to_f16(pf + i * lds, (size_t)n, want);
                        want[n] = 0;
                        const uint16_t *got =
                            (const uint16_t *)(const void *)(pc + i * lds);
                        REQUIRE(memcmp(got, want, (size_t)(n + (n & 1)) *
                                                      sizeof *got) == 0,
                                "[%s] half %d kind %d n %lld row %lld: codes "
                                "are not the float step's P rounded",
                                mha_isa_name(ts.isa[x]), h, kind,
                                (long long)n, (long long)i);
                    }
                    /* pv on the float P and pv_codes on the codes. */
                    uint16_t *v = test_alloc((size_t)(n * dv) * 2);
                    float *vf = random_floats(&r, (size_t)(n * dv));
                    if (h == MK_HALF_BF16)
                        mha_f32_to_bf16(vf, (size_t)(n * dv), v);
                    else
                        mha_f32_to_f16(vf, (size_t)(n * dv), v);
                    size_t vpf = hs->packed_v_floats(n, dv);
                    float *vp = test_alloc(vpf * sizeof *vp);
                    hs->pack_v(v, dv, n, dv, vp,
                               (ptrdiff_t)hs->packed_v_floats(n, 1));
                    float *o[2];
                    for (int g = 0; g < 2; g++) {
                        o[g] = test_alloc((size_t)(m * dv) * sizeof(float));
                        for (int64_t i = 0; i < m * dv; i++)
                            o[g][i] = (float)(i % 7) - 3.0f;
                    }
                    hs->pv(pf, lds, m, n, vp,
                           (ptrdiff_t)hs->packed_v_floats(n, 1), dv,
                           st[0][2], o[0], dv);
                    hs->pv_codes(pc, lds, m, n, vp,
                                 (ptrdiff_t)hs->packed_v_floats(n, 1), dv,
                                 st[1][2], o[1], dv);
                    REQUIRE(memcmp(o[0], o[1],
                                   (size_t)(m * dv) * sizeof(float)) == 0,
                            "[%s] half %d kind %d n %lld: pv_codes differs "
                            "from pv", mha_isa_name(ts.isa[x]), h, kind,
                            (long long)n);
                    free(o[0]), free(o[1]), free(vp), free(vf), free(v);
                    free(sc), free(pf), free(pc), free(keep), free(bias);
                }
        }
    printf("half codes pair checked on %d slot set(s)\n", checked);
}
END_TEST

Suite *suite_softmax(void)
{
    Suite *s = suite_create("softmax");
    TCase *tc = tcase_create("softmax");
    tcase_add_test(tc, softmax_update_edges);
    tcase_add_test(tc, softmax_huge_scale);
    tcase_add_test(tc, softmax_exp_accuracy);
    tcase_add_test(tc, softmax_tanh_accuracy);
    tcase_add_test(tc, softmax_underflow_is_zero);
    tcase_add_test(tc, softmax_single_key_exact);
    tcase_add_test(tc, softmax_half_codes);
    suite_add_tcase(s, tc);
    return s;
}
