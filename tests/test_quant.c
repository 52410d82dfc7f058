/*
 * Quantised K/V (int8, fp8 E4M3, fp8 E5M2; docs/design.md, "Dtypes"):
 *  - every one of the 256 codes of each format through every table's widen
 *    and decode kernels against the reference decoders (tests/support,
 *    written from the OCP spec);
 *  - mha_quantize: rounding (ties to even), saturation, NaN and infinity,
 *    every finite code back to itself, computed scales (per row, per head,
 *    per tensor, all-zero and non-finite rows);
 *  - attention on quantised K/V (decode, split-KV, GQA, prefill with
 *    bottom-right causal masking, mixed K/V dtypes, per-tensor and per-row
 *    scales) against the oracle on the dequantised values at TOL_ATTN on
 *    every ISA; the error against the unquantised fp32 K/V is printed (a
 *    property of the format, not checked against a tolerance);
 *  - mha_quantize_paged: every written slot bit for bit mha_quantize's
 *    codes and scales of its token, everything else untouched (skipped
 *    and repeated slots, [B, L, H, D] and [B, H, L, D] pools, computed per
 *    row or per token, or given);
 *  - bad scales and bad mha_quantize / mha_quantize_paged arguments:
 *    status, message, outputs untouched.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_check.h"
#include "oracle.h"

static const mha_dtype QTYPES[3] = {MHA_I8, MHA_FP8_E4M3, MHA_FP8_E5M2};

/* An engine of the best ISA that runs here. */
static mha_engine *best_engine(int nthreads)
{
    mha_isa isas[TEST_MAX_ISAS];
    int n = available_isas(isas);
    return make_engine(isas[n - 1], nthreads);
}

static int same_or_nan(double got, double want)
{
    return (isnan(got) && isnan(want)) ||
           (got == want && signbit(got) == signbit(want));
}

/* ---- Every code ------------------------------------------------------- */

START_TEST(every_code_every_table)
{
    mha_dtype dt = QTYPES[_i];
    table_set ts;
    get_tables(&ts);
    uint8_t codes[256];
    for (int c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    for (int x = 0; x < ts.n; x++) {
        const mk_table *t = &ts.t[x];
        const char *isa = mha_isa_name(ts.isa[x]);
        float y[256], s[256], o[256] = {0}, one = 1.0f, zero = 0.0f;
        t->widen[dt](codes, 256, y);
        /* decode_pv with p = 1, scale 1, alpha 0: o = the row's values;
         * decode_qk with q = 1 and d = 1 over 256 rows: s_j = code j. */
        t->decode_pv(&one, 1, 1, 1, codes, (mk_dtype)dt, 256, NULL, &one, 0,
                     256, &zero, o, 256, NULL);
        t->decode_qk(&one, 1, 1, codes, (mk_dtype)dt, 1, NULL, &one, 0, 256, 1,
                     s, 256, NULL);
        for (int c = 0; c < 256; c++) {
            double want = ref_code_to_double(dt, &codes[c]);
            REQUIRE(same_or_nan(y[c], want), "[%s] %s widen of 0x%02x: %a, "
                    "want %a", isa, mha_dtype_name(dt), c, (double)y[c], want);
            REQUIRE(same_or_nan(o[c], want) || (want == 0 && o[c] == 0),
                    "[%s] %s decode_pv of 0x%02x: %a, want %a", isa,
                    mha_dtype_name(dt), c, (double)o[c], want);
            REQUIRE(same_or_nan(s[c], want) || (want == 0 && s[c] == 0),
                    "[%s] %s decode_qk of 0x%02x: %a, want %a", isa,
                    mha_dtype_name(dt), c, (double)s[c], want);
        }
    }
}
END_TEST

/* ---- mha_quantize ----------------------------------------------------- */

/* x[0..n) quantised to dt with one given scale; codes into out. */
static void quantize_given(mha_dtype dt, const float *x, int64_t n,
                           float scale, uint8_t *out)
{
    mha_tensor src = mha_tensor_bshd((void *)x, 1, 1, 1, n);
    mha_tensor dst = mha_tensor_bshd(out, 1, 1, 1, n);
    dst.dtype = dt;
    dst.scales.data = &scale;
    mha_status st = mha_quantize(&src, &dst, NULL);
    ck_assert_msg(st == MHA_OK, "%s", mha_last_error());
}

typedef struct {
    float x;
    uint8_t code;
} qcase;

static void expect_codes(mha_dtype dt, const qcase *c, int n)
{
    float x[32];
    uint8_t got[32];
    for (int i = 0; i < n; i++)
        x[i] = c[i].x;
    quantize_given(dt, x, n, 1.0f, got);
    for (int i = 0; i < n; i++)
        REQUIRE(got[i] == c[i].code, "%s: %a -> 0x%02x, want 0x%02x",
                mha_dtype_name(dt), (double)c[i].x, got[i], c[i].code);
}

START_TEST(quantize_rounding_and_specials)
{
    static const qcase i8[] = {
        {2.5f, 2},    {3.5f, 4},       {-2.5f, 0xFE},      {0.5f, 0},
        {1.5f, 2},    {126.5f, 126},   {127.4f, 127},      {200.0f, 127},
        {-1e30f, 0x81}, {INFINITY, 127}, {-INFINITY, 0x81}, {NAN, 0},
        {-0.0f, 0}};
    expect_codes(MHA_I8, i8, (int)(sizeof i8 / sizeof i8[0]));
    static const qcase e4m3[] = {
        {448.0f, 0x7E}, {464.0f, 0x7E}, {1e9f, 0x7E},
        {INFINITY, 0x7E}, {-INFINITY, 0xFE}, {NAN, 0x7F}, {-NAN, 0xFF},
        {0x1p-9f, 0x01}, {0x1p-10f, 0x00}, {0x3p-10f, 0x02},
        {0.0f, 0x00}, {-0.0f, 0x80}, {1.0f, 0x38}, {1.0625f, 0x38},
        {1.1875f, 0x3A}, {-1.5f, 0xBC}, {0x1p-6f, 0x08}, {0x1.ep-7f, 0x08}};
    expect_codes(MHA_FP8_E4M3, e4m3, (int)(sizeof e4m3 / sizeof e4m3[0]));
    static const qcase e5m2[] = {
        {57344.0f, 0x7B}, {61440.0f, 0x7B}, {1e9f, 0x7B},
        {INFINITY, 0x7C}, {-INFINITY, 0xFC}, {NAN, 0x7E}, {0x1p-16f, 0x01},
        {0x1p-17f, 0x00}, {0x3p-17f, 0x02}, {1.0f, 0x3C}, {1.125f, 0x3C},
        {1.375f, 0x3E}, {-0.0f, 0x80}};
    expect_codes(MHA_FP8_E5M2, e5m2, (int)(sizeof e5m2 / sizeof e5m2[0]));
}
END_TEST

/* Every finite code, decoded and quantised again (scale 1), is itself
 * (0x80, -0, included). */
START_TEST(quantize_every_code_round_trips)
{
    mha_dtype dt = QTYPES[_i];
    float x[256];
    uint8_t got[256];
    for (int c = 0; c < 256; c++) {
        uint8_t b = (uint8_t)c;
        double v = ref_code_to_double(dt, &b);
        x[c] = isnan(v) ? 0.0f : (float)v;
    }
    quantize_given(dt, x, 256, 1.0f, got);
    for (int c = 0; c < 256; c++) {
        uint8_t b = (uint8_t)c;
        double v = ref_code_to_double(dt, &b);
        if (isnan(v) || (dt == MHA_I8 && c == 0x80))
            continue; /* NaN codes; -128 saturates to -127 */
        REQUIRE(got[c] == c, "%s: code 0x%02x (%a) came back as 0x%02x",
                mha_dtype_name(dt), c, v, got[c]);
    }
}
END_TEST

START_TEST(quantize_computed_scales)
{
    /* [1, 3, 2, 2]: rows of (s, h). */
    float x[12] = {254.0f, -3.0f,   0.0f, 0.0f,   /* s0: h0, h1 */
                   NAN,    100.0f,  INFINITY, -1.0f, /* s1 */
                   -5.0f,  2.0f,    1e-44f, 0.0f};  /* s2 */
    mha_tensor src = mha_tensor_bshd(x, 1, 3, 2, 2);
    uint8_t q[12];
    mha_tensor dst = mha_tensor_bshd(q, 1, 3, 2, 2);
    dst.dtype = MHA_I8;
    float sc[6];
    dst.scales.stride_seq = 2, dst.scales.stride_head = 1;
    ck_assert_msg(mha_quantize(&src, &dst, sc) == MHA_OK, "%s",
                  mha_last_error());
    const float want[6] = {2.0f, 1.0f, 100.0f / 127, 1.0f / 127,
                           5.0f / 127, FLT_MIN};
    for (int i = 0; i < 6; i++)
        ck_assert_msg(sc[i] == want[i], "scale %d: %a, want %a", i,
                      (double)sc[i], (double)want[i]);
    ck_assert_int_eq((int8_t)q[0], 127);
    ck_assert_int_eq((int8_t)q[1], -2); /* -3 / 2 = -1.5 -> -2 */
    ck_assert_int_eq((int8_t)q[4], 0);  /* NaN */
    ck_assert_int_eq((int8_t)q[5], 127);
    ck_assert_int_eq((int8_t)q[6], 127); /* inf saturates */

    /* One scale per head (stride_seq 0), one per tensor (all 0). */
    float ph[2], pt[1];
    dst.dtype = MHA_FP8_E4M3;
    dst.scales.stride_seq = 0, dst.scales.stride_head = 1;
    ck_assert(mha_quantize(&src, &dst, ph) == MHA_OK);
    ck_assert(ph[0] == 254.0f / 448 && ph[1] == 1.0f / 448);
    dst.scales.stride_head = 0;
    ck_assert(mha_quantize(&src, &dst, pt) == MHA_OK);
    ck_assert(pt[0] == 254.0f / 448);

    /* The largest finite magnitude counts (only NaN and inf are left
     * out of the absmax). */
    float big[2] = {-FLT_MAX, 1.0f};
    uint8_t bq[2];
    float bsc[1];
    mha_tensor bsrc = mha_tensor_bshd(big, 1, 1, 1, 2),
               bdst = mha_tensor_bshd(bq, 1, 1, 1, 2);
    bdst.dtype = MHA_I8;
    ck_assert(mha_quantize(&bsrc, &bdst, bsc) == MHA_OK);
    ck_assert_msg(bsc[0] == FLT_MAX / 127, "scale %a, want %a",
                  (double)bsc[0], (double)(FLT_MAX / 127));
    ck_assert_int_eq((int8_t)bq[0], -127);
    ck_assert_int_eq((int8_t)bq[1], 0); /* 127 / FLT_MAX rounds to 0 */
}
END_TEST

/* ---- Attention on quantised K/V --------------------------------------- */

typedef struct qattn {
    int64_t b, h, hkv, lq, lk, d;
    mha_causal causal;
    mha_dtype kt, vt;
    int scales; /* 0 per row, 1 per head, 2 per tensor */
    int nthreads;
} qattn;

static const qattn QCASES[] = {
    {2, 8, 2, 1, 700, 64, MHA_CAUSAL_NONE, MHA_I8, MHA_I8, 0, 2},
    {2, 8, 2, 1, 700, 64, MHA_CAUSAL_NONE, MHA_FP8_E4M3, MHA_FP8_E4M3, 0, 2},
    {2, 8, 2, 1, 700, 64, MHA_CAUSAL_NONE, MHA_FP8_E5M2, MHA_FP8_E5M2, 0, 2},
    {1, 4, 4, 1, 1500, 40, MHA_CAUSAL_NONE, MHA_I8, MHA_FP8_E4M3, 2, 3},
    {1, 4, 1, 3, 300, 24, MHA_CAUSAL_BOTTOM_RIGHT, MHA_FP8_E4M3, MHA_I8, 1, 2},
    {2, 4, 2, 37, 130, 32, MHA_CAUSAL_BOTTOM_RIGHT, MHA_I8, MHA_I8, 0, 2},
    {1, 2, 2, 70, 200, 48, MHA_CAUSAL_TOP_LEFT, MHA_FP8_E4M3, MHA_FP8_E5M2,
     1, 2},
    {1, 2, 1, 20, 600, 64, MHA_CAUSAL_NONE, MHA_FP8_E5M2, MHA_F16, 2, 1},
};
#define N_QCASES ((int)(sizeof QCASES / sizeof QCASES[0]))

/* src (fp32 [B, L, Hkv, D]) as a view of dtype dt: the fp32 view itself,
 * a binary16 copy, or quantised codes with computed scales (into *codes,
 * *scales, freed by the caller). */
static mha_tensor store(const qattn *c, float *src, mha_dtype dt,
                        void **codes, float **scales)
{
    mha_tensor s = mha_tensor_bshd(src, c->b, c->lk, c->hkv, c->d);
    size_t n = (size_t)(c->b * c->lk * c->hkv * c->d);
    *scales = NULL;
    if (dt == MHA_F16) {
        uint16_t *h = test_alloc(n * 2);
        mha_f32_to_f16(src, n, h);
        *codes = h;
        mha_tensor t = mha_tensor_bshd(h, c->b, c->lk, c->hkv, c->d);
        t.dtype = MHA_F16;
        return t;
    }
    *codes = test_alloc(n);
    mha_tensor t = mha_tensor_bshd(*codes, c->b, c->lk, c->hkv, c->d);
    t.dtype = dt;
    *scales = test_alloc((size_t)(c->b * c->lk * c->hkv) * sizeof(float));
    if (c->scales == 0)
        t.scales.stride_batch = c->lk * c->hkv, t.scales.stride_seq = c->hkv,
        t.scales.stride_head = 1;
    else if (c->scales == 1)
        t.scales.stride_batch = c->hkv, t.scales.stride_head = 1;
    mha_status st = mha_quantize(&s, &t, *scales);
    ck_assert_msg(st == MHA_OK, "%s", mha_last_error());
    t.scales.data = *scales;
    return t;
}

START_TEST(attention_vs_oracle)
{
    const qattn *c = &QCASES[_i];
    test_rng r;
    rng_seed(&r, 1000 + (uint64_t)_i);
    size_t nq = (size_t)(c->b * c->lq * c->h * c->d);
    size_t nkv = (size_t)(c->b * c->lk * c->hkv * c->d);
    float *q = random_floats(&r, nq), *k = random_floats(&r, nkv),
          *v = random_floats(&r, nkv), *out = test_alloc(nq * 4);
    void *kc, *vc;
    float *ks, *vs;
    mha_attention_args a = {0};
    a.q = mha_tensor_bshd(q, c->b, c->lq, c->h, c->d);
    a.k = store(c, k, c->kt, &kc, &ks);
    a.v = store(c, v, c->vt, &vc, &vs);
    a.out = mha_tensor_bshd(out, c->b, c->lq, c->h, c->d);
    mha_mask mask = {.causal = c->causal};
    a.mask = &mask;
    char what[160];
    snprintf(what, sizeof what, "quant case %d: K %s V %s B %lld H %lld/%lld "
             "Lq %lld Lk %lld d %lld scales %d", _i, mha_dtype_name(c->kt),
             mha_dtype_name(c->vt), (long long)c->b, (long long)c->h,
             (long long)c->hkv, (long long)c->lq, (long long)c->lk,
             (long long)c->d, c->scales);
    /* Against the oracle on the dequantised values, every ISA. */
    check_attention(&a, nq, c->lq > 1, c->nthreads, what);

    /* Against the unquantised fp32 K/V: reported, not checked. */
    mha_attention_args f = a;
    f.k = mha_tensor_bshd(k, c->b, c->lk, c->hkv, c->d);
    f.v = mha_tensor_bshd(v, c->b, c->lk, c->hkv, c->d);
    double *want = test_alloc(nq * sizeof *want);
    oracle_attention(&f, want, NULL);
    mha_engine *e = best_engine(c->nthreads);
    ck_assert(mha_attention(e, &a) == MHA_OK);
    double worst = 0;
    for (size_t i = 0; i < nq; i++) {
        /* Not fmax: aarch64 GCC 12 -O3 fails vectorising that reduction. */
        double err = fabs((double)out[i] - want[i]);
        if (err > worst)
            worst = err;
    }
    printf("%s: max |out - fp32 K/V oracle| = %.3g\n", what, worst);
    mha_engine_destroy(e);
    free(q), free(k), free(v), free(out), free(kc), free(vc), free(ks);
    free(vs), free(want);
}
END_TEST

/* ---- Bad input -------------------------------------------------------- */

enum { BB = 1, BH = 2, BL = 16, BD = 8 };

typedef struct qfix {
    float q[BB * BH * BD], k[BB * BL * BH * BD], out[BB * BH * BD];
    int8_t kc[BB * BL * BH * BD], vc[BB * BL * BH * BD];
    float ks[BB * BL * BH], vs[BB * BL * BH];
    mha_attention_args args;
} qfix;

static void qfix_init(qfix *f)
{
    test_rng r;
    rng_seed(&r, 5);
    fill_uniform(&r, f->q, sizeof f->q / 4);
    for (size_t i = 0; i < sizeof f->kc; i++)
        f->kc[i] = (int8_t)(rng_next(&r) >> 40), f->vc[i] = (int8_t)i;
    for (int i = 0; i < BB * BL * BH; i++)
        f->ks[i] = 0.01f, f->vs[i] = 0.02f;
    memset(&f->args, 0, sizeof f->args);
    f->args.q = mha_tensor_bshd(f->q, BB, 1, BH, BD);
    f->args.k = mha_tensor_bshd(f->kc, BB, BL, BH, BD);
    f->args.v = mha_tensor_bshd(f->vc, BB, BL, BH, BD);
    f->args.out = mha_tensor_bshd(f->out, BB, 1, BH, BD);
    f->args.k.dtype = MHA_I8, f->args.v.dtype = MHA_FP8_E4M3;
    mha_scales per_row = {f->ks, BL * BH, BH, 1};
    f->args.k.scales = per_row;
    per_row.data = f->vs;
    f->args.v.scales = per_row;
}

typedef struct qbad {
    const char *what;
    mha_status status;
    const char *field;
    void (*edit)(qfix *f);
} qbad;

static void k_no_scales(qfix *f) { f->args.k.scales.data = NULL; }
static void v_no_scales(qfix *f) { f->args.v.scales.data = NULL; }
static void k_sb_neg(qfix *f) { f->args.k.scales.stride_batch = -1; }
static void k_ss_neg(qfix *f) { f->args.k.scales.stride_seq = -1; }
static void v_sh_neg(qfix *f) { f->args.v.scales.stride_head = -2; }
static void k_zero(qfix *f) { f->ks[2 * BH + 1] = 0.0f; }
static void k_neg_zero(qfix *f) { f->ks[0] = -0.0f; }
static void v_nan(qfix *f) { f->vs[BL * BH - 1] = NAN; }
static void v_inf(qfix *f) { f->vs[3] = INFINITY; }
static void k_huge(qfix *f) { f->args.k.scales.stride_seq = INT64_MAX / 2; }
static void out_on_scales(qfix *f)
{
    f->args.out.data = f->vs;
    f->args.out.stride_batch = 0; /* stays inside vs */
}
static void f32_with_scales(qfix *f)
{
    f->args.v = mha_tensor_bshd(f->k, BB, BL, BH, BD);
    f->args.v.scales.data = f->vs;
}

static const qbad QBAD[] = {
    {"k.scales.data NULL", MHA_ERR_NULL_POINTER, "k.scales.data", k_no_scales},
    {"v.scales.data NULL", MHA_ERR_NULL_POINTER, "v.scales.data", v_no_scales},
    {"k.scales.stride_batch -1", MHA_ERR_BAD_STRIDE,
     "k.scales.stride_batch", k_sb_neg},
    {"k.scales.stride_seq -1", MHA_ERR_BAD_STRIDE, "k.scales.stride_seq",
     k_ss_neg},
    {"v.scales.stride_head -2", MHA_ERR_BAD_STRIDE, "v.scales.stride_head",
     v_sh_neg},
    {"k scale 0", MHA_ERR_BAD_ARGUMENT, "k.scales[b=0, s=2, h=1]", k_zero},
    {"k scale -0", MHA_ERR_BAD_ARGUMENT, "k.scales[b=0, s=0, h=0]",
     k_neg_zero},
    {"v scale NaN", MHA_ERR_BAD_ARGUMENT, "v.scales[b=0, s=15, h=1]", v_nan},
    {"v scale inf", MHA_ERR_BAD_ARGUMENT, "v.scales[b=0, s=1, h=1]", v_inf},
    {"k.scales extent overflows", MHA_ERR_OVERFLOW, "k.scales", k_huge},
    {"out overlaps v.scales", MHA_ERR_BAD_STRIDE, "v.scales", out_on_scales},
    {"f32 v with scales", MHA_ERR_UNSUPPORTED, "v.scales", f32_with_scales},
};
#define N_QBAD ((int)(sizeof QBAD / sizeof QBAD[0]))

START_TEST(bad_scales)
{
    const qbad *b = &QBAD[_i];
    static qfix f;
    qfix_init(&f);
    mha_engine *e = best_engine(1);
    ck_assert(mha_attention(e, &f.args) == MHA_OK); /* the fixture is good */
    qfix_init(&f);
    b->edit(&f);
    float *o = f.args.out.data;
    size_t no = o == f.out ? sizeof f.out / 4 : sizeof f.vs / 4;
    float before[BB * BL * BH];
    memcpy(before, o, no * 4);
    mha_status st = mha_attention(e, &f.args);
    ck_assert_msg(st == b->status, "%s: %s (%s), want %s", b->what,
                  mha_status_string(st), mha_last_error(),
                  mha_status_string(b->status));
    ck_assert_msg(strstr(mha_last_error(), b->field), "%s: message '%s' "
                  "does not name %s", b->what, mha_last_error(), b->field);
    ck_assert_msg(memcmp(before, o, no * 4) == 0, "%s: output written",
                  b->what);
    mha_engine_destroy(e);
}
END_TEST

/* Every scale of a long cache is checked (the scan runs in blocks, over
 * merged axes where the strides allow): a bad scale first, at a block's
 * edge and last, in a per-row array (one run), per token broadcast over
 * heads, with a gap between rows (strided rows) and head-major (a
 * strided run per position); a subnormal and a negative scale are
 * good. */
START_TEST(scale_scan)
{
    enum { L = 700, H = 3, D = 8 };
    static float q[H * D], out[H * D], ks[2 * L * H], vs[L * H];
    static int8_t kc[L * H * D], vc[L * H * D];
    for (int i = 0; i < H * D; i++)
        q[i] = 0.1f * (float)(i % 7);
    for (int i = 0; i < L * H * D; i++)
        kc[i] = (int8_t)(i * 37), vc[i] = (int8_t)(i * 11);
    for (int i = 0; i < L * H; i++)
        vs[i] = 0.01f;
    const struct {
        const char *what;
        mha_scales sc;
        int heads; /* scales per position the layout holds (1: broadcast) */
    } lay[] = {
        {"per row", {ks, L * H, H, 1}, H},
        {"per token", {ks, L, 1, 0}, 1},
        {"rows with a gap", {ks, 2 * L * H, 2 * H, 1}, H},
        {"head-major", {ks, L * H, 1, L}, H},
    };
    const int spots[][2] = {{0, 0}, {85, 1}, {86, 0}, {L - 1, H - 1}};
    const float bad[] = {0.0f, NAN, -INFINITY, -0.0f};
    mha_engine *e = best_engine(1);
    for (size_t l = 0; l < sizeof lay / sizeof lay[0]; l++) {
        mha_attention_args a;
        memset(&a, 0, sizeof a);
        a.q = mha_tensor_bshd(q, 1, 1, H, D);
        a.k = mha_tensor_bshd(kc, 1, L, H, D);
        a.v = mha_tensor_bshd(vc, 1, L, H, D);
        a.out = mha_tensor_bshd(out, 1, 1, H, D);
        a.k.dtype = a.v.dtype = MHA_I8;
        a.k.scales = lay[l].sc;
        a.v.scales = (mha_scales){vs, L * H, H, 1};
        for (int i = 0; i < 2 * L * H; i++)
            ks[i] = i % 5 == 0 ? 1e-40f : i % 5 == 1 ? -0.5f : 0.02f;
        mha_status st = mha_attention(e, &a);
        ck_assert_msg(st == MHA_OK, "%s: good scales refused: %s",
                      lay[l].what, mha_last_error());
        for (size_t p = 0; p < sizeof spots / sizeof spots[0]; p++) {
            int s_ = spots[p][0], h = lay[l].heads > 1 ? spots[p][1] : 0;
            float *at = ks + s_ * lay[l].sc.stride_seq +
                        h * lay[l].sc.stride_head;
            float keep = *at;
            *at = bad[p];
            char want[64];
            snprintf(want, sizeof want, "k.scales[b=0, s=%d, h=%d]", s_, h);
            memset(out, 0x5A, sizeof out);
            st = mha_attention(e, &a);
            ck_assert_msg(st == MHA_ERR_BAD_ARGUMENT &&
                              strstr(mha_last_error(), want),
                          "%s, %g at s=%d h=%d: %s (%s)", lay[l].what,
                          (double)bad[p], s_, h, mha_status_string(st),
                          mha_last_error());
            for (int i = 0; i < H * D; i++) {
                uint32_t bits;
                memcpy(&bits, &out[i], sizeof bits);
                ck_assert_msg(bits == 0x5A5A5A5Au, "%s: output written",
                              lay[l].what);
            }
            *at = keep;
        }
    }
    mha_engine_destroy(e);
}
END_TEST

START_TEST(bad_quantize)
{
    float x[2 * 8], sc[2], other = 1.0f;
    uint8_t q[2 * 8];
    memset(q, 0x55, sizeof q);
    fill_uniform(&(test_rng){7}, x, 16);
    mha_tensor src = mha_tensor_bshd(x, 1, 2, 1, 8);
    mha_tensor dst = mha_tensor_bshd(q, 1, 2, 1, 8);
    dst.dtype = MHA_FP8_E4M3;
    dst.scales.stride_seq = 1;
    struct {
        const char *what;
        mha_status st;
        const char *field;
        mha_tensor s, d;
        float *out;
    } rows[] = {
        {"dst f16", MHA_ERR_UNSUPPORTED, "dst.dtype", src, dst, sc},
        {"src i8", MHA_ERR_UNSUPPORTED, "src.dtype", dst, dst, sc},
        {"src bf16", MHA_ERR_UNSUPPORTED, "src.dtype", src, dst, sc},
        {"no scales", MHA_ERR_NULL_POINTER, "dst.scales.data", src, dst, NULL},
        {"dst.seq differs", MHA_ERR_BAD_SHAPE, "dst.seq", src, dst, sc},
        {"scales_out differs from dst.scales", MHA_ERR_BAD_ARGUMENT,
         "scales_out", src, dst, sc},
        {"negative scale stride", MHA_ERR_BAD_STRIDE, "dst.scales.stride_seq",
         src, dst, sc},
        {"dst overlaps itself", MHA_ERR_BAD_STRIDE, "dst", src, dst, sc},
        {"scales_out on src", MHA_ERR_BAD_STRIDE, "scales_out", src, dst, x},
        {"given scale 0", MHA_ERR_BAD_ARGUMENT, "dst.scales[b=0, s=1, h=0]",
         src, dst, NULL},
        {"given scale NaN", MHA_ERR_BAD_ARGUMENT, "dst.scales[b=0, s=1, h=0]",
         src, dst, NULL},
        {"given scale -inf", MHA_ERR_BAD_ARGUMENT,
         "dst.scales[b=0, s=1, h=0]", src, dst, NULL},
    };
    const float given[3][2] = {{1.0f, 0.0f}, {1.0f, NAN}, {1.0f, -INFINITY}};
    for (int i = 0; i < 3; i++)
        rows[9 + i].d.scales.data = given[i];
    rows[0].d.dtype = MHA_F16;
    rows[1].s.dtype = MHA_I8;
    rows[2].s.dtype = MHA_BF16;
    rows[4].d.seq = 1;
    rows[5].d.scales.data = &other;
    rows[6].d.scales.stride_seq = -1;
    rows[7].d.stride_seq = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        float scb[2] = {-7.0f, -7.0f};
        uint8_t qb[16];
        memcpy(qb, q, 16);
        float *out = rows[i].out == sc ? scb : rows[i].out;
        mha_status st = mha_quantize(&rows[i].s, &rows[i].d, out);
        ck_assert_msg(st == rows[i].st, "%s: %s (%s)", rows[i].what,
                      mha_status_string(st), mha_last_error());
        ck_assert_msg(strstr(mha_last_error(), rows[i].field),
                      "%s: message '%s' does not name %s", rows[i].what,
                      mha_last_error(), rows[i].field);
        ck_assert_msg(memcmp(qb, q, 16) == 0 && scb[0] == -7.0f &&
                          scb[1] == -7.0f, "%s: output written",
                      rows[i].what);
    }
    ck_assert(mha_quantize(NULL, &dst, sc) == MHA_ERR_NULL_POINTER);
    ck_assert(mha_quantize(&src, NULL, sc) == MHA_ERR_NULL_POINTER);
}
END_TEST

/* ---- mha_quantize_paged ------------------------------------------------ */

/* A pool of NB blocks of BS slots, H heads of D, written by slot: loop
 * index over dtype (3) x pool order (bshd, bhsd) x scales (computed per
 * row, computed per token, given per row). Oracle: each written slot
 * holds, bit for bit, mha_quantize's codes and scales of that token as a
 * [1, 1, H, D] tensor (mha_quantize is checked against the reference
 * decoders above); every other byte and scale is untouched. */
enum { PNB = 5, PBS = 3, PH = 2, PD = 8, PT = 9 };

START_TEST(quantize_paged)
{
    const mha_dtype dt = QTYPES[_i % 3];
    const int bhsd = (_i / 3) % 2, mode = _i / 6; /* 0 row, 1 token, 2 given */
    float x[PT * PH * PD];
    fill_uniform(&(test_rng){40u + (unsigned)_i}, x, PT * PH * PD);
    x[5] = NAN, x[17] = INFINITY, x[40] = 0.0f; /* specials pass through */
    /* src [3, 3, H, D]: tokens t = b * 3 + s. Slots out of order, a
     * padding token (-1), two tokens on slot 7 (the later stays), slots in
     * the first and the last block. */
    const int64_t slots[PT] = {7, 0, 14, -1, 4, 7, 9, 13, 2};
    mha_tensor src = mha_tensor_bshd(x, 3, 3, PH, PD);
    uint8_t pool[PNB * PBS * PH * PD];
    float sc[PNB * PBS * PH];
    memset(pool, 0x5A, sizeof pool);
    for (int i = 0; i < PNB * PBS * PH; i++)
        sc[i] = mode == 2 ? 0.01f * (float)(i + 1) : -7.0f;
    sc[PH * 5] = NAN; /* slot 5 is not written: its scales are not read */
    mha_tensor pt = bhsd ? mha_tensor_bhsd_typed(pool, dt, PNB, PBS, PH, PD)
                         : mha_tensor_bshd_typed(pool, dt, PNB, PBS, PH, PD);
    pt.scales.stride_batch = PBS * PH;
    pt.scales.stride_seq = PH;
    pt.scales.stride_head = mode == 1 ? 0 : 1;
    if (mode == 2)
        pt.scales.data = sc;
    uint8_t pool0[sizeof pool];
    float sc0[PNB * PBS * PH];
    memcpy(pool0, pool, sizeof pool);
    memcpy(sc0, sc, sizeof sc);
    mha_status st = mha_quantize_paged(&src, &pt, slots, mode == 2 ? NULL : sc);
    ck_assert_msg(st == MHA_OK, "%s", mha_last_error());

    for (int slot = 0; slot < PNB * PBS; slot++) {
        int blk = slot / PBS, off = slot % PBS, t = -1;
        for (int u = 0; u < PT; u++)
            if (slots[u] == slot)
                t = u; /* the later token stays */
        for (int h = 0; h < PH; h++) {
            const int64_t at = blk * pt.stride_batch + off * pt.stride_seq +
                               h * pt.stride_head;
            const int si = slot * PH + (mode == 1 ? 0 : h);
            if (t < 0) {
                ck_assert_msg(memcmp(pool + at, pool0 + at, PD) == 0 &&
                                  (same_or_nan(sc[slot * PH + h],
                                               sc0[slot * PH + h])),
                              "slot %d head %d changed", slot, h);
                continue;
            }
            /* The oracle: token t alone through mha_quantize. */
            uint8_t want[PH * PD];
            float want_sc[PH] = {sc0[slot * PH], sc0[slot * PH + 1]};
            mha_tensor one = mha_tensor_bshd(x + t * PH * PD, 1, 1, PH, PD);
            mha_tensor dst = mha_tensor_bshd_typed(want, dt, 1, 1, PH, PD);
            dst.scales.stride_head = pt.scales.stride_head;
            if (mode == 2)
                dst.scales.data = want_sc;
            ck_assert(mha_quantize(&one, &dst, mode == 2 ? NULL : want_sc) ==
                      MHA_OK);
            REQUIRE(memcmp(pool + at, want + h * PD, PD) == 0,
                    "%s %s mode %d: slot %d head %d (token %d): codes differ "
                    "from mha_quantize's", mha_dtype_name(dt),
                    bhsd ? "bhsd" : "bshd", mode, slot, h, t);
            REQUIRE(sc[si] == want_sc[mode == 1 ? 0 : h],
                    "slot %d head %d: scale %a, want %a", slot, h,
                    (double)sc[si], (double)want_sc[mode == 1 ? 0 : h]);
        }
        if (mode == 1 && t >= 0) /* the second scale of the slot: unused */
            ck_assert(sc[slot * PH + 1] == sc0[slot * PH + 1]);
    }
}
END_TEST

START_TEST(bad_quantize_paged)
{
    float x[2 * 2 * 4], sc[4 * 2 * 2], other = 1.0f;
    uint8_t pool[4 * 2 * 2 * 4];
    int64_t slots[2] = {3, 6};
    fill_uniform(&(test_rng){9}, x, 16);
    for (int i = 0; i < 16; i++)
        sc[i] = 0.5f;
    sc[0] = 0.0f; /* slot 0 is not written: accepted */
    memset(pool, 0x33, sizeof pool);
    mha_tensor src = mha_tensor_bshd(x, 1, 2, 2, 4);
    mha_tensor pt = mha_tensor_bshd_typed(pool, MHA_I8, 4, 2, 2, 4);
    pt.scales = (mha_scales){sc, 4, 2, 1};
    ck_assert_msg(mha_quantize_paged(&src, &pt, slots, NULL) == MHA_OK, "%s",
                  mha_last_error());
    struct {
        const char *what;
        mha_status st;
        const char *field;
        int64_t slot1;
        int computed;
    } rows[] = {
        {"slot past the pool", MHA_ERR_BAD_ARGUMENT, "slots[1]", 8, 0},
        {"zero scale of a written slot", MHA_ERR_BAD_ARGUMENT,
         "pool.scales[b=2, s=1, h=1]", 5, 0},
        {"NaN scale of a written slot", MHA_ERR_BAD_ARGUMENT,
         "pool.scales[b=2, s=1, h=1]", 5, 0},
        {"infinite scale of a written slot", MHA_ERR_BAD_ARGUMENT,
         "pool.scales[b=2, s=1, h=1]", 5, 0},
        {"computed scales shared by slots", MHA_ERR_BAD_STRIDE,
         "pool.scales", 6, 1},
        {"pool.heads differs", MHA_ERR_BAD_SHAPE, "pool.heads", 6, 0},
        {"pool f16", MHA_ERR_UNSUPPORTED, "pool.dtype", 6, 0},
        {"no pool scales", MHA_ERR_NULL_POINTER, "pool.scales.data", 6, 0},
        {"slots inside the pool", MHA_ERR_BAD_STRIDE, "slots", 6, 0},
        {"scales_out differs from pool.scales", MHA_ERR_BAD_ARGUMENT,
         "scales_out", 6, 1},
        {"pool overlaps src", MHA_ERR_BAD_STRIDE, "pool", 6, 0},
    };
    const float bad[4] = {0.0f, 0.0f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        float scb[16];
        uint8_t pb[sizeof pool];
        int64_t sl[2] = {3, rows[i].slot1};
        memcpy(scb, sc, sizeof sc);
        memcpy(pb, pool, sizeof pool);
        mha_tensor p = pt, s = src;
        p.data = pb, p.scales.data = scb;
        const int64_t *slp = sl;
        float *out = NULL;
        if (i >= 1 && i <= 3)
            scb[2 * 4 + 1 * 2 + 1] = bad[i];
        if (rows[i].computed) {
            p.scales.data = NULL, out = scb;
            if (i == 4)
                p.scales.stride_seq = 0;
            else
                p.scales.data = &other;
        }
        if (i == 5)
            p.heads = 1;
        if (i == 6)
            p.dtype = MHA_F16;
        if (i == 7)
            p.scales.data = NULL;
        if (i == 8) {
            memcpy(pb, sl, sizeof sl);
            slp = (const int64_t *)pb;
        }
        if (i == 10)
            s.data = pb;
        uint8_t pb0[sizeof pool];
        float scb0[16];
        memcpy(pb0, pb, sizeof pool);
        memcpy(scb0, scb, sizeof scb);
        mha_status st = mha_quantize_paged(&s, &p, slp, out);
        ck_assert_msg(st == rows[i].st, "%s: %s (%s)", rows[i].what,
                      mha_status_string(st), mha_last_error());
        ck_assert_msg(strstr(mha_last_error(), rows[i].field),
                      "%s: message '%s' does not name %s", rows[i].what,
                      mha_last_error(), rows[i].field);
        ck_assert_msg(memcmp(pb0, pb, sizeof pool) == 0 &&
                          memcmp(scb0, scb, sizeof scb) == 0,
                      "%s: output written", rows[i].what);
    }
    ck_assert(mha_quantize_paged(&src, &pt, NULL, NULL) ==
              MHA_ERR_NULL_POINTER);
    ck_assert(strstr(mha_last_error(), "slots"));
    ck_assert(mha_quantize_paged(NULL, &pt, slots, NULL) ==
              MHA_ERR_NULL_POINTER);
    ck_assert(mha_quantize_paged(&src, NULL, slots, NULL) ==
              MHA_ERR_NULL_POINTER);
}
END_TEST

Suite *suite_quant(void)
{
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("quant");
    tcase_add_loop_test(tc, every_code_every_table, 0, 3);
    tcase_add_test(tc, quantize_rounding_and_specials);
    tcase_add_loop_test(tc, quantize_every_code_round_trips, 0, 3);
    tcase_add_test(tc, quantize_computed_scales);
    tcase_add_loop_test(tc, attention_vs_oracle, 0, N_QCASES);
    tcase_add_loop_test(tc, bad_scales, 0, N_QBAD);
    tcase_add_test(tc, bad_quantize);
    tcase_add_loop_test(tc, quantize_paged, 0, 18);
    tcase_add_test(tc, bad_quantize_paged);
    tcase_add_test(tc, scale_scan);
    suite_add_tcase(s, tc);
    return s;
}
