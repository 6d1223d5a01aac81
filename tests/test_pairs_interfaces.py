"""`real-data pairs --interface`: format-tuning rows in the evaluation-choice study's answer interfaces.

A ``codes`` / ``labels`` row must be what `fae study` asks (the same prompt, built by the study's own
:class:`~fae.study.asking.Asker` over the same claim and units) with the one answer string the study's strict
reader takes for the row's label; ``study`` writes both; ``json`` (the default) writes the bytes it always did.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from helpers import make_record_dict

from data_prep.cli import main as real_data
from data_prep.pairs.build import INTERFACES, VARIANTS, UnknownStudyDataset, build_pairs
from data_prep.pairs.runner import PairsConfig, run
from data_prep.records import ClaimRecord
from fae.study.grid import Condition, Sentence, StudyUnit
from fae.study.interfaces import FORMATS, INVALID
from fae.study.replicates import Replicate, SamplingParams
from fae.study.asking import Asker
from real_fae_core.errors import UserError

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Sentence ids out of order and a line break inside a sentence: the study shows the pool in record order,
# numbered 0..n-1, each sentence on one line.
POOL = [{"id": 3, "text": "Rayleigh scattering\ncolours the sky.", "doc": "Sky"},
        {"id": 0, "text": "The sky appears blue by day.", "doc": "Sky"},
        {"id": 7, "text": "Clouds are white.", "doc": "Sky"},
        {"id": 1, "text": "Grass is green.", "doc": "Grass"},
        {"id": 8, "text": "Rain falls from clouds.", "doc": "Rain"}]
CASES = [("scifact", "SUPPORT", [[0], [3]], [0, 3]), ("check-covid", "REFUTE", [[1]], [1, 8]),
         ("fever", "SUPPORT", [[7, 0]], [0, 7]), ("check-covid", "SUPPORT", [[8]], [8]),
         ("scifact", "REFUTE", [[7]], [7, 1]), ("scifact", "NOT_ENOUGH_INFO", [], None)]
# sha256 of the JSON rows of _records() over every variant x line numbering x keep_pairs_together (seed 3),
# as build_pairs wrote them before --interface existed (commit 78d0fe4): the default interface changes no byte.
JSON_ROWS_SHA256 = "5b1037530a2443fa2f1d70e56af15d26dd031552dda249b436717096a72ee5f5"


def _records(pool=POOL) -> list[dict]:
    return [make_record_dict(id=f"r{i}", dataset=d, claim=f"Claim {i}:  the  sky\nis blue.", label=lab,
                             sentences=pool, evidence=e, enhanced_evidence=h)
            for i, (d, lab, e, h) in enumerate(CASES)]


@pytest.fixture
def records() -> list[ClaimRecord]:
    return [ClaimRecord.from_dict(r) for r in _records()]


def study_prompt(record: ClaimRecord, shown: list[int], fmt: str) -> list[dict]:
    """What `fae study` asks for ``record``'s claim in format ``fmt`` when a pool shows ``shown`` (source 0,
    greedy), built by the study's own runner."""
    unit = StudyUnit(id="u", claim_id=record.id, dataset=record.dataset, claim=record.claim,
                     gold_label=record.label, groups=[], orderings=[list(shown)], packed={256: [list(shown)]},
                     sentences={s.id: Sentence(s.id, s.text, s.doc) for s in record.sentences}, document=None)
    asker = Asker(record.dataset, {"u": unit}, {0: Replicate(0, None)}, SamplingParams())
    messages, info = asker.prompt(Condition("u", "primary", 0, 256, fmt, 0))
    assert info["shown"] == list(shown) and messages is not None
    return messages


def _metadata(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("prompt", "completion", "line_ids", "format")}


@pytest.mark.parametrize("interface", ["codes", "labels", "study"])
@pytest.mark.parametrize("variant", ["sft", "no_enhancement", "real_sufficient"])
def test_study_rows_are_the_study_prompt_and_the_strict_answer_of_their_label(records, variant, interface):
    by_id = {r.id: r for r in records}
    json_rows, json_info = build_pairs(records, variant, seed=None)
    rows, info = build_pairs(records, variant, seed=None, interface=interface)
    formats = INTERFACES[interface]
    assert info == json_info and len(rows) == len(json_rows) * len(formats)
    # each JSON row once per format, in order, with the same metadata (record ids in evidence and pool_ids)
    assert [(_metadata(r), r["format"]) for r in rows] == [(_metadata(j), f) for j in json_rows for f in formats]
    answers = set()
    for row in rows:
        rec = by_id[row["record_id"]]
        shown = [s.id for s in rec.sentences if s.id in set(row["pool_ids"])]  # the pool in record order
        assert row["prompt"] == study_prompt(rec, shown, row["format"])
        [message] = row["completion"]
        assert message["role"] == "assistant"
        assert FORMATS[row["format"]].parse(message["content"], rec.dataset) == row["label"] != INVALID
        assert message["content"] == message["content"].strip()
        assert row["line_ids"] == "renumbered" and row["dataset"] == rec.dataset
        answers.add((rec.dataset, row["format"], row["label"], message["content"]))
    # the dataset's own strings, not the project's labels
    if "labels" in formats:
        assert ("scifact", "labels", "REFUTE", "CONTRADICT") in answers
        if VARIANTS[variant].negatives:
            assert ("check-covid", "labels", "NOT_ENOUGH_INFO", "NOTENOUGHINFO") in answers
            assert ("fever", "labels", "NOT_ENOUGH_INFO", "NOT ENOUGH INFO") in answers
    if "codes" in formats:
        assert {a for d, f, lab, a in answers if f == "codes"} == ({"A", "B", "C"} if VARIANTS[variant].negatives
                                                                   else {"A", "B"})


def test_a_study_row_shows_an_ablated_pool_renumbered_without_a_hole(records):
    rows, _ = build_pairs(records, "no_enhancement", seed=None, interface="codes", line_ids="original")
    negative = next(r for r in rows if r["record_id"] == "r0" and r["kind"] == "negative")
    assert negative["pool_ids"] == [7, 1, 8] and negative["completion"][0]["content"] == "C"
    user = negative["prompt"][1]["content"]
    assert "line0: Clouds are white.\nline1: Grass is green.\nline2: Rain falls from clouds.\n\n" in user
    assert user.startswith("Claim: Claim 0: the sky is blue.\nDocument:\n")
    assert user.endswith("C if there is not enough information.")


def test_json_rows_are_byte_identical_to_the_rows_before_interfaces(records):
    digest = hashlib.sha256()
    for variant in VARIANTS:
        for line_ids in ("original", "renumbered"):
            for together in (False, True):
                rows, _ = build_pairs(records, variant, seed=3, line_ids=line_ids, keep_pairs_together=together)
                again, _ = build_pairs(records, variant, seed=3, line_ids=line_ids, keep_pairs_together=together,
                                       interface="json")
                assert again == rows and not any("format" in r for r in rows)
                digest.update("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    assert digest.hexdigest() == JSON_ROWS_SHA256


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_cli_writes_the_interface_and_the_rows_per_format(tmp_path, capsys):
    recs = _write(tmp_path / "r.jsonl", _records())
    base = ["pairs", "--records", recs, "--variant", "no_enhancement", "--seed", "5"]
    assert real_data([*base, "--output", str(tmp_path / "default")]) == 0
    assert real_data([*base, "--output", str(tmp_path / "json"), "--interface", "json"]) == 0
    assert real_data([*base, "--output", str(tmp_path / "study"), "--interface", "study"]) == 0
    assert "20 pairs (negative 10, positive 10; codes 10, labels 10); dropped" in capsys.readouterr().out
    default, plain, study = ((tmp_path / d / "pairs.jsonl").read_bytes() for d in ("default", "json", "study"))
    assert default == plain
    stats = {d: json.loads((tmp_path / d / "stats.json").read_text()) for d in ("default", "json", "study")}
    assert stats["default"] == stats["json"] and stats["json"]["interface"] == "json"
    assert "by_format" not in stats["json"] and stats["json"]["line_ids"] == "original"
    assert stats["study"]["interface"] == "study" and stats["study"]["line_ids"] == "renumbered"
    assert stats["study"]["by_format"] == {"codes": 10, "labels": 10} and stats["study"]["pairs"] == 20
    rows = [json.loads(line) for line in study.decode().splitlines()]
    assert {r["format"] for r in rows} == {"codes", "labels"} and len(rows) == 20
    from datasets import load_from_disk

    ds = load_from_disk(str(tmp_path / "study"))["train"]
    assert "format" in ds.column_names and ds[0]["completion"] == rows[0]["completion"]


def test_a_dataset_the_study_does_not_know_is_one_line_naming_file_and_line(tmp_path, capsys):
    bad = _records()
    bad[3]["dataset"] = "climate-fever"
    recs = _write(tmp_path / "bad.jsonl", bad)
    for interface in ("codes", "labels", "study"):
        out = tmp_path / f"out-{interface}"
        assert real_data(["pairs", "--records", recs, "--variant", "sft", "--interface", interface,
                          "--output", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and not out.exists()
        assert f"{recs}:4: record 'r3': field 'dataset': 'climate-fever' has no answer strings" in err
        assert f"--interface {interface}" in err and "(known: fever, scifact, check-covid)" in err
    with pytest.raises(UserError, match=r"bad.jsonl:4: record 'r3'"):
        run(PairsConfig(records=recs, variant="sft", output=str(tmp_path / "lib"), interface="study"))
    with pytest.raises(UnknownStudyDataset, match="record 'r3'"):
        build_pairs([ClaimRecord.from_dict(r) for r in bad], "sft", interface="codes")
    # the JSON rows need no study strings; a NOT_ENOUGH_INFO record makes no row, so its dataset is not read
    assert real_data(["pairs", "--records", recs, "--variant", "sft", "--output", str(tmp_path / "json")]) == 0
    nei = _records()
    nei[5]["dataset"] = "climate-fever"
    assert real_data(["pairs", "--records", _write(tmp_path / "nei.jsonl", nei), "--variant", "sft",
                      "--interface", "study", "--output", str(tmp_path / "nei")]) == 0


def test_an_unknown_interface_is_one_line(tmp_path, capsys):
    recs = _write(tmp_path / "r.jsonl", _records())
    assert real_data(["pairs", "--records", recs, "--variant", "sft", "--interface", "yaml",
                      "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--interface 'yaml': choose json, codes, labels, study") and len(err.splitlines()) == 1
    with pytest.raises(UserError, match="--interface 'yaml'"):
        run(PairsConfig(records=recs, variant="sft", output=str(tmp_path / "o"), interface="yaml"))
    with pytest.raises(ValueError, match="interface 'yaml'"):
        build_pairs([ClaimRecord.from_dict(r) for r in _records()], "sft", interface="yaml")
    assert not (tmp_path / "o").exists()
