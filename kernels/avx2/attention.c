/* The AVX2+FMA attention kernels: Q·Kᵀ and P·V on the 6x16 register tile,
 * the fused scale + mask + online softmax step with SLEEF's vector exp, and
 * the final normalisation. */
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
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
        mk_avx2_tile_6x16(mr, MK_AVX2_C_NARROW, d, q, ldq, kp + j0 * d,
                             MK_AVX2_NR, NULL, NULL, s + j0, lds, n - j0);
}

/*
 * s[i][j] = sum_p q[i][p] * k[j][p], unscaled.
 * Tile 6 rows x 16 keys: 12 ymm accumulators, 2 for the packed key row,
 * 1 broadcast of q (tile_6x16.h). Strips of 6 query rows (the last one
 * 1..5 rows) sweep the key panels; the last panel may be partly padding.
 * Query rows are read in place: a strip is only 6 rows, so rows a page
 * apart cost no more than contiguous ones (measured).
 * Preconditions: kp packed by mk_avx2_pack_k for n keys of depth d;
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
 * flags: MK_AVX2_INIT_SCALED for the first keys of the tile, else
 * MK_AVX2_INIT_LOAD to continue the sums in o; MK_AVX2_PREFETCH_B when V
 * is read in place. */
static inline __attribute__((always_inline)) void
pv_strip(const int mr, const unsigned flags, const float *p, ptrdiff_t ldp,
         int64_t jn, const float *v, ptrdiff_t ldv, int64_t dv,
         const float *alpha, float *o, ptrdiff_t ldo)
{
    int64_t c0 = 0;
    for (; c0 + MK_AVX2_NR <= dv; c0 += MK_AVX2_NR)
        mk_avx2_tile_6x16(mr, flags | MK_AVX2_PREFETCH_C_NEXT, jn, p, ldp,
                             v + c0, ldv, alpha, NULL, o + c0, ldo,
                             MK_AVX2_NR);
    if (c0 < dv)
        mk_avx2_tile_6x16(mr, flags | MK_AVX2_B_NARROW | MK_AVX2_C_NARROW,
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
        IN_PLACE = MK_AVX2_INIT_SCALED | MK_AVX2_PREFETCH_B,
        FIRST_CHUNK = MK_AVX2_INIT_SCALED,
        NEXT_CHUNK = MK_AVX2_INIT_LOAD,
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
 * is reused by every strip (+4-6% on the attention loop at d = 128), in
 * decode (one strip) the row-by-row copy reads DRAM better than column
 * blocks scattered over a page per key (+6%). Every element is alpha * o
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
        pv_rows(MK_AVX2_INIT_SCALED | MK_AVX2_PREFETCH_B, p, ldp, m, n, v, ldv,
                dv, alpha, o, ldo);
        return;
    }
    _Alignas(64) float vbuf[PV_COPY_FLOATS];
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
        int64_t jn = n - j0 < chunk ? n - j0 : chunk;
        for (int64_t j = 0; j < jn; j++)
            memcpy(vbuf + j * dv, v + (j0 + j) * ldv, (size_t)dv * sizeof *v);
        pv_rows(j0 == 0 ? MK_AVX2_INIT_SCALED : MK_AVX2_INIT_LOAD, p + j0, ldp,
                m, jn, vbuf, dv, dv, alpha, o, ldo);
    }
}

/* ---- the online softmax step ---------------------------------------- */

/* The maximum (NaN ignored) or the sum of the 8 lanes of x, in a fixed
 * order. */
static inline float reduce8(__m256 x, int is_max)
{
    __m128 lo = _mm256_castps256_ps128(x), hi = _mm256_extractf128_ps(x, 1);
    __m128 h = is_max ? _mm_max_ps(lo, hi) : _mm_add_ps(lo, hi);
    __m128 h2 = _mm_movehl_ps(h, h);
    h = is_max ? _mm_max_ps(h, h2) : _mm_add_ps(h, h2);
    __m128 h3 = _mm_movehdup_ps(h);
    h = is_max ? _mm_max_ss(h, h3) : _mm_add_ss(h, h3);
    return _mm_cvtss_f32(h);
}

/* x = scale * s (+ bias), -inf where keep is 0, for the first `count`
 * (1..8) of 8 keys; lanes past count are not read and come out -inf. */
static inline __attribute__((always_inline)) __m256
scaled_masked_8(const float *s, const float *bias, const uint8_t *keep,
                __m256 vscale, int64_t count)
{
    const int full = count >= 8;
    const __m256i lanes = mk_avx2_lanes_below(count, 0);
    __m256 x = full ? _mm256_loadu_ps(s) : _mm256_maskload_ps(s, lanes);
    if (bias)
        x = _mm256_fmadd_ps(vscale, x,
                            full ? _mm256_loadu_ps(bias)
                                 : _mm256_maskload_ps(bias, lanes));
    else
        x = _mm256_mul_ps(vscale, x);
    __m256i drop = full ? _mm256_setzero_si256()
                        : _mm256_xor_si256(lanes, _mm256_set1_epi32(-1));
    if (keep) {
        uint64_t bytes = 0;
        memcpy(&bytes, keep, full ? 8 : (size_t)count);
        __m256i k32 =
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes));
        drop = _mm256_or_si256(
            drop, _mm256_cmpeq_epi32(k32, _mm256_setzero_si256()));
    }
    return _mm256_blendv_ps(x, _mm256_set1_ps(-INFINITY),
                            _mm256_castsi256_ps(drop));
}

/* Pass 1, general: s[j] = x[j] for the visible keys; returns max_j x[j]
 * (NaN ignored, as the generic kernel does). */
static float scale_mask_row(float *s, int64_t visible, float scale,
                            const float *bias, const uint8_t *keep)
{
    const __m256 vscale = _mm256_set1_ps(scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= visible; j += 8) {
        __m256 x = scaled_masked_8(s + j, bias ? bias + j : NULL,
                                   keep ? keep + j : NULL, vscale, 8);
        _mm256_storeu_ps(s + j, x);
        vmax = _mm256_max_ps(x, vmax);
    }
    if (j < visible) {
        __m256 x = scaled_masked_8(s + j, bias ? bias + j : NULL,
                                   keep ? keep + j : NULL, vscale,
                                   visible - j);
        _mm256_maskstore_ps(s + j, mk_avx2_lanes_below(visible - j, 0), x);
        vmax = _mm256_max_ps(x, vmax);
    }
    return reduce8(vmax, 1);
}

/* Pass 1 without bias or keep: max_j s[j] over the visible keys, NaN
 * ignored, s untouched. Four accumulators hide the latency of max. */
static float row_max_unscaled(const float *s, int64_t visible)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t j = 0;
    for (; j + 32 <= visible; j += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(s + j), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(s + j + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(s + j + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(s + j + 24), m3);
    }
    for (; j + 8 <= visible; j += 8)
        m0 = _mm256_max_ps(_mm256_loadu_ps(s + j), m0);
    if (j < visible) {
        __m256i lanes = mk_avx2_lanes_below(visible - j, 0);
        __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j, lanes),
                                    _mm256_castsi256_ps(lanes));
        m0 = _mm256_max_ps(x, m0);
    }
    return reduce8(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)),
                   1);
}

/* Pass 2: s[j] = exp(a * s[j] - b) (one FMA, then Sleef_expf8_u10avx2)
 * for j < visible, 0 after. */
static void exp_row(float *s, int64_t visible, int64_t n, __m256 a, __m256 b)
{
    int64_t j = 0;
    for (; j + 8 <= visible; j += 8)
        _mm256_storeu_ps(s + j, Sleef_expf8_u10avx2(_mm256_sub_ps(
                                    _mm256_mul_ps(a, _mm256_loadu_ps(s + j)),
                                    b)));
    if (j < visible) {
        __m256i lanes = mk_avx2_lanes_below(visible - j, 0);
        __m256 e = Sleef_expf8_u10avx2(_mm256_sub_ps(
            _mm256_mul_ps(a, _mm256_maskload_ps(s + j, lanes)), b));
        _mm256_maskstore_ps(s + j, lanes, e);
    }
    if (visible < n)
        memset(s + visible, 0, (size_t)(n - visible) * sizeof *s);
}

/* Pass 3: sum_j s[j] over j < visible, in a fixed order (4 accumulators
 * of 8 lanes). Kept out of pass 2 so no sum lives across the exp call. */
static float row_total(const float *s, int64_t visible)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + 32 <= visible; j += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s + j));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(s + j + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(s + j + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(s + j + 24));
    }
    for (; j + 8 <= visible; j += 8)
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s + j));
    if (j < visible)
        a0 = _mm256_add_ps(
            a0, _mm256_maskload_ps(s + j, mk_avx2_lanes_below(visible - j, 0)));
    return reduce8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                   0);
}

/*
 * The fused scale + mask + online softmax step of kernels.h, 8 keys per
 * ymm. Per row, keys past the causal diagonal or the key limit are never
 * loaded (P = 0 there). Pass 1 finds the row maximum of x = scale * s +
 * bias (-inf where keep is 0): without bias or keep and with scale > 0 it
 * is scale * max_j s (rounding is monotonic, so the same float) and s is
 * left alone; otherwise x is written back. Pass 2 writes P = exp(x - max')
 * with Sleef_expf8_u10avx2 (exp(-inf) = 0 exactly), folding the scale into
 * the exp argument with one FMA on the fast path. Pass 3 sums P. The
 * alphas of 8 rows take one vector exp. Rows whose maximum stays -inf get
 * P = 0, alpha = 1.
 * Preconditions: lds >= n when m > 1; mask->keep / bias readable for the
 * visible keys of each row (row stride keep_ld / bias_ld, 0 broadcasts).
 */
void mk_avx2_softmax_update(float *s, ptrdiff_t lds, int64_t m,
                                 int64_t n, float scale, const mk_mask *mask,
                                 float *row_max, float *row_sum, float *alpha)
{
    assert(m >= 0 && n >= 0 && mask);
    assert(m == 0 || (s && row_max && row_sum && alpha));
    assert(m <= 1 || lds >= n);
    const int unscaled = !mask->bias && !mask->keep && scale > 0.0f &&
                         scale < INFINITY;
    /* Rows go in groups of 8 so their alphas take one vector exp. */
    for (int64_t i0 = 0; i0 < m; i0 += 8) {
        int64_t rows = m - i0 < 8 ? m - i0 : 8;
        _Alignas(32) float arg[8] = {0}, sum[8] = {0}, e[8];
        int empty[8] = {0};
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
            exp_row(row, visible, n - lo, _mm256_set1_ps(unscaled ? scale : 1.0f),
                    _mm256_set1_ps(mnew));
            sum[r] = row_total(row, visible);
            arg[r] = row_max[i] - mnew;
            row_max[i] = mnew;
        }
        _mm256_storeu_ps(e, Sleef_expf8_u10avx2(_mm256_load_ps(arg)));
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
 * (a row with every key masked). 8 columns per ymm, masked tail.
 * Preconditions: ldo >= 0 (0 repeats one row); ldout >= dv when m > 1.
 */
void mk_avx2_normalize(const float *o, ptrdiff_t ldo, int64_t m,
                         int64_t dv, const float *row_sum, float *out,
                         ptrdiff_t ldout)
{
    assert(m >= 0 && dv >= 0 && ldo >= 0);
    assert(m == 0 || (o && row_sum && out));
    assert(m <= 1 || ldout >= dv);
    for (int64_t i = 0; i < m; i++) {
        const float *src = o + i * ldo;
        float *dst = out + i * ldout;
        if (row_sum[i] == 0.0f) { /* exact zeros, even if o holds NaN */
            memset(dst, 0, (size_t)dv * sizeof *dst);
            continue;
        }
        __m256 inv = _mm256_set1_ps(1.0f / row_sum[i]);
        int64_t c = 0;
        for (; c + 8 <= dv; c += 8)
            _mm256_storeu_ps(dst + c,
                             _mm256_mul_ps(_mm256_loadu_ps(src + c), inv));
        if (c < dv) {
            __m256i lanes = mk_avx2_lanes_below(dv - c, 0);
            _mm256_maskstore_ps(
                dst + c, lanes,
                _mm256_mul_ps(_mm256_maskload_ps(src + c, lanes), inv));
        }
    }
}
