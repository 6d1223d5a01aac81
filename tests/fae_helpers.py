"""Helpers for the FAE tests: real Check-COVID records built in a few lines."""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.records import ClaimRecord, Sentence, save_records

_LABELS = {"SUPPORT": "SUPPORT", "REFUTE": "REFUTE"}


def checkcovid_records(shared_data: Path, n: int = 20, split: str = "covidCheck_test_composed.json"):
    """The first ``n`` SUPPORT/REFUTE claims of a Check-COVID split as ClaimRecords.

    Pool = the abstract of the claim's ``cord_id``; gold = its ``sent_index``
    values, one group (all of them together), as the upstream data defines it.
    """
    root = Path(shared_data) / "check-covid"
    corpus = {}
    for line in (root / "corpus.json").read_text(encoding="utf-8").splitlines():
        if line.strip():
            doc = json.loads(line)
            corpus[doc["cord_id"]] = doc
    out = []
    for line in (root / split).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        c = json.loads(line)
        if c["label"] not in _LABELS:
            continue
        doc = corpus[c["cord_id"]]
        sents = [Sentence(id=i, text=t, doc=c["cord_id"]) for i, t in enumerate(doc["abstract"])]
        gold = sorted({e["sent_index"] for e in c["evidence_set"]})
        rec = ClaimRecord(id=c["id"], dataset="check-covid", claim=c["claim"], label=_LABELS[c["label"]],
                          sentences=sents, evidence=[gold]).validate()
        out.append(rec)
        if len(out) == n:
            break
    return out


def write_checkcovid(shared_data: Path, path: Path, n: int = 20) -> Path:
    save_records(checkcovid_records(shared_data, n), path)
    return path


def seal_run(run_dir: Path, *, metrics: dict | None = None) -> Path:
    """Make a hand-built run directory a finished run as `fae run` leaves it.

    config.json gains the claim set (the ids of claims.jsonl, in file order) and,
    when ``metrics`` is given, metrics.json records the claims.jsonl it describes.
    """
    from fae.ablation import runio

    run_dir = Path(run_dir)
    claims = runio.read_claims(run_dir / runio.CLAIMS)
    cpath = run_dir / runio.CONFIG
    config = json.loads(cpath.read_text(encoding="utf-8")) if cpath.is_file() else {}
    config.update(runio.claim_set([str(c["id"]) for c in claims]))
    runio.write_json_atomic(cpath, config)
    if metrics is not None:
        runio.write_json_atomic(run_dir / runio.METRICS,
                                runio.stamp_metrics(metrics, run_dir / runio.CLAIMS, len(claims)))
    return run_dir
