/* The errors suite, part 2: allocation failures. Each allocation of a
 * call fails in turn (through the engine's test hook). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h> /* malloc_usable_size */
#endif

#include "engine.h" /* mha_alloc, mha_free */
#include "errors.h"
#include "test_hooks.h"

/* A call whose allocations are made to fail one by one. run() returns the
 * call's status; outputs are the bytes it may write on success. */
typedef struct oom_call {
    const char *name;
    mha_status (*run)(void *ctx);
    void *ctx;
    void *outputs;
    size_t output_bytes;
} oom_call;

/* Fails allocation 0, 1, 2, ... of the call in turn: each must give
 * MHA_ERR_OUT_OF_MEMORY with the outputs untouched, until the call makes
 * no more allocations than allowed and succeeds with the bytes of an
 * unhindered run. Returns the number of allocations the call makes. */
static long fail_each_allocation(const oom_call *c)
{
    unsigned char *want = test_alloc(c->output_bytes);
    unsigned char *sentinel = test_alloc(c->output_bytes);
    memset(sentinel, 0xa5, c->output_bytes);

    mha_test_fail_alloc_after(-1);
    memcpy(c->outputs, sentinel, c->output_bytes);
    ck_assert_msg(c->run(c->ctx) == MHA_OK, "%s: unhindered run failed: %s",
                  c->name, mha_last_error());
    long allocations = mha_test_fail_alloc_after(-1);
    memcpy(want, c->outputs, c->output_bytes);

    for (long n = 0;; n++) {
        ck_assert_msg(n <= allocations, "%s: still failing after %ld "
                      "allocations (an unhindered run makes %ld)",
                      c->name, n, allocations);
        memcpy(c->outputs, sentinel, c->output_bytes);
        mha_test_fail_alloc_after(n);
        mha_status st = c->run(c->ctx);
        long made = mha_test_fail_alloc_after(-1);
        if (st == MHA_OK) {
            ck_assert_msg(made <= n, "%s: allocation %ld failed yet the "
                          "call succeeded", c->name, n);
            ck_assert_msg(memcmp(c->outputs, want, c->output_bytes) == 0,
                          "%s: result differs from the unhindered run",
                          c->name);
            break;
        }
        ck_assert_msg(st == MHA_ERR_OUT_OF_MEMORY,
                      "%s: allocation %ld failed, status %s", c->name, n,
                      mha_status_string(st));
        ck_assert_msg(mha_last_error()[0] != '\0', "%s: no message",
                      c->name);
        ck_assert_msg(memcmp(c->outputs, sentinel, c->output_bytes) == 0,
                      "%s: allocation %ld failed and outputs changed",
                      c->name, n);
    }
    free(want);
    free(sentinel);
    return allocations;
}

typedef struct oom_ctx {
    mha_isa isa;
    mha_engine *engine;
    mha_layer *layer;
    fixture attn;
    layer_fixture lay;
    /* What the calls write. */
    struct {
        float out[N_OUT], w[N_W];
    } attn_out;
    struct {
        float out[L_NQ], w[L_NW];
    } layer_out;
    struct {
        mha_engine *engine;
    } engine_out;
    struct {
        mha_layer *layer;
    } created;
} oom_ctx;

static mha_status run_attention(void *p)
{
    oom_ctx *c = p;
    mha_attention_args a = c->attn.args;
    a.out.data = c->attn_out.out;
    a.weights = c->attn_out.w;
    return mha_attention(c->engine, &a);
}

static mha_status run_layer_forward(void *p)
{
    oom_ctx *c = p;
    layer_fixture *f = &c->lay;
    return mha_layer_forward(c->layer, f->query, f->key, f->value, LB, LLQ,
                             LLK, &f->mask, c->layer_out.out,
                             c->layer_out.w);
}

static mha_status run_engine_create(void *p)
{
    oom_ctx *c = p;
    mha_config config = {.num_threads = 2, .isa = c->isa};
    mha_engine *e = c->engine_out.engine;
    mha_status st = mha_engine_create(&config, &e);
    if (st == MHA_OK) {
        mha_engine_destroy(e);
        /* The pointer differs run to run; record that it was written. */
        c->engine_out.engine = (mha_engine *)c;
    }
    return st;
}

static mha_status run_layer_create(void *p)
{
    oom_ctx *c = p;
    mha_layer *l = c->created.layer;
    mha_status st = mha_layer_create(c->engine, &c->lay.desc, &l);
    if (st == MHA_OK) {
        mha_layer_destroy(l);
        c->created.layer = (mha_layer *)c;
    }
    return st;
}

START_TEST(allocation_failures)
{
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    for (int t = 0; t < n_isa; t++) {
        oom_ctx *c = test_alloc(sizeof *c);
        memset(c, 0, sizeof *c);
        c->isa = isas[t];
        c->engine = make_engine(isas[t], 2);
        fixture_init(&c->attn);
        layer_fixture_init(&c->lay);
        ck_assert_int_eq(mha_layer_create(c->engine, &c->lay.desc, &c->layer),
                         MHA_OK);
        oom_call calls[] = {
            {"mha_attention", run_attention, c, &c->attn_out,
             sizeof c->attn_out},
            {"mha_layer_forward", run_layer_forward, c, &c->layer_out,
             sizeof c->layer_out},
            {"mha_engine_create", run_engine_create, c, &c->engine_out,
             sizeof c->engine_out},
            {"mha_layer_create", run_layer_create, c, &c->created,
             sizeof c->created},
        };
        for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
            long n = fail_each_allocation(&calls[i]);
            /* The layer copies its weights: it must allocate. */
            if (calls[i].run == run_layer_create)
                ck_assert_msg(n > 0, "mha_layer_create allocated nothing");
        }
        mha_layer_destroy(c->layer);
        mha_engine_destroy(c->engine);
        fixture_free(&c->attn);
        layer_fixture_free(&c->lay);
        free(c);
    }
}
END_TEST

/* The engine's allocator itself (engine/alloc.c): 64-byte aligned blocks
 * of at least the bytes asked for, every byte writable, on both of its
 * branches (blocks from 32 MiB take 2 MiB pages, their size rounded up to
 * whole pages), and NULL, without allocating, when rounding to a cache
 * line would overflow. No call in the other suites needs a 32 MiB
 * workspace, so a block rounded short there would go unseen. */
START_TEST(allocator_blocks)
{
    const size_t mib = (size_t)1 << 20;
    const size_t sizes[] = {0,           1,           63,
                            64,          65,          4099,
                            32 * mib - 1, 32 * mib,   32 * mib + 1,
                            34 * mib + 100};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const size_t n = sizes[i];
        unsigned char *p = mha_alloc(n);
        ck_assert_msg(p != NULL, "mha_alloc(%zu) failed", n);
        ck_assert_msg((uintptr_t)p % 64 == 0, "mha_alloc(%zu) = %p is not "
                      "64-byte aligned", n, (void *)p);
#ifdef __GLIBC__
        ck_assert_msg(malloc_usable_size(p) >= n, "mha_alloc(%zu) gave a "
                      "block of %zu bytes", n, malloc_usable_size(p));
#endif
        if (n > 0) {
            /* Every byte written: a short block faults, or trips ASan or
             * valgrind, here. */
            memset(p, (int)(i + 1), n);
            ck_assert_int_eq(p[0], (int)(i + 1));
            ck_assert_int_eq(p[n / 2], (int)(i + 1));
            ck_assert_int_eq(p[n - 1], (int)(i + 1));
        }
        mha_free(p);
    }
    ck_assert_ptr_null(mha_alloc(SIZE_MAX - 10));
    mha_free(NULL);
}
END_TEST

/* One forward of util.h's ws_layer (a call whose workspace the layer
 * keeps: engine/layer.c, ws_take) over the first lk keys into out (3 x E
 * floats); returns its status and, in *allocs, the allocations it made. */
static mha_status ws_forward(const mha_layer *l, const ws_layer *f,
                             int64_t lk, float *out, long *allocs)
{
    mha_test_fail_alloc_after(-1);
    mha_status st = mha_layer_forward(l, f->query, f->kv, f->kv, 1, 3, lk,
                                      NULL, out, NULL);
    *allocs = mha_test_fail_alloc_after(-1);
    return st;
}

/* What a fresh layer (nothing kept) gives for lk keys, and its count of
 * allocations. */
static void ws_fresh(const mha_engine *e, const ws_layer *f, int64_t lk,
                     float *out, long *allocs)
{
    mha_layer *l = NULL;
    ck_assert_int_eq(mha_layer_create(e, &f->desc, &l), MHA_OK);
    ck_assert_int_eq(ws_forward(l, f, lk, out, allocs), MHA_OK);
    mha_layer_destroy(l);
}

START_TEST(layer_workspace_kept)
{
    mha_isa isas[TEST_MAX_ISAS];
    int n_isa = available_isas(isas);
    mha_engine *e = make_engine(isas[n_isa > 1 ? 1 : 0], 2);
    ws_layer *f = test_alloc(sizeof *f);
    const int64_t big = WS_KEYS + WS_KEYS / 4, sizes[] = {WS_KEYS, big};
    ws_layer_init(f, big);
    float want[2][3 * WS_E], out[3 * WS_E];
    long fresh[2], allocs;
    for (int i = 0; i < 2; i++)
        ws_fresh(e, f, sizes[i], want[i], &fresh[i]);
    ck_assert_msg(fresh[0] >= 1, "a fresh layer's call allocated nothing");

    mha_layer *l = NULL;
    ck_assert_int_eq(mha_layer_create(e, &f->desc, &l), MHA_OK);
    /* The first call allocates its workspace, the second reuses it, and
     * both give a fresh layer's bytes (a workspace reused with the last
     * call's contents in it must not change a result). */
    for (int call = 0; call < 2; call++) {
        memset(out, 0xa5, sizeof out);
        ck_assert_int_eq(ws_forward(l, f, WS_KEYS, out, &allocs), MHA_OK);
        ck_assert_msg(memcmp(out, want[0], sizeof out) == 0,
                      "call %d differs from a fresh layer's", call);
        if (call == 0)
            ck_assert_int_eq(allocs, fresh[0]);
        else
            ck_assert_msg(allocs == fresh[0] - 1, "second call made %ld "
                          "allocations, a fresh layer's %ld", allocs,
                          fresh[0]);
    }
    /* A larger call replaces the kept workspace, and a smaller one after
     * it takes the larger block. */
    ck_assert_int_eq(ws_forward(l, f, big, out, &allocs), MHA_OK);
    ck_assert_int_eq(allocs, fresh[1]);
    ck_assert(memcmp(out, want[1], sizeof out) == 0);
    ck_assert_int_eq(ws_forward(l, f, WS_KEYS, out, &allocs), MHA_OK);
    ck_assert_int_eq(allocs, fresh[0] - 1);
    ck_assert(memcmp(out, want[0], sizeof out) == 0);
    mha_layer_destroy(l);

    /* Out of memory for the workspace of a layer with none kept, then
     * with one too small kept: refused, out untouched; the next call
     * succeeds with the same bytes. */
    ck_assert_int_eq(mha_layer_create(e, &f->desc, &l), MHA_OK);
    for (int i = 0; i < 2; i++) {
        float sentinel[3 * WS_E];
        memset(sentinel, 0x5a, sizeof sentinel);
        memcpy(out, sentinel, sizeof out);
        mha_test_fail_alloc_after(0);
        mha_status st = mha_layer_forward(l, f->query, f->kv, f->kv, 1, 3,
                                          sizes[i], NULL, out, NULL);
        mha_test_fail_alloc_after(-1);
        ck_assert_msg(st == MHA_ERR_OUT_OF_MEMORY, "status %s",
                      mha_status_string(st));
        ck_assert(memcmp(out, sentinel, sizeof out) == 0);
        ck_assert_int_eq(ws_forward(l, f, sizes[i], out, &allocs), MHA_OK);
        ck_assert(memcmp(out, want[i], sizeof out) == 0);
    }
    mha_layer_destroy(l); /* frees the kept workspace: ASan, valgrind */
    free(f->kv);
    free(f);
    mha_engine_destroy(e);
}
END_TEST

void errors_add_allocation_tests(TCase *tc)
{
    tcase_add_test(tc, allocation_failures);
    tcase_add_test(tc, allocator_blocks);
    tcase_add_test(tc, layer_workspace_kept);
}
