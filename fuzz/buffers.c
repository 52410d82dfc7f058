/* The fuzz target, buffers and the engine: exact-size allocations,
 * snapshots, the mask's arrays, value fill, special values, reporting. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

char context[768]; /* the request of the current input */
char detail[256];  /* the element that broke the contract */
int verbose = -1;  /* FUZZ_VERBOSE=1: print every request */
long stats[NSTATS]; /* what the inputs turned into (FUZZ_STATS=1) */

void print_stats(void)
{
    static const char *names[NSTATS] = {
        "attention valid", "attention invalid", "attention too big",
        "layer create invalid", "layer valid", "layer forward invalid",
        "layer too big", "elements that must be NaN",
        "elements of all-masked rows", "quantize valid",
        "quantize invalid"};
    for (int i = 0; i < NSTATS; i++)
        fprintf(stderr, "%s: %ld\n", names[i], stats[i]);
}

/* The request is complete: print it when asked (to read a crash input). */
void announce(void)
{
    if (verbose > 0)
        fprintf(stderr, "request: %s\n", context);
}

void violated(const char *what, int line)
{
    fprintf(stderr,
            "fuzz_attention: contract violated at line %d: %s\n"
            "  %s\n  request: %s\n  mha_last_error: \"%s\"\n",
            line, what, detail, context, mha_last_error());
    __builtin_trap();
}

/* pad: bytes of offset from malloc's alignment (0, 1 or 4). */
void buffer_alloc(buffer *b, size_t bytes, size_t pad)
{
    b->base = malloc(pad + bytes + (pad + bytes == 0));
    if (!b->base)
        abort();
    b->data = b->base + pad;
    b->bytes = bytes;
    b->copy = NULL;
}

void buffer_snapshot(buffer *b)
{
    b->copy = malloc(b->bytes + 1);
    if (!b->copy)
        abort();
    memcpy(b->copy, b->data, b->bytes);
}

int buffer_unchanged(const buffer *b)
{
    return memcmp(b->copy, b->data, b->bytes) == 0;
}

void buffer_free(buffer *b)
{
    free(b->base);
    free(b->copy);
    memset(b, 0, sizeof *b);
}

void buffer_fill_sentinel(buffer *b)
{
    const uint32_t bits = TEST_SENTINEL_BITS;
    for (size_t i = 0; i + 4 <= b->bytes; i += 4)
        memcpy(b->data + i, &bits, 4);
}

void alloc_mask(const mha_mask *m, mask_buffers *mb, int64_t B,
                       int64_t H, int64_t Lq, int64_t Lk, unsigned misalign)
{
    int huge = 0;
    int64_t st[3];
    keep_strides(m, st);
    buffer_alloc(&mb->buf[0],
                 mb->keep ? alloc_bytes(mask_span(st, B, H, Lq, Lk), 1, &huge)
                          : 1,
                 misalign & 1); /* bytes: any address */
    bias_strides(m, st);
    buffer_alloc(&mb->buf[1],
                 mb->bias ? alloc_bytes(mask_span(st, B, H, Lq, Lk), 4, &huge)
                          : 4,
                 misalign & 2 ? 4 : 0);
    buffer_alloc(&mb->buf[2], B > 0 && B <= MAX_ELEMS ? (size_t)B * 4 : 4,
                 misalign & 4 ? 4 : 0);
}

void fill_mask(const mask_request *r, mask_buffers *mb, int64_t Lk,
                      uint64_t seed)
{
    test_rng s;
    rng_seed(&s, seed ^ 0x6b65657000000000ull);
    buffer *keep = &mb->buf[0], *bias = &mb->buf[1], *len = &mb->buf[2];
    for (size_t i = 0; i < keep->bytes; i++) {
        uint64_t x = rng_next(&s);
        int masked = r->keep_density == 255 || (x & 255) < r->keep_density;
        keep->data[i] = masked ? 0 : (char)(1 + (x >> 8) % 255);
    }
    static const float magnitude[] = {1.0f, 1.0f, 1.0f, 1000.0f};
    float mag = magnitude[r->bias_scale % 4];
    for (size_t i = 0; i + 4 <= bias->bytes; i += 4) {
        float v = rng_uniform(&s) * mag;
        unsigned x = (unsigned)rng_next(&s) & 255;
        if (r->bias_ninf == 255 || x < r->bias_ninf)
            v = -INFINITY;
        memcpy(bias->data + i, &v, 4);
    }
    size_t nb = len->bytes / 4;
    int64_t top = Lk < INT32_MAX ? Lk : INT32_MAX;
    for (size_t b = 0; b < nb; b++) {
        int64_t v;
        switch (r->len_mode % 8) {
        case 4: v = top; break;
        case 5: v = 0; break;
        case 7: v = top / 2; break;
        default:
            v = top >= 0 ? (int64_t)(rng_next(&s) % (uint64_t)(top + 1)) : 0;
        }
        if (r->len_mode % 8 == 6 && b == (size_t)r->len_bad % nb) {
            const int64_t bad[] = {-1, Lk < INT32_MAX ? Lk + 1 : -1,
                                   INT32_MAX, INT32_MIN};
            v = bad[(r->len_bad >> 4) % 4];
        }
        int32_t v32 = (int32_t)v;
        memcpy(len->data + 4 * b, &v32, 4);
    }
}

void link_mask(mask_buffers *mb, mha_mask *m)
{
    m->keep = mb->keep ? (const uint8_t *)mb->buf[0].data : NULL;
    m->bias = mb->bias ? (const float *)mb->buf[1].data : NULL;
    m->key_lengths = mb->lengths ? (const int32_t *)mb->buf[2].data : NULL;
}

/* The output buffer must hold the aliased mask array's bytes. */
void grow_for_mask_alias(int alias, const mask_buffers *mb,
                                buffer *out)
{
    if (!mask_aliased(alias, mb))
        return;
    const buffer *m = mb->bias ? &mb->buf[1] : &mb->buf[0];
    if (m->bytes > out->bytes) {
        buffer_free(out);
        buffer_alloc(out, m->bytes, 0);
    }
}

void alias_mask_into(int alias, const mask_buffers *mb, mha_mask *m,
                            void *out)
{
    if (!mask_aliased(alias, mb))
        return;
    if (mb->bias)
        m->bias = (const float *)out;
    else
        m->keep = (const uint8_t *)out;
}

/* Writes the requested specials; targets[t] may be NULL (no such input). */
void inject_specials(const special_request *r,
                            buffer *const targets[4],
                            const mha_dtype dtypes[4])
{
    for (unsigned n = 0; n < r->count; n++) {
        const uint8_t *e = r->at[n];
        buffer *b = targets[e[0] % 4];
        mha_dtype dt = dtypes[e[0] % 4];
        size_t elem = elem_size(dt);
        size_t count = b ? b->bytes / elem : 0;
        if (count == 0)
            continue;
        unsigned index = e[1] | (unsigned)e[2] << 8;
        unsigned run = 1 + ((e[3] >> 4) & 7) * 3, v = (e[3] & 15) % 12;
        const void *value = NULL;
        switch (dt) { /* exhaustive: a new dtype needs its specials */
        case MHA_F32: value = &special_values[v]; break;
        case MHA_F16: value = &special_f16[v]; break;
        case MHA_BF16: value = &special_bf16[v]; break;
        case MHA_I8:
        case MHA_FP8_E4M3:
        case MHA_FP8_E5M2: break; /* refused without scales: no specials */
        }
        if (!value) /* an invalid dtype code: the call is refused anyway */
            continue;
        for (unsigned i = 0; i < run; i++)
            memcpy(b->data + (index + i) % count * elem, value, elem);
        if (verbose > 0)
            fprintf(stderr, "special: target %u, elements %zu.. (x%u) of "
                    "%zu: class %u\n", e[0] % 4u, index % count, run, count,
                    v);
    }
}

void fill_values(buffer *b, mha_dtype dtype, uint64_t seed)
{
    test_rng s;
    rng_seed(&s, seed);
    size_t elem = elem_size(dtype);
    for (size_t i = 0; i + elem <= b->bytes; i += elem) {
        float x = rng_uniform(&s);
        uint16_t h = 0;
        switch (dtype) { /* exhaustive: a new dtype needs its encoder */
        case MHA_F32: memcpy(b->data + i, &x, 4); continue;
        case MHA_F16: mha_f32_to_f16(&x, 1, &h); break;
        case MHA_BF16: mha_f32_to_bf16(&x, 1, &h); break;
        case MHA_I8:
        case MHA_FP8_E4M3:
        case MHA_FP8_E5M2: /* any code */
            b->data[i] = (char)(rng_next(&s) >> 56);
            continue;
        }
        memcpy(b->data + i, &h, 2);
    }
}

int is_q8_dtype(mha_dtype dt)
{
    return dt == MHA_I8 || dt == MHA_FP8_E4M3 || dt == MHA_FP8_E5M2;
}

double q8_max(mha_dtype dt)
{
    return dt == MHA_I8 ? 127.0 : dt == MHA_FP8_E4M3 ? 448.0 : 57344.0;
}

uint8_t finite_code(mha_dtype dt, uint64_t bits)
{
    uint8_t c = (uint8_t)(bits >> 56);
    if (dt == MHA_FP8_E4M3 && (c & 0x7F) == 0x7F)
        c ^= 0x08; /* S.1111.111 (NaN) -> S.1110.111 */
    else if (dt == MHA_FP8_E5M2 && (c & 0x7C) == 0x7C)
        c ^= 0x04; /* S.11111.mm (inf, NaN) -> S.11110.mm */
    return c;
}

/* Snapshots the call's buffers and its mask's. */
void snapshot_all(buffer *bufs, int n, mask_buffers *mb)
{
    for (int i = 0; i < n; i++)
        buffer_snapshot(&bufs[i]);
    for (int i = 0; i < 3; i++)
        buffer_snapshot(&mb->buf[i]);
}

int engine_flush;

/* Bytes: ISA code, thread code (encoding.h; with flush_subnormals, which
 * engine_flush keeps for the oracle). NULL when creation failed
 * (as it must for the invalid codes). Every ISA of mha_isas() is a valid
 * request; mha_isa_available says whether it must succeed. */
mha_engine *make_engine(byte_reader *in, char *desc, size_t n)
{
    int null_config;
    mha_isa isa = isa_of_code(take8(in), &null_config);
    unsigned tcode = take8(in);
    mha_config config = {.num_threads = threads_of_code(tcode),
                         .isa = isa,
                         .flush_subnormals = flush_of_code(tcode)};
    engine_flush = !null_config && config.flush_subnormals;
    snprintf(desc, n, "isa=%s(%d) threads=%d%s",
             null_config ? "(config NULL)" : mha_isa_name(config.isa),
             (int)config.isa, config.num_threads,
             engine_flush ? " flush_subnormals" : "");
    mha_engine *const untouched = (mha_engine *)(uintptr_t)0x5a5a5a50u;
    mha_engine *engine = untouched;
    mha_status st = mha_engine_create(null_config ? NULL : &config, &engine);
    check_status_known(st);
    int isa_ok = null_config || isa_is_valid(config.isa);
    int threads_ok = null_config || (config.num_threads >= 0 &&
                                     config.num_threads <= MHA_MAX_THREADS);
    if (!isa_ok || !threads_ok) {
        REQUIRE(st == MHA_ERR_BAD_ARGUMENT || st == MHA_ERR_UNSUPPORTED);
    }
    /* x86-64 always has DAZ, AArch64 FPCR.FZ; elsewhere a flush may be
     * unsupported. */
#if defined(__x86_64__) || defined(__aarch64__)
    const int flush_ok = 1;
#else
    const int flush_ok = !engine_flush;
#endif
    /* A listed ISA runs exactly when it is available (generic always);
     * auto runs unless MHA_ISA names a table this build or CPU lacks. */
    int auto_isa = null_config || config.isa == MHA_ISA_AUTO;
    if (threads_ok && !auto_isa && isa_ok && flush_ok)
        REQUIRE((st == MHA_OK) == (mha_isa_available(config.isa) == 1));
    if (threads_ok && auto_isa && !getenv("MHA_ISA") && flush_ok)
        REQUIRE(st == MHA_OK);
    if (st != MHA_OK) {
        REQUIRE(engine == untouched);
        REQUIRE(st == MHA_ERR_BAD_ARGUMENT || st == MHA_ERR_UNSUPPORTED);
        REQUIRE(mha_last_error()[0] != '\0');
        return NULL;
    }
    REQUIRE(engine != NULL && engine != untouched);
    mha_isa got = mha_engine_isa(engine);
    REQUIRE(got != MHA_ISA_AUTO && isa_is_valid(got) &&
            mha_isa_available(got));
    REQUIRE(null_config || config.isa == MHA_ISA_AUTO || got == config.isa);
    REQUIRE(mha_engine_num_threads(engine) ==
            (null_config ? 0 : config.num_threads));
    return engine;
}
