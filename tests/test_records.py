import json

import pytest
from helpers import make_record_dict

from data_prep.cli import main as real_data
from data_prep.records import (
    ClaimRecord,
    RecordError,
    ValidationReport,
    iter_records,
    load_records,
    save_records,
    validate_file,
)


def write_lines(path, objs):
    with open(path, "w", encoding="utf-8") as fh:
        for o in objs:
            fh.write((o if isinstance(o, str) else json.dumps(o, ensure_ascii=False)) + "\n")
    return path


def test_round_trip_keeps_every_field(tmp_path):
    rec = make_record_dict(enhanced_evidence=[0, 1, 3], annotations={"gpt": [0, 1]}, claim="Ünïcode ✓")
    p = write_lines(tmp_path / "in.jsonl", [rec])
    (loaded,) = load_records(p)
    assert loaded.gold_ids == [0, 3]
    assert loaded.pool_ids == [0, 1, 3]
    assert loaded.extra == {"annotations": {"gpt": [0, 1]}}
    out = tmp_path / "out.jsonl"
    assert save_records([loaded], out) == 1
    assert json.loads(out.read_text(encoding="utf-8")) == rec
    assert "Ünïcode ✓" in out.read_text(encoding="utf-8")  # UTF-8, not \u escapes


def test_integer_ids_are_kept_as_strings(tmp_path):
    p = write_lines(tmp_path / "in.jsonl", [make_record_dict(id=42)])
    assert load_records(p)[0].id == "42"


@pytest.mark.parametrize(
    "overrides, field, reason",
    [
        ({"claim": None}, "claim", "non-empty string"),
        ({"label": "SUPPORTS"}, "label", "unknown label 'SUPPORTS'"),
        ({"sentences": []}, "sentences", "empty pool"),
        ({"evidence": [[7]]}, "evidence[0]", "evidence id 7 is not in the pool"),
        ({"evidence": [[]]}, "evidence[0]", "non-empty list"),
        ({"evidence": []}, "evidence", "needs at least one gold evidence group"),
        (
            {"sentences": [{"id": 0, "text": "a"}, {"id": 0, "text": "b"}], "evidence": [[0]]},
            "sentences[1].id",
            "duplicate sentence id 0",
        ),
        ({"sentences": [{"id": "x", "text": "a"}]}, "sentences[0].id", "must be an integer"),
        ({"enhanced_evidence": [1]}, "enhanced_evidence", "must contain all gold evidence"),
        ({"enhanced_evidence": [0, 3, 9]}, "enhanced_evidence", "id 9 is not in the pool"),
    ],
)
def test_each_validation_error_names_file_line_record_and_field(tmp_path, overrides, field, reason):
    good = make_record_dict(id="ok")
    bad = make_record_dict(id="bad-1", **overrides)
    p = write_lines(tmp_path / "recs.jsonl", [good, bad])
    with pytest.raises(RecordError) as exc_info:
        load_records(p)
    err = exc_info.value
    assert (err.line, err.record_id, err.field) == (2, "bad-1", field)
    msg = str(err)
    assert msg.startswith(f"{p}:2: record 'bad-1': field '{field}': ")
    assert reason in msg


def test_missing_field_and_bad_json(tmp_path):
    rec = make_record_dict()
    del rec["evidence"]
    p = write_lines(tmp_path / "recs.jsonl", [rec])
    with pytest.raises(RecordError, match=r"recs.jsonl:1: record 'r1': field 'evidence': missing required field"):
        load_records(p)
    p2 = write_lines(tmp_path / "broken.jsonl", [make_record_dict(), '{"id": "x", "claim": '])
    with pytest.raises(RecordError, match=r"broken.jsonl:2: invalid JSON"):
        load_records(p2)


def test_nei_records_may_have_no_evidence(tmp_path):
    p = write_lines(tmp_path / "r.jsonl", [make_record_dict(label="NOT_ENOUGH_INFO", evidence=[])])
    assert load_records(p)[0].gold_ids == []


def test_duplicate_record_ids(tmp_path):
    p = write_lines(tmp_path / "r.jsonl", [make_record_dict(), make_record_dict()])
    with pytest.raises(RecordError, match="r.jsonl:2: record 'r1': field 'id': duplicate record id"):
        load_records(p)


def test_keep_going_collects_every_bad_line(tmp_path):
    lines = [
        make_record_dict(id="a"),
        make_record_dict(id="b", label="MAYBE"),
        "not json",
        make_record_dict(id="c"),
        make_record_dict(id="d", evidence=[[5]]),
    ]
    p = write_lines(tmp_path / "r.jsonl", lines)
    report = ValidationReport(path=str(p))
    recs = load_records(p, keep_going=True, report=report)
    assert [r.id for r in recs] == ["a", "c"]
    assert [(e.line, e.field) for e in report.errors] == [(2, "label"), (3, None), (5, "evidence[0]")]
    assert report.n_lines == 5 and report.n_valid == 2 and not report.ok
    assert validate_file(p).to_dict()["invalid"] == 3


def test_validate_cli_keep_going_writes_report(tmp_path, capsys):
    p = write_lines(tmp_path / "r.jsonl", [make_record_dict(id="a"), make_record_dict(id="b", label="X")])
    rep = tmp_path / "report.json"
    assert real_data(["validate", str(p), "--keep-going", "--report", str(rep)]) == 2
    data = json.loads(rep.read_text())
    assert data["invalid"] == 1 and data["errors"][0]["line"] == 2 and data["errors"][0]["field"] == "label"
    assert real_data(["validate", str(p)]) == 2
    err = capsys.readouterr().err
    assert "r.jsonl:2: record 'b': field 'label'" in err and "Traceback" not in err


def test_iter_records_streams(tmp_path):
    p = write_lines(tmp_path / "r.jsonl", [make_record_dict(id=str(i)) for i in range(5)])
    it = iter_records(p)
    assert next(it).id == "0"  # lazily: a generator, not a list
    assert [r.id for r in it] == ["1", "2", "3", "4"]


def test_save_is_atomic_on_failure(tmp_path):
    out = tmp_path / "out.jsonl"
    save_records([ClaimRecord.from_dict(make_record_dict())], out)

    def boom():
        yield ClaimRecord.from_dict(make_record_dict(id="new"))
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        save_records(boom(), out)
    assert [r.id for r in load_records(out)] == ["r1"]  # the old file is intact


# -- encodings, file kinds, lone surrogates (issue #12) -------------------------------

from real_fae_core.jsonl import RecordFileError


def test_non_utf8_line_names_line_and_byte_offset(tmp_path):
    first = (json.dumps(make_record_dict(id="a")) + "\n").encode()
    bad = json.dumps(make_record_dict(id="b", claim="Caf\u00e9"), ensure_ascii=False).encode("latin-1")
    p = tmp_path / "latin.jsonl"
    p.write_bytes(first + bad + b"\n")
    col = bad.index(b"\xe9")
    with pytest.raises(RecordError) as exc_info:
        load_records(p)
    assert str(exc_info.value).startswith(
        f"{p}:2: not valid UTF-8: byte 0xe9 at byte offset {len(first) + col} (column {col + 1})")
    # --keep-going reads on past it
    report = ValidationReport(path=str(p))
    assert [r.id for r in load_records(p, keep_going=True, report=report)] == ["a"]
    assert [e.line for e in report.errors] == [2]


def test_utf8_bom_is_read(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + (json.dumps(make_record_dict()) + "\n").encode())
    assert [r.id for r in load_records(p)] == ["r1"]


@pytest.mark.parametrize("kind, data, fragment", [
    ("gzip", lambda text: __import__("gzip").compress(text.encode()), "gzip-compressed: decompress it first"),
    ("utf16", lambda text: text.encode("utf-16"), "UTF-16 encoded"),
    ("utf16-no-bom", lambda text: text.encode("utf-16-le"), "NUL byte"),
])
def test_compressed_or_utf16_files_are_one_clear_error(tmp_path, kind, data, fragment):
    p = tmp_path / f"{kind}.jsonl"
    p.write_bytes(data(json.dumps(make_record_dict()) + "\n"))
    with pytest.raises(RecordError, match=fragment) as exc_info:
        load_records(p)
    assert str(exc_info.value).startswith(f"{p}:1: ")
    report = ValidationReport(path=str(p))
    if isinstance(exc_info.value, RecordFileError):  # the whole file: fatal even with --keep-going
        with pytest.raises(RecordFileError):
            load_records(p, keep_going=True, report=report)
    else:  # a bad line: --keep-going collects it
        assert load_records(p, keep_going=True, report=report) == [] and report.errors[0].line == 1


def test_a_directory_is_not_a_records_file(tmp_path):
    with pytest.raises(RecordFileError, match="is a directory, not a records file"):
        load_records(tmp_path)
    with pytest.raises(RecordFileError):
        validate_file(tmp_path)


@pytest.mark.parametrize("overrides, field", [
    ({"claim": "bad \ud800"}, "claim"),
    ({"sentences": [{"id": 0, "text": "x \udfff"}], "evidence": [[0]]}, "sentences[0].text"),
    ({"annotations": {"gpt": ["\ud83d"]}}, "annotations.gpt[0]"),
    ({"id": "id-\ud800"}, "id"),
])
def test_lone_surrogates_are_rejected_at_load(tmp_path, overrides, field):
    p = write_lines(tmp_path / "s.jsonl", [json.dumps(make_record_dict(**overrides))])  # "\udxxx" escapes
    with pytest.raises(RecordError) as exc_info:
        load_records(p)
    err = exc_info.value
    assert (err.line, err.field) == (1, field) and "lone UTF-16 surrogate" in err.reason
    # the error itself can be printed and saved as UTF-8
    json.dumps(err.to_dict(), ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("line, reason", [
    ('{"id": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"id": ' + "9" * 5000 + "}", "invalid JSON"),
    (json.dumps(make_record_dict(sentences=[{"id": 2**63, "text": "t"}], evidence=[[2**63]])), "2**63-1"),
])
def test_lines_python_cannot_hold_are_record_errors(tmp_path, line, reason):
    p = write_lines(tmp_path / "r.jsonl", [line])
    with pytest.raises(RecordError, match=r"r.jsonl:1: ") as exc_info:
        load_records(p)
    assert reason in str(exc_info.value)


def test_validate_report_implies_keep_going_and_leaves_no_temp(tmp_path, capsys):
    p = write_lines(tmp_path / "r.jsonl", [make_record_dict(id="a"), make_record_dict(id="b", label="X")])
    rep = tmp_path / "report.json"
    assert real_data(["validate", str(p), "--report", str(rep)]) == 2
    assert json.loads(rep.read_text())["invalid"] == 1
    assert sorted(x.name for x in tmp_path.iterdir()) == ["r.jsonl", "report.json"]
    err = capsys.readouterr().err
    assert err.strip() == f"real-data validate: error: {p}: 1 invalid of 2 records (report: {rep})"


def test_failed_save_leaves_no_temporary(tmp_path):
    def boom():
        yield ClaimRecord.from_dict(make_record_dict(id="new"))
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        save_records(boom(), tmp_path / "out.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_json_array_or_pretty_printed_files_get_a_hint(tmp_path):
    arr = tmp_path / "array.json"
    arr.write_text(json.dumps([make_record_dict()]), encoding="utf-8")
    with pytest.raises(RecordError, match=r"array.json:1: expected a JSON object, got list \(records files are JSON lines"):
        load_records(arr)
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(make_record_dict(), indent=2), encoding="utf-8")
    with pytest.raises(RecordError, match=r"pretty.json:1: invalid JSON .*\(pretty-printed JSON\?"):
        load_records(pretty)
