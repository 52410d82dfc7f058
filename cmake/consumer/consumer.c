/* C consumer of the installed libmha: built with pkg-config (shared) and
 * with CMake's mha::mha_static. A causal mask over one head: query 0 sees
 * key 0 only, so its output is v's first row. */
#include <mha.h>

#include <math.h>
#include <stdio.h>

int main(void)
{
    float q[2 * 4], k[2 * 4], v[2 * 4], out[2 * 4];
    for (int i = 0; i < 8; i++) {
        q[i] = 0.25f * (float)(i % 3);
        k[i] = 0.5f - 0.125f * (float)i;
        v[i] = (float)i;
    }
    mha_engine *engine;
    if (mha_engine_create(NULL, &engine) != MHA_OK)
        return 1;
    mha_attention_args a = {0};
    a.q = mha_tensor_bshd(q, 1, 2, 1, 4);
    a.k = mha_tensor_bshd(k, 1, 2, 1, 4);
    a.v = mha_tensor_bshd(v, 1, 2, 1, 4);
    a.out = mha_tensor_bshd(out, 1, 2, 1, 4);
    mha_mask mask = {0};
    mask.causal = MHA_CAUSAL_TOP_LEFT;
    a.mask = &mask;
    mha_status st = mha_attention(engine, &a);
    if (st != MHA_OK) {
        fprintf(stderr, "%s: %s\n", mha_status_string(st), mha_last_error());
        return 1;
    }
    /* A bad call reports the library's message. */
    a.k.heads = 3;
    st = mha_attention(engine, &a);
    int ok = st == MHA_ERR_BAD_SHAPE && mha_last_error()[0] != '\0';
    for (int c = 0; c < 4; c++)
        ok = ok && fabsf(out[c] - v[c]) == 0.0f;
    printf("libmha %s: causal row 0 = v row 0: %s; bad call: %s\n", mha_version(),
           ok ? "yes" : "NO", mha_last_error());
    mha_engine_destroy(engine);
    return ok ? 0 : 1;
}
