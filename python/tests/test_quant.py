"""8-bit K/V caches from Python: libmha.quantize against a NumPy float64
reference of the C header's definition (mha_quantize), and libmha.attention
on the codes against a float64 reference on their decoded values."""
import numpy as np
import pytest

import libmha

TOL = dict(rtol=2e-5, atol=2e-5)
QMAX = {"i8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}


def decode(codes, dtype):
    """The value of each code, from the formats' definitions (OCP 8-bit
    floats: E4M3 bias 7, S.1111.111 NaN, no infinities; E5M2 bias 15,
    binary16's high byte)."""
    if dtype == "i8":
        return codes.astype(np.float64)
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    if dtype == "fp8_e4m3":
        e, m = (c >> 3) & 0xF, c & 0x7
        val = np.where(e == 0, m / 8.0 * 2.0**-6, (1 + m / 8.0) * 2.0 ** (e - 7.0))
        val = np.where((c & 0x7F) == 0x7F, np.nan, val)
    else:
        e, m = (c >> 2) & 0x1F, c & 0x3
        val = np.where(e == 0, m / 4.0 * 2.0**-14, (1 + m / 4.0) * 2.0 ** (e - 15.0))
        val = np.where(e == 31, np.where(m == 0, np.inf, np.nan), val)
    return sign * val


def grid(dtype):
    """Every finite value of the format, sorted (for the nearest code)."""
    if dtype == "i8":
        return np.arange(-127, 128, dtype=np.float64)
    v = decode(np.arange(256, dtype=np.uint8), dtype)
    return np.unique(v[np.isfinite(v)])


def ref_scales(x, axes_kept):
    """absmax / qmax over the finite elements sharing a scale, FLT_MIN at
    least; 1 where none is nonzero (per mha_quantize)."""
    a = np.where(np.isfinite(x), np.abs(x.astype(np.float64)), 0.0)
    red = tuple(i for i in range(x.ndim) if i not in axes_kept)
    return a.max(axis=red, keepdims=True)


def finish_scales(amax, dtype):
    s = (amax / QMAX[dtype]).astype(np.float32)
    s = np.maximum(s, np.float32(np.finfo(np.float32).tiny))
    return np.where(amax > 0, s, np.float32(1.0))


def rng_cache(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def sdpa_ref(q, k, v):
    """[B, L, H, d] float64 attention, no mask."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    s = np.einsum("blhd,bmhd->bhlm", q, k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhlm,bmhd->blhd", p, v)


def test_quantize_i8_per_row_matches_definition():
    x = rng_cache(1, (2, 5, 3, 16)) * 4
    x[0, 1, 2, :] = 0.0                     # no nonzero element: scale 1
    x[1, 0, 0, 3] = np.nan                  # NaN -> 0, not in absmax
    x[1, 0, 0, 4] = np.inf                  # saturates, not in absmax
    x[1, 2, 1, 5] = 1e-42                   # a subnormal row element
    codes, scales = libmha.quantize(x, "i8")
    assert codes.dtype == np.int8 and scales.shape == (2, 5, 3)
    want_s = finish_scales(ref_scales(x, (0, 1, 2)), "i8")[..., 0]
    np.testing.assert_array_equal(scales, want_s)
    q = x.astype(np.float64) / scales[..., None].astype(np.float64)
    want = np.clip(np.rint(np.nan_to_num(q, nan=0.0, posinf=127, neginf=-127)), -127, 127)
    np.testing.assert_array_equal(codes, want.astype(np.int8))
    assert scales[0, 1, 2] == 1.0 and codes[1, 0, 0, 3] == 0 and codes[1, 0, 0, 4] == 127


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_quantize_fp8_nearest_code(dtype):
    x = rng_cache(2, (1, 6, 2, 32)) * 3
    codes, scales = libmha.quantize(x, dtype)
    assert codes.dtype == np.uint8
    np.testing.assert_array_equal(scales, finish_scales(ref_scales(x, (0, 1, 2)), dtype)[..., 0])
    q = x.astype(np.float64) / scales[..., None]
    got = decode(codes, dtype)
    g = grid(dtype)
    # The code is a nearest one: no value of the format is closer.
    idx = np.clip(np.searchsorted(g, q), 1, len(g) - 1)
    best = np.minimum(np.abs(g[idx] - q), np.abs(g[idx - 1] - q))
    np.testing.assert_array_equal(np.abs(got - q), best)


def test_quantize_per_head_and_tensor_shapes():
    x = rng_cache(3, (2, 4, 3, 8))
    _, sh = libmha.quantize(x, "i8", per="head")
    assert sh.shape == (3,)
    np.testing.assert_array_equal(sh, finish_scales(ref_scales(x, (2,)), "i8").reshape(3))
    _, st = libmha.quantize(x, "i8", per="tensor")
    assert st.shape == ()
    assert st == finish_scales(ref_scales(x, ()), "i8").reshape(())
    xb = np.ascontiguousarray(x.transpose(0, 2, 1, 3))    # [B, H, L, d]
    _, sb = libmha.quantize(xb, "i8", per="head", layout="bhsd")
    assert sb.shape == (3, 1)
    np.testing.assert_array_equal(sb.reshape(3), sh)


@pytest.mark.parametrize("dtype,per", [("i8", "row"), ("i8", "head"), ("fp8_e4m3", "row"),
                                       ("fp8_e5m2", "tensor")])
@pytest.mark.parametrize("isa", libmha.available_isas())
def test_attention_on_codes(dtype, per, isa):
    b, lq, lk, h, d = 2, 5, 37, 4, 32
    q = rng_cache(4, (b, lq, h, d))
    kc, ks = libmha.quantize(rng_cache(5, (b, lk, h, d)), dtype, per=per)
    vc, vs = libmha.quantize(rng_cache(6, (b, lk, h, d)), dtype, per=per)
    out = libmha.attention(q, kc, vc, kv_dtype=dtype, k_scales=ks, v_scales=vs, isa=isa)
    kd = decode(kc, dtype) * (ks[..., None] if per == "row" else ks[..., None, :, None]
                              if per == "head" else ks)
    vd = decode(vc, dtype) * (vs[..., None] if per == "row" else vs[..., None, :, None]
                              if per == "head" else vs)
    np.testing.assert_allclose(out, sdpa_ref(q, kd, vd), **TOL)


def test_attention_on_codes_bhsd_per_head():
    b, lq, lk, h, d = 1, 3, 20, 2, 16
    q = rng_cache(7, (b, h, lq, d))
    kc, ks = libmha.quantize(rng_cache(8, (b, h, lk, d)), "i8", per="head", layout="bhsd")
    vc, vs = libmha.quantize(rng_cache(9, (b, h, lk, d)), "i8", per="head", layout="bhsd")
    out = libmha.attention(q, kc, vc, layout="bhsd", k_scales=ks, v_scales=vs)
    kd = decode(kc, "i8") * ks[None, :, :, None]
    vd = decode(vc, "i8") * vs[None, :, :, None]
    t = lambda a: a.transpose(0, 2, 1, 3)  # noqa: E731
    np.testing.assert_allclose(out, t(sdpa_ref(t(q), t(kd), t(vd))), **TOL)


def test_code_errors_name_the_field_and_leave_out_alone():
    q = rng_cache(10, (1, 2, 2, 8))
    kc, ks = libmha.quantize(rng_cache(11, (1, 3, 2, 8)), "fp8_e4m3")
    out = np.full((1, 2, 2, 8), 7.0, dtype=np.float32)
    with pytest.raises(libmha.DTypeError, match="uint8 codes"):
        libmha.attention(q, kc, kc, k_scales=ks, v_scales=ks, out=out)
    ic, isc = libmha.quantize(rng_cache(12, (1, 3, 2, 8)), "i8")
    with pytest.raises(libmha.NullPointerError, match="scales"):
        libmha.attention(q, ic, ic, k_scales=isc, out=out)           # v_scales missing
    with pytest.raises(libmha.ShapeError, match="k_scales"):
        libmha.attention(q, ic, ic, k_scales=isc[:, :2], v_scales=isc, out=out)
    with pytest.raises(libmha.UnsupportedError):
        libmha.attention(q, q, q, k_scales=isc[:, :2], out=out)       # float k takes none
    with pytest.raises(libmha.ArgumentError, match="kv_dtype"):
        libmha.attention(q, kc, kc, kv_dtype="fp4", k_scales=ks, v_scales=ks, out=out)
    with pytest.raises(libmha.DTypeError, match="kv_dtype"):
        libmha.attention(q, q, q, kv_dtype="i8", out=out)
    assert (out == 7.0).all()


def gather_tokens(pool, scales, block_table, lk, bs):
    """Sequence b's first lk keys of a [nb, bs, Hkv, d] pool, decoded."""
    rows = [pool[block_table[j // bs], j % bs] for j in range(lk)]
    sc = [scales[block_table[j // bs], j % bs] for j in range(lk)]
    return np.stack(rows), np.stack(sc)


@pytest.mark.parametrize("dtype,per_token", [("i8", False), ("fp8_e4m3", True)])
def test_quantize_paged_then_varlen(dtype, per_token):
    rng = np.random.default_rng(20)
    nb, bs, hkv, h, d = 9, 4, 2, 4, 16
    lens = [7, 12, 1]
    table = rng.permutation(nb)[:9].reshape(3, 3).astype(np.int32)
    codes_t = np.int8 if dtype == "i8" else np.uint8
    pool_k = np.full((nb, bs, hkv, d), 5, dtype=codes_t)
    pool_v = np.full((nb, bs, hkv, d), 5, dtype=codes_t)
    sshape = (nb, bs, 1) if per_token else (nb, bs, hkv)
    sc_k = np.full(sshape, 3.0, dtype=np.float32)
    sc_v = np.full(sshape, 3.0, dtype=np.float32)
    toks_k, toks_v, slots = [], [], []
    for b, n in enumerate(lens):
        toks_k.append(rng.standard_normal((n, hkv, d)).astype(np.float32))
        toks_v.append(rng.standard_normal((n, hkv, d)).astype(np.float32))
        slots += [int(table[b, j // bs]) * bs + j % bs for j in range(n)]
    xk, xv = np.concatenate(toks_k), np.concatenate(toks_v)
    slots = np.array(slots, dtype=np.int64)
    skip = slots.copy()
    skip[3] = -1                              # a padding token: not written
    libmha.quantize_paged(xk, pool_k, sc_k, skip, dtype)
    b0, p0 = divmod(int(slots[3]), bs)
    assert (pool_k[b0, p0] == 5).all() and (sc_k[b0, p0] == 3.0).all()
    libmha.quantize_paged(xk, pool_k, sc_k, slots, dtype)
    libmha.quantize_paged(xv, pool_v, sc_v, slots, dtype)
    # Each written slot as libmha.quantize quantises its token alone.
    for t, s in enumerate(slots):
        blk, pos = divmod(int(s), bs)
        want_c, want_s = libmha.quantize(xk[t][None, None], dtype,
                                         per="tensor" if per_token else "row")
        np.testing.assert_array_equal(pool_k[blk, pos], want_c[0, 0])
        np.testing.assert_array_equal(sc_k[blk, pos], np.broadcast_to(want_s, sc_k[blk, pos].shape)
                                      if per_token else want_s[0, 0])
    written = {int(s) for s in slots}
    for blk in range(nb):
        for pos in range(bs):
            if blk * bs + pos not in written:
                assert (pool_k[blk, pos] == 5).all() and (sc_k[blk, pos] == 3.0).all()
    # Decode (one query per sequence) and a 3-query chunk, causal bottom-right.
    for lq in (1, 3):
        qs = [rng.standard_normal((min(lq, n), h, d)).astype(np.float32) for n in lens]
        cu_q = np.cumsum([0] + [len(x) for x in qs]).astype(np.int32)
        out = libmha.attention_varlen(np.concatenate(qs), pool_k, pool_v, cu_q,
                                      block_table=table, seqlens=np.array(lens, np.int32),
                                      causal="bottom_right", kv_dtype=dtype,
                                      k_scales=sc_k, v_scales=sc_v)
        for b, n in enumerate(lens):
            kc, ks = gather_tokens(pool_k, sc_k, table[b], n, bs)
            vc, vs = gather_tokens(pool_v, sc_v, table[b], n, bs)
            kd, vd = decode(kc, dtype) * ks[..., None], decode(vc, dtype) * vs[..., None]
            want = ref_causal(qs[b], kd, vd)
            np.testing.assert_allclose(out[cu_q[b]:cu_q[b + 1]], want, **TOL)


def ref_causal(q, k, v):
    """q [Lq, H, d], k/v [Lk, Hkv, d] float64, bottom-right causal."""
    lq, h, d = q.shape
    lk, hkv = k.shape[:2]
    out = np.zeros((lq, h, v.shape[2]))
    for hh in range(h):
        g = hh // (h // hkv)
        s = (q[:, hh].astype(np.float64) @ k[:, g].T) / np.sqrt(d)
        s = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None] + lk - lq, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, hh] = (p / p.sum(axis=1, keepdims=True)) @ v[:, g]
    return out


def test_varlen_packed_codes():
    rng = np.random.default_rng(21)
    hkv, h, d = 2, 2, 16
    lens = [5, 9]
    k = rng.standard_normal((1, sum(lens), hkv, d)).astype(np.float32)
    v = rng.standard_normal((1, sum(lens), hkv, d)).astype(np.float32)
    kc, ks = libmha.quantize(k, "i8")
    vc, vs = libmha.quantize(v, "i8")
    q = rng.standard_normal((len(lens), h, d)).astype(np.float32)
    cu_q = np.arange(len(lens) + 1, dtype=np.int32)
    cu_k = np.cumsum([0] + lens).astype(np.int32)
    out = libmha.attention_varlen(q, kc[0], vc[0], cu_q, cu_seqlens_k=cu_k,
                                  k_scales=ks[0], v_scales=vs[0], causal="bottom_right")
    kd, vd = decode(kc[0], "i8") * ks[0][..., None], decode(vc[0], "i8") * vs[0][..., None]
    for b in range(len(lens)):
        sl = slice(cu_k[b], cu_k[b + 1])
        np.testing.assert_allclose(out[b:b + 1], ref_causal(q[b:b + 1], kd[sl], vd[sl]), **TOL)


def test_quantize_paged_refusals_write_nothing():
    pool = np.zeros((2, 4, 1, 8), dtype=np.int8)
    sc = np.ones((2, 4, 1), dtype=np.float32)
    x = np.ones((3, 1, 8), dtype=np.float32)
    with pytest.raises(libmha.ArgumentError):                    # slot past the pool
        libmha.quantize_paged(x, pool, sc, np.array([0, 1, 8], np.int64), "i8")
    with pytest.raises(libmha.ShapeError, match="slots"):
        libmha.quantize_paged(x, pool, sc, np.array([0, 1], np.int64), "i8")
    with pytest.raises(libmha.DTypeError, match="slots"):
        libmha.quantize_paged(x, pool, sc, np.array([0, 1, 2], np.int32), "i8")
    with pytest.raises(libmha.DTypeError, match="pool"):
        libmha.quantize_paged(x, pool, sc, np.array([0, 1, 2], np.int64), "fp8_e4m3")
    assert (pool == 0).all() and (sc == 1).all()
