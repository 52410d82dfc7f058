/*
 * The AVX2+FMA register tile every matmul kernel of this directory is built
 * from. Internal to kernels/avx2/; include only from files compiled with
 * -mavx2 -mfma.
 *
 * Tile: mr x 16 (mr = 1..6 rows) of C in 2*mr ymm accumulators (12 at
 * mr = 6), plus two ymm for one row of B and one for a broadcast element
 * of A: 15 of the 16 ymm registers. Per step of the depth loop: two loads
 * of B, mr broadcasts of A, 2*mr FMAs, no horizontal sums.
 *
 *   c[r][j] = init[r][j] + sum_{p<k} a[r*lda + p] * b[p*ldb + j]
 *
 * summed in order of p with one FMA per step, for r < mr, j < 16. The
 * value of an element therefore does not depend on mr, on nr or on the
 * flags that pick the edge paths (the determinism contract of kernels.h):
 * edges only change which lanes are loaded and stored.
 */
#ifndef MK_AVX2_TILE_6X16_H
#define MK_AVX2_TILE_6X16_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "tile_flags.h"

#define MK_AVX2_MR 6
#define MK_AVX2_NR 16

#ifndef MK_AVX2_PREFETCH_ROWS
#define MK_AVX2_PREFETCH_ROWS 8
#endif

/* Lanes j < nr of a 16-wide row, as two 8-lane masks. */
static inline __m256i mk_avx2_lanes_below(int64_t nr, int half)
{
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i lim = _mm256_set1_epi32((int)(nr - 8 * half));
    return _mm256_cmpgt_epi32(lim, iota);
}

/* Applies the tile op for row r (0..5) when the tile has that row. */
#define MK_AVX2_ROWS(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5)

/*
 * The depth loop of a full tile (6 rows, 16 columns of B, k4 groups of 4
 * depth steps) in assembly: per step two loads of B, then for each row a
 * broadcast of A and its two FMAs, the same operations in the same order
 * as the C loop below, so the same bits. gcc compiled that loop to 94
 * instructions a group (the six row addresses rebuilt with lea and
 * spilled); here it is 85: A's rows are two pointers and lda, 2 lda
 * from them, B's rows ldb and 3 ldb, and the pointers move once a group.
 * On Zen 3, Q·Kᵀ of a 96 x 512 block ran 1.03-1.09x, P·V 0.98-1.11x
 * (the most on a loaded host), prefill 1.03-1.04x (docs/benchmarks.md).
 * The pointers go through memory (g) because the
 * 12 accumulators, read and written, already take 24 of asm's 30
 * operands. PREFETCH adds MK_TILE_PREFETCH_B's prefetches: one a step
 * when B's rows start on 64-byte lines (b and ldb whole lines: a row of
 * 16 floats is then one line), else two, the row's first and last byte.
 */
typedef struct {
    const float *a0, *a3, *b;
    ptrdiff_t lda, ldb, ldb3; /* bytes */
    int64_t k4;
    const float *pf; /* b + MK_AVX2_PREFETCH_ROWS * ldb */
} mk_avx2_depth_args;
_Static_assert(offsetof(mk_avx2_depth_args, ldb3) == 40 &&
                   offsetof(mk_avx2_depth_args, pf) == 56,
               "MK_AVX2_DEPTH_ASM reads the fields at 0, 8, ..., 56");

#define MK_AVX2_BC(base, idx, u)                                          \
    "vbroadcastss " #u "(" base idx "), %%ymm15\n\t"
#define MK_AVX2_F2(r)                                                     \
    "vfmadd231ps %%ymm13, %%ymm15, %[c" #r "0]\n\t"                        \
    "vfmadd231ps %%ymm14, %%ymm15, %[c" #r "1]\n\t"
/* Depth step u of a group: B row u at r10 (+ ldb u), A at r8 and r9. */
#define MK_AVX2_ASM_STEP(u, brow, pf)                                     \
    "vmovups " brow ", %%ymm13\n\t"                                       \
    "vmovups 32" brow ", %%ymm14\n\t" pf                                  \
    MK_AVX2_BC("%%r8", "", u) MK_AVX2_F2(0)                               \
    MK_AVX2_BC("%%r8", ",%%r11,1", u) MK_AVX2_F2(1)                       \
    MK_AVX2_BC("%%r8", ",%%r11,2", u) MK_AVX2_F2(2)                       \
    MK_AVX2_BC("%%r9", "", u) MK_AVX2_F2(3)                               \
    MK_AVX2_BC("%%r9", ",%%r11,1", u) MK_AVX2_F2(4)                       \
    MK_AVX2_BC("%%r9", ",%%r11,2", u) MK_AVX2_F2(5)
#define MK_AVX2_PF(row) "prefetcht0 " row "\n\tprefetcht0 60" row "\n\t"
/* One line a row: rows that start on a line (b and ldb whole lines). */
#define MK_AVX2_PF1(row) "prefetcht0 " row "\n\t"
#define MK_AVX2_DEPTH_ASM(PF0, PF1, PF2, PF3, PF_MOVE)                     \
    __asm__ volatile(                                                     \
        "mov 0(%[g]), %%r8\n\t"                                           \
        "mov 8(%[g]), %%r9\n\t"                                           \
        "mov 16(%[g]), %%r10\n\t"                                         \
        "mov 24(%[g]), %%r11\n\t"                                         \
        "mov 32(%[g]), %%r12\n\t"                                         \
        "mov 40(%[g]), %%r13\n\t"                                         \
        "mov 48(%[g]), %%rcx\n\t"                                         \
        "mov 56(%[g]), %%r14\n\t"                                         \
        ".p2align 5\n\t"                                                  \
        "1:\n\t" MK_AVX2_ASM_STEP(0, "(%%r10)", PF0)                      \
        MK_AVX2_ASM_STEP(4, "(%%r10,%%r12,1)", PF1)                        \
        MK_AVX2_ASM_STEP(8, "(%%r10,%%r12,2)", PF2)                        \
        MK_AVX2_ASM_STEP(12, "(%%r10,%%r13,1)", PF3)                       \
        "add $16, %%r8\n\t"                                               \
        "add $16, %%r9\n\t"                                               \
        "lea (%%r10,%%r12,4), %%r10\n\t" PF_MOVE                          \
        "dec %%rcx\n\t"                                                   \
        "jnz 1b\n\t"                                                      \
        : [c00] "+x"(acc00), [c01] "+x"(acc01), [c10] "+x"(acc10),         \
          [c11] "+x"(acc11), [c20] "+x"(acc20), [c21] "+x"(acc21),         \
          [c30] "+x"(acc30), [c31] "+x"(acc31), [c40] "+x"(acc40),         \
          [c41] "+x"(acc41), [c50] "+x"(acc50), [c51] "+x"(acc51)          \
        : [g] "r"(&g)                                                     \
        : "memory", "cc", "rcx", "r8", "r9", "r10", "r11", "r12", "r13",   \
          "r14", "xmm13", "xmm14", "xmm15")

/*
 * One tile. Preconditions: 1 <= mr <= 6 (a constant), k >= 0, 1 <= nr <= 16
 * (16 unless a NARROW flag is set), b readable for k rows of 16 floats
 * unless B_NARROW, c_scale readable for mr floats if INIT_SCALED, bias for
 * nr floats if ADD_BIAS.
 */
static inline __attribute__((always_inline)) void
mk_avx2_tile_6x16(const int mr, const unsigned flags, int64_t k,
                     const float *a, ptrdiff_t lda, const float *b,
                     ptrdiff_t ldb, const float *c_scale, const float *bias,
                     float *c, ptrdiff_t ldc, int64_t nr, mk_tile_finish fin)
{
    const __m256i mask0 = mk_avx2_lanes_below(nr, 0);
    const __m256i mask1 = mk_avx2_lanes_below(nr, 1);
    const int b_narrow = (flags & MK_TILE_B_NARROW) != 0;
    const int c_narrow = (flags & MK_TILE_C_NARROW) != 0;
    if (flags & MK_TILE_PREFETCH_C_NEXT)
        for (int r = 0; r < mr; r++)
            _mm_prefetch((const char *)(c + r * ldc + MK_AVX2_NR),
                         _MM_HINT_T0);

#define MK_LOAD(ptr, mask, narrow) \
    ((narrow) ? _mm256_maskload_ps((ptr), (mask)) : _mm256_loadu_ps(ptr))

#define MK_INIT(r)                                                         \
    __m256 acc##r##0 = _mm256_setzero_ps(), acc##r##1 = acc##r##0;         \
    if (mr > (r) && (flags & MK_TILE_INIT_SCALED)) {                       \
        __m256 sc = _mm256_broadcast_ss(c_scale + (r));                    \
        acc##r##0 = _mm256_mul_ps(sc, MK_LOAD(c + (r) * ldc, mask0,        \
                                              c_narrow));                  \
        acc##r##1 = _mm256_mul_ps(sc, MK_LOAD(c + (r) * ldc + 8, mask1,    \
                                              c_narrow));                  \
    } else if (mr > (r) && (flags & MK_TILE_INIT_LOAD)) {                  \
        acc##r##0 = MK_LOAD(c + (r) * ldc, mask0, c_narrow);               \
        acc##r##1 = MK_LOAD(c + (r) * ldc + 8, mask1, c_narrow);           \
    }
    MK_AVX2_ROWS(MK_INIT)
#undef MK_INIT

    const float *bp = b;
    int64_t p = 0;
    if (mr == 6 && !b_narrow && k >= 4) {
        mk_avx2_depth_args g = {
            a, a + 3 * lda, b,
            lda * (ptrdiff_t)sizeof(float), ldb * (ptrdiff_t)sizeof(float),
            3 * ldb * (ptrdiff_t)sizeof(float), k / 4,
            b + MK_AVX2_PREFETCH_ROWS * ldb};
        const int lines =
            (((uintptr_t)b | (uintptr_t)(ldb * (ptrdiff_t)sizeof(float))) &
             63) == 0;
        if ((flags & MK_TILE_PREFETCH_B) && lines)
            MK_AVX2_DEPTH_ASM(MK_AVX2_PF1("(%%r14)"),
                              MK_AVX2_PF1("(%%r14,%%r12,1)"),
                              MK_AVX2_PF1("(%%r14,%%r12,2)"),
                              MK_AVX2_PF1("(%%r14,%%r13,1)"),
                              "lea (%%r14,%%r12,4), %%r14\n\t");
        else if (flags & MK_TILE_PREFETCH_B)
            MK_AVX2_DEPTH_ASM(MK_AVX2_PF("(%%r14)"),
                              MK_AVX2_PF("(%%r14,%%r12,1)"),
                              MK_AVX2_PF("(%%r14,%%r12,2)"),
                              MK_AVX2_PF("(%%r14,%%r13,1)"),
                              "lea (%%r14,%%r12,4), %%r14\n\t");
        else
            MK_AVX2_DEPTH_ASM("", "", "", "", "");
        p = k / 4 * 4;
        bp = b + p * ldb;
    }
    /* The rest of the depth, and tiles of fewer rows or a narrow B. */
#pragma GCC unroll 4
    for (; p < k; p++, bp += ldb) {
        __m256 b0 = MK_LOAD(bp, mask0, b_narrow);
        __m256 b1 = MK_LOAD(bp + 8, mask1, b_narrow);
        if (flags & MK_TILE_PREFETCH_B) {
            _mm_prefetch((const char *)(bp + MK_AVX2_PREFETCH_ROWS * ldb),
                         _MM_HINT_T0);
            _mm_prefetch((const char *)(bp + MK_AVX2_PREFETCH_ROWS * ldb + 15),
                         _MM_HINT_T0);
        }
#define MK_STEP(r)                                                         \
    if (mr > (r)) {                                                        \
        __m256 ar = _mm256_broadcast_ss(a + (r) * lda + p);                \
        acc##r##0 = _mm256_fmadd_ps(ar, b0, acc##r##0);                    \
        acc##r##1 = _mm256_fmadd_ps(ar, b1, acc##r##1);                    \
    }
        MK_AVX2_ROWS(MK_STEP)
#undef MK_STEP
    }

    __m256 bias0 = _mm256_setzero_ps(), bias1 = bias0;
    if (flags & MK_TILE_ADD_BIAS) {
        bias0 = MK_LOAD(bias, mask0, c_narrow);
        bias1 = MK_LOAD(bias + 8, mask1, c_narrow);
    }
#define MK_STORE(r)                                                        \
    if (mr > (r)) {                                                        \
        if (flags & MK_TILE_ADD_BIAS) {                                    \
            acc##r##0 = _mm256_add_ps(acc##r##0, bias0);                   \
            acc##r##1 = _mm256_add_ps(acc##r##1, bias1);                   \
        }                                                                  \
        float *dr = c + (r) * ldc;                                         \
        if (flags & MK_TILE_FINISH) {                                      \
            dr = fin.out + (r) * fin.ldout;                                \
            if (fin.row_sum[r] != 0.0f) {                                  \
                const __m256 inv = _mm256_set1_ps(1.0f / fin.row_sum[r]);  \
                acc##r##0 = _mm256_mul_ps(acc##r##0, inv);                 \
                acc##r##1 = _mm256_mul_ps(acc##r##1, inv);                 \
            } else {                                                       \
                acc##r##0 = acc##r##1 = _mm256_setzero_ps();               \
            }                                                              \
        }                                                                  \
        if (c_narrow) {                                                    \
            _mm256_maskstore_ps(dr, mask0, acc##r##0);                     \
            _mm256_maskstore_ps(dr + 8, mask1, acc##r##1);                 \
        } else if ((flags & MK_TILE_FINISH) && fin.stream &&               \
                   ((uintptr_t)dr & 63) == 0) {                            \
            _mm256_stream_ps(dr, acc##r##0);                               \
            _mm256_stream_ps(dr + 8, acc##r##1);                           \
        } else {                                                           \
            _mm256_storeu_ps(dr, acc##r##0);                               \
            _mm256_storeu_ps(dr + 8, acc##r##1);                           \
        }                                                                  \
    }
    MK_AVX2_ROWS(MK_STORE)
#undef MK_STORE
#undef MK_LOAD
}

/* The bindings of the shared drivers (kernels/tile_driver.h): a
 * remainder of 1..5 rows is one strip of its own height. */
#define MK_TILE mk_avx2_tile_6x16
#define MK_TILE_MR MK_AVX2_MR
#define MK_TILE_NR MK_AVX2_NR
#define MK_TILE_REST MK_TD_REST_EACH
#define MK_TILE_STREAM_FENCE _mm_sfence
_Static_assert(MK_AVX2_MR == 6, "the tile has rows 0..5 (MK_AVX2_ROWS); "
                                "MK_TD_REST_EACH covers 1..5 rows");

#endif
