/*
 * The attention case's score terms (mha_score_terms), lse output and 8-bit
 * K/V scales (fuzz/terms.c): decoded from the bytes after the corruptions
 * (encoding.h, TF_* and on), modelled against engine/validate.c's rules
 * (check_terms, check_scales, mha_check_outputs) and handed to the oracle
 * through args.terms, args.lse and the tensors' scales. A separate file so
 * the rest of the target only calls a few hooks.
 */
#ifndef MHA_FUZZ_TERMS_H
#define MHA_FUZZ_TERMS_H

#include "fuzz.h"

typedef struct {
    unsigned flags, odd, wl, wr, softcap, alibi, alibi_at, sinks, sinks_at,
        koff, ktotal, scale[2], scale_at;
} terms_request;

/* Buffers: k's and v's scales, ALiBi slopes, sinks, lse. */
enum { TB_KSCALE, TB_VSCALE, TB_ALIBI, TB_SINKS, TB_LSE, NTBUF };

typedef struct {
    terms_request r;
    mha_score_terms terms;
    int use_terms, want_lse;
    int scaled[2];  /* k, v carry scales */
    int unreadable; /* an array the library reads is beyond the budget */
    buffer buf[NTBUF];
} terms_case;

void parse_terms(byte_reader *in, terms_case *tc, attention_case *c);
void terms_model(terms_case *tc, const attention_case *c, fault_list *f,
                 int *huge);
void terms_link(terms_case *tc, attention_case *c, fault_list *f);
void terms_snapshot(terms_case *tc);
void terms_check_unchanged(const terms_case *tc, int failed);
void terms_free(terms_case *tc);
void terms_describe(const terms_case *tc, const attention_case *c);

/* The scales an 8-bit view reads: scale_rows of them, a zero stride
 * collapsing its axis to one row, and row r at scale_row_at (an index
 * into t->scales.data). One walk for the model's check and the oracle's
 * range. */
int64_t scale_rows(const mha_tensor *t);
int64_t scale_row_at(const mha_tensor *t, int64_t r);

/* For the oracle: the mask with its causal flag cleared when terms move
 * the key positions (terms_hidden applies it then), ... */
const mha_mask *terms_key_mask(const mha_mask *m, const mha_score_terms *t,
                               mha_mask *tmp);
/* ... key j hidden from query i by the shifted causal mask or the
 * window, ... */
int terms_hidden(const mha_mask *m, const mha_score_terms *t, int64_t i,
                 int64_t j, int64_t Lq, int64_t Lk);
/* ... and |ALiBi's term| at (b, h, i, j), a magnitude the float scores
 * round. */
double terms_alibi_mag(const mha_score_terms *t, int64_t b, int64_t h,
                       int64_t i, int64_t j, int64_t Lq, int64_t Lk);

#endif
