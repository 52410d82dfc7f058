/* The fuzz target, validity model: why a request must fail, and the
 * checks of a call against it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

/* Bytes of an element; 4 for a value that is not an mha_dtype (its
 * buffer is sized as fp32, and the call must fail). */
size_t elem_size(mha_dtype t)
{
    size_t n = mha_dtype_size(t);
    return n ? n : 4;
}

/* Elements a view spans, 1 + sum (size_i - 1) * stride_i, saturated at
 * WIDE_CAP; -1 when a size is not positive or a stride negative. */
wide span_elems(const int64_t *size, const int64_t *stride, int n)
{
    wide last = 0;
    for (int i = 0; i < n; i++) {
        if (size[i] <= 0 || stride[i] < 0)
            return -1;
        last += (wide)(size[i] - 1) * stride[i];
        if (last > WIDE_CAP)
            last = WIDE_CAP;
    }
    return last + 1;
}

wide tensor_span(const mha_tensor *t)
{
    const int64_t size[4] = {t->batch, t->seq, t->heads, t->dim};
    const int64_t stride[4] = {t->stride_batch, t->stride_seq,
                               t->stride_head, 1};
    return span_elems(size, stride, 4);
}

/* Product of positive factors, saturated; -1 if one is not positive. */
wide product(const int64_t *f, int n)
{
    wide p = 1;
    for (int i = 0; i < n; i++) {
        if (f[i] <= 0)
            return -1;
        p = p > WIDE_CAP / f[i] ? WIDE_CAP : p * f[i];
    }
    return p;
}

/* Bytes to allocate for a described element count: exact when it fits the
 * budget, else one element (and *huge is set). */
size_t alloc_bytes(wide elems, size_t elem, int *huge)
{
    if (elems > MAX_ELEMS) {
        *huge = 1;
        return elem;
    }
    return elems <= 0 ? elem : (size_t)elems * elem;
}

void add_fault(fault_list *f, mha_status st, const char *why)
{
    if (f->n < 24) {
        f->status[f->n] = st;
        f->why[f->n] = why;
    }
    f->n++;
}

/* The status a failed call must return: the faults' common status, or -1
 * when they disagree (then any failure status will do). */
int expected_status(const fault_list *f)
{
    int n = f->n < 24 ? f->n : 24;
    for (int i = 1; i < n; i++)
        if (f->status[i] != f->status[0])
            return -1;
    return (int)f->status[0];
}

void check_status_known(mha_status st)
{
    REQUIRE((unsigned)st <= MHA_ERR_BAD_ARGUMENT);
    REQUIRE(strcmp(mha_status_string(st), "unknown status") != 0);
}

/* huge: some buffers are shorter than described, so the described byte
 * ranges of distinct buffers may overlap and any failure status will do. */
void check_failure(mha_status st, const fault_list *f, int huge)
{
    check_status_known(st);
    REQUIRE_AT(st != MHA_OK, "model fault: %s", f->why[0]);
    int want = huge ? -1 : expected_status(f);
    REQUIRE_AT(want < 0 || (int)st == want ||
                   (f->may_refuse && st == f->may_refuse),
               "got %s, model fault: %s", mha_status_string(st), f->why[0]);
    const char *msg = mha_last_error();
    REQUIRE(msg != NULL && msg[0] != '\0' && strlen(msg) < 1024);
}

/* Distinct indices of an output view must address distinct elements:
 * checked by marking every element (views within the budget), or by
 * counting (more indices than elements spanned). 1: overlaps, 0: does not,
 * -1: too large to tell. */
int self_overlapping(const mha_tensor *t)
{
    wide span = tensor_span(t);
    const int64_t size[4] = {t->batch, t->seq, t->heads, t->dim};
    wide count = product(size, 4);
    if (span <= 0)
        return -1;
    if (count > span)
        return 1;
    if (span > MAX_ELEMS || count > MAX_LOGICAL)
        return -1;
    uint8_t *seen = calloc((size_t)span, 1);
    if (!seen)
        abort();
    int overlap = 0;
    for (int64_t b = 0; b < t->batch && !overlap; b++)
        for (int64_t s = 0; s < t->seq && !overlap; s++)
            for (int64_t h = 0; h < t->heads && !overlap; h++)
                for (int64_t c = 0; c < t->dim && !overlap; c++) {
                    int64_t at = b * t->stride_batch + s * t->stride_seq +
                                 h * t->stride_head + c;
                    overlap = seen[at]++ != 0;
                }
    free(seen);
    return overlap;
}

/* The output layout rule the library can check cheaply: sorted by stride,
 * each axis of size > 1 steps past everything the smaller axes reach. A
 * layout that breaks it may still be free of overlap (strides 36 and 68
 * over 6 and 178 elements), but the library may refuse it. */
int nested(const mha_tensor *t)
{
    int64_t size[4] = {t->batch, t->seq, t->heads, t->dim};
    int64_t stride[4] = {t->stride_batch, t->stride_seq, t->stride_head, 1};
    int used[4] = {0, 0, 0, 0};
    wide reach = 0;
    for (int n = 0; n < 4; n++) {
        int pick = -1;
        for (int i = 0; i < 4; i++)
            if (!used[i] && (pick < 0 || stride[i] < stride[pick]))
                pick = i;
        used[pick] = 1;
        if (size[pick] == 1)
            continue;
        if (stride[pick] <= reach)
            return 0;
        reach += (wide)(size[pick] - 1) * stride[pick];
        if (reach > WIDE_CAP)
            return 0;
    }
    return 1;
}

/* Elements the keep or bias array spans over [B, H, Lq, Lk]. */
wide mask_span(const int64_t st[3], int64_t B, int64_t H, int64_t Lq,
                      int64_t Lk)
{
    const int64_t size[4] = {B, H, Lq, Lk};
    const int64_t stride[4] = {st[0], st[1], st[2], 1};
    return span_elems(size, stride, 4);
}

void keep_strides(const mha_mask *m, int64_t s[3])
{
    s[0] = m->keep_stride_batch, s[1] = m->keep_stride_head;
    s[2] = m->keep_stride_query;
}

void bias_strides(const mha_mask *m, int64_t s[3])
{
    s[0] = m->bias_stride_batch, s[1] = m->bias_stride_head;
    s[2] = m->bias_stride_query;
}

void mask_faults(mask_buffers *mb, const mha_mask *m, int64_t B,
                        int64_t H, int64_t Lq, int64_t Lk, fault_list *f,
                        int *huge)
{
    if (!mb->use)
        return;
    if ((int)m->causal < 0 || (int)m->causal > 2)
        add_fault(f, MHA_ERR_BAD_MASK, "mask.causal is not an mha_causal");
    const int has[2] = {mb->keep, mb->bias};
    const size_t elem[2] = {1, 4};
    for (int a = 0; a < 2; a++) {
        if (!has[a])
            continue;
        int64_t st[3];
        if (a == 0)
            keep_strides(m, st);
        else
            bias_strides(m, st);
        if (st[0] < 0 || st[1] < 0 || st[2] < 0) {
            add_fault(f, MHA_ERR_BAD_MASK, "a mask stride is negative");
            continue;
        }
        wide span = mask_span(st, B, H, Lq, Lk);
        if (span > 0 && span * (wide)elem[a] > INT64_MAX)
            add_fault(f, MHA_ERR_OVERFLOW, "a mask array spans > 2^63 bytes");
        if (span > 0)
            alloc_bytes(span, elem[a], huge);
    }
    if (mb->lengths && B > MAX_ELEMS)
        mb->lengths_unreadable = 1;
}

void length_faults(const mask_buffers *mb, const mha_mask *m,
                          int64_t B, int64_t Lk, fault_list *f)
{
    if (!mb->use || !mb->lengths || mb->lengths_unreadable || B <= 0)
        return;
    for (int64_t b = 0; b < B; b++)
        if (m->key_lengths[b] < 0 || m->key_lengths[b] > Lk) {
            add_fault(f, MHA_ERR_BAD_MASK, "a key length is outside [0, Lk]");
            return;
        }
}

/* Alias 15 points a mask array (bias, else keep) into the output buffer:
 * an invalid request when the mask has such an array. */
int mask_aliased(int alias, const mask_buffers *mb)
{
    return alias == 15 && mb->use && (mb->keep || mb->bias);
}

/* After a call with buffers bufs (the first 3 its inputs): a failure must
 * be one the model expects and leave every buffer as it was; a success
 * must be a valid request and leave the inputs and the mask alone.
 * Returns 1 when the outputs are to be checked against the oracle. */
int check_call(mha_status st, fault_list *f, int huge,
                      const buffer *bufs, int n, const mask_buffers *mb)
{
    check_status_known(st);
    if (f->n == 0 && f->may_refuse && st == f->may_refuse)
        add_fault(f, st, "out strides do not nest (refusal allowed)");
    for (int i = 0; i < 3; i++)
        REQUIRE_AT(buffer_unchanged(&mb->buf[i]), "mask buffer %d written",
                   i);
    if (f->n > 0) {
        check_failure(st, f, huge);
        for (int i = 0; i < n; i++)
            REQUIRE_AT(buffer_unchanged(&bufs[i]), "buffer %d written", i);
        return 0;
    }
    REQUIRE_AT(st == MHA_OK, "valid call failed: %s", mha_status_string(st));
    for (int i = 0; i < 3; i++)
        REQUIRE_AT(buffer_unchanged(&bufs[i]), "input %d written", i);
    return 1;
}

void attention_model(attention_case *c, const mha_engine *engine,
                            fault_list *f, int *huge)
{
    const mha_attention_args *a = &c->args;
    const mha_tensor *t[4] = {&a->q, &a->k, &a->v, &a->out};
    if (c->null_engine || !engine)
        add_fault(f, MHA_ERR_NULL_POINTER, "engine is NULL");
    if (c->null_args)
        add_fault(f, MHA_ERR_NULL_POINTER, "args is NULL");
    for (int i = 0; i < 4; i++) {
        int half_ok = i == T_K || i == T_V;
        int dt = (int)t[i]->dtype;
        if (!t[i]->data)
            add_fault(f, MHA_ERR_NULL_POINTER, "a tensor's data is NULL");
        int quant = dt == MHA_I8 || dt == MHA_FP8_E4M3 || dt == MHA_FP8_E5M2;
        /* q and out: a compute dtype (fp32, fp16, bf16), the same one. */
        if (!(dt == MHA_F32 || dt == MHA_F16 || dt == MHA_BF16 ||
              (half_ok && quant)))
            add_fault(f, MHA_ERR_UNSUPPORTED, "a dtype is not supported");
        if (half_ok && quant && !t[i]->scales.data)
            add_fault(f, MHA_ERR_NULL_POINTER, "quantised K/V without scales");
        if (t[i]->batch <= 0 || t[i]->seq <= 0 || t[i]->heads <= 0 ||
            t[i]->dim <= 0)
            add_fault(f, MHA_ERR_BAD_SHAPE, "a size is not positive");
        else if (t[i]->stride_batch < 0 || t[i]->stride_seq < 0 ||
                 t[i]->stride_head < 0)
            add_fault(f, MHA_ERR_BAD_STRIDE, "a stride is negative");
        else if (tensor_span(t[i]) * (wide)elem_size(t[i]->dtype) >
                 INT64_MAX)
            add_fault(f, MHA_ERR_OVERFLOW, "a tensor spans > 2^63 bytes");
    }
    if (a->q.dtype != a->out.dtype)
        add_fault(f, MHA_ERR_UNSUPPORTED, "q and out differ in dtype");
    const mha_tensor *q = &a->q, *k = &a->k, *v = &a->v, *o = &a->out;
    if (k->batch != q->batch || v->batch != q->batch ||
        o->batch != q->batch || o->seq != q->seq || o->heads != q->heads ||
        v->seq != k->seq || v->heads != k->heads || k->dim != q->dim ||
        o->dim != v->dim)
        add_fault(f, MHA_ERR_BAD_SHAPE, "sizes are inconsistent");
    else if (q->heads > 0 && k->heads > 0 && q->heads % k->heads != 0)
        add_fault(f, MHA_ERR_BAD_SHAPE, "k.heads does not divide q.heads");
    int overlap = self_overlapping(o);
    if (overlap == 1)
        add_fault(f, MHA_ERR_BAD_STRIDE, "out addresses an element twice");
    else if (overlap < 0)
        *huge = 1;
    else if (!nested(o))
        f->may_refuse = MHA_ERR_BAD_STRIDE;
    if (c->alias == 11 || c->alias == 12)
        add_fault(f, MHA_ERR_BAD_STRIDE, "out overlaps an input");
    if (!isfinite(a->scale))
        add_fault(f, MHA_ERR_BAD_ARGUMENT, "scale is not finite");
    const int64_t wdims[4] = {q->batch, q->heads, q->seq, k->seq};
    wide wn = product(wdims, 4);
    if (wn > 0 && wn * 4 > INT64_MAX)
        add_fault(f, MHA_ERR_OVERFLOW, "B*H*Lq*Lk*4 overflows");
    if (c->want_weights && (c->alias == 13 || c->alias == 14))
        add_fault(f, MHA_ERR_BAD_STRIDE, "weights overlap another array");
    mask_faults(&c->mb, &c->mask, q->batch, q->heads, q->seq, k->seq, f,
                huge);
    if (mask_aliased(c->alias, &c->mb))
        add_fault(f, MHA_ERR_BAD_MASK, "a mask array overlaps out");

    /* Sizes the budgets allow. */
    for (int i = 0; i < 4; i++) {
        wide span = tensor_span(t[i]);
        if (span > MAX_ELEMS)
            *huge = 1;
        const int64_t dims[4] = {t[i]->batch, t[i]->seq, t[i]->heads,
                                 t[i]->dim};
        if (product(dims, 4) > MAX_LOGICAL)
            *huge = 1;
    }
    if (wn > 0 && c->want_weights && wn > MAX_ELEMS)
        *huge = 1;
    const wide dims_qo = (wide)q->dim + o->dim;
    const int64_t work[5] = {q->batch, q->heads, q->seq, k->seq,
                             dims_qo > INT64_MAX ? INT64_MAX
                                                 : (int64_t)dims_qo};
    if (product(work, 5) > MAX_WORK)
        *huge = 1;
}

int64_t eff_kdim(const mha_layer_desc *d)
{
    return d->kdim ? d->kdim : d->embed_dim;
}

int64_t eff_vdim(const mha_layer_desc *d)
{
    return d->vdim ? d->vdim : d->embed_dim;
}

/* Faults of mha_layer_create; *huge when a weight array is beyond the
 * budget. Allocates the descriptor's buffers. */
void layer_create_model(layer_case *c, const mha_engine *engine,
                               fault_list *f, int *huge)
{
    mha_layer_desc *d = &c->desc;
    const int64_t E = d->embed_dim, H = d->num_heads;
    const int64_t kd = eff_kdim(d), vd = eff_vdim(d);
    if (c->null_engine || !engine)
        add_fault(f, MHA_ERR_NULL_POINTER, "engine is NULL");
    if (E <= 0 || H <= 0 || kd <= 0 || vd <= 0)
        add_fault(f, MHA_ERR_BAD_SHAPE, "a layer dimension is not positive");
    else if (E % H != 0)
        add_fault(f, MHA_ERR_BAD_SHAPE, "num_heads does not divide E");
    if (c->null_out_w)
        add_fault(f, MHA_ERR_NULL_POINTER, "out_proj_weight is NULL");
    if (c->form == 2)
        add_fault(f, MHA_ERR_BAD_ARGUMENT, "in_proj and q/k/v weights both");
    if (c->form == 3)
        add_fault(f, MHA_ERR_NULL_POINTER, "k/v_proj_weight are NULL");
    if (c->form == 0 && (kd != E || vd != E))
        add_fault(f, MHA_ERR_BAD_SHAPE, "in_proj_weight with kdim/vdim != E");
    if (E > 0 && kd > 0 && vd > 0) {
        const int64_t bytes[3] = {E, E > kd ? (E > vd ? E : vd)
                                            : (kd > vd ? kd : vd), 12};
        if (product(bytes, 3) > INT64_MAX)
            add_fault(f, MHA_ERR_OVERFLOW, "projection weights overflow");
    }
    const int64_t rows[NDBUF] = {E, E, E, E, 3, E, 1};
    const int64_t cols[NDBUF] = {E, E, kd, vd, E, E, E};
    const int64_t copies[NDBUF] = {3, 1, 1, 1, 1, 1, 1};
    const int used[NDBUF] = {c->form == 0 || c->form == 2, c->form != 0,
                             c->form == 1 || c->form == 2,
                             c->form == 1 || c->form == 2,
                             d->in_proj_bias != NULL, !c->null_out_w,
                             d->out_proj_bias != NULL};
    for (int i = 0; i < NDBUF; i++) {
        const int64_t dims[3] = {copies[i], rows[i], cols[i]};
        wide n = used[i] ? product(dims, 3) : 1;
        buffer_alloc(&c->dbuf[i], alloc_bytes(n, 4, huge), 0);
    }
    /* Weights ~ U(-1, 1) / sqrt(in): projections stay unit-scale. */
    test_rng s;
    rng_seed(&s, c->seed ^ 0x776569676874ull);
    for (int i = 0; i < NDBUF; i++) {
        buffer *b = &c->dbuf[i];
        float scale = (float)(1.0 / sqrt((double)(cols[i] > 0 ? cols[i] : 1)));
        if (i == D_IN_B || i == D_OUT_B)
            scale = 1.0f;
        for (size_t at = 0; at + 4 <= b->bytes; at += 4) {
            float x = rng_uniform(&s) * scale;
            memcpy(b->data + at, &x, 4);
        }
    }
    const float *w[NDBUF];
    for (int i = 0; i < NDBUF; i++)
        w[i] = used[i] ? (const float *)c->dbuf[i].data : NULL;
    d->in_proj_weight = w[D_IN_W];
    d->q_proj_weight = w[D_Q_W];
    d->k_proj_weight = w[D_K_W];
    d->v_proj_weight = w[D_V_W];
    d->in_proj_bias = w[D_IN_B];
    d->out_proj_weight = w[D_OUT_W];
    d->out_proj_bias = w[D_OUT_B];
}

void layer_forward_model(layer_case *c, fault_list *f, int *huge)
{
    const mha_layer_desc *d = &c->desc;
    const int64_t E = d->embed_dim, H = d->num_heads;
    const int64_t kd = eff_kdim(d), vd = eff_vdim(d);
    const int64_t B = c->B, Lq = c->Lq, Lk = c->Lk;
    if (c->null_layer)
        add_fault(f, MHA_ERR_NULL_POINTER, "layer is NULL");
    for (int i = 0; i < 4; i++)
        if (c->null_in[i])
            add_fault(f, MHA_ERR_NULL_POINTER, "a forward pointer is NULL");
    if (B <= 0 || Lq <= 0 || Lk <= 0)
        add_fault(f, MHA_ERR_BAD_SHAPE, "B, Lq or Lk is not positive");
    const int64_t qd[3] = {B, Lq, E}, kdims[3] = {B, Lk, kd},
                  vdims[3] = {B, Lk, vd}, wd[4] = {B, H, Lq, Lk};
    wide nq = product(qd, 3), nk = product(kdims, 3), nv = product(vdims, 3);
    wide nw = product(wd, 4);
    if (nq * 4 > INT64_MAX || nk * 4 > INT64_MAX || nv * 4 > INT64_MAX)
        add_fault(f, MHA_ERR_OVERFLOW, "an input spans > 2^63 bytes");
    if (c->want_weights && nw * 4 > INT64_MAX)
        add_fault(f, MHA_ERR_OVERFLOW, "B*H*Lq*Lk*4 overflows");
    if (c->alias == 11 || c->alias == 12)
        add_fault(f, MHA_ERR_BAD_STRIDE, "out overlaps an input");
    if (c->want_weights && (c->alias == 13 || c->alias == 14))
        add_fault(f, MHA_ERR_BAD_STRIDE, "weights overlap another array");
    mask_faults(&c->mb, &c->mask, B, H, Lq, Lk, f, huge);
    if (mask_aliased(c->alias, &c->mb))
        add_fault(f, MHA_ERR_BAD_MASK, "a mask array overlaps out");
    if (nq > MAX_ELEMS || nk > MAX_ELEMS || nv > MAX_ELEMS ||
        (c->want_weights && nw > MAX_ELEMS))
        *huge = 1;
    /* The sum in 128 bits: a fuzzed Lk or kdim may be near INT64_MAX. */
    const wide widths = (wide)E + kd + vd + Lk;
    const int64_t work[4] = {B, Lq > Lk ? Lq : Lk, E,
                             widths > INT64_MAX ? INT64_MAX : (int64_t)widths};
    if (product(work, 4) > MAX_WORK)
        *huge = 1;
}
