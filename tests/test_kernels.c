/*
 * Every slot of every kernel table this build and CPU can run, on edge
 * shapes: m below / equal to / above block_q, n below / equal to / above
 * block_k, depths 1, 3, 17, 64, 129, prime row strides, rows that are
 * entirely masked, every mk_mask field; the decode kernels on every row
 * count 1..MK_DECODE_ROWS, key counts around any key grouping, widths
 * 1..130, each element type, and bitwise determinism across m, n and the
 * column position.
 *
 * Each kernel is checked against plain double loops (TOL_REF); a table
 * other than the generic one is also checked against the generic table's
 * float result (TOL_KERNEL). For sums the relative tolerance applies to
 * the sum of the absolute values of the terms, the scale of the rounding
 * error. Outputs start sentinel-filled: bytes a kernel must not write
 * (row padding, past the end) are checked untouched.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "util.h"

/* ---- Tables ----------------------------------------------------------- */

typedef struct table_set {
    int n;
    mha_isa isa[TEST_MAX_ISAS];
    mk_table t[TEST_MAX_ISAS]; /* t[0] is generic */
} table_set;

/* The tables of the ISAs the tests run (available_isas: generic first). */
static void get_tables(table_set *ts)
{
    ts->n = available_isas(ts->isa);
    ck_assert_msg(ts->n >= 1 && ts->isa[0] == MHA_ISA_GENERIC,
                  "no generic table first");
    for (int i = 0; i < ts->n; i++) {
        mha_isa picked;
        ck_assert_msg(mha_dispatch(ts->isa[i], &picked, &ts->t[i]) == MHA_OK,
                      "%s: %s", mha_isa_name(ts->isa[i]), mha_last_error());
        ck_assert_int_eq(picked, ts->isa[i]);
    }
    /* Every slot is filled (a missing kernel falls back to generic). */
    for (int i = 0; i < ts->n; i++) {
        const mk_table *t = &ts->t[i];
        ck_assert_msg(t->name && t->block_q > 0 && t->block_k > 0 &&
                          t->packed_floats && t->pack && t->qk &&
                          t->softmax_update && t->pv && t->normalize &&
                          t->decode_qk && t->decode_pv &&
                          t->widen[MK_F32] && t->widen[MK_F16] &&
                          t->widen[MK_BF16] && t->linear &&
                          t->fma_chains && t->fma_chains_flops > 0,
                      "table %s has an empty slot", mha_isa_name(ts->isa[i]));
        ck_assert_str_eq(t->name, mha_isa_name(ts->isa[i]));
    }
}

/* ---- Checking helpers ------------------------------------------------- */

/* A sentinel-filled buffer of n floats plus a guard zone. */
#define GUARD 19
static float *out_buffer(size_t n)
{
    float *x = test_alloc((n + GUARD) * sizeof *x);
    fill_sentinel(x, n + GUARD);
    return x;
}

/* m x n results at stride ld in buf (sized m*ld, whose padding columns and
 * guard must hold the sentinel) against want with error scale mag:
 * |got - want| <= abs + rel * mag. Where exact is non-NULL and nonzero the
 * value must be bitwise want (exact zeros, -inf). */
typedef struct expect {
    const char *kernel, *isa, *against;
    char shape[160];
} expect;

static void expect_matrix(const expect *e, const float *buf, int64_t m,
                          int64_t n, ptrdiff_t ld, const double *want,
                          const double *mag, const unsigned char *exact,
                          double abs, double rel)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double g = buf[i * ld + j], w = want[i * n + j];
            int ok = exact && exact[i * n + j]
                         ? (g == w || (isnan(g) && isnan(w)))
                         : fabs(g - w) <= abs + rel * mag[i * n + j];
            REQUIRE(ok, "%s [%s vs %s] %s: [%lld][%lld] = %.9g, want %.9g",
                    e->kernel, e->isa, e->against, e->shape, (long long)i,
                    (long long)j, g, w);
        }
    /* Padding columns and the guard zone. */
    size_t total = (size_t)((m > 0 ? (m - 1) * ld : 0) + n);
    size_t span = (size_t)(m * ld) > total ? (size_t)(m * ld) : total;
    for (size_t x = 0; x < span + GUARD; x++) {
        int64_t i = ld > 0 ? (int64_t)x / ld : 0;
        int64_t j = ld > 0 ? (int64_t)x % ld : (int64_t)x;
        int inside = x < total && i < m && j < n;
        REQUIRE(inside || count_changed(&buf[x], 1) == 0,
                "%s [%s] %s: wrote padding at offset %zu (row %lld col %lld)",
                e->kernel, e->isa, e->shape, x, (long long)i, (long long)j);
    }
}

static double *widen_floats(const float *x, int64_t m, int64_t n,
                            ptrdiff_t ld)
{
    double *y = test_alloc((size_t)(m * n) * sizeof *y);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            y[i * n + j] = x[i * ld + j];
    return y;
}

/* Checks got against the double reference and, for a table other than
 * generic, against the generic table's result gen. */
static void expect_both(expect *e, int is_generic, const float *got,
                        const float *gen, int64_t m, int64_t n, ptrdiff_t ld,
                        const double *want, const double *mag,
                        const unsigned char *exact)
{
    e->against = "double";
    expect_matrix(e, got, m, n, ld, want, mag, exact, TOL_REF_ABS,
                  TOL_REF_REL);
    if (is_generic)
        return;
    double *g = widen_floats(gen, m, n, ld);
    e->against = "generic";
    expect_matrix(e, got, m, n, ld, g, mag, exact, TOL_KERNEL_ABS,
                  TOL_KERNEL_REL);
    free(g);
}

static const int64_t DEPTHS[] = {1, 3, 17, 64, 129};
#define N_DEPTHS 5

/* m (or n) below, equal to and above a block size. */
static void edge_sizes(int64_t block, int64_t out[5])
{
    out[0] = 1;
    out[1] = block > 2 ? block - 1 : 2;
    out[2] = block;
    out[3] = block + 1;
    out[4] = 2 * block + 3;
}

/* Runs fn on every table for each (m, n) of the first `count` edge sizes
 * of every table's block_q and block_k. */
typedef void (*tile_fn)(const table_set *ts, int64_t m, int64_t n,
                        test_rng *r);
static void for_edge_tiles(int count, tile_fn fn, uint64_t seed)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, seed);
    for (int b = 0; b < ts.n; b++) {
        int64_t ms[5], ns[5];
        edge_sizes(ts.t[b].block_q, ms);
        edge_sizes(ts.t[b].block_k, ns);
        for (int i = 0; i < count; i++)
            for (int j = 0; j < count; j++)
                fn(&ts, ms[i], ns[j], &r);
    }
}

/* want = init + A B in double, where A[i][p] = a[i*lda + p] and
 * B[p][j] = b[p*b_pstride + j*b_jstride]; mag = |init| + sum |terms|.
 * init is m x n or NULL (zeros). b holds the inputs widened to double
 * (widen_floats, or the decode tests' widened half-precision rows). */
static void ref_gemm(int64_t m, int64_t n, int64_t k, const float *a,
                     ptrdiff_t lda, const double *b, ptrdiff_t b_pstride,
                     ptrdiff_t b_jstride, const double *init, double *want,
                     double *mag)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = init ? init[i * n + j] : 0.0, sa = fabs(acc);
            for (int64_t p = 0; p < k; p++) {
                double term =
                    (double)a[i * lda + p] * b[p * b_pstride + j * b_jstride];
                acc += term;
                sa += fabs(term);
            }
            want[i * n + j] = acc;
            mag[i * n + j] = sa;
        }
}

/* ---- qk and pack ------------------------------------------------------ */

/* Packs n keys with t and multiplies: s (sentinel-filled, stride lds). */
static void run_qk(const mk_table *t, const float *q, ptrdiff_t ldq,
                   int64_t m, const float *k, ptrdiff_t ldk, int64_t n,
                   int64_t d, float *s, ptrdiff_t lds, const expect *e)
{
    size_t kp_floats = t->packed_floats(n, d);
    float *kp = out_buffer(kp_floats);
    t->pack(k, ldk, n, d, kp);
    REQUIRE(count_changed(kp + kp_floats, GUARD) == 0,
            "pack [%s] %s: wrote past packed_floats (%zu)", e->isa,
            e->shape, kp_floats);
    t->qk(q, ldq, m, kp, n, d, s, lds);
    free(kp);
}

static void qk_case(const table_set *ts, int64_t m, int64_t n, int64_t d,
                    ptrdiff_t ldq, ptrdiff_t ldk, test_rng *r)
{
    const ptrdiff_t lds = n + 5;
    float *q = random_floats(r, (size_t)((m - 1) * ldq + d));
    float *k = random_floats(r, (size_t)((n - 1) * ldk + d));
    double *want = test_alloc((size_t)(m * n) * sizeof *want);
    double *mag = test_alloc((size_t)(m * n) * sizeof *mag);
    double *kd = widen_floats(k, n, d, ldk);
    ref_gemm(m, n, d, q, ldq, kd, 1, d, NULL, want, mag);
    free(kd);
    float *gen = NULL;
    for (int x = 0; x < ts->n; x++) {
        expect e = {.kernel = "pack+qk", .isa = mha_isa_name(ts->isa[x])};
        snprintf(e.shape, sizeof e.shape,
                 "m %lld n %lld d %lld ldq %td ldk %td lds %td", (long long)m,
                 (long long)n, (long long)d, ldq, ldk, lds);
        float *s = out_buffer((size_t)(m * lds));
        run_qk(&ts->t[x], q, ldq, m, k, ldk, n, d, s, lds, &e);
        expect_both(&e, x == 0, s, gen, m, n, lds, want, mag, NULL);
        if (x == 0)
            gen = s;
        else
            free(s);
    }
    free(gen), free(q), free(k), free(want), free(mag);
}

static void qk_tile(const table_set *ts, int64_t m, int64_t n, test_rng *r)
{
    for (int p = 0; p < N_DEPTHS; p++)
        qk_case(ts, m, n, DEPTHS[p], DEPTHS[p] + 3, DEPTHS[p] + 7, r);
}

START_TEST(qk_edges)
{
    for_edge_tiles(5, qk_tile, 31);
}
END_TEST

/* ---- softmax_update ---------------------------------------------------- */

enum {
    MV_NONE, MV_KEEP, MV_KEEP_BROADCAST, MV_BIAS, MV_BIAS_BROADCAST,
    MV_CAUSAL_0, MV_CAUSAL_NEG, MV_CAUSAL_POS, MV_CAUSAL_ALL,
    MV_LIMIT_0, MV_LIMIT_HALF, MV_LIMIT_ABOVE, MV_ALL, N_MASK_VARIANTS
};
static const char *const MV_NAME[] = {
    "none", "keep", "keep ld 0", "bias", "bias ld 0", "causal 0",
    "causal -2", "causal n-m+3", "causal all hidden", "key_limit 0",
    "key_limit n/2", "key_limit n+100", "everything"};

typedef struct mask_buf {
    mk_mask mask;
    uint8_t *keep;
    float *bias;
} mask_buf;

/* Mask variant v for an m x n tile. Keep-masks hide every fifth row
 * entirely; biases have 20% -INFINITY and every fourth row all -INFINITY. */
static void make_mask(int v, int64_t m, int64_t n, test_rng *r, mask_buf *mb)
{
    memset(mb, 0, sizeof *mb);
    mb->mask.diag_lo = MK_NO_DIAG_LO;
    mb->mask.diag_hi = MK_NO_DIAG_HI;
    mb->mask.key_limit = n;
    int keep = v == MV_KEEP || v == MV_KEEP_BROADCAST || v == MV_ALL;
    int bias = v == MV_BIAS || v == MV_BIAS_BROADCAST || v == MV_ALL;
    if (keep) {
        ptrdiff_t ld = v == MV_KEEP_BROADCAST ? 0 : n + 3;
        int64_t rows = ld ? m : 1;
        mb->keep = test_alloc((size_t)((rows - 1) * ld + n));
        memset(mb->keep, 0x5a, (size_t)((rows - 1) * ld + n));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < n; j++)
                mb->keep[i * ld + j] =
                    (i % 5 == 4 || rng_uniform(r) < -0.4f) ? 0
                                                            : (uint8_t)(1 + j % 7);
        mb->mask.keep = mb->keep;
        mb->mask.keep_ld = ld;
    }
    if (bias) {
        ptrdiff_t ld = v == MV_BIAS_BROADCAST ? 0 : n + 5;
        int64_t rows = ld ? m : 1;
        mb->bias = test_alloc((size_t)((rows - 1) * ld + n) * sizeof(float));
        fill_sentinel(mb->bias, (size_t)((rows - 1) * ld + n));
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < n; j++) {
                float u = rng_uniform(r);
                mb->bias[i * ld + j] =
                    (ld && i % 4 == 2) || u < -0.6f ? -INFINITY : 3.0f * u;
            }
        mb->mask.bias = mb->bias;
        mb->mask.bias_ld = ld;
    }
    switch (v) {
    case MV_CAUSAL_0: mb->mask.diag_hi = 0; break;
    case MV_CAUSAL_NEG: mb->mask.diag_hi = -2; break;
    case MV_CAUSAL_POS: mb->mask.diag_hi = n - m + 3; break;
    case MV_CAUSAL_ALL: mb->mask.diag_hi = -(m + 5); break;
    case MV_LIMIT_0: mb->mask.key_limit = 0; break;
    case MV_LIMIT_HALF: mb->mask.key_limit = n / 2; break;
    case MV_LIMIT_ABOVE: mb->mask.key_limit = n + 100; break;
    case MV_ALL:
        mb->mask.diag_hi = 1;
        mb->mask.key_limit = n - 1;
        break;
    }
}

static int ref_hidden(const mk_mask *mk, int64_t i, int64_t j)
{
    if (mk->diag_hi != MK_NO_DIAG_HI && j > i + mk->diag_hi)
        return 1;
    if (j >= mk->key_limit)
        return 1;
    return mk->keep && mk->keep[i * mk->keep_ld + j] == 0;
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
            if (mk->bias)
                x += mk->bias[i * mk->bias_ld + j];
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

/* Two consecutive tiles through each table, from state (init_max, 0). */
static void softmax_case(const table_set *ts, int64_t m, int64_t n, int v,
                         float scale, float init_max, test_rng *r)
{
    const ptrdiff_t lds = n + 3;
    const size_t ns = (size_t)(m * lds);
    float *tiles[2];
    for (int k = 0; k < 2; k++) {
        tiles[k] = random_floats(r, ns);
        for (size_t x = 0; x < ns; x++)
            tiles[k][x] *= 4.0f;
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
     * max -inf, sum unchanged) must be exact. */
    double *one = test_alloc((size_t)(m * n) * sizeof *one);
    unsigned char *exact_p = test_alloc((size_t)(m * n));
    unsigned char *exact_row = test_alloc((size_t)m);
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
                for (int64_t j = 0; j < n; j++) {
                    one[i * n + j] = 1.0;
                    exact_p[i * n + j] =
                        dead || ref_hidden(&mb.mask, i, j) ||
                        (mb.mask.bias &&
                         mb.mask.bias[i * mb.mask.bias_ld + j] == -INFINITY);
                }
            }
            expect e = {.isa = mha_isa_name(ts->isa[x])};
            snprintf(e.shape, sizeof e.shape,
                     "tile %d m %lld n %lld lds %td mask %s scale %g "
                     "initial max %g",
                     k, (long long)m, (long long)n, lds, MV_NAME[v],
                     (double)scale, (double)init_max);
            const sm_result *g = x ? &gen[k] : NULL;
            e.kernel = "softmax_update P";
            expect_both(&e, x == 0, got.s, g ? g->s : NULL, m, n, lds,
                        p_ref[k], one, exact_p);
            e.kernel = "softmax_update alpha";
            expect_both(&e, x == 0, got.alpha, g ? g->alpha : NULL, m, 1, 1,
                        alpha_ref[k], one, exact_row);
            e.kernel = "softmax_update row_sum";
            expect_both(&e, x == 0, got.row_sum, g ? g->row_sum : NULL, m, 1,
                        1, sum_ref[k], sum_ref[k], exact_row);
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
    free(rm), free(rs), free(one), free(exact_p), free(exact_row);
    free(mag_max), free(mb.keep), free(mb.bias);
}

static void softmax_tile(const table_set *ts, int64_t m, int64_t n,
                         test_rng *r)
{
    for (int v = 0; v < N_MASK_VARIANTS; v++) {
        /* Fresh state, or a running max (9) above every score (< 8.2),
         * where alpha must be 1. */
        float init = (m + n + v) % 3 == 0 ? 9.0f : -INFINITY;
        float scale = v % 2 ? 0.125f : 1.3f;
        softmax_case(ts, m, n, v, scale, init, r);
    }
}

START_TEST(softmax_update_edges)
{
    for_edge_tiles(4, softmax_tile, 37);
}
END_TEST

/* ---- pv ---------------------------------------------------------------- */

/* want (m x dv) = alpha[i] o0[i][c] + sum_j p[i][j] V[j][c] in double, V
 * (n x dv) given widened; mag as ref_gemm's. */
static void ref_pv(int64_t m, int64_t n, int64_t dv, const float *p,
                   ptrdiff_t ldp, const double *vd, const float *alpha,
                   const float *o0, ptrdiff_t ldo, double *want, double *mag)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t c = 0; c < dv; c++)
            want[i * dv + c] = (double)alpha[i] * o0[i * ldo + c];
    ref_gemm(m, dv, n, p, ldp, vd, dv, 1, want, want, mag);
}

static void pv_case(const table_set *ts, int64_t m, int64_t n, int64_t dv,
                    ptrdiff_t ldv, test_rng *r)
{
    const ptrdiff_t ldp = n + 3, ldo = dv + 7;
    float *p = random_floats(r, (size_t)(m * ldp));
    for (size_t x = 0; x < (size_t)(m * ldp); x++)
        p[x] = x % 11 == 3 ? 0.0f : fabsf(p[x]); /* probabilities */
    float *v = random_floats(r, (size_t)((n - 1) * ldv + dv));
    float *alpha = random_floats(r, (size_t)m);
    for (int64_t i = 0; i < m; i++)
        alpha[i] = i % 5 == 0 ? 1.0f : i % 5 == 1 ? 0.0f : fabsf(alpha[i]);
    float *o0 = random_floats(r, (size_t)(m * ldo));
    double *want = test_alloc((size_t)(m * dv) * sizeof *want);
    double *mag = test_alloc((size_t)(m * dv) * sizeof *mag);
    double *vd = widen_floats(v, n, dv, ldv);
    ref_pv(m, n, dv, p, ldp, vd, alpha, o0, ldo, want, mag);
    free(vd);
    float *gen = NULL;
    for (int x = 0; x < ts->n; x++) {
        expect e = {.kernel = "pv", .isa = mha_isa_name(ts->isa[x])};
        snprintf(e.shape, sizeof e.shape,
                 "m %lld n %lld dv %lld ldp %td ldv %td ldo %td",
                 (long long)m, (long long)n, (long long)dv, ldp, ldv, ldo);
        /* o: the accumulator columns, sentinel padding. */
        float *o = out_buffer((size_t)(m * ldo));
        for (int64_t i = 0; i < m; i++)
            memcpy(&o[i * ldo], &o0[i * ldo], (size_t)dv * sizeof(float));
        ts->t[x].pv(p, ldp, m, n, v, ldv, dv, alpha, o, ldo);
        expect_both(&e, x == 0, o, gen, m, dv, ldo, want, mag, NULL);
        if (x == 0)
            gen = o;
        else
            free(o);
    }
    free(gen), free(p), free(v), free(alpha), free(o0), free(want),
        free(mag);
}

static void pv_tile(const table_set *ts, int64_t m, int64_t n, test_rng *r)
{
    for (int p = 0; p < N_DEPTHS; p++)
        pv_case(ts, m, n, DEPTHS[p], DEPTHS[p] + 5, r);
}

START_TEST(pv_edges)
{
    for_edge_tiles(4, pv_tile, 41);
}
END_TEST

/* ---- normalize ---------------------------------------------------------- */

START_TEST(normalize_edges)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, 43);
    static const int64_t ms[] = {1, 5, 33, 97};
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++)
        for (int p = 0; p < N_DEPTHS; p++) {
            const int64_t m = ms[a], dv = DEPTHS[p];
            const ptrdiff_t ldo = dv + 3, ldout = dv + 11;
            float *o = random_floats(&r, (size_t)(m * ldo));
            float *l = random_floats(&r, (size_t)m);
            double *want = test_alloc((size_t)(m * dv) * sizeof *want);
            double *mag = test_alloc((size_t)(m * dv) * sizeof *mag);
            unsigned char *exact = test_alloc((size_t)(m * dv));
            for (int64_t i = 0; i < m; i++) {
                /* Every third row fully masked: sum 0, o not zero. */
                l[i] = i % 3 == 1 ? 0.0f : 0.01f + 40.0f * fabsf(l[i]);
                for (int64_t c = 0; c < dv; c++) {
                    double w = l[i] == 0.0f ? 0.0
                                            : (double)o[i * ldo + c] / l[i];
                    want[i * dv + c] = w;
                    mag[i * dv + c] = fabs(w);
                    exact[i * dv + c] = l[i] == 0.0f;
                }
            }
            float *gen = NULL;
            for (int x = 0; x < ts.n; x++) {
                expect e = {.kernel = "normalize",
                            .isa = mha_isa_name(ts.isa[x])};
                snprintf(e.shape, sizeof e.shape,
                         "m %lld dv %lld ldo %td ldout %td", (long long)m,
                         (long long)dv, ldo, ldout);
                float *out = out_buffer((size_t)(m * ldout));
                ts.t[x].normalize(o, ldo, m, dv, l, out, ldout);
                expect_both(&e, x == 0, out, gen, m, dv, ldout, want, mag,
                            exact);
                if (x == 0)
                    gen = out;
                else
                    free(out);
            }
            free(gen), free(o), free(l), free(want), free(mag), free(exact);
        }
}
END_TEST

/* ---- pack and linear --------------------------------------------------- */

static void linear_case(const table_set *ts, int64_t m, int64_t n,
                        int64_t k, int with_bias, test_rng *r)
{
    const ptrdiff_t lda = k + 3, ldc = n + 5;
    float *a = random_floats(r, (size_t)(m * lda));
    float *w = random_floats(r, (size_t)(n * k));
    float *bias = with_bias ? random_floats(r, (size_t)n) : NULL;
    double *want = test_alloc((size_t)(m * n) * sizeof *want);
    double *mag = test_alloc((size_t)(m * n) * sizeof *mag);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            want[i * n + j] = bias ? bias[j] : 0.0;
    double *wd = widen_floats(w, n, k, k);
    ref_gemm(m, n, k, a, lda, wd, 1, k, want, want, mag);
    free(wd);
    float *gen = NULL;
    for (int x = 0; x < ts->n; x++) {
        const mk_table *t = &ts->t[x];
        expect e = {.kernel = "pack+linear", .isa = mha_isa_name(ts->isa[x])};
        snprintf(e.shape, sizeof e.shape,
                 "m %lld n %lld k %lld lda %td ldc %td bias %d", (long long)m,
                 (long long)n, (long long)k, lda, ldc, with_bias);
        size_t wp_floats = t->packed_floats(n, k);
        float *wp = out_buffer(wp_floats);
        t->pack(w, k, n, k, wp);
        REQUIRE(count_changed(wp + wp_floats, GUARD) == 0,
                "pack [%s] %s: wrote past packed_floats (%zu)", e.isa,
                e.shape, wp_floats);
        float *c = out_buffer((size_t)(m * ldc));
        t->linear(a, lda, m, wp, n, k, bias, c, ldc);
        expect_both(&e, x == 0, c, gen, m, n, ldc, want, mag, NULL);
        free(wp);
        if (x == 0)
            gen = c;
        else
            free(c);
    }
    free(gen), free(a), free(w), free(bias), free(want), free(mag);
}

START_TEST(linear_edges)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, 47);
    static const int64_t ms[] = {1, 5, 17, 67};
    static const int64_t ns[] = {1, 3, 17, 64, 129};
    int flip = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (int p = 0; p < N_DEPTHS; p++)
                linear_case(&ts, ms[i], ns[j], DEPTHS[p], flip++ % 2, &r);
}
END_TEST

/* ---- Half-precision conversions --------------------------------------- */

static float ref_f16(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, mant = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(mant, -24);
    else if (e == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexp(1024 + mant, e - 25);
    return (float)(sign ? -v : v);
}

static float ref_bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* All 65536 inputs, converted in runs of awkward lengths (tails). */
static void cvt_all(const table_set *ts, int bf16)
{
    const size_t n = 65536;
    uint16_t *x = test_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (uint16_t)i;
    static const int64_t runs[] = {1, 7, 8, 9, 15, 16, 17, 31, 64, 1000};
    for (int t = 0; t < ts->n; t++) {
        const char *isa = mha_isa_name(ts->isa[t]);
        float *y = out_buffer(n);
        size_t at = 0;
        for (int k = 0; at < n; k++) {
            int64_t len = runs[k % 10];
            if ((size_t)len > n - at)
                len = (int64_t)(n - at);
            ts->t[t].widen[bf16 ? MK_BF16 : MK_F16](x + at, len, y + at);
            /* Nothing past the run yet. */
            REQUIRE(count_changed(y + at + len, 1) == 0 || at + len == n,
                    "cvt [%s]: wrote past a run of %lld", isa,
                    (long long)len);
            at += (size_t)len;
        }
        for (size_t i = 0; i < n; i++) {
            float want = bf16 ? ref_bf16(x[i]) : ref_f16(x[i]);
            int ok = isnan(want) ? isnan(y[i])
                                 : memcmp(&want, &y[i], sizeof want) == 0;
            REQUIRE(ok, "cvt_%s [%s]: 0x%04zx -> %a, want %a",
                    bf16 ? "bf16" : "f16", isa, i, (double)y[i],
                    (double)want);
        }
        REQUIRE(count_changed(y + n, GUARD) == 0, "cvt [%s]: wrote past n",
                isa);
        free(y);
    }
    free(x);
}

START_TEST(cvt_f16_exhaustive)
{
    table_set ts;
    get_tables(&ts);
    cvt_all(&ts, 0);
}
END_TEST

START_TEST(cvt_bf16_exhaustive)
{
    table_set ts;
    get_tables(&ts);
    cvt_all(&ts, 1);
}
END_TEST

/* ---- decode_qk and decode_pv -------------------------------------------
 * Up to MK_DECODE_ROWS query rows against key / value rows read in place,
 * in each element type. The rows are random fp32 draws rounded to the type
 * and the double reference multiplies the widened values. Every input
 * buffer ends exactly where its last row does (no slack), so under ASan a
 * read one element past a row's end, or of a row past n - 1, fails. */

static const int64_t DECODE_NS[] = {1, 7, 8, 9, 33, 256, 257};
static const int64_t DECODE_WIDTHS[] = {1, 3, 8, 15, 16, 17, 64, 128, 130};
#define N_DECODE_NS 7
#define N_DECODE_WIDTHS 9
static const char *const DTYPE_NAME[] = {"f32", "f16", "bf16"};

/* fp32 -> binary16 bits, to nearest even (|x| below 65504). */
static uint16_t round_f16(float x)
{
    unsigned sign = signbit(x) ? 0x8000u : 0u;
    double a = fabs((double)x);
    if (a < 0x1p-14) /* subnormal; 1024 steps is the least normal's code */
        return (uint16_t)(sign | (unsigned)nearbyint(a * 0x1p24));
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    unsigned mant = (unsigned)nearbyint(ldexp(a, 11 - e)); /* 1024..2048 */
    unsigned biased = (unsigned)(e - 1 + 15);
    if (mant == 2048)
        mant = 1024, biased++;
    return (uint16_t)(sign | biased << 10 | (mant - 1024));
}

/* fp32 -> bfloat16 bits, to nearest even (finite x). */
static uint16_t round_bf16(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    b += 0x7FFFu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

static size_t dtype_bytes(mk_dtype t) { return t == MK_F32 ? 4 : 2; }

/* Element e of an array of type t, widened. */
static double widened(const void *x, mk_dtype t, size_t e)
{
    if (t == MK_F32)
        return ((const float *)x)[e];
    uint16_t h = ((const uint16_t *)x)[e];
    return t == MK_F16 ? ref_f16(h) : ref_bf16(h);
}

/* rows x width elements of type t at row stride ld (0: one row for all) in
 * a buffer that ends where the last row does, from uniform draws rounded
 * to the type (within half a step: checked). wide (rows x width, packed)
 * gets the widened values when non-NULL. */
static void *random_rows(test_rng *r, mk_dtype t, int64_t rows,
                         int64_t width, ptrdiff_t ld, double *wide)
{
    size_t count = (size_t)((rows - 1) * ld + width);
    char *x = test_alloc(count * dtype_bytes(t));
    for (size_t e = 0; e < count; e++) {
        float f = rng_uniform(r);
        if (t == MK_F32) {
            memcpy(x + 4 * e, &f, sizeof f);
            continue;
        }
        uint16_t h = t == MK_F16 ? round_f16(f) : round_bf16(f);
        memcpy(x + 2 * e, &h, sizeof h);
        double step = t == MK_F16 ? fmax(fabs(f) * 0x1p-11, 0x1p-25)
                                  : fabs(f) * 0x1p-8;
        REQUIRE(fabs(widened(x, t, e) - f) <= step,
                "%s rounding of %a gave %a", DTYPE_NAME[t], (double)f,
                widened(x, t, e));
    }
    if (wide)
        for (int64_t j = 0; j < rows; j++)
            for (int64_t c = 0; c < width; c++)
                wide[j * width + c] = widened(x, t, (size_t)(j * ld + c));
    return x;
}

/* One decode kernel call, on the inputs in ctx, into out (sentinel-filled
 * m x n at stride ld). */
typedef struct decode_call {
    mk_dtype t;
    int64_t m, n, w;
    const float *a; /* q or p */
    ptrdiff_t lda;
    const void *kv; /* K or V rows */
    ptrdiff_t ldkv;
    const float *alpha, *o0; /* decode_pv: alpha and o's first value */
} decode_call;

/* Each table's result of run (m x n at stride ld) against want and, for a
 * table other than generic, generic's. e->shape names the case. */
static void check_tables(const table_set *ts, expect *e,
                         void (*run)(const decode_call *, const mk_table *,
                                     float *, ptrdiff_t),
                         const decode_call *call, int64_t m, int64_t n,
                         ptrdiff_t ld, const double *want, const double *mag)
{
    float *gen = NULL;
    for (int x = 0; x < ts->n; x++) {
        e->isa = mha_isa_name(ts->isa[x]);
        float *out = out_buffer((size_t)(m * ld));
        run(call, &ts->t[x], out, ld);
        expect_both(e, x == 0, out, gen, m, n, ld, want, mag, NULL);
        if (x == 0)
            gen = out;
        else
            free(out);
    }
    free(gen);
}

static void run_decode_qk(const decode_call *c, const mk_table *t, float *s,
                          ptrdiff_t lds)
{
    t->decode_qk(c->a, c->lda, c->m, c->kv, c->t, c->ldkv, c->n, c->w, s,
                 lds);
}

/* The query stride is padded, or 0 (one row for all) in some cases. */
static void decode_qk_case(const table_set *ts, mk_dtype t, int64_t m,
                           int64_t n, int64_t d, ptrdiff_t ldk, test_rng *r)
{
    const ptrdiff_t ldq = (m + n + d) % 5 == 0 ? 0 : d + 3, lds = n + 3;
    float *q = random_floats(r, (size_t)((m - 1) * ldq + d));
    double *kd = test_alloc((size_t)(n * d) * sizeof *kd);
    void *k = random_rows(r, t, n, d, ldk, kd);
    double *want = test_alloc((size_t)(m * n) * sizeof *want);
    double *mag = test_alloc((size_t)(m * n) * sizeof *mag);
    ref_gemm(m, n, d, q, ldq, kd, 1, d, NULL, want, mag);
    expect e = {.kernel = "decode_qk"};
    snprintf(e.shape, sizeof e.shape,
             "%s m %lld n %lld d %lld ldq %td ldk %td lds %td", DTYPE_NAME[t],
             (long long)m, (long long)n, (long long)d, ldq, ldk, lds);
    decode_call call = {t, m, n, d, q, ldq, k, ldk, NULL, NULL};
    check_tables(ts, &e, run_decode_qk, &call, m, n, lds, want, mag);
    free(q), free(kd), free(k), free(want), free(mag);
}

/* Probabilities with zeros (every seventh entry), rows of n at stride ld,
 * exactly sized. */
static float *random_probs(test_rng *r, int64_t m, int64_t n, ptrdiff_t ld)
{
    size_t count = (size_t)((m - 1) * ld + n);
    float *p = random_floats(r, count);
    for (size_t x = 0; x < count; x++)
        p[x] = x % 7 == 2 ? 0.0f : fabsf(p[x]);
    return p;
}

/* Rescale factors: 1, 0 and values in (0, 1), exactly m of them. */
static float *random_alphas(test_rng *r, int64_t m)
{
    float *alpha = random_floats(r, (size_t)m);
    for (int64_t i = 0; i < m; i++)
        alpha[i] = i % 4 == 0 ? 1.0f : i % 4 == 1 ? 0.0f : fabsf(alpha[i]);
    return alpha;
}

/* o starts as o0's columns [0, dv) (o0 has o's row stride). */
static void run_decode_pv(const decode_call *c, const mk_table *t, float *o,
                          ptrdiff_t ldo)
{
    for (int64_t i = 0; i < c->m; i++)
        memcpy(&o[i * ldo], &c->o0[i * ldo], (size_t)c->w * sizeof *o);
    t->decode_pv(c->a, c->lda, c->m, c->n, c->kv, c->t, c->ldkv, c->w,
                 c->alpha, o, ldo);
}

static void decode_pv_case(const table_set *ts, mk_dtype t, int64_t m,
                           int64_t n, int64_t dv, ptrdiff_t ldv, test_rng *r)
{
    const ptrdiff_t ldp = n + 2, ldo = dv + 5;
    float *p = random_probs(r, m, n, ldp);
    double *vd = test_alloc((size_t)(n * dv) * sizeof *vd);
    void *v = random_rows(r, t, n, dv, ldv, vd);
    float *alpha = random_alphas(r, m);
    float *o0 = random_floats(r, (size_t)(m * ldo));
    double *want = test_alloc((size_t)(m * dv) * sizeof *want);
    double *mag = test_alloc((size_t)(m * dv) * sizeof *mag);
    ref_pv(m, n, dv, p, ldp, vd, alpha, o0, ldo, want, mag);
    expect e = {.kernel = "decode_pv"};
    snprintf(e.shape, sizeof e.shape,
             "%s m %lld n %lld dv %lld ldp %td ldv %td ldo %td",
             DTYPE_NAME[t], (long long)m, (long long)n, (long long)dv, ldp,
             ldv, ldo);
    decode_call call = {t, m, n, dv, p, ldp, v, ldv, alpha, o0};
    check_tables(ts, &e, run_decode_pv, &call, m, dv, ldo, want, mag);
    free(p), free(vd), free(v), free(alpha), free(o0), free(want), free(mag);
}

/* Row strides of variant c for rows of width w: dense, padded past the
 * width, or 0 (one row broadcast). */
static ptrdiff_t decode_stride(int c, int64_t w)
{
    return c % 3 == 0 ? w : c % 3 == 1 ? w + 7 : 0;
}

/* Runs fn for every m 1..MK_DECODE_ROWS, n, width and K/V stride variant
 * with element type t. */
typedef void (*decode_fn)(const table_set *ts, mk_dtype t, int64_t m,
                          int64_t n, int64_t w, ptrdiff_t ld, test_rng *r);
static void for_decode_cases(decode_fn fn, mk_dtype t, uint64_t seed)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, seed);
    for (int64_t m = 1; m <= MK_DECODE_ROWS; m++)
        for (int a = 0; a < N_DECODE_NS; a++)
            for (int b = 0; b < N_DECODE_WIDTHS; b++)
                for (int c = 0; c < 3; c++)
                    fn(&ts, t, m, DECODE_NS[a], DECODE_WIDTHS[b],
                       decode_stride(c, DECODE_WIDTHS[b]), &r);
}

START_TEST(decode_qk_edges)
{
    for_decode_cases(decode_qk_case, (mk_dtype)_i, 59 + (uint64_t)_i);
}
END_TEST

START_TEST(decode_pv_edges)
{
    for_decode_cases(decode_pv_case, (mk_dtype)_i, 61 + (uint64_t)_i);
}
END_TEST

/* ---- Decode determinism ------------------------------------------------
 * Per table: a score or output element is bitwise the same whether its
 * query row is one of MK_DECODE_ROWS or alone, its key one of 257 or alone,
 * its output column first or anywhere in the row (zeros of either sign
 * count as the same). */

static int same_value(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0 || (a == 0.0f && b == 0.0f);
}

typedef struct same_ctx {
    const mk_table *tb;
    const char *isa;
    mk_dtype t;
    int64_t width;
} same_ctx;

/* s[i][j] got one way (how) against all, the one call with every row and
 * key. */
static void expect_same_score(const same_ctx *cx, float got, float all,
                              int64_t i, int64_t j, const char *how)
{
    REQUIRE(same_value(got, all),
            "decode_qk [%s] %s d %lld: s[%lld][%lld] = %a %s, %a in one call "
            "of %d rows and 257 keys", cx->isa, DTYPE_NAME[cx->t],
            (long long)cx->width, (long long)i, (long long)j, (double)got,
            how, (double)all, MK_DECODE_ROWS);
}

static void decode_qk_same(const same_ctx *cx, test_rng *r)
{
    const int64_t m = MK_DECODE_ROWS, n = 257, d = cx->width;
    const ptrdiff_t ldq = d + 1, ldk = d + 3;
    const size_t es = dtype_bytes(cx->t);
    float *q = random_floats(r, (size_t)((m - 1) * ldq + d));
    char *k = random_rows(r, cx->t, n, d, ldk, NULL);
    float *all = test_alloc((size_t)(m * n) * sizeof *all);
    float *one = test_alloc((size_t)n * sizeof *one);
    cx->tb->decode_qk(q, ldq, m, k, cx->t, ldk, n, d, all, n);
    for (int64_t i = 0; i < m; i++) {
        cx->tb->decode_qk(q + i * ldq, ldq, 1, k, cx->t, ldk, n, d, one, n);
        for (int64_t j = 0; j < n; j++)
            expect_same_score(cx, one[j], all[i * n + j], i, j, "with m 1");
    }
    for (int64_t j = 0; j < n; j++) {
        float col[MK_DECODE_ROWS], lone;
        const char *row = k + (size_t)(j * ldk) * es;
        cx->tb->decode_qk(q, ldq, m, row, cx->t, ldk, 1, d, col, 1);
        for (int64_t i = 0; i < m; i++)
            expect_same_score(cx, col[i], all[i * n + j], i, j, "with n 1");
        int64_t i = j % m;
        cx->tb->decode_qk(q + i * ldq, ldq, 1, row, cx->t, ldk, 1, d, &lone,
                          1);
        expect_same_score(cx, lone, all[i * n + j], i, j, "with m = n = 1");
    }
    free(q), free(k), free(all), free(one);
}

/* o (m rows of dv at stride ldo) against want (the same layout), columns
 * [c0, dv). */
static void expect_same_rows(const same_ctx *cx, const char *how,
                             const float *o, const float *want, int64_t m,
                             int64_t c0, int64_t dv, ptrdiff_t ldo)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t c = c0; c < dv; c++)
            REQUIRE(same_value(o[i * ldo + c], want[i * ldo + c]),
                    "decode_pv [%s] %s dv %lld: o[%lld][%lld] = %a %s, %a "
                    "in one call of %d rows and 257 keys", cx->isa,
                    DTYPE_NAME[cx->t], (long long)dv, (long long)i,
                    (long long)c, (double)o[i * ldo + c], how,
                    (double)want[i * ldo + c], MK_DECODE_ROWS);
}

static void decode_pv_same(const same_ctx *cx, test_rng *r)
{
    const int64_t m = MK_DECODE_ROWS, n = 257, dv = cx->width;
    const ptrdiff_t ldv = dv + 3, ldo = dv;
    const size_t es = dtype_bytes(cx->t), no = (size_t)(m * ldo);
    float *p = random_probs(r, m, n, n);
    char *v = random_rows(r, cx->t, n, dv, ldv, NULL);
    float *alpha = random_alphas(r, m);
    float *o0 = random_floats(r, no);
    float *all = test_alloc(no * sizeof *all);
    float *o = test_alloc(no * sizeof *o);
    memcpy(all, o0, no * sizeof *o0);
    cx->tb->decode_pv(p, n, m, n, v, cx->t, ldv, dv, alpha, all, ldo);

    /* Each row alone. */
    memcpy(o, o0, no * sizeof *o0);
    for (int64_t i = 0; i < m; i++)
        cx->tb->decode_pv(p + i * n, n, 1, n, v, cx->t, ldv, dv, alpha + i,
                          o + i * ldo, ldo);
    expect_same_rows(cx, "row by row", o, all, m, 0, dv, ldo);

    /* Columns [c0, dv) as columns [0, dv - c0) of a narrower call. */
    static const int64_t shifts[] = {1, 3, 4, 8, 16, 17};
    for (size_t x = 0; x < sizeof shifts / sizeof shifts[0]; x++) {
        int64_t c0 = shifts[x];
        if (c0 >= dv)
            break;
        memcpy(o, o0, no * sizeof *o0);
        cx->tb->decode_pv(p, n, m, n, v + (size_t)c0 * es, cx->t, ldv,
                          dv - c0, alpha, o + c0, ldo);
        char how[64];
        snprintf(how, sizeof how, "from column %lld on", (long long)c0);
        expect_same_rows(cx, how, o, all, m, c0, dv, ldo);
    }

    /* One nonzero probability per row, at key j_i of 257, against the
     * same key alone (n = 1). */
    static const int64_t keys[MK_DECODE_ROWS] = {0, 1, 7, 8, 9, 128, 255,
                                                 256};
    float *sparse = test_alloc((size_t)(m * n) * sizeof *sparse);
    memset(sparse, 0, (size_t)(m * n) * sizeof *sparse);
    for (int64_t i = 0; i < m; i++)
        sparse[i * n + keys[i]] = 0.25f + fabsf(rng_uniform(r)) / 2;
    memcpy(all, o0, no * sizeof *o0);
    cx->tb->decode_pv(sparse, n, m, n, v, cx->t, ldv, dv, alpha, all, ldo);
    memcpy(o, o0, no * sizeof *o0);
    for (int64_t i = 0; i < m; i++)
        cx->tb->decode_pv(&sparse[i * n + keys[i]], 1, 1, 1,
                          v + (size_t)(keys[i] * ldv) * es, cx->t, ldv, dv,
                          alpha + i, o + i * ldo, ldo);
    expect_same_rows(cx, "with its one key alone", o, all, m, 0, dv, ldo);
    free(p), free(v), free(alpha), free(o0), free(all), free(o);
    free(sparse);
}

START_TEST(decode_deterministic)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, 67);
    static const int64_t widths[] = {1, 3, 8, 17, 64, 130};
    for (int x = 0; x < ts.n; x++)
        for (int t = MK_F32; t <= MK_BF16; t++)
            for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
                same_ctx cx = {&ts.t[x], mha_isa_name(ts.isa[x]),
                               (mk_dtype)t, widths[w]};
                decode_qk_same(&cx, &r);
                decode_pv_same(&cx, &r);
            }
}
END_TEST

/* ---- Broadcast input rows ---------------------------------------------
 * The engine passes a tensor's seq stride as a kernel's row stride, and
 * the public API accepts 0 there for inputs (one row broadcast to all). */
START_TEST(broadcast_input_rows)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, 53);
    qk_case(&ts, 7, 19, 17, 0, 24, &r);  /* every query the same row */
    qk_case(&ts, 7, 19, 17, 20, 0, &r);  /* every key the same row */
    pv_case(&ts, 5, 23, 17, 0, &r);      /* every value the same row */
}
END_TEST

Suite *suite_kernels(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("kernels");
    tcase_add_test(tc, qk_edges);
    tcase_add_test(tc, softmax_update_edges);
    tcase_add_test(tc, pv_edges);
    tcase_add_test(tc, normalize_edges);
    tcase_add_test(tc, linear_edges);
    tcase_add_test(tc, cvt_f16_exhaustive);
    tcase_add_test(tc, cvt_bf16_exhaustive);
    tcase_add_test(tc, broadcast_input_rows);
    tcase_add_loop_test(tc, decode_qk_edges, MK_F32, MK_BF16 + 1);
    tcase_add_loop_test(tc, decode_pv_edges, MK_F32, MK_BF16 + 1);
    tcase_add_test(tc, decode_deterministic);
    suite_add_tcase(s, tc);
    return s;
}
