/* Packing a row-major matrix's transpose into the 32-column panels the
 * 12x32 tile reads as its B operand (keys for Q·Kᵀ, weights for the
 * layer), with 16x16 register transposes. Edges (fewer than 16 rows or
 * depth columns) go through the same transpose: missing rows are zero
 * vectors, missing depth columns are masked off the loads and the stores
 * of their output lines are skipped. */
#include <assert.h>
#include <immintrin.h>

#include "avx512.h"
#include "fetch_step.h"
#include "tile.h"

size_t mk_avx512_packed_floats(int64_t n, int64_t k)
{
    return (size_t)((n + MK_AVX512_NR - 1) / MK_AVX512_NR) * MK_AVX512_NR *
           (size_t)k;
}

/* Rows x[0..rows-1] (stride ldx, rows <= 16), depth columns 0..cols-1
 * (cols <= 16): column t goes to out + t * MK_AVX512_NR as 16 floats, one
 * per row, zero for rows >= rows. */
static inline void transpose_16x16(const float *x, ptrdiff_t ldx, int rows,
                                   int cols, float *out)
{
    const __mmask16 cm = mk_avx512_first(cols);
    __m512 r[16], u[16];
    for (int i = 0; i < 16; i++)
        r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, x + i * ldx)
                        : _mm512_setzero_ps();
    /* In each 128-bit lane L, a 4x4 transpose per group g of four rows:
     * u[4g + c] lane L = x[4g..4g+3][4L + c]. */
    for (int g = 0; g < 4; g++) {
        const __m512 *q = r + 4 * g;
        __m512 t0 = _mm512_unpacklo_ps(q[0], q[1]);
        __m512 t1 = _mm512_unpackhi_ps(q[0], q[1]);
        __m512 t2 = _mm512_unpacklo_ps(q[2], q[3]);
        __m512 t3 = _mm512_unpackhi_ps(q[2], q[3]);
        u[4 * g + 0] = _mm512_shuffle_ps(t0, t2, 0x44);
        u[4 * g + 1] = _mm512_shuffle_ps(t0, t2, 0xEE);
        u[4 * g + 2] = _mm512_shuffle_ps(t1, t3, 0x44);
        u[4 * g + 3] = _mm512_shuffle_ps(t1, t3, 0xEE);
    }
    /* Column 4L + c gathers lane L of u[c], u[4 + c], u[8 + c], u[12 + c]
     * with two rounds of 128-bit lane shuffles. */
    for (int c = 0; c < 4; c++) {
        __m512 lo01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
        __m512 hi01 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
        __m512 lo23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
        __m512 hi23 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
        __m512 col[4] = {
            _mm512_shuffle_f32x4(lo01, lo23, 0x88),
            _mm512_shuffle_f32x4(lo01, lo23, 0xDD),
            _mm512_shuffle_f32x4(hi01, hi23, 0x88),
            _mm512_shuffle_f32x4(hi01, hi23, 0xDD),
        };
        for (int l = 0; l < 4; l++)
            if (4 * l + c < cols)
                _mm512_storeu_ps(out + (4 * l + c) * MK_AVX512_NR, col[l]);
    }
}

void mk_avx512_pack(const float *x, ptrdiff_t ldx, int64_t n,
                           int64_t k, float *packed)
{
    assert(n >= 0 && k >= 0 && ldx >= 0);
    assert(n == 0 || k == 0 || (x && packed));
    for (int64_t j0 = 0; j0 < n; j0 += MK_AVX512_NR) {
        float *panel = packed + (j0 / MK_AVX512_NR) * MK_AVX512_NR * k;
        const float *xj = x + j0 * ldx;
        int64_t left = n - j0;
        int rows0 = left >= 16 ? 16 : (int)left;
        int rows1 = left >= 32 ? 16 : left > 16 ? (int)(left - 16) : 0;
        /* Both 16-row halves per depth block: each 128-byte line of the
         * panel is written whole, once. */
        for (int64_t p0 = 0; p0 < k; p0 += 16) {
            int cols = k - p0 >= 16 ? 16 : (int)(k - p0);
            float *out = panel + p0 * MK_AVX512_NR;
            mk_pack_fetch(x, ldx, n, j0 + MK_PACK_AHEAD, MK_AVX512_NR, p0);
            transpose_16x16(xj + p0, ldx, rows0, cols, out);
            /* (no second half: no pointer past the rows is formed) */
            transpose_16x16(rows1 ? xj + 16 * ldx + p0 : xj + p0, ldx, rows1,
                            cols, out + 16);
        }
    }
}
