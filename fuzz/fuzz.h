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
 * functions name each byte, encoding.h holds the byte codes, and
 * fuzz/seeds.c writes the seed corpus from the same codes.
 *
 * Files: decode.c (input decoding), model.c (the validity model),
 * expect.c (the oracle, over the support library's), buffers.c (buffers,
 * the engine, reporting), cases.c (the attention and layer cases and the
 * entry point), varlen.c (the continuous-batch case, its own model and
 * checks), quantize.c (mha_quantize and mha_quantize_paged against a
 * reference encoder). This header is what they share.
 */
#ifndef MHA_FUZZ_H
#define MHA_FUZZ_H

#include <float.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "encoding.h"
#include "mha.h"
#include "support.h" /* tolerances, random fill, sentinels, gathers */

/* Budgets that keep one input in the millisecond range. */
#define MAX_ELEMS ((int64_t)1 << 16)   /* elements of one buffer */
#define MAX_LOGICAL ((int64_t)1 << 18) /* logical elements of one view */
#define MAX_WORK ((int64_t)1 << 21)    /* multiply-adds of the oracle */

#define UNIT_ROUNDOFF (FLT_EPSILON / 2)

/* Set to 1 to require that a NaN or infinity in V at a masked key never
 * reaches an output (the kernels compute 0 * v for masked keys inside a
 * key block that has visible ones, so today it may). */
#ifndef STRICT_MASKED_V
#define STRICT_MASKED_V 0
#endif

typedef __int128 wide;
#define WIDE_CAP ((wide)1 << 100) /* saturation of extent arithmetic */

/* Reporting: the request of the current input, the element that broke the
 * contract, FUZZ_VERBOSE. */
extern char context[768];
/* The current engine flushes subnormals (make_engine). */
extern int engine_flush;
extern char detail[256];
extern int verbose;

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

/* What the inputs turned into; FUZZ_STATS=1 prints it at exit. */
enum { S_ATTN_OK, S_ATTN_FAULT, S_ATTN_SKIP, S_CREATE_FAULT, S_LAYER_OK,
       S_LAYER_FAULT, S_LAYER_SKIP, S_NAN, S_ZERO_ROW, S_QUANT_OK,
       S_QUANT_FAULT, NSTATS };
extern long stats[NSTATS];

typedef struct {
    const uint8_t *p;
    size_t n;
} byte_reader;

typedef struct {
    char *base; /* malloc'd; data is base or base + 4 */
    char *data;
    size_t bytes; /* usable from data */
    char *copy;   /* the bytes before the call */
} buffer;

typedef struct {
    int n;
    mha_status status[24];
    const char *why[24];
    /* A valid request the library may still refuse with this status (an
     * interleaved output layout it cannot prove free of overlap); 0: none. */
    mha_status may_refuse;
} fault_list;

/* Bytes: presence bits, causal, keep (mode, pad, density), bias (mode,
 * pad, -inf density, magnitude), lengths (mode, bad value). */
typedef struct {
    unsigned present, causal, keep_mode, keep_pad, keep_density;
    unsigned bias_mode, bias_pad, bias_ninf, bias_scale, len_mode, len_bad;
} mask_request;

/* The mask's buffers (keep, bias, lengths) and their faults. */
typedef struct {
    int use, keep, bias, lengths;
    buffer buf[3];
    int lengths_unreadable; /* B too large to give real lengths */
} mask_buffers;

/* 33 bytes: a count, then 8 injections of 4 bytes each: target (q, k, v
 * or bias; query, key, value or bias for the layer), index (2 bytes), and
 * value class with a run length. */
typedef struct {
    unsigned count;
    uint8_t at[8][4];
} special_request;

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

typedef struct {
    int64_t B, Lq, Lk, H, Hkv, d, dv;
    const double *q, *k, *v; /* packed [B, L, heads, dim] */
    const mha_mask *mask;    /* NULL: none (validated otherwise) */
    double scale;
    double mag_unit; /* largest |score| the tolerances are stated for */
    double tol_abs;  /* for |v| <= 1; it grows with larger values */
    const mha_score_terms *terms; /* NULL: none (terms.c) */
    want *lse;                    /* [B, H, Lq] wanted, or NULL */
    /* A flushing engine (expect.c, flush_slack): q, k, v hold the
     * subnormal-free inputs; K's scales span [sk_lo, sk_hi] (1, 1 for a
     * float K) and its codes reach code_max (0 for a float K). */
    int flush;
    double sk_lo, sk_hi, code_max;
} oracle_problem;

enum { KEY_HIDDEN, KEY_NEG_INF, KEY_VISIBLE };

enum { T_Q, T_K, T_V, T_OUT };
extern const char *const tensor_names[4];

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

/* The forward call's pointers, after aliasing. */
typedef struct {
    const float *query, *key, *value;
    float *out, *weights;
} layer_pointers;

unsigned take8(byte_reader *in);
uint32_t take32(byte_reader *in);
uint64_t take64(byte_reader *in);
int64_t take_wild(byte_reader *in);
unsigned take_corruption_count(byte_reader *in);
void parse_mask(byte_reader *in, mask_request *r);
void mask_strides(unsigned mode, unsigned pad, int64_t H, int64_t Lq,
                  int64_t Lk, int64_t s[3]);
void build_mask(const mask_request *r, int64_t H, int64_t Lq, int64_t Lk,
                mha_mask *m);
void mask_presence(const mask_request *r, mask_buffers *mb);
void parse_specials(byte_reader *in, special_request *r);
void layout_strides(byte_reader *in, mha_tensor *t);
float take_scale(byte_reader *in, int64_t d);
void corrupt_attention(byte_reader *in, attention_case *c);
void corrupt_layer(byte_reader *in, layer_case *c);
wide span_elems(const int64_t *size, const int64_t *stride, int n);
wide tensor_span(const mha_tensor *t);
wide product(const int64_t *f, int n);
size_t alloc_bytes(wide elems, size_t elem, int *huge);
void add_fault(fault_list *f, mha_status st, const char *why);
int expected_status(const fault_list *f);
void check_status_known(mha_status st);
void check_failure(mha_status st, const fault_list *f, int huge);
int self_overlapping(const mha_tensor *t);
int nested(const mha_tensor *t);
wide mask_span(const int64_t st[3], int64_t B, int64_t H, int64_t Lq,
               int64_t Lk);
void keep_strides(const mha_mask *m, int64_t s[3]);
void bias_strides(const mha_mask *m, int64_t s[3]);
void mask_faults(mask_buffers *mb, const mha_mask *m, int64_t B, int64_t H,
                 int64_t Lq, int64_t Lk, fault_list *f, int *huge);
void length_faults(const mask_buffers *mb, const mha_mask *m, int64_t B,
                   int64_t Lk, fault_list *f);
int mask_aliased(int alias, const mask_buffers *mb);
int check_call(mha_status st, fault_list *f, int huge, const buffer *bufs,
               int n, const mask_buffers *mb);
void attention_model(attention_case *c, const mha_engine *engine,
                     fault_list *f, int *huge);
int64_t eff_kdim(const mha_layer_desc *d);
int64_t eff_vdim(const mha_layer_desc *d);
void layer_create_model(layer_case *c, const mha_engine *engine, fault_list *f,
                        int *huge);
void layer_forward_model(layer_case *c, fault_list *f, int *huge);
int flag_of(double x);
int flag_of_row(const double *x, int64_t n);
int key_class(const mha_mask *m, int64_t b, int64_t h, int64_t i, int64_t j,
              int64_t Lq, int64_t Lk, double *bias);
void oracle(const oracle_problem *p, want *out, want *weights);
void check_value(const want *w, const float *at, double tol_abs,
                 double tol_rel, const char *what, long long index);
void check_attention_outputs(const attention_case *c);
double *project(const float *x, int64_t rows, int64_t in, const float *w,
                const float *bias, int64_t out);
void check_layer_outputs(const layer_case *c, const layer_pointers *lp);
void print_stats(void);
void announce(void);
void violated(const char *what, int line);
void buffer_alloc(buffer *b, size_t bytes, size_t pad);
void buffer_snapshot(buffer *b);
int buffer_unchanged(const buffer *b);
void buffer_free(buffer *b);
void buffer_fill_sentinel(buffer *b);
void alloc_mask(const mha_mask *m, mask_buffers *mb, int64_t B, int64_t H,
                int64_t Lq, int64_t Lk, unsigned misalign);
void fill_mask(const mask_request *r, mask_buffers *mb, int64_t Lk,
               uint64_t seed);
void link_mask(mask_buffers *mb, mha_mask *m);
void grow_for_mask_alias(int alias, const mask_buffers *mb, buffer *out);
void alias_mask_into(int alias, const mask_buffers *mb, mha_mask *m,
                     void *out);
void inject_specials(const special_request *r, buffer *const targets[4],
                     const mha_dtype dtypes[4]);
void fill_values(buffer *b, mha_dtype dtype, uint64_t seed);
void snapshot_all(buffer *bufs, int n, mask_buffers *mb);
mha_engine *make_engine(byte_reader *in, char *desc, size_t n);
void describe_tensor(char *s, size_t n, const char *name, const mha_tensor *t);
void describe_attention(const attention_case *c, const char *engine,
                        const fault_list *f, int huge);
void fit_attention(int64_t B, int64_t H, int64_t Hkv, int64_t *Lq, int64_t *Lk,
                   int64_t *d, int64_t *dv);
void alloc_attention(attention_case *c);
void link_attention(attention_case *c);
void fuzz_attention(byte_reader *in, mha_engine *engine,
                    const char *engine_desc);
void fit_layer(layer_case *c);
void describe_layer(const layer_case *c, const char *engine, const char *stage,
                    const fault_list *f, int huge);
void alloc_layer(layer_case *c);
layer_pointers link_layer(layer_case *c);
void free_layer_case(layer_case *c);
void fuzz_layer(byte_reader *in, mha_engine *engine, const char *engine_desc);
/* varlen.c: one mha_attention_varlen request (packed or paged keys). */
void fuzz_varlen(byte_reader *in, mha_engine *engine, const char *engine_desc);
/* quantize.c: one mha_quantize or mha_quantize_paged request. */
void fuzz_quantize(byte_reader *in, const char *engine_desc);
int kv_scale_strides(unsigned code, int64_t S, int64_t H, int64_t st[3]);
/* 1 for MHA_I8, MHA_FP8_E4M3 and MHA_FP8_E5M2; their largest code's
 * value (127, 448, 57344). */
int is_q8_dtype(mha_dtype dt);
double q8_max(mha_dtype dt);
/* A finite code of an 8-bit dtype from random bits: their top byte, a
 * NaN or infinity code moved to the finite code one exponent step below. */
uint8_t finite_code(mha_dtype dt, uint64_t bits);
size_t elem_size(mha_dtype t);

#endif
