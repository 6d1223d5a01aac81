"""The grid of the evaluation-choice study (SPEC §10): its units, read from retrieved pools, and every
condition each unit is asked in, primary and control, in one fixed order.

A *unit* is one pool of `real-data retrieve` (one claim; SciFact one claim x one abstract): a line of
``records.jsonl``, or a pool of ``misses.jsonl`` (a SUPPORT/REFUTE pool that holds no complete gold
group is no valid record, but it is still asked and scored: a retrieval miss must cost what it costs).
Its conditions are source (0 BM25, 1 the reranker) x budget (the packed budgets) x format (codes,
labels) x replicate (greedy, then the seeds), then the greedy controls of the hash-selected claims.

The order of :func:`conditions` is the order of the responses file: a resumed run continues it where
it stopped, so a run killed at any moment and resumed writes the same bytes as one that never stopped.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from real_fae_core.errors import UserError
from real_fae_core.jsonl import RecordError, iter_jsonl_lines
from real_fae_core.hashing import derived_seed, sha256_file, sha256_text
from real_fae_core.labels import LABELS
from fae.study.interfaces import FORMATS, study_dataset

RECORDS = "records.jsonl"
MISSES = "misses.jsonl"
CONTROLS = ("claim_only", "mapping", "swap", "order", "gold")
ORDER_VARIANTS = 5  # distinct non-identity orders of the reorder control (the paper's five)
CONTROL_CLAIMS = 64  # hash-selected claims a dataset (SPEC §10)


@dataclass(frozen=True)
class Sentence:
    """One unit of evidence as shown (:class:`fae.study.interfaces.Unit`)."""

    id: int
    text: str
    doc: str | None


@dataclass
class StudyUnit:
    """One pool: the claim, its gold, its sentences, the two orderings and what each budget keeps."""

    id: str
    claim_id: str
    dataset: str
    claim: str
    gold_label: str
    groups: list[list[int]]
    sentences: dict[int, Sentence]
    orderings: list[list[int]]
    packed: dict[int, list[list[int]]]
    document: str | None
    from_misses: bool = False

    def shown(self, source: int, budget: int) -> list[int]:
        """The sentence ids ordering ``source`` (0 BM25, 1 the reranker) keeps within ``budget`` tokens, in order
        (a copy); KeyError for a budget the pool was not packed for."""
        return list(self.packed[budget][source])


@dataclass
class Pools:
    """The units of one pools directory, the gold abstracts no pool holds (SciFact's R) and the inputs' hash."""

    dataset: str
    units: list[StudyUnit]
    budgets: list[int]
    n_sources: int
    missed_relevant: dict[str, int]  # claim id -> gold abstracts no pool holds (SciFact: they stay in R)
    sha256: str
    path: str
    notes: list[str] = field(default_factory=list)


def _unit(obj: Any, where: str, from_misses: bool) -> StudyUnit:
    """A unit from a record dict; a field the study needs, missing or wrong, is one line naming it."""
    try:
        retrieval = obj["retrieval"]
        sentences = {int(s["id"]): Sentence(int(s["id"]), str(s["text"]), s.get("doc")) for s in obj["sentences"]}
        orderings = [[int(i) for i in o] for o in retrieval["orderings"]]
        packed = {int(b): [[int(i) for i in ids] for ids in per] for b, per in (retrieval.get("packed") or {}).items()}
        groups = [[int(i) for i in g] for g in obj.get("evidence") or []]
        claim_id = str(obj.get("claim_id") or obj["id"])
        docs = {s.doc for s in sentences.values()}
        return StudyUnit(id=str(obj["id"]), claim_id=claim_id, dataset=str(obj["dataset"]), claim=str(obj["claim"]),
                         gold_label=str(obj["label"]), groups=groups, sentences=sentences, orderings=orderings,
                         packed=packed, document=next(iter(docs)) if len(docs) == 1 else None,
                         from_misses=from_misses)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{where}: not a pool of `real-data retrieve` ({type(exc).__name__}: {exc})") from None


def _lines(path: Path) -> Iterator[tuple[int, Any]]:
    for n, value in iter_jsonl_lines(path):  # the one reader: encoding and surrogates named by line
        if isinstance(value, RecordError):
            raise value.located(path, n)
        yield n, value


def load_pools(directory: str | Path) -> Pools:
    """The units of ``directory`` (records.jsonl, then the pools of misses.jsonl), checked as one study.

    Bad input, one line each: no records file, no misses file (the missed gold would go uncounted), a unit
    without budgets, pools of two datasets (one study
    run is one dataset: one corpus, one metric), a budget or ordering some units lack, a dataset
    without label strings.
    """
    directory = Path(directory)
    records, misses = directory / RECORDS, directory / MISSES
    if not records.is_file():
        raise UserError(f"--pools {directory}: no {RECORDS} (give an output directory of `real-data retrieve`)")
    if not misses.is_file():  # retrieve always writes it (empty when nothing was missed)
        raise UserError(f"--pools {directory}: no {MISSES} beside {RECORDS}: without it the missed gold (pools "
                        "without a complete gold group, gold abstracts no pool holds) would go uncounted and recall "
                        "would look better; give the whole output directory of `real-data retrieve`")
    units = [_unit(obj, f"{records}:{n}", False) for n, obj in _lines(records)]
    missed_relevant: dict[str, int] = {}
    for n, obj in _lines(misses):
        if not isinstance(obj, dict):
            raise UserError(f"{misses}:{n}: not a line of `real-data retrieve`'s misses (a JSON object)")
        units += [_unit(p, f"{misses}:{n}", True) for p in obj.get("pools") or []]
        if obj.get("missed_docs"):
            missed_relevant[str(obj["claim_id"])] = len(obj["missed_docs"])
    units.sort(key=lambda u: _unit_order(u))
    if not units:
        raise UserError(f"{records}: no pools")
    datasets = sorted({u.dataset for u in units})
    if len(datasets) > 1:
        raise UserError(f"--pools {directory} mixes datasets {', '.join(datasets)}: one study run is one dataset")
    study_dataset(datasets[0])  # label strings known, else one line
    budgets = sorted(units[0].packed)
    n_sources = len(units[0].orderings)
    for u in units:
        if sorted(u.packed) != budgets or not budgets:
            raise UserError(f"--pools {directory}: unit {u.id} has budgets {sorted(u.packed)}, unit {units[0].id} "
                            f"{budgets} (pack every pool with the same --budgets)")
        if len(u.orderings) != n_sources:
            raise UserError(f"--pools {directory}: unit {u.id} has {len(u.orderings)} orderings, "
                            f"unit {units[0].id} {n_sources} (retrieve every pool with the same --reranker)")
    sha = sha256_text(sha256_file(records) + sha256_file(misses))
    notes = [] if n_sources > 1 else ["no reranker ordering in the pools: source 1 skipped, no S_ab table"]
    return Pools(datasets[0], units, budgets, n_sources, missed_relevant, sha, str(directory), notes)


def _unit_order(u: StudyUnit) -> tuple:
    """Units in claim order as retrieval wrote them: records and missed pools of a claim together."""
    return (u.claim_id, u.id)


# ---------------------------------------------------------------------------
# conditions
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """One prompt of one unit. ``control`` None is the primary grid; a control's ``variant`` names it."""

    unit: str
    kind: str  # "primary" or "control"
    source: int | None
    budget: int | None
    format: str
    replicate: int
    control: str | None = None
    variant: str | None = None

    @property
    def key(self) -> tuple:
        """Every field, in a fixed order: what identifies the condition's response line (resume, merge)."""
        return (self.unit, self.kind, self.source, self.budget, self.format, self.replicate, self.control,
                self.variant)


def key_of(line: dict) -> tuple:
    """The :attr:`Condition.key` of a responses line."""
    return (line["unit"], line["kind"], line["source"], line["budget"], line["format"], line["replicate"],
            line["control"], line["variant"])


def primary_conditions(unit: StudyUnit, sources: Sequence[int], budgets: Sequence[int], formats: Sequence[str],
                       replicates: Sequence[int]) -> list[Condition]:
    """Source x budget x format x replicate: the replicates of one condition adjacent, so the prompts that
    share everything but the decoding run in one batch."""
    return [Condition(unit.id, "primary", s, b, f, r)
            for s, b, f, r in itertools.product(sources, budgets, formats, replicates)]


def sample_claims(units: Sequence[StudyUnit], n: int, family_of_unit: dict[str, str]) -> list[str]:
    """At least ``n`` claims taken as whole families, families in the order of a hash of (dataset, family).

    A family (``real-data families``: paraphrases, mutations, shared cited documents) is resampled whole
    by the report's bootstrap, so a subset that split one would misstate the interval; a claim whose
    units the file does not list is a family of its own. Families are taken until ``n`` claims are
    reached, so the last one can take the count past ``n``.
    """
    family: dict[str, str] = {}
    for u in units:
        if u.id in family_of_unit:
            family.setdefault(u.claim_id, "f:" + family_of_unit[u.id])
    members: dict[str, list[str]] = {}
    for claim in dict.fromkeys(u.claim_id for u in units):
        members.setdefault(family.get(claim, "claim:" + claim), []).append(claim)
    dataset = units[0].dataset if units else ""
    chosen: list[str] = []
    for name in sorted(members, key=lambda f: (derived_seed("sample", dataset, f), f)):
        if len(chosen) >= n:
            break
        chosen += members[name]
    return sorted(chosen)


def control_claims(units: Sequence[StudyUnit], n: int) -> list[str]:
    """The ``n`` claims of the controls: the first by a hash of (dataset, claim id), not by position."""
    claims = sorted({u.claim_id for u in units}, key=lambda c: (derived_seed("controls", units[0].dataset, c), c))
    return sorted(claims[:n])


def non_identity_orders(n: int, unit: str, source: int, budget: int, k: int = ORDER_VARIANTS) -> list[list[int]]:
    """``k`` distinct non-identity permutations of ``range(n)``, drawn by a hash of the condition; fewer
    when fewer exist (the control is then infeasible, recorded)."""
    if n < 2:
        return []
    out: list[list[int]] = []
    attempt = 0
    limit = 1
    for i in range(2, n + 1):
        limit *= i
    while len(out) < min(k, limit - 1) and attempt < 1000:
        seed = derived_seed("order", unit, source, budget, attempt)
        perm = sorted(range(n), key=lambda i: derived_seed(seed, i))
        if perm != list(range(n)) and perm not in out:
            out.append(perm)
        attempt += 1
    return out


def mapping_orders() -> list[tuple[str, ...]]:
    """The five non-identity code mappings (every permutation of the three labels but the canonical)."""
    return [p for p in itertools.permutations(LABELS) if p != tuple(LABELS)]


def control_conditions(unit: StudyUnit, sources: Sequence[int], budgets: Sequence[int],
                       formats: Sequence[str]) -> list[Condition]:
    """The greedy controls of one selected unit, in a fixed order (feasibility is decided when prompted)."""
    out = [Condition(unit.id, "control", None, None, f, 0, "claim_only") for f in formats]
    for s, b in itertools.product(sources, budgets):
        if "codes" in formats:
            out += [Condition(unit.id, "control", s, b, "codes", 0, "mapping", "".join(x[0] for x in order))
                    for order in mapping_orders()]
        for f in formats:
            out.append(Condition(unit.id, "control", s, b, f, 0, "swap"))
            out += [Condition(unit.id, "control", s, b, f, 0, "order", str(v)) for v in range(ORDER_VARIANTS)]
    out += [Condition(unit.id, "control", None, b, f, 0, "gold") for b in budgets for f in formats]
    return out


def check_formats(formats: Sequence[str]) -> list[str]:
    """The formats in the canonical order; an unknown or repeated one is one line."""
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats or len(set(formats)) != len(formats):
        raise UserError(f"--formats {' '.join(formats)}: give codes and/or labels, each once")
    return [f for f in FORMATS if f in formats]
