/*
 * Continuous batches (mha_attention_varlen, mha.h "Continuous batches"),
 * on every available ISA:
 *  - packed keys (cu_seqlens_k) and paged caches (block tables shuffled,
 *    shared prefix blocks, block sizes 1 to 7 and 16, pools viewed
 *    [blocks, size, Hkv, d] and [blocks, Hkv, size, d], packed or with
 *    padded strides, a table stride above max_blocks), packed queries
 *    (cu_seqlens_q) and [B, Lq, H, d] queries, GQA and MHA;
 *  - each sequence against the double oracle on its own keys, gathered
 *    through the block table (dequantised by view_element): out and
 *    weights within TOL_ATTN, lse within TOL_LSE, fully masked rows and
 *    sequences without keys exactly zero with lse exactly -inf or the
 *    sink; and against a contiguous mha_attention call per sequence
 *    (within TOL_ATTN / TOL_LSE of that call: the chunking differs);
 *  - empty sequences (lq_b = 0, lk_b = 0), a mixed decode, speculative and
 *    prefill batch, every K/V dtype with per (block, slot, head) scales,
 *    the score terms aligned per sequence (window, ALiBi with [B, H] and
 *    broadcast slopes, softcap, sinks, both alignments);
 *  - sentinels: nothing written outside out's view, past the packed
 *    weights or past lse; pool slots no sequence uses hold large values or
 *    NaN, unused table entries hold indices outside the pool;
 *  - bitwise identical results over 1, 2, 3 and 7 threads.
 * Bad input is in the errors suite (test_errors_varlen.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oracle.h"
#include "util.h"

enum { MAXB = 8, SLACK = 37 };

/* One continuous batch. */
typedef struct vcase {
    const char *name;
    int64_t batch, h, hkv, d, dv;
    int32_t lq[MAXB], lk[MAXB];
    int dense_q;         /* cu_seqlens_q NULL: every lq equal */
    int paged;           /* else packed keys (cu_seqlens_k) */
    int64_t block_size;
    int bhsd;            /* pool viewed [blocks, Hkv, block_size, d] */
    int shuffle;         /* blocks in random pool order, spares between */
    int64_t share;       /* first blocks of sequence 0 every sequence uses */
    int64_t table_pad;   /* block_table_stride - max_blocks; 0: stride 0 */
    int tight_table;     /* max_blocks the longest sequence's blocks (else
                            one more) */
    int padded;          /* q, out, k and v with padded strides */
    mha_dtype kt, vt;
    mha_causal causal;
    const mha_score_terms *terms;
    int weights;
    int nan_garbage;     /* unused pool slots NaN (else large values) */
    float scale;
    int scale_explicit;
} vcase;

/* A built case: the call's buffers, and each sequence's keys and values
 * copied out contiguously (codes and scales as stored). */
typedef struct vdata {
    const vcase *c;
    int32_t cu_q[MAXB + 1], cu_k[MAXB + 1];
    int32_t *table;
    int64_t num_blocks;
    mha_paged_kv paged;
    float *q, *out, *w, *lse;
    void *kbuf, *vbuf;
    float *kscales, *vscales;
    size_t out_floats, n_w, n_lse;
    int64_t total_q;
    mha_varlen_args args;
    void *sk[MAXB], *sv[MAXB];
    float *sks[MAXB], *svs[MAXB];
    mha_tensor skv[MAXB], svv[MAXB];
    mha_score_terms seq_terms[MAXB];
} vdata;

static int quantised(mha_dtype t)
{
    return t == MHA_I8 || t == MHA_FP8_E4M3 || t == MHA_FP8_E5M2;
}

static int64_t lq_of(const vcase *c, int64_t b)
{
    return c->dense_q ? c->lq[0] : c->lq[b];
}

/* The storage of sequence b's key j: (pool block or 0, slot or row). */
static void key_at(const vdata *v, int64_t b, int64_t j, int64_t *blk,
                   int64_t *slot)
{
    const vcase *c = v->c;
    if (c->paged) {
        int64_t stride = v->paged.block_table_stride
                             ? v->paged.block_table_stride
                             : v->paged.max_blocks;
        *blk = v->table[b * stride + j / c->block_size];
        *slot = j % c->block_size;
    } else {
        *blk = 0;
        *slot = v->cu_k[b] + j;
    }
}

/* Block tables: sequence 0's blocks first; later sequences start with
 * sequence 0's first `share` blocks. Entries no sequence uses point
 * outside the pool. */
static void make_table(vdata *v, test_rng *r)
{
    const vcase *c = v->c;
    int64_t bs = c->block_size, need = 0, most = 1, nb[MAXB];
    for (int64_t b = 0; b < c->batch; b++) {
        nb[b] = (c->lk[b] + bs - 1) / bs;
        most = nb[b] > most ? nb[b] : most;
        need += nb[b];
    }
    v->num_blocks = need + 3 + c->batch;
    int32_t *ids = test_alloc((size_t)v->num_blocks * sizeof *ids);
    for (int64_t x = 0; x < v->num_blocks; x++)
        ids[x] = (int32_t)x;
    for (int64_t x = v->num_blocks - 1; c->shuffle && x > 0; x--) {
        int64_t y = (int64_t)(rng_next(r) % (uint64_t)(x + 1));
        int32_t t = ids[x];
        ids[x] = ids[y], ids[y] = t;
    }
    int64_t max_blocks = most + !c->tight_table;
    int64_t stride = max_blocks + c->table_pad;
    v->table = test_alloc((size_t)(c->batch * stride) * sizeof *v->table);
    for (int64_t x = 0; x < c->batch * stride; x++)
        v->table[x] = x % 2 ? -1 - (int32_t)x : (int32_t)(v->num_blocks + x);
    int64_t next = 0;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t x = 0; x < nb[b]; x++)
            v->table[b * stride + x] =
                b > 0 && x < c->share && x < nb[0] ? v->table[x]
                                                   : ids[next++];
    free(ids);
    v->paged = (mha_paged_kv){.block_table = v->table,
                              .max_blocks = max_blocks,
                              .block_table_stride = c->table_pad ? stride : 0,
                              .seqlens = c->lk};
}

/* The stored K (or V) of the case: every used slot a draw in [-1, 1),
 * every other element garbage, converted to dt (quantised with a scale
 * per stored row). Returns the view; *buf and *scales are freed by the
 * caller. */
static mha_tensor make_kv(vdata *v, test_rng *r, mha_dtype dt, int64_t dim,
                          void **buf, float **scales)
{
    const vcase *c = v->c;
    mha_tensor f;
    size_t n;
    int64_t blocks, rows;
    if (c->paged && c->padded) {
        test_layout l = c->bhsd ? LAYOUT_PAD_BHSD : LAYOUT_PAD_BSHD;
        blocks = v->num_blocks, rows = c->block_size;
        n = layout_floats(l, blocks, rows, c->hkv, dim);
        f = layout_view(l, test_alloc(n * sizeof(float)), blocks, rows,
                        c->hkv, dim);
    } else if (c->paged) {
        blocks = v->num_blocks, rows = c->block_size;
        n = (size_t)(blocks * rows * c->hkv * dim);
        float *x = test_alloc(n * sizeof *x);
        f = c->bhsd ? mha_tensor_bhsd_typed(x, MHA_F32, blocks, rows, c->hkv,
                                            dim)
                    : mha_tensor_bshd_typed(x, MHA_F32, blocks, rows, c->hkv,
                                            dim);
    } else {
        test_layout l = c->padded ? LAYOUT_PAD_BSHD : LAYOUT_BSHD;
        blocks = 1, rows = v->cu_k[c->batch];
        n = layout_floats(l, 1, rows, c->hkv, dim);
        f = layout_view(l, test_alloc(n * sizeof(float)), 1, rows, c->hkv,
                        dim);
    }
    float *x = f.data;
    for (size_t i = 0; i < n; i++)
        x[i] = c->nan_garbage ? NAN : 64.0f + 16.0f * rng_uniform(r);
    unsigned char *done = test_alloc((size_t)(blocks * rows));
    memset(done, 0, (size_t)(blocks * rows));
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t j = 0; j < c->lk[b]; j++) {
            int64_t blk, slot;
            key_at(v, b, j, &blk, &slot);
            if (done[blk * rows + slot]++)
                continue; /* a shared block: sequence 0 wrote it */
            for (int64_t h = 0; h < c->hkv; h++)
                fill_uniform(r, x + blk * f.stride_batch +
                                    slot * f.stride_seq + h * f.stride_head,
                             (size_t)dim);
        }
    free(done);
    mha_tensor t = f;
    t.dtype = dt;
    *scales = NULL;
    if (dt == MHA_F32) {
        *buf = x;
        return t;
    }
    *buf = test_alloc(n * mha_dtype_size(dt));
    t.data = *buf;
    if (dt == MHA_F16)
        mha_f32_to_f16(x, n, *buf);
    else if (dt == MHA_BF16)
        mha_f32_to_bf16(x, n, *buf);
    else {
        memset(*buf, 0, n);
        *scales = test_alloc((size_t)(blocks * rows * c->hkv) * sizeof(float));
        t.scales = (mha_scales){NULL, rows * c->hkv, c->hkv, 1};
        mha_status st = mha_quantize(&f, &t, *scales);
        ck_assert_msg(st == MHA_OK, "mha_quantize: %s", mha_last_error());
        t.scales.data = *scales;
    }
    free(x);
    return t;
}

/* Sequence b's keys of the stored view t as a contiguous [1, lk_b, Hkv,
 * dim] view of the same dtype (codes and row scales copied). */
static mha_tensor gather_seq(const vdata *v, const mha_tensor *t, int64_t b,
                             void **buf, float **scales)
{
    const vcase *c = v->c;
    int64_t lk = c->lk[b], dim = t->dim;
    size_t es = mha_dtype_size(t->dtype);
    *buf = test_alloc((size_t)(lk * c->hkv * dim) * es);
    *scales = quantised(t->dtype)
                  ? test_alloc((size_t)(lk * c->hkv) * sizeof(float))
                  : NULL;
    for (int64_t j = 0; j < lk; j++) {
        int64_t blk, slot;
        key_at(v, b, j, &blk, &slot);
        for (int64_t h = 0; h < c->hkv; h++) {
            int64_t at = blk * t->stride_batch + slot * t->stride_seq +
                         h * t->stride_head;
            memcpy((char *)*buf + (size_t)((j * c->hkv + h) * dim) * es,
                   (const char *)t->data + (size_t)at * es,
                   (size_t)dim * es);
            if (*scales)
                (*scales)[j * c->hkv + h] = (float)view_scale(t, blk, slot, h);
        }
    }
    mha_tensor s = mha_tensor_bshd_typed(*buf, t->dtype, 1, lk, c->hkv, dim);
    if (*scales)
        s.scales = (mha_scales){*scales, lk * c->hkv, c->hkv, 1};
    return s;
}

static void build(vdata *v, const vcase *c, uint64_t seed)
{
    test_rng r;
    rng_seed(&r, seed);
    memset(v, 0, sizeof *v);
    v->c = c;
    for (int64_t b = 0; b < c->batch; b++) {
        v->cu_q[b + 1] = v->cu_q[b] + (int32_t)lq_of(c, b);
        v->cu_k[b + 1] = v->cu_k[b] + c->lk[b];
    }
    v->total_q = v->cu_q[c->batch];
    if (c->paged)
        make_table(v, &r);
    test_layout l = c->padded ? LAYOUT_PAD_BSHD : LAYOUT_BSHD;
    int64_t qb = c->dense_q ? c->batch : 1;
    int64_t qs = c->dense_q ? c->lq[0] : v->total_q;
    size_t nq = layout_floats(l, qb, qs, c->h, c->d);
    v->q = random_floats(&r, nq);
    size_t no = layout_floats(l, qb, qs, c->h, c->dv);
    v->out_floats = no + 2 * SLACK;
    v->out = test_alloc(v->out_floats * sizeof(float));
    v->n_lse = (size_t)(c->h * qb * qs);
    v->lse = test_alloc((v->n_lse + SLACK) * sizeof(float));
    for (int64_t b = 0; b < c->batch; b++)
        v->n_w += (size_t)(c->h * lq_of(c, b) * c->lk[b]);
    v->w = c->weights ? test_alloc((v->n_w + SLACK) * sizeof(float)) : NULL;
    mha_varlen_args *a = &v->args;
    a->batch = c->batch;
    a->q = layout_view(l, v->q, qb, qs, c->h, c->d);
    a->out = layout_view(l, v->out + SLACK, qb, qs, c->h, c->dv);
    a->cu_seqlens_q = c->dense_q ? NULL : v->cu_q;
    a->k = make_kv(v, &r, c->kt, c->d, &v->kbuf, &v->kscales);
    a->v = make_kv(v, &r, c->vt, c->dv, &v->vbuf, &v->vscales);
    a->cu_seqlens_k = c->paged ? NULL : v->cu_k;
    a->paged = c->paged ? &v->paged : NULL;
    a->causal = c->causal;
    a->terms = c->terms;
    a->scale = c->scale;
    a->scale_explicit = c->scale_explicit;
    a->weights = v->w;
    a->lse = v->lse;
    for (int64_t b = 0; b < c->batch; b++) {
        v->skv[b] = gather_seq(v, &a->k, b, &v->sk[b], &v->sks[b]);
        v->svv[b] = gather_seq(v, &a->v, b, &v->sv[b], &v->svs[b]);
        if (c->terms) {
            /* Sequence b's row of the [B, H] slopes. */
            mha_score_terms t = *c->terms;
            if (t.alibi_slopes)
                t.alibi_slopes += b * t.alibi_stride_batch;
            t.alibi_stride_batch = 0;
            /* Per-sequence positions become the call's scalars. */
            if (t.key_offsets)
                t.key_offset = t.key_offsets[b], t.key_offsets = NULL;
            if (t.key_totals)
                t.key_total = t.key_totals[b], t.key_totals = NULL;
            v->seq_terms[b] = t;
        }
    }
}

static void release(vdata *v)
{
    free(v->table), free(v->q), free(v->out), free(v->w), free(v->lse);
    free(v->kbuf), free(v->vbuf), free(v->kscales), free(v->vscales);
    for (int64_t b = 0; b < v->c->batch; b++)
        free(v->sk[b]), free(v->sv[b]), free(v->sks[b]), free(v->svs[b]);
}

/* Sequence b's rows of q or out. */
static mha_tensor seq_rows(const vdata *v, const mha_tensor *t, int64_t b)
{
    mha_tensor s = *t;
    int64_t at = v->c->dense_q ? b * t->stride_batch
                               : v->cu_q[b] * t->stride_seq;
    s.data = (float *)t->data + at;
    s.batch = 1;
    s.seq = lq_of(v->c, b);
    return s;
}

/* Element (b, h, i) of the lse output. */
static size_t lse_at(const vdata *v, int64_t b, int64_t h, int64_t i)
{
    const vcase *c = v->c;
    if (c->dense_q)
        return (size_t)((b * c->h + h) * c->lq[0] + i);
    return (size_t)(h * v->total_q + v->cu_q[b] + i);
}

/* Sequence b as one mha_attention call on its own contiguous keys. */
static mha_attention_args seq_call(const vdata *v, int64_t b,
                                   const mha_mask *mask)
{
    const vcase *c = v->c;
    mha_attention_args a = {
        .q = seq_rows(v, &v->args.q, b),
        .k = v->skv[b],
        .v = v->svv[b],
        .mask = mask,
        .terms = c->terms ? &v->seq_terms[b] : NULL,
        .scale = c->scale,
        .scale_explicit = c->scale_explicit,
    };
    return a;
}

/* The expected outputs: out of every sequence one after another ([lq_b,
 * H, dv] each), weights in the call's packed layout, lse in its layout. */
typedef struct expected {
    double *out, *w, *lse;
    size_t n_out;
} expected;

static void oracle_all(const vdata *v, expected *e)
{
    const vcase *c = v->c;
    e->n_out = 0;
    for (int64_t b = 0; b < c->batch; b++)
        e->n_out += (size_t)(lq_of(c, b) * c->h * c->dv);
    e->out = test_alloc(e->n_out * sizeof(double));
    e->w = test_alloc((v->n_w + 1) * sizeof(double));
    e->lse = test_alloc(v->n_lse * sizeof(double));
    mha_mask mask = {.causal = c->causal};
    size_t o = 0, w = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        int64_t lq = lq_of(c, b);
        mha_attention_args a = seq_call(v, b, &mask);
        double *lse = test_alloc((size_t)(c->h * lq + 1) * sizeof(double));
        oracle_attention_lse(&a, e->out + o, e->w + w, lse);
        for (int64_t h = 0; h < c->h; h++)
            for (int64_t i = 0; i < lq; i++)
                e->lse[lse_at(v, b, h, i)] = lse[h * lq + i];
        free(lse);
        o += (size_t)(lq * c->h * c->dv);
        w += (size_t)(c->h * lq * c->lk[b]);
    }
}

/* out of every sequence one after another, as oracle_all orders it. */
static void gather_out(const vdata *v, float *got)
{
    size_t o = 0;
    for (int64_t b = 0; b < v->c->batch; b++) {
        mha_tensor s = seq_rows(v, &v->args.out, b);
        view_gather(&s, got + o);
        o += (size_t)(s.seq * s.heads * s.dim);
    }
}

static void fill_outputs(vdata *v)
{
    fill_sentinel(v->out, v->out_floats);
    fill_sentinel(v->lse, v->n_lse + SLACK);
    if (v->w)
        fill_sentinel(v->w, v->n_w + SLACK);
}

/* One run's outputs against the oracle's. */
static void check_run(const vdata *v, const expected *e, float *got,
                      const char *what, const char *isa)
{
    const vcase *c = v->c;
    gather_out(v, got);
    size_t worst;
    double r = tol_ratio(got, e->out, e->n_out, TOL_ATTN_ABS, TOL_ATTN_REL,
                         &worst);
    ck_assert_msg(r <= 1.0, "%s [%s]: out[%zu] (sequences in order, [lq, H, "
                  "dv] each) = %.9g, want %.9g (ratio %.3g)", what, isa,
                  worst, (double)got[worst], e->out[worst], r);
    ck_assert_msg(count_changed_outside(v->out, v->out_floats,
                                        &v->args.out) == 0,
                  "%s [%s]: wrote outside the out view", what, isa);
    ck_assert_msg(count_changed(v->lse + v->n_lse, SLACK) == 0,
                  "%s [%s]: wrote past lse", what, isa);
    check_lse(v->lse, e->lse, v->n_lse, what, isa);
    size_t o = 0, w = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        int64_t lq = lq_of(c, b), lk = c->lk[b];
        for (int64_t h = 0; h < c->h; h++)
            for (int64_t i = 0; i < lq; i++) {
                const double *wr = e->w + w + (size_t)((h * lq + i) * lk);
                int visible = 0;
                for (int64_t j = 0; j < lk && !visible; j++)
                    visible = wr[j] != 0.0;
                const float *row = got + o + (size_t)((i * c->h + h) * c->dv);
                for (int64_t x = 0; x < c->dv && !visible; x++)
                    REQUIRE(row[x] == 0.0f, "%s [%s]: sequence %lld row %lld "
                            "head %lld sees no key, out = %g", what, isa,
                            (long long)b, (long long)i, (long long)h,
                            (double)row[x]);
                /* No key: lse is the sink or -inf, exactly. */
                size_t at = lse_at(v, b, h, i);
                if (lk == 0)
                    REQUIRE(v->lse[at] == (float)e->lse[at], "%s [%s]: "
                            "sequence %lld without keys: lse %g, want %g",
                            what, isa, (long long)b, (double)v->lse[at],
                            e->lse[at]);
            }
        if (v->w && lq > 0 && lk > 0)
            check_weights(v->w + w, e->w + w, c->h * lq, lk, TOL_ATTN_ABS,
                          TOL_ATTN_REL, what, isa);
        o += (size_t)(lq * c->h * c->dv);
        w += (size_t)(c->h * lq * lk);
    }
    if (v->w)
        ck_assert_msg(count_changed(v->w + v->n_w, SLACK) == 0,
                      "%s [%s]: wrote past the packed weights", what, isa);
}

/* Each sequence with queries and keys as its own mha_attention call
 * (contiguous keys, bottom-right or top-left causal as the batch's): out
 * and lse within TOL_ATTN / TOL_LSE of that call's. */
static void check_per_sequence(const vdata *v, mha_engine *e, const float *got,
                               const char *what, const char *isa)
{
    const vcase *c = v->c;
    mha_mask mask = {.causal = c->causal};
    size_t o = 0;
    for (int64_t b = 0; b < c->batch; b++) {
        int64_t lq = lq_of(c, b);
        size_t n = (size_t)(lq * c->h * c->dv);
        if (lq == 0 || c->lk[b] == 0) {
            o += n; /* not an mha_attention shape */
            continue;
        }
        mha_attention_args a = seq_call(v, b, &mask);
        float *out = test_alloc(n * sizeof *out);
        float *lse = test_alloc((size_t)(c->h * lq) * sizeof *lse);
        a.out = mha_tensor_bshd(out, 1, lq, c->h, c->dv);
        a.lse = lse;
        mha_status st = mha_attention(e, &a);
        ck_assert_msg(st == MHA_OK, "%s [%s]: sequence %lld alone: %s", what,
                      isa, (long long)b, mha_last_error());
        for (size_t x = 0; x < n; x++)
            REQUIRE(fabsf(got[o + x] - out[x]) <=
                        TOL_ATTN_ABS + TOL_ATTN_REL * fabsf(out[x]),
                    "%s [%s]: sequence %lld out[%zu] = %.9g, alone %.9g",
                    what, isa, (long long)b, x, (double)got[o + x],
                    (double)out[x]);
        for (int64_t h = 0; h < c->h; h++)
            for (int64_t i = 0; i < lq; i++) {
                float g = v->lse[lse_at(v, b, h, i)], want = lse[h * lq + i];
                REQUIRE(g == want || fabsf(g - want) <=
                            TOL_LSE_ABS + TOL_LSE_REL * fabsf(want),
                        "%s [%s]: sequence %lld lse h %lld i %lld = %.9g, "
                        "alone %.9g", what, isa, (long long)b, (long long)h,
                        (long long)i, (double)g, (double)want);
            }
        free(out), free(lse);
        o += n;
    }
}

/* Runs the case on every available ISA against the oracle and the
 * per-sequence calls. */
static void run_case(const vcase *c, uint64_t seed)
{
    vdata v;
    build(&v, c, seed);
    expected e;
    oracle_all(&v, &e);
    float *got = test_alloc((e.n_out + 1) * sizeof *got);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int x = 0; x < n_isa; x++) {
        const char *isa = mha_isa_name(isas[x]);
        mha_engine *en = make_engine(isas[x], 2);
        fill_outputs(&v);
        mha_status st = mha_attention_varlen(en, &v.args);
        ck_assert_msg(st == MHA_OK, "%s [%s]: %s (%s)", c->name, isa,
                      mha_status_string(st), mha_last_error());
        check_run(&v, &e, got, c->name, isa);
        check_per_sequence(&v, en, got, c->name, isa);
        mha_engine_destroy(en);
    }
    free(got), free(e.out), free(e.w), free(e.lse);
    release(&v);
}

/* ---- Block tables, packed and dense forms ---------------------------- */

#define GQA .h = 8, .hkv = 2
static const vcase LAYOUTS[] = {
    {.name = "paged, block 16, shuffled, decode of 4", .batch = 4, GQA,
     .d = 32, .dv = 32, .lq = {1}, .lk = {300, 17, 64, 1}, .dense_q = 1,
     .paged = 1, .block_size = 16, .shuffle = 1,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT},
    {.name = "paged, block 3, bhsd pool, table stride max_blocks + 5",
     .batch = 3, GQA, .d = 16, .dv = 16, .lq = {3, 1, 7}, .lk = {50, 9, 31},
     .paged = 1, .block_size = 3, .bhsd = 1, .shuffle = 1, .table_pad = 5,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
    {.name = "paged, one block per sequence, max_blocks 1", .batch = 3,
     GQA, .d = 16, .dv = 16, .lq = {1}, .lk = {16, 9, 1}, .dense_q = 1,
     .paged = 1, .block_size = 16, .shuffle = 1, .tight_table = 1,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT},
    {.name = "paged, block 1", .batch = 2, GQA, .d = 16, .dv = 16,
     .lq = {2, 1}, .lk = {20, 7}, .paged = 1, .block_size = 1, .shuffle = 1,
     .weights = 1},
    {.name = "paged, block 5, 3 prefix blocks shared", .batch = 3, GQA,
     .d = 32, .dv = 32, .lq = {1}, .lk = {40, 23, 16}, .dense_q = 1,
     .paged = 1, .block_size = 5, .shuffle = 1, .share = 3,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT},
    {.name = "paged, block 16, bhsd, shared prefix, stride + 2", .batch = 3,
     GQA, .d = 32, .dv = 32, .lq = {16, 5, 1}, .lk = {70, 48, 33},
     .paged = 1, .block_size = 16, .bhsd = 1, .shuffle = 1, .share = 2,
     .table_pad = 2, .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
    {.name = "paged, block 7, MHA, dv != d, in order", .batch = 2, .h = 4,
     .hkv = 4, .d = 24, .dv = 16, .lq = {9, 1}, .lk = {45, 60}, .paged = 1,
     .block_size = 7, .causal = MHA_CAUSAL_TOP_LEFT, .weights = 1},
    {.name = "paged, block 6, padded bhsd pool, padded q and out",
     .batch = 3, GQA, .d = 16, .dv = 24, .lq = {2, 9, 1}, .lk = {13, 30, 6},
     .paged = 1, .block_size = 6, .bhsd = 1, .shuffle = 1, .padded = 1,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
    {.name = "paged, block 4, padded bshd pool", .batch = 2, GQA, .d = 16,
     .dv = 16, .lq = {1}, .lk = {29, 8}, .dense_q = 1, .paged = 1,
     .block_size = 4, .padded = 1, .table_pad = 1},
    {.name = "paged, block 16, split-KV decode", .batch = 2, .h = 2,
     .hkv = 1, .d = 32, .dv = 32, .lq = {1}, .lk = {1500, 700}, .dense_q = 1,
     .paged = 1, .block_size = 16, .shuffle = 1},
    {.name = "packed q and k, GQA, padded strides", .batch = 3, GQA, .d = 32,
     .dv = 16, .lq = {5, 1, 33}, .lk = {40, 90, 33}, .padded = 1,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
    {.name = "packed k, [B, 1, H, d] queries", .batch = 5, GQA, .d = 32,
     .dv = 32, .lq = {1}, .lk = {10, 300, 1, 77, 129}, .dense_q = 1,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT},
    {.name = "packed, MHA, top-left causal, explicit scale", .batch = 2,
     .h = 4, .hkv = 4, .d = 16, .dv = 16, .lq = {12, 30}, .lk = {12, 50},
     .causal = MHA_CAUSAL_TOP_LEFT, .weights = 1, .scale = 0.3f,
     .scale_explicit = 1},
    {.name = "packed k, [B, 3, H, d] queries, padded", .batch = 2, GQA,
     .d = 16, .dv = 16, .lq = {3}, .lk = {3, 40}, .dense_q = 1, .padded = 1,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
};
#define N_LAYOUTS ((int)(sizeof LAYOUTS / sizeof LAYOUTS[0]))

START_TEST(layouts)
{
    run_case(&LAYOUTS[_i], 100 + (uint64_t)_i);
}
END_TEST

/* ---- Empty sequences ------------------------------------------------- */

static const float SINKS[8] = {0.5f, -1.0f, 2.0f, 0.0f,
                               3.0f, -0.25f, 1.5f, 7.0f};
static const mha_score_terms SINK_TERMS = {.sinks = SINKS};

static const vcase EMPTY[] = {
    {.name = "paged, lq 0 and lk 0 between others", .batch = 5, GQA,
     .d = 16, .dv = 16, .lq = {0, 3, 0, 2, 0}, .lk = {10, 0, 5, 33, 0},
     .paged = 1, .block_size = 4, .shuffle = 1,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
    {.name = "packed, lq 0 and lk 0, sinks", .batch = 4, GQA, .d = 16,
     .dv = 8, .lq = {2, 0, 3, 4}, .lk = {0, 4, 20, 0},
     .causal = MHA_CAUSAL_BOTTOM_RIGHT, .terms = &SINK_TERMS, .weights = 1},
    {.name = "paged, [B, 1, H, d] queries, lk 0, sinks", .batch = 3, GQA,
     .d = 16, .dv = 16, .lq = {1}, .lk = {0, 5, 0}, .dense_q = 1, .paged = 1,
     .block_size = 16, .terms = &SINK_TERMS},
    {.name = "paged, [B, 2, H, d] queries, lk 0", .batch = 3, GQA, .d = 16,
     .dv = 16, .lq = {2}, .lk = {0, 5, 0}, .dense_q = 1, .paged = 1,
     .block_size = 2, .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
    {.name = "packed, first and last sequences empty", .batch = 4, .h = 2,
     .hkv = 2, .d = 16, .dv = 16, .lq = {0, 6, 1, 0}, .lk = {3, 6, 0, 9},
     .causal = MHA_CAUSAL_TOP_LEFT, .weights = 1},
    {.name = "paged, no sequence has keys, sinks", .batch = 2, GQA, .d = 16,
     .dv = 16, .lq = {3, 1}, .lk = {0, 0}, .paged = 1, .block_size = 4,
     .causal = MHA_CAUSAL_BOTTOM_RIGHT, .terms = &SINK_TERMS, .weights = 1},
};
#define N_EMPTY ((int)(sizeof EMPTY / sizeof EMPTY[0]))

START_TEST(empty_sequences)
{
    run_case(&EMPTY[_i], 200 + (uint64_t)_i);
}
END_TEST

/* ---- A mixed batch ---------------------------------------------------- */

/* A decode row, a speculative step (4 over 300), a whole prompt (100 over
 * 100) and a prefill chunk (37 over 250), bottom-right per sequence. */
#define MIXED .batch = 4, GQA, .d = 32, .dv = 32, .lq = {1, 4, 100, 37}, \
    .lk = {517, 300, 100, 250}, .causal = MHA_CAUSAL_BOTTOM_RIGHT
static const vcase MIXED_CASES[] = {
    {.name = "mixed batch, paged block 16", MIXED, .paged = 1,
     .block_size = 16, .shuffle = 1, .weights = 1},
    {.name = "mixed batch, paged block 5, bhsd, no weights", MIXED,
     .paged = 1, .block_size = 5, .bhsd = 1, .shuffle = 1},
    {.name = "mixed batch, packed, fp16 K/V", MIXED, .kt = MHA_F16,
     .vt = MHA_F16, .weights = 1},
};
#define N_MIXED ((int)(sizeof MIXED_CASES / sizeof MIXED_CASES[0]))

START_TEST(mixed_batch)
{
    run_case(&MIXED_CASES[_i], 300 + (uint64_t)_i);
}
END_TEST

/* ---- Every K/V dtype -------------------------------------------------- */

static const mha_dtype DTYPES[6] = {MHA_F32, MHA_F16, MHA_BF16,
                                    MHA_I8, MHA_FP8_E4M3, MHA_FP8_E5M2};

/* _i / 2: the dtype (then two mixed pairs); _i % 2: a paged pool whose
 * unused slots are NaN, or packed keys with padded strides. */
START_TEST(every_dtype)
{
    mha_dtype kt, vt;
    int t = _i / 2;
    if (t < 6)
        kt = vt = DTYPES[t];
    else if (t == 6)
        kt = MHA_I8, vt = MHA_FP8_E5M2;
    else
        kt = MHA_BF16, vt = MHA_FP8_E4M3;
    vcase c = {.batch = 4, GQA, .d = 64, .dv = 32, .lq = {1, 4, 20, 0},
               .lk = {600, 60, 20, 7}, .causal = MHA_CAUSAL_BOTTOM_RIGHT,
               .kt = kt, .vt = vt, .weights = 1};
    if (_i % 2 == 0)
        c.paged = 1, c.block_size = 16, c.bhsd = t % 2, c.shuffle = 1,
        c.nan_garbage = 1, c.share = 1, c.padded = t >= 6;
    else
        c.padded = 1;
    char name[128];
    snprintf(name, sizeof name, "K %s V %s, %s", mha_dtype_name(kt),
             mha_dtype_name(vt),
             c.paged ? "paged (NaN in unused slots)" : "packed, padded");
    c.name = name;
    run_case(&c, 400 + (uint64_t)_i);
}
END_TEST

/* ---- Score terms ------------------------------------------------------ */

static const float SLOPES[3 * 8] = {
    0.5f,  0.25f, 0.125f, 0.0625f, 0.03f, 1.0f,  0.0f,  2.0f,
    0.1f,  0.2f,  0.3f,   0.4f,    0.5f,  0.6f,  0.7f,  0.8f,
    1.5f,  0.01f, 0.02f,  0.04f,   0.08f, 0.16f, 0.32f, 0.64f};

/* Each sequence's keys as a shard of its own longer sequence (lengths
 * 90, 30, 41 below): a total of 0 is offset + keys. */
static const int64_t KEY_OFFSETS[3] = {100, 0, 7};
static const int64_t KEY_TOTALS[3] = {300, 0, 60};

static const mha_score_terms TERMS[] = {
    {.window = 1, .window_left = 8, .window_right = 0},
    {.window = 1, .window_left = -1, .window_right = 3,
     .align = MHA_ALIGN_TOP_LEFT},
    {.window = 1, .window_left = 5, .window_right = 2},
    {.alibi_slopes = SLOPES, .alibi_stride_batch = 8},
    {.alibi_slopes = SLOPES, .alibi_stride_batch = 8,
     .align = MHA_ALIGN_TOP_LEFT},
    {.alibi_slopes = SLOPES + 8},
    {.softcap = 2.0f},
    {.sinks = SINKS},
    {.window = 1, .window_left = 16, .window_right = 1, .softcap = 5.0f,
     .alibi_slopes = SLOPES, .alibi_stride_batch = 8, .sinks = SINKS},
    {.key_offsets = KEY_OFFSETS, .key_totals = KEY_TOTALS, .window = 1,
     .window_left = 20, .window_right = 0},
    {.key_offsets = KEY_OFFSETS, .alibi_slopes = SLOPES,
     .alibi_stride_batch = 8, .sinks = SINKS},
};
#define N_TERMS ((int)(sizeof TERMS / sizeof TERMS[0]))

/* _i / 2: the terms; _i % 2: paged (block 5) or packed keys. Sequence
 * lengths differ so per-sequence alignment shows. */
START_TEST(score_terms)
{
    const mha_score_terms *t = &TERMS[_i / 2];
    vcase c = {.batch = 3, GQA, .d = 16, .dv = 16, .lq = {4, 30, 1},
               .lk = {90, 30, 41}, .terms = t, .weights = 1,
               .causal = _i / 2 % 3 == 0 ? MHA_CAUSAL_NONE
                                         : MHA_CAUSAL_BOTTOM_RIGHT};
    if (_i % 2 == 0)
        c.paged = 1, c.block_size = 5, c.shuffle = 1;
    char name[160];
    snprintf(name, sizeof name, "terms %d (window %d [%lld, %lld] align %d "
             "softcap %g alibi %d sinks %d positions %d) causal %d, %s",
             _i / 2,
             t->window, (long long)t->window_left,
             (long long)t->window_right, (int)t->align, (double)t->softcap,
             t->alibi_slopes != NULL, t->sinks != NULL,
             t->key_offsets != NULL, (int)c.causal,
             c.paged ? "paged" : "packed");
    c.name = name;
    run_case(&c, 500 + (uint64_t)_i);
}
END_TEST

/* ---- Determinism ------------------------------------------------------ */

/* Bitwise the same out, lse (and weights) on 1, 2, 3 and 7 threads, per
 * ISA; the lengths put split-KV decode rows next to prefill rows. */
START_TEST(deterministic_over_threads)
{
    static const int THREADS[4] = {1, 2, 3, 7};
    vcase c = {.name = "determinism", .batch = 5, GQA, .d = 32, .dv = 32,
               .lq = {1, 4, 0, 70, 1}, .lk = {1300, 300, 5, 90, 2100},
               .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = _i >= 2};
    if (_i % 2 == 0)
        c.paged = 1, c.block_size = 16, c.shuffle = 1, c.share = 2;
    vdata v;
    build(&v, &c, 600 + (uint64_t)_i);
    size_t no = v.out_floats * sizeof(float);
    size_t nl = v.n_lse * sizeof(float), nw = v.n_w * sizeof(float);
    float *out1 = test_alloc(no), *lse1 = test_alloc(nl);
    float *w1 = test_alloc(nw + 1);
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int x = 0; x < n_isa; x++)
        for (int t = 0; t < 4; t++) {
            mha_engine *e = make_engine(isas[x], THREADS[t]);
            fill_outputs(&v);
            ck_assert_msg(mha_attention_varlen(e, &v.args) == MHA_OK,
                          "%s", mha_last_error());
            if (t == 0) {
                memcpy(out1, v.out, no), memcpy(lse1, v.lse, nl);
                if (v.w)
                    memcpy(w1, v.w, nw);
            } else {
                const char *isa = mha_isa_name(isas[x]);
                ck_assert_msg(memcmp(out1, v.out, no) == 0, "[%s] %s: out "
                              "on %d threads differs from 1", isa,
                              c.paged ? "paged" : "packed", THREADS[t]);
                ck_assert_msg(memcmp(lse1, v.lse, nl) == 0, "[%s] %s: lse "
                              "on %d threads differs from 1", isa,
                              c.paged ? "paged" : "packed", THREADS[t]);
                ck_assert_msg(!v.w || memcmp(w1, v.w, nw) == 0, "[%s] %s: "
                              "weights on %d threads differ from 1", isa,
                              c.paged ? "paged" : "packed", THREADS[t]);
            }
            mha_engine_destroy(e);
        }
    free(out1), free(lse1), free(w1);
    release(&v);
}
END_TEST

Suite *suite_varlen(void)
{
    Suite *s = suite_create("varlen");
    TCase *tc = tcase_create("varlen");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, layouts, 0, N_LAYOUTS);
    tcase_add_loop_test(tc, empty_sequences, 0, N_EMPTY);
    tcase_add_loop_test(tc, mixed_batch, 0, N_MIXED);
    tcase_add_loop_test(tc, every_dtype, 0, 16);
    tcase_add_loop_test(tc, score_terms, 0, 2 * N_TERMS);
    tcase_add_loop_test(tc, deterministic_over_threads, 0, 4);
    suite_add_tcase(s, tc);
    return s;
}
