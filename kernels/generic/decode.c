/* The generic decode kernels: a few query rows against key and value rows
 * read in place, in any element type. Rows are widened 64 elements at a
 * time into a stack buffer; sums run in element order, so a value depends
 * only on its own inputs. */
#include "generic.h"

enum { CHUNK = 64 };

/* Elements [c, c + n) of an element row of type t, as fp32 in y. */
static void widen(const void *row, mk_dtype t, int64_t c, int64_t n, float *y)
{
    if (t == MK_F32) {
        const float *x = (const float *)row + c;
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i];
    } else if (t == MK_F16) {
        mk_generic_cvt_f16((const uint16_t *)row + c, n, y);
    } else {
        mk_generic_cvt_bf16((const uint16_t *)row + c, n, y);
    }
}

static size_t elem_size(mk_dtype t) { return t == MK_F32 ? 4 : 2; }

void mk_generic_decode_qk(const float *q, ptrdiff_t ldq, int64_t m,
                          const void *k, mk_dtype kt, ptrdiff_t ldk, int64_t n,
                          int64_t d, float *s, ptrdiff_t lds)
{
    float kb[CHUNK];
    for (int64_t j = 0; j < n; j++) {
        const char *row = (const char *)k + (size_t)(j * ldk) * elem_size(kt);
        for (int64_t i = 0; i < m; i++)
            s[i * lds + j] = 0.0f;
        for (int64_t c = 0; c < d; c += CHUNK) {
            int64_t w = d - c < CHUNK ? d - c : CHUNK;
            widen(row, kt, c, w, kb);
            for (int64_t i = 0; i < m; i++) {
                const float *qr = q + i * ldq + c;
                float acc = s[i * lds + j];
                for (int64_t x = 0; x < w; x++)
                    acc += qr[x] * kb[x];
                s[i * lds + j] = acc;
            }
        }
    }
}

void mk_generic_decode_pv(const float *p, ptrdiff_t ldp, int64_t m, int64_t n,
                          const void *v, mk_dtype vt, ptrdiff_t ldv,
                          int64_t dv, const float *alpha, float *o,
                          ptrdiff_t ldo)
{
    float vb[CHUNK];
    for (int64_t i = 0; i < m; i++)
        for (int64_t c = 0; c < dv; c++)
            o[i * ldo + c] *= alpha[i];
    for (int64_t j = 0; j < n; j++) {
        const char *row = (const char *)v + (size_t)(j * ldv) * elem_size(vt);
        for (int64_t c = 0; c < dv; c += CHUNK) {
            int64_t w = dv - c < CHUNK ? dv - c : CHUNK;
            widen(row, vt, c, w, vb);
            for (int64_t i = 0; i < m; i++) {
                float pij = p[i * ldp + j], *orow = o + i * ldo + c;
                for (int64_t x = 0; x < w; x++)
                    orow[x] += pij * vb[x];
            }
        }
    }
}
