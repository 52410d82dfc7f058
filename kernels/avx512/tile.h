/*
 * The AVX-512 register tile every matmul kernel of this directory is built
 * from. Internal to kernels/avx512/; include only from files compiled with
 * the flags of kernels/avx512/meson.build.
 *
 * Tile: mr x 32 (mr = 1..MK_AVX512_MR rows) of C in 2*mr zmm accumulators
 * (24 at mr = 12), plus two zmm for one row of B and one for a broadcast
 * element of A: 27 of the 32 zmm registers. Per step of the depth loop:
 * two loads of B, mr broadcasts of A, 2*mr FMAs, no horizontal sums.
 *
 *   c[r][j] = init[r][j] + sum_{p<k} a[r*lda + p] * b[p*ldb + j]
 *
 * summed in order of p with one FMA per step, for r < mr, j < 32. An
 * element's value therefore depends neither on mr, nr nor on the flags
 * that pick the edge paths (the determinism contract of kernels.h): edges
 * only change which lanes the opmasks let through.
 */
#ifndef MK_AVX512_TILE_H
#define MK_AVX512_TILE_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "tile_flags.h"

#ifndef MK_AVX512_MR
#define MK_AVX512_MR 12
#endif
#define MK_AVX512_NR 32
/* The tallest tile that fits (28 accumulators + 3 = 31 zmm). */
#define MK_AVX512_MR_MAX 14
_Static_assert(MK_AVX512_MR >= 8 && MK_AVX512_MR <= MK_AVX512_MR_MAX &&
                   MK_AVX512_MR <= 15,
               "MK_TD_REST_HALVING covers a remainder of at most 15 rows");

/* One step of the depth loop: acc + a * b, a broadcast element of A.
 * The bf16 table (kernels/avx512bf16) includes this tile with its own
 * step, a dot product of bf16 pairs; A's elements are then such pairs,
 * read through a may_alias type. */
#ifndef MK_AVX512_STEP
#define MK_AVX512_STEP(acc, a, b) _mm512_fmadd_ps(a, b, acc)
#endif
typedef float mk_avx512_elem __attribute__((may_alias));

#ifndef MK_AVX512_PREFETCH_ROWS
#define MK_AVX512_PREFETCH_ROWS 8
#endif

/* The opmask of lanes j < count of one 16-lane vector (count may be <= 0
 * or >= 16). */
static inline __mmask16 mk_avx512_first(int64_t count)
{
    return count >= 16 ? (__mmask16)0xFFFF
           : count <= 0 ? (__mmask16)0
                        : (__mmask16)((1u << count) - 1u);
}

/* A 16-float vector from p: whole, or only the lanes of mask (zeros in the
 * others, nothing else read). */
static inline __attribute__((always_inline)) __m512
mk_avx512_load(const float *p, __mmask16 mask, int partial)
{
    return partial ? _mm512_maskz_loadu_ps(mask, p) : _mm512_loadu_ps(p);
}

static inline __attribute__((always_inline)) void
mk_avx512_store(float *p, __mmask16 mask, int partial, __m512 x)
{
    if (partial)
        _mm512_mask_storeu_ps(p, mask, x);
    else
        _mm512_storeu_ps(p, x);
}

/*
 * One tile. Preconditions: 1 <= mr <= MK_AVX512_MR_MAX (a constant), k >= 0,
 * 1 <= nr <= 32 (32 unless a NARROW flag is set), b readable for k rows of
 * 32 floats unless B_NARROW, c_scale readable for mr floats if INIT_SCALED,
 * bias for nr floats if ADD_BIAS.
 */
static inline __attribute__((always_inline)) void
mk_avx512_tile(const int mr, const unsigned flags, int64_t k, const float *a,
               ptrdiff_t lda, const float *b, ptrdiff_t ldb,
               const float *c_scale, const float *bias, float *c,
               ptrdiff_t ldc, int64_t nr, mk_tile_finish fin)
{
    const __mmask16 lo = mk_avx512_first(nr), hi = mk_avx512_first(nr - 16);
    const int b_narrow = (flags & MK_TILE_B_NARROW) != 0;
    const int c_narrow = (flags & MK_TILE_C_NARROW) != 0;
    __m512 acc[MK_AVX512_MR_MAX][2];

    if (flags & MK_TILE_PREFETCH_C_NEXT)
        for (int r = 0; r < mr; r++) {
            _mm_prefetch((const char *)(c + r * ldc + MK_AVX512_NR),
                         _MM_HINT_T0);
            _mm_prefetch((const char *)(c + r * ldc + MK_AVX512_NR + 16),
                         _MM_HINT_T0);
        }
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
        const float *cr = c + r * ldc;
        if (flags & (MK_TILE_INIT_SCALED | MK_TILE_INIT_LOAD)) {
            acc[r][0] = mk_avx512_load(cr, lo, c_narrow);
            acc[r][1] = mk_avx512_load(cr + 16, hi, c_narrow);
            if (flags & MK_TILE_INIT_SCALED) {
                __m512 sc = _mm512_set1_ps(c_scale[r]);
                acc[r][0] = _mm512_mul_ps(sc, acc[r][0]);
                acc[r][1] = _mm512_mul_ps(sc, acc[r][1]);
            }
        } else {
            acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        }
    }

    const float *bp = b;
    /* Unrolled so loop overhead and the row address arithmetic amortise
     * over 4 depth steps. */
#pragma GCC unroll 4
    for (int64_t p = 0; p < k; p++, bp += ldb) {
        __m512 b0 = mk_avx512_load(bp, lo, b_narrow);
        __m512 b1 = mk_avx512_load(bp + 16, hi, b_narrow);
        if (flags & MK_TILE_PREFETCH_B) {
            const char *ahead = (const char *)(bp + MK_AVX512_PREFETCH_ROWS * ldb);
            _mm_prefetch(ahead, _MM_HINT_T0);
            _mm_prefetch(ahead + 64, _MM_HINT_T0);
            _mm_prefetch(ahead + 124, _MM_HINT_T0);
        }
#pragma GCC unroll 16
        for (int r = 0; r < mr; r++) {
            __m512 ar =
                _mm512_set1_ps(((const mk_avx512_elem *)a)[r * lda + p]);
            acc[r][0] = MK_AVX512_STEP(acc[r][0], ar, b0);
            acc[r][1] = MK_AVX512_STEP(acc[r][1], ar, b1);
        }
    }

    __m512 bias0 = _mm512_setzero_ps(), bias1 = bias0;
    if (flags & MK_TILE_ADD_BIAS) {
        bias0 = mk_avx512_load(bias, lo, c_narrow);
        bias1 = mk_avx512_load(bias + 16, hi, c_narrow);
    }
#pragma GCC unroll 16
    for (int r = 0; r < mr; r++) {
        if (flags & MK_TILE_ADD_BIAS) {
            acc[r][0] = _mm512_add_ps(acc[r][0], bias0);
            acc[r][1] = _mm512_add_ps(acc[r][1], bias1);
        }
        if (flags & MK_TILE_FINISH) {
            float *dr = fin.out + r * fin.ldout;
            const float sum = fin.row_sum[r];
            __m512 x0 = _mm512_setzero_ps(), x1 = x0;
            if (sum != 0.0f) {
                const __m512 inv = _mm512_set1_ps(1.0f / sum);
                x0 = _mm512_mul_ps(acc[r][0], inv);
                x1 = _mm512_mul_ps(acc[r][1], inv);
            }
            if (!c_narrow && fin.stream && ((uintptr_t)dr & 63) == 0) {
                _mm512_stream_ps(dr, x0);
                _mm512_stream_ps(dr + 16, x1);
            } else {
                mk_avx512_store(dr, lo, c_narrow, x0);
                mk_avx512_store(dr + 16, hi, c_narrow, x1);
            }
            continue;
        }
        mk_avx512_store(c + r * ldc, lo, c_narrow, acc[r][0]);
        mk_avx512_store(c + r * ldc + 16, hi, c_narrow, acc[r][1]);
    }
}

/* The bindings of the shared drivers (kernels/tile_driver.h): a
 * remainder is cut into strips of 8, 4, 2 and 1 rows, so only five tile
 * heights are compiled whatever MK_AVX512_MR. */
#define MK_TILE mk_avx512_tile
#define MK_TILE_MR MK_AVX512_MR
#define MK_TILE_NR MK_AVX512_NR
#define MK_TILE_REST MK_TD_REST_HALVING
#define MK_TILE_STREAM_FENCE _mm_sfence

#endif
