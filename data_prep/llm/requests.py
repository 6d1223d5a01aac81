"""The cached, de-duplicated LLM request shared by ``real-data enhance`` and ``real-data counterfactual``.

Both commands ask annotator LLMs many questions through
:class:`data_prep.llm.client.AnnotatorClient` and keep only what is their
own (prompts and the vote; swaps and the judge). Everything around a request
is here, once:

- :func:`run_locks`: one writer per output file and per cache file
  (:class:`real_fae_core.runlock.RunLock`), held for the whole run;
- :class:`RequestTable`: the SQLite answer cache (:mod:`data_prep.llm.cache`)
  in front of the requests under way: a request already answered (or
  abstained) is served from the cache; an identical request asked while the
  first is in flight waits for it instead of being sent again; a request
  leaves the in-flight table when it finishes, so a transport failure is
  retried by the next identical request rather than remembered;
- :class:`RequestUsage`: requests made, served from cache and failed, and
  tokens, per task or annotator;
- :func:`run_requests`: the event loop with interrupts handled: Ctrl-C or
  SIGTERM cancels the requests under way, every committed answer stays in the
  cache, one line says what was kept and how to resume, and the same command
  resumes sending only what is missing;
- :func:`write_summary`: ``OUT.summary.json``, written atomically.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from real_fae_core.atomicio import atomic_write_json
from real_fae_core.entry import set_interrupt_note
from real_fae_core.errors import Terminated
from real_fae_core.runlock import RunLock
from real_fae_core.secrets import scrub

from .cache import OK, AnswerCache, CachedAnswer
from .client import AnnotatorStats, TransportFailure

TERMINATED = object()


def summary_path(output: Path) -> Path:
    """``OUT.summary.json``: the run summary written beside the output ``OUT``."""
    return output.with_name(output.name + ".summary.json")


def default_cache_path(output: Path) -> Path:
    """``OUT.cache.sqlite``: the answer cache beside the output ``OUT`` when no ``--cache`` is given."""
    return output.with_name(output.name + ".cache.sqlite")


def write_summary(summary: dict, output: Path) -> Path:
    """``OUT.summary.json``, complete or absent."""
    path = summary_path(Path(output))
    atomic_write_json(path, summary, ensure_ascii=False)
    return path


@contextlib.contextmanager
def run_locks(command: str, output: Path, cache: Path | None) -> Iterator[None]:
    """Hold the output's lock and, when there is one, the cache's (the same cache may serve several outputs)."""
    locks = [RunLock(output, command, is_dir=False)]
    if cache is not None and Path(cache).resolve() != Path(output).resolve():
        locks.append(RunLock(cache, command, is_dir=False))
    try:
        for lock in locks:
            lock.acquire()
        yield
    finally:
        for lock in reversed(locks):
            lock.release()


class RequestUsage:
    """Requests and tokens, per task (an annotator's name, or a phase such as ``rewrite``)."""

    def __init__(self):
        self.by_task: dict[str, dict[str, int]] = {}
        self.tokens = {"in": 0, "out": 0, "in_incl_cache": 0, "out_incl_cache": 0}

    def add(self, task: str, stats: AnnotatorStats) -> None:
        """Record one task's request counts and add its token usage (sent, and with cached answers) to the totals."""
        self.by_task[task] = {"made": stats.requests, "served_from_cache": stats.from_cache, "failed": stats.failed}
        for key, value in (("in", stats.tokens_in), ("out", stats.tokens_out),
                           ("in_incl_cache", stats.tokens_in_all), ("out_incl_cache", stats.tokens_out_all)):
            self.tokens[key] += value

    def requests(self) -> dict[str, int]:
        """Requests made, served from cache and failed, summed over the tasks."""
        return {k: sum(t[k] for t in self.by_task.values()) for k in ("made", "served_from_cache", "failed")}


class RequestTable:
    """The answer cache plus the requests in flight: each distinct request is sent at most once at a time.

    ``ask`` returns the :class:`CachedAnswer` or, when the request failed in
    transport, an error string ``"<name>: <reason>"`` (never cached). With
    ``retry_abstentions`` a cached abstention is asked again once per run.
    The first transport failure of each name is printed, prefixed by
    ``command``.
    """

    def __init__(self, cache: AnswerCache, command: str, *, retry_abstentions: bool = False):
        self.cache = cache
        self.command = command
        self.retry_abstentions = retry_abstentions
        self.inflight: dict[str, asyncio.Future] = {}  # key -> the request under way
        self._fetched: set[str] = set()  # keys answered (or abstained) in this run
        self._reported: set[str] = set()

    def cached(self, key: str) -> CachedAnswer | None:
        """The cached answer to ``key``, or None when it must be asked (never answered, or an abstention to
        retry once this run with ``retry_abstentions``)."""
        hit = self.cache.get(key)
        if hit is None or hit.status == OK or not self.retry_abstentions or key in self._fetched:
            return hit
        return None

    async def ask(self, key: str, model: str, send: Callable[[], Awaitable[CachedAnswer]], stats: AnnotatorStats,
                  name: str) -> CachedAnswer | str:
        """The answer to ``key`` (cached, shared with an identical request in flight, or sent with ``send``), or
        the error string ``"<name>: <reason>"`` of a transport failure; ``stats`` counts which."""
        hit = self.cached(key)
        if hit is not None:
            stats.from_cache += 1
        else:
            owner = key not in self.inflight
            if owner:
                self.inflight[key] = asyncio.ensure_future(self._fetch(key, model, send, stats, name))
            try:
                hit = await self.inflight[key]
            finally:
                if owner:
                    del self.inflight[key]
            if isinstance(hit, str):
                stats.failed += 1
                return hit
            if not owner:  # answered by the identical request it waited for
                stats.from_cache += 1
        stats.tokens_in_all += hit.prompt_tokens
        stats.tokens_out_all += hit.completion_tokens
        return hit

    async def _fetch(self, key, model, send, stats: AnnotatorStats, name: str) -> CachedAnswer | str:
        try:
            ans = await send()
        except TransportFailure as exc:
            text = scrub(exc)  # already scrubbed by the client; again here, where it is printed and stored
            if name not in self._reported:  # first failure per name
                self._reported.add(name)
                tqdm.write(f"{self.command}: annotator {name!r} failed a request: {text}", file=sys.stderr)
            return f"{name}: {text}"
        self.cache.put(key, model, ans)
        self._fetched.add(key)
        if ans.status == OK:
            stats.answered += 1
        else:
            stats.abstained += 1
        return ans


async def cancel_on_sigterm(coro):
    """Await ``coro``; SIGTERM cancels it the way asyncio.run cancels on Ctrl-C (returns TERMINATED).

    The top-level handler turns SIGTERM into an exception raised wherever the
    main thread happens to be, which inside the event loop can be between a
    response and its cache commit, or inside the loop's own machinery. A loop
    signal handler instead cancels the main task, so the same clean-up as for
    Ctrl-C runs (requests cancelled, clients closed) and only then
    :class:`Terminated` is raised, outside the loop.
    """
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    hit: list[bool] = []

    def on_term() -> None:
        hit.append(True)
        me.cancel()

    previous = signal.getsignal(signal.SIGTERM)
    installed = False
    if threading.current_thread() is threading.main_thread():
        try:
            loop.add_signal_handler(signal.SIGTERM, on_term)
            installed = True
        except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not POSIX
            pass
    try:
        return await coro
    except asyncio.CancelledError:
        if hit:
            return TERMINATED
        raise
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGTERM)  # resets to SIG_DFL: put the previous one back
            signal.signal(signal.SIGTERM, previous)


def run_requests(main: Coroutine[Any, Any, Any], cache: AnswerCache, resume_command: str | None,
                 also_kept: Callable[[], str] = lambda: "") -> Any:
    """Run ``main`` to its end; on Ctrl-C / SIGTERM note what is kept and how to resume, then re-raise.

    Every answer is committed to the cache as it arrives, so an interrupted
    run loses only the requests in flight. ``also_kept()`` adds the
    command's own finished work to the note (`` and N finished claims in F``).
    """
    try:
        state = asyncio.run(cancel_on_sigterm(main))
        if state is TERMINATED:
            raise Terminated()
        return state
    except KeyboardInterrupt:  # Ctrl-C and SIGTERM (Terminated)
        try:
            answers = len(cache)
        except Exception:  # noqa: BLE001 - the note must not mask the interrupt
            answers = "the"
        set_interrupt_note(f"kept {answers} answers in the cache {cache.path}{also_kept()}; resume with: "
                           f"{resume_command or 'the same command'}")
        raise
