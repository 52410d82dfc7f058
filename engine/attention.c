/* mha_attention and the parallel loop over a plan's work items. Each item
 * streams its key blocks (prefill.c or decode.c, as the plan says) into a
 * running max, sum and accumulator in thread scratch; with split keys the
 * chunks' partials are merged in chunk order (merge.c). docs/design.md,
 * "Data path of one call". */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "attention.h"
#include "fetch_step.h"

static mha_scratch thread_scratch(const mha_plan *pl, float *base, int tid)
{
    float *f = base + pl->thread.floats * tid;
    const mha_scratch_layout *l = &pl->thread;
    mha_scratch s = {f + l->s,  f + l->kp, f + l->o,  f + l->m,
                     f + l->l,  f + l->alpha, f + l->l2, f + l->kw,
                     f + l->vw, f + l->qw, f + l->ow, NULL, NULL, NULL, NULL,
                     NULL};
    /* Row tables of rt_rows pointers each, then the scales (rt_scales
     * floats each). */
    int64_t n = pl->rt_rows;
    s.k_rows = (const void **)(f + l->rt);
    s.v_rows = s.k_rows + n;
    s.k_scales = (float *)(s.v_rows + n);
    s.v_scales = s.k_scales + pl->rt_scales;
    return s;
}

/* Streams keys [k_begin, k_end) of a row block into the accumulator o with
 * running max m and sum l (o, m, l start empty, or with_sink from the
 * sink: a key of logit sink and value 0, so it joins the sum and the
 * weights exclude its share; docs/design.md, "Score terms"). With
 * weights, a first pass finds each row's final max and sum and a second
 * turns the same scores into the probabilities it writes and applies.
 * With finish (the unit's whole key range) a prefill block's last key step
 * may write the normalised output rows itself (mha_prefill_finish):
 * returns 1 when it did. */
static int stream_keys(const mk_table *t, const mha_problem *p,
                       const mha_plan *pl, const mha_row_block *rb,
                       const mha_scratch *sc, int64_t k_begin, int64_t k_end,
                       int with_sink, int finish, float *o, float *m,
                       float *l)
{
    int64_t bk = rb->key_block, lk = rb->w_ld;
    with_sink = with_sink && rb->sink;
    for (int64_t r = 0; r < rb->rows; r++) {
        /* Interleaved rows: the sink of the row's head. */
        ptrdiff_t at = rb->ilv > 1 ? mha_ilv_at(rb, r, 0, rb->sink_ld)
                                   : r * rb->sink_ld;
        m[r] = with_sink ? rb->sink[at] : -INFINITY;
        l[r] = with_sink ? 1.0f : 0.0f;
        sc->l2[r] = 0.0f;
    }
    memset(o, 0, (size_t)(rb->rows * p->dv) * sizeof(float));
    if (rb->w) {
        if (k_begin > 0)
            for (int64_t r = 0; r < rb->rows; r++)
                memset(rb->w + r * lk, 0, (size_t)k_begin * sizeof(float));
        for (int64_t k0 = k_begin; k0 < k_end; k0 += bk) {
            int64_t nk = k_end - k0 < bk ? k_end - k0 : bk;
            (rb->decode ? mha_decode_scores : mha_prefill_scores)(
                t, p, pl, rb, sc, m, k0, nk, l);
        }
    }
    int done = 0;
    for (int64_t k0 = k_begin; k0 < k_end; k0 += bk) {
        int64_t nk = k_end - k0 < bk ? k_end - k0 : bk;
        if (finish && !rb->decode && k0 + nk == k_end)
            done = mha_prefill_finish(t, p, pl, rb, sc, k0, nk, o, m, l);
        else
            (rb->decode ? mha_decode_step : mha_prefill_step)(
                t, p, pl, rb, sc, k0, nk, o, m, l);
    }
    if (rb->w && k_end < lk)
        for (int64_t r = 0; r < rb->rows; r++)
            memset(rb->w + r * lk + k_end, 0,
                   (size_t)(lk - k_end) * sizeof(float));
    return done;
}

/* The row block's rows staged in thread scratch. Prefill queries at a
 * stride are copied together (below). A half-precision compute dtype
 * (docs/design.md, "Compute dtype"): queries the kernels do not read as
 * codes are widened there (with_q), and the output rows gathered there in
 * fp32 for mha_finish_rows to narrow. Scores, softmax and accumulation
 * stay fp32; the kernels never see the caller's dtype. */
static void stage_rows(const mk_table *t, const mha_problem *p,
                       const mha_plan *pl, mha_row_block *rb,
                       const mha_scratch *sc, int with_q)
{
    size_t cs = mha_dtype_size(p->compute);
    /* Interleaved queries (a decode block across kv heads at several
     * queries) sit at two strides: gathered, and widened for half
     * compute; the outputs are scattered by mha_finish_rows. The copy is
     * the block's d floats a row against the keys' and values' rows of
     * every kv head it reads (decode.c). */
    if (rb->ilv > 1) {
        /* The half slots of a prefill block read codes: copied as such. */
        int codes = pl->half && !rb->decode;
        for (int64_t r = 0; with_q && r < rb->rows; r++) {
            const char *x =
                rb->q_src +
                (size_t)mha_ilv_at(rb, r, rb->q_qs, rb->ldq_src) * cs;
            if (p->compute == MHA_F32 || codes)
                memcpy((char *)sc->qw + (size_t)(r * p->d) * cs, x,
                       (size_t)p->d * cs);
            else
                t->widen[p->compute](x, p->d, sc->qw + r * p->d);
        }
        if (with_q && codes) {
            rb->q_src = (const char *)sc->qw;
            rb->ldq_src = p->d;
        } else if (with_q) {
            rb->q = sc->qw;
            rb->ldq = p->d;
        }
        rb->out = sc->ow;
        rb->ldo = p->dv;
        return;
    }
    /* Prefill rows read in place at a stride that crowds the L1 sets (a
     * [B, L, H, D] q: mha_rows_crowd) are copied together, the same bits. */
    int in_place = p->compute == MHA_F32 || (pl->half && !rb->decode);
    if (with_q && in_place && !rb->decode && rb->rows > 1 &&
        rb->ldq_src != p->d &&
        mha_rows_crowd((int64_t)cs * rb->ldq_src, t->strip_rows)) {
        const size_t bytes = (size_t)p->d * cs;
        const size_t ld = (size_t)rb->ldq_src * cs;
        for (int64_t r = 0; r < rb->rows; r++) {
            if (r + MHA_COPY_AHEAD < rb->rows)
                mk_fetch_run(rb->q_src + (size_t)(r + MHA_COPY_AHEAD) * ld,
                             bytes, 0);
            memcpy((char *)sc->qw + (size_t)r * bytes,
                   rb->q_src + (size_t)r * ld, bytes);
        }
        rb->q_src = (const char *)sc->qw;
        rb->ldq_src = p->d;
        if (p->compute == MHA_F32) {
            rb->q = sc->qw;
            rb->ldq = p->d;
        }
    }
    if (p->compute == MHA_F32)
        return;
    /* The half slots read the caller's half rows (q_src) themselves. */
    if (with_q && !in_place) {
        for (int64_t r = 0; r < rb->rows; r++)
            t->widen[p->compute](rb->q_src + (size_t)(r * rb->ldq_src) * cs,
                                 p->d, sc->qw + r * p->d);
        rb->q = sc->qw;
        rb->ldq = p->d;
    }
    rb->out = sc->ow;
    rb->ldo = p->dv;
}

/* The sequence, unit and key chunk of work item it: a sequence's items
 * follow its units, or (key_major) its chunks, each across its units. */
static const mha_seq *item_of(const mha_problem *p, const mha_seq *seqs,
                              int64_t it, int64_t *unit, int64_t *chunk)
{
    const mha_seq *s = &seqs[mha_seq_of_item(seqs, p->batch, it)];
    int64_t at = it - s->item0;
    if (s->key_major) {
        *chunk = at / s->units;
        *unit = s->unit0 + at % s->units;
    } else {
        *unit = s->unit0 + at / s->chunks;
        *chunk = at % s->chunks;
    }
    return s;
}

/* A split unit's partials: its chunks', one after another. */
static float *unit_partials(const mha_seq *s, float *partials, int64_t unit)
{
    return partials + s->part0 +
           (unit - s->unit0) * s->chunks * s->partial_floats;
}

void mha_attention_run(const mk_table *t, const mha_problem *p,
                       const mha_plan *pl, void *scratch_mem)
{
    float *partials = scratch_mem;
    mha_seq *seqs = (mha_seq *)((char *)scratch_mem + pl->seq_offset);
    mha_seqs_fill(t, p, pl, seqs);
    mha_task *tasks = (mha_task *)((char *)scratch_mem + pl->task_offset);
    int64_t ntasks = mha_tasks_fill(p, pl, seqs,
                                    (mha_seq_order *)(seqs + p->batch), tasks);
    float *thread_mem = partials + pl->part_floats;
#pragma omp parallel num_threads(pl->nthreads) if (pl->nthreads > 1)
    {
        /* OpenMP's workers keep their own environment: each sets the
         * call's (docs/design.md, "The floating-point environment"). */
        MHA_FPENV_SCOPE(pl->flush);
        mha_scratch sc = thread_scratch(pl, thread_mem, omp_get_thread_num());
        mha_head_cache cache = {-1, 0, 0, -1, 0, 0};
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ntasks; task++)
        for (int64_t it = tasks[task].first;
             it < tasks[task].first + tasks[task].count; it++) {
            int64_t unit, c;
            const mha_seq *s = item_of(p, seqs, it, &unit, &c);
            mha_row_block rb = mha_row_block_of(p, pl, seqs, unit);
            stage_rows(t, p, pl, &rb, &sc, 1);
            sc.cache = s->cache ? &cache : NULL;
            /* Key blocks start at multiples of block_k (the head cache
             * finds a block's panels there); the tile mask hides the keys
             * of the first block before key_begin. */
            int64_t first = rb.key_begin / t->block_k * t->block_k;
            if (s->chunks == 1) {
                int done = stream_keys(t, p, pl, &rb, &sc, first,
                                       rb.key_end, 1, 1, sc.o, sc.m, sc.l);
                mha_finish_rows(t, p, &rb, done ? NULL : sc.o, sc.m, sc.l);
                continue;
            }
            /* Chunk c covers keys [k0, k1) of the unit's visible range. */
            int64_t k0 = c * s->chunk_len, k1 = k0 + s->chunk_len;
            if (k0 < first)
                k0 = first < k1 ? first : k1;
            if (k1 > rb.key_end)
                k1 = rb.key_end > k0 ? rb.key_end : k0;
            float *part = unit_partials(s, partials, unit) +
                          c * s->partial_floats;
            float *o = part, *m = o + s->rows * p->dv, *l = m + s->rows;
            /* The sink joins chunk 0 only: the merge counts it once. */
            stream_keys(t, p, pl, &rb, &sc, k0, k1, c == 0, 0, o, m, l);
        }
        if (pl->part_floats > 0) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t u = 0; u < pl->units; u++) {
                const mha_seq *s = &seqs[mha_seq_of_unit(seqs, p->batch, u)];
                if (s->chunks == 1)
                    continue;
                mha_row_block rb = mha_row_block_of(p, pl, seqs, u);
                stage_rows(t, p, pl, &rb, &sc, 0);
                mha_merge_chunks(t, p, s, &rb, unit_partials(s, partials, u));
            }
        }
    }
}

mha_status mha_attention_solve(const mha_engine *engine, const mha_problem *p)
{
    mha_plan pl;
    mha_status st = mha_plan_make(engine, p, &pl);
    if (st != MHA_OK)
        return st;
    void *mem = mha_alloc(pl.bytes);
    if (!mem)
        return mha_fail(MHA_ERR_OUT_OF_MEMORY,
                        "attention scratch of %zu bytes", pl.bytes);
    mha_attention_run(&engine->kernels, p, &pl, mem);
    mha_free(mem);
    return MHA_OK;
}

mha_status mha_attention_plan_check(const mha_engine *engine,
                                    const mha_problem *p)
{
    mha_plan pl;
    return mha_plan_make(engine, p, &pl);
}

mha_status mha_attention_check(const mha_engine *engine,
                               const mha_attention_args *args)
{
    if (!engine)
        return mha_fail(MHA_ERR_NULL_POINTER, "engine is NULL");
    MHA_FPENV_SCOPE(engine->flush);
    mha_problem p;
    mha_status st = mha_validate_attention(args, &p);
    return st != MHA_OK ? st : mha_attention_plan_check(engine, &p);
}

mha_status mha_attention(const mha_engine *engine,
                         const mha_attention_args *args)
{
    if (!engine)
        return mha_fail(MHA_ERR_NULL_POINTER, "engine is NULL");
    MHA_FPENV_SCOPE(engine->flush);
    mha_problem p;
    mha_status st = mha_validate_attention(args, &p);
    if (st != MHA_OK)
        return st;
    return mha_attention_solve(engine, &p);
}
