/* The AVX-512 kernels (F/BW/VL/DQ with FMA and F16C), shared between the
 * files of kernels/avx512/ (the table in table.c points at them). Not
 * installed; no ISA types here, so any file may include it. */
#ifndef MK_AVX512_H
#define MK_AVX512_H

#include "kernels.h"

/* pack.c: the transpose of x (n rows of depth k, row stride ldx) as panels
 * of 32 columns: x[32q + j][p] at 32*k*q + 32*p + j, zeros past n. */
size_t mk_avx512_panels_floats(int64_t n, int64_t k);
void mk_avx512_pack_panels(const float *x, ptrdiff_t ldx, int64_t n,
                           int64_t k, float *packed);

/* attention.c */
size_t mk_avx512_packed_k_floats(int64_t n, int64_t d);
void mk_avx512_pack_k(const float *k, ptrdiff_t ldk, int64_t n, int64_t d,
                      float *kp);
void mk_avx512_qk_12x32(const float *q, ptrdiff_t ldq, int64_t m,
                        const float *kp, int64_t n, int64_t d, float *s,
                        ptrdiff_t lds);
void mk_avx512_softmax_update_16(float *s, ptrdiff_t lds, int64_t m,
                                 int64_t n, float scale, const mk_mask *mask,
                                 float *row_max, float *row_sum,
                                 float *alpha);
void mk_avx512_pv_12x32(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                        const float *v, ptrdiff_t ldv, int64_t dv,
                        const float *alpha, float *o, ptrdiff_t ldo);
void mk_avx512_normalize_16(const float *o, ptrdiff_t ldo, int64_t m,
                            int64_t dv, const float *row_sum, float *out,
                            ptrdiff_t ldout);

/* convert.c */
void mk_avx512_cvt_f16_16(const uint16_t *x, int64_t n, float *y);
void mk_avx512_cvt_bf16_16(const uint16_t *x, int64_t n, float *y);

/* linear.c */
size_t mk_avx512_packed_w_floats(int64_t n, int64_t k);
void mk_avx512_pack_w(const float *w, int64_t n, int64_t k, float *wp);
void mk_avx512_linear_12x32(const float *a, ptrdiff_t lda, int64_t m,
                            const float *wp, int64_t n, int64_t k,
                            const float *bias, float *c, ptrdiff_t ldc);

#endif
