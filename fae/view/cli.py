"""`fae view RUN [RUN ...] --output DIR`: a static per-claim ablation explorer (docs/view.md).

Opens from the file system in any browser: no server, no network. A run
table (the report's metrics, each number a link to the claims behind it),
a claim list with filters (kept the gold label at round r, flipped,
invalid, cut off, hallucinated ids, NEI-gold excluded, dataset, gold label,
text) sorted by P(gold) drop, and a claim page with the pool of every round
(removed lines struck through, cited lines highlighted), the raw and parsed
answers and P(gold)/P(NEI) per round, several runs side by side by claim id.
"""

from __future__ import annotations

import argparse

from real_fae_core.command import add_config_arguments
from fae.view.runner import ViewConfig
from fae.view.runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = ViewConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `fae view`, one per field of :class:`ViewConfig`."""
    add_config_arguments(p, ViewConfig)
