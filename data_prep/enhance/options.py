"""The options of `real-data enhance` (:class:`EnhanceConfig`), their cross-field checks and the
command line that resumes a run; light to import (the run itself is :func:`data_prep.enhance.runner.run`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from real_fae_core.command import CommandConfig, command_line, option
from real_fae_core.errors import UserError
from real_fae_core.outputs import claim_file


@dataclasses.dataclass
class EnhanceConfig(CommandConfig):
    """`real-data enhance`: enhanced evidence by a majority vote of annotator LLMs."""

    records: str = option(help="input claim records (JSONL)")
    output: str = option(help="output JSONL; the summary goes to OUTPUT.summary.json")
    annotators: str | None = option(None, help="annotators YAML (recipes/annotators/*.yaml); not needed with --revote")
    cache: str | None = option(None, help="SQLite answer cache (default: OUTPUT.cache.sqlite); reuse it to resume")
    dry_run: bool = option(False, help="print the number of requests and an input-token estimate; send nothing")
    min_votes: int | None = option(None, min=1, metavar="K", help="votes a sentence needs (default: strict majority "
                                   "of the configured annotators)")
    revote: bool = option(False, help="recompute enhanced_evidence from the 'annotations' of an enhanced file; "
                                      "no requests")
    include_nei: bool = option(False, help="also annotate NOT_ENOUGH_INFO claims (default: passed through unchanged)")
    retry_abstentions: bool = option(False,
                                     help="re-ask annotators whose cached answer was an abstention (malformed answer)")
    max_in_flight: int | None = option(None, min=1, metavar="N", help="at most N requests in flight over all "
                                       "annotators (each also has max_concurrency)")
    no_progress: bool = option(False, help="no progress bar")


def resume_command(config: EnhanceConfig) -> str:
    """The command line that resumes this run (same records, annotators, output, cache, options)."""
    return command_line("real-data enhance", config)


def check_options(config: EnhanceConfig) -> None:
    """The checks across fields: --revote with --dry-run, --annotators missing, --output = --records."""
    if config.revote and config.dry_run:
        raise UserError("--revote sends no requests; --dry-run does not apply")
    if not config.revote and config.annotators is None:
        raise UserError("--annotators is required (unless --revote)")
    if Path(config.records).resolve() == Path(config.output).resolve():
        raise UserError("--output must differ from --records")
    claim_file(config.output, "real-data enhance", inputs=[config.records, config.annotators])
