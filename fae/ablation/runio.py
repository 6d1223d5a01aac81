"""Run-directory I/O: append-only ``claims.jsonl`` with resume, ``config.json``,
the run fingerprint and the one reader of finished runs (:func:`load_run`).

docs/runs.md describes the contract this module implements.

A claim line is written with one ``write`` of the complete line followed by
``flush`` + ``fsync``; a process killed mid-write leaves at most one line
without its final newline, which the next run cuts away (:func:`read_claims`
with ``repair=True``). Finished ids are skipped on resume, so a run killed at
any moment ends with every claim exactly once.

A run split in shards (``--shard I/N``, ``accelerate launch``, ``--executor ray``)
appends each shard's claims to ``shards/I-of-N/claims.jsonl``;
:func:`merge_claims` writes them into ``claims.jsonl`` in record order
(:mod:`fae.ablation.shards` checks the shards first).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Iterable, Sequence

from real_fae_core.atomicio import atomic_write_json, atomic_write_text
from real_fae_core.errors import UserError
from real_fae_core.fingerprint import Difference, RunFingerprint
from real_fae_core.hashing import sha256_bytes, sha256_file, sha256_text
from real_fae_core.jsonl import DurableAppender, RecordError, read_appended
from fae.ablation.engine import ARM_FIELDS

CLAIMS = "claims.jsonl"
CONFIG = "config.json"
METRICS = "metrics.json"
RUNS_LOG = "runs.jsonl"
SHARDS_DIR = "shards"  # shards/I-of-N/: one shard's config.json, claims.jsonl, runs.jsonl
# Files computed from claims.jsonl: removed when a run starts, rewritten at its end.
DERIVED = (METRICS, "report.md", "trajectory.png", "sufficiency.png")
# Settings that change the answers: resuming under different ones would mix two runs. ``adapter`` (its path) is
# compared only where neither run has a local adapter whose content (``adapter_sha256``) decides. The arms are
# every field of fae.ablation.engine.Arms (control, control_seed, ..., line_ids), named there once.
RESUME_KEYS = ("records_sha256", "backend", "model", "adapter_sha256", "rounds", "decoding",
               "constrained_decoding", "prompt_format_version", *ARM_FIELDS, "claim_set_sha256", "adapter")


def _adapter_content_decides(old: dict, new: dict) -> bool:
    """Two adapter paths of one run: a local adapter's content hash is compared instead (a moved adapter resumes)."""
    return bool(old.get("adapter_sha256") or new.get("adapter_sha256"))


def _claim_set_grows(old: dict, new: dict) -> bool:
    """A claim set that only grows (a larger --limit) keeps every finished claim valid: the run is extended."""
    return set(old.get("claim_ids") or ()) <= set(new.get("claim_ids") or ())


# The fingerprint in config.json; runs made before a key existed read with the compatibility defaults of
# `fae run` (real_fae_core.fingerprint.COMPATIBILITY_DEFAULTS: the arms, --constrained-decoding).
RUN_FINGERPRINT = RunFingerprint("fae run", RESUME_KEYS, CONFIG, equal={"adapter": _adapter_content_decides},
                                 extends={"claim_set_sha256": _claim_set_grows})
_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
_VERSION_PACKAGES = ("real-fae", "torch", "transformers", "peft", "accelerate", "openai", "vllm")


def shard_claim_files(run_dir: str | os.PathLike) -> list[Path]:
    """Every shard's claims.jsonl (``shards/I-of-N/claims.jsonl``), existing ones only."""
    root = Path(run_dir) / SHARDS_DIR
    return sorted(p for p in root.glob("*-of-*/" + CLAIMS) if p.is_file()) if root.is_dir() else []


def claim_files(run_dir: str | os.PathLike) -> list[Path]:
    """claims.jsonl and every shard's claims, existing ones only."""
    top = Path(run_dir) / CLAIMS
    return ([top] if top.is_file() else []) + shard_claim_files(run_dir)


def read_claims(path: str | os.PathLike, *, repair: bool = False) -> list[dict]:
    """Complete claim lines of ``path`` (missing file: none).

    A last line without its newline is the trace of a kill mid-write: it is
    ignored, and cut from the file when ``repair`` (:func:`real_fae_core.jsonl.read_appended`).
    A complete line that is not a claim object is an error naming the file and line.
    """
    out = []
    for lineno, obj in read_appended(path, repair=repair):
        if isinstance(obj, RecordError):
            raise obj.located(path, lineno)
        if not isinstance(obj, dict) or "id" not in obj or "rounds" not in obj:
            raise UserError(f"{path}:{lineno}: not a claim line (needs 'id' and 'rounds')")
        out.append(obj)
    return out


def finished_ids_in(path: str | os.PathLike) -> set[str]:
    """Ids of the claims already written to one claims file (none if it is missing)."""
    return {str(c["id"]) for c in read_claims(path)}


def finished_ids(run_dir: str | os.PathLike) -> set[str]:
    """Ids of every claim already written to claims.jsonl or any shard."""
    return {str(c["id"]) for f in claim_files(run_dir) for c in read_claims(f)}


class ClaimWriter(DurableAppender):
    """Appends finished claims durably (one write per chunk, fsync'd)."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, read_claims)


def merge_claims(run_dir: str | os.PathLike, record_ids: Sequence[str],
                 files: Sequence[Path] | None = None) -> list[dict]:
    """Rewrite claims.jsonl from itself and ``files`` (default: every shard's claims): record order, each id once.

    Shard files stay (each shard's own record, and what a rerun of a shard resumes from).
    Returns the merged claims.
    """
    run_dir = Path(run_dir)
    files = [run_dir / CLAIMS, *(shard_claim_files(run_dir) if files is None else files)]
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
    atomic_write_text(run_dir / CLAIMS, "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in merged))
    return merged


# ---------------------------------------------------------------------------
# config.json
# ---------------------------------------------------------------------------


def package_versions(packages: Iterable[str] = _VERSION_PACKAGES) -> dict[str, str | None]:
    """The Python version and each package's installed version (None where not installed), for a run's config."""
    import platform

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def write_json_atomic(path: str | os.PathLike, obj) -> None:
    """``obj`` as JSON in ``path`` (non-ASCII kept as is), atomically: a kill leaves the old file or the new."""
    atomic_write_json(path, obj, ensure_ascii=False)


def adapter_sha256(adapter: str | os.PathLike | None) -> str | None:
    """Content hash of a local adapter (its config and weight files), so a retrained
    adapter at the same path is a different run. None without a local adapter."""
    if not adapter or not Path(adapter).is_dir():
        return None
    files = [(name, Path(adapter) / name) for name in _ADAPTER_FILES]
    return sha256_text("".join(f"{name}\0{sha256_file(f)}\n" for name, f in files if f.is_file()))


def claim_set(ids: Sequence[str]) -> dict:
    """The stored definition of a run's claim set (config.json): ordered ids, count and hash."""
    ids = [str(i) for i in ids]
    digest = sha256_text("\n".join(ids))
    return {"n_claims": len(ids), "claim_set_sha256": digest, "claim_ids": ids}


def _show(key: str, old, new) -> str:
    if key == "claim_set_sha256":
        return f"claim set: {old} -> {new}"
    return f"{key}: {old!r} -> {new!r}"


def dtype_hint(key: str, old, new) -> str:
    """Why a run stored in fp32 differs in dtype from this command: ``--dtype auto`` is bf16 on a CPU with native
    bf16; the stored dtype, asked for by name (``--dtype fp32``), resumes it."""
    if key != "decoding" or not isinstance(old, dict) or not isinstance(new, dict):
        return ""
    if old.get("dtype") == "float32" and new.get("dtype") == "bfloat16":
        return (" (--dtype auto is bf16 on a CPU with native bf16, fp32 before: pass --dtype fp32 to resume "
                "this run)")
    return ""


def check_resume(run_dir: str | os.PathLike, config: dict) -> dict | None:
    """The existing config.json (compatibility defaults filled), after checking its fingerprint matches ``config``.

    Raises UserError naming every differing setting (:data:`RUN_FINGERPRINT`):
    resuming would mix the answers of two different runs in one claims.jsonl.
    One exception: a claim set that only grows (a larger ``--limit``) keeps
    every finished claim valid, so the run is extended. Call only when the
    directory holds finished claims; answers without a config.json are refused.
    """
    old = RUN_FINGERPRINT.read(run_dir, advice="use a fresh output directory")
    if old is None:
        raise UserError(
            f"{run_dir} holds finished claims but no {CONFIG}: their settings are unknown, so they "
            "cannot be resumed; use a fresh --output directory (or delete the claims files)"
        )
    if "claim_set_sha256" not in old:
        raise UserError(f"{RUN_FINGERPRINT.path(run_dir)} was written by an older `fae run` without a run "
                        "fingerprint; use a fresh --output directory")

    def refusal(diffs: list[Difference]) -> str:
        return (f"{run_dir} holds a run with different settings ({'; '.join(_described(d, old, config) for d in diffs)}); "
                "use a fresh --output directory or the original settings to resume")

    return RUN_FINGERPRINT.check(run_dir, config, refusal, stored=old)


def _described(d: Difference, old: dict, new: dict) -> str:
    """One difference of a refused resume, as the user can act on it."""
    if d.key == "claim_set_sha256":
        return (f"claim set: {old.get('n_claims')} claims -> {new.get('n_claims')} claims "
                "(a different --limit or records; a smaller claim set needs a fresh --output)")
    if d.key == "adapter_sha256":
        return (f"adapter content: {old.get('adapter')!r} (sha256 {str(d.old)[:12]}) -> "
                f"{new.get('adapter')!r} (sha256 {str(d.new)[:12]})")
    return _show(d.key, d.old, d.new) + dtype_hint(d.key, d.old, d.new)


def remove_derived(run_dir: str | os.PathLike) -> None:
    """Delete metrics.json, report.md, trajectory.png: they describe the claims of an earlier run."""
    for name in DERIVED:
        (Path(run_dir) / name).unlink(missing_ok=True)


def stamp_metrics(metrics: dict, claims_path: str | os.PathLike, n_claims: int) -> dict:
    """``metrics`` plus what it was computed from (claim count, sha256 of claims.jsonl)."""
    return {**metrics, "computed_from": {"file": CLAIMS, "n_claims": n_claims,
                                         "claims_sha256": sha256_file(claims_path)}}


# ---------------------------------------------------------------------------
# the one reader of finished runs (report, compare, probe, pave)
# ---------------------------------------------------------------------------


@dataclass
class RunData:
    """A finished run: its config, its claims in claim-set order, and metrics.json (or None)."""

    path: Path
    config: dict
    claims: list[dict]
    metrics: dict | None
    claims_sha256: str
    line_of: dict[str, int]  # claim id -> line in claims.jsonl (for messages)

    def claim_error(self, claim: dict, field: str | None, reason: str) -> UserError:
        """``claims.jsonl:LINE: claim 'ID': field 'F': reason`` for a claim of this run that a reader cannot use."""
        cid = claim.get("id")
        where = f"{self.path / CLAIMS}:{self.line_of.get(str(cid), '?')}: claim {cid!r}"
        return UserError(where + (f": field {field!r}" if field else "") + f": {reason}")

    @property
    def resume_hint(self) -> str:
        """How to finish this run, for messages: rerun its recorded command (its `fae run` command when none was)."""
        cmd = self.config.get("command")
        return f"rerun `{cmd}`" if cmd else "rerun its `fae run` command"


def _read_json(path: Path, what: str) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: expected a JSON object ({what})")
    return obj


def load_run(run_dir: str | os.PathLike) -> RunData:
    """Read a run directory and refuse anything that is not one finished, consistent run.

    Refused (UserError, one line): no config.json (orphan answers), no claim set
    in the config, unmerged shards or missing claims (unfinished), claims outside
    the claim set or twice, and a metrics.json not computed from this claims.jsonl.
    """
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise UserError(f"run directory {run_dir} not found")
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: not a directory (expected a `fae run` output directory)")
    cpath, claims_path = run_dir / CONFIG, run_dir / CLAIMS
    if not cpath.is_file():
        if claim_files(run_dir):
            raise UserError(f"{run_dir}: claims without a {CONFIG}; answers of unknown settings are not "
                            "a run (rerun `fae run` into a fresh --output)")
        raise UserError(f"{run_dir}: no {CONFIG}; is it a `fae run` output directory?")
    config = _read_json(cpath, "the run's settings")
    ids = config.get("claim_ids")
    if not isinstance(ids, list):
        raise UserError(f"{cpath}: no claim set ('claim_ids'); written by an older `fae run`? "
                        "Rerun it into a fresh --output")
    data = RunData(run_dir, config, [], None, "", {})
    if "shard" in config:
        raise UserError(f"{run_dir}: one shard of a run, not the run; `fae merge` its run directory "
                        f"({run_dir.parent.parent}) when every shard is done")
    by_id: dict[str, dict] = {}
    lineno = 0
    if claims_path.is_file():
        raw = claims_path.read_bytes()
        data.claims_sha256 = sha256_bytes(raw)
        for c in read_claims(claims_path):
            lineno += 1
            cid = str(c["id"])
            if cid in by_id:
                raise UserError(f"{claims_path}: claim {cid!r} appears twice; the directory mixes runs")
            by_id[cid] = c
            data.line_of[cid] = lineno
    wanted = set(map(str, ids))
    extra = [i for i in by_id if i not in wanted]
    if extra:
        raise UserError(f"{claims_path}: {len(extra)} claims are not in the run's claim set "
                        f"(e.g. {extra[0]!r}); the directory mixes runs, use a fresh --output")
    missing = [i for i in map(str, ids) if i not in by_id]
    if missing:
        hint = (f"`fae merge {run_dir}` once every shard is done" if shard_claim_files(run_dir)
                else data.resume_hint + " to finish it")
        raise UserError(f"{run_dir}: unfinished run ({len(missing)} of {len(ids)} claims missing, "
                        f"e.g. {missing[0]!r}); {hint}")
    data.claims = [by_id[str(i)] for i in ids]
    mpath = run_dir / METRICS
    if mpath.is_file():
        metrics = _read_json(mpath, "metrics")
        src = metrics.get("computed_from")
        if not isinstance(src, dict) or src.get("claims_sha256") != data.claims_sha256 \
                or src.get("n_claims") != len(data.claims):
            have = (f"{src.get('n_claims')} claims, sha256 {str(src.get('claims_sha256'))[:12]}"
                    if isinstance(src, dict) else "no record of its source")
            raise UserError(
                f"{mpath} does not match {CLAIMS} (metrics: {have}; {CLAIMS}: {len(data.claims)} claims, "
                f"sha256 {data.claims_sha256[:12]}); {data.resume_hint} to recompute it"
            )
        data.metrics = metrics
    return data


def append_run_log(run_dir: str | os.PathLike, entry: dict) -> None:
    """Append one invocation's entry (shard, times, counts, error) to the run's runs.jsonl; earlier entries stay."""
    with (Path(run_dir) / RUNS_LOG).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def resolve_records(run_dir: Path, cfg: dict, override: str | None) -> Path:
    """The records file the run read; its sha256 must match when recorded."""
    if override is not None:
        path = Path(override)
        if not path.is_file():
            raise UserError(f"--records {override!r}: file not found")
    else:
        raw = cfg.get("records")
        if not isinstance(raw, str) or not raw:
            raise UserError(f"{run_dir / 'config.json'}: field 'records' is missing; pass --records")
        path = Path(raw)
        if not path.is_file() and not path.is_absolute() and (run_dir / raw).is_file():
            path = run_dir / raw
        if not path.is_file():
            raise UserError(
                f"{run_dir / 'config.json'}: field 'records' points to {raw!r}, which does not "
                f"exist; pass --records"
            )
    want = cfg.get("records_sha256")
    if want:
        got = sha256_file(path)
        if got != want:
            raise UserError(
                f"{path}: sha256 {got[:12]}... does not match records_sha256 {str(want)[:12]}... "
                f"in {run_dir / 'config.json'}: these are not the records the run read"
            )
    return path
