"""Python threads call at once (the GIL is released during a call); results
equal the single-threaded ones bitwise."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import libmha
import reference as ref


def test_concurrent_sdpa_and_layer():
    rng = np.random.default_rng(11)
    jobs = []
    for i in range(24):
        q = rng.standard_normal((1, 4, 64, 32)).astype(np.float32)
        k = rng.standard_normal((1, 4, 96, 32)).astype(np.float32)
        v = rng.standard_normal((1, 4, 96, 32)).astype(np.float32)
        jobs.append((q, k, v))
    engine = libmha.Engine(num_threads=1)
    alone = [libmha.scaled_dot_product_attention(*j, is_causal=True, engine=engine) for j in jobs]
    sd = ref.state_dict(rng, 32)
    layer = libmha.MultiheadAttention(32, 4, engine=engine).load_state_dict(sd)
    xs = [rng.standard_normal((2, 16, 32)).astype(np.float32) for _ in range(8)]
    layer_alone = [layer(x, x, x)[0] for x in xs]

    def sdpa(i):
        return libmha.scaled_dot_product_attention(*jobs[i], is_causal=True, engine=engine)

    def lay(i):
        return layer(xs[i], xs[i], xs[i])[0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(sdpa, range(len(jobs))))
        got_layer = list(pool.map(lay, range(len(xs))))
    for a, b in zip(alone, got):
        assert np.array_equal(a, b)
    for a, b in zip(layer_alone, got_layer):
        assert np.array_equal(a, b)
    np.testing.assert_allclose(got[0], ref.sdpa(*jobs[0], causal=True)[0], rtol=2e-5, atol=2e-5)


def test_errors_per_thread():
    # mha_last_error is per thread: each caller sees its own message.
    q = np.zeros((1, 8, 2, 16), np.float32)

    def bad(h):
        k = np.zeros((1, h, 2, 16), np.float32)
        try:
            libmha.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        except libmha.ShapeError as e:
            return str(e)

    with ThreadPoolExecutor(max_workers=4) as pool:
        msgs = list(pool.map(bad, [3, 5, 6, 7] * 4))
    for h, m in zip([3, 5, 6, 7] * 4, msgs):
        assert m == f"k.heads ({h}) does not divide q.heads (8)"


def test_flush_subnormals():
    """Engine(flush_subnormals=True) reads subnormal values as 0 on every
    thread of a call; the default keeps them (IEEE)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 33, 32)).astype(np.float32)
    k = rng.standard_normal((2, 4, 70, 32)).astype(np.float32)
    v = np.ldexp(rng.uniform(-1, 1, (2, 4, 70, 32)), -130).astype(np.float32)
    assert np.all(np.abs(v) < np.finfo(np.float32).tiny)
    ieee = libmha.scaled_dot_product_attention(q, k, v, engine=libmha.Engine(num_threads=2))
    flushed = libmha.scaled_dot_product_attention(
        q, k, v, engine=libmha.Engine(num_threads=2, flush_subnormals=True))
    assert np.count_nonzero(ieee) > ieee.size // 2
    assert np.count_nonzero(flushed) == 0
