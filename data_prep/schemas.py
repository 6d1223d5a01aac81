"""JSON schemas of the answer contract (SPEC §3), one per prompt, for constrained decoding.

A verifier answer is ``{"label": <one of LABELS>, "evidence": [ids]}`` and an
annotator answer is ``{"evidence": [ids]}``. The schema limits the ids to the
pool that was *shown* (an enum), so a constrained model cannot cite an
ablated or invented id. ``label`` comes first in ``properties`` (and the
grammar engines emit properties in that order): the soft-FAE "label position"
logic and :func:`data_prep.prompts.parse_answer` read the label before the
evidence list.

Pure functions: no model, no network. Backends turn a schema into an OpenAI
``response_format`` (:func:`response_format`) or a grammar (xgrammar, vLLM).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from data_prep.records import LABELS


def _evidence_schema(pool_ids: Iterable[int], max_evidence: int | None = None) -> dict[str, Any]:
    """Unique ids of the pool shown, at most ``max_evidence`` of them (None: the pool size)."""
    ids = sorted({int(i) for i in pool_ids})
    if not ids:  # an empty pool shown (every sentence ablated): only [] is possible
        return {"type": "array", "maxItems": 0}
    cap = len(ids) if max_evidence is None else max(0, min(int(max_evidence), len(ids)))
    return {"type": "array", "items": {"type": "integer", "enum": ids},
            "uniqueItems": True, "maxItems": cap}


def answer_schema(pool_ids: Iterable[int] | None, labels: Iterable[str] = LABELS,
                  max_evidence: int | None = None) -> dict[str, Any]:
    """The verifier answer for one prompt; ``pool_ids=None`` (knowledge prompt, no pool): only [].

    Bounded in every part (a label of the enum, at most ``max_evidence`` unique
    pool ids), so a grammar built from it always ends (fae/backends/constrained.py).
    """
    return {
        "type": "object",
        "properties": {
            "label": {"type": "string", "enum": list(labels)},
            "evidence": _evidence_schema(pool_ids or (), max_evidence),
        },
        "required": ["label", "evidence"],
        "additionalProperties": False,
    }


def annotator_schema(pool_ids: Iterable[int]) -> dict[str, Any]:
    """An annotator's answer (``{"evidence": [ids of the pool]}``, see data_prep/enhance/prompt.py)."""
    return {
        "type": "object",
        "properties": {"evidence": _evidence_schema(pool_ids)},
        "required": ["evidence"],
        "additionalProperties": False,
    }


def schema_key(schema: dict[str, Any]) -> str:
    """The text of a schema: the cache key of compiled grammars (one per pool shape).

    Keys are not sorted: property order is the order the answer is written in.
    """
    return json.dumps(schema, separators=(",", ":"))


def response_format(schema: dict[str, Any], name: str = "answer") -> dict[str, Any]:
    """The OpenAI ``response_format`` for a schema (``strict`` is left off: servers differ on it)."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


JSON_OBJECT_FORMAT = {"type": "json_object"}


def shown_pool_ids(messages: list[dict[str, str]]) -> list[int] | None:
    """The sentence ids a rendered prompt shows (its ``lineN:`` rows); None for a claim-only prompt.

    Backends see only chat messages, so the schema is read back from what the
    model is shown (:func:`data_prep.prompts.format_pool` writes one sentence
    per row, newlines removed, after a one-line claim), never from the record.
    """
    user = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    head, sep, pool = user.partition("\nDocument:\n")
    if not sep:
        return None if "\nDocument:" not in user else []
    ids = []
    for row in pool.split("\n"):
        name, colon, _ = row.partition(":")
        if colon and name.startswith("line") and name[4:].isdigit() and name[4:].isascii():
            ids.append(int(name[4:]))
    return ids


def schema_for_prompt(messages: list[dict[str, str]], max_evidence: int | None = None) -> dict[str, Any]:
    """The verifier answer schema of one rendered prompt (evidence or knowledge prompt)."""
    return answer_schema(shown_pool_ids(messages), max_evidence=max_evidence)
