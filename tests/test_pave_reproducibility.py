"""benchmarks/pave_reproducibility.py, the check a user runs before relying on `fae pave`'s resume on their
machine: it must report equal runs as equal (real `fae pave` subprocesses, a real SIGKILL) and name the samples
that differ when they do."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from data_prep.records import load_records, save_records
from real.demo.pipeline import BASE_DIR, DemoSize, write_world_records

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "pave_reproducibility.py"


def _load():
    spec = importlib.util.spec_from_file_location("pave_reproducibility", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pave_reproducibility"] = mod
    spec.loader.exec_module(mod)
    return mod


check = _load()


def _demo_records(tmp_path: Path, n: int) -> Path:
    _, test = write_world_records(tmp_path / "world", DemoSize(n_train=4, n_test=n), seed=0)
    recs = load_records(test)
    assert len(recs) == n and all(r.extra.get("counterfactual_sentences") for r in recs)
    return test


@pytest.mark.slow
def test_runs_in_fresh_processes_and_a_killed_and_resumed_run_are_compared_byte_for_byte(tmp_path, capsys):
    records = _demo_records(tmp_path, 4)
    out = tmp_path / "check.json"
    rc = check.main(["--records", str(records), "--model", str(BASE_DIR), "--limit", "4", "--runs", "2",
                     "--json", str(out), "--", "--samples", "3", "--jsd-samples", "2", "--max-new-tokens", "12",
                     "--stability", "vote", "--seed", "5"])
    result = json.loads(out.read_text())
    assert rc == 0 and result["reproducible"] is True, capsys.readouterr().err[-2000:]
    resumed = result["killed_and_resumed"]
    assert resumed["killed"] is True and 1 <= resumed["claims_before_kill"] < 4
    assert [r["byte_identical"] for r in result["runs"]] == [True, True] and resumed["byte_identical"]
    # 4 claims x 4 prompts (claim only, gold evidence, two counterfactual kinds) x (N + K) samples
    assert resumed["samples"] == 4 * 4 * (3 + 2)
    assert result["command"][:2] == ["fae", "pave"] and result["command"][-2:] == ["--seed", "5"]


def test_a_changed_sample_is_named_and_counted(tmp_path):
    rows = [{"id": f"c{i}", "conditions": {"gold": {"answers": ["SUPPORT"] * 2, "raw": [f"a{i}", f"b{i}"]}}}
            for i in range(3)]
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows[1]["conditions"]["gold"]["raw"][1] = "changed"
    second.write_text("".join(json.dumps(r) + "\n" for r in rows))
    same = check.compare(first, first)
    assert same["byte_identical"] and same["differing_samples"] == 0 and same["samples"] == 6
    other = check.compare(first, second)
    assert not other["byte_identical"] and other["differing_samples"] == 1
    assert other["first_differing"] == [["c1", "gold", 1]]


def test_a_kill_that_cannot_happen_before_the_end_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        check.main(["--records", str(tmp_path / "r.jsonl"), "--model", "m", "--limit", "1"])


@pytest.mark.parametrize("option", ["--output", "--output=elsewhere", "--limit", "--chunk-size"])
def test_options_the_check_sets_itself_are_refused_after_the_separator(tmp_path, option, capsys):
    """An --output passed through would make every run write (or resume) one directory: equal files, nothing
    checked, exit 0."""
    with pytest.raises(SystemExit) as err:
        check.main(["--records", str(tmp_path / "r.jsonl"), "--model", "m", "--", option, "x"])
    assert err.value.code == 2
    assert f"{option.split('=')[0]} after --" in capsys.readouterr().err
