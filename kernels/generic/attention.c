/* The portable Q·Kᵀ and P·V kernels on the 4x16 tile of gemm.c: the
 * production path on CPUs without a faster table and the baseline every
 * other table is tested against. */

#include "gemm.h"
#include "generic.h"
#include "kernels.h"

void mk_generic_qk_4x16(const float *q, ptrdiff_t ldq, int64_t m, const float *kp,
                   int64_t n, int64_t d, float *s, ptrdiff_t lds)
{
    mk_generic_gemm_4x16(m, n, d, q, ldq, kp, MK_GENERIC_NR,
                         d * MK_GENERIC_NR, NULL, s, lds);
}

void mk_generic_pv_4x16(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                   const float *v, ptrdiff_t ldv, int64_t dv,
                   const float *alpha, float *o, ptrdiff_t ldo)
{
    mk_generic_gemm_4x16(m, dv, n, p, ldp, v, ldv, MK_GENERIC_NR, alpha, o,
                         ldo);
}
