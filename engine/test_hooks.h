/* Hooks for the test suites, which link the static library. Not part of
 * the shared library's ABI: nothing here is exported from libmha.so. */
#ifndef MHA_TEST_HOOKS_H
#define MHA_TEST_HOOKS_H

/* The next n allocations succeed, the one after fails (once); n < 0
 * disarms. Returns the number of allocations made since the last call.
 * Process-wide. */
long mha_test_fail_alloc_after(long n);

/* Whether the layer packed its q, k and v projections as one stacked
 * [3w, E] weight (self-attention then projects them in one multiply). */
struct mha_layer;
int mha_test_layer_fused(const struct mha_layer *layer);

#endif
