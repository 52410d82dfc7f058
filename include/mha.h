/*
 * libmha — multi-head attention on CPUs.
 *
 * The public contract. C11; usable from C++.
 *
 * Semantics shared by every entry point:
 *   - For batch b and head h, with scale s (MHA_SCALE_DEFAULT, 0, selects
 *     1/sqrt(d) unless scale_explicit is set):
 *       S = s * Q_bh K_bh^T (+ score terms) (+ additive mask)
 *       (masked entries -> -inf)
 *       P = softmax_rows(S),  O_bh = P V_bh
 *   - Boolean masks: nonzero = attend, zero = masked. Additive masks add to
 *     the scaled scores; -INFINITY masks. Key lengths mask keys at or past the
 *     length of their batch. Causal masking is a flag: top-left (query i sees
 *     keys j <= i) or bottom-right (query i sees keys j <= i + Lk - Lq, the
 *     alignment a KV cache needs). All mask kinds combine.
 *   - A query row whose keys are all masked yields an output row of zeros and
 *     a weights row of zeros: never NaN, never the mean of V.
 *   - Grouped-query attention: H query heads share Hkv key/value heads
 *     (H % Hkv == 0); query head h reads kv head h / (H / Hkv). No copies.
 *   - Working memory grows with the sequence lengths, never with Lq * Lk
 *     (the optional weights output is the caller's buffer).
 *   - Results are bitwise identical for every thread count, for repeated
 *     calls and across engines that use the same ISA.
 *   - Every function validates all of its inputs before it writes anything:
 *     on error it returns a status, records a message for the calling
 *     thread (mha_last_error) and leaves every output byte untouched.
 *   - Thread safety: an engine and a layer are immutable after creation and
 *     may be used by any number of caller threads at once. Destroy them only
 *     when no call is in flight.
 *   - NaN policy: a NaN or +inf anywhere in q, k, v or an additive mask
 *     propagates to the outputs it reaches; it is never reported as an error.
 */
#ifndef MHA_H
#define MHA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define MHA_API
#else
#define MHA_API __attribute__((visibility("default")))
#endif

#define MHA_VERSION_MAJOR 0
#define MHA_VERSION_MINOR 1
#define MHA_VERSION_PATCH 0

/* "0.1.0" */
MHA_API const char *mha_version(void);

typedef enum mha_status {
    MHA_OK = 0,
    MHA_ERR_NULL_POINTER = 1,  /* a required pointer is NULL */
    MHA_ERR_BAD_SHAPE = 2,     /* sizes non-positive or inconsistent */
    MHA_ERR_BAD_STRIDE = 3,    /* negative strides, overlapping output */
    MHA_ERR_BAD_MASK = 4,      /* mask strides, key lengths, causal mode */
    MHA_ERR_OVERFLOW = 5,      /* an element or byte count overflows */
    MHA_ERR_OUT_OF_MEMORY = 6, /* an allocation failed */
    MHA_ERR_UNSUPPORTED = 7,   /* ISA or dtype not available here */
    MHA_ERR_BAD_ARGUMENT = 8   /* other values: scale, enums, threads */
} mha_status;

/* Static name of a status, e.g. "bad shape". Never NULL. */
MHA_API const char *mha_status_string(mha_status status);

/* The message of the last failed call on this thread, e.g.
 * "k.heads (3) does not divide q.heads (8)"; "" if none has failed yet.
 * Valid until the next libmha call on the same thread. */
MHA_API const char *mha_last_error(void);

/* ------------------------------------------------------------------ */
/* Engine                                                              */

/* Values are stable; mha_isas() lists every ISA this build knows. */
typedef enum mha_isa {
    MHA_ISA_AUTO = 0, /* best available; the MHA_ISA variable (a name of
                         mha_isa_name) overrides */
    MHA_ISA_GENERIC = 1,
    MHA_ISA_AVX2 = 2, /* x86-64 AVX2 + FMA */
    MHA_ISA_NEON = 3, /* AArch64 Advanced SIMD */
    MHA_ISA_AVX512 = 4, /* x86-64 AVX-512F/BW/VL/DQ + FMA */
    MHA_ISA_AVX512_BF16 = 5, /* avx512 + AVX512-BF16 and VBMI: bf16 compute
                                on VDPBF16PS (docs/design.md) */
    MHA_ISA_NEON_BF16 = 6, /* neonfhm + FEAT_BF16: bf16 compute on BFDOT */
    MHA_ISA_NEON_FHM = 7, /* neon + FEAT_FHM: f16 compute on FMLAL */
    MHA_ISA_AMX_BF16 = 8 /* avx512bf16 + AMX-TILE and AMX-BF16: bf16
                            compute on tiles (docs/design.md) */
} mha_isa;

/* The most threads one call uses. A config asking for more is refused
 * (MHA_ERR_BAD_ARGUMENT); OpenMP's default (OMP_NUM_THREADS) is clamped to
 * it. A call never runs more threads than it has work items. */
#define MHA_MAX_THREADS 1024

/* Zero-initialised (or a NULL pointer) means defaults. */
typedef struct mha_config {
    int num_threads; /* 0: OpenMP's default (at most MHA_MAX_THREADS);
                        1..MHA_MAX_THREADS: exactly that many at most */
    mha_isa isa;     /* MHA_ISA_AUTO: detect (or the MHA_ISA variable) */
    /* 0: subnormal floats computed as IEEE has them (x86 takes a microcode
     * assist on each, up to 80x slower when most inputs are subnormal);
     * nonzero: subnormal inputs and results read as 0 (x86's DAZ and FTZ,
     * AArch64's FPCR.FZ), MHA_ERR_UNSUPPORTED where the CPU cannot.
     * Arguments are checked in IEEE either way: a call is accepted or
     * refused alike, and a subnormal scale is a scale (its products then
     * read as 0), not the default. */
    int flush_subnormals;
} mha_config;

/* Every call that computes (attention, the layer, mha_merge_states,
 * mha_quantize) does so on each of its threads in round to nearest with
 * every floating-point exception masked and subnormals as the engine's
 * flush_subnormals says (IEEE without an engine), whatever the calling
 * thread's environment: fesetround, feenableexcept and FTZ/DAZ there
 * change no result and raise no signal. The caller's environment, its
 * flags included, is back when the call returns. */

typedef struct mha_engine mha_engine;

/* An ISA the CPU or the build lacks gives MHA_ERR_UNSUPPORTED. */
MHA_API mha_status mha_engine_create(const mha_config *config, mha_engine **engine);
MHA_API void mha_engine_destroy(mha_engine *engine); /* NULL is a no-op */
MHA_API mha_isa mha_engine_isa(const mha_engine *engine);
MHA_API int mha_engine_num_threads(const mha_engine *engine);
/* "generic", "avx2", "avx512", "avx512bf16", "amxbf16", "neon",
 * "neonbf16", "neonfhm", "auto"; "unknown" for other values. */
MHA_API const char *mha_isa_name(mha_isa isa);
/* Every ISA this version of libmha knows (never MHA_ISA_AUTO), best first:
 * the order MHA_ISA_AUTO tries them in. Sets *count (when not NULL) to the
 * number of entries; the array is static. Includes ISAs the build or the
 * CPU lacks: ask mha_isa_available. */
MHA_API const mha_isa *mha_isas(size_t *count);
/* MHA_OK and *isa for a name of mha_isa_name ("auto" included); else
 * MHA_ERR_BAD_ARGUMENT with a message naming the known names. */
MHA_API mha_status mha_isa_from_name(const char *name, mha_isa *isa);
/* 1 when this build has the ISA's kernels and this CPU runs them (an engine
 * created with it succeeds); 0 otherwise, and for MHA_ISA_AUTO. */
MHA_API int mha_isa_available(mha_isa isa);

/* ------------------------------------------------------------------ */
/* Tensors                                                             */

/* Element types. q and out share a compute dtype: MHA_F32, MHA_F16 or
 * MHA_BF16 (a half one is widened a row block at a time and the output
 * rounded to nearest even once: the fp32 result, rounded). k and v may be
 * stored in half precision or quantised to 8 bits (each independently):
 * converted to fp32 in registers. Scores, softmax and accumulation are
 * fp32 in every combination. Other combinations (q and out differing, a
 * quantised q) give MHA_ERR_UNSUPPORTED. A quantised element's value is its code times the
 * scale of its (batch, seq, head) row (mha_scales, required). */
typedef enum mha_dtype {
    MHA_F32 = 0,
    MHA_F16 = 1,      /* IEEE binary16, as uint16_t */
    MHA_BF16 = 2,     /* bfloat16, as uint16_t */
    MHA_I8 = 3,       /* symmetric int8 code (int8_t), scaled */
    MHA_FP8_E4M3 = 4, /* OCP 8-bit E4M3 (uint8_t): max 448, S.1111.111 is
                         NaN, no infinities; scaled */
    MHA_FP8_E5M2 = 5  /* OCP 8-bit E5M2 (uint8_t): max 57344, infinities
                         and NaN as binary16's high byte; scaled */
} mha_dtype;

/* Bytes of one element: 4, 2, 2, 1, 1, 1; 0 for a value that is not an
 * mha_dtype. */
MHA_API size_t mha_dtype_size(mha_dtype dtype);
/* "f32", "f16", "bf16", "i8", "fp8_e4m3", "fp8_e5m2"; "unknown" for other
 * values. */
MHA_API const char *mha_dtype_name(mha_dtype dtype);

/* Conversions between fp32 and the half-precision storage types, n
 * elements. Narrowing rounds to nearest, ties to even; values past the
 * range become infinities; NaN stays NaN (quiet, sign kept). Widening is
 * exact. x and y must not overlap. */
MHA_API void mha_f32_to_f16(const float *x, size_t n, uint16_t *y);
MHA_API void mha_f32_to_bf16(const float *x, size_t n, uint16_t *y);
MHA_API void mha_f16_to_f32(const uint16_t *x, size_t n, float *y);
MHA_API void mha_bf16_to_f32(const uint16_t *x, size_t n, float *y);

/* Per-row or per-tensor scales of a quantised tensor: element (b, s, h) of
 * a logical [batch, seq, heads] array of floats at data + b*stride_batch +
 * s*stride_seq + h*stride_head (0 broadcasts: one scale per tensor is all
 * strides 0, one per head stride_batch = stride_seq = 0). Required by the
 * quantised dtypes (NULL: MHA_ERR_NULL_POINTER); each scale must be finite
 * and nonzero (MHA_ERR_BAD_ARGUMENT), strides non-negative
 * (MHA_ERR_BAD_STRIDE). The float dtypes take none: data must be NULL
 * (MHA_ERR_UNSUPPORTED otherwise). */
typedef struct mha_scales {
    const float *data;
    int64_t stride_batch, stride_seq, stride_head;
} mha_scales;

/* A logical [batch, seq, heads, dim] array of dtype elements (MHA_F32
 * unless set otherwise). Strides count elements; the
 * dim axis is contiguous. Any non-negative strides are accepted for inputs
 * (0 broadcasts); the output must not overlap any input. */
typedef struct mha_tensor {
    void *data;
    int64_t batch, seq, heads, dim;
    int64_t stride_batch, stride_seq, stride_head;
    mha_dtype dtype;
    mha_scales scales; /* quantised dtypes only; zero: none */
} mha_tensor;

/* Quantises src (MHA_F32) into dst (MHA_I8, MHA_FP8_E4M3 or MHA_FP8_E5M2,
 * the same shape; dst->data is written, dst must not overlap src). With
 * scales_out NULL the scales are the caller's, dst->scales (validated as
 * for mha_attention). Otherwise they are computed and written to
 * scales_out at dst->scales' strides (dst->scales.data must be NULL or
 * scales_out, and scales_out must not overlap src or dst): each scale is
 * absmax / 127, / 448 or / 57344 over the finite elements of the rows that
 * share it (a stride of 0 shares it: all strides 0 is one scale for the
 * tensor), raised to FLT_MIN when smaller; rows with no nonzero finite
 * element (all zeros, or only NaN and infinities) get 1, never 0. Then
 * each element x becomes the code nearest x / scale
 * (computed in double), ties to even, saturated to the largest finite code
 * (+-127, +-448, +-57344). NaN becomes 0 (int8, which has no NaN) or NaN
 * (fp8, sign kept); +-infinity saturates to +-127 and +-448 and stays
 * +-infinity in E5M2, which has one. Like every function, validates
 * everything before writing anything. A paged cache: mha_quantize_paged. */
MHA_API mha_status mha_quantize(const mha_tensor *src, const mha_tensor *dst,
                                float *scales_out);

/* Writes tokens into a quantised paged cache (mha_paged_kv) by slot, as
 * vLLM's slot_mapping does: src (MHA_F32) holds n = src->batch * src->seq
 * tokens, token t at (t / seq, t % seq), each of src->heads rows of
 * src->dim; pool views the pool [num_blocks, block_size, Hkv, d] (batch =
 * num_blocks, seq = block_size, any strides, heads and dim those of src;
 * MHA_I8, MHA_FP8_E4M3 or MHA_FP8_E5M2). Token t goes to slot slots[t]:
 * block slots[t] / block_size, position slots[t] % block_size; a negative
 * slot skips the token (a padding token), a slot past num_blocks *
 * block_size is MHA_ERR_BAD_ARGUMENT. Each token's rows are quantised
 * exactly as mha_quantize quantises a [1, 1, heads, dim] tensor. With
 * scales_out NULL the scales are the caller's (pool->scales): only those
 * of the written slots are read and must be finite and nonzero, so unused
 * blocks may hold anything. Otherwise each written slot's scales are
 * computed (per row, or per token when pool->scales.stride_head is 0) and
 * written to scales_out at pool->scales' strides, which must give distinct
 * slots distinct scales (MHA_ERR_BAD_STRIDE). Nothing outside the written
 * slots (and their scales) changes. Tokens are written in order, so of two
 * tokens with one slot the later one stays. slots must not overlap the
 * pool or its scales. Validates everything, every slot included, before
 * writing anything. */
MHA_API mha_status mha_quantize_paged(const mha_tensor *src,
                                      const mha_tensor *pool,
                                      const int64_t *slots,
                                      float *scales_out);

/* Packed [B, S, H, D] (PyTorch batch_first, heads split from E). */
MHA_API mha_tensor mha_tensor_bshd(void *data, int64_t batch, int64_t seq,
                           int64_t heads, int64_t dim);
/* Packed [B, H, S, D]. */
MHA_API mha_tensor mha_tensor_bhsd(void *data, int64_t batch, int64_t seq,
                           int64_t heads, int64_t dim);
/* The same views of an element type in one step (a half-precision view
 * built without it reads its bytes as fp32). data may be const: libmha
 * never writes through a view it reads (q, k, v); only out is written. */
MHA_API mha_tensor mha_tensor_bshd_typed(const void *data, mha_dtype dtype,
                                 int64_t batch, int64_t seq, int64_t heads,
                                 int64_t dim);
MHA_API mha_tensor mha_tensor_bhsd_typed(const void *data, mha_dtype dtype,
                                 int64_t batch, int64_t seq, int64_t heads,
                                 int64_t dim);

/* ------------------------------------------------------------------ */
/* Masks                                                               */

typedef enum mha_causal {
    MHA_CAUSAL_NONE = 0,
    MHA_CAUSAL_TOP_LEFT = 1,    /* query i sees keys j <= i */
    MHA_CAUSAL_BOTTOM_RIGHT = 2 /* query i sees keys j <= i + Lk - Lq */
} mha_causal;

/* Every field is optional; a zero-initialised mask masks nothing.
 * keep and bias are logical [B, H, Lq, Lk] arrays: element (b, h, i, j)
 * sits at b*stride_batch + h*stride_head + i*stride_query + j. A stride of 0
 * broadcasts that axis ([B,1,1,Lk] padding masks, [1,1,Lq,Lk] look-ahead
 * masks). Strides must be non-negative. */
typedef struct mha_mask {
    mha_causal causal;
    const uint8_t *keep; /* nonzero = attend, 0 = masked */
    int64_t keep_stride_batch, keep_stride_head, keep_stride_query;
    const float *bias; /* added to the scaled scores; -INFINITY masks */
    int64_t bias_stride_batch, bias_stride_head, bias_stride_query;
    const int32_t *key_lengths; /* [B]: keys j >= key_lengths[b] masked;
                                   each in [0, Lk] */
    /* A key padding mask of its own, [B, Lk] (element (b, j) at
     * b*key_keep_stride_batch + j; stride 0 broadcasts), combined with
     * keep and bias without merging them by hand. nonzero = attend, as
     * keep: PyTorch's bool key_padding_mask (True = ignore) is its
     * negation. */
    const uint8_t *key_keep;
    int64_t key_keep_stride_batch;
} mha_mask;

/* ------------------------------------------------------------------ */
/* Score terms: sliding window, softcap, ALiBi, sinks                 */

/* The aligned query position i' of query i that windows and ALiBi
 * measure from: bottom-right i' = i + Lk - Lq (FlashAttention's choice,
 * what a KV cache needs; the default), or top-left i' = i. */
typedef enum mha_align {
    MHA_ALIGN_BOTTOM_RIGHT = 0,
    MHA_ALIGN_TOP_LEFT = 1
} mha_align;

/* Terms of the score beyond q.k, each off when zero-initialised, each
 * combinable with every mask and with the others. For query i (aligned
 * position i') and key j, with t = scale * q_i.k_j:
 *   x = softcap * tanh(t / softcap)      (softcap > 0; else x = t)
 *   x += -slope_bh * (i' - j)            (alibi_slopes set)
 *   x += mask.bias[b, h, i, j]           (mask.bias set)
 *   x = -inf where a mask or the window hides key j
 * The window (window != 0) shows key j to query i when
 *   i' - window_left <= j <= i' + window_right,
 * an extent of -1 leaving that side unbounded (FlashAttention's
 * window_size); key blocks outside it are never computed, so the cost grows
 * with Lq x window. A window of (0, 0) is the diagonal key alone.
 * sinks[h] is a logit of head h that joins every row's softmax denominator
 * and contributes no value (gpt-oss): P_j = exp(x_j) / (sum_k exp(x_k) +
 * exp(sink)). A row whose keys are all masked then yields zeros and its
 * log-sum-exp is the sink (a NaN or infinity in V at a masked key of a
 * computed key block reaches it through 0 x NaN, as for any row with a
 * sink: key blocks skipped by lengths, causal masks and windows are never
 * read); weights rows sum to less than 1 (the sink's
 * share is not a key's). Invalid values (negative extents other than -1,
 * a softcap that is negative, not finite or subnormal (0 < softcap <
 * FLT_MIN), non-finite slopes or sinks,
 * a window flag or align outside its enum) are refused with a message
 * naming the field. */
typedef struct mha_score_terms {
    int window;                   /* 0: no window; 1: the extents apply */
    int64_t window_left;          /* keys before i'; -1: unbounded */
    int64_t window_right;         /* keys after i'; -1: unbounded */
    mha_align align;              /* i' for the window and ALiBi */
    float softcap;                /* 0: off; else normal and finite */
    const float *alibi_slopes;    /* [B, H] slopes (element (b, h) at
                                     b*alibi_stride_batch + h; stride 0:
                                     one [H] row for every batch) or NULL */
    int64_t alibi_stride_batch;
    const float *sinks;           /* [H] sink logits, or NULL */
    /* The call's keys as a shard of a longer sequence (sequence-parallel
     * attention, a cache split into parts): its key j is position
     * key_offset + j of a sequence of key_total keys (0: key_offset + Lk,
     * per sequence for mha_attention_varlen). The causal mask, the window
     * and ALiBi measure these positions, and bottom-right alignment is to
     * key_total: query i sits at i + key_total - Lq and sees key j when
     * key_offset + j <= i + key_total - Lq. Both 0: the keys are the whole
     * sequence. key_offset >= 0; key_total 0 or >= key_offset + Lk. */
    int64_t key_offset;
    int64_t key_total;
    /* The same per sequence (batch entry b of mha_attention, sequence b of
     * mha_attention_varlen): [B] arrays that replace key_offset and
     * key_total (which must then be 0) when set; an entry of key_totals 0
     * is that sequence's key_offsets[b] + lk_b. A continuous batch whose
     * caches are shards at different positions (mha_mpi.h) needs them. */
    const int64_t *key_offsets;
    const int64_t *key_totals;
} mha_score_terms;

/* ------------------------------------------------------------------ */
/* Scaled dot-product attention                                        */

/* scale == MHA_SCALE_DEFAULT (0) selects 1/sqrt(d); a caller who wants a
 * zero scale sets scale_explicit. */
#define MHA_SCALE_DEFAULT 0.0f

typedef struct mha_attention_args {
    mha_tensor q;   /* [B, Lq, H,   d ] */
    mha_tensor k;   /* [B, Lk, Hkv, d ] */
    mha_tensor v;   /* [B, Lk, Hkv, dv] */
    mha_tensor out; /* [B, Lq, H,   dv] written */
    const mha_mask *mask; /* NULL: no mask */
    float scale;          /* MHA_SCALE_DEFAULT (0): 1/sqrt(d) */
    float *weights; /* optional packed [B, H, Lq, Lk]: the probabilities;
                       must not overlap q, k, v or out (MHA_ERR_BAD_STRIDE) */
    const mha_score_terms *terms; /* NULL: none */
    float *lse;     /* optional packed [B, H, Lq] fp32: each row's natural
                       log-sum-exp of its final scores x (every term, the
                       sink included); -inf for a row whose keys are all
                       masked and that has no sink. Must not overlap any
                       other buffer. */
    int scale_explicit; /* nonzero: scale is used as given, 0 included */
} mha_attention_args;

MHA_API mha_status mha_attention(const mha_engine *engine,
                         const mha_attention_args *args);

/* Validates args exactly as mha_attention does (every field, every
 * overlap, the sizes of the work) and returns the status and message it
 * would, computing and writing nothing: a server can refuse a request
 * before it joins a batch, and mha_mpi.h agrees on validity across ranks
 * before any data moves. An MHA_OK here means mha_attention can fail only
 * for memory. mha_attention_varlen_check and mha_layer_check likewise. */
MHA_API mha_status mha_attention_check(const mha_engine *engine,
                                       const mha_attention_args *args);

/* ------------------------------------------------------------------ */
/* Continuous batches: variable-length sequences, paged K/V caches     */

/* A paged K/V cache (vLLM's block tables, FlashInfer's paged KV): the k
 * and v tensors of mha_varlen_args view the pool of blocks, batch =
 * num_blocks, seq = block_size, heads = Hkv: [num_blocks, block_size, Hkv,
 * d] from mha_tensor_bshd_typed, [num_blocks, Hkv, block_size, d] from
 * mha_tensor_bhsd_typed, any strides. Key j of sequence b is slot
 * j % block_size of block block_table[b * block_table_stride + j /
 * block_size]. Blocks of a sequence may sit anywhere in the pool in any
 * order, and sequences may share blocks (a common prefix): the pool is
 * only read, in place (never gathered into a contiguous copy). A quantised
 * pool's scales are per (block, slot, head): mha_scales over the pool's
 * [num_blocks, block_size, Hkv]. */
typedef struct mha_paged_kv {
    const int32_t *block_table; /* [B, max_blocks]; entries a sequence
                                   uses are in [0, num_blocks) */
    int64_t max_blocks;         /* entries per row, >= 1 */
    int64_t block_table_stride; /* elements between rows; 0: max_blocks */
    const int32_t *seqlens;     /* [B] keys of each sequence, each in
                                   [0, max_blocks * block_size]; only the
                                   first ceil(len / block_size) entries of
                                   its row are read */
} mha_paged_kv;

/* One call for a continuous batch of B sequences of their own lengths
 * (FlashAttention's varlen functions): sequence b has lq_b queries and
 * lk_b keys, and attends as one mha_attention call of Lq = lq_b, Lk = lk_b
 * would (causal and the score terms aligned per sequence: bottom-right is
 * query i seeing keys j <= i + lk_b - lq_b). Decode rows (lq_b = 1),
 * speculative or chunked-prefill steps (a few queries over a long cache)
 * and whole prompts mix freely in one call.
 *
 * Queries: packed [1, total_q, H, d] with cu_seqlens_q [B+1] (sequence b
 * owns rows [cu_seqlens_q[b], cu_seqlens_q[b+1]); cu_seqlens_q[0] == 0,
 * non-decreasing, cu_seqlens_q[B] == total_q == q.seq), or, with
 * cu_seqlens_q NULL, a [B, Lq, H, d] view in which every sequence has
 * lq_b = Lq (a decode step of B sequences). out has q's form, with dv.
 *
 * Keys and values: exactly one of
 *   - cu_seqlens_k [B+1]: packed [1, total_k, Hkv, d] and [.., dv], as
 *     cu_seqlens_q (k.seq == total_k);
 *   - paged: the pool of a paged cache (mha_paged_kv), lk_b =
 *     paged->seqlens[b].
 * Any K/V dtype and compute dtype of mha_attention. An empty sequence
 * (lq_b = 0) writes nothing; a sequence with no keys (lk_b = 0) gets zero
 * rows (and lse -inf, or the sink), as a fully masked row does. Tensor
 * sizes stay positive, so a packed batch has at least one query row and
 * (packed keys) one key row in all; a paged batch may have no keys at
 * all.
 *
 * Outputs in the same packed form: weights (optional) holds, sequence
 * after sequence, each sequence's [H, lq_b, lk_b] probabilities
 * (sum_b H * lq_b * lk_b floats); lse (optional) is [H, total_q] with
 * cu_seqlens_q (FlashAttention's varlen layout) and [B, H, Lq] without.
 * Work is cut over (sequence, head, query block) and key chunks by the
 * shape alone: results are bitwise identical for every thread count. */
typedef struct mha_varlen_args {
    int64_t batch;                /* B >= 1 */
    mha_tensor q;                 /* see above */
    const int32_t *cu_seqlens_q;  /* [B+1], or NULL: q is [B, Lq, H, d] */
    mha_tensor k, v;              /* packed keys, or the paged pool */
    const int32_t *cu_seqlens_k;  /* [B+1] packed keys, or NULL (paged) */
    const mha_paged_kv *paged;    /* NULL: packed keys */
    mha_tensor out;               /* q's form, dv; written */
    mha_causal causal;            /* per sequence, as mha_mask.causal */
    const mha_score_terms *terms; /* NULL: none; alibi_slopes [B, H] */
    float scale;                  /* as mha_attention_args */
    int scale_explicit;
    float *weights;               /* optional, see above */
    float *lse;                   /* optional, see above */
} mha_varlen_args;

MHA_API mha_status mha_attention_varlen(const mha_engine *engine,
                                        const mha_varlen_args *args);
MHA_API mha_status mha_attention_varlen_check(const mha_engine *engine,
                                              const mha_varlen_args *args);

/* ------------------------------------------------------------------ */
/* Merging partial results                                             */

/* Attention over keys split into parts (a shared prefix and a suffix, a
 * cache across ranks): part c's output out_c and log-sum-exp lse_c, from
 * mha_attention with an lse output, merge into the attention over the
 * union of the parts' keys (FlashInfer's merge_state):
 *   M = max_c lse_c,  w_c = exp(lse_c - M),
 *   out = sum_c w_c out_c / sum_c w_c,  lse = M + log(sum_c w_c),
 * folded pairwise in part order 0, 1, ..., so the result is bitwise
 * fixed. A part whose lse is -inf (every key masked) contributes nothing;
 * when every part's is, out is zeros and lse -inf. NaN propagates. The
 * library's own split-KV merge runs the same code. Single-threaded. */
typedef struct mha_merge_args {
    int64_t parts;            /* >= 1 */
    const mha_tensor *outs;   /* parts fp32 views [B, L, H, dv] */
    const float *const *lses; /* parts packed [B, H, L] arrays */
    mha_tensor out;           /* fp32 [B, L, H, dv] written; must not overlap
                                 an input */
    float *lse;               /* optional packed [B, H, L] written */
} mha_merge_args;

MHA_API mha_status mha_merge_states(const mha_merge_args *args);

/* ------------------------------------------------------------------ */
/* The layer: nn.MultiheadAttention(batch_first=True)                  */

/* Weights in nn.Linear layout [out_features, in_features], row-major, as in
 * a PyTorch state dict. Give either in_proj_weight [3E, E] (requires
 * kdim == vdim == E) or all three of q_proj_weight [E, E], k_proj_weight
 * [E, kdim], v_proj_weight [E, vdim] (both forms at once:
 * MHA_ERR_BAD_ARGUMENT). in_proj_bias [3E] (q, k, v biases in
 * that order, as PyTorch keeps them in both forms) and out_proj_bias [E]
 * are optional. The layer copies everything it needs. */
typedef struct mha_layer_desc {
    int64_t embed_dim; /* E */
    int64_t num_heads; /* H, divides E */
    int64_t kdim;      /* 0: E */
    int64_t vdim;      /* 0: E */
    const float *in_proj_weight;
    const float *q_proj_weight;
    const float *k_proj_weight;
    const float *v_proj_weight;
    const float *in_proj_bias;
    const float *out_proj_weight; /* [E, E], required */
    const float *out_proj_bias;
    /* A shard of the layer (Megatron's tensor-parallel head sharding, what
     * mha_mpi.h builds on): the layer computes only heads [shard_first,
     * shard_first + shard_heads) of num_heads. Zero shard_heads: every head
     * (shard_first must be 0). With shard_sliced zero the weights above are
     * the full layer's and the shard takes its rows of the q/k/v
     * projections and its columns of out_proj_weight; with shard_sliced
     * nonzero they are already the shard's own slices, W = shard_heads * E
     * / num_heads wide: in_proj_weight [3W, E] (or [W, E], [W, kdim],
     * [W, vdim]), in_proj_bias [3W], out_proj_weight [E, W]. A shard's
     * forward (shard_heads nonzero, even when it is num_heads) writes its
     * heads' share of the output projection without
     * out_proj_bias: the layer's output is the sum of its shards' outputs
     * plus out_proj_bias. Arrays with a head axis (mask keep and bias,
     * alibi_slopes, sinks) stay the full layer's: a shard reads its own
     * heads' entries; weights and lse outputs cover its own heads only,
     * [B, shard_heads, ...] (average_weights is refused). */
    int64_t shard_first;
    int64_t shard_heads;
    int shard_sliced;
    /* The layer's compute dtype: MHA_F32 (0), or MHA_BF16, a bf16 model's
     * layer (PyTorch's module.to(torch.bfloat16)): the weights and biases
     * above, given in fp32, are rounded to bf16 once, here; query, key,
     * value and out are bf16; each projection and the attention sum in
     * fp32 and round their outputs to bf16 (a table with bf16 slots
     * multiplies in bf16: docs/design.md, "Compute dtype"). Weights and lse
     * outputs stay fp32. Any other dtype, or a bf16 shard:
     * MHA_ERR_UNSUPPORTED. */
    mha_dtype dtype;
} mha_layer_desc;

typedef struct mha_layer mha_layer;

/* The layer keeps a pointer to the engine: destroy the layer first. A
 * call whose workspace reaches 32 MiB leaves it with the layer for the
 * next call (one is kept, freed by mha_layer_destroy; concurrent calls
 * never share one): docs/design.md, "Memory". */
MHA_API mha_status mha_layer_create(const mha_engine *engine,
                            const mha_layer_desc *desc, mha_layer **layer);
MHA_API void mha_layer_destroy(mha_layer *layer); /* NULL is a no-op */

/* An fp32 layer's forward (a bf16 layer's: mha_layer_forward_ex,
 * MHA_ERR_UNSUPPORTED here). query [B, Lq, E], key [B, Lk, kdim], value
 * [B, Lk, vdim], out [B, Lq, E], all packed. weights: optional [B, H, Lq, Lk] per-head probabilities
 * (PyTorch's need_weights=True, average_attn_weights=False). The mask is as
 * for mha_attention with H = num_heads. Self-attention passes the same
 * pointer as query, key and value. out must not overlap an input. */
MHA_API mha_status mha_layer_forward(const mha_layer *layer, const float *query,
                             const float *key, const float *value,
                             int64_t batch, int64_t lq, int64_t lk,
                             const mha_mask *mask, float *out,
                             float *weights);

/* The layer's inputs and outputs with strides (element (b, s, e) of query
 * at query + b*query_stride_batch + s*query_stride_seq + e, the embedding
 * contiguous), so PyTorch's batch_first=False [L, B, E] needs no copy
 * (stride_batch E, stride_seq B*E). Both strides of a buffer 0: packed
 * [B, L, E]. Zero-initialised fields are mha_layer_forward's behaviour. */
typedef struct mha_layer_args {
    /* Of the layer's dtype (float, or uint16_t bf16 codes). */
    const void *query, *key, *value; /* [B, Lq, E], [B, Lk, kdim|vdim] */
    void *out;                       /* [B, Lq, E] written */
    int64_t batch, lq, lk;
    int64_t query_stride_batch, query_stride_seq;
    int64_t key_stride_batch, key_stride_seq;
    int64_t value_stride_batch, value_stride_seq;
    int64_t out_stride_batch, out_stride_seq;
    const mha_mask *mask;          /* as mha_layer_forward's */
    const mha_score_terms *terms;  /* NULL: none */
    float *weights;   /* optional packed probabilities: [B, H, Lq, Lk] per
                         head, or with average_weights [B, Lq, Lk] */
    int average_weights; /* nonzero: weights averaged over the heads
                            (PyTorch's default, average_attn_weights=True);
                            takes a B*H*Lq*Lk float workspace */
    float *lse;       /* optional packed [B, H, Lq] per-head log-sum-exp */
} mha_layer_args;

MHA_API mha_status mha_layer_forward_ex(const mha_layer *layer,
                                const mha_layer_args *args);
/* mha_layer_forward_ex's validation alone (mha_attention_check). */
MHA_API mha_status mha_layer_check(const mha_layer *layer,
                                   const mha_layer_args *args);

#ifdef __cplusplus
}
#endif

#endif /* MHA_H */
