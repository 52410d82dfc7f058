/* The layer's projections on AVX2+FMA: c = a wᵀ + bias with w (nn.Linear
 * layout [n, k]) packed once into the 16-column panels of the 6x16 tile,
 * through the linear driver of kernels/tile_driver.h. */
#include "avx2.h"
#include "tile_6x16.h"
#include "tile_driver.h"

/*
 * c[i][j] = sum_p a[i][p] * w[j][p] + bias[j] (bias may be NULL).
 * Tile 6 rows x 16 output columns: 12 ymm accumulators over the whole
 * depth k, 2 for the packed weight row, 1 broadcast of a; bias added once
 * after the sum. Columns go in blocks of MK_TD_LINEAR_NC, each swept by
 * every 6-row strip of a (the last strip 1..5 rows, the last panel
 * narrowed).
 * Preconditions: wp packed by mk_avx2_pack (ldx = k) for n x k; lda >= 0 (0
 * repeats one row); ldc >= n when m > 1.
 */
MK_TD_DEFINE_LINEAR(avx2, 6x16)
