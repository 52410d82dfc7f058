/* The AVX-512 attention matmuls: Q·Kᵀ and P·V on the 12x32 register tile,
 * through the drivers of kernels/tile_driver.h (the softmax step is
 * softmax.c). Edges use opmasks (masked-off lanes are neither read nor
 * written). */
#include <immintrin.h>

#include "avx512.h"
#include "tile.h"
#include "tile_driver.h"

/*
 * s[i][j] = sum_p q[i][p] * k[j][p], unscaled.
 * Tile 12 rows x 32 keys: 24 zmm accumulators, 2 for the packed key row,
 * 1 broadcast of q (tile.h). Strips of 12 query rows (the rest in strips
 * of 8, 4, 2, 1 rows) sweep the key panels, reading the query rows in
 * place; the last panel may be partly padding.
 * Preconditions: kp packed by mk_avx512_pack for n keys of depth d;
 * ldq >= 0 (0 repeats one query row); lds >= n when m > 1.
 */
MK_TD_DEFINE_QK(avx512, 12x32)

/* Keys per V panel: 128 keys x 32 columns is 16 KiB of stack, which stays
 * in L1 while every strip of P reads it (a larger panel is no faster:
 * docs/design.md). */
#ifndef PV_PANEL_KEYS
#define PV_PANEL_KEYS 128
#endif

/* Rows copy_panel prefetches ahead. */
#ifndef PV_COPY_AHEAD
#define PV_COPY_AHEAD 8
#endif

/* Columns c0..c0+nr-1 of rows 0..jn-1 of v into a 32-wide panel, zeros
 * past nr. */
static void copy_panel(const float *v, ptrdiff_t ldv, int64_t jn, int64_t nr,
                       float *panel)
{
    const __mmask16 lo = mk_avx512_first(nr), hi = mk_avx512_first(nr - 16);
    for (int64_t j = 0; j < jn; j++) {
        const float *row = v + j * ldv;
        if (j + PV_COPY_AHEAD < jn) {
            const char *ahead = (const char *)(row + PV_COPY_AHEAD * ldv);
            _mm_prefetch(ahead, _MM_HINT_T0);
            if (hi)
                _mm_prefetch(ahead + 64, _MM_HINT_T0);
        }
        _mm512_store_ps(panel + j * MK_AVX512_NR,
                        _mm512_maskz_loadu_ps(lo, row));
        _mm512_store_ps(panel + j * MK_AVX512_NR + 16,
                        hi ? _mm512_maskz_loadu_ps(hi, row + 16)
                           : _mm512_setzero_ps());
    }
}

/* Whether pv reads V in place: contiguous rows, one key, or a single
 * strip (below). */
static inline int pv_in_place(int64_t m, int64_t n, ptrdiff_t ldv,
                              int64_t dv)
{
    return n <= 1 || ldv == dv || m <= MK_AVX512_MR;
}

/* pv of strided rows: 32-column panels of PV_PANEL_KEYS keys copied to
 * the stack, the sums carried in o between them (below). */
static void pv_strided(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                       const float *v, ptrdiff_t ldv, int64_t dv,
                       const float *alpha, float *o, ptrdiff_t ldo)
{
    /* The panel is zero-padded to 32 columns: a narrow block narrows only
     * C. */
    _Alignas(64) float panel[PV_PANEL_KEYS * MK_AVX512_NR];
    for (int64_t c0 = 0; c0 < dv; c0 += MK_AVX512_NR) {
        int64_t nr = dv - c0 < MK_AVX512_NR ? dv - c0 : MK_AVX512_NR;
        for (int64_t j0 = 0; j0 < n; j0 += PV_PANEL_KEYS) {
            int64_t jn = n - j0 < PV_PANEL_KEYS ? n - j0 : PV_PANEL_KEYS;
            copy_panel(v + j0 * ldv + c0, ldv, jn, nr, panel);
            mk_td_pv_chunk(MK_TD_BY_COLUMNS, MK_TILE_C_NARROW, j0 == 0,
                           p + j0, ldp, m, jn, panel, MK_AVX512_NR, nr, alpha,
                           o + c0, ldo);
        }
    }
}

/*
 * o[i][c] = alpha[i] * o[i][c] + sum_j p[i][j] * v[j][c].
 * Tile 12 rows x 32 output columns: 24 zmm accumulators start at alpha * o,
 * 2 hold a row of V, 1 a broadcast of p; columns past the last multiple of
 * 32 are masked. V goes one 32-column block at a time, every strip of P
 * sweeping it (MK_TD_BY_COLUMNS). Contiguous rows (ldv == dv), or a single
 * strip, are read in place. Strided rows (V inside a [B, S, H, D] tensor,
 * a page or more apart: a TLB miss per row) are first copied into a
 * contiguous 32-wide panel on the stack, PV_PANEL_KEYS keys at a time, so
 * each V row is fetched once per block instead of once per strip; the
 * sums are carried in o between panels of keys. Every element is alpha * o
 * then one FMA per key in key order on either path. pv_finish (kernels.h)
 * is the same with the tiles of V read in place sending their sums
 * normalised to the output rows; panels of copied rows are summed, then
 * normalize.
 * Preconditions: ldp, ldv >= 0 (0 repeats one row); ldo >= dv when m > 1.
 */
MK_TD_DEFINE_PV(avx512, 12x32, MK_TD_BY_COLUMNS, pv_in_place,
                pv_strided)
