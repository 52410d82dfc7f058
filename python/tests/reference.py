"""NumPy float64 references: PyTorch's SDPA and nn.MultiheadAttention."""
import numpy as np


def sdpa(q, k, v, keep=None, bias=None, causal=False, scale=None):
    """q [B,H,L,d], k [B,Hkv,S,d], v [B,Hkv,S,dv]; keep: True = attend."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    k = np.repeat(k, h // hkv, axis=1)
    v = np.repeat(v, h // hkv, axis=1)
    s = (q @ k.swapaxes(-1, -2)) * (1 / np.sqrt(d) if scale is None else scale)
    allowed = np.ones((b, h, lq, lk), dtype=bool)
    if keep is not None:
        allowed &= np.broadcast_to(np.asarray(keep, dtype=bool), allowed.shape)
    if causal:
        allowed &= np.tril(np.ones((lq, lk), dtype=bool))
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    dead = ~np.isfinite(m)
    p = np.exp(s - np.where(dead, 0, m))
    z = p.sum(axis=-1, keepdims=True)
    p = np.where(dead, 0, p / np.where(z == 0, 1, z))
    return p @ v, p


def mha(query, key, value, sd, num_heads, key_padding_mask=None, attn_mask=None,
        causal=False):
    """nn.MultiheadAttention(batch_first=True) forward; returns (out, per-head weights).
    Boolean masks: True = masked (PyTorch's nn.MultiheadAttention)."""
    f = lambda x: np.asarray(x, dtype=np.float64)
    e = sd["out_proj.weight"].shape[0]
    if "in_proj_weight" in sd:
        wq, wk, wv = np.split(f(sd["in_proj_weight"]), 3)
    else:
        wq, wk, wv = f(sd["q_proj_weight"]), f(sd["k_proj_weight"]), f(sd["v_proj_weight"])
    bq = bk = bv = np.zeros(e)
    if sd.get("in_proj_bias") is not None:
        bq, bk, bv = np.split(f(sd["in_proj_bias"]), 3)
    qp = f(query) @ wq.T + bq
    kp = f(key) @ wk.T + bk
    vp = f(value) @ wv.T + bv
    b, lq, _ = qp.shape
    lk = kp.shape[1]
    d = e // num_heads
    split = lambda x, l: x.reshape(b, l, num_heads, d).transpose(0, 2, 1, 3)
    keep = np.ones((b, num_heads, lq, lk), dtype=bool)
    bias = np.zeros((b, num_heads, lq, lk))
    if key_padding_mask is not None:
        kpm = np.asarray(key_padding_mask)
        if kpm.dtype == bool:
            keep &= ~kpm[:, None, None, :]
        else:
            bias = bias + kpm[:, None, None, :]
    if attn_mask is not None:
        am = np.asarray(attn_mask)
        if am.ndim == 3:
            am = am.reshape(b, num_heads, lq, lk)
        if am.dtype == bool:
            keep &= ~am
        else:
            bias = bias + am
    o, p = sdpa(split(qp, lq), split(kp, lk), split(vp, lk), keep=keep, bias=bias,
                causal=causal)
    o = o.transpose(0, 2, 1, 3).reshape(b, lq, e)
    out = o @ f(sd["out_proj.weight"]).T
    if sd.get("out_proj.bias") is not None:
        out = out + f(sd["out_proj.bias"])
    return out, p


def state_dict(rng, e, kdim=None, vdim=None, bias=True):
    """Random weights in PyTorch's state-dict layout."""
    s = 1 / np.sqrt(e)
    r = lambda *shape: (rng.standard_normal(shape) * s).astype(np.float32)
    sd = {}
    if kdim is None and vdim is None:
        sd["in_proj_weight"] = r(3 * e, e)
    else:
        sd["q_proj_weight"] = r(e, e)
        sd["k_proj_weight"] = r(e, kdim or e)
        sd["v_proj_weight"] = r(e, vdim or e)
    if bias:
        sd["in_proj_bias"] = r(3 * e)
        sd["out_proj.bias"] = r(e)
    sd["out_proj.weight"] = r(e, e)
    return sd
