/* The generic kernels other generic files share. */
#ifndef MK_GENERIC_H
#define MK_GENERIC_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

void mk_generic_cvt_f16(const uint16_t *x, int64_t n, float *y);
void mk_generic_cvt_bf16(const uint16_t *x, int64_t n, float *y);

size_t mk_generic_packed_w_floats(int64_t n, int64_t k);
void mk_generic_pack_w(const float *w, int64_t n, int64_t k, float *wp);
void mk_generic_linear(const float *a, ptrdiff_t lda, int64_t m,
                       const float *wp, int64_t n, int64_t k,
                       const float *bias, float *c, ptrdiff_t ldc);

void mk_generic_decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                          const void *k, mk_dtype kt, ptrdiff_t ldk, int64_t n,
                          int64_t d, float *s, ptrdiff_t lds);
void mk_generic_decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                          const void *v, mk_dtype vt, ptrdiff_t ldv,
                          int64_t dv, const float *alpha, float *o,
                          ptrdiff_t ldo);

#endif
