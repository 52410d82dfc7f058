/* The NEON kernels the table in attention.c takes from the other files of
 * kernels/neon/. Internal. */
#ifndef MK_NEON_H
#define MK_NEON_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* convert.c */
void mk_neon_cvt_f16(const uint16_t *x, int64_t n, float *y);
void mk_neon_cvt_bf16(const uint16_t *x, int64_t n, float *y);

/* decode.c */
void mk_neon_decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                       const void *k, mk_dtype kt, ptrdiff_t ldk, int64_t n,
                       int64_t d, float *s, ptrdiff_t lds);
void mk_neon_decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                       const void *v, mk_dtype vt, ptrdiff_t ldv, int64_t dv,
                       const float *alpha, float *o, ptrdiff_t ldo);

/* linear.c */
size_t mk_neon_packed_w_floats(int64_t n, int64_t k);
void mk_neon_pack_w(const float *w, int64_t n, int64_t k, float *wp);
void mk_neon_linear_8x8(const float *a, ptrdiff_t lda, int64_t m,
                        const float *wp, int64_t n, int64_t k,
                        const float *bias, float *c, ptrdiff_t ldc);

#endif
