/* Merging partial results: the ordered pairwise step shared by the
 * split-KV merge (the partial (accumulator, max, sum) triples of a row
 * block's key chunks, combined in chunk order, so the result never depends
 * on which thread computed which chunk) and by mha_merge_states (normalised
 * outputs with their log-sum-exp). docs/design.md, "Merging partial
 * results". */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attention.h"

void mha_merge_step(float *o, float *m, float *l, const float *a, float ma,
                    float la, int64_t dv)
{
    if (ma == -INFINITY)
        return; /* every key of the part masked: it adds nothing */
    float mo = *m;
    if (mo == -INFINITY && ma == ma) {
        if (o != a)
            memcpy(o, a, (size_t)dv * sizeof *o);
        *m = ma;
        *l = la;
        return;
    }
    float mx = ma > mo || ma != ma ? ma : mo; /* NaN sticks */
    float fo = expf(mo - mx), fa = expf(ma - mx);
    for (int64_t x = 0; x < dv; x++)
        o[x] = o[x] * fo + a[x] * fa;
    *l = *l * fo + la * fa;
    *m = mx;
}

float mha_merge_lse(float m, float l)
{
    return l == 0.0f ? -INFINITY : m + logf(l);
}

/* One row of a half compute call through the table's narrow kernel
 * (mha_narrow_kernel), which normalises and narrows it in one pass:
 * normalize's zeros for a zero sum, else o times 1 / l, normalize's
 * product, so the same bits as normalizing into the staging rows and
 * narrowing them, which cost a store and a load of every output float
 * (2.5% of AMX bf16 prefill at 2048 keys, docs/benchmarks.md). */
static void finish_row(mk_narrow_fn *narrow, const float *o, float l,
                       int64_t dv, void *y)
{
    if (l == 0.0f)
        memset(y, 0, (size_t)dv * sizeof(uint16_t));
    else
        narrow(o, dv, 1.0f / l, y);
}

void mha_finish_rows(const mk_table *t, const mha_problem *p,
                     const mha_row_block *rb, const float *o, const float *m,
                     const float *l)
{
    size_t es = mha_dtype_size(p->compute);
    mk_narrow_fn *narrow = mha_narrow_kernel(t, p->compute);
    if (!o) {
        /* the rows are written */
    } else if (narrow) {
        for (int64_t r = 0; r < rb->rows; r++) {
            ptrdiff_t at = rb->ilv > 1 ? mha_ilv_at(rb, r, rb->o_qs,
                                                    rb->ldo_dst)
                                       : r * rb->ldo_dst;
            finish_row(narrow, o + r * p->dv, l[r], p->dv,
                       (char *)rb->out_dst + (size_t)at * es);
        }
    } else if (rb->ilv > 1) {
        /* Interleaved queries: normalised into the staging rows
         * MK_DECODE_ROWS at a time (kept in L1, as below), each row then
         * copied or narrowed to its query and head. */
        for (int64_t r0 = 0; r0 < rb->rows; r0 += MK_DECODE_ROWS) {
            int64_t n = rb->rows - r0 < MK_DECODE_ROWS ? rb->rows - r0
                                                       : MK_DECODE_ROWS;
            t->normalize(o + r0 * p->dv, p->dv, n, p->dv, l + r0,
                         rb->out + r0 * rb->ldo, rb->ldo, 0);
            for (int64_t r = r0; r < r0 + n; r++) {
                char *y = rb->out_dst +
                          (size_t)mha_ilv_at(rb, r, rb->o_qs, rb->ldo_dst) *
                              es;
                if (p->compute == MHA_F32)
                    memcpy(y, rb->out + r * rb->ldo,
                           (size_t)p->dv * sizeof(float));
                else
                    mha_narrow_rows(t, p->compute, rb->out + r * rb->ldo,
                                    rb->ldo, 1, p->dv, y, 0);
            }
        }
    } else if (p->compute == MHA_F32) {
        t->normalize(o, p->dv, rb->rows, p->dv, l, rb->out, rb->ldo,
                     mha_streams_out(p, rb->rows));
    } else {
        /* rb->out is the staging rows: normalised (kept cached: the
         * narrowing reads them back) and narrowed MK_DECODE_ROWS rows at
         * a time, so they stay in L1 between the two. */
        for (int64_t r = 0; r < rb->rows; r += MK_DECODE_ROWS) {
            int64_t n = rb->rows - r < MK_DECODE_ROWS ? rb->rows - r
                                                      : MK_DECODE_ROWS;
            t->normalize(o + r * p->dv, p->dv, n, p->dv, l + r,
                         rb->out + r * rb->ldo, rb->ldo, 0);
            mha_narrow_rows(t, p->compute, rb->out + r * rb->ldo, rb->ldo, n,
                            p->dv,
                            (char *)rb->out_dst +
                                (size_t)(r * rb->ldo_dst) * es,
                            rb->ldo_dst);
        }
    }
    if (rb->lse)
        for (int64_t r = 0; r < rb->rows; r++)
            rb->lse[rb->ilv > 1 ? mha_ilv_at(rb, r, 1, rb->lse_ld)
                                : r * rb->lse_ld] = mha_merge_lse(m[r], l[r]);
}

/* Each partial holds rows x dv accumulator, then rows maxima, then rows
 * sums; the first partial is the state the others fold into. */
void mha_merge_chunks(const mk_table *t, const mha_problem *p,
                      const mha_seq *s, const mha_row_block *rb,
                      float *parts)
{
    int64_t dv = p->dv, stride = s->partial_floats, rows = s->rows;
    float *acc = parts, *macc = acc + rows * dv, *lacc = macc + rows;
    for (int64_t r = 0; r < rb->rows; r++)
        for (int64_t c = 1; c < s->chunks; c++) {
            const float *part = parts + c * stride;
            mha_merge_step(acc + r * dv, &macc[r], &lacc[r], part + r * dv,
                           part[rows * dv + r], part[rows * dv + rows + r],
                           dv);
        }
    mha_finish_rows(t, p, rb, acc, macc, lacc);
}

/* ---- mha_merge_states -------------------------------------------------- */

static mha_status check_merge(const mha_merge_args *a)
{
    if (!a)
        return mha_fail(MHA_ERR_NULL_POINTER, "args is NULL");
    if (a->parts < 1)
        return mha_fail(MHA_ERR_BAD_ARGUMENT, "parts (%lld) is below 1",
                        (long long)a->parts);
    if (!a->outs || !a->lses)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                        !a->outs ? "outs" : "lses");
    const mha_tensor *o = &a->out;
    mha_span ro, rl = {0, 0}, r;
    mha_status st;
    if ((st = mha_check_tensor(o, "out", 0, 0, &ro)) != MHA_OK)
        return st;
    /* Parts and output are fp32 (a partial result keeps full precision;
     * the compute dtype's rounding happens once, in the attention call). */
    if (o->dtype != MHA_F32)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "out.dtype (%s): mha_merge_states writes fp32",
                        mha_dtype_name(o->dtype));
    if (!mha_non_self_overlapping(o))
        return mha_fail(MHA_ERR_BAD_STRIDE,
                        "out strides (%lld, %lld, %lld) make distinct "
                        "elements share memory",
                        (long long)o->stride_batch, (long long)o->stride_seq,
                        (long long)o->stride_head);
    int64_t rows, bytes;
    if (!mha_mul_ok(o->batch, o->seq, &rows) ||
        !mha_mul_ok(rows, o->heads, &rows) ||
        !mha_mul_ok(rows, (int64_t)sizeof(float), &bytes))
        return mha_fail(MHA_ERR_OVERFLOW, "lse of out's B*H*L overflows");
    if (a->lse) {
        rl.lo = (uintptr_t)a->lse;
        if ((uint64_t)bytes > UINTPTR_MAX - rl.lo)
            return mha_fail(MHA_ERR_OVERFLOW,
                            "lse extends past the address space");
        rl.hi = rl.lo + (uintptr_t)bytes;
        if (mha_spans_overlap(rl, ro))
            return mha_fail(MHA_ERR_BAD_STRIDE, "lse overlaps out");
    }
    char name[48];
    for (int64_t c = 0; c < a->parts; c++) {
        const mha_tensor *t = &a->outs[c];
        snprintf(name, sizeof name, "outs[%lld]", (long long)c);
        if ((st = mha_check_tensor(t, name, 0, 0, &r)) != MHA_OK)
            return st;
        if (t->dtype != MHA_F32)
            return mha_fail(MHA_ERR_UNSUPPORTED,
                            "%s.dtype (%s): mha_merge_states reads fp32 "
                            "parts", name, mha_dtype_name(t->dtype));
        if (t->batch != o->batch || t->seq != o->seq ||
            t->heads != o->heads || t->dim != o->dim)
            return mha_fail(MHA_ERR_BAD_SHAPE,
                            "%s [%lld, %lld, %lld, %lld] differs from out "
                            "[%lld, %lld, %lld, %lld]",
                            name, (long long)t->batch, (long long)t->seq,
                            (long long)t->heads, (long long)t->dim,
                            (long long)o->batch, (long long)o->seq,
                            (long long)o->heads, (long long)o->dim);
        if (mha_spans_overlap(r, ro) || (a->lse && mha_spans_overlap(r, rl)))
            return mha_fail(MHA_ERR_BAD_STRIDE, "%s overlaps %s", name,
                            mha_spans_overlap(r, ro) ? "out" : "lse");
        if (!a->lses[c])
            return mha_fail(MHA_ERR_NULL_POINTER, "lses[%lld] is NULL",
                            (long long)c);
        mha_span rs = {(uintptr_t)a->lses[c], 0};
        if ((uint64_t)bytes > UINTPTR_MAX - rs.lo)
            return mha_fail(MHA_ERR_OVERFLOW,
                            "lses[%lld] extends past the address space",
                            (long long)c);
        rs.hi = rs.lo + (uintptr_t)bytes;
        if (mha_spans_overlap(rs, ro) || (a->lse && mha_spans_overlap(rs, rl)))
            return mha_fail(MHA_ERR_BAD_STRIDE, "lses[%lld] overlaps %s",
                            (long long)c,
                            mha_spans_overlap(rs, ro) ? "out" : "lse");
    }
    return MHA_OK;
}

mha_status mha_merge_states(const mha_merge_args *a)
{
    MHA_FPENV_SCOPE(0);
    mha_status st = check_merge(a);
    if (st != MHA_OK)
        return st;
    const mha_tensor *o = &a->out;
    const int64_t B = o->batch, L = o->seq, H = o->heads, dv = o->dim;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < L; i++) {
                float *row = (float *)o->data + b * o->stride_batch +
                             i * o->stride_seq + h * o->stride_head;
                const int64_t at = (b * H + h) * L + i;
                /* The output row is the state: empty, then each part in
                 * order. A normalised part is an accumulator with sum 1. */
                float m = -INFINITY, l = 0.0f;
                memset(row, 0, (size_t)dv * sizeof *row);
                for (int64_t c = 0; c < a->parts; c++) {
                    const mha_tensor *t = &a->outs[c];
                    const float *src = (const float *)t->data +
                                       b * t->stride_batch +
                                       i * t->stride_seq + h * t->stride_head;
                    mha_merge_step(row, &m, &l, src, a->lses[c][at], 1.0f,
                                   dv);
                }
                float inv = l == 0.0f ? 0.0f : 1.0f / l;
                for (int64_t x = 0; x < dv; x++)
                    row[x] = l == 0.0f ? 0.0f : row[x] * inv;
                if (a->lse)
                    a->lse[at] = mha_merge_lse(m, l);
            }
    return MHA_OK;
}
