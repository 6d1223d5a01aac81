"""The arithmetic the speed benchmarks rest on (benchmarks/roofline.py, benchmarks/llama_cpp_peer.py): the FLOPs
and bytes a phase is read against, and what the peer comparison counts as the same answer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from benchmarks.llama_cpp_peer import answers_of, gguf_type, table as peer_table
from benchmarks.roofline import attention_flops, kv_bytes


def test_attention_flops_count_each_position_against_the_ones_before_it():
    cfg = SimpleNamespace(head_dim=4, hidden_size=8, num_attention_heads=2, num_hidden_layers=3)
    # per layer and head: scores and values, 2 FLOPs a multiply-add each, over 1 + 2 key positions
    assert attention_flops(cfg, [1, 2]) == 2 * 2 * 2 * 4 * 3 * (1 + (1 + 2))
    assert 2 * attention_flops(cfg, [2]) == 3 * attention_flops(cfg, [1, 1])  # 1 + 2 positions against 1 + 1


def test_the_kv_cache_bytes_are_keys_and_values_of_every_layer_row_and_position():
    cfg = SimpleNamespace(head_dim=None, hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                          num_hidden_layers=3)
    assert kv_bytes(cfg, rows=2, length=10, element_size=2) == 2 * 10 * 3 * 2 * 1 * 4 * 2


def test_answers_are_compared_claim_round_by_claim_round(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rounds = [{"round": 0, "raw_output": "{\"label\": \"SUPPORT\"}"}, {"round": 1, "raw_output": "x"}]
    (run / "claims.jsonl").write_text(json.dumps({"id": "c1", "rounds": rounds}) + "\n"
                                      + json.dumps({"id": "c2", "rounds": rounds[:1]}) + "\n")
    assert answers_of(run) == {("c1", 0): "{\"label\": \"SUPPORT\"}", ("c1", 1): "x",
                               ("c2", 0): "{\"label\": \"SUPPORT\"}"}


def test_the_gguf_type_is_its_most_common_tensor_type(tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("a", np.zeros((4, 32), dtype=np.float32))
    writer.add_tensor("b", np.zeros((4, 32), dtype=np.float32))
    writer.add_tensor("c", np.zeros((4, 32), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_type(str(path)) == "F32"


def test_the_peer_table_leaves_out_the_end_to_end_part_when_it_did_not_run():
    side = {"prefill_tokens_per_s": 300.0, "decode_ms_per_token": 7.0}
    text = peer_table({"per_request": {"prompts": 2, "llama.cpp (Q4_1 GGUF)": side,
                                       "ours": dict(side, identical_answers_to_llama_cpp=1)},
                       "fae_end_to_end": {}, "claims": 0, "rounds": 4})
    assert "| ours | 300 | 7.0 | 1/2 |" in text and "FAE" not in text


def test_the_projections_alone_read_every_weight_of_the_step_once_a_pass(tiny_llama, monkeypatch):
    """roofline.py splits a decoding step into its weight reads and the rest: the split must call every
    projection and the output layer, in the step's order, on inputs of the step's width and rows."""
    from benchmarks.roofline import projections_only
    from fae.backends import decode_step
    from fae.backends.hf import load_hf_model

    lm, _ = load_hf_model(tiny_llama, None, "bf16", "cpu")
    step = decode_step.LeanLlamaStep(lm, "int4")
    calls, original = [], decode_step.ProjectionWeight.__call__

    def recording(self, x):
        calls.append((id(self), tuple(x.shape)))
        return original(self, x)

    monkeypatch.setattr(decode_step.ProjectionWeight, "__call__", recording)
    result = projections_only(step, rows=3, repeats=2)
    order = [p for layer in step.layers for p in (layer[1], layer[2], layer[4], layer[5])] + [step.head]
    assert calls == [(id(p), (3, 1, p.in_features)) for p in order] * 3  # the warm-up and two timed passes
    assert result["kernel_read_gbs"] == pytest.approx(step.weight_bytes() / (result["projections_ms"] / 1e3) / 1e9)


def test_both_prefill_rows_count_the_same_flops_over_the_same_prompts(tiny_llama, monkeypatch):
    """roofline.py's two prefill rows (transformers over a left-padded batch, the lean step's extend one prompt
    at a time) read every prompt token once and count the same FLOPs: only their seconds differ."""
    from benchmarks import roofline
    from fae.backends import decode_step
    from fae.backends.hf import load_hf_model

    lm, _ = load_hf_model(tiny_llama, None, "bf16", "cpu")
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12], [13] * 8]
    extended, original = [], decode_step.LeanLlamaStep.extend

    def recording(self, ids, prefix):
        extended.append(ids[0].tolist())
        return original(self, ids, prefix)

    monkeypatch.setattr(decode_step.LeanLlamaStep, "extend", recording)
    monkeypatch.setattr(roofline, "median_seconds", lambda fn, repeats: fn() or 2.0)
    lean = roofline.lean_prefill_rate(lm, prompts, peak=1.0)
    assert extended == [prompts[0]] + prompts  # the warm-up, then each prompt once
    batch = roofline.prefill_rate(lm, prompts, peak=1.0)
    assert batch["padded_width"] == 8 and lean["prompt_tokens"] == batch["prompt_tokens"] == 16
    assert lean["gflops"] == batch["gflops"] > 0
    assert lean["share_of_bf16_peak"] == pytest.approx(lean["gflops"])  # a peak of 1 GFLOP/s


def test_the_compiled_steps_module_computes_the_lean_steps_logits(tiny_llama):
    """benchmarks/compiled_step.py times a whole step as one compiled graph over fixed-length key/value
    buffers: run eagerly in fp32, its logits are the lean step's (to rounding: attention over the buffer
    behind a mask groups the sums differently) step after step, so the benchmark times the same
    computation. Compiling itself is timed by the benchmark, not here (minutes on two cores)."""
    import torch

    from benchmarks.compiled_step import static_llama
    from benchmarks.roofline import prefill
    from fae.backends.decode_step import LeanLlamaStep
    from fae.backends.hf import load_hf_model
    from fae.backends.reserved_cache import reserved_cache

    lm, _ = load_hf_model(tiny_llama, None, "fp32", "cpu")
    with torch.no_grad():
        for p in lm.parameters():
            p.mul_(5.0)  # answers that vary with the prompt
    torch.manual_seed(0)
    ids = torch.randint(3, lm.config.vocab_size, (1, 9))
    cache = reserved_cache(lm, 6)
    logits = prefill(lm, ids, torch.ones_like(ids), cache)
    module, lean = static_llama(lm, 16), LeanLlamaStep(lm)
    with torch.inference_mode():
        module.adopt(cache)
        mask, token = torch.ones_like(ids), logits.argmax(-1, keepdim=True)
        for at in range(9, 14):
            mask = torch.cat([mask, mask.new_ones(1, 1)], dim=1)
            want = lean(token, mask, torch.tensor([[at]]), cache)
            got = module(token, torch.tensor([[at]]), torch.tensor([at]), (torch.arange(16) <= at)[None, None, None])
            assert (got - want).abs().max() < 1e-4 * want.abs().max(), at
            token = want.argmax(-1, keepdim=True)


@pytest.mark.parametrize("script", ["roofline.py", "compiled_step.py"])
def test_the_speed_benchmarks_stop_on_a_broken_records_file_before_loading_the_model(script, tmp_path):
    """A broken line gets one line naming the file, line and field, exit 2, and no JSON (the model path does
    not exist either: the records are read first, so the message is about them)."""
    import subprocess
    import sys
    from pathlib import Path

    records = tmp_path / "records.jsonl"
    records.write_text('{"id": "c1", "claim": "x", "label": "SUPPORT", "sentences": [{"id": 0, "text": "a"}], '
                       '"evidence": [[0]]}\n{"id": "c2"}\n')
    out = tmp_path / "out.json"
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / script
    done = subprocess.run([sys.executable, str(bench), "--model", str(tmp_path / "no-model"), "--records", str(records),
                           "--output", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{records}:2" in lines[0] and "claim" in lines[0], done.stderr
    assert not out.exists()
