/* The fuzz target, the oracle: what every output element must be, from
 * the support library's double-precision oracle and the NaN/infinity
 * reach of each input. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "oracle.h"
#include "terms.h"

/* 0: moderate; 1: infinite or beyond 1e30; 2: NaN. */
int flag_of(double x)
{
    if (isnan(x))
        return 2;
    return isinf(x) || fabs(x) > 1e30 ? 1 : 0;
}

int flag_of_row(const double *x, int64_t n)
{
    int f = 0;
    for (int64_t i = 0; i < n; i++) {
        int g = flag_of(x[i]);
        f = g > f ? g : f;
    }
    return f;
}

/* max_i |x[i]| for i < n (0 for n = 0). */
static double max_abs(const double *x, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* Key j for query i of (b, h): hidden by causal, lengths or keep (the
 * support oracle's rule); masked by a -inf bias; or visible. *bias
 * receives the additive term. */
int key_class(const mha_mask *m, int64_t b, int64_t h, int64_t i,
              int64_t j, int64_t Lq, int64_t Lk, double *bias)
{
    *bias = 0.0;
    if (oracle_hidden(m, b, h, i, j, Lq, Lk))
        return KEY_HIDDEN;
    if (m && m->bias) {
        *bias = m->bias[b * m->bias_stride_batch + h * m->bias_stride_head +
                        i * m->bias_stride_query + j];
        if (*bias == -INFINITY)
            return KEY_NEG_INF;
    }
    return KEY_VISIBLE;
}

/* How far a flushing engine's score of a query row (largest magnitude
 * qmax) and key row k (d elements, subnormal-free) may stand from the
 * oracle's. The whole score when the scale, or the scale times a K scale,
 * is subnormal: the kernels read that factor as 0. Else the quantities FTZ
 * drops on the way, each below FLT_MIN (products, partial sums, q times
 * the scale, codes times their scale: at most 2d + 4 of them in a score,
 * however a kernel orders its factors), each then multiplied by what may
 * follow it: the scale and K's scale, an element of k or a code times its
 * scale, or an element of q times the scale (and a subnormal K scale, read
 * as 0, drops codes times it); and a subnormal bias, ALiBi slope (times
 * distances below 2^62) or sink read as 0. The softcap passes errors on
 * unchanged or shrunk (docs/design.md, "Score terms": its own steps stay
 * normal). */
static double flush_slack(const oracle_problem *p, double qmax,
                          const double *k, double dabs)
{
    const double s = fabs(p->scale), sk = p->sk_hi, cm = p->code_max;
    const double kmax = max_abs(k, p->d);
    double whole = s < FLT_MIN || s * p->sk_lo < FLT_MIN ? s * dabs : 0.0;
    double each = (1.0 + s) * (1.0 + sk) + kmax + cm * sk +
                  qmax * s * (1.0 + sk + cm);
    return whole + FLT_MIN * (double)(2 * p->d + 4) * each + 1e-18;
}

/* What each output element ([B, Lq, H, dv]) and weight ([B, H, Lq, Lk],
 * when weights is non-NULL) must be: the support oracle's value where only
 * moderate finite values reach it, else NaN, anything, or exactly zero by
 * what reaches it. Scores whose magnitude exceeds mag_unit widen the
 * tolerance by the rounding they carry. */
void oracle(const oracle_problem *p, want *out, want *weights)
{
    const int64_t Lq = p->Lq, Lk = p->Lk, H = p->H, d = p->d, dv = p->dv;
    const oracle_dims dims = {p->B, Lq, Lk, H, p->Hkv, d, dv};
    double *vo = malloc((size_t)(p->B * Lq * H * dv) * sizeof *vo);
    double *vw = malloc((size_t)(p->B * H * Lq * Lk) * sizeof *vw);
    int *cls = malloc((size_t)Lk * sizeof *cls);
    double *vl = malloc((size_t)(p->B * H * Lq) * sizeof *vl);
    if (!vo || !vw || !cls || !vl)
        abort();
    oracle_sdpa_terms(&dims, p->q, p->k, p->v, p->mask, p->terms, p->scale,
                      vo, vw, vl);
    /* Terms move the key positions the causal mask compares. */
    mha_mask nocausal;
    const mha_mask *km = terms_key_mask(p->mask, p->terms, &nocausal);
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Lq; i++) {
                int64_t hk = h / (H / p->Hkv);
                const double *q = p->q + ((b * Lq + i) * H + h) * d;
                int qflag = flag_of_row(q, d);
                /* For flush_slack, once a row. */
                const double qmax = p->flush ? max_abs(q, d) : 0.0;
                int row_nan = 0, row_may = qflag != 0;
                int64_t nvis = 0, nneg = 0;
                double mag = 0.0, flushed = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    double bj;
                    cls[j] = key_class(km, b, h, i, j, Lq, Lk, &bj);
                    if (cls[j] != KEY_HIDDEN &&
                        terms_hidden(p->mask, p->terms, i, j, Lq, Lk))
                        cls[j] = KEY_HIDDEN;
                    if (cls[j] == KEY_HIDDEN)
                        continue;
                    const double *k = p->k + ((b * Lk + j) * p->Hkv + hk) * d;
                    int kflag = flag_of_row(k, d);
                    int bflag = cls[j] == KEY_VISIBLE ? flag_of(bj) : 0;
                    row_may |= kflag != 0 || bflag != 0;
                    if (cls[j] == KEY_NEG_INF) {
                        nneg++;
                        continue;
                    }
                    nvis++;
                    row_nan |= qflag == 2 || kflag == 2 || bflag == 2;
                    double dabs = 0.0;
                    for (int64_t c = 0; c < d; c++)
                        dabs += fabs(q[c] * k[c]);
                    double m = fabs(p->scale) * dabs + fabs(bj) +
                               terms_alibi_mag(p->terms, b, h, i, j, Lq, Lk);
                    if (!(m <= 1e37)) /* floats cannot hold the scores */
                        row_may = 1;
                    mag = m > mag ? m : mag;
                    if (p->flush) {
                        double f = flush_slack(p, qmax, k, dabs);
                        flushed = f > flushed ? f : flushed;
                    }
                }
                const int64_t o_at = ((b * Lq + i) * H + h) * dv;
                const int64_t w_at = ((b * H + h) * Lq + i) * Lk;
                want *orow = out + o_at;
                want *wrow = weights ? weights + w_at : NULL;
                want *lrow = p->lse ? p->lse + (b * H + h) * Lq + i : NULL;
                if (nvis == 0) {
                    int kind = nneg && row_may ? WANT_ANY : WANT_ZERO;
                    /* No key: lse is the sink's logit, or -inf. */
                    double sink = p->terms && p->terms->sinks
                                      ? (double)p->terms->sinks[h]
                                      : -INFINITY;
                    if (lrow)
                        *lrow = (want){sink, 0.0,
                                       kind == WANT_ANY ? WANT_ANY
                                                        : WANT_EXACT};
                    /* With a sink the row is not empty: masked keys of a
                     * computed block get P = 0, and 0 x NaN or 0 x inf in
                     * V reaches the output (mha.h's 0 x NaN caveat). */
                    int sunk = p->terms && p->terms->sinks;
                    for (int64_t c = 0; c < dv; c++) {
                        int col_may = 0;
                        for (int64_t j = 0; sunk && !STRICT_MASKED_V && j < Lk;
                             j++)
                            col_may |= flag_of(p->v[((b * Lk + j) * p->Hkv +
                                                     hk) * dv + c]) != 0;
                        orow[c] = (want){0.0, 0.0, col_may ? WANT_ANY : kind};
                    }
                    for (int64_t j = 0; wrow && j < Lk; j++)
                        wrow[j] = (want){0.0, 0.0, kind};
                    continue;
                }
                double vmax = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    if (cls[j] != KEY_VISIBLE)
                        continue;
                    const double *v = p->v + ((b * Lk + j) * p->Hkv + hk) * dv;
                    for (int64_t c = 0; c < dv; c++)
                        if (flag_of(v[c]) == 0 && fabs(v[c]) > vmax)
                            vmax = fabs(v[c]);
                }
                double excess = mag - p->mag_unit;
                double slack = excess > 0 ? 2.0 * (double)(d + 4) *
                                                UNIT_ROUNDOFF * excess
                                          : 0.0;
                /* Scores off by at most f move a weight by a factor
                 * within e^(+-2f): 3f covers f up to 1/4, past it
                 * anything goes. */
                if (!(flushed <= 0.25))
                    row_may = 1;
                slack += 3.0 * flushed;
                if (lrow)
                    *lrow = (want){vl[(b * H + h) * Lq + i], slack,
                                   row_nan   ? WANT_NAN
                                   : row_may ? WANT_ANY
                                             : WANT_CLOSE};
                double out_slack = slack * vmax;
                if (vmax > 1.0)
                    out_slack += (vmax - 1.0) * p->tol_abs;
                for (int64_t c = 0; c < dv; c++) {
                    int col_nan = 0, col_may = 0;
                    for (int64_t j = 0; j < Lk; j++) {
                        double v = p->v[((b * Lk + j) * p->Hkv + hk) * dv + c];
                        int vflag = flag_of(v);
                        if (cls[j] == KEY_VISIBLE)
                            col_nan |= vflag == 2;
                        if (cls[j] == KEY_VISIBLE || !STRICT_MASKED_V)
                            col_may |= vflag != 0;
                    }
                    /* An infinite score row may look fully masked and
                     * drop V's NaN: row_may outranks col_nan. */
                    int kind = row_nan   ? WANT_NAN
                               : row_may ? WANT_ANY
                               : col_nan ? WANT_NAN
                               : col_may ? WANT_ANY
                                         : WANT_CLOSE;
                    orow[c] = (want){vo[o_at + c], out_slack, kind};
                }
                for (int64_t j = 0; wrow && j < Lk; j++) {
                    if (cls[j] != KEY_VISIBLE)
                        wrow[j] = (want){0.0, 0.0,
                                         row_nan || row_may ? WANT_ANY
                                                            : WANT_ZERO};
                    else
                        wrow[j] = (want){vw[w_at + j], slack,
                                         row_nan   ? WANT_NAN
                                         : row_may ? WANT_ANY
                                                   : WANT_CLOSE};
                }
            }
    free(vo);
    free(vw);
    free(vl);
    free(cls);
}

/* Element x of a 2-byte buffer filled by buffer_fill_sentinel still holds
 * the sentinel's bytes at its offset. */
static int half_sentinel(const void *data, size_t x)
{
    const uint32_t bits = TEST_SENTINEL_BITS;
    uint16_t want, got;
    memcpy(&want, (const char *)&bits + (2 * x) % 4, 2);
    memcpy(&got, (const char *)data + 2 * x, 2);
    return got == want;
}

void check_value(const want *w, const float *at, double tol_abs,
                 double tol_rel, const char *what, long long index)
{
    stats[S_NAN] += w->kind == WANT_NAN;
    stats[S_ZERO_ROW] += w->kind == WANT_ZERO;
    REQUIRE_AT(!is_sentinel(at), "%s[%lld] was not written", what, index);
    double got = (double)*at;
    switch (w->kind) {
    case WANT_ZERO:
        REQUIRE_AT(got == 0.0, "%s[%lld] = %.9g, want exactly 0 (all keys "
                   "masked)", what, index, got);
        break;
    case WANT_NAN:
        REQUIRE_AT(isnan(got), "%s[%lld] = %.9g, want NaN (a NaN reaches "
                   "it)", what, index, got);
        break;
    case WANT_EXACT:
        REQUIRE_AT(got == w->value, "%s[%lld] = %.9g, want exactly %.9g",
                   what, index, got, w->value);
        break;
    case WANT_CLOSE: {
        double err = fabs(got - w->value);
        double tol = tol_abs + tol_rel * fabs(w->value) + w->slack;
        REQUIRE_AT(err <= tol, "%s[%lld] = %.9g, want %.9g (error %.3g > "
                   "tolerance %.3g)", what, index, got, w->value, err, tol);
        break;
    }
    default: break;
    }
}

/* What a flushing engine reads of n values: subnormal floats as 0 (a
 * binary16 subnormal widens to a normal float and stays). */
static void flush_values(double *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) < FLT_MIN)
            x[i] = 0.0;
}

/* The smallest and largest magnitude of the scales an 8-bit view reads
 * (1, 1 without scales). */
static void scale_range(const mha_tensor *t, double *lo, double *hi)
{
    *lo = *hi = 1.0;
    const mha_scales *sc = &t->scales;
    if (!is_q8_dtype(t->dtype) || !sc->data)
        return;
    for (int64_t r = 0, n = scale_rows(t); r < n; r++) {
        double x = fabs((double)sc->data[scale_row_at(t, r)]);
        *lo = r == 0 || x < *lo ? x : *lo;
        *hi = r == 0 || x > *hi ? x : *hi;
    }
}

/* A view as packed doubles [B, S, H, D] (half precision decoded). */
static double *gather(const mha_tensor *t)
{
    size_t n = (size_t)(t->batch * t->seq * t->heads * t->dim);
    double *x = malloc((n ? n : 1) * sizeof *x);
    if (!x)
        abort();
    view_gather_double(t, x);
    return x;
}

void check_attention_outputs(const attention_case *c)
{
    const mha_attention_args *a = &c->args;
    const mha_tensor *o = &a->out;
    const int64_t B = a->q.batch, Lq = a->q.seq, H = a->q.heads;
    const int64_t Lk = a->k.seq, d = a->q.dim, dv = a->v.dim;
    double *q = gather(&a->q), *k = gather(&a->k), *v = gather(&a->v);
    size_t nout = (size_t)(B * Lq * H * dv), nw = (size_t)(B * H * Lq * Lk);
    want *wo = malloc(nout * sizeof *wo);
    want *ww = a->weights ? malloc((nw ? nw : 1) * sizeof *ww) : NULL;
    size_t nl = (size_t)(B * H * Lq);
    want *wl = a->lse ? malloc(nl * sizeof *wl) : NULL;
    if (!wo || (a->weights && !ww) || (a->lse && !wl))
        abort();
    double scale = a->scale != 0.0f ? (double)a->scale : 1.0 / sqrt((double)d);
    oracle_problem p = {.B = B, .Lq = Lq, .Lk = Lk, .H = H,
                        .Hkv = a->k.heads, .d = d, .dv = dv, .q = q, .k = k,
                        .v = v, .mask = a->mask, .scale = scale,
                        .mag_unit = 2.0 * sqrt((double)d) + 1.0,
                        .tol_abs = TOL_ATTN_ABS, .terms = a->terms,
                        .lse = wl, .sk_lo = 1.0, .sk_hi = 1.0};
    if (engine_flush) {
        flush_values(q, (size_t)(B * Lq * H * d));
        flush_values(k, (size_t)(B * Lk * a->k.heads * d));
        flush_values(v, (size_t)(B * Lk * a->v.heads * dv));
        p.flush = 1;
        scale_range(&a->k, &p.sk_lo, &p.sk_hi);
        p.code_max = is_q8_dtype(a->k.dtype) ? q8_max(a->k.dtype) : 0.0;
    }
    oracle(&p, wo, ww);

    const buffer *ob = &c->buf[B_OUT];
    /* A half compute dtype: elements of 2 bytes, rounded to nearest even
     * from the fp32 result (half an ulp: 2^-11 fp16, 2^-8 bf16, relative). */
    int half = o->dtype != MHA_F32;
    size_t es = half ? 2 : 4, nel = ob->bytes / es;
    double round_rel = o->dtype == MHA_F16 ? 1.0 / 2048
                       : half             ? 1.0 / 256
                                          : 0.0;
    uint8_t *inside = calloc(nel ? nel : 1, 1);
    if (!inside)
        abort();
    const float *out = (const float *)o->data;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Lq; i++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t col = 0; col < dv; col++) {
                    int64_t off = b * o->stride_batch + i * o->stride_seq +
                                  h * o->stride_head + col;
                    inside[off] = 1;
                    int64_t idx = ((b * Lq + i) * H + h) * dv + col;
                    if (!half) {
                        check_value(&wo[idx], out + off, TOL_ATTN_ABS,
                                    TOL_ATTN_REL, "out", (long long)idx);
                        continue;
                    }
                    REQUIRE_AT(!half_sentinel(o->data, (size_t)off),
                               "out[%lld] was not written", (long long)idx);
                    float got = (float)view_element(o, b, i, h, col);
                    check_value(&wo[idx], &got, TOL_ATTN_ABS,
                                TOL_ATTN_REL + round_rel, "out",
                                (long long)idx);
                }
    for (size_t i = 0; i < nel; i++)
        REQUIRE_AT(inside[i] || (half ? half_sentinel(o->data, i)
                                      : is_sentinel(out + i)),
                   "out[+%zu] outside the view was written", i);
    for (size_t i = 0; ww && i < nw; i++)
        check_value(&ww[i], a->weights + i, TOL_ATTN_ABS, TOL_ATTN_REL,
                    "weights", (long long)i);
    for (size_t i = 0; wl && i < nl; i++)
        check_value(&wl[i], a->lse + i, TOL_LSE_ABS, TOL_LSE_REL, "lse",
                    (long long)i);
    free(inside);
    free(wo);
    free(ww);
    free(wl);
    free(q);
    free(k);
    free(v);
}

/* y = x w^T + b in double over rows of x; a row holding an infinity or a
 * huge value projects to infinities (anything may come of it), one holding
 * a NaN to NaNs. */
double *project(const float *x, int64_t rows, int64_t in,
                       const float *w, const float *bias, int64_t out)
{
    double *y = malloc((size_t)(rows * out) * sizeof *y);
    if (!y)
        abort();
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in;
        int flag = 0;
        for (int64_t p = 0; p < in; p++) {
            int g = flag_of((double)xr[p]);
            flag = g > flag ? g : flag;
        }
        for (int64_t o = 0; o < out; o++) {
            double acc = bias ? (double)bias[o] : 0.0;
            for (int64_t p = 0; p < in; p++)
                acc += (double)xr[p] * (double)w[o * in + p];
            y[r * out + o] = flag == 2 ? NAN : flag == 1 ? INFINITY : acc;
        }
    }
    return y;
}

void check_layer_outputs(const layer_case *c, const layer_pointers *lp)
{
    const mha_layer_desc *d = &c->desc;
    const int64_t E = d->embed_dim, H = d->num_heads, dh = E / H;
    const int64_t kd = eff_kdim(d), vd = eff_vdim(d);
    const int64_t B = c->B, Lq = c->Lq, Lk = c->Lk;
    /* The weights as the caller gave them (the layer has its own copy; the
     * caller's buffers are gone). */
    const float *w[NDBUF];
    for (int i = 0; i < NDBUF; i++)
        w[i] = (const float *)c->dbuf[i].copy;
    const int in_proj = c->form == 0;
    const float *wq = in_proj ? w[D_IN_W] : w[D_Q_W];
    const float *wk = in_proj ? w[D_IN_W] + E * E : w[D_K_W];
    const float *wv = in_proj ? w[D_IN_W] + 2 * E * E : w[D_V_W];
    const float *bin = d->in_proj_bias ? w[D_IN_B] : NULL;
    double *Q = project(lp->query, B * Lq, E, wq, bin, E);
    double *K = project(lp->key, B * Lk, kd, wk, bin ? bin + E : NULL, E);
    double *V = project(lp->value, B * Lk, vd, wv, bin ? bin + 2 * E : NULL,
                        E);
    size_t ncat = (size_t)(B * Lq * E), nw = (size_t)(B * H * Lq * Lk);
    want *cat = malloc(ncat * sizeof *cat);
    want *ww = lp->weights ? malloc(nw * sizeof *ww) : NULL;
    if (!cat || (lp->weights && !ww))
        abort();
    oracle_problem p = {.B = B, .Lq = Lq, .Lk = Lk, .H = H, .Hkv = H,
                        .d = dh, .dv = dh, .q = Q, .k = K, .v = V,
                        .mask = c->mb.use ? &c->mask : NULL,
                        .scale = 1.0 / sqrt((double)dh),
                        .mag_unit = 2.0 * sqrt((double)dh) + 1.0,
                        .tol_abs = TOL_LAYER_ABS, .sk_lo = 1.0, .sk_hi = 1.0};
    oracle(&p, cat, ww);

    const float *wo = w[D_OUT_W], *bo = d->out_proj_bias ? w[D_OUT_B] : NULL;
    for (int64_t r = 0; r < B * Lq; r++) {
        const want *cr = cat + r * E;
        int kind = WANT_EXACT;
        double slack = 0.0;
        for (int64_t col = 0; col < E; col++) {
            if (cr[col].kind == WANT_NAN)
                kind = WANT_NAN;
            else if (cr[col].kind == WANT_ANY && kind != WANT_NAN)
                kind = WANT_ANY;
            else if (cr[col].kind == WANT_CLOSE && kind == WANT_EXACT)
                kind = WANT_CLOSE;
            slack = cr[col].slack > slack ? cr[col].slack : slack;
        }
        for (int64_t o = 0; o < E; o++) {
            double acc = bo ? (double)bo[o] : 0.0, wsum = 0.0;
            for (int64_t col = 0; col < E; col++) {
                acc += cr[col].value * (double)wo[o * E + col];
                wsum += fabs((double)wo[o * E + col]);
            }
            want x = {acc, slack * wsum, kind};
            check_value(&x, lp->out + r * E + o, TOL_LAYER_ABS, TOL_LAYER_REL,
                        "out", (long long)(r * E + o));
        }
    }
    for (size_t i = 0; ww && i < nw; i++)
        check_value(&ww[i], lp->weights + i, TOL_LAYER_ABS, TOL_LAYER_REL,
                    "weights", (long long)i);
    free(cat);
    free(ww);
    free(Q);
    free(K);
    free(V);
}
