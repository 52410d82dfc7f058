#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/fuzz_attention.c into fuzz/corpus/.

Each seed is one request in the byte layout the target reads (see the
parse order in fuzz_attention.c): valid calls of every shape family, every
mask kind, half-precision K/V, special values, and invalid calls of every
kind. Run it again after changing the layout: python3 fuzz/make_seeds.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

ISA = {"auto": 0, "generic": 1, "avx2": 2, "neon": 3, "bad4": 4, "bad-1": 5,
       "null-config": 8}
THREADS = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, -1: 5, -8: 6}
DTYPE = {"f32": 0, "f16": 4, "bf16": 5, "bad3": 6, "bad-1": 7}
CAUSAL = {"none": 0, "top-left": 3, "bottom-right": 5, "bad3": 7, "bad-1": 8}
# Special value classes of inject_specials.
NAN, NEG_NAN, INF, NEG_INF, DENORM_MIN, DENORM, NEG_DENORM = range(7)
NEG_ZERO, HUGE, NEG_FLT_MAX, FLT_MAX = 7, 8, 9, 10
WILD = {0: 0, -1: 1, 1: 2, 2: 3, -2: 4, 3: 5, 7: 6, 64: 7, 65536: 8,
        "i32max": 9, "2^31": 10, "2^32": 11, "2^40": 13, "sqrt2^63": 14,
        "2^61": 15, "2^62": 16, "i64max": 18, "i64min": 19}


def seq(n):
    """The byte take_seq reads as n (1..24, or 25 + 6k up to 325)."""
    if 1 <= n <= 24:
        return n - 1
    assert n >= 25 and (n - 25) % 6 == 0 and n <= 25 + 55 * 6
    return 200 + (n - 25) // 6


def mask(present=0, causal="none", keep=None, bias=None, lengths=None):
    """11 bytes. keep/bias: (mode, pad, density[, magnitude]);
    lengths: (mode, bad)."""
    bits = present
    keep = keep or (0, 0, 0)
    bias = bias or (0, 0, 0, 0)
    if len(bias) == 3:
        bias = bias + (0,)
    lengths = lengths or (0, 0)
    return bytes([bits, CAUSAL[causal], *keep, *bias, *lengths])


def mask_bits(keep=False, bias=False, lengths=False):
    return 1 | (2 if keep else 0) | (4 if bias else 0) | (8 if lengths else 0)


def specials(items=()):
    """items: (target, index, value class, run code 0..7)."""
    out = bytes([len(items)])
    for target, index, cls, run in items:
        out += bytes([target, index & 255, index >> 8, (run << 4) | cls])
    return out + bytes(4 * (8 - len(items)))


def corruptions(items=()):
    """items: (target, wild value key or ('raw', int64))."""
    if not items:
        return bytes([0])
    out = bytes([160 + len(items) - 1])
    for target, value in items:
        if isinstance(value, tuple):
            out += bytes([target, 255]) + struct.pack("<q", value[1])
        else:
            out += bytes([target, WILD[value]])
    return out


def attention(isa="auto", threads=1, B=1, Lq=4, Lk=5, Hkv=1, group=1, d=8,
              dv=8, layouts=((0, 0, 0, 0),) * 4, weights=0, misalign=0,
              alias=0, scale=(0, 0, 0), msk=None, seed=1, k="f32", v="f32",
              spec=(), corrupt=()):
    """scale: (class, parameter, raw float bits)."""
    b = bytes([0, ISA[isa], THREADS[threads], B - 1, seq(Lq), seq(Lk),
               Hkv - 1, group - 1, d - 1, dv - 1])
    for lay in layouts:
        b += bytes(lay)
    b += bytes([weights, misalign, alias, scale[0], scale[1]])
    b += struct.pack("<I", scale[2])
    b += msk if msk is not None else mask()
    b += struct.pack("<I", seed)
    b += bytes([DTYPE[k] | DTYPE[v] << 3])
    return b + specials(spec) + corruptions(corrupt)


def layer(isa="auto", threads=1, H=2, dh=4, kdim=0, vdim=0, form=0,
          in_bias=1, out_bias=1, null_out_w=0, B=1, Lq=4, Lk=4, weights=0,
          misalign=0, alias=0, msk=None, seed=1, spec=(), corrupt=()):
    """form: 0 in_proj, 3 q/k/v, 6 both (invalid), 7 q only (invalid)."""
    kc = 0 if kdim == 0 else 160 + (kdim - 1) % 48
    vc = 0 if vdim == 0 else 160 + (vdim - 1) % 48
    flags = in_bias | out_bias << 1 | (12 if null_out_w else 0)
    b = bytes([1, ISA[isa], THREADS[threads], H - 1, dh - 1, kc, vc, form,
               flags, B - 1, seq(Lq), seq(Lk), weights, misalign, alias])
    b += msk if msk is not None else mask()
    b += struct.pack("<I", seed)
    return b + specials(spec) + corruptions(corrupt)


PADDED_BHSD = (3, 3, 5, 7)
BROADCAST = (4, 7, 0, 0)   # zero batch, seq and head strides
ALL_MASKS = mask(mask_bits(True, True, True), "bottom-right",
                 keep=(4, 0, 40), bias=(1, 13, 30), lengths=(0, 0))
SPECIAL_INPUTS = [(0, 3, NAN, 0), (1, 17, INF, 0), (2, 5, NEG_NAN, 2),
                  (2, 40, DENORM, 7), (3, 2, NEG_INF, 3), (1, 9, HUGE, 0)]

SEEDS = {
    # --- valid attention ---
    "attn-basic": attention(),
    "attn-generic-4threads": attention(isa="generic", threads=4, B=2, Lq=9,
                                       Lk=13, d=17, dv=5),
    "attn-avx2-tails": attention(isa="avx2", threads=2, Lq=7, Lk=19, d=23,
                                 dv=33),
    "attn-gqa-all-masks": attention(B=3, Lq=6, Lk=11, Hkv=2, group=3, d=16,
                                    dv=8, weights=1, msk=ALL_MASKS,
                                    layouts=(PADDED_BHSD,) * 4),
    "attn-decode": attention(B=2, Lq=1, Lk=265, Hkv=2, group=2, d=32,
                             dv=32, msk=mask(mask_bits(lengths=True),
                                             "bottom-right",
                                             lengths=(0, 0))),
    "attn-long-blocks": attention(isa="auto", threads=2, Lq=103, Lk=301,
                                  d=8, dv=8,
                                  msk=mask(1, "top-left")),
    "attn-prefill-bottom-right": attention(Lq=12, Lk=20, d=8, dv=8,
                                           msk=mask(1, "bottom-right")),
    "attn-f16": attention(k="f16", v="f16", Lq=5, Lk=31, d=24, dv=9),
    "attn-bf16-f32": attention(k="bf16", v="f32", Lq=3, Lk=73, d=40, dv=16,
                               weights=1),
    "attn-broadcast-inputs": attention(B=2, Lq=5, Lk=6, Hkv=1, group=2,
                                       layouts=(BROADCAST, BROADCAST,
                                                BROADCAST, (0, 0, 0, 0)),
                                       msk=mask(mask_bits(keep=True),
                                                keep=(2, 0, 60))),
    "attn-lookahead-bias": attention(Lq=8, Lk=8, msk=mask(
        mask_bits(bias=True), bias=(3, 0, 50))),
    "attn-fully-masked": attention(Lq=5, Lk=7, weights=1, msk=mask(
        mask_bits(keep=True), keep=(0, 0, 255))),
    "attn-ninf-bias-rows": attention(Lq=5, Lk=7, weights=1, msk=mask(
        mask_bits(bias=True), bias=(7, 0, 255))),
    "attn-zero-lengths": attention(B=3, Lq=4, Lk=6, msk=mask(
        mask_bits(lengths=True), lengths=(5, 0))),
    "attn-specials": attention(Lq=6, Lk=9, d=5, dv=7, weights=1,
                               msk=mask(mask_bits(bias=True),
                                        bias=(0, 0, 20)),
                               spec=SPECIAL_INPUTS),
    "attn-nan-query-row": attention(Lq=3, Lk=4, d=4, dv=4,
                                    spec=[(0, 0, NAN, 1)]),
    "attn-specials-f16": attention(k="f16", v="bf16", Lq=4, Lk=9,
                                   spec=SPECIAL_INPUTS),
    "attn-scale-negative": attention(scale=(3, 0x83, 0)),
    "attn-scale-extreme": attention(scale=(10, 4, 0), Lq=3, Lk=37),
    "attn-scale-denormal": attention(scale=(10, 0, 0)),
    "attn-shared-inputs": attention(alias=10, Lq=6, Lk=6),
    "attn-misaligned": attention(misalign=0xff, d=9, dv=3, weights=1,
                                 msk=ALL_MASKS),
    "attn-interleaved-out": attention(Lq=6, Lk=3, Hkv=3, group=2, d=1, dv=1,
                                      layouts=((0,) * 4,) * 3 +
                                      ((5, 0, 17, 9),)),
    # --- invalid attention ---
    "bad-isa": attention(isa="bad4"),
    "bad-isa-negative": attention(isa="bad-1"),
    "bad-threads": attention(threads=-1),
    "attn-null-config": attention(isa="null-config"),
    "bad-negative-stride": attention(layouts=((6, 1, 3, 0),) + ((0,) * 4,) * 3),
    "bad-out-overlaps-itself": attention(Lq=3, group=2, layouts=((0,) * 4,) * 3 +
                                         ((7, 0, 0, 0),)),
    "bad-out-is-q": attention(alias=11),
    "bad-weights-is-out": attention(alias=13, weights=1),
    "bad-mask-in-out": attention(alias=15, msk=mask(mask_bits(bias=True))),
    "bad-causal": attention(msk=mask(1, "bad3")),
    "bad-causal-negative": attention(msk=mask(1, "bad-1")),
    "bad-key-length": attention(B=2, msk=mask(mask_bits(lengths=True),
                                              lengths=(6, 0x11))),
    "bad-mask-stride": attention(msk=mask(mask_bits(keep=True),
                                          keep=(6, 3, 0))),
    "bad-scale-nan": attention(scale=(8, 1, 0)),
    "bad-scale-inf": attention(scale=(9, 0, 0)),
    "bad-dtype-k": attention(k="bad3"),
    "bad-dtype-q": attention(corrupt=[(7, 2)]),   # q.dtype = 1 (f16)
    "bad-null-q": attention(corrupt=[(7, 1)]),
    "bad-null-args": attention(corrupt=[(38, 0)]),
    "bad-null-engine": attention(corrupt=[(39, 0)]),
    "bad-zero-batch": attention(corrupt=[(0, 0)]),
    "bad-negative-seq": attention(corrupt=[(9, -1)]),
    "bad-shape-mismatch": attention(corrupt=[(19, 7)]),
    "bad-heads-divide": attention(group=1, Hkv=2, corrupt=[(10, 3)]),
    "huge-batch": attention(corrupt=[(0, "2^62"), (8, "2^62"),
                                     (16, "2^62"), (24, "2^62")]),
    "huge-seq-overflow": attention(corrupt=[(1, "i64max")]),
    "huge-stride": attention(B=2, corrupt=[(4, "i64max")]),
    # Lk = 2^62 broadcast keys: tiny buffers, B*H*Lq*Lk*4 overflows.
    "huge-lk-broadcast": attention(weights=1, corrupt=[
        (9, "2^62"), (13, 0), (17, "2^62"), (21, 0)]),
    "huge-mask-stride": attention(B=2, msk=mask(mask_bits(bias=True)),
                                  corrupt=[(35, "2^62")]),
    "huge-raw-size": attention(corrupt=[(3, ("raw", -(1 << 63) + 5))]),
    # --- valid layer ---
    "layer-basic": layer(),
    "layer-weights": layer(H=3, dh=5, B=2, Lq=5, Lk=7, weights=1,
                           msk=ALL_MASKS),
    "layer-kdim-vdim": layer(form=3, kdim=7, vdim=13, Lq=3, Lk=9),
    "layer-no-bias": layer(in_bias=0, out_bias=0, threads=2),
    "layer-self-causal": layer(alias=10, msk=mask(1, "top-left"), Lq=6,
                               Lk=6),
    "layer-fully-masked": layer(weights=1, msk=mask(mask_bits(keep=True),
                                                    keep=(0, 0, 255))),
    "layer-specials": layer(spec=SPECIAL_INPUTS, Lq=5, Lk=9),
    "layer-avx2-threads": layer(isa="avx2", threads=4, H=4, dh=12, B=3,
                                Lq=20, Lk=31),
    # --- invalid layer ---
    "layer-bad-both-forms": layer(form=6),
    "layer-bad-q-only": layer(form=7),
    "layer-bad-in-proj-kdim": layer(form=0, kdim=3),
    "layer-bad-no-out-weight": layer(null_out_w=1),
    "layer-bad-heads": layer(corrupt=[(1, 3)]),
    "layer-bad-embed": layer(corrupt=[(0, -1)]),
    "layer-bad-kdim": layer(form=3, corrupt=[(2, -2)]),
    "layer-huge-embed": layer(corrupt=[(0, "2^40"), (1, 7)]),
    "layer-huge-embed-overflow": layer(corrupt=[(0, "2^32")]),
    "layer-bad-batch": layer(corrupt=[(4, 0)]),
    "layer-huge-lq": layer(corrupt=[(5, "2^62")]),
    "layer-bad-null-query": layer(corrupt=[(7, 0)]),
    "layer-bad-null-layer": layer(corrupt=[(11, 0)]),
    "layer-bad-out-is-query": layer(alias=11),
    "layer-bad-weights-is-key": layer(alias=14, weights=1),
    "layer-bad-mask-in-out": layer(alias=15, msk=mask(mask_bits(bias=True))),
    "layer-bad-key-length": layer(msk=mask(mask_bits(lengths=True),
                                           lengths=(6, 0x10))),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.remove(os.path.join(OUT, name))
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(SEEDS)} seeds to {OUT}")


if __name__ == "__main__":
    main()
