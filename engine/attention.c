/* The attention loop of DESIGN.md. Work is cut into items whose sizes
 * depend only on the shape: (batch, head, query block) — or, for decode
 * with grouped-query attention, (batch, kv head, block of the group's
 * query heads), so each K/V byte is read once per kv head — times a number
 * of key chunks. Each item streams its key blocks through the kernels,
 * keeping the running max, sum and accumulator in thread scratch. When the
 * keys are split into chunks, the partial (max, sum, accumulator) triples
 * are merged in chunk order, so results never depend on the thread count. */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "engine.h"

_Static_assert(MK_F32 == (int)MHA_F32 && MK_F16 == (int)MHA_F16 &&
                   MK_BF16 == (int)MHA_BF16,
               "mk_dtype mirrors mha_dtype");

/* Split the keys until there are this many items (a fixed number, not the
 * thread count), with chunks of at least SPLIT_MIN_KEYS keys. */
#define SPLIT_TARGET_ITEMS 64
#define SPLIT_MIN_KEYS 512

/* Decode over K/V rows at least a page apart (a [B, L, H, D] cache): keys
 * in chunks of this many, taken chunk by chunk across the heads of a batch
 * (see make_plan). */
#define PAGED_CHUNK_KEYS 256
#define PAGE_BYTES 4096

typedef struct {
    int grouped;        /* rows are query heads of one kv group (Lq == 1) */
    int decode;         /* rows <= MK_DECODE_ROWS: K and V read in place */
    int key_major;      /* items run chunk by chunk across a batch's heads */
    int64_t group;      /* query heads per kv head */
    int64_t rows;       /* rows per block: block_q */
    int64_t row_blocks; /* per (batch, head) or per (batch, kv head) */
    int64_t units;      /* batch x heads-or-kv-heads x row_blocks */
    int64_t chunks;     /* key chunks per unit */
    int64_t chunk_len;  /* keys per chunk, a multiple of block_k */
} plan;

static plan make_plan(const mk_table *t, const mha_problem *p)
{
    plan pl;
    pl.group = p->heads / p->kv_heads;
    pl.grouped = p->lq == 1 && pl.group > 1;
    int64_t per = pl.grouped ? pl.group : p->lq;
    /* Rows per block: block_q, or fewer when there are fewer (decode), so
     * the split partials stay small. */
    pl.rows = per < t->block_q ? per : t->block_q;
    pl.decode = pl.rows <= MK_DECODE_ROWS;
    pl.row_blocks = (per + pl.rows - 1) / pl.rows;
    pl.units = p->batch * (pl.grouped ? p->kv_heads : p->heads) *
               pl.row_blocks;
    pl.chunks = 1;
    if (!p->weights && pl.units < SPLIT_TARGET_ITEMS) {
        int64_t want = (SPLIT_TARGET_ITEMS + pl.units - 1) / pl.units;
        int64_t most = p->lk / SPLIT_MIN_KEYS;
        pl.chunks = want < most ? want : most;
        if (pl.chunks < 1)
            pl.chunks = 1;
    }
    /* Decode with each key row a page or more from the next: every row is
     * a TLB entry, and a head's whole cache outgrows the TLB. Short chunks
     * taken across the heads of a batch reuse a chunk's pages (and the
     * neighbouring heads' lines the prefetchers brought in) while they are
     * hot: (8,32,1,2048,128) fp32 2 threads 17.7-18.0 -> 19.0-19.4 GB/s,
     * (1,32,1,4096,128) 24.5-24.8 -> 28.6-29.0. Shape and strides decide,
     * never the thread count. */
    pl.key_major = 0;
    if (pl.decode && !p->weights &&
        p->k_ss >= (int64_t)(PAGE_BYTES / mha_dtype_size(p->k_dtype))) {
        int64_t paged = (p->lk + PAGED_CHUNK_KEYS - 1) / PAGED_CHUNK_KEYS;
        if (paged > pl.chunks)
            pl.chunks = paged;
        pl.key_major = pl.chunks > 1;
    }
    int64_t bk = t->block_k;
    pl.chunk_len = ((p->lk + pl.chunks - 1) / pl.chunks + bk - 1) / bk * bk;
    pl.chunks = (p->lk + pl.chunk_len - 1) / pl.chunk_len;
    return pl;
}

/* The packed keys and the contiguous fp32 values of the head a thread last
 * worked on: query blocks of one head reuse them instead of packing every
 * key block and copying (or widening) every value block again. */
typedef struct {
    const char *head;  /* the head's first key row, or NULL */
    int64_t upto;      /* keys [0, upto) of it are packed */
    const char *vhead; /* the head's first value row, or NULL */
    int64_t vupto;     /* values [0, vupto) of it are in the copy */
} key_cache;

/* Per-thread scratch, carved from one allocation made per call. */
typedef struct {
    float *s;     /* block_q x block_k scores, then probabilities */
    float *kp;    /* the packed key block, or a whole head's with cache */
    key_cache *cache; /* NULL: pack every key block where it is used */
    float *o;     /* block_q x dv accumulator */
    float *m, *l; /* running max and sum per row */
    float *alpha; /* per-row rescale of the accumulator */
    float *l2;    /* weights pass: a sum nobody reads */
    float *kw;    /* a half-precision key block widened to fp32 */
    float *vw;    /* a half-precision value block widened to fp32, or with
                   * cache the head's values as contiguous fp32 rows */
} scratch;

enum { NPARTS = 9 };

static int64_t round_up16(int64_t n) { return (n + 15) / 16 * 16; }

/* Whether a thread keeps a whole head's packed keys: when several query
 * blocks read the same keys (memory stays O(Lk d) per thread). */
static int caches_keys(const mk_table *t, const mha_problem *p)
{
    plan pl = make_plan(t, p);
    return pl.chunks == 1 && pl.row_blocks > 1 && !pl.decode;
}

/* Floats of each per-thread part, in order; 0 on overflow. */
static int scratch_parts(const mk_table *t, const mha_problem *p,
                         int64_t parts[NPARTS])
{
    int64_t bq = t->block_q, bk = t->block_k;
    int cache = caches_keys(t, p);
    int64_t keys = cache ? (p->lk + bk - 1) / bk * bk : bk;
    /* Decode reads K and V in place: nothing packed or widened. */
    int decode = make_plan(t, p).decode;
    size_t kp = decode ? 0 : t->packed_floats(keys, p->d);
    if (!mha_mul_ok(bq, bk, &parts[0]) || kp > (size_t)INT64_MAX / 2 ||
        !mha_mul_ok(bq, p->dv, &parts[2]))
        return 0;
    parts[1] = (int64_t)kp;
    for (int i = 3; i < 7; i++)
        parts[i] = bq;
    parts[7] = parts[8] = 0;
    int64_t values = cache ? keys : p->v_dtype != MHA_F32 ? bk : 0;
    if (!decode && ((p->k_dtype != MHA_F32 &&
                     !mha_mul_ok(bk, p->d, &parts[7])) ||
                    !mha_mul_ok(values, p->dv, &parts[8])))
        return 0;
    for (int i = 0; i < NPARTS; i++) {
        if (parts[i] > INT64_MAX - 16)
            return 0;
        parts[i] = round_up16(parts[i]);
    }
    return 1;
}

/* Floats of one chunk's partial result: rows x (dv accumulator, max, sum). */
static int64_t partial_floats(const plan *pl, const mha_problem *p)
{
    return round_up16(pl->rows * (p->dv + 2));
}

mha_status mha_attention_scratch_bytes(const mk_table *t,
                                       const mha_problem *p, int nthreads,
                                       size_t *bytes)
{
    int64_t parts[NPARTS], per = 0, total, partials = 0;
    plan pl = make_plan(t, p);
    if (!scratch_parts(t, p, parts))
        goto overflow;
    for (int i = 0; i < NPARTS; i++)
        if (!mha_add_ok(per, parts[i], &per))
            goto overflow;
    if (pl.chunks > 1 &&
        (!mha_mul_ok(pl.units * pl.chunks, partial_floats(&pl, p),
                     &partials)))
        goto overflow;
    if (!mha_mul_ok(per, nthreads, &total) ||
        !mha_add_ok(total, partials, &total) ||
        !mha_mul_ok(total, (int64_t)sizeof(float), &total))
        goto overflow;
    *bytes = (size_t)total;
    return MHA_OK;
overflow:
    return mha_fail(MHA_ERR_OVERFLOW,
                    "attention scratch for d=%lld, dv=%lld overflows",
                    (long long)p->d, (long long)p->dv);
}

static scratch thread_scratch(const mk_table *t, const mha_problem *p,
                              float *base, int tid)
{
    int64_t parts[NPARTS], per = 0;
    scratch_parts(t, p, parts); /* checked by mha_attention_scratch_bytes */
    for (int i = 0; i < NPARTS; i++)
        per += parts[i];
    float *f = base + per * tid;
    float **slot[NPARTS];
    scratch s;
    slot[0] = &s.s, slot[1] = &s.kp, slot[2] = &s.o, slot[3] = &s.m;
    s.cache = NULL;
    slot[4] = &s.l, slot[5] = &s.alpha, slot[6] = &s.l2;
    slot[7] = &s.kw, slot[8] = &s.vw;
    for (int i = 0; i < NPARTS; i++) {
        *slot[i] = f;
        f += parts[i];
    }
    return s;
}

/* A block of rows sharing one kv head: the rows are queries of one head,
 * or (grouped) the query heads of one kv group at the single query. Every
 * pointer is the block's first row; the ld fields step one row. */
typedef struct {
    int64_t rows;
    int decode; /* the plan's: decode kernels, nothing packed or widened */
    const float *q;
    ptrdiff_t ldq;
    const char *k, *v; /* bytes: the element type is the problem's */
    float *out;
    ptrdiff_t ldo;
    float *w; /* weights rows, or NULL */
    const uint8_t *keep;
    ptrdiff_t keep_ld;
    const float *bias;
    ptrdiff_t bias_ld;
    int64_t key_end;     /* keys at or past it are hidden from every row */
    int64_t causal_diag; /* key j visible to row r iff j <= r + diag */
} row_block;

static row_block make_block(const mha_problem *p, const plan *pl,
                            int64_t unit)
{
    const mha_mask *m = &p->mask;
    int64_t heads = pl->grouped ? p->kv_heads : p->heads;
    int64_t b = unit / (heads * pl->row_blocks);
    int64_t hh = unit / pl->row_blocks % heads;
    int64_t r0 = unit % pl->row_blocks * pl->rows;
    int64_t per = pl->grouped ? pl->group : p->lq;
    row_block rb;
    rb.rows = per - r0 < pl->rows ? per - r0 : pl->rows;
    rb.decode = pl->decode;
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

    rb.key_end = p->lk;
    if (m->key_lengths && m->key_lengths[b] < rb.key_end)
        rb.key_end = m->key_lengths[b];
    rb.causal_diag = MK_NO_DIAG_HI;
    if (m->causal != MHA_CAUSAL_NONE) {
        int64_t shift = m->causal == MHA_CAUSAL_BOTTOM_RIGHT ? p->lk - p->lq : 0;
        /* The last query sees the most keys; later key blocks are skipped.
         * Grouped rows share one query, so the limit alone is the mask. */
        int64_t last_query = pl->grouped ? 0 : i + rb.rows - 1;
        int64_t end = last_query + shift + 1;
        if (end < rb.key_end)
            rb.key_end = end < 0 ? 0 : end;
        if (!pl->grouped)
            rb.causal_diag = i + shift;
    }
    return rb;
}

/* Keys per block: the table's, or for decode as many as the score tile
 * holds for MK_DECODE_ROWS rows (a multiple of block_k), so the kernels
 * prefetch across long runs of rows and the per-block steps are few. */
static int64_t key_block(const mk_table *t, const row_block *rb)
{
    if (!rb->decode)
        return t->block_k;
    int64_t n = t->block_q * t->block_k / MK_DECODE_ROWS;
    n = n / t->block_k * t->block_k;
    return n > t->block_k ? n : t->block_k;
}

static mk_mask block_mask(const row_block *rb, int64_t k0, int64_t nk)
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
    mk.diag_lo = MK_NO_DIAG_LO;
    mk.diag_hi =
        rb->causal_diag == MK_NO_DIAG_HI ? MK_NO_DIAG_HI : rb->causal_diag - k0;
    mk.key_limit = nk;
    return mk;
}

/* Rows [k0, k0 + n) of a K or V head as fp32 rows of width elements: the
 * rows themselves (row stride *ld), or their widened copy in buf. */
static const float *f32_rows(const mk_table *t, const char *head,
                             mha_dtype dtype, int64_t stride, int64_t k0,
                             int64_t n, int64_t width, float *buf,
                             ptrdiff_t *ld)
{
    if (dtype == MHA_F32) {
        *ld = stride;
        return (const float *)head + k0 * stride;
    }
    const uint16_t *x = (const uint16_t *)head + k0 * stride;
    mk_widen_fn *cvt = t->widen[(mk_dtype)dtype];
    for (int64_t r = 0; r < n; r++)
        cvt(x + r * stride, width, buf + r * width);
    *ld = width;
    return buf;
}

/* Values [k0, k0 + nk) of the row block's head as contiguous fp32 rows
 * (*ld = dv) from the thread's copy of the head, extended as blocks come in
 * key order from 0 (like the packed keys). fp32 values already contiguous
 * are read in place. */
static const float *cached_values(const mk_table *t, const mha_problem *p,
                                  const row_block *rb, const scratch *sc,
                                  int64_t k0, int64_t nk, ptrdiff_t *ld)
{
    int64_t dv = p->dv;
    if (p->v_dtype == MHA_F32 && p->v_ss == dv)
        return f32_rows(t, rb->v, p->v_dtype, p->v_ss, k0, nk, dv, NULL, ld);
    key_cache *c = sc->cache;
    float *dst = sc->vw + k0 * dv;
    if (c->vhead != rb->v) {
        c->vhead = rb->v;
        c->vupto = 0;
    }
    if (k0 + nk > c->vupto) {
        if (p->v_dtype == MHA_F32) {
            const float *v = (const float *)rb->v;
            for (int64_t r = 0; r < nk; r++)
                memcpy(dst + r * dv, v + (k0 + r) * p->v_ss,
                       (size_t)dv * sizeof *dst);
        } else {
            ptrdiff_t ignored;
            f32_rows(t, rb->v, p->v_dtype, p->v_ss, k0, nk, dv, dst,
                     &ignored);
        }
        c->vupto = k0 + nk;
    }
    *ld = dv;
    return dst;
}

/* Scores of one key block, scaled, masked and turned into probabilities
 * against the running max (s, m, row_sum and alpha updated). */
static void score_block(const mk_table *t, const mha_problem *p,
                        const row_block *rb, const scratch *sc, float *m,
                        int64_t k0, int64_t nk, float *row_sum)
{
    mk_mask mk = block_mask(rb, k0, nk);
    int64_t lds = key_block(t, rb);
    if (rb->decode) {
        size_t ks = mha_dtype_size(p->k_dtype);
        t->decode_qk(rb->q, rb->ldq, rb->rows,
                     rb->k + (size_t)(k0 * p->k_ss) * ks, (mk_dtype)p->k_dtype,
                     p->k_ss, nk, p->d, sc->s, lds);
        t->softmax_update(sc->s, lds, rb->rows, nk, p->scale, &mk, m,
                          row_sum, sc->alpha);
        return;
    }
    float *kp = sc->kp;
    int pack = 1;
    if (sc->cache) {
        /* Blocks start at multiples of block_k, a multiple of the packing
         * panel, so block k0 sits at packed_k_floats(k0, d) in the head's
         * pack. Blocks come in key order from 0, so the packed prefix only
         * grows (a partly packed last block is packed again whole). */
        key_cache *c = sc->cache;
        if (c->head != rb->k) {
            c->head = rb->k;
            c->upto = 0;
        }
        kp += t->packed_floats(k0, p->d);
        pack = k0 + nk > c->upto;
        if (pack)
            c->upto = k0 + nk;
    }
    if (pack) {
        ptrdiff_t ldk;
        const float *k = f32_rows(t, rb->k, p->k_dtype, p->k_ss, k0, nk,
                                  p->d, sc->kw, &ldk);
        t->pack(k, ldk, nk, p->d, kp);
    }
    t->qk(rb->q, rb->ldq, rb->rows, kp, nk, p->d, sc->s, lds);
    t->softmax_update(sc->s, lds, rb->rows, nk, p->scale, &mk, m, row_sum,
                      sc->alpha);
}

/* One key block through the row block: scores, probabilities (weights
 * written when asked), and the accumulator update. */
static void key_step(const mk_table *t, const mha_problem *p,
                     const row_block *rb, const scratch *sc, int64_t k0,
                     int64_t nk, float *o, float *m, float *l)
{
    int64_t bk = key_block(t, rb), dv = p->dv;
    score_block(t, p, rb, sc, m, k0, nk, rb->w ? sc->l2 : l);
    if (rb->w)
        t->normalize(sc->s, bk, rb->rows, nk, l, rb->w + k0, p->lk);
    if (rb->decode) {
        size_t vs = mha_dtype_size(p->v_dtype);
        t->decode_pv(sc->s, bk, rb->rows, nk,
                     rb->v + (size_t)(k0 * p->v_ss) * vs, (mk_dtype)p->v_dtype,
                     p->v_ss, dv, sc->alpha, o, dv);
        return;
    }
    ptrdiff_t ldv;
    const float *v = sc->cache ? cached_values(t, p, rb, sc, k0, nk, &ldv)
                               : f32_rows(t, rb->v, p->v_dtype, p->v_ss, k0,
                                          nk, dv, sc->vw, &ldv);
    t->pv(sc->s, bk, rb->rows, nk, v, ldv, dv, sc->alpha, o, dv);
}

/* Rows of the causal diagonal processed together: a multiple of every
 * table's row tile (generic 4, avx2 6, neon 8, avx512 12). */
#define DIAG_ROWS 48

/* Whether key block [k0, k0 + nk) is cut into row sub-blocks: it crosses
 * the causal diagonal, so the first rows see only part of it. Only with
 * the head cache (the sub-blocks share one packing) and without weights
 * (whose rows are written whole). */
static int splits_diagonal(const row_block *rb, const scratch *sc,
                           int64_t k0, int64_t nk)
{
    return sc->cache && !rb->w && rb->causal_diag != MK_NO_DIAG_HI &&
           rb->rows > DIAG_ROWS && rb->causal_diag + DIAG_ROWS < k0 + nk;
}

/* Rows [r, r + n) of a row block (n cut at its end). */
static row_block sub_block(const row_block *rb, int64_t r, int64_t n)
{
    row_block sub = *rb;
    sub.rows = rb->rows - r < n ? rb->rows - r : n;
    sub.q += r * rb->ldq;
    sub.out += r * rb->ldo;
    if (sub.keep)
        sub.keep += r * rb->keep_ld;
    if (sub.bias)
        sub.bias += r * rb->bias_ld;
    sub.causal_diag += r;
    return sub;
}

/* Streams keys [k_begin, k_end) of a row block into the accumulator o with
 * running max m and sum l (o, m, l start empty). With weights, a first
 * pass finds each row's final max and sum and a second turns the same
 * scores into the probabilities it writes and applies. */
static void stream_keys(const mk_table *t, const mha_problem *p,
                        const row_block *rb, const scratch *sc, int64_t k_begin,
                        int64_t k_end, float *o, float *m, float *l)
{
    int64_t bk = key_block(t, rb), dv = p->dv;
    for (int64_t r = 0; r < rb->rows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        sc->l2[r] = 0.0f;
    }
    memset(o, 0, (size_t)(rb->rows * dv) * sizeof(float));
    if (rb->w)
        for (int64_t k0 = k_begin; k0 < k_end; k0 += bk)
            score_block(t, p, rb, sc, m, k0,
                        k_end - k0 < bk ? k_end - k0 : bk, l);
    for (int64_t k0 = k_begin; k0 < k_end; k0 += bk) {
        int64_t nk = k_end - k0 < bk ? k_end - k0 : bk;
        if (!splits_diagonal(rb, sc, k0, nk)) {
            key_step(t, p, rb, sc, k0, nk, o, m, l);
            continue;
        }
        /* Last sub-block first: it sees the whole key block, so the block
         * is packed (and its values copied) once for all of them. */
        for (int64_t r = (rb->rows - 1) / DIAG_ROWS * DIAG_ROWS; r >= 0;
             r -= DIAG_ROWS) {
            row_block sub = sub_block(rb, r, DIAG_ROWS);
            int64_t seen = sub.rows - 1 + sub.causal_diag - k0 + 1;
            if (seen > 0)
                key_step(t, p, &sub, sc, k0, seen < nk ? seen : nk,
                         o + r * dv, m + r, l + r);
        }
    }
    if (rb->w && k_end < p->lk)
        for (int64_t r = 0; r < rb->rows; r++)
            memset(rb->w + r * p->lk + k_end, 0,
                   (size_t)(p->lk - k_end) * sizeof(float));
}

/* Combines the chunks' partial results of one row block in chunk order and
 * writes the normalised rows. Each partial holds rows x dv accumulator,
 * then rows maxima, then rows sums; the first is reused as the total. */
static void merge_chunks(const mk_table *t, const mha_problem *p,
                         const plan *pl, const row_block *rb, float *parts)
{
    int64_t dv = p->dv, stride = partial_floats(pl, p);
    float *acc = parts, *macc = acc + pl->rows * dv, *lacc = macc + pl->rows;
    for (int64_t r = 0; r < rb->rows; r++) {
        float mx = -INFINITY;
        for (int64_t c = 0; c < pl->chunks; c++) {
            float mc = parts[c * stride + pl->rows * dv + r];
            mx = mc > mx || mc != mc ? mc : mx; /* NaN sticks */
        }
        float *orow = acc + r * dv;
        float sum = 0.0f;
        for (int64_t c = 0; c < pl->chunks; c++) {
            const float *part = parts + c * stride;
            float mc = part[pl->rows * dv + r];
            float f = mc == -INFINITY ? 0.0f : expf(mc - mx);
            sum += f * part[pl->rows * dv + pl->rows + r];
            if (c == 0)
                for (int64_t x = 0; x < dv; x++)
                    orow[x] *= f;
            else
                for (int64_t x = 0; x < dv; x++)
                    orow[x] += f * part[r * dv + x];
        }
        lacc[r] = mx == -INFINITY ? 0.0f : sum;
        macc[r] = mx;
    }
    t->normalize(acc, dv, rb->rows, dv, lacc, rb->out, rb->ldo);
}

void mha_attention_run(const mk_table *t, const mha_problem *p,
                       void *scratch_mem, int nthreads)
{
    plan pl = make_plan(t, p);
    int64_t items = pl.units * pl.chunks, pstride = partial_floats(&pl, p);
    float *partials = scratch_mem;
    float *thread_mem = pl.chunks > 1 ? partials + items * pstride : partials;
    /* With the head cache and heads enough for every thread, a thread takes
     * a head's query blocks together, so each head is packed by one thread
     * (which thread computes an item never changes its result). */
    int cache_heads = caches_keys(t, p);
    int64_t grab = cache_heads && pl.units / pl.row_blocks >= 2 * nthreads
                       ? pl.row_blocks
                       : 1;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && items > 1)
    {
        scratch sc = thread_scratch(t, p, thread_mem, omp_get_thread_num());
        key_cache cache = {NULL, 0, NULL, 0};
        sc.cache = cache_heads ? &cache : NULL;
#pragma omp for schedule(dynamic, grab)
        for (int64_t it = 0; it < items; it++) {
            int64_t unit = it / pl.chunks, c = it % pl.chunks;
            if (pl.key_major) { /* (batch, chunk, unit of the batch) */
                int64_t per_batch = pl.units / p->batch;
                c = it / per_batch % pl.chunks;
                unit = it / (per_batch * pl.chunks) * per_batch + it % per_batch;
            }
            row_block rb = make_block(p, &pl, unit);
            int64_t k0 = c * pl.chunk_len;
            int64_t k1 = k0 + pl.chunk_len < rb.key_end ? k0 + pl.chunk_len
                                                        : rb.key_end;
            if (pl.chunks == 1) {
                stream_keys(t, p, &rb, &sc, 0, rb.key_end, sc.o, sc.m, sc.l);
                t->normalize(sc.o, p->dv, rb.rows, p->dv, sc.l, rb.out,
                             rb.ldo);
                continue;
            }
            float *part = partials + (unit * pl.chunks + c) * pstride;
            float *o = part, *m = o + pl.rows * p->dv, *l = m + pl.rows;
            stream_keys(t, p, &rb, &sc, k0, k1 > k0 ? k1 : k0, o, m, l);
        }
        if (pl.chunks > 1) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t u = 0; u < pl.units; u++) {
                row_block rb = make_block(p, &pl, u);
                merge_chunks(t, p, &pl, &rb,
                             partials + u * pl.chunks * pstride);
            }
        }
    }
}

mha_status mha_attention(const mha_engine *engine,
                         const mha_attention_args *args)
{
    if (!engine)
        return mha_fail(MHA_ERR_NULL_POINTER, "engine is NULL");
    mha_problem p;
    mha_status st = mha_validate_attention(args, &p);
    if (st != MHA_OK)
        return st;
    int nthreads = mha_threads_for_call(engine);
    size_t bytes;
    if ((st = mha_attention_scratch_bytes(&engine->kernels, &p, nthreads,
                                          &bytes)) != MHA_OK)
        return st;
    void *mem = mha_alloc(bytes);
    if (!mem)
        return mha_fail(MHA_ERR_OUT_OF_MEMORY,
                        "attention scratch of %zu bytes", bytes);
    mha_attention_run(&engine->kernels, &p, mem, nthreads);
    mha_free(mem);
    return MHA_OK;
}
