"""Bad input raises a libmha.Error subclass with the library's message; never a crash."""
import numpy as np
import pytest

import libmha


def arrays(*shapes, dtype=np.float32):
    rng = np.random.default_rng(3)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def test_library_message_for_mismatched_shapes():
    q, k, v = arrays((1, 8, 4, 16), (1, 3, 6, 16), (1, 3, 6, 16))
    with pytest.raises(libmha.ShapeError) as e:
        libmha.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert str(e.value) == "k.heads (3) does not divide q.heads (8)"  # mha_last_error()
    assert e.value.status == 2 and isinstance(e.value, ValueError)
    q, k, v = arrays((1, 2, 4, 16), (1, 2, 6, 8), (1, 2, 6, 16))
    with pytest.raises(libmha.ShapeError, match=r"k\.dim"):
        libmha.scaled_dot_product_attention(q, k, v)


def test_wrong_dtype():
    q, k, v = arrays((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8), dtype=np.float64)
    with pytest.raises(libmha.DTypeError, match="q has dtype float64") as e:
        libmha.scaled_dot_product_attention(q, k, v)
    assert isinstance(e.value, TypeError) and e.value.status == 7
    q, k, v = arrays((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    with pytest.raises(libmha.DTypeError, match="k has dtype int32"):
        libmha.scaled_dot_product_attention(q, k.astype(np.int32), v)
    with pytest.raises(libmha.DTypeError, match="attn_mask has dtype uint8"):
        libmha.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((4, 4), np.uint8))
    with pytest.raises(TypeError, match="not an array"):
        libmha.scaled_dot_product_attention(q, k, [[1.0]])


def test_noncontiguous_last_axis():
    q, k, v = arrays((1, 2, 4, 8), (1, 2, 4, 16), (1, 2, 4, 8))
    with pytest.raises(libmha.StrideError, match="k: the last axis has a stride of 2"):
        libmha.scaled_dot_product_attention(q, k[..., ::2], v)


def test_negative_stride_refused_by_library():
    q, k, v = arrays((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
    with pytest.raises(libmha.StrideError, match="negative"):
        libmha.scaled_dot_product_attention(q, k[:, :, ::-1], v)


def test_bad_masks():
    q, k, v = arrays((2, 2, 4, 8), (2, 2, 5, 8), (2, 2, 5, 8))
    with pytest.raises(libmha.MaskError, match="does not broadcast"):
        libmha.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 5), bool))
    with pytest.raises(libmha.StrideError, match="last axis"):
        big = np.ones((4, 10), bool)
        libmha.scaled_dot_product_attention(q, k, v, attn_mask=big[:, ::2])
    with pytest.raises(libmha.MaskError):
        libmha.attention(q, k, v, layout="bhsd", key_lengths=np.array([9, 1], np.int32))
    with pytest.raises(libmha.ShapeError, match="key_lengths"):
        libmha.attention(q, k, v, layout="bhsd", key_lengths=np.array([1], np.int32))


def test_bad_arguments():
    q, k, v = arrays((1, 1, 2, 8), (1, 1, 2, 8), (1, 1, 2, 8))
    with pytest.raises(libmha.ArgumentError, match="scale"):
        libmha.scaled_dot_product_attention(q, k, v, scale=float("nan"))
    with pytest.raises(libmha.ArgumentError, match="dropout"):
        libmha.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    with pytest.raises(libmha.ArgumentError):
        libmha.Engine(num_threads=-1)
    with pytest.raises(libmha.ArgumentError, match="avx2"):  # the known names are listed
        libmha.Engine(isa="sse9")
    missing = [i for i in libmha.isas() if i not in libmha.available_isas()]
    if missing:
        with pytest.raises(libmha.UnsupportedError):
            libmha.Engine(isa=missing[0])
    with pytest.raises(libmha.ArgumentError, match="read-only"):
        out = np.zeros((1, 2, 1, 8), np.float32)
        out.flags.writeable = False
        libmha.attention(q, k, v, out=out)


def test_layer_shapes():
    m = libmha.MultiheadAttention(8, 2).load_state_dict(
        {"in_proj_weight": np.zeros((24, 8), np.float32),
         "out_proj.weight": np.zeros((8, 8), np.float32)})
    a, b = arrays((1, 3, 8), (1, 4, 6))
    with pytest.raises(libmha.ShapeError, match="key has shape"):
        m(a, b, b)
    with pytest.raises(libmha.MaskError, match="key_padding_mask"):
        m(a, a, a, key_padding_mask=np.zeros((1, 2), bool))


def test_gpu_array_refused():
    class OnCuda:  # what a CUDA tensor's DLPack methods answer
        shape, dtype = (1, 1, 2, 8), np.dtype(np.float32)
        def __dlpack_device__(self):
            return (2, 0)
        def __dlpack__(self, stream=None):
            raise AssertionError("must not be exported")

    q = np.zeros((1, 1, 2, 8), np.float32)
    with pytest.raises(libmha.DeviceError, match="CUDA device") as e:
        libmha.scaled_dot_product_attention(q, OnCuda(), q)
    assert e.value.status == 7
