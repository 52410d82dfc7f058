/* The layer's projections on NEON (linear.c), for the table in
 * attention.c. Internal to kernels/neon/. */
#ifndef MK_NEON_LINEAR_H
#define MK_NEON_LINEAR_H

#include <stddef.h>
#include <stdint.h>

size_t mk_neon_packed_w_floats(int64_t n, int64_t k);
void mk_neon_pack_w(const float *w, int64_t n, int64_t k, float *wp);
void mk_neon_linear_8x8(const float *a, ptrdiff_t lda, int64_t m,
                        const float *wp, int64_t n, int64_t k,
                        const float *bias, float *c, ptrdiff_t ldc);

#endif
