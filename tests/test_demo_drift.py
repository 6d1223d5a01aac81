"""real-demo's comparison with the committed summary: a tolerance in flipped claims, and its Table-2 pattern."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from real_fae_core.errors import EXIT_FAILURE, EXIT_OK
from real.demo import DemoConfig, pipeline, run
from real.demo.drift import (
    FLIP_TOLERANCE_CLAIMS,
    compare_with_reference,
    drift_lines,
    drift_report,
    table2_pattern,
)

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
AMX = json.loads((RESULTS / "demo_cpu_summary_amx.json").read_text())
EPYC = json.loads((RESULTS / "demo_cpu_summary.json").read_text())


def test_the_committed_run_holds_its_pattern_and_matches_itself():
    assert pipeline.REFERENCE_SUMMARY == RESULTS / "demo_cpu_summary_amx.json"
    assert all(held for _, held in table2_pattern(AMX))
    same = drift_report(AMX, pipeline.REFERENCE_SUMMARY)
    assert same["pattern_held"] and same["moved"] == [] and same["compared"] >= 40


def test_another_cpu_stays_inside_the_tolerance_and_a_real_change_does_not():
    """The measured EPYC vs AMX runs (same code for four variants) differ in dozens of numbers, none beyond a few
    claims; one variant's IS moved by one claim more than the tolerance is reported."""
    across_hosts = compare_with_reference(EPYC, AMX)
    assert across_hosts["compared"] >= 24 and across_hosts["moved"] == []
    changed = copy.deepcopy(AMX)
    real = changed["variants"]["real"]
    c0 = real["n_claims"] * real["round_accuracy"][0]
    real["IS"] -= (FLIP_TOLERANCE_CLAIMS + 1) / c0
    moved = compare_with_reference(changed, AMX)["moved"]
    assert [m["number"] for m in moved] == ["real.IS"]
    real["IS"] = AMX["variants"]["real"]["IS"] - (FLIP_TOLERANCE_CLAIMS - 1) / c0
    assert compare_with_reference(changed, AMX)["moved"] == []


def test_other_size_is_not_compared_and_says_why(tmp_path):
    small = copy.deepcopy(AMX)
    small["size"] = {**AMX["size"], "n_test": 50}
    report = drift_report(small, pipeline.REFERENCE_SUMMARY)
    assert "moved" not in report and "size" in report["skipped"]
    assert any("not compared" in line for line in drift_lines(report))


def test_a_broken_pattern_is_named_and_fails_the_command(monkeypatch, tmp_path):
    broken = copy.deepcopy(AMX)
    broken["variants"]["real"]["IS"] = broken["variants"]["sft"]["IS"]
    report = drift_report(broken, pipeline.REFERENCE_SUMMARY)
    assert not report["pattern_held"]
    assert "  [FAILED] ablation raises IS: REAL's IS - SFT's >= 0.5" in drift_lines(report)
    for summary, code in ((broken, EXIT_FAILURE), (AMX, EXIT_OK)):
        monkeypatch.setattr(pipeline, "run_demo", lambda *a, s=summary, **k: s)
        assert run(DemoConfig(output=str(tmp_path))).exit_code == code
