/* The naming rule mk_<isa>_<op>[_<tile>] put to work: an ISA header
 * declares its instances and its table.c sets them by slot group, each
 * group one macro, so no table or header spells the slots out again. */
#ifndef MK_TABLE_INIT_H
#define MK_TABLE_INIT_H

#include <assert.h>

#include "kernels.h"

/* The prefill kernels (pack, qk, softmax, pv, normalize, linear) of an ISA
 * whose matmuls run on one register tile (a token such as 6x16). */
#define MK_DECLARE_PREFILL(isa, tile)                          \
    mk_packed_floats_fn mk_##isa##_packed_floats;              \
    mk_pack_fn mk_##isa##_pack;                                \
    mk_qk_fn mk_##isa##_qk_##tile;                             \
    mk_softmax_update_fn mk_##isa##_softmax_update;            \
    mk_pv_fn mk_##isa##_pv_##tile;                             \
    mk_normalize_fn mk_##isa##_normalize;                      \
    mk_pv_finish_fn mk_##isa##_pv_finish_##tile;               \
    mk_linear_fn mk_##isa##_linear_##tile
#define MK_SET_PREFILL(t, isa, tile)                           \
    ((t)->packed_floats = mk_##isa##_packed_floats,            \
     (t)->pack = mk_##isa##_pack, (t)->qk = mk_##isa##_qk_##tile, \
     (t)->softmax_update = mk_##isa##_softmax_update,          \
     (t)->pv = mk_##isa##_pv_##tile,                           \
     (t)->normalize = mk_##isa##_normalize,                    \
     (t)->pv_finish = mk_##isa##_pv_finish_##tile,             \
     (t)->linear = mk_##isa##_linear_##tile)

/* Defines mk_<isa>_pv_finish_<tile> as the ISA's pv and normalize called
 * in turn: a table whose P·V does not run on the tile driver. */
#define MK_DEFINE_PV_FINISH_COMPOSED(isa, tile)                          \
    void mk_##isa##_pv_finish_##tile(                                    \
        const float *p, ptrdiff_t ldp, int64_t m, int64_t n,             \
        const float *v, ptrdiff_t ldv, int64_t dv, const float *alpha,   \
        float *o, ptrdiff_t ldo, const float *row_sum, float *out,       \
        ptrdiff_t ldout, int stream)                                     \
    {                                                                    \
        mk_##isa##_pv_##tile(p, ldp, m, n, v, ldv, dv, alpha, o, ldo);   \
        mk_##isa##_normalize(o, ldo, m, dv, row_sum, out, ldout, stream); \
    }

#define MK_DECLARE_DECODE(isa)                                 \
    mk_decode_qk_fn mk_##isa##_decode_qk;                      \
    mk_decode_pv_fn mk_##isa##_decode_pv
#define MK_SET_DECODE(t, isa)                                  \
    ((t)->decode_qk = mk_##isa##_decode_qk,                    \
     (t)->decode_pv = mk_##isa##_decode_pv)

/* widen[MK_F32] (a copy) stays generic's. */
#define MK_DECLARE_WIDEN(isa)                                  \
    mk_widen_fn mk_##isa##_widen_f16, mk_##isa##_widen_bf16
#define MK_SET_WIDEN(t, isa)                                   \
    ((t)->widen[MK_F16] = mk_##isa##_widen_f16,                \
     (t)->widen[MK_BF16] = mk_##isa##_widen_bf16)

/* Defines both widen slots as loop(x, n, y, to_f32) over the ISA's
 * converter of one vector of each dtype (the file's own widening loop). */
#define MK_DEFINE_WIDEN(isa, loop, f16_to_f32, bf16_to_f32)    \
    void mk_##isa##_widen_f16(const void *x, int64_t n, float *y) \
    {                                                          \
        assert(n >= 0 && (n == 0 || (x && y)));                \
        loop(x, n, y, f16_to_f32);                             \
    }                                                          \
    void mk_##isa##_widen_bf16(const void *x, int64_t n, float *y) \
    {                                                          \
        assert(n >= 0 && (n == 0 || (x && y)));                \
        loop(x, n, y, bf16_to_f32);                            \
    }

/* The narrow slots (fp32 -> binary16 and bfloat16 codes). */
#define MK_DECLARE_NARROW(isa)                                 \
    mk_narrow_fn mk_##isa##_narrow_f16, mk_##isa##_narrow_bf16
#define MK_SET_NARROW(t, isa)                                  \
    ((t)->narrow[MK_F16] = mk_##isa##_narrow_f16,              \
     (t)->narrow[MK_BF16] = mk_##isa##_narrow_bf16)
/* Defines both as loop(x, n, scale, y, from_f32) over the ISA's converter
 * of one vector to each dtype's codes. */
#define MK_DEFINE_NARROW(isa, loop, f32_to_f16, f32_to_bf16)   \
    void mk_##isa##_narrow_f16(const float *x, int64_t n, float scale, \
                               uint16_t *y)                    \
    {                                                          \
        assert(n >= 0 && (n == 0 || (x && y)));                \
        loop(x, n, scale, y, f32_to_f16);                      \
    }                                                          \
    void mk_##isa##_narrow_bf16(const float *x, int64_t n, float scale, \
                                uint16_t *y)                   \
    {                                                          \
        assert(n >= 0 && (n == 0 || (x && y)));                \
        loop(x, n, scale, y, f32_to_bf16);                     \
    }

/* The half compute slots of an ISA with a dot product of half dtype h
 * (bf16 or f16; all of them but softmax_update, which a table sets to the
 * step it chooses); H is the slot set's index (MK_HALF_BF16, MK_HALF_F16).
 * The optional codes pair is cleared, so a table that replaces a base's
 * set never keeps the base's pv_codes over its own pack; a table sets the
 * pair after this. */
#define MK_DECLARE_HALF(isa, h, tile)                          \
    mk_pack_half_fn mk_##isa##_pack_##h;                       \
    mk_qk_half_fn mk_##isa##_qk_##h##_##tile;                  \
    mk_packed_floats_fn mk_##isa##_packed_v_##h##_floats;      \
    mk_pack_v_half_fn mk_##isa##_pack_v_##h;                   \
    mk_pv_half_fn mk_##isa##_pv_##h##_##tile
#define MK_SET_HALF(t, H, isa, h, tile)                        \
    ((t)->half[H].softmax_update_codes = NULL,                 \
     (t)->half[H].pv_codes = NULL, /* pv's partner, or none */  \
     (t)->half[H].pack = mk_##isa##_pack_##h,                  \
     (t)->half[H].qk = mk_##isa##_qk_##h##_##tile,             \
     (t)->half[H].packed_v_floats = mk_##isa##_packed_v_##h##_floats, \
     (t)->half[H].pack_v = mk_##isa##_pack_v_##h,              \
     (t)->half[H].pv = mk_##isa##_pv_##h##_##tile)

#define MK_DECLARE_PEAK(isa)                                   \
    mk_fma_chains_fn mk_##isa##_fma_chains;                    \
    extern const double mk_##isa##_fma_chains_flops
#define MK_SET_PEAK(t, isa)                                    \
    ((t)->fma_chains = mk_##isa##_fma_chains,                  \
     (t)->fma_chains_flops = mk_##isa##_fma_chains_flops)

#endif
