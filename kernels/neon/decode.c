/* The NEON decode kernels: up to MK_DECODE_ROWS query rows against key and
 * value rows read in place from the cache, fp32 or widened in registers
 * (FCVTL for binary16, a 16-bit widening shift for bfloat16, sign
 * extension and SCVTF for int8, fp8 moved into binary16 bits for FCVTL).
 * A scaled row's scale multiplies its score (keys) or its probability
 * (values).
 *
 * Decode is bound by memory: every K/V byte is read once, here, and rows
 * a fixed number of bytes ahead are prefetched (never a row past n - 1).
 * Keys go four at a time; within a group of four keys the query rows go
 * four (or two, or one) at a time, so the group's rows are read from memory
 * once and then from L1.
 *
 * Determinism: a score is one 4-lane FMA chain over d in 4-element steps
 * (the d tail zero-padded, nothing past the row read), then the lanes
 * summed pairwise; an output element is scaled by alpha, then takes one
 * FMA per key in key order. Neither depends on m, n or where the element
 * sits: padding rows and keys of a group only repeat work, and their
 * results are dropped. */
#include <arm_neon.h>
#include <assert.h>
#include <string.h>

#include "neon.h"

#define INLINE static inline __attribute__((always_inline))

/* Keys per group, and the bytes of rows prefetched ahead of the group in
 * use (at least PREFETCH_MIN_ROWS rows). */
enum { KEYS = 4, PREFETCH_BYTES = 2048, PREFETCH_MIN_ROWS = 8 };

/* Four 8-bit codes (as 16-bit lanes, sign-extended) from a row. */
INLINE int16x4_t codes4(const void *row, int64_t c)
{
    uint32_t w;
    memcpy(&w, (const uint8_t *)row + c, sizeof w);
    return vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(w))));
}

/* E4M3 codes as the binary16 of their value times 2^-8: shifted left by 7
 * the exponent and mantissa land in a binary16's (bias 8 more, subnormals
 * at the same 2^-8), the sign at bit 15; the NaN codes S.1111.111 get the
 * all-ones exponent. A few integer ops beat a table lookup per code. */
INLINE float32x4_t e4m3x4(int16x4_t s)
{
    uint16x4_t h = vand_u16(vreinterpret_u16_s16(vshl_n_s16(s, 7)),
                            vdup_n_u16(0xBFFFu));
    uint16x4_t nan = vceq_u16(vand_u16(h, vdup_n_u16(0x7FFFu)),
                              vdup_n_u16(0x3F80u));
    h = vorr_u16(h, vand_u16(nan, vdup_n_u16(0x7C00u)));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* What load4 leaves to undo per row: E4M3 loads as its value times 2^-8. */
INLINE float code_factor(mk_dtype t)
{
    return t == MK_FP8_E4M3 ? 256.0f : 1.0f;
}

/* Elements [c, c + 4) of a row of type t as fp32 (an E4M3 code's value
 * times 2^-8: code_factor). */
INLINE float32x4_t load4(const void *row, mk_dtype t, int64_t c)
{
    const uint16_t *h = (const uint16_t *)row + c;
    switch (t) {
    case MK_F32: return vld1q_f32((const float *)row + c);
    case MK_F16: return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
    case MK_BF16: return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(h), 16));
    case MK_I8: return vcvtq_f32_s32(vmovl_s16(codes4(row, c)));
    case MK_FP8_E4M3: return e4m3x4(codes4(row, c));
    case MK_FP8_E5M2: /* the high byte of a binary16 */
        return vcvt_f32_f16(vreinterpret_f16_u16(
            vshl_n_u16(vreinterpret_u16_s16(codes4(row, c)), 8)));
    case MK_DTYPE_COUNT: break;
    }
    return vdupq_n_f32(0.0f);
}

/* Elements [c, c + left) of a row, left in 1..3, zero beyond; nothing past
 * the row is read. */
INLINE float32x4_t load_tail(const void *row, mk_dtype t, int64_t c,
                             int64_t left)
{
    const size_t es = mk_dtype_size(t);
    _Alignas(16) unsigned char buf[4 * sizeof(float)] = {0};
    memcpy(buf, (const char *)row + (size_t)c * es, (size_t)left * es);
    return load4(buf, t, 0);
}

/* Rows ahead worth prefetching for rows of row_bytes. */
INLINE int64_t prefetch_distance(size_t row_bytes)
{
    int64_t rows = (int64_t)(PREFETCH_BYTES / (row_bytes ? row_bytes : 1));
    return rows > PREFETCH_MIN_ROWS ? rows : PREFETCH_MIN_ROWS;
}

/* Every cache line of rows [j, j + KEYS) ∩ [0, n) of a row array (row r at
 * base + r * ld_bytes, row_bytes long). A broadcast array (ld 0) is the row
 * in use: nothing to fetch. */
INLINE void prefetch_rows(const char *base, size_t ld_bytes,
                          const void *const *rows, int64_t j, int64_t n,
                          size_t row_bytes)
{
    if (ld_bytes == 0 && !rows)
        return;
    for (int64_t r = j; r < j + KEYS && r < n; r++) {
        const char *row = rows ? (const char *)rows[r]
                               : base + (size_t)r * ld_bytes;
        for (size_t off = 0; off < row_bytes; off += 64)
            __builtin_prefetch(row + off);
        __builtin_prefetch(row + row_bytes - 1);
    }
}

/* Scores of rows query rows (q, row stride ldq) against the KEYS key rows
 * kr, of which the first nk are real: s[y][x] for y < rows, x < nk. R (1,
 * 2 or 4, a constant once inlined) rows are computed; rows past `rows`
 * repeat the last one and are dropped, as are the repeated keys. */
INLINE void qk_tile(const float *q, ptrdiff_t ldq, int64_t rows,
                    const char *const kr[KEYS], const float sc[KEYS],
                    int64_t nk, mk_dtype t, int64_t d, float *s,
                    ptrdiff_t lds, int R)
{
    const float *qr[4];
    float32x4_t acc[4][KEYS];
    for (int y = 0; y < R; y++) {
        qr[y] = q + (y < rows ? y : rows - 1) * ldq;
        for (int x = 0; x < KEYS; x++)
            acc[y][x] = vdupq_n_f32(0.0f);
    }
    int64_t c = 0;
    for (; c + 4 <= d; c += 4) {
        float32x4_t kv[KEYS];
        for (int x = 0; x < KEYS; x++)
            kv[x] = load4(kr[x], t, c);
        for (int y = 0; y < R; y++) {
            float32x4_t qv = vld1q_f32(qr[y] + c);
            for (int x = 0; x < KEYS; x++)
                acc[y][x] = vfmaq_f32(acc[y][x], qv, kv[x]);
        }
    }
    if (c < d) {
        float32x4_t kv[KEYS];
        for (int x = 0; x < KEYS; x++)
            kv[x] = load_tail(kr[x], t, c, d - c);
        for (int y = 0; y < R; y++) {
            float32x4_t qv = load_tail(qr[y], MK_F32, c, d - c);
            for (int x = 0; x < KEYS; x++)
                acc[y][x] = vfmaq_f32(acc[y][x], qv, kv[x]);
        }
    }
    for (int y = 0; y < R && y < rows; y++)
        for (int x = 0; x < nk; x++) {
            float v = vaddvq_f32(acc[y][x]);
            s[y * lds + x] = mk_dtype_scaled(t) ? v * code_factor(t) * sc[x]
                                                : v;
        }
}

INLINE void qk_typed(const float *q, ptrdiff_t ldq, int64_t m,
                     const char *k, mk_dtype t, ptrdiff_t ldk,
                     const void *const *k_rows, const float *ks, ptrdiff_t ks_ld, int64_t n, int64_t d,
                     float *s, ptrdiff_t lds)
{
    const size_t ld_bytes = (size_t)ldk * mk_dtype_size(t);
    const size_t row_bytes = (size_t)d * mk_dtype_size(t);
    const int64_t ahead = prefetch_distance(row_bytes);
    for (int64_t j0 = 0; j0 < n; j0 += KEYS) {
        int64_t nk = n - j0 < KEYS ? n - j0 : KEYS;
        const char *kr[KEYS];
        float sc[KEYS] = {0};
        for (int x = 0; x < KEYS; x++)
            kr[x] = mk_decode_row(k, ldk, k_rows, mk_dtype_size(t),
                                  j0 + (x < nk ? x : nk - 1));
        if (mk_dtype_scaled(t))
            for (int x = 0; x < nk; x++)
                sc[x] = ks[(j0 + x) * ks_ld];
        prefetch_rows(k, ld_bytes, k_rows, j0 + ahead, n, row_bytes);
        int64_t i = 0;
        for (; m - i >= 3; i += 4) /* 3 rows take a 4-row tile */
            qk_tile(q + i * ldq, ldq, m - i < 4 ? m - i : 4, kr, sc, nk, t, d,
                    s + i * lds + j0, lds, 4);
        if (m - i == 2)
            qk_tile(q + i * ldq, ldq, 2, kr, sc, nk, t, d, s + i * lds + j0,
                    lds, 2);
        else if (m - i == 1)
            qk_tile(q + i * ldq, ldq, 1, kr, sc, nk, t, d, s + i * lds + j0,
                    lds, 1);
    }
}

void mk_neon_decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                       const void *k, mk_dtype kt, ptrdiff_t ldk,
                       const void *const *k_rows, const float *ks,
                       ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                       ptrdiff_t lds, const mk_heads *heads)
{
    assert(!mk_dtype_scaled(kt) == !ks && ks_ld >= 0);
    if (heads) { /* one call per kv head */
        assert(heads->group > 0 && heads->group <= MK_DECODE_ROWS);
        mk_decode_qk_by_head(mk_neon_decode_qk, q, ldq, m, k, kt, ldk, k_rows,
                             ks, ks_ld, n, d, s, lds, heads);
        return;
    }
    assert(m >= 0 && m <= MK_DECODE_ROWS && n >= 0 && d >= 0);
    assert(ldq >= 0 && ldk >= 0 && (m <= 1 || lds >= n));
    if (m == 0 || n == 0)
        return;
#define QK_TYPED(T)                                                       \
    qk_typed(q, ldq, m, k, T, ldk, k_rows, ks, ks_ld, n, d, s, lds)
    MK_FOR_DTYPE(kt, QK_TYPED)
#undef QK_TYPED
}

/* o[i][c, c + 4) += sum over the NK keys vr[x] of p[i][x] * V[x][c, ...),
 * one FMA per key in key order, for i < m; the last `left` (< 4) columns
 * when left > 0, through a buffer so nothing past a row is touched. */
INLINE void pv_strip(const float *p, ptrdiff_t ldp, int64_t m,
                     const char *const vr[KEYS], mk_dtype t, int64_t c,
                     int64_t left, float *o, ptrdiff_t ldo, int NK)
{
    float32x4_t vv[KEYS];
    for (int x = 0; x < NK; x++)
        vv[x] = left ? load_tail(vr[x], t, c, left) : load4(vr[x], t, c);
    for (int64_t i = 0; i < m; i++) {
        float *orow = o + i * ldo + c;
        float buf[4] = {0};
        if (left)
            memcpy(buf, orow, (size_t)left * sizeof buf[0]);
        float32x4_t acc = vld1q_f32(left ? buf : orow);
        for (int x = 0; x < NK; x++)
            acc = vfmaq_n_f32(acc, vv[x], p[i * ldp + x]);
        if (left) {
            vst1q_f32(buf, acc);
            memcpy(orow, buf, (size_t)left * sizeof buf[0]);
        } else {
            vst1q_f32(orow, acc);
        }
    }
}

/* The NK (KEYS or 1, a constant once inlined) keys vr, all columns. */
INLINE void pv_keys(const float *p, ptrdiff_t ldp, int64_t m,
                    const char *const vr[KEYS], mk_dtype t, int64_t dv,
                    float *o, ptrdiff_t ldo, int NK)
{
    int64_t c = 0;
    for (; c + 4 <= dv; c += 4)
        pv_strip(p, ldp, m, vr, t, c, 0, o, ldo, NK);
    if (c < dv)
        pv_strip(p, ldp, m, vr, t, c, dv - c, o, ldo, NK);
}

/* p's columns [j0, j0 + nk) times their rows' scales and the code factor,
 * as MK_DECODE_ROWS x KEYS coefficients (row stride KEYS) into cf. */
INLINE const float *scaled_probs(const float *p, ptrdiff_t ldp, int64_t m,
                                 mk_dtype t, const float *vs,
                                 ptrdiff_t vs_ld, int64_t j0, int64_t nk,
                                 float *cf)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t x = 0; x < nk; x++)
            cf[i * KEYS + x] =
                p[i * ldp + j0 + x] * vs[(j0 + x) * vs_ld] * code_factor(t);
    return cf;
}

INLINE void pv_typed(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                     const char *v, mk_dtype t, ptrdiff_t ldv,
                     const void *const *v_rows, const float *vs, ptrdiff_t vs_ld, int64_t dv, float *o,
                     ptrdiff_t ldo)
{
    float cf[MK_DECODE_ROWS * KEYS];
    const size_t ld_bytes = (size_t)ldv * mk_dtype_size(t);
    const size_t row_bytes = (size_t)dv * mk_dtype_size(t);
    const int64_t ahead = prefetch_distance(row_bytes);
    int64_t j0 = 0;
    for (; j0 + KEYS <= n; j0 += KEYS) {
        const char *vr[KEYS];
        for (int x = 0; x < KEYS; x++)
            vr[x] = mk_decode_row(v, ldv, v_rows, mk_dtype_size(t), j0 + x);
        prefetch_rows(v, ld_bytes, v_rows, j0 + ahead, n, row_bytes);
        if (mk_dtype_scaled(t))
            pv_keys(scaled_probs(p, ldp, m, t, vs, vs_ld, j0, KEYS, cf), KEYS,
                    m, vr, t, dv, o, ldo, KEYS);
        else
            pv_keys(p + j0, ldp, m, vr, t, dv, o, ldo, KEYS);
    }
    for (; j0 < n; j0++) {
        const char *vr[KEYS] = {
            mk_decode_row(v, ldv, v_rows, mk_dtype_size(t), j0)};
        if (mk_dtype_scaled(t))
            pv_keys(scaled_probs(p, ldp, m, t, vs, vs_ld, j0, 1, cf), KEYS, m,
                    vr, t, dv, o, ldo, 1);
        else
            pv_keys(p + j0, ldp, m, vr, t, dv, o, ldo, 1);
    }
}

void mk_neon_decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                       const void *v, mk_dtype vt, ptrdiff_t ldv,
                       const void *const *v_rows, const float *vs,
                       ptrdiff_t vs_ld, int64_t dv, const float *alpha,
                       float *o, ptrdiff_t ldo, const mk_heads *heads)
{
    assert(!mk_dtype_scaled(vt) == !vs && vs_ld >= 0);
    if (heads) {
        assert(heads->group > 0 && heads->group <= MK_DECODE_ROWS);
        mk_decode_pv_by_head(mk_neon_decode_pv, p, ldp, m, n, v, vt, ldv,
                             v_rows, vs, vs_ld, dv, alpha, o, ldo, heads);
        return;
    }
    assert(m >= 0 && m <= MK_DECODE_ROWS && n >= 0 && dv >= 0);
    assert(ldp >= 0 && ldv >= 0 && (m <= 1 || ldo >= dv));
    for (int64_t i = 0; alpha && i < m; i++) {
        float *orow = o + i * ldo;
        int64_t c = 0;
        for (; c + 4 <= dv; c += 4)
            vst1q_f32(orow + c, vmulq_n_f32(vld1q_f32(orow + c), alpha[i]));
        for (; c < dv; c++)
            orow[c] *= alpha[i];
    }
    if (m == 0 || n == 0)
        return;
#define PV_TYPED(T)                                                       \
    pv_typed(p, ldp, m, n, v, T, ldv, v_rows, vs, vs_ld, dv, o, ldo)
    MK_FOR_DTYPE(vt, PV_TYPED)
#undef PV_TYPED
}
