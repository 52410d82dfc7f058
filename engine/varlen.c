/* mha_attention_varlen: a continuous batch of sequences of their own
 * lengths, keys packed or in a paged cache. Validation reads every index
 * array (cu_seqlens, the lengths and the block table entries a sequence
 * uses) before anything is written; the attention then runs on the same
 * plan and streams as mha_attention, one sequence table entry per
 * sequence. docs/design.md, "Continuous batches". */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

/* cu[0] == 0, non-decreasing, cu[batch] == total. */
static mha_status check_cu(const int32_t *cu, const char *name,
                           int64_t batch, int64_t total, const char *tname)
{
    if (cu[0] != 0)
        return mha_fail(MHA_ERR_BAD_SHAPE, "%s[0] (%d) is not 0", name,
                        (int)cu[0]);
    for (int64_t b = 0; b < batch; b++)
        if (cu[b + 1] < cu[b])
            return mha_fail(MHA_ERR_BAD_SHAPE,
                            "%s[%lld] (%d) is less than %s[%lld] (%d)", name,
                            (long long)(b + 1), (int)cu[b + 1], name,
                            (long long)b, (int)cu[b]);
    if (cu[batch] != total)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "%s[%lld] (%d) differs from %s (%lld)", name,
                        (long long)batch, (int)cu[batch], tname,
                        (long long)total);
    return MHA_OK;
}

/* The block table and lengths of a paged cache whose pool has `blocks`
 * blocks of `size` keys. */
static mha_status check_paged(const mha_paged_kv *pg, int64_t batch,
                              int64_t blocks, int64_t size,
                              int64_t *stride)
{
    if (!pg->block_table || !pg->seqlens)
        return mha_fail(MHA_ERR_NULL_POINTER, "paged.%s is NULL",
                        !pg->block_table ? "block_table" : "seqlens");
    if (pg->max_blocks < 1)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "paged.max_blocks (%lld) must be positive",
                        (long long)pg->max_blocks);
    *stride = pg->block_table_stride ? pg->block_table_stride
                                     : pg->max_blocks;
    if (*stride < pg->max_blocks)
        return mha_fail(MHA_ERR_BAD_STRIDE,
                        "paged.block_table_stride (%lld) is below "
                        "paged.max_blocks (%lld)",
                        (long long)pg->block_table_stride,
                        (long long)pg->max_blocks);
    int64_t most, last;
    if (!mha_mul_ok(pg->max_blocks, size, &most))
        most = INT64_MAX;
    if (!mha_mul_ok(batch - 1, *stride, &last) ||
        !mha_add_ok(last, pg->max_blocks, &last) ||
        (uint64_t)last > SIZE_MAX / sizeof(int32_t) -
                             (uintptr_t)pg->block_table / sizeof(int32_t))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "paged.block_table spans more bytes than fit in "
                        "64 bits");
    for (int64_t b = 0; b < batch; b++) {
        int32_t len = pg->seqlens[b];
        if (len < 0 || len > most)
            return mha_fail(MHA_ERR_BAD_SHAPE,
                            "paged.seqlens[%lld] (%d) is outside [0, "
                            "max_blocks * block_size = %lld]",
                            (long long)b, (int)len, (long long)most);
        const int32_t *row = pg->block_table + b * *stride;
        for (int64_t x = 0; x < (len + size - 1) / size; x++)
            if (row[x] < 0 || row[x] >= blocks)
                return mha_fail(MHA_ERR_BAD_ARGUMENT,
                                "paged.block_table[%lld][%lld] (%d) is "
                                "outside the pool of %lld blocks (k.batch)",
                                (long long)b, (long long)x, (int)row[x],
                                (long long)blocks);
    }
    return MHA_OK;
}

/* Every scale a paged call reads (the blocks its sequences use) is finite
 * and nonzero, as mha_check_tensor requires of a dense tensor's. */
static mha_status check_used_scales(const mha_tensor *t, const char *name,
                                    const mha_paged_kv *pg, int64_t batch,
                                    int64_t stride)
{
    const mha_scales *sc = &t->scales;
    if (!sc->data)
        return MHA_OK;
    int64_t size = t->seq, heads = sc->stride_head ? t->heads : 1;
    int ok = 1;
    for (int64_t b = 0; b < batch && ok; b++)
        for (int64_t j = 0; j < pg->seqlens[b] && ok; j += size) {
            /* A block's rows in use at once (validate.c's scan). */
            int64_t blk = pg->block_table[b * stride + j / size];
            int64_t rows = pg->seqlens[b] - j < size ? pg->seqlens[b] - j
                                                      : size;
            const int64_t n[3] = {1, sc->stride_seq ? rows : 1, heads};
            const int64_t st[3] = {0, sc->stride_seq, sc->stride_head};
            ok = mha_scales_ok(sc->data + blk * sc->stride_batch, n, st);
        }
    if (ok)
        return MHA_OK;
    /* A bad scale: found again in order, for the message. */
    for (int64_t b = 0; b < batch; b++)
        for (int64_t j = 0; j < pg->seqlens[b]; j++) {
            int64_t blk = pg->block_table[b * stride + j / size];
            for (int64_t h = 0; h < heads; h++) {
                float x = sc->data[blk * sc->stride_batch +
                                   j % size * sc->stride_seq +
                                   h * sc->stride_head];
                if (!isfinite(x) || x == 0.0f)
                    return mha_fail(MHA_ERR_BAD_ARGUMENT,
                                    "%s.scales[block=%lld, slot=%lld, "
                                    "h=%lld] (%g) is not a finite nonzero "
                                    "number",
                                    name, (long long)blk,
                                    (long long)(j % size), (long long)h,
                                    (double)x);
            }
        }
    return MHA_OK;
}


/* Shapes of q, k, v, out against each other and the sequences. */
static mha_status check_shapes(const mha_varlen_args *a)
{
    const mha_tensor *q = &a->q, *k = &a->k, *v = &a->v, *out = &a->out;
    MHA_SAME(out, batch, q, batch)
    MHA_SAME(out, seq, q, seq)
    MHA_SAME(out, heads, q, heads)
    MHA_SAME(out, dim, v, dim)
    MHA_SAME(k, dim, q, dim)
    MHA_SAME(v, heads, k, heads)
    MHA_SAME(v, batch, k, batch)
    MHA_SAME(v, seq, k, seq)
    if (q->heads % k->heads != 0)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "k.heads (%lld) does not divide q.heads (%lld)",
                        (long long)k->heads, (long long)q->heads);
    if (a->cu_seqlens_q ? q->batch != 1 : q->batch != a->batch)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "q.batch (%lld) must be %s", (long long)q->batch,
                        a->cu_seqlens_q ? "1 with cu_seqlens_q"
                                        : "batch without cu_seqlens_q");
    if (a->cu_seqlens_k && k->batch != 1)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "k.batch (%lld) must be 1 with cu_seqlens_k",
                        (long long)k->batch);
    return MHA_OK;
}

/* The byte range of an int32 array of n elements. */
static mha_span ints(const int32_t *x, int64_t n)
{
    mha_span r = {(uintptr_t)x, (uintptr_t)x + (uintptr_t)n * sizeof *x};
    if (!x)
        r.hi = r.lo;
    return r;
}

/* No output may overlap the index arrays the call reads. */
static mha_status check_index_overlap(const mha_varlen_args *a,
                                      int64_t bt_stride, int64_t lse_floats,
                                      int64_t weights_floats)
{
    const mha_paged_kv *pg = a->paged;
    int64_t B = a->batch;
    mha_span in[4] = {ints(a->cu_seqlens_q, B + 1),
                      ints(a->cu_seqlens_k, B + 1),
                      pg ? ints(pg->block_table,
                                (B - 1) * bt_stride + pg->max_blocks)
                         : ints(NULL, 0),
                      pg ? ints(pg->seqlens, B) : ints(NULL, 0)};
    const char *in_name[4] = {"cu_seqlens_q", "cu_seqlens_k",
                              "paged.block_table", "paged.seqlens"};
    mha_span ro;
    mha_check_tensor(&a->out, "out", 0, 0, &ro);
    mha_span outs[3] = {
        ro,
        {(uintptr_t)a->weights,
         (uintptr_t)a->weights + (uintptr_t)weights_floats * sizeof(float)},
        {(uintptr_t)a->lse,
         (uintptr_t)a->lse + (uintptr_t)lse_floats * sizeof(float)}};
    const char *out_name[3] = {"out", "weights", "lse"};
    for (int o = 0; o < 3; o++)
        for (int i = 0; i < 4; i++)
            if (outs[o].lo != 0 && mha_spans_overlap(outs[o], in[i]))
                return mha_fail(MHA_ERR_BAD_STRIDE, "%s overlaps %s",
                                out_name[o], in_name[i]);
    return MHA_OK;
}

/* Sequence b's keys: its cu_seqlens_k span, or its paged length (the
 * arrays checked before any caller asks). */
static int64_t seq_keys(const mha_varlen_args *a, int64_t b)
{
    return a->cu_seqlens_k ? a->cu_seqlens_k[b + 1] - a->cu_seqlens_k[b]
                           : a->paged->seqlens[b];
}

static mha_status validate_varlen(const mha_varlen_args *a, mha_problem *p)
{
    /* IEEE whatever flush_subnormals, as mha_validate_attention. */
    MHA_FPENV_SCOPE(0);
    if (!a)
        return mha_fail(MHA_ERR_NULL_POINTER, "args is NULL");
    if (a->batch < 1)
        return mha_fail(MHA_ERR_BAD_SHAPE, "batch (%lld) must be positive",
                        (long long)a->batch);
    if (!a->cu_seqlens_k == !a->paged)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "give exactly one of cu_seqlens_k (packed keys) and "
                        "paged (a paged cache); %s",
                        a->paged ? "both are set" : "neither is set");
    const mha_tensor *q = &a->q, *k = &a->k, *v = &a->v, *out = &a->out;
    mha_views views = {3, {q, k, v}, {"q", "k", "v"}, out, "out",
                       a->weights, NULL, a->batch, q->heads, 0, 0,
                       a->terms, a->lse, 1, 0, 0, a->paged != NULL};
    mha_status st;
    if ((st = mha_check_views(&views)) != MHA_OK ||
        (st = check_shapes(a)) != MHA_OK)
        return st;
    int64_t B = a->batch, bt_stride = 0;
    if (a->cu_seqlens_q &&
        (st = check_cu(a->cu_seqlens_q, "cu_seqlens_q", B, q->seq,
                       "q.seq")) != MHA_OK)
        return st;
    if (a->cu_seqlens_k &&
        (st = check_cu(a->cu_seqlens_k, "cu_seqlens_k", B, k->seq,
                       "k.seq")) != MHA_OK)
        return st;
    if (a->paged &&
        ((st = check_paged(a->paged, B, k->batch, k->seq, &bt_stride)) !=
             MHA_OK ||
         (st = check_used_scales(k, "k", a->paged, B, bt_stride)) != MHA_OK ||
         (st = check_used_scales(v, "v", a->paged, B, bt_stride)) != MHA_OK))
        return st;
    if (a->causal != MHA_CAUSAL_NONE && a->causal != MHA_CAUSAL_TOP_LEFT &&
        a->causal != MHA_CAUSAL_BOTTOM_RIGHT)
        return mha_fail(MHA_ERR_BAD_MASK,
                        "causal (%d) is not an mha_causal value",
                        (int)a->causal);
    if (!isfinite(a->scale))
        return mha_fail(MHA_ERR_BAD_ARGUMENT, "scale (%g) is not finite",
                        (double)a->scale);

    /* The longest sequence, and the packed outputs' sizes. */
    int64_t max_q = 0, max_k = 0, weights = 0, hw, lse_floats;
    for (int64_t b = 0; b < B; b++) {
        int64_t lq = a->cu_seqlens_q ? a->cu_seqlens_q[b + 1] -
                                           a->cu_seqlens_q[b]
                                     : q->seq;
        int64_t lk = seq_keys(a, b);
        max_q = lq > max_q ? lq : max_q;
        max_k = lk > max_k ? lk : max_k;
        if (!mha_mul_ok(q->heads, lq, &hw) || !mha_mul_ok(hw, lk, &hw) ||
            !mha_add_ok(weights, hw, &weights))
            return mha_fail(MHA_ERR_OVERFLOW,
                            "weights (sum of H * lq * lk) overflow");
    }
    if (!mha_mul_ok(weights, (int64_t)sizeof(float), &hw) ||
        !mha_mul_ok(q->heads, q->batch * q->seq, &lse_floats))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "weights (sum of H * lq * lk) overflow");
    views.weights_floats = weights;
    views.lse_floats = lse_floats;
    views.lq = max_q, views.lk = max_k;
    mha_mask none;
    mha_score_terms terms;
    if ((st = mha_check_outputs(&views, &none, &terms)) != MHA_OK ||
        (st = check_index_overlap(a, bt_stride, lse_floats, weights)) !=
            MHA_OK)
        return st;

    /* Each sequence's own total against its own keys. */
    for (int64_t b = 0; (terms.key_totals || terms.key_total) && b < B; b++) {
        int64_t lk = seq_keys(a, b);
        int64_t off = terms.key_offsets ? terms.key_offsets[b]
                                        : terms.key_offset;
        int64_t tot = terms.key_totals ? terms.key_totals[b]
                                       : terms.key_total;
        if (tot != 0 && tot < off + lk) {
            char field[48];
            snprintf(field, sizeof field,
                     terms.key_totals ? "terms.key_totals[%lld]"
                                      : "terms.key_total",
                     (long long)b);
            return mha_fail(MHA_ERR_BAD_ARGUMENT,
                            "%s (%lld) is below sequence %lld's key offset "
                            "+ keys (%lld + %lld)",
                            field, (long long)tot, (long long)b,
                            (long long)off, (long long)lk);
        }
    }
    none.causal = a->causal;
    mha_problem_init(p, q, k, v, out, &none, a->scale, a->weights);
    p->terms = terms;
    p->lse = a->lse;
    if (a->scale_explicit)
        p->scale = a->scale;
    p->batch = B, p->lq = max_q, p->lk = max_k;
    p->cu_q = a->cu_seqlens_q;
    p->total_q = q->seq;
    p->cu_k = a->cu_seqlens_k;
    if (a->paged) {
        p->block_table = a->paged->block_table;
        p->bt_stride = bt_stride;
        p->seqlens_k = a->paged->seqlens;
        p->page_size = k->seq;
    }
    return MHA_OK;
}

mha_status mha_attention_varlen_check(const mha_engine *engine,
                                      const mha_varlen_args *args)
{
    if (!engine)
        return mha_fail(MHA_ERR_NULL_POINTER, "engine is NULL");
    MHA_FPENV_SCOPE(engine->flush);
    mha_problem p;
    mha_status st = validate_varlen(args, &p);
    return st != MHA_OK ? st : mha_attention_plan_check(engine, &p);
}

mha_status mha_attention_varlen(const mha_engine *engine,
                                const mha_varlen_args *args)
{
    if (!engine)
        return mha_fail(MHA_ERR_NULL_POINTER, "engine is NULL");
    MHA_FPENV_SCOPE(engine->flush);
    mha_problem p;
    mha_status st = validate_varlen(args, &p);
    if (st != MHA_OK)
        return st;
    return mha_attention_solve(engine, &p);
}
