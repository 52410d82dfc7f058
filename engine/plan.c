/* The plan of one call, computed once: how the work is cut into items
 * (sizes from the shape and strides only, never the thread count, so
 * results are bitwise the same on any number of threads), how each thread's
 * scratch is laid out, and the geometry of each item's row block.
 * docs/design.md, "Plan and scratch". */
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

/* Items: units of rows times key chunks. */
static void cut_work(const mk_table *t, const mha_problem *p, mha_plan *pl)
{
    pl->group = p->heads / p->kv_heads;
    pl->grouped = p->lq == 1 && pl->group > 1;
    int64_t per = pl->grouped ? pl->group : p->lq;
    /* Rows per block: block_q, or fewer when there are fewer (decode), so
     * the split partials stay small. */
    pl->rows = per < t->block_q ? per : t->block_q;
    pl->decode = pl->rows <= MK_DECODE_ROWS;
    pl->row_blocks = (per + pl->rows - 1) / pl->rows;
    pl->units = p->batch * (pl->grouped ? p->kv_heads : p->heads) *
                pl->row_blocks;
    pl->chunks = 1;
    if (!p->weights && pl->units < SPLIT_TARGET_ITEMS) {
        int64_t want = (SPLIT_TARGET_ITEMS + pl->units - 1) / pl->units;
        int64_t most = p->lk / SPLIT_MIN_KEYS;
        pl->chunks = want < most ? want : most;
        if (pl->chunks < 1)
            pl->chunks = 1;
    }
    pl->key_major = 0;
    if (pl->decode && !p->weights &&
        p->k_ss >= (int64_t)(PAGE_BYTES / mha_dtype_size(p->k_dtype))) {
        int64_t paged = (p->lk + PAGED_CHUNK_KEYS - 1) / PAGED_CHUNK_KEYS;
        if (paged > pl->chunks)
            pl->chunks = paged;
        pl->key_major = pl->chunks > 1;
    }
    int64_t bk = t->block_k;
    pl->chunk_len = ((p->lk + pl->chunks - 1) / pl->chunks + bk - 1) / bk * bk;
    pl->chunks = (p->lk + pl->chunk_len - 1) / pl->chunk_len;
    pl->items = pl->units * pl->chunks;
    /* Keys per block: the table's, or for decode as many as the score
     * tile holds for MK_DECODE_ROWS rows (a multiple of block_k), so the
     * kernels prefetch across long runs of rows and the per-block steps
     * are few. */
    pl->key_block = bk;
    if (pl->decode) {
        int64_t n = t->block_q * bk / MK_DECODE_ROWS / bk * bk;
        pl->key_block = n > bk ? n : bk;
    }
    /* A thread keeps a whole head's packed keys when several query blocks
     * read the same keys (memory stays O(Lk d) per thread). */
    pl->cache_heads = pl->chunks == 1 && pl->row_blocks > 1 && !pl->decode;
}

/* One thread's parts; 0 on overflow. */
static int lay_out(const mk_table *t, const mha_problem *p, mha_plan *pl)
{
    int64_t bq = t->block_q, bk = t->block_k;
    int64_t keys = pl->cache_heads ? (p->lk + bk - 1) / bk * bk : bk;
    /* Decode reads K and V in place: nothing packed or widened. */
    size_t kp = pl->decode ? 0 : t->packed_floats(keys, p->d);
    int64_t values = pl->cache_heads ? keys : p->v_dtype != MHA_F32 ? bk : 0;
    int64_t part[9] = {0};
    enum { S, KP, O, M, L, ALPHA, L2, KW, VW };
    /* Decode blocks of <= MK_DECODE_ROWS rows and key_block keys fit the
     * block_q x block_k score tile too. */
    if (!mha_mul_ok(bq, bk, &part[S]) ||
        kp > (size_t)INT64_MAX / 2 || !mha_mul_ok(bq, p->dv, &part[O]))
        return 0;
    part[KP] = (int64_t)kp;
    part[M] = part[L] = part[ALPHA] = part[L2] = bq;
    if (!pl->decode &&
        ((p->k_dtype != MHA_F32 && !mha_mul_ok(bk, p->d, &part[KW])) ||
         !mha_mul_ok(values, p->dv, &part[VW])))
        return 0;
    int64_t *off[9] = {&pl->thread.s,  &pl->thread.kp,    &pl->thread.o,
                       &pl->thread.m,  &pl->thread.l,     &pl->thread.alpha,
                       &pl->thread.l2, &pl->thread.kw,    &pl->thread.vw};
    int64_t at = 0;
    for (int i = 0; i < 9; i++) {
        if (part[i] > INT64_MAX - 16)
            return 0;
        *off[i] = at;
        if (!mha_add_ok(at, round_up16(part[i]), &at))
            return 0;
    }
    pl->thread.floats = at;
    return 1;
}

mha_status mha_plan_make(const mha_engine *engine, const mha_problem *p,
                         mha_plan *pl)
{
    const mk_table *t = &engine->kernels;
    cut_work(t, p, pl);
    pl->nthreads = mha_threads_for_call(engine, pl->items);
    /* With the head cache and heads enough for every thread, a thread
     * takes a head's query blocks together, so each head is packed by one
     * thread (which thread computes an item never changes its result). */
    pl->grab = pl->cache_heads &&
                       pl->units / pl->row_blocks >= 2 * pl->nthreads
                   ? pl->row_blocks
                   : 1;
    pl->partial_floats = round_up16(pl->rows * (p->dv + 2));
    int64_t partials = 0, total;
    if (!lay_out(t, p, pl) ||
        (pl->chunks > 1 &&
         !mha_mul_ok(pl->items, pl->partial_floats, &partials)) ||
        !mha_mul_ok(pl->thread.floats, pl->nthreads, &total) ||
        !mha_add_ok(total, partials, &total) ||
        !mha_mul_ok(total, (int64_t)sizeof(float), &total))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "attention scratch for d=%lld, dv=%lld overflows",
                        (long long)p->d, (long long)p->dv);
    pl->bytes = (size_t)total;
    return MHA_OK;
}

mha_row_block mha_row_block_of(const mha_problem *p, const mha_plan *pl,
                               int64_t unit)
{
    const mha_mask *m = &p->mask;
    int64_t heads = pl->grouped ? p->kv_heads : p->heads;
    int64_t b = unit / (heads * pl->row_blocks);
    int64_t hh = unit / pl->row_blocks % heads;
    int64_t r0 = unit % pl->row_blocks * pl->rows;
    int64_t per = pl->grouped ? pl->group : p->lq;
    mha_row_block rb;
    rb.rows = per - r0 < pl->rows ? per - r0 : pl->rows;
    /* The first row's head and query, and how one row steps. */
    int64_t h, i, hk;
    ptrdiff_t step_q, step_o, step_keep, step_bias;
    if (pl->grouped) {
        hk = hh, h = hh * pl->group + r0, i = 0;
        step_q = p->q_sh, step_o = p->o_sh;
        step_keep = m->keep_stride_head, step_bias = m->bias_stride_head;
    } else {
        h = hh, hk = hh / pl->group, i = r0;
        step_q = p->q_ss, step_o = p->o_ss;
        step_keep = m->keep_stride_query, step_bias = m->bias_stride_query;
    }
    rb.q = p->q + b * p->q_sb + i * p->q_ss + h * p->q_sh;
    rb.ldq = step_q;
    size_t ks = mha_dtype_size(p->k_dtype), vs = mha_dtype_size(p->v_dtype);
    rb.k = (const char *)p->k + (size_t)(b * p->k_sb + hk * p->k_sh) * ks;
    rb.v = (const char *)p->v + (size_t)(b * p->v_sb + hk * p->v_sh) * vs;
    const mha_scales *ksc = &p->k_scales, *vsc = &p->v_scales;
    rb.ks = ksc->data ? ksc->data + b * ksc->stride_batch +
                            hk * ksc->stride_head
                      : NULL;
    rb.vs = vsc->data ? vsc->data + b * vsc->stride_batch +
                            hk * vsc->stride_head
                      : NULL;
    rb.out = p->out + b * p->o_sb + i * p->o_ss + h * p->o_sh;
    rb.ldo = step_o;
    rb.w = p->weights ? p->weights + ((b * p->heads + h) * p->lq + i) * p->lk
                      : NULL;
    rb.keep = m->keep ? m->keep + b * m->keep_stride_batch +
                            h * m->keep_stride_head +
                            i * m->keep_stride_query
                      : NULL;
    rb.keep_ld = step_keep;
    rb.bias = m->bias ? m->bias + b * m->bias_stride_batch +
                            h * m->bias_stride_head +
                            i * m->bias_stride_query
                      : NULL;
    rb.bias_ld = step_bias;
    rb.key_keep = m->key_keep ? m->key_keep + b * m->key_keep_stride_batch
                              : NULL;

    /* Score terms (docs/design.md, "Score terms"). Grouped rows are heads
     * at one query: slopes and sinks step by head, the position not. */
    const mha_score_terms *tm = &p->terms;
    int64_t ashift = tm->align == MHA_ALIGN_TOP_LEFT ? 0 : p->lk - p->lq;
    rb.softcap = tm->softcap;
    rb.alibi = tm->alibi_slopes ? tm->alibi_slopes +
                                      b * tm->alibi_stride_batch + h
                                : NULL;
    rb.alibi_ld = pl->grouped ? 1 : 0;
    rb.alibi_pos = i + ashift;
    rb.alibi_pos_step = pl->grouped ? 0 : 1;
    rb.sink = tm->sinks ? tm->sinks + h : NULL;
    rb.sink_ld = pl->grouped ? 1 : 0;
    rb.lse = p->lse ? p->lse + (b * p->heads + h) * p->lq + i : NULL;
    rb.lse_ld = pl->grouped ? p->lq : 1;

    rb.key_begin = 0;
    rb.key_end = p->lk;
    if (m->key_lengths && m->key_lengths[b] < rb.key_end)
        rb.key_end = m->key_lengths[b];
    rb.diag_lo = MK_NO_DIAG_LO;
    rb.diag_hi = MK_NO_DIAG_HI;
    if (m->causal != MHA_CAUSAL_NONE) {
        int64_t shift = m->causal == MHA_CAUSAL_BOTTOM_RIGHT ? p->lk - p->lq
                                                              : 0;
        /* The last query sees the most keys; later key blocks are skipped.
         * Grouped rows share one query, so the limit alone is the mask. */
        int64_t last_query = pl->grouped ? 0 : i + rb.rows - 1;
        int64_t end = last_query + shift + 1;
        if (end < rb.key_end)
            rb.key_end = end < 0 ? 0 : end;
        if (!pl->grouped)
            rb.diag_hi = i + shift;
    }
    /* A sliding window: query i' (aligned) sees keys [i' - left, i' +
     * right]; an extent past Lq + Lk hides nothing, so the arithmetic
     * stays far from overflow. Grouped rows share one query: the window
     * is then a key range, not a diagonal. */
    if (tm->window) {
        int64_t most = p->lq + p->lk;
        int64_t left = tm->window_left > most ? -1 : tm->window_left;
        int64_t right = tm->window_right > most ? -1 : tm->window_right;
        int64_t pos = i + ashift; /* row 0's aligned position */
        if (pl->grouped) {
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
                int64_t end = rb.diag_hi + rb.rows; /* last row's limit */
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
    }
    if (rb->bias) {
        mk.bias = rb->bias + k0;
        mk.bias_ld = rb->bias_ld;
    }
    if (rb->key_keep)
        mk.key_keep = rb->key_keep + k0;
    mk.diag_lo = rb->diag_lo == MK_NO_DIAG_LO ? MK_NO_DIAG_LO : rb->diag_lo - k0;
    mk.diag_hi = rb->diag_hi == MK_NO_DIAG_HI ? MK_NO_DIAG_HI : rb->diag_hi - k0;
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
