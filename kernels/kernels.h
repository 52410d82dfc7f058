/*
 * The kernel table shared by every ISA.
 *
 * Kernels are single-threaded, allocation-free pure functions on pointers and
 * sizes. They never see OpenMP, the public structs or errors; the engine
 * validates everything before calling them. Matrices are row-major with an
 * explicit row stride ("ld", in elements); columns are contiguous. An input
 * row stride may be 0 (a broadcast row) or smaller than the row; only
 * outputs need ld >= their width.
 *
 * Each ISA has one static table. It sets the slots it speeds up and leaves
 * the others NULL; the engine copies the generic table and overrides it with
 * the non-NULL slots, so a missing kernel falls back instead of crashing.
 * Tile sizes travel in the same table as the kernels that need them: an ISA
 * that sets qk or pack_k sets block_q and block_k too (0 = keep generic's).
 *
 * Determinism contract: given the same table, the value a kernel writes for
 * one element depends only on the inputs of that element, never on m, n, or
 * where the element falls within a tile. (The engine also cuts work into
 * blocks whose size never depends on the thread count.)
 */
#ifndef MHA_KERNELS_H
#define MHA_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The mask of one (query block x key block) tile, in block coordinates:
 * row i, column j of the tile. Key j is visible to query i iff
 *   j <= i + causal_diag,   j < key_limit,
 *   keep == NULL || keep[i * keep_ld + j] != 0,
 * and the additive term bias[i * bias_ld + j] is added to its scaled score
 * when bias != NULL. A row stride of 0 broadcasts one row to all rows. */
typedef struct mk_mask {
    const uint8_t *keep;
    ptrdiff_t keep_ld;
    const float *bias;
    ptrdiff_t bias_ld;
    int64_t causal_diag; /* MK_NO_CAUSAL when there is no causal mask */
    int64_t key_limit;   /* >= n when no key-length mask applies */
} mk_mask;

#define MK_NO_CAUSAL INT64_MAX

/* Columns [0, result) of row i of an n-column tile are the ones neither the
 * causal diagonal nor the key limit hides; the rest are masked. */
static inline int64_t mk_visible_columns(const mk_mask *mask, int64_t i,
                                         int64_t n)
{
    int64_t visible = n;
    if (mask->causal_diag != MK_NO_CAUSAL && i + mask->causal_diag + 1 < n) {
        int64_t end = i + mask->causal_diag + 1;
        visible = end < 0 ? 0 : end;
    }
    if (mask->key_limit < visible)
        visible = mask->key_limit < 0 ? 0 : mask->key_limit;
    return visible;
}

/* Whether a scaled, masked score row holds a NaN. A row whose maximum is
 * -inf is fully masked only if it has none: max() skips NaNs, and a NaN
 * that reaches every visible score must come out as NaN, not zeros. */
static inline int mk_row_has_nan(const float *row, int64_t n)
{
    int nan = 0;
    for (int64_t j = 0; j < n; j++)
        nan |= row[j] != row[j];
    return nan;
}

/* Element types of keys and values as the decode kernels read them (the
 * values match mha_dtype). */
typedef enum mk_dtype { MK_F32 = 0, MK_F16 = 1, MK_BF16 = 2 } mk_dtype;

/* Blocks of at most this many query rows take the decode kernels: keys and
 * values are read in place (any element type, widened in registers), not
 * packed, so a key or value byte travels from memory once. */
#define MK_DECODE_ROWS 8

/* A row's running max after a block whose scaled, masked maximum is bmax,
 * as softmax_update defines it: max(old, bmax); when that is -inf, NaN if
 * a visible score is NaN (it must propagate), else -inf: the row is still
 * empty (P = 0, alpha = 1). */
static inline float mk_row_next_max(const float *row, int64_t visible,
                                    float bmax, float old)
{
    float mnew = bmax > old ? bmax : old;
    if (mnew == -INFINITY && mk_row_has_nan(row, visible))
        mnew = NAN; /* every visible score is NaN */
    return mnew;
}

typedef struct mk_table {
    const char *name; /* "generic", "avx2", "avx512", "neon" */

    /* Attention tile: query rows per block and keys per block. */
    int64_t block_q;
    int64_t block_k;

    /* Floats of scratch pack_k needs for n keys of depth d. block_k is a
     * multiple of the packing panel, so for k0 a multiple of block_k,
     * packed_k_floats(k0, d) is where key k0's block starts in a pack of
     * more keys (the engine packs a head once and reuses it). */
    size_t (*packed_k_floats)(int64_t n, int64_t d);
    /* Pack n keys (rows of k, stride ldk, depth d) into kp, the layout qk
     * reads. */
    void (*pack_k)(const float *k, ptrdiff_t ldk, int64_t n, int64_t d,
                   float *kp);
    /* s[i][j] = sum_p q[i][p] * K[j][p] for i < m, j < n (unscaled). */
    void (*qk)(const float *q, ptrdiff_t ldq, int64_t m, const float *kp,
               int64_t n, int64_t d, float *s, ptrdiff_t lds);
    /* The fused scale + mask + online softmax step over an m x n score tile.
     * In place, s becomes P = exp(x - row_max'), where x = scale * s + bias,
     * or -inf where masked, and row_max' = max(row_max, max_j x). Then
     * alpha[i] = exp(row_max - row_max'), row_sum = row_sum * alpha +
     * sum_j P, row_max = row_max'. A row whose maximum is still -inf gets
     * P = 0 and alpha = 1. */
    void (*softmax_update)(float *s, ptrdiff_t lds, int64_t m, int64_t n,
                           float scale, const mk_mask *mask, float *row_max,
                           float *row_sum, float *alpha);
    /* o[i][c] = alpha[i] * o[i][c] + sum_j p[i][j] * v[j][c], c < dv. */
    void (*pv)(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
               const float *v, ptrdiff_t ldv, int64_t dv, const float *alpha,
               float *o, ptrdiff_t ldo);
    /* out[i][c] = o[i][c] / row_sum[i], or 0 when row_sum[i] == 0. */
    void (*normalize)(const float *o, ptrdiff_t ldo, int64_t m, int64_t dv,
                      const float *row_sum, float *out, ptrdiff_t ldout);

    /* Decode (m <= MK_DECODE_ROWS query rows). decode_qk: s[i][j] = sum_p
     * q[i][p] * K[j][p], unscaled, with key j's row at k + j * ldk elements
     * of type kt. decode_pv: o[i][c] = alpha[i] * o[i][c] + sum_j p[i][j] *
     * V[j][c], c < dv, value rows at v + j * ldv elements of type vt. Both
     * may prefetch rows they will read later, never past row n - 1. */
    void (*decode_qk)(const float *q, ptrdiff_t ldq, int64_t m, const void *k,
                      mk_dtype kt, ptrdiff_t ldk, int64_t n, int64_t d,
                      float *s, ptrdiff_t lds);
    void (*decode_pv)(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                      const void *v, mk_dtype vt, ptrdiff_t ldv, int64_t dv,
                      const float *alpha, float *o, ptrdiff_t ldo);

    /* Half-precision keys and values: widen n binary16 / bfloat16 values
     * to fp32 (exactly; NaN stays NaN). */
    void (*cvt_f16)(const uint16_t *x, int64_t n, float *y);
    void (*cvt_bf16)(const uint16_t *x, int64_t n, float *y);

    /* The layer's projections: c = a w^T (+ bias), w in nn.Linear layout
     * [n, k], packed once by pack_w into packed_w_floats(n, k) floats. */
    size_t (*packed_w_floats)(int64_t n, int64_t k);
    void (*pack_w)(const float *w, int64_t n, int64_t k, float *wp);
    void (*linear)(const float *a, ptrdiff_t lda, int64_t m, const float *wp,
                   int64_t n, int64_t k, const float *bias, float *c,
                   ptrdiff_t ldc);
} mk_table;

/* The static tables. mk_table_avx2 exists only when the build defines
 * MHA_HAVE_AVX2, mk_table_avx512 only with MHA_HAVE_AVX512, mk_table_neon
 * only with MHA_HAVE_NEON. Whether the CPU can
 * run a table is the engine's question. */
extern const mk_table mk_table_generic;
extern const mk_table mk_table_avx2;
extern const mk_table mk_table_avx512;
extern const mk_table mk_table_neon;

#ifdef __cplusplus
}
#endif

#endif /* MHA_KERNELS_H */
