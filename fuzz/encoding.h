/*
 * The byte codes of the fuzz target's input, shared by the decoder
 * (decode.c, cases.c) and the seed writer (seeds.c), so that a seed asks
 * for exactly what its name says. Each table maps a code (a byte, taken
 * modulo the table's size) to a value; the *_code functions map back.
 *
 * ISA codes follow mha_isas(): 0 is MHA_ISA_AUTO, 1..n the ISAs it lists
 * in its order, then values no listed ISA has (one past the largest listed
 * value, negative, huge), then "config NULL". Nothing here knows an ISA's
 * number.
 */
#ifndef MHA_FUZZ_ENCODING_H
#define MHA_FUZZ_ENCODING_H

#include <stdint.h>

#include "mha.h"

/* Values of an ISA code past the listed ISAs. */
typedef enum {
    ISA_PAST_LAST,  /* one past the largest value mha_isas() lists */
    ISA_NEGATIVE,   /* -1 */
    ISA_HUGE,       /* 1000 */
    ISA_INT_MIN,    /* INT_MIN */
    ISA_NULL_CONFIG, /* no config at all (mha_engine_create(NULL, ...)) */
    ISA_SPECIALS
} isa_special;

unsigned isa_code_count(void);
/* The ISA of a code; *null_config is set for ISA_NULL_CONFIG. */
mha_isa isa_of_code(unsigned code, int *null_config);
/* 1 when isa is MHA_ISA_AUTO or listed by mha_isas(). */
int isa_is_valid(mha_isa isa);
unsigned isa_code(mha_isa isa);            /* AUTO or a listed ISA */
unsigned isa_special_code(isa_special s);

/* Thread counts: valid ones, negative ones, one past MHA_MAX_THREADS. */
int threads_of_code(unsigned code);
unsigned threads_code(int threads);

mha_dtype dtype_of(unsigned code); /* 3 bits */
unsigned dtype_code(int dtype);
mha_causal causal_of(unsigned code);
unsigned causal_code(int causal);

/* Sequence lengths: 1..24, then 25 + 6k (past the largest key block). */
int64_t seq_of(unsigned code);
unsigned seq_code(int64_t seq);

/* Sizes, strides and other int64 fields a corruption overwrites: a table
 * of boundary values, small numbers, or (codes from WILD_RAW) 8 raw
 * bytes. */
#define WILD_RAW 250
extern const int64_t wild_values[];
extern const unsigned n_wild_values;
int64_t wild_of_code(unsigned code); /* codes below WILD_RAW */
unsigned wild_code(int64_t value);    /* a table value */

/* Special values injected into inputs, by class (fp32, binary16,
 * bfloat16 forms of each class). */
enum { SPECIAL_CLASSES = 12 };
extern const float special_values[SPECIAL_CLASSES];
extern const uint16_t special_f16[SPECIAL_CLASSES];
extern const uint16_t special_bf16[SPECIAL_CLASSES];
enum { SP_NAN, SP_NEG_NAN, SP_INF, SP_NEG_INF, SP_DENORM_MIN, SP_DENORM,
       SP_NEG_DENORM, SP_NEG_ZERO, SP_HUGE, SP_NEG_FLT_MAX, SP_FLT_MAX,
       SP_ZERO };

#endif
