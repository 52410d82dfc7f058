/* The helpers the kernel suites share (kernel_check.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_check.h"

/* The tables of the ISAs the tests run (available_isas: generic first). */
void get_tables(table_set *ts)
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
                          t->widen[MK_BF16] && t->widen[MK_I8] &&
                          t->widen[MK_FP8_E4M3] && t->widen[MK_FP8_E5M2] &&
                          t->linear &&
                          t->fma_chains && t->fma_chains_flops > 0,
                      "table %s has an empty slot", mha_isa_name(ts->isa[i]));
        ck_assert_str_eq(t->name, mha_isa_name(ts->isa[i]));
    }
}

/* ---- Checking helpers ------------------------------------------------- */

/* A sentinel-filled buffer of n floats plus a guard zone. */
float *out_buffer(size_t n)
{
    float *x = test_alloc((n + GUARD) * sizeof *x);
    fill_sentinel(x, n + GUARD);
    return x;
}

/* m x n results at stride ld in buf (sized m*ld, whose padding columns and
 * guard must hold the sentinel) against want with error scale mag:
 * |got - want| <= abs + rel * mag. Where exact is non-NULL and nonzero the
 * value must be bitwise want (exact zeros, -inf). */

void expect_matrix(const expect *e, const float *buf, int64_t m,
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

double *widen_floats(const float *x, int64_t m, int64_t n,
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
void expect_both(expect *e, int is_generic, const float *got,
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

const int64_t DEPTHS[N_DEPTHS] = {1, 3, 17, 64, 129};

/* m (or n) below, equal to and above a block size. */
void edge_sizes(int64_t block, int64_t out[5])
{
    out[0] = 1;
    out[1] = block > 2 ? block - 1 : 2;
    out[2] = block;
    out[3] = block + 1;
    out[4] = 2 * block + 3;
}

/* Runs fn on every table for each (m, n) of the first `count` edge sizes
 * of every table's block_q and block_k. */
void for_edge_tiles(int count, tile_fn fn, uint64_t seed)
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
void ref_gemm(int64_t m, int64_t n, int64_t k, const float *a,
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

float ref_f16(uint16_t h)
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

float ref_bf16(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* want (m x dv) = alpha[i] o0[i][c] + sum_j p[i][j] V[j][c] in double, V
 * (n x dv) given widened; mag as ref_gemm's. */
void ref_pv(int64_t m, int64_t n, int64_t dv, const float *p,
                   ptrdiff_t ldp, const double *vd, const float *alpha,
                   const float *o0, ptrdiff_t ldo, double *want, double *mag)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t c = 0; c < dv; c++)
            want[i * dv + c] = (double)alpha[i] * o0[i * ldo + c];
    ref_gemm(m, dv, n, p, ldp, vd, dv, 1, want, want, mag);
}
