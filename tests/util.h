/* Shared by the test suites: tolerances, random data, ISAs to test. */
#ifndef MHA_TEST_UTIL_H
#define MHA_TEST_UTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "mha.h"

/* ---- Tolerances: the one place they are stated. -------------------- */
/* mha_attention vs the double-precision oracle, unit-scale inputs:
 * |got - want| <= TOL_ATTN_ABS + TOL_ATTN_REL * |want|. */
#define TOL_ATTN_ABS 2e-5
#define TOL_ATTN_REL 1e-5
/* The layer vs the oracle (projections add O(E) rounding). */
#define TOL_LAYER_ABS 1e-4
#define TOL_LAYER_REL 1e-4
/* A SIMD kernel vs its generic twin (different summation order and exp
 * approximation): |got - want| <= TOL_KERNEL_ABS + TOL_KERNEL_REL*|want|,
 * where for a sum (qk, pv, linear) |want| is the sum of the absolute values
 * of its terms, the scale of its rounding error. */
#define TOL_KERNEL_ABS 1e-5
#define TOL_KERNEL_REL 1e-5
/* Every table's kernels vs plain double loops over the same float inputs
 * (depth up to 129, unit-scale data), measured the same way. */
#define TOL_REF_ABS 1e-5
#define TOL_REF_REL 1e-5
/* |sum_j weights[i][j] - 1| for a row that is not fully masked. */
#define TOL_WEIGHT_SUM 1e-5
/* Half-precision K/V against the oracle of the unrounded fp32 draws in
 * [-1, 1): the inputs moved by up to half a grid step (2^-11 for the
 * binary16 grid k/1024, 2^-8 for the bfloat16 grid k/128); the output, a
 * convex combination of V rows with weights perturbed through q.k/sqrt(d),
 * moves by at most a few such steps. */
#define TOL_F16_INPUT 2e-3
#define TOL_BF16_INPUT 2e-2
/* The oracle vs hand-computed values (float inputs such as log(3)). */
#define TOL_HAND 1e-6

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

/* Deterministic xorshift generator; uniform in [-1, 1). */
typedef struct { uint64_t s; } test_rng;
void rng_seed(test_rng *r, uint64_t seed);
float rng_uniform(test_rng *r);
void fill_uniform(test_rng *r, float *x, size_t n);

/* The ISAs this build and CPU can run (generic first); returns the count,
 * at most TEST_MAX_ISAS. */
#define TEST_MAX_ISAS 5
int available_isas(mha_isa out[TEST_MAX_ISAS]);
/* An engine for isa with nthreads, or a test failure. */
mha_engine *make_engine(mha_isa isa, int nthreads);

/* max |got - want| / (abs + rel*|want|) over n elements; <= 1 passes.
 * Reports the worst index through *worst when non-NULL. NaN gives +inf. */
double tol_ratio(const float *got, const double *want, size_t n, double abs,
                 double rel, size_t *worst);

/* ---- Helpers beyond the skeleton. ----------------------------------- */

/* ck_assert_msg without Check's bookkeeping on success (it records the
 * location of every passing assertion through a pipe): for element loops. */
#define REQUIRE(cond, ...)              \
    do {                                \
        if (!(cond))                    \
            ck_abort_msg(__VA_ARGS__);  \
    } while (0)

/* malloc that fails the test instead of returning NULL. */
void *test_alloc(size_t bytes);
/* n floats of rng_uniform, from test_alloc. */
float *random_floats(test_rng *r, size_t n);

/* Fill with a sentinel bit pattern (a signalling-looking NaN) and count the
 * floats that no longer hold it. */
#define TEST_SENTINEL_BITS 0x7fa5a5a5u
void fill_sentinel(float *x, size_t n);
size_t count_changed(const float *x, size_t n);

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
/* Copy a view into a packed [B, S, H, D] array. */
void view_gather(const mha_tensor *t, float *packed);
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
 * exactly zero where the oracle's are, rows summing to 1 (TOL_WEIGHT_SUM)
 * unless fully masked. */
void check_weights(const float *got, const double *want, int64_t rows,
                   int64_t lk, double abs, double rel, const char *what,
                   const char *isa);

#endif
