/*
 * The decode kernels of every table this build and CPU can run
 * (kernel_check.h): decode_qk and decode_pv on every row count
 * 1..MK_DECODE_ROWS, key counts around any key grouping, widths 1..130,
 * each element type (the quantised ones with broadcast, dense and padded
 * per-row scales), against plain double loops (TOL_REF) and the generic
 * table (TOL_KERNEL), and bitwise determinism across m, n and the column
 * position.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_check.h"

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
static const char *const DTYPE_NAME[] = {"f32",  "f16",      "bf16",
                                         "i8",   "fp8_e4m3", "fp8_e5m2"};
_Static_assert(sizeof DTYPE_NAME / sizeof DTYPE_NAME[0] == MK_DTYPE_COUNT,
               "a name per dtype");

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

/* Element e of an array of type t, widened (a quantised code unscaled,
 * through the reference decoders). */
static double widened(const void *x, mk_dtype t, size_t e)
{
    if (mk_dtype_scaled(t))
        return ref_code_to_double((mha_dtype)t, (const char *)x + e);
    if (t == MK_F32)
        return ((const float *)x)[e];
    uint16_t h = ((const uint16_t *)x)[e];
    return t == MK_F16 ? ref_f16(h) : ref_bf16(h);
}

/* A random finite code of a quantised dtype (any of them but NaN and
 * infinity). */
static uint8_t random_code(test_rng *r, mk_dtype t)
{
    uint8_t c = (uint8_t)(rng_next(r) >> 24);
    if (t == MK_FP8_E4M3 && (c & 0x7F) == 0x7F)
        c = (uint8_t)(c & 0xFE);
    if (t == MK_FP8_E5M2 && (c & 0x7C) == 0x7C)
        c = (uint8_t)(c & 0xFB);
    return c;
}

/* Scales of n rows at stride ld (0: one for all), exactly sized: values
 * that bring the codes to about [-1, 1], some negative. */
static float *random_scales(test_rng *r, mk_dtype t, int64_t n, ptrdiff_t ld)
{
    size_t count = (size_t)((n - 1) * ld + 1);
    float *sc = test_alloc(count * sizeof *sc);
    float most = t == MK_I8 ? 127.0f : t == MK_FP8_E4M3 ? 448.0f : 57344.0f;
    for (size_t x = 0; x < count; x++)
        sc[x] = (0.25f + fabsf(rng_uniform(r))) / most *
                (x % 5 == 3 ? -1.0f : 1.0f);
    return sc;
}

/* rows x width elements of type t at row stride ld (0: one row for all) in
 * a buffer that ends where the last row does, from uniform draws rounded
 * to the type (within half a step: checked), or random codes of a
 * quantised type. wide (rows x width, packed) gets the widened values when
 * non-NULL, times row j's scale sc[j * sc_ld] when sc is. */
static void *random_rows(test_rng *r, mk_dtype t, int64_t rows,
                         int64_t width, ptrdiff_t ld, double *wide,
                         const float *sc, ptrdiff_t sc_ld)
{
    size_t count = (size_t)((rows - 1) * ld + width);
    char *x = test_alloc(count * mk_dtype_size(t));
    for (size_t e = 0; e < count; e++) {
        if (mk_dtype_scaled(t)) {
            x[e] = (char)random_code(r, t);
            continue;
        }
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
                wide[j * width + c] = widened(x, t, (size_t)(j * ld + c)) *
                                      (sc ? sc[j * sc_ld] : 1.0);
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
    const float *sc; /* their scales (quantised types), row j at j * sc_ld */
    ptrdiff_t sc_ld;
    const float *alpha, *o0; /* decode_pv: alpha and o's first value */
    /* The scattered variant: the rows through a row table, each row an
     * allocation of its own; decode_pv with alpha NULL and o0 scaled by
     * alpha beforehand. */
    const void *const *rows;
} decode_call;

/* The call's K/V rows each copied into an exactly sized allocation of its
 * own (ASan reports a read past a row), as a row table. */
static const void **scatter_rows(const decode_call *c)
{
    size_t es = mk_dtype_size(c->t), bytes = (size_t)c->w * es;
    const void **rows = test_alloc((size_t)(c->n + 1) * sizeof *rows);
    for (int64_t j = 0; j < c->n; j++) {
        void *row = test_alloc(bytes ? bytes : 1);
        memcpy(row, (const char *)c->kv + (size_t)(j * c->ldkv) * es, bytes);
        rows[j] = row;
    }
    return rows;
}

static void free_rows(const void **rows, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        free((void *)rows[j]);
    free(rows);
}

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
        /* The same rows through a row table: bitwise the strided result
         * (sentinels included). */
        decode_call scattered = *call;
        const void **rows = scatter_rows(call);
        scattered.rows = rows;
        float *via = out_buffer((size_t)(m * ld));
        run(&scattered, &ts->t[x], via, ld);
        REQUIRE(memcmp(via, out, (size_t)(m * ld) * sizeof *out) == 0,
                "%s [%s] %s: the row-table call differs from the strided "
                "one", e->kernel, e->isa, e->shape);
        free(via);
        free_rows(rows, call->n);
        if (x == 0)
            gen = out;
        else
            free(out);
    }
    free(gen);
}

/* More rows than a table's decode_rows (a wide case on a table without
 * wide kernels, generic's reference among them) go as calls of at most
 * that many rows: the rows are independent. */
static void run_decode_qk(const decode_call *c, const mk_table *t, float *s,
                          ptrdiff_t lds)
{
    for (int64_t i = 0; i < c->m; i += t->decode_rows) {
        int64_t m = c->m - i < t->decode_rows ? c->m - i : t->decode_rows;
        t->decode_qk(c->a + i * c->lda, c->lda, m, c->rows ? NULL : c->kv,
                     c->t, c->rows ? 0 : c->ldkv, c->rows, c->sc, c->sc_ld,
                     c->n, c->w, s + i * lds, lds, NULL);
    }
}

/* The query stride is padded, or 0 (one row for all) in some cases. */
static void decode_qk_case(const table_set *ts, mk_dtype t, int64_t m,
                           int64_t n, int64_t d, ptrdiff_t ldk, test_rng *r)
{
    const ptrdiff_t ldq = (m + n + d) % 5 == 0 ? 0 : d + 3, lds = n + 3;
    float *q = random_floats(r, (size_t)((m - 1) * ldq + d));
    double *kd = test_alloc((size_t)(n * d) * sizeof *kd);
    const ptrdiff_t ldsc = (m + n + d) % 3; /* broadcast, dense, padded */
    float *sc = mk_dtype_scaled(t) ? random_scales(r, t, n, ldsc) : NULL;
    void *k = random_rows(r, t, n, d, ldk, kd, sc, ldsc);
    double *want = test_alloc((size_t)(m * n) * sizeof *want);
    double *mag = test_alloc((size_t)(m * n) * sizeof *mag);
    ref_gemm(m, n, d, q, ldq, kd, 1, d, NULL, want, mag);
    expect e = {.kernel = "decode_qk"};
    snprintf(e.shape, sizeof e.shape,
             "%s m %lld n %lld d %lld ldq %td ldk %td lds %td ldsc %td",
             DTYPE_NAME[t], (long long)m, (long long)n, (long long)d, ldq,
             ldk, lds, sc ? ldsc : (ptrdiff_t)-1);
    decode_call call = {t, m, n, d, q, ldq, k, ldk, sc, ldsc, NULL, NULL,
                        NULL};
    check_tables(ts, &e, run_decode_qk, &call, m, n, lds, want, mag);
    free(q), free(kd), free(k), free(want), free(mag), free(sc);
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
        for (int64_t x = 0; x < c->w; x++)
            o[i * ldo + x] = c->rows ? c->o0[i * ldo + x] * c->alpha[i]
                                     : c->o0[i * ldo + x];
    for (int64_t i = 0; i < c->m; i += t->decode_rows) /* as run_decode_qk */
        t->decode_pv(c->a + i * c->lda, c->lda,
                     c->m - i < t->decode_rows ? c->m - i : t->decode_rows,
                     c->n, c->rows ? NULL : c->kv, c->t, c->rows ? 0 : c->ldkv,
                     c->rows, c->sc, c->sc_ld, c->w,
                     c->rows ? NULL : c->alpha + i, o + i * ldo, ldo, NULL);
}

static void decode_pv_case(const table_set *ts, mk_dtype t, int64_t m,
                           int64_t n, int64_t dv, ptrdiff_t ldv, test_rng *r)
{
    const ptrdiff_t ldp = n + 2, ldo = dv + 5;
    float *p = random_probs(r, m, n, ldp);
    double *vd = test_alloc((size_t)(n * dv) * sizeof *vd);
    const ptrdiff_t ldsc = (m + n + dv) % 3; /* broadcast, dense, padded */
    float *sc = mk_dtype_scaled(t) ? random_scales(r, t, n, ldsc) : NULL;
    void *v = random_rows(r, t, n, dv, ldv, vd, sc, ldsc);
    float *alpha = random_alphas(r, m);
    float *o0 = random_floats(r, (size_t)(m * ldo));
    double *want = test_alloc((size_t)(m * dv) * sizeof *want);
    double *mag = test_alloc((size_t)(m * dv) * sizeof *mag);
    ref_pv(m, n, dv, p, ldp, vd, alpha, o0, ldo, want, mag);
    expect e = {.kernel = "decode_pv"};
    snprintf(e.shape, sizeof e.shape,
             "%s m %lld n %lld dv %lld ldp %td ldv %td ldo %td ldsc %td",
             DTYPE_NAME[t], (long long)m, (long long)n, (long long)dv, ldp,
             ldv, ldo, sc ? ldsc : (ptrdiff_t)-1);
    decode_call call = {t, m, n, dv, p, ldp, v, ldv, sc, ldsc, alpha, o0,
                        NULL};
    check_tables(ts, &e, run_decode_pv, &call, m, dv, ldo, want, mag);
    free(p), free(vd), free(v), free(alpha), free(o0), free(want), free(mag);
    free(sc);
}

/* Row strides of variant c for rows of width w: dense, padded past the
 * width, or 0 (one row broadcast). */
static ptrdiff_t decode_stride(int c, int64_t w)
{
    return c % 3 == 0 ? w : c % 3 == 1 ? w + 7 : 0;
}

/* Runs fn for every m 1..MK_DECODE_ROWS and three wide counts up to
 * MK_DECODE_WIDE_ROWS (every table: generic's in calls of its rows), n,
 * width (the wide counts also past the wide kernels' stack depth of 256)
 * and K/V stride variant with element type t. */
typedef void (*decode_fn)(const table_set *ts, mk_dtype t, int64_t m,
                          int64_t n, int64_t w, ptrdiff_t ld, test_rng *r);
static void for_decode_cases(decode_fn fn, mk_dtype t, uint64_t seed)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, seed);
    static const int64_t wide[] = {9, 13, MK_DECODE_WIDE_ROWS};
    for (int64_t x = 0; x < MK_DECODE_ROWS + 3; x++) {
        int64_t m = x < MK_DECODE_ROWS ? x + 1 : wide[x - MK_DECODE_ROWS];
        for (int a = 0; a < N_DECODE_NS; a++)
            for (int b = 0; b <= N_DECODE_WIDTHS; b++) {
                int64_t w = b < N_DECODE_WIDTHS ? DECODE_WIDTHS[b] : 300;
                if (b == N_DECODE_WIDTHS && m <= MK_DECODE_ROWS)
                    continue;
                for (int c = 0; c < 3; c++)
                    fn(&ts, t, m, DECODE_NS[a], w, decode_stride(c, w), &r);
            }
    }
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
 * its output column first or anywhere in the row, its rows part of a call
 * across kv heads (mk_heads) or of a call per head (zeros of either sign
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
    const size_t es = mk_dtype_size(cx->t);
    float *q = random_floats(r, (size_t)((m - 1) * ldq + d));
    float *sc = mk_dtype_scaled(cx->t) ? random_scales(r, cx->t, n, 1) : NULL;
    char *k = random_rows(r, cx->t, n, d, ldk, NULL, NULL, 0);
    float *all = test_alloc((size_t)(m * n) * sizeof *all);
    float *one = test_alloc((size_t)n * sizeof *one);
    cx->tb->decode_qk(q, ldq, m, k, cx->t, ldk, NULL, sc, 1, n, d, all, n, NULL);
    for (int64_t i = 0; i < m; i++) {
        cx->tb->decode_qk(q + i * ldq, ldq, 1, k, cx->t, ldk, NULL, sc, 1, n, d,
                          one, n, NULL);
        for (int64_t j = 0; j < n; j++)
            expect_same_score(cx, one[j], all[i * n + j], i, j, "with m 1");
    }
    for (int64_t j = 0; j < n; j++) {
        float col[MK_DECODE_ROWS], lone;
        const char *row = k + (size_t)(j * ldk) * es;
        const float *sj = sc ? sc + j : NULL;
        cx->tb->decode_qk(q, ldq, m, row, cx->t, ldk, NULL, sj, 1, 1, d, col, 1, NULL);
        for (int64_t i = 0; i < m; i++)
            expect_same_score(cx, col[i], all[i * n + j], i, j, "with n 1");
        int64_t i = j % m;
        cx->tb->decode_qk(q + i * ldq, ldq, 1, row, cx->t, ldk, NULL, sj, 1, 1, d,
                          &lone, 1, NULL);
        expect_same_score(cx, lone, all[i * n + j], i, j, "with m = n = 1");
    }
    free(q), free(k), free(all), free(one), free(sc);
}

/* o (m rows of dv at stride ldo) against want (the same layout), columns
 * [c0, dv). */
static void expect_same_rows(const same_ctx *cx, const char *how,
                             const float *o, const float *want, int64_t m,
                             int64_t c0, int64_t dv, ptrdiff_t ldo,
                             const char *ref)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t c = c0; c < dv; c++)
            REQUIRE(same_value(o[i * ldo + c], want[i * ldo + c]),
                    "decode_pv [%s] %s dv %lld: o[%lld][%lld] = %a %s, %a "
                    "%s", cx->isa, DTYPE_NAME[cx->t], (long long)dv,
                    (long long)i, (long long)c, (double)o[i * ldo + c], how,
                    (double)want[i * ldo + c], ref);
}

static const char ONE_CALL[] = "in one call of 8 rows and 257 keys";

static void decode_pv_same(const same_ctx *cx, test_rng *r)
{
    const int64_t m = MK_DECODE_ROWS, n = 257, dv = cx->width;
    const ptrdiff_t ldv = dv + 3, ldo = dv;
    const size_t es = mk_dtype_size(cx->t), no = (size_t)(m * ldo);
    float *p = random_probs(r, m, n, n);
    float *sc = mk_dtype_scaled(cx->t) ? random_scales(r, cx->t, n, 1) : NULL;
    char *v = random_rows(r, cx->t, n, dv, ldv, NULL, NULL, 0);
    float *alpha = random_alphas(r, m);
    float *o0 = random_floats(r, no);
    float *all = test_alloc(no * sizeof *all);
    float *o = test_alloc(no * sizeof *o);
    memcpy(all, o0, no * sizeof *o0);
    cx->tb->decode_pv(p, n, m, n, v, cx->t, ldv, NULL, sc, 1, dv, alpha, all, ldo, NULL);

    /* Each row alone. */
    memcpy(o, o0, no * sizeof *o0);
    for (int64_t i = 0; i < m; i++)
        cx->tb->decode_pv(p + i * n, n, 1, n, v, cx->t, ldv, NULL, sc, 1, dv,
                          alpha + i, o + i * ldo, ldo, NULL);
    expect_same_rows(cx, "row by row", o, all, m, 0, dv, ldo, ONE_CALL);

    /* Columns [c0, dv) as columns [0, dv - c0) of a narrower call. */
    static const int64_t shifts[] = {1, 3, 4, 8, 16, 17};
    for (size_t x = 0; x < sizeof shifts / sizeof shifts[0]; x++) {
        int64_t c0 = shifts[x];
        if (c0 >= dv)
            break;
        memcpy(o, o0, no * sizeof *o0);
        cx->tb->decode_pv(p, n, m, n, v + (size_t)c0 * es, cx->t, ldv, NULL, sc, 1,
                          dv - c0, alpha, o + c0, ldo, NULL);
        char how[64];
        snprintf(how, sizeof how, "from column %lld on", (long long)c0);
        expect_same_rows(cx, how, o, all, m, c0, dv, ldo, ONE_CALL);
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
    cx->tb->decode_pv(sparse, n, m, n, v, cx->t, ldv, NULL, sc, 1, dv, alpha, all,
                      ldo, NULL);
    memcpy(o, o0, no * sizeof *o0);
    for (int64_t i = 0; i < m; i++)
        cx->tb->decode_pv(&sparse[i * n + keys[i]], 1, 1, 1,
                          v + (size_t)(keys[i] * ldv) * es, cx->t, ldv, NULL,
                          sc ? sc + keys[i] : NULL, 1, dv, alpha + i,
                          o + i * ldo, ldo, NULL);
    expect_same_rows(cx, "with its one key alone", o, all, m, 0, dv, ldo,
                     ONE_CALL);
    free(p), free(v), free(alpha), free(o0), free(all), free(o);
    free(sparse), free(sc);
}

/* Rows spanning kv heads (mk_heads): G kv heads of `group` query rows
 * (with short, the last head's group one row short: the kernels' runtime
 * path; whole heads of 1, 2, 4 or 8 rows take their constant-group loops),
 * keys [n][G] at head stride hld (a [B, L, H, D] position with padding),
 * a scale per (key, head); n odd, so the value pass takes its keys two at
 * a time and then one. One row per kv head takes 11 heads: the
 * kernels' several-heads-at-once dot (MK_KEYS_DOT heads, 8 on avx512)
 * then a short group. tight (TIGHT_Q, TIGHT_HEADS or both): nothing pads
 * the query rows, or the heads and positions; both is the geometry of a
 * [B, L, H, D] cache that the decode files give constant strides at d = 64
 * and 128 (keys_dot_n), one alone must not take them. into_l1: the
 * mk_heads field that picks where the kernels fetch ahead (and, on avx2,
 * whether fp32 spreads that fetch): a hint, which must not change a value.
 * passes nonzero: mk_heads.pass_bytes lets a pass of the kernels' loops
 * take 3 kv heads (passes of 3, 3, 3 and 2 heads of one row, or 2, 2 and
 * 1 grouped heads), a split of the work that must not change a value
 * either. Every score and output is bitwise the one of a call per kv
 * head. */
enum { TIGHT_Q = 1, TIGHT_HEADS = 2 };
static void decode_heads_same_at(const same_ctx *cx, test_rng *r,
                                 int64_t group, int short_last, int tight,
                                 int into_l1, int passes)
{
    const int64_t G = group == 1 ? 11 : 5,
                  m = G * group - (short_last ? 1 : 0), n = 71,
                  w = cx->width;
    const int th = (tight & TIGHT_HEADS) != 0;
    const ptrdiff_t hld = th ? w : w + 2, ld = G * hld + (th ? 0 : 5),
                    ldq = (tight & TIGHT_Q) ? w : w + 1, ldo = w;
    const size_t es = mk_dtype_size(cx->t), no = (size_t)(m * ldo);
    float *q = random_floats(r, (size_t)((m - 1) * ldq + w));
    float *sc = mk_dtype_scaled(cx->t) ? random_scales(r, cx->t, n * G, 1)
                                       : NULL;
    char *kv = random_rows(r, cx->t, n, ld, ld, NULL, NULL, 0);
    float *p = random_probs(r, m, n, n);
    float *alpha = random_alphas(r, m);
    float *o0 = random_floats(r, no);
    float *s_all = test_alloc((size_t)(m * n) * sizeof *s_all);
    float *s_one = test_alloc((size_t)(m * n) * sizeof *s_one);
    float *o_all = test_alloc(no * sizeof *o_all);
    float *o_one = test_alloc(no * sizeof *o_one);
    const int64_t per_head =
        w * (int64_t)sizeof(float) * group + w * (int64_t)es;
    mk_heads h = {group, hld, 1, 0, 0, into_l1, passes ? 3 * per_head : 0};
    cx->tb->decode_qk(q, ldq, m, kv, cx->t, ld, NULL, sc, G, n, w, s_all, n,
                      &h);
    memcpy(o_all, o0, no * sizeof *o0);
    memcpy(o_one, o0, no * sizeof *o0);
    cx->tb->decode_pv(p, n, m, n, kv, cx->t, ld, NULL, sc, G, w, alpha, o_all,
                      ldo, &h);
    for (int64_t g = 0, i = 0; i < m; g++, i += group) {
        int64_t rows = m - i < group ? m - i : group;
        const char *head = kv + (size_t)(g * hld) * es;
        cx->tb->decode_qk(q + i * ldq, ldq, rows, head, cx->t, ld, NULL,
                          sc ? sc + g : NULL, G, n, w, s_one + i * n, n, NULL);
        cx->tb->decode_pv(p + i * n, n, rows, n, head, cx->t, ld, NULL,
                          sc ? sc + g : NULL, G, w, alpha + i, o_one + i * ldo,
                          ldo, NULL);
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            REQUIRE(same_value(s_all[i * n + j], s_one[i * n + j]),
                    "decode_qk [%s] %s d %lld across %lld heads of %lld rows "
                    "(into_l1 %d, passes %d): s[%lld][%lld] = %a, %a in a "
                    "call per head",
                    cx->isa, DTYPE_NAME[cx->t], (long long)w, (long long)G,
                    (long long)group, into_l1, passes, (long long)i,
                    (long long)j,
                    (double)s_all[i * n + j], (double)s_one[i * n + j]);
    char how[64];
    snprintf(how, sizeof how,
             "across heads of %lld rows (into_l1 %d, passes %d)",
             (long long)group, into_l1, passes);
    expect_same_rows(cx, how, o_all, o_one, m, 0, w, ldo, "in a call per head");

    /* Through a row table (head 0's rows, in a shuffled order; a paged
     * cache), against calls per head through per-head tables. The table
     * runs `more` entries past row n - 1, rows of 0x7F bytes (a NaN or a
     * value far off in every dtype): prefetch hints, which must not
     * change a value. */
    enum { MORE = 2 * MK_HEADS_AHEAD };
    const void **tab = test_alloc((size_t)(n + MORE) * sizeof *tab);
    const void **htab = test_alloc((size_t)n * sizeof *htab);
    float *tsc = sc ? test_alloc((size_t)(n * G) * sizeof *tsc) : NULL;
    char *junk = test_alloc((size_t)(MORE * ld) * es);
    memset(junk, 0x7F, (size_t)(MORE * ld) * es);
    for (int64_t j = 0; j < n; j++) {
        int64_t at = (j * 29 + 11) % n; /* 29 and 71 coprime */
        tab[j] = kv + (size_t)(at * ld) * es;
        for (int64_t g = 0; tsc && g < G; g++)
            tsc[j * G + g] = sc[at * G + g];
    }
    for (int64_t j = 0; j < MORE; j++)
        tab[n + j] = junk + (size_t)(j * ld) * es;
    h.more = MORE;
    h.ahead_bytes = 1; /* the fetch a position ahead: hints only */
    cx->tb->decode_qk(q, ldq, m, NULL, cx->t, 0, tab, tsc, G, n, w, s_all, n,
                      &h);
    memcpy(o_all, o0, no * sizeof *o0);
    memcpy(o_one, o0, no * sizeof *o0);
    cx->tb->decode_pv(p, n, m, n, NULL, cx->t, 0, tab, tsc, G, w, alpha,
                      o_all, ldo, &h);
    for (int64_t g = 0, i = 0; i < m; g++, i += group) {
        int64_t rows = m - i < group ? m - i : group;
        for (int64_t j = 0; j < n; j++)
            htab[j] = (const char *)tab[j] + (size_t)(g * hld) * es;
        cx->tb->decode_qk(q + i * ldq, ldq, rows, NULL, cx->t, 0, htab,
                          tsc ? tsc + g : NULL, G, n, w, s_one + i * n, n,
                          NULL);
        cx->tb->decode_pv(p + i * n, n, rows, n, NULL, cx->t, 0, htab,
                          tsc ? tsc + g : NULL, G, w, alpha + i,
                          o_one + i * ldo, ldo, NULL);
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            REQUIRE(same_value(s_all[i * n + j], s_one[i * n + j]),
                    "decode_qk [%s] %s d %lld across %lld heads of %lld rows "
                    "(into_l1 %d, passes %d) through a row table: "
                    "s[%lld][%lld] = %a, %a in a call per head", cx->isa,
                    DTYPE_NAME[cx->t], (long long)w, (long long)G,
                    (long long)group, into_l1, passes,
                    (long long)i, (long long)j, (double)s_all[i * n + j],
                    (double)s_one[i * n + j]);
    expect_same_rows(cx, how, o_all, o_one, m, 0, w, ldo,
                     "in a call per head, through row tables");
    free(tab), free(htab), free(tsc), free(junk);
    free(q), free(sc), free(kv), free(p), free(alpha), free(o0);
    free(s_all), free(s_one), free(o_all), free(o_one);
}

/* A table with wide kernels (decode_rows > MK_DECODE_ROWS): a score of a
 * wide call is bitwise the same in any other wide call (16 rows against
 * 9 of them, 257 keys against each key alone), and an output element of
 * decode_pv the same as with its row alone (a narrow call). */
static void decode_wide_same(const same_ctx *cx, test_rng *r)
{
    const int64_t m = cx->tb->decode_rows, n = 257, d = cx->width;
    if (m <= MK_DECODE_ROWS)
        return;
    const ptrdiff_t ldq = d + 1, ldk = d + 3, ldo = d;
    const size_t es = mk_dtype_size(cx->t), no = (size_t)(m * ldo);
    float *q = random_floats(r, (size_t)((m - 1) * ldq + d));
    float *sc = mk_dtype_scaled(cx->t) ? random_scales(r, cx->t, n, 1) : NULL;
    char *k = random_rows(r, cx->t, n, d, ldk, NULL, NULL, 0);
    float *all = test_alloc((size_t)(m * n) * sizeof *all);
    float *part = test_alloc((size_t)(m * n) * sizeof *part);
    cx->tb->decode_qk(q, ldq, m, k, cx->t, ldk, NULL, sc, 1, n, d, all, n,
                      NULL);
    const int64_t m9 = MK_DECODE_ROWS + 1, i0 = m - m9; /* the last 9 */
    cx->tb->decode_qk(q + i0 * ldq, ldq, m9, k, cx->t, ldk, NULL, sc, 1, n, d,
                      part, n, NULL);
    for (int64_t i = 0; i < m9; i++)
        for (int64_t j = 0; j < n; j++)
            expect_same_score(cx, part[i * n + j], all[(i0 + i) * n + j],
                              i0 + i, j, "in a wide call of 9 rows");
    for (int64_t j = 0; j < n; j++) {
        float col[MK_DECODE_WIDE_ROWS];
        cx->tb->decode_qk(q, ldq, m, k + (size_t)(j * ldk) * es, cx->t, ldk,
                          NULL, sc ? sc + j : NULL, 1, 1, d, col, 1, NULL);
        for (int64_t i = 0; i < m; i++)
            expect_same_score(cx, col[i], all[i * n + j], i, j,
                              "in a wide call with n 1");
    }
    float *p = random_probs(r, m, n, n);
    float *v = (float *)random_rows(r, cx->t, n, d, ldk, NULL, NULL, 0);
    float *alpha = random_alphas(r, m);
    float *o0 = random_floats(r, no);
    float *o_all = test_alloc(no * sizeof *o_all);
    float *o_one = test_alloc(no * sizeof *o_one);
    memcpy(o_all, o0, no * sizeof *o0);
    memcpy(o_one, o0, no * sizeof *o0);
    cx->tb->decode_pv(p, n, m, n, v, cx->t, ldk, NULL, sc, 1, d, alpha, o_all,
                      ldo, NULL);
    for (int64_t i = 0; i < m; i++)
        cx->tb->decode_pv(p + i * n, n, 1, n, v, cx->t, ldk, NULL, sc, 1, d,
                          alpha + i, o_one + i * ldo, ldo, NULL);
    expect_same_rows(cx, "in a wide call", o_all, o_one, m, 0, d, ldo,
                     "row by row");
    free(q), free(sc), free(k), free(all), free(part), free(p), free(v);
    free(alpha), free(o0), free(o_all), free(o_one);
}

static void decode_heads_same(const same_ctx *cx, test_rng *r, int64_t group,
                              int short_last, int tight)
{
    decode_heads_same_at(cx, r, group, short_last, tight, 0, 0);
    decode_heads_same_at(cx, r, group, short_last, tight, 1, 0);
    decode_heads_same_at(cx, r, group, short_last, tight, 0, 1);
}

START_TEST(decode_deterministic)
{
    table_set ts;
    get_tables(&ts);
    test_rng r;
    rng_seed(&r, 67);
    static const int64_t widths[] = {1, 3, 8, 17, 64, 130};
    for (int x = 0; x < ts.n; x++)
        for (int t = MK_F32; t < MK_DTYPE_COUNT; t++)
            for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
                same_ctx cx = {&ts.t[x], mha_isa_name(ts.isa[x]),
                               (mk_dtype)t, widths[w]};
                decode_qk_same(&cx, &r);
                decode_pv_same(&cx, &r);
                decode_wide_same(&cx, &r);
                decode_heads_same(&cx, &r, 1, 0, 0);
                decode_heads_same(&cx, &r, 2, 0, 0);
                decode_heads_same(&cx, &r, 4, 0, 0);
                decode_heads_same(&cx, &r, 8, 0, 0);
                decode_heads_same(&cx, &r, 3, 1, 0);
                decode_heads_same(&cx, &r, 4, 1, 0);
                decode_heads_same(&cx, &r, 6, 1, 0);
            }
    /* The constant-stride geometry of one row per kv head (d = 64, 128),
     * and each half of it alone. */
    static const int64_t tight[] = {64, 128};
    for (int x = 0; x < ts.n; x++)
        for (int t = MK_F32; t < MK_DTYPE_COUNT; t++)
            for (size_t w = 0; w < sizeof tight / sizeof tight[0]; w++) {
                same_ctx cx = {&ts.t[x], mha_isa_name(ts.isa[x]),
                               (mk_dtype)t, tight[w]};
                decode_heads_same(&cx, &r, 1, 0, TIGHT_Q | TIGHT_HEADS);
                decode_heads_same(&cx, &r, 1, 0, TIGHT_Q);
                decode_heads_same(&cx, &r, 1, 0, TIGHT_HEADS);
            }
}
END_TEST


Suite *suite_kernel_decode(void)
{
    Suite *s = suite_create("kernel_decode");
    TCase *tc = tcase_create("kernel_decode");
    tcase_add_loop_test(tc, decode_qk_edges, MK_F32, MK_DTYPE_COUNT);
    tcase_add_loop_test(tc, decode_pv_edges, MK_F32, MK_DTYPE_COUNT);
    tcase_add_test(tc, decode_deterministic);
    suite_add_tcase(s, tc);
    return s;
}
