/* The AVX2+FMA kernels, shared between the files of kernels/avx2/ (the
 * table in table.c points at them). Not installed; no ISA types here, so
 * any file may include it. */
#ifndef MK_AVX2_H
#define MK_AVX2_H

#include "kernels.h"

/* pack.c: the transpose of x (n rows of depth k, row stride ldx) as panels
 * of 16 columns: x[16q + j][p] at 16*k*q + 16*p + j, zeros past n. */
size_t mk_avx2_panels_floats(int64_t n, int64_t k);
void mk_avx2_pack_panels(const float *x, ptrdiff_t ldx, int64_t n,
                         int64_t k, float *packed);

/* attention.c */
size_t mk_avx2_packed_k_floats(int64_t n, int64_t d);
void mk_avx2_pack_k(const float *k, ptrdiff_t ldk, int64_t n, int64_t d,
                    float *kp);
void mk_avx2fma_qk_6x16(const float *q, ptrdiff_t ldq, int64_t m,
                        const float *kp, int64_t n, int64_t d, float *s,
                        ptrdiff_t lds);
void mk_avx2fma_softmax_update_8(float *s, ptrdiff_t lds, int64_t m,
                                 int64_t n, float scale, const mk_mask *mask,
                                 float *row_max, float *row_sum,
                                 float *alpha);
void mk_avx2fma_pv_6x16(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                        const float *v, ptrdiff_t ldv, int64_t dv,
                        const float *alpha, float *o, ptrdiff_t ldo);
void mk_avx2_normalize_8(const float *o, ptrdiff_t ldo, int64_t m,
                         int64_t dv, const float *row_sum, float *out,
                         ptrdiff_t ldout);

/* decode.c */
void mk_avx2fma_decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                          const void *k, mk_dtype kt, ptrdiff_t ldk, int64_t n,
                          int64_t d, float *s, ptrdiff_t lds);
void mk_avx2fma_decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                          const void *v, mk_dtype vt, ptrdiff_t ldv,
                          int64_t dv, const float *alpha, float *o,
                          ptrdiff_t ldo);

/* convert.c (cvt_f16 needs F16C, which every AVX2 CPU has) */
void mk_f16c_cvt_f16_8(const uint16_t *x, int64_t n, float *y);
void mk_avx2_cvt_bf16_8(const uint16_t *x, int64_t n, float *y);

/* linear.c */
size_t mk_avx2_packed_w_floats(int64_t n, int64_t k);
void mk_avx2_pack_w(const float *w, int64_t n, int64_t k, float *wp);
void mk_avx2fma_linear_6x16(const float *a, ptrdiff_t lda, int64_t m,
                            const float *wp, int64_t n, int64_t k,
                            const float *bias, float *c, ptrdiff_t ldc);

#endif
