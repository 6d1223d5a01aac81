"""Telling a Hugging Face hub id from a local path, before anything is downloaded or loaded; naming a model
without one machine's paths."""

from __future__ import annotations

import re
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def is_hub_id(name: str) -> bool:
    """True for ``org/name`` or ``name``; False for what can only be a path (``./x``, ``/x``, ``~/x``, ``a/b/c``)."""
    return not name.startswith((".", "/", "~")) and _HUB_ID.match(name) is not None


def portable_name(model: str) -> str:
    """A model (or tokenizer) as a report or a committed result names it: a local directory by its last part
    (``/tmp/x/models/gemma3-270m`` -> ``gemma3-270m``), a hub id or served name as given. A path of one machine
    (``/tmp/...``, ``/root/...``) means nothing on another and must not enter a file meant to be read there;
    the path itself stays wherever it is compared (a resume, a fingerprint)."""
    local = Path(model).expanduser()
    return local.name if not is_hub_id(model) or local.exists() else model
