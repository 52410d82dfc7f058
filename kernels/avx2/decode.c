/* The AVX2+FMA decode kernels: up to MK_DECODE_ROWS query rows against key
 * and value rows read in place from the cache, fp32 or widened in registers
 * (F16C for binary16, a 16-bit shift for bfloat16, sign extension and
 * VCVTDQ2PS for int8, fp8 moved into binary16 bits for F16C). A scaled
 * row's scale multiplies its score (keys) or its probability (values).
 *
 * Decode is bound by memory. With K/V in [B, L, H, D] one head's rows lie
 * H * D elements apart, a page or more, where the hardware prefetchers
 * stop; so each kernel prefetches the rows it reads a fixed distance ahead
 * (never past row n - 1).
 *
 * Determinism: a score is two 8-lane chains over d (even and odd 8-element
 * chunks) summed the same way for every row; an output element is scaled
 * by alpha and then takes one FMA per key in key order. Neither depends on
 * m, n or the element's place. */
#include <assert.h>
#include <immintrin.h>
#include <string.h>

#include "avx2.h"
#include "e4m3.h"

/* The spread fetch (fp32 across kv heads only, spread_fetch) into L1:
 * with the engine's distance (two thirds of L1, mk_heads.ahead_bytes)
 * [B, L, H, D] fp32 (1,32,1,4096,128) read 1.10x, paged 1.07x, B8 0.99x
 * over L2 (Zen 5, docs/benchmarks.md). Only where mk_heads.into_l1 says
 * L1 has room. */
#define MK_FETCH_LOCALITY 3
#include "fetch_step.h"

#define INLINE static inline __attribute__((always_inline))

/* Every cache line of a row of row_bytes bytes, into L2 rather than L1
 * (rows 16 KiB apart share L1 sets, so a long L1 distance evicts rows
 * before they are used: docs/design.md). Kept
 * always_inline beside its loops: a shared static inline helper compiled
 * to half the prefetches and halved [B, L, H, D] decode
 * (docs/benchmarks.md). */
INLINE void prefetch_row(const char *row, size_t row_bytes)
{
    for (size_t off = 0; off < row_bytes; off += 64)
        _mm_prefetch(row + off, _MM_HINT_T1);
    _mm_prefetch(row + row_bytes - 1, _MM_HINT_T1);
}

/* A kv head's row of a position up to MK_HEADS_AHEAD positions on
 * (decode_heads.h spreads them over the heads' work), into L1 where it
 * has room (l1: mk_heads.into_l1): paged fp32 decode measured 1.15-1.25x
 * with T0 over T1 on Zen 5's 48 KiB L1. Into a 32 KiB L1 the rows were
 * evicted before use: into L2, [B, L, H, D] (1,32,1,4096,128) read 1.9x
 * (16-bit) on Zen 4 (docs/benchmarks.md). */
INLINE void prefetch_run(const char *run, size_t run_bytes, int l1)
{
    mk_fetch_run(run, run_bytes, l1);
}

/* One query row per kv head unspread (every type but fp32 where L1 has
 * room, every type where not): the same. */
INLINE void prefetch_run_near(const char *run, size_t run_bytes, int l1)
{
    prefetch_run(run, run_bytes, l1);
}

/* What load8 leaves to undo per row: E4M3 loads as its value times 2^-8. */
INLINE float code_factor(mk_dtype t)
{
    return t == MK_FP8_E4M3 ? 256.0f : 1.0f;
}

/* Elements [c, c + 8) of a row of type t as fp32 (an E4M3 code's value
 * times 2^-8: code_factor). */
INLINE __m256 load8(const void *row, mk_dtype t, int64_t c)
{
    const __m128i *h = (const __m128i *)((const uint16_t *)row + c);
    const __m128i *b = (const __m128i *)((const uint8_t *)row + c);
    switch (t) {
    case MK_F32: return _mm256_loadu_ps((const float *)row + c);
    case MK_F16: return _mm256_cvtph_ps(_mm_loadu_si128(h));
    case MK_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16));
    case MK_I8:
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(b)));
    case MK_FP8_E4M3:
        return _mm256_cvtph_ps(_mm256_castsi256_si128(mk_e4m3_to_f16x16(
            _mm256_cvtepi8_epi16(_mm_loadl_epi64(b)))));
    case MK_FP8_E5M2: /* the high byte of a binary16 */
        return _mm256_cvtph_ps(
            _mm_unpacklo_epi8(_mm_setzero_si128(), _mm_loadl_epi64(b)));
    case MK_DTYPE_COUNT: break;
    }
    return _mm256_setzero_ps();
}

/* Elements [c, c + 16) of a row as two load8 results (E4M3 widened 16
 * codes at a time). */
INLINE void load16(const void *row, mk_dtype t, int64_t c, __m256 *x0,
                   __m256 *x1)
{
    if (t == MK_FP8_E4M3) {
        __m256i h = mk_e4m3_to_f16x16(_mm256_cvtepi8_epi16(
            _mm_loadu_si128((const __m128i *)((const int8_t *)row + c))));
        *x0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        *x1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
        return;
    }
    *x0 = load8(row, t, c);
    *x1 = load8(row, t, c + 8);
}

/* Lanes i < left (1..7) true. */
INLINE __m256i lanes(int64_t left)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)left),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Elements [c, c + left) of a row, left < 8, zero beyond; nothing past the
 * row is read. */
INLINE __m256 load_tail(const void *row, mk_dtype t, int64_t c, int64_t left)
{
    const size_t es = mk_dtype_size(t);
    _Alignas(32) unsigned char buf[8 * sizeof(float)] = {0};
    memcpy(buf, (const char *)row + (size_t)c * es, (size_t)left * es);
    return load8(buf, t, 0);
}

INLINE float hsum(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x),
                          _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Row r's score: its sum times the row's scale sc (and the code factor)
 * when t is scaled. */
INLINE float scaled_score(mk_dtype t, float x, float sc)
{
    return mk_dtype_scaled(t) ? x * code_factor(t) * sc : x;
}

/* s[r * lds] = q row r . key row, r < R, times the row's scale sc when t
 * is scaled. */
INLINE void dot_rows(int R, const float *q, ptrdiff_t ldq, const void *row,
                     mk_dtype t, float sc, int64_t d, float *s,
                     ptrdiff_t lds)
{
    __m256 a[4][2];
    for (int r = 0; r < R; r++)
        a[r][0] = a[r][1] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        __m256 k0, k1;
        load16(row, t, c, &k0, &k1);
        for (int r = 0; r < R; r++) {
            const float *qr = q + r * ldq + c;
            a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(qr), k0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8), k1, a[r][1]);
        }
    }
    if (c + 8 <= d) {
        __m256 k0 = load8(row, t, c);
        for (int r = 0; r < R; r++)
            a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * ldq + c), k0,
                                      a[r][0]);
        c += 8;
    }
    if (c < d) {
        __m256 k1 = load_tail(row, t, c, d - c);
        __m256i mask = lanes(d - c);
        for (int r = 0; r < R; r++)
            a[r][1] = _mm256_fmadd_ps(
                _mm256_maskload_ps(q + r * ldq + c, mask), k1, a[r][1]);
    }
    for (int r = 0; r < R; r++)
        s[r * lds] = scaled_score(t, hsum(_mm256_add_ps(a[r][0], a[r][1])),
                                  sc);
}

/* hsum of four vectors at once: lane k of the result is hsum(x[k]), the
 * same float (its pairs: lanes i and i + 4, then i and i + 2, then 0 and
 * 1, each sum with the same operands). */
INLINE __m128 hsum4(const __m256 *x)
{
    const __m256 y01 = _mm256_add_ps(_mm256_permute2f128_ps(x[0], x[1], 0x20),
                                     _mm256_permute2f128_ps(x[0], x[1], 0x31)),
                 y23 = _mm256_add_ps(_mm256_permute2f128_ps(x[2], x[3], 0x20),
                                     _mm256_permute2f128_ps(x[2], x[3], 0x31));
    /* 128-bit lane 0: x[0]'s and x[2]'s pairs, lane 1: x[1]'s and x[3]'s. */
    const __m256 z = _mm256_add_ps(_mm256_shuffle_ps(y01, y23, 0x44),
                                   _mm256_shuffle_ps(y01, y23, 0xEE));
    const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(z, z, 0x88),
                                   _mm256_shuffle_ps(z, z, 0xDD));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(w),
                           _mm256_extractf128_ps(w, 1));
}

/* The by-head loops' fetch (MK_BY_HEAD below): the line of run pf that
 * starts at byte b, if one does, into L2; then what the chunks left of a
 * run of `bytes` after b0 (the lines past it and the last, an unaligned
 * run's). A block of keys ahead is 128 KiB of fp32 at d = 128 for 32
 * heads: fetched into L1 it would be evicted before its head's turn. */
INLINE void fetch_line_l2(const char *pf, size_t b)
{
    if ((b & 63) == 0)
        _mm_prefetch(pf + b, _MM_HINT_T1);
}
INLINE void fetch_rest_l2(const char *pf, size_t b0, size_t bytes)
{
    for (size_t o = (b0 + 63) & ~(size_t)63; o < bytes; o += 64)
        _mm_prefetch(pf + o, _MM_HINT_T1);
    if (bytes)
        _mm_prefetch(pf + bytes - 1, _MM_HINT_T1);
}

/* s[k] = q . key row rows[k] (times sc[k] when t is scaled), k < 4: one
 * query row against four keys, each key's chains those of dot_rows(1,
 * ...), each query chunk loaded once for the four, and the four sums
 * reduced together (hsum4): the same bits as dot_rows, key by key. pf
 * (unless NULL): runs of d elements to fetch into L2 as the chunks go. */
INLINE void dot_keys4(const float *q, const char *const *rows, mk_dtype t,
                      const float *sc, int64_t d, float *s,
                      const char *const *pf)
{
    const size_t es = mk_dtype_size(t);
    __m256 a[4][2];
    for (int k = 0; k < 4; k++)
        a[k][0] = a[k][1] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= d; c += 16) {
        const __m256 q0 = _mm256_loadu_ps(q + c),
                     q1 = _mm256_loadu_ps(q + c + 8);
        for (int k = 0; k < 4; k++) {
            __m256 k0, k1;
            if (pf)
                fetch_line_l2(pf[k], (size_t)c * es);
            load16(rows[k], t, c, &k0, &k1);
            a[k][0] = _mm256_fmadd_ps(q0, k0, a[k][0]);
            a[k][1] = _mm256_fmadd_ps(q1, k1, a[k][1]);
        }
    }
    for (int k = 0; pf && k < 4; k++)
        fetch_rest_l2(pf[k], (size_t)c * es, (size_t)d * es);
    if (c + 8 <= d) {
        const __m256 q0 = _mm256_loadu_ps(q + c);
        for (int k = 0; k < 4; k++)
            a[k][0] = _mm256_fmadd_ps(q0, load8(rows[k], t, c), a[k][0]);
        c += 8;
    }
    if (c < d) {
        const __m256 qt = _mm256_maskload_ps(q + c, lanes(d - c));
        for (int k = 0; k < 4; k++)
            a[k][1] = _mm256_fmadd_ps(qt, load_tail(rows[k], t, c, d - c),
                                      a[k][1]);
    }
    __m256 x[4];
    for (int k = 0; k < 4; k++)
        x[k] = _mm256_add_ps(a[k][0], a[k][1]);
    __m128 sum = hsum4(x);
    if (mk_dtype_scaled(t)) /* scaled_score's x * factor * sc */
        sum = _mm_mul_ps(_mm_mul_ps(sum, _mm_set1_ps(code_factor(t))),
                         _mm_loadu_ps(sc));
    _mm_storeu_ps(s, sum);
}

/* Rows of keys_dot: one. Across heads the fp32 rows measured slower taken
 * 2 or 4 at a time (chunk by chunk across them: 0.88-0.92x from DRAM,
 * docs/benchmarks.md), where the avx512 kernels' 16-bit rows gain 8 at a
 * time; what this table keeps of keys_dot is its fetch spread over the
 * chunks. */
#define MK_KEYS_DOT 1

/* s[r * lds] = q row r (q + r * ldq) . key row k + r * kstep, times
 * sc[r * sc_step] when t is scaled, r < R <= MK_KEYS_DOT: each row against
 * its own key (the kv heads of a position), the chains and sums as
 * dot_rows's, the runs pf + r * pf_step (d elements each) fetched ahead as
 * the chunks go. Chunk by chunk across the rows: the rows' lines are
 * loaded (and fetched) together, not one row's after another's. */
INLINE void keys_dot(const int R, const float *q, ptrdiff_t ldq,
                     const char *k, ptrdiff_t kstep, mk_dtype t,
                     const float *sc, ptrdiff_t sc_step, int64_t d, float *s,
                     ptrdiff_t lds, const char *pf, ptrdiff_t pf_step)
{
    const size_t es = mk_dtype_size(t);
    __m256 a[4][2];
    for (int r = 0; r < R; r++)
        a[r][0] = a[r][1] = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= d; c += 16)
        for (int r = 0; r < R; r++) {
            const float *qr = q + r * ldq + c;
            mk_fetch_step(pf + r * pf_step, (size_t)c * es, 16 * es);
            __m256 k0, k1;
            load16(k + r * kstep, t, c, &k0, &k1);
            a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(qr), k0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + 8), k1, a[r][1]);
        }
    for (int r = 0; r < R; r++)
        mk_fetch_rest(pf + r * pf_step, (size_t)c * es, (size_t)d * es);
    if (c + 8 <= d) {
        for (int r = 0; r < R; r++)
            a[r][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * ldq + c),
                                      load8(k + r * kstep, t, c), a[r][0]);
        c += 8;
    }
    if (c < d)
        for (int r = 0; r < R; r++)
            a[r][1] = _mm256_fmadd_ps(
                _mm256_maskload_ps(q + r * ldq + c, lanes(d - c)),
                load_tail(k + r * kstep, t, c, d - c), a[r][1]);
    for (int r = 0; r < R; r++)
        s[r * lds] = scaled_score(t, hsum(_mm256_add_ps(a[r][0], a[r][1])),
                                  sc ? sc[r * sc_step] : 1.0f);
}

/* s[i * lds] = q row i . key row, i < m (any m), 4 rows at a time. */
INLINE void rows_dot(const float *q, ptrdiff_t ldq, int64_t m,
                     const void *row, mk_dtype t, float sc, int64_t d,
                     float *s, ptrdiff_t lds)
{
    for (int64_t i = 0; i < m; i += 4) {
        const float *qi = q + i * ldq;
        float *si = s + i * lds;
        switch (m - i < 4 ? m - i : 4) {
        case 1: dot_rows(1, qi, ldq, row, t, sc, d, si, lds); break;
        case 2: dot_rows(2, qi, ldq, row, t, sc, d, si, lds); break;
        case 3: dot_rows(3, qi, ldq, row, t, sc, d, si, lds); break;
        default: dot_rows(4, qi, ldq, row, t, sc, d, si, lds); break;
        }
    }
}

/* o rows i < R += pk[k][i] times value row rg[k], for the K (1 or 2)
 * keys k in key order (dv wide): one FMA per key and element, the output
 * chunk in a register across the keys, so K keys load and store it once
 * (the fetch runs pf[k] spread over the chunks unless pf is NULL). */
INLINE void pv_keys(const int K, int64_t R,
                    const float (*pk)[MK_DECODE_ROWS],
                    const char *const *rg, mk_dtype t, int64_t dv, float *o,
                    ptrdiff_t ldo, const char *const *pf)
{
    const size_t es = mk_dtype_size(t);
    const int64_t full = dv / 8 * 8;
    int64_t c = 0;
    for (; c + 16 <= full; c += 16) {
        __m256 x0[2], x1[2];
        for (int k = 0; k < K; k++) {
            if (pf)
                mk_fetch_step(pf[k], (size_t)c * es, 16 * es);
            load16(rg[k], t, c, &x0[k], &x1[k]);
        }
        for (int64_t i = 0; i < R; i++) {
            float *oi = o + i * ldo + c;
            __m256 a0 = _mm256_loadu_ps(oi), a1 = _mm256_loadu_ps(oi + 8);
            for (int k = 0; k < K; k++) {
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(pk[k][i]), x0[k], a0);
                a1 = _mm256_fmadd_ps(_mm256_set1_ps(pk[k][i]), x1[k], a1);
            }
            _mm256_storeu_ps(oi, a0);
            _mm256_storeu_ps(oi + 8, a1);
        }
    }
    for (; c < full; c += 8) {
        __m256 x[2];
        for (int k = 0; k < K; k++)
            x[k] = load8(rg[k], t, c);
        for (int64_t i = 0; i < R; i++) {
            float *oi = o + i * ldo + c;
            __m256 a = _mm256_loadu_ps(oi);
            for (int k = 0; k < K; k++)
                a = _mm256_fmadd_ps(_mm256_set1_ps(pk[k][i]), x[k], a);
            _mm256_storeu_ps(oi, a);
        }
    }
    if (full < dv) {
        const __m256i tail = lanes(dv - full);
        __m256 x[2];
        for (int k = 0; k < K; k++)
            x[k] = load_tail(rg[k], t, full, dv - full);
        for (int64_t i = 0; i < R; i++) {
            float *oi = o + i * ldo + full;
            __m256 a = _mm256_maskload_ps(oi, tail);
            for (int k = 0; k < K; k++)
                a = _mm256_fmadd_ps(_mm256_set1_ps(pk[k][i]), x[k], a);
            _mm256_maskstore_ps(oi, tail, a);
        }
    }
    for (int k = 0; pf && k < K; k++)
        mk_fetch_rest(pf[k], (size_t)c * es, (size_t)dv * es);
}

/* Keys per call of keys_dot_head and pv_keys_head: decode_heads.h's
 * loops head by head, where a pass cannot hold every head (32 fp32 heads
 * at d = 128 on a 32 KiB L1). 8 positions ahead is a block of them:
 * bench/read_patterns read such a pattern (blhd-x8f) at 0.91 of a plain
 * stream, where 4 keys a block read 0.85 and two passes of half positions
 * 0.84 (Zen 4, docs/benchmarks.md). */
#define MK_BY_HEAD 8

/* s[x] = q . key row rows[x] (times sc[x] when scaled), x < MK_BY_HEAD:
 * dot_keys4's sums (dot_rows's bits), fetching pf[x] into L2. */
INLINE void keys_dot_head(const float *q, const char *const *rows,
                          const char *const *pf, mk_dtype t, const float *sc,
                          int64_t d, float *s)
{
    for (int x = 0; x < MK_BY_HEAD; x += 4)
        dot_keys4(q, rows + x, t, sc + x, d, s + x, pf + x);
}

/* o += pk[x] times value row rows[x], x < MK_BY_HEAD in key order (dv
 * wide): each output chunk loaded and stored once for the keys, each
 * element one FMA per key, as pv_keys; the runs pf[x] fetched into L2 as
 * the chunks go. */
INLINE void pv_keys_head(const float *pk, const char *const *rows,
                         const char *const *pf, mk_dtype t, int64_t dv,
                         float *o)
{
    const size_t es = mk_dtype_size(t);
    const int64_t full = dv / 8 * 8;
    __m256 pb[MK_BY_HEAD];
    for (int x = 0; x < MK_BY_HEAD; x++)
        pb[x] = _mm256_set1_ps(pk[x]);
    int64_t c = 0;
    for (; c + 16 <= full; c += 16) {
        __m256 a0 = _mm256_loadu_ps(o + c), a1 = _mm256_loadu_ps(o + c + 8);
        for (int x = 0; x < MK_BY_HEAD; x++) {
            __m256 x0, x1;
            fetch_line_l2(pf[x], (size_t)c * es);
            load16(rows[x], t, c, &x0, &x1);
            a0 = _mm256_fmadd_ps(pb[x], x0, a0);
            a1 = _mm256_fmadd_ps(pb[x], x1, a1);
        }
        _mm256_storeu_ps(o + c, a0);
        _mm256_storeu_ps(o + c + 8, a1);
    }
    for (int x = 0; x < MK_BY_HEAD; x++)
        fetch_rest_l2(pf[x], (size_t)c * es, (size_t)dv * es);
    for (; c < full; c += 8) {
        __m256 a = _mm256_loadu_ps(o + c);
        for (int x = 0; x < MK_BY_HEAD; x++)
            a = _mm256_fmadd_ps(pb[x], load8(rows[x], t, c), a);
        _mm256_storeu_ps(o + c, a);
    }
    if (full < dv) {
        const __m256i tail = lanes(dv - full);
        __m256 a = _mm256_maskload_ps(o + full, tail);
        for (int x = 0; x < MK_BY_HEAD; x++)
            a = _mm256_fmadd_ps(pb[x], load_tail(rows[x], t, full, dv - full),
                                a);
        _mm256_maskstore_ps(o + full, tail, a);
    }
}

/* fp32 spreads its fetch across heads (one query row per kv head) into
 * L1: with the cache in L3 1.2x, from DRAM 1.0-1.06x; the 16-bit and
 * 8-bit types measured level or slower that way on this table's kernels
 * and keep the run fetched before each head's work (docs/benchmarks.md).
 * Where L1 has no room (l1 = 0), fp32 does so too, into L2: from DRAM
 * 1.4-1.5x over the spread into L1 and 1.05x over the spread into L2
 * (Zen 4). */
INLINE int spread_fetch(mk_dtype t, int l1)
{
    return t == MK_F32 && l1;
}

#include "decode_heads.h"

INLINE void decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                      const void *k, mk_dtype t, ptrdiff_t ldk,
                      const void *const *k_rows, const float *ks, ptrdiff_t ks_ld, int64_t n, int64_t d,
                      float *s, ptrdiff_t lds, const mk_heads *h)
{
    const size_t es = mk_dtype_size(t), row_bytes = (size_t)d * es;
    const int64_t ahead = mk_ahead_rows(row_bytes);
    if (h) {
        decode_qk_across(q, ldq, m, k, t, ldk, k_rows, ks, ks_ld, n, d, s, lds,
                         h);
        return;
    }
    /* One row: four keys a block (dot_keys4), their sums reduced
     * together; key by key, each score's reduction was a chain of six
     * dependent operations per 16 FMAs: fp32 in L2 35.3 -> 26.0 cycles a
     * key, fp16 32.6 -> 20.3, int8 38.1 -> 26.2 (Zen 4, docs/benchmarks.md). */
    int64_t j = 0;
    if (m == 1)
        for (; j + 4 <= n; j += 4) {
            const char *rows[4];
            float sc[4];
            for (int x = 0; x < 4; x++) {
                rows[x] = mk_decode_row(k, ldk, k_rows, es, j + x);
                sc[x] = mk_dtype_scaled(t) ? ks[(j + x) * ks_ld] : 1.0f;
                if (j + x + ahead < n)
                    prefetch_row(mk_decode_row(k, ldk, k_rows, es, j + x + ahead),
                                 row_bytes);
            }
            dot_keys4(q, rows, t, sc, d, s + j, NULL);
        }
    for (; j < n; j++) {
        const char *row = mk_decode_row(k, ldk, k_rows, es, j);
        const float sc = mk_dtype_scaled(t) ? ks[j * ks_ld] : 1.0f;
        if (j + ahead < n)
            prefetch_row(mk_decode_row(k, ldk, k_rows, es, j + ahead),
                         row_bytes);
        rows_dot(q, ldq, m, row, t, sc, d, s + j, lds);
    }
}

void mk_avx2_decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                       const void *k, mk_dtype kt, ptrdiff_t ldk,
                       const void *const *k_rows, const float *ks,
                       ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                       ptrdiff_t lds, const mk_heads *heads)
{
    assert(m >= 0 && n >= 0 && d >= 0);
    assert(heads ? heads->group > 0 &&
                       heads->group <= MK_DECODE_ROWS
                 : m <= MK_DECODE_ROWS);
    assert(!mk_dtype_scaled(kt) == !ks && ks_ld >= 0);
#define DECODE_QK(T)                                                      \
    decode_qk(q, ldq, m, k, T, ldk, k_rows, ks, ks_ld, n, d, s, lds, heads)
    MK_FOR_DTYPE(kt, DECODE_QK)
#undef DECODE_QK
}

/* Keys per step of decode_pv at most (mk_step_keys): their rows (and
 * prefetches) are issued together while each output chunk stays in a
 * register. */
enum { KEYS = 8 };

/* Rows i < m of o += their probabilities (p + i * ldp) times the nj
 * value rows rows[jj], one FMA per key and element in key order. Called
 * with a constant nj for a whole step, so the keys' loop is unrolled and
 * each key's probability broadcast once per row rather than tested and
 * loaded per chunk (with 4 keys a step, fp32 [B, H, L, D] decode read
 * 1.20-1.25x on Zen 4, docs/benchmarks.md). */
INLINE void pv_block(const int64_t nj, const float *p, ptrdiff_t ldp,
                     int64_t m, int64_t j0, const char *const *rows,
                     mk_dtype t, const float *vs, ptrdiff_t vs_ld,
                     int64_t dv, float *o, ptrdiff_t ldo)
{
    const int64_t full = dv / 8 * 8;
    const __m256i tail = lanes(dv - full);
    for (int64_t i = 0; i < m; i++) {
        const float *pi = p + i * ldp + j0;
        float *oi = o + i * ldo;
        /* A scaled row's probability takes its scale (and the code
         * factor, exact): one multiply per key, not per element. */
        float cf[KEYS];
        if (mk_dtype_scaled(t)) {
            for (int64_t jj = 0; jj < nj; jj++)
                cf[jj] = pi[jj] * vs[(j0 + jj) * vs_ld] * code_factor(t);
            pi = cf;
        }
        __m256 pb[KEYS];
        for (int64_t jj = 0; jj < nj; jj++)
            pb[jj] = _mm256_set1_ps(pi[jj]);
        int64_t c = 0;
        /* E4M3 widened 16 codes at a time (load16). */
        for (; t == MK_FP8_E4M3 && c + 16 <= full; c += 16) {
            __m256 acc0 = _mm256_loadu_ps(oi + c),
                   acc1 = _mm256_loadu_ps(oi + c + 8);
            for (int64_t jj = 0; jj < nj; jj++) {
                __m256 x0, x1;
                load16(rows[jj], t, c, &x0, &x1);
                acc0 = _mm256_fmadd_ps(pb[jj], x0, acc0);
                acc1 = _mm256_fmadd_ps(pb[jj], x1, acc1);
            }
            _mm256_storeu_ps(oi + c, acc0);
            _mm256_storeu_ps(oi + c + 8, acc1);
        }
        for (; c < full; c += 8) {
            __m256 acc = _mm256_loadu_ps(oi + c);
            for (int64_t jj = 0; jj < nj; jj++)
                acc = _mm256_fmadd_ps(pb[jj], load8(rows[jj], t, c), acc);
            _mm256_storeu_ps(oi + c, acc);
        }
        if (full < dv) {
            __m256 acc = _mm256_maskload_ps(oi + full, tail);
            for (int64_t jj = 0; jj < nj; jj++)
                acc = _mm256_fmadd_ps(
                    pb[jj], load_tail(rows[jj], t, full, dv - full), acc);
            _mm256_maskstore_ps(oi + full, tail, acc);
        }
    }
}

INLINE void decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                      const void *v, mk_dtype t, ptrdiff_t ldv,
                      const void *const *v_rows, const float *vs,
                      ptrdiff_t vs_ld, int64_t dv, const float *alpha,
                      float *o, ptrdiff_t ldo, const mk_heads *h)
{
    const size_t es = mk_dtype_size(t), row_bytes = (size_t)dv * es;
    const int64_t ahead = mk_ahead_rows(row_bytes);
    const int64_t full = dv / 8 * 8;
    const __m256i tail = lanes(dv - full);
    for (int64_t i = 0; alpha && i < m; i++) {
        float *oi = o + i * ldo;
        __m256 a = _mm256_set1_ps(alpha[i]);
        for (int64_t c = 0; c < full; c += 8)
            _mm256_storeu_ps(oi + c, _mm256_mul_ps(a, _mm256_loadu_ps(oi + c)));
        if (full < dv)
            _mm256_maskstore_ps(
                oi + full, tail,
                _mm256_mul_ps(a, _mm256_maskload_ps(oi + full, tail)));
    }
    if (h) {
        decode_pv_across(p, ldp, m, n, v, t, ldv, v_rows, vs, vs_ld, dv, o, ldo,
                         h);
        return;
    }
    const int64_t step = mk_step_keys(row_bytes, KEYS);
    for (int64_t j0 = 0; j0 < n; j0 += step) {
        const int64_t nj = n - j0 < step ? n - j0 : step;
        const char *rows[KEYS];
        for (int64_t jj = 0; jj < nj; jj++)
            rows[jj] = mk_decode_row(v, ldv, v_rows, es, j0 + jj);
        for (int64_t jj = ahead; jj < ahead + nj && j0 + jj < n; jj++)
            prefetch_row(mk_decode_row(v, ldv, v_rows, es, j0 + jj),
                         row_bytes);
        if (nj == KEYS)
            pv_block(KEYS, p, ldp, m, j0, rows, t, vs, vs_ld, dv, o, ldo);
        else if (nj == KEYS / 2)
            pv_block(KEYS / 2, p, ldp, m, j0, rows, t, vs, vs_ld, dv, o, ldo);
        else
            pv_block(nj, p, ldp, m, j0, rows, t, vs, vs_ld, dv, o, ldo);
    }
}

void mk_avx2_decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                       const void *v, mk_dtype vt, ptrdiff_t ldv,
                       const void *const *v_rows, const float *vs,
                       ptrdiff_t vs_ld, int64_t dv, const float *alpha,
                       float *o, ptrdiff_t ldo, const mk_heads *heads)
{
    assert(m >= 0 && n >= 0 && dv >= 0);
    assert(heads ? heads->group > 0 &&
                       heads->group <= MK_DECODE_ROWS
                 : m <= MK_DECODE_ROWS);
    assert(!mk_dtype_scaled(vt) == !vs && vs_ld >= 0);
#define DECODE_PV(T)                                                      \
    decode_pv(p, ldp, m, n, v, T, ldv, v_rows, vs, vs_ld, dv, alpha, o, ldo, \
              heads)
    MK_FOR_DTYPE(vt, DECODE_PV)
#undef DECODE_PV
}
