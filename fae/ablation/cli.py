"""`fae run`: multi-round evidence ablation of a verifier (SPEC §6).

This module is the command's parser; the run is :func:`fae.ablation.runner.run`. The options
are the dataclass :class:`~fae.ablation.options.FaeRunArguments`, parsed like training's
recipes: defaults < YAML (``--config FILE.yaml``, keys spelled like the flags, ``-`` or ``_``)
< command line. The run directory gets ``claims.jsonl`` (appended as claims finish; rerunning the
same command resumes), ``config.json``, ``metrics.json``, ``report.md`` and ``trajectory.png``.

A run can be split in shards (:mod:`fae.ablation.shards`): ``--shard I/N`` runs
shard I of N (any backend, any machine; ``fae merge RUN_DIR`` joins them),
``--executor ray --shards N`` runs all N as Ray tasks, and under ``accelerate
launch`` (or torchrun) each process of the ``hf`` backend is a shard, merged by
the main process at the end.
"""

from __future__ import annotations

import shlex
from typing import Any

from fae.ablation.options import (  # noqa: F401 - make_parser: the command's whole parser
    FaeRunArguments, check_backend_fields, make_parser, parse_run_args)
from fae.ablation.runner import run  # noqa: F401 - the command's run(config), for the dispatcher

CONFIG = FaeRunArguments


def parse_args(argv: list[str], prog: str = "fae run") -> tuple[FaeRunArguments, dict[str, Any]]:
    """(the options, ``{"command": the command line as given, "config_file": the --config YAML or None}``).

    Called by :func:`real_fae_core.cli.dispatch` instead of ``add_arguments``:
    the options are a dataclass parsed by ``HfArgumentParser`` (fae.ablation.options).
    ``command`` is stored in config.json: the one to rerun to resume.
    """
    options, config = parse_run_args(argv, prog)
    check_backend_fields(options.backend, argv, config)  # another backend's option would be ignored
    return options, {"command": shlex.join([*prog.split(), *argv]), "config_file": config}
