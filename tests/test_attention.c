/*
 * mha_attention against the oracle over the shape grid of issue 2, on every
 * available ISA.
 *
 * The full cartesian product of the axes is far too slow, so the grid is a
 * pairwise covering: every value of every axis meets every value of every
 * other axis in at least one case (the test `grid_covers_every_pair` checks
 * this). The cases are built greedily (AETG style): start from an uncovered
 * pair, then give each other axis the value that covers the most new pairs,
 * among the values that keep the case's cost (multiply-adds of the oracle)
 * under a cap. A few hand-picked serving shapes follow the generated ones.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

enum { AX_D, AX_DV, AX_LQ, AX_LK, AX_B, AX_HEADS, AX_LAYOUT, AX_CAUSAL,
       AX_WEIGHTS, AX_SCALE, N_AXES };

static const int64_t D_VALUES[] = {1, 3, 8, 64, 80, 128, 256};
static const int64_t L_VALUES[] = {1, 2, 7, 17, 64, 65, 200, 1031};
static const int64_t B_VALUES[] = {1, 3};
static const int64_t HEADS[][2] = {{1, 1}, {2, 1}, {2, 2}, {8, 1},
                                   {8, 2}, {8, 4}, {8, 8}};
/* Layouts of q, k, v, out; the last row mixes them. */
static const test_layout LAYOUTS[][4] = {
    {LAYOUT_BSHD, LAYOUT_BSHD, LAYOUT_BSHD, LAYOUT_BSHD},
    {LAYOUT_BHSD, LAYOUT_BHSD, LAYOUT_BHSD, LAYOUT_BHSD},
    {LAYOUT_PAD_BSHD, LAYOUT_PAD_BSHD, LAYOUT_PAD_BSHD, LAYOUT_PAD_BSHD},
    {LAYOUT_PAD_BHSD, LAYOUT_PAD_BHSD, LAYOUT_PAD_BHSD, LAYOUT_PAD_BHSD},
    {LAYOUT_BHSD, LAYOUT_PAD_BSHD, LAYOUT_BSHD, LAYOUT_PAD_BHSD},
};
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const int AXIS_SIZE[N_AXES] = {
    [AX_D] = COUNT(D_VALUES), [AX_DV] = 2,
    [AX_LQ] = COUNT(L_VALUES), [AX_LK] = COUNT(L_VALUES),
    [AX_B] = COUNT(B_VALUES), [AX_HEADS] = COUNT(HEADS),
    [AX_LAYOUT] = COUNT(LAYOUTS), [AX_CAUSAL] = 3,
    [AX_WEIGHTS] = 2, [AX_SCALE] = 2,
};

/* Oracle multiply-adds a generated case may cost (B*H*Lq*Lk*(d+dv)). */
#define GRID_COST_CAP 12e6
#define MAX_VALUES 8
#define MAX_CASES 256

typedef struct attn_case {
    int64_t d, dv, lq, lk, b, h, hkv;
    int layout;        /* row of LAYOUTS */
    mha_causal causal;
    int weights;       /* ask for the weights output */
    float scale;       /* 0: default */
} attn_case;

/* dv of the "other" value of AX_DV: differs from d, odd where it can be. */
static int64_t other_dv(int64_t d)
{
    return d == 1 ? 3 : d / 2 + 1;
}

static attn_case case_of(const int v[N_AXES])
{
    attn_case c = {
        .d = D_VALUES[v[AX_D]],
        .lq = L_VALUES[v[AX_LQ]],
        .lk = L_VALUES[v[AX_LK]],
        .b = B_VALUES[v[AX_B]],
        .h = HEADS[v[AX_HEADS]][0],
        .hkv = HEADS[v[AX_HEADS]][1],
        .layout = v[AX_LAYOUT],
        .causal = (mha_causal)v[AX_CAUSAL],
        .weights = v[AX_WEIGHTS],
        .scale = v[AX_SCALE] ? 0.3f : 0.0f,
    };
    c.dv = v[AX_DV] ? other_dv(c.d) : c.d;
    return c;
}

static double case_cost(const attn_case *c)
{
    return (double)c->b * (double)c->h * (double)c->lq * (double)c->lk *
           (double)(c->d + c->dv);
}

/* The cheapest cost of any completion of v, whose unset axes are -1. */
static double min_completion_cost(const int v[N_AXES])
{
    int w[N_AXES];
    memcpy(w, v, sizeof w);
    for (int a = 0; a < N_AXES; a++)
        if (a != AX_D && a != AX_DV && w[a] < 0)
            w[a] = 0; /* index 0 is the cheapest value of every other axis */
    double best = INFINITY;
    for (int d = 0; d < AXIS_SIZE[AX_D]; d++) {
        if (v[AX_D] >= 0 && d != v[AX_D])
            continue;
        for (int dv = 0; dv < 2; dv++) {
            if (v[AX_DV] >= 0 && dv != v[AX_DV])
                continue;
            w[AX_D] = d;
            w[AX_DV] = dv;
            attn_case c = case_of(w);
            double cost = case_cost(&c);
            if (cost < best)
                best = cost;
        }
    }
    return best;
}

typedef struct pair_set {
    unsigned char covered[N_AXES][N_AXES][MAX_VALUES][MAX_VALUES];
} pair_set;

static void cover(pair_set *p, const int v[N_AXES])
{
    for (int a = 0; a < N_AXES; a++)
        for (int b = a + 1; b < N_AXES; b++)
            p->covered[a][b][v[a]][v[b]] = 1;
}

/* Pairs newly covered by giving axis `axis` the value `val` in v. */
static int new_pairs(const pair_set *p, const int v[N_AXES], int axis,
                     int val)
{
    int n = 0;
    for (int o = 0; o < N_AXES; o++) {
        if (o == axis || v[o] < 0)
            continue;
        int a = o < axis ? o : axis, b = o < axis ? axis : o;
        int va = o < axis ? v[o] : val, vb = o < axis ? val : v[o];
        n += !p->covered[a][b][va][vb];
    }
    return n;
}

static int first_uncovered(const pair_set *p, int v[N_AXES])
{
    for (int a = 0; a < N_AXES; a++)
        for (int b = a + 1; b < N_AXES; b++)
            for (int x = 0; x < AXIS_SIZE[a]; x++)
                for (int y = 0; y < AXIS_SIZE[b]; y++)
                    if (!p->covered[a][b][x][y]) {
                        for (int i = 0; i < N_AXES; i++)
                            v[i] = -1;
                        v[a] = x;
                        v[b] = y;
                        return 1;
                    }
    return 0;
}

static attn_case grid[MAX_CASES];
static int grid_len;

/* Serving shapes the pairwise grid would not produce on its own. */
static const attn_case EXTRA_CASES[] = {
    /* decode with GQA, long cache */
    {.d = 128, .dv = 128, .lq = 1, .lk = 1031, .b = 3, .h = 8, .hkv = 2,
     .layout = 0, .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
    /* causal prefill */
    {.d = 64, .dv = 64, .lq = 200, .lk = 200, .b = 1, .h = 8, .hkv = 8,
     .layout = 1, .causal = MHA_CAUSAL_TOP_LEFT, .weights = 0},
    /* chunked prefill against a longer cache */
    {.d = 80, .dv = 80, .lq = 65, .lk = 1031, .b = 3, .h = 2, .hkv = 1,
     .layout = 3, .causal = MHA_CAUSAL_BOTTOM_RIGHT, .weights = 1},
    /* long square, both alignments coincide */
    {.d = 8, .dv = 8, .lq = 1031, .lk = 1031, .b = 1, .h = 2, .hkv = 1,
     .layout = 4, .causal = MHA_CAUSAL_TOP_LEFT, .weights = 1},
    {.d = 256, .dv = 256, .lq = 17, .lk = 65, .b = 3, .h = 8, .hkv = 4,
     .layout = 2, .causal = MHA_CAUSAL_NONE, .weights = 1, .scale = 0.05f},
};

static void build_grid(void)
{
    static pair_set pairs; /* large: keep it off the stack */
    memset(&pairs, 0, sizeof pairs);
    int v[N_AXES];
    grid_len = 0;
    while (first_uncovered(&pairs, v)) {
        if (min_completion_cost(v) > GRID_COST_CAP) {
            /* Runs before any test: Check's asserts are not usable yet. */
            fprintf(stderr, "attention grid: a pair costs over the cap\n");
            abort();
        }
        for (int a = 0; a < N_AXES; a++) {
            if (v[a] >= 0)
                continue;
            int best = -1, best_new = -1;
            double best_cost = INFINITY;
            for (int x = 0; x < AXIS_SIZE[a]; x++) {
                v[a] = x;
                double cost = min_completion_cost(v);
                if (cost > GRID_COST_CAP)
                    continue;
                int n = new_pairs(&pairs, v, a, x);
                if (n > best_new || (n == best_new && cost < best_cost)) {
                    best = x;
                    best_new = n;
                    best_cost = cost;
                }
            }
            v[a] = best;
        }
        cover(&pairs, v);
        if (grid_len + COUNT(EXTRA_CASES) >= MAX_CASES) {
            fprintf(stderr, "attention grid: more than %d cases\n",
                    MAX_CASES);
            abort();
        }
        grid[grid_len++] = case_of(v);
    }
    for (int i = 0; i < COUNT(EXTRA_CASES); i++)
        grid[grid_len++] = EXTRA_CASES[i];
}

static void describe(const attn_case *c, char *buf, size_t n)
{
    static const char *causal[] = {"none", "top-left", "bottom-right"};
    snprintf(buf, n,
             "B %lld Lq %lld Lk %lld H %lld Hkv %lld d %lld dv %lld "
             "layout %d causal %s weights %d scale %g",
             (long long)c->b, (long long)c->lq, (long long)c->lk,
             (long long)c->h, (long long)c->hkv, (long long)c->d,
             (long long)c->dv, c->layout, causal[c->causal], c->weights,
             (double)c->scale);
}

START_TEST(grid_case)
{
    const attn_case *c = &grid[_i];
    char what[256];
    describe(c, what, sizeof what);
    test_rng r;
    rng_seed(&r, 1000 + (uint64_t)_i);

    const test_layout *lay = LAYOUTS[c->layout];
    int64_t shape[4][4] = {
        {c->b, c->lq, c->h, c->d},
        {c->b, c->lk, c->hkv, c->d},
        {c->b, c->lk, c->hkv, c->dv},
        {c->b, c->lq, c->h, c->dv},
    };
    float *buf[4];
    size_t floats[4];
    mha_tensor view[4];
    for (int t = 0; t < 4; t++) {
        floats[t] = layout_floats(lay[t], shape[t][0], shape[t][1],
                                  shape[t][2], shape[t][3]);
        /* Inputs: random everywhere, padding included (it must be unread);
         * out: check_attention fills it. */
        buf[t] = random_floats(&r, floats[t]);
        view[t] = layout_view(lay[t], buf[t], shape[t][0], shape[t][1],
                              shape[t][2], shape[t][3]);
    }
    mha_mask mask = {.causal = c->causal};
    mha_attention_args args = {.q = view[0], .k = view[1], .v = view[2],
                               .out = view[3], .scale = c->scale,
                               .mask = c->causal ? &mask : NULL};
    check_attention(&args, floats[3], c->weights, 0, what);
    for (int t = 0; t < 4; t++)
        free(buf[t]);
}
END_TEST

START_TEST(grid_covers_every_pair)
{
    /* Map every case back to axis values and count the pairs it meets. */
    static unsigned char seen[N_AXES][N_AXES][MAX_VALUES][MAX_VALUES];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < grid_len; i++) {
        const attn_case *c = &grid[i];
        int v[N_AXES];
        for (int a = 0; a < N_AXES; a++)
            v[a] = -1;
        for (int x = 0; x < AXIS_SIZE[AX_D]; x++)
            if (D_VALUES[x] == c->d)
                v[AX_D] = x;
        v[AX_DV] = c->dv != c->d;
        for (int x = 0; x < COUNT(L_VALUES); x++) {
            if (L_VALUES[x] == c->lq)
                v[AX_LQ] = x;
            if (L_VALUES[x] == c->lk)
                v[AX_LK] = x;
        }
        v[AX_B] = c->b == B_VALUES[1];
        for (int x = 0; x < COUNT(HEADS); x++)
            if (HEADS[x][0] == c->h && HEADS[x][1] == c->hkv)
                v[AX_HEADS] = x;
        v[AX_LAYOUT] = c->layout;
        v[AX_CAUSAL] = (int)c->causal;
        v[AX_WEIGHTS] = c->weights;
        v[AX_SCALE] = c->scale != 0.0f;
        for (int a = 0; a < N_AXES; a++) {
            ck_assert_msg(v[a] >= 0, "case %d: axis %d off the grid", i, a);
            for (int b = a + 1; b < N_AXES; b++)
                seen[a][b][v[a]][v[b]] = 1;
        }
    }
    for (int a = 0; a < N_AXES; a++)
        for (int b = a + 1; b < N_AXES; b++)
            for (int x = 0; x < AXIS_SIZE[a]; x++)
                for (int y = 0; y < AXIS_SIZE[b]; y++)
                    ck_assert_msg(seen[a][b][x][y],
                                  "axes %d=%d and %d=%d never meet", a, x, b,
                                  y);
    /* Every Hkv divides its H (the HEADS table is the list). */
    for (int x = 0; x < COUNT(HEADS); x++)
        ck_assert_int_eq(HEADS[x][0] % HEADS[x][1], 0);
}
END_TEST

/* Keys and values shared by every batch through a batch stride of 0, and
 * queries broadcast over the sequence: inputs may overlap themselves. */
START_TEST(broadcast_input_strides)
{
    const int64_t B = 3, Lq = 7, Lk = 65, H = 2, Hkv = 1, d = 17, dv = 9;
    test_rng r;
    rng_seed(&r, 77);
    float *q = random_floats(&r, (size_t)(B * H * d));
    float *k = random_floats(&r, (size_t)(Lk * Hkv * d));
    float *v = random_floats(&r, (size_t)(Lk * Hkv * dv));
    size_t n_out = layout_floats(LAYOUT_PAD_BSHD, B, Lq, H, dv);
    float *out = test_alloc(n_out * sizeof *out);
    mha_attention_args args = {
        .q = {.data = q, .batch = B, .seq = Lq, .heads = H, .dim = d,
              .stride_batch = H * d, .stride_seq = 0, .stride_head = d},
        .k = {.data = k, .batch = B, .seq = Lk, .heads = Hkv, .dim = d,
              .stride_batch = 0, .stride_seq = Hkv * d, .stride_head = d},
        .v = {.data = v, .batch = B, .seq = Lk, .heads = Hkv, .dim = dv,
              .stride_batch = 0, .stride_seq = Hkv * dv, .stride_head = dv},
        .out = layout_view(LAYOUT_PAD_BSHD, out, B, Lq, H, dv),
    };
    check_attention(&args, n_out, 1, 0, "broadcast strides");
    free(q), free(k), free(v), free(out);
}
END_TEST

/* The query layout never changes a bit of the output: q as [B, L, H, D]
 * (rows H x d apart, which the prefill stream copies together where they
 * crowd the L1 sets: 16 heads of 64 and 8 of 128 are 4 KiB apart, 8 of 64
 * 2 KiB (copied on an 8-way L1, not on a 12-way), 12 of 64 3 KiB) against
 * the same values as [B, H, L, D], on
 * every ISA, fp32 and bf16 compute, dense and causal (whose diagonal
 * blocks are cut into row sub-blocks of the copied rows). */
static const int64_t SAME_BITS_SHAPES[][2] = {{16, 64}, {8, 128}, {8, 64},
                                              {12, 64}};

START_TEST(q_layout_same_bits)
{
    const int64_t H = SAME_BITS_SHAPES[_i / 4][0];
    const int64_t d = SAME_BITS_SHAPES[_i / 4][1];
    const mha_dtype dt = _i % 2 ? MHA_BF16 : MHA_F32;
    const mha_causal causal = _i / 2 % 2 ? MHA_CAUSAL_TOP_LEFT : MHA_CAUSAL_NONE;
    const int64_t B = 2, Lq = 150, Lk = 300;
    test_rng r;
    rng_seed(&r, 4242 + (uint64_t)_i);
    size_t nq = (size_t)(B * Lq * H * d), nk = (size_t)(B * Lk * H * d);
    float *qs = random_floats(&r, nq), *qh = test_alloc(nq * sizeof *qh);
    float *k = random_floats(&r, nk), *v = random_floats(&r, nk);
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Lq; i++)
            for (int64_t h = 0; h < H; h++)
                memcpy(qh + ((b * H + h) * Lq + i) * d,
                       qs + ((b * Lq + i) * H + h) * d,
                       (size_t)d * sizeof *qh);
    void *q_bshd = as_dtype(qs, nq, dt), *q_bhsd = as_dtype(qh, nq, dt);
    void *kt = as_dtype(k, nk, dt), *vt = as_dtype(v, nk, dt);
    size_t ob = nq * mha_dtype_size(dt);
    char *o1 = test_alloc(ob), *o2 = test_alloc(ob);
    mha_mask mask = {.causal = causal};
    mha_attention_args a = {
        .k = mha_tensor_bshd_typed(kt, dt, B, Lk, H, d),
        .v = mha_tensor_bshd_typed(vt, dt, B, Lk, H, d),
        .mask = &mask,
    };
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int x = 0; x < n_isa; x++) {
        mha_engine *e = make_engine(isas[x], 1);
        memset(o1, 0, ob);
        memset(o2, 0x55, ob);
        a.q = mha_tensor_bshd_typed(q_bshd, dt, B, Lq, H, d);
        a.out = mha_tensor_bshd_typed(o1, dt, B, Lq, H, d);
        ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
        a.q = mha_tensor_bhsd_typed(q_bhsd, dt, B, Lq, H, d);
        a.out = mha_tensor_bshd_typed(o2, dt, B, Lq, H, d);
        ck_assert_int_eq(mha_attention(e, &a), MHA_OK);
        for (size_t i = 0; i < ob; i++)
            REQUIRE(o1[i] == o2[i],
                    "[%s] H %lld d %lld %s %s: output byte %zu differs "
                    "between q [B, L, H, D] and [B, H, L, D]",
                    mha_isa_name(isas[x]), (long long)H, (long long)d,
                    mha_dtype_name(dt), causal ? "causal" : "dense", i);
        mha_engine_destroy(e);
    }
    free(qs), free(qh), free(k), free(v), free(q_bshd), free(q_bhsd);
    free(kt), free(vt), free(o1), free(o2);
}
END_TEST

Suite *suite_attention(void)
{
    build_grid();
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("grid");
    tcase_add_test(tc, grid_covers_every_pair);
    tcase_add_loop_test(tc, grid_case, 0, grid_len);
    tcase_add_test(tc, broadcast_input_strides);
    tcase_add_loop_test(tc, q_layout_same_bits, 0,
                        4 * COUNT(SAME_BITS_SHAPES));
    suite_add_tcase(s, tc);
    return s;
}
