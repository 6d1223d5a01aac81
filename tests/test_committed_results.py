"""Committed results name their models without one machine's paths: a model, tokenizer, reranker or adapter
under benchmarks/results/ is a hub id or a directory's name (real_fae_core.modelref.portable_name), so a result
says what ran, not where it sat; and the benchmark that writes such names from paths rewrites its command too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MACHINE_ROOTS = ("/tmp/", "/work/", "/root/", "/home/", "~/")
MODEL_KEYS = {"model", "model_name", "tokenizer", "tokenizers", "reranker", "adapter"}


def _model_values(value, key: str | None = None):
    """Every string held under a model-naming key, at any depth (a reranker block's ``model`` included)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _model_values(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _model_values(v, key)
    elif isinstance(value, str) and key in MODEL_KEYS:
        yield key, value


@pytest.mark.parametrize("path", sorted(RESULTS.rglob("*.json")), ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_committed_json_names_models_without_machine_paths(path):
    found = [(k, v) for k, v in _model_values(json.loads(path.read_text(encoding="utf-8")))
             if v.startswith(MACHINE_ROOTS)]
    assert not found, f"{path.relative_to(ROOT)}: {found[:3]}"


def test_retrieval_quality_records_models_by_name():
    """benchmarks/retrieval_quality.py's command line and per-set results as written into its JSON."""
    from benchmarks.retrieval_quality import portable_command, portable_results

    argv = ["--data", "/work/shared/data", "--tokenizer=/tmp/x/models/smollm2-135m-instruct",
            "--reranker", "/root/.cache/m/all-MiniLM-L6-v2", "--reranker-kind", "bi-encoder",
            "--output", "benchmarks/results/r.json"]
    assert portable_command(argv) == (
        "python benchmarks/retrieval_quality.py --data DATA --tokenizer=smollm2-135m-instruct "
        "--reranker all-MiniLM-L6-v2 --reranker-kind bi-encoder --output benchmarks/results/r.json")
    assert portable_command(["--reranker", "BAAI/bge-reranker-base"]).endswith("--reranker BAAI/bge-reranker-base")
    result = {"tokenizers": ["/tmp/x/models/gemma3-270m"], "reranker": {"model": "/root/m/all-MiniLM-L6-v2",
                                                                        "kind": "bi-encoder"}}
    assert portable_results(result) == {"tokenizers": ["gemma3-270m"],
                                        "reranker": {"model": "all-MiniLM-L6-v2", "kind": "bi-encoder"}}
    assert portable_results({"tokenizers": [], "reranker": None})["reranker"] is None
