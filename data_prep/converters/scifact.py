"""SciFact (Wadden et al., EMNLP 2020): claims over the abstracts they cite.

Source: ``claims_*.jsonl`` + ``corpus.jsonl`` (or the shared
``corpus_cited.jsonl``). Pool = the abstracts of ``cited_doc_ids``
concatenated in that order; sentence ids run 0..n-1 over the whole pool and
``doc`` holds the doc id. Label = SUPPORT if any rationale says SUPPORT, else
REFUTE if any says CONTRADICT, else NOT_ENOUGH_INFO. Each rationale set
(``sentences`` of one evidence entry) with the claim's label is one gold group.
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
    load_abstract_corpus,
)

NAME = "scifact"
RATIONALE_LABELS = {"SUPPORT": SUPPORT, "CONTRADICT": REFUTE}


def load_corpus(path) -> dict[str, list[str]]:
    """``{doc_id: abstract sentences}`` of corpus.jsonl (ids as strings); a duplicate id is fatal."""
    return load_abstract_corpus(path, "doc_id", (int, str))


def convert(inputs: ConvertInputs, stats: ConvertStats) -> Iterator[Emitted]:
    """One record per usable SciFact claim (record, file, line), its pool the cited abstracts; unusable claims
    are counted in ``stats`` as drops, malformed lines are an :class:`InputError`."""
    corpus = load_corpus(inputs.corpus)
    for path, lineno, obj, cid, claim in claim_lines(inputs, stats, "id", (int, str)):
        evidence = get_field(obj, "evidence", dict, path, lineno)
        cited = get_field(obj, "cited_doc_ids", list, path, lineno)
        cited_ids: list[str] = []
        for k, d in enumerate(cited):
            if isinstance(d, bool) or not isinstance(d, (int, str)):
                raise InputError(path, lineno, f"cited_doc_ids[{k}]", "must be a doc id")
            if str(d) not in cited_ids:
                cited_ids.append(str(d))
        # rationale sets per label, as (doc, sentence indices)
        sets: dict[str, list[tuple[str, list[int]]]] = {SUPPORT: [], REFUTE: []}
        for doc, entries in evidence.items():
            if not isinstance(entries, list):
                raise InputError(path, lineno, f"evidence[{doc}]", "must be a list of rationales")
            for k, ent in enumerate(entries):
                fld = f"evidence[{doc}][{k}]"
                if not isinstance(ent, dict):
                    raise InputError(path, lineno, fld, "must be an object with 'sentences' and 'label'")
                lab = ent.get("label")
                if lab not in RATIONALE_LABELS:
                    raise InputError(path, lineno, fld + ".label",
                                     f"unknown rationale label {lab!r} (expected SUPPORT or CONTRADICT)")
                sents = ent.get("sentences")
                if (not isinstance(sents, list) or not sents
                        or any(isinstance(i, bool) or not isinstance(i, int) for i in sents)):
                    raise InputError(path, lineno, fld + ".sentences",
                                     "must be a non-empty list of sentence indices")
                sets[RATIONALE_LABELS[lab]].append((str(doc), sents))
        label = SUPPORT if sets[SUPPORT] else REFUTE if sets[REFUTE] else NOT_ENOUGH_INFO

        if label == NOT_ENOUGH_INFO and not inputs.include_nei:
            stats.drop(NEI_REASON, path, lineno, "evidence")
            continue
        if not cited_ids:
            stats.drop("no cited documents (empty pool)", path, lineno, "cited_doc_ids")
            continue
        missing = [d for d in cited_ids if d not in corpus]
        if missing:
            stats.drop("doc id not in corpus", path, lineno, "cited_doc_ids", ", ".join(missing))
            continue
        uncited = [d for d, _ in sets[SUPPORT] + sets[REFUTE] if d not in cited_ids]
        if uncited:
            stats.drop("evidence doc not in cited_doc_ids", path, lineno, "evidence",
                       ", ".join(sorted(set(uncited))))
            continue

        sentences: list[Sentence] = []
        pool_id: dict[tuple[str, int], int] = {}
        for d in cited_ids:
            for idx, text in enumerate(corpus[d]):
                if text.strip():
                    pool_id[(d, idx)] = len(sentences)
                    sentences.append(Sentence(id=len(sentences), text=text, doc=d))
        groups: list[list[int]] = []
        problem = None
        for d, idxs in sets.get(label, []):
            if any(not 0 <= i < len(corpus[d]) for i in idxs):
                problem = ("sentence index outside the abstract",
                           f"doc {d} sentences {idxs} (abstract has {len(corpus[d])})")
                break
            if any((d, i) not in pool_id for i in idxs):
                problem = ("gold sentence is empty", f"doc {d} sentences {idxs}")
                break
            group = sorted({pool_id[(d, i)] for i in idxs})
            if group not in groups:
                groups.append(group)
        if problem:
            stats.drop(problem[0], path, lineno, "evidence", problem[1])
            continue
        rec = ClaimRecord(id=f"{NAME}-{cid}", dataset=NAME, claim=claim, label=label,
                          sentences=sentences, evidence=groups)
        yield rec, path, lineno


CONVERTER = Converter(NAME, "SciFact: --claims claims_*.jsonl --corpus corpus.jsonl",
                      convert, needs=("corpus",))
