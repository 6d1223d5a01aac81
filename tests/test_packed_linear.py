"""A bf16 model on a CPU runs its linear layers on weights packed once for oneDNN
(fae/backends/packed_linear.py): every answer, hidden state and label probability must stay bitwise
what the plain layers give, a layer that would differ must stay plain, and the opt-out must hold."""

from __future__ import annotations

import pytest
import torch

from data_prep.prompts import encode_chat
from fae.backends import packed_linear
from fae.backends.hf import generate_batched, greedy_config, load_hf_model
from fae.backends.padding import left_pad
from fae.backends.packed_linear import OPT_OUT_ENV, pack_linear_weights, packing_available

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build cannot pack bf16 linear weights")

PROMPTS = [[{"role": "user", "content": f"Claim {k}: masks reduce spread. " + "Evidence sentence. " * (3 * k)}]
           for k in range(5)]


def _packed_layers(lm) -> int:
    return sum(1 for m in lm.modules() if "_packed_weight" in m.__dict__)


@pytest.mark.parametrize("which", ["noisy_llama", "tiny_qwen"])
def test_packed_weights_give_bitwise_the_answers_and_states_of_plain_ones(request, which):
    model = request.getfixturevalue(which)
    plain, tok = load_hf_model(model, dtype="bf16", device="cpu", pack_weights=False)
    packed, _ = load_hf_model(model, dtype="bf16", device="cpu")
    n_linear = sum(1 for m in packed.modules() if type(m) is torch.nn.Linear)
    assert _packed_layers(plain) == 0 and _packed_layers(packed) == n_linear > 0
    ids = [encode_chat(tok, m) for m in PROMPTS]
    gc = greedy_config(plain, tok, 12)
    a = generate_batched(plain, tok, ids, gc, batch_size=2, label_probs=True)
    b = generate_batched(packed, tok, ids, gc, batch_size=2, label_probs=True)
    assert [g.text for g in a] == [g.text for g in b]
    assert [g.label_logprobs for g in a] == [g.label_logprobs for g in b]
    batch, mask = left_pad(ids, tok.pad_token_id)
    with torch.inference_mode():
        hs_a = plain(input_ids=batch, attention_mask=mask, output_hidden_states=True).hidden_states
        hs_b = packed(input_ids=batch, attention_mask=mask, output_hidden_states=True).hidden_states
    assert all(torch.equal(x, y) for x, y in zip(hs_a, hs_b))
    assert not torch.equal(hs_a[-1], hs_a[1])  # the states compared are the layers' own, not one tensor


def test_a_layer_whose_packed_output_differs_keeps_its_own_forward(tiny_llama, monkeypatch):
    plain, _ = load_hf_model(tiny_llama, dtype="bf16", device="cpu", pack_weights=False)
    real = packed_linear.packed_linear
    monkeypatch.setattr(packed_linear, "packed_linear", lambda x, w, b: real(x, w, b) + 1)
    assert pack_linear_weights(plain) == 0 and _packed_layers(plain) == 0


def test_fp32_models_and_the_opt_out_are_left_alone(tiny_llama, monkeypatch):
    fp32, _ = load_hf_model(tiny_llama, dtype="fp32", device="cpu")
    assert _packed_layers(fp32) == 0
    monkeypatch.setenv(OPT_OUT_ENV, "0")
    off, _ = load_hf_model(tiny_llama, dtype="bf16", device="cpu")
    assert _packed_layers(off) == 0
