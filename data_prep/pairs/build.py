"""REAL training pairs (SPEC §4) as TRL conversational prompt-completion rows.

Every variant goes through the same code path; a variant only decides which
evidence set is ``E_train`` (gold ``E*`` or ``enhanced_evidence``) and whether
ablated negatives are added:

==================  =========  =========  ==========
variant             positives  negatives  E_train
==================  =========  =========  ==========
``sft``             yes        no         gold E*
``no_ablation``     yes        no         enhanced
``no_enhancement``  yes        yes        gold E*
``real``            yes        yes        enhanced
==================  =========  =========  ==========

Rows are ``{"prompt": [system, user], "completion": [assistant], ...metadata}``
so TRL's SFTTrainer puts the loss on the completion only, whatever the chat
template (Llama-3.1's template breaks ``assistant_only_loss``).

A negative whose ablated pool ``S \\ E_train`` would be empty is dropped and
counted (``dropped.empty_ablated_pool``): an empty ``Document:`` block teaches
nothing about evidence and never occurs in FAE, whose round r+1 pool is what
is left of round r's pool.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Sequence

from data_prep.prompts import format_answer, render_evidence_prompt
from data_prep.records import NOT_ENOUGH_INFO, ClaimRecord


@dataclass(frozen=True)
class Variant:
    name: str
    negatives: bool
    enhanced: bool


VARIANTS: dict[str, Variant] = {
    "sft": Variant("sft", negatives=False, enhanced=False),
    "no_ablation": Variant("no_ablation", negatives=False, enhanced=True),
    "no_enhancement": Variant("no_enhancement", negatives=True, enhanced=False),
    "real": Variant("real", negatives=True, enhanced=True),
}

POSITIVE = "positive"
NEGATIVE = "negative"
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
        where = f"{path}:{line}" if line is not None else str(path)
        return MissingEnhancedEvidence(self.variant, self.missing, self.total, where)


def get_variant(name: str) -> Variant:
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


def make_pair(record: ClaimRecord, kind: str, variant: str, e_train: Sequence[int]) -> dict:
    """One prompt-completion row; ids in the ablated pool keep their numbers."""
    if kind == POSITIVE:
        pool = record.pool_ids
        label, evidence = record.label, sorted(e_train)
    elif kind == NEGATIVE:
        removed = set(e_train)
        pool = [i for i in record.pool_ids if i not in removed]
        label, evidence = NOT_ENOUGH_INFO, []
    else:
        raise ValueError(f"unknown pair kind {kind!r}")
    return {
        "prompt": render_evidence_prompt(record, pool),
        "completion": [{"role": "assistant", "content": format_answer(label, evidence)}],
        "record_id": record.id,
        "dataset": record.dataset,
        "kind": kind,
        "variant": variant,
        "label": label,
        "evidence": list(evidence),
        "pool_ids": list(pool),
    }


def build_pairs(
    records: Iterable[ClaimRecord],
    variant: str,
    *,
    seed: int | None = 42,
    keep_pairs_together: bool = False,
) -> tuple[list[dict], dict]:
    """Training rows for ``variant`` and counts of what was skipped.

    NOT_ENOUGH_INFO records are skipped (SPEC §1). ``seed=None`` keeps record
    order (positive before negative); otherwise rows are shuffled with
    ``random.Random(seed)`` so the same input always gives the same file.
    ``keep_pairs_together`` shuffles records instead of rows: each record's
    positive stays right before its negative, so a sequentially sampled batch
    (``train_sampling_strategy: sequential``) shows the same claim with and
    without its evidence, the contrast REAL teaches.
    """
    v = get_variant(variant)
    records = list(records)
    check_records(records, v)
    units: list[list[dict]] = []  # one record's rows
    skipped_nei = 0
    dropped_empty = 0
    for rec in records:
        if rec.label == NOT_ENOUGH_INFO:
            skipped_nei += 1
            continue
        e_train = train_evidence(rec, v)
        unit = [make_pair(rec, POSITIVE, v.name, e_train)]
        units.append(unit)
        if v.negatives:
            if set(rec.pool_ids) <= set(e_train):
                dropped_empty += 1
                continue
            unit.append(make_pair(rec, NEGATIVE, v.name, e_train))
    if keep_pairs_together:
        if seed is not None:
            random.Random(seed).shuffle(units)
        rows = [row for unit in units for row in unit]
    else:
        rows = [row for unit in units for row in unit]
        if seed is not None:
            random.Random(seed).shuffle(rows)
    info = {
        "records": len(records),
        "skipped_not_enough_info_records": skipped_nei,
        "dropped": {"empty_ablated_pool": dropped_empty},
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
    it = range(0, len(rows), batch_size)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="measuring token lengths", unit="batch")
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
    if any("n_tokens" in r for r in rows) or tokenizer is not None:
        stats["length_tokens"] = percentiles([r["n_tokens"] for r in rows if "n_tokens" in r])
        stats["tokenizer"] = tokenizer
        stats["max_length"] = max_length
    return stats
