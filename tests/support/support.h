/*
 * The support library of the tests, the fuzz target and the benchmark's
 * self check: tolerances, random data, sentinels, ISA enumeration, strided
 * views gathered into packed arrays, reference half-precision decoders.
 * Plain C11 on the public API only (no Check, no engine internals); the
 * double-precision oracle is in oracle.h.
 */
#ifndef MHA_SUPPORT_H
#define MHA_SUPPORT_H

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
/* A row's log-sum-exp (the lse output, mha_merge_states) vs the oracle:
 * fp32 sums of exp and one logf. */
#define TOL_LSE_ABS 1e-5
#define TOL_LSE_REL 1e-5
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
/* The benchmark's OpenBLAS baseline vs mha_attention: both are float, the
 * baseline sums in a different order and uses libm's expf. */
#define TOL_BLAS_ABS 1e-4
#define TOL_BLAS_REL 1e-4

/* ---- Random data ------------------------------------------------------ */

/* Deterministic xorshift generator; uniform in [-1, 1). */
typedef struct { uint64_t s; } test_rng;
void rng_seed(test_rng *r, uint64_t seed);
uint64_t rng_next(test_rng *r);
float rng_uniform(test_rng *r);
void fill_uniform(test_rng *r, float *x, size_t n);

/* ---- Sentinels: outputs a call must not write ------------------------ */

/* Fill with a sentinel bit pattern (a signalling-looking NaN) and count the
 * floats that no longer hold it. */
#define TEST_SENTINEL_BITS 0x7fa5a5a5u
void fill_sentinel(float *x, size_t n);
int is_sentinel(const float *x);
size_t count_changed(const float *x, size_t n);

/* ---- ISAs ------------------------------------------------------------- */

/* The most ISAs mha_isas() may list for these helpers. */
#define TEST_MAX_ISAS 16
/* The ISAs of mha_isas() that mha_isa_available() says run here, generic
 * first, then in mha_isas() order; returns the count. Aborts (with a
 * message) if mha_isas() lists more than TEST_MAX_ISAS. */
int available_isas(mha_isa out[TEST_MAX_ISAS]);
/* The ISAs of mha_isas() that do not run here (build or CPU). */
int missing_isas(mha_isa out[TEST_MAX_ISAS]);
/* "ISAs run: generic avx2; not on this CPU: avx512 neon" into buf. */
void describe_isas(char *buf, size_t n);

/* ---- Views and half precision ---------------------------------------- */

/* Decoders written from the bit layouts, independent of the library's
 * conversions (which the tests check against them). Exact. */
double ref_f16_to_double(uint16_t h);
double ref_bf16_to_double(uint16_t h);

/* The OCP fp8 formats (every code: NaN, E5M2's infinities), and any
 * quantised dtype's code at x, unscaled. Exact. */
double ref_fp8_e4m3_to_double(uint8_t x);
double ref_fp8_e5m2_to_double(uint8_t x);
double ref_code_to_double(mha_dtype t, const void *x);
/* The scale of row (b, s, h) of a quantised view. */
double view_scale(const mha_tensor *t, int64_t b, int64_t s, int64_t h);

/* Element (b, s, h, c) of a view, any dtype, as a double (a quantised
 * element dequantised: code x its row's scale, exact in double). */
double view_element(const mha_tensor *t, int64_t b, int64_t s, int64_t h,
                    int64_t c);
/* Copy an fp32 view into a packed [B, S, H, D] float array. */
void view_gather(const mha_tensor *t, float *packed);
/* Copy a view of any dtype into a packed [B, S, H, D] double array
 * (half-precision elements through the reference decoders). */
void view_gather_double(const mha_tensor *t, double *packed);

/* max |got - want| / (abs + rel*|want|) over n elements; <= 1 passes.
 * Reports the worst index through *worst when non-NULL. NaN gives +inf. */
double tol_ratio(const float *got, const double *want, size_t n, double abs,
                 double rel, size_t *worst);

#endif
