"""`fae compare` on hand-built FAE run directories (the claims.jsonl / config.json / metrics.json contract)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fae_helpers import CLAIMS, write_run

from real_fae_core.errors import UserError
from fae.cli import main

REPO = Path(__file__).resolve().parents[1]

@pytest.fixture
def runs(tmp_path):
    return write_run(tmp_path / "sft", 0), write_run(tmp_path / "real", 1)


def test_compare_writes_both_files_with_hand_checked_values(runs, tmp_path, capsys):
    a, b = runs
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--output", str(out), "--bootstrap", "400", "--seed", "3"]) == 0
    res = json.loads((out / "compare.json").read_text())
    for key in ("S00", "S01", "S10", "S11", "G", "E0", "A1", "A0", "E1", "I"):
        assert set(res[key]) == {"estimate", "ci_low", "ci_high"}
        assert res[key]["ci_low"] <= res[key]["estimate"] + 1e-9 <= res[key]["ci_high"] + 2e-9
    assert (res["n_claims"], res["metric"], res["bootstrap"], res["seed"]) == (4, "strict", 400, 3)
    # round 0: a0 = [1,1,0,0] (c3 invalid, c4 wrong); a1 = [1,0,1,1] (c2 wrong)
    # strict eligibility: d0 = [1,0,0,1] (c2 cites 5, c3 nothing), d1 = [1,1,1,0] (c4 cites 3)
    est = {k: res[k]["estimate"] for k in ("S00", "S01", "S10", "S11", "G", "E0", "A1", "A0", "E1", "I")}
    assert est == pytest.approx({"S00": 25, "S01": 50, "S10": 50, "S11": 50,
                                 "G": 25, "E0": 25, "A1": 0, "A0": 25, "E1": 0, "I": -25})
    pc = res["product_covariance"]
    # Δd = [0,1,1,-1], mean .25: E0 = 50*.25 + 12.5, E1 = 75*.25 - 18.75
    assert pc["E0"]["product"]["estimate"] == pytest.approx(12.5)
    assert pc["E0"]["covariance"]["estimate"] == pytest.approx(12.5)
    assert pc["E1"]["product"]["estimate"] == pytest.approx(18.75)
    assert pc["E1"]["covariance"]["estimate"] == pytest.approx(-18.75)
    by = res["by_gold_label"]
    assert by["SUPPORT"]["n_claims"] == 2 and by["SUPPORT"]["S00"] == pytest.approx(25)
    assert by["REFUTE"]["S00"] == pytest.approx(0) and by["REFUTE"]["S10"] == pytest.approx(25)
    # run metrics recomputed per claim: A a_r = [2/4, 4/4, 2/4]; B a_r = [3/4, 1/4, 0]
    m = res["metrics"]
    assert m["label_accuracy"]["A"]["estimate"] == pytest.approx(50)
    assert m["IS"]["A"]["estimate"] == pytest.approx(-100)
    assert m["IS"]["B"]["estimate"] == pytest.approx(100 * (1 - 1 / 3))
    assert m["IO"]["difference"]["estimate"] == pytest.approx(87.5 - 25)
    assert m["flip_rate"]["A"]["estimate"] == pytest.approx(25)  # c2 R->S, c4 S->R of 8 transitions
    assert m["flip_rate"]["B"]["estimate"] == pytest.approx(0)  # S->NEI is not a direct flip
    assert m["invalid_rate_0"]["A"]["estimate"] == pytest.approx(25)
    assert m["invalid_rate_0"]["difference"]["estimate"] == pytest.approx(-25)
    md = (out / "compare.md").read_text()
    assert "| Quantity | Change | Estimate | 95% interval |" in md
    assert "| $G$ | Total source gain | 25.00 |" in md
    assert "| $I=E_{1}-E_{0}$ | Difference between orders | -25.00 |" in md
    assert "| SUPPORT | 2 |" in md and "| IS |" in md
    assert "G = 25.00" in capsys.readouterr().out


def test_label_accuracy_metric_says_evidence_swaps_change_nothing(runs, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, runs), "-o", str(out), "--metric", "label_accuracy", "--bootstrap", "200"]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["E0"] == {"estimate": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    assert res["E1"]["estimate"] == 0.0 and res["G"]["estimate"] == pytest.approx(25)
    assert any("E0 = E1" in n for n in res["notes"])
    assert "E0 = E1" in (out / "compare.md").read_text()


def test_fever_score_metric(runs, tmp_path):
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, runs), "-o", str(out), "--metric", "fever_score", "--bootstrap", "200"]) == 0
    res = json.loads((out / "compare.json").read_text())
    # fever: c2 group [2,3] needs both -> B's [2] is not eligible; d0 = [1,0,0,1], d1 = [1,0,1,0]
    assert res["S11"]["estimate"] == pytest.approx(50) and res["S01"]["estimate"] == pytest.approx(25)
    assert res["S10"]["estimate"] == pytest.approx(50) and res["E1"]["estimate"] == pytest.approx(0)


def test_families_resample_whole_units(runs, tmp_path):
    fam = tmp_path / "fam.jsonl"
    fam.write_text("\n".join(json.dumps({"id": c, "family": f}) for c, f in
                             [("c1", "x"), ("c2", "x"), ("c3", "y"), ("c4", "z")]) + "\n")
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, runs), "-o", str(out), "--families", str(fam), "--bootstrap", "200"]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["n_units"] == 3 and res["resampling_unit"] == "family"
    assert res["G"]["estimate"] == pytest.approx(25)  # point estimates do not depend on units
    fam_json = tmp_path / "fam.json"
    fam_json.write_text(json.dumps({"c1": "x", "c2": "x", "c3": "y"}))
    assert main(["compare", *map(str, runs), "-o", str(out), "--families", str(fam_json)]) == 2


def test_errors_are_clear(runs, tmp_path, capsys):
    a, b = runs
    # different claims
    other = write_run(tmp_path / "other", 1, claims=CLAIMS[:3])
    assert main(["compare", str(a), str(other), "-o", str(tmp_path / "o")]) == 2
    assert "cover different claims: 1 only in" in capsys.readouterr().err
    # different record files
    diff = write_run(tmp_path / "diff", 1, sha="f" * 64)
    assert main(["compare", str(a), str(diff), "-o", str(tmp_path / "o")]) == 2
    assert "different record files" in capsys.readouterr().err
    # missing families
    fam = tmp_path / "fam.json"
    fam.write_text(json.dumps({"c1": "x"}))
    assert main(["compare", str(a), str(b), "-o", str(tmp_path / "o"), "--families", str(fam)]) == 2
    assert "3 claim id(s) have no family: 'c2'" in capsys.readouterr().err
    # broken claims.jsonl line
    bad = write_run(tmp_path / "bad", 1)
    lines = (bad / "claims.jsonl").read_text().splitlines()
    lines[2] = lines[2].replace('"cited": [1]', '"cited": "x"', 1)
    (bad / "claims.jsonl").write_text("\n".join(lines) + "\n")
    (bad / "metrics.json").unlink()  # else refused first: metrics.json does not match the edited claims.jsonl
    assert main(["compare", str(a), str(bad), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "claims.jsonl:3: claim 'c3': field 'rounds[0].cited'" in err
    # not a run directory
    assert main(["compare", str(a), str(tmp_path / "nope"), "-o", str(tmp_path / "o")]) == 2
    assert f"run directory {tmp_path / 'nope'} not found" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_console_entry_point(runs, tmp_path):
    out = tmp_path / "cmp"
    proc = subprocess.run([sys.executable, "-m", "fae.cli", "compare", *map(str, runs), "--output", str(out),
                           "--bootstrap", "100"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "compare.json").is_file() and (out / "compare.md").is_file()


def test_families_file_errors_name_their_line(tmp_path):
    from fae.comparison.families_file import load_families

    p = tmp_path / "f.jsonl"
    # one JSONL line is a JSONL file, not a map {"id": ..., "family": ...}
    p.write_text(json.dumps({"id": "c1", "family": "x"}) + "\n")
    assert load_families(p) == {"c1": "x"}
    p.write_text('{"id": "c1", "family": "x"}\n{"id": "c2",\n')
    with pytest.raises(UserError, match=r"f\.jsonl:2: invalid JSON"):
        load_families(p)
    p.write_bytes(b'{"id": "c1", "family": "\xff"}\n')
    with pytest.raises(UserError, match=r"f\.jsonl:1: not valid UTF-8"):
        load_families(p)
    p.write_text('{"id": "c1"}\n')
    with pytest.raises(UserError, match=r"f\.jsonl:1: expected an object with 'id' and 'family'"):
        load_families(p)
    p.write_text(json.dumps({"c1": "x", "c2": "y"}))
    assert load_families(p) == {"c1": "x", "c2": "y"}


def test_compare_as_a_function_gives_what_the_command_line_gives(runs, tmp_path, capsys):
    from typing import get_args, get_type_hints

    from fae.comparison import accounting
    from fae.comparison.compare import CompareConfig, run

    a, b = runs
    assert main(["compare", str(a), str(b), "--output", str(tmp_path / "cli"), "--bootstrap", "300",
                 "--seed", "5", "--metric", "fever_score"]) == 0
    res = run(CompareConfig(run_a=a, run_b=b, output=tmp_path / "py", bootstrap=300, seed=5, metric="fever_score"))
    assert res.ok and res.outputs == {"json": str(tmp_path / "py" / "compare.json"),
                                      "markdown": str(tmp_path / "py" / "compare.md")}
    cli = json.loads((tmp_path / "cli" / "compare.json").read_text())
    assert json.loads((tmp_path / "py" / "compare.json").read_text()) == cli
    assert json.loads(json.dumps(res.summary)) == cli and res.summary["G"]["estimate"] == cli["G"]["estimate"]
    assert (tmp_path / "py" / "compare.md").read_text() == (tmp_path / "cli" / "compare.md").read_text()
    assert get_args(get_type_hints(CompareConfig)["metric"]) == accounting.METRICS  # the choices, once
    with pytest.raises(UserError, match=r"^CompareConfig: confidence: must be < 1, got 1.5$"):
        CompareConfig(run_a=a, run_b=b, output=tmp_path / "x", confidence=1.5)
    with pytest.raises(UserError, match=r"^CompareConfig: metric: must be one of strict, fever_score"):
        CompareConfig(run_a=a, run_b=b, output=tmp_path / "x", metric="f1")


# ---------------------------------------------------------------- the control arm and gold-only pools (SPEC §6)

# per claim of fae_helpers.CLAIMS: (label on the round-1 control or None = left out, label on gold-only)
ARMS_A = {"c1": ("SUPPORT", "SUPPORT"), "c2": ("REFUTE", "NOT_ENOUGH_INFO"), "c3": ("SUPPORT", "SUPPORT"),
          "c4": (None, "REFUTE")}
ARMS_B = {"c1": ("SUPPORT", "NOT_ENOUGH_INFO"), "c2": ("SUPPORT", "NOT_ENOUGH_INFO"),
          "c3": ("NOT_ENOUGH_INFO", "NOT_ENOUGH_INFO"), "c4": ("REFUTE", None)}


def add_arms(run: Path, arms: dict, line_ids: str | None = None) -> Path:
    """Give a write_run run the control arm (rounds 1..2) and gold-only answers of ``arms``; reseal it."""
    from fae_helpers import seal_run

    def answer(r, label, pool):
        return {"round": r, "pool_ids": pool, "raw_output": "...", "label": label, "cited": [],
                "hallucinated": [], "valid": True, "reused": False}

    claims = [json.loads(x) for x in (run / "claims.jsonl").read_text().splitlines()]
    for c in claims:
        ctrl, gold = arms[c["id"]]
        c["control"] = [{"round": r, "skipped": "0 lines neither cited nor gold; the ablation removed 1 by round 1"}
                        if ctrl is None else {**answer(r, ctrl, [0, 1, 2, 3, 4]), "removed": [5], "reused": r == 2}
                        for r in (1, 2)]
        c["gold_only"] = {"skipped": "no gold sentence in the pool"} if gold is None else \
            answer(0, gold, sorted({i for g in c["gold_groups"] for i in g}))
    (run / "claims.jsonl").write_text("".join(json.dumps(c) + "\n" for c in claims))
    cfg = json.loads((run / "config.json").read_text())
    cfg.update(control="random", control_seed=0, gold_only=True)
    if line_ids:
        cfg["line_ids"] = line_ids
    (run / "config.json").write_text(json.dumps(cfg))
    return seal_run(run, metrics={"n_claims": len(claims), "rounds": 2})


def test_compare_pairs_the_control_and_gold_only_differences_on_the_same_draws(runs, tmp_path, capsys, monkeypatch):
    from fae.comparison import accounting
    from fae.comparison.checks import load_compared
    from fae.comparison.compare import compare_runs

    a, b = add_arms(runs[0], ARMS_A), add_arms(runs[1], ARMS_B)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "-o", str(out), "--bootstrap", "400", "--seed", "9"]) == 0
    res = json.loads((out / "compare.json").read_text())
    ctrl, gold = res["control"], res["gold_only"]
    # control: c4 is left out of A's, so c1..c3. A: a0 = [1,1,0], a1 = [1,1,1], control [1,1,1]
    #  -> IS = IS_ctrl = 1 - 1/(2/3) = -50, IS - IS_ctrl = 0. B: a0 = [1,0,1], a1 = [0,0,0], control [1,0,0]
    #  -> IS = 100, IS_ctrl = 1 - (1/3)/(2/3) = 50, IS - IS_ctrl = 50.
    assert ctrl["n_claims"] == 3 and (ctrl["seed"], ctrl["bootstrap"]) == (9, 400)
    for key, want in {"IS": (-50, 100, 150), "IS_ctrl": (-50, 50, 100), "IS_minus_IS_ctrl": (0, 50, 50)}.items():
        got = tuple(ctrl[key][w]["estimate"] for w in ("A", "B", "difference"))
        assert got == pytest.approx(want), key
    # gold-only: c4 is skipped in B, so c1..c3. A: right [1,0,1], NEI [0,1,0]; B: right [0,0,0], NEI [1,1,1]
    assert gold["n_claims"] == 3
    assert gold["label_accuracy"]["A"]["estimate"] == pytest.approx(200 / 3)
    assert gold["label_accuracy"]["difference"]["estimate"] == pytest.approx(-200 / 3)
    assert gold["nei_answer_rate"]["difference"]["estimate"] == pytest.approx(100 - 100 / 3)
    for block, key in ((ctrl, "IS_minus_IS_ctrl"), (gold, "label_accuracy")):
        d = block[key]["difference"]
        assert d["ci_low"] is not None and d["ci_low"] <= d["estimate"] + 1e-9 <= d["ci_high"] + 1e-9
    assert res["line_ids"] == {"A": "original", "B": "original", "mixed": False}
    md = (out / "compare.md").read_text()
    assert "## Control arm and sufficiency pools (paired)" in md and "seed 9" in md
    assert "| control IS_minus_IS_ctrl | 3 | 0.00 | 50.00 | 50.00 |" in md
    assert "| gold-only label_accuracy | 3 | 66.67 | 0.00 | -66.67 |" in md
    assert "IS - IS_ctrl, B - A = 50.00" in capsys.readouterr().out
    # one bootstrap: the accounting, the run metrics and both arms are computed on the same resampled claims
    calls = []
    real = accounting.paired_bootstrap

    def spy(sums, statistic, **kw):
        calls.append(sums.shape)
        return real(sums, statistic, **kw)

    monkeypatch.setattr(accounting, "paired_bootstrap", spy)
    ra, rb = load_compared(a), load_compared(b)
    again = compare_runs(ra, rb, metric="strict", n_resamples=400, seed=9)
    assert len(calls) == 1 and json.loads(json.dumps(again)) == res
    # a run compared with itself: every paired difference is 0 on every draw, so its interval is [0, 0]
    same = compare_runs(ra, load_compared(a), metric="strict", n_resamples=200, seed=1)
    zero = {"estimate": 0.0, "ci_low": 0.0, "ci_high": 0.0}
    pairs = [("control", k) for k in ("IS", "IS_ctrl", "IS_minus_IS_ctrl")] + [("gold_only", "label_accuracy")]
    for block, key in pairs:
        d = same[block][key]["difference"]  # (draws without a round-0 success leave a ratio undefined)
        assert {k: d[k] for k in zero} == zero, key
    # the intervals move with the seed, the point estimates do not
    other = compare_runs(ra, rb, metric="strict", n_resamples=400, seed=10)
    assert other["control"]["IS_minus_IS_ctrl"]["difference"]["estimate"] == pytest.approx(50)
    assert other["control"]["seed"] == 10


def test_a_run_without_control_data_compares_without_them(runs, tmp_path, capsys):
    a = add_arms(runs[0], ARMS_A)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(runs[1]), "-o", str(out), "--bootstrap", "100"]) == 0
    res = json.loads((out / "compare.json").read_text())
    assert res["control"] is None and res["gold_only"] is None
    assert any("control not compared: run B has no control data" in n for n in res["notes"])
    md = (out / "compare.md").read_text()
    assert "## Control arm and sufficiency pools (paired)\n\nNot compared" in md
    assert "control not compared: run B has no control data" in md
    assert "IS - IS_ctrl" not in capsys.readouterr().out
    # neither run has them (older runs, --control none): the same, and nothing else changes
    assert main(["compare", *map(str, runs), "-o", str(tmp_path / "plain"), "--bootstrap", "100"]) == 0
    plain = json.loads((tmp_path / "plain" / "compare.json").read_text())
    assert plain["control"] is None and plain["gold_only"] is None and plain["G"]["estimate"] == pytest.approx(25)
    assert "Not compared: both runs need the control arm" in (tmp_path / "plain" / "compare.md").read_text()


def test_runs_numbering_their_lines_differently_are_refused_unless_allowed(runs, tmp_path, capsys):
    a, b = add_arms(runs[0], ARMS_A), add_arms(runs[1], ARMS_B, line_ids="renumbered")
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "line_ids" in err and "original" in err and "renumbered" in err
    assert "--allow-mixed-line-ids" in err and not out.exists()
    assert main(["compare", str(a), str(b), "-o", str(out), "--bootstrap", "100", "--allow-mixed-line-ids"]) == 0
    assert "WARNING: mixed line numbering" in capsys.readouterr().err
    res = json.loads((out / "compare.json").read_text())
    assert res["line_ids"] == {"A": "original", "B": "renumbered", "mixed": True}
    assert res["notes"][0].startswith("WARNING: mixed line numbering")
    assert (out / "compare.md").read_text().startswith("> **WARNING: mixed line numbering.**")


def with_dtype(run: Path, dtype: str | None) -> Path:
    """The run as made in ``dtype`` (config.json decoding.dtype, as fae run and fae from-inspect record it)."""
    cfg = json.loads((run / "config.json").read_text())
    cfg["decoding"] = {"greedy": True, **({"dtype": dtype} if dtype is not None else {})}
    (run / "config.json").write_text(json.dumps(cfg))
    return run


def test_runs_made_in_different_dtypes_are_refused_unless_allowed(runs, tmp_path, capsys):
    """bf16 and fp32 greedy answers flip on near ties: a difference between a bf16 run and an fp32 run
    (fae run's `--dtype auto` on a CPU with native bf16 vs Inspect's hf provider in fp32) is not the verifiers'."""
    a, b = with_dtype(runs[0], "bfloat16"), with_dtype(runs[1], "float32")
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bfloat16" in err and "float32" in err and "decoding.dtype" in err
    assert "--allow-mixed-dtype" in err and not out.exists()
    assert main(["compare", str(a), str(b), "-o", str(out), "--bootstrap", "100", "--allow-mixed-dtype"]) == 0
    assert "WARNING: mixed dtypes" in capsys.readouterr().err
    res = json.loads((out / "compare.json").read_text())
    assert res["dtype"] == {"A": "bfloat16", "B": "float32", "mixed": True}
    assert any(n.startswith("WARNING: mixed dtypes") for n in res["notes"])
    assert "> **WARNING: mixed dtypes.**" in (out / "compare.md").read_text()


@pytest.mark.parametrize("da, db", [("bfloat16", "bf16"), ("float32", "server"), ("float32", None),
                                    ("auto", "bfloat16"), (None, None)])
def test_the_same_dtype_or_an_unknown_one_compares(runs, tmp_path, da, db):
    """One dtype under two spellings, or a run that cannot know its dtype (a server's, vllm's auto, an older
    run): nothing recorded says the two differ."""
    a, b = with_dtype(runs[0], da), with_dtype(runs[1], db)
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "-o", str(out), "--bootstrap", "50"]) == 0
    assert json.loads((out / "compare.json").read_text())["dtype"]["mixed"] is False
