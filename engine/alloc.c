/* The one allocator of the engine, with a failure hook for tests. */
#include <stdatomic.h>
#include <stdlib.h>

#include "engine.h"
#include "test_hooks.h"

static atomic_long fail_countdown = -1; /* < 0: never fail */
static atomic_long alloc_count = 0;

long mha_test_fail_alloc_after(long n)
{
    atomic_store(&fail_countdown, n);
    return atomic_exchange(&alloc_count, 0);
}

void *mha_alloc(size_t bytes)
{
    atomic_fetch_add(&alloc_count, 1);
    if (atomic_load(&fail_countdown) >= 0 &&
        atomic_fetch_sub(&fail_countdown, 1) == 0)
        return NULL;
    if (bytes == 0)
        bytes = 1;
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(64, rounded);
}

void mha_free(void *p) { free(p); }
