/* The plan of one call, computed once: how the work is cut into items
 * (sizes from the shape and strides only, never the thread count, so
 * results are bitwise the same on any number of threads), how each thread's
 * scratch is laid out, and the geometry of each item's row block.
 * docs/design.md, "Plan and scratch". */
#include <stdlib.h>

#include "attention.h"

/* Split the keys until there are this many items (a fixed number, not the
 * thread count), with chunks of at least SPLIT_MIN_KEYS keys. */
#define SPLIT_TARGET_ITEMS 64
#define SPLIT_MIN_KEYS 512

/* Decode over K/V rows at least a page apart (a [B, L, H, D] cache): keys
 * in chunks of this many, taken chunk by chunk across the heads of a
 * batch. Every row is a TLB entry and a head's whole cache outgrows the
 * TLB; short chunks across the heads reuse a chunk's pages (and the
 * neighbouring heads' lines the prefetchers brought in) while they are
 * hot (docs/benchmarks.md, "Figures behind design choices"). */
#define PAGED_CHUNK_KEYS 256
#define PAGE_BYTES 4096

static int64_t round_up16(int64_t n) { return (n + 15) / 16 * 16; }

/* Keys per block of a decode row block spanning kv heads: the block's
 * scores (rows x SPAN_KEYS) stay in L1 while its K, then its V, is read
 * position by position. Measured (Zen 5, (1,32,1,4096,128)): 64 beats 16
 * and 32 by 5-20% and 128 and 256 by 10-50% (docs/benchmarks.md). */
#define SPAN_KEYS 64

/* Whether a block may interleave several queries of several heads (a
 * speculative decode step): the masks and terms find each row's query
 * and head (mk_row_of), the sinks too (stream_keys); the weights output
 * (rows written at one stride by normalize) keeps blocks of one head's
 * queries. */
static int interleaves(const mha_problem *p)
{
    return !p->weights;
}

/* The kv heads one decode row block spans, its rows `rows` a kv head
 * (its query heads at each query it takes): when one position's K rows
 * of every kv head lie closer together than two positions (and V's too: a
 * [B, L, H, D] cache, packed, batched or paged in blocks of that order),
 * up to block_q rows' worth, all of a position's at one query. Reading a
 * position's heads as one run is what that layout rewards; a [B, H, L, D]
 * cache (heads far apart) keeps one kv head per block, and so does a
 * table whose kernels take mk_heads as calls per head (generic: 0.58-0.92x
 * there), and so do fp32 rows from the table's head_rows_f32 on. Over
 * several queries (even) the kv heads are shared evenly among as few
 * blocks as that allows. From the table, the shape, the dtypes and the
 * strides only. */
static int64_t kv_span(const mk_table *t, const mha_problem *p, int64_t rows,
                       int even)
{
    if (!t->decode_heads || p->kv_heads < 2 || rows < 1 ||
        rows > MK_DECODE_ROWS || p->k_sh <= 0 || p->k_sh >= p->k_ss ||
        p->v_sh <= 0 || p->v_sh >= p->v_ss)
        return 1;
    /* fp32 rows the table reads faster one kv head at a time (rows only
     * grow from here with the queries, so the most span any lq takes
     * stays kv_span(group, 0)'s). */
    if (t->head_rows_f32 > 0 && rows >= t->head_rows_f32 &&
        p->k_dtype == MHA_F32 && p->v_dtype == MHA_F32)
        return 1;
    int64_t span = t->block_q / rows;
    if (span > p->kv_heads)
        span = p->kv_heads;
    if (even && span >= 2) {
        int64_t blocks = (p->kv_heads + span - 1) / span;
        span = (p->kv_heads + blocks - 1) / blocks;
    }
    return span >= 2 ? span : 1;
}

/* The queries one block of a speculative decode step (2 to MK_DECODE_ROWS
 * queries) takes together, 0 for blocks of one head's queries. All of
 * them when a kv head's rows fit one wide decode block (the table's
 * decode_rows, more than MK_DECODE_ROWS): group 4 at Lq 4 and group 8 at
 * Lq 2 read 1.0-1.3x as one wide block against two 8-row ones (Zen 4,
 * docs/benchmarks.md). Otherwise, one head
 * at a time, every query head's block read its kv head's keys again, and
 * [B, L, H, D] read at 0.49-0.55x the rate of [B, H, L, D]. Decode blocks
 * take as many queries as MK_DECODE_ROWS rows a kv head hold (its group's
 * query heads at each), shared evenly among the fewest blocks, each
 * reading the keys again; from STEP_PREFILL_READS such reads on (3, or 4
 * where the blocks would span kv heads and read faster), one prefill
 * block of all the step's rows a kv head (up to block_q) reads them once:
 * 32 rows a kv head read 1.0-1.4x, 24 rows from [B, H, L, D] 1.1-1.2x,
 * but from [B, L, H, D] 0.91-0.98x (Zen 4, docs/benchmarks.md). */
#define STEP_PREFILL_READS 3
static int64_t step_queries(const mk_table *t, const mha_problem *p,
                            int64_t group, int64_t lq)
{
    if (lq < 2 || lq > MK_DECODE_ROWS || !interleaves(p))
        return 0;
    int64_t rows = group * lq;
    if (rows > MK_DECODE_ROWS && rows <= t->decode_rows)
        return lq; /* one wide decode block a kv head reads them once */
    if (t->decode_rows > MK_DECODE_ROWS && rows > t->decode_rows &&
        rows <= 2 * t->decode_rows && group <= t->decode_rows) {
        /* Two wide blocks, not one prefill block: 32 rows a kv head from
         * [B, L, H, D] 1.26x, from [B, H, L, D] 1.17x (0.98x from L3),
         * 24 rows 1.0-1.1x (Zen 4, docs/benchmarks.md). */
        int64_t most = t->decode_rows / group;
        int64_t blocks = (lq + most - 1) / most;
        return (lq + blocks - 1) / blocks;
    }
    int64_t reads = (rows + MK_DECODE_ROWS - 1) / MK_DECODE_ROWS;
    int64_t from = STEP_PREFILL_READS +
                   (group <= MK_DECODE_ROWS && kv_span(t, p, group, 1) > 1);
    if (reads >= from && rows <= t->block_q)
        return lq;
    if (group > MK_DECODE_ROWS)
        return 0;
    int64_t most = MK_DECODE_ROWS / group;
    if (most > lq)
        most = lq;
    int64_t blocks = (lq + most - 1) / most;
    return (lq + blocks - 1) / blocks;
}

/* Queries and keys of sequence b. */
static void seq_lengths(const mha_problem *p, int64_t b, int64_t *lq,
                        int64_t *lk)
{
    *lq = p->cu_q ? p->cu_q[b + 1] - p->cu_q[b] : p->lq;
    *lk = p->cu_k          ? p->cu_k[b + 1] - p->cu_k[b]
          : p->seqlens_k   ? p->seqlens_k[b]
                           : p->lk;
}

/* How a sequence of lq queries is cut into blocks of rows: query rows of
 * a head, or (grouped) the query heads of a kv group at one query, or
 * across kv heads their query heads at each query (kv_span, ilv). */
static void seq_cut(const mk_table *t, const mha_problem *p, int64_t group,
                    int64_t lq, mha_seq *s)
{
    s->lq = lq;
    int64_t qs = step_queries(t, p, group, lq);
    s->kv_span = lq == 1  ? kv_span(t, p, group, 0)
                 : qs > 0 ? kv_span(t, p, group * qs, 1)
                          : 1;
    if (group == 1 && s->kv_span == 1)
        qs = 0; /* one head's queries: the plain blocks already */
    s->grouped = s->kv_span > 1 || (lq == 1 && group > 1) || qs > 0;
    s->ilv = qs > 0 ? qs : 1;
    int64_t per = s->grouped ? group * s->ilv * s->kv_span : lq;
    /* Rows per block: block_q, or fewer when there are fewer (decode), so
     * the split partials stay small. */
    s->rows = per < t->block_q ? per : t->block_q;
    s->decode = s->kv_span > 1 || s->rows <= t->decode_rows;
    /* A step's blocks: one per ilv queries (each within block_q rows). */
    s->row_blocks = qs > 0    ? (lq + qs - 1) / qs
                    : per > 0 ? (per + s->rows - 1) / s->rows
                              : 0;
    s->units = (s->grouped ? (p->kv_heads + s->kv_span - 1) / s->kv_span
                           : p->heads) *
               s->row_blocks;
}

/* How a sequence's keys are cut into chunks (each unit's items), from
 * the shape alone: split when the call has few units, or for decode over
 * page-strided rows in short chunks taken across the sequence's heads. */
static void seq_chunks(const mk_table *t, const mha_problem *p,
                       int64_t units, int64_t lk, mha_seq *s)
{
    s->chunks = 1;
    if (!p->weights && units < SPLIT_TARGET_ITEMS) {
        int64_t want = units > 0 ? (SPLIT_TARGET_ITEMS + units - 1) / units
                                 : 1;
        int64_t most = lk / SPLIT_MIN_KEYS;
        s->chunks = want < most ? want : most;
        if (s->chunks < 1)
            s->chunks = 1;
    }
    s->key_major = 0;
    if (s->decode && s->kv_span == 1 && !p->weights &&
        p->k_ss >= (int64_t)(PAGE_BYTES / mha_dtype_size(p->k_dtype))) {
        int64_t paged = (lk + PAGED_CHUNK_KEYS - 1) / PAGED_CHUNK_KEYS;
        if (paged > s->chunks)
            s->chunks = paged;
        s->key_major = s->chunks > 1;
    }
    /* A step's query blocks read the same keys: taken chunk by chunk,
     * a chunk's second read may find it in L3 (group 4 at Lq 4 from
     * [B, L, H, D]: 1.05x on one thread, level otherwise; the grouped
     * kernels' instructions bound them, docs/benchmarks.md). */
    if (s->grouped && s->lq > 1 && s->row_blocks > 1)
        s->key_major = s->chunks > 1;
    int64_t bk = t->block_k, n = lk > 0 ? lk : 1;
    s->chunk_len = ((n + s->chunks - 1) / s->chunks + bk - 1) / bk * bk;
    s->chunks = (n + s->chunk_len - 1) / s->chunk_len;
    /* A thread keeps a whole head's packed keys when several query blocks
     * read the same keys (memory stays O(Lk d) per thread). */
    s->cache = s->chunks == 1 && s->row_blocks > 1 && !s->decode;
    /* One (unit, chunk) partial: rows x dv accumulator, then rows maxima
     * and rows sums; sized by the sequence's rows (a decode row block's
     * are few, a prefill block's many). */
    s->partial_floats = round_up16(s->rows * (p->dv + 2));
}

/* Items: each sequence's units times its key chunks, the sequences one
 * after another. 0 when a count overflows. */
static int cut_work(const mk_table *t, const mha_problem *p, mha_plan *pl)
{
    pl->group = p->heads / p->kv_heads;
    pl->units = 0;
    pl->any_prefill = pl->any_decode = pl->gather_v = pl->interleave = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t lq, lk;
        mha_seq s;
        seq_lengths(p, b, &lq, &lk);
        seq_cut(t, p, pl->group, lq, &s);
        pl->units += s.units; /* at most the q rows times H */
        if (s.units > 0 && !s.decode)
            pl->any_prefill = 1;
        if (s.units > 0 && !s.decode && mha_gathers_values(p, s.rows))
            pl->gather_v = 1;
        if (s.units > 0 && s.decode)
            pl->any_decode = 1;
        if (s.units > 0 && s.ilv > 1)
            pl->interleave = 1;
    }
    pl->items = pl->part_floats = 0;
    pl->cache_heads = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t lq, lk;
        mha_seq s;
        seq_lengths(p, b, &lq, &lk);
        seq_cut(t, p, pl->group, lq, &s);
        seq_chunks(t, p, pl->units, lk, &s);
        int64_t items, floats;
        if (!mha_mul_ok(s.units, s.chunks, &items) ||
            !mha_add_ok(pl->items, items, &pl->items) ||
            !mha_mul_ok(items, s.partial_floats, &floats) ||
            (s.chunks > 1 &&
             !mha_add_ok(pl->part_floats, floats, &pl->part_floats)))
            return 0;
        pl->cache_heads |= s.cache;
    }
    /* Keys per decode block: as many as the score tile holds for
     * MK_DECODE_ROWS rows (a multiple of block_k), so the kernels prefetch
     * across long runs of rows and the per-block steps are few. */
    int64_t bk = t->block_k, n = t->block_q * bk / MK_DECODE_ROWS / bk * bk;
    pl->decode_key_block = n > bk ? n : bk;
    /* A paged decode block's row scales: one per key, or one per key and
     * kv head for a block spanning kv heads (SPAN_KEYS or fewer keys). */
    int64_t span = kv_span(t, p, pl->group, 0); /* the most at any lq */
    pl->rt_scales = pl->decode_key_block;
    if (span > 1 && SPAN_KEYS * span > pl->rt_scales)
        pl->rt_scales = SPAN_KEYS * span;
    /* A spanning block's row table runs MK_HEADS_AHEAD keys past its
     * own (decode.c, rows_of). */
    pl->rt_rows = pl->decode_key_block;
    if (span > 1 && SPAN_KEYS + MK_HEADS_AHEAD > pl->rt_rows)
        pl->rt_rows = SPAN_KEYS + MK_HEADS_AHEAD;
    return 1;
}

/* A prefill block's and a wide decode block's score rows (more than
 * MK_DECODE_ROWS) lie a line further apart than its keys: rows a multiple
 * of 4 KiB apart share one L1 set, which 16 rows overflow (each score
 * write and read of the kernels missed L1; 2 KiB apart, two sets, as
 * prefill's 512-key rows were: an AMX tile store or load of 16 rows
 * then missed too, docs/design.md, "The amxbf16 table"). */
#define S_PAD 16

/* Keys per block of a wide decode block: as many as the block_q x
 * block_k score tile holds for its rows at S_PAD more floats a row
 * (a multiple of block_k). */
static int64_t wide_key_block(const mk_table *t, int64_t rows)
{
    int64_t bk = t->block_k;
    int64_t n = (t->block_q * bk / rows - S_PAD) / bk * bk;
    return n > bk ? n : bk;
}

void mha_seqs_fill(const mk_table *t, const mha_problem *p,
                   const mha_plan *pl, mha_seq *seqs)
{
    int64_t unit = 0, item = 0, part = 0, w = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        mha_seq *s = &seqs[b];
        int64_t lq, lk;
        seq_lengths(p, b, &lq, &lk);
        seq_cut(t, p, pl->group, lq, s);
        s->lk = lk;
        s->key_limit = lk;
        if (p->mask.key_lengths && p->mask.key_lengths[b] < lk)
            s->key_limit = p->mask.key_lengths[b];
        seq_chunks(t, p, pl->units, lk, s);
        s->unit0 = unit;
        unit += s->units;
        s->item0 = item;
        item += s->units * s->chunks;
        s->part0 = part;
        if (s->chunks > 1)
            part += s->units * s->chunks * s->partial_floats;
        /* A spanning block's rows (<= block_q) x keys (<= block_k) fit
         * the score tile. */
        s->key_block = !s->decode      ? t->block_k
                       : s->kv_span > 1 ? (SPAN_KEYS < t->block_k ? SPAN_KEYS
                                                                  : t->block_k)
                       : s->rows > MK_DECODE_ROWS ? wide_key_block(t, s->rows)
                                        : pl->decode_key_block;
        if (p->cu_q) {
            s->q_off = p->cu_q[b] * p->q_ss;
            s->o_off = p->cu_q[b] * p->o_ss;
            s->lse_off = p->cu_q[b];
            s->lse_sh = p->total_q;
        } else {
            s->q_off = b * p->q_sb;
            s->o_off = b * p->o_sb;
            s->lse_off = b * p->heads * p->lq;
            s->lse_sh = p->lq;
        }
        s->pages = NULL;
        if (p->block_table) {
            s->pages = p->block_table + b * p->bt_stride;
            s->k_off = s->v_off = s->ks_off = s->vs_off = 0;
        } else if (p->cu_k) {
            s->k_off = p->cu_k[b] * p->k_ss;
            s->v_off = p->cu_k[b] * p->v_ss;
            s->ks_off = p->cu_k[b] * p->k_scales.stride_seq;
            s->vs_off = p->cu_k[b] * p->v_scales.stride_seq;
        } else {
            s->k_off = b * p->k_sb;
            s->v_off = b * p->v_sb;
            s->ks_off = b * p->k_scales.stride_batch;
            s->vs_off = b * p->v_scales.stride_batch;
        }
        /* Validation bounded sum_b H * lq * lk (the weights' floats). */
        s->w_off = w;
        w += p->heads * lq * lk;
    }
}

/* One thread's parts; 0 on overflow. */
static int lay_out(const mk_table *t, const mha_problem *p, mha_plan *pl)
{
    int64_t bq = t->block_q, bk = t->block_k;
    int64_t keys = pl->cache_heads ? (p->lk + bk - 1) / bk * bk : bk;
    /* Decode reads K and V in place: nothing packed or widened. */
    size_t kp = pl->any_prefill ? t->packed_floats(keys, p->d) : 0;
    /* Keys and values not stored as fp32 rows at one stride (a narrower
     * dtype, a paged cache) are widened or copied block by block, and so
     * are the values of few-row blocks (mha_gathers_values). */
    int paged = p->block_table != NULL;
    int64_t values = pl->cache_heads ? keys
                     : p->v_dtype != MHA_F32 || paged || pl->gather_v ? bk
                                                                      : 0;
    int64_t part[12] = {0};
    enum { S, KP, O, M, L, ALPHA, L2, KW, VW, RT, QW, OW };
    if (paged && pl->any_decode)
        part[RT] = pl->rt_rows *
                       (int64_t)(2 * sizeof(void *) / sizeof(float)) +
                   2 * pl->rt_scales;
    /* The score tile: block_q rows of block_k keys, S_PAD floats more a
     * row when a block is prefill (mha_row_block_of's s_ld). Decode
     * blocks of <= MK_DECODE_ROWS rows and decode_key_block keys fit the
     * block_q x block_k tile too. */
    if (!mha_mul_ok(bq, bk + (pl->any_prefill ? S_PAD : 0), &part[S]) ||
        kp > (size_t)INT64_MAX / 2 || !mha_mul_ok(bq, p->dv, &part[O]))
        return 0;
    /* A wide block of at least block_k keys (wide_key_block) on a tile
     * too small for it. */
    if (t->decode_rows * (bk + S_PAD) > part[S])
        part[S] = t->decode_rows * (bk + S_PAD);
    part[KP] = (int64_t)kp;
    /* Queries are staged for half compute, for fp32 prefill at a stride
     * and for interleaved blocks (attention.c, stage_rows); outputs for
     * half compute and interleaved blocks. */
    if ((p->compute != MHA_F32 || pl->any_prefill || pl->interleave) &&
        !mha_mul_ok(bq, p->d, &part[QW]))
        return 0;
    if ((p->compute != MHA_F32 || pl->interleave) &&
        !mha_mul_ok(bq, p->dv, &part[OW]))
        return 0;
    part[M] = part[L] = part[ALPHA] = part[L2] = bq;
    if (pl->any_prefill &&
        (((p->k_dtype != MHA_F32 || paged) &&
          !mha_mul_ok(bk, p->d, &part[KW])) ||
         !mha_mul_ok(values, p->dv, &part[VW])))
        return 0;
    /* Half compute packs values by pairs of keys, a block's pack as large
     * as a full block's (prefill.c, half_values). */
    if (pl->any_prefill && pl->half) {
        size_t vp = pl->half->packed_v_floats(values, p->dv);
        if (vp > (size_t)INT64_MAX / 2)
            return 0;
        if ((int64_t)vp > part[VW])
            part[VW] = (int64_t)vp;
    }
    int64_t *off[12] = {&pl->thread.s,  &pl->thread.kp, &pl->thread.o,
                        &pl->thread.m,  &pl->thread.l,  &pl->thread.alpha,
                        &pl->thread.l2, &pl->thread.kw, &pl->thread.vw,
                        &pl->thread.rt, &pl->thread.qw, &pl->thread.ow};
    int64_t at = 0;
    for (int i = 0; i < 12; i++) {
        if (part[i] > INT64_MAX - 16)
            return 0;
        *off[i] = at;
        if (!mha_add_ok(at, round_up16(part[i]), &at))
            return 0;
    }
    pl->thread.floats = at;
    return 1;
}

/* The slots the prefill stream computes on when it computes natively in
 * a half dtype (docs/design.md, "Compute dtype"), else NULL: q, K and V
 * all of the compute dtype (bf16 or f16) and the table has its slots,
 * even d, a dense cache (a paged one is gathered through fp32), and query
 * and key rows that stay pairs of codes (4-byte aligned q, even strides).
 * Decided once per call, so every row block of a head shares one
 * packing. */
static const mk_half_slots *half_native(const mk_table *t,
                                        const mha_problem *p)
{
    if (p->compute != MHA_BF16 && p->compute != MHA_F16)
        return NULL;
    const mk_half_slots *h =
        &t->half[p->compute == MHA_BF16 ? MK_HALF_BF16 : MK_HALF_F16];
    int ok = h->qk && p->k_dtype == p->compute && p->v_dtype == p->compute &&
             !p->block_table && p->d % 2 == 0 && (uintptr_t)p->q % 4 == 0 &&
             p->q_sb % 2 == 0 && p->q_ss % 2 == 0 && p->q_sh % 2 == 0 &&
             p->k_ss % 2 == 0;
    return ok ? h : NULL;
}

mha_status mha_plan_make(const mha_engine *engine, const mha_problem *p,
                         mha_plan *pl)
{
    const mk_table *t = &engine->kernels;
    pl->half = half_native(t, p);
    if (!cut_work(t, p, pl))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "attention work items for %lld sequences overflow",
                        (long long)p->batch);
    pl->nthreads = mha_threads_for_call(engine, pl->items);
    pl->flush = engine->flush;
    pl->tasks_max = pl->items;
    int64_t partials = pl->part_floats, total, seq_bytes, task_bytes, end;
    if (!lay_out(t, p, pl) ||

        !mha_mul_ok(pl->thread.floats, pl->nthreads, &total) ||
        !mha_add_ok(total, partials, &total) ||
        !mha_mul_ok(total, (int64_t)sizeof(float), &total) ||
        !mha_mul_ok(p->batch,
                    (int64_t)(sizeof(mha_seq) + sizeof(mha_seq_order)),
                    &seq_bytes) ||
        !mha_mul_ok(pl->tasks_max, (int64_t)sizeof(mha_task), &task_bytes) ||
        !mha_add_ok(total, task_bytes, &end) ||
        !mha_add_ok(end, seq_bytes, &end))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "attention scratch for d=%lld, dv=%lld overflows",
                        (long long)p->d, (long long)p->dv);
    /* Offsets stay multiples of 8 bytes: every part is made of 8-byte
     * elements, and total is a multiple of 64. */
    pl->task_offset = (size_t)total;
    pl->seq_offset = (size_t)(total + task_bytes);
    pl->bytes = (size_t)end;
    return MHA_OK;
}

/* Sequences by decreasing lq * lk (ties by index): the largest tasks go
 * first, so the last ones to finish are small. */
static int by_cost(const void *a, const void *b)
{
    const mha_seq_order *x = a, *y = b;
    if (x->cost != y->cost)
        return x->cost > y->cost ? -1 : 1;
    return x->seq < y->seq ? -1 : 1;
}

int64_t mha_tasks_fill(const mha_problem *p, const mha_plan *pl,
                       const mha_seq *seqs, mha_seq_order *order,
                       mha_task *tasks)
{
    for (int64_t b = 0; b < p->batch; b++) {
        order[b].seq = b;
        order[b].cost = seqs[b].lq * seqs[b].lk;
    }
    qsort(order, (size_t)p->batch, sizeof *order, by_cost);
    int64_t n = 0;
    for (int64_t x = 0; x < p->batch; x++) {
        const mha_seq *s = &seqs[order[x].seq];
        int64_t first = s->item0, count = s->units * s->chunks;
        /* With the head cache and heads enough for every thread, a thread
         * takes a head's query blocks together, so each head is packed by
         * one thread (which thread computes an item never changes its
         * result). Units of a head are consecutive, and with the cache a
         * unit is one item. */
        int64_t heads = s->row_blocks ? s->units / s->row_blocks : 0;
        int64_t step = s->cache && heads >= 2 * pl->nthreads ? s->row_blocks
                                                              : 1;
        for (int64_t it = 0; it < count; it += step) {
            tasks[n].first = first + it;
            tasks[n].count = step;
            n++;
        }
    }
    return n;
}

/* The last sequence whose first unit (or item) is at or before x: empty
 * sequences before it start where it does, empty ones after it past x. */
static int64_t last_at_or_before(const mha_seq *seqs, int64_t n, int64_t x,
                                 int items)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if ((items ? seqs[mid].item0 : seqs[mid].unit0) <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

int64_t mha_seq_of_unit(const mha_seq *seqs, int64_t n, int64_t unit)
{
    return last_at_or_before(seqs, n, unit, 0);
}

int64_t mha_seq_of_item(const mha_seq *seqs, int64_t n, int64_t item)
{
    return last_at_or_before(seqs, n, item, 1);
}

int64_t mha_kv_run(const mha_problem *p, const mha_row_block *rb, int value,
                   int64_t j, int64_t n, const char **rows,
                   const float **scales)
{
    mha_dtype dt = value ? p->v_dtype : p->k_dtype;
    const char *base = value ? rb->v : rb->k;
    const float *sc = value ? rb->vs : rb->ks;
    const mha_scales *ss = value ? &p->v_scales : &p->k_scales;
    int64_t seq_stride = value ? p->v_ss : p->k_ss;
    size_t es = mha_dtype_size(dt);
    int64_t run = n, at = j, block = 0;
    if (rb->pages) {
        int64_t page = p->page_size;
        block = rb->pages[j / page];
        at = j % page;
        if (page - at < run)
            run = page - at;
    }
    int64_t block_stride = value ? p->v_sb : p->k_sb;
    *rows = base + (size_t)(block * block_stride + at * seq_stride) * es;
    *scales = sc ? sc + block * ss->stride_batch + at * ss->stride_seq
                 : NULL;
    return run;
}

mha_row_block mha_row_block_of(const mha_problem *p, const mha_plan *pl,
                               const mha_seq *seqs, int64_t unit)
{
    const mha_mask *m = &p->mask;
    int64_t b = mha_seq_of_unit(seqs, p->batch, unit);
    const mha_seq *s = &seqs[b];
    unit -= s->unit0;
    int64_t heads = s->grouped
                        ? (p->kv_heads + s->kv_span - 1) / s->kv_span
                        : p->heads;
    int64_t hh = unit / s->row_blocks % heads;
    int64_t r0 = unit % s->row_blocks * s->rows;
    /* Grouped rows take queries [q0, q0 + nq): one, or a step's block of
     * ilv (the last one short). */
    int64_t q0 = 0, nq = 1;
    if (s->grouped && s->lq > 1) {
        q0 = unit % s->row_blocks * s->ilv, r0 = 0;
        nq = s->lq - q0 < s->ilv ? s->lq - q0 : s->ilv;
    }
    int64_t per = s->grouped ? pl->group * nq : s->lq;
    if (s->kv_span > 1) { /* the last block may span fewer kv heads */
        int64_t left = p->kv_heads - hh * s->kv_span;
        per *= left < s->kv_span ? left : s->kv_span;
    }
    int64_t lq = s->lq, lk = s->lk;
    mha_row_block rb;
    rb.rows = per - r0 < s->rows ? per - r0 : s->rows;
    rb.decode = s->decode;
    rb.key_block = s->key_block;
    rb.s_ld = s->key_block +
              (!s->decode || (s->kv_span == 1 && s->rows > MK_DECODE_ROWS)
                   ? S_PAD
                   : 0);
    /* The first row's head and query, and how one row steps. */
    int64_t h, i, hk;
    ptrdiff_t step_q, step_o, step_keep, step_bias;
    if (s->grouped) {
        hk = hh * s->kv_span, h = hk * pl->group + r0, i = q0;
        step_q = p->q_sh, step_o = p->o_sh;
        step_keep = m->keep_stride_head, step_bias = m->bias_stride_head;
    } else {
        h = hh, hk = hh / pl->group, i = r0;
        step_q = p->q_ss, step_o = p->o_ss;
        step_keep = m->keep_stride_query, step_bias = m->bias_stride_query;
    }
    rb.cache_id = b * p->kv_heads + hk;
    rb.kv_group = s->kv_span > 1 ? pl->group * nq : 0;
    rb.ilv = nq, rb.ilv_group = pl->group;
    rb.q_qs = p->q_ss, rb.o_qs = p->o_ss;
    rb.k_hs = p->k_sh, rb.v_hs = p->v_sh;
    rb.ks_hs = p->k_scales.stride_head, rb.vs_hs = p->v_scales.stride_head;
    /* Rows in the compute dtype; fp32 ones are read and written in place,
     * others staged through thread scratch (mha_stage_rows). */
    size_t cs = mha_dtype_size(p->compute);
    int f32 = p->compute == MHA_F32;
    rb.q_src = (const char *)p->q +
               (size_t)(s->q_off + i * p->q_ss + h * p->q_sh) * cs;
    rb.q = f32 ? (const float *)(const void *)rb.q_src : NULL;
    rb.ldq = rb.ldq_src = step_q;
    size_t ks = mha_dtype_size(p->k_dtype), vs = mha_dtype_size(p->v_dtype);
    rb.k = (const char *)p->k + (size_t)(s->k_off + hk * p->k_sh) * ks;
    rb.v = (const char *)p->v + (size_t)(s->v_off + hk * p->v_sh) * vs;
    const mha_scales *ksc = &p->k_scales, *vsc = &p->v_scales;
    rb.ks = ksc->data ? ksc->data + s->ks_off + hk * ksc->stride_head : NULL;
    rb.vs = vsc->data ? vsc->data + s->vs_off + hk * vsc->stride_head : NULL;
    rb.pages = s->pages;
    rb.out_dst = (char *)p->out +
                 (size_t)(s->o_off + i * p->o_ss + h * p->o_sh) * cs;
    rb.out = f32 ? (float *)(void *)rb.out_dst : NULL;
    rb.ldo = rb.ldo_dst = step_o;
    rb.w = p->weights ? p->weights + s->w_off + (h * lq + i) * lk : NULL;
    rb.w_ld = lk;
    rb.keep = m->keep ? m->keep + b * m->keep_stride_batch +
                            h * m->keep_stride_head +
                            i * m->keep_stride_query
                      : NULL;
    rb.keep_ld = step_keep;
    rb.keep_qld = nq > 1 ? m->keep_stride_query : 0;
    rb.bias = m->bias ? m->bias + b * m->bias_stride_batch +
                            h * m->bias_stride_head +
                            i * m->bias_stride_query
                      : NULL;
    rb.bias_ld = step_bias;
    rb.bias_qld = nq > 1 ? m->bias_stride_query : 0;
    rb.key_keep = m->key_keep ? m->key_keep + b * m->key_keep_stride_batch
                              : NULL;

    /* Score terms (docs/design.md, "Score terms"). Grouped rows are heads
     * at one query: slopes and sinks step by head, the position not;
     * interleaved rows (nq > 1) find their head and query (mk_row_of). */
    /* Positions: key j is key_offset + j of key_total keys (a shard); in
     * the block's key indices every position moves by -key_offset. */
    const mha_score_terms *tm = &p->terms;
    int64_t koff = tm->key_offsets ? tm->key_offsets[b] : tm->key_offset;
    int64_t total = tm->key_totals ? tm->key_totals[b] : tm->key_total;
    if (total == 0)
        total = koff + lk;
    int64_t ashift = (tm->align == MHA_ALIGN_TOP_LEFT ? 0 : total - lq) - koff;
    rb.softcap = tm->softcap;
    rb.alibi = tm->alibi_slopes ? tm->alibi_slopes +
                                      b * tm->alibi_stride_batch + h
                                : NULL;
    rb.alibi_ld = s->grouped ? 1 : 0;
    rb.alibi_pos = i + ashift;
    rb.alibi_pos_step = s->grouped && nq == 1 ? 0 : 1; /* per query */
    rb.sink = tm->sinks ? tm->sinks + h : NULL;
    rb.sink_ld = s->grouped ? 1 : 0;
    rb.lse = p->lse ? p->lse + s->lse_off + h * s->lse_sh + i : NULL;
    rb.lse_ld = s->grouped ? s->lse_sh : 1;

    rb.key_begin = 0;
    rb.key_end = s->key_limit;
    rb.diag_lo = MK_NO_DIAG_LO;
    rb.diag_hi = MK_NO_DIAG_HI;
    if (m->causal != MHA_CAUSAL_NONE) {
        int64_t shift = (m->causal == MHA_CAUSAL_BOTTOM_RIGHT ? total - lq : 0) -
                        koff;
        /* The last query sees the most keys; later key blocks are skipped.
         * Grouped rows at one query: the limit alone is the mask; at
         * several (ilv), each row's query takes the diagonal. */
        int64_t last_query = i + (s->grouped ? nq : rb.rows) - 1;
        int64_t end = last_query + shift + 1;
        if (end < rb.key_end)
            rb.key_end = end < 0 ? 0 : end;
        if (!s->grouped || nq > 1)
            rb.diag_hi = i + shift;
    }
    /* A sliding window: query i' (aligned) sees keys [i' - left, i' +
     * right]; an extent past Lq + Lk hides nothing, so the arithmetic
     * stays far from overflow. Grouped rows at one query share it: the
     * window is then a key range, not a diagonal; interleaved rows take
     * the diagonals by their queries (ilv of them). */
    if (tm->window) {
        int64_t most = lq + total;
        int64_t left = tm->window_left > most ? -1 : tm->window_left;
        int64_t right = tm->window_right > most ? -1 : tm->window_right;
        int64_t pos = i + ashift; /* row 0's aligned position */
        int64_t queries = s->grouped ? nq : rb.rows;
        if (s->grouped && nq == 1) {
            if (left >= 0 && pos - left > rb.key_begin)
                rb.key_begin = pos - left;
            if (right >= 0 && pos + right + 1 < rb.key_end)
                rb.key_end = pos + right + 1 < 0 ? 0 : pos + right + 1;
        } else {
            if (left >= 0)
                rb.diag_lo = pos - left;
            if (right >= 0) {
                if (rb.diag_hi == MK_NO_DIAG_HI || pos + right < rb.diag_hi)
                    rb.diag_hi = pos + right;
                int64_t end = rb.diag_hi + queries; /* the last query's */
                if (end < rb.key_end)
                    rb.key_end = end < 0 ? 0 : end;
            }
        }
    }
    /* The first row sees the fewest keys on the left: blocks before its
     * window edge are skipped (the tile mask hides the rest). */
    if (rb.diag_lo != MK_NO_DIAG_LO && rb.diag_lo > rb.key_begin)
        rb.key_begin = rb.diag_lo;
    if (rb.key_begin > rb.key_end)
        rb.key_begin = rb.key_end;
    return rb;
}

mk_mask mha_block_mask(const mha_row_block *rb, int64_t k0, int64_t nk)
{
    mk_mask mk = {0};
    if (rb->keep) {
        mk.keep = rb->keep + k0;
        mk.keep_ld = rb->keep_ld;
        mk.keep_qld = rb->keep_qld;
    }
    if (rb->bias) {
        mk.bias = rb->bias + k0;
        mk.bias_ld = rb->bias_ld;
        mk.bias_qld = rb->bias_qld;
    }
    if (rb->key_keep)
        mk.key_keep = rb->key_keep + k0;
    mk.diag_lo = rb->diag_lo == MK_NO_DIAG_LO ? MK_NO_DIAG_LO : rb->diag_lo - k0;
    mk.diag_hi = rb->diag_hi == MK_NO_DIAG_HI ? MK_NO_DIAG_HI : rb->diag_hi - k0;
    if (rb->ilv > 1) { /* row r is query r / ilv_group % ilv */
        mk.diag_rows = rb->ilv_group;
        mk.diag_period = rb->ilv;
    }
    mk.key_limit = nk;
    /* The first key block starts at a multiple of block_k: the shared
     * left edge hides its keys before key_begin (grouped rows' window). */
    mk.key_start = rb->key_begin - k0;
    mk.softcap = rb->softcap;
    if (rb->alibi) {
        mk.alibi = rb->alibi;
        mk.alibi_ld = rb->alibi_ld;
        mk.alibi_pos = rb->alibi_pos - k0;
        mk.alibi_pos_step = rb->alibi_pos_step;
    }
    return mk;
}
