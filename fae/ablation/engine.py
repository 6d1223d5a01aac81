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

import random
from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple, Protocol, Sequence

from data_prep.prompts import (DEFAULT_LINE_IDS, ParsedAnswer, check_line_ids, number_lines, parse_answer,
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
# the arms beside the ablation: control and gold-only (SPEC §6)
# ---------------------------------------------------------------------------

CONTROL_CHOICES = ("random", "none")
DEFAULT_CONTROL = "random"


@dataclass(frozen=True)
class Arms:
    """What FAE asks beside the ablation rounds, and how a prompt numbers its lines.

    ``control``: ``random`` asks, at every round r >= 1, the full pool minus as many lines as the
    ablation has removed by then, drawn (seeded by ``control_seed`` and the claim id) from the lines
    neither cited in rounds 0..r-1 nor gold; ``none`` skips it. ``gold_only``: one more question on
    the gold sentences alone. ``line_ids``: ``original`` or ``renumbered`` (SPEC §3). The default is
    what ``fae run`` does; :data:`ABLATION_ONLY` is the ablation alone (the paper's protocol).
    """

    control: str = DEFAULT_CONTROL
    control_seed: int = 0
    gold_only: bool = True
    line_ids: str = DEFAULT_LINE_IDS

    def __post_init__(self):
        if self.control not in CONTROL_CHOICES:
            raise ValueError(f"--control {self.control!r}: choose {' or '.join(CONTROL_CHOICES)}")
        check_line_ids(self.line_ids)

    def record(self) -> dict:
        """What config.json records (a resume across any of it is refused)."""
        return {"control": self.control, "control_seed": self.control_seed if self.control != "none" else None,
                "gold_only": self.gold_only, "line_ids": self.line_ids}


ABLATION_ONLY = Arms(control="none", gold_only=False)


def control_order(record: ClaimRecord, seed: int) -> list[int]:
    """The claim's seeded order of its lines; the control removes the first eligible ones in it.

    Seeded by (seed, claim id) only: a claim's control pools do not depend on the other claims, on the
    order of the file, on shards or on the backend.
    """
    order = sorted(record.pool_ids)
    random.Random(f"fae-control:{seed}:{record.id}").shuffle(order)
    return order


def control_removal(full_pool: Sequence[int], ablated_pool: Sequence[int], gold: set,
                    order: Sequence[int]) -> tuple[list[int] | None, int, int]:
    """(ids the control removes, or None when too few; how many it must remove; how many it may).

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


class Request(NamedTuple):
    """One model call of a claim: the arm (``rounds``, ``control`` or ``gold_only``), its round and pool."""

    arm: str
    r: int
    pool: list[int]


class ClaimSchedule:
    """Every question FAE asks about one claim, in the order their pools become known.

    The ablation steps with :func:`advance` (the one round schedule). The control of round r is known
    once the ablation's round-r pool is, so it is asked in the same step; the gold-only pool is asked
    with round 1 (or alone after round 0 when R = 0). A control or gold-only pool equal to one already
    answered copies that answer (``reused``), as the ablation does. :meth:`next_requests` gives the
    next step's calls (none: the claim is finished); :meth:`answer` records one.
    """

    def __init__(self, record: ClaimRecord, rounds: int, arms: Arms = ABLATION_ONLY):
        self.record, self.R, self.arms = record, rounds, arms
        self.rounds: list[dict] = []
        self.control: list[dict | None] = []
        self.gold_only: dict | None = None
        self._gold_asked = False
        self._order = control_order(record, arms.control_seed) if arms.control != "none" else []
        self._gold = set(record.gold_ids)
        self._pending: list[Request] = []

    def next_requests(self, on_reuse: Callable[[int], None] | None = None) -> list[Request]:
        if self._pending:
            raise RuntimeError(f"claim {self.record.id!r}: {len(self._pending)} answers still missing")
        reqs: list[Request] = []
        pool = advance(self.rounds, self.record.pool_ids, self.R, on_reuse)
        if pool is not None:
            reqs.append(Request("rounds", len(self.rounds), pool))
        known = [rd["pool_ids"] for rd in self.rounds] + ([pool] if pool is not None else [])
        if self.arms.control != "none":
            for r in range(len(self.control) + 1, len(known)):
                self._control(r, known[r], reqs)
        if self.arms.gold_only and not self._gold_asked and self.rounds:
            self._gold_asked = True
            self._gold_only(reqs)
        self._pending = list(reqs)
        return reqs

    def _copy_of(self, pool: list[int]) -> dict | None:
        """An answered question of this claim on exactly ``pool`` (round 0 or the previous control)."""
        prev = [self.rounds[0]] + [c for c in self.control[-1:] if c is not None and "skipped" not in c]
        for rnd in prev:
            if rnd["pool_ids"] == pool:
                return rnd
        return None

    def _control(self, r: int, ablated: list[int], reqs: list[Request]) -> None:
        full = self.record.pool_ids
        removed, need, have = control_removal(full, ablated, self._gold, self._order)
        if removed is None:
            self.control.append({"round": r, "skipped": f"{have} lines neither cited nor gold; the ablation "
                                 f"removed {need} by round {r}", "removed_needed": need})
            return
        pool = [i for i in full if i not in set(removed)]
        same = self._copy_of(pool)
        if same is not None:
            self.control.append({**reuse_round(same, r), "removed": removed})
            return
        self.control.append(None)  # answered by :meth:`answer`
        reqs.append(Request("control", r, pool))

    def _gold_only(self, reqs: list[Request]) -> None:
        pool = [i for i in self.record.pool_ids if i in self._gold]
        if not pool:
            self.gold_only = {"skipped": "no gold sentence in the pool"}
        elif pool == self.rounds[0]["pool_ids"]:
            self.gold_only = reuse_round(self.rounds[0], 0)
        else:
            reqs.append(Request("gold_only", 0, pool))

    def answer(self, req: Request, got: Generation) -> None:
        self._pending.remove(req)
        rnd = make_round(req.r, req.pool, got.text, got.truncated, got, self.arms.line_ids)
        if req.arm == "rounds":
            self.rounds.append(rnd)
        elif req.arm == "control":
            removed = set(req.pool)
            self.control[req.r - 1] = {**rnd, "removed": [i for i in self.record.pool_ids if i not in removed]}
        else:
            self.gold_only = rnd

    def entry(self) -> dict:
        """The claims.jsonl line: the ablation's rounds, and ``control`` / ``gold_only`` when asked."""
        out = claim_entry(self.record, self.rounds)
        if self.arms.control != "none":
            out["control"] = list(self.control)
        if self.arms.gold_only:
            out["gold_only"] = self.gold_only
        return out


def call_counts_of(entry: dict) -> dict[str, int]:
    """Model calls and copied answers of one claims.jsonl entry, per arm (run logs and progress)."""
    extra = [c for c in entry.get("control") or [] if c and "skipped" not in c]
    gold = entry.get("gold_only")
    if gold and "skipped" not in gold:
        extra.append(gold)
    return {"model_calls": sum(not rd.get("reused") for rd in entry["rounds"]),
            "reused_calls": sum(bool(rd.get("reused")) for rd in entry["rounds"]),
            "control_calls": sum(not rd.get("reused") for rd in extra)}


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
    stats = {"claims": 0, "model_calls": 0, "reused_calls": 0, "control_calls": 0}
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
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.bars = None
        if self.enabled and tty:
            from tqdm.auto import tqdm

            self.bars = [tqdm(total=total, desc=f"{desc}round {r}", position=r, leave=True,
                              dynamic_ncols=True, file=self.stream) for r in range(rounds + 1)]

    def update(self, r: int, n: int) -> None:
        self.done[r] += n
        if self.bars is not None:
            self.bars[r].update(n)
        elif self.enabled and self.clock() - self.last >= self.interval:
            self._lines()

    def line(self, r: int) -> str:
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
