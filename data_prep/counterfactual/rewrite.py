"""LLM prompts for counterfactual sentences, the judge's prompt, and the checks answers must pass.

The rewrite prompt shows the claim and the verdict the new sentence must
give (REFUTE for a SUPPORT claim, SUPPORT for a REFUTE claim); the judge
prompt shows the claim and the new sentence only, and asks for its verdict.
A rewrite is accepted when it is a JSON object ``{"sentence": "..."}`` whose
sentence differs from the original (ignoring case and spacing) and keeps its
topic: at least ``min_overlap`` of the original's content words reappear. A
rewrite that fails is re-asked (the client's malformed-answer retries) and
then recorded as failed, never used.
"""

from __future__ import annotations

import json
import re

from real_fae_core.labels import LABELS, REFUTE, SUPPORT

_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")
_STOP = frozenset("""
a an the this that these those is are was were be been being of in on at to for from by with as and or
but not no nor than then so such it its into over under about after before between during while which who
whom whose what when where why how there here has have had do does did can could may might will would shall
should also only more most less least very we our they their he she his her them us i you your
""".split())

OPPOSITE = {SUPPORT: REFUTE, REFUTE: SUPPORT}  # the verdict a counterfactual must carry, by gold label
_TASK = ("You write counterfactual evidence for fact-checking research. You are given a claim, one sentence "
         "of evidence, and the verdict the rewritten sentence must give when read alone: {how} "
         "Keep the topic, the style and every other detail. Do not add hedges or mention that it was changed. "
         "Answer with JSON only: {{\"sentence\": \"...\"}}")
SYSTEM = {
    "semantic": _TASK.format(how=(
        "rewrite the sentence so that it states a finding that contradicts its original meaning and "
        "clearly gives the intended verdict on the claim.")),
    "entity": _TASK.format(how=(
        "replace one or two key entities, numbers or dates with alternatives of the same kind, and change "
        "nothing else. For REFUTE, move the value the claim depends on away from the claim's value; for "
        "SUPPORT, put the claim's own value where the sentence gives a different one.")),
}
JUDGE_SYSTEM = (
    "You check evidence for fact-checking research. Read the claim and the evidence sentence. Say whether the "
    "sentence, read alone, SUPPORTS the claim, REFUTES it, or gives NOT_ENOUGH_INFO to decide. "
    "Answer with JSON only: {\"label\": \"SUPPORT\" | \"REFUTE\" | \"NOT_ENOUGH_INFO\"}")
MIN_OVERLAP = {"semantic": 0.3, "entity": 0.5}


def rewrite_messages(kind: str, text: str, claim: str, verdict: str) -> list[dict[str, str]]:
    """The rewrite request: it sees the claim and the verdict its answer must give (PAVE's construction)."""
    return [{"role": "system", "content": SYSTEM[kind]},
            {"role": "user", "content": f"Claim: {claim}\nSentence: {text}\nIntended verdict: {verdict}"}]


def judge_messages(claim: str, text: str) -> list[dict[str, str]]:
    """The label-consistency check: the verdict a reader gets from the counterfactual sentence alone.
    The intended verdict is not shown, so the judge cannot simply agree with it."""
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"Claim: {claim}\nEvidence: {text}"}]


def parse_verdict(content: str | None) -> tuple[str | None, str | None]:
    """(label, None) or (None, reason) for a judge's answer."""
    obj, error = _json_object(content, "{\"label\": ...}")
    if error:
        return None, error
    label = obj.get("label")
    if not isinstance(label, str) or label.strip().upper() not in LABELS:
        return None, f"\"label\" is not one of {', '.join(LABELS)}"
    return label.strip().upper(), None


def verdict_problem(content: str | None) -> str | None:
    """Why a judge's answer holds no verdict (None when it does): the check that makes the client re-ask."""
    return parse_verdict(content)[1]


def content_words(text: str) -> set[str]:
    """The lowercase words of ``text`` that carry its topic: no stop words, none under three letters but numbers."""
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP and (len(w) > 2 or w.isdigit())}


def topic_overlap(original: str, rewrite: str) -> float:
    """Share of the original's content words found in the rewrite (1.0 when it has none)."""
    orig = content_words(original)
    return len(orig & content_words(rewrite)) / len(orig) if orig else 1.0


def _json_object(content: str | None, shape: str) -> tuple[dict | None, str | None]:
    if not content or not content.strip():
        return None, "empty output"
    text = content.strip()
    if text.startswith("```"):  # a fenced block: take what is inside
        text = text.strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return None, f"not a JSON object {shape}"
    if not isinstance(obj, dict):
        return None, f"not a JSON object {shape}"
    return obj, None


def parse_rewrite(content: str | None) -> tuple[str | None, str | None]:
    """(sentence, None) or (None, reason)."""
    obj, error = _json_object(content, "{\"sentence\": ...}")
    if error:
        return None, error
    if not isinstance(obj.get("sentence"), str) or not obj["sentence"].strip():
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
