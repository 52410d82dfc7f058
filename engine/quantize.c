/* mha_quantize: fp32 rows into an 8-bit K/V cache (docs/design.md,
 * "Dtypes"). Validation first, then (when asked) the scales, then the
 * codes. mha_quantize_paged runs the same loops one token at a time, on
 * a [1, 1, heads, dim] view of its slot. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "engine.h"

/* y rounded to an integer, ties to even, whatever the rounding mode. */
static double round_even(double y)
{
    double r = floor(y), f = y - r;
    if (f > 0.5 || (f == 0.5 && fmod(r, 2.0) != 0.0))
        r += 1.0;
    return r;
}

static int8_t to_i8(double y)
{
    if (y != y)
        return 0; /* int8 has no NaN */
    if (y >= 127.0)
        return 127;
    if (y <= -127.0)
        return -127;
    return (int8_t)round_even(y);
}

/* An OCP fp8 format: mantissa bits, exponent bias, largest finite value
 * and its code, whether it has infinities, its NaN code. */
typedef struct {
    int mbits, bias;
    double max;
    uint8_t max_code, nan_code;
    int has_inf;
} fp8_format;

static const fp8_format E4M3 = {3, 7, 448.0, 0x7E, 0x7F, 0};
static const fp8_format E5M2 = {2, 15, 57344.0, 0x7B, 0x7E, 1};

/* y to the nearest code, ties to even; finite values past max saturate. */
static uint8_t to_fp8(double y, const fp8_format *f)
{
    uint8_t sign = signbit(y) ? 0x80u : 0u;
    if (y != y)
        return sign | f->nan_code;
    double a = fabs(y);
    if (isinf(a) && f->has_inf)
        return sign | (uint8_t)(0x7Fu << f->mbits & 0x7Fu);
    if (a >= f->max)
        return sign | f->max_code;
    if (a == 0.0)
        return sign;
    const int emin = 1 - f->bias;
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    int E = e - 1 < emin ? emin : e - 1;
    double step = ldexp(1.0, E - f->mbits);
    double q = round_even(a / step) * step; /* <= max: a < max */
    if (q == 0.0)
        return sign;
    frexp(q, &e);
    E = e - 1;
    if (E < emin) /* subnormal */
        return sign | (uint8_t)(q / ldexp(1.0, emin - f->mbits));
    unsigned m = (unsigned)((ldexp(q, -E) - 1.0) * (1 << f->mbits));
    return sign | (uint8_t)((unsigned)(E + f->bias) << f->mbits | m);
}

static const float *row_f32(const mha_tensor *t, int64_t b, int64_t s,
                            int64_t h)
{
    return (const float *)t->data + b * t->stride_batch + s * t->stride_seq +
           h * t->stride_head;
}

static float *scale_at(float *base, const mha_scales *sc, int64_t b,
                       int64_t s, int64_t h)
{
    return base + b * sc->stride_batch + s * sc->stride_seq +
           h * sc->stride_head;
}

/* Computes the scales at out (dst's scale strides): each slot first holds
 * minus the absmax of its rows' finite elements (<= 0: not yet final),
 * then absmax / qmax (> 0), so a slot several rows share is finished
 * once. */
static void compute_scales(const mha_tensor *src, const mha_tensor *dst,
                           float qmax, float *out)
{
    const mha_scales *sc = &dst->scales;
    int64_t B = src->batch, L = src->seq, H = src->heads, D = src->dim;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < L; s++)
            for (int64_t h = 0; h < H; h++)
                *scale_at(out, sc, b, s, h) = 0.0f;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < L; s++)
            for (int64_t h = 0; h < H; h++) {
                const float *x = row_f32(src, b, s, h);
                float *slot = scale_at(out, sc, b, s, h), m = -*slot;
                for (int64_t c = 0; c < D; c++) {
                    float a = fabsf(x[c]);
                    if (a <= FLT_MAX && a > m) /* NaN, inf left out */
                        m = a;
                }
                *slot = -m;
            }
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < L; s++)
            for (int64_t h = 0; h < H; h++) {
                float *slot = scale_at(out, sc, b, s, h);
                if (*slot > 0.0f)
                    continue;
                float m = -*slot, x = m / qmax;
                *slot = m == 0.0f ? 1.0f : x < FLT_MIN ? FLT_MIN : x;
            }
}

static void quantize_rows(const mha_tensor *src, const mha_tensor *dst,
                          const float *scales)
{
    const mha_scales *sc = &dst->scales;
    int64_t B = src->batch, L = src->seq, H = src->heads, D = src->dim;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < L; s++)
            for (int64_t h = 0; h < H; h++) {
                const float *x = row_f32(src, b, s, h);
                double scale = *scale_at((float *)scales, sc, b, s, h);
                uint8_t *y = (uint8_t *)dst->data +
                             b * dst->stride_batch + s * dst->stride_seq +
                             h * dst->stride_head;
                for (int64_t c = 0; c < D; c++) {
                    double v = (double)x[c] / scale;
                    switch (dst->dtype) {
                    case MHA_I8: {
                        int8_t q = to_i8(v);
                        memcpy(&y[c], &q, 1);
                        break;
                    }
                    case MHA_FP8_E4M3: y[c] = to_fp8(v, &E4M3); break;
                    case MHA_FP8_E5M2: y[c] = to_fp8(v, &E5M2); break;
                    case MHA_F32:
                    case MHA_F16:
                    case MHA_BF16: break; /* refused by validation */
                    }
                }
            }
}

/* The checks both entry points share: src an fp32 view, dst (named name)
 * a quantised view with its scales (scales_out's when computed; their
 * values checked when scale_values), whose rows do not share memory;
 * src, dst and dst's scales pairwise disjoint. Fills *d (dst with
 * scales_out in place), *qmax and *range (dst's bytes). */
static mha_status check_pair(const mha_tensor *src, const mha_tensor *dst,
                             const char *name, int paged, float *scales_out,
                             int scale_values, mha_tensor *d, float *qmax,
                             mha_span *range)
{
    if (!src)
        return mha_fail(MHA_ERR_NULL_POINTER, "src is NULL");
    if (!dst)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s is NULL", name);
    mha_span rs, rd;
    mha_status st;
    if ((st = mha_check_tensor(src, "src", 0, 0, &rs)) != MHA_OK)
        return st;
    if (src->dtype != MHA_F32) /* a compute dtype, but rows are read as fp32 */
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "src.dtype (%s): quantising takes fp32 rows",
                        mha_dtype_name(src->dtype));
    const mha_dtype_traits *tr = mha_dtype_traits_of(dst->dtype);
    if (tr && !tr->needs_scale)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "%s.dtype (%s) is not a quantised dtype", name,
                        tr->name);
    if (scales_out && dst->scales.data && dst->scales.data != scales_out)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "%s.scales.data is neither NULL nor scales_out",
                        name);
    *d = *dst;
    if (scales_out)
        d->scales.data = scales_out;
    if ((st = mha_check_tensor(d, name, 1, scale_values, &rd)) != MHA_OK)
        return st;
    /* The shapes before any overlap: a dst shaped unlike src describes
     * memory the caller never meant, which may well reach a neighbour. A
     * pool's slots stand for src's tokens: only heads and dim must agree. */
#define SAME(f)                                                            \
    if (d->f != src->f)                                                    \
        return mha_fail(MHA_ERR_BAD_SHAPE,                                 \
                        "%s." #f " (%lld) differs from src." #f " (%lld)", \
                        name, (long long)d->f, (long long)src->f);
    if (!paged) {
        SAME(batch)
        SAME(seq)
    }
    SAME(heads)
    SAME(dim)
#undef SAME
    if (!mha_non_self_overlapping(d))
        return mha_fail(MHA_ERR_BAD_STRIDE,
                        "%s strides (%lld, %lld, %lld) make distinct "
                        "elements share memory",
                        name, (long long)d->stride_batch,
                        (long long)d->stride_seq, (long long)d->stride_head);
    mha_span rsc = mha_scales_span(d);
    if (mha_spans_overlap(rd, rs))
        return mha_fail(MHA_ERR_BAD_STRIDE, "%s overlaps src", name);
    if (mha_spans_overlap(rd, rsc))
        return mha_fail(MHA_ERR_BAD_STRIDE, "%s overlaps %s.scales", name,
                        name);
    if (scales_out && mha_spans_overlap(rsc, rs))
        return mha_fail(MHA_ERR_BAD_STRIDE, "scales_out overlaps src");
    *qmax = tr->qmax;
    *range = rd;
    return MHA_OK;
}

mha_status mha_quantize(const mha_tensor *src, const mha_tensor *dst,
                        float *scales_out)
{
    MHA_FPENV_SCOPE(0);
    mha_tensor d;
    float qmax = 0.0f;
    mha_span rd;
    mha_status st = check_pair(src, dst, "dst", 0, scales_out, !scales_out,
                               &d, &qmax, &rd);
    if (st != MHA_OK)
        return st;
    if (scales_out)
        compute_scales(src, &d, qmax, scales_out);
    quantize_rows(src, &d, d.scales.data);
    return MHA_OK;
}

/* Token t of src and slot of the pool as [1, 1, heads, dim] views (the
 * pool's with its scales at the slot). */
static void token_views(const mha_tensor *src, const mha_tensor *pool,
                        int64_t t, int64_t slot, mha_tensor *x,
                        mha_tensor *y)
{
    int64_t b = t / src->seq, s = t % src->seq;
    int64_t blk = slot / pool->seq, off = slot % pool->seq;
    *x = *src;
    x->data = (float *)src->data + b * src->stride_batch + s * src->stride_seq;
    *y = *pool;
    y->data = (uint8_t *)pool->data + blk * pool->stride_batch +
              off * pool->stride_seq;
    y->scales.data = pool->scales.data + blk * pool->scales.stride_batch +
                     off * pool->scales.stride_seq;
    x->batch = x->seq = y->batch = y->seq = 1;
}

mha_status mha_quantize_paged(const mha_tensor *src, const mha_tensor *pool,
                              const int64_t *slots, float *scales_out)
{
    MHA_FPENV_SCOPE(0);
    mha_tensor d;
    float qmax = 0.0f;
    mha_span rp = {0, 0};
    /* Scale values are checked below, for the written slots only. */
    mha_status st =
        check_pair(src, pool, "pool", 1, scales_out, 0, &d, &qmax, &rp);
    if (st != MHA_OK)
        return st;
    if (!slots)
        return mha_fail(MHA_ERR_NULL_POINTER, "slots is NULL");
    int64_t n = src->batch * src->seq, nslots; /* n: src's extent fits */
    if (!mha_mul_ok(d.batch, d.seq, &nslots))
        return mha_fail(MHA_ERR_OVERFLOW, "pool.batch * pool.seq overflows");
    /* Computed scales are per slot: distinct slots (and heads, unless
     * stride_head is 0) must reach distinct scales. */
    if (scales_out) {
        const mha_scales *sc = &d.scales;
        mha_tensor lay = {scales_out, d.batch, d.seq,
                          sc->stride_head ? d.heads : 1, 1,
                          sc->stride_batch, sc->stride_seq, sc->stride_head,
                          MHA_F32, {0}};
        if (!mha_non_self_overlapping(&lay))
            return mha_fail(MHA_ERR_BAD_STRIDE,
                            "pool.scales strides (%lld, %lld, %lld) make "
                            "slots share a scale: computed scales need one "
                            "per slot",
                            (long long)sc->stride_batch,
                            (long long)sc->stride_seq,
                            (long long)sc->stride_head);
    }
    mha_span rslots = {(uintptr_t)slots, (uintptr_t)(slots + n)};
    mha_span rsc = mha_scales_span(&d);
    if (mha_spans_overlap(rslots, rp))
        return mha_fail(MHA_ERR_BAD_STRIDE, "slots overlaps pool");
    if (mha_spans_overlap(rslots, rsc))
        return mha_fail(MHA_ERR_BAD_STRIDE, "slots overlaps pool.scales");
    for (int64_t t = 0; t < n; t++) {
        if (slots[t] < 0)
            continue;
        if (slots[t] >= nslots)
            return mha_fail(MHA_ERR_BAD_ARGUMENT,
                            "slots[%lld] (%lld) is past the pool's %lld "
                            "slots (pool.batch * pool.seq)",
                            (long long)t, (long long)slots[t],
                            (long long)nslots);
        if (scales_out)
            continue;
        mha_tensor x, y;
        token_views(src, &d, t, slots[t], &x, &y);
        const mha_scales *sc = &y.scales;
        for (int64_t h = 0; h < y.heads; h++) {
            float v = sc->data[h * sc->stride_head];
            if (!isfinite(v) || v == 0.0f)
                return mha_fail(MHA_ERR_BAD_ARGUMENT,
                                "pool.scales[b=%lld, s=%lld, h=%lld] (%g) "
                                "of slots[%lld] is not a finite nonzero "
                                "number",
                                (long long)(slots[t] / d.seq),
                                (long long)(slots[t] % d.seq), (long long)h,
                                (double)v, (long long)t);
        }
    }
    for (int64_t t = 0; t < n; t++) {
        if (slots[t] < 0)
            continue;
        mha_tensor x, y;
        token_views(src, &d, t, slots[t], &x, &y);
        if (scales_out)
            compute_scales(&x, &y, qmax, (float *)y.scales.data);
        quantize_rows(&x, &y, y.scales.data);
    }
    return MHA_OK;
}
