/* Helpers that describe packed tensors. */
#include "engine.h"

/* Wrapping product: an absurd size gives a stride the validator rejects
 * instead of undefined behaviour here. */
static int64_t mul3(int64_t a, int64_t b, int64_t c)
{
    return (int64_t)((uint64_t)a * (uint64_t)b * (uint64_t)c);
}

mha_tensor mha_tensor_bshd(void *data, int64_t batch, int64_t seq,
                           int64_t heads, int64_t dim)
{
    mha_tensor t = {data, batch, seq, heads, dim, mul3(seq, heads, dim),
                    mul3(1, heads, dim), dim, MHA_F32, {NULL, 0, 0, 0}};
    return t;
}

mha_tensor mha_tensor_bhsd(void *data, int64_t batch, int64_t seq,
                           int64_t heads, int64_t dim)
{
    mha_tensor t = {data, batch, seq, heads, dim, mul3(heads, seq, dim), dim,
                    mul3(1, seq, dim), MHA_F32, {NULL, 0, 0, 0}};
    return t;
}

/* The views above with an element type, in one step. The cast drops const
 * only to fit mha_tensor.data: input views are never written. */
static mha_tensor typed(mha_tensor t, mha_dtype dtype)
{
    t.dtype = dtype;
    return t;
}

mha_tensor mha_tensor_bshd_typed(const void *data, mha_dtype dtype,
                                 int64_t batch, int64_t seq, int64_t heads,
                                 int64_t dim)
{
    return typed(mha_tensor_bshd((void *)(uintptr_t)data, batch, seq, heads,
                                 dim),
                 dtype);
}

mha_tensor mha_tensor_bhsd_typed(const void *data, mha_dtype dtype,
                                 int64_t batch, int64_t seq, int64_t heads,
                                 int64_t dim)
{
    return typed(mha_tensor_bhsd((void *)(uintptr_t)data, batch, seq, heads,
                                 dim),
                 dtype);
}
