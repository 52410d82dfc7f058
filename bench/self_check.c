/* The BLAS baseline must compute what mha_attention computes, or a ratio to
 * it means nothing: compare them on small shapes that reach the edges. */
#include <math.h>

#include "internal.h"
#include "shim.h"
#include "support.h"

static int compare(const bench_spec *spec)
{
    bench_spec blas = *spec;
    blas.impl = BENCH_IMPL_BLAS;
    bench_case *want = bench_case_create(&blas);
    bench_case *got = want ? bench_case_create(spec) : NULL;
    int rc = -1;
    if (!want || !got || bench_case_run(want) != 0 || bench_case_run(got) != 0)
        goto done; /* the message is already recorded */
    size_t n = 0, n_got = 0;
    const float *w = bench_case_output(want, &n);
    const float *g = bench_case_output(got, &n_got);
    rc = 0;
    for (size_t i = 0; i < n && rc == 0; ++i) {
        const double err = fabs((double)g[i] - (double)w[i]);
        if (!(err <= TOL_BLAS_ABS + TOL_BLAS_REL * fabs((double)w[i])))
            rc = bench_fail(
                "self-check: %s, B%lld H%lld KV%lld Lq%lld Lk%lld D%lld "
                "causal %d layout %d: element %zu is %g, OpenBLAS gives %g",
                mha_isa_name(spec->isa), (long long)spec->batch,
                (long long)spec->heads, (long long)spec->kv_heads,
                (long long)spec->lq, (long long)spec->lk, (long long)spec->d,
                (int)spec->causal, (int)spec->layout, i, (double)g[i],
                (double)w[i]);
    }
done:
    bench_case_destroy(got);
    bench_case_destroy(want);
    return rc;
}

int bench_self_check(void)
{
    if (!bench_have_blas())
        return 0;
    /* GQA with odd sizes; causal both ways, including query rows that see
     * no key (bottom-right with Lq > Lk); decode; both layouts. */
    static const struct {
        int64_t b, h, hkv, lq, lk, d;
        mha_causal causal;
        bench_layout layout;
    } shapes[] = {
        {2, 4, 2, 33, 70, 16, MHA_CAUSAL_NONE, BENCH_LAYOUT_BSHD},
        {2, 4, 2, 33, 70, 16, MHA_CAUSAL_BOTTOM_RIGHT, BENCH_LAYOUT_BHSD},
        {1, 3, 3, 40, 20, 8, MHA_CAUSAL_BOTTOM_RIGHT, BENCH_LAYOUT_BSHD},
        {1, 2, 1, 65, 65, 32, MHA_CAUSAL_TOP_LEFT, BENCH_LAYOUT_BSHD},
        {3, 8, 2, 1, 300, 32, MHA_CAUSAL_NONE, BENCH_LAYOUT_BSHD},
    };
    mha_isa isas[TEST_MAX_ISAS];
    const int n_isa = available_isas(isas);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; ++i) {
        for (int a = 0; a < n_isa; ++a) {
            const bench_spec spec = {.impl = BENCH_IMPL_ATTENTION,
                                     .batch = shapes[i].b,
                                     .heads = shapes[i].h,
                                     .kv_heads = shapes[i].hkv,
                                     .lq = shapes[i].lq,
                                     .lk = shapes[i].lk,
                                     .d = shapes[i].d,
                                     .causal = shapes[i].causal,
                                     .layout = shapes[i].layout,
                                     .isa = isas[a],
                                     .threads = 2};
            if (compare(&spec) != 0)
                return -1;
        }
    }
    return 0;
}
