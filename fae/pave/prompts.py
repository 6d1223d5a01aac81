"""PAVE's prompt conditions for one record (SPEC §9): claim only, gold evidence, and one
counterfactual pool per kind.

``counterfactual_sentences`` is either one pool (a list shaped like
``sentences``: one kind, "counterfactual") or one pool per kind, as written
by ``real-data counterfactual``: ``{"entity": [...], "semantic": [...]}``.
"""

from __future__ import annotations

import re

from data_prep.prompts import DEFAULT_LINE_IDS, render_evidence_prompt, render_knowledge_prompt
from data_prep.records import ClaimRecord, RecordError, Sentence

# A plain list of counterfactual sentences (the simplest hand-written form) is one unnamed kind, shown as
# the condition "counterfactual"; `real-data counterfactual` writes one list per named kind.
PLAIN_LIST_KIND = "counterfactual"
KIND_ORDER = ("entity", "semantic")
_KIND_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def condition_name(kind: str) -> str:
    """samples.jsonl condition of a kind ("counterfactual" for the single-list form)."""
    return "counterfactual" if kind == PLAIN_LIST_KIND else f"counterfactual_{kind}"


def kind_sort_key(kind: str) -> tuple:
    """Sort key of a counterfactual kind: the known kinds in ``KIND_ORDER``, then any other kind by name."""
    return (KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER), kind)


def _pool_record(rec: ClaimRecord, raw, field: str) -> ClaimRecord:
    if not isinstance(raw, list) or not raw:
        raise RecordError("must be a non-empty list of sentences", field=field, record_id=rec.id)
    sents = []
    for k, s in enumerate(raw):
        if not isinstance(s, dict) or not isinstance(s.get("text"), str):
            raise RecordError(f"item {k} needs a 'text' string", field=field, record_id=rec.id)
        sid = s.get("id", k)
        if not isinstance(sid, int) or isinstance(sid, bool):
            raise RecordError(f"item {k} id must be an integer", field=field, record_id=rec.id)
        sents.append(Sentence(id=sid, text=s["text"], doc=s.get("doc")))
    if len({s.id for s in sents}) != len(sents):
        raise RecordError("duplicate sentence ids", field=field, record_id=rec.id)
    return ClaimRecord(id=rec.id, claim=rec.claim, label=rec.label, sentences=sents, evidence=[])


def counterfactual_records(rec: ClaimRecord) -> dict[str, ClaimRecord]:
    """Kind -> the record with its pool replaced by that kind's counterfactual sentences ({} when absent)."""
    raw = rec.extra.get("counterfactual_sentences")
    if raw is None:
        return {}
    if isinstance(raw, list):
        return {PLAIN_LIST_KIND: _pool_record(rec, raw, "counterfactual_sentences")}
    if not isinstance(raw, dict) or not raw:
        raise RecordError("must be a non-empty list of sentences or an object {kind: [sentences]}",
                          field="counterfactual_sentences", record_id=rec.id)
    out = {}
    for kind in sorted(raw, key=kind_sort_key):
        if not _KIND_NAME.match(kind) or kind == PLAIN_LIST_KIND:
            raise RecordError(f"kind {kind!r} must be a lower-case name such as 'entity' or 'semantic'",
                              field="counterfactual_sentences", record_id=rec.id)
        out[kind] = _pool_record(rec, raw[kind], f"counterfactual_sentences.{kind}")
    return out



def prompts_for(rec: ClaimRecord, line_ids: str = DEFAULT_LINE_IDS) -> dict[str, tuple[list, list[int]]]:
    """Condition -> (chat messages, pool ids shown, in reading order). Gold evidence = the union of the gold
    groups; lines numbered as ``line_ids`` says (SPEC §3)."""
    gold = [i for i in rec.pool_ids if i in set(rec.gold_ids)]
    out = {
        "claim_only": (render_knowledge_prompt(rec), []),
        "gold_evidence": (render_evidence_prompt(rec, gold, line_ids), gold),
    }
    for kind, cf in counterfactual_records(rec).items():
        out[condition_name(kind)] = (render_evidence_prompt(cf, None, line_ids), cf.pool_ids)
    return out

