/* A KV-cache decode loop, as a server runs it: prefill a prompt, then
 * generate tokens one at a time, appending each token's K and V to a
 * preallocated cache and attending with Lq = 1 and bottom-right causal
 * masking. The "model" is a stand-in that makes up each token's q, k and v;
 * the attention calls are the real ones. Prints tokens per second.
 *
 *   kv_cache [prompt] [new_tokens] [f32|f16|bf16|i8|fp8_e4m3|fp8_e5m2]
 *                                                       (default 512 256 f32)
 *
 * The 8-bit caches keep one fp32 scale per (token, kv head) row, computed
 * by mha_quantize as each token is appended.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mha.h"
#include "stand_in.h"

enum { H = 32, HKV = 8, D = 128 };

/* Writes token pos's k and v (all kv heads) into the cache; an 8-bit
 * cache also gets the rows' scales (ks, vs: [capacity, HKV]). */
static mha_status append(void *kc, void *vc, float *ks, float *vs,
                         mha_dtype dt, unsigned pos)
{
    size_t at = (size_t)pos * HKV * D;
    if (mha_dtype_size(dt) == 1) {
        float k[HKV * D], v[HKV * D];
        for (unsigned i = 0; i < HKV * D; i++)
            k[i] = act(pos, i, 1), v[i] = act(pos, i, 2);
        mha_tensor src = mha_tensor_bshd(k, 1, 1, HKV, D);
        mha_tensor dst = mha_tensor_bshd((char *)kc + at, 1, 1, HKV, D);
        dst.dtype = dt;
        dst.scales.stride_head = 1;
        mha_status st = mha_quantize(&src, &dst, ks + (size_t)pos * HKV);
        src.data = v, dst.data = (char *)vc + at;
        return st != MHA_OK ? st
                            : mha_quantize(&src, &dst, vs + (size_t)pos * HKV);
    }
    for (unsigned i = 0; i < HKV * D; i++) {
        float k = act(pos, i, 1), v = act(pos, i, 2);
        if (dt == MHA_F32) {
            ((float *)kc)[at + i] = k;
            ((float *)vc)[at + i] = v;
        } else {
            /* The library's conversions round to nearest even. */
            void (*narrow)(const float *, size_t, uint16_t *) =
                dt == MHA_F16 ? mha_f32_to_f16 : mha_f32_to_bf16;
            narrow(&k, 1, (uint16_t *)kc + at + i);
            narrow(&v, 1, (uint16_t *)vc + at + i);
        }
    }
    return MHA_OK;
}

int main(int argc, char **argv)
{
    int prompt = argc > 1 ? atoi(argv[1]) : 512;
    int gen = argc > 2 ? atoi(argv[2]) : 256;
    mha_dtype dt = MHA_F32;
    const mha_dtype kinds[] = {MHA_F32, MHA_F16, MHA_BF16, MHA_I8,
                               MHA_FP8_E4M3, MHA_FP8_E5M2};
    for (size_t i = 0; argc > 3 && i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(argv[3], mha_dtype_name(kinds[i])) == 0)
            dt = kinds[i];
    if (prompt < 1 || gen < 0)
        return 2;
    int capacity = prompt + gen;
    size_t esize = mha_dtype_size(dt);
    void *kc = malloc((size_t)capacity * HKV * D * esize);
    void *vc = malloc((size_t)capacity * HKV * D * esize);
    float *q = malloc(sizeof(float) * (size_t)prompt * H * D);
    float *out = malloc(sizeof(float) * (size_t)prompt * H * D);
    float *ks = malloc(sizeof(float) * (size_t)capacity * HKV);
    float *vs = malloc(sizeof(float) * (size_t)capacity * HKV);
    if (!kc || !vc || !q || !out || !ks || !vs)
        return 1;

    mha_engine *engine;
    mha_status st = mha_engine_create(NULL, &engine);
    mha_mask mask = {0};
    mask.causal = MHA_CAUSAL_BOTTOM_RIGHT;
    mha_attention_args a = {0};
    a.mask = &mask;

    /* Prefill: the whole prompt attends to itself. */
    for (int t = 0; t < prompt && st == MHA_OK; t++) {
        st = append(kc, vc, ks, vs, dt, (unsigned)t);
        for (unsigned i = 0; i < H * D; i++)
            q[(size_t)t * H * D + i] = act((unsigned)t, i, 3);
    }
    double t0 = now();
    /* The cache is [capacity, HKV, D]; a view covers its first len rows. */
    a.q = mha_tensor_bshd(q, 1, prompt, H, D);
    a.k = mha_tensor_bshd(kc, 1, prompt, HKV, D);
    a.v = mha_tensor_bshd(vc, 1, prompt, HKV, D);
    a.k.dtype = a.v.dtype = dt;
    if (mha_dtype_size(dt) == 1) { /* one scale per (token, kv head) */
        a.k.scales = (mha_scales){ks, 0, HKV, 1};
        a.v.scales = (mha_scales){vs, 0, HKV, 1};
    }
    a.out = mha_tensor_bshd(out, 1, prompt, H, D);
    if (st == MHA_OK)
        st = mha_attention(engine, &a);
    double t1 = now();

    /* Decode: one new token at a time against the growing cache. */
    double checksum = 0;
    for (int t = prompt; t < capacity && st == MHA_OK; t++) {
        if ((st = append(kc, vc, ks, vs, dt, (unsigned)t)) != MHA_OK)
            break;
        for (unsigned i = 0; i < H * D; i++)
            q[i] = act((unsigned)t, i, 3);
        a.q = mha_tensor_bshd(q, 1, 1, H, D);
        a.k.seq = a.v.seq = t + 1;
        a.out = mha_tensor_bshd(out, 1, 1, H, D);
        st = mha_attention(engine, &a);
        checksum += out[0];
    }
    double t2 = now();
    if (st != MHA_OK) {
        fprintf(stderr, "libmha: %s: %s\n", mha_status_string(st),
                mha_last_error());
        return 1;
    }
    printf("isa %s, K/V %s, H=%d over %d kv heads, d=%d\n",
           mha_isa_name(mha_engine_isa(engine)),
           mha_dtype_name(dt), H, HKV, D);
    printf("prefill %d tokens: %.1f ms\n", prompt, 1e3 * (t1 - t0));
    printf("decode %d tokens (cache %d..%d): %.1f tokens/s, checksum %.6f\n",
           gen, prompt + 1, capacity, gen / (t2 - t1), checksum);
    mha_engine_destroy(engine);
    free(kc), free(vc), free(q), free(out), free(ks), free(vs);
    return 0;
}
