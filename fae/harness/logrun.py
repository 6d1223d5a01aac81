"""An Inspect AI log of ``real_fae/fae`` as a run directory (docs/runs.md), so ``fae report``,
``compare``, ``view`` and ``pave --check-run`` read audits made in Inspect.

The claims are the scorer's ``fae_claim`` entries, exactly the claims.jsonl lines ``fae run``
writes (rounds, and the control and gold-only answers when the task asked them); ``config.json``
keeps the run's fingerprint (records sha256, model, rounds, decoding with the dtype the provider ran
the weights in, prompt format, the arms
``control``/``control_seed``/``gold_only``/``line_ids``, claim set) and ``inspect_log``: the log it
came from (path, sha256, eval id).
A sample that errored, was not scored or lacks a round is *incomplete*: by default the log is
refused with one line naming the first such sample; ``skip_incomplete`` makes a run of the
complete claims only, and config.json lists the ones left out.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from inspect_ai.log import EvalLog, read_eval_log

from real_fae_core.atomicio import atomic_write_text
from real_fae_core.errors import UserError
from real_fae_core.hashing import sha256_file
from real_fae_core.runlock import RunLock
from fae.ablation import runio
from fae.ablation.metrics import compute_metrics
from fae.ablation.report import write_report
from fae.ablation.engine import ARM_FIELDS, Arms
from fae.harness.inspect_task import CLAIM_KEY, DTYPE_KEY, TASK_NAME, incomplete_reason, stored_rounds

# Generation settings of the log that change the answers (the run's ``decoding``)
DECODING_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop_seqs", "num_choices",
                 "reasoning_effort", "reasoning_tokens")
_VERSION_PACKAGES = ("real-fae", "inspect-ai", "torch", "transformers", "openai", "vllm")


def read_log(path: str | os.PathLike) -> EvalLog:
    """The whole log (samples included); anything that is not an Inspect log of ``real_fae/fae`` is one line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"Inspect log {path} not found")
    try:
        log = read_eval_log(str(path))
    except Exception as exc:  # noqa: BLE001 - any reader failure means "not a readable log"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path}: not a readable Inspect log ({first})") from None
    if log.eval.task != TASK_NAME:
        raise UserError(f"{path}: a log of task {log.eval.task!r}, not {TASK_NAME!r}")
    epochs = log.eval.config.epochs
    if epochs not in (None, 1):
        raise UserError(f"{path}: {epochs} epochs; FAE answers are greedy and a run holds each claim "
                        "once: evaluate with --epochs 1")
    meta = log.eval.metadata or {}
    missing = [k for k in ("records", "records_sha256", "rounds", "prompt_format_version") if k not in meta]
    if missing:
        raise UserError(f"{path}: the task metadata lacks {', '.join(missing)}; made by another "
                        f"version of {TASK_NAME}?")
    return log


def error_text(message: str | None) -> str:
    """A sample error as one line: Inspect stores ``RoundError("claim 'x': ...")``; this gives ``claim 'x': ...``."""
    text = " ".join((message or "").split()) or "unknown error"
    m = re.fullmatch(r"[A-Za-z_][\w.]*\((['\"])(.*)\1\)", text)
    if m:
        inner = m.group(2)
        text = inner.replace("\\'", "'") if m.group(1) == "'" else inner.replace('\\"', '"')
    return text


def log_arms(log: EvalLog) -> dict[str, Any]:
    """The arms the task asked (config.json's arm keys); a log of the task before it had an arm did not ask
    it (the compatibility defaults of `fae run`: :data:`real_fae_core.fingerprint.COMPATIBILITY_DEFAULTS`)."""
    meta = log.eval.metadata or {}
    rec = {k: meta.get(k, runio.RUN_FINGERPRINT.defaults[k]) for k in ARM_FIELDS}
    arms_of_record(rec)
    return rec


def arms_of_record(rec: dict[str, Any]) -> Arms:
    """config.json's arm keys as :class:`Arms`; an unknown value is one line."""
    try:
        return Arms.from_record(rec)
    except ValueError as exc:
        raise UserError(f"task metadata: {exc}") from None


def sample_claim(sample: Any, rounds: int, arms: Arms | None = None) -> tuple[dict | None, str | None]:
    """(the claims.jsonl entry, None) for a complete sample, else (None, why it is incomplete)."""
    if sample.error is not None:
        done = stored_rounds(sample.store)
        return None, f"error after {len(done)} of {rounds + 1} rounds: {error_text(sample.error.message)}"
    for score in (sample.scores or {}).values():
        claim = (score.metadata or {}).get(CLAIM_KEY)
        if claim is not None:
            why = incomplete_reason(claim, rounds, arms or arms_of_record(runio.RUN_FINGERPRINT.defaults))
            return (None, why) if why else (claim, None)
    return None, "not scored (no fae_claim in its scores)"


def log_claims(log: EvalLog) -> tuple[list[str], list[dict], dict[str, str]]:
    """(claim ids in dataset order, complete claims in that order, {incomplete id: why})."""
    rounds = int(log.eval.metadata["rounds"])
    arms = arms_of_record(log_arms(log))
    samples = {str(s.id): s for s in (log.samples or [])}
    ids = [str(i) for i in (log.eval.dataset.sample_ids or [])] or list(samples)
    if log.eval.config.limit is not None or log.eval.config.sample_id is not None:
        ids = [i for i in ids if i in samples] or list(samples)  # --limit / --sample-id chose these
    claims, incomplete = [], {}
    for cid in ids:
        sample = samples.get(cid)
        if sample is None:
            incomplete[cid] = f"no sample in the log (status {log.status})"
            continue
        claim, why = sample_claim(sample, rounds, arms)
        if claim is None:
            incomplete[cid] = why
        else:
            claims.append(claim)
    return ids, claims, incomplete


def log_dtype(log: EvalLog, claim_ids: list[str]) -> str | None:
    """The dtype the provider ran the weights in (``fae run``'s ``decoding.dtype``), as the task's solver
    recorded it in each sample's store; from the model args (``-M dtype=`` / ``torch_dtype=``) in a log whose
    samples carry no recorded dtype, else None (unknown). Samples that disagree are one line: a run has one dtype."""
    wanted = set(claim_ids)
    seen = {str(s.store[DTYPE_KEY]) for s in (log.samples or [])
            if str(s.id) in wanted and (s.store or {}).get(DTYPE_KEY) is not None}
    if len(seen) > 1:
        raise UserError(f"the log's samples ran in different dtypes ({', '.join(sorted(seen))}); a run has one")
    if seen:
        return seen.pop()
    args = log.eval.model_args or {}
    given = args.get("dtype") or args.get("torch_dtype")
    return str(given).removeprefix("torch.") if given and given != "auto" else None


def decoding_of(log: EvalLog, dtype: str | None = None) -> dict[str, Any]:
    """The generation settings in force: the task's config overridden by the command line's, and the dtype
    the weights ran in (:func:`log_dtype`; left out when unknown)."""
    task_cfg = log.plan.config.model_dump(exclude_none=True) if log.plan and log.plan.config else {}
    model_cfg = log.eval.model_generate_config.model_dump(exclude_none=True) if log.eval.model_generate_config else {}
    merged = {**task_cfg, **model_cfg}
    out = {k: merged[k] for k in DECODING_KEYS if k in merged}
    out["greedy"] = merged.get("temperature") == 0
    if log.eval.model_args:
        out["model_args"] = {k: v for k, v in log.eval.model_args.items() if k != "api_key"}
    if dtype is not None:
        out["dtype"] = dtype
    return out


def build_config(log: EvalLog, log_path: Path, command: str, claim_ids: list[str],
                 skipped: dict[str, str]) -> dict[str, Any]:
    """config.json of the run: the fae run fingerprint keys, filled from the log, and the log itself."""
    meta = log.eval.metadata
    versions = runio.package_versions(_VERSION_PACKAGES)
    versions["inspect-ai (log)"] = (log.eval.packages or {}).get("inspect_ai")
    return {
        "command": command,
        "records": meta["records"],
        "records_sha256": meta["records_sha256"],
        "backend": "inspect",
        "model": log.eval.model,
        "adapter": None,
        "adapter_sha256": None,
        "rounds": int(meta["rounds"]),
        "decoding": decoding_of(log, log_dtype(log, claim_ids)),
        "constrained_decoding": False,
        "prompt_format_version": meta["prompt_format_version"],
        **log_arms(log),  # control, control_seed, gold_only, ..., line_ids (runio.RESUME_KEYS)
        "limit": log.eval.config.limit,
        **runio.claim_set(claim_ids),
        "n_excluded_nei": int(meta.get("n_excluded_nei") or 0),
        "skipped_incomplete": skipped,
        "inspect_log": {
            "path": str(log_path.resolve()),
            "sha256": sha256_file(log_path),
            "eval_id": log.eval.eval_id,
            "run_id": log.eval.run_id,
            "task": log.eval.task,
            "created": log.eval.created,
            "status": log.status,
            "model_base_url": log.eval.model_base_url,
        },
        "versions": versions,
    }


def check_output(run_dir: Path, log_sha: str) -> None:
    """A directory holding another run's claims is refused; the same log's earlier import is rewritten."""
    if not runio.claim_files(run_dir):
        return
    cfg_path = run_dir / runio.CONFIG
    try:
        old = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None
    if not (isinstance(old, dict) and (old.get("inspect_log") or {}).get("sha256") == log_sha):
        raise UserError(f"{run_dir} already holds a run's claims; write to a fresh --output")


def log_to_run(log_path: str | os.PathLike, run_dir: str | os.PathLike, *, command: str,
               skip_incomplete: bool = False) -> dict[str, Any]:
    """Write the run directory of an Inspect log; returns its metrics (metrics.json)."""
    log_path, run_dir = Path(log_path), Path(run_dir)
    log = read_log(log_path)
    ids, claims, incomplete = log_claims(log)
    if incomplete and not skip_incomplete:
        cid, why = next(iter(incomplete.items()))
        raise UserError(f"{log_path}: {len(incomplete)} of {len(ids)} claims are incomplete (first: sample "
                        f"{cid!r}: {why}); rerun them (inspect eval-retry {log_path}) or pass "
                        "--skip-incomplete for a run of the complete claims only")
    if not claims:
        raise UserError(f"{log_path}: no complete claim")
    claim_ids = [str(c["id"]) for c in claims]
    config = build_config(log, log_path, command, claim_ids, incomplete)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--output {run_dir} is a file; give a run directory (created if missing)")
    with RunLock(run_dir, "fae from-inspect", is_dir=True):  # nothing in the directory is read before it
        check_output(run_dir, config["inspect_log"]["sha256"])
        runio.remove_derived(run_dir)
        runio.RUN_FINGERPRINT.write(run_dir, config)
        atomic_write_text(run_dir / runio.CLAIMS,
                          "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in claims))
        metrics = compute_metrics(claims, n_excluded_nei=config["n_excluded_nei"])
        metrics = runio.stamp_metrics(metrics, run_dir / runio.CLAIMS, len(claims))
        runio.write_json_atomic(run_dir / runio.METRICS, metrics)
        write_report([run_dir], run_dir)
    return metrics
