/* libmha over MPI (docs/design.md, "MPI"): the agreement protocol, the
 * tensor-parallel layer and sequence-parallel attention. Every step that
 * computes is a libmha call on this rank's engine; this file only checks
 * what must match across ranks, moves partial results and combines them
 * in rank order. */
#include <fenv.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha_mpi.h"
#include "mpi_test_hooks.h"

/* ---- Messages ---------------------------------------------------------- */

#define MSG_BYTES 512

static _Thread_local char last_error[MSG_BYTES];

const char *mha_mpi_last_error(void)
{
    return last_error;
}

static mha_status fail(mha_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

/* A libmha call's failure, its message kept. */
static mha_status local(mha_status st)
{
    if (st != MHA_OK)
        snprintf(last_error, sizeof last_error, "%s", mha_last_error());
    return st;
}

static mha_status mpi_failed(int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, s, &n) != MPI_SUCCESS)
        snprintf(s, sizeof s, "error %d", rc);
    return fail(MHA_ERR_BAD_ARGUMENT, "%s failed: %s", what, s);
}

/* ---- Agreement ----------------------------------------------------------- */

/* Values every rank must give alike, with their names for the message. */
#define MAX_SAME 24
typedef struct {
    int n;
    int64_t v[MAX_SAME];
    const char *name[MAX_SAME];
} same_values;

static void same(same_values *s, const char *name, int64_t v)
{
    if (s->n < MAX_SAME) {
        s->name[s->n] = name;
        s->v[s->n++] = v;
    }
}

static int64_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (int64_t)u;
}

/* The collective every call starts with (and, with s NULL, the one after
 * computing, where only memory can fail): one MPI_Allreduce(MAX) of the
 * first failing rank with its status, and of each same value and its
 * negation (its maximum and minimum). A failure is then broadcast from
 * the first failing rank, so every rank returns its status and message;
 * values that differ fail every rank with MHA_ERR_BAD_SHAPE naming the
 * first of them. Every rank makes the same calls whatever it found. */
static mha_status settle(MPI_Comm comm, mha_status st, const same_values *s)
{
    int rank, size, rc;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    /* A fixed count: a rank that failed before filling its values still
     * makes the same call (its values are not compared). */
    int n = s ? s->n : 0;
    int64_t buf[1 + 2 * MAX_SAME] = {0}, red[1 + 2 * MAX_SAME];
    /* The lowest failing rank has the largest (size - rank); its status
     * rides in the low bits. */
    buf[0] = st == MHA_OK ? 0 : (int64_t)(size - rank) * 256 + (int64_t)st;
    for (int i = 0; i < n; i++) {
        buf[1 + i] = s->v[i];
        buf[1 + MAX_SAME + i] = -s->v[i];
    }
    rc = MPI_Allreduce(buf, red, 1 + 2 * MAX_SAME, MPI_INT64_T, MPI_MAX,
                       comm);
    if (rc != MPI_SUCCESS)
        return mpi_failed(rc, "MPI_Allreduce (agreement)");
    if (red[0] != 0) {
        int root = size - (int)(red[0] / 256);
        mha_status agreed = (mha_status)(red[0] % 256);
        char msg[MSG_BYTES];
        memcpy(msg, last_error, sizeof msg);
        rc = MPI_Bcast(msg, MSG_BYTES, MPI_CHAR, root, comm);
        if (rc != MPI_SUCCESS)
            return mpi_failed(rc, "MPI_Bcast (error message)");
        msg[MSG_BYTES - 1] = '\0';
        if (rank != root)
            fail(agreed, "rank %d: %s", root, msg);
        return agreed;
    }
    for (int i = 0; i < n; i++)
        if (red[1 + i] != -red[1 + MAX_SAME + i])
            return fail(MHA_ERR_BAD_SHAPE,
                        "%s differs across ranks (%lld here, from %lld to "
                        "%lld)",
                        s->name[i], (long long)s->v[i],
                        (long long)-red[1 + MAX_SAME + i],
                        (long long)red[1 + i]);
    return MHA_OK;
}

/* The checks that come before settle: a usable communicator. */
static mha_status comm_ok(MPI_Comm comm)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return fail(MHA_ERR_BAD_ARGUMENT, "MPI is %s",
                    init ? "finalized" : "not initialized");
    if (comm == MPI_COMM_NULL)
        return fail(MHA_ERR_BAD_ARGUMENT, "comm is MPI_COMM_NULL");
    return MHA_OK;
}

/* Every allocation of this file goes through mpi_alloc or alloc_floats,
 * with a failure hook for the tests (mpi/mpi_test_hooks.h), as the engine's
 * allocator has. */
static atomic_long fail_countdown = -1; /* < 0: never fail */
static atomic_long alloc_count = 0;

long mha_mpi_test_fail_alloc_after(long n)
{
    atomic_store(&fail_countdown, n);
    return atomic_exchange(&alloc_count, 0);
}

/* Whether the hook fails this allocation (and counts it). */
static int hook_fails(void)
{
    atomic_fetch_add(&alloc_count, 1);
    return atomic_load(&fail_countdown) >= 0 &&
           atomic_fetch_sub(&fail_countdown, 1) == 0;
}

/* n * size zeroed bytes (at least one), or NULL. */
static void *mpi_alloc(size_t n, size_t size)
{
    if (hook_fails())
        return NULL;
    return n && size ? calloc(n, size) : calloc(1, 1);
}

/* n floats, not zeroed (at least one byte), or NULL. */
static void *alloc_floats(size_t n)
{
    if (hook_fails())
        return NULL;
    return malloc(n ? n * sizeof(float) : 1);
}

/* ---- Tensor-parallel layer ------------------------------------------- */

struct mha_mpi_layer {
    MPI_Comm comm;
    int rank, size;
    mha_layer *shard;
    int64_t e, heads, first, count;
    float *out_bias; /* [E] or NULL */
};

void mha_mpi_layer_heads(const mha_mpi_layer *layer, int64_t *first,
                         int64_t *count)
{
    if (first)
        *first = layer ? layer->first : 0;
    if (count)
        *count = layer ? layer->count : 0;
}

static void layer_free(mha_mpi_layer *l)
{
    mha_layer_destroy(l->shard);
    free(l->out_bias);
    free(l);
}

void mha_mpi_layer_destroy(mha_mpi_layer *layer)
{
    if (!layer)
        return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Comm_free(&layer->comm);
    layer_free(layer);
}

mha_status mha_mpi_layer_create(const mha_engine *engine, MPI_Comm comm,
                                const mha_layer_desc *desc,
                                mha_mpi_layer **layer)
{
    mha_status st = comm_ok(comm);
    if (st != MHA_OK)
        return st;
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    mha_mpi_layer *l = mpi_alloc(1, sizeof *l);
    same_values sv = {0};
    if (!l)
        st = fail(MHA_ERR_OUT_OF_MEMORY, "layer allocation failed");
    else if (!engine || !desc || !layer)
        st = fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                  !engine ? "engine" : !desc ? "desc" : "layer");
    else if (desc->num_heads <= 0 || desc->num_heads % size != 0)
        st = fail(MHA_ERR_BAD_SHAPE,
                  "desc.num_heads (%lld) is not a positive multiple of the "
                  "communicator's size (%d)",
                  (long long)desc->num_heads, size);
    else {
        int64_t count = desc->num_heads / size, first = rank * count;
        if ((desc->shard_heads || desc->shard_first) &&
            (desc->shard_heads != count || desc->shard_first != first))
            st = fail(MHA_ERR_BAD_ARGUMENT,
                      "desc.shard_first/shard_heads (%lld, %lld) are not "
                      "rank %d's heads (%lld, %lld)",
                      (long long)desc->shard_first,
                      (long long)desc->shard_heads, rank, (long long)first,
                      (long long)count);
        else {
            mha_layer_desc d = *desc;
            d.shard_first = first, d.shard_heads = count;
            st = local(mha_layer_create(engine, &d, &l->shard));
            l->e = desc->embed_dim, l->heads = desc->num_heads;
            l->first = first, l->count = count;
        }
        if (st == MHA_OK && desc->out_proj_bias) {
            l->out_bias = alloc_floats((size_t)l->e);
            if (!l->out_bias)
                st = fail(MHA_ERR_OUT_OF_MEMORY, "out_proj_bias copy");
            else
                memcpy(l->out_bias, desc->out_proj_bias,
                       (size_t)l->e * sizeof(float));
        }
    }
    if (desc) {
        same(&sv, "desc.embed_dim", desc->embed_dim);
        same(&sv, "desc.num_heads", desc->num_heads);
        same(&sv, "desc.kdim", desc->kdim ? desc->kdim : desc->embed_dim);
        same(&sv, "desc.vdim", desc->vdim ? desc->vdim : desc->embed_dim);
        same(&sv, "desc.in_proj_bias (given)", desc->in_proj_bias != NULL);
        same(&sv, "desc.out_proj_bias (given)", desc->out_proj_bias != NULL);
    }
    if ((st = settle(comm, st, desc ? &sv : NULL)) == MHA_OK) {
        int rc = MPI_Comm_dup(comm, &l->comm);
        if (rc != MPI_SUCCESS)
            st = mpi_failed(rc, "MPI_Comm_dup");
    }
    if (st != MHA_OK) {
        if (l)
            layer_free(l);
        return st;
    }
    l->rank = rank, l->size = size;
    *layer = l;
    return MHA_OK;
}

/* Row slice s of n rows over P ranks: [n*s/P, n*(s+1)/P). */
static int slice_at(int64_t n, int s, int p)
{
    return (int)(n * s / p);
}

mha_status mha_mpi_layer_forward(const mha_mpi_layer *layer,
                                 const mha_layer_args *args)
{
    if (!layer)
        return fail(MHA_ERR_NULL_POINTER, "layer is NULL");
    MPI_Comm comm = layer->comm;
    const int p = layer->size, rank = layer->rank;
    const int64_t e = layer->e;
    mha_status st = MHA_OK;
    same_values sv = {0};
    float *part = NULL, *acc = NULL, *recv = NULL, *full = NULL, *w = NULL,
          *lse = NULL;
    int *counts = NULL; /* the slices' counts and displacements */
    int64_t n = 0, nw = 0, nl = 0; /* rows, weights and lse floats */
    if (!args)
        st = fail(MHA_ERR_NULL_POINTER, "args is NULL");
    else if ((st = local(mha_layer_check(layer->shard, args))) == MHA_OK) {
        /* The sizes were checked against overflow by mha_layer_check. */
        n = args->batch * args->lq;
        nl = n * layer->count;
        nw = args->weights ? nl * args->lk : 0;
        if (n >= INT32_MAX)
            st = fail(MHA_ERR_OVERFLOW,
                      "batch * lq (%lld) rows exceed one MPI count",
                      (long long)n);
    }
    int mine = 0;
    if (st == MHA_OK) {
        mine = slice_at(n, rank + 1, p) - slice_at(n, rank, p);
        part = alloc_floats((size_t)(n * e));
        full = alloc_floats((size_t)(n * e));
        recv = alloc_floats((size_t)mine * (size_t)p * (size_t)e);
        acc = alloc_floats((size_t)mine * (size_t)e);
        w = args->weights ? alloc_floats((size_t)nw) : NULL;
        lse = args->lse ? alloc_floats((size_t)nl) : NULL;
        counts = mpi_alloc(4 * (size_t)p, sizeof *counts);
        if (!part || !full || !recv || !acc || !counts ||
            (args->weights && !w) ||
            (args->lse && !lse))
            st = fail(MHA_ERR_OUT_OF_MEMORY,
                      "tensor-parallel buffers of %lld x %lld floats",
                      (long long)n, (long long)e);
    }
    if (args) {
        same(&sv, "batch", args->batch);
        same(&sv, "lq", args->lq);
        same(&sv, "lk", args->lk);
        same(&sv, "weights (given)", args->weights != NULL);
        same(&sv, "lse (given)", args->lse != NULL);
        same(&sv, "mask.causal", args->mask ? (int64_t)args->mask->causal : 0);
    }
    if ((st = settle(comm, st, args ? &sv : NULL)) == MHA_OK) {
        /* This rank's heads into its own buffers: outputs are written
         * only once every rank has computed. */
        mha_layer_args a = *args;
        a.out = part;
        a.out_stride_batch = a.out_stride_seq = 0;
        a.weights = w, a.lse = lse;
        st = settle(comm, local(mha_layer_forward_ex(layer->shard, &a)),
                    NULL);
    }
    MPI_Datatype row = MPI_DATATYPE_NULL;
    if (st == MHA_OK) {
        int rc = MPI_SUCCESS;
        /* counts, displacements of the slices; mine from every rank. */
        int *sc = counts, *sd = sc + p, *rcnt = sd + p, *rd = rcnt + p;
        for (int s = 0; s < p; s++) {
            sd[s] = slice_at(n, s, p);
            sc[s] = slice_at(n, s + 1, p) - sd[s];
            rcnt[s] = mine;
            rd[s] = s * mine;
        }
        rc = MPI_Type_contiguous((int)e, MPI_FLOAT, &row);
        if (rc == MPI_SUCCESS)
            rc = MPI_Type_commit(&row);
        if (rc == MPI_SUCCESS)
            rc = MPI_Alltoallv(part, sc, sd, row, recv, rcnt, rd, row, comm);
        if (rc == MPI_SUCCESS) {
            /* Rank order, then the bias once: the same bits for every run
             * and thread count, and in C's default environment (round to
             * nearest, no traps), whatever the caller's, as libmha's own
             * calls compute (docs/design.md, "The floating-point
             * environment"); fesetenv gives the caller's back, flags
             * included. */
            fenv_t caller;
            fegetenv(&caller);
            fesetenv(FE_DFL_ENV);
            size_t m = (size_t)mine * (size_t)e;
            memcpy(acc, recv, m * sizeof *acc);
            for (int s = 1; s < p; s++)
                for (size_t i = 0; i < m; i++)
                    acc[i] += recv[(size_t)s * m + i];
            if (layer->out_bias)
                for (size_t i = 0; i < m; i++)
                    acc[i] += layer->out_bias[i % (size_t)e];
            fesetenv(&caller);
            rc = MPI_Allgatherv(acc, mine, row, full, sc, sd, row, comm);
        }
        if (row != MPI_DATATYPE_NULL)
            MPI_Type_free(&row);
        if (rc != MPI_SUCCESS)
            st = mpi_failed(rc, "the tensor-parallel exchange");
    }
    if (st == MHA_OK) {
        int64_t sb = args->out_stride_batch, ss = args->out_stride_seq;
        if (sb == 0 && ss == 0)
            ss = e, sb = args->lq * e;
        for (int64_t b = 0; b < args->batch; b++)
            for (int64_t i = 0; i < args->lq; i++)
                memcpy((float *)args->out + b * sb + i * ss,
                       full + (b * args->lq + i) * e,
                       (size_t)e * sizeof(float));
        if (w)
            memcpy(args->weights, w, (size_t)nw * sizeof *w);
        if (lse)
            memcpy(args->lse, lse, (size_t)nl * sizeof *lse);
    }
    free(part), free(acc), free(recv), free(full), free(w), free(lse);
    free(counts);
    return st;
}

/* ---- Sequence-parallel attention ------------------------------------- */

/* What every rank's call must share: the queries' shape, the K/V heads
 * and value width, the masking and the terms (pointers only as given or
 * not: their contents are the caller's to keep alike). */
static void attention_same(same_values *sv, const mha_tensor *q,
                           const mha_tensor *k, const mha_tensor *v,
                           mha_causal causal, const mha_score_terms *t,
                           float scale, int scale_explicit, const float *lse)
{
    same(sv, "q.batch", q->batch);
    same(sv, "q.seq", q->seq);
    same(sv, "q.heads", q->heads);
    same(sv, "q.dim", q->dim);
    same(sv, "k.heads", k->heads);
    same(sv, "v.dim", v->dim);
    same(sv, "causal", (int64_t)causal);
    same(sv, "scale", float_bits(scale));
    same(sv, "scale_explicit", scale_explicit != 0);
    same(sv, "lse (given)", lse != NULL);
    mha_score_terms none = {0};
    if (!t)
        t = &none;
    same(sv, "terms.window", t->window);
    same(sv, "terms.window_left", t->window_left);
    same(sv, "terms.window_right", t->window_right);
    same(sv, "terms.align", (int64_t)t->align);
    same(sv, "terms.softcap", float_bits(t->softcap));
    same(sv, "terms.alibi_slopes (given)", t->alibi_slopes != NULL);
    same(sv, "terms.sinks (given)", t->sinks != NULL);
}

/* The caller's terms must leave positions to the library. */
static mha_status positions_free(const mha_score_terms *t)
{
    if (t && (t->key_offset || t->key_total || t->key_offsets ||
              t->key_totals))
        return fail(MHA_ERR_BAD_ARGUMENT,
                    "terms.%s is set: sequence-parallel attention sets the "
                    "positions from the ranks' shards",
                    t->key_offset    ? "key_offset"
                    : t->key_total   ? "key_total"
                    : t->key_offsets ? "key_offsets"
                                     : "key_totals");
    return MHA_OK;
}

/* One rank's partial result: out [mb, ml, H, dv] then lse [mb, H, ml],
 * packed, n floats in all; parts of every rank land side by side. */
typedef struct {
    int64_t mb, ml, heads, dv, n_out, n;
    float *mine, *all;
    mha_tensor *outs;
    const float **lses;
    int64_t *counts; /* the ranks' key counts, per sequence */
} partials;

static mha_status partials_alloc(partials *pt, int p, int64_t mb, int64_t ml,
                                 int64_t heads, int64_t dv, int64_t seqs)
{
    memset(pt, 0, sizeof *pt);
    pt->mb = mb, pt->ml = ml, pt->heads = heads, pt->dv = dv;
    /* The sizes were checked against overflow by the local check. */
    pt->n_out = mb * ml * heads * dv;
    pt->n = pt->n_out + mb * heads * ml;
    if (pt->n >= INT32_MAX)
        return fail(MHA_ERR_OVERFLOW,
                    "a rank's partial output (%lld floats) exceeds one MPI "
                    "count",
                    (long long)pt->n);
    pt->mine = alloc_floats((size_t)pt->n);
    pt->all = alloc_floats((size_t)pt->n * (size_t)p);
    pt->outs = mpi_alloc((size_t)p, sizeof *pt->outs);
    pt->lses = mpi_alloc((size_t)p, sizeof *pt->lses);
    pt->counts = mpi_alloc((size_t)p * (size_t)seqs, sizeof *pt->counts);
    if (!pt->mine || !pt->all || !pt->outs || !pt->lses || !pt->counts)
        return fail(MHA_ERR_OUT_OF_MEMORY,
                    "sequence-parallel buffers of %d x %lld floats", p,
                    (long long)pt->n);
    return MHA_OK;
}

static void partials_free(partials *pt)
{
    free(pt->mine), free(pt->all), free(pt->outs), free(pt->lses);
    free(pt->counts);
}

/* Every rank's key counts (seqs per rank), then this rank's offsets and
 * the totals, per sequence; positions past 2^61 fail every rank alike. */
static mha_status exchange_counts(MPI_Comm comm, partials *pt,
                                  const int64_t *mine, int64_t seqs,
                                  int64_t *offsets, int64_t *totals)
{
    int rank, p;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &p);
    int rc = MPI_Allgather(mine, (int)seqs, MPI_INT64_T, pt->counts,
                           (int)seqs, MPI_INT64_T, comm);
    if (rc != MPI_SUCCESS)
        return mpi_failed(rc, "MPI_Allgather (key counts)");
    for (int64_t b = 0; b < seqs; b++) {
        offsets[b] = totals[b] = 0;
        for (int r = 0; r < p; r++) {
            int64_t c = pt->counts[r * seqs + b];
            if (r < rank)
                offsets[b] += c;
            totals[b] += c;
            if (totals[b] > INT64_MAX / 4)
                return fail(MHA_ERR_BAD_ARGUMENT,
                            "sequence %lld's keys over all ranks exceed "
                            "2^61 positions",
                            (long long)b);
        }
    }
    return MHA_OK;
}

/* Gathers every rank's partial and merges them in rank order into out
 * and lse, the same bits on every rank. */
static mha_status gather_merge(MPI_Comm comm, partials *pt,
                               const mha_tensor *out, float *lse)
{
    int p;
    MPI_Comm_size(comm, &p);
    MPI_Datatype part;
    int rc = MPI_Type_contiguous((int)pt->n, MPI_FLOAT, &part);
    if (rc == MPI_SUCCESS && (rc = MPI_Type_commit(&part)) == MPI_SUCCESS) {
        rc = MPI_Allgather(pt->mine, 1, part, pt->all, 1, part, comm);
        MPI_Type_free(&part);
    }
    if (rc != MPI_SUCCESS)
        return mpi_failed(rc, "MPI_Allgather (partial results)");
    for (int r = 0; r < p; r++) {
        float *at = pt->all + (size_t)r * (size_t)pt->n;
        pt->outs[r] = mha_tensor_bshd(at, pt->mb, pt->ml, pt->heads, pt->dv);
        pt->lses[r] = at + pt->n_out;
    }
    mha_merge_args m = {.parts = p, .outs = pt->outs, .lses = pt->lses,
                        .out = *out, .lse = lse};
    return local(mha_merge_states(&m));
}

/* The local checks both attention forms start with, before their own
 * libmha check: pointers, weights (refused), positions (the library's). */
static mha_status attention_args_ok(const mha_engine *engine, const void *args,
                                    mha_dtype compute, const float *weights,
                                    const mha_score_terms *terms)
{
    if (!engine || !args)
        return fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                    !engine ? "engine" : "args");
    /* Partials travel and merge in fp32 (mha_merge_states). */
    if (compute != MHA_F32)
        return fail(MHA_ERR_UNSUPPORTED,
                    "q.dtype (%s): the sequence-parallel calls take fp32 q "
                    "and out", mha_dtype_name(compute));
    if (weights)
        return fail(MHA_ERR_UNSUPPORTED,
                    "weights: a shard's probabilities are not the "
                    "sequence's; ask for lse");
    return positions_free(terms);
}

mha_status mha_mpi_attention(const mha_engine *engine, MPI_Comm comm,
                             const mha_attention_args *args)
{
    mha_status st = comm_ok(comm);
    if (st != MHA_OK)
        return st;
    int rank, p;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &p);
    same_values sv = {0};
    partials pt;
    memset(&pt, 0, sizeof pt);
    if ((st = attention_args_ok(engine, args, args ? args->q.dtype : MHA_F32,
                                args ? args->weights : NULL,
                                args ? args->terms : NULL)) == MHA_OK &&
        (st = local(mha_attention_check(engine, args))) == MHA_OK)
        st = partials_alloc(&pt, p, args->q.batch, args->q.seq,
                            args->q.heads, args->v.dim, 1);
    if (args)
        attention_same(&sv, &args->q, &args->k, &args->v,
                       args->mask ? args->mask->causal : MHA_CAUSAL_NONE,
                       args->terms, args->scale, args->scale_explicit,
                       args->lse);
    int64_t offset = 0, total = 0;
    if ((st = settle(comm, st, args ? &sv : NULL)) == MHA_OK &&
        (st = exchange_counts(comm, &pt, &args->k.seq, 1, &offset, &total)) ==
            MHA_OK) {
        mha_score_terms t = args->terms ? *args->terms : (mha_score_terms){0};
        t.key_offset = offset, t.key_total = total;
        if (rank != 0)
            t.sinks = NULL; /* the sink joins the denominator once */
        mha_attention_args a = *args;
        a.terms = &t;
        a.out = mha_tensor_bshd(pt.mine, pt.mb, pt.ml, pt.heads, pt.dv);
        a.lse = pt.mine + pt.n_out;
        st = settle(comm, local(mha_attention(engine, &a)), NULL);
    }
    if (st == MHA_OK)
        st = gather_merge(comm, &pt, &args->out, args->lse);
    partials_free(&pt);
    return st;
}

mha_status mha_mpi_attention_varlen(const mha_engine *engine, MPI_Comm comm,
                                    const mha_varlen_args *args)
{
    mha_status st = comm_ok(comm);
    if (st != MHA_OK)
        return st;
    int rank, p;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &p);
    same_values sv = {0};
    partials pt;
    memset(&pt, 0, sizeof pt);
    int64_t *pos = NULL, B = args ? args->batch : 0;
    if ((st = attention_args_ok(engine, args, args ? args->q.dtype : MHA_F32,
                                args ? args->weights : NULL,
                                args ? args->terms : NULL)) == MHA_OK &&
        (st = local(mha_attention_varlen_check(engine, args))) == MHA_OK) {
        /* Packed queries merge as one [1, total_q] batch. */
        int packed = args->cu_seqlens_q != NULL;
        st = partials_alloc(&pt, p, packed ? 1 : B, args->q.seq,
                            args->q.heads, args->out.dim, B);
        pos = mpi_alloc(3 * (size_t)B, sizeof *pos);
        if (st == MHA_OK && !pos)
            st = fail(MHA_ERR_OUT_OF_MEMORY, "positions of %lld sequences",
                      (long long)B);
        for (int64_t b = 0; st == MHA_OK && b < B; b++)
            pos[2 * B + b] = args->cu_seqlens_k
                                 ? args->cu_seqlens_k[b + 1] -
                                       args->cu_seqlens_k[b]
                                 : args->paged->seqlens[b];
    }
    if (args) {
        attention_same(&sv, &args->q, &args->k, &args->v, args->causal,
                       args->terms, args->scale, args->scale_explicit,
                       args->lse);
        same(&sv, "batch", args->batch);
        same(&sv, "cu_seqlens_q (given)", args->cu_seqlens_q != NULL);
        /* The packed queries' boundaries must match too: a hash of them. */
        uint64_t h = 1469598103934665603ull;
        for (int64_t b = 0; args->cu_seqlens_q && b <= B && B > 0 &&
                            st == MHA_OK;
             b++)
            h = (h ^ (uint64_t)(uint32_t)args->cu_seqlens_q[b]) *
                1099511628211ull;
        same(&sv, "cu_seqlens_q", (int64_t)(h >> 2));
    }
    if ((st = settle(comm, st, args ? &sv : NULL)) == MHA_OK &&
        (st = exchange_counts(comm, &pt, pos + 2 * B, B, pos, pos + B)) ==
            MHA_OK) {
        mha_score_terms t = args->terms ? *args->terms : (mha_score_terms){0};
        t.key_offsets = pos, t.key_totals = pos + B;
        if (rank != 0)
            t.sinks = NULL; /* the sink joins the denominator once */
        mha_varlen_args a = *args;
        a.terms = &t;
        a.out = args->out;
        a.out.data = pt.mine;
        a.out.stride_head = pt.dv;
        a.out.stride_seq = pt.heads * pt.dv;
        a.out.stride_batch = pt.ml * pt.heads * pt.dv;
        a.lse = pt.mine + pt.n_out;
        st = settle(comm, local(mha_attention_varlen(engine, &a)), NULL);
    }
    if (st == MHA_OK) {
        mha_tensor out = args->out;
        if (args->cu_seqlens_q)
            out.batch = 1; /* [1, total_q, H, dv] */
        st = gather_merge(comm, &pt, &out, args->lse);
    }
    partials_free(&pt);
    free(pos);
    return st;
}
