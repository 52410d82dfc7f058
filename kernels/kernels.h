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
 * Each ISA fills a table through its initialiser (below), which starts
 * from its base ISA's table and overrides the slots it speeds up. Tile
 * sizes travel in the same table as the kernels that need them: an ISA
 * that sets qk or pack sets block_q and block_k too. Kernel names follow
 * mk_<isa>_<op>[_<tile>] (docs/design.md, "kernel contract").
 *
 * Determinism contract: given the same table, the value a kernel writes for
 * one element depends only on the inputs of that element, never on m, n, or
 * where the element falls within a tile. (The engine also cuts work into
 * blocks whose size never depends on the thread count, but for the
 * layer's projection rows, which this contract alone keeps exact.)
 */
#ifndef MHA_KERNELS_H
#define MHA_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Element types ---------------------------------------------------- */

/* Storage types of keys and values (the values match mha_dtype). Every
 * switch over it is exhaustive (-Wswitch-enum): a new dtype is a compile
 * error wherever it needs a case, never a silent fall-through. */
typedef enum mk_dtype {
    MK_F32 = 0,
    MK_F16 = 1,  /* IEEE binary16 */
    MK_BF16 = 2, /* bfloat16 */
    MK_I8 = 3,       /* symmetric int8 code, times a per-row scale */
    MK_FP8_E4M3 = 4, /* OCP E4M3 (NaN 0x7F/0xFF, no infinities), scaled */
    MK_FP8_E5M2 = 5, /* OCP E5M2 (the top byte of a binary16), scaled */
    MK_DTYPE_COUNT
} mk_dtype;

/* Bytes of one element; 0 for a value outside the enum. */
static inline size_t mk_dtype_size(mk_dtype t)
{
    switch (t) {
    case MK_F32: return 4;
    case MK_F16: return 2;
    case MK_BF16: return 2;
    case MK_I8:
    case MK_FP8_E4M3:
    case MK_FP8_E5M2: return 1;
    case MK_DTYPE_COUNT: break;
    }
    return 0;
}

/* Whether rows of the dtype carry a scale (dequantised value = code x the
 * row's scale; docs/design.md, "Dtypes"). */
static inline int mk_dtype_scaled(mk_dtype t)
{
    switch (t) {
    case MK_F32:
    case MK_F16:
    case MK_BF16: return 0;
    case MK_I8:
    case MK_FP8_E4M3:
    case MK_FP8_E5M2: return 1;
    case MK_DTYPE_COUNT: break;
    }
    return 0;
}

/* Runs CALL(T) with T the constant (MK_F32, MK_F16, ...) that t holds, so
 * a kernel inlined with its element type as a constant gets one instance
 * per dtype. Exhaustive, like every switch over mk_dtype. */
#define MK_FOR_DTYPE(t, CALL)                                             \
    switch (t) {                                                          \
    case MK_F32: CALL(MK_F32); break;                                     \
    case MK_F16: CALL(MK_F16); break;                                     \
    case MK_BF16: CALL(MK_BF16); break;                                   \
    case MK_I8: CALL(MK_I8); break;                                       \
    case MK_FP8_E4M3: CALL(MK_FP8_E4M3); break;                           \
    case MK_FP8_E5M2: CALL(MK_FP8_E5M2); break;                           \
    case MK_DTYPE_COUNT: break;                                           \
    }

/* ---- Masks -------------------------------------------------------------- */

/* The mask and score terms of one (query block x key block) tile, in
 * block coordinates: row i, column j of the tile. Row i sees the columns
 * of one range [lo_i, hi_i) (mk_visible_range):
 *   lo_i = max(0, key_start, q_i + diag_lo)      (MK_NO_DIAG_LO: no edge)
 *   hi_i = min(n, key_limit, q_i + diag_hi + 1)  (MK_NO_DIAG_HI: none)
 * where q_i, the row's query, is i, or (i / diag_rows) % diag_period
 * when diag_period > 0: rows that interleave the queries of several
 * heads (diag_rows rows a query, diag_period queries a head; the row's
 * head h_i is then (i / (diag_rows * diag_period)) * diag_rows + i %
 * diag_rows, else i: mk_row_of), and inside it key j is masked when
 * keep != NULL && keep[h_i*keep_ld + q_i*keep_qld + j] == 0 or key_keep
 * != NULL && key_keep[j] == 0 (one row every row shares). The score of a
 * visible key, with t = scale * s[i][j] (docs/design.md, "Score terms"):
 *   x = softcap * tanh(t / softcap)   when softcap > 0, else t
 *   x += alibi[h_i*alibi_ld] * (j - (alibi_pos + q_i*alibi_pos_step))
 *                                     when alibi != NULL
 *   x += bias[h_i*bias_ld + q_i*bias_qld + j]   when bias != NULL
 * keep_qld and bias_qld are 0 unless diag_period > 0 (a row's own stride
 * is then keep_ld, bias_ld alone). A row stride of 0 broadcasts one row
 * to all rows. diag_hi is the causal
 * diagonal (or a window's right edge); diag_lo a window's left edge;
 * key_start a left edge shared by every row (docs/design.md, "mask
 * model"). Zero softcap, NULL alibi and key_start 0 are off. */
typedef struct mk_mask {
    const uint8_t *keep;
    ptrdiff_t keep_ld, keep_qld;
    const uint8_t *key_keep; /* a key padding row for every row, or NULL */
    const float *bias;
    ptrdiff_t bias_ld, bias_qld;
    int64_t diag_lo;   /* MK_NO_DIAG_LO when nothing hides keys on the left */
    int64_t diag_hi;   /* MK_NO_DIAG_HI when there is no causal diagonal */
    int64_t diag_rows;   /* with diag_period > 0: rows a query */
    int64_t diag_period; /* 0: row i is query i; else queries a head */
    int64_t key_limit; /* >= n when no key-length mask applies */
    int64_t key_start; /* <= 0 when no shared left edge applies */
    float softcap;     /* 0: off */
    const float *alibi; /* per-row slope (row stride alibi_ld), or NULL */
    ptrdiff_t alibi_ld;
    int64_t alibi_pos;      /* row 0's aligned query position, in columns */
    int64_t alibi_pos_step; /* its step per row: 1, or 0 (rows share one
                               query) */
} mk_mask;

#define MK_NO_DIAG_LO INT64_MIN
#define MK_NO_DIAG_HI INT64_MAX

/* Row i's query and head: both i, or for rows interleaving the queries
 * of several heads (period > 0 queries a head, `rows` rows a query) its
 * place in them. The engine lays out such blocks by the same map. */
typedef struct {
    int64_t q, h;
} mk_row;
static inline mk_row mk_row_in(int64_t i, int64_t rows, int64_t period)
{
    mk_row r = {i, i};
    if (period > 0) {
        r.q = i / rows % period;
        r.h = i / (rows * period) * rows + i % rows;
    }
    return r;
}
static inline mk_row mk_row_of(const mk_mask *mask, int64_t i)
{
    return mk_row_in(i, mask->diag_rows, mask->diag_period);
}

/* The visible columns [*lo, *hi) of row i of an n-column tile; *lo >= *hi
 * means the row sees nothing in this tile. 0 <= *lo and *hi <= n. */
static inline void mk_visible_range(const mk_mask *mask, int64_t i, int64_t n,
                                    int64_t *lo, int64_t *hi)
{
    int64_t h = n;
    i = mk_row_of(mask, i).q;
    if (mask->diag_hi != MK_NO_DIAG_HI && i + mask->diag_hi + 1 < h)
        h = i + mask->diag_hi + 1;
    if (mask->key_limit < h)
        h = mask->key_limit;
    int64_t l = mask->key_start > 0 ? mask->key_start : 0;
    if (mask->diag_lo != MK_NO_DIAG_LO && i + mask->diag_lo > l)
        l = i + mask->diag_lo;
    if (h < 0)
        h = 0;
    if (l > h)
        l = h;
    *lo = l;
    *hi = h;
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

/* A row's running max after a block whose scaled, masked maximum over the
 * n visible scores at row is bmax, as softmax_update defines it:
 * max(old, bmax); when that is -inf, NaN if a visible score is NaN (it must
 * propagate), else -inf: the row is still empty (P = 0, alpha = 1). */
static inline float mk_row_next_max(const float *row, int64_t n, float bmax,
                                    float old)
{
    float mnew = bmax > old ? bmax : old;
    if (mnew == -INFINITY && mk_row_has_nan(row, n))
        mnew = NAN; /* every visible score is NaN */
    return mnew;
}

/* The floor of the softmax step's exps, in base 2: every table makes a P
 * or rescale factor 0 from 2^MK_EXP_FLOOR_LOG2 down (exp(x - max) for x -
 * max below about -44.7), and keeps one above it (the tables' own forms
 * round the edge within an ulp of it). An x86 core computes on subnormal
 * floats through microcode assists, and a P·V sum that starts from P near
 * FLT_MIN passes through subnormals (P times a value below 1): a floor at
 * FLT_MIN left causal ALiBi (1,16,2048,2048,64) 1.6-1.7x slower than plain
 * causal on Intel, this floor 1.09x (docs/design.md, "The softmax step's
 * exp"). What it drops is below 2^-64.5 of the row's largest P a key, so
 * under 2^-44 of a sum of a million keys: invisible in fp32. */
#define MK_EXP_FLOOR_LOG2 (MK_EXP_FLOOR_HALVES / 2.0)
/* The same in halves of a binade: an integer, for the static assertions
 * of the tables' forms (clang refuses a floating-point comparison in a
 * _Static_assert). */
#define MK_EXP_FLOOR_HALVES (-129)
/* The same for an exp of x in the natural base: x below ln(2^-64.5),
 * about -44.708, gives 0 (generic's exp and NEON's rescale exp compare x
 * with it). */
#define MK_EXP_FLOOR_LN ((float)(MK_EXP_FLOOR_LOG2 * 0.69314718055994531))

/* Blocks of at most this many query rows take the decode kernels: keys and
 * values are read in place (any element type, widened in registers), not
 * packed, so a key or value byte travels from memory once. */
#define MK_DECODE_ROWS 8

/* The most rows of one kv head a table's decode kernels may take
 * (mk_table.decode_rows): where more than MK_DECODE_ROWS rows read the
 * same keys (a grouped-query group of 16, or a speculative step's queries
 * of a group), a kernel with room for them computes their scores with
 * the rows across its lanes (docs/design.md, "Kernel contract"). */
#define MK_DECODE_WIDE_ROWS 16

/* ---- The kernel types, declared once ----------------------------------- */

/* Floats of scratch pack needs for n rows of depth k. */
typedef size_t mk_packed_floats_fn(int64_t n, int64_t k);
/* Packs n rows of x (row stride ldx, depth k) into the panel layout qk and
 * linear read (keys for qk, nn.Linear weight rows for linear). For n0 a
 * multiple of block_k, packed_floats(n0, k) is where row n0's panel starts
 * in a pack of more rows (the engine packs a head once and reuses it);
 * likewise for any n0 with packed_floats(n0, k) == n0 * k (whole panels),
 * so packs of whole panels laid end to end are the pack of their rows
 * stacked (the layer's q, k and v, engine/layer.c). */
typedef void mk_pack_fn(const float *x, ptrdiff_t ldx, int64_t n, int64_t k,
                        float *packed);
/* s[i][j] = sum_p q[i][p] * K[j][p] for i < m, j < n (unscaled), K packed. */
typedef void mk_qk_fn(const float *q, ptrdiff_t ldq, int64_t m,
                      const float *kp, int64_t n, int64_t d, float *s,
                      ptrdiff_t lds);
/* The fused scale + mask + online softmax step over an m x n score tile.
 * In place, s becomes P = exp(x - row_max'), where x is the score of
 * mk_mask (scale * s, softcap, ALiBi, bias), or -inf where masked, and
 * row_max' = max(row_max, max_j x). Then alpha[i] = exp(row_max -
 * row_max'), row_sum = row_sum * alpha + sum_j P, row_max = row_max'. A
 * row whose maximum is still -inf gets P = 0 and alpha = 1
 * (mk_row_next_max). */
typedef void mk_softmax_update_fn(float *s, ptrdiff_t lds, int64_t m,
                                  int64_t n, float scale, const mk_mask *mask,
                                  float *row_max, float *row_sum,
                                  float *alpha);
/* o[i][c] = alpha[i] * o[i][c] + sum_j p[i][j] * v[j][c], c < dv. */
typedef void mk_pv_fn(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                      const float *v, ptrdiff_t ldv, int64_t dv,
                      const float *alpha, float *o, ptrdiff_t ldo);
/* out[i][c] = o[i][c] / row_sum[i], or 0 when row_sum[i] == 0. stream
 * (the engine's choice: rows nobody reads soon, mha_streams_out) lets a
 * table write whole 64-byte aligned rows with non-temporal stores, then
 * fence them; the values are the same either way. */
typedef void mk_normalize_fn(const float *o, ptrdiff_t ldo, int64_t m,
                             int64_t dv, const float *row_sum, float *out,
                             ptrdiff_t ldout, int stream);
/* A row block's last key block: pv, then normalize of its sums into out,
 * the same bits as the table's pv and normalize called in turn (out the
 * product of each sum and 1 / row_sum[i], or 0), o left undefined. The
 * tables whose P·V runs on the tile driver's register tile
 * (kernels/tile_driver.h) normalise each tile's sums before they leave
 * its registers, so the output rows are written once, among the FMAs,
 * instead of in a pass of their own after them (docs/design.md). stream
 * as normalize's. */
typedef void mk_pv_finish_fn(const float *p, ptrdiff_t ldp, int64_t m,
                             int64_t n, const float *v, ptrdiff_t ldv,
                             int64_t dv, const float *alpha, float *o,
                             ptrdiff_t ldo, const float *row_sum, float *out,
                             ptrdiff_t ldout, int stream);
/* Decode (few query rows). decode_qk: s[i][j] = sk_j *
 * sum_p q[i][p] * K[j][p], unscaled by the softmax scale, with key j's row
 * at k + j * ldk elements of type kt, or at k_rows[j] when the row
 * table k_rows is given (a paged cache's rows; k and ldk are then unused).
 * decode_pv: o[i][c] = alpha[i] * o[i][c] + sum_j (p[i][j] * sv_j) *
 * V[j][c], c < dv, value rows at v + j * ldv elements of type vt, or at
 * v_rows[j]; alpha NULL adds to o unscaled. K[j][p] and V[j][c] are the exact
 * values of their codes; sk_j = ks[j * ks_ld] (sv_j = vs[j * vs_ld]) is
 * the row's scale when the dtype is scaled (mk_dtype_scaled; ks_ld 0
 * broadcasts one scale), and ks is NULL and sk_j = 1 (no multiply) when it
 * is not. A kernel may compute on the codes times a power of two and undo
 * it in the row's factor: the rounding is that of the formula. Both may
 * prefetch rows they will read later, never past row n - 1 (n + more - 1
 * with heads given).
 *
 * heads NULL: every row reads the same K (V) rows, m <= the table's
 * decode_rows. A score of a call with m <= MK_DECODE_ROWS rows is, bit for
 * bit, the same as with its row alone; one of a call with more rows (a
 * wide call) the same as in any other wide call (the order of its sums
 * may differ from the narrow calls'). decode_pv's output rows never
 * depend on m.
 * Otherwise the rows span kv heads (docs/design.md, "Decode across
 * heads"): rows [g * group, (g + 1) * group) read kv head g, whose row j
 * lies g * ld elements past the given row j and whose scale g * scale_ld
 * floats past sk_j; group <= MK_DECODE_ROWS, m any; a row table gives
 * head 0's rows. The
 * kernels then read key by key across the heads (a [B, L, H, D]
 * position's heads are one contiguous run) and every value is the same,
 * bit for bit, as with one call per kv head. `more` rows past row n - 1
 * (row table entries, or rows at the stride) are the rows the caller
 * reads next: a kernel may prefetch them (never read them), so the fetch
 * ahead runs on across calls instead of restarting at each call's first
 * rows. `ahead_bytes` bounds how far ahead of the row in use that fetch
 * reaches, in bytes of the rows' runs (0: MK_HEADS_AHEAD_BYTES), and
 * `into_l1` whether that fetch may go into L1 (nonzero) or only into L2;
 * `pass_bytes` how many bytes of fp32 query (output) rows and of one
 * position's runs a pass of the loops across heads may take (0: one pass
 * over all m rows): rows beyond it are taken in further passes over the
 * same n keys. The engine sets the three from the CPU's L1 size (and
 * into_l1 from its vendor too: engine/decode.c); none changes a value. */
typedef struct {
    int64_t group;
    ptrdiff_t ld, scale_ld;
    int64_t more;
    int64_t ahead_bytes;
    int into_l1;
    int64_t pass_bytes;
} mk_heads;
typedef void mk_decode_qk_fn(const float *q, ptrdiff_t ldq, int64_t m,
                             const void *k, mk_dtype kt, ptrdiff_t ldk,
                             const void *const *k_rows, const float *ks,
                             ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                             ptrdiff_t lds, const mk_heads *heads);
typedef void mk_decode_pv_fn(const float *p, ptrdiff_t ldp, int64_t m,
                             int64_t n, const void *v, mk_dtype vt,
                             ptrdiff_t ldv, const void *const *v_rows,
                             const float *vs, ptrdiff_t vs_ld, int64_t dv,
                             const float *alpha, float *o, ptrdiff_t ldo,
                             const mk_heads *heads);

/* Across kv heads: the most positions whose run of heads a kernel fetches
 * ahead (through a row table, for the jumps between cache blocks; in a
 * dense cache too, kernels/decode_heads.h), and how many keys past a
 * call's the engine lets it reach (mk_heads.more). 16 with the fetch
 * restarting at each call; 8 once it runs on across calls (4, 8 and 16
 * measured: docs/benchmarks.md). Fewer when the runs are long: the fetch
 * reaches mk_heads.ahead_bytes of runs ahead, at most MK_HEADS_AHEAD_BYTES
 * (8 runs of 4 KiB; 2 of 32 fp32 heads at d = 128). */
#define MK_HEADS_AHEAD 8
#define MK_HEADS_AHEAD_BYTES 32768

/* CALL(G) with a decode block's rows per kv head as a constant for the
 * common groups (1, 2, 4, 8) when its m rows are whole kv heads, CALL(0)
 * otherwise: a kernel's loop across kv heads then unrolls each head's
 * rows instead of dispatching on the count per head (measured:
 * docs/benchmarks.md), and each constant adds one copy of a head's loop
 * (a short last head goes to CALL(0); sanitizer builds compile these
 * files slowly, so the copies are kept few). */
#define MK_HEADS_GROUP_SWITCH(group, m, CALL)                             \
    switch ((m) % (group) == 0 ? (group) : 0) {                           \
    case 1: CALL(1); break;                                               \
    case 2: CALL(2); break;                                               \
    case 4: CALL(4); break;                                               \
    case 8: CALL(8); break;                                               \
    default: CALL(0); break;                                              \
    }


/* A decode call across kv heads as calls per kv head (heads given): what
 * a table without its own across-heads loop does (generic, NEON). With a
 * row table (head 0's rows), one call per key and kv head; the kernel
 * contract makes that the same, bit for bit, as one call over the keys. */
static inline void mk_decode_qk_by_head(mk_decode_qk_fn *f, const float *q,
                                        ptrdiff_t ldq, int64_t m,
                                        const void *k, mk_dtype kt,
                                        ptrdiff_t ldk,
                                        const void *const *k_rows,
                                        const float *ks, ptrdiff_t ks_ld,
                                        int64_t n, int64_t d, float *s,
                                        ptrdiff_t lds, const mk_heads *h)
{
    size_t es = mk_dtype_size(kt);
    for (int64_t g = 0, i = 0; i < m; g++, i += h->group) {
        int64_t rows = m - i < h->group ? m - i : h->group;
        const float *kg = ks ? ks + g * h->scale_ld : NULL;
        size_t off = (size_t)(g * h->ld) * es;
        if (!k_rows) {
            f(q + i * ldq, ldq, rows, (const char *)k + off, kt, ldk, NULL,
              kg, ks_ld, n, d, s + i * lds, lds, NULL);
            continue;
        }
        for (int64_t j = 0; j < n; j++)
            f(q + i * ldq, ldq, rows, (const char *)k_rows[j] + off, kt, 0,
              NULL, kg ? kg + j * ks_ld : NULL, 0, 1, d, s + i * lds + j, lds,
              NULL);
    }
}
static inline void mk_decode_pv_by_head(mk_decode_pv_fn *f, const float *p,
                                        ptrdiff_t ldp, int64_t m, int64_t n,
                                        const void *v, mk_dtype vt,
                                        ptrdiff_t ldv,
                                        const void *const *v_rows,
                                        const float *vs, ptrdiff_t vs_ld,
                                        int64_t dv, const float *alpha,
                                        float *o, ptrdiff_t ldo,
                                        const mk_heads *h)
{
    size_t es = mk_dtype_size(vt);
    for (int64_t g = 0, i = 0; i < m; g++, i += h->group) {
        int64_t rows = m - i < h->group ? m - i : h->group;
        const float *vg = vs ? vs + g * h->scale_ld : NULL;
        const float *ag = alpha ? alpha + i : NULL;
        size_t off = (size_t)(g * h->ld) * es;
        if (!v_rows || n == 0) {
            f(p + i * ldp, ldp, rows, n, (const char *)v + off, vt, ldv, NULL,
              vg, vs_ld, dv, ag, o + i * ldo, ldo, NULL);
            continue;
        }
        for (int64_t j = 0; j < n; j++) /* alpha with the first key only */
            f(p + i * ldp + j, ldp, rows, 1, (const char *)v_rows[j] + off,
              vt, 0, NULL, vg ? vg + j * vs_ld : NULL, 0, dv,
              j == 0 ? ag : NULL, o + i * ldo, ldo, NULL);
    }
}

/* Row j of a decode operand: rows[j] with a row table, else j rows of ld
 * elements of es bytes past base. */
static inline const char *mk_decode_row(const void *base, ptrdiff_t ld,
                                        const void *const *rows, size_t es,
                                        int64_t j)
{
    return rows ? (const char *)rows[j]
                : (const char *)base + (size_t)(j * ld) * es;
}
/* Widens n elements of one dtype to fp32 exactly (NaN stays NaN); a scaled
 * dtype's codes widen to their unscaled values (the engine applies the
 * row's scale). */
typedef void mk_widen_fn(const void *x, int64_t n, float *y);
/* Narrows n floats times scale (the product rounded to fp32 first, as
 * normalize's: scale 1 narrows x itself) to the codes of a half dtype
 * (binary16 or bfloat16), rounded to nearest even, bit for bit
 * engine/dtype.c's conversion: overflow to infinity, binary16 subnormals
 * kept, NaN a quiet NaN with its sign and top payload bits. Reads
 * x[0..n), writes y[0..n) only. */
typedef void mk_narrow_fn(const float *x, int64_t n, float scale,
                          uint16_t *y);
/* c = a w^T (+ bias): w packed by pack (n rows of depth k). */
typedef void mk_linear_fn(const float *a, ptrdiff_t lda, int64_t m,
                          const float *wp, int64_t n, int64_t k,
                          const float *bias, float *c, ptrdiff_t ldc);

/* Half compute (docs/design.md, "Compute dtype"): optional slots per half
 * dtype h (bf16, f16), all NULL in a table without a dot product of that
 * dtype (the engine then widens to fp32). Operands are codes of h; d is
 * even and row strides count elements. The packed layouts belong to the
 * table: only its own slots read them.
 * pack: n key rows of depth d (ldx even) into the panels qk reads,
 * packed_floats(n, d / 2) floats (block offsets as for the fp32 pack, at
 * depth d / 2).
 * qk: s[i][j] = sum_p q[i][p] * K[j][p], unscaled, ldq even and q 4-byte
 * aligned; products exact (both halves' products fit fp32's mantissa),
 * sums in fp32 in an order of the table's (not qk's); bf16 inputs and
 * results below FLT_MIN may flush to zero.
 * pack_v: n value rows of width dv by pairs of keys into column blocks:
 * block b at packed + b * cb_stride holds ceil(n / 2) pair rows, zeros
 * past dv and for the missing key of an odd n. cb_stride >=
 * packed_v_floats(n, 1); the whole pack is packed_v_floats(n, dv) floats
 * when cb_stride is that minimum, and packed_v_floats(k, 1) for an even k
 * is where key k's pair row starts in a block.
 * pv: o[i][c] = alpha[i] * o[i][c] + sum_j h(p[i][j]) * V[j][c], c < dv,
 * over keys j < n of a pack (vp, cb_stride; vp may start at an even key
 * of a larger pack, whose keys past n it never multiplies). p rounded to
 * h to nearest even: the rounding the hardware multiplies in. p (ldp >= n
 * when m > 1) is scratch: its rows are overwritten with the codes. Sums
 * in key order, two keys at a time.
 * softmax_update: softmax_update for a P that pv rounds to h next: its
 * exp may be as coarse as a few 1e-6 relative.
 * softmax_update_codes and pv_codes (optional, a pair, both or neither):
 * the same two steps with P handed over as codes. softmax_update_codes
 * writes what softmax_update writes, each row's P rounded to h in place:
 * codes j < n in the row's first 2n bytes, a zero code after an odd n
 * (the row's row_max, row_sum and alpha bit for bit softmax_update's);
 * pv_codes is pv on rows already so. The engine takes the pair when
 * nothing else reads P (no weights output): it saves pv's pass over P. */
typedef enum mk_half {
    MK_HALF_BF16 = 0,
    MK_HALF_F16 = 1,
    MK_HALF_COUNT
} mk_half;
typedef void mk_pack_half_fn(const uint16_t *x, ptrdiff_t ldx, int64_t n,
                             int64_t d, float *packed);
typedef void mk_qk_half_fn(const uint16_t *q, ptrdiff_t ldq, int64_t m,
                           const float *kp, int64_t n, int64_t d, float *s,
                           ptrdiff_t lds);
typedef void mk_pack_v_half_fn(const uint16_t *v, ptrdiff_t ldv, int64_t n,
                               int64_t dv, float *packed,
                               ptrdiff_t cb_stride);
typedef void mk_pv_half_fn(float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                           const float *vp, ptrdiff_t cb_stride, int64_t dv,
                           const float *alpha, float *o, ptrdiff_t ldo);
/* One half dtype's slots: all six, or none (NULL); the codes pair
 * optional on top. */
typedef struct mk_half_slots {
    mk_pack_half_fn *pack;
    mk_qk_half_fn *qk;
    mk_packed_floats_fn *packed_v_floats;
    mk_pack_v_half_fn *pack_v;
    mk_pv_half_fn *pv;
    mk_softmax_update_fn *softmax_update;
    mk_softmax_update_fn *softmax_update_codes; /* optional pair */
    mk_pv_half_fn *pv_codes;
} mk_half_slots;

/* The benchmark's FMA peak: independent multiply-add chains in this ISA's
 * widest registers, `iterations` steps of every chain; the result depends
 * on every chain so no compiler drops them. */
typedef float mk_fma_chains_fn(int64_t iterations);

/* ---- The table ---------------------------------------------------------- */

typedef struct mk_table {
    const char *name; /* the ISA's name, as mha_isa_name gives it */

    /* Attention tile: query rows per block and keys per block. block_k is
     * a multiple of the packing panel. */
    int64_t block_q;
    int64_t block_k;
    /* Rows of the qk and linear tiles' strip (generic 4, avx2 6, neon 8,
     * avx512 12), each read at every step of the depth: the engine copies
     * strided rows together when that many of them would crowd one L1 set
     * (mha_rows_crowd: q rows in engine/attention.c's stage_rows, a
     * projection's input rows in engine/layer.c's project). */
    int64_t strip_rows;
    /* The most input rows the engine gives one linear call (a projection's
     * work item; fewer where that balances the threads). Every call
     * streams the whole weight matrix once, so a table whose linear keeps
     * a row block against each weight panel sets its row block here
     * (docs/design.md, "Kernel contract"). */
    int64_t linear_rows;
    /* 1: the decode kernels read across kv heads key by key (mk_heads),
     * and the engine spans decode blocks across kv heads where the layout
     * allows; 0: they take mk_heads as calls per head (correct, measured
     * slower for the engine to use: docs/design.md). */
    int decode_heads;
    /* From this many rows of one kv head on (0: never), decode blocks over
     * an fp32 cache keep one kv head each where a [B, L, H, D] layout
     * would let them span kv heads: the table's decode_pv keeps such
     * rows' outputs in registers over many keys, where the loops across
     * kv heads load and store them every MK_PV_BLOCK keys (avx512: 6,
     * the rows its wide P.V takes; docs/design.md, "Decode across
     * heads"). */
    int64_t head_rows_f32;
    /* The most query rows of one kv head decode_qk and decode_pv take
     * (heads NULL): MK_DECODE_ROWS, or up to MK_DECODE_WIDE_ROWS for a
     * table with wide kernels. The engine sends blocks of more rows a kv
     * head to the prefill stream. */
    int64_t decode_rows;

    mk_packed_floats_fn *packed_floats;
    mk_pack_fn *pack;
    mk_qk_fn *qk;
    mk_softmax_update_fn *softmax_update;
    mk_pv_fn *pv;
    mk_normalize_fn *normalize;
    mk_pv_finish_fn *pv_finish; /* set with pv and normalize */
    mk_decode_qk_fn *decode_qk;
    mk_decode_pv_fn *decode_pv;
    mk_widen_fn *widen[MK_DTYPE_COUNT]; /* widen[MK_F32] copies */
    /* A half compute call's output rows (MK_F16, MK_BF16; optional: NULL,
     * the engine's own scalar loop). */
    mk_narrow_fn *narrow[MK_DTYPE_COUNT];
    mk_linear_fn *linear;
    /* Half compute, indexed by mk_half. */
    mk_half_slots half[MK_HALF_COUNT];

    /* For the benchmark only: the FMA peak loop and the floating-point
     * operations one iteration of it performs. */
    mk_fma_chains_fn *fma_chains;
    double fma_chains_flops;
} mk_table;

/* Table initialisers (BLIS's cntx_init): each first calls its base's, then
 * overrides the slots it speeds up, so every slot is set and a new ISA
 * inherits the nearest table's kernels. mk_init_generic sets every slot.
 * mk_init_avx2 exists only when the build defines MHA_HAVE_AVX2 (base:
 * generic), mk_init_avx512 only with MHA_HAVE_AVX512 (base: avx2),
 * mk_init_avx512bf16 only with MHA_HAVE_AVX512BF16 (base: avx512),
 * mk_init_amxbf16 only with MHA_HAVE_AMXBF16 (base: avx512bf16),
 * mk_init_neon only with MHA_HAVE_NEON (base: generic), mk_init_neonfhm
 * only with MHA_HAVE_NEONFHM (base: neon), mk_init_neonbf16 only with
 * MHA_HAVE_NEONBF16 (base: neonfhm). Whether the CPU can
 * run a table is the engine's question (engine/isa.c). */
void mk_init_generic(mk_table *t);
void mk_init_avx2(mk_table *t);
void mk_init_avx512(mk_table *t);
void mk_init_avx512bf16(mk_table *t);
void mk_init_amxbf16(mk_table *t);
void mk_init_neon(mk_table *t);
void mk_init_neonfhm(mk_table *t);
void mk_init_neonbf16(mk_table *t);

#ifdef __cplusplus
}
#endif

#endif /* MHA_KERNELS_H */
