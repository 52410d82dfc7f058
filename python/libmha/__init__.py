"""libmha: multi-head attention on CPUs, for NumPy arrays and PyTorch tensors.

A thin binding over libmha's C API. Arrays are read in place (buffer
protocol, DLPack, ``__array_interface__``), with their strides; the GIL is
released during a call.

    import libmha
    out = libmha.scaled_dot_product_attention(q, k, v, is_causal=True)
    mha = libmha.MultiheadAttention.from_torch(torch_module)
    y, w = mha(x, x, x)

Mask polarity follows PyTorch in each entry point: a boolean ``attn_mask``
of :func:`scaled_dot_product_attention` is True where a query attends;
the boolean masks of :class:`MultiheadAttention` are True where a key is
masked out. Float masks are added to the scores in both.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional

import numpy as np

from . import _mha
from ._common import ArrayLike, as_array, dtype_name, empty_out, expand_keys, float32, get_engine
from ._common import is_torch, like, pick_engine, raise_error
from ._layer import MultiheadAttention
from ._mha import (ArgumentError, DeviceError, DTypeError, Engine, Error, MaskError,
                   NullPointerError, OutOfMemoryError, ShapeError, SizeOverflowError,
                   StrideError, UnsupportedError)

__version__: str = _mha.version()

__all__ = [
    "scaled_dot_product_attention", "attention", "attention_varlen", "MultiheadAttention",
    "quantize", "quantize_paged",
    "Engine",
    "get_engine", "isa", "isas", "available_isas", "version", "__version__",
    "Error", "ShapeError", "StrideError", "MaskError", "ArgumentError",
    "UnsupportedError", "DTypeError", "DeviceError", "NullPointerError",
    "SizeOverflowError", "OutOfMemoryError",
]


def version() -> str:
    """The C library's version (``mha_version()``), e.g. ``"0.1.0"``."""
    return _mha.version()


def isas() -> List[str]:
    """Every ISA libmha knows, best first, whether this machine runs it or not."""
    return [name for name, _, _ in _mha.isas()]


def available_isas() -> List[str]:
    """The ISAs an engine can be created with here (built and run by this CPU),
    best first."""
    return [name for name, _, ok in _mha.isas() if ok]


def isa(num_threads: Optional[int] = None) -> str:
    """The ISA the default engine picked (``MHA_ISA`` in the environment overrides)."""
    return get_engine(num_threads, None).isa


def _heads_and_seq(x: Any) -> tuple:
    s = tuple(x.shape)
    return (s[1], s[2]) if len(s) == 4 else (1, s[1]) if len(s) == 3 else (None, None)


def scaled_dot_product_attention(
    query: ArrayLike,
    key: ArrayLike,
    value: ArrayLike,
    attn_mask: Optional[ArrayLike] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    *,
    num_threads: Optional[int] = None,
    isa: Optional[str] = None,
    engine: Optional[Engine] = None,
) -> Any:
    """``torch.nn.functional.scaled_dot_product_attention`` on the CPU with libmha.

    Args:
        query: ``[B, H, L, d]`` (or ``[B, L, d]``, one head): float32,
            float16 or bfloat16, the compute dtype (the output's; scores,
            softmax and accumulation are float32 in every case).
        key, value: ``[B, Hkv, S, d]`` and ``[B, Hkv, S, dv]``; float32,
            float16 or bfloat16, read in place with their strides.
        attn_mask: broadcastable to ``[B, H, L, S]``. Boolean: **True = attend**
            (as in PyTorch SDPA), read in place. Float: added to the scaled
            scores (``-inf`` masks); float32 is read in place, other float
            dtypes are converted.
        dropout_p: must be 0 (inference only).
        is_causal: top-left causal mask (query i sees keys j <= i), as PyTorch;
            may be combined with ``attn_mask``.
        scale: score scale; None means ``1/sqrt(d)``.
        enable_gqa: allow ``Hkv`` dividing ``H`` (grouped-query attention).
        num_threads, isa, engine: the libmha engine to run on (see
            :func:`get_engine`).

    Returns:
        ``[B, H, L, dv]`` in the query's dtype and kind (NumPy array or
        PyTorch tensor). The last axis of every array must be contiguous.
        Rows whose every key is masked are zeros (PyTorch gives NaN).

    Raises:
        libmha.Error subclasses carrying the library's message, e.g.
        ShapeError, StrideError, MaskError, DTypeError, DeviceError.
    """
    if dropout_p:
        raise_error(ArgumentError, 8, f"dropout_p={dropout_p}: libmha is inference only (0 required)")
    if scale is not None and not scale:
        raise_error(ArgumentError, 8,
                    "scale=0: libmha reads a scale of 0 as 1/sqrt(d); pass None for that")
    eng = pick_engine(engine, num_threads, isa)
    q, k, v = as_array(query), as_array(key), as_array(value)
    hq, lq = _heads_and_seq(q)
    hk, lk = _heads_and_seq(k)
    if not enable_gqa and hq is not None and hk is not None and hq != hk:
        raise_error(ShapeError, 2,
                    f"key has {hk} heads and query {hq}: pass enable_gqa=True for "
                    "grouped-query attention")
    keep = bias = None
    if attn_mask is not None:
        m = as_array(attn_mask)
        if dtype_name(m) == "bool":
            keep = m
        elif dtype_name(m) in ("uint8", "int8"):
            raise_error(DTypeError, 7,
                        f"attn_mask has dtype {dtype_name(m)}; pass a bool mask (True = attend) "
                        "or a float mask")
        else:
            bias = float32(m) if dtype_name(m).startswith(("float", "bfloat")) else m
        if lk is not None:
            if keep is not None:
                keep = expand_keys(keep, lk)
            else:
                bias = expand_keys(bias, lk)
    qshape = tuple(q.shape)
    vshape = tuple(v.shape)
    out_shape = qshape[:-1] + (vshape[-1] if vshape else 0,)
    out = empty_out(q, out_shape)
    _mha.attention(eng, q, k, v, out, layout="bhsd", keep=keep, bias=bias,
                   causal=_mha.CAUSAL_TOP_LEFT if is_causal else 0,
                   scale=float(scale) if scale is not None else 0.0)
    return out if is_torch(out) else like(query, out)


def attention(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    *,
    layout: str = "bshd",
    keep: Optional[ArrayLike] = None,
    bias: Optional[ArrayLike] = None,
    causal: str = "none",
    key_lengths: Optional[ArrayLike] = None,
    key_keep: Optional[ArrayLike] = None,
    window: Optional[tuple] = None,
    softcap: float = 0.0,
    sinks: Optional[ArrayLike] = None,
    scale: Optional[float] = None,
    need_weights: bool = False,
    out: Optional[np.ndarray] = None,
    kv_dtype: Optional[str] = None,
    k_scales: Optional[ArrayLike] = None,
    v_scales: Optional[ArrayLike] = None,
    num_threads: Optional[int] = None,
    isa: Optional[str] = None,
    engine: Optional[Engine] = None,
) -> Any:
    """``mha_attention`` with the C API's own conventions.

    Args:
        q, k, v: ``[B, L, H, d]`` (``layout="bshd"``, the C API's) or
            ``[B, H, L, d]`` (``"bhsd"``); q float32/float16/bfloat16 (the
            output's dtype), k and v float32/float16/bfloat16, strides as
            they are (last axis contiguous).
        keep: bool or uint8 broadcastable to ``[B, H, Lq, Lk]``, nonzero = attend.
        bias: float32 broadcastable to ``[B, H, Lq, Lk]``, added to the scores.
        causal: ``"none"``, ``"top_left"`` or ``"bottom_right"`` (a KV cache).
        key_lengths: int32 ``[B]``: keys at or past it are masked and never read.
        key_keep: bool/uint8 ``[B, Lk]`` key padding mask, nonzero = attend.
        window: ``(left, right)`` keys each side of the (bottom-right
            aligned) diagonal, -1 unbounded (FlashAttention's window_size).
        softcap: ``softcap * tanh(score / softcap)`` when > 0 (Gemma 2).
        sinks: float32 ``[H]`` sink logits joining each row's softmax (gpt-oss).
        scale: None for ``1/sqrt(d)``.
        need_weights: also return the probabilities ``[B, H, Lq, Lk]``.
        out: an output array to write (q's dtype and layout); else allocated.
        kv_dtype: what 8-bit ``k``/``v`` codes are: ``"i8"`` (int8 arrays, the
            default for them), ``"fp8_e4m3"`` or ``"fp8_e5m2"`` (uint8 arrays;
            a torch float8 tensor as ``.view(torch.uint8)``).
        k_scales, v_scales: float32 scales of 8-bit codes, one per row of the
            cache (``[B, L, H]``, or ``[B, H, L]`` with ``layout="bhsd"``) or
            broadcast NumPy's way (``[H]`` per head in bshd, ``()`` per
            tensor): an element is its code times its row's scale. From
            :func:`quantize`, or the caller's.

    Returns:
        out, or (out, weights) with ``need_weights``.
    """
    modes = {"none": 0, "top_left": 1, "bottom_right": 2}
    if causal not in modes:
        raise_error(ArgumentError, 8, f"causal must be one of {sorted(modes)}, not {causal!r}")
    eng = pick_engine(engine, num_threads, isa)
    qa, va = as_array(q), as_array(v)
    if out is None:
        out = empty_out(qa, tuple(qa.shape)[:-1] + (tuple(va.shape)[-1],))
    weights = None
    if need_weights:
        qs, ks = tuple(qa.shape), tuple(as_array(k).shape)
        if len(qs) == 4 and len(ks) == 4:
            b, h, lq = (qs[0], qs[1], qs[2]) if layout == "bhsd" else (qs[0], qs[2], qs[1])
            lk = ks[2] if layout == "bhsd" else ks[1]
        else:
            b, h, lq, lk = qs[0], 1, qs[1], ks[1]
        weights = np.empty((b, h, lq, lk), dtype=np.float32)
    _mha.attention(eng, qa, as_array(k), va, out, layout=layout, keep=keep, bias=bias,
                   causal=modes[causal], scale=float(scale) if scale is not None else 0.0,
                   weights=weights, key_lengths=key_lengths, key_keep=key_keep,
                   window=window, softcap=float(softcap), sinks=sinks, kv_dtype=kv_dtype,
                   k_scales=None if k_scales is None else as_array(k_scales),
                   v_scales=None if v_scales is None else as_array(v_scales))
    result = out if is_torch(out) else like(q, out)
    return (result, like(q, weights)) if need_weights else result


def quantize(
    x: ArrayLike,
    dtype: str = "i8",
    *,
    per: str = "row",
    layout: str = "bshd",
) -> tuple:
    """``mha_quantize``: a float32 K or V cache as 8-bit codes and scales.

    Args:
        x: float32 ``[B, L, H, d]`` (or ``[B, H, L, d]`` with ``layout="bhsd"``).
        dtype: ``"i8"`` (int8 codes), ``"fp8_e4m3"`` or ``"fp8_e5m2"`` (uint8
            codes; ``codes.view(torch.float8_e4m3fn)`` is the torch type).
        per: ``"row"`` (a scale per (b, l, h) row), ``"head"`` or ``"tensor"``:
            each scale is absmax / 127 (448, 57344) over the finite elements
            it covers, codes the nearest, ties to even, saturated (the C
            header's ``mha_quantize``).

    Returns:
        ``(codes, scales)`` as NumPy arrays (torch tensors for a torch x),
        ready for :func:`attention`'s ``k``/``k_scales`` with ``kv_dtype=dtype``.
    """
    if per not in ("row", "head", "tensor"):
        raise_error(ArgumentError, 8, f"per must be 'row', 'head' or 'tensor', not {per!r}")
    xa = as_array(x)
    shape = tuple(xa.shape)
    if len(shape) != 4:
        raise_error(ShapeError, 2, f"x has shape {shape}; expected 4 dimensions "
                    "([B, L, H, d] or [B, H, L, d])")
    codes = np.empty(shape, dtype=np.int8 if dtype == "i8" else np.uint8)
    head_axis = 1 if layout == "bhsd" else 2
    if per == "row":
        scales = np.empty(shape[:3], dtype=np.float32)
    elif per == "head":
        scales = np.empty((shape[head_axis],) + ((1,) if layout == "bhsd" else ()),
                          dtype=np.float32)
    else:
        scales = np.empty((), dtype=np.float32)
    _mha.quantize(xa, codes, scales, dtype, layout=layout)
    if is_torch(xa):
        import torch

        return torch.from_numpy(codes), torch.from_numpy(scales)
    return codes, scales


def attention_varlen(
    q: ArrayLike,
    k: ArrayLike,
    v: ArrayLike,
    cu_seqlens_q: ArrayLike,
    *,
    cu_seqlens_k: Optional[ArrayLike] = None,
    block_table: Optional[ArrayLike] = None,
    seqlens: Optional[ArrayLike] = None,
    kv_layout: str = "bshd",
    causal: str = "none",
    window: Optional[tuple] = None,
    softcap: float = 0.0,
    sinks: Optional[ArrayLike] = None,
    scale: Optional[float] = None,
    out: Optional[np.ndarray] = None,
    kv_dtype: Optional[str] = None,
    k_scales: Optional[ArrayLike] = None,
    v_scales: Optional[ArrayLike] = None,
    num_threads: Optional[int] = None,
    isa: Optional[str] = None,
    engine: Optional[Engine] = None,
) -> Any:
    """``mha_attention_varlen``: one call for a batch of sequences of their
    own lengths (FlashAttention's varlen functions).

    Args:
        q: packed ``[total_q, H, d]`` float32/float16/bfloat16; sequence b owns rows
            ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` (int32 ``[B+1]``).
        k, v: packed ``[total_k, Hkv, d]`` with ``cu_seqlens_k``, or the pool of
            a paged cache with ``block_table`` (int32 ``[B, max_blocks]``) and
            ``seqlens`` (int32 ``[B]``): ``[num_blocks, block_size, Hkv, d]``
            (``kv_layout="bshd"``) or ``[num_blocks, Hkv, block_size, d]``
            (``"bhsd"``). float32, float16 or bfloat16, read in place.
        causal: ``"none"``, ``"top_left"`` or ``"bottom_right"``, per sequence.
        window, softcap, sinks, scale: as :func:`attention`.
        out: ``[total_q, H, dv]`` of q's dtype to write; else allocated.
        kv_dtype, k_scales, v_scales: 8-bit codes as :func:`attention` takes
            them; the scales over the pool's rows (``[num_blocks, block_size,
            Hkv]`` in bshd, ``[..., 1]`` one per token) or the packed keys'
            (``[total_k, Hkv]``), as :func:`quantize_paged` writes them.

    Returns:
        out, of q's kind.
    """
    modes = {"none": 0, "top_left": 1, "bottom_right": 2}
    if causal not in modes:
        raise_error(ArgumentError, 8, f"causal must be one of {sorted(modes)}, not {causal!r}")
    eng = pick_engine(engine, num_threads, isa)
    qa, va = as_array(q), as_array(v)
    if out is None:
        out = empty_out(qa, tuple(qa.shape)[:-1] + (tuple(va.shape)[-1],))
    _mha.attention_varlen(eng, qa, as_array(k), va, out, as_array(cu_seqlens_q),
                          cu_seqlens_k=cu_seqlens_k, block_table=block_table, seqlens=seqlens,
                          kv_layout=kv_layout, causal=modes[causal],
                          scale=float(scale) if scale is not None else 0.0, window=window,
                          softcap=float(softcap), sinks=sinks, kv_dtype=kv_dtype,
                          k_scales=None if k_scales is None else as_array(k_scales),
                          v_scales=None if v_scales is None else as_array(v_scales))
    return out if is_torch(out) else like(q, out)


def quantize_paged(
    x: ArrayLike,
    pool: ArrayLike,
    scales: ArrayLike,
    slots: ArrayLike,
    dtype: str = "i8",
    *,
    kv_layout: str = "bshd",
) -> None:
    """``mha_quantize_paged``: new tokens into a quantised paged cache, by
    slot (vLLM's ``slot_mapping``), in place.

    Args:
        x: float32 ``[n, Hkv, d]`` (or ``[B, S, Hkv, d]``): the tokens' rows.
        pool: the codes, ``[num_blocks, block_size, Hkv, d]`` (``kv_layout=
            "bhsd"``: ``[num_blocks, Hkv, block_size, d]``), int8 for ``"i8"``,
            uint8 for ``"fp8_e4m3"`` / ``"fp8_e5m2"``.
        scales: float32 over the pool's rows (``[num_blocks, block_size, Hkv]``,
            or ``[num_blocks, block_size, 1]`` for one scale per token): each
            written slot's are computed (absmax / 127, 448 or 57344).
        slots: int64 ``[n]``: token t goes to block ``slots[t] // block_size``,
            position ``slots[t] % block_size``; a negative slot skips it.

    Nothing outside the written slots changes; bad input raises before
    anything is written.
    """
    _mha.quantize_paged(as_array(x), as_array(pool), as_array(scales), as_array(slots),
                        dtype, kv_layout=kv_layout)

