/* The byte codes of the fuzz input (encoding.h). */
#include "encoding.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* A seed asked for a value no code gives: the seed table is wrong. */
static unsigned no_code(const char *what, long long value)
{
    fprintf(stderr, "fuzz encoding: no code for %s %lld\n", what, value);
    abort();
}

unsigned isa_code_count(void)
{
    size_t n = 0;
    mha_isas(&n);
    return 1 + (unsigned)n + ISA_SPECIALS;
}

mha_isa isa_of_code(unsigned code, int *null_config)
{
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    code %= isa_code_count();
    *null_config = 0;
    if (code == 0)
        return MHA_ISA_AUTO;
    if (code <= n)
        return all[code - 1];
    int largest = 0;
    for (size_t i = 0; i < n; i++)
        largest = (int)all[i] > largest ? (int)all[i] : largest;
    switch ((isa_special)(code - 1 - n)) {
    case ISA_PAST_LAST: return (mha_isa)(largest + 1);
    case ISA_NEGATIVE: return (mha_isa)-1;
    case ISA_HUGE: return (mha_isa)1000;
    case ISA_INT_MIN: return (mha_isa)INT_MIN;
    case ISA_NULL_CONFIG:
    case ISA_SPECIALS: break;
    }
    *null_config = 1;
    return MHA_ISA_AUTO;
}

int isa_is_valid(mha_isa isa)
{
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    int listed = isa == MHA_ISA_AUTO;
    for (size_t i = 0; i < n; i++)
        listed |= all[i] == isa;
    return listed;
}

unsigned isa_code(mha_isa isa)
{
    size_t n = 0;
    const mha_isa *all = mha_isas(&n);
    if (isa == MHA_ISA_AUTO)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (all[i] == isa)
            return 1 + (unsigned)i;
    return no_code("isa", isa);
}

unsigned isa_special_code(isa_special s)
{
    size_t n = 0;
    mha_isas(&n);
    return 1 + (unsigned)n + (unsigned)s;
}

static const int thread_values[] = {0, 1, 2, 3, 4, -1, -8, INT_MIN,
                                    MHA_MAX_THREADS + 1};
enum { N_THREADS = sizeof thread_values / sizeof thread_values[0] };

int threads_of_code(unsigned code)
{
    return thread_values[code % N_THREADS];
}

int flush_of_code(unsigned code)
{
    return (int)(code / N_THREADS % 2);
}

unsigned threads_code(int threads)
{
    for (unsigned i = 0; i < N_THREADS; i++)
        if (thread_values[i] == threads)
            return i;
    return no_code("threads", threads);
}

unsigned engine_threads_code(int threads, int flush)
{
    return threads_code(threads) + (flush ? N_THREADS : 0);
}

/* Codes 0 and 1 give fp32: many requests keep fp32 K/V. The quantised
 * dtypes take their scales from the terms bytes (terms.c); without them
 * the call is refused (MHA_ERR_NULL_POINTER). */
static const int dtype_values[8] = {MHA_F32, MHA_F32, MHA_FP8_E5M2, MHA_F16,
                                    MHA_BF16, MHA_I8, MHA_FP8_E4M3, -1};

mha_dtype dtype_of(unsigned code)
{
    return (mha_dtype)dtype_values[code % 8];
}

unsigned dtype_code(int dtype)
{
    for (unsigned i = 0; i < 8; i++)
        if (dtype_values[i] == dtype)
            return i;
    return no_code("dtype", dtype);
}

static const int causal_values[] = {0, 0, 0, 1, 1, 2, 2, 3, -1, INT_MAX};
enum { N_CAUSAL = sizeof causal_values / sizeof causal_values[0] };

mha_causal causal_of(unsigned code)
{
    return (mha_causal)causal_values[code % N_CAUSAL];
}

unsigned causal_code(int causal)
{
    for (unsigned i = 0; i < N_CAUSAL; i++)
        if (causal_values[i] == causal)
            return i;
    return no_code("causal", causal);
}

int64_t seq_of(unsigned code)
{
    code &= 255;
    return code < 200 ? 1 + code % 24 : 25 + (int64_t)(code - 200) * 6;
}

unsigned seq_code(int64_t seq)
{
    if (seq >= 1 && seq <= 24)
        return (unsigned)(seq - 1);
    if (seq >= 25 && (seq - 25) % 6 == 0 && (seq - 25) / 6 <= 55)
        return 200 + (unsigned)((seq - 25) / 6);
    return no_code("seq", seq);
}

const int64_t wild_values[] = {
    0, -1, 1, 2, -2, 3, 7, 64, 65536, INT32_MAX,
    (int64_t)INT32_MAX + 1, (int64_t)1 << 32, ((int64_t)1 << 32) + 1,
    (int64_t)1 << 40, 3037000500LL, /* ~sqrt(2^63) */
    (int64_t)1 << 61, (int64_t)1 << 62, INT64_MAX / 4 + 1, INT64_MAX,
    INT64_MIN, INT64_MIN + 1, -((int64_t)1 << 40), -65536};
const unsigned n_wild_values = sizeof wild_values / sizeof wild_values[0];

/* Codes past the table and below 250 give small numbers (code % 40);
 * 250 and up take 8 raw bytes. */
int64_t wild_of_code(unsigned code)
{
    return code < n_wild_values ? wild_values[code] : (int64_t)(code % 40);
}

unsigned wild_code(int64_t value)
{
    for (unsigned i = 0; i < n_wild_values; i++)
        if (wild_values[i] == value)
            return i;
    return no_code("wild value", value);
}

const float special_values[SPECIAL_CLASSES] = {
    NAN, -NAN, INFINITY, -INFINITY, 1e-45f, 1e-39f, -1e-41f, -0.0f,
    1e30f, -FLT_MAX, FLT_MAX, 0.0f};
/* The binary16 and bfloat16 forms keep finite classes finite (the largest
 * values of the format for 1e30 and FLT_MAX). */
const uint16_t special_f16[SPECIAL_CLASSES] = {
    0x7e00, 0xfe00, 0x7c00, 0xfc00, 0x0001, 0x03ff,
    0x8001, 0x8000, 0x7bff, 0xfbff, 0x7bff, 0x0000};
const uint16_t special_bf16[SPECIAL_CLASSES] = {
    0x7fc0, 0xffc0, 0x7f80, 0xff80, 0x0001, 0x007f,
    0x8001, 0x8000, 0x7149, 0xff7f, 0x7f7f, 0x0000};
