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
};

#endif
