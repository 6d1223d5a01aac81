"""REAL training pairs (SPEC §4) as TRL conversational prompt-completion rows.

Every variant goes through the same code path; a variant only decides which
evidence set is ``E_train`` (gold ``E*`` or ``enhanced_evidence``), whether
ablated negatives are added and whether each negative gets a matched positive:

============================  =========  =========  ========  ==========
variant                       positives  negatives  matched   E_train
============================  =========  =========  ========  ==========
``sft``                       yes        no         no        gold E*
``no_ablation``               yes        no         no        enhanced
``no_enhancement``            yes        yes        no        gold E*
``real``                      yes        yes        no        enhanced
``no_enhancement_matched``    yes        yes        yes       gold E*
``real_matched``              yes        yes        yes       enhanced
``no_enhancement_sufficient`` yes        yes        yes       gold E*
``real_sufficient``           yes        yes        yes       enhanced
============================  =========  =========  ========  ==========

Rows are ``{"prompt": [system, user], "completion": [assistant], ...metadata}``
so TRL's SFTTrainer puts the loss on the completion only, whatever the chat
template (Llama-3.1's template breaks ``assistant_only_loss``).

A negative whose ablated pool ``S \\ E_train`` would be empty is dropped and
counted (``dropped.empty_ablated_pool``): an empty ``Document:`` block teaches
nothing about evidence and never occurs in FAE, whose round r+1 pool is what
is left of round r's pool.

Matched positives break a shortcut of the plain pairs: every positive shows the
full pool and every negative a smaller one, numbered with a hole where
``E_train`` was (``--line-ids original``), so "a line is missing" or "the pool
shrank" alone predicts NOT_ENOUGH_INFO. A matched positive removes as many
sentences as the negative does, drawn from outside ``E_train`` ∪ ``E*``, and
keeps the positive's target: the same hole and the same size, the opposite
answer. ``--line-ids renumbered`` removes the hole itself (lines 0..n-1 shown);
the pool size is still a cue there, which the matched positive removes too.

Sufficiency pairs (``real_sufficient`` / ``no_enhancement_sufficient``: the
matched variant's rows plus three per record) break the cue a matched variant still leaves: its positives are never
shorter than its negatives, so "one line left" still means NOT_ENOUGH_INFO and
the verifier abstains on a pool that holds exactly the proof. Added per record,
each drawn from its own seeded stream (seed, record id, kind):

- ``evidence_positive``: ``E_train`` alone, the label kept (the gold-only and
  cited-only pools of FAE);
- ``sufficient_positive``: ``E_train`` plus m other lines, m uniform in
  1 .. n − |E_train| − 1 (pool sizes spread between the evidence and the full
  pool, the removed lines anywhere: interior, leading or trailing);
- ``short_negative``: the pool without ``E_train`` ∪ ``E*`` and without a
  further uniform subset of the rest, keeping m lines, m uniform in
  1 .. n − |E_train ∪ E*| − 1: NOT_ENOUGH_INFO at sizes the positives also have.

So at every pool size and with a gap anywhere both labels occur, and only the
evidence decides; a record too small for a row (a pool of evidence only, or
one line beside it) goes without it, counted in ``dropped``.

Answer interfaces (``--interface``): every row above is a JSON-interface row
(``json``, SPEC §3: label and cited lines). ``codes`` and ``labels`` write the
same examples as the evaluation-choice study asks them (SPEC §10): the
study's prompt over the row's pool in record order, lines 0..n-1, and the one
answer string its strict reader takes for the row's label (``A``/``B``/``C``,
or the dataset's own label string). ``study`` writes both rows per example,
so format tuning teaches a model to answer either interface. A row of a study
interface has a ``format`` column; a record whose ``dataset`` the study does
not know stops the build (:class:`UnknownStudyDataset`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Sequence

from real_fae_core.hashing import keyed_rng
from real_fae_core.progress import progress_bar
from data_prep.prompts import (
    DEFAULT_LINE_IDS,
    check_line_ids,
    format_answer,
    render_evidence_prompt,
    shown_evidence,
    shown_pool,
)
from data_prep.records import NOT_ENOUGH_INFO, ClaimRecord
from data_prep.study_prompts import DATASETS as STUDY_DATASETS
from data_prep.study_prompts import FORMATS as STUDY_FORMATS
from data_prep.study_prompts import STUDY_LINE_IDS, render_study_prompt


@dataclass(frozen=True)
class Variant:
    name: str
    negatives: bool
    enhanced: bool
    # Each negative's record also gets a MATCHED_POSITIVE row (needs ``negatives``).
    matched: bool = False
    # ... and the sufficiency rows: EVIDENCE_POSITIVE, SUFFICIENT_POSITIVE, SHORT_NEGATIVE (needs ``matched``).
    sufficient: bool = False


VARIANTS: dict[str, Variant] = {
    "sft": Variant("sft", negatives=False, enhanced=False),
    "no_ablation": Variant("no_ablation", negatives=False, enhanced=True),
    "no_enhancement": Variant("no_enhancement", negatives=True, enhanced=False),
    "real": Variant("real", negatives=True, enhanced=True),
    "no_enhancement_matched": Variant("no_enhancement_matched", negatives=True, enhanced=False, matched=True),
    "real_matched": Variant("real_matched", negatives=True, enhanced=True, matched=True),
    "no_enhancement_sufficient": Variant("no_enhancement_sufficient", negatives=True, enhanced=False, matched=True,
                                         sufficient=True),
    "real_sufficient": Variant("real_sufficient", negatives=True, enhanced=True, matched=True, sufficient=True),
}

# The answer a row's completion is written in (`--interface`): ``json`` is SPEC §3's JSON object with
# citations (the paper's rows); ``codes`` and ``labels`` are the evaluation-choice study's bare answers
# (SPEC §10, data_prep/study_prompts.py), rendered exactly as `fae study` asks them; ``study`` writes both
# rows for every example. Each name maps to the study formats it writes (none: the JSON rows).
INTERFACES: dict[str, tuple[str, ...]] = {"json": (), "codes": ("codes",), "labels": ("labels",),
                                          "study": ("codes", "labels")}
DEFAULT_INTERFACE = "json"

POSITIVE = "positive"
NEGATIVE = "negative"
MATCHED_POSITIVE = "matched_positive"
EVIDENCE_POSITIVE = "evidence_positive"
SUFFICIENT_POSITIVE = "sufficient_positive"
SHORT_NEGATIVE = "short_negative"
# Kinds whose pool is the full pool minus ``removed_ids``, drawn outside the evidence, label kept.
_KEEPING_KINDS = (MATCHED_POSITIVE, EVIDENCE_POSITIVE, SUFFICIENT_POSITIVE)
LENGTH_PERCENTILES = (50, 90, 95, 99, 100)


class MissingEnhancedEvidence(ValueError):
    """The variant needs ``enhanced_evidence`` and some records lack it.

    ``missing`` keeps file order, so ``missing[0]`` is the first offending
    record; :meth:`located` names its file and line.
    """

    def __init__(self, variant: str, missing: Sequence[str], total: int, where: str | None = None):
        self.variant = variant
        self.missing = list(missing)
        self.total = total
        self.where = where
        prefix = f"{where}: " if where else ""
        super().__init__(
            f"{prefix}record {self.missing[0]!r}: field 'enhanced_evidence': missing, and variant "
            f"{variant!r} needs it ({len(self.missing)} of {total} SUPPORT/REFUTE records have no "
            "'enhanced_evidence'); run `real-data enhance` on them first or use a gold-evidence "
            "variant (sft, no_enhancement)"
        )

    def located(self, path, line: int | None) -> "MissingEnhancedEvidence":
        """The same error naming where the first offending record is (``path:line``, or ``path`` alone)."""
        where = f"{path}:{line}" if line is not None else str(path)
        return MissingEnhancedEvidence(self.variant, self.missing, self.total, where)


class UnknownStudyDataset(ValueError):
    """A record's ``dataset`` has no answer strings in the evaluation-choice study, so a study interface
    cannot render it. :meth:`located` names the record's file and line."""

    def __init__(self, record_id: str, dataset: str, interface: str, where: str | None = None):
        self.record_id = record_id
        self.dataset = dataset
        self.interface = interface
        prefix = f"{where}: " if where else ""
        super().__init__(
            f"{prefix}record {record_id!r}: field 'dataset': {dataset!r} has no answer strings in the "
            f"evaluation-choice study (known: {', '.join(STUDY_DATASETS)}), so --interface {interface} "
            "cannot render it"
        )

    def located(self, path, line: int | None) -> "UnknownStudyDataset":
        """The same error, said at ``path:line`` of the records file (the file alone when the line is unknown)."""
        where = f"{path}:{line}" if line is not None else str(path)
        return UnknownStudyDataset(self.record_id, self.dataset, self.interface, where)


def check_interface(interface: str, where: str = "interface", error: type[Exception] = ValueError) -> tuple[str, ...]:
    """The study formats ``interface`` writes (empty: the JSON rows); ``error`` naming the choices else."""
    if interface not in INTERFACES:
        raise error(f"{where} {interface!r}: choose {', '.join(INTERFACES)}")
    return INTERFACES[interface]


def check_study_datasets(records: Sequence[ClaimRecord], interface: str) -> None:
    """Fail on the first trainable record (file order) whose dataset the study has no strings for."""
    if not INTERFACES[interface]:
        return
    for rec in records:
        if rec.label != NOT_ENOUGH_INFO and rec.dataset not in STUDY_DATASETS:
            raise UnknownStudyDataset(rec.id, rec.dataset, interface)


def study_row(row: dict, record: ClaimRecord, fmt: str) -> dict:
    """``row`` (a JSON-interface row of ``record``) asked in the study format ``fmt``.

    The prompt is :func:`~data_prep.study_prompts.render_study_prompt` of the row's pool in the record's
    order, lines numbered 0..n-1 as the study numbers them, the completion the one answer string that
    ``fmt`` reads back as the row's label (no citations: the interface has none). The metadata columns
    stay (``evidence`` and ``pool_ids`` in record ids), plus ``format``.
    """
    answer_format = STUDY_FORMATS[fmt]
    keep = set(row["pool_ids"])
    units = [s for s in record.sentences if s.id in keep]
    return {
        **row,
        "prompt": render_study_prompt(record.claim, units, answer_format, record.dataset),
        "completion": [{"role": "assistant", "content": answer_format.answer(row["label"], record.dataset)}],
        "format": fmt,
    }


def get_variant(name: str) -> Variant:
    """The training-set variant named ``name``; an unknown name is a ValueError listing the known ones."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; expected one of {', '.join(VARIANTS)}") from None


def train_evidence(record: ClaimRecord, variant: str | Variant) -> list[int]:
    """``E_train`` of a record: gold ``E*`` or ``enhanced_evidence`` (sorted ids)."""
    v = variant if isinstance(variant, Variant) else get_variant(variant)
    if v.enhanced:
        if record.enhanced_evidence is None:
            raise MissingEnhancedEvidence(v.name, [record.id], 1)
        return sorted(set(record.enhanced_evidence))
    return record.gold_ids


def check_records(records: Sequence[ClaimRecord], variant: str | Variant) -> None:
    """Fail once, up front, if the variant needs enhanced evidence that is missing."""
    v = variant if isinstance(variant, Variant) else get_variant(variant)
    if not v.enhanced:
        return
    trainable = [r for r in records if r.label != NOT_ENOUGH_INFO]
    missing = [r.id for r in trainable if r.enhanced_evidence is None]
    if missing:
        raise MissingEnhancedEvidence(v.name, missing, len(trainable))


def make_pair(record: ClaimRecord, kind: str, variant: str | Variant, e_train: Sequence[int], *,
              line_ids: str = DEFAULT_LINE_IDS, removed_ids: Sequence[int] | None = None) -> dict:
    """One prompt-completion row, its lines numbered by ``line_ids`` (SPEC §3).

    Under ``original`` the ids in an ablated pool keep their numbers; under
    ``renumbered`` the lines shown are 0..n-1. The completion cites the numbers
    the prompt shows, while the ``evidence`` and ``pool_ids`` columns keep
    record ids, so a row can be traced back to its record whatever the prompt
    showed. ``removed_ids``: the sentences a MATCHED_POSITIVE leaves out.

    Columns are added only where they tell something: ``line_ids`` when it is
    not the default (a pair file without the column is ``original``, as every
    file made before the flag is) and ``removed_ids`` on every row of a matched
    variant. A paper variant under ``original`` thus writes the same bytes as
    before, and all rows of one build have the same columns (HF datasets
    takes its columns from the first row).
    """
    v = variant if isinstance(variant, Variant) else get_variant(variant)
    if kind == POSITIVE:
        pool = record.pool_ids
        label, evidence = record.label, sorted(e_train)
    elif kind == NEGATIVE:
        removed = set(e_train)
        pool = [i for i in record.pool_ids if i not in removed]
        label, evidence = NOT_ENOUGH_INFO, []
    elif kind in _KEEPING_KINDS:
        if removed_ids is None:
            raise ValueError(f"a {kind} row needs the ids it removes (removed_ids)")
        removed = set(removed_ids)
        if removed & (set(e_train) | set(record.gold_ids)):
            raise ValueError(f"record {record.id!r}: a {kind} row must keep E_train and E*")
        pool = [i for i in record.pool_ids if i not in removed]
        label, evidence = record.label, sorted(e_train)
    elif kind == SHORT_NEGATIVE:
        if removed_ids is None:
            raise ValueError("a short negative needs the ids it removes (removed_ids)")
        removed = set(removed_ids)
        if not (set(e_train) | set(record.gold_ids)) & set(record.pool_ids) <= removed:
            raise ValueError(f"record {record.id!r}: a short negative must remove E_train and E*")
        pool = [i for i in record.pool_ids if i not in removed]
        label, evidence = NOT_ENOUGH_INFO, []
    else:
        raise ValueError(f"unknown pair kind {kind!r}")
    shown = shown_pool(record, pool, line_ids)
    row = {
        "prompt": render_evidence_prompt(record, pool, line_ids),
        "completion": [{"role": "assistant", "content": format_answer(label, shown_evidence(shown, evidence))}],
        "record_id": record.id,
        "dataset": record.dataset,
        "kind": kind,
        "variant": v.name,
        "label": label,
        "evidence": list(evidence),
        "pool_ids": list(pool),
    }
    if line_ids != DEFAULT_LINE_IDS:
        row["line_ids"] = line_ids
    if v.matched:
        row["removed_ids"] = sorted(removed_ids or []) if kind in (*_KEEPING_KINDS, SHORT_NEGATIVE) else []
    return row


def sufficiency_removals(record: ClaimRecord, e_train: Sequence[int], seed: int | None) -> dict[str, list[int] | None]:
    """The lines each sufficiency row leaves out (None: the pool is too small for that row).

    ``evidence_positive`` keeps ``E_train`` ∪ ``E*`` alone; ``sufficient_positive`` keeps it plus m others,
    m uniform in 1 .. (others − 1); ``short_negative`` removes it and keeps m of the others, m uniform in
    1 .. (others − 1). Each draw has its own stream, seeded by (seed, record id, kind) only.
    """
    keep = set(e_train) | set(record.gold_ids)
    evidence = [i for i in record.pool_ids if i in keep]
    others = [i for i in record.pool_ids if i not in keep]
    base = 0 if seed is None else seed

    def rng(kind: str) -> random.Random:
        return keyed_rng(base, record.id, kind)

    out: dict[str, list[int] | None] = {EVIDENCE_POSITIVE: sorted(others) if evidence and others else None,
                                        SUFFICIENT_POSITIVE: None, SHORT_NEGATIVE: None}
    if evidence and len(others) >= 2:
        r = rng(SUFFICIENT_POSITIVE)
        kept = set(r.sample(others, r.randint(1, len(others) - 1)))
        out[SUFFICIENT_POSITIVE] = sorted(i for i in others if i not in kept)
        r = rng(SHORT_NEGATIVE)
        kept = set(r.sample(others, r.randint(1, len(others) - 1)))
        out[SHORT_NEGATIVE] = sorted([*evidence, *(i for i in others if i not in kept)])
    return out


def matched_removal(record: ClaimRecord, e_train: Sequence[int], seed: int | None) -> list[int] | None:
    """The sentences a matched positive leaves out, or None when too few can go.

    As many as the negative removes (the pool ids in ``E_train``), drawn from
    the pool outside ``E_train`` ∪ ``E*`` so the positive's target still holds.
    The draw is seeded by ``seed`` (None: 0) and the record id only, so it does
    not depend on the file's order, on shuffling or on the other records.
    """
    train = set(e_train)
    keep = train | set(record.gold_ids)
    k = sum(1 for i in record.pool_ids if i in train)
    candidates = [i for i in record.pool_ids if i not in keep]
    if k > len(candidates):
        return None
    rng = keyed_rng(0 if seed is None else seed, record.id)
    return sorted(rng.sample(candidates, k))


def ordered_rows(units: list[list[dict]], seed: int | None, keep_pairs_together: bool) -> list[dict]:
    """The rows of every record's ``units`` in file order (``seed`` None), shuffled with
    ``random.Random(seed)``, or, ``keep_pairs_together``, with the records shuffled and each one's rows kept
    together in order."""
    if keep_pairs_together:
        if seed is not None:
            random.Random(seed).shuffle(units)
        return [row for unit in units for row in unit]
    rows = [row for unit in units for row in unit]
    if seed is not None:
        random.Random(seed).shuffle(rows)
    return rows


def build_pairs(
    records: Iterable[ClaimRecord],
    variant: str,
    *,
    seed: int | None = 42,
    keep_pairs_together: bool = False,
    line_ids: str = DEFAULT_LINE_IDS,
    interface: str = DEFAULT_INTERFACE,
) -> tuple[list[dict], dict]:
    """Training rows for ``variant`` and counts of what was skipped.

    NOT_ENOUGH_INFO records are skipped (SPEC §1). ``seed=None`` keeps record
    order (positive, negative, matched positive); otherwise rows are shuffled
    with ``random.Random(seed)`` so the same input always gives the same file.
    ``keep_pairs_together`` shuffles records instead of rows: each record's
    rows stay together, its positive right before its negative, so a
    sequentially sampled batch (``train_sampling_strategy: sequential``) shows
    the same claim with and without its evidence, the contrast REAL teaches.
    A matched variant's record whose pool has fewer sentences outside
    ``E_train`` ∪ ``E*`` than its negative removes gets no matched positive
    (counted in ``dropped.too_few_matched_lines``).
    ``interface`` (:data:`INTERFACES`): a study interface writes each of these rows once per study format,
    as :func:`study_row`, its lines numbered as the study numbers them whatever ``line_ids`` says.
    """
    v = get_variant(variant)
    check_line_ids(line_ids, "line_ids")
    formats = check_interface(interface)
    records = list(records)
    check_records(records, v)
    if formats:
        check_study_datasets(records, interface)
        line_ids = STUDY_LINE_IDS
    units: list[list[dict]] = []  # one record's rows
    unit_records: list[ClaimRecord] = []
    skipped_nei = 0
    dropped_empty = 0
    too_few_matched = 0
    too_small: dict[str, int] = {EVIDENCE_POSITIVE: 0, SUFFICIENT_POSITIVE: 0, SHORT_NEGATIVE: 0}
    for rec in records:
        if rec.label == NOT_ENOUGH_INFO:
            skipped_nei += 1
            continue
        e_train = train_evidence(rec, v)
        unit = [make_pair(rec, POSITIVE, v, e_train, line_ids=line_ids)]
        units.append(unit)
        unit_records.append(rec)
        if v.negatives:
            if set(rec.pool_ids) <= set(e_train):
                dropped_empty += 1
                continue
            unit.append(make_pair(rec, NEGATIVE, v, e_train, line_ids=line_ids))
        if v.matched:
            removed = matched_removal(rec, e_train, seed)
            if removed is None:
                too_few_matched += 1
            else:
                unit.append(make_pair(rec, MATCHED_POSITIVE, v, e_train, line_ids=line_ids, removed_ids=removed))
        if v.sufficient:
            for kind, removed in sufficiency_removals(rec, e_train, seed).items():
                if removed is None:
                    too_small[kind] += 1
                else:
                    unit.append(make_pair(rec, kind, v, e_train, line_ids=line_ids, removed_ids=removed))
    if formats:
        units = [[study_row(row, rec, f) for row in unit for f in formats] for rec, unit in zip(unit_records, units)]
    rows = ordered_rows(units, seed, keep_pairs_together)
    dropped = {"empty_ablated_pool": dropped_empty}
    if v.matched:
        dropped["too_few_matched_lines"] = too_few_matched
    if v.sufficient:
        dropped.update({f"too_small_for_{kind}": n for kind, n in too_small.items()})
    info = {
        "records": len(records),
        "skipped_not_enough_info_records": skipped_nei,
        "dropped": dropped,
    }
    return rows, info


# ---------------------------------------------------------------------------
# Token lengths
# ---------------------------------------------------------------------------

def token_lengths(rows: Sequence[dict], tokenizer, batch_size: int = 256, progress: bool = False) -> list[int]:
    """Tokens of prompt + completion exactly as TRL's SFTTrainer tokenizes them.

    TRL applies the chat template to ``prompt + completion`` (no generation
    prompt), so that sequence's length is what ``max_length`` truncates.
    """
    out: list[int] = []
    it = progress_bar(range(0, len(rows), batch_size), enabled=progress, desc="measuring token lengths",
                      unit="batch")
    for start in it:
        batch = rows[start:start + batch_size]
        convs = [list(r["prompt"]) + list(r["completion"]) for r in batch]
        enc = tokenizer.apply_chat_template(convs, tokenize=True, return_dict=True)
        out.extend(len(ids) for ids in enc["input_ids"])
    return out


def drop_over_length(rows: Sequence[dict], lengths: Sequence[int], max_length: int) -> tuple[list[dict], int]:
    """Keep rows that fit ``max_length``: truncation would cut off the answer."""
    kept = []
    dropped = 0
    for row, n in zip(rows, lengths, strict=True):
        if n > max_length:
            dropped += 1
        else:
            kept.append({**row, "n_tokens": int(n)})
    return kept, dropped


def percentiles(values: Sequence[float], qs: Sequence[int] = LENGTH_PERCENTILES) -> dict:
    """Nearest-rank percentiles (p100 = max); empty input gives an empty dict."""
    if not values:
        return {}
    s = sorted(values)
    out = {}
    for q in qs:
        k = max(0, min(len(s) - 1, -(-q * len(s) // 100) - 1))
        out[f"p{q}"] = s[k]
    out["mean"] = round(sum(s) / len(s), 2)
    return out


def pair_stats(rows: Sequence[dict], info: dict, *, over_length: int | None = None,
               max_length: int | None = None, tokenizer: str | None = None) -> dict:
    """The ``stats.json`` summary: counts per kind and label, lengths, drops."""
    by_kind: dict[str, int] = {}
    by_kind_label: dict[str, dict[str, int]] = {}
    for r in rows:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + 1
        lab = by_kind_label.setdefault(r["kind"], {})
        lab[r["label"]] = lab.get(r["label"], 0) + 1
    dropped = dict(info.get("dropped", {}))
    if over_length is not None:
        dropped["over_max_length"] = over_length
    stats = {
        "pairs": len(rows),
        "records": info.get("records"),
        "skipped_not_enough_info_records": info.get("skipped_not_enough_info_records", 0),
        "by_kind": by_kind,
        "by_kind_and_label": by_kind_label,
        "dropped": dropped,
        "length_chars": percentiles(
            [sum(len(m["content"]) for m in r["prompt"] + r["completion"]) for r in rows]
        ),
    }
    if any("format" in r for r in rows):
        stats["by_format"] = {f: sum(1 for r in rows if r.get("format") == f)
                              for f in sorted({r["format"] for r in rows if "format" in r})}
    if any("n_tokens" in r for r in rows) or tokenizer is not None:
        stats["length_tokens"] = percentiles([r["n_tokens"] for r in rows if "n_tokens" in r])
        stats["tokenizer"] = tokenizer
        stats["max_length"] = max_length
    return stats
