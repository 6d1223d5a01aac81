"""`fae probe RUN_DIR --model M --output DIR`: the command line of the DirK probe (SPEC §7).

The parser is generated from :mod:`fae.probes.config`; what the probe computes and writes is :mod:`fae.probes.runner`.
"""

from __future__ import annotations

import argparse

from real_fae_core.command import CommandResult, add_config_arguments, field_names
from fae.probes.config import ProbeConfig, ProbeFields
from fae.backends.options import HFLoadFields

CONFIG = ProbeConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    # the probe's own options, then the hf backend's loading options as `fae run --backend hf` has them
    # (under its heading: their fields' `group`)
    add_config_arguments(p, ProbeConfig, field_names(ProbeFields, HFLoadFields))


def run(config: ProbeConfig) -> CommandResult:
    from fae.probes.runner import run as run_probe  # it loads torch: `fae --help` does not

    return run_probe(config)
