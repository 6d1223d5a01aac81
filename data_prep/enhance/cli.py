"""`real-data enhance`: annotate evidence with several LLMs and keep the majority picks.

    real-data enhance --records in.jsonl --annotators recipes/annotators/paper.yaml --output out.jsonl
    real-data enhance ... --dry-run                 # request count + token estimate, nothing sent
    real-data enhance --records out.jsonl --revote --min-votes 1 --output out2.jsonl   # no requests

Re-running the same command resumes: answers come from the cache, only what
is missing is requested. Exit codes (docs/errors.md): 0 complete, 1 some
requests failed (everything else written; run again to retry them), 2 bad
input or the output/cache is in use by another enhance, 130 interrupted,
143 terminated; on 130/143 one line says what was kept and the command to resume.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

from real_fae_core.command import CommandConfig, CommandResult
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


CONFIG = EnhanceConfig


def add_arguments(p) -> None:
    p.add_argument("--records", required=True, help="input claim records (JSONL)")
    p.add_argument("--annotators",
                   help="annotators YAML (recipes/annotators/*.yaml); not needed with --revote")
    p.add_argument("--output", required=True,
                   help="output JSONL; the summary goes to OUTPUT.summary.json")
    p.add_argument("--cache",
                   help="SQLite answer cache (default: OUTPUT.cache.sqlite); reuse it to resume")
    p.add_argument("--dry-run", action="store_true",
                   help="print the number of requests and an input-token estimate; send nothing")
    p.add_argument("--min-votes", type=int, metavar="K",
                   help="votes a sentence needs (default: strict majority of the configured annotators)")
    p.add_argument("--revote", action="store_true",
                   help="recompute enhanced_evidence from the 'annotations' of an enhanced file; no requests")
    p.add_argument("--include-nei", action="store_true",
                   help="also annotate NOT_ENOUGH_INFO claims (default: passed through unchanged)")
    p.add_argument("--retry-abstentions", action="store_true",
                   help="re-ask annotators whose cached answer was an abstention (malformed answer)")
    p.add_argument("--max-in-flight", type=int, metavar="N",
                   help="at most N requests in flight over all annotators (each also has max_concurrency)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


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


def _check(config: EnhanceConfig) -> None:
    if config.revote and config.dry_run:
        raise UserError("--revote sends no requests; --dry-run does not apply")
    if not config.revote and config.annotators is None:
        raise UserError("--annotators is required (unless --revote)")
    if Path(config.records).resolve() == Path(config.output).resolve():
        raise UserError("--output must differ from --records")


def run(config: EnhanceConfig) -> CommandResult:
    # lazy: the runner imports the openai client (~1 s), which `real-data --help` and the other
    # subcommands do not need
    from .runner import (
        EnhanceJob,
        dry_run,
        enhance,
        format_summary,
        revote,
        summary_path,
    )

    _check(config)
    output = Path(config.output)
    if config.revote:
        code, summary = revote(Path(config.records), output, config.min_votes)
    else:
        job = EnhanceJob(
            records=Path(config.records),
            annotators=Path(config.annotators),
            output=output,
            cache=None if config.cache is None else Path(config.cache),
            min_votes=config.min_votes,
            include_nei=config.include_nei,
            retry_abstentions=config.retry_abstentions,
            max_in_flight=config.max_in_flight,
            progress=not config.no_progress,
            resume_command=resume_command(config),
        )
        if config.dry_run:
            return CommandResult(exit_code=dry_run(job), summary={"dry_run": True})
        # Ctrl-C / SIGTERM propagate to the top-level handler (exit 130 / 143), which
        # prints the note the runner leaves: what was kept and the command to resume.
        code, summary = enhance(job)
    print(format_summary(summary))
    print(f"summary: {summary_path(output)}")
    outputs = {name: str(summary[key]) for name, key in (("records", "output"), ("partial", "partial_output"),
                                                         ("cache", "cache")) if summary.get(key)}
    outputs["summary"] = str(summary_path(output))
    if code:
        print(
            f"enhance: {summary['claims_failed']} claims failed (requests exhausted their retries); "
            f"completed records are in {summary['partial_output']}. Run the same command again to retry them.",
            file=sys.stderr,
        )
    return CommandResult(exit_code=code, outputs=outputs, summary=summary)
