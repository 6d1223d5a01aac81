"""The annotator prompt and a strict parser for its ``{"evidence": [ids]}`` answer.

The pool is shown in the verifier's own ``lineN:`` layout (via
:func:`data_prep.prompts.format_pool`), so annotators and verifiers see the
same sentence ids and a picked id means the same line everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from real_fae_core.jsonl import short_repr
from data_prep.prompts import coerce_id, format_pool, one_line, single_answer_object
from data_prep.records import ClaimRecord

ANNOTATOR_SYSTEM_PROMPT = (
    "You are annotating evidence for fact-checking. You are given a claim and a document "
    "whose lines are numbered (lineN). Find EVERY line that, on its own or together with "
    "other lines, supports or refutes the claim; include all of them, not just one "
    "sufficient set, and leave out lines that are merely on the same topic. "
    "Answer with one JSON object and nothing else: "
    '{"evidence": [IDS]}, where IDS are the numbers N of those lines (lineN), '
    "or an empty list if no line supports or refutes the claim."
)


def render_annotator_prompt(record: ClaimRecord) -> list[dict[str, str]]:
    """Chat messages asking an annotator for the evidence ids of ``record``."""
    user = f"Claim: {one_line(record.claim)}\nDocument:\n{format_pool(record)}"
    return [
        {"role": "system", "content": ANNOTATOR_SYSTEM_PROMPT},
        {"role": "user", "content": user.rstrip("\n")},
    ]


@dataclass
class Annotation:
    """An annotator's answer judged against the pool: ``ids`` exist, ``invented`` do not."""

    valid: bool
    ids: list[int] = field(default_factory=list)
    invented: list[int] = field(default_factory=list)
    error: str | None = None


def parse_annotation(text: str | None, pool_ids: Iterable[int]) -> Annotation:
    """Parse ``{"evidence": [ids]}``; anything else is invalid (never guessed).

    A JSON object inside extra text (code fences) is accepted; ids may be
    ints, ASCII digit strings or ``"lineN"``. Two different objects, a key
    given twice, a missing or non-list ``evidence`` or a non-id item (a
    Unicode look-alike digit included) make the answer invalid. Never raises:
    JSON nested too deeply or a 5000-digit number is an invalid answer too.
    """
    if not isinstance(text, str) or not text.strip():
        return Annotation(False, error="empty output")
    obj, reason = single_answer_object(text, "evidence")
    if obj is None:
        return Annotation(False, error=reason)
    raw = obj["evidence"]
    if not isinstance(raw, list):
        return Annotation(False, error=f"evidence is not a list: {short_repr(raw)}")
    ids: list[int] = []
    for x in raw:
        i = coerce_id(x)
        if i is None:
            return Annotation(False, error=f"evidence item {short_repr(x)} is not a sentence id")
        if i not in ids:
            ids.append(i)
    pool = set(pool_ids)
    return Annotation(
        True,
        ids=sorted(i for i in ids if i in pool),
        invented=sorted(i for i in ids if i not in pool),
    )


def annotation_check(pool_ids: Iterable[int]) -> Callable[[str | None], str | None]:
    """The client's check of an evidence annotation over ``pool_ids``
    (:meth:`data_prep.llm.client.AnnotatorClient.annotate`): None for a usable answer, else why not."""
    pool_ids = list(pool_ids)

    def check(content: str | None) -> str | None:
        parsed = parse_annotation(content, pool_ids)
        return None if parsed.valid else parsed.error

    return check


def estimate_tokens(messages: list[dict[str, str]]) -> int:
    """Rough input-token count (~4 characters per token + per-message overhead) for --dry-run."""
    return sum(len(m["content"]) // 4 + 4 for m in messages) + 3
