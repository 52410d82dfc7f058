/* The layer's projections on AVX2+FMA: c = a wᵀ + bias with w (nn.Linear
 * layout [n, k]) packed once into the 16-column panels of the 6x16 tile,
 * through the linear driver of kernels/tile_driver.h. */
#include "avx2.h"
#include "tile_6x16.h"
/* Panel by panel (tile_driver.h, mk_td_linear): on Zen 3's 512 KiB L2 a
 * 256-column block of weights at E = 512 fills the whole L2, so the
 * strip-major order read it from L3 once per 6-row strip; panel by panel
 * a panel stays in L2 while every strip of the row block reads it, the
 * next panel is fetched into L2 meanwhile, and the weights come from L3
 * or memory once a row block of MK_AVX2_LINEAR_ROWS (docs/design.md,
 * "Kernel contract"; figures in docs/benchmarks.md). */
#define MK_TD_LINEAR_PANEL_MAJOR 1
#define MK_TD_LINEAR_MC MK_AVX2_LINEAR_ROWS
#include "tile_driver.h"

/*
 * c[i][j] = sum_p a[i][p] * w[j][p] + bias[j] (bias may be NULL).
 * Tile 6 rows x 16 output columns: 12 ymm accumulators over the whole
 * depth k, 2 for the packed weight row, 1 broadcast of a; bias added once
 * after the sum. Rows go in blocks of MK_TD_LINEAR_MC, each panel read by
 * every 6-row strip of the block (the last strip 1..5 rows, the last
 * panel narrowed) before the next.
 * Preconditions: wp packed by mk_avx2_pack (ldx = k) for n x k; lda >= 0 (0
 * repeats one row); ldc >= n when m > 1.
 */
MK_TD_DEFINE_LINEAR(avx2, 6x16)
