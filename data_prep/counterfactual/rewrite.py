"""LLM prompts for counterfactual sentences, and the check every rewrite must pass.

A rewrite is accepted when it is a JSON object ``{"sentence": "..."}`` whose
sentence differs from the original (ignoring case and spacing) and keeps its
topic: at least ``min_overlap`` of the original's content words reappear. A
rewrite that fails is re-asked (the client's malformed-answer retries) and
then recorded as failed, never used.
"""

from __future__ import annotations

import json
import re

_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")
_STOP = frozenset("""
a an the this that these those is are was were be been being of in on at to for from by with as and or
but not no nor than then so such it its into over under about after before between during while which who
whom whose what when where why how there here has have had do does did can could may might will would shall
should also only more most less least very we our they their he she his her them us i you your
""".split())

SYSTEM = {
    "semantic": (
        "You write counterfactual evidence for fact-checking research. Rewrite the given sentence so that "
        "it states the opposite or a clearly incompatible finding, on the same topic and in the same style. "
        "Do not add hedges or mention that it was changed. Answer with JSON only: {\"sentence\": \"...\"}"
    ),
    "entity": (
        "You write counterfactual evidence for fact-checking research. In the given sentence, replace one "
        "or two key entities, numbers or dates with plausible alternatives of the same kind, so that the "
        "fact becomes false; change nothing else. Answer with JSON only: {\"sentence\": \"...\"}"
    ),
}
MIN_OVERLAP = {"semantic": 0.3, "entity": 0.5}


def rewrite_messages(kind: str, text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM[kind]}, {"role": "user", "content": f"Sentence: {text}"}]


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and (len(w) > 2 or w.isdigit())}


def topic_overlap(original: str, rewrite: str) -> float:
    """Share of the original's content words found in the rewrite (1.0 when it has none)."""
    orig = content_words(original)
    return len(orig & content_words(rewrite)) / len(orig) if orig else 1.0


def parse_rewrite(content: str | None) -> tuple[str | None, str | None]:
    """(sentence, None) or (None, reason)."""
    if not content or not content.strip():
        return None, "empty output"
    text = content.strip()
    if text.startswith("```"):  # a fenced block: take what is inside
        text = text.strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return None, "not a JSON object {\"sentence\": ...}"
    if not isinstance(obj, dict) or not isinstance(obj.get("sentence"), str) or not obj["sentence"].strip():
        return None, "no \"sentence\" string in the answer"
    return obj["sentence"].strip(), None


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def rewrite_problem(original: str, content: str | None, min_overlap: float) -> str | None:
    """Why the answer is not a usable rewrite of ``original`` (None when it is)."""
    sentence, error = parse_rewrite(content)
    if error:
        return error
    if _norm(sentence) == _norm(original):
        return "the rewrite is identical to the original"
    overlap = topic_overlap(original, sentence)
    if overlap < min_overlap:
        return f"the rewrite left the topic (content-word overlap {overlap:.2f} < {min_overlap:.2f})"
    return None
