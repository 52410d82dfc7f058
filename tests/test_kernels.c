/*
 * The matmul, normalisation and widening kernels of every table this build
 * and CPU can run (kernel_check.h), on edge shapes: m below / equal to /
 * above block_q, n below / equal to / above block_k, depths 1, 3, 17, 64,
 * 129, prime row strides, broadcast input rows; pack + qk, pv, pv_finish
 * (bit for bit the table's pv then normalize), normalize,
 * pack + linear, widen over every binary16 and bfloat16 input, and
 * narrow (fp32 to those codes) around every code, tie and special. Each
 * kernel is checked against plain double loops (TOL_REF) and, for a table
 * other than generic, against the generic table's float result
 * (TOL_KERNEL). The softmax step is test_softmax.c, the decode kernels
 * test_kernel_decode.c. The half compute slots (pack, qk, pack_v, pv of
 * bf16 and of f16) of the tables that have them are checked against
 * double loops on the half values (P rounded to the half dtype first, as
 * the slot's contract says), at TOL_REF.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_check.h"
#ifdef MHA_TEST_AMX_EMULATED
#include "amxbf16/amxbf16.h"
#endif

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


/* ---- pv ---------------------------------------------------------------- */

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


/* ---- pv_finish -------------------------------------------------------- */

/* pv_finish against the same table's pv then normalize (plain stores),
 * bit for bit (its contract), with and without stream, V read in place
 * (ldv == dv) and strided, output rows unaligned and 64-byte aligned (the
 * streamed stores), every third row's sum 0 with a NaN in its accumulator
 * (0 out, as normalize writes). The padding of the output rows must stay
 * untouched. */
static void pv_finish_case(const table_set *ts, int64_t m, int64_t n,
                           int64_t dv, ptrdiff_t ldv, ptrdiff_t ldout,
                           test_rng *r)
{
    const ptrdiff_t ldp = n + 3, ldo = dv + 7;
    float *p = random_floats(r, (size_t)(m * ldp));
    for (size_t x = 0; x < (size_t)(m * ldp); x++)
        p[x] = x % 11 == 3 ? 0.0f : fabsf(p[x]);
    float *v = random_floats(r, (size_t)((n - 1) * ldv + dv));
    float *alpha = random_floats(r, (size_t)m);
    float *l = random_floats(r, (size_t)m);
    float *o0 = random_floats(r, (size_t)(m * ldo));
    for (int64_t i = 0; i < m; i++) {
        alpha[i] = i % 5 == 0 ? 1.0f : i % 5 == 1 ? 0.0f : fabsf(alpha[i]);
        l[i] = i % 3 == 1 ? 0.0f : 0.01f + 40.0f * fabsf(l[i]);
        if (i % 3 == 1)
            o0[i * ldo] = NAN;
    }
    const size_t span = (size_t)(m * ldout);
    float *want = test_alloc((size_t)span * sizeof *want);
    float *o = test_alloc((size_t)(m * ldo) * sizeof *o);
    /* 64-byte aligned, sentinel-filled like out_buffer's, with its guard. */
    const size_t bytes = ((span + GUARD) * sizeof(float) + 63) / 64 * 64;
    float *out = aligned_alloc(64, bytes);
    REQUIRE(out, "aligned_alloc of %zu bytes", bytes);
    for (int x = 0; x < ts->n; x++) {
        const mk_table *t = &ts->t[x];
        fill_sentinel(want, span);
        memcpy(o, o0, (size_t)(m * ldo) * sizeof *o);
        t->pv(p, ldp, m, n, v, ldv, dv, alpha, o, ldo);
        t->normalize(o, ldo, m, dv, l, want, ldout, 0);
        for (int stream = 0; stream < 2; stream++) {
            fill_sentinel(out, span + GUARD);
            memcpy(o, o0, (size_t)(m * ldo) * sizeof *o);
            t->pv_finish(p, ldp, m, n, v, ldv, dv, alpha, o, ldo, l, out,
                         ldout, stream);
            int64_t diff = 0;
            for (size_t e = 0; e < span; e++)
                diff += memcmp(&out[e], &want[e], sizeof *out) != 0;
            REQUIRE(diff == 0,
                    "pv_finish [%s] m %lld n %lld dv %lld ldv %td ldout %td "
                    "stream %d: %lld of %zu floats differ from pv then "
                    "normalize",
                    mha_isa_name(ts->isa[x]), (long long)m, (long long)n,
                    (long long)dv, ldv, ldout, stream, (long long)diff,
                    span);
            REQUIRE(count_changed(out + span, GUARD) == 0,
                    "pv_finish [%s] m %lld dv %lld stream %d: wrote past "
                    "the rows",
                    mha_isa_name(ts->isa[x]), (long long)m, (long long)dv,
                    stream);
        }
    }
    free(out), free(o), free(want), free(p), free(v), free(alpha), free(l),
        free(o0);
}

static void pv_finish_tile(const table_set *ts, int64_t m, int64_t n,
                           test_rng *r)
{
    for (int p = 0; p < N_DEPTHS; p++) {
        const int64_t dv = DEPTHS[p];
        pv_finish_case(ts, m, n, dv, dv, dv + 11, r);
        pv_finish_case(ts, m, n, dv, dv + 5, (dv + 15) / 16 * 16, r);
    }
}

START_TEST(pv_finish_edges)
{
    for_edge_tiles(4, pv_finish_tile, 47);
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
                /* Streamed or not by turns (pv_finish_edges compares
                 * both on 64-byte aligned rows bit for bit). */
                ts.t[x].normalize(o, ldo, m, dv, l, out, ldout,
                                  (int)((a + (size_t)p) % 2));
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
    /* 203: three row blocks of the panel-major order (MK_TD_LINEAR_MC). */
    static const int64_t ms[] = {1, 5, 17, 67, 203};
    static const int64_t ns[] = {1, 3, 17, 64, 129};
    int flip = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (int p = 0; p < N_DEPTHS; p++)
                linear_case(&ts, ms[i], ns[j], DEPTHS[p], flip++ % 2, &r);
}
END_TEST

/* A depth past the layer E = 1024's (1100), against the oracle at
 * TOL_REF and, on the tables built on tile_driver.h's linear (avx2,
 * avx512, avx512bf16 and amxbf16), bitwise against the chain their tiles
 * promise (kernels/avx2/tile_6x16.h, kernels/avx512/tile.h): the sum in
 * order of depth, one FMA per step, then the bias; in scalar fmaf here.
 * Any reordering of the depth (split chains, blocking that does not
 * continue the stored sum) changes bits. */
START_TEST(linear_deep_in_order)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, 53);
    enum { M = 19, N = 70, K = 1100 };
    linear_case(&ts, M, N, K, 1, &r);
    float *a = random_floats(&r, (size_t)M * K);
    float *w = random_floats(&r, (size_t)N * K);
    float *bias = random_floats(&r, N);
    float *want = test_alloc((size_t)M * N * sizeof *want);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < K; p++)
                acc = fmaf(a[i * K + p], w[j * K + p], acc);
            want[i * N + j] = acc + bias[j];
        }
    for (int x = 0; x < ts.n; x++) {
        const char *isa = mha_isa_name(ts.isa[x]);
        if (strcmp(isa, "avx2") && strcmp(isa, "avx512") &&
            strcmp(isa, "avx512bf16") && strcmp(isa, "amxbf16"))
            continue;
        const mk_table *t = &ts.t[x];
        float *wp = out_buffer(t->packed_floats(N, K));
        t->pack(w, K, N, K, wp);
        float *c = out_buffer((size_t)M * N);
        t->linear(a, K, M, wp, N, K, bias, c, N);
        for (int64_t i = 0; i < M * N; i++)
            REQUIRE(memcmp(&c[i], &want[i], sizeof c[i]) == 0,
                    "linear [%s] k %d: c[%lld][%lld] = %a, the in-order FMA "
                    "chain gives %a", isa, K, (long long)(i / N),
                    (long long)(i % N), (double)c[i], (double)want[i]);
        free(wp), free(c);
    }
    free(a), free(w), free(bias), free(want);
}
END_TEST

/* ---- Half-precision conversions --------------------------------------- */

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


/* ---- Narrowing a half compute call's output --------------------------- */

/* The value of code c of a half dtype, the code of infinity standing for
 * the next power of two (IEEE's overflow rule: a value rounds as if the
 * exponent went on). c a finite or infinite positive code. */
static double narrow_value(uint16_t c, int bf16)
{
    uint16_t inf = bf16 ? 0x7F80 : 0x7C00;
    if (c == inf)
        return bf16 ? ldexp(1.0, 128) : 65536.0;
    return bf16 ? (double)ref_bf16(c) : (double)ref_f16(c);
}

/* The oracle: the positive code nearest |x| by distances in double (ties
 * to the even code), the sign put back; a NaN the quiet NaN with x's sign
 * and top payload bits (kernels.h, mk_narrow_fn). */
static uint16_t ref_narrow(float x, int bf16)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (isnan(x))
        return bf16 ? (uint16_t)((u >> 16) | 0x40u)
                    : (uint16_t)(sign | 0x7E00u | ((u >> 13) & 0x3FFu));
    const uint16_t inf = bf16 ? 0x7F80 : 0x7C00;
    const double a = fabs((double)x);
    if (a >= narrow_value(inf, bf16))
        return (uint16_t)(sign | inf);
    /* lo: the largest code whose value is <= a (codes ascend with their
     * values). */
    uint16_t lo = 0, hi = inf;
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (narrow_value(mid, bf16) <= a)
            lo = mid;
        else
            hi = mid;
    }
    const double dlo = a - narrow_value(lo, bf16);
    const double dhi = narrow_value(hi, bf16) - a;
    const uint16_t c = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1) ? hi : lo;
    return (uint16_t)(sign | c);
}

static void push_float(float *x, size_t *n, float v) { x[(*n)++] = v; }

/* Every finite code's value, the midpoint to the next (a tie), one float
 * ulp either side of each, both signs; the specials (zeros, infinities,
 * quiet and signalling NaNs, fp32 subnormals, FLT_MAX); and random bits. */
static float *narrow_inputs(int bf16, size_t *count)
{
    const uint16_t inf = bf16 ? 0x7F80 : 0x7C00;
    const size_t most = (size_t)inf * 10 + 64 + 200000;
    float *x = test_alloc(most * sizeof *x);
    size_t n = 0;
    for (uint16_t c = 0; c < inf; c++) {
        double v = narrow_value(c, bf16), w = narrow_value(c + 1, bf16);
        float fv = (float)v, mid = (float)((v + w) / 2); /* exact */
        float f[5] = {fv, nextafterf(fv, INFINITY), mid,
                      nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int k = 0; k < 5; k++)
            if (isfinite(f[k])) {
                push_float(x, &n, f[k]);
                push_float(x, &n, -f[k]);
            }
    }
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
        0xFFC00000u, 0x7F800001u, 0xFF812345u, 0x7FFFFFFFu, 0x7FA0A0A0u,
        0x00000001u, 0x807FFFFFu, 0x00400000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
        0x477FF000u, 0x477FEFFFu, 0x33000000u, 0x33000001u, 0x7F7FFFFFu};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) {
        float f;
        memcpy(&f, &special[i], sizeof f);
        push_float(x, &n, f);
    }
    test_rng r;
    rng_seed(&r, 0x4E41u + (unsigned)bf16);
    for (int i = 0; i < 200000 && n < most; i++) {
        uint32_t b = (uint32_t)rng_next(&r);
        float f;
        memcpy(&f, &b, sizeof f);
        push_float(x, &n, f);
    }
    *count = n;
    return x;
}

/* Each table's narrow kernel (the engine's own loop where it has none,
 * through mha_narrow_rows as the engine calls it) against the oracle, bit
 * for bit, in runs of awkward lengths with nothing written past a run;
 * then each kernel with a scale (normalize's product, rounded to fp32
 * first, then narrowed). */
static void narrow_all(int bf16)
{
    table_set ts;
    get_tables(&ts);
    size_t n;
    float *x = narrow_inputs(bf16, &n);
    uint16_t *want = test_alloc(n * sizeof *want);
    uint16_t *y = test_alloc((n + GUARD) * sizeof *y);
    static const int64_t runs[] = {1, 7, 8, 9, 15, 16, 17, 31, 64, 1000};
    static const float scales[] = {1.0f, 0.3f, 1.0f / 3.0f, 4096.0f};
    const mk_dtype dt = bf16 ? MK_BF16 : MK_F16;
    int kernels = 0;
    for (size_t sc = 0; sc < sizeof scales / sizeof *scales; sc++) {
        const float scale = scales[sc];
        for (size_t i = 0; i < n; i++)
            want[i] = ref_narrow(x[i] * scale, bf16);
        for (int t = 0; t < ts.n; t++) {
            const mk_table *tab = &ts.t[t];
            const char *isa = mha_isa_name(ts.isa[t]);
            if (sc > 0 && !tab->narrow[dt])
                continue;
            kernels += sc == 0 && tab->narrow[dt] != NULL;
            memset(y, 0xA5, (n + GUARD) * sizeof *y);
            size_t at = 0;
            for (int k = 0; at < n; k++) {
                int64_t len = runs[k % 10];
                if ((size_t)len > n - at)
                    len = (int64_t)(n - at);
                if (sc == 0)
                    mha_narrow_rows(tab, bf16 ? MHA_BF16 : MHA_F16, x + at,
                                    len, 1, len, y + at, len);
                else
                    tab->narrow[dt](x + at, len, scale, y + at);
                REQUIRE(at + (size_t)len == n ||
                            y[at + (size_t)len] == 0xA5A5,
                        "narrow [%s]: wrote past a run of %lld", isa,
                        (long long)len);
                at += (size_t)len;
            }
            for (size_t i = 0; i < n; i++) {
                uint32_t b;
                memcpy(&b, &x[i], sizeof b);
                REQUIRE(y[i] == want[i],
                        "narrow_%s [%s] scale %g: 0x%08x -> 0x%04x, want "
                        "0x%04x", bf16 ? "bf16" : "f16", isa, (double)scale,
                        (unsigned)b, (unsigned)y[i], (unsigned)want[i]);
            }
            for (size_t i = n; i < n + GUARD; i++)
                REQUIRE(y[i] == 0xA5A5, "narrow [%s]: wrote past n", isa);
        }
    }
    /* The engine's own loop once more, with no table. */
    for (size_t i = 0; i < n; i++)
        want[i] = ref_narrow(x[i], bf16);
    mha_narrow_rows(NULL, bf16 ? MHA_BF16 : MHA_F16, x, (ptrdiff_t)n, 1,
                    (int64_t)n, y, (ptrdiff_t)n);
    for (size_t i = 0; i < n; i++)
        REQUIRE(y[i] == want[i], "narrow_%s [engine]: element %zu",
                bf16 ? "bf16" : "f16", i);
    printf("narrow_%s: %zu inputs, %d of %d tables with a kernel\n",
           bf16 ? "bf16" : "f16", n, kernels, ts.n);
    free(x);
    free(want);
    free(y);
}

START_TEST(narrow_f16_all)
{
    narrow_all(0);
}
END_TEST

START_TEST(narrow_bf16_all)
{
    narrow_all(1);
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


/* ---- half compute slots ------------------------------------------------ */

static const char *const HALF_NAME[MK_HALF_COUNT] = {"bf16", "f16"};

static void to_half(mk_half h, const float *x, size_t n, uint16_t *y)
{
    if (h == MK_HALF_BF16)
        mha_f32_to_bf16(x, n, y);
    else
        mha_f32_to_f16(x, n, y);
}

static void from_half(mk_half h, const uint16_t *x, size_t n, float *y)
{
    if (h == MK_HALF_BF16)
        mha_bf16_to_f32(x, n, y);
    else
        mha_f16_to_f32(x, n, y);
}

/* n random values as codes of h (at stride ld, the gaps random too) and
 * their values as a dense n-row double array of width w. */
static uint16_t *half_rows(mk_half h, test_rng *r, int64_t n, int64_t w,
                           ptrdiff_t ld, double **wide)
{
    size_t count = (size_t)((n - 1) * ld + w);
    float *f = random_floats(r, count);
    uint16_t *x = test_alloc(count * sizeof *x);
    to_half(h, f, count, x);
    *wide = test_alloc((size_t)(n * w) * sizeof **wide);
    for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < w; c++) {
            float v;
            from_half(h, &x[i * ld + c], 1, &v);
            (*wide)[i * w + c] = v;
        }
    free(f);
    return x;
}

static void qk_half_case(const mk_table *t, mk_half h, const char *isa,
                         int64_t m, int64_t n, int64_t d, ptrdiff_t ldq,
                         ptrdiff_t ldk, test_rng *r)
{
    const mk_half_slots *hs = &t->half[h];
    const ptrdiff_t lds = n + 5;
    double *qd, *kd;
    uint16_t *q = half_rows(h, r, m, d, ldq, &qd);
    uint16_t *k = half_rows(h, r, n, d, ldk, &kd);
    double *want = test_alloc((size_t)(m * n) * sizeof *want);
    double *mag = test_alloc((size_t)(m * n) * sizeof *mag);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double sum = 0, abs = 0;
            for (int64_t p = 0; p < d; p++) {
                sum += qd[i * d + p] * kd[j * d + p];
                abs += fabs(qd[i * d + p] * kd[j * d + p]);
            }
            want[i * n + j] = sum, mag[i * n + j] = abs;
        }
    expect e = {.kernel = h == MK_HALF_BF16 ? "pack+qk bf16" : "pack+qk f16",
                .isa = isa, .against = "double"};
    snprintf(e.shape, sizeof e.shape, "m %lld n %lld d %lld ldq %td ldk %td",
             (long long)m, (long long)n, (long long)d, ldq, ldk);
    size_t kp_floats = t->packed_floats(n, d / 2);
    float *kp = out_buffer(kp_floats);
    hs->pack(k, ldk, n, d, kp);
    REQUIRE(count_changed(kp + kp_floats, GUARD) == 0,
            "pack %s [%s] %s: wrote past packed_floats(n, d / 2)",
            HALF_NAME[h], isa, e.shape);
    float *s = out_buffer((size_t)(m * lds));
    hs->qk(q, ldq, m, kp, n, d, s, lds);
    expect_matrix(&e, s, m, n, lds, want, mag, NULL, TOL_REF_ABS, TOL_REF_REL);
    free(q), free(k), free(qd), free(kd), free(want), free(mag), free(kp);
    free(s);
}

/* Keys [off, off + n) of a pack of off + n + 1 value rows (off even, a
 * padded column block stride) whose key after the range is +inf: pv
 * must not multiply it (0 x inf would make NaN). */
static void pv_half_case(const mk_table *t, mk_half h, const char *isa,
                         int64_t m, int64_t n, int64_t dv, ptrdiff_t ldv,
                         int64_t off, test_rng *r)
{
    const mk_half_slots *hs = &t->half[h];
    const ptrdiff_t ldp = n + 3, ldo = dv + 7;
    const int64_t rows = off + n + 1;
    float *p = random_floats(r, (size_t)(m * ldp));
    for (size_t x = 0; x < (size_t)(m * ldp); x++)
        p[x] = x % 11 == 3 ? 0.0f : fabsf(p[x]);
    /* The reference multiplies P rounded to h (the slot's contract). */
    float *pr = test_alloc((size_t)(m * ldp) * sizeof *pr);
    uint16_t *code = test_alloc((size_t)(m * ldp) * sizeof *code);
    to_half(h, p, (size_t)(m * ldp), code);
    from_half(h, code, (size_t)(m * ldp), pr);
    double *vd;
    uint16_t *v = half_rows(h, r, rows, dv, ldv, &vd);
    for (int64_t c = 0; c < dv && ldv > 0; c++) /* (ldv 0: one row) */
        v[(off + n) * ldv + c] = h == MK_HALF_BF16 ? 0x7F80u : 0x7C00u; /* +inf */
    float *alpha = random_floats(r, (size_t)m);
    for (int64_t i = 0; i < m; i++)
        alpha[i] = i % 5 == 0 ? 1.0f : i % 5 == 1 ? 0.0f : fabsf(alpha[i]);
    float *o0 = random_floats(r, (size_t)(m * ldo));
    double *want = test_alloc((size_t)(m * dv) * sizeof *want);
    double *mag = test_alloc((size_t)(m * dv) * sizeof *mag);
    ref_pv(m, n, dv, pr, ldp, vd + off * dv, alpha, o0, ldo, want, mag);
    expect e = {.kernel = h == MK_HALF_BF16 ? "pack_v+pv bf16" : "pack_v+pv f16",
                .isa = isa, .against = "double"};
    snprintf(e.shape, sizeof e.shape,
             "m %lld n %lld dv %lld ldv %td keys from %lld", (long long)m,
             (long long)n, (long long)dv, ldv, (long long)off);
    const ptrdiff_t cb = (ptrdiff_t)hs->packed_v_floats(rows, 1) + 16;
    /* Column blocks of the table's width: one pair of keys' pack is one
     * row of each. */
    const size_t blocks =
        hs->packed_v_floats(2, dv) / hs->packed_v_floats(2, 1);
    const size_t vp_floats = (size_t)cb * (blocks > 0 ? blocks : 1);
    float *vp = out_buffer(vp_floats);
    hs->pack_v(v, ldv, rows, dv, vp, cb);
    REQUIRE(count_changed(vp + vp_floats, GUARD) == 0,
            "pack_v %s [%s] %s: wrote past its column blocks", HALF_NAME[h],
            isa, e.shape);
    float *o = out_buffer((size_t)(m * ldo));
    for (int64_t i = 0; i < m; i++)
        memcpy(&o[i * ldo], &o0[i * ldo], (size_t)dv * sizeof(float));
    hs->pv(p, ldp, m, n, vp + hs->packed_v_floats(off, 1), cb, dv, alpha, o,
           ldo);
    expect_matrix(&e, o, m, dv, ldo, want, mag, NULL, TOL_REF_ABS, TOL_REF_REL);
    free(p), free(pr), free(code), free(v), free(vd), free(alpha), free(o0);
    free(want), free(mag), free(o), free(vp);
}

/* Every qk and pv case of one table's slots of h. */
static void half_cases(const mk_table *t, mk_half h, const char *isa,
                       test_rng *r)
{
    static const int64_t ms[] = {1, 11, 12, 13, 145};
    static const int64_t ns[] = {1, 2, 31, 33, 129, 300};
    static const int64_t ds[] = {2, 18, 64, 130};
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++)
        for (size_t j = 0; j < sizeof ns / sizeof *ns; j++)
            for (size_t k = 0; k < sizeof ds / sizeof *ds; k++)
                qk_half_case(t, h, isa, ms[i], ns[j], ds[k],
                             ds[k] + 2 * (int64_t)i, ds[k] + 4, r);
    static const int64_t dvs[] = {1, 16, 31, 32, 33, 80, 128};
    for (size_t i = 0; i < sizeof ms / sizeof *ms; i++)
        for (size_t j = 0; j < sizeof ns / sizeof *ns; j++)
            for (size_t k = 0; k < sizeof dvs / sizeof *dvs; k++)
                pv_half_case(t, h, isa, ms[i], ns[j], dvs[k],
                             dvs[k] + (int64_t)j, 2 * (int64_t)(k % 3) * 16,
                             r);
    pv_half_case(t, h, isa, 5, 23, 17, 0, 0, r); /* one value row for all */
}

START_TEST(half_slots)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, 61);
    int ran[MK_HALF_COUNT] = {0};
    for (int x = 0; x < ts.n * MK_HALF_COUNT; x++) {
        const mk_table *t = &ts.t[x / MK_HALF_COUNT];
        const mk_half h = (mk_half)(x % MK_HALF_COUNT);
        const mk_half_slots *hs = &t->half[h];
        const char *isa = mha_isa_name(ts.isa[x / MK_HALF_COUNT]);
        int set = !!hs->pack + !!hs->qk + !!hs->packed_v_floats +
                  !!hs->pack_v + !!hs->pv + !!hs->softmax_update;
        REQUIRE(set == 0 || set == 6, "table %s sets %d of the 6 %s slots",
                isa, set, HALF_NAME[h]);
        if (!hs->qk)
            continue;
        ran[h]++;
        half_cases(t, h, isa, &r);
    }
    printf("half compute slots checked: bf16 on %d table(s), f16 on %d\n",
           ran[MK_HALF_BF16], ran[MK_HALF_F16]);
#ifdef MHA_TEST_AMX_EMULATED
    /* The AMX kernels over emulated tiles (kernels/amxbf16/tiles.h), on
     * a CPU that runs the avx512bf16 parts around them. */
    if (mha_isa_available(MHA_ISA_AVX512_BF16)) {
        mk_table emu;
        memset(&emu, 0, sizeof emu);
        mk_init_amxemu(&emu);
        half_cases(&emu, MK_HALF_BF16, emu.name, &r);
        printf("half compute slots checked: bf16 on %s\n", emu.name);
    } else {
        printf("half compute slots: amxbf16 (emulated) not run: this CPU "
               "has no avx512bf16\n");
    }
#endif
}
END_TEST


Suite *suite_kernels(void)
{
    Suite *s = suite_create("kernels");
    TCase *tc = tcase_create("kernels");
    tcase_add_test(tc, qk_edges);
    tcase_add_test(tc, pv_edges);
    tcase_add_test(tc, pv_finish_edges);
    tcase_add_test(tc, normalize_edges);
    tcase_add_test(tc, linear_edges);
    tcase_add_test(tc, linear_deep_in_order);
    tcase_add_test(tc, cvt_f16_exhaustive);
    tcase_add_test(tc, cvt_bf16_exhaustive);
    tcase_add_test(tc, narrow_f16_all);
    tcase_add_test(tc, narrow_bf16_all);
    tcase_add_test(tc, broadcast_input_rows);
    tcase_add_test(tc, half_slots);
    suite_add_tcase(s, tc);
    return s;
}
