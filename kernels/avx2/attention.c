/* The AVX2+FMA attention matmuls: Q·Kᵀ and P·V on the 6x16 register tile,
 * through the drivers of kernels/tile_driver.h (the softmax step is
 * softmax.c). */
#include <string.h>

#include "avx2.h"
#include "tile_6x16.h"
#include "tile_driver.h"

/*
 * s[i][j] = sum_p q[i][p] * k[j][p], unscaled.
 * Tile 6 rows x 16 keys: 12 ymm accumulators, 2 for the packed key row,
 * 1 broadcast of q (tile_6x16.h). Strips of 6 query rows (the last one
 * 1..5 rows) sweep the key panels; the last panel may be partly padding.
 * Query rows are read in place: a strip is only 6 rows, so rows a page
 * apart cost no more than contiguous ones (docs/design.md).
 * Preconditions: kp packed by mk_avx2_pack for n keys of depth d;
 * ldq >= 0 (0 repeats one query row); lds >= n when m > 1.
 */
MK_TD_DEFINE_QK(avx2, 6x16)

/* Floats of the stack buffer pv copies strided V rows into (16 KiB:
 * 32 rows of dv = 128 stay in L1 while every strip of P reads them). */
#ifndef PV_COPY_FLOATS
#define PV_COPY_FLOATS 4096
#endif

/*
 * o[i][c] = alpha[i] * o[i][c] + sum_j p[i][j] * v[j][c].
 * Tile 6 rows x 16 output columns: 12 ymm accumulators start at alpha * o,
 * 2 hold a row of V, 1 a broadcast of p. Columns past the last multiple
 * of 16 use masked loads and stores. Each strip goes through every column
 * block (MK_TD_BY_ROWS). V rows that are contiguous (ldv == dv) or too
 * wide are read in place, prefetched a few rows ahead. Strided rows (V
 * inside a [B, S, H, D] tensor, a page or more apart) are copied to the
 * stack a chunk of keys at a time, every strip consuming the chunk while
 * it is in L1, the sums carried in o between chunks: in prefill the chunk
 * is reused by every strip, in decode (one strip) the row-by-row copy
 * reads DRAM better than column blocks scattered over a page per key
 * (docs/design.md). Every element is alpha * o then one FMA per key in key
 * order on either path.
 * pv_finish (kernels.h) is the same with the tiles of V read in place
 * sending their sums normalised to the output rows; copied chunks are
 * summed, then normalize.
 * Preconditions: ldp, ldv >= 0 (0 repeats one row); ldo >= dv when m > 1.
 */
static inline int pv_in_place(int64_t m, int64_t n, ptrdiff_t ldv,
                              int64_t dv)
{
    (void)m;
    return n <= 1 || ldv == dv || dv <= 0 || PV_COPY_FLOATS / dv < 8;
}

static void pv_strided(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                       const float *v, ptrdiff_t ldv, int64_t dv,
                       const float *alpha, float *o, ptrdiff_t ldo)
{
    const int64_t chunk = PV_COPY_FLOATS / dv;
    /* The copied rows are dv wide: a narrow last block narrows B too. */
    _Alignas(64) float vbuf[PV_COPY_FLOATS];
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
        int64_t jn = n - j0 < chunk ? n - j0 : chunk;
        for (int64_t j = 0; j < jn; j++)
            memcpy(vbuf + j * dv, v + (j0 + j) * ldv, (size_t)dv * sizeof *v);
        mk_td_pv_chunk(MK_TD_BY_ROWS, MK_TILE_B_NARROW | MK_TILE_C_NARROW,
                       j0 == 0, p + j0, ldp, m, jn, vbuf, dv, dv, alpha, o,
                       ldo);
    }
}

MK_TD_DEFINE_PV(avx2, 6x16, MK_TD_BY_ROWS, pv_in_place, pv_strided)
