"""Helpers shared by the SDPA function and the layer: engines, array kinds."""
from __future__ import annotations

import threading
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from . import _mha

ArrayLike = Any  # NumPy array, PyTorch CPU tensor, or any buffer/DLPack/array-interface object

_engines: Dict[Tuple[int, str], _mha.Engine] = {}
_engines_lock = threading.Lock()


def get_engine(num_threads: Optional[int] = None, isa: Optional[str] = None) -> _mha.Engine:
    """The shared engine for (num_threads, isa), created on first use.

    ``num_threads`` None or 0 uses OpenMP's default; ``isa`` None or
    ``"auto"`` picks the best ISA (the ``MHA_ISA`` variable overrides).
    Engines are immutable, so one per setting serves every thread.
    """
    key = (int(num_threads or 0), str(isa or "auto"))
    engine = _engines.get(key)
    if engine is None:
        with _engines_lock:
            engine = _engines.get(key)
            if engine is None:
                engine = _mha.Engine(num_threads=key[0], isa=key[1])
                _engines[key] = engine
    return engine


def pick_engine(engine: Optional[_mha.Engine], num_threads: Optional[int],
                isa: Optional[str]) -> _mha.Engine:
    if engine is not None:
        if num_threads is not None or isa is not None:
            raise TypeError("give either engine or num_threads/isa, not both")
        return engine
    return get_engine(num_threads, isa)


def raise_error(cls: type, status: int, message: str) -> None:
    err = cls(message)
    err.status = status
    raise err


def is_torch(x: Any) -> bool:
    return type(x).__module__.split(".", 1)[0] == "torch"


def dtype_name(x: Any) -> str:
    """'float32', 'float16', 'bfloat16', 'bool', ... for NumPy and PyTorch."""
    d = getattr(x, "dtype", None)
    if d is None:
        return "unknown"
    name = getattr(d, "name", None)
    if isinstance(name, str):
        return name
    return str(d).replace("torch.", "")


def as_array(x: Any) -> Any:
    """x itself when it has a shape (NumPy, PyTorch); else a NumPy view."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        if is_torch(x):
            if x.device.type != "cpu":
                raise_error(_mha.DeviceError, 7,
                            f"a tensor is on device {x.device}; libmha computes on the "
                            "CPU: move it there first (.cpu())")
            if x.requires_grad:
                return x.detach()
        return x
    if hasattr(x, "__dlpack__") and not hasattr(x, "__array_interface__"):
        return np.from_dlpack(x)
    try:
        memoryview(x).release()
    except TypeError:
        if not hasattr(x, "__array_interface__"):
            raise_error(_mha.DTypeError, 7,
                        f"{type(x).__name__} is not an array: libmha takes objects with the "
                        "buffer protocol, DLPack (__dlpack__) or __array_interface__")
    return np.asarray(x)


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy view of a CPU array (a copy only for dtypes NumPy lacks)."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        x = x.detach()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.cpu().numpy()
    return np.asarray(as_array(x))


def float32_contiguous(x: Any) -> Any:
    """x as a C-contiguous float32 array of its own kind; no copy if it is one."""
    if is_torch(x):
        import torch

        return x.detach().to(torch.float32).contiguous()
    return np.ascontiguousarray(to_numpy(x), dtype=np.float32)


def float32(x: Any) -> Any:
    """x in float32, strides kept where no conversion is needed."""
    if dtype_name(x) == "float32":
        return x
    if is_torch(x):
        import torch

        return x.detach().to(torch.float32)
    return to_numpy(x).astype(np.float32)


def empty_out(ref: Any, shape: tuple) -> Any:
    """An output array for query ref: its compute dtype (float32, or the
    query's float16/bfloat16) and its kind (a torch tensor for torch, else
    NumPy). libmha writes it in place."""
    name = dtype_name(ref)
    if is_torch(ref):
        import torch

        dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(name, torch.float32)
        return torch.empty(shape, dtype=dt)
    if name == "float16":
        return np.empty(shape, dtype=np.float16)
    return np.empty(shape, dtype=np.float32)


def like(ref: Any, out: np.ndarray, dtype_of: Any = None) -> Any:
    """out (float32 NumPy) returned as ref's kind, in dtype_of's dtype if it is half."""
    half = dtype_of is not None and dtype_name(dtype_of) in ("float16", "bfloat16")
    if is_torch(ref):
        import torch

        t = torch.from_numpy(out)
        return t.to(dtype_of.dtype) if half else t
    if half and dtype_name(dtype_of) == "float16":
        return out.astype(np.float16)
    return out


def expand_keys(mask: Any, lk: int) -> Any:
    """A mask whose last axis is 1 broadcast to Lk keys (libmha reads keys
    contiguously), materialised."""
    shape = tuple(mask.shape)
    if not shape or shape[-1] != 1 or lk == 1:
        return mask
    if is_torch(mask):
        return mask.expand(*shape[:-1], lk).contiguous()
    return np.ascontiguousarray(np.broadcast_to(to_numpy(mask), shape[:-1] + (lk,)))


IsaName = Union[str, None]
