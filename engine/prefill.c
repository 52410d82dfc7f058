/* The prefill stream: blocks of more than MK_DECODE_ROWS query rows. Keys
 * are packed into the table's panel layout (a head's keys once per thread
 * with the head cache), values read in place when they are fp32 rows at
 * one stride (but for few-row blocks over rows a page apart:
 * mha_gathers_values), else copied or widened once; a key block that
 * crosses the causal diagonal is cut into row sub-blocks that compute
 * only the keys they see. docs/design.md, "Data path of one call". */
#include <string.h>

#include "attention.h"
#include "fetch_step.h"

/* Rows [k0, k0 + n) of the row block's K (value 0) or V head as fp32
 * rows in buf (row stride its width): widened (and times their scales)
 * when stored narrower, copied when fp32, run by run (a paged cache's
 * blocks). Each row fetches the row MHA_COPY_AHEAD on into L2 first: rows a
 * page or more apart (a [B, L, H, D] cache) defeat the hardware
 * prefetchers, and a block of few query rows (grouped decode with more
 * than MK_DECODE_ROWS rows a kv head) waited on them: bf16 K/V, 16 rows a
 * kv head, read 1.4x faster from [B, L, H, D] (Zen 4,
 * docs/benchmarks.md). */
static void gather_rows(const mk_table *t, const mha_problem *p,
                        const mha_row_block *rb, int value, int64_t k0,
                        int64_t n, float *buf)
{
    mha_dtype dtype = value ? p->v_dtype : p->k_dtype;
    int64_t width = value ? p->dv : p->d;
    int64_t stride = value ? p->v_ss : p->k_ss;
    int64_t scale_ss = value ? p->v_scales.stride_seq
                             : p->k_scales.stride_seq;
    size_t es = mha_dtype_size(dtype);
    mk_widen_fn *widen = t->widen[dtype];
    for (int64_t j = 0, run; j < n; j += run) {
        const char *x;
        const float *scale;
        run = mha_kv_run(p, rb, value, k0 + j, n - j, &x, &scale);
        for (int64_t r = 0; r < run; r++) {
            float *y = buf + (j + r) * width;
            if (r + MHA_COPY_AHEAD < run)
                mk_fetch_run(x + (size_t)((r + MHA_COPY_AHEAD) * stride) * es,
                             (size_t)width * es, 0);
            widen(x + (size_t)(r * stride) * es, width, y);
            if (scale) {
                float sc = scale[r * scale_ss];
                for (int64_t c = 0; c < width; c++)
                    y[c] *= sc;
            }
        }
    }
}

/* The same rows read in place when they are fp32 rows at one stride
 * (*ld), else gathered into buf (*ld = width). */
static const float *f32_rows(const mk_table *t, const mha_problem *p,
                             const mha_row_block *rb, int value, int64_t k0,
                             int64_t n, float *buf, ptrdiff_t *ld)
{
    const char *x;
    const float *scale;
    if ((value ? p->v_dtype : p->k_dtype) == MHA_F32 &&
        mha_kv_run(p, rb, value, k0, n, &x, &scale) == n) {
        *ld = value ? p->v_ss : p->k_ss;
        return (const float *)x;
    }
    gather_rows(t, p, rb, value, k0, n, buf);
    *ld = value ? p->dv : p->d;
    return buf;
}

/* Keeps [lo, hi) of a cached head contiguous: a block at k0 that neither
 * extends nor lies inside it restarts the copy there. Returns whether keys
 * [k0, k0 + n) must be (re)written. */
static int cache_claim(int64_t *owner, int64_t *lo, int64_t *hi,
                       int64_t head, int64_t k0, int64_t n)
{
    if (*owner != head || k0 < *lo || k0 > *hi) {
        *owner = head;
        *lo = *hi = k0;
    }
    if (k0 + n <= *hi)
        return 0;
    *hi = k0 + n; /* a partly copied last block is written again whole */
    return 1;
}

/* Values [k0, k0 + nk) of the row block's head as contiguous fp32 rows
 * (*ld = dv) from the thread's copy of the head. fp32 values already
 * contiguous rows of a dense head are read in place. */
static const float *cached_values(const mk_table *t, const mha_problem *p,
                                  const mha_row_block *rb,
                                  const mha_scratch *sc, int64_t k0,
                                  int64_t nk, ptrdiff_t *ld)
{
    int64_t dv = p->dv;
    if (p->v_dtype == MHA_F32 && p->v_ss == dv && !rb->pages)
        return f32_rows(t, p, rb, 1, k0, nk, NULL, ld);
    mha_head_cache *c = sc->cache;
    float *dst = sc->vw + k0 * dv;
    if (cache_claim(&c->vhead, &c->vlo, &c->vhi, rb->cache_id, k0, nk))
        gather_rows(t, p, rb, 1, k0, nk, dst);
    *ld = dv;
    return dst;
}

/* Keys [k0, k0 + nk) of the row block's head, widened (and scaled) to
 * fp32 when stored narrower, packed into kp. */
static void pack_keys(const mk_table *t, const mha_problem *p,
                      const mha_row_block *rb, const mha_scratch *sc,
                      int64_t k0, int64_t nk, float *kp)
{
    ptrdiff_t ldk;
    const float *k = f32_rows(t, p, rb, 0, k0, nk, sc->kw, &ldk);
    t->pack(k, ldk, nk, p->d, kp);
}

/* Half compute (pl->half): rows [k0, k0 + n) of the row block's K (value
 * 0) or V head in place, as half codes at stride *ld. */
static const uint16_t *half_rows(const mha_problem *p,
                                 const mha_row_block *rb, int value,
                                 int64_t k0, int64_t n, ptrdiff_t *ld)
{
    const char *x;
    const float *scale;
    int64_t run = mha_kv_run(p, rb, value, k0, n, &x, &scale);
    (void)run; /* a dense cache: one run (half_native in plan.c) */
    *ld = value ? p->v_ss : p->k_ss;
    return (const uint16_t *)(const void *)x;
}

/* Half compute: values [k0, k0 + nk) as the pairs h->pv reads (*cb:
 * its column block stride), packed into vw a key block at a time (each
 * block's pack as big as a full block's) and kept across the head's row
 * blocks with the head cache. k0 is a block's start, or an even key of a
 * block ensure_cached packed whole. */
static const float *half_values(const mk_half_slots *h,
                                const mha_problem *p,
                                const mha_row_block *rb,
                                const mha_scratch *sc, int64_t k0,
                                int64_t nk, ptrdiff_t *cb)
{
    int64_t bk = rb->key_block, kb = k0 / bk * bk;
    float *block = sc->vw;
    int pack = 1;
    *cb = (ptrdiff_t)h->packed_v_floats(bk, 1);
    if (sc->cache) {
        mha_head_cache *c = sc->cache;
        block += h->packed_v_floats(kb, p->dv);
        pack = cache_claim(&c->vhead, &c->vlo, &c->vhi, rb->cache_id, k0, nk);
    }
    float *at = block + h->packed_v_floats(k0 - kb, 1);
    if (pack) {
        ptrdiff_t ldv;
        const uint16_t *v = half_rows(p, rb, 1, k0, nk, &ldv);
        h->pack_v(v, ldv, nk, p->dv, at, *cb);
    }
    return at;
}

/* Whether the half step hands P to P·V as codes (the slots' codes pair,
 * kernels.h): when the set has the pair and nothing else reads P, i.e. no
 * weights output (its normalize reads P as floats). */
static int half_codes(const mha_plan *pl, const mha_row_block *rb)
{
    return pl->half && pl->half->softmax_update_codes && pl->half->pv_codes &&
           !rb->w;
}

/* Floats of packed keys before key k0 of a head: the half slots pack
 * pairs of codes, a float's width, so their depth is d / 2. */
static size_t packed_before(const mk_table *t, const mha_problem *p,
                            const mha_plan *pl, int64_t k0)
{
    return t->packed_floats(k0, pl->half ? p->d / 2 : p->d);
}

void mha_prefill_scores(const mk_table *t, const mha_problem *p,
                        const mha_plan *pl, const mha_row_block *rb,
                        const mha_scratch *sc, float *m, int64_t k0,
                        int64_t nk, float *row_sum)
{
    mk_mask mk = mha_block_mask(rb, k0, nk);
    float *kp = sc->kp;
    int pack = 1;
    if (sc->cache) {
        /* Blocks start at multiples of block_k, a multiple of the packing
         * panel, so block k0 sits at packed_floats(k0, d) in the head's
         * pack. */
        mha_head_cache *c = sc->cache;
        kp += packed_before(t, p, pl, k0);
        pack = cache_claim(&c->head, &c->lo, &c->hi, rb->cache_id, k0, nk);
    }
    if (pl->half) {
        ptrdiff_t ldk;
        if (pack) {
            const uint16_t *k = half_rows(p, rb, 0, k0, nk, &ldk);
            pl->half->pack(k, ldk, nk, p->d, kp);
        }
        pl->half->qk((const uint16_t *)(const void *)rb->q_src, rb->ldq_src,
                     rb->rows, kp, nk, p->d, sc->s, rb->s_ld);
    } else {
        if (pack)
            pack_keys(t, p, rb, sc, k0, nk, kp);
        t->qk(rb->q, rb->ldq, rb->rows, kp, nk, p->d, sc->s, rb->s_ld);
    }
    mk_softmax_update_fn *step = t->softmax_update;
    if (pl->half)
        step = half_codes(pl, rb) ? pl->half->softmax_update_codes
                                  : pl->half->softmax_update;
    step(sc->s, rb->s_ld, rb->rows, nk, p->scale, &mk, m, row_sum,
         sc->alpha);
}

/* One key block through (part of) the row block; with finish (fp32
 * compute, the block's last keys) P·V writes the normalised output rows
 * (pv_finish) instead of o. */
static void key_step(const mk_table *t, const mha_problem *p,
                     const mha_plan *pl, const mha_row_block *rb,
                     const mha_scratch *sc, int64_t k0, int64_t nk, float *o,
                     float *m, float *l, int finish)
{
    int64_t ld = rb->s_ld, dv = p->dv;
    mha_prefill_scores(t, p, pl, rb, sc, m, k0, nk, rb->w ? sc->l2 : l);
    if (rb->w)
        t->normalize(sc->s, ld, rb->rows, nk, l, rb->w + k0, rb->w_ld,
                     mha_streams_out(p, rb->rows));
    ptrdiff_t ldv;
    if (pl->half) { /* P is, or becomes, half codes in sc->s */
        const float *vp = half_values(pl->half, p, rb, sc, k0, nk, &ldv);
        (half_codes(pl, rb) ? pl->half->pv_codes : pl->half->pv)(
            sc->s, ld, rb->rows, nk, vp, ldv, dv, sc->alpha, o, dv);
        return;
    }
    const float *v;
    if (sc->cache)
        v = cached_values(t, p, rb, sc, k0, nk, &ldv);
    else if (pl->gather_v && mha_gathers_values(p, rb->rows)) {
        gather_rows(t, p, rb, 1, k0, nk, sc->vw);
        v = sc->vw;
        ldv = dv;
    } else
        v = f32_rows(t, p, rb, 1, k0, nk, sc->vw, &ldv);
    if (finish)
        t->pv_finish(sc->s, ld, rb->rows, nk, v, ldv, dv, sc->alpha, o, dv, l,
                     rb->out, rb->ldo, mha_streams_out(p, rb->rows));
    else
        t->pv(sc->s, ld, rb->rows, nk, v, ldv, dv, sc->alpha, o, dv);
}

/* Packs keys [k0, k0 + nk) of the row block's head into the head cache
 * and copies its values, as key_step would. */
static void ensure_cached(const mk_table *t, const mha_problem *p,
                          const mha_plan *pl, const mha_row_block *rb,
                          const mha_scratch *sc, int64_t k0, int64_t nk)
{
    mha_head_cache *c = sc->cache;
    int pack = cache_claim(&c->head, &c->lo, &c->hi, rb->cache_id, k0, nk);
    float *kp = sc->kp + packed_before(t, p, pl, k0);
    ptrdiff_t ld;
    if (pl->half) {
        if (pack) {
            const uint16_t *k = half_rows(p, rb, 0, k0, nk, &ld);
            pl->half->pack(k, ld, nk, p->d, kp);
        }
        half_values(pl->half, p, rb, sc, k0, nk, &ld);
        return;
    }
    if (pack)
        pack_keys(t, p, rb, sc, k0, nk, kp);
    cached_values(t, p, rb, sc, k0, nk, &ld);
}

/* Rows of the causal diagonal processed together: a multiple of every
 * table's row tile (generic 4, avx2 6, neon 8, avx512 12). */
#define DIAG_ROWS 48

/* Whether key block [k0, k0 + nk) is cut into row sub-blocks: it crosses
 * the causal diagonal (the first rows see only part of it) or a window's
 * left edge (the last rows see only part of it) by more than a sub-block.
 * Only with the head cache (the sub-blocks share one packing) and without
 * weights (whose rows are written whole). */
static int splits_rows(const mha_row_block *rb, const mha_scratch *sc,
                       int64_t k0, int64_t nk)
{
    if (!sc->cache || rb->w || rb->rows <= DIAG_ROWS || rb->ilv > 1)
        return 0;
    int diagonal = rb->diag_hi != MK_NO_DIAG_HI &&
                   rb->diag_hi + DIAG_ROWS < k0 + nk;
    int left_edge = rb->diag_lo != MK_NO_DIAG_LO &&
                    rb->rows - 1 + rb->diag_lo > k0 + DIAG_ROWS;
    return diagonal || left_edge;
}

/* Rows [r, r + n) of a row block (n cut at its end). */
static mha_row_block sub_block(const mha_problem *p, const mha_row_block *rb,
                               int64_t r, int64_t n)
{
    mha_row_block sub = *rb;
    sub.rows = rb->rows - r < n ? rb->rows - r : n;
    if (sub.q) /* NULL when the half slots read q_src */
        sub.q += r * rb->ldq;
    sub.q_src += (size_t)(r * rb->ldq_src) * mha_dtype_size(p->compute);
    sub.out += r * rb->ldo;
    if (sub.keep)
        sub.keep += r * rb->keep_ld;
    if (sub.bias)
        sub.bias += r * rb->bias_ld;
    if (sub.diag_hi != MK_NO_DIAG_HI)
        sub.diag_hi += r;
    if (sub.diag_lo != MK_NO_DIAG_LO)
        sub.diag_lo += r;
    if (sub.alibi) {
        sub.alibi += r * rb->alibi_ld;
        sub.alibi_pos += r * rb->alibi_pos_step;
    }
    if (sub.sink)
        sub.sink += r * rb->sink_ld;
    if (sub.lse)
        sub.lse += r * rb->lse_ld;
    return sub;
}

/* mha_prefill_step, and with finish mha_prefill_finish's step: every
 * row's normalised output written, by pv_finish where the rows see keys
 * of this block, else (a sub-block left no key of it: those rows' keys
 * ended in an earlier block) by normalize. */
static void prefill_step(const mk_table *t, const mha_problem *p,
                         const mha_plan *pl, const mha_row_block *rb,
                         const mha_scratch *sc, int64_t k0, int64_t nk,
                         float *o, float *m, float *l, int finish)
{
    if (!splits_rows(rb, sc, k0, nk)) {
        key_step(t, p, pl, rb, sc, k0, nk, o, m, l, finish);
        return;
    }
    /* The whole block is packed and its values copied once into the head
     * cache; each sub-block then computes only the keys its rows see,
     * starting at a packing panel (packed_floats(1, d) / d keys) so its
     * keys' panels are found at packed_floats(start, d). */
    int64_t dv = p->dv, panel = (int64_t)t->packed_floats(1, p->d) / p->d;
    ensure_cached(t, p, pl, rb, sc, k0, nk);
    for (int64_t r = 0; r < rb->rows; r += DIAG_ROWS) {
        mha_row_block sub = sub_block(p, rb, r, DIAG_ROWS);
        int64_t lo = k0, hi = k0 + nk;
        if (sub.diag_lo != MK_NO_DIAG_LO && sub.diag_lo > lo)
            lo = k0 + (sub.diag_lo - k0) / panel * panel;
        if (sub.diag_hi != MK_NO_DIAG_HI && sub.rows + sub.diag_hi < hi)
            hi = sub.rows + sub.diag_hi;
        if (hi > lo)
            key_step(t, p, pl, &sub, sc, lo, hi - lo, o + r * dv, m + r,
                     l + r, finish);
        else if (finish)
            t->normalize(o + r * dv, dv, sub.rows, dv, l + r, sub.out,
                         sub.ldo, mha_streams_out(p, sub.rows));
    }
}

void mha_prefill_step(const mk_table *t, const mha_problem *p,
                      const mha_plan *pl, const mha_row_block *rb,
                      const mha_scratch *sc, int64_t k0, int64_t nk, float *o,
                      float *m, float *l)
{
    prefill_step(t, p, pl, rb, sc, k0, nk, o, m, l, 0);
}

int mha_prefill_finish(const mk_table *t, const mha_problem *p,
                       const mha_plan *pl, const mha_row_block *rb,
                       const mha_scratch *sc, int64_t k0, int64_t nk, float *o,
                       float *m, float *l)
{
    /* The output rows are the caller's fp32 rows (stage_rows leaves them
     * so), and no weights pass reads l2 for them. */
    if (pl->half || p->compute != MHA_F32 || rb->ilv > 1 || rb->w) {
        prefill_step(t, p, pl, rb, sc, k0, nk, o, m, l, 0);
        return 0;
    }
    prefill_step(t, p, pl, rb, sc, k0, nk, o, m, l, 1);
    return 1;
}
