/* The NEON matmul core every NEON kernel builds on. Internal to
 * kernels/neon/. */
#ifndef MK_NEON_GEMM_H
#define MK_NEON_GEMM_H

#include <stddef.h>
#include <stdint.h>

/* Rows and columns of the register tile; a packed right-hand side comes in
 * panels of MK_NEON_NR columns. */
#define MK_NEON_MR 8
#define MK_NEON_NR 8

/* c[i][j] = init + sum_{p<k} a[i][p] * b(p, j) (+ bias[j]) for i < m,
 * j < n, each element one chain of fused multiply-adds in order of p, where
 * init is 0 when c_scale is NULL and c_scale[i] * c[i][j] otherwise, and
 * bias (optional) is added after the sum. b(p, j) sits at
 * b[(j / NR) * b_panel + p * ldb + j % NR]: a row-major matrix is ldb = its
 * row stride, b_panel = NR; a packed one (mk_neon_pack) is ldb = NR,
 * b_panel = k * NR. Reads no element of b outside those addresses. */
void mk_neon_gemm_8x8(int64_t m, int64_t n, int64_t k, const float *a,
                      ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                      ptrdiff_t b_panel, const float *c_scale,
                      const float *bias, float *c, ptrdiff_t ldc);

/* Packs the transpose of x (n rows of depth k, row stride ldx) into panels
 * of NR columns: panel q holds x[q*NR + j][p] at q*k*NR + p*NR + j, with
 * zeros past n. Needs mk_neon_packed_floats(n, k) floats. */
void mk_neon_pack(const float *x, ptrdiff_t ldx, int64_t n, int64_t k,
                         float *packed);
size_t mk_neon_packed_floats(int64_t n, int64_t k);

#endif
