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

from typing import Callable, Iterable, Protocol, Sequence

from data_prep.prompts import ParsedAnswer, parse_answer, render_evidence_prompt
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
               answer: Generation | None = None) -> dict:
    """One round of the claims.jsonl contract, parsed against the pool it was shown.

    ``truncated``: the answer hit ``max_new_tokens`` (None: the backend did
    not say; the key is then left out). ``answer``: the backend's
    :class:`Generation`, whose label probabilities (soft FAE) are kept as
    ``label_probs`` / ``label_logprobs``, or the reason they are missing as
    ``label_probs_skipped`` (keys absent when the backend computed none).
    """
    parsed: ParsedAnswer = parse_answer(raw_output, pool_ids)
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
        "evidence": named_ids_in_order(raw_output) if parsed.valid else [],
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


def ablate_chunk(
    records: Sequence[ClaimRecord],
    generate: Generator,
    rounds: int,
    on_round: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """Run rounds 0..R for a chunk of claims; returns claims.jsonl entries in input order.

    ``on_round(r, n)`` reports n more claims finished round r (progress bars).
    """
    history: list[list[dict]] = [[] for _ in records]
    for r in range(rounds + 1):
        todo: list[tuple[int, list[int]]] = []
        for k, rec in enumerate(records):
            if r == 0:
                todo.append((k, rec.pool_ids))
                continue
            prev = history[k][-1]
            pool = pool_after(prev)
            if pool == prev["pool_ids"]:
                history[k].append(reuse_round(prev, r))
            else:
                todo.append((k, pool))
        n_reused = len(records) - len(todo)
        if on_round and n_reused:
            on_round(r, n_reused)
        if todo:
            prompts = [render_evidence_prompt(records[k], pool) for k, pool in todo]
            cb = (lambda n, r=r: on_round(r, n)) if on_round else None
            outputs = generate(prompts, callback=cb)
            if len(outputs) != len(prompts):
                raise RuntimeError(f"backend returned {len(outputs)} answers for {len(prompts)} prompts")
            for (k, pool), raw in zip(todo, outputs):
                answer = as_generation(raw)
                history[k].append(make_round(r, pool, answer.text, answer.truncated, answer))
    return [claim_entry(rec, h) for rec, h in zip(records, history)]


class _Claim:
    """A claim in flight: its record, input position and the rounds done so far."""

    __slots__ = ("k", "record", "rounds")

    def __init__(self, k: int, record: ClaimRecord):
        self.k, self.record, self.rounds = k, record, []


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


def _advance(claim: _Claim, rounds: int, on_round) -> list[int] | None:
    """Fill reused rounds; the pool of the next model call, or None when the claim is done."""
    on_reuse = (lambda r: on_round(r, 1)) if on_round else None
    return advance(claim.rounds, claim.record.pool_ids, rounds, on_reuse)


def run_ablation(
    records: Sequence[ClaimRecord],
    generate: Generator,
    rounds: int,
    write: Callable[[list[dict]], None],
    chunk_size: int = 8,
    progress: bool = True,
    desc: str = "",
) -> dict[str, int]:
    """Ablate ``records`` with at most ``chunk_size`` claims in flight; write claims as they finish.

    Each step sends the next round of every claim in flight to the backend in
    one ``generate`` call (rounds mix; the backend sorts and batches), then
    hands every newly finished claim to ``write`` — in the order claims entered
    the window, so a claim waits only for earlier claims still in flight — and
    refills the window from the queue. When the window is smaller than the
    input, claims enter it by round-0 prompt length (so batches pad evenly);
    otherwise in input order. With ``chunk_size`` = one backend batch, a killed run
    loses about one batch of claims. Answers do not depend on ``chunk_size``.
    Returns call counts for this invocation.
    """
    bars = RoundProgress(len(records), rounds, desc=desc, enabled=progress)
    stats = {"claims": 0, "model_calls": 0, "reused_calls": 0}
    window = max(1, int(chunk_size))
    order = list(range(len(records)))
    if window < len(records):
        # Claims of similar prompt length enter the window together, so a small window still
        # gives the backend evenly padded batches; claims are written in this order.
        order.sort(key=lambda k: _prompt_chars(records[k]))
    queue = iter((pos, records[k]) for pos, k in enumerate(order))
    in_flight: list[_Claim] = []
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
                    in_flight.append(_Claim(*item))
            todo: list[tuple[_Claim, list[int]]] = []
            still: list[_Claim] = []
            for claim in in_flight:
                pool = _advance(claim, rounds, bars.update)
                if pool is None:
                    finished[claim.k] = claim_entry(claim.record, claim.rounds)
                else:
                    todo.append((claim, pool))
                    still.append(claim)
            in_flight = still
            ready = []
            while next_out in finished:
                ready.append(finished.pop(next_out))
                next_out += 1
            if ready:
                write(ready)
                stats["claims"] += len(ready)
                for c in ready:
                    for rd in c["rounds"]:
                        stats["reused_calls" if rd["reused"] else "model_calls"] += 1
            if not todo:
                if exhausted and not in_flight:
                    break
                continue
            prompts = [render_evidence_prompt(c.record, pool) for c, pool in todo]
            steps = [len(c.rounds) for c, _ in todo]
            outputs = generate(prompts, callback=None)
            if len(outputs) != len(prompts):
                raise RuntimeError(f"backend returned {len(outputs)} answers for {len(prompts)} prompts")
            for (claim, pool), r, raw in zip(todo, steps, outputs):
                answer = as_generation(raw)
                claim.rounds.append(make_round(r, pool, answer.text, answer.truncated, answer))
                bars.update(r, 1)
    finally:
        bars.close()
    return stats


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
