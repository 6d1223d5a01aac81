"""Prompts and the answer format (SPEC §3), shared by training and evaluation.

Training targets are produced by :func:`format_answer` and evaluation reads
answers with :func:`parse_answer`, so the two can never drift apart.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from real_fae_core.jsonl import short_repr
from data_prep.records import LABELS, MAX_SENTENCE_ID, ClaimRecord

FORMAT_INSTRUCTIONS = (
    "Answer with one JSON object and nothing else: "
    '{"label": LABEL, "evidence": [IDS]}. '
    'LABEL is "SUPPORT", "REFUTE" or "NOT_ENOUGH_INFO". '
    "IDS are the numbers N of the lines (lineN) your label relies on; "
    'use an empty list with "NOT_ENOUGH_INFO".'
)
EVIDENCE_SYSTEM_PROMPT = (
    "Verify the claim strictly against the provided evidence. "
    "If the evidence neither supports nor refutes the claim, answer NOT_ENOUGH_INFO. "
    + FORMAT_INSTRUCTIONS
)
KNOWLEDGE_SYSTEM_PROMPT = "Verify the claim using general knowledge. " + FORMAT_INSTRUCTIONS
# Bump when the prompts or the answer format change: FAE runs record it and refuse to resume across it.
PROMPT_FORMAT_VERSION = 1

Message = dict[str, str]


# How the lines of a pool are numbered in the prompt (SPEC §3, `--line-ids`). ``original`` shows each
# sentence's record id (the paper's protocol): a pool that lost a line shows a hole in its numbering.
# ``renumbered`` numbers the lines shown 0..n-1 in reading order (a full pool numbered 0..n-1 renders the
# same either way) and maps cited numbers back to record ids. A hole is a cue a verifier can learn instead
# of reading its evidence (SPEC §6, control arm), so every run and pair file records the choice.
LINE_IDS = ("original", "renumbered")
DEFAULT_LINE_IDS = "original"


def check_line_ids(value: str, where: str = "--line-ids", error: type[Exception] = ValueError) -> str:
    """``value`` when it is a line numbering of :data:`LINE_IDS`; else ``error`` (a command passes
    ``UserError``) naming the choices."""
    if value not in LINE_IDS:
        raise error(f"{where} {value!r}: choose {' or '.join(LINE_IDS)}")
    return value


@dataclass(frozen=True)
class ShownPool:
    """The lines of one prompt: record ids in reading order and the number shown for each."""

    ids: tuple[int, ...]
    numbers: tuple[int, ...]

    def record_id(self, shown: int) -> int | None:
        """The record id behind a number the prompt showed (None: no line had that number)."""
        try:
            return self.ids[self.numbers.index(shown)]
        except ValueError:
            return None

    def shown_number(self, record_id: int) -> int:
        """The line number the prompt shows for record id ``record_id``; ValueError when the pool lacks it."""
        return self.numbers[self.ids.index(record_id)]


def shown_pool(record: ClaimRecord, pool_ids: Iterable[int] | None = None,
               line_ids: str = DEFAULT_LINE_IDS) -> ShownPool:
    """The pool ``pool_ids`` (default: the full pool) in the record's reading order, numbered by ``line_ids``."""
    check_line_ids(line_ids)
    if pool_ids is None:
        ids = tuple(s.id for s in record.sentences)
    else:
        keep = set(pool_ids)
        unknown = keep - set(record.pool_ids)
        if unknown:
            raise ValueError(
                f"record {record.id!r}: pool ids {sorted(unknown)} are not sentences of the record"
            )
        ids = tuple(s.id for s in record.sentences if s.id in keep)
    return number_lines(ids, line_ids)


def number_lines(pool_ids: Sequence[int], line_ids: str = DEFAULT_LINE_IDS) -> ShownPool:
    """The numbers a prompt shows for ``pool_ids`` (record ids already in the order shown: reading order,
    or a ranked order in the evaluation-choice study)."""
    check_line_ids(line_ids)
    ids = tuple(pool_ids)
    return ShownPool(ids, ids if line_ids == "original" else tuple(range(len(ids))))


def format_pool(record: ClaimRecord, pool_ids: Iterable[int] | None = None,
                line_ids: str = DEFAULT_LINE_IDS) -> str:
    """The ``lineN: text`` block, in the record's reading order, numbered by ``line_ids``."""
    shown = shown_pool(record, pool_ids, line_ids)
    return format_lines(shown, {s.id: s.text for s in record.sentences})


def format_lines(shown: ShownPool, texts: Mapping[int, str]) -> str:
    """The ``lineN: text`` rows of ``shown`` in its order (``texts``: record id -> sentence text).

    The one definition of a prompt's evidence row: :func:`format_pool` shows a record's pool in
    reading order; the evaluation-choice study (SPEC §10) shows a retrieved pool in ranked order.
    """
    return "\n".join(f"line{n}: {one_line(texts[i])}" for i, n in zip(shown.ids, shown.numbers))


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines too) as one space."""
    # A newline inside a sentence would fake a new "lineN:" row.
    return " ".join(text.split())


def render_evidence_prompt(
    record: ClaimRecord, pool_ids: Iterable[int] | None = None, line_ids: str = DEFAULT_LINE_IDS
) -> list[Message]:
    """Evidence-based chat messages for the pool ``pool_ids`` (default: full pool), lines numbered by ``line_ids``."""
    user = f"Claim: {one_line(record.claim)}\nDocument:\n{format_pool(record, pool_ids, line_ids)}"
    return [
        {"role": "system", "content": EVIDENCE_SYSTEM_PROMPT},
        {"role": "user", "content": user.rstrip("\n")},
    ]


def shown_evidence(shown: ShownPool, record_ids: Iterable[int]) -> list[int]:
    """Record ids as the prompt shows them (a training target's evidence under ``renumbered``)."""
    return sorted(shown.shown_number(i) for i in record_ids)


def parse_shown_answer(text: str, shown: ShownPool) -> tuple[ParsedAnswer, list[int]]:
    """(the answer in record ids, the record ids it named in citation order) for the prompt ``shown``.

    Under ``original`` this is :func:`parse_answer` against the pool. Under ``renumbered`` a cited number
    is mapped back to the record id shown with it; a number no line showed is hallucinated and kept as
    written (it names no sentence of the record, so it is left out of the named record ids).
    """
    if shown.numbers == shown.ids:
        parsed = parse_answer(text, shown.ids)
        return parsed, (parse_answer(text, ()).hallucinated if parsed.valid else [])
    parsed = parse_answer(text, shown.numbers)
    if not parsed.valid:
        return parsed, []
    parsed.cited = [shown.record_id(n) for n in parsed.cited]
    named = [shown.record_id(n) for n in parse_answer(text, ()).hallucinated]
    return parsed, [i for i in named if i is not None]


def render_knowledge_prompt(record: ClaimRecord) -> list[Message]:
    """Claim-only (parametric knowledge) chat messages, used by the probes."""
    return [
        {"role": "system", "content": KNOWLEDGE_SYSTEM_PROMPT},
        {"role": "user", "content": f"Claim: {one_line(record.claim)}"},
    ]


def format_answer(label: str, evidence: Iterable[int] = ()) -> str:
    """The one JSON object a verifier answers with (the training target)."""
    if label not in LABELS:
        raise ValueError(f"unknown label {label!r}")
    return json.dumps({"label": label, "evidence": sorted(set(int(i) for i in evidence))})


def render_chat(tokenizer, messages: Sequence[Message]) -> str:
    """The model's own chat template with the generation prompt appended."""
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=True
    )


def encode_chat(tokenizer, messages: Sequence[Message]) -> list[int]:
    """Token ids of :func:`render_chat` without a doubled BOS.

    Templates such as Llama-3's already emit ``<|begin_of_text|>``; encoding
    their text with ``add_special_tokens=True`` would add a second one.
    """
    text = render_chat(tokenizer, messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------
# Answer parsing
# ---------------------------------------------------------------------------

# ASCII only: "never guess" (SPEC §3) means no folding of look-alikes such as
# Arabic-Indic or full-width digits into ids.
_LINE_ID = re.compile(r"^[ \t]*(?:line[ \t]*)?([0-9]+)[ \t]*$", re.IGNORECASE | re.ASCII)
_LABEL_ALIASES = {lab: lab for lab in LABELS}
_MAX_ID_DIGITS = len(str(MAX_SENTENCE_ID))


class AnswerFormatError(ValueError):
    """An answer that cannot be read at all (too deeply nested, a number too long)."""


@dataclass
class ParsedAnswer:
    """A verifier answer, judged against the pool it was shown.

    ``cited`` holds ids that exist in the pool (in citation order, without
    repeats); ``hallucinated`` the ids that do not. An invalid answer has
    ``label=None`` and says why in ``error``.
    """

    valid: bool
    label: str | None
    cited: list[int] = field(default_factory=list)
    hallucinated: list[int] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The parsed answer as a JSON-ready mapping, one key per field."""
        return asdict(self)


def _invalid(reason: str) -> ParsedAnswer:
    return ParsedAnswer(valid=False, label=None, error=reason)


class _JSONObject(dict):
    """A decoded JSON object that remembers keys given more than once."""

    duplicate_keys: tuple[str, ...] = ()


def _object_pairs(pairs: list[tuple[str, Any]]) -> _JSONObject:
    obj = _JSONObject(pairs)
    if len(obj) != len(pairs):  # json's default would silently keep the last value
        counts = Counter(k for k, _ in pairs)
        obj.duplicate_keys = tuple(k for k, n in counts.items() if n > 1)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_object_pairs)


def _json_objects(text: str) -> list[Any]:
    """Every top-level JSON object embedded in ``text`` (in order).

    Raises AnswerFormatError for JSON that Python cannot hold (nested past
    the recursion limit, an integer over 4300 digits) instead of crashing.
    """
    found = []
    i = 0
    while True:
        start = text.find("{", i)
        if start < 0:
            return found
        try:
            obj, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            i = start + 1
            continue
        except RecursionError:
            raise AnswerFormatError("JSON nested too deeply") from None
        except ValueError:  # Python's 4300-digit limit on int()
            raise AnswerFormatError("a JSON number is too long to read (over 4300 digits)") from None
        found.append(obj)
        i = end


def coerce_id(x: Any) -> int | None:
    """A sentence id from an int, an ASCII digit string or ``"lineN"``; else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x if abs(x) <= MAX_SENTENCE_ID else None
    if isinstance(x, str):
        m = _LINE_ID.match(x)
        if m and len(m.group(1).lstrip("0")) <= _MAX_ID_DIGITS:
            i = int(m.group(1))
            return i if i <= MAX_SENTENCE_ID else None
    return None


def single_answer_object(text: str, key: str) -> tuple[dict | None, str | None]:
    """The one JSON object with ``key`` in ``text``, or ``(None, reason)``.

    Shared by the verifier and annotator parsers: no object, two different
    objects, or an object giving a key twice is an error, never a guess.
    """
    try:
        candidates = [o for o in _json_objects(text) if isinstance(o, dict) and key in o]
    except AnswerFormatError as exc:
        return None, str(exc)
    if not candidates:
        article = "an" if key[0] in "aeiou" else "a"
        return None, f"no JSON object with {article} {key!r} key"
    for obj in candidates:
        if obj.duplicate_keys:
            return None, f"key {short_repr(obj.duplicate_keys[0])} given twice in one answer"
    try:
        distinct = {json.dumps(o, sort_keys=True) for o in candidates}
    except (RecursionError, ValueError):
        return None, "JSON nested too deeply"
    if len(distinct) > 1:
        return None, "several different answers in one output"
    return candidates[0], None


def parse_answer(text: str, pool_ids: Iterable[int]) -> ParsedAnswer:
    """Parse a raw verifier answer against the pool that was shown.

    Lenient but honest: a JSON object inside extra text (code fences, a
    sentence before it) is accepted; two different answers, a label outside
    the label set, or evidence that is not a list of ids is invalid, never
    guessed. Ids may be ints, ASCII digit strings or ``"lineN"``; the label's
    case is forgiven, but a key given twice or a Unicode look-alike
    (``ſupport``, ``٣``) makes the answer invalid. Never raises.
    """
    if not isinstance(text, str) or not text.strip():
        return _invalid("empty output")
    obj, reason = single_answer_object(text, "label")
    if obj is None:
        return _invalid(reason)

    raw_label = obj.get("label")
    if not isinstance(raw_label, str):
        return _invalid(f"label is not a string: {short_repr(raw_label)}")
    # Case is forgiven, look-alikes are not: "ſupport".upper() == "SUPPORT".
    label = _LABEL_ALIASES.get(raw_label.strip().upper()) if raw_label.isascii() else None
    if label is None:
        return _invalid(f"label {short_repr(raw_label)} is not one of {', '.join(LABELS)}")

    if "evidence" not in obj:
        return _invalid("missing 'evidence' list")
    raw_ev = obj["evidence"]
    if not isinstance(raw_ev, list):
        return _invalid(f"evidence is not a list: {short_repr(raw_ev)}")
    ids: list[int] = []
    for x in raw_ev:
        i = coerce_id(x)
        if i is None:
            return _invalid(f"evidence item {short_repr(x)} is not a sentence id")
        if i not in ids:
            ids.append(i)

    pool = set(pool_ids)
    cited = [i for i in ids if i in pool]
    hallucinated = [i for i in ids if i not in pool]
    return ParsedAnswer(valid=True, label=label, cited=cited, hallucinated=hallucinated)
