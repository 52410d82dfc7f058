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
 * approximation): |got - want| <= TOL_KERNEL_ABS + TOL_KERNEL_REL*|want|. */
#define TOL_KERNEL_ABS 1e-5
#define TOL_KERNEL_REL 1e-5

Suite *suite_oracle(void);
Suite *suite_attention(void);
Suite *suite_masks(void);
Suite *suite_layer(void);
Suite *suite_errors(void);
Suite *suite_threads(void);
Suite *suite_kernels(void);

/* Deterministic xorshift generator; uniform in [-1, 1). */
typedef struct { uint64_t s; } test_rng;
void rng_seed(test_rng *r, uint64_t seed);
float rng_uniform(test_rng *r);
void fill_uniform(test_rng *r, float *x, size_t n);

/* The ISAs this build and CPU can run (generic first); returns the count. */
int available_isas(mha_isa out[4]);
/* An engine for isa with nthreads, or a test failure. */
mha_engine *make_engine(mha_isa isa, int nthreads);

/* max |got - want| / (abs + rel*|want|) over n elements; <= 1 passes.
 * Reports the worst index through *worst when non-NULL. NaN gives +inf. */
double tol_ratio(const float *got, const double *want, size_t n, double abs,
                 double rel, size_t *worst);

#endif
