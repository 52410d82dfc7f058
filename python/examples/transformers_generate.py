"""A Hugging Face model with its attention run by libmha: one argument.

    python python/examples/transformers_generate.py [model-path-or-id] [--prompt TEXT]

With a model (a local checkpoint, or a Hub id when you are online) it loads
it with attn_implementation="libmha" and generates greedily from the
prompt; without one it builds a small random Llama (no download) and
generates from random tokens. Either way it then generates the same with
"sdpa" and says whether the tokens agree.
"""
import argparse
import time

import torch
import transformers

import libmha.transformers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", help="checkpoint path or Hub id (default: a tiny random Llama)")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()

    libmha.transformers.register(num_threads=args.threads)  # "libmha", "paged|libmha"
    if args.model:
        tok = transformers.AutoTokenizer.from_pretrained(args.model)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.model, attn_implementation="libmha", dtype=torch.float32).eval()
        inputs = tok(args.prompt, return_tensors="pt")
    else:
        cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                                       num_hidden_layers=2, num_attention_heads=8,
                                       num_key_value_heads=2)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).eval()
        model.set_attn_implementation("libmha")
        tok = None
        inputs = {"input_ids": torch.randint(0, 256, (1, 24)),
                  "attention_mask": torch.ones(1, 24, dtype=torch.long)}
    outs = {}
    for impl in ("libmha", "sdpa"):
        model.set_attn_implementation(impl)
        t = time.perf_counter()
        with torch.inference_mode():
            outs[impl] = model.generate(**inputs, do_sample=False, max_new_tokens=args.new_tokens,
                                        pad_token_id=0)
        print(f"{impl}: {args.new_tokens} tokens in {time.perf_counter() - t:.2f} s")
    new = outs["libmha"][0, inputs["input_ids"].shape[1]:]
    print("libmha:", tok.decode(new) if tok else new.tolist())
    same = torch.equal(outs["libmha"], outs["sdpa"])
    print("same tokens as sdpa:", same)
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
