/* Portable matmul: 4x16 register tile written so compilers vectorise the
 * 16-wide column loop. Every element is accumulated in order of p from its
 * init value, whatever tile path computes it (the determinism contract). */
#include "gemm.h"
#include "generic.h"

#include <assert.h>

#define MR 4
#define NR MK_GENERIC_NR

static void tile_full(int64_t k, const float *a, ptrdiff_t lda,
                      const float *b, ptrdiff_t ldb, float acc[MR][NR])
{
    /* Four named row accumulators keep the compiler on the column loop:
     * each p step is a broadcast of a[r][p] times one row of b. */
    float c0[NR], c1[NR], c2[NR], c3[NR];
    for (int j = 0; j < NR; j++) {
        c0[j] = acc[0][j], c1[j] = acc[1][j];
        c2[j] = acc[2][j], c3[j] = acc[3][j];
    }
    const float *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
    for (int64_t p = 0; p < k; p++) {
        const float *bp = b + p * ldb;
        float x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
        for (int j = 0; j < NR; j++) {
            float bj = bp[j];
            c0[j] += x0 * bj;
            c1[j] += x1 * bj;
            c2[j] += x2 * bj;
            c3[j] += x3 * bj;
        }
    }
    for (int j = 0; j < NR; j++) {
        acc[0][j] = c0[j], acc[1][j] = c1[j];
        acc[2][j] = c2[j], acc[3][j] = c3[j];
    }
}

static void tile_edge(int64_t mr, int64_t nr, int64_t k, const float *a,
                      ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                      float acc[MR][NR])
{
    for (int64_t p = 0; p < k; p++) {
        const float *bp = b + p * ldb;
        for (int64_t r = 0; r < mr; r++) {
            float ar = a[r * lda + p];
            for (int64_t j = 0; j < nr; j++)
                acc[r][j] += ar * bp[j];
        }
    }
}

void mk_generic_gemm_4x16(int64_t m, int64_t n, int64_t k, const float *a,
                          ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                          ptrdiff_t b_panel, const float *c_scale, float *c,
                          ptrdiff_t ldc)
{
    assert(m >= 0 && n >= 0 && k >= 0);
    for (int64_t i0 = 0; i0 < m; i0 += MR) {
        int64_t mr = m - i0 < MR ? m - i0 : MR;
        for (int64_t j0 = 0; j0 < n; j0 += NR) {
            int64_t nr = n - j0 < NR ? n - j0 : NR;
            float acc[MR][NR] = {{0}};
            float *ct = c + i0 * ldc + j0;
            if (c_scale)
                for (int64_t r = 0; r < mr; r++)
                    for (int64_t j = 0; j < nr; j++)
                        acc[r][j] = c_scale[i0 + r] * ct[r * ldc + j];
            const float *at = a + i0 * lda;
            const float *bt = b + (j0 / NR) * b_panel;
            if (mr == MR && nr == NR)
                tile_full(k, at, lda, bt, ldb, acc);
            else
                tile_edge(mr, nr, k, at, lda, bt, ldb, acc);
            for (int64_t r = 0; r < mr; r++)
                for (int64_t j = 0; j < nr; j++)
                    ct[r * ldc + j] = acc[r][j];
        }
    }
}

size_t mk_generic_packed_floats(int64_t n, int64_t k)
{
    return (size_t)((n + NR - 1) / NR) * NR * (size_t)k;
}

void mk_generic_pack(const float *x, ptrdiff_t ldx, int64_t n,
                            int64_t k, float *packed)
{
    assert(n >= 0 && k >= 0);
    for (int64_t j0 = 0; j0 < n; j0 += NR) {
        float *panel = packed + (j0 / NR) * k * NR;
        int64_t nr = n - j0 < NR ? n - j0 : NR;
        for (int64_t j = 0; j < nr; j++) {
            const float *row = x + (j0 + j) * ldx;
            for (int64_t p = 0; p < k; p++)
                panel[p * NR + j] = row[p];
        }
        for (int64_t j = nr; j < NR; j++)
            for (int64_t p = 0; p < k; p++)
                panel[p * NR + j] = 0.0f;
    }
}
