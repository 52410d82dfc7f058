/* The fuzz target, input decoding: the bytes of a request become sizes,
 * layouts, masks, scales, specials and corruptions (byte codes in
 * encoding.h). */
#include <math.h>
#include <string.h>

#include "fuzz.h"

unsigned take8(byte_reader *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

uint32_t take32(byte_reader *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)take8(in) << (8 * i);
    return v;
}

uint64_t take64(byte_reader *in)
{
    uint64_t lo = take32(in);
    uint64_t hi = take32(in);
    return lo | hi << 32;
}

/* Sizes, strides and other int64 fields the fuzzer overwrites: boundary
 * values, small numbers, or 8 raw bytes. */
int64_t take_wild(byte_reader *in)
{
    unsigned c = take8(in);
    return c >= WILD_RAW ? (int64_t)take64(in) : wild_of_code(c);
}

/* How many fields to overwrite: none for bytes below 160, else 1 to 4;
 * each then takes a target byte and take_wild's bytes. */
unsigned take_corruption_count(byte_reader *in)
{
    unsigned n = take8(in);
    return n < 160 ? 0 : 1 + (n - 160) % 4;
}

void parse_mask(byte_reader *in, mask_request *r)
{
    r->present = take8(in);
    r->causal = take8(in);
    r->keep_mode = take8(in);
    r->keep_pad = take8(in);
    r->keep_density = take8(in);
    r->bias_mode = take8(in);
    r->bias_pad = take8(in);
    r->bias_ninf = take8(in);
    r->bias_scale = take8(in);
    r->len_mode = take8(in);
    r->len_bad = take8(in);
}

/* Strides of a [B, H, Lq, Lk] mask array: packed, padded, the usual
 * broadcasts, arbitrary small strides, or one negative stride. */
void mask_strides(unsigned mode, unsigned pad, int64_t H, int64_t Lq,
                         int64_t Lk, int64_t s[3])
{
    int64_t sq = Lk, sh = Lq * Lk, sb = H * Lq * Lk;
    switch (mode % 8) {
    case 1:
        sq = Lk + pad % 5;
        sh = Lq * sq + pad / 5 % 7;
        sb = H * sh + pad % 3;
        break;
    case 2: sb = Lk, sh = 0, sq = 0; break; /* [B, 1, 1, Lk] */
    case 3: sb = 0, sh = 0; break;          /* [1, 1, Lq, Lk] */
    case 4: sh = 0, sb = Lq * Lk; break;    /* [B, 1, Lq, Lk] */
    case 5: sq = pad % 16, sh = pad / 16, sb = pad * 7 % 23; break;
    case 6:
        sq = -(int64_t)(1 + pad % 4);
        if (pad & 16)
            sb = -1;
        break;
    case 7: sb = sh = sq = 0; break; /* one row for everything */
    }
    s[0] = sb, s[1] = sh, s[2] = sq;
}

void build_mask(const mask_request *r, int64_t H, int64_t Lq,
                       int64_t Lk, mha_mask *m)
{
    memset(m, 0, sizeof *m);
    m->causal = causal_of(r->causal);
    int64_t s[3];
    mask_strides(r->keep_mode, r->keep_pad, H, Lq, Lk, s);
    m->keep_stride_batch = s[0], m->keep_stride_head = s[1];
    m->keep_stride_query = s[2];
    mask_strides(r->bias_mode, r->bias_pad, H, Lq, Lk, s);
    m->bias_stride_batch = s[0], m->bias_stride_head = s[1];
    m->bias_stride_query = s[2];
}

/* Bits 0-3 of the presence byte: a mask at all, keep, bias, lengths. */
void mask_presence(const mask_request *r, mask_buffers *mb)
{
    mb->use = r->present & 1;
    mb->keep = (r->present >> 1) & 1;
    mb->bias = (r->present >> 2) & 1;
    mb->lengths = (r->present >> 3) & 1;
}

void parse_specials(byte_reader *in, special_request *r)
{
    r->count = take8(in) % 9;
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            r->at[i][j] = (uint8_t)take8(in);
}

/* Strides for a tensor from 4 bytes: packed BSHD or BHSD, padded, zero
 * (broadcast) on chosen axes, arbitrary, one negative, or seq and head
 * sharing a stride. */
void layout_strides(byte_reader *in, mha_tensor *t)
{
    unsigned mode = take8(in) % 8, a = take8(in), b = take8(in),
             c = take8(in);
    int64_t S = t->seq, H = t->heads, D = t->dim;
    int64_t pr = 0, pm = 0, pb = 0;
    if (mode == 2 || mode == 3)
        pr = a % 8, pm = b % 8, pb = c % 8;
    if (mode == 1 || mode == 3) {
        t->stride_seq = D + pr;
        t->stride_head = S * t->stride_seq + pm;
        t->stride_batch = H * t->stride_head + pb;
    } else {
        t->stride_head = D + pr;
        t->stride_seq = H * t->stride_head + pm;
        t->stride_batch = S * t->stride_seq + pb;
    }
    switch (mode) {
    case 4:
        if (a & 1)
            t->stride_batch = 0;
        if (a & 2)
            t->stride_seq = 0;
        if (a & 4)
            t->stride_head = 0;
        break;
    case 5: t->stride_batch = a, t->stride_seq = b, t->stride_head = c; break;
    case 6: {
        int64_t neg = -(int64_t)(1 + b);
        if (a % 3 == 0)
            t->stride_batch = neg;
        else if (a % 3 == 1)
            t->stride_seq = neg;
        else
            t->stride_head = neg;
        break;
    }
    case 7: t->stride_seq = t->stride_head = D; break;
    default: break;
    }
}

/* Bytes: class, parameter, 4 raw bytes. Classes: 0 (the default), unit
 * scales up to 2/sqrt(d), -0, NaN, infinities, extreme finite values, raw
 * bits. */
float take_scale(byte_reader *in, int64_t d)
{
    unsigned cls = take8(in) % 12, p = take8(in);
    uint32_t raw = take32(in);
    static const float extreme[] = {1e-40f, 1e-20f, 1e3f,    1e20f,
                                    FLT_MAX, -FLT_MAX, FLT_MIN, 1e30f};
    float f;
    switch (cls) {
    case 0: case 1: case 2: return 0.0f;
    case 3: case 4: case 5: case 6:
        return (float)((p & 128 ? -1.0 : 1.0) * (1 + p % 8) / 4.0 /
                       sqrt((double)d));
    case 7: return -0.0f;
    case 8: return p & 1 ? NAN : -NAN;
    case 9: return p & 1 ? INFINITY : -INFINITY;
    case 10: return extreme[p % 8];
    default: memcpy(&f, &raw, 4); return f;
    }
}

void corrupt_attention(byte_reader *in, attention_case *c)
{
    unsigned n = take_corruption_count(in);
    for (unsigned i = 0; i < n; i++) {
        unsigned target = take8(in) % 40;
        int64_t v = take_wild(in);
        if (target < 32) {
            mha_tensor *t = target / 8 == 0   ? &c->args.q
                            : target / 8 == 1 ? &c->args.k
                            : target / 8 == 2 ? &c->args.v
                                              : &c->args.out;
            int64_t *fields[7] = {&t->batch, &t->seq, &t->heads, &t->dim,
                                  &t->stride_batch, &t->stride_seq,
                                  &t->stride_head};
            if (target % 8 < 7)
                *fields[target % 8] = v;
            else if (v & 1)
                t->data = NULL; /* marked; never given a buffer */
            else
                t->dtype = (mha_dtype)(int)(v >> 1);
        } else if (target < 35) {
            int64_t *s[3] = {&c->mask.keep_stride_batch,
                             &c->mask.keep_stride_head,
                             &c->mask.keep_stride_query};
            *s[target - 32] = v;
        } else if (target < 38) {
            int64_t *s[3] = {&c->mask.bias_stride_batch,
                             &c->mask.bias_stride_head,
                             &c->mask.bias_stride_query};
            *s[target - 35] = v;
        } else if (target == 38) {
            c->null_args = 1;
        } else {
            c->null_engine = 1;
        }
    }
}

void corrupt_layer(byte_reader *in, layer_case *c)
{
    unsigned n = take_corruption_count(in);
    for (unsigned i = 0; i < n; i++) {
        unsigned target = take8(in) % 19;
        int64_t v = take_wild(in);
        int64_t *field[7] = {&c->desc.embed_dim, &c->desc.num_heads,
                             &c->desc.kdim, &c->desc.vdim, &c->B, &c->Lq,
                             &c->Lk};
        int64_t *mstride[6] = {
            &c->mask.keep_stride_batch, &c->mask.keep_stride_head,
            &c->mask.keep_stride_query, &c->mask.bias_stride_batch,
            &c->mask.bias_stride_head,  &c->mask.bias_stride_query};
        if (target < 7)
            *field[target] = v;
        else if (target < 11)
            c->null_in[target - 7] = 1;
        else if (target == 11)
            c->null_layer = 1;
        else if (target < 18)
            *mstride[target - 12] = v;
        else
            c->null_engine = 1;
    }
}

/* Strides of the scales of an 8-bit K/V cache over [batch, S, H] (blocks,
 * slots, heads for a pool) from a KS_* code (encoding.h). 0 for KS_NONE
 * (no scales; strides 0), else 1. */
int kv_scale_strides(unsigned code, int64_t S, int64_t H, int64_t st[3])
{
    int64_t p = (code >> 3) & 3, sb = S * H, ss = H, sh = 1;
    switch (code & 7) {
    case KS_ROW_BHS: sb = H * S, ss = 1, sh = S; break;
    case KS_ROW_PADDED: sh = 1, ss = H + p, sb = S * (H + p) + p; break;
    case KS_HEAD: sb = ss = 0; break;
    case KS_TENSOR: {
        static const int64_t shapes[4][3] = {{0, 0, 0}, {1, 0, 0},
                                             {-1, 1, 1}, {0, 1, 0}};
        sb = shapes[p][0] < 0 ? H : shapes[p][0];
        ss = shapes[p][1], sh = shapes[p][2];
        break;
    }
    case KS_TOKEN: sb = S + p, ss = 1, sh = 0; break;
    case KS_NEGATIVE: {
        int64_t *axis[3] = {&sb, &ss, &sh};
        *axis[p % 3] = -(1 + p);
        break;
    }
    case KS_NONE: sb = ss = sh = 0; break;
    default: break; /* KS_ROW_BSH */
    }
    st[0] = sb, st[1] = ss, st[2] = sh;
    return (code & 7) != KS_NONE;
}
