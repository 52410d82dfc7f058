/* The generic decode kernels: a few query rows against key and value rows
 * read in place, in any element type. Rows are widened 64 elements at a
 * time into a stack buffer; every sum runs in an order fixed by d alone,
 * so a value depends only on its own inputs. */
#include <assert.h>

#include "generic.h"

enum { CHUNK = 64 };

/* Elements [c, c + n) of a row of type t as fp32: the row itself for
 * MK_F32, else widened into y. */
static const float *widen(const void *row, mk_dtype t, int64_t c, int64_t n,
                          float *y)
{
    switch (t) {
    case MK_F32: return (const float *)row + c;
    case MK_F16: mk_generic_widen_f16((const uint16_t *)row + c, n, y); break;
    case MK_BF16: mk_generic_widen_bf16((const uint16_t *)row + c, n, y); break;
    case MK_I8: mk_generic_widen_i8((const int8_t *)row + c, n, y); break;
    case MK_FP8_E4M3:
        mk_generic_widen_fp8_e4m3((const uint8_t *)row + c, n, y);
        break;
    case MK_FP8_E5M2:
        mk_generic_widen_fp8_e5m2((const uint8_t *)row + c, n, y);
        break;
    case MK_DTYPE_COUNT: break;
    }
    return y;
}

/* Rows fetched ahead into L2 (as in the AVX2 kernels): K/V rows of one head
 * are a page or more apart in [B, L, H, D], where hardware prefetchers
 * stop, and decode waits on memory. Only with GCC or Clang; never past row
 * n - 1. */
enum { AHEAD = 32 };

/* Inlined: GCC's pure-const analysis otherwise finds a function that only
 * prefetches free of effects and drops its calls. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void prefetch_row(const void *base, ptrdiff_t ld,
                                const void *const *rows, size_t es,
                                int64_t j, int64_t n, int64_t width)
{
#if defined(__GNUC__)
    if (j >= n)
        return;
    const char *row = mk_decode_row(base, ld, rows, es, j);
    size_t bytes = (size_t)width * es;
    for (size_t off = 0; off < bytes; off += 64)
        __builtin_prefetch(row + off, 0, 2);
    __builtin_prefetch(row + bytes - 1, 0, 2);
#else
    (void)base, (void)ld, (void)rows, (void)es, (void)j, (void)n,
        (void)width;
#endif
}

/* Dot products keep LANES partial sums (element x adds into sum x % LANES),
 * added up in a fixed order at the end: independent chains the compiler
 * can keep in vector registers, the same order for every m and n. */
enum { LANES = 8 };

static float dot(const float *q, const void *row, mk_dtype t, int64_t d)
{
    float kb[CHUNK], a[LANES] = {0.0f};
    for (int64_t c = 0; c < d; c += CHUNK) {
        int64_t w = d - c < CHUNK ? d - c : CHUNK, x = 0;
        const float *kr = widen(row, t, c, w, kb), *qr = q + c;
        for (; x + LANES <= w; x += LANES)
            for (int u = 0; u < LANES; u++)
                a[u] += qr[x + u] * kr[x + u];
        for (; x < w; x++)
            a[x % LANES] += qr[x] * kr[x];
    }
    float sum = 0.0f;
    for (int u = 0; u < LANES; u++)
        sum += a[u];
    return sum;
}

void mk_generic_decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                          const void *k, mk_dtype kt, ptrdiff_t ldk,
                          const void *const *k_rows, const float *ks,
                          ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                          ptrdiff_t lds, const mk_heads *heads)
{
    assert(!mk_dtype_scaled(kt) == !ks && ks_ld >= 0);
    if (heads) { /* one call per kv head */
        assert(heads->group > 0 && heads->group <= MK_DECODE_ROWS);
        mk_decode_qk_by_head(mk_generic_decode_qk, q, ldq, m, k, kt, ldk, k_rows,
                             ks, ks_ld, n, d, s, lds, heads);
        return;
    }
    assert(m >= 0 && m <= MK_DECODE_ROWS && n >= 0 && d >= 0);
    for (int64_t j = 0; j < n; j++) {
        const char *row = mk_decode_row(k, ldk, k_rows, mk_dtype_size(kt), j);
        prefetch_row(k, ldk, k_rows, mk_dtype_size(kt), j + AHEAD, n, d);
        for (int64_t i = 0; i < m; i++) {
            float x = dot(q + i * ldq, row, kt, d);
            s[i * lds + j] = ks ? x * ks[j * ks_ld] : x;
        }
    }
}

void mk_generic_decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                          const void *v, mk_dtype vt, ptrdiff_t ldv,
                          const void *const *v_rows, const float *vs,
                          ptrdiff_t vs_ld, int64_t dv,
                          const float *alpha, float *o, ptrdiff_t ldo,
                          const mk_heads *heads)
{
    assert(!mk_dtype_scaled(vt) == !vs && vs_ld >= 0);
    if (heads) {
        assert(heads->group > 0 && heads->group <= MK_DECODE_ROWS);
        mk_decode_pv_by_head(mk_generic_decode_pv, p, ldp, m, n, v, vt, ldv,
                             v_rows, vs, vs_ld, dv, alpha, o, ldo, heads);
        return;
    }
    assert(m >= 0 && m <= MK_DECODE_ROWS && n >= 0 && dv >= 0);
    float vb[CHUNK];
    for (int64_t i = 0; alpha && i < m; i++)
        for (int64_t c = 0; c < dv; c++)
            o[i * ldo + c] *= alpha[i];
    for (int64_t j = 0; j < n; j++) {
        const char *row = mk_decode_row(v, ldv, v_rows, mk_dtype_size(vt), j);
        prefetch_row(v, ldv, v_rows, mk_dtype_size(vt), j + AHEAD, n, dv);
        for (int64_t c = 0; c < dv; c += CHUNK) {
            int64_t w = dv - c < CHUNK ? dv - c : CHUNK;
            const float *vr = widen(row, vt, c, w, vb);
            for (int64_t i = 0; i < m; i++) {
                float pij = p[i * ldp + j], *orow = o + i * ldo + c;
                if (vs)
                    pij *= vs[j * vs_ld];
                for (int64_t x = 0; x < w; x++)
                    orow[x] += pij * vr[x];
            }
        }
    }
}
