/* The errors suite, part 3: mha_attention_varlen's own fields (the batch,
 * cu_seqlens, the paged cache, the packed outputs). Each row breaks a
 * valid continuous batch in one way: status, a message naming the field,
 * not one byte of the arena (inputs, index arrays, out, lse) or the
 * weights written. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

/* Three sequences, lq {2, 0, 3} (or 2 each as [B, Lq, H, d]), lk {5, 3,
 * 8}: a pool of 7 blocks of 4 keys, or keys packed. */
enum { VB = 3, VH = 4, VHKV = 2, VD = 8, VDV = 6, VBS = 4, VNB = 7,
       VMAXB = 3, VTQ = 5, VLQ = 2, VTK = 16 };
#define V_NQ (VB * VLQ * VH * VD) /* room for either query form */
#define V_NKP (VNB * VBS * VHKV * VD)
#define V_NVP (VNB * VBS * VHKV * VDV)
#define V_NKK (VTK * VHKV * VD)
#define V_NVK (VTK * VHKV * VDV)
#define V_NOUT (VB * VLQ * VH * VDV)
#define V_NLSE (VB * VLQ * VH)
#define V_NW (VH * (2 * 5 + 0 * 3 + 3 * 8))
#define V_NINT ((VB + 1) * 2 + VB * VMAXB + VB)
/* int8 codes of the pool, as floats' room */
#define V_NKC (V_NKP / 4)
#define V_NKS (VNB * VBS * VHKV)
#define V_ARENA (V_NQ + V_NKP + V_NVP + V_NKK + V_NVK + V_NOUT + V_NLSE + \
                 V_NINT + V_NKC + V_NKS)

typedef struct vfix {
    float *arena, *q, *kp, *vp, *kk, *vk, *out, *lse, *ks, *w;
    int8_t *kc;
    int32_t *cu_q, *cu_k, *table, *seqlens;
    mha_paged_kv paged;
    mha_varlen_args args;
} vfix;

static void vfix_init(vfix *f)
{
    test_rng r;
    rng_seed(&r, 12);
    f->arena = test_alloc(V_ARENA * sizeof(float));
    fill_uniform(&r, f->arena, V_ARENA);
    f->q = f->arena;
    f->kp = f->q + V_NQ;
    f->vp = f->kp + V_NKP;
    f->kk = f->vp + V_NVP;
    f->vk = f->kk + V_NKK;
    f->out = f->vk + V_NVK;
    f->lse = f->out + V_NOUT;
    f->cu_q = (int32_t *)(f->lse + V_NLSE);
    f->cu_k = f->cu_q + VB + 1;
    f->table = f->cu_k + VB + 1;
    f->seqlens = f->table + VB * VMAXB;
    f->kc = (int8_t *)(f->seqlens + VB);
    f->ks = (float *)f->kc + V_NKC;
    fill_sentinel(f->out, V_NOUT + V_NLSE);
    static const int32_t cu_q[] = {0, 2, 2, 5}, cu_k[] = {0, 5, 8, 16};
    /* Entries past a sequence's blocks lie outside the pool: unread. */
    static const int32_t table[] = {6, 1, -1, 3, 9999, -5, 0, 4, 77};
    static const int32_t seqlens[] = {5, 3, 8};
    memcpy(f->cu_q, cu_q, sizeof cu_q);
    memcpy(f->cu_k, cu_k, sizeof cu_k);
    memcpy(f->table, table, sizeof table);
    memcpy(f->seqlens, seqlens, sizeof seqlens);
    for (int i = 0; i < V_NKP; i++)
        f->kc[i] = (int8_t)(rng_next(&r) >> 57);
    for (int i = 0; i < V_NKS; i++)
        f->ks[i] = 0.01f;
    f->w = test_alloc(V_NW * sizeof(float));
    fill_sentinel(f->w, V_NW);
    f->paged = (mha_paged_kv){.block_table = f->table, .max_blocks = VMAXB,
                              .seqlens = f->seqlens};
    f->args = (mha_varlen_args){
        .batch = VB,
        .q = mha_tensor_bshd(f->q, 1, VTQ, VH, VD),
        .cu_seqlens_q = f->cu_q,
        .k = mha_tensor_bshd(f->kp, VNB, VBS, VHKV, VD),
        .v = mha_tensor_bhsd(f->vp, VNB, VBS, VHKV, VDV),
        .paged = &f->paged,
        .out = mha_tensor_bshd(f->out, 1, VTQ, VH, VDV),
        .causal = MHA_CAUSAL_BOTTOM_RIGHT,
        .weights = f->w,
        .lse = f->lse,
    };
}

/* The other forms of the same batch. */
static void packed_keys(vfix *f)
{
    f->args.paged = NULL;
    f->args.cu_seqlens_k = f->cu_k;
    f->args.k = mha_tensor_bshd(f->kk, 1, VTK, VHKV, VD);
    f->args.v = mha_tensor_bshd(f->vk, 1, VTK, VHKV, VDV);
}

static void dense_queries(vfix *f)
{
    f->args.cu_seqlens_q = NULL;
    f->args.q = mha_tensor_bshd(f->q, VB, VLQ, VH, VD);
    f->args.out = mha_tensor_bshd(f->out, VB, VLQ, VH, VDV);
    f->args.weights = NULL; /* its size differs from the packed rows' */
}

static void int8_pool(vfix *f)
{
    f->args.k = mha_tensor_bshd_typed(f->kc, MHA_I8, VNB, VBS, VHKV, VD);
    f->args.k.scales = (mha_scales){f->ks, VBS * VHKV, VHKV, 1};
}

typedef struct vcall {
    vfix *f;
    const mha_engine *engine;
    const mha_varlen_args *args;
} vcall;

typedef struct vbad {
    expectation e;
    void (*fn)(vcall *c);
} vbad;

static void engine_null(vcall *c) { c->engine = NULL; }
static void args_null(vcall *c) { c->args = NULL; }
static void batch_0(vcall *c) { c->f->args.batch = 0; }
static void batch_neg(vcall *c) { c->f->args.batch = -2; }
static void cu_q0(vcall *c) { c->f->cu_q[0] = 1; }
static void cu_q_down(vcall *c) { c->f->cu_q[2] = 1; }
static void cu_q_short(vcall *c) { c->f->cu_q[VB] = VTQ - 1; }
static void cu_q_long(vcall *c) { c->f->cu_q[VB] = VTQ + 1; }
static void cu_k0(vcall *c)
{
    packed_keys(c->f);
    c->f->cu_k[0] = 2;
}
static void cu_k_down(vcall *c)
{
    packed_keys(c->f);
    c->f->cu_k[1] = 9;
}
static void cu_k_short(vcall *c)
{
    packed_keys(c->f);
    c->f->cu_k[VB] = VTK - 1;
}
static void k_batch_2(vcall *c)
{
    packed_keys(c->f);
    c->f->args.k.batch = c->f->args.v.batch = 2;
    c->f->args.k.stride_batch = c->f->args.v.stride_batch = 0;
}
static void both_k_forms(vcall *c) { c->f->args.cu_seqlens_k = c->f->cu_k; }
static void no_k_form(vcall *c) { c->f->args.paged = NULL; }
static void table_null(vcall *c) { c->f->paged.block_table = NULL; }
static void seqlens_null(vcall *c) { c->f->paged.seqlens = NULL; }
static int64_t bad_positions[VB];
static mha_score_terms position_terms;
static void use_positions(vcall *c, int totals, int64_t a, int64_t b,
                          int64_t d)
{
    bad_positions[0] = a, bad_positions[1] = b, bad_positions[2] = d;
    position_terms = (mha_score_terms){0};
    if (totals)
        position_terms.key_totals = bad_positions;
    else
        position_terms.key_offsets = bad_positions;
    c->f->args.terms = &position_terms;
}
/* Sequence 1 has 3 keys: a total of 2 cannot hold them. */
static void total_short(vcall *c) { use_positions(c, 1, 10, 2, 0); }
/* Packed keys: sequence 2 has cu_seqlens_k[3] - cu_seqlens_k[2] = 8. */
static void total_short_packed(vcall *c)
{
    packed_keys(c->f);
    use_positions(c, 1, 10, 10, 7);
}
static void offset_neg(vcall *c) { use_positions(c, 0, 0, 4, -3); }
static void offsets_and_offset(vcall *c)
{
    use_positions(c, 0, 1, 2, 3);
    position_terms.key_offset = 5;
}
static void seqlen_neg(vcall *c) { c->f->seqlens[1] = -1; }
static void seqlen_past(vcall *c) { c->f->seqlens[2] = VMAXB * VBS + 1; }
static void entry_neg(vcall *c) { c->f->table[VMAXB] = -1; }
static void entry_past(vcall *c) { c->f->table[2 * VMAXB + 1] = VNB; }
/* Sequence 1 grows into its second block, whose entry is 9999. */
static void entry_brought_into_use(vcall *c) { c->f->seqlens[1] = 5; }
static void max_blocks_0(vcall *c) { c->f->paged.max_blocks = 0; }
static void max_blocks_neg(vcall *c) { c->f->paged.max_blocks = -1; }
static void stride_neg(vcall *c) { c->f->paged.block_table_stride = -1; }
static void stride_short(vcall *c) { c->f->paged.block_table_stride = 2; }
static void stride_huge(vcall *c)
{
    c->f->paged.block_table_stride = HUGE_STRIDE;
}
/* [B, Lq, H, d] queries with cu_seqlens_q consistent with q.seq. */
static void q_batch_with_cu(vcall *c)
{
    dense_queries(c->f);
    static const int32_t cu[] = {0, 1, 1, VLQ};
    memcpy(c->f->cu_q, cu, sizeof cu);
    c->f->args.cu_seqlens_q = c->f->cu_q;
}
static void q_batch_without_cu(vcall *c) { c->f->args.cu_seqlens_q = NULL; }
static void out_seq(vcall *c) { c->f->args.out.seq = VTQ - 1; }
static void out_heads(vcall *c) { c->f->args.out.heads = 2; }
static void out_dim(vcall *c) { c->f->args.out.dim = VDV - 1; }
static void kv_heads_3(vcall *c) { c->f->args.k.heads = c->f->args.v.heads = 3; }
static void weights_on_out(vcall *c) { c->f->args.weights = c->f->out + 2; }
static void lse_on_out(vcall *c) { c->f->args.lse = c->f->out + 3; }
static void lse_on_weights(vcall *c) { c->f->args.lse = c->f->w + 8; }
static void out_on_k_pool(vcall *c)
{
    c->f->args.out.data = c->f->kp + 40;
}
static void out_on_v_pool(vcall *c)
{
    c->f->args.out.data = c->f->vp + V_NVP - 10;
}
static void out_on_packed_k(vcall *c)
{
    packed_keys(c->f);
    c->f->args.out.data = c->f->kk + 1;
}
static void lse_on_seqlens(vcall *c)
{
    c->f->args.lse = (float *)c->f->seqlens + 2;
}
static void out_on_table(vcall *c)
{
    c->f->args.out.data = (float *)c->f->table + 4;
}
/* The table's last entry (row B - 1, entry max_blocks - 1): the span
 * checked is the whole table, not B - 1 rows of it. */
static void lse_on_table_end(vcall *c)
{
    c->f->args.lse = (float *)(void *)(c->f->table + VB * VMAXB - 1);
}
static void weights_on_cu_q(vcall *c)
{
    c->f->args.weights = (float *)c->f->cu_q + 1;
}
static void causal_3(vcall *c) { c->f->args.causal = (mha_causal)3; }
static void scale_nan(vcall *c) { c->f->args.scale = NAN; }
static void q_f16(vcall *c) { c->f->args.q.dtype = MHA_F16; }
/* Block 6 is sequence 0's first: slot 2, head 1 is key 2's. */
static void used_scale_zero(vcall *c)
{
    int8_pool(c->f);
    c->f->ks[(6 * VBS + 2) * VHKV + 1] = 0.0f;
}
/* The one key sequence 0 reads of its second block (block 1, slot 0):
 * the scan of a partial block reaches it. */
static void used_scale_partial(vcall *c)
{
    int8_pool(c->f);
    c->f->ks[(1 * VBS + 0) * VHKV + VHKV - 1] = NAN;
}
static void pool_no_scales(vcall *c)
{
    int8_pool(c->f);
    c->f->args.k.scales.data = NULL;
}

static const vbad VBAD[] = {
    {{"varlen: engine NULL", MHA_ERR_NULL_POINTER, "engine"}, engine_null},
    {{"varlen: args NULL", MHA_ERR_NULL_POINTER, "args"}, args_null},
    {{"varlen: batch 0", MHA_ERR_BAD_SHAPE, "batch"}, batch_0},
    {{"varlen: batch -2", MHA_ERR_BAD_SHAPE, "batch"}, batch_neg},
    {{"cu_seqlens_q[0] 1", MHA_ERR_BAD_SHAPE, "cu_seqlens_q[0]"}, cu_q0},
    {{"cu_seqlens_q decreasing", MHA_ERR_BAD_SHAPE, "cu_seqlens_q[2]"},
     cu_q_down},
    {{"cu_seqlens_q[B] below q.seq", MHA_ERR_BAD_SHAPE, "cu_seqlens_q[3]"},
     cu_q_short},
    {{"cu_seqlens_q[B] past q.seq", MHA_ERR_BAD_SHAPE, "cu_seqlens_q[3]"},
     cu_q_long},
    {{"cu_seqlens_k[0] 2", MHA_ERR_BAD_SHAPE, "cu_seqlens_k[0]"}, cu_k0},
    {{"cu_seqlens_k decreasing", MHA_ERR_BAD_SHAPE, "cu_seqlens_k[2]"},
     cu_k_down},
    {{"cu_seqlens_k[B] below k.seq", MHA_ERR_BAD_SHAPE, "cu_seqlens_k[3]"},
     cu_k_short},
    {{"k.batch 2 with cu_seqlens_k", MHA_ERR_BAD_SHAPE, "k.batch"},
     k_batch_2},
    {{"cu_seqlens_k and paged both set", MHA_ERR_BAD_ARGUMENT,
      "cu_seqlens_k|paged"}, both_k_forms},
    {{"neither cu_seqlens_k nor paged", MHA_ERR_BAD_ARGUMENT,
      "cu_seqlens_k|paged"}, no_k_form},
    {{"paged.block_table NULL", MHA_ERR_NULL_POINTER, "paged.block_table"},
     table_null},
    {{"paged.seqlens NULL", MHA_ERR_NULL_POINTER, "paged.seqlens"},
     seqlens_null},
    {{"terms.key_totals[1] below its sequence's keys", MHA_ERR_BAD_ARGUMENT,
      "terms.key_totals[1]"}, total_short},
    {{"packed keys: terms.key_totals[2] below its sequence's keys",
      MHA_ERR_BAD_ARGUMENT, "terms.key_totals[2] (7) is below sequence 2's "
      "key offset + keys (0 + 8)"}, total_short_packed},
    {{"terms.key_offsets[2] -3", MHA_ERR_BAD_ARGUMENT, "terms.key_offsets[2]"},
     offset_neg},
    {{"terms.key_offsets and key_offset both set", MHA_ERR_BAD_ARGUMENT,
      "terms.key_offsets"}, offsets_and_offset},
    {{"paged.seqlens[1] -1", MHA_ERR_BAD_SHAPE, "paged.seqlens[1]"},
     seqlen_neg},
    {{"paged.seqlens[2] past max_blocks * block_size", MHA_ERR_BAD_SHAPE,
      "paged.seqlens[2]"}, seqlen_past},
    {{"used block_table entry -1", MHA_ERR_BAD_ARGUMENT,
      "paged.block_table[1][0]"}, entry_neg},
    {{"used block_table entry num_blocks", MHA_ERR_BAD_ARGUMENT,
      "paged.block_table[2][1]"}, entry_past},
    {{"a longer sequence uses an entry outside the pool",
      MHA_ERR_BAD_ARGUMENT, "paged.block_table[1][1]"},
     entry_brought_into_use},
    {{"paged.max_blocks 0", MHA_ERR_BAD_SHAPE, "paged.max_blocks"},
     max_blocks_0},
    {{"paged.max_blocks -1", MHA_ERR_BAD_SHAPE, "paged.max_blocks"},
     max_blocks_neg},
    {{"paged.block_table_stride -1", MHA_ERR_BAD_STRIDE,
      "paged.block_table_stride"}, stride_neg},
    {{"paged.block_table_stride below max_blocks", MHA_ERR_BAD_STRIDE,
      "paged.block_table_stride"}, stride_short},
    {{"paged.block_table extent overflows", MHA_ERR_OVERFLOW,
      "paged.block_table|paged.block_table_stride"}, stride_huge},
    {{"q.batch 3 with cu_seqlens_q", MHA_ERR_BAD_SHAPE, "q.batch"},
     q_batch_with_cu},
    {{"q.batch 1 != batch without cu_seqlens_q", MHA_ERR_BAD_SHAPE,
      "q.batch"}, q_batch_without_cu},
    {{"varlen: out.seq differs", MHA_ERR_BAD_SHAPE, "out.seq"}, out_seq},
    {{"varlen: out.heads differs", MHA_ERR_BAD_SHAPE, "out.heads"},
     out_heads},
    {{"varlen: out.dim differs", MHA_ERR_BAD_SHAPE, "out.dim"}, out_dim},
    {{"varlen: Hkv 3 does not divide H 4", MHA_ERR_BAD_SHAPE, "k.heads"},
     kv_heads_3},
    {{"varlen: weights overlap out", MHA_ERR_BAD_STRIDE, "weights"},
     weights_on_out},
    {{"varlen: lse overlaps out", MHA_ERR_BAD_STRIDE, "lse"}, lse_on_out},
    {{"varlen: lse overlaps weights", MHA_ERR_BAD_STRIDE, "lse|weights"},
     lse_on_weights},
    {{"out overlaps the k pool", MHA_ERR_BAD_STRIDE, "out"}, out_on_k_pool},
    {{"out overlaps the v pool's tail", MHA_ERR_BAD_STRIDE, "out"},
     out_on_v_pool},
    {{"out overlaps packed k", MHA_ERR_BAD_STRIDE, "out"}, out_on_packed_k},
    {{"lse overlaps paged.seqlens", MHA_ERR_BAD_STRIDE, "lse"},
     lse_on_seqlens},
    {{"out overlaps paged.block_table", MHA_ERR_BAD_STRIDE, "out"},
     out_on_table},
    {{"lse overlaps the last entry of paged.block_table", MHA_ERR_BAD_STRIDE,
      "lse overlaps paged.block_table"}, lse_on_table_end},
    {{"weights overlap cu_seqlens_q", MHA_ERR_BAD_STRIDE, "weights"},
     weights_on_cu_q},
    {{"varlen: causal 3", MHA_ERR_BAD_MASK, "causal"}, causal_3},
    {{"varlen: scale NaN", MHA_ERR_BAD_ARGUMENT, "scale"}, scale_nan},
    {{"varlen: q.dtype F16", MHA_ERR_UNSUPPORTED, "q.dtype"}, q_f16},
    {{"int8 pool: a used block's scale 0", MHA_ERR_BAD_ARGUMENT,
      "k.scales"}, used_scale_zero},
    {{"int8 pool: a partial block's used scale NaN", MHA_ERR_BAD_ARGUMENT,
      "k.scales[block=1, slot=0, h=1]"}, used_scale_partial},
    {{"int8 pool without scales", MHA_ERR_NULL_POINTER, "k.scales.data"},
     pool_no_scales},
};
#define N_VBAD ((int)(sizeof VBAD / sizeof VBAD[0]))

START_TEST(varlen_bad_input)
{
    const vbad *bad = &VBAD[_i];
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    const size_t arena_bytes = V_ARENA * sizeof(float);
    for (int t = 0; t < n_isa; t++) {
        vfix f;
        vfix_init(&f);
        mha_engine *engine = make_engine(isas[t], 2);
        vcall c = {&f, engine, &f.args};
        bad->fn(&c);
        unsigned char *before = test_alloc(arena_bytes);
        memcpy(before, f.arena, arena_bytes);
        const char *primed = prime_message();
        mha_status st = mha_attention_varlen_check(c.engine, c.args);
        expect_rejected(st, &bad->e, isas[t], primed, before, f.arena,
                        arena_bytes, f.w, V_NW);
        primed = prime_message();
        st = mha_attention_varlen(c.engine, c.args);
        expect_rejected(st, &bad->e, isas[t], primed, before, f.arena,
                        arena_bytes, f.w, V_NW);
        mha_engine_destroy(engine);
        free(before);
        free(f.arena), free(f.w);
    }
}
END_TEST

/* An int8 pool whose unread scales are 0 (slots past a sequence's keys
 * in its last block, blocks no sequence uses): only what is read is
 * checked. */
static void int8_pool_unread_zero(vfix *f)
{
    int8_pool(f);
    for (int slot = 1; slot < VBS; slot++) /* sequence 0 reads slot 0 */
        for (int h = 0; h < VHKV; h++)
            f->ks[(1 * VBS + slot) * VHKV + h] = 0.0f;
    for (int h = 0; h < VHKV; h++) /* sequence 1 reads slots 0..2 */
        f->ks[(3 * VBS + 3) * VHKV + h] = 0.0f;
    for (int i = 0; i < VBS * VHKV; i++) { /* blocks 2 and 5: unused */
        f->ks[2 * VBS * VHKV + i] = 0.0f;
        f->ks[5 * VBS * VHKV + i] = NAN;
    }
}

/* The fixture in each form is accepted (so each row's failure is its
 * own): paged with unread out-of-pool entries, packed keys, [B, Lq, H, d]
 * queries, an int8 pool; out and lse written, nothing past them. */
START_TEST(varlen_fixture_is_valid)
{
    void (*forms[5])(vfix *) = {NULL, packed_keys, dense_queries, int8_pool,
                                int8_pool_unread_zero};
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int x = 0; x < n_isa; x++)
        for (int i = 0; i < 5; i++) {
            vfix f;
            vfix_init(&f);
            if (forms[i])
                forms[i](&f);
            mha_engine *e = make_engine(isas[x], 2);
            mha_status st = mha_attention_varlen(e, &f.args);
            ck_assert_msg(st == MHA_OK, "[%s] form %d: %s (%s)",
                          mha_isa_name(isas[x]), i, mha_status_string(st),
                          mha_last_error());
            size_t rows = i == 2 ? VB * VLQ : VTQ;
            ck_assert_msg(count_changed(f.out, rows * VH * VDV) ==
                              rows * VH * VDV &&
                              count_changed(f.lse, rows * VH) == rows * VH,
                          "[%s] form %d: out or lse not written",
                          mha_isa_name(isas[x]), i);
            ck_assert_msg(count_changed(f.out + rows * VH * VDV,
                                        V_NOUT - rows * VH * VDV) == 0,
                          "[%s] form %d: wrote past out",
                          mha_isa_name(isas[x]), i);
            mha_engine_destroy(e);
            free(f.arena), free(f.w);
        }
}
END_TEST

void errors_add_varlen_tests(TCase *tc)
{
    tcase_add_test(tc, varlen_fixture_is_valid);
    tcase_add_loop_test(tc, varlen_bad_input, 0, N_VBAD);
}
