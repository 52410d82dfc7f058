/*
 * Shared by the errors suite's files: the valid attention and layer
 * fixtures that each bad-input row breaks in one way, and the checks of a
 * rejected call (status, a fresh message naming the field, untouched
 * outputs).
 */
#ifndef MHA_TEST_ERRORS_H
#define MHA_TEST_ERRORS_H

#include "util.h"

/* ---- mha_attention ---------------------------------------------------- */

enum { B = 2, LQ = 3, LK = 5, H = 4, HKV = 2, D = 8, DV = 6 };
#define N_Q (B * LQ * H * D)
#define N_K (B * LK * HKV * D)
#define N_V (B * LK * HKV * DV)
#define N_OUT (B * LQ * H * DV)
#define N_W (B * H * LQ * LK)

/* One arena holds q, k, v and out back to back, so overlaps are easy to
 * build; weights live apart. */
typedef struct fixture {
    float *arena, *q, *k, *v, *out, *w;
    uint8_t keep[B * LK];
    float bias[LQ * LK];
    int32_t lengths[B];
    mha_mask mask;
    mha_attention_args args;
} fixture;

void fixture_init(fixture *f);
void fixture_free(fixture *f);

/* ---- The layer -------------------------------------------------------- */

enum { LE = 8, LH = 2, LB = 2, LLQ = 3, LLK = 4 };
#define L_NQ (LB * LLQ * LE)
#define L_NK (LB * LLK * LE)
#define L_NW (LB * LH * LLQ * LLK)

typedef struct layer_fixture {
    float in_w[3 * LE * LE], in_b[3 * LE], out_w[LE * LE], out_b[LE];
    float *arena, *query, *key, *value, *out, *w;
    int32_t lengths[LB];
    mha_mask mask;
    mha_layer_desc desc;
} layer_fixture;

void layer_fixture_init(layer_fixture *f);
void layer_fixture_free(layer_fixture *f);

/* A stride whose product with any size above 1 overflows int64, or whose
 * byte count (times 4) does. */
#define HUGE_STRIDE ((int64_t)1 << 62)

/* ---- Checks of a rejected call ---------------------------------------- */

/* Leaves a known message for this thread, so a failing call that forgets
 * to record its own is caught: its message would still be this one. */
const char *prime_message(void);

/* 1 when msg names one of the '|'-separated fields: an occurrence not
 * inside a longer identifier (so "k" is not found in "mask"). */
int names_field(const char *msg, const char *fields);

/* The message of the call just made: not empty, not the primed one, and
 * naming `fields` (see names_field). */
void expect_message(const char *primed, const char *fields, const char *what);

/* The expectation of one bad-input row. */
typedef struct expectation {
    const char *name;
    mha_status want;
    const char *field; /* the message names it ('|': any of these) */
} expectation;

/* A rejected call: its status, its own message naming the field, and not
 * one byte written to the arena (`before` is its copy) or the weights. */
void expect_rejected(mha_status st, const expectation *e, mha_isa isa,
                     const char *primed, const void *before,
                     const void *arena, size_t arena_bytes,
                     const float *weights, size_t n_weights);

/* Adds the allocation-failure test (test_errors_alloc.c). */
void errors_add_allocation_tests(TCase *tc);
/* Adds mha_attention_varlen's bad-input rows (test_errors_varlen.c). */
void errors_add_varlen_tests(TCase *tc);

#endif
