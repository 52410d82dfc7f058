#!/usr/bin/env python3
"""Checks libmha against PyTorch on your own model: every nn.MultiheadAttention
in it, and F.scaled_dot_product_attention on random inputs of its shapes.

    python parity_check.py                  # a demo model
    python parity_check.py my_model.pt      # a pickled nn.Module (torch.load)

Needs torch, numpy and libmha (pip install . from the libmha repository).
Prints the largest absolute difference of each layer; exits 1 past --tol.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import libmha


def demo_model() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=8, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="a torch.save()d nn.Module (default: a demo)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=33)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    model = torch.load(args.model, weights_only=False) if args.model else demo_model()
    model.eval()
    print(f"libmha {libmha.__version__}, ISA {libmha.isa()} (available: "
          f"{', '.join(libmha.available_isas())}), torch {torch.__version__}")
    worst = 0.0
    found = 0
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.MultiheadAttention):
            continue
        found += 1
        ours = libmha.MultiheadAttention.from_torch(mod, num_threads=args.threads)
        shape = (args.batch, args.seq, mod.embed_dim)
        if not mod.batch_first:
            shape = (args.seq, args.batch, mod.embed_dim)
        x = torch.randn(*shape)
        kv_shape = list(shape)
        kv_shape[-1] = mod.kdim
        k = torch.randn(*kv_shape) if mod.kdim != mod.embed_dim else x
        kv_shape[-1] = mod.vdim
        v = torch.randn(*kv_shape) if mod.vdim != mod.embed_dim else x
        pad = torch.zeros(args.batch, args.seq, dtype=torch.bool)
        pad[0, args.seq // 2:] = True  # True = padding (masked), as in PyTorch
        causal = torch.nn.Transformer.generate_square_subsequent_mask(args.seq)
        with torch.no_grad():
            for label, kw in [("plain", {}), ("key_padding_mask", dict(key_padding_mask=pad)),
                              ("causal float mask", dict(attn_mask=causal))]:
                if kw.get("attn_mask") is not None and k is not x:
                    continue
                expect, expect_w = mod(x, k, v, **kw)
                got, got_w = ours(x, k, v, **kw)
                diff = max((got - expect).abs().max().item(), (got_w - expect_w).abs().max().item())
                worst = max(worst, diff)
                print(f"{name or '<model>'} [{label}]: max |libmha - torch| = {diff:.2e}")
    q = torch.randn(args.batch, 8, args.seq, 64)
    k = torch.randn(args.batch, 8, args.seq, 64)
    for label, kw in [("sdpa", {}), ("sdpa causal", dict(is_causal=True))]:
        diff = (libmha.scaled_dot_product_attention(q, k, k, **kw) -
                F.scaled_dot_product_attention(q, k, k, **kw)).abs().max().item()
        worst = max(worst, diff)
        print(f"{label}: max |libmha - torch| = {diff:.2e}")
    print(f"{found} nn.MultiheadAttention layer(s); worst difference {worst:.2e} "
          f"({'within' if worst <= args.tol else 'PAST'} {args.tol:g})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
