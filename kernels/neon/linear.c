/* The layer's projections on NEON: c = a w^T + bias with w (nn.Linear
 * layout [n, k]) packed once into 8-column panels, so the 8x8 tile of
 * gemm.c reads it with broadcast FMAs. The bias is added after the sum, as
 * on the generic path. */
#include <assert.h>

#include "gemm.h"
#include "neon.h"

void mk_neon_linear_8x8(const float *a, ptrdiff_t lda, int64_t m,
                        const float *wp, int64_t n, int64_t k,
                        const float *bias, float *c, ptrdiff_t ldc)
{
    assert(m >= 0 && n >= 0 && k >= 0);
    mk_neon_gemm_8x8(m, n, k, a, lda, wp, MK_NEON_NR, k * MK_NEON_NR, NULL,
                     bias, c, ldc);
}
