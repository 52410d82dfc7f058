"""Parity with PyTorch (skipped when torch is not importable): SDPA,
nn.MultiheadAttention, tensors in place through DLPack (bfloat16 too)."""
import numpy as np
import pytest

import libmha

torch = pytest.importorskip("torch", reason="PyTorch is not installed: parity tests skipped")
F = torch.nn.functional
TOL = dict(rtol=2e-5, atol=2e-5)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def test_sdpa_parity():
    q, k, v = torch.randn(2, 4, 5, 16), torch.randn(2, 4, 9, 16), torch.randn(2, 4, 9, 8)
    keep = torch.rand(2, 1, 5, 9) < 0.7
    keep[..., 0] = True
    bias = torch.randn(5, 9)
    for kw in [{}, dict(attn_mask=keep), dict(attn_mask=bias), dict(is_causal=True),
               dict(scale=0.2)]:
        got = libmha.scaled_dot_product_attention(q, k, v, **kw)
        assert isinstance(got, torch.Tensor)
        torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v, **kw), **TOL)


def test_sdpa_gqa_parity():
    q, k, v = torch.randn(1, 8, 4, 16), torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    try:
        expect = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    except TypeError:
        pytest.skip("this PyTorch has no enable_gqa")
    got = libmha.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(got, expect, **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_kv_through_dlpack(dtype):
    q = torch.randn(1, 2, 4, 16)
    k, v = torch.randn(1, 2, 7, 16).to(dtype), torch.randn(1, 2, 7, 16).to(dtype)
    got = libmha.scaled_dot_product_attention(q, k, v)
    expect = F.scaled_dot_product_attention(q, k.float(), v.float())
    torch.testing.assert_close(got, expect, **TOL)
    # A half query: the half compute dtype, the float32 result rounded.
    qh = q.to(dtype)
    half = libmha.scaled_dot_product_attention(qh, k, v)
    assert half.dtype == dtype
    want = libmha.scaled_dot_product_attention(qh.float(), k, v).to(dtype)
    assert torch.equal(half, want)


def test_strided_tensors_and_grad():
    base = torch.randn(2, 6, 4, 16, requires_grad=True)  # [B, L, H, d]
    q = base.transpose(1, 2)  # [B, H, L, d] view
    k = torch.randn(2, 4, 12, 16)[:, :, :6]
    got = libmha.scaled_dot_product_attention(q, k, k)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q.detach(), k, k), **TOL)


def test_layer_parity():
    for kw in [dict(), dict(kdim=12, vdim=10), dict(bias=False)]:
        mod = torch.nn.MultiheadAttention(16, 4, batch_first=True, **kw).eval()
        m = libmha.MultiheadAttention.from_torch(mod)
        q = torch.randn(2, 5, 16)
        k, v = torch.randn(2, 7, kw.get("kdim", 16)), torch.randn(2, 7, kw.get("vdim", 16))
        kpm = torch.zeros(2, 7, dtype=torch.bool)
        kpm[1, 5:] = True
        am = torch.triu(torch.ones(5, 7, dtype=torch.bool), 4)
        with torch.no_grad():
            for a in [dict(), dict(key_padding_mask=kpm), dict(attn_mask=am),
                      dict(key_padding_mask=kpm, attn_mask=am, average_attn_weights=False)]:
                eo, ew = mod(q, k, v, **a)
                go, gw = m(q, k, v, **a)
                torch.testing.assert_close(go, eo, rtol=5e-5, atol=5e-5)
                torch.testing.assert_close(gw, ew, rtol=5e-5, atol=5e-5)


def test_layer_state_dict_and_sequence_first():
    mod = torch.nn.MultiheadAttention(8, 2).eval()  # batch_first=False
    m = libmha.MultiheadAttention(8, 2, batch_first=False).load_state_dict(mod.state_dict())
    x = torch.randn(5, 3, 8)
    with torch.no_grad():
        torch.testing.assert_close(m(x, x, x)[0], mod(x, x, x)[0], rtol=5e-5, atol=5e-5)


def test_meta_device_refused():
    q = torch.empty(1, 1, 2, 8, device="meta")
    with pytest.raises(libmha.DeviceError, match="meta"):
        libmha.scaled_dot_product_attention(q, q, q)
