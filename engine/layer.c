/* nn.MultiheadAttention(batch_first=True): projections through the
 * table's linear kernel, attention per head, output projection; in fp32,
 * or in bf16 (desc.dtype): bf16 activations between the steps, each step
 * summing in fp32, through the table's bf16 slots where it has them
 * (their qk is a bf16 matmul: x w^T of packed w), else on fp32 kernels
 * over rows widened a chunk at a time (docs/design.md, "Compute dtype"). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include <omp.h>

#include "attention.h"
#include "test_hooks.h"

struct mha_layer {
    const mha_engine *engine;
    int64_t e, heads, kdim, vdim;
    /* The heads computed: all (first 0, count heads) or a shard's; width
     * = count * head dim is what q, k, v project to. */
    int64_t first, count, width;
    int shard; /* shard_heads given: no out bias, no averaged weights */
    mha_dtype dtype; /* MHA_F32 or MHA_BF16 */
    /* Packed q, k, v, out projections: by pack (fp32; for bf16 the
     * weights' bf16 values), or, where bf16[i], by the bf16 slots' pack. */
    float *w[4];
    int bf16[4];
    float *b[4]; /* their biases, or NULL (a shard has no out bias) */
    /* q, k and v take E inputs and their packs end on whole panels: w[0]
     * and b[0] are one allocation holding all three in order (w[1], w[2],
     * b[1], b[2] point into it), which is the pack of the [3w, E] stacked
     * weight, so self-attention projects them as one multiply (project). */
    int fused;
    /* A call's workspace of MHA_ALLOC_HUGE_BYTES or more, kept for the
     * next call (ws_take): the one field a call changes, atomically. */
    _Atomic(char *) spare;
};

enum { PQ, PK, PV, PO };

/* A sequence's rows go to its projection work items in whole strips of
 * this many (a multiple of the avx512, avx2 and generic row tiles), spread
 * evenly: 512 rows in chunks of 96 were five full chunks and one of 32,
 * which two threads shared as 288 and 224 rows (docs/benchmarks.md). A
 * work item has at most the table's linear_rows rows (project_rows). */
#define LINEAR_STRIP 12
/* Floats an fp32 projection's staged input row is padded by (project):
 * rows E x 4 bytes apart, a multiple of 4 KiB for E = 1024, all fall in
 * one L1 set, more rows than its ways for the 12-row AVX-512 strip. */
#define LINEAR_PAD 16

int mha_test_layer_fused(const mha_layer *layer)
{
    return layer->fused;
}

void mha_layer_destroy(mha_layer *layer)
{
    if (!layer)
        return;
    for (int i = 0; i < 4; i++)
        if (!layer->fused || i == 0 || i == 3) { /* else inside w[0], b[0] */
            mha_free(layer->w[i]);
            mha_free(layer->b[i]);
        }
    mha_free(atomic_load(&layer->spare));
    mha_free(layer);
}

/* The bytes before a kept workspace: its capacity, then padding to keep
 * the workspace 64-byte aligned. */
#define WS_HEAD 64

/*
 * A call's workspace of `bytes`. Below MHA_ALLOC_HUGE_BYTES glibc hands a
 * freed block back from its heap on the next call; from there on every
 * block is mmapped afresh and each call faulted its pages in (32 MiB at
 * E = 1024, L = 2048), a cost that shows where the system gives no huge
 * pages (transparent huge pages off, or memory too fragmented for them:
 * docs/design.md, "Memory"). So such a workspace goes back to the layer
 * (ws_give) and the next call takes it if it is large enough; one is
 * kept, so a layer holds at most one workspace until mha_layer_destroy.
 * Concurrent calls each take their own: the one that finds the slot empty
 * allocates, and of two returning, one frees.
 */
static void *ws_take(const mha_layer *layer, size_t bytes)
{
    if (bytes < MHA_ALLOC_HUGE_BYTES)
        return mha_alloc(bytes);
    mha_layer *l = (mha_layer *)layer; /* spare: see the struct */
    char *block = atomic_exchange(&l->spare, NULL);
    size_t capacity = 0;
    if (block)
        memcpy(&capacity, block, sizeof capacity);
    if (block && capacity >= bytes)
        return block + WS_HEAD;
    mha_free(block);
    if (bytes > SIZE_MAX - WS_HEAD)
        return NULL;
    block = mha_alloc(WS_HEAD + bytes);
    if (!block)
        return NULL;
    memcpy(block, &bytes, sizeof bytes);
    return block + WS_HEAD;
}

/* Ends a call's use of ws_take's workspace of `bytes`. */
static void ws_give(const mha_layer *layer, void *ws, size_t bytes)
{
    if (bytes < MHA_ALLOC_HUGE_BYTES) {
        mha_free(ws);
        return;
    }
    mha_layer *l = (mha_layer *)layer;
    char *block = (char *)ws - WS_HEAD, *empty = NULL;
    if (!atomic_compare_exchange_strong(&l->spare, &empty, block))
        mha_free(block);
}

static mha_status check_dim(int64_t v, const char *name)
{
    if (v <= 0)
        return mha_fail(MHA_ERR_BAD_SHAPE, "desc.%s (%lld) must be positive",
                        name, (long long)v);
    return MHA_OK;
}

/* The shard's heads: [first, first + count) of h. */
static mha_status check_shard(const mha_layer_desc *desc, int64_t h,
                              int64_t *first, int64_t *count)
{
    *first = desc->shard_first;
    *count = desc->shard_heads ? desc->shard_heads : h;
    if (desc->shard_heads < 0 || desc->shard_first < 0)
        return mha_fail(MHA_ERR_BAD_SHAPE, "desc.%s (%lld) is negative",
                        desc->shard_heads < 0 ? "shard_heads" : "shard_first",
                        (long long)(desc->shard_heads < 0 ? desc->shard_heads
                                                          : desc->shard_first));
    if (!desc->shard_heads && desc->shard_first)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "desc.shard_first (%lld) without desc.shard_heads",
                        (long long)desc->shard_first);
    if (*first > h - *count)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "desc.shard_first (%lld) + desc.shard_heads (%lld) "
                        "exceed desc.num_heads (%lld)",
                        (long long)*first, (long long)*count, (long long)h);
    return MHA_OK;
}

/* x[0..n) to the nearest bf16 values, in place. */
static void round_bf16(float *x, int64_t n)
{
    uint16_t code;
    for (int64_t i = 0; i < n; i++) {
        mha_f32_to_bf16(&x[i], 1, &code);
        mha_bf16_to_f32(&code, 1, &x[i]);
    }
}

/* Packs projection i (n rows of k at stride ld) into l->w[i]: as is (fp32
 * layer), or its bf16 values, packed for the bf16 qk (l->bf16[i]) or widened
 * back for the fp32 kernels. MHA_ERR_OUT_OF_MEMORY when the staging copy
 * cannot be had. */
static mha_status pack_weights(const mk_table *t, const mha_layer *l, int i,
                               const float *src, ptrdiff_t ld, int64_t n,
                               int64_t k)
{
    if (l->dtype == MHA_F32) {
        t->pack(src, ld, n, k, l->w[i]);
        return MHA_OK;
    }
    /* n x k fits: the caller checked E * in * 12 bytes. */
    float *rows = mha_alloc((size_t)(n * k) * sizeof(float));
    if (!rows)
        return MHA_ERR_OUT_OF_MEMORY;
    for (int64_t r = 0; r < n; r++)
        memcpy(rows + r * k, src + r * ld, (size_t)k * sizeof(float));
    if (l->bf16[i]) {
        /* The codes, narrowed in place (each below the floats still to be
         * read). */
        uint16_t *codes = (uint16_t *)(void *)rows;
        for (int64_t x = 0; x < n * k; x++)
            mha_f32_to_bf16(&rows[x], 1, &codes[x]);
        t->half[MK_HALF_BF16].pack(codes, k, n, k, l->w[i]);
    } else {
        round_bf16(rows, n * k); /* the bf16 values, for the fp32 kernels */
        t->pack(rows, k, n, k, l->w[i]);
    }
    mha_free(rows);
    return MHA_OK;
}

mha_status mha_layer_create(const mha_engine *engine,
                            const mha_layer_desc *desc, mha_layer **layer)
{
    if (!engine || !desc || !layer)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                        !engine ? "engine" : !desc ? "desc" : "layer");
    MHA_FPENV_SCOPE(engine->flush);
    int64_t e = desc->embed_dim, h = desc->num_heads;
    int64_t kdim = desc->kdim ? desc->kdim : e;
    int64_t vdim = desc->vdim ? desc->vdim : e;
    int64_t first, count;
    mha_status st;
    if ((st = check_dim(e, "embed_dim")) != MHA_OK ||
        (st = check_dim(h, "num_heads")) != MHA_OK ||
        (st = check_dim(kdim, "kdim")) != MHA_OK ||
        (st = check_dim(vdim, "vdim")) != MHA_OK ||
        (st = check_shard(desc, h, &first, &count)) != MHA_OK)
        return st;
    if (e % h != 0)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "desc.num_heads (%lld) does not divide embed_dim "
                        "(%lld)",
                        (long long)h, (long long)e);
    if (!desc->out_proj_weight)
        return mha_fail(MHA_ERR_NULL_POINTER, "desc.out_proj_weight is NULL");
    if (desc->dtype != MHA_F32 && desc->dtype != MHA_BF16)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "desc.dtype (%s) is not a layer dtype (f32, bf16)",
                        mha_dtype_name(desc->dtype));
    if (desc->dtype == MHA_BF16 && desc->shard_heads)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "desc.dtype bf16 with desc.shard_heads: shards are "
                        "fp32");
    int64_t d = e / h, w = count * d;
    /* Projection i maps in[i] features to n[i]: q, k, v to the shard's
     * width, out from it back to e. Sliced weights are packed [n, in];
     * full ones are the shard's rows (q, k, v) or columns (out) of the
     * layer's, at row stride ld. */
    const int sliced = desc->shard_sliced != 0;
    const int64_t in[4] = {e, kdim, vdim, w}, n[4] = {w, w, w, e};
    const char *in_name[4] = {"embed_dim", "kdim", "vdim", "embed_dim"};
    int64_t check;
    for (int i = 0; i < 4; i++)
        if (!mha_mul_ok(e, i < 3 ? in[i] : e, &check) ||
            !mha_mul_ok(check, 3 * (int64_t)sizeof(float), &check))
            return mha_fail(MHA_ERR_OVERFLOW,
                            "projection weights of desc.embed_dim (%lld) x "
                            "desc.%s (%lld) overflow",
                            (long long)e, in_name[i],
                            (long long)(i < 3 ? in[i] : e));
    const float *src[4];
    ptrdiff_t ld[4] = {e, kdim, vdim, sliced ? w : e};
    const int64_t row0 = sliced ? 0 : first * d; /* the shard's first row */
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
            src[i] = desc->in_proj_weight +
                     (i * (sliced ? w : e) + row0) * e;
    } else {
        if (!desc->q_proj_weight || !desc->k_proj_weight ||
            !desc->v_proj_weight)
            return mha_fail(MHA_ERR_NULL_POINTER,
                            "no in_proj_weight, and %s is NULL",
                            !desc->q_proj_weight   ? "q_proj_weight"
                            : !desc->k_proj_weight ? "k_proj_weight"
                                                   : "v_proj_weight");
        src[0] = desc->q_proj_weight + row0 * e;
        src[1] = desc->k_proj_weight + row0 * kdim;
        src[2] = desc->v_proj_weight + row0 * vdim;
    }
    src[3] = desc->out_proj_weight + row0; /* columns of [E, E] */
    const float *bias[4] = {NULL, NULL, NULL, NULL};
    if (desc->in_proj_bias)
        for (int i = 0; i < 3; i++)
            bias[i] = desc->in_proj_bias + i * (sliced ? w : e) + row0;
    if (!desc->shard_heads)
        bias[3] = desc->out_proj_bias;

    const mk_table *t = &engine->kernels;
    mha_layer *l = mha_alloc(sizeof *l);
    if (!l)
        return mha_fail(MHA_ERR_OUT_OF_MEMORY, "layer allocation failed");
    memset(l, 0, sizeof *l);
    atomic_init(&l->spare, NULL);
    l->engine = engine;
    l->e = e, l->heads = h, l->kdim = kdim, l->vdim = vdim;
    l->first = first, l->count = count, l->width = w;
    l->shard = desc->shard_heads != 0;
    l->dtype = desc->dtype;
    for (int i = 0; i < 4; i++)
        l->bf16[i] = l->dtype == MHA_BF16 && t->half[MK_HALF_BF16].qk && in[i] % 2 == 0;
    /* One stacked pack for q, k and v when they share their input width
     * and w fills whole panels: a pack is panels of the table's width, one
     * after another, so three packs of whole panels laid end to end are
     * the pack of the stacked rows (kernels.h, mk_pack_fn). bias[0..2]
     * come from in_proj_bias together or not at all. */
    const int64_t depth = l->bf16[0] ? e / 2 : e;
    l->fused = kdim == e && vdim == e &&
               t->packed_floats(w, depth) == (size_t)(w * depth);
    for (int i = 0; i < 4; i++) {
        size_t floats = l->bf16[i] ? t->packed_floats(n[i], in[i] / 2)
                                   : t->packed_floats(n[i], in[i]);
        if (l->fused && (i == 1 || i == 2)) {
            l->w[i] = l->w[0] + (size_t)i * floats;
            l->b[i] = bias[i] ? l->b[0] + i * w : NULL;
        } else {
            const int stack = l->fused && i == 0 ? 3 : 1;
            l->w[i] = mha_alloc((size_t)stack * floats * sizeof(float));
            if (bias[i])
                l->b[i] = mha_alloc((size_t)(stack * n[i]) * sizeof(float));
        }
        if (!l->w[i] || (bias[i] && !l->b[i]) ||
            pack_weights(t, l, i, src[i], ld[i], n[i], in[i]) != MHA_OK) {
            mha_layer_destroy(l);
            return mha_fail(MHA_ERR_OUT_OF_MEMORY,
                            "layer weights allocation failed");
        }
        if (bias[i]) {
            memcpy(l->b[i], bias[i], (size_t)n[i] * sizeof(float));
            if (l->dtype == MHA_BF16) /* the bias of a bf16 Linear */
                round_bf16(l->b[i], n[i]);
        }
    }
    *layer = l;
    return MHA_OK;
}

/* The rows of one projection's input or output: row (b, s) at
 * data + b*sb + s*ss, the features contiguous. */
typedef struct {
    int64_t sb, ss;
} rows_of;

/* The most rows of a projection work item: the table's linear_rows in
 * whole strips. */
static int64_t project_rows(const mha_layer *l)
{
    int64_t r = l->engine->kernels.linear_rows / LINEAR_STRIP * LINEAR_STRIP;
    return r > LINEAR_STRIP ? r : LINEAR_STRIP;
}

/* Per-thread scratch of the projections: an fp32 layer's chunk of input
 * rows at a padded stride (project_rows x (k + LINEAR_PAD)); a bf16
 * layer's chunk of fp32 results (project_rows x n) and its input rows
 * (project_rows x k floats: widened, or bf16 codes copied into pairs). */
static int64_t project_scratch_floats(const mha_layer *l)
{
    const int64_t rows = project_rows(l);
    int64_t k = l->e > l->kdim ? l->e : l->kdim;
    k = k > l->vdim ? k : l->vdim;
    k = k > l->width ? k : l->width;
    if (l->dtype == MHA_F32)
        return rows * (k + LINEAR_PAD);
    int64_t n = l->fused ? 3 * l->width : l->width;
    n = l->e > n ? l->e : n;
    return rows * (k + n);
}

/* One chunk of m rows of a bf16 projection: c = a w^T + bias (fp32),
 * rounded to bf16 into the output rows. */
static void project_bf16_rows(const mk_table *t, const mha_layer *l, int i,
                              const uint16_t *a, ptrdiff_t lda, int64_t m,
                              int64_t k, int64_t n, uint16_t *c,
                              ptrdiff_t ldc, float *tmp)
{
    float *acc = tmp, *in = tmp + project_rows(l) * n;
    const float *bias = l->b[i];
    if (l->bf16[i]) {
        /* The bf16 qk reads pairs of codes: rows at an odd stride or address
         * are copied into pairs first. */
        if (lda % 2 != 0 || (uintptr_t)a % 4 != 0) {
            for (int64_t r = 0; r < m; r++)
                memcpy((uint16_t *)(void *)in + r * k, a + r * lda,
                       (size_t)k * sizeof *a);
            a = (const uint16_t *)(void *)in;
            lda = k;
        }
        t->half[MK_HALF_BF16].qk(a, lda, m, l->w[i], n, k, acc, n);
        if (bias)
            for (int64_t r = 0; r < m; r++)
                for (int64_t j = 0; j < n; j++)
                    acc[r * n + j] += bias[j];
    } else {
        for (int64_t r = 0; r < m; r++)
            t->widen[MK_BF16](a + r * lda, k, in + r * k);
        t->linear(in, k, m, l->w[i], n, k, bias, acc, n);
    }
    mha_narrow_rows(t, MHA_BF16, acc, n, m, n, c, ldc);
}

/* c = a w^T + b over batch x seq rows (projection i of the layer, in its
 * dtype), each batch's rows cut in chunks: the fewest of at most
 * project_rows rows (every chunk streams the whole weight matrix), or
 * more, up to one a strip, until every thread gets as many. The kernel's
 * result per element does not depend on the chunk, so the results do not
 * depend on the thread count. tmp: project_scratch_floats per thread. */
static void project(const mha_layer *l, int i, const void *a, rows_of ra,
                    int64_t batch, int64_t seq, int64_t k, int64_t e,
                    void *c, rows_of rc, float *tmp)
{
    const mha_engine *engine = l->engine;
    const mk_table *t = &engine->kernels;
    const float *w = l->w[i], *bias = l->b[i];
    const int64_t rows = project_rows(l);
    int64_t per = (seq + rows - 1) / rows;
    int64_t strips = (seq + LINEAR_STRIP - 1) / LINEAR_STRIP;
    const int useful = mha_threads_for_call(engine, batch * strips);
    while (per < strips && batch * per % useful != 0)
        per++;
    int64_t chunks = batch * per;
    int nthreads = mha_threads_for_call(engine, chunks);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && chunks > 1)
    {
        /* Each thread in the call's environment (fpenv.c). */
        MHA_FPENV_SCOPE(engine->flush);
#pragma omp for schedule(dynamic, 1)
        for (int64_t x = 0; x < chunks; x++) {
            /* Chunk j of a sequence: strips [j * strips / per, (j + 1)
             * * strips / per), the last cut at seq. strips <= rows /
             * LINEAR_STRIP per at the fewest chunks (seq <= per * rows,
             * rows whole strips) and more chunks only shrink them, so no
             * chunk passes rows rows, what the scratch holds, and none is
             * empty (per <= strips). */
            int64_t b = x / per, j = x % per;
            int64_t r0 = j * strips / per * LINEAR_STRIP;
            int64_t r1 = (j + 1) * strips / per * LINEAR_STRIP;
            int64_t m = (r1 < seq ? r1 : seq) - r0;
            float *mine =
                tmp + project_scratch_floats(l) * omp_get_thread_num();
            if (l->dtype == MHA_BF16) {
                project_bf16_rows(t, l, i,
                                  (const uint16_t *)a + b * ra.sb +
                                      r0 * ra.ss,
                                  ra.ss, m, k, e,
                                  (uint16_t *)c + b * rc.sb + r0 * rc.ss,
                                  m > 1 ? rc.ss : e, mine);
                continue;
            }
            /* Rows at a stride that crowds the L1 sets (mha_rows_crowd)
             * are copied at a padded one (LINEAR_PAD) first, the same
             * bits: 1.03-1.10x on the E = 1024 layer (Zen 4, AVX-512);
             * rows that do not (E = 512 on a 12-way L1) are read in place,
             * the copy 2% of that layer's time (docs/benchmarks.md). */
            const float *src = (const float *)a + b * ra.sb + r0 * ra.ss;
            ptrdiff_t lda = ra.ss;
            if (m > 1 && mha_rows_crowd(ra.ss * (int64_t)sizeof(float),
                                        t->strip_rows)) {
                for (int64_t r = 0; r < m; r++)
                    memcpy(mine + r * (k + LINEAR_PAD), src + r * ra.ss,
                           (size_t)k * sizeof(float));
                src = mine;
                lda = k + LINEAR_PAD;
            }
            t->linear(src, lda, m, w, e, k, bias,
                      (float *)c + b * rc.sb + r0 * rc.ss, m > 1 ? rc.ss : e);
        }
    }
}

/* A [batch, seq, 1, dim] view of dtype dt with the given strides (sizes
 * overflow-checked by the caller). */
static mha_tensor strided(const void *data, mha_dtype dt, int64_t batch,
                          int64_t seq, int64_t dim, rows_of r)
{
    mha_tensor t = mha_tensor_bshd_typed(data, dt, batch, seq, 1, dim);
    t.stride_batch = r.sb, t.stride_seq = r.ss;
    return t;
}

/* A packed [batch, seq, heads, dim] view of dtype dt. */
static mha_tensor view(const void *data, mha_dtype dt, int64_t batch,
                       int64_t seq, int64_t heads, int64_t dim)
{
    return mha_tensor_bshd_typed(data, dt, batch, seq, heads, dim);
}

/* A buffer's strides: both 0 mean packed [B, L, width]. */
static mha_status rows_from(int64_t sb, int64_t ss, int64_t seq,
                            int64_t width, const char *name, rows_of *r)
{
    if (sb < 0 || ss < 0)
        return mha_fail(MHA_ERR_BAD_STRIDE, "%s_stride_%s (%lld) is negative",
                        name, sb < 0 ? "batch" : "seq",
                        (long long)(sb < 0 ? sb : ss));
    if (sb == 0 && ss == 0) {
        r->ss = width;
        r->sb = (int64_t)((uint64_t)seq * (uint64_t)width); /* checked */
    } else {
        r->sb = sb, r->ss = ss;
    }
    return MHA_OK;
}

mha_status mha_layer_forward(const mha_layer *layer, const float *query,
                             const float *key, const float *value,
                             int64_t batch, int64_t lq, int64_t lk,
                             const mha_mask *mask, float *out, float *weights)
{
    mha_layer_args a = {.query = query, .key = key, .value = value,
                        .out = out, .batch = batch, .lq = lq, .lk = lk,
                        .mask = mask, .weights = weights};
    if (layer && layer->dtype != MHA_F32)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "mha_layer_forward takes fp32 buffers; a %s layer's "
                        "forward is mha_layer_forward_ex",
                        mha_dtype_name(layer->dtype));
    return mha_layer_forward_ex(layer, &a);
}

/* The full layer's per-head arrays seen from a shard: its heads' entries
 * become heads 0.. of the shard's problem. */
static void shard_heads_of(const mha_layer *l, const mha_mask *mask,
                           const mha_score_terms *terms, mha_mask *m,
                           mha_score_terms *t)
{
    int64_t f = l->first;
    if (mask) {
        *m = *mask;
        if (m->keep)
            m->keep += f * m->keep_stride_head;
        if (m->bias)
            m->bias += f * m->bias_stride_head;
    }
    if (terms) {
        *t = *terms;
        if (t->alibi_slopes)
            t->alibi_slopes += f;
        if (t->sinks)
            t->sinks += f;
    }
}

/* A forward's validated request: its problem and plan over the layer's
 * projection buffers, and the sizes the workspace is cut from. */
typedef struct {
    mha_problem p;
    mha_plan pl;
    rows_of rq, rk, rv, ro;
    int64_t nkv, nw_q, total;
    int average;
    /* Self-attention over a fused layer: q, k and v projected as one
     * multiply into [B, L, 3w] rows, the heads read at stride 3w. */
    int fused;
} layer_call;

/* Everything mha_layer_forward_ex checks, nothing written. */
static mha_status layer_prepare(const mha_layer *layer,
                                const mha_layer_args *args, layer_call *c)
{
    /* IEEE whatever flush_subnormals, as mha_validate_attention. */
    MHA_FPENV_SCOPE(0);
    if (!layer || !args)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                        !layer ? "layer" : "args");
    const void *query = args->query, *key = args->key, *value = args->value;
    void *out = args->out;
    const mha_dtype dt = layer->dtype;
    int64_t batch = args->batch, lq = args->lq, lk = args->lk;
    if (!query || !key || !value || !out)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                        !query ? "query"
                        : !key ? "key"
                        : !value ? "value"
                                 : "out");
    const int64_t sizes[3] = {batch, lq, lk};
    const char *names[3] = {"batch", "lq", "lk"};
    for (int i = 0; i < 3; i++)
        if (sizes[i] <= 0)
            return mha_fail(MHA_ERR_BAD_SHAPE, "%s (%lld) must be positive",
                            names[i], (long long)sizes[i]);
    int64_t e = layer->e, h = layer->count, w = layer->width;
    if (args->weights && args->average_weights && layer->shard)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "average_weights over a shard of the heads: ask "
                        "for per-head weights");
    /* The workspace (projected q, k, v, the heads' outputs and, for
     * averaged weights, the per-head weights) and the element counts the
     * views below are built from; the views' own byte extents are checked
     * with them. */
    int64_t nq, nout, twice_q, nw = 0, *nkv = &c->nkv, *nw_q = &c->nw_q,
            *total = &c->total;
    if (!mha_mul_ok(batch, lq, &nq) || !mha_mul_ok(nq, e, &nout) ||
        !mha_mul_ok(nq, w, nw_q) ||
        !mha_mul_ok(batch, lk, nkv) || !mha_mul_ok(*nkv, layer->kdim, total) ||
        !mha_mul_ok(*nkv, layer->vdim, total) ||
        !mha_mul_ok(*nkv, w, total) || !mha_mul_ok(*total, 2, total) ||
        !mha_mul_ok(*nw_q, 2, &twice_q) ||
        !mha_add_ok(*total, twice_q, total) ||
        (args->weights && args->average_weights &&
         (!mha_mul_ok(nq, h, &nw) || !mha_mul_ok(nw, lk, &nw) ||
          !mha_add_ok(*total, nw, total))) ||
        !mha_mul_ok(*total, (int64_t)sizeof(float), total))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "layer sizes B=%lld Lq=%lld Lk=%lld E=%lld overflow",
                        (long long)batch, (long long)lq, (long long)lk,
                        (long long)e);
    mha_status st;
    if ((st = rows_from(args->query_stride_batch, args->query_stride_seq, lq,
                        e, "query", &c->rq)) != MHA_OK ||
        (st = rows_from(args->key_stride_batch, args->key_stride_seq, lk,
                        layer->kdim, "key", &c->rk)) != MHA_OK ||
        (st = rows_from(args->value_stride_batch, args->value_stride_seq, lk,
                        layer->vdim, "value", &c->rv)) != MHA_OK ||
        (st = rows_from(args->out_stride_batch, args->out_stride_seq, lq, e,
                        "out", &c->ro)) != MHA_OK)
        return st;
    /* The caller's buffers go through the same checks as mha_attention's
     * (overlaps, weights, lse, mask, terms); the problem is built by the
     * same constructor, over the layer's own projection buffers. Averaged
     * weights are B * Lq * Lk floats instead of the per-head B * H * Lq *
     * Lk, so the sizes are given. */
    const mha_tensor vq = strided(query, dt, batch, lq, e, c->rq),
                     vk = strided(key, dt, batch, lk, layer->kdim, c->rk),
                     vv = strided(value, dt, batch, lk, layer->vdim, c->rv),
                     vo = strided(out, dt, batch, lq, e, c->ro);
    c->average = args->weights && args->average_weights;
    mha_mask shard_mask;
    mha_score_terms shard_terms;
    shard_heads_of(layer, args->mask, args->terms, &shard_mask, &shard_terms);
    mha_views views = {3, {&vq, &vk, &vv}, {"query", "key", "value"}, &vo,
                       "out", args->weights,
                       args->mask ? &shard_mask : NULL,
                       batch, h, lq, lk, args->terms ? &shard_terms : NULL,
                       args->lse, c->average,
                       /* Read only with averaged weights, whose B*Lq*H*Lk
                        * passed the overflow checks above (nq * h cannot
                        * overflow: nq * w did and h <= w). */
                       c->average ? nq * lk : 0, nq * h, 0};
    mha_mask m;
    mha_score_terms terms;
    if ((st = mha_check_views(&views)) != MHA_OK ||
        (st = mha_check_outputs(&views, &m, &terms)) != MHA_OK)
        return st;

    int64_t d = w / h;
    /* The attention runs on the layer's projection buffers (packed, from
     * mha_alloc: 64-byte aligned), set in mha_layer_forward_ex; the plan
     * sees a placeholder of that alignment, not the caller's query: a bf16
     * query one element off 4 bytes planned the attention off its native
     * bf16 slots (half_native) while reading the aligned buffers. */
    static const _Alignas(64) float aligned_placeholder[1];
    mha_tensor hq = view(aligned_placeholder, dt, batch, lq, h, d),
               hk = view(aligned_placeholder, dt, batch, lk, h, d);
    const mha_tensor ho = view(aligned_placeholder, dt, batch, lq, h, d);
    /* One input array at one set of strides is self-attention: its q, k
     * and v rows are the same rows (a fused layer's inputs are all E
     * wide). The heads then sit in the stacked rows, w and 2w elements
     * in: w fills whole panels, so each head stays as aligned as in a
     * buffer of its own. */
    c->fused = layer->fused && query == key && key == value && lq == lk &&
               c->rk.sb == c->rq.sb && c->rk.ss == c->rq.ss &&
               c->rv.sb == c->rq.sb && c->rv.ss == c->rq.ss;
    if (c->fused) {
        hq.stride_seq = hk.stride_seq = 3 * w;
        hq.stride_batch = hk.stride_batch = 3 * w * lq; /* 3 nq w: checked */
    }
    mha_problem_init(&c->p, &hq, &hk, &hk, &ho, &m, 0.0f,
                     c->average ? out : args->weights);
    c->p.terms = terms;
    c->p.lse = args->lse;
    /* The output projection reads the heads' output (cat) at once, and
     * the head average the weights (docs/design.md). */
    c->p.out_read_next = 1;
    return mha_plan_make(layer->engine, &c->p, &c->pl);
}

mha_status mha_layer_check(const mha_layer *layer, const mha_layer_args *args)
{
    MHA_FPENV_SCOPE(layer ? layer->engine->flush : 0);
    layer_call c;
    return layer_prepare(layer, args, &c);
}

mha_status mha_layer_forward_ex(const mha_layer *layer,
                                const mha_layer_args *args)
{
    MHA_FPENV_SCOPE(layer ? layer->engine->flush : 0);
    layer_call c;
    mha_status st = layer_prepare(layer, args, &c);
    if (st != MHA_OK)
        return st;
    mha_problem p = c.p;
    const mha_plan pl = c.pl;
    const rows_of rq = c.rq, rk = c.rk, rv = c.rv, ro = c.ro;
    const int64_t nkv = c.nkv, nw_q = c.nw_q, total = c.total;
    const int average = c.average;
    const void *query = args->query, *key = args->key, *value = args->value;
    void *out = args->out;
    int64_t batch = args->batch, lq = args->lq, lk = args->lk;
    int64_t e = layer->e, h = layer->count, w = layer->width;
    const mha_engine *en = layer->engine;
    size_t scratch_bytes = pl.bytes;
    size_t buffers = ((size_t)total + 63) / 64 * 64; /* scratch aligned */
    /* The projections' per-thread chunk scratch after the rest (at most
     * MHA_MAX_THREADS x a few E-wide chunks of rows). */
    size_t proj = (size_t)project_scratch_floats(layer) *
                  (size_t)mha_threads_for_call(en, INT64_MAX) * sizeof(float);
    if (scratch_bytes > SIZE_MAX - buffers - proj)
        return mha_fail(MHA_ERR_OVERFLOW, "layer workspace overflows");
    scratch_bytes = (scratch_bytes + 63) / 64 * 64;
    const size_t ws_bytes = buffers + scratch_bytes + proj;
    float *mem = ws_take(layer, ws_bytes);
    if (!mem)
        return mha_fail(MHA_ERR_OUT_OF_MEMORY,
                        "layer workspace of %zu bytes",
                        ws_bytes);
    float *qp = mem, *kp = qp + nw_q, *vp = kp + nkv * w, *cat = vp + nkv * w;
    float *wh = cat + nw_q; /* per-head weights to average, nw floats */
    void *scratch = (char *)mem + buffers;
    float *tmp = (float *)(void *)((char *)scratch + scratch_bytes);

    /* qp, kp, vp, cat: [B, L, w] of the layer's dtype (a bf16 layer uses
     * half of each). */
    const rows_of packed_q = {lq * w, w}, packed_kv = {lk * w, w};
    if (c.fused) {
        /* [B, L, 3w] over qp, kp and vp (3 nq w elements, nkv = nq): the
         * stacked pack's columns are q's, k's and v's, each element the
         * same sum as its own projection's. */
        const rows_of packed_qkv = {lq * 3 * w, 3 * w};
        const size_t es = mha_dtype_size(layer->dtype);
        project(layer, PQ, query, rq, batch, lq, e, 3 * w, qp, packed_qkv,
                tmp);
        p.q = qp, p.k = (char *)qp + (size_t)w * es;
        p.v = (char *)qp + (size_t)(2 * w) * es;
    } else {
        project(layer, PQ, query, rq, batch, lq, e, w, qp, packed_q, tmp);
        project(layer, PK, key, rk, batch, lk, layer->kdim, w, kp, packed_kv,
                tmp);
        project(layer, PV, value, rv, batch, lk, layer->vdim, w, vp,
                packed_kv, tmp);
        p.q = qp, p.k = kp, p.v = vp;
    }
    p.out = cat;
    if (average)
        p.weights = wh;
    mha_attention_run(&en->kernels, &p, &pl, scratch);
    project(layer, PO, cat, packed_q, batch, lq, w, e, out, ro, tmp);
    if (average) {
        /* PyTorch's average_attn_weights: the heads' mean, summed in head
         * order. */
        const float inv = 1.0f / (float)h;
        for (int64_t b = 0; b < batch; b++)
            for (int64_t x = 0; x < lq * lk; x++) {
                float acc = 0.0f;
                for (int64_t hh = 0; hh < h; hh++)
                    acc += wh[(b * h + hh) * lq * lk + x];
                args->weights[b * lq * lk + x] = acc * inv;
            }
    }
    ws_give(layer, mem, ws_bytes);
    return MHA_OK;
}
