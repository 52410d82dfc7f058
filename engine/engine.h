/* Engine internals shared by the files of engine/. Not installed. */
#ifndef MHA_ENGINE_H
#define MHA_ENGINE_H

#include "kernels.h"
#include "mha.h"

struct mha_engine {
    mha_isa isa;      /* the table picked: never MHA_ISA_AUTO */
    int num_threads;  /* 0: OpenMP's default at call time */
    mk_table kernels; /* generic slots overridden by the ISA's */
};

/* Records a formatted message for this thread and returns status. */
mha_status mha_fail(mha_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* CPU detection (cpu.c, compiled without ISA flags; cached). */
int mha_cpu_has_avx2_fma(void);
int mha_cpu_has_neon(void);
/* AVX-512F/BW/VL/DQ with the opmask and ZMM state enabled, and AVX2+FMA. */
int mha_cpu_has_avx512(void);

/* dispatch.c: the table for an ISA, or an error status (with message) when
 * the build or the CPU lacks it. isa may be MHA_ISA_AUTO. */
mha_status mha_dispatch(mha_isa isa, mha_isa *picked, mk_table *table);

/* Thread count for a call: the engine's, or OpenMP's default. */
int mha_threads_for_call(const mha_engine *engine);

/* alloc.c: every allocation of the engine goes through these, so tests can
 * make the n-th one fail. Memory is 64-byte aligned. */
void *mha_alloc(size_t bytes);
void mha_free(void *p);

/* Test hook: the next n allocations succeed, the one after fails (once);
 * n < 0 disarms. Returns the number of allocations made since the last
 * call. Process-wide; tests only. */
MHA_API long mha_test_fail_alloc_after(long n);

/* attention.c: the validated problem, shared with the layer. */
typedef struct mha_problem {
    const float *q;
    const void *k, *v; /* of k_dtype, v_dtype */
    mha_dtype k_dtype, v_dtype;
    float *out;
    int64_t batch, lq, lk, heads, kv_heads, d, dv;
    int64_t q_sb, q_ss, q_sh; /* element strides: batch, seq, head */
    int64_t k_sb, k_ss, k_sh;
    int64_t v_sb, v_ss, v_sh;
    int64_t o_sb, o_ss, o_sh;
    mha_mask mask; /* zeroed when the caller gave none */
    float scale;
    float *weights;
} mha_problem;

/* validate.c */
mha_status mha_validate_attention(const mha_attention_args *args,
                                  mha_problem *problem);
mha_status mha_validate_mask(const mha_mask *mask, int64_t batch,
                             int64_t heads, int64_t lq, int64_t lk,
                             mha_mask *copy);
/* Bytes of one element of dtype; 0 for an unknown dtype. */
size_t mha_dtype_size(mha_dtype dtype);
/* A byte range [lo, hi) a buffer may touch. */
typedef struct {
    uintptr_t lo, hi;
} mha_span;

static inline int mha_spans_overlap(mha_span a, mha_span b)
{
    return a.lo < b.hi && b.lo < a.hi;
}

/* The weights output: bytes at weights (already overflow-checked) must fit
 * the address space and miss the n inputs (named) and out. Sets *span. */
mha_status mha_check_weights(const float *weights, int64_t bytes,
                             mha_span out, const mha_span *inputs,
                             const char *const *names, int n,
                             mha_span *span);

/* MHA_ERR_BAD_MASK if an array of a validated mask shares a byte with
 * [output, output + bytes), the buffer called name. */
mha_status mha_check_mask_disjoint(const mha_mask *mask, int64_t batch,
                                   int64_t heads, int64_t lq, int64_t lk,
                                   const void *output, size_t bytes,
                                   const char *name);
/* Overflow-checked arithmetic: return 0 on overflow. */
int mha_mul_ok(int64_t a, int64_t b, int64_t *r);
int mha_add_ok(int64_t a, int64_t b, int64_t *r);

/* attention.c: scratch bytes for a validated problem run on nthreads
 * (MHA_ERR_OVERFLOW if they do not fit), and the run itself (cannot fail). */
mha_status mha_attention_scratch_bytes(const mk_table *t,
                                       const mha_problem *p, int nthreads,
                                       size_t *bytes);
void mha_attention_run(const mk_table *t, const mha_problem *p, void *scratch,
                       int nthreads);

#endif
