/* The benchmark cases: inputs, engines and the call each iteration makes. */
#include "shim.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static char error_message[512];

int bench_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return -1;
}

const char *bench_error(void) { return error_message; }

struct bench_case {
    bench_spec spec;
    mha_engine *engine;
    mha_layer *layer;
    mha_mask mask;
    mha_score_terms terms;
    mha_attention_args args; /* attention and BLAS */
    float *q, *k, *v, *out;  /* the layer: query, key (= value), out */
    float *scratch;          /* BLAS only */
    size_t out_count;
    void *kq, *vq;           /* 8-bit K/V codes and their row scales */
    float *ks, *vs;
    mha_varlen_args vargs;   /* paged and varlen */
    mha_paged_kv paged;
    int32_t *cu, *table, *lens;
    float *slopes;           /* alibi */
};

int64_t bench_varlen_length(int i)
{
    static const int64_t lengths[BENCH_VARLEN_SEQS] = {64,  128,  256,  512,
                                                       768, 1024, 1536, 2048};
    return i >= 0 && i < BENCH_VARLEN_SEQS ? lengths[i] : 0;
}

/* 64-byte aligned, rounded up to whole cache lines as aligned_alloc wants. */
static float *alloc_floats(size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes > 0 ? bytes : 64);
}

/* Uniform in [-amplitude, amplitude) (bench_value). */
static void fill(float *x, size_t n, uint64_t seed, float amplitude)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i)
        x[i] = amplitude * bench_value(seed, i);
}

static mha_tensor make_tensor(float *data, const bench_spec *s, int64_t seq,
                              int64_t heads)
{
    return s->layout == BENCH_LAYOUT_BHSD
               ? mha_tensor_bhsd(data, s->batch, seq, heads, s->d)
               : mha_tensor_bshd(data, s->batch, seq, heads, s->d);
}

/* Rewrites n floats as n half-precision values in place (dtype MHA_F32:
 * nothing to do). In order, so each value is read before it is
 * overwritten. */
static void narrow(float *x, size_t n, mha_dtype dtype)
{
    if (dtype == MHA_F32 || mha_dtype_size(dtype) == 1)
        return; /* 8-bit: quantised by quantize_kv */
    char *bytes = (char *)x;
    for (size_t i = 0; i < n; ++i) {
        float f;
        uint16_t h;
        memcpy(&f, bytes + i * sizeof f, sizeof f);
        if (dtype == MHA_BF16)
            mha_f32_to_bf16(&f, 1, &h);
        else
            mha_f32_to_f16(&f, 1, &h);
        memcpy(bytes + i * sizeof h, &h, sizeof h);
    }
}

/* An 8-bit K/V view t (fp32 values) quantised into new codes with one
 * computed scale per (token, kv head) row. */
static int quantize_kv(mha_tensor *t, mha_dtype dtype, void **codes,
                       float **scales)
{
    size_t rows = (size_t)(t->batch * t->seq * t->heads);
    *codes = alloc_floats((rows * (size_t)t->dim + 3) / 4);
    *scales = alloc_floats(rows);
    if (!*codes || !*scales)
        return bench_fail("out of memory for the 8-bit K/V");
    mha_tensor q = mha_tensor_bshd(*codes, t->batch, t->seq, t->heads,
                                   t->dim);
    if (t->stride_head > t->stride_seq) /* [B, H, S, D] */
        q = mha_tensor_bhsd(*codes, t->batch, t->seq, t->heads, t->dim);
    q.dtype = dtype;
    q.scales = (mha_scales){NULL, t->seq * t->heads, t->heads, 1};
    mha_status st = mha_quantize(t, &q, *scales);
    if (st != MHA_OK)
        return bench_fail("mha_quantize: %s", mha_last_error());
    q.scales.data = *scales;
    *t = q;
    return 0;
}

static int check_spec(const bench_spec *s)
{
    if (mha_dtype_size(s->kv_dtype) == 0)
        return bench_fail("unknown kv_dtype %d", (int)s->kv_dtype);
    if (s->kv_dtype != MHA_F32 && s->impl != BENCH_IMPL_ATTENTION &&
        s->impl != BENCH_IMPL_PAGED &&
        !(s->impl == BENCH_IMPL_LAYER && s->kv_dtype == s->compute))
        return bench_fail("half-precision K/V is for mha_attention only (a "
                          "bf16 layer's projections are its own dtype)");
    if (s->compute != MHA_F32 && s->compute != MHA_F16 && s->compute != MHA_BF16)
        return bench_fail("compute must be MHA_F32, MHA_F16 or MHA_BF16");
    if (s->compute != MHA_F32 && s->impl != BENCH_IMPL_ATTENTION &&
        !(s->impl == BENCH_IMPL_LAYER && s->compute == MHA_BF16))
        return bench_fail("a half compute dtype is for mha_attention (and "
                          "bf16 for the layer) only");
    if (s->impl == BENCH_IMPL_PAGED && s->paged_block <= 0)
        return bench_fail("paged_block must be positive");
    if (s->batch <= 0 || s->heads <= 0 || s->kv_heads <= 0 || s->lq <= 0 ||
        s->lk <= 0 || s->d <= 0 || s->threads <= 0)
        return bench_fail("sizes and threads must be positive");
    if (s->heads % s->kv_heads != 0)
        return bench_fail("kv_heads (%lld) does not divide heads (%lld)",
                          (long long)s->kv_heads, (long long)s->heads);
    if (s->impl == BENCH_IMPL_LAYER && s->kv_heads != s->heads)
        return bench_fail("the layer has no grouped-query form");
    if (s->impl < BENCH_IMPL_ATTENTION || s->impl > BENCH_IMPL_VARLEN_SEQ)
        return bench_fail("unknown impl %d", (int)s->impl);
    if (s->alibi && s->impl != BENCH_IMPL_ATTENTION)
        return bench_fail("alibi is for mha_attention only");
    if (s->softcap != 0.0f && s->impl != BENCH_IMPL_ATTENTION)
        return bench_fail("softcap is for mha_attention only");
#if !defined(MHA_BENCH_HAVE_BLAS)
    if (s->impl == BENCH_IMPL_BLAS)
        return bench_fail("built without OpenBLAS");
#endif
    return 0;
}

static int create_engine(bench_case *c)
{
    mha_config config = {.num_threads = c->spec.threads, .isa = c->spec.isa};
    mha_status st = mha_engine_create(&config, &c->engine);
    if (st != MHA_OK)
        return bench_fail("mha_engine_create(%s, %d threads): %s: %s",
                          mha_isa_name(c->spec.isa), c->spec.threads,
                          mha_status_string(st), mha_last_error());
    return 0;
}

/* q and out of nq floats, k and v of nk elements of the spec's K/V dtype,
 * filled (out zeroed). */
static int alloc_inputs(bench_case *c, size_t nq, size_t nk)
{
    c->q = alloc_floats(nq);
    c->k = alloc_floats(nk);
    c->v = alloc_floats(nk);
    c->out = alloc_floats(nq);
    if (!c->q || !c->k || !c->v || !c->out)
        return bench_fail("out of memory for the inputs");
    fill(c->q, nq, 1, 1.0f);
    fill(c->k, nk, 2, 1.0f);
    fill(c->v, nk, 3, 1.0f);
    /* Half-precision K/V: the same values rounded, in the first half of
     * each buffer (the rest is never read). */
    narrow(c->k, nk, c->spec.kv_dtype);
    narrow(c->v, nk, c->spec.kv_dtype);
    narrow(c->q, nq, c->spec.compute);
    memset(c->out, 0, nq * sizeof(float));
    c->out_count = nq;
    return 0;
}

static int setup_attention(bench_case *c)
{
    const bench_spec *s = &c->spec;
    const size_t nq = (size_t)(s->batch * s->lq * s->heads * s->d);
    const size_t nk = (size_t)(s->batch * s->lk * s->kv_heads * s->d);
    if (alloc_inputs(c, nq, nk) != 0)
        return -1;

    c->args.q = make_tensor(c->q, s, s->lq, s->heads);
    c->args.k = make_tensor(c->k, s, s->lk, s->kv_heads);
    c->args.v = make_tensor(c->v, s, s->lk, s->kv_heads);
    c->args.out = make_tensor(c->out, s, s->lq, s->heads);
    c->args.q.dtype = c->args.out.dtype = s->compute;
    if (mha_dtype_size(s->kv_dtype) == 1) {
        if (quantize_kv(&c->args.k, s->kv_dtype, &c->kq, &c->ks) ||
            quantize_kv(&c->args.v, s->kv_dtype, &c->vq, &c->vs))
            return -1;
    } else {
        c->args.k.dtype = c->args.v.dtype = s->kv_dtype;
    }

    if (s->impl == BENCH_IMPL_ATTENTION)
        return create_engine(c);
#if defined(MHA_BENCH_HAVE_BLAS)
    c->scratch = alloc_floats(bench_blas_scratch_floats(&c->args, s->threads));
    if (!c->scratch)
        return bench_fail("out of memory for the BLAS scores");
#endif
    return 0;
}

/* A paged cache of B sequences of Lk keys: a pool of B * ceil(Lk / block)
 * blocks whose order is a fixed shuffle, one block table row per
 * sequence. K and V as in setup_attention, in the pool's layout. */
static int setup_paged(bench_case *c)
{
    const bench_spec *s = &c->spec;
    const int64_t bs = s->paged_block, per = (s->lk + bs - 1) / bs;
    const int64_t blocks = s->batch * per;
    const size_t nq = (size_t)(s->batch * s->lq * s->heads * s->d);
    const size_t nk = (size_t)(blocks * bs * s->kv_heads * s->d);
    c->table = malloc((size_t)blocks * sizeof *c->table);
    c->lens = malloc((size_t)s->batch * sizeof *c->lens);
    if (!c->table || !c->lens)
        return bench_fail("out of memory for the block table");
    if (alloc_inputs(c, nq, nk) != 0)
        return -1;
    /* A Fisher-Yates shuffle of the block ids from a fixed seed. */
    uint64_t z = 12345;
    for (int64_t i = 0; i < blocks; i++)
        c->table[i] = (int32_t)i;
    for (int64_t i = blocks - 1; i > 0; i--) {
        z = z * 6364136223846793005u + 1442695040888963407u;
        int64_t j = (int64_t)((z >> 33) % (uint64_t)(i + 1));
        int32_t t = c->table[i];
        c->table[i] = c->table[j];
        c->table[j] = t;
    }
    for (int64_t b = 0; b < s->batch; b++)
        c->lens[b] = (int32_t)s->lk;
    c->paged = (mha_paged_kv){c->table, per, 0, c->lens};
    mha_varlen_args *a = &c->vargs;
    a->batch = s->batch;
    a->q = mha_tensor_bshd(c->q, s->batch, s->lq, s->heads, s->d);
    a->out = mha_tensor_bshd(c->out, s->batch, s->lq, s->heads, s->d);
    bench_spec pool = *s;
    pool.batch = blocks;
    a->k = make_tensor(c->k, &pool, bs, s->kv_heads);
    a->v = make_tensor(c->v, &pool, bs, s->kv_heads);
    if (mha_dtype_size(s->kv_dtype) == 1) {
        if (quantize_kv(&a->k, s->kv_dtype, &c->kq, &c->ks) ||
            quantize_kv(&a->v, s->kv_dtype, &c->vq, &c->vs))
            return -1;
    } else {
        a->k.dtype = a->v.dtype = s->kv_dtype;
    }
    a->paged = &c->paged;
    a->causal = MHA_CAUSAL_BOTTOM_RIGHT;
    return create_engine(c);
}

/* The varlen batch, packed: q [1, T, H, d], k and v [1, T, Hkv, d]. */
static int setup_varlen(bench_case *c)
{
    const bench_spec *s = &c->spec;
    c->cu = malloc((BENCH_VARLEN_SEQS + 1) * sizeof *c->cu);
    if (!c->cu)
        return bench_fail("out of memory");
    c->cu[0] = 0;
    for (int i = 0; i < BENCH_VARLEN_SEQS; i++)
        c->cu[i + 1] = c->cu[i] + (int32_t)bench_varlen_length(i);
    const int64_t total = c->cu[BENCH_VARLEN_SEQS];
    const size_t nq = (size_t)(total * s->heads * s->d);
    const size_t nk = (size_t)(total * s->kv_heads * s->d);
    if (alloc_inputs(c, nq, nk) != 0)
        return -1;
    mha_varlen_args *a = &c->vargs;
    a->batch = BENCH_VARLEN_SEQS;
    a->q = mha_tensor_bshd(c->q, 1, total, s->heads, s->d);
    a->k = mha_tensor_bshd(c->k, 1, total, s->kv_heads, s->d);
    a->v = mha_tensor_bshd(c->v, 1, total, s->kv_heads, s->d);
    a->out = mha_tensor_bshd(c->out, 1, total, s->heads, s->d);
    a->cu_seqlens_q = a->cu_seqlens_k = c->cu;
    a->causal = MHA_CAUSAL_BOTTOM_RIGHT;
    return create_engine(c);
}

/* The varlen batch as one mha_attention call per prompt, on views of the
 * same packed arrays. */
static mha_status run_each(bench_case *c)
{
    const bench_spec *s = &c->spec;
    for (int i = 0; i < BENCH_VARLEN_SEQS; i++) {
        const int64_t at = c->cu[i], len = c->cu[i + 1] - at;
        mha_attention_args one = {0};
        one.q = mha_tensor_bshd(c->q + at * s->heads * s->d, 1, len, s->heads,
                                s->d);
        one.k = mha_tensor_bshd(c->k + at * s->kv_heads * s->d, 1, len,
                                s->kv_heads, s->d);
        one.v = mha_tensor_bshd(c->v + at * s->kv_heads * s->d, 1, len,
                                s->kv_heads, s->d);
        one.out = mha_tensor_bshd(c->out + at * s->heads * s->d, 1, len,
                                  s->heads, s->d);
        one.mask = &c->mask;
        mha_status st = mha_attention(c->engine, &one);
        if (st != MHA_OK)
            return st;
    }
    return MHA_OK;
}

/* Self-attention when Lq == Lk (query, key and value the same array), else
 * one array of Lk rows serves as key and value. */
static int setup_layer(bench_case *c)
{
    const bench_spec *s = &c->spec;
    const int64_t e = s->heads * s->d;
    const size_t nq = (size_t)(s->batch * s->lq * e);
    const size_t nk = (size_t)(s->batch * s->lk * e);
    const size_t ee = (size_t)(e * e);
    float *in_w = alloc_floats(3 * ee), *in_b = alloc_floats(3 * (size_t)e);
    float *out_w = alloc_floats(ee), *out_b = alloc_floats((size_t)e);
    int rc = 0;
    c->q = alloc_floats(nq);
    c->k = s->lq == s->lk ? c->q : alloc_floats(nk);
    c->out = alloc_floats(nq);
    if (!in_w || !in_b || !out_w || !out_b || !c->q || !c->k || !c->out) {
        rc = bench_fail("out of memory for the layer");
        goto done;
    }
    /* nn.Linear's initialisation range keeps activations near unit scale. */
    const float bound = 1.0f / sqrtf((float)e);
    fill(in_w, 3 * ee, 4, bound);
    fill(in_b, 3 * (size_t)e, 5, bound);
    fill(out_w, ee, 6, bound);
    fill(out_b, (size_t)e, 7, bound);
    fill(c->q, nq, 1, 1.0f);
    if (c->k != c->q)
        fill(c->k, nk, 2, 1.0f);
    /* A bf16 layer (layer_bf16/): bf16 inputs in the buffers' first
     * halves; the weights stay fp32 (the layer rounds them). */
    narrow(c->q, nq, s->compute);
    if (c->k != c->q)
        narrow(c->k, nk, s->compute);
    memset(c->out, 0, nq * sizeof(float));
    c->out_count = nq;

    rc = create_engine(c);
    if (rc != 0)
        goto done;
    const mha_layer_desc desc = {.embed_dim = e,
                                 .num_heads = s->heads,
                                 .in_proj_weight = in_w,
                                 .in_proj_bias = in_b,
                                 .out_proj_weight = out_w,
                                 .out_proj_bias = out_b,
                                 .dtype = s->compute};
    mha_status st = mha_layer_create(c->engine, &desc, &c->layer);
    if (st != MHA_OK)
        rc = bench_fail("mha_layer_create: %s: %s", mha_status_string(st),
                        mha_last_error());
done:
    free(in_w);
    free(in_b);
    free(out_w);
    free(out_b);
    return rc;
}

bench_case *bench_case_create(const bench_spec *spec)
{
    if (check_spec(spec) != 0)
        return NULL;
    bench_case *c = calloc(1, sizeof *c);
    if (!c) {
        bench_fail("out of memory");
        return NULL;
    }
    c->spec = *spec;
    c->mask.causal = spec->causal;
    c->args.mask = spec->causal != MHA_CAUSAL_NONE ? &c->mask : NULL;
    if (spec->window_left > 0) {
        c->terms.window = 1;
        c->terms.window_left = spec->window_left;
        c->terms.window_right = -1;
        c->args.terms = &c->terms;
    }
    if (spec->softcap > 0.0f) {
        c->terms.softcap = spec->softcap;
        c->args.terms = &c->terms;
    }
    if (spec->alibi) {
        c->slopes = alloc_floats((size_t)spec->heads);
        if (!c->slopes) {
            bench_case_destroy(c);
            bench_fail("out of memory");
            return NULL;
        }
        for (int64_t h = 0; h < spec->heads; h++)
            c->slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)spec->heads);
        c->terms.alibi_slopes = c->slopes;
        c->args.terms = &c->terms;
    }
    if (spec->impl == BENCH_IMPL_VARLEN_SEQ)
        c->mask.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    const int rc = spec->impl == BENCH_IMPL_LAYER  ? setup_layer(c)
                   : spec->impl == BENCH_IMPL_PAGED ? setup_paged(c)
                   : spec->impl == BENCH_IMPL_VARLEN ||
                           spec->impl == BENCH_IMPL_VARLEN_SEQ
                       ? setup_varlen(c)
                       : setup_attention(c);
    if (rc != 0) {
        bench_case_destroy(c);
        return NULL;
    }
    return c;
}

int bench_case_run(bench_case *c)
{
    mha_status st = MHA_OK;
    switch (c->spec.impl) {
    case BENCH_IMPL_ATTENTION:
        st = mha_attention(c->engine, &c->args);
        break;
    case BENCH_IMPL_LAYER: {
        mha_layer_args a = {.query = c->q, .key = c->k, .value = c->k,
                            .out = c->out, .batch = c->spec.batch,
                            .lq = c->spec.lq, .lk = c->spec.lk,
                            .mask = c->args.mask};
        st = mha_layer_forward_ex(c->layer, &a);
        break;
    }
    case BENCH_IMPL_BLAS:
#if defined(MHA_BENCH_HAVE_BLAS)
        bench_blas_attention(&c->args, c->spec.causal, c->spec.threads,
                             c->scratch);
#endif
        break;
    case BENCH_IMPL_PAGED:
    case BENCH_IMPL_VARLEN:
        st = mha_attention_varlen(c->engine, &c->vargs);
        break;
    case BENCH_IMPL_VARLEN_SEQ:
        st = run_each(c);
        break;
    }
    if (st != MHA_OK)
        return bench_fail("%s: %s", mha_status_string(st), mha_last_error());
    return 0;
}

void bench_case_destroy(bench_case *c)
{
    if (!c)
        return;
    mha_layer_destroy(c->layer);
    mha_engine_destroy(c->engine);
    if (c->k != c->q)
        free(c->k);
    free(c->q);
    free(c->v);
    free(c->out);
    free(c->scratch);
    free(c->kq), free(c->vq), free(c->ks), free(c->vs);
    free(c->cu), free(c->table), free(c->lens);
    free(c->slopes);
    free(c);
}

const float *bench_case_output(const bench_case *c, size_t *count)
{
    *count = c->out_count;
    return c->out;
}

double bench_spec_flops(const bench_spec *s)
{
    if (s->impl == BENCH_IMPL_VARLEN || s->impl == BENCH_IMPL_VARLEN_SEQ) {
        double sum = 0.0;
        for (int i = 0; i < BENCH_VARLEN_SEQS; i++) {
            const double len = (double)bench_varlen_length(i);
            sum += 4.0 * (double)s->heads * len * len * (double)s->d;
        }
        return sum;
    }
    const double core = 4.0 * (double)s->batch * (double)s->heads *
                        (double)s->lq * (double)s->lk * (double)s->d;
    if (s->impl != BENCH_IMPL_LAYER)
        return core;
    const double e = (double)(s->heads * s->d);
    /* q and output projections over Lq rows, k and v over Lk rows. */
    return core + 2.0 * (double)s->batch * e * e *
                      (2.0 * (double)s->lq + 2.0 * (double)s->lk);
}

double bench_spec_kv_bytes(const bench_spec *s)
{
    const double size = (double)mha_dtype_size(s->kv_dtype);
    return 2.0 * (double)s->batch * (double)s->lk * (double)s->kv_heads *
           (double)s->d * size;
}

int bench_isa_supported(mha_isa isa)
{
    return mha_isa_available(isa);
}

int bench_have_blas(void)
{
#if defined(MHA_BENCH_HAVE_BLAS)
    return 1;
#else
    return 0;
#endif
}

int bench_core_count(void) { return omp_get_num_procs(); }

const char *bench_cpu_model(void)
{
    static char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return model;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        /* "model name" on x86, "Model" or "CPU part" elsewhere. */
        const char *colon = strchr(line, ':');
        if (!colon || (strncmp(line, "model name", 10) != 0 &&
                       strncmp(line, "Model", 5) != 0))
            continue;
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            ++v;
        snprintf(model, sizeof model, "%s", v);
        model[strcspn(model, "\n")] = '\0';
        break;
    }
    fclose(f);
    return model;
}
