"""The label set of SPEC §2, defined once: every module compares labels against these."""

from __future__ import annotations

SUPPORT = "SUPPORT"
REFUTE = "REFUTE"
NOT_ENOUGH_INFO = "NOT_ENOUGH_INFO"
LABELS: tuple[str, ...] = (SUPPORT, REFUTE, NOT_ENOUGH_INFO)
