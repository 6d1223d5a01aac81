"""`fae run`: multi-round evidence ablation of a verifier (SPEC §6).

The options are the dataclass :class:`~fae.ablation.options.FaeRunArguments`,
parsed like training's recipes: defaults < YAML (``--config recipes/eval/x.yaml``,
keys spelled like the flags, ``-`` or ``_``) < command line. The run directory gets ``claims.jsonl`` (appended chunk by chunk;
rerunning the same command resumes), ``config.json``, ``metrics.json``,
``report.md`` and ``trajectory.png``.

Under ``accelerate launch`` (or torchrun) the ``hf`` backend splits the claims
across processes: each appends ``claims.rank{k}.jsonl``; the main process
merges them into ``claims.jsonl`` in record order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from real_fae_core.cli import set_interrupt_note
from real_fae_core.errors import RunFailure, Terminated, UserError
from real_fae_core.hashing import sha256_file
from real_fae_core.runlock import RunLock
from real_fae_core.secrets import scrub
from data_prep.prompts import PROMPT_FORMAT_VERSION
from data_prep.records import RecordError, load_records
from fae.ablation import runio
from fae.ablation.engine import run_ablation
from fae.ablation.metrics import compute_metrics, nei_exclusion_note, truncation_note
from fae.ablation.population import fae_claims
from fae.ablation.options import FaeRunArguments, make_parser, parse_run_args  # noqa: F401 - the whole parser
from fae.ablation.report import write_report
from fae.backends import BackendError, backend_options, get_backend


def parse_args(argv: list[str], prog: str = "fae run") -> argparse.Namespace:
    """``options`` (:class:`FaeRunArguments`), ``config`` (the YAML path) and ``command`` (the command line).

    Called by :func:`real_fae_core.cli.dispatch` instead of ``add_arguments``:
    the options are a dataclass parsed by ``HfArgumentParser`` (fae.ablation.options).
    ``command`` is the command line as given, stored in config.json: the one
    to rerun to resume (never rebuilt from the options).
    """
    options, config = parse_run_args(argv, prog)
    return argparse.Namespace(options=options, config=config, command=shlex.join([*prog.split(), *argv]))


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
# the command
# ---------------------------------------------------------------------------


_DEVICE = re.compile(r"auto|(cpu|mps|cuda|xpu)(:\d+)?")


def check_paths_and_values(opts: FaeRunArguments) -> None:
    """Bad --records/--output/--adapter/--device values as one line each, before anything loads."""
    records, output = Path(opts.records), Path(opts.output)
    if records.is_dir():
        raise UserError(f"--records {records} is a directory; give the records .jsonl file")
    if not records.is_file():
        raise UserError(f"records file {records} not found")
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {output} is a file; give a run directory (created if missing)")
    if opts.backend == "hf" and not _DEVICE.fullmatch(opts.device):
        raise UserError(f"--device {opts.device!r} is not a device: use auto, cpu, cuda, cuda:N, mps or xpu")
    adapter = opts.adapter
    if adapter and Path(adapter).is_dir() and not (Path(adapter) / "adapter_config.json").is_file():
        raise UserError(f"--adapter {adapter}: no adapter_config.json; is it a PEFT adapter directory?")


def adapter_base(adapter: str | None) -> str | None:
    """``base_model_name_or_path`` of a local adapter's adapter_config.json."""
    if not adapter:
        return None
    try:
        cfg = json.loads((Path(adapter) / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg.get("base_model_name_or_path") if isinstance(cfg, dict) else None


def quiet_loading_bars() -> None:
    """No ``\\r`` weight-loading bars in a log file (our own progress is plain lines there)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        return
    hf_logging.disable_progress_bar()


def open_backend(backend_cls, opts):
    """The backend (``opts``: its options); an adapter whose weights do not fit the model is one clear line."""
    adapter, model = opts.adapter, opts.model
    base = adapter_base(adapter)
    if backend_cls.name != "openai" and not sys.stderr.isatty():
        quiet_loading_bars()
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


def build_config(args: argparse.Namespace, backend_cls, decoding: dict,
                 claim_ids: list[str] | None = None) -> dict[str, Any]:
    """config.json: the command line as given, the resolved options (``settings``) and the run's fingerprint."""
    opts = args.options
    records = Path(opts.records)
    settings = {k: v for k, v in dataclasses.asdict(opts).items() if k != "progress"}
    return {
        "command": args.command,
        "config_file": args.config,
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
        "limit": opts.limit,
        **runio.claim_set(claim_ids or []),
        "settings": settings,  # every resolved option (never the API key, only its variable's name)
        "versions": runio.package_versions(),
    }


def run(args: argparse.Namespace) -> int:
    opts = args.options
    backend_cls = get_backend(opts.backend)
    rank, world, barrier, dist_device = _dist_state()
    if world > 1:
        if backend_cls.name != "hf":
            raise UserError(f"multi-process runs split claims for the hf backend only, not {backend_cls.name!r}"
                            " (vllm: --tensor-parallel-size; openai: --concurrency)")
        args = argparse.Namespace(**{**vars(args), "options": dataclasses.replace(opts, device=dist_device)})
        opts = args.options
    check_paths_and_values(opts)
    try:
        records = load_records(opts.records)
    except RecordError as exc:
        raise UserError(str(exc)) from None
    records, n_nei = fae_claims(records, source=opts.records)  # SPEC §1: no model calls on NEI-gold claims
    if n_nei and rank == 0:
        print(f"fae run: {nei_exclusion_note(n_nei, opts.records)}", file=sys.stderr)
    if opts.limit:
        records = records[: opts.limit]
    if not records:
        raise UserError(f"{opts.records}: no records")
    run_dir = Path(opts.output)
    # The lock comes first: nothing in the directory is read or written without it.
    with RunLock(run_dir, "fae run", is_dir=True, enabled=rank == 0):
        return _run_locked(args, backend_cls, records, n_nei, run_dir, rank, world, barrier)


def _run_locked(args, backend_cls, records, n_nei: int, run_dir: Path, rank: int, world: int, barrier) -> int:
    opts = backend_options(backend_cls, args.options)  # a third-party backend's fields are checked here
    decoding = backend_cls.decoding_of(opts)
    claim_ids = [r.id for r in records]
    config = build_config(args, backend_cls, decoding, claim_ids)
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier()
    done = runio.finished_ids(run_dir)
    # Only finished claims make a run directory worth protecting: a run that
    # failed before its first claim (a typo in --model) may be restarted freely.
    if done:
        runio.check_resume(run_dir, config)
    if rank == 0:
        runio.remove_derived(run_dir)  # they describe an earlier state; rewritten at the end
        runio.write_json_atomic(run_dir / runio.CONFIG, config)
    barrier()

    mine = [r for r in records[rank::world] if r.id not in done]
    out_path = run_dir / runio.CLAIMS if world == 1 else runio.shard_path(run_dir, rank)
    started = time.time()
    stats = {"claims": 0, "model_calls": 0, "reused_calls": 0}
    backend = None
    error = None
    if mine:
        tag = f"[rank {rank}/{world}] " if world > 1 else ""
        print(f"fae run: {tag}{len(mine)} claims to do ({len(done)} already in {run_dir})", file=sys.stderr)
        backend = open_backend(backend_cls, opts)
        kept = [len(done)]

        def note() -> None:
            set_interrupt_note(f"{kept[0]} of {len(records)} claims kept in {run_dir}; "
                               f"resume with: {config['command']}")

        note()
        stopped = "stopped by an unexpected error"
        try:
            with runio.ClaimWriter(out_path) as writer:
                def write(claims: list[dict]) -> None:
                    writer(claims)
                    kept[0] += len(claims)
                    stats["claims"] = kept[0] - len(done)
                    note()

                chunk_size = args.options.chunk_size
                if chunk_size is None:
                    chunk_size = backend_cls.default_chunk_size(opts)
                stats = run_ablation(mine, backend, args.options.rounds, write, chunk_size=chunk_size,
                                     progress=args.options.progress and rank == 0, desc=tag)
            stopped = None
        except BackendError as exc:
            error = exc
            stopped = scrub(str(exc))  # an error body may echo the key
        except KeyboardInterrupt as exc:
            stopped = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
            # Count from disk: the signal may land between a write and its count.
            kept[0] = len(runio.finished_ids(run_dir))
            ours = [c for c in runio.read_claims(out_path) if str(c["id"]) not in done]
            stats["claims"] = len(ours)
            stats["model_calls"] = sum(not rd.get("reused") for c in ours for rd in c["rounds"])
            stats["reused_calls"] = sum(bool(rd.get("reused")) for c in ours for rd in c["rounds"])
            note()
            raise
        finally:
            backend.close()
            runio.append_run_log(run_dir, {
                "rank": rank, "world": world, "started": started, "seconds": round(time.time() - started, 3),
                **{k: v for k, v in stats.items()}, "backend_stats": dict(backend.stats),
                "error": stopped,
            })
        set_interrupt_note(None)
    if error is not None:
        raise RunFailure(f"{error}. Finished claims are saved in {out_path}; rerun the same command to resume")
    barrier()
    if rank != 0:
        barrier()  # the main process merges and writes the run; no rank leaves before it is done
        return 0
    _write_run(args, run_dir, claim_ids, records, n_nei)
    barrier()
    return 0


def _write_run(args, run_dir: Path, claim_ids, records, n_nei: int) -> None:
    """The main process: every rank's claims merged in record order, the metrics and the report."""
    claims = runio.merge_claims(run_dir, claim_ids)
    if len(claims) != len(records):
        raise UserError(f"{run_dir}: {len(records) - len(claims)} claims missing after the run; rerun to resume")
    metrics = runio.stamp_metrics(compute_metrics(claims, n_excluded_nei=n_nei), run_dir / runio.CLAIMS, len(claims))
    runio.write_json_atomic(run_dir / runio.METRICS, metrics)
    write_report([run_dir], run_dir)
    print(json.dumps({k: metrics[k] for k in ("n_claims", "label_accuracy", "strict_accuracy",
                                               "IS", "ER", "IO", "model_calls", "reused_calls")}))
    note = truncation_note(metrics, args.options.max_new_tokens)
    if note:
        print(f"fae run: warning: {note}", file=sys.stderr)
    print(f"fae run: wrote {run_dir}/claims.jsonl, metrics.json, report.md, trajectory.png", file=sys.stderr)
