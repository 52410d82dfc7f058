/*
 * Half-precision compute dtypes (fp16, bf16 q and out) on every available
 * ISA. Each case runs twice: with q and out in the half dtype, and with q
 * widened to fp32 and an fp32 out. Scores, softmax and accumulation are
 * fp32 either way (docs/design.md, "Compute dtype"), so the half output
 * must equal the fp32 output rounded to nearest even, bit for bit; it is
 * also checked against the double oracle on the widened q within the fp32
 * tolerance plus half an ulp of the output dtype (2^-8 bf16, 2^-11 fp16,
 * relative). Bytes of the output buffer outside its view stay untouched.
 *
 * A table with slots of the compute dtype (avx512bf16 and neonbf16 for
 * bf16, neonfhm and neonbf16 for f16) computes half q over K/V of the same
 * dtype with even d natively: P is rounded to the half dtype before P·V,
 * so there the output is held to the oracle alone, with one more term for
 * that rounding. bf16(P_j) = P_j (1 + e_j), |e_j| <= 2^-8, moves the
 * output by at most 2^-8 sum_j P_j |V_j| / sum_j P_j <= 2^-8 max |V|.
 * f16's is 2^-11 relative for P_j >= 2^-14, and at most 2^-25 absolute
 * below (subnormal steps of 2^-24); since sum_j P_j >= 1 (the row's
 * maximum gives P = 1), the output moves by at most (2^-11 + n 2^-25)
 * max |V| over n keys. It must also be bitwise the same on 1 and 3
 * threads.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "oracle.h"
#include "util.h"

typedef struct {
    const char *name;
    int64_t b, h, hkv, lq, lk, d, dv;
    mha_causal causal;
    mha_dtype kv;
    int threads;
    int varlen; /* packed queries and keys through mha_attention_varlen */
} compute_case;

static const compute_case CASES[] = {
    {"prefill causal", 2, 4, 2, 37, 53, 64, 64, MHA_CAUSAL_BOTTOM_RIGHT,
     MHA_F32, 1, 0},
    {"prefill d=128 f16 kv", 1, 2, 2, 70, 70, 128, 128, MHA_CAUSAL_TOP_LEFT,
     MHA_F16, 2, 0},
    {"decode grouped", 3, 8, 2, 1, 300, 128, 96, MHA_CAUSAL_NONE, MHA_BF16, 1,
     0},
    /* Long keys on 2 threads: split into chunks, merged (merge.c). */
    {"decode split keys", 1, 2, 1, 1, 9000, 64, 64, MHA_CAUSAL_BOTTOM_RIGHT,
     MHA_F32, 2, 0},
    {"decode split keys, a head a row", 2, 2, 2, 1, 9000, 64, 64,
     MHA_CAUSAL_NONE, MHA_F16, 2, 0},
    {"multi-token decode", 2, 4, 4, 3, 40, 32, 32, MHA_CAUSAL_BOTTOM_RIGHT,
     MHA_F32, 1, 0},
    /* A speculative step of 32 rows a kv head: one prefill block of
     * interleaved rows, its half queries gathered as codes where the
     * table computes natively. */
    {"speculative step, group 8, bf16 kv", 2, 16, 2, 4, 300, 64, 64,
     MHA_CAUSAL_BOTTOM_RIGHT, MHA_BF16, 2, 0},
    {"speculative step, group 8, f16 kv", 1, 16, 2, 4, 300, 64, 64,
     MHA_CAUSAL_BOTTOM_RIGHT, MHA_F16, 1, 0},
    /* 16 rows a kv head: a wide decode block where a table has one. */
    {"speculative step, group 4, wide", 1, 8, 2, 4, 300, 64, 64,
     MHA_CAUSAL_BOTTOM_RIGHT, MHA_BF16, 2, 0},
    {"varlen packed", 3, 4, 2, 5, 12, 64, 64, MHA_CAUSAL_BOTTOM_RIGHT, MHA_F32,
     2, 1},
    /* bf16 K/V: the native bf16 path where a table has it. Row blocks
     * past block_q, causal sub-blocks, dv not a multiple of 32, odd key
     * counts, grouped heads. */
    {"prefill bf16 kv", 2, 4, 2, 150, 171, 64, 64, MHA_CAUSAL_BOTTOM_RIGHT,
     MHA_BF16, 2, 0},
    {"prefill bf16 kv d=128 dv=80", 1, 2, 1, 301, 301, 128, 80,
     MHA_CAUSAL_TOP_LEFT, MHA_BF16, 1, 0},
    {"prefill bf16 kv odd d (widened)", 1, 2, 2, 40, 33, 31, 31,
     MHA_CAUSAL_NONE, MHA_BF16, 1, 0},
    {"varlen bf16 kv", 3, 4, 2, 60, 91, 64, 64, MHA_CAUSAL_BOTTOM_RIGHT,
     MHA_BF16, 2, 1},
    /* f16 K/V: the native f16 path where a table has it, on the same
     * edges. */
    {"prefill f16 kv", 2, 4, 2, 150, 171, 64, 64, MHA_CAUSAL_BOTTOM_RIGHT,
     MHA_F16, 2, 0},
    {"prefill f16 kv d=128 dv=80", 1, 2, 1, 301, 301, 128, 80,
     MHA_CAUSAL_TOP_LEFT, MHA_F16, 1, 0},
    {"prefill f16 kv odd d (widened)", 1, 2, 2, 40, 33, 31, 31,
     MHA_CAUSAL_NONE, MHA_F16, 1, 0},
    {"varlen f16 kv", 3, 4, 2, 60, 91, 64, 64, MHA_CAUSAL_BOTTOM_RIGHT,
     MHA_F16, 2, 1},
};
#define NCASES ((int)(sizeof CASES / sizeof CASES[0]))

static const mha_dtype COMPUTE[2] = {MHA_F16, MHA_BF16};

static void from_half(mha_dtype dt, const uint16_t *x, size_t n, float *y)
{
    if (dt == MHA_F16)
        mha_f16_to_f32(x, n, y);
    else
        mha_bf16_to_f32(x, n, y);
}

#define GUARD 7 /* output elements before and after the view */

static mha_status run(const mha_engine *e, const compute_case *c,
                      const mha_tensor *q, const mha_tensor *k,
                      const mha_tensor *v, const mha_tensor *out,
                      const int32_t *cu_q, const int32_t *cu_k)
{
    if (c->varlen) {
        mha_varlen_args a = {.batch = c->b, .q = *q, .cu_seqlens_q = cu_q,
                             .k = *k, .v = *v, .cu_seqlens_k = cu_k,
                             .out = *out, .causal = c->causal};
        return mha_attention_varlen(e, &a);
    }
    mha_mask m = {.causal = c->causal};
    mha_attention_args a = {.q = *q, .k = *k, .v = *v, .out = *out,
                            .mask = &m};
    return mha_attention(e, &a);
}

START_TEST(half_compute)
{
    const compute_case *c = &CASES[_i / 2];
    const mha_dtype dt = COMPUTE[_i % 2];
    const char *dname = dt == MHA_F16 ? "f16" : "bf16";
    test_rng r;
    rng_seed(&r, 0x5eed0000u + (uint64_t)_i);
    /* Dense: [B, L, H, d]. Varlen: B sequences of lq and lk rows packed
     * (lengths lq - b, lk - b), as [1, total, H, d]. */
    int64_t tq = c->b * c->lq, tk = c->b * c->lk;
    int32_t cu_q[8] = {0}, cu_k[8] = {0};
    if (c->varlen) {
        for (int64_t b = 0; b < c->b; b++) {
            cu_q[b + 1] = cu_q[b] + (int32_t)(c->lq - b);
            cu_k[b + 1] = cu_k[b] + (int32_t)(c->lk - b);
        }
        tq = cu_q[c->b], tk = cu_k[c->b];
    }
    size_t nq = (size_t)(tq * c->h * c->d), nk = (size_t)(tk * c->hkv * c->d);
    size_t nv = (size_t)(tk * c->hkv * c->dv), no = (size_t)(tq * c->h * c->dv);
    float *qf = random_floats(&r, nq), *kf = random_floats(&r, nk);
    float *vf = random_floats(&r, nv);
    uint16_t *qh = as_dtype(qf, nq, dt);
    from_half(dt, qh, nq, qf); /* the fp32 run reads exactly q's values */
    void *ks = as_dtype(kf, nk, c->kv), *vs = as_dtype(vf, nv, c->kv);
    uint16_t *oh = test_alloc((no + 2 * GUARD) * sizeof *oh);
    float *of = test_alloc(no * sizeof *of);

    int64_t B = c->varlen ? 1 : c->b, Lq = c->varlen ? tq : c->lq;
    int64_t Lk = c->varlen ? tk : c->lk;
    mha_tensor q16 = mha_tensor_bshd_typed(qh, dt, B, Lq, c->h, c->d);
    mha_tensor q32 = mha_tensor_bshd(qf, B, Lq, c->h, c->d);
    mha_tensor k = mha_tensor_bshd_typed(ks, c->kv, B, Lk, c->hkv, c->d);
    mha_tensor v = mha_tensor_bshd_typed(vs, c->kv, B, Lk, c->hkv, c->dv);
    mha_tensor o16 = mha_tensor_bshd_typed(oh + GUARD, dt, B, Lq, c->h, c->dv);
    mha_tensor o32 = mha_tensor_bshd(of, B, Lq, c->h, c->dv);

    /* The oracle on the widened q (dense calls; a varlen call sequence by
     * sequence through dense views of the packed rows). */
    double *want = test_alloc(no * sizeof *want);
    for (int64_t b = 0; b < (c->varlen ? c->b : 1); b++) {
        mha_mask m = {.causal = c->causal};
        mha_attention_args a = {.q = q32, .k = k, .v = v, .mask = &m};
        size_t row_q = 0;
        if (c->varlen) {
            row_q = (size_t)cu_q[b];
            a.q = mha_tensor_bshd(qf + row_q * (size_t)(c->h * c->d), 1,
                                  cu_q[b + 1] - cu_q[b], c->h, c->d);
            size_t es = c->kv == MHA_F32 ? 4 : 2, row_k = (size_t)cu_k[b];
            a.k = mha_tensor_bshd_typed((char *)ks + row_k * (size_t)(c->hkv * c->d) * es,
                                        c->kv, 1, cu_k[b + 1] - cu_k[b], c->hkv, c->d);
            a.v = mha_tensor_bshd_typed((char *)vs + row_k * (size_t)(c->hkv * c->dv) * es,
                                        c->kv, 1, cu_k[b + 1] - cu_k[b], c->hkv, c->dv);
        }
        oracle_attention(&a, want + row_q * (size_t)(c->h * c->dv), NULL);
    }

    /* Half an ulp relative to the value: 2^-11 (fp16), 2^-8 (bf16). */
    const double ulp = dt == MHA_F16 ? 1.0 / 2048 : 1.0 / 256;
    double vmax = 0; /* max |V| of a half K/V (the native paths' term) */
    for (size_t x = 0; x < nv && c->kv == dt; x++) {
        float w;
        from_half(dt, (const uint16_t *)vs + x, 1, &w);
        if (fabs(w) > vmax)
            vmax = fabs(w);
    }
    /* P's rounding in the native path (the header's bound). */
    const double p_term = dt == MHA_BF16
                              ? vmax / 256
                              : vmax * (1.0 / 2048 + (double)c->lk * 0x1p-25);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isas = available_isas(isas);
    for (int ii = 0; ii < n_isas + emulated_engines(); ii++) {
        const char *isa_name = walk_isa_name(ii, isas, n_isas);
        mha_engine *e = make_walk_engine(ii, isas, n_isas, c->threads);
        const mk_table table = e->kernels;
        const mk_half h = dt == MHA_BF16 ? MK_HALF_BF16 : MK_HALF_F16;
        const int native =
            table.half[h].qk && c->kv == dt && c->d % 2 == 0;
        for (size_t x = 0; x < no + 2 * GUARD; x++)
            oh[x] = 0xA5A5u;
        memset(of, 0, no * sizeof *of);
        mha_status st = run(e, c, &q16, &k, &v, &o16, cu_q, cu_k);
        ck_assert_msg(st == MHA_OK, "%s %s isa %s: %s", c->name, dname,
                      isa_name, mha_last_error());
        st = run(e, c, &q32, &k, &v, &o32, cu_q, cu_k);
        ck_assert_msg(st == MHA_OK, "%s fp32 isa %s: %s", c->name, isa_name,
                      mha_last_error());
        uint16_t *rounded = as_dtype(of, no, dt);
        for (int x = 0; x < GUARD; x++)
            REQUIRE(oh[x] == 0xA5A5u && oh[GUARD + no + (size_t)x] == 0xA5A5u,
                    "%s %s isa %s: an element outside the output view was "
                    "written", c->name, dname, isa_name);
        float got;
        if (native) {
            uint16_t *first = test_alloc(no * sizeof *first);
            memcpy(first, oh + GUARD, no * sizeof *first);
            mha_engine *e3 = make_walk_engine(ii, isas, n_isas, 3);
            st = run(e3, c, &q16, &k, &v, &o16, cu_q, cu_k);
            ck_assert_msg(st == MHA_OK, "%s: %s", c->name, mha_last_error());
            mha_engine_destroy(e3);
            for (size_t x = 0; x < no; x++) {
                REQUIRE(oh[GUARD + x] == first[x],
                        "%s %s isa %s: out[%zu] differs on 3 threads",
                        c->name, dname, isa_name, x);
                from_half(dt, &oh[GUARD + x], 1, &got);
                double tol = TOL_ATTN_ABS + (TOL_ATTN_REL + ulp) * fabs(want[x]) +
                             p_term;
                REQUIRE(fabs((double)got - want[x]) <= tol,
                        "%s %s native isa %s: out[%zu] = %g, oracle %g",
                        c->name, dname, isa_name, x,
                        (double)got, want[x]);
            }
            free(first);
        }
        for (size_t x = 0; x < no && !native; x++) {
            REQUIRE(oh[GUARD + x] == rounded[x],
                    "%s %s isa %s: out[%zu] = 0x%04x, the fp32 call rounded "
                    "gives 0x%04x", c->name, dname, isa_name, x,
                    oh[GUARD + x], rounded[x]);
            from_half(dt, &oh[GUARD + x], 1, &got);
            double tol = TOL_ATTN_ABS + (TOL_ATTN_REL + ulp) * fabs(want[x]);
            REQUIRE(fabs((double)got - want[x]) <= tol,
                    "%s %s isa %s: out[%zu] = %g, oracle %g", c->name, dname,
                    isa_name, x, (double)got, want[x]);
        }
        free(rounded);
        mha_engine_destroy(e);
    }
    free(qf), free(kf), free(vf), free(qh), free(ks), free(vs), free(oh);
    free(of), free(want);
}
END_TEST

/* q and out share the compute dtype; a quantised one is not a compute
 * dtype. Refused with the field named, the output untouched. */
START_TEST(compute_dtype_errors)
{
    float q[2 * 8] = {0}, k[3 * 8] = {0}, v[3 * 8] = {0};
    uint16_t oh[2 * 8], qh[2 * 8] = {0};
    float of[2 * 8];
    for (int i = 0; i < 16; i++)
        oh[i] = 0x1234u, of[i] = 7.0f;
    mha_isa isas[TEST_MAX_ISAS];
    available_isas(isas);
    mha_engine *e = make_engine(isas[0], 1);
    struct {
        mha_tensor q, out;
        const char *field;
    } rows[] = {
        {mha_tensor_bshd_typed(qh, MHA_BF16, 1, 2, 1, 8),
         mha_tensor_bshd(of, 1, 2, 1, 8), "out.dtype (f32) differs from q.dtype (bf16)"},
        {mha_tensor_bshd(q, 1, 2, 1, 8),
         mha_tensor_bshd_typed(oh, MHA_F16, 1, 2, 1, 8), "out.dtype (f16) differs from q.dtype (f32)"},
        {mha_tensor_bshd_typed(qh, MHA_F16, 1, 2, 1, 8),
         mha_tensor_bshd_typed(oh, MHA_BF16, 1, 2, 1, 8), "out.dtype (bf16) differs"},
        {mha_tensor_bshd_typed(qh, MHA_I8, 1, 2, 1, 8),
         mha_tensor_bshd_typed(oh, MHA_I8, 1, 2, 1, 8), "q.dtype (i8)"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        mha_attention_args a = {.q = rows[i].q, .k = mha_tensor_bshd(k, 1, 3, 1, 8),
                                .v = mha_tensor_bshd(v, 1, 3, 1, 8),
                                .out = rows[i].out};
        mha_status st = mha_attention(e, &a);
        ck_assert_int_eq(st, MHA_ERR_UNSUPPORTED);
        ck_assert_msg(strstr(mha_last_error(), rows[i].field), "row %zu: %s", i,
                      mha_last_error());
        ck_assert_int_eq(mha_attention_check(e, &a), MHA_ERR_UNSUPPORTED);
        for (int x = 0; x < 16; x++)
            ck_assert(oh[x] == 0x1234u && of[x] == 7.0f);
    }
    mha_engine_destroy(e);
}
END_TEST

/* mha_merge_states merges fp32 parts into fp32: a half out or part is
 * refused, naming it, the output untouched. */
START_TEST(merge_takes_fp32)
{
    float o0[2 * 4], o1[2 * 4], l0[2] = {0.5f, 1.0f}, l1[2] = {1.0f, 0.0f};
    float out[2 * 4];
    uint16_t outh[2 * 4];
    for (int i = 0; i < 8; i++)
        o0[i] = (float)i, o1[i] = (float)(8 - i), out[i] = 7.0f,
        outh[i] = 0x1234u;
    mha_tensor parts[2] = {mha_tensor_bshd(o0, 1, 2, 1, 4),
                           mha_tensor_bshd(o1, 1, 2, 1, 4)};
    const float *lses[2] = {l0, l1};
    mha_merge_args a = {2, parts, lses,
                        mha_tensor_bshd_typed(outh, MHA_BF16, 1, 2, 1, 4), NULL};
    ck_assert_int_eq(mha_merge_states(&a), MHA_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(mha_last_error(), "out.dtype"), "%s", mha_last_error());
    a.out = mha_tensor_bshd(out, 1, 2, 1, 4);
    parts[1].dtype = MHA_F16;
    ck_assert_int_eq(mha_merge_states(&a), MHA_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(mha_last_error(), "outs[1].dtype"), "%s",
                  mha_last_error());
    for (int i = 0; i < 8; i++)
        ck_assert(out[i] == 7.0f && outh[i] == 0x1234u);
    parts[1].dtype = MHA_F32;
    ck_assert_int_eq(mha_merge_states(&a), MHA_OK);
}
END_TEST

Suite *suite_compute(void)
{
    Suite *s = suite_create("compute");
    TCase *tc = tcase_create("compute");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, half_compute, 0, 2 * NCASES);
    tcase_add_test(tc, compute_dtype_errors);
    tcase_add_test(tc, merge_takes_fp32);
    suite_add_tcase(s, tc);
    return s;
}
