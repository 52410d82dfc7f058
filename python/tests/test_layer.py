"""libmha.MultiheadAttention against a NumPy float64 nn.MultiheadAttention."""
import numpy as np
import pytest

import libmha
import reference as ref

TOL = dict(rtol=5e-5, atol=5e-5)


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_forward_weights(rng, packed, bias):
    e, h = 16, 4
    kdim = None if packed else 12
    vdim = None if packed else 10
    sd = ref.state_dict(rng, e, kdim, vdim, bias=bias)
    m = libmha.MultiheadAttention(e, h, bias=bias, kdim=kdim, vdim=vdim).load_state_dict(sd)
    q, k, v = x(rng, 2, 5, e), x(rng, 2, 7, kdim or e), x(rng, 2, 7, vdim or e)
    out, w = m(q, k, v)
    eo, ew = ref.mha(q, k, v, sd, h)
    np.testing.assert_allclose(out, eo, **TOL)
    np.testing.assert_allclose(w, ew.mean(axis=1), **TOL)
    out, w = m(q, k, v, need_weights=True, average_attn_weights=False)
    np.testing.assert_allclose(w, ew, **TOL)
    out, w = m(q, k, v, need_weights=False)
    assert w is None
    np.testing.assert_allclose(out, eo, **TOL)


def test_masks_true_is_masked(rng):
    e, h, b, lq, lk = 16, 2, 2, 4, 6
    sd = ref.state_dict(rng, e)
    m = libmha.MultiheadAttention(e, h).load_state_dict(sd)
    q, kv = x(rng, b, lq, e), x(rng, b, lk, e)
    kpm = np.zeros((b, lk), dtype=bool)
    kpm[0, 4:] = True
    am = np.triu(np.ones((lq, lk), dtype=bool), 3)  # True = masked
    for kw in [dict(key_padding_mask=kpm), dict(attn_mask=am),
               dict(key_padding_mask=kpm, attn_mask=am),
               dict(attn_mask=np.where(am, -np.inf, 0.5).astype(np.float32), key_padding_mask=kpm),
               dict(key_padding_mask=np.where(kpm, -1e9, 0.0))]:
        out, w = m(q, kv, kv, **kw)
        eo, ew = ref.mha(q, kv, kv, sd, h, **kw)
        np.testing.assert_allclose(out, eo, **TOL)
        np.testing.assert_allclose(w, ew.mean(axis=1), **TOL)
    am3 = rng.random((b * h, lq, lk)) < 0.3
    am3[..., 0] = False
    out, _ = m(q, kv, kv, attn_mask=am3)
    np.testing.assert_allclose(out, ref.mha(q, kv, kv, sd, h, attn_mask=am3)[0], **TOL)


def test_causal_self_attention_and_unbatched(rng):
    e, h = 8, 2
    sd = ref.state_dict(rng, e)
    m = libmha.MultiheadAttention(e, h).load_state_dict(sd)
    s = x(rng, 1, 5, e)
    out, _ = m(s, s, s, is_causal=True)
    np.testing.assert_allclose(out, ref.mha(s, s, s, sd, h, causal=True)[0], **TOL)
    out1, w1 = m(s[0], s[0], s[0])
    assert out1.shape == (5, e) and w1.shape == (5, 5)
    np.testing.assert_allclose(out1, ref.mha(s, s, s, sd, h)[0][0], **TOL)


def test_sequence_first_and_noncontiguous_input(rng):
    e, h = 8, 2
    sd = ref.state_dict(rng, e)
    m = libmha.MultiheadAttention(e, h, batch_first=False).load_state_dict(sd)
    s = x(rng, 5, 3, e)  # [L, B, E]
    out, _ = m(s, s, s)
    bf = np.ascontiguousarray(s.swapaxes(0, 1))
    np.testing.assert_allclose(out, ref.mha(bf, bf, bf, sd, h)[0].swapaxes(0, 1), **TOL)
    mb = libmha.MultiheadAttention(e, h).load_state_dict(sd)
    q = x(rng, 2, e, 4).swapaxes(1, 2)  # converted (copied) to float32 C order
    out, _ = mb(q, q, q.astype(np.float64))
    np.testing.assert_allclose(out, ref.mha(q, q, q, sd, h)[0], **TOL)


def test_missing_and_bad_weights(rng):
    m = libmha.MultiheadAttention(8, 2)
    with pytest.raises(RuntimeError, match="load_state_dict"):
        m(x(rng, 1, 2, 8), x(rng, 1, 2, 8), x(rng, 1, 2, 8))
    sd = ref.state_dict(rng, 8)
    sd["in_proj_weight"] = sd["in_proj_weight"][:-1]
    with pytest.raises(libmha.ShapeError, match="in_proj_weight"):
        m.load_state_dict(sd)
    with pytest.raises(libmha.ShapeError, match=r"E % H|divide|num_heads"):
        libmha.MultiheadAttention(8, 3).load_state_dict(ref.state_dict(rng, 8))
    with pytest.raises(libmha.UnsupportedError, match="bias_k"):
        m.load_state_dict({**ref.state_dict(rng, 8), "bias_k": np.zeros((1, 1, 8))})
