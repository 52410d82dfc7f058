/* NEON matmul: an 8x8 register tile of broadcast fused multiply-adds
 * (vfmaq_laneq_f32), blocked over the depth so an 8-row strip of a stays in
 * L1 while the panels of b stream past it. Every element is one FMA chain
 * in order of p from its init value, whatever tile path computes it and
 * wherever the depth blocks fall (partial sums go through c exactly), which
 * is the determinism contract of kernels.h. */
#include "gemm.h"

#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#define MR MK_NEON_MR
#define NR MK_NEON_NR
/* Depth per block: an 8 x KC strip of a is 8 KiB. */
#define KC 256

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* How a tile's accumulators start. */
enum tile_init { INIT_ZERO, INIT_SCALE, INIT_LOAD };

/* Columns 0..7 of one row: two q registers. A full row is loaded in place;
 * a row of the last panel holds nr < NR valid columns and goes through a
 * zero-padded copy, so no access crosses the end of a row-major row. */
typedef struct row8 {
    float32x4_t lo, hi;
} row8;

ALWAYS_INLINE row8 load_row(const float *src, int64_t nr)
{
    row8 r;
    if (nr == NR) {
        r.lo = vld1q_f32(src);
        r.hi = vld1q_f32(src + 4);
    } else {
        float buf[NR] = {0};
        memcpy(buf, src, (size_t)nr * sizeof *buf);
        r.lo = vld1q_f32(buf);
        r.hi = vld1q_f32(buf + 4);
    }
    return r;
}

ALWAYS_INLINE void store_row(float *dst, row8 r, int64_t nr)
{
    if (nr == NR) {
        vst1q_f32(dst, r.lo);
        vst1q_f32(dst + 4, r.hi);
    } else {
        float buf[NR];
        vst1q_f32(buf, r.lo);
        vst1q_f32(buf + 4, r.hi);
        memcpy(dst, buf, (size_t)nr * sizeof *buf);
    }
}

/* A rows x NR tile of c over depth kc, rows in 1..MR and a constant at each
 * call site so the arrays below live in registers. Registers: 2*rows
 * accumulators, rows for four depths of each row of a, two for a row of b;
 * 26 of the 32 at rows = 8. Preconditions: nr in 1..NR, kc >= 0, c_scale
 * only with INIT_SCALE. */
ALWAYS_INLINE void tile(const int rows, int64_t nr, int64_t kc,
                        const float *a, ptrdiff_t lda, const float *b,
                        ptrdiff_t ldb, enum tile_init init,
                        const float *c_scale, const float *bias, float *c,
                        ptrdiff_t ldc)
{
    float32x4_t lo[MR], hi[MR];
    for (int r = 0; r < rows; r++) {
        if (init == INIT_ZERO) {
            lo[r] = hi[r] = vdupq_n_f32(0.0f);
            continue;
        }
        row8 cr = load_row(c + r * ldc, nr);
        if (init == INIT_SCALE) {
            cr.lo = vmulq_n_f32(cr.lo, c_scale[r]);
            cr.hi = vmulq_n_f32(cr.hi, c_scale[r]);
        }
        lo[r] = cr.lo;
        hi[r] = cr.hi;
    }
    int64_t p = 0;
    for (; p + 4 <= kc; p += 4) {
        float32x4_t av[MR];
        for (int r = 0; r < rows; r++)
            av[r] = vld1q_f32(a + r * lda + p);
#define DEPTH_STEP(l)                                                        \
    do {                                                                     \
        row8 br = load_row(b + (p + (l)) * ldb, nr);                         \
        for (int r = 0; r < rows; r++) {                                     \
            lo[r] = vfmaq_laneq_f32(lo[r], br.lo, av[r], (l));               \
            hi[r] = vfmaq_laneq_f32(hi[r], br.hi, av[r], (l));               \
        }                                                                    \
    } while (0)
        DEPTH_STEP(0);
        DEPTH_STEP(1);
        DEPTH_STEP(2);
        DEPTH_STEP(3);
#undef DEPTH_STEP
    }
    for (; p < kc; p++) {
        row8 br = load_row(b + p * ldb, nr);
        for (int r = 0; r < rows; r++) {
            lo[r] = vfmaq_n_f32(lo[r], br.lo, a[r * lda + p]);
            hi[r] = vfmaq_n_f32(hi[r], br.hi, a[r * lda + p]);
        }
    }
    row8 bv = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    if (bias)
        bv = load_row(bias, nr);
    for (int r = 0; r < rows; r++) {
        row8 out = {lo[r], hi[r]};
        if (bias) {
            out.lo = vaddq_f32(out.lo, bv.lo);
            out.hi = vaddq_f32(out.hi, bv.hi);
        }
        store_row(c + r * ldc, out, nr);
    }
}

/* One depth block over all of c: 8-row strips, then 4, then single rows,
 * each across every panel. nr is NR or the width of the last panel. */
ALWAYS_INLINE void strip(const int rows, int64_t i0, int64_t n, int64_t kc,
                         const float *a, ptrdiff_t lda, const float *b,
                         ptrdiff_t ldb, ptrdiff_t b_panel,
                         enum tile_init init, const float *c_scale,
                         const float *bias, float *c, ptrdiff_t ldc)
{
    const float *at = a + i0 * lda;
    const float *cs = c_scale ? c_scale + i0 : NULL;
    float *ct = c + i0 * ldc;
    int64_t j0 = 0;
    for (; j0 + NR <= n; j0 += NR)
        tile(rows, NR, kc, at, lda, b + (j0 / NR) * b_panel, ldb, init, cs,
             bias ? bias + j0 : NULL, ct + j0, ldc);
    if (j0 < n)
        tile(rows, n - j0, kc, at, lda, b + (j0 / NR) * b_panel, ldb, init,
             cs, bias ? bias + j0 : NULL, ct + j0, ldc);
}

void mk_neon_gemm_8x8(int64_t m, int64_t n, int64_t k, const float *a,
                      ptrdiff_t lda, const float *b, ptrdiff_t ldb,
                      ptrdiff_t b_panel, const float *c_scale,
                      const float *bias, float *c, ptrdiff_t ldc)
{
    assert(m >= 0 && n >= 0 && k >= 0);
    /* a and b may broadcast (row stride 0); rows of c must not overlap. */
    assert(m == 0 || n == 0 || (c != NULL && (m == 1 || ldc >= n)));
    assert(m == 0 || k == 0 || (a != NULL && lda >= 0));
    assert(n == 0 || k == 0 || (b != NULL && ldb >= 0));
    if (m == 0 || n == 0)
        return;
    if (k == 0) { /* no element of a or b is read: keep pointers in bounds */
        static const float none[1];
        a = b = none;
        lda = ldb = b_panel = 0;
    }
    int64_t p0 = 0;
    do {
        int64_t kc = k - p0 < KC ? k - p0 : KC;
        enum tile_init init =
            p0 > 0 ? INIT_LOAD : (c_scale ? INIT_SCALE : INIT_ZERO);
        const float *last_bias = p0 + kc == k ? bias : NULL;
        const float *ap = a + p0;
        const float *bp = b + p0 * ldb;
        int64_t i0 = 0;
        for (; i0 + MR <= m; i0 += MR)
            strip(MR, i0, n, kc, ap, lda, bp, ldb, b_panel, init, c_scale,
                  last_bias, c, ldc);
        if (i0 + 4 <= m) {
            strip(4, i0, n, kc, ap, lda, bp, ldb, b_panel, init, c_scale,
                  last_bias, c, ldc);
            i0 += 4;
        }
        for (; i0 < m; i0++)
            strip(1, i0, n, kc, ap, lda, bp, ldb, b_panel, init, c_scale,
                  last_bias, c, ldc);
        p0 += kc;
    } while (p0 < k);
}

size_t mk_neon_packed_floats(int64_t n, int64_t k)
{
    return (size_t)((n + NR - 1) / NR) * NR * (size_t)k;
}

/* Writes the transpose of the 4x4 block at x (rows ldx apart) as four rows
 * of four, NR apart, at dst. */
static void transpose_4x4(const float *x, ptrdiff_t ldx, float *dst)
{
    float32x4_t r0 = vld1q_f32(x), r1 = vld1q_f32(x + ldx);
    float32x4_t r2 = vld1q_f32(x + 2 * ldx), r3 = vld1q_f32(x + 3 * ldx);
    float64x2_t e01 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));
    float64x2_t o01 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
    float64x2_t e23 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
    float64x2_t o23 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
    vst1q_f32(dst, vreinterpretq_f32_f64(vtrn1q_f64(e01, e23)));
    vst1q_f32(dst + NR, vreinterpretq_f32_f64(vtrn1q_f64(o01, o23)));
    vst1q_f32(dst + 2 * NR, vreinterpretq_f32_f64(vtrn2q_f64(e01, e23)));
    vst1q_f32(dst + 3 * NR, vreinterpretq_f32_f64(vtrn2q_f64(o01, o23)));
}

void mk_neon_pack(const float *x, ptrdiff_t ldx, int64_t n, int64_t k,
                         float *packed)
{
    assert(n >= 0 && k >= 0);
    assert(n == 0 || k == 0 || (x != NULL && packed != NULL && ldx >= 0));
    for (int64_t j0 = 0; j0 < n; j0 += NR) {
        float *panel = packed + (j0 / NR) * k * NR;
        int64_t nr = n - j0 < NR ? n - j0 : NR;
        int64_t p = 0;
        if (nr == NR)
            for (; p + 4 <= k; p += 4) {
                transpose_4x4(x + j0 * ldx + p, ldx, panel + p * NR);
                transpose_4x4(x + (j0 + 4) * ldx + p, ldx,
                              panel + p * NR + 4);
            }
        for (int64_t j = 0; j < nr; j++) {
            const float *row = x + (j0 + j) * ldx;
            for (int64_t q = p; q < k; q++)
                panel[q * NR + j] = row[q];
        }
        for (int64_t j = nr; j < NR; j++)
            for (int64_t q = 0; q < k; q++)
                panel[q * NR + j] = 0.0f;
    }
}
