/* The flags of a register-tile call, one vocabulary for every ISA's tile
 * (kernels/avx2/tile_6x16.h, kernels/avx512/tile.h). They are
 * compile-time constants at every call, so each combination compiles to
 * its own straight-line tile. */
#ifndef MK_TILE_FLAGS_H
#define MK_TILE_FLAGS_H

enum {
    /* init = c_scale[r] * c[r][j] (the P·V rescale). */
    MK_TILE_INIT_SCALED = 1,
    /* init = c[r][j] (a sum continued from an earlier call); with neither
     * INIT flag, init = 0. */
    MK_TILE_INIT_LOAD = 2,
    /* B rows hold only nr valid columns (V's last columns): masked loads,
     * so nothing past the matrix is read. */
    MK_TILE_B_NARROW = 4,
    /* C has only nr columns: masked loads and stores. */
    MK_TILE_C_NARROW = 8,
    /* Add bias[j] after the sum (masked like C). */
    MK_TILE_ADD_BIAS = 16,
    /* Prefetch B rows a few rows ahead: B rows that sit a page or more
     * apart (V in a [B, S, H, D] tensor) defeat the hardware prefetchers,
     * which stop at page boundaries. */
    MK_TILE_PREFETCH_B = 32,
    /* Prefetch the C rows of the next tile to the right (the next column
     * block of a P·V strip), so its INIT load finds them in L1. */
    MK_TILE_PREFETCH_C_NEXT = 64,
    /* The sums go to the finish rows (mk_tile_finish) normalised, not to
     * c: a row block's last P·V writes its output rows as normalize
     * would, in the same tile that computed them. */
    MK_TILE_FINISH = 128,
};

#include <stddef.h>

/* Where a MK_TILE_FINISH tile writes: row r's sums times 1 / row_sum[r]
 * (or zeros where row_sum[r] == 0, whatever the sums) to out + r * ldout,
 * the product normalize forms, so the same bits (kernels.h, pv_finish).
 * stream: non-temporal stores for the full-width rows that start on a
 * 64-byte line (normalize's, with the caller's stream). */
typedef struct {
    const float *row_sum;
    float *out;
    ptrdiff_t ldout;
    int stream;
} mk_tile_finish;

/* The finish of a tile at row i0 and column c0 of a block's. */
static inline __attribute__((always_inline)) mk_tile_finish
mk_tile_finish_at(mk_tile_finish f, ptrdiff_t i0, ptrdiff_t c0)
{
    if (f.out) {
        f.row_sum += i0;
        f.out += i0 * f.ldout + c0;
    }
    return f;
}

#define MK_TILE_NO_FINISH ((mk_tile_finish){NULL, NULL, 0, 0})

#endif
