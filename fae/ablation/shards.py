"""Shards: one FAE run split over machines, processes or Ray tasks, merged back into one run.

A run of ``n`` shards deals its claims once (:func:`deal`): the same records and
options give the same deal on every machine, so shard ``i`` of ``n`` needs no
coordinator. Each shard writes only inside its own directory
``RUN_DIR/shards/<i>-of-<n>/`` (``config.json`` with the run's fingerprint and
the shard's claim ids, ``claims.jsonl`` appended as claims finish,
``runs.jsonl``), under its own lock, and resumes on its own. :func:`merge`
(``fae merge RUN_DIR``; also the last step of an ``accelerate launch`` run, whose
ranks are shards ``rank``-of-``world``) checks that every shard is there,
complete and of the same run, then writes ``claims.jsonl`` in record order.

The deal balances prompt length, not claim count: claims are taken longest
prompt first and each goes to the shard with the least prompt text so far, so
no shard gets all the long pools (FAE time is prefill time, roughly linear in
prompt length). Ties go to the lower record index and the lower shard.
"""

from __future__ import annotations

import heapq
import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from real_fae_core.atomicio import atomic_write_text
from real_fae_core.errors import UserError
from real_fae_core.hashing import sha256_text
from real_fae_core.runlock import LOCK_NAME
from fae.ablation import runio

SHARDS_DIR = runio.SHARDS_DIR
_SPEC = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
_DIR = re.compile(r"(\d+)-of-(\d+)")
_SHARD_FLAG = re.compile(r"(--shard[= ]\s*)\d+\s*/\s*\d+")
# config.json keys that may differ between shards of one run (everything else must be equal)
_PER_SHARD = ("command", "config_file", "shard", "settings", "versions", "records")


def parse_shard(text: str, flag: str = "--shard") -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)``: 0 <= I < N (0-based, as Slurm array and Kubernetes Indexed Job indexes are)."""
    m = _SPEC.fullmatch(str(text))
    if not m:
        raise UserError(f"{flag} {text!r}: expected I/N (shard I of N, 0-based), e.g. 0/4")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise UserError(f"{flag} {text!r}: N must be at least 1")
    if i >= n:
        raise UserError(f"{flag} {text!r}: I must be in 0..{n - 1} (shards are numbered from 0)")
    return i, n


def prompt_chars(record) -> int:
    """The prompt text a claim's round 0 sends (claim + every sentence): the deal's load measure."""
    return len(record.claim) + sum(len(s.text) + 8 for s in record.sentences)


def deal(records: Sequence, n: int) -> list[list[int]]:
    """Record indexes of each of ``n`` shards, each list in record order (longest-first greedy balance)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    order = sorted(range(len(records)), key=lambda k: (-prompt_chars(records[k]), k))
    heap = [(0, s) for s in range(n)]
    out: list[list[int]] = [[] for _ in range(n)]
    for k in order:
        load, s = heapq.heappop(heap)
        out[s].append(k)
        heapq.heappush(heap, (load + prompt_chars(records[k]), s))
    return [sorted(ks) for ks in out]


def deal_sha256(ids_per_shard: Sequence[Sequence[str]]) -> str:
    """Identity of a deal: the same on every machine that dealt the same claims."""
    return sha256_text("\n".join(f"{s}:" + ",".join(map(str, ids)) for s, ids in enumerate(ids_per_shard)))


def shard_dir(run_dir: str | os.PathLike, i: int, n: int) -> Path:
    """Where shard ``i`` of ``n`` writes: ``RUN_DIR/shards/i-of-n``."""
    return Path(run_dir) / SHARDS_DIR / f"{i}-of-{n}"


def shard_name(i: int, n: int) -> str:
    """A shard as messages name it: ``shard i/n``."""
    return f"shard {i}/{n}"


def shard_section(records: Sequence, i: int, n: int) -> dict:
    """The ``shard`` entry of a shard's config.json: its index, the count, its claim ids and the deal's hash."""
    ids = [[str(records[k].id) for k in ks] for ks in deal(records, n)]
    return {"index": i, "count": n, "claim_ids": ids[i], "deal_sha256": deal_sha256(ids)}


# ---------------------------------------------------------------------------
# merging
# ---------------------------------------------------------------------------


@dataclass
class ShardState:
    index: int
    count: int
    path: Path
    config: dict
    claims: list[dict]


def _read_config(path: Path) -> dict:
    try:
        obj = json.loads((path / runio.CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: no {runio.CONFIG}; not a shard of `fae run --shard` "
                        "(rerun that shard's command)") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path / runio.CONFIG}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("shard"), dict):
        raise UserError(f"{path / runio.CONFIG}: not a shard's config (no 'shard' entry)")
    return obj


def found_shards(run_dir: str | os.PathLike) -> list[tuple[int, int, Path]]:
    """(index, count, directory) of every ``shards/I-of-N`` directory, sorted."""
    root = Path(run_dir) / SHARDS_DIR
    out = []
    if root.is_dir():
        for p in root.iterdir():
            m = _DIR.fullmatch(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), int(m.group(2)), p))
    return sorted(out)


# What must be equal across the shards of one run: the run's fingerprint plus the deal (of :func:`fingerprint`).
SHARD_FINGERPRINT = replace(runio.RUN_FINGERPRINT, keys=runio.RESUME_KEYS + ("deal_sha256", "count"))


def fingerprint(config: dict) -> dict:
    """A shard's config.json with its deal (``shard``: deal_sha256, count) at the top, as
    :data:`SHARD_FINGERPRINT` compares it."""
    sec = config.get("shard") or {}
    return {**config, "deal_sha256": sec.get("deal_sha256"), "count": sec.get("count")}


def _differences(a: dict, b: dict) -> list[str]:
    """How shard config ``b`` differs from ``a`` (hashes shortened); none: the same run."""
    out = []
    for d in SHARD_FINGERPRINT.differences(fingerprint(a), fingerprint(b), resume=False):
        if d.key in ("claim_set_sha256", "deal_sha256", "records_sha256", "adapter_sha256"):
            out.append(f"{d.key} {str(d.old)[:12]} vs {str(d.new)[:12]}")
        else:
            out.append(f"{d.key} {d.old!r} vs {d.new!r}")
    return out


def load_shards(run_dir: str | os.PathLike, count: int | None = None) -> list[ShardState]:
    """Every shard of the run in ``run_dir``, checked: one count, none missing, one fingerprint, each complete.

    A missing, partial or foreign shard is a :class:`UserError` naming it. Claims already in the
    run's own claims.jsonl (an earlier single-process or merged pass of the same run) count as done.
    """
    return read_shards(run_dir, count)[0]


def read_shards(run_dir: str | os.PathLike, count: int | None = None) -> tuple[list[ShardState], list[dict]]:
    """(:func:`load_shards`, the claims of the run's own claims.jsonl): every claims file read once."""
    run_dir = Path(run_dir)
    have, n = _shard_dirs(run_dir, count)
    configs = _shard_configs(have, n)
    done = runio.read_claims(run_dir / runio.CLAIMS)
    done_here = {str(c["id"]) for c in done}
    states: list[ShardState] = []
    first: dict | None = None  # shard 0's config.json
    for i in range(n):
        path, config = have[i], configs[i]
        sec = config["shard"]
        if sec.get("index") != i or sec.get("count") != n:
            raise UserError(f"{path / runio.CONFIG}: says shard {sec.get('index')}/{sec.get('count')}, "
                            f"but lies in {path.name}; a copied directory?")
        if first is None:
            first = config
        elif diffs := _differences(first, config):
            raise UserError(f"{path}: {shard_name(i, n)} is from a different run than shard 0/{n} "
                            f"({'; '.join(diffs)}); rerun it with shard 0's settings")
        claims = runio.read_claims(path / runio.CLAIMS)
        ids = {str(c["id"]) for c in claims}
        wanted = [str(x) for x in sec.get("claim_ids") or []]
        foreign = ids - set(wanted)
        if foreign:
            raise UserError(f"{path / runio.CLAIMS}: {len(foreign)} claims are not in {shard_name(i, n)}'s deal "
                            f"(e.g. {sorted(foreign)[0]!r}); the directory mixes runs")
        todo = [x for x in wanted if x not in ids and x not in done_here]
        if todo:
            cmd = config.get("command") or f"fae run ... --shard {i}/{n}"
            raise UserError(f"{path}: {shard_name(i, n)} is partial ({len(wanted) - len(todo)} of {len(wanted)} "
                            f"claims); finish it with: {cmd}")
        states.append(ShardState(i, n, path, config, claims))
    return states, done


def _shard_dirs(run_dir: Path, count: int | None) -> tuple[dict[int, Path], int]:
    """({index: directory}, N) of the one split under ``run_dir``; none, two splits or a missing shard is refused."""
    found = found_shards(run_dir)
    if count is not None:
        found = [f for f in found if f[1] == count]
    if not found:
        raise UserError(f"{run_dir}: no shards ({SHARDS_DIR}/I-of-N directories); run `fae run ... --shard I/N` "
                        "for each I first")
    counts = sorted({n for _, n, _ in found})
    if len(counts) > 1:
        raise UserError(f"{run_dir}: shards of different splits ({', '.join(f'of {n}' for n in counts)}); "
                        f"keep the directories of one split under {run_dir / SHARDS_DIR}")
    n = counts[0]
    have = {i: p for i, _, p in found}
    missing = [i for i in range(n) if i not in have]
    if missing:
        raise UserError(f"{run_dir}: {shard_name(missing[0], n)} is missing ({len(missing)} of {n} missing; "
                        f"no {shard_dir(run_dir, missing[0], n)}); run it with --shard {missing[0]}/{n}")
    return have, n


def never_started(path: Path) -> bool:
    """A shard directory with nothing of a run in it (at most its lock file): its `fae run --shard` was
    refused, or stopped, before it wrote its config.json."""
    return not any(p.name != LOCK_NAME for p in path.iterdir())


def _shard_configs(have: dict[int, Path], n: int) -> dict[int, dict]:
    """{index: config.json} of every shard; a shard that never started is refused with the command that runs it."""
    never = [i for i in range(n) if never_started(have[i])]
    configs = {i: _read_config(have[i]) for i in range(n) if i not in never}
    if never:
        i = never[0]
        raise UserError(f"{have[i]}: {shard_name(i, n)} never started (its directory is empty: its run was refused "
                        f"or stopped before it began; {len(never)} of {n} shards never started); "
                        f"run it with: {shard_command(configs, i, n)}")
    return configs


def shard_command(configs: dict[int, dict], i: int, n: int) -> str:
    """The command of shard ``i``: another shard's recorded command with its ``--shard`` spec changed."""
    for config in configs.values():
        command = config.get("command")
        if isinstance(command, str) and _SHARD_FLAG.search(command):
            return _SHARD_FLAG.sub(lambda m: f"{m.group(1)}{i}/{n}", command, count=1)
    return f"fae run ... --shard {i}/{n}"


def merged_config(states: Sequence[ShardState], command: str | None) -> dict:
    """The run's config.json after a merge: shard 0's settings, the shard split recorded, no per-shard entry."""
    base = dict(states[0].config)
    sec = base.pop("shard")
    base["shards"] = {"count": sec["count"], "deal_sha256": sec["deal_sha256"],
                      "commands": [s.config.get("command") for s in states]}
    if command:
        base["merged_by"] = command
    return base


def check_run_config(run_dir: Path, config: dict) -> None:
    """A run directory whose own config.json is of another run is refused (its claims would mix)."""
    runio.RUN_FINGERPRINT.check(
        run_dir, config, advice="use a fresh run directory",
        refusal=lambda diffs: (f"{runio.RUN_FINGERPRINT.path(run_dir)} belongs to a different run than its shards "
                               f"(differs in: {', '.join(d.key for d in diffs)}); merge into the directory the "
                               "shards were run in"))


def merge(run_dir: str | os.PathLike, count: int | None = None, command: str | None = None
          ) -> tuple[dict, list[dict]]:
    """Check the shards (:func:`load_shards`) and write the run's config.json and claims.jsonl (record order).

    Returns (config, claims). Idempotent: merging again rewrites the same files. Each claims file
    is read once: the claims the checks read are the ones merged.
    """
    run_dir = Path(run_dir)
    states, done = read_shards(run_dir, count)
    config = merged_config(states, command)
    check_run_config(run_dir, config)
    runio.RUN_FINGERPRINT.write(run_dir, config)
    claims = join_claims(run_dir, config["claim_ids"], [done, *(s.claims for s in states)])
    if len(claims) != len(config["claim_ids"]):
        raise UserError(f"{run_dir}: {len(config['claim_ids']) - len(claims)} claims missing after the merge")
    return config, claims


def join_claims(run_dir: Path, record_ids: Sequence[str], parts: Sequence[Sequence[dict]]) -> list[dict]:
    """Write ``run_dir``/claims.jsonl from claims already read (the run's own first, then each shard's):
    record order, each id once, as :func:`runio.merge_claims` does from the files. Returns the claims."""
    by_id: dict[str, dict] = {}
    for claims in parts:
        for c in claims:
            by_id.setdefault(str(c["id"]), c)
    order = {rid: k for k, rid in enumerate(record_ids)}
    unknown = [i for i in by_id if i not in order]
    if unknown:
        raise UserError(f"{run_dir}: claims {unknown[:3]} are not in the records file; use a fresh output directory")
    merged = sorted(by_id.values(), key=lambda c: order[str(c["id"])])
    atomic_write_text(run_dir / runio.CLAIMS, "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in merged))
    return merged
