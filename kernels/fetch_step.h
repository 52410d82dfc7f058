/*
 * The decode kernels' fetch ahead spread over their chunks
 * (kernels/decode_heads.h), shared by the x86 decode files, and the
 * packs' (and the engine's gather's) fetch of the rows ahead: always
 * inlined beside the loops (a
 * shared helper the compiler may keep out of line compiled to half the
 * prefetches once: docs/benchmarks.md).
 */
#ifndef MK_FETCH_STEP_H
#define MK_FETCH_STEP_H

#include <stddef.h>
#include <stdint.h>

/* The cache level the including file fetches into, as
 * __builtin_prefetch's locality: 2 (L2, T1) unless it says 3 (L1, T0). */
#ifndef MK_FETCH_LOCALITY
#define MK_FETCH_LOCALITY 2
#endif

/* Rows a decode kernel reading one kv head at a time fetches ahead of
 * the row in use, into L2: 32, or fewer so as to reach no more than 8 KiB
 * on (rows longer than 256 bytes: fp32 at d = 128 fetches 16 rows ahead).
 * fp32 [B, H, L, D] (1,32,1,4096,128) and (8,32,1,2048,128) read
 * 1.04-1.06x at 8 KiB over 16 KiB, 0.87-0.93x at 4 KiB (Zen 4,
 * docs/benchmarks.md). */
static inline int64_t mk_ahead_rows(size_t row_bytes)
{
    const size_t most = 32, reach = 8192;
    if (row_bytes == 0 || reach / row_bytes >= most)
        return (int64_t)most;
    return reach / row_bytes > 0 ? (int64_t)(reach / row_bytes) : 1;
}

/* Keys per value step of a decode kernel reading one kv head at a time,
 * out of at most `most`: about 2 KiB of rows, so half of them where rows
 * are longer than 256 bytes (fp32 at d = 128: 4 keys read [B, H, L, D]
 * 1.08-1.12x faster than 8 on Zen 4; fp16 at 4 read 0.91x,
 * docs/benchmarks.md). */
static inline int64_t mk_step_keys(size_t row_bytes, int64_t most)
{
    return row_bytes > 256 ? most / 2 : most;
}

/* Bytes [b0, b0 + bytes) of a row (bytes a constant, b0 a multiple of
 * it): the lines at offsets 0, 64, ... of the run pf that start there,
 * into L2 (or L1: MK_FETCH_LOCALITY), issued among the loads of the row
 * in use rather than as a burst before them. No loop and at most a
 * predictable test per chunk: a general loop over the lines cost 20-25%
 * with the cache in L3. */
static inline __attribute__((always_inline)) void
mk_fetch_step(const char *pf, size_t b0, const size_t bytes)
{
    if (bytes >= 64)
        for (size_t k = 0; k < bytes; k += 64)
            __builtin_prefetch(pf + b0 + k, 0, MK_FETCH_LOCALITY);
    else if ((b0 & 63) == 0)
        __builtin_prefetch(pf + b0, 0, MK_FETCH_LOCALITY);
}

/* What mk_fetch_step leaves of a run of row_bytes after the chunks ended
 * at byte b0: the lines starting past b0 and the last line (an unaligned
 * run's). */
static inline __attribute__((always_inline)) void
mk_fetch_rest(const char *pf, size_t b0, size_t row_bytes)
{
    if (row_bytes == 0)
        return;
    for (size_t o = (b0 + 63) & ~(size_t)63; o < row_bytes; o += 64)
        __builtin_prefetch(pf + o, 0, MK_FETCH_LOCALITY);
    __builtin_prefetch(pf + row_bytes - 1, 0, MK_FETCH_LOCALITY);
}

/* A run of bytes ahead, whole: into L1 (l1 nonzero: mk_heads.into_l1)
 * line by line, or into L2 with its last line too (an unaligned run's),
 * as the files' prefetch_row. */
static inline __attribute__((always_inline)) void
mk_fetch_run(const char *run, size_t bytes, int l1)
{
    if (l1) {
        for (size_t off = 0; off < bytes; off += 64)
            __builtin_prefetch(run + off, 0, 3);
    } else {
        for (size_t off = 0; off < bytes; off += 64)
            __builtin_prefetch(run + off, 0, 2);
        __builtin_prefetch(run + bytes - 1, 0, 2);
    }
}

/* Rows a pack fetches ahead of the rows it transposes: two of avx512's
 * 32-key panels, four of avx2's 16-key ones. */
#define MK_PACK_AHEAD 64

/* The line at element col of rows [r, r + count) of x (stride ldx) that
 * exist (below n), into L2: a pack issues it beside its loads of the same
 * line MK_PACK_AHEAD rows back, so keys read from memory arrive while it
 * transposes. Keys a page or more apart (a [B, L, H, D] cache) defeat the
 * hardware prefetchers, and where a block has few query rows (grouped
 * decode with more than MK_DECODE_ROWS rows a kv head) the pack waited on
 * them: 16 query rows a kv head read 1.18x faster from either layout
 * (Zen 4, docs/benchmarks.md). */
static inline __attribute__((always_inline)) void
mk_pack_fetch(const float *x, ptrdiff_t ldx, int64_t n, int64_t r,
              int64_t count, int64_t col)
{
    for (int64_t i = 0; i < count && r + i < n; i++)
        __builtin_prefetch(x + (r + i) * ldx + col, 0, 2);
}

#endif
