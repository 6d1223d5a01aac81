"""Soft FAE (issue 16): label probabilities per round, soft metrics, report, compare."""

from __future__ import annotations

import json
import math

import pytest

from fae.label_probs import (ANSWER_PREFIX, LABELS, label_probs_from_top_logprobs, normalise,
                             openai_token_list, teacher_forced_label_probs)


# ---------------------------------------------------------------------------
# hf: teacher forcing against a plain forward pass
# ---------------------------------------------------------------------------


def _by_hand(lm, prompt_ids, answer_ids):
    """Σ log p(answer token | everything before it), one unpadded sequence, no cache."""
    import torch

    ids = torch.tensor([list(prompt_ids) + list(answer_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(lm(input_ids=ids).logits[0].float(), -1)
    n = len(prompt_ids)
    return [logp[n + t - 1, tok].item() for t, tok in enumerate(answer_ids)]


def test_hf_label_probs_match_a_plain_forward_pass(tiny_model):
    from data_prep.prompts import encode_chat
    from fae.backends.hf import load_hf_model

    lm, tok = load_hf_model(tiny_model, device="cpu")
    prompts = [[{"role": "user", "content": "Claim: " + "x " * n}] for n in (1, 7, 3)]
    ids = [encode_chat(tok, m) for m in prompts]
    got = teacher_forced_label_probs(lm, tok, ids, tok.pad_token_id)  # one padded batch
    answers = [tok.encode(ANSWER_PREFIX + lab + '"', add_special_tokens=False) for lab in LABELS]
    for p, (probs, logprobs) in zip(ids, got):
        full = {lab: _by_hand(lm, p, a) for lab, a in zip(LABELS, answers)}
        # the whole answer prefix + label + quote, normalised over the labels: the shared
        # prefix tokens cancel, so this is an independent check of the normalised values
        z = sum(math.exp(sum(v)) for v in full.values())
        for lab in LABELS:
            assert probs[lab] == pytest.approx(math.exp(sum(full[lab])) / z, abs=1e-5)
        # unnormalised: the tokens after the part all three answers share
        shared = 0
        while len({a[shared] for a in answers}) == 1:
            shared += 1
        for lab in LABELS:
            assert logprobs[lab] == pytest.approx(sum(full[lab][shared:]), abs=1e-4)
            assert len(full[lab][shared:]) >= 2  # every label scores >1 token (the closing quote too)
        assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)


def test_hf_backend_label_probs_leave_answers_unchanged(tiny_llama):
    from fae.backends.hf import HFBackend

    prompts = [[{"role": "user", "content": f"Claim {k}: " + "y " * k}] for k in range(5)]
    on = HFBackend({"model": str(tiny_llama), "device": "cpu", "batch_size": 2, "max_new_tokens": 6})
    off = HFBackend({"model": str(tiny_llama), "device": "cpu", "batch_size": 2, "max_new_tokens": 6,
                     "label_probs": False})
    a, b = on.generate(prompts), off.generate(prompts)
    assert [g.text for g in a] == [g.text for g in b]
    assert all(g.label_probs is not None and set(g.label_probs) == set(LABELS) for g in a)
    assert all(g.label_probs is None for g in b)
