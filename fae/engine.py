"""The multi-round evidence ablation loop (SPEC §6).

Pure ablation logic (:func:`next_pool`, :func:`make_round`,
:func:`reuse_round`) is kept apart from the loop so it can be unit-tested
without a model. The loop is round-synchronous over a *chunk* of claims: all
claims of the chunk that need a model call at round r go to the backend in
one ``generate`` call (the backend batches, sorts by length, or runs requests
concurrently), then every claim moves to round r+1. A finished chunk is
appended to ``claims.jsonl`` at once, so a killed run loses at most one chunk.

Each round records ``truncated``, whether the backend said the answer was cut
off at ``max_new_tokens`` (absent when it did not say, as in runs made before
backends reported it).

Reuse: when a round cites nothing that is still in the pool (invalid answer,
NEI with no ids, only hallucinated ids), the next pool equals this pool and a
greedy verifier would answer the same prompt identically, so the previous
answer is copied with ``reused: true`` instead of calling the model.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence

from data_prep.prompts import ParsedAnswer, parse_answer, render_evidence_prompt
from data_prep.records import ClaimRecord

from .backends import Generation, as_generation

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


def make_round(r: int, pool_ids: Sequence[int], raw_output: str, truncated: bool | None = None) -> dict:
    """One round of the claims.jsonl contract, parsed against the pool it was shown.

    ``truncated``: the answer hit ``max_new_tokens`` (None: the backend did
    not say; the key is then left out).
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
                history[k].append(make_round(r, pool, answer.text, answer.truncated))
    return [claim_entry(rec, h) for rec, h in zip(records, history)]


def run_ablation(
    records: Sequence[ClaimRecord],
    generate: Generator,
    rounds: int,
    write: Callable[[list[dict]], None],
    chunk_size: int = 256,
    progress: bool = True,
    desc: str = "",
) -> dict[str, int]:
    """Ablate ``records`` chunk by chunk, handing each finished chunk to ``write``.

    One tqdm bar per round counts the claims that finished that round.
    Returns call counts for this invocation.
    """
    from tqdm.auto import tqdm

    bars = [
        tqdm(total=len(records), desc=f"{desc}round {r}", position=r, leave=True,
             disable=not progress, dynamic_ncols=True)
        for r in range(rounds + 1)
    ]
    stats = {"claims": 0, "model_calls": 0, "reused_calls": 0}
    try:
        for start in range(0, len(records), max(1, chunk_size)):
            chunk = records[start : start + max(1, chunk_size)]
            done = ablate_chunk(chunk, generate, rounds, on_round=lambda r, n: bars[r].update(n))
            write(done)
            stats["claims"] += len(done)
            for c in done:
                for rd in c["rounds"]:
                    stats["reused_calls" if rd["reused"] else "model_calls"] += 1
    finally:
        for b in bars:
            b.close()
    return stats
