/*
 * What the kernel suites (test_kernels.c, test_softmax.c,
 * test_kernel_decode.c) share: the tables under test, sentinel-filled
 * outputs, checks against a double reference (TOL_REF) and against the
 * generic table's float result (TOL_KERNEL), the edge shapes, and the
 * double references of a matmul and of the half-precision types.
 *
 * For sums the relative tolerance applies to the sum of the absolute
 * values of the terms, the scale of the rounding error. Outputs start
 * sentinel-filled: bytes a kernel must not write (row padding, past the
 * end) are checked untouched.
 */
#ifndef MHA_TEST_KERNEL_CHECK_H
#define MHA_TEST_KERNEL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "util.h"

/* The tables of the ISAs the tests run: t[0] is generic. */
typedef struct table_set {
    int n;
    mha_isa isa[TEST_MAX_ISAS];
    mk_table t[TEST_MAX_ISAS];
} table_set;

/* Fills ts through mha_dispatch (available_isas: generic first) and checks
 * that every slot is set and named. */
void get_tables(table_set *ts);

/* A sentinel-filled buffer of n floats plus a guard zone of GUARD. */
#define GUARD 19
float *out_buffer(size_t n);

/* What a failure names. */
typedef struct expect {
    const char *kernel, *isa, *against;
    char shape[160];
} expect;

/* m x n results at stride ld in buf against want with error scale mag:
 * |got - want| <= abs + rel * mag; where exact[i*n + j] is set, bitwise
 * (NaN matches NaN). Padding columns and the guard must hold the
 * sentinel. */
void expect_matrix(const expect *e, const float *buf, int64_t m, int64_t n,
                   ptrdiff_t ld, const double *want, const double *mag,
                   const unsigned char *exact, double abs, double rel);
/* expect_matrix against the double reference (TOL_REF) and, for a table
 * other than generic, against generic's float result gen (TOL_KERNEL). */
void expect_both(expect *e, int is_generic, const float *got,
                 const float *gen, int64_t m, int64_t n, ptrdiff_t ld,
                 const double *want, const double *mag,
                 const unsigned char *exact);
/* x (m x n at stride ld) as a dense m x n array of double. */
double *widen_floats(const float *x, int64_t m, int64_t n, ptrdiff_t ld);

#define N_DEPTHS 5
extern const int64_t DEPTHS[N_DEPTHS]; /* 1, 3, 17, 64, 129 */

/* 1, block - 1, block, block + 1, 2 * block + 3. */
void edge_sizes(int64_t block, int64_t out[5]);
/* fn on every (m, n) of the first count edge sizes of every table's
 * block_q x block_k. */
typedef void (*tile_fn)(const table_set *ts, int64_t m, int64_t n,
                        test_rng *r);
void for_edge_tiles(int count, tile_fn fn, uint64_t seed);

/* want = init + A B in double, A[i][p] = a[i*lda + p], B[p][j] =
 * b[p*b_pstride + j*b_jstride]; mag = |init| + sum |terms|. init may be
 * NULL (zeros) or want itself. */
void ref_gemm(int64_t m, int64_t n, int64_t k, const float *a,
              ptrdiff_t lda, const double *b, ptrdiff_t b_pstride,
              ptrdiff_t b_jstride, const double *init, double *want,
              double *mag);

/* want (m x dv) = alpha[i] o0[i][c] + sum_j p[i][j] V[j][c] in double, V
 * (n x dv) given widened; mag as ref_gemm's. */
void ref_pv(int64_t m, int64_t n, int64_t dv, const float *p, ptrdiff_t ldp,
            const double *vd, const float *alpha, const float *o0,
            ptrdiff_t ldo, double *want, double *mag);

/* binary16 / bfloat16 bits as fp32, computed from the definition. */
float ref_f16(uint16_t h);
float ref_bf16(uint16_t h);

#endif
