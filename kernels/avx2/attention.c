/* The AVX2+FMA attention matmuls: Q·Kᵀ and P·V on the 6x16 register tile
 * (the softmax step is softmax.c). */
#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "avx2.h"
#include "tile_6x16.h"

/* ---- S = Q Kᵀ ------------------------------------------------------- */

/* One strip of mr query rows against every 16-key panel. */
static inline __attribute__((always_inline)) void
qk_strip(const int mr, const float *q, ptrdiff_t ldq, const float *kp,
         int64_t n, int64_t d, float *s, ptrdiff_t lds)
{
    int64_t j0 = 0;
    for (; j0 + MK_AVX2_NR <= n; j0 += MK_AVX2_NR)
        mk_avx2_tile_6x16(mr, 0, d, q, ldq, kp + j0 * d, MK_AVX2_NR, NULL,
                             NULL, s + j0, lds, MK_AVX2_NR);
    if (j0 < n) /* the panel is zero-padded: only the store narrows */
        mk_avx2_tile_6x16(mr, MK_TILE_C_NARROW, d, q, ldq, kp + j0 * d,
                             MK_AVX2_NR, NULL, NULL, s + j0, lds, n - j0);
}

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
void mk_avx2_qk_6x16(const float *q, ptrdiff_t ldq, int64_t m,
                        const float *kp, int64_t n, int64_t d, float *s,
                        ptrdiff_t lds)
{
    assert(m >= 0 && n >= 0 && d >= 0 && ldq >= 0);
    assert((m == 0 || n == 0) || (q && kp && s));
    assert(m <= 1 || lds >= n);
    for (int64_t i0 = 0; i0 < m; i0 += MK_AVX2_MR) {
        int64_t mr = m - i0 < MK_AVX2_MR ? m - i0 : MK_AVX2_MR;
        MK_AVX2_FOR_MR(mr, qk_strip, q + i0 * ldq, ldq, kp, n, d,
                       s + i0 * lds, lds)
    }
}

/* ---- O = alpha O + P V ---------------------------------------------- */

/* Floats of the stack buffer pv copies strided V rows into (16 KiB:
 * 32 rows of dv = 128 stay in L1 while every strip of P reads them). */
#ifndef PV_COPY_FLOATS
#define PV_COPY_FLOATS 4096
#endif

/* Keys 0..jn-1 of one strip of mr rows against every column block of V.
 * flags: MK_TILE_INIT_SCALED for the first keys of the tile, else
 * MK_TILE_INIT_LOAD to continue the sums in o; MK_TILE_PREFETCH_B when V
 * is read in place. */
static inline __attribute__((always_inline)) void
pv_strip(const int mr, const unsigned flags, const float *p, ptrdiff_t ldp,
         int64_t jn, const float *v, ptrdiff_t ldv, int64_t dv,
         const float *alpha, float *o, ptrdiff_t ldo)
{
    int64_t c0 = 0;
    for (; c0 + MK_AVX2_NR <= dv; c0 += MK_AVX2_NR)
        mk_avx2_tile_6x16(mr, flags | MK_TILE_PREFETCH_C_NEXT, jn, p, ldp,
                             v + c0, ldv, alpha, NULL, o + c0, ldo,
                             MK_AVX2_NR);
    if (c0 < dv)
        mk_avx2_tile_6x16(mr, flags | MK_TILE_B_NARROW | MK_TILE_C_NARROW,
                             jn, p, ldp, v + c0, ldv, alpha, NULL, o + c0,
                             ldo, dv - c0);
}

/* Every strip of m rows against keys 0..jn-1 of v, with the pv_strip
 * flags of one of the three paths. */
static void pv_rows(unsigned flags, const float *p, ptrdiff_t ldp, int64_t m,
                    int64_t jn, const float *v, ptrdiff_t ldv, int64_t dv,
                    const float *alpha, float *o, ptrdiff_t ldo)
{
    enum {
        IN_PLACE = MK_TILE_INIT_SCALED | MK_TILE_PREFETCH_B,
        FIRST_CHUNK = MK_TILE_INIT_SCALED,
        NEXT_CHUNK = MK_TILE_INIT_LOAD,
    };
    for (int64_t i0 = 0; i0 < m; i0 += MK_AVX2_MR) {
        int64_t mr = m - i0 < MK_AVX2_MR ? m - i0 : MK_AVX2_MR;
        const float *pi = p + i0 * ldp, *ai = alpha + i0;
        float *oi = o + i0 * ldo;
        if (flags == IN_PLACE)
            MK_AVX2_FOR_MR(mr, pv_strip, IN_PLACE, pi, ldp, jn, v, ldv, dv,
                           ai, oi, ldo)
        else if (flags == FIRST_CHUNK)
            MK_AVX2_FOR_MR(mr, pv_strip, FIRST_CHUNK, pi, ldp, jn, v, ldv, dv,
                           ai, oi, ldo)
        else
            MK_AVX2_FOR_MR(mr, pv_strip, NEXT_CHUNK, pi, ldp, jn, v, ldv, dv,
                           ai, oi, ldo)
    }
}

/*
 * o[i][c] = alpha[i] * o[i][c] + sum_j p[i][j] * v[j][c].
 * Tile 6 rows x 16 output columns: 12 ymm accumulators start at alpha * o,
 * 2 hold a row of V, 1 a broadcast of p. Columns past the last multiple
 * of 16 use masked loads and stores. V rows that are contiguous (ldv == dv)
 * or too wide are read in place, prefetched a few rows ahead. Strided rows
 * (V inside a [B, S, H, D] tensor, a page or more apart) are copied to the
 * stack a chunk of keys at a time, every strip consuming the chunk while
 * it is in L1, the sums carried in o between chunks: in prefill the chunk
 * is reused by every strip, in decode (one strip) the row-by-row copy
 * reads DRAM better than column blocks scattered over a page per key
 * (docs/design.md). Every element is alpha * o
 * then one FMA per key in key order on either path.
 * Preconditions: ldp, ldv >= 0 (0 repeats one row); ldo >= dv when m > 1.
 */
void mk_avx2_pv_6x16(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                        const float *v, ptrdiff_t ldv, int64_t dv,
                        const float *alpha, float *o, ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldp >= 0 && ldv >= 0);
    assert((m == 0 || dv == 0) || (alpha && o && (n == 0 || (p && v))));
    assert(m <= 1 || ldo >= dv);
    int64_t chunk = dv > 0 ? PV_COPY_FLOATS / dv : 0;
    if (n <= 1 || ldv == dv || chunk < 8) {
        pv_rows(MK_TILE_INIT_SCALED | MK_TILE_PREFETCH_B, p, ldp, m, n, v, ldv,
                dv, alpha, o, ldo);
        return;
    }
    _Alignas(64) float vbuf[PV_COPY_FLOATS];
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
        int64_t jn = n - j0 < chunk ? n - j0 : chunk;
        for (int64_t j = 0; j < jn; j++)
            memcpy(vbuf + j * dv, v + (j0 + j) * ldv, (size_t)dv * sizeof *v);
        pv_rows(j0 == 0 ? MK_TILE_INIT_SCALED : MK_TILE_INIT_LOAD, p + j0, ldp,
                m, jn, vbuf, dv, dv, alpha, o, ldo);
    }
}
