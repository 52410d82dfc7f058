/* The decode stream: blocks of at most MK_DECODE_ROWS query rows (Lq <= 8,
 * or a grouped-query group at Lq = 1). K and V rows are read in place by
 * the decode kernels, any storage dtype widened in registers: nothing is
 * packed or copied, so each K/V byte travels from memory once.
 * docs/design.md, "Data path of one call". */
#include "attention.h"

void mha_decode_scores(const mk_table *t, const mha_problem *p,
                       const mha_plan *pl, const mha_row_block *rb,
                       const mha_scratch *sc, float *m, int64_t k0,
                       int64_t nk, float *row_sum)
{
    (void)pl;
    mk_mask mk = mha_block_mask(rb, k0, nk);
    int64_t kss = p->k_scales.stride_seq;
    /* One kernel call per run of rows at one stride (a paged cache's
     * block), each filling its columns of the score tile. */
    for (int64_t j = 0, run; j < nk; j += run) {
        const char *k;
        const float *ks;
        run = mha_kv_run(p, rb, 0, k0 + j, nk - j, &k, &ks);
        t->decode_qk(rb->q, rb->ldq, rb->rows, k, (mk_dtype)p->k_dtype,
                     p->k_ss, ks, kss, run, p->d, sc->s + j, rb->key_block);
    }
    t->softmax_update(sc->s, rb->key_block, rb->rows, nk, p->scale, &mk, m,
                      row_sum, sc->alpha);
}

void mha_decode_step(const mk_table *t, const mha_problem *p,
                     const mha_plan *pl, const mha_row_block *rb,
                     const mha_scratch *sc, int64_t k0, int64_t nk, float *o,
                     float *m, float *l)
{
    int64_t bk = rb->key_block;
    mha_decode_scores(t, p, pl, rb, sc, m, k0, nk, rb->w ? sc->l2 : l);
    if (rb->w)
        t->normalize(sc->s, bk, rb->rows, nk, l, rb->w + k0, rb->w_ld);
    int64_t vss = p->v_scales.stride_seq;
    for (int64_t j = 0, run; j < nk; j += run) {
        const char *v;
        const float *vs;
        run = mha_kv_run(p, rb, 1, k0 + j, nk - j, &v, &vs);
        t->decode_pv(sc->s + j, bk, rb->rows, run, v, (mk_dtype)p->v_dtype,
                     p->v_ss, vs, vss, p->dv, sc->alpha, o, p->dv);
        /* The accumulator is rescaled once per block: later runs add. */
        if (j == 0 && run < nk)
            for (int64_t r = 0; r < rb->rows; r++)
                sc->alpha[r] = 1.0f;
    }
}
