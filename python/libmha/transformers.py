"""libmha as a Hugging Face ``transformers`` attention backend.

    import libmha.transformers
    libmha.transformers.register()          # "libmha" and "paged|libmha"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="libmha")

What a model sends is mapped to the engine's own terms, not to a dense mask
(see docs/python.md, "transformers backend"):

- the mask side: :func:`register` also registers a mask function under the
  same name. For the patterns the engine expresses itself (causal,
  bidirectional, causal sliding window) it returns what FlashAttention's
  mask function returns: ``None``, or the 2-D ``[B, Lk]`` padding mask,
  which the engine reads in place as its key padding mask. Any other
  pattern (packed sequences, image-token blocks, a static cache whose
  queries do not end at its last key) is materialised as transformers' own
  4-D boolean mask and passed as an explicit mask: correct, slower, said
  once in the log.
- causal is bottom-right (a decode step or a chunked prefill over a KV
  cache); windows, logit softcap (Gemma 2) and attention sinks (gpt-oss,
  ``s_aux``) are the engine's score terms; grouped KV heads are read as
  they are (no ``repeat_kv``).
- q, K and V are read in place from transformers' tensors, in their dtype
  (float32, float16, bfloat16); the output is written once, in the query's
  dtype and the ``[B, L, H, d]`` layout transformers wants. Scores, softmax
  and accumulation are float32 whatever the dtypes.
- continuous batching (``model.generate_batch``, ``transformers serve``):
  the same function sees transformers' paged cache; new keys are written
  into it and the attention reads the cache's slots in place through a
  block table (libmha's paged varlen call), never through transformers'
  gather of the sequence. Layers whose cache is a sliding ring buffer are
  read through transformers' own update (a gather) and the packed varlen
  call, said once in the log.
- inference only: dropout above zero or a tensor that needs gradients is
  refused with ``libmha.ArgumentError``.
"""
from __future__ import annotations

import logging
import math
import threading
from typing import Any, Callable, Optional, Tuple

import torch

from . import _mha
from ._common import get_engine, raise_error
from ._mha import ArgumentError, UnsupportedError

__all__ = ["register", "attention_forward", "mask_function", "NAME"]

NAME = "libmha"
logger = logging.getLogger("libmha.transformers")
_said = set()
_said_lock = threading.Lock()
_engine_settings = {"num_threads": None, "isa": None}


def _once(key: str, message: str) -> None:
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    logger.warning(message)


def _engine():
    return get_engine(_engine_settings["num_threads"], _engine_settings["isa"])


# ----------------------------------------------------------------------
# Registration


def register(name: str = NAME, *, num_threads: Optional[int] = None,
             isa: Optional[str] = None) -> str:
    """Registers libmha with transformers under ``name`` (and ``"paged|" +
    name``) in its ``AttentionInterface`` and ``AttentionMaskInterface``,
    and lets continuous batching use it. Returns ``name``.

    ``num_threads`` and ``isa`` choose the engine (None: OpenMP's default
    and the best ISA, as :func:`libmha.get_engine`). Calling it again
    changes them; the registration itself happens once per name.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _engine_settings["num_threads"] = num_threads
    _engine_settings["isa"] = isa
    AttentionInterface.register(name, attention_forward)
    AttentionInterface.register("paged|" + name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
    AttentionMaskInterface.register("paged|" + name, mask_function)
    _allow_continuous_batching(name)
    return name


def _allow_continuous_batching(name: str) -> None:
    """transformers 5.2x accepts only "sdpa", "paged|eager" and flash
    implementations for continuous batching (ContinuousBatchingManager.
    switch_to_cb_friendly_attn raises for any other name). libmha takes the
    inputs it prepares for flash implementations (packed queries,
    cu_seq_lens, no mask), so the check is widened to libmha's names; the
    decode fast path (flash_attn_with_kvcache on CUDA) stays off, as for any
    CPU run."""
    try:
        from transformers.generation.continuous_batching import continuous_api as api
        from transformers.generation.continuous_batching import input_outputs as io
    except ImportError:  # no continuous batching in this transformers
        return
    names = getattr(api, "_libmha_names", set())
    names.update({name, "paged|" + name})
    if getattr(api, "_libmha_names", None) is None:
        api._libmha_names = names
        manager = getattr(api, "ContinuousBatchingManager", None)
        original = getattr(manager, "switch_to_cb_friendly_attn", None)
        if original is not None:
            def switch(self, model, auto_switch_to_flash=True):
                if model.config._attn_implementation in names:
                    return None
                return original(self, model, auto_switch_to_flash)
            manager.switch_to_cb_friendly_attn = switch
        # The batch's inputs: no mask (libmha masks per sequence itself).
        needed = getattr(io, "attn_mask_is_needed", None)
        if needed is not None:
            def attn_mask_is_needed(config):
                return config._attn_implementation not in names and needed(config)
            io.attn_mask_is_needed = attn_mask_is_needed


# ----------------------------------------------------------------------
# The mask side


def _cells(fn: Callable) -> dict:
    """A closure's free variables by name."""
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__closure__:
        return {}
    return dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__)))


def _is(fn: Callable, maker: str) -> bool:
    return getattr(fn, "__qualname__", "") == maker + ".<locals>.inner_mask"


def _pattern(fn: Callable) -> Optional[Tuple[str, Optional[int]]]:
    """("causal" | "bidirectional", window or None) for the mask functions
    libmha expresses with its own terms; None for any other."""
    from transformers import masking_utils as mu

    if fn is mu.causal_mask_function:
        return ("causal", None)
    if fn is mu.bidirectional_mask_function:
        return ("bidirectional", None)
    # sliding_window_causal_mask_function(w) is
    # and_masks(sliding_window_overlay(w), causal_mask_function).
    if getattr(fn, "__qualname__", "") == "and_masks.<locals>.and_mask":
        parts = _cells(fn).get("mask_functions")
        if isinstance(parts, tuple) and len(parts) == 2 and parts[1] is mu.causal_mask_function \
                and _is(parts[0], "sliding_window_overlay"):
            w = _cells(parts[0]).get("sliding_window")
            if isinstance(w, int) and w > 0:
                return ("causal", w)
    return None


def _packed(fn: Callable) -> Optional[Tuple[Tuple[str, Optional[int]], torch.Tensor]]:
    """transformers' packed-sequence form of a pattern libmha expresses
    (position ids restarting inside a row: packed_sequence_compatibility_
    function): the pattern and the [B, L] sequence ids; else None."""
    if getattr(fn, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return None
    parts = _cells(fn).get("mask_functions")
    if not (isinstance(parts, tuple) and len(parts) == 2
            and _is(parts[0], "packed_sequence_mask_function")
            and _is(parts[1], "remap_positions_for_packed_sequence")):
        return None
    ids = _cells(parts[0]).get("packed_sequence_mask")
    pattern = _pattern(_cells(parts[1]).get("mask_function"))
    if pattern is None or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    return pattern, ids


def mask_function(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                  kv_offset: int = 0, mask_function: Optional[Callable] = None,
                  attention_mask: Optional[torch.Tensor] = None, **kwargs: Any):
    """transformers' mask-interface function for libmha: None or a 2-D
    ``[B, kv_length]`` bool padding mask where the engine's own terms say
    the rest; for packed sequences (position ids restarting in a row) the
    int32 ``[B, L]`` sequence ids, which the attention function turns into
    varlen calls; else transformers' explicit 4-D boolean mask."""
    from transformers import masking_utils as mu

    fn = mask_function if mask_function is not None else mu.causal_mask_function
    pattern = _pattern(fn)
    aligned = pattern is not None and (
        pattern[0] == "bidirectional" or q_offset + q_length == kv_offset + kv_length)
    if pattern is not None and aligned:
        if attention_mask is None:
            return None
        if attention_mask.dim() == 2:
            keep = attention_mask[:, -kv_length:]
            if keep.shape[1] == kv_length:
                if bool(keep.all()):
                    return None
                return keep if keep.dtype == torch.bool else keep.bool()
    packed = _packed(fn)
    if (packed is not None and attention_mask is None and q_length == kv_length
            and q_offset == 0 and kv_offset == 0 and packed[1].shape[1] == q_length):
        return packed[1].to(torch.int32)
    name = getattr(fn, "__qualname__", repr(fn))
    why = ("its queries (from position %d) do not end at the last of its keys (%d from "
           "position %d): a static cache" % (q_offset, kv_length, kv_offset)
           if pattern is not None else "libmha has no term for it")
    _once("explicit:%s:%s" % (name, pattern is not None),
          "libmha: the mask %s is passed as an explicit [B, 1, Lq, Lk] mask (correct, slower): %s"
          % (name, why))
    kwargs.pop("allow_is_causal_skip", None)
    kwargs.pop("allow_is_bidirectional_skip", None)
    mask = mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                        q_offset=q_offset, kv_offset=kv_offset, mask_function=fn,
                        attention_mask=attention_mask, allow_is_causal_skip=False,
                        allow_is_bidirectional_skip=False, **kwargs)
    return mask


# ----------------------------------------------------------------------
# The attention function


def _refuse(message: str) -> None:
    raise_error(ArgumentError, 8, "libmha transformers backend: " + message)


def _compute(query: torch.Tensor) -> torch.dtype:
    """The compute dtype: the query's (libmha's q and out share it)."""
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise_error(UnsupportedError, 7,
                    f"libmha transformers backend: query has dtype {query.dtype}; libmha takes "
                    "float32, float16 or bfloat16")
    return query.dtype


def _window(sliding_window: Optional[int], causal: bool) -> Optional[Tuple[int, int]]:
    # transformers' sliding window w shows key j to query i when i - w < j
    # (sliding_window_overlay): w - 1 keys to the left.
    if not sliding_window:
        return None
    w = int(sliding_window)
    return (w - 1, 0 if causal else w - 1)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                      dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, sliding_window: Optional[int] = None,
                      softcap: Optional[float] = None, s_aux: Optional[torch.Tensor] = None,
                      cache: Any = None, **kwargs: Any):
    """transformers' attention-interface function: query ``[B, H, Lq, d]``,
    key/value ``[B, Hkv, Lk, d]`` (``[1, H, total, d]`` packed under
    continuous batching); returns ``([B, Lq, H, dv], None)``."""
    if dropout:
        _refuse(f"dropout={dropout}: libmha is inference only (eval mode, dropout 0)")
    if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad
                                    or value.requires_grad):
        _refuse("a tensor requires gradients: libmha is inference only (use torch.no_grad() "
                "or torch.inference_mode())")
    if kwargs.get("position_bias") is not None:
        raise_error(UnsupportedError, 7,
                    "libmha transformers backend: position_bias (T5-style relative bias) is "
                    "not supported; use attn_implementation='sdpa' for this model")
    if kwargs.get("output_attentions", False):
        _once("weights", "libmha: output_attentions=True is not supported by this backend; "
              "no weights are returned")
    for t in (query, key, value):
        if t.device.type != "cpu":
            raise_error(_mha.DeviceError, 7,
                        f"libmha transformers backend: a tensor is on {t.device}; libmha "
                        "computes on the CPU")
    sinks = s_aux
    if sinks is not None:
        sinks = sinks.detach().float().contiguous()
    scale = float(scaling) if scaling is not None else 0.0
    softcap = float(softcap) if softcap else 0.0
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))

    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    if isinstance(cache, PagedAttentionCache):
        return _paged_forward(module, query, key, value, cache, scale, causal,
                              sliding_window, softcap, sinks, kwargs)

    q = query
    b, h, lq, _ = q.shape
    dv = value.shape[-1]
    out = torch.empty((b, lq, h, dv), dtype=_compute(query))
    keep = bias = key_keep = None
    window = None
    mode = _mha.CAUSAL_NONE
    if attention_mask is not None and attention_mask.dim() == 2 and \
            attention_mask.dtype != torch.bool:
        # Packed sequences: [B, L] sequence ids from mask_function.
        mode = _mha.CAUSAL_BOTTOM_RIGHT if causal else _mha.CAUSAL_NONE
        window = _window(sliding_window, causal)
        for i in range(b):
            ids = attention_mask[i]
            starts = torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1
            cu = torch.cat([torch.zeros(1, dtype=torch.int64), starts.to(torch.int64),
                            torch.tensor([lq])]).to(torch.int32)
            _mha.attention_varlen(_engine(), q[i].transpose(0, 1), key[i].transpose(0, 1),
                                  value[i].transpose(0, 1), out[i], cu, cu_seqlens_k=cu,
                                  causal=mode, scale=scale, window=window, softcap=softcap,
                                  sinks=sinks)
        return out, None
    if attention_mask is None or attention_mask.dim() == 2:
        # The engine's own terms: causal bottom-right, the window, the
        # padding mask read in place.
        key_keep = attention_mask
        if key_keep is not None and key_keep.dtype != torch.bool:
            key_keep = key_keep.bool()
        mode = _mha.CAUSAL_BOTTOM_RIGHT if causal and lq > 1 else _mha.CAUSAL_NONE
        window = _window(sliding_window, causal)
    elif attention_mask.dtype == torch.bool:
        keep = attention_mask  # explicit: says causal and window itself
    else:
        bias = attention_mask if attention_mask.dtype == torch.float32 else attention_mask.float()
    _mha.attention(_engine(), q, key, value, out, layout="bhsd", out_layout="bshd",
                   keep=keep, bias=bias, key_keep=key_keep, causal=mode, scale=scale,
                   window=window, softcap=softcap, sinks=sinks)
    return out, None


def _block_table(read_index: torch.Tensor, cu_k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """An int32 [B, max_k] table of cache slots (blocks of one slot) from
    transformers' read index (each sequence's slots, sequence after
    sequence), and the int32 [B] key counts."""
    lens = (cu_k[1:] - cu_k[:-1]).to(torch.int64)
    nseq = lens.numel()
    width = max(int(lens.max()) if nseq else 1, 1)
    table = torch.zeros((nseq, width), dtype=torch.int32)
    if read_index.numel():
        seq = torch.repeat_interleave(torch.arange(nseq), lens)
        col = torch.arange(read_index.numel()) - cu_k[:-1].to(torch.int64)[seq]
        table[seq, col] = read_index.to(torch.int32)
    return table, lens.to(torch.int32)


def _paged_forward(module, query, key, value, cache, scale, causal, sliding_window, softcap,
                   sinks, kwargs):
    """Continuous batching: query [1, H, total_q, d], the step's new keys
    [1, Hkv, total_new, d]; transformers' kwargs carry cu_seq_lens_q, per
    layer type cu_seq_lens_k, read_index and write_index."""
    allocator = cache.layer_to_allocator[module.layer_idx]
    cu_q = kwargs["cu_seq_lens_q"].to(torch.int32).contiguous()
    cu_k = kwargs["cu_seq_lens_k"]
    if isinstance(cu_k, dict):
        cu_k = cu_k[allocator.layer_type]
    cu_k = cu_k.to(torch.int32).contiguous()
    nseq = cu_q.numel() - 1
    q = query[0].transpose(0, 1)  # [total_q, H, d], a view
    padded, h = q.shape[0], q.shape[1]
    total_q = int(cu_q[-1])  # rows past it pad the batch (zeros out)
    q = q[:total_q]
    out_all = torch.zeros((padded, h, value.shape[-1]), dtype=_compute(query))
    out = out_all[:total_q]
    mode = _mha.CAUSAL_BOTTOM_RIGHT if causal else _mha.CAUSAL_NONE
    window = _window(sliding_window, causal)
    views = getattr(allocator, "_kv_token_views", {}).get(module.layer_idx)
    read_index = kwargs["read_index"][allocator.index]
    write_index = kwargs["write_index"][allocator.index]
    if allocator.layer_type == "full_attention" and views is not None:
        k_cache, v_cache = views  # [slots, Hkv, d]
        k_new = key[0].transpose(0, 1)
        v_new = value[0].transpose(0, 1)
        k_cache.index_copy_(0, write_index, k_new)
        v_cache.index_copy_(0, write_index, v_new)
        if read_index.numel() == 0:
            # A batch of whole prompts: the new keys are all there is.
            _mha.attention_varlen(_engine(), q, k_new, v_new, out, cu_q[: nseq + 1],
                                  cu_seqlens_k=cu_k[: nseq + 1], causal=mode, scale=scale,
                                  window=window, softcap=softcap, sinks=sinks)
        else:
            table, lens = _block_table(read_index, cu_k[: nseq + 1])
            # The layer's K and V views are shifted views of one tensor
            # (V's one page shorter): the pool is what both hold.
            slots = min(k_cache.shape[0], v_cache.shape[0])
            k_cache, v_cache = k_cache[:slots], v_cache[:slots]
            # The cache as a pool of one-slot blocks, read in place.
            _mha.attention_varlen(_engine(), q, k_cache.unsqueeze(1), v_cache.unsqueeze(1), out,
                                  cu_q[: nseq + 1], block_table=table, seqlens=lens,
                                  kv_layout="bshd", causal=mode, scale=scale, window=window,
                                  softcap=softcap, sinks=sinks)
    else:
        _once("gather:" + allocator.layer_type,
              f"libmha: {allocator.layer_type} layers of the paged cache are read through "
              "transformers' own cache update (a gather per step) and libmha's packed varlen call")
        kwargs = dict(kwargs)
        key, value = cache.update(key_states=key, value_states=value,
                                  layer_idx=module.layer_idx, kwargs=kwargs)
        cu_k = kwargs["cu_seq_lens_k"].to(torch.int32).contiguous()
        _mha.attention_varlen(_engine(), q, key[0].transpose(0, 1), value[0].transpose(0, 1),
                              out, cu_q[: nseq + 1], cu_seqlens_k=cu_k[: nseq + 1],
                              causal=mode, scale=scale, window=window, softcap=softcap,
                              sinks=sinks)
    return out_all.unsqueeze(0), None
