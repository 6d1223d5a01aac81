"""``fae run --executor ray --shards N``: every shard of a run as a Ray task, one command for a cluster.

The cluster is the one Ray's own tools use: ``RAY_ADDRESS`` when set, else a
local Ray started for the run. Each shard (the deal of :mod:`fae.ablation.shards`)
is one streaming-generator task that opens the backend on its worker and yields
claims as they finish; this driver appends them to ``shards/I-of-N/claims.jsonl``
as they arrive, so workers need no shared file system with the driver (only
the model: a hub name, a path present on every node, or an endpoint).

A task whose worker or node is lost is submitted again with only the claims
the driver does not hold yet (``max_retries=0`` on the task: Ray's own retry
would replay the generator from its first claim). A backend error (an endpoint
that keeps failing) is not a lost worker: it stops the run, as in one process.
Rerunning the same command resumes from what the driver wrote, like any run.

Workers read secrets from their own environment (``--api-key-env`` names the
variable); nothing secret travels in a task's arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import sys
import threading
import time
from pathlib import Path

import ray

from real_fae_core.entry import set_interrupt_note
from real_fae_core.errors import RunFailure, UserError
from real_fae_core.runlock import RunLock
from real_fae_core.secrets import scrub
from fae.ablation import runio
from fae.ablation.results import write_results
from fae.ablation.engine import ABLATION_ONLY, Arms, run_ablation
from fae.ablation.options import arms_of
from fae.ablation.streaming import run_ablation_streaming, supports_streaming
from fae.ablation.shards import merge, shard_dir, shard_section
from fae.backends import BackendError, backend_options, get_backend

LOST = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OwnerDiedError,
        ray.exceptions.TaskUnschedulableError, ray.exceptions.LocalRayletDiedError,
        ray.exceptions.ObjectLostError, ray.exceptions.TaskCancelledError)
MAX_SHARD_RETRIES = 3


def _ablate_shard(backend_name: str, options, records, rounds: int, chunk_size: int | None, run_name: str,
                  arms: Arms = ABLATION_ONLY):
    """On a worker: ``{"pid", "node"}`` first, then lists of finished claims as the engine writes them."""
    backend_cls = get_backend(backend_name)
    opts = backend_options(backend_cls, options)
    yield {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}
    out: queue.Queue = queue.Queue()
    done = object()

    def work():
        try:
            backend = backend_cls(opts)
            try:
                if supports_streaming(backend):  # as in one process: no barrier across claims
                    run_ablation_streaming(records, backend, rounds, out.put, run_name=run_name,
                                           in_flight=chunk_size, progress=False, arms=arms)
                else:
                    size = chunk_size or backend_cls.default_chunk_size(opts)
                    run_ablation(records, backend, rounds, out.put, chunk_size=size, progress=False, arms=arms)
            finally:
                backend.close()
            out.put(done)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the task, below
            out.put(exc)

    threading.Thread(target=work, daemon=True).start()
    while True:
        item = out.get()
        if item is done:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


def _remote_task(gpus: float):
    return ray.remote(num_returns="streaming", max_retries=0, num_cpus=1, num_gpus=gpus)(_ablate_shard)


class _Shard:
    """The driver's side of one shard: its directory, writer, the claims held, and its running task."""

    def __init__(self, i: int, n: int, sdir: Path, config: dict, records: list):
        self.i, self.n, self.dir, self.config = i, n, sdir, config
        self.records = records
        self.held = runio.finished_ids_in(sdir / runio.CLAIMS)
        self.writer = runio.ClaimWriter(sdir / runio.CLAIMS)
        self.gen = None
        self.where: dict | None = None
        self.attempts = 0
        self.started = time.time()
        self.new = 0

    @property
    def todo(self) -> list:
        return [r for r in self.records if r.id not in self.held]

    def take(self, claims: list[dict]) -> int:
        fresh = [c for c in claims if str(c["id"]) not in self.held]  # a replayed claim is written once
        self.writer(fresh)
        self.held.update(str(c["id"]) for c in fresh)
        self.new += len(fresh)
        return len(fresh)


def run_on_ray(opts, backend_cls, backend_opts, config: dict, records, run_dir: Path) -> int:
    """Deal, run every shard as a Ray task, write what arrives, merge, write the run's results; the exit code.

    ``opts``: the run's options; ``backend_opts`` and ``config``: the backend's checked
    options and the run's config.json, as ``fae run`` builds them.
    """
    n = opts.shards
    if n is None:
        raise UserError("--executor ray needs --shards N (the number of Ray tasks)")
    with RunLock(run_dir, "fae run --executor ray", is_dir=True), contextlib.ExitStack() as locks:
        shards = []
        for i in range(n):
            sdir = shard_dir(run_dir, i, n)
            # the driver writes every shard: no `fae run --shard` may write one meanwhile
            locks.enter_context(RunLock(sdir, f"fae run --executor ray (shard {i}/{n})", is_dir=True))
            cfg = {**config, "shard": shard_section(records, i, n), "executor": "ray"}
            if runio.finished_ids_in(sdir / runio.CLAIMS):
                runio.check_resume(sdir, cfg)
            sdir.mkdir(parents=True, exist_ok=True)
            runio.RUN_FINGERPRINT.write(sdir, cfg)
            mine = set(cfg["shard"]["claim_ids"])
            shards.append(_Shard(i, n, sdir, cfg, [r for r in records if r.id in mine]))
        try:
            _drive(shards, backend_cls, backend_opts, opts, run_dir, len(records))
        finally:
            for s in shards:
                s.writer.close()
                runio.append_run_log(s.dir, {"shard": f"shard {s.i}/{n}", "executor": "ray",
                                             "started": s.started, "seconds": round(time.time() - s.started, 3),
                                             "claims": s.new, "attempts": s.attempts, "worker": s.where})
        merged, claims = merge(run_dir, count=n, command=config["command"])
        write_results(run_dir, claims, merged)
    return 0


def _connect() -> None:
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or None
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=True, logging_level="ERROR")
    except ConnectionError as exc:
        raise UserError(f"cannot reach the Ray cluster at RAY_ADDRESS={address!r}: {exc}") from None


def _drive(shards: list[_Shard], backend_cls, backend_opts, opts, run_dir: Path, total: int) -> None:
    todo = [s for s in shards if s.todo]
    held = sum(len(s.held) for s in shards)
    print(f"fae run: [ray] {len(shards)} shards, {total - held} claims to do ({held} already in {run_dir})",
          file=sys.stderr)
    if not todo:
        return
    _connect()
    task = _remote_task(opts.ray_gpus_per_shard)
    options = dataclasses.asdict(backend_opts)

    def submit(s: _Shard) -> None:
        s.attempts += 1
        s.gen = task.remote(backend_cls.name, options, s.todo, opts.rounds, opts.chunk_size, run_dir.name,
                            arms_of(opts))

    def note() -> None:
        kept = sum(len(s.held) for s in shards)
        set_interrupt_note(f"{kept} of {total} claims kept in {run_dir}/shards; resume with the same command")

    for s in todo:
        submit(s)
    running = {id(s.gen): s for s in todo}
    note()
    try:
        while running:
            gens = [s.gen for s in running.values()]
            ready, _ = ray.wait(gens, num_returns=1, timeout=None)
            for gen in ready:
                s = running[id(gen)]
                try:
                    item = ray.get(next(gen))
                except StopIteration:
                    del running[id(gen)]
                    print(f"fae run: [ray] shard {s.i}/{s.n} complete ({len(s.held)} claims)", file=sys.stderr)
                    continue
                except ray.exceptions.RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, BackendError):
                        raise RunFailure(f"shard {s.i}/{s.n}: {scrub(str(cause))}. Finished claims are saved in "
                                         f"{run_dir}/shards; rerun the same command to resume") from None
                    raise
                except LOST as exc:
                    del running[id(gen)]
                    if s.attempts > MAX_SHARD_RETRIES:
                        raise RunFailure(f"shard {s.i}/{s.n} lost its worker {s.attempts} times "
                                         f"({type(exc).__name__}); rerun the same command to resume") from None
                    print(f"fae run: [ray] shard {s.i}/{s.n} lost its worker ({type(exc).__name__}); "
                          f"resubmitted with its {len(s.todo)} claims left", file=sys.stderr)
                    submit(s)
                    running[id(s.gen)] = s
                    continue
                if isinstance(item, dict):
                    s.where = item
                else:
                    s.take(item)
                    note()
    finally:
        if running:  # a failure or a stop: end the other tasks, and Ray's reports of them before our last line
            for s in running.values():
                try:
                    ray.cancel(s.gen, force=True)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
                s.gen = None
            running.clear()
            # Ray prints a failed task it was never asked about (the other shard's BackendError) when its
            # reference dies, at exit, after the line that says what failed; shutting down here prints it first
            ray.shutdown()
    set_interrupt_note(None)
