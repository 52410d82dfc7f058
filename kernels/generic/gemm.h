/* The portable matmul core every generic kernel builds on. */
#ifndef MK_GENERIC_GEMM_H
#define MK_GENERIC_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* Columns per panel of a packed right-hand side. */
#define MK_GENERIC_NR 16

/* c[i][j] = init + sum_{p<k} a[i][p] * b(p, j) for i < m, j < n, summed in
 * order of p, where init is 0 when c_scale is NULL and c_scale[i] * c[i][j]
 * otherwise. b(p, j) sits at b[(j / NR) * b_panel + p * ldb + j % NR]:
 * a row-major matrix is ldb = its row stride, b_panel = NR; a packed one
 * (mk_generic_pack) is ldb = NR, b_panel = k * NR. */
void mk_generic_gemm_4x16(int64_t m, int64_t n, int64_t k, const float *a,
                          ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                          ptrdiff_t b_panel, const float *c_scale, float *c,
                          ptrdiff_t ldc);

/* mk_generic_pack (gemm.c, the table's pack) packs the transpose of x
 * (n rows of depth k, row stride ldx) into panels of NR columns: panel q
 * holds x[q*NR + j][p] at q*k*NR + p*NR + j, with zeros past n, in
 * mk_generic_packed_floats(n, k) floats. */

#endif
