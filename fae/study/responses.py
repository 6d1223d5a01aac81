"""The study directory: its fingerprint, the unit table, and the append-only responses file.

``responses.jsonl`` holds one line per prompt answered, in the order of :func:`fae.study.grid` 's
conditions, appended a batch at a time (one ``write``, ``flush``, ``fsync``). A kill mid-write leaves at
most one line without its newline, cut on the next start (:func:`real_fae_core.jsonl.read_appended`), and
what is done is always a prefix of the order, so a resumed run writes the same bytes as one that never
stopped. ``units.jsonl`` holds what the report scores with (gold, submitted evidence per budget and
source) so a study directory is read without the pools. A shard of ``--shard I/N`` writes the same files
under ``shards/I-of-N/``; the unsharded command then counts them as done and writes the whole file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from real_fae_core.atomicio import atomic_write_text
from real_fae_core.errors import UserError
from real_fae_core.fingerprint import RunFingerprint
from real_fae_core.jsonl import DurableAppender, RecordError, read_appended

RESPONSES = "responses.jsonl"
RESPONSES_GZ = RESPONSES + ".gz"  # a finished study kept gzipped (the committed ones): read as it is
UNITS = "units.jsonl"
STUDY = "study.json"
SHARDS = "shards"
# Settings and inputs that change the answers: a resume or a merge under other ones would mix two studies.
FINGERPRINT = ("pools_sha256", "dataset", "backend", "model", "adapter", "adapter_sha256", "dtype", "formats",
               "budgets", "sources", "seeds", "sampling", "max_new_tokens", "control_claims", "tokenizers",
               "scheme")
# study.json has recorded every key since the first `fae study`: no compatibility defaults
# (real_fae_core.fingerprint.COMPATIBILITY_DEFAULTS["fae study"] is empty).
STUDY_FINGERPRINT = RunFingerprint("fae study", FINGERPRINT, STUDY)


def read_responses(path: str | os.PathLike, *, repair: bool = False, numbered: bool = False) -> list:
    """The complete lines of a responses file (none when it is missing); a bad line is one located error.
    ``numbered``: ``(line number, line)`` pairs."""
    out = []
    for lineno, obj in read_appended(path, repair=repair):
        if isinstance(obj, RecordError):
            raise obj.located(path, lineno)
        if not isinstance(obj, dict) or "unit" not in obj or "answer" not in obj:
            raise UserError(f"{path}:{lineno}: not a study response (needs 'unit' and 'answer')")
        out.append((lineno, obj) if numbered else obj)
    return out


def finished_responses(directory: Path) -> Path:
    """The responses file of a finished study: ``responses.jsonl``, else ``responses.jsonl.gz`` (a study kept
    compressed, as committed, reads without unpacking it); both at once would be two answers files, refused."""
    plain, packed = directory / RESPONSES, directory / RESPONSES_GZ
    if packed.is_file() and plain.is_file():
        raise UserError(f"{directory} holds both {RESPONSES} and {RESPONSES_GZ}: keep one")
    return packed if packed.is_file() else plain


class ResponseWriter(DurableAppender):
    """Appends answered prompts durably, a batch per write."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, read_responses)


def check_fingerprint(directory: Path, config: dict, what: str = "a study") -> None:
    """Refuse a directory whose study.json was made with other settings or inputs (every difference named)."""
    old = STUDY_FINGERPRINT.read(directory)
    if old is None:
        if (directory / RESPONSES).is_file() and read_responses(directory / RESPONSES):
            raise UserError(f"{directory} holds responses but no {STUDY}: their settings are unknown; "
                            "use a fresh --output")
        return
    STUDY_FINGERPRINT.check(directory, config, lambda diffs: (
        f"{directory} holds {what} made with other settings or inputs ({'; '.join(map(str, diffs))}); "
        "use a fresh --output or the original settings"), stored=old)


def write_start(directory: Path, config: dict, units: list[dict]) -> None:
    """study.json and units.jsonl, each written whole (both are the same on every resume)."""
    directory.mkdir(parents=True, exist_ok=True)
    STUDY_FINGERPRINT.write(directory, config)
    atomic_write_text(directory / UNITS, "".join(json.dumps(u, ensure_ascii=False) + "\n" for u in units))


def shard_dirs(directory: Path) -> list[Path]:
    """The shard directories of a study output (``shards/I-of-N``), sorted; empty for an unsharded study."""
    root = directory / SHARDS
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def merge_in_order(lines: Sequence[dict], order: Sequence[tuple], key) -> list[dict]:
    """``lines`` in the order of the keys ``order`` (each once); a line of no key is refused."""
    by_key = {}
    for x in lines:
        by_key.setdefault(key(x), x)
    pos = {k: i for i, k in enumerate(order)}
    stray = [k for k in by_key if k not in pos]
    if stray:
        raise UserError(f"responses of conditions outside this study ({stray[0]!r}); use a fresh --output")
    return sorted(by_key.values(), key=lambda x: pos[key(x)])


def rewrite_responses(path: Path, lines: Sequence[dict]) -> None:
    """The whole responses file in order, written at once (a merge of shards, or a resume's tidy end)."""
    atomic_write_text(path, "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
