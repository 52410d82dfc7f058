"""libmha.MultiheadAttention: nn.MultiheadAttention's forward on libmha's layer."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from . import _mha
from ._common import ArrayLike, as_array, dtype_name, float32_contiguous, is_torch, like
from ._common import pick_engine, raise_error, to_numpy

_WEIGHTS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
            "in_proj_bias", "out_proj.weight", "out_proj.bias")


def _padding_bias(kpm: Any, batch: int, lk: int) -> np.ndarray:
    """key_padding_mask [B, Lk] (True = masked, or float) as a float32 [B,1,1,Lk] bias."""
    m = to_numpy(kpm)
    if m.shape != (batch, lk):
        raise_error(_mha.MaskError, 4,
                    f"key_padding_mask has shape {m.shape}; expected (B, Lk) = ({batch}, {lk})")
    if m.dtype == np.bool_:
        b = np.where(m, np.float32(-np.inf), np.float32(0)).astype(np.float32)
    else:
        b = np.asarray(m, dtype=np.float32)
    return b.reshape(batch, 1, 1, lk)


class MultiheadAttention:
    """``torch.nn.MultiheadAttention`` (inference) computed by libmha.

    Build it from a module (:meth:`from_torch`) or give the weights of a
    state dict (:meth:`load_state_dict`). The weights are copied into the
    C layer; the object may then be called from any number of threads.

    Args:
        embed_dim, num_heads, bias, kdim, vdim, batch_first: as PyTorch's.
            ``add_bias_kv`` and ``add_zero_attn`` are not supported; dropout
            does not apply (inference).
        num_threads, isa, engine: the libmha engine to run on.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = True, *, num_threads: Optional[int] = None,
                 isa: Optional[str] = None, engine: Optional[_mha.Engine] = None) -> None:
        self.embed_dim = int(embed_dim)
        self.num_heads = int(num_heads)
        self.kdim = int(kdim) if kdim is not None else self.embed_dim
        self.vdim = int(vdim) if vdim is not None else self.embed_dim
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.engine = pick_engine(engine, num_threads, isa)
        self._layer: Optional[_mha.Layer] = None

    @classmethod
    def from_torch(cls, module: Any, *, num_threads: Optional[int] = None,
                   isa: Optional[str] = None,
                   engine: Optional[_mha.Engine] = None) -> "MultiheadAttention":
        """A copy of a ``torch.nn.MultiheadAttention``'s weights and settings."""
        if getattr(module, "bias_k", None) is not None or getattr(module, "add_zero_attn", False):
            raise_error(_mha.UnsupportedError, 7,
                        "add_bias_kv and add_zero_attn are not supported by libmha")
        self = cls(module.embed_dim, module.num_heads,
                   bias=module.in_proj_bias is not None, kdim=module.kdim, vdim=module.vdim,
                   batch_first=getattr(module, "batch_first", False),
                   num_threads=num_threads, isa=isa, engine=engine)
        self.load_state_dict(module.state_dict())
        return self

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> "MultiheadAttention":
        """Loads ``in_proj_weight`` (or ``q/k/v_proj_weight``), ``in_proj_bias``,
        ``out_proj.weight`` and ``out_proj.bias`` (tensors or arrays, ``nn.Linear``
        layout ``[out, in]``). Extra keys such as ``bias_k`` are refused."""
        extra = [k for k in state_dict if k not in _WEIGHTS]
        if extra:
            raise_error(_mha.UnsupportedError, 7,
                        f"state dict keys libmha does not take: {', '.join(sorted(extra))}")
        w: Dict[str, Any] = {}
        for key in _WEIGHTS:
            if key in state_dict and state_dict[key] is not None:
                w[key.replace(".", "_")] = np.ascontiguousarray(to_numpy(state_dict[key]),
                                                                dtype=np.float32)
        if "in_proj_weight" in w and self.kdim == self.vdim == self.embed_dim:
            # PyTorch keeps unused q/k/v weights out of the state dict already.
            pass
        self._layer = _mha.Layer(self.engine, self.embed_dim, self.num_heads,
                                 self.kdim if self.kdim != self.embed_dim else 0,
                                 self.vdim if self.vdim != self.embed_dim else 0, **w)
        return self

    def forward(self, query: ArrayLike, key: ArrayLike, value: ArrayLike,
                key_padding_mask: Optional[ArrayLike] = None, need_weights: bool = True,
                attn_mask: Optional[ArrayLike] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[Any, Optional[Any]]:
        """``nn.MultiheadAttention.forward`` (same argument order and meanings).

        query ``[B, Lq, E]``, key ``[B, Lk, kdim]``, value ``[B, Lk, vdim]``
        (``batch_first``; ``[L, B, E]`` otherwise; unbatched ``[L, E]``).
        ``key_padding_mask [B, Lk]`` and ``attn_mask [Lq, Lk]`` or
        ``[B*H, Lq, Lk]``: boolean **True = masked** (as in PyTorch), or float,
        added. ``is_causal`` applies a top-left causal mask (PyTorch requires
        attn_mask with it; here it may stand alone).

        Returns ``(attn_output, attn_weights)``: weights ``[B, Lq, Lk]``
        averaged over heads, ``[B, H, Lq, Lk]`` with
        ``average_attn_weights=False``, None without ``need_weights``.
        Inputs that are not float32 and C-contiguous are converted (a copy);
        the output is of the query's kind. Rows whose every key is masked
        are zeros (PyTorch gives NaN).
        """
        if self._layer is None:
            raise RuntimeError("no weights: call load_state_dict() or use from_torch()")
        ref = query
        q0 = as_array(query)
        unbatched = len(tuple(q0.shape)) == 2
        qa, ka, va = (float32_contiguous(as_array(x)) for x in (query, key, value))
        if unbatched:
            qa, ka, va = qa[None], ka[None], va[None]
            if key_padding_mask is not None:
                key_padding_mask = as_array(key_padding_mask)[None]
        elif not self.batch_first:
            qa, ka, va = (float32_contiguous(x.transpose(1, 0) if is_torch(x) else x.swapaxes(0, 1))
                          for x in (qa, ka, va))
        if len(tuple(qa.shape)) != 3 or len(tuple(ka.shape)) != 3:
            raise_error(_mha.ShapeError, 2,
                        f"query has shape {tuple(q0.shape)}; expected [B, L, E] or [L, E]")
        b, lq = int(qa.shape[0]), int(qa.shape[1])
        lk = int(ka.shape[1])
        h = self.num_heads
        keep = bias = None
        if key_padding_mask is not None:
            bias = _padding_bias(key_padding_mask, b, lk)
        if attn_mask is not None:
            am = to_numpy(attn_mask)
            if am.ndim == 3:
                if am.shape[0] not in (b * h, h if unbatched else -1):
                    raise_error(_mha.MaskError, 4,
                                f"attn_mask has shape {am.shape}; expected (Lq, Lk) or "
                                f"(B*H, Lq, Lk) = ({b * h}, {lq}, {lk})")
                am = am.reshape(b, h, am.shape[1], am.shape[2])
            if am.dtype == np.bool_:
                keep = np.logical_not(am)  # PyTorch: True = masked; libmha: nonzero = attend
            else:
                am = np.asarray(am, dtype=np.float32)
                bias = am if bias is None else np.ascontiguousarray(am + bias, dtype=np.float32)
        out = np.empty((b, lq, self.embed_dim), dtype=np.float32)
        weights = np.empty((b, h, lq, lk), dtype=np.float32) if need_weights else None
        self._layer.forward(qa, ka, va, out, keep=keep, bias=bias,
                            causal=_mha.CAUSAL_TOP_LEFT if is_causal else 0, weights=weights)
        w = None
        if weights is not None:
            w = weights.mean(axis=1) if average_attn_weights else weights
            if unbatched:
                w = w[0]
        if unbatched:
            out = out[0]
        elif not self.batch_first:
            out = np.ascontiguousarray(out.swapaxes(0, 1))
        return like(ref, out, q0 if dtype_name(q0) != "float32" else None), \
            (like(ref, w) if w is not None else None)

    __call__ = forward

    def __repr__(self) -> str:
        return (f"libmha.MultiheadAttention(embed_dim={self.embed_dim}, "
                f"num_heads={self.num_heads}, kdim={self.kdim}, vdim={self.vdim}, "
                f"batch_first={self.batch_first}, engine={self.engine!r})")
