"""`fae study` checks what would fail later before it writes anything: a backend that cannot load here (vLLM not
installed, no CUDA device) and pools with one ordering only (`fae study-report` refuses those). Each is one line,
exit 2, and the output folder is never created, so a rerun of the same --output with another backend runs."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from openai_server import LocalOpenAIServer
from fae.backends import vllm_backend
from fae.cli import main as fae


def write_pools(root: Path, orderings: int = 2) -> Path:
    """Pools of two SciFact-like one-abstract units as `real-data retrieve` writes them, packed at 256 tokens."""
    root.mkdir()
    records = []
    for i in range(2):
        order = [[0, 1], [1, 0]][:orderings]
        records.append({"id": f"scifact-{i}:d{i}", "claim_id": f"scifact-{i}", "dataset": "scifact",
                        "claim": f"Claim {i} holds.", "label": "SUPPORT",
                        "sentences": [{"id": 0, "text": "It holds.", "doc": f"d{i}"},
                                      {"id": 1, "text": "Something else.", "doc": f"d{i}"}],
                        "evidence": [[0]],
                        "retrieval": {"orderings": order, "packed": {"256": [list(o) for o in order]},
                                      "gold_missed": []}})
    (root / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "misses.jsonl").write_text("")
    return root


def study(pools: Path, out: Path, backend: str, *extra: str) -> list[str]:
    return ["study", "--pools", str(pools), "--output", str(out), "--model", "m", "--backend", backend,
            "--seeds", "1103", "--control-claims", "0", "--no-progress", *extra]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture
def fake_vllm(monkeypatch):
    """An importable vllm package (this machine may have none); CUDA still decided by cuda_available."""
    for name in ("vllm", "vllm.lora", "vllm.lora.request"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm.lora.request"].LoRARequest = object


def test_vllm_without_cuda_writes_nothing_and_another_backend_then_runs(tmp_path, capsys, monkeypatch, fake_vllm):
    pools, out = write_pools(tmp_path / "pools"), tmp_path / "study"
    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: False)
    assert fae(study(pools, out, "vllm")) == 2
    assert "the vllm backend needs vLLM on a CUDA machine: torch sees no CUDA device" in one_line(capsys)
    assert not out.exists()
    with LocalOpenAIServer(responder=lambda body: "A") as srv:  # the same --output, another backend
        assert fae(study(pools, out, "openai", "--base-url", srv.base_url)) == 0
    assert json.loads((out / "study.json").read_text())["backend"] == "openai"


def test_a_local_model_is_named_by_its_directory():
    """study.json keeps the path (the resume compares it) and a portable name for the report; a path of another
    machine (not here, but no hub id either) is named by its directory too, never written out whole."""
    from real_fae_core.modelref import portable_name

    here = Path(__file__).resolve().parent
    assert portable_name(str(here)) == "tests" and portable_name("org/hub-model") == "org/hub-model"
    assert portable_name("/tmp/elsewhere/models/smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert portable_name("~/.cache/all-MiniLM-L6-v2/all-MiniLM-L6-v2") == "all-MiniLM-L6-v2"


def test_vllm_not_installed_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    pools, out = write_pools(tmp_path / "pools"), tmp_path / "study"
    assert fae(study(pools, out, "vllm")) == 2
    assert "the vllm backend needs vLLM on a CUDA machine (pip install 'real-fae[vllm]')" in one_line(capsys)
    assert not out.exists()


def test_pools_of_one_ordering_are_refused_before_anything_is_written(tmp_path, capsys):
    """BM25-only pools (retrieved without --reranker, docs/retrieval.md's offline path) have no second source:
    refused by `fae study` itself, not after the study has run, at `fae study-report`."""
    pools, out = write_pools(tmp_path / "pools", orderings=1), tmp_path / "study"
    assert fae(study(pools, out, "openai", "--base-url", "http://127.0.0.1:9")) == 2
    err = one_line(capsys)
    assert f"--pools {pools}: the pools have one ordering only" in err and "--reranker" in err
    assert not out.exists()


@pytest.mark.parametrize("refused", ["vllm without CUDA", "one ordering"])
def test_an_existing_empty_output_stays_empty_after_a_refusal(tmp_path, capsys, monkeypatch, fake_vllm, refused):
    """A folder made for the study beforehand (an empty --output, as a job script creates it) gets neither the
    output marker nor study.json: the checks come before the folder is claimed, so any backend can use it next."""
    monkeypatch.setattr(vllm_backend, "cuda_available", lambda: False)
    pools = write_pools(tmp_path / "pools", orderings=1 if refused == "one ordering" else 2)
    out = tmp_path / "study"
    out.mkdir()
    backend = ["vllm"] if refused == "vllm without CUDA" else ["openai", "--base-url", "http://127.0.0.1:9"]
    assert fae(study(pools, out, *backend)) == 2
    one_line(capsys)
    assert list(out.iterdir()) == []
