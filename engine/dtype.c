/* The dtype axis: one traits table (name, size, whether a tensor role may
 * hold it) and the public conversions. A new dtype is a row here and a
 * case in every switch -Wswitch-enum points at (docs/design.md, "Recipe:
 * add a dtype"). */
#include <string.h>

#include "engine.h"

_Static_assert(MK_F32 == (int)MHA_F32 && MK_F16 == (int)MHA_F16 &&
                   MK_BF16 == (int)MHA_BF16 && MK_I8 == (int)MHA_I8 &&
                   MK_FP8_E4M3 == (int)MHA_FP8_E4M3 &&
                   MK_FP8_E5M2 == (int)MHA_FP8_E5M2 &&
                   MK_DTYPE_COUNT == (int)MHA_FP8_E5M2 + 1,
               "mk_dtype mirrors mha_dtype");

/* name, bytes, may store keys/values, may be q/out (compute dtype),
 * needs scales, largest finite code (quantised) */
static const mha_dtype_traits traits[MK_DTYPE_COUNT] = {
    [MHA_F32] = {"f32", 4, 1, 1, 0, 0},
    [MHA_F16] = {"f16", 2, 1, 1, 0, 0},
    [MHA_BF16] = {"bf16", 2, 1, 1, 0, 0},
    [MHA_I8] = {"i8", 1, 1, 0, 1, 127},
    [MHA_FP8_E4M3] = {"fp8_e4m3", 1, 1, 0, 1, 448},
    [MHA_FP8_E5M2] = {"fp8_e5m2", 1, 1, 0, 1, 57344},
};

const mha_dtype_traits *mha_dtype_traits_of(mha_dtype dtype)
{
    switch (dtype) {
    case MHA_F32:
    case MHA_F16:
    case MHA_BF16:
    case MHA_I8:
    case MHA_FP8_E4M3:
    case MHA_FP8_E5M2: return &traits[dtype];
    }
    return NULL;
}

size_t mha_dtype_size(mha_dtype dtype)
{
    const mha_dtype_traits *t = mha_dtype_traits_of(dtype);
    return t ? t->size : 0;
}

const char *mha_dtype_name(mha_dtype dtype)
{
    const mha_dtype_traits *t = mha_dtype_traits_of(dtype);
    return t ? t->name : "unknown";
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even on the dropped 16 bits; NaN stays a quiet NaN with
 * its sign (a NaN whose payload sits in the dropped bits would otherwise
 * round to infinity). */
static uint16_t to_bf16(float f)
{
    uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* IEEE binary16, round to nearest even, overflow to infinity, subnormals
 * kept; NaN stays a quiet NaN with its sign. */
static uint16_t to_f16(float f)
{
    uint32_t u = bits_of(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520: rounds past the largest half */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
        /* Adding 0.5 (2^-1) puts the half's subnormal unit (2^-24) at the
         * float's last mantissa bit, so the FPU rounds to nearest even. */
        float r = float_of(a) + 0.5f;
        return (uint16_t)(sign | (bits_of(r) - 0x3f000000u));
    }
    uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd; /* rebias (-112 << 23) and round */
    return (uint16_t)(sign | (a >> 13));
}

static float from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return float_of(sign | 0x7f800000u | (m << 13));
    if (e != 0)
        return float_of(sign | ((e + 112u) << 23) | (m << 13));
    /* Subnormal: m * 2^-24, exact in fp32. */
    float v = (float)m * float_of(0x33800000u);
    return float_of(sign | bits_of(v));
}

void mha_f32_to_f16(const float *x, size_t n, uint16_t *y)
{
    for (size_t i = 0; i < n; i++)
        y[i] = to_f16(x[i]);
}

void mha_f32_to_bf16(const float *x, size_t n, uint16_t *y)
{
    for (size_t i = 0; i < n; i++)
        y[i] = to_bf16(x[i]);
}

void mha_f16_to_f32(const uint16_t *x, size_t n, float *y)
{
    for (size_t i = 0; i < n; i++)
        y[i] = from_f16(x[i]);
}

void mha_bf16_to_f32(const uint16_t *x, size_t n, float *y)
{
    for (size_t i = 0; i < n; i++)
        y[i] = float_of((uint32_t)x[i] << 16);
}

mk_narrow_fn *mha_narrow_kernel(const mk_table *t, mha_dtype dtype)
{
    if (!t || (dtype != MHA_BF16 && dtype != MHA_F16))
        return NULL;
    return t->narrow[dtype == MHA_BF16 ? MK_BF16 : MK_F16];
}

void mha_narrow_rows(const mk_table *t, mha_dtype dtype, const float *x,
                     ptrdiff_t ldx, int64_t rows, int64_t n, void *y,
                     ptrdiff_t ldy)
{
    /* A vector kernel where the table has one: this loop, compiled for
     * the baseline ISA (its f16 half scalar), was 3.6% of AMX bf16
     * prefill at 2048 keys (docs/benchmarks.md). */
    mk_narrow_fn *kernel = mha_narrow_kernel(t, dtype);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        uint16_t *yr = (uint16_t *)y + r * ldy;
        if (kernel)
            kernel(xr, n, 1.0f, yr);
        else if (dtype == MHA_BF16)
            for (int64_t c = 0; c < n; c++) {
                /* to_bf16 without branches, so the loop vectorises: the
                 * output of every bf16 call passes here. */
                uint32_t u = bits_of(xr[c]);
                uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
                uint32_t quiet = (u >> 16) | 0x0040u;
                yr[c] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet
                                                                   : rounded);
            }
        else
            for (int64_t c = 0; c < n; c++)
                yr[c] = to_f16(xr[c]);
    }
}
