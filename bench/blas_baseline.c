/*
 * The reference a C user writes without libmha: per (batch, head) a
 * cblas_sgemm for S = scale * Q K^T, a plain row softmax, a cblas_sgemm for
 * O = P V. OpenMP runs the (batch, head) pairs in parallel; OpenBLAS is held
 * to one thread so that the thread count of a case is the case's own.
 * S is a full Lq x Lk matrix per thread: the O(Lq * Lk) memory libmha avoids.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "internal.h"

/* Declared by OpenBLAS's cblas.h but not by the reference CBLAS header that
 * a library-only detection may pick up. */
void openblas_set_num_threads(int num_threads);

/* Softmax of each row of s (n columns) in place. Key j of row i is masked
 * when j > i + diag; a row with every key masked becomes zeros. */
static void softmax_rows(float *s, int64_t m, int64_t n, int64_t diag)
{
    for (int64_t i = 0; i < m; ++i) {
        float *row = s + i * n;
        int64_t visible = n;
        if (diag != INT64_MAX && i + diag + 1 < n)
            visible = i + diag + 1 < 0 ? 0 : i + diag + 1;
        float max = -INFINITY;
        for (int64_t j = 0; j < visible; ++j)
            max = row[j] > max ? row[j] : max;
        float sum = 0.0f;
        for (int64_t j = 0; j < visible; ++j) {
            row[j] = expf(row[j] - max);
            sum += row[j];
        }
        const float inv = visible > 0 ? 1.0f / sum : 0.0f;
        for (int64_t j = 0; j < visible; ++j)
            row[j] *= inv;
        for (int64_t j = visible; j < n; ++j)
            row[j] = 0.0f;
    }
}

size_t bench_blas_scratch_floats(const mha_attention_args *args, int threads)
{
    return (size_t)threads * (size_t)args->q.seq * (size_t)args->k.seq;
}

void bench_blas_attention(const mha_attention_args *args, mha_causal causal,
                          int threads, float *scratch)
{
    const mha_tensor *q = &args->q, *k = &args->k, *v = &args->v;
    const mha_tensor *o = &args->out;
    const int64_t batch = q->batch, heads = q->heads, lq = q->seq;
    const int64_t lk = k->seq, d = q->dim, dv = v->dim;
    const int64_t group = heads / k->heads;
    const float scale = args->scale != 0.0f ? args->scale
                                            : 1.0f / sqrtf((float)d);
    const int64_t diag = causal == MHA_CAUSAL_TOP_LEFT       ? 0
                         : causal == MHA_CAUSAL_BOTTOM_RIGHT ? lk - lq
                                                             : INT64_MAX;

    openblas_set_num_threads(1);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t bh = 0; bh < batch * heads; ++bh) {
        const int64_t b = bh / heads, h = bh % heads, hk = h / group;
        const float *qp = (const float *)q->data + b * q->stride_batch +
                          h * q->stride_head;
        const float *kp = (const float *)k->data + b * k->stride_batch +
                          hk * k->stride_head;
        const float *vp = (const float *)v->data + b * v->stride_batch +
                          hk * v->stride_head;
        float *op = (float *)o->data + b * o->stride_batch +
                    h * o->stride_head;
        float *s = scratch + (size_t)omp_get_thread_num() * (size_t)(lq * lk);

        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)lq, (int)lk,
                    (int)d, scale, qp, (int)q->stride_seq, kp,
                    (int)k->stride_seq, 0.0f, s, (int)lk);
        softmax_rows(s, lq, lk, diag);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)lq,
                    (int)dv, (int)lk, 1.0f, s, (int)lk, vp,
                    (int)v->stride_seq, 0.0f, op, (int)o->stride_seq);
    }
}
