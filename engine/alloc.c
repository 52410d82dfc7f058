/* The one allocator of the engine, with a failure hook for tests. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

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
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    /* A workspace above glibc's largest mmap threshold (32 MiB on 64-bit;
     * smaller blocks come back from its heap, reused across calls) is
     * mmapped fresh on every call, and touching it page by page cost 3-4%
     * of a layer call (E = 1024, L = 2048) in page faults: on 2 MiB pages
     * it is a few faults (transparent huge pages, when the system allows
     * them; docs/benchmarks.md). */
    const size_t huge = (size_t)2 << 20;
    if (rounded >= MHA_ALLOC_HUGE_BYTES && rounded <= SIZE_MAX - huge) {
        size_t whole = (rounded + huge - 1) / huge * huge;
        void *p = aligned_alloc(huge, whole);
        if (p)
            (void)madvise(p, whole, MADV_HUGEPAGE);
        return p;
    }
#endif
    return aligned_alloc(64, rounded);
}

void mha_free(void *p) { free(p); }
