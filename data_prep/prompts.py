"""Prompts and the answer format (SPEC §3), shared by training and evaluation.

Training targets are produced by :func:`format_answer` and evaluation reads
answers with :func:`parse_answer`, so the two can never drift apart.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from real_fae_core.jsonl import short_repr
from data_prep.records import LABELS, MAX_SENTENCE_ID, ClaimRecord

# Version of the prompt layout and answer format, stored with every run so a
# run made with another format is never resumed as if it were the same.
PROMPT_FORMAT_VERSION = 1

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


def format_pool(record: ClaimRecord, pool_ids: Iterable[int] | None = None) -> str:
    """The ``lineN: text`` block, in the record's reading order."""
    if pool_ids is None:
        sents = record.sentences
    else:
        keep = set(pool_ids)
        unknown = keep - set(record.pool_ids)
        if unknown:
            raise ValueError(
                f"record {record.id!r}: pool ids {sorted(unknown)} are not sentences of the record"
            )
        sents = [s for s in record.sentences if s.id in keep]
    return "\n".join(f"line{s.id}: {one_line(s.text)}" for s in sents)


def one_line(text: str) -> str:
    # A newline inside a sentence would fake a new "lineN:" row.
    return " ".join(text.split())


def render_evidence_prompt(
    record: ClaimRecord, pool_ids: Iterable[int] | None = None
) -> list[Message]:
    """Evidence-based chat messages for the pool ``pool_ids`` (default: full pool)."""
    user = f"Claim: {one_line(record.claim)}\nDocument:\n{format_pool(record, pool_ids)}"
    return [
        {"role": "system", "content": EVIDENCE_SYSTEM_PROMPT},
        {"role": "user", "content": user.rstrip("\n")},
    ]


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
