/*
 * The decode loops across kv heads (docs/design.md, "Decode across
 * heads"), written once over a decode file's primitives: key by key, each
 * key's run of kv heads in address order (one contiguous run of a [B, L,
 * H, D] position), G = h->group when G > 0 (a constant, so a head's rows
 * unroll; the block's rows are then whole heads: MK_HEADS_GROUP_SWITCH),
 * any group and a short last head when G = 0. Per score and per
 * output element the arithmetic is that of a call per kv head, bit for
 * bit (the kernel contract in kernels.h).
 *
 * The including file defines, as static always-inline functions:
 *   rows_dot(q, ldq, m, row, t, sc, d, s, lds)
 *       s[i * lds] = q row i . key row (times sc when t is scaled), i < m
 *   pv_rows(R, pk, row, t, dv, o, ldo)
 *       o rows i < R += pk[i] times the value row, one FMA per element
 *   prefetch_run(run, bytes)
 *       fetch a run of bytes ahead
 *   code_factor(t)
 *       what its loads leave to undo per row (E4M3's 2^-8, or 1)
 * and INLINE.
 */
#ifndef MK_DECODE_HEADS_H
#define MK_DECODE_HEADS_H

/* The fetch ahead (prefetch_run, MK_HEADS_AHEAD positions on): always
 * through a row table (a paged cache's runs jump between cache blocks);
 * in a dense cache only for fp32 and 8-bit runs of at most a page (a few
 * kv heads, or 8-bit codes): there it measured 1.1-1.25x, while 16-bit
 * runs (0.9x) and longer runs (8 KiB and more: 0.8-0.97x) go faster on
 * the hardware prefetchers alone (docs/benchmarks.md). */
#define MK_HEADS_DENSE_RUN 4096
INLINE int fetch_dense(mk_dtype t, size_t run)
{
    return run <= MK_HEADS_DENSE_RUN && mk_dtype_size(t) != 2;
}

INLINE void decode_qk_heads(const int G, const float *q, ptrdiff_t ldq,
                            int64_t m, const void *k, mk_dtype t,
                            ptrdiff_t ldk, const void *const *k_rows,
                            const float *ks, ptrdiff_t ks_ld, int64_t n,
                            int64_t d, float *s, ptrdiff_t lds,
                            const mk_heads *h)
{
    const size_t es = mk_dtype_size(t);
    const int64_t group = G > 0 ? G : h->group;
    const size_t hb = (size_t)h->ld * es, run = mk_heads_bytes(m, h, d, es);
    const int dense = fetch_dense(t, run);
    for (int64_t j = 0; j < n; j++) {
        const char *row = mk_decode_row(k, ldk, k_rows, es, j);
        if (j + MK_HEADS_AHEAD < n + h->more) {
            if (k_rows)
                prefetch_run(k_rows[j + MK_HEADS_AHEAD], run);
            else if (dense)
                prefetch_run(mk_decode_row(k, ldk, NULL, es,
                                           j + MK_HEADS_AHEAD),
                             run);
        }
        const float *sj = mk_dtype_scaled(t) ? ks + j * ks_ld : NULL;
        if (G > 0) /* whole kv heads (MK_HEADS_GROUP_SWITCH) */
            for (int64_t g = 0, i = 0; i < m; g++, i += G)
                rows_dot(q + i * ldq, ldq, G, row + g * hb, t,
                         sj ? sj[g * h->scale_ld] : 1.0f, d,
                         s + i * lds + j, lds);
        else
            for (int64_t g = 0, i = 0; i < m; g++, i += group)
                rows_dot(q + i * ldq, ldq, m - i < group ? m - i : group,
                         row + g * hb, t, sj ? sj[g * h->scale_ld] : 1.0f, d,
                         s + i * lds + j, lds);
    }
}

/* The output rows of every head in the caller's accumulator (alpha
 * already applied), one FMA per key in key order. (Taking 4 or 8 keys per
 * head at a time, the output chunk in a register across them, measured
 * level or slower: docs/benchmarks.md.) */
INLINE void decode_pv_heads(const int G, const float *p, ptrdiff_t ldp,
                            int64_t m, int64_t n, const void *v, mk_dtype t,
                            ptrdiff_t ldv, const void *const *v_rows,
                            const float *vs, ptrdiff_t vs_ld, int64_t dv,
                            float *o, ptrdiff_t ldo, const mk_heads *h)
{
    const size_t es = mk_dtype_size(t);
    const int64_t group = G > 0 ? G : h->group;
    const size_t hb = (size_t)h->ld * es, run = mk_heads_bytes(m, h, dv, es);
    const int dense = fetch_dense(t, run);
    for (int64_t j = 0; j < n; j++) {
        const char *row = mk_decode_row(v, ldv, v_rows, es, j);
        if (j + MK_HEADS_AHEAD < n + h->more) {
            if (v_rows)
                prefetch_run(v_rows[j + MK_HEADS_AHEAD], run);
            else if (dense)
                prefetch_run(mk_decode_row(v, ldv, NULL, es,
                                           j + MK_HEADS_AHEAD),
                             run);
        }
        for (int64_t g = 0, i0 = 0; i0 < m; g++, i0 += group) {
            const int64_t nr = m - i0 < group ? m - i0 : group;
            /* A scaled row's probability takes its scale (and the code
             * factor, exact): one multiply per key and row. */
            float pk[MK_DECODE_ROWS] = {0}; /* (gcc cannot see nr == G) */
            for (int64_t i = 0; i < nr; i++)
                pk[i] = mk_dtype_scaled(t)
                            ? p[(i0 + i) * ldp + j] *
                                  vs[j * vs_ld + g * h->scale_ld] *
                                  code_factor(t)
                            : p[(i0 + i) * ldp + j];
            if (G > 0) /* whole kv heads (MK_HEADS_GROUP_SWITCH) */
                pv_rows(G, pk, row + g * hb, t, dv, o + i0 * ldo, ldo);
            else
                pv_rows(nr, pk, row + g * hb, t, dv, o + i0 * ldo, ldo);
        }
    }
}

/* The entry points: the across-heads loops with the group a constant when
 * the block's rows are whole kv heads of 1, 2, 4 or 8 rows
 * (MK_HEADS_GROUP_SWITCH), the runtime loop otherwise. */
INLINE void decode_qk_across(const float *q, ptrdiff_t ldq, int64_t m,
                             const void *k, mk_dtype t, ptrdiff_t ldk,
                             const void *const *k_rows, const float *ks,
                             ptrdiff_t ks_ld, int64_t n, int64_t d, float *s,
                             ptrdiff_t lds, const mk_heads *h)
{
#define QK_HEADS(G)                                                       \
    decode_qk_heads(G, q, ldq, m, k, t, ldk, k_rows, ks, ks_ld, n, d, s,  \
                    lds, h)
    MK_HEADS_GROUP_SWITCH(h->group, m, QK_HEADS)
#undef QK_HEADS
}

INLINE void decode_pv_across(const float *p, ptrdiff_t ldp, int64_t m,
                             int64_t n, const void *v, mk_dtype t,
                             ptrdiff_t ldv, const void *const *v_rows,
                             const float *vs, ptrdiff_t vs_ld, int64_t dv,
                             float *o, ptrdiff_t ldo, const mk_heads *h)
{
#define PV_HEADS(G)                                                       \
    decode_pv_heads(G, p, ldp, m, n, v, t, ldv, v_rows, vs, vs_ld, dv, o, \
                    ldo, h)
    MK_HEADS_GROUP_SWITCH(h->group, m, PV_HEADS)
#undef PV_HEADS
}

#endif
