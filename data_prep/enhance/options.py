"""The options of `real-data enhance` (:class:`EnhanceConfig`), their cross-field checks and the
command line that resumes a run; light to import (the run itself is :func:`data_prep.enhance.runner.run`)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from real_fae_core.command import CommandConfig
from real_fae_core.errors import UserError


@dataclasses.dataclass
class EnhanceConfig(CommandConfig):
    """`real-data enhance`: enhanced evidence by a majority vote of annotator LLMs."""

    records: str
    output: str
    annotators: str | None = None  # required unless revote
    cache: str | None = None  # default OUTPUT.cache.sqlite
    dry_run: bool = False
    min_votes: int | None = dataclasses.field(default=None, metadata={"min": 1})
    revote: bool = False
    include_nei: bool = False
    retry_abstentions: bool = False
    max_in_flight: int | None = dataclasses.field(default=None, metadata={"min": 1})
    no_progress: bool = False


def resume_command(config: EnhanceConfig) -> str:
    """The command line that resumes this run (same records, annotators, output, cache, options)."""
    words = ["real-data", "enhance", "--records", str(config.records), "--annotators", str(config.annotators),
             "--output", str(config.output)]
    if config.cache is not None:
        words += ["--cache", str(config.cache)]
    if config.min_votes is not None:
        words += ["--min-votes", str(config.min_votes)]
    if config.max_in_flight is not None:
        words += ["--max-in-flight", str(config.max_in_flight)]
    words += [flag for flag, on in (("--include-nei", config.include_nei),
                                    ("--retry-abstentions", config.retry_abstentions),
                                    ("--no-progress", config.no_progress)) if on]
    return shlex.join(words)


def check_options(config: EnhanceConfig) -> None:
    """The checks across fields: --revote with --dry-run, --annotators missing, --output = --records."""
    if config.revote and config.dry_run:
        raise UserError("--revote sends no requests; --dry-run does not apply")
    if not config.revote and config.annotators is None:
        raise UserError("--annotators is required (unless --revote)")
    if Path(config.records).resolve() == Path(config.output).resolve():
        raise UserError("--output must differ from --records")
