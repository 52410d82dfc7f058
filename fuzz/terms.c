/* The fuzz target, score terms, lse and 8-bit K/V scales of the attention
 * case (terms.h): decoding, the validity model of engine/validate.c's
 * check_terms and check_scales, the buffers, and the position rules the
 * oracle's key classes need. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "oracle.h"
#include "terms.h"

static const int64_t FAR = INT64_MAX / 4; /* positions stay below 2^61 */

static int64_t clamp64(wide x)
{
    return x > INT64_MAX ? INT64_MAX : x < INT64_MIN ? INT64_MIN : (int64_t)x;
}

static int64_t extent_of(unsigned code)
{
    switch (code) {
    case EXT_MINUS2: return -2;
    case EXT_INT64_MIN: return INT64_MIN;
    case EXT_MINUS100: return -100;
    case EXT_2_40: return (int64_t)1 << 40;
    case EXT_INT64_MAX: return INT64_MAX;
    default: return code < EXT_UNBOUNDED ? (int64_t)code : -1;
    }
}

static float softcap_of(unsigned code)
{
    static const float v[16] = {0.0f,    0.5f,      1.0f,     5.0f,
                                20.0f,   50.0f,     1e-30f,   1e30f,
                                FLT_MIN, 1e-40f,    FLT_MAX,  NAN,
                                INFINITY, -1.0f,    -0.0f,    -INFINITY};
    return v[code % 16];
}

static int64_t offset_of(unsigned code)
{
    switch (code) {
    case OFF_1000: return 1000;
    case OFF_2_40: return (int64_t)1 << 40;
    case OFF_FAR: return FAR;
    case OFF_PAST_FAR: return FAR + 1;
    case OFF_MINUS1: return -1;
    case OFF_INT64_MIN: return INT64_MIN;
    default: return code < OFF_1000 ? (int64_t)code : (int64_t)code - OFF_SMALL;
    }
}

/* key_total from key_offset and Lk (the call's, maybe corrupted). */
static int64_t total_of(unsigned code, int64_t koff, int64_t lk)
{
    wide end = (wide)koff + lk;
    switch (code) {
    case TOT_DEFAULT: return 0;
    case TOT_SHORT: return clamp64(end - 1);
    case TOT_ONE: return 1;
    case TOT_MINUS1: return -1;
    case TOT_FAR: return FAR;
    case TOT_PAST_FAR: return FAR + 1;
    case TOT_INT64_MAX: return INT64_MAX;
    default:
        return clamp64(code < TOT_SHORT ? end + code - 1
                                        : end + 7 * (wide)(code - TOT_WIDE));
    }
}

static int is_quant(mha_dtype t)
{
    return t == MHA_I8 || t == MHA_FP8_E4M3 || t == MHA_FP8_E5M2;
}

static int is_float(mha_dtype t)
{
    return t == MHA_F32 || t == MHA_F16 || t == MHA_BF16;
}

/* Scale strides over [B, S, H] from the layout code; sizes may be
 * corrupted, so the products saturate. */
static void scale_strides(unsigned code, const mha_tensor *t, mha_scales *sc)
{
    const wide S = t->seq, H = t->heads;
    const int64_t p = (code >> 3) & 3;
    int64_t sb = 0, ss = 0, sh = 0;
    switch (code & 7) {
    case SC_HEAD: sh = 1; break;
    case SC_ROW_BHS: sb = clamp64(H * S), ss = 1, sh = clamp64(S); break;
    case SC_ROW_PADDED:
        sh = 1, ss = clamp64(H + p), sb = clamp64(S * (H + p) + p);
        break;
    case SC_BATCH: sb = 1; break;
    case SC_ROW_BSH:
    case SC_NEGATIVE: sb = clamp64(S * H), ss = clamp64(H), sh = 1; break;
    default: break; /* SC_TENSOR: one scale */
    }
    if ((code & 7) == SC_NEGATIVE) {
        int64_t *axis[3] = {&sb, &ss, &sh};
        *axis[p % 3] = -(1 + p);
    }
    sc->stride_batch = sb, sc->stride_seq = ss, sc->stride_head = sh;
}

/* Bytes after the corruptions (encoding.h): 14, all optional. */
void parse_terms(byte_reader *in, terms_case *tc, attention_case *c)
{
    memset(tc, 0, sizeof *tc);
    terms_request *r = &tc->r;
    unsigned *b[14] = {&r->flags, &r->odd, &r->wl, &r->wr, &r->softcap,
                       &r->alibi, &r->alibi_at, &r->sinks, &r->sinks_at,
                       &r->koff, &r->ktotal, &r->scale[0], &r->scale[1],
                       &r->scale_at};
    for (int i = 0; i < 14; i++)
        *b[i] = take8(in);
    tc->use_terms = r->flags & TF_TERMS;
    tc->want_lse = (r->flags & TF_LSE) != 0;
    mha_score_terms *t = &tc->terms;
    t->window = (r->flags & TF_WINDOW) != 0;
    /* Extents are validated with the window off too. */
    t->window_left = extent_of(r->wl);
    t->window_right = extent_of(r->wr);
    t->align = r->flags & TF_TOP_LEFT ? MHA_ALIGN_TOP_LEFT
                                      : MHA_ALIGN_BOTTOM_RIGHT;
    switch (r->odd % 8) {
    case TO_WINDOW_2: t->window = 2; break;
    case TO_WINDOW_NEG: t->window = -1; break;
    case TO_ALIGN_2: t->align = (mha_align)2; break;
    case TO_ALIGN_NEG: t->align = (mha_align)-1; break;
    default: break;
    }
    if (r->flags & TF_SOFTCAP)
        t->softcap = softcap_of(r->softcap);
    /* Arrays hold a marker until terms_link gives them a buffer. */
    const float *marker = (const float *)tc;
    if (r->flags & TF_ALIBI) {
        t->alibi_slopes = marker;
        int64_t H = c->args.q.heads, p = (r->alibi >> 2) & 7;
        switch (r->alibi & 3) {
        case AL_BROADCAST: t->alibi_stride_batch = 0; break;
        case AL_PACKED: t->alibi_stride_batch = H; break;
        case AL_PADDED: t->alibi_stride_batch = clamp64((wide)H + p); break;
        default: t->alibi_stride_batch = -(1 + p); break;
        }
    }
    if (r->flags & TF_SINKS)
        t->sinks = marker;
    if (r->flags & TF_SHARD) {
        t->key_offset = offset_of(r->koff);
        t->key_total = total_of(r->ktotal, t->key_offset, c->args.k.seq);
    }
    mha_tensor *kv[2] = {&c->args.k, &c->args.v};
    for (int i = 0; i < 2; i++) {
        unsigned code = r->scale[i];
        int quant = is_quant(kv[i]->dtype);
        /* A float K/V with scales is refused; rare, it needs param 3. */
        if ((code & 7) == SC_NONE ||
            !(quant || (is_float(kv[i]->dtype) && ((code >> 3) & 3) == 3)))
            continue;
        tc->scaled[i] = 1;
        kv[i]->scales.data = marker;
        scale_strides(code, kv[i], &kv[i]->scales);
    }
}

/* Rows of a [B, S, H] scale array the library reads: an axis of stride 0
 * is one row. */
static wide scale_reads(const mha_tensor *t)
{
    const mha_scales *sc = &t->scales;
    const int64_t n[3] = {sc->stride_batch ? t->batch : 1,
                          sc->stride_seq ? t->seq : 1,
                          sc->stride_head ? t->heads : 1};
    return product(n, 3);
}

static wide scale_span(const mha_tensor *t)
{
    const int64_t size[3] = {t->batch, t->seq, t->heads};
    const int64_t stride[3] = {t->scales.stride_batch, t->scales.stride_seq,
                               t->scales.stride_head};
    return span_elems(size, stride, 3);
}

/* Elements of the [B, H] slopes with row stride s; -1 when nothing is
 * read (a size not positive, a negative stride). */
static wide alibi_span(const mha_score_terms *t, int64_t B, int64_t H)
{
    const int64_t size[2] = {B, H}, stride[2] = {t->alibi_stride_batch, 1};
    return span_elems(size, stride, 2);
}

/* The faults the bytes alone decide (the values come in terms_link), and
 * the arrays too large to hand over (then the input is skipped: the
 * library reads every scale, slope and sink while validating). */
void terms_model(terms_case *tc, const attention_case *c, fault_list *f,
                 int *huge)
{
    const mha_attention_args *a = &c->args;
    const int64_t B = a->q.batch, H = a->q.heads, Lq = a->q.seq;
    const mha_tensor *kv[2] = {&a->k, &a->v};
    for (int i = 0; i < 2; i++) {
        if (!tc->scaled[i])
            continue;
        const mha_tensor *t = kv[i];
        const mha_scales *sc = &t->scales;
        if (!is_quant(t->dtype))
            add_fault(f, MHA_ERR_UNSUPPORTED, "a float K/V has scales");
        else if (sc->stride_batch < 0 || sc->stride_seq < 0 ||
                 sc->stride_head < 0)
            add_fault(f, MHA_ERR_BAD_STRIDE, "a scale stride is negative");
        wide span = scale_span(t);
        if (span > MAX_ELEMS || scale_reads(t) > MAX_LOGICAL)
            tc->unreadable = 1;
    }
    if (tc->want_lse) {
        const int64_t n[3] = {B, H, Lq};
        alloc_bytes(product(n, 3), 4, huge);
    }
    if (!tc->use_terms)
        return;
    const mha_score_terms *t = &tc->terms;
    if (t->window != 0 && t->window != 1)
        add_fault(f, MHA_ERR_BAD_MASK, "terms.window is not 0 or 1");
    if (t->window_left < -1 || t->window_right < -1)
        add_fault(f, MHA_ERR_BAD_MASK, "a window extent is below -1");
    if (t->align != MHA_ALIGN_BOTTOM_RIGHT && t->align != MHA_ALIGN_TOP_LEFT)
        add_fault(f, MHA_ERR_BAD_ARGUMENT, "terms.align is not an mha_align");
    if (!isfinite(t->softcap) || t->softcap < 0.0f)
        add_fault(f, MHA_ERR_BAD_ARGUMENT, "softcap negative or not finite");
    else if (t->softcap > 0.0f && t->softcap < FLT_MIN)
        add_fault(f, MHA_ERR_BAD_ARGUMENT, "softcap subnormal");
    if (t->key_offset < 0 || t->key_offset > FAR)
        add_fault(f, MHA_ERR_BAD_ARGUMENT, "key_offset outside [0, 2^61)");
    if (t->key_total != 0 &&
        ((wide)t->key_total < (wide)t->key_offset + a->k.seq ||
         t->key_total > FAR))
        add_fault(f, MHA_ERR_BAD_ARGUMENT,
                  "key_total below key_offset + Lk or past 2^61");
    if (t->alibi_slopes) {
        if (t->alibi_stride_batch < 0)
            add_fault(f, MHA_ERR_BAD_ARGUMENT, "alibi_stride_batch < 0");
        const int64_t n[2] = {B, H};
        if (alibi_span(t, B, H) > MAX_ELEMS || product(n, 2) > MAX_LOGICAL)
            tc->unreadable = 1;
    }
    if (t->sinks && H > MAX_ELEMS)
        tc->unreadable = 1;
}

/* Unit-scale values of each kind: scales near 1 / the largest code (so
 * dequantised values are near [-1, 1]; some negative), slopes as ALiBi's
 * or random, sinks near the scores. */
static float scale_value(mha_dtype dt, unsigned cls, unsigned at,
                         test_rng *s)
{
    static const float extreme[5] = {1e-30f, 1e30f, FLT_MIN, 1e-40f,
                                     FLT_MAX};
    if (cls == SCV_EXTREME)
        return extreme[at % 5];
    double top = dt == MHA_I8 ? 127.0 : dt == MHA_FP8_E4M3 ? 448.0 : 57344.0;
    uint64_t x = rng_next(s);
    double sign = (x & 7) == 0 ? -1.0 : 1.0;
    return (float)(sign * (1.0 + rng_uniform(s) * 0.5) / top);
}

static float bad_value(unsigned kind)
{
    return kind == 0 ? 0.0f : kind == 1 ? NAN : kind == 2 ? INFINITY
                                                          : -INFINITY;
}

static void put_float(buffer *b, int64_t at, float x)
{
    if (at >= 0 && (size_t)(at + 1) * 4 <= b->bytes)
        memcpy(b->data + at * 4, &x, 4);
}

static float get_float(const buffer *b, int64_t at)
{
    float x;
    memcpy(&x, b->data + at * 4, 4);
    return x;
}

int64_t scale_rows(const mha_tensor *t)
{
    const mha_scales *sc = &t->scales;
    return (sc->stride_batch ? t->batch : 1) * (sc->stride_seq ? t->seq : 1) *
           (sc->stride_head ? t->heads : 1);
}

int64_t scale_row_at(const mha_tensor *t, int64_t r)
{
    const mha_scales *sc = &t->scales;
    int64_t nh = sc->stride_head ? t->heads : 1,
            ns = sc->stride_seq ? t->seq : 1;
    return r / (ns * nh) * sc->stride_batch + r / nh % ns * sc->stride_seq +
           r % nh * sc->stride_head;
}

/* One quantised tensor's scales: filled, one bad value by the class,
 * linked, and its faults (every row the library reads is checked, as
 * check_scales does). */
static void link_scales(terms_case *tc, int i, mha_tensor *t, test_rng *s,
                        fault_list *f)
{
    buffer *b = &tc->buf[TB_KSCALE + i];
    wide span = tc->scaled[i] ? scale_span(t) : -1;
    buffer_alloc(b, span > 0 ? (size_t)span * 4 : 4, 0);
    unsigned cls = tc->r.scale[i] >> 5;
    for (size_t at = 0; at + 4 <= b->bytes; at += 4)
        put_float(b, (int64_t)(at / 4), scale_value(t->dtype, cls,
                                                     tc->r.scale_at, s));
    if (!tc->scaled[i])
        return;
    t->scales.data = (const float *)b->data;
    if (span <= 0 || !is_quant(t->dtype))
        return;
    const mha_scales *sc = &t->scales;
    if (cls >= SCV_ZERO) {
        /* Any logical row is read (a 0 stride reads its row 0). */
        unsigned at = tc->r.scale_at;
        int64_t bb = (int64_t)(at % (uint64_t)t->batch);
        int64_t sq = (int64_t)((at * 31u + (unsigned)i) % (uint64_t)t->seq);
        int64_t h = (int64_t)((at / 3u + (unsigned)i) % (uint64_t)t->heads);
        put_float(b, bb * sc->stride_batch + sq * sc->stride_seq +
                         h * sc->stride_head,
                  bad_value(cls == SCV_ZERO ? 0 : cls == SCV_NAN ? 1 : 2));
    }
    for (int64_t r = 0, n = scale_rows(t); r < n; r++) {
        float x = get_float(b, scale_row_at(t, r));
        if (!isfinite(x) || x == 0.0f) {
            add_fault(f, MHA_ERR_BAD_ARGUMENT, "a scale is zero or not finite");
            return;
        }
    }
}

/* Allocates, fills and links the arrays, then the faults of their
 * values. */
void terms_link(terms_case *tc, attention_case *c, fault_list *f)
{
    mha_attention_args *a = &c->args;
    const int64_t B = a->q.batch, H = a->q.heads, Lq = a->q.seq;
    test_rng s;
    rng_seed(&s, c->seed ^ 0x7465726d73ull);
    link_scales(tc, 0, &a->k, &s, f);
    link_scales(tc, 1, &a->v, &s, f);

    mha_score_terms *t = &tc->terms;
    const terms_request *r = &tc->r;
    buffer *al = &tc->buf[TB_ALIBI], *sk = &tc->buf[TB_SINKS];
    /* Slopes and sinks go to the library only with the terms: without
     * them terms_model never bounded their span, so nothing is sized by
     * it (a padded stride from the bytes asked malloc for 8 GiB). */
    wide aspan = tc->use_terms && t->alibi_slopes ? alibi_span(t, B, H) : -1;
    buffer_alloc(al, aspan > 0 ? (size_t)aspan * 4 : 4, 0);
    unsigned acls = r->alibi >> 5;
    for (int64_t at = 0; (size_t)at * 4 < al->bytes; at++) {
        int64_t h = H > 0 ? at % H : 0;
        float x = acls == AV_RANDOM  ? rng_uniform(&s)
                  : acls == AV_LARGE ? 1e3f * rng_uniform(&s)
                  : acls == AV_TINY  ? 1e-30f
                                     : exp2f(-8.0f * (float)(h + 1) /
                                             (float)(H > 0 ? H : 1));
        put_float(al, at, x);
    }
    if (aspan > 0 && (acls == AV_NAN || acls == AV_INF)) {
        int64_t n = B * H, at = (int64_t)(r->alibi_at % (uint64_t)n);
        put_float(al, at / H * t->alibi_stride_batch + at % H,
                  bad_value(acls == AV_NAN ? 1 : 2 + (r->alibi_at & 1)));
    }
    const int has_sinks = tc->use_terms && t->sinks && H > 0;
    buffer_alloc(sk, has_sinks ? (size_t)H * 4 : 4, 0);
    unsigned scls = r->sinks % 8;
    static const float fixed[4] = {0.0f, 30.0f, -1e30f, 1e30f};
    for (int64_t h = 0; (size_t)h * 4 < sk->bytes; h++)
        put_float(sk, h, scls >= SV_DOMINANT && scls <= SV_HUGE
                             ? fixed[scls]
                             : 4.0f * rng_uniform(&s));
    if (has_sinks && scls >= SV_NAN && scls <= SV_NEG_INF)
        put_float(sk, (int64_t)(r->sinks_at % (uint64_t)H),
                  bad_value(scls - SV_NAN + 1));
    if (t->alibi_slopes)
        t->alibi_slopes = (const float *)al->data;
    if (t->sinks)
        t->sinks = (const float *)sk->data;
    if (tc->use_terms && aspan > 0) {
        int bad = 0;
        for (int64_t bb = 0; bb < B && !bad; bb++)
            for (int64_t h = 0; h < H && !bad; h++)
                bad = !isfinite(t->alibi_slopes[bb * t->alibi_stride_batch +
                                                h]);
        if (bad)
            add_fault(f, MHA_ERR_BAD_ARGUMENT, "an ALiBi slope is not finite");
    }
    if (tc->use_terms && has_sinks)
        for (int64_t h = 0; h < H; h++)
            if (!isfinite(t->sinks[h])) {
                add_fault(f, MHA_ERR_BAD_ARGUMENT, "a sink is not finite");
                break;
            }

    int huge = 0;
    const int64_t n[3] = {B, H, Lq};
    buffer *lse = &tc->buf[TB_LSE];
    buffer_alloc(lse, tc->want_lse ? alloc_bytes(product(n, 3), 4, &huge) : 4,
                 0);
    buffer_fill_sentinel(lse);
    a->lse = tc->want_lse ? (float *)lse->data : NULL;
    a->terms = tc->use_terms ? t : NULL;
}

void terms_snapshot(terms_case *tc)
{
    for (int i = 0; i < NTBUF; i++)
        buffer_snapshot(&tc->buf[i]);
}

/* Scales, slopes and sinks are inputs: never written. lse is an output:
 * untouched when the call failed. */
void terms_check_unchanged(const terms_case *tc, int failed)
{
    for (int i = 0; i < NTBUF; i++)
        REQUIRE_AT((i == TB_LSE && !failed) || buffer_unchanged(&tc->buf[i]),
                   "terms buffer %d written", i);
}

void terms_free(terms_case *tc)
{
    for (int i = 0; i < NTBUF; i++)
        buffer_free(&tc->buf[i]);
}

void terms_describe(const terms_case *tc, const attention_case *c)
{
    const mha_score_terms *t = &tc->terms;
    const mha_scales *ks = &c->args.k.scales, *vs = &c->args.v.scales;
    size_t used = strlen(context);
    snprintf(context + used, sizeof context - used,
             " lse=%d terms=%d{window=%d[%lld,%lld] align=%d softcap=%g "
             "alibi=%d[%lld] sinks=%d shard=%lld/%lld} kscales=%d[%lld,%lld,"
             "%lld] vscales=%d[%lld,%lld,%lld]",
             tc->want_lse, tc->use_terms, t->window,
             (long long)t->window_left, (long long)t->window_right,
             (int)t->align, (double)t->softcap, t->alibi_slopes != NULL,
             (long long)t->alibi_stride_batch, t->sinks != NULL,
             (long long)t->key_offset, (long long)t->key_total, tc->scaled[0],
             (long long)ks->stride_batch, (long long)ks->stride_seq,
             (long long)ks->stride_head, tc->scaled[1],
             (long long)vs->stride_batch, (long long)vs->stride_seq,
             (long long)vs->stride_head);
}

const mha_mask *terms_key_mask(const mha_mask *m, const mha_score_terms *t,
                               mha_mask *tmp)
{
    if (!t || !m || m->causal == MHA_CAUSAL_NONE)
        return m;
    *tmp = *m;
    tmp->causal = MHA_CAUSAL_NONE;
    return tmp;
}

/* Key j sits at key_offset + j of key_total positions: the causal mask
 * and the window compare positions (mha.h), the other masks indices. */
int terms_hidden(const mha_mask *m, const mha_score_terms *t, int64_t i,
                 int64_t j, int64_t Lq, int64_t Lk)
{
    if (!t)
        return 0;
    const int64_t koff = t->key_offset;
    const int64_t total = t->key_total ? t->key_total : koff + Lk;
    if (m && m->causal == MHA_CAUSAL_TOP_LEFT && koff + j > i)
        return 1;
    if (m && m->causal == MHA_CAUSAL_BOTTOM_RIGHT && koff + j > i + total - Lq)
        return 1;
    return oracle_outside_window(t, i, j, Lq, Lk);
}

double terms_alibi_mag(const mha_score_terms *t, int64_t b, int64_t h,
                       int64_t i, int64_t j, int64_t Lq, int64_t Lk)
{
    if (!t || !t->alibi_slopes)
        return 0.0;
    const int64_t koff = t->key_offset;
    const int64_t total = t->key_total ? t->key_total : koff + Lk;
    const int64_t ip = t->align == MHA_ALIGN_TOP_LEFT ? i : i + total - Lq;
    return fabs((double)t->alibi_slopes[b * t->alibi_stride_batch + h] *
                ((double)ip - (double)(koff + j)));
}
