/* The layer's projections on the portable path: c = a w^T + bias with w
 * (nn.Linear layout [n, k]) packed once into 16-column panels. */
#include <assert.h>

#include "gemm.h"
#include "generic.h"
#include "kernels.h"

void mk_generic_linear_4x16(const float *a, ptrdiff_t lda, int64_t m,
                       const float *wp, int64_t n, int64_t k,
                       const float *bias, float *c, ptrdiff_t ldc)
{
    assert(m >= 0 && n >= 0 && k >= 0);
    mk_generic_gemm_4x16(m, n, k, a, lda, wp, MK_GENERIC_NR,
                         k * MK_GENERIC_NR, NULL, c, ldc);
    if (!bias)
        return;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            c[i * ldc + j] += bias[j];
}
