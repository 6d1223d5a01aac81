"""Records files with CR (old Mac), CRLF (Windows) or mixed line endings read
as the same records, with the line numbers an editor shows: byte reading must
keep text mode's universal newlines."""

from __future__ import annotations

import json

import pytest
from helpers import make_record_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep.cli import main as real_data
from data_prep.records import RecordError, load_records


def _records(n: int) -> list[dict]:
    return [make_record_dict(id=f"r{i}", claim=f"Claim {i}\u00e9.") for i in range(n)]


def test_cr_only_file_reads_every_record(tmp_path):
    path = tmp_path / "mac.jsonl"
    path.write_bytes(b"\r".join(json.dumps(r).encode() for r in _records(3)) + b"\r")
    assert [r.id for r in load_records(path)] == ["r0", "r1", "r2"]


def test_cr_only_error_names_the_editor_line(tmp_path):
    lines = [json.dumps(r).encode() for r in _records(3)]
    lines[2] = json.dumps(make_record_dict(id="bad", label="MAYBE")).encode()
    path = tmp_path / "mac.jsonl"
    path.write_bytes(b"\r".join(lines))
    with pytest.raises(RecordError) as info:
        load_records(path)
    assert info.value.line == 3 and info.value.field == "label"


def test_validate_accepts_a_cr_only_file(tmp_path, capsys):
    path = tmp_path / "mac.jsonl"
    path.write_bytes(b"\r".join(json.dumps(r).encode() for r in _records(2)))
    assert real_data(["validate", str(path)]) == 0


@settings(derandomize=True, max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([b"\n", b"\r\n", b"\r", b"\r\r\n", b"\n\r"]), min_size=1, max_size=6))
def test_any_mix_of_line_endings_reads_like_text_mode(tmp_path_factory, endings):
    recs = _records(len(endings))
    data = b"".join(json.dumps(r, ensure_ascii=False).encode() + end for r, end in zip(recs, endings))
    path = tmp_path_factory.mktemp("eol") / "mixed.jsonl"
    path.write_bytes(data)
    with open(path, encoding="utf-8", newline=None) as fh:  # Python's universal newlines
        expected = [(n, json.loads(t)["id"]) for n, t in enumerate(fh.read().split("\n"), 1) if t.strip()]
    got = [(r.id) for r in load_records(path)]
    assert got == [i for _, i in expected]
    # line numbers agree with text mode: break the last record and compare the reported line
    broken = data.replace(b'"label": "SUPPORT"', b'"label": "MAYBE"')
    last_at = broken.rfind(b'"MAYBE"')
    path.write_bytes(broken[:last_at].replace(b'"MAYBE"', b'"SUPPORT"') + broken[last_at:])
    with pytest.raises(RecordError) as info:
        load_records(path)
    assert info.value.line == expected[-1][0]


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r", b""])
def test_a_cut_line_is_reported_at_its_real_column(tmp_path, end):
    """The line end is not part of the JSON: `{"id": "x"` fails at column 11, not "column 1" of a next line."""
    good = json.dumps(make_record_dict()).encode()
    path = tmp_path / "cut.jsonl"
    path.write_bytes(good + b"\n" + b'{"id": "x"' + end)
    with pytest.raises(RecordError) as info:
        load_records(path)
    assert info.value.line == 2
    assert info.value.reason == "invalid JSON (Expecting ',' delimiter at column 11)"
