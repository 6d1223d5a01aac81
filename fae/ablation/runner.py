"""`fae run`: a run's options -> its run directory (:func:`run`).

This module is the command: its config ``CONFIG`` (:class:`~fae.ablation.options.FaeRunArguments`), its
command line (``parse_args``, ``make_parser``: :mod:`fae.ablation.options`, defaults < YAML ``--config`` <
flags) and ``run``. The dispatcher, ``fae checkpoints``, the demo and Python callers call
:func:`run`; the run directory is written by :func:`fae.ablation.results.write_results`. A run
is one process (:func:`run_whole`), one shard of N (:func:`run_shard`: ``--shard I/N`` or one
rank under ``accelerate launch``) or N shards as Ray tasks (:mod:`fae.ablation.ray_executor`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from real_fae_core.command import CommandResult, command_line
from real_fae_core.config import options_from
from real_fae_core.entry import set_interrupt_note
from real_fae_core.errors import RunFailure, Terminated, UserError
from real_fae_core.hashing import sha256_file
from real_fae_core.outputs import Output, any_of, claim_dir
from real_fae_core.progress import quiet_library_bars
from real_fae_core.runlock import RunLock
from real_fae_core.secrets import scrub
from data_prep.prompts import PROMPT_FORMAT_VERSION
from data_prep.records import RecordError, load_records
from fae.ablation import runio
from fae.ablation.engine import CALL_COUNTS, call_counts_of, run_ablation
from fae.ablation.streaming import run_ablation_streaming, supports_streaming
from fae.ablation.metrics import nei_exclusion_note
from fae.ablation.population import fae_claims
from fae.ablation.options import (EXECUTORS, FaeRunArguments, arms_of, check_backend_values, located_in_yaml,
                                  make_parser, parse_args, require)  # noqa: F401 - the command line, for dispatch
from fae.ablation.results import write_results
from fae.ablation.shards import merge as merge_shards, parse_shard, shard_dir, shard_section
from fae.backends import BackendError, backend_options, get_backend

CONFIG = FaeRunArguments  # the command's config (real_fae_core.command)


@dataclasses.dataclass(frozen=True)
class RunRequest:
    """One `fae run`: its options, the command line config.json records to resume with, and the
    ``--config`` YAML it read (None: none)."""

    options: FaeRunArguments
    command: str
    config_file: str | None = None


# ---------------------------------------------------------------------------
# distributed helpers
# ---------------------------------------------------------------------------


def _dist_state():
    """(rank, world, barrier, device) — a PartialState only when launched with WORLD_SIZE > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, (lambda: None), None
    import torch
    from accelerate import PartialState

    # A bare PartialState() under torchrun on CPU reports one process (STACK.md).
    state = PartialState(cpu=not torch.cuda.is_available())
    return state.process_index, state.num_processes, state.wait_for_everyone, str(state.device)


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------


_DEVICE = re.compile(r"auto|(cpu|mps|cuda|xpu)(:\d+)?")


def check_paths_and_values(opts: FaeRunArguments) -> Output:
    """Bad --records/--output/--adapter/--device values as one line each, before anything loads."""
    records, output = Path(opts.records), Path(opts.output)
    if records.is_dir():
        raise UserError(f"--records {records} is a directory; give the records .jsonl file")
    if not records.is_file():
        raise UserError(f"records file {records} not found")
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {output} is a file; give a run directory (created if missing)")
    adapter = opts.adapter if opts.adapter and Path(opts.adapter).exists() else None
    guard = claim_dir(output, "fae run", inputs=[records, adapter],
                      legacy=any_of(runio.CONFIG, runio.CLAIMS, runio.RUNS_LOG, runio.SHARDS_DIR))
    if opts.backend == "hf" and not _DEVICE.fullmatch(opts.device):
        raise UserError(f"--device {opts.device!r} is not a device: use auto, cpu, cuda, cuda:N, mps or xpu")
    arms_of(opts)
    adapter = opts.adapter
    if adapter and Path(adapter).is_dir() and not (Path(adapter) / "adapter_config.json").is_file():
        raise UserError(f"--adapter {adapter}: no adapter_config.json; is it a PEFT adapter directory?")
    return guard


def adapter_base(adapter: str | None) -> str | None:
    """``base_model_name_or_path`` of a local adapter's adapter_config.json."""
    if not adapter:
        return None
    try:
        cfg = json.loads((Path(adapter) / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg.get("base_model_name_or_path") if isinstance(cfg, dict) else None


def open_backend(backend_cls, opts):
    """The backend (``opts``: its options); an adapter whose weights do not fit the model is one clear line."""
    adapter, model = opts.adapter, opts.model
    base = adapter_base(adapter)
    if backend_cls.name != "openai":
        quiet_library_bars()  # no \r weight-loading bars in a log file (our own progress is plain lines there)
    try:
        backend = backend_cls(opts)
    except RuntimeError as exc:
        if adapter and "size mismatch" in str(exc):
            raise UserError(
                f"adapter {adapter} does not fit model {model}: it was trained on {base or 'another model'} "
                "(adapter_config.json base_model_name_or_path) and its weight shapes differ; "
                "pass the adapter's base model as --model"
            ) from None
        raise
    if base and Path(str(base)).name != Path(str(model)).name:
        print(f"fae run: warning: adapter {adapter} was trained on {base}, evaluated on {model}",
              file=sys.stderr)
    return backend


def build_config(request: RunRequest, backend_cls, decoding: dict,
                 claim_ids: list[str] | None = None) -> dict[str, Any]:
    """config.json: the command line as given, the resolved options (``settings``) and the run's fingerprint."""
    opts = request.options
    records = Path(opts.records)
    settings = {k: v for k, v in dataclasses.asdict(opts).items() if k != "progress"}
    return {
        "command": request.command,
        "config_file": request.config_file,
        "records": str(records),
        "records_sha256": sha256_file(records),
        "backend": backend_cls.name,
        "model": opts.model,
        "adapter": opts.adapter,
        "adapter_sha256": runio.adapter_sha256(opts.adapter),
        "rounds": opts.rounds,
        "decoding": decoding,
        "constrained_decoding": opts.constrained_decoding,
        "prompt_format_version": PROMPT_FORMAT_VERSION,
        **arms_of(opts).record(),
        "limit": opts.limit,
        **runio.claim_set(claim_ids or []),
        "settings": settings,  # every resolved option (never the API key, only its variable's name)
        "versions": runio.package_versions(),
    }


def read_claim_records(opts: FaeRunArguments, announce: bool = True):
    """(records FAE asks about, count of NEI-gold records left out): SPEC §1, ``--limit`` applied."""
    try:
        records = load_records(opts.records)
    except RecordError as exc:
        raise UserError(str(exc)) from None
    records, n_nei = fae_claims(records, source=opts.records)  # SPEC §1: no model calls on NEI-gold claims
    if n_nei and announce:
        print(f"fae run: {nei_exclusion_note(n_nei, opts.records)}", file=sys.stderr)
    if opts.limit:
        records = records[: opts.limit]
    if not records:
        raise UserError(f"{opts.records}: no records")
    return records, n_nei


def run(options: FaeRunArguments, *, command: str | None = None, config_file: str | None = None) -> CommandResult:
    """`fae run` as a function: ablate, write the run directory, return its metrics.

    ``command`` is the line config.json records to resume with (None: the `fae run`
    line of ``options``); the checks are the command line's: a required option
    missing, or another backend's option set, is refused."""
    require(options)
    check_backend_values(options)
    try:
        code = run_request(RunRequest(options, command or command_line("fae run", options), config_file))
    except UserError as exc:  # a value the YAML gave is named by its file and line, not by its flag
        located = located_in_yaml(exc, config_file, command)
        if located is None:
            raise
        raise located from None
    metrics_path = Path(options.output) / runio.METRICS
    summary = json.loads(metrics_path.read_text(encoding="utf-8")) if metrics_path.is_file() else {}
    return CommandResult(exit_code=code, outputs={"run_dir": str(options.output)}, summary=summary)


def run_request(request: RunRequest) -> int:
    """Run ``request`` in this process, as this rank's shard under a launcher, or on Ray; the exit code."""
    opts = request.options
    backend_cls = get_backend(opts.backend)
    rank, world, barrier, dist_device = _dist_state()
    shard = parse_shard(opts.shard) if opts.shard else None
    if opts.executor not in EXECUTORS:
        raise UserError(f"--executor {opts.executor!r}: choose {' or '.join(EXECUTORS)}")
    if opts.shards is not None and opts.executor == "local":
        raise UserError("--shards N goes with --executor ray (one process per shard); "
                        "to split by hand run each --shard I/N and then `fae merge`")
    if world > 1:
        if shard is not None or opts.executor != "local":
            raise UserError("under accelerate launch each process is a shard already: "
                            "drop --shard / --executor")
        if backend_cls.name != "hf":
            raise UserError(f"multi-process runs split claims for the hf backend only, not {backend_cls.name!r}"
                            " (vllm: --tensor-parallel-size; openai: --concurrency; any backend: --shard I/N)")
        request = dataclasses.replace(request, options=dataclasses.replace(opts, device=dist_device))
        opts = request.options
        shard = (rank, world)
    guard = check_paths_and_values(opts)
    records, n_nei = read_claim_records(opts, announce=rank == 0)
    run_dir = Path(opts.output)
    if opts.executor == "ray":  # a refused executor writes nothing
        if shard is not None:
            raise UserError("--executor ray runs every shard itself: drop --shard")
        if opts.shards is None:
            raise UserError("--executor ray needs --shards N (the number of Ray tasks)")
        try:
            from fae.ablation.ray_executor import run_on_ray
        except ImportError:
            raise UserError("--executor ray needs Ray: pip install 'real-fae[ray]'") from None
    if rank == 0:
        guard.mark(files=())  # a run directory of fae run: a later run resumes it, no other command writes it
    if opts.executor == "ray":
        backend_opts, config = run_config(request, backend_cls, records, n_nei)
        return run_on_ray(opts, backend_cls, backend_opts, config, records, run_dir)
    if shard is None:
        # The lock comes first: nothing in the directory is read or written without it.
        with RunLock(run_dir, "fae run", is_dir=True):
            return run_whole(request, backend_cls, records, n_nei, run_dir)
    # Under accelerate the main rank also holds the run directory (it merges); --shard runs
    # of other machines share the directory and each holds only its shard's.
    with RunLock(run_dir, "fae run", is_dir=True, enabled=world > 1 and rank == 0):
        return run_shard(request, backend_cls, records, n_nei, run_dir, shard, world, barrier)


def run_config(request: RunRequest, backend_cls, records, n_nei: int) -> tuple[Any, dict]:
    """(the backend's checked options, config.json of the run)."""
    extra = backend_args(request.options.backend_args, backend_cls)
    if extra:  # a registered backend's own options: checked against its options class like a YAML file's
        values = {**dataclasses.asdict(request.options), **extra}
        opts = options_from(backend_cls.options_class, values, source="--backend-args")
    else:
        opts = backend_options(backend_cls, request.options)  # a third-party backend's fields are checked here
    config = build_config(request, backend_cls, backend_cls.decoding_of(opts), [r.id for r in records])
    config["n_excluded_nei"] = n_nei
    return opts, config


def backend_args(value, backend_cls) -> dict:
    """``--backend-args KEY=VALUE,...`` (a mapping in YAML) as typed values (YAML's reading of each VALUE).

    Only options ``fae run`` has no flag for: a key that is not a field of the backend's options class,
    or one that has its own flag, is an error naming it.
    """
    if not value:
        return {}
    if isinstance(value, str):
        pairs = [item.split("=", 1) for item in value.split(",") if item.strip()]
        bad = [p[0] for p in pairs if len(p) != 2 or not p[0].strip()]
        if bad:
            raise UserError(f"--backend-args: {bad[0]!r} is not KEY=VALUE (give KEY=VALUE,KEY=VALUE)")
        twice = sorted({k.strip() for k, v in pairs for k2, v2 in pairs if k.strip() == k2.strip() and v != v2})
        if twice:
            raise UserError(f"--backend-args: {twice[0]} given twice with two values (give it once)")
        value = {k.strip(): yaml.safe_load(v) if v.strip() else "" for k, v in pairs}
    fields = {f.name for f in dataclasses.fields(backend_cls.options_class)}
    own = {f.name for f in dataclasses.fields(FaeRunArguments)}
    for key in value:
        if key in own:
            raise UserError(f"--backend-args: {key} has its own flag: --{key.replace('_', '-')}")
        if key not in fields:
            extra = sorted(fields - own)
            raise UserError(f"--backend-args: {key} is not an option of --backend {backend_cls.name} "
                            f"({'its own options: ' + ', '.join(extra) if extra else 'it has none beyond the flags'})")
    return dict(value)


def check_earlier_shards(run_dir: Path, config: dict) -> None:
    """Shards of the same run count as done; shards of another run in the directory are refused."""
    for path in runio.shard_claim_files(run_dir):
        if runio.read_claims(path):
            runio.check_resume(path.parent, config)


def run_whole(request: RunRequest, backend_cls, records, n_nei: int, run_dir: Path) -> int:
    """One process, one claims.jsonl: resume, ablate what is left, write the run."""
    opts, config = run_config(request, backend_cls, records, n_nei)
    run_dir.mkdir(parents=True, exist_ok=True)
    done = runio.finished_ids(run_dir)
    # Only finished claims make a run directory worth protecting: a run that
    # failed before its first claim (a typo in --model) may be restarted freely.
    if runio.finished_ids_in(run_dir / runio.CLAIMS):
        runio.check_resume(run_dir, config)
    check_earlier_shards(run_dir, config)
    runio.remove_derived(run_dir)  # they describe an earlier state; rewritten at the end
    runio.RUN_FINGERPRINT.write(run_dir, config)
    todo = [r for r in records if r.id not in done]
    ablate_into(request, backend_cls, opts, config, todo, run_dir, run_dir, total=len(records), done=len(done))
    claims = runio.merge_claims(run_dir, config["claim_ids"])
    write_results(run_dir, claims, config)
    return 0


def run_shard(request: RunRequest, backend_cls, records, n_nei: int, run_dir: Path, shard: tuple[int, int], world: int,
              barrier) -> int:
    """Shard I of N: its claims of the deal into shards/I-of-N/; under accelerate the main rank then merges."""
    i, n = shard
    opts, config = run_config(request, backend_cls, records, n_nei)
    config["shard"] = shard_section(records, i, n)
    sdir = shard_dir(run_dir, i, n)
    with RunLock(sdir, f"fae run --shard {i}/{n}", is_dir=True):
        done = runio.finished_ids_in(sdir / runio.CLAIMS)
        if done:
            runio.check_resume(sdir, config)
        top = runio.finished_ids_in(run_dir / runio.CLAIMS)
        if top:  # an earlier single-process pass of the same run: its claims count as done
            runio.check_resume(run_dir, config)
        runio.RUN_FINGERPRINT.write(sdir, config)
        mine = set(config["shard"]["claim_ids"])
        todo = [r for r in records if r.id in mine and r.id not in done and r.id not in top]
        tag = f"[shard {i}/{n}] "
        ablate_into(request, backend_cls, opts, config, todo, run_dir, sdir, total=len(mine),
                    done=len(mine) - len(todo), tag=tag, progress=world == 1 or i == 0)
    if world == 1:
        print(f"fae run: {tag}complete ({len(mine)} claims in {sdir}); when all {n} shards are: "
              f"fae merge {run_dir}", file=sys.stderr)
        return 0
    barrier()
    if i == 0:
        merged, claims = merge_shards(run_dir, count=n, command=config["command"])
        write_results(run_dir, claims, merged)
    barrier()  # no rank leaves before the main one has written the run
    return 0


def ablate_into(request: RunRequest, backend_cls, opts, config: dict, todo: list, run_dir: Path, out_dir: Path, *,
                total: int, done: int, tag: str = "", progress: bool = True) -> None:
    """Ablate ``todo``, appending each finished claim to ``out_dir``/claims.jsonl; one runs.jsonl entry there."""
    if not todo:
        return
    out_path = out_dir / runio.CLAIMS
    print(f"fae run: {tag}{len(todo)} claims to do ({done} already in {run_dir})", file=sys.stderr)
    before = runio.finished_ids_in(out_path)
    backend = open_backend(backend_cls, opts)
    kept = [done]
    started = time.time()
    stats = {"claims": 0, **dict.fromkeys(CALL_COUNTS, 0)}
    arms = arms_of(request.options)

    def note() -> None:
        set_interrupt_note(f"{kept[0]} of {total} claims kept in {out_dir}; resume with: {config['command']}")

    note()
    stopped = "stopped by an unexpected error"
    error = None
    try:
        with runio.ClaimWriter(out_path) as writer:
            def write(claims: list[dict]) -> None:
                writer(claims)
                kept[0] += len(claims)
                stats["claims"] = kept[0] - done
                note()

            chunk_size = request.options.chunk_size
            show = request.options.progress and progress
            if supports_streaming(backend):
                # no barrier across claims (a fleet's tail latency); --chunk-size bounds the claims in flight.
                # The routing key names the run, not the shard: a claim's rounds go to one server either way.
                stats = run_ablation_streaming(todo, backend, request.options.rounds, write, run_name=run_dir.name,
                                               in_flight=chunk_size, progress=show, desc=tag, arms=arms)
            else:
                if chunk_size is None:
                    chunk_size = backend_cls.default_chunk_size(opts)
                stats = run_ablation(todo, backend, request.options.rounds, write, chunk_size=chunk_size,
                                     progress=show, desc=tag, arms=arms)
        stopped = None
    except BackendError as exc:
        error = exc
        stopped = scrub(str(exc))  # an error body may echo the key
    except KeyboardInterrupt as exc:
        stopped = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
        # Count from disk: the signal may land between a write and its count.
        ours = [c for c in runio.read_claims(out_path) if str(c["id"]) not in before]
        kept[0] = done + len(ours)
        stats["claims"] = len(ours)
        counts = [call_counts_of(c) for c in ours]
        for key in CALL_COUNTS:
            stats[key] = sum(n[key] for n in counts)
        note()
        raise
    finally:
        backend.close()
        runio.append_run_log(out_dir, {
            "shard": tag.strip("[] ") or None, "started": started, "seconds": round(time.time() - started, 3),
            **{k: v for k, v in stats.items()}, "backend_stats": dict(backend.stats), "error": stopped,
        })
    if error is not None:
        raise RunFailure(f"{error}. Finished claims are saved in {out_path}; rerun the same command to resume")
    set_interrupt_note(None)
