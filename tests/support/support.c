/* The support library (support.h). */
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rng_seed(test_rng *r, uint64_t seed)
{
    /* splitmix64 of the seed, so nearby seeds give unrelated streams and the
     * state is never zero (xorshift's fixed point). */
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    r->s = z ? z : 0x2545f4914f6cdd1dull;
}

uint64_t rng_next(test_rng *r)
{
    /* xorshift64* */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545f4914f6cdd1dull;
}

float rng_uniform(test_rng *r)
{
    /* 24 random bits: exact in a float, uniform in [-1, 1). */
    return (float)(int32_t)(rng_next(r) >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

void fill_uniform(test_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rng_uniform(r);
}

void fill_sentinel(float *x, size_t n)
{
    uint32_t bits = TEST_SENTINEL_BITS;
    for (size_t i = 0; i < n; i++)
        memcpy(&x[i], &bits, sizeof bits);
}

int is_sentinel(const float *x)
{
    uint32_t bits;
    memcpy(&bits, x, sizeof bits);
    return bits == TEST_SENTINEL_BITS;
}

size_t count_changed(const float *x, size_t n)
{
    size_t changed = 0;
    for (size_t i = 0; i < n; i++)
        changed += !is_sentinel(&x[i]);
    return changed;
}

/* The ISAs of mha_isas() whose availability is `want`; generic first. */
static int isas_where(int want, mha_isa out[TEST_MAX_ISAS])
{
    size_t count = 0;
    const mha_isa *all = mha_isas(&count);
    if (count > TEST_MAX_ISAS) {
        fprintf(stderr, "mha_isas() lists %zu ISAs; TEST_MAX_ISAS is %d\n",
                count, TEST_MAX_ISAS);
        abort();
    }
    int n = 0;
    if (want && mha_isa_available(MHA_ISA_GENERIC))
        out[n++] = MHA_ISA_GENERIC;
    for (size_t i = 0; i < count; i++)
        if (all[i] != MHA_ISA_GENERIC &&
            (mha_isa_available(all[i]) != 0) == (want != 0))
            out[n++] = all[i];
    return n;
}

int available_isas(mha_isa out[TEST_MAX_ISAS])
{
    return isas_where(1, out);
}

int missing_isas(mha_isa out[TEST_MAX_ISAS])
{
    return isas_where(0, out);
}

void describe_isas(char *buf, size_t n)
{
    mha_isa run[TEST_MAX_ISAS], lack[TEST_MAX_ISAS];
    int nr = available_isas(run), nl = missing_isas(lack);
    size_t at = (size_t)snprintf(buf, n, "ISAs run:");
    for (int i = 0; i < nr && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, " %s", mha_isa_name(run[i]));
    if (at < n)
        at += (size_t)snprintf(buf + at, n - at, "; not on this CPU:%s",
                               nl ? "" : " (none)");
    for (int i = 0; i < nl && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, " %s",
                               mha_isa_name(lack[i]));
}

double ref_f16_to_double(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, -24);
    else
        v = ldexp(1024.0 + m, e - 25);
    return sign ? -v : v;
}

double ref_bf16_to_double(uint16_t h)
{
    int sign = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 255)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, -133);
    else
        v = ldexp(128.0 + m, e - 134);
    return sign ? -v : v;
}

/* OCP 8-bit floating point (OFP8) spec, written from its tables: E4M3
 * bias 7, exponent 1111 with mantissa 111 NaN, no infinities; E5M2 bias 15,
 * IEEE-like exponent 11111 (infinities, NaN). */
double ref_fp8_e4m3_to_double(uint8_t x)
{
    int sign = x >> 7, e = (x >> 3) & 15, m = x & 7;
    double v;
    if (e == 15 && m == 7)
        v = NAN;
    else if (e == 0)
        v = (m / 8.0) * ldexp(1.0, -6);
    else
        v = (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return sign ? -v : v;
}

double ref_fp8_e5m2_to_double(uint8_t x)
{
    int sign = x >> 7, e = (x >> 2) & 31, m = x & 3;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = (m / 4.0) * ldexp(1.0, -14);
    else
        v = (1.0 + m / 4.0) * ldexp(1.0, e - 15);
    return sign ? -v : v;
}

double ref_code_to_double(mha_dtype t, const void *x)
{
    uint8_t c;
    memcpy(&c, x, 1);
    switch (t) {
    case MHA_I8: return (double)(int8_t)c;
    case MHA_FP8_E4M3: return ref_fp8_e4m3_to_double(c);
    case MHA_FP8_E5M2: return ref_fp8_e5m2_to_double(c);
    case MHA_F32:
    case MHA_F16:
    case MHA_BF16: break;
    }
    abort();
}

double view_scale(const mha_tensor *t, int64_t b, int64_t s, int64_t h)
{
    const mha_scales *sc = &t->scales;
    return sc->data[b * sc->stride_batch + s * sc->stride_seq +
                    h * sc->stride_head];
}

double view_element(const mha_tensor *t, int64_t b, int64_t s, int64_t h,
                    int64_t c)
{
    int64_t at = b * t->stride_batch + s * t->stride_seq +
                 h * t->stride_head + c;
    if (t->dtype == MHA_I8 || t->dtype == MHA_FP8_E4M3 ||
        t->dtype == MHA_FP8_E5M2)
        return ref_code_to_double(t->dtype, (const char *)t->data + at) *
               view_scale(t, b, s, h);
    if (t->dtype == MHA_F16 || t->dtype == MHA_BF16) {
        uint16_t bits;
        memcpy(&bits, (const char *)t->data + at * 2, sizeof bits);
        return t->dtype == MHA_F16 ? ref_f16_to_double(bits)
                                   : ref_bf16_to_double(bits);
    }
    return (double)((const float *)t->data)[at];
}

void view_gather(const mha_tensor *t, float *packed)
{
    size_t o = 0;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seq; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t c = 0; c < t->dim; c++)
                    packed[o++] = (float)view_element(t, b, s, h, c);
}

void view_gather_double(const mha_tensor *t, double *packed)
{
    size_t o = 0;
    for (int64_t b = 0; b < t->batch; b++)
        for (int64_t s = 0; s < t->seq; s++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t c = 0; c < t->dim; c++)
                    packed[o++] = view_element(t, b, s, h, c);
}

double tol_ratio(const float *got, const double *want, size_t n, double abs,
                 double rel, size_t *worst)
{
    double max_ratio = -1.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        double ratio = err / (abs + rel * fabs(want[i]));
        if (isnan(ratio))
            ratio = INFINITY;
        if (ratio > max_ratio) {
            max_ratio = ratio;
            at = i;
        }
    }
    if (worst)
        *worst = at;
    return max_ratio < 0.0 ? 0.0 : max_ratio;
}
