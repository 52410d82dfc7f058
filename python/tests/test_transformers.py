"""libmha as a transformers attention backend, tested on the model code
itself (skipped when torch or transformers is not installed).

Tiny random-initialised configs are built here (no downloads). For each
model: the logits with attn_implementation="libmha" against the model's
own "sdpa" or "eager" path on a padded batch (positions that are padding
excluded: a fully masked query row is zeros in libmha and arbitrary in the
reference), the same greedy tokens over 32 new tokens, and continuous
batching (generate_batch over transformers' paged cache) giving the same
tokens as the plain generation, request by request.

Tolerance: logits within 2e-4 absolute + 2e-4 relative in float32 (the
attention itself agrees to ~1e-6; a few layers, norms and the LM head
amplify it)."""
import copy
import logging

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: transformers tests skipped")
transformers = pytest.importorskip("transformers",
                                   reason="transformers is not installed: backend tests skipped")

import libmha  # noqa: E402
import libmha.transformers as lt  # noqa: E402

TOL = dict(rtol=2e-4, atol=2e-4)
VOCAB = 96
NEW_TOKENS = 32


def _cfg(name):
    t = transformers
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=512)
    if name == "llama":
        return t.LlamaConfig(num_key_value_heads=2, **common), t.LlamaForCausalLM, "sdpa"
    if name == "llama_head_dim":  # a head dim other than hidden / heads
        return (t.LlamaConfig(num_key_value_heads=1, head_dim=24, **common),
                t.LlamaForCausalLM, "sdpa")
    if name == "mistral":
        return (t.MistralConfig(num_key_value_heads=2, sliding_window=7, **common),
                t.MistralForCausalLM, "sdpa")
    if name == "qwen2":
        return (t.Qwen2Config(num_key_value_heads=2, **common), t.Qwen2ForCausalLM, "sdpa")
    if name == "gemma2":
        return (t.Gemma2Config(num_key_value_heads=2, head_dim=16, sliding_window=6,
                               attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
                               query_pre_attn_scalar=16, **common),
                t.Gemma2ForCausalLM, "eager")
    if name == "gpt_oss":
        c = dict(common, intermediate_size=64)
        return (t.GptOssConfig(num_key_value_heads=2, head_dim=16, sliding_window=5,
                               num_local_experts=4, num_experts_per_tok=2,
                               layer_types=["sliding_attention", "full_attention"], **c),
                t.GptOssForCausalLM, "eager")
    if name == "gpt2":
        return (t.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=512),
                t.GPT2LMHeadModel, "sdpa")
    raise KeyError(name)


DECODERS = ["llama", "llama_head_dim", "mistral", "qwen2", "gemma2", "gpt_oss", "gpt2"]


@pytest.fixture(scope="module", autouse=True)
def registered():
    lt.register()
    yield


def _model(name, seed=0):
    cfg, cls, ref = _cfg(name)
    torch.manual_seed(seed)
    cfg.pad_token_id = 0
    model = cls(cfg).eval()
    # Random init draws small weights; scale the embeddings up so the
    # attention is far from uniform and greedy tokens are well separated.
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(8.0)
    return model, ref


def _logits(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def _batch(lengths, total, left=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), total), generator=g)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for i, n in enumerate(lengths):
        if left:
            mask[i, total - n:] = 1
        else:
            mask[i, :n] = 1
    return ids, mask


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("left", [True, False], ids=["left_pad", "right_pad"])
def test_logits_match_reference(name, left):
    model, ref = _model(name)
    ids, mask = _batch([13, 9, 4], 13, left=left)
    want = _logits(model, ref, ids, mask)
    got = _logits(model, "libmha", ids, mask)
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], **TOL)


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_tokens_match_reference(name):
    model, ref = _model(name)
    ids, mask = _batch([11, 6], 11, left=True, seed=2)
    outs = {}
    for impl in (ref, "libmha"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            outs[impl] = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                        max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                        pad_token_id=0)
    assert outs["libmha"].shape[1] == ids.shape[1] + NEW_TOKENS
    assert torch.equal(outs["libmha"], outs[ref])


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_static_cache_matches_reference(name):
    """A static cache: keys past the step are empty slots, so the queries do
    not end at the last key; the mask goes through as an explicit mask and
    the tokens equal the reference's."""
    model, ref = _model(name)
    ids, mask = _batch([11, 6], 11, left=True, seed=10)
    outs = {}
    for impl in (ref, "libmha"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            outs[impl] = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                        max_new_tokens=20, min_new_tokens=20, pad_token_id=0,
                                        cache_implementation="static")
    assert torch.equal(outs["libmha"], outs[ref])


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_continuous_batching_matches_plain(name, monkeypatch):
    model, _ = _model(name)
    model.set_attn_implementation("libmha")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (5, 19, 9, 12)]
    plain = []
    with torch.no_grad():
        for p in prompts:
            out = model.generate(input_ids=torch.tensor([p]), do_sample=False,
                                 max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 pad_token_id=0)
            plain.append(out[0, len(p):].tolist())
    calls = {"paged": 0}
    paged = lt._paged_forward

    def counting(*a, **k):
        calls["paged"] += 1
        return paged(*a, **k)

    monkeypatch.setattr(lt, "_paged_forward", counting)
    gc = transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False,
                                       eos_token_id=-1, pad_token_id=0)
    with torch.no_grad():
        res = model.generate_batch(inputs=prompts, generation_config=gc)
    assert calls["paged"] > 0, "continuous batching did not reach libmha's paged path"
    got = [r.generated_tokens for _, r in sorted(res.items(), key=lambda kv: int(kv[0][4:]))]
    assert got == plain


def test_bert_padding_mask():
    t = transformers
    cfg = t.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=96, max_position_embeddings=64)
    torch.manual_seed(0)
    model = t.BertModel(cfg).eval()
    ids, mask = _batch([12, 7, 3], 12, left=False, seed=4)
    want = _logits_bert(model, "sdpa", ids, mask)
    got = _logits_bert(model, "libmha", ids, mask)
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], **TOL)


def _logits_bert(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model(dtype):
    model, _ = _model("llama")
    model = model.to(dtype)
    ids, mask = _batch([10, 6], 10, seed=5)
    want = _logits(model, "sdpa", ids, mask).float()
    got = _logits(model, "libmha", ids, mask)
    assert got.dtype == dtype
    valid = mask.bool()
    # libmha's half compute dtype: scores, softmax and accumulation in
    # float32, the output rounded once; the reference rounds differently:
    # the difference is the half type's rounding through two layers.
    torch.testing.assert_close(got.float()[valid], want[valid], rtol=0.05, atol=0.15)


def test_packed_sequences_are_varlen():
    """position_ids restarting inside a row (packed sequences): libmha runs
    one varlen call per row; the result equals each sequence alone."""
    model, _ = _model("llama")
    model.set_attn_implementation("libmha")
    g = torch.Generator().manual_seed(6)
    parts = [torch.randint(1, VOCAB, (n,), generator=g) for n in (5, 8, 3)]
    ids = torch.cat(parts)[None]
    pos = torch.cat([torch.arange(len(p)) for p in parts])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        alone = torch.cat([model(input_ids=p[None]).logits[0] for p in parts])
    torch.testing.assert_close(packed, alone, **TOL)


def test_explicit_mask_fallback_is_correct_and_said(caplog):
    """A mask pattern libmha has no term for (an and_mask_function hiding
    one key) goes through as an explicit mask, equal to sdpa's, logged."""
    from transformers.masking_utils import create_causal_mask

    model, _ = _model("llama")
    ids, mask = _batch([9], 9, seed=7)
    emb = model.get_input_embeddings()(ids)

    def hide_key_2(batch_idx, head_idx, q_idx, kv_idx):
        return kv_idx != 2

    outs = {}
    for impl in ("sdpa", "libmha"):
        model.set_attn_implementation(impl)
        m4 = create_causal_mask(config=model.config, inputs_embeds=emb, attention_mask=mask,
                                past_key_values=None, position_ids=torch.arange(9)[None],
                                and_mask_function=hide_key_2)
        if impl == "libmha":
            assert m4 is not None and m4.dim() == 4
        with caplog.at_level(logging.WARNING, logger="libmha.transformers"):
            with torch.no_grad():
                outs[impl] = model.model(inputs_embeds=emb, attention_mask=m4).last_hidden_state
    torch.testing.assert_close(outs["libmha"][:, 3:], outs["sdpa"][:, 3:], **TOL)


def test_refuses_dropout_and_gradients():
    model, _ = _model("llama")
    model.set_attn_implementation("libmha")
    ids, mask = _batch([6], 6, seed=8)
    with pytest.raises(libmha.ArgumentError, match="gradients"):
        model(input_ids=ids, attention_mask=mask)  # grad enabled, parameters need it
    train = copy.deepcopy(model).train()
    for layer in train.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with pytest.raises(libmha.ArgumentError, match="dropout"):
        with torch.no_grad():
            train(input_ids=ids, attention_mask=mask)


def test_attention_function_reads_cache_in_place():
    """The function passes transformers' K/V tensors to libmha as they are:
    a decode step over a [B, Hkv, L, d] cache equals libmha's own call and
    torch's SDPA, and K/V are not copied (their storage is not touched)."""
    torch.manual_seed(9)
    q = torch.randn(2, 8, 1, 32)
    k = torch.randn(2, 2, 40, 32)
    v = torch.randn(2, 2, 40, 32)

    class M(torch.nn.Module):
        is_causal = True
        layer_idx = 0

    out, w = lt.attention_forward(M(), q, k, v, None, scaling=0.25)
    assert w is None and out.shape == (2, 1, 8, 32)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=1e-5)
