"""Decode tokens/s and prefill time of a small Llama-shaped model, with
transformers' "sdpa" and libmha's backend in the same run.

    python python/examples/transformers_bench.py [--contexts 512 2048 8192]
        [--threads 1 2] [--steps 16] [--layers 4]

The model is random-initialised (no download): hidden 2048, 16 heads,
4 KV heads (head dim 128), intermediate 4096, 4 layers, vocabulary 1024.
For each thread count and context: the prefill of one prompt of that many
tokens (one timed call per implementation), then decode steps from the same
cache (cropped back to the context before each implementation) -- median
step time and tokens/s. Last, the boundary cost: at the longest context,
one layer's decode attention through the backend function against a direct
libmha call on the same cache tensors (median of repeated calls); the
ratio says what the boundary adds (no K/V copy is made).
"""
import argparse
import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import libmha
import libmha.transformers as lt


def model_of(layers):
    cfg = LlamaConfig(vocab_size=1024, hidden_size=2048, intermediate_size=4096,
                      num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                      max_position_embeddings=16384)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def prefill(model, impl, ids):
    model.set_attn_implementation(impl)
    cache = DynamicCache(config=model.config)
    t = time.perf_counter()
    with torch.inference_mode():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    return time.perf_counter() - t, cache, out.logits[:, -1].argmax(-1, keepdim=True)


def crop(cache, ctx):
    extra = cache.get_seq_length() - ctx
    if extra > 0:
        cache.crop(-extra)


def decode(model, impl, cache, ctx, token, steps):
    model.set_attn_implementation(impl)
    crop(cache, ctx)
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            t = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
    return statistics.median(times)


def boundary(model, cache, reps=30):
    """One layer's decode attention: the backend function vs libmha direct."""
    layer = model.model.layers[0].self_attn
    k, v = cache.layers[0].keys, cache.layers[0].values  # [1, 4, ctx, 128]
    q = torch.randn(1, 16, 1, 128)
    out = torch.empty(1, 1, 16, 128)
    eng = libmha.get_engine(torch.get_num_threads())

    def direct():
        libmha._mha.attention(eng, q, k, v, out, layout="bhsd", out_layout="bshd",
                              scale=layer.scaling)

    def backend():
        lt.attention_forward(layer, q, k, v, None, scaling=layer.scaling)

    res = {}
    for name, fn in (("direct", direct), ("backend", backend)) * 2:
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        res[name] = statistics.median(ts)
    return res["backend"], res["direct"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    model = model_of(args.layers)
    print(f"libmha {libmha.version()} isa {libmha.isa()}, torch {torch.__version__}, "
          f"model hidden 2048 heads 16 kv 4 layers {args.layers}")
    print("| threads | context | prefill sdpa (s) | prefill libmha (s) | speedup | "
          "decode sdpa (tok/s) | decode libmha (tok/s) | speedup |")
    print("|---|---|---|---|---|---|---|---|")
    last = None
    for threads in args.threads:
        torch.set_num_threads(threads)
        lt.register(num_threads=threads)
        for ctx in args.contexts:
            ids = torch.randint(0, 1024, (1, ctx), generator=torch.Generator().manual_seed(ctx))
            p = {}
            for impl in ("sdpa", "libmha"):
                p[impl], cache, token = prefill(model, impl, ids)
            d = {impl: decode(model, impl, cache, ctx, token, args.steps)
                 for impl in ("sdpa", "libmha", "sdpa", "libmha")}
            print(f"| {threads} | {ctx} | {p['sdpa']:.2f} | {p['libmha']:.2f} | "
                  f"{p['sdpa'] / p['libmha']:.2f}x | {1 / d['sdpa']:.1f} | "
                  f"{1 / d['libmha']:.1f} | {d['sdpa'] / d['libmha']:.2f}x |", flush=True)
            last = (threads, ctx, cache)
    threads, ctx, cache = last
    crop(cache, ctx)
    b, dr = boundary(model, cache)
    print(f"boundary at context {ctx}, {threads} threads, one layer's decode attention: "
          f"backend {b * 1e6:.0f} us, direct libmha {dr * 1e6:.0f} us ({b / dr:.3f}x)")


if __name__ == "__main__":
    main()
