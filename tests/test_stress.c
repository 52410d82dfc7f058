/*
 * Concurrency stress. 16 caller threads run for a bounded time
 * (MHA_STRESS_SECONDS, default 2.5) and each call picks at random:
 *   - a job: attention of several shapes (prefill with GQA, decode over a
 *     long cache, half-precision K/V, look-ahead bias, fully masked rows,
 *     strided layouts, weights output) or a layer (self-attention with
 *     packed projections, cross-attention with kdim != vdim != E);
 *   - an ISA: every one this build and CPU run, all at the same time;
 *   - an engine: the ISA's shared engine (and its shared layers), or the
 *     thread's own, which it destroys and re-creates with another thread
 *     count every few calls.
 * Every result (out and weights) must be bitwise equal to the one computed
 * serially beforehand on a one-thread engine of the same ISA; those serial
 * results are themselves checked against the double-precision oracle.
 * Interleaved invalid calls check that each thread reads its
 * own mha_last_error message.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "oracle.h"
#include "util.h"

enum {
    CALLERS = 16,
    MAX_ISAS = TEST_MAX_ISAS,
    RECREATE_EVERY = 16,
    BAD_CALL_EVERY = 5
};

enum {
    M_TOP_LEFT = 1,
    M_BOTTOM_RIGHT = 2,
    M_KEEP = 4,       /* [B, 1, Lq, Lk], about 30% masked */
    M_KEEP_ROWS = 8,  /* [B, 1, Lq, Lk], every third query row masked */
    M_BIAS = 16,      /* [B, H, Lq, Lk], some -inf */
    M_LOOKAHEAD = 32, /* bias [1, 1, Lq, Lk] */
    M_LENGTHS = 64
};

enum { ATTENTION, LAYER_SELF, LAYER_CROSS };

typedef struct {
    const char *name;
    int kind;
    int64_t b, lq, lk, h, hkv, d, dv; /* layers: h, d, dv unused */
    mha_dtype kt, vt;
    unsigned masks;
    int weights;
    test_layout layout; /* of q, k and v; out is packed BSHD */
    float scale;
} job_spec;

static const job_spec specs[] = {
    {"prefill GQA causal bias", ATTENTION, 2, 33, 33, 4, 2, 32, 32, MHA_F32,
     MHA_F32, M_TOP_LEFT | M_BIAS, 1, LAYOUT_PAD_BSHD, 0.0f},
    {"decode long cache", ATTENTION, 3, 1, 300, 8, 2, 64, 64, MHA_F32,
     MHA_F32, M_BOTTOM_RIGHT | M_LENGTHS, 0, LAYOUT_BSHD, 0.0f},
    {"f16 cross keep", ATTENTION, 1, 17, 70, 2, 2, 24, 24, MHA_F16, MHA_F16,
     M_KEEP, 1, LAYOUT_BHSD, 0.0f},
    {"bf16 k look-ahead", ATTENTION, 2, 40, 40, 3, 1, 16, 40, MHA_BF16,
     MHA_F32, M_LOOKAHEAD | M_BOTTOM_RIGHT, 0, LAYOUT_PAD_BHSD, -0.3f},
    {"masked rows weights", ATTENTION, 2, 9, 12, 2, 1, 8, 8, MHA_F32,
     MHA_F32, M_KEEP_ROWS | M_LENGTHS, 1, LAYOUT_BHSD, 0.0f},
    {"odd depth no mask", ATTENTION, 1, 7, 129, 5, 5, 3, 17, MHA_F32,
     MHA_F32, 0, 0, LAYOUT_PAD_BSHD, 0.0f},
    {"layer self causal", LAYER_SELF, 2, 20, 20, 0, 0, 0, 0, MHA_F32,
     MHA_F32, M_TOP_LEFT, 1, LAYOUT_BSHD, 0.0f},
    {"layer cross lengths", LAYER_CROSS, 3, 9, 31, 0, 0, 0, 0, MHA_F32,
     MHA_F32, M_LENGTHS | M_KEEP, 0, LAYOUT_BSHD, 0.0f},
};
enum { NJOBS = sizeof specs / sizeof specs[0] };

/* The layers' shapes. */
#define SELF_E 48
#define SELF_H 4
#define CROSS_E 32
#define CROSS_H 2
#define CROSS_KDIM 20
#define CROSS_VDIM 12

/* A job's inputs, built once and only read afterwards. */
typedef struct {
    mha_attention_args args; /* out.data and weights set per call */
    mha_mask mask;
    const float *query, *key, *value; /* layers */
    size_t out_floats, w_floats;
    void *owned[8];
    int n_owned;
} job;

typedef struct {
    int n_isa;
    mha_isa isas[MAX_ISAS];
    job jobs[NJOBS];
    mha_layer_desc self_desc, cross_desc;
    void *owned[8];
    int n_owned;
    /* per ISA: shared engine and layers, serial results */
    mha_engine *shared[MAX_ISAS];
    mha_layer *shared_self[MAX_ISAS], *shared_cross[MAX_ISAS];
    float *want_out[MAX_ISAS][NJOBS], *want_w[MAX_ISAS][NJOBS];
    struct timespec deadline;
} world;

static void *keep_ptr(void **list, int *n, void *p)
{
    list[(*n)++] = p;
    return p;
}

static float *job_floats(job *j, test_rng *r, size_t n)
{
    return keep_ptr(j->owned, &j->n_owned, random_floats(r, n));
}

/* Half-precision values in [-1, 1], narrowed by the library's own
 * conversion (checked against the reference decoders in the api suite). */
static uint16_t *half_bits(job *j, test_rng *r, size_t n, mha_dtype t)
{
    uint16_t *x = keep_ptr(j->owned, &j->n_owned, test_alloc(n * 2));
    float *f = random_floats(r, n);
    if (t == MHA_F16)
        mha_f32_to_f16(f, n, x);
    else
        mha_f32_to_bf16(f, n, x);
    free(f);
    return x;
}

static mha_tensor input_view(job *j, test_rng *r, const job_spec *s,
                             int64_t seq, int64_t heads, int64_t dim,
                             mha_dtype t)
{
    size_t n = layout_floats(s->layout, s->b, seq, heads, dim);
    mha_tensor v = layout_view(s->layout, NULL, s->b, seq, heads, dim);
    v.dtype = t;
    v.data = t == MHA_F32 ? (void *)job_floats(j, r, n)
                          : (void *)half_bits(j, r, n, t);
    return v;
}

static void build_mask(job *j, test_rng *r, const job_spec *s, int64_t heads)
{
    const int64_t B = s->b, Lq = s->lq, Lk = s->lk;
    mha_mask *m = &j->mask;
    memset(m, 0, sizeof *m);
    m->causal = s->masks & M_TOP_LEFT       ? MHA_CAUSAL_TOP_LEFT
                : s->masks & M_BOTTOM_RIGHT ? MHA_CAUSAL_BOTTOM_RIGHT
                                            : MHA_CAUSAL_NONE;
    if (s->masks & (M_KEEP | M_KEEP_ROWS)) {
        uint8_t *keep = keep_ptr(j->owned, &j->n_owned,
                                 test_alloc((size_t)(B * Lq * Lk)));
        for (int64_t i = 0; i < B * Lq * Lk; i++) {
            int64_t row = i / Lk % Lq;
            keep[i] = s->masks & M_KEEP_ROWS ? row % 3 != 0
                                             : rng_uniform(r) > -0.4f;
        }
        m->keep = keep;
        m->keep_stride_batch = Lq * Lk, m->keep_stride_query = Lk;
    }
    if (s->masks & (M_BIAS | M_LOOKAHEAD)) {
        int64_t n = s->masks & M_BIAS ? B * heads * Lq * Lk : Lq * Lk;
        float *bias = job_floats(j, r, (size_t)n);
        for (int64_t i = 0; i < n; i += 11)
            bias[i] = -INFINITY;
        m->bias = bias;
        m->bias_stride_query = Lk;
        if (s->masks & M_BIAS) {
            m->bias_stride_head = Lq * Lk;
            m->bias_stride_batch = heads * Lq * Lk;
        }
    }
    if (s->masks & M_LENGTHS) {
        int32_t *len = keep_ptr(j->owned, &j->n_owned,
                                test_alloc((size_t)B * sizeof(int32_t)));
        for (int64_t b = 0; b < B; b++)
            len[b] = (int32_t)(b == 0 ? Lk : b == 1 ? Lk / 3 : 0);
        m->key_lengths = len;
    }
}

static void build_job(job *j, test_rng *r, const job_spec *s)
{
    memset(j, 0, sizeof *j);
    if (s->kind == ATTENTION) {
        j->args.q = input_view(j, r, s, s->lq, s->h, s->d, MHA_F32);
        j->args.k = input_view(j, r, s, s->lk, s->hkv, s->d, s->kt);
        j->args.v = input_view(j, r, s, s->lk, s->hkv, s->dv, s->vt);
        j->args.out = mha_tensor_bshd(NULL, s->b, s->lq, s->h, s->dv);
        j->args.scale = s->scale;
        build_mask(j, r, s, s->h);
        j->args.mask = &j->mask;
        j->out_floats = (size_t)(s->b * s->lq * s->h * s->dv);
        j->w_floats = (size_t)(s->b * s->h * s->lq * s->lk);
        return;
    }
    const int self = s->kind == LAYER_SELF;
    const int64_t E = self ? SELF_E : CROSS_E, H = self ? SELF_H : CROSS_H;
    j->query = job_floats(j, r, (size_t)(s->b * s->lq * E));
    if (self) { /* one pointer for query, key and value */
        j->key = j->value = j->query;
    } else {
        j->key = job_floats(j, r, (size_t)(s->b * s->lk * CROSS_KDIM));
        j->value = job_floats(j, r, (size_t)(s->b * s->lk * CROSS_VDIM));
    }
    build_mask(j, r, s, H);
    j->out_floats = (size_t)(s->b * s->lq * E);
    j->w_floats = (size_t)(s->b * H * s->lq * s->lk);
}

static void build_descs(world *w, test_rng *r)
{
    const int64_t E = SELF_E, C = CROSS_E;
    float *f[6];
    const size_t n[6] = {3 * E * E, 3 * E, E * E, C * C, C * CROSS_KDIM,
                         C * CROSS_VDIM};
    for (int i = 0; i < 6; i++)
        f[i] = keep_ptr(w->owned, &w->n_owned, random_floats(r, n[i]));
    /* unit-scale projections: weights ~ U(-1, 1) / sqrt(in) */
    for (size_t i = 0; i < n[0]; i++)
        f[0][i] /= sqrtf((float)E);
    float *cross_out = keep_ptr(w->owned, &w->n_owned,
                                random_floats(r, (size_t)(C * C)));
    w->self_desc = (mha_layer_desc){.embed_dim = E, .num_heads = SELF_H,
                                    .in_proj_weight = f[0],
                                    .in_proj_bias = f[1],
                                    .out_proj_weight = f[2]};
    w->cross_desc = (mha_layer_desc){.embed_dim = C, .num_heads = CROSS_H,
                                     .kdim = CROSS_KDIM,
                                     .vdim = CROSS_VDIM,
                                     .q_proj_weight = f[3],
                                     .k_proj_weight = f[4],
                                     .v_proj_weight = f[5],
                                     .out_proj_weight = cross_out};
}

static mha_status run_job(const job_spec *s, const job *j,
                          const mha_engine *e, const mha_layer *self,
                          const mha_layer *cross, float *out, float *weights)
{
    float *wts = s->weights ? weights : NULL;
    if (s->kind == ATTENTION) {
        mha_attention_args a = j->args;
        a.out.data = out;
        a.weights = wts;
        return mha_attention(e, &a);
    }
    return mha_layer_forward(s->kind == LAYER_SELF ? self : cross, j->query,
                             j->key, j->value, s->b, s->lq, s->lk, &j->mask,
                             out, wts);
}

/* The serial result of job i on ISA t, checked against the oracle (which
 * decodes half-precision K/V to the very values the library widens). */
static void serial_result(world *w, int t, int i, const mha_engine *e,
                          const mha_layer *self, const mha_layer *cross)
{
    const job_spec *s = &specs[i];
    const job *j = &w->jobs[i];
    float *out = test_alloc(j->out_floats * sizeof(float));
    float *wts = test_alloc(j->w_floats * sizeof(float));
    fill_sentinel(out, j->out_floats);
    fill_sentinel(wts, j->w_floats);
    mha_status st = run_job(s, j, e, self, cross, out, wts);
    ck_assert_msg(st == MHA_OK, "%s [%s] serial: %s (%s)", s->name,
                  mha_isa_name(w->isas[t]), mha_status_string(st),
                  mha_last_error());
    w->want_out[t][i] = out;
    w->want_w[t][i] = wts;
    double *o = test_alloc(j->out_floats * sizeof(double));
    double *p = test_alloc(j->w_floats * sizeof(double));
    double abs = TOL_ATTN_ABS, rel = TOL_ATTN_REL;
    if (s->kind == ATTENTION) {
        oracle_attention(&j->args, o, p);
    } else {
        oracle_layer(s->kind == LAYER_SELF ? &w->self_desc : &w->cross_desc,
                     j->query, j->key, j->value, s->b, s->lq, s->lk,
                     &j->mask, o, p);
        abs = TOL_LAYER_ABS, rel = TOL_LAYER_REL;
    }
    size_t at;
    double ratio = tol_ratio(out, o, j->out_floats, abs, rel, &at);
    ck_assert_msg(ratio <= 1.0, "%s [%s]: out[%zu] = %g, oracle %g",
                  s->name, mha_isa_name(w->isas[t]), at, (double)out[at],
                  o[at]);
    if (s->weights) {
        ratio = tol_ratio(wts, p, j->w_floats, abs, rel, &at);
        ck_assert_msg(ratio <= 1.0, "%s [%s]: weights[%zu] = %g, oracle %g",
                      s->name, mha_isa_name(w->isas[t]), at,
                      (double)wts[at], p[at]);
    }
    free(o);
    free(p);
}

static double stress_seconds(void)
{
    const char *env = getenv("MHA_STRESS_SECONDS");
    double s = env ? atof(env) : 2.5;
    return s > 0.0 ? s : 2.5;
}

static void world_init(world *w)
{
    memset(w, 0, sizeof *w);
    test_rng r;
    rng_seed(&r, 0x5eed);
    build_descs(w, &r);
    for (int i = 0; i < NJOBS; i++)
        build_job(&w->jobs[i], &r, &specs[i]);
    w->n_isa = available_isas(w->isas);
    for (int t = 0; t < w->n_isa; t++) {
        mha_engine *serial = make_engine(w->isas[t], 1);
        mha_layer *self, *cross;
        ck_assert_int_eq(mha_layer_create(serial, &w->self_desc, &self),
                         MHA_OK);
        ck_assert_int_eq(mha_layer_create(serial, &w->cross_desc, &cross),
                         MHA_OK);
        for (int i = 0; i < NJOBS; i++)
            serial_result(w, t, i, serial, self, cross);
        mha_layer_destroy(self);
        mha_layer_destroy(cross);
        mha_engine_destroy(serial);
        w->shared[t] = make_engine(w->isas[t], 2);
        ck_assert_int_eq(mha_layer_create(w->shared[t], &w->self_desc,
                                          &w->shared_self[t]),
                         MHA_OK);
        ck_assert_int_eq(mha_layer_create(w->shared[t], &w->cross_desc,
                                          &w->shared_cross[t]),
                         MHA_OK);
    }
}

static void world_free(world *w)
{
    for (int t = 0; t < w->n_isa; t++) {
        mha_layer_destroy(w->shared_self[t]);
        mha_layer_destroy(w->shared_cross[t]);
        mha_engine_destroy(w->shared[t]);
        for (int i = 0; i < NJOBS; i++) {
            free(w->want_out[t][i]);
            free(w->want_w[t][i]);
        }
    }
    for (int i = 0; i < NJOBS; i++)
        for (int k = 0; k < w->jobs[i].n_owned; k++)
            free(w->jobs[i].owned[k]);
    for (int k = 0; k < w->n_owned; k++)
        free(w->owned[k]);
}

/* ---- Callers ---------------------------------------------------------- */

typedef struct {
    const world *w;
    int id;
    long calls, bad_calls, mismatches, failures;
    char error[192]; /* the first problem, for the report */
    /* the thread's own engines and layers, per ISA */
    mha_engine *own[MAX_ISAS];
    mha_layer *own_self[MAX_ISAS], *own_cross[MAX_ISAS];
} caller;

static void note(caller *c, const char *what, const char *detail)
{
    if (!c->error[0])
        snprintf(c->error, sizeof c->error, "caller %d: %s: %s", c->id, what,
                 detail);
}

static void drop_own(caller *c)
{
    for (int t = 0; t < c->w->n_isa; t++) {
        mha_layer_destroy(c->own_self[t]);
        mha_layer_destroy(c->own_cross[t]);
        mha_engine_destroy(c->own[t]);
        c->own_self[t] = c->own_cross[t] = NULL;
        c->own[t] = NULL;
    }
}

/* Fresh own engines with `threads` OpenMP threads; 0 on failure. */
static int make_own(caller *c, int threads)
{
    drop_own(c);
    for (int t = 0; t < c->w->n_isa; t++) {
        mha_config cfg = {.num_threads = threads, .isa = c->w->isas[t]};
        if (mha_engine_create(&cfg, &c->own[t]) != MHA_OK ||
            mha_layer_create(c->own[t], &c->w->self_desc,
                             &c->own_self[t]) != MHA_OK ||
            mha_layer_create(c->own[t], &c->w->cross_desc,
                             &c->own_cross[t]) != MHA_OK) {
            note(c, "own engine or layer", mha_last_error());
            return 0;
        }
    }
    return 1;
}

static int before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec ||
           (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* An invalid call whose message names this thread: q.batch = -(1000+id). */
static void bad_call(caller *c, const mha_engine *e)
{
    mha_attention_args a = c->w->jobs[0].args;
    float out;
    a.out.data = &out;
    a.q.batch = -(1000 + c->id);
    char expect[32];
    snprintf(expect, sizeof expect, "(%d)", -(1000 + c->id));
    mha_status st = mha_attention(e, &a);
    c->bad_calls++;
    if (st != MHA_ERR_BAD_SHAPE || !strstr(mha_last_error(), expect)) {
        c->failures++;
        note(c, "another thread's or no error message", mha_last_error());
    }
}

static void *caller_main(void *p)
{
    caller *c = p;
    const world *w = c->w;
    test_rng r;
    rng_seed(&r, 1000 + (uint64_t)c->id);
    size_t most_out = 0, most_w = 0;
    for (int i = 0; i < NJOBS; i++) {
        if (w->jobs[i].out_floats > most_out)
            most_out = w->jobs[i].out_floats;
        if (w->jobs[i].w_floats > most_w)
            most_w = w->jobs[i].w_floats;
    }
    float *out = malloc(most_out * sizeof(float));
    float *wts = malloc(most_w * sizeof(float));
    if (!out || !wts || !make_own(c, 1 + c->id % 3)) {
        c->failures++;
        note(c, "setup", "allocation or engine creation failed");
        goto done;
    }
    struct timespec now;
    do {
        unsigned u = (unsigned)((rng_uniform(&r) + 1.0f) * 8388608.0f);
        int i = (int)(u % NJOBS), t = (int)(u / NJOBS % (unsigned)w->n_isa);
        int shared = (u >> 20) & 1;
        const job_spec *s = &specs[i];
        const job *j = &w->jobs[i];
        const mha_engine *e = shared ? w->shared[t] : c->own[t];
        fill_sentinel(out, j->out_floats);
        fill_sentinel(wts, j->w_floats);
        mha_status st = run_job(s, j, e,
                                shared ? w->shared_self[t] : c->own_self[t],
                                shared ? w->shared_cross[t]
                                       : c->own_cross[t],
                                out, wts);
        c->calls++;
        if (st != MHA_OK) {
            c->failures++;
            note(c, s->name, mha_last_error());
        } else if (memcmp(out, w->want_out[t][i],
                          j->out_floats * sizeof(float)) != 0 ||
                   (s->weights && memcmp(wts, w->want_w[t][i],
                                         j->w_floats * sizeof(float)) != 0)) {
            c->mismatches++;
            note(c, s->name, shared ? "differs from serial (shared engine)"
                                    : "differs from serial (own engine)");
        }
        if (c->calls % BAD_CALL_EVERY == 0)
            bad_call(c, e);
        if (c->calls % RECREATE_EVERY == 0 &&
            !make_own(c, 1 + (int)(c->calls / RECREATE_EVERY + c->id) % 4)) {
            c->failures++;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (before(&now, &w->deadline));
done:
    drop_own(c);
    free(out);
    free(wts);
    return NULL;
}

START_TEST(callers_on_shared_and_own_engines)
{
    static world w; /* large: keep it off the stack */
    world_init(&w);
    double seconds = stress_seconds();
    clock_gettime(CLOCK_MONOTONIC, &w.deadline);
    w.deadline.tv_sec += (time_t)seconds;
    w.deadline.tv_nsec += (long)((seconds - floor(seconds)) * 1e9);
    if (w.deadline.tv_nsec >= 1000000000L) {
        w.deadline.tv_sec++;
        w.deadline.tv_nsec -= 1000000000L;
    }
    static caller callers[CALLERS];
    pthread_t th[CALLERS];
    for (int c = 0; c < CALLERS; c++) {
        memset(&callers[c], 0, sizeof callers[c]);
        callers[c].w = &w;
        callers[c].id = c;
        ck_assert_int_eq(pthread_create(&th[c], NULL, caller_main,
                                        &callers[c]),
                         0);
    }
    for (int c = 0; c < CALLERS; c++)
        ck_assert_int_eq(pthread_join(th[c], NULL), 0);
    long calls = 0, bad = 0;
    for (int c = 0; c < CALLERS; c++) {
        const caller *k = &callers[c];
        ck_assert_msg(k->failures == 0 && k->mismatches == 0,
                      "%ld failures, %ld mismatches; first: %s", k->failures,
                      k->mismatches, k->error);
        ck_assert_msg(k->calls > 0, "caller %d made no call", c);
        calls += k->calls;
        bad += k->bad_calls;
    }
    printf("stress: %d callers, %d ISAs, %d jobs: %ld calls (+%ld invalid) "
           "in %.1f s, all bitwise equal to serial\n",
           CALLERS, w.n_isa, NJOBS, calls, bad, seconds);
    world_free(&w);
}
END_TEST

Suite *suite_stress(void)
{
    Suite *s = suite_create("stress");
    TCase *tc = tcase_create("stress");
    tcase_add_test(tc, callers_on_shared_and_own_engines);
    suite_add_tcase(s, tc);
    return s;
}
