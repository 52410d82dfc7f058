/* The decode stream: blocks of at most MK_DECODE_ROWS query rows (Lq <= 8,
 * or a grouped-query group at Lq = 1), or at Lq = 1 the query heads of
 * several kv heads read key by key across them (rb->kv_group: the kernels
 * take mk_heads; docs/design.md, "Plan and scratch"). K and V rows are read in place by
 * the decode kernels, any storage dtype widened in registers: nothing is
 * packed or copied, so each K/V byte travels from memory once.
 * docs/design.md, "Data path of one call". */
#include "attention.h"

/* Rows [k0, k0 + nk) of the row block's K (value 0) or V head as the
 * decode kernels take them: from a first row at the head's stride, or
 * for a paged cache through a row table (in the thread's scratch, with
 * the rows' scales gathered beside it: per row, or per row and kv head
 * for a block across kv heads), so one call covers the key block across
 * its cache blocks and prefetches across them too. */
typedef struct {
    const char *first;
    const void *const *rows;
    const float *scales;
    ptrdiff_t scales_ld;
} kv_rows;

static kv_rows rows_of(const mha_problem *p, const mha_row_block *rb,
                       const mha_scratch *sc, int value, int64_t k0,
                       int64_t nk, int64_t *more)
{
    size_t es = mha_dtype_size(value ? p->v_dtype : p->k_dtype);
    int64_t stride = value ? p->v_ss : p->k_ss;
    int64_t sss = value ? p->v_scales.stride_seq : p->k_scales.stride_seq;
    const float *head_scales = value ? rb->vs : rb->ks;
    kv_rows kv = {(value ? rb->v : rb->k) + (size_t)(k0 * stride) * es, NULL,
                  head_scales ? head_scales + k0 * sss : NULL, sss};
    /* Across kv heads the kernels may prefetch the next MK_HEADS_AHEAD
     * keys the row block reads (mk_heads.more), so the fetch ahead runs on
     * into the next call (and its cache blocks) instead of restarting
     * unfetched every SPAN_KEYS keys; a row table runs on that far. */
    *more = 0;
    if (rb->kv_group) {
        int64_t left = rb->key_end - (k0 + nk);
        *more = left < MK_HEADS_AHEAD ? (left > 0 ? left : 0)
                                      : MK_HEADS_AHEAD;
    }
    if (!rb->pages)
        return kv;
    const void **rows = value ? sc->v_rows : sc->k_rows;
    float *scale = value ? sc->v_scales : sc->k_scales;
    const float *sr = NULL;
    /* Across kv heads, every head's scale of a row: g heads per row. */
    int64_t g = rb->kv_group ? (rb->rows + rb->kv_group - 1) / rb->kv_group
                             : 1;
    ptrdiff_t hs = value ? rb->vs_hs : rb->ks_hs;
    for (int64_t j = 0, run; j < nk + *more; j += run) {
        const char *x;
        const float *xs;
        run = mha_kv_run(p, rb, value, k0 + j, nk + *more - j, &x, &xs);
        if (j < nk)
            sr = xs;
        for (int64_t r = 0; r < run; r++) {
            rows[j + r] = x + (size_t)(r * stride) * es;
            for (int64_t h = 0; xs && j + r < nk && h < g; h++)
                scale[(j + r) * g + h] = xs[r * sss + h * hs];
        }
    }
    kv.rows = rows;
    kv.scales = sr ? scale : NULL;
    kv.scales_ld = g;
    return kv;
}

/* How far ahead the kernels' fetch across kv heads may reach: two thirds
 * of L1 (32 KiB on a 48 KiB L1), never more than MK_HEADS_AHEAD_BYTES. */
static int64_t heads_ahead_bytes(void)
{
    int64_t b = mha_cpu_l1d_bytes() / 3 * 2;
    return b < MK_HEADS_AHEAD_BYTES ? b : MK_HEADS_AHEAD_BYTES;
}

/* Whether that fetch may go into L1: only where the whole distance fits
 * two thirds of it (48 KiB or more), and not on Intel's cores. Beside the
 * block's queries or outputs (16 KiB for 32 fp32 heads at d = 128), a
 * fetch into a 32 KiB L1 evicts the rows before they are read: [B, L, H,
 * D] decode into L1 read 0.5-0.7x its rate into L2 on Zen 4, where into
 * L1 is 1.1-1.3x on Zen 5. Intel's 48 KiB L1 (Xeon model 207) is Zen 5's
 * size but not its behaviour: into L1, [B, L, H, D] read 0.83-0.87x [B,
 * H, L, D] (fp32, f16, bf16); into L2, 0.95-0.99x (docs/benchmarks.md). */
static int heads_fetch_into_l1(void)
{
    return !mha_cpu_is_intel() &&
           mha_cpu_l1d_bytes() / 3 * 2 >= MK_HEADS_AHEAD_BYTES;
}

/* The bytes a pass of the kernels' loops across kv heads may hold in L1:
 * its query (output) rows and each kv head's run of one position, three
 * quarters of L1. 32 fp32 heads at d = 128 hold 16 KiB of queries and a
 * 16 KiB run: a 32 KiB L1 cannot also keep the rows fetched ahead, and
 * passes of 16 heads over each key block read [B, L, H, D] fp32 faster on
 * Zen 4; fp16 (24 KiB) fits and keeps one pass, as does every type on a
 * 48 KiB L1 (docs/benchmarks.md). */
static int64_t heads_pass_bytes(void)
{
    return mha_cpu_l1d_bytes() / 4 * 3;
}

void mha_decode_scores(const mk_table *t, const mha_problem *p,
                       const mha_plan *pl, const mha_row_block *rb,
                       const mha_scratch *sc, float *m, int64_t k0,
                       int64_t nk, float *row_sum)
{
    (void)pl;
    mk_mask mk = mha_block_mask(rb, k0, nk);
    int64_t more;
    kv_rows k = rows_of(p, rb, sc, 0, k0, nk, &more);
    mk_heads heads = {rb->kv_group, rb->k_hs, k.rows ? 1 : rb->ks_hs, more,
                      heads_ahead_bytes(), heads_fetch_into_l1(),
                      heads_pass_bytes()};
    t->decode_qk(rb->q, rb->ldq, rb->rows, k.first, (mk_dtype)p->k_dtype,
                 p->k_ss, k.rows, k.scales, k.scales_ld, nk, p->d, sc->s,
                 rb->s_ld, rb->kv_group ? &heads : NULL);
    t->softmax_update(sc->s, rb->s_ld, rb->rows, nk, p->scale, &mk, m,
                      row_sum, sc->alpha);
}

void mha_decode_step(const mk_table *t, const mha_problem *p,
                     const mha_plan *pl, const mha_row_block *rb,
                     const mha_scratch *sc, int64_t k0, int64_t nk, float *o,
                     float *m, float *l)
{
    int64_t bk = rb->s_ld;
    mha_decode_scores(t, p, pl, rb, sc, m, k0, nk, rb->w ? sc->l2 : l);
    if (rb->w)
        t->normalize(sc->s, bk, rb->rows, nk, l, rb->w + k0, rb->w_ld,
                     mha_streams_out(p, rb->rows));
    int64_t more;
    kv_rows v = rows_of(p, rb, sc, 1, k0, nk, &more);
    mk_heads heads = {rb->kv_group, rb->v_hs, v.rows ? 1 : rb->vs_hs, more,
                      heads_ahead_bytes(), heads_fetch_into_l1(),
                      heads_pass_bytes()};
    t->decode_pv(sc->s, bk, rb->rows, nk, v.first, (mk_dtype)p->v_dtype,
                 p->v_ss, v.rows, v.scales, v.scales_ld, p->dv, sc->alpha, o,
                 p->dv, rb->kv_group ? &heads : NULL);
}
