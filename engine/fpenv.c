/* The floating-point environment a call computes in (docs/design.md, "The
 * floating-point environment"): round to nearest, every exception masked,
 * subnormals kept or (mha_config.flush_subnormals) flushed, set on each
 * thread of the call for its span and the caller's restored after, flags
 * included. The kernels' rounding (the AVX2 exps' magic add), the
 * determinism across thread counts (OpenMP's workers do not share the
 * caller's environment) and the rule that NaN inputs give NaN rows, not a
 * SIGFPE, all rest on it. */
#include "engine.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

/* MXCSR: bits 7-12 mask the six exceptions, 13-14 (0) round to nearest;
 * FTZ is bit 15 and DAZ bit 6. The flags (bits 0-5) start clear. */
#define MXCSR_IEEE 0x1F80u
#define MXCSR_FLUSH 0x8040u

mha_fpenv mha_fpenv_enter(int flush)
{
    mha_fpenv saved = {_mm_getcsr(), 0};
    _mm_setcsr(MXCSR_IEEE | (flush ? MXCSR_FLUSH : 0u));
    return saved;
}

void mha_fpenv_leave(const mha_fpenv *saved)
{
    _mm_setcsr((unsigned)saved->state);
}

/* DAZ is missing from the first SSE2 processors; setting a bit that
 * MXCSR_MASK (FXSAVE's bytes 28-31, 0 meaning 0xFFBF) lacks faults. */
int mha_fpenv_can_flush(void)
{
    _Alignas(16) unsigned char area[512] = {0};
    __asm__ volatile("fxsave %0" : "=m"(area));
    uint32_t mask = (uint32_t)area[28] | (uint32_t)area[29] << 8 |
                    (uint32_t)area[30] << 16 | (uint32_t)area[31] << 24;
    if (mask == 0)
        mask = 0xFFBFu;
    return (mask & MXCSR_FLUSH) == MXCSR_FLUSH;
}

#elif defined(__aarch64__)

/* FPCR 0 is Linux's default: round to nearest, no trap enabled, IEEE half
 * precision (AHP 0), NaNs propagated (DN 0), FEAT_AFP's AH, FIZ and NEP
 * off. FZ (bit 24) flushes single and double precision inputs and
 * results; FZ16 stays 0. The flags live apart, in FPSR. */
#define FPCR_FZ ((uint64_t)1 << 24)

mha_fpenv mha_fpenv_enter(int flush)
{
    uint64_t want = flush ? FPCR_FZ : 0;
    mha_fpenv saved;
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved.state));
    __asm__ volatile("mrs %0, fpsr" : "=r"(saved.flags));
    __asm__ volatile("msr fpcr, %0" : : "r"(want));
    return saved;
}

void mha_fpenv_leave(const mha_fpenv *saved)
{
    __asm__ volatile("msr fpcr, %0" : : "r"(saved->state));
    __asm__ volatile("msr fpsr, %0" : : "r"(saved->flags));
}

int mha_fpenv_can_flush(void) { return 1; }

#else

/* Elsewhere: C's environment (traps off, round to nearest); no flush. */
mha_fpenv mha_fpenv_enter(int flush)
{
    (void)flush;
    mha_fpenv saved;
    feholdexcept(&saved.env);
    fesetround(FE_TONEAREST);
    return saved;
}

void mha_fpenv_leave(const mha_fpenv *saved) { fesetenv(&saved->env); }

int mha_fpenv_can_flush(void) { return 0; }
#endif
