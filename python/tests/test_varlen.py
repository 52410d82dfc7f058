"""libmha.attention's score terms and key padding mask, and
libmha.attention_varlen (packed and paged keys), against a NumPy float64
reference written here from the C header's definitions."""
import numpy as np
import pytest

import libmha

TOL = dict(rtol=2e-5, atol=2e-5)


def ref_one(q, k, v, causal=False, window=None, softcap=0.0, sinks=None, keep=None, scale=None):
    """One sequence: q [Lq, H, d], k/v [Lk, Hkv, d]; bottom-right causal and
    window; keep [Lk] (True = attend). Rows with no key are zeros."""
    lq, h, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    scale = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros((lq, h, v.shape[2]))
    for hh in range(h):
        g = hh // (h // hkv)
        s = scale * (q[:, hh].astype(np.float64) @ k[:, g].astype(np.float64).T)
        if softcap:
            s = softcap * np.tanh(s / softcap)
        i = np.arange(lq)[:, None] + lk - lq
        j = np.arange(lk)[None, :]
        ok = np.ones((lq, lk), bool)
        if causal:
            ok &= j <= i
        if window is not None:
            left, right = window
            if left >= 0:
                ok &= j >= i - left
            if right >= 0:
                ok &= j <= i + right
        if keep is not None:
            ok &= keep[None, :]
        s = np.where(ok, s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sinks[hh])
        m = np.where(np.isfinite(m), m, 0.0)
        p = np.exp(s - m)
        den = p.sum(axis=1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(sinks[hh] - m)
        p = np.divide(p, den, out=np.zeros_like(p), where=den > 0)
        out[:, hh] = p @ v[:, g].astype(np.float64)
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(23)


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("terms", [dict(), dict(window=(3, 0)), dict(softcap=2.0),
                                   dict(sinks=True), dict(window=(2, 1), softcap=3.0, sinks=True)])
def test_attention_terms_and_key_keep(rng, terms):
    b, h, hkv, lq, lk, d = 2, 4, 2, 5, 9, 16
    q, k, v = rand(rng, b, lq, h, d), rand(rng, b, lk, hkv, d), rand(rng, b, lk, hkv, d)
    keep = rng.random((b, lk)) < 0.7
    keep[:, -1] = True
    sinks = rand(rng, h) if terms.get("sinks") else None
    kw = dict(terms, sinks=sinks)
    got = libmha.attention(q, k, v, causal="bottom_right", key_keep=keep, **kw)
    for i in range(b):
        want = ref_one(q[i], k[i], v[i], causal=True, keep=keep[i], **kw)
        np.testing.assert_allclose(got[i], want, **TOL)


def _packed(rng, lens_q, lens_k, h=4, hkv=2, d=8):
    q = rand(rng, sum(lens_q), h, d)
    k, v = rand(rng, sum(lens_k), hkv, d), rand(rng, sum(lens_k), hkv, d)
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    return q, k, v, cu_q, cu_k


def _ref_varlen(q, k, v, cu_q, cu_k, **kw):
    out = np.zeros(q.shape[:2] + (v.shape[2],))
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if cu_q[b + 1] > cu_q[b]:
            out[sq] = ref_one(q[sq], k[sk], v[sk], **kw)
    return out


@pytest.mark.parametrize("terms", [dict(), dict(window=(2, 0), softcap=4.0, sinks=True)])
def test_varlen_packed(rng, terms):
    lens_q, lens_k = [1, 6, 3, 0], [7, 6, 11, 4]
    q, k, v, cu_q, cu_k = _packed(rng, lens_q, lens_k)
    kw = dict(terms, sinks=rand(rng, 4) if terms.get("sinks") else None)
    got = libmha.attention_varlen(q, k, v, cu_q, cu_seqlens_k=cu_k, causal="bottom_right", **kw)
    want = _ref_varlen(q, k, v, cu_q, cu_k, causal=True, **kw)
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("kv_layout", ["bshd", "bhsd"])
def test_varlen_paged_shuffled_blocks(rng, kv_layout):
    lens_q, lens_k, bs = [2, 1, 5], [9, 4, 5], 3
    q, k, v, cu_q, cu_k = _packed(rng, lens_q, lens_k)
    nblocks = 12
    pool_k = rand(rng, nblocks, bs, 2, 8)
    pool_v = rand(rng, nblocks, bs, 2, 8)
    perm = rng.permutation(nblocks)
    table = np.zeros((3, 4), np.int32)
    used = 0
    for b in range(3):
        for blk in range(-(-lens_k[b] // bs)):
            table[b, blk] = perm[used]
            n = min(bs, lens_k[b] - blk * bs)
            pool_k[perm[used], :n] = k[cu_k[b] + blk * bs: cu_k[b] + blk * bs + n]
            pool_v[perm[used], :n] = v[cu_k[b] + blk * bs: cu_k[b] + blk * bs + n]
            used += 1
    pk, pv = pool_k, pool_v
    if kv_layout == "bhsd":
        pk, pv = pool_k.transpose(0, 2, 1, 3), pool_v.transpose(0, 2, 1, 3)  # strided views
    got = libmha.attention_varlen(q, pk, pv, cu_q, block_table=table,
                                  seqlens=np.array(lens_k, np.int32), kv_layout=kv_layout,
                                  causal="bottom_right")
    np.testing.assert_allclose(got, _ref_varlen(q, k, v, cu_q, cu_k, causal=True), **TOL)


def test_varlen_bad_input_names_the_field(rng):
    q, k, v, cu_q, cu_k = _packed(rng, [2, 3], [4, 5])
    out = np.full((5, 4, 8), 7.0, np.float32)
    bad = cu_q.copy()
    bad[0] = 1
    with pytest.raises(libmha.Error, match="cu_seqlens_q"):
        libmha.attention_varlen(q, k, v, bad, cu_seqlens_k=cu_k, out=out)
    assert (out == 7.0).all()
    with pytest.raises(libmha.ArgumentError, match="cu_seqlens_k"):
        libmha.attention_varlen(q, k, v, cu_q, out=out)
    with pytest.raises(libmha.Error, match="block_table"):
        libmha.attention_varlen(q, k[:, None], v[:, None], cu_q,
                                block_table=np.array([[0, 1, 2, 3], [4, 5, 6, 99]], np.int32),
                                seqlens=np.array([4, 4], np.int32), out=out)
    assert (out == 7.0).all()
    with pytest.raises(libmha.Error, match="window"):
        libmha.attention(q[None], k[None], v[None], window=(-5, 0))
    with pytest.raises(libmha.Error, match="key_keep"):
        libmha.attention(q[None], k[None], v[None], key_keep=np.ones((1, 3), bool))
