"""The options of `real-data counterfactual` (:class:`CounterfactualConfig`): read by its command line
(:mod:`data_prep.counterfactual.cli`) without the openai client that :mod:`data_prep.counterfactual.runner` loads."""

from __future__ import annotations

import dataclasses
from typing import Literal

from real_fae_core.command import CommandConfig, option
from real_fae_core.flags import SpacedList

from . import KINDS


@dataclasses.dataclass
class CounterfactualConfig(CommandConfig):
    """`real-data counterfactual`: counterfactual evidence pools for `fae pave`."""

    records: str = option(help="input claim records (JSONL)")
    output: str = option(help="output JSONL (summary: OUTPUT.summary.json)")
    kinds: list[str] = option(default_factory=lambda: list(KINDS), action=SpacedList, metavar="KIND",
                              help=f"kinds to build: {', '.join(KINDS)} (default all: --kinds {' '.join(KINDS)})")
    entity_method: Literal["rules", "llm"] = option(
        "rules", help="rules: swap spans from the records' own sentences, no model (default); llm: ask the annotator")
    annotators: str | None = option(None, help="annotators YAML, as for `real-data enhance` (needed for semantic and "
                                               "--entity-method llm)")
    annotator: str | None = option(None, metavar="NAME", help="which entry of --annotators to use (default: the first)")
    judge: str | None = option(None, metavar="NAME", help="entry of --annotators that checks each counterfactual's "
                                                          "verdict (default: --annotator)")
    cache: str | None = option(None, help="SQLite answer cache (default OUTPUT.cache.sqlite)")
    seed: int = option(0, help="seed of the rule-based swaps and of the requests' seeds at temperature > 0")
    min_overlap: float | None = option(None, min=0, max=1, metavar="FRACTION", help="share of the original's content "
                                       "words a semantic rewrite must keep (default 0.3)")
    no_progress: bool = option(False)
