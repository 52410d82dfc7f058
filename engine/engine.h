/* Engine internals shared by the files of engine/. Not installed. The
 * house and the data path of one call: docs/design.md. */
#ifndef MHA_ENGINE_H
#define MHA_ENGINE_H

#include "kernels.h"
#include "mha.h"

struct mha_engine {
    mha_isa isa;      /* the table picked: never MHA_ISA_AUTO */
    int num_threads;  /* 0: OpenMP's default at call time */
    mk_table kernels; /* filled by the ISA's initialiser */
    int flush;        /* mha_config.flush_subnormals, as 0 or 1 */
};

/* errors.c: records a formatted message for this thread, returns status. */
mha_status mha_fail(mha_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* cpu.c: uncached CPU detection (isa.c caches it). avx512 means
 * AVX-512F/BW/VL/DQ with the opmask and ZMM state enabled, and AVX2+FMA. */
int mha_cpu_detect_avx2_fma(void);
int mha_cpu_detect_avx512(void);
int mha_cpu_detect_avx512_bf16(void);
int mha_cpu_detect_amx_bf16(void);
int mha_cpu_detect_neon(void);
int mha_cpu_detect_neon_bf16(void);
int mha_cpu_detect_neon_fhm(void);
/* cpu.c: whether the CPU is Intel's (CPUID's vendor string). */
int mha_cpu_is_intel(void);
/* cpu.c: the L1 data cache's size in bytes (cached; 32 KiB if unknown). */
int64_t mha_cpu_l1d_bytes(void);
/* cpu.c: the L1 data cache's ways, and the bytes of one way (8 and 4096
 * if unknown); cached. */
int mha_cpu_l1d_ways(int64_t *way_bytes);
/* cpu.c: whether rows `stride` bytes apart, `strip` of them read together
 * at every step of a tile's depth loop, crowd this CPU's L1 sets (then
 * they are copied together first). */
int mha_rows_crowd(int64_t stride, int64_t strip);

/* fpenv.c: the floating-point environment of a call (docs/design.md,
 * "The floating-point environment"). mha_fpenv_enter sets round to
 * nearest, every exception masked and subnormals kept (flush 0) or
 * flushed, on the calling thread, and returns what it replaced;
 * mha_fpenv_leave restores that. MHA_FPENV_SCOPE does both for the
 * enclosing block: each public entry point that computes, and each thread
 * of a parallel region, opens one. mha_fpenv_can_flush: whether this CPU
 * flushes (x86's DAZ; AArch64). */
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
typedef struct {
    uint64_t state; /* MXCSR, or FPCR */
    uint64_t flags; /* FPSR (AArch64) */
} mha_fpenv;
#else
#include <fenv.h>
typedef struct {
    fenv_t env;
} mha_fpenv;
#endif
mha_fpenv mha_fpenv_enter(int flush);
void mha_fpenv_leave(const mha_fpenv *saved);
int mha_fpenv_can_flush(void);
#define MHA_FPENV_SCOPE(flush)                                        \
    mha_fpenv mha_fpenv_scope_                                          \
        __attribute__((cleanup(mha_fpenv_leave), unused)) =              \
            mha_fpenv_enter(flush)

/* isa.c: the filled table of an ISA, or an error status (with message)
 * when the build or the CPU lacks it. isa may be MHA_ISA_AUTO. Tests and
 * the benchmark reach tables through it. */
mha_status mha_dispatch(mha_isa isa, mha_isa *picked, mk_table *table);

/* engine.c: threads for a call of `items` work items: the engine's count,
 * or OpenMP's default clamped to MHA_MAX_THREADS, at most items, >= 1. */
int mha_threads_for_call(const mha_engine *engine, int64_t items);

/* alloc.c: every allocation of the engine goes through these, so tests can
 * make the n-th one fail. Memory is 64-byte aligned. */
void *mha_alloc(size_t bytes);
void mha_free(void *p);
/* Blocks from here on are above glibc's largest mmap threshold: each is
 * mmapped fresh and its pages faulted in on every call (alloc.c puts them
 * on huge pages where it can; a layer keeps one for its next call). */
#define MHA_ALLOC_HUGE_BYTES ((size_t)32 << 20)

/* dtype.c: the traits of a dtype; NULL for a value outside the enum. */
typedef struct {
    const char *name;
    size_t size;
    int kv_ok;      /* may store keys and values */
    int compute_ok; /* may be q and out */
    int needs_scale; /* quantised: tensors carry mha_scales */
    float qmax;      /* quantised: the largest finite code's value */
} mha_dtype_traits;
const mha_dtype_traits *mha_dtype_traits_of(mha_dtype dtype);
/* The table's narrow kernel of a half compute dtype (NULL for fp32, a
 * NULL table or a table without one). */
mk_narrow_fn *mha_narrow_kernel(const mk_table *t, mha_dtype dtype);
/* Rows of fp32 (x, row stride ldx) rounded to nearest even into fp16 or
 * bf16 rows (y, stride ldy elements): a half compute dtype's output, by
 * the table's narrow kernel where it has one (the same bits). */
void mha_narrow_rows(const mk_table *t, mha_dtype dtype, const float *x,
                     ptrdiff_t ldx, int64_t rows, int64_t n, void *y,
                     ptrdiff_t ldy);

/* The validated problem of one attention call, shared with the layer. */
typedef struct mha_problem {
    const void *q;     /* of compute */
    const void *k, *v; /* of k_dtype, v_dtype */
    mha_dtype k_dtype, v_dtype;
    mha_dtype compute; /* q and out: fp32, fp16 or bf16 (docs/design.md,
                          "Compute dtype") */
    mha_scales k_scales, v_scales; /* quantised K/V; else zero */
    void *out;         /* of compute */
    int64_t batch, lq, lk, heads, kv_heads, d, dv;
    int64_t q_sb, q_ss, q_sh; /* element strides: batch, seq, head */
    int64_t k_sb, k_ss, k_sh;
    int64_t v_sb, v_ss, v_sh;
    int64_t o_sb, o_ss, o_sh;
    mha_mask mask; /* zeroed when the caller gave none */
    mha_score_terms terms; /* zeroed when the caller gave none */
    float scale;
    float *weights;
    float *lse; /* [B, H, Lq] packed, or NULL */
    /* The engine reads out and weights right after the call (the layer's
     * output projection and head average): no non-temporal stores to them
     * (mha_streams_out). */
    int out_read_next;
    /* The sequences of a continuous batch (mha_attention_varlen;
     * docs/design.md, "Continuous batches"). All NULL: a dense batch,
     * sequence b at b times the batch strides with lq queries and lk keys.
     * Otherwise lq and lk are the longest sequence's. */
    const int32_t *cu_q;        /* [B+1] packed query rows, or NULL */
    const int32_t *cu_k;        /* [B+1] packed key rows, or NULL */
    const int32_t *block_table; /* paged keys: [B, bt_stride], or NULL */
    int64_t bt_stride;
    int64_t page_size;          /* paged keys: keys per block */
    const int32_t *seqlens_k;   /* paged keys: [B] */
    int64_t total_q;            /* with cu_q: rows of q (the lse layout) */
} mha_problem;

/* validate.c ---------------------------------------------------------- */

/* A byte range [lo, hi) a buffer may touch. */
typedef struct {
    uintptr_t lo, hi;
} mha_span;

static inline int mha_spans_overlap(mha_span a, mha_span b)
{
    return a.lo < b.hi && b.lo < a.hi;
}

/* Returns MHA_ERR_BAD_SHAPE, naming both, when two views' sizes differ
 * (a->fa and b->fb; a and b are the views' field names). */
#define MHA_SAME(a, fa, b, fb)                                              \
    if ((a)->fa != (b)->fb)                                                 \
        return mha_fail(MHA_ERR_BAD_SHAPE, #a "." #fa " (%lld) differs from " \
                        #b "." #fb " (%lld)", (long long)(a)->fa,            \
                        (long long)(b)->fb);

/* Overflow-checked arithmetic: return 0 on overflow. */
int mha_mul_ok(int64_t a, int64_t b, int64_t *r);
int mha_add_ok(int64_t a, int64_t b, int64_t *r);

/* The caller's buffers of one call, as views (docs/design.md,
 * "Validation"): inputs, the output, the optional weights [batch, heads,
 * lq, lk] and the optional mask of that shape. Every check that does not
 * depend on what the call computes: pointers, shapes, strides, dtypes,
 * byte extents, overlaps, the weights and the mask. */
typedef struct {
    int n_in;
    const mha_tensor *in[3];
    const char *in_name[3];
    const mha_tensor *out;
    const char *out_name;
    float *weights;
    const mha_mask *mask;
    int64_t batch, heads, lq, lk; /* of the weights and the mask */
    const mha_score_terms *terms; /* or NULL */
    float *lse;                   /* [batch, heads, lq], or NULL */
    /* Nonzero: the weights and lse hold these many floats (a continuous
     * batch's packed forms) instead of the dense shapes'. */
    int packed_outputs;
    int64_t weights_floats, lse_floats;
    /* Nonzero: the K/V inputs' scale values are not read here (a paged
     * pool's unused blocks may hold anything); the caller checks the
     * scales the call reads. */
    int kv_scales_used_only;
} mha_views;

/* Per-tensor checks of every view (dtype against its role: inputs past
 * the first may hold a K/V storage dtype). */
mha_status mha_check_views(const mha_views *views);
/* Overlaps, weights, lse, mask and score terms; *mask and *terms become
 * the caller's (or zeros). */
mha_status mha_check_outputs(const mha_views *views, mha_mask *mask,
                             mha_score_terms *terms);
/* One view's checks (mha_quantize, the layer, the merge): pointer, dtype
 * against its role (kv: a K/V storage dtype is allowed), shape, strides,
 * extent (into *range), and the scales of a quantised dtype (their values
 * too when scale_values). */
mha_status mha_check_tensor(const mha_tensor *t, const char *name, int kv,
                            int scale_values, mha_span *range);
/* Distinct indices of a validated tensor reach distinct elements. */
int mha_non_self_overlapping(const mha_tensor *t);
/* The byte range of a validated quantised tensor's scales. */
mha_span mha_scales_span(const mha_tensor *t);
/* Whether the scales x[i0 * st[0] + i1 * st[1] + i2 * st[2]], ik < n[k],
 * are all finite and nonzero (a vectorised scan; the caller finds a bad
 * one again for its message). Strides >= 0, extent already checked. */
int mha_scales_ok(const float *x, const int64_t n[3], const int64_t st[3]);

/* mha_attention's validation: the views, the shape rules of attention,
 * the scale; fills *problem. */
mha_status mha_validate_attention(const mha_attention_args *args,
                                  mha_problem *problem);
/* The problem of validated views (q, k, v, out) with a validated mask. */
void mha_problem_init(mha_problem *p, const mha_tensor *q,
                      const mha_tensor *k, const mha_tensor *v,
                      const mha_tensor *out, const mha_mask *mask,
                      float scale, float *weights);

/* merge.c: one pairwise step of the ordered merge (docs/design.md,
 * "Merging partial results"), shared by the split-KV merge and
 * mha_merge_states: the state (o[dv], *m, *l) absorbs the part (a[dv],
 * ma, la), o scaled by exp(*m - M) and a by exp(ma - M), M = max(*m, ma)
 * (NaN sticks). A part with ma = -inf adds nothing; an empty state takes
 * the part as it is. a may equal o only when the state is empty. */
void mha_merge_step(float *o, float *m, float *l, const float *a, float ma,
                    float la, int64_t dv);
/* A merged row's log-sum-exp: m + log(l); -inf when l is 0. */
float mha_merge_lse(float m, float l);

/* attention.c --------------------------------------------------------- */

/* The plan of one call (plan.c), computed once: its work items and its
 * scratch layout. */
typedef struct mha_plan mha_plan;

/* Runs a validated problem: plans it, allocates its scratch, runs it on
 * the engine's threads. The only failures are overflow and out of
 * memory, reported before anything is written. */
mha_status mha_attention_solve(const mha_engine *engine,
                               const mha_problem *p);
/* The solve's checks alone (the plan's sizes), nothing run: the *_check
 * functions. */
mha_status mha_attention_plan_check(const mha_engine *engine,
                                    const mha_problem *problem);

#endif
