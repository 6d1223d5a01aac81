"""The ablation loop without a barrier across claims, for HTTP backends (``--backend openai``).

:func:`fae.ablation.engine.run_ablation` sends the next round of every claim in
flight in one ``generate`` call, so a step waits for its slowest request. Here
each claim is its own coroutine stepping with :class:`engine.ClaimSchedule` (the one
round schedule, with the control and gold-only questions of ``arms``): it sends its next
round as soon as its own previous answer arrived. The rounds are the same as :func:`run_ablation`'s for the same answers;
only the order in which claims finish differs (``fae run``'s final merge puts
claims.jsonl in record order).

Bounds: at most ``in_flight`` claims exist at once (records are read from an
iterator, so a million claims cost the memory of ``in_flight``), and the
backend keeps at most its ``concurrency`` requests on the wire.

Finished claims go to ``write`` in batches, at most every
:data:`FLUSH_SECONDS` or :data:`FLUSH_CLAIMS` claims, and always at the end,
on error and on interrupt: a run at hundreds of calls per second does not
fsync per claim, and a kill loses at most one batch.

Every request carries the routing key ``<run_name>/<claim id>`` (the openai
backend puts it in its routing header, so a consistent-hash router keeps a
claim's rounds on one server and its prefix cache warm).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Iterable
from urllib.parse import quote

from data_prep.prompts import render_evidence_prompt
from data_prep.records import ClaimRecord
from fae.ablation.engine import ABLATION_ONLY, CALL_COUNTS, Arms, ClaimSchedule, RoundProgress, call_counts_of
from fae.backends import as_generation

FLUSH_SECONDS = 0.2
FLUSH_CLAIMS = 512
DEFAULT_IN_FLIGHT = 4096


def routing_key(run_name: str, claim_id) -> str:
    """``<run>/<claim id>``, percent-encoded where a character could not go in an HTTP header."""
    return quote(f"{run_name}/{claim_id}", safe="/-_.:@+=~")


def supports_streaming(backend) -> bool:
    """The backend offers ``streaming()``: an async context giving ``answer(messages, routing_key, priority)``.

    ``priority`` is the round asked; the backend should serve higher ones first.
    """
    return callable(getattr(backend, "streaming", None))


def run_ablation_streaming(
    records: Iterable[ClaimRecord],
    backend,
    rounds: int,
    write: Callable[[list[dict]], None],
    *,
    run_name: str,
    in_flight: int | None = None,
    progress: bool = True,
    desc: str = "",
    arms: Arms = ABLATION_ONLY,
) -> dict[str, int]:
    """Ablate ``records`` with each claim stepping on its own; the stats of :func:`run_ablation`.

    A request failing for good raises the backend's error (``BackendError``)
    after every claim finished so far has been written.
    """
    if not supports_streaming(backend):
        raise TypeError(f"{type(backend).__name__} has no streaming(); use fae.ablation.engine.run_ablation")
    total = len(records) if hasattr(records, "__len__") else 0
    bars = RoundProgress(total, rounds, desc=desc, enabled=progress and total > 0)
    stats = {"claims": 0, **dict.fromkeys(CALL_COUNTS, 0)}
    pending: list[dict] = []
    last_flush = [time.monotonic()]

    def flush() -> None:
        last_flush[0] = time.monotonic()
        if not pending:
            return
        batch = pending[:]
        pending.clear()
        write(batch)
        stats["claims"] += len(batch)
        for c in batch:
            for key, n in call_counts_of(c).items():
                stats[key] += n

    def finished(entry: dict) -> None:
        pending.append(entry)
        if len(pending) >= FLUSH_CLAIMS or time.monotonic() - last_flush[0] >= FLUSH_SECONDS:
            flush()

    try:
        asyncio.run(_run(iter(records), backend, rounds, run_name, max(1, int(in_flight or DEFAULT_IN_FLIGHT)),
                         bars, finished, flush, arms))
    finally:
        try:
            flush()  # on success, error or interrupt: every finished claim reaches disk
        finally:
            bars.close()
    return stats


async def _run(records, backend, rounds: int, run_name: str, limit: int, bars: RoundProgress,
               finished: Callable[[dict], None], flush: Callable[[], None], arms: Arms = ABLATION_ONLY) -> None:
    on_reuse = (lambda r: bars.update(r, 1)) if bars.enabled else None
    slots = asyncio.Semaphore(limit)
    tasks: set[asyncio.Task] = set()
    errors: list[BaseException] = []
    idle = asyncio.Event()

    async with backend.streaming() as answer:

        async def claim(record: ClaimRecord) -> dict:
            schedule = ClaimSchedule(record, rounds, arms)
            key = routing_key(run_name, record.id)
            while reqs := schedule.next_requests(on_reuse):
                # later rounds first: a started claim finishes before new ones take the slots. A step's
                # questions (the round, its control, the gold-only pool) are awaited one after the other:
                # each request then reaches the backend's queue at once, ahead of claims not yet started.
                for req in reqs:
                    got = await answer(render_evidence_prompt(record, req.pool, arms.line_ids), key, req.r)
                    schedule.answer(req, as_generation(got))
                    if bars.enabled and req.arm == "rounds":
                        bars.update(req.r, 1)
            return schedule.entry()

        def settled(task: asyncio.Task) -> None:
            tasks.discard(task)
            slots.release()
            if not task.cancelled():
                exc = task.exception()
                if exc is not None:
                    errors.append(exc)
                else:
                    try:
                        finished(task.result())
                    except Exception as write_error:  # noqa: BLE001 - the disk failed: stop the run with it
                        errors.append(write_error)
            if errors or not tasks:
                idle.set()

        async def ticker() -> None:
            """Flush a batch that finished while no other claim finished after it."""
            while True:
                await asyncio.sleep(FLUSH_SECONDS)
                flush()

        tick = asyncio.ensure_future(ticker())
        try:
            for record in records:
                await slots.acquire()
                if errors:
                    break
                idle.clear()
                task = asyncio.ensure_future(claim(record))
                tasks.add(task)
                task.add_done_callback(settled)
            while tasks and not errors:
                await idle.wait()
                idle.clear()
            if errors:
                raise errors[0]
        finally:
            tick.cancel()
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(tick, *tasks, return_exceptions=True)
