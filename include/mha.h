/*
 * libmha — multi-head attention on CPUs.
 *
 * The public contract. C11; usable from C++.
 *
 * Semantics shared by every entry point:
 *   - For batch b and head h, with scale s (0 selects 1/sqrt(d)):
 *       S = s * Q_bh K_bh^T (+ additive mask) (masked entries -> -inf)
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
    MHA_ISA_AVX512 = 4 /* x86-64 AVX-512F/BW/VL/DQ + FMA */
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
} mha_config;

typedef struct mha_engine mha_engine;

/* An ISA the CPU or the build lacks gives MHA_ERR_UNSUPPORTED. */
MHA_API mha_status mha_engine_create(const mha_config *config, mha_engine **engine);
MHA_API void mha_engine_destroy(mha_engine *engine); /* NULL is a no-op */
MHA_API mha_isa mha_engine_isa(const mha_engine *engine);
MHA_API int mha_engine_num_threads(const mha_engine *engine);
/* "generic", "avx2", "avx512", "neon", "auto"; "unknown" for other values. */
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

/* Element types. q and out are always MHA_F32; k and v may be stored in
 * half precision or quantised to 8 bits (each independently): converted to
 * fp32 in registers, accumulated in fp32. Other combinations give
 * MHA_ERR_UNSUPPORTED. A quantised element's value is its code times the
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
 * tensor), raised to FLT_MIN when smaller (an all-zero row gets FLT_MIN,
 * never 0). Then each element x becomes the code nearest x / scale
 * (computed in double), ties to even, saturated to the largest finite code
 * (+-127, +-448, +-57344). NaN becomes 0 (int8, which has no NaN) or NaN
 * (fp8, sign kept); +-infinity saturates to +-127 and +-448 and stays
 * +-infinity in E5M2, which has one. Like every function, validates
 * everything before writing anything. Paged caches: a later form. */
MHA_API mha_status mha_quantize(const mha_tensor *src, const mha_tensor *dst,
                                float *scales_out);

/* Packed [B, S, H, D] (PyTorch batch_first, heads split from E). */
MHA_API mha_tensor mha_tensor_bshd(void *data, int64_t batch, int64_t seq,
                           int64_t heads, int64_t dim);
/* Packed [B, H, S, D]. */
MHA_API mha_tensor mha_tensor_bhsd(void *data, int64_t batch, int64_t seq,
                           int64_t heads, int64_t dim);

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
} mha_mask;

/* ------------------------------------------------------------------ */
/* Scaled dot-product attention                                        */

typedef struct mha_attention_args {
    mha_tensor q;   /* [B, Lq, H,   d ] */
    mha_tensor k;   /* [B, Lk, Hkv, d ] */
    mha_tensor v;   /* [B, Lk, Hkv, dv] */
    mha_tensor out; /* [B, Lq, H,   dv] written */
    const mha_mask *mask; /* NULL: no mask */
    float scale;          /* 0: 1/sqrt(d) */
    float *weights; /* optional packed [B, H, Lq, Lk]: the probabilities;
                       must not overlap q, k, v or out (MHA_ERR_BAD_STRIDE) */
} mha_attention_args;

MHA_API mha_status mha_attention(const mha_engine *engine,
                         const mha_attention_args *args);

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
} mha_layer_desc;

typedef struct mha_layer mha_layer;

/* The layer keeps a pointer to the engine: destroy the layer first. */
MHA_API mha_status mha_layer_create(const mha_engine *engine,
                            const mha_layer_desc *desc, mha_layer **layer);
MHA_API void mha_layer_destroy(mha_layer *layer); /* NULL is a no-op */

/* query [B, Lq, E], key [B, Lk, kdim], value [B, Lk, vdim], out [B, Lq, E],
 * all packed. weights: optional [B, H, Lq, Lk] per-head probabilities
 * (PyTorch's need_weights=True, average_attn_weights=False). The mask is as
 * for mha_attention with H = num_heads. Self-attention passes the same
 * pointer as query, key and value. out must not overlap an input. */
MHA_API mha_status mha_layer_forward(const mha_layer *layer, const float *query,
                             const float *key, const float *value,
                             int64_t batch, int64_t lq, int64_t lk,
                             const mha_mask *mask, float *out,
                             float *weights);

#ifdef __cplusplus
}
#endif

#endif /* MHA_H */
