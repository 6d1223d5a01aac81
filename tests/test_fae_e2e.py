"""End to end: `fae run` with a tiny model on real Check-COVID records, kill/resume, 2 processes."""

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port
from fae_helpers import write_checkcovid

from data_prep.records import load_records
from fae.ablation.engine import pool_after
from fae.ablation.metrics import compute_metrics
from fae.ablation.runio import read_claims
from fae.backends.hf import resolve_dtype
from fae.cli import main

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cc_records(shared_data, tmp_path_factory):
    return write_checkcovid(shared_data, tmp_path_factory.mktemp("cc") / "checkcovid.jsonl", n=20)


def run_args(records, out, model, *extra):
    return ["run", "--records", str(records), "--output", str(out), "--model", str(model),
            "--rounds", "4", "--batch-size", "1", "--max-new-tokens", "24", "--no-progress", *extra]


@pytest.fixture(scope="module")
def reference_run(cc_records, noisy_llama, tmp_path_factory):
    """One uninterrupted in-process run at --batch-size 1."""
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main(run_args(cc_records, out, noisy_llama)) == 0
    return out


def test_run_writes_consistent_claims_metrics_report(reference_run, cc_records):
    out = reference_run
    records = load_records(cc_records)
    claims = read_claims(out / "claims.jsonl")
    assert [c["id"] for c in claims] == [r.id for r in records]
    for rec, c in zip(records, claims):
        assert c["gold_label"] == rec.label and c["gold_groups"] == rec.evidence
        rounds = c["rounds"]
        assert [r["round"] for r in rounds] == [0, 1, 2, 3, 4]
        assert rounds[0]["pool_ids"] == rec.pool_ids and not rounds[0]["reused"]
        for prev, cur in zip(rounds, rounds[1:]):
            assert cur["pool_ids"] == pool_after(prev)  # S^{r+1} = S^r minus valid cited ids
            assert cur["reused"] == (cur["pool_ids"] == prev["pool_ids"])
            if cur["reused"]:
                assert cur["raw_output"] == prev["raw_output"]
        for r in rounds:
            assert set(r) >= {"round", "pool_ids", "raw_output", "label", "cited", "hallucinated", "valid", "reused"}
            assert r["valid"] == (r["label"] is not None)
            assert set(r["cited"]) <= set(r["pool_ids"]) and not set(r["hallucinated"]) & set(r["pool_ids"])
    assert len({c["rounds"][0]["raw_output"] for c in claims}) > 1  # answers depend on the prompt
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics.pop("computed_from")["n_claims"] == 20
    assert metrics == json.loads(json.dumps(compute_metrics(claims)))
    assert metrics["n_claims"] == 20 and metrics["rounds"] == 4
    assert metrics["model_calls"] + metrics["reused_calls"] == 20 * 5
    assert metrics["invalid_rate"][0] == sum(not c["rounds"][0]["valid"] for c in claims) / 20
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["backend"] == "hf" and cfg["rounds"] == 4 and cfg["adapter"] is None
    auto = str(resolve_dtype("auto", "cpu")).replace("torch.", "")  # bf16 on a CPU with native bf16
    assert cfg["decoding"] == {"greedy": True, "max_new_tokens": 24, "dtype": auto}
    assert cfg["records_sha256"] and cfg["versions"]["torch"] and cfg["command"].startswith("fae run --records")
    report = (out / "report.md").read_text()
    assert "| Model | Prec | Rec | F1 | Acc | Strict | IS | ER | IO |" in report
    assert (out / "trajectory.png").read_bytes()[:4] == b"\x89PNG"
    # rerunning the finished command changes nothing and calls no model
    before = (out / "claims.jsonl").read_bytes()
    assert main(run_args(cc_records, out, reference_run_model(out))) == 0
    assert (out / "claims.jsonl").read_bytes() == before
    # a different setting is refused
    assert main(run_args(cc_records, out, reference_run_model(out))[:-1] + ["--rounds", "2", "--no-progress"]) == 2


def reference_run_model(out):
    return json.loads((out / "config.json").read_text())["model"]


def test_report_over_two_runs(reference_run, tmp_path):
    assert main(["report", str(reference_run), str(reference_run), "--output", str(tmp_path),
                 "--names", "tiny-a", "tiny-b"]) == 0
    md = (tmp_path / "report.md").read_text()
    m = json.loads((reference_run / "metrics.json").read_text())
    row = f"| tiny-a | {100 * m['evidence_precision']:.2f} | {100 * m['evidence_recall']:.2f} |"
    assert row in md and "| tiny-b |" in md
    if m["round_accuracy"][0] < 0.5:
        assert "Warning — tiny-a" in md
    assert (tmp_path / "trajectory.png").stat().st_size > 1000


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def test_sigkill_mid_run_then_resume_matches_uninterrupted(reference_run, cc_records, noisy_llama, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fae.cli"] + run_args(cc_records, out, noisy_llama, "--chunk-size", "1")
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    claims_file = out / "claims.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if claims_file.exists() and claims_file.read_bytes().count(b"\n") >= 3:
            break
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stderr.close()
    n_killed = len(read_claims(claims_file))
    assert 3 <= n_killed < 20
    assert not (out / "metrics.json").exists()
    res = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"({n_killed} already in" in res.stderr
    resumed = read_claims(claims_file)
    ids = [c["id"] for c in resumed]
    assert len(ids) == len(set(ids)) == 20  # every claim exactly once
    assert_same_claims(resumed, read_claims(reference_run / "claims.jsonl"))  # same answers as uninterrupted


def assert_same_claims(got, want):
    """Same claims and answers in every arm; soft FAE's label probabilities equal up to fp32 rounding.

    Another split into batches pads the prompts differently, which moves the
    teacher-forced probabilities in the 7th digit but never the greedy answers
    (on an AVX2 CPU the control, gold-only and size-sweep pools' too).
    """
    soft = ("label_probs", "label_logprobs")

    def answered(claim):  # every answered question of a claim: its rounds and each arm's
        out = list(claim["rounds"]) + [c for c in claim.get("control") or [] if c]
        out += [claim[k] for k in ("gold_only", "cited_only") if claim.get(k)]
        return out + list((claim.get("size_sweep") or {}).get("rounds") or [])

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in soft}
        return [strip(v) for v in value] if isinstance(value, list) else value

    assert strip(got) == strip(want)
    for cg, cw in zip(got, want):
        for rg, rw in zip(answered(cg), answered(cw)):
            for key in soft:
                assert (key in rg) == (key in rw)
                if key in rg:
                    assert rg[key] == pytest.approx(rw[key], abs=1e-4)


def test_accelerate_two_cpu_processes_split_and_merge(reference_run, cc_records, noisy_llama, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "accelerate_configs" / "cpu_2proc.yaml"), "--main_process_port", str(free_port()),
           "-m", "fae.cli"] + run_args(cc_records, out, noisy_llama)
    res = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    todo = [int(re.search(rf"\[shard {i}/2\] (\d+) claims to do", res.stderr).group(1)) for i in (0, 1)]
    assert sum(todo) == 20 and min(todo) >= 5, todo  # the prompt-length-balanced deal: both ranks work
    for rank in (0, 1):  # both ranks wait for the merge, then leave at once and say so
        assert f"fae: rank {rank} of 2: exited cleanly (exit code 0" in res.stderr, res.stderr[-3000:]
    assert_same_claims(read_claims(out / "claims.jsonl"), read_claims(reference_run / "claims.jsonl"))
    logs = [[json.loads(x) for x in (out / "shards" / f"{i}-of-2" / "runs.jsonl").read_text().splitlines()]
            for i in (0, 1)]
    assert [[(e["shard"], e["claims"]) for e in log] for log in logs] == [[("shard 0/2", todo[0])],
                                                                         [("shard 1/2", todo[1])]]
    config = json.loads((out / "config.json").read_text())
    assert config["shards"]["count"] == 2 and "shard" not in config


def test_peft_adapter_changes_answers_and_is_recorded(noisy_llama, cc_records, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from fae.backends.hf import load_hf_model

    torch.manual_seed(0)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(noisy_llama),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    lm, tok = load_hf_model(str(noisy_llama), str(adapter), device="cpu")
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert not any("lora" in n for n, _ in lm.named_parameters())  # merged for inference
    base, lora = tmp_path / "base", tmp_path / "lora"
    assert main(run_args(cc_records, base, noisy_llama, "--limit", "4")) == 0
    assert main(run_args(cc_records, lora, noisy_llama, "--limit", "4", "--adapter", str(adapter))) == 0
    raw = lambda d: [c["rounds"][0]["raw_output"] for c in read_claims(d / "claims.jsonl")]
    assert raw(base) != raw(lora)
    assert json.loads((lora / "config.json").read_text())["adapter"] == str(adapter)


def test_left_padded_batches_answer_like_batch_size_one(reference_run, cc_records, noisy_llama, tmp_path):
    """Left padding with its mask keeps answers; an all-ones mask over the pads changed 3 of these 20."""
    out = tmp_path / "bs8"
    assert main(run_args(cc_records, out, noisy_llama, "--batch-size", "8")) == 0
    ref = read_claims(reference_run / "claims.jsonl")
    got = read_claims(out / "claims.jsonl")
    differ = sum(a["rounds"][0]["raw_output"] != b["rounds"][0]["raw_output"] for a, b in zip(ref, got))
    assert differ <= 1, f"{differ} of {len(ref)} round-0 answers changed with batching"


def test_fae_run_as_a_function_equals_the_command_line_and_records_a_resumable_line(reference_run, cc_records,
                                                                                     noisy_llama, tmp_path):
    """`fae.ablation.runner.run(FaeRunConfig(...))`: the same claims and metrics as `fae run`; its config.json
    names a `fae run` line that resumes it; an option of another backend is refused as on the command line."""
    import shlex

    from real_fae_core.errors import UserError
    from fae.ablation.runner import run
    from fae.ablation.runner import FaeRunConfig

    out = tmp_path / "fn"
    options = FaeRunConfig(records=cc_records, output=out, model=noisy_llama, rounds=4, batch_size=1,
                              max_new_tokens=24, progress=False)
    result = run(options)
    assert result.ok and result.outputs["run_dir"] == str(out)
    assert read_claims(out / "claims.jsonl") == read_claims(reference_run / "claims.jsonl")
    assert result.summary["label_accuracy"] == json.loads((reference_run / "metrics.json").read_text())[
        "label_accuracy"]
    command = json.loads((out / "config.json").read_text())["command"]
    assert command.startswith("fae run ") and "--batch-size 1" in command and "--no-progress" in command
    assert main(shlex.split(command)[1:]) == 0  # the recorded line resumes: nothing left to do, same claims
    assert read_claims(out / "claims.jsonl") == read_claims(reference_run / "claims.jsonl")
    with pytest.raises(UserError, match=r"tensor_parallel_size=2 is an option of --backend vllm"):
        run(options.replace(tensor_parallel_size=2))
    with pytest.raises(UserError, match=r"rounds: must be >= 0, got -1"):
        options.replace(rounds=-1)
