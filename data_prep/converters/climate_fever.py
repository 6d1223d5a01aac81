"""Climate-FEVER (Diggelmann et al., 2020): five Wikipedia sentences per claim.

Source: ``climate-fever.jsonl``. Pool = the claim's ``evidences`` in order
(ids 0-4), ``doc`` = the article. Only SUPPORTS/REFUTES claims are verifiable
here: DISPUTED is always dropped, NOT_ENOUGH_INFO unless --include-nei. Gold =
every sentence whose ``evidence_label`` equals the claim label, each its own
group (annotators judged each sentence alone).
"""

from __future__ import annotations

from typing import Iterator

from data_prep.records import NOT_ENOUGH_INFO, REFUTE, SUPPORT, ClaimRecord, Sentence

from .base import (
    NEI_REASON,
    Converter,
    ConvertInputs,
    ConvertStats,
    Emitted,
    InputError,
    claim_lines,
    get_field,
    get_label,
)

NAME = "climate-fever"
CLAIM_LABELS = {"SUPPORTS": SUPPORT, "REFUTES": REFUTE, "NOT_ENOUGH_INFO": NOT_ENOUGH_INFO,
                "DISPUTED": None}
EVIDENCE_LABELS = {"SUPPORTS": SUPPORT, "REFUTES": REFUTE, "NOT_ENOUGH_INFO": NOT_ENOUGH_INFO}


def convert(inputs: ConvertInputs, stats: ConvertStats) -> Iterator[Emitted]:
    """One record per usable Climate-FEVER claim (record, file, line); DISPUTED and unusable claims are
    counted in ``stats`` as drops, malformed lines are an :class:`InputError`."""
    for path, lineno, obj, cid, claim in claim_lines(inputs, stats, "claim_id", (str, int)):
        label = get_label(obj, "claim_label", CLAIM_LABELS, path, lineno)
        evidences = get_field(obj, "evidences", list, path, lineno)
        sentences: list[Sentence] = []
        ev_labels: list[str] = []
        empty: set[int] = set()
        for k, ev in enumerate(evidences):
            fld = f"evidences[{k}]"
            if not isinstance(ev, dict):
                raise InputError(path, lineno, fld, "must be an object")
            text = ev.get("evidence")
            if not isinstance(text, str):
                raise InputError(path, lineno, fld + ".evidence", "missing or not a string")
            lab = ev.get("evidence_label")
            if lab not in EVIDENCE_LABELS:
                raise InputError(path, lineno, fld + ".evidence_label",
                                 f"unknown label {lab!r} (expected one of {', '.join(EVIDENCE_LABELS)})")
            article = ev.get("article")
            if article is not None and not isinstance(article, str):
                raise InputError(path, lineno, fld + ".article", "must be a string")
            ev_labels.append(EVIDENCE_LABELS[lab])
            if text.strip():
                sentences.append(Sentence(id=k, text=text, doc=article))
            else:
                empty.add(k)

        if label is None:
            stats.drop("DISPUTED claim", path, lineno, "claim_label")
            continue
        if label == NOT_ENOUGH_INFO and not inputs.include_nei:
            stats.drop(NEI_REASON, path, lineno, "claim_label")
            continue
        if not sentences:
            stats.drop("no evidence sentences (empty pool)", path, lineno, "evidences")
            continue
        gold = [k for k, lab in enumerate(ev_labels) if lab == label] if label != NOT_ENOUGH_INFO else []
        if any(k in empty for k in gold):
            stats.drop("gold sentence is empty", path, lineno, "evidences")
            continue
        if label != NOT_ENOUGH_INFO and not gold:
            stats.drop("no sentence carries the claim label", path, lineno, "evidences")
            continue
        rec = ClaimRecord(id=f"{NAME}-{cid}", dataset=NAME, claim=claim, label=label,
                          sentences=sentences, evidence=[[k] for k in gold])
        yield rec, path, lineno


CONVERTER = Converter(NAME, "Climate-FEVER: --claims climate-fever.jsonl", convert)
