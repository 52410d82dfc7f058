/* The continuous-batch case: mha_attention_varlen with packed or paged
 * keys, both query forms, empty sequences, shuffled and shared blocks,
 * pool blocks no sequence uses filled with NaN, and one injected fault at
 * a time in the new fields (cu_seqlens, block table, lengths, the key
 * form, the batch). A valid request must succeed, leave its inputs
 * untouched and match the double oracle per sequence on its gathered keys;
 * an invalid one must fail (with the fault's status) and leave every
 * buffer byte-identical. Bytes, in order: B, kv heads, group, d, dtype,
 * form bits, causal, block size, per sequence lq and lk, shuffle seed,
 * sharing, spare blocks, table stride, fault, data seed, then the 8-bit
 * K/V (encoding.h, VQ_*): dtypes, k's and v's scale layouts (KS_*), a bad
 * scale and its index.
 *
 * 8-bit K/V hold finite codes; their scales (per row, head, tensor,
 * block, token, padded, or rows sharing scales) are near 1 / the largest
 * code, one in eight negative. Scales no sequence reads (pool slots past
 * the lengths, blocks no sequence uses, padding) hold 0, NaN or
 * infinities: accepted. A bad scale (0, NaN, +-inf) at a scale the call
 * reads must give MHA_ERR_BAD_ARGUMENT, a negative scale stride
 * MHA_ERR_BAD_STRIDE, a quantised K/V without scales MHA_ERR_NULL_POINTER.
 * The oracle reads the gathered codes with their gathered scales (value =
 * code x scale, support.h's decoders). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "oracle.h"

enum { VB = 4, VMAX_LQ = 12, VMAX_LK = 50, VMAX_BLOCKS = 64 };

/* Faults, one at a time (codes past V_FAULTS: none). */
enum { V_CU_Q0 = 1, V_CU_Q_DOWN, V_LEN_PAST, V_TABLE_OUT, V_UNUSED_JUNK,
       V_BOTH_FORMS, V_NO_FORM, V_BATCH0, V_STRIDE, V_FAULTS };

typedef struct {
    int64_t B, H, Hkv, d, bs, Lq; /* Lq: the [B, Lq, H, d] query form */
    mha_dtype dt[2];              /* k's, v's */
    unsigned ks[2], bad, bad_at;  /* scale layouts (KS_*), bad scale */
    int paged, dense_q, with_lse, bhsd, causal, fault;
    int32_t lq[VB], lk[VB];
    int32_t cu_q[VB + 1], cu_k[VB + 1], lens[VB];
    int32_t table[VB * (VMAX_BLOCKS + 3)];
    int64_t blocks, max_blocks, stride;
} vcase;

static float unit_value(uint64_t *z)
{
    *z = *z * 6364136223846793005u + 1442695040888963407u;
    return (float)((*z >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

/* n values in [-1, 1) of dtype dt at x; an 8-bit dtype any finite code. */
static void fill_dtype(void *x, size_t n, mha_dtype dt, uint64_t *z)
{
    for (size_t i = 0; i < n; i++) {
        float f = unit_value(z);
        if (is_q8_dtype(dt))
            ((uint8_t *)x)[i] = finite_code(dt, *z);
        else if (dt == MHA_F32)
            ((float *)x)[i] = f;
        else if (dt == MHA_F16)
            mha_f32_to_f16(&f, 1, (uint16_t *)x + i);
        else
            mha_f32_to_bf16(&f, 1, (uint16_t *)x + i);
    }
}

static void parse(byte_reader *in, vcase *c)
{
    static const int64_t ds[] = {4, 8, 16, 24, 33};
    static const mha_dtype dts[] = {MHA_F32, MHA_F16, MHA_BF16};
    memset(c, 0, sizeof *c);
    c->B = 1 + take8(in) % VB;
    c->Hkv = 1 + take8(in) % 2;
    c->H = c->Hkv * (1 + take8(in) % 3);
    c->d = ds[take8(in) % 5];
    c->dt[0] = c->dt[1] = dts[take8(in) % 3];
    unsigned form = take8(in);
    c->paged = form & 1, c->dense_q = (form >> 1) & 1;
    c->with_lse = (form >> 2) & 1, c->bhsd = (form >> 3) & 1;
    c->causal = (int)(take8(in) % 4); /* 3: not an mha_causal */
    c->bs = 1 + take8(in) % 7;
    c->Lq = 1 + take8(in) % 5;
    for (int64_t b = 0; b < c->B; b++) {
        c->lq[b] = c->dense_q ? (int32_t)c->Lq : (int32_t)(take8(in) % VMAX_LQ);
        c->lk[b] = (int32_t)(take8(in) % VMAX_LK);
    }
}

static void fault(fault_list *f, mha_status st, const char *why);

/* The bytes after the data seed: 8-bit K/V, their scales, a bad scale. */
static void parse_quant(byte_reader *in, vcase *c)
{
    static const mha_dtype q8[4] = {MHA_F32, MHA_I8, MHA_FP8_E4M3,
                                     MHA_FP8_E5M2};
    unsigned qb = take8(in);
    if (qb & 3)
        c->dt[0] = q8[qb & 3];
    c->dt[1] = (qb >> 2) & 3 ? q8[(qb >> 2) & 3] : c->dt[0];
    c->ks[0] = take8(in);
    c->ks[1] = take8(in);
    c->bad = take8(in);
    c->bad_at = take8(in);
}

/* The scales of k or v: the strides given (maybe negative), their
 * non-negative twin (the buffer's layout), the buffer and which of its
 * floats the call reads. */
typedef struct {
    int on;            /* a quantised tensor with scales */
    int64_t st[3], pst[3];
    float *data;
    size_t n;
    uint8_t *read;
} vscales;

static int64_t scale_addr(const vscales *s, int64_t blk, int64_t slot,
                          int64_t h)
{
    return blk * s->pst[0] + slot * s->pst[1] + h * s->pst[2];
}

/* The scale of key row (b, j, h) of the sequences, or -1 for none. */
static int64_t key_scale_addr(const vcase *c, const vscales *s, int64_t b,
                              int64_t j, int64_t h)
{
    if (!c->paged)
        return scale_addr(s, 0, c->cu_k[b] + j, h);
    int64_t tr = c->stride ? c->stride : c->max_blocks;
    return scale_addr(s, c->table[b * tr + j / c->bs], j % c->bs, h);
}

/* Lays out, fills and marks tensor i's scales (before any fault touches
 * the index arrays); a quantised tensor without scales, a negative scale
 * stride and a bad value at a scale the sequences read are faults. */
static void make_scales(const vcase *c, int i, int64_t total_k, vscales *s,
                        fault_list *f, uint64_t *z)
{
    memset(s, 0, sizeof *s);
    if (!is_q8_dtype(c->dt[i]))
        return;
    int64_t nb = c->paged ? c->blocks : 1;
    int64_t S = c->paged ? c->bs : (total_k > 0 ? total_k : 1);
    if (!kv_scale_strides(c->ks[i], S, c->Hkv, s->st)) {
        fault(f, MHA_ERR_NULL_POINTER, "quantised K/V without scales");
        return;
    }
    s->on = 1;
    int neg = 0;
    for (int a = 0; a < 3; a++) {
        neg |= s->st[a] < 0;
        s->pst[a] = s->st[a] < 0 ? -s->st[a] : s->st[a];
    }
    if (neg)
        fault(f, MHA_ERR_BAD_STRIDE, "a scale stride is negative");
    const int64_t size[3] = {nb, S, c->Hkv};
    s->n = (size_t)span_elems(size, s->pst, 3);
    s->data = malloc(s->n * sizeof *s->data);
    s->read = calloc(s->n, 1);
    if (!s->data || !s->read)
        abort();
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < c->lk[b]; j++)
            for (int64_t h = 0; h < c->Hkv; h++)
                s->read[key_scale_addr(c, s, b, j, h)] = 1;
    double top = q8_max(c->dt[i]);
    static const float junk[4] = {NAN, 0.0f, INFINITY, -INFINITY};
    for (size_t x = 0; x < s->n; x++) {
        float u = unit_value(z); /* [-1, 1) */
        s->data[x] = s->read[x] ? (float)((u < -0.75f ? -1.0 : 1.0) *
                                          (1.25 + 0.25 * u) / top)
                                : junk[x % 4];
    }
}

/* A bad value at the bad_at-th scale the sequences read, in k's or v's
 * scales (the bad byte's bit VBAD_V, else the quantised one). */
static void bad_scale(const vcase *c, vscales *sc, fault_list *f)
{
    unsigned cls = c->bad & 7;
    if (cls < VBAD_ZERO)
        return;
    int i = (c->bad & VBAD_V) ? 1 : 0;
    if (!sc[i].on)
        i = 1 - i;
    vscales *s = &sc[i];
    int64_t nread = 0;
    for (int64_t b = 0; b < c->B; b++)
        nread += c->lk[b] * c->Hkv;
    if (!s->on || nread == 0)
        return;
    int64_t at = (int64_t)(c->bad_at % (uint64_t)nread), n = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < c->lk[b]; j++)
            for (int64_t h = 0; h < c->Hkv; h++, n++)
                if (n == at)
                    s->data[key_scale_addr(c, s, b, j, h)] =
                        cls == VBAD_ZERO ? 0.0f
                        : cls == VBAD_NAN ? NAN
                        : (c->bad_at & 1) ? -INFINITY
                                          : INFINITY;
    fault(f, MHA_ERR_BAD_ARGUMENT,
          "a scale the sequences read is 0 or not finite");
}

/* The block table: each sequence's blocks from a shuffled pool with
 * spare blocks; with sharing, sequence 1 starts with sequence 0's first
 * blocks (a common prefix). */
static void build_table(byte_reader *in, vcase *c)
{
    uint64_t z = take32(in) | 1;
    unsigned share = take8(in), spare = take8(in) % 4;
    int64_t need[VB], most = 1, total = 0;
    for (int64_t b = 0; b < c->B; b++) {
        need[b] = (c->lk[b] + c->bs - 1) / c->bs;
        most = need[b] > most ? need[b] : most;
        total += need[b];
    }
    c->blocks = total + spare + 1;
    int32_t perm[VB * VMAX_BLOCKS + 4];
    for (int64_t i = 0; i < c->blocks; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = c->blocks - 1; i > 0; i--) {
        z = z * 6364136223846793005u + 1442695040888963407u;
        int64_t j = (int64_t)((z >> 33) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    unsigned sc = take8(in) % 4;
    c->max_blocks = most + (sc & 1);
    c->stride = sc == 2 ? c->max_blocks + 2 : 0;
    int64_t row = c->stride ? c->stride : c->max_blocks, at = 0;
    for (int64_t i = 0; i < c->B * row; i++)
        c->table[i] = (int32_t)(c->blocks + 7); /* unused: never read */
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t x = 0; x < need[b]; x++)
            c->table[b * row + x] =
                (share & 1) && b == 1 && x < need[0] ? c->table[x]
                                                     : perm[at++];
}

/* Adds status st to the faults of the request. */
static void fault(fault_list *f, mha_status st, const char *why)
{
    if (f->n < 24) {
        f->status[f->n] = st;
        f->why[f->n] = why;
        f->n++;
    }
}

/* Applies the request's injected fault to the index arrays and lists every
 * fault the request has (a zero total is one of its own). */
static void inject(vcase *c, int64_t total_q, int64_t total_k,
                   mha_varlen_args *a, mha_paged_kv *pg, fault_list *f)
{
    switch (c->fault) {
    case V_CU_Q0:
        if (!c->dense_q)
            c->cu_q[0] = 1, fault(f, MHA_ERR_BAD_SHAPE, "cu_seqlens_q[0]");
        break;
    case V_CU_Q_DOWN:
        if (!c->dense_q && c->B >= 2)
            c->cu_q[1] = c->cu_q[2] + 1,
            fault(f, MHA_ERR_BAD_SHAPE, "cu_seqlens_q decreasing");
        break;
    case V_LEN_PAST:
        if (c->paged)
            c->lens[0] = (int32_t)(c->max_blocks * c->bs + 1);
        else
            c->cu_k[c->B] = (int32_t)(total_k + 1);
        fault(f, MHA_ERR_BAD_SHAPE, "a length past its keys");
        break;
    case V_TABLE_OUT:
        if (c->paged && c->lk[0] > 0)
            c->table[0] = (int32_t)c->blocks,
            fault(f, MHA_ERR_BAD_ARGUMENT, "a used block outside the pool");
        break;
    case V_BOTH_FORMS:
        a->cu_seqlens_k = c->cu_k, a->paged = pg;
        fault(f, MHA_ERR_BAD_ARGUMENT, "both key forms");
        break;
    case V_NO_FORM:
        a->cu_seqlens_k = NULL, a->paged = NULL;
        fault(f, MHA_ERR_BAD_ARGUMENT, "no key form");
        break;
    case V_BATCH0:
        a->batch = 0;
        fault(f, MHA_ERR_BAD_SHAPE, "batch 0");
        break;
    case V_STRIDE:
        if (c->paged && c->max_blocks >= 2)
            pg->block_table_stride = c->max_blocks - 1,
            fault(f, MHA_ERR_BAD_STRIDE, "block_table_stride");
        break;
    default: break;
    }
    if (total_q == 0)
        fault(f, MHA_ERR_BAD_SHAPE, "no query rows");
    if (!c->paged && total_k == 0)
        fault(f, MHA_ERR_BAD_SHAPE, "no packed key rows");
    if (c->causal == 3)
        fault(f, MHA_ERR_BAD_MASK, "causal 7");
}

/* Sequence b's keys (i 0) or values (i 1) gathered into [lk, Hkv, d] of
 * the dtype, and a quantised tensor's scales into [lk, Hkv]. */
static void gather_seq(const vcase *c, int i, const mha_tensor *t,
                       const vscales *sc, int64_t b, char *dst, float *sdst)
{
    size_t es = mha_dtype_size(c->dt[i]), row = (size_t)c->d * es;
    int64_t tr = c->stride ? c->stride : c->max_blocks;
    for (int64_t j = 0; j < c->lk[b]; j++)
        for (int64_t h = 0; h < c->Hkv; h++) {
            int64_t blk = 0, s = c->cu_k[b] + j;
            if (c->paged)
                blk = c->table[b * tr + j / c->bs], s = j % c->bs;
            const char *src = (const char *)t->data +
                              (size_t)(blk * t->stride_batch +
                                       s * t->stride_seq +
                                       h * t->stride_head) * es;
            memcpy(dst + ((size_t)j * c->Hkv + h) * row, src, row);
            if (sc->on)
                sdst[j * c->Hkv + h] = sc->data[key_scale_addr(c, sc, b, j,
                                                                h)];
        }
}

/* Every row of a valid call against the oracle, sequence by sequence. */
static void check_rows(const vcase *c, const float *q, const mha_tensor *k,
                       const mha_tensor *v, const vscales *sc,
                       const float *out, const float *lse, int64_t total_q)
{
    size_t es = 4; /* the widest K/V element */
    for (int64_t b = 0; b < c->B; b++) {
        int64_t lq = c->lq[b], lk = c->lk[b], q0 = c->dense_q ? b * c->Lq
                                                               : c->cu_q[b];
        if (lq == 0)
            continue;
        size_t nkv = (size_t)(lk > 0 ? lk : 1) * c->Hkv * c->d * es;
        char *kg = malloc(nkv), *vg = malloc(nkv);
        double *want = malloc((size_t)lq * c->H * c->d * sizeof *want);
        double *wl = malloc((size_t)lq * c->H * sizeof *wl);
        size_t nsg = (size_t)(lk > 0 ? lk : 1) * c->Hkv;
        float *ksg = malloc(nsg * sizeof *ksg), *vsg = malloc(nsg * sizeof *vsg);
        if (!kg || !vg || !want || !wl || !ksg || !vsg)
            abort();
        if (lk > 0) {
            gather_seq(c, 0, k, &sc[0], b, kg, ksg);
            gather_seq(c, 1, v, &sc[1], b, vg, vsg);
            mha_mask m = {.causal = (mha_causal)c->causal};
            mha_attention_args a = {
                .q = mha_tensor_bshd_typed(q + q0 * c->H * c->d, MHA_F32, 1,
                                           lq, c->H, c->d),
                .k = mha_tensor_bshd_typed(kg, c->dt[0], 1, lk, c->Hkv, c->d),
                .v = mha_tensor_bshd_typed(vg, c->dt[1], 1, lk, c->Hkv, c->d),
                .mask = &m};
            /* Dequantised by the oracle: code x the gathered scale. */
            const mha_scales packed = {NULL, 0, c->Hkv, 1};
            if (sc[0].on)
                a.k.scales = packed, a.k.scales.data = ksg;
            if (sc[1].on)
                a.v.scales = packed, a.v.scales.data = vsg;
            oracle_attention_lse(&a, want, NULL, wl);
        }
        for (int64_t i = 0; i < lq; i++)
            for (int64_t h = 0; h < c->H; h++) {
                for (int64_t x = 0; x < c->d; x++) {
                    double w = lk > 0 ? want[(i * c->H + h) * c->d + x] : 0.0;
                    float g = out[((q0 + i) * c->H + h) * c->d + x];
                    REQUIRE_AT(fabs(g - w) <= TOL_ATTN_ABS +
                                                  TOL_ATTN_REL * fabs(w),
                               "sequence %lld row %lld head %lld [%lld]: "
                               "%.9g, want %.9g", (long long)b, (long long)i,
                               (long long)h, (long long)x, (double)g, w);
                }
                if (!lse)
                    continue;
                double wlse = lk > 0 ? wl[h * lq + i] : -INFINITY;
                float gl = c->dense_q ? lse[(b * c->H + h) * c->Lq + i]
                                      : lse[h * total_q + q0 + i];
                REQUIRE_AT(wlse == -INFINITY
                               ? gl == -INFINITY
                               : fabs(gl - wlse) <=
                                     TOL_LSE_ABS + TOL_LSE_REL * fabs(wlse),
                           "sequence %lld row %lld head %lld: lse %.9g, "
                           "want %.9g", (long long)b, (long long)i,
                           (long long)h, (double)gl, wlse);
            }
        free(kg), free(vg), free(want), free(wl), free(ksg), free(vsg);
    }
}

void fuzz_varlen(byte_reader *in, mha_engine *engine, const char *engine_desc)
{
    vcase c;
    parse(in, &c);
    build_table(in, &c);
    c.fault = (int)(take8(in) % (2 * V_FAULTS));
    uint64_t z = take32(in) | 1;
    parse_quant(in, &c);
    c.cu_q[0] = c.cu_k[0] = 0;
    for (int64_t b = 0; b < c.B; b++) {
        c.cu_q[b + 1] = c.cu_q[b] + c.lq[b];
        c.cu_k[b + 1] = c.cu_k[b] + c.lk[b];
        c.lens[b] = c.lk[b];
    }
    int64_t total_q = c.dense_q ? c.B * c.Lq : c.cu_q[c.B];
    int64_t total_k = c.cu_k[c.B];
    snprintf(context, sizeof context,
             "varlen B %lld H %lld/%lld d %lld k %s v %s (scales %u/%u bad "
             "%u@%u) %s%s%s%s block %lld causal %d fault %d; %s",
             (long long)c.B, (long long)c.H, (long long)c.Hkv, (long long)c.d,
             mha_dtype_name(c.dt[0]), mha_dtype_name(c.dt[1]), c.ks[0],
             c.ks[1], c.bad, c.bad_at,
             c.paged ? "paged" : "packed", c.dense_q ? " dense-q" : "",
             c.bhsd ? " bhsd" : "", c.with_lse ? " lse" : "",
             (long long)c.bs, c.causal, c.fault, engine_desc);
    announce();

    /* Exactly sized buffers: ASan sees any read past them. */
    size_t es = mha_dtype_size(c.dt[0]), esv = mha_dtype_size(c.dt[1]);
    int64_t kv_rows = c.paged ? c.blocks * c.bs : total_k;
    size_t nq = (size_t)total_q * c.H * c.d;
    size_t nkv = (size_t)(kv_rows > 0 ? kv_rows : 1) * c.Hkv * c.d;
    float *q = malloc(nq ? nq * sizeof *q : 1);
    char *k = malloc(nkv * es), *v = malloc(nkv * esv);
    float *out = malloc(nq ? nq * sizeof *out : 1);
    size_t nl = (size_t)total_q * c.H;
    float *lse = c.with_lse ? malloc(nl ? nl * sizeof *lse : 1) : NULL;
    if (!q || !k || !v || !out || (c.with_lse && !lse))
        abort();
    fill_dtype(q, nq, MHA_F32, &z);
    fill_dtype(k, nkv, c.dt[0], &z);
    fill_dtype(v, nkv, c.dt[1], &z);
    fill_sentinel(out, nq);
    if (lse)
        fill_sentinel(lse, nl);
    int64_t tr = c.stride ? c.stride : c.max_blocks;
    if (c.paged) { /* blocks no sequence uses hold NaN: never read */
        char used[VB * VMAX_BLOCKS + 4] = {0};
        for (int64_t b = 0; b < c.B; b++)
            for (int64_t x = 0; x < (c.lk[b] + c.bs - 1) / c.bs; x++)
                used[c.table[b * tr + x]] = 1;
        size_t per = (size_t)c.bs * c.Hkv * c.d;
        for (int64_t blk = 0; blk < c.blocks; blk++)
            if (!used[blk]) {
                memset(k + blk * per * es, 0xFF, per * es);
                memset(v + blk * per * esv, 0xFF, per * esv);
            }
    }
    fault_list f = {0};
    vscales sc[2];
    make_scales(&c, 0, total_k, &sc[0], &f, &z);
    make_scales(&c, 1, total_k, &sc[1], &f, &z);
    bad_scale(&c, sc, &f);
    mha_paged_kv pg = {c.table, c.max_blocks, c.stride, c.lens};
    mha_varlen_args a = {
        .batch = c.B,
        .q = c.dense_q ? mha_tensor_bshd(q, c.B, c.Lq, c.H, c.d)
                       : mha_tensor_bshd(q, 1, total_q, c.H, c.d),
        .cu_seqlens_q = c.dense_q ? NULL : c.cu_q,
        .out = c.dense_q ? mha_tensor_bshd(out, c.B, c.Lq, c.H, c.d)
                         : mha_tensor_bshd(out, 1, total_q, c.H, c.d),
        .causal = c.causal == 3 ? (mha_causal)7 : (mha_causal)c.causal,
        .lse = lse};
    if (c.paged) {
        a.k = c.bhsd ? mha_tensor_bhsd_typed(k, c.dt[0], c.blocks, c.bs,
                                             c.Hkv, c.d)
                     : mha_tensor_bshd_typed(k, c.dt[0], c.blocks, c.bs,
                                             c.Hkv, c.d);
        a.paged = &pg;
    } else {
        a.k = mha_tensor_bshd_typed(k, c.dt[0], 1, total_k, c.Hkv, c.d);
        a.cu_seqlens_k = c.cu_k;
    }
    a.v = a.k;
    a.v.data = v;
    a.v.dtype = c.dt[1];
    mha_tensor *kv[2] = {&a.k, &a.v};
    for (int i = 0; i < 2; i++)
        if (sc[i].on)
            kv[i]->scales = (mha_scales){sc[i].data, sc[i].st[0],
                                         sc[i].st[1], sc[i].st[2]};
    inject(&c, total_q, total_k, &a, &pg, &f);
    if (!engine)
        fault(&f, MHA_ERR_NULL_POINTER, "engine");

    /* Every buffer's bytes before the call. */
    enum { NB = 11 };
    buffer bufs[NB];
    const void *srcs[NB] = {q, k, v, out, lse, c.cu_q, c.cu_k, c.lens,
                            c.table, sc[0].data, sc[1].data};
    const size_t sizes[NB] = {nq * sizeof *q, nkv * es, nkv * esv,
                              nq * sizeof *out, lse ? nl * sizeof *lse : 0,
                              sizeof c.cu_q, sizeof c.cu_k, sizeof c.lens,
                              sizeof c.table, sc[0].n * sizeof(float),
                              sc[1].n * sizeof(float)};
    static char none; /* the absent lse, scales: nothing to compare */
    for (int i = 0; i < NB; i++) {
        bufs[i].data = srcs[i] ? (char *)srcs[i] : &none;
        bufs[i].bytes = sizes[i];
        buffer_snapshot(&bufs[i]);
    }
    mha_status st = mha_attention_varlen(engine, &a);
    int first_output = 3, last_output = 4; /* out, lse */
    if (f.n > 0) {
        REQUIRE_AT(st != MHA_OK, "accepted: %s", f.why[0]);
        int agree = 1;
        for (int i = 1; i < f.n; i++)
            agree &= f.status[i] == f.status[0];
        REQUIRE_AT(!agree || st == f.status[0], "status %s, want %s (%s)",
                   mha_status_string(st), mha_status_string(f.status[0]),
                   f.why[0]);
        REQUIRE(mha_last_error()[0] != '\0');
        for (int i = 0; i < NB; i++)
            REQUIRE_AT(buffer_unchanged(&bufs[i]), "buffer %d written", i);
        stats[S_ATTN_FAULT]++;
    } else {
        REQUIRE_AT(st == MHA_OK, "refused: %s (%s)", mha_status_string(st),
                   mha_last_error());
        for (int i = 0; i < NB; i++)
            if (i < first_output || i > last_output)
                REQUIRE_AT(buffer_unchanged(&bufs[i]), "input %d written", i);
        check_rows(&c, q, &a.k, &a.v, sc, out, lse, total_q);
        stats[S_ATTN_OK]++;
    }
    for (int i = 0; i < NB; i++)
        free(bufs[i].copy);
    free(q), free(k), free(v), free(out), free(lse);
    for (int i = 0; i < 2; i++)
        free(sc[i].data), free(sc[i].read);
}
