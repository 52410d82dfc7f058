/* The quantize case: mha_quantize, or mha_quantize_paged (QF_PAGED), on
 * fuzzed shapes, dst dtypes, src and dst strides (padded, broadcast,
 * arbitrary, negative, overlapping), scale layouts (per row, head, token,
 * block, tensor, rows sharing a scale, padded, negative), given or
 * computed scales, slot mappings (skips, duplicates, past the pool),
 * NULL pointers, wrong dtypes and shapes, and buffers aliased into one
 * another.
 *
 * Checks, against mha.h's text (nothing here calls library code but the
 * two functions under test):
 *   - the status against the model below (the common status of its
 *     faults; any failure when they disagree);
 *   - a failure leaves every buffer (src, dst or pool, scales, slots)
 *     byte-identical and a message;
 *   - a success leaves src, given scales and slots as they were; every
 *     element written holds the code a reference encoder gives (x / scale
 *     in double, nearest code, ties to even, saturation, NaN and infinity
 *     rules; codes compared as values, so +-0 agree and a NaN matches any
 *     NaN of the same sign); computed scales are bitwise the reference's
 *     (absmax of the finite elements of the rows sharing a scale / 127,
 *     448 or 57344, raised to FLT_MIN; 1 for rows with no nonzero finite
 *     element); every other byte of dst, the pool and scales_out is as it
 *     was (paged: only the written slots change, the later of two tokens
 *     with one slot stays).
 *
 * Bytes (encoding.h, QF_* on): flags, dst dtype, B, S, H, D, src layout
 * (4, layout_strides), pool blocks, block size, dst layout (4), scale
 * layout (KS_*), scale values (QV_*), bad index, source values (QM_*,
 * QR_*), seed (4), specials (count, 4 x (index, class)), alias (QA_*),
 * two faults (Q_*), then (paged) a slot code per token (QS_*). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

enum { QB_SRC, QB_DST, QB_SCALES, QB_OTHER, QB_SLOTS, NQB };

typedef struct {
    unsigned flags, kscode, vclass, bad_at, vmode, nspec, alias;
    unsigned spec[4][2], fault[2];
    int paged, computed;
    mha_dtype dt;         /* dst's dtype as drawn */
    int64_t B, S, H, D;   /* src's shape */
    int64_t nslots, n;    /* pool slots, tokens (paged) */
    int64_t n_described;  /* tokens src describes after the faults */
    mha_tensor src, dst;  /* the call's views (dst: the pool) */
    int64_t sst[3];       /* scale strides as given (maybe negative) */
    int64_t pst[3];       /* their non-negative twin */
    int64_t ssize[3];     /* the scale array's [batch, seq, heads] */
    int has_scales;       /* a layout other than KS_NONE */
    int null_src, null_dst, null_slots;
    float *scales_out;    /* computed scales: the scales buffer */
    int64_t *slots;       /* the call's slots pointer */
    int64_t slot_vals[24];
    uint32_t seed;
    buffer buf[NQB];
    size_t scale_floats; /* floats of the scale layout */
} qcase;

/* ---- The reference encoder ------------------------------------------ */

/* The non-negative finite values of an fp8 format by code (the codes
 * ascend with the value): E4M3 0x00..0x7E, E5M2 0x00..0x7B. */
static int fp8_table(mha_dtype t, const double **vals)
{
    static double e4[127], e5[124];
    static int ready;
    if (!ready) {
        for (int c = 0; c < 127; c++)
            e4[c] = ref_fp8_e4m3_to_double((uint8_t)c);
        for (int c = 0; c < 124; c++)
            e5[c] = ref_fp8_e5m2_to_double((uint8_t)c);
        ready = 1;
    }
    *vals = t == MHA_FP8_E4M3 ? e4 : e5;
    return t == MHA_FP8_E4M3 ? 127 : 124;
}

/* The code of y = x / scale (nan_sign: x's sign, kept by a NaN). */
static uint8_t ref_encode(mha_dtype t, double y, int nan_sign)
{
    if (t == MHA_I8) {
        if (isnan(y))
            return 0;
        double r = y >= 127.0 ? 127.0 : y <= -127.0 ? -127.0 : rint(y);
        return (uint8_t)(int8_t)r;
    }
    const double *v;
    int n = fp8_table(t, &v);
    if (isnan(y))
        return (uint8_t)((nan_sign ? 0x80 : 0) | 0x7F);
    uint8_t sign = signbit(y) ? 0x80 : 0;
    double a = fabs(y);
    if (isinf(a) && t == MHA_FP8_E5M2)
        return sign | 0x7C;
    if (a >= v[n - 1])
        return sign | (uint8_t)(n - 1);
    int lo = 0, hi = n - 1; /* v[lo] <= a < v[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (v[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    double twice = 2.0 * a, sum = v[lo] + v[hi]; /* both exact */
    int c = twice < sum ? lo : twice > sum ? hi : (lo % 2 == 0 ? lo : hi);
    return sign | (uint8_t)c;
}

/* One row of D elements of x into want at scale (reference codes), each
 * element marked written. */
static void encode_row(mha_dtype t, const float *x, int64_t D, double scale,
                       uint8_t *want, uint8_t *wrote)
{
    for (int64_t e = 0; e < D; e++) {
        want[e] = ref_encode(t, (double)x[e] / scale, signbit(x[e]) != 0);
        wrote[e] = 1;
    }
}

/* got holds want's value: the same byte for int8; for fp8 the same value
 * (+0 and -0 agree) or, for a NaN, a NaN of the same sign. */
static int code_matches(mha_dtype t, uint8_t got, uint8_t want)
{
    if (t == MHA_I8)
        return got == want;
    double g = ref_code_to_double(t, &got), w = ref_code_to_double(t, &want);
    if (isnan(w))
        return isnan(g) && (got & 0x80) == (want & 0x80);
    return !isnan(g) && g == w;
}

/* A computed scale from the absmax of the finite elements of its rows. */
static float ref_scale(float absmax, mha_dtype t)
{
    if (absmax == 0.0f)
        return 1.0f;
    float s = (float)((double)absmax / q8_max(t));
    return s < FLT_MIN ? FLT_MIN : s;
}

/* ---- Views ---------------------------------------------------------- */

static const float *src_row(const qcase *c, int64_t b, int64_t s, int64_t h)
{
    const mha_tensor *t = &c->src;
    return (const float *)c->buf[QB_SRC].data + b * t->stride_batch +
           s * t->stride_seq + h * t->stride_head;
}

static int64_t dst_at(const mha_tensor *t, int64_t b, int64_t s, int64_t h)
{
    return b * t->stride_batch + s * t->stride_seq + h * t->stride_head;
}

static int64_t scale_addr(const qcase *c, int64_t b, int64_t s, int64_t h)
{
    return b * c->pst[0] + s * c->pst[1] + h * c->pst[2];
}

/* The scales the call reads or writes: scales_out when computed, else
 * dst's (NULL when absent). */
static float *scale_ptr(const qcase *c)
{
    return c->computed ? c->scales_out : (float *)c->dst.scales.data;
}

static float absmax_row(const float *x, int64_t n, float m)
{
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (isfinite(a) && a > m)
            m = a;
    }
    return m;
}

/* ---- Decoding and buffers ------------------------------------------- */

static void parse(byte_reader *in, qcase *c)
{
    static const mha_dtype dts[3] = {MHA_I8, MHA_FP8_E4M3, MHA_FP8_E5M2};
    static const int64_t dims[12] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 33, 64};
    memset(c, 0, sizeof *c);
    c->flags = take8(in);
    c->paged = c->flags & QF_PAGED;
    c->computed = (c->flags & QF_COMPUTED) != 0;
    c->dt = dts[take8(in) % 3];
    c->B = 1 + take8(in) % 3;
    c->S = 1 + take8(in) % 6;
    c->H = 1 + take8(in) % 3;
    c->D = dims[take8(in) % 12];
    mha_tensor *s = &c->src;
    s->batch = c->B, s->seq = c->S, s->heads = c->H, s->dim = c->D;
    s->dtype = MHA_F32;
    layout_strides(in, s);
    int64_t blocks = 1 + take8(in) % 4, bs = 1 + take8(in) % 6;
    mha_tensor *d = &c->dst;
    d->batch = c->paged ? blocks : c->B;
    d->seq = c->paged ? bs : c->S;
    d->heads = c->H, d->dim = c->D, d->dtype = c->dt;
    layout_strides(in, d);
    c->nslots = blocks * bs;
    c->n = c->B * c->S;
    c->kscode = take8(in);
    c->vclass = take8(in);
    c->bad_at = take8(in);
    c->vmode = take8(in);
    c->seed = take32(in);
    c->nspec = take8(in) % 5;
    for (int i = 0; i < 4; i++)
        c->spec[i][0] = take8(in), c->spec[i][1] = take8(in);
    c->alias = take8(in) % QA_ALIASES;
    c->fault[0] = take8(in) % (2 * Q_FAULTS);
    c->fault[1] = take8(in) % (2 * Q_FAULTS);
    for (int64_t t = 0; c->paged && t < c->n; t++) {
        unsigned code = take8(in);
        int64_t v;
        switch (code) {
        case QS_MINUS1: v = -1; break;
        case QS_INT64_MIN: v = INT64_MIN; break;
        case QS_PAST: v = c->nslots; break;
        case QS_INT64_MAX: v = INT64_MAX; break;
        case QS_LAST: v = c->nslots - 1; break;
        case QS_MINUS2: v = -2; break;
        default:
            v = code < QS_MINUS1 ? (int64_t)code % c->nslots
                                 : (t + code) % c->nslots;
        }
        c->slot_vals[t] = v;
    }
    c->has_scales = kv_scale_strides(c->kscode, d->seq, d->heads, c->sst);
    for (int a = 0; a < 3; a++)
        c->pst[a] = c->sst[a] < 0 ? -c->sst[a] : c->sst[a];
    c->ssize[0] = d->batch, c->ssize[1] = d->seq, c->ssize[2] = d->heads;
}

static size_t view_bytes(const mha_tensor *t, size_t elem)
{
    wide span = tensor_span(t); /* -1 for a negative stride */
    return span > 0 ? (size_t)span * elem : elem;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

/* Buffers sized for the views as drawn (and what an alias puts inside
 * them); faults come later, but the scales cover dst's shape after them
 * (the library may read every scale of the dst it is given before it
 * compares shapes). */
static void alloc_buffers(qcase *c)
{
    int64_t described[3] = {c->ssize[0], c->ssize[1], c->ssize[2]};
    for (int i = 0; i < 2; i++) {
        described[1] += c->fault[i] == Q_SEQ && !c->paged;
        described[2] += c->fault[i] == Q_HEADS;
    }
    c->scale_floats = (size_t)span_elems(described, c->pst, 3);
    /* Q_OVERFLOW gives a src of seq 1 a second token. */
    c->n_described = c->n;
    for (int i = 0; i < 2; i++)
        if (c->fault[i] == Q_OVERFLOW && c->S == 1)
            c->n_described = 2 * c->n;
    size_t scale_bytes = c->scale_floats * 4;
    size_t slot_bytes = (size_t)c->n_described * 8;
    size_t src = view_bytes(&c->src, 4), dst = view_bytes(&c->dst, 1);
    if (c->alias == QA_DST_IN_SRC)
        src = max_size(src, dst);
    if (c->alias == QA_SCALES_IN_SRC)
        src = max_size(src, scale_bytes);
    if (c->alias == QA_SCALES_IN_DST)
        dst = max_size(dst, scale_bytes);
    if (c->alias == QA_SLOTS_IN_POOL)
        dst = max_size(dst, slot_bytes);
    if (c->alias == QA_SLOTS_IN_SCALES)
        scale_bytes = max_size(scale_bytes, slot_bytes);
    buffer_alloc(&c->buf[QB_SRC], src, 0);
    buffer_alloc(&c->buf[QB_DST], dst, 0);
    buffer_alloc(&c->buf[QB_SCALES], scale_bytes, 0);
    buffer_alloc(&c->buf[QB_OTHER], c->scale_floats * 4, 0);
    buffer_alloc(&c->buf[QB_SLOTS], slot_bytes ? slot_bytes : 8, 0);
}

static void put_f(buffer *b, size_t at, float x)
{
    if ((at + 1) * 4 <= b->bytes)
        memcpy(b->data + at * 4, &x, 4);
}

/* A value x / scale lands on (or midway between) codes of the dtype:
 * ties the encoder must break to even. */
static float tie_value(mha_dtype t, test_rng *r)
{
    uint64_t x = rng_next(r);
    double sign = x & 1 ? -1.0 : 1.0, v;
    if (t == MHA_I8) {
        v = (double)((int64_t)((x >> 8) % 280) - 140) + 0.5;
    } else {
        const double *vals;
        int n = fp8_table(t, &vals);
        int code = (int)((x >> 8) % (uint64_t)(n - 1));
        v = (x >> 20) & 3 ? (vals[code] + vals[code + 1]) / 2 : vals[code];
        if (((x >> 24) & 15) == 0)
            v = vals[n - 1] * 1.0625; /* past the largest: saturates */
    }
    return (float)(sign * v);
}

/* src: values by magnitude class, a special row, specials; with QM_TIES
 * and given power-of-two scales, codes and midpoints times the scale. */
static void fill_src(qcase *c, test_rng *r, const float *row_scale)
{
    buffer *b = &c->buf[QB_SRC];
    size_t n = b->bytes / 4;
    unsigned mag = c->vmode & 7;
    for (size_t i = 0; i < n; i++) {
        float u = rng_uniform(r), x;
        switch (mag) {
        case QM_SMALL: x = u * 1e-3f; break;
        case QM_LARGE: x = u * 1e3f; break;
        case QM_SUBNORMAL: x = u * 1e-39f; break;
        case QM_HUGE: x = u * 3e38f; break;
        case QM_WIDE:
            x = ldexpf(u, (int)(rng_next(r) % 277) - 149);
            break;
        case QM_INTEGER: x = rintf(u * 300.0f); break;
        default: x = u; break;
        }
        put_f(b, i, x);
    }
    const mha_tensor *t = &c->src;
    if (tensor_span(t) <= 0)
        return; /* a negative stride: refused, values do not matter */
    for (int64_t bb = 0; bb < c->B; bb++)
        for (int64_t s = 0; s < c->S; s++)
            for (int64_t h = 0; h < c->H; h++) {
                int64_t row = (bb * c->S + s) * c->H + h;
                float *x = (float *)src_row(c, bb, s, h);
                if ((c->vmode & QM_TIES) && row_scale)
                    for (int64_t e = 0; e < c->D; e++)
                        x[e] = tie_value(c->dt, r) * row_scale[row];
                if ((uint64_t)row != c->seed % (uint64_t)(c->B * c->S * c->H))
                    continue;
                switch ((c->vmode >> 3) & 3) {
                case QR_ZERO:
                    for (int64_t e = 0; e < c->D; e++)
                        x[e] = e & 1 ? -0.0f : 0.0f;
                    break;
                case QR_NONFINITE: {
                    static const float nf[3] = {NAN, INFINITY, -INFINITY};
                    for (int64_t e = 0; e < c->D; e++)
                        x[e] = nf[(e + c->seed) % 3];
                    break;
                }
                case QR_ONE_HUGE: x[c->seed % (uint64_t)c->D] = FLT_MAX; break;
                default: break;
                }
            }
    for (unsigned i = 0; i < c->nspec; i++)
        put_f(b, c->spec[i][0] % n, special_values[c->spec[i][1] % 12]);
}

/* Which scales the call reads: every row (mha_quantize), the rows of the
 * written slots (paged), over dst's [batch, seq, heads] n (as drawn, or
 * as described after the faults: the scales cover both). */
static uint8_t *scales_read(const qcase *c, const int64_t n[3])
{
    uint8_t *read = calloc(c->scale_floats, 1);
    if (!read)
        abort();
    for (int64_t t = 0; c->paged && t < c->n; t++) {
        int64_t slot = c->slot_vals[t];
        if (slot < 0 || slot >= c->nslots)
            continue;
        for (int64_t h = 0; h < n[2]; h++)
            read[scale_addr(c, slot / n[1], slot % n[1], h)] = 1;
    }
    for (int64_t b = 0; !c->paged && b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t h = 0; h < n[2]; h++)
                read[scale_addr(c, b, s, h)] = 1;
    return read;
}

/* Given scales: values by class (unit-scale near 1 / the largest code, a
 * few saturating; extreme; or powers of two for ties), junk where nothing
 * reads them (QF_JUNK), and one bad value (QV_ZERO..QV_INF) at a read
 * scale, or with QV_UNREAD at an unread one when there is one. Fills
 * row_scale (by src row) for the ties. */
static void fill_scales(qcase *c, test_rng *r, float *row_scale)
{
    buffer *b = &c->buf[QB_SCALES];
    float *x = (float *)b->data;
    uint8_t *read = scales_read(c, c->ssize);
    unsigned cls = c->vclass & 7;
    static const float extreme[6] = {1e-30f, 1e30f, FLT_MIN, 1e-40f,
                                     FLT_MAX, -1e-38f};
    static const float junk[4] = {NAN, 0.0f, INFINITY, -INFINITY};
    double top = q8_max(c->dt);
    for (size_t i = 0; i < c->scale_floats; i++) {
        uint64_t k = rng_next(r);
        float u = fabsf(rng_uniform(r));
        float v = (float)((k & 7) == 0 ? -1.0 : 1.0) *
                  (float)((0.6 + 0.8 * u) / top);
        if (cls == QV_EXTREME)
            v = extreme[(i + c->bad_at) % 6];
        if (c->vmode & QM_TIES)
            v = ldexpf(1.0f, (int)(k >> 40) % 9 - 4);
        if (!read[i] && (c->flags & QF_JUNK))
            v = junk[i % 4];
        x[i] = v;
    }
    if (cls >= QV_ZERO) {
        int unread = (c->vclass & QV_UNREAD) != 0;
        size_t count = 0;
        for (size_t i = 0; i < c->scale_floats; i++)
            count += read[i] != unread;
        if (count == 0) /* none of that kind: the other kind */
            unread = !unread, count = c->scale_floats;
        size_t at = c->bad_at % count;
        for (size_t i = 0, k = 0; i < c->scale_floats; i++)
            if (read[i] != unread && k++ == at)
                x[i] = cls == QV_ZERO ? 0.0f
                       : cls == QV_NAN ? NAN
                       : (c->bad_at & 1) ? -INFINITY
                                         : INFINITY;
    }
    for (int64_t bb = 0; row_scale && bb < c->B; bb++)
        for (int64_t s = 0; s < c->S; s++)
            for (int64_t h = 0; h < c->H; h++)
                row_scale[(bb * c->S + s) * c->H + h] =
                    c->paged ? 1.0f : x[scale_addr(c, bb, s, h)];
    free(read);
}

/* Points the views at the buffers, then the aliases and the faults. */
static void link_and_corrupt(qcase *c)
{
    mha_tensor *s = &c->src, *d = &c->dst;
    s->data = c->buf[QB_SRC].data;
    d->data = c->buf[QB_DST].data;
    float *sc = (float *)c->buf[QB_SCALES].data;
    d->scales = (mha_scales){NULL, c->sst[0], c->sst[1], c->sst[2]};
    if (c->computed) {
        c->scales_out = sc;
        if (c->flags & QF_SCALES_IS_OUT)
            d->scales.data = sc;
    } else if (c->has_scales) {
        d->scales.data = sc;
    }
    c->slots = c->paged ? (int64_t *)c->buf[QB_SLOTS].data : NULL;
    switch (c->alias) {
    case QA_DST_IN_SRC: d->data = s->data; break;
    case QA_SCALES_IN_SRC:
    case QA_SCALES_IN_DST: {
        float *to = (float *)(c->alias == QA_SCALES_IN_SRC ? s->data
                                                           : d->data);
        if (c->computed) {
            if (d->scales.data == c->scales_out)
                d->scales.data = to;
            c->scales_out = to;
        } else if (d->scales.data) {
            d->scales.data = to;
        }
        break;
    }
    case QA_SLOTS_IN_POOL:
        if (c->paged)
            c->slots = (int64_t *)d->data;
        break;
    case QA_SLOTS_IN_SCALES:
        if (c->paged && scale_ptr(c))
            c->slots = (int64_t *)scale_ptr(c);
        break;
    default: break;
    }
    if (c->slots) {
        memcpy(c->slots, c->slot_vals, (size_t)c->n * 8);
        for (int64_t t = c->n; t < c->n_described; t++)
            c->slots[t] = -1;
    }
    for (int i = 0; i < 2; i++)
        switch (c->fault[i]) {
        case Q_NULL_SRC: c->null_src = 1; break;
        case Q_NULL_DST: c->null_dst = 1; break;
        case Q_NULL_SRC_DATA: s->data = NULL; break;
        case Q_NULL_DST_DATA: d->data = NULL; break;
        case Q_NULL_SLOTS: c->null_slots = c->paged; break;
        case Q_NULL_SCALES:
            if (!c->computed)
                d->scales.data = NULL;
            break;
        case Q_OTHER_SCALES:
            if (c->computed)
                d->scales.data = (const float *)c->buf[QB_OTHER].data;
            break;
        case Q_SRC_F16: s->dtype = MHA_F16; break;
        case Q_SRC_DTYPE_BAD: s->dtype = (mha_dtype)99; break;
        case Q_DST_F32: d->dtype = MHA_F32; break;
        case Q_DST_DTYPE_BAD: d->dtype = (mha_dtype)-1; break;
        case Q_DIM: d->dim += 1; break;
        case Q_HEADS: d->heads += 1; break;
        case Q_SEQ:
            if (!c->paged)
                d->seq += 1;
            break;
        case Q_ZERO: s->batch = 0; break;
        case Q_NEG_DIM: d->dim = -1; break;
        case Q_NEG_STRIDE: d->stride_seq = -1; break;
        case Q_NEG_SRC_STRIDE: s->stride_head = -2; break;
        case Q_OVERFLOW:
            s->stride_seq = INT64_MAX;
            if (s->seq == 1)
                s->seq = 2;
            break;
        case Q_SLOT_PAST:
            if (c->paged && c->slots && c->n > 0)
                c->slots[c->n - 1] = c->nslots;
            break;
        default: break;
        }
    if (c->slots) /* as the call sees them */
        memcpy(c->slot_vals, c->slots, (size_t)c->n * 8);
}

/* ---- The model ------------------------------------------------------ */

static int sizes_ok(const mha_tensor *t)
{
    return t->batch > 0 && t->seq > 0 && t->heads > 0 && t->dim > 0;
}

static int strides_ok(const mha_tensor *t)
{
    return t->stride_batch >= 0 && t->stride_seq >= 0 && t->stride_head >= 0;
}

/* The faults of the call as linked; the scale values (given scales) from
 * memory over the geometry as drawn. */
static void model(qcase *c, fault_list *f)
{
    const mha_tensor *s = &c->src, *d = &c->dst;
    if (c->null_src)
        add_fault(f, MHA_ERR_NULL_POINTER, "src is NULL");
    if (c->null_dst)
        add_fault(f, MHA_ERR_NULL_POINTER, "dst is NULL");
    if (!s->data)
        add_fault(f, MHA_ERR_NULL_POINTER, "src.data is NULL");
    if (!d->data)
        add_fault(f, MHA_ERR_NULL_POINTER, "dst.data is NULL");
    if (s->dtype != MHA_F32)
        add_fault(f, MHA_ERR_UNSUPPORTED, "src is not MHA_F32");
    if (!is_q8_dtype(d->dtype))
        add_fault(f, MHA_ERR_UNSUPPORTED, "dst is not an 8-bit dtype");
    if (!is_q8_dtype(d->dtype) && d->scales.data)
        add_fault(f, MHA_ERR_UNSUPPORTED, "a float dst with scales");
    if (is_q8_dtype(d->dtype) && !c->computed && !d->scales.data)
        add_fault(f, MHA_ERR_NULL_POINTER, "given scales are NULL");
    if (c->computed && d->scales.data && d->scales.data != c->scales_out)
        add_fault(f, MHA_ERR_BAD_ARGUMENT,
                  "dst.scales.data is neither NULL nor scales_out");
    const mha_tensor *t[2] = {s, d};
    for (int i = 0; i < 2; i++) {
        if (!sizes_ok(t[i]))
            add_fault(f, MHA_ERR_BAD_SHAPE, "a size is not positive");
        else if (!strides_ok(t[i]))
            add_fault(f, MHA_ERR_BAD_STRIDE, "a stride is negative");
        else if (tensor_span(t[i]) * (wide)elem_size(t[i]->dtype) > INT64_MAX)
            add_fault(f, MHA_ERR_OVERFLOW, "a view spans > 2^63 bytes");
    }
    int neg_scale = d->scales.stride_batch < 0 ||
                    d->scales.stride_seq < 0 || d->scales.stride_head < 0;
    if (is_q8_dtype(d->dtype) && scale_ptr(c) && neg_scale)
        add_fault(f, MHA_ERR_BAD_STRIDE, "a scale stride is negative");
    if (c->paged ? d->heads != s->heads || d->dim != s->dim
                 : d->batch != s->batch || d->seq != s->seq ||
                       d->heads != s->heads || d->dim != s->dim)
        add_fault(f, MHA_ERR_BAD_SHAPE, "dst's shape is not src's");
    if (sizes_ok(d) && strides_ok(d)) {
        int over = self_overlapping(d);
        if (over == 1)
            add_fault(f, MHA_ERR_BAD_STRIDE, "dst addresses an element twice");
        else if (over == 0 && !nested(d))
            f->may_refuse = MHA_ERR_BAD_STRIDE;
    }
    /* Overlaps, by construction (each alias points into a whole view). */
    const char *src_buf = c->buf[QB_SRC].data, *dst_buf = c->buf[QB_DST].data;
    float *sp = scale_ptr(c);
    if (d->data && (const char *)d->data == src_buf)
        add_fault(f, MHA_ERR_BAD_STRIDE, "dst overlaps src");
    if (c->computed && sp && (const char *)sp == src_buf)
        add_fault(f, MHA_ERR_BAD_STRIDE, "scales_out overlaps src");
    if (d->data && sp && (const char *)sp == dst_buf)
        add_fault(f, MHA_ERR_BAD_STRIDE, "dst overlaps its scales");
    if (c->paged && !c->null_slots) {
        if (d->data && (const char *)c->slots == dst_buf)
            add_fault(f, MHA_ERR_BAD_STRIDE, "slots overlap the pool");
        if (sp && c->slots == (const int64_t *)sp)
            add_fault(f, MHA_ERR_BAD_STRIDE, "slots overlap the scales");
    }
    if (c->paged && c->null_slots)
        add_fault(f, MHA_ERR_NULL_POINTER, "slots is NULL");
    if (c->paged && !c->null_slots)
        for (int64_t i = 0; i < c->n; i++)
            if (c->slots[i] >= c->nslots) {
                add_fault(f, MHA_ERR_BAD_ARGUMENT, "a slot is past the pool");
                break;
            }
    /* Computed pool scales: one per slot (and head unless stride_head is
     * 0), checked over the whole pool. */
    if (c->paged && c->computed && !neg_scale && sizes_ok(d)) {
        mha_tensor lay = {c->scales_out, d->batch, d->seq,
                          d->scales.stride_head ? d->heads : 1, 1,
                          d->scales.stride_batch, d->scales.stride_seq,
                          d->scales.stride_head, MHA_F32, {0}};
        int over = self_overlapping(&lay);
        if (over == 1)
            add_fault(f, MHA_ERR_BAD_STRIDE, "slots share a computed scale");
        else if (over == 0 && !nested(&lay))
            f->may_refuse = MHA_ERR_BAD_STRIDE;
    }
    /* Given scales: every one the call reads finite and nonzero. */
    if (!c->computed && d->scales.data && !neg_scale) {
        const int64_t n[3] = {d->batch, d->seq, d->heads};
        uint8_t *read = scales_read(c, n);
        const float *x = d->scales.data;
        for (size_t i = 0; i < c->scale_floats; i++)
            if (read[i] && (!isfinite(x[i]) || x[i] == 0.0f)) {
                add_fault(f, MHA_ERR_BAD_ARGUMENT,
                          "a scale the call reads is 0 or not finite");
                break;
            }
        free(read);
    }
}

/* ---- Checks after a success ----------------------------------------- */

/* dst (or the pool) as it must be: the snapshot with the written
 * elements replaced, and which bytes were written; expected scales
 * likewise (computed). */
static void check_success(const qcase *c)
{
    const mha_tensor *d = &c->dst;
    const buffer *db = &c->buf[QB_DST], *sb = &c->buf[QB_SCALES];
    uint8_t *want = malloc(db->bytes), *wrote = calloc(db->bytes, 1);
    float *wscale = malloc(sb->bytes + 4);
    if (!want || !wrote || !wscale)
        abort();
    memcpy(want, db->copy, db->bytes);
    memcpy(wscale, sb->copy, sb->bytes);
    /* The given scales as they were (the call must not change them). */
    const float *given = NULL;
    if (!c->computed) {
        const float *p = d->scales.data;
        given = (const char *)p == c->buf[QB_SRC].data
                    ? (const float *)c->buf[QB_SRC].copy
                    : (const float *)sb->copy;
    }
    const int64_t H = d->heads, D = d->dim;
    float *absmax = calloc(c->scale_floats, sizeof *absmax);
    uint8_t *grouped = calloc(c->scale_floats, 1);
    if (!absmax || !grouped)
        abort();
    /* Rows to write: (src row, dst row, scale address). */
    int64_t nrows = c->paged ? c->n : c->B * c->S;
    for (int64_t r = 0; r < nrows; r++) {
        int64_t b = r / c->S, s = r % c->S, db_ = b, ds = s;
        if (c->paged) {
            int64_t slot = c->slot_vals[r];
            if (slot < 0)
                continue;
            db_ = slot / d->seq, ds = slot % d->seq;
        }
        if (c->computed) { /* the token's (or the tensor's) groups */
            if (c->paged)
                for (int64_t h = 0; h < H; h++) {
                    absmax[scale_addr(c, db_, ds, h)] = 0.0f;
                    grouped[scale_addr(c, db_, ds, h)] = 1;
                }
            for (int64_t h = 0; h < H; h++) {
                int64_t a = scale_addr(c, db_, ds, h);
                absmax[a] = absmax_row(src_row(c, b, s, h), D, absmax[a]);
                grouped[a] = 1;
            }
            if (c->paged) /* this token's scales now */
                for (int64_t h = 0; h < H; h++) {
                    int64_t a = scale_addr(c, db_, ds, h);
                    wscale[a] = ref_scale(absmax[a], c->dt);
                }
            else
                continue; /* codes once every row is in its group */
        }
        for (int64_t h = 0; h < H; h++) {
            int64_t a = scale_addr(c, db_, ds, h);
            double scale = c->computed ? wscale[a] : given[a];
            encode_row(c->dt, src_row(c, b, s, h), D, scale,
                       want + dst_at(d, db_, ds, h),
                       wrote + dst_at(d, db_, ds, h));
        }
    }
    if (c->computed && !c->paged) {
        for (size_t a = 0; a < c->scale_floats; a++)
            if (grouped[a])
                wscale[a] = ref_scale(absmax[a], c->dt);
        for (int64_t r = 0; r < nrows; r++)
            for (int64_t h = 0; h < H; h++) {
                int64_t b = r / c->S, s = r % c->S;
                double scale = wscale[scale_addr(c, b, s, h)];
                encode_row(c->dt, src_row(c, b, s, h), D, scale,
                           want + dst_at(d, b, s, h),
                           wrote + dst_at(d, b, s, h));
            }
    }
    const uint8_t *got = (const uint8_t *)db->data;
    for (size_t i = 0; i < db->bytes; i++) {
        if (!wrote[i]) {
            REQUIRE_AT(got[i] == want[i], "dst byte %zu (not written by "
                       "the request) changed: 0x%02x, was 0x%02x", i, got[i],
                       want[i]);
            continue;
        }
        REQUIRE_AT(code_matches(c->dt, got[i], want[i]),
                   "dst byte %zu: code 0x%02x (%.9g), want 0x%02x (%.9g)", i,
                   got[i], ref_code_to_double(c->dt, &got[i]), want[i],
                   ref_code_to_double(c->dt, &want[i]));
    }
    if (c->computed)
        for (size_t i = 0; i * 4 < sb->bytes; i++) {
            float g;
            memcpy(&g, sb->data + i * 4, 4);
            REQUIRE_AT(memcmp(&g, &wscale[i], 4) == 0,
                       "scales_out[%zu] = %.9g, want %.9g", i, (double)g,
                       (double)wscale[i]);
        }
    free(want), free(wrote), free(wscale), free(absmax), free(grouped);
}

void fuzz_quantize(byte_reader *in, const char *engine_desc)
{
    qcase c;
    parse(in, &c);
    alloc_buffers(&c);
    test_rng r;
    rng_seed(&r, c.seed ^ 0x7175616e74ull);
    float row_scale[3 * 6 * 3];
    fill_scales(&c, &r, row_scale);
    fill_src(&c, &r, c.computed ? NULL : row_scale);
    if (c.computed) /* untouched where no scale is written */
        fill_sentinel((float *)c.buf[QB_SCALES].data,
                      c.buf[QB_SCALES].bytes / 4);
    for (size_t i = 0; i < c.buf[QB_DST].bytes; i++)
        c.buf[QB_DST].data[i] = (char)(0xA5 ^ (i * 7));
    for (size_t i = 0; i + 4 <= c.buf[QB_OTHER].bytes; i += 4)
        put_f(&c.buf[QB_OTHER], i / 4, 1.0f);
    link_and_corrupt(&c);
    fault_list f = {0};
    model(&c, &f);
    const mha_tensor *d = &c.dst, *s = &c.src;
    snprintf(context, sizeof context,
             "quantize%s%s %s src [%lld %lld %lld %lld] strides [%lld %lld "
             "%lld] %s dst [%lld %lld %lld %lld] strides [%lld %lld %lld] "
             "%s scales code %u [%lld %lld %lld]%s values %u/%u mode %u "
             "alias %u faults %u %u junk %d; %d faults%s%s%s; %s",
             c.paged ? "_paged" : "", c.computed ? " computed" : " given",
             mha_dtype_name(c.dt), (long long)s->batch, (long long)s->seq,
             (long long)s->heads, (long long)s->dim,
             (long long)s->stride_batch, (long long)s->stride_seq,
             (long long)s->stride_head, mha_dtype_name(s->dtype),
             (long long)d->batch, (long long)d->seq, (long long)d->heads,
             (long long)d->dim, (long long)d->stride_batch,
             (long long)d->stride_seq, (long long)d->stride_head,
             mha_dtype_name(d->dtype), c.kscode, (long long)c.sst[0],
             (long long)c.sst[1], (long long)c.sst[2],
             d->scales.data ? "" : " (NULL)", c.vclass, c.bad_at, c.vmode,
             c.alias, c.fault[0], c.fault[1], (c.flags & QF_JUNK) != 0, f.n,
             f.n ? " (" : "", f.n ? f.why[0] : "", f.n ? ")" : "",
             engine_desc);
    announce();
    if (verbose > 0 && c.paged) {
        fprintf(stderr, "slots:");
        for (int64_t t = 0; t < c.n; t++)
            fprintf(stderr, " %lld", (long long)c.slot_vals[t]);
        fprintf(stderr, " (of %lld)\n", (long long)c.nslots);
    }
    for (int i = 0; i < NQB; i++)
        buffer_snapshot(&c.buf[i]);
    mha_status st =
        c.paged ? mha_quantize_paged(c.null_src ? NULL : s,
                                     c.null_dst ? NULL : d,
                                     c.null_slots ? NULL : c.slots,
                                     c.computed ? c.scales_out : NULL)
                : mha_quantize(c.null_src ? NULL : s, c.null_dst ? NULL : d,
                               c.computed ? c.scales_out : NULL);
    check_status_known(st);
    if (f.n == 0 && f.may_refuse && st == f.may_refuse)
        add_fault(&f, st, "strides that do not nest (refusal allowed)");
    if (f.n > 0) {
        check_failure(st, &f, 0);
        for (int i = 0; i < NQB; i++)
            REQUIRE_AT(buffer_unchanged(&c.buf[i]), "buffer %d written "
                       "(src, dst, scales, other, slots) by a failed call",
                       i);
        stats[S_QUANT_FAULT]++;
    } else {
        REQUIRE_AT(st == MHA_OK, "valid call failed: %s (%s)",
                   mha_status_string(st), mha_last_error());
        REQUIRE_AT(buffer_unchanged(&c.buf[QB_SRC]), "src written");
        REQUIRE_AT(buffer_unchanged(&c.buf[QB_OTHER]), "other written");
        REQUIRE_AT(buffer_unchanged(&c.buf[QB_SLOTS]), "slots written");
        if (!c.computed)
            REQUIRE_AT(buffer_unchanged(&c.buf[QB_SCALES]),
                       "given scales written");
        check_success(&c);
        stats[S_QUANT_OK]++;
    }
    for (int i = 0; i < NQB; i++)
        buffer_free(&c.buf[i]);
}
