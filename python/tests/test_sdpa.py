"""libmha.scaled_dot_product_attention and libmha.attention against the NumPy
float64 reference: masks, GQA, scale, dtypes, layouts, strides, protocols."""
import numpy as np
import pytest

import libmha
import reference as ref

TOL = dict(rtol=2e-5, atol=2e-5)


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture
def rng():
    return np.random.default_rng(17)


@pytest.mark.parametrize("isa", libmha.available_isas())
def test_plain_every_isa(rng, isa):
    q, k, v = rand(rng, 2, 3, 5, 16), rand(rng, 2, 3, 7, 16), rand(rng, 2, 3, 7, 8)
    out = libmha.scaled_dot_product_attention(q, k, v, isa=isa)
    assert out.shape == (2, 3, 5, 8) and out.dtype == np.float32
    np.testing.assert_allclose(out, ref.sdpa(q, k, v)[0], **TOL)


def test_bool_mask_true_attends(rng):
    q, k, v = rand(rng, 2, 2, 4, 8), rand(rng, 2, 2, 6, 8), rand(rng, 2, 2, 6, 8)
    keep = rng.random((2, 1, 4, 6)) < 0.6
    keep[..., 0] = True
    out = libmha.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    np.testing.assert_allclose(out, ref.sdpa(q, k, v, keep=keep)[0], **TOL)


def test_bool_mask_broadcast_2d_and_key_axis(rng):
    q, k, v = rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 5, 8), rand(rng, 1, 2, 5, 8)
    keep = np.tril(np.ones((4, 5), dtype=bool), 1)
    out = libmha.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    np.testing.assert_allclose(out, ref.sdpa(q, k, v, keep=keep)[0], **TOL)
    col = np.array([True, False, True, True])[:, None]  # [Lq, 1]: whole rows
    out = libmha.scaled_dot_product_attention(q, k, v, attn_mask=col)
    np.testing.assert_allclose(out, ref.sdpa(q, k, v, keep=col)[0], **TOL)
    assert np.all(out[:, :, 1] == 0)  # a fully masked row is zeros


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_float_mask_added(rng, dtype):
    q, k, v = rand(rng, 2, 2, 3, 8), rand(rng, 2, 2, 5, 8), rand(rng, 2, 2, 5, 8)
    bias = rand(rng, 2, 2, 3, 5).astype(dtype)
    bias[0, 0, 0, 1] = -np.inf
    out = libmha.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    np.testing.assert_allclose(out, ref.sdpa(q, k, v, bias=bias.astype(np.float32))[0], **TOL)


def test_causal_scale_and_combined(rng):
    q, k, v = rand(rng, 1, 2, 6, 8), rand(rng, 1, 2, 6, 8), rand(rng, 1, 2, 6, 4)
    out = libmha.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    np.testing.assert_allclose(out, ref.sdpa(q, k, v, causal=True, scale=0.3)[0], **TOL)
    keep = rng.random((6, 6)) < 0.7
    np.fill_diagonal(keep, True)
    out = libmha.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=True)
    np.testing.assert_allclose(out, ref.sdpa(q, k, v, keep=keep, causal=True)[0], **TOL)


def test_gqa(rng):
    q, k, v = rand(rng, 2, 8, 3, 16), rand(rng, 2, 2, 9, 16), rand(rng, 2, 2, 9, 16)
    out = libmha.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    np.testing.assert_allclose(out, ref.sdpa(q, k, v)[0], **TOL)
    with pytest.raises(libmha.ShapeError, match="enable_gqa"):
        libmha.scaled_dot_product_attention(q, k, v)


def test_three_dims_one_head(rng):
    q, k, v = rand(rng, 3, 4, 8), rand(rng, 3, 6, 8), rand(rng, 3, 6, 8)
    out = libmha.scaled_dot_product_attention(q, k, v)
    assert out.shape == (3, 4, 8)
    np.testing.assert_allclose(out, ref.sdpa(q[:, None], k[:, None], v[:, None])[0][:, 0], **TOL)


def test_float16_kv_in_place_and_float16_compute(rng):
    q, k, v = rand(rng, 1, 2, 4, 16), rand(rng, 1, 2, 8, 16), rand(rng, 1, 2, 8, 16)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    out = libmha.scaled_dot_product_attention(q, k16, v16)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref.sdpa(q, k16, v16)[0], **TOL)
    # A float16 query computes in float32 and writes a float16 output: the
    # float32 result on the same (rounded) query, rounded once.
    q16 = q.astype(np.float16)
    out16 = libmha.scaled_dot_product_attention(q16, k16, v16)
    assert out16.dtype == np.float16
    want = libmha.scaled_dot_product_attention(q16.astype(np.float32), k16, v16)
    np.testing.assert_array_equal(out16, want.astype(np.float16))
    np.testing.assert_allclose(out16, ref.sdpa(q16, k16, v16)[0], rtol=2 ** -11, atol=2e-5)
    # A float32 output for a float16 query: the library's refusal.
    with pytest.raises(libmha.UnsupportedError, match="q.dtype"):
        libmha.attention(q16, k16, v16, layout="bhsd", out=np.empty((1, 2, 4, 16), np.float32))


def test_strided_views_no_copy(rng):
    # [B, L, H, d] storage viewed as [B, H, L, d] (a transpose), and a cache
    # of capacity 12 viewed at length 5: both read in place.
    qs = rand(rng, 2, 4, 3, 8)
    cache_k, cache_v = rand(rng, 2, 3, 12, 8), rand(rng, 2, 3, 12, 8)
    q = qs.transpose(0, 2, 1, 3)
    k, v = cache_k[:, :, :5], cache_v[:, :, :5]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    out = libmha.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(out, ref.sdpa(q, k, v)[0], **TOL)


def test_dlpack_and_array_interface(rng):
    q, k, v = rand(rng, 1, 2, 3, 8), rand(rng, 1, 2, 4, 8), rand(rng, 1, 2, 4, 8)
    expect = ref.sdpa(q, k, v)[0]

    class DLOnly:  # speaks only DLPack
        def __init__(self, a):
            self.a = a
        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()
        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    class AIOnly:  # speaks only __array_interface__
        def __init__(self, a):
            self.a = a
            self.__array_interface__ = a.__array_interface__

    out = libmha.scaled_dot_product_attention(DLOnly(q), DLOnly(k), DLOnly(v))
    np.testing.assert_allclose(out, expect, **TOL)
    out = libmha.scaled_dot_product_attention(AIOnly(q), AIOnly(k[:, :, ::1]), AIOnly(v))
    np.testing.assert_allclose(out, expect, **TOL)
    # A strided DLPack view: the capsule's strides are used.
    big = rand(rng, 1, 2, 8, 8)
    out = libmha.scaled_dot_product_attention(q, DLOnly(big[:, :, ::2]), v)
    np.testing.assert_allclose(out, ref.sdpa(q, big[:, :, ::2], v)[0], **TOL)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_attention_c_conventions(rng, layout):
    b, h, lq, lk, d = 2, 4, 3, 7, 8
    q, k, v = rand(rng, b, lq, h, d), rand(rng, b, lk, 2, d), rand(rng, b, lk, 2, d)
    if layout == "bhsd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    to_bhsd = (lambda x: x) if layout == "bhsd" else (lambda x: x.transpose(0, 2, 1, 3))
    lengths = np.array([5, 7], dtype=np.int32)
    keep = np.ones((b, 1, 1, lk), dtype=np.uint8)
    keep[1, 0, 0, 2] = 0
    out, w = libmha.attention(q, k, v, layout=layout, keep=keep, causal="bottom_right",
                              key_lengths=lengths, need_weights=True)
    allowed = (np.arange(lk)[None, :] < lengths[:, None])[:, None, None, :] & keep.astype(bool)
    allowed = allowed & np.tril(np.ones((lq, lk), dtype=bool), lk - lq)
    eo, ew = ref.sdpa(to_bhsd(q), to_bhsd(k), to_bhsd(v), keep=allowed)
    np.testing.assert_allclose(to_bhsd(out), eo, **TOL)
    np.testing.assert_allclose(w, ew, **TOL)


def test_info():
    assert libmha.__version__ == libmha.version() == "0.1.0"
    assert set(libmha.available_isas()) <= set(libmha.isas())
    assert "generic" in libmha.available_isas()
    assert libmha.isa() in libmha.available_isas()
    e = libmha.Engine(num_threads=1, isa="generic")
    assert e.isa == "generic" and e.num_threads == 1
    assert libmha.get_engine(2, "generic") is libmha.get_engine(2, "generic")
