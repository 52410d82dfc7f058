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
    mk_mask mk = mha_block_mask(rb, k0, nk);
    size_t ks = mha_dtype_size(p->k_dtype);
    int64_t kss = p->k_scales.stride_seq;
    t->decode_qk(rb->q, rb->ldq, rb->rows, rb->k + (size_t)(k0 * p->k_ss) * ks,
                 (mk_dtype)p->k_dtype, p->k_ss,
                 rb->ks ? rb->ks + k0 * kss : NULL, kss, nk, p->d, sc->s,
                 pl->key_block);
    t->softmax_update(sc->s, pl->key_block, rb->rows, nk, p->scale, &mk, m,
                      row_sum, sc->alpha);
}

void mha_decode_step(const mk_table *t, const mha_problem *p,
                     const mha_plan *pl, const mha_row_block *rb,
                     const mha_scratch *sc, int64_t k0, int64_t nk, float *o,
                     float *m, float *l)
{
    int64_t bk = pl->key_block;
    mha_decode_scores(t, p, pl, rb, sc, m, k0, nk, rb->w ? sc->l2 : l);
    if (rb->w)
        t->normalize(sc->s, bk, rb->rows, nk, l, rb->w + k0, p->lk);
    size_t vs = mha_dtype_size(p->v_dtype);
    int64_t vss = p->v_scales.stride_seq;
    t->decode_pv(sc->s, bk, rb->rows, nk,
                 rb->v + (size_t)(k0 * p->v_ss) * vs, (mk_dtype)p->v_dtype,
                 p->v_ss, rb->vs ? rb->vs + k0 * vss : NULL, vss, p->dv,
                 sc->alpha, o, p->dv);
}
