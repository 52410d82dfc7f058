/*
 * libFuzzer target for libmha. Its bytes become one mha_attention call or
 * one layer (mha_layer_create, then mha_layer_forward): sizes (zero,
 * negative, huge), strides (negative, overlapping, broadcast), every mask
 * field, key lengths, scale, ISA, thread count, dtypes, aliased buffers and
 * values holding NaN, infinities and denormals.
 *
 * It traps (__builtin_trap) when the library breaks the contract of mha.h:
 *   - every call returns a known status; a failure leaves a message;
 *   - a call the model below calls invalid fails (with the status of its
 *     fault when all its faults agree on one), and every buffer it was
 *     given is byte-identical afterwards (outputs keep their sentinel);
 *   - a valid call succeeds, leaves its inputs and the bytes around the
 *     output view untouched, and agrees with a double-precision oracle
 *     written here from the formula (no library code): within the project's
 *     tolerances where only finite values reach an element, NaN where a NaN
 *     reaches it, exactly 0 in a row whose keys are all masked.
 * Buffers are sized exactly from the request, so AddressSanitizer sees any
 * access past them. Described sizes may be huge (overflow checks): then the
 * buffer is one element and the call must fail without touching it; a
 * valid request too big for the budgets below is not made.
 *
 * The byte layout is read in order (missing bytes read as 0); the "parse"
 * functions below name each byte, and fuzz/make_seeds.py writes seeds in
 * the same layout.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha.h"

/* The tolerances of tests/util.h (this target builds without Check). */
#define TOL_ATTN_ABS 2e-5
#define TOL_ATTN_REL 1e-5
#define TOL_LAYER_ABS 1e-4
#define TOL_LAYER_REL 1e-4

/* Budgets that keep one input in the millisecond range. */
#define MAX_ELEMS ((int64_t)1 << 16)   /* elements of one buffer */
#define MAX_LOGICAL ((int64_t)1 << 18) /* logical elements of one view */
#define MAX_WORK ((int64_t)1 << 21)    /* multiply-adds of the oracle */

#define SENTINEL_BITS 0x7fa5a5a5u /* outputs start as this NaN pattern */
#define UNIT_ROUNDOFF (FLT_EPSILON / 2)

/* Set to 1 to require that a NaN or infinity in V at a masked key never
 * reaches an output (the kernels compute 0 * v for masked keys inside a
 * key block that has visible ones, so today it may). */
#ifndef STRICT_MASKED_V
#define STRICT_MASKED_V 0
#endif

typedef __int128 wide;
#define WIDE_CAP ((wide)1 << 100) /* saturation of extent arithmetic */

/* ------------------------------------------------------------------ */
/* Reporting                                                           */

static char context[768]; /* the request of the current input */
static char detail[256];  /* the element that broke the contract */
static int verbose = -1;  /* FUZZ_VERBOSE=1: print every request */

/* What the inputs turned into; FUZZ_STATS=1 prints it at exit. */
enum { S_ATTN_OK, S_ATTN_FAULT, S_ATTN_SKIP, S_CREATE_FAULT, S_LAYER_OK,
       S_LAYER_FAULT, S_LAYER_SKIP, S_NAN, S_ZERO_ROW, NSTATS };
static long stats[NSTATS];

static void print_stats(void)
{
    static const char *names[NSTATS] = {
        "attention valid", "attention invalid", "attention too big",
        "layer create invalid", "layer valid", "layer forward invalid",
        "layer too big", "elements that must be NaN",
        "elements of all-masked rows"};
    for (int i = 0; i < NSTATS; i++)
        fprintf(stderr, "%s: %ld\n", names[i], stats[i]);
}

/* The request is complete: print it when asked (to read a crash input). */
static void announce(void)
{
    if (verbose > 0)
        fprintf(stderr, "request: %s\n", context);
}

static void violated(const char *what, int line)
{
    fprintf(stderr,
            "fuzz_attention: contract violated at line %d: %s\n"
            "  %s\n  request: %s\n  mha_last_error: \"%s\"\n",
            line, what, detail, context, mha_last_error());
    __builtin_trap();
}

#define REQUIRE(cond)                     \
    do {                                  \
        if (!(cond))                      \
            violated(#cond, __LINE__);    \
    } while (0)

#define REQUIRE_AT(cond, ...)                                 \
    do {                                                      \
        if (!(cond)) {                                        \
            snprintf(detail, sizeof detail, __VA_ARGS__);     \
            violated(#cond, __LINE__);                        \
        }                                                     \
    } while (0)

/* ------------------------------------------------------------------ */
/* Input bytes and random fill                                         */

typedef struct {
    const uint8_t *p;
    size_t n;
} byte_reader;

static unsigned take8(byte_reader *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static uint32_t take32(byte_reader *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)take8(in) << (8 * i);
    return v;
}

static uint64_t take64(byte_reader *in)
{
    uint64_t lo = take32(in);
    uint64_t hi = take32(in);
    return lo | hi << 32;
}

/* splitmix64 */
static uint64_t next_random(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1) with 24 random bits (exact in a float). */
static float random_unit(uint64_t *s)
{
    return (float)(next_random(s) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

/* Sizes, strides and other int64 fields the fuzzer overwrites: boundary
 * values, small numbers, or 8 raw bytes. */
static int64_t take_wild(byte_reader *in)
{
    static const int64_t table[] = {
        0, -1, 1, 2, -2, 3, 7, 64, 65536, INT32_MAX,
        (int64_t)INT32_MAX + 1, (int64_t)1 << 32, ((int64_t)1 << 32) + 1,
        (int64_t)1 << 40, 3037000500LL, /* ~sqrt(2^63) */
        (int64_t)1 << 61, (int64_t)1 << 62, INT64_MAX / 4 + 1, INT64_MAX,
        INT64_MIN, INT64_MIN + 1, -((int64_t)1 << 40), -65536};
    const unsigned n = sizeof table / sizeof table[0];
    unsigned c = take8(in);
    if (c < n)
        return table[c];
    if (c < 250)
        return (int64_t)(c % 40);
    return (int64_t)take64(in);
}

/* How many fields to overwrite: none for bytes below 160, else 1 to 4;
 * each then takes a target byte and take_wild's bytes. */
static unsigned take_corruption_count(byte_reader *in)
{
    unsigned n = take8(in);
    return n < 160 ? 0 : 1 + (n - 160) % 4;
}

/* Sequence lengths: mostly short, sometimes past the largest key block. */
static int64_t take_seq(byte_reader *in)
{
    unsigned b = take8(in);
    return b < 200 ? 1 + b % 24 : 25 + (int64_t)(b - 200) * 6;
}

/* ------------------------------------------------------------------ */
/* Half precision, decoded here from the bit layouts                   */

static double f16_value(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, -24);
    else
        v = ldexp(1024.0 + m, e - 25);
    return sign ? -v : v;
}

static double bf16_value(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return (double)f;
}

/* A binary16 (rounded toward zero) of a float in (-1, 1). */
static uint16_t f16_of_unit(float x)
{
    uint16_t sign = x < 0 ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a < ldexp(1.0, -14)) /* subnormal: m * 2^-24 */
        return sign | (uint16_t)(a * ldexp(1.0, 24));
    int e;
    double f = frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    uint16_t m = (uint16_t)((f * 2.0 - 1.0) * 1024.0);
    return sign | (uint16_t)((e - 1 + 15) << 10) | m;
}

static uint16_t bf16_of_unit(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return (uint16_t)(bits >> 16);
}

static size_t dtype_bytes(mha_dtype t)
{
    return t == MHA_F16 || t == MHA_BF16 ? 2 : 4;
}

/* ------------------------------------------------------------------ */
/* Buffers: exact size, optional 4-byte misalignment, snapshots        */

typedef struct {
    char *base; /* malloc'd; data is base or base + 4 */
    char *data;
    size_t bytes; /* usable from data */
    char *copy;   /* the bytes before the call */
} buffer;

/* pad: bytes of offset from malloc's alignment (0, 1 or 4). */
static void buffer_alloc(buffer *b, size_t bytes, size_t pad)
{
    b->base = malloc(pad + bytes + (pad + bytes == 0));
    if (!b->base)
        abort();
    b->data = b->base + pad;
    b->bytes = bytes;
    b->copy = NULL;
}

static void buffer_snapshot(buffer *b)
{
    b->copy = malloc(b->bytes + 1);
    if (!b->copy)
        abort();
    memcpy(b->copy, b->data, b->bytes);
}

static int buffer_unchanged(const buffer *b)
{
    return memcmp(b->copy, b->data, b->bytes) == 0;
}

static void buffer_free(buffer *b)
{
    free(b->base);
    free(b->copy);
    memset(b, 0, sizeof *b);
}

static void fill_sentinel(buffer *b)
{
    const uint32_t bits = SENTINEL_BITS;
    for (size_t i = 0; i + 4 <= b->bytes; i += 4)
        memcpy(b->data + i, &bits, 4);
}

static int is_sentinel(const float *x)
{
    uint32_t bits;
    memcpy(&bits, x, sizeof bits);
    return bits == SENTINEL_BITS;
}

/* Elements a view spans, 1 + sum (size_i - 1) * stride_i, saturated at
 * WIDE_CAP; -1 when a size is not positive or a stride negative. */
static wide span_elems(const int64_t *size, const int64_t *stride, int n)
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

static wide tensor_span(const mha_tensor *t)
{
    const int64_t size[4] = {t->batch, t->seq, t->heads, t->dim};
    const int64_t stride[4] = {t->stride_batch, t->stride_seq,
                               t->stride_head, 1};
    return span_elems(size, stride, 4);
}

/* Product of positive factors, saturated; -1 if one is not positive. */
static wide product(const int64_t *f, int n)
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
static size_t alloc_bytes(wide elems, size_t elem, int *huge)
{
    if (elems > MAX_ELEMS) {
        *huge = 1;
        return elem;
    }
    return elems <= 0 ? elem : (size_t)elems * elem;
}

/* ------------------------------------------------------------------ */
/* The validity model: why a request must fail                         */

typedef struct {
    int n;
    mha_status status[24];
    const char *why[24];
    /* A valid request the library may still refuse with this status (an
     * interleaved output layout it cannot prove free of overlap); 0: none. */
    mha_status may_refuse;
} fault_list;

static void add_fault(fault_list *f, mha_status st, const char *why)
{
    if (f->n < 24) {
        f->status[f->n] = st;
        f->why[f->n] = why;
    }
    f->n++;
}

/* The status a failed call must return: the faults' common status, or -1
 * when they disagree (then any failure status will do). */
static int expected_status(const fault_list *f)
{
    int n = f->n < 24 ? f->n : 24;
    for (int i = 1; i < n; i++)
        if (f->status[i] != f->status[0])
            return -1;
    return (int)f->status[0];
}

static void check_status_known(mha_status st)
{
    REQUIRE((unsigned)st <= MHA_ERR_BAD_ARGUMENT);
    REQUIRE(strcmp(mha_status_string(st), "unknown status") != 0);
}

/* huge: some buffers are shorter than described, so the described byte
 * ranges of distinct buffers may overlap and any failure status will do. */
static void check_failure(mha_status st, const fault_list *f, int huge)
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
static int self_overlapping(const mha_tensor *t)
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
static int nested(const mha_tensor *t)
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

/* ------------------------------------------------------------------ */
/* Masks: shared by both entry points                                  */

/* Bytes: presence bits, causal, keep (mode, pad, density), bias (mode,
 * pad, -inf density, magnitude), lengths (mode, bad value). */
typedef struct {
    unsigned present, causal, keep_mode, keep_pad, keep_density;
    unsigned bias_mode, bias_pad, bias_ninf, bias_scale, len_mode, len_bad;
} mask_request;

static void parse_mask(byte_reader *in, mask_request *r)
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

static mha_causal causal_of(unsigned code)
{
    static const int values[] = {0, 0, 0, 1, 1, 2, 2, 3, -1, INT_MAX};
    return (mha_causal)values[code % 10];
}

/* Strides of a [B, H, Lq, Lk] mask array: packed, padded, the usual
 * broadcasts, arbitrary small strides, or one negative stride. */
static void mask_strides(unsigned mode, unsigned pad, int64_t H, int64_t Lq,
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

static void build_mask(const mask_request *r, int64_t H, int64_t Lq,
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

/* Elements the keep or bias array spans over [B, H, Lq, Lk]. */
static wide mask_span(const int64_t st[3], int64_t B, int64_t H, int64_t Lq,
                      int64_t Lk)
{
    const int64_t size[4] = {B, H, Lq, Lk};
    const int64_t stride[4] = {st[0], st[1], st[2], 1};
    return span_elems(size, stride, 4);
}

static void keep_strides(const mha_mask *m, int64_t s[3])
{
    s[0] = m->keep_stride_batch, s[1] = m->keep_stride_head;
    s[2] = m->keep_stride_query;
}

static void bias_strides(const mha_mask *m, int64_t s[3])
{
    s[0] = m->bias_stride_batch, s[1] = m->bias_stride_head;
    s[2] = m->bias_stride_query;
}

/* The mask's buffers (keep, bias, lengths) and their faults. */
typedef struct {
    int use, keep, bias, lengths;
    buffer buf[3];
    int lengths_unreadable; /* B too large to give real lengths */
} mask_buffers;

static void mask_faults(mask_buffers *mb, const mha_mask *m, int64_t B,
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

static void alloc_mask(const mha_mask *m, mask_buffers *mb, int64_t B,
                       int64_t H, int64_t Lq, int64_t Lk, unsigned misalign)
{
    int huge = 0;
    int64_t st[3];
    keep_strides(m, st);
    buffer_alloc(&mb->buf[0],
                 mb->keep ? alloc_bytes(mask_span(st, B, H, Lq, Lk), 1, &huge)
                          : 1,
                 misalign & 1); /* bytes: any address */
    bias_strides(m, st);
    buffer_alloc(&mb->buf[1],
                 mb->bias ? alloc_bytes(mask_span(st, B, H, Lq, Lk), 4, &huge)
                          : 4,
                 misalign & 2 ? 4 : 0);
    buffer_alloc(&mb->buf[2], B > 0 && B <= MAX_ELEMS ? (size_t)B * 4 : 4,
                 misalign & 4 ? 4 : 0);
}

static void fill_mask(const mask_request *r, mask_buffers *mb, int64_t Lk,
                      uint64_t seed)
{
    uint64_t s = seed ^ 0x6b65657000000000ull;
    buffer *keep = &mb->buf[0], *bias = &mb->buf[1], *len = &mb->buf[2];
    for (size_t i = 0; i < keep->bytes; i++) {
        uint64_t x = next_random(&s);
        int masked = r->keep_density == 255 || (x & 255) < r->keep_density;
        keep->data[i] = masked ? 0 : (char)(1 + (x >> 8) % 255);
    }
    static const float magnitude[] = {1.0f, 1.0f, 1.0f, 1000.0f};
    float mag = magnitude[r->bias_scale % 4];
    for (size_t i = 0; i + 4 <= bias->bytes; i += 4) {
        float v = random_unit(&s) * mag;
        unsigned x = (unsigned)next_random(&s) & 255;
        if (r->bias_ninf == 255 || x < r->bias_ninf)
            v = -INFINITY;
        memcpy(bias->data + i, &v, 4);
    }
    size_t nb = len->bytes / 4;
    int64_t top = Lk < INT32_MAX ? Lk : INT32_MAX;
    for (size_t b = 0; b < nb; b++) {
        int64_t v;
        switch (r->len_mode % 8) {
        case 4: v = top; break;
        case 5: v = 0; break;
        case 7: v = top / 2; break;
        default: v = top >= 0 ? (int64_t)(next_random(&s) % (uint64_t)(top + 1)) : 0;
        }
        if (r->len_mode % 8 == 6 && b == (size_t)r->len_bad % nb) {
            const int64_t bad[] = {-1, Lk < INT32_MAX ? Lk + 1 : -1,
                                   INT32_MAX, INT32_MIN};
            v = bad[(r->len_bad >> 4) % 4];
        }
        int32_t v32 = (int32_t)v;
        memcpy(len->data + 4 * b, &v32, 4);
    }
}

static void link_mask(mask_buffers *mb, mha_mask *m)
{
    m->keep = mb->keep ? (const uint8_t *)mb->buf[0].data : NULL;
    m->bias = mb->bias ? (const float *)mb->buf[1].data : NULL;
    m->key_lengths = mb->lengths ? (const int32_t *)mb->buf[2].data : NULL;
}

static void length_faults(const mask_buffers *mb, const mha_mask *m,
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

/* Bits 0-3 of the presence byte: a mask at all, keep, bias, lengths. */
static void mask_presence(const mask_request *r, mask_buffers *mb)
{
    mb->use = r->present & 1;
    mb->keep = (r->present >> 1) & 1;
    mb->bias = (r->present >> 2) & 1;
    mb->lengths = (r->present >> 3) & 1;
}

/* Alias 15 points a mask array (bias, else keep) into the output buffer:
 * an invalid request when the mask has such an array. */
static int mask_aliased(int alias, const mask_buffers *mb)
{
    return alias == 15 && mb->use && (mb->keep || mb->bias);
}

/* The output buffer must hold the aliased mask array's bytes. */
static void grow_for_mask_alias(int alias, const mask_buffers *mb,
                                buffer *out)
{
    if (!mask_aliased(alias, mb))
        return;
    const buffer *m = mb->bias ? &mb->buf[1] : &mb->buf[0];
    if (m->bytes > out->bytes) {
        buffer_free(out);
        buffer_alloc(out, m->bytes, 0);
    }
}

static void alias_mask_into(int alias, const mask_buffers *mb, mha_mask *m,
                            void *out)
{
    if (!mask_aliased(alias, mb))
        return;
    if (mb->bias)
        m->bias = (const float *)out;
    else
        m->keep = (const uint8_t *)out;
}

/* ------------------------------------------------------------------ */
/* Special values injected into inputs                                 */

static const float special_values[] = {
    NAN, -NAN, INFINITY, -INFINITY, 1e-45f, 1e-39f, -1e-41f, -0.0f,
    1e30f, -FLT_MAX, FLT_MAX, 0.0f};
static const uint16_t special_f16[] = {0x7e00, 0xfe00, 0x7c00, 0xfc00,
                                       0x0001, 0x03ff, 0x8001, 0x8000,
                                       0x7bff, 0xfbff, 0x7bff, 0x0000};
static const uint16_t special_bf16[] = {0x7fc0, 0xffc0, 0x7f80, 0xff80,
                                        0x0001, 0x007f, 0x8001, 0x8000,
                                        0x7149, 0xff7f, 0x7f7f, 0x0000};

/* 33 bytes: a count, then 8 injections of 4 bytes each: target (q, k, v
 * or bias; query, key, value or bias for the layer), index (2 bytes), and
 * value class with a run length. */
typedef struct {
    unsigned count;
    uint8_t at[8][4];
} special_request;

static void parse_specials(byte_reader *in, special_request *r)
{
    r->count = take8(in) % 9;
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++)
            r->at[i][j] = (uint8_t)take8(in);
}

/* Writes the requested specials; targets[t] may be NULL (no such input). */
static void inject_specials(const special_request *r,
                            buffer *const targets[4],
                            const mha_dtype dtypes[4])
{
    for (unsigned n = 0; n < r->count; n++) {
        const uint8_t *e = r->at[n];
        buffer *b = targets[e[0] % 4];
        mha_dtype dt = dtypes[e[0] % 4];
        size_t elem = dtype_bytes(dt);
        size_t count = b ? b->bytes / elem : 0;
        if (count == 0)
            continue;
        unsigned index = e[1] | (unsigned)e[2] << 8;
        unsigned run = 1 + ((e[3] >> 4) & 7) * 3, v = (e[3] & 15) % 12;
        const void *value = elem == 4         ? (const void *)&special_values[v]
                            : dt == MHA_F16 ? (const void *)&special_f16[v]
                                            : (const void *)&special_bf16[v];
        for (unsigned i = 0; i < run; i++)
            memcpy(b->data + (index + i) % count * elem, value, elem);
        if (verbose > 0)
            fprintf(stderr, "special: target %u, elements %zu.. (x%u) of "
                    "%zu: class %u\n", e[0] % 4u, index % count, run, count,
                    v);
    }
}

static void fill_values(buffer *b, mha_dtype dtype, uint64_t seed)
{
    uint64_t s = seed;
    size_t elem = dtype_bytes(dtype);
    for (size_t i = 0; i + elem <= b->bytes; i += elem) {
        float x = random_unit(&s);
        if (elem == 4) {
            memcpy(b->data + i, &x, 4);
        } else {
            uint16_t h = dtype == MHA_F16 ? f16_of_unit(x) : bf16_of_unit(x);
            memcpy(b->data + i, &h, 2);
        }
    }
}

/* ------------------------------------------------------------------ */
/* The oracle                                                          */

typedef enum {
    WANT_CLOSE, /* within tolerance (+ slack) of value */
    WANT_ZERO,  /* exactly 0: every key masked */
    WANT_NAN,   /* a NaN reaches it */
    WANT_ANY,   /* an infinity or huge value reaches it: anything written */
    WANT_EXACT  /* exactly value */
} want_kind;

typedef struct {
    double value, slack;
    int kind;
} want;

/* 0: moderate; 1: infinite or beyond 1e30; 2: NaN. */
static int flag_of(double x)
{
    if (isnan(x))
        return 2;
    return isinf(x) || fabs(x) > 1e30 ? 1 : 0;
}

static int flag_of_row(const double *x, int64_t n)
{
    int f = 0;
    for (int64_t i = 0; i < n; i++) {
        int g = flag_of(x[i]);
        f = g > f ? g : f;
    }
    return f;
}

typedef struct {
    int64_t B, Lq, Lk, H, Hkv, d, dv;
    const double *q, *k, *v; /* packed [B, L, heads, dim] */
    const mha_mask *mask;    /* NULL: none (validated otherwise) */
    double scale;
    double mag_unit; /* largest |score| the tolerances are stated for */
    double tol_abs;  /* for |v| <= 1; it grows with larger values */
} oracle_problem;

enum { KEY_HIDDEN, KEY_NEG_INF, KEY_VISIBLE };

/* Key j for query i of (b, h): hidden by causal, lengths or keep; masked
 * by a -inf bias; or visible. *bias receives the additive term. */
static int key_class(const mha_mask *m, int64_t b, int64_t h, int64_t i,
                     int64_t j, int64_t Lq, int64_t Lk, double *bias)
{
    *bias = 0.0;
    if (!m)
        return KEY_VISIBLE;
    if (m->causal == MHA_CAUSAL_TOP_LEFT && j > i)
        return KEY_HIDDEN;
    if (m->causal == MHA_CAUSAL_BOTTOM_RIGHT && j > i + Lk - Lq)
        return KEY_HIDDEN;
    if (m->key_lengths && j >= m->key_lengths[b])
        return KEY_HIDDEN;
    if (m->keep && m->keep[b * m->keep_stride_batch +
                           h * m->keep_stride_head +
                           i * m->keep_stride_query + j] == 0)
        return KEY_HIDDEN;
    if (m->bias) {
        *bias = m->bias[b * m->bias_stride_batch + h * m->bias_stride_head +
                        i * m->bias_stride_query + j];
        if (*bias == -INFINITY)
            return KEY_NEG_INF;
    }
    return KEY_VISIBLE;
}

/* What each output element ([B, Lq, H, dv]) and weight ([B, H, Lq, Lk],
 * when weights is non-NULL) must be. Scores whose magnitude exceeds
 * mag_unit widen the tolerance by the rounding they carry. */
static void oracle(const oracle_problem *p, want *out, want *weights)
{
    const int64_t Lq = p->Lq, Lk = p->Lk, H = p->H, d = p->d, dv = p->dv;
    double *s = malloc((size_t)Lk * sizeof *s);
    int *cls = malloc((size_t)Lk * sizeof *cls);
    if (!s || !cls)
        abort();
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Lq; i++) {
                int64_t hk = h / (H / p->Hkv);
                const double *q = p->q + ((b * Lq + i) * H + h) * d;
                int qflag = flag_of_row(q, d);
                int row_nan = 0, row_may = qflag != 0;
                int64_t nvis = 0, nneg = 0;
                double mag = 0.0, smax = -INFINITY;
                for (int64_t j = 0; j < Lk; j++) {
                    double bj;
                    cls[j] = key_class(p->mask, b, h, i, j, Lq, Lk, &bj);
                    if (cls[j] == KEY_HIDDEN)
                        continue;
                    const double *k = p->k + ((b * Lk + j) * p->Hkv + hk) * d;
                    int kflag = flag_of_row(k, d);
                    int bflag = cls[j] == KEY_VISIBLE ? flag_of(bj) : 0;
                    row_may |= kflag != 0 || bflag != 0;
                    if (cls[j] == KEY_NEG_INF) {
                        nneg++;
                        continue;
                    }
                    nvis++;
                    row_nan |= qflag == 2 || kflag == 2 || bflag == 2;
                    double dot = 0.0, dabs = 0.0;
                    for (int64_t c = 0; c < d; c++) {
                        dot += q[c] * k[c];
                        dabs += fabs(q[c] * k[c]);
                    }
                    s[j] = p->scale * dot + bj;
                    double m = fabs(p->scale) * dabs + fabs(bj);
                    if (!(m <= 1e37)) /* floats cannot hold the scores */
                        row_may = 1;
                    mag = m > mag ? m : mag;
                    smax = s[j] > smax ? s[j] : smax;
                }
                want *orow = out + ((b * Lq + i) * H + h) * dv;
                want *wrow = weights ? weights + ((b * H + h) * Lq + i) * Lk
                                     : NULL;
                if (nvis == 0) {
                    int kind = nneg && row_may ? WANT_ANY : WANT_ZERO;
                    for (int64_t c = 0; c < dv; c++)
                        orow[c] = (want){0.0, 0.0, kind};
                    for (int64_t j = 0; wrow && j < Lk; j++)
                        wrow[j] = (want){0.0, 0.0, kind};
                    continue;
                }
                double l = 0.0, vmax = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    if (cls[j] != KEY_VISIBLE)
                        continue;
                    s[j] = exp(s[j] - smax); /* now the unnormalised p */
                    l += s[j];
                    const double *v = p->v + ((b * Lk + j) * p->Hkv + hk) * dv;
                    for (int64_t c = 0; c < dv; c++)
                        if (flag_of(v[c]) == 0 && fabs(v[c]) > vmax)
                            vmax = fabs(v[c]);
                }
                double excess = mag - p->mag_unit;
                double slack = excess > 0 ? 2.0 * (double)(d + 4) *
                                                UNIT_ROUNDOFF * excess
                                          : 0.0;
                double out_slack = slack * vmax;
                if (vmax > 1.0)
                    out_slack += (vmax - 1.0) * p->tol_abs;
                for (int64_t c = 0; c < dv; c++) {
                    int col_nan = 0, col_may = 0;
                    double acc = 0.0;
                    for (int64_t j = 0; j < Lk; j++) {
                        double v = p->v[((b * Lk + j) * p->Hkv + hk) * dv + c];
                        int vflag = flag_of(v);
                        if (cls[j] == KEY_VISIBLE) {
                            col_nan |= vflag == 2;
                            acc += s[j] * v;
                        }
                        if (cls[j] == KEY_VISIBLE || !STRICT_MASKED_V)
                            col_may |= vflag != 0;
                    }
                    /* An infinite score row may look fully masked and
                     * drop V's NaN: row_may outranks col_nan. */
                    int kind = row_nan   ? WANT_NAN
                               : row_may ? WANT_ANY
                               : col_nan ? WANT_NAN
                               : col_may ? WANT_ANY
                                         : WANT_CLOSE;
                    orow[c] = (want){acc / l, out_slack, kind};
                }
                for (int64_t j = 0; wrow && j < Lk; j++) {
                    if (cls[j] != KEY_VISIBLE)
                        wrow[j] = (want){0.0, 0.0,
                                         row_nan || row_may ? WANT_ANY
                                                            : WANT_ZERO};
                    else
                        wrow[j] = (want){s[j] / l, slack,
                                         row_nan   ? WANT_NAN
                                         : row_may ? WANT_ANY
                                                   : WANT_CLOSE};
                }
            }
    free(s);
    free(cls);
}

static void check_value(const want *w, const float *at, double tol_abs,
                        double tol_rel, const char *what, long long index)
{
    stats[S_NAN] += w->kind == WANT_NAN;
    stats[S_ZERO_ROW] += w->kind == WANT_ZERO;
    REQUIRE_AT(!is_sentinel(at), "%s[%lld] was not written", what, index);
    double got = (double)*at;
    switch (w->kind) {
    case WANT_ZERO:
        REQUIRE_AT(got == 0.0, "%s[%lld] = %.9g, want exactly 0 (all keys "
                   "masked)", what, index, got);
        break;
    case WANT_NAN:
        REQUIRE_AT(isnan(got), "%s[%lld] = %.9g, want NaN (a NaN reaches "
                   "it)", what, index, got);
        break;
    case WANT_EXACT:
        REQUIRE_AT(got == w->value, "%s[%lld] = %.9g, want exactly %.9g",
                   what, index, got, w->value);
        break;
    case WANT_CLOSE: {
        double err = fabs(got - w->value);
        double tol = tol_abs + tol_rel * fabs(w->value) + w->slack;
        REQUIRE_AT(err <= tol, "%s[%lld] = %.9g, want %.9g (error %.3g > "
                   "tolerance %.3g)", what, index, got, w->value, err, tol);
        break;
    }
    default: break;
    }
}

/* Snapshots the call's buffers and its mask's. */
static void snapshot_all(buffer *bufs, int n, mask_buffers *mb)
{
    for (int i = 0; i < n; i++)
        buffer_snapshot(&bufs[i]);
    for (int i = 0; i < 3; i++)
        buffer_snapshot(&mb->buf[i]);
}

/* After a call with buffers bufs (the first 3 its inputs): a failure must
 * be one the model expects and leave every buffer as it was; a success
 * must be a valid request and leave the inputs and the mask alone.
 * Returns 1 when the outputs are to be checked against the oracle. */
static int check_call(mha_status st, fault_list *f, int huge,
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

/* ------------------------------------------------------------------ */
/* Engine                                                              */

/* Bytes: ISA code, thread code. NULL when creation failed (as it must for
 * the invalid codes). */
static mha_engine *make_engine(byte_reader *in, char *desc, size_t n)
{
    static const int isas[] = {MHA_ISA_AUTO, MHA_ISA_GENERIC, MHA_ISA_AVX2,
                               MHA_ISA_NEON, MHA_ISA_AVX512, 5, -1, 1000,
                               INT_MIN};
    enum { NISA = sizeof isas / sizeof isas[0] };
    static const int threads[] = {0, 1, 2, 3, 4, -1, -8, INT_MIN};
    unsigned ic = take8(in) % (NISA + 1), tc = take8(in) % 8;
    mha_config config = {threads[tc], (mha_isa)(ic < NISA ? isas[ic] : 0)};
    int null_config = ic == NISA;
    snprintf(desc, n, "isa=%s threads=%d",
             null_config ? "(config NULL)" : mha_isa_name(config.isa),
             config.num_threads);
    mha_engine *const untouched = (mha_engine *)(uintptr_t)0x5a5a5a50u;
    mha_engine *engine = untouched;
    mha_status st = mha_engine_create(null_config ? NULL : &config, &engine);
    check_status_known(st);
    int isa_ok = null_config || (config.isa >= MHA_ISA_AUTO &&
                                 config.isa <= MHA_ISA_AVX512);
    int threads_ok = null_config || config.num_threads >= 0;
    if (!isa_ok || !threads_ok) {
        REQUIRE(st == MHA_ERR_BAD_ARGUMENT || st == MHA_ERR_UNSUPPORTED);
    }
    /* Generic always runs; so does auto unless MHA_ISA names a table
     * this build or CPU lacks. */
    int auto_isa = null_config || config.isa == MHA_ISA_AUTO;
    if (threads_ok && (config.isa == MHA_ISA_GENERIC ||
                       (auto_isa && !getenv("MHA_ISA")))) {
        REQUIRE(st == MHA_OK);
    }
    if (st != MHA_OK) {
        REQUIRE(engine == untouched);
        REQUIRE(st == MHA_ERR_BAD_ARGUMENT || st == MHA_ERR_UNSUPPORTED);
        REQUIRE(mha_last_error()[0] != '\0');
        return NULL;
    }
    REQUIRE(engine != NULL && engine != untouched);
    mha_isa got = mha_engine_isa(engine);
    REQUIRE(got >= MHA_ISA_GENERIC && got <= MHA_ISA_AVX512);
    REQUIRE(null_config || config.isa == MHA_ISA_AUTO || got == config.isa);
    REQUIRE(mha_engine_num_threads(engine) ==
            (null_config ? 0 : config.num_threads));
    return engine;
}

/* ------------------------------------------------------------------ */
/* mha_attention                                                       */

enum { T_Q, T_K, T_V, T_OUT };
static const char *const tensor_names[4] = {"q", "k", "v", "out"};

/* Strides for a tensor from 4 bytes: packed BSHD or BHSD, padded, zero
 * (broadcast) on chosen axes, arbitrary, one negative, or seq and head
 * sharing a stride. */
static void layout_strides(byte_reader *in, mha_tensor *t)
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

static mha_dtype dtype_of(unsigned code)
{
    static const int values[] = {MHA_F32, MHA_F32, MHA_F32, MHA_F32,
                                 MHA_F16, MHA_BF16, 3, -1};
    return (mha_dtype)values[code % 8];
}

/* Bytes: class, parameter, 4 raw bytes. Classes: 0 (the default), unit
 * scales up to 2/sqrt(d), -0, NaN, infinities, extreme finite values, raw
 * bits. */
static float take_scale(byte_reader *in, int64_t d)
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

/* Buffers of one attention call. */
enum { B_Q, B_K, B_V, B_OUT, B_W, NBUF };

typedef struct {
    mha_attention_args args;
    mha_mask mask;
    mask_request mreq;
    mask_buffers mb;
    buffer buf[NBUF];
    int want_weights, alias, null_args, null_engine;
    unsigned misalign;
    uint32_t seed;
} attention_case;

/* Copies a view to packed doubles [B, S, H, D]. */
static double *gather(const mha_tensor *t)
{
    size_t n = (size_t)(t->batch * t->seq * t->heads * t->dim);
    double *x = malloc((n ? n : 1) * sizeof *x);
    if (!x)
        abort();
    size_t at = 0;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seq; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t c = 0; c < t->dim; c++) {
                    int64_t off = b * t->stride_batch + s * t->stride_seq +
                                  h * t->stride_head + c;
                    if (t->dtype == MHA_F16 || t->dtype == MHA_BF16) {
                        uint16_t hbits;
                        memcpy(&hbits, (const char *)t->data + off * 2, 2);
                        x[at++] = t->dtype == MHA_F16 ? f16_value(hbits)
                                                      : bf16_value(hbits);
                    } else {
                        x[at++] = (double)((const float *)t->data)[off];
                    }
                }
    return x;
}

static void corrupt_attention(byte_reader *in, attention_case *c)
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

static void describe_tensor(char *s, size_t n, const char *name,
                            const mha_tensor *t)
{
    snprintf(s, n, " %s[%lld,%lld,%lld,%lld|%lld,%lld,%lld|%d%s]", name,
             (long long)t->batch, (long long)t->seq, (long long)t->heads,
             (long long)t->dim, (long long)t->stride_batch,
             (long long)t->stride_seq, (long long)t->stride_head,
             (int)t->dtype, t->data ? "" : " NULL");
}

static void describe_attention(const attention_case *c, const char *engine,
                               const fault_list *f, int huge)
{
    char part[4][128];
    const mha_tensor *t[4] = {&c->args.q, &c->args.k, &c->args.v,
                              &c->args.out};
    for (int i = 0; i < 4; i++)
        describe_tensor(part[i], sizeof part[i], tensor_names[i], t[i]);
    const mha_mask *m = &c->mask;
    snprintf(context, sizeof context,
             "attention %s%s%s%s%s scale=%g weights=%d alias=%d mask=%d{"
             "causal=%d keep=%d[%lld,%lld,%lld] bias=%d[%lld,%lld,%lld] "
             "lengths=%d(mode %u)} faults=%d%s%s%s",
             engine, part[0], part[1], part[2], part[3],
             (double)c->args.scale, c->want_weights, c->alias, c->mb.use,
             (int)m->causal, c->mb.keep, (long long)m->keep_stride_batch,
             (long long)m->keep_stride_head,
             (long long)m->keep_stride_query, c->mb.bias,
             (long long)m->bias_stride_batch, (long long)m->bias_stride_head,
             (long long)m->bias_stride_query, c->mb.lengths,
             c->mreq.len_mode % 8, f->n, f->n ? " (" : "",
             f->n ? f->why[0] : "", f->n ? ")" : huge ? " huge" : "");
}

/* Halves the largest of the lengths and depths until the oracle's work
 * and every buffer fit the budgets: the sizes stay valid, only smaller. */
static void fit_attention(int64_t B, int64_t H, int64_t Hkv, int64_t *Lq,
                          int64_t *Lk, int64_t *d, int64_t *dv)
{
    int64_t *dims[4] = {Lq, Lk, d, dv};
    for (;;) {
        int64_t depth = *d > *dv ? *d : *dv;
        if ((wide)B * H * *Lq * *Lk * (*d + *dv) <= MAX_WORK &&
            (wide)B * H * *Lq * depth <= MAX_ELEMS / 2 &&
            (wide)B * Hkv * *Lk * depth <= MAX_ELEMS / 2 &&
            (wide)B * H * *Lq * *Lk <= MAX_ELEMS / 2)
            return;
        int big = 0;
        for (int i = 1; i < 4; i++)
            if (*dims[i] > *dims[big])
                big = i;
        *dims[big] = (*dims[big] + 1) / 2;
    }
}

static void attention_model(attention_case *c, const mha_engine *engine,
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
        if (!(dt == MHA_F32 || (half_ok && (dt == MHA_F16 || dt == MHA_BF16))))
            add_fault(f, MHA_ERR_UNSUPPORTED, "a dtype is not supported");
        if (t[i]->batch <= 0 || t[i]->seq <= 0 || t[i]->heads <= 0 ||
            t[i]->dim <= 0)
            add_fault(f, MHA_ERR_BAD_SHAPE, "a size is not positive");
        else if (t[i]->stride_batch < 0 || t[i]->stride_seq < 0 ||
                 t[i]->stride_head < 0)
            add_fault(f, MHA_ERR_BAD_STRIDE, "a stride is negative");
        else if (tensor_span(t[i]) * (wide)dtype_bytes(t[i]->dtype) >
                 INT64_MAX)
            add_fault(f, MHA_ERR_OVERFLOW, "a tensor spans > 2^63 bytes");
    }
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

static void alloc_attention(attention_case *c)
{
    mha_attention_args *a = &c->args;
    mha_tensor *t[4] = {&a->q, &a->k, &a->v, &a->out};
    size_t need[NBUF];
    int huge = 0;
    for (int i = 0; i < 4; i++)
        need[i] = alloc_bytes(tensor_span(t[i]), dtype_bytes(t[i]->dtype),
                              &huge);
    const int64_t wdims[4] = {a->q.batch, a->q.heads, a->q.seq, a->k.seq};
    need[B_W] = c->want_weights ? alloc_bytes(product(wdims, 4), 4, &huge) : 4;
    /* An aliased pair shares the larger buffer. */
    int from = -1, to = -1;
    switch (c->alias) {
    case 10: from = B_K, to = B_Q; break; /* k and v inside q: valid */
    case 11: from = B_OUT, to = B_Q; break;
    case 12: from = B_OUT, to = B_V; break;
    case 13: from = c->want_weights ? B_W : -1, to = B_OUT; break;
    case 14: from = c->want_weights ? B_W : -1, to = B_K; break;
    default: break;
    }
    if (from >= 0) {
        if (need[from] > need[to])
            need[to] = need[from];
        if (c->alias == 10 && need[B_V] > need[to])
            need[to] = need[B_V];
    }
    for (int i = 0; i < NBUF; i++)
        buffer_alloc(&c->buf[i], need[i], (c->misalign >> i) & 1 ? 4 : 0);
    alloc_mask(&c->mask, &c->mb, a->q.batch, a->q.heads, a->q.seq, a->k.seq,
               c->misalign >> 5);
    grow_for_mask_alias(c->alias, &c->mb, &c->buf[B_OUT]);
}

/* Points the arguments at the buffers (after filling them). */
static void link_attention(attention_case *c)
{
    mha_attention_args *a = &c->args;
    mha_tensor *t[4] = {&a->q, &a->k, &a->v, &a->out};
    for (int i = 0; i < 4; i++)
        if (t[i]->data)
            t[i]->data = c->buf[i].data;
    switch (c->alias) {
    case 10:
        if (a->k.data)
            a->k.data = c->buf[B_Q].data;
        if (a->v.data)
            a->v.data = c->buf[B_Q].data;
        break;
    case 11: if (a->out.data) a->out.data = c->buf[B_Q].data; break;
    case 12: if (a->out.data) a->out.data = c->buf[B_V].data; break;
    default: break;
    }
    a->weights = NULL;
    if (c->want_weights)
        a->weights = (float *)(c->alias == 13   ? c->buf[B_OUT].data
                               : c->alias == 14 ? c->buf[B_K].data
                                                : c->buf[B_W].data);
    link_mask(&c->mb, &c->mask);
    alias_mask_into(c->alias, &c->mb, &c->mask, c->buf[B_OUT].data);
    a->mask = c->mb.use ? &c->mask : NULL;
}

static void check_attention_outputs(const attention_case *c)
{
    const mha_attention_args *a = &c->args;
    const mha_tensor *o = &a->out;
    const int64_t B = a->q.batch, Lq = a->q.seq, H = a->q.heads;
    const int64_t Lk = a->k.seq, d = a->q.dim, dv = a->v.dim;
    double *q = gather(&a->q), *k = gather(&a->k), *v = gather(&a->v);
    size_t nout = (size_t)(B * Lq * H * dv), nw = (size_t)(B * H * Lq * Lk);
    want *wo = malloc(nout * sizeof *wo);
    want *ww = a->weights ? malloc((nw ? nw : 1) * sizeof *ww) : NULL;
    if (!wo || (a->weights && !ww))
        abort();
    double scale = a->scale != 0.0f ? (double)a->scale : 1.0 / sqrt((double)d);
    oracle_problem p = {B, Lq, Lk, H, a->k.heads, d, dv, q, k, v, a->mask,
                        scale, 2.0 * sqrt((double)d) + 1.0, TOL_ATTN_ABS};
    oracle(&p, wo, ww);

    const buffer *ob = &c->buf[B_OUT];
    size_t nfloats = ob->bytes / 4;
    uint8_t *inside = calloc(nfloats ? nfloats : 1, 1);
    if (!inside)
        abort();
    const float *out = (const float *)o->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Lq; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t col = 0; col < dv; col++) {
                    int64_t off = b * o->stride_batch + i * o->stride_seq +
                                  h * o->stride_head + col;
                    inside[off] = 1;
                    int64_t idx = ((b * Lq + i) * H + h) * dv + col;
                    check_value(&wo[idx], out + off, TOL_ATTN_ABS,
                                TOL_ATTN_REL, "out", (long long)idx);
                }
    for (size_t i = 0; i < nfloats; i++)
        REQUIRE_AT(inside[i] || is_sentinel(out + i),
                   "out[+%zu] outside the view was written", i);
    for (size_t i = 0; ww && i < nw; i++)
        check_value(&ww[i], a->weights + i, TOL_ATTN_ABS, TOL_ATTN_REL,
                    "weights", (long long)i);
    free(inside);
    free(wo);
    free(ww);
    free(q);
    free(k);
    free(v);
}

/* Bytes after the engine's: dims (7), layouts (4 x 4), flags, misalign,
 * alias, scale (6), mask (11), seed (4), dtypes of k and v, specials (33),
 * corruptions. */
static void fuzz_attention(byte_reader *in, mha_engine *engine,
                           const char *engine_desc)
{
    attention_case c;
    memset(&c, 0, sizeof c);
    int64_t B = 1 + take8(in) % 3, Lq = take_seq(in), Lk = take_seq(in);
    int64_t Hkv = 1 + take8(in) % 3, H = Hkv * (1 + take8(in) % 4);
    int64_t d = 1 + take8(in) % 72, dv = 1 + take8(in) % 72;
    fit_attention(B, H, Hkv, &Lq, &Lk, &d, &dv);
    const int64_t sizes[4][4] = {{B, Lq, H, d}, {B, Lk, Hkv, d},
                                 {B, Lk, Hkv, dv}, {B, Lq, H, dv}};
    mha_tensor *t[4] = {&c.args.q, &c.args.k, &c.args.v, &c.args.out};
    for (int i = 0; i < 4; i++) {
        t[i]->batch = sizes[i][0], t[i]->seq = sizes[i][1];
        t[i]->heads = sizes[i][2], t[i]->dim = sizes[i][3];
        t[i]->dtype = MHA_F32;
        t[i]->data = &c; /* non-NULL until a corruption clears it */
        layout_strides(in, t[i]);
    }
    c.want_weights = take8(in) & 1;
    c.misalign = take8(in);
    c.alias = (int)(take8(in) % 16);
    c.args.scale = take_scale(in, d);
    parse_mask(in, &c.mreq);
    mask_presence(&c.mreq, &c.mb);
    build_mask(&c.mreq, H, Lq, Lk, &c.mask);
    c.seed = take32(in);
    unsigned dtypes = take8(in);
    c.args.k.dtype = dtype_of(dtypes);
    c.args.v.dtype = dtype_of(dtypes >> 3);
    special_request sp;
    parse_specials(in, &sp);
    corrupt_attention(in, &c);

    fault_list f = {0};
    int huge = 0;
    attention_model(&c, engine, &f, &huge);
    describe_attention(&c, engine_desc, &f, huge);
    if ((f.n == 0 && huge) || c.mb.lengths_unreadable) {
        stats[S_ATTN_SKIP]++;
        return;
    }

    alloc_attention(&c);
    fill_sentinel(&c.buf[B_OUT]);
    fill_sentinel(&c.buf[B_W]);
    const mha_dtype vt[4] = {MHA_F32, c.args.k.dtype, c.args.v.dtype,
                             MHA_F32};
    for (int i = 0; i < 3; i++)
        fill_values(&c.buf[i], vt[i], c.seed * 3ull + (uint64_t)i);
    if (c.mb.use)
        fill_mask(&c.mreq, &c.mb, c.args.k.seq, c.seed);
    int shared = c.alias == 10;
    buffer *targets[4] = {&c.buf[B_Q], &c.buf[shared ? B_Q : B_K],
                          &c.buf[shared ? B_Q : B_V],
                          c.mb.bias ? &c.mb.buf[1] : NULL};
    inject_specials(&sp, targets, vt);
    link_attention(&c);
    length_faults(&c.mb, &c.mask, c.args.q.batch, c.args.k.seq, &f);
    describe_attention(&c, engine_desc, &f, huge);
    announce();
    if (f.n == 0 && huge) {
        stats[S_ATTN_SKIP]++;
        goto done;
    }
    stats[f.n ? S_ATTN_FAULT : S_ATTN_OK]++;
    snapshot_all(c.buf, NBUF, &c.mb);
    mha_status st = mha_attention(c.null_engine ? NULL : engine,
                                  c.null_args ? NULL : &c.args);
    if (check_call(st, &f, huge, c.buf, NBUF, &c.mb))
        check_attention_outputs(&c);
done:
    for (int i = 0; i < NBUF; i++)
        buffer_free(&c.buf[i]);
    for (int i = 0; i < 3; i++)
        buffer_free(&c.mb.buf[i]);
}

/* ------------------------------------------------------------------ */
/* The layer                                                           */

/* Forward buffers, then the descriptor's. */
enum { L_QUERY, L_KEY, L_VALUE, L_OUT, L_W, NLBUF };
enum { D_IN_W, D_Q_W, D_K_W, D_V_W, D_IN_B, D_OUT_W, D_OUT_B, NDBUF };

typedef struct {
    mha_layer_desc desc;
    int64_t B, Lq, Lk;
    int form; /* 0 in_proj, 1 q/k/v, 2 both (invalid), 3 q only (invalid) */
    int null_out_w, want_weights, alias, null_layer, null_engine;
    int null_in[4]; /* query, key, value, out */
    unsigned misalign;
    uint32_t seed;
    mask_request mreq;
    mask_buffers mb;
    mha_mask mask;
    buffer buf[NLBUF], dbuf[NDBUF];
} layer_case;

static int64_t eff_kdim(const mha_layer_desc *d)
{
    return d->kdim ? d->kdim : d->embed_dim;
}

static int64_t eff_vdim(const mha_layer_desc *d)
{
    return d->vdim ? d->vdim : d->embed_dim;
}

static void fit_layer(layer_case *c)
{
    const int64_t E = c->desc.embed_dim, H = c->desc.num_heads;
    const int64_t kd = eff_kdim(&c->desc), vd = eff_vdim(&c->desc);
    for (;;) {
        wide B = c->B, Lq = c->Lq, Lk = c->Lk;
        wide work = B * (Lq * E * E * 2 + Lk * E * (kd + vd)) +
                    B * Lq * Lk * E * 2;
        wide widest = E > kd ? (E > vd ? E : vd) : (kd > vd ? kd : vd);
        wide most = (Lq > Lk ? Lq : Lk) * B * widest;
        if (work <= MAX_WORK && most <= MAX_ELEMS / 2 &&
            B * H * Lq * Lk <= MAX_ELEMS / 2)
            return;
        int64_t *big = c->Lq >= c->Lk ? &c->Lq : &c->Lk;
        *big = (*big + 1) / 2;
    }
}

static void corrupt_layer(byte_reader *in, layer_case *c)
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

static void describe_layer(const layer_case *c, const char *engine,
                           const char *stage, const fault_list *f, int huge)
{
    const mha_layer_desc *d = &c->desc;
    const mha_mask *m = &c->mask;
    snprintf(context, sizeof context,
             "layer(%s) %s E=%lld H=%lld kdim=%lld vdim=%lld form=%d "
             "in_bias=%d out_bias=%d out_w=%s B=%lld Lq=%lld Lk=%lld "
             "null=%d%d%d%d%d weights=%d alias=%d mask=%d{causal=%d keep=%d"
             "[%lld,%lld,%lld] bias=%d[%lld,%lld,%lld] lengths=%d(mode %u)} "
             "faults=%d%s%s%s",
             stage, engine, (long long)d->embed_dim, (long long)d->num_heads,
             (long long)d->kdim, (long long)d->vdim, c->form,
             d->in_proj_bias != NULL, d->out_proj_bias != NULL,
             c->null_out_w ? "NULL" : "set", (long long)c->B,
             (long long)c->Lq, (long long)c->Lk, c->null_layer,
             c->null_in[0], c->null_in[1], c->null_in[2], c->null_in[3],
             c->want_weights, c->alias, c->mb.use, (int)m->causal, c->mb.keep,
             (long long)m->keep_stride_batch, (long long)m->keep_stride_head,
             (long long)m->keep_stride_query, c->mb.bias,
             (long long)m->bias_stride_batch, (long long)m->bias_stride_head,
             (long long)m->bias_stride_query, c->mb.lengths,
             c->mreq.len_mode % 8, f->n, f->n ? " (" : "",
             f->n ? f->why[0] : "", f->n ? ")" : huge ? " huge" : "");
}

/* Faults of mha_layer_create; *huge when a weight array is beyond the
 * budget. Allocates the descriptor's buffers. */
static void layer_create_model(layer_case *c, const mha_engine *engine,
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
    uint64_t s = c->seed ^ 0x776569676874ull;
    for (int i = 0; i < NDBUF; i++) {
        buffer *b = &c->dbuf[i];
        float scale = (float)(1.0 / sqrt((double)(cols[i] > 0 ? cols[i] : 1)));
        if (i == D_IN_B || i == D_OUT_B)
            scale = 1.0f;
        for (size_t at = 0; at + 4 <= b->bytes; at += 4) {
            float x = random_unit(&s) * scale;
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

static void layer_forward_model(layer_case *c, fault_list *f, int *huge)
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

static void alloc_layer(layer_case *c)
{
    const mha_layer_desc *d = &c->desc;
    const int64_t dims[NLBUF][4] = {
        {c->B, c->Lq, d->embed_dim, 1}, {c->B, c->Lk, eff_kdim(d), 1},
        {c->B, c->Lk, eff_vdim(d), 1},  {c->B, c->Lq, d->embed_dim, 1},
        {c->B, d->num_heads, c->Lq, c->Lk}};
    size_t need[NLBUF];
    int huge = 0;
    for (int i = 0; i < NLBUF; i++)
        need[i] = alloc_bytes(product(dims[i], 4), 4, &huge);
    int to = c->alias == 10   ? L_QUERY
             : c->alias == 11 ? L_QUERY
             : c->alias == 12 ? L_VALUE
             : c->alias == 13 ? L_OUT
             : c->alias == 14 ? L_KEY
                              : -1;
    for (int i = 0; to >= 0 && i < NLBUF; i++)
        if (need[i] > need[to])
            need[to] = need[i];
    for (int i = 0; i < NLBUF; i++)
        buffer_alloc(&c->buf[i], need[i], (c->misalign >> i) & 1 ? 4 : 0);
    alloc_mask(&c->mask, &c->mb, c->B, d->num_heads, c->Lq, c->Lk,
               c->misalign >> 5);
    grow_for_mask_alias(c->alias, &c->mb, &c->buf[L_OUT]);
}

/* The forward call's pointers, after aliasing. */
typedef struct {
    const float *query, *key, *value;
    float *out, *weights;
} layer_pointers;

static layer_pointers link_layer(layer_case *c)
{
    char *p[NLBUF];
    for (int i = 0; i < NLBUF; i++)
        p[i] = c->buf[i].data;
    switch (c->alias) {
    case 10: p[L_KEY] = p[L_VALUE] = p[L_QUERY]; break; /* self-attention */
    case 11: p[L_OUT] = p[L_QUERY]; break;
    case 12: p[L_OUT] = p[L_VALUE]; break;
    case 13: p[L_W] = p[L_OUT]; break;
    case 14: p[L_W] = p[L_KEY]; break;
    default: break;
    }
    for (int i = 0; i < 4; i++)
        if (c->null_in[i])
            p[i] = NULL;
    link_mask(&c->mb, &c->mask);
    alias_mask_into(c->alias, &c->mb, &c->mask, c->buf[L_OUT].data);
    layer_pointers lp = {(const float *)p[L_QUERY], (const float *)p[L_KEY],
                         (const float *)p[L_VALUE], (float *)p[L_OUT],
                         c->want_weights ? (float *)p[L_W] : NULL};
    return lp;
}

/* y = x w^T + b in double over rows of x; a row holding an infinity or a
 * huge value projects to infinities (anything may come of it), one holding
 * a NaN to NaNs. */
static double *project(const float *x, int64_t rows, int64_t in,
                       const float *w, const float *bias, int64_t out)
{
    double *y = malloc((size_t)(rows * out) * sizeof *y);
    if (!y)
        abort();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in;
        int flag = 0;
        for (int64_t p = 0; p < in; p++) {
            int g = flag_of((double)xr[p]);
            flag = g > flag ? g : flag;
        }
        for (int64_t o = 0; o < out; o++) {
            double acc = bias ? (double)bias[o] : 0.0;
            for (int64_t p = 0; p < in; p++)
                acc += (double)xr[p] * (double)w[o * in + p];
            y[r * out + o] = flag == 2 ? NAN : flag == 1 ? INFINITY : acc;
        }
    }
    return y;
}

static void check_layer_outputs(const layer_case *c, const layer_pointers *lp)
{
    const mha_layer_desc *d = &c->desc;
    const int64_t E = d->embed_dim, H = d->num_heads, dh = E / H;
    const int64_t kd = eff_kdim(d), vd = eff_vdim(d);
    const int64_t B = c->B, Lq = c->Lq, Lk = c->Lk;
    /* The weights as the caller gave them (the layer has its own copy; the
     * caller's buffers are gone). */
    const float *w[NDBUF];
    for (int i = 0; i < NDBUF; i++)
        w[i] = (const float *)c->dbuf[i].copy;
    const int in_proj = c->form == 0;
    const float *wq = in_proj ? w[D_IN_W] : w[D_Q_W];
    const float *wk = in_proj ? w[D_IN_W] + E * E : w[D_K_W];
    const float *wv = in_proj ? w[D_IN_W] + 2 * E * E : w[D_V_W];
    const float *bin = d->in_proj_bias ? w[D_IN_B] : NULL;
    double *Q = project(lp->query, B * Lq, E, wq, bin, E);
    double *K = project(lp->key, B * Lk, kd, wk, bin ? bin + E : NULL, E);
    double *V = project(lp->value, B * Lk, vd, wv, bin ? bin + 2 * E : NULL,
                        E);
    size_t ncat = (size_t)(B * Lq * E), nw = (size_t)(B * H * Lq * Lk);
    want *cat = malloc(ncat * sizeof *cat);
    want *ww = lp->weights ? malloc(nw * sizeof *ww) : NULL;
    if (!cat || (lp->weights && !ww))
        abort();
    oracle_problem p = {B, Lq, Lk, H, H, dh, dh, Q, K, V,
                        c->mb.use ? &c->mask : NULL, 1.0 / sqrt((double)dh),
                        2.0 * sqrt((double)dh) + 1.0, TOL_LAYER_ABS};
    oracle(&p, cat, ww);

    const float *wo = w[D_OUT_W], *bo = d->out_proj_bias ? w[D_OUT_B] : NULL;
    for (int64_t r = 0; r < B * Lq; r++) {
        const want *cr = cat + r * E;
        int kind = WANT_EXACT;
        double slack = 0.0;
        for (int64_t col = 0; col < E; col++) {
            if (cr[col].kind == WANT_NAN)
                kind = WANT_NAN;
            else if (cr[col].kind == WANT_ANY && kind != WANT_NAN)
                kind = WANT_ANY;
            else if (cr[col].kind == WANT_CLOSE && kind == WANT_EXACT)
                kind = WANT_CLOSE;
            slack = cr[col].slack > slack ? cr[col].slack : slack;
        }
        for (int64_t o = 0; o < E; o++) {
            double acc = bo ? (double)bo[o] : 0.0, wsum = 0.0;
            for (int64_t col = 0; col < E; col++) {
                acc += cr[col].value * (double)wo[o * E + col];
                wsum += fabs((double)wo[o * E + col]);
            }
            want x = {acc, slack * wsum, kind};
            check_value(&x, lp->out + r * E + o, TOL_LAYER_ABS, TOL_LAYER_REL,
                        "out", (long long)(r * E + o));
        }
    }
    for (size_t i = 0; ww && i < nw; i++)
        check_value(&ww[i], lp->weights + i, TOL_LAYER_ABS, TOL_LAYER_REL,
                    "weights", (long long)i);
    free(cat);
    free(ww);
    free(Q);
    free(K);
    free(V);
}

static void free_layer_case(layer_case *c)
{
    for (int i = 0; i < NLBUF; i++)
        buffer_free(&c->buf[i]);
    for (int i = 0; i < NDBUF; i++)
        buffer_free(&c->dbuf[i]);
    for (int i = 0; i < 3; i++)
        buffer_free(&c->mb.buf[i]);
}

/* Bytes after the engine's: H, head dim, kdim, vdim, form, bias flags,
 * B, Lq, Lk, weights flag, misalign, alias, mask (11), seed (4),
 * specials (33), corruptions. */
static void fuzz_layer(byte_reader *in, mha_engine *engine,
                       const char *engine_desc)
{
    layer_case c;
    memset(&c, 0, sizeof c);
    mha_layer_desc *d = &c.desc;
    d->num_heads = 1 + take8(in) % 6;
    d->embed_dim = d->num_heads * (1 + take8(in) % 12);
    unsigned kcode = take8(in), vcode = take8(in);
    d->kdim = kcode < 160 ? 0 : 1 + kcode % 48;
    d->vdim = vcode < 160 ? 0 : 1 + vcode % 48;
    unsigned form = take8(in) % 8;
    c.form = form < 3 ? 0 : form < 6 ? 1 : (int)form - 4;
    unsigned bflags = take8(in);
    d->in_proj_bias = (bflags & 1) ? (const float *)&c : NULL; /* marks */
    d->out_proj_bias = (bflags & 2) ? (const float *)&c : NULL;
    c.null_out_w = (bflags & 12) == 12;
    c.B = 1 + take8(in) % 3;
    c.Lq = take_seq(in);
    c.Lk = take_seq(in);
    c.want_weights = take8(in) & 1;
    c.misalign = take8(in);
    c.alias = (int)(take8(in) % 16);
    fit_layer(&c);
    parse_mask(in, &c.mreq);
    mask_presence(&c.mreq, &c.mb);
    build_mask(&c.mreq, d->num_heads, c.Lq, c.Lk, &c.mask);
    c.seed = take32(in);
    special_request sp;
    parse_specials(in, &sp);
    corrupt_layer(in, &c);

    /* mha_layer_create */
    fault_list f = {0};
    int huge = 0;
    describe_layer(&c, engine_desc, "create", &f, huge);
    layer_create_model(&c, engine, &f, &huge);
    describe_layer(&c, engine_desc, "create", &f, huge);
    announce();
    if (f.n == 0 && huge) {
        stats[S_LAYER_SKIP]++;
        free_layer_case(&c);
        return;
    }
    for (int i = 0; i < NDBUF; i++)
        buffer_snapshot(&c.dbuf[i]);
    mha_layer *const untouched = (mha_layer *)(uintptr_t)0x5a5a5a60u;
    mha_layer *layer = untouched;
    mha_status st = mha_layer_create(c.null_engine ? NULL : engine, d,
                                     &layer);
    check_status_known(st);
    for (int i = 0; i < NDBUF; i++)
        REQUIRE_AT(buffer_unchanged(&c.dbuf[i]), "desc buffer %d written",
                   i);
    if (f.n > 0) {
        stats[S_CREATE_FAULT]++;
        check_failure(st, &f, huge);
        REQUIRE(layer == untouched);
        free_layer_case(&c);
        return;
    }
    REQUIRE_AT(st == MHA_OK, "valid create failed: %s",
               mha_status_string(st));
    REQUIRE(layer != NULL && layer != untouched);
    /* The layer copies what it needs: the caller's arrays may go now. */
    for (int i = 0; i < NDBUF; i++) {
        free(c.dbuf[i].base);
        c.dbuf[i].base = c.dbuf[i].data = NULL;
    }

    /* mha_layer_forward */
    fault_list g = {0};
    huge = 0;
    layer_forward_model(&c, &g, &huge);
    describe_layer(&c, engine_desc, "forward", &g, huge);
    if ((g.n == 0 && huge) || c.mb.lengths_unreadable) {
        stats[S_LAYER_SKIP]++;
        goto done;
    }
    alloc_layer(&c);
    fill_sentinel(&c.buf[L_OUT]);
    fill_sentinel(&c.buf[L_W]);
    for (int i = L_QUERY; i <= L_VALUE; i++)
        fill_values(&c.buf[i], MHA_F32, c.seed * 5ull + (uint64_t)i);
    if (c.mb.use)
        fill_mask(&c.mreq, &c.mb, c.Lk, c.seed);
    int shared = c.alias == 10;
    buffer *targets[4] = {&c.buf[L_QUERY], &c.buf[shared ? L_QUERY : L_KEY],
                          &c.buf[shared ? L_QUERY : L_VALUE],
                          c.mb.bias ? &c.mb.buf[1] : NULL};
    const mha_dtype f32[4] = {MHA_F32, MHA_F32, MHA_F32, MHA_F32};
    inject_specials(&sp, targets, f32);
    layer_pointers lp = link_layer(&c);
    length_faults(&c.mb, &c.mask, c.B, c.Lk, &g);
    describe_layer(&c, engine_desc, "forward", &g, huge);
    announce();
    snapshot_all(c.buf, NLBUF, &c.mb);
    st = mha_layer_forward(c.null_layer ? NULL : layer, lp.query, lp.key,
                           lp.value, c.B, c.Lq, c.Lk,
                           c.mb.use ? &c.mask : NULL, lp.out, lp.weights);
    stats[g.n ? S_LAYER_FAULT : S_LAYER_OK]++;
    if (check_call(st, &g, huge, c.buf, NLBUF, &c.mb))
        check_layer_outputs(&c, &lp);
done:
    mha_layer_destroy(layer);
    free_layer_case(&c);
}

/* ------------------------------------------------------------------ */

/* Byte 0: bit 0 picks the layer; then the engine's 2 bytes. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (verbose < 0) {
        verbose = getenv("FUZZ_VERBOSE") != NULL;
        if (getenv("FUZZ_STATS"))
            atexit(print_stats);
    }
    byte_reader in = {data, size};
    unsigned op = take8(&in);
    char engine_desc[96];
    detail[0] = '\0';
    snprintf(context, sizeof context, "engine creation");
    mha_engine *engine = make_engine(&in, engine_desc, sizeof engine_desc);
    if (op & 1)
        fuzz_layer(&in, engine, engine_desc);
    else
        fuzz_attention(&in, engine, engine_desc);
    mha_engine_destroy(engine);
    return 0;
}
