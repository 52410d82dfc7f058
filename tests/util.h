/* Shared by the Check suites: Check helpers, tensor layouts, the
 * attention checker. The support library (support.h) holds tolerances,
 * random data, ISA enumeration and the oracle. */
#ifndef MHA_TEST_UTIL_H
#define MHA_TEST_UTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "mha.h"
#include "support.h"

Suite *suite_oracle(void);
Suite *suite_attention(void);
Suite *suite_masks(void);
Suite *suite_layer(void);
Suite *suite_errors(void);
Suite *suite_threads(void);
Suite *suite_kernels(void);
Suite *suite_softmax(void);
Suite *suite_kernel_decode(void);
Suite *suite_decode(void);
Suite *suite_stress(void);
Suite *suite_api(void);
Suite *suite_terms(void);
Suite *suite_quant(void);
Suite *suite_varlen(void);
Suite *suite_compute(void);

/* An engine for isa with nthreads, or a test failure. */
mha_engine *make_engine(mha_isa isa, int nthreads);
/* The same for any configuration (its isa a table this CPU runs). */
mha_engine *make_engine_config(const mha_config *config);

/* (tests/emulated.c, test_mha only.) The engines a suite walks beyond
 * available_isas': 1 where the tests carry the AMX kernels over emulated
 * tiles (kernels/amxbf16/tiles.h) and the CPU runs avx512bf16 (the rest
 * of their table), else 0. Engine n_isas + i is make_emulated_engine's,
 * named EMULATED_ISA_NAME. */
int emulated_engines(void);
mha_engine *make_emulated_engine(int nthreads);
#define EMULATED_ISA_NAME "amxbf16 (emulated)"
/* Engine i of the walk over isas[0..n_isas) and then the emulated ones,
 * and its name. */
mha_engine *make_walk_engine(int i, const mha_isa *isas, int n_isas,
                             int nthreads);
const char *walk_isa_name(int i, const mha_isa *isas, int n_isas);

/* ---- Helpers beyond the skeleton. ----------------------------------- */

/* ck_assert_msg without Check's bookkeeping on success (it records the
 * location of every passing assertion through a pipe): for element loops. */
#define REQUIRE(cond, ...)              \
    do {                                \
        if (!(cond))                    \
            ck_abort_msg(__VA_ARGS__);  \
    } while (0)

/* n floats as dtype t (fp32, fp16 or bf16) in a test_alloc buffer: the
 * floats themselves, or their rounding to nearest even. */
void *as_dtype(const float *x, size_t n, mha_dtype t);
/* malloc that fails the test instead of returning NULL. */
void *test_alloc(size_t bytes);
/* n floats of rng_uniform, from test_alloc. */
float *random_floats(test_rng *r, size_t n);

/* Tensor layouts the tests build views in. The padded ones add prime
 * numbers of unused floats to every stride. */
typedef enum test_layout {
    LAYOUT_BSHD = 0,      /* packed [B, S, H, D] */
    LAYOUT_BHSD = 1,      /* packed [B, H, S, D] */
    LAYOUT_PAD_BSHD = 2,  /* [B, S, H, D] order, strides padded */
    LAYOUT_PAD_BHSD = 3,  /* [B, H, S, D] order, strides padded */
    LAYOUT_COUNT = 4
} test_layout;
const char *layout_name(test_layout layout);
/* Floats a view of the layout spans. */
size_t layout_floats(test_layout layout, int64_t b, int64_t s, int64_t h,
                     int64_t d);
mha_tensor layout_view(test_layout layout, float *data, int64_t b, int64_t s,
                       int64_t h, int64_t d);
/* Count the floats of buf[0, n) outside the view t (which must point into
 * buf) that no longer hold the sentinel. */
size_t count_changed_outside(const float *buf, size_t n, const mha_tensor *t);

/* Runs args (whose out view starts at a buffer of out_floats floats) on an
 * engine of every available ISA with nthreads and checks it against the
 * oracle: out within TOL_ATTN, out bytes outside the view untouched, rows
 * with every key masked exactly zero; with want_weights also the weights
 * (within TOL_ATTN, masked entries exactly zero, rows summing to 1 within
 * TOL_WEIGHT_SUM, or all zero when fully masked). args->weights is supplied
 * here. Failures name `what`. */
void check_attention(const mha_attention_args *args, size_t out_floats,
                     int want_weights, int nthreads, const char *what);
/* rows x lk weights of one run against the oracle's: within abs + rel,
 * exactly zero where the oracle's are, rows summing to the oracle's sum
 * (1, or less with a sink) within TOL_WEIGHT_SUM unless fully masked. */
void check_weights(const float *got, const double *want, int64_t rows,
                   int64_t lk, double abs, double rel, const char *what,
                   const char *isa);

/* n lse values against the oracle's: within TOL_LSE, -inf exactly where
 * the oracle's is -inf. */
void check_lse(const float *got, const double *want, size_t n,
               const char *what, const char *isa);

/* A layer call whose workspace reaches MHA_ALLOC_HUGE_BYTES, which the
 * layer keeps for its next call (engine/layer.c, ws_take): a
 * cross-attention of 3 queries (batch 1) over up to WS_KEYS * 5 / 4 keys
 * of E = 8, H = 2, projecting K and V into 2 x 16 MiB or more. */
#define WS_E 8
#define WS_KEYS ((int64_t)1 << 19)

typedef struct ws_layer {
    float w_in[3 * WS_E * WS_E], b_in[3 * WS_E], w_out[WS_E * WS_E];
    float b_out[WS_E], query[3 * WS_E];
    float *kv; /* [1, lk, E], key and value alike (test_alloc) */
    mha_layer_desc desc;
} ws_layer;

/* Random weights, query and lk keys (free f->kv after). */
void ws_layer_init(ws_layer *f, int64_t lk);

#endif
