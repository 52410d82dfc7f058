/*
 * Writes the seed corpus of the fuzz target into a directory: one file per
 * request, named by what it asks for, in the byte layout the target reads
 * (the parse order of cases.c and decode.c) with the byte codes of
 * encoding.c. ISA codes come from mha_isas(), so "bad-isa" asks for a
 * value no listed ISA has and "bad-isa-negative" for a negative one.
 *
 *   fuzz_seeds DIR
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "encoding.h"

typedef struct {
    unsigned char b[512];
    size_t n;
} bytes;

static void put8(bytes *o, unsigned v)
{
    if (o->n >= sizeof o->b)
        abort();
    o->b[o->n++] = (unsigned char)v;
}

static void put32(bytes *o, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        put8(o, (v >> (8 * i)) & 255);
}

static void put64(bytes *o, uint64_t v)
{
    put32(o, (uint32_t)v);
    put32(o, (uint32_t)(v >> 32));
}

/* The engine's two bytes. isa: an mha_isa; special: an isa_special
 * (then isa is ignored), or -1. */
typedef struct {
    mha_isa isa;
    int special; /* isa_special + 1; 0: use isa */
    int threads; /* 0 means 1 (the default of the seeds) */
    int flush;   /* flush_subnormals */
} engine_req;

static void put_engine(bytes *o, const engine_req *e)
{
    put8(o, e->special ? isa_special_code((isa_special)(e->special - 1))
                       : isa_code(e->isa));
    put8(o, engine_threads_code(e->threads ? e->threads : 1, e->flush));
}

/* 11 mask bytes (parse_mask). keep: mode, pad, density; bias: mode, pad,
 * -inf density, magnitude; lengths: mode, bad value. */
typedef struct {
    unsigned present; /* bit 0 a mask, 1 keep, 2 bias, 3 lengths */
    int causal;
    unsigned keep[3], bias[4], lengths[2];
} mask_req;

enum { M_ON = 1, M_KEEP = 3, M_BIAS = 5, M_LENGTHS = 9 };

static void put_mask(bytes *o, const mask_req *m)
{
    put8(o, m->present);
    put8(o, causal_code(m->causal));
    for (int i = 0; i < 3; i++)
        put8(o, m->keep[i]);
    for (int i = 0; i < 4; i++)
        put8(o, m->bias[i]);
    put8(o, m->lengths[0]);
    put8(o, m->lengths[1]);
}

/* Specials: up to 8 of (target, index, class, run code). */
typedef struct {
    unsigned target, index, cls, run;
} special;

static void put_specials(bytes *o, const special *s, unsigned n)
{
    put8(o, n);
    for (unsigned i = 0; i < 8; i++) {
        special x = i < n ? s[i] : (special){0, 0, 0, 0};
        put8(o, x.target);
        put8(o, x.index & 255);
        put8(o, x.index >> 8);
        put8(o, x.run << 4 | x.cls);
    }
}

/* Corruptions: (target, value); raw values take 8 bytes. */
typedef struct {
    unsigned target;
    int64_t value;
    int raw;
} corruption;

static void put_corruptions(bytes *o, const corruption *c, unsigned n)
{
    if (n == 0) {
        put8(o, 0);
        return;
    }
    put8(o, 160 + n - 1);
    for (unsigned i = 0; i < n; i++) {
        put8(o, c[i].target);
        if (c[i].raw) {
            put8(o, WILD_RAW);
            put64(o, (uint64_t)c[i].value);
        } else {
            put8(o, wild_code(c[i].value));
        }
    }
}

/* The 14 bytes of the terms, lse and scales (encoding.h, TF_* on), after
 * the corruptions; all zero writes none (an input of before them). */
typedef struct {
    unsigned flags, odd, wl, wr, softcap, alibi, alibi_at, sinks, sinks_at;
    unsigned koff, ktotal, kscale, vscale, scale_at;
} terms_req;

static void put_terms(bytes *o, const terms_req *t)
{
    const unsigned b[14] = {t->flags,  t->odd,      t->wl,     t->wr,
                            t->softcap, t->alibi,   t->alibi_at, t->sinks,
                            t->sinks_at, t->koff,   t->ktotal, t->kscale,
                            t->vscale, t->scale_at};
    unsigned any = 0;
    for (int i = 0; i < 14; i++)
        any |= b[i];
    for (int i = 0; any && i < 14; i++)
        put8(o, b[i]);
}

/* One attention request; zero fields take the defaults of attn(). */
typedef struct {
    engine_req e;
    int64_t B, Lq, Lk, Hkv, group, d, dv;
    unsigned layouts[4][4];
    unsigned weights, misalign, alias;
    unsigned scale[2];
    uint32_t scale_raw;
    mask_req mask;
    uint32_t seed;
    int k, v; /* dtypes */
    special spec[8];
    unsigned nspec;
    corruption corrupt[4];
    unsigned ncorrupt;
    terms_req t;
} attn_req;

static int64_t or_default(int64_t x, int64_t d) { return x ? x : d; }

static bytes attention_bytes(const attn_req *r)
{
    bytes o = {{0}, 0};
    put8(&o, 0);
    put_engine(&o, &r->e);
    put8(&o, (unsigned)or_default(r->B, 1) - 1);
    put8(&o, seq_code(or_default(r->Lq, 4)));
    put8(&o, seq_code(or_default(r->Lk, 5)));
    put8(&o, (unsigned)or_default(r->Hkv, 1) - 1);
    put8(&o, (unsigned)or_default(r->group, 1) - 1);
    put8(&o, (unsigned)or_default(r->d, 8) - 1);
    put8(&o, (unsigned)or_default(r->dv, 8) - 1);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 4; i++)
            put8(&o, r->layouts[t][i]);
    put8(&o, r->weights);
    put8(&o, r->misalign);
    put8(&o, r->alias);
    put8(&o, r->scale[0]);
    put8(&o, r->scale[1]);
    put32(&o, r->scale_raw);
    put_mask(&o, &r->mask);
    put32(&o, r->seed ? r->seed : 1);
    put8(&o, dtype_code(r->k) | dtype_code(r->v) << 3);
    put_specials(&o, r->spec, r->nspec);
    put_corruptions(&o, r->corrupt, r->ncorrupt);
    put_terms(&o, &r->t);
    return o;
}

/* One layer request; zero fields take the defaults of layer(). */
typedef struct {
    engine_req e;
    int64_t H, dh, kdim, vdim;
    unsigned form; /* 0 in_proj, 3 q/k/v, 6 both (invalid), 7 q only */
    int no_in_bias, no_out_bias, null_out_w;
    int64_t B, Lq, Lk;
    unsigned weights, misalign, alias;
    mask_req mask;
    special spec[8];
    unsigned nspec;
    corruption corrupt[4];
    unsigned ncorrupt;
} layer_req;

static bytes layer_bytes(const layer_req *r)
{
    bytes o = {{0}, 0};
    put8(&o, 1);
    put_engine(&o, &r->e);
    put8(&o, (unsigned)or_default(r->H, 2) - 1);
    put8(&o, (unsigned)or_default(r->dh, 4) - 1);
    put8(&o, r->kdim ? 160 + (unsigned)(r->kdim - 1) % 48 : 0);
    put8(&o, r->vdim ? 160 + (unsigned)(r->vdim - 1) % 48 : 0);
    put8(&o, r->form);
    put8(&o, (unsigned)!r->no_in_bias | (unsigned)!r->no_out_bias << 1 |
                 (r->null_out_w ? 12u : 0u));
    put8(&o, (unsigned)or_default(r->B, 1) - 1);
    put8(&o, seq_code(or_default(r->Lq, 4)));
    put8(&o, seq_code(or_default(r->Lk, 4)));
    put8(&o, r->weights);
    put8(&o, r->misalign);
    put8(&o, r->alias);
    put_mask(&o, &r->mask);
    put32(&o, 1);
    put_specials(&o, r->spec, r->nspec);
    put_corruptions(&o, r->corrupt, r->ncorrupt);
    return o;
}

static const char *out_dir;
static int written;

/* Each seed is a file named after it: a second seed of one name would
 * replace the first without a word, so the names written so far are kept
 * and a repeat stops the writer. */
static void emit(const char *name, bytes b)
{
    static const char *names[1024];
    for (int i = 0; i < written; i++)
        if (strcmp(names[i], name) == 0) {
            fprintf(stderr, "fuzz_seeds: two seeds named %s\n", name);
            exit(1);
        }
    if (written == (int)(sizeof names / sizeof names[0])) {
        fprintf(stderr, "fuzz_seeds: more than %d seeds\n", written);
        exit(1);
    }
    names[written] = name;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b.b, 1, b.n, f) != b.n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    written++;
}

/* A continuous batch (fuzz/varlen.c's byte order): op 2, the engine, B,
 * kv heads - 1, group - 1, d code, dtype code, form bits (1 paged, 2
 * [B, Lq, H, d] queries, 4 lse, 8 [blocks, Hkv, block, d] pool), causal,
 * block size - 1, Lq - 1, per sequence lq and lk, shuffle seed, sharing,
 * spare blocks, table stride code, fault, data seed, then (when any is
 * set) the 8-bit K/V bytes: dtypes (VQ_*), k's and v's scale layouts
 * (KS_*), bad scale (VBAD_*) and its index. */
typedef struct {
    unsigned B, hkv, group, dcode, dtype, form, causal, block, lq0;
    unsigned lq[4], lk[4], share, spare, stride, fault;
    unsigned quant, kscale, vscale, bad, bad_at;
} varlen_req;

static bytes varlen_bytes(const varlen_req *r)
{
    bytes o = {{0}, 0};
    put8(&o, 2);
    const engine_req e = {0};
    put_engine(&o, &e);
    put8(&o, r->B - 1);
    put8(&o, r->hkv - 1);
    put8(&o, r->group - 1);
    put8(&o, r->dcode);
    put8(&o, r->dtype);
    put8(&o, r->form);
    put8(&o, r->causal);
    put8(&o, r->block - 1);
    put8(&o, r->lq0);
    for (unsigned b = 0; b < r->B; b++) {
        if (!(r->form & 2))
            put8(&o, r->lq[b]);
        put8(&o, r->lk[b]);
    }
    put32(&o, 12345);
    put8(&o, r->share);
    put8(&o, r->spare);
    put8(&o, r->stride);
    put8(&o, r->fault);
    put32(&o, 777);
    if (r->quant | r->kscale | r->vscale | r->bad | r->bad_at) {
        put8(&o, r->quant);
        put8(&o, r->kscale);
        put8(&o, r->vscale);
        put8(&o, r->bad);
        put8(&o, r->bad_at);
    }
    return o;
}

/* One quantisation request (fuzz/quantize.c's byte order): op 4, the
 * engine, flags (QF_*), dst dtype (0 int8, 1 E4M3, 2 E5M2), B, S, H, D
 * (a value of its table), src layout (4 bytes of layout_strides), pool
 * blocks and block size, dst layout (4), scale layout (KS_*), scale
 * values (QV_*), bad index, source values (QM_*, QR_* << 3), seed,
 * specials, alias (QA_*), two faults (Q_*), slot codes (QS_*). Zero sizes
 * take 1. */
typedef struct {
    unsigned flags, dtype;
    int64_t B, S, H, D;
    unsigned src[4];
    int64_t blocks, bs;
    unsigned dst[4];
    unsigned kscale, values, bad_at, mode, nspec, spec[4][2], alias;
    unsigned fault[2], slots[18];
} quant_req;

static unsigned quant_dim_code(int64_t d)
{
    static const int64_t dims[12] = {1, 2, 3, 4, 5, 7, 8, 16, 17, 32, 33, 64};
    for (unsigned i = 0; i < 12; i++)
        if (dims[i] == d)
            return i;
    fprintf(stderr, "fuzz_seeds: no quantize code for D %lld\n",
            (long long)d);
    abort();
}

static bytes quant_bytes(const quant_req *r)
{
    bytes o = {{0}, 0};
    put8(&o, 4);
    const engine_req e = {0};
    put_engine(&o, &e);
    put8(&o, r->flags);
    put8(&o, r->dtype);
    int64_t B = or_default(r->B, 1), S = or_default(r->S, 1);
    put8(&o, (unsigned)B - 1);
    put8(&o, (unsigned)S - 1);
    put8(&o, (unsigned)or_default(r->H, 1) - 1);
    put8(&o, quant_dim_code(or_default(r->D, 1)));
    for (int i = 0; i < 4; i++)
        put8(&o, r->src[i]);
    put8(&o, (unsigned)or_default(r->blocks, 1) - 1);
    put8(&o, (unsigned)or_default(r->bs, 1) - 1);
    for (int i = 0; i < 4; i++)
        put8(&o, r->dst[i]);
    put8(&o, r->kscale);
    put8(&o, r->values);
    put8(&o, r->bad_at);
    put8(&o, r->mode);
    put32(&o, 4242);
    put8(&o, r->nspec);
    for (int i = 0; i < 4; i++) {
        put8(&o, r->spec[i][0]);
        put8(&o, r->spec[i][1]);
    }
    put8(&o, r->alias);
    put8(&o, r->fault[0] ? r->fault[0] : Q_FAULTS);
    put8(&o, r->fault[1] ? r->fault[1] : Q_FAULTS);
    for (int64_t t = 0; (r->flags & QF_PAGED) && t < B * S; t++)
        put8(&o, r->slots[t]);
    return o;
}

#define VARLEN(name, ...) emit(name, varlen_bytes(&(varlen_req){__VA_ARGS__}))
#define QUANT(name, ...) emit(name, quant_bytes(&(quant_req){__VA_ARGS__}))
#define ATTN(name, ...) emit(name, attention_bytes(&(attn_req){__VA_ARGS__}))
#define LAYER(name, ...) emit(name, layer_bytes(&(layer_req){__VA_ARGS__}))
#define SPEC(...) .spec = {__VA_ARGS__}, \
    .nspec = sizeof((special[]){__VA_ARGS__}) / sizeof(special)
#define CORRUPT(...) .corrupt = {__VA_ARGS__}, \
    .ncorrupt = sizeof((corruption[]){__VA_ARGS__}) / sizeof(corruption)
#define ISA(x) .e = {.isa = (x)}
#define ISA_SPECIAL(s) .e = {.special = (s) + 1}

/* Corruption targets (corrupt_attention): 8 per tensor (batch, seq,
 * heads, dim, the 3 strides, data/dtype), mask strides, args, engine. */
enum { C_Q = 0, C_K = 8, C_V = 16, C_OUT = 24, C_KEEP = 32, C_BIAS = 35,
       C_ARGS = 38, C_ENGINE = 39 };
enum { F_BATCH, F_SEQ, F_HEADS, F_DIM, F_SB, F_SS, F_SH, F_DATA };
/* corrupt_layer: E, H, kdim, vdim, B, Lq, Lk, 4 NULL pointers, layer. */
enum { L_E, L_H, L_KDIM, L_VDIM, L_B, L_LQ, L_LK, L_NULL_QUERY,
       L_NULL_LAYER = 11 };

#define P62 ((int64_t)1 << 62)

/* Score terms, lse and 8-bit K/V scales (fuzz/terms.c). */
static void terms_seeds(void)
{
    const unsigned T = TF_TERMS | TF_LSE;
    /* --- valid --- */
    ATTN("terms-window-both-sides", .Lq = 12, .Lk = 20, .weights = 1,
         .t = {.flags = T | TF_WINDOW, .wl = 3, .wr = 2});
    ATTN("terms-window-left-top-left", .Lq = 9, .Lk = 43, .d = 16,
         .mask = {M_ON, MHA_CAUSAL_TOP_LEFT, {0}, {0}, {0}},
         .t = {.flags = T | TF_WINDOW | TF_TOP_LEFT, .wl = 5,
               .wr = EXT_UNBOUNDED});
    ATTN("terms-softcap-alibi-sinks", .B = 2, .Lq = 7, .Lk = 31, .Hkv = 2,
         .group = 2, .d = 16, .dv = 8, .weights = 1,
         .t = {.flags = T | TF_SOFTCAP | TF_ALIBI | TF_SINKS,
               .softcap = SOFTCAP_20, .alibi = AL_PADDED | 2 << 2,
               .sinks = SV_RANDOM});
    ATTN("terms-sinks-fully-masked", .Lq = 5, .Lk = 7, .weights = 1,
         .mask = {M_KEEP, 0, {0, 0, 255}, {0}, {0}},
         .t = {.flags = T | TF_SINKS, .sinks = SV_DOMINANT});
    ATTN("terms-key-offset-shard", .Lq = 6, .Lk = 11, .weights = 1,
         .mask = {M_ON, MHA_CAUSAL_BOTTOM_RIGHT, {0}, {0}, {0}},
         .t = {.flags = T | TF_SHARD | TF_ALIBI | TF_WINDOW, .koff = 7,
               .ktotal = 5, .wl = 8, .wr = EXT_UNBOUNDED,
               .alibi = AL_BROADCAST | AV_RANDOM << 5});
    ATTN("scales-i8-per-row", .k = MHA_I8, .v = MHA_I8, .B = 2, .Lq = 5,
         .Lk = 23, .Hkv = 2, .d = 12, .dv = 6, .weights = 1,
         .t = {.flags = TF_LSE, .kscale = SC_ROW_BSH, .vscale = SC_ROW_BHS});
    ATTN("scales-fp8-per-head", .k = MHA_FP8_E4M3, .v = MHA_FP8_E5M2,
         .Lq = 4, .Lk = 37, .Hkv = 2, .group = 2, .d = 24, .dv = 8,
         .t = {.flags = T | TF_SOFTCAP, .softcap = SOFTCAP_5,
               .kscale = SC_HEAD, .vscale = SC_HEAD | 1 << 3});
    ATTN("scales-i8-per-tensor-padded", .k = MHA_I8, .v = MHA_FP8_E4M3,
         .Lq = 3, .Lk = 17,
         .t = {.kscale = SC_TENSOR, .vscale = SC_ROW_PADDED | 2 << 3});
    ATTN("flush-softcap-flt-max", .e = {.flush = 1}, .Lq = 6, .Lk = 19,
         .weights = 1,
         .t = {.flags = T | TF_SOFTCAP, .softcap = SOFTCAP_FLT_MAX});
    ATTN("flush-softcap-1e30-alibi", .e = {.flush = 1, .threads = 2},
         .B = 2, .Lq = 7, .Lk = 31,
         .t = {.flags = T | TF_SOFTCAP | TF_ALIBI, .softcap = SOFTCAP_1E30,
               .alibi = AL_PACKED | AV_TINY << 5});
    ATTN("flush-scales-extreme", .e = {.flush = 1}, .k = MHA_I8,
         .v = MHA_FP8_E5M2, .Lq = 4, .Lk = 31, .Hkv = 2, .d = 16, .dv = 8,
         .t = {.flags = TF_LSE, .kscale = SC_ROW_BSH | SCV_EXTREME << 5,
               .vscale = SC_HEAD | SCV_EXTREME << 5, .scale_at = 3});
    /* --- invalid --- */
    ATTN("bad-terms-window-left", .t = {.flags = T | TF_WINDOW,
                                        .wl = EXT_MINUS2,
                                        .wr = EXT_UNBOUNDED});
    ATTN("bad-terms-window-flag", .t = {.flags = T, .odd = TO_WINDOW_2});
    ATTN("bad-terms-align", .t = {.flags = T, .odd = TO_ALIGN_2});
    ATTN("bad-terms-softcap-nan", .t = {.flags = T | TF_SOFTCAP,
                                        .softcap = SOFTCAP_NAN});
    ATTN("bad-terms-softcap-negative", .t = {.flags = T | TF_SOFTCAP,
                                             .softcap = SOFTCAP_MINUS1});
    ATTN("bad-terms-alibi-nan", .B = 2, .group = 3,
         .t = {.flags = T | TF_ALIBI, .alibi = AL_PACKED | AV_NAN << 5,
               .alibi_at = 4});
    ATTN("bad-terms-alibi-stride", .t = {.flags = T | TF_ALIBI,
                                         .alibi = AL_NEGATIVE});
    ATTN("bad-terms-key-total", .t = {.flags = T | TF_SHARD, .koff = 3,
                                      .ktotal = TOT_SHORT});
    ATTN("bad-terms-key-offset", .t = {.flags = T | TF_SHARD,
                                       .koff = OFF_MINUS1});
    ATTN("bad-terms-sinks-nan", .group = 2,
         .t = {.flags = T | TF_SINKS, .sinks = SV_NAN, .sinks_at = 1});
    ATTN("bad-scale-zero", .k = MHA_I8,
         .t = {.kscale = SC_TENSOR | SCV_ZERO << 5});
    ATTN("bad-kv-scales-nan", .v = MHA_FP8_E4M3, .B = 2,
         .t = {.vscale = SC_ROW_BSH | SCV_NAN << 5, .scale_at = 9});
    ATTN("bad-kv-scales-inf", .k = MHA_FP8_E5M2, .Hkv = 2,
         .t = {.kscale = SC_HEAD | SCV_INF << 5, .scale_at = 1});
    ATTN("bad-scale-stride", .k = MHA_I8, .v = MHA_I8,
         .t = {.kscale = SC_ROW_BSH, .vscale = SC_NEGATIVE | 1 << 3});
    ATTN("bad-scales-on-float", .k = MHA_F16,
         .t = {.kscale = SC_TENSOR | 3 << 3});
}

static void attention_seeds(const mask_req *all_masks, const special *sp,
                            unsigned nsp)
{
    const unsigned padded_bhsd[4] = {3, 3, 5, 7};
#define LAYOUTS4(l) .layouts = {{l[0], l[1], l[2], l[3]}, \
    {l[0], l[1], l[2], l[3]}, {l[0], l[1], l[2], l[3]}, \
    {l[0], l[1], l[2], l[3]}}
    /* --- valid --- */
    ATTN("attn-basic", .e = {0});
    ATTN("attn-generic-4threads", .e = {.isa = MHA_ISA_GENERIC, .threads = 4},
         .B = 2, .Lq = 9, .Lk = 13, .d = 17, .dv = 5);
    ATTN("attn-avx2-tails", .e = {.isa = MHA_ISA_AVX2, .threads = 2},
         .Lq = 7, .Lk = 19, .d = 23, .dv = 33);
    ATTN("attn-gqa-all-masks", .B = 3, .Lq = 6, .Lk = 11, .Hkv = 2,
         .group = 3, .d = 16, .dv = 8, .weights = 1, .mask = *all_masks,
         LAYOUTS4(padded_bhsd));
    ATTN("attn-decode", .B = 2, .Lq = 1, .Lk = 265, .Hkv = 2, .group = 2,
         .d = 32, .dv = 32,
         .mask = {M_LENGTHS, MHA_CAUSAL_BOTTOM_RIGHT, {0}, {0}, {0}});
    ATTN("attn-long-blocks", .e = {.threads = 2}, .Lq = 103, .Lk = 301,
         .mask = {M_ON, MHA_CAUSAL_TOP_LEFT, {0}, {0}, {0}});
    ATTN("attn-prefill-bottom-right", .Lq = 12, .Lk = 20,
         .mask = {M_ON, MHA_CAUSAL_BOTTOM_RIGHT, {0}, {0}, {0}});
    ATTN("attn-f16", .k = MHA_F16, .v = MHA_F16, .Lq = 5, .Lk = 31, .d = 24,
         .dv = 9);
    ATTN("attn-bf16-f32", .k = MHA_BF16, .Lq = 3, .Lk = 73, .d = 40,
         .dv = 16, .weights = 1);
    ATTN("attn-broadcast-inputs", .B = 2, .Lq = 5, .Lk = 6, .group = 2,
         /* zero batch, seq and head strides on q, k, v */
         .layouts = {{4, 7, 0, 0}, {4, 7, 0, 0}, {4, 7, 0, 0}, {0}},
         .mask = {M_KEEP, 0, {2, 0, 60}, {0}, {0}});
    ATTN("attn-lookahead-bias", .Lq = 8, .Lk = 8,
         .mask = {M_BIAS, 0, {0}, {3, 0, 50, 0}, {0}});
    ATTN("attn-fully-masked", .Lq = 5, .Lk = 7, .weights = 1,
         .mask = {M_KEEP, 0, {0, 0, 255}, {0}, {0}});
    ATTN("attn-ninf-bias-rows", .Lq = 5, .Lk = 7, .weights = 1,
         .mask = {M_BIAS, 0, {0}, {7, 0, 255, 0}, {0}});
    ATTN("attn-zero-lengths", .B = 3, .Lq = 4, .Lk = 6,
         .mask = {M_LENGTHS, 0, {0}, {0}, {5, 0}});
    attn_req specials = {.Lq = 6, .Lk = 9, .d = 5, .dv = 7, .weights = 1,
                         .mask = {M_BIAS, 0, {0}, {0, 0, 20, 0}, {0}},
                         .nspec = nsp};
    memcpy(specials.spec, sp, nsp * sizeof *sp);
    emit("attn-specials", attention_bytes(&specials));
    ATTN("attn-nan-query-row", .Lq = 3, .Lk = 4, .d = 4, .dv = 4,
         SPEC({0, 0, SP_NAN, 1}));
    attn_req specials_half = {.k = MHA_F16, .v = MHA_BF16, .Lq = 4, .Lk = 9,
                              .nspec = nsp};
    memcpy(specials_half.spec, sp, nsp * sizeof *sp);
    emit("attn-specials-f16", attention_bytes(&specials_half));
    ATTN("attn-scale-negative", .scale = {3, 0x83});
    ATTN("attn-scale-extreme", .scale = {10, 4}, .Lq = 3, .Lk = 37);
    ATTN("attn-scale-denormal", .scale = {10, 0});
    ATTN("attn-shared-inputs", .alias = 10, .Lq = 6, .Lk = 6);
    ATTN("attn-misaligned", .misalign = 0xff, .d = 9, .dv = 3, .weights = 1,
         .mask = *all_masks);
    ATTN("attn-interleaved-out", .Lq = 6, .Lk = 3, .Hkv = 3, .group = 2,
         .d = 1, .dv = 1, .layouts = {{0}, {0}, {0}, {5, 0, 17, 9}});
    /* A flushing engine: subnormal inputs read as 0, extreme scales. */
    attn_req flushed = specials;
    flushed.e.flush = 1;
    emit("attn-flush-specials", attention_bytes(&flushed));
    flushed = specials_half;
    flushed.e = (engine_req){.threads = 2, .flush = 1};
    emit("attn-flush-specials-f16", attention_bytes(&flushed));
    ATTN("attn-flush-scale-denormal", .e = {.flush = 1}, .scale = {10, 0});
    ATTN("attn-flush-scale-extreme", .e = {.flush = 1}, .scale = {10, 4},
         .Lq = 3, .Lk = 37);
    ATTN("attn-flush-scale-1e20", .e = {.flush = 1}, .scale = {10, 3},
         .Lq = 5, .Lk = 21, .weights = 1, .mask = *all_masks);
    /* --- invalid --- */
    ATTN("bad-isa", ISA_SPECIAL(ISA_PAST_LAST));
    ATTN("bad-isa-negative", ISA_SPECIAL(ISA_NEGATIVE));
    ATTN("bad-isa-huge", ISA_SPECIAL(ISA_HUGE));
    ATTN("bad-threads", .e = {.threads = -1});
    ATTN("bad-threads-above-max", .e = {.threads = MHA_MAX_THREADS + 1});
    ATTN("attn-null-config", ISA_SPECIAL(ISA_NULL_CONFIG));
    ATTN("bad-negative-stride", .layouts = {{6, 1, 3, 0}, {0}, {0}, {0}});
    ATTN("bad-out-overlaps-itself", .Lq = 3, .group = 2,
         .layouts = {{0}, {0}, {0}, {7, 0, 0, 0}});
    ATTN("bad-out-is-q", .alias = 11);
    ATTN("bad-weights-is-out", .alias = 13, .weights = 1);
    ATTN("bad-mask-in-out", .alias = 15,
         .mask = {M_BIAS, 0, {0}, {0}, {0}});
    ATTN("bad-causal", .mask = {M_ON, 3, {0}, {0}, {0}});
    ATTN("bad-causal-negative", .mask = {M_ON, -1, {0}, {0}, {0}});
    ATTN("bad-key-length", .B = 2,
         .mask = {M_LENGTHS, 0, {0}, {0}, {6, 0x11}});
    ATTN("bad-mask-stride", .mask = {M_KEEP, 0, {6, 3, 0}, {0}, {0}});
    ATTN("bad-softmax-scale-nan", .scale = {8, 1});
    ATTN("bad-softmax-scale-inf", .scale = {9, 0});
    ATTN("bad-dtype-k", .k = -1);
    ATTN("quant-k-no-scales", .k = MHA_I8, .Lq = 1, .Lk = 73, .d = 40);
    /* q.dtype = 1 (f16): the value's low bit clear, dtype value >> 1 */
    ATTN("bad-dtype-q", CORRUPT({C_Q + F_DATA, 2, 0}));
    ATTN("bad-null-q", CORRUPT({C_Q + F_DATA, 1, 0}));
    ATTN("bad-null-args", CORRUPT({C_ARGS, 0, 0}));
    ATTN("bad-null-engine", CORRUPT({C_ENGINE, 0, 0}));
    ATTN("bad-zero-batch", CORRUPT({C_Q + F_BATCH, 0, 0}));
    ATTN("bad-negative-seq", CORRUPT({C_K + F_SEQ, -1, 0}));
    ATTN("bad-shape-mismatch", CORRUPT({C_V + F_DIM, 7, 0}));
    ATTN("bad-heads-divide", .Hkv = 2, CORRUPT({C_K + F_HEADS, 3, 0}));
    ATTN("huge-batch", CORRUPT({C_Q + F_BATCH, P62, 0},
                               {C_K + F_BATCH, P62, 0},
                               {C_V + F_BATCH, P62, 0},
                               {C_OUT + F_BATCH, P62, 0}));
    ATTN("huge-seq-overflow", CORRUPT({C_Q + F_SEQ, INT64_MAX, 0}));
    ATTN("huge-stride", .B = 2, CORRUPT({C_Q + F_SB, INT64_MAX, 0}));
    /* Lk = 2^62 broadcast keys: tiny buffers, B*H*Lq*Lk*4 overflows. */
    ATTN("huge-lk-broadcast", .weights = 1,
         CORRUPT({C_K + F_SEQ, P62, 0}, {C_K + F_SS, 0, 0},
                 {C_V + F_SEQ, P62, 0}, {C_V + F_SS, 0, 0}));
    ATTN("huge-mask-stride", .B = 2, .mask = {M_BIAS, 0, {0}, {0}, {0}},
         CORRUPT({C_BIAS, P62, 0}));
    ATTN("huge-raw-size", CORRUPT({C_Q + F_DIM, INT64_MIN + 5, 1}));
    terms_seeds();
#undef LAYOUTS4
}

/* mha_quantize and mha_quantize_paged (fuzz/quantize.c). Layout bytes
 * (layout_strides): mode 0 packed [B, S, H, D], 1 [B, H, S, D], 2 and 3
 * padded by the next bytes, 4 zero strides (bits of the next byte), 5
 * arbitrary, 6 one negative, 7 seq and head sharing a stride. */
static void quantize_seeds(void)
{
    const unsigned C = QF_COMPUTED, P = QF_PAGED;
    /* --- valid --- */
    QUANT("quant-i8-per-row", .dtype = 0, .B = 2, .S = 3, .H = 2, .D = 16,
          .kscale = KS_ROW_BSH);
    QUANT("quant-e4m3-computed-per-head", .flags = C, .dtype = 1, .B = 2,
          .S = 4, .H = 3, .D = 17, .src = {2, 3, 1, 2}, .kscale = KS_HEAD);
    QUANT("quant-e5m2-computed-tensor-specials", .flags = C, .dtype = 2,
          .S = 5, .H = 2, .D = 8, .kscale = KS_TENSOR,
          .mode = QM_WIDE | QR_NONFINITE << 3, .nspec = 4,
          .spec = {{3, SP_NAN}, {9, SP_NEG_INF}, {17, SP_NEG_NAN},
                   {20, SP_FLT_MAX}});
    QUANT("quant-i8-computed-zero-row-bhsd", .flags = C | QF_SCALES_IS_OUT,
          .dtype = 0, .B = 3, .S = 2, .H = 2, .D = 5, .dst = {3, 2, 1, 3},
          .kscale = KS_ROW_BHS, .mode = QR_ZERO << 3);
    QUANT("quant-e4m3-ties", .dtype = 1, .B = 2, .S = 3, .H = 2, .D = 32,
          .kscale = KS_ROW_PADDED | 1 << 3, .mode = QM_TIES);
    QUANT("quant-i8-ties", .dtype = 0, .S = 4, .H = 3, .D = 33,
          .kscale = KS_HEAD, .mode = QM_TIES);
    QUANT("quant-e5m2-ties", .dtype = 2, .B = 3, .S = 2, .D = 64,
          .kscale = KS_TOKEN, .mode = QM_TIES);
    QUANT("quant-computed-shared-rows", .flags = C, .dtype = 1, .B = 2,
          .S = 3, .H = 3, .D = 4, .kscale = KS_TENSOR | 2 << 3);
    QUANT("quant-computed-subnormal-src", .flags = C, .dtype = 0, .S = 3,
          .H = 2, .D = 7, .mode = QM_SUBNORMAL);
    QUANT("quant-computed-huge-src", .flags = C, .dtype = 2, .S = 2, .H = 2,
          .D = 16, .mode = QM_HUGE | QR_ONE_HUGE << 3);
    QUANT("quant-extreme-scales", .dtype = 1, .B = 2, .S = 2, .H = 2, .D = 8,
          .kscale = KS_ROW_BSH, .values = QV_EXTREME);
    QUANT("quant-src-broadcast", .dtype = 0, .B = 2, .S = 3, .H = 2, .D = 4,
          .src = {4, 7, 0, 0}, .kscale = KS_ROW_BSH);
    QUANT("quant-scales-in-src", .dtype = 1, .S = 2, .H = 2, .D = 8,
          .kscale = KS_HEAD, .alias = QA_SCALES_IN_SRC);
    QUANT("quant-unread-padding-scale", .dtype = 2, .B = 2, .S = 2, .H = 2,
          .D = 4, .kscale = KS_ROW_PADDED | 2 << 3,
          .values = QV_NAN | QV_UNREAD, .flags = QF_JUNK);
    QUANT("quant-paged-given", .flags = P | QF_JUNK, .dtype = 0, .B = 2,
          .S = 3, .H = 2, .D = 16, .blocks = 3, .bs = 4,
          .kscale = KS_ROW_BSH, .slots = {5, QS_MINUS1, 0, 11, QS_INT64_MIN,
                                          7});
    QUANT("quant-paged-computed-token", .flags = P | C, .dtype = 1, .B = 2,
          .S = 4, .H = 3, .D = 8, .blocks = 2, .bs = 3,
          .kscale = KS_TOKEN | 1 << 3,
          .slots = {0, 1, 2, 3, 4, 5, 2, QS_LAST});
    QUANT("quant-paged-computed-bhsd-duplicates", .flags = P | C, .dtype = 2,
          .S = 5, .H = 2, .D = 17, .blocks = 4, .bs = 2, .dst = {1, 0, 0, 0},
          .kscale = KS_ROW_BHS, .mode = QR_ZERO << 3,
          .slots = {6, 6, QS_MINUS2, 1, 6});
    QUANT("quant-paged-unread-bad-scale", .flags = P | QF_JUNK, .dtype = 1,
          .S = 2, .H = 2, .D = 8, .blocks = 3, .bs = 2, .kscale = KS_ROW_BSH,
          .values = QV_NAN | QV_UNREAD, .slots = {1, 4});
    /* --- invalid --- */
    QUANT("bad-quant-scale-zero", .dtype = 0, .S = 3, .H = 2, .D = 4,
          .kscale = KS_ROW_BSH, .values = QV_ZERO, .bad_at = 3);
    QUANT("bad-quant-scale-stride", .dtype = 1, .S = 2, .D = 4,
          .kscale = KS_NEGATIVE | 1 << 3);
    QUANT("bad-quant-no-scales", .dtype = 2, .D = 4, .kscale = KS_NONE);
    QUANT("bad-quant-dst-overlaps-itself", .dtype = 0, .S = 3, .H = 2,
          .D = 4, .dst = {7, 0, 0, 0});
    QUANT("bad-quant-dst-in-src", .dtype = 0, .S = 2, .D = 8,
          .alias = QA_DST_IN_SRC);
    QUANT("bad-quant-scales-out-in-dst", .flags = C, .dtype = 1, .S = 2,
          .H = 2, .D = 8, .alias = QA_SCALES_IN_DST);
    QUANT("bad-quant-scales-out-in-src", .flags = C, .dtype = 2, .S = 2,
          .D = 8, .alias = QA_SCALES_IN_SRC);
    QUANT("bad-quant-other-scales", .flags = C, .dtype = 0, .D = 4,
          .fault = {Q_OTHER_SCALES});
    QUANT("bad-quant-shape", .dtype = 0, .D = 4, .fault = {Q_HEADS});
    QUANT("bad-quant-src-f16", .dtype = 1, .D = 4, .fault = {Q_SRC_F16});
    QUANT("bad-quant-dst-f32", .flags = C, .dtype = 1, .D = 4,
          .fault = {Q_DST_F32});
    QUANT("bad-quant-null-src", .dtype = 0, .D = 4, .fault = {Q_NULL_SRC});
    QUANT("bad-quant-null-dst-data", .dtype = 0, .D = 4,
          .fault = {Q_NULL_DST_DATA});
    QUANT("bad-quant-overflow", .dtype = 0, .S = 2, .D = 4,
          .fault = {Q_OVERFLOW});
    QUANT("bad-quant-paged-slot-past", .flags = P, .dtype = 0, .S = 3,
          .D = 4, .blocks = 2, .bs = 2, .slots = {0, QS_PAST, 1});
    QUANT("bad-quant-paged-shared-scale", .flags = P | C, .dtype = 1, .S = 2,
          .H = 2, .D = 4, .blocks = 2, .bs = 2, .kscale = KS_HEAD,
          .slots = {0, 3});
    QUANT("bad-quant-paged-null-slots", .flags = P, .dtype = 2, .D = 4,
          .blocks = 2, .bs = 2, .fault = {Q_NULL_SLOTS});
    QUANT("bad-quant-paged-slots-in-pool", .flags = P, .dtype = 0, .S = 2,
          .D = 16, .blocks = 2, .bs = 2, .alias = QA_SLOTS_IN_POOL,
          .slots = {0, 1});
    QUANT("bad-quant-paged-scale-nan", .flags = P, .dtype = 1, .S = 3,
          .H = 2, .D = 4, .blocks = 2, .bs = 3, .kscale = KS_ROW_BSH,
          .values = QV_NAN, .bad_at = 1, .slots = {4, 0, QS_MINUS1});
}

static void layer_seeds(const mask_req *all_masks, const special *sp,
                        unsigned nsp)
{
    /* --- valid --- */
    LAYER("layer-basic", .e = {0});
    LAYER("layer-weights", .H = 3, .dh = 5, .B = 2, .Lq = 5, .Lk = 7,
          .weights = 1, .mask = *all_masks);
    LAYER("layer-kdim-vdim", .form = 3, .kdim = 7, .vdim = 13, .Lq = 3,
          .Lk = 9);
    LAYER("layer-no-bias", .no_in_bias = 1, .no_out_bias = 1,
          .e = {.threads = 2});
    LAYER("layer-self-causal", .alias = 10, .Lq = 6, .Lk = 6,
          .mask = {M_ON, MHA_CAUSAL_TOP_LEFT, {0}, {0}, {0}});
    LAYER("layer-fully-masked", .weights = 1,
          .mask = {M_KEEP, 0, {0, 0, 255}, {0}, {0}});
    layer_req specials = {.Lq = 5, .Lk = 9, .nspec = nsp};
    memcpy(specials.spec, sp, nsp * sizeof *sp);
    emit("layer-specials", layer_bytes(&specials));
    LAYER("layer-avx2-threads", .e = {.isa = MHA_ISA_AVX2, .threads = 4},
          .H = 4, .dh = 12, .B = 3, .Lq = 20, .Lk = 31);
    specials.e.flush = 1;
    emit("layer-flush-specials", layer_bytes(&specials));
    /* --- invalid --- */
    LAYER("layer-bad-both-forms", .form = 6);
    LAYER("layer-bad-q-only", .form = 7);
    LAYER("layer-bad-in-proj-kdim", .form = 0, .kdim = 3);
    LAYER("layer-bad-no-out-weight", .null_out_w = 1);
    LAYER("layer-bad-heads", CORRUPT({L_H, 3, 0}));
    LAYER("layer-bad-embed", CORRUPT({L_E, -1, 0}));
    LAYER("layer-bad-kdim", .form = 3, CORRUPT({L_KDIM, -2, 0}));
    LAYER("layer-huge-embed", CORRUPT({L_E, (int64_t)1 << 40, 0},
                                      {L_H, 7, 0}));
    LAYER("layer-huge-embed-overflow", CORRUPT({L_E, (int64_t)1 << 32, 0}));
    LAYER("layer-bad-batch", CORRUPT({L_B, 0, 0}));
    LAYER("layer-huge-lq", CORRUPT({L_LQ, P62, 0}));
    LAYER("layer-bad-null-query", CORRUPT({L_NULL_QUERY, 0, 0}));
    LAYER("layer-bad-null-layer", CORRUPT({L_NULL_LAYER, 0, 0}));
    LAYER("layer-bad-out-is-query", .alias = 11);
    LAYER("layer-bad-weights-is-key", .alias = 14, .weights = 1);
    LAYER("layer-bad-mask-in-out", .alias = 15,
          .mask = {M_BIAS, 0, {0}, {0}, {0}});
    LAYER("layer-bad-key-length",
          .mask = {M_LENGTHS, 0, {0}, {0}, {6, 0x10}});
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_seeds DIR\n");
        return 2;
    }
    out_dir = argv[1];
    /* Continuous batches: packed; paged with shuffled, shared blocks of 3
     * in both pool orders; a decode step; empty sequences; faults. */
    VARLEN("varlen-packed", .B = 3, .hkv = 2, .group = 2, .dcode = 2,
           .form = 4, .causal = 2, .block = 4, .lq = {5, 1, 9},
           .lk = {20, 33, 9}, .fault = 0);
    VARLEN("varlen-paged-shared", .B = 4, .hkv = 1, .group = 3, .dcode = 1,
           .dtype = 1, .form = 1 | 4, .causal = 2, .block = 3,
           .lq = {4, 2, 1, 7}, .lk = {30, 40, 11, 7}, .share = 1, .spare = 2,
           .stride = 2);
    VARLEN("varlen-paged-bhsd-decode", .B = 3, .hkv = 2, .group = 1,
           .dcode = 4, .dtype = 2, .form = 1 | 2 | 8, .causal = 2,
           .block = 5, .lq0 = 0, .lk = {49, 1, 17});
    VARLEN("varlen-empty", .B = 4, .hkv = 1, .group = 2, .dcode = 0,
           .form = 1, .causal = 1, .block = 1, .lq = {0, 3, 2, 0},
           .lk = {5, 0, 6, 0});
    VARLEN("varlen-bad-cu-q", .B = 2, .hkv = 1, .group = 1, .form = 0,
           .block = 2, .lq = {3, 4}, .lk = {5, 6}, .fault = 1);
    VARLEN("varlen-bad-block", .B = 2, .hkv = 1, .group = 1, .form = 1,
           .block = 2, .lq = {3, 4}, .lk = {5, 6}, .fault = 4);
    VARLEN("varlen-both-forms", .B = 2, .hkv = 1, .group = 1, .form = 1,
           .block = 2, .lq = {3, 4}, .lk = {5, 6}, .fault = 6);
    /* 8-bit K/V: packed and paged, every scale layout family, bad scales
     * at read rows (refused) and junk at unread ones (accepted). */
    VARLEN("varlen-packed-i8", .B = 3, .hkv = 2, .group = 2, .dcode = 2,
           .form = 4, .causal = 2, .block = 4, .lq = {5, 1, 9},
           .lk = {20, 33, 9}, .quant = VQ_I8, .kscale = KS_ROW_BSH,
           .vscale = KS_ROW_BHS);
    VARLEN("varlen-paged-fp8-token-head", .B = 4, .hkv = 1, .group = 3,
           .dcode = 1, .form = 1 | 4, .causal = 2, .block = 3,
           .lq = {4, 2, 1, 7}, .lk = {30, 40, 11, 7}, .share = 1, .spare = 2,
           .stride = 2, .quant = VQ_E4M3 | VQ_E5M2 << 2,
           .kscale = KS_TOKEN | 1 << 3, .vscale = KS_HEAD);
    VARLEN("varlen-paged-bhsd-i8-padded-block", .B = 3, .hkv = 2, .group = 1,
           .dcode = 4, .form = 1 | 2 | 8, .causal = 2, .block = 5,
           .lk = {49, 1, 17}, .spare = 3, .quant = VQ_I8 | VQ_E4M3 << 2,
           .kscale = KS_ROW_PADDED | 3 << 3, .vscale = KS_TENSOR | 1 << 3);
    VARLEN("varlen-paged-f16-k-e5m2-v", .B = 2, .hkv = 2, .group = 2,
           .dcode = 3, .dtype = 1, .form = 1 | 4, .block = 4, .lq = {3, 2},
           .lk = {13, 6}, .quant = VQ_FLOAT | VQ_E5M2 << 2,
           .vscale = KS_TENSOR | 3 << 3);
    VARLEN("varlen-bad-scale-nan-paged", .B = 2, .hkv = 1, .group = 2,
           .form = 1, .block = 3, .lq = {2, 3}, .lk = {7, 5},
           .quant = VQ_E4M3, .bad = VBAD_NAN | VBAD_V, .bad_at = 9);
    VARLEN("varlen-bad-scale-zero-packed", .B = 2, .hkv = 2, .group = 1,
           .form = 0, .block = 2, .lq = {3, 4}, .lk = {5, 6}, .quant = VQ_I8,
           .kscale = KS_HEAD, .bad = VBAD_ZERO, .bad_at = 1);
    VARLEN("varlen-bad-scale-stride", .B = 2, .hkv = 1, .group = 1,
           .form = 1, .block = 2, .lq = {3, 4}, .lk = {5, 6},
           .quant = VQ_E5M2, .vscale = KS_NEGATIVE | 2 << 3);
    VARLEN("varlen-quant-no-scales", .B = 1, .hkv = 1, .group = 1,
           .form = 0, .block = 2, .lq = {3}, .lk = {5}, .quant = VQ_I8,
           .kscale = KS_NONE);
    /* Every mask kind at once: a [B, 1, Lq, Lk] keep-mask, a padded bias,
     * key lengths, bottom-right causal. */
    const mask_req all_masks = {M_KEEP | M_BIAS | M_LENGTHS,
                                MHA_CAUSAL_BOTTOM_RIGHT, {4, 0, 40},
                                {1, 13, 30, 0}, {0, 0}};
    const special sp[] = {{0, 3, SP_NAN, 0},     {1, 17, SP_INF, 0},
                          {2, 5, SP_NEG_NAN, 2}, {2, 40, SP_DENORM, 7},
                          {3, 2, SP_NEG_INF, 3}, {1, 9, SP_HUGE, 0}};
    const unsigned nsp = sizeof sp / sizeof sp[0];
    attention_seeds(&all_masks, sp, nsp);
    layer_seeds(&all_masks, sp, nsp);
    quantize_seeds();
    printf("wrote %d seeds to %s\n", written, out_dir);
    return 0;
}
