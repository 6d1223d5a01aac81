"""`real-data pairs --records FILE --variant V --output DIR`: the command line of the REAL training set.

The parser is generated from the fields of :class:`~data_prep.pairs.runner.PairsConfig`; what the pairs are and
what is written is :mod:`data_prep.pairs.runner`.
"""

from __future__ import annotations

from real_fae_core.command import add_config_arguments
from data_prep.pairs.runner import PairsConfig
from data_prep.pairs.runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = PairsConfig


def add_arguments(p):
    """The options of `real-data pairs`, one per field of :class:`PairsConfig`."""
    add_config_arguments(p, PairsConfig)
