"""The multi-round evidence ablation loop (SPEC §6).

Pure ablation logic (:func:`next_pool`, :func:`make_round`,
:func:`reuse_round`) is kept apart from the loop so it can be unit-tested
without a model. The loop is round-synchronous over a *chunk* of claims: all
claims of the chunk that need a model call at round r go to the backend in
one ``generate`` call (the backend batches, sorts by length, or runs requests
concurrently), then every claim moves to round r+1. :func:`run_ablation`
instead keeps a window of claims in flight at mixed rounds and writes each
claim as soon as it finishes, so a killed run loses at most about one window
(one backend batch by default).

Each round records ``truncated``, whether the backend said the answer was cut
off at ``max_new_tokens`` (absent when it did not say, as in runs made before
backends reported it), and, when the backend computed them, the label
probabilities of soft FAE (``label_probs``, ``label_logprobs``; a reused round
copies them with the answer).

Reuse: when a round cites nothing that is still in the pool (invalid answer,
NEI with no ids, only hallucinated ids), the next pool equals this pool and a
greedy verifier would answer the same prompt identically, so the previous
answer is copied with ``reused: true`` instead of calling the model.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Callable, Iterable, NamedTuple, Protocol, Sequence, get_type_hints

from real_fae_core.command import option
from real_fae_core.hashing import keyed_rng
from real_fae_core.progress import show_progress
from data_prep.prompts import (DEFAULT_LINE_IDS, LINE_IDS, ParsedAnswer, number_lines, parse_answer,
                               parse_shown_answer, render_evidence_prompt)
from data_prep.records import ClaimRecord
from fae.backends import Generation, as_generation

Message = dict[str, str]


class Generator(Protocol):
    def __call__(
        self, prompts: list[list[Message]], callback: Callable[[int], None] | None = None
    ) -> list[Generation | str]: ...


# ---------------------------------------------------------------------------
# pure ablation logic
# ---------------------------------------------------------------------------


def next_pool(pool_ids: Sequence[int], cited: Iterable[int]) -> list[int]:
    """``S^{r+1} = S^r \\ E(r)``: drop cited ids that are in the pool, keep reading order.

    Ids not in the pool (hallucinated or already ablated) remove nothing.
    """
    drop = set(cited)
    return [i for i in pool_ids if i not in drop]


def named_ids_in_order(raw_output: str) -> list[int]:
    """Every id the answer named, in its own order (parsed against an empty pool)."""
    return parse_answer(raw_output, ()).hallucinated


def make_round(r: int, pool_ids: Sequence[int], raw_output: str, truncated: bool | None = None,
               answer: Generation | None = None, line_ids: str = DEFAULT_LINE_IDS) -> dict:
    """One round of the claims.jsonl contract, parsed against the pool it was shown.

    ``truncated``: the answer hit ``max_new_tokens`` (None: the backend did
    not say; the key is then left out). ``answer``: the backend's
    :class:`Generation`, whose label probabilities (soft FAE) are kept as
    ``label_probs`` / ``label_logprobs``, or the reason they are missing as
    ``label_probs_skipped`` (keys absent when the backend computed none).
    ``line_ids``: how the prompt numbered the lines (SPEC §3); cited numbers are
    mapped back to record ids, so every round speaks of record ids whatever was shown.
    """
    parsed, named = parse_shown_answer(raw_output, number_lines(pool_ids, line_ids))
    error = parsed.error
    if truncated and error:
        error = f"answer cut off at max_new_tokens: {error}"
    out = {
        "round": r,
        "pool_ids": list(pool_ids),
        "raw_output": raw_output,
        "label": parsed.label,
        "cited": list(parsed.cited),
        "hallucinated": list(parsed.hallucinated),
        "valid": parsed.valid,
        "reused": False,
        # additions to the contract: ids in citation order (FEVER's first-5 rule) and why invalid
        "evidence": named if parsed.valid else [],
        "error": error,
    }
    if truncated is not None:
        out["truncated"] = bool(truncated)
    if answer is not None and answer.label_probs is not None:
        out["label_probs"] = dict(answer.label_probs)
        if answer.label_logprobs is not None:
            out["label_logprobs"] = dict(answer.label_logprobs)
    elif answer is not None and answer.label_probs_skipped:
        out["label_probs_skipped"] = answer.label_probs_skipped
    return out


def reuse_round(prev: dict, r: int) -> dict:
    """Round ``r`` as a copy of the previous round (same pool, same greedy answer)."""
    out = dict(prev)
    for key in ("pool_ids", "cited", "hallucinated", "evidence"):
        out[key] = list(prev[key])
    out["round"] = r
    out["reused"] = True
    return out


def pool_after(rnd: dict) -> list[int]:
    """The pool the next round sees (an invalid answer removes nothing)."""
    return next_pool(rnd["pool_ids"], rnd["cited"] if rnd["valid"] else ())


def claim_entry(record: ClaimRecord, rounds: list[dict]) -> dict:
    """One claims.jsonl line of a finished claim: its id, gold label and evidence groups, and its rounds."""
    return {
        "id": record.id,
        "gold_label": record.label,
        "gold_groups": [list(g) for g in record.evidence],
        "rounds": rounds,
    }


# ---------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------


def advance(done: list[dict], full_pool: Sequence[int], rounds: int,
            on_reuse: Callable[[int], None] | None = None) -> list[int] | None:
    """Append the reused rounds that follow ``done``; the pool of the next model call, or None when
    all ``rounds + 1`` rounds are done.

    The one definition of the round schedule: round 0 is asked on ``full_pool``; a later round is
    asked on :func:`pool_after` the previous one, unless that pool is unchanged, when the previous
    answer is copied (:func:`reuse_round`) without a model call. ``on_reuse(r)`` reports each
    reused round ``r``. ``fae run`` and the Inspect AI task (``fae.harness``) both step with it.
    """
    while len(done) <= rounds:
        r = len(done)
        if r == 0:
            return full_pool
        prev = done[-1]
        pool = pool_after(prev)
        if pool != prev["pool_ids"]:
            return pool
        done.append(reuse_round(prev, r))
        if on_reuse:
            on_reuse(r)
    return None


# ---------------------------------------------------------------------------
# the arms beside the ablation: control, gold-only, cited-only, size sweep (SPEC §6)
# ---------------------------------------------------------------------------

CONTROL_CHOICES = ("matched", "random", "none")
GAP_KINDS = ("leading", "interior", "trailing")
# Kinds of a removal that a prompt under original line ids shows as a hole in its numbering: lines missing
# at the end leave the numbers 0..m contiguous (nothing shows), lines missing before or between kept ones
# do not.
VISIBLE_GAP_KINDS = ("leading", "interior")



class ArmError(ValueError):
    """An arm given a value it does not take. ``str()`` names the ``fae run`` flag (``--control 'x': choose
    matched, random, none``); ``name``, ``value`` and ``problem`` let another front end (the Inspect AI task)
    say it in its own words; ``choice``: the value is not one of the arm's choices (else: of the wrong type)."""

    def __init__(self, name: str, value: object, problem: str, choice: bool = False):
        super().__init__(f"--{name.replace('_', '-')} {value!r}: {problem}")
        self.name, self.value, self.problem, self.choice = name, value, problem, choice


@dataclass(frozen=True)
class Arms:
    """What FAE asks beside the ablation rounds, and how a prompt numbers its lines.

    Necessity under a control: ``control`` ``matched`` (default) asks, at every round r >= 1, the full pool
    minus as many lines as the ablation has removed by then, drawn (seeded by ``control_seed``, the claim id
    and r) from the lines neither cited in rounds 0..r-1 nor gold, and, where such a draw exists, leaving
    the same kind of gap in the reading order as the ablation's removal (:func:`removal_gap`: none,
    leading, interior, trailing), so that a verifier that abstains on a visible hole in the numbering
    scores the same on both; ``random`` draws without matching the gap (the control of earlier runs);
    ``none`` skips it.

    Sufficiency: ``gold_only`` asks each claim on its gold sentences alone; ``cited_only`` on the lines
    round 0 cited alone (the verifier's own rationale: ERASER's sufficiency); ``size_sweep`` on the gold
    lines plus k other lines, k = 0 .. n - |gold| - 1, the others added one at a time in an order seeded by
    ``sweep_seed`` and the claim id (nested pools: a curve of accuracy against pool size). A pool equal to
    one already answered for the claim copies that answer (``reused``).

    ``line_ids``: ``original`` or ``renumbered`` (SPEC §3). The default is what ``fae run`` does;
    :data:`ABLATION_ONLY` is the ablation alone (the paper's protocol).

    The one declaration of the arms: each field's type, default and help (``fae run --help``) are here, and
    :meth:`__post_init__` is their one check. ``fae run``'s options inherit them (:data:`ArmOptions`), the
    Inspect AI task takes its defaults from :data:`DEFAULT_ARMS` and checks by constructing an ``Arms``,
    and a run's fingerprint (resume, shards, ``fae merge``) compares every field (:data:`ARM_FIELDS`).
    ``control`` and ``line_ids`` are ``str`` with their choices checked here, not ``Literal``: a parser
    built from a ``Literal`` would refuse a wrong choice with its usage text, where ``fae run`` says one line.
    """

    control: str = option("matched", help=(
        "control arm (SPEC §6): matched asks, at every round r >= 1, the full pool minus as many lines as "
        "the ablation removed by then, drawn (seeded) from lines neither cited nor gold and, where it can, "
        "leaving the same kind of gap (none, leading, interior, trailing) as the ablation: IS_ctrl and "
        "IS - IS_ctrl tell evidence from a verifier that abstains whenever a line goes or a number is "
        "missing (about one more call per ablated round); random draws without matching the gap (the "
        "control of earlier versions); none skips it"))
    control_seed: int = option(0, help=(
        "seed of the control's draws (with each claim's id: draws do not depend on order or shards)"))
    gold_only: bool = option(True, help=(
        "also ask each claim on its gold sentences alone (accuracy and NOT_ENOUGH_INFO share beside "
        "round 0; one call per claim); --no-gold-only skips it"))
    cited_only: bool = option(True, help=(
        "also ask each claim on the lines its round-0 answer cited, alone (sufficiency of its own "
        "rationale, beside round 0 on the same claims; at most one call per claim, none where that pool "
        "is the gold-only one or the full pool); --no-cited-only skips it"))
    size_sweep: bool = option(True, help=(
        "also ask each claim on its gold lines plus k other lines, k = 0 .. n - |gold| - 1, added in a "
        "seeded order (accuracy and NOT_ENOUGH_INFO share per k: does the verifier answer on short "
        "pools that hold the proof?); costs n - |gold| - 1 calls per claim of n lines (k = 0 is the "
        "gold-only pool), short prompts; --no-size-sweep skips it"))
    sweep_seed: int = option(0, help="seed of the size sweep's order of added lines (with each claim's id)")
    line_ids: str = option(DEFAULT_LINE_IDS, help=(
        "line numbers shown (SPEC §3): original (record ids, the paper's protocol: a removed line "
        "leaves a hole) or renumbered (0..n-1 in reading order; cited numbers mapped back to record ids)"))

    def __post_init__(self):
        """The one check of the arms: a value an arm does not take is one :class:`ArmError`."""
        if self.control not in CONTROL_CHOICES:
            raise ArmError("control", self.control, f"choose {', '.join(CONTROL_CHOICES)}", choice=True)
        for f in fields(self):
            value, kind = getattr(self, f.name), ARM_TYPES[f.name]
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ArmError(f.name, value, "expected an integer")
            if kind is bool and not isinstance(value, bool):
                raise ArmError(f.name, value, "expected true or false")
        if self.line_ids not in LINE_IDS:
            raise ArmError("line_ids", self.line_ids, f"choose {' or '.join(LINE_IDS)}", choice=True)

    def record(self) -> dict:
        """What config.json records (a resume across any of it is refused); a seed of an arm not asked is None."""
        return {"control": self.control, "control_seed": self.control_seed if self.control != "none" else None,
                "gold_only": self.gold_only, "cited_only": self.cited_only, "size_sweep": self.size_sweep,
                "sweep_seed": self.sweep_seed if self.size_sweep else None, "line_ids": self.line_ids}

    @classmethod
    def from_record(cls, rec: dict) -> "Arms":
        """The arms config.json recorded (a seed recorded as None, for an arm not asked, is 0)."""
        return cls(**{name: (rec[name] if rec.get(name) is not None else getattr(cls, name))
                      for name in ARM_FIELDS if name in rec})


ARM_FIELDS = tuple(f.name for f in fields(Arms))
ARM_TYPES = get_type_hints(Arms)  # {field: its type (str, int, bool)}
DEFAULT_ARMS = Arms()  # what `fae run` and the Inspect AI task ask unless told otherwise
ABLATION_ONLY = Arms(control="none", gold_only=False, cited_only=False, size_sweep=False)
# The arms as options of a command (`fae run`'s RunFields inherit them): Arms' own fields (the same types,
# defaults and help), in a dataclass that is not frozen, as a command's options class (a subclass) cannot be.
ArmOptions = make_dataclass("ArmOptions", [(f.name, ARM_TYPES[f.name], field(default=f.default, metadata=f.metadata))
                                           for f in fields(Arms)])
ArmOptions.__module__ = __name__
ArmOptions.__doc__ = "The arms (:class:`Arms`) as a command's options: the same fields, types, defaults and help."


def removal_gap(full_pool: Sequence[int], pool: Sequence[int]) -> tuple[str, ...]:
    """Where the lines of ``full_pool`` missing from ``pool`` lie in reading order: the kinds of
    :data:`GAP_KINDS` that occur (``leading``: the first line is gone; ``interior``: a line between two
    kept ones; ``trailing``: the last line), ``()`` when none is missing, all three when none is kept."""
    keep = set(pool)
    kept = [k for k, i in enumerate(full_pool) if i in keep]
    n = len(full_pool)
    if len(kept) == n:
        return ()
    if not kept:
        return GAP_KINDS
    lo, hi = kept[0], kept[-1]
    kinds = []
    if lo > 0:
        kinds.append("leading")
    if hi - lo + 1 > len(kept):
        kinds.append("interior")
    if hi < n - 1:
        kinds.append("trailing")
    return tuple(kinds)


def shows_gap(kinds: Sequence[str], line_ids: str = DEFAULT_LINE_IDS) -> bool:
    """Whether a prompt shows a hole in its line numbers: under ``original`` ids a leading or interior
    removal does; under ``renumbered`` ids (0..n-1 always) nothing does."""
    return line_ids == "original" and any(k in VISIBLE_GAP_KINDS for k in kinds)


def control_order(record: ClaimRecord, seed: int) -> list[int]:
    """The claim's seeded order of its lines; the ``random`` control removes the first eligible ones in it.

    Seeded by (seed, claim id) only: a claim's control pools do not depend on the other claims, on the
    order of the file, on shards or on the backend.
    """
    order = sorted(record.pool_ids)
    keyed_rng("fae-control", seed, record.id).shuffle(order)
    return order


def control_removal(full_pool: Sequence[int], ablated_pool: Sequence[int], gold: set,
                    order: Sequence[int]) -> tuple[list[int] | None, int, int]:
    """(ids the ``random`` control removes, or None when too few; how many it must remove; how many it may).

    It removes as many lines as the ablation has (``|S| - |S^r|``), taken in ``order`` from the lines
    still in the ablated pool (never cited in an earlier round) that are not gold.
    """
    need = len(full_pool) - len(ablated_pool)
    still = set(ablated_pool)
    eligible = [i for i in order if i in still and i not in gold]
    if len(eligible) < need:
        return None, need, len(eligible)
    removed = set(eligible[:need])
    return [i for i in full_pool if i in removed], need, len(eligible)


# Above this many candidate draws the matched control samples instead of listing them all.
_MATCH_ENUMERATION_LIMIT = 4096
_MATCH_TRIES = 256


def matched_control_removal(full_pool: Sequence[int], ablated_pool: Sequence[int], gold: set,
                            rng: random.Random, line_ids: str = DEFAULT_LINE_IDS
                            ) -> tuple[list[int] | None, int, int, str | None]:
    """(ids the ``matched`` control removes, or None when too few; how many it must remove; how many it
    may; how the removal matches the ablation's).

    As :func:`control_removal`, but drawn (uniformly, by ``rng``) among the removals that leave the
    ablation's gap: ``"kind"``, the same :func:`removal_gap`; failing that ``"shown"``, a gap that the
    prompt shows exactly when the ablation's does (:func:`shows_gap`; under original ids the ablation of
    a gold first line leaves a leading hole, which a control that may not remove gold matches with an
    interior one); failing both, a uniform draw, ``None`` (unmatched: reported by the control's metrics).
    """
    need = len(full_pool) - len(ablated_pool)
    still = set(ablated_pool)
    eligible = [i for i in full_pool if i in still and i not in gold]
    if len(eligible) < need:
        return None, need, len(eligible), None
    target = removal_gap(full_pool, ablated_pool)
    pick = _draw_with_gap(full_pool, eligible, need, lambda kinds: kinds == target, rng, exact=target)
    if pick is not None:
        return pick, need, len(eligible), "kind"
    shown = shows_gap(target, line_ids)
    pick = _draw_with_gap(full_pool, eligible, need, lambda kinds: shows_gap(kinds, line_ids) == shown, rng)
    if pick is not None:
        return pick, need, len(eligible), "shown"
    return sorted(rng.sample(eligible, need), key=list(full_pool).index), need, len(eligible), None


def _draw_with_gap(full_pool: Sequence[int], eligible: Sequence[int], need: int, wanted: Callable[[tuple], bool],
                   rng: random.Random, exact: tuple[str, ...] | None = None) -> list[int] | None:
    """A removal of ``need`` eligible lines whose :func:`removal_gap` is ``wanted``, drawn uniformly among
    all of them when they are few enough to list, else by rejection; None when none is found. ``exact``
    (a gap kind without an interior hole): such removals are a run at the start plus a run at the end,
    listed directly, which rejection would rarely hit in a long pool."""
    full = list(full_pool)
    n = len(full)

    def gap(removal) -> tuple[str, ...]:
        gone = set(removal)
        return removal_gap(full, [i for i in full if i not in gone])

    if exact is not None and "interior" not in exact:
        lead, trail = "leading" in exact, "trailing" in exact
        runs = []
        for a in range(need + 1):
            b = need - a
            run = full[:a] + full[n - b:]
            if (a > 0) == lead and (b > 0) == trail and a + b < n and all(i in set(eligible) for i in run):
                runs.append(run)
        return list(rng.choice(runs)) if runs else None
    if math.comb(len(eligible), need) <= _MATCH_ENUMERATION_LIMIT:
        options = [list(c) for c in itertools.combinations(eligible, need) if wanted(gap(c))]
        return list(rng.choice(options)) if options else None
    for _ in range(_MATCH_TRIES):
        removal = sorted(rng.sample(list(eligible), need), key=full.index)
        if wanted(gap(removal)):
            return removal
    return None


def sweep_order(record: ClaimRecord, seed: int) -> list[int]:
    """The claim's non-gold lines in the seeded order in which the size sweep adds them to the gold lines.

    Seeded by (seed, claim id) only, as the control's draws are."""
    gold = set(record.gold_ids)
    order = [i for i in record.pool_ids if i not in gold]
    keyed_rng("fae-sweep", seed, record.id).shuffle(order)
    return order


def sweep_pools(record: ClaimRecord, seed: int) -> tuple[list[int], list[list[int]]] | str:
    """(the order of the other lines, the pool of each k = 0 .. n - |gold| - 1 in reading order), or why
    the claim has no sweep (no gold line in its pool; a pool of gold lines only)."""
    gold = set(record.gold_ids) & set(record.pool_ids)
    if not gold:
        return "no gold sentence in the pool"
    order = sweep_order(record, seed)
    if not order:
        return "the pool holds only gold sentences"
    pools = []
    for k in range(len(order)):
        keep = gold | set(order[:k])
        pools.append([i for i in record.pool_ids if i in keep])
    return order, pools


class Request(NamedTuple):
    """One model call of a claim: the arm (``rounds``, ``control``, ``gold_only``, ``cited_only`` or
    ``size_sweep``), its round (the sweep: k) and pool."""

    arm: str
    r: int
    pool: list[int]


class ClaimSchedule:
    """Every question FAE asks about one claim, in the order their pools become known.

    The ablation steps with :func:`advance` (the one round schedule). The control of round r is known
    once the ablation's round-r pool is, so it is asked in the same step; the gold-only, cited-only and
    size-sweep pools are asked with round 1 (or alone after round 0 when R = 0). A question whose pool
    equals one already answered for this claim, or one asked in the same step, copies that answer
    (``reused``), as the ablation does. :meth:`next_requests` gives the next step's calls (none: the claim
    is finished); :meth:`answer` records one.
    """

    def __init__(self, record: ClaimRecord, rounds: int, arms: Arms = ABLATION_ONLY):
        self.record, self.R, self.arms = record, rounds, arms
        self.rounds: list[dict] = []
        self.control: list[dict | None] = []
        self.gold_only: dict | None = None
        self.cited_only: dict | None = None
        self.sweep: dict | None = None
        self._sufficiency_asked = False
        self._order = control_order(record, arms.control_seed) if arms.control == "random" else []
        self._gold = set(record.gold_ids)
        self._pending: list[Request] = []
        self._answered: dict[tuple[int, ...], dict] = {}  # pool -> an answer of this claim on it
        self._waiting: dict[tuple[int, ...], list[Callable[[dict], None]]] = {}  # pool asked this step -> copies
        self._control_extra: dict[int, dict] = {}  # round -> what the control's entry adds (removed, gap_matched)

    def next_requests(self, on_reuse: Callable[[int], None] | None = None) -> list[Request]:
        """The questions of the next step (empty: nothing left to ask); every answer of the previous step must be
        in. A pool already answered for this claim is copied, not asked; ``on_reuse`` goes to :func:`advance`."""
        if self._pending:
            raise RuntimeError(f"claim {self.record.id!r}: {len(self._pending)} answers still missing")
        reqs: list[Request] = []
        self._waiting = {}
        pool = advance(self.rounds, self.record.pool_ids, self.R, on_reuse)
        if pool is not None:
            reqs.append(Request("rounds", len(self.rounds), pool))
            self._waiting[tuple(pool)] = []
        known = [rd["pool_ids"] for rd in self.rounds] + ([pool] if pool is not None else [])
        if self.arms.control != "none":
            for r in range(len(self.control) + 1, len(known)):
                self._control(r, known[r], reqs)
        if self.rounds and not self._sufficiency_asked:
            self._sufficiency_asked = True
            self._sufficiency(reqs)
        self._pending = list(reqs)
        return reqs

    def _ask(self, arm: str, r: int, pool: list[int], reqs: list[Request], store: Callable[[dict], None],
             copy: Callable[[dict], dict]) -> None:
        """Ask ``pool`` for an arm, or copy the answer of the same pool (answered, or asked in this step)."""
        key = tuple(pool)
        if key in self._answered:
            store(copy(self._answered[key]))
        elif key in self._waiting:
            self._waiting[key].append(lambda rnd: store(copy(rnd)))
        else:
            self._waiting[key] = []
            reqs.append(Request(arm, r, list(pool)))

    def _control(self, r: int, ablated: list[int], reqs: list[Request]) -> None:
        full = self.record.pool_ids
        if self.arms.control == "matched":
            rng = keyed_rng("fae-control-matched", self.arms.control_seed, self.record.id, r)
            removed, need, have, matched = matched_control_removal(full, ablated, self._gold, rng,
                                                                   self.arms.line_ids)
        else:
            removed, need, have = control_removal(full, ablated, self._gold, self._order)
            matched = None
        if removed is None:
            self.control.append({"round": r, "skipped": f"{have} lines neither cited nor gold; the ablation "
                                 f"removed {need} by round {r}", "removed_needed": need})
            return
        gone = set(removed)
        pool = [i for i in full if i not in gone]
        extra = {"removed": removed}
        if self.arms.control == "matched":
            extra["gap_matched"] = matched  # "kind", "shown" or None: how the draw matched the ablation's gap
        self._control_extra[r] = extra
        self.control.append(None)  # answered by :meth:`answer` or a copy

        def store(rnd: dict, k: int = r - 1) -> None:
            self.control[k] = rnd

        self._ask("control", r, pool, reqs, store, lambda src: {**reuse_round(src, r), **extra})

    def _sufficiency(self, reqs: list[Request]) -> None:
        """The gold-only, cited-only and size-sweep questions (asked once round 0 is answered)."""
        full = self.record.pool_ids
        if self.arms.gold_only:
            pool = [i for i in full if i in self._gold]
            if not pool:
                self.gold_only = {"skipped": "no gold sentence in the pool"}
            else:
                self._ask("gold_only", 0, pool, reqs, lambda rnd: setattr(self, "gold_only", rnd),
                          lambda src: reuse_round(src, 0))
        if self.arms.cited_only:
            first = self.rounds[0]
            cited = set(first["cited"]) if first["valid"] else set()
            pool = [i for i in full if i in cited]
            if not first["valid"]:
                self.cited_only = {"skipped": "round 0's answer is invalid"}
            elif not pool:
                self.cited_only = {"skipped": "round 0 cited no line of the pool"}
            else:
                self._ask("cited_only", 0, pool, reqs, lambda rnd: setattr(self, "cited_only", rnd),
                          lambda src: reuse_round(src, 0))
        if self.arms.size_sweep:
            plan = sweep_pools(self.record, self.arms.sweep_seed)
            if isinstance(plan, str):
                self.sweep = {"skipped": plan}
                return
            order, pools = plan
            self.sweep = {"order": order, "rounds": [None] * len(pools)}
            for k, pool in enumerate(pools):
                def store(rnd: dict, k: int = k) -> None:
                    self.sweep["rounds"][k] = rnd

                self._ask("size_sweep", k, pool, reqs, store, lambda src, k=k: {**reuse_round(src, 0), "k": k})

    def answer(self, req: Request, got: Generation) -> None:
        """Record the backend's answer ``got`` to ``req`` in its arm (rounds, control, gold-only, cited-only, sweep)."""
        self._pending.remove(req)
        rnd = make_round(req.r, req.pool, got.text, got.truncated, got, self.arms.line_ids)
        key = tuple(req.pool)
        if req.arm == "rounds":
            self.rounds.append(rnd)
        elif req.arm == "control":
            self.control[req.r - 1] = {**rnd, **self._control_extra[req.r]}
        elif req.arm == "gold_only":
            self.gold_only = rnd
        elif req.arm == "cited_only":
            self.cited_only = rnd
        else:
            self.sweep["rounds"][req.r] = {**rnd, "round": 0, "k": req.r}
        self._answered.setdefault(key, rnd)
        for copy in self._waiting.pop(key, []):
            copy(rnd)

    def entry(self) -> dict:
        """The claims.jsonl line: the ablation's rounds, and each arm the schedule asks."""
        out = claim_entry(self.record, self.rounds)
        if self.arms.control != "none":
            out["control"] = list(self.control)
        if self.arms.gold_only:
            out["gold_only"] = self.gold_only
        if self.arms.cited_only:
            out["cited_only"] = self.cited_only
        if self.arms.size_sweep:
            out["size_sweep"] = None if self.sweep is None else {
                k: (list(v) if isinstance(v, list) else v) for k, v in self.sweep.items()}
        return out


CALL_COUNTS = ("model_calls", "reused_calls", "control_calls", "sufficiency_calls")


def call_counts_of(entry: dict) -> dict[str, int]:
    """Model calls and copied answers of one claims.jsonl entry, per arm (run logs and progress):
    ``control_calls`` counts the control's and the gold-only pool's, ``sufficiency_calls`` the cited-only
    pool's and the size sweep's."""
    extra = [c for c in entry.get("control") or [] if c and "skipped" not in c]
    gold = entry.get("gold_only")
    if gold and "skipped" not in gold:
        extra.append(gold)
    sufficiency = [c for c in [entry.get("cited_only")] if c and "skipped" not in c]
    sufficiency += [rd for rd in (entry.get("size_sweep") or {}).get("rounds") or [] if rd]
    return {"model_calls": sum(not rd.get("reused") for rd in entry["rounds"]),
            "reused_calls": sum(bool(rd.get("reused")) for rd in entry["rounds"]),
            "control_calls": sum(not rd.get("reused") for rd in extra),
            "sufficiency_calls": sum(not rd.get("reused") for rd in sufficiency)}


def run_ablation(
    records: Sequence[ClaimRecord],
    generate: Generator,
    rounds: int,
    write: Callable[[list[dict]], None],
    chunk_size: int = 8,
    progress: bool = True,
    desc: str = "",
    arms: Arms = ABLATION_ONLY,
) -> dict[str, int]:
    """Ablate ``records`` with at most ``chunk_size`` claims in flight; write claims as they finish.

    Each step sends the next calls of every claim in flight (its next round and, with ``arms``, that
    round's control and the gold-only pool) to the backend in one ``generate`` call (rounds mix; the
    backend sorts and batches), then hands every newly finished claim to ``write`` — in the order
    claims entered the window, so a claim waits only for earlier claims still in flight — and
    refills the window from the queue. When the window is smaller than the
    input, claims enter it by round-0 prompt length (so batches pad evenly);
    otherwise in input order. With ``chunk_size`` = one backend batch, a killed run
    loses about one batch of claims. Answers do not depend on ``chunk_size``.
    Returns call counts for this invocation (``control_calls``: the control and gold-only calls).
    """
    bars = RoundProgress(len(records), rounds, desc=desc, enabled=progress)
    stats = {"claims": 0, **dict.fromkeys(CALL_COUNTS, 0)}
    on_reuse = lambda r: bars.update(r, 1)  # noqa: E731
    window = max(1, int(chunk_size))
    order = list(range(len(records)))
    if window < len(records):
        # Claims of similar prompt length enter the window together, so a small window still
        # gives the backend evenly padded batches; claims are written in this order.
        order.sort(key=lambda k: _prompt_chars(records[k]))
    queue = iter((pos, records[k]) for pos, k in enumerate(order))
    in_flight: list[tuple[int, ClaimSchedule]] = []
    finished: dict[int, dict] = {}
    next_out = 0
    exhausted = False
    try:
        while True:
            while not exhausted and len(in_flight) < window:
                item = next(queue, None)
                if item is None:
                    exhausted = True
                else:
                    in_flight.append((item[0], ClaimSchedule(item[1], rounds, arms)))
            todo: list[tuple[ClaimSchedule, Request]] = []
            still: list[tuple[int, ClaimSchedule]] = []
            for pos, claim in in_flight:
                reqs = claim.next_requests(on_reuse)
                if not reqs:
                    finished[pos] = claim.entry()
                else:
                    todo.extend((claim, req) for req in reqs)
                    still.append((pos, claim))
            in_flight = still
            ready = []
            while next_out in finished:
                ready.append(finished.pop(next_out))
                next_out += 1
            if ready:
                write(ready)
                stats["claims"] += len(ready)
                for c in ready:
                    for key, n in call_counts_of(c).items():
                        stats[key] += n
            if not todo:
                if exhausted and not in_flight:
                    break
                continue
            prompts = [render_evidence_prompt(c.record, req.pool, arms.line_ids) for c, req in todo]
            outputs = generate(prompts, callback=None)
            if len(outputs) != len(prompts):
                raise RuntimeError(f"backend returned {len(outputs)} answers for {len(prompts)} prompts")
            for (claim, req), raw in zip(todo, outputs):
                claim.answer(req, as_generation(raw))
                if req.arm == "rounds":
                    bars.update(req.r, 1)
    finally:
        bars.close()
    return stats


def ablate(records: Sequence[ClaimRecord], generate: Generator, rounds: int,
           arms: Arms = ABLATION_ONLY) -> list[dict]:
    """Every claim's claims.jsonl entry, in input order, from one window: :func:`run_ablation` in memory."""
    out: list[dict] = []
    run_ablation(records, generate, rounds, out.extend, chunk_size=max(1, len(records)), progress=False, arms=arms)
    return out


def _prompt_chars(record: ClaimRecord) -> int:
    return len(record.claim) + sum(len(s.text) + 8 for s in record.sentences)


class RoundProgress:
    """Per-round progress: tqdm bars on a terminal, plain lines in a log.

    On a terminal each round gets a bar. When stderr is not a terminal (a
    batch job's log), every ``interval`` seconds each round that moved gets one
    line ``round r: done/total claims, rate, ETA`` — no ``\\r`` redraws — and
    a last line per round at the end.
    """

    def __init__(self, total: int, rounds: int, desc: str = "", enabled: bool = True,
                 stream=None, interval: float = 5.0, clock=None, tty: bool | None = None):
        import sys
        import time

        self.total, self.desc, self.enabled = total, desc, enabled and total > 0
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock or time.monotonic
        self.interval = interval
        self.done = [0] * (rounds + 1)
        self.shown = [0] * (rounds + 1)
        self.started = self.last = self.clock()
        if tty is None:
            tty = show_progress(self.stream)
        self.bars = None
        if self.enabled and tty:
            from tqdm.auto import tqdm

            self.bars = [tqdm(total=total, desc=f"{desc}round {r}", position=r, leave=True,
                              dynamic_ncols=True, file=self.stream) for r in range(rounds + 1)]

    def update(self, r: int, n: int) -> None:
        """``n`` more claims finished round ``r``: the bar moves, or a log line is due every ``interval`` seconds."""
        self.done[r] += n
        if self.bars is not None:
            self.bars[r].update(n)
        elif self.enabled and self.clock() - self.last >= self.interval:
            self._lines()

    def line(self, r: int) -> str:
        """Round ``r``'s progress as one log line: ``round r: done/total claims, rate, ETA``."""
        done, elapsed = self.done[r], max(self.clock() - self.started, 1e-9)
        rate = done / elapsed
        if done >= self.total:
            eta = "done"
        elif rate > 0:
            eta = "ETA " + _duration((self.total - done) / rate)
        else:
            eta = "ETA unknown"
        return (f"{self.desc}round {r}: {done}/{self.total} claims ({100 * done / self.total:.0f}%), "
                f"{rate:.2f} claims/s, {eta}")

    def _lines(self) -> None:
        self.last = self.clock()
        for r, done in enumerate(self.done):
            if done != self.shown[r]:
                self.shown[r] = done
                print(self.line(r), file=self.stream, flush=True)

    def close(self) -> None:
        """Close the bars, or write each round's last line in a log."""
        if self.bars is not None:
            for b in self.bars:
                b.close()
        elif self.enabled:
            self._lines()


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")
