"""The committed real study (benchmarks/results/study, recipes/study/reproduce.sh) read as committed: its
gzipped responses and both families files give the committed report's numbers again, and its JSON names
models and inputs without one machine's paths. The same for the format-tuned models' report
(recipes/study/format_tune.sh: the untuned and tuned studies in one report), whose INVALID shares
docs/study.md quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fae.cli import main as fae

STUDY = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "study"
UNTUNED = ("smollm2-135m-instruct", "gemma3-270m")
TUNED = tuple(f"{m}-format" for m in UNTUNED)
# each committed report and the models of its studies, in the recipes' order (models, then datasets)
REPORTS = {"report": UNTUNED, "report-format-tuning": UNTUNED + TUNED, "report-tuned": TUNED}


def studies_of(models) -> list[str]:
    return [f"studies/{d}-{m}" for m in models for d in ("scifact-dev", "check-covid-test")]


STUDIES = studies_of(UNTUNED)  # reproduce.sh's
POINT = ("estimate", "greedy", "per_seed", "seed_signs_agreeing")


def _regenerate(out: Path, *extra: str, studies: list[str] = STUDIES) -> None:
    assert fae(["study-report", *studies, "--families", "families/scifact-dev.jsonl",
                "--families", "families/check-covid-test.jsonl", "--output", str(out), *extra]) == 0


def test_the_committed_report_is_regenerated_from_the_committed_studies(tmp_path, monkeypatch):
    """recipes/study/reproduce.sh's report command on the committed files, with the paper's 50,000 primary draws
    (the secondary families with 2,000 instead of the paper's 10^6, which take minutes): every point estimate,
    diagnostic and control, the primary intervals of both families files (SciFact 16 families, not its 21
    claims) and every secondary point estimate of the committed report again. The byte-for-byte check with the
    paper's draws is the slow test below."""
    monkeypatch.chdir(STUDY)  # the committed report names its studies relative to the study folder
    out = tmp_path / "report"
    _regenerate(out, "--exploratory-draws", "2000", "--post-hoc-draws", "2000")
    new = json.loads((out / "study_report.json").read_text())
    old = json.loads((STUDY / "report" / "study_report.json").read_text())
    assert [(p["dataset"], p["model"], p["families"]) for p in new["panels"]] == [
        ("scifact", "smollm2-135m-instruct", 16), ("check-covid", "smollm2-135m-instruct", 4),
        ("scifact", "gemma3-270m", 16), ("check-covid", "gemma3-270m", 4)]
    secondary = ("exploratory", "post_hoc")
    for a, b in zip(new["panels"], old["panels"]):
        for name, v in a["values"].items():
            assert {k: v[k] for k in POINT} == {k: b["values"][name][k] for k in POINT}, name
        assert {k: v for k, v in a.items() if k not in secondary} == \
            {k: v for k, v in b.items() if k not in secondary}
        for family in secondary:
            for name, v in a[family]["values"].items():
                assert {k: v[k] for k in POINT} == {k: b[family]["values"][name][k] for k in POINT}, name
    assert {k: v for k, v in new.items() if k not in ("panels", "secondary")} == \
        {k: v for k, v in old.items() if k not in ("panels", "secondary")}
    assert old["secondary"]["exploratory"]["draws"] == old["secondary"]["post_hoc"]["draws"] == 1_000_000


def test_the_format_tuning_report_is_regenerated_from_the_committed_studies(tmp_path, monkeypatch):
    """format_tune.sh's report over the untuned and the tuned studies (the secondary families with 2,000 draws):
    every panel's point estimates, diagnostics, controls and INVALID shares of the committed report again, and
    the untuned panels' points are the untuned report's (a panel's estimates do not depend on its neighbours;
    only K, and with it every interval, does)."""
    monkeypatch.chdir(STUDY)
    out = tmp_path / "report"
    _regenerate(out, "--exploratory-draws", "2000", "--post-hoc-draws", "2000",
                studies=studies_of(REPORTS["report-format-tuning"]))
    new = json.loads((out / "study_report.json").read_text())
    old = json.loads((STUDY / "report-format-tuning" / "study_report.json").read_text())
    untuned = json.loads((STUDY / "report" / "study_report.json").read_text())
    assert [p["model"] for p in new["panels"]] == [m for m in UNTUNED + TUNED for _ in range(2)]
    assert new["bootstrap"]["bonferroni_k"] == 2 * untuned["bootstrap"]["bonferroni_k"]
    for a, b in zip(new["panels"], old["panels"]):
        for name, v in a["values"].items():
            assert {k: v[k] for k in POINT} == {k: b["values"][name][k] for k in POINT}, name
        for key in ("controls", "diagnostics", "lenient", "truncation", "invalid_observations", "partition"):
            assert a.get(key) == b.get(key), (a["dataset"], a["model"], key)
    for a, b in zip(new["panels"], untuned["panels"]):
        for name, v in a["values"].items():
            assert {k: v[k] for k in POINT if k != "seed_signs_agreeing"} == \
                {k: b["values"][name][k] for k in POINT if k != "seed_signs_agreeing"}, name


def test_the_tuned_models_own_report_has_the_combined_reports_points_and_its_own_label():
    """report-tuned (the tuned models alone, K = 8) against the combined report's tuned panels (K = 16): the same
    point estimates, controls and diagnostics; its own decision label, with nothing unanswered."""
    alone = json.loads((STUDY / "report-tuned" / "study_report.json").read_text())
    combined = json.loads((STUDY / "report-format-tuning" / "study_report.json").read_text())
    tuned = [p for p in combined["panels"] if p["model"] in TUNED]
    assert [(p["dataset"], p["model"]) for p in alone["panels"]] == [(p["dataset"], p["model"]) for p in tuned]
    for a, b in zip(alone["panels"], tuned):
        for name, v in a["values"].items():
            assert {k: v[k] for k in POINT} == {k: b["values"][name][k] for k in POINT}, name
        assert a["controls"] == b["controls"] and a["diagnostics"] == b["diagnostics"]
    assert alone["bootstrap"]["bonferroni_k"] == 8 and combined["bootstrap"]["bonferroni_k"] == 16
    assert alone["decision"] == {"label": "restricted/mixed evidence", "contrasts": 8}
    assert {u["model"] for u in combined["decision"]["unanswered"]} == set(UNTUNED)


@pytest.mark.slow
@pytest.mark.parametrize("report", sorted(REPORTS))
def test_the_committed_report_is_regenerated_byte_for_byte(tmp_path, monkeypatch, report):
    """The same command with every default (the paper's draw counts): the committed JSON and markdown exactly."""
    monkeypatch.chdir(STUDY)
    out = tmp_path / "report"
    _regenerate(out, studies=studies_of(REPORTS[report]))
    assert json.loads((out / "study_report.json").read_text()) == \
        json.loads((STUDY / report / "study_report.json").read_text())
    assert (out / "study_report.md").read_text() == (STUDY / report / "study_report.md").read_text()


@pytest.mark.parametrize("pattern", ["studies/*/study.json", *(f"{r}/*.json" for r in REPORTS), "pools/*/summary.json",
                                     "families/*.summary.json", "format-tuning/*/*.json"])
def test_the_committed_json_holds_no_machine_paths(pattern):
    files = sorted(STUDY.glob(pattern))
    assert files
    for path in files:
        text = path.read_text()
        assert "/tmp/" not in text and "/root/" not in text and "/home/" not in text, path
    if pattern.startswith("report"):
        (report,) = [json.loads(p.read_text()) for p in files]
        assert {p["model"] for p in report["panels"]} == set(REPORTS[pattern.split("/")[0]])
