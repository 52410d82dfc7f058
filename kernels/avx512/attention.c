/* The AVX-512 attention kernels: Q·Kᵀ and P·V on the 12x32 register tile,
 * the fused scale + mask + online softmax step with SLEEF's 16-lane exp,
 * and the final normalisation. Row tails use opmasks (masked-off lanes are
 * neither read nor written). */
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include <string.h>

#include "avx512.h"
#include "tile.h"

#if defined(__GNUC__) && !defined(__clang__)
/* Call SLEEF's exp through the GOT, not a PLT stub: one jump less per 16
 * scores (-4% softmax time at d = 64, GCC; clang has no such attribute). */
__m512 Sleef_expf16_u10avx512f(__m512) __attribute__((noplt));
#endif

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
        mk_avx512_tile(mr, MK_AVX512_C_NARROW, d, q, ldq, kp + j0 * d,
                       MK_AVX512_NR, NULL, NULL, s + j0, lds, n - j0);
}

/*
 * s[i][j] = sum_p q[i][p] * k[j][p], unscaled.
 * Tile 12 rows x 32 keys: 24 zmm accumulators, 2 for the packed key row,
 * 1 broadcast of q (tile.h). Strips of 12 query rows (the rest in strips
 * of 8, 4, 2, 1 rows) sweep the key panels, reading the query rows in place; the last
 * panel may be partly padding.
 * Preconditions: kp packed by mk_avx512_pack_k for n keys of depth d;
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
 * in L1 while every strip of P reads it (256 keys measured no faster). */
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
        mk_avx512_tile(mr, flags | MK_AVX512_C_NARROW, jn, p, ldp, v, ldv,
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
    enum { FLAGS = MK_AVX512_INIT_SCALED | MK_AVX512_PREFETCH_B };
    for (int64_t c0 = 0; c0 < dv; c0 += MK_AVX512_NR) {
        int64_t nr = dv - c0 < MK_AVX512_NR ? dv - c0 : MK_AVX512_NR;
        if (nr == MK_AVX512_NR)
            pv_column(FLAGS, p, ldp, m, n, v + c0, ldv, nr, alpha, o + c0,
                      ldo);
        else
            pv_column(FLAGS | MK_AVX512_B_NARROW, p, ldp, m, n, v + c0, ldv,
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
                pv_column(MK_AVX512_INIT_SCALED, p, ldp, m, jn, panel,
                          MK_AVX512_NR, nr, alpha, o + c0, ldo);
            else
                pv_column(MK_AVX512_INIT_LOAD, p + j0, ldp, m, jn, panel,
                          MK_AVX512_NR, nr, alpha, o + c0, ldo);
        }
    }
}

/* ---- the online softmax step ---------------------------------------- */

/* x = scale * s (+ bias), -inf where keep is 0, in the lanes of `lanes`
 * (the others are not read and come out -inf). */
static inline __attribute__((always_inline)) __m512
scaled_masked_16(const float *s, const float *bias, const uint8_t *keep,
                 __m512 vscale, __mmask16 lanes)
{
    __m512 x = _mm512_maskz_loadu_ps(lanes, s);
    x = bias ? _mm512_fmadd_ps(vscale, x, _mm512_maskz_loadu_ps(lanes, bias))
             : _mm512_mul_ps(vscale, x);
    __mmask16 live = lanes;
    if (keep) {
        __m128i k8 = _mm_maskz_loadu_epi8(lanes, keep);
        live &= _mm_test_epi8_mask(k8, k8);
    }
    return _mm512_mask_blend_ps(live, _mm512_set1_ps(-INFINITY), x);
}

/* Pass 1, general: s[j] = x[j] for the visible keys; returns max_j x[j]
 * (NaN ignored: max keeps its second operand, the running max, when the
 * first is NaN). */
static float scale_mask_row(float *s, int64_t visible, float scale,
                            const float *bias, const uint8_t *keep)
{
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < visible; j += 16) {
        __mmask16 lanes = mk_avx512_first(visible - j);
        __m512 x = scaled_masked_16(s + j, bias ? bias + j : NULL,
                                    keep ? keep + j : NULL, vscale, lanes);
        _mm512_mask_storeu_ps(s + j, lanes, x);
        vmax = _mm512_max_ps(x, vmax);
    }
    return _mm512_reduce_max_ps(vmax);
}

/* Pass 1 without bias or keep: max_j s[j] over the visible keys, NaN
 * ignored, s untouched. Four accumulators hide the latency of max. */
static float row_max_unscaled(const float *s, int64_t visible)
{
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t j = 0;
    for (; j + 64 <= visible; j += 64) {
        m0 = _mm512_max_ps(_mm512_loadu_ps(s + j), m0);
        m1 = _mm512_max_ps(_mm512_loadu_ps(s + j + 16), m1);
        m2 = _mm512_max_ps(_mm512_loadu_ps(s + j + 32), m2);
        m3 = _mm512_max_ps(_mm512_loadu_ps(s + j + 48), m3);
    }
    for (; j < visible; j += 16)
        m0 = _mm512_max_ps(
            _mm512_mask_loadu_ps(ninf, mk_avx512_first(visible - j), s + j),
            m0);
    return _mm512_reduce_max_ps(
        _mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

/* Pass 2: s[j] = exp(a * s[j] - b) for j < visible (the product rounded
 * before the subtraction, so a huge score times a small scale stays
 * finite), 0 after; returns the sum of the exps in a fixed order. */
static float exp_row(float *s, int64_t visible, int64_t n, __m512 a, __m512 b)
{
    __m512 sum = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= visible; j += 16) {
        __m512 e = Sleef_expf16_u10avx512f(
            _mm512_sub_ps(_mm512_mul_ps(a, _mm512_loadu_ps(s + j)), b));
        _mm512_storeu_ps(s + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (j < visible) {
        __mmask16 lanes = mk_avx512_first(visible - j);
        __m512 x = _mm512_maskz_loadu_ps(lanes, s + j);
        __m512 e = _mm512_maskz_mov_ps(
            lanes, Sleef_expf16_u10avx512f(
                       _mm512_sub_ps(_mm512_mul_ps(a, x), b)));
        _mm512_mask_storeu_ps(s + j, lanes, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (visible < n)
        memset(s + visible, 0, (size_t)(n - visible) * sizeof *s);
    return _mm512_reduce_add_ps(sum);
}

/*
 * The fused scale + mask + online softmax step of kernels.h, 16 keys per
 * zmm. Per row, keys past the causal diagonal or the key limit are never
 * loaded (P = 0 there). Pass 1 finds the row maximum of x = scale * s +
 * bias (-inf where keep is 0): without bias or keep and with a finite
 * scale > 0 it is scale * max_j s (rounding is monotonic, so the same
 * float) and s is left alone; otherwise x is written back. Pass 2 writes
 * P = exp(x - max') with Sleef_expf16_u10avx512f (exp(-inf) = 0 exactly)
 * and sums it. The alphas of 16 rows take one vector exp. Rows whose
 * maximum stays -inf get P = 0, alpha = 1, unless a NaN reached every
 * visible score: then max' and the row are NaN.
 * Preconditions: lds >= n when m > 1; mask->keep / bias readable for the
 * visible keys of each row (row stride keep_ld / bias_ld, 0 broadcasts).
 */
void mk_avx512_softmax_update(float *s, ptrdiff_t lds, int64_t m,
                                 int64_t n, float scale, const mk_mask *mask,
                                 float *row_max, float *row_sum, float *alpha)
{
    assert(m >= 0 && n >= 0 && mask);
    assert(m == 0 || (s && row_max && row_sum && alpha));
    assert(m <= 1 || lds >= n);
    const int unscaled = !mask->bias && !mask->keep && scale > 0.0f &&
                         scale < INFINITY;
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
        int64_t rows = m - i0 < 16 ? m - i0 : 16;
        _Alignas(64) float arg[16] = {0}, e[16];
        float sum[16] = {0};
        int empty[16] = {0};
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = i0 + r;
            int64_t lo, hi;
            mk_visible_range(mask, i, n, &lo, &hi);
            float *whole = s + i * lds, *row = whole + lo;
            int64_t visible = hi - lo;
            float bmax;
            if (unscaled) {
                bmax = scale * row_max_unscaled(row, visible);
            } else {
                const float *bias =
                    mask->bias ? mask->bias + i * mask->bias_ld + lo : NULL;
                const uint8_t *keep =
                    mask->keep ? mask->keep + i * mask->keep_ld + lo : NULL;
                bmax = scale_mask_row(row, visible, scale, bias, keep);
            }
            float mnew = mk_row_next_max(row, visible, bmax, row_max[i]);
            if (mnew == -INFINITY) {
                memset(whole, 0, (size_t)n * sizeof *whole);
                empty[r] = 1;
                continue;
            }
            memset(whole, 0, (size_t)lo * sizeof *whole);
            sum[r] = exp_row(row, visible, n - lo,
                             _mm512_set1_ps(unscaled ? scale : 1.0f),
                             _mm512_set1_ps(mnew));
            arg[r] = row_max[i] - mnew;
            row_max[i] = mnew;
        }
        _mm512_store_ps(e, Sleef_expf16_u10avx512f(_mm512_load_ps(arg)));
        for (int64_t r = 0; r < rows; r++) {
            if (empty[r]) {
                alpha[i0 + r] = 1.0f;
                continue;
            }
            alpha[i0 + r] = e[r];
            row_sum[i0 + r] = row_sum[i0 + r] * e[r] + sum[r];
        }
    }
}

/* ---- out = O / l ---------------------------------------------------- */

/*
 * out[i][c] = o[i][c] * (1 / row_sum[i]), or 0 when row_sum[i] == 0
 * (a row with every key masked). 16 columns per zmm, masked tail.
 * Blocks of more than MK_DECODE_ROWS rows (prefill) write whole 64-byte
 * aligned rows with non-temporal stores: the output rows are a page or
 * more apart and not read back by the engine, and reading each line for
 * ownership before overwriting it cost 3% of (1,32,1024,1024,128) (+6%
 * GFLOP/s with streaming stores, one thread). Decode's few rows, which
 * the caller reads next, stay cached. The value is the same either way.
 * Preconditions: ldo >= 0 (0 repeats one row); ldout >= dv when m > 1.
 */
void mk_avx512_normalize(const float *o, ptrdiff_t ldo, int64_t m,
                            int64_t dv, const float *row_sum, float *out,
                            ptrdiff_t ldout)
{
    assert(m >= 0 && dv >= 0 && ldo >= 0);
    assert(m == 0 || (o && row_sum && out));
    assert(m <= 1 || ldout >= dv);
    const int stream = m > MK_DECODE_ROWS && dv % 16 == 0;
    for (int64_t i = 0; i < m; i++) {
        const float *src = o + i * ldo;
        float *dst = out + i * ldout;
        if (row_sum[i] == 0.0f) { /* exact zeros, even if o holds NaN */
            memset(dst, 0, (size_t)dv * sizeof *dst);
            continue;
        }
        const __m512 inv = _mm512_set1_ps(1.0f / row_sum[i]);
        if (stream && ((uintptr_t)dst & 63) == 0) {
            for (int64_t c = 0; c < dv; c += 16)
                _mm512_stream_ps(dst + c,
                                 _mm512_mul_ps(_mm512_loadu_ps(src + c), inv));
            continue;
        }
        for (int64_t c = 0; c < dv; c += 16) {
            __mmask16 lanes = mk_avx512_first(dv - c);
            _mm512_mask_storeu_ps(
                dst + c, lanes,
                _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, src + c), inv));
        }
    }
    if (stream) /* streamed rows are visible before anything after us */
        _mm_sfence();
}
