/* The layer's projections on AVX2+FMA: c = a wᵀ + bias with w (nn.Linear
 * layout [n, k]) packed once into the 16-column panels of the 6x16 tile. */
#include <assert.h>

#include "avx2.h"
#include "tile_6x16.h"

/* Output columns per block: the block's panels (NC x k floats) stay in L2
 * while every strip of a sweeps them. */
#define LINEAR_NC 256

/* One strip of mr rows of a against the panels of columns j0..j1-1. */
static inline __attribute__((always_inline)) void
linear_strip(const int mr, const float *a, ptrdiff_t lda, const float *wp,
             int64_t j0, int64_t j1, int64_t k, const float *bias, float *c,
             ptrdiff_t ldc)
{
    for (int64_t j = j0; j < j1; j += MK_AVX2_NR) {
        const float *panel = wp + j * k;
        int64_t nr = j1 - j < MK_AVX2_NR ? j1 - j : MK_AVX2_NR;
        if (nr == MK_AVX2_NR && bias)
            mk_avx2_tile_6x16(mr, MK_TILE_ADD_BIAS, k, a, lda, panel,
                                 MK_AVX2_NR, NULL, bias + j, c + j, ldc, nr);
        else if (nr == MK_AVX2_NR)
            mk_avx2_tile_6x16(mr, 0, k, a, lda, panel, MK_AVX2_NR, NULL,
                                 NULL, c + j, ldc, nr);
        else if (bias)
            mk_avx2_tile_6x16(mr, MK_TILE_ADD_BIAS | MK_TILE_C_NARROW, k,
                                 a, lda, panel, MK_AVX2_NR, NULL, bias + j,
                                 c + j, ldc, nr);
        else
            mk_avx2_tile_6x16(mr, MK_TILE_C_NARROW, k, a, lda, panel,
                                 MK_AVX2_NR, NULL, NULL, c + j, ldc, nr);
    }
}

/*
 * c[i][j] = sum_p a[i][p] * w[j][p] + bias[j] (bias may be NULL).
 * Tile 6 rows x 16 output columns: 12 ymm accumulators over the whole
 * depth k, 2 for the packed weight row, 1 broadcast of a; bias added once
 * after the sum. Columns go in blocks of LINEAR_NC, each swept by every
 * 6-row strip of a (the last strip 1..5 rows, the last panel narrowed).
 * Preconditions: wp packed by mk_avx2_pack (ldx = k) for n x k; lda >= 0 (0
 * repeats one row); ldc >= n when m > 1.
 */
void mk_avx2_linear_6x16(const float *a, ptrdiff_t lda, int64_t m,
                            const float *wp, int64_t n, int64_t k,
                            const float *bias, float *c, ptrdiff_t ldc)
{
    assert(m >= 0 && n >= 0 && k >= 0 && lda >= 0);
    assert((m == 0 || n == 0) || (a && wp && c));
    assert(m <= 1 || ldc >= n);
    for (int64_t j0 = 0; j0 < n; j0 += LINEAR_NC) {
        int64_t j1 = n - j0 < LINEAR_NC ? n : j0 + LINEAR_NC;
        for (int64_t i0 = 0; i0 < m; i0 += MK_AVX2_MR) {
            int64_t mr = m - i0 < MK_AVX2_MR ? m - i0 : MK_AVX2_MR;
            MK_AVX2_FOR_MR(mr, linear_strip, a + i0 * lda, lda, wp, j0, j1,
                           k, bias, c + i0 * ldc, ldc)
        }
    }
}
