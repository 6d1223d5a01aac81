"""Last-prompt-token capture: position, batching/padding invariance, layers, LoRA."""

import pytest
import torch
from probe_data import make_lora_adapter, make_records, tiny_gemma3, with_nonzero_pad  # noqa: F401

from real_fae_core.errors import UserError
from data_prep.prompts import render_evidence_prompt, render_knowledge_prompt
from data_prep.records import ClaimRecord
from fae.backends.hf import load_hf_model as load_model  # fp32: the states are compared with fp32 by hand
from fae.probes.hidden import capture_last_token_states, encode_prompts, left_pad_batch


@pytest.fixture(params=["llama", "qwen2", "gemma3"])
def any_model(request, tiny_llama, tiny_qwen, tiny_gemma3):
    return {"llama": tiny_llama, "qwen2": tiny_qwen, "gemma3": tiny_gemma3}[request.param]


def _prompts(n=4):
    recs = [ClaimRecord.from_dict(r) for r in make_records(n)]
    out = []
    for r in recs:
        out += [render_evidence_prompt(r), render_evidence_prompt(r, r.pool_ids[2:]),
                render_knowledge_prompt(r)]
    return out


def test_left_pad_batch_positions_ignore_padding():
    enc = left_pad_batch([[5, 6, 7], [8]], pad_id=0)
    assert enc["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert enc["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert enc["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


def test_left_pad_batch_is_the_generation_padding_plus_positions():
    from fae.backends.hf import left_pad

    seqs = [[3, 1, 4, 1, 5], [9], [2, 6]]
    ids, mask = left_pad(seqs, 7)
    enc = left_pad_batch(seqs, pad_id=7)
    assert torch.equal(enc["input_ids"], ids) and torch.equal(enc["attention_mask"], mask)
    with pytest.raises(ValueError, match="at least one token"):
        left_pad_batch([[1], []], pad_id=0)


def test_batching_is_invisible(any_model, tmp_path):
    model, tok = load_model(with_nonzero_pad(any_model, tmp_path / "m"), dtype="fp32")
    seqs = encode_prompts(tok, _prompts())
    assert len({len(s) for s in seqs}) > 3  # real left padding inside the batch
    batched = capture_last_token_states(model, seqs, pad_id=tok.pad_token_id, batch_size=16,
                                        dedupe=False)
    for i, s in enumerate(seqs):
        alone = capture_last_token_states(model, [s], pad_id=tok.pad_token_id)
        torch.testing.assert_close(batched[i], alone[0], rtol=1e-5, atol=1e-5)
    # Small batches and deduplication give the same rows in the input order.
    again = capture_last_token_states(model, seqs + seqs[:3], pad_id=tok.pad_token_id,
                                      batch_size=3)
    torch.testing.assert_close(again[: len(seqs)], batched, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(again[len(seqs):], batched[:3], rtol=1e-5, atol=1e-5)


def test_captured_position_is_the_last_prompt_token(any_model):
    model, tok = load_model(any_model, dtype="fp32")
    msgs = _prompts(2)
    batched = capture_last_token_states(model, encode_prompts(tok, msgs),
                                        pad_id=tok.pad_token_id, batch_size=8)
    for i, m in enumerate(msgs):
        enc = tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                      return_dict=True, return_tensors="pt")
        ids = enc["input_ids"]
        with torch.no_grad():
            manual = model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]
        torch.testing.assert_close(batched[i], manual, rtol=1e-5, atol=1e-5)
        # ...and it is the state generate() predicts the first new token from.
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1,
                             do_sample=False, output_hidden_states=True,
                             return_dict_in_generate=True)
        torch.testing.assert_close(batched[i], gen.hidden_states[0][-1][0, -1],
                                   rtol=1e-5, atol=1e-5)
    # The generation prompt is part of the input: without it the state differs.
    no_gen = tok.apply_chat_template(msgs[0], add_generation_prompt=False, tokenize=True,
                                     return_dict=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        other = model(input_ids=no_gen, output_hidden_states=True).hidden_states[-1][0, -1]
    assert not torch.allclose(other, batched[0], atol=1e-3)


def test_layer_selection(tiny_llama):
    model, tok = load_model(tiny_llama, dtype="fp32")
    seqs = encode_prompts(tok, _prompts(1))
    emb = capture_last_token_states(model, seqs, pad_id=tok.pad_token_id, layers=0)
    want = model.get_input_embeddings().weight[[s[-1] for s in seqs]]
    torch.testing.assert_close(emb, want.detach())
    both = capture_last_token_states(model, seqs, pad_id=tok.pad_token_id, layers=[1, -1])
    last = capture_last_token_states(model, seqs, pad_id=tok.pad_token_id, layers=-1)
    torch.testing.assert_close(both[:, 1], last)
    # -1 is after the final norm: RMSNorm of the last layer's residual output.
    with torch.no_grad():
        pre = {}
        h = model.model.layers[-1].register_forward_hook(lambda m, a, o: pre.setdefault("x", o))
        model(input_ids=torch.tensor([seqs[0]]))
        h.remove()
        x = pre["x"][0] if isinstance(pre["x"], tuple) else pre["x"]
        torch.testing.assert_close(last[0], model.model.norm(x)[0, -1], rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="out of range"):
        capture_last_token_states(model, seqs, pad_id=tok.pad_token_id, layers=3)


def test_lora_adapter_is_active(tiny_qwen, tmp_path):
    adapter = make_lora_adapter(tiny_qwen, tmp_path / "lora")
    base, tok = load_model(tiny_qwen, dtype="fp32")
    peft_model, _ = load_model(tiny_qwen, adapter, dtype="fp32", merge_adapter=False)
    seqs = encode_prompts(tok, _prompts(2))
    hb = capture_last_token_states(base, seqs, pad_id=tok.pad_token_id)
    ha = capture_last_token_states(peft_model, seqs, pad_id=tok.pad_token_id, batch_size=4)
    assert (ha - hb).abs().max() > 1e-3
    merged, _ = load_model(tiny_qwen, adapter, dtype="fp32")  # what the probes use: merged, same states
    hm = capture_last_token_states(merged, seqs, pad_id=tok.pad_token_id)
    torch.testing.assert_close(ha, hm, rtol=1e-4, atol=1e-4)


def test_load_model_errors_are_one_sentence(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_model(tmp_path / "nope")
