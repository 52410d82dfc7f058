/* The AVX-512 attention matmuls: Q·Kᵀ and P·V on the 12x32 register tile
 * (the softmax step is softmax.c). Edges use opmasks (masked-off lanes are
 * neither read nor written). */
#include <assert.h>
#include <immintrin.h>

#include "avx512.h"
#include "tile.h"

/* ---- S = Q Kᵀ ------------------------------------------------------- */

/* One strip of mr query rows against every 32-key panel. */
static inline __attribute__((always_inline)) void
qk_strip(const int mr, const float *q, ptrdiff_t ldq, const float *kp,
         int64_t n, int64_t d, float *s, ptrdiff_t lds)
{
    int64_t j0 = 0;
    for (; j0 + MK_AVX512_NR <= n; j0 += MK_AVX512_NR)
        mk_avx512_tile(mr, 0, d, q, ldq, kp + j0 * d, MK_AVX512_NR, NULL,
                       NULL, s + j0, lds, MK_AVX512_NR);
    if (j0 < n) /* the panel is zero-padded: only the store narrows */
        mk_avx512_tile(mr, MK_TILE_C_NARROW, d, q, ldq, kp + j0 * d,
                       MK_AVX512_NR, NULL, NULL, s + j0, lds, n - j0);
}

/*
 * s[i][j] = sum_p q[i][p] * k[j][p], unscaled.
 * Tile 12 rows x 32 keys: 24 zmm accumulators, 2 for the packed key row,
 * 1 broadcast of q (tile.h). Strips of 12 query rows (the rest in strips
 * of 8, 4, 2, 1 rows) sweep the key panels, reading the query rows in place; the last
 * panel may be partly padding.
 * Preconditions: kp packed by mk_avx512_pack for n keys of depth d;
 * ldq >= 0 (0 repeats one query row); lds >= n when m > 1.
 */
void mk_avx512_qk_12x32(const float *q, ptrdiff_t ldq, int64_t m,
                        const float *kp, int64_t n, int64_t d, float *s,
                        ptrdiff_t lds)
{
    assert(m >= 0 && n >= 0 && d >= 0 && ldq >= 0);
    assert((m == 0 || n == 0) || (q && kp && s));
    assert(m <= 1 || lds >= n);
#define QK_STRIP(mr, i0) \
    qk_strip(mr, q + (i0) * ldq, ldq, kp, n, d, s + (i0) * lds, lds)
    MK_AVX512_STRIPS(m, QK_STRIP);
#undef QK_STRIP
}

/* ---- O = alpha O + P V ---------------------------------------------- */

/* Keys per V panel: 128 keys x 32 columns is 16 KiB of stack, which stays
 * in L1 while every strip of P reads it (a larger panel is no faster:
 * docs/design.md). */
#ifndef PV_PANEL_KEYS
#define PV_PANEL_KEYS 128
#endif

/* One column block (nr <= 32 columns) of one strip over keys 0..jn-1;
 * flags: INIT_SCALED or INIT_LOAD, plus PREFETCH_B when V is read in
 * place. B_NARROW when V itself is narrower than the block. */
static inline __attribute__((always_inline)) void
pv_tile(const int mr, const unsigned flags, const float *p, ptrdiff_t ldp,
        int64_t jn, const float *v, ptrdiff_t ldv, int64_t nr,
        const float *alpha, float *o, ptrdiff_t ldo)
{
    if (nr == MK_AVX512_NR)
        mk_avx512_tile(mr, flags, jn, p, ldp, v, ldv, alpha, NULL, o, ldo,
                       MK_AVX512_NR);
    else
        mk_avx512_tile(mr, flags | MK_TILE_C_NARROW, jn, p, ldp, v, ldv,
                       alpha, NULL, o, ldo, nr);
}

/* Every strip of m rows against one column block of V (keys 0..jn-1).
 * flags is a constant at each instantiation. */
static inline __attribute__((always_inline)) void
pv_column(const unsigned flags, const float *p, ptrdiff_t ldp, int64_t m,
          int64_t jn, const float *v, ptrdiff_t ldv, int64_t nr,
          const float *alpha, float *o, ptrdiff_t ldo)
{
#define PV_STRIP(mr, i0)                                                   \
    pv_tile(mr, flags, p + (i0) * ldp, ldp, jn, v, ldv, nr, alpha + (i0),   \
            o + (i0) * ldo, ldo)
    MK_AVX512_STRIPS(m, PV_STRIP);
#undef PV_STRIP
}

/* V read in place, one column block after the other (a block's V columns
 * stay in L1 across the strips), prefetched a few rows ahead. */
static void pv_in_place(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                        const float *v, ptrdiff_t ldv, int64_t dv,
                        const float *alpha, float *o, ptrdiff_t ldo)
{
    enum { FLAGS = MK_TILE_INIT_SCALED | MK_TILE_PREFETCH_B };
    for (int64_t c0 = 0; c0 < dv; c0 += MK_AVX512_NR) {
        int64_t nr = dv - c0 < MK_AVX512_NR ? dv - c0 : MK_AVX512_NR;
        if (nr == MK_AVX512_NR)
            pv_column(FLAGS, p, ldp, m, n, v + c0, ldv, nr, alpha, o + c0,
                      ldo);
        else
            pv_column(FLAGS | MK_TILE_B_NARROW, p, ldp, m, n, v + c0, ldv,
                      nr, alpha, o + c0, ldo);
    }
}

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

/*
 * o[i][c] = alpha[i] * o[i][c] + sum_j p[i][j] * v[j][c].
 * Tile 12 rows x 32 output columns: 24 zmm accumulators start at alpha * o,
 * 2 hold a row of V, 1 a broadcast of p; columns past the last multiple of
 * 32 are masked. V goes one 32-column block at a time, every strip of P
 * sweeping it. Contiguous rows (ldv == dv), or a single strip, are read in
 * place. Strided rows (V inside a [B, S, H, D] tensor, a page or more
 * apart: a TLB miss per row) are first copied into a contiguous 32-wide
 * panel on the stack, PV_PANEL_KEYS keys at a time, so each V row is
 * fetched once per block instead of once per strip; the sums are carried
 * in o between panels of keys. Every element is alpha * o then one FMA per
 * key in key order on either path.
 * Preconditions: ldp, ldv >= 0 (0 repeats one row); ldo >= dv when m > 1.
 */
void mk_avx512_pv_12x32(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                        const float *v, ptrdiff_t ldv, int64_t dv,
                        const float *alpha, float *o, ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldp >= 0 && ldv >= 0);
    assert((m == 0 || dv == 0) || (alpha && o && (n == 0 || (p && v))));
    assert(m <= 1 || ldo >= dv);
    if (n <= 1 || ldv == dv || m <= MK_AVX512_MR) {
        pv_in_place(p, ldp, m, n, v, ldv, dv, alpha, o, ldo);
        return;
    }
    _Alignas(64) float panel[PV_PANEL_KEYS * MK_AVX512_NR];
    for (int64_t c0 = 0; c0 < dv; c0 += MK_AVX512_NR) {
        int64_t nr = dv - c0 < MK_AVX512_NR ? dv - c0 : MK_AVX512_NR;
        for (int64_t j0 = 0; j0 < n; j0 += PV_PANEL_KEYS) {
            int64_t jn = n - j0 < PV_PANEL_KEYS ? n - j0 : PV_PANEL_KEYS;
            copy_panel(v + j0 * ldv + c0, ldv, jn, nr, panel);
            if (j0 == 0)
                pv_column(MK_TILE_INIT_SCALED, p, ldp, m, jn, panel,
                          MK_AVX512_NR, nr, alpha, o + c0, ldo);
            else
                pv_column(MK_TILE_INIT_LOAD, p + j0, ldp, m, jn, panel,
                          MK_AVX512_NR, nr, alpha, o + c0, ldo);
        }
    }
}
