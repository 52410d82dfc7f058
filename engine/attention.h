/* The attention loop's parts, shared by plan.c (the plan and the block
 * geometry), prefill.c and decode.c (the two streams), merge.c (the
 * split-KV merge) and attention.c (the parallel loop). docs/design.md,
 * "Plan and scratch" and "Data path of one call". */
#ifndef MHA_ATTENTION_H
#define MHA_ATTENTION_H

#include "engine.h"

/* Float offsets of one thread's scratch parts (each a multiple of 16). */
typedef struct {
    int64_t s;     /* block_q x key_block scores, then probabilities */
    int64_t kp;    /* the packed key block, or a whole head's with cache */
    int64_t o;     /* block_q x dv accumulator */
    int64_t m, l;  /* running max and sum per row */
    int64_t alpha; /* per-row rescale of the accumulator */
    int64_t l2;    /* weights pass: a sum nobody reads */
    int64_t kw;    /* a half-precision key block widened to fp32 */
    int64_t vw;    /* a half-precision value block widened to fp32, or with
                    * the head cache the head's values as fp32 rows */
    int64_t rt;    /* decode over a paged cache: a key block's K and V row
                    * tables, then their rows' scales */
    int64_t qw, ow; /* half compute: block_q x d queries, x dv outputs */
    int64_t floats; /* the whole part */
} mha_scratch_layout;

/* One sequence of a batch (a dense batch's b, or a continuous batch's
 * sequence): its lengths, where its rows are, and how its rows are cut
 * into units (docs/design.md, "Continuous batches"). */
typedef struct {
    int64_t lq, lk;       /* queries; keys (weights row, causal alignment) */
    int64_t key_limit;    /* keys at or past it hidden (key_lengths) */
    int64_t q_off, o_off; /* elements from q, out to row 0 of head 0 */
    int64_t k_off, v_off; /* elements from k, v to key 0 of kv head 0 */
    int64_t ks_off, vs_off; /* floats from the scales to key 0's */
    const int32_t *pages; /* paged keys: the block table row; else NULL */
    int64_t w_off;        /* floats from weights to its [H, lq, lk] */
    int64_t lse_off, lse_sh; /* floats from lse to (head 0, row 0); head */
    int64_t unit0, units; /* its units: [unit0, unit0 + units) */
    int64_t item0;        /* its first item (units x chunks of them) */
    int64_t chunks;       /* key chunks per unit */
    int64_t chunk_len;    /* keys per chunk, a multiple of block_k */
    int64_t part0;        /* floats to its split partials (chunks > 1) */
    int64_t partial_floats; /* one (unit, chunk) partial: rows x (dv + 2) */
    int key_major;        /* items run chunk by chunk across its units */
    int64_t rows;         /* rows per block: block_q or fewer */
    int64_t row_blocks;   /* per head (or kv head when grouped) */
    int64_t key_block;    /* keys per block of its stream */
    int grouped;          /* rows are query heads at one query (lq 1) */
    int64_t kv_span;      /* grouped: kv heads a row block spans (its rows
                           * their query heads), read key by key across
                           * them (docs/design.md, "Decode across heads") */
    int64_t ilv;          /* grouped: queries a block takes (a step of
                           * lq = 2..MK_DECODE_ROWS queries: its rows
                           * interleave them, row_blocks blocks of up to
                           * ilv; else 1) */
    int decode;           /* rows <= MK_DECODE_ROWS, or a wide block
                           * (plan.c, pages_apart): K and V in place */
    int cache;            /* a thread keeps a whole head's packed keys */
} mha_seq;

/* Rows a copy of rows a page or more apart (prefill.c's gather of K/V
 * rows, attention.c's staging of crowded q rows) fetches into L2 ahead of
 * the row it copies: the hardware prefetchers do not follow such rows,
 * and the copy waited on each (docs/benchmarks.md; for q, 8 and 24 read
 * the same). */
#define MHA_COPY_AHEAD 8

/* Whether a block of `rows` fp32 output (or weights) rows goes to memory
 * by non-temporal stores (the stream argument of normalize and
 * pv_finish): a prefill block's rows, a page or more apart, which the
 * engine does not read back, so reading each line for ownership first is
 * wasted. Decode's few rows, which the caller reads next, and the layer's
 * attention output and weights (p->out_read_next), which its output
 * projection and head average read at once, stay cached: streamed, the
 * projection read them back from memory (docs/benchmarks.md). */
static inline int mha_streams_out(const mha_problem *p, int64_t rows)
{
    return rows > MK_DECODE_ROWS && !p->out_read_next;
}

/* Whether a prefill block of `rows` query rows copies its fp32 values
 * (prefill.c, gather_rows, which fetches ahead) rather than reading them
 * in place: few rows (grouped decode with more than MK_DECODE_ROWS query
 * rows a kv head, short prompts) over dense rows a page or more apart (a
 * [B, L, H, D] cache), which the hardware prefetchers do not follow and
 * the P.V tile does not fetch. Group 16 from [B, L, H, D] read 1.2x
 * faster copied; a full block's P.V hides the wait itself (Zen 4,
 * docs/benchmarks.md). */
#define GATHER_V_ROWS (2 * MK_DECODE_ROWS)
#define GATHER_V_STRIDE_BYTES 4096
static inline int mha_gathers_values(const mha_problem *p, int64_t rows)
{
    return rows <= GATHER_V_ROWS && p->v_dtype == MHA_F32 &&
           !p->block_table &&
           p->v_ss >= (int64_t)(GATHER_V_STRIDE_BYTES / sizeof(float));
}

struct mha_plan {
    int cache_heads;    /* some sequence keeps heads (scratch for it) */
    int any_prefill;    /* some sequence takes the prefill stream */
    int any_decode;     /* some sequence takes the decode stream */
    int gather_v;       /* some prefill block gathers its values
                         * (mha_gathers_values; scratch for it) */
    int interleave;     /* some block interleaves queries (mha_seq.ilv;
                         * its rows are staged: scratch for them) */
    /* The table's slots of the compute dtype when prefill blocks compute
     * in it natively (mha_plan_make: q, K and V read as half codes, no
     * widening), else NULL. */
    const mk_half_slots *half;
    int64_t group;      /* query heads per kv head */
    int64_t units;      /* over the sequences: heads x row_blocks */
    int64_t decode_key_block; /* keys per block of the decode stream */
    int64_t rt_rows;    /* paged decode: entries per row table */
    int64_t rt_scales;  /* paged decode: floats per row-scale table */
    int64_t items;      /* over the sequences: units x chunks */
    int64_t part_floats; /* split partials of every split sequence */
    int64_t tasks_max;  /* tasks at most: one per item */
    int nthreads;
    int flush;          /* the engine's flush_subnormals (fpenv.c) */
    mha_scratch_layout thread;
    size_t seq_offset;  /* bytes to the sequence table (run fills it) */
    size_t task_offset; /* bytes to the task list (run fills it) */
    size_t bytes; /* partials, nthreads thread parts, the sequences, the
                     tasks and the sequence order */
};

/* What a thread takes at once: items [first, first + count). */
typedef struct {
    int64_t first, count;
} mha_task;

/* A sequence and its cost, for ordering the tasks. */
typedef struct {
    int64_t cost, seq;
} mha_seq_order;

/* plan.c: the plan of a validated problem on an engine (p's pointers are
 * not read). MHA_ERR_OVERFLOW (with message) when the scratch does not
 * fit. */
mha_status mha_plan_make(const mha_engine *engine, const mha_problem *p,
                         mha_plan *pl);

/* The packed keys and the contiguous fp32 values of the head a thread last
 * worked on: query blocks of one head reuse them instead of packing every
 * key block and copying (or widening) every value block again. Keys
 * [lo, hi) (values [vlo, vhi)) of the head are in the copy. */
typedef struct {
    int64_t head; /* the row block's cache_id, -1 for none */
    int64_t lo, hi;
    int64_t vhead;
    int64_t vlo, vhi;
} mha_head_cache;

/* One thread's scratch, carved by the plan's layout. */
typedef struct {
    float *s, *kp, *o, *m, *l, *alpha, *l2, *kw, *vw;
    float *qw, *ow; /* a half-precision compute dtype: the row block's
                       queries widened, its output rows before narrowing */
    const void **k_rows, **v_rows; /* paged decode: row tables */
    float *k_scales, *v_scales;    /* and the rows' scales */
    mha_head_cache *cache; /* NULL: pack every key block where it is used */
} mha_scratch;

/* A block of rows sharing one kv head: the rows are queries of one head,
 * or (grouped) the query heads of one kv group at the single query, or of
 * several kv groups (kv_group). Every
 * pointer is the block's first row; the ld fields step one row. Row r
 * sees keys [max(key_begin, r + diag_lo), min(key_end, r + diag_hi + 1))
 * (docs/design.md, "Mask model"). */
typedef struct {
    int64_t rows;
    int decode;        /* the decode stream, else prefill */
    int64_t key_block; /* keys per block */
    int64_t s_ld;      /* the decode score tile's row stride (plan.c,
                        * wide_key_block) */
    int64_t cache_id;  /* the (sequence, kv head) the rows read */
    /* Rows spanning kv heads (decode only): rows [g * kv_group, (g + 1) *
     * kv_group) read kv head g, its K and V rows (and scales) k_hs, v_hs
     * elements (ks_hs, vs_hs floats) past kv head 0's. 0: one kv head. */
    int64_t kv_group;
    ptrdiff_t k_hs, v_hs, ks_hs, vs_hs;
    /* Rows interleaving ilv > 1 queries (a speculative decode step
     * across kv heads; 1: none): row r is query (r / ilv_group) % ilv of
     * head (r / (ilv_group * ilv)) * ilv_group + r % ilv_group past the
     * first row's, whose q, out and lse rows are then q_qs, o_qs and 1
     * elements a query and ldq_src, ldo_dst and lse_ld a head apart
     * (mha_ilv_at). Such rows are staged: q gathered, out scattered. */
    int64_t ilv, ilv_group;
    ptrdiff_t q_qs, o_qs;
    /* fp32 query rows (row r at q + r * ldq), the caller's or, for a
     * half-precision compute dtype, the thread's widened copy of q_src's
     * (mha_stage_rows); out likewise, narrowed into out_dst. */
    const float *q;
    ptrdiff_t ldq;
    const char *q_src; /* the caller's rows, of the compute dtype */
    ptrdiff_t ldq_src;
    /* K and V of the kv head, bytes (the element type is the problem's):
     * row j at j * k_ss elements, or with pages in block pages[j / P] at
     * that block's stride and slot j % P (P = the pool's seq). ks, vs:
     * quantised K/V's scales laid out alike, else NULL. mha_kv_run finds
     * the rows. */
    const char *k, *v;
    const float *ks, *vs;
    const int32_t *pages;
    float *out;
    ptrdiff_t ldo;
    char *out_dst; /* the caller's output rows, of the compute dtype */
    ptrdiff_t ldo_dst;
    float *w; /* weights rows, or NULL */
    ptrdiff_t w_ld; /* the sequence's keys */
    const uint8_t *keep;
    ptrdiff_t keep_ld, keep_qld; /* qld: a query's step, interleaved rows */
    const uint8_t *key_keep; /* the batch's key padding row, or NULL */
    const float *bias;
    ptrdiff_t bias_ld, bias_qld;
    /* Score terms (docs/design.md, "Score terms"): per-row ALiBi slope
     * and the aligned query position of row 0 (step per row), the sink
     * logit per row, the lse output rows. */
    float softcap;
    const float *alibi;
    ptrdiff_t alibi_ld;
    int64_t alibi_pos, alibi_pos_step;
    const float *sink;
    ptrdiff_t sink_ld;
    float *lse;
    ptrdiff_t lse_ld;
    int64_t key_begin; /* no row sees keys before it (diag_lo implies it) */
    int64_t key_end;   /* keys at or past it are hidden from every row */
    int64_t diag_lo;   /* MK_NO_DIAG_LO, or key j hidden when j < r + it */
    int64_t diag_hi;   /* MK_NO_DIAG_HI, or key j hidden when j > r + it */
} mha_row_block;

/* Elements from an interleaved row block's first row to row r's, for
 * rows qs apart a query and hs a head (mha_row_block.ilv; the masks'
 * map, mk_row_in). */
static inline ptrdiff_t mha_ilv_at(const mha_row_block *rb, int64_t r,
                                   ptrdiff_t qs, ptrdiff_t hs)
{
    mk_row w = mk_row_in(r, rb->ilv_group, rb->ilv);
    return w.q * qs + w.h * hs;
}

/* plan.c: the sequence table (pl->units entries' owners; filled once per
 * call), the sequence a unit belongs to, the geometry of a unit, and a key
 * block's tile mask. */
void mha_seqs_fill(const mk_table *t, const mha_problem *p,
                   const mha_plan *pl, mha_seq *seqs);
int64_t mha_seq_of_unit(const mha_seq *seqs, int64_t n, int64_t unit);
int64_t mha_seq_of_item(const mha_seq *seqs, int64_t n, int64_t item);
/* The task list (docs/design.md, "Threading and determinism"): returns
 * how many tasks it wrote; order is scratch of p->batch entries. */
int64_t mha_tasks_fill(const mha_problem *p, const mha_plan *pl,
                       const mha_seq *seqs, mha_seq_order *order,
                       mha_task *tasks);
mha_row_block mha_row_block_of(const mha_problem *p, const mha_plan *pl,
                               const mha_seq *seqs, int64_t unit);
/* The longest run of K (value 0) or V rows [j, j + n) of a row block that
 * sit at one stride (one block of a paged cache; all of a dense head):
 * *rows is row j, *scales its scale (NULL for the float dtypes); returns
 * the run's length, 1..n. */
int64_t mha_kv_run(const mha_problem *p, const mha_row_block *rb, int value,
                   int64_t j, int64_t n, const char **rows,
                   const float **scales);
mk_mask mha_block_mask(const mha_row_block *rb, int64_t k0, int64_t nk);

/* The two streams (prefill.c, decode.c) share these signatures. scores:
 * one key block's scores, scaled, masked and turned into probabilities
 * against the running max m (sc->s, m, row_sum and sc->alpha updated).
 * step: the same, then the weights rows when asked, then the accumulator
 * o updated with P V. */
typedef void mha_scores_fn(const mk_table *t, const mha_problem *p,
                           const mha_plan *pl, const mha_row_block *rb,
                           const mha_scratch *sc, float *m, int64_t k0,
                           int64_t nk, float *row_sum);
typedef void mha_step_fn(const mk_table *t, const mha_problem *p,
                         const mha_plan *pl, const mha_row_block *rb,
                         const mha_scratch *sc, int64_t k0, int64_t nk,
                         float *o, float *m, float *l);
mha_scores_fn mha_prefill_scores, mha_decode_scores;
mha_step_fn mha_prefill_step, mha_decode_step;
/* prefill.c: a prefill row block's last key step. Where it can (fp32
 * compute, plain rows, no weights) P·V writes the normalised output rows
 * itself (the table's pv_finish; rows of a causal sub-block that see no
 * key of the block, normalize) and it returns 1: mha_finish_rows then
 * writes only the lse. Else mha_prefill_step, and 0. */
int mha_prefill_finish(const mk_table *t, const mha_problem *p,
                       const mha_plan *pl, const mha_row_block *rb,
                       const mha_scratch *sc, int64_t k0, int64_t nk, float *o,
                       float *m, float *l);

/* merge.c: combines the chunks' partials of one row block in chunk order
 * and writes the normalised rows (and their lse). */
void mha_merge_chunks(const mk_table *t, const mha_problem *p,
                      const mha_seq *s, const mha_row_block *rb,
                      float *parts);
/* merge.c: writes a row block's normalised rows from its accumulator o
 * (row stride dv; NULL: they are written, mha_prefill_finish), and with
 * an lse output each row's m + log(l). */
void mha_finish_rows(const mk_table *t, const mha_problem *p,
                     const mha_row_block *rb, const float *o, const float *m,
                     const float *l);

/* attention.c: runs a planned problem with scratch of pl->bytes (cannot
 * fail). */
void mha_attention_run(const mk_table *t, const mha_problem *p,
                       const mha_plan *pl, void *scratch);

#endif
