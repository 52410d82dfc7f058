/* The AArch64 Advanced SIMD (NEON) attention matmuls on the 8x8 tile of
 * gemm.c (the softmax step is softmax.c). Advanced SIMD is baseline on
 * AArch64, so kernels/neon/ needs no ISA flags; the engine still asks the
 * CPU (HWCAP_ASIMD) before picking the table. */
#include <assert.h>

#include "gemm.h"
#include "kernels.h"
#include "neon.h"

/* S = Q Kᵀ on the 8x8 tile of gemm.c, K packed into 8-key panels. */
void mk_neon_qk_8x8(const float *q, ptrdiff_t ldq, int64_t m,
                           const float *kp, int64_t n, int64_t d, float *s,
                           ptrdiff_t lds)
{
    assert(m >= 0 && n >= 0 && d >= 0);
    assert(m <= 1 || lds >= n); /* inputs may broadcast: ldq >= 0 */
    assert(ldq >= 0);
    mk_neon_gemm_8x8(m, n, d, q, ldq, kp, MK_NEON_NR, d * MK_NEON_NR, NULL,
                     NULL, s, lds);
}

/* O = alpha O + P V on the 8x8 tile of gemm.c, V read in place (row j of
 * V is row j of the right-hand side, 8 columns a panel). */
void mk_neon_pv_8x8(const float *p, ptrdiff_t ldp, int64_t m,
                           int64_t n, const float *v, ptrdiff_t ldv,
                           int64_t dv, const float *alpha, float *o,
                           ptrdiff_t ldo)
{
    assert(m >= 0 && n >= 0 && dv >= 0);
    assert(ldp >= 0 && ldv >= 0); /* inputs may broadcast */
    assert(m <= 1 || ldo >= dv);
    assert(m == 0 || alpha != NULL);
    mk_neon_gemm_8x8(m, dv, n, p, ldp, v, ldv, MK_NEON_NR, alpha, NULL, o,
                     ldo);
}
