"""benchmarks/gpu_check.py: the pure checks, step isolation, and the CPU dry run end to end."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


gc = _load()
STEPS = ["environment", "train_single_gpu", "train_zero2", "train_zero3", "demo", "eval_hf", "eval_vllm", "shards",
         "pave_vllm", "probes"]


def test_peak_table_matches_gpu_names():
    assert gc.peak_bf16_tflops("NVIDIA H200") == 989.0
    assert gc.peak_bf16_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gc.peak_bf16_tflops("NVIDIA H100 PCIe") == 756.0  # the specific name wins over "H100"
    assert gc.peak_bf16_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert gc.peak_bf16_tflops("Tesla T4") is None and gc.peak_bf16_tflops(None) is None


def test_loss_trend_and_utilisation():
    falling = gc.loss_trend([6.0, 5.9, 5.5, 5.0, 4.0, 3.9, 3.5, 3.0, 2.5, 2.0])
    assert falling["falls"] and falling["window"] == 2 and falling["first"] == pytest.approx(5.95)
    assert gc.loss_trend([5.0, 5.0, 5.1, 5.2, 5.3])["falls"] is False
    assert gc.loss_trend([3.0])["falls"] is None
    # 1e4 tokens/s x 1e9 FLOPs/token on a 989 TFLOP/s GPU
    assert gc.utilisation(1e4, 1e9, 989.0) == pytest.approx(1e13 / 989e12)
    assert gc.utilisation(1e4, 1e9, None) is None
    assert gc.prefill_flops_per_token(100, 2, 8, 10) == 2 * 100 + 2 * 2 * 10 * 8
    assert gc.train_flops_per_token(100, 2, 8, 10) == 4 * 100 + 6 * 2 * 10 * 8


def test_prefill_stats_leave_out_the_warm_up_batch():
    batches = [{"prompts": 4, "tokens": 400, "padded_tokens": 480, "seconds": 9.0},
               {"prompts": 4, "tokens": 400, "padded_tokens": 440, "seconds": 1.0},
               {"prompts": 2, "tokens": 200, "padded_tokens": 200, "seconds": 1.0}]
    s = gc.prefill_stats(batches)
    assert s["batches_timed"] == 2 and s["tokens"] == 600 and s["tokens_per_s"] == 300.0
    assert s["first_batch_seconds"] == 9.0
    assert gc.prefill_stats(batches[:1])["tokens_per_s"] == pytest.approx(400 / 9.0)


def _reference():
    return json.loads(gc.DEMO_CPU_SUMMARY.read_text())


def test_cpu_reference_is_a_full_demo_summary():
    ref = _reference()
    assert set(ref["variants"]) == {"sft", "no_ablation", "no_enhancement", "real"}
    for m in ref["variants"].values():
        assert m["n_claims"] == 200 and m["rounds"] == 4 and len(m["round_accuracy"]) == 5
    # what docs/demo.md quotes: the variants trained on ablated negatives abstain after
    # round 0, the two without them do not
    a_1 = {v: m["round_accuracy"][1] for v, m in ref["variants"].items()}
    assert max(a_1["real"], a_1["no_enhancement"]) < 0.25 < 0.9 < min(a_1["sft"], a_1["no_ablation"])


@settings(derandomize=True, max_examples=40, deadline=None)
@given(st.sampled_from(["sft", "real"]), st.integers(0, 4), st.integers(-5, 5))
def test_demo_comparison_allows_two_claims_per_round(variant, rnd, shift):
    ref = _reference()
    got = json.loads(json.dumps(ref))
    n = ref["variants"][variant]["n_claims"]
    got["variants"][variant]["round_accuracy"][rnd] += shift / n
    c = gc.compare_demo(got, ref)
    assert c["comparable"] and c["ok"] == (abs(shift) <= 2)
    assert c["variants"][variant]["diff_claims"][rnd] == pytest.approx(abs(shift))


def test_demo_comparison_refuses_a_run_of_another_size():
    ref = _reference()
    got = json.loads(json.dumps(ref))
    got["variants"]["sft"]["n_claims"] = 16
    c = gc.compare_demo(got, ref)
    assert not c["comparable"] and not c["ok"] and "16 claims" in c["reason"]


def test_dirk_comparison_tolerance():
    a = {"rounds": [{"round": 1, "mean": 0.5}, {"round": 2, "mean": None}]}
    b = {"rounds": [{"round": 1, "mean": 0.5009}, {"round": 2, "mean": None}]}
    assert gc.compare_dirk(a, b)["ok"]
    b["rounds"][0]["mean"] = 0.502
    assert not gc.compare_dirk(a, b)["ok"]
    b["rounds"][1]["mean"] = 0.1
    assert gc.compare_dirk(a, b)["reason"] == "round 2: defined on one side only"


def _check(tmp_path, **kw):
    args = argparse.Namespace(output=str(tmp_path / "out"), work=str(tmp_path / "work"), data=str(tmp_path),
                              dry_run=True, time_limit=kw.pop("time_limit", None), keep_work=False)
    return gc.GpuCheck(args, gc.DRY)


def test_a_failing_step_is_recorded_and_the_next_one_runs(tmp_path):
    check = _check(tmp_path)

    def broken():
        raise ZeroDivisionError("boom")

    first = check.step("environment", broken)
    second = check.step("eval_vllm", lambda: {"x": 1})
    assert first["status"] == "failed" and first["reason"] == "ZeroDivisionError: boom"
    assert "ZeroDivisionError" in first["log_tail"]
    assert second["status"] == "passed" and second["details"] == {"x": 1}


def test_a_command_over_its_budget_is_killed_with_its_children(tmp_path):
    check = _check(tmp_path)
    check.scale = gc.Scale(budgets={"demo": 1.5})
    marker = tmp_path / "child-survived"
    # the child of the child would write the marker after 3 s unless its process group is killed
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \
           f"\"import time, pathlib; time.sleep(3); pathlib.Path(r'{marker}').write_text('x')\"]); time.sleep(30)"
    t0 = time.time()
    rec = check.step("demo", lambda: check.sh([sys.executable, "-c", code], "sleeper"))
    assert rec["status"] == "failed" and "over its time budget" in rec["reason"]
    assert time.time() - t0 < 10
    time.sleep(3.5)
    assert not marker.exists()


def test_steps_after_the_time_limit_are_skipped_with_a_reason(tmp_path):
    check = _check(tmp_path, time_limit=1)
    time.sleep(1.1)
    rec = check.step("eval_hf", lambda: {"ran": True})
    assert rec["status"] == "skipped" and "time limit" in rec["reason"]


@pytest.mark.slow
def test_dry_run_end_to_end(tmp_path, shared_data):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--output", str(out), "--dry-run", "--data", str(shared_data)],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["format"] == gc.FORMAT and result["mode"] == "dry-run" and result["ok"]
    steps = {s["name"]: s for s in result["steps"]}
    assert [s["name"] for s in result["steps"]] == STEPS
    for s in result["steps"]:
        assert s["status"] in ("passed", "skipped"), (s["name"], s["reason"], s.get("log_tail"))
        assert s["status"] == "passed" or s["reason"], s["name"]
        assert s["seconds"] >= 0 and s["budget_s"] > 0
    # on CPU: the CPU-able parts pass, the GPU-only parts are skipped with their reason
    assert {n for n, s in steps.items() if s["status"] == "passed"} == {
        "environment", "train_single_gpu", "demo", "eval_hf", "shards"}
    assert "CUDA" in steps["train_zero2"]["reason"] and "CUDA" in steps["eval_vllm"]["reason"]
    assert "vLLM on a CUDA device" in steps["pave_vllm"]["reason"]
    assert "CUDA" in steps["train_zero3"]["reason"] and "tests/test_distributed.py" in steps["train_zero3"]["reason"]
    env = steps["environment"]["details"]
    assert env["cuda_available"] is False and env["packages"]["torch"]["importable"]
    assert env["versions"]["transformers"] and env["peak_bf16_tflops"] is None

    train = steps["train_single_gpu"]["details"]
    assert train["accelerate_config"] == "accelerate_configs/cpu.yaml"
    assert train["steps"] == 2 and len(train["losses"]) == 2 and train["tokens_per_s"] > 0
    assert train["model_flops_per_token"] > 0 and train["mfu"] is None  # no GPU peak on CPU
    assert train["pairs"] > 0 and train["recipe"]["variant"] == "no_enhancement"

    demo = steps["demo"]["details"]
    assert demo["reduced"] and demo["comparison"]["comparable"] is False
    assert demo["summary"]["variants"]["real"]["n_claims"] == 16

    ev = steps["eval_hf"]["details"]
    assert ev["claims"] == 8 and ev["rounds"] == 4 and ev["mean_prompt_tokens"] >= 256
    assert ev["prefill"]["tokens"] > 0 and ev["prefill"]["tokens_per_s"] > 0

    sh = steps["shards"]["details"]  # the 2-shard pass (vLLM on a GPU) runs with hf on CPU
    assert sh["backend"] == "hf" and sh["claims"] == 8 and sum(sh["claims_per_shard"]) == 8
    assert sh["same_claim_order"] and sh["rounds_differing"] == 0 and sh["rounds_compared"] >= 8

    probes = steps["probes"]["details"]["variants"]
    for v in ("sft", "real"):
        assert set(probes[v]["cpu_means"]) == {"1", "2", "3", "4"}
        assert probes[v]["demo_probe_vs_cpu_fp32"]["ok"]  # the same probe twice on CPU agrees
    md = (out / "gpu_check.md").read_text()
    assert "| train_single_gpu | passed |" in md and "| eval_vllm | skipped |" in md
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert any(n.endswith("real-data-pairs.log") for n in tar.getnames())


def test_long_prompt_records_reach_the_target_and_keep_gold(tmp_path, tiny_llama):
    from transformers import AutoTokenizer

    from data_prep.prompts import encode_chat, render_evidence_prompt
    from data_prep.records import ClaimRecord, load_records, save_records
    from helpers import make_record_dict

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    length = lambda r: len(encode_chat(tok, render_evidence_prompt(r)))  # noqa: E731
    long_pool = [{"id": i, "text": f"Sentence number {i} about the sky and the sea.", "doc": "D"} for i in range(40)]
    recs = [make_record_dict(id="short"), make_record_dict(id="long", sentences=long_pool, evidence=[[35]])]
    recs += [make_record_dict(id=f"donor{k}") for k in range(3)]
    target = length(ClaimRecord.from_dict(recs[0])) + 60
    assert length(ClaimRecord.from_dict(recs[1])) > target
    save_records(recs, tmp_path / "in.jsonl")
    n, mean = gc.write_long_prompt_records(tmp_path / "in.jsonl", tiny_llama, tmp_path / "out.jsonl", 2, target)
    out = load_records(tmp_path / "out.jsonl")
    assert n == 2 and [r.id for r in out] == ["short", "long"]
    lengths = [length(r) for r in out]
    assert all(x >= target for x in lengths) and mean == sum(lengths) / 2
    assert 3 < len(out[1].sentences) < 40 and len(out[0].sentences) > 3  # the long pool trimmed, the short filled
    for r in out:
        assert set(r.gold_ids) <= set(r.pool_ids)  # gold lines are never trimmed
        assert r.sentences[-1].id not in r.gold_ids
        r.sentences = r.sentences[:-1]  # one sentence less falls under the target: "about" the target
        assert length(r) < target
