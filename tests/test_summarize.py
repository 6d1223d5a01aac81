"""recipes/summarize.py: the real-model summary's control columns and paired between-system differences."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from control_helpers import abstains_on_hole, abstains_when_shrunk, reads_evidence, records, run_with

from data_prep.records import save_records

REPO = Path(__file__).resolve().parents[1]


def test_summary_pairs_systems_over_the_same_claims_and_shows_the_control(tmp_path, monkeypatch):
    monkeypatch.setenv("FAE_CONTROL_TEST_KEY", "sk-control-test")
    recs = tmp_path / "recs.jsonl"
    save_records(records(24), recs)
    runs = tmp_path / "root" / "runs" / "m"
    run_with(abstains_on_hole, recs, runs / "sft" / "set")
    run_with(reads_evidence, recs, runs / "real" / "set")
    run_with(abstains_when_shrunk, recs, runs / "shrunk" / "set")
    out = tmp_path / "summary.json"
    subprocess.run([sys.executable, str(REPO / "recipes" / "summarize.py"), "--root", str(tmp_path / "root"),
                    "--model-id", "m", "--systems", "sft", "real", "shrunk", "--sets", "set", "--output", str(out)],
                   check=True, capture_output=True)
    summary = json.loads(out.read_text())
    d = summary["differences"]["set"]["real"]
    assert summary["baseline"] == "sft" and d["n_claims"] == 24
    # the hole-reader's IS is all cue; the reader's all evidence: the difference is the hole-reader's IS_ctrl
    sft_ctrl = summary["sets"]["set"]["sft"]["fae"]["control"]
    assert abs(d["IS_minus_IS_ctrl"]["difference"] - 100 * sft_ctrl["IS_ctrl"]) < 1e-6  # x100
    assert d["IS_minus_IS_ctrl"]["ci_low"] > 0 and d["IS"]["difference"] == 0.0
    # sufficiency: the verifier that abstains on any shorter pool gets nothing right on the line it cited alone,
    # the hole-reader nothing on gold plus k lines that leave holes; the reader answers both
    rows = {name: summary["sets"]["set"][name]["fae"] for name in ("sft", "real", "shrunk")}
    assert rows["shrunk"]["cited_only"]["label_accuracy"] == 0 and rows["real"]["cited_only"]["label_accuracy"] == 1
    shrunk = summary["differences"]["set"]["shrunk"]
    assert shrunk["cited_only_accuracy"]["difference"] == pytest.approx(
        100 * (rows["shrunk"]["cited_only"]["label_accuracy"] - rows["sft"]["cited_only"]["label_accuracy"]))
    assert shrunk["cited_only_accuracy"]["ci_high"] < 0
    sweep = {name: rows[name]["size_sweep"]["sweep_accuracy"] for name in rows}
    assert sweep["sft"] < sweep["real"] == 1
    assert d["sweep_accuracy"]["difference"] == pytest.approx(100 * (sweep["real"] - sweep["sft"]))
    assert d["sweep_accuracy"]["ci_low"] > 0
    md = out.with_suffix(".md").read_text()
    assert "sufficiency (×100)" in md and "cited-only Acc" in md
    assert "paired differences from sft" in md and "| real |" in md and "IS − IS_ctrl" in md
