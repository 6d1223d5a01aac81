"""Check-COVID (Wang et al., ACL Findings 2023): one CORD-19 abstract per claim.

Source: ``covidCheck_*.json`` (JSON lines) + ``corpus.json``. Pool = the
abstract of ``cord_id``, sentence id = its index in the abstract; gold = ONE
group holding every ``sent_index`` of ``evidence_set`` (PRIMARY and
SUPPLEMENTARY alike; the PRIMARY ids are kept in ``primary_evidence``).
NOTENOUGHINFO claims carry a related-but-insufficient sentence in
``evidence_set``: with --include-nei they get ``evidence: []`` and those ids in
``related_evidence``.
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
    load_abstract_corpus,
)

NAME = "check-covid"
LABELS = {"SUPPORT": SUPPORT, "REFUTE": REFUTE, "NOTENOUGHINFO": NOT_ENOUGH_INFO,
          "NOT_ENOUGH_INFO": NOT_ENOUGH_INFO}


def load_corpus(path) -> dict[str, list[str]]:
    """``{cord_id: abstract sentences}`` of corpus.json; an empty or duplicate id is fatal."""
    return load_abstract_corpus(path, "cord_id", str, nonempty=True)


def convert(inputs: ConvertInputs, stats: ConvertStats) -> Iterator[Emitted]:
    """One record per usable Check-COVID claim (record, file, line); unusable claims are counted in ``stats``
    as drops, malformed lines are an :class:`InputError`."""
    corpus = load_corpus(inputs.corpus)
    for path, lineno, obj, cid, claim in claim_lines(inputs, stats, "id", (str, int)):
        label = get_label(obj, "label", LABELS, path, lineno)
        cord_id = get_field(obj, "cord_id", str, path, lineno)
        evidence_set = get_field(obj, "evidence_set", list, path, lineno)
        indices: list[int] = []
        primary: list[int] = []
        for k, ev in enumerate(evidence_set):
            fld = f"evidence_set[{k}]"
            if not isinstance(ev, dict):
                raise InputError(path, lineno, fld, "must be an object with 'sent_index'")
            idx = get_field(ev, "sent_index", int, path, lineno)
            if idx not in indices:
                indices.append(idx)
            if ev.get("type") == "PRIMARY" and idx not in primary:
                primary.append(idx)

        if label == NOT_ENOUGH_INFO and not inputs.include_nei:
            stats.drop(NEI_REASON, path, lineno, "label")
            continue
        abstract = corpus.get(cord_id)
        if abstract is None:
            stats.drop("cord_id not in corpus", path, lineno, "cord_id", repr(cord_id))
            continue
        bad = [i for i in indices if not 0 <= i < len(abstract)]
        if bad:
            stats.drop("sent_index outside the abstract", path, lineno, "evidence_set",
                       f"{bad} (abstract has {len(abstract)} sentences)")
            continue
        if any(not abstract[i].strip() for i in indices):
            stats.drop("gold sentence is empty", path, lineno, "evidence_set")
            continue
        if label != NOT_ENOUGH_INFO and not indices:
            stats.drop("no gold evidence", path, lineno, "evidence_set")
            continue
        sentences = [Sentence(id=i, text=t, doc=cord_id)
                     for i, t in enumerate(abstract) if t.strip()]
        extra: dict = {}
        if label == NOT_ENOUGH_INFO:
            evidence: list[list[int]] = []
            extra["related_evidence"] = sorted(indices)
        else:
            evidence = [sorted(indices)]
            extra["primary_evidence"] = sorted(primary)
        if "is_auth" in obj:
            extra["is_auth"] = obj["is_auth"]
        rec = ClaimRecord(id=f"{NAME}-{cid}", dataset=NAME, claim=claim, label=label,
                          sentences=sentences, evidence=evidence, extra=extra)
        yield rec, path, lineno


CONVERTER = Converter(NAME, "Check-COVID: --claims covidCheck_*.json --corpus corpus.json",
                      convert, needs=("corpus",))
