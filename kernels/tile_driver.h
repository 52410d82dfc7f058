/*
 * The matmul drivers (Q·Kᵀ, P·V, the layer's linear) written once over an
 * ISA's register tile, as softmax_driver.h writes the softmax step once
 * over vector primitives: what stays per ISA is the tile (its intrinsics),
 * its size and how its strip heights are compiled, not the loops around it
 * (docs/design.md, "The house").
 *
 * An ISA's tile header defines, before a file includes this one:
 *   MK_TILE(mr, flags, k, a, lda, b, ldb, c_scale, bias, c, ldc, nr, fin)
 *                 the always_inline tile (flags of tile_flags.h):
 *                 c[r][j] = init + sum_{p<k} a[r*lda + p] * b[p*ldb + j],
 *                 or with MK_TILE_FINISH that sum normalised into fin's
 *                 rows (c then only read)
 *   MK_TILE_MR    rows of a full strip
 *   MK_TILE_NR    columns of a tile, and of a packed panel
 *   MK_TILE_REST  the strip heights of a remainder: MK_TD_REST_EACH or
 *                 MK_TD_REST_HALVING (below)
 *   MK_TILE_STREAM_FENCE()  orders a MK_TILE_FINISH tile's streamed stores
 *                 before what follows
 *
 * Every tile call passes mr and flags as constants (the drivers are
 * always_inline down to the tile and each strip height is its own
 * expansion), so every combination compiles to a straight-line tile.
 * Edges change only which lanes a tile loads and stores, and a strip's
 * height never changes an element's sum, so the drivers keep the
 * determinism contract of kernels.h whatever m, n and the strip split.
 */
#ifndef MK_TILE
#error "include the ISA's tile header (it defines MK_TILE) before tile_driver.h"
#endif

#ifndef MK_TILE_DRIVER_H
#define MK_TILE_DRIVER_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "tile_flags.h"

#define MK_TD_INLINE static inline __attribute__((always_inline))

/* ---- Strips ------------------------------------------------------------ */

/* Runs STRIP(rows, i0) over rows [0, m): full strips of MK_TILE_MR rows,
 * then the remainder through MK_TILE_REST. rows is a constant at every
 * expansion, so each strip height gets a tile compiled for it. */
#define MK_TD_STRIPS(m, STRIP)                                        \
    do {                                                              \
        const int64_t m_ = (m);                                       \
        int64_t i0_ = 0;                                              \
        for (; i0_ + MK_TILE_MR <= m_; i0_ += MK_TILE_MR)             \
            STRIP(MK_TILE_MR, i0_);                                   \
        if (i0_ < m_)                                                 \
            MK_TILE_REST(m_ - i0_, i0_, STRIP);                       \
    } while (0)

/* A remainder of 1..5 rows as one strip of its own height: six heights
 * compiled, one tile call per remainder (for a strip of at most 6 rows). */
#define MK_TD_REST_EACH(rest, i0, STRIP)                              \
    switch (rest) {                                                   \
    case 5: STRIP(5, i0); break;                                      \
    case 4: STRIP(4, i0); break;                                      \
    case 3: STRIP(3, i0); break;                                      \
    case 2: STRIP(2, i0); break;                                      \
    default: STRIP(1, i0); break;                                     \
    }

/* A remainder of 1..15 rows as strips of 8, 4, 2 and 1 rows: only five
 * heights compiled, however tall the full strip. */
#define MK_TD_REST_HALVING(rest, i0, STRIP)                           \
    do {                                                              \
        int64_t r_ = (rest), h0_ = (i0);                              \
        if (r_ >= 8) { STRIP(8, h0_); h0_ += 8; r_ -= 8; }            \
        if (r_ >= 4) { STRIP(4, h0_); h0_ += 4; r_ -= 4; }            \
        if (r_ >= 2) { STRIP(2, h0_); h0_ += 2; r_ -= 2; }            \
        if (r_ >= 1) STRIP(1, h0_);                                   \
    } while (0)

/* ---- S = Q Kᵀ ------------------------------------------------------- */

/* One strip of mr query rows against every packed key panel. */
MK_TD_INLINE void mk_td_qk_strip(const int mr, const float *q, ptrdiff_t ldq,
                                 const float *kp, int64_t n, int64_t d,
                                 float *s, ptrdiff_t lds)
{
    int64_t j0 = 0;
    for (; j0 + MK_TILE_NR <= n; j0 += MK_TILE_NR)
        MK_TILE(mr, 0, d, q, ldq, kp + j0 * d, MK_TILE_NR, NULL, NULL,
                s + j0, lds, MK_TILE_NR, MK_TILE_NO_FINISH);
    if (j0 < n) /* the panel is zero-padded: only the store narrows */
        MK_TILE(mr, MK_TILE_C_NARROW, d, q, ldq, kp + j0 * d, MK_TILE_NR,
                NULL, NULL, s + j0, lds, n - j0, MK_TILE_NO_FINISH);
}

/* The qk slot (kernels.h): strips of query rows, read in place, sweep the
 * key panels; the last panel may be partly padding. kp is packed by the
 * ISA's pack for n keys of depth d. */
static inline void mk_td_qk(const float *q, ptrdiff_t ldq, int64_t m,
                            const float *kp, int64_t n, int64_t d, float *s,
                            ptrdiff_t lds)
{
    assert(m >= 0 && n >= 0 && d >= 0 && ldq >= 0);
    assert((m == 0 || n == 0) || (q && kp && s));
    assert(m <= 1 || lds >= n);
#define MK_TD_QK_STRIP(mr, i0) \
    mk_td_qk_strip(mr, q + (i0) * ldq, ldq, kp, n, d, s + (i0) * lds, lds)
    MK_TD_STRIPS(m, MK_TD_QK_STRIP);
#undef MK_TD_QK_STRIP
}

/* Defines mk_<isa>_qk_<tile> (the naming rule of table_init.h) as
 * mk_td_qk over this tile. */
#define MK_TD_DEFINE_QK(isa, tile)                                        \
    void mk_##isa##_qk_##tile(const float *q, ptrdiff_t ldq, int64_t m,    \
                              const float *kp, int64_t n, int64_t d,       \
                              float *s, ptrdiff_t lds)                     \
    {                                                                      \
        mk_td_qk(q, ldq, m, kp, n, d, s, lds);                             \
    }

/* ---- O = alpha O + P V ---------------------------------------------- */

/* The two orders a P·V sweep can take. By rows: each strip of P goes
 * through every column block of V, prefetching the o rows of the next
 * block. By columns: each column block of V is gone through by every strip
 * of P, so the block's V columns stay in L1 across the strips. The sums
 * are the same in either order (one chain per element, in key order). */
enum { MK_TD_BY_ROWS = 0, MK_TD_BY_COLUMNS = 1 };

/* One strip of mr rows against every column block of v, keys 0..jn-1
 * (the by-rows order); fin: the strip's (with MK_TILE_FINISH in flags). */
MK_TD_INLINE void mk_td_pv_strip(const int mr, const unsigned flags,
                                 const unsigned narrow, const float *p,
                                 ptrdiff_t ldp, int64_t jn, const float *v,
                                 ptrdiff_t ldv, int64_t dv,
                                 const float *alpha, float *o, ptrdiff_t ldo,
                                 mk_tile_finish fin)
{
    int64_t c0 = 0;
    for (; c0 + MK_TILE_NR <= dv; c0 += MK_TILE_NR)
        MK_TILE(mr, flags | MK_TILE_PREFETCH_C_NEXT, jn, p, ldp, v + c0, ldv,
                alpha, NULL, o + c0, ldo, MK_TILE_NR,
                mk_tile_finish_at(fin, 0, c0));
    if (c0 < dv)
        MK_TILE(mr, flags | narrow, jn, p, ldp, v + c0, ldv, alpha, NULL,
                o + c0, ldo, dv - c0, mk_tile_finish_at(fin, 0, c0));
}

/*
 * o[i][c] (+)= sum_{j<jn} p[i][j] * v[j][c] for i < m, c < dv, in the
 * given order. flags (constant): MK_TILE_INIT_SCALED (start from
 * alpha * o) or MK_TILE_INIT_LOAD (continue the sums in o), plus
 * MK_TILE_PREFETCH_B when v is read in place, plus MK_TILE_FINISH to
 * write the normalised sums to fin's rows instead (the block's). narrow
 * (constant): the flags of a last column block narrower than MK_TILE_NR:
 * C_NARROW, plus B_NARROW when v's rows end there too (not when v is a
 * zero-padded panel).
 */
MK_TD_INLINE void mk_td_pv_sweep(const int order, const unsigned flags,
                                 const unsigned narrow, const float *p,
                                 ptrdiff_t ldp, int64_t m, int64_t jn,
                                 const float *v, ptrdiff_t ldv, int64_t dv,
                                 const float *alpha, float *o, ptrdiff_t ldo,
                                 mk_tile_finish fin)
{
    if (order == MK_TD_BY_ROWS) {
#define MK_TD_PV_STRIP(mr, i0)                                            \
    mk_td_pv_strip(mr, flags, narrow, p + (i0) * ldp, ldp, jn, v, ldv, dv, \
                   alpha + (i0), o + (i0) * ldo, ldo,                     \
                   mk_tile_finish_at(fin, i0, 0))
        MK_TD_STRIPS(m, MK_TD_PV_STRIP);
#undef MK_TD_PV_STRIP
        return;
    }
    for (int64_t c0 = 0; c0 < dv; c0 += MK_TILE_NR) {
        const int64_t nr = dv - c0;
#define MK_TD_PV_BLOCK(mr, i0, FLAGS, NR)                                 \
    MK_TILE(mr, FLAGS, jn, p + (i0) * ldp, ldp, v + c0, ldv, alpha + (i0), \
            NULL, o + (i0) * ldo + c0, ldo, NR,                           \
            mk_tile_finish_at(fin, i0, c0))
#define MK_TD_PV_FULL(mr, i0) MK_TD_PV_BLOCK(mr, i0, flags, MK_TILE_NR)
#define MK_TD_PV_NARROW(mr, i0) MK_TD_PV_BLOCK(mr, i0, flags | narrow, nr)
        if (nr >= MK_TILE_NR)
            MK_TD_STRIPS(m, MK_TD_PV_FULL);
        else
            MK_TD_STRIPS(m, MK_TD_PV_NARROW);
#undef MK_TD_PV_NARROW
#undef MK_TD_PV_FULL
#undef MK_TD_PV_BLOCK
    }
}

/* The flag of a sweep that finishes the block (finish a constant). */
#define MK_TD_FINISH_FLAG(finish) ((finish) ? MK_TILE_FINISH : 0u)

/* V read in place: every element alpha * o, then one FMA per key; with
 * finish (a constant), normalised into fin's rows. */
MK_TD_INLINE void mk_td_pv_in_place(const int order, const int finish,
                                    const float *p, ptrdiff_t ldp, int64_t m,
                                    int64_t n, const float *v, ptrdiff_t ldv,
                                    int64_t dv, const float *alpha, float *o,
                                    ptrdiff_t ldo, mk_tile_finish fin)
{
    mk_td_pv_sweep(order,
                   MK_TILE_INIT_SCALED | MK_TILE_PREFETCH_B |
                       MK_TD_FINISH_FLAG(finish),
                   MK_TILE_B_NARROW | MK_TILE_C_NARROW, p, ldp, m, n, v, ldv,
                   dv, alpha, o, ldo, fin);
}

/* One chunk of keys copied to the stack (p already offset to its first
 * key): the first chunk starts from alpha * o, a later one continues the
 * sums carried in o, so each element still sums its keys in key order. */
MK_TD_INLINE void mk_td_pv_chunk(const int order, const unsigned narrow,
                                 int first, const float *p, ptrdiff_t ldp,
                                 int64_t m, int64_t jn, const float *v,
                                 ptrdiff_t ldv, int64_t dv,
                                 const float *alpha, float *o, ptrdiff_t ldo)
{
    if (first)
        mk_td_pv_sweep(order, MK_TILE_INIT_SCALED, narrow, p, ldp, m, jn, v,
                       ldv, dv, alpha, o, ldo, MK_TILE_NO_FINISH);
    else
        mk_td_pv_sweep(order, MK_TILE_INIT_LOAD, narrow, p, ldp, m, jn, v,
                       ldv, dv, alpha, o, ldo, MK_TILE_NO_FINISH);
}

/* Defines mk_<isa>_pv_<tile> and mk_<isa>_pv_finish_<tile> (kernels.h)
 * in the given order: V read in place where in_place(m, n, ldv, dv) says
 * so, else through the ISA's strided(p, ldp, m, n, v, ldv, dv, alpha, o,
 * ldo) (rows copied in chunks, mk_td_pv_chunk). pv_finish's tiles of V
 * in place send their sums normalised to the output rows, streamed where
 * normalize would (stream set), then MK_TILE_STREAM_FENCE;
 * strided V is summed, then normalised (one more expansion of every tile
 * height for its last chunk took clang -O1 with ASan past 17 minutes on
 * the avx512 file). */
#define MK_TD_DEFINE_PV(isa, tile, order, in_place, strided)               \
    void mk_##isa##_pv_##tile(const float *p, ptrdiff_t ldp, int64_t m,     \
                              int64_t n, const float *v, ptrdiff_t ldv,     \
                              int64_t dv, const float *alpha, float *o,     \
                              ptrdiff_t ldo)                                \
    {                                                                       \
        mk_td_pv_check(p, ldp, m, n, v, ldv, dv, alpha, o, ldo);            \
        if (in_place(m, n, ldv, dv))                                        \
            mk_td_pv_in_place(order, 0, p, ldp, m, n, v, ldv, dv, alpha, o, \
                              ldo, MK_TILE_NO_FINISH);                      \
        else                                                                \
            strided(p, ldp, m, n, v, ldv, dv, alpha, o, ldo);               \
    }                                                                       \
    void mk_##isa##_pv_finish_##tile(                                       \
        const float *p, ptrdiff_t ldp, int64_t m, int64_t n,                \
        const float *v, ptrdiff_t ldv, int64_t dv, const float *alpha,      \
        float *o, ptrdiff_t ldo, const float *row_sum, float *out,          \
        ptrdiff_t ldout, int stream)                                        \
    {                                                                       \
        if (!in_place(m, n, ldv, dv)) {                                     \
            mk_##isa##_pv_##tile(p, ldp, m, n, v, ldv, dv, alpha, o, ldo);  \
            mk_##isa##_normalize(o, ldo, m, dv, row_sum, out, ldout,        \
                                 stream);                                   \
            return;                                                         \
        }                                                                   \
        mk_td_pv_check(p, ldp, m, n, v, ldv, dv, alpha, o, ldo);            \
        const mk_tile_finish fin = {row_sum, out, ldout, stream != 0};      \
        mk_td_pv_in_place(order, 1, p, ldp, m, n, v, ldv, dv, alpha, o,     \
                          ldo, fin);                                        \
        if (fin.stream)                                                     \
            MK_TILE_STREAM_FENCE();                                         \
    }

/* The preconditions of the pv slot (kernels.h). */
static inline void mk_td_pv_check(const float *p, ptrdiff_t ldp, int64_t m,
                                  int64_t n, const float *v, ptrdiff_t ldv,
                                  int64_t dv, const float *alpha,
                                  const float *o, ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0 && ldp >= 0 && ldv >= 0);
    assert((m == 0 || dv == 0) || (alpha && o && (n == 0 || (p && v))));
    assert(m <= 1 || ldo >= dv);
    (void)p, (void)ldp, (void)m, (void)n, (void)v, (void)ldv, (void)dv;
    (void)alpha, (void)o, (void)ldo;
}

/* ---- The layer's linear ------------------------------------------------- */

/* Output columns per block: the block's panels (NC x k floats) stay in L2
 * while every strip of a sweeps them. */
#ifndef MK_TD_LINEAR_NC
#define MK_TD_LINEAR_NC 256
#endif

/* Runs CALL(flags) with the linear's tile flags (constants) for a panel
 * of nr columns, with or without a bias. */
#define MK_TD_LINEAR_FLAGS(bias, nr, CALL)                                \
    do {                                                                  \
        if ((bias) && (nr) < MK_TILE_NR)                                  \
            CALL(MK_TILE_ADD_BIAS | MK_TILE_C_NARROW);                    \
        else if (bias)                                                    \
            CALL(MK_TILE_ADD_BIAS);                                       \
        else if ((nr) < MK_TILE_NR)                                       \
            CALL(MK_TILE_C_NARROW);                                       \
        else                                                              \
            CALL(0);                                                      \
    } while (0)

/* One strip of mr rows of a against the panels of columns j0..j1-1, the
 * bias added once after the sum, the last panel narrowed. */
MK_TD_INLINE void mk_td_linear_strip(const int mr, const float *a,
                                     ptrdiff_t lda, const float *wp,
                                     int64_t j0, int64_t j1, int64_t k,
                                     const float *bias, float *c,
                                     ptrdiff_t ldc)
{
    for (int64_t j = j0; j < j1; j += MK_TILE_NR) {
        const float *panel = wp + j * k;
        const float *bj = bias ? bias + j : NULL;
        const int64_t nr = j1 - j < MK_TILE_NR ? j1 - j : MK_TILE_NR;
#define MK_TD_LINEAR_TILE(FLAGS)                                          \
    MK_TILE(mr, FLAGS, k, a, lda, panel, MK_TILE_NR, NULL, bj, c + j, ldc, \
            nr, MK_TILE_NO_FINISH)
        MK_TD_LINEAR_FLAGS(bj, nr, MK_TD_LINEAR_TILE);
#undef MK_TD_LINEAR_TILE
    }
}

/* Share s (of share bytes) of the bytes at next, fetched into L2. */
MK_TD_INLINE void mk_td_fetch_share(const char *next, int64_t bytes,
                                    int64_t share, int64_t s)
{
    const int64_t end = (s + 1) * share < bytes ? (s + 1) * share : bytes;
    for (int64_t off = s * share; off < end; off += 64)
        __builtin_prefetch(next + off, 0, 2); /* prefetcht1: into L2 */
}

/* Every strip of rows [0, m) of a against one panel of nr columns. The
 * panel after it (next, NULL for none) comes into L2 meanwhile in equal
 * shares, one before each strip, so the first strip to read it finds it
 * there, not in L3 or memory, where the hardware prefetchers follow it
 * only page by page. */
MK_TD_INLINE void mk_td_linear_panel(const unsigned flags, const float *a,
                                     ptrdiff_t lda, int64_t m,
                                     const float *panel, int64_t k,
                                     const float *bias, float *c,
                                     ptrdiff_t ldc, int64_t nr,
                                     const float *next)
{
    const int64_t bytes = MK_TILE_NR * k * (int64_t)sizeof(float);
    const int64_t strips = (m + MK_TILE_MR - 1) / MK_TILE_MR;
    const int64_t share = (bytes / (strips > 0 ? strips : 1) + 63) / 64 * 64;
#define MK_TD_LINEAR_PANEL_STRIP(mr, i0)                                  \
    do {                                                                  \
        if (next)                                                         \
            mk_td_fetch_share((const char *)next, bytes, share,          \
                              (i0) / MK_TILE_MR);                         \
        MK_TILE(mr, flags, k, a + (i0) * lda, lda, panel, MK_TILE_NR,     \
                NULL, bias, c + (i0) * ldc, ldc, nr, MK_TILE_NO_FINISH);  \
    } while (0)
    MK_TD_STRIPS(m, MK_TD_LINEAR_PANEL_STRIP);
#undef MK_TD_LINEAR_PANEL_STRIP
}

/* The order of the linear's tiles, set by the ISA before including this
 * header. 0: columns in blocks of MK_TD_LINEAR_NC, each block swept by
 * every strip of a, so a strip reads every panel of the block. 1 (panel
 * by panel): rows in blocks of MK_TD_LINEAR_MC, each panel read by every
 * strip of the row block before the next, so one panel (MK_TILE_NR x k
 * floats) stays in L2 while the next is fetched and the weights stream
 * from L3 or memory once a row block, where order 0 streams the whole
 * column block once a strip, from L3 once the block passes L2 (256
 * columns x k = 512 are 512 KiB, Zen 3's whole L2; docs/benchmarks.md).
 * Either order sums every element as one in-order chain over k, the bias
 * added after it. In order 1 the flags are chosen once a panel, outside
 * its strips: chosen per tile inside them, the same tiles ran 0.88-0.97x
 * (gcc 12). */
#ifndef MK_TD_LINEAR_PANEL_MAJOR
#define MK_TD_LINEAR_PANEL_MAJOR 0
#endif
#ifndef MK_TD_LINEAR_MC
#define MK_TD_LINEAR_MC 96
#endif

/* The linear slot (kernels.h), in the order above. wp is packed by the
 * ISA's pack (ldx = k) for n x k. */
static inline void mk_td_linear(const float *a, ptrdiff_t lda, int64_t m,
                                const float *wp, int64_t n, int64_t k,
                                const float *bias, float *c, ptrdiff_t ldc)
{
    assert(m >= 0 && n >= 0 && k >= 0 && lda >= 0);
    assert((m == 0 || n == 0) || (a && wp && c));
    assert(m <= 1 || ldc >= n);
    if (MK_TD_LINEAR_PANEL_MAJOR) {
        for (int64_t i0 = 0; i0 < m; i0 += MK_TD_LINEAR_MC) {
            const int64_t mb = m - i0 < MK_TD_LINEAR_MC ? m - i0
                                                        : MK_TD_LINEAR_MC;
            for (int64_t j = 0; j < n; j += MK_TILE_NR) {
                const float *bj = bias ? bias + j : NULL;
                const int64_t nr = n - j < MK_TILE_NR ? n - j : MK_TILE_NR;
                /* The panel read next: the next one, or the first again
                 * for the next row block. A block of one strip reads each
                 * panel once, in order, which the prefetchers follow. */
                const float *next = mb <= MK_TILE_MR ? NULL
                                    : j + MK_TILE_NR < n
                                        ? wp + (j + MK_TILE_NR) * k
                                    : i0 + mb < m ? wp
                                                  : NULL;
#define MK_TD_LINEAR_PANEL(FLAGS)                                         \
    mk_td_linear_panel(FLAGS, a + i0 * lda, lda, mb, wp + j * k, k, bj,   \
                       c + i0 * ldc + j, ldc, nr, next)
                MK_TD_LINEAR_FLAGS(bj, nr, MK_TD_LINEAR_PANEL);
#undef MK_TD_LINEAR_PANEL
            }
        }
        return;
    }
    for (int64_t j0 = 0; j0 < n; j0 += MK_TD_LINEAR_NC) {
        const int64_t j1 = n - j0 < MK_TD_LINEAR_NC ? n : j0 + MK_TD_LINEAR_NC;
#define MK_TD_LINEAR_STRIP(mr, i0)                                        \
    mk_td_linear_strip(mr, a + (i0) * lda, lda, wp, j0, j1, k, bias,      \
                       c + (i0) * ldc, ldc)
        MK_TD_STRIPS(m, MK_TD_LINEAR_STRIP);
#undef MK_TD_LINEAR_STRIP
    }
}

/* Defines mk_<isa>_linear_<tile> as mk_td_linear over this tile. */
#define MK_TD_DEFINE_LINEAR(isa, tile)                                    \
    void mk_##isa##_linear_##tile(const float *a, ptrdiff_t lda,          \
                                  int64_t m, const float *wp, int64_t n,  \
                                  int64_t k, const float *bias, float *c, \
                                  ptrdiff_t ldc)                          \
    {                                                                     \
        mk_td_linear(a, lda, m, wp, n, k, bias, c, ldc);                  \
    }

#endif
