/*
 * The C side of the benchmark: everything that touches libmha, OpenBLAS or
 * OpenMP. The C++ driver registers Google Benchmark cases that call only
 * these functions, so the library is measured exactly as a C user calls it.
 */
#ifndef MHA_BENCH_SHIM_H
#define MHA_BENCH_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "mha.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a case calls once per iteration. */
typedef enum bench_impl {
    BENCH_IMPL_ATTENTION = 0, /* mha_attention */
    BENCH_IMPL_LAYER = 1,     /* mha_layer_forward, self-attention, E = H*d */
    BENCH_IMPL_BLAS = 2,      /* OpenBLAS sgemm + row softmax + sgemm */
    /* mha_attention_varlen over a paged cache: blocks of paged_block keys,
     * each sequence's blocks shuffled in the pool, q [B, Lq, H, d] */
    BENCH_IMPL_PAGED = 3,
    /* A continuous batch of BENCH_VARLEN_SEQS causal prompts of the
     * lengths bench_varlen_length gives (lq = lk = that length), packed:
     * one mha_attention_varlen call, or one mha_attention per prompt */
    BENCH_IMPL_VARLEN = 4,
    BENCH_IMPL_VARLEN_SEQ = 5
} bench_impl;

/* The continuous batch of the varlen cases: eight prompts from 64 to 2048
 * tokens. */
#define BENCH_VARLEN_SEQS 8
int64_t bench_varlen_length(int i);

/* How q, k, v and out are stored (the layer always uses [B, L, E]). */
typedef enum bench_layout {
    BENCH_LAYOUT_BSHD = 0, /* [B, S, H, D], PyTorch batch_first */
    BENCH_LAYOUT_BHSD = 1  /* [B, H, S, D] */
} bench_layout;

typedef struct bench_spec {
    bench_impl impl;
    int64_t batch, heads, kv_heads, lq, lk, d;
    mha_causal causal;
    int64_t window_left; /* > 0: a sliding window of that many keys to the
                            left (right side unbounded; with causal) */
    int alibi; /* nonzero: ALiBi with the slopes 2^(-8 (h + 1) / H) of
                  BLOOM and MPT, one row for every batch (attention only) */
    float softcap; /* > 0: scores capped at softcap * tanh(s / softcap)
                      (attention only) */
    bench_layout layout;
    mha_dtype kv_dtype; /* K and V elements; not MHA_F32 only for attention */
    mha_dtype compute;  /* q and out: MHA_F32 (0), or MHA_F16 / MHA_BF16
                           for attention (the kinds attention_bf16/ ...) */
    int64_t paged_block; /* BENCH_IMPL_PAGED: keys per block */
    mha_isa isa; /* ignored by BENCH_IMPL_BLAS */
    int threads; /* exact thread count, > 0 */
} bench_spec;

typedef struct bench_case bench_case;

/* Allocates and fills the inputs, creates the engine (and layer) for the
 * spec. NULL on failure, with the reason in bench_error(). */
bench_case *bench_case_create(const bench_spec *spec);
/* One call of the measured function; 0 on success, else the reason is in
 * bench_error(). */
int bench_case_run(bench_case *c);
void bench_case_destroy(bench_case *c); /* NULL is a no-op */
/* The output of the last run and its element count (fp32 compute). */
const float *bench_case_output(const bench_case *c, size_t *count);

/* Floating-point operations of one call: 4*B*H*Lq*Lk*d for attention (the
 * dense count, also under a causal mask), plus 2*B*E*E*(2*Lq + 2*Lk) for the
 * layer's q, k, v and output projections; the varlen cases count 4*H*L*L*d
 * per prompt (dense-equivalent, as causal). */
double bench_spec_flops(const bench_spec *spec);
/* Bytes of K and V one call reads: 2 * B * Lk * Hkv * d * element size. */
double bench_spec_kv_bytes(const bench_spec *spec);

/* Nonzero when this build and CPU can run an engine of that ISA. */
int bench_isa_supported(mha_isa isa);
/* Nonzero when the BLAS baseline was compiled in. */
int bench_have_blas(void);

/* Runs `iterations` steps of independent multiply-add chains of the ISA's
 * widest float vectors on `threads` OpenMP threads. Returns the floating
 * point operations done, or -1 when the ISA's microkernel is not built.
 * generic: 128-bit multiply then add (the baseline ISA has no FMA);
 * avx2: 256-bit FMA; neon: 128-bit FMA. */
double bench_fma_peak_run(mha_isa isa, int threads, int64_t iterations);

/* Allocates and first-touches (on `threads` threads) the 1 GiB buffer of
 * bench_membw_run, once: later calls return 0 at once. -1 when it cannot be
 * allocated, the reason in bench_error(). */
int bench_membw_prepare(int threads);
/* One pass of a summing loop over that buffer (larger than the last-level
 * cache), split statically across `threads` OpenMP threads: the machine's
 * read bandwidth. Prepares the buffer first if needed. Returns the bytes
 * read, or -1 when the buffer cannot be allocated. */
double bench_membw_run(int threads);

/* Checks the BLAS baseline against mha_attention on small shapes (GQA,
 * causal, decode, both layouts): 0 when they agree, else the first
 * disagreement is in bench_error(). Trivially 0 without BLAS. */
int bench_self_check(void);

/* The message of the last failure in this file, "" if none. */
const char *bench_error(void);

/* Processors this process may run on (respects affinity masks). */
int bench_core_count(void);

/* "Model name" of the CPU, "unknown" if it cannot be read. */
const char *bench_cpu_model(void);

#ifdef __cplusplus
}
#endif

#endif
