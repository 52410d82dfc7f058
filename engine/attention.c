/* The attention loop of DESIGN.md: work items (batch, head, query block)
 * split over OpenMP threads; per item, stream the key blocks through the
 * kernels keeping the running max, sum and accumulator in thread scratch. */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "engine.h"

/* Per-thread scratch, carved from one allocation made per call. */
typedef struct {
    float *s;     /* block_q x block_k scores, then probabilities */
    float *kp;    /* the packed key block */
    float *o;     /* block_q x dv accumulator */
    float *m, *l; /* running max and sum per row */
    float *alpha; /* per-row rescale of the accumulator */
    float *l2;    /* weights pass: a sum nobody reads */
} scratch;

#define ALIGN_FLOATS 16 /* 64 bytes */

static int64_t round_up(int64_t n) { return (n + 15) / 16 * 16; }

/* Floats of each scratch part, in order; 0 on overflow. */
static int scratch_parts(const mk_table *t, const mha_problem *p,
                         int64_t parts[7])
{
    int64_t bq = t->block_q, bk = t->block_k;
    size_t kp = t->packed_k_floats(bk, p->d);
    if (!mha_mul_ok(bq, bk, &parts[0]) || kp > (size_t)INT64_MAX / 2 ||
        !mha_mul_ok(bq, p->dv, &parts[2]))
        return 0;
    parts[1] = (int64_t)kp;
    for (int i = 3; i < 7; i++)
        parts[i] = bq;
    for (int i = 0; i < 7; i++) {
        if (parts[i] > INT64_MAX - ALIGN_FLOATS)
            return 0;
        parts[i] = round_up(parts[i]);
    }
    return 1;
}

mha_status mha_attention_scratch_bytes(const mk_table *t,
                                       const mha_problem *p, int nthreads,
                                       size_t *bytes)
{
    int64_t parts[7], per = 0, total;
    if (!scratch_parts(t, p, parts))
        goto overflow;
    for (int i = 0; i < 7; i++)
        if (!mha_add_ok(per, parts[i], &per))
            goto overflow;
    if (!mha_mul_ok(per, nthreads, &total) ||
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
                              void *base, int tid)
{
    int64_t parts[7], per = 0;
    scratch_parts(t, p, parts); /* checked by mha_attention_scratch_bytes */
    for (int i = 0; i < 7; i++)
        per += parts[i];
    float *f = (float *)base + per * tid;
    float **slot[7];
    scratch s;
    slot[0] = &s.s, slot[1] = &s.kp, slot[2] = &s.o, slot[3] = &s.m;
    slot[4] = &s.l, slot[5] = &s.alpha, slot[6] = &s.l2;
    for (int i = 0; i < 7; i++) {
        *slot[i] = f;
        f += parts[i];
    }
    return s;
}

/* One (batch, head, query block) work item. */
typedef struct {
    int64_t b, h, q0, mq;
    const float *q, *k, *v; /* first row of the block / of the head */
    int64_t key_end;        /* keys at or past it are hidden from all rows */
    int64_t causal_shift;   /* key j visible to query i iff j <= i + shift */
    int causal;
} work_item;

static work_item make_item(const mha_problem *p, int64_t bq, int64_t index)
{
    int64_t nqb = (p->lq + bq - 1) / bq;
    work_item w;
    w.b = index / (p->heads * nqb);
    w.h = index / nqb % p->heads;
    w.q0 = index % nqb * bq;
    w.mq = p->lq - w.q0 < bq ? p->lq - w.q0 : bq;
    int64_t hk = w.h / (p->heads / p->kv_heads);
    w.q = p->q + w.b * p->q_sb + w.q0 * p->q_ss + w.h * p->q_sh;
    w.k = p->k + w.b * p->k_sb + hk * p->k_sh;
    w.v = p->v + w.b * p->v_sb + hk * p->v_sh;
    w.key_end = p->lk;
    if (p->mask.key_lengths && p->mask.key_lengths[w.b] < w.key_end)
        w.key_end = p->mask.key_lengths[w.b];
    w.causal = p->mask.causal != MHA_CAUSAL_NONE;
    w.causal_shift =
        p->mask.causal == MHA_CAUSAL_BOTTOM_RIGHT ? p->lk - p->lq : 0;
    if (w.causal) {
        /* The block's last row sees the most keys; later ones are skipped. */
        int64_t last_visible = w.q0 + w.mq - 1 + w.causal_shift;
        if (last_visible + 1 < w.key_end)
            w.key_end = last_visible + 1 < 0 ? 0 : last_visible + 1;
    }
    return w;
}

static mk_mask block_mask(const mha_problem *p, const work_item *w,
                          int64_t k0, int64_t nk)
{
    const mha_mask *m = &p->mask;
    mk_mask mk = {0};
    if (m->keep) {
        mk.keep = m->keep + w->b * m->keep_stride_batch +
                  w->h * m->keep_stride_head + w->q0 * m->keep_stride_query +
                  k0;
        mk.keep_ld = m->keep_stride_query;
    }
    if (m->bias) {
        mk.bias = m->bias + w->b * m->bias_stride_batch +
                  w->h * m->bias_stride_head + w->q0 * m->bias_stride_query +
                  k0;
        mk.bias_ld = m->bias_stride_query;
    }
    mk.causal_diag =
        w->causal ? w->q0 + w->causal_shift - k0 : MK_NO_CAUSAL;
    mk.key_limit = nk;
    return mk;
}

/* Scores of one key block, scaled, masked and turned into probabilities
 * against the running max (s, m, l and alpha updated). */
static void score_block(const mk_table *t, const mha_problem *p,
                        const work_item *w, const scratch *sc, int64_t k0,
                        int64_t nk, float *row_sum)
{
    t->pack_k(w->k + k0 * p->k_ss, p->k_ss, nk, p->d, sc->kp);
    t->qk(w->q, p->q_ss, w->mq, sc->kp, nk, p->d, sc->s, t->block_k);
    mk_mask mk = block_mask(p, w, k0, nk);
    t->softmax_update(sc->s, t->block_k, w->mq, nk, p->scale, &mk, sc->m,
                      row_sum, sc->alpha);
}

static void run_item(const mk_table *t, const mha_problem *p,
                     const scratch *sc, const work_item *w)
{
    int64_t bk = t->block_k, dv = p->dv;
    for (int64_t i = 0; i < w->mq; i++) {
        sc->m[i] = -INFINITY;
        sc->l[i] = 0.0f;
        sc->l2[i] = 0.0f;
    }
    memset(sc->o, 0, (size_t)(w->mq * dv) * sizeof(float));
    float *wrow = NULL;
    if (p->weights) {
        /* Pass 1 finds each row's final max and sum; pass 2 below turns
         * the same scores into the probabilities it writes and applies. */
        for (int64_t k0 = 0; k0 < w->key_end; k0 += bk) {
            int64_t nk = w->key_end - k0 < bk ? w->key_end - k0 : bk;
            score_block(t, p, w, sc, k0, nk, sc->l);
        }
        wrow = p->weights +
               ((w->b * p->heads + w->h) * p->lq + w->q0) * p->lk;
    }
    for (int64_t k0 = 0; k0 < w->key_end; k0 += bk) {
        int64_t nk = w->key_end - k0 < bk ? w->key_end - k0 : bk;
        score_block(t, p, w, sc, k0, nk, wrow ? sc->l2 : sc->l);
        if (wrow)
            t->normalize(sc->s, bk, w->mq, nk, sc->l, wrow + k0, p->lk);
        t->pv(sc->s, bk, w->mq, nk, w->v + k0 * p->v_ss, p->v_ss, dv,
              sc->alpha, sc->o, dv);
    }
    if (wrow && w->key_end < p->lk)
        for (int64_t i = 0; i < w->mq; i++)
            memset(wrow + i * p->lk + w->key_end, 0,
                   (size_t)(p->lk - w->key_end) * sizeof(float));
    t->normalize(sc->o, dv, w->mq, dv, sc->l,
                 p->out + w->b * p->o_sb + w->q0 * p->o_ss + w->h * p->o_sh,
                 p->o_ss);
}

void mha_attention_run(const mk_table *t, const mha_problem *p, void *scratch_mem,
                       int nthreads)
{
    int64_t bq = t->block_q;
    int64_t items = p->batch * p->heads * ((p->lq + bq - 1) / bq);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && items > 1)
    {
        scratch sc = thread_scratch(t, p, scratch_mem, omp_get_thread_num());
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            work_item w = make_item(p, bq, i);
            run_item(t, p, &sc, &w);
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
