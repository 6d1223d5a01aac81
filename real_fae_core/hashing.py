"""Content hashes (sha256, hex) that tie results to the exact inputs they came from."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

_BLOCK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    return sha256_bytes(text.encode("utf-8"))


def sha256_json(obj: Any) -> str:
    """Hash of a JSON value, independent of key order."""
    return sha256_text(json.dumps(obj, sort_keys=True, ensure_ascii=False))


def derived_seed(*parts: Any) -> int:
    """A 31-bit seed named by its parts (base seed, claim id, condition, ...).

    Sampled answers seeded this way depend on what they are for, never on what
    else ran before them in the process (batching, order, an interrupted run).
    31 bits: every OpenAI-compatible server (vLLM, llama.cpp) accepts it.
    """
    return int(sha256_json([str(p) for p in parts])[:16], 16) % 2**31


def sha256_file(path: str | os.PathLike) -> str:
    """Hash of one file's bytes, read in 1 MiB blocks (model weights fit in no memory budget)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def sha256_tree(root: str | os.PathLike, files: Iterable[str | os.PathLike]) -> str:
    """Hash of several files together: each one's path relative to ``root`` and its bytes, in the given order."""
    root = Path(root)
    h = hashlib.sha256()
    for f in files:
        f = Path(f)
        h.update(str(f.relative_to(root) if f.is_absolute() or root in f.parents else f).encode())
        with f.open("rb") as fh:
            for block in iter(lambda: fh.read(_BLOCK), b""):
                h.update(block)
    return h.hexdigest()
