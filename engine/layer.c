/* nn.MultiheadAttention(batch_first=True): projections through the
 * table's linear kernel, attention per head, output projection. */
#include <math.h>
#include <string.h>

#include <omp.h>

#include "attention.h"

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
    const char *in_name[4] = {"embed_dim", "kdim", "vdim", "embed_dim"};
    int64_t check;
    for (int i = 0; i < 4; i++)
        if (!mha_mul_ok(e, in[i], &check) ||
            !mha_mul_ok(check, 3 * (int64_t)sizeof(float), &check))
            return mha_fail(MHA_ERR_OVERFLOW,
                            "projection weights of desc.embed_dim (%lld) x "
                            "desc.%s (%lld) overflow",
                            (long long)e, in_name[i], (long long)in[i]);
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
static void project(const mha_engine *engine, const float *a, int64_t rows,
                    int64_t k, const float *w, const float *bias, int64_t e,
                    float *c)
{
    const mk_table *t = &engine->kernels;
    int64_t chunks = (rows + LINEAR_ROWS - 1) / LINEAR_ROWS;
    int nthreads = mha_threads_for_call(engine, chunks);
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1) \
    if (nthreads > 1 && chunks > 1)
    for (int64_t i = 0; i < chunks; i++) {
        int64_t r0 = i * LINEAR_ROWS;
        int64_t m = rows - r0 < LINEAR_ROWS ? rows - r0 : LINEAR_ROWS;
        t->linear(a + r0 * k, k, m, w, e, k, bias, c + r0 * e, e);
    }
}

/* A packed [batch, seq, heads, dim] float view (sizes overflow-checked by
 * the caller). */
static mha_tensor view(const float *data, int64_t batch, int64_t seq,
                       int64_t heads, int64_t dim)
{
    return mha_tensor_bshd((void *)data, batch, seq, heads, dim);
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
    /* The workspace (projected q, k, v and the heads' outputs) and the
     * element counts the views below are built from; the views' own byte
     * extents are checked with them. */
    int64_t nq, nk, nv, nkv, nout, total, twice_out;
    if (!mha_mul_ok(batch, lq, &nq) || !mha_mul_ok(nq, e, &nout) ||
        !mha_mul_ok(batch, lk, &nkv) || !mha_mul_ok(nkv, layer->kdim, &nk) ||
        !mha_mul_ok(nkv, layer->vdim, &nv) ||
        !mha_mul_ok(nkv, e, &total) || !mha_mul_ok(total, 2, &total) ||
        !mha_mul_ok(nout, 2, &twice_out) ||
        !mha_add_ok(total, twice_out, &total) ||
        !mha_mul_ok(total, (int64_t)sizeof(float), &total))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "layer sizes B=%lld Lq=%lld Lk=%lld E=%lld overflow",
                        (long long)batch, (long long)lq, (long long)lk,
                        (long long)e);
    /* The caller's buffers go through the same checks as mha_attention's
     * (overlaps, weights, mask); the problem is built by the same
     * constructor, over the layer's own projection buffers. */
    const mha_tensor vq = view(query, batch, lq, 1, e),
                     vk = view(key, batch, lk, 1, layer->kdim),
                     vv = view(value, batch, lk, 1, layer->vdim),
                     vo = view(out, batch, lq, 1, e);
    mha_views views = {3, {&vq, &vk, &vv}, {"query", "key", "value"}, &vo,
                       "out", weights, mask, batch, h, lq, lk};
    mha_mask m;
    mha_status st;
    if ((st = mha_check_views(&views)) != MHA_OK ||
        (st = mha_check_outputs(&views, &m)) != MHA_OK)
        return st;

    int64_t d = e / h;
    /* Placeholder pointers: the plan reads shapes and strides only. */
    const mha_tensor hq = view(query, batch, lq, h, d),
                     hk = view(query, batch, lk, h, d),
                     ho = view(out, batch, lq, h, d);
    mha_problem p;
    mha_problem_init(&p, &hq, &hk, &hk, &ho, &m, 0.0f, weights);
    mha_plan pl;
    if ((st = mha_plan_make(layer->engine, &p, &pl)) != MHA_OK)
        return st;
    size_t scratch_bytes = pl.bytes;
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

    const mha_engine *en = layer->engine;
    project(en, query, nq, e, layer->w[PQ], layer->b[PQ], e, qp);
    project(en, key, nkv, layer->kdim, layer->w[PK], layer->b[PK], e, kp);
    project(en, value, nkv, layer->vdim, layer->w[PV], layer->b[PV], e, vp);
    p.q = qp, p.k = kp, p.v = vp, p.out = cat;
    mha_attention_run(&en->kernels, &p, &pl, scratch);
    project(en, cat, nq, e, layer->w[PO], layer->b[PO], e, out);
    mha_free(mem);
    return MHA_OK;
}
