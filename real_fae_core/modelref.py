"""Telling a Hugging Face hub id from a local path, before anything is downloaded or loaded."""

from __future__ import annotations

import re

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def is_hub_id(name: str) -> bool:
    """True for ``org/name`` or ``name``; False for what can only be a path (``./x``, ``/x``, ``~/x``, ``a/b/c``)."""
    return not name.startswith((".", "/", "~")) and _HUB_ID.match(name) is not None
