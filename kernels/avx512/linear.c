/* The layer's projections on AVX-512: c = a wᵀ + bias with w (nn.Linear
 * layout [n, k]) packed once into the 32-column panels of the 12x32 tile. */
#include <assert.h>

#include "avx512.h"
#include "tile.h"

/* Output columns per block: the block's panels (NC x k floats) stay in L2
 * while every strip of a sweeps them. */
#ifndef LINEAR_NC
#define LINEAR_NC 256
#endif

/* One panel of one strip, with or without bias and narrowing (constant
 * flags at each instantiation). */
#define LINEAR_TILE(FLAGS)                                                  \
    mk_avx512_tile(mr, (FLAGS), k, a, lda, panel, MK_AVX512_NR, NULL,       \
                   bias ? bias + j : NULL, c + j, ldc, nr)

/* One strip of mr rows of a against the panels of columns j0..j1-1. */
static inline __attribute__((always_inline)) void
linear_strip(const int mr, const float *a, ptrdiff_t lda, const float *wp,
             int64_t j0, int64_t j1, int64_t k, const float *bias, float *c,
             ptrdiff_t ldc)
{
    for (int64_t j = j0; j < j1; j += MK_AVX512_NR) {
        const float *panel = wp + j * k;
        int64_t nr = j1 - j < MK_AVX512_NR ? j1 - j : MK_AVX512_NR;
        unsigned narrow = nr < MK_AVX512_NR;
        if (bias && narrow)
            LINEAR_TILE(MK_TILE_ADD_BIAS | MK_TILE_C_NARROW);
        else if (bias)
            LINEAR_TILE(MK_TILE_ADD_BIAS);
        else if (narrow)
            LINEAR_TILE(MK_TILE_C_NARROW);
        else
            LINEAR_TILE(0);
    }
}
#undef LINEAR_TILE

/*
 * c[i][j] = sum_p a[i][p] * w[j][p] + bias[j] (bias may be NULL).
 * Tile 12 rows x 32 output columns: 24 zmm accumulators over the whole
 * depth k, 2 for the packed weight row, 1 broadcast of a; bias added once
 * after the sum. Columns go in blocks of LINEAR_NC, each swept by every
 * 12-row strip of a (the rest in strips of 8, 4, 2, 1 rows; the last panel
 * narrowed).
 * Preconditions: wp packed by mk_avx512_pack (ldx = k) for n x k; lda >= 0 (0
 * repeats one row); ldc >= n when m > 1.
 */
void mk_avx512_linear_12x32(const float *a, ptrdiff_t lda, int64_t m,
                            const float *wp, int64_t n, int64_t k,
                            const float *bias, float *c, ptrdiff_t ldc)
{
    assert(m >= 0 && n >= 0 && k >= 0 && lda >= 0);
    assert((m == 0 || n == 0) || (a && wp && c));
    assert(m <= 1 || ldc >= n);
    for (int64_t j0 = 0; j0 < n; j0 += LINEAR_NC) {
        int64_t j1 = n - j0 < LINEAR_NC ? n : j0 + LINEAR_NC;
#define LINEAR_STRIP(mr, i0)                                         \
    linear_strip(mr, a + (i0) * lda, lda, wp, j0, j1, k, bias, c + (i0) * ldc, \
                 ldc)
        MK_AVX512_STRIPS(m, LINEAR_STRIP);
#undef LINEAR_STRIP
    }
}
