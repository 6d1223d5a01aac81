"""The test-only model builders (tests/tiny_models.py): they build, load, render chats and round-trip text."""

from __future__ import annotations

import pytest
from tiny_models import ARCHS, build_tiny_model, build_tokenizer

from data_prep.prompts import EVIDENCE_SYSTEM_PROMPT

EOT = {"llama": "<|eot_id|>", "qwen2": "<|im_end|>"}
CHAT = [{"role": "system", "content": EVIDENCE_SYSTEM_PROMPT},
        {"role": "user", "content": "Claim: The vaccine reduces the risk of severe disease.\nDocument:\nline0: x"}]


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_renders_the_real_chat_template_and_round_trips(arch):
    tok = build_tokenizer(arch)
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert CHAT[1]["content"] in text and EOT[arch] in text  # the upstream template, its end-of-turn token
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE: every prompt survives encode/decode
    assert tok.pad_token is not None and tok.eos_token == EOT[arch]


def test_tokenizer_refuses_an_unknown_arch():
    with pytest.raises(ValueError, match="unknown arch 'gpt2'"):
        build_tokenizer("gpt2")


def test_tiny_model_builds_loads_and_stops_at_end_of_turn(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    lm = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert lm.config.num_hidden_layers == 2 and lm.config.vocab_size == len(tok)
    assert tok.convert_tokens_to_ids(EOT["llama" if lm.config.model_type == "llama" else "qwen2"]) in \
        lm.generation_config.eos_token_id
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        assert lm(**ids).logits.shape == (1, ids["input_ids"].shape[1], len(tok))


def test_same_seed_same_weights(tmp_path):
    from safetensors.torch import load_file

    a = load_file(build_tiny_model(tmp_path / "a", "llama", seed=3) / "model.safetensors")
    b = load_file(build_tiny_model(tmp_path / "b", "llama", seed=3) / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
