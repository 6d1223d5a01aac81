"""REAL training pairs (SPEC §4): counts, targets, ablated pools, CLI and stats."""

from __future__ import annotations

import json
import os

import pytest
from helpers import make_record_dict

from data_prep.cli import main as real_data
from data_prep.pairs.build import (
    VARIANTS,
    MissingEnhancedEvidence,
    build_pairs,
    drop_over_length,
    percentiles,
    token_lengths,
)
from data_prep.prompts import format_answer, parse_answer, render_evidence_prompt
from data_prep.records import ClaimRecord

os.environ.setdefault("HF_HUB_OFFLINE", "1")

POOL = [
    {"id": 0, "text": "The sky appears blue by day.", "doc": "Sky"},
    {"id": 1, "text": "Grass is green.", "doc": "Grass"},
    {"id": 3, "text": "Rayleigh scattering colours the sky.", "doc": "Sky"},
    {"id": 7, "text": "Clouds are white.", "doc": "Sky"},
]


def _records() -> list[dict]:
    """Four trainable records, one NEI record, one whose enhanced set is the whole pool."""
    return [
        make_record_dict(id="a", label="SUPPORT", sentences=POOL, evidence=[[0], [3]], enhanced_evidence=[0, 3, 7]),
        make_record_dict(id="b", label="REFUTE", sentences=POOL, evidence=[[1]], enhanced_evidence=[1]),
        make_record_dict(id="c", label="SUPPORT", sentences=POOL, evidence=[[7, 0]], enhanced_evidence=[0, 7]),
        make_record_dict(id="full", label="REFUTE", sentences=POOL[:2], evidence=[[0]], enhanced_evidence=[0, 1]),
        make_record_dict(id="nei", label="NOT_ENOUGH_INFO", sentences=POOL, evidence=[]),
    ]


@pytest.fixture
def records() -> list[ClaimRecord]:
    return [ClaimRecord.from_dict(r) for r in _records()]


def _by(rows, rid, kind):
    found = [r for r in rows if r["record_id"] == rid and r["kind"] == kind]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_counts_and_targets_per_variant(records, variant):
    v = VARIANTS[variant]
    rows, info = build_pairs(records, variant, seed=None)
    by_id = {r.id: r for r in records}
    trainable = [r for r in records if r.label != "NOT_ENOUGH_INFO"]
    positives = [r for r in rows if r["kind"] == "positive"]
    negatives = [r for r in rows if r["kind"] == "negative"]

    assert info["skipped_not_enough_info_records"] == 1
    assert len(positives) == len(trainable)
    # "full": E_train covers the whole pool only for enhanced variants (gold is [0] of [0, 1]).
    empty = 1 if v.enhanced else 0
    assert len(negatives) == ((len(trainable) - empty) if v.negatives else 0)
    assert info["dropped"]["empty_ablated_pool"] == (empty if v.negatives else 0)
    assert all(r["variant"] == variant for r in rows)

    for row in rows:
        rec = by_id[row["record_id"]]
        e_train = rec.enhanced_evidence if v.enhanced else rec.gold_ids
        assert row["prompt"][0]["role"] == "system" and row["prompt"][1]["role"] == "user"
        assert [m["role"] for m in row["completion"]] == ["assistant"]
        answer = row["completion"][0]["content"]
        if row["kind"] == "positive":
            assert row["pool_ids"] == rec.pool_ids
            assert answer == format_answer(rec.label, sorted(e_train))
        elif row["kind"] in ("matched_positive", "evidence_positive", "sufficient_positive"):
            # *_matched and *_sufficient variants (tests/test_pairs_shortcut.py, tests/test_pairs_sufficiency.py)
            assert v.matched and set(rec.pool_ids) - set(row["pool_ids"]) == set(row["removed_ids"])
            assert not set(row["removed_ids"]) & (set(e_train) | set(rec.gold_ids))
            assert answer == format_answer(rec.label, sorted(e_train))
        elif row["kind"] == "short_negative":
            assert v.sufficient and set(rec.pool_ids) - set(row["pool_ids"]) == set(row["removed_ids"])
            assert not set(row["pool_ids"]) & (set(e_train) | set(rec.gold_ids)) and row["pool_ids"]
            assert answer == format_answer("NOT_ENOUGH_INFO", [])
        else:
            # ablated pool: E_train removed, survivors keep their ids and order
            assert row["pool_ids"] == [i for i in rec.pool_ids if i not in set(e_train)]
            assert not set(row["pool_ids"]) & set(e_train)
            assert answer == format_answer("NOT_ENOUGH_INFO", [])
            for i in e_train:
                assert f"line{i}:" not in row["prompt"][1]["content"]
        assert row["prompt"] == render_evidence_prompt(rec, row["pool_ids"])
        parsed = parse_answer(answer, row["pool_ids"])
        assert parsed.valid and parsed.label == row["label"] and parsed.hallucinated == []


def test_enhanced_and_gold_targets_differ(records):
    sft, _ = build_pairs(records, "sft", seed=None)
    real, _ = build_pairs(records, "real", seed=None)
    assert json.loads(_by(sft, "a", "positive")["completion"][0]["content"])["evidence"] == [0, 3]
    assert json.loads(_by(real, "a", "positive")["completion"][0]["content"])["evidence"] == [0, 3, 7]
    # no_enhancement ablates only the gold union; real also removes the enhanced sentence 7
    noenh, _ = build_pairs(records, "no_enhancement", seed=None)
    assert _by(noenh, "a", "negative")["pool_ids"] == [1, 7]
    assert _by(real, "a", "negative")["pool_ids"] == [1]


@pytest.mark.parametrize("variant", ["no_ablation", "real"])
def test_enhanced_variants_need_enhanced_evidence(variant):
    recs = [ClaimRecord.from_dict(make_record_dict(id=f"r{i}")) for i in range(3)]
    with pytest.raises(MissingEnhancedEvidence, match=r"record 'r0': field 'enhanced_evidence': missing.*3 of 3 SUPPORT/REFUTE records have no 'enhanced_evidence'"):
        build_pairs(recs, variant)
    for ok in ("sft", "no_enhancement"):
        assert build_pairs(recs, ok)[0]


def test_shuffle_is_deterministic(records):
    a, _ = build_pairs(records, "real", seed=7)
    b, _ = build_pairs(records, "real", seed=7)
    c, _ = build_pairs(records, "real", seed=None)
    assert a == b
    assert sorted(map(json.dumps, a)) == sorted(map(json.dumps, c))
    orders = {tuple((r["record_id"], r["kind"]) for r in build_pairs(records, "real", seed=s)[0]) for s in range(6)}
    assert len(orders) > 1


def test_percentiles_nearest_rank():
    vals = list(range(1, 101))
    p = percentiles(vals)
    assert (p["p50"], p["p90"], p["p99"], p["p100"]) == (50, 90, 99, 100)
    assert percentiles([]) == {}


def test_token_lengths_match_trl_tokenization_and_drop(records, tiny_qwen):
    from transformers import AutoTokenizer
    from trl.data_utils import _tokenize

    tok = AutoTokenizer.from_pretrained(tiny_qwen)
    rows, _ = build_pairs(records, "real", seed=None)
    lengths = token_lengths(rows, tok, batch_size=2)
    for row, n in zip(rows, lengths):
        assert n == len(_tokenize(tok, row["prompt"] + row["completion"])["input_ids"])
    cut = sorted(lengths)[len(lengths) // 2]
    kept, dropped = drop_over_length(rows, lengths, cut)
    assert dropped == sum(n > cut for n in lengths) > 0
    assert all(r["n_tokens"] <= cut for r in kept) and len(kept) + dropped == len(rows)


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_cli_writes_dataset_jsonl_and_stats(tmp_path, tiny_llama, capsys):
    from datasets import load_dataset, load_from_disk

    recs = _write(tmp_path / "train.jsonl", _records())
    out = tmp_path / "pairs"
    rc = real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(out),
                    "--tokenizer", str(tiny_llama), "--max-length", "4096", "--seed", "3"])
    assert rc == 0
    ds = load_from_disk(str(out))["train"]
    js = load_dataset("json", data_files=str(out / "pairs.jsonl"))["train"]
    assert len(ds) == len(js) == 7  # 4 positives + 3 negatives ("full" dropped)
    assert ds["record_id"] == js["record_id"]
    assert ds[0]["prompt"] == js[0]["prompt"] and ds[0]["completion"] == js[0]["completion"]
    assert {"prompt", "completion", "record_id", "kind", "variant", "n_tokens"} <= set(ds.column_names)

    stats = json.loads((out / "stats.json").read_text())
    assert stats["pairs"] == 7 and stats["by_kind"] == {"positive": 4, "negative": 3}
    assert stats["by_kind_and_label"]["negative"] == {"NOT_ENOUGH_INFO": 3}
    assert stats["by_kind_and_label"]["positive"] == {"SUPPORT": 2, "REFUTE": 2}
    assert stats["dropped"] == {"empty_ablated_pool": 1, "over_max_length": 0}
    assert stats["length_tokens"]["p100"] == max(ds["n_tokens"])

    # a tight --max-length drops the longest pairs and counts them
    out2 = tmp_path / "pairs-short"
    cut = sorted(ds["n_tokens"])[3]
    assert real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(out2),
                      "--tokenizer", str(tiny_llama), "--max-length", str(cut)]) == 0
    stats2 = json.loads((out2 / "stats.json").read_text())
    assert stats2["dropped"]["over_max_length"] == sum(n > cut for n in ds["n_tokens"]) > 0
    assert stats2["pairs"] + stats2["dropped"]["over_max_length"] == 7

    # same seed and input: byte-identical JSONL
    out3 = tmp_path / "pairs-again"
    real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(out3),
               "--tokenizer", str(tiny_llama), "--seed", "3"])
    assert (out3 / "pairs.jsonl").read_bytes() == (out / "pairs.jsonl").read_bytes()

    # refuses to overwrite
    capsys.readouterr()
    assert real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_cli_missing_enhanced_evidence_is_one_clear_sentence(tmp_path, capsys):
    recs = _write(tmp_path / "gold-only.jsonl", [make_record_dict(id="x1"), make_record_dict(id="x2")])
    rc = real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{recs}:1: record 'x1': field 'enhanced_evidence': missing" in err and "2 of 2" in err
    assert not (tmp_path / "o").exists()


def test_cli_names_the_first_record_lacking_enhanced_evidence(tmp_path, capsys):
    """Not the file's first record: the first one without enhanced_evidence, with its line."""
    recs = _write(tmp_path / "mixed.jsonl", [
        make_record_dict(id="has", enhanced_evidence=[0, 3]),
        make_record_dict(id="nei", label="NOT_ENOUGH_INFO", evidence=[]),  # needs none
        make_record_dict(id="lacks-1"),
        make_record_dict(id="lacks-2"),
    ])
    assert real_data(["pairs", "--records", str(recs), "--variant", "no_ablation",
                      "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{recs}:3: record 'lacks-1': field 'enhanced_evidence'" in err and "2 of 3" in err


def test_cli_bad_record_names_file_and_line(tmp_path, capsys):
    bad = make_record_dict(id="b2", label="MAYBE")
    recs = _write(tmp_path / "bad.jsonl", [make_record_dict(id="b1"), bad])
    assert real_data(["pairs", "--records", str(recs), "--variant", "sft", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:2" in err and "label" in err


@pytest.mark.slow
def test_full_disk_keeps_the_previous_dataset_whole(tmp_path):
    """--overwrite on a full disk: the old dataset stays, nothing partial appears beside it."""
    import resource
    import signal
    import subprocess
    import sys

    from helpers import REPO
    from datasets import load_from_disk

    recs = _write(tmp_path / "train.jsonl", [make_record_dict(id=f"r{i}") for i in range(300)])
    out = tmp_path / "pairs"
    assert real_data(["pairs", "--records", str(recs), "--variant", "sft", "--output", str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def full_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))

    proc = subprocess.run(
        [sys.executable, "-m", "data_prep.cli", "pairs", "--records", str(recs), "--variant", "no_enhancement",
         "--output", str(out), "--overwrite"],
        preexec_fn=full_disk, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"real-data pairs: error: {out}: File too large"
    assert "Traceback" not in proc.stderr
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs", "train.jsonl"]  # no temp dirs
    assert len(load_from_disk(str(out))["train"]) == 300


def test_overwrite_replaces_only_when_complete(tmp_path):
    from datasets import load_from_disk

    recs = _write(tmp_path / "train.jsonl", _records())
    out = tmp_path / "pairs"
    out.mkdir()  # an empty directory is fine without --overwrite
    assert real_data(["pairs", "--records", str(recs), "--variant", "sft", "--output", str(out)]) == 0
    assert real_data(["pairs", "--records", str(recs), "--variant", "real", "--output", str(out),
                      "--overwrite"]) == 0
    assert set(load_from_disk(str(out))["train"]["variant"]) == {"real"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs", "train.jsonl"]
