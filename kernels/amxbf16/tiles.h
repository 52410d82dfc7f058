/* The five tile operations the AMX kernels use, and an emulation of them
 * for CPUs without AMX. Every kernel configures the same shape: tiles 0-7
 * of 16 rows of 64 bytes (palette 1). C tiles hold 16 x 16 fp32, A tiles
 * 16 rows of 16 bf16 pairs, B tiles 16 pair rows of 16 columns; TDPBF16PS
 * adds, to C[m][n], A[m][2k] B[k][2n] + A[m][2k + 1] B[k][2n + 1] over
 * the 16 k (docs/design.md, "The amxbf16 table").
 *
 * Built with MK_AMX_EMULATE (the tests' copy, tests/meson.build) the same
 * kernel source runs on a thread's tile file in memory: the kernels'
 * blocking, edges and packing are then tested on any AVX512-BF16 CPU, and
 * only the mapping of these five macros onto the instructions needs a CPU
 * with AMX. The emulation follows the instruction's definition
 * (mk_amx_emu_dp), subnormal inputs and results flushed to zero. */
#ifndef MK_AMX_TILES_H
#define MK_AMX_TILES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MK_AMX_ROWS 16
#define MK_AMX_COLSB 64

#ifdef MK_AMX_EMULATE

#define MK_AMX(op) mk_amxemu_##op

typedef union {
    unsigned char b[MK_AMX_ROWS][MK_AMX_COLSB];
    float f[MK_AMX_ROWS][MK_AMX_COLSB / 4];
    uint16_t h[MK_AMX_ROWS][MK_AMX_COLSB / 2];
} mk_amx_emu_tile;

static _Thread_local mk_amx_emu_tile mk_amx_emu_file[8];

/* A bf16 code's value, subnormals as zero (the instruction's DAZ). */
static inline float mk_amx_emu_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)((h & 0x7F80u) ? h : h & 0x8000u) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* x with a subnormal result flushed to a zero of its sign (FTZ). */
static inline float mk_amx_emu_ftz(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7F800000u) == 0)
        u &= 0x80000000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline void mk_amx_emu_load(int t, const void *base, ptrdiff_t stride)
{
    for (int r = 0; r < MK_AMX_ROWS; r++)
        memcpy(mk_amx_emu_file[t].b[r], (const char *)base + r * stride,
               MK_AMX_COLSB);
}

static inline void mk_amx_emu_store(int t, void *base, ptrdiff_t stride)
{
    for (int r = 0; r < MK_AMX_ROWS; r++)
        memcpy((char *)base + r * stride, mk_amx_emu_file[t].b[r],
               MK_AMX_COLSB);
}

/* TDPBF16PS as the SDM's pseudo-code reads: per output, the even and the
 * odd products of the 16 pairs summed apart in fp32, then their sum added
 * to C. A product of two bf16 values is exact in fp32, so the fused
 * multiply-adds are adds of exact products. */
static inline void mk_amx_emu_dp(int c, int a, int b)
{
    mk_amx_emu_tile *C = &mk_amx_emu_file[c];
    const mk_amx_emu_tile *A = &mk_amx_emu_file[a], *B = &mk_amx_emu_file[b];
    for (int m = 0; m < MK_AMX_ROWS; m++)
        for (int n = 0; n < MK_AMX_COLSB / 4; n++) {
            float even = 0.0f, odd = 0.0f;
            for (int k = 0; k < MK_AMX_COLSB / 4; k++) {
                const uint16_t *ak = &A->h[m][2 * k], *bk = &B->h[k][2 * n];
                even = mk_amx_emu_ftz(even + mk_amx_emu_bf16(ak[0]) *
                                                 mk_amx_emu_bf16(bk[0]));
                odd = mk_amx_emu_ftz(odd + mk_amx_emu_bf16(ak[1]) *
                                               mk_amx_emu_bf16(bk[1]));
            }
            C->f[m][n] =
                mk_amx_emu_ftz(C->f[m][n] + mk_amx_emu_ftz(even + odd));
        }
}

#define MK_AMX_BEGIN() ((void)0)
#define MK_AMX_END() ((void)0)
#define MK_AMX_ZERO(t) memset(&mk_amx_emu_file[t], 0, sizeof(mk_amx_emu_tile))
#define MK_AMX_LOAD(t, base, stride) mk_amx_emu_load(t, base, stride)
#define MK_AMX_STORE(t, base, stride) mk_amx_emu_store(t, base, stride)
#define MK_AMX_DP(c, a, b) mk_amx_emu_dp(c, a, b)

#else

#include <immintrin.h>

#define MK_AMX(op) mk_amxbf16_##op

/* The 64-byte tile configuration: palette 1, tiles 0-7 of 16 rows of 64
 * bytes (colsb as little-endian u16 from byte 16, rows from byte 48).
 * Loaded at every kernel call and released at its end, so a call never
 * depends on what ran before it on the thread, and a thread outside the
 * kernels holds no tile state for the OS to save. A constant: gcc 12's
 * _tile_loadconfig tells the compiler it reads 8 bytes, so stores to a
 * local configuration past them could be dropped. */
static inline void mk_amx_begin(void)
{
    static const _Alignas(64) unsigned char cfg[64] = {
        [0] = 1,
        [16] = MK_AMX_COLSB, [18] = MK_AMX_COLSB, [20] = MK_AMX_COLSB,
        [22] = MK_AMX_COLSB, [24] = MK_AMX_COLSB, [26] = MK_AMX_COLSB,
        [28] = MK_AMX_COLSB, [30] = MK_AMX_COLSB,
        [48] = MK_AMX_ROWS, [49] = MK_AMX_ROWS, [50] = MK_AMX_ROWS,
        [51] = MK_AMX_ROWS, [52] = MK_AMX_ROWS, [53] = MK_AMX_ROWS,
        [54] = MK_AMX_ROWS, [55] = MK_AMX_ROWS};
    _tile_loadconfig(cfg);
}

#define MK_AMX_BEGIN() mk_amx_begin()
#define MK_AMX_END() _tile_release()
#define MK_AMX_ZERO(t) _tile_zero(t)
/* gcc 12's _tile_loadd is an asm with the address as a register and no
 * memory operand: the barrier before it makes the stores to a chunk
 * happen before the load, not after or never, and the one after keeps
 * the next chunk's stores (into the same buffer) from moving above it. */
#define MK_AMX_LOAD(t, base, stride)                                    \
    do {                                                                \
        __asm__ volatile("" ::: "memory");                              \
        _tile_loadd(t, base, stride);                                   \
        __asm__ volatile("" ::: "memory");                              \
    } while (0)
#define MK_AMX_STORE(t, base, stride) _tile_stored(t, base, stride)
#define MK_AMX_DP(c, a, b) _tile_dpbf16ps(c, a, b)

#endif

#endif
