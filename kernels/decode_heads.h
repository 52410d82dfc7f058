/*
 * The decode loops across kv heads (docs/design.md, "Decode across
 * heads"), written once over a decode file's primitives: key by key, each
 * key's run of kv heads in address order (one contiguous run of a [B, L,
 * H, D] position), G = h->group when G > 0 (a constant, so a head's rows
 * unroll; the block's rows are then whole heads: MK_HEADS_GROUP_SWITCH),
 * any group and a short last head when G = 0; or, one query row per kv
 * head that a pass cannot hold whole, head by head over blocks of
 * MK_BY_HEAD keys (qk_by_head, where the file has the primitives). Per
 * score and per output element the arithmetic is that of a call per kv
 * head, bit for bit (the kernel contract in kernels.h).
 *
 * The including file defines, as static always-inline functions:
 *   rows_dot(q, ldq, m, row, t, sc, d, s, lds)
 *       s[i * lds] = q row i . key row (times sc when t is scaled), i < m
 *   keys_dot(R, q, ldq, k, kstep, t, sc, sc_step, d, s, lds, pf, pf_step)
 *       s[i * lds] = q row i . its own key row k + i * kstep (one query
 *       row per kv head; times sc[i * sc_step] when t is scaled), i < R
 *       (a constant, at most MK_KEYS_DOT), fetching the runs
 *       pf + i * pf_step as it goes
 *   pv_keys(K, R, pk, rows, t, dv, o, ldo, pf)
 *       o rows i < R += pk[k][i] times value row rows[k] for the K (1 or
 *       2, a constant) keys k in key order, one FMA per key and element,
 *       fetching the runs pf[k] (unless pf is NULL) as it goes
 *   dot_rows_keys(G, K, q, ldq, rows, t, sc, d, s, lds)   (optional:
 *       MK_QK_BLOCK) s[i * lds + k] = q row i . key row rows[k] (times
 *       sc[k] when t is scaled), i < G, k < K = MK_QK_BLOCK / G, G > 1
 *   pv_block(K, G, pk, rows, t, dv, o, ldo, pf)   (optional: MK_PV_BLOCK)
 *       pv_keys's sum for whole kv heads of G > 1 rows and K keys, K a
 *       constant up to MK_PV_BLOCK, fetching the runs pf[k] (as
 *       prefetch_run) among the keys' work
 *   prefetch_run(run, bytes, l1)
 *       fetch a run of bytes ahead (grouped rows); l1 is mk_heads.into_l1
 *   prefetch_run_near(run, bytes, l1)
 *       the same for one query row per kv head without the spread fetch,
 *       into L1 when l1 allows, else into L2
 *   keys_dot_head(q, rows, pf, t, sc, d, s)   (optional: MK_BY_HEAD)
 *       s[x] = q . key row rows[x] (times sc[x] when t is scaled), x <
 *       MK_BY_HEAD, the chains and sums of rows_dot, fetching the runs
 *       pf[x] (d elements each) into L2 as it goes
 *   pv_keys_head(pk, rows, pf, t, dv, o)   (optional: MK_BY_HEAD)
 *       o += pk[x] times value row rows[x] for the MK_BY_HEAD keys x in
 *       key order, one FMA per key and element, fetching pf[x] into L2
 *   code_factor(t)
 *       what its loads leave to undo per row (E4M3's 2^-8, or 1)
 *   spread_fetch(t, l1)
 *       whether one query row per kv head takes keys_dot_n and the fetch
 *       spread over pv_keys's chunks (else rows_dot per head and the run
 *       fetched before each head's work, by prefetch_run_near; grouped
 *       rows always so, by prefetch_run)
 * and INLINE and MK_KEYS_DOT (the rows keys_dot takes at once). A kernel with nothing to fetch is given the row in use as
 * its run (its lines are in flight already), so the fetch has no test.
 */
#ifndef MK_DECODE_HEADS_H
#define MK_DECODE_HEADS_H

/* (row, key) scores per dot_rows_keys call (0: the file has none;
 * grouped rows then go key by key through rows_dot). */
#ifndef MK_QK_BLOCK
#define MK_QK_BLOCK 0
#endif

/* Keys per pv_block call (0: the file has none; grouped rows then go by
 * pairs of keys). */
#ifndef MK_PV_BLOCK
#define MK_PV_BLOCK 0
#endif

/* mk_decode_row for the blocked loops below, which take several keys'
 * rows at once: the empty asm keeps gcc from vectorising their loops over
 * the keys into masked loads through the row table, which it then issues
 * through a NULL table too, and Zen 4 runs a masked load whose masked
 * lanes would fault through a microcode assist (grouped-query decode from
 * a [B, H, L, D] cache read 0.6x; docs/benchmarks.md). The one-key loops
 * keep mk_decode_row: the barrier there only moved their code, for
 * +8% fp32 and -4% int8 (avx2) [B, L, H, D] decode, alignment effects. */
INLINE const char *row_at(const void *base, ptrdiff_t ld,
                          const void *const *rows, size_t es, int64_t j)
{
    const char *r = mk_decode_row(base, ld, rows, es, j);
    __asm__("" : "+r"(r));
    return r;
}

/* Rows j .. j + K - 1 of a blocked loop (rows[x], off bytes into the
 * position) and the runs dist positions on from them (ahead[x]; NULL at
 * or past reach, as fetch_ahead), through row_at. */
INLINE void block_rows(const int K, const void *base, ptrdiff_t ld,
                       const void *const *tab, size_t es, int64_t j,
                       int64_t reach, int64_t dist, size_t off,
                       const char **rows, const char **ahead)
{
    for (int x = 0; x < K; x++) {
        rows[x] = row_at(base, ld, tab, es, j + x) + off;
        ahead[x] = j + x + dist < reach
                       ? row_at(base, ld, tab, es, j + x + dist) + off
                       : NULL;
    }
}

/* The fetch ahead, heads_ahead positions on, spread: each kv head's
 * row of the position ahead is fetched with the head's own work on the
 * current position (a line per chunk of it, in keys_dot_n and pv_keys;
 * before it in the grouped rows_dot loop), not the position's whole run
 * at once. A burst of
 * one prefetch per line of the run (64 for 4 KiB of fp32 heads) stalls on
 * the core's outstanding misses with no work to overlap (perf put 25-40%
 * of the decode kernels' samples on the burst through a paged cache's row
 * table); spread among the FMAs it hides, in a paged cache (the runs jump
 * between cache blocks) and in a dense one alike, where it now beats the
 * hardware prefetchers alone for every dtype (1T, Zen 5: paged fp32
 * 1.45x, dense fp16 [B, L, H, D] 1.23-1.29x; docs/benchmarks.md). Returns
 * the run `ahead` positions on from j, from off bytes into the position
 * (a pass's first kv head: pass_at), or NULL past what the call may read
 * (reach = n + more). Past n a pass fetches its own heads of the keys the
 * caller reads next; run on into the next pass's first positions instead,
 * it read no faster (docs/benchmarks.md). */
INLINE const char *fetch_ahead(const void *base, ptrdiff_t ld,
                               const void *const *rows, size_t es, int64_t j,
                               int64_t reach, int64_t ahead, size_t off)
{
    if (j + ahead >= reach)
        return NULL;
    return mk_decode_row(base, ld, rows, es, j + ahead) + off;
}

/* How many positions ahead a block of m rows fetches: h->ahead_bytes
 * (MK_HEADS_AHEAD_BYTES when 0) of its runs of kv heads (hb bytes apart),
 * at least 1 and at most MK_HEADS_AHEAD (what the engine lets a call
 * reach). 8 positions of 8 kv heads of fp32 (or 32 heads of 8-bit codes)
 * are 32 KiB; 8 positions of 32 fp32 heads were 128 KiB, and fetched that
 * far ahead [B, L, H, D] fp32 read 0.92x, 16-bit 0.97x (1T, Zen 5,
 * docs/benchmarks.md). */
INLINE int64_t heads_ahead(int64_t m, int64_t group, size_t hb,
                           const mk_heads *h)
{
    const int64_t run = (m + group - 1) / group * (int64_t)hb;
    const int64_t bytes =
        h->ahead_bytes > 0 ? h->ahead_bytes : MK_HEADS_AHEAD_BYTES;
    const int64_t a = run > 0 ? bytes / run : MK_HEADS_AHEAD;
    return a < 1 ? 1 : a > MK_HEADS_AHEAD ? MK_HEADS_AHEAD : a;
}

/* keys_dot for r <= MK_KEYS_DOT rows; with the common geometry (d = 64
 * or 128, the rows' queries, keys and fetched runs adjacent: a [B, L, H,
 * D] position) the strides constants too, so every row's address is one
 * base register and a displacement: the strides as values kept 3
 * pointers per row live and spilled them (avx512, 8 rows: 0.88x with the
 * cache in L3; avx2, 1 row: fp32 from DRAM 1.05x with them;
 * docs/benchmarks.md). A group short of MK_KEYS_DOT heads (32, 16 or 64
 * heads have none) goes row by row: the same bits, and a copy of the
 * loops for each short count would only slow the sanitizer and fuzzing
 * builds. */
INLINE void keys_dot_n(int64_t r, const float *q, ptrdiff_t ldq,
                       const char *k, ptrdiff_t kstep, mk_dtype t,
                       const float *sc, ptrdiff_t sc_step, int64_t d,
                       float *s, ptrdiff_t lds, const char *pf,
                       ptrdiff_t pf_step)
{
    const ptrdiff_t es = (ptrdiff_t)mk_dtype_size(t);
    if (MK_KEYS_DOT == 1 || r == MK_KEYS_DOT) {
        if (d == 128 && ldq == 128 && kstep == 128 * es && pf_step == kstep)
            keys_dot(MK_KEYS_DOT, q, 128, k, 128 * es, t, sc, sc_step, 128,
                     s, lds, pf, 128 * es);
        else if (d == 64 && ldq == 64 && kstep == 64 * es &&
                 pf_step == kstep)
            keys_dot(MK_KEYS_DOT, q, 64, k, 64 * es, t, sc, sc_step, 64, s,
                     lds, pf, 64 * es);
        else
            keys_dot(MK_KEYS_DOT, q, ldq, k, kstep, t, sc, sc_step, d, s,
                     lds, pf, pf_step);
    } else
        for (int64_t i = 0; i < r; i++)
            keys_dot(1, q + i * ldq, ldq, k + i * kstep, kstep, t,
                     sc ? sc + i * sc_step : NULL, sc_step, d, s + i * lds,
                     lds, pf + i * pf_step, pf_step);
}

#if MK_QK_BLOCK > 0
/* Whole kv heads of G > 1 rows (a constant), MK_QK_BLOCK / G keys at a
 * time through dot_rows_keys, each head's runs of the keys MK_QK_BLOCK / G
 * positions ahead fetched among its chunks; returns the keys done (a
 * multiple of MK_QK_BLOCK / G), the rest left to rows_dot. */
INLINE int64_t qk_block_keys(const int G, const float *q, ptrdiff_t ldq,
                             int64_t m, const void *k, mk_dtype t,
                             ptrdiff_t ldk, const void *const *k_rows,
                             const float *ks, ptrdiff_t ks_ld, int64_t n,
                             int64_t d, float *s, ptrdiff_t lds,
                             const mk_heads *h, size_t off, int64_t dist)
{
    const size_t es = mk_dtype_size(t);
    const size_t hb = (size_t)h->ld * es;
    const int QK_KEYS = MK_QK_BLOCK / G;
    int64_t j = 0;
    for (; j + QK_KEYS <= n; j += QK_KEYS) {
        const char *rows[MK_QK_BLOCK], *ahead[MK_QK_BLOCK];
        block_rows(QK_KEYS, k, ldk, k_rows, es, j, n + h->more, dist, off,
                   rows, ahead);
        for (int64_t g = 0, i = 0; i < m; g++, i += G) {
            const char *rg[MK_QK_BLOCK], *pf[MK_QK_BLOCK];
            float sc[MK_QK_BLOCK];
            for (int x = 0; x < QK_KEYS; x++) {
                rg[x] = rows[x] + g * hb;
                pf[x] = (ahead[x] ? ahead[x] : rows[x]) + g * hb;
                sc[x] = mk_dtype_scaled(t)
                            ? ks[(j + x) * ks_ld + g * h->scale_ld]
                            : 1.0f;
            }
            dot_rows_keys(G, QK_KEYS, q + i * ldq, ldq, rg, t, sc, d,
                          s + i * lds + j, lds, pf);
        }
    }
    return j;
}
#endif

#if MK_QK_BLOCK > 0 || MK_PV_BLOCK > 2
/* The blocked loops of grouped rows are compiled out of line, one copy per
 * dtype and group: inlined into the kernels' entry points beside every
 * other path, they slowed the one-row-per-kv-head loops of the same
 * function 3-4% (8-bit and fp16 [B, L, H, D] decode, 1T, Zen 4, measured
 * in one process against the previous build; docs/benchmarks.md). */
#define MK_BLOCKS_BY_GROUP(G, T, CALL)                                    \
    switch (G) {                                                          \
    case 2: return CALL(2, T);                                            \
    case 4: return CALL(4, T);                                            \
    case 8: return CALL(8, T);                                            \
    default: return 0;                                                    \
    }
/* return CALL(G, T) with G (2, 4 or 8) and the dtype t as constants T;
 * other groups return 0 (no keys done). */
#define MK_BLOCKS_RETURN(G, t, CALL)                                      \
    switch (t) {                                                          \
    case MK_F32: MK_BLOCKS_BY_GROUP(G, MK_F32, CALL)                      \
    case MK_F16: MK_BLOCKS_BY_GROUP(G, MK_F16, CALL)                      \
    case MK_BF16: MK_BLOCKS_BY_GROUP(G, MK_BF16, CALL)                    \
    case MK_I8: MK_BLOCKS_BY_GROUP(G, MK_I8, CALL)                        \
    case MK_FP8_E4M3: MK_BLOCKS_BY_GROUP(G, MK_FP8_E4M3, CALL)            \
    case MK_FP8_E5M2: MK_BLOCKS_BY_GROUP(G, MK_FP8_E5M2, CALL)            \
    case MK_DTYPE_COUNT: break;                                           \
    }                                                                     \
    return 0
#endif

#if MK_QK_BLOCK > 0
static __attribute__((noinline)) int64_t
qk_blocks(int G, const float *q, ptrdiff_t ldq, int64_t m, const void *k,
          mk_dtype t, ptrdiff_t ldk, const void *const *k_rows,
          const float *ks, ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
          ptrdiff_t lds, const mk_heads *h, size_t off, int64_t dist)
{
#define QK_BLOCKS(GG, T)                                                  \
    qk_block_keys(GG, q, ldq, m, k, T, ldk, k_rows, ks, ks_ld, n, d, s, lds, \
                  h, off, dist)
    MK_BLOCKS_RETURN(G, t, QK_BLOCKS);
#undef QK_BLOCKS
}
#endif

INLINE void decode_qk_heads(const int G, const float *q, ptrdiff_t ldq,
                            int64_t m, const void *k, mk_dtype t,
                            ptrdiff_t ldk, const void *const *k_rows,
                            const float *ks, ptrdiff_t ks_ld, int64_t n,
                            int64_t d, float *s, ptrdiff_t lds,
                            const mk_heads *h, size_t off)
{
    const size_t es = mk_dtype_size(t);
    const int64_t group = G > 0 ? G : h->group;
    const size_t hb = (size_t)h->ld * es;
    const int64_t dist = heads_ahead(m, group, hb, h);
    int64_t j = 0;
#if MK_QK_BLOCK > 0
    if (G > 1 && G <= MK_QK_BLOCK) /* out of line (MK_BLOCKS_RETURN) */
        j = qk_blocks(G, q, ldq, m, k, t, ldk, k_rows, ks, ks_ld, n, d, s,
                      lds, h, off, dist);
#endif
    for (; j < n; j++) {
        const char *row = mk_decode_row(k, ldk, k_rows, es, j) + off;
        const char *ahead =
            fetch_ahead(k, ldk, k_rows, es, j, n + h->more, dist, off);
        const float *sj = mk_dtype_scaled(t) ? ks + j * ks_ld : NULL;
        if (G == 1 && spread_fetch(t, h->into_l1)) { /* MK_KEYS_DOT heads */
            for (int64_t i = 0; i < m; i += MK_KEYS_DOT)
                keys_dot_n(m - i < MK_KEYS_DOT ? m - i : MK_KEYS_DOT,
                           q + i * ldq, ldq, row + i * hb, (ptrdiff_t)hb, t,
                           sj ? sj + i * h->scale_ld : NULL, h->scale_ld, d,
                           s + i * lds + j, lds,
                           (ahead ? ahead : row) + i * hb, (ptrdiff_t)hb);
            continue;
        }
        for (int64_t g = 0, i = 0; i < m; g++, i += group) {
            if (ahead && G == 1)
                prefetch_run_near(ahead + g * hb, (size_t)d * es,
                                  h->into_l1);
            else if (ahead)
                prefetch_run(ahead + g * hb, (size_t)d * es, h->into_l1);
            if (G > 0) /* whole kv heads (MK_HEADS_GROUP_SWITCH) */
                rows_dot(q + i * ldq, ldq, G, row + g * hb, t,
                         sj ? sj[g * h->scale_ld] : 1.0f, d,
                         s + i * lds + j, lds);
            else
                rows_dot(q + i * ldq, ldq, m - i < group ? m - i : group,
                         row + g * hb, t, sj ? sj[g * h->scale_ld] : 1.0f, d,
                         s + i * lds + j, lds);
        }
    }
}

/* Keys j .. j + K - 1 (K = 1 or 2) of every head into the caller's
 * accumulator: per head, pv_keys takes the K keys' value rows at once, so
 * the head's output chunk is loaded and stored once for them, and its
 * elements still take one FMA per key in key order. */
INLINE void pv_heads_keys(const int K, const int G, const float *p,
                          ptrdiff_t ldp, int64_t m, int64_t n, int64_t j,
                          const void *v, mk_dtype t, ptrdiff_t ldv,
                          const void *const *v_rows, const float *vs,
                          ptrdiff_t vs_ld, int64_t dv, float *o,
                          ptrdiff_t ldo, const mk_heads *h, int64_t dist,
                          size_t off)
{
    const size_t es = mk_dtype_size(t);
    const int64_t group = G > 0 ? G : h->group;
    const size_t hb = (size_t)h->ld * es;
    const int spread = G == 1 && spread_fetch(t, h->into_l1);
    const char *row[2], *ahead[2];
    for (int k = 0; k < K; k++) {
        row[k] = mk_decode_row(v, ldv, v_rows, es, j + k) + off;
        ahead[k] = fetch_ahead(v, ldv, v_rows, es, j + k, n + h->more, dist,
                               off);
    }
    for (int64_t g = 0, i0 = 0; i0 < m; g++, i0 += group) {
        /* One row per kv head: the fetch spread over pv_keys's chunks;
         * grouped rows: the run before them (spread, the grouped rows
         * read 0.85-0.93x, docs/benchmarks.md). */
        const char *rg[2], *pf[2];
        for (int k = 0; k < K; k++) {
            rg[k] = row[k] + g * hb;
            pf[k] = (ahead[k] ? ahead[k] : row[k]) + g * hb;
            if (!spread && ahead[k] && G == 1)
                prefetch_run_near(pf[k], (size_t)dv * es, h->into_l1);
            else if (!spread && ahead[k])
                prefetch_run(pf[k], (size_t)dv * es, h->into_l1);
        }
        const int64_t nr = m - i0 < group ? m - i0 : group;
        /* A scaled row's probability takes its scale (and the code
         * factor, exact): one multiply per key and row. */
        float pk[2][MK_DECODE_ROWS] = {{0}}; /* (gcc cannot see nr == G) */
        for (int k = 0; k < K; k++)
            for (int64_t i = 0; i < nr; i++)
                pk[k][i] = mk_dtype_scaled(t)
                               ? p[(i0 + i) * ldp + j + k] *
                                     vs[(j + k) * vs_ld + g * h->scale_ld] *
                                     code_factor(t)
                               : p[(i0 + i) * ldp + j + k];
        if (G > 0) /* whole kv heads (MK_HEADS_GROUP_SWITCH) */
            pv_keys(K, G, (const float(*)[MK_DECODE_ROWS])pk, rg, t, dv,
                    o + i0 * ldo, ldo, spread ? pf : NULL);
        else
            pv_keys(K, nr, (const float(*)[MK_DECODE_ROWS])pk, rg, t, dv,
                    o + i0 * ldo, ldo, spread ? pf : NULL);
    }
}

#if MK_PV_BLOCK > 2
/* Keys j .. j + MK_PV_BLOCK - 1 of every kv head of G > 1 rows (a
 * constant) into the caller's accumulator: pv_block keeps a head's output
 * chunks in registers across the keys (one FMA per key and element in key
 * order, as pv_keys) and fetches the keys' runs of the head ahead among
 * their work. */
INLINE void pv_heads_block(const int G, const float *p, ptrdiff_t ldp,
                           int64_t m, int64_t n, int64_t j, const void *v,
                           mk_dtype t, ptrdiff_t ldv,
                           const void *const *v_rows, const float *vs,
                           ptrdiff_t vs_ld, int64_t dv, float *o,
                           ptrdiff_t ldo, const mk_heads *h, int64_t dist,
                           size_t off)
{
    const size_t es = mk_dtype_size(t);
    const size_t hb = (size_t)h->ld * es;
    const char *row[MK_PV_BLOCK], *ahead[MK_PV_BLOCK];
    block_rows(MK_PV_BLOCK, v, ldv, v_rows, es, j, n + h->more, dist, off,
               row, ahead);
    for (int64_t g = 0, i0 = 0; i0 < m; g++, i0 += G) {
        const char *rg[MK_PV_BLOCK], *pf[MK_PV_BLOCK];
        /* A scaled row's probability takes its scale (and the code
         * factor, exact), as in pv_heads_keys. */
        float pk[MK_PV_BLOCK][MK_DECODE_ROWS];
        for (int k = 0; k < MK_PV_BLOCK; k++) {
            rg[k] = row[k] + g * hb;
            pf[k] = (ahead[k] ? ahead[k] : row[k]) + g * hb;
            for (int i = 0; i < G; i++)
                pk[k][i] = mk_dtype_scaled(t)
                               ? p[(i0 + i) * ldp + j + k] *
                                     vs[(j + k) * vs_ld + g * h->scale_ld] *
                                     code_factor(t)
                               : p[(i0 + i) * ldp + j + k];
        }
        pv_block(MK_PV_BLOCK, G, (const float(*)[MK_DECODE_ROWS])pk, rg, t,
                 dv, o + i0 * ldo, ldo, pf);
    }
}

/* pv_heads_block over the keys, MK_PV_BLOCK at a time; returns the keys
 * done (the rest left to pv_heads_keys). */
INLINE int64_t pv_heads_blocks(const int G, const float *p, ptrdiff_t ldp,
                               int64_t m, int64_t n, const void *v,
                               mk_dtype t, ptrdiff_t ldv,
                               const void *const *v_rows, const float *vs,
                               ptrdiff_t vs_ld, int64_t dv, float *o,
                               ptrdiff_t ldo, const mk_heads *h, int64_t dist,
                               size_t off)
{
    int64_t j = 0;
    for (; j + MK_PV_BLOCK <= n; j += MK_PV_BLOCK)
        pv_heads_block(G, p, ldp, m, n, j, v, t, ldv, v_rows, vs, vs_ld, dv,
                       o, ldo, h, dist, off);
    return j;
}
#endif

#if MK_PV_BLOCK > 2
/* pv_heads_blocks out of line, as qk_blocks. */
static __attribute__((noinline)) int64_t
pv_blocks(int G, const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
          const void *v, mk_dtype t, ptrdiff_t ldv, const void *const *v_rows,
          const float *vs, ptrdiff_t vs_ld, int64_t dv, float *o,
          ptrdiff_t ldo, const mk_heads *h, int64_t dist, size_t off)
{
#define PV_BLOCKS(GG, T)                                                  \
    pv_heads_blocks(GG, p, ldp, m, n, v, T, ldv, v_rows, vs, vs_ld, dv, o,  \
                    ldo, h, dist, off)
    MK_BLOCKS_RETURN(G, t, PV_BLOCKS);
#undef PV_BLOCKS
}
#endif

/* The output rows of every head in the caller's accumulator (alpha
 * already applied): grouped rows and 8-bit types two keys at a time
 * (pv_heads_keys), one query row per kv head of fp32 or 16-bit one at a
 * time. A value row read for several rows, or widened at a cost, is
 * bound by the output rows' loads and stores, which pairs halve: 1.07-1.22x
 * on Zen 4 (whose 512-bit stores take two cycles); one fp32 or 16-bit row
 * per kv head is bound by memory, and pairs there fetched worse (0.83-1.0x;
 * 4 or 8 keys at a time measured level on Zen 5; docs/benchmarks.md). */
INLINE void decode_pv_heads(const int G, const float *p, ptrdiff_t ldp,
                            int64_t m, int64_t n, const void *v, mk_dtype t,
                            ptrdiff_t ldv, const void *const *v_rows,
                            const float *vs, ptrdiff_t vs_ld, int64_t dv,
                            float *o, ptrdiff_t ldo, const mk_heads *h,
                            size_t off)
{
    const size_t es = mk_dtype_size(t);
    const int64_t group = G > 0 ? G : h->group;
    const int64_t dist = heads_ahead(m, group, (size_t)h->ld * es, h);
    int64_t j = 0;
#if MK_PV_BLOCK > 2
    if (G > 1 && G <= MK_DECODE_ROWS) /* out of line, as qk_blocks */
        j = pv_blocks(G, p, ldp, m, n, v, t, ldv, v_rows, vs, vs_ld, dv, o,
                      ldo, h, dist, off);
#endif
    if (G != 1 || mk_dtype_size(t) == 1)
        for (; j + 2 <= n; j += 2)
            pv_heads_keys(2, G, p, ldp, m, n, j, v, t, ldv, v_rows, vs,
                          vs_ld, dv, o, ldo, h, dist, off);
    for (; j < n; j++)
        pv_heads_keys(1, G, p, ldp, m, n, j, v, t, ldv, v_rows, vs, vs_ld,
                      dv, o, ldo, h, dist, off);
}

/* Rows per pass of the across-heads loops (docs/design.md, "Decode
 * across heads"): whole kv heads whose fp32 rows of d elements (the
 * queries for the keys, the outputs for the values) and whose runs of one
 * position (d elements of type t per kv head) fit h->pass_bytes (all m
 * rows when 0); as few passes as that allows, of even kv heads, at least
 * one kv head each. */
INLINE int64_t pass_rows(int64_t m, int64_t d, mk_dtype t, const mk_heads *h)
{
    const int64_t all = (m + h->group - 1) / h->group;
    const size_t per = (size_t)d * (sizeof(float) * (size_t)h->group +
                                    mk_dtype_size(t));
    int64_t fit = h->pass_bytes > 0 ? (int64_t)((size_t)h->pass_bytes / per)
                                    : all;
    if (fit < 1)
        fit = 1;
    const int64_t passes = (all + fit - 1) / fit;
    return (all + passes - 1) / passes * h->group;
}

/* The pass from row r0 (pr rows a pass, the last one short): its rows,
 * the bytes from a position's first kv head to its own, and its first kv
 * head's scales (sc NULL: none). */
typedef struct {
    int64_t rows;
    size_t off;
    const float *scales;
} heads_pass;
INLINE heads_pass pass_at(int64_t m, int64_t r0, int64_t pr, mk_dtype t,
                          const float *sc, const mk_heads *h)
{
    const int64_t g0 = r0 / h->group;
    heads_pass ps = {m - r0 < pr ? m - r0 : pr,
                     (size_t)g0 * (size_t)h->ld * mk_dtype_size(t),
                     sc ? sc + g0 * h->scale_ld : NULL};
    return ps;
}

#ifdef MK_BY_HEAD
_Static_assert(MK_BY_HEAD <= MK_HEADS_AHEAD,
               "the fetch a block of keys ahead stays within `more`");
/* One query row per kv head where a pass cannot hold every head's query
 * (output) row beside a position's run (pass_rows < m: 32 fp32 heads at d
 * = 128 on a 32 KiB L1): head by head over MK_BY_HEAD keys at a time, the
 * head's MK_BY_HEAD rows of the next keys fetched into L2 among its work.
 * A head's query (output) row is then read once for MK_BY_HEAD keys, and
 * the block's rows are read as MK_BY_HEAD streams through whole
 * positions, which the passes of half positions 16 KiB apart were not:
 * [B, L, H, D] fp32 (1,32,1,4096,128) and (8,32,1,2048,128) read
 * 1.04-1.10x faster than in two passes, paged 1.05-1.07x (1 thread, Zen
 * 4; level on 2, where memory is saturated; bench/read_patterns'
 * blhd-x8f against blhd2-fetch, docs/benchmarks.md).
 * The same operations per score and output element as a call per head
 * (keys_dot_head's sums are rows_dot's; pv_keys_head's FMAs go key by
 * key). Returns the keys done, a multiple of MK_BY_HEAD; the rest go
 * through the passes. */
INLINE int64_t qk_by_head_t(const mk_dtype t, const float *q, ptrdiff_t ldq,
                            int64_t m, const void *k, ptrdiff_t ldk,
                            const void *const *k_rows, const float *ks,
                            ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                            ptrdiff_t lds, const mk_heads *h)
{
    const size_t es = mk_dtype_size(t), hb = (size_t)h->ld * es;
    int64_t j = 0;
    for (; j + MK_BY_HEAD <= n; j += MK_BY_HEAD) {
        const char *rows[MK_BY_HEAD], *ahead[MK_BY_HEAD];
        block_rows(MK_BY_HEAD, k, ldk, k_rows, es, j, n + h->more,
                   MK_BY_HEAD, 0, rows, ahead);
        for (int64_t g = 0; g < m; g++) {
            const char *rg[MK_BY_HEAD], *pf[MK_BY_HEAD];
            float sc[MK_BY_HEAD];
            for (int x = 0; x < MK_BY_HEAD; x++) {
                rg[x] = rows[x] + g * hb;
                pf[x] = (ahead[x] ? ahead[x] : rows[x]) + g * hb;
                sc[x] = mk_dtype_scaled(t)
                            ? ks[(j + x) * ks_ld + g * h->scale_ld]
                            : 1.0f;
            }
            keys_dot_head(q + g * ldq, rg, pf, t, sc, d, s + g * lds + j);
        }
    }
    return j;
}

/* Out of line, one copy per dtype, as qk_blocks. */
static __attribute__((noinline)) int64_t
qk_by_head(const float *q, ptrdiff_t ldq, int64_t m, const void *k,
           mk_dtype t, ptrdiff_t ldk, const void *const *k_rows,
           const float *ks, ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
           ptrdiff_t lds, const mk_heads *h)
{
    int64_t j = 0;
#define QK_BY_HEAD(T)                                                     \
    j = qk_by_head_t(T, q, ldq, m, k, ldk, k_rows, ks, ks_ld, n, d, s, lds, h)
    MK_FOR_DTYPE(t, QK_BY_HEAD)
#undef QK_BY_HEAD
    return j;
}

/* P.V of qk_by_head's form: o rows += their probabilities times the value
 * rows, head by head over MK_BY_HEAD keys at a time; returns the keys
 * done. */
INLINE int64_t pv_by_head_t(const mk_dtype t, const float *p, ptrdiff_t ldp,
                            int64_t m, int64_t n, const void *v,
                            ptrdiff_t ldv, const void *const *v_rows,
                            const float *vs, ptrdiff_t vs_ld, int64_t dv,
                            float *o, ptrdiff_t ldo, const mk_heads *h)
{
    const size_t es = mk_dtype_size(t), hb = (size_t)h->ld * es;
    int64_t j = 0;
    for (; j + MK_BY_HEAD <= n; j += MK_BY_HEAD) {
        const char *rows[MK_BY_HEAD], *ahead[MK_BY_HEAD];
        block_rows(MK_BY_HEAD, v, ldv, v_rows, es, j, n + h->more,
                   MK_BY_HEAD, 0, rows, ahead);
        for (int64_t g = 0; g < m; g++) {
            const char *rg[MK_BY_HEAD], *pf[MK_BY_HEAD];
            float pk[MK_BY_HEAD];
            for (int x = 0; x < MK_BY_HEAD; x++) {
                rg[x] = rows[x] + g * hb;
                pf[x] = (ahead[x] ? ahead[x] : rows[x]) + g * hb;
                /* a scaled row's probability takes its scale (and the
                 * code factor, exact), as in pv_heads_keys */
                pk[x] = mk_dtype_scaled(t)
                            ? p[g * ldp + j + x] *
                                  vs[(j + x) * vs_ld + g * h->scale_ld] *
                                  code_factor(t)
                            : p[g * ldp + j + x];
            }
            pv_keys_head(pk, rg, pf, t, dv, o + g * ldo);
        }
    }
    return j;
}

static __attribute__((noinline)) int64_t
pv_by_head(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
           const void *v, mk_dtype t, ptrdiff_t ldv,
           const void *const *v_rows, const float *vs, ptrdiff_t vs_ld,
           int64_t dv, float *o, ptrdiff_t ldo, const mk_heads *h)
{
    int64_t j = 0;
#define PV_BY_HEAD(T)                                                     \
    j = pv_by_head_t(T, p, ldp, m, n, v, ldv, v_rows, vs, vs_ld, dv, o, ldo, h)
    MK_FOR_DTYPE(t, PV_BY_HEAD)
#undef PV_BY_HEAD
    return j;
}
#endif

/* The entry points: the across-heads loops with the group a constant when
 * the block's rows are whole kv heads of 1, 2, 4 or 8 rows
 * (MK_HEADS_GROUP_SWITCH), the runtime loop otherwise. */
INLINE void decode_qk_across(const float *q, ptrdiff_t ldq, int64_t m,
                             const void *k, mk_dtype t, ptrdiff_t ldk,
                             const void *const *k_rows, const float *ks,
                             ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                             ptrdiff_t lds, const mk_heads *h)
{
    const int64_t pr = pass_rows(m, d, t, h);
#ifdef MK_BY_HEAD
    if (h->group == 1 && pr < m) {
        const int64_t j = qk_by_head(q, ldq, m, k, t, ldk, k_rows, ks, ks_ld,
                                     n, d, s, lds, h);
        if (k_rows)
            k_rows += j;
        else
            k = (const char *)k + (size_t)(j * ldk) * mk_dtype_size(t);
        ks = ks ? ks + j * ks_ld : NULL;
        n -= j;
        s += j;
    }
#endif
    for (int64_t r0 = 0; r0 < m && n > 0; r0 += pr) {
        const heads_pass ps = pass_at(m, r0, pr, t, ks, h);
#define QK_HEADS(G)                                                       \
    decode_qk_heads(G, q + r0 * ldq, ldq, ps.rows, k, t, ldk, k_rows,     \
                    ps.scales, ks_ld, n, d, s + r0 * lds, lds, h, ps.off)
        MK_HEADS_GROUP_SWITCH(h->group, ps.rows, QK_HEADS)
#undef QK_HEADS
    }
}

INLINE void decode_pv_across(const float *p, ptrdiff_t ldp, int64_t m,
                             int64_t n, const void *v, mk_dtype t,
                             ptrdiff_t ldv, const void *const *v_rows,
                             const float *vs, ptrdiff_t vs_ld, int64_t dv,
                             float *o, ptrdiff_t ldo, const mk_heads *h)
{
    const int64_t pr = pass_rows(m, dv, t, h);
#ifdef MK_BY_HEAD
    if (h->group == 1 && pr < m) {
        const int64_t j = pv_by_head(p, ldp, m, n, v, t, ldv, v_rows, vs,
                                     vs_ld, dv, o, ldo, h);
        if (v_rows)
            v_rows += j;
        else
            v = (const char *)v + (size_t)(j * ldv) * mk_dtype_size(t);
        vs = vs ? vs + j * vs_ld : NULL;
        n -= j;
        p += j;
    }
#endif
    for (int64_t r0 = 0; r0 < m && n > 0; r0 += pr) {
        const heads_pass ps = pass_at(m, r0, pr, t, vs, h);
#define PV_HEADS(G)                                                       \
    decode_pv_heads(G, p + r0 * ldp, ldp, ps.rows, n, v, t, ldv, v_rows,  \
                    ps.scales, vs_ld, dv, o + r0 * ldo, ldo, h, ps.off)
        MK_HEADS_GROUP_SWITCH(h->group, ps.rows, PV_HEADS)
#undef PV_HEADS
    }
}

#endif
