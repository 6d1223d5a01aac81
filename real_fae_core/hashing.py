"""Content hashes (sha256, hex) that tie results to the exact inputs they came from."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any, Iterable

_BLOCK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    """The sha256 of ``data``, as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


def sha256_text(text: str) -> str:
    """The sha256 of ``text`` encoded as UTF-8 (hex), so equal strings hash equal on every platform."""
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


# Two older derivations, kept because committed results depend on their exact values (the FAE control and
# sweep draws, the pairs data, the counterfactual requests and audit, the demo's reference numbers): a
# change would move every number drawn from them. New code uses derived_seed.

def keyed_rng(*parts: Any, sep: str = ":") -> random.Random:
    """A generator seeded by the text of its parts joined by ``sep`` (``"fae-control:3:claim-7"``).

    ``random.Random`` hashes a str seed (sha512), so the stream is the same on every run and platform
    and depends on the parts only. Used by the FAE control and size-sweep orders and the matched control
    (``fae/ablation/engine.py``), the pairs' removals (``data_prep/pairs/build.py``), the counterfactual
    audit's strata (``data_prep/counterfactual/audit.py``), the demo's simulated annotators and its world's
    incomplete gold and counterfactual lines (``real/demo/world.py``, ``sep="-"``: ``"demo-counterfactual-13"``).
    """
    return random.Random(sep.join(str(p) for p in parts))


def sha256_seed(*parts: Any, sep: str = "\0", bits: int = 64) -> int:
    """The first ``bits`` (at most 64) bits of sha256 over the text of the parts joined by ``sep``.

    Used by the counterfactual entity swaps (64 bits, a ``random.Random`` seed) and request seeds
    (31 bits: every server's integer seed accepts it; ``data_prep/counterfactual``) and PAVE's tuning
    split (``sep=":"``; divided by 2**64, a uniform draw in [0, 1); ``fae/pave/metrics.py``).
    """
    if not 0 < bits <= 64:
        raise ValueError(f"bits must be in 1..64, not {bits}")
    digest = hashlib.sha256(sep.join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - bits)


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
