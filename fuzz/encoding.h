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

/* Thread counts: valid ones, negative ones, one past MHA_MAX_THREADS.
 * The same byte's quotient by their number gives flush_subnormals (bit
 * 0), so codes below it (every seed before the flush) keep 0. */
int threads_of_code(unsigned code);
int flush_of_code(unsigned code);
unsigned threads_code(int threads);
unsigned engine_threads_code(int threads, int flush);

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

/* The score terms, lse and K/V scales of the attention case (fuzz/terms.c):
 * 14 bytes after the corruptions, so older inputs keep their meaning
 * (missing bytes read 0: no terms, no lse, no scales). In order: flags
 * (TF_*), oddities (TO_*, code % 8), window_left, window_right (EXT_*),
 * softcap (SOFTCAP_*, code % 16), ALiBi (AL_* | AV_* << 5), its bad index,
 * sinks (SV_*, code % 8), their bad index, key_offset (OFF_*), key_total
 * (TOT_*), k's and v's scales (SC_* | param << 3 | SCV_* << 5), their bad
 * index. */
enum { TF_TERMS = 1, TF_LSE = 2, TF_WINDOW = 4, TF_TOP_LEFT = 8,
       TF_ALIBI = 16, TF_SINKS = 32, TF_SHARD = 64, TF_SOFTCAP = 128 };
enum { TO_NONE, TO_WINDOW_2, TO_WINDOW_NEG, TO_ALIGN_2, TO_ALIGN_NEG };
/* Extents: a code below EXT_UNBOUNDED is the extent itself; codes past
 * EXT_INT64_MAX are -1 too (unbounded is common). */
enum { EXT_UNBOUNDED = 200, EXT_MINUS2, EXT_INT64_MIN, EXT_MINUS100,
       EXT_2_40, EXT_INT64_MAX };
enum { SOFTCAP_OFF, SOFTCAP_HALF, SOFTCAP_1, SOFTCAP_5, SOFTCAP_20,
       SOFTCAP_50, SOFTCAP_1E_30, SOFTCAP_1E30, SOFTCAP_FLT_MIN,
       SOFTCAP_DENORMAL, SOFTCAP_FLT_MAX, SOFTCAP_NAN, SOFTCAP_INF,
       SOFTCAP_MINUS1, SOFTCAP_NEG_ZERO, SOFTCAP_NEG_INF };
/* ALiBi row stride (bits 0-1; bits 2-4 a padding or the negative value)
 * and slope values (bits 5-7). */
enum { AL_BROADCAST, AL_PACKED, AL_PADDED, AL_NEGATIVE };
enum { AV_GEOMETRIC, AV_RANDOM, AV_LARGE, AV_TINY, AV_NAN, AV_INF };
enum { SV_RANDOM, SV_DOMINANT, SV_HUGE_NEG, SV_HUGE, SV_NAN, SV_INF,
       SV_NEG_INF };
/* key_offset: a code below OFF_1000 is the offset; past OFF_INT64_MIN,
 * code - OFF_SMALL. */
enum { OFF_1000 = 200, OFF_2_40, OFF_FAR, OFF_PAST_FAR, OFF_MINUS1,
       OFF_INT64_MIN, OFF_SMALL };
/* key_total: TOT_DEFAULT (0); codes 1..199 key_offset + Lk + code - 1;
 * past TOT_INT64_MAX, key_offset + Lk + 7 (code - TOT_WIDE). */
enum { TOT_DEFAULT = 0, TOT_SHORT = 200, TOT_ONE, TOT_MINUS1, TOT_FAR,
       TOT_PAST_FAR, TOT_INT64_MAX, TOT_WIDE };
/* Scale layouts (bits 0-2; SC_NEGATIVE's axis is param % 3; a float K/V
 * takes scales, refused, when param == 3) and values (bits 5-7; 0-3
 * unit-scale codes, then one bad scale at the bad index). */
enum { SC_NONE, SC_TENSOR, SC_HEAD, SC_ROW_BSH, SC_ROW_BHS, SC_ROW_PADDED,
       SC_BATCH, SC_NEGATIVE };
enum { SCV_UNIT, SCV_EXTREME = 4, SCV_ZERO, SCV_NAN, SCV_INF };

/* Scale layouts of an 8-bit K/V cache over its [batch (blocks), seq
 * (slots), heads] (kv_scale_strides in decode.c; the varlen and quantize
 * cases): code bits 0-2 a layout, bits 3-4 its parameter p. KS_TENSOR's p:
 * 0 one scale, 1 one per block (1, 0, 0), 2 rows sharing scales at
 * nonzero strides (H, 1, 1), 3 one per slot shared by every block
 * (0, 1, 0). KS_ROW_PADDED pads by p, KS_TOKEN's batch stride is S + p,
 * KS_NEGATIVE is KS_ROW_BSH with axis p % 3 at -(1 + p); KS_NONE gives no
 * scales (NULL data). */
enum { KS_ROW_BSH, KS_ROW_BHS, KS_ROW_PADDED, KS_HEAD, KS_TENSOR, KS_TOKEN,
       KS_NEGATIVE, KS_NONE };

/* The varlen case's 8-bit K/V (fuzz/varlen.c), 5 bytes after its data
 * seed (missing: float K/V as before). Quant byte: bits 0-1 k's dtype
 * (VQ_*: VQ_FLOAT keeps the float dtype of the dtype byte), bits 2-3 v's
 * (VQ_FLOAT: as k). Then k's and v's scale layouts (KS_*), the bad-scale
 * byte (bits 0-2 VBAD_*, below VBAD_ZERO none; bit 3 v, else k) and its
 * index among the scales the call reads. */
enum { VQ_FLOAT, VQ_I8, VQ_E4M3, VQ_E5M2 };
enum { VBAD_ZERO = 5, VBAD_NAN, VBAD_INF, VBAD_V = 8 };

/* The quantize case (fuzz/quantize.c): mha_quantize, or with QF_PAGED
 * mha_quantize_paged. Flags: QF_*. Scale values (given scales): bits 0-2
 * QV_* (below QV_EXTREME unit scales), QV_UNREAD (bit 3): a bad value goes
 * to a scale no written slot reads (paged: accepted). Source values:
 * bits 0-2 a magnitude (QM_*), bits 3-4 a special row (QR_*), QM_TIES
 * (bit 5): midpoints between codes at power-of-two given scales. Faults:
 * two bytes of Q_* (codes past Q_FAULTS: none). Aliases: QA_*. Slots: one
 * byte a token, below QS_MINUS1 code % slots, then QS_*. */
enum { QF_PAGED = 1, QF_COMPUTED = 2, QF_SCALES_IS_OUT = 4, QF_JUNK = 8 };
enum { QV_UNIT, QV_EXTREME = 4, QV_ZERO, QV_NAN, QV_INF, QV_UNREAD = 8 };
enum { QM_UNIT, QM_SMALL = 2, QM_LARGE, QM_SUBNORMAL, QM_HUGE, QM_WIDE,
       QM_INTEGER };
enum { QR_NONE, QR_ZERO, QR_NONFINITE, QR_ONE_HUGE };
enum { QM_TIES = 32 };
enum { Q_NONE, Q_NULL_SRC, Q_NULL_DST, Q_NULL_SRC_DATA, Q_NULL_DST_DATA,
       Q_NULL_SLOTS, Q_NULL_SCALES, Q_OTHER_SCALES, Q_SRC_F16,
       Q_SRC_DTYPE_BAD, Q_DST_F32, Q_DST_DTYPE_BAD, Q_DIM, Q_HEADS, Q_SEQ,
       Q_ZERO, Q_NEG_DIM, Q_NEG_STRIDE, Q_NEG_SRC_STRIDE, Q_OVERFLOW,
       Q_SLOT_PAST, Q_FAULTS };
enum { QA_NONE, QA_DST_IN_SRC, QA_SCALES_IN_SRC, QA_SCALES_IN_DST,
       QA_SLOTS_IN_POOL, QA_SLOTS_IN_SCALES, QA_ALIASES };
enum { QS_MINUS1 = 200, QS_INT64_MIN, QS_PAST, QS_INT64_MAX, QS_LAST,
       QS_MINUS2, QS_ROTATE };

#endif
