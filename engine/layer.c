/* nn.MultiheadAttention(batch_first=True): projections through the
 * table's linear kernel, attention per head, output projection. */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "engine.h"

struct mha_layer {
    const mha_engine *engine;
    int64_t e, heads, kdim, vdim;
    float *w[4]; /* packed q, k, v, out projections */
    float *b[4]; /* their biases, or NULL */
};

enum { PQ, PK, PV, PO };

/* Rows of the projections per work item: fixed, so the split (and the
 * result) never depends on the thread count. */
#define LINEAR_ROWS 96

void mha_layer_destroy(mha_layer *layer)
{
    if (!layer)
        return;
    for (int i = 0; i < 4; i++) {
        mha_free(layer->w[i]);
        mha_free(layer->b[i]);
    }
    mha_free(layer);
}

static mha_status check_dim(int64_t v, const char *name)
{
    if (v <= 0)
        return mha_fail(MHA_ERR_BAD_SHAPE, "desc.%s (%lld) must be positive",
                        name, (long long)v);
    return MHA_OK;
}

mha_status mha_layer_create(const mha_engine *engine,
                            const mha_layer_desc *desc, mha_layer **layer)
{
    if (!engine || !desc || !layer)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                        !engine ? "engine" : !desc ? "desc" : "layer");
    int64_t e = desc->embed_dim, h = desc->num_heads;
    int64_t kdim = desc->kdim ? desc->kdim : e;
    int64_t vdim = desc->vdim ? desc->vdim : e;
    mha_status st;
    if ((st = check_dim(e, "embed_dim")) != MHA_OK ||
        (st = check_dim(h, "num_heads")) != MHA_OK ||
        (st = check_dim(kdim, "kdim")) != MHA_OK ||
        (st = check_dim(vdim, "vdim")) != MHA_OK)
        return st;
    if (e % h != 0)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "desc.num_heads (%lld) does not divide embed_dim "
                        "(%lld)",
                        (long long)h, (long long)e);
    if (!desc->out_proj_weight)
        return mha_fail(MHA_ERR_NULL_POINTER, "desc.out_proj_weight is NULL");
    const float *src[4];
    const int64_t in[4] = {e, kdim, vdim, e};
    int64_t check;
    for (int i = 0; i < 4; i++)
        if (!mha_mul_ok(e, in[i], &check) ||
            !mha_mul_ok(check, 3 * (int64_t)sizeof(float), &check))
            return mha_fail(MHA_ERR_OVERFLOW,
                            "projection weights of %lld x %lld overflow",
                            (long long)e, (long long)in[i]);
    if (desc->in_proj_weight) {
        if (desc->q_proj_weight || desc->k_proj_weight || desc->v_proj_weight)
            return mha_fail(MHA_ERR_BAD_ARGUMENT,
                            "give either in_proj_weight or "
                            "q/k/v_proj_weight, not both");
        if (kdim != e || vdim != e)
            return mha_fail(MHA_ERR_BAD_SHAPE,
                            "in_proj_weight needs kdim (%lld) and vdim "
                            "(%lld) equal to embed_dim (%lld)",
                            (long long)kdim, (long long)vdim, (long long)e);
        for (int i = 0; i < 3; i++)
            src[i] = desc->in_proj_weight + i * e * e;
    } else {
        if (!desc->q_proj_weight || !desc->k_proj_weight ||
            !desc->v_proj_weight)
            return mha_fail(MHA_ERR_NULL_POINTER,
                            "no in_proj_weight, and %s is NULL",
                            !desc->q_proj_weight   ? "q_proj_weight"
                            : !desc->k_proj_weight ? "k_proj_weight"
                                                   : "v_proj_weight");
        src[0] = desc->q_proj_weight;
        src[1] = desc->k_proj_weight;
        src[2] = desc->v_proj_weight;
    }
    src[3] = desc->out_proj_weight;

    const mk_table *t = &engine->kernels;
    mha_layer *l = mha_alloc(sizeof *l);
    if (!l)
        return mha_fail(MHA_ERR_OUT_OF_MEMORY, "layer allocation failed");
    memset(l, 0, sizeof *l);
    l->engine = engine;
    l->e = e, l->heads = h, l->kdim = kdim, l->vdim = vdim;
    for (int i = 0; i < 4; i++) {
        l->w[i] = mha_alloc(t->packed_floats(e, in[i]) * sizeof(float));
        const float *bias = i < 3 ? (desc->in_proj_bias
                                         ? desc->in_proj_bias + i * e
                                         : NULL)
                                  : desc->out_proj_bias;
        if (bias)
            l->b[i] = mha_alloc((size_t)e * sizeof(float));
        if (!l->w[i] || (bias && !l->b[i])) {
            mha_layer_destroy(l);
            return mha_fail(MHA_ERR_OUT_OF_MEMORY,
                            "layer weights allocation failed");
        }
        t->pack(src[i], in[i], e, in[i], l->w[i]);
        if (bias)
            memcpy(l->b[i], bias, (size_t)e * sizeof(float));
    }
    *layer = l;
    return MHA_OK;
}

/* c[rows x e] = a[rows x k] w^T + b, split in fixed row chunks. */
static void project(const mk_table *t, const float *a, int64_t rows,
                    int64_t k, const float *w, const float *bias, int64_t e,
                    float *c, int nthreads)
{
    int64_t chunks = (rows + LINEAR_ROWS - 1) / LINEAR_ROWS;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) \
    if (nthreads > 1 && chunks > 1)
    for (int64_t i = 0; i < chunks; i++) {
        int64_t r0 = i * LINEAR_ROWS;
        int64_t m = rows - r0 < LINEAR_ROWS ? rows - r0 : LINEAR_ROWS;
        t->linear(a + r0 * k, k, m, w, e, k, bias, c + r0 * e, e);
    }
}

/* The bytes of n floats at p (counts overflow-checked by the caller). */
static mha_span bytes_of(const void *p, int64_t n)
{
    mha_span r = {(uintptr_t)p, (uintptr_t)p + (uintptr_t)n * sizeof(float)};
    return r;
}

mha_status mha_layer_forward(const mha_layer *layer, const float *query,
                             const float *key, const float *value,
                             int64_t batch, int64_t lq, int64_t lk,
                             const mha_mask *mask, float *out, float *weights)
{
    if (!layer || !query || !key || !value || !out)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                        !layer   ? "layer"
                        : !query ? "query"
                        : !key   ? "key"
                        : !value ? "value"
                                 : "out");
    const int64_t sizes[3] = {batch, lq, lk};
    const char *names[3] = {"batch", "lq", "lk"};
    for (int i = 0; i < 3; i++)
        if (sizes[i] <= 0)
            return mha_fail(MHA_ERR_BAD_SHAPE, "%s (%lld) must be positive",
                            names[i], (long long)sizes[i]);
    int64_t e = layer->e, h = layer->heads;
    int64_t nq, nk, nv, nkv, nout, total, twice_out, bytes;
    if (!mha_mul_ok(batch, lq, &nq) || !mha_mul_ok(nq, e, &nout) ||
        !mha_mul_ok(batch, lk, &nkv) || !mha_mul_ok(nkv, layer->kdim, &nk) ||
        !mha_mul_ok(nkv, layer->vdim, &nv) ||
        !mha_mul_ok(nk, (int64_t)sizeof(float), &bytes) ||
        !mha_mul_ok(nv, (int64_t)sizeof(float), &bytes) ||
        !mha_mul_ok(nout, (int64_t)sizeof(float), &bytes) ||
        (uint64_t)bytes > UINTPTR_MAX - (uintptr_t)out ||
        !mha_mul_ok(nkv, e, &total) || !mha_mul_ok(total, 2, &total) ||
        !mha_mul_ok(nout, 2, &twice_out) ||
        !mha_add_ok(total, twice_out, &total) ||
        !mha_mul_ok(total, (int64_t)sizeof(float), &total))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "layer sizes B=%lld Lq=%lld Lk=%lld E=%lld overflow",
                        (long long)batch, (long long)lq, (long long)lk,
                        (long long)e);
    mha_span ro = bytes_of(out, nout);
    const mha_span inputs[3] = {bytes_of(query, nq * e), bytes_of(key, nk),
                             bytes_of(value, nv)};
    const char *const in_names[3] = {"query", "key", "value"};
    for (int i = 0; i < 3; i++)
        if (mha_spans_overlap(ro, inputs[i]))
            return mha_fail(MHA_ERR_BAD_STRIDE, "out overlaps %s",
                            in_names[i]);

    mha_problem p;
    mha_status st;
    if ((st = mha_validate_mask(mask, batch, h, lq, lk, &p.mask)) != MHA_OK ||
        (st = mha_check_mask_disjoint(&p.mask, batch, h, lq, lk, out,
                                      (size_t)nout * sizeof(float),
                                      "out")) != MHA_OK)
        return st;
    if (weights) {
        int64_t wn;
        if (!mha_mul_ok(batch, h, &wn) || !mha_mul_ok(wn, lq, &wn) || !mha_mul_ok(wn, lk, &wn) ||
            !mha_mul_ok(wn, (int64_t)sizeof(float), &wn))
            return mha_fail(MHA_ERR_OVERFLOW, "weights size overflows");
        mha_span rw;
        if ((st = mha_check_weights(weights, wn, ro, inputs, in_names, 3,
                                    &rw)) != MHA_OK ||
            (st = mha_check_mask_disjoint(&p.mask, batch, h, lq, lk, weights,
                                          rw.hi - rw.lo, "weights")) !=
            MHA_OK)
            return st;
    }

    const mk_table *t = &layer->engine->kernels;
    int nthreads = mha_threads_for_call(layer->engine);
    p.q = NULL, p.k = NULL, p.v = NULL, p.out = NULL;
    p.k_dtype = p.v_dtype = MHA_F32;
    p.batch = batch, p.lq = lq, p.lk = lk, p.heads = h, p.kv_heads = h;
    p.d = p.dv = e / h;
    p.q_sb = p.o_sb = lq * e;
    p.k_sb = p.v_sb = lk * e;
    p.q_ss = p.k_ss = p.v_ss = p.o_ss = e;
    p.q_sh = p.k_sh = p.v_sh = p.o_sh = e / h;
    p.scale = (float)(1.0 / sqrt((double)(e / h)));
    p.weights = weights;
    size_t scratch_bytes;
    if ((st = mha_attention_scratch_bytes(t, &p, nthreads, &scratch_bytes)) !=
        MHA_OK)
        return st;
    size_t buffers = ((size_t)total + 63) / 64 * 64; /* scratch aligned */
    if (scratch_bytes > SIZE_MAX - buffers)
        return mha_fail(MHA_ERR_OVERFLOW, "layer workspace overflows");
    float *mem = mha_alloc(buffers + scratch_bytes);
    if (!mem)
        return mha_fail(MHA_ERR_OUT_OF_MEMORY,
                        "layer workspace of %zu bytes",
                        buffers + scratch_bytes);
    float *qp = mem, *kp = qp + nout, *vp = kp + nkv * e, *cat = vp + nkv * e;
    void *scratch = (char *)mem + buffers;

    project(t, query, nq, e, layer->w[PQ], layer->b[PQ], e, qp, nthreads);
    project(t, key, nkv, layer->kdim, layer->w[PK], layer->b[PK], e, kp,
            nthreads);
    project(t, value, nkv, layer->vdim, layer->w[PV], layer->b[PV], e, vp,
            nthreads);
    p.q = qp, p.k = kp, p.v = vp, p.out = cat;
    mha_attention_run(t, &p, scratch, nthreads);
    project(t, cat, nq, e, layer->w[PO], layer->b[PO], e, out, nthreads);
    mha_free(mem);
    return MHA_OK;
}
