"""Property-based tests: hostile records and answers give a value or a clear error, never a crash.

* records: arbitrary bytes / JSON lines -> records (which every writer can
  save and reload unchanged) or a RecordError naming the file and line;
* verifier answers (``parse_answer``) and annotator answers
  (``parse_annotation``): arbitrary text -> a valid parse that obeys the pool,
  or an invalid result with an error string.

Seeds are fixed (``derandomize=True``) and examples bounded so the file runs in
a few seconds.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

from helpers import make_record_dict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from real_fae_core.jsonl import RecordFileError
from data_prep.enhance.prompt import parse_annotation
from data_prep.prompts import format_answer, parse_answer
from data_prep.records import (
    LABELS,
    MAX_SENTENCE_ID,
    RecordError,
    load_records,
    save_records,
)

SETTINGS = settings(derandomize=True, max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
POOL = [0, 1, 3]
_DIR = Path(tempfile.mkdtemp(prefix="props-"))

# -- strategies --------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["\ud800", "ſupport", "٣", "line ３", "SUPPORT", "refute", "line3", "3", "0"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
record_fields = st.sampled_from(["id", "claim", "label", "sentences", "evidence", "enhanced_evidence",
                                 "dataset", "extra"])


@st.composite
def mutated_records(draw) -> dict:
    """A valid record with some fields (or sentence parts) replaced by arbitrary JSON."""
    rec = make_record_dict(id=draw(st.text(min_size=1, max_size=6)))
    for _ in range(draw(st.integers(0, 3))):
        fld = draw(record_fields)
        if fld == "sentences" and draw(st.booleans()):
            k = draw(st.integers(0, 2))
            part = draw(st.sampled_from(["id", "text", "doc"]))
            rec["sentences"][k] = {**rec["sentences"][k], part: draw(json_values)}
        else:
            rec[fld] = draw(json_values)
    return rec


def _line(obj) -> bytes:
    # ensure_ascii keeps lone surrogates as "\ud800" escapes, as a JSON producer would.
    return json.dumps(obj, ensure_ascii=True, allow_nan=True).encode("utf-8")


record_lines = st.one_of(
    mutated_records().map(_line),
    json_values.map(_line),
    st.binary(max_size=60),
    st.sampled_from([b"\xef\xbb\xbf", b"\x1f\x8b\x08", b"\xff\xfe{", b"[" * 5000, b'{"id": ' + b"9" * 5000 + b"}"]),
)


# -- records -------------------------------------------------------------------

@SETTINGS
@given(lines=st.lists(record_lines, min_size=1, max_size=4), keep_going=st.booleans())
def test_any_records_file_loads_or_names_the_line(lines, keep_going):
    path = _DIR / "records.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    try:
        records = load_records(path, keep_going=keep_going)
    except RecordFileError as err:  # a whole-file problem: compressed, UTF-16
        assert err.path == str(path) and err.reason
        return
    except RecordError as err:
        assert not keep_going
        assert err.path == str(path) and isinstance(err.line, int) and 1 <= err.line <= len(lines)
        assert str(err).startswith(f"{path}:{err.line}: ")
        return
    # whatever loaded can be written and read back unchanged (no lone surrogates, int64 ids)
    out = _DIR / "saved.jsonl"
    assert save_records(records, out) == len(records)
    assert [r.to_dict() for r in load_records(out)] == [r.to_dict() for r in records]
    for rec in records:
        assert rec.label in LABELS and all(0 <= i <= MAX_SENTENCE_ID for i in rec.pool_ids)


# -- verifier answers ---------------------------------------------------------------

answer_dicts = st.fixed_dictionaries(
    {},
    optional={"label": st.one_of(st.sampled_from(list(LABELS) + ["support", " REFUTE ", "ſupport", "SUPPORTS"]),
                                 json_values),
              "evidence": st.one_of(st.lists(st.one_of(st.integers(-5, 10), st.sampled_from(
                  ["line1", "3", "٣", "line ３", "1" * 30, "line" + "9" * 5000, 2**64])), max_size=4), json_values)},
)


@st.composite
def answer_texts(draw) -> str:
    """Prose, fences, one or two JSON answers, a key given twice, deep nesting, huge numbers."""
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["text", "json", "dup", "deep", "bignum"]))
        if kind == "text":
            parts.append(draw(st.text(max_size=30)))
        elif kind == "json":
            parts.append(json.dumps(draw(answer_dicts), ensure_ascii=draw(st.booleans())))
        elif kind == "dup":
            a, b = draw(st.sampled_from(LABELS)), draw(st.sampled_from(LABELS))
            parts.append(f'{{"label": "{a}", "label": "{b}", "evidence": [0]}}')
        elif kind == "deep":
            n = draw(st.sampled_from([10, 5000, 100_000]))
            parts.append('{"label": "SUPPORT", "evidence": ' + "[" * n + "]" * n + "}")
        else:
            parts.append('{"label": "SUPPORT", "evidence": [' + "7" * draw(st.sampled_from([20, 5000])) + "]}")
    return draw(st.sampled_from(["", "```json\n"])) + " ".join(parts)


def _check_verifier(text: str) -> None:
    p = parse_answer(text, POOL)
    if p.valid:
        assert p.label in LABELS and p.error is None
        assert set(p.cited) <= set(POOL) and not set(p.hallucinated) & set(POOL)
        assert all(isinstance(i, int) and abs(i) <= MAX_SENTENCE_ID for i in p.cited + p.hallucinated)
        # never guessed: the label is spelled in ASCII in the text, one key "label" per object
        assert p.label.lower() in text.lower()
        json.dumps(p.to_dict())  # storable
    else:
        assert p.label is None and isinstance(p.error, str) and p.error
        assert len(p.error) < 400


@SETTINGS
@given(text=answer_texts())
def test_any_verifier_answer_parses_or_is_invalid(text):
    _check_verifier(text)


@SETTINGS
@given(text=st.text(alphabet=st.sampled_from(list(string.printable) + ["ſ", "٣", "３", "\ud800", "{", "}"]),
                    max_size=80))
def test_any_text_is_a_verifier_answer_or_invalid(text):
    _check_verifier(text)


@SETTINGS
@given(label=st.sampled_from(LABELS), ids=st.lists(st.integers(0, 50), max_size=5))
def test_training_targets_always_parse_back(label, ids):
    p = parse_answer(format_answer(label, ids), list(range(0, 50, 2)))
    assert p.valid and p.label == label
    assert sorted(p.cited + p.hallucinated) == sorted(set(ids))


# -- annotator answers -------------------------------------------------------------

@SETTINGS
@given(text=answer_texts())
def test_any_annotator_answer_parses_or_is_invalid(text):
    a = parse_annotation(text, POOL)
    if a.valid:
        assert a.error is None and set(a.ids) <= set(POOL) and not set(a.invented) & set(POOL)
        assert all(abs(i) <= MAX_SENTENCE_ID for i in a.invented)
    else:
        assert a.ids == [] and isinstance(a.error, str) and a.error and len(a.error) < 400
