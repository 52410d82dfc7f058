/*
 * The public helpers callers enumerate and convert with: the ISA registry
 * (mha_isas, mha_isa_from_name, mha_isa_available) against engine
 * creation, dtype sizes and names, the fp32 <-> fp16/bf16 conversions
 * against the support library's reference decoders, and the thread bound
 * (OpenMP's default far above MHA_MAX_THREADS is clamped; the bound itself
 * runs) against the oracle.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h" /* mha_threads_for_call */
#include "util.h"

/* ---- ISA registry ----------------------------------------------------- */

START_TEST(isa_list)
{
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    ck_assert_ptr_nonnull(all);
    ck_assert_msg(n >= 1 && n <= TEST_MAX_ISAS, "mha_isas lists %zu", n);
    ck_assert_ptr_eq(mha_isas(NULL), all);
    int generic = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(all[i] != MHA_ISA_AUTO, "mha_isas lists auto");
        ck_assert_str_ne(mha_isa_name(all[i]), "unknown");
        generic |= all[i] == MHA_ISA_GENERIC;
        for (size_t j = 0; j < i; j++)
            ck_assert_msg(all[j] != all[i] &&
                              strcmp(mha_isa_name(all[j]),
                                     mha_isa_name(all[i])) != 0,
                          "%s listed twice", mha_isa_name(all[i]));
    }
    ck_assert_msg(generic, "mha_isas lacks generic");
}
END_TEST

START_TEST(isa_from_name_round_trip)
{
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    for (size_t i = 0; i < n; i++) {
        mha_isa got = MHA_ISA_AUTO;
        mha_status st = mha_isa_from_name(mha_isa_name(all[i]), &got);
        ck_assert_msg(st == MHA_OK && got == all[i], "%s: %s, got %d",
                      mha_isa_name(all[i]), mha_status_string(st),
                      (int)got);
    }
    mha_isa got = MHA_ISA_GENERIC;
    ck_assert_int_eq(mha_isa_from_name("auto", &got), MHA_OK);
    ck_assert_int_eq(got, MHA_ISA_AUTO);
}
END_TEST

START_TEST(isa_from_name_refuses)
{
    static const char *const bad[] = {"no-such-isa", "", "AVX2 ", "unknown"};
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        mha_isa got = (mha_isa)77;
        mha_status st = mha_isa_from_name(bad[b], &got);
        ck_assert_msg(st == MHA_ERR_BAD_ARGUMENT, "'%s': %s", bad[b],
                      mha_status_string(st));
        ck_assert_msg(got == (mha_isa)77, "'%s': *isa was written", bad[b]);
        /* The message names the names it knows. */
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(strstr(mha_last_error(), mha_isa_name(all[i])),
                          "'%s': message '%s' lacks %s", bad[b],
                          mha_last_error(), mha_isa_name(all[i]));
    }
    mha_isa got = (mha_isa)77;
    mha_status st = mha_isa_from_name(NULL, &got);
    ck_assert_msg(st == MHA_ERR_NULL_POINTER || st == MHA_ERR_BAD_ARGUMENT,
                  "NULL name: %s", mha_status_string(st));
    ck_assert_msg(mha_last_error()[0] != '\0', "NULL name: no message");
    ck_assert_int_eq(got, 77);
    st = mha_isa_from_name("generic", NULL);
    ck_assert_msg(st == MHA_ERR_NULL_POINTER, "NULL isa: %s",
                  mha_status_string(st));
    ck_assert_msg(mha_last_error()[0] != '\0', "NULL isa: no message");
}
END_TEST

/* mha_isa_available agrees with mha_engine_create for every listed ISA;
 * generic always runs; auto and values outside the enum are not ISAs. */
START_TEST(isa_available)
{
    ck_assert_int_eq(mha_isa_available(MHA_ISA_GENERIC), 1);
    ck_assert_int_eq(mha_isa_available(MHA_ISA_AUTO), 0);
    ck_assert_int_eq(mha_isa_available((mha_isa)99), 0);
    ck_assert_int_eq(mha_isa_available((mha_isa)-1), 0);
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    for (size_t i = 0; i < n; i++) {
        mha_config config = {.num_threads = 1, .isa = all[i]};
        mha_engine *e = NULL;
        mha_status st = mha_engine_create(&config, &e);
        int available = mha_isa_available(all[i]);
        ck_assert_msg(available == 0 || available == 1, "%s: %d",
                      mha_isa_name(all[i]), available);
        ck_assert_msg((st == MHA_OK) == available,
                      "%s: available %d, engine creation %s (%s)",
                      mha_isa_name(all[i]), available, mha_status_string(st),
                      mha_last_error());
        ck_assert(st == MHA_OK || st == MHA_ERR_UNSUPPORTED);
        mha_engine_destroy(st == MHA_OK ? e : NULL);
    }
}
END_TEST

/* ---- Dtypes ----------------------------------------------------------- */

START_TEST(dtype_size_and_name)
{
    ck_assert_uint_eq(mha_dtype_size(MHA_F32), 4);
    ck_assert_uint_eq(mha_dtype_size(MHA_F16), 2);
    ck_assert_uint_eq(mha_dtype_size(MHA_BF16), 2);
    ck_assert_uint_eq(mha_dtype_size(MHA_I8), 1);
    ck_assert_uint_eq(mha_dtype_size(MHA_FP8_E4M3), 1);
    ck_assert_uint_eq(mha_dtype_size(MHA_FP8_E5M2), 1);
    ck_assert_uint_eq(mha_dtype_size((mha_dtype)6), 0);
    ck_assert_uint_eq(mha_dtype_size((mha_dtype)-1), 0);
    ck_assert_str_eq(mha_dtype_name(MHA_F32), "f32");
    ck_assert_str_eq(mha_dtype_name(MHA_F16), "f16");
    ck_assert_str_eq(mha_dtype_name(MHA_BF16), "bf16");
    ck_assert_str_eq(mha_dtype_name(MHA_I8), "i8");
    ck_assert_str_eq(mha_dtype_name(MHA_FP8_E4M3), "fp8_e4m3");
    ck_assert_str_eq(mha_dtype_name(MHA_FP8_E5M2), "fp8_e5m2");
    ck_assert_str_eq(mha_dtype_name((mha_dtype)6), "unknown");
    ck_assert_str_eq(mha_dtype_name((mha_dtype)-1), "unknown");
}
END_TEST

/* ---- Conversions ------------------------------------------------------ */

static uint32_t bits_of(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static float float_of(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* Every one of the 65,536 codes widens exactly: the value of the reference
 * decoder, the sign of zeros and NaNs kept. _i: 0 binary16, 1 bfloat16. */
START_TEST(widen_every_code)
{
    const int bf = _i;
    uint16_t *codes = test_alloc(65536 * sizeof *codes);
    float *got = test_alloc(65536 * sizeof *got);
    for (uint32_t c = 0; c < 65536; c++)
        codes[c] = (uint16_t)c;
    if (bf)
        mha_bf16_to_f32(codes, 65536, got);
    else
        mha_f16_to_f32(codes, 65536, got);
    for (uint32_t c = 0; c < 65536; c++) {
        double want = bf ? ref_bf16_to_double((uint16_t)c)
                         : ref_f16_to_double((uint16_t)c);
        int sign = (c >> 15) != 0;
        REQUIRE((bits_of(got[c]) >> 31) == (uint32_t)sign,
                "%s 0x%04x: sign lost (%g)", bf ? "bf16" : "f16", c,
                (double)got[c]);
        if (isnan(want))
            REQUIRE(isnan(got[c]), "%s 0x%04x: %g, want NaN",
                    bf ? "bf16" : "f16", c, (double)got[c]);
        else
            REQUIRE((double)got[c] == want, "%s 0x%04x: %.9g, want %.9g",
                    bf ? "bf16" : "f16", c, (double)got[c], want);
    }
    free(codes);
    free(got);
}
END_TEST

typedef struct narrow_case {
    uint32_t in; /* fp32 bits */
    uint16_t f16, bf16;
    const char *what;
} narrow_case;

/* Hand-picked: exact values, ties (to even), just past ties, the top of
 * the range and past it, subnormals, signed zeros, infinities. */
static const narrow_case NARROW[] = {
    {0x3f800000u, 0x3c00, 0x3f80, "1"},
    {0xc0000000u, 0xc000, 0xc000, "-2"},
    {0x00000000u, 0x0000, 0x0000, "+0"},
    {0x80000000u, 0x8000, 0x8000, "-0"},
    /* 1 + 2^-11: half an f16 step above 1, tie to even 1. */
    {0x3f801000u, 0x3c00, 0x3f80, "1 + 2^-11"},
    /* 1 + 3*2^-11: tie between 0x3c01 (odd) and 0x3c02. */
    {0x3f803000u, 0x3c02, 0x3f80, "1 + 3*2^-11"},
    {0x3f801001u, 0x3c01, 0x3f80, "just past 1 + 2^-11"},
    /* bfloat16 ties: 1 + 2^-8 to 1, 1 + 3*2^-8 to 1 + 2^-6. */
    {0x3f808000u, 0x3c04, 0x3f80, "1 + 2^-8"},
    {0x3f818000u, 0x3c0c, 0x3f82, "1 + 3*2^-8"},
    {0x3f808001u, 0x3c04, 0x3f81, "just past 1 + 2^-8"},
    {0x477fe000u, 0x7bff, 0x4780, "65504, the largest binary16"},
    {0x477fefffu, 0x7bff, 0x4780, "just below 65520"},
    /* 65520: tie between 65504 (odd) and 2^16, which overflows. */
    {0x477ff000u, 0x7c00, 0x4780, "65520"},
    {0x49742400u, 0x7c00, 0x4974, "1e6"},
    {0xc9742400u, 0xfc00, 0xc974, "-1e6"},
    {0x7f7fffffu, 0x7c00, 0x7f80, "FLT_MAX"},
    /* bfloat16 tie at the top: 0x7f7f (odd) rounds up to infinity. */
    {0x7f7f8000u, 0x7c00, 0x7f80, "bf16 tie to infinity"},
    {0x7f800000u, 0x7c00, 0x7f80, "+inf"},
    {0xff800000u, 0xfc00, 0xff80, "-inf"},
    {0x38800000u, 0x0400, 0x3880, "2^-14, the smallest normal binary16"},
    {0x387fc000u, 0x03ff, 0x3880, "2^-14 - 2^-24"},
    {0x33800000u, 0x0001, 0x3380, "2^-24"},
    {0xb3800000u, 0x8001, 0xb380, "-2^-24"},
    /* 2^-25: tie between 0 and 2^-24, to even 0. */
    {0x33000000u, 0x0000, 0x3300, "2^-25"},
    /* 3*2^-25: tie between 2^-24 (odd) and 2^-23. */
    {0x33c00000u, 0x0002, 0x33c0, "3*2^-25"},
    {0x33000001u, 0x0001, 0x3300, "just past 2^-25"},
    {0xb2800000u, 0x8000, 0xb280, "-2^-26"},
    /* fp32 subnormals in bfloat16: exact, tie to even, tie to 2. */
    {0x00010000u, 0x0000, 0x0001, "fp32 subnormal, exact in bf16"},
    {0x00008000u, 0x0000, 0x0000, "fp32 subnormal, tie to 0"},
    {0x00018000u, 0x0000, 0x0002, "fp32 subnormal, tie to 2"},
};

START_TEST(narrow_hand_picked)
{
    const narrow_case *c = &NARROW[_i];
    float x = float_of(c->in);
    uint16_t h = 0x5555, b = 0x5555;
    mha_f32_to_f16(&x, 1, &h);
    mha_f32_to_bf16(&x, 1, &b);
    ck_assert_msg(h == c->f16, "%s -> f16 0x%04x, want 0x%04x", c->what, h,
                  c->f16);
    ck_assert_msg(b == c->bf16, "%s -> bf16 0x%04x, want 0x%04x", c->what,
                  b, c->bf16);
}
END_TEST

/* NaN stays NaN, quiet, with its sign, whatever its payload (truncating a
 * payload held in the low bits would give an infinity). */
START_TEST(narrow_nan)
{
    static const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u,
                                    0xff800001u, 0x7fbfffffu, 0x7f802000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        float x = float_of(nans[i]);
        uint16_t h, b;
        mha_f32_to_f16(&x, 1, &h);
        mha_f32_to_bf16(&x, 1, &b);
        uint16_t sign = (uint16_t)((nans[i] >> 16) & 0x8000u);
        ck_assert_msg((h & 0x7c00) == 0x7c00 && (h & 0x0200) &&
                          (h & 0x8000) == sign,
                      "NaN 0x%08x -> f16 0x%04x", nans[i], h);
        ck_assert_msg((b & 0x7f80) == 0x7f80 && (b & 0x0040) &&
                          (b & 0x8000) == sign,
                      "NaN 0x%08x -> bf16 0x%04x", nans[i], b);
    }
}
END_TEST

/* Random finite fp32 values of every magnitude: the code narrowing gives
 * is the nearest one (through the reference decoder), an even code on a
 * tie. _i: 0 binary16, 1 bfloat16. */
START_TEST(narrow_is_nearest)
{
    const int bf = _i;
    enum { N = 100000 };
    float *x = test_alloc(N * sizeof *x);
    uint16_t *y = test_alloc(N * sizeof *y);
    test_rng r;
    rng_seed(&r, 11 + (uint64_t)bf);
    for (size_t i = 0; i < N; i++) {
        /* Exponents around the format's range; any mantissa and sign. */
        uint32_t u = (uint32_t)rng_next(&r);
        int e = bf ? (int)(u % 254) + 1 : 127 - 28 + (int)(u % 48);
        x[i] = float_of((u & 0x80000000u) | (uint32_t)e << 23 |
                        ((uint32_t)(rng_next(&r) >> 20) & 0x7fffffu));
    }
    if (bf)
        mha_f32_to_bf16(x, N, y);
    else
        mha_f32_to_f16(x, N, y);
    for (size_t i = 0; i < N; i++) {
        double want = (double)x[i];
        double (*dec)(uint16_t) = bf ? ref_bf16_to_double : ref_f16_to_double;
        double got = dec(y[i]);
        double err = fabs(got - want);
        /* The neighbours of the code on either side, same sign. */
        uint16_t mag = y[i] & 0x7fff, sign = y[i] & 0x8000;
        uint16_t inf = bf ? 0x7f80 : 0x7c00;
        if (mag == inf) {
            uint16_t top = (uint16_t)(sign | (inf - 1));
            double half_past = fabs(dec(top)) +
                               (fabs(dec(top)) - fabs(dec(top - 1))) / 2;
            REQUIRE(fabs(want) >= half_past, "0x%08x -> infinity below the "
                    "overflow threshold", bits_of(x[i]));
            continue;
        }
        for (int step = -1; step <= 1; step += 2) {
            if ((mag == 0 && step < 0) || (mag == inf - 1 && step > 0))
                continue;
            double other = dec((uint16_t)(sign | (mag + step)));
            double err2 = fabs(other - want);
            REQUIRE(err < err2 || (err == err2 && (mag & 1) == 0),
                    "%s 0x%08x (%.9g) -> 0x%04x (%.9g); 0x%04x (%.9g) is "
                    "nearer or the even one of a tie", bf ? "bf16" : "f16",
                    bits_of(x[i]), want, y[i], got, sign | (mag + step),
                    other);
        }
    }
    free(x);
    free(y);
}
END_TEST

/* ---- The thread bound ------------------------------------------------- */

/* OpenMP's default far above MHA_MAX_THREADS (num_threads 0 takes it) is
 * clamped, and MHA_MAX_THREADS itself runs: a small problem (fewer work
 * items than threads) still matches the oracle on every ISA. */
START_TEST(thread_bound_runs)
{
    enum { TB = 2, TLQ = 5, TLK = 9, TH = 2, TD = 8 };
    test_rng r;
    rng_seed(&r, 21);
    size_t nq = TB * TLQ * TH * TD, nk = TB * TLK * TH * TD;
    float *q = random_floats(&r, nq), *k = random_floats(&r, nk);
    float *v = random_floats(&r, nk), *out = test_alloc(nq * sizeof *out);
    mha_mask mask = {.causal = MHA_CAUSAL_BOTTOM_RIGHT};
    mha_attention_args args = {
        .q = mha_tensor_bshd(q, TB, TLQ, TH, TD),
        .k = mha_tensor_bshd(k, TB, TLK, TH, TD),
        .v = mha_tensor_bshd(v, TB, TLK, TH, TD),
        .out = mha_tensor_bshd(out, TB, TLQ, TH, TD),
        .mask = &mask,
    };
    int before = omp_get_max_threads();
    omp_set_num_threads(100000);
    check_attention(&args, nq, 1, 0, "OpenMP default 100000");
    omp_set_num_threads(before);
    check_attention(&args, nq, 1, MHA_MAX_THREADS, "MHA_MAX_THREADS");
    free(q);
    free(k);
    free(v);
    free(out);
}
END_TEST

/* The team a call runs on (engine.c, mha_threads_for_call): the engine's
 * count, or with num_threads 0 OpenMP's default clamped to
 * MHA_MAX_THREADS; never more than the call's work items, never fewer
 * than one. Results are the same bits on any team, so no other test would
 * see a default engine that ran every call on one thread. */
START_TEST(threads_per_call)
{
    int before = omp_get_max_threads();
    mha_engine *def = make_engine(MHA_ISA_GENERIC, 0);
    mha_engine *two = make_engine(MHA_ISA_GENERIC, 2);
    omp_set_num_threads(3);
    ck_assert_int_eq(mha_threads_for_call(def, 1000), 3);
    ck_assert_int_eq(mha_threads_for_call(def, 2), 2);
    ck_assert_int_eq(mha_threads_for_call(def, 1), 1);
    ck_assert_int_eq(mha_threads_for_call(def, 0), 1);
    omp_set_num_threads(MHA_MAX_THREADS + 7);
    ck_assert_int_eq(mha_threads_for_call(def, INT64_MAX), MHA_MAX_THREADS);
    omp_set_num_threads(before);
    ck_assert_int_eq(mha_threads_for_call(two, 1000), 2);
    ck_assert_int_eq(mha_threads_for_call(two, 1), 1);
    ck_assert_int_eq(mha_threads_for_call(two, 0), 1);
    mha_engine_destroy(def);
    mha_engine_destroy(two);
}
END_TEST

Suite *suite_api(void)
{
    Suite *s = suite_create("api");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, isa_list);
    tcase_add_test(tc, isa_from_name_round_trip);
    tcase_add_test(tc, isa_from_name_refuses);
    tcase_add_test(tc, isa_available);
    tcase_add_test(tc, dtype_size_and_name);
    tcase_add_loop_test(tc, widen_every_code, 0, 2);
    tcase_add_loop_test(tc, narrow_hand_picked, 0,
                        (int)(sizeof NARROW / sizeof NARROW[0]));
    tcase_add_test(tc, narrow_nan);
    tcase_add_loop_test(tc, narrow_is_nearest, 0, 2);
    tcase_add_test(tc, thread_bound_runs);
    tcase_add_test(tc, threads_per_call);
    suite_add_tcase(s, tc);
    return s;
}
