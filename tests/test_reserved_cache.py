"""generate's KV cache with the answer's room reserved up front (fae/backends/reserved_cache.py): every
answer and label probability must be bitwise what transformers' own DynamicCache gives, the buffer must
really be written in place (no copy per token), and what replaces the tensors must not break it."""

from __future__ import annotations

import pytest
import torch

import fae.backends.hf as hf
from data_prep.prompts import encode_chat
from fae.backends.hf import generate_batched, greedy_config, load_hf_model
from fae.backends.reserved_cache import reserved_cache, reserving_layer_class

PROMPTS = [[{"role": "user", "content": f"Claim {k}: masks reduce spread. " + "Evidence sentence. " * (3 * k)}]
           for k in range(5)]


@pytest.mark.parametrize("which", ["noisy_llama", "tiny_qwen"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_reserved_cache_gives_bitwise_the_answers_of_the_dynamic_cache(request, which, dtype, monkeypatch):
    lm, tok = load_hf_model(request.getfixturevalue(which), dtype=dtype, device="cpu")
    ids = [encode_chat(tok, m) for m in PROMPTS]
    gc = greedy_config(lm, tok, 12)
    reserved = generate_batched(lm, tok, ids, gc, batch_size=2, label_probs=True)
    monkeypatch.setattr(hf, "RESERVE_CACHE", False)
    plain = generate_batched(lm, tok, ids, gc, batch_size=2, label_probs=True)
    assert [g.text for g in reserved] == [g.text for g in plain]
    assert [g.finish_reason for g in reserved] == [g.finish_reason for g in plain]
    assert [g.label_logprobs for g in reserved] == [g.label_logprobs for g in plain]
    assert any(g.text for g in plain)


def test_decoding_writes_into_one_buffer_per_layer(tiny_llama):
    lm, tok = load_hf_model(tiny_llama, dtype="fp32", device="cpu")
    gc = greedy_config(lm, tok, 8)
    gc.eos_token_id, gc.min_new_tokens = None, 8  # run every step
    cache = reserved_cache(lm, 8)
    layer = cache.layers[0]
    assert type(layer) is reserving_layer_class()
    ptrs = []
    original = type(layer).update

    def spy(self, k, v, *a, **kw):
        out = original(self, k, v, *a, **kw)
        if self is layer:
            ptrs.append(self.keys.data_ptr())
        return out

    type(layer).update = spy
    try:
        ids = torch.tensor([encode_chat(tok, PROMPTS[1])])
        with torch.inference_mode():
            lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc,
                        **{k: cache for k in hf.answer_cache(lm, 8)})
    finally:
        type(layer).update = original
    assert len(ptrs) >= 8 and len(set(ptrs)) == 1  # prefill allocated once; every step wrote in place
    assert layer.keys.shape[-2] == ids.shape[1] + len(ptrs) - 1


def test_crop_keeps_the_buffer_and_a_repeat_allocates_a_new_one(tiny_llama):
    lm, _ = load_hf_model(tiny_llama, dtype="fp32", device="cpu")
    layer = reserving_layer_class()()
    layer.reserve = 4
    k = torch.randn(2, 1, 5, 8)
    keys, _ = layer.update(k, k.clone())
    buf = layer.keys.data_ptr()
    layer.update(torch.ones(2, 1, 1, 8), torch.ones(2, 1, 1, 8))
    layer.crop(-2)
    keys, values = layer.update(torch.full((2, 1, 3, 8), 7.0), torch.full((2, 1, 3, 8), 7.0))
    assert layer.keys.data_ptr() == buf and keys.shape[-2] == 7
    assert torch.equal(keys[..., :4, :], k[..., :4, :]) and bool((keys[..., 4:, :] == 7).all())
    layer.batch_repeat_interleave(3)
    keys, _ = layer.update(torch.zeros(6, 1, 1, 8), torch.zeros(6, 1, 1, 8))
    assert keys.shape == (6, 1, 8, 8) and layer.keys.data_ptr() != buf
    assert torch.equal(keys[0, :, :4], k[0, :, :4]) and torch.equal(keys[2, :, :4], k[0, :, :4])
