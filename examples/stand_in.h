/* What the examples share: a wall clock and the stand-in "model" that
 * makes up activations (the attention calls around them are real). */
#ifndef MHA_EXAMPLES_STAND_IN_H
#define MHA_EXAMPLES_STAND_IN_H

#include <time.h>

static inline double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Stand-in activations in [-1, 1) for token pos, channel i. */
static inline float act(unsigned pos, unsigned i, unsigned salt)
{
    unsigned x = pos * 2654435761u ^ i * 40503u ^ salt * 97u;
    x ^= x >> 15, x *= 2246822519u, x ^= x >> 13;
    return (float)(x >> 8) / 8388608.0f - 1.0f;
}

#endif
