"""Helpers for the FAE tests: real Check-COVID records built in a few lines."""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.converters import CONVERTERS, ConvertInputs, ConvertStats
from data_prep.records import save_records


def checkcovid_records(shared_data: Path, n: int = 20, split: str = "covidCheck_test_composed.json"):
    """The first ``n`` SUPPORT/REFUTE claims of a Check-COVID split of the shared data as ClaimRecords."""
    return convert_checkcovid(Path(shared_data) / "check-covid", n, split)


def convert_checkcovid(data_dir: Path, n: int, claims_file: str) -> list:
    """The first ``n`` records `real-data convert --dataset check-covid` makes of ``data_dir/claims_file``.

    The converter itself reads them (pool = the abstract of the claim's ``cord_id``, gold = one group of its
    ``sent_index`` values; NOT_ENOUGH_INFO claims dropped), so tests and benchmarks see what users get.
    """
    inputs = ConvertInputs(claims=[Path(data_dir) / claims_file], corpus=Path(data_dir) / "corpus.json")
    out = []
    for rec, _, _ in CONVERTERS["check-covid"].convert(inputs, ConvertStats()):
        out.append(rec.validate())
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
