"""recipes/summarize.py: the real-model summary's control columns and paired between-system differences."""

import json
import subprocess
import sys
from pathlib import Path

from control_helpers import abstains_on_hole, reads_evidence, records, run_with

from data_prep.records import save_records

REPO = Path(__file__).resolve().parents[1]


def test_summary_pairs_systems_over_the_same_claims_and_shows_the_control(tmp_path, monkeypatch):
    monkeypatch.setenv("FAE_CONTROL_TEST_KEY", "sk-control-test")
    recs = tmp_path / "recs.jsonl"
    save_records(records(24), recs)
    runs = tmp_path / "root" / "runs" / "m"
    run_with(abstains_on_hole, recs, runs / "sft" / "set")
    run_with(reads_evidence, recs, runs / "real" / "set")
    out = tmp_path / "summary.json"
    subprocess.run([sys.executable, str(REPO / "recipes" / "summarize.py"), "--root", str(tmp_path / "root"),
                    "--model-id", "m", "--systems", "sft", "real", "--sets", "set", "--output", str(out)],
                   check=True, capture_output=True)
    summary = json.loads(out.read_text())
    d = summary["differences"]["set"]["real"]
    assert summary["baseline"] == "sft" and d["n_claims"] == 24
    # the hole-reader's IS is all cue; the reader's all evidence: the difference is the hole-reader's IS_ctrl
    sft_ctrl = summary["sets"]["set"]["sft"]["fae"]["control"]
    assert abs(d["IS_minus_IS_ctrl"]["difference"] - 100 * sft_ctrl["IS_ctrl"]) < 1e-6  # x100
    assert d["IS_minus_IS_ctrl"]["ci_low"] > 0 and d["IS"]["difference"] == 0.0
    md = out.with_suffix(".md").read_text()
    assert "paired differences from sft" in md and "| real |" in md and "IS − IS_ctrl" in md
