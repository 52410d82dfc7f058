/* The bf16 compute kernels on AMX: Q·Kᵀ and P·V in blocks of 32 x 32
 * fp32 outputs, four 16 x 16 C tiles fed by two A tiles (16 rows of 16
 * bf16 pairs: query depths, or keys of P) and two B tiles (16 pair rows
 * of 16 columns), TDPBF16PS adding a 16-pair step of all four
 * (docs/design.md, "The amxbf16 table"). The operands are the
 * avx512bf16 table's: queries row-major, keys in its 32-key panels of
 * depth pairs (a B tile is half a panel's width at the panel's 128-byte
 * stride), P as codes in its rows, V in its interleaved 32-column
 * blocks. So every tile whose rows are whole is loaded where it lies;
 * an edge (fewer than 16 rows, depth pairs or keys) is copied into a
 * zero-filled 1 KiB chunk first, which also keeps every load inside the
 * caller's arrays. C tiles go to the scores (or, for P·V, through a
 * chunk, times alpha, to the outputs) once per block. */
#include <assert.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "amxbf16/amxbf16.h"
#include "amxbf16/tiles.h"
#include "avx512/avx512.h"
#include "avx512/tile.h"
#include "avx512bf16/avx512bf16.h"

/* Tile numbers (literal tokens: the instructions encode them). */
#define C00 0
#define C01 1
#define C10 2
#define C11 3
#define TA0 4
#define TA1 5
#define TB0 6
#define TB1 7

static inline int64_t at_most16(int64_t x) { return x < 16 ? x : 16; }

/* rows x codes bf16 values from x (stride ldx elements) into a zeroed
 * 16 x 32 A chunk. */
static void chunk_a(const uint16_t *x, ptrdiff_t ldx, int64_t rows,
                    int64_t codes, uint16_t out[16][32])
{
    memset(out, 0, 16 * 32 * sizeof(uint16_t));
    for (int64_t r = 0; r < rows; r++)
        memcpy(out[r], x + r * ldx, (size_t)codes * sizeof(uint16_t));
}

/* rows pair rows of 16 words from x (stride 32 words: a panel or V
 * block) into a zeroed 16 x 16 B chunk; odd_last keeps only the first
 * key's code (low half) of the last row's pairs. */
static void chunk_b(const float *x, int64_t rows, int odd_last,
                    uint32_t out[16][16])
{
    memset(out, 0, 16 * 16 * sizeof(uint32_t));
    for (int64_t r = 0; r < rows; r++)
        memcpy(out[r], x + 32 * r, 16 * sizeof(uint32_t));
    if (odd_last && rows > 0)
        for (int c = 0; c < 16; c++)
            out[rows - 1][c] &= 0xFFFFu;
}

/* A tile t: 16 rows of 32 codes at base (rows ldx codes apart) when
 * whole, else rows x codes of them through the zeroed chunk sa. */
#define LOAD_A(t, base, ldx, whole, rows, codes)                        \
    do {                                                                \
        if (whole) {                                                    \
            MK_AMX_LOAD(t, base, (ldx) * (ptrdiff_t)sizeof(uint16_t));  \
        } else {                                                        \
            chunk_a(base, ldx, rows, codes, sa);                        \
            MK_AMX_LOAD(t, sa, 64);                                     \
        }                                                               \
    } while (0)

/* B tile t: 16 pair rows at base (a panel's or V block's 128-byte
 * stride) when whole, else rows of them through the zeroed chunk sb. */
#define LOAD_B(t, base, whole, rows, odd_last)                          \
    do {                                                                \
        if (whole) {                                                    \
            MK_AMX_LOAD(t, base, 128);                                  \
        } else {                                                        \
            chunk_b(base, rows, odd_last, sb);                          \
            MK_AMX_LOAD(t, sb, 64);                                     \
        }                                                               \
    } while (0)

/* C tile t (16 x 16) to rows x cols of dst (stride ld floats). */
#define STORE_SCORES(t, dst, ld, rows, cols)                            \
    do {                                                                \
        if ((rows) == 16 && (cols) == 16) {                             \
            MK_AMX_STORE(t, dst, (ld) * (ptrdiff_t)sizeof(float));      \
        } else {                                                        \
            MK_AMX_STORE(t, sc, 64);                                    \
            for (int64_t r_ = 0; r_ < (rows); r_++)                     \
                memcpy((dst) + r_ * (ld), sc[r_],                       \
                       (size_t)(cols) * sizeof(float));                 \
        }                                                               \
    } while (0)

void MK_AMX(qk_bf16_16x16)(const uint16_t *q, ptrdiff_t ldq, int64_t m,
                           const float *kp, int64_t n, int64_t d, float *s,
                           ptrdiff_t lds)
{
    assert(m >= 0 && n >= 0 && d >= 0 && d % 2 == 0 && ldq >= 0);
    if (m == 0 || n == 0)
        return;
    const int64_t pairs = d / 2;
    _Alignas(64) uint16_t sa[16][32];
    _Alignas(64) uint32_t sb[16][16];
    _Alignas(64) float sc[16][16];
    MK_AMX_BEGIN();
    /* Key panels outside the row blocks: a panel's tiles are read from
     * L2 once and again from L1 by the next row blocks (the panels of a
     * 512-key block, 64 KiB at d = 64, do not stay in L1 from one row
     * block to the next; docs/benchmarks.md, the 37th session). */
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
        const float *panel = kp + j0 * pairs;
        const int64_t keys0 = at_most16(n - j0);
        const int64_t keys1 = n - j0 > 16 ? at_most16(n - j0 - 16) : 0;
        for (int64_t i0 = 0; i0 < m; i0 += 32) {
            const int64_t rows0 = at_most16(m - i0);
            const int64_t rows1 = m - i0 > 16 ? at_most16(m - i0 - 16) : 0;
            const uint16_t *q0 = q + i0 * ldq;
            MK_AMX_ZERO(C00);
            MK_AMX_ZERO(C01);
            MK_AMX_ZERO(C10);
            MK_AMX_ZERO(C11);
            for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
                const int64_t np = at_most16(pairs - p0);
                const float *kb = panel + 32 * p0;
                LOAD_B(TB0, kb, np == 16, np, 0);
                if (keys1 > 0)
                    LOAD_B(TB1, kb + 16, np == 16, np, 0);
                LOAD_A(TA0, q0 + 2 * p0, ldq, rows0 == 16 && np == 16, rows0,
                       2 * np);
                MK_AMX_DP(C00, TA0, TB0);
                if (keys1 > 0)
                    MK_AMX_DP(C01, TA0, TB1);
                if (rows1 > 0) {
                    LOAD_A(TA1, q0 + 16 * ldq + 2 * p0, ldq,
                           rows1 == 16 && np == 16, rows1, 2 * np);
                    MK_AMX_DP(C10, TA1, TB0);
                    if (keys1 > 0)
                        MK_AMX_DP(C11, TA1, TB1);
                }
            }
            float *s0 = s + i0 * lds + j0;
            STORE_SCORES(C00, s0, lds, rows0, keys0);
            if (keys1 > 0)
                STORE_SCORES(C01, s0 + 16, lds, rows0, keys1);
            if (rows1 > 0) {
                STORE_SCORES(C10, s0 + 16 * lds, lds, rows1, keys0);
                if (keys1 > 0)
                    STORE_SCORES(C11, s0 + 16 * lds + 16, lds, rows1, keys1);
            }
        }
    }
    MK_AMX_END();
}

/* o[i][c] = alpha[i] o[i][c] + C[i][c] for rows x cols of C tile t. */
#define ADD_OUTPUTS(t, dst, rows, cols, al)                             \
    do {                                                                \
        MK_AMX_STORE(t, sc, 64);                                        \
        const __mmask16 keep_ = mk_avx512_first((int)(cols));           \
        for (int64_t r_ = 0; r_ < (rows); r_++) {                       \
            float *row_ = (dst) + r_ * ldo;                             \
            __m512 o_ = _mm512_maskz_loadu_ps(keep_, row_);             \
            o_ = _mm512_fmadd_ps(_mm512_set1_ps((al)[r_]), o_,          \
                                 _mm512_load_ps(sc[r_]));               \
            _mm512_mask_storeu_ps(row_, keep_, o_);                     \
        }                                                               \
    } while (0)

/* P's rows codes (kernels.h, pv_codes); V in 32-column blocks of pairs
 * (mk_avx512bf16_pack_v_bf16). A chunk of 16 pairs whose 32 keys are all
 * below n is loaded in place; the last one goes through chunks, its codes
 * from n on zero and, for an odd n, key n's half of V's last pair zero:
 * the key after n may belong to a larger pack, and 0 x inf must not
 * reach o. */
static void pv_codes(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                     const float *vp, ptrdiff_t cb_stride, int64_t dv,
                     const float *alpha, float *o, ptrdiff_t ldo)
{
    const int64_t pairs = (n + 1) / 2;
    _Alignas(64) uint16_t sa[16][32];
    _Alignas(64) uint32_t sb[16][16];
    _Alignas(64) float sc[16][16];
    const uint16_t *codes = (const uint16_t *)(const void *)p;
    MK_AMX_BEGIN();
    for (int64_t c0 = 0; c0 < dv; c0 += 32, vp += cb_stride) {
        const int64_t cols0 = at_most16(dv - c0);
        const int64_t cols1 = dv - c0 > 16 ? at_most16(dv - c0 - 16) : 0;
        for (int64_t i0 = 0; i0 < m; i0 += 32) {
            const int64_t rows0 = at_most16(m - i0);
            const int64_t rows1 = m - i0 > 16 ? at_most16(m - i0 - 16) : 0;
            const uint16_t *a0 = codes + 2 * i0 * ldp;
            MK_AMX_ZERO(C00);
            MK_AMX_ZERO(C01);
            MK_AMX_ZERO(C10);
            MK_AMX_ZERO(C11);
            for (int64_t t0 = 0; t0 < pairs; t0 += 16) {
                const int whole = 2 * t0 + 32 <= n;
                const int64_t np = at_most16(pairs - t0);
                const int64_t keys = n - 2 * t0 < 32 ? n - 2 * t0 : 32;
                const int odd_last = t0 + np == pairs && n % 2 == 1;
                const float *vb = vp + 32 * t0;
                LOAD_B(TB0, vb, whole, np, odd_last);
                if (cols1 > 0)
                    LOAD_B(TB1, vb + 16, whole, np, odd_last);
                LOAD_A(TA0, a0 + 2 * t0, 2 * ldp, whole && rows0 == 16, rows0,
                       keys);
                MK_AMX_DP(C00, TA0, TB0);
                if (cols1 > 0)
                    MK_AMX_DP(C01, TA0, TB1);
                if (rows1 > 0) {
                    LOAD_A(TA1, a0 + 32 * ldp + 2 * t0, 2 * ldp,
                           whole && rows1 == 16, rows1, keys);
                    MK_AMX_DP(C10, TA1, TB0);
                    if (cols1 > 0)
                        MK_AMX_DP(C11, TA1, TB1);
                }
            }
            float *o0 = o + i0 * ldo + c0;
            ADD_OUTPUTS(C00, o0, rows0, cols0, alpha + i0);
            if (cols1 > 0)
                ADD_OUTPUTS(C01, o0 + 16, rows0, cols1, alpha + i0);
            if (rows1 > 0) {
                ADD_OUTPUTS(C10, o0 + 16 * ldo, rows1, cols0, alpha + i0 + 16);
                if (cols1 > 0)
                    ADD_OUTPUTS(C11, o0 + 16 * ldo + 16, rows1, cols1,
                                alpha + i0 + 16);
            }
        }
    }
    MK_AMX_END();
}

/* pv_codes (kernels.h): P already codes (softmax_update_codes). */
void MK_AMX(pv_bf16_codes_16x16)(float *p, ptrdiff_t ldp, int64_t m,
                                 int64_t n, const float *vp,
                                 ptrdiff_t cb_stride, int64_t dv,
                                 const float *alpha, float *o, ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldp >= 0);
    assert(m <= 1 || ldp >= n);
    if (m > 0 && dv > 0)
        pv_codes(p, ldp, m, n, vp, cb_stride, dv, alpha, o, ldo);
}

/* pv_bf16 (kernels.h): P's rows become codes in place (avx512bf16's
 * rounding), then pv_codes. */
void MK_AMX(pv_bf16_16x16)(float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                           const float *vp, ptrdiff_t cb_stride, int64_t dv,
                           const float *alpha, float *o, ptrdiff_t ldo)
{
    if (dv > 0)
        mk_avx512bf16_p_to_codes(p, ldp, m, n);
    MK_AMX(pv_bf16_codes_16x16)(p, ldp, m, n, vp, cb_stride, dv, alpha, o,
                                ldo);
}
