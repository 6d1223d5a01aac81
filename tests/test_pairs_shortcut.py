"""The hole/size shortcut of REAL pairs (SPEC §3 `--line-ids`, SPEC §4 matched positives).

Plain pairs show the full pool on every positive and a smaller pool, numbered with a hole where
``E_train`` was, on every negative: "a line is missing" alone predicts NOT_ENOUGH_INFO. A matched
positive loses as many lines from outside ``E_train`` ∪ ``E*`` and keeps the positive's target;
``--line-ids renumbered`` shows lines 0..n-1 so that no prompt has a hole.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from helpers import make_record_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.cli import main as real_data
from data_prep.pairs.build import build_pairs, train_evidence
from data_prep.pairs.runner import PairsConfig, run
from data_prep.prompts import one_line, render_evidence_prompt
from data_prep.records import ClaimRecord
from real_fae_core.errors import UserError

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MATCHED = ("real_matched", "no_enhancement_matched")
_LINE = re.compile(r"^line(\d+): (.*)$")


def _record(rid: str, label: str, ids: list[int], gold: list[list[int]], enhanced: list[int]) -> ClaimRecord:
    return ClaimRecord.from_dict(make_record_dict(
        id=rid, label=label, dataset="t", claim=f"claim {rid}",
        sentences=[{"id": i, "text": f"sentence {i} of {rid}"} for i in ids],
        evidence=gold, enhanced_evidence=enhanced))


def _records() -> list[ClaimRecord]:
    """Sparse, unsorted ids; enhanced evidence larger than gold; one record with too few other lines."""
    return [
        _record("a", "SUPPORT", [0, 2, 3, 5, 8, 9], [[2], [5]], [2, 5, 8]),
        _record("b", "REFUTE", [7, 1, 4, 10], [[4]], [4]),
        _record("c", "SUPPORT", [0, 1, 2, 3, 4, 5, 6], [[1, 3]], [1, 3]),
        _record("tight", "REFUTE", [0, 1, 2, 3], [[0]], [0, 1, 2]),  # 3 removed, only 1 other line
        _record("nei", "NOT_ENOUGH_INFO", [0, 1, 2], [], None),
    ]


def _by_kind(rows: list[dict]) -> dict[tuple[str, str], dict]:
    out = {}
    for r in rows:
        assert (r["record_id"], r["kind"]) not in out
        out[r["record_id"], r["kind"]] = r
    return out


def _shown(row: dict) -> list[tuple[int, str]]:
    """(number, text) of each line the row's prompt shows, in order."""
    document = row["prompt"][1]["content"].split("\nDocument:\n", 1)[1]
    lines = [_LINE.match(line) for line in document.split("\n")]
    assert all(lines), document
    return [(int(m.group(1)), m.group(2)) for m in lines]


def _check_matched(records: list[ClaimRecord], variant: str, rows: list[dict], info: dict,
                   line_ids: str = "original") -> dict[str, list[int]]:
    """SPEC §4's matched positive, for every record with a negative; returns its removed ids per record."""
    by_id = {r.id: r for r in records}
    got = _by_kind(rows)
    removed_by_record = {}
    too_few = 0
    for (rid, kind), neg in got.items():
        if kind != "negative":
            continue
        rec = by_id[rid]
        e_train = train_evidence(rec, variant)
        keep = set(e_train) | set(rec.gold_ids)
        k = len(rec.pool_ids) - len(neg["pool_ids"])
        pos, matched = got[rid, "positive"], got.get((rid, "matched_positive"))
        if matched is None:
            too_few += 1
            assert len([i for i in rec.pool_ids if i not in keep]) < k, rid
            continue
        # the negative's pool size, a hole of the same size, none of E_train ∪ E* removed
        assert len(matched["pool_ids"]) == len(neg["pool_ids"]) == len(rec.pool_ids) - k
        assert len(matched["removed_ids"]) == k
        assert set(matched["removed_ids"]) == set(rec.pool_ids) - set(matched["pool_ids"])
        assert not set(matched["removed_ids"]) & keep
        assert matched["pool_ids"] == [i for i in rec.pool_ids if i not in set(matched["removed_ids"])]
        # the positive's target
        assert (matched["label"], matched["evidence"]) == (pos["label"], pos["evidence"]) == (rec.label, e_train)
        if line_ids == "original":
            assert matched["completion"] == pos["completion"]
        assert matched["prompt"] == render_evidence_prompt(rec, matched["pool_ids"], line_ids)
        removed_by_record[rid] = matched["removed_ids"]
    assert info["dropped"]["too_few_matched_lines"] == too_few
    assert all(r["removed_ids"] == [] for r in rows if r["kind"] != "matched_positive")
    return removed_by_record


# ---------------------------------------------------------------------------
# (a) matched positives on hand-made records
# ---------------------------------------------------------------------------

def test_real_matched_positive_has_the_negatives_size_and_the_positives_target():
    records = _records()
    rows, info = build_pairs(records, "real_matched", seed=5)
    got = _by_kind(rows)
    assert {k for (_, k) in got} == {"positive", "negative", "matched_positive"}
    assert [rid for (rid, k) in got if k == "matched_positive"] and ("tight", "matched_positive") not in got
    removed = _check_matched(records, "real_matched", rows, info)
    assert set(removed) == {"a", "b", "c"} and info["dropped"]["too_few_matched_lines"] == 1
    # e.g. "a": the negative drops 2, 5, 8; the matched positive drops three of 0, 3, 9 instead
    assert len(removed["a"]) == 3 and set(removed["a"]) <= {0, 3, 9}
    assert json.loads(got["a", "matched_positive"]["completion"][0]["content"]) == {"label": "SUPPORT",
                                                                                   "evidence": [2, 5, 8]}
    # the gold variant removes only E*, so "tight" (gold [0] of 4 lines) gets one here
    rows, info = build_pairs(records, "no_enhancement_matched", seed=5)
    assert set(_check_matched(records, "no_enhancement_matched", rows, info)) == {"a", "b", "c", "tight"}


@pytest.mark.parametrize("variant", MATCHED)
def test_matched_rows_stay_together_and_the_rest_is_the_base_variant(variant):
    records = _records()
    base = variant.removesuffix("_matched")
    plain, plain_info = build_pairs(records, base, seed=None)
    rows, info = build_pairs(records, variant, seed=None)
    strip = lambda r: {k: v for k, v in r.items() if k not in ("variant", "removed_ids")}  # noqa: E731
    assert [strip(r) for r in rows if r["kind"] != "matched_positive"] == [strip(r) for r in plain]
    assert info["dropped"]["empty_ablated_pool"] == plain_info["dropped"]["empty_ablated_pool"]
    grouped, _ = build_pairs(records, variant, seed=3, keep_pairs_together=True)
    for k, row in enumerate(grouped):
        if row["kind"] == "matched_positive":  # right after its record's negative
            assert grouped[k - 1]["record_id"] == row["record_id"] and grouped[k - 1]["kind"] == "negative"


# ---------------------------------------------------------------------------
# (b) the same on random pools, and a draw that depends on the record alone
# ---------------------------------------------------------------------------

@st.composite
def _random_records(draw):
    records = []
    for n in range(draw(st.integers(1, 12))):
        ids = draw(st.lists(st.integers(0, 40), min_size=1, max_size=12, unique=True))  # reading order, sparse
        label = draw(st.sampled_from(["SUPPORT", "REFUTE", "NOT_ENOUGH_INFO"]))
        if label == "NOT_ENOUGH_INFO":
            records.append(_record(f"r{n}", label, ids, [], None))
            continue
        gold = draw(st.lists(st.lists(st.sampled_from(ids), min_size=1, max_size=3, unique=True),
                             min_size=1, max_size=2))
        extra = draw(st.lists(st.sampled_from(ids), max_size=4))
        records.append(_record(f"r{n}", label, ids, gold, sorted({i for g in gold for i in g} | set(extra))))
    return records


@settings(max_examples=80, deadline=None)
@given(_random_records(), st.sampled_from(MATCHED), st.sampled_from(["original", "renumbered"]),
       st.one_of(st.none(), st.integers(0, 10**6)), st.randoms(use_true_random=False))
def test_matched_positives_hold_on_random_pools_whatever_the_record_order(records, variant, line_ids, seed, rnd):
    rows, info = build_pairs(records, variant, seed=seed, line_ids=line_ids)
    removed = _check_matched(records, variant, rows, info, line_ids)
    # the draw depends on the seed and the record only: not on file order, shuffling or the other records
    shuffled = list(records)
    rnd.shuffle(shuffled)
    for keep_together in (False, True):
        again, _ = build_pairs(shuffled, variant, seed=seed, line_ids=line_ids, keep_pairs_together=keep_together)
        assert _check_matched(records, variant, again, info, line_ids) == removed
    for rid, ids in removed.items():
        alone, _ = build_pairs([r for r in records if r.id == rid], variant, seed=seed, line_ids=line_ids)
        assert _by_kind(alone)[rid, "matched_positive"]["removed_ids"] == ids


# ---------------------------------------------------------------------------
# (c) --line-ids renumbered: no hole, targets in the numbers shown
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["sft", "real", "no_enhancement", *MATCHED])
def test_renumbered_prompts_have_no_hole_and_targets_cite_the_same_sentences(variant):
    records = _records()
    by_id = {r.id: r for r in records}
    rows, _ = build_pairs(records, variant, seed=None, line_ids="renumbered")
    assert rows and {r["line_ids"] for r in rows} == {"renumbered"}
    holes_avoided = 0
    for row in rows:
        rec = by_id[row["record_id"]]
        text = {s.id: one_line(s.text) for s in rec.sentences}
        shown = _shown(row)
        assert [n for n, _ in shown] == list(range(len(row["pool_ids"])))  # line0..line(n-1)
        assert [t for _, t in shown] == [text[i] for i in row["pool_ids"]]  # in reading order
        answer = json.loads(row["completion"][0]["content"])
        assert answer["label"] == row["label"]
        cited = {n: t for n, t in shown}
        # the numbers the completion cites show the sentences of the record-id evidence
        assert sorted(cited[n] for n in answer["evidence"]) == sorted(text[i] for i in row["evidence"])
        holes_avoided += row["pool_ids"] != list(range(len(row["pool_ids"])))
    assert holes_avoided  # the records' ids are sparse: original numbering would show holes


@pytest.mark.parametrize("variant", ["sft", "no_ablation", "no_enhancement", "real", *MATCHED])
def test_original_is_the_default_and_unchanged(variant):
    records = _records()
    default, info = build_pairs(records, variant, seed=4)
    assert build_pairs(records, variant, seed=4, line_ids="original") == (default, info)
    by_id = {r.id: r for r in records}
    for row in default:
        rec = by_id[row["record_id"]]
        assert "line_ids" not in row  # a pair file without the column is `original`, as older files are
        assert [n for n, _ in _shown(row)] == row["pool_ids"]  # record ids, holes included
        assert row["prompt"] == render_evidence_prompt(rec, row["pool_ids"])
        assert json.loads(row["completion"][0]["content"])["evidence"] == row["evidence"]


def test_build_pairs_refuses_an_unknown_numbering():
    with pytest.raises(ValueError, match="line_ids 'bogus': choose original or renumbered"):
        build_pairs(_records(), "real", line_ids="bogus")


# ---------------------------------------------------------------------------
# (d) the command
# ---------------------------------------------------------------------------

def _write(path, records: list[ClaimRecord]):
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    return path


def test_cli_unknown_line_ids_is_one_line_and_writes_nothing(tmp_path, capsys):
    recs = _write(tmp_path / "train.jsonl", _records())
    out = tmp_path / "o"
    assert real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(out),
                      "--line-ids", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and "bogus" in err
    assert not out.exists()
    # a Python caller takes the same checks
    with pytest.raises(UserError, match="'bogus': choose original or renumbered"):
        run(PairsConfig(records=str(recs), variant="real", output=str(out), line_ids="bogus"))
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]


@pytest.mark.parametrize("line_ids", ["original", "renumbered"])
def test_cli_matched_variant_records_line_ids_and_matched_count(tmp_path, line_ids):
    from datasets import load_dataset, load_from_disk

    records = _records()
    recs = _write(tmp_path / "train.jsonl", records)
    out = tmp_path / "pairs"
    assert real_data(["pairs", "--records", str(recs), "--variant", "real_matched", "--output", str(out),
                      "--line-ids", line_ids, "--seed", "9"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    assert stats["line_ids"] == line_ids and stats["variant"] == "real_matched"
    assert stats["by_kind"] == {"positive": 4, "negative": 4, "matched_positive": 3}
    assert stats["dropped"] == {"empty_ablated_pool": 0, "too_few_matched_lines": 1}
    rows = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    _check_matched(records, "real_matched", rows, {"dropped": stats["dropped"]}, line_ids)
    # one set of columns for every row, in both forms real-train reads
    ds = load_from_disk(str(out))["train"]
    js = load_dataset("json", data_files=str(out / "pairs.jsonl"))["train"]
    assert set(ds.column_names) == set(js.column_names) == set(rows[0])
    assert "removed_ids" in ds.column_names and ("line_ids" in ds.column_names) == (line_ids == "renumbered")
    assert ds["removed_ids"] == [r["removed_ids"] for r in rows] and set(ds["variant"]) == {"real_matched"}
    # the stats of a plain variant name the numbering too
    plain = tmp_path / "plain"
    assert run(PairsConfig(records=str(recs), variant="real", output=str(plain), line_ids=line_ids)).ok
    assert json.loads((plain / "stats.json").read_text())["line_ids"] == line_ids


def test_the_draw_follows_the_seed():
    """Another --seed draws other lines (somewhere among many records), the same seed the same ones."""
    records = [_record(f"s{i}", "SUPPORT", list(range(12)), [[0]], [0, 1]) for i in range(20)]
    draws = {s: {r["record_id"]: r["removed_ids"] for r in build_pairs(records, "real_matched", seed=s)[0]
                 if r["kind"] == "matched_positive"} for s in (1, 2)}
    assert draws[1] != draws[2]
    again = {r["record_id"]: r["removed_ids"] for r in build_pairs(records, "real_matched", seed=1)[0]
             if r["kind"] == "matched_positive"}
    assert again == draws[1]
    assert len({tuple(v) for v in draws[1].values()}) > 1  # records do not share one draw
