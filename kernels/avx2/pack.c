/* Packing a row-major matrix's transpose into the 16-column panels the
 * 6x16 tile reads as its B operand (keys for Q·Kᵀ, weights for the layer),
 * with 8x8 register transposes. */
#include <assert.h>
#include <immintrin.h>

#include "avx2.h"
#include "fetch_step.h"
#include "tile_6x16.h"

size_t mk_avx2_packed_floats(int64_t n, int64_t k)
{
    return (size_t)((n + MK_AVX2_NR - 1) / MK_AVX2_NR) * MK_AVX2_NR *
           (size_t)k;
}

/* Rows x[0..7] (stride ldx), columns p..p+7, stored transposed: column
 * p + t goes to out + t * MK_AVX2_NR. Each ymm is built from two 4-float
 * halves (row r and row r + 4), so one in-lane 4x4 transpose per 128-bit
 * lane finishes the job without cross-lane shuffles. */
static inline void transpose_8x8(const float *x, ptrdiff_t ldx, float *out)
{
#define HALVES(r, col)                                                    \
    _mm256_insertf128_ps(_mm256_castps128_ps256(                          \
                             _mm_loadu_ps(x + (r) * ldx + (col))),        \
                         _mm_loadu_ps(x + ((r) + 4) * ldx + (col)), 1)
    for (int col = 0; col < 8; col += 4) {
        __m256 r0 = HALVES(0, col), r1 = HALVES(1, col);
        __m256 r2 = HALVES(2, col), r3 = HALVES(3, col);
        __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        float *o = out + col * MK_AVX2_NR;
        _mm256_storeu_ps(o + 0 * MK_AVX2_NR, _mm256_shuffle_ps(t0, t2, 0x44));
        _mm256_storeu_ps(o + 1 * MK_AVX2_NR, _mm256_shuffle_ps(t0, t2, 0xEE));
        _mm256_storeu_ps(o + 2 * MK_AVX2_NR, _mm256_shuffle_ps(t1, t3, 0x44));
        _mm256_storeu_ps(o + 3 * MK_AVX2_NR, _mm256_shuffle_ps(t1, t3, 0xEE));
    }
#undef HALVES
}

/* Rows x[0..rows-1] of one 8-column half of a panel, columns p0..k-1,
 * stored transposed with zeros for the missing rows: the slow edge path. */
static void transpose_edge(const float *x, ptrdiff_t ldx, int64_t rows,
                           int64_t p0, int64_t k, float *out)
{
    for (int64_t p = p0; p < k; p++)
        for (int64_t r = 0; r < 8; r++)
            out[p * MK_AVX2_NR + r] = r < rows ? x[r * ldx + p] : 0.0f;
}

void mk_avx2_pack(const float *x, ptrdiff_t ldx, int64_t n,
                         int64_t k, float *packed)
{
    assert(n >= 0 && k >= 0 && ldx >= 0);
    for (int64_t j0 = 0; j0 < n; j0 += MK_AVX2_NR) {
        float *panel = packed + (j0 / MK_AVX2_NR) * MK_AVX2_NR * k;
        const float *xj = x + j0 * ldx;
        int64_t p0 = 0;
        /* Full panels: both 8-row halves per depth block, so each 64-byte
         * line of the panel is written whole, once. */
        if (n - j0 >= MK_AVX2_NR)
            for (; p0 + 8 <= k; p0 += 8) {
                float *out = panel + p0 * MK_AVX2_NR;
                if (p0 % 16 == 0) /* a line: two depth blocks */
                    mk_pack_fetch(x, ldx, n, j0 + MK_PACK_AHEAD, MK_AVX2_NR,
                                  p0);
                transpose_8x8(xj + p0, ldx, out);
                transpose_8x8(xj + 8 * ldx + p0, ldx, out + 8);
            }
        for (int64_t h = 0; h < MK_AVX2_NR; h += 8) {
            int64_t rows = n - j0 - h;
            rows = rows < 0 ? 0 : rows > 8 ? 8 : rows;
            transpose_edge(xj + h * ldx, ldx, rows, p0, k, panel + h);
        }
    }
}
