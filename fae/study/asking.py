"""Asking the grid: each condition's prompt and decoding, answered in batches across units, appended as it goes.

A condition's prompt is :func:`fae.study.interfaces.render_study_prompt` of what it shows: the packed
units of its source and budget (primary), nothing (claim only), another selected claim's units (swap),
the same units in another order (order), the complete gold group where it fits the budget (gold), or
the codes under a permuted mapping (mapping). A control that cannot be built (no gold group, a group over
the budget, fewer distinct orders than asked) is written as infeasible with its reason, never dropped
silently. Batches mix conditions of many units: the sampled rows draw from their own seeds
(``Backend.generate_rows``), so a batch's composition changes no sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from real_fae_core import progress as bars
from real_fae_core.labels import LABELS
from fae.backends import RowDecoding, as_generation
from fae.study.grid import Condition, StudyUnit, mapping_orders, non_identity_orders
from fae.study.interfaces import CodesFormat, answer_format, render_study_prompt, submitted_evidence
from fae.study.replicates import Replicate, SamplingParams, row_decoding

INFEASIBLE = "INFEASIBLE"


@dataclass
class Asker:
    """What a condition needs beyond its unit: the replicates' seeds, the swap partners, token counts."""

    dataset: str
    units: dict[str, StudyUnit]
    replicates: dict[int, Replicate]
    params: SamplingParams
    swap_partner: dict[str, str] = field(default_factory=dict)
    token_length: Callable[[Sequence[str]], int] | None = None  # the most tokens any study tokenizer counts

    def shown(self, c: Condition) -> tuple[StudyUnit, list[int], str | None]:
        """(the unit whose sentences are shown, their ids in order, why infeasible or None)."""
        unit = self.units[c.unit]
        if c.control == "claim_only":
            return unit, [], None
        if c.control == "swap":
            partner = self.units.get(self.swap_partner.get(c.unit, ""))
            if partner is None:
                return unit, [], "no other claim to swap evidence with"
            return partner, partner.shown(c.source, c.budget), None
        if c.control == "gold":
            return unit, *self.gold_shown(unit, c.budget)
        ids = unit.shown(c.source, c.budget)
        if c.control == "order":
            orders = non_identity_orders(len(ids), unit.id, c.source, c.budget)
            v = int(c.variant)
            if v >= len(orders):
                return unit, [], f"{len(orders)} distinct non-identity orders of {len(ids)} units"
            return unit, [ids[i] for i in orders[v]], None
        return unit, ids, None

    def gold_shown(self, unit: StudyUnit, budget: int) -> tuple[list[int], str | None]:
        """(the first annotated gold group that fits ``budget`` tokens, None), or ([], why none can be shown):
        no complete group, no tokenizer to count with, or none fits."""
        if not unit.groups:
            return [], "no complete annotated gold group in the pool"
        if self.token_length is None:
            return [], "no tokenizer to count the gold group against the budget (--tokenizer)"
        for group in unit.groups:
            if self.token_length([unit.sentences[i].text for i in group]) <= budget:
                return list(group), None
        return [], f"no gold group fits {budget} tokens"

    def prompt(self, c: Condition) -> tuple[list | None, dict]:
        """(chat messages or None when infeasible, the line's fields that describe what was shown)."""
        holder, ids, why = self.shown(c)
        fmt = answer_format(c.format)
        if c.control == "mapping":
            fmt = CodesFormat(order=mapping_of(c.variant))
        info = {"shown": ids, "shown_from": holder.id if holder.id != c.unit else None}
        if why is not None:
            return None, {**info, "infeasible": why}
        units = [holder.sentences[i] for i in ids]
        info["submitted"] = submitted_evidence(units, self.dataset) if holder.id == c.unit else []
        return render_study_prompt(self.units[c.unit].claim, units, fmt, self.dataset), info

    def decoding(self, c: Condition) -> RowDecoding:
        """How condition ``c``'s prompt is decoded: greedy for replicate 0, else sampled from the seed that
        its replicate, claim and document name."""
        unit = self.units[c.unit]
        return row_decoding(self.dataset, unit.claim_id, unit.document, self.replicates[c.replicate], self.params)


def mapping_of(variant: str) -> tuple[str, ...]:
    """The label order a mapping control's variant names (the labels' initials, A first)."""
    by_initials = {"".join(x[0] for x in order): order for order in mapping_orders()}
    return by_initials.get(variant, tuple(LABELS))


def response_line(c: Condition, info: dict, decoding: RowDecoding, answer, dataset: str) -> dict:
    """One line of responses.jsonl: the condition, what was shown and submitted, the raw text and its reading."""
    fmt = CodesFormat(order=mapping_of(c.variant)) if c.control == "mapping" else answer_format(c.format)
    line = {"unit": c.unit, "kind": c.kind, "source": c.source, "budget": c.budget, "format": c.format,
            "replicate": c.replicate, "control": c.control, "variant": c.variant, "seed": decoding.seed, **info}
    if answer is None:
        return {**line, "response": None, "finish_reason": None, "answer": INFEASIBLE}
    gen = as_generation(answer)
    return {**line, "response": gen.text, "finish_reason": gen.finish_reason, "answer": fmt.parse(gen.text, dataset)}


def ask(backend, asker: Asker, todo: Sequence[Condition], write: Callable[[list[dict]], None],
        chunk: int, progress=None) -> None:
    """Answer ``todo`` in order, ``chunk`` prompts per backend call, each chunk written when answered."""
    for start in range(0, len(todo), chunk):
        part = todo[start:start + chunk]
        built = [asker.prompt(c) for c in part]
        rows = [(i, msgs) for i, (msgs, _) in enumerate(built) if msgs is not None]
        decodings = [asker.decoding(c) for c in part]
        answers: list = [None] * len(part)
        if rows:
            got = backend.generate_rows([m for _, m in rows], [decodings[i] for i, _ in rows])
            for (i, _), a in zip(rows, got):
                answers[i] = a
        write([response_line(c, info, d, a, asker.dataset)
               for c, (_, info), d, a in zip(part, built, decodings, answers)])
        if progress is not None:
            progress.update(len(part))


def progress_bar(total: int, initial: int, desc: str, enabled: bool):
    """A tqdm bar on a terminal (real_fae_core.progress), nothing elsewhere or when disabled."""
    if not (enabled and bars.show_progress()):
        return None
    return bars.progress_bar(total=total, initial=initial, desc=desc, unit="prompt", mininterval=0.5)
