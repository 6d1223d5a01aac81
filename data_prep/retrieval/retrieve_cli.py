"""`real-data retrieve --dataset D --claims FILE --corpus FILE --index FILE --output DIR`: the command line of
the evidence pools (SPEC §10).

The parser is generated from :class:`~data_prep.retrieval.retrieve_runner.RetrieveConfig`; what is
retrieved and written is :mod:`data_prep.retrieval.retrieve_runner`.
"""

from __future__ import annotations

from real_fae_core.command import add_config_arguments
from data_prep.retrieval.retrieve_runner import RetrieveConfig
from data_prep.retrieval.retrieve_runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = RetrieveConfig


def add_arguments(p):
    """The options of `real-data retrieve`, one per field of :class:`RetrieveConfig`."""
    add_config_arguments(p, RetrieveConfig)
