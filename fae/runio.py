"""Run-directory I/O: append-only ``claims.jsonl`` with resume, ``config.json``.

A claim line is written with one ``write`` of the complete line followed by
``flush`` + ``fsync``; a process killed mid-write leaves at most one line
without its final newline, which the next run cuts away (:func:`read_claims`
with ``repair=True``). Finished ids are skipped on resume, so a run killed at
any moment ends with every claim exactly once.

Under ``accelerate launch`` each process appends to ``claims.rank{k}.jsonl``
and the main process merges every shard into ``claims.jsonl`` in record order
(:func:`merge_claims`).
"""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Iterable, Sequence

from data_prep._dispatch import UserError

CLAIMS = "claims.jsonl"
CONFIG = "config.json"
METRICS = "metrics.json"
RUNS_LOG = "runs.jsonl"
# Settings that change the answers: resuming under different ones would mix two runs.
RESUME_KEYS = ("records_sha256", "backend", "model", "adapter", "rounds", "decoding")
_VERSION_PACKAGES = ("real-fae", "torch", "transformers", "peft", "accelerate", "openai", "vllm")


def shard_path(run_dir: str | os.PathLike, rank: int) -> Path:
    return Path(run_dir) / f"claims.rank{rank}.jsonl"


def claim_files(run_dir: str | os.PathLike) -> list[Path]:
    """claims.jsonl and every shard, existing ones only."""
    run_dir = Path(run_dir)
    files = [run_dir / CLAIMS] + sorted(run_dir.glob("claims.rank*.jsonl"))
    return [f for f in files if f.is_file()]


def read_claims(path: str | os.PathLike, *, repair: bool = False) -> list[dict]:
    """Complete claim lines of ``path`` (missing file: none).

    A last line without its newline is the trace of a kill mid-write: it is
    ignored, and cut from the file when ``repair`` (only the process that
    appends to the file may repair it). A complete line that is not a claim
    object is an error naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data) and repair:
        with path.open("r+b") as fh:
            fh.truncate(end)
            fh.flush()
            os.fsync(fh.fileno())
    out = []
    for lineno, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{lineno}: not a JSON claim line ({exc.msg})") from None
        if not isinstance(obj, dict) or "id" not in obj or "rounds" not in obj:
            raise UserError(f"{path}:{lineno}: not a claim line (needs 'id' and 'rounds')")
        out.append(obj)
    return out


def finished_ids(run_dir: str | os.PathLike) -> set[str]:
    """Ids of every claim already written to claims.jsonl or any shard."""
    return {str(c["id"]) for f in claim_files(run_dir) for c in read_claims(f)}


class ClaimWriter:
    """Appends finished claims durably (one write per chunk, fsync'd)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        read_claims(self.path, repair=True)  # cut a half-written last line first
        self._fh = self.path.open("a", encoding="utf-8")

    def __call__(self, claims: Sequence[dict]) -> None:
        if not claims:
            return
        self._fh.write("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in claims))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "ClaimWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def merge_claims(run_dir: str | os.PathLike, record_ids: Sequence[str]) -> list[dict]:
    """Rewrite claims.jsonl from itself and every shard: record order, each id once.

    Shards are deleted after the atomic replace. Returns the merged claims.
    """
    run_dir = Path(run_dir)
    files = claim_files(run_dir)
    by_id: dict[str, dict] = {}
    for f in files:
        for c in read_claims(f):
            by_id.setdefault(str(c["id"]), c)
    order = {rid: k for k, rid in enumerate(record_ids)}
    unknown = [i for i in by_id if i not in order]
    if unknown:
        raise UserError(
            f"{run_dir}: claims {unknown[:3]} are not in the records file; use a fresh output directory"
        )
    merged = sorted(by_id.values(), key=lambda c: order[str(c["id"])])
    tmp = run_dir / (CLAIMS + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(c, ensure_ascii=False) + "\n" for c in merged))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, run_dir / CLAIMS)
    for f in files:
        if f.name != CLAIMS:
            f.unlink()
    return merged


# ---------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def package_versions(packages: Iterable[str] = _VERSION_PACKAGES) -> dict[str, str | None]:
    import platform

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def check_resume(run_dir: str | os.PathLike, config: dict) -> dict | None:
    """The existing config.json, after checking it matches ``config`` on :data:`RESUME_KEYS`.

    Raises UserError naming every differing setting: resuming would mix the
    answers of two different runs in one claims.jsonl.
    """
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        return None
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg}); use a fresh output directory") from None
    diffs = [
        f"{k}: {old.get(k)!r} -> {config.get(k)!r}" for k in RESUME_KEYS if old.get(k) != config.get(k)
    ]
    if diffs:
        raise UserError(
            f"{run_dir} holds a run with different settings ({'; '.join(diffs)}); "
            "use a fresh --output directory or the original settings to resume"
        )
    return old


def append_run_log(run_dir: str | os.PathLike, entry: dict) -> None:
    with (Path(run_dir) / RUNS_LOG).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")
