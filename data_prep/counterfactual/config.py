"""The options of `real-data counterfactual` (:class:`CounterfactualConfig`): read by its command line
(:mod:`data_prep.counterfactual.cli`) without the openai client that :mod:`data_prep.counterfactual.runner` loads."""

from __future__ import annotations

import dataclasses
from typing import Literal

from real_fae_core.command import CommandConfig

from . import KINDS


@dataclasses.dataclass
class CounterfactualConfig(CommandConfig):
    """`real-data counterfactual`: counterfactual evidence pools for `fae pave`."""

    records: str
    output: str
    kinds: list[str] = dataclasses.field(default_factory=lambda: list(KINDS))
    entity_method: Literal["rules", "llm"] = "rules"
    annotators: str | None = None  # needed for semantic and entity_method llm
    annotator: str | None = None
    judge: str | None = None
    cache: str | None = None  # default OUTPUT.cache.sqlite
    seed: int = 0
    min_overlap: float | None = dataclasses.field(default=None, metadata={"min": 0, "max": 1})
    no_progress: bool = False
