"""The study's inputs checked (docs/study.md, docs/retrieval.md, docs/errors.md): pools without their misses
file, a responses file cut short or with a line twice, malformed or foreign families files, an empty claims
file, a claim dropped for bad evidence named in the output. Each bad input is one line, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from real_fae_core.errors import UserError
from data_prep.cli import main as data_main
from fae.comparison.families_file import load_families
from fae.study import report as rep
from fae.study.grid import control_conditions, load_pools, primary_conditions

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO / "tests" / "data" / "scifact"
DEMO = REPO / "real" / "demo" / "base"
CORPUS = SCIFACT / "corpus_cited.jsonl"


def _claims(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("idx") / "i.sqlite"
    assert data_main(["index", "--corpus", str(CORPUS), "--format", "scifact", "--output", str(out)]) == 0
    return out


def _retrieve(claims: Path, index: Path, out: Path, *extra: str) -> int:
    return data_main(["retrieve", "--dataset", "scifact", "--claims", str(claims), "--corpus", str(CORPUS),
                      "--index", str(index), "--output", str(out), *extra])


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ---------------------------------------------------------------- 1. pools without misses.jsonl


def test_pools_without_their_misses_file_are_refused(index, tmp_path):
    """Without misses.jsonl the missed gold would drop out of the study and recall would look better."""
    claims = _claims(tmp_path / "claims.jsonl", (SCIFACT / "claims_dev.jsonl").read_text().splitlines()[:4])
    pools = tmp_path / "pools"
    assert _retrieve(claims, index, pools, "--budgets", "128", "--tokenizer", str(DEMO)) == 0
    load_pools(pools)  # the whole directory reads
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(pools / "records.jsonl", cut / "records.jsonl")
    with pytest.raises(UserError) as err:
        load_pools(cut)
    assert "no misses.jsonl" in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- 2. responses cut short or twice


def write_study(path: Path, *, pool_units: list[str] | None = None) -> tuple[Path, list[dict]]:
    """A finished study of 4 one-claim units, unit u0 with the greedy controls, in the grid's order."""
    path.mkdir(parents=True)
    budgets, formats, seeds, sources = [256, 2048], ["codes", "labels"], [1103], [0, 1]
    cfg = {"dataset": "fever", "model": "m", "pools_sha256": "p", "seeds": seeds, "budgets": budgets,
           "formats": formats, "sources": sources, "missed_relevant": {}, "notes": []}
    if pool_units is not None:
        cfg["pool_units"] = pool_units
    (path / "study.json").write_text(json.dumps(cfg))
    units = [{"id": f"u{i}", "claim_id": f"c{i}", "gold_label": "SUPPORT" if i % 2 else "REFUTE",
              "groups": [[0]], "control": i == 0,
              "submitted": {"256": [[0], [1]], "2048": [[0], [0]]}} for i in range(4)]
    (path / "units.jsonl").write_text("".join(json.dumps(u) + "\n" for u in units))

    class U:
        def __init__(self, uid):
            self.id = uid
    conds = [c for u in units for c in primary_conditions(U(u["id"]), sources, budgets, formats, [0, 1])]
    conds += [c for u in units if u["control"] for c in control_conditions(U(u["id"]), sources, budgets, formats)]
    lines = [{"unit": c.unit, "kind": c.kind, "source": c.source, "budget": c.budget, "format": c.format,
              "replicate": c.replicate, "control": c.control, "variant": c.variant,
              "answer": "SUPPORT" if (hash(c.key) % 3) else "REFUTE"} for c in conds]
    (path / "responses.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, lines


def _report(tmp_path, studies, families=None):
    return rep.run(rep.StudyReportConfig(studies=[str(s) for s in studies], output=str(tmp_path / "out"),
                                         families=families, draws=20,
                                         exploratory_draws=20, post_hoc_draws=20))


def test_a_whole_study_reports(tmp_path):
    study, _ = write_study(tmp_path / "s")
    res = _report(tmp_path, [study])
    assert res.summary["panels"][0]["controls"]["gold"]["planned"] == 4


@pytest.mark.parametrize("cut", [1, 5])
def test_a_responses_file_cut_short_is_refused(tmp_path, cut):
    """Cut at the end the file loses controls, which the primary check never looked at: planned 4, reported 3."""
    study, lines = write_study(tmp_path / "s")
    (study / "responses.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:-cut]))
    with pytest.raises(UserError) as err:
        _report(tmp_path, [study])
    msg = str(err.value)
    assert "\n" not in msg and "responses.jsonl: missing condition: unit u0 control " in msg
    assert f"{cut} of {len(lines)} planned prompts missing" in msg
    assert not (tmp_path / "out").exists()


def test_duplicated_responses_are_refused(tmp_path):
    study, lines = write_study(tmp_path / "s")
    twice = lines[:3] + [lines[1]] + lines[3:] + [lines[-1]]
    (study / "responses.jsonl").write_text("".join(json.dumps(x) + "\n" for x in twice))
    with pytest.raises(UserError) as err:
        _report(tmp_path, [study])
    msg = str(err.value)
    assert "\n" not in msg and "responses.jsonl:4: 2 duplicated responses, the first unit u0 source 0" in msg
    assert "(also on line 2)" in msg
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 3. families files


FAMILY_CASES = {
    "list id": ([{"id": "u0", "family": "a"}, {"id": ["u1"], "family": "a"}], ":2: field 'id': must be a non-empty"),
    "integer family": ([{"id": "u0", "family": 7}], ":1: field 'family': must be a non-empty string, got 7"),
    "conflicting duplicate": ([{"id": "u0", "family": "a"}, {"id": "u1", "family": "b"}, {"id": "u0", "family": "b"}],
                              ":3: field 'id': 'u0' is given family 'b' here and 'a' on line 1"),
    "foreign ids": ([{"id": "u0", "family": "a"}, {"id": "scifact-13:4983", "family": "x"}],
                    ":2: field 'id': 'scifact-13:4983' is no unit of the pools of the studies given"),
}


@pytest.mark.parametrize("case", list(FAMILY_CASES))
def test_bad_families_files_are_refused_naming_file_line_and_field(tmp_path, case):
    rows, fragment = FAMILY_CASES[case]
    fam = tmp_path / "fam.jsonl"
    fam.write_text("".join(json.dumps(r) + "\n" for r in rows))
    study, _ = write_study(tmp_path / "s", pool_units=["u0", "u1", "u2", "u3", "u9"])
    with pytest.raises(UserError) as err:
        _report(tmp_path, [study], [str(fam)])
    assert f"{fam}{fragment}" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()
    if case != "foreign ids":  # `fae compare` reads the same file the same way (extra ids stay legal there)
        with pytest.raises(UserError, match=fragment.split(": ", 1)[0]):
            load_families(fam)


def test_a_families_file_of_the_whole_pools_serves_a_sampled_study(tmp_path):
    """Ids of pool units the study did not sample are the pools' own: legal; the same family twice too."""
    fam = tmp_path / "fam.jsonl"
    rows = [{"id": f"u{i}", "family": "u0" if i < 2 else f"u{i}"} for i in range(10)] + [{"id": "u1", "family": "u0"}]
    fam.write_text("".join(json.dumps(r) + "\n" for r in rows))
    study, _ = write_study(tmp_path / "s", pool_units=[f"u{i}" for i in range(10)])
    _report(tmp_path, [study], [str(fam)])
    assert (tmp_path / "out" / "study_report.json").is_file()


COVER_CASES = {
    "a unit outside": ([("u0", "a"), ("u1", "a"), ("u2", "b")],
                       "unit 'u3' of {study} is in no family: a families file must cover every pool the study asks"),
    "a claim split": ([("u0", "a"), ("u1", "a"), ("u2", "b"), ("u3", "c")],
                      ":4: field 'family': unit 'u3' of claim 'c2' is in family 'c', its unit 'u2' ({fam}:3) in 'b'"),
}


@pytest.mark.parametrize("case", list(COVER_CASES))
def test_families_that_leave_a_unit_out_or_split_a_claim_are_refused(tmp_path, case):
    """A studied unit no file names (a missed pool of a file built from records.jsonl alone) would be resampled
    on its own, and a claim split across families in pieces: one line, nothing written."""
    rows, fragment = COVER_CASES[case]
    fam = tmp_path / "fam.jsonl"
    fam.write_text("".join(json.dumps({"id": i, "family": f}) + "\n" for i, f in rows))
    study, _ = write_study(tmp_path / "s", pool_units=["u0", "u1", "u2", "u3"])
    if case == "a claim split":  # u2 and u3: two pools of claim c2
        units = [json.loads(x) for x in (study / "units.jsonl").read_text().splitlines()]
        units[3]["claim_id"] = "c2"
        (study / "units.jsonl").write_text("".join(json.dumps(u) + "\n" for u in units))
    with pytest.raises(UserError) as err:
        _report(tmp_path, [study], [str(fam)])
    assert fragment.format(study=study, fam=fam) in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 4. an empty claims file


def test_an_empty_claims_file_is_refused(index, tmp_path, capsys):
    empty = tmp_path / "claims.jsonl"
    empty.write_text("")
    assert _retrieve(empty, index, tmp_path / "pools") == 2
    assert f"{empty}: --claims: the file is empty" in _one_line(capsys)
    assert not (tmp_path / "pools").exists()


# ---------------------------------------------------------------- 5. a dropped claim is named


def test_a_claim_dropped_for_bad_evidence_is_named(index, tmp_path, capsys):
    lines = (SCIFACT / "claims_dev.jsonl").read_text().splitlines()[:3]
    bad = json.loads(lines[1])  # claim 3: rationales in abstract 14717500
    bad["evidence"] = {"14717500": [{"sentences": [999], "label": "SUPPORT"}]}
    claims = _claims(tmp_path / "claims.jsonl", [lines[0], json.dumps(bad), lines[2]])
    assert _retrieve(claims, index, tmp_path / "pools") == 0
    summary = json.loads((tmp_path / "pools" / "summary.json").read_text())
    reason = "sentence index outside the abstract"
    assert summary["dropped_by_converter"] == {reason: 1}
    (row,) = summary["dropped_claims"][reason]
    assert row["id"] == "scifact-3" and row["at"].startswith(f"{claims}:2: field 'evidence'")
    err = capsys.readouterr().err
    assert f"dropped 1 claims ({reason}: 1 (scifact-3))" in err


# ---------------------------------------------------------------- 5. a study kept gzipped, models named portably


def test_a_gzipped_study_reads_as_committed_and_names_its_model_portably(tmp_path):
    """benchmarks/results/study keeps responses.jsonl.gz: the report reads it as it is; the model is named by
    study.json's model_name (a machine's path is not a name); both files at once are refused."""
    import gzip

    study, _ = write_study(tmp_path / "s")
    cfg = json.loads((study / "study.json").read_text())
    (study / "study.json").write_text(json.dumps({**cfg, "model": "/tmp/x/models/tiny", "model_name": "tiny"}))
    plain = (study / "responses.jsonl").read_bytes()
    (study / "responses.jsonl.gz").write_bytes(gzip.compress(plain))
    with pytest.raises(UserError, match="holds both responses.jsonl and responses.jsonl.gz: keep one"):
        _report(tmp_path, [study])
    (study / "responses.jsonl").unlink()
    res = _report(tmp_path, [study])
    assert res.summary["panels"][0]["model"] == "tiny"
    assert "/tmp/x" not in (tmp_path / "out" / "study_report.json").read_text()
