/* The layer's projections on AVX-512: c = a wᵀ + bias with w (nn.Linear
 * layout [n, k]) packed once into the 32-column panels of the 12x32 tile,
 * through the linear driver of kernels/tile_driver.h. */
#include "avx512.h"
#include "tile.h"
#include "tile_driver.h"

/*
 * c[i][j] = sum_p a[i][p] * w[j][p] + bias[j] (bias may be NULL).
 * Tile 12 rows x 32 output columns: 24 zmm accumulators over the whole
 * depth k, 2 for the packed weight row, 1 broadcast of a; bias added once
 * after the sum. Columns go in blocks of MK_TD_LINEAR_NC, each swept by
 * every 12-row strip of a (the rest in strips of 8, 4, 2, 1 rows; the last
 * panel narrowed).
 * Preconditions: wp packed by mk_avx512_pack (ldx = k) for n x k; lda >= 0
 * (0 repeats one row); ldc >= n when m > 1.
 */
MK_TD_DEFINE_LINEAR(avx512, 12x32)
