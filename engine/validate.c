/* Validation of every input before anything is written. Each failure
 * returns its status with a message naming the field and its value. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"

int mha_mul_ok(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}

int mha_add_ok(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}


/* 1 + sum (size_i - 1) * stride_i elements, as bytes from base; 0 on
 * overflow of int64 or of the address space. */
static int extent_span(const void *base, const int64_t *sizes,
                       const int64_t *strides, int n, size_t elem,
                       mha_span *out)
{
    int64_t last = 0, term;
    for (int i = 0; i < n; i++) {
        if (!mha_mul_ok(sizes[i] - 1, strides[i], &term) ||
            !mha_add_ok(last, term, &last))
            return 0;
    }
    int64_t count, bytes;
    if (!mha_add_ok(last, 1, &count) ||
        !mha_mul_ok(count, (int64_t)elem, &bytes))
        return 0;
    uintptr_t lo = (uintptr_t)base;
    if ((uint64_t)bytes > UINTPTR_MAX - lo)
        return 0;
    out->lo = lo;
    out->hi = lo + (uintptr_t)bytes;
    return 1;
}

/* The scales of a quantised tensor: strides, extent, then every scale
 * once (an axis of stride 0 is one scale) finite and nonzero. The values
 * are data, but a zero or non-finite scale makes every score of its row
 * NaN or meaningless, so it is refused before anything is written. */
/* Whether x[i * stride], i < n, are all finite and nonzero: on the
 * magnitude's bits, 1 <= b <= FLT_MAX's. A contiguous run is tested in
 * blocks without a branch per value, which the compiler vectorises: a
 * call checks every scale of a quantised cache (a 4096-position,
 * 32-head int8 cache has 128 Ki per tensor), and the per-value loop with
 * its early exit cost 15% of such a decode's time on 2 threads
 * (docs/benchmarks.md). */
static int scales_ok(const float *x, int64_t n, int64_t stride)
{
    enum { BLOCK = 256 };
    uint32_t bad = 0;
    for (int64_t i0 = 0; i0 < n && !bad; i0 += BLOCK) {
        int64_t m = n - i0 < BLOCK ? n - i0 : BLOCK;
        if (stride == 1)
            for (int64_t i = 0; i < m; i++) {
                uint32_t b;
                memcpy(&b, x + i0 + i, sizeof b);
                bad |= (b & 0x7FFFFFFFu) - 1u >= 0x7F7FFFFFu;
            }
        else
            for (int64_t i = 0; i < m; i++) {
                uint32_t b;
                memcpy(&b, x + (i0 + i) * stride, sizeof b);
                bad |= (b & 0x7FFFFFFFu) - 1u >= 0x7F7FFFFFu;
            }
    }
    return !bad;
}

/* The same over a [n0, n1, n2] array of strides st: axes of one element
 * dropped and an axis merged into the next when its stride is the next
 * one's extent, so a per-row (or per-row and head) scale array of a dense
 * cache is one run. */
int mha_scales_ok(const float *x, const int64_t n[3], const int64_t st[3])
{
    int64_t dn[3], ds[3];
    int k = 0;
    for (int i = 0; i < 3; i++) {
        if (n[i] == 1)
            continue;
        if (k > 0 && ds[k - 1] == n[i] * st[i]) {
            dn[k - 1] *= n[i]; /* no overflow: the extent was checked */
            ds[k - 1] = st[i];
            continue;
        }
        dn[k] = n[i], ds[k] = st[i], k++;
    }
    if (k == 0)
        return scales_ok(x, 1, 1);
    int64_t outer = 1;
    for (int i = 0; i < k - 1; i++)
        outer *= dn[i];
    for (int64_t o = 0; o < outer; o++) {
        int64_t off = 0, r = o;
        for (int i = k - 2; i >= 0; i--) {
            off += r % dn[i] * ds[i];
            r /= dn[i];
        }
        if (!scales_ok(x + off, dn[k - 1], ds[k - 1]))
            return 0;
    }
    return 1;
}

static mha_status check_scales(const mha_tensor *t, const char *name,
                               int values)
{
    const mha_scales *sc = &t->scales;
    const int64_t sizes[3] = {t->batch, t->seq, t->heads};
    const int64_t strides[3] = {sc->stride_batch, sc->stride_seq,
                                sc->stride_head};
    const char *snames[3] = {"stride_batch", "stride_seq", "stride_head"};
    for (int i = 0; i < 3; i++)
        if (strides[i] < 0)
            return mha_fail(MHA_ERR_BAD_STRIDE, "%s.scales.%s (%lld) is "
                            "negative", name, snames[i],
                            (long long)strides[i]);
    mha_span r;
    if (!extent_span(sc->data, sizes, strides, 3, sizeof(float), &r))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "%s.scales spans more bytes than fit in 64 bits",
                        name);
    if (!values)
        return MHA_OK;
    int64_t nb = strides[0] ? sizes[0] : 1, ns = strides[1] ? sizes[1] : 1,
            nh = strides[2] ? sizes[2] : 1;
    const int64_t counts[3] = {nb, ns, nh};
    if (mha_scales_ok(sc->data, counts, strides))
        return MHA_OK;
    /* A bad scale: found again in index order, for the message. */
    for (int64_t b = 0; b < nb; b++)
        for (int64_t s = 0; s < ns; s++)
            for (int64_t h = 0; h < nh; h++) {
                float x = sc->data[b * strides[0] + s * strides[1] +
                                   h * strides[2]];
                if (!isfinite(x) || x == 0.0f)
                    return mha_fail(MHA_ERR_BAD_ARGUMENT,
                                    "%s.scales[b=%lld, s=%lld, h=%lld] (%g) "
                                    "is not a finite nonzero number",
                                    name, (long long)b, (long long)s,
                                    (long long)h, (double)x);
            }
    return MHA_OK;
}

mha_span mha_scales_span(const mha_tensor *t)
{
    const mha_scales *sc = &t->scales;
    const int64_t sizes[3] = {t->batch, t->seq, t->heads};
    const int64_t strides[3] = {sc->stride_batch, sc->stride_seq,
                                sc->stride_head};
    mha_span r = {0, 0};
    if (sc->data)
        extent_span(sc->data, sizes, strides, 3, sizeof(float), &r);
    return r;
}

/* kv: the tensor stores keys or values (a K/V storage dtype), else it is
 * a query or an output (a compute dtype). */
mha_status mha_check_tensor(const mha_tensor *t, const char *name, int kv,
                            int scale_values, mha_span *range)
{
    if (!t->data)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s.data is NULL", name);
    const mha_dtype_traits *tr = mha_dtype_traits_of(t->dtype);
    if (!tr)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "%s.dtype (%d) is not an mha_dtype", name,
                        (int)t->dtype);
    if (kv ? !tr->kv_ok : !tr->compute_ok)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "%s.dtype (%s) is not supported for %s", name,
                        tr->name, kv ? "keys and values" : "queries and "
                                                           "outputs");
    if (!tr->needs_scale && t->scales.data)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "%s.scales is set, but %s.dtype (%s) takes no scale",
                        name, name, tr->name);
    if (tr->needs_scale && !t->scales.data)
        return mha_fail(MHA_ERR_NULL_POINTER,
                        "%s.scales.data is NULL, but %s.dtype (%s) needs "
                        "scales", name, name, tr->name);
    size_t elem = tr->size;
    const int64_t sizes[4] = {t->batch, t->seq, t->heads, t->dim};
    const char *axes[4] = {"batch", "seq", "heads", "dim"};
    for (int i = 0; i < 4; i++)
        if (sizes[i] <= 0)
            return mha_fail(MHA_ERR_BAD_SHAPE, "%s.%s (%lld) must be positive",
                            name, axes[i], (long long)sizes[i]);
    const int64_t strides[4] = {t->stride_batch, t->stride_seq,
                                t->stride_head, 1};
    const char *snames[3] = {"stride_batch", "stride_seq", "stride_head"};
    for (int i = 0; i < 3; i++)
        if (strides[i] < 0)
            return mha_fail(MHA_ERR_BAD_STRIDE,
                            "%s.%s (%lld) is negative", name, snames[i],
                            (long long)strides[i]);
    if (!extent_span(t->data, sizes, strides, 4, elem, range))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "%s spans more bytes than fit in 64 bits", name);
    return tr->needs_scale ? check_scales(t, name, scale_values) : MHA_OK;
}

/* Distinct indices of t map to distinct elements: sorted by stride, each
 * axis steps past everything the smaller axes reach. */
int mha_non_self_overlapping(const mha_tensor *t)
{
    int64_t size[4] = {t->batch, t->seq, t->heads, t->dim};
    int64_t stride[4] = {t->stride_batch, t->stride_seq, t->stride_head, 1};
    for (int i = 1; i < 4; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && stride[j] < stride[j - 1]; j--) {
            int64_t s = stride[j], z = size[j];
            stride[j] = stride[j - 1], size[j] = size[j - 1];
            stride[j - 1] = s, size[j - 1] = z;
        }
    int64_t reach = 0; /* largest offset reached by the smaller axes */
    for (int i = 0; i < 4; i++) {
        if (size[i] == 1)
            continue;
        if (stride[i] <= reach)
            return 0;
        reach += (size[i] - 1) * stride[i]; /* bounded: extent checked */
    }
    return 1;
}

static mha_status check_mask_array(const void *data, const char *name,
                                   const int64_t strides[3], int64_t batch,
                                   int64_t heads, int64_t lq, int64_t lk,
                                   size_t elem, mha_span *range)
{
    const char *axes[3] = {"batch", "head", "query"};
    for (int i = 0; i < 3; i++)
        if (strides[i] < 0)
            return mha_fail(MHA_ERR_BAD_MASK,
                            "mask.%s_stride_%s (%lld) is negative", name,
                            axes[i], (long long)strides[i]);
    const int64_t sizes[4] = {batch, heads, lq, lk};
    const int64_t all[4] = {strides[0], strides[1], strides[2], 1};
    if (!extent_span(data, sizes, all, 4, elem, range))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "mask.%s spans more bytes than fit in 64 bits", name);
    return MHA_OK;
}

/* A [rows, cols] array (field name) with a row stride (field
 * stride_name) and contiguous columns: the stride's sign (status bad) and
 * the byte span. */
static mha_status check_rows(const void *data, const char *name,
                             const char *stride_name, int64_t stride,
                             int64_t rows, int64_t cols, size_t elem,
                             mha_status bad, mha_span *range)
{
    if (stride < 0)
        return mha_fail(bad, "%s (%lld) is negative", stride_name,
                        (long long)stride);
    const int64_t sizes[2] = {rows, cols}, strides[2] = {stride, 1};
    if (!extent_span(data, sizes, strides, 2, elem, range))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "%s spans more bytes than fit in 64 bits", name);
    return MHA_OK;
}

static mha_status mha_validate_mask(const mha_mask *mask, int64_t batch,
                             int64_t heads, int64_t lq, int64_t lk,
                             mha_mask *copy)
{
    memset(copy, 0, sizeof *copy);
    if (!mask)
        return MHA_OK;
    if (mask->causal != MHA_CAUSAL_NONE &&
        mask->causal != MHA_CAUSAL_TOP_LEFT &&
        mask->causal != MHA_CAUSAL_BOTTOM_RIGHT)
        return mha_fail(MHA_ERR_BAD_MASK,
                        "mask.causal (%d) is not an mha_causal value",
                        (int)mask->causal);
    mha_span r;
    if (mask->keep) {
        const int64_t s[3] = {mask->keep_stride_batch, mask->keep_stride_head,
                              mask->keep_stride_query};
        mha_status st = check_mask_array(mask->keep, "keep", s, batch, heads,
                                         lq, lk, 1, &r);
        if (st != MHA_OK)
            return st;
    }
    if (mask->bias) {
        const int64_t s[3] = {mask->bias_stride_batch, mask->bias_stride_head,
                              mask->bias_stride_query};
        mha_status st = check_mask_array(mask->bias, "bias", s, batch, heads,
                                         lq, lk, sizeof(float), &r);
        if (st != MHA_OK)
            return st;
    }
    if (mask->key_keep) {
        mha_status st = check_rows(mask->key_keep, "mask.key_keep",
                                   "mask.key_keep_stride_batch",
                                   mask->key_keep_stride_batch, batch, lk, 1,
                                   MHA_ERR_BAD_MASK, &r);
        if (st != MHA_OK)
            return st;
    }
    if (mask->key_lengths)
        for (int64_t b = 0; b < batch; b++) {
            int32_t len = mask->key_lengths[b];
            if (len < 0 || len > lk)
                return mha_fail(MHA_ERR_BAD_MASK,
                                "mask.key_lengths[%lld] (%d) is outside "
                                "[0, %lld]",
                                (long long)b, (int)len, (long long)lk);
        }
    *copy = *mask;
    return MHA_OK;
}

/* The byte ranges of the mask arrays, for overlap checks with outputs. */
static int mask_spans(const mha_mask *m, int64_t batch, int64_t heads,
                      int64_t lq, int64_t lk, mha_span out[4])
{
    int n = 0;
    const int64_t sizes[4] = {batch, heads, lq, lk};
    if (m->keep) {
        const int64_t s[4] = {m->keep_stride_batch, m->keep_stride_head,
                              m->keep_stride_query, 1};
        extent_span(m->keep, sizes, s, 4, 1, &out[n++]);
    }
    if (m->bias) {
        const int64_t s[4] = {m->bias_stride_batch, m->bias_stride_head,
                              m->bias_stride_query, 1};
        extent_span(m->bias, sizes, s, 4, sizeof(float), &out[n++]);
    }
    if (m->key_keep) {
        const int64_t ks[2] = {batch, lk};
        const int64_t s[2] = {m->key_keep_stride_batch, 1};
        extent_span(m->key_keep, ks, s, 2, 1, &out[n++]);
    }
    if (m->key_lengths) {
        out[n].lo = (uintptr_t)m->key_lengths;
        out[n].hi = out[n].lo + (uintptr_t)batch * sizeof(int32_t);
        n++;
    }
    return n;
}

static mha_status mha_check_mask_disjoint(const mha_mask *mask, int64_t batch,
                                   int64_t heads, int64_t lq, int64_t lk,
                                   const void *output, size_t bytes,
                                   const char *name)
{
    mha_span rm[4], ro = {(uintptr_t)output, (uintptr_t)output + bytes};
    int nm = mask_spans(mask, batch, heads, lq, lk, rm);
    for (int i = 0; i < nm; i++)
        if (mha_spans_overlap(rm[i], ro))
            return mha_fail(MHA_ERR_BAD_MASK, "a mask array overlaps %s",
                            name);
    return MHA_OK;
}

/* The score terms (docs/design.md, "Score terms"): every field, and the
 * arrays they point to against the outputs outs[0..n). */
static mha_status check_terms(const mha_score_terms *t, int64_t batch,
                              int64_t heads, int64_t lk, int per_sequence,
                              const mha_span *outs,
                              const char *const *out_names, int n,
                              mha_score_terms *copy)
{
    memset(copy, 0, sizeof *copy);
    if (!t)
        return MHA_OK;
    if (t->window != 0 && t->window != 1)
        return mha_fail(MHA_ERR_BAD_MASK, "terms.window (%d) is not 0 or 1",
                        t->window);
    if (t->window_left < -1)
        return mha_fail(MHA_ERR_BAD_MASK,
                        "terms.window_left (%lld) is negative (-1 is "
                        "unbounded)",
                        (long long)t->window_left);
    if (t->window_right < -1)
        return mha_fail(MHA_ERR_BAD_MASK,
                        "terms.window_right (%lld) is negative (-1 is "
                        "unbounded)",
                        (long long)t->window_right);
    if (t->align != MHA_ALIGN_BOTTOM_RIGHT && t->align != MHA_ALIGN_TOP_LEFT)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "terms.align (%d) is not an mha_align value",
                        (int)t->align);
    if (!isfinite(t->softcap))
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "terms.softcap (%g) is not finite", (double)t->softcap);
    if (t->softcap < 0.0f)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "terms.softcap (%g) is negative", (double)t->softcap);
    /* A normal cap: its reciprocal is finite (a score of 0 times an
     * infinite one would be NaN), and a flushing engine reads it as the
     * cap it is (under DAZ a subnormal cap is 0: off). */
    if (t->softcap > 0.0f && t->softcap < FLT_MIN)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "terms.softcap (%g) is below FLT_MIN: a subnormal "
                        "cap",
                        (double)t->softcap);
    /* Positions stay far from overflow: a quarter of the int64 range. */
    const int64_t far = INT64_MAX / 4;
    if (t->key_offset < 0 || t->key_offset > far)
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "terms.key_offset (%lld) is outside [0, 2^61)",
                        (long long)t->key_offset);
    if (t->key_total != 0 &&
        (t->key_total < t->key_offset + lk || t->key_total > far))
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "terms.key_total (%lld) is below key_offset + Lk "
                        "(%lld + %lld) or past 2^61",
                        (long long)t->key_total, (long long)t->key_offset,
                        (long long)lk);
    mha_span spans[4];
    const char *names[4];
    int ns = 0;
    mha_status st;
    /* Per-sequence positions replace the scalars (which must then be 0);
     * lk is the longest sequence's, so a continuous batch checks each
     * sequence's own total against its own keys (varlen.c). */
    const int64_t *pos[2] = {t->key_offsets, t->key_totals};
    const char *pos_name[2] = {"terms.key_offsets", "terms.key_totals"};
    for (int a = 0; a < 2; a++) {
        if (!pos[a])
            continue;
        if (a == 0 ? t->key_offset != 0 : t->key_total != 0)
            return mha_fail(MHA_ERR_BAD_ARGUMENT,
                            "%s and terms.%s (%lld) are both set", pos_name[a],
                            a == 0 ? "key_offset" : "key_total",
                            (long long)(a == 0 ? t->key_offset : t->key_total));
        if ((st = check_rows(pos[a], pos_name[a], "", 0, 1, batch,
                             sizeof(int64_t), MHA_ERR_BAD_ARGUMENT,
                             &spans[ns])) != MHA_OK)
            return st;
        names[ns++] = pos_name[a];
    }
    for (int64_t b = 0; (t->key_offsets || t->key_totals) && b < batch; b++) {
        int64_t off = t->key_offsets ? t->key_offsets[b] : t->key_offset;
        int64_t tot = t->key_totals ? t->key_totals[b] : t->key_total;
        if (off < 0 || off > far)
            return mha_fail(MHA_ERR_BAD_ARGUMENT,
                            "terms.key_offsets[%lld] (%lld) is outside "
                            "[0, 2^61)",
                            (long long)b, (long long)off);
        if (tot != 0 && (tot < off + (per_sequence ? 0 : lk) || tot > far))
            return mha_fail(MHA_ERR_BAD_ARGUMENT,
                            "terms.key_totals[%lld] (%lld) is below its key "
                            "offset + Lk (%lld + %lld) or past 2^61",
                            (long long)b, (long long)tot, (long long)off,
                            (long long)lk);
    }
    if (t->alibi_slopes) {
        if ((st = check_rows(t->alibi_slopes, "terms.alibi_slopes",
                             "terms.alibi_stride_batch",
                             t->alibi_stride_batch, batch, heads,
                             sizeof(float), MHA_ERR_BAD_ARGUMENT,
                             &spans[ns])) != MHA_OK)
            return st;
        names[ns++] = "terms.alibi_slopes";
        for (int64_t b = 0; b < batch; b++)
            for (int64_t h = 0; h < heads; h++) {
                float x = t->alibi_slopes[b * t->alibi_stride_batch + h];
                if (!isfinite(x))
                    return mha_fail(MHA_ERR_BAD_ARGUMENT,
                                    "terms.alibi_slopes[%lld][%lld] (%g) is "
                                    "not finite",
                                    (long long)b, (long long)h, (double)x);
            }
    }
    if (t->sinks) {
        if ((st = check_rows(t->sinks, "terms.sinks", "", 0, 1, heads,
                             sizeof(float), MHA_ERR_BAD_ARGUMENT,
                             &spans[ns])) != MHA_OK)
            return st;
        names[ns++] = "terms.sinks";
        for (int64_t h = 0; h < heads; h++)
            if (!isfinite(t->sinks[h]))
                return mha_fail(MHA_ERR_BAD_ARGUMENT,
                                "terms.sinks[%lld] (%g) is not finite",
                                (long long)h, (double)t->sinks[h]);
    }
    for (int i = 0; i < ns; i++)
        for (int o = 0; o < n; o++)
            if (mha_spans_overlap(spans[i], outs[o]))
                return mha_fail(MHA_ERR_BAD_ARGUMENT, "%s overlaps %s",
                                names[i], out_names[o]);
    *copy = *t;
    return MHA_OK;
}

static mha_status mha_check_weights(const float *weights, int64_t bytes,
                             mha_span out, const mha_span *inputs,
                             const char *const *names, int n,
                             mha_span *span)
{
    span->lo = (uintptr_t)weights;
    if ((uint64_t)bytes > UINTPTR_MAX - span->lo)
        return mha_fail(MHA_ERR_OVERFLOW,
                        "weights extend past the address space");
    span->hi = span->lo + (uintptr_t)bytes;
    for (int i = 0; i < n; i++)
        if (mha_spans_overlap(*span, inputs[i]))
            return mha_fail(MHA_ERR_BAD_STRIDE, "weights overlap %s",
                            names[i]);
    if (mha_spans_overlap(*span, out))
        return mha_fail(MHA_ERR_BAD_STRIDE, "weights overlap out");
    return MHA_OK;
}

mha_status mha_check_views(const mha_views *views)
{
    mha_span r;
    mha_status st;
    for (int i = 0; i < views->n_in; i++)
        if ((st = mha_check_tensor(views->in[i], views->in_name[i], i > 0,
                                   i == 0 || !views->kv_scales_used_only,
                                   &r)) != MHA_OK)
            return st;
    if ((st = mha_check_tensor(views->out, views->out_name, 0, 1, &r)) !=
        MHA_OK)
        return st;
    /* One compute dtype for q and out (docs/design.md, "Compute dtype"). */
    if (views->out->dtype != views->in[0]->dtype)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "%s.dtype (%s) differs from %s.dtype (%s): the query "
                        "and the output share the compute dtype",
                        views->out_name, mha_dtype_name(views->out->dtype),
                        views->in_name[0], mha_dtype_name(views->in[0]->dtype));
    return MHA_OK;
}

mha_status mha_check_outputs(const mha_views *views, mha_mask *mask,
                             mha_score_terms *terms)
{
    const mha_tensor *o = views->out;
    mha_span ro, rw = {0, 0}, inputs[3];
    /* Extents were checked by mha_check_views. */
    mha_check_tensor(o, views->out_name, 0, 0, &ro);
    for (int i = 0; i < views->n_in; i++)
        mha_check_tensor(views->in[i], views->in_name[i], i > 0, 0, &inputs[i]);
    if (!mha_non_self_overlapping(o))
        return mha_fail(MHA_ERR_BAD_STRIDE,
                        "%s strides (%lld, %lld, %lld) make distinct "
                        "elements share memory",
                        views->out_name, (long long)o->stride_batch,
                        (long long)o->stride_seq, (long long)o->stride_head);
    for (int i = 0; i < views->n_in; i++)
        if (mha_spans_overlap(ro, inputs[i]))
            return mha_fail(MHA_ERR_BAD_STRIDE, "%s overlaps %s",
                            views->out_name, views->in_name[i]);
    mha_span rs[3];
    for (int i = 0; i < views->n_in; i++)
        if (mha_spans_overlap(ro, rs[i] = mha_scales_span(views->in[i])))
            return mha_fail(MHA_ERR_BAD_STRIDE, "%s overlaps %s.scales",
                            views->out_name, views->in_name[i]);

    int64_t B = views->batch, H = views->heads, Lq = views->lq,
            Lk = views->lk;
    int64_t bh, bhq, weights_n, weights_bytes;
    if (views->packed_outputs) {
        /* The caller summed them with overflow checks. */
        bhq = views->lse_floats;
        weights_bytes = views->weights_floats * (int64_t)sizeof(float);
    } else if (!mha_mul_ok(B, H, &bh) || !mha_mul_ok(bh, Lq, &bhq) ||
               !mha_mul_ok(bhq, Lk, &weights_n) ||
               !mha_mul_ok(weights_n, (int64_t)sizeof(float),
                           &weights_bytes))
        return mha_fail(MHA_ERR_OVERFLOW,
                        "weights B*H*Lq*Lk*4 (%lld*%lld*%lld*%lld*4) "
                        "overflows",
                        (long long)B, (long long)H, (long long)Lq,
                        (long long)Lk);
    mha_status st;
    if (views->weights &&
        (st = mha_check_weights(views->weights, weights_bytes, ro, inputs,
                                views->in_name, views->n_in, &rw)) != MHA_OK)
        return st;
    /* lse [B, H, Lq]: apart from every input and output. */
    mha_span rl = {0, 0};
    if (views->lse) {
        int64_t lse_bytes;
        if (!mha_mul_ok(bhq, (int64_t)sizeof(float), &lse_bytes) ||
            (uint64_t)lse_bytes > UINTPTR_MAX - (uintptr_t)views->lse)
            return mha_fail(MHA_ERR_OVERFLOW,
                            "lse extends past the address space");
        rl.lo = (uintptr_t)views->lse;
        rl.hi = rl.lo + (uintptr_t)lse_bytes;
        for (int i = 0; i < views->n_in; i++)
            if (mha_spans_overlap(rl, inputs[i]))
                return mha_fail(MHA_ERR_BAD_STRIDE, "lse overlaps %s",
                                views->in_name[i]);
        if (mha_spans_overlap(rl, ro) || mha_spans_overlap(rl, rw))
            return mha_fail(MHA_ERR_BAD_STRIDE, "lse overlaps %s",
                            mha_spans_overlap(rl, ro) ? views->out_name
                                                      : "weights");
    }
    for (int i = 0; i < views->n_in; i++)
        if (mha_spans_overlap(rw, rs[i]))
            return mha_fail(MHA_ERR_BAD_STRIDE, "weights overlap %s.scales",
                            views->in_name[i]);
    if ((st = mha_validate_mask(views->mask, B, H, Lq, Lk, mask)) != MHA_OK)
        return st;
    if ((st = mha_check_mask_disjoint(mask, B, H, Lq, Lk,
                                      (const void *)ro.lo, ro.hi - ro.lo,
                                      views->out_name)) != MHA_OK ||
        (st = mha_check_mask_disjoint(mask, B, H, Lq, Lk,
                                      (const void *)rw.lo, rw.hi - rw.lo,
                                      "weights")) != MHA_OK ||
        (st = mha_check_mask_disjoint(mask, B, H, Lq, Lk,
                                      (const void *)rl.lo, rl.hi - rl.lo,
                                      "lse")) != MHA_OK)
        return st;
    const mha_span outs[3] = {ro, rw, rl};
    const char *const out_names[3] = {views->out_name, "weights", "lse"};
    return check_terms(views->terms, B, H, Lk, views->packed_outputs, outs,
                       out_names, 3, terms);
}

void mha_problem_init(mha_problem *p, const mha_tensor *q,
                      const mha_tensor *k, const mha_tensor *v,
                      const mha_tensor *o, const mha_mask *mask, float scale,
                      float *weights)
{
    p->q = q->data, p->k = k->data, p->v = v->data, p->out = o->data;
    p->k_dtype = k->dtype, p->v_dtype = v->dtype, p->compute = q->dtype;
    p->k_scales = k->scales, p->v_scales = v->scales;
    p->batch = q->batch, p->lq = q->seq, p->lk = k->seq, p->heads = q->heads;
    p->kv_heads = k->heads, p->d = q->dim, p->dv = v->dim;
    p->q_sb = q->stride_batch, p->q_ss = q->stride_seq;
    p->q_sh = q->stride_head;
    p->k_sb = k->stride_batch, p->k_ss = k->stride_seq;
    p->k_sh = k->stride_head;
    p->v_sb = v->stride_batch, p->v_ss = v->stride_seq;
    p->v_sh = v->stride_head;
    p->o_sb = o->stride_batch, p->o_ss = o->stride_seq;
    p->o_sh = o->stride_head;
    p->mask = *mask;
    memset(&p->terms, 0, sizeof p->terms);
    p->scale = scale != 0.0f ? scale : (float)(1.0 / sqrt((double)q->dim));
    p->weights = weights;
    p->lse = NULL;
    p->out_read_next = 0;
    p->cu_q = p->cu_k = p->block_table = p->seqlens_k = NULL;
    p->bt_stride = p->page_size = p->total_q = 0;
}

mha_status mha_validate_attention(const mha_attention_args *args,
                                  mha_problem *p)
{
    /* Arguments are read as IEEE values whatever the engine's
     * flush_subnormals, so a call is accepted or refused alike either way
     * (docs/design.md, "The floating-point environment"). */
    MHA_FPENV_SCOPE(0);
    if (!args)
        return mha_fail(MHA_ERR_NULL_POINTER, "args is NULL");
    const mha_tensor *q = &args->q, *k = &args->k, *v = &args->v,
                     *out = &args->out;
    mha_views views = {3, {q, k, v}, {"q", "k", "v"}, out, "out",
                       args->weights, args->mask, q->batch, q->heads,
                       q->seq, k->seq, args->terms, args->lse, 0, 0, 0, 0};
    mha_status st;
    if ((st = mha_check_views(&views)) != MHA_OK)
        return st;

    MHA_SAME(k, batch, q, batch)
    MHA_SAME(v, batch, q, batch)
    MHA_SAME(out, batch, q, batch)
    MHA_SAME(out, seq, q, seq)
    MHA_SAME(out, heads, q, heads)
    MHA_SAME(v, seq, k, seq)
    MHA_SAME(v, heads, k, heads)
    MHA_SAME(k, dim, q, dim)
    MHA_SAME(out, dim, v, dim)
    if (q->heads % k->heads != 0)
        return mha_fail(MHA_ERR_BAD_SHAPE,
                        "k.heads (%lld) does not divide q.heads (%lld)",
                        (long long)k->heads, (long long)q->heads);
    if (!isfinite(args->scale))
        return mha_fail(MHA_ERR_BAD_ARGUMENT, "scale (%g) is not finite",
                        (double)args->scale);
    mha_mask mask;
    mha_score_terms terms;
    if ((st = mha_check_outputs(&views, &mask, &terms)) != MHA_OK)
        return st;
    mha_problem_init(p, q, k, v, out, &mask, args->scale, args->weights);
    p->terms = terms;
    p->lse = args->lse;
    if (args->scale_explicit)
        p->scale = args->scale;
    return MHA_OK;
}


