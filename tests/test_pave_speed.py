"""`fae pave`'s hf sampler does a prompt's work once: the N sampled answers share one prefill
(fae.pave.sampling.one_row_prefill) and the label distribution projects only the positions it scores.
Both must leave every answer and distribution exactly as the plain computation gives them."""

from __future__ import annotations

import pytest
import torch

from fae.pave.sampling import DEFAULT_PREFIX, HFSampler

PROMPTS = [
    [{"role": "system", "content": "You verify claims against numbered sentences."},
     {"role": "user", "content": "Claim: masks reduce transmission.\n[0] A trial found masks cut spread by half."}],
    [{"role": "user", "content": "Claim: the vaccine causes infertility.\n[3] No effect on fertility was seen."}],
]
KEYS = [(7, "c1", "gold"), (7, "c2", "claim_only")]


def _sampler(model, dtype):
    return HFSampler({"model": str(model), "dtype": dtype, "device": "cpu", "max_new_tokens": 12})


class PrefillRows:
    """Records the batch size of every forward that starts from an empty cache (a prefill), and the class of
    that cache's first layer (None without a cache)."""

    def __init__(self, lm):
        self.rows: list[int] = []
        self.cache_layers: list[str | None] = []
        inner = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
        self.handle = inner.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        ids = kwargs.get("input_ids")
        if ids is not None and (cache is None or cache.get_seq_length() == 0):
            self.rows.append(ids.shape[0])
            self.cache_layers.append(None if cache is None else type(cache.layers[0]).__name__)

    def clear(self):
        self.rows.clear()
        self.cache_layers.clear()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_prefill_for_n_samples_gives_the_answers_of_n_prefills(noisy_llama, tiny_qwen, dtype):
    for model in (noisy_llama, tiny_qwen):
        sampler = _sampler(model, dtype)
        sampler.prefill_once = True  # opt-in: bitwise only where a batched matmul's row equals the row alone
        spy = PrefillRows(sampler.lm)
        fast = sampler.sample(PROMPTS, n=4, temperature=1.0, keys=KEYS)
        assert spy.rows[:1] == [1], spy.rows  # the prompt ran once, not four times
        sampler.prefill_once = False
        spy.clear()
        plain = sampler.sample(PROMPTS, n=4, temperature=1.0, keys=KEYS)
        assert spy.rows[:1] == [4], spy.rows
        spy.handle.remove()
        assert [[t for t, _ in answers] for answers in fast] == [[t for t, _ in answers] for answers in plain]
        assert fast == plain  # the label distributions too
        assert len({t for answers in fast for t, _ in answers}) > 1  # the samples differ: a real draw was compared


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_label_distribution_from_the_scored_positions_only_is_the_full_one(noisy_llama, dtype):
    from data_prep.prompts import encode_chat

    sampler = _sampler(noisy_llama, dtype)
    for messages in PROMPTS:
        ids = encode_chat(sampler.tok, messages)
        for prefix in (DEFAULT_PREFIX, '{"evidence": [0], "label": "'):
            sampler.logits_to_keep = True
            kept = sampler.label_distribution(ids, prefix)
            sampler.logits_to_keep = False
            full = sampler.label_distribution(ids, prefix)
            assert kept == full and abs(sum(kept) - 1) < 1e-6


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_sampling_with_the_reserved_kv_cache_gives_the_answers_of_transformers_own_cache(noisy_llama, tiny_qwen,
                                                                                         dtype, monkeypatch):
    import fae.backends.hf as hf

    for model in (noisy_llama, tiny_qwen):
        sampler = _sampler(model, dtype)
        spy = PrefillRows(sampler.lm)
        reserved = sampler.sample(PROMPTS, n=4, temperature=1.0, keys=KEYS)
        assert spy.cache_layers[0] == "ReservingLayer", spy.cache_layers[:3]
        monkeypatch.setattr(hf, "RESERVE_CACHE", False)
        spy.clear()
        plain = sampler.sample(PROMPTS, n=4, temperature=1.0, keys=KEYS)
        monkeypatch.setattr(hf, "RESERVE_CACHE", True)
        spy.handle.remove()
        assert spy.cache_layers[0] == "DynamicLayer", spy.cache_layers[:3]
        assert reserved == plain  # texts and label distributions
        assert len({t for answers in plain for t, _ in answers}) > 1
