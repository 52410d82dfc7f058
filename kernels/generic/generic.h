/* The generic kernels other generic files share. */
#ifndef MK_GENERIC_H
#define MK_GENERIC_H

#include <stddef.h>
#include <stdint.h>

void mk_generic_cvt_f16(const uint16_t *x, int64_t n, float *y);
void mk_generic_cvt_bf16(const uint16_t *x, int64_t n, float *y);

size_t mk_generic_packed_w_floats(int64_t n, int64_t k);
void mk_generic_pack_w(const float *w, int64_t n, int64_t k, float *wp);
void mk_generic_linear(const float *a, ptrdiff_t lda, int64_t m,
                       const float *wp, int64_t n, int64_t k,
                       const float *bias, float *c, ptrdiff_t ldc);

#endif
